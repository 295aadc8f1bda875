"""`loopwright report`: progress.png, report.md and results.tsv for people.

Written to .loopwright/reports/. The numbers come from the ledger only, and the
hidden test split appears here (never through MCP): a best version whose
validation gain does not carry over to the test split is flagged.

The report says plainly when nothing cleared the noise threshold.
"""
from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from mcp_server.loop import verdict as verdictmod
from mcp_server.loop.config import LoopwrightConfig
from mcp_server.loop.targets import metric_label
from mcp_server.loop.workspace import lock_noise_prior
from mcp_server.notify.events import plot_marker_key

if TYPE_CHECKING:   # replay imports the runner; the report needs it only when one was run
    from mcp_server.loop.replay import ReplayResult

FAILED = ("crash", "timeout", "rejected")


@dataclass
class Point:
    number: int                 # x: 1.. for candidates in the order they ran
    id: int
    description: str
    status: str
    verdict: Optional[str]
    val_bpb: Optional[float]    # mean of the run and its confirm runs
    test_bpb: Optional[float]
    samples: int
    commit: str
    reason: str = ""
    num_steps: Optional[int] = None
    paired_gain: Optional[float] = None   # -mean(candidate - reference) over its seed-matched pairs
    pairs: int = 0


@dataclass
class ReportData:
    tag: str
    baseline: list[float]
    baseline_test: list[float]
    sigma: float
    threshold: float
    min_delta: float
    k_sigma: float
    points: list[Point]
    kept: list[tuple[Point, float, float]]      # (point, delta vs previous best, delta vs baseline)
    best: Optional[Point]
    budget: dict = field(default_factory=dict)
    sigma_floor: float = 0.0
    baseline_steps: list[int] = field(default_factory=list)
    sigma_paired: Optional[float] = None   # SD of a paired difference (pooled campaign pairs + prior)
    paired_dof: int = 0
    n_pairs: int = 0                       # pairs per candidate (the seed set)
    mde: Optional[float] = None
    pairs_rule: str = "fixed"              # [noise] pairs: fixed (the seed set) or adaptive (sequential test)
    max_pairs: int = 0
    reference_runs: int = 0
    replay: Optional[ReplayResult] = None  # the latest replay, if one was run
    mechanism_lines: list[str] = field(default_factory=list)   # mechanisms/report.py: the outer loop's section
    approval_lines: list[str] = field(default_factory=list)    # loop/approvals.py: what waited on a person
    executor_lines: list[str] = field(default_factory=list)    # executor_section: in flight, workers, lost runs
    prior_note: str = ""   # where sigma_d's prior came from
    benchmark_version: Optional[str] = None   # loopwright.lock's: the reference baseline is fixed within it
    metric: str = "val_bpb"        # what the score is called: a target's own metric (loop/targets.py)
    unit: str = "bits/byte"
    target: Optional[str] = None   # "name: minimize metric (noise)" for a target workspace
    sign: float = 1.0              # -1 for a maximised metric: stored negated (the loop minimises), shown as is

    @property
    def n(self) -> int:
        return len(self.points)

    @property
    def crashed(self) -> list[Point]:
        return [p for p in self.points if p.status in FAILED]

    @property
    def baseline_mean(self) -> Optional[float]:
        return statistics.fmean(self.baseline) if self.baseline else None

    @property
    def best_val(self) -> Optional[float]:
        return self.best.val_bpb if self.best else self.baseline_mean

    @property
    def gain(self) -> Optional[float]:
        """baseline - best (positive = better)."""
        if self.baseline_mean is None or self.best_val is None:
            return None
        return self.baseline_mean - self.best_val

    @property
    def title(self) -> str:
        return f"{self.n} experiments, {len(self.kept)} kept, {len(self.crashed)} crashed"


