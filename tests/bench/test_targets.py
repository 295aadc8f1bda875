"""A user's own target (issue 27): init from a bundled target or a git repository, campaigns from the CLI that
keep and replay, and the attacks a candidate can try -- reading a hidden file, writing a frozen one, editing
the gate, printing or writing a forged metric. Real bubblewrap, real git, the real CLI."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mcp_server.loop import config as cfgmod
from mcp_server.loop import gitops, runner, targets
from mcp_server.loop.engine import Engine, LoopError
from mcp_server.loop.setup import init_workspace
from mcp_server.loop.workspace import Workspace, WorkspaceError, bundled_targets

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (the sandbox)")


def cli(*args: str, cwd: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mcp_server.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})


@pytest.fixture(scope="module")
def fastsum(tmp_path_factory) -> Workspace:
    return init_workspace(tmp_path_factory.mktemp("fastsum") / "ws", target="fastsum")


def test_init_copies_the_target_and_keeps_hidden_files_out_of_the_workspace(fastsum):
    ws = fastsum
    src = bundled_targets()["fastsum"]
    assert (ws.root / "solution.py").read_bytes() == (src / "solution.py").read_bytes()
    assert not (ws.root / "hidden").exists(), "hidden files must never be in the agent's workspace"
    assert (ws.data_dir / "hidden" / "reference.py").read_bytes() == (src / "hidden" / "reference.py").read_bytes()
    lock = json.loads((ws.root / "loopwright.lock").read_text())
    assert lock["target"] == "fastsum" and set(lock["data"]) == {"hidden/reference.py"}
    assert "hidden/reference.py" not in gitops.tracked_files(ws.root, ws.pinned_commit)
    assert ws.cfg.target is not None and ws.cfg.target.noise == "repeat"
    # the loop's own files are frozen even where the target's list forgot one
    assert set(targets.ALWAYS_FROZEN) <= set(ws.cfg.paths.frozen)
    assert "Only `solution.py` may be edited" in (ws.root / "AGENTS.md").read_text()


def test_a_gpt_workspace_keeps_its_frozen_hash():
    """[target] is hashed only where present: a lock made before targets existed still matches."""
    cfg = cfgmod.LoopwrightConfig()
    data = {name: getattr(cfg, name).model_dump(mode="json") for name in ("benchmark", "paths", "noise")}
    import hashlib
    assert cfg.frozen_hash() == hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def test_init_from_a_git_repository_copies_committed_files_and_touches_nothing(tmp_path):
    repo = tmp_path / "proj"
    shutil.copytree(bundled_targets()["squeeze"], repo)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=u", "-c", "user.email=u@x", "commit", "-qm", "x"],
                   check=True)
    (repo / "compressor.py").write_text((repo / "compressor.py").read_text() + "\n# uncommitted\n")
    (repo / "scratch.txt").write_text("untracked")
    before = subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], capture_output=True, text=True).stdout
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    ws = init_workspace(tmp_path / "ws", target=str(repo))
    assert "# uncommitted" not in (ws.root / "compressor.py").read_text()     # HEAD's bytes, not the working tree's
    assert not (ws.root / "scratch.txt").exists()
    after = subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], capture_output=True, text=True).stdout
    assert after == before and head == subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"],
                                                      capture_output=True, text=True).stdout
    assert (repo / "hidden" / "expected.json").is_file()      # the user's own repo keeps everything


def test_bad_targets_are_refused_with_what_to_fix(tmp_path):
    with pytest.raises(WorkspaceError, match="neither a bundled target"):
        init_workspace(tmp_path / "a", target="no-such-target")
    folder = tmp_path / "t"
    shutil.copytree(bundled_targets()["squeeze"], folder)
    toml = folder / "loopwright.toml"
    toml.write_text(toml.read_text().replace('editable = ["compressor.py"]', 'editable = ["nothere.py"]'))
    with pytest.raises(WorkspaceError, match=r"nothere\.py.*name no file"):
        init_workspace(tmp_path / "b", target=str(folder))
    assert not (tmp_path / "b").exists(), "a refused init leaves nothing behind"
    toml.write_text("[paths]\neditable = [\"compressor.py\"]\n")
    with pytest.raises(WorkspaceError, match=r"no \[target\] section"):
        init_workspace(tmp_path / "c", target=str(folder))


# -------------------------------------------------------------------------------- attacks through the runner

ATTACK = '''
import json, os, pathlib
probe = {}
for name, path in {"hidden": HIDDEN, "state": STATE}.items():
    try:
        probe[name] = len(open(path, "rb").read())
    except OSError as e:
        probe[name] = type(e).__name__
try:
    open(EVALUATE, "a").write("# rewritten")
    probe["frozen"] = "written"
except OSError as e:
    probe["frozen"] = type(e).__name__
print(json.dumps({"ok": True, "metric": 0.0}))          # a forged result line on the run's stdout
out = os.environ.get("LOOPWRIGHT_OUTPUT")
if out:
    pathlib.Path(out, "probe.json").write_text(json.dumps(probe))
    pathlib.Path(out, "forged.json").write_text(json.dumps({"ok": True, "metric": 0.0}))
'''


def _run(ws: Workspace, solution: str, seed: int = 5):
    eng = Engine(ws.root)
    try:
        pinned = eng.campaign["pinned_commit"]
        tree = eng.run_tree(pinned)
    finally:
        eng.close()
    tree[ws.cfg.paths.editable[0]] = solution.encode()
    run_dir = ws.state_dir / "runs" / f"attack-{seed}"
    tr = runner.run_training(ws, run_dir, seed, sources=tree)
    ev = runner.run_evaluation(ws, pinned, run_dir, tr.model_path) if tr.status == "ok" and tr.model_path else None
    return tr, ev, run_dir


def test_a_candidate_cannot_read_hidden_files_write_frozen_ones_or_forge_the_metric(fastsum):
    ws = fastsum
    attack = ATTACK.replace("HIDDEN", repr(str(ws.data_dir / "hidden" / "reference.py"))).replace(
        "STATE", repr(str(ws.db_path))).replace("EVALUATE", repr(str(ws.root / "evaluate.py")))
    solution = attack + (ws.root / "solution.py").read_text()
    tr, ev, run_dir = _run(ws, solution)
    assert tr.status == "ok", tr.reason + tr.log_tail
    probe = json.loads((tr.model_path / "probe.json").read_text())
    assert probe["hidden"] != len((ws.data_dir / "hidden" / "reference.py").read_bytes()) and isinstance(
        probe["hidden"], str), probe
    assert isinstance(probe["state"], str) and probe["frozen"] != "written", probe
    assert "# rewritten" not in (ws.root / "evaluate.py").read_text()
    # the score is the CPU time measured outside, never the 0.0 the run printed and wrote
    measured = json.loads((run_dir / runner.MEASURED_NAME).read_text())
    assert ev is not None and ev.ok, ev and ev.reason
    assert ev.val_bpb == pytest.approx(measured["cpu_seconds"]) and ev.val_bpb > 0.05


def test_wrong_answers_a_symlinked_output_and_a_failing_gate_are_discards(fastsum):
    ws = fastsum
    good = (ws.root / "solution.py").read_text()
    wrong = good.replace("def solve(task):", "def solve(task):\n    return {'total': 0}\n\ndef _unused(task):")
    assert wrong != good
    tr, ev, _ = _run(ws, wrong, seed=6)
    # the gate (the frozen tests) catches it before the run; had it not, the evaluator would
    assert tr.status == "crash" and "gate failed" in tr.reason, tr.reason
    link = good + textwrap.dedent(f'''
        import os as _os
        _out = _os.environ["LOOPWRIGHT_OUTPUT"]
        if _os.path.basename(__file__) == "solution.py" and "unittest" not in __import__("sys").modules:
            _os.symlink({str(ws.data_dir / "hidden" / "reference.py")!r}, _os.path.join(_out, "extra.json"))
    ''')
    tr, ev, _ = _run(ws, link, seed=7)
    assert tr.status == "ok", tr.reason
    assert ev is not None and not ev.ok and "refused" in ev.reason, ev.reason


def test_an_edit_of_the_gate_is_caught_and_undone(fastsum):
    """A candidate that rewrites the frozen tests (so a broken solution passes) is tamper: the integrity check
    before the run puts the pinned bytes back and the run measures them."""
    ws = fastsum
    eng = Engine(ws.root)
    try:
        if not eng.ledger.baseline_samples(eng.campaign["id"]):
            eng.run_experiment("baseline")
        test_file = ws.root / "tests" / "test_solution.py"
        pinned_tests = test_file.read_bytes()
        test_file.write_text("def test_nothing():\n    pass\n")
        (ws.root / "solution.py").write_text((ws.root / "solution.py").read_text().replace(
            "def solve(task):", "def solve(task):\n    return {}\n\ndef _old(task):"))
        try:
            res = eng.run_experiment("skip the tests")
            assert res.status != "ok", "a candidate that broke the answers must not score"
        except LoopError as e:
            assert "frozen" in str(e) or "tamper" in str(e).lower() or "changed" in str(e), e
        assert test_file.read_bytes() == pinned_tests
        assert eng.ledger.events(eng.campaign["id"], kind="tamper"), "the edit of a frozen file is on the record"
    finally:
        eng.revert()
        eng.close()


# -------------------------------------------------------------------------------- campaigns from the CLI

@pytest.mark.slow
def test_fastsum_campaign_keeps_and_the_keep_replays(tmp_path):
    ws_dir = tmp_path / "fs"
    r = cli("init", str(ws_dir), "--target", "fastsum", "--wiring", "workspace")
    assert r.returncode == 0, r.stderr
    r = cli("run", "--agent", "builtin", "-n", "2", "-w", str(ws_dir))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cpu_seconds" in r.stdout and "val_bpb" not in r.stdout
    with Workspace.open(ws_dir).ledger() as led:
        c = led.campaign()
        kept = [e for e in led.experiments(c["id"]) if e["verdict"] == "keep"]
    assert kept, r.stdout      # SEGMENT x2 and CACHE x2 are each 30-45 % faster (bench/targets/fastsum/program.md)
    r = cli("replay", "--seeds", "3", "--json", "-w", str(ws_dir))
    assert r.returncode in (0, 1), r.stdout + r.stderr    # 1: a keep did not hold on every fresh seed
    out = json.loads(r.stdout)
    # CPU time on a shared 2-core machine is noisy run to run; the mean paired gain on fresh seeds must be there
    # (a ~40 % speed-up: a replay that finds none means the keep was noise)
    assert out["keeps"] and any(k["gain"] > 0 and k["outcome"] in ("holds", "holds on most")
                                for k in out["keeps"]), r.stdout
    r = cli("report", "-w", str(ws_dir))
    assert r.returncode == 0, r.stderr
    report = (ws_dir / ".loopwright" / "reports" / "report.md").read_text()
    assert "Target: **fastsum: minimize cpu_seconds" in report and "| cpu_seconds |" in report
    assert "bits/byte" not in report and "Hidden test split" not in report
    status = cli("status", "-w", str(ws_dir))
    assert status.returncode == 0 and "target fastsum" in status.stdout and "cpu_seconds" in status.stdout
    patch = cli("target", "patch", "-w", str(ws_dir))    # the result, carried back to the user's repository
    # the kept constants, whichever they are (under load SEGMENT 16 -> 32 may miss its bar and CACHE be kept)
    names = {m.group(1) for e in kept if (m := re.match(r"([A-Z_][A-Z0-9_]*) \S+ -> ", e["description"]))}
    assert names, [e["description"] for e in kept]
    assert patch.returncode == 0 and "--- a/solution.py" in patch.stdout, patch.stdout + patch.stderr
    assert all(f"\n+{name} = " in patch.stdout for name in names), (names, patch.stdout)
    copy = tmp_path / "mine"
    shutil.copytree(bundled_targets()["fastsum"], copy)
    applied = subprocess.run(["git", "apply", "-"], input=patch.stdout, text=True, cwd=copy, capture_output=True)
    assert applied.returncode == 0, applied.stderr
    assert (copy / "solution.py").read_text() == gitops.blob_bytes(
        ws_dir, Workspace.open(ws_dir).ledger().campaign()["best_commit"], "solution.py").decode()
    doctor = cli("doctor", "-w", str(ws_dir))
    assert "target fastsum: minimize cpu_seconds" in doctor.stdout, doctor.stdout
    assert "guard denies a write to evaluate.py" in doctor.stdout and "corpus" not in doctor.stdout


@pytest.mark.slow
def test_squeeze_campaign_is_deterministic_and_keeps(tmp_path):
    ws_dir = tmp_path / "sq"
    assert cli("init", str(ws_dir), "--target", "squeeze", "--wiring", "workspace").returncode == 0
    r = cli("run", "--agent", "builtin", "-n", "1", "-w", str(ws_dir))
    assert r.returncode == 0, r.stdout + r.stderr
    with Workspace.open(ws_dir).ledger() as led:
        c = led.campaign()
        base = led.baseline_samples(c["id"])
        kept = [e for e in led.experiments(c["id"]) if e["verdict"] == "keep"]
    assert len(base) == 2 and len(set(base)) == 1 and base[0] == 113130.0, base
    assert kept and kept[0]["val_bpb"] < base[0] - 1, kept


def test_a_target_with_no_hidden_files_keeps_its_contract(tmp_path):
    """`hidden = []` survives init's rewrite of loopwright.toml (an empty list is not the GPT default's
    test split), so the workspace's frozen hash matches its lock and the integrity check is clean."""
    from mcp_server.loop import integrity

    folder = tmp_path / "t"
    shutil.copytree(bundled_targets()["squeeze"], folder)
    shutil.rmtree(folder / "hidden")
    toml = folder / "loopwright.toml"
    toml.write_text(toml.read_text().replace('hidden = ["hidden/**"]', "hidden = []"))
    ws = init_workspace(tmp_path / "ws", target=str(folder))
    assert ws.cfg.paths.hidden == [] and Workspace.open(ws.root).cfg.paths.hidden == []
    assert integrity.check(ws, ws.pinned_commit) == []


