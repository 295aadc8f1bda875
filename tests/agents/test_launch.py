"""mcp_server.agents.launch: headless sessions of the real claude / codex (scripted fake model) and
the built-in agent, started by a cron fire or `loopwright launch`, recorded in the ledger.

The realclient tests start sessions the way the cron daemon does (Scheduler + default_starter
with an injected clock): the launcher reads the client settings from the process environment,
which each test points at a fake model server in an isolated HOME / CLAUDE_CONFIG_DIR /
CODEX_HOME. IS_SANDBOX is removed: the launcher must work as root without bypassPermissions.
"""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from mcp_server.agents import launch
from mcp_server.agents.launch import LaunchError, launch_session
from mcp_server.common.facts import HOOK_MATCHER
from mcp_server.loop.config import ScheduleConfig
from mcp_server.loop.workspace import Workspace
from mcp_server.triggers.cron import Scheduler, default_starter

from e2e_support import REPO, fast_workspace, h, seed_baseline, use_environment
from e2e_support import experiments as _experiments
from realclients.fake_anthropic import FakeAnthropic, ToolUse
from realclients.fake_openai import FakeOpenAI, McpCall

OLD_LR, NEW_LR = "LR = 0.0002", "LR = 0.004"
SECRET = "lw-secret-3f9c1d7e2b"


def _sessions(root: Path) -> list[dict]:
    with Workspace.open(root).ledger() as ledger:
        return ledger.sessions()


def _session_end_events(root: Path) -> list[dict]:
    with Workspace.open(root).ledger() as ledger:
        return ledger.events(kind="session_end")


def _log_events(root: Path, session: dict) -> list[dict]:
    log = root / json.loads(session["detail"])["log"] / "events.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def _tree_contains(root: Path, needle: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def _live_processes_with(**wanted: str) -> list[int]:
    """Live processes whose environment has all of wanted (the session's group leaves none)."""
    found = []
    needles = {f"{k}={v}".encode() for k, v in wanted.items()}
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            if needles <= set(env.read_bytes().split(b"\0")):
                stat = (env.parent / "stat").read_text().rsplit(")", 1)[1].split()
                if stat[0] not in ("Z", "X"):
                    found.append(int(env.parent.name))
        except (OSError, IndexError):
            continue
    return found


# --------------------------------------------------------------------------- pure functions

def test_hook_matcher_is_the_plugins():
    hooks = json.loads((REPO / "hooks" / "hooks.json").read_text())["hooks"]
    assert hooks["PreToolUse"][0]["matcher"] == HOOK_MATCHER


def test_codex_overrides_parse_as_toml_and_wire_server_and_hooks(tmp_path):
    args = launch.codex_overrides(tmp_path, "/opt/py 3/bin/python", 900)
    pairs = dict(a.split("=", 1) for a in args[1::2])
    assert args[0::2] == ["-c"] * len(pairs)
    parsed = {k: tomllib.loads(f"v = {v}")["v"] for k, v in pairs.items()}
    assert parsed["mcp_servers.loopwright.command"] == "/opt/py 3/bin/python"
    assert parsed["mcp_servers.loopwright.args"][-2:] == ["--workspace", str(tmp_path)]
    assert parsed["mcp_servers.loopwright.required"] is True
    assert parsed["mcp_servers.loopwright.tool_timeout_sec"] == 900
    assert parsed["mcp_servers.loopwright.default_tools_approval_mode"] == "approve"
    pre = parsed["hooks.PreToolUse"][0]
    assert pre["matcher"] == HOOK_MATCHER
    assert pre["hooks"][0]["command"] == "'/opt/py 3/bin/python' -m mcp_server.guard pre-tool-use"
    assert parsed["hooks.Stop"][0]["hooks"][0]["command"].endswith("mcp_server.guard stop")


def test_redactor_masks_secret_environment_values():
    redact = launch.Redactor({"MY_API_KEY": SECRET, "GITHUB_TOKEN": "ghp_abcdef123", "HOME": "/home/x",
                              "SHORT_TOKEN": "abc"})
    text = f"key={SECRET} gh=ghp_abcdef123 home=/home/x short=abc"
    assert redact(text) == "key=*** gh=*** home=/home/x short=abc"


