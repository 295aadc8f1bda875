"""What a train.py's tunable constants are, read with `ast` (never from a hard-coded list).

A tunable constant is a top-level `NAME = <int|float|bool literal>` with an
UPPER_CASE name that does not look operational (printing, seeds, step caps,
evaluation size, compilation switches). Each belongs to a *category* of change,
guessed from its name, so the mechanisms can reason about "what kind of change
was this" for any train.py, not just the bundled one.
"""
from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from functools import lru_cache
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
    ("schedule", _words("WARMUP", "WARMDOWN", "COOLDOWN", "SCHEDULE", "ANNEAL", "MIN_LR", "FINAL_LR", "LR_DECAY")),
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


def all_constants(source: str) -> list[Constant]:
    """Every top-level UPPER_CASE assignment of a bool/int/float literal, in file order."""
    tree = ast.parse(source)
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
        if value is None or value_node.end_lineno != value_node.lineno:
            continue
        line = lines[value_node.lineno - 1]
        col = _char_col(line, value_node.col_offset)
        end = _char_col(line, value_node.end_col_offset)
        kind = "bool" if isinstance(value, bool) else "int" if isinstance(value, int) else "float"
        out.append(Constant(target.id, value, kind, value_node.lineno, col, end, line[col:end],
                            _comment(line[end:]), category_of(target.id)))
    return out


def _comment(rest: str) -> str:
    i = rest.find("#")
    return rest[i + 1:].strip() if i >= 0 else ""


def tunable_constants(source: str) -> list[Constant]:
    """The constants a search may change (operational ones filtered out by DENY_RE)."""
    return [c for c in all_constants(source) if not DENY_RE.search(c.name)]


def constant_values(source: str) -> dict[str, Value]:
    """name -> value of the tunable constants; {} if the file does not parse."""
    return dict(_values(source))


@lru_cache(maxsize=4096)   # mechanisms compare every tried version on each call: parse each once
def _values(source: str) -> tuple[tuple[str, Value], ...]:
    try:
        return tuple((c.name, c.value) for c in tunable_constants(source))
    except SyntaxError:
        return ()


@lru_cache(maxsize=4096)
def skeleton(source: str) -> str:
    """The code with comments, layout and tunable literals removed: two versions with the same
    skeleton differ only in constant values (or in comments and whitespace)."""
    try:
        spans = {c.line: (c.col, c.end_col) for c in tunable_constants(source)}
        toks = []
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                            tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER):
                continue
            span = spans.get(tok.start[0])
            if span and span[0] <= tok.start[1] < span[1]:
                if tok.start[1] == span[0]:
                    toks.append("<K>")   # a negative literal is two tokens; both become one <K>
                continue
            toks.append(tok.string)
        return " ".join(toks)
    except (SyntaxError, tokenize.TokenError, IndentationError):
        return source


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
