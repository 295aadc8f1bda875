"""The MCP server: a thin layer over the engine (official `mcp` SDK 2.x).

Every call opens its own Engine (its own SQLite connection), so a long
run_experiment in a worker thread never shares a connection with a quick
state_read. LoopErrors become ToolErrors whose text tells the agent what to do.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
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
from mcp_server.common import procs
from mcp_server.loop.models import (
    BudgetResult,
    Change,
    ExperimentResult,
    NoteResult,
    RevertResult,
    ScoreResult,
    StateView,
    SubmitResult,
    WaitResult,
)

log = logging.getLogger("loopwright.server")

INSTRUCTIONS = """loopwright runs a closed research loop on this workspace. Only train.py may be edited.
Loop: state_read -> edit train.py -> run_experiment(description, hypothesis) -> score -> budget_check -> note.
A 'retest' verdict means: run_experiment(confirm_of=ID) without editing, then score(ID).
A 'pending_approval' verdict (or run status) means a person decides that change; go on from the best.
Parallel: submit_experiment(description, hypothesis) queues the edited train.py and frees it at once; wait(ids)
gives verdicts (decided automatically, against the best at that time). Do not mix with run_experiment while
submissions are open.
Never stop to ask whether to continue; stop only when budget_check says should_stop."""

View = Literal["summary", "history", "best", "notes", "noise", "tried"]
NoteKind = Literal["lesson", "dead_end", "idea", "observation"]


def build_server(workspace: Path | str, strict: bool = True) -> MCPServer:
    """The server for one workspace. strict=False still starts on a broken or missing workspace (as a
    plugin must, so the agent sees why) and reports the problem on every tool call."""
    root = Path(workspace).expanduser().resolve()
    # The engine (git, the ledger, approvals) is imported on the first tool call, not here: a client lists
    # the tools right after start-up and gives up early ("No such tool") if that takes seconds.
    if strict:   # a server that serves writing tools recovers what a killed predecessor left, at start-up
        from mcp_server.loop.engine import Engine

        Engine.open_for_writing(root).close()
    server = MCPServer("loopwright", version=__version__, instructions=INSTRUCTIONS)

    def call(fn: Callable[[Any], Any], write: bool) -> Any:
        from mcp_server.loop.engine import Engine, LoopError

        try:
            # a writing tool first recovers what a killed run left; a reading one changes nothing
            eng = Engine.open_for_writing(root) if write else Engine(root)
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

    async def in_thread(fn: Callable[[Any], Any], *, write: bool) -> Any:
        return await anyio.to_thread.run_sync(lambda: call(fn, write))

    @server.tool(annotations=ToolAnnotations(title="Run an experiment", read_only_hint=False,
                                             destructive_hint=False, idempotent_hint=False, open_world_hint=False))
    async def run_experiment(description: str, ctx: Context, hypothesis: Optional[str] = None,
                             confirm_of: Optional[int] = None, change: Optional[Change] = None) -> ExperimentResult:
        """Commit the edited train.py, train it under the fixed time budget, evaluate it with the frozen
        evaluator and record the result. The first call also measures the baseline on the campaign's seed set;
        a candidate runs on the same seeds as the best version (paired; it stops after the first pair when that
        is clearly worse). Returns metrics, the seed-matched pairs and, on failure, the log tail. Takes
        minutes; progress is reported. Optional `change`, e.g. {"name": "LR", "old": 0.004, "new": 0.008}: the
        one constant you changed, recorded with the experiment (checked against train.py)."""
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
                                                          session_id=_session_id(), change=change),
                               write=True)

    @server.tool(annotations=ToolAnnotations(title="Score an experiment", read_only_hint=False,
                                             destructive_hint=True, idempotent_hint=False, open_world_hint=False))
    async def score(experiment_id: Optional[int] = None) -> ScoreResult:
        """Paired verdict for the latest (or given) experiment, on candidate - reference differences over the
        same seeds: keep advances the branch, discard resets train.py to the best version, retest asks for a
        confirm pair on a fresh seed (candidate and best both run on it)."""
        return await in_thread(lambda e: e.score(experiment_id), write=True)

    @server.tool(annotations=ToolAnnotations(title="Revert train.py", read_only_hint=False, destructive_hint=True,
                                             idempotent_hint=True, open_world_hint=False))
    async def revert(to: Optional[int] = None) -> RevertResult:
        """Reset train.py to the best version, or to a kept / baseline / retest experiment's version."""
        return await in_thread(lambda e: e.revert(to), write=True)

    @server.tool(annotations=ToolAnnotations(title="Check the budget", read_only_hint=True, open_world_hint=False))
    async def budget_check() -> BudgetResult:
        """Remaining runs, compute hours and agent cost; should_stop and why; the minimum detectable effect
        (mde) and keep bar at the current paired noise, so you know which changes are worth a run."""
        return await in_thread(lambda e: e.budget_check(), write=False)

    @server.tool(annotations=ToolAnnotations(title="Read the loop state", read_only_hint=True,
                                             open_world_hint=False))
    async def state_read(view: View = "summary", limit: int = 20) -> StateView:
        """The campaign state. Views: summary, history (recent experiments), best, notes, noise (seed set,
        paired sigma, keep bar and minimum detectable effect), tried (every experiment's description)."""
        return await in_thread(lambda e: e.state(view, limit), write=False)

    @server.tool(annotations=ToolAnnotations(title="Record a note", read_only_hint=False, destructive_hint=False,
                                             idempotent_hint=False, open_world_hint=False))
    async def note(text: str, kind: NoteKind = "lesson", experiment_id: Optional[int] = None) -> NoteResult:
        """Record a lesson, dead end, idea or observation for later sessions."""
        return await in_thread(lambda e: e.note(text, kind, experiment_id), write=True)

    _register_async_tools(server, in_thread)
    _register_extensions(server, in_thread)
    return server


