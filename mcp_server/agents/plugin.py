"""The loopwright plugin for Claude Code and Codex, written from the installed package (issue 24 item 9).

A checkout of the repository is itself a plugin and a marketplace; a pip install carries the same files as
package data (`mcp_server._plugin`, see pyproject.toml). `loopwright plugin install` writes them to a folder
with the MCP server and the hooks naming this interpreter by absolute path, so the plugin works whatever
PATH the client starts with (the checkout's bin/loopwright-mcp looks for `loopwright` on PATH and fails
to connect without it). `plugin_checks` is doctor's view of the installed plugin's server command.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from mcp_server import __version__
from mcp_server.agents.clients import (
    PLUGIN,
    claude_config_dir,
    codex_home,
    guard_command,
    hook_groups,
    installed_plugin,
    plugin_hooks_json,
)
from mcp_server.common.facts import MCP_SERVER

# copied as they are; the server and hook entries are written for this interpreter
COPIED = (".claude-plugin/marketplace.json", ".agents/plugins/marketplace.json", ".codex-plugin/plugin.json",
          "skills/research-loop/SKILL.md", "skills/outer-loop/SKILL.md", "agents/reviewer.md",
          "bin/loopwright-mcp-codex")
SHELLS = {"sh", "bash", "dash"}


class PluginError(RuntimeError):
    """A plugin folder that cannot be written, phrased as what to do."""


def plugin_source_dir() -> Path:
    """The plugin files: the checkout this module runs from, else the installed package data."""
    candidates = [Path(__file__).resolve().parents[2]]
    try:
        import importlib.util

        spec = importlib.util.find_spec("mcp_server._plugin")   # a namespace package: no __init__.py
        candidates += [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    except (ImportError, ValueError):
        pass
    for c in candidates:
        if all((c / f).is_file() for f in (*COPIED, ".claude-plugin/plugin.json")):
            return c
    raise PluginError(f"the plugin files are not in this loopwright (looked in {', '.join(map(str, candidates))}); "
                      "reinstall it: pip install --force-reinstall loopwright")


def default_dest(env: Optional[Mapping[str, str]] = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("XDG_DATA_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local" / "share")
    return Path(base).expanduser() / "loopwright-plugin"


def _launcher(python: str) -> str:
    q = "'" + python.replace("'", "'\\''") + "'"
    return ("#!/bin/sh\n"
            "# Written by `loopwright plugin install`: the MCP server of the loopwright installed for this Python\n"
            "# (by absolute path, so it does not depend on the PATH the client was started with).\n"
            f"py={q}\n"
            'if [ ! -x "$py" ]; then\n'
            '  echo "loopwright: $py is gone (loopwright uninstalled, or its venv moved). Run \\`loopwright plugin '
            'install\\` again with the loopwright you use, then reinstall the plugin in the client." >&2\n'
            "  exit 1\n"
            "fi\n"
            'exec "$py" -m mcp_server.cli serve "$@"\n')


def plugin_files(python: str, source: Optional[Path] = None) -> dict[str, str]:
    """{relative path: text} of the plugin (and its local marketplace) for `python`."""
    src = source or plugin_source_dir()
    files = {rel: (src / rel).read_text() for rel in COPIED}
    manifest = json.loads((src / ".claude-plugin" / "plugin.json").read_text())
    manifest["version"] = __version__            # a new version makes the client refresh its cached copy
    files[".claude-plugin/plugin.json"] = json.dumps(manifest, indent=2) + "\n"
    codex = json.loads(files[".codex-plugin/plugin.json"])
    codex["version"] = __version__
    files[".codex-plugin/plugin.json"] = json.dumps(codex, indent=2) + "\n"
    serve = {"command": python, "args": ["-m", "mcp_server.cli", "serve"],
             "env": {"LOOPWRIGHT_WORKSPACE": "${CLAUDE_PROJECT_DIR}"}}
    files[".mcp.json"] = json.dumps({"mcpServers": {MCP_SERVER: serve}}, indent=2) + "\n"
    codex_mcp = json.loads((src / ".codex-plugin" / "mcp.json").read_text())
    codex_mcp["mcpServers"][MCP_SERVER]["command"] = "/bin/sh"   # its launcher finds the project, then bin/loopwright-mcp
    files[".codex-plugin/mcp.json"] = json.dumps(codex_mcp, indent=2) + "\n"
    files["bin/loopwright-mcp"] = _launcher(python)
    hooks = plugin_hooks_json()
    hooks["hooks"] = hook_groups(guard_command(python), pre_timeout=10, on_failure_block=True)
    # fail closed in both clients (Codex has no onFailure): a vanished interpreter (127) or a crash blocks
    pre = hooks["hooks"]["PreToolUse"][0]["hooks"][0]
    pre["command"] += " || exit 2"
    files["hooks/hooks.json"] = json.dumps(hooks, indent=2) + "\n"
    return files


def _ours(dest: Path) -> bool:
    try:
        return json.loads((dest / ".claude-plugin" / "plugin.json").read_text()).get("name") == PLUGIN
    except (OSError, ValueError, AttributeError):
        return False


def write_plugin(dest: Path, python: str) -> list[Path]:
    """Write the plugin and its marketplace to `dest` (replacing an earlier loopwright plugin there)."""
    dest = Path(dest).expanduser().absolute()
    files = plugin_files(python)
    if dest.exists() and not dest.is_dir():
        raise PluginError(f"{dest} is a file; pass another folder with --dest")
    if dest.is_dir() and any(dest.iterdir()):
        if not _ours(dest):
            raise PluginError(f"{dest} is not empty and holds no loopwright plugin; pass an empty or new folder "
                              "with --dest")
        shutil.rmtree(dest)
    written = []
    for rel, text in files.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if rel.startswith("bin/"):
            path.chmod(0o755)
        written.append(path)
    return written


# -- doctor: can the installed plugin's server start from this PATH? ----------------------------------
@dataclass
class PluginFinding:
    ok: bool
    what: str
    fix: str = ""
    hint: str = ""


REINSTALL = {
    "Claude Code": "run `loopwright plugin install` (it writes the plugin with this loopwright's interpreter by "
                   "absolute path), then `claude plugin marketplace update loopwright` and `claude plugin update "
                   "loopwright@loopwright` (or uninstall and install it again); restart claude",
    "Codex": "run `loopwright plugin install` (it writes the plugin with this loopwright's interpreter by absolute "
             "path), then `codex plugin marketplace add` that folder and `codex plugin add loopwright@loopwright` "
             "again; restart codex",
}
LAUNCHER_MARK = "Written by `loopwright plugin install`"


def claude_plugin_roots(env: Optional[Mapping[str, str]] = None) -> list[Path]:
    """The install paths of the loopwright plugin that Claude Code recorded (installed_plugins.json)."""
    env = os.environ if env is None else env
    d = claude_config_dir(env)
    try:
        installed = json.loads((d / "plugins" / "installed_plugins.json").read_text()).get("plugins") or {}
    except (OSError, ValueError, AttributeError):
        return []
    roots = []
    for key, entries in installed.items():
        if key.split("@")[0] != PLUGIN:
            continue
        for e in entries if isinstance(entries, list) else [entries]:
            if isinstance(e, dict) and e.get("installPath"):
                roots.append(Path(e["installPath"]))
    return roots


def codex_plugin_roots(env: Optional[Mapping[str, str]] = None) -> list[Path]:
    """Codex's copies of an enabled loopwright plugin: $CODEX_HOME/plugins/cache/<marketplace>/loopwright/<v>."""
    env = os.environ if env is None else env
    if not installed_plugin("codex", env):
        return []
    return sorted(p.parent for p in (codex_home(env) / "plugins" / "cache").glob(f"*/{PLUGIN}/*/.codex-plugin"))


