"""Issue 15 ("the first hour with real clients and connectors"): the loop-side items.

Item 3 (campaign_end is recorded and delivered; the Jira closing comment shows the real
baseline), 9 (a comment-only change is refused as such; tiny time budgets are refused
with the minimum) and 14 (one crash alert per streak, with the streak's real length).
"""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from mcp_server.loop import outcome
from mcp_server.loop.config import JiraConfig, SlackConfig
from mcp_server.loop.engine import Engine, LoopError
from mcp_server.notify.jira import JiraSink
from mcp_server.notify.outbox import deliver_pending
from mcp_server.notify.slack import SlackSink

from conftest import make_workspace, record_baseline, set_constant
from fakes.fake_jira import FakeJira
from fakes.fake_slack import FakeSlack


@pytest.fixture()
def eng(tmp_path, small_corpus):
    ws = make_workspace(tmp_path / "ws", small_corpus)   # crash_streak threshold: the default, 3
    e = Engine(ws.root)
    yield e
    e.ledger.close()


def _finish(eng: Engine, status: str, **fields) -> dict:
    c = eng.campaign
    e = eng.ledger.start_experiment(c["id"], f"try {status}", commit_sha=c["best_commit"])
    eng.ledger.update_experiment(e, status=status, finished_at=time.time(),
                                 reason=fields.pop("reason", f"{status} reason"), **fields)
    return eng.ledger.experiment(e)


def test_crash_alert_once_per_streak_with_the_real_count(eng):
    record_baseline(eng)
    c = eng.campaign
    for i in range(5):                                   # 5 crashes in a row: one alert, at the 3rd
        eng._after_failure(c, _finish(eng, "crash", reason=f"OOM {i}"), None)
    alerts = eng.ledger.events(kind="crash_streak")
    assert [a["payload"]["count"] for a in alerts] == [3]
    assert alerts[0]["payload"]["last_reason"] == "OOM 2"
    _finish(eng, "ok", val_bpb=2.1)                      # the streak ends
    for i in range(4):                                   # a new streak: a new alert
        eng._after_failure(c, _finish(eng, "timeout", reason=f"slow {i}"), None)
    assert [a["payload"]["count"] for a in eng.ledger.events(kind="crash_streak")] == [3, 3]


def test_alert_counts_the_whole_streak_when_the_threshold_is_reached_late(eng):
    record_baseline(eng)
    c = eng.campaign
    for i in range(4):                                   # crashes recorded before the engine judged them
        _finish(eng, "crash")
    eng._after_failure(c, _finish(eng, "rejected", reason="edits prepare.py"), None)
    [alert] = eng.ledger.events(kind="crash_streak")
    assert alert["payload"]["count"] == 5 and alert["payload"]["threshold"] == 3


def test_budget_end_records_campaign_end_and_jira_closes_with_the_real_baseline(eng):
    record_baseline(eng, (2.00, 2.02))
    c = eng.campaign
    for _ in range(3):
        _finish(eng, "crash")
    outcome.record_if_budget_spent(eng, c)
    assert eng.ledger.events(kind="campaign_end") == []     # budget left: the campaign goes on
    eng.ledger.kv_set("stop_requested", "enough for tonight")   # what `/loopwright stop` records
    outcome.record_if_budget_spent(eng, c)
    outcome.record_if_budget_spent(eng, c)                       # once, however often it is checked
    [end] = eng.ledger.events(kind="campaign_end")
    assert end["payload"]["baseline"] == pytest.approx(2.01)
    assert end["payload"]["reasons"] == ["stop requested: enough for tonight"]
    assert end["payload"]["experiments"] == 3 and end["payload"]["crashed"] == 3
    assert len(eng.ledger.events(kind="budget_spent")) == 1
    with FakeJira(token="t") as fj:
        sink = JiraSink(JiraConfig(server=fj.url, project="LW", auth="token"), eng.ledger, token="t", timeout=2)
        rep = deliver_pending(eng.ledger, None, [sink])
        assert rep.failed == 0, rep
        [(key, issue)] = fj.issues.items()
        closing = fj.comments(key)[-1]
        assert "Campaign ended" in closing and "baseline 2.010000" in closing and "n/a" not in closing
        assert issue["fields"]["status"]["name"] == "Done"
    with FakeSlack("xoxb-t") as fs:
        sink = SlackSink(SlackConfig(channel="C0RESEARCH", base_url=fs.api_url), eng.ledger, token="xoxb-t",
                         timeout=2)
        deliver_pending(eng.ledger, None, [sink])
        ends = [m for m in fs.messages if m["text"].endswith("ended")]
        assert len(ends) == 1 and "baseline 2.0100" in ends[0]["blocks"][1]["text"]["text"]


