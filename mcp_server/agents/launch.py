"""One headless agent session in a workspace: `claude -p`, `codex exec` or the built-in agent.

    launch_session(root, agent="claude", trigger="cron", detail="...", max_session_minutes=120) -> session id

The cron and webhook triggers call this (they hold session.lock in the state directory themselves);
`loopwright launch` takes the lock and calls it too.

What a session gets:

- **Refusal up front.** When budget_check says should_stop, nothing starts (LaunchError).
  A missing client binary is refused the same way.
- **The workspace's own wiring.**
  Claude Code: `--setting-sources project` (the workspace's `.claude/settings.json` hooks)
  and `--mcp-config <ws>/.mcp.json --strict-mcp-config`. These files are written by
  `loopwright init`, are frozen in the pinned commit (the agent cannot rewire them), name the
  interpreter that made the workspace, and do not depend on whether or where the plugin is
  installed; strict MCP and project-only settings keep a user-level loopwright plugin from
  starting a second server or a second set of hooks.
  Codex: the MCP server and the hooks come in as `-c` overrides built here (Codex reads a
  project's `.codex/config.toml` only for trusted projects, has no `required` in it, and its
  hook matcher is shorter than the guard's): `required = true` (the server is up before the
  first model call), `tool_timeout_sec` = the session limit (an experiment trains for minutes),
  `default_tools_approval_mode = "approve"` (score and revert are annotated destructive, and
  with approvals off Codex refuses tools that would need one),
  hooks trusted for the run (`--dangerously-bypass-hook-trust`), the `loopwright` permission
  profile (never `-s`: it would replace the profile).
- **Unattended permissions.** Claude: `--permission-mode acceptEdits` plus `--allowedTools`
  for the loopwright tools, Read/Edit/Write/Glob/Grep/Bash (the guard checks each call);
  works as root without IS_SANDBOX. Codex: the `loopwright` permission profile, approvals off.
- **Caps.** Claude: `--max-budget-usd` = the campaign's remaining cost budget. Both: a
  wall-clock limit, after which the whole process group is killed (exit code 124).
  `CLAUDE_CODE_STOP_HOOK_BLOCK_CAP=0` (unless set): the guard's Stop hook bounds itself
  (LOOPWRIGHT_STOP_MAX_IDLE_BLOCKS) and must not be cut off after 8 blocks mid-campaign.
  `MCP_CONNECTION_NONBLOCKING=false` and `MCP_CONNECT_TIMEOUT_MS=60000`: claude waits for the
  server (up to 60 s instead of 5 s; the Python server takes seconds to start) before its first turn.
- **A record.** One `sessions` row (start, end, exit code, turns, cost, a short detail JSON)
  whatever happens (clean exit, crash, kill at the limit, Ctrl-C), the client's output in
  `sessions/<id>-<agent>/` of the state directory with secret values masked, and a `session_end`
  event in the outbox ({agent, trigger, exit_code, cost_usd, turns, experiments, kept}).

Cost and turns: Claude's final `result` event (total_cost_usd, num_turns). Codex has no cost
cap and reports tokens only: usage from `turn.completed` goes to the detail, and cost_usd is
0 unless LOOPWRIGHT_CODEX_PRICE (USD per million tokens, e.g.
"input=1.25,cached_input=0.125,output=10") is set; turns = the completed agent items (messages
and tool calls). Built-in agent: cost 0, turns = experiments it ran.

Environment knobs: LOOPWRIGHT_CLAUDE_BIN / LOOPWRIGHT_CODEX_BIN (default: PATH),
LOOPWRIGHT_CLAUDE_ARGS / LOOPWRIGHT_CODEX_ARGS (extra flags, shell-quoted, e.g. "--model
sonnet"), LOOPWRIGHT_CODEX_PRICE. The client's own settings (API keys, ANTHROPIC_BASE_URL,
CODEX_HOME) come from the environment as usual and are never written anywhere. The session's
environment is an allow-list (agents/agent_env.py): no connector token or signing secret reaches it.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from mcp_server.agents.agent_env import SECRET_NAME
from mcp_server.common.facts import MCP_SERVER, MCP_TOOLS
from mcp_server.common.procs import kill_group

if TYPE_CHECKING:
    from mcp_server.loop.config import LoopwrightConfig

AGENTS = ("claude", "codex", "builtin")
CLAUDE_TOOLS = ("Read", "Edit", "Write", "Glob", "Grep", "Bash", "TodoWrite")
CLAUDE_DISALLOWED = ("EnterWorktree",)   # would move the loop's repository onto another branch
DEFAULT_MAX_MINUTES = 120.0
KILL_GRACE_S = 5.0
TIMEOUT_EXIT = 124
DEFAULT_PROMPT = (
    "You are running an unattended loopwright research session in this workspace; nobody will answer "
    "questions. Read program.md and follow it. Work only through the loopwright MCP tools (state_read, "
    "suggest_next, run_experiment, score, revert, budget_check, note) and edits of train.py, the only file "
    "you may change. Loop: pick one idea, edit train.py, run_experiment(description, hypothesis), then "
    "score. Keep going until budget_check says should_stop; then record what you learned with note() and "
    "stop.")
SESSIONS_DIR = "sessions"
LEVELS = ("inner", "outer")
OUTER_SERVER = "loopwright_outer"
OUTER_CLAUDE_TOOLS = ("Read", "Glob", "Grep")          # the outer session reads; it edits nothing
OUTER_DISALLOWED = ("Edit", "Write", "MultiEdit", "NotebookEdit", "Bash", "EnterWorktree")
OUTER_PROMPT = (
    "You are running an unattended loopwright OUTER-LOOP session; nobody will answer questions. You improve "
    "the search of the inner research loop, not train.py, and you edit no file. Follow the outer-loop "
    "protocol of the loopwright_outer MCP server: trace_read (find where the search stalls), mechanisms_list, "
    "then at most one mechanism_propose(name, code, rationale) of a small advise(history, source) module that "
    "targets the stall, and mechanism_activate it if it validated (fix and propose again if it was rejected). "
    "A mechanism that does not help is reverted automatically after its trial window. Then stop.")
_AGENT_ITEMS = ("agent_message", "mcp_tool_call", "file_change", "command_execution", "web_search",
                "todo_list", "collab_tool_call")


class LaunchError(RuntimeError):
    """The session was not started; the message says why and what to do."""


# --------------------------------------------------------------------------- secrets

class Redactor:
    """Masks the values of secret-looking environment variables (names with KEY, TOKEN, SECRET,
    PASSWORD, ...) in text before it is written anywhere."""

    def __init__(self, env: dict[str, str]):
        values = {v for k, v in env.items() if SECRET_NAME.search(k) and v and len(v) >= 6}
        self._values = sorted(values, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for v in self._values:
            if v in text:
                text = text.replace(v, "***")
        return text


# --------------------------------------------------------------------------- output parsing

@dataclass
class Outcome:
    turns: Optional[int] = None
    cost_usd: float = 0.0
    info: dict = field(default_factory=dict)   # goes into the session's detail JSON


class ClaudeParser:
    """stream-json events of `claude -p --output-format stream-json --verbose`."""

    def __init__(self) -> None:
        self.result: Optional[dict] = None
        self.assistant_ids: set[str] = set()
        self.model: Optional[str] = None

    def feed(self, ev: dict) -> None:
        kind = ev.get("type")
        if kind == "result":
            self.result = ev
        elif kind == "assistant":
            msg = ev.get("message") or {}
            self.assistant_ids.add(str(msg.get("id") or len(self.assistant_ids)))
        elif kind == "system" and ev.get("subtype") == "init":
            self.model = ev.get("model")

    def outcome(self) -> Outcome:
        r = self.result
        if r is None:   # killed or crashed before the end: no cost figure from the client
            return Outcome(turns=len(self.assistant_ids), info={"result": None, "model": self.model})
        usage = r.get("usage") or {}
        info = {"result": r.get("subtype"), "is_error": bool(r.get("is_error")), "model": self.model,
                "permission_denials": len(r.get("permission_denials") or []),
                "usage": {k: usage.get(k) for k in ("input_tokens", "output_tokens", "cache_read_input_tokens",
                                                     "cache_creation_input_tokens") if k in usage}}
        return Outcome(turns=_int(r.get("num_turns")), cost_usd=float(r.get("total_cost_usd") or 0.0), info=info)


class CodexParser:
    """JSONL events of `codex exec --json`."""

    def __init__(self, price: Optional[dict[str, float]]) -> None:
        self.price = price
        self.usage: dict[str, int] = {}
        self.items: dict[str, int] = {}
        self.turns_completed = 0
        self.failure: Optional[str] = None

    def feed(self, ev: dict) -> None:
        kind = ev.get("type")
        if kind == "turn.completed":
            self.turns_completed += 1
            for k, v in (ev.get("usage") or {}).items():
                if isinstance(v, (int, float)):
                    self.usage[k] = self.usage.get(k, 0) + int(v)
        elif kind == "turn.failed":
            self.failure = str((ev.get("error") or {}).get("message") or ev)[:300]
        elif kind == "item.completed":
            t = str((ev.get("item") or {}).get("type"))
            self.items[t] = self.items.get(t, 0) + 1

    def cost(self) -> float:
        if not self.price or not self.usage:
            return 0.0
        inp = self.usage.get("input_tokens", 0)
        cached = min(inp, self.usage.get("cached_input_tokens", 0))
        out = self.usage.get("output_tokens", 0)
        p = self.price
        return round(((inp - cached) * p.get("input", 0.0) + cached * p.get("cached_input", p.get("input", 0.0))
                      + out * p.get("output", 0.0)) / 1e6, 6)

    def outcome(self) -> Outcome:
        info: dict[str, Any] = {"usage": self.usage, "codex_turns": self.turns_completed,
                                "items": {k: v for k, v in self.items.items() if k != "error"}}
        if self.failure:
            info["turn_failed"] = self.failure
        if not self.price:
            info["cost_note"] = "Codex reports tokens only; set LOOPWRIGHT_CODEX_PRICE to record a cost"
        turns = sum(v for k, v in self.items.items() if k in _AGENT_ITEMS)
        return Outcome(turns=turns, cost_usd=self.cost(), info=info)


class PlainParser:
    def feed(self, ev: dict) -> None:
        pass

    def outcome(self) -> Outcome:
        return Outcome()


def parse_price(text: Optional[str]) -> Optional[dict[str, float]]:
    """"input=1.25,cached_input=0.125,output=10" (USD per million tokens) -> dict; raises LaunchError."""
    if not text or not text.strip():
        return None
    out: dict[str, float] = {}
    for part in text.split(","):
        key, _, val = part.partition("=")
        key = key.strip()
        if key not in ("input", "cached_input", "output"):
            raise LaunchError(f"LOOPWRIGHT_CODEX_PRICE: unknown key {key!r}; use input=, cached_input=, output= "
                              "(USD per million tokens), e.g. input=1.25,cached_input=0.125,output=10")
        try:
            out[key] = float(val)
        except ValueError:
            raise LaunchError(f"LOOPWRIGHT_CODEX_PRICE: {part.strip()!r} is not key=number") from None
    return out


# --------------------------------------------------------------------------- command lines

def find_client(agent: str, env: dict[str, str]) -> str:
    var = f"LOOPWRIGHT_{agent.upper()}_BIN"
    exe = env.get(var) or shutil.which(agent, path=env.get("PATH"))
    if not exe or not (Path(exe).is_file() and os.access(exe, os.X_OK)):
        pkg = "@anthropic-ai/claude-code" if agent == "claude" else "@openai/codex"
        where = f"{var}={exe} is not an executable file" if env.get(var) else f"`{agent}` is not on PATH"
        raise LaunchError(f"cannot start a {agent} session: {where}. Install it (`npm install -g {pkg}`) or set "
                          f"{var} to the binary.")
    return str(exe)


def _extra_args(env: dict[str, str], agent: str) -> list[str]:
    raw = env.get(f"LOOPWRIGHT_{agent.upper()}_ARGS", "")
    try:
        return shlex.split(raw)
    except ValueError as e:
        raise LaunchError(f"LOOPWRIGHT_{agent.upper()}_ARGS is not valid shell syntax ({e})") from None


def claude_argv(exe: str, root: Path, prompt: str, cost_left: Optional[float], extra: list[str],
                state_dir: Optional[Path] = None) -> list[str]:
    from mcp_server.agents import clients

    if not (root / ".claude" / "settings.json").is_file():
        raise LaunchError(f"{root} lacks .claude/settings.json (written by `loopwright init`); this workspace "
                          "cannot be launched headless. Run `loopwright doctor` to see why.")
    if state_dir is None and not (root / ".mcp.json").is_file():
        raise LaunchError(f"{root} lacks .mcp.json (a plugin-wired workspace): launch it through "
                          "`loopwright launch`, which passes the server and hooks itself")
    mcp_json, hooks = ((root / ".mcp.json", None) if state_dir is None else
                       clients.launcher_claude_files(root, sys.executable, state_dir))
    tools = [f"mcp__{MCP_SERVER}__{t}" for t in MCP_TOOLS] + list(CLAUDE_TOOLS)
    argv = [exe, "-p", prompt, "--output-format", "stream-json", "--verbose",
            "--permission-mode", "acceptEdits", "--allowedTools", ",".join(tools),
            "--disallowedTools", ",".join(CLAUDE_DISALLOWED),
            "--setting-sources", "project", "--mcp-config", str(mcp_json), "--strict-mcp-config"]
    if hooks is not None:   # a plugin-wired workspace: the hooks come from the state dir
        argv += ["--settings", str(hooks)]
    if cost_left is not None:
        argv += ["--max-budget-usd", f"{max(cost_left, 0.0):.4f}"]
    return argv + extra


def outer_mcp_config(root: Path, state_dir: Path, python: str) -> Path:
    """The outer server's MCP config, in the loop's state dir (the agent cannot rewire it)."""
    path = state_dir / "outer-mcp.json"
    cfg = {"mcpServers": {OUTER_SERVER: {"command": python, "args": ["-m", "mcp_server.cli", "serve", "--level",
                                                                     "outer", "--workspace", str(root)]}}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    return path


def claude_outer_argv(exe: str, root: Path, state_dir: Path, prompt: str, cost_left: Optional[float],
                      extra: list[str]) -> list[str]:
    """An outer session: only the outer tools and read-only file tools; the workspace's hooks still apply."""
    from mcp_server.mcp.outer import OUTER_TOOLS

    tools = [f"mcp__{OUTER_SERVER}__{t}" for t in OUTER_TOOLS] + list(OUTER_CLAUDE_TOOLS)
    argv = [exe, "-p", prompt, "--output-format", "stream-json", "--verbose",
            "--permission-mode", "default", "--allowedTools", ",".join(tools),
            "--disallowedTools", ",".join(OUTER_DISALLOWED), "--setting-sources", "project",
            "--mcp-config", str(outer_mcp_config(root, state_dir, sys.executable)), "--strict-mcp-config"]
    if cost_left is not None:
        argv += ["--max-budget-usd", f"{max(cost_left, 0.0):.4f}"]
    return argv + extra


