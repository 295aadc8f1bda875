"""The MCP server: a thin layer over the engine (official `mcp` SDK 2.x).

Every call opens its own Engine (its own SQLite connection), so a long
run_experiment in a worker thread never shares a connection with a quick
state_read. LoopErrors become ToolErrors whose text tells the agent what to do.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Literal, Optional

import anyio
import anyio.to_thread
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from mcp_server import __version__
from mcp_server.loop.engine import Engine, LoopError
from mcp_server.loop.models import BudgetResult, ExperimentResult, NoteResult, RevertResult, ScoreResult, StateView

log = logging.getLogger("loopwright.server")

INSTRUCTIONS = """loopwright runs a closed research loop on this workspace. Only train.py may be edited.
Loop: state_read -> edit train.py -> run_experiment(description, hypothesis) -> score -> budget_check -> note.
A 'retest' verdict means: run_experiment(confirm_of=ID) without editing, then score(ID).
Never stop to ask whether to continue; stop only when budget_check says should_stop."""

View = Literal["summary", "history", "best", "notes", "noise", "tried"]
NoteKind = Literal["lesson", "dead_end", "idea", "observation"]


def build_server(workspace: Path | str, strict: bool = True) -> MCPServer:
    """The server for one workspace. strict=False still starts on a broken or missing workspace (as a
    plugin must, so the agent sees why) and reports the problem on every tool call."""
    root = Path(workspace).expanduser().resolve()
    try:
        Engine(root, recover=True).close()   # mark runs orphaned by a dead server as interrupted
    except Exception as e:
        if strict:
            raise
        log.warning("workspace %s is not usable yet: %s", root, e)
    server = MCPServer("loopwright", version=__version__, instructions=INSTRUCTIONS)

    def call(fn: Callable[[Engine], Any]) -> Any:
        try:
            eng = Engine(root, recover=False)
        except Exception as e:  # config/workspace problems are the user's to fix: say how
            raise ToolError(f"loopwright cannot open the workspace {root}: {e}. Tell the user; the loop cannot "
                            "run until this is fixed (`loopwright doctor` explains what is wrong).") from None
        try:
            return fn(eng)
        except LoopError as e:
            raise ToolError(str(e)) from None
        except ToolError:
            raise
        except Exception as e:  # noqa: BLE001 - show the message; a hidden error helps nobody
            log.exception("tool failed")
            raise ToolError(f"internal error ({type(e).__name__}: {e}); the ledger is unchanged beyond what was "
                            "recorded. Report this to the loopwright maintainers.") from None
        finally:
            eng.close()
            _deliver_events(root)

    async def in_thread(fn: Callable[[Engine], Any]) -> Any:
        return await anyio.to_thread.run_sync(lambda: call(fn))

    @server.tool(annotations=ToolAnnotations(title="Run an experiment", read_only_hint=False,
                                             destructive_hint=False, idempotent_hint=False, open_world_hint=False))
    async def run_experiment(description: str, ctx: Context, hypothesis: Optional[str] = None,
                             confirm_of: Optional[int] = None) -> ExperimentResult:
        """Commit the edited train.py, train it under the fixed time budget, evaluate it with the frozen
        evaluator and record the result. The first call also measures the baseline on the campaign's seed set;
        a candidate runs on the same seeds as the best version (paired; it stops after the first pair when that
        is clearly worse). Returns metrics, the seed-matched pairs and, on failure, the log tail. Takes
        minutes; progress is reported."""
        last = [0.0]
        loop = asyncio.get_running_loop()  # progress arrives on the runner's reader thread, not an anyio worker

        def progress(step: int, loss: float, elapsed: float, remaining: float) -> None:
            now = time.monotonic()
            if now - last[0] < 1.0:
                return
            last[0] = now
            total = elapsed + max(0.0, remaining)
            msg = f"step {step} loss {loss:.4f} {max(0.0, remaining):.0f}s left"
            asyncio.run_coroutine_threadsafe(ctx.report_progress(elapsed, total=total or None, message=msg), loop)

        return await in_thread(lambda e: e.run_experiment(description, hypothesis, confirm_of, on_progress=progress,
                                                          session_id=_session_id()))

    @server.tool(annotations=ToolAnnotations(title="Score an experiment", read_only_hint=False,
                                             destructive_hint=True, idempotent_hint=False, open_world_hint=False))
    async def score(experiment_id: Optional[int] = None) -> ScoreResult:
        """Paired verdict for the latest (or given) experiment, on candidate - reference differences over the
        same seeds: keep advances the branch, discard resets train.py to the best version, retest asks for a
        confirm pair on a fresh seed (candidate and best both run on it)."""
        return await in_thread(lambda e: e.score(experiment_id))

    @server.tool(annotations=ToolAnnotations(title="Revert train.py", read_only_hint=False, destructive_hint=True,
                                             idempotent_hint=True, open_world_hint=False))
    async def revert(to: Optional[int] = None) -> RevertResult:
        """Reset train.py to the best version, or to a kept / baseline / retest experiment's version."""
        return await in_thread(lambda e: e.revert(to))

    @server.tool(annotations=ToolAnnotations(title="Check the budget", read_only_hint=True, open_world_hint=False))
    async def budget_check() -> BudgetResult:
        """Remaining runs, compute hours and agent cost; should_stop and why; the minimum detectable effect
        (mde) and keep bar at the current paired noise, so you know which changes are worth a run."""
        return await in_thread(lambda e: e.budget())

    @server.tool(annotations=ToolAnnotations(title="Read the loop state", read_only_hint=True,
                                             open_world_hint=False))
    async def state_read(view: View = "summary", limit: int = 20) -> StateView:
        """The campaign state. Views: summary, history (recent experiments), best, notes, noise (seed set,
        paired sigma, keep bar and minimum detectable effect), tried (every experiment's description)."""
        return await in_thread(lambda e: e.state(view, limit))

    @server.tool(annotations=ToolAnnotations(title="Record a note", read_only_hint=False, destructive_hint=False,
                                             idempotent_hint=False, open_world_hint=False))
    async def note(text: str, kind: NoteKind = "lesson", experiment_id: Optional[int] = None) -> NoteResult:
        """Record a lesson, dead end, idea or observation for later sessions."""
        return await in_thread(lambda e: e.note(text, kind, experiment_id))

    _register_extensions(server, in_thread)
    return server