def collect(rows: list[dict], cfg: LoopwrightConfig, tag: str = "", budget: Optional[dict] = None) -> ReportData:
    """Everything the report shows, from one campaign's experiment rows (Ledger.experiments)."""
    rows = sorted(rows, key=lambda r: r["id"])
    base_rows = [r for r in rows if r["is_baseline"] and r["status"] == "ok" and r["val_bpb"] is not None]
    baseline = [r["val_bpb"] for r in base_rows]
    baseline_test = [r["test_bpb"] for r in base_rows if r["test_bpb"] is not None]
    confirms: dict[int, list[dict]] = {}
    for r in rows:
        if r["confirm_of"] is not None and r["status"] == "ok" and r["val_bpb"] is not None:
            confirms.setdefault(r["confirm_of"], []).append(r)
    sigma = max(cfg.noise.sigma_floor, statistics.stdev(baseline)) if len(baseline) >= 2 else cfg.noise.sigma_floor
    by_id = {r["id"]: r for r in rows}
    diffs: dict[int, list[float]] = {}     # comparison (candidate id) -> its paired differences
    for r in rows:
        ref = by_id.get(r.get("paired_with")) if r.get("paired_with") else None
        if (ref and r["status"] == "ok" and ref["status"] == "ok" and r["val_bpb"] is not None
                and ref["val_bpb"] is not None):
            diffs.setdefault(r["confirm_of"] or r["id"], []).append(r["val_bpb"] - ref["val_bpb"])
    sigma_d, dof = verdictmod.pooled_sigma(list(diffs.values()), cfg.noise)
    n_pairs = cfg.noise.baseline_seeds
    points: list[Point] = []
    for r in rows:
        if r["is_baseline"] or r["confirm_of"] is not None:
            continue
        runs = ([r] if r["val_bpb"] is not None and r["status"] == "ok" else []) + confirms.get(r["id"], [])
        val = statistics.fmean(x["val_bpb"] for x in runs) if runs else None
        tests = [x["test_bpb"] for x in runs if x["test_bpb"] is not None]
        points.append(Point(len(points) + 1, r["id"], r["description"], r["status"], r["verdict"], val,
                            statistics.fmean(tests) if tests else None, len(runs), (r["commit_sha"] or "")[:10],
                            r["reason"] or r["verdict_reason"] or "", r.get("num_steps"),
                            -statistics.fmean(diffs[r["id"]]) if diffs.get(r["id"]) else None,
                            len(diffs.get(r["id"], []))))
    kept = []
    best_val = statistics.fmean(baseline) if baseline else None
    best: Optional[Point] = None
    for p in points:
        if p.verdict == "keep" and p.val_bpb is not None:
            prev = best_val if best_val is not None else p.val_bpb
            kept.append((p, p.val_bpb - prev, p.val_bpb - (statistics.fmean(baseline) if baseline else p.val_bpb)))
            best_val, best = p.val_bpb, p
    return ReportData(tag, baseline, baseline_test, sigma,
                      verdictmod.keep_bar(sigma_d, cfg.noise, n_pairs), cfg.noise.min_delta,
                      cfg.noise.k_sigma, points, kept, best, budget or {}, cfg.noise.sigma_floor,
                      [r["num_steps"] for r in base_rows if r.get("num_steps") is not None],
                      sigma_paired=sigma_d, paired_dof=dof, n_pairs=n_pairs,
                      mde=verdictmod.achieved_mde(sigma_d, cfg.noise), pairs_rule=cfg.noise.pairs,
                      max_pairs=cfg.noise.max_pairs,
                      reference_runs=sum(r.get("role") == "reference" for r in rows),
                      metric=metric_label(cfg), unit="bits/byte" if cfg.target is None else cfg.target.metric,
                      target=None if cfg.target is None else
                      f"{cfg.target.name}: {cfg.target.direction} {cfg.target.metric}, noise {cfg.target.noise}",
                      sign=1.0 if cfg.target is None else cfg.target.sign())


