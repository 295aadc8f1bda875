"""`loopwright doctor` and `loopwright codex-config`: is everything wired, and how to wire Codex.

Each check returns (ok, what, fix). Nothing here changes the workspace.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

MARK_BEGIN = "# >>> loopwright (managed by `loopwright codex-config --write`) >>>"
MARK_END = "# <<< loopwright <<<"


@dataclass
class Check:
    ok: bool
    what: str
    fix: str = ""    # shown when the check fails
    hint: str = ""   # shown either way (optional extras)


def _workspace_checks(start: Optional[str]) -> tuple[list[Check], Optional[Path]]:
    from mcp_server.loop import gitops, integrity
    from mcp_server.loop.config import ConfigError
    from mcp_server.loop.engine import Engine
    from mcp_server.loop.workspace import Workspace, WorkspaceError

    out: list[Check] = []
    try:
        ws = Workspace.find(start)
    except (WorkspaceError, ConfigError) as e:
        return [Check(False, f"workspace: {e}", "run `loopwright init DIR` (or pass --workspace DIR)")], None
    try:
        ws.settings()   # the settings file too: a hand edit can break it
    except ConfigError as e:
        return [Check(False, f"settings: {e}", _fix_for(e))], ws.root
    out.append(Check(True, f"workspace {ws.root} (config valid)"))
    from mcp_server.loop.sandbox import PUBLIC_CORPUS_NOTE, corpus_is_public

    corpus = ws.cfg.benchmark.corpus
    t = ws.cfg.target
    if t is not None:
        out.append(Check(True, f"target {t.name}: {t.direction} {t.metric} (noise {t.noise}); hidden files in the "
                               "state directory only", hint="`loopwright target check` runs the baseline through "
                               "the gate, the run and the evaluator, and probes the hidden files from the sandbox"))
    else:
        out.append(Check(True, f"corpus {corpus}" + (": held-out text readable on this machine" if corpus_is_public(corpus)
                                                     else ": held-out text out of train.py's reach"),
                         hint=PUBLIC_CORPUS_NOTE if corpus_is_public(corpus) else ""))
    try:
        eng = Engine(ws.root)
    except Exception as e:  # noqa: BLE001
        return out + [Check(False, f"ledger: {e}", "restore .loopwright/state.db from a backup or re-init")], ws.root
    try:
        c = eng.campaign
        out.append(Check(True, f"campaign '{c['tag']}' on branch {c['branch']}"))
        mism = integrity.check(ws, c["pinned_commit"])
        out.append(Check(not mism, "frozen files and data match the pinned commit" if not mism else
                         f"integrity: {integrity.describe(mism)}",
                         "the next run_experiment restores them from the pinned commit (and records tamper)"))
        if gitops.is_dirty(ws.root):
            out.append(Check(True, "train.py has uncommitted edits (normal while an agent works)"))
        b = eng.budget()
        out.append(Check(not b.should_stop, "budget remains" if not b.should_stop else
                         f"budget spent: {'; '.join(b.reasons)}",
                         "raise a limit with `loopwright config set budget.<key> VALUE` (budgets live in the state "
                         "directory's settings.toml; edits of loopwright.toml are ignored) or `loopwright stop --clear`"))
    except Exception as e:  # noqa: BLE001
        out.append(Check(False, str(e), _fix_for(e)))
    finally:
        eng.close()
    return out, ws.root


def _a_frozen_file(root: Path) -> str:
    """A frozen file the guard must protect: prepare.py in a GPT workspace, a target's evaluator otherwise."""
    if (root / "prepare.py").is_file():
        return "prepare.py"
    try:
        from mcp_server.loop.config import load_config
        from mcp_server.loop.targets import argv

        t = load_config(root).target
        words = argv(t.evaluate) if t is not None else []
        return next((w for w in words[1:] if (root / w).is_file()), "loopwright.toml")
    except Exception:  # noqa: BLE001 - an unreadable config is reported by the workspace check
        return "loopwright.toml"


