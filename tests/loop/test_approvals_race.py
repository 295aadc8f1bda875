"""Approvals bind to bytes: what a person approved is what runs and what is kept, even while a process of
the agent rewrites train.py in the workspace for the whole approval (red team round 3, A1 and A2).

The swapper is a separate process that watches train.py and, whenever it holds the approved version,
replaces it (atomically) with that version plus a marker line. The old approval paths wrote the approved
bytes into the workspace and committed whatever the file held a moment later: the marker then ran and was
kept. Each path is driven the way a person drives it: the CLI, a signed Slack button click and a signed
Jira comment through the real webhook app. Training is real (a tiny fixed-step model)."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest
from test_approvals import set_setting

from mcp_server.loop import approvals, decisions, gitops
from mcp_server.loop import settings as setmod
from mcp_server.loop.engine import Engine
from mcp_server.loop.workspace import Workspace

from conftest import hobbled_bench, make_workspace, record_baseline, set_constant

SLACK_SECRET, JIRA_SECRET, ANA = "slack-signing-secret", "jira-secret", "U0ANA"
MARKER = b"SWAPPED-CODE-RAN"
VIAS = ("cli", "slack", "jira")
MARKER_LINE = b"print('" + MARKER + b"', flush=True)\n"   # what the swapped-in train.py adds

# Polls train.py every millisecond; each time it holds the trigger bytes, swaps in the payload (write to a
# temporary file, then rename: the loop never reads a half-written file) and counts the swap.
SWAPPER = r"""
import os, sys, time
path, trigger, payload, count = sys.argv[1], open(sys.argv[2], "rb").read(), open(sys.argv[3], "rb").read(), sys.argv[4]
n = 0
while True:
    try:
        data = open(path, "rb").read()
    except OSError:
        data = b""
    if data == trigger:
        with open(path + ".swap", "wb") as f:
            f.write(payload)
        os.replace(path + ".swap", path)
        n += 1
        with open(count, "w") as f:
            f.write(str(n))
    time.sleep(0.001)
"""


class Swapper:
    """The agent's background process: from start to stop, train.py never holds `approved` for long."""

    def __init__(self, root: Path, approved: bytes, tmp: Path):
        self.root, self.approved = root, approved
        self.swapped = MARKER_LINE + approved
        (tmp / "trigger").write_bytes(approved)
        (tmp / "payload").write_bytes(self.swapped)
        self.count = tmp / "swaps"
        self.proc = subprocess.Popen([sys.executable, "-c", SWAPPER, str(root / "train.py"), str(tmp / "trigger"),
                                      str(tmp / "payload"), str(self.count)])

    def stop(self) -> int:
        self.proc.kill()
        self.proc.wait()
        return int((self.count.read_text() if self.count.is_file() else "").strip() or 0)


def tiny_workspace(tmp: Path, corpus: Path, autonomy: str) -> Path:
    """One seed, a two-block width-64 GPT trained for 4 steps, evaluated on 2k tokens; Slack and Jira set
    up for the webhook paths (approvers ANA and acc-ana)."""
    bench = hobbled_bench(tmp / "bench", max_steps=4, tiny=True)
    ws = make_workspace(tmp / "ws", corpus, bench_dir=bench,
                        benchmark={"time_budget": 20.0, "grace_seconds": 60.0, "eval_tokens": 2048},
                        noise={"baseline_seeds": 1, "rotate_every": 0})
    data = setmod.data_of(ws.settings())
    data["campaign"].update(autonomy=autonomy, slack_approvers=[ANA], jira_approvers=["acc-ana"])
    data["slack"] = {"channel": "C0RESEARCH", "base_url": "http://127.0.0.1:9/api/"}
    data["jira"] = {"server": "https://jira.invalid", "project": "RES"}
    setmod.save(ws.settings_path, setmod.validate(data))
    return ws.root


def recorded_candidate(eng: Engine, val: float, desc: str) -> int:
    """train.py as it is now, committed and recorded as measured on the seed set, paired with the
    baseline (as run_experiment leaves it; no training)."""
    c = eng.campaign
    sha, _ = gitops.commit_editable(eng.ws.root, ["train.py"], ".loopwright", desc)
    _, [seed] = eng.seed_set(c)
    ref = eng.reference_runs(c)[seed]
    e = eng.ledger.start_experiment(c["id"], desc, commit_sha=sha, parent_commit=c["best_commit"],
                                    source_sha=eng.text_sha(eng.committed_source(sha)), role="candidate",
                                    seed=seed, paired_with=ref["id"])
    eng.ledger.update_experiment(e, status="ok", val_bpb=val, finished_at=time.time())
    return e


