"""Run the real ``claude`` / ``codex`` CLIs offline against a scripted fake
model server, in an isolated temp folder, and hand back what happened.

    from realclients.harness import run_claude, run_codex, python_cmd, mcp_stdio
    from realclients.fake_anthropic import ToolUse

    run = run_claude(
        proj,                                    # the agent's cwd (must exist)
        [ToolUse("mcp__adder__add", {"a": 2, "b": 3}), "done"],
        mcp_servers={"adder": mcp_stdio(sys.executable, "add_server.py")},
        hooks={"PreToolUse": [{"matcher": "Write", "hooks": [{"type": "command", "command": python_cmd("hook.py")}]}]},
    ).check()
    run.tool_results()[-1].text == '{"result":5}'

See tests/realclients/README.md for the facts this relies on.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from mcp_server.common.procs import kill_group

try:
    from .fake_anthropic import FakeAnthropic, MessagesRequest
    from .fake_openai import FakeOpenAI, ResponsesRequest
except ImportError:  # pragma: no cover - imported as a top-level module
    from fake_anthropic import FakeAnthropic, MessagesRequest
    from fake_openai import FakeOpenAI, ResponsesRequest

HERE = Path(__file__).resolve().parent
DEFAULT_NPM_BIN = Path("/work/npmclients/node_modules/.bin")

# --------------------------------------------------------------------------
# finding the binaries


def npm_bin_dirs() -> list[Path]:
    """Where client binaries are looked up, in order (PATH comes last)."""
    dirs = [HERE / "node_modules" / ".bin"]
    if os.environ.get("LOOPWRIGHT_NPM_BIN"):
        dirs.append(Path(os.environ["LOOPWRIGHT_NPM_BIN"]))
    dirs.append(DEFAULT_NPM_BIN)
    return dirs


def find_binary(name: str) -> str | None:
    """Absolute path of ``claude`` / ``codex`` / ``mcp-inspector-cli`` or None."""
    for d in npm_bin_dirs():
        p = d / name
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return shutil.which(name)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def require_binary(name: str) -> str:
    """The binary's path; otherwise skip the test, or fail it when CI=true
    (CI must have run ``npm install --prefix tests/realclients``)."""
    path = find_binary(name)
    if path:
        return path
    import pytest

    where = ", ".join(str(d) for d in npm_bin_dirs()) + ", PATH"
    msg = f"{name} not found (looked in {where}); run `npm install --prefix tests/realclients`"
    if in_ci():
        pytest.fail(msg + " [CI=true: a missing client is a failure]", pytrace=False)
    pytest.skip(msg)


# --------------------------------------------------------------------------
# small helpers for building configs


def python_cmd(script: str | os.PathLike, *args: str) -> str:
    """A shell command line running ``script`` with this interpreter (for
    hook ``command`` strings)."""
    return shlex.join([sys.executable, str(script), *map(str, args)])


def mcp_stdio(command: str, *args: str, env: dict[str, str] | None = None, cwd: str | None = None) -> dict:
    """A stdio MCP server spec, usable in both ``run_claude(mcp_servers=)``
    and ``run_codex(mcp_servers=)``."""
    spec: dict[str, Any] = {"command": str(command), "args": [str(a) for a in args]}
    if env:
        spec["env"] = dict(env)
    if cwd:
        spec["cwd"] = str(cwd)
    return spec


def command_hook(command: str, matcher: str | None = None, timeout: int | None = None, **extra: Any) -> dict:
    """One hook-matcher group ``{"matcher":..., "hooks":[{"type":"command",...}]}``."""
    hook: dict[str, Any] = {"type": "command", "command": command, **extra}
    if timeout is not None:
        hook["timeout"] = timeout
    group: dict[str, Any] = {"hooks": [hook]}
    if matcher is not None:
        group["matcher"] = matcher
    return group


_SCRUB_PREFIXES = ("ANTHROPIC_", "CLAUDE", "OPENAI_", "CODEX_", "MCP_")
_PROXY_VARS = {"http_proxy", "https_proxy", "all_proxy", "ftp_proxy", "no_proxy"}


def isolated_env(run_dir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """os.environ minus proxies and any Anthropic/OpenAI/Claude/Codex
    settings, with HOME, XDG and temp dirs moved under ``run_dir``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k.lower() not in _PROXY_VARS and not k.upper().startswith(_SCRUB_PREFIXES)
    }
    dirs = {name: run_dir / name for name in ("home", "tmp", "xdg-runtime", "xdg-cache", "xdg-config", "xdg-data")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    os.chmod(dirs["xdg-runtime"], 0o700)
    env.update(
        HOME=str(dirs["home"]),
        TMPDIR=str(dirs["tmp"]),
        XDG_RUNTIME_DIR=str(dirs["xdg-runtime"]),
        XDG_CACHE_HOME=str(dirs["xdg-cache"]),
        XDG_CONFIG_HOME=str(dirs["xdg-config"]),
        XDG_DATA_HOME=str(dirs["xdg-data"]),
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        NO_COLOR="1",
        PYTHONUNBUFFERED="1",
    )
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


def claude_env(run_dir: Path, base_url: str | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for an offline ``claude`` (see real-clients.md)."""
    env = isolated_env(run_dir)
    config = run_dir / "claude-config"
    ctmp = run_dir / "claude-tmp"
    config.mkdir(exist_ok=True)
    ctmp.mkdir(exist_ok=True)
    env.update(
        ANTHROPIC_API_KEY="dummy-key",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        DISABLE_AUTOUPDATER="1",
        CLAUDE_CONFIG_DIR=str(config),
        CLAUDE_CODE_TMPDIR=str(ctmp),
        IS_SANDBOX="1",  # bypassPermissions is refused as root without it
        # Wait for MCP servers before the first model call (default in -p
        # mode is non-blocking: an early mcp__ call fails "still connecting").
        MCP_CONNECTION_NONBLOCKING="false",
    )
    if base_url:
        env["ANTHROPIC_BASE_URL"] = base_url
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


def codex_env(run_dir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = isolated_env(run_dir)
    home = run_dir / "codex-home"
    home.mkdir(exist_ok=True)
    env.update(CODEX_HOME=str(home), FAKE_OPENAI_KEY="dummy-key")
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


def _new_run_dir(workdir: Path, client: str, run_dir: str | os.PathLike | None) -> Path:
    if run_dir is not None:
        p = Path(run_dir)
        p.mkdir(parents=True, exist_ok=True)
        return p.resolve()
    # A sibling of the project keeps pytest's tmp_path tidy; the project
    # itself stays free of client state.
    return Path(tempfile.mkdtemp(prefix=f"{workdir.name}.{client}-run-", dir=workdir.parent)).resolve()


# --------------------------------------------------------------------------
# running a process with a wall-clock limit


@dataclass
class Proc:
    argv: list[str]
    exit_code: int | None
    stdout: str
    stderr: str
    duration: float
    timed_out: bool


def run_process(
    argv: Sequence[str], *, cwd: Path, env: dict[str, str], timeout: float, log_prefix: Path | None = None
) -> Proc:
    """Run ``argv`` in its own session; on timeout kill the whole process
    group (the client and the MCP servers / hooks it spawned)."""
    log_prefix = log_prefix or Path(tempfile.mkdtemp()) / "proc"
    out_path, err_path = Path(f"{log_prefix}.stdout"), Path(f"{log_prefix}.stderr")
    t0 = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            list(argv), cwd=str(cwd), env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True
        )
        timed_out = False
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            code = None
            _kill_group(proc)
        else:
            _kill_group(proc)  # leftovers (MCP servers, hooks) of a finished client
    return Proc(
        list(argv),
        code,
        out_path.read_text("utf-8", "replace"),
        err_path.read_text("utf-8", "replace"),
        time.monotonic() - t0,
        timed_out,
    )


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL, the client's process group (the loop's own helper)."""
    kill_group(proc, grace_s=2.0)


def parse_jsonl(text: str) -> tuple[list[dict], list[str]]:
    """(JSON objects, other lines) of a JSON-lines stream."""
    events, noise = [], []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            noise.append(line)
            continue
        if isinstance(obj, dict):
            events.append(obj)
        else:
            noise.append(line)
    return events, noise


# --------------------------------------------------------------------------
# the result


@dataclass
class ClientRun:
    """What a client run did.  ``events`` are the parsed JSONL lines of
    ``--output-format stream-json`` (claude) or ``--json`` (codex)."""

    client: str  # "claude" | "codex"
    argv: list[str]
    exit_code: int | None
    events: list[dict]
    stderr: str
    stdout: str
    fake: FakeAnthropic | FakeOpenAI
    workdir: Path
    run_dir: Path
    duration: float
    timed_out: bool
    noise: list[str] = field(default_factory=list)  # non-JSON stdout lines

    # -- the fake server's side -------------------------------------------
    @property
    def requests(self):
        """Every HTTP request the fake server got (``_serve.Recorded``)."""
        return list(self.fake.requests)

    @property
    def model_requests(self) -> list[MessagesRequest] | list[ResponsesRequest]:
        """The model calls, as request views (MessagesRequest / ResponsesRequest)."""
        if isinstance(self.fake, FakeAnthropic):
            return self.fake.message_requests()
        return self.fake.response_requests()

    @property
    def last_request(self):
        reqs = self.model_requests
        return reqs[-1] if reqs else None

    def tool_results(self) -> list:
        """Tool results the client sent back to the model (oldest first), from
        the last model request: ``fake_anthropic.ToolResult`` (tool_use_id,
        is_error, text) for claude, ``fake_openai.ToolOutput`` (call_id,
        type, text; codex has no error flag) for codex.  Empty if the model was never called
        back after a tool call."""
        last = self.last_request
        if last is None:
            return []
        return last.tool_results() if isinstance(last, MessagesRequest) else last.tool_outputs()

    def tool_result(self, call_id: str):
        """The result for one tool call id (``toolu_lw_<turn>_<block>`` /
        ``call_lw_<turn>_<item>`` unless the script set its own)."""
        return next((r for r in self.tool_results() if getattr(r, "tool_use_id", None) == call_id
                     or getattr(r, "call_id", None) == call_id), None)

    # -- the client's side --------------------------------------------------
    def of_type(self, type_: str, subtype: str | None = None) -> list[dict]:
        return [e for e in self.events if e.get("type") == type_ and (subtype is None or e.get("subtype") == subtype)]

    @property
    def result(self) -> dict | None:
        """claude: the final ``{"type":"result"}`` event; codex: the last
        ``turn.completed`` / ``turn.failed`` event."""
        kinds = ("result",) if self.client == "claude" else ("turn.completed", "turn.failed")
        found = [e for e in self.events if e.get("type") in kinds]
        return found[-1] if found else None

    def hook_events(self, event: str | None = None) -> list[dict]:
        """claude (``--include-hook-events``): the ``hook_response`` system
        events, optionally only those of one hook event (``PreToolUse``...)."""
        return [e for e in self.of_type("system", "hook_response") if event is None or e.get("hook_event") == event]

    def items(self, type_: str | None = None) -> list[dict]:
        """codex: the ``item.completed`` items (agent_message, file_change,
        mcp_tool_call, error, ...)."""
        return [
            e["item"] for e in self.events
            if e.get("type") == "item.completed" and isinstance(e.get("item"), dict)
            and (type_ is None or e["item"].get("type") == type_)
        ]

    @property
    def final_text(self) -> str | None:
        """The agent's last words (claude ``result.result``; codex last agent_message)."""
        if self.client == "claude":
            r = self.result
            return r.get("result") if r else None
        msgs = self.items("agent_message")
        return msgs[-1].get("text") if msgs else None

    # -- diagnostics --------------------------------------------------------
    def diagnostics(self, tail: int = 25) -> str:
        lines = [
            f"{self.client}: exit={self.exit_code} timed_out={self.timed_out} duration={self.duration:.1f}s",
            f"argv: {shlex.join(self.argv)}",
            f"run_dir: {self.run_dir}  workdir: {self.workdir}",
            f"fake: {len(self.requests)} requests, turns served {self.fake.turns_served} of {len(self.fake.script)} scripted",
        ]
        if self.fake.errors:
            lines.append("fake server errors:\n" + "\n".join(self.fake.errors))
        lines.append("stderr (tail):\n" + "\n".join(self.stderr.splitlines()[-tail:]))
        lines.append("events (tail):")
        lines.extend(json.dumps(e)[:400] for e in self.events[-tail:])
        if self.noise:
            lines.append("non-JSON stdout (tail):\n" + "\n".join(self.noise[-tail:]))
        return "\n".join(lines)

    def check(self, *, exit_code: int | None = 0, allow_exhausted: bool = False) -> "ClientRun":
        """Assert the run ended normally (and by default that the script was
        not overrun); return self so calls chain."""
        problems = []
        if self.timed_out:
            problems.append("timed out")
        elif exit_code is not None and self.exit_code != exit_code:
            problems.append(f"exit code {self.exit_code} != {exit_code}")
        if self.fake.errors:
            problems.append("a script callback raised (fake server errors below)")
        if not allow_exhausted and self.fake.exhausted:
            problems.append("the client asked for more turns than scripted")
        if problems:
            raise AssertionError("; ".join(problems) + "\n" + self.diagnostics())
        return self

    def __repr__(self) -> str:
        return f"<ClientRun {self.client} exit={self.exit_code} events={len(self.events)} requests={len(self.requests)}>"


# --------------------------------------------------------------------------
# Claude Code


def write_claude_mcp_config(path: Path, mcp_servers: dict[str, dict]) -> Path:
    servers = {}
    for name, spec in mcp_servers.items():
        s = {"type": "stdio", **{k: v for k, v in spec.items() if k in ("command", "args", "env", "type", "url", "headers")}}
        if "cwd" in spec:  # claude has no cwd field: run through `sh -c 'cd … && exec …'`
            s["command"] = "/bin/sh"
            s["args"] = ["-c", f"cd {shlex.quote(spec['cwd'])} && exec " + shlex.join([spec["command"], *spec.get("args", [])])]
        servers[name] = s
    path.write_text(json.dumps({"mcpServers": servers}, indent=2))
    return path


def run_claude(
    workdir: str | os.PathLike,
    script: list | None = None,
    *,
    prompt: str = "go",
    mcp_servers: dict[str, dict] | None = None,
    hooks: dict[str, list] | None = None,
    settings: dict | None = None,
    plugin_dir: str | os.PathLike | Iterable[str | os.PathLike] | None = None,
    setting_sources: str | None = "user",
    strict_mcp_config: bool = True,
    permission_mode: str = "bypassPermissions",
    max_turns: int | None = 20,
    extra_args: Sequence[str] = (),
    extra_env: dict[str, str] | None = None,
    timeout: float = 120,
    run_dir: str | os.PathLike | None = None,
    fake: FakeAnthropic | None = None,
    include_hook_events: bool = True,
) -> ClientRun:
    """Run ``claude -p PROMPT --output-format stream-json --verbose`` in
    ``workdir`` against a :class:`FakeAnthropic` playing ``script``.

    - ``mcp_servers``: ``{name: mcp_stdio(...)}`` → ``--mcp-config F``
      (+ ``--strict-mcp-config`` unless ``strict_mcp_config=False``); tools
      are then ``mcp__<name>__<tool>``.
    - ``hooks`` / ``settings``: written to a file and passed with
      ``--settings F`` (``hooks`` goes into ``settings["hooks"]``).
    - ``setting_sources``: ``--setting-sources`` value; "user" (default) means
      nothing from ``workdir/.claude`` is loaded; None omits the flag so the
      project's own ``.claude/settings.json`` applies.
    - ``plugin_dir``: one or more ``--plugin-dir`` folders; plugin MCP tools
      are ``mcp__plugin_<plugin>_<server>__<tool>``.
    - ``fake``: a pre-built (not started) FakeAnthropic instead of ``script``.
    """
    exe = require_binary("claude")
    workdir = Path(workdir).resolve()
    rdir = _new_run_dir(workdir, "claude", run_dir)
    fake = fake if fake is not None else FakeAnthropic(script or [])
    argv = [exe, "-p", prompt, "--output-format", "stream-json", "--verbose", "--permission-mode", permission_mode]
    if include_hook_events:
        argv.append("--include-hook-events")
    if max_turns is not None:
        argv += ["--max-turns", str(max_turns)]
    if mcp_servers is not None:
        argv += ["--mcp-config", str(write_claude_mcp_config(rdir / "mcp.json", mcp_servers))]
        if strict_mcp_config:
            argv.append("--strict-mcp-config")
    all_settings = dict(settings or {})
    if hooks:
        all_settings["hooks"] = {**all_settings.get("hooks", {}), **hooks}
    if setting_sources is not None:
        argv += ["--setting-sources", setting_sources]
    if all_settings:
        spath = rdir / "settings.json"
        spath.write_text(json.dumps(all_settings, indent=2))
        argv += ["--settings", str(spath)]
    if plugin_dir is not None:
        dirs = [plugin_dir] if isinstance(plugin_dir, (str, os.PathLike)) else list(plugin_dir)
        for d in dirs:
            argv += ["--plugin-dir", str(Path(d).resolve())]
    argv += list(extra_args)
    with fake:
        env = claude_env(rdir, fake.url, extra_env)
        proc = run_process(argv, cwd=workdir, env=env, timeout=timeout, log_prefix=rdir / "claude")
    events, noise = parse_jsonl(proc.stdout)
    return ClientRun("claude", proc.argv, proc.exit_code, events, proc.stderr, proc.stdout, fake, workdir, rdir,
                     proc.duration, proc.timed_out, noise)


def claude_cli(
    args: Sequence[str], *, run_dir: str | os.PathLike, cwd: str | os.PathLike | None = None,
    extra_env: dict[str, str] | None = None, timeout: float = 60,
) -> Proc:
    """Run another ``claude`` subcommand (``mcp add``, ``mcp list``,
    ``plugin validate`` ...) with the same isolated config dir as
    ``run_claude(run_dir=...)`` would use.

    A FakeAnthropic with an empty script stands in for the API: without a
    local ANTHROPIC_BASE_URL, ``claude mcp list`` spends ~18 s trying to
    resolve api.anthropic.com before it checks anything."""
    exe = require_binary("claude")
    rdir = Path(run_dir).resolve()
    rdir.mkdir(parents=True, exist_ok=True)
    with FakeAnthropic([]) as fake:
        return run_process([exe, *args], cwd=Path(cwd or rdir), env=claude_env(rdir, fake.url, extra_env),
                           timeout=timeout, log_prefix=rdir / f"claude-{args[0] if args else 'cli'}")


# --------------------------------------------------------------------------
# Codex


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def codex_config(
    base_url: str, *, model: str = "gpt-5.5", mcp_servers: dict[str, dict] | None = None,
    hooks: dict[str, list] | None = None, config: dict | None = None,
) -> dict:
    """The config.toml contents (as a dict) for an offline codex run."""
    cfg: dict[str, Any] = {
        "model": model,
        "model_provider": "fake",
        "check_for_update_on_startup": False,
        "analytics": {"enabled": False},
        "model_providers": {
            "fake": {
                "name": "fake",
                "base_url": base_url.rstrip("/") + "/v1",
                "wire_api": "responses",
                "env_key": "FAKE_OPENAI_KEY",
                "request_max_retries": 0,
                "stream_max_retries": 0,
            }
        },
    }
    if mcp_servers:
        cfg["mcp_servers"] = {
            # required=true makes codex wait for the server before the first
            # model call; otherwise an early call fails "unsupported call".
            name: {"startup_timeout_sec": 30, "tool_timeout_sec": 900, "required": True, **spec}
            for name, spec in mcp_servers.items()
        }
    if hooks:
        cfg["hooks"] = hooks
    return _deep_merge(cfg, config or {})


def run_codex(
    workdir: str | os.PathLike,
    script: list | None = None,
    *,
    prompt: str = "go",
    mcp_servers: dict[str, dict] | None = None,
    hooks: dict[str, list] | None = None,
    config: dict | None = None,
    model: str = "gpt-5.5",
    sandbox: str | None = None,
    trust_project: bool = False,
    extra_args: Sequence[str] = (),
    extra_env: dict[str, str] | None = None,
    timeout: float = 120,
    run_dir: str | os.PathLike | None = None,
    fake: FakeOpenAI | None = None,
) -> ClientRun:
    """Run ``codex exec --json PROMPT`` in ``workdir`` against a
    :class:`FakeOpenAI` playing ``script``, with a generated
    ``$CODEX_HOME/config.toml``.

    - ``mcp_servers``: ``{name: mcp_stdio(...)}`` → ``[mcp_servers.<name>]``
      (``required = true`` by default); call them with
      ``fake_openai.McpCall(name, tool, args)``.
    - ``hooks``: same shape as Claude's (``{"PreToolUse": [command_hook(...)]}``)
      → ``[[hooks.PreToolUse]]``; hook trust is bypassed for the run.
    - ``config``: extra config.toml keys, deep-merged last.
    - ``trust_project``: mark ``workdir`` trusted, so that its own
      ``.codex/config.toml`` and ``.codex/hooks.json`` load (codex ignores
      them silently in an untrusted project).
    - ``sandbox``: None → ``--dangerously-bypass-approvals-and-sandbox``;
      else ``-s <mode>`` with ``approval_policy="never"``.
    """
    import tomli_w

    exe = require_binary("codex")
    workdir = Path(workdir).resolve()
    rdir = _new_run_dir(workdir, "codex", run_dir)
    fake = fake if fake is not None else FakeOpenAI(script or [])
    argv = [exe, "exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-hook-trust",
            "--disable", "plugins", "--disable", "shell_snapshot", "-c", "analytics.enabled=false", "-C", str(workdir)]
    if sandbox is None:
        argv.append("--dangerously-bypass-approvals-and-sandbox")
    else:
        argv += ["-s", sandbox, "-c", 'approval_policy="never"']
    argv += list(extra_args)
    argv.append(prompt)
    with fake:
        env = codex_env(rdir, extra_env)
        trust = {"projects": {str(workdir): {"trust_level": "trusted"}}} if trust_project else {}
        cfg = codex_config(fake.url, model=model, mcp_servers=mcp_servers, hooks=hooks,
                           config=_deep_merge(trust, config or {}))
        (Path(env["CODEX_HOME"]) / "config.toml").write_text(tomli_w.dumps(cfg))
        proc = run_process(argv, cwd=workdir, env=env, timeout=timeout, log_prefix=rdir / "codex")
    events, noise = parse_jsonl(proc.stdout)
    return ClientRun("codex", proc.argv, proc.exit_code, events, proc.stderr, proc.stdout, fake, workdir, rdir,
                     proc.duration, proc.timed_out, noise)


# --------------------------------------------------------------------------
# MCP Inspector CLI


def inspector_binary() -> str:
    """``mcp-inspector`` (the package's own bin), else ``mcp-inspector-cli``.
    Both are the 0.15 launcher and need ``--cli`` for CLI mode."""
    for name in ("mcp-inspector", "mcp-inspector-cli"):
        path = find_binary(name)
        if path:
            return path
    return require_binary("mcp-inspector")


def run_inspector(
    server_argv: Sequence[str], *, method: str = "tools/list", tool_name: str | None = None,
    tool_args: dict | None = None, env: dict[str, str] | None = None, timeout: float = 60,
    run_dir: str | os.PathLike | None = None,
) -> tuple[Any, Proc]:
    """``mcp-inspector --cli SERVER... -- --method M`` against a stdio
    server; returns (parsed JSON output or None, the process).

    ``tool_args`` become ``--tool-arg k=v`` pairs (Inspector 0.15 sends every
    value as a string; pydantic-typed MCP tools coerce them)."""
    exe = inspector_binary()
    rdir = Path(run_dir or tempfile.mkdtemp(prefix="lw-inspector-")).resolve()
    rdir.mkdir(parents=True, exist_ok=True)
    argv = [exe, "--cli", *map(str, server_argv), "--", "--method", method]
    if tool_name:
        argv += ["--tool-name", tool_name]
    if tool_args:
        argv += ["--tool-arg", *(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in tool_args.items())]
    proc = run_process(argv, cwd=rdir, env=isolated_env(rdir, env), timeout=timeout, log_prefix=rdir / "inspector")
    try:
        parsed = json.loads(proc.stdout)
    except ValueError:
        parsed = None
    return parsed, proc