def _measured(p: Point) -> float:
    """The val_bpb of a point that has one: every keep does (collect keeps only measured points)."""
    if p.val_bpb is None:
        raise ValueError(f"experiment #{p.id} has no val_bpb")
    return p.val_bpb


# ---------------------------------------------------------------------------
# The chart, in the style of autoresearch's progress.png

@dataclass
class PlotInfo:
    path: Path
    title: str
    n_experiments: int
    n_kept: int
    n_crashed: int


def plot_progress(data: ReportData, path: Path) -> PlotInfo:
    """x = experiment number, y = val_bpb: grey discards, green annotated keeps, red crashes, best line."""
    # The object API, not pyplot: no global state, so the server's notifier thread can draw safely.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 6.5), dpi=110)
    ax = fig.subplots()
    ok = [(p, p.val_bpb) for p in data.points if p.val_bpb is not None]   # (point, its val_bpb)
    vals = [v for _, v in ok] + data.baseline
    if vals:
        lo, hi = min(vals), max(vals)
        if data.baseline_mean is not None:
            # keep the interesting band readable: wild failures are drawn at the top edge
            hi = min(hi, data.baseline_mean + max(3 * (data.baseline_mean - lo), 10 * data.sigma, 0.02))
        pad = max(0.05 * (hi - lo), 2 * data.sigma, 1e-3)
        ymin, ymax = lo - pad, hi + 2 * pad
    else:
        ymin, ymax = 0.0, 1.0
    ax.set_ylim(ymin, ymax)
    if data.baseline_mean is not None:
        m, s = data.baseline_mean, data.sigma
        ax.axhspan(m - s, m + s, color="#9aa7b8", alpha=0.25, lw=0,
                   label=f"baseline ± σ ({m * data.sign:.4f} ± {s:.4f})")
        ax.scatter([0] * len(data.baseline), data.baseline, s=22, color="#5c6b80", zorder=3)
    disc = [(p, v) for p, v in ok if p.verdict != "keep"]
    inside = [(p, v) for p, v in disc if v <= ymax]
    above = [p for p, v in disc if v > ymax]
    if inside:
        ax.scatter([p.number for p, _ in inside], [v for _, v in inside], s=26, color="#b0b0b0",
                   zorder=2, label="discarded")
    if above:
        ax.scatter([p.number for p in above], [ymax - 0.07 * (ymax - ymin)] * len(above), marker="^", s=30,
                   color="#b0b0b0", zorder=2, label="discarded (off the scale)")
    crashes = data.crashed
    if crashes:
        ax.scatter([p.number for p in crashes], [ymax - (ymax - ymin) * 0.03] * len(crashes), marker="x", s=46,
                   color="#d1495b", zorder=4, label="crashed")
    keeps = [p for p, _, _ in data.kept]
    if keeps:
        ax.scatter([p.number for p in keeps], [_measured(p) for p in keeps], s=52, color="#2e9e44", zorder=5,
                   edgecolor="black", linewidth=0.5, label="kept")
    for p in keeps:
        ax.annotate(p.description[:42].replace("$", r"\$"), (p.number, _measured(p)), xytext=(6, -12), textcoords="offset points",
                    fontsize=8, color="#1f6e2f", rotation=-20)
    if data.baseline_mean is not None:   # running best: a step down at each keep
        xs: list[float] = [0]
        ys: list[float] = [data.baseline_mean]
        for p in keeps:
            xs += [p.number]
            ys += [_measured(p)]
        xs.append(max(data.n, xs[-1]) + 0.5)
        ys.append(ys[-1])
        ax.step(xs, ys, where="post", color="#2e9e44", lw=1.6, alpha=0.8, label="running best")
    ax.set_xlim(-0.8, max(data.n, 1) + 0.8)
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("experiment #")
    metric_axis(ax, data)
    ax.set_title(data.title)
    ax.grid(alpha=0.25)
    if ax.get_legend_handles_labels()[0]:   # none before the first experiment (matplotlib would warn)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)   # never over a point
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return PlotInfo(path, data.title, data.n, len(data.kept), len(data.crashed))


