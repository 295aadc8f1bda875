"""The report's and Slack's view of the outer loop: which mechanisms were tried, which are active,
which were reverted and why, and the campaign's gain per mechanism era (a trial window is an era;
experiments outside every window form the 'built-in only' era)."""
from __future__ import annotations

from typing import Optional

from mcp_server.mechanisms.base import history_from_rows
from mcp_server.mechanisms.trial import Obs, observations


def _md(text: str) -> str:
    return str(text or "").replace("|", "\\|").replace("\n", " ")


def eras(trials: list[dict], obs: list[Obs]) -> list[dict]:
    """One row per trial window, plus the experiments no trial covered."""
    covered: set[int] = set()
    out = []
    for t in trials:
        end = t["end_experiment_id"]
        window = [o for o in obs if o.id > t["start_experiment_id"] and (end is None or o.id <= end)]
        if end is None:
            window = window[: t["window"]]
        covered |= {o.id for o in window}
        out.append(_era(f"{t['name']} v{t['version']}", t["outcome"], window))
    rest = [o for o in obs if o.id not in covered]
    if rest:
        out.insert(0, _era("built-in mechanisms only", "", rest))
    return out


def _era(label: str, outcome: str, window: list[Obs]) -> dict:
    hours = sum(o.hours for o in window)
    gain = sum(o.gain for o in window)
    return {"era": label, "outcome": outcome, "experiments": len(window), "kept": sum(o.kept for o in window),
            "gain": gain, "hours": hours, "gain_per_hour": gain / hours if hours > 0 else None}


def section(ledger, campaign_id: int, rows: Optional[list[dict]] = None) -> list[str]:
    """Markdown lines for the report ([] when no mechanism was ever proposed in this workspace)."""
    mechs = ledger.mechanisms()
    if not mechs:
        return []
    rows = rows if rows is not None else ledger.experiments(campaign_id)
    trials = ledger.trials(campaign_id)
    history = history_from_rows(rows, lambda commit: "")
    obs = observations(history, rows)
    L = ["## Search mechanisms (outer loop)", ""]
    in_use = [m for m in mechs if m["status"] in ("active", "kept")]
    L.append("In use: " + (", ".join(f"{m['name']} v{m['version']} ({'on trial' if m['status'] == 'active' else 'kept'})"
                                     for m in in_use) or "the built-in ones only (tabu, plateau, bandit)") + ".")
    L += ["", "| mechanism | by | status | why |", "|---|---|---|---|"]
    for m in mechs:
        L.append(f"| {m['name']} v{m['version']} | {_md(m['author'])} | {m['status']} | {_md((m['reason'] or '')[:220])} |")
    L += ["", "Gain per mechanism era (improvement of the best val_bpb; windows of experiments):", "",
          "| era | outcome | experiments | kept | gain | gain / hour |", "|---|---|---|---|---|---|"]
    for e in eras(trials, obs):
        gph = "—" if e["gain_per_hour"] is None else f"{e['gain_per_hour']:.4f}"
        L.append(f"| {_md(e['era'])} | {e['outcome'] or '—'} | {e['experiments']} | {e['kept']} | "
                 f"{e['gain']:.4f} | {gph} |")
    L.append("")
    return L
