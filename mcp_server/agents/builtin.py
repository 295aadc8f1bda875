"""The built-in agent: a non-LLM proposer that drives the MCP server over stdio.

It is what `loopwright run --agent builtin` and `loopwright demo` run, so the
main job works on a machine with no coding agent, no API key and no network.
It talks to `loopwright serve` through the official MCP client exactly as
Claude Code or Codex would: state_read -> edit train.py -> run_experiment ->
score (confirm runs on 'retest') -> budget_check -> note, and, unless told not
to, asks suggest_next where to look.

The search is a hill climb over train.py's tunable constants (found with
`ast`, see mechanisms/source.py): multiplicative steps for floats, +-1 or x2
for integers, flips for booleans; a step that worked is repeated, a direction
that failed is not tried again from the same point, and when both directions
of a constant fail the step shrinks. Every random choice comes from one
`random.Random(seed)`, so a session is reproducible given the same outcomes.
"""
from __future__ import annotations

import ast
import math
import os
import random
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import anyio

from mcp_server.loop.sandbox import UNSAFE_ENV
from mcp_server.mechanisms.source import Constant, Value, all_constants, constant_values, skeleton, tunable_constants

# ---------------------------------------------------------------------------
# Editing train.py: rewrite one literal on its line, nothing else.


def format_value(value: Value) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


def set_constant(source: str, name: str, value: Value) -> str:
    """`source` with the literal of top-level constant `name` replaced; comments and layout are kept."""
    matches = [c for c in all_constants(source) if c.name == name]
    if not matches:
        raise ValueError(f"{name} is not a top-level int/float/bool constant of this file")
    c = matches[-1]   # the last assignment is the one in force
    if c.kind == "bool" and not isinstance(value, bool) or c.kind != "bool" and isinstance(value, bool):
        raise ValueError(f"{name} is a {c.kind}; cannot set it to {value!r}")
    lines = source.splitlines(keepends=True)
    line = lines[c.line - 1]
    literal, rest = format_value(value), line[c.end_col:]
    pad = len(rest) - len(rest.lstrip(" "))
    if rest.lstrip(" ").startswith("#") and pad:   # keep an aligned comment in its column
        rest = " " * max(2 if pad >= 2 else 1, pad - (len(literal) - len(c.text))) + rest[pad:]
    lines[c.line - 1] = line[:c.col] + literal + rest
    out = "".join(lines)
    got = {k.name: k.value for k in all_constants(out)}.get(name)
    if got != value:   # the file must still parse and say exactly what we meant
        raise ValueError(f"rewriting {name} did not produce {value!r} (read back {got!r})")
    return out


def divisibility_constraints(source: str) -> set[tuple[str, str]]:
    """Pairs (A, B) of integer constants the file divides, so A % B == 0 must hold.

    Found two ways: `A // B` or `A % B` written anywhere (code or comments, e.g. "head dim =
    D_MODEL // N_HEAD"), and through calls: GPT(..., D_MODEL, ..., N_HEAD) where GPT's
    __init__ computes `d // n_head` on those parameters.
    """
    ints = {c.name for c in all_constants(source) if c.kind == "int"}
    pairs = {(a, b) for a, b in re.findall(r"\b([A-Z][A-Z0-9_]*)\s*(?://|%)\s*([A-Z][A-Z0-9_]*)\b", source)
             if a in ints and b in ints}
    tree = ast.parse(source)
    divided: dict[str, tuple[list[str], set[tuple[str, str]]]] = {}
    for node in tree.body:
        if not isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            continue
        fn: Optional[ast.stmt] = node
        if isinstance(node, ast.ClassDef):
            fn = next((b for b in node.body if isinstance(b, ast.FunctionDef) and b.name == "__init__"), None)
        if not isinstance(fn, ast.FunctionDef):
            continue
        params = [a.arg for a in fn.args.args if a.arg not in ("self", "cls")]
        divs = {(op.left.id, op.right.id) for op in ast.walk(fn) if isinstance(op, ast.BinOp)
                and isinstance(op.op, (ast.FloorDiv, ast.Mod)) and isinstance(op.left, ast.Name)
                and isinstance(op.right, ast.Name) and op.left.id in params and op.right.id in params}
        if divs:
            divided[node.name] = (params, divs)
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in divided):
            continue
        params, divs = divided[call.func.id]
        bound = {params[i]: a.id for i, a in enumerate(call.args[:len(params)]) if isinstance(a, ast.Name)}
        bound.update({k.arg: k.value.id for k in call.keywords if k.arg and isinstance(k.value, ast.Name)})
        for pa, pb in divs:
            a, b = bound.get(pa), bound.get(pb)
            if a in ints and b in ints:
                pairs.add((a, b))
    return pairs


def satisfies(values: dict[str, Value], constraints: Iterable[tuple[str, str]]) -> bool:
    for a, b in constraints:
        va, vb = values.get(a), values.get(b)
        if isinstance(va, int) and isinstance(vb, int) and (vb == 0 or va % vb != 0):
            return False
    return True


