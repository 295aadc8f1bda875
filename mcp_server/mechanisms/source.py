"""What a train.py's tunable constants are, read with `ast` (never from a hard-coded list).

A tunable constant is a top-level `NAME = <int|float|bool literal>` with an
UPPER_CASE name that does not look operational (printing, seeds, step caps,
evaluation size, compilation switches). Each belongs to a *category* of change,
guessed from its name, so the mechanisms can reason about "what kind of change
was this" for any train.py, not just the bundled one.
"""
from __future__ import annotations

import ast
import hashlib
import re
import types
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional, Union

Value = Union[bool, int, float]

NAME_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")


def _words(*alternatives: str) -> re.Pattern:
    """Match whole '_'-separated words of a name (EPS must not match STEPS, LOG not LOGIT)."""
    return re.compile(r"(?:^|_)(?:" + "|".join(alternatives) + r")(?=_|$|\d)")


# Constants that change what is printed or measured, not what is learned.
DENY_RE = _words("PRINT", "LOG", "LOGGING", "EVERY", "SEED", "MAX_STEPS", "EVAL", "COMPILE", "VERBOSE", "DEBUG",
                 "SAVE", "CHECKPOINT", "DEVICE", "THREADS", "WORKERS", "PROFILE")

# Checked in order: the first pattern that matches a name decides its category.
CATEGORY_PATTERNS: tuple[tuple[str, re.Pattern], ...] = (
    # checkpoint averaging (AVERAGE, EMA, SWA) acts on the run's end, like the decay of its schedule
    ("schedule", _words("WARMUP", "WARMDOWN", "COOLDOWN", "SCHEDULE", "ANNEAL", "MIN_LR", "FINAL_LR", "LR_DECAY",
                        "AVERAGE", "EMA", "SWA")),
    ("regularisation", _words("WEIGHT_DECAY", "WD", "DROPOUT", "DROP", "CLIP", "LABEL_SMOOTHING", "SMOOTHING",
                              "SOFTCAP", "Z_LOSS")),
    ("batch", _words("BATCH", "BATCH_SIZE", "ACCUM", "GRAD_ACCUM", "MICRO", "SEQ_LEN", "CONTEXT", "TOKENS_PER")),
    ("architecture", _words("DEPTH", "LAYERS?", "D_MODEL", "DIM", "WIDTH", "HEADS?", "MLP", "HIDDEN", "EMBD",
                            "RATIO", "QK_NORM", "NORM", "ROPE", "ROTARY", "KV")),
    ("optimizer", _words("LR", "LEARNING_RATE", "BETA", "MOMENTUM", "EPS", "EPSILON", "MUON", "ADAM", "ADAMW",
                         "OPTIM", "OPTIMIZER", "NESTEROV")),
)
CATEGORIES = tuple(c for c, _ in CATEGORY_PATTERNS) + ("other",)


def category_of(name: str) -> str:
    for cat, pat in CATEGORY_PATTERNS:
        if pat.search(name):
            return cat
    return "other"


@dataclass(frozen=True)
class Constant:
    name: str
    value: Value
    kind: str            # "int" | "float" | "bool"
    line: int            # 1-based line of the literal
    col: int             # character offsets of the literal (including a leading minus sign)
    end_col: int
    text: str            # the literal as written
    comment: str         # the line's trailing comment, without '#'
    category: str


def _literal(node: ast.AST) -> Optional[Value]:
    if isinstance(node, ast.Constant) and isinstance(node.value, (bool, int, float)):
        return node.value
    if (isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd))
            and isinstance(node.operand, ast.Constant) and isinstance(node.operand.value, (int, float))
            and not isinstance(node.operand.value, bool)):
        v = node.operand.value
        return -v if isinstance(node.op, ast.USub) else v
    return None


def _char_col(line: str, byte_col: int) -> int:
    # ast offsets are UTF-8 byte offsets; string slicing needs characters
    return len(line.encode("utf-8")[:byte_col].decode("utf-8", "replace"))


@dataclass(frozen=True)
class _Parsed:
    constants: tuple[Constant, ...]
    skeleton: str
    error: Optional[SyntaxError] = None


# Mechanisms compare every tried version on each call: each version is parsed once per process
# (and, through export/import_analysis, once per workspace).
_CACHE: "OrderedDict[str, _Parsed]" = OrderedDict()
_CACHE_MAX = 4096