def _fix_for(e: Exception) -> str:
    """What to do about an error raised while opening the campaign."""
    from mcp_server.loop.settings import SettingsError

    if isinstance(e, SettingsError):
        return ("the loop's settings file is broken: fix the file named above by hand in an editor, or run "
                "`loopwright config edit` (it opens the broken file and saves it once valid); "
                "`loopwright config path` prints where it is")
    if "branch" in str(e) or "checkout" in str(e):
        return "check out the campaign branch: git checkout loopwright/<tag>"
    return "run `loopwright status` to see the error in context; `loopwright doctor` again once it is fixed"


def _hook_checks(root: Optional[Path], state_dir: Optional[Path] = None) -> list[Check]:
    from mcp_server.agents import clients

    out: list[Check] = []
    if root is None:
        return out
    # one wiring per client (plugin or workspace files, never both), and the clients' sandboxes
    out += [Check(f.ok, f.what, f.fix) for f in clients.check_wiring(root, state_dir)]
    # the guard must answer, and fast: it runs on every tool call
    frozen = _a_frozen_file(root)
    payload = json.dumps({"hook_event_name": "PreToolUse", "tool_name": "Write", "cwd": "/",
                          "tool_input": {"file_path": str(root / frozen), "content": "x"}})
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mcp_server.guard", "pre-tool-use"], input=payload,
                          capture_output=True, text=True, timeout=30, cwd=str(root))
    ms = (time.monotonic() - t0) * 1000
    denied = proc.returncode == 2 or '"deny"' in proc.stdout
    out.append(Check(denied, f"guard denies a write to {frozen} ({ms:.0f} ms)",
                     "the guard is broken: run `python -m mcp_server.guard pre-tool-use` by hand to see why"))
    last = clients.last_hook_heartbeat(root)
    if last is None:
        out.append(Check(True, "no client session has run the hooks here yet",
                         hint="if a session ran and this still says so, its hooks never fired: in Codex trust them "
                              "with /hooks (untrusted hooks silently do not run)"))
    else:
        out.append(Check(True, f"hooks last ran {time.strftime('%Y-%m-%d %H:%M', time.localtime(last))}"))
    return out


def _server_check(root: Optional[Path]) -> list[Check]:
    if root is None:
        return []
    import asyncio
    import tempfile

    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    # the server gets this process's environment (LOOPWRIGHT_HOME, XDG_DATA_HOME: where the state lives), as a
    # client started from this shell would; the SDK's default passes only HOME, PATH and a few more
    params = StdioServerParameters(command=sys.executable, env=dict(os.environ),
                                   args=["-m", "mcp_server.cli", "serve", "--workspace", str(root)])

    async def probe(errlog) -> list[str]:
        async with Client(stdio_client(params, errlog=errlog)) as c:
            return [t.name for t in (await c.list_tools()).tools]

    with tempfile.TemporaryFile("w+", encoding="utf-8") as errlog:
        try:
            tools = asyncio.run(asyncio.wait_for(probe(errlog), 60))
        except Exception as e:  # noqa: BLE001
            return [Check(False, f"MCP server did not start: {e}", "run `loopwright serve` by hand to see the error")]
        errlog.seek(0)
        err = errlog.read()
    # a server that cannot open the workspace still starts (so an agent can read why) and says so on stderr
    broken = next((line.split("loopwright: ", 1)[1] for line in err.splitlines()
                   if "loopwright: " in line and "serving anyway" in line), None)
    if broken:
        return [Check(False, f"MCP server starts but cannot open the workspace: {broken}",
                      "fix what it says (every tool call would fail with it), then `loopwright doctor` again")]
    return [Check("run_experiment" in tools, f"MCP server answers over stdio ({len(tools)} tools)")]


def _client_checks() -> list[Check]:
    out = []
    for name, hint in (("claude", "npm install -g @anthropic-ai/claude-code"), ("codex", "npm install -g @openai/codex")):
        path = shutil.which(name)
        if not path:
            out.append(Check(True, f"{name} CLI not found (optional)", hint=hint))
            continue
        out.append(Check(True, f"{name} CLI: {_version(path) or '?'} ({path})"))
    try:
        import torch

        dev = "cuda" if torch.cuda.is_available() else ("mps" if torch.backends.mps.is_available() else "cpu")
        out.append(Check(True, f"torch {torch.__version__}, device {dev}"))
    except ImportError:
        out.append(Check(False, "torch is not installed", "pip install torch==2.13.0 (CPU) or the build for your GPU"))
    return out