def _tiny_target(folder: Path, direction: str = "maximize", noise: str = "deterministic") -> Path:
    """A target of a few lines: the run writes X, the evaluator scores -(X - 7)^2 (best at X = 7)."""
    folder.mkdir(parents=True)
    (folder / "solution.py").write_text("X = 2\n")
    (folder / "run.py").write_text(textwrap.dedent('''
        import json, os, pathlib
        import solution
        pathlib.Path(os.environ["LOOPWRIGHT_OUTPUT"], "x.json").write_text(json.dumps({"x": solution.X}))
    '''))
    (folder / "score.py").write_text(textwrap.dedent('''
        import json, os, pathlib
        x = json.loads(pathlib.Path(os.environ["LOOPWRIGHT_OUTPUT"], "x.json").read_text())["x"]
        print(json.dumps({"ok": True, "metric": -(x - 7) ** 2}))
    '''))
    (folder / "program.md").write_text("Move X so that the score is as high as possible.\n")
    (folder / "loopwright.toml").write_text(textwrap.dedent(f'''
        [target]
        name = "tiny"
        run = "python run.py"
        evaluate = "python score.py"
        metric = "score"
        direction = "{direction}"
        noise = "{noise}"
        time_budget = 20

        [paths]
        editable = ["solution.py"]
        frozen = ["run.py", "score.py", "program.md"]
        hidden = []

        [noise]
        baseline_seeds = 2
        min_delta = 0.5
    '''))
    return folder


