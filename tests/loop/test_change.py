"""An experiment's structured change (loop/change.py, Change in loop/models.py): validated with a clear
error, checked against train.py before anything runs, stored in the ledger and returned by the MCP tools."""
from __future__ import annotations

import pytest

from mcp_server.loop.change import as_change, check_against
from mcp_server.loop.errors import LoopError
from mcp_server.loop.models import Change
from mcp_server.mechanisms.source import constant_values
from tests.conftest import make_workspace, record_baseline, set_constant

BEFORE = b"LR = 0.004  # learning rate\nQK_NORM = False\nD_MODEL = 64\nOPT = 'adamw'\n"


@pytest.mark.parametrize("bad,needle", [
    ({"name": "LR", "old": 0.004}, "new: Field required"),
    ({"name": "LR", "old": 0.004, "new": 0.004}, "that is not a change"),
    ({"name": "LR", "old": 0.004, "new": 0.008, "why": "x"}, "why: Extra inputs are not permitted"),
    ({"name": "LR 2", "old": 0.004, "new": 0.008}, "name: String should match pattern"),
    ({"name": "LR", "old": [1], "new": 0.008}, "old"),
    ({"name": "LR", "old": "", "new": 0.008}, "1 to 200 characters"),
    ("LR 0.004 -> 0.008", "valid dictionary"),
])
def test_a_bad_change_says_what_is_wrong_and_how_to_give_it(bad, needle):
    with pytest.raises(LoopError) as e:
        as_change(bad)
    assert needle in str(e.value) and '{"name": "LR", "old": 0.004, "new": 0.008}' in str(e.value)


def test_a_change_keeps_its_value_types():
    assert as_change(None) is None
    c = as_change({"name": "QK_NORM", "old": False, "new": True})
    assert c == Change(name="QK_NORM", old=False, new=True) and c.new is True
    assert type(as_change({"name": "D_MODEL", "old": 64, "new": 128}).new) is int
    assert as_change({"name": "QK_NORM", "old": 0, "new": False}) is not None   # 0 and False differ in kind


def test_a_change_must_agree_with_train_py():
    after = BEFORE.replace(b"LR = 0.004", b"LR = 0.008").replace(b"QK_NORM = False", b"QK_NORM = True")
    check_against(Change(name="LR", old=0.004, new=0.008), BEFORE, after, "train.py")
    check_against(Change(name="LR", old="0.004", new="0.008"), BEFORE, after, "train.py")   # as written
    check_against(Change(name="QK_NORM", old=False, new=True), BEFORE, after, "train.py")
    check_against(Change(name="OPT", old="adamw", new="muon"), BEFORE, after, "train.py")  # not a literal constant
    for wrong in (Change(name="LR", old=0.004, new=0.016), Change(name="LR", old=0.002, new=0.008),
                  Change(name="QK_NORM", old=0, new=1), Change(name="D_MODEL", old=64, new=128)):
        with pytest.raises(LoopError, match=rf"change says {wrong.name} .* but train.py has {wrong.name} = "):
            check_against(wrong, BEFORE, after, "train.py")
    with pytest.raises(LoopError, match="no LR now"):
        check_against(Change(name="LR", old=0.004, new=0.008), BEFORE, b"QK_NORM = False\n", "train.py")


def test_run_experiment_refuses_a_change_train_py_does_not_show_before_anything_runs(tmp_path, small_corpus):
    from mcp_server.loop.engine import Engine

    ws = make_workspace(tmp_path / "ws", small_corpus)
    with Engine(ws.root) as eng:
        record_baseline(eng)
        c = eng.campaign
        n = eng.ledger.count_experiments(c["id"])
        set_constant(ws.root / "train.py", "LR", "0.016")   # the bundled LR is 0.008
        with pytest.raises(LoopError, match="change says LR 0.008 -> 0.032"):
            eng.run_experiment("LR up", change={"name": "LR", "old": 0.008, "new": 0.032})
        with pytest.raises(LoopError, match="leave change out with confirm_of"):
            eng.run_experiment("confirm", confirm_of=1, change={"name": "LR", "old": 0.004, "new": 0.008})
        with pytest.raises(LoopError, match="not a change"):
            eng.run_experiment("LR", change={"name": "LR", "old": 0.004, "new": 0.004})
        assert eng.ledger.count_experiments(c["id"]) == n               # nothing recorded, nothing ran
        assert eng.ledger.candidates(c["id"]) == []


async def test_the_tools_take_store_and_return_the_change(tmp_path, small_corpus, monkeypatch):
    """Over the MCP server (in memory, the official client): run_experiment records the change, the history
    returns it typed, a bad one is a tool error that says why; submit_experiment records it too."""
    from mcp import Client
    from test_proposer import _fake_runs

    from mcp_server.mcp.server import build_server

    _fake_runs(monkeypatch, lambda vals, seed: 2.0 - vals["LR"] + seed * 1e-6)
    ws = make_workspace(tmp_path / "ws", small_corpus)
    async with Client(build_server(ws.root)) as client:
        await client.call_tool("run_experiment", {"description": "baseline"})
        base_lr = constant_values((ws.root / "train.py").read_text())["LR"]   # the bundled baseline's
        set_constant(ws.root / "train.py", "LR", "0.016")
        bad = await client.call_tool("run_experiment", {"description": "LR up", "change": {
            "name": "LR", "old": base_lr, "new": 0.016, "extra": 1}})
        assert bad.is_error and "extra" in bad.content[0].text
        res = await client.call_tool("run_experiment", {"description": "a faster learning rate", "change": {
            "name": "LR", "old": base_lr, "new": 0.016}})
        eid = res.structured_content["experiment_id"]
        hist = (await client.call_tool("state_read", {"view": "history"})).structured_content["experiments"]
    row = next(r for r in hist if r["id"] == eid)
    assert row["change"] == {"name": "LR", "old": base_lr, "new": 0.016}
    assert all(r["change"] is None for r in hist if r["id"] != eid)    # baseline and pair runs carry none
