"""One home for how loopwright is wired into the clients (Claude Code, Codex).

Everything a client reads about loopwright is generated here: the plugin's hooks
(hooks/hooks.json), a workspace's `.mcp.json`, `.claude/settings.json` and
`.codex/config.toml`, the managed block of a user-level Codex config, and the
launcher's `-c` overrides. So the matcher, the hook events and the server entry
cannot drift apart between the wirings.

One wiring per client (issue 15): with the plugin installed, a workspace gets no
copies of the server or the hooks (else every hook runs twice and Claude Code
shows two servers); without it, the workspace carries them. `loopwright init
--wiring plugin|workspace|auto` chooses (auto: plugin where it is installed); the files are
then frozen in the pinned commit, so the choice is made once, at init.
Either way the workspace's configs turn the client's own sandbox on (issue 10):
Claude Code's `sandbox` (bubblewrap on Linux) with writes limited to the editable
files and a scratch dir and the loop's state dir unreadable; Codex's permission
profile `loopwright` (bubblewrap + seccomp on Linux) with the same reach (issue 23:
its older `workspace-write` mode reads everything and writes the system temp dir).
The guard hooks stay the friendly first layer; the sandbox is the boundary.
"""
from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from mcp_server.common.facts import HOOK_MATCHER, MCP_SERVER

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

WIRINGS = ("auto", "plugin", "workspace")
CLIENTS = ("claude", "codex")
PLUGIN = "loopwright"
PLUGIN_GUARD = '"${CLAUDE_PLUGIN_ROOT}/hooks/guard"'
SESSION_START_MATCHER = "startup|resume|compact"
# Workspace files the agent's shell must not write (the guard says why; the sandbox enforces it). Not
# .claude: Claude Code's sandbox protects its own settings and mounts inside .claude (a read-only .claude
# makes every sandboxed command fail).
FROZEN_WORKSPACE_FILES = ("prepare.py", "evaluate.py", "pt2audit.py", "program.md", "loopwright.toml", "loopwright.lock",
                          ".git",
                          ".codex", ".mcp.json", "AGENTS.md", "CLAUDE.md", ".gitignore",
                          ".loopwright/workspace-id", ".loopwright/data")


def scratch_dir(state_dir: Optional[Path]) -> Path:
    """The agent's scratch space: outside the workspace (whose other files the guard keeps untouched) and
    outside the state dir, one per workspace."""
    import tempfile

    return Path(tempfile.gettempdir()) / f"loopwright-scratch-{state_dir.name if state_dir else 'workspace'}"
WIRING_FILE = ".loopwright/wiring.json"    # what init chose, for doctor


# -- the pieces every wiring shares ---------------------------------------------------------------
def guard_command(python: str) -> str:
    return f"{shlex.quote(python)} -m mcp_server.guard"


def serve_argv(python: str, root: Path) -> list[str]:
    return [python, "-m", "mcp_server.cli", "serve", "--workspace", str(root)]


def hook_groups(guard: str, *, pre_timeout: int = 15, stop_timeout: int = 30, start_timeout: int = 30,
                on_failure_block: bool = False) -> dict[str, list[dict]]:
    """The three hook events, in Claude Code's (and Codex's) JSON shape. `guard` is the command prefix."""
    def hook(event: str, timeout: int, block: bool = False) -> list[dict]:
        h: dict[str, Any] = {"type": "command", "command": f"{guard} {event}", "timeout": timeout}
        if block:
            h["onFailure"] = "block"   # a crashed or slow guard must not let a write through
        return [h]

    return {
        "PreToolUse": [{"matcher": HOOK_MATCHER, "hooks": hook("pre-tool-use", pre_timeout, on_failure_block)}],
        "Stop": [{"hooks": hook("stop", stop_timeout)}],
        "SessionStart": [{"matcher": SESSION_START_MATCHER, "hooks": hook("session-start", start_timeout)}],
    }


def plugin_hooks_json() -> dict:
    """hooks/hooks.json of the plugin (both clients read it); a test keeps the file equal to this."""
    return {"description": "loopwright guard: keeps the agent off the frozen verifier, the loop's state and git; "
                           "keeps the loop running while budget remains; briefs each session.",
            "hooks": hook_groups(PLUGIN_GUARD, pre_timeout=10, on_failure_block=True)}


