"""Run train.py under a budget, then the frozen evaluator in a fresh process.

Training: train.py runs in the OS sandbox (loop/sandbox.py: bubblewrap; own PID
namespace, no network, read-only system and workspace, the train view where
prepare.py looks for data, the state directory invisible, one writable scratch
dir the model is exported to) with the seed and export path in a scrubbed
environment (no secrets reach agent-written code); its output is logged in the
run directory and parsed for progress; the sandbox (and with it every process
train.py started) is killed at the hard limit (time budget + grace).

The budget is enforced from outside, with the runner's own numbers (never train.py's: its clock,
prepare.TrainingBudget, runs inside the untrusted process and can be rewritten by it). A small
stdlib-only reaper (_REAPER) sits between the runner and bwrap; it is a child subreaper, so the
sandbox's init (which bwrap's outer process never waits for) is reaped by it, and os.wait4 on it
gives the exact CPU seconds of the whole tree. While the run lives, the runner sums the CPU of
every process in the tree from /proc every _METER_INTERVAL s and kills the sandbox once it is over
the allowance (see Allowance). A run over budget ends "timeout" (over_budget set); a run whose
summary reports far fewer CPU or wall seconds than were measured ends "rejected". The measured
figures go into the summary (measured_cpu_seconds, measured_wall_seconds).

Evaluation: the pinned commit's prepare.py blob (and config) and a hashed private
copy of the model (a plain file only: no FIFO, no symlink) go to a fresh 0700
directory in the state dir (never a shared temp dir); the bootstrap runs prepare.py
only if the bytes it read hash to the pinned blob's; the evaluator runs there in its own sandbox
(CPU only, nothing writable, only val/test/meta visible) with `python -I -S` and
a bootstrap that puts the stdlib first and site-packages last (no cwd, no
PYTHONPATH, no .pth files, no sitecustomize), so no agent-written Python runs
while scoring; its result is read from its stdout pipe. Where it can, that process
is a child forked for this one model by the workspace's evaluator server
(loop/evalserver.py: started the same way, in the same sandbox, it imports torch
once), with the same checks on what the child printed and how it exited.

Without a usable sandbox both refuse to run (SandboxUnavailable, saying how to
install bubblewrap) unless the human opted out with --unsafe-no-sandbox.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional

from mcp_server.common.procs import kill_group, kill_group_now
from mcp_server.loop import evalserver, sandbox
from mcp_server.loop.workspace import EVALUATOR_SIBLINGS, Workspace, pinned_evaluator

ProgressFn = Callable[[int, float, float, float], None]   # step, loss, elapsed, remaining

_PROGRESS = re.compile(r"step=(\d+)\s+loss=([-+0-9.eEnaif]+)\s+elapsed=([0-9.]+)\s+remaining=([-0-9.]+)")
_SUMMARY = re.compile(r"^([a-zA-Z_][a-zA-Z0-9_]*):\s+(\S+)\s*$")

# Environment variables passed to train.py; everything else (tokens, secrets) is dropped.
_ENV_KEEP = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TMPDIR", "TZ", "USER",
             "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
             "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE",
             "OPENBLAS_L2_SIZE", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX", "XDG_CACHE_HOME")
_ENV_KEEP_PREFIX = ("PYTORCH_", "TORCH_", "CUDA_", "NCCL_", "TRITON_", "HSA_", "ROCM_", "MPS_")
# ... except a name that says it holds a credential, whatever its prefix (red team: TORCH_HUB_TOKEN
# reached train.py, and through its log tail the agent)
_ENV_SECRET = re.compile(r"TOKEN|SECRET|PASS|KEY|AUTH|CRED|COOKIE|SESSION", re.IGNORECASE)


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if (k in _ENV_KEEP or k.startswith(_ENV_KEEP_PREFIX)) and not _ENV_SECRET.search(k)}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return env


@dataclass
class TrainResult:
    # ok | crash | timeout | rejected | cancelled (only when a cancel event was given). Over the budget as
    # the runner measured it: "timeout" with over_budget set (the ledger's and executors' statuses have
    # no other word for it); a summary that misreports the measured usage: "rejected".
    status: str
    exit_code: Optional[int]
    reason: str
    wall_seconds: float
    summary: dict[str, float] = field(default_factory=dict)
    log_tail: str = ""
    model_path: Optional[Path] = None
    sandbox: str = "unknown"          # bwrap | sandbox-exec | none (the human's --unsafe-no-sandbox)
    cpu_seconds: Optional[float] = None   # the runner's measurement of the whole sandboxed tree
    over_budget: bool = False             # killed or refused for using more than the budget allows


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


# ---------------------------------------------------------------------------
# The budget, metered from outside train.py

# How far over the frozen budget an honest run may read on the runner's meter: the allowance is
# time_budget * BUDGET_TOLERANCE + START_SECONDS, on the budget's own clock (cpu: CPU seconds of the
# whole sandboxed tree; wall: seconds since the sandbox was spawned). prepare.TrainingBudget counts
# from the start of the python process and plans to end at 0.96-0.99 of the budget (BENCHMARKS.md;
# tests/bench/test_train.py allows 1.02). The meter also sees what train.py cannot: the reaper and bwrap
# starting, and torch's interpreter teardown after the summary line. Measured on a loaded 2-core
# machine with the bundled train.py: cpu clock, 30 s budget: 28.7 CPU s inside, 29.5 outside (0.985
# of the budget); 8 s budget: 6.8 inside, 7.65 outside; wall clock, 8 s: 7.0 s inside, 8.3 outside
# (`python -c "import torch"` alone: 1.11 CPU s inside, 1.69 outside). So outside = inside + a fixed
# 0.6-0.9 CPU s (1.3 s of wall); START_SECONDS covers it with room, and the 3 % the plan's overshoot
# (up to 2 %) and rounding. A cheat gets at most 3 % + 1.5 s, far under a keep-sized gain (the red
# team's forged run used 3.5 budgets).
BUDGET_TOLERANCE = 1.03
START_SECONDS = 1.5
# The wall clock also pays for bwrap's mounts and waits for the CPU on a busy machine during start-up
# and teardown (measured +1.3 s on a loaded 2-core machine); a GPU's context teardown was not measured
# here, so it gets 1.5 s more.
WALL_START_EXTRA = 1.5
# A summary that claims much less than was measured misreports its usage (a rewritten clock): the
# run is rejected even when it stayed within the allowance. Loose on purpose (honest summaries
# are printed a moment before the process ends, and the wall clock includes GPU teardown).
MISREPORT_FACTOR = 1.5
MISREPORT_SLACK = 5.0
_METER_INTERVAL = 0.25    # seconds between two readings of the tree's CPU while it runs
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# Runs between the runner and the sandbox (python -I -S, stdlib only, no agent code): a child
# subreaper, so the sandbox's init -- which bwrap's outer process exits without waiting for, taking
# the CPU of everything in the sandbox with it (measured: os.wait4 on bwrap reads 0.002 s for a run
# that used 1.5 s) -- is reparented to it and reaped here. os.wait4 on the reaper then gives the
# exact CPU of the whole tree, short bursts between two readings included. It exits with the
# sandbox's exit code once the sandbox and what it left are reaped (waiting at most 3 s for
# stragglers: only outside a PID namespace, with --unsafe-no-sandbox, can a daemon outlive it).
_REAPER = r"""
import os, sys, time
try:
    import ctypes
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)   # PR_SET_CHILD_SUBREAPER (Linux; elsewhere wait4 still counts)
except Exception:
    pass
argv = sys.argv[1:]
pid = os.fork()
if pid == 0:
    try:
        os.execvp(argv[0], argv)
    finally:
        os._exit(127)
code = None
while code is None:
    try:
        p, st = os.waitpid(-1, 0)
    except ChildProcessError:
        break
    if p == pid:
        code = os.waitstatus_to_exitcode(st)
end = time.monotonic() + 3.0
while time.monotonic() < end:
    try:
        p, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        break
    if p == 0:
        time.sleep(0.01)
sys.exit(1 if code is None else code if code >= 0 else 128 - code)
"""


def _children(pid: int) -> Optional[list[int]]:
    """Child pids of `pid` (all its threads'), None when the kernel has no children files."""
    kids: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(k) for k in f.read().split()]
        except FileNotFoundError:
            if os.path.isdir(f"/proc/{pid}/task/{tid}"):
                return None          # no CONFIG_PROC_CHILDREN: the caller scans /proc for parents
        except (OSError, ValueError):
            continue
    return kids


def _parent_map() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            out.setdefault(ppid, []).append(int(name))
    return out


def tree_cpu_seconds(root: int) -> Optional[float]:
    """CPU seconds (user + system) of `root` and every live descendant, each with its reaped children
    (cutime, cstime), from /proc; None without /proc. A parent is read before its children, so a child
    reaped in between is missed for one reading, never counted twice."""
    if not os.path.isdir(f"/proc/{root}"):
        return None
    total, todo, seen = 0.0, [root], set()
    parents: Optional[dict[int, list[int]]] = None
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15]) / _TICK    # utime stime cutime cstime
        except (OSError, ValueError, IndexError):
            continue
        kids = _children(pid)
        if kids is None:
            parents = _parent_map() if parents is None else parents
            kids = parents.get(pid, [])
        todo += kids
    return total


