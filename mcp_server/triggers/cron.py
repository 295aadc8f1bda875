"""`loopwright cron`: start agent sessions on the [[schedule]] entries of the settings (`loopwright config`).

On each tick, for each schedule, at most ONE session starts: for the newest fire
time in (last fire, now]; older missed fires are coalesced into it, and a fire
older than the schedule's grace_minutes is skipped. The last fire per schedule is
persisted (JSON, replaced atomically), so a restarted daemon and `--once` from
system cron agree on what already ran. Sessions never overlap: a session holds
the session flock; a tick that finds it held skips and retries on a later tick
while the fire is within its grace.

Times follow the schedule's timezone. A wall-clock time that occurs twice on the
autumn DST day fires once when the hour is fixed ("30 2 * * *"), twice for an
hourly schedule ("30 * * * *", two real hours); a time skipped in spring fires
at the first minute after the jump (croniter's rule).
"""
from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Sequence
from zoneinfo import ZoneInfo

from croniter import croniter

from mcp_server.triggers.common import SESSION_LOCK, SessionLock, launch

if TYPE_CHECKING:   # the config (pydantic) loads only where a schedule is read, as before
    from mcp_server.loop.config import ScheduleConfig

log = logging.getLogger("loopwright.cron")
UTC = timezone.utc
STATE_NAME = "cron.json"
MIN_GRACE = timedelta(seconds=60)   # a tick lands within a minute of its fire even with grace 0

StartSession = Callable[["ScheduleConfig", str], None]   # (schedule, trigger_detail) -> None


def schedule_key(s) -> str:
    """State is kept per schedule definition: editing a schedule starts it afresh."""
    return f"{s.cron}|{s.timezone}|{s.agent}"


def _as_utc(t: datetime | float | None, clock: Callable[[], float]) -> datetime:
    if t is None:
        t = clock()
    if isinstance(t, (int, float)):
        return datetime.fromtimestamp(t, UTC)
    if t.tzinfo is None:
        raise ValueError("pass an aware datetime (or epoch seconds)")
    return t.astimezone(UTC)


def next_fire(schedule, after: datetime) -> datetime:
    """The first fire strictly after `after` (aware), as an aware UTC datetime."""
    tz = ZoneInfo(schedule.timezone)
    it = croniter(schedule.cron, after.astimezone(tz))
    hour_is_wildcard = it.expanded[1] == ["*"]
    while True:
        t = it.get_next(datetime)
        # The second pass through a repeated autumn hour (fold=1 with a different offset):
        # a fixed-hour schedule already ran at this wall-clock time.
        repeated = t.fold == 1 and t.replace(fold=0).utcoffset() != t.utcoffset()
        if not (repeated and not hour_is_wildcard):
            return t.astimezone(UTC)


@dataclass
class TickResult:
    schedule: str
    outcome: str             # started | failed | skipped-grace | skipped-locked | initialized
    fire: Optional[datetime] = None
    detail: str = ""

    def __str__(self) -> str:
        when = f" (fire time {self.fire:%Y-%m-%d %H:%M %Z})" if self.fire else ""
        return f"schedule '{self.schedule}': {self.outcome}{when}" + (f": {self.detail}" if self.detail else "")