def mcp_json(python: str, root: Path, url: Optional[str] = None) -> dict:
    """`url`: a server already running (as the loop's user, `loopwright serve --http`), not one to start."""
    if url:
        return {"mcpServers": {MCP_SERVER: {"type": "http", "url": url}}}
    serve = serve_argv(python, root)
    return {"mcpServers": {MCP_SERVER: {"command": serve[0], "args": serve[1:]}}}


# -- the clients' own sandboxes ---------------------------------------------------------------------
def claude_sandbox(root: Path, state_dir: Optional[Path], editable: Iterable[str] = ("train.py",),
                   private: Iterable[str] = ()) -> dict:
    """Claude Code's sandbox for the agent's Bash commands: on, no fallback to running unsandboxed, writes
    only to the editable files and the scratch dir (the rest of the workspace is denied), and the loop's
    state dir neither writable nor readable, nor the `private` paths (a corpus on disk)."""
    root = Path(root)
    deny_write = [str(root / p) for p in FROZEN_WORKSPACE_FILES]
    deny_read = []
    if state_dir is not None:
        deny_write.insert(0, str(state_dir))
        # its own state, and every other workspace's (the same corpus gives the same val/test text)
        deny_read += [str(state_dir), str(Path(state_dir).parent)]
    deny_read += [str(p) for p in private]
    scratch_dir(state_dir).mkdir(mode=0o700, exist_ok=True)
    return {"enabled": True, "failIfUnavailable": True, "allowUnsandboxedCommands": False,
            "filesystem": {"allowWrite": [str(root / p) for p in editable] + [str(scratch_dir(state_dir))],
                           "denyWrite": deny_write, "denyRead": deny_read}}


def claude_settings(python: str, root: Path, state_dir: Optional[Path], wiring: str,
                    editable: Iterable[str] = ("train.py",), private: Iterable[str] = ()) -> dict:
    """.claude/settings.json: the sandbox always; the hooks only when the workspace is wired itself."""
    out: dict[str, Any] = {}
    if wiring == "workspace":
        out["hooks"] = hook_groups(guard_command(python))
    out["sandbox"] = claude_sandbox(root, state_dir, editable, private)
    out["permissions"] = claude_read_denies(private)
    return out


def claude_read_denies(private: Iterable[str]) -> dict:
    """The same `private` paths for Claude Code's own file tools (Read, Grep, Glob), which its sandbox does not
    cover: `Read(//abs/path)` deny rules (`//` anchors at the filesystem root; a path names its subtree)."""
    return {"deny": [f"Read(/{Path(p)})" for p in private]}


SERVER_ENV_VARS = ("LOOPWRIGHT_HOME", "XDG_DATA_HOME", "LOOPWRIGHT_SESSION_ID", "LOOPWRIGHT_SESSION_LEVEL")
CODEX_PROFILE = "loopwright"
# Read-only inside Codex's writable workspace: the frozen files, and all of .loopwright (the id and the train
# view; a missing parent of a listed path would break every sandboxed command, .loopwright always exists).
CODEX_READ_ONLY = tuple(p for p in FROZEN_WORKSPACE_FILES if not p.startswith(".loopwright/")) + (".claude",
                                                                                                   ".loopwright")


