"""The built-in agent: editing train.py's constants, the hill climb, and one real session over stdio."""
from __future__ import annotations

import ast
import difflib
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BENCH, REPO, hobbled_bench, make_workspace
from mcp_server.mechanisms.source import constant_values, tunable_constants
from mcp_server.proposer import (Planner, divisibility_constraints, moves, parse_description, satisfies,
                                 set_constant)

TRAIN = (BENCH / "train.py").read_text()


def _changed_lines(a: str, b: str) -> list[tuple[str, str]]:
    sm = difflib.SequenceMatcher(a=a.splitlines(), b=b.splitlines())
    out = []
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag != "equal":
            out += list(zip(a.splitlines()[i1:i2], b.splitlines()[j1:j2]))
            assert i2 - i1 == j2 - j1, "an edit must not add or remove lines"
    return out


@pytest.mark.parametrize("name,value", [("LR", 0.0025), ("D_MODEL", 64), ("QK_NORM", True), ("BETA2", 0.975),
                                        ("WEIGHT_DECAY", 0.1), ("DEPTH", 12)])
def test_set_constant_rewrites_only_the_literal(name, value):
    new = set_constant(TRAIN, name, value)
    ast.parse(new)
    assert constant_values(new)[name] == value
    assert {k: v for k, v in constant_values(new).items() if k != name} == \
        {k: v for k, v in constant_values(TRAIN).items() if k != name}
    [(old_line, new_line)] = _changed_lines(TRAIN, new)
    assert old_line.startswith(f"{name} = ") and new_line.startswith(f"{name} = ")
    if "#" in old_line:   # the comment survives, in the same column
        assert new_line[new_line.index("#"):] == old_line[old_line.index("#"):]
        assert new_line.index("#") == old_line.index("#")
    assert new.endswith("\n") and len(new.splitlines()) == len(TRAIN.splitlines())


def test_set_constant_errors_are_clear():
    with pytest.raises(ValueError, match="NOPE is not a top-level"):
        set_constant(TRAIN, "NOPE", 1)
    with pytest.raises(ValueError, match="QK_NORM is a bool"):
        set_constant(TRAIN, "QK_NORM", 3)
    with pytest.raises(ValueError, match="is a int"):
        set_constant(TRAIN, "DEPTH", True)
    src = "X = -2  # negative\nY = 1.5\n"
    assert set_constant(src, "X", 4) == "X = 4   # negative\nY = 1.5\n"
    assert set_constant(src, "Y", 1e-05) == "X = -2  # negative\nY = 1e-05\n"


def test_divisibility_constraints_from_comments_and_through_calls():
    assert ("D_MODEL", "N_HEAD") in divisibility_constraints(TRAIN)
    # without the comment, the call GPT(..., D_MODEL, ..., N_HEAD) and `d // n_head` inside still say so
    bare = TRAIN.replace("(head dim = D_MODEL // N_HEAD)", "")
    assert "D_MODEL // N_HEAD" not in bare
    assert ("D_MODEL", "N_HEAD") in divisibility_constraints(bare)
    assert satisfies({"D_MODEL": 128, "N_HEAD": 8}, {("D_MODEL", "N_HEAD")})
    assert not satisfies({"D_MODEL": 128, "N_HEAD": 3}, {("D_MODEL", "N_HEAD")})


def test_moves_respect_kind_sign_and_range():
    c = {k.name: k for k in tunable_constants(TRAIN)}
    assert moves(c["LR"], 2.0) == {"up": [0.008], "down": [0.002]}
    assert moves(c["QK_NORM"], 2.0) == {"flip": [True]}
    assert moves(c["DEPTH"], 2.0) == {"up": [5, 8], "down": [3, 2]}
    assert moves(c["D_MODEL"], 2.0) == {"up": [256], "down": [64]}
    assert moves(c["WEIGHT_DECAY"], 2.0) == {"up": [0.1]}              # from zero: a typical value
    assert moves(c["GRAD_CLIP"], 2.0)["off"] == [0.0]                  # its comment says "0 = off"
    for beta in ("BETA1", "BETA2"):
        for vals in moves(c[beta], 2.0).values():
            assert all(0 < v < 1 for v in vals)
    assert all(0 < v < 1 for vals in moves(c["WARMDOWN_FRAC"], 2.0).values() for v in vals)
    one = tunable_constants("N = 1\n")[0]
    assert moves(one, 2.0) == {"up": [2]}                             # a positive count stays >= 1