def metric_axis(ax: Any, data: ReportData) -> None:
    """The y axis as the user's metric reads it. Points are drawn on the loop's scale (a maximised metric
    negated, so the code above needs one orientation); for a maximised metric the axis is flipped and its
    ticks negated back, so better is up and the numbers are the metric's own."""
    if data.sign < 0:
        from matplotlib.ticker import FuncFormatter
        ax.invert_yaxis()
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: f"{-y:g}"))
        ax.set_ylabel(f"{data.metric} (higher is better)")
    else:
        ax.set_ylabel(f"{data.metric} (lower is better)")


# ---------------------------------------------------------------------------
# report.md

def _shown(data: "ReportData", v: Optional[float]) -> Optional[float]:
    """A stored score or difference of scores as the user's metric reads it (a maximised one is stored negated)."""
    return None if v is None else v * data.sign


def _f(v: Optional[float], digits: int = 4, sign: bool = False) -> str:
    if v is None:
        return "—"
    return f"{v:+.{digits}f}" if sign else f"{v:.{digits}f}"


def divergence(data: ReportData) -> Optional[dict]:
    """The hidden-test check of the best version against the baseline (same rule as the keep events)."""
    if data.best is None or data.best.test_bpb is None or not data.baseline_test or data.gain is None:
        return None
    test_gain = statistics.fmean(data.baseline_test) - data.best.test_bpb
    flagged = data.gain > 0 and test_gain < 0.5 * data.gain - 2 * data.sigma
    return {"baseline_test": statistics.fmean(data.baseline_test), "best_test": data.best.test_bpb,
            "val_gain": data.gain, "test_gain": test_gain, "flagged": flagged}


def step_outliers(data: ReportData, ratio: float = 1.5) -> list[Point]:
    """Kept runs whose step count is off the baseline's by more than `ratio` either way: with a
    wall-clock budget, machine load changes the step count, and the step count changes val_bpb."""
    if not data.baseline_steps:
        return []
    base = statistics.median(data.baseline_steps)
    return [p for p, _, _ in data.kept if p.num_steps is not None and base > 0
            and max(p.num_steps / base, base / max(p.num_steps, 1)) > ratio]


