"""Small formatting helpers shared by the sinks (payloads may lack any key)."""
from __future__ import annotations

from typing import Optional


def num(x, spec: str = ".4f") -> str:
    try:
        return format(float(x), spec)
    except (TypeError, ValueError):
        return "n/a"


def keep_deltas(p: dict) -> tuple[Optional[float], Optional[float]]:
    """(delta vs previous best, delta vs baseline) of a keep payload, derived when not given."""
    def delta(given, ref):
        if given is not None:
            return given
        try:
            return float(p["val_bpb"]) - float(ref)
        except (KeyError, TypeError, ValueError):
            return None
    return delta(p.get("delta_vs_best"), p.get("previous_best")), delta(p.get("delta_vs_baseline"), p.get("baseline"))


def join(items, sep: str = ", ") -> str:
    """A list payload field as text (tolerates a plain string)."""
    return sep.join(map(str, items)) if isinstance(items, (list, tuple)) else str(items or "")


def as_shown(p: dict) -> dict:
    """A keep payload with its scores as the user's metric reads them: a target's maximised metric is stored
    negated (`sign` -1), so its values and deltas flip back; `metric` names it (val_bpb when absent)."""
    sign = p.get("sign", 1.0)
    if sign == 1.0:
        return p
    out = dict(p)
    for key in ("val_bpb", "previous_best", "baseline", "delta_vs_best", "delta_vs_baseline"):
        if isinstance(out.get(key), (int, float)):
            out[key] = out[key] * sign
    return out