def private_paths(corpus: str, root: Optional[Path] = None) -> list[str]:
    """The corpus's text on disk, kept from the agent's shell like the state dir (loop/sandbox.py says which)."""
    from mcp_server.loop.sandbox import agent_private_paths

    return agent_private_paths(corpus, root)


def codex_overrides(root: Path, python: str, tool_timeout_s: float, level: str = "inner",
                    state_dir: Optional[Path] = None, private: Sequence[str] = ()) -> list[str]:
    """`-c` overrides: the `loopwright` permission profile, the loopwright MCP server and the guard hooks, run
    by `python` (generated in agents/clients.py, with every other client config)."""
    from mcp_server.agents import clients

    return clients.codex_overrides(root, python, tool_timeout_s, level, outer_server=OUTER_SERVER,
                                   state_dir=state_dir, private=private)


def codex_argv(exe: str, root: Path, prompt: str, tool_timeout_s: float, extra: list[str],
               level: str = "inner", state_dir: Optional[Path] = None, private: Sequence[str] = ()) -> list[str]:
    # no -s/--sandbox: with it Codex drops the permission profile (and its read denies) for workspace-write
    return ([exe, "exec", "--json", "--dangerously-bypass-hook-trust",
             "-c", 'approval_policy="never"', "-C", str(root)]
            + codex_overrides(root, sys.executable, tool_timeout_s, level, state_dir, private) + extra
            + ["--", prompt])


