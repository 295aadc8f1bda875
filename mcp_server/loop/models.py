"""Pydantic models of what the loop returns (the MCP tools' output schemas)."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, Field

from mcp_server.loop.budget import BudgetStatus


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

    @classmethod
    def from_row(cls, r: dict) -> "ExperimentRow":
        return cls(id=r["id"], description=r["description"], hypothesis=r["hypothesis"], status=r["status"],
                   verdict=r["verdict"], val_bpb=r["val_bpb"], commit=(r["commit_sha"] or "")[:10] or None,
                   seed=r["seed"], confirm_of=r["confirm_of"], is_baseline=bool(r["is_baseline"]),
                   reason=r["reason"] or r["verdict_reason"], lines_added=r["lines_added"],
                   lines_removed=r["lines_removed"])


class BaselineInfo(BaseModel):
    samples: list[float]
    mean: float
    sigma: float
    keep_threshold: float = Field(description="gain needed for a single-run keep")


class ExperimentResult(BaseModel):
    experiment_id: int
    status: Literal["ok", "crash", "timeout", "rejected", "interrupted"]
    val_bpb: Optional[float] = None
    best_val_bpb: Optional[float] = None
    delta_vs_best: Optional[float] = Field(None, description="val_bpb - best (negative = better)")
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
    warnings: list[str] = Field(default_factory=list)
    next_step: str


class ScoreResult(BaseModel):
    experiment_id: int
    verdict: Literal["keep", "discard", "retest"]
    gain: float
    threshold: float
    sigma: float
    samples: list[float]
    best_val_bpb: float
    best_commit: str
    reason: str
    next_step: str


class RevertResult(BaseModel):
    commit: str
    experiment_id: Optional[int]
    files: list[str]
    message: str


class BudgetResult(BudgetStatus):
    stop_requested: Optional[str] = None
    next_step: str


class NoiseInfo(BaseModel):
    baseline_samples: list[float]
    baseline_mean: Optional[float]
    sigma: float
    min_delta: float
    k_sigma: float
    single_run_threshold: float


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


class NoteResult(BaseModel):
    note_id: int
    kind: str