def _parse(source: str) -> _Parsed:
    hit = _CACHE.get(source)
    if hit is None:
        hit = _CACHE[source] = _analyse(source)
        if len(_CACHE) > _CACHE_MAX:
            _CACHE.popitem(last=False)
    return hit


def _analyse(source: str) -> _Parsed:
    """One ast.parse: the constants, and a fingerprint of the code with the tunable values taken out."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return _Parsed((), source, e)
    lines = source.splitlines()
    out: list[Constant] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value_node = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value_node = node.target, node.value
        else:
            continue
        if not isinstance(target, ast.Name) or not NAME_RE.match(target.id):
            continue
        value = _literal(value_node)
        if value is None or value_node.end_lineno != value_node.lineno or value_node.end_col_offset is None:
            continue   # (a parsed expression always has its end column; the check is for the type)
        line = lines[value_node.lineno - 1]
        col = _char_col(line, value_node.col_offset)
        end = _char_col(line, value_node.end_col_offset)
        kind = "bool" if isinstance(value, bool) else "int" if isinstance(value, int) else "float"
        c = Constant(target.id, value, kind, value_node.lineno, col, end, line[col:end],
                     _comment(line[end:]), category_of(target.id))
        out.append(c)
        if not DENY_RE.search(c.name):   # the skeleton leaves tunable values out
            node.value = ast.copy_location(ast.Constant("<K>"), value_node)
    _blank_docstrings(tree)
    # Bytecode has no comments or layout, and hashing it is far cheaper than ast.dump.
    h = hashlib.sha1()
    _fingerprint(compile(tree, "<train.py>", "exec", dont_inherit=True), h)
    return _Parsed(tuple(out), h.hexdigest())


def _blank_docstrings(node: ast.AST) -> None:
    body = getattr(node, "body", None)
    if not isinstance(body, list):
        return
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body[0].value.value = ""
    for child in body:
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            _blank_docstrings(child)


def _fingerprint(code: types.CodeType, h) -> None:
    h.update(code.co_code)
    h.update(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars)).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _fingerprint(const, h)
        else:
            h.update(repr(const).encode())


def export_analysis(source: str) -> Optional[dict]:
    """The parsed form of a version, JSON-able (None if it does not parse), for a cache on disk."""
    p = _parse(source)
    if p.error is not None:
        return None
    return {"skeleton": p.skeleton, "constants": [c.__dict__ for c in p.constants]}


def import_analysis(source: str, data: dict) -> None:
    """Seed the cache with an analysis exported earlier for exactly this source."""
    if source not in _CACHE:
        _CACHE[source] = _Parsed(tuple(Constant(**c) for c in data["constants"]), data["skeleton"])


def all_constants(source: str) -> list[Constant]:
    """Every top-level UPPER_CASE assignment of a bool/int/float literal, in file order.
    Raises SyntaxError if the file does not parse."""
    parsed = _parse(source)
    if parsed.error is not None:
        raise parsed.error
    return list(parsed.constants)


def _comment(rest: str) -> str:
    i = rest.find("#")
    return rest[i + 1:].strip() if i >= 0 else ""


def tunable_constants(source: str) -> list[Constant]:
    """The constants a search may change (operational ones filtered out by DENY_RE)."""
    return [c for c in all_constants(source) if not DENY_RE.search(c.name)]


def constant_values(source: str) -> dict[str, Value]:
    """name -> value of the tunable constants; {} if the file does not parse."""
    return {c.name: c.value for c in _parse(source).constants if not DENY_RE.search(c.name)}


def skeleton(source: str) -> str:
    """A fingerprint of the code without comments, layout, docstrings and tunable values: two versions
    with the same skeleton differ only in constant values (or in comments and whitespace).
    A file that does not parse is its own skeleton."""
    return _parse(source).skeleton


def changed_constants(old: str, new: str) -> dict[str, tuple[Optional[Value], Optional[Value]]]:
    """Tunable constants whose value differs between two versions: name -> (old, new)."""
    a, b = constant_values(old), constant_values(new)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b), key=lambda k: k)
            if a.get(k) != b.get(k) or type(a.get(k)) is not type(b.get(k))}


def relative_gap(a: Optional[Value], b: Optional[Value]) -> float:
    """How far apart two constant values are: 0 = equal, 1+ = unrelated."""
    if a is None or b is None or isinstance(a, bool) or isinstance(b, bool):
        return 0.0 if a == b else float("inf")
    if a == b:
        return 0.0
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale
