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
