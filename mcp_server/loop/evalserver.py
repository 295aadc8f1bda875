"""A warm evaluator per workspace: a fork server ("zygote") behind runner.run_evaluation.

Why: a demo run trains for ~13 s; the one-shot evaluator took ~4.5 s more, most of it starting Python and
importing torch and the ~840 modules the evaluator imports lazily (BENCHMARKS.md, "Fixed cost per run").
The zygote pays that once per (state dir, pinned evaluator bytes, data files) and forks a fresh child for
each model, so an evaluation costs what scoring the model costs.

It keeps every property of the one-shot path (runner.py's docstring):
- it runs in the same evaluation sandbox (sandbox.evaluation_command: CPU only, nothing writable, only
  val/test/meta visible, no network, the same memory limit), started with `python -I -S` from the same
  hash-checking bootstrap (sandbox.pinned_sources_code): it holds the pinned bytes it read and checked once,
  and an evaluator file changed before it started makes it exit EVALUATOR_CHANGED_EXIT, as the one-shot
  bootstrap does;
- it imports numpy, torch and the modules the evaluator loads lazily, and compiles the pinned prepare.py;
  it never runs prepare.py, never opens a model and runs no torch op (OpenMP's thread pool starts in
  each child, as in a fresh process);
- for each request it forks a child that does exactly what the one-shot bootstrap does -- the pinned
  prepare.py as __main__ with the evaluate argv and the siblings' pinned bytes -- with stdin on /dev/null
  and stdout/stderr on fresh pipes, and exits. Only the zygote writes its own stdout: a header line with
  the child's exit status and the byte counts, then the child's bytes. A model cannot forge that frame,
  so the runner's checks (the nonce on the verdict line, a clean exit after it) stand unchanged. What one
  model's evaluation could leave for the next is closed off: the zygote is not dumpable (a child cannot
  ptrace it or read its memory), and every other process in the sandbox is killed after each child;
- the model reaches it as today: a hashed private copy (sandbox.copy_regular_file) in the server's spool
  directory (inside its 0700 directory in the state dir, bound read-only into the sandbox, invisible to
  train.py's and the clients' sandboxes), removed after the request.

One request at a time per server (a busy server means the one-shot path); over the time limit the whole
sandbox is killed and the next request starts a new server; a server found dead is restarted. Servers end
with this process (atexit, and bwrap's --die-with-parent: a keeper thread that lives as long as the
server is bwrap's parent), after IDLE_SECONDS without a request, or when a newer one needs the place
(MAX_SERVERS per process). Where a server cannot be used -- no bubblewrap (--unsafe-no-sandbox, macOS),
an executor's throw-away working copy, LOOPWRIGHT_EVAL_SERVER=0 in the environment -- or fails (logged
once per reason), run_evaluation runs the one-shot evaluator.
"""
from __future__ import annotations

import atexit
import hashlib
import inspect
import json
import logging
import os
import secrets
import select
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Optional

from mcp_server.common.procs import kill_group
from mcp_server.loop import sandbox
from mcp_server.loop.workspace import EVALUATOR_SIBLINGS

log = logging.getLogger("loopwright.evalserver")

OFF_ENV = "LOOPWRIGHT_EVAL_SERVER"   # "0": every evaluation runs the one-shot evaluator (a way out; benchmarks)
DIR_PREFIX = "loopwright-zygote-"    # + the owning process's pid: a dir whose process is gone is swept

MAX_SERVERS = 2          # per process: a test session opens many workspaces, each server holds torch (~300 MB)
IDLE_SECONDS = 900.0     # a server unused this long ends (a session that stopped running experiments)
OUTPUT_CAP = 8 << 20     # bytes kept of a child's stdout and of its stderr (the end: the verdict is the last line)
# Imported once by the server (each where the pinned evaluator's sources import its package): numpy and torch,
# and what a first evaluate_exported imports lazily -- pt2audit's function-local imports (sympy and mpmath,
# torch.export's archive and unlift modules, which pull in torch._dynamo: ~840 modules, 1-3 s) and the few
# torch.export.load adds. Found with `python bench/perf/eval_cost.py --profile` (modules first imported by a
# cold call); a name missing from another torch version is skipped.
PRELOAD = ("numpy", "torch", "torch.export", "torch.export._unlift", "torch.export.pt2_archive._package",
           "torch.export.pt2_archive.constants", "torch.fx.experimental.validator", "torch.utils.serialization",
           "sympy", "sympy.parsing.sympy_parser", "tomllib", "argparse", "pickle", "zipfile")


