"""Run train.py under a budget, then the frozen evaluator in a fresh process.

Training: train.py runs in the OS sandbox (loop/sandbox.py: bubblewrap; own PID
namespace, no network, read-only system and workspace, the train view where
prepare.py looks for data, the state directory invisible, one writable scratch
dir the model is exported to) with the seed and export path in a scrubbed
environment (no secrets reach agent-written code); its output is logged in the
run directory and parsed for progress; the sandbox (and with it every process
train.py started) is killed at the hard limit (time budget + grace).

Evaluation: the pinned commit's prepare.py blob (and config) and a hashed private
copy of the model (a plain file only: no FIFO, no symlink) go to a fresh 0700
directory outside the workspace; the evaluator runs there in its own sandbox
(CPU only, nothing writable, only val/test/meta visible) with `python -I -S` and
a bootstrap that puts the stdlib first and site-packages last (no cwd, no
PYTHONPATH, no .pth files, no sitecustomize), so no agent-written Python runs
while scoring; its result is read from its stdout pipe.

Without a usable sandbox both refuse to run (SandboxUnavailable, saying how to
install bubblewrap) unless the human opted out with --unsafe-no-sandbox.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from mcp_server.common.procs import kill_group, kill_group_now
from mcp_server.loop import gitops, sandbox
from mcp_server.loop.workspace import Workspace

ProgressFn = Callable[[int, float, float, float], None]   # step, loss, elapsed, remaining

_PROGRESS = re.compile(r"step=(\d+)\s+loss=([-+0-9.eEnaif]+)\s+elapsed=([0-9.]+)\s+remaining=([-0-9.]+)")
_SUMMARY = re.compile(r"^([a-zA-Z_][a-zA-Z0-9_]*):\s+(\S+)\s*$")

# Environment variables passed to train.py; everything else (tokens, secrets) is dropped.
_ENV_KEEP = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TMPDIR", "TZ", "USER",
             "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
             "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE",
             "OPENBLAS_L2_SIZE", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX", "XDG_CACHE_HOME")
_ENV_KEEP_PREFIX = ("PYTORCH_", "TORCH_", "CUDA_", "NCCL_", "TRITON_", "HSA_", "ROCM_", "MPS_")


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in _ENV_KEEP or k.startswith(_ENV_KEEP_PREFIX)}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return env


@dataclass
class TrainResult:
    status: str                       # ok | crash | timeout | cancelled (only when a cancel event was given)
    exit_code: Optional[int]
    reason: str
    wall_seconds: float
    summary: dict[str, float] = field(default_factory=dict)
    log_tail: str = ""
    model_path: Optional[Path] = None
    sandbox: str = "unknown"          # bwrap | sandbox-exec | none (the human's --unsafe-no-sandbox)


@dataclass
class EvalResult:
    ok: bool
    reason: str
    val_bpb: Optional[float] = None
    test_bpb: Optional[float] = None
    eval_seconds: Optional[float] = None
    raw: dict = field(default_factory=dict)
    wall_seconds: float = 0.0          # the evaluator process, start to exit
    model_sha256: Optional[str] = None  # of the copy the evaluator scored


def _parse_summary(lines: list[str]) -> dict[str, float]:
    """autoresearch's summary block: `key: value` lines after the last '---'."""
    try:
        start = len(lines) - 1 - lines[::-1].index("---")
    except ValueError:
        return {}
    out: dict[str, float] = {}
    for line in lines[start + 1:]:
        m = _SUMMARY.match(line.strip())
        if m:
            try:
                out[m.group(1)] = float(m.group(2))
            except ValueError:
                pass
    return out


def kill_stale(run_dir: Path) -> bool:
    """Kill a training process group left behind by a server that died (pid file)."""
    pid_file = run_dir / "train.pid"
    if not pid_file.is_file():
        return False
    try:
        return kill_group_now(int(pid_file.read_text().strip()))
    except ValueError:
        return False
    finally:
        pid_file.unlink(missing_ok=True)


