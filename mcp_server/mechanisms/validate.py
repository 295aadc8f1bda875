"""Validation of a mechanism's code before it may steer the loop (it is untrusted: an outer
agent wrote it), and the sandbox every runtime mechanism runs in, at validation and in use.

1. Static checks with `ast` (instant, clear reasons): it parses; it defines
   advise(history, source); no import of modules that reach the network, processes, files,
   native code or the import machinery; no import of a package that is not installed; no
   open/exec/eval/compile/__import__/getattr-style escapes; no dunder attribute access.
2. A run in a separate process: import the module, then call advise() on synthetic histories
   (empty, a plateau, a crash streak, only one category explored) and on the campaign's recorded
   history; each answer must be well formed (base.check_advice), and all of it must finish
   within a deadline.

The process (`sandbox_child.py`, `python -I`, an empty environment) runs in the loop's own
sandbox (loop/sandbox.py: bubblewrap, no network, the file system read-only, the same hidden
paths as train.py's -- sandbox.hidden_paths -- and the workspace masked, killed with its parent).
The static checks are early, friendly errors; the OS is the boundary. Without a sandbox it is
refused, as train.py is, unless the human passed --unsafe-no-sandbox (then `unshare -n` when it
works, else a plain subprocess: `isolation` says so in every result);
and always with resource limits: address space (memory), CPU seconds, no file writes
(RLIMIT_FSIZE = 0), few file descriptors, and a wall-clock deadline after which its process
group is killed.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from mcp_server.common.procs import kill_group_now
from mcp_server.mechanisms.base import check_advice

CHILD = Path(__file__).resolve().parent / "sandbox_child.py"
MAX_CODE_BYTES = 100_000
MEMORY_MB = 512
VALIDATE_CASE_S = 1.0      # per history, at validation
STARTUP_S = 3.0            # python start-up (and bubblewrap) on a busy 2-core machine
USE_DEADLINE_S = 3.0       # one call in use (suggest_next): a failing mechanism must not slow the loop

_NET = "reaches the network"
_PROC = "starts processes or threads"
_FILES = "reads or writes files"
_NATIVE = "loads native code or escapes the interpreter"
_IMPORT = "changes the import machinery or the interpreter"
FORBIDDEN_MODULES: dict[str, str] = {
    **{m: _NET for m in ("socket", "ssl", "urllib", "http", "ftplib", "smtplib", "poplib", "imaplib", "telnetlib",
                         "socketserver", "xmlrpc", "requests", "httpx", "aiohttp", "urllib3", "websocket",
                         "websockets", "asyncio", "selectors", "select", "webbrowser")},
    **{m: _PROC for m in ("subprocess", "multiprocessing", "threading", "_thread", "concurrent", "signal", "pty", "sched")},
    **{m: "reaches the operating system (files, processes, environment)" for m in ("os", "posix", "nt")},
    **{m: _FILES for m in ("io", "pathlib", "shutil", "tempfile", "glob", "fileinput", "sqlite3", "shelve", "dbm",
                           "zipfile", "tarfile", "gzip", "bz2", "lzma", "pickle", "marshal", "mmap", "fcntl", "csv",
                           "logging", "linecache", "tokenize")},
    **{m: _NATIVE for m in ("ctypes", "cffi", "resource", "faulthandler", "tracemalloc", "pwd", "grp", "atexit",
                            "gc", "inspect", "code", "codeop", "pdb", "bdb", "platform", "sysconfig")},
    **{m: _IMPORT for m in ("sys", "importlib", "builtins", "runpy", "pkgutil", "zipimport", "site", "types",
                            "mcp_server")},
}
FORBIDDEN_CALLS = {
    "open": "opens files (a mechanism reads only its arguments and writes nothing)",
    "exec": "executes generated code", "eval": "evaluates generated code", "compile": "compiles generated code",
    "__import__": "imports by name (use a plain import statement)", "breakpoint": "starts a debugger",
    "input": "reads the terminal", "globals": "reaches the module's globals", "locals": "reaches the frame",
    "vars": "reaches an object's namespace", "getattr": "looks attributes up by name (use plain attribute access)",
    "setattr": "sets attributes by name", "delattr": "deletes attributes by name", "memoryview": "reaches raw memory",
    "exit": "exits the interpreter", "quit": "exits the interpreter",
}
ALLOWED_DUNDERS = {"__init__", "__name__", "__doc__", "__len__", "__iter__", "__eq__", "__lt__", "__repr__"}


@dataclass
class CaseResult:
    label: str
    ok: bool
    advice: Optional[dict] = None
    error: Optional[str] = None


@dataclass
class SandboxResult:
    imported: bool
    import_error: Optional[str]
    cases: list[CaseResult]
    timed_out: bool
    seconds: float
    isolation: str
    stderr: str = ""

    def first_problem(self, expected: list[str]) -> Optional[str]:
        """A sentence for the first thing that went wrong, None if every case answered well."""
        if self.import_error:
            return f"importing it failed: {self.import_error}"
        done = {c.label for c in self.cases}
        for c in self.cases:
            if not c.ok:
                return f"advise() failed on the {c.label} history: {c.error}"
        missing = [lbl for lbl in expected if lbl not in done]
        if self.timed_out:
            where = f"advise() on the {missing[0]} history" if self.imported and missing else "the import"
            return (f"{where} did not finish within the deadline ({self.seconds:.1f} s in all): an endless loop "
                    "or far too much work; a mechanism must answer in well under a second")
        if not self.imported or missing:
            tail = self.stderr.strip().splitlines()[-1:] or ["no output"]
            return f"the sandbox process ended early ({tail[0][:300]}); it may have exceeded {MEMORY_MB} MB"
        return None


@dataclass
class Validation:
    ok: bool
    reason: str                      # "valid" or the first problem, phrased for the author
    problems: list[str] = field(default_factory=list)
    samples: dict = field(default_factory=dict)   # history label -> the advice it gave
    seconds: float = 0.0
    isolation: str = ""


# --------------------------------------------------------------------------- static checks

def _top(name: str) -> str:
    return name.split(".", 1)[0]


@functools.lru_cache(maxsize=256)
def _installed(top: str) -> bool:
    if top in sys.stdlib_module_names:
        return True
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def static_problems(code: str) -> list[str]:
    """Every problem `ast` can see, each a sentence that names the line and what to do."""
    if len(code.encode("utf-8", "replace")) > MAX_CODE_BYTES:
        return [f"the module is larger than {MAX_CODE_BYTES // 1000} kB; a mechanism is a small function"]
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        return [f"it does not parse: line {e.lineno}: {e.msg}"]
    problems: list[str] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", "?")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.ImportFrom) and (node.level or 0) > 0:
                problems.append(f"line {line}: relative import; a mechanism is a single module")
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in names:
                top = _top(name)
                if top in FORBIDDEN_MODULES:
                    problems.append(f"line {line}: imports {name!r}, which {FORBIDDEN_MODULES[top]}; a mechanism "
                                    "may use only computation modules (math, statistics, collections, re, ...)")
                elif not _installed(top):
                    problems.append(f"line {line}: imports {name!r}, which is not installed in loopwright's "
                                    "Python environment; use the standard library (math, statistics, "
                                    "collections, itertools, random, re)")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS:
            problems.append(f"line {line}: calls {node.func.id}(), which {FORBIDDEN_CALLS[node.func.id]}")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("__") and node.attr not in ALLOWED_DUNDERS:
            problems.append(f"line {line}: reaches {node.attr}, an interpreter internal")
        elif isinstance(node, ast.Name) and node.id in ("__builtins__", "__loader__", "__spec__", "__import__"):
            problems.append(f"line {line}: uses {node.id}, an interpreter internal")
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    adv = funcs.get("advise")
    if adv is None:
        problems.append("it defines no top-level function advise(history, source) -> dict")
    elif len(adv.args.args) < 2 and adv.args.vararg is None:
        problems.append("advise() must take two arguments: advise(history, source)")
    return problems


# --------------------------------------------------------------------------- the sandbox

def _limited(argv: list[str], memory_mb: int, cpu_s: int) -> list[str]:
    """`argv` with the mechanism's limits: its memory, CPU seconds, no file writes, few descriptors."""
    from mcp_server.loop import sandbox as sb  # lazily, as isolation() does
    return sb.limited(argv, memory_mb << 20, CPU=(cpu_s, cpu_s + 1), FSIZE=(0, 0), NOFILE=(32, 32))