def test_codex_cost_from_usage_and_price():
    price = launch.parse_price("input=2, cached_input=0.5, output=8")
    p = launch.CodexParser(price)
    for ev in ({"type": "item.completed", "item": {"type": "error"}},
               {"type": "item.completed", "item": {"type": "mcp_tool_call"}},
               {"type": "item.completed", "item": {"type": "agent_message"}},
               {"type": "turn.completed", "usage": {"input_tokens": 1_000_000, "cached_input_tokens": 400_000,
                                                     "output_tokens": 10_000}}):
        p.feed(ev)
    out = p.outcome()
    assert out.cost_usd == pytest.approx(0.6 * 2 + 0.4 * 0.5 + 0.01 * 8)
    assert out.turns == 2 and out.info["usage"]["input_tokens"] == 1_000_000
    assert launch.CodexParser(None).outcome().cost_usd == 0.0
    with pytest.raises(LaunchError, match="unknown key 'dollars'"):
        launch.parse_price("dollars=3")


def test_claude_command_line(tmp_path):
    (tmp_path / ".claude").mkdir()
    (tmp_path / ".claude" / "settings.json").write_text("{}")
    (tmp_path / ".mcp.json").write_text("{}")
    argv = launch.claude_argv("claude", tmp_path, "go", 1.25, ["--model", "sonnet"])
    assert argv[:3] == ["claude", "-p", "go"]
    flag = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}
    assert flag["--permission-mode"] == "acceptEdits" and flag["--setting-sources"] == "project"
    assert flag["--mcp-config"] == str(tmp_path / ".mcp.json") and "--strict-mcp-config" in argv
    assert flag["--max-budget-usd"] == "1.2500" and flag["--output-format"] == "stream-json"
    allowed = flag["--allowedTools"].split(",")
    assert {f"mcp__loopwright__{t}" for t in launch.MCP_TOOLS} <= set(allowed) and "Edit" in allowed
    assert argv[-2:] == ["--model", "sonnet"]
    assert "--max-budget-usd" not in launch.claude_argv("claude", tmp_path, "go", None, [])
    (tmp_path / ".mcp.json").unlink()
    with pytest.raises(LaunchError, match="lacks .mcp.json"):
        launch.claude_argv("claude", tmp_path, "go", None, [])


def test_claude_launch_of_a_plugin_wired_workspace_brings_its_own_server_and_hooks_once(tmp_path):
    """A plugin-wired workspace has no .mcp.json and no hooks; `--setting-sources project` keeps the user's
    plugin out, so the launcher passes the server and the hooks from the state dir: exactly one copy."""
    from mcp_server.agents import clients

    root, state = tmp_path / "ws", tmp_path / "state"
    clients.apply_wiring(root, "/usr/bin/python3", state, "plugin")
    argv = launch.claude_argv("claude", root, "go", None, [], state)
    flag = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}
    assert flag["--setting-sources"] == "project"
    servers = json.loads(open(flag["--mcp-config"]).read())["mcpServers"]
    assert list(servers) == ["loopwright"] and str(root) in servers["loopwright"]["args"]
    hooks = json.loads(open(flag["--settings"]).read())["hooks"]
    assert {"PreToolUse", "Stop", "SessionStart"} == set(hooks)
    assert open(flag["--mcp-config"]).name.startswith(str(state))         # out of the agent's reach
    # a workspace-wired one: its own files, no second copy of the hooks
    clients.apply_wiring(root, "/usr/bin/python3", state, "workspace")
    argv = launch.claude_argv("claude", root, "go", None, [], state)
    assert "--settings" not in argv and argv[argv.index("--mcp-config") + 1] == str(root / ".mcp.json")


# --------------------------------------------------------------------------- refusals (nothing starts)

@pytest.fixture(scope="module")
def idle_ws(tmp_path_factory, small_corpus) -> Path:
    return fast_workspace(tmp_path_factory.mktemp("idle"), small_corpus)


