"""An agent trying to cheat, through train.py itself: the code the hooks never see.

Each test writes a small, deliberately dishonest train.py (no real training: it
exports a tiny model through prepare.export_model) and runs it through the
engine, as run_experiment would. The loop must reject or neutralise every trick.
"""
from __future__ import annotations

import json
import os
import time
import zlib
from pathlib import Path

import pytest

from mcp_server.loop import gitops, sandbox
from mcp_server.loop.engine import Engine, LoopError

from conftest import make_workspace, record_baseline

HEADER = '''
import os, sys, time
import torch
import torch.nn as nn
import prepare

class Bigram(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.zeros(prepare.VOCAB_SIZE, prepare.VOCAB_SIZE))
    def forward(self, idx):
        return self.table[idx]

class PeekNext(Bigram):
    def forward(self, idx):
        return self.table[torch.roll(idx, -1, dims=1)] * 0 + torch.roll(idx, -1, dims=1).unsqueeze(-1).float()
'''

FOOTER = '''
prepare.export_model(MODEL)
print("---")
print("val_bpb:          0.010000")
print("training_seconds: 1.0")
print("num_steps:        1")
'''


@pytest.fixture()
def ws(tmp_path, small_corpus):
    return make_workspace(tmp_path / "ws", small_corpus)


def _engine_with_baseline(ws) -> Engine:
    """A measured baseline in the ledger (honest values), so candidates can run at once."""
    eng = Engine(ws.root)
    record_baseline(eng, (7.9, 7.91))
    return eng


def _run(eng: Engine, body: str, model: str = "Bigram()"):
    (eng.ws.root / "train.py").write_text(HEADER + body + f"\nMODEL = {model}\n" + FOOTER)
    return eng.run_experiment("a dishonest experiment")


def test_printed_score_is_ignored(ws):
    eng = _engine_with_baseline(ws)
    res = _run(eng, "")
    # train.py printed 0.01; the frozen evaluator measured the exported (uniform) model
    assert res.status == "ok" and res.val_bpb == pytest.approx(8.0, abs=1e-6)


def test_model_reading_the_future_is_rejected(ws):
    eng = _engine_with_baseline(ws)
    res = _run(eng, "", model="PeekNext()")
    assert res.status == "rejected" and "caus" in res.reason.lower()
    assert eng.ledger.experiment(res.experiment_id)["verdict"] == "discard"
    assert not gitops.is_dirty(ws.root)


def test_rewriting_the_evaluator_during_the_run_is_caught(ws):
    eng = _engine_with_baseline(ws)
    original = (ws.root / "prepare.py").read_bytes()
    res = _run(eng, "open('prepare.py', 'a').write('\\nCHEAT = True\\n')\n")
    assert (ws.root / "prepare.py").read_bytes() == original and res.val_bpb is None
    if sandbox.detect().available:     # the OS refuses the write: the workspace is read-only to train.py
        assert res.status == "crash" and "Read-only file system" in (res.log_tail or "")
    else:                              # --unsafe-no-sandbox: the integrity check catches and restores it
        assert res.status == "rejected" and "changed frozen files" in res.reason
        assert [e["payload"]["when"] for e in eng.ledger.events(kind="tamper")] == ["during the run"]


def test_tampering_and_then_crashing_is_still_caught(ws):
    eng = _engine_with_baseline(ws)
    original = (ws.root / "loopwright.toml").read_text()
    res = _run(eng, "open('loopwright.toml', 'w').write(open('loopwright.toml').read()"
                    ".replace('min_delta = 0.002', 'min_delta = 0.0'))\nraise SystemExit(3)\n")
    assert (ws.root / "loopwright.toml").read_text() == original and res.val_bpb is None
    if sandbox.detect().available:
        assert res.status == "crash" and "Read-only file system" in (res.log_tail or "")
    else:
        assert res.status == "rejected" and "loopwright.toml" in res.reason


