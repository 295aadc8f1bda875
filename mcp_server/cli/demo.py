"""`loopwright demo` and the progress display of `loopwright run`.

The demo is the main job with nothing else installed: it creates a workspace
(a temporary directory unless one is given), lets the built-in agent run a
short campaign against the MCP server over stdio, shows it live, and writes the
report. Its defaults are sized to finish within six minutes on a quiet 2-core
CPU: each run trains 160 steps of the v2 baseline on the steps clock (a fixed
number of tokens, so other jobs slow a run down but do not change what it
trains or scores), a small evaluation (8192 tokens), a seed set of two seeds
(`--seed S` picks them: 1001 + 1000·S on, so demos with different seeds are
independent), and four experiments. It is capped by that work, not by wall
time: on a busy machine it takes longer but shows the same four experiments; it
announces the runs and the minutes it expects before it starts. `--minutes`
only stops further experiments after those four. Power comes from paired
verdicts: each candidate runs on the same two seeds as the best version (one
run when its first pair is clearly worse), and the built-in agent tries
expert-first changes before its hill climb. Check the keeps afterwards with
`loopwright replay --workspace DIR --seeds 3`.
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

DEMO_TIME_BUDGET = 30.0    # what a run is expected to take (its hard limit derives from it)
# The demo trains a fixed number of tokens per run (the steps clock): ~30 CPU-seconds of v2's baseline. On the CPU
# clock a shared machine changes a run's step count by 10-15 %, which at v2's under-trained baseline moved val_bpb
# by 0.1-0.2 and was the largest part of a pair's noise (BENCHMARKS.md "Benchmark v2"); counted in tokens, a
# seed trains the same steps however busy the machine is.
DEMO_CLOCK = "steps"
DEMO_BUDGET_TOKENS = 160 * 12 * 256   # 160 steps of the v2 baseline's 12 x 256 tokens
DEMO_EVAL_TOKENS = 8192
DEMO_BASELINE_SEEDS = 2
DEMO_EXPERIMENTS = 4
DEMO_MIN_EXPERIMENTS = 4   # run whatever the load: a wall-clock cap (--minutes) stops only later ones
RUN_OVERHEAD_S = 4.0       # start-up, export, evaluation (the warm evaluator) and the agent's step per run, quiet 2-core CPU
STEPS_TOKENS_PER_S = 48_000   # v2's baseline on the steps clock, quiet 2-core CPU (491,520 tokens in ~10.2 s)
REPORT_RESERVE_S = 10.0    # the report and shutdown, kept out of the experiments' time

_VERDICT_STYLE = {"keep": "bold green", "discard": "grey58", "retest": "yellow", "crash": "bold red",
                  "timeout": "bold red", "rejected": "bold red"}


@dataclass
class _Row:
    number: Any
    description: str
    val_bpb: Optional[float] = None
    delta: Optional[float] = None
    verdict: str = "running"
    seconds: Optional[float] = None


@dataclass
class ProgressState:
    """What the display shows, updated from the agent's events."""
    title: str
    started: float = field(default_factory=time.monotonic)
    deadline: Optional[float] = None
    n: Optional[int] = None
    phase: str = "starting"
    current: str = ""
    step: Optional[int] = None
    loss: Optional[float] = None
    remaining: Optional[float] = None
    baseline: Optional[float] = None
    sigma: Optional[float] = None
    threshold: Optional[float] = None
    best: Optional[float] = None
    kept: int = 0
    rows: list[_Row] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    stopped: Optional[str] = None
    metric: str = "val_bpb"      # what the score is called (a target's own metric)
    sign: float = 1.0            # -1: a maximised metric, stored negated, shown as the user reads it
    flying: dict = field(default_factory=dict)   # parallel: experiment number -> description, in flight

    def on_event(self, kind: str, d: dict) -> Optional[str]:
        """Update from one agent event; returns a one-line log message for plain output."""
        if kind == "start":
            s = d["summary"]
            self.baseline, self.best, self.kept = s["baseline_val_bpb"], s["best_val_bpb"], s["kept"]
            return (f"campaign {s['tag']}: {s['experiments']} experiments so far, best "
                    f"{_num(s['best_val_bpb'])}; mechanisms {'on' if d['mechanisms'] else 'off'}"
                    + (f"; up to {d['parallel']} candidate(s) in flight" if d.get("parallel") else ""))
        if kind == "experiment_start" and "in_flight" in d:   # parallel: one of several in flight
            self.flying[d["number"]] = d["description"]
            self.rows.append(_Row(d["number"], d["description"]))
            self._show_flying()
            return f"submitted experiment {d['number']}: {d['description']} ({d['in_flight']} in flight)"
        if kind == "experiment_start":
            self.phase = ("baseline" if d["category"] == "baseline" else "confirm run" if d["number"] is None
                          else f"experiment {d['number']}" + (f"/{self.n}" if self.n else ""))
            self.current, self.step, self.loss, self.remaining = d["description"], None, None, None
            if d["number"]:
                self.rows.append(_Row(d["number"], d["description"]))
            return f"{self.phase}: {d['description']}"
        if kind == "progress":
            self.step, self.loss, self.remaining = d["step"], d["loss"], d["remaining"]
            return None
        if kind == "baseline":
            b = d["result"].get("baseline") or {}
            self.baseline, self.best = b.get("mean", d["result"].get("val_bpb")), b.get("mean")
            self.sigma, self.threshold = b.get("sigma"), b.get("keep_threshold")
            shown = None if self.baseline is None else self.baseline * self.sign
            return (f"baseline {_num(shown)} ± {_num(self.sigma)} on {len(b.get('samples') or [])} seeds; "
                    f"a keep needs a gain of {_num(self.threshold)} ({d['seconds']:.0f} s)")
        if kind == "verdict":
            sc = d["score"]
            if sc["verdict"] == "keep":
                self.kept += 1
            if sc.get("best_val_bpb") is not None:
                self.best = sc["best_val_bpb"]
            bar = "" if sc.get("threshold") is None else f", threshold {sc['threshold']:.4f}"
            return f"  score: {sc['verdict']} (gain {sc['gain']:+.4f}{bar})"
        if kind == "experiment_end":
            a, res = d["attempt"], d["result"]
            if "in_flight" in res:   # parallel
                self.flying.pop(a.number, None)
                self._show_flying()
            else:
                self.phase, self.current = "thinking", "choosing the next change"
            self.step = self.loss = self.remaining = None
            row = next((r for r in reversed(self.rows) if r.number == a.number), None)
            if row is not None:
                row.val_bpb, row.seconds = a.val_bpb, a.seconds
                row.verdict = a.verdict if a.status == "ok" else a.status
                row.delta = res.get("delta_vs_best")
            warn = f" [{a.warnings[0][:80]}]" if a.warnings else ""
            value = None if a.val_bpb is None else a.val_bpb * self.sign
            return (f"  {a.description}: {a.status}, {self.metric} {_num(value)}, {row.verdict if row else a.verdict} "
                    f"in {a.seconds:.0f} s{warn}")
        if kind == "deferred":
            self.messages.append(f"#{d['experiment_id']} needs confirm runs: left for the next session")
            return f"  #{d['experiment_id']}: {d['reason']}; left as a retest for the next session"
        if kind == "skip":
            self.messages.append(f"skipped {d['description']}: {d['reason'][:90]}")
            return f"  skipped {d['description']}: {d['reason'][:120]}"
        if kind == "error":
            self.messages.append(d["message"][:120])
            return f"  error: {d['message'][:300]}"
        if kind == "stop":
            self.stopped, self.phase, self.current = d["reason"], "stopped", d["reason"]
            self.step = self.loss = self.remaining = None
            return f"stopped: {d['reason']}"
        return None

    def _show_flying(self) -> None:
        self.phase = f"{len(self.flying)} in flight"
        self.current = "; ".join(f"#{k} {v}" for k, v in sorted(self.flying.items()))[:200]

    # -- rendering --------------------------------------------------------------
    def render(self) -> Group:
        now = time.monotonic()
        elapsed = now - self.started
        left = "" if self.deadline is None else f"   time left {max(0.0, self.deadline - now):4.0f} s"
        head = Text.assemble((self.title, "bold"), f"   elapsed {elapsed:4.0f} s{left}")
        cur = Text.assemble((f"{self.phase}", "cyan"), f"  {self.current}")
        if self.step is not None:
            cur.append(f"   step {self.step}  loss {self.loss:.4f}  {self.remaining or 0:.0f} s of training left")
        best = Text("best so far: ")
        if self.baseline is None:
            best.append("measuring the baseline…", "italic")
        else:
            gain = (self.baseline - self.best) if self.best is not None else 0.0
            best.append(f"{_num(self.best)}", "bold green")
            best.append(f"   baseline {_num(self.baseline)}" + (f" ± {self.sigma:.4f}" if self.sigma else "")
                        + f"   gain {gain:+.4f}   kept {self.kept}")
        table = Table(expand=True, show_edge=False, pad_edge=False)
        for col, kw in (("#", {"justify": "right", "width": 3}), ("experiment", {"ratio": 1}),
                        ("val_bpb", {"justify": "right"}), ("Δ vs best", {"justify": "right"}),
                        ("verdict", {}), ("s", {"justify": "right"})):
            table.add_column(col, **kw)
        for r in self.rows[-14:]:
            table.add_row(str(r.number), r.description, _num(r.val_bpb),
                          "" if r.delta is None else f"{r.delta:+.4f}",
                          Text(r.verdict, _VERDICT_STYLE.get(r.verdict, "cyan")),
                          "" if r.seconds is None else f"{r.seconds:.0f}")
        parts: list[Any] = [head, cur, best, table]
        if self.messages:
            parts.append(Text(self.messages[-1], "grey50"))
        return Group(Panel(Group(*parts), title="loopwright", border_style="green"))