def decide(root: Path, aid: int, via: str) -> None:
    """Approve #aid the way a person does through `via`; returns once the applying is done."""
    if via == "cli":
        from mcp_server.cli.main import main

        assert main(["approve", str(aid), "-w", str(root), "--by", "ana"]) == 0
        return
    from starlette.testclient import TestClient

    from mcp_server.notify.approval_blocks import APPROVE, button_value
    from mcp_server.notify.events import ledger_uid
    from mcp_server.triggers.webhook import create_app, github_signature, slack_signature

    app = create_app(root, start_session=lambda detail: None,
                     env={"SLACK_SIGNING_SECRET": SLACK_SECRET, "LOOPWRIGHT_JIRA_SECRET": JIRA_SECRET})
    client = TestClient(app)
    with Engine(root) as eng:
        uid = ledger_uid(eng.ledger)
        eng.ledger.kv_set(f"jira.issue.RES.{eng.campaign['id']}", "RES-7")
    if via == "slack":
        payload = {"type": "block_actions", "user": {"id": ANA}, "channel": {"id": "C0RESEARCH"},
                   "actions": [{"type": "button", "action_id": APPROVE, "value": button_value(uid, aid)}]}
        body = urlencode({"payload": json.dumps(payload)}).encode()
        ts = str(int(time.time()))
        r = client.post("/slack/interactive", content=body, headers={
            "Content-Type": "application/x-www-form-urlencoded", "X-Slack-Request-Timestamp": ts,
            "X-Slack-Signature": slack_signature(SLACK_SECRET, ts, body)})
    else:
        body = json.dumps({"webhookEvent": "comment_created", "issue": {"key": "RES-7"},
                           "comment": {"body": f"/approve {aid}", "author": {"accountId": "acc-ana"}}}).encode()
        r = client.post("/jira", content=body, headers={
            "Content-Type": "application/json", "X-Atlassian-Webhook-Identifier": f"j-{aid}",
            "X-Hub-Signature": github_signature(JIRA_SECRET, body)})
    assert r.status_code == 200 and r.json()["status"] == "decided", r.json()
    for t in app.state.appliers:
        t.join(600)
        assert not t.is_alive()


def runs_since(root: Path, after: int) -> list[dict]:
    with Engine(root) as eng:
        return [r for r in eng.ledger.experiments(eng.campaign["id"]) if r["id"] > after]


def assert_only_approved_ran(root: Path, rows: list[dict], approved: bytes) -> None:
    """Every run since the decision trained exactly the approved bytes; the swapped code never ran."""
    assert rows, "nothing ran"
    ws_runs = Workspace.open(root)
    for r in rows:
        assert gitops.blob_bytes(root, r["commit_sha"], "train.py") == approved, r["description"]
        assert r["source_sha"] == hashlib.sha256(b"### train.py\n" + approved).hexdigest()
        run_dir = ws_runs.run_dir(r["id"])
        assert (run_dir / "source" / "train.py").read_bytes() == approved
        assert MARKER not in (run_dir / "train.log").read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("via", VIAS)
def test_an_approved_keep_remeasured_on_a_new_best_runs_and_keeps_the_approved_bytes(tmp_path, small_corpus, via):
    """A1: two keeps wait; #1 is applied; #2 no longer sits on the best, so it is carried onto it and
    re-measured there, while the swapper replaces the carried-over train.py as soon as it appears."""
    root = tiny_workspace(tmp_path, small_corpus, "approve-keeps")
    train = root / "train.py"
    pinned = train.read_bytes()
    with Engine(root) as eng:
        record_baseline(eng, (50.0,))          # a recorded baseline far above what the tiny model reaches
        set_constant(train, "LR", "0.004")
        a = recorded_candidate(eng, 40.0, "normal learning rate")
        assert eng.score(a).verdict == "pending_approval"
        assert train.read_bytes() == pinned
        set_constant(train, "WARMUP_STEPS", "2")                  # another line: it merges cleanly
        b = recorded_candidate(eng, 45.0, "short warm-up")
        assert eng.score(b).verdict == "pending_approval"
    decide(root, 1, "cli")                                         # the best moves to #1 (no training)
    want = tmp_path / "merged.py"             # what the carried-over change must be: both edits on the pinned file
    want.write_bytes(pinned)
    set_constant(want, "LR", "0.004")
    set_constant(want, "WARMUP_STEPS", "2")
    merged = want.read_bytes()
    last = max(r["id"] for r in runs_since(root, 0))
    swapper = Swapper(root, merged, tmp_path)
    try:
        decide(root, 2, via)
    finally:
        swaps = swapper.stop()
    rows = runs_since(root, last)
    assert_only_approved_ran(root, rows, merged)
    assert swaps >= 1, "the swapper never saw the approved bytes: the race was not run"
    with Engine(root) as eng:
        ap = eng.ledger.approval(2)
        assert ap["status"] == "applied", ap          # 50 -> a few bits/byte: a gain on any seed
        best = eng.campaign["best_commit"]
        assert best == rows[0]["commit_sha"] and gitops.blob_bytes(root, best, "train.py") == merged
        assert eng.ledger.events(kind="tamper") == []


