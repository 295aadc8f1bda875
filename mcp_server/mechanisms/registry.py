"""Installed mechanisms: proposed (validated or rejected), activated on trial, kept or reverted.

Code lives in the loop's state directory, `<state_dir>/mechanisms/<name>/v<N>.py`, written
read-only, one file per version, its sha256 in the ledger; a file that no longer matches is
refused at load. Never in the workspace tree the inner agent edits. The built-in mechanisms
(tabu, plateau, bandit) are listed alongside, as always on.

In use, each active runtime mechanism runs in the sandbox (validate.run_sandboxed) with a short
deadline; one that raises, times out or answers malformed is skipped for that call, reverted,
and an event says why: the inner loop never waits on it again.
"""
from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from mcp_server import __version__
from mcp_server.mechanisms import validate as val
from mcp_server.mechanisms.base import Advice, History, advice_from_dict, check_advice, history_to_dict

log = logging.getLogger("loopwright.mechanisms")

LIBRARY = Path(__file__).resolve().parent / "library"
BUILTIN = (("tabu", "refuses exact repeats, warns before near repeats"),
           ("plateau", "after several experiments without a keep, an untouched category"),
           ("bandit", "UCB1 over categories of change"))
DEFAULT_WINDOW = 6


class MechanismError(RuntimeError):
    """A request about mechanisms that cannot be done; the message says what to do instead."""


def mechanisms_dir(ws) -> Path:
    """Where mechanism code lives: the loop's state directory (ws.state_dir), which the guard keeps
    the inner agent out of; it follows ws.state_dir wherever that is moved."""
    return ws.state_dir / "mechanisms"


def code_sha(code: str) -> str:
    return hashlib.sha256(code.encode("utf-8")).hexdigest()


@dataclass
class ProposeResult:
    name: str
    version: int
    mechanism_id: int
    valid: bool
    reason: str
    problems: list
    samples: dict
    isolation: str
    seconds: float


def _write_code(ws, name: str, version: int, code: str) -> str:
    rel = f"{name}/v{version}.py"
    path = mechanisms_dir(ws) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(code, encoding="utf-8")
    os.chmod(tmp, 0o444)
    os.replace(tmp, path)
    return rel


def propose(engine, name: str, code: str, rationale: str = "", author: str = "", kind: str = "runtime",
            history: Optional[History] = None) -> ProposeResult:
    """Validate `code` (static checks, a sandboxed run on synthetic and the recorded history) and
    install it as the next version of `name`: validated, or rejected with the reason."""
    from mcp_server.mechanisms.history import history_from_engine

    if name in dict(BUILTIN):
        raise MechanismError(f"{name!r} is a built-in mechanism; choose another name")
    if history is None:
        history = history_from_engine(engine)
    source = history.best_source
    v = val.validate(name, code, source, history_to_dict(history, source) if name.isidentifier() else None,
                     ws=engine.ws)
    if not name.isidentifier() or len(name) > 40:
        raise MechanismError(v.reason)
    c = engine.campaign
    mid, version = engine.ledger.add_mechanism(
        name, kind, code_sha(code), lambda ver: f"{name}/v{ver}.py", rationale, author, c["id"],
        "validated" if v.ok else "rejected", v.reason,
        {"problems": v.problems, "samples": v.samples, "seconds": round(v.seconds, 3), "isolation": v.isolation})
    _write_code(engine.ws, name, version, code)
    engine.ledger.add_event(c["id"], "mechanism_proposed", {"name": name, "version": version, "valid": v.ok,
                                                             "reason": v.reason, "author": author})
    return ProposeResult(name, version, mid, v.ok, v.reason, v.problems, v.samples, v.isolation, v.seconds)


def load_code(ws, row: dict) -> str:
    path = mechanisms_dir(ws) / row["path"]
    try:
        code = path.read_text(encoding="utf-8")
    except OSError as e:
        raise MechanismError(f"{row['name']} v{row['version']}: its code is missing ({path}: {e})") from None
    if code_sha(code) != row["code_sha256"]:
        raise MechanismError(f"{row['name']} v{row['version']}: {path} changed after validation; propose it again")
    return code


def find(ledger, name: str, version: Optional[int] = None) -> dict:
    row = ledger.mechanism(name=name, version=version)
    if row is None:
        known = sorted({r["name"] for r in ledger.mechanisms()})
        raise MechanismError(f"no mechanism {name!r}{f' v{version}' if version else ''}; installed: "
                             f"{', '.join(known) or 'none (mechanism_propose first)'}")
    return row


