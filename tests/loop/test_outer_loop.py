"""The bilevel outer loop: mechanisms written at run time are validated in a sandbox, activated on
trial, consulted by the inner loop's suggest_next, and kept or reverted by their measured effect.

Workspaces are real (git, SQLite); the inner experiments of a trial are synthetic ledger rows
(the trial logic reads only the ledger), so no model is trained here.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from mcp_server.mechanisms import registry, suggest, trial, validate
from mcp_server.mechanisms.trial import Obs, evaluate

from conftest import BENCH, make_workspace

TRAIN = (BENCH / "train.py").read_text()

GOOD = '''
def advise(history, source):
    """Least-explored category first."""
    counts = {}
    for t in history["trials"]:
        counts[t["category"]] = counts.get(t["category"], 0) + 1
    cats = sorted({c["category"] for c in history["constants"]})
    if not cats:
        return {}
    cat = min(cats, key=lambda c: (counts.get(c, 0), c))
    return {"category": cat, "parameters": [c["name"] for c in history["constants"] if c["category"] == cat],
            "force": True, "note": "least explored: " + cat}
'''

BAD = {
    "missing_package": ("import numpy_turbo_search\n\ndef advise(history, source):\n    return {}\n",
                        "not installed"),
    "endless_loop": ("def advise(history, source):\n    n = 0\n    while True:\n        n += 1\n",
                     "did not finish within the deadline"),
    "writes_a_file": ("def advise(history, source):\n    with open('/tmp/lw-mech-out', 'w') as f:\n"
                      "        f.write('x')\n    return {}\n", "calls open()"),
    "opens_a_socket": ("import socket\n\ndef advise(history, source):\n"
                       "    socket.create_connection(('example.com', 80))\n    return {}\n",
                       "imports 'socket', which reaches the network"),
}


# --------------------------------------------------------------------------- validation

@pytest.mark.parametrize("case", sorted(BAD))
def test_validation_rejects_bad_mechanisms_with_a_clear_reason(case):
    code, expected = BAD[case]
    t0 = time.monotonic()
    v = validate.validate(case, code, TRAIN, case_deadline_s=0.5)
    assert not v.ok and expected in v.reason, v.reason
    assert time.monotonic() - t0 < 15
    assert not Path("/tmp/lw-mech-out").exists()


def test_validation_accepts_a_good_mechanism_and_the_shipped_library():
    v = validate.validate("least_explored", GOOD, TRAIN)
    assert v.ok, v.reason
    assert v.samples["plateau"]["category"] in {"schedule", "regularisation", "batch", "architecture", "optimizer"}
    assert v.samples["no-constants"] == {}
    for name, code in registry.library_code().items():
        assert validate.validate(name, code, TRAIN).ok, name


def test_malformed_answers_and_exceptions_are_rejected():
    v = validate.validate("warp", "def advise(h, s):\n    return {'category': 'warp drive'}\n", TRAIN)
    assert not v.ok and "is not a category" in v.reason
    v = validate.validate("div", "def advise(h, s):\n    return {'note': str(1 / len(h['trials']))}\n", TRAIN)
    assert not v.ok and "ZeroDivisionError" in v.reason and "empty history" in v.reason


def test_the_sandbox_itself_blocks_writes_and_the_network():
    """What the static checks would catch, run straight in the sandbox: the process cannot write a
    file (read-only root, RLIMIT_FSIZE 0) nor connect anywhere (no network namespace)."""
    how, _ = validate.isolation()
    target = Path("/tmp/lw-sandbox-probe")   # the sandbox's /tmp is private: try a real path too
    code = (f"def advise(h, s):\n    open({str(BENCH / 'sandbox-probe.txt')!r}, 'w').write('x')\n    return {{}}\n")
    res = validate.run_sandboxed("w", code, [{"label": "x", "history": {}, "source": ""}], 10)
    assert not res.cases[0].ok and ("Read-only" in res.cases[0].error or "File size" in res.cases[0].error
                                    or "Errno" in res.cases[0].error), res.cases[0].error
    assert not (BENCH / "sandbox-probe.txt").exists() and not target.exists()
    if "network is NOT isolated" in how:
        pytest.skip(how)
    code = "import socket\ndef advise(h, s):\n    socket.create_connection(('127.0.0.1', 22), timeout=2)\n"
    res = validate.run_sandboxed("n", code, [{"label": "x", "history": {}, "source": ""}], 10)
    assert not res.cases[0].ok and ("Network is unreachable" in res.cases[0].error
                                    or "refused" in res.cases[0].error), res.cases[0].error


def test_the_sandbox_limits_a_mechanisms_memory_descriptors_and_cpu():
    """The limits the mechanism's process runs under (sandbox.limited): its memory (MEMORY_MB), 32 descriptors,
    and CPU seconds by the deadline (a spin is stopped, not waited for)."""
    case = [{"label": "x", "history": {}, "source": ""}]
    code = "def advise(h, s):\n    b = bytearray(1 << 30)\n    return {}\n"
    res = validate.run_sandboxed("m", code, case, 10)
    assert not res.cases or not res.cases[0].ok, res
    assert "MemoryError" in (res.cases[0].error if res.cases else res.stderr), res
    code = "import os\ndef advise(h, s):\n    return {'note': str([os.dup(0) for _ in range(64)])}\n"
    res = validate.run_sandboxed("f", code, case, 10)
    assert res.cases and not res.cases[0].ok and "Too many open files" in res.cases[0].error, res
    t0 = time.monotonic()
    res = validate.run_sandboxed("spin", "def advise(h, s):\n    while True:\n        pass\n", case, 3)
    assert res.timed_out and not any(c.ok for c in res.cases) and time.monotonic() - t0 < 30, res


# --------------------------------------------------------------------------- trial logic (pure)

def _obs(start: int, pattern: str, gain: float = 0.02, hours: float = 0.1) -> list[Obs]:
    """k = keep, d = discard, c = crash."""
    return [Obs(start + i, ch == "k", gain if ch == "k" else 0.0, hours, ch == "c") for i, ch in enumerate(pattern)]


def test_evaluate_tells_a_helpful_from_a_harmful_mechanism():
    before = _obs(1, "kddddddddkdd")           # 2 keeps in 12: the record
    helpful = evaluate(before, _obs(20, "kdkdkd"))
    harmful = evaluate(before, _obs(20, "dcdccd"))
    assert helpful.outcome == "kept" and "helped" in helpful.reason
    assert harmful.outcome == "reverted" and "did not help" in harmful.reason
    lo, hi = helpful.stats["keep_rate_diff_ci95"]
    assert lo < 0.5 - 2 / 12 < hi   # the interval contains the observed difference
    assert harmful.stats["failed"] == 3
    # equal gain per hour and keep rate: not a help
    same = evaluate(_obs(1, "kdd"), _obs(10, "kdd"))
    assert same.outcome == "reverted"
    # small windows are flagged as weak evidence
    assert "weak evidence" in evaluate(_obs(1, "dddd"), _obs(10, "kd")).reason


# --------------------------------------------------------------------------- on a real workspace

@pytest.fixture()
def ws(tmp_path, small_corpus):
    return make_workspace(tmp_path / "ws", small_corpus)


def _engine(ws):
    from mcp_server.loop.engine import Engine
    return Engine(ws.root)


def add_rows(ws, pattern: str, start_val: float | None = None, hours: float = 0.05) -> None:
    """Synthetic finished experiments: a baseline first if none, then k(eep)/d(iscard)/c(rash)."""
    with ws.ledger() as led:
        c = led.campaign()
        rows = led.experiments(c["id"])
        now = time.time()
        if not rows:
            for v in (2.000, 2.002):
                led.start_experiment(c["id"], "baseline", commit_sha=c["pinned_commit"],
                                     parent_commit=c["pinned_commit"], is_baseline=1, status="ok",
                                     verdict="baseline", val_bpb=v, finished_at=now)
        kept = [r["val_bpb"] for r in led.experiments(c["id"]) if r["verdict"] == "keep"]
        best = min(kept) if kept else 2.001
        for i, ch in enumerate(pattern):
            if ch == "k":
                best -= 0.02
            status = "crash" if ch == "c" else "ok"
            eid = led.start_experiment(c["id"], f"synthetic {ch}{i}", commit_sha=c["pinned_commit"],
                                       parent_commit=c["pinned_commit"], status=status,
                                       verdict={"k": "keep", "d": "discard", "c": None}[ch],
                                       val_bpb=None if ch == "c" else (best if ch == "k" else best + 0.03),
                                       finished_at=now)
            led.conn.execute("UPDATE experiments SET started_at=? WHERE id=?", (now - hours * 3600, eid))


def test_trial_on_a_synthetic_ledger_keeps_the_helpful_and_reverts_the_harmful(ws):
    add_rows(ws, "kdddddddkddd")
    with _engine(ws) as eng:
        for name in ("helper", "harm"):
            assert registry.propose(eng, name, GOOD, "test").valid
        registry.activate(eng, "helper", window=4)
        assert trial.tick(eng) is None            # the window is not full yet
    add_rows(ws, "kdkk")
    with _engine(ws) as eng:
        d = trial.tick(eng)
        assert d.outcome == "kept", d.reason
        registry.activate(eng, "harm", window=4)
    add_rows(ws, "dcdd")
    with _engine(ws) as eng:
        d = trial.tick(eng)
        assert d.outcome == "reverted", d.reason
        status = {m["name"]: m["status"] for m in registry.listing(eng.ledger)}
        assert status["helper"] == "kept" and status["harm"] == "reverted"
        kinds = [e["kind"] for e in eng.ledger.events() if e["kind"].startswith("mechanism_")]
        assert kinds.count("mechanism_kept") == 1 and kinds.count("mechanism_reverted") == 1
    # the report: what was tried, kept, reverted and why, and the gain of each era
    from mcp_server.report.writer import write_report
    md = write_report(ws.root).markdown.read_text()
    assert "## Search mechanisms (outer loop)" in md and "In use: helper v1 (kept)" in md
    era = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
           for line in md.splitlines() if line.startswith("| ") and ("v1 |" in line or "only |" in line)}
    assert era["helper v1"][:3] == ["kept", "4", "3"] and era["harm v1"][:3] == ["reverted", "4", "0"]
    assert era["built-in mechanisms only"][1:3] == ["12", "2"]
    assert float(era["helper v1"][4]) > float(era["built-in mechanisms only"][4]) > 0 == float(era["harm v1"][4])
    from mcp_server.notify.slack import render
    title, blocks = render("mechanism_reverted", kinds and {"name": "harm", "version": 1,
                                                             "reason": d.reason}, "t")
    assert title == "Search mechanism harm v1 reverted · t" and "did not help" in blocks[1]["text"]["text"]


def test_a_mechanism_that_fails_in_use_is_skipped_and_reverted_without_slowing_the_loop(ws):
    add_rows(ws, "dd")
    hang = ("def advise(history, source):\n    if any('boom' in t['description'] for t in history['trials']):\n"
            "        while True:\n            pass\n    return {'note': 'fine'}\n")
    with _engine(ws) as eng:
        assert registry.propose(eng, "hang", hang, "test").valid
        registry.activate(eng, "hang", window=3)
        assert suggest(eng).mechanisms[0].note == "fine"
        eng.ledger.start_experiment(eng.campaign["id"], "boom", status="ok", verdict="discard", val_bpb=2.1,
                                    finished_at=time.time(), commit_sha=eng.campaign["pinned_commit"],
                                    parent_commit=eng.campaign["pinned_commit"])
        t0 = time.monotonic()
        s = suggest(eng)
        assert time.monotonic() - t0 < validate.USE_DEADLINE_S + 3
        assert s.mechanisms[0].error and "deadline" in s.mechanisms[0].error
        assert any("failed and was reverted" in w for w in s.warnings)
        assert s.category is not None                # the built-in mechanisms still answered
        assert eng.ledger.mechanism(name="hang")["status"] == "reverted"
        assert eng.ledger.trials()[0]["outcome"] == "failed"
        t0 = time.monotonic()
        assert suggest(eng).mechanisms == []         # not consulted again
        assert time.monotonic() - t0 < 2.5


def test_code_is_in_the_state_dir_and_a_changed_file_is_refused(ws):
    with _engine(ws) as eng:
        res = registry.propose(eng, "least", GOOD, "test")
        path = registry.mechanisms_dir(ws) / "least" / "v1.py"
        assert path.read_text() == GOOD and not str(path).startswith(str(ws.root / "train"))
        path.chmod(0o644)
        path.write_text(GOOD + "\n# changed\n")
        with pytest.raises(registry.MechanismError, match="changed after validation"):
            registry.activate(eng, "least")
        assert res.version == 1 and registry.propose(eng, "least", GOOD, "again").version == 2


def test_builtin_outer_loop_installs_the_library_and_allocates_trials(ws):
    add_rows(ws, "kdddd")
    with _engine(ws) as eng:
        first = trial.outer_step(eng, window=2)
        assert first in registry.library_code()
        assert trial.outer_step(eng, window=2) is None     # its trial is running
    add_rows(ws, "dd")
    with _engine(ws) as eng:
        second = trial.outer_step(eng, window=2)            # first reverted (no keep); an untried one next
        assert second not in (None, first)
        assert eng.ledger.mechanism(name=first)["status"] == "reverted"
        tried = {t["name"] for t in eng.ledger.trials()}
        assert tried == {first, second}


# --------------------------------------------------------------------------- over MCP stdio

async def _tools(params) -> tuple[list[str], object]:
    from mcp import Client
    from mcp.client.stdio import stdio_client
    async with Client(stdio_client(params)) as client:
        return sorted(t.name for t in (await client.list_tools()).tools), None


def _params(root: Path, level: str):
    from mcp import StdioServerParameters
    from mcp.client.stdio import get_default_environment
    env = get_default_environment()
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    env["LOOPWRIGHT_HOME"] = os.environ["LOOPWRIGHT_HOME"]   # where the test's state directories are
    return StdioServerParameters(command=sys.executable, args=["-m", "mcp_server.cli", "serve", "--level", level,
                                                               "--workspace", str(root)], env=env)


@pytest.mark.timeout(180)
def test_outer_flow_over_the_real_mcp_stdio_servers(ws):
    """The outer server's tools (and only there), then: trace_read, a rejected and a valid proposal,
    activation; the inner server's suggest_next shows the advice; reverted when it does not help."""
    import anyio
    from mcp import Client
    from mcp.client.stdio import stdio_client

    from mcp_server.mcp.outer import OUTER_TOOLS

    add_rows(ws, "kddddddd")

    async def flow():
        out: dict = {}
        async with Client(stdio_client(_params(ws.root, "outer"))) as outer:
            out["outer_tools"] = sorted(t.name for t in (await outer.list_tools()).tools)
            tr = (await outer.call_tool("trace_read", {"limit": 5})).structured_content
            out["trace"] = tr
            bad = await outer.call_tool("mechanism_propose", {"name": "net", "code": BAD["opens_a_socket"][0],
                                                              "rationale": "phone home"})
            out["bad"] = bad.structured_content
            good = await outer.call_tool("mechanism_propose", {"name": "least", "code": GOOD,
                                                               "rationale": "plateau: explore elsewhere"})
            out["good"] = good.structured_content
            act = await outer.call_tool("mechanism_activate", {"name": "least", "window": 3})
            out["act"] = act.structured_content
        async with Client(stdio_client(_params(ws.root, "inner"))) as inner:
            out["inner_tools"] = sorted(t.name for t in (await inner.list_tools()).tools)
            out["suggest"] = (await inner.call_tool("suggest_next", {})).structured_content
        add_rows(ws, "ddd")
        async with Client(stdio_client(_params(ws.root, "outer"))) as outer:
            out["list"] = (await outer.call_tool("mechanisms_list", {})).structured_content
        return out

    out = anyio.run(flow)
    assert out["outer_tools"] == sorted(OUTER_TOOLS)
    assert not set(OUTER_TOOLS) & set(out["inner_tools"]) and "suggest_next" in out["inner_tools"]
    d = out["trace"]["diagnostics"]
    assert out["trace"]["experiments_since_keep"] == 7 and d["current_plateau"]
    assert d["plateaus"][0]["length"] == 7 and d["repeat_count"] >= 6   # same train.py every time
    assert out["bad"]["valid"] is False and "socket" in out["bad"]["reason"]
    assert out["good"]["valid"] is True and out["act"]["window"] == 3
    mech = out["suggest"]["mechanisms"]
    assert mech[0]["name"] == "least" and mech[0]["status"] == "active" and mech[0]["forced"]
    assert out["suggest"]["decided_by"] == "least" and out["suggest"]["category"] == mech[0]["category"]
    least = next(m for m in out["list"]["mechanisms"] if m["name"] == "least")
    assert least["status"] == "reverted" and least["trials"][0]["outcome"] == "reverted"
    assert "did not help" in least["trials"][0]["reason"]