_GPU_PROBE = ("import sys, torch; m = getattr(torch.backends, 'mps', None); "
              "sys.stdout.write('1' if torch.cuda.is_available() or (m is not None and m.is_available()) else '0')")


@functools.lru_cache(maxsize=8)
def _torch_sees_gpu(python: str, cuda: Optional[str], hip: Optional[str]) -> bool:
    """prepare.active_clock's test (CUDA or MPS present), asked of the python train.py runs on."""
    env = clean_env({k: v for k, v in (("CUDA_VISIBLE_DEVICES", cuda), ("HIP_VISIBLE_DEVICES", hip)) if v is not None})
    try:
        r = subprocess.run([python, "-c", _GPU_PROBE], env=env, capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return True      # unknown: a device is there, so assume the wall clock (the stricter one for GPUs)
    return r.stdout.strip() != "0"


def budget_clock(clock: str, env: dict[str, str], python: str) -> str:
    """The clock prepare.py's TrainingBudget runs on, resolved by the runner (never taken from train.py's
    summary): auto is wall when torch sees a CUDA/MPS device in the sandbox, cpu otherwise."""
    if clock != "auto":
        return clock
    if sys.platform != "darwin" and not sandbox.gpu_visible(env):
        return "cpu"
    return "wall" if _torch_sees_gpu(python, env.get("CUDA_VISIBLE_DEVICES"), env.get("HIP_VISIBLE_DEVICES")) else "cpu"


@dataclass(frozen=True)
class Allowance:
    """What the runner lets one run use, on its own meter (the hard wall-clock kill comes on top)."""
    clock: str                    # wall | cpu | steps (resolved)
    time_budget: float
    cpu_limit: Optional[float]    # CPU seconds of the sandboxed tree
    wall_limit: Optional[float]   # seconds since the sandbox was spawned

    @classmethod
    def of(cls, bench, clock: str) -> "Allowance":
        allowed = bench.time_budget * BUDGET_TOLERANCE + START_SECONDS
        if clock == "cpu":
            return cls(clock, bench.time_budget, allowed, None)
        if clock == "wall":
            return cls(clock, bench.time_budget, None, allowed + WALL_START_EXTRA)
        # steps: the token count lives in train.py (prepare._served) and cannot be checked from outside, so
        # how many tokens a run trained on stays trusted. What is enforced is a CPU cap of the hard limit's
        # seconds (4 budgets + grace) on top of the hard wall kill: the CPU a given amount of training costs
        # hardly depends on the thread count (the wall clock does), and the default steps budget costs
        # about a fifth of a cpu-clock budget (BUDGET_TOKENS = 100 baseline steps, 512 fit in 30 CPU s).
        return cls(clock, bench.time_budget, bench.hard_limit_seconds(), None)

    def exceeded(self, cpu: float, wall: float) -> str:
        """'' within the allowance, else the message that says what was measured against what."""
        start = START_SECONDS + (WALL_START_EXTRA if self.clock == "wall" else 0.0)
        how = (f"time budget {self.time_budget:g} s on the {self.clock} clock x {BUDGET_TOLERANCE:g} + "
               f"{start:g} s for the sandbox's start-up and teardown" if self.clock != "steps" else
               "the steps clock's CPU cap: the hard limit's seconds, see BenchmarkConfig.hard_limit_seconds")
        if self.cpu_limit is not None and cpu > self.cpu_limit:
            used = f"{cpu:.1f} CPU seconds (all its processes), more than the {self.cpu_limit:.1f} allowed"
        elif self.wall_limit is not None and wall > self.wall_limit:
            used = f"{wall:.1f} s of wall clock, more than the {self.wall_limit:.1f} allowed"
        else:
            return ""
        return (f"over budget: the run used {used} ({how}). The budget is metered by the runner from outside "
                "train.py, so changing prepare's clock, TIME_BUDGET or cpu_seconds inside train.py does not "
                "buy time: let prepare.start_budget()'s should_stop end the loop, keep start-up and export "
                "small, and do not train after it says stop.")


def misreported(summary: dict[str, float], cpu: float, wall: float) -> str:
    """'' when the summary's own cpu_seconds / total_seconds agree with the runner's meter."""
    for key, measured, unit in (("cpu_seconds", cpu, "CPU seconds"), ("total_seconds", wall, "seconds of wall clock")):
        claimed = summary.get(key)
        if isinstance(claimed, float) and math.isfinite(claimed) and measured > claimed * MISREPORT_FACTOR + MISREPORT_SLACK:
            return (f"the summary reports {key} {claimed:g} but the runner measured {measured:.1f} {unit} from "
                    "outside the sandbox: train.py's budget clock was changed or its summary forged. Use "
                    "prepare.start_budget() and budget.summary() unmodified.")
    return ""


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


def _supervise(proc: subprocess.Popen, t0: float, deadline: float, allowance: Allowance,
              cancel: Optional[threading.Event]) -> tuple[str, float, str]:
    """Wait for the reaper while metering its tree: (how it ended: exited | over | timeout | cancelled,
    the CPU seconds measured, the over-budget message or ''). Killed at once when over the allowance."""
    cpu = 0.0                # a lower bound while it runs; exact once reaped
    while True:
        # reaped here (not proc.wait) for the rusage of the whole tree: the reaper reaped the rest
        try:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:    # reaped by someone else: no exit code, no rusage
            return "exited", cpu, ""
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return "exited", max(cpu, usage.ru_utime + usage.ru_stime), ""
        now = time.monotonic()
        cpu = max(cpu, tree_cpu_seconds(proc.pid) or 0.0)
        over = allowance.exceeded(cpu, now - t0)
        if over:
            kill_group(proc, grace_s=1.0)
            return "over", cpu, over
        if now >= deadline:
            kill_group(proc, grace_s=3.0)
            return "timeout", cpu, ""
        if cancel is not None and cancel.is_set():
            kill_group(proc, grace_s=1.0)
            return "cancelled", cpu, ""
        time.sleep(max(0.0, min(_METER_INTERVAL, deadline - now)))


def _fresh_dir(path: Path) -> Path:
    """An empty 0700 directory at `path` (whatever was there, a symlink included, removed first)."""
    if path.is_symlink():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700)
    return path


