"""Search mechanisms consulted by `suggest_next` (and, for near repeats, by run_experiment).

- tabu: exact repeats are refused by the engine; near repeats get a warning.
- plateau: after K experiments without a keep, an orthogonal category.
- bandit: UCB1 over categories of change, rewarded by the ledger's verdicts.
- runtime mechanisms (registry.py): written by an outer session or shipped in library/,
  validated (validate.py), run in a sandbox, put on trial and kept or reverted (trial.py).

Each mechanism is a pure function of the history (see base.py); this module
only builds that history from a live workspace and exposes the MCP tool.
"""
from __future__ import annotations

import logging
from typing import Optional, Union

from pydantic import BaseModel, Field

from mcp_server.mechanisms.bandit import Bandit
from mcp_server.mechanisms.base import Advice, History, Mechanism, combine
from mcp_server.mechanisms.history import history_from_engine as history_from_engine
from mcp_server.mechanisms.plateau import Plateau
from mcp_server.mechanisms.source import tunable_constants
from mcp_server.mechanisms.tabu import Tabu

log = logging.getLogger("loopwright.mechanisms")

PLATEAU_K = 4


def default_mechanisms() -> list[Mechanism]:
    return [Tabu(), Plateau(PLATEAU_K), Bandit()]


class ArmInfo(BaseModel):
    category: str
    pulls: int
    kept: int
    mean_reward: float
    ucb: Optional[float] = Field(None, description="upper confidence bound; null = not tried yet")


class MechanismAdvice(BaseModel):
    name: str
    version: int
    status: str = Field(description="active (on trial) or kept")
    category: Optional[str] = None
    parameters: list[str] = Field(default_factory=list)
    avoid: list[str] = Field(default_factory=list)
    forced: bool = False
    note: str = ""
    error: Optional[str] = Field(None, description="it failed on this call: skipped, and reverted")


class Suggestion(BaseModel):
    category: Optional[str] = Field(None, description="category of change to try next")
    parameters: list[str] = Field(default_factory=list, description="constants of that category, best first")
    decided_by: str = Field(description="which mechanism chose the category: plateau, bandit, a runtime "
                                        "mechanism's name, or none")
    reason: str
    plateau: bool
    experiments_since_keep: int
    tabu_status: str = Field(description="the working-tree train.py: new, unchanged, exact_repeat or near_repeat")
    repeat_of: Optional[int] = Field(None, description="the experiment it repeats, if any")
    warnings: list[str] = Field(default_factory=list)
    arms: list[ArmInfo] = Field(default_factory=list, description="the bandit's view of each category")
    constants: dict[str, Union[bool, int, float]] = Field(
        default_factory=dict, description="train.py's tunable constants and their current values")
    mechanisms: list[MechanismAdvice] = Field(default_factory=list,
                                              description="what each runtime mechanism in use advised")
    next_step: str


def _working_source(engine) -> str:
    p = engine.ws.root / engine.ws.cfg.paths.editable[0]
    return p.read_text(encoding="utf-8", errors="replace") if p.is_file() else ""


def advise(history: History, source: str, mechanisms: Optional[list[Mechanism]] = None) -> Advice:
    return combine([m.advise(history, source) for m in (mechanisms or default_mechanisms())])


