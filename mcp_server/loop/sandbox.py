"""The OS boundary around code the loop runs: train.py and the frozen evaluator.

Linux: bubblewrap (`bwrap`, Debian/Ubuntu package `bubblewrap`). The sandbox gets
its own PID namespace (every descendant, double-forked daemons included, dies
with the run), no network, no IPC or UTS sharing, a new session (no terminal
injection), `/` read-only, a private /tmp, /run and $HOME (empty tmpfs), the
workspace read-only, the loop's state directory invisible except the files that
process may read, and one writable scratch directory.

What is hidden from agent-written code is ONE list, hidden_paths(): every state home's state, the
worker's data cache and working copies, every corpus given as a PATH, the workspace's .git and
.loopwright; train.py, the evaluator (a model's graph runs in it) and mechanisms all get it.

Mounts are built in this order (bwrap applies them in order, a later mount
shadows an earlier one):
  1. `/` read-only, a fresh /dev and /proc;
  2. tmpfs over every masked path (/tmp, /var/tmp, /run, /home, $HOME, /root,
     /mnt, /media, the state dir, the workspace);
  3. read-only binds back of what must be seen: the Python installation (when
     it lives under a masked path, e.g. ~/.pyenv), each top-level entry of the
     workspace except the state dir (a symlink is recreated as a symlink, so it
     resolves inside the sandbox, never to a hidden file), the data files;
  4. the writable scratch directory.

macOS: `sandbox-exec` with a profile that denies network and writes outside the
scratch dir and the temp dir, and reads of the state dir (less strict than
bubblewrap: no PID namespace; not exercised by CI).

Limits from outside: RLIMIT_AS (address space) set in the child before exec
(not under a visible GPU: CUDA reserves far more address space than it uses),
RLIMIT_CORE 0; the wall clock is the runner's (it kills bwrap at the hard limit;
`--die-with-parent` and the PID namespace take every descendant with it).

Where no sandbox can be made the loop refuses to run unless the human passed
`--unsafe-no-sandbox` (or set LOOPWRIGHT_UNSAFE_NO_SANDBOX=1), which is warned
about loudly and recorded with every experiment.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal, Mapping, Optional, Sequence

UNSAFE_ENV = "LOOPWRIGHT_UNSAFE_NO_SANDBOX"
MAX_MODEL_BYTES = 64 << 30   # a model file bigger than this is refused (disk-filling attack)

UNSAFE_WARNING = (
    "WARNING: --unsafe-no-sandbox: train.py and the evaluator run WITHOUT an OS sandbox. Code the agent "
    "wrote can read the hidden validation/test data, rewrite the ledger, leave processes behind and use "
    "the network; a kept result is not trustworthy. Every experiment of this run is marked sandbox=none.")

INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: `sudo apt-get install bubblewrap`; Fedora: `sudo dnf install "
    "bubblewrap`; Arch: `sudo pacman -S bubblewrap`) and make sure unprivileged user namespaces are enabled "
    "(`sysctl kernel.unprivileged_userns_clone=1`; Ubuntu 24.04+: `sysctl "
    "kernel.apparmor_restrict_unprivileged_userns=0` or an AppArmor profile for bwrap); in a container, "
    "run it with user namespaces allowed (e.g. docker --security-opt seccomp=unconfined). "
    "Only if you accept that agent-written code can forge results, pass --unsafe-no-sandbox "
    f"(or set {UNSAFE_ENV}=1).")


class SandboxUnavailable(RuntimeError):
    """No OS sandbox can be made here; the message says how to get one (or how to opt out)."""


class UnsafeFile(RuntimeError):
    """A file handed over by sandboxed code is not a plain file (FIFO, symlink, device, too big)."""


Kind = Literal["bwrap", "sandbox-exec", "none"]


@dataclass(frozen=True)
class SandboxInfo:
    kind: Kind
    executable: Optional[str]
    detail: str          # one line for `doctor` and error messages
    tmpfs_size: bool = False   # bwrap understands --size (0.7+): the private tmpfs mounts get a cap
    cap_drop: bool = False     # bwrap understands --cap-drop: run as root, the sandbox keeps no capability

    @property
    def available(self) -> bool:
        return self.kind != "none"


_CACHE: dict[str, SandboxInfo] = {}


def _probe_bwrap(path: str) -> Optional[str]:
    """None if bwrap can make the namespaces we use, else why not (its stderr)."""
    try:
        proc = subprocess.run([path, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                               "--die-with-parent", "--new-session", "--ro-bind", "/", "/", "--dev", "/dev",
                               "--proc", "/proc", "--tmpfs", "/tmp", "true"],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None if proc.returncode == 0 else (proc.stderr.strip() or f"exit {proc.returncode}")


def _help(path: str) -> str:
    try:
        out = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout + out.stderr


def tmpfs_cap() -> int:
    """Bytes each private tmpfs may hold (its pages are RAM, not counted by RLIMIT_AS): a quarter of
    the RAM, between 1 and 16 GiB."""
    total = default_memory_limit() or (8 << 30)
    return int(min(max(total // 4, 1 << 30), 16 << 30))


def detect(refresh: bool = False) -> SandboxInfo:
    """What sandbox this machine can make (cached per process)."""
    if not refresh and "info" in _CACHE:
        return _CACHE["info"]
    if sys.platform.startswith("linux"):
        exe = shutil.which("bwrap")
        if exe is None:
            info = SandboxInfo("none", None, "bubblewrap (bwrap) is not installed")
        else:
            err = _probe_bwrap(exe)
            usage = _help(exe) if err is None else ""
            info = (SandboxInfo("bwrap", exe, f"bubblewrap {exe}: PID/network/IPC namespaces, read-only system",
                                tmpfs_size="--size" in usage, cap_drop="--cap-drop" in usage)
                    if err is None else
                    SandboxInfo("none", exe, f"bubblewrap is installed but cannot create namespaces here: {err}"))
    elif sys.platform == "darwin":
        exe = shutil.which("sandbox-exec") or ("/usr/bin/sandbox-exec" if os.path.exists("/usr/bin/sandbox-exec")
                                               else None)
        info = (SandboxInfo("sandbox-exec", exe, f"macOS sandbox-exec {exe}: no network, writes only to scratch")
                if exe else SandboxInfo("none", None, "sandbox-exec not found"))
    else:
        info = SandboxInfo("none", None, f"no sandbox support on {sys.platform}")
    _CACHE["info"] = info
    return info


def unsafe_requested() -> bool:
    return os.environ.get(UNSAFE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def allow_unsafe(stream=None) -> None:
    """The human's explicit opt-out (CLI --unsafe-no-sandbox): set for this process and its children
    (a `run` starts agents whose MCP server runs the experiments), and say it loudly."""
    os.environ[UNSAFE_ENV] = "1"
    print(UNSAFE_WARNING, file=stream or sys.stderr, flush=True)


def require(unsafe: Optional[bool] = None) -> SandboxInfo:
    """The sandbox to use, or SandboxUnavailable. With the opt-out, a 'none' info when none exists
    (a real sandbox is still used when one is available: the opt-out only permits running without)."""
    info = detect()
    if info.available:
        return info
    if unsafe if unsafe is not None else unsafe_requested():
        return info
    raise SandboxUnavailable(f"cannot sandbox train.py and the evaluator: {info.detail}. To fix: {INSTALL_HINT}")


def mode_line(unsafe: Optional[bool] = None) -> tuple[bool, str]:
    """(ok, one line) for `loopwright doctor`."""
    info = detect()
    if info.available:
        return True, f"sandbox: {info.detail}"
    if unsafe if unsafe is not None else unsafe_requested():
        return False, f"sandbox: NONE ({info.detail}); running UNSAFE because {UNSAFE_ENV}=1 / --unsafe-no-sandbox"
    return False, f"sandbox: unavailable ({info.detail}); experiments are refused"


# ---------------------------------------------------------------------------
# Paths

def _real(p: os.PathLike | str) -> str:
    return os.path.realpath(os.fspath(p))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def python_paths() -> list[str]:
    """Directories the Python interpreter and its libraries live in (re-exposed read-only when they
    sit under a masked path such as ~/.pyenv or /tmp/venv)."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(_real(sys.executable))}
    paths.update(v for k, v in sysconfig.get_paths().items() if k not in ("include", "platinclude", "scripts"))
    paths.update(site_dirs())
    real = sorted({_real(p) for p in paths if p and os.path.exists(p)})
    return [p for p in real if not any(_under(p, q) and p != q for q in real)]   # outermost only


