"""Cheap views of the loop for the hooks: the Stop hook's should-stop answer and the
SessionStart summary (no torch, no MCP)."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TypedDict

from mcp_server.loop import asyncrun
from mcp_server.loop.engine import Engine
from mcp_server.loop.targets import metric_label


class _LoopStatusRequired(TypedDict):
    should_stop: bool
    reason: str
    next_step: str
    progress: int                 # grows whenever the agent moves the loop (ledger.progress_mark)


class LoopStatus(_LoopStatusRequired, total=False):
    """What loop_status gives the Stop hook (mcp_server/guard/stop.py reads exactly this)."""
    waiting_approvals: list[int]  # only when the budget is not spent


def loop_status(root: Path | str) -> LoopStatus:
    """For the Stop hook: should the agent stop, and if not, what next."""
    eng = Engine(root)
    try:
        b = eng.budget()
        s = eng.summary()
        # Anything the agent did that moved the loop: finished experiments, verdicts, notes.
        progress = eng.ledger.progress_mark()
        if b.should_stop:
            return {"should_stop": True, "reason": "; ".join(b.reasons), "next_step": b.next_step,
                    "progress": progress}
        # the autonomy slider: overdue approvals expire; when everything waits on a person, let the agent stop
        from mcp_server.loop import approvals

        ap = approvals.Approvals(eng)
        ap.expire_due()
        cid = eng.campaign["id"]
        waiting = [a["id"] for a in ap.waiting(cid)]
        why = ap.blocks_agent(cid)
        if why and not s.pending_retest and not s.pending_score:
            return {"should_stop": True, "reason": f"waiting on a person: {why}", "progress": progress,
                    "waiting_approvals": waiting,
                    "next_step": "Stop here: the loop resumes once a person approves or rejects what waits."}
        if s.pending_retest:
            nxt = f"Experiment {s.pending_retest[-1]} awaits a confirm run: run_experiment(confirm_of={s.pending_retest[-1]})."
        elif s.pending_score:
            nxt = f"Experiment {s.pending_score[-1]} is not scored yet: call score({s.pending_score[-1]})."
        else:
            left = "" if b.experiments_left is None else f" ({b.experiments_left} experiments left)"
            nxt = (f"Budget remains{left}. Do not stop and do not ask whether to continue: pick the next idea "
                   f"(suggest_next helps), edit {', '.join(eng.ws.cfg.paths.editable)}, call run_experiment, then score.")
        return {"should_stop": False, "reason": "budget remains", "next_step": nxt, "progress": progress,
                "waiting_approvals": waiting}
    finally:
        eng.close()


def session_summary(root: Path | str) -> str:
    """For SessionStart: a short state summary so a new session resumes instead of restarting."""
    eng = Engine(root)
    try:
        s = eng.summary()
        b = eng.budget()
        version = f", benchmark {b.benchmark_version}" if b.benchmark_version else ""
        t = eng.ws.cfg.target
        what = "" if t is None else f", target {t.name}: {t.direction} {t.metric}"
        unit = "bits/byte" if t is None else t.metric
        lines = [f"loopwright campaign '{s.tag}' (branch {s.branch}{version}{what}). Read program.md; only "
                 f"{', '.join(eng.ws.cfg.paths.editable)} may be edited.",
                 f"Best {metric_label(eng.ws.cfg)}: {s.best_val_bpb if s.best_val_bpb is not None else 'no baseline yet'} "
                 f"(baseline {s.baseline_val_bpb}); {s.experiments} experiments, {s.kept} kept, {s.crashed} failed.",
                 f"Budget: {b.experiments_left} experiments, {b.hours_left} h, ${b.cost_left_usd} left; "
                 f"should_stop={b.should_stop}."]
        if b.mde is not None:
            lines.append(f"Noise: candidates run on the best version's {b.runs_per_experiment} seeds and are judged on "
                         f"paired differences (sigma_d {b.sigma_paired:.4f}); a keep needs a mean paired gain of "
                         f"{b.keep_threshold:.4f}; minimum detectable effect ~{b.mde:.4f} {unit}: try changes "
                         "you expect to gain at least that much.")
        recent = eng.ledger.recent_non_baseline(eng.campaign["id"], limit=5)
        if recent:
            lines.append("Recent: " + "; ".join(f"#{r['id']} {r['verdict'] or r['status']} {r['description'][:60]}"
                                                for r in recent))
        notes = eng.ledger.notes(eng.campaign["id"], limit=5)
        if notes:
            lines.append("Notes: " + "; ".join(f"[{n['kind']}] {n['text'][:120]}" for n in notes))
        from mcp_server.loop import approvals

        ap = approvals.Approvals(eng)
        waiting = ap.waiting(eng.campaign["id"])
        if waiting:
            lines.append("Waiting for a person (autonomy " + ap.mode + "): "
                         + "; ".join(approvals.describe(a) for a in waiting[:5]))
        if s.pending_retest:
            lines.append(f"Pending: confirm run for experiment {s.pending_retest[-1]}.")
        elif s.pending_score:
            lines.append(f"Pending: score({s.pending_score[-1]}).")
        return "\n".join(lines)
    finally:
        eng.close()


# -- the executor: what is in flight, where runs ran (`loopwright status`, the report) ------------------

RECENT_RUNS = 500     # finished runs looked at for the workers table


def executor_view(eng: Engine, recent: int = RECENT_RUNS) -> dict:
    """What the executor is doing, from the ledger alone (cheap; never connects to a cluster):

    executor       the [executor] settings (kind, address, parallel, num_cpus, num_gpus)
    driver_alive   some process (an MCP server, `loopwright run`) drives the asynchronous experiments now
    in_flight      runs handed to the executor and not yet recorded: run id, the experiment it belongs to,
                   role, seed, attempt (2 = re-queued after a lost run), seconds since it was queued
    open           submitted experiments without a verdict yet
    workers        per worker (`local:<host>:<pid>` or `ray:<node>:<host>`) over the last `recent` finished
                   runs: runs, ok, failed, lost, seconds since its last run ended
    lost           the latest runs whose worker or node died, and what they were re-queued as
    """
    c = eng.campaign
    cfg = eng.ws.cfg.executor
    now = time.time()
    inflight = eng.ledger.inflight(c["id"])
    flying = []
    for r in inflight:
        row = eng.ledger.experiment(r["run_id"]) or {}
        flying.append({"run_id": r["run_id"], "experiment_id": row.get("confirm_of") or r["run_id"],
                       "description": row.get("description", ""), "role": row.get("role"), "seed": row.get("seed"),
                       "attempt": r["attempt"], "executor": r["executor"],
                       "for_s": round(max(0.0, now - r["submitted_at"]), 1)})
    workers: dict[str, dict] = {}
    lost = []
    for row in eng.ledger.recent_finished(c["id"], limit=recent):
        try:
            m = json.loads(row["metrics_json"] or "{}")
        except ValueError:
            m = {}
        name = m.get("worker") if isinstance(m, dict) else None
        if row["status"] == "lost":
            lost.append({"run_id": row["id"], "worker": name, "reason": row["reason"] or ""})
        if not name:
            continue
        w = workers.setdefault(name, {"worker": name, "runs": 0, "ok": 0, "failed": 0, "lost": 0, "last_s": None})
        w["runs"] += 1
        key = "ok" if row["status"] == "ok" else "lost" if row["status"] in ("lost", "interrupted") else "failed"
        w[key] += 1
        if row["finished_at"] and (w["last_s"] is None or now - row["finished_at"] < w["last_s"]):
            w["last_s"] = round(now - row["finished_at"], 1)
    return {"executor": {"kind": cfg.kind, "address": cfg.address if cfg.kind == "ray" else None,
                         "parallel": cfg.parallel, "num_cpus": cfg.num_cpus, "num_gpus": cfg.num_gpus},
            "driver_alive": asyncrun.driver_alive_elsewhere(eng),
            "in_flight": flying, "open": [s["id"] for s in eng.ledger.submissions(c["id"], open_only=True)],
            "workers": sorted(workers.values(), key=lambda w: (-w["runs"], w["worker"])), "lost": lost[:20]}