# --------------------------------------------------------------------------- the real Claude Code

@pytest.mark.realclient
@pytest.mark.timeout(360)
def test_claude_code_runs_an_outer_session(tmp_path, small_corpus, monkeypatch):
    """`launch_session(level="outer")` runs the real Claude Code, driven by a scripted fake model: it
    reads the trace, proposes a mechanism that validates and activates it. The inner loop's
    suggest_next then follows its advice; after a trial window without a keep it is reverted."""
    from mcp_server.agents.launch import launch_session

    from e2e_support import h, use_environment
    from realclients.fake_anthropic import FakeAnthropic, ToolUse

    claude = h.require_binary("claude")
    ws = make_workspace(tmp_path / "ws", small_corpus)
    add_rows(ws, "kddddddd")
    t = "mcp__loopwright_outer__"
    seen: dict = {}

    def result(req, key):
        res = req.last_tool_results()[0]
        assert not res.is_error, res.text
        seen[key] = json.loads(res.text)

    def after_trace(req):
        result(req, "trace")
        return ToolUse(t + "mechanism_propose", {"name": "least", "code": GOOD,
                                                 "rationale": "7 experiments without a keep on one category"})

    def after_propose(req):
        result(req, "propose")
        return ToolUse(t + "mechanism_activate", {"name": "least", "window": 3})

    def after_activate(req):
        result(req, "activate")
        return "Activated least on a 3-experiment trial."

    script = [ToolUse(t + "trace_read", {"limit": 10}), after_trace, after_propose, after_activate]
    with FakeAnthropic(script) as fake:
        env = h.claude_env(tmp_path / "client", fake.url, {"LOOPWRIGHT_CLAUDE_BIN": claude,
                                                           "LOOPWRIGHT_HOME": os.environ["LOOPWRIGHT_HOME"]})
        env.pop("IS_SANDBOX", None)
        use_environment(monkeypatch, env)
        sid = launch_session(ws.root, "claude", trigger="manual", max_session_minutes=4, level="outer")
    assert not fake.errors, fake.errors
    assert fake.turns_served == list(range(len(script))), fake.turns_served
    assert seen["trace"]["diagnostics"]["current_plateau"] is True
    assert seen["propose"]["valid"] is True and seen["activate"]["window"] == 3

    with ws.ledger() as led:
        session = led.session(sid)
        assert session["exit_code"] == 0 and json.loads(session["detail"])["level"] == "outer"
        log = json.loads(session["detail"])["log"]
    events = [json.loads(line) for line in (ws.root / log / "events.jsonl").read_text().splitlines()
              if line.startswith("{")]   # the log is in the state dir (an absolute path) or the workspace
    init = next(e for e in events if e.get("subtype") == "init")
    assert init["mcp_servers"] == [{"name": "loopwright_outer", "status": "connected"}]
    assert not {"Edit", "Write", "Bash"} & set(init["tools"])   # the outer session edits nothing
    assert not any(name.startswith("mcp__loopwright__") for name in init["tools"])

    with _engine(ws) as eng:
        s = suggest(eng)             # the inner loop consults it
        assert s.decided_by == "least" and s.mechanisms[0].name == "least"
    add_rows(ws, "ddd")              # its trial window: no keep
    with _engine(ws) as eng:
        suggest(eng)
        row = eng.ledger.mechanism(name="least")
        assert row["status"] == "reverted" and "did not help" in row["reason"]
        assert row["author"] == f"session {sid}"


