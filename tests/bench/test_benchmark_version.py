"""Benchmark versions (issue 26 item 1): the bundled reference baseline never changes within a version,
the version is named in the lock, budget_check, status and report.md, and a campaign's keeps live on its
branch, never in bench/gpt/train.py."""
from __future__ import annotations

import ast
import hashlib
import io
import json
import shutil
import tokenize
from pathlib import Path

import pytest

from mcp_server.loop.workspace import WorkspaceError

from conftest import BENCH, make_workspace, record_baseline, set_constant

# Each version's reference baseline: its hyperparameter values, and the digest of its code with comments removed
# (comments may say more; nothing else may change within a version -- a new baseline is a new VERSION and a new entry
# here). v1 is kept for the record: it is train.py at commit 3f4ccb9.
V1_VALUES = {"DEPTH": 2, "D_MODEL": 64, "N_HEAD": 4, "MLP_RATIO": 1, "BATCH_SIZE": 8, "LR": 0.008,
             "EMBED_LR": 0.09, "WEIGHT_DECAY": 0.0, "BETA1": 0.9, "BETA2": 0.95, "WARMUP_STEPS": 0,
             "WARMDOWN_FRAC": 0.2, "GRAD_CLIP": 1.0, "LOGIT_SOFTCAP": 15.0, "QK_NORM": False, "USE_MUON": False,
             "MUON_LR": 0.02, "COMPILE_ON_CUDA": True, "MAX_STEPS": 0, "QUICK_EVAL_TOKENS": 8192,
             "PRINT_EVERY_S": 1.0}
V2_VALUES = {"DEPTH": 2, "D_MODEL": 64, "N_HEAD": 4, "MLP_RATIO": 4, "BATCH_SIZE": 12, "LR": 0.001,
             "EMBED_LR": 0.001, "WEIGHT_DECAY": 0.1, "BETA1": 0.9, "BETA2": 0.99, "WARMUP_STEPS": 20,
             "WARMDOWN_FRAC": 1.0, "GRAD_CLIP": 1.0, "LOGIT_SOFTCAP": 0.0, "QK_NORM": False, "USE_MUON": False,
             "MUON_LR": 0.02, "COMPILE_ON_CUDA": True, "MAX_STEPS": 0, "QUICK_EVAL_TOKENS": 8192,
             "AVERAGE_FRAC": 0.0, "PRINT_EVERY_S": 1.0}
BASELINES = {"v1": (V1_VALUES, "f54c99c874e28d0188a7485edff6268fceb8a81a9bba41156cd8b8b74a4779d9"),
             "v2": (V2_VALUES, "6a512ba27bfcdad568dc4f34b57635e5281481f8d7c35758178dc436b03e40c6")}
CURRENT = "v2"


def code_digest(src: str) -> str:
    """sha256 of the source without its comments and blank lines: what runs, not what it says."""
    lines = src.splitlines()
    for tok in reversed(list(tokenize.generate_tokens(io.StringIO(src).readline))):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            lines[row - 1] = lines[row - 1][:col]
    return hashlib.sha256("\n".join(x.rstrip() for x in lines if x.strip()).encode()).hexdigest()


def hyperparameters(src: str) -> dict:
    """The top-level UPPER_CASE literal assignments between the Hyperparameters header and the model."""
    out = {}
    for node in ast.parse(src).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name.isupper() and isinstance(node.value, ast.Constant):
                out[name] = node.value.value
    return out


def test_the_bundled_baseline_is_the_current_version_and_unchanged():
    from mcp_server.loop.workspace import bench_version

    assert bench_version(BENCH) == CURRENT
    values, digest = BASELINES[CURRENT]
    src = (BENCH / "train.py").read_text()
    assert hyperparameters(src) == values, f"a {CURRENT} value changed: a new reference baseline is a new VERSION"
    assert code_digest(src) == digest, f"train.py's code changed within {CURRENT}: bump VERSION"
    # the digest ignores comments only: a changed value or statement changes it
    assert code_digest(src.replace("LR = 0.001", "LR = 0.002", 1)) != digest
    assert code_digest(src.replace("# Model", "# the model", 1)) == digest


def test_v2_differs_from_v1_by_its_recipe_only():
    """v2 kept v1's model size and code, changed the recipe to nanoGPT's, and added one opt-in knob (off)."""
    changed = {k for k in V1_VALUES if V1_VALUES[k] != V2_VALUES[k]}
    assert changed == {"MLP_RATIO", "BATCH_SIZE", "LR", "EMBED_LR", "WEIGHT_DECAY", "BETA2", "WARMUP_STEPS",
                       "WARMDOWN_FRAC", "LOGIT_SOFTCAP"}
    assert set(V2_VALUES) - set(V1_VALUES) == {"AVERAGE_FRAC"} and V2_VALUES["AVERAGE_FRAC"] == 0.0


def test_every_hyperparameter_says_where_its_value_comes_from():
    src = (BENCH / "train.py").read_text()
    for line in src.splitlines():
        name = line.split("=", 1)[0].strip()
        if name in BASELINES[CURRENT][0]:
            comment = line.partition("#")[2].strip()
            assert len(comment) > 10, f"{name} has no comment on its origin: {line!r}"