def test_comment_only_change_is_refused_as_such(eng):
    record_baseline(eng)
    train = eng.ws.root / "train.py"
    src = train.read_text()
    import re
    commented = re.sub(r"^(LR = .*)$", r"\n\n\1    # try a schedule next", src, count=1, flags=re.M)
    train.write_text("# notes\n" + commented + "\n# done\n")
    with pytest.raises(LoopError, match=r"only comments/whitespace changed") as e:
        eng.run_experiment("a comment")
    assert "seed" not in str(e.value)
    train.write_text(src)
    set_constant(train, "LR", "0.00123")                 # a real change is not caught by it
    from mcp_server.loop import verdict
    assert not verdict.comments_only_change(src, train.read_text())


@pytest.mark.parametrize("budget", ["10", "0.5", "29"])
def test_tiny_time_budget_is_refused_with_the_minimum(tmp_path, budget):
    r = subprocess.run([sys.executable, "-m", "mcp_server.cli", "init", str(tmp_path / "w"), "--time-budget", budget],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "at least 30 s" in r.stderr and "start-up included" in r.stderr
    assert not (tmp_path / "w").exists()


def test_time_budget_help_says_what_counts():
    r = subprocess.run([sys.executable, "-m", "mcp_server.cli", "init", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert "start-up" in r.stdout and "wall-clock" in r.stdout and "training seconds" not in r.stdout


# -- item 6 and 7: the reviewer may call the tools it is told to use; the skill says to retry -------
def _front_matter(path):
    text = path.read_text()
    head = text.split("---", 2)[1]
    return dict(line.split(":", 1) for line in head.strip().splitlines()), text.split("---", 2)[2]


def test_reviewer_is_granted_every_loopwright_tool_it_is_told_to_call():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    meta, body = _front_matter(root / "agents" / "reviewer.md")
    granted = {t.strip() for t in meta["tools"].split(",")}
    loop_tools = {"run_experiment", "score", "revert", "budget_check", "state_read", "note", "suggest_next"}
    told = {name for name in re.findall(r"`(\w+)\(", body) if name in loop_tools}
    forbidden = {"run_experiment", "score", "revert"}          # "never call run_experiment, score or revert"
    told -= forbidden
    assert told >= {"state_read"}
    for tool in told:   # under both wirings: the plugin's server name and the workspace's
        assert f"mcp__plugin_loopwright_loopwright__{tool}" in granted, tool
        assert f"mcp__loopwright__{tool}" in granted, tool
    assert not any(g.endswith(f"__{t}") for g in granted for t in forbidden)   # read-only stays read-only
    assert not {"Edit", "Write", "MultiEdit", "NotebookEdit"} & granted


def test_skill_tells_the_agent_to_retry_a_missing_tool_once():
    from pathlib import Path

    text = " ".join((Path(__file__).resolve().parent.parent / "skills" / "research-loop" / "SKILL.md")
                    .read_text().split())
    assert "No such tool available" in text and "retry it once" in text and "unsupported call" in text


# -- item 7: listing the tools needs none of the heavy modules -----------------------------------
def test_listing_tools_imports_no_engine_torch_matplotlib_or_connectors(tmp_path):
    code = ("import sys, asyncio\n"
            "from mcp_server.mcp.server import build_server\n"
            f"srv = build_server({str(tmp_path / 'not-yet')!r}, strict=False)\n"
            "from mcp import Client\n"
            "async def main():\n"
            "    async with Client(srv) as c:\n"
            "        print(len((await c.list_tools()).tools))\n"
            "asyncio.run(main())\n"
            "print(sorted(m for m in ('torch', 'matplotlib', 'slack_sdk', 'jira', 'git', 'numpy',\n"
            "                         'mcp_server.loop.engine', 'mcp_server.loop.gitops') if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    n, heavy = r.stdout.strip().splitlines()[-2:]
    assert int(n) >= 6 and heavy == "[]"


# -- item 8: the stdio server leaves with its client ----------------------------------------------
def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def test_server_exits_when_its_parent_dies_though_stdin_stays_open(tmp_path, small_corpus):
    import os
    import signal

    ws = make_workspace(tmp_path / "ws", small_corpus)
    r_fd, w_fd = os.pipe()            # the server's stdin: this test keeps the write end open throughout
    parent_code = ("import subprocess, sys, time\n"
                   f"p = subprocess.Popen([sys.executable, '-m', 'mcp_server.cli', 'serve', '--workspace', "
                   f"{str(ws.root)!r}], stdin={r_fd}, stdout=subprocess.DEVNULL, "
                   f"stderr=open({str(tmp_path / 'server.err')!r}, 'w'))\n"
                   "print(p.pid, flush=True)\n"
                   "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", parent_code], pass_fds=(r_fd,), stdout=subprocess.PIPE,
                              text=True)
    os.close(r_fd)
    try:
        server = int(parent.stdout.readline())
        deadline = time.time() + 60                     # let it start (it logs its parent)
        while "on stdio for parent process" not in (tmp_path / "server.err").read_text() and time.time() < deadline:
            time.sleep(0.2)
        assert _alive(server)
        os.kill(parent.pid, signal.SIGKILL)             # the client dies without closing the pipe
        parent.wait(10)
        deadline = time.time() + 10
        while _alive(server) and time.time() < deadline:
            time.sleep(0.2)
        assert not _alive(server), "server outlived its parent"
    finally:
        os.close(w_fd)
        if parent.poll() is None:
            parent.kill()


def test_server_exits_when_stdin_closes_during_a_tool_call(tmp_path, small_corpus):
    """A slow call (here a train.py that sleeps) must not keep the server, or its run, alive after EOF."""
    import json

    ws = make_workspace(tmp_path / "ws", small_corpus)
    proc = subprocess.Popen([sys.executable, "-m", "mcp_server.cli", "serve", "--workspace", str(ws.root)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def send(msg):
        proc.stdin.write((json.dumps(msg) + "\n").encode())
        proc.stdin.flush()

    send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})
    proc.stdout.readline()
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
          "params": {"name": "run_experiment", "arguments": {"description": "baseline"}}})
    deadline = time.time() + 60
    train = []
    while not train and time.time() < deadline:          # wait until the baseline's train.py runs
        time.sleep(0.5)
        train = [p for p in _descendants(proc.pid) if _is_train(int(p))]
    assert train, "train.py never started"
    proc.stdin.close()
    proc.wait(15)
    deadline = time.time() + 10
    while any(_alive(int(p)) for p in train) and time.time() < deadline:
        time.sleep(0.2)
    survivors = {p: open(f"/proc/{p}/cmdline", "rb").read()[:200] for p in train if _alive(int(p))}
    assert not survivors, f"the run outlived the server: {survivors}"


import os  # noqa: E402


def _is_train(pid: int) -> bool:
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        return False
    return any(c.endswith(b"train.py") for c in cmd) and _alive(pid)


def _descendants(root: int) -> list[str]:
    parent = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                parent[p] = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1]
            except OSError:
                pass
    out, frontier = [], {str(root)}
    while frontier:
        kids = {p for p, pp in parent.items() if pp in frontier}
        out += kids
        frontier = kids
    return out


