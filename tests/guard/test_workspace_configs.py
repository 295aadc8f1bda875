"""The client configs a workspace carries must guard the same tools as the plugin's hooks.json."""
import json
from pathlib import Path

import tomllib

from mcp_server.common.facts import HOOK_MATCHER
from mcp_server.loop.setup import client_configs

REPO = Path(__file__).resolve().parents[2]


def test_workspace_hook_matchers_match_the_plugin():
    plugin = json.loads((REPO / "hooks" / "hooks.json").read_text())["hooks"]["PreToolUse"][0]["matcher"]
    assert set(plugin.split("|")) == set(HOOK_MATCHER.split("|"))
    cfgs = client_configs(Path("/ws"), "/usr/bin/python3")
    claude = json.loads(cfgs[".claude/settings.json"])["hooks"]
    assert claude["PreToolUse"][0]["matcher"] == HOOK_MATCHER
    assert {"PreToolUse", "Stop", "SessionStart"} <= set(claude)
    codex = tomllib.loads(cfgs[".codex/config.toml"])
    assert codex["hooks"]["PreToolUse"][0]["matcher"] == HOOK_MATCHER
    server = codex["mcp_servers"]["loopwright"]
    assert server["required"] is True and server["tool_timeout_sec"] >= 600
    assert server["args"][-2:] == ["--workspace", "/ws"]
    mcp = json.loads(cfgs[".mcp.json"])["mcpServers"]["loopwright"]
    assert mcp["command"] == "/usr/bin/python3" and "serve" in mcp["args"]


# -- issue 15 items 4-5 and issue 10 item 5: one wiring per client, the clients' sandboxes on --------
import os  # noqa: E402
import subprocess  # noqa: E402

import pytest  # noqa: E402

from mcp_server.agents import clients  # noqa: E402

from conftest import PROBE_ATTEMPT  # noqa: E402

STATE = Path("/state/ws-abc")


def test_plugin_hooks_json_is_generated_by_the_one_home():
    assert json.loads((REPO / "hooks" / "hooks.json").read_text()) == clients.plugin_hooks_json()


def test_plugin_wiring_leaves_no_copies_of_server_or_hooks_but_keeps_the_sandboxes():
    files = clients.workspace_files(Path("/ws"), "/usr/bin/python3", STATE, "plugin")
    assert ".mcp.json" not in files
    claude = json.loads(files[".claude/settings.json"])
    assert "hooks" not in claude and claude["sandbox"]["enabled"] is True
    codex = tomllib.loads(files[".codex/config.toml"])
    assert "mcp_servers" not in codex and "hooks" not in codex
    assert codex["default_permissions"] == "loopwright" and "sandbox_mode" not in codex
    assert codex["permissions"]["loopwright"]["filesystem"][str(STATE.parent)] == "deny"   # every workspace's
    assert json.loads(files[clients.WIRING_FILE]) == {"claude": "plugin", "codex": "plugin"}


def test_claude_sandbox_is_on_with_no_escape_and_the_state_dir_out_of_reach():
    files = clients.workspace_files(Path("/ws"), "/usr/bin/python3", STATE, "workspace")
    sb = json.loads(files[".claude/settings.json"])["sandbox"]
    assert sb["enabled"] is True and sb["failIfUnavailable"] is True and sb["allowUnsandboxedCommands"] is False
    fs = sb["filesystem"]
    assert fs["allowWrite"] == ["/ws/train.py", str(clients.scratch_dir(STATE))]
    assert not clients.scratch_dir(STATE).is_relative_to("/ws") and clients.scratch_dir(STATE).name.endswith("ws-abc")
    assert str(STATE) in fs["denyWrite"] and str(STATE) in fs["denyRead"]
    assert str(STATE.parent) in fs["denyRead"]                 # every other workspace's state too
    assert {"/ws/prepare.py", "/ws/.git", "/ws/loopwright.toml", "/ws/.loopwright/workspace-id"} <= set(fs["denyWrite"])
    codex = tomllib.loads(files[".codex/config.toml"])
    assert codex["permissions"]["loopwright"]["network"]["enabled"] is False
    cfs = codex["permissions"]["loopwright"]["filesystem"]
    assert cfs[str(STATE.parent)] == "deny" and cfs["/"] == "read"
    assert str(STATE) not in cfs        # a deny inside a deny: Codex's bubblewrap cannot mount it
    assert cfs[str(clients.scratch_dir(STATE))] == "write"
    assert cfs["/ws"]["."] == "write" and cfs["/ws"]["prepare.py"] == cfs["/ws"][".git"] == "read"
    assert not any(v == "write" for k, v in cfs.items() if k not in ("/ws", str(clients.scratch_dir(STATE))))