def render_markdown(data: ReportData, plot_name: str = "progress.png", tsv_name: str = "results.tsv") -> str:
    L: list[str] = [f"# loopwright report — campaign `{data.tag}`", "",
                    f"Generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')}. ![progress]({plot_name})", "",
                    (f"Target: **{data.target}** (its pinned baseline never changes; keeps stay on the campaign's "
                     "branch)." if data.target else
                     f"Benchmark version: **{data.benchmark_version or 'unversioned'}** (its reference baseline "
                     "never changes within a version; keeps stay on the campaign's branch)."), ""]
    n_seeds = len(data.baseline)
    L += ["## Outcome", ""]
    if data.baseline_mean is None:
        L += ["No baseline has been measured yet: run an experiment first.", ""]
    else:
        L.append(f"- {data.title}.")
        L.append(f"- Baseline: **{_f(_shown(data, data.baseline_mean))} ± {_f(data.sigma)}** {data.metric} "
                 f"({n_seeds} seed{'s' if n_seeds != 1 else ''}).")
        if not data.points:   # a verdict about changes never tried would be false
            L.append("- **No experiment ran yet**: only the baseline was measured.")
        elif data.best is None:
            L.append(f"- **No change cleared the noise threshold ({_f(data.threshold)}).** The best version is "
                     "still the baseline; every gain measured was within the noise.")
        else:
            g = data.gain or 0.0
            in_sigma = f" ({g / data.sigma:.1f} σ)" if data.sigma else ""
            L.append(f"- Best: **{_f(_shown(data, data.best_val))}** (experiment #{data.best.id}, commit `{data.best.commit}`, "
                     f"{data.best.samples} run(s)): gain **{_f(g)}** over the baseline{in_sigma}, "
                     f"{len(data.kept)} kept change(s).")
        if data.sigma <= data.sigma_floor and len(data.baseline) > 1:
            L.append(f"- σ is at its floor ({data.sigma_floor}): the baseline seeds agreed almost exactly, so the "
                     "noise may be underestimated (e.g. run-to-run differences from machine load are not in it).")
        near = sorted((p for p in data.points if p.verdict != "keep" and p.val_bpb is not None
                       and data.baseline_mean is not None and p.val_bpb < (data.best_val or 0)),
                      key=_measured)
        if near:
            L.append(f"- {len(near)} discarded experiment(s) measured below the best but not by enough to clear "
                     f"the threshold (closest: #{near[0].id} ({_md(near[0].description)}), {_f(_shown(data, near[0].val_bpb))}).")
        odd = step_outliers(data)
        if odd:
            L.append(f"- **{len(odd)} kept change(s) trained a very different number of steps than the baseline "
                     f"(median {statistics.median(data.baseline_steps):g}): "
                     + ", ".join(f"#{p.id} {p.num_steps} steps" for p in odd)
                     + ". Under a wall-clock budget that can come from a busier or quieter machine rather than "
                       "from the change itself; re-measure them before trusting the gain.**")
        steps = data.baseline_steps + [p.num_steps for p in data.points if p.num_steps is not None]
        if steps:
            med = statistics.median(steps)
            L.append(f"- Training steps per run: median {med:g} (baseline: {', '.join(map(str, data.baseline_steps))})."
                     + (" **So few steps that the runs measure start-up more than learning: give experiments a "
                        "longer time budget (or a less busy machine) before trusting these gains.**"
                        if med < 10 else ""))
        L.append("")
    L += ["## Noise", "",
          f"- Baseline samples: {', '.join(_f(_shown(data, v)) for v in data.baseline) or '—'}",
          f"- σ across seeds (unpaired, floored): {_f(data.sigma, 5)}; σ of a paired difference "
          f"(candidate − reference on the same seed): **{_f(data.sigma_paired, 5)}** ({data.paired_dof} degree(s) of "
          f"freedom from this campaign's pairs, plus the prior{data.prior_note}).",
          f"- Paired verdict: a candidate runs on the reference's {data.n_pairs} seeds; keep iff its mean paired gain "
          f"≥ max(min_delta {data.min_delta}, {data.k_sigma} σ_d / √{data.n_pairs}) = **{_f(data.threshold, 5)}**; near "
          "the bar a confirm pair on a fresh seed decides."
          if data.pairs_rule != "adaptive" else
          f"- Paired verdict (adaptive pairs): after each pair a sequential test keeps, discards or adds a pair "
          f"(the reference's seeds first, then fresh-seed confirm pairs), at most {data.max_pairs} pairs; null "
          "changes are kept at most 5 % of the time.",
          f"- Minimum detectable effect (kept with 80 % probability): **{_f(data.mde, 4)}** {data.unit}: changes expected "
          "to gain less are not worth a run at this budget."
          + (f" The best version was re-measured on fresh seed sets {data.reference_runs} time(s) (reference runs)."
             if data.reference_runs else ""), ""]
    L += ["## Kept changes", ""]
    if data.kept:
        L += [f"| # | experiment | description | {data.metric} | Δ vs previous best | Δ vs baseline | runs | steps | commit | "
              "paired gain (pairs) |", "|---|---|---|---|---|---|---|---|---|---|"]
        for i, (p, dprev, dbase) in enumerate(data.kept, 1):
            L.append(f"| {i} | #{p.id} | {_md(p.description)} | {_f(_shown(data, p.val_bpb))} | "
                     f"{_f(_shown(data, dprev), sign=True)} | {_f(_shown(data, dbase), sign=True)} | {p.samples} | "
                     f"{p.num_steps if p.num_steps is not None else '—'} | "
                     f"`{p.commit}` | {_f(p.paired_gain, sign=True)} ({p.pairs}) |")
    else:
        L.append("None.")
    L.append("")
    if data.replay is not None:
        r = data.replay
        L += [f"## Replay {r.replay}: do the keeps hold on fresh seeds?", "",
              f"Each kept change and its parent re-run on {r.seeds_per_keep} seed(s) no run had used, interleaved "
              f"({r.runs} runs, {r.seconds:.0f} s; not counted in the budget). "
              + ("**Every keep holds.**" if r.all_hold else "**Not every keep holds.**"), "",
              "| experiment | description | paired gain per seed | mean gain | 95 % interval | outcome |",
              "|---|---|---|---|---|---|"]
        for k in r.keeps:
            per = ", ".join("—" if p.d is None else f"{-p.d:+.4f}" for p in k.pairs)
            iv = "—" if k.interval is None else f"[{k.interval[0]:+.4f}, {k.interval[1]:+.4f}]"
            L.append(f"| #{k.experiment_id} | {_md(k.description)} | {per} | {_f(k.gain, sign=True)} | {iv} | "
                     f"{k.outcome} |")
        L.append("")
    L += data.mechanism_lines
    L += data.approval_lines
    L += data.executor_lines
    L += ["## Crashes", ""]
    if data.crashed:
        L += ["| experiment | description | status | reason |", "|---|---|---|---|"]
        for p in data.crashed:
            L.append(f"| #{p.id} | {_md(p.description)} | {p.status} | {_md(p.reason[:160])} |")
    else:
        L.append("None.")
    L.append("")
    b = data.budget
    if b:
        L += ["## Budget used", "",
              f"- Experiments (all runs, baselines and confirms included): {b.get('experiments_used')}"
              + (f" of {b['experiments_used'] + b['experiments_left']}" if b.get("experiments_left") is not None
                 else ""),
              f"- Compute: {b.get('hours_used', 0) * 60:.1f} min of experiments"
              + (f" (of {(b['hours_used'] + b['hours_left']) * 60:.0f} min)" if b.get("hours_left") is not None else ""),
              f"- Agent cost: ${b.get('cost_used_usd', 0):.2f}",
              f"- Should stop: {b.get('should_stop')} "
              f"{('(' + '; '.join(b.get('reasons') or []) + ')') if b.get('reasons') else ''}",
              ""]
    d = divergence(data)
    if data.target:      # a target's hidden files are its evaluator's; there is no second split to compare
        pass
    elif d is None:
        L += ["## Hidden test split (for people only; never shown to the agent)", ""]
        L.append("Not available: no kept change with a test score, or no baseline test scores." if data.best is None
                 or not data.baseline_test else "Not available.")
    else:
        L += ["## Hidden test split (for people only; never shown to the agent)", ""]
        L += [f"- test_bpb: baseline {_f(d['baseline_test'])} → best {_f(d['best_test'])} "
              f"(test gain {_f(d['test_gain'], sign=True)} vs validation gain {_f(d['val_gain'], sign=True)})",
              "- **Divergence flag: the validation gain did not carry over to the test split (possible overfitting "
              "to val or leakage).**" if d["flagged"] else "- No val/test divergence: the gain carries over."]
    L += ["", f"All experiments: [{tsv_name}]({tsv_name}) (autoresearch's columns first).", ""]
    return "\n".join(L)