def test_refuses_when_the_budget_says_stop(idle_ws):
    with Workspace.open(idle_ws).ledger() as ledger:
        ledger.kv_set("stop_requested", "by the test")
    try:
        with pytest.raises(LaunchError, match=r"budget says stop \(stop requested: by the test\).*stop --clear"):
            launch_session(idle_ws, "claude", trigger="cron")
    finally:
        with Workspace.open(idle_ws).ledger() as ledger, ledger.tx() as c:
            c.execute("DELETE FROM kv WHERE key LIKE 'stop_requested%' OR key LIKE 'budget_spent%'")
    assert _sessions(idle_ws) == [] and _session_end_events(idle_ws) == []


def test_refuses_an_unknown_agent_or_a_missing_binary(idle_ws, monkeypatch, tmp_path):
    with pytest.raises(LaunchError, match="unknown agent 'gpt'"):
        launch_session(idle_ws, "gpt")
    monkeypatch.setenv("LOOPWRIGHT_CODEX_BIN", str(tmp_path / "no-such-codex"))
    with pytest.raises(LaunchError, match="LOOPWRIGHT_CODEX_BIN=.*no-such-codex is not an executable.*@openai/codex"):
        launch_session(idle_ws, "codex")
    monkeypatch.delenv("LOOPWRIGHT_CLAUDE_BIN", raising=False)
    only_git = tmp_path / "bin"              # a PATH with git (the engine needs it) and no claude
    only_git.mkdir()
    (only_git / "git").symlink_to(shutil.which("git"))
    monkeypatch.setenv("PATH", str(only_git))
    with pytest.raises(LaunchError, match="`claude` is not on PATH"):
        launch_session(idle_ws, "claude")
    assert _sessions(idle_ws) == []


# --------------------------------------------------------------------------- cron fires, real clients

def _fire_cron(root: Path, agent: str):
    """A Scheduler with an injected clock: first tick initialises, the next one (an hour later)
    starts the session for the 11:00 fire through the default starter (= launch_session)."""
    schedule = ScheduleConfig(cron="0 * * * *", agent=agent, max_session_minutes=6)
    now = [datetime(2026, 11, 30, 10, 30, tzinfo=timezone.utc).timestamp()]
    ws = Workspace.open(root)
    sched = Scheduler([schedule], ws.state_dir / "cron.json", ws.state_dir / "session.lock",
                      default_starter(root), clock=lambda: now[0])
    assert [r.outcome for r in sched.run_once()] == ["initialized"]
    now[0] += 3600
    results = sched.run_once()
    assert [r.outcome for r in results] == ["started"], results
    return results[0]


def _check_recorded(root: Path, agent: str, *, turns: int, cost: float, experiments: int = 1) -> dict:
    (session,) = _sessions(root)
    assert (session["agent"], session["trigger"], session["exit_code"]) == (agent, "cron", 0), session
    assert session["ended_at"] >= session["started_at"]
    assert session["turns"] == turns and session["cost_usd"] == pytest.approx(cost)
    detail = json.loads(session["detail"])
    assert detail["trigger_detail"] == "cron '0 * * * *' (UTC) fire 2026-11-30T11:00:00+00:00"
    rows = _experiments(root)[1:]        # after the recorded baseline
    assert len(rows) == experiments and all(r["status"] == "ok" and r["verdict"] for r in rows), rows
    (event,) = _session_end_events(root)
    assert event["payload"] == {"agent": agent, "trigger": "cron", "exit_code": 0, "cost_usd": session["cost_usd"],
                                "turns": turns, "experiments": experiments,
                                "kept": sum(r["verdict"] == "keep" for r in rows)}
    return session