def activate(engine, name: str, version: Optional[int] = None, window: int = DEFAULT_WINDOW,
             author: str = "") -> dict:
    """Put a validated mechanism on trial for the next `window` candidate experiments."""
    if window < 2 or window > 100:
        raise MechanismError(f"window {window}: use 2..100 experiments")
    row = find(engine.ledger, name, version)
    if row["status"] == "rejected":
        raise MechanismError(f"{name} v{row['version']} was rejected at validation ({row['reason']}); "
                             "fix it and mechanism_propose a new version")
    if row["status"] in ("active", "kept"):
        raise MechanismError(f"{name} v{row['version']} is already {row['status']}")
    load_code(engine.ws, row)   # refuse a file that changed since validation
    c = engine.campaign
    from mcp_server.ledger.store import LedgerError
    try:
        tid = engine.ledger.start_trial(row["id"], c["id"], window, engine.ledger.max_experiment_id(c["id"]))
    except LedgerError as e:
        raise MechanismError(str(e)) from None
    engine.ledger.add_event(c["id"], "mechanism_activated", {"name": name, "version": row["version"],
                                                              "window": window, "author": author, "trial": tid},
                            _sinks(engine))
    return {"name": name, "version": row["version"], "trial_id": tid, "window": window}


def revert(engine, name: str, reason: str, outcome: str = "reverted", stats: Optional[dict] = None) -> dict:
    """Take a mechanism out of use (its running trial ends with `outcome`), recording why."""
    row = find(engine.ledger, name)
    running = [t for t in engine.ledger.trials(running=True) if t["mechanism_id"] == row["id"]]
    if row["status"] not in ("active", "kept") and not running:
        raise MechanismError(f"{name} v{row['version']} is not in use (status {row['status']})")
    c = engine.ledger.campaign(running[0]["campaign_id"]) if running else engine.campaign
    end = engine.ledger.max_experiment_id(c["id"])
    for t in running:
        engine.ledger.end_trial(t["id"], outcome, reason, stats, end)
    engine.ledger.set_mechanism_status(row["id"], "reverted", reason)
    engine.ledger.add_event(c["id"], "mechanism_reverted", {"name": name, "version": row["version"],
                                                             "reason": reason, "outcome": outcome}, _sinks(engine))
    return {"name": name, "version": row["version"], "status": "reverted", "reason": reason}


def _sinks(engine) -> list[str]:
    from mcp_server.loop.workspace import sinks_for
    return sinks_for(engine.ws.cfg)


def in_use(ledger) -> list[dict]:
    """The one on trial first (it wins ties in `combine`, so the trial measures its advice), then kept ones."""
    return sorted(ledger.mechanisms(("active", "kept")), key=lambda r: (r["status"] != "active", r["id"]))


@dataclass
class Consulted:
    name: str
    version: int
    status: str
    advice: Optional[Advice]
    error: Optional[str]
    seconds: float


def consult(engine, history: History, source: str, deadline_s: float = val.USE_DEADLINE_S) -> list[Consulted]:
    """Ask every mechanism in use; a failing one is skipped, reverted and recorded (never raised)."""
    out: list[Consulted] = []
    rows = in_use(engine.ledger)
    if not rows:
        return out
    data = history_to_dict(history, source)
    for row in rows:
        error, advice, seconds = None, None, 0.0
        try:
            code = load_code(engine.ws, row)
            res = val.run_sandboxed(row["name"], code, [{"label": "campaign", "history": data, "source": source}],
                                    deadline_s, ws=engine.ws)
            seconds = res.seconds
            error = res.first_problem(["campaign"])
            if error is None:
                advice = advice_from_dict(row["name"], check_advice(res.cases[0].advice))
        except (MechanismError, ValueError, OSError) as e:
            error = str(e)
        if error is not None:
            log.warning("mechanism %s v%s failed in use: %s", row["name"], row["version"], error)
            try:
                revert(engine, row["name"], f"failed in use: {error}", outcome="failed")
            except Exception:  # noqa: BLE001 - reverting is best effort; the loop goes on either way
                log.exception("could not revert mechanism %s", row["name"])
        out.append(Consulted(row["name"], row["version"], row["status"], advice, error, seconds))
    return out


def listing(ledger) -> list[dict]:
    """Built-in and installed mechanisms with their status and measured effect (trial outcomes)."""
    trials: dict[int, list[dict]] = {}
    for t in ledger.trials():
        trials.setdefault(t["mechanism_id"], []).append(t)
    out: list[dict[str, Any]] = [{"name": n, "version": __version__, "kind": "builtin", "status": "always on", "description": d,
            "trials": []} for n, d in BUILTIN]
    for r in ledger.mechanisms():
        out.append({"name": r["name"], "version": r["version"], "kind": r["kind"], "status": r["status"],
                    "reason": r["reason"], "rationale": r["rationale"], "author": r["author"],
                    "trials": [{"trial_id": t["id"], "outcome": t["outcome"], "window": t["window"],
                                "reason": t["reason"], "stats": t["stats"]} for t in trials.get(r["id"], [])]})
    return out


def library_code() -> dict[str, str]:
    """The mechanisms shipped with loopwright for the built-in outer loop (same interface, same sandbox)."""
    return {p.stem: p.read_text(encoding="utf-8") for p in sorted(LIBRARY.glob("*.py")) if p.stem != "__init__"}