# -- item 5: a session whose hooks never fired is noticed -----------------------------------------
def _stand_in_client(path, runs_hooks: bool):
    """A stand-in `codex` for the launcher: like a Codex whose hooks are untrusted, it does its work without
    running them; or, like a trusted one, it runs the guard's SessionStart hook first."""
    hook = (f"printf '%s' '{{\"hook_event_name\": \"SessionStart\", \"session_id\": \"s-1\", \"cwd\": \"'\"$PWD\"'\"}}' "
            f"| {sys.executable} -m mcp_server.guard session-start >/dev/null\n") if runs_hooks else ""
    path.write_text("#!/bin/sh\n" + hook + 'echo \'{"type":"turn.completed","usage":{}}\'\n')
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("runs_hooks", [False, True])
def test_launcher_reports_a_session_whose_hooks_never_ran(tmp_path, small_corpus, monkeypatch, capsys, runs_hooks):
    import json

    from mcp_server.agents import clients
    from mcp_server.agents.launch import launch_session

    ws = make_workspace(tmp_path / "ws", small_corpus)
    monkeypatch.setenv("LOOPWRIGHT_CODEX_BIN", str(_stand_in_client(tmp_path / "codex", runs_hooks)))
    sid = launch_session(ws.root, "codex", max_session_minutes=2)
    with ws.ledger() as ledger:
        detail = json.loads(ledger.session(sid)["detail"])
    err = capsys.readouterr().err
    if runs_hooks:
        assert "hooks_never_ran" not in detail and "never ran" not in err
        assert clients.last_hook_heartbeat(ws.root) is not None
    else:
        assert detail["hooks_never_ran"] is True
        assert "hooks never ran" in err and "/hooks" in err


