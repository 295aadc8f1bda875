"""The outer-loop MCP server (`loopwright serve --level outer`): a separate tool set for a session
that improves the *search*, not train.py. The inner server never exposes these tools.

    mechanisms_list      built-in and installed mechanisms, status, measured effect of each trial
    trace_read           the inner loop's history with stall diagnostics
    mechanism_propose    validate (static checks + sandboxed run) and install a new version
    mechanism_activate   put a validated mechanism on trial for the next N inner experiments
    mechanism_revert     take one out of use, with the reason

Every call also decides a trial whose window is full (trial.tick), so the record is current.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Optional

import anyio.to_thread
from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from mcp_server import __version__

log = logging.getLogger("loopwright.outer")

OUTER_TOOLS = ("mechanisms_list", "trace_read", "mechanism_propose", "mechanism_activate", "mechanism_revert")
PLATEAU_K = 4

INSTRUCTIONS = """loopwright outer loop: you improve the SEARCH of an inner research loop, not train.py.
1. trace_read: where does the inner loop stall (repeats, plateaus, over/under-explored categories, crash streaks)?
2. mechanisms_list: what is installed, active, kept, reverted, and why.
3. mechanism_propose(name, code, rationale): a Python module defining advise(history: dict, source: str) -> dict
   returning any of {"category", "parameters", "avoid", "force", "note"}; standard library only, no files, no
   network, no processes; it must answer in well under a second. It is validated in a sandbox.
4. mechanism_activate(name): on trial for the next N inner experiments; it is then kept or reverted automatically
   (gain per hour against the record before it). mechanism_revert(name, reason) ends it early.
Do not edit any file. Stop after activating one mechanism or when nothing needs changing."""


def build_outer_server(workspace: Path | str) -> MCPServer:
    """The engine and the mechanisms are imported on the first call: a client lists the tools right
    after start-up and must not wait for git and the ledger."""
    from mcp_server.mechanisms.registry import DEFAULT_WINDOW

    root = Path(workspace).expanduser().resolve()
    server = MCPServer("loopwright-outer", version=__version__, instructions=INSTRUCTIONS)

    def call(fn: Callable[[Any], Any]) -> Any:
        from mcp_server.loop.engine import Engine, LoopError
        from mcp_server.mechanisms import registry, trial

        try:
            eng = Engine(root)
        except Exception as e:
            raise ToolError(f"loopwright cannot open the workspace {root}: {e}") from None
        try:
            try:
                trial.tick(eng)
            except Exception:  # noqa: BLE001 - bookkeeping must not fail the call
                log.exception("trial bookkeeping failed")
            return fn(eng)
        except (LoopError, registry.MechanismError) as e:
            raise ToolError(str(e)) from None
        except ToolError:
            raise
        except Exception as e:  # noqa: BLE001
            log.exception("outer tool failed")
            raise ToolError(f"internal error ({type(e).__name__}: {e})") from None
        finally:
            eng.close()

    async def in_thread(fn: Callable[[Any], Any]) -> Any:
        return await anyio.to_thread.run_sync(lambda: call(fn))

    ro = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    rw = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)

    @server.tool(annotations=ro)
    async def mechanisms_list() -> dict[str, Any]:
        """Built-in and installed search mechanisms: version, status (validated, rejected, active = on trial,
        kept, reverted), why, and each trial's measured effect."""
        from mcp_server.mechanisms import registry
        return await in_thread(lambda e: {"mechanisms": registry.listing(e.ledger)})

    @server.tool(annotations=ro)
    async def trace_read(limit: int = 40) -> dict[str, Any]:
        """The inner loop's recent experiments and stall diagnostics: exact/near repeats, plateaus (runs of
        experiments without a keep), categories over- and under-explored, crash streaks, per-constant tries."""
        return await in_thread(lambda e: trace(e, limit))

    @server.tool(annotations=rw)
    async def mechanism_propose(name: str, code: str, rationale: str) -> dict[str, Any]:
        """Validate and install a new mechanism version: static checks (no forbidden imports or calls, the
        advise function), then a sandboxed run (no network, read-only files, time and memory limits) on
        synthetic and the recorded histories; answers must be well formed. Returns valid + reason."""
        from mcp_server.mechanisms import registry
        return await in_thread(lambda e: registry.propose(e, name, code, rationale, author=_author()).__dict__)

    @server.tool(annotations=rw)
    async def mechanism_activate(name: str, version: Optional[int] = None,
                                 window: int = DEFAULT_WINDOW) -> dict[str, Any]:
        """Put a validated mechanism on trial: it advises suggest_next for the next `window` inner
        experiments, then is kept or reverted automatically. One trial at a time."""
        from mcp_server.mechanisms import registry
        return await in_thread(lambda e: registry.activate(e, name, version, window, author=_author()))

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False))
    async def mechanism_revert(name: str, reason: str) -> dict[str, Any]:
        """Take a mechanism out of use now (ends its trial), recording the reason."""
        from mcp_server.mechanisms import registry
        return await in_thread(lambda e: registry.revert(e, name, f"reverted by the outer session: {reason}"))

    return server