def codex_permissions(root: Path, state_dir: Optional[Path], private: Iterable[str] = ()) -> dict:
    """Codex's permission profile `loopwright` for the agent's shell: reads everywhere except the loop's state
    (this workspace's and every other one's) and the `private` paths, which are denied; writes only in the
    workspace (its frozen files read-only) and the scratch dir -- not /tmp, not $TMPDIR; no network.
    A profile, not `sandbox_mode = "workspace-write"`: that older mode cannot deny a read and leaves the
    system temp dir writable. Codex uses the older mode instead whenever it is started with -s/--sandbox."""
    root = Path(root)
    scratch = scratch_dir(state_dir)
    scratch.mkdir(mode=0o700, exist_ok=True)   # the profile cannot create it: /tmp is not writable
    fs: dict[str, Any] = {"/": "read",
                          str(root): {".": "write", **{p: "read" for p in CODEX_READ_ONLY}},
                          str(scratch): "write"}
    # every workspace's state (the same corpus gives the same val/test text). One entry per tree: Codex's
    # bubblewrap cannot mount a deny inside another deny ("Can't mkdir ...: Read-only file system").
    denied: list[Path] = [Path(state_dir).parent] if state_dir is not None else []
    for p in map(Path, private):
        if not any(p == d or d in p.parents for d in denied):
            denied = [d for d in denied if p not in d.parents] + [p]
    fs.update({str(d): "deny" for d in denied})
    return {"filesystem": fs, "network": {"enabled": False}}