def _server_entry(path: Path) -> Optional[dict]:
    try:
        servers = json.loads(path.read_text()).get("mcpServers") or {}
    except (OSError, ValueError, AttributeError):
        return None
    entry = servers.get(MCP_SERVER)
    return entry if isinstance(entry, dict) else None


def _resolve(cmd: str, env: Mapping[str, str]) -> Optional[str]:
    if "/" in cmd:
        return cmd if os.path.isfile(cmd) and os.access(cmd, os.X_OK) else None
    return shutil.which(cmd, path=env.get("PATH", os.defpath))


def can_import(python: str, env: Mapping[str, str], pythonpath: str = "") -> bool:
    code = ("import importlib.util as u, sys; "
            "sys.exit(not (u.find_spec('mcp_server') and u.find_spec('mcp')))")
    run_env = {**env, "PYTHONPATH": pythonpath} if pythonpath else {k: v for k, v in env.items() if k != "PYTHONPATH"}
    try:
        return subprocess.run([python, "-c", code], env=run_env, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _python_finding(name: str, python: str, env: Mapping[str, str]) -> PluginFinding:
    where = _resolve(python, env)
    if where is None:
        return PluginFinding(False, f"{name}: the loopwright plugin's MCP server command `{python}` is not found "
                                    "(the client would show \"Failed to connect\")", REINSTALL[name])
    if os.path.basename(where).startswith(("python", "pypy")) and not can_import(where, env):
        return PluginFinding(False, f"{name}: the loopwright plugin's MCP server runs {where}, which cannot import "
                                    "loopwright (uninstalled, or another venv)", REINSTALL[name])
    return PluginFinding(True, f"{name}: the loopwright plugin's MCP server command resolves ({where})")


def _launcher_finding(name: str, script: Path, env: Mapping[str, str]) -> PluginFinding:
    """bin/loopwright-mcp: the one `plugin install` writes names its Python; the checkout's tries
    $LOOPWRIGHT_PYTHON, then `loopwright` on PATH, then python3 on the plugin's own source."""
    try:
        text = script.read_text()
    except OSError:
        return PluginFinding(False, f"{name}: the loopwright plugin's launcher {script} is missing", REINSTALL[name])
    if LAUNCHER_MARK in text:
        m = re.search(r"^py='(.*)'$", text, re.M)
        return _python_finding(name, m.group(1).replace("'\\''", "'") if m else "?", env)
    lp = env.get("LOOPWRIGHT_PYTHON")
    if lp and _resolve(lp, env):
        return PluginFinding(True, f"{name}: the loopwright plugin's MCP server runs $LOOPWRIGHT_PYTHON ({lp})")
    lw = _resolve("loopwright", env)
    if lw:
        return PluginFinding(True, f"{name}: the loopwright plugin's MCP server runs `loopwright` from PATH ({lw})",
                             hint="a client started with a PATH that lacks it fails to connect; `loopwright plugin "
                                  "install` pins the interpreter instead")
    py3 = _resolve("python3", env)
    if py3 and can_import(py3, env, str(script.parent.parent)):
        return PluginFinding(True, f"{name}: the loopwright plugin's MCP server runs {py3} on the plugin's own source")
    return PluginFinding(False, f"{name}: the loopwright plugin's MCP server launcher finds no loopwright: "
                                "`loopwright` is not on PATH, $LOOPWRIGHT_PYTHON is not set, and python3 here cannot "
                                "import it (the client would show \"Failed to connect\")", REINSTALL[name])


def server_command_finding(root: Path, env: Mapping[str, str], client: str = "claude") -> PluginFinding:
    """Whether the plugin installed at `root` starts its MCP server from this environment's PATH."""
    name = "Claude Code" if client == "claude" else "Codex"
    manifest = root / (".mcp.json" if client == "claude" else ".codex-plugin/mcp.json")
    entry = _server_entry(manifest)
    if entry is None:
        return PluginFinding(False, f"{name}: the loopwright plugin at {root} has no MCP server entry ({manifest.name})",
                             REINSTALL[name])
    sub = lambda s: str(s).replace("${CLAUDE_PLUGIN_ROOT}", str(root))
    cmd, args = sub(entry.get("command") or ""), [sub(a) for a in entry.get("args") or []]
    if os.path.basename(cmd) in SHELLS and args and args[0].endswith(("bin/loopwright-mcp", "bin/loopwright-mcp-codex")):
        if _resolve(cmd, env) is None:
            return PluginFinding(False, f"{name}: the loopwright plugin's MCP server command `{cmd}` is not found",
                                 REINSTALL[name])
        script = Path(args[0]) if os.path.isabs(args[0]) else root / args[0]   # Codex: relative to cwd "."
        return _launcher_finding(name, script.parent / "loopwright-mcp", env)
    return _python_finding(name, cmd, env)


def plugin_checks(env: Optional[Mapping[str, str]] = None) -> list[PluginFinding]:
    env = os.environ if env is None else env
    return ([server_command_finding(root, env, "claude") for root in claude_plugin_roots(env)]
            + [server_command_finding(root, env, "codex") for root in codex_plugin_roots(env)])