def _author() -> str:
    import os
    sid = os.environ.get("LOOPWRIGHT_SESSION_ID", "")
    return f"session {sid}" if sid.isdigit() else "outer session"


def trace(engine, limit: int = 40) -> dict:
    """The history with stall diagnostics (also used by the report)."""
    from mcp_server.mechanisms import history_from_engine, registry
    from mcp_server.mechanisms.source import CATEGORIES, tunable_constants
    from mcp_server.mechanisms.tabu import closest_match

    h = history_from_engine(engine)
    trials = list(h.trials)
    limit = max(1, min(int(limit), 500))
    # repeats: each trial against the ones before it (the last 150, to bound the cost)
    repeats = []
    window = trials[-150:]
    for i, t in enumerate(window):
        if not t.source:
            continue
        from mcp_server.mechanisms.base import History
        m = closest_match(History(tuple(window[:i])), t.source)
        if m is not None:
            repeats.append({"experiment": t.id, "repeats": m.trial.id, "kind": m.kind, "detail": m.detail})
    # plateaus and crash streaks: maximal runs
    plateaus, crashes = [], []
    run: list = []
    crun: list = []
    for cur in [*trials, None]:   # None closes the last run
        if cur is None or cur.verdict == "keep":
            if len(run) >= PLATEAU_K:
                plateaus.append({"from": run[0].id, "to": run[-1].id, "length": len(run),
                                 "categories": sorted({x.category for x in run})})
            run = []
        else:
            run.append(cur)
        if cur is not None and cur.failed:
            crun.append(cur)
        else:
            if len(crun) >= 2:
                crashes.append({"from": crun[0].id, "to": crun[-1].id, "length": len(crun),
                                "descriptions": [x.description for x in crun][:5]})
            crun = []
    try:
        consts = tunable_constants(h.best_source)
    except SyntaxError:
        consts = []
    avail = [c for c in CATEGORIES if any(k.category == c for k in consts)]
    cats = {c: {"tries": 0, "kept": 0, "failed": 0} for c in avail}
    params: dict[str, dict[str, Any]] = {k.name: {"category": k.category, "tries": 0, "kept": 0} for k in consts}
    for t in trials:
        s = cats.setdefault(t.category, {"tries": 0, "kept": 0, "failed": 0})
        s["tries"] += 1
        s["kept"] += t.verdict == "keep"
        s["failed"] += t.failed
        for name in t.changed:
            if name in params:
                params[name]["tries"] += 1
                params[name]["kept"] += t.verdict == "keep"
    n = max(1, len(trials))
    fair = n / max(1, len(avail))
    over = [c for c in avail if cats[c]["tries"] > 2 * fair and cats[c]["tries"] >= 4]
    under = [c for c in avail if cats[c]["tries"] < 0.5 * fair or cats[c]["tries"] == 0]
    recent = [{"id": t.id, "description": t.description, "status": t.status, "verdict": t.verdict,
               "val_bpb": t.val_bpb, "gain": t.gain, "category": t.category, "changed": list(t.changed)}
              for t in trials[-limit:]]
    running = engine.ledger.trials(engine.campaign["id"], running=True)
    return {
        "experiments": len(trials), "kept": sum(t.verdict == "keep" for t in trials),
        "baseline_val_bpb": h.baseline_mean, "sigma": h.sigma,
        "experiments_since_keep": h.experiments_since_keep,
        "diagnostics": {
            "repeats": repeats[-20:], "repeat_count": len(repeats),
            "plateaus": plateaus, "current_plateau": h.experiments_since_keep >= PLATEAU_K,
            "categories": cats, "over_explored": over, "under_explored": under,
            "crash_streaks": crashes, "parameters": params,
        },
        "mechanisms_in_use": [{"name": r["name"], "version": r["version"], "status": r["status"]}
                              for r in registry.in_use(engine.ledger)],
        "trial_running": running[0] if running else None,
        "recent": recent,
    }