def _toml(value: Any) -> str:
    """A TOML literal (JSON strings are valid TOML basic strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):   # keys quoted: paths are keys of a permission profile
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def _codex_server_and_hooks(python: str, root: Path, tool_timeout_s: int = 3600, name: str = MCP_SERVER,
                            serve: Optional[list[str]] = None, url: Optional[str] = None) -> dict[str, Any]:
    """Dotted keys → values: the MCP server and the guard hooks, as Codex reads them."""
    serve = serve or serve_argv(python, root)
    hooks = hook_groups(guard_command(python), pre_timeout=30, stop_timeout=60, start_timeout=60)
    hooks["SessionStart"][0]["matcher"] = "startup|resume"
    # Codex gives a server it starts only a few variables: pass the state dir's home and the launched session
    where: dict[str, Any] = ({f"mcp_servers.{name}.url": url} if url else
                             {f"mcp_servers.{name}.command": serve[0], f"mcp_servers.{name}.args": serve[1:],
                              f"mcp_servers.{name}.env_vars": list(SERVER_ENV_VARS)})
    return {
        **where,
        f"mcp_servers.{name}.required": True,          # wait for the server before the first turn
        f"mcp_servers.{name}.startup_timeout_sec": 60,
        f"mcp_servers.{name}.tool_timeout_sec": int(tool_timeout_s),   # an experiment trains for minutes
        # score and revert are marked destructive: with approvals off, Codex would refuse them
        f"mcp_servers.{name}.default_tools_approval_mode": "approve",
        "hooks.PreToolUse": hooks["PreToolUse"],
        "hooks.Stop": hooks["Stop"],
        "hooks.SessionStart": hooks["SessionStart"],
    }


def codex_overrides(root: Path, python: str, tool_timeout_s: float, level: str = "inner",
                    outer_server: str = "loopwright_outer", state_dir: Optional[Path] = None,
                    private: Iterable[str] = ()) -> list[str]:
    """The launcher's `-c` overrides for `codex exec`: the permission profile, MCP server and hooks (the
    caller must not pass -s/--sandbox: Codex would drop the profile for the older sandbox modes)."""
    name = outer_server if level == "outer" else MCP_SERVER
    serve = [python, "-m", "mcp_server.cli", "serve"] + (["--level", "outer"] if level == "outer" else [])
    profile = codex_permissions(root, state_dir, private)
    pairs = {"default_permissions": CODEX_PROFILE,
             f"permissions.{CODEX_PROFILE}.filesystem": profile["filesystem"],
             f"permissions.{CODEX_PROFILE}.network.enabled": profile["network"]["enabled"],
             **_codex_server_and_hooks(python, root, int(max(tool_timeout_s, 600)), name,
                                       serve + ["--workspace", str(root)])}
    out: list[str] = []
    for key, value in pairs.items():
        out += ["-c", f"{key}={_toml(value)}"]
    return out


def codex_config_toml(python: str, root: Path, wiring: str, with_sandbox: bool = True,
                      state_dir: Optional[Path] = None, private: Iterable[str] = (),
                      mcp_url: Optional[str] = None) -> str:
    """A Codex config.toml (the workspace's .codex/config.toml, or the block for $CODEX_HOME/config.toml)."""
    lines = ["# loopwright for Codex: the sandbox"
             + (", the MCP server and the guard hooks" if wiring == "workspace" else
                " (the MCP server and hooks come from the installed loopwright plugin)")]
    if with_sandbox:
        profile = codex_permissions(root, state_dir, private)
        lines += ["# the agent's shell: no read of the loop's state, writes only in the workspace and the scratch "
                  "dir;", "# do not start Codex with -s/--sandbox (it would replace this profile)",
                  f"default_permissions = {_toml(CODEX_PROFILE)}", "",
                  f"[permissions.{CODEX_PROFILE}.filesystem]"]
        lines += [f"{_toml(k)} = {_toml(v)}" for k, v in profile["filesystem"].items()]
        lines += ["", f"[permissions.{CODEX_PROFILE}.network]", "enabled = false", ""]
    if wiring == "workspace":
        pairs = _codex_server_and_hooks(python, root, url=mcp_url)
        lines.append(f"[mcp_servers.{MCP_SERVER}]")
        for key, value in pairs.items():
            if key.startswith("mcp_servers."):
                lines.append(f"{key.split('.', 2)[2]} = {_toml(value)}")
        for event in ("PreToolUse", "Stop", "SessionStart"):
            group = pairs[f"hooks.{event}"][0]
            lines += ["", f"[[hooks.{event}]]"]
            if "matcher" in group:
                lines.append(f"matcher = {_toml(group['matcher'])}")
            for h in group["hooks"]:
                lines.append(f"[[hooks.{event}.hooks]]")
                lines += [f"{k} = {_toml(v)}" for k, v in h.items()]
    text = "\n".join(lines) + "\n"
    tomllib.loads(text)   # never hand Codex a file it cannot read
    return text


# -- what is installed, and the wiring chosen ---------------------------------------------------------
def claude_config_dir(env: Mapping[str, str]) -> Path:
    return Path(env.get("CLAUDE_CONFIG_DIR") or Path(env.get("HOME") or Path.home()) / ".claude")


def codex_home(env: Mapping[str, str]) -> Path:
    return Path(env.get("CODEX_HOME") or Path(env.get("HOME") or Path.home()) / ".codex")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def installed_plugin(client: str, env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Where the loopwright plugin is installed and enabled for `client` (a short description), or None.
    Claude Code: `claude plugin install` records it in <config>/plugins/installed_plugins.json and
    enables it in <config>/settings.json; Codex: `codex plugin add` enables it in $CODEX_HOME/config.toml."""
    env = os.environ if env is None else env
    if client == "claude":
        d = claude_config_dir(env)
        installed = _read_json(d / "plugins" / "installed_plugins.json").get("plugins") or {}
        enabled = _read_json(d / "settings.json").get("enabledPlugins") or {}
        for key in installed:
            if key.split("@")[0] == PLUGIN and enabled.get(key, True) is not False:
                return f"{key} ({d})"
        return None
    if client == "codex":
        cfg = codex_home(env) / "config.toml"
        for key, table in (_read_toml(cfg).get("plugins") or {}).items():
            if key.split("@")[0] == PLUGIN and isinstance(table, dict) and table.get("enabled", True):
                return f"{key} ({cfg})"
        return None
    raise ValueError(f"unknown client {client!r}; use one of {', '.join(CLIENTS)}")


def resolve_wiring(wiring: str, env: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """{client: 'plugin' | 'workspace'}. auto: the plugin where it is installed, else the workspace."""
    if wiring not in WIRINGS:
        raise ValueError(f"--wiring {wiring!r}: use one of {', '.join(WIRINGS)}")
    if wiring != "auto":
        return {c: wiring for c in CLIENTS}
    return {c: "plugin" if installed_plugin(c, env) else "workspace" for c in CLIENTS}


def workspace_files(root: Path, python: str, state_dir: Optional[Path] = None, wiring: str | Mapping[str, str] = "workspace",
                    editable: Iterable[str] = ("train.py",), env: Optional[Mapping[str, str]] = None,
                    private: Iterable[str] = (), mcp_url: Optional[str] = None) -> dict[str, str]:
    """The client files `loopwright init` writes into a workspace, for the chosen wiring. With the plugin
    wiring there is no .mcp.json and no hooks (the plugin brings them), only the sandbox settings.
    `private`: paths the agent's shell must not read (a corpus on disk). `mcp_url`: the clients reach a
    running server there instead of starting one (the agent as another OS user cannot run the loop)."""
    chosen = resolve_wiring(wiring, env) if isinstance(wiring, str) else dict(wiring)
    root = Path(root)
    files = {".claude/settings.json": json.dumps(claude_settings(python, root, state_dir, chosen["claude"], editable,
                                                                      private),
                                                 indent=2) + "\n",
             ".codex/config.toml": codex_config_toml(python, root, chosen["codex"], state_dir=state_dir,
                                                     private=private, mcp_url=mcp_url),
             WIRING_FILE: json.dumps(chosen, indent=2, sort_keys=True) + "\n"}
    if chosen["claude"] == "workspace":
        files[".mcp.json"] = json.dumps(mcp_json(python, root, mcp_url), indent=2) + "\n"
    return files


# -- doctor ----------------------------------------------------------------------------------------
@dataclass
class Finding:
    ok: bool
    what: str
    fix: str = ""


def _has_hooks(settings: dict) -> bool:
    return any((settings.get("hooks") or {}).get(k) for k in ("PreToolUse", "Stop", "SessionStart"))


def _codex_user_block(env: Mapping[str, str]) -> Optional[Path]:
    cfg = codex_home(env) / "config.toml"
    data = _read_toml(cfg)
    return cfg if MCP_SERVER in (data.get("mcp_servers") or {}) else None


def _paths_named_elsewhere(root: Path, settings: dict) -> Optional[str]:
    """The workspace path the client files were made for, when it is not `root` (a moved workspace)."""
    real = Path(root).resolve()
    named: list[str] = []
    args = ((_read_json(root / ".mcp.json").get("mcpServers") or {}).get(MCP_SERVER) or {}).get("args") or []
    if "--workspace" in args[:-1]:
        named.append(str(args[args.index("--workspace") + 1]))
    named += [str(Path(w).parent) for w in (((settings.get("sandbox") or {}).get("filesystem") or {})
                                           .get("allowWrite") or []) if str(w).endswith("/train.py")]
    for path in named:
        if Path(path).resolve() != real:
            return path
    return None


def check_wiring(root: Path, state_dir: Optional[Path], env: Optional[Mapping[str, str]] = None) -> list[Finding]:
    """Doubles (plugin + workspace copies, plugin + a user-level Codex block), missing wiring, the sandboxes."""
    env = os.environ if env is None else env
    root = Path(root)
    out: list[Finding] = []
    settings = _read_json(root / ".claude" / "settings.json")
    ws_claude = (root / ".mcp.json").is_file() or _has_hooks(settings)
    codex_ws = _read_toml(root / ".codex" / "config.toml")
    ws_codex = bool((codex_ws.get("mcp_servers") or {}).get(MCP_SERVER) or codex_ws.get("hooks"))
    user_codex = _codex_user_block(env)
    for client, ws_wired, name in (("claude", ws_claude, "Claude Code"), ("codex", ws_codex, "Codex")):
        plugin = installed_plugin(client, env)
        if plugin and ws_wired:
            files = ".mcp.json and the hooks in .claude/settings.json" if client == "claude" else \
                "[mcp_servers.loopwright] and [hooks] in .codex/config.toml"
            out.append(Finding(False, f"{name}: wired twice: the plugin {plugin} and the workspace's {files} "
                                      "(every hook would run twice)",
                               "this workspace was made with its own wiring (frozen in its pinned commit): disable "
                               "the plugin (" + ("`claude plugin disable loopwright@loopwright`" if client == "claude"
                                                 else "enabled = false under its [plugins.\"loopwright@...\"] in "
                                                      "$CODEX_HOME/config.toml") +
                               "), or make a new workspace with the plugin installed: `loopwright init DIR`"))
        elif client == "codex" and plugin and user_codex:
            out.append(Finding(False, f"Codex: wired twice: the plugin {plugin} and loopwright's block in {user_codex}",
                               f"remove the loopwright block from {user_codex} (the plugin is enough); do not run "
                               "`loopwright codex-config --write` with the plugin installed"))
        elif plugin:
            out.append(Finding(True, f"{name}: loopwright plugin installed ({plugin}); the workspace carries no "
                                     "copy of its server or hooks"))
        elif ws_wired:
            out.append(Finding(True, f"{name}: wired by the workspace's own files (no plugin installed)"))
        elif client == "codex" and user_codex:
            out.append(Finding(True, f"Codex: wired by loopwright's block in {user_codex}"))
        else:
            fix = ("install the plugin (`claude plugin marketplace add <loopwright checkout>` then "
                   "`claude plugin install loopwright@loopwright`), or make the workspace with "
                   "`loopwright init DIR --wiring workspace`" if client == "claude" else
                   "install the plugin (`codex plugin marketplace add <loopwright checkout>` then `codex plugin add "
                   "loopwright@loopwright`), or `loopwright codex-config --write`")
            out.append(Finding(False, f"{name}: loopwright is not wired (no plugin, no workspace files)", fix))
    moved = _paths_named_elsewhere(root, settings)
    if moved:
        out.append(Finding(False, f"the client files name {moved}, not this workspace {root.resolve()} (moved after "
                                  "init?): Claude Code / Codex would serve that folder, and their sandboxes would "
                                  "not let the agent write this train.py",
                           "these files are frozen in the pinned commit: move the workspace back to where it was "
                           "made, or make a new workspace for the agents (`loopwright init NEWDIR`); `loopwright "
                           "run --agent builtin` needs none of them"))
    out += check_sandboxes(root, state_dir)
    return out


def check_sandboxes(root: Path, state_dir: Optional[Path]) -> list[Finding]:
    root = Path(root)
    out = []
    sb = _read_json(root / ".claude" / "settings.json").get("sandbox") or {}
    fs = sb.get("filesystem") or {}
    problems = []
    if sb.get("enabled") is not True:
        problems.append("sandbox.enabled is not true")
    if sb.get("failIfUnavailable") is not True:
        problems.append("failIfUnavailable is not true (it would run unsandboxed when bubblewrap is missing)")
    if sb.get("allowUnsandboxedCommands") is not False:
        problems.append("allowUnsandboxedCommands is not false (the agent could ask to leave the sandbox)")
    if state_dir is not None and str(state_dir) not in (fs.get("denyWrite") or []):
        problems.append(f"the state dir {state_dir} is not in filesystem.denyWrite")
    if state_dir is not None and str(state_dir) not in (fs.get("denyRead") or []):
        problems.append(f"the state dir {state_dir} is not in filesystem.denyRead")
    out.append(Finding(not problems, "Claude Code sandbox on in .claude/settings.json (Bash writes only train.py "
                                     f"and {scratch_dir(state_dir)}; the state dir unreachable)" if not problems else
                       "Claude Code sandbox: " + "; ".join(problems),
                       "the workspace predates these settings: make a new one with `loopwright init DIR`"))
    codex = _read_toml(root / ".codex" / "config.toml")
    fs = ((codex.get("permissions") or {}).get(CODEX_PROFILE) or {}).get("filesystem") or {}
    problems = []
    if codex.get("default_permissions") != CODEX_PROFILE:
        problems.append(f"default_permissions is not {CODEX_PROFILE!r}")
    if "sandbox_mode" in codex:
        problems.append("it sets sandbox_mode (Codex then ignores the permission profile: no read denies, /tmp "
                        "writable)")
    if state_dir is not None and not any(fs.get(str(d)) == "deny" for d in (Path(state_dir), *Path(state_dir).parents)):
        problems.append(f"the state dir {state_dir} is not denied in [permissions.{CODEX_PROFILE}.filesystem]")
    out.append(Finding(not problems, f"Codex permission profile {CODEX_PROFILE!r} in .codex/config.toml (the "
                                     "state dir unreadable, no writes outside the workspace and the scratch dir)"
                       if not problems else "Codex sandbox in .codex/config.toml: " + "; ".join(problems),
                       "the workspace predates these settings: make a new one with `loopwright init DIR` "
                       "(`loopwright launch --agent codex` passes the profile either way)"))
    return out


def recorded_wiring(root: Path) -> dict[str, str]:
    return _read_json(Path(root) / WIRING_FILE)


def apply_wiring(root: Path, python: str, state_dir: Optional[Path], wiring: str,
                 editable: Iterable[str] = ("train.py",), env: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """Write a workspace's client files for `wiring`, removing the copies the other wiring needs (before the
    workspace is pinned: afterwards they are frozen files, restored by the integrity check). Returns
    {client: wiring}."""
    root = Path(root)
    chosen = resolve_wiring(wiring, env)
    files = workspace_files(root, python, state_dir, chosen, editable)
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    if ".mcp.json" not in files and (root / ".mcp.json").is_file():
        (root / ".mcp.json").unlink()
    return chosen


# -- did the hooks run? ------------------------------------------------------------------------------
# Codex runs hooks only once they are trusted (/hooks) and otherwise says nothing; a session whose hooks
# never fired has no guard and no Stop hook. The guard leaves a heartbeat per client session in the
# workspace's .loopwright/hooks/ (a diagnostic, not a security boundary); the launcher and doctor read it.
HEARTBEAT_DIR = ".loopwright/hooks"
HOOKS_NEVER_RAN = ("the loopwright hooks never ran in this session, so nothing guarded it and the Stop hook "
                   "never kept it going. Codex runs hooks only once trusted: open Codex in the workspace and "
                   "trust them with /hooks (or pass --dangerously-bypass-hook-trust to `codex exec`); Claude "
                   "Code: check `/hooks` and run `loopwright doctor`.")


def _workspace_of(cwd: str) -> Optional[Path]:
    p = Path(cwd or ".").resolve()
    for d in (p, *p.parents):
        if (d / "loopwright.toml").is_file():
            return d
    return None


def record_hook_heartbeat(raw_payload: str, event: str) -> None:
    """Touch .loopwright/hooks/<client session id> for the workspace the payload's cwd is in. Never raises."""
    try:
        payload = json.loads(raw_payload or "{}")
        root = _workspace_of(payload.get("cwd") or os.getcwd())
        if root is None:
            return
        sid = "".join(ch for ch in str(payload.get("session_id") or "unknown") if ch.isalnum() or ch in "-_.")[:80]
        d = root / HEARTBEAT_DIR
        d.mkdir(parents=True, exist_ok=True)
        (d / (sid or "unknown")).write_text(json.dumps({"event": event, "session_id": sid}) + "\n")
    except Exception:  # noqa: BLE001 - a diagnostic must never change a hook's answer
        pass


def last_hook_heartbeat(root: Path) -> Optional[float]:
    """When a loopwright hook last ran in this workspace (epoch seconds), or None if never."""
    d = Path(root) / HEARTBEAT_DIR
    try:
        return max((f.stat().st_mtime for f in d.iterdir() if f.is_file()), default=None)
    except OSError:
        return None


def hooks_ran_since(root: Path, since: float) -> bool:
    last = last_hook_heartbeat(root)
    return last is not None and last >= since - 1.0


# -- the launcher's own wiring for Claude Code ------------------------------------------------------
def launcher_claude_files(root: Path, python: str, state_dir: Path) -> tuple[Path, Optional[Path]]:
    """(--mcp-config file, --settings file or None) for a headless `claude -p` run with `--setting-sources
    project` (no user plugin, so never a second copy). A workspace wired by its own files already has the
    server and the hooks; a plugin-wired one gets them from files in the state dir, where the agent
    cannot rewire them. The sandbox always comes from the project's .claude/settings.json."""
    root = Path(root)
    if (root / ".mcp.json").is_file() and _has_hooks(_read_json(root / ".claude" / "settings.json")):
        return root / ".mcp.json", None
    d = Path(state_dir) / "launch"
    d.mkdir(parents=True, exist_ok=True)
    mcp, settings = d / "claude-mcp.json", d / "claude-settings.json"
    mcp.write_text(json.dumps(mcp_json(python, root), indent=2) + "\n")
    settings.write_text(json.dumps({"hooks": hook_groups(guard_command(python))}, indent=2) + "\n")
    return mcp, settings