def site_dirs() -> list[str]:
    """site-packages directories the evaluator needs (torch, numpy and their dependencies)."""
    import importlib.util

    paths = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    for mod in ("torch", "numpy"):
        try:
            spec = importlib.util.find_spec(mod)
        except (ImportError, ValueError):
            spec = None
        if spec and spec.origin:
            paths.append(str(Path(spec.origin).parent.parent))
    out: list[str] = []
    for p in paths:
        if p not in out and os.path.isdir(p):
            out.append(p)
    return out


def default_masks(home: Optional[str] = None) -> list[str]:
    """Host paths nobody in the sandbox needs: temp dirs (this process's too: a node-local scratch
    TMPDIR on a cluster), runtime sockets (ssh-agent, docker, dbus are Unix sockets, reachable without
    a network), every home directory."""
    home = home or os.path.expanduser("~")
    out = []
    temps = (tempfile.gettempdir(), os.environ.get("TMPDIR", ""))
    for p in ("/tmp", "/var/tmp", "/run", "/var/run", "/home", "/root", "/mnt", "/media", home, *temps):
        if p and os.path.isdir(p) and not os.path.islink(p):
            rp = _real(p)
            if rp != "/" and rp not in out:
                out.append(rp)
    return out


def gpu_devices() -> list[str]:
    return sorted(p for p in glob.glob("/dev/nvidia*") + glob.glob("/dev/dri") + glob.glob("/dev/kfd")
                  if os.path.exists(p))