def executor_section(view: dict) -> list[str]:
    """## Executor and workers (loop/status.executor_view): only once runs went through an executor."""
    cfg = view["executor"]
    if cfg["kind"] == "local" and cfg["parallel"] == 1 and not (view["in_flight"] or view["open"] or view["workers"]):
        return []
    where = f"Ray at `{cfg['address']}`" if cfg["kind"] == "ray" else "this machine"
    L = ["## Executor and workers", "",
         f"- Executor: {cfg['kind']} on {where}, {cfg['parallel']} run(s) at once"
         + (f", {cfg['num_gpus']:g} GPU(s) per run" if cfg["num_gpus"] else "") + ".",
         f"- In flight when this report was written: {len(view['in_flight'])} run(s); "
         f"{len(view['open'])} submitted experiment(s) without a verdict"
         + (f" ({', '.join(f'#{i}' for i in view['open'][:20])})" if view["open"] else "") + "."]
    lost = sum(w["lost"] for w in view["workers"])
    requeued = sum("re-queued as" in (r["reason"] or "") for r in view["lost"])
    if view["lost"] or lost:
        L.append(f"- Lost runs (a worker or node died): {max(lost, len(view['lost']))}; re-queued once: {requeued}. "
                 "A run lost twice discards its experiment.")
    if view["workers"]:
        L += ["", "| worker | runs | ok | failed | lost |", "|---|---|---|---|---|"]
        for w in view["workers"]:
            L.append(f"| `{_md(w['worker'])}` | {w['runs']} | {w['ok']} | {w['failed']} | {w['lost']} |")
    L.append("")
    return L