def builtin_argv(root: Path, limit_s: float) -> list[str]:
    return [sys.executable, "-m", "mcp_server.cli", "run", "--agent", "builtin", "--workspace", str(root),
            "--time-budget", f"{limit_s:.0f}"]


# --------------------------------------------------------------------------- running

@dataclass
class _Run:
    exit_code: Optional[int]
    timed_out: bool
    interrupted: Optional[str]
    duration_s: float
    stderr_tail: list[str]


def _pump(stream, path: Path, redact: Redactor, on_line: Optional[Callable[[str], None]],
          tail: Optional[list[str]]) -> None:
    with open(path, "w", encoding="utf-8") as out:
        for raw in iter(stream.readline, b""):
            text = raw.decode("utf-8", "replace")
            if on_line is not None:
                on_line(text)          # parsed as the client wrote it; only what is stored is masked
            masked = redact(text)
            out.write(masked)
            out.flush()
            if tail is not None:
                tail.append(masked.rstrip("\n"))
                del tail[:-30]
    stream.close()


def run_client(argv: list[str], cwd: Path, env: dict[str, str], limit_s: float, log_dir: Path,
               parser, redact: Redactor) -> _Run:
    """Run the client in its own process group; stdout (JSON lines) is parsed as it comes and
    logged with secrets masked; the group is killed at the limit, on Ctrl-C / SIGTERM, and after a
    normal exit (leftover MCP servers and hooks)."""

    def on_line(line: str) -> None:
        line = line.strip()
        if line.startswith("{"):
            try:
                ev = json.loads(line)
            except ValueError:
                return
            if isinstance(ev, dict):
                parser.feed(ev)

    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=str(cwd), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    tail: list[str] = []
    pumps = [threading.Thread(target=_pump, args=(proc.stdout, log_dir / "events.jsonl", redact, on_line, None),
                              daemon=True),
             threading.Thread(target=_pump, args=(proc.stderr, log_dir / "stderr.log", redact, None, tail),
                              daemon=True)]
    for t in pumps:
        t.start()
    timed_out, interrupted = False, None
    try:
        proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    except BaseException as e:   # Ctrl-C / SIGTERM in the launcher: the session still gets recorded
        interrupted = type(e).__name__
        kill_group(proc)
        for t in pumps:
            t.join(timeout=5)
        raise _Interrupted(_Run(proc.returncode, False, interrupted, time.monotonic() - t0, tail)) from e
    finally:
        if interrupted is None:
            kill_group(proc)
            for t in pumps:
                t.join(timeout=10)
    code = TIMEOUT_EXIT if timed_out else proc.returncode
    return _Run(code, timed_out, None, time.monotonic() - t0, tail)


