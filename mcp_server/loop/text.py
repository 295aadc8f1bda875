"""Cleaning agent-written text before it is stored or shown (descriptions, notes).

An agent controls these strings: a 1 MB description with NUL bytes, ANSI escapes
(which can rewrite a human's terminal) or Rich markup would otherwise be stored
and rendered raw. Stored text is capped and stripped of control characters;
renderers escape markup (`for_rich`).
"""
from __future__ import annotations

import re
import unicodedata

MAX_DESCRIPTION = 300
MAX_NOTE = 4000

# CSI / OSC / two-character escape sequences
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])|\x9b[0-?]*[ -/]*[@-~]")


def clean(text: object, limit: int, single_line: bool = True) -> str:
    """Drop escape sequences and control/format characters (NUL, bidi overrides ...), normalise
    whitespace, cap at `limit` characters (an ellipsis marks a cut)."""
    s = _ANSI.sub("", str(text or ""))
    keep = "\t" if single_line else "\t\n"
    out = []
    for ch in s:
        if ch in keep or ch == "\n":
            out.append(" " if (single_line or ch == "\t") else ch)
        elif unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn"):
            continue
        else:
            out.append(ch)
    s = "".join(out)
    s = re.sub(r"[ \u00a0]+", " ", s) if single_line else re.sub(r"[ \t]+\n", "\n", s)
    s = s.strip()
    if len(s) > limit:
        s = s[:limit - 1].rstrip() + "…"
    return s


def for_rich(text: object, limit: int = MAX_DESCRIPTION) -> str:
    """Safe to print with Rich: cleaned, then markup escaped."""
    from rich.markup import escape

    return escape(clean(text, limit))