# ---------------------------------------------------------------------------
# Moves: the neighbours of a constant's value.

_UNIT_RE = re.compile(r"(?:^|_)(?:BETA\d*|MOMENTUM|FRAC|FRACTION|DROPOUT|EMA|PROB|P)(?=_|$|\d)")
MAX_DRIFT = 16.0     # never move a value more than x16 away from where the session found it
FLOAT_STEP = 2.0
MIN_FLOAT_STEP = 1.15


def _round(x: float) -> float:
    return float(f"{x:.3g}")


def _unit_interval(c: Constant) -> bool:
    return c.kind == "float" and 0.0 < c.value < 1.0 and bool(_UNIT_RE.search(c.name))


def moves(c: Constant, step: float) -> dict[str, list[Value]]:
    """direction -> candidate values, preferred first. Directions: up, down, off, flip."""
    v = c.value
    if c.kind == "bool":
        return {"flip": [not v]}
    out: dict[str, list[Value]] = {}
    if c.kind == "float":
        if v == 0:
            out["up"] = [0.1]
        elif _unit_interval(c):
            if v >= 0.5:   # e.g. betas: step the distance to 1
                q = 1.0 - v
                out["up"] = [_round(1.0 - q / step)]
                out["down"] = [_round(1.0 - q * step)] if q * step < 1.0 else [_round(v / step)]
            else:          # e.g. fractions: stay inside (0, 1)
                out["up"] = [_round(min(v * step, (1.0 + v) / 2))]
                out["down"] = [_round(v / step)]
        else:
            out["up"], out["down"] = [_round(v * step)], [_round(v / step)]
        if v != 0 and re.search(r"\b0\s*=\s*off\b", c.comment):
            out["off"] = [0.0]
    else:
        if v == 0:
            out["up"] = [1, 2]
        elif abs(v) >= 8:
            out["up"] = [int(round(v * step))]
            out["down"] = [int(round(v / step))]
        else:   # small integers: +-1 first, x2 / //2 when +-1 breaks a constraint
            out["up"] = [v + 1, v * 2]
            out["down"] = [v - 1, v // 2] if v > 0 else [v - 1]
        if v > 0:   # a positive count stays positive
            out = {d: [x for x in xs if x >= 1] for d, xs in out.items()}
    out = {d: [x for x in dict.fromkeys(xs) if x != v] for d, xs in out.items()}
    return {d: xs for d, xs in out.items() if xs}


@dataclass(frozen=True)
class Edit:
    name: str
    old: Value
    new: Value
    direction: str
    category: str
    source: str          # the whole new train.py
    description: str
    hypothesis: str

    def change(self) -> dict[str, Any]:
        """The edit as run_experiment's structured `change` (recorded in the ledger; a resumed session's
        planner is rebuilt from it)."""
        return {"name": self.name, "old": self.old, "new": self.new}


@dataclass
class ParamState:
    step: float = FLOAT_STEP
    failed: set[str] = field(default_factory=set)   # directions that failed from the current point
    good: Optional[str] = None                      # the direction of this constant's last keep
    tries: int = 0
    exhausted: bool = False


_WHY = {"up": "raising", "down": "lowering", "off": "switching off", "flip": "flipping"}

# What an expert tries first on a short, fixed training budget, in order: (constant, factor applied to its
# current value; 0 = off). Each is proposed once, while untried, before the hill climb's own order; its
# outcome then feeds the climb like any other move. Constants a train.py does not have are skipped.
# Generic for a plain recipe run far shorter than it was written for (the v2 baseline is nanoGPT's): a small
# model on a short run takes a larger learning rate, needs no long warm-up and no weight decay, and its
# embedding learns faster at its own rate. The v2 paired screen (BENCHMARKS.md, "Benchmark v2") measured them.
EXPERT_FIRST: tuple[tuple[str, float], ...] = (
    ("LR", 3.0),               # a 1e-3 recipe on ~170 steps
    ("WARMUP_STEPS", 0.0),     # a warm-up sized for thousands of steps
    ("WEIGHT_DECAY", 0.0),     # regularisation a 30 s run does not need
    ("EMBED_LR", 10.0),        # embeddings at their own, higher rate (autoresearch, modded-nanogpt)
    ("MLP_RATIO", 0.5),        # a narrower MLP trains more steps in the same CPU time
    ("BATCH_SIZE", 0.5),       # more, smaller steps at equal tokens
)


class Planner:
    """Hill-climb memory and move choice. Pure: no I/O, randomness only from the seed."""

    def __init__(self, seed: int = 0, expert: Iterable[tuple[str, float]] = EXPERT_FIRST):
        self.expert = list(expert)
        self._expert_tried: set[tuple[str, float]] = set()
        self.rng = random.Random(seed)
        self.params: dict[str, ParamState] = {}
        self.tried: set[tuple] = set()
        self.origin: dict[str, Value] = {}
        self.momentum: Optional[tuple[str, str]] = None   # (name, direction) of the last keep

    def _state(self, name: str) -> ParamState:
        return self.params.setdefault(name, ParamState())

    @staticmethod
    def _key(source: str) -> tuple:
        # the code without constants, plus the constants: the same values on other code are a new point
        return skeleton(source), tuple(sorted(constant_values(source).items()))

    def propose(self, source: str, category: Optional[str] = None,
                preferred: Iterable[str] = (), busy: Iterable[str] = (), steered: bool = False) -> Optional[Edit]:
        """The next edit of `source` (the best train.py), or None when nothing untried is left.

        Order of preference: the expert-first moves (unless `steered`); repeat the last successful
        step; the constants a mechanism suggested (in its order); constants of the suggested category;
        any constant at random. `steered`: a mechanism on trial gave this advice; its trial is decided
        on these very experiments, so the expert moves wait until it is over.
        `busy`: constants with an edit still in flight (parallel proposals): left alone until its
        outcome is known, so in-flight candidates change different constants.
        """
        busy = set(busy)
        consts = {c.name: c for c in tunable_constants(source) if c.name not in busy}
        if not consts:
            return None
        for name, c in consts.items():
            self.origin.setdefault(name, c.value)
        self.tried.add(self._key(source))
        constraints = divisibility_constraints(source)
        for name, factor in ([] if steered else self.expert):   # expert-first moves, once each
            if (name, factor) in self._expert_tried or name not in consts:
                continue
            self._expert_tried.add((name, factor))
            edit = self._expert_edit(source, consts[name], factor, constraints)
            if edit is not None:
                return edit
        for _ in range(2):   # a second pass after resetting exhausted constants
            for name in self._order(consts, category, preferred):
                edit = self._move(source, consts[name], constraints)
                if edit is not None:
                    return edit
            for st in self.params.values():   # everything converged: widen the steps and go again
                st.exhausted, st.failed, st.step = False, set(), FLOAT_STEP
        return None

    def _order(self, consts: dict[str, Constant], category: Optional[str], preferred: Iterable[str]) -> list[str]:
        names = list(consts)
        self.rng.shuffle(names)   # a random order of everything, the fallback
        first: list[str] = []
        if self.momentum and self.momentum[0] in consts:
            first.append(self.momentum[0])
        first += [n for n in preferred if n in consts]
        if category:
            first += [n for n in names if consts[n].category == category]
        order = list(dict.fromkeys(first + names))
        return [n for n in order if not self._state(n).exhausted]

    def _move(self, source: str, c: Constant, constraints: set[tuple[str, str]]) -> Optional[Edit]:
        st = self._state(c.name)
        while True:
            options = moves(c, st.step)
            dirs = [d for d in options if d not in st.failed]
            self.rng.shuffle(dirs)
            if st.good in dirs:   # keep going the way that worked
                dirs.remove(st.good)
                dirs.insert(0, st.good)
            if self.momentum and self.momentum[0] == c.name and self.momentum[1] in dirs:
                dirs.remove(self.momentum[1])
                dirs.insert(0, self.momentum[1])
            for d in dirs:
                for value in options[d]:
                    edit = self._edit(source, c, d, value, constraints)
                    if edit is not None:
                        return edit
                st.failed.add(d)   # nothing valid and untried that way
            # every direction failed from here: a smaller step, or this constant has converged
            if c.kind == "float" and st.step > MIN_FLOAT_STEP and c.value != 0:
                st.step = math.sqrt(st.step)
                st.failed = set()
                continue
            if c.kind == "int" and abs(c.value) >= 8 and st.step > 1.3:
                st.step = 1.25 if st.step <= 1.5 else 1.5
                st.failed = set()
                continue
            st.exhausted = True
            return None

    def _expert_edit(self, source: str, c: Constant, factor: float,
                     constraints: set[tuple[str, str]]) -> Optional[Edit]:
        if c.kind == "bool" or c.value == 0:
            return None
        if factor == 0:
            value: Value = 0.0 if c.kind == "float" else 0
        elif c.kind == "int":
            value = int(round(c.value * factor))
            if c.value > 0:
                value = max(1, value)
        else:
            value = _round(c.value * factor)
        if value == c.value:
            return None
        direction = "off" if factor == 0 else ("up" if value > c.value else "down")
        if direction in self._state(c.name).failed:
            return None
        return self._edit(source, c, direction, value, constraints)

    def _edit(self, source: str, c: Constant, direction: str, value: Value,
              constraints: set[tuple[str, str]]) -> Optional[Edit]:
        origin = self.origin.get(c.name, c.value)
        if (not isinstance(value, bool) and isinstance(origin, (int, float)) and origin and value
                and max(abs(value / origin), abs(origin / value)) > MAX_DRIFT):
            return None
        values = {**constant_values(source), c.name: value}
        if not satisfies(values, constraints):
            return None
        if (skeleton(source), tuple(sorted(values.items()))) in self.tried:
            return None
        new_source = set_constant(source, c.name, value)
        old_txt, new_txt = format_value(c.value), format_value(value)
        desc = f"{c.name} {old_txt} -> {new_txt}" + (" (off)" if direction == "off" else "")
        hyp = (f"{_WHY[direction]} {c.name} ({c.category}) lowers val_bpb within the fixed time budget")
        return Edit(c.name, c.value, value, direction, c.category, new_source, desc, hyp)

    def record(self, edit: Edit, outcome: str) -> None:
        """outcome: keep | discard | crash (ran) or refused | tabu (not run)."""
        self.tried.add(self._key(edit.source))
        self._update(edit.name, edit.direction, outcome)

    def observe(self, name: str, old: Value, new: Value, outcome: str) -> None:
        """Replay an earlier session's experiment (its recorded change) into the memory."""
        if isinstance(new, bool) or isinstance(old, bool):
            direction = "flip"
        elif new == 0 and old != 0:
            direction = "off"
        else:
            direction = "up" if new > old else "down"
        self._update(name, direction, outcome)

    def _update(self, name: str, direction: str, outcome: str) -> None:
        st = self._state(name)
        st.tries += outcome in ("keep", "discard", "crash")
        if outcome == "keep":
            self.momentum = (name, direction)
            st.good = direction
            for other in self.params.values():   # a new point: every direction is worth a look again
                other.failed = set()
                other.exhausted = False
        else:
            st.failed.add(direction)
            if st.good == direction:
                st.good = None
            if self.momentum == (name, direction):
                self.momentum = None


# ---------------------------------------------------------------------------
# Driving the MCP server

Observer = Callable[[str, dict], None]


class AgentError(RuntimeError):
    """The session could not continue (the message says why)."""


@dataclass
class Attempt:
    number: int
    experiment_id: Optional[int]
    description: str
    status: str                  # ok | crash | timeout | rejected | refused
    verdict: Optional[str]
    val_bpb: Optional[float]
    seconds: float
    warnings: list[str] = field(default_factory=list)


@dataclass
class SessionResult:
    workspace: Path
    attempts: list[Attempt]
    stopped_because: str
    baseline: Optional[float]
    best: Optional[float]
    seconds: float

    @property
    def kept(self) -> int:
        return sum(a.verdict == "keep" for a in self.attempts)


_PROGRESS_RE = re.compile(r"step (\d+) loss ([-+0-9.eEnaif]+) (\d+)s left")


def server_params(workspace: Path):
    """How a real agent's MCP config starts the server (`.mcp.json` in the workspace says the same)."""
    from mcp import StdioServerParameters
    from mcp.client.stdio import get_default_environment

    env = get_default_environment()
    # the directory holding the mcp_server package (agents/builtin.py is two levels down), so a source checkout
    # imports too; never mcp_server/ itself, whose mcp/ subpackage would shadow the MCP SDK
    pkg_parent = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([pkg_parent] + ([os.environ["PYTHONPATH"]]
                                                         if os.environ.get("PYTHONPATH") else []))
    # where the state directory is, and the human's sandbox opt-out (the demo without bubblewrap, `run
    # --unsafe-no-sandbox`): the SDK's reduced environment drops them, and the server then refused every run
    for key in ("LOOPWRIGHT_HOME", "XDG_DATA_HOME", UNSAFE_ENV):
        if os.environ.get(key):
            env[key] = os.environ[key]
    return StdioServerParameters(command=sys.executable,
                                 args=["-m", "mcp_server.cli", "serve", "--workspace", str(workspace)], env=env)


class ToolFailed(Exception):
    def __init__(self, tool: str, message: str):
        super().__init__(f"{tool}: {message}")
        self.tool, self.message = tool, message


@dataclass
class _Flight:
    """A submitted candidate the agent waits for (parallel mode)."""
    edit: Edit
    number: int
    started: float


class BuiltinAgent:
    def __init__(self, client, train: Path, planner: Planner, mechanisms: bool = True,
                 observer: Optional[Observer] = None, parallel: int = 1, asynchronous: bool = False):
        if parallel < 1:
            raise ValueError("parallel must be at least 1")
        self.client = client
        self.train = train          # the editable file; everything else goes through MCP tools
        self.planner = planner
        self.mechanisms = mechanisms
        self.observer = observer or (lambda kind, data: None)
        self.parallel = parallel    # candidates in flight at once
        # submit_experiment + wait (on the workspace's executor) instead of run_experiment + score: with more
        # than one in flight, or whenever the executor is not this machine (a Ray cluster)
        self.asynchronous = asynchronous or parallel > 1
        self.attempts: list[Attempt] = []
        self.durations: list[float] = []
        self.run_seconds: list[float] = []    # wall seconds per training run (+ evaluation), for the deadline
        self.deadline: Optional[float] = None   # monotonic: nothing starts that would end after it
        self.min_experiments = 0    # ... once this many have run: the deadline never cuts a session below it
        self.done = 0               # experiments of this session run (or submitted) so far
        self.flights: dict[int, _Flight] = {}

    def emit(self, event: str, /, **data: Any) -> None:
        try:
            self.observer(event, data)
        except Exception:  # noqa: BLE001 - a display problem must not stop the research
            pass

    async def call(self, tool: str, args: Optional[dict] = None, progress: bool = False) -> dict:
        cb = None
        if progress:
            async def cb(done: float, total: Optional[float], message: Optional[str]) -> None:
                m = _PROGRESS_RE.search(message or "")
                if m:
                    self.emit("progress", step=int(m.group(1)), loss=float(m.group(2)),
                              remaining=float(m.group(3)), elapsed=done, total=total)
        res = await self.client.call_tool(tool, args or {}, progress_callback=cb)
        if res.is_error:
            text = " ".join(getattr(c, "text", "") for c in res.content)
            raise ToolFailed(tool, text)
        return res.structured_content or {}

    # -- the session ------------------------------------------------------------
    async def _resume(self, summary: dict[str, Any]) -> Optional[str]:
        """Take over what an earlier session left: settle its pending retest or score; before a baseline that
        was never measured, check the budget (the stop message when it is spent) and drop a half-made edit,
        which must not be measured as the baseline."""
        if summary["pending_retest"]:
            await self._settle(summary["pending_retest"][-1], confirm=True)
        elif summary["pending_score"]:
            await self._settle(summary["pending_score"][-1], confirm=False)
        if summary["baseline_val_bpb"] is None:
            budget = await self.call("budget_check")
            if budget["should_stop"]:
                return self._stop("budget: " + "; ".join(budget["reasons"]))
            await self.call("revert")
        return None

    async def run(self, n: Optional[int] = None, deadline: Optional[float] = None) -> str:
        """Run up to n experiments (None: until the budget says stop) before `deadline` (monotonic)."""
        self.deadline = deadline
        if self.asynchronous:
            return await self._run_parallel(n)
        state = await self.call("state_read", {"view": "summary"})
        summary = state["summary"]
        self.emit("start", summary=summary, mechanisms=self.mechanisms)
        await self._replay_history()
        stopped = await self._resume(summary)
        if stopped is not None:
            return stopped
        if summary["baseline_val_bpb"] is None:
            self.emit("experiment_start", number=0, description="baseline", category="baseline")
            t0 = time.monotonic()
            res = await self.call("run_experiment", {"description": "baseline", "hypothesis":
                                  "the unmodified train.py, measured on several seeds"}, progress=True)
            seconds = time.monotonic() - t0
            runs = len((res.get("baseline") or {}).get("samples") or [1])
            self.durations.append(seconds / runs)   # one run: the first estimate for the deadline
            self.run_seconds.append(seconds / runs)
            self.emit("baseline", result=res, seconds=seconds)
        done, errors = 0, 0
        while True:
            if n is not None and done >= n:
                return self._stop(f"ran the {n} experiment(s) asked for")
            self.done = done
            edit = None
            try:
                budget = await self.call("budget_check")
                if budget["should_stop"]:
                    return self._stop("budget: " + "; ".join(budget["reasons"]))
                need = self._would_overrun(budget.get("next_experiment_runs"))
                if need is not None:
                    return self._stop(f"session time budget: the next experiment (~{need:.0f} s) would "
                                      "not finish in time")
                edit = await self._next_edit()
                if edit is None:
                    return self._stop("no untried change of the tunable constants is left")
                await self._experiment(edit, done + 1)
                errors = 0
                last = self.attempts[-1] if self.attempts else None
                if last is not None and last.verdict == "retest":
                    return self._stop(f"session time budget: confirming #{last.experiment_id} would not finish "
                                      "in time; the next session confirms it first")
                if last is not None and last.status == "pending_approval":   # autonomy approve-runs
                    return self._stop("the change waits for a person's approval before it runs")
            except ToolFailed as e:
                # like an agent reading a tool error: act on it, and give up only if errors persist
                await self._restore()
                if "budget is spent" in e.message:
                    return self._stop("budget: " + e.message)
                if edit is not None and ("exact repeat" in e.message
                                         or "only touches the random seed" in e.message):
                    self.planner.record(edit, "refused")
                    self.emit("skip", description=edit.description, reason=e.message)
                    continue
                errors += 1
                self.emit("error", message=str(e))
                if errors >= 3:
                    raise AgentError(f"three tool errors in a row, last: {e}") from None
                if "another experiment is running" in e.message:
                    await anyio.sleep(10)
                continue
            done += 1

    def _stop(self, reason: str) -> str:
        self.emit("stop", reason=reason)
        return reason

    # -- parallel: up to `parallel` candidates in flight (submit_experiment / wait) ----------------------
    async def _run_parallel(self, n: Optional[int]) -> str:
        """Keep up to `parallel` candidates in flight: propose from the best version, submit, and record
        verdicts as wait() returns them (the engine decides each against the best at that time; a stale
        one is rebased and re-measured there). Stops submitting at the budget, the deadline or n; returns
        when nothing is in flight any more."""
        state = await self.call("state_read", {"view": "summary", "limit": 50})
        summary = state["summary"]
        self.emit("start", summary=summary, mechanisms=self.mechanisms, parallel=self.parallel)
        await self._replay_history()
        if state.get("pending"):          # an earlier parallel session's submissions: let them finish first
            self.emit("error", message=f"waiting for experiments submitted earlier: {state['pending']}")
            await self.call("wait", {"ids": state["pending"], "timeout_s": 3600})
            summary = (await self.call("state_read", {"view": "summary"}))["summary"]
        stopped = await self._resume(summary)   # a retest or score left by an earlier one-at-a-time session
        if stopped is not None:
            return stopped
        if summary["baseline_val_bpb"] is None:
            self.emit("experiment_start", number=0, description="baseline", category="baseline")
            t0 = time.monotonic()
            sub = await self.call("submit_experiment", {"description": "baseline", "hypothesis":
                                  "the unmodified train.py, measured on several seeds"})
            await self._wait_for([sub["experiment_id"]])
            seconds = time.monotonic() - t0
            noise = (await self.call("state_read", {"view": "noise"}))["noise"] or {}
            samples = noise.get("baseline_samples") or []
            self.durations.append(seconds)
            self.emit("baseline", seconds=seconds, result={"val_bpb": noise.get("baseline_mean"), "baseline": {
                "mean": noise.get("baseline_mean"), "samples": samples, "sigma": noise.get("sigma"),
                "keep_threshold": noise.get("keep_threshold")}})
        submitted, errors, why = 0, 0, None
        while True:
            while why is None and len(self.flights) < self.parallel:
                if n is not None and submitted >= n:
                    why = f"ran the {n} experiment(s) asked for"
                    break
                try:
                    why = await self._submit_next(submitted + 1)
                    errors = 0
                except ToolFailed as e:
                    await self._restore()
                    if "budget is spent" in e.message or "budget has room" in e.message:
                        why = "budget: " + e.message
                        break
                    errors += 1
                    self.emit("error", message=str(e))
                    if errors >= 3:
                        if not self.flights:
                            raise AgentError(f"three tool errors in a row, last: {e}") from None
                        why = f"three tool errors in a row, last: {e.message[:200]}"
                    break
                if why is None:
                    submitted += 1
                    self.done = submitted
            if not self.flights:
                return self._stop(why or "no untried change of the tunable constants is left")
            await self._wait_for(list(self.flights), any_one=True)

    async def _submit_next(self, number: int) -> Optional[str]:
        """Propose, write and submit one candidate; a reason to stop submitting, or None."""
        budget = await self.call("budget_check")
        if budget["should_stop"]:
            return "budget: " + "; ".join(budget["reasons"])
        need = self._would_overrun()
        if need is not None:
            return f"session time budget: the next experiment (~{need:.0f} s) would not finish in time"
        await self.call("revert")     # train.py = the best now (a keep may have moved it)
        busy = {f.edit.name for f in self.flights.values()}
        edit = await self._next_edit(busy)
        if edit is None:
            await self._restore()
            return None if self.flights else "no untried change of the tunable constants is left"
        try:
            sub = await self.call("submit_experiment", {"description": edit.description, "hypothesis": edit.hypothesis,
                                                        "change": edit.change()})
        except ToolFailed as e:
            if "exact repeat" in e.message or "only touches the random seed" in e.message:
                self.planner.record(edit, "refused")
                self.emit("skip", description=edit.description, reason=e.message)
                return None
            raise
        self.flights[sub["experiment_id"]] = _Flight(edit, number, time.monotonic())
        self.emit("experiment_start", number=number, description=edit.description, category=edit.category,
                  in_flight=len(self.flights))
        return None

    async def _wait_for(self, ids: list[int], any_one: bool = False) -> None:
        """wait() for the ids (with any_one: wait() without ids, which returns every decision not handed over
        yet, also one decided inside submit_experiment or state_read), then record every decided result."""
        while True:
            res = await self.call("wait", {"ids": None if any_one else ids, "timeout_s": 600})
            decided = [r for r in res.get("results", []) if r.get("state") == "decided"]
            for r in decided:
                self._decided(r)
            if not any(i in self.flights for i in ids):
                return
            if any_one and (decided or not res.get("in_flight")):
                return
            if not any_one and not res.get("timed_out"):
                return

    def _decided(self, r: dict) -> None:
        fl = self.flights.pop(r["experiment_id"], None)
        if fl is None:
            return
        failed = r["status"] not in ("ok", "lost", "interrupted")
        verdict = r.get("verdict") or "discard"
        self.planner.record(fl.edit, "crash" if failed else verdict if verdict in ("keep", "discard") else "discard")
        seconds = time.monotonic() - fl.started
        self.durations.append(seconds)
        att = Attempt(fl.number, r["experiment_id"], fl.edit.description, r["status"], verdict, r.get("val_bpb"),
                      seconds)
        self.attempts.append(att)
        self.emit("verdict", score={"verdict": verdict, "gain": -(r.get("delta_vs_best") or 0.0), "threshold": None,
                                    "best_val_bpb": r.get("val_bpb") if verdict == "keep" else None,
                                    "reason": r.get("reason")})
        self.emit("experiment_end", attempt=att, result={**r, "in_flight": len(self.flights)})

    async def _replay_history(self) -> None:
        """Resume instead of restart: feed this agent's earlier experiments back into the planner."""
        hist = await self.call("state_read", {"view": "history", "limit": 500})
        for row in sorted(hist.get("experiments", []), key=lambda r: r["id"]):
            change = row.get("change")
            if not change or row["is_baseline"] or row["confirm_of"] is not None:
                continue
            old, new = change["old"], change["new"]
            if not all(isinstance(v, (bool, int, float)) for v in (old, new)):
                continue   # another agent's change of a setting that is not a number: not this planner's
            if row["status"] in ("crash", "timeout", "rejected"):
                outcome = "crash"
            elif row["verdict"] in ("keep", "discard"):
                outcome = row["verdict"]
            else:
                continue
            self.planner.observe(change["name"], old, new, outcome)

    async def _restore(self) -> None:
        try:
            await self.call("revert")
        except ToolFailed:
            pass

    async def _next_edit(self, busy: Iterable[str] = ()) -> Optional[Edit]:
        for _ in range(12):
            source = self.train.read_text(encoding="utf-8")
            category, preferred, steered = None, [], False
            if self.mechanisms:
                sug = await self.call("suggest_next")
                category, preferred = sug.get("category"), list(sug.get("parameters", []))
                category, preferred, steered = _follow_trial(sug, category, preferred)
                self.emit("suggestion", suggestion=sug)
            edit = self.planner.propose(source, category, preferred, busy=busy, steered=steered)
            if edit is None:
                return None
            self.train.write_text(edit.source, encoding="utf-8")
            if not self.mechanisms:
                return edit
            check = await self.call("suggest_next")   # tabu: is the edited file (nearly) a tried one?
            if check["tabu_status"] in ("exact_repeat", "near_repeat"):
                self.planner.record(edit, "tabu")
                self.train.write_text(source, encoding="utf-8")
                self.emit("skip", description=edit.description, reason=(check["warnings"] or ["tabu"])[0])
                continue
            return edit
        return None

    async def _experiment(self, edit: Edit, number: int) -> None:
        t0 = time.monotonic()
        self.emit("experiment_start", number=number, description=edit.description, category=edit.category)
        res = await self.call("run_experiment", {"description": edit.description, "hypothesis": edit.hypothesis,
                                                 "change": edit.change()}, progress=True)
        runs = len(res.get("pairs") or []) + int(res.get("reference_runs") or 0)
        if runs:
            self.run_seconds.append((time.monotonic() - t0) / runs)
        eid = res["experiment_id"]
        verdict = None
        if res["status"] == "ok":
            verdict = await self._settle(eid, confirm=False)
        if res["status"] != "pending_approval":   # held for a person (approve-runs): nothing was learned
            self.planner.record(edit, "crash" if res["status"] != "ok" else verdict or "discard")
        seconds = time.monotonic() - t0
        self.durations.append(seconds)
        att = Attempt(number, eid, edit.description, res["status"], verdict or "discard", res.get("val_bpb"),
                      seconds, list(res.get("warnings") or []))
        self.attempts.append(att)
        self.emit("experiment_end", attempt=att, result=res)
        if verdict == "keep":
            await self._note("lesson", eid, f"{edit.description} was kept: {edit.hypothesis}.")
        elif res["status"] != "ok":
            await self._note("dead_end", eid, f"{edit.description} failed ({(res.get('reason') or res['status'])[:300]}).")

    async def _note(self, kind: str, eid: int, text: str) -> None:
        try:
            await self.call("note", {"kind": kind, "experiment_id": eid, "text": text})
            self.emit("note", kind=kind, text=text)
        except ToolFailed as e:   # a lost note is a pity, not a reason to stop
            self.emit("error", message=str(e))

    async def _settle(self, eid: int, confirm: bool) -> Optional[str]:
        """Score an experiment; on 'retest', confirm it on fresh seeds until the verdict is final."""
        if confirm and not await self._confirm(eid):
            return "discard"
        while True:
            sc = await self.call("score", {"experiment_id": eid})
            self.emit("verdict", score=sc)
            if sc["verdict"] != "retest":
                return sc["verdict"]
            if self._would_overrun(2) is not None:   # a confirm: the candidate and the best on a fresh seed
                self.emit("deferred", experiment_id=eid, reason="the confirm runs would not finish in time")
                return "retest"   # left pending: the next session settles it before anything else
            if not await self._confirm(eid):
                return "discard"   # a failed confirm run discards the candidate (the engine did so)

    def _would_overrun(self, runs: Optional[int] = None) -> Optional[float]:
        """The estimated seconds of the next experiment (or confirm) when it would end after the session's
        deadline, else None. The estimate is the recent experiments' median duration, or, when the engine
        says how many runs the next one takes at most (`runs`: budget_check's next_experiment_runs, 2 for a
        confirm), that many runs at the recent time per run if that is longer: a candidate that starts a
        fresh seed set first re-measures the best on it, and early-stopped candidates (one run) must not
        make the estimate forget that (a demo once ran 378 s of its 360)."""
        if self.deadline is None or not self.durations or self.done < self.min_experiments:
            return None
        need = statistics.median(self.durations[-5:])
        if runs and self.run_seconds:
            need = max(need, runs * statistics.median(self.run_seconds[-5:]))
        return need if time.monotonic() + need > self.deadline else None

    async def _confirm(self, eid: int) -> bool:
        self.emit("experiment_start", number=None, description=f"confirm #{eid}", category="confirm")
        res = await self.call("run_experiment", {"description": f"confirm #{eid}", "confirm_of": eid},
                              progress=True)
        self.emit("confirm_end", result=res)
        return res["status"] == "ok"


def _follow_trial(sug: dict, category: Optional[str], preferred: list[str]) -> tuple[Optional[str], list[str], bool]:
    """(category, preferred, steered): a runtime mechanism on trial ('active') that advises a category or
    constants steers the move from the first one on, ahead of the built-in advice (its trial window is
    decided on these experiments)."""
    active = [m for m in sug.get("mechanisms") or [] if m.get("status") == "active" and not m.get("error")
              and (m.get("category") or m.get("parameters"))]
    if not active:
        return category, preferred, False
    first = [p for m in active for p in m.get("parameters") or []]
    return active[0].get("category") or category, list(dict.fromkeys(first + preferred)), True


async def run_session(workspace: Path | str, n: Optional[int] = None, wall_seconds: Optional[float] = None,
                      mechanisms: bool = True, seed: int = 0, observer: Optional[Observer] = None,
                      deadline: Optional[float] = None, planner: Optional[Planner] = None,
                      parallel: Optional[int] = None, min_experiments: int = 0) -> SessionResult:
    """One built-in agent session against `loopwright serve` over stdio.

    n: experiments to run (None: until budget_check says stop); wall_seconds / deadline (monotonic):
    no experiment starts that would not finish in time; seed: the planner's random choices; parallel:
    candidates in flight at once (1: run_experiment + score, one at a time; more: submit_experiment +
    wait on the workspace's executor); min_experiments: the deadline stops nothing before this many have
    run (the demo's floor: a busy machine takes longer, it does not show less)."""
    from mcp import Client
    from mcp.client.stdio import stdio_client

    from mcp_server.loop.workspace import Workspace

    ws = Workspace.find(workspace)
    if n is not None and n < 0:
        raise ValueError("-n must be >= 0")
    parallel, asynchronous = session_mode(ws.cfg.executor, parallel)
    t0 = time.monotonic()
    if wall_seconds is not None:
        deadline = min(deadline or math.inf, t0 + wall_seconds)
    log_dir = ws.state_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    # The server's own log goes to a file: on the terminal it would tear through the live display.
    log_path = log_dir / f"builtin-serve-{time.strftime('%Y%m%d-%H%M%S')}.log"
    with open(log_path, "a", encoding="utf-8") as errlog:
        try:
            async with Client(stdio_client(server_params(ws.root), errlog=errlog)) as client:
                agent = BuiltinAgent(client, ws.root / ws.cfg.paths.editable[0], planner or Planner(seed),
                                     mechanisms, observer, parallel=parallel, asynchronous=asynchronous)
                agent.min_experiments = min_experiments
                reason = await agent.run(n, deadline)
                final = (await agent.call("state_read", {"view": "summary"}))["summary"]
        except Exception as e:  # the client's task group wraps what went wrong: show the cause itself
            inner = _unwrap(e)
            if isinstance(inner, (AgentError, ToolFailed)):
                raise AgentError(str(inner)) from None
            if inner is not e:
                raise AgentError(f"the MCP session failed: {type(inner).__name__}: {inner} "
                                 f"(server log: {log_path})") from inner
            raise
    return SessionResult(ws.root, agent.attempts, reason, final["baseline_val_bpb"], final["best_val_bpb"],
                         time.monotonic() - t0)


def session_mode(executor: Any, parallel: Optional[int] = None) -> tuple[int, bool]:
    """(candidates in flight, asynchronous?) for a session on a workspace whose `[executor]` settings are
    `executor`. parallel None: the settings' `parallel`. Asynchronous (submit_experiment + wait) with more
    than one in flight or when the executor is not this machine; otherwise one experiment at a time with
    run_experiment + score, exactly as before executors existed."""
    n = executor.parallel if parallel is None else parallel
    if n < 1:
        raise ValueError(f"--parallel {n}: it must be at least 1 (1 = one experiment at a time)")
    return n, n > 1 or executor.kind != "local"


def _unwrap(e: BaseException) -> BaseException:
    while hasattr(e, "exceptions") and len(e.exceptions) == 1:
        e = e.exceptions[0]
    return e


def run_builtin(workspace: Path | str, **kw: Any) -> SessionResult:
    return anyio.run(lambda: run_session(workspace, **kw))