def _private_sources(ws: Workspace, run_dir: Path, sources: Optional[Mapping[str, Optional[bytes]]]) -> dict[str, Path]:
    """Private copies of a commit's files in the run directory, by where the sandbox shows them."""
    pinned_sources: dict[str, Path] = {}
    if sources:
        src_dir = run_dir / "source"
        shutil.rmtree(src_dir, ignore_errors=True)
        for rel, data in sources.items():
            if data is not None:
                dest = src_dir / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(data)
                pinned_sources[str(Path(ws.root) / rel)] = dest
    return pinned_sources


@dataclass
class _Sandboxed:
    ended: str                 # exited | over | timeout | cancelled (_supervise)
    cpu: float                 # CPU seconds of the whole tree, measured outside
    over: str                  # the over-budget message, or ''
    wall: float
    returncode: Optional[int]
    lines: list[str]           # the last lines of its output (stdout and stderr)


def _sandboxed(ws: Workspace, cmd: list[str], env: dict[str, str], run_dir: Path, log_path: Path,
               allowance: Allowance, hard_limit: float, on_progress: Optional[ProgressFn] = None,
               cancel: Optional[threading.Event] = None) -> _Sandboxed:
    """Run the sandboxed `cmd` under the reaper, metered from outside and killed at the allowance or the hard
    limit, its output logged to `log_path` (line-buffered: `tail -f` sees progress) and parsed for progress."""
    memory = sandbox.default_memory_limit()
    t0 = time.monotonic()
    lines: list[str] = []
    with open(log_path, "w", encoding="utf-8", buffering=1) as log:
        reaped = [sys.executable, "-I", "-S", "-c", _REAPER, *cmd]
        proc = subprocess.Popen(sandbox.limited(reaped, memory, gpu=sandbox.gpu_visible(env)), cwd=ws.root, env=env,
                                stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True, bufsize=1)
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
        try:
            ended, cpu, over = _supervise(proc, t0, t0 + hard_limit, allowance, cancel)
        finally:
            # the run may have left children (dataloader workers): the group goes too.
            kill_group_now(proc.pid)
        reader.join(timeout=10)
        (run_dir / "train.pid").unlink(missing_ok=True)
    return _Sandboxed(ended, cpu, over, time.monotonic() - t0, proc.returncode, lines)


