"""An experiment's structured change ({"name", "old", "new"}): checked before anything runs, so what the
ledger records as the change is what train.py shows."""
from __future__ import annotations

from typing import Any, Optional

from pydantic import ValidationError

from mcp_server.loop.errors import LoopError
from mcp_server.loop.models import Change
from mcp_server.mechanisms.source import Constant, all_constants


def as_change(value: Any) -> Optional[Change]:
    """A Change from what a caller passed (a Change, a {name, old, new} mapping or None), or a LoopError that
    says what is wrong."""
    if value is None or isinstance(value, Change):
        return value
    try:
        return Change.model_validate(value)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'change'}: {err['msg']}"
                             for err in e.errors())
        raise LoopError(f"change {value!r} is not valid ({problems}). Give it as "
                        '{"name": "LR", "old": 0.004, "new": 0.008}: the constant of train.py you changed, '
                        "its value at the best version and its value now") from None


def _matches(given: Any, c: Optional[Constant]) -> bool:
    if c is None:
        return False
    if isinstance(given, str):   # a value given as text: as it is written in train.py
        return given.strip() == c.text
    if isinstance(given, bool) or isinstance(c.value, bool):
        return given is c.value  # True is not 1
    return bool(given == c.value)   # 8 and 8.0 are one number


def check_against(change: Change, before: Optional[bytes], after: Optional[bytes], rel: str) -> None:
    """Refuse a change that names one of train.py's literal constants with values the file does not have
    (before: the best version, after: what runs). A name that is no literal constant of either version (a
    string setting, say) is the agent's own label and is recorded as given."""
    def constants(data: Optional[bytes]) -> dict[str, Constant]:
        try:
            return {c.name: c for c in all_constants((data or b"").decode("utf-8", "replace"))}
        except SyntaxError:
            return {}

    old, new = constants(before).get(change.name), constants(after).get(change.name)
    if old is None and new is None:
        return
    if not (_matches(change.old, old) and _matches(change.new, new)):
        def shown(c: Optional[Constant]) -> str:
            return f"{change.name} = {c.text}" if c is not None else f"no {change.name}"

        raise LoopError(f"change says {change.name} {change.old!r} -> {change.new!r}, but {rel} has "
                        f"{shown(old)} at the best version and {shown(new)} now; give the values as they are "
                        "(or leave change out)")
