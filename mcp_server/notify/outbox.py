"""Deliver ledger events to connectors: at least once, idempotent, never raising into the loop.

Each (event, sink) pair is a row of the ledger's `deliveries` table. A pass takes
a sink's due rows in event order, calls `sink.deliver(event)` and records the
outcome in the row: delivered (with the external reference, e.g. a Slack ts or
a Jira issue key), or a failed attempt with its error and the time of the next
try (exponential backoff with jitter, or the server's Retry-After). After
MAX_ATTEMPTS the row is marked `failed` and stays visible in `loopwright notify`.

A sink that did part of the work before failing (Slack message posted, plot
upload failed) saves that with `event.checkpoint(ref)`; the retry sees it in
`event.external_ref` and does only the rest.

Exactly once and in order, whatever the timing: a row is claimed (a lease in the
ledger) before its external call, and one row per sink is in flight at a time, so
a second pass (the MCP server's, `loopwright notify`, the launcher's) waits or
leaves instead of working on the same campaign at once (two Jira issues, a closing
message before the keep). A campaign's closing events wait until its earlier rows
are settled. A lease whose process died (a server killed mid-pass) is voided.
"""
from __future__ import annotations

import functools
import logging
import os
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Protocol

from mcp_server.notify.events import DeliveryError, Event, ledger_uid, redact  # noqa: F401 (re-exported)

log = logging.getLogger("loopwright.notify")

MAX_ATTEMPTS = 8
BASE_DELAY_S = 30.0
MAX_DELAY_S = 3600.0
BATCH = 50
LEASE_S = 300.0    # longer than any one delivery (each HTTP call times out after 10 s)
# delivered after every earlier row of their campaign is settled: the keep that spent the budget comes first
ORDERED_KINDS = ("budget_spent", "campaign_end", "session_end")
WAIT_POLL_S = 0.2


class Sink(Protocol):
    name: str
    kinds: frozenset[str]         # the event kinds this sink announces

    def wants(self, kind: str) -> bool: ...

    def deliver(self, event: Event) -> Optional[str]: ...


@dataclass
class SinkReport:
    delivered: int = 0
    retrying: int = 0
    gave_up: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass
class DeliveryReport:
    sinks: dict[str, SinkReport] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)   # e.g. "slack: SLACK_BOT_TOKEN is not set"

    @property
    def delivered(self) -> int:
        return sum(s.delivered for s in self.sinks.values())

    @property
    def failed(self) -> int:
        return sum(s.retrying + s.gave_up for s in self.sinks.values())

    def __str__(self) -> str:
        lines = [f"{name}: {s.delivered} delivered, {s.retrying} to retry, {s.gave_up} given up, "
                 f"{s.skipped} skipped" + "".join(f"\n  - {e}" for e in s.errors)
                 for name, s in self.sinks.items()]
        return "\n".join(lines + self.notes) or "no sinks configured"


def backoff_delay(attempts: int, rng: random.Random | None = None,
                  base: float = BASE_DELAY_S, cap: float = MAX_DELAY_S) -> float:
    """Delay before the next try after `attempts` failures: exponential, capped, with jitter
    (half fixed, half random) so that many workspaces don't retry in lockstep."""
    d = min(cap, base * 2 ** max(0, attempts - 1))
    return d / 2 + (rng or random).uniform(0, d / 2)


def build_sinks(cfg, ledger, env: Mapping[str, str] | None = None,
                reports_dir: Optional[Path] = None) -> tuple[list, list[str]]:
    """The sinks `cfg` configures whose secrets are present, and a note for each that is not.
    A sink left out keeps its rows pending: nothing is lost while a token is missing."""
    from mcp_server.notify import jira as jira_mod
    from mcp_server.notify import slack as slack_mod

    env = os.environ if env is None else env
    sinks, notes = [], []
    for make, section in ((slack_mod.SlackSink.from_config, cfg.slack), (jira_mod.JiraSink.from_config, cfg.jira)):
        if section is None:
            continue
        sink, note = make(section, ledger, env)
        if sink is not None:
            # where the report's plot is (the workspace's .loopwright/reports); only Slack carries the plot
            if reports_dir is not None and isinstance(sink, slack_mod.SlackSink):
                sink.reports_dir = reports_dir
            sinks.append(sink)
        if note:
            notes.append(note)
    return sinks, notes