def run_training(ws: Workspace, run_dir: Path, seed: int, on_progress: Optional[ProgressFn] = None,
                 python: str = sys.executable, unsafe: Optional[bool] = None,
                 cancel: Optional[threading.Event] = None,
                 sources: Optional[Mapping[str, Optional[bytes]]] = None) -> TrainResult:
    """train.py of `ws.root` on `seed`, sandboxed. `unsafe` (default: the process's opt-out) is passed
    explicitly where the environment is not the human's (an executor's worker). When `cancel` is set
    the sandbox is killed at once (status "cancelled"). `sources` ({path: its bytes}, every file of the
    commit being measured): the sandbox then sees private copies of exactly these as the workspace, not
    the live tree, which the agent may rewrite while the run goes (red team: a swap in mid-run measured
    one version and credited another; a planted prepare.pyc changed what prepare meant)."""
    info = sandbox.require(unsafe)    # SandboxUnavailable unless the human opted out
    run_dir.mkdir(parents=True, exist_ok=True)
    if ws.cfg.target is not None:
        return _run_target(ws, run_dir, seed, on_progress, python, info, cancel, sources)
    # train.py writes only here (the sandbox's one writable dir); the evaluator gets a copy
    scratch = _fresh_dir(run_dir / "scratch")
    model_path = scratch / "model.pt2"
    # train.py sees the training split only (val/test stay in the state directory): a copy of the
    # train view where the workspace's prepare.py looks.
    view = ws.sync_train_view()
    bench = ws.cfg.benchmark
    hard_limit = bench.hard_limit_seconds()   # per budget clock: cpu/steps runs may wait for a busy CPU
    env = clean_env({"LOOPWRIGHT_SEED": str(seed), "LOOPWRIGHT_EXPORT_PATH": str(model_path),
                     "LOOPWRIGHT_RUN_DIR": str(scratch), "PYTHONHASHSEED": str(seed),
                     "TMPDIR": "/tmp", "HOME": os.path.expanduser("~")})
    cmd = sandbox.training_command(ws, [python, "train.py"], view=view, scratch=scratch, env=env, info=info,
                                   sources=_private_sources(ws, run_dir, sources))
    allowance = Allowance.of(bench, budget_clock(bench.clock, env, python))
    sp = _sandboxed(ws, cmd, env, run_dir, run_dir / "train.log", allowance, hard_limit, on_progress, cancel)
    ended, cpu, over, wall, lines = sp.ended, sp.cpu, sp.over, sp.wall, sp.lines
    summary = _parse_summary(lines)
    # the runner's figures, over any train.py printed under these names
    summary["measured_cpu_seconds"] = round(cpu, 3)
    summary["measured_wall_seconds"] = round(wall, 3)
    tail = "\n".join(lines[-30:])

    def result(status: str, code: Optional[int], reason: str, model: Optional[Path] = None,
               over_budget: bool = False) -> TrainResult:
        return TrainResult(status, code, reason, wall, summary, tail, model, sandbox=info.kind, cpu_seconds=cpu,
                           over_budget=over_budget)

    if ended == "cancelled":
        return result("cancelled", None, "cancelled by the driver; the sandbox was killed")
    # measured again after the exit: a burst between two readings counts too
    over = over or (allowance.exceeded(cpu, wall) if ended == "exited" else "")
    if over:
        return result("timeout", None if sp.returncode is None or sp.returncode < 0 else sp.returncode,
                      over, over_budget=True)
    if ended == "timeout":
        return result("timeout", None, f"killed at the hard limit of {hard_limit:.0f} s "
                      f"of wall clock (clock {bench.clock!r}, time budget {bench.time_budget:.0f} s, grace "
                      f"{bench.grace_seconds:.0f} s: see BenchmarkConfig.hard_limit_seconds)")
    if sp.returncode != 0:
        return result("crash", sp.returncode, f"train.py exited with code {sp.returncode}")
    lie = misreported(summary, cpu, wall)
    if lie:
        return result("rejected", 0, lie, over_budget=True)
    loss_nan = any("loss=nan" in ln.lower() or "loss=inf" in ln.lower() for ln in lines[-50:])
    if loss_nan or any(isinstance(v, float) and math.isnan(v) for v in summary.values()):
        return result("crash", 0, "training diverged (NaN/inf loss)")
    if not model_path.is_file() or model_path.is_symlink():
        return result("crash", 0, "train.py finished without exporting a model: it must end with "
                      "prepare.export_model(model)")
    return result("ok", 0, "", model_path)


# ---------------------------------------------------------------------------
# A user's own target ([target] in loopwright.toml, loop/targets.py): the gate and the run in train.py's
# sandbox, the scorer in a fresh private directory of pinned bytes. What the run printed is never a score.

MEASURED_NAME = "measured.json"    # in the run dir, out of the sandbox's reach: what the runner measured
OUTPUT_MAX_BYTES = 64 << 20        # what a run may leave for the evaluator, all files together
OUTPUT_MAX_FILES = 10_000
TARGET_START_SECONDS = 3.0         # the hard wall-clock limit is time_budget + this (sandbox start and teardown)