def test_codex_config_write_refuses_to_double_wire_a_plugin_user(tmp_path, small_corpus):
    ws = make_workspace(tmp_path / "ws", small_corpus)
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text('[plugins."loopwright@loopwright"]\nenabled = true\n')
    env = {**os.environ, "CODEX_HOME": str(home)}
    r = subprocess.run([sys.executable, "-m", "mcp_server.cli", "codex-config", "--write", "-w", str(ws.root)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "plugin is installed for Codex" in r.stderr
    assert "mcp_servers" not in (home / "config.toml").read_text()


# -- items 4-5 and issue 10 item 5 through the CLI: doctor is green for one wiring, red for two ------
def test_doctor_green_for_one_wiring_and_red_for_a_double(tmp_path, small_corpus):
    import json

    ws = make_workspace(tmp_path / "ws", small_corpus)          # wired by its own files (no plugin)
    env = {**os.environ, "CLAUDE_CONFIG_DIR": str(tmp_path / "cc"), "CODEX_HOME": str(tmp_path / "cx")}
    doctor = [sys.executable, "-m", "mcp_server.cli", "doctor", "--skip-server", "-w", str(ws.root)]
    r = subprocess.run(doctor, capture_output=True, text=True, env=env, timeout=300)
    assert "✔ Claude Code: wired by the workspace's own files" in r.stdout
    assert "✔ Claude Code sandbox on" in r.stdout and "✔ Codex permission profile 'loopwright'" in r.stdout
    assert "wired twice" not in r.stdout
    assert f"✔ corpus {small_corpus}: held-out text out of train.py's reach" in r.stdout
    # the README's old double wiring: the plugin installed on top of the workspace's files
    (tmp_path / "cc" / "plugins").mkdir(parents=True)
    (tmp_path / "cc" / "plugins" / "installed_plugins.json").write_text(json.dumps(
        {"version": 2, "plugins": {"loopwright@loopwright": [{"scope": "user"}]}}))
    r = subprocess.run(doctor, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 1 and "✘ Claude Code: wired twice" in r.stdout
    assert "claude plugin disable loopwright@loopwright" in r.stdout
    shown = subprocess.run([sys.executable, "-m", "mcp_server.cli", "wiring", "-w", str(ws.root)],
                           capture_output=True, text=True, env=env, timeout=120)
    assert shown.returncode == 1 and "wired twice" in shown.stdout
    # a workspace made with the plugin installed (auto) carries no copy: green
    ws2 = tmp_path / "ws2"
    made = subprocess.run([sys.executable, "-m", "mcp_server.cli", "init", str(ws2), "--corpus", str(small_corpus)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert made.returncode == 0 and "Claude Code via its plugin" in made.stdout and not made.stderr, made.stderr
    assert not (ws2 / ".mcp.json").exists()
    r = subprocess.run(doctor[:-1] + [str(ws2)], capture_output=True, text=True, env=env, timeout=300)
    assert "✔ Claude Code: loopwright plugin installed" in r.stdout and "wired twice" not in r.stdout
    assert "✔ Claude Code sandbox on" in r.stdout


def test_init_and_doctor_say_the_stdlib_corpus_cannot_stop_a_memorising_train_py(tmp_path):
    """Red team, 2026-12-01: val/test of the stdlib corpus were rebuilt inside the sandbox from the
    interpreter's own sources and memorised (a forged keep). No sandbox that runs Python hides them; a
    user must hear it where the corpus is chosen, and again from doctor."""
    cli = [sys.executable, "-m", "mcp_server.cli"]
    r = subprocess.run([*cli, "init", str(tmp_path / "ws"), "--corpus", "stdlib"], capture_output=True, text=True,
                       timeout=300)   # an option now; the default, stdlib-hidden, hides its val/test modules
    assert r.returncode == 0, r.stderr
    assert "note: the stdlib corpus is for trying loopwright" in r.stdout and "--corpus PATH" in r.stdout
    r = subprocess.run([*cli, "doctor", "--skip-server", "-w", str(tmp_path / "ws")], capture_output=True,
                       text=True, timeout=300)
    assert "corpus stdlib: held-out text readable on this machine" in r.stdout
    assert "memorise them" in r.stdout


def test_init_again_says_a_new_campaign_started_and_plugin_wiring_without_the_plugin_warns(tmp_path, small_corpus):
    """New-user trial: a second `init` silently switched campaigns; `--wiring plugin` with no plugin
    installed printed "via the installed plugin"."""
    cli = [sys.executable, "-m", "mcp_server.cli"]
    env = {**os.environ, "CLAUDE_CONFIG_DIR": str(tmp_path / "cc"), "CODEX_HOME": str(tmp_path / "cx")}
    ws = tmp_path / "ws"
    r = subprocess.run([*cli, "init", str(ws), "--tag", "nov29", "--corpus", str(small_corpus), "--wiring", "plugin"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "the loopwright plugin is not installed for Claude Code" in r.stderr
    assert "the loopwright plugin is not installed for Codex" in r.stderr
    assert "installed plugin" not in r.stdout
    r = subprocess.run([*cli, "init", str(ws), "--tag", "dec01"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "new campaign 'dec01' on branch loopwright/dec01" in r.stdout and "git checkout loopwright/nov29" in r.stdout


# -- issue 24 item 11: the client sandbox's placeholder files do not block an honest agent ---------
def _repo_with_train(root):
    from mcp_server.loop import gitops

    (root / ".claude").mkdir(parents=True)
    (root / ".claude" / "settings.json").write_text("{}\n")
    (root / "train.py").write_text("LR = 0.01\n")
    gitops.init_repo_and_pin(root, "pin")
    (root / "train.py").write_text("LR = 0.02\n")
    return gitops


@pytest.mark.unit
def test_empty_sandbox_placeholders_are_ignored_and_stay_out_of_the_commit(tmp_path):
    gitops = _repo_with_train(tmp_path)
    # what Claude Code's bubblewrap sandbox leaves while a command runs in the background: it mounts /dev/null
    # over each write-denied path that does not exist, and bwrap makes the mount point on the host (the
    # client removes them once no sandboxed command runs; bwrap alone leaves them, so it makes them here)
    rels = (".bashrc", ".bash_profile", ".profile", ".gitmodules", ".mcp.json", ".claude/agents",
            ".claude/commands", ".claude/settings.local.json", ".vscode")
    import shutil

    if shutil.which("bwrap"):
        binds = [a for rel in rels for a in ("--ro-bind", "/dev/null", str(tmp_path / rel))]
        subprocess.run(["bwrap", "--bind", "/", "/", "--dev", "/dev", *binds, "true"], check=True, timeout=60)
    else:
        for rel in rels:
            (tmp_path / rel).write_bytes(b"")
    assert all((tmp_path / rel).is_file() for rel in rels)
    sha, _ = gitops.commit_editable(tmp_path, ["train.py"], ".loopwright", "LR")
    assert sha
    changed = subprocess.run(["git", "-C", str(tmp_path), "show", "--name-only", "--format=", sha],
                             capture_output=True, text=True, check=True).stdout.split()
    assert changed == ["train.py"]          # the placeholders are not committed, so no run ever sees them


@pytest.mark.unit
@pytest.mark.parametrize("rel,content", [
    (".bashrc", b"python -c 'import os'\n"),     # a planted profile with content
    (".claude/agents/evil.md", b""),             # inside the placeholder's name, not the placeholder
    ("torch.py", b""),                           # an empty module file shadows an import
    ("prepare/__init__.py", b""),
    (".bashrc.d", b""),
])
def test_planted_files_are_still_refused(tmp_path, rel, content):
    gitops = _repo_with_train(tmp_path)
    (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / rel).write_bytes(content)
    with pytest.raises(gitops.GitError, match="untracked files in the workspace"):
        gitops.commit_editable(tmp_path, ["train.py"], ".loopwright", "LR")


@pytest.mark.unit
def test_a_symlink_at_a_placeholder_name_is_refused(tmp_path):
    gitops = _repo_with_train(tmp_path)
    (tmp_path / ".bashrc").symlink_to("/dev/null")
    with pytest.raises(gitops.GitError, match=r"\.bashrc"):
        gitops.commit_editable(tmp_path, ["train.py"], ".loopwright", "LR")


# -- issue 24 item 9: doctor flags a plugin whose MCP server cannot start from this PATH ------------
def _install_in_claude(config, root):
    """What `claude plugin install` records (Claude Code 2.1.x: installed_plugins.json, version 2)."""
    import json

    (config / "plugins").mkdir(parents=True)
    (config / "plugins" / "installed_plugins.json").write_text(json.dumps({"version": 2, "plugins": {
        "loopwright@loopwright": [{"scope": "user", "installPath": str(root), "version": "0.1.0"}]}}))


def _bare_path(tmp_path):
    import shutil

    bare = tmp_path / "bare-bin"
    bare.mkdir()
    (bare / "sh").symlink_to(shutil.which("sh"))
    return str(bare)


@pytest.mark.unit
def test_doctor_flags_the_checkout_plugin_when_loopwright_is_not_on_path(tmp_path, monkeypatch, capsys):
    import shutil
    from pathlib import Path

    from mcp_server.cli.doctor import run_doctor

    repo = Path(__file__).resolve().parent.parent
    cached = tmp_path / "cache" / "loopwright"          # Claude Code's copy of the checkout's plugin
    shutil.copytree(repo / "bin", cached / "bin")
    shutil.copy2(repo / ".mcp.json", cached / ".mcp.json")
    _install_in_claude(tmp_path / "claude", cached)
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(tmp_path / "claude"))
    monkeypatch.setenv("PATH", _bare_path(tmp_path))
    monkeypatch.delenv("LOOPWRIGHT_PYTHON", raising=False)
    monkeypatch.chdir(tmp_path)
    assert run_doctor(None, skip_server=True) == 1
    out = capsys.readouterr().out
    assert "✘ Claude Code: the loopwright plugin's MCP server launcher finds no loopwright" in out, out
    assert "loopwright plugin install" in out


@pytest.mark.unit
def test_doctor_passes_a_plugin_written_by_plugin_install_and_flags_a_vanished_interpreter(tmp_path):
    import json
    import sys

    from mcp_server.agents.plugin import plugin_checks, write_plugin

    write_plugin(tmp_path / "plugin", sys.executable)
    _install_in_claude(tmp_path / "claude", tmp_path / "plugin")
    env = {"CLAUDE_CONFIG_DIR": str(tmp_path / "claude"), "PATH": _bare_path(tmp_path), "HOME": str(tmp_path)}
    (finding,) = plugin_checks(env)
    assert finding.ok and "resolves" in finding.what, finding
    mcp = tmp_path / "plugin" / ".mcp.json"
    data = json.loads(mcp.read_text())
    data["mcpServers"]["loopwright"]["command"] = str(tmp_path / "old-venv" / "bin" / "python")
    mcp.write_text(json.dumps(data))
    (finding,) = plugin_checks(env)
    assert not finding.ok and "not found" in finding.what and "loopwright plugin install" in finding.fix


@pytest.mark.unit
def test_plugin_install_refuses_a_folder_that_is_not_its_own(tmp_path):
    import sys

    from mcp_server.agents.plugin import PluginError, write_plugin

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(PluginError, match="not empty"):
        write_plugin(tmp_path, sys.executable)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    write_plugin(tmp_path / "p", sys.executable)
    write_plugin(tmp_path / "p", sys.executable)          # its own: replaced
    assert (tmp_path / "p" / ".mcp.json").is_file()


# -- issue 24 item 8: the README's set-up commands and plugin order agree with the code -------------
@pytest.mark.unit
def test_readme_setup_and_plugin_order_agree_with_the_code():
    import re
    from pathlib import Path

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    repo = Path(__file__).resolve().parent.parent
    readme = (repo / "README.md").read_text()
    clients = (repo / "docs" / "clients.md").read_text()     # the walk-throughs moved out of the README

    def section(title, text=readme):
        start = text.index(f"\n## {title}")
        end = text.find("\n## ", start + 1)
        return text[start:end if end >= 0 else len(text)]

    demo, tests = re.findall(r"```bash\n(.*?)\n```", section("Set up"), re.S)[:2]
    assert demo.endswith("loopwright demo") and "download.pytorch.org/whl/cpu" in demo
    assert '".[dev]"' in tests and tests.endswith("python -m pytest -q")
    dev = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert any(d.startswith("ray[client]") for d in dev)       # tests/test_ray_cluster.py connects by ray://
    for needed in ("Python ≥ 3.10", "bubblewrap socat", "python -m pytest -m unit -q"):
        assert needed in " ".join(section("Set up").split()), needed
    # init wires each client once (auto: the plugin where it is installed), so the plugin comes first
    for title, where in (("The first hour", clients), ("Using it from Claude Code", clients),
                         ("Using it from Codex", clients), ("Using it from Claude Code", readme),
                         ("Using it from Codex", readme)):
        text = section(title, where)
        installs = [m.start() for m in re.finditer(r"(claude|codex) plugin (install|add) loopwright@", text)]
        assert installs and installs[0] < text.index("loopwright init ~/lw"), title


@pytest.mark.unit
def test_readme_is_a_short_front_page_and_every_doc_link_resolves():
    """Issue 25 item 8: the README stays a product page (detail lives in docs/), and a moved section leaves
    no link pointing at a file that is gone."""
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    assert len((repo / "README.md").read_text().splitlines()) <= 250
    pages = [repo / "README.md", repo / "BENCHMARKS.md", repo / "AGENTS.md", *sorted((repo / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(repo)} -> {target}")
    assert not broken, broken


@pytest.mark.unit
def test_doctor_checks_the_codex_plugin_copy_too(tmp_path):
    import shutil
    import sys
    from pathlib import Path

    from mcp_server.agents.plugin import plugin_checks, write_plugin

    repo = Path(__file__).resolve().parent.parent
    home = tmp_path / "codex"
    (home).mkdir()
    (home / "config.toml").write_text('[plugins."loopwright@loopwright"]\nenabled = true\n')
    cached = home / "plugins" / "cache" / "loopwright" / "loopwright" / "0.1.0"   # what `codex plugin add` copies
    shutil.copytree(repo / "bin", cached / "bin")
    shutil.copytree(repo / ".codex-plugin", cached / ".codex-plugin")
    env = {"CODEX_HOME": str(home), "CLAUDE_CONFIG_DIR": str(tmp_path / "none"), "PATH": _bare_path(tmp_path),
           "HOME": str(tmp_path)}
    (finding,) = plugin_checks(env)
    assert not finding.ok and finding.what.startswith("Codex:") and "finds no loopwright" in finding.what, finding
    shutil.rmtree(cached)
    write_plugin(cached, sys.executable)
    (finding,) = plugin_checks(env)
    assert finding.ok and sys.executable in finding.what, finding


@pytest.mark.unit
def test_the_written_plugin_guard_blocks_when_its_python_is_gone(tmp_path):
    import json

    from mcp_server.agents.plugin import plugin_files

    hooks = json.loads(plugin_files(str(tmp_path / "gone" / "bin" / "python"))["hooks/hooks.json"])["hooks"]
    r = subprocess.run(["/bin/sh", "-c", hooks["PreToolUse"][0]["hooks"][0]["command"]], input="{}",
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, (r.returncode, r.stderr)      # blocks in Claude Code and Codex alike