def test_a_corpus_on_disk_is_out_of_the_agents_shell_reach_and_a_named_one_adds_nothing():
    mine = client_configs(Path("/ws"), "/usr/bin/python3", STATE, corpus="/data/texts")
    assert "/data/texts" in json.loads(mine[".claude/settings.json"])["sandbox"]["filesystem"]["denyRead"]
    assert tomllib.loads(mine[".codex/config.toml"])["permissions"]["loopwright"]["filesystem"]["/data/texts"] == "deny"
    named = client_configs(Path("/ws"), "/usr/bin/python3", STATE, corpus="tinystories")
    assert json.loads(named[".claude/settings.json"])["sandbox"]["filesystem"]["denyRead"] == [str(STATE),
                                                                                              str(STATE.parent)]


def test_launcher_overrides_carry_the_sandbox_server_and_hooks():
    args = clients.codex_overrides(Path("/ws"), "/usr/bin/python3", 900, state_dir=STATE, private=["/data/t"])
    pairs = dict(a.split("=", 1) for a in args[1::2])
    assert "sandbox_mode" not in pairs and pairs["default_permissions"] == '"loopwright"'
    fs = tomllib.loads(f"x = {pairs['permissions.loopwright.filesystem']}")["x"]
    assert fs == clients.codex_permissions(Path("/ws"), STATE, ["/data/t"])["filesystem"]
    assert fs[str(STATE.parent)] == fs["/data/t"] == "deny"
    assert tomllib.loads(f"x = {pairs['hooks.PreToolUse']}")["x"][0]["matcher"] == HOOK_MATCHER
    assert pairs["mcp_servers.loopwright.tool_timeout_sec"] == "900"


def _claude_home(tmp: Path, enabled: bool = True) -> dict:
    d = tmp / "claude-config"
    (d / "plugins").mkdir(parents=True)
    (d / "plugins" / "installed_plugins.json").write_text(json.dumps(
        {"version": 2, "plugins": {"loopwright@loopwright": [{"scope": "user", "installPath": str(d)}]}}))
    (d / "settings.json").write_text(json.dumps({"enabledPlugins": {"loopwright@loopwright": enabled}}))
    return {"CLAUDE_CONFIG_DIR": str(d), "CODEX_HOME": str(tmp / "codex-home"), "HOME": str(tmp)}


def test_auto_wiring_follows_what_is_installed(tmp_path):
    env = _claude_home(tmp_path)
    assert clients.resolve_wiring("auto", env) == {"claude": "plugin", "codex": "workspace"}
    (tmp_path / "codex-home").mkdir()
    (tmp_path / "codex-home" / "config.toml").write_text('[plugins."loopwright@loopwright"]\nenabled = true\n')
    assert clients.resolve_wiring("auto", env) == {"claude": "plugin", "codex": "plugin"}
    assert clients.resolve_wiring("auto", _claude_home(tmp_path / "off", enabled=False))["claude"] == "workspace"
    with pytest.raises(ValueError, match="use one of auto, plugin, workspace"):
        clients.resolve_wiring("both")


