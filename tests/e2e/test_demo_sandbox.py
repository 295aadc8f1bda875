"""The demo runs on a fresh machine without bubblewrap (its built-in agent writes no code); every other
path still refuses to run train.py unsandboxed without the human's opt-out."""
import io

import pytest
from rich.console import Console

from mcp_server.cli.demo import _sandbox_or_notice
from mcp_server.loop import sandbox


@pytest.fixture
def no_sandbox(monkeypatch):
    monkeypatch.setitem(sandbox._CACHE, "info", sandbox.SandboxInfo("none", None, "bubblewrap (bwrap) is not installed"))
    monkeypatch.setenv(sandbox.UNSAFE_ENV, "")   # registered, so the value the demo sets is undone after the test


def test_demo_without_a_sandbox_says_so_and_runs_unsandboxed(no_sandbox):
    with pytest.raises(sandbox.SandboxUnavailable, match="install bubblewrap"):
        sandbox.require()                       # what an agent-driven experiment meets
    out = io.StringIO()
    _sandbox_or_notice(Console(file=out, width=200))
    assert "no OS sandbox here (bubblewrap (bwrap) is not installed)" in out.getvalue()
    assert sandbox.unsafe_requested()           # the demo's own MCP server inherits the opt-out
    assert sandbox.require().kind == "none"


def test_demo_with_a_sandbox_keeps_it(monkeypatch):
    monkeypatch.setitem(sandbox._CACHE, "info", sandbox.SandboxInfo("bwrap", "/usr/bin/bwrap", "bubblewrap"))
    monkeypatch.setenv(sandbox.UNSAFE_ENV, "")   # registered, so the value the demo sets is undone after the test
    out = io.StringIO()
    _sandbox_or_notice(Console(file=out, width=200))
    assert out.getvalue() == "" and not sandbox.unsafe_requested()


# --------------------------------------------------------------------------- end to end, bwrap absent from PATH

def _path_without_bwrap(dest):
    """A PATH with every program of today's PATH except bwrap (symlinks in one folder)."""
    import os

    dest.mkdir()
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if not d or not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            src = os.path.join(d, name)
            if name != "bwrap" and not (dest / name).exists() and os.access(src, os.X_OK):
                (dest / name).symlink_to(src)
    return str(dest)


@pytest.mark.parametrize("command", ["demo", "run"])
def test_without_bwrap_on_path_the_demo_and_unsafe_run_complete(tmp_path, small_corpus, command):
    """The opt-out reaches the built-in agent's MCP server (a subprocess started with the SDK's reduced
    environment): it used to refuse the first run, and the demo crashed with 'internal error'."""
    import os
    import subprocess
    import sys

    from e2e_support import experiments, fast_workspace

    root = fast_workspace(tmp_path, small_corpus, max_experiments=10)
    env = {**os.environ, "PATH": _path_without_bwrap(tmp_path / "bin")}
    env.pop(sandbox.UNSAFE_ENV, None)
    assert subprocess.run(["sh", "-c", "command -v bwrap"], env=env, capture_output=True).returncode != 0
    args = ([str(root), "-n", "1"] if command == "demo" else
            ["--unsafe-no-sandbox", "--workspace", str(root), "-n", "1"])
    proc = subprocess.run([sys.executable, "-m", "mcp_server.cli", command, *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "internal error" not in out and "refused" not in out
    assert ("no OS sandbox here" if command == "demo" else "--unsafe-no-sandbox") in out
    rows = experiments(root)
    assert len(rows) >= 2 and all(r["status"] == "ok" for r in rows), rows   # the baseline and one candidate
    import json

    assert {json.loads(r["metrics_json"])["sandboxed"] for r in rows} == {0}


# --------------------------------------------------------------------------- capped by work, not wall time

def test_the_demo_runs_its_four_experiments_however_little_wall_time_it_has(tmp_path, small_corpus):
    """A busy machine made the 6-minute demo stop after its baseline with 0 experiments; the wall-clock cap now
    stops only experiments after the first four. Here the allowance (0.6 s) is over before the baseline ends:
    four experiments still run, the fifth does not."""
    from mcp_server.cli.demo import run_demo

    from e2e_support import fast_workspace

    root = fast_workspace(tmp_path, small_corpus, max_experiments=20)
    out = io.StringIO()
    res = run_demo(root, n=5, minutes=0.01, console=Console(file=out, width=300), live=False)
    text = out.getvalue()
    assert "plan: the baseline on 1 seed(s), then 5 experiment(s) of 1 training run(s) each: ~6 runs" in text
    assert len(res.session.attempts) == 4, text[-2000:]
    assert "session time budget" in res.session.stopped_because


def test_a_demo_that_ran_no_experiment_says_so(tmp_path, small_corpus):
    """No verdict about changes never tried: the budget here holds the baseline's run only."""
    from mcp_server.cli.demo import run_demo

    from e2e_support import fast_workspace

    root = fast_workspace(tmp_path, small_corpus, max_experiments=1)
    out = io.StringIO()
    res = run_demo(root, n=4, console=Console(file=out, width=300), live=False)
    text = out.getvalue()
    assert res.session.attempts == []
    assert "no experiment ran (stopped: budget: experiment budget spent (1/1)" in text
    assert "no change cleared" not in text.lower()
    report = (res.report_dir / "report.md").read_text()
    assert "No experiment ran yet" in report and "No change cleared" not in report
