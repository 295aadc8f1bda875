"""`loopwright replay [--keeps] [--seeds N]`: re-run each kept change against its parent on fresh seeds.

Registered in mcp_server/cli/registry.py (see loop/replay.py for the rule).
"""
from __future__ import annotations

import json
import sys


def replay_args(sp) -> None:
    sp.add_argument("--keeps", action="store_true", default=True,
                    help="replay the kept experiments (the default and, for now, the only choice)")
    sp.add_argument("--seeds", type=int, default=3, help="fresh seeds per keep (default 3)")
    sp.add_argument("--json", action="store_true", help="print the result as JSON")


def replay(args) -> int:
    from mcp_server.loop.engine import Engine
    from mcp_server.loop.replay import replay as run_replay

    if args.seeds < 1:
        print("loopwright replay: --seeds must be at least 1", file=sys.stderr)
        return 2
    with Engine.open_for_writing(args.workspace) as eng:   # it runs training
        try:
            res = run_replay(eng, seeds=args.seeds, on_run=None if args.json else
                             (lambda s: print(s, file=sys.stderr, flush=True)))
        except KeyboardInterrupt:   # Ctrl-C, SIGTERM, SIGHUP (cli/main.py)
            from mcp_server.common import procs

            rows = eng.ledger.replay_runs(eng.campaign["id"])
            done = sum(r["status"] != "interrupted" for r in rows)
            number = rows[0]["replay"] if rows else "-"
            print(f"interrupted: replay {number} stopped after {done} finished run(s) (recorded; the run in flight "
                  "is recorded as interrupted); a replay changes no verdict and no budget; "
                  f"{', '.join(eng.ws.cfg.paths.editable)} kept as you left it", file=sys.stderr)
            return procs.stop_exit_code()
    if args.json:
        print(json.dumps(res.model_dump(), indent=2))
        return 0 if res.all_hold else 1
    print(format_result(res))
    return 0 if res.all_hold else 1


def format_result(res) -> str:
    lines = [f"replay {res.replay}: {len(res.keeps)} keep(s) x {res.seeds_per_keep} fresh seed(s), "
             f"{res.runs} runs in {res.seconds:.0f} s (not counted in the campaign budget)"]
    for k in res.keeps:
        ds = ", ".join("—" if p.d is None else f"{-p.d:+.4f}" for p in k.pairs)
        iv = "" if k.interval is None else f", 95% interval [{k.interval[0]:+.4f}, {k.interval[1]:+.4f}]"
        gain = "—" if k.gain is None else f"{k.gain:+.4f}"
        lines.append(f"  #{k.experiment_id} {k.description}: {k.outcome.upper()} — paired gain {gain} "
                     f"(per seed {ds}; {k.wins}/{len(k.pairs)} positive{iv})")
    lines.append("every keep holds" if res.all_hold else "NOT every keep holds")
    return "\n".join(lines)