def _run(planner: Planner, outcomes: list[str], source: str = TRAIN) -> list[str]:
    """Feed a fixed sequence of outcomes; the best source advances on keeps, as the loop does."""
    out = []
    for o in outcomes:
        e = planner.propose(source)
        assert e is not None
        out.append(e.description)
        planner.record(e, o)
        if o == "keep":
            source = e.source
    return out


def test_planner_is_reproducible_given_the_seed():
    outcomes = ["discard", "keep", "discard", "crash", "discard", "keep", "discard", "discard"]
    a = _run(Planner(7), outcomes)
    assert a == _run(Planner(7), outcomes)
    assert a != _run(Planner(8), outcomes)


def test_planner_never_repeats_and_respects_constraints():
    p, src = Planner(0), TRAIN
    seen = set()
    for i in range(60):
        e = p.propose(src)
        assert e is not None
        vals = constant_values(e.source)
        key = tuple(sorted(vals.items()))
        assert key not in seen
        seen.add(key)
        assert vals["D_MODEL"] % vals["N_HEAD"] == 0
        ast.parse(e.source)
        p.record(e, "keep" if i % 7 == 3 else "discard")
        if i % 7 == 3:
            src = e.source


def test_planner_follows_a_keep_and_drops_a_failed_direction():
    p = Planner(1)
    e = p.propose(TRAIN, preferred=["LR"])
    assert e.name == "LR"
    p.record(e, "keep")
    e2 = p.propose(e.source)      # momentum: the same step again from the new point
    assert e2.name == "LR" and e2.direction == e.direction
    p.record(e2, "discard")
    e3 = p.propose(e.source, preferred=["LR"])
    assert e3.name == "LR" and e3.direction != e.direction   # the other way, not the failed one again
    p.record(e3, "discard")
    e4 = p.propose(e.source, preferred=["LR"])
    assert e4.name == "LR" and 1.3 < max(e4.new / e.new, e.new / e4.new) < 1.5   # both failed: a smaller step


def test_planner_exhausts_a_tiny_space():
    p, src = Planner(0), "FLAG = False\nN = 1\n"
    got = []
    while (e := p.propose(src)) is not None:
        got.append(e.description)
        p.record(e, "discard")
        assert len(got) < 10
    assert sorted(got) == ["FLAG False -> True", "N 1 -> 2"]


def test_parse_description():
    assert parse_description("LR 0.004 -> 0.008") == ("LR", 0.004, 0.008)
    assert parse_description("GRAD_CLIP 1.0 -> 0.0 (off)") == ("GRAD_CLIP", 1.0, 0.0)
    assert parse_description("QK_NORM False -> True") == ("QK_NORM", False, True)
    assert parse_description("try a wider model") is None
    p = Planner(0)
    p.observe("LR", 0.004, 0.008, "discard")
    assert "up" in p.params["LR"].failed


@pytest.mark.slow
def test_run_builtin_over_stdio(tmp_path: Path, small_corpus):
    """`loopwright run --agent builtin -n 2`: a real server subprocess, real training, the ledger filled in."""
    from mcp_server.engine import Engine

    ws = make_workspace(tmp_path / "ws", small_corpus, bench_dir=hobbled_bench(tmp_path / "bench"))
    proc = subprocess.run([sys.executable, "-m", "mcp_server.cli", "run", "--agent", "builtin", "-n", "2",
                           "--seed", "1", "--workspace", str(ws.root)], cwd=REPO, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 experiment(s)" in proc.stdout and "ran the 2 experiment(s) asked for" in proc.stdout
    with Engine(ws.root, recover=False) as eng:
        rows = eng.ledger.experiments(eng.campaign["id"])
        base = [r for r in rows if r["is_baseline"]]
        cand = [r for r in rows if not r["is_baseline"] and r["confirm_of"] is None]
        assert len(base) == 2 and all(r["status"] == "ok" for r in base)
        assert len(cand) == 2
        for r in cand:
            assert parse_description(r["description"]) is not None, r["description"]
            assert r["verdict"] in ("keep", "discard"), r   # scored (retests were confirmed)
            assert r["hypothesis"]
        # the file on disk is the best version, committed
        summary = eng.summary()
        assert summary.pending_score == [] and summary.pending_retest == []
    logs = list((ws.state_dir / "logs").glob("builtin-serve-*.log"))
    assert logs, "the server's stderr goes to a log file, not the terminal"
