"""The executor interface: what one run needs (RunSpec), what it gives back (RunOutcome), and the
Executor protocol the engine drives.

A run is one training of train.py on one seed followed by the frozen evaluator, in an isolated working
copy (executors/workcopy.py). Everything a run depends on travels *by content*: the editable sources,
the pinned evaluator's bytes (prepare.py, its siblings, loopwright.toml of the pinned commit) and the data's
manifest {file: sha256}; a worker verifies every data file against the manifest before use. No path of
the workspace or its state directory is needed on the worker, and no secret travels (the runner's
scrubbed environment applies on the worker too).

Handles are the RunSpec's `run_id` (the ledger row the outcome is recorded into): an int the engine can
persist, so a restarted driver can reconcile what was in flight.

    ex = make_executor(cfg.executor, data_dir=ws.data_dir)      # executors/factory.py
    ex.submit(spec)                       # returns spec.run_id at once
    for out in ex.wait(timeout=60):       # the outcomes finished so far (at least one unless timeout)
        ...                               # out.status in ok|crash|timeout|rejected|lost
    ex.close()
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Iterable, Mapping, Optional, Protocol, runtime_checkable

OUTCOME_NAME = "outcome.json"    # a finished run's outcome, written next to its logs (reconcile reads it)
STATUSES = ("ok", "crash", "timeout", "rejected", "lost")
LOG_CAP = 256 * 1024             # characters of train.log an outcome carries back


class ExecutorError(RuntimeError):
    """An executor cannot be used (package missing, cluster unreachable, bad spec); the message says what
    to do."""


@dataclass(frozen=True)
class RunSpec:
    """Everything one run needs, by content.

    run_id     the ledger row the outcome goes to (also the handle)
    seed       LOOPWRIGHT_SEED for train.py (the runner picks seeds, never train.py)
    sources    the editable files {relative path: text}, e.g. {"train.py": "..."}
    evaluator  the pinned commit's frozen files {name: bytes}: "prepare.py" (with
               "evaluate.py" and "pt2audit.py" where the pinned commit has them) and "loopwright.toml"
               (the benchmark's frozen settings -- clock, budget, eval tokens -- are read from the latter)
    data       the manifest {file name: sha256} from the pinned loopwright.lock (train/val/test, meta)
    hidden     a target's hidden files {path: bytes} (loop/targets.py): staged for its evaluator after the run,
               never into the working copy the run sees; a target's `evaluator` is every non-editable pinned
               file and its `data` is empty
    unsafe     True only when the human passed --unsafe-no-sandbox: run without bubblewrap where none exists
    label      for logs and errors ("#12 seed 1001 candidate")
    """
    run_id: int
    seed: int
    sources: Mapping[str, str]
    evaluator: Mapping[str, bytes]
    data: Mapping[str, str]
    unsafe: bool = False
    label: str = ""
    target: bool = False
    hidden: Mapping[str, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.sources:
            raise ExecutorError(f"run {self.run_id}: no editable sources to run")
        for rel in self.sources:
            if _unsafe_path(rel) or rel in self.evaluator:
                raise ExecutorError(f"run {self.run_id}: editable path {rel!r} must be relative, without '..', "
                                    "and not one of the frozen evaluator files")
        bad = [rel for rel in (*self.evaluator, *self.hidden) if _unsafe_path(rel)]
        if bad:
            raise ExecutorError(f"run {self.run_id}: evaluator paths {bad} must be relative, without '..'")
        missing = [n for n in (("loopwright.toml",) if self.target else ("prepare.py", "loopwright.toml"))
                   if n not in self.evaluator]
        if missing:
            raise ExecutorError(f"run {self.run_id}: the pinned evaluator files {missing} are missing from the spec")
        if not self.target and "train.bin" not in self.data:
            raise ExecutorError(f"run {self.run_id}: the data manifest has no train.bin ({sorted(self.data)})")


def _unsafe_path(rel: str) -> bool:
    return not rel or rel.startswith("/") or ".." in rel.split("/")


@dataclass
class RunOutcome:
    """What a run gave back: the runner's TrainResult/EvalResult fields, flattened, plus where it ran.

    status     ok | crash | timeout | rejected (the evaluator refused the model, a data hash did not match)
               | lost (the worker or its node died: nothing is known about the run)
    summary    train.py's summary block (training_seconds, num_steps, peak_vram_mb, ...)
    train_log  the tail of train.log (at most LOG_CAP characters); eval_json the evaluator's JSON
    sandbox    bwrap | sandbox-exec | none (the human's --unsafe-no-sandbox)
    worker     where it ran: "local:<host>:<pid>" or "ray:<node id>"
    """
    run_id: int
    status: str
    reason: str = ""
    val_bpb: Optional[float] = None
    test_bpb: Optional[float] = None
    eval_seconds: Optional[float] = None
    summary: dict = field(default_factory=dict)
    log_tail: str = ""
    train_log: str = ""
    eval_json: Optional[dict] = None
    train_wall_s: float = 0.0
    eval_wall_s: float = 0.0
    sandbox: str = "unknown"
    worker: str = ""

    @property
    def lost(self) -> bool:
        return self.status == "lost"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "RunOutcome":
        data = json.loads(text)
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


@runtime_checkable
class Executor(Protocol):
    """Runs RunSpecs somewhere. One driver (the engine) per executor; not thread-safe.

    kind       "local" | "ray"
    capacity   how many runs may be in flight at once (the concurrency limit the engine respects)
    submit     start (or queue) a run; returns its handle (= spec.run_id) at once
    wait       block until at least one of `handles` (default: every run in flight) finished or `timeout`
               seconds passed; returns the finished ones' outcomes (each outcome is returned once).
               A dead worker or node gives status "lost"; it is never retried by the executor itself.
    cancel     stop a run (its outcome, if any, is dropped)
    in_flight  the handles submitted and not yet returned by wait
    close      cancel what is in flight and release the executor's resources
    """
    kind: str
    capacity: int

    def submit(self, spec: RunSpec) -> int: ...

    def wait(self, handles: Optional[Iterable[int]] = None, timeout: Optional[float] = None) -> list[RunOutcome]: ...

    def cancel(self, handle: int) -> None: ...

    def in_flight(self) -> list[int]: ...

    def close(self) -> None: ...