class ServerError(RuntimeError):
    """The server broke its protocol or died mid-request: the caller evaluates with the one-shot path."""


class _Timeout(Exception):
    pass


@dataclass
class EvalRun:
    """What an evaluator process left: its exit status (None: killed at the time limit), its output, and the
    sha256 of the model copy it scored."""
    returncode: Optional[int]
    stdout: str
    stderr: str
    model_sha256: str
    served_by: Optional[int] = None   # the server's pid inside its sandbox (None: the one-shot path)

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


# ---------------------------------------------------------------------------
# The server, as it runs inside the sandbox (stdlib only; its source is sent with the bootstrap)

def zygote_child(main: str, code, pinned: dict, argv: list, out_w: int, err_w: int,
                 proto: int) -> None:  # pragma: no cover - runs in the sandbox
    """In the forked child: what the one-shot bootstrap does -- the pinned `main` as __main__ with `argv` and
    the siblings' pinned bytes -- with stdin on /dev/null and stdout/stderr on the pipes, and without the
    server's protocol fd `proto`; never returns."""
    import builtins
    import os
    import sys
    import traceback
    import types

    status = 1
    try:
        try:   # dumpable again, as a fresh process is (the server is not: see zygote())
            import ctypes
            ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)   # PR_SET_DUMPABLE
        except (OSError, AttributeError):
            pass
        os.close(proto)   # the frame is the server's alone
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        for fd in (null, out_w, err_w):
            os.close(fd)
        sys.argv = [main, *argv]
        m = types.ModuleType("__main__")
        m.__file__ = main
        m.__builtins__ = builtins  # type: ignore[attr-defined]
        m._PINNED_SOURCES = pinned  # type: ignore[attr-defined]
        sys.modules["__main__"] = m
        try:
            exec(code, m.__dict__)
            status = 0
        except SystemExit as e:   # the exit status the interpreter would make of it
            if e.code is None:
                status = 0
            elif isinstance(e.code, int):
                status = e.code & 0xFF
            else:
                print(e.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - the traceback, as an uncaught exception prints it
            traceback.print_exc()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream: nothing more to say
                pass
    finally:
        os._exit(status)


def zygote_collect(out_r: int, err_r: int, cap: int) -> tuple:  # pragma: no cover - runs in the sandbox
    """Read both pipes to their end; the last `cap` bytes of each."""
    import os
    import selectors

    bufs = {out_r: bytearray(), err_r: bytearray()}
    with selectors.DefaultSelector() as sel:
        for fd in bufs:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            for key, _ in sel.select():
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fd)
                    os.close(key.fd)
                    continue
                buf = bufs[key.fd]
                buf += chunk
                if len(buf) > 2 * cap:
                    del buf[:-cap]
    return bytes(bufs[out_r][-cap:]), bytes(bufs[err_r][-cap:])