@pytest.mark.slow
def test_a_maximised_metric_is_kept_upward_and_shown_with_its_own_sign(tmp_path):
    src = _tiny_target(tmp_path / "tiny")
    ws_dir = tmp_path / "ws"
    assert cli("init", str(ws_dir), "--target", str(src), "--wiring", "workspace").returncode == 0
    r = cli("run", "--agent", "builtin", "-n", "2", "--no-mechanisms", "-w", str(ws_dir))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "baseline -25.0000" in r.stdout, r.stdout      # X = 2: -(2 - 7)^2, shown as the user's metric
    with Workspace.open(ws_dir).ledger() as led:
        c = led.campaign()
        kept = [e for e in led.experiments(c["id"]) if e["verdict"] == "keep"]
        base = led.baseline_samples(c["id"])
    assert base == [25.0, 25.0]                            # the loop's scale: negated, lower is better
    assert kept and all(k["val_bpb"] < 25.0 for k in kept), kept
    assert cli("report", "-w", str(ws_dir)).returncode == 0
    report = (ws_dir / ".loopwright" / "reports" / "report.md").read_text()
    assert "**-25.0000" in report and "maximize score" in report, report[:800]


def test_a_deterministic_target_whose_metric_varies_is_refused(tmp_path):
    src = _tiny_target(tmp_path / "tiny", direction="minimize")
    (src / "score.py").write_text("import json, os\nprint(json.dumps({'ok': True, 'metric': int(os.environ['LOOPWRIGHT_SEED'])}))\n")
    ws = init_workspace(tmp_path / "ws", target=str(src))
    with Engine(ws.root) as eng, pytest.raises(LoopError, match=r"declares noise = \"deterministic\".*varies"):
        eng.run_experiment("baseline")


