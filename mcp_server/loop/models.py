"""Pydantic models of what the loop returns (the MCP tools' output schemas)."""
from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mcp_server.loop.budget import BudgetStatus

Scalar = Union[bool, int, float, str]


class Change(BaseModel):
    """What an experiment changed, as data: one named constant of train.py from one value to another
    (e.g. {"name": "LR", "old": 0.004, "new": 0.008}). Optional; recorded with the experiment."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(description="the constant's name in train.py, e.g. LR", min_length=1, max_length=64,
                      pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    old: Scalar = Field(description="its value at the best version, e.g. 0.004")
    new: Scalar = Field(description="its value in this experiment, e.g. 0.008")

    @model_validator(mode="after")
    def _a_real_change(self) -> "Change":
        for side in (self.old, self.new):
            if isinstance(side, str) and not 0 < len(side) <= 200:
                raise ValueError("a value given as text must be 1 to 200 characters")
        if type(self.old) is type(self.new) and self.old == self.new:
            raise ValueError(f"old and new are the same ({self.old!r}): that is not a change")
        return self


class ExperimentRow(BaseModel):
    id: int
    description: str
    hypothesis: Optional[str] = None
    status: str
    verdict: Optional[str] = None
    val_bpb: Optional[float] = None
    commit: Optional[str] = None
    seed: Optional[int] = None
    confirm_of: Optional[int] = None
    is_baseline: bool = False
    reason: Optional[str] = None
    lines_added: Optional[int] = None
    lines_removed: Optional[int] = None
    role: Optional[str] = Field(None, description="baseline | candidate | pair | confirm | reference")
    paired_with: Optional[int] = Field(None, description="the reference run on the same seed")
    change: Optional[Change] = Field(None, description="the structured change run_experiment was given, if any")

    @classmethod
    def from_row(cls, r: dict) -> "ExperimentRow":
        return cls(id=r["id"], description=r["description"], hypothesis=r["hypothesis"], status=r["status"],
                   verdict=r["verdict"], val_bpb=r["val_bpb"], commit=(r["commit_sha"] or "")[:10] or None,
                   seed=r["seed"], confirm_of=r["confirm_of"], is_baseline=bool(r["is_baseline"]),
                   reason=r["reason"] or r["verdict_reason"], lines_added=r["lines_added"],
                   lines_removed=r["lines_removed"], role=r.get("role"), paired_with=r.get("paired_with"),
                   change=Change.model_construct(**r["change"]) if r.get("change") else None)


class BaselineInfo(BaseModel):
    samples: list[float]
    mean: float
    sigma: float = Field(description="SD of the baseline across seeds (unpaired; pairing removes most of it)")
    keep_threshold: float = Field(description="mean paired gain a candidate needs on the seed set to be kept")
    sigma_paired: Optional[float] = Field(None, description="SD of a paired difference (candidate - reference)")
    mde: Optional[float] = Field(None, description="true gain kept with 80 % probability on the seed set")
    seeds: list[int] = Field(default_factory=list, description="the current seed set")


class PairInfo(BaseModel):
    seed: int
    candidate: float
    reference: float
    d: float = Field(description="candidate - reference on the same seed (negative = better)")
    reference_run: int


class ExperimentResult(BaseModel):
    experiment_id: Optional[int] = Field(description="None when nothing ran (held for approval)")
    status: Literal["ok", "crash", "timeout", "rejected", "interrupted", "pending_approval"]
    approval_id: Optional[int] = Field(None, description="autonomy approve-runs: the approval this run waits for")
    val_bpb: Optional[float] = None
    best_val_bpb: Optional[float] = None
    delta_vs_best: Optional[float] = Field(None, description="val_bpb - best (negative = better)")
    metric: Optional[str] = Field(None, description="a target workspace: its metric's name")
    metric_value: Optional[float] = Field(None, description=(
        "a target workspace: this run's score in its own metric and sign (val_bpb is the loop's scale, where lower "
        "is better: a maximised metric is stored negated)"))
    commit: Optional[str] = None
    seed: Optional[int] = None
    confirm_of: Optional[int] = None
    training_seconds: Optional[float] = None
    total_seconds: Optional[float] = None
    eval_seconds: Optional[float] = None
    memory_gb: Optional[float] = None
    num_steps: Optional[int] = None
    reason: Optional[str] = None
    log_tail: Optional[str] = None
    baseline: Optional[BaselineInfo] = None
    pairs: list[PairInfo] = Field(default_factory=list, description="seed-matched (candidate, reference) runs")
    reference_runs: int = Field(0, description="runs of the best version made by this call (new seeds)")
    early_stopped: bool = Field(False, description=(
        "the verdict was clear before the seed set ended (clearly worse on the first pair; adaptive pairs: "
        "either way): the rest was not run"))
    warnings: list[str] = Field(default_factory=list)
    next_step: str


class ScoreResult(BaseModel):
    experiment_id: int
    verdict: Literal["keep", "discard", "retest", "pending_approval"]
    gain: float
    threshold: float
    sigma: float = Field(description="SD of a paired difference used for this verdict")
    samples: list[float]
    best_val_bpb: float
    best_commit: str
    reason: str
    pairs: list[PairInfo] = Field(default_factory=list)
    interval: Optional[tuple[float, float]] = Field(None, description="95 % interval of the paired gain")
    early_stop: bool = False
    mde: Optional[float] = None
    next_step: str


class RevertResult(BaseModel):
    commit: str
    experiment_id: Optional[int]
    files: list[str]
    message: str
    backup: Optional[str] = None   # where an uncommitted edit the revert overwrote was saved


class BudgetResult(BudgetStatus):
    stop_requested: Optional[str] = None
    benchmark_version: Optional[str] = Field(None, description="the benchmark's version in loopwright.lock (v1...): "
                                             "its reference baseline never changes within a version")
    sigma_paired: Optional[float] = Field(None, description="SD of a paired difference, from this campaign")
    keep_threshold: Optional[float] = Field(None, description="mean paired gain needed for a keep")
    mde: Optional[float] = Field(None, description="smallest true gain kept with 80 % probability: changes "
                                                   "expected to gain less are not worth a run")
    runs_per_experiment: Optional[int] = None
    next_experiment_runs: Optional[int] = Field(
        None, description="runs the next run_experiment takes at most: the candidate on every seed of the seed "
        "set, plus the best version on the seeds it has no run on yet (when a fresh seed set starts)")
    next_step: str


class NoiseInfo(BaseModel):
    baseline_samples: list[float]
    baseline_mean: Optional[float]
    sigma: float
    min_delta: float
    k_sigma: float
    single_run_threshold: float
    sigma_paired: float = Field(description="SD of a paired difference: pooled campaign pairs + prior")
    paired_dof: int = Field(description="degrees of freedom behind sigma_paired from this campaign's pairs")
    seeds: list[int] = Field(default_factory=list, description="the current seed set")
    seed_set: int = 0
    keep_threshold: float = Field(description="mean paired gain needed for a keep on the seed set")
    mde: float = Field(description="true gain kept with 80 % probability on the seed set")
    rule: str = ""


class Summary(BaseModel):
    tag: str
    branch: str
    pinned_commit: str
    best_commit: str
    best_experiment_id: Optional[int]
    best_val_bpb: Optional[float]
    baseline_val_bpb: Optional[float]
    experiments: int
    kept: int
    discarded: int
    crashed: int
    pending_score: list[int]
    pending_retest: list[int]
    time_budget_s: float


class NoteRow(BaseModel):
    id: int
    kind: str
    text: str
    experiment_id: Optional[int] = None


class StateView(BaseModel):
    view: str
    summary: Optional[Summary] = None
    experiments: list[ExperimentRow] = Field(default_factory=list)
    best: Optional[ExperimentRow] = None
    notes: list[NoteRow] = Field(default_factory=list)
    noise: Optional[NoiseInfo] = None
    tried: list[str] = Field(default_factory=list, description="descriptions of every experiment so far")
    in_flight: list[ExperimentRow] = Field(default_factory=list, description="runs queued or running now")
    pending: list[int] = Field(default_factory=list, description="submitted experiments without a verdict yet")


class NoteResult(BaseModel):
    note_id: int
    kind: str


class SubmitResult(BaseModel):
    """submit_experiment: the experiment is queued; train.py is free for the next edit."""
    experiment_id: int = Field(description="the id to wait() for")
    kind: Literal["candidate", "baseline"]
    commit: str = Field(description="the snapshot of train.py that runs (the branch does not move)")
    seeds: list[int] = Field(default_factory=list)
    runs: list[int] = Field(default_factory=list, description="the run rows queued for this experiment")
    reference_runs: list[int] = Field(default_factory=list, description="runs of the best version it needs first")
    in_flight: int = Field(0, description="runs queued or running on the executor, all experiments")
    executor: str = ""
    next_step: str = ""


class AsyncResult(BaseModel):
    """Where a submitted experiment stands."""
    experiment_id: int = Field(description="the id submit_experiment returned")
    current_id: int = Field(description="the candidate row that stands for it now (a rebase re-measures it as a new row)")
    state: Literal["running", "decided"]
    status: str = Field(description="the candidate row's status (running, ok, crash, timeout, rejected, lost, ...)")
    verdict: Optional[str] = None
    reason: Optional[str] = None
    val_bpb: Optional[float] = None
    delta_vs_best: Optional[float] = Field(None, description="mean paired difference (negative = better)")
    pairs: list[PairInfo] = Field(default_factory=list)
    commit: Optional[str] = None
    lost_runs: list[int] = Field(default_factory=list, description="runs whose worker died (each re-queued once)")
    rebased_from: list[int] = Field(default_factory=list, description="earlier candidate rows, measured against a "
                                    "best that moved on")


class WaitResult(BaseModel):
    results: list[AsyncResult] = Field(default_factory=list)
    in_flight: list[int] = Field(default_factory=list, description="submitted experiments not decided yet")
    timed_out: bool = False
    next_step: str = ""
