"""results.tsv in autoresearch's columns (commit val_bpb memory_gb status description), extras after."""
from __future__ import annotations

from mcp_server.ledger.store import Ledger

COLUMNS = ("commit", "val_bpb", "memory_gb", "status", "description",
           "experiment_id", "verdict", "seed", "test_bpb", "confirm_of", "hypothesis", "reason")


def _status(r: dict) -> str:
    # autoresearch's status column is keep|discard|crash; ours maps onto it.
    if r["status"] in ("crash", "timeout", "rejected", "interrupted"):
        return "crash"
    if r["is_baseline"] or r["role"] == "reference":
        return "keep"   # a (re-)measurement of the kept best, not a new candidate
    return r["verdict"] or "pending"


def _role_or_status(r: dict) -> str:
    # a run with no verdict of its own: a reference run says so, a finished candidate shows its status
    return "reference" if r["role"] == "reference" and r["status"] == "ok" else r["status"]


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6f}"
    return str(v).replace("\t", " ").replace("\n", " ")


def export_tsv(ledger: Ledger, campaign_id: int) -> str:
    lines = ["\t".join(COLUMNS)]
    for r in ledger.experiments(campaign_id):
        row = [(r["commit_sha"] or "")[:7], r["val_bpb"] if r["val_bpb"] is not None else 0.0,
               r["memory_gb"] if r["memory_gb"] is not None else 0.0, _status(r), r["description"],
               r["id"], r["verdict"] or _role_or_status(r), r["seed"], r["test_bpb"], r["confirm_of"], r["hypothesis"],
               r["reason"] or r["verdict_reason"]]
        lines.append("\t".join(_cell(v) for v in row))
    return "\n".join(lines) + "\n"