def run_training(ws: Workspace, run_dir: Path, seed: int, on_progress: Optional[ProgressFn] = None,
                 python: str = sys.executable, unsafe: Optional[bool] = None,
                 cancel: Optional[threading.Event] = None) -> TrainResult:
    """train.py of `ws.root` on `seed`, sandboxed. `unsafe` (default: the process's opt-out) is passed
    explicitly where the environment is not the human's (an executor's worker). When `cancel` is set
    the sandbox is killed at once (status "cancelled")."""
    info = sandbox.require(unsafe)    # SandboxUnavailable unless the human opted out
    run_dir.mkdir(parents=True, exist_ok=True)
    # train.py writes only here (the sandbox's one writable dir); the evaluator gets a copy
    scratch = run_dir / "scratch"
    if scratch.is_symlink():
        scratch.unlink()
    elif scratch.exists():
        shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(mode=0o700)
    model_path = scratch / "model.pt2"
    # train.py sees the training split only (val/test stay in the state directory): a copy of the
    # train view where the workspace's prepare.py looks.
    view = ws.sync_train_view()
    bench = ws.cfg.benchmark
    hard_limit = bench.hard_limit_seconds()   # per budget clock: cpu/steps runs may wait for a busy CPU
    env = clean_env({"LOOPWRIGHT_SEED": str(seed), "LOOPWRIGHT_EXPORT_PATH": str(model_path),
                     "LOOPWRIGHT_RUN_DIR": str(scratch), "PYTHONHASHSEED": str(seed),
                     "TMPDIR": "/tmp", "HOME": os.path.expanduser("~")})
    cmd = sandbox.training_command(ws, [python, "train.py"], view=view, scratch=scratch, env=env, info=info)
    memory = sandbox.default_memory_limit()
    log_path = run_dir / "train.log"
    t0 = time.monotonic()
    lines: list[str] = []
    with open(log_path, "w", encoding="utf-8", buffering=1) as log:   # line-buffered: `tail -f` sees progress
        proc = subprocess.Popen(cmd, cwd=ws.root, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True, bufsize=1,
                                preexec_fn=sandbox.limits(memory, gpu=sandbox.gpu_visible(env)))
        (run_dir / "train.pid").write_text(str(proc.pid))

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                line = line.rstrip("\n")
                lines.append(line)
                if len(lines) > 4000:
                    del lines[:2000]
                m = _PROGRESS.search(line)
                if m and on_progress:
                    try:
                        on_progress(int(m.group(1)), float(m.group(2)), float(m.group(3)), float(m.group(4)))
                    except Exception:  # noqa: BLE001 - a progress sink must never kill a run
                        pass

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = cancelled = False
        deadline = t0 + hard_limit
        try:
            while True:
                left = deadline - time.monotonic()
                try:
                    # polled when it can be cancelled, so a cancel does not wait for the hard limit
                    proc.wait(timeout=max(0.0, left if cancel is None else min(left, 0.2)))
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() >= deadline:
                        timed_out = True
                        kill_group(proc, grace_s=3.0)
                        break
                    if cancel is not None and cancel.is_set():
                        cancelled = True
                        kill_group(proc, grace_s=1.0)
                        break
        finally:
            # train.py may have left children (dataloader workers): the group goes too.
            kill_group_now(proc.pid)
        reader.join(timeout=10)
        (run_dir / "train.pid").unlink(missing_ok=True)
    wall = time.monotonic() - t0
    summary = _parse_summary(lines)
    tail = "\n".join(lines[-30:])

    if cancelled:
        return TrainResult("cancelled", None, "cancelled by the driver; the sandbox was killed", wall, summary,
                           tail, sandbox=info.kind)
    if timed_out:
        return TrainResult("timeout", None, f"killed at the hard limit of {hard_limit:.0f} s "
                           f"of wall clock (clock {bench.clock!r}, time budget {bench.time_budget:.0f} s, grace "
                           f"{bench.grace_seconds:.0f} s: see BenchmarkConfig.hard_limit_seconds)",
                           wall, summary, tail, sandbox=info.kind)
    if proc.returncode != 0:
        return TrainResult("crash", proc.returncode, f"train.py exited with code {proc.returncode}", wall,
                           summary, tail, sandbox=info.kind)
    loss_nan = any("loss=nan" in ln.lower() or "loss=inf" in ln.lower() for ln in lines[-50:])
    if loss_nan or any(isinstance(v, float) and math.isnan(v) for v in summary.values()):
        return TrainResult("crash", 0, "training diverged (NaN/inf loss)", wall, summary, tail, sandbox=info.kind)
    if not model_path.is_file() or model_path.is_symlink():
        return TrainResult("crash", 0, "train.py finished without exporting a model: it must end with "
                           "prepare.export_model(model)", wall, summary, tail, sandbox=info.kind)
    return TrainResult("ok", 0, "", wall, summary, tail, model_path, sandbox=info.kind)