@pytest.mark.realclient
@pytest.mark.timeout(300)
def test_cron_fire_runs_a_claude_session(tmp_path, small_corpus, monkeypatch):
    """Unattended permissions and records, without training (the end-to-end tests train): every
    loopwright tool call and the edit of train.py go through acceptEdits + --allowedTools with no
    prompt and no denial; the Stop hook sends the agent back once, then its self-limit lets it go."""
    h.require_binary("claude")   # skip (fail with CI=true) before building the workspace
    root = fast_workspace(tmp_path, small_corpus)
    seed_baseline(root)
    train = root / "train.py"
    t = "mcp__loopwright__"
    script = [
        ToolUse(t + "state_read", {"view": "summary"}),
        ToolUse("Bash", {"command": "echo token=$LW_TEST_API_TOKEN"}),
        ToolUse(t + "run_experiment", {"description": "nothing changed yet"}),
        ToolUse("Read", {"file_path": str(train)}),
        ToolUse("Edit", {"file_path": str(train), "old_string": OLD_LR, "new_string": NEW_LR}),
        ToolUse(t + "score", {}),
        "Nothing more this time.",
        "Stopping.",
    ]
    with FakeAnthropic(script) as fake:
        env = h.claude_env(tmp_path / "client", fake.url, {"LOOPWRIGHT_CLAUDE_BIN": h.require_binary("claude"),
                                                           "LW_TEST_API_TOKEN": SECRET,
                                                           "LOOPWRIGHT_STOP_MAX_IDLE_BLOCKS": "1"})
        env.pop("IS_SANDBOX")
        use_environment(monkeypatch, env)
        _fire_cron(root, "claude")
    assert not fake.errors, fake.errors
    assert fake.turns_served == list(range(len(script))), fake.turns_served
    results = {r.tool_use_id: r for r in fake.message_requests()[-1].tool_results()}
    assert '"tag":"t"' in results["toolu_lw_00_0"].text
    assert "identical to the best version" in results["toolu_lw_02_0"].text    # the loop answered, not a prompt
    assert not results["toolu_lw_04_0"].is_error and NEW_LR in train.read_text()
    assert "nothing to score" in results["toolu_lw_05_0"].text
    assert "Budget remains" in fake.message_requests()[-1].user_texts_after_last_assistant()

    events = _log_events(root, _sessions(root)[0])
    init = next(e for e in events if e.get("subtype") == "init")
    assert init["permissionMode"] == "acceptEdits"
    assert init["mcp_servers"] == [{"name": "loopwright", "status": "connected"}]   # the workspace's .mcp.json
    result = next(e for e in events if e.get("type") == "result")
    assert result["subtype"] == "success" and result["permission_denials"] == []
    assert result["total_cost_usd"] > 0          # computed by claude from the fake's token counts
    _check_recorded(root, "claude", turns=result["num_turns"], cost=result["total_cost_usd"], experiments=0)
    # a secret of the launcher's environment never reaches the agent (an allow-list), nor any record
    assert "token=***" not in json.dumps(events) and "token=" in json.dumps(events)
    assert _tree_contains(root / ".loopwright", SECRET.encode()) == []


@pytest.mark.realclient
@pytest.mark.timeout(300)
def test_cron_fire_runs_a_codex_session(tmp_path, small_corpus, monkeypatch):
    """No experiment this time: the agent reads the state, notes something, finds nothing to score
    and tries to stop twice. The Stop hook sends it back once (budget remains); its self-limit
    (LOOPWRIGHT_STOP_MAX_IDLE_BLOCKS) then lets the session end — Codex itself never would."""
    import tomli_w

    h.require_binary("codex")
    root = fast_workspace(tmp_path, small_corpus)
    seed_baseline(root)
    script = [
        McpCall("loopwright", "state_read", {"view": "summary"}),
        McpCall("loopwright", "note", {"text": "scheduled check-in", "kind": "observation"}),
        McpCall("loopwright", "score", {}),
        "Nothing to try this time.",
        "Still nothing to try.",
    ]
    with FakeOpenAI(script) as fake:
        env = h.codex_env(tmp_path / "client", {"LOOPWRIGHT_CODEX_BIN": h.require_binary("codex"),
                                                "LOOPWRIGHT_CODEX_PRICE": "input=2,cached_input=0.5,output=8",
                                                "LOOPWRIGHT_STOP_MAX_IDLE_BLOCKS": "1"})
        config = h.codex_config(fake.url, config={"features": {"plugins": False, "shell_snapshot": False}})
        (Path(env["CODEX_HOME"]) / "config.toml").write_text(tomli_w.dumps(config))
        use_environment(monkeypatch, env)
        _fire_cron(root, "codex")
    assert not fake.errors, fake.errors
    assert fake.turns_served == list(range(len(script))), fake.turns_served
    last = fake.response_requests()[-1]
    outputs = {o.call_id: o.text for o in last.tool_outputs()}
    assert '"tag":"t"' in outputs["call_lw_000_0"].replace(" ", "")
    assert '"note_id"' in outputs["call_lw_001_0"]
    # score is annotated destructive: approved for the run, so the loop itself answers
    assert "nothing to score" in outputs["call_lw_002_0"], outputs["call_lw_002_0"]
    assert "Budget remains" in last.user_texts_after_last_model_item()

    events = _log_events(root, _sessions(root)[0])
    usage: dict = {}
    for e in events:
        if e.get("type") == "turn.completed":
            for k, v in e["usage"].items():
                usage[k] = usage.get(k, 0) + v
    cost = ((usage["input_tokens"] - usage["cached_input_tokens"]) * 2 + usage["cached_input_tokens"] * 0.5
            + usage["output_tokens"] * 8) / 1e6
    agent_items = [e for e in events if e.get("type") == "item.completed" and e["item"]["type"] != "error"]
    assert len(agent_items) == len(script)
    session = _check_recorded(root, "codex", turns=len(agent_items), cost=cost, experiments=0)
    assert cost > 0 and json.loads(session["detail"])["usage"] == usage