def _run_target(ws: Workspace, run_dir: Path, seed: int, on_progress: Optional[ProgressFn], python: str,
                info: sandbox.SandboxInfo, cancel: Optional[threading.Event],
                sources: Optional[Mapping[str, Optional[bytes]]]) -> TrainResult:
    from mcp_server.loop import targets

    t = ws.cfg.target
    assert t is not None
    (run_dir / MEASURED_NAME).unlink(missing_ok=True)
    private = _private_sources(ws, run_dir, sources)
    view = _fresh_dir(run_dir / "view")      # a target has no training split: train.py's data mount stays empty
    hard_limit = t.time_budget * BUDGET_TOLERANCE + TARGET_START_SECONDS
    unlimited = Allowance("wall", t.time_budget, None, None)   # the hard limit is the budget

    def stage(name: str, command: str, out_dir: Path, log: Path) -> tuple[_Sandboxed, dict[str, str]]:
        env = clean_env({"LOOPWRIGHT_SEED": str(seed), "LOOPWRIGHT_OUTPUT": str(out_dir), "PYTHONHASHSEED": str(seed),
                         "TMPDIR": "/tmp", "HOME": os.path.expanduser("~")})
        cmd = sandbox.training_command(ws, targets.argv(command, python), view=view, scratch=out_dir, env=env,
                                       info=info, sources=private)
        return _sandboxed(ws, cmd, env, run_dir, log, unlimited, hard_limit, on_progress, cancel), env

    def ended_badly(sp: _Sandboxed, what: str) -> Optional[TrainResult]:
        tail = "\n".join(sp.lines[-30:])
        res = functools.partial(TrainResult, wall_seconds=sp.wall, log_tail=tail, sandbox=info.kind,
                                cpu_seconds=sp.cpu)
        if sp.ended == "cancelled":
            return res("cancelled", None, "cancelled by the driver; the sandbox was killed")
        if sp.ended == "timeout":
            return res("timeout", None, f"{what} was killed at the hard limit of {hard_limit:.0f} s of wall clock "
                       f"([target] time_budget {t.time_budget:g} s, measured outside the sandbox)", over_budget=True)
        if sp.returncode != 0:
            last = next((ln for ln in reversed(sp.lines) if ln.strip()), "")
            return res("crash", sp.returncode, f"{what} exited with code {sp.returncode}" + (f": {last[-300:]}" if last else ""))
        return None

    if t.gate:
        # the gate writes to a folder of its own, removed after: it runs the candidate's code too, and must
        # not leave anything for the run's evaluator
        gate_out = _fresh_dir(run_dir / "gate-output")
        try:
            gate, _ = stage("gate", t.gate, gate_out, run_dir / "gate.log")
        finally:
            shutil.rmtree(gate_out, ignore_errors=True)
        bad = ended_badly(gate, f"the gate `{t.gate}`")
        if bad is not None:
            if bad.status == "crash":
                bad.reason = f"the gate failed: {bad.reason}. Its output is in the log tail"
            return bad
    out_dir = _fresh_dir(run_dir / "scratch")
    sp, _ = stage("run", t.run, out_dir, run_dir / "train.log")
    summary = {"measured_cpu_seconds": round(sp.cpu, 3), "measured_wall_seconds": round(sp.wall, 3)}
    (run_dir / MEASURED_NAME).write_text(json.dumps({"seed": seed, "exit_code": sp.returncode,
                                                     "cpu_seconds": round(sp.cpu, 4), "wall_seconds": round(sp.wall, 4)}))
    bad = ended_badly(sp, f"the run `{t.run}`")
    if bad is not None:
        bad.summary = summary
        return bad
    return TrainResult("ok", 0, "", sp.wall, summary, "\n".join(sp.lines[-30:]), out_dir, sandbox=info.kind,
                       cpu_seconds=sp.cpu)


def _copy_output(src: Path, dest: Path) -> str:
    """Copy what the run left (plain files only) into the evaluator's box; a digest of it all."""
    h = hashlib.sha256()
    total = count = 0
    dest.mkdir(mode=0o700)
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d)))
        for name in sorted(filenames):
            rel = Path(dirpath, name).relative_to(src)
            count += 1
            if count > OUTPUT_MAX_FILES:
                raise sandbox.UnsafeFile(f"the run left more than {OUTPUT_MAX_FILES} files in LOOPWRIGHT_OUTPUT")
            (dest / rel).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            digest, size = sandbox.copy_regular_file(Path(dirpath, name), dest / rel,
                                                     max_bytes=OUTPUT_MAX_BYTES - total)
            total += size
            h.update(f"{rel.as_posix()}\0{digest}\0".encode())
    return h.hexdigest()