def _sandbox_checks() -> list[Check]:
    """Which OS sandbox train.py and the evaluator run in (or that none can be made)."""
    from mcp_server.loop import sandbox

    ok, line = sandbox.mode_line()
    return [Check(ok, line, "" if ok else sandbox.INSTALL_HINT)]


def _unattended_checks(root: Optional[Path]) -> list[Check]:
    """Connectors and schedules: configured ones must have their secrets in the environment (cron and the
    webhook server inherit it), and each schedule says when it fires next."""
    if root is None:
        return []
    from mcp_server.loop.workspace import Workspace
    from mcp_server.notify.outbox import build_sinks

    out: list[Check] = []
    try:
        ws = Workspace.open(root)
        cfg = ws.cfg
    except Exception:  # noqa: BLE001 - reported by the workspace checks
        return out
    with ws.ledger() as ledger:
        sinks, notes = build_sinks(cfg, ledger)
        pending = sum(1 for d in ledger.deliveries() if d["status"] == "pending")
        failed = [d for d in ledger.deliveries() if d["status"] == "failed"]
    for sink in sinks:
        out.append(Check(True, f"{sink.name}: configured, credentials in the environment"))
    for note in notes:
        out.append(Check(False, note, "export the variable where loopwright runs (shell profile, crontab, "
                                      "systemd Environment=), then `loopwright notify`"))
    if sinks or notes:
        out.append(Check(not failed, f"outbox: {pending} pending, {len(failed)} given up"
                         + (f" (last error: {failed[-1]['last_error']})" if failed else ""),
                         "fix the error, then `loopwright notify` (given-up rows are listed there)"))
    for sched in cfg.schedule:
        try:
            from datetime import datetime
            from zoneinfo import ZoneInfo

            from croniter import croniter

            nxt = croniter(sched.cron, datetime.now(ZoneInfo(sched.timezone))).get_next(datetime)
            out.append(Check(True, f"schedule '{sched.cron}' ({sched.timezone}): {sched.agent} session, next at "
                                   f"{nxt:%Y-%m-%d %H:%M %Z}",
                             hint="runs only while `loopwright cron` runs (`loopwright cron --install` installs a "
                                  "crontab entry; `loopwright doctor --as-cron` checks it under cron's environment)"))
        except Exception as e:  # noqa: BLE001
            out.append(Check(False, f"schedule '{sched.cron}': {e}", "`loopwright config edit` to fix it"))
    return out


def _state_dir(root: Optional[Path]) -> Optional[Path]:
    if root is None:
        return None
    try:
        from mcp_server.loop.workspace import Workspace

        return Workspace.open(root).state_dir
    except Exception:  # noqa: BLE001 - the workspace checks above already said what is wrong
        return None


