"""Expanded arguments (Arg), brace expansion and GNU-style option parsing, shared by the
walker and the command handlers."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass


class Denied(Exception):
    """Raised on the first forbidden effect; the message is the reason shown to the agent."""



@dataclass(frozen=True)
class Arg:
    """One expanded argument. kind: 'static' (exact), 'glob' (unquoted wildcards; text is a glob
    pattern with quoted parts escaped) or 'dynamic' (text is an fnmatch pattern, '*' where a value
    is unknown until run time)."""
    text: str
    kind: str = "static"
    src: str = ""              # the word as written (for messages about dynamic values)

    def derive(self, text: str) -> "Arg":
        return Arg(text, self.kind)

    @property
    def shown(self) -> str:
        return self.src or self.text


GLOB_CHARS = re.compile(r"[*?\[]")                          # an unquoted word with these is a glob
ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\+?=")   # NAME=value / NAME+=value


def brace_expand(s: str, limit: int = 64) -> list[str]:
    """bash {a,b} and {1..3} on an unquoted fragment (enough for paths; capped)."""
    depth, start = 0, -1
    for i, c in enumerate(s):
        if c == "{":
            if depth == 0:
                start = i
            depth += 1
        elif c == "}" and depth:
            depth -= 1
            if depth == 0:
                inner, pre, post = s[start + 1:i], s[:start], s[i + 1:]
                alts = _split_top(inner)
                if len(alts) == 1:
                    m = re.fullmatch(r"(-?\d+)\.\.(-?\d+)|([A-Za-z])\.\.([A-Za-z])", inner)
                    if not m:
                        return [pre + "{" + inner + "}" + x for x in brace_expand(post, limit)]
                    if m.group(1) is not None:
                        a, b = int(m.group(1)), int(m.group(2))
                        step = 1 if b >= a else -1
                        alts = [str(v) for v in range(a, b + step, step)[:limit]]
                    else:
                        a, b = ord(m.group(3)), ord(m.group(4))
                        step = 1 if b >= a else -1
                        alts = [chr(v) for v in range(a, b + step, step)[:limit]]
                out = []
                for alt in alts:
                    for tail in brace_expand(alt + post, limit):
                        out.append(pre + tail)
                        if len(out) >= limit:
                            return out
                return out
    return [s]


def _split_top(s: str) -> list[str]:
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for c in s:
        if c == "," and depth == 0:
            out.append("".join(cur))
            cur = []
            continue
        depth += c == "{"
        depth -= c == "}"
        cur.append(c)
    out.append("".join(cur))
    return out


# --------------------------------------------------------------------------- option parsing

def parse_opts(args: list, short_val: str = "", long_val: tuple = (), first_positional_stops: bool = False):
    """GNU-style options: ([(name, Arg|None)], [positional Args]). '--' ends options."""
    opts: list = []
    pos: list = []
    i = 0
    while i < len(args):
        a = args[i]
        t = a.text
        if t == "--":
            pos.extend(args[i + 1:])
            break
        if t.startswith("--") and len(t) > 2:
            name, eq, val = t.partition("=")
            if eq:
                opts.append((name, a.derive(val)))
            elif name in long_val and i + 1 < len(args):
                opts.append((name, args[i + 1]))
                i += 1
            else:
                opts.append((name, None))
        elif t.startswith("-") and len(t) > 1:
            for j in range(1, len(t)):
                ch = t[j]
                if ch in short_val:
                    if t[j + 1:]:
                        opts.append(("-" + ch, a.derive(t[j + 1:])))
                    elif i + 1 < len(args):
                        opts.append(("-" + ch, args[i + 1]))
                        i += 1
                    else:
                        opts.append(("-" + ch, None))
                    break
                opts.append(("-" + ch, None))
        else:
            pos.append(a)
            if first_positional_stops:
                pos.extend(args[i + 1:])
                break
        i += 1
    return opts, pos


def has_option(opts, *names) -> bool:
    """Whether parse_opts' `opts` hold any of the option `names` (e.g. "-r", "--recursive")."""
    return any(n in names for n, _ in opts)


def option_values(opts, *names) -> list:
    """The values (Args) given to any of the option `names` in parse_opts' `opts`, in order."""
    return [v for n, v in opts if n in names and v is not None]



def literal_text(arg: Arg) -> str:
    """The command name as written, without its directory ("" when the name is not static)."""
    return os.path.basename(arg.text) if arg.kind == "static" else ""



def operand_index(args: list, with_value: set, start: int = 1) -> int:
    """Index of the first non-option argument (wrapped command) after simple options."""
    i = start
    while i < len(args):
        t = args[i].text
        if t == "--":
            return i + 1
        if not t.startswith("-") or t == "-":
            return i
        if t in with_value:
            i += 1
        i += 1
    return i