def _num(v: Optional[float]) -> str:
    return "—" if v is None else f"{v:.4f}"


class Display:
    """rich Live on a terminal; one plain line per event elsewhere (logs, CI, pipes)."""

    def __init__(self, state: ProgressState, console: Optional[Console] = None, live: Optional[bool] = None):
        self.state = state
        self.console = console or Console()
        self.live_enabled = self.console.is_terminal if live is None else live
        self._live: Optional[Live] = None

    def __enter__(self) -> "Display":
        if self.live_enabled:
            self._live = Live(get_renderable=self.state.render, console=self.console, refresh_per_second=4)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)

    def __call__(self, kind: str, data: dict) -> None:
        line = self.state.on_event(kind, data)
        if self._live is None and line:
            self.console.print(line, highlight=False, markup=False)


@dataclass
class DemoResult:
    workspace: Path
    seconds: float
    report_dir: Path
    session: Any


def demo_overrides(n: int, parallel: int = 1, seed: int = 0) -> dict:
    # grace: on the steps clock a run on a busy shared machine takes longer in wall time but trains the same
    # tokens; the hard limit (4 budgets + grace) must not turn that into a false timeout
    return {"benchmark": {"eval_tokens": DEMO_EVAL_TOKENS, "grace_seconds": 300.0, "clock": DEMO_CLOCK,
                          "budget_tokens": DEMO_BUDGET_TOKENS},
            # --seed picks the campaign's training seeds too, so demos with different seeds are independent
            # draws of the noise, not replicates of one (a campaign uses far fewer than 1000 seeds)
            "noise": {"baseline_seeds": DEMO_BASELINE_SEEDS, "first_seed": 1001 + 1000 * (seed % 1000)},
            # runs, not experiments: the baseline seeds, each candidate on the seed set, a confirm pair
            # (candidate + reference) per experiment, and a re-measure of the best per seed set
            "budget": {"max_experiments": 3 * DEMO_BASELINE_SEEDS + (DEMO_BASELINE_SEEDS + 2) * n,
                       "max_hours": 1.0},
            # runs at once on this machine's executor: one per candidate the agent keeps in flight
            **({"executor": {"parallel": parallel}} if parallel > 1 else {})}