def test_doctor_finds_doubles_and_says_how_to_undo_them(tmp_path):
    env = _claude_home(tmp_path)
    (tmp_path / "codex-home").mkdir()
    (tmp_path / "codex-home" / "config.toml").write_text(
        '[plugins."loopwright@loopwright"]\nenabled = true\n[mcp_servers.loopwright]\ncommand = "x"\n')
    ws = tmp_path / "ws"
    clients.apply_wiring(ws, "/usr/bin/python3", STATE, "workspace", env=env)     # the README's double wiring
    found = {f.what.split(":")[0]: f for f in clients.check_wiring(ws, STATE, env)}
    assert not found["Claude Code"].ok and "wired twice" in found["Claude Code"].what
    assert "claude plugin disable loopwright@loopwright" in found["Claude Code"].fix
    assert not found["Codex"].ok and "wired twice" in found["Codex"].what
    chosen = clients.apply_wiring(ws, "/usr/bin/python3", STATE, "auto", env=env)
    assert chosen == {"claude": "plugin", "codex": "plugin"} and not (ws / ".mcp.json").exists()
    found = {f.what.split(":")[0]: f for f in clients.check_wiring(ws, STATE, env)}
    assert found["Claude Code"].ok
    # the user-level Codex block next to the plugin is still a double: never tell a plugin user to write it
    assert not found["Codex"].ok and "codex-config --write" in found["Codex"].fix
    assert all(f.ok for f in clients.check_sandboxes(ws, STATE))


@pytest.mark.realclient
def test_plugin_installed_by_the_real_claude_cli_is_detected(tmp_path):
    from realclients import harness as h

    exe = h.require_binary("claude")
    env = {**os.environ, "HOME": str(tmp_path), "CLAUDE_CONFIG_DIR": str(tmp_path / "cc"),
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    for args in (["plugin", "marketplace", "add", str(REPO)], ["plugin", "install", "loopwright@loopwright"]):
        r = subprocess.run([exe, *args], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
    assert "loopwright@loopwright" in (clients.installed_plugin("claude", env) or "")
    assert clients.resolve_wiring("auto", env)["claude"] == "plugin"


# -- issue 23 item 6: Codex's own sandbox, run with the config `init` writes --------------------------------
# The agent's shell under `codex sandbox` (the same bubblewrap + seccomp policy `codex exec` applies to its
# commands): it must not read val/test or the ledger, nor write the state, the temp dirs or the frozen files.
PROBE = r"""
import json, os, sys
state, ws, scratch = sys.argv[1:4]
""" + PROBE_ATTEMPT + r"""
def write(path):
    with open(path, "a") as f:
        f.write("x")
for split in ("val", "test"):
    attempt(f"read {split}", lambda s=split: open(os.path.join(state, "data", f"{s}.bin"), "rb").read(1))
attempt("read ledger", lambda: open(os.path.join(state, "state.db"), "rb").read(1))
attempt("read settings", lambda: open(os.path.join(state, "settings.toml"), "rb").read(1))
attempt("list other states", lambda: os.listdir(os.path.dirname(state)))
attempt("write state", lambda: write(os.path.join(state, "planted")))
attempt("write /tmp", lambda: write("/tmp/loopwright-codex-probe"))
attempt("write TMPDIR", lambda: write(os.path.join(os.environ["TMPDIR"], "probe")))
for rel in ("prepare.py", "loopwright.toml", ".git/config", ".loopwright/workspace-id"):
    attempt(f"write {rel}", lambda r=rel: write(os.path.join(ws, r)))
attempt("read prepare.py", lambda: open(os.path.join(ws, "prepare.py")).read(1))
attempt("write train.py", lambda: write(os.path.join(ws, "train.py")))
attempt("write scratch", lambda: write(os.path.join(scratch, "notes")))
print(json.dumps(out))
"""
DENIED = ["read val", "read test", "read ledger", "read settings", "list other states", "write state", "write /tmp",
          "write TMPDIR", "write prepare.py", "write loopwright.toml", "write .git/config",
          "write .loopwright/workspace-id"]
ALLOWED = ["read prepare.py", "write train.py", "write scratch"]


def _codex_env(tmp: Path, ws_root: Path) -> dict:
    """An isolated CODEX_HOME that trusts the workspace (Codex loads a project's .codex/config.toml only then);
    TMPDIR inside tmp (Codex refuses to set its sandbox helper up under a shared temp dir)."""
    home, tmpdir = tmp / "codex-home", tmp / "codex-tmp"
    home.mkdir()
    tmpdir.mkdir()
    (home / "config.toml").write_text(f'[projects."{ws_root}"]\ntrust_level = "trusted"\n')
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("CODEX_", "OPENAI_"))}
    return {**keep, "CODEX_HOME": str(home), "TMPDIR": str(tmpdir), "HOME": str(tmp)}