def zygote(main: str, srcs: dict, preload: list, cap: int) -> None:  # pragma: no cover - runs in the sandbox
    """Import `preload`, compile the pinned `main` (prepare.py), say {"ready": pid}, then serve {"argv": [...]}
    lines on stdin: fork, zygote_child() in the child, and answer with a header line {"exit", "out", "err"}
    followed by the child's stdout and stderr bytes."""
    import json
    import os
    import sys

    proto = os.dup(1)   # the protocol on a private fd; whatever else writes to stdout goes to the log
    os.dup2(2, 1)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # as prepare.py sets it, before OpenMP loads
    for name in preload:
        try:
            __import__(name)
        except Exception as e:  # noqa: BLE001 - the child imports it again and fails there, visibly
            sys.stderr.write(f"preload {name}: {type(e).__name__}: {e}\n")
    code = compile(srcs[main], main, "exec")
    pinned = {p.rsplit("/", 1)[-1][:-3]: s for p, s in srcs.items() if p != main}
    try:   # not dumpable: a child (a model's graph runs there) cannot ptrace the server or read its memory
        import ctypes
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)   # PR_SET_DUMPABLE
    except (OSError, AttributeError):
        pass
    me = os.getpid()

    def say(head: dict, body: bytes = b"") -> None:
        data = json.dumps(head).encode() + b"\n" + body
        while data:
            data = data[os.write(proto, data):]

    say({"ready": os.getpid()})
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            return
        argv = json.loads(line)["argv"]
        (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
        sys.stdout.flush()   # nothing of the server's own buffered output ends up in the child's
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(out_r)
            os.close(err_r)
            zygote_child(main, code, pinned, argv, out_w, err_w, proto)
        os.close(out_w)
        os.close(err_w)
        out, err = zygote_collect(out_r, err_r, cap)
        _, status = os.waitpid(pid, 0)
        for other in os.listdir("/proc"):   # nothing the child left lives on into the next request
            if other.isdigit() and int(other) not in (1, me):
                try:
                    os.kill(int(other), 9)
                except OSError:
                    pass
        say({"exit": os.waitstatus_to_exitcode(status), "out": len(out), "err": len(err)}, out + err)


# The server's source as this process compiled it: read once, at import (a file edited later -- an upgrade
# under a long-lived MCP server -- must not send lines that do not match the functions above)
ZYGOTE_SOURCE = "".join(inspect.getsource(f) for f in (zygote_child, zygote_collect, zygote))


def zygote_bootstrap(box: Path, files: Mapping[str, bytes], site: Iterable[str]) -> str:
    """Code for `python -I -S -c`: the pinned files in `box` checked as the one-shot bootstrap checks them,
    then zygote() serving them."""
    names = ["prepare.py", *(n for n in EVALUATOR_SIBLINGS if n in files)]   # what the one-shot path checks
    digests = {str(box / n): hashlib.sha256(files[n]).hexdigest() for n in names}
    main = str(box / "prepare.py")
    sources = b"\n".join(files[n] for n in names)
    # only what the pinned evaluator imports (a stand-in evaluator in a test imports nothing)
    preload = [m for m in PRELOAD if f"import {m.split('.')[0]}".encode() in sources]
    return (sandbox.pinned_sources_code(digests, list(site)) + ZYGOTE_SOURCE
            + f"zygote({main!r}, srcs, {preload!r}, {OUTPUT_CAP})\n")


# ---------------------------------------------------------------------------
# The runner's side

class Server:
    """One zygote in its sandbox, for one workspace state dir and one set of pinned evaluator bytes."""

    def __init__(self, ws, files: Mapping[str, bytes], python: str, info: sandbox.SandboxInfo,
                 env: Mapping[str, str], data_files: Iterable[str]):
        self.lock = threading.Lock()   # one request at a time
        self.last_used = time.monotonic()
        base = Path(ws.state_dir) / "eval"
        _sweep(base)
        self.dir = sandbox.evaluator_dir(files, base, prefix=f"{DIR_PREFIX}{os.getpid()}-")
        (self.dir / "spool").mkdir(mode=0o700)
        code = zygote_bootstrap(self.dir, files, sandbox.site_dirs())
        self.cmd = sandbox.evaluation_command(ws, [python, "-I", "-S", "-c", code], eval_dir=self.dir,
                                              data_dir=ws.data_dir, data_files=data_files, info=info)
        self.env = dict(env)
        self.proc: Optional[subprocess.Popen] = None
        self.pid: Optional[int] = None      # the zygote's pid inside its PID namespace
        self._buf = b""
        self._log: Optional[int] = None
        self._ended = threading.Event()     # tells the keeper thread of the current process to end
        self._idle: Optional[threading.Timer] = None
        self.closed = False

    # -- process --------------------------------------------------------------
    def _spawn(self) -> subprocess.Popen:
        """Start the sandbox from a keeper thread that lives as long as it: bwrap's --die-with-parent fires
        when the *thread* that started it ends, and run_evaluation is called from short-lived worker
        threads (the MCP server's tool calls)."""
        self._ended = ended = threading.Event()
        self._log = os.open(self.dir / "server.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        box: dict = {}
        started = threading.Event()

        def keep() -> None:
            try:
                box["proc"] = subprocess.Popen(
                    sandbox.limited(self.cmd, sandbox.default_memory_limit()), cwd=self.dir, env=self.env,
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, start_new_session=True)
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                box["error"] = e
            started.set()
            if "proc" in box:
                ended.wait()

        threading.Thread(target=keep, name="loopwright-evalserver", daemon=True).start()
        started.wait()
        if "error" in box:
            ended.set()
            raise box["error"]
        return box["proc"]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, deadline: float) -> Optional[EvalRun]:
        """A fresh zygote, ready to serve; an EvalRun when its bootstrap refused the evaluator's files."""
        self.stop()
        self._buf = b""
        self.proc = self._spawn()
        try:
            hello = json.loads(self._line(deadline))
        except ServerError:
            try:
                code: Optional[int] = self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                code = None
            if code == sandbox.EVALUATOR_CHANGED_EXIT:
                return EvalRun(code, "", self.log_tail(), "")
            raise ServerError(f"the evaluator server exited with code {code} before it was ready: "
                              f"{self.log_tail()[-300:]}") from None
        except ValueError:
            raise ServerError("the evaluator server's first line is not JSON") from None
        if not isinstance(hello, dict) or not isinstance(hello.get("ready"), int):
            raise ServerError(f"the evaluator server said {hello!r}, not ready")
        self.pid = hello["ready"]
        return None

    def stop(self) -> None:
        """Kill the sandbox (the whole process group; the PID namespace takes every child with it)."""
        proc, self.proc, self.pid = self.proc, None, None
        if proc is not None:
            for stream in (proc.stdin, proc.stdout):
                try:
                    if stream is not None:
                        stream.close()
                except OSError:
                    pass
            kill_group(proc, grace_s=1.0)
        self._ended.set()
        if self._log is not None:
            os.close(self._log)
            self._log = None

    def close(self) -> None:
        self.closed = True
        if self._idle is not None:
            self._idle.cancel()
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log_tail(self, n: int = 2000) -> str:
        try:
            with open(self.dir / "server.log", "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - n))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    # -- protocol -------------------------------------------------------------
    def _fill(self, deadline: float) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            raise _Timeout()
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            raise ServerError("the evaluator server closed its output")
        self._buf += chunk

    def _line(self, deadline: float) -> bytes:
        while b"\n" not in self._buf:
            if len(self._buf) > 1 << 16:
                raise ServerError("the evaluator server sent an over-long header")
            self._fill(deadline)
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def _take(self, n: int, deadline: float) -> bytes:
        while len(self._buf) < n:
            self._fill(deadline)
        data, self._buf = self._buf[:n], self._buf[n:]
        return data

    def evaluate(self, model_path: os.PathLike | str, nonce: Optional[str], deadline: float) -> EvalRun:
        """Score one model: an EvalRun (returncode None: over the deadline, the server stopped). Raises
        sandbox.UnsafeFile for a model that is not a plain file, ServerError on a broken protocol."""
        dest = self.dir / "spool" / f"{secrets.token_hex(8)}.pt2"
        digest, _ = sandbox.copy_regular_file(model_path, dest)
        try:
            return self._request(dest, digest, nonce, deadline)
        except _Timeout:
            self.stop()   # the next evaluation starts a new one
            return EvalRun(None, "", "", digest)
        finally:
            dest.unlink(missing_ok=True)

    def _request(self, dest: Path, digest: str, nonce: Optional[str], deadline: float) -> EvalRun:
        if not self.alive():
            refused = self.start(deadline)
            if refused is not None:
                refused.model_sha256 = digest
                return refused
        assert self.proc is not None and self.proc.stdin is not None
        argv = ["evaluate", str(dest), "--data-dir", str(self.dir / "data")] + (["--nonce", nonce] if nonce else [])
        try:
            self.proc.stdin.write(json.dumps({"argv": argv}).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError as e:
            raise ServerError(f"the evaluator server took no request: {e}") from None
        try:
            head = json.loads(self._line(deadline))
            code, n_out, n_err = head["exit"], head["out"], head["err"]
        except (ValueError, KeyError, TypeError):
            raise ServerError("the evaluator server's answer has no valid header") from None
        if not all(isinstance(v, int) for v in (code, n_out, n_err)):
            raise ServerError(f"the evaluator server's header is malformed: {head!r}")
        out, err = self._take(n_out, deadline), self._take(n_err, deadline)
        self.last_used = time.monotonic()
        return EvalRun(code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), digest, self.pid)


# ---------------------------------------------------------------------------
# The registry: one server per key in this process

_servers: dict[tuple, Server] = {}
_registry = threading.Lock()
_logged: set[str] = set()
last_failure: Optional[str] = None   # why the last evaluation that should have been served was not


def _key(ws, files: Mapping[str, bytes], python: str, data_files: Iterable[str]) -> tuple:
    """What a server is good for: this state dir, these evaluator bytes and these data files (by inode,
    size and mtime: a server binds the files it started with), this interpreter."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    data: list[tuple] = []
    for n in data_files:
        try:
            st = os.stat(Path(ws.data_dir) / n)
            data.append((n, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            data.append((n,))
    return (os.path.realpath(ws.state_dir), python, h.hexdigest(), tuple(data))


def _sweep(base: Path) -> None:
    """Remove the directories of servers whose process is gone (an MCP server ends with os._exit: no atexit)."""
    for d in base.glob(f"{DIR_PREFIX}*") if base.is_dir() else ():
        try:
            pid = int(d.name[len(DIR_PREFIX):].split("-", 1)[0])
            os.kill(pid, 0)
        except ValueError:
            continue
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except OSError:   # alive, another user's: not ours to remove
            continue


def _note(reason: str) -> None:
    global last_failure
    last_failure = reason
    if reason not in _logged:
        _logged.add(reason)
        log.warning("evaluator server: %s; this evaluation runs the one-shot evaluator", reason)


def _drop(key: tuple, server: Server) -> None:
    with _registry:
        if _servers.get(key) is server:
            del _servers[key]
    server.close()


def _idle_close(key: tuple, server: Server) -> None:
    if not server.lock.acquire(blocking=False):
        return
    try:
        if time.monotonic() - server.last_used >= IDLE_SECONDS * 0.9:
            _drop(key, server)
    finally:
        server.lock.release()


def _server_for(key: tuple, make) -> Server:
    with _registry:
        server = _servers.get(key)
        if server is None:
            # the least recently used idle ones make room (a busy one is left alone)
            while len(_servers) >= MAX_SERVERS:
                idle = sorted((s.last_used, k) for k, s in _servers.items() if not s.lock.locked())
                if not idle:
                    break
                old = _servers.pop(idle[0][1])
                old.close()
            server = _servers[key] = make()
        return server


def evaluate(ws, files: Mapping[str, bytes], model_path: os.PathLike | str, nonce: Optional[str], *,
             python: str, info: sandbox.SandboxInfo, env: Mapping[str, str], data_files: Iterable[str],
             timeout: float) -> Optional[EvalRun]:
    """The pinned evaluator on the model, by this workspace's server (started on first use). None where no
    server can serve this evaluation -- no bubblewrap, the server busy with another one, a server failure
    (logged once per reason) -- and the caller runs the one-shot evaluator. Raises sandbox.UnsafeFile for a
    model that is not a plain file."""
    if info.kind != "bwrap" or os.environ.get(OFF_ENV, "").strip() == "0":
        return None
    data_files = list(data_files)
    deadline = time.monotonic() + timeout
    key = _key(ws, files, python, data_files)
    while True:
        try:
            server = _server_for(key, lambda: Server(ws, files, python, info, env, data_files))
        except OSError as e:
            _note(f"cannot make its directory ({e})")
            return None
        if not server.lock.acquire(blocking=False):
            return None   # busy with another evaluation (another thread of this process)
        if not server.closed:
            break
        server.lock.release()   # closed (idle, or evicted) after we found it: take a new one
    try:
        if server._idle is not None:
            server._idle.cancel()
        for attempt in (1, 2):
            try:
                run = server.evaluate(model_path, nonce, deadline)
                if run.returncode == sandbox.EVALUATOR_CHANGED_EXIT and not server.alive():
                    _drop(key, server)   # refused at start: the next evaluation writes the files afresh
                return run
            except ServerError as e:
                if attempt == 1 and not server.alive():   # killed between requests: once more, on a new one
                    continue
                _note(str(e))
                server.stop()
                return None
            except OSError as e:
                _note(f"{type(e).__name__}: {e}")
                server.stop()
                return None
        return None
    finally:
        if not server.closed:
            server._idle = threading.Timer(IDLE_SECONDS, _idle_close, (key, server))
            server._idle.daemon = True
            server._idle.start()
        server.lock.release()


def close_all() -> None:
    """End every server of this process (atexit; tests)."""
    with _registry:
        servers = list(_servers.values())
        _servers.clear()
    for s in servers:
        s.close()


def running() -> list[Server]:
    with _registry:
        return list(_servers.values())


atexit.register(close_all)