# --------------------------------------------------------------------------- failures are recorded too

class _Stall:
    """A model turn that never comes (until released): the client waits on its first request."""

    def __init__(self):
        self.reached, self.release = threading.Event(), threading.Event()

    def __call__(self, req):
        self.reached.set()
        self.release.wait(120)
        return "too late"


def _launch_cli(root: Path, env: dict, minutes: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mcp_server.cli", "launch", "--agent", "claude", "-w", str(root),
                             "--max-minutes", minutes], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _claude_env_for_launch(tmp_path: Path, fake) -> dict:
    env = h.claude_env(tmp_path / "client", fake.url, {"LOOPWRIGHT_CLAUDE_BIN": h.require_binary("claude")})
    env.pop("IS_SANDBOX")
    return env


@pytest.mark.realclient
@pytest.mark.timeout(200)
def test_wall_clock_limit_kills_the_process_group_and_records_it(idle_ws, tmp_path):
    """`loopwright launch` with a 0.25 min limit; the model never answers."""
    stall = _Stall()
    before = len(_sessions(idle_ws))
    with FakeAnthropic([stall]) as fake:
        try:
            proc = _launch_cli(idle_ws, _claude_env_for_launch(tmp_path, fake), "0.25")
            out, err = proc.communicate(timeout=150)
        finally:
            stall.release.set()
    (s,) = _sessions(idle_ws)[before:]
    assert stall.reached.is_set()                                          # it did reach the model
    assert proc.returncode == 1, out + err
    assert f"session {s['id']} (claude, manual): exit 124" in out and "wall-clock limit" in out
    assert s["exit_code"] == 124 and s["trigger"] == "manual"
    assert 14 <= s["ended_at"] - s["started_at"] < 60
    detail = json.loads(s["detail"])
    assert detail["killed"].startswith("wall-clock limit of 0.25 min") and detail["result"] is None
    # client, MCP server, hooks: nothing of the session's process group is left
    assert _live_processes_with(LOOPWRIGHT_SESSION_ID=str(s["id"]), LOOPWRIGHT_WORKSPACE=str(idle_ws)) == []
    assert _session_end_events(idle_ws)[-1]["payload"]["exit_code"] == 124


@pytest.mark.realclient
@pytest.mark.timeout(200)
def test_sigterm_to_the_launcher_kills_the_session_and_records_it(idle_ws, tmp_path):
    stall = _Stall()
    before = len(_sessions(idle_ws))
    with FakeAnthropic([stall]) as fake:
        try:
            proc = _launch_cli(idle_ws, _claude_env_for_launch(tmp_path, fake), "5")
            assert stall.reached.wait(90), "claude never called the model"
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
        finally:
            stall.release.set()
    assert proc.returncode == 143, out + err
    (s,) = _sessions(idle_ws)[before:]
    assert s["exit_code"] == 130 and s["ended_at"] - s["started_at"] < 100
    assert "launcher interrupted" in json.loads(s["detail"])["killed"]
    assert _live_processes_with(LOOPWRIGHT_SESSION_ID=str(s["id"]), LOOPWRIGHT_WORKSPACE=str(idle_ws)) == []