def _cannot_sandbox(stderr: str) -> bool:
    """No user namespaces here (a machine limit), as opposed to a policy bubblewrap cannot build (a bug)."""
    return any(s in stderr for s in ("No permissions to create new namespace", "Creating new namespace failed",
                                     "setting up uid map", "unshare failed"))


def test_the_default_corpus_held_out_modules_are_out_of_the_agents_shell_reach():
    """stdlib-hidden's val/test are standard-library modules: the agent's shell could read them and paste them
    into train.py as training text, so both clients' sandboxes deny them as they deny a corpus on disk."""
    from mcp_server.loop import sandbox

    held_out = sandbox.agent_private_paths("stdlib-hidden")
    assert any(p.endswith("/xmlrpc") for p in held_out) and any(p.endswith("/mailbox.py") for p in held_out)
    cfgs = client_configs(Path("/ws"), "/usr/bin/python3", STATE, corpus="stdlib-hidden")
    deny = json.loads(cfgs[".claude/settings.json"])["sandbox"]["filesystem"]["denyRead"]
    assert set(held_out) <= set(deny)
    # and Claude Code's own file tools, which its sandbox does not cover: Read(//abs/path) rules
    rules = json.loads(cfgs[".claude/settings.json"])["permissions"]["deny"]
    assert {f"Read(/{p})" for p in held_out} <= set(rules) and all(r.startswith("Read(//") for r in rules)
    fs = tomllib.loads(cfgs[".codex/config.toml"])["permissions"]["loopwright"]["filesystem"]
    assert {p: fs.get(p) for p in held_out} == dict.fromkeys(held_out, "deny")


@pytest.mark.realclient
@pytest.mark.timeout(300)
def test_codex_sandbox_denies_the_default_corpus_held_out_modules(tmp_path):
    """The real Codex sandbox with the profile init writes for the default corpus: a held-out module's source
    cannot be read (and the same read outside the sandbox works, so it was the sandbox)."""
    import sys

    from mcp_server.loop import sandbox

    from realclients import harness as h

    exe = h.require_binary("codex")
    ws, state = tmp_path / "ws", tmp_path / "state" / "ws-1"
    ws.mkdir()
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    cfgs = client_configs(ws, sys.executable, state, corpus="stdlib-hidden")
    (ws / ".codex").mkdir()
    (ws / ".codex" / "config.toml").write_text(cfgs[".codex/config.toml"])
    profile = tomllib.loads(cfgs[".codex/config.toml"])["default_permissions"]
    module = next(p for p in sandbox.agent_private_paths("stdlib-hidden") if p.endswith("/mailbox.py"))
    read = f"head -c 64 {module} > /dev/null && echo READ || echo DENIED"
    r = subprocess.run([exe, "sandbox", "-P", profile, "-C", str(ws), "--", "sh", "-c", read],
                       env=_codex_env(tmp_path, ws), capture_output=True, text=True, timeout=120)
    if r.returncode != 0 and _cannot_sandbox(r.stderr):
        pytest.skip(f"Codex's sandbox cannot run on this machine: {r.stderr.strip()[-400:]}")
    assert r.stdout.strip().splitlines()[-1] == "DENIED", r.stdout + r.stderr
    assert subprocess.run(["sh", "-c", read], capture_output=True, text=True).stdout.strip() == "READ"