def cron_checks(root: Path) -> list[Check]:
    """The installed crontab entry of this workspace, run as cron would run it (env -i with cron's
    defaults and the crontab's NAME=value lines) with `cron --check` in place of `cron --once`."""
    from mcp_server.triggers import crontab

    try:
        text = crontab.read()
    except crontab.CrontabError as e:
        return [Check(False, f"crontab: {e}", "install cron, or use the systemd timer of `loopwright cron --print`")]
    line = crontab.entry(text, root)
    if line is None:
        return [Check(False, f"no loopwright crontab entry for {root}", "run `loopwright cron --install` from the "
                      "shell whose PATH finds the client")]
    command = crontab.command_of(line)
    if " cron --once" not in command:
        return [Check(False, f"the crontab entry for {root} does not run `cron --once`: {line}",
                      "run `loopwright cron --install` again")]
    check_cmd = command.replace(" cron --once", " cron --check", 1).split(" >> ", 1)[0]
    env = crontab.cron_environment(text)
    try:
        r = subprocess.run(["/bin/sh", "-c", check_cmd], env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return [Check(False, "the cron entry's check did not finish in 120 s", "run it by hand to see why")]
    out = (r.stdout + r.stderr).strip()
    if r.returncode == 0:
        return [Check(True, f"crontab entry for {root} works under cron's environment ({out.splitlines()[-1]})")]
    problems = [ln[2:] for ln in out.splitlines() if ln.startswith("✘ ")] or [out[-600:] or f"exit {r.returncode}"]
    return [Check(False, f"under cron's environment: {p}",
                  "fix it for the job (`loopwright cron --install` again from a shell that finds the client; "
                  "tokens go into the environment cron gives the job, never written by loopwright)")
            for p in problems]


def run_cron_doctor(workspace: Optional[str]) -> int:
    from mcp_server.loop.workspace import Workspace, WorkspaceError

    try:
        root = Workspace.find(workspace).root
    except WorkspaceError as e:
        print(f"✘ workspace: {e}\n    fix: pass --workspace DIR")
        return 1
    return _print_checks(cron_checks(root))


def _version(path: str) -> Optional[str]:
    """What `path --version` prints; None when it does not run."""
    try:
        return subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _git_check() -> list[Check]:
    path = shutil.which("git")
    if path is None:
        return [Check(False, "git is not on PATH (every workspace is a git repository)",
                      "install git (Debian/Ubuntu: sudo apt-get install git; macOS: xcode-select --install)")]
    version = _version(path)
    if version is None:
        return [Check(False, f"git at {path} does not run", "reinstall git")]
    return [Check(True, f"{version} ({path})")]


def run_doctor(workspace: Optional[str], skip_server: bool = False) -> int:
    checks = _git_check()
    more, root = _workspace_checks(workspace)
    checks += more
    checks += _hook_checks(root, _state_dir(root))
    from mcp_server.agents.plugin import plugin_checks

    # does the installed plugin's MCP server start from this PATH? ("Failed to connect" otherwise)
    checks += [Check(f.ok, f.what, f.fix, f.hint) for f in plugin_checks()]
    checks += _unattended_checks(root)
    checks += _sandbox_checks()
    if not skip_server:
        checks += _server_check(root)
    checks += _client_checks()
    return _print_checks(checks)


def _print_checks(checks: list[Check]) -> int:
    bad = 0
    for c in checks:
        print(f"{'✔' if c.ok else '✘'} {c.what}")
        if not c.ok:
            bad += 1
            if c.fix:
                print(f"    fix: {c.fix}")
        if c.hint:
            print(f"    hint: {c.hint}")
    print("all good" if not bad else f"{bad} problem(s) to fix")
    return 0 if not bad else 1


def codex_block(root: Path) -> str:
    """The managed block for a user-level $CODEX_HOME/config.toml: the server and hooks (the workspace's own
    .codex/config.toml sets the sandbox; a user-level sandbox_mode would apply to every project)."""
    from mcp_server.agents.clients import codex_config_toml

    return f"{MARK_BEGIN}\n{codex_config_toml(sys.executable, root, 'workspace', with_sandbox=False)}{MARK_END}\n"


def write_codex_config(root: Path, config_path: Path) -> str:
    """Add (or replace) loopwright's managed block in a Codex config.toml; the rest is left untouched."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    block = codex_block(root)
    text = config_path.read_text() if config_path.is_file() else ""
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise RuntimeError(f"{config_path} is not valid TOML ({e}); fix it first (Codex cannot read it either), "
                           "or pass --config PATH to write another file") from None
    if MARK_BEGIN in text and MARK_END in text:
        head, rest = text.split(MARK_BEGIN, 1)
        text = head + block + rest.split(MARK_END, 1)[1].lstrip("\n")
    else:
        if "[mcp_servers.loopwright]" in text:
            raise RuntimeError(f"{config_path} already defines [mcp_servers.loopwright] outside loopwright's managed "
                               "block; remove it first, or copy the block printed by `loopwright codex-config`")
        text = (text.rstrip("\n") + "\n\n" if text.strip() else "") + block
    tomllib.loads(text)  # never write a config Codex cannot read
    config_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = config_path.with_suffix(".toml.tmp")
    tmp.write_text(text)
    os.replace(tmp, config_path)
    return str(config_path)
