"""The report: progress.png, report.md and results.tsv agree with the ledger."""
from __future__ import annotations

import dataclasses
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mcp_server.loop.config import LoopwrightConfig
from mcp_server.report.writer import collect, divergence, plot_progress, render_markdown

from conftest import REPO, make_workspace, set_constant

CFG = LoopwrightConfig()   # noise: k_sigma 2, min_delta 0.002, sigma_floor 0.0005


def _rows(spec: list[tuple]) -> list[dict]:
    """(kind, val, test, verdict/status, description[, confirm_of]) -> ledger-like rows."""
    out = []
    for i, s in enumerate(spec, 1):
        kind, val, test, outcome, desc = s[:5]
        status = outcome if outcome in ("crash", "timeout", "rejected") else "ok"
        verdict = "discard" if status != "ok" else ("baseline" if kind == "base" else outcome)
        out.append({"id": i, "is_baseline": int(kind == "base"), "status": status, "verdict": verdict,
                    "val_bpb": val, "test_bpb": test, "confirm_of": s[5] if len(s) > 5 else None,
                    "commit_sha": f"{i:040x}", "description": desc,
                    "reason": "train.py exited with code 1" if status != "ok" else None, "verdict_reason": None,
                    "num_steps": 40 if status == "ok" else None})
    return out


SPEC = [("base", 2.000, 2.010, "baseline", "baseline 1"),
        ("base", 2.010, 2.020, "baseline", "baseline 2"),
        ("cand", 1.950, 1.960, "keep", "LR 0.004 -> 0.008"),
        ("cand", 1.990, 2.000, "discard", "DEPTH 4 -> 5"),
        ("cand", None, None, "crash", "D_MODEL 128 -> 4096"),
        ("cand", 1.930, 1.950, "keep", "BATCH_SIZE 16 -> 8"),
        ("conf", 1.940, 1.950, "keep", "confirm #6", 6),
        ("cand", 7.900, 7.900, "discard", "LR 0.008 -> 0.5")]


def test_collect_counts_and_numbers():
    d = collect(_rows(SPEC), CFG, "t")
    assert d.n == 5 and len(d.kept) == 2 and len(d.crashed) == 1
    assert d.title == "5 experiments, 2 kept, 1 crashed"
    assert d.baseline_mean == pytest.approx(2.005)
    assert d.sigma == pytest.approx(statistics.stdev([2.0, 2.01]))
    assert d.best.id == 6 and d.best_val == pytest.approx(1.935)     # the confirm run is averaged in
    assert d.best.samples == 2
    assert d.gain == pytest.approx(2.005 - 1.935)
    (p1, dprev1, dbase1), (p2, dprev2, dbase2) = d.kept
    assert dprev1 == pytest.approx(1.95 - 2.005) and dprev2 == pytest.approx(1.935 - 1.95)
    assert dbase2 == pytest.approx(1.935 - 2.005)
    assert [p.number for p in d.points] == [1, 2, 3, 4, 5]      # confirm runs are not points of their own


def test_plot_is_a_png_with_the_ledger_counts(tmp_path: Path):
    import matplotlib.image

    d = collect(_rows(SPEC), CFG, "t")
    info = plot_progress(d, tmp_path / "progress.png")
    data = info.path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    img = matplotlib.image.imread(info.path)
    assert img.shape[0] > 400 and img.shape[1] > 800
    assert (info.n_experiments, info.n_kept, info.n_crashed) == (5, 2, 1)
    assert info.title == "5 experiments, 2 kept, 1 crashed"


def test_markdown_numbers_match_the_ledger():
    d = collect(_rows(SPEC), CFG, "t")
    md = render_markdown(d)
    assert "5 experiments, 2 kept, 1 crashed" in md
    assert "**2.0050 ± 0.0071** val_bpb (2 seeds)" in md
    assert "Best: **1.9350** (experiment #6" in md and "gain **0.0700**" in md
    kept_rows = [l for l in md.splitlines() if re.match(r"\| \d+ \| #\d+ \|", l)]
    assert len(kept_rows) == 2
    assert "| 1 | #3 | LR 0.004 -> 0.008 | 1.9500 | -0.0550 | -0.0550 | 1 | 40 |" in kept_rows[0]
    assert "| 2 | #6 | BATCH_SIZE 16 -> 8 | 1.9350 | -0.0150 | -0.0700 | 2 | 40 |" in kept_rows[1]
    assert "trained a very different number of steps" not in md
    assert "| #5 | D_MODEL 128 -> 4096 | crash | train.py exited with code 1 |" in md
    assert "test_bpb: baseline 2.0150 → best 1.9500" in md and "No val/test divergence" in md
    thr = d.threshold
    # paired rule: no recorded pairs here, so sigma_d is the prior; the bar is for the seed set's n pairs
    n = CFG.noise.baseline_seeds
    assert d.sigma_paired == pytest.approx(CFG.noise.sigma_prior) and d.paired_dof == 0
    assert f"**{thr:.5f}**" in md and thr == pytest.approx(max(0.002, 2 * d.sigma_paired / n ** 0.5))
    assert f"**{d.mde:.4f}** bits/byte" in md


def test_markdown_says_plainly_when_nothing_cleared_the_noise():
    spec = SPEC[:2] + [("cand", 2.004, 2.0, "discard", "LR 0.004 -> 0.0045"),
                       ("cand", 2.100, 2.1, "discard", "DEPTH 4 -> 2")]
    d = collect(_rows(spec), CFG, "t")
    md = render_markdown(d)
    assert d.best is None and d.gain == 0
    assert "No change cleared the noise threshold" in md and "still the baseline" in md
    assert "1 discarded experiment(s) measured below the best" in md
    assert "## Kept changes\n\nNone." in md