@pytest.mark.realclient
@pytest.mark.timeout(200)
def test_a_client_that_fails_is_recorded_with_its_exit_code(idle_ws, tmp_path, monkeypatch):
    import tomli_w

    def broken(req):
        raise RuntimeError("model endpoint down")

    before = len(_sessions(idle_ws))
    with FakeOpenAI([broken]) as fake:
        env = h.codex_env(tmp_path / "client", {"LOOPWRIGHT_CODEX_BIN": h.require_binary("codex")})
        config = h.codex_config(fake.url, config={"features": {"plugins": False, "shell_snapshot": False}})
        (Path(env["CODEX_HOME"]) / "config.toml").write_text(tomli_w.dumps(config))
        use_environment(monkeypatch, env)
        sid = launch_session(idle_ws, "codex", trigger="webhook", detail="github issue_comment",
                             max_session_minutes=2)
    (s,) = _sessions(idle_ws)[before:]
    assert s["id"] == sid and s["exit_code"] not in (0, None) and s["trigger"] == "webhook"
    detail = json.loads(s["detail"])
    assert "model endpoint down" in detail.get("turn_failed", "") + detail.get("stderr_tail", ""), detail
    assert detail["trigger_detail"] == "github issue_comment"
    assert _session_end_events(idle_ws)[-1]["payload"]["exit_code"] == s["exit_code"]


# --------------------------------------------------------------------------- the built-in agent

@pytest.mark.slow
@pytest.mark.timeout(400)
def test_builtin_session_runs_the_proposer(tmp_path, small_corpus):
    from mcp_server.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    if "run" not in sub.choices:
        pytest.skip("`loopwright run --agent builtin` is not registered yet (mcp_server/proposer.py)")
    root = fast_workspace(tmp_path, small_corpus)
    seed_baseline(root)
    sid = launch_session(root, "builtin", trigger="manual", max_session_minutes=5)
    (s,) = _sessions(root)
    assert s["id"] == sid and s["exit_code"] == 0, s
    rows = _experiments(root)
    # one candidate, run and scored (beside it: the baseline and any reference runs its pairing needed)
    cands = [r for r in rows if not r["is_baseline"]]
    assert len(cands) == 1 and cands[0]["status"] == "ok" and cands[0]["verdict"] is not None, rows
    assert s["turns"] == 1 and s["cost_usd"] == 0
    assert _session_end_events(root)[-1]["payload"]["experiments"] == 1
    assert (root / json.loads(s["detail"])["log"] / "events.jsonl").is_file()   # its output, kept


# --------------------------------------------------------------------------- the session's environment

CONNECTOR_SECRETS = {"SLACK_BOT_TOKEN": "xoxb-connector-token-1", "JIRA_API_TOKEN": "jira-connector-token-2",
                     "JIRA_EMAIL": "approver@example.com", "SLACK_SIGNING_SECRET": "slack-signing-3",
                     "LOOPWRIGHT_JIRA_SECRET": "jira-signing-4", "LOOPWRIGHT_WEBHOOK_SECRET": "hook-secret",
                     "LOOPWRIGHT_GITHUB_SECRET": "gh-signing-5", "GITHUB_TOKEN": "ghp_other-service-6",
                     "DB_PASSWORD": "hunter2-other-7", "LOOPWRIGHT_EXTRA_TOKEN": "lw-named-token-8",
                     "AWS_SECRET_ACCESS_KEY": "aws-not-bedrock-9"}
CLIENT_NEEDS = {"ANTHROPIC_API_KEY": "sk-ant-client-own-key", "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",
                "CLAUDE_CONFIG_DIR": "/tmp/claude-config", "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8",
                "HTTPS_PROXY": "http://proxy.invalid:3128", "SSL_CERT_FILE": "/etc/ssl/certs/ca.pem",
                "LOOPWRIGHT_STOP_MAX_IDLE_BLOCKS": "3", "TERM": "xterm"}