def test_editable_globs_become_the_files_they_match(tmp_path):
    src = _tiny_target(tmp_path / "tiny")
    (src / "lib").mkdir()
    (src / "lib" / "a.py").write_text("A = 1\n")
    (src / "lib" / "b.py").write_text("B = 2\n")
    toml = src / "loopwright.toml"
    toml.write_text(toml.read_text().replace('editable = ["solution.py"]', 'editable = ["solution.py", "lib/*.py"]'))
    ws = init_workspace(tmp_path / "ws", target=str(src))
    assert ws.cfg.paths.editable == ["solution.py", "lib/a.py", "lib/b.py"]
    toml.write_text(toml.read_text().replace('frozen = ["run.py"', 'frozen = ["lib/**", "run.py"'))
    with pytest.raises(WorkspaceError, match=r"lib/a\.py.*both an editable and a frozen"):
        init_workspace(tmp_path / "ws2", target=str(src))


def test_a_keep_notification_names_the_target_metric_with_its_own_sign():
    from mcp_server.notify import jira, slack

    payload = {"val_bpb": 25.0, "previous_best": 36.0, "baseline": 36.0, "metric": "score", "sign": -1.0,
               "experiment_id": 3, "commit": "abc"}
    title, _ = slack._keep(payload, "main")
    assert title == "New best score -25.0000 (+11.0000) · main"
    assert jira.comment_text("keep", payload).startswith("New best score -25.000000 (experiment #3")
    gpt = slack._keep({"val_bpb": 1.5, "previous_best": 1.6}, "main")[0]
    assert gpt.startswith("New best val_bpb 1.5000 (-0.1000)")