def _evaluate_target(ws: Workspace, pinned: Optional[str], run_dir: Path, output: Path, python: str,
                     info: sandbox.SandboxInfo, files: Optional[dict[str, bytes]]) -> EvalResult:
    from mcp_server.loop import targets

    t = ws.cfg.target
    assert t is not None
    t0 = time.monotonic()
    if files is None:
        if pinned is None:
            raise ValueError("run_evaluation needs the pinned commit or the evaluator's files")
        files = targets.evaluator_files(ws, pinned)
    try:
        measured = json.loads((run_dir / MEASURED_NAME).read_text())
    except (OSError, ValueError):
        return EvalResult(False, "the runner's measurement of this run is missing; run it again")
    base = ws.state_dir / "eval"
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    box = Path(tempfile.mkdtemp(prefix="loopwright-eval-", dir=base))   # never a shared temp dir (red team R11b)
    try:
        for rel, data in files.items():
            parts = Path(rel).parts
            if Path(rel).is_absolute() or ".." in parts or not parts or rel in ("output", MEASURED_NAME):
                raise ValueError(f"bad evaluator file name {rel!r}")
            (box / rel).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            (box / rel).write_bytes(data)
        try:
            digest = _copy_output(output, box / "output")
        except sandbox.UnsafeFile as e:
            return EvalResult(False, f"the run's output was refused: {e}", wall_seconds=time.monotonic() - t0)
        (box / MEASURED_NAME).write_text(json.dumps(measured))
        env = clean_env({"LOOPWRIGHT_OUTPUT": str(box / "output"), "LOOPWRIGHT_RUN": str(box / MEASURED_NAME),
                         "LOOPWRIGHT_SEED": str(measured.get("seed", 0)), "TMPDIR": "/tmp"})
        cmd = sandbox.scorer_command(ws, targets.argv(t.evaluate, python), box=box, info=info)
        timeout = max(60.0, t.time_budget * 4)
        try:
            limited = sandbox.limited(cmd, sandbox.default_memory_limit())
            proc = subprocess.run(limited, cwd=box, env=env, capture_output=True, text=True, errors="replace",
                                  timeout=timeout, start_new_session=True, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return EvalResult(False, f"the evaluator `{t.evaluate}` ran over {timeout:.0f} s",
                              wall_seconds=time.monotonic() - t0, model_sha256=digest)
    finally:
        shutil.rmtree(box, ignore_errors=True)
    elapsed = time.monotonic() - t0
    (run_dir / "eval.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    result = _verdict(proc.stdout, None)
    if not isinstance(result, dict) or "ok" not in result:
        return EvalResult(False, f"the evaluator `{t.evaluate}` printed no result line (exit {proc.returncode}); its "
                          "last stdout line must be JSON such as {\"ok\": true, \"metric\": 1.5}. "
                          f"stderr: {proc.stderr.strip()[-400:]}", wall_seconds=elapsed, model_sha256=digest)
    if proc.returncode != 0:
        return EvalResult(False, f"the evaluator exited with code {proc.returncode}: not trusted; "
                          f"{proc.stderr.strip()[-300:]}", wall_seconds=elapsed, model_sha256=digest)
    result["output_sha256"] = digest
    (run_dir / "eval.json").write_text(json.dumps(result, indent=2))
    if result.get("ok") is not True:
        return EvalResult(False, str(result.get("reason", "rejected by the evaluator")), raw=result,
                          wall_seconds=elapsed, model_sha256=digest)
    value = result.get("metric")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return EvalResult(False, f"the evaluator's metric is {value!r}, not a finite number", raw=result,
                          wall_seconds=elapsed, model_sha256=digest)
    # the loop minimises: a maximised metric is stored negated (targets.shown turns it back)
    return EvalResult(True, "", float(value) * t.sign(), None, elapsed, result, elapsed, digest)


EVAL_DATA_FILES = ("val.bin", "test.bin", "meta.json", "token_bytes.npy", "tokenizer.json")


def run_evaluation(ws: Workspace, pinned: Optional[str], run_dir: Path, model_path: Path,
                   python: str = sys.executable, files: Optional[dict[str, bytes]] = None,
                   unsafe: Optional[bool] = None, reuse: bool = True) -> EvalResult:
    """The pinned evaluator on the model. Its files come from the pinned commit's git objects, or, on an
    executor's worker (no git there), by content in `files` (prepare.py, its siblings where the pinned
    commit has them, and loopwright.toml: workspace.pinned_evaluator). reuse: by the workspace's
    evaluator server where it can (loop/evalserver.py: it imports torch once and forks a fresh evaluator
    per model); False, or where no server can serve: a one-shot evaluator process (an executor's working
    copy, whose state dir lives for one run, passes False)."""
    info = sandbox.require(unsafe)
    if ws.cfg.target is not None:
        return _evaluate_target(ws, pinned, run_dir, model_path, python, info, files)
    if files is None:
        if pinned is None:
            raise ValueError("run_evaluation needs the pinned commit or the evaluator's files")
        files = pinned_evaluator(ws.root, pinned)
    t0 = time.monotonic()
    timeout = ws.cfg.benchmark.eval_timeout
    # the verdict line must carry a nonce the model cannot know (an older pinned prepare.py has no
    # --nonce: then only its exit code and its last line are trusted)
    nonce = secrets.token_hex(16) if b"--nonce" in files["prepare.py"] else None
    try:
        run = evalserver.evaluate(ws, files, model_path, nonce, python=python, info=info, env=clean_env({}),
                                  data_files=EVAL_DATA_FILES, timeout=timeout) if reuse else None
        if run is None:
            run = _evaluate_once(ws, files, model_path, nonce, python, info, timeout)
    except sandbox.UnsafeFile as e:
        return EvalResult(False, str(e), wall_seconds=time.monotonic() - t0)
    elapsed = time.monotonic() - t0
    digest = run.model_sha256
    if run.returncode is None:
        return EvalResult(False, f"evaluation exceeded {timeout:.0f} s", wall_seconds=elapsed, model_sha256=digest)
    (run_dir / "eval.log").write_text(run.stdout + "\n--- stderr ---\n" + run.stderr)
    if run.returncode == sandbox.EVALUATOR_CHANGED_EXIT:
        return EvalResult(False, "an evaluator file changed on disk before it ran (its bytes are not the "
                          f"pinned blob's): not scored. {run.stderr.strip()[-300:]}", wall_seconds=elapsed,
                          model_sha256=digest)
    result = _verdict(run.stdout, nonce)
    if not isinstance(result, dict):
        return EvalResult(False, f"evaluator crashed (exit {run.returncode}): {run.stderr.strip()[-600:]}",
                          wall_seconds=elapsed, model_sha256=digest)
    if result.get("ok") and run.returncode != 0:
        # a model that prints a verdict and then crashes the evaluator (red team, 2026-12-01)
        return EvalResult(False, f"evaluator exited with code {run.returncode} after a result line: not trusted; "
                          f"{run.stderr.strip()[-300:]}", wall_seconds=elapsed, model_sha256=digest)
    result.pop("nonce", None)
    result["model_sha256"] = digest
    (run_dir / "eval.json").write_text(json.dumps(result, indent=2))
    if not result.get("ok"):
        return EvalResult(False, str(result.get("reason", "rejected by the evaluator")), raw=result,
                          wall_seconds=elapsed, model_sha256=digest)
    return EvalResult(True, "", float(result["val_bpb"]), _opt(result.get("test_bpb")),
                      float(result.get("eval_seconds", elapsed)), result, elapsed, digest)


def _evaluate_once(ws: Workspace, files: dict[str, bytes], model_path: Path, nonce: Optional[str], python: str,
                   info: sandbox.SandboxInfo, timeout: float) -> evalserver.EvalRun:
    """A fresh evaluator process for one model: a 0700 eval dir in the state dir with the pinned files and a
    hashed private copy of the model, the hash-checking bootstrap, the evaluation sandbox."""
    pinned_sha = hashlib.sha256(files["prepare.py"]).hexdigest()
    siblings = {name: hashlib.sha256(files[name]).hexdigest() for name in EVALUATOR_SIBLINGS
                if name in files}
    # in the state dir (0700, denied to the client sandboxes), never the shared temp dir (red team R11b)
    box = sandbox.make_eval_dir(files, model_path, base=ws.state_dir / "eval")
    try:
        data_dir = box.path / "data" if info.available else ws.data_dir
        argv = ["evaluate", str(box.model), "--data-dir", str(data_dir)] + (["--nonce", nonce] if nonce else [])
        code = sandbox.eval_bootstrap(box.prepare, argv, sandbox.site_dirs(), pinned_sha,
                                      {str(box.path / n): digest for n, digest in siblings.items()})
        cmd = sandbox.evaluation_command(ws, [python, "-I", "-S", "-c", code], eval_dir=box,
                                         data_dir=ws.data_dir, data_files=EVAL_DATA_FILES, info=info)
        try:
            limited = sandbox.limited(cmd, sandbox.default_memory_limit())
            proc = subprocess.run(limited, cwd=box.path, env=clean_env({}), capture_output=True, text=True,
                                  errors="replace", timeout=timeout, start_new_session=True)
        except subprocess.TimeoutExpired:
            return evalserver.EvalRun(None, "", "", box.model_sha256)
    finally:
        box.cleanup()
    return evalserver.EvalRun(proc.returncode, proc.stdout, proc.stderr, box.model_sha256)


def _verdict(stdout: str, nonce: Optional[str]) -> Optional[dict]:
    """The evaluator's result: the JSON line carrying `nonce`; without one (an older pinned evaluator),
    the last non-empty line. Anything else on stdout may come from the model's graph."""
    lines = [ln for ln in stdout.strip().splitlines() if ln.strip()]
    for line in reversed(lines if nonce else lines[-1:]):
        try:
            result = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(result, dict) and (nonce is None or result.get("nonce") == nonce):
            return result
    return None


def _opt(v) -> Optional[float]:
    return None if v is None else float(v)