@pytest.mark.slow
@pytest.mark.parametrize("via", VIAS)
def test_an_approved_run_runs_the_approved_bytes(tmp_path, small_corpus, via):
    """A2: under approve-runs a held change is approved; the agent's next run_experiment runs it while the
    swapper replaces the approved train.py as soon as it appears in the workspace."""
    root = tiny_workspace(tmp_path, small_corpus, "approve-runs")
    train = root / "train.py"
    with Engine(root) as eng:
        record_baseline(eng, (50.0,))
        set_constant(train, "LR", "0.004")
        approved = train.read_bytes()
        held = eng.run_experiment("normal learning rate")
        assert held.status == "pending_approval" and held.approval_id == 1
        last = max(r["id"] for r in eng.ledger.experiments(eng.campaign["id"]))
    swapper = Swapper(root, approved, tmp_path)
    try:
        decide(root, 1, via)
        with Engine(root) as eng:                   # train.py at the best: the approved change runs
            res = eng.run_experiment("approved: normal learning rate")
    finally:
        swaps = swapper.stop()
    assert res.status == "ok", res
    rows = runs_since(root, last)
    assert_only_approved_ran(root, rows, approved)
    assert swaps >= 1, "the swapper never saw the approved bytes: the race was not run"
    with Engine(root) as eng:
        assert eng.ledger.approval(1)["status"] == "ran"
        assert eng.ledger.events(kind="tamper") == []


# -- a mismatch between what was approved and what would run or be kept: refused, recorded ---------------
def swapped_commit(root: Path, parent: str) -> str:
    """A commit on `parent` whose train.py is the approved one with the marker line (not on any branch)."""
    approved = gitops.blob_bytes(root, parent, "train.py")
    return gitops.commit_files(root, parent, {"train.py": MARKER_LINE + approved}, "forged")


def overwrite_object(root: Path, commit: str, data: bytes) -> None:
    """Rewrite the loose object of train.py's blob at `commit` with other bytes under the same name (git does
    not re-hash on read: a same-user shell can do this to .git/objects)."""
    import zlib

    sha = gitops.repo(root).commit(commit).tree["train.py"].hexsha
    obj = root / ".git" / "objects" / sha[:2] / sha[2:]
    obj.chmod(0o644)
    obj.write_bytes(zlib.compress(b"blob %d\0" % len(data) + data))


@pytest.mark.parametrize("forgery", ["record", "object"])
def test_an_approved_keep_whose_bytes_changed_is_refused_as_tamper(tmp_path, small_corpus, forgery):
    from test_approvals import held_keep

    ws = make_workspace(tmp_path / "ws", small_corpus)
    set_setting(ws.root, "campaign.autonomy", "approve-keeps")
    exp, _, best_before = held_keep(ws)
    decisions.decide(ws.root, 1, True, "ana", "cli")
    with Engine(ws.root) as eng:
        if forgery == "record":      # the approval now names other bytes than were measured
            eng.ledger.conn.execute("UPDATE approvals SET commit_sha=? WHERE id=1",
                                    (swapped_commit(ws.root, exp["commit_sha"]),))
            eng.ledger.conn.commit()
        else:
            overwrite_object(ws.root, exp["commit_sha"], MARKER_LINE + b"print('forged')\n")
    [line] = decisions.apply_approved(ws.root)
    assert line.startswith("#1: refused:") and "tamper event" in line, line
    with Engine(ws.root) as eng:
        c = eng.campaign
        assert c["best_commit"] == best_before == gitops.head_sha(ws.root)
        a = eng.ledger.approval(1)
        assert a["status"] == "stale" and a["outcome"].startswith("refused before an approved keep")
        assert eng.ledger.experiment(exp["id"])["verdict"] == "discard"
        [ev] = eng.ledger.events(kind="tamper")
        assert ev["payload"]["approval_id"] == 1 and ev["payload"]["when"] == "before an approved keep"


def test_an_approved_run_whose_record_changed_is_refused_before_anything_runs(tmp_path, small_corpus):
    ws = make_workspace(tmp_path / "ws", small_corpus)
    set_setting(ws.root, "campaign.autonomy", "approve-runs")
    train = ws.root / "train.py"
    with Engine(ws.root) as eng:
        record_baseline(eng)
        set_constant(train, "LR", "0.004")
        assert eng.run_experiment("normal learning rate").approval_id == 1
        n = eng.ledger.count_experiments(eng.campaign["id"])
        forged = swapped_commit(ws.root, eng.ledger.approval(1)["commit_sha"])
    decisions.decide(ws.root, 1, True, "ana", "cli")
    with Engine(ws.root) as eng:        # the approval now names other bytes than the person approved
        eng.ledger.conn.execute("UPDATE approvals SET commit_sha=? WHERE id=1", (forged,))
        eng.ledger.conn.commit()
        with pytest.raises(approvals.Tampered, match="not what was approved.*tamper event"):
            eng.run_experiment("approved: normal learning rate")
        c = eng.campaign
        assert eng.ledger.count_experiments(c["id"]) == n                   # nothing ran
        assert gitops.head_sha(ws.root) == c["best_commit"]
        assert eng.ledger.approval(1)["status"] == "stale"
        [ev] = eng.ledger.events(kind="tamper")
        assert ev["payload"]["when"] == "before an approved run" and ev["payload"]["commit"] == forged