class _Interrupted(BaseException):
    def __init__(self, run: _Run):
        super().__init__("interrupted")
        self.run = run


# --------------------------------------------------------------------------- the session

def _int(v) -> Optional[int]:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def _session_counts(ledger, campaign_id: int, since: float) -> tuple[int, int]:
    return ledger.counts_since(campaign_id, since)


def client_env(session_id: int, root: Path, base: Optional[dict[str, str]] = None, agent: str = "claude",
               cfg: Optional[LoopwrightConfig] = None) -> dict[str, str]:
    """The session's environment: the allow-list of agents/agent_env.py (no connector token or signing
    secret reaches the client, its shell, its MCP server or its hooks) plus the launcher's settings."""
    from mcp_server.agents.agent_env import agent_environment

    env = agent_environment(agent, os.environ if base is None else base, cfg)
    env.setdefault("CLAUDE_CODE_STOP_HOOK_BLOCK_CAP", "0")
    env["MCP_CONNECTION_NONBLOCKING"] = "false"
    env.setdefault("MCP_CONNECT_TIMEOUT_MS", "60000")   # how long that wait may take (claude's default: 5 s)
    env["LOOPWRIGHT_SESSION_ID"] = str(session_id)
    env["LOOPWRIGHT_WORKSPACE"] = str(root)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def launch_session(root: Path | str, agent: str, trigger: str = "manual", detail: str = "",
                   max_session_minutes: Optional[float] = None, prompt: Optional[str] = None,
                   level: str = "inner") -> int:
    """Run one headless session of `agent` in the workspace at `root`; returns its ledger session id.

    Raises LaunchError (nothing recorded) when the budget is spent, the agent is unknown or its
    binary is missing. Anything after the start (crash, kill at the wall-clock limit, Ctrl-C) is
    recorded; Ctrl-C / SIGTERM are re-raised after the record is written."""
    from mcp_server.loop.engine import Engine
    from mcp_server.loop.workspace import Workspace, sinks_for

    if agent not in AGENTS:
        raise LaunchError(f"unknown agent {agent!r}; use one of {', '.join(AGENTS)}")
    if level not in LEVELS:
        raise LaunchError(f"unknown level {level!r}; use inner (the research loop) or outer (its mechanisms)")
    minutes = DEFAULT_MAX_MINUTES if max_session_minutes is None else float(max_session_minutes)
    if minutes <= 0:
        raise LaunchError(f"max_session_minutes must be positive (got {max_session_minutes})")
    limit_s = minutes * 60.0
    ws = Workspace.open(root)
    eng = Engine.open_for_writing(ws.root)   # a session writes: what a killed run left is recovered first
    try:
        campaign = eng.campaign
        budget = eng.budget(campaign)
        if budget.should_stop:
            raise LaunchError(f"not starting a {agent} session in {ws.root}: the campaign budget says stop "
                              f"({'; '.join(budget.reasons)}). Raise a limit with `loopwright config set "
                              f"budget.<key> VALUE` (e.g. budget.max_experiments; budgets live in the state "
                              f"directory's settings.toml, edits of loopwright.toml are ignored), clear a "
                              f"stop request with `loopwright stop --clear`, or start a new campaign "
                              f"(`loopwright init {ws.root} --tag NEW`).")
        # an allow-list: with a connector token or a signing secret the agent could post or sign its
        # own approval (loop/approvals.py)
        env = client_env(0, ws.root, agent=agent, cfg=ws.cfg)
        prompt = prompt or (OUTER_PROMPT if level == "outer" else DEFAULT_PROMPT)
        if agent == "claude" and level == "outer":
            argv = claude_outer_argv(find_client("claude", env), ws.root, ws.state_dir, prompt,
                                     budget.cost_left_usd, _extra_args(env, "claude"))
            parser: Any = ClaudeParser()
        elif agent == "claude":
            argv = claude_argv(find_client("claude", env), ws.root, prompt, budget.cost_left_usd,
                               _extra_args(env, "claude"), ws.state_dir)
            parser = ClaudeParser()
        elif agent == "codex":
            price = parse_price(env.get("LOOPWRIGHT_CODEX_PRICE"))
            argv = codex_argv(find_client("codex", env), ws.root, prompt, limit_s, _extra_args(env, "codex"), level,
                              ws.state_dir, private_paths(ws.cfg.benchmark.corpus, ws.root))
            parser = CodexParser(price)
        elif level == "outer":   # the built-in outer loop: one step (decide a trial, start the next)
            argv = [sys.executable, "-m", "mcp_server.cli", "mechanisms", "step", "--workspace", str(ws.root)]
            parser = PlainParser()
        else:
            argv = builtin_argv(ws.root, limit_s)
            parser = PlainParser()
        start_detail = {"trigger_detail": detail, "limit_minutes": minutes, "level": level}
        sid = eng.ledger.start_session(campaign["id"], trigger, agent, json.dumps(start_detail))
    finally:
        eng.close()   # no connection held open for the hours a session may run

    env["LOOPWRIGHT_SESSION_ID"] = str(sid)
    env["LOOPWRIGHT_SESSION_LEVEL"] = level   # the guard's Stop hook does not hold an outer session to the budget
    redact = Redactor({**os.environ, **env})   # the launcher's secrets too: the client could still print one
    log_dir = ws.state_dir / SESSIONS_DIR / f"{sid:05d}-{agent}"
    log_dir.mkdir(parents=True, exist_ok=True)
    run: Optional[_Run] = None
    error: Optional[str] = None
    reraise: Optional[BaseException] = None
    sinks = sinks_for(ws.cfg)
    courier = _Courier(ws.root) if sinks else None   # the tokens stay here: the session's server has none
    try:
        run = run_client(argv, ws.root, env, limit_s, log_dir, parser, redact)
    except _Interrupted as e:
        run, reraise = e.run, (e.__cause__ or KeyboardInterrupt())
    except OSError as e:   # the binary vanished or is not executable
        error = f"could not start {argv[0]}: {e}"
    except BaseException as e:  # noqa: BLE001 - recorded below, then re-raised
        error, reraise = f"{type(e).__name__}: {e}", e
    finally:
        if courier is not None:
            courier.stop()
    if agent in ("claude", "codex") and run is not None and not run.interrupted:
        from mcp_server.agents import clients

        with ws.ledger() as ledger:
            row = ledger.session(sid)
        started_at = row["started_at"] if row else 0.0        # the session was recorded above
        if not clients.hooks_ran_since(ws.root, started_at):
            start_detail["hooks_never_ran"] = True
            print(f"loopwright launch: session {sid}: {clients.HOOKS_NEVER_RAN}", file=sys.stderr)
    with ws.ledger() as ledger:
        _record_end(ledger, sid, campaign["id"], agent, trigger, start_detail, parser.outcome(), run, error,
                    (log_dir.relative_to(ws.root) if log_dir.is_relative_to(ws.root) else log_dir), redact, sinks)
    if sinks:
        _deliver(ws.root)
    if reraise is not None:
        raise reraise
    if error:
        raise LaunchError(f"session {sid} could not start: {error}")
    return sid