def test_an_approve_keeps_campaign_on_a_target_waits_for_a_person_then_keeps(tmp_path):
    """The autonomy slider on a target (squeeze, real runs): the keep waits on its branch, a person's approval
    makes it the best, and the tree the next run measures is the approved bytes."""
    from mcp_server.loop import decisions
    from mcp_server.loop import settings as setmod

    ws = init_workspace(tmp_path / "ws", target="squeeze")
    setmod.save(ws.settings_path, setmod.set_value(ws.settings(), "campaign.autonomy", "approve-keeps"))
    with Engine(ws.root) as eng:
        assert eng.run_experiment("baseline").status == "ok"
        src = (ws.root / "compressor.py").read_text()
        (ws.root / "compressor.py").write_text(src.replace("\nLEVEL = 1\n", "\nLEVEL = 6\n"))
        res = eng.run_experiment("LEVEL 1 -> 6")
        assert res.status == "ok" and res.metric == "compressed_bytes" and res.metric_value < 113130
        sc = eng.score(res.experiment_id)
        assert sc.verdict == "pending_approval", sc
        best_before = eng.campaign["best_commit"]
    a, decided = decisions.decide(ws.root, 1, True, "ana", "cli")
    assert decided and decisions.apply_approved(ws.root)[0].startswith("#1: applied")
    with Engine(ws.root) as eng:
        c = eng.campaign
        assert c["best_commit"] != best_before and c["best_experiment_id"] == res.experiment_id
        assert "\nLEVEL = 6\n" in gitops.blob_bytes(ws.root, c["best_commit"], "compressor.py").decode()


@pytest.fixture(scope="module")
def squeeze(tmp_path_factory) -> Workspace:
    return init_workspace(tmp_path_factory.mktemp("squeeze") / "ws", target="squeeze")


def test_squeeze_refuses_a_forged_stream_and_its_candidate_reads_nothing_hidden(squeeze):
    """squeeze's attacks: a compressor that reads the hidden expected hash, writes to the frozen evaluator and
    prints a result line, then hands back a stream that does not decompress to the corpus (a tiny 'score')."""
    ws = squeeze
    attack = ATTACK.replace("HIDDEN", repr(str(ws.data_dir / "hidden" / "expected.json"))).replace(
        "STATE", repr(str(ws.db_path))).replace("EVALUATE", repr(str(ws.root / "evaluate.py")))
    forged = attack + (ws.root / "compressor.py").read_text() + "\n\ndef compress(data):\n    return b'x\\x9c\\x03\\x00'\n"
    tr, ev, _ = _run(ws, forged, seed=11)
    if tr.status == "ok":      # the gate's round-trip test may already refuse it; if not, the evaluator must
        probe = json.loads((tr.model_path / "probe.json").read_text())
        assert isinstance(probe["hidden"], str) and isinstance(probe["state"], str) and probe["frozen"] != "written"
        assert ev is not None and not ev.ok, ev
    else:
        assert "gate failed" in tr.reason, tr.reason
    assert "# rewritten" not in (ws.root / "evaluate.py").read_text()
    honest = (ws.root / "compressor.py").read_text().replace("\nLEVEL = 1\n", "\nLEVEL = 9\n")
    tr, ev, _ = _run(ws, honest, seed=12)
    assert tr.status == "ok" and ev is not None and ev.ok and ev.val_bpb < 113130, (tr.reason, ev and ev.reason)