def gpu_visible(env: Mapping[str, str]) -> bool:
    if not gpu_devices():
        return False
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        if var in env and env[var].strip() in ("", "-1"):
            return False
    return True


# ---------------------------------------------------------------------------
# Commands

def build_command(argv: Sequence[str], *, mode: Literal["train", "eval"] = "train",  # noqa: C901 - one flag list
                  ro_binds: Iterable[os.PathLike | str] = (),
                  rw_binds: Iterable[os.PathLike | str] = (),
                  scratch: Optional[os.PathLike | str] = None,
                  files: Mapping[str, os.PathLike | str] | Iterable[tuple[str, str]] = (),
                  workspace: Optional[os.PathLike | str] = None,
                  hide: Iterable[os.PathLike | str] = (),
                  env: Optional[Mapping[str, str]] = None,
                  cwd: Optional[os.PathLike | str] = None,
                  info: Optional[SandboxInfo] = None,
                  workspace_entries: bool = True) -> list[str]:
    """The sandboxed command line for `argv`.

    workspace: exposed read-only, entry by entry, except the entries in `hide` below it (the state
        dir when it lives there); `hide` paths elsewhere are masked with an empty tmpfs (a
        file: with an empty file). workspace_entries=False: the workspace is an empty tmpfs (what
        should be there comes in `files`), a Python installation inside it excepted.
    ro_binds / rw_binds: directories exposed read-only / writable at the same path.
    scratch: the writable directory (created on the host if missing).
    files: {destination in the sandbox: host source} bound read-only (e.g. train.bin where
        prepare.py looks for it); the source must be a regular file.
    mode: "train" may see GPUs; "eval" runs on the CPU only.
    """
    info = info or require()
    if info.kind == "none":
        return list(argv)
    if info.kind == "sandbox-exec":
        return _sandbox_exec_command(argv, ro_binds, rw_binds, scratch, files, workspace, hide, info)
    assert info.executable
    env = dict(env if env is not None else os.environ)
    home = env.get("HOME") or os.path.expanduser("~")
    hide_real = [_real(h) for h in hide]
    ws_real = _real(workspace) if workspace else None
    masks = default_masks(home) + [h for h in hide_real if os.path.isdir(h)]
    if ws_real:
        masks.append(ws_real)

    # (depth, order, op): parents before children; at equal depth masks before binds.
    ops: list[tuple[int, int, list[str]]] = []

    def depth(p: str) -> int:
        return len(Path(p).parts)

    size = ["--size", str(tmpfs_cap())] if info.tmpfs_size else []
    for m in dict.fromkeys(masks):
        ops.append((depth(m), 0, [*size, "--tmpfs", m]))
    # libraries named by the environment (CUDA under ~/ or /opt, conda) must stay visible
    lib_dirs = [d for var in ("LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH")
                for d in env.get(var, "").split(":") if d and os.path.isdir(d)]
    shown: list[str] = []   # paths below a mask shown again: a hidden file in them must be covered too
    for p in python_paths() + [_real(d) for d in lib_dirs]:
        if any(_under(p, m) for m in masks) and not any(_under(p, h) for h in hide_real) and os.path.exists(p):
            ops.append((depth(p), 1, ["--ro-bind", p, p]))
            shown.append(p)
    for p in (_real(p) for p in ro_binds):    # asked for by name: shown even below a hidden path
        if any(_under(p, m) for m in masks) and os.path.exists(p):
            ops.append((depth(p), 1, ["--ro-bind", p, p]))
            shown.append(p)
    # hidden paths inside the workspace; one that holds the workspace (an executor's working copy lives
    # in a hidden worker dir or state dir) is masked, and the workspace shown again on top of it
    hide_in_ws = [h for h in hide_real if ws_real and _under(h, ws_real) and h != ws_real]
    if ws_real and workspace_entries:
        for entry in sorted(os.listdir(ws_real)):
            src = os.path.join(ws_real, entry)
            if any(_under(h, src) and h != src and os.path.isdir(h) for h in hide_in_ws):
                continue  # a hidden path lies below this entry: expose nothing of it (the state dir)
            if any(_under(src, h) for h in hide_in_ws):
                continue
            if os.path.islink(src):
                ops.append((depth(src), 1, ["--symlink", os.readlink(src), src]))
            else:
                ops.append((depth(src), 1, ["--ro-bind", src, src]))
    for h in hide_real:   # a hidden file (a corpus file, a held-out stdlib module): an empty file in its place
        if os.path.isfile(h) and (not any(_under(h, m) for m in masks) or any(_under(h, p) for p in shown)):
            ops.append((depth(h), 5, ["--ro-bind", "/dev/null", h]))
    writable = [_real(p) for p in rw_binds]
    if scratch is not None:
        Path(scratch).mkdir(parents=True, exist_ok=True)
        writable.append(_real(scratch))
    for p in writable:
        ops.append((depth(p), 2, ["--bind", p, p]))
    pairs = files.items() if isinstance(files, Mapping) else files
    for dest, origin in pairs:
        src_real = _real(origin)
        if not os.path.isfile(src_real):
            raise FileNotFoundError(f"{origin} (to be shown in the sandbox at {dest}) is not a file")
        ops.append((depth(os.fspath(dest)), 3, ["--ro-bind", src_real, os.path.abspath(os.fspath(dest))]))
    if mode == "train" and gpu_visible(env):
        for dev in gpu_devices():
            ops.append((depth(dev), 4, ["--dev-bind", dev, dev]))

    # no capabilities: bwrap run by root keeps them all, and with CAP_SYS_ADMIN the sandboxed code could
    # unmount the masks over the hidden paths (an unprivileged user's sandbox has none anyway)
    cmd = [info.executable, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
           "--unshare-cgroup-try", "--die-with-parent", "--new-session", *(["--cap-drop", "ALL"] if info.cap_drop else []),
           "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for _, _, op in sorted(ops, key=lambda t: (t[0], t[1])):
        cmd += op
    if cwd is not None:
        cmd += ["--chdir", _real(cwd)]
    return cmd + ["--"] + list(argv)


def _sb_quote(p: str) -> str:
    return '"' + p.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _sandbox_exec_command(argv, ro_binds, rw_binds, scratch, files, workspace, hide, info) -> list[str]:
    """macOS: a Seatbelt profile. Reads are allowed except the hidden paths (with the data files given
    back); writes only to scratch, rw_binds and the temp dirs; no network."""
    hide_real = [_real(h) for h in hide]
    writable = [_real(p) for p in rw_binds] + ([_real(scratch)] if scratch is not None else [])
    if scratch is not None:
        Path(scratch).mkdir(parents=True, exist_ok=True)
    pairs = files.items() if isinstance(files, Mapping) else files
    # no network at all, Unix sockets included (docker.sock, ssh-agent); last matching rule wins
    lines = ["(version 1)", "(allow default)", "(deny network*)",
             "(deny file-write*)",
             '(allow file-write* (subpath "/dev") (subpath "/private/tmp") (subpath "/private/var/folders"))']
    lines += [f"(allow file-write* (subpath {_sb_quote(p)}))" for p in writable]
    lines += [f"(deny file-read* (subpath {_sb_quote(h)}))" for h in hide_real]
    ws_real = _real(workspace) if workspace else None
    if ws_real and any(_under(ws_real, h) for h in hide_real):
        # a working copy inside a hidden dir: readable again, its own hidden parts denied after that
        lines.append(f"(allow file-read* (subpath {_sb_quote(ws_real)}))")
        lines += [f"(deny file-read* (subpath {_sb_quote(h)}))" for h in hide_real
                  if _under(h, ws_real) and h != ws_real]
    # no bind mounts here: train.py reads the copy of the train view the runner mirrors where prepare.py
    # looks (the destinations), which lies under a hidden path
    pairs = list(pairs)
    lines += [f"(allow file-read* (subpath {_sb_quote(_real(os.path.dirname(os.path.abspath(os.fspath(d)))))}))"
              for d in dict.fromkeys(os.fspath(d) for d, _ in pairs)]
    return [info.executable, "-p", "\n".join(lines), "--"] + list(argv)


# Limits are set by a small exec wrapper, not a Popen preexec_fn: with a preexec_fn CPython fork()s, and the
# child runs every pthread_atfork handler of the parent (under Ray, gRPC's aborted a gate's process); without
# one it vfork()s and runs none. The wrapper exec()s the command, so its pid is the command's.
_LIMITS_EXEC = """\
import os, resource, sys
for spec in filter(None, sys.argv[1].split(",")):
    name, soft, hard = spec.split(":")
    resource.setrlimit(getattr(resource, "RLIMIT_" + name), (int(soft), int(hard)))
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as e:
    sys.stderr.write("loopwright: cannot run %s: %s\\n" % (sys.argv[2], e))
    os._exit(127)
"""


def limited(cmd: Sequence[str], memory_bytes: Optional[int], gpu: bool = False,
            **extra: tuple[int, int]) -> list[str]:
    """`cmd` under address-space, core-dump and file-size limits, inherited by bwrap and everything in it.
    No RLIMIT_AS when a GPU is visible (CUDA maps far more virtual memory than it uses). `extra` adds or
    replaces limits by resource name: CPU=(soft, hard), NOFILE=(32, 32), ..."""
    specs: dict[str, tuple[int, int]] = {
        "CORE": (0, 0),
        # no single file bigger than the biggest model we accept (disk-filling from the scratch dir)
        "FSIZE": (MAX_MODEL_BYTES, MAX_MODEL_BYTES),
    }
    if memory_bytes and not gpu:
        specs["AS"] = (memory_bytes, memory_bytes)
    specs.update(extra)
    spec = ",".join(f"{name}:{soft}:{hard}" for name, (soft, hard) in specs.items())
    return [sys.executable, "-I", "-S", "-c", _LIMITS_EXEC, spec, *cmd]


def default_memory_limit() -> Optional[int]:
    """Physical memory + swap: a run may use the machine, but a runaway cannot push it into the OOM
    killer's hands for the loop itself (its own allocations fail first)."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        kib = int(fields["MemTotal"].split()[0]) + int(fields.get("SwapTotal", "0 kB").split()[0])
        return max(kib * 1024, 4 << 30)
    except (OSError, KeyError, ValueError):
        return None


# ---------------------------------------------------------------------------
# The evaluator's private directory

@dataclass
class EvalDir:
    path: Path
    prepare: Path
    model: Path
    model_sha256: str
    model_bytes: int

    def cleanup(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def copy_regular_file(src: os.PathLike | str, dest: os.PathLike | str, max_bytes: int = MAX_MODEL_BYTES) -> tuple[str, int]:
    """Copy a plain file written by sandboxed code; return (sha256, size).

    Refuses a symlink (O_NOFOLLOW), a FIFO or device (fstat after an O_NONBLOCK open, which never
    blocks on a FIFO without a writer) and files over max_bytes. Copying the bytes out means the
    evaluator reads a file nobody else can change while it scores."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(src, flags)
    except OSError as e:
        if os.path.islink(src):
            raise UnsafeFile(f"{src} is a symbolic link; the model must be a plain file written by "
                             "prepare.export_model") from None
        raise UnsafeFile(f"cannot open {src}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "FIFO" if stat.S_ISFIFO(st.st_mode) else "socket" if stat.S_ISSOCK(st.st_mode) else \
                "device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "directory" \
                if stat.S_ISDIR(st.st_mode) else "special file"
            raise UnsafeFile(f"{src} is a {kind}, not a plain file; the model must be written by "
                             "prepare.export_model")
        if st.st_size > max_bytes:
            raise UnsafeFile(f"{src} is {st.st_size} bytes, over the {max_bytes}-byte limit for a model")
        h = hashlib.sha256()
        total = 0
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                total += len(chunk)
                if total > max_bytes:
                    raise UnsafeFile(f"{src} grew past the {max_bytes}-byte limit while being copied")
                h.update(chunk)
                os.write(out, chunk)
        finally:
            os.close(out)
        return h.hexdigest(), total
    finally:
        os.close(fd)


def evaluator_dir(files: Mapping[str, bytes], base: os.PathLike | str, prefix: str = "loopwright-eval-") -> Path:
    """A fresh 0700 directory inside `base` (the state dir's eval/: never a shared temp dir, where any
    process of the agent's user can swap the pinned prepare.py -- red team R11b) holding the pinned
    evaluator files and an empty data/ (the mount point for the data files). `files` maps names
    (prepare.py, its siblings evaluate.py and pt2audit.py, loopwright.toml) to their pinned bytes."""
    base = Path(base)
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(base, 0o700)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    os.chmod(path, 0o700)
    try:
        for name, data in files.items():
            if "/" in name or name.startswith("."):
                raise ValueError(f"bad evaluator file name {name!r}")
            fd = os.open(path / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        (path / "data").mkdir(mode=0o700)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path


def make_eval_dir(files: Mapping[str, bytes], model_src: os.PathLike | str, base: os.PathLike | str) -> EvalDir:
    """evaluator_dir() plus a hashed private copy of the model (model.pt2): one evaluation's directory."""
    path = evaluator_dir(files, base)
    try:
        model = path / "model.pt2"
        digest, size = copy_regular_file(model_src, model)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return EvalDir(path, path / "prepare.py", model, digest, size)


EVALUATOR_CHANGED_EXIT = 86   # the bootstrap's exit code when an evaluator file is not the pinned bytes


def pinned_sources_code(files: Mapping[str, str], site: Sequence[str]) -> str:
    """The start of every evaluator bootstrap (for `python -I -S -c`): the interpreter's own library dirs
    first, the site-packages dirs (torch, numpy) appended LAST, no .pth processing (-S), no cwd/script
    dir/PYTHONPATH/user site (-I): a json.py or .pth planted in site-packages cannot shadow the stdlib or
    run at start-up. Each of `files` ({path: sha256}) is read once and its bytes checked against the
    pinned digest, before anything runs; a mismatch exits EVALUATOR_CHANGED_EXIT. Leaves the checked
    bytes in `srcs` ({path: bytes}): what runs is exactly what was pinned, whoever could write the files
    meanwhile."""
    return ("import sys\n"
            "sys.path[:] = [p for p in sys.path if p and p != '.'] + "
            f"[p for p in {list(site)!r} if p not in sys.path]\n"
            "import hashlib, types\n"
            "srcs = {}\n"
            f"for path, want in {dict(files)!r}.items():\n"
            "    src = open(path, 'rb').read()\n"
            "    got = hashlib.sha256(src).hexdigest()\n"
            "    if got != want:\n"
            "        sys.stderr.write('the evaluator file ' + path + ' is not the pinned ' + path.rsplit('/', 1)[-1]"
            " + ' (sha256 ' + got + '): refused\\n')\n"
            f"        sys.exit({EVALUATOR_CHANGED_EXIT})\n"
            "    srcs[path] = src\n")


def eval_bootstrap(script: os.PathLike | str, argv: Sequence[str], site: Sequence[str], sha256: str,
                   siblings: Optional[Mapping[str, str]] = None) -> str:
    """Code for `python -I -S -c`: pinned_sources_code() for the script and its `siblings` ({path:
    sha256}: evaluate.py, pt2audit.py), then the script's checked bytes run as __main__ with `argv`; the
    siblings' bytes are handed to it as _PINNED_SOURCES ({module name: bytes}; prepare.sibling loads
    nothing else, not from disk)."""
    main = os.fspath(script)
    files = {main: sha256, **{os.fspath(p): digest for p, digest in (siblings or {}).items()}}
    return (pinned_sources_code(files, site) +
            f"path = {main!r}\n"
            f"sys.argv = {[main, *argv]!r}\n"
            "m = types.ModuleType('__main__'); m.__file__ = path; m.__builtins__ = __builtins__\n"
            "m._PINNED_SOURCES = {p.rsplit('/', 1)[-1][:-3]: s for p, s in srcs.items() if p != path}\n"
            "sys.modules['__main__'] = m\n"
            "exec(compile(srcs[path], path, 'exec'), m.__dict__)\n")


# ---------------------------------------------------------------------------
# The two sandboxes the runner makes

def _prepare_data_mount(ws) -> Path:
    """Where the workspace's prepare.py looks for data (DATA_DIR = <its dir>/.loopwright/data)."""
    return Path(ws.workspace_data_dir)


PUBLIC_CORPUS_NOTE = (
    "the stdlib corpus is for trying loopwright: its val/test text is the Python standard library, which every "
    "Python on this machine can read, so a train.py could rebuild the held-out splits and memorise them. Keeps "
    "on it are no proof against an agent you do not trust; for those campaigns use a corpus train.py cannot "
    "read (the default `--corpus stdlib-hidden`, `--corpus tinystories`, or `--corpus PATH` with your own text: "
    "hidden from train.py's sandbox)")

# The default corpus: its val/test are these standard-library modules (= bench/gpt/prepare.py's HELDOUT_STDLIB,
# which cannot import this; tests/bench/test_hidden_corpus.py checks they agree), hidden from agent code in every
# Python installation heldout_stdlib_paths() finds. Training, numpy, torch and prepare.py import none of them.
HELDOUT_CORPUS = "stdlib-hidden"
HELDOUT_STDLIB = ("xmlrpc", "wsgiref", "curses", "dbm", "mailbox", "imaplib", "smtplib", "ftplib", "poplib",
                  "nntplib", "telnetlib")


def corpus_is_public(corpus: str) -> bool:
    return corpus == "stdlib"


def stdlib_roots() -> list[Path]:
    """The standard libraries on this machine that a train.py could read: this interpreter's, and those of
    other Pythons at the usual places (the system's, /usr/local, pyenv siblings, conda). Another copy
    elsewhere (a source tree, a package cache) is not found: see the README's threat model."""
    prefixes = {sys.base_prefix, sys.prefix, "/usr", "/usr/local", "/opt/homebrew", "/opt/*", "/opt/*/envs/*",
                os.path.join(os.path.dirname(sys.base_prefix), "*")}
    found = {sysconfig.get_paths()["stdlib"]}
    for pre in prefixes:
        for lib in ("lib", "lib64"):
            found.update(glob.glob(os.path.join(pre, lib, "python3*")))
    out: list[Path] = []
    for d in sorted(found):
        real = Path(_real(d))
        if (real / "os.py").is_file() and real not in out:
            out.append(real)
    return out


def heldout_stdlib_paths() -> list[Path]:
    """What hides stdlib-hidden's val/test text: each held-out package (folder) or module (.py, and its
    compiled caches, which hold its strings) in every standard library stdlib_roots() finds."""
    out: list[Path] = []
    for root in stdlib_roots():
        for name in HELDOUT_STDLIB:
            if (root / name).is_dir():
                out.append(root / name)
            if (root / f"{name}.py").is_file():
                out.append(root / f"{name}.py")
            out += sorted(Path(p) for p in glob.glob(os.path.join(root, "__pycache__", f"{name}.*.pyc")))
    return out


def agent_private_paths(corpus: str, root: Optional[os.PathLike | str] = None) -> list[str]:
    """What the agent's own shell (the clients' sandboxes) must not read besides the state dirs: the corpus the
    splits are cut from when it is on disk -- a PATH, or stdlib-hidden's held-out modules, which the agent could
    otherwise paste into train.py as its training text (the named downloads live in the hidden state)."""
    return [str(p) for p in _corpus_paths(corpus, root)]


def worker_root() -> Path:
    """A worker's private directory (Ray executor): its data cache (data/<sha256>) and the runs' working
    copies (work/). Under the state home, never a temp dir (a node-local scratch TMPDIR sits outside the
    default masks: red team C1); hidden from all agent code by hidden_paths, and beside the state dirs
    (workspaces/), which the generated client sandbox configs deny to the agent's shell as a whole."""
    from mcp_server.loop.workspace import state_home

    return state_home() / "workspaces" / ".worker"


def _corpus_paths(corpus: str, root: Optional[os.PathLike | str] = None) -> list[Path]:
    from mcp_server.loop.config import NAMED_CORPORA

    if corpus == HELDOUT_CORPUS:
        return heldout_stdlib_paths()
    if not corpus or corpus in NAMED_CORPORA:
        return []
    path = Path(corpus).expanduser()
    if not path.is_absolute() and root is not None:
        path = Path(root) / path
    return [path] + ([path.resolve()] if path.resolve() != path.absolute() else [])


def corpus_sources(ws) -> list[Path]:
    """The workspace's corpus on disk when it is a PATH, or stdlib-hidden's held-out modules (the other named
    ones are downloaded into the hidden state dir, except stdlib, which no sandbox that runs Python can hide:
    see docs/security.md)."""
    return _corpus_paths(ws.cfg.benchmark.corpus, ws.root)


def registered_corpora() -> list[Path]:
    """The PATH corpus of every workspace whose state lives in the state home (another workspace's corpus
    holds the same kind of held-out text as this one's)."""
    from mcp_server.loop import config as cfgmod
    from mcp_server.loop.workspace import RECORD_NAME, state_home

    out: list[Path] = []
    seen: set[tuple[str, str]] = set()
    for rec in sorted((state_home() / "workspaces").glob(f"*/{RECORD_NAME}")):
        try:
            root = json.loads(rec.read_text()).get("root")
            corpus = str(cfgmod.load_config(root).benchmark.corpus or "") if root else ""
        except Exception:  # noqa: BLE001 - a broken or moved workspace: it has no corpus we can name
            continue
        # a named corpus once (stdlib-hidden's held-out modules: ~270 paths, the same for every workspace)
        key = (corpus, "" if corpus in cfgmod.NAMED_CORPORA else str(root))
        if key not in seen:
            seen.add(key)
            out += _corpus_paths(corpus, root)
    return out


def hidden_paths(ws=None) -> list[Path]:
    """THE list of what no agent-written code may read, for every kind of it (train.py, a mechanism,
    the evaluator running a model's graph, anything later) on every executor: every state home's state
    (each workspace's ledger, val/test, pins), the worker's data cache and working copies, every corpus
    given as a PATH, and this workspace's own state dir (an executor's working copy keeps one beside its
    ws/), its .loopwright/ and .git. bubblewrap masks each of them (the default masks -- temp dirs,
    homes, sockets -- come on top); a path holding the workspace is masked and the workspace shown again."""
    from mcp_server.loop.workspace import state_home

    paths = [state_home(), worker_root(), *registered_corpora()]
    if ws is not None:
        paths += [Path(ws.state_dir), Path(ws.state_dir).parent, Path(ws.root) / ".loopwright",
                  Path(ws.root) / ".git", *corpus_sources(ws)]
    return list(dict.fromkeys(Path(p) for p in paths))   # each once, in order


def python_inside(root: os.PathLike | str) -> Optional[str]:
    """A directory of this Python installation (interpreter, stdlib, site-packages) inside `root`, if any."""
    r = _real(root)
    return next((p for p in python_paths() if _under(p, r)), None)


def refuse_python_inside(root: os.PathLike | str) -> None:
    p = python_inside(root)
    if p is not None:
        raise SandboxUnavailable(
            f"the Python that runs train.py and the evaluator lives inside the workspace ({p}), where the agent "
            "can write: a sitecustomize.py, a .pth file or a patched torch there would run in every experiment "
            "and in the evaluator. Use a Python (or venv) outside the workspace, e.g. `python -m venv ~/lw-venv`")


def training_command(ws, argv: Sequence[str], *, view: os.PathLike | str, scratch: os.PathLike | str,
                     env: Mapping[str, str], info: Optional[SandboxInfo] = None,
                     sources: Optional[Mapping[str, os.PathLike | str]] = None) -> list[str]:
    """train.py's sandbox: the workspace read-only (its .loopwright/ replaced by the train view's files
    where prepare.py looks), the state directory invisible, `scratch` writable (the export goes there).
    `sources` ({path in the workspace: private copy}): the run's whole tree as committed; then nothing
    else of the workspace is visible -- not the live train.py the agent may rewrite meanwhile, nor an
    untracked file it planted there (a prepare.pyc, a prepare/ package, a torch.py: red team)."""
    refuse_python_inside(ws.root)
    mount = _prepare_data_mount(ws)
    files: dict[str, os.PathLike | str] = {str(mount / p.name): p for p in sorted(Path(view).iterdir())
             if p.is_file() and not p.is_symlink() and not p.name.startswith(".")}
    files.update({str(dest): src for dest, src in (sources or {}).items()})
    # every workspace's state (another workspace on the same corpus holds the same val/test text), and
    # the corpus the splits were cut from: held-out text train.py can read is a score it can forge
    # .git too: train.py needs none of it, and from it a kept version could tell a later reference run
    # of itself (the branch has moved on) from its own measurement, and spoil the former
    hide = [*hidden_paths(ws), mount.parent]
    # with `sources` the workspace is an empty tmpfs holding only the committed files
    return build_command(argv, mode="train", workspace=ws.root, hide=hide, scratch=scratch, files=files,
                         env=env, cwd=ws.root, info=info, workspace_entries=not sources)


def evaluation_command(ws, argv: Sequence[str], *, eval_dir: EvalDir | Path, data_dir: os.PathLike | str,
                       data_files: Iterable[str], extra_ro: Iterable[os.PathLike | str] = (),
                       info: Optional[SandboxInfo] = None) -> list[str]:
    """The evaluator's sandbox: CPU only, nothing writable, the workspace and state dir invisible; it
    sees its private eval dir (an EvalDir, or the path of one made by evaluator_dir) and the named data
    files (val, test, meta) in <eval dir>/data."""
    box = eval_dir.path if isinstance(eval_dir, EvalDir) else Path(eval_dir)
    files = {str(box / "data" / n): Path(data_dir) / n for n in data_files
             if (Path(data_dir) / n).is_file()}
    # eval_dir/data is an empty tmpfs in the sandbox: the mount points for the data files
    # the one policy (hidden_paths) too: a model's graph is agent-written code; its eval dir, inside the
    # hidden state dir, is shown again by name
    hide = [*hidden_paths(ws), ws.root, box / "data"]
    return build_command(argv, mode="eval", workspace=None, hide=hide,
                         ro_binds=[box, *extra_ro], files=files, env={}, cwd=box, info=info)


def scorer_command(ws, argv: Sequence[str], *, box: os.PathLike | str, info: Optional[SandboxInfo] = None) -> list[str]:
    """A target's evaluator's sandbox: CPU only, nothing writable, the workspace and every state dir invisible
    (the one policy: the evaluator reads agent-written output); it sees its private box -- the pinned files,
    the hidden ones, a copy of the run's output -- shown again by name inside the hidden state dir."""
    hide = [*hidden_paths(ws), ws.root]
    return build_command(argv, mode="eval", workspace=None, hide=hide, ro_binds=[box], env={}, cwd=box, info=info)