def _works(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv + ["/bin/true"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@functools.lru_cache(maxsize=16)
def _isolation(hide: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    from mcp_server.loop import sandbox as sb

    info = sb.detect()
    if info.available:
        cmd = sb.build_command(["/bin/true"], mode="eval", env={"HOME": os.path.expanduser("~")}, hide=hide,
                               info=info)
        if _works(cmd[:-1]):
            return f"{info.detail}, the loop's hidden paths masked + resource limits", tuple(cmd[:-1])
        raise sb.SandboxUnavailable(f"the sandbox for mechanisms does not start here ({info.detail}); "
                                    "`loopwright doctor` says what is wrong")
    if not sb.unsafe_requested():
        sb.require()   # raises SandboxUnavailable, saying how to install bubblewrap or opt out
    # the human's --unsafe-no-sandbox: what can still be had, said in every result
    unshare = shutil.which("unshare")
    if unshare and _works([unshare, "-n"]):
        return "UNSAFE: unshare -n (no network) + resource limits; the state and the corpus are readable", \
            (unshare, "-n")
    return "UNSAFE: resource limits only (no bubblewrap or unshare here: network and files NOT isolated)", ()


def isolation(ws=None) -> tuple[str, tuple[str, ...]]:
    """(what isolates the mechanism process here, the command prefix that does it): the loop's own
    sandbox (loop/sandbox.py), with the same hidden paths as train.py's (sandbox.hidden_paths: every
    state home, corpus, worker cache and working copy) and the workspace itself. Without a sandbox a
    mechanism is refused (SandboxUnavailable), as train.py is, unless the human opted out."""
    from mcp_server.loop import sandbox as sb

    hide = [*sb.hidden_paths(ws)] + ([ws.root] if ws is not None else [])
    return _isolation(tuple(str(p) for p in hide))


@functools.lru_cache(maxsize=1)
def _child_code() -> str:
    return CHILD.read_text(encoding="utf-8")


def run_sandboxed(name: str, code: str, cases: list[dict], deadline_s: float,
                  memory_mb: int = MEMORY_MB, ws=None) -> SandboxResult:
    """Import `code` and call advise() on each case ({label, history, source}) in the sandbox."""
    from mcp_server.loop.sandbox import SandboxUnavailable

    try:
        how, prefix = isolation(ws)
    except SandboxUnavailable as e:
        return SandboxResult(False, f"not run: {e}", [], False, 0.0, "none")
    # the child's code goes in on the command line: its file may lie under a path the sandbox masks (~)
    argv = [*prefix, sys.executable, "-I", "-c", _child_code()]
    payload = json.dumps({"name": name, "code": code, "cases": cases}).encode()
    t0 = time.monotonic()
    proc = subprocess.Popen(_limited(argv, memory_mb, max(1, math.ceil(deadline_s))), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, cwd="/", start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(payload, timeout=deadline_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group_now(proc.pid)
        out, err = proc.communicate()
    seconds = time.monotonic() - t0
    if proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL) and not timed_out:
        timed_out = proc.returncode == -signal.SIGXCPU
    imported, import_error, results = False, None, []
    for line in out.decode("utf-8", "replace").splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("stage") == "import":
            imported, import_error = bool(msg.get("ok")), msg.get("error")
        elif msg.get("stage") == "case":
            results.append(CaseResult(msg["label"], bool(msg["ok"]), msg.get("advice"), msg.get("error")))
    return SandboxResult(imported, import_error, results, timed_out, seconds, how,
                         err.decode("utf-8", "replace")[-2000:])


def sample_summary(advice: dict, label: str, cases: list[dict]) -> dict:
    """What the proposer is shown of one validation answer: never the answer verbatim (a mechanism that
    found something to read could hand it back this way). The category and the flag as given; of the
    names, only those that are constants of that case's train.py; of the note, its length."""
    from mcp_server.mechanisms.source import tunable_constants

    if not advice:
        return {}
    source = next((c["source"] for c in cases if c["label"] == label), "")
    try:
        known = {k.name for k in tunable_constants(source)}
    except SyntaxError:
        known = set()
    out: dict = {"category": advice.get("category")}
    for key in ("parameters", "avoid"):
        if key in advice:
            out[key] = [p for p in advice[key] if p in known]
            dropped = len(advice[key]) - len(out[key])
            if dropped:
                out[f"{key}_not_constants"] = dropped
    if "force" in advice:
        out["force"] = bool(advice["force"])
    if advice.get("note"):
        out["note_chars"] = len(advice["note"])
    return out


# --------------------------------------------------------------------------- histories to run it on

def _trial(i: int, category: str, changed: list[str], verdict: Optional[str], status: str = "ok",
           val: Optional[float] = 2.05, values: Optional[dict] = None) -> dict:
    return {"id": i, "description": f"synthetic {i}", "status": status, "verdict": verdict,
            "val_bpb": val if status == "ok" else None, "gain": (2.0 - val) if status == "ok" and val else None,
            "changed": changed, "code_changed": False, "category": category, "values": values or {}}


def synthetic_cases(source: str) -> list[dict]:
    """Histories that exercise the corners a mechanism must survive."""
    from mcp_server.mechanisms.base import History, history_to_dict

    bare = "print('a train.py without tunable constants')\n"
    base = history_to_dict(History((), 2.0, 0.01, source), source)
    cats = [c["category"] for c in base["constants"]] or ["optimizer"]
    names = [c["name"] for c in base["constants"]] or ["LR"]

    def with_trials(trials: list[dict]) -> dict:
        since = 0
        for t in reversed(trials):
            if t["verdict"] == "keep":
                break
            since += 1
        return {**base, "trials": trials, "experiments_since_keep": since}

    plateau = [_trial(i + 1, cats[0], [names[0]], "keep" if i == 0 else "discard", val=1.99 if i == 0 else 2.03)
               for i in range(12)]
    crashes = [_trial(i + 1, cats[-1], [names[-1]], None, status="crash") for i in range(6)]
    one_cat = [_trial(i + 1, cats[0], [names[i % len(names)]], "keep" if i % 3 == 0 else "discard")
               for i in range(9)]
    return [{"label": "empty", "history": with_trials([]), "source": source},
            {"label": "plateau", "history": with_trials(plateau), "source": source},
            {"label": "crash-streak", "history": with_trials(crashes), "source": source},
            {"label": "one-category", "history": with_trials(one_cat), "source": source},
            {"label": "no-constants", "history": history_to_dict(History((), None, 0.0, bare), bare), "source": bare}]


def validate(name: str, code: str, source: str, recorded: Optional[dict] = None,
             case_deadline_s: float = VALIDATE_CASE_S, ws=None) -> Validation:
    """Static checks, then a sandboxed run on synthetic histories and the recorded one."""
    if not name.isidentifier() or len(name) > 40:
        return Validation(False, f"name {name!r}: use a short identifier (letters, digits, _)",
                          [f"bad name {name!r}"])
    problems = static_problems(code)
    if problems:
        return Validation(False, "rejected by the static checks: " + problems[0], problems)
    cases = synthetic_cases(source)
    if recorded is not None:
        cases.append({"label": "recorded", "history": recorded, "source": source})
    labels = [c["label"] for c in cases]
    res = run_sandboxed(name, code, cases, STARTUP_S + case_deadline_s * len(cases), ws=ws)
    problem = res.first_problem(labels)
    samples: dict = {}
    if problem is None:
        for c in res.cases:
            try:
                samples[c.label] = sample_summary(check_advice(c.advice), c.label, cases)
            except ValueError as e:
                problem = f"advise() on the {c.label} history returned a malformed answer: {e}"
                break
    if problem is not None:
        return Validation(False, "rejected in the sandbox: " + problem, [problem], seconds=res.seconds,
                          isolation=res.isolation)
    return Validation(True, "valid", [], samples, res.seconds, res.isolation)