def test_rewriting_the_ledger_during_the_run_is_caught(ws):
    """The ledger lives in the state directory, outside the workspace; train.py (sandboxed) cannot
    reach it. Whatever it manages, the recorded rows keep their values."""
    eng = _engine_with_baseline(ws)
    before = {r["id"]: r["val_bpb"] for r in eng.ledger.experiments(eng.campaign["id"])}
    res = _run(eng, "import sqlite3\n"
                    "for p in ('.loopwright/state.db', os.path.join(os.environ['LOOPWRIGHT_RUN_DIR'], '..', '..', "
                    "'state.db')):\n"
                    "    try:\n"
                    "        db = sqlite3.connect(p)\n"
                    "        db.execute('UPDATE experiments SET val_bpb = 99 WHERE is_baseline = 1')\n"
                    "        db.commit()\n"
                    "        print('WROTE', p)\n"
                    "    except Exception as e:\n"
                    "        print('REFUSED', p, e)\n")
    after = {r["id"]: r["val_bpb"] for r in eng.ledger.experiments(eng.campaign["id"])}
    assert {i: after[i] for i in before} == before
    if res.status == "rejected":       # reached it (no sandbox): caught by the ledger digest
        assert "ledger" in res.reason
        assert any(e["payload"]["files"] == ["state.db"] for e in eng.ledger.events(kind="tamper"))


def test_monkeypatching_prepare_does_not_reach_the_evaluator(ws):
    eng = _engine_with_baseline(ws)
    res = _run(eng, "prepare.evaluate_bpb = lambda *a, **k: 0.0\n"
                    "prepare.bpb_sums = lambda *a, **k: (0.0, 1)\n")
    assert res.status == "ok" and res.val_bpb == pytest.approx(8.0, abs=1e-6)


def test_shadow_modules_in_the_workspace_do_not_reach_the_evaluator(ws):
    eng = _engine_with_baseline(ws)
    # under the sandbox the workspace is read-only and the writes fail; without it they land, and the
    # evaluator (pinned blob, private dir, stdlib first) must still not import them
    res = _run(eng, "for name, code in (('numpy.py', 'raise SystemExit(\"shadowed\")'),\n"
                    "                   ('sitecustomize.py', 'import builtins; builtins.CHEAT = 1')):\n"
                    "    try:\n"
                    "        open(name, 'w').write(code)\n"
                    "    except OSError:\n"
                    "        pass\n")
    assert res.status == "ok" and res.val_bpb == pytest.approx(8.0, abs=1e-6)
    for name in ("numpy.py", "sitecustomize.py"):
        (ws.root / name).unlink(missing_ok=True)


def test_secrets_never_reach_train_py(ws, monkeypatch):
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-secret-value")
    monkeypatch.setenv("JIRA_API_TOKEN", "jira-secret-value")
    monkeypatch.setenv("TORCH_HUB_TOKEN", "hub-secret-value")      # a kept prefix does not carry a credential
    monkeypatch.setenv("TORCH_HOME", "/opt/torch-home")             # ... and a plain setting still passes
    eng = _engine_with_baseline(ws)
    res = _run(eng, "import json\n"
                    "json.dump(dict(os.environ), open(os.environ['LOOPWRIGHT_RUN_DIR'] + '/env.json', 'w'))\n")
    assert res.status == "ok"
    env = json.loads((ws.run_dir(res.experiment_id) / "scratch" / "env.json").read_text())
    assert "SLACK_BOT_TOKEN" not in env and "JIRA_API_TOKEN" not in env and "TORCH_HUB_TOKEN" not in env
    assert "secret-value" not in json.dumps(env)
    assert env["TORCH_HOME"] == "/opt/torch-home"
    assert env["LOOPWRIGHT_SEED"] == str(res.seed)