def test_records_are_kept_apart_from_the_baseline():
    text = (BENCH / "RECORDS.md").read_text()
    assert "## Format" in text and all(f"## {v} " in text for v in BASELINES)
    from mcp_server.loop.workspace import BENCH_FILES
    assert "RECORDS.md" not in BENCH_FILES       # never copied into a workspace, never part of a campaign


def test_a_malformed_version_file_is_refused_with_what_to_do(tmp_path):
    from mcp_server.loop.workspace import WorkspaceError, bench_version

    assert bench_version(tmp_path) is None        # a benchmark folder of one's own need not have one
    (tmp_path / "VERSION").write_text("v1; rm -rf /\n")
    with pytest.raises(WorkspaceError, match="must hold one version name such as v1"):
        bench_version(tmp_path)


def test_init_refuses_the_benchmark_folder_itself(tmp_path):
    """Workspace = benchmark folder: every keep would commit its train.py, the reference baseline."""
    from mcp_server.loop.setup import init_workspace
    from mcp_server.loop.workspace import WorkspaceError

    bench = tmp_path / "bench"
    shutil.copytree(BENCH, bench, ignore=shutil.ignore_patterns("__pycache__", ".loopwright"))
    before = (bench / "train.py").read_bytes()
    with pytest.raises(WorkspaceError, match="is the benchmark folder itself"):
        init_workspace(bench, corpus="stdlib", bench_dir=bench, force=True)
    assert (bench / "train.py").read_bytes() == before and not (bench / ".git").exists()


def test_a_keep_stays_on_the_campaign_branch_and_never_rewrites_the_bundled_baseline(tmp_path):
    """On the default corpus (stdlib-hidden: its held-out modules masked in the sandbox, which the run must
    not need), as the demo runs it."""
    from mcp_server.loop import gitops
    from mcp_server.loop.engine import Engine
    from mcp_server.loop.status import session_summary
    from mcp_server.report.writer import write_report

    bundled = BENCH / "train.py"
    before = hashlib.sha256(bundled.read_bytes()).hexdigest()
    ws = make_workspace(tmp_path / "ws", "stdlib-hidden", noise={"baseline_seeds": 2, "rotate_every": 0})
    lock = json.loads((ws.root / "loopwright.lock").read_text())
    assert lock["benchmark_version"] == CURRENT == ws.benchmark_version and lock["corpus"] == "stdlib-hidden"
    train = ws.root / "train.py"
    assert train.read_bytes() == bundled.read_bytes() and not train.samefile(bundled)
    with Engine(ws.root) as eng:
        pinned = eng.campaign["pinned_commit"]
        record_baseline(eng, (50.0, 50.0))    # a recorded baseline any trained model beats: the change is kept
        set_constant(train, "MAX_STEPS", "3")  # a few steps: seconds per run
        edited = train.read_bytes()
        res = eng.run_experiment("three steps")
        assert res.status == "ok" and res.val_bpb is not None and res.val_bpb < 8.0, res   # trained, sandboxed
        assert json.loads(eng.ledger.experiment(res.experiment_id)["metrics_json"])["sandboxed"] == 1
        sc = eng.score(res.experiment_id)
        assert sc.verdict == "keep", sc
        best = eng.campaign["best_commit"]
        branch = eng.campaign["branch"]
        assert eng.budget_check().benchmark_version == CURRENT
    # the keep is the campaign branch's head; the pinned baseline is the bundled one, byte for byte
    assert gitops.blob_bytes(ws.root, best, "train.py") == edited
    assert gitops.blob_bytes(ws.root, branch, "train.py") == edited
    assert gitops.blob_bytes(ws.root, pinned, "train.py") == bundled.read_bytes()
    assert hashlib.sha256(bundled.read_bytes()).hexdigest() == before
    assert code_digest(bundled.read_text()) == BASELINES[CURRENT][1]
    report = write_report(ws.root)
    assert f"Benchmark version: **{CURRENT}**" in report.markdown.read_text()
    assert f"benchmark {CURRENT}" in session_summary(ws.root)


def test_a_workspace_from_an_unversioned_folder_says_so(tmp_path, small_corpus):
    bench = tmp_path / "bench"
    bench.mkdir()
    for name in ("prepare.py", "train.py", "program.md"):
        shutil.copyfile(BENCH / name, bench / name)
    with pytest.raises(WorkspaceError, match="lacks evaluate.py, pt2audit.py"):   # prepare.py loads them
        make_workspace(tmp_path / "ws", small_corpus, bench_dir=bench)
    for name in ("evaluate.py", "pt2audit.py"):
        shutil.copyfile(BENCH / name, bench / name)
    ws = make_workspace(tmp_path / "ws", small_corpus, bench_dir=bench)
    assert json.loads((ws.root / "loopwright.lock").read_text())["benchmark_version"] is None
    assert ws.benchmark_version is None
    assert Path(ws.root / "prepare.py").read_bytes() == (BENCH / "prepare.py").read_bytes()