def _record_end(ledger, sid: int, campaign_id: int, agent: str, trigger: str, start_detail: dict,
                outcome: Outcome, run: Optional[_Run], error: Optional[str], log_rel: Path, redact: Redactor,
                sinks: list[str]) -> None:
    started_at = ledger.session(sid)["started_at"]
    experiments, kept = _session_counts(ledger, campaign_id, started_at)
    if agent == "builtin":
        outcome.turns = experiments
    if run is None:
        exit_code: Optional[int] = 127
    elif run.interrupted:
        exit_code = 130
    else:
        exit_code = run.exit_code
    info: dict[str, Any] = {**start_detail, **outcome.info, "log": str(log_rel), "experiments": experiments,
                            "kept": kept}
    if run is not None:
        info["duration_s"] = round(run.duration_s, 1)
        if run.timed_out:
            info["killed"] = f"wall-clock limit of {start_detail['limit_minutes']:g} min reached; process group killed"
        elif run.interrupted:
            info["killed"] = f"launcher interrupted ({run.interrupted}); process group killed"
        if exit_code != 0:
            info["stderr_tail"] = "\n".join(run.stderr_tail[-8:])[-800:]
    if error:
        info["error"] = error
    ledger.end_session(sid, exit_code, outcome.turns, outcome.cost_usd, redact(json.dumps(info, default=str)))
    payload = {"agent": agent, "trigger": trigger, "exit_code": exit_code, "cost_usd": outcome.cost_usd,
               "turns": outcome.turns, "experiments": experiments, "kept": kept}
    ledger.add_event(campaign_id, "session_end", payload, sinks)