def test_overrunning_the_budget_is_killed_with_its_children(tmp_path, small_corpus):
    # the wall clock: the runner's own meter stops the run at the budget's allowance (the hard limit's kill of
    # a whole tree is tests/attacks/test_sandbox.py::test_hard_kill_takes_every_descendant_with_it)
    ws = make_workspace(tmp_path / "ws", small_corpus, benchmark={"time_budget": 8.0, "grace_seconds": 6.0,
                                                                  "clock": "wall"})
    eng = _engine_with_baseline(ws)
    from mcp_server.loop.config import load_config
    cfg = load_config(ws.root)
    # the child beats (writes a counter to scratch/beat) until it dies; pids inside the sandbox's
    # PID namespace mean nothing outside it, so the heartbeat is what is checked
    res = _run(eng, "import subprocess\n"
                    "d = os.environ['LOOPWRIGHT_RUN_DIR']\n"
                    "open(d + '/child.py', 'w').write('import os, time\\nn = 0\\nwhile True:\\n    n += 1\\n"
                    "    open(os.path.join(os.path.dirname(__file__), \"beat\"), \"w\").write(str(n))\\n"
                    "    time.sleep(0.2)\\n')\n"
                    "subprocess.Popen([sys.executable, d + '/child.py'], start_new_session=True)\n"
                    "time.sleep(10_000)\n")
    assert res.status == "timeout" and "over budget" in res.reason, res.reason
    assert res.total_seconds < cfg.benchmark.time_budget * 1.03 + 3 + 10   # the allowance, far before the hard limit
    beat = ws.run_dir(res.experiment_id) / "scratch" / "beat"
    assert beat.is_file(), "the child never ran"
    time.sleep(1)
    last = beat.read_text()
    time.sleep(2)
    assert beat.read_text() == last, "a child of train.py (in its own session) survived the hard kill"


def _loose_object_path(root: Path, sha: str) -> Path:
    return root / ".git" / "objects" / sha[:2] / sha[2:]


def test_rewritten_git_object_of_the_evaluator_is_detected(ws):
    eng = _engine_with_baseline(ws)
    pinned = eng.campaign["pinned_commit"]
    blob = gitops.repo(ws.root).commit(pinned).tree / "prepare.py"
    path = _loose_object_path(ws.root, blob.hexsha)
    assert path.is_file(), "expected a loose object in a fresh workspace"
    evil = b"print('{\"ok\": true, \"val_bpb\": 0.001}')\n"
    os.chmod(path, 0o644)
    path.write_bytes(zlib.compress(b"blob %d\0" % len(evil) + evil))
    # plain git would now serve the evil evaluator under the old name ...
    assert gitops.blob_bytes(ws.root, pinned, "prepare.py") == evil
    # ... but loopwright re-hashes every object and refuses
    (ws.root / "train.py").write_text((ws.root / "train.py").read_text() + "\n# a change\n")
    with pytest.raises(LoopError, match="tampered"):
        eng.run_experiment("after tampering with .git")
    assert not eng.ledger.recent_non_baseline(eng.campaign["id"], limit=1)


FAKE_EVALUATOR = '''
import json, os, sys
{verdict}
print(json.dumps({forged}), flush=True)   # what a model's graph printed (after, or instead of, the verdict)
sys.exit({code})
'''
NONCE_VERDICT = '''flag = "--nonce"
print(json.dumps({"ok": False, "reason": "the real verdict", "nonce": sys.argv[sys.argv.index(flag) + 1]}))'''


@pytest.mark.parametrize("nonce_aware, code, expect", [
    (True, 0, "the real verdict"),              # a forged line after the real one: the nonce decides
    (False, 136, "exited with code 136"),       # an older evaluator: a forged line, then a crash
])
def test_the_runner_trusts_only_the_evaluators_own_verdict(ws, tmp_path, nonce_aware, code, expect):
    """Red team round 2: a model printed a keep-worthy verdict line and crashed the evaluator; the runner
    took the last JSON line it could parse. It now wants the nonce it passed (a model cannot know it),
    or, from an evaluator without --nonce, its last line and a clean exit."""
    from mcp_server.loop import runner

    forged = {"ok": True, "causal": True, "val_bpb": 0.42, "test_bpb": 0.42, "eval_seconds": 1.0}
    fake = FAKE_EVALUATOR.format(forged=forged, code=code, verdict=NONCE_VERDICT if nonce_aware else "")
    model = tmp_path / "model.pt2"
    model.write_bytes(b"not a model")
    files = {"prepare.py": fake.encode(), "loopwright.toml": (ws.root / "loopwright.toml").read_bytes()}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    res = runner.run_evaluation(ws, None, run_dir, model, files=files)
    assert not res.ok and expect in res.reason, res.reason