def plan_line(cfg: Any, n: Optional[int], baseline: bool) -> str:
    """What a session will cost, in the units the budget counts (training runs), before it starts.
    An experiment is one run per seed of the seed set, paired with the best version on the same seeds;
    a retest adds confirm runs (the candidate and the best on a fresh seed), a fresh seed set a
    re-measure of the best."""
    k, budget_s = cfg.noise.baseline_seeds, cfg.benchmark.time_budget
    if cfg.target is not None:   # a target's run has no training budget to fill: its time_budget is a cap
        return (f"plan: {'the baseline on ' + str(k) + ' seed(s), then ' if baseline else ''}"
                f"{'experiments until the budget says stop' if n is None else str(n) + ' experiment(s)'}, each "
                f"{k} paired run(s) of `{cfg.target.run}` (at most {cfg.target.time_budget:g} s each), scored by "
                f"`{cfg.target.evaluate}`: {cfg.target.direction} {cfg.target.metric}")
    if cfg.benchmark.clock == "steps":   # a fixed number of tokens: the time is an estimate for a quiet CPU
        train_s = cfg.benchmark.budget_tokens / STEPS_TOKENS_PER_S
        training = f"~{train_s:.0f} s to train {cfg.benchmark.budget_tokens:,} tokens"
    else:
        train_s = budget_s
        training = f"{budget_s:.0f} s of training"
    per_run = train_s + RUN_OVERHEAD_S
    if n is None:
        cap = cfg.budget.max_experiments
        return (f"each experiment is {k} training run(s) of ~{per_run:.0f} s (one per seed); the budget allows "
                f"{cap} runs in all (budget.max_experiments counts runs)" if cap else
                f"each experiment is {k} training run(s) of ~{per_run:.0f} s (one per seed)")
    runs = (k if baseline else 0) + k * n
    # each retest is a pair on a fresh seed (the candidate and the best); the own-spread test allows one more
    confirms = cfg.noise.max_confirms + (1 if cfg.noise.spread_alpha > 0 else 0)
    most = (k if baseline else 0) + (k + 2 * confirms) * n + k
    return (f"plan: {'the baseline on ' + str(k) + ' seed(s), then ' if baseline else ''}{n} experiment(s) of {k} "
            f"training run(s) each: ~{runs} runs, ~{runs * per_run / 60:.0f} min (up to {most} runs, "
            f"~{most * per_run / 60:.0f} min, with confirm runs) on a quiet 2-core CPU ({training} + "
            f"~{RUN_OVERHEAD_S:.0f} s per run); a busy machine "
            "takes longer in wall time and runs the same work")