def _register_async_tools(server: MCPServer, in_thread) -> None:
    """submit_experiment and wait: asynchronous experiments on the executor (loop/asyncrun.py)."""

    @server.tool(annotations=ToolAnnotations(title="Submit an experiment", read_only_hint=False,
                                             destructive_hint=False, idempotent_hint=False, open_world_hint=False))
    async def submit_experiment(description: str, hypothesis: Optional[str] = None,
                                change: Optional[Change] = None) -> SubmitResult:
        """Queue the edited train.py as an experiment and return its id at once: train.py is snapshotted into a
        commit and is yours again for the next edit. Its runs (the candidate on every seed of the seed set,
        paired with the best, plus any reference runs the best still needs) go to the executor, in parallel
        where it allows. The verdict is decided when its runs are in, against the best at that time (a
        candidate whose parent is no longer the best is rebased onto it and re-measured). With train.py
        unchanged and no baseline yet, it measures the baseline. Read results with wait(ids) or state_read.
        Optional `change` as for run_experiment."""
        return await in_thread(lambda e: e.submit_experiment(description, hypothesis, session_id=_session_id(),
                                                             change=change), write=True)

    @server.tool(annotations=ToolAnnotations(title="Wait for experiments", read_only_hint=False,
                                             destructive_hint=False, idempotent_hint=True, open_world_hint=False))
    async def wait(ids: Optional[list[int]] = None, timeout_s: float = 600.0) -> WaitResult:
        """Wait until the submitted experiments `ids` are decided, at most timeout_s seconds (0 = just look).
        No ids: every decided experiment whose verdict no wait() returned yet (also one decided while you
        submitted or read the state), blocking only until one is decided; with nothing in flight and nothing
        undelivered it returns at once. Returns each one's verdict, paired differences, lost runs (re-queued
        once) and what is still in flight."""
        if timeout_s < 0 or timeout_s > 3600:
            raise ToolError(f"timeout_s={timeout_s} is out of range: use 0 (just look) to 3600 seconds")
        return await in_thread(lambda e: e.wait(ids, timeout_s), write=True)