EVAL_DATA_FILES = ("val.bin", "test.bin", "meta.json", "token_bytes.npy", "tokenizer.json")


def run_evaluation(ws: Workspace, pinned: Optional[str], run_dir: Path, model_path: Path,
                   python: str = sys.executable, files: Optional[dict[str, bytes]] = None,
                   unsafe: Optional[bool] = None) -> EvalResult:
    """The pinned evaluator on the model. Its files come from the pinned commit's git objects, or, on an
    executor's worker (no git there), by content in `files` (prepare.py and loopwright.toml)."""
    info = sandbox.require(unsafe)
    if files is None:
        if pinned is None:
            raise ValueError("run_evaluation needs the pinned commit or the evaluator's files")
        files = {"prepare.py": gitops.verified_blob_bytes(ws.root, pinned, "prepare.py"),
                 "loopwright.toml": gitops.verified_blob_bytes(ws.root, pinned, "loopwright.toml")}
    t0 = time.monotonic()
    try:
        box = sandbox.make_eval_dir(files, model_path)
    except sandbox.UnsafeFile as e:
        return EvalResult(False, str(e), wall_seconds=time.monotonic() - t0)
    try:
        data_dir = box.path / "data" if info.available else ws.data_dir
        argv = ["evaluate", str(box.model), "--data-dir", str(data_dir)]
        code = sandbox.eval_bootstrap(box.prepare, argv, sandbox.site_dirs())
        cmd = sandbox.evaluation_command(ws, [python, "-I", "-S", "-c", code], eval_dir=box,
                                         data_dir=ws.data_dir, data_files=EVAL_DATA_FILES, info=info)
        try:
            proc = subprocess.run(cmd, cwd=box.path, env=clean_env({}), capture_output=True, text=True,
                                  timeout=ws.cfg.benchmark.eval_timeout, start_new_session=True,
                                  preexec_fn=sandbox.limits(sandbox.default_memory_limit()))
        except subprocess.TimeoutExpired:
            return EvalResult(False, f"evaluation exceeded {ws.cfg.benchmark.eval_timeout:.0f} s",
                              wall_seconds=time.monotonic() - t0, model_sha256=box.model_sha256)
    finally:
        box.cleanup()
    elapsed = time.monotonic() - t0
    (run_dir / "eval.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    result = None
    for line in reversed(proc.stdout.strip().splitlines()):
        try:
            result = json.loads(line)
            break
        except json.JSONDecodeError:
            continue
    if not isinstance(result, dict):
        return EvalResult(False, f"evaluator crashed (exit {proc.returncode}): {proc.stderr.strip()[-600:]}",
                          wall_seconds=elapsed, model_sha256=box.model_sha256)
    result["model_sha256"] = box.model_sha256
    (run_dir / "eval.json").write_text(json.dumps(result, indent=2))
    if not result.get("ok"):
        return EvalResult(False, str(result.get("reason", "rejected by the evaluator")), raw=result,
                          wall_seconds=elapsed, model_sha256=box.model_sha256)
    return EvalResult(True, "", float(result["val_bpb"]), _opt(result.get("test_bpb")),
                      float(result.get("eval_seconds", elapsed)), result, elapsed, box.model_sha256)


def _opt(v) -> Optional[float]:
    return None if v is None else float(v)