def _deliver_events(root: Path) -> None:
    """Events the engine recorded (keep, crash, tamper, budget spent) go out from here, the edge."""
    try:
        from mcp_server.notify.outbox import deliver_in_background
        deliver_in_background(root)
    except Exception:  # noqa: BLE001 - delivery is retried by the outbox; never fail a tool call for it
        log.debug("could not start event delivery", exc_info=True)


def _session_id() -> Optional[int]:
    """The ledger session of the agent that started this server (set by `loopwright launch`)."""
    value = os.environ.get("LOOPWRIGHT_SESSION_ID", "")
    return int(value) if value.isdigit() else None


def _register_extensions(server: MCPServer, in_thread) -> None:
    """Optional tools from other modules (search mechanisms), registered when present."""
    try:
        from mcp_server.mechanisms import register_tools
    except ImportError:
        return
    register_tools(server, in_thread)


def serve(workspace: Path | str, http: bool = False, host: str = "127.0.0.1", port: int = 8765,
          level: str = "inner") -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if level == "outer":   # the outer loop's own tool set (mcp/outer.py); never mixed into the inner one
        from mcp_server.mcp.outer import build_outer_server
        server = build_outer_server(workspace)
    else:
        server = build_server(workspace, strict=False)
    if http:
        server.run("streamable-http", host=host, port=port)
    else:
        server.run()