def _deliver_events(root: Path) -> None:
    """Events the engine recorded (keep, crash, tamper, budget spent) go out from here, the edge."""
    try:
        from mcp_server.notify.outbox import deliver_in_background
        deliver_in_background(root)
    except Exception as e:  # noqa: BLE001 - delivery is retried by the outbox; never fail a tool call for it
        log.warning("could not start event delivery: %s: %s", type(e).__name__, e, exc_info=True)


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
        return
    # stdio: the client owns this process. Leave when it goes away, even if it left stdin open (a client's
    # background daemon can hold the pipe), and once stdin closes, even with a tool call still running.
    ppid = os.getppid()
    for sig in (signal.SIGTERM, signal.SIGHUP):   # told to end: the run in flight is interrupted, not a crash
        signal.signal(sig, lambda *_: _shutdown())
    _exit_with_parent(ppid)
    _exit_on_stdin_hangup()
    log.info("serving %s on stdio for parent process %d", workspace, ppid)
    # fd 1 is the protocol channel, and other code in this process writes to it: Ray's driver prints
    # "(raylet) ... marked dead" to stdout even with log_to_driver=False, child processes inherit fd 1. The
    # SDK's stdio transport (mcp >= 2.3, the pinned range) claims it: the protocol goes through a private
    # close-on-exec duplicate and fd 1 is pointed at stderr, so nothing else can reach the client's stream
    # (tests/mcp/test_loop_mcp.py::test_stdout_noise_never_reaches_the_protocol_stream fails if it stops doing so).
    server.run()
    log.info("stdin closed: exiting")
    _shutdown()


def _exit_with_parent(ppid: int, interval_s: float = 0.5) -> threading.Thread:
    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != ppid:   # re-parented: the client died
                log.warning("parent process %d is gone: exiting", ppid)
                _shutdown()

    t = threading.Thread(target=watch, name="loopwright-parent-watch", daemon=True)
    t.start()
    return t


def _exit_on_stdin_hangup(grace_s: float = 2.0) -> Optional[threading.Thread]:
    """The SDK's stdio loop returns on EOF only once in-flight calls finish (a run takes minutes): watch
    stdin for a hang-up without reading it, give the normal exit `grace_s`, then end the server."""
    import select

    if not hasattr(select, "poll"):
        return None

    try:
        fd = os.dup(0)          # our own handle: the SDK closes fd 0 at EOF and the number gets reused
    except OSError:
        return None

    def watch() -> None:
        poller = select.poll()
        poller.register(fd, 0)  # no events asked: POLLHUP/POLLERR/POLLNVAL are always reported
        while True:
            if any(ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, ev in poller.poll(1000)):
                time.sleep(grace_s)
                log.warning("stdin closed while a call was still running: exiting")
                _shutdown()

    t = threading.Thread(target=watch, name="loopwright-stdin-watch", daemon=True)
    t.start()
    return t


def _children(pid: int) -> list[int]:
    """Direct children of `pid` (Linux /proc; elsewhere none are found and only this process exits)."""
    out = []
    for d in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d))
    return out


def _shutdown(grace_s: float = 2.0) -> None:
    """End this server now: its children's process groups (a training run, git) get SIGTERM, then SIGKILL;
    a run cut short is marked interrupted (by the tool call, if it can record it within the grace, else by the
    next server's recovery), never as a crash of the change it measured."""
    procs.note_stopping()
    me, groups = os.getpid(), set()
    for child in _children(me):
        try:
            pgid = os.getpgid(child)
        except OSError:
            continue
        groups.add(pgid if pgid != os.getpgid(0) else -child)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for g in groups:
            try:
                os.killpg(g, sig) if g > 0 else os.kill(-g, sig)
            except OSError:
                pass
        if sig == signal.SIGTERM and groups:
            time.sleep(grace_s)
    logging.shutdown()
    os._exit(0)