def deliver_pending(ledger, cfg, sinks: Optional[list] = None, now: Optional[float] = None, *,
                    max_attempts: int = MAX_ATTEMPTS, rng: random.Random | None = None,
                    env: Mapping[str, str] | None = None, reports_dir: Optional[Path] = None,
                    wait_s: float = 0.0) -> DeliveryReport:
    """One delivery pass over every sink's due rows. Never raises: every failure ends up in a
    delivery row (or, if the ledger itself fails, in the report's notes). While another pass has a
    sink's row in flight, this one waits up to `wait_s` for it (0: leaves that sink to it)."""
    report = DeliveryReport()
    try:
        if sinks is None:
            sinks, report.notes = build_sinks(cfg, ledger, env, reports_dir)
        for sink in sinks:
            report.sinks[sink.name] = rep = SinkReport()
            try:
                _deliver_sink(ledger, sink, time.time() if now is None else now, rep, max_attempts, rng, wait_s)
            except Exception as e:  # a ledger problem mid-pass; the loop must go on
                log.exception("delivery pass for %s failed", sink.name)
                rep.errors.append(f"delivery pass stopped: {type(e).__name__}: {e}")
    except Exception as e:
        log.exception("delivery pass failed")
        report.notes.append(f"delivery pass failed: {type(e).__name__}: {e}")
    return report


HOST = socket.gethostname()


def _owner() -> str:
    """A pass's lease owner: host and pid first, so a later pass can tell that it died."""
    return f"{HOST}:{os.getpid()}:{threading.get_ident()}:{random.getrandbits(32):08x}"


def _owner_dead(owner: Optional[str]) -> bool:
    host, _, rest = (owner or "").partition(":")
    pid = rest.split(":", 1)[0]
    if host != HOST or not pid.isdigit():
        return False   # another machine's (or an older version's) lease: it expires on its own
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:    # e.g. EPERM: the process exists
        return False
    return False


def _in_flight(ledger, sink_name: str, now: float) -> tuple[bool, bool]:
    """(does another live pass hold a row of this sink, was a dead process's lease voided)."""
    live = voided = False
    for lease in ledger.delivery_leases(sink_name, now):
        if _owner_dead(lease["claimed_by"]):
            log.warning("%s: the pass that claimed event %s is gone (process ended mid-delivery); "
                        "the row is due again", sink_name, lease["event_id"])
            voided = ledger.break_lease(lease["event_id"], sink_name, lease["claimed_by"]) or voided
        else:
            live = True
    return live, voided