def _probe_results(r: subprocess.CompletedProcess) -> dict:
    if r.returncode != 0 and _cannot_sandbox(r.stderr):
        pytest.skip(f"Codex's sandbox cannot run on this machine: {r.stderr.strip()[-400:]}")
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.realclient
@pytest.mark.timeout(300)
def test_codex_sandbox_with_the_init_config_keeps_the_agents_shell_off_the_state(tmp_path, small_corpus):
    import sys

    from conftest import make_workspace
    from realclients import harness as h

    exe = h.require_binary("codex")
    ws = make_workspace(tmp_path / "ws", small_corpus)
    assert (ws.data_dir / "val.bin").is_file() and (ws.data_dir / "test.bin").is_file()
    profile = tomllib.loads((ws.root / ".codex" / "config.toml").read_text())["default_permissions"]
    scratch = clients.scratch_dir(ws.state_dir)
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    env = _codex_env(tmp_path, ws.root)
    r = subprocess.run([exe, "sandbox", "-P", profile, "-C", str(ws.root), "--", sys.executable, str(probe),
                        str(ws.state_dir), str(ws.root), str(scratch)],
                       env=env, capture_output=True, text=True, timeout=120)
    got = _probe_results(r)
    assert {k: got[k] for k in ALLOWED} == dict.fromkeys(ALLOWED, "ok"), got
    assert [k for k in DENIED if got[k] == "ok"] == [], got
    assert not Path("/tmp/loopwright-codex-probe").exists() and not (ws.state_dir / "planted").exists()


@pytest.mark.realclient
@pytest.mark.timeout(300)
def test_codex_exec_as_the_launcher_starts_it_denies_the_state_to_the_agents_shell(tmp_path, small_corpus):
    """`loopwright launch --agent codex`'s own argv (no -s: it would replace the profile with workspace-write,
    which reads everything and writes /tmp), against the real codex exec and a scripted model."""
    import tomli_w

    from mcp_server.agents import launch

    from conftest import make_workspace
    from realclients import fake_openai as fo
    from realclients import harness as h

    exe = h.require_binary("codex")
    ws = make_workspace(tmp_path / "ws", small_corpus)
    marker = tmp_path / "codex-tmp" / "planted"
    cmd = (f"cat {ws.data_dir / 'test.bin'} | head -c 40; echo; touch /tmp/loopwright-codex-exec-probe; "
           f"touch {marker}; echo X >> {ws.root / 'prepare.py'}; echo '# ok' >> {ws.root / 'train.py'}")
    fake = fo.FakeOpenAI([fo.Turn(fo.FunctionCall("exec_command", {"cmd": cmd})), fo.Turn("done")])
    argv = launch.codex_argv(exe, ws.root, "go", 600, [], state_dir=ws.state_dir)
    assert "-s" not in argv and "--sandbox" not in argv
    # the launcher's own MCP server and hooks are not what this test is about: the shell's reach is
    drop = {i for i, a in enumerate(argv) if a.startswith(("mcp_servers.", "hooks."))}
    argv = [a for i, a in enumerate(argv) if i not in drop and i + 1 not in drop]
    argv[2:2] = ["--skip-git-repo-check", "--disable", "plugins", "--disable", "shell_snapshot"]
    env = _codex_env(tmp_path, ws.root)
    env["FAKE_OPENAI_KEY"] = "dummy-key"
    with fake:
        cfg = h.codex_config(fake.url)
        (Path(env["CODEX_HOME"]) / "config.toml").write_text(tomli_w.dumps(cfg))
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180, cwd=ws.root)
    outs = [e["item"] for e in map(json.loads, filter(None, r.stdout.splitlines()))
            if e.get("type") == "item.completed" and e["item"].get("type") == "command_execution"]
    if not outs and _cannot_sandbox(r.stderr):
        pytest.skip(f"Codex's sandbox cannot run on this machine: {r.stderr.strip()[-400:]}")
    assert outs, r.stdout[-2000:] + r.stderr[-2000:]
    text = outs[0]["aggregated_output"]
    assert "Permission denied" in text and (ws.data_dir / "test.bin").read_bytes()[:8].decode("latin-1") not in text
    assert not Path("/tmp/loopwright-codex-exec-probe").exists() and not marker.exists()
    assert not (ws.root / "prepare.py").read_text().endswith("X\n")
    assert (ws.root / "train.py").read_text().endswith("# ok\n")