def test_val_test_divergence_is_flagged():
    spec = SPEC[:2] + [("cand", 1.900, 2.030, "keep", "peek at val")]
    d = collect(_rows(spec), CFG, "t")
    div = divergence(d)
    assert div["flagged"] and div["test_gain"] < 0 < div["val_gain"]
    assert "Divergence flag" in render_markdown(d)


def test_loopwright_report_on_a_workspace(tmp_path: Path, small_corpus):
    """The CLI writes the three files from a real ledger (experiments recorded without training)."""
    from mcp_server.loop import gitops
    from mcp_server.loop.engine import Engine

    ws = make_workspace(tmp_path / "ws", small_corpus)
    with Engine(ws.root) as eng:
        c = eng.campaign
        for i, v in enumerate((2.0, 2.01)):
            e = eng.ledger.start_experiment(c["id"], f"baseline {i}", is_baseline=1, commit_sha=c["best_commit"])
            eng.ledger.update_experiment(e, status="ok", val_bpb=v, test_bpb=v + 0.01, verdict="baseline",
                                         finished_at=time.time())
        set_constant(ws.root / "train.py", "LR", "0.0123")   # any value other than the default
        sha, _ = gitops.commit_editable(ws.root, ["train.py"], ".loopwright", "LR")
        e = eng.ledger.start_experiment(c["id"], "LR 0.004 -> 0.008", commit_sha=sha, parent_commit=c["best_commit"])
        eng.ledger.update_experiment(e, status="ok", val_bpb=1.9, test_bpb=1.91, finished_at=time.time())
        eng.score(e)
        n_events = len(eng.ledger.events())
    proc = subprocess.run([sys.executable, "-m", "mcp_server.cli", "report", "--workspace", str(ws.root)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "1 experiments, 1 kept, 0 crashed" in proc.stdout
    out = ws.reports_dir
    assert (out / "progress.png").read_bytes()[:4] == b"\x89PNG"
    md = (out / "report.md").read_text()
    assert "Best: **1.9000** (experiment #3" in md and f"`{sha[:10]}`" in md
    tsv = (out / "results.tsv").read_text().splitlines()
    assert tsv[0].split("\t")[:5] == ["commit", "val_bpb", "memory_gb", "status", "description"]
    assert len(tsv) == 4 and tsv[3].split("\t")[3] == "keep"
    with Engine(ws.root) as eng:
        assert len(eng.ledger.events()) == n_events   # writing a report records nothing


def test_markdown_warns_about_runs_too_short_to_learn_and_sigma_at_its_floor():
    rows = _rows(SPEC)
    assert "Training steps per run: median 40" in render_markdown(collect(rows, CFG, "t"))
    assert "start-up more than learning" not in render_markdown(collect(rows, CFG, "t"))
    for r in rows:
        r["num_steps"] = 1 if r["status"] == "ok" else None
        if r["is_baseline"]:
            r["val_bpb"] = 2.0   # two identical seeds: sigma falls to the floor
    md = render_markdown(collect(rows, CFG, "t"))
    assert "median 1 (baseline: 1, 1)" in md and "start-up more than learning" in md
    assert "σ is at its floor (0.0005)" in md


def test_markdown_flags_keeps_that_trained_a_different_number_of_steps():
    rows = _rows(SPEC)
    rows[2]["num_steps"] = 90     # experiment #3 (kept) ran 90 steps where the baseline ran 40
    md = render_markdown(collect(rows, CFG, "t"))
    assert "1 kept change(s) trained a very different number of steps than the baseline (median 40): " \
           "#3 90 steps" in md


def test_agent_written_descriptions_are_inert_in_report_md_and_the_plot(tmp_path):
    """Red team round 3: descriptions went raw into report.md (links, images, HTML) and into
    matplotlib (a `$` starts mathtext)."""
    rows = _rows(SPEC)
    evil = "[Approve here](http://evil.example) <img src=x onerror=alert(1)> ![i](http://e/x.png) $\\frac{"
    rows[2]["description"] = evil     # the kept experiment #3
    data = collect(rows, CFG, "t")
    md = render_markdown(data)
    assert not re.search(r"(?<!\\)\]\(http", md) and "<img" not in md and "![i]" not in md   # no live link
    assert "\\[Approve here\\](http://evil.example)" in md and "&lt;img" in md
    plot_progress(data, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_a_maximised_metric_is_plotted_as_the_user_reads_it():
    """The loop stores a maximised metric negated; the plot flips the axis and the ticks back, so the numbers
    are the metric's own and better is up (before: "−metric (lower is better)")."""
    from matplotlib.figure import Figure

    from mcp_server.report.writer import metric_axis

    data = collect(_rows(SPEC), CFG, "t")
    ax = Figure().subplots()
    ax.set_ylim(-30.0, -20.0)                      # the loop's scale: a metric of 20..30, negated
    metric_axis(ax, dataclasses.replace(data, metric="score", sign=-1.0))
    assert ax.yaxis_inverted() and ax.get_ylabel() == "score (higher is better)"
    assert ax.yaxis.get_major_formatter()(-25.0, 0) == "25"
    plain = Figure().subplots()
    metric_axis(plain, data)
    assert not plain.yaxis_inverted() and plain.get_ylabel() == "val_bpb (lower is better)"