def _deliver_sink(ledger, sink, now: float, rep: SinkReport, max_attempts: int, rng, wait_s: float = 0.0) -> None:
    # events recorded without this sink (or before it was configured) get a row too
    ledger.ensure_deliveries(sink.name, kinds=sorted(sink.kinds))
    # Each row is claimed (a lease) before it is sent, and one row per sink is in flight at a time, so two
    # passes never send the same row nor work on the same campaign at once (ledger.claim_delivery).
    owner = _owner()
    start = time.monotonic()

    def clock() -> float:   # the pass's clock moves on with real time, so a late claim's lease is fresh
        return now + (time.monotonic() - start)

    last = 0
    for _ in range(BATCH):
        row = ledger.claim_delivery(sink.name, owner, now=clock(), lease_s=LEASE_S, after_event_id=last,
                                    ordered_kinds=ORDERED_KINDS)
        if row is None:   # nothing due, or another pass holds a row (voided if its process is gone)
            busy, voided = _in_flight(ledger, sink.name, clock())
            was_busy = busy
            while busy and time.monotonic() - start < wait_s:
                time.sleep(WAIT_POLL_S)
                busy, freed = _in_flight(ledger, sink.name, clock())
                voided = voided or freed
            if voided or (was_busy and not busy):
                row = ledger.claim_delivery(sink.name, owner, now=clock(), lease_s=LEASE_S, after_event_id=last,
                                            ordered_kinds=ORDERED_KINDS)
            if row is None and busy:
                log.info("%s: another delivery pass is in flight; it delivers the rest", sink.name)
        if row is None:
            break
        eid = last = row["event_id"]
        now_row = clock()
        if not sink.wants(row["kind"]):
            ledger.mark_delivered(eid, sink.name, "skipped", owner=owner)
            rep.skipped += 1
            continue
        event = Event(eid, row["kind"], row["payload"], row["campaign_id"], row["created_at"],
                      row["attempts"], row["external_ref"],
                      checkpoint=functools.partial(ledger.set_delivery_ref, eid, sink.name), now=now_row)
        try:
            ref = sink.deliver(event)
        except Exception as e:
            err = e if isinstance(e, DeliveryError) else DeliveryError(f"{type(e).__name__}: {e}")
            if err.deferred:   # nothing sent: wait for the rate-limit window without spending an attempt
                ledger.release_delivery(eid, sink.name, owner, now_row + (err.retry_after or 0.0))
                rep.retrying += 1
                continue
            attempts = row["attempts"] + 1
            give_up = attempts >= max_attempts
            delay = max(backoff_delay(attempts, rng), err.retry_after or 0.0)
            ledger.mark_attempt_failed(eid, sink.name, str(err), now_row + delay, give_up=give_up, owner=owner)
            msg = f"event {eid} ({row['kind']}): {err}"
            rep.errors.append(msg)
            log.warning("%s delivery %s; %s", sink.name, msg,
                        "giving up" if give_up else f"retrying in {delay:.0f}s")
            if give_up:
                rep.gave_up += 1
            else:
                rep.retrying += 1
            if err.sink_wide:
                break
            continue
        if ledger.mark_delivered(eid, sink.name, ref, owner=owner):
            rep.delivered += 1
        else:   # our lease ran out and another pass took the row over: its outcome stands
            log.warning("%s delivery of event %s outlived its lease", sink.name, eid)


def notify_workspace(root=None, wait_s: float = 30.0) -> DeliveryReport:
    """One delivery pass for the workspace at `root` (default: found from the cwd): `loopwright notify`,
    the launcher at a session's end, the MCP server's background passes. A keep's Slack message carries
    the progress plot, so the report is written first whenever a keep is due."""
    from mcp_server.loop.workspace import Workspace

    ws = Workspace.find(root)
    with ws.ledger() as ledger:
        slack = ws.cfg.slack
        if slack is not None and slack.upload_plot and ledger.has_due_deliveries(kind="keep"):
            try:
                from mcp_server.report.writer import write_report
                write_report(ws.root)
            except Exception as e:  # noqa: BLE001 - the keep then waits for its plot (notify/slack.py)
                log.warning("could not write the report (the plot a keep's message carries): %s: %s",
                            type(e).__name__, e)
        return deliver_pending(ledger, ws.cfg, reports_dir=ws.reports_dir, wait_s=wait_s)


_said: set[str] = set()   # what a background pass already logged: a note once per process, not per call


def _log_once(text: str) -> None:
    if text not in _said:
        _said.add(text)
        log.warning("%s", text)


def deliver_in_background(root) -> Optional[threading.Thread]:
    """For long-lived processes (the MCP server): a delivery pass (report first) in a daemon thread.
    The engine only records events; this is the edge that sends them. A failure here never touches the
    loop (the outbox retries later), but it is logged at warning with its reason."""
    from mcp_server.loop.workspace import Workspace

    ws = Workspace.find(root)
    with ws.ledger() as ledger:
        if not ledger.has_due_deliveries():
            return None

    def deliver() -> None:
        try:
            report = notify_workspace(ws.root, wait_s=0.0)
        except Exception as e:  # noqa: BLE001 - a connector failure never touches the loop
            log.warning("delivery pass failed: %s: %s", type(e).__name__, e, exc_info=True)
            return
        for note in report.notes:   # e.g. a token that is not set: nothing can go out until it is
            _log_once(f"delivery for {ws.root}: {note}")

    thread = threading.Thread(target=deliver, name="loopwright-notify", daemon=True)
    thread.start()
    return thread
