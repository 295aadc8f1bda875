"""Campaign budgets: experiments, compute hours, agent cost, optional target."""
from __future__ import annotations

from typing import Optional

from pydantic import BaseModel

from mcp_server.ledger.store import Ledger
from mcp_server.loop.config import BudgetConfig

# A run's time budget is wall-clock for the whole train.py process: start-up (imports, data loading,
# compilation: 5-20 s on a small CPU) counts. Below this a run gets a handful of steps and its score
# (~8 bits/byte at 10 s) says nothing about the change it was meant to test.
MIN_TIME_BUDGET_S = 30.0


def check_time_budget(seconds: Optional[float]) -> None:
    """Raise ValueError, with the minimum, for a per-experiment time budget too small to learn anything."""
    if seconds is not None and not seconds >= MIN_TIME_BUDGET_S:
        raise ValueError(f"--time-budget {seconds:g} s is too small to learn anything: it is wall-clock for the "
                         f"whole run, start-up included; use at least {MIN_TIME_BUDGET_S:g} s")


class BudgetStatus(BaseModel):
    # budget.max_experiments counts training runs (the key keeps its name): an experiment is one run per
    # seed of the seed set, and a retest adds confirm runs. runs_* say the same in the unit they count.
    experiments_used: int
    experiments_left: Optional[int]
    runs_used: int = 0
    runs_left: Optional[int] = None
    hours_used: float
    hours_left: Optional[float]
    cost_used_usd: float
    cost_left_usd: Optional[float]
    best_metric: Optional[float]
    target_metric: Optional[float]
    should_stop: bool
    reasons: list[str]


def check(ledger: Ledger, campaign_id: int, budget: BudgetConfig, best_metric: Optional[float] = None) -> BudgetStatus:
    used, hours = ledger.usage(campaign_id)
    cost = ledger.total_cost(campaign_id)
    reasons: list[str] = []

    exp_left = None if budget.max_experiments is None else max(0, budget.max_experiments - used)
    if exp_left == 0:
        reasons.append(f"experiment budget spent ({used}/{budget.max_experiments}): budget.max_experiments counts "
                       "training runs (one per seed of each experiment, plus confirm runs)")
    hours_left = None if budget.max_hours is None else max(0.0, budget.max_hours - hours)
    if hours_left is not None and hours_left <= 0:
        reasons.append(f"time budget spent ({hours:.2f}/{budget.max_hours} h of experiments)")
    cost_left = None if budget.max_cost_usd is None else max(0.0, budget.max_cost_usd - cost)
    if cost_left is not None and cost_left <= 0 and budget.max_cost_usd is not None:
        reasons.append(f"cost budget spent (${cost:.2f}/${budget.max_cost_usd:.2f})")
    if budget.target_metric is not None and best_metric is not None and best_metric <= budget.target_metric:
        reasons.append(f"target reached (best {best_metric:.4f} <= {budget.target_metric})")
    campaign = ledger.campaign(campaign_id)
    if campaign and campaign["status"] != "active":
        reasons.append(f"campaign is {campaign['status']}")

    return BudgetStatus(experiments_used=used, experiments_left=exp_left, runs_used=used, runs_left=exp_left,
                        hours_used=round(hours, 4),
                        hours_left=None if hours_left is None else round(hours_left, 4),
                        cost_used_usd=round(cost, 4),
                        cost_left_usd=None if cost_left is None else round(cost_left, 4),
                        best_metric=best_metric, target_metric=budget.target_metric,
                        should_stop=bool(reasons), reasons=reasons)