def run_demo(directory: Optional[Path | str] = None, time_budget: float = DEMO_TIME_BUDGET,
             n: int = DEMO_EXPERIMENTS, seed: int = 0, minutes: Optional[float] = None, mechanisms: bool = True,
             console: Optional[Console] = None, live: Optional[bool] = None, parallel: int = 1) -> DemoResult:
    from mcp_server.agents.builtin import run_builtin
    from mcp_server.loop.config import CONFIG_NAME, DEFAULT_CORPUS
    from mcp_server.loop.setup import init_workspace
    from mcp_server.loop.workspace import Workspace
    from mcp_server.report.writer import write_report

    if n < 1:
        raise ValueError("-n must be at least 1")
    if minutes is not None and minutes <= 0:
        raise ValueError("--minutes must be positive")
    if parallel < 1:
        raise ValueError("--parallel must be at least 1")
    console = console or Console()
    _sandbox_or_notice(console)
    t0 = time.monotonic()
    deadline = None if minutes is None else t0 + minutes * 60 - REPORT_RESERVE_S
    root = Path(directory).expanduser().resolve() if directory else Path(tempfile.mkdtemp(prefix="loopwright-demo-"))
    if (root / CONFIG_NAME).is_file():
        console.print(f"resuming the campaign in {root}")
    else:
        console.print(f"creating a workspace in {root} (preparing the data takes a few seconds)…")
        init_workspace(root, tag="demo", corpus=DEFAULT_CORPUS, time_budget=time_budget,
                       overrides=demo_overrides(n, parallel, seed))
    ws = Workspace.find(root)
    with ws.ledger() as ledger:
        c = ledger.campaign()
        measured = bool(c and ledger.baseline_samples(c["id"]))
    console.print(plan_line(ws.cfg, n, baseline=not measured)
                  + ("" if minutes is None else f"; after {min(n, DEMO_MIN_EXPERIMENTS)} experiment(s), none starts "
                     f"that would end after {minutes:g} min"))
    title = f"loopwright demo · {root.name} · built-in agent, seed {seed}" + (f", {parallel} in parallel"
                                                                              if parallel > 1 else "")
    state = ProgressState(title, started=t0, deadline=None if deadline is None else deadline + REPORT_RESERVE_S,
                          n=n)
    with Display(state, console, live) as display:
        session = run_builtin(root, n=n, mechanisms=mechanisms, seed=seed, observer=display, deadline=deadline,
                              parallel=parallel, min_experiments=DEMO_MIN_EXPERIMENTS)
    files = write_report(root)
    seconds = time.monotonic() - t0
    d = files.data
    verdict = (f"best {_num(d.best_val)} (gain {d.gain:+.4f})." if d.best else
               f"no change cleared the noise threshold ({d.threshold:.4f})." if d.points else
               f"no experiment ran (stopped: {session.stopped_because}).")   # never a verdict on untried changes
    console.print(f"\n[bold]{d.title}[/] in {seconds:.0f} s. Baseline {_num(d.baseline_mean)} ± {d.sigma:.4f}; "
                  + verdict)
    console.print(f"report: {files.markdown}\nchart:  {files.plot.path}\ntsv:    {files.tsv}")
    console.print(f"workspace: {root}  (continue with `loopwright run --agent builtin --workspace {root}`)")
    return DemoResult(root, seconds, files.directory, session)


def _sandbox_or_notice(console: Console) -> None:
    """The demo must run on a fresh machine. Its only agent is the built-in one, which changes constants of
    the bundled train.py and writes no code, so where no OS sandbox can be made (bubblewrap missing) the
    demo runs without one and says so; the runs are recorded as unsandboxed. Agents' code still never runs
    unsandboxed without the human's --unsafe-no-sandbox."""
    from mcp_server.loop import sandbox

    info = sandbox.detect()
    if info.available or sandbox.unsafe_requested():
        return
    console.print(f"[yellow]note:[/] no OS sandbox here ({info.detail}). The demo's built-in agent only edits "
                  "constants of the bundled train.py, so the demo runs without one; for campaigns driven by "
                  f"Claude Code or Codex: {sandbox.INSTALL_HINT}")
    os.environ[sandbox.UNSAFE_ENV] = "1"   # inherited by the built-in agent's MCP server