def test_builtin_outer_session_and_codex_outer_wiring(ws):
    """`launch --level outer --agent builtin` runs one step of the built-in outer loop, recorded as a
    session; Codex gets the outer server (and only it) under its own name."""
    from mcp_server.agents.launch import codex_overrides, launch_session

    add_rows(ws, "kdd")
    sid = launch_session(ws.root, "builtin", trigger="manual", max_session_minutes=2, level="outer")
    with ws.ledger() as led:
        assert led.session(sid)["exit_code"] == 0, led.session(sid)["detail"]
        active = led.mechanisms(("active",))
    assert len(active) == 1 and active[0]["name"] in registry.library_code() and active[0]["author"] == "builtin-outer"
    over = " ".join(codex_overrides(ws.root, sys.executable, 600, level="outer"))
    assert 'mcp_servers.loopwright_outer.args=["-m", "mcp_server.cli", "serve", "--level", "outer"' in over
    assert "mcp_servers.loopwright." not in over


def test_a_schedule_entry_can_start_an_outer_session(ws):
    """[[schedule]] level = "outer": the cron starter launches an outer session (here the built-in one)."""
    from mcp_server.loop.config import ScheduleConfig
    from mcp_server.triggers.cron import default_starter

    with pytest.raises(ValueError):
        ScheduleConfig(cron="0 * * * *", level="middle")
    add_rows(ws, "dd")
    default_starter(ws.root)(ScheduleConfig(cron="0 * * * *", agent="builtin", level="outer"), "test fire")
    with ws.ledger() as led:
        s = led.sessions()[-1]
        assert s["trigger"] == "cron" and json.loads(s["detail"])["level"] == "outer" and s["exit_code"] == 0
        assert [m["author"] for m in led.mechanisms(("active",))] == ["builtin-outer"]