class _Courier:
    """Delivery passes every LOOPWRIGHT_DELIVER_EVERY_S seconds (default 60) while a session runs: the
    launcher holds the connector tokens (the session's environment has none), so keeps and approval
    requests reach Slack / Jira during the session, not only after it."""

    def __init__(self, root: Path):
        try:
            every = float(os.environ.get("LOOPWRIGHT_DELIVER_EVERY_S") or 60)
        except ValueError:
            every = 60.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(root, max(every, 0.05)), daemon=True)
        self._thread.start()

    def _loop(self, root: Path, every: float) -> None:
        while not self._done.wait(every):
            _deliver(root)

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=60)


def _deliver(root: Path) -> None:
    """Best effort: the outbox keeps what fails for `loopwright notify` / the next delivery pass."""
    try:
        from mcp_server.notify.outbox import notify_workspace
        notify_workspace(root)
    except Exception:  # noqa: BLE001 - a connector failure never fails the session record
        pass


def session_report(root: Path | str, session_id: int) -> tuple[str, Optional[int]]:
    """(one line for the CLI: exit, turns, cost, experiments, where the log is; the exit code)."""
    from mcp_server.loop.workspace import Workspace

    with Workspace.open(root).ledger() as ledger:
        s = ledger.session(session_id)
    if s is None:
        return f"session {session_id}: not found", None
    try:
        d = json.loads(s.get("detail") or "{}")
    except ValueError:
        d = {}
    extra = f"; {d['killed']}" if d.get("killed") else (f"; {d['error']}" if d.get("error") else "")
    return (f"session {session_id} ({s['agent']}, {s['trigger']}): exit {s['exit_code']}, {s['turns']} turns, "
            f"${s['cost_usd']:.4f}, {d.get('experiments', '?')} experiments ({d.get('kept', '?')} kept){extra}; "
            f"log: {d.get('log', '?')}"), s["exit_code"]