def _md(text: str) -> str:
    """Agent-written text as inert markdown: no raw HTML, link or image (emphasis may stay)."""
    t = (text or "").replace("\r", " ").replace("\n", " ").replace("<", "&lt;")   # no HTML tag can open
    return re.sub(r"([\\`\[\]|])", r"\\\1", t)   # no link, image or code span; one table cell


# ---------------------------------------------------------------------------

@dataclass
class ReportFiles:
    directory: Path
    plot: PlotInfo
    markdown: Path
    tsv: Path
    data: ReportData


def write_report(workspace: Path | str | None = None) -> ReportFiles:
    from mcp_server.loop import budget as budgetmod
    from mcp_server.loop.engine import Engine
    from mcp_server.report.tsv import export_tsv

    eng = Engine(workspace)
    try:
        c = eng.campaign
        # read before the rows: every event up to here (a keep) is in the plot drawn from them
        through = eng.ledger.last_event_id()
        rows = eng.ledger.experiments(c["id"])
        # budget.check, not Engine.budget: a report must not record events (budget_spent) as a side effect
        status = budgetmod.check(eng.ledger, c["id"], eng.ws.cfg.budget, eng.best(c)[0])
        data = collect(rows, eng.ws.cfg, c["tag"], status.model_dump())
        data.benchmark_version = eng.ws.benchmark_version
        declared, nz = lock_noise_prior(eng.ws.root), eng.ws.cfg.noise
        data.prior_note = (f" {nz.sigma_prior:g} worth {nz.prior_pairs:g} pairs, the benchmark's measured noise on the "
                           f"{declared.get('clock')} clock (its noise.toml); the MDE below is set by it until this "
                           "campaign's pairs outweigh it" if declared else f" {nz.sigma_prior:g} worth {nz.prior_pairs:g} pairs")
        from mcp_server.loop.replay import latest
        data.replay = latest(eng.ledger, c["id"])
        from mcp_server.mechanisms.report import section as mechanism_section
        data.mechanism_lines = mechanism_section(eng.ledger, c["id"], rows)
        from mcp_server.loop.approvals import Approvals
        data.approval_lines = Approvals(eng).report_section(c["id"])
        from mcp_server.loop.status import executor_view
        data.executor_lines = executor_section(executor_view(eng))
        out = eng.ws.reports_dir
        out.mkdir(parents=True, exist_ok=True)
        plot = plot_progress(data, out / "progress.png")
        eng.ledger.kv_set(plot_marker_key(out / "progress.png"), str(through))   # a keep's Slack upload waits on it
        md = out / "report.md"
        md.write_text(render_markdown(data), encoding="utf-8")
        tsv = out / "results.tsv"
        tsv.write_text(export_tsv(eng.ledger, c["id"]), encoding="utf-8")
        return ReportFiles(out, plot, md, tsv, data)
    finally:
        eng.close()
