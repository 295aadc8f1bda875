"""One run in an isolated working copy: what the local and the Ray executor both execute.

From a RunSpec a fresh temporary directory is built:

    <base>/loopwright-run-XXXX/
      ws/          prepare.py (+ evaluate.py, pt2audit.py) + loopwright.toml (the pinned bytes), the editable
                   sources (train.py)
      state/data/  the data files, each verified against the spec's manifest (sha256) before use; val/test
                   only once training is over (HELD_OUT)
      run/         train.log, scratch/ (train.py's one writable dir), eval.log, eval.json

and the ordinary sandboxed runner (loop/runner.py) trains and evaluates there, exactly as in a workspace:
train.py sees the train view only, the evaluator runs from its own bytes in its own sandbox. Nothing of
the real workspace or state directory is touched, so several runs can go at once, here or on a worker.
The directory is removed afterwards; the outcome carries the logs back.
"""
from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from mcp_server.executors.base import LOG_CAP, OUTCOME_NAME, ExecutorError, RunOutcome, RunSpec
from mcp_server.loop import config as cfgmod
from mcp_server.loop import gitops, runner
from mcp_server.loop.workspace import Workspace

DataSource = Callable[[str, str], Path]   # (file name, sha256) -> a local file said to hold that content

def sha256_of(path: Path) -> str:
    """A data file's sha256 (cached while the file is unchanged: see gitops.cached_file_sha256)."""
    return gitops.cached_file_sha256(path)


def dir_source(data_dir: Path) -> DataSource:
    """Data from a directory on this machine (the driver's state directory)."""
    return lambda name, sha: Path(data_dir) / name


# What only the evaluator reads: staged into the working copy after train.py's sandbox is gone (and on a
# Ray worker fetched only then), so while train.py runs its working copy holds no held-out split at all
HELD_OUT = ("val.bin", "test.bin")


def stage_data(manifest: dict[str, str], source: DataSource, dest: Path) -> None:
    """Put every manifest file into `dest` (a hard link when possible, else a copy), each verified by
    sha256 first; a mismatch is an ExecutorError naming the file (nothing is run on wrong data)."""
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    for name, want in sorted(manifest.items()):
        if "/" in name or name.startswith("."):
            raise ExecutorError(f"bad data file name {name!r} in the manifest")
        src = source(name, want)
        if not src.is_file():
            raise ExecutorError(f"data file {name} (sha256 {want[:12]}) is missing at {src}")
        got = sha256_of(src)
        if got != want:
            raise ExecutorError(f"data file {name} at {src} hashes to {got[:12]}, not {want[:12]} as the pinned "
                                "manifest says; the data there was changed or is incomplete -- re-run "
                                "`loopwright init` on a clean copy or remove the worker's cache")
        try:
            os.link(src, dest / name)
        except OSError:
            shutil.copyfile(src, dest / name)


def materialise(spec: RunSpec, source: DataSource, base: Optional[Path] = None) -> tuple[Path, Workspace]:
    """A fresh working copy for `spec` (see the module doc); returns (its directory, a Workspace on it)."""
    if base is not None:
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
    top = Path(tempfile.mkdtemp(prefix="loopwright-run-", dir=base))
    try:
        root, state = top / "ws", top / "state"
        root.mkdir(mode=0o700)
        state.mkdir(mode=0o700)
        for name, data in spec.evaluator.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(data)
        for rel, text in spec.sources.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text, encoding="utf-8")
        stage_data({k: v for k, v in spec.data.items() if k not in HELD_OUT}, source, state / "data")
        cfg = cfgmod.parse_config(spec.evaluator["loopwright.toml"].decode("utf-8"), "loopwright.toml (pinned)")
        return top, Workspace(root, cfg, state)
    except BaseException:
        shutil.rmtree(top, ignore_errors=True)
        raise


def run(spec: RunSpec, source: DataSource, base: Optional[Path] = None, worker: str = "",
        outcome_dir: Optional[Path] = None, on_progress: Optional[runner.ProgressFn] = None,
        cancel: Optional[threading.Event] = None) -> RunOutcome:
    """Train and evaluate `spec` in a fresh working copy; never raises for a failure of the run itself
    (a crash, a timeout, a rejected model or bad data are outcomes). With `outcome_dir`, the outcome is
    also written there (OUTCOME_NAME) as soon as it is known: a restarted driver records it from there.
    `cancel` set: the sandbox is killed, nothing is evaluated and no outcome is saved (a later driver
    finds the run unfinished: interrupted, re-queued); the returned outcome is "lost"."""
    worker = worker or f"local:{socket.gethostname()}:{os.getpid()}"
    t0 = time.monotonic()
    if cancel is not None and cancel.is_set():
        return _cancelled(spec, worker, t0)
    try:
        top, ws = materialise(spec, source, base)
    except (ExecutorError, cfgmod.ConfigError, OSError) as e:
        out = RunOutcome(spec.run_id, "rejected", f"the working copy could not be made: {e}", worker=worker)
        _save(out, outcome_dir)
        return out
    try:
        run_dir = top / "run"
        tr = runner.run_training(ws, run_dir, spec.seed, on_progress, unsafe=spec.unsafe, cancel=cancel)
        if tr.status == "cancelled" or (cancel is not None and cancel.is_set()):
            return _cancelled(spec, worker, t0)
        out = RunOutcome(spec.run_id, tr.status, tr.reason, summary=dict(tr.summary), log_tail=tr.log_tail,
                         train_log=_tail(run_dir / "train.log"), train_wall_s=round(tr.wall_seconds, 3),
                         sandbox=tr.sandbox, worker=worker)
        if tr.status == "ok" and tr.model_path is not None:
            stage_data({k: v for k, v in spec.data.items() if k in HELD_OUT}, source, ws.data_dir)
            # a target's hidden files go to the evaluator only (by content: never into the working copy); a
            # one-shot evaluator: an evaluator server for a state dir removed after this run would serve once
            ev = runner.run_evaluation(ws, None, run_dir, tr.model_path, files={**spec.evaluator, **spec.hidden},
                                       unsafe=spec.unsafe, reuse=False)
            out.eval_wall_s = round(ev.wall_seconds, 3)
            out.eval_json = ev.raw or None
            if ev.ok:
                out.val_bpb, out.test_bpb, out.eval_seconds = ev.val_bpb, ev.test_bpb, ev.eval_seconds
            else:
                out.status, out.reason = "rejected", f"the evaluator rejected the model: {ev.reason}"
                out.eval_seconds = ev.eval_seconds
    except Exception as e:  # noqa: BLE001 - a broken run is an outcome, never an exception in the driver
        out = RunOutcome(spec.run_id, "crash", f"the run failed in the harness: {type(e).__name__}: {e}",
                         train_wall_s=round(time.monotonic() - t0, 3), worker=worker)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    _save(out, outcome_dir)
    return out


def _cancelled(spec: RunSpec, worker: str, t0: float) -> RunOutcome:
    return RunOutcome(spec.run_id, "lost", "cancelled by the driver", train_wall_s=round(time.monotonic() - t0, 3),
                      worker=worker)


def _tail(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return text[-LOG_CAP:]


def _save(out: RunOutcome, outcome_dir: Optional[Path]) -> None:
    if outcome_dir is None:
        return
    outcome_dir.mkdir(parents=True, exist_ok=True)
    tmp = outcome_dir / (OUTCOME_NAME + ".tmp")
    tmp.write_text(out.to_json())
    os.replace(tmp, outcome_dir / OUTCOME_NAME)