class Scheduler:
    def __init__(self, schedules: Sequence, state_path: Path | str, lock_path: Path | str,
                 start_session: StartSession, clock: Callable[[], float] = time.time,
                 poll_seconds: float = 20.0):
        for sch in schedules:   # croniter also takes 6/7 fields (seconds, years): not cron's meaning
            if len(sch.cron.split()) != 5:
                raise ValueError(f"schedule {sch.cron!r}: use 5 cron fields (minute hour day month weekday)")
        self.schedules = list(schedules)
        self.state_path = Path(state_path)
        self.lock = SessionLock(lock_path)
        self.start_session = start_session
        self.clock = clock
        self.poll_seconds = poll_seconds

    # -- state ----------------------------------------------------------------
    def _load(self) -> dict:
        try:
            return json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return {}
        except (ValueError, OSError) as e:
            log.warning("cron state %s unreadable (%s); starting afresh", self.state_path, e)
            return {}

    def _save(self, state: dict) -> None:
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_name(self.state_path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
        os.replace(tmp, self.state_path)   # atomic: readers see the old or the new file

    def _record(self, key: str, fire: datetime, outcome: str) -> None:
        state = self._load()
        state[key] = {"last_fire": fire.isoformat(), "outcome": outcome}
        self._save(state)

    def last_fire(self, schedule) -> Optional[datetime]:
        entry = self._load().get(schedule_key(schedule))
        return datetime.fromisoformat(entry["last_fire"]) if entry else None

    # -- ticks ----------------------------------------------------------------
    def run_once(self, now: datetime | float | None = None) -> list[TickResult]:
        """One tick: start what is due (see the module docstring). Never raises for a failed session."""
        now = _as_utc(now, self.clock)
        return [r for s in self.schedules if (r := self._tick(s, now)) is not None]

    def _tick(self, s, now: datetime) -> Optional[TickResult]:
        key = schedule_key(s)
        last = self.last_fire(s)
        if last is None:   # first sight: start counting from now, don't replay the past
            self._record(key, now, "initialized")
            return TickResult(key, "initialized", now)
        grace = max(timedelta(minutes=s.grace_minutes), MIN_GRACE)
        newest, t = None, next_fire(s, max(last, now - grace))
        while t <= now:   # the newest fire in the grace window; older ones are coalesced into it
            newest, t = t, next_fire(s, t)
        if newest is None:
            missed = next_fire(s, last)
            if missed > now:
                return None
            log.warning("schedule %r: fire at %s is older than grace (%s); skipped", s.cron, missed, grace)
            self._record(key, now, "skipped-grace")
            return TickResult(key, "skipped-grace", missed)
        held = self.lock.try_acquire()
        if held is None:
            log.info("schedule %r: a session is still running (%s held); fire at %s skipped for now",
                        s.cron, self.lock.path, newest)
            return TickResult(key, "skipped-locked", newest)
        with held:
            last = self.last_fire(s)   # another scheduler may have run it while we looked
            if last is not None and last >= newest:
                return None
            # recorded before starting: a crash mid-session must not re-run the same fire forever
            self._record(key, newest, "started")
            detail = f"cron '{s.cron}' ({s.timezone}) fire {newest.isoformat()}"
            log.info("starting a %s session: %s", s.agent, detail)
            try:
                self.start_session(s, detail)
            except Exception as e:
                if type(e).__name__ == "LaunchError":   # a refusal that says what to do: one line, no traceback
                    log.error("schedule %r: no session started: %s", s.cron, e)
                else:
                    log.exception("session for schedule %r failed", s.cron)
                self._record(key, newest, "failed")
                return TickResult(key, "failed", newest, f"{type(e).__name__}: {e}")
        return TickResult(key, "started", newest, detail)

    def run_forever(self, stop_event: threading.Event) -> None:
        """Tick until stop_event is set (SIGTERM/SIGINT in `serve_forever`). A running session is
        not interrupted: it has its own wall-clock limit; the loop exits after it returns."""
        while not stop_event.is_set():
            try:
                self.run_once()
            except Exception:   # e.g. an unwritable state file: log, keep the daemon alive
                log.exception("cron tick failed")
            stop_event.wait(self.poll_seconds)


# -- wiring for the CLI ---------------------------------------------------------
def default_starter(root: Path | str) -> StartSession:
    def start(schedule: ScheduleConfig, detail: str) -> None:
        launch(root, agent=schedule.agent, trigger="cron", detail=detail,
               max_session_minutes=schedule.max_session_minutes, level=schedule.level)
    return start


def scheduler_for(root: Path | str, start_session: Optional[StartSession] = None) -> Scheduler:
    from mcp_server.loop.workspace import Workspace

    ws = Workspace.open(root)
    if not ws.cfg.schedule:
        raise ValueError("no [[schedule]] entries in the loop's settings; add one with\n"
                         f"    loopwright config -w {ws.root} set schedule.0.cron \"0 1 * * *\"\n"
                         "(and schedule.0.agent / schedule.0.timezone), or `loopwright config edit`")
    return Scheduler(ws.cfg.schedule, ws.state_dir / STATE_NAME, ws.state_dir / SESSION_LOCK,
                     start_session or default_starter(ws.root))


def tick(root: Path | str) -> list[TickResult]:
    """`loopwright cron --once`: one tick, for system cron or a systemd timer (every minute)."""
    return scheduler_for(root).run_once()


def serve_forever(root: Path | str) -> int:
    """`loopwright cron`: the foreground daemon; exits 0 on SIGTERM or SIGINT."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sched = scheduler_for(root)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    for s in sched.schedules:
        log.info("schedule %r (%s, agent %s): next fire %s", s.cron, s.timezone, s.agent,
                 next_fire(s, datetime.now(UTC)).isoformat())
    sched.run_forever(stop)
    log.info("cron stopped")
    return 0


def check(root: Path | str, env: Optional[Mapping[str, str]] = None) -> list[str]:
    """`loopwright cron --check`: what would make a tick's session fail in this environment (the
    schedules' clients on PATH, connector tokens); [] when nothing would."""
    from mcp_server.loop.workspace import Workspace
    from mcp_server.triggers.common import preflight

    ws = Workspace.open(root)
    if not ws.cfg.schedule:
        return ["no [[schedule]] entries in the loop's settings: a tick never starts anything "
                "(`loopwright config set schedule.0.cron \"0 1 * * *\"`)"]
    return preflight(ws.root, [s.agent for s in ws.cfg.schedule], env)


# Where the state directory is found (workspace.state_home): a tick run without them looks elsewhere and fails.
STATE_ENV = ("LOOPWRIGHT_HOME", "XDG_DATA_HOME")
# What else a tick needs from the installing shell (cron gives only PATH=/usr/bin:/bin, HOME, LOGNAME,
# SHELL): where the clients are and where they keep their settings. Names only of non-secrets:
# tokens and API keys are never written into a crontab or unit.
CARRIED_ENV = ("PATH", "PYTHONPATH", "LOOPWRIGHT_CLAUDE_BIN", "LOOPWRIGHT_CODEX_BIN", "CLAUDE_CONFIG_DIR",
               "CODEX_HOME", "LANG")


def install_lines(workspace: Path | str, python: str, env: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """Text for running `loopwright cron --once` every minute from system cron or a systemd timer
    (the schedules themselves stay in the settings). Keys: crontab, service, timer. The STATE_ENV
    variables set in `env` (default: this process's environment) are carried into both, as absolute
    paths, and so are the CARRIED_ENV ones, as they are."""
    env = os.environ if env is None else env
    carried = {k: str(Path(env[k]).expanduser().resolve()) for k in STATE_ENV if env.get(k)}
    carried.update({k: env[k] for k in CARRIED_ENV if env.get(k)})
    ws, py = Path(workspace).resolve(), shlex.quote(python)
    cmd = f"{py} -m mcp_server.cli cron --once"   # run in the workspace: the CLI finds it from the cwd
    log_path = shlex.quote(str(ws / ".loopwright" / "cron.log"))
    # in a crontab line an unescaped % ends the command
    assigns = "".join(f"{k}={shlex.quote(v)} ".replace("%", "\\%") for k, v in carried.items())
    crontab = f"* * * * * cd {shlex.quote(str(ws))} && {assigns}{cmd} >> {log_path} 2>&1\n"
    environment = "".join(f'Environment="{k}={v}"\n'.replace("%", "%%") for k, v in carried.items())
    service = ("# save as ~/.config/systemd/user/loopwright-cron.service (or /etc/systemd/system/)\n"
               "[Unit]\nDescription=loopwright scheduled sessions (one tick)\n\n"
               f"[Service]\nType=oneshot\nWorkingDirectory={ws}\n{environment}ExecStart={cmd}\n")
    timer = ("# save as loopwright-cron.timer next to the service, then enable --now the timer\n"
             "[Unit]\nDescription=loopwright cron tick every minute\n\n"
             "[Timer]\nOnCalendar=*-*-* *:*:00\nPersistent=true\n\n[Install]\nWantedBy=timers.target\n")
    return {"crontab": crontab, "service": service, "timer": timer}