def test_agent_environment_is_an_allow_list():
    from mcp_server.agents.agent_env import agent_environment
    from mcp_server.loop.config import JiraConfig, LoopwrightConfig

    base = {"PATH": "/usr/bin", "HOME": "/home/u", **CONNECTOR_SECRETS, **CLIENT_NEEDS,
            "OPENAI_API_KEY": "sk-openai", "MY_JIRA_PAT": "renamed-connector-token", "RANDOM_VAR": "x",
            "LOOPWRIGHT_CLIENT_ENV": "RANDOM_VAR,MY_JIRA_PAT,SLACK_BOT_TOKEN"}
    cfg = LoopwrightConfig(jira=JiraConfig(server="https://jira.invalid", project="LW", token_env="MY_JIRA_PAT",
                                           email_env="JIRA_EMAIL"))
    claude = agent_environment("claude", base, cfg)
    assert not set(claude) & (set(CONNECTOR_SECRETS) | {"MY_JIRA_PAT", "OPENAI_API_KEY"}), claude
    assert {k: claude[k] for k in CLIENT_NEEDS} == CLIENT_NEEDS and claude["PATH"] == "/usr/bin"
    assert claude["RANDOM_VAR"] == "x"                       # listed by the person; connector names never
    codex = agent_environment("codex", base, cfg)
    assert codex["OPENAI_API_KEY"] == "sk-openai" and "ANTHROPIC_API_KEY" not in codex
    builtin = agent_environment("builtin", base, cfg)
    assert "ANTHROPIC_API_KEY" not in builtin and "OPENAI_API_KEY" not in builtin and builtin["HOME"] == "/home/u"
    bedrock = agent_environment("claude", {**base, "CLAUDE_CODE_USE_BEDROCK": "1"}, cfg)
    assert bedrock["AWS_SECRET_ACCESS_KEY"] == "aws-not-bedrock-9"   # Claude's own credential on Bedrock


def test_codex_gets_the_key_its_model_provider_names(tmp_path):
    from mcp_server.agents.agent_env import agent_environment

    (tmp_path / "config.toml").write_text('[model_providers.corp]\nname = "corp"\nenv_key = "CORP_LLM_KEY"\n')
    env = agent_environment("codex", {"CODEX_HOME": str(tmp_path), "CORP_LLM_KEY": "k", "SLACK_BOT_TOKEN": "t"})
    assert env == {"CODEX_HOME": str(tmp_path), "CORP_LLM_KEY": "k"}


def _stand_in_client(tmp_path: Path) -> tuple[Path, Path]:
    """A `claude` that dumps its environment and that of a child it starts (as its MCP server and hooks
    are), then reports a result the way claude -p does."""
    out = tmp_path / "dumps"
    out.mkdir()
    exe = tmp_path / "bin" / "claude"
    exe.parent.mkdir()
    exe.write_text(f"""#!{sys.executable}
import json, os, subprocess, sys
out = {str(out)!r}
sid = os.environ.get("LOOPWRIGHT_SESSION_ID", "x")
json.dump(dict(os.environ), open(os.path.join(out, sid + "-client.json"), "w"))
subprocess.run([sys.executable, "-c", "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))",
                os.path.join(out, sid + "-child.json")], check=True)
print(json.dumps({{"type": "result", "subtype": "success", "num_turns": 1, "total_cost_usd": 0.0}}))
""")
    exe.chmod(0o755)
    return exe, out


def _check_dumps(out: Path, sid: int) -> dict:
    client = json.loads((out / f"{sid}-client.json").read_text())
    child = json.loads((out / f"{sid}-child.json").read_text())
    for env in (client, child):
        leaked = {k for k, v in env.items() if v in CONNECTOR_SECRETS.values()} | (set(env) & set(CONNECTOR_SECRETS))
        assert not leaked, leaked
        assert {k: env.get(k) for k in CLIENT_NEEDS} == CLIENT_NEEDS       # what the client needs still comes
        assert env["LOOPWRIGHT_SESSION_ID"] == str(sid) and env["LOOPWRIGHT_HOME"] and env["PATH"]
    return client