def suggest(engine, mechanisms: Optional[list[Mechanism]] = None) -> Suggestion:
    history = history_from_engine(engine)
    source = _working_source(engine)
    warnings: list[str] = []
    try:
        tunable_constants(source)
        planning_source = source
    except SyntaxError as e:
        warnings.append(f"train.py does not parse (line {e.lineno}: {e.msg}); fix it or call revert()")
        planning_source = history.best_source
    runtime = _runtime(engine, history, planning_source) if mechanisms is None else []
    advice = combine([m.advise(history, planning_source) for m in (mechanisms or default_mechanisms())]
                     + [r.advice for r in runtime if r.advice is not None])
    warnings += [f"mechanism {r.name} v{r.version} failed and was reverted: {r.error}" for r in runtime if r.error]
    if planning_source is not source:   # tabu still judges the file as it is
        advice = combine([advice, Tabu().advise(history, source)])
    tabu = advice.details.get("tabu", {})
    plateau = advice.details.get("plateau", {})
    arms = [ArmInfo(**{**a, "ucb": None if a["ucb"] == float("inf") else round(a["ucb"], 4)})
            for a in advice.details.get("bandit", {}).get("arms", [])]
    status = tabu.get("status", "new")
    if status == "exact_repeat":
        nxt = "Edit train.py differently: this exact version was tried and run_experiment will refuse it."
    elif status == "near_repeat":
        nxt = "This is nearly a tried version; prefer a bigger step or another parameter, then run_experiment."
    elif status == "unchanged" and advice.category:
        nxt = f"Edit train.py: change one of {', '.join(advice.parameters[:3]) or advice.category}, then run_experiment."
    else:
        nxt = "Run it: run_experiment(description, hypothesis), then score."
    try:
        consts = {k.name: k.value for k in tunable_constants(planning_source)}
    except SyntaxError:
        consts = {}
    return Suggestion(category=advice.category, parameters=list(advice.parameters), decided_by=advice.mechanism,
                      reason=advice.reason or "no opinion yet", plateau=bool(plateau.get("plateau")),
                      experiments_since_keep=history.experiments_since_keep, tabu_status=status,
                      repeat_of=tabu.get("of_experiment"), warnings=warnings + list(advice.warnings), arms=arms,
                      constants=consts, mechanisms=[_report(r) for r in runtime], next_step=nxt)


def _runtime(engine, history: History, source: str) -> list:
    """Trials first (decided when due; the built-in outer loop steps when enabled), then the advice of
    every runtime mechanism in use. Nothing here may stop the inner loop: errors are logged."""
    from mcp_server.mechanisms import registry, trial

    try:
        if trial.outer_enabled(engine.ledger):
            trial.outer_step(engine, history=history)
        else:
            trial.tick(engine, history)
    except Exception:  # noqa: BLE001
        log.exception("mechanism trial bookkeeping failed; suggesting without it")
    try:
        return registry.consult(engine, history, source)
    except Exception:  # noqa: BLE001
        log.exception("runtime mechanisms failed; suggesting with the built-in ones only")
        return []


def _report(r) -> MechanismAdvice:
    d = r.advice.details if r.advice is not None else {}
    return MechanismAdvice(name=r.name, version=r.version, status=r.status, category=d.get("category"),
                           parameters=d.get("parameters", []), avoid=d.get("avoid", []), forced=d.get("force", False),
                           note=d.get("note", ""), error=r.error)


def near_repeat_warnings(engine) -> list[str]:
    """For run_experiment: warnings about the working-tree train.py being nearly a tried version.
    A mechanism failure must never stop an experiment, so errors are logged and swallowed."""
    try:
        return list(Tabu().advise(history_from_engine(engine), _working_source(engine)).warnings)
    except Exception:  # noqa: BLE001
        log.exception("tabu mechanism failed; running the experiment without its warnings")
        return []


def register_tools(server, in_thread) -> None:
    """Add suggest_next to the MCP server (called by server._register_extensions)."""
    from mcp.types import ToolAnnotations

    @server.tool(annotations=ToolAnnotations(title="Suggest the next experiment", read_only_hint=True,
                                             open_world_hint=False))
    async def suggest_next() -> Suggestion:
        """Guidance from the search mechanisms: which category of change to try next and which constants
        (a UCB1 bandit over categories; a plateau detector that points elsewhere after several experiments
        without a keep), and whether the current train.py repeats or nearly repeats a tried version (tabu).
        Cheap; call it before editing and again before run_experiment."""
        return await in_thread(lambda e: suggest(e), write=False)