@pytest.fixture
def env_ws(tmp_path, small_corpus, monkeypatch):
    from conftest import make_workspace

    ws = make_workspace(tmp_path / "ws", small_corpus)
    exe, out = _stand_in_client(tmp_path)
    for k, v in {**CONNECTOR_SECRETS, **CLIENT_NEEDS, "LOOPWRIGHT_CLAUDE_BIN": str(exe)}.items():
        monkeypatch.setenv(k, v)
    return ws.root, out


def test_a_cli_launch_passes_no_connector_secret_to_the_client_or_its_children(env_ws):
    import os

    root, out = env_ws
    r = subprocess.run([sys.executable, "-m", "mcp_server.cli", "launch", "--agent", "claude", "-w", str(root)],
                       env=dict(os.environ), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    (s,) = _sessions(root)
    _check_dumps(out, s["id"])


def test_a_cron_launch_passes_no_connector_secret(env_ws):
    root, out = env_ws
    _fire_cron(root, "claude")
    (s,) = _sessions(root)
    assert s["exit_code"] == 0
    _check_dumps(out, s["id"])


def test_a_webhook_launch_passes_no_connector_secret(env_ws):
    import time as _time

    from starlette.testclient import TestClient

    from mcp_server.triggers.webhook import create_app, generic_signature

    root, out = env_ws
    app = create_app(root)
    ts, body = str(int(_time.time())), b"{}"
    r = TestClient(app).post("/hook", content=body, headers={
        "X-Loopwright-Timestamp": ts, "X-Loopwright-Delivery": "env-1",
        "X-Loopwright-Signature": generic_signature(CONNECTOR_SECRETS["LOOPWRIGHT_WEBHOOK_SECRET"], ts, body)})
    assert r.status_code == 202, r.text
    assert app.state.runner.wait(120)
    (s,) = _sessions(root)
    assert s["trigger"] == "webhook" and s["exit_code"] == 0, s
    _check_dumps(out, s["id"])


def test_the_launcher_delivers_during_the_session_with_tokens_the_session_never_sees(tmp_path, small_corpus,
                                                                                      monkeypatch):
    """The session's environment has no connector token, so its MCP server cannot post; the launcher
    (which has it) runs delivery passes while the client runs: an event recorded mid-session is
    delivered before the client exits."""
    from mcp_server.loop import settings as setmod

    from conftest import make_workspace
    from fakes.fake_slack import FakeSlack

    token = "xoxb-courier-token"
    out = tmp_path / "seen.txt"
    exe = tmp_path / "claude"
    exe.write_text(f"""#!{sys.executable}
import json, os, time
from mcp_server.loop.workspace import Workspace
ws = Workspace.open(os.environ["LOOPWRIGHT_WORKSPACE"])
with ws.ledger() as led:
    eid = led.add_event(led.campaign()["id"], "plateau", {{"experiments_since_keep": 9}}, ["slack"])
state = "pending"
for _ in range(3000):                     # bounded by polls; the launcher's pass comes every 0.1 s
    with ws.ledger() as led:
        if any(d["event_id"] == eid and d["status"] == "delivered" for d in led.deliveries()):
            state = "delivered"
            break
    time.sleep(0.05)
open({str(out)!r}, "w").write(state + " token-seen=" + str("SLACK_BOT_TOKEN" in os.environ))
print(json.dumps({{"type": "result", "subtype": "success", "num_turns": 1, "total_cost_usd": 0}}))
""")
    exe.chmod(0o755)
    with FakeSlack(token) as slack:
        ws = make_workspace(tmp_path / "ws", small_corpus)
        s = setmod.load(ws.settings_path)
        for key, value in (("slack.channel", "C0RESEARCH"), ("slack.base_url", slack.api_url)):
            s = setmod.set_value(s, key, value)
        setmod.save(ws.settings_path, s)
        for k, v in {"SLACK_BOT_TOKEN": token, "LOOPWRIGHT_CLAUDE_BIN": str(exe),
                     "LOOPWRIGHT_DELIVER_EVERY_S": "0.1"}.items():
            monkeypatch.setenv(k, v)
        launch_session(ws.root, "claude", trigger="manual", max_session_minutes=5)
        assert out.read_text() == "delivered token-seen=False"
        assert any("Plateau" in m.get("text", "") for m in slack.messages), slack.messages
