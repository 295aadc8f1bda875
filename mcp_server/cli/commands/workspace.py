"""The workspace: `loopwright init`, `status`, `export-tsv`, `report`."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from mcp_server.cli.common import open_engine, usage_error


def init_args(sp) -> None:
    sp.add_argument("dir")
    sp.add_argument("--tag", default="main", help="campaign tag; branch loopwright/<tag>")
    sp.add_argument("--corpus", default="stdlib", help="stdlib (default, offline), tinystories, climbmix or a PATH")
    sp.add_argument("--time-budget", type=float, default=None, metavar="S",
                    help="wall-clock seconds each experiment's train.py may run, start-up (imports, data loading, "
                         "compilation) included; at least 30 (default 30)")
    sp.add_argument("--force", action="store_true", help="allow a non-empty directory or an existing git repo")
    sp.add_argument("--wiring", choices=["auto", "plugin", "workspace"], default="auto",
                    help="how Claude Code / Codex reach loopwright: plugin (the installed plugin brings the server "
                         "and hooks; the workspace gets none), workspace (the workspace carries .mcp.json, hooks "
                         "and .codex/config.toml), auto (default: plugin for a client that has it installed)")


def init(args) -> int:
    from mcp_server.loop.budget import check_time_budget
    from mcp_server.loop.setup import init_workspace

    try:
        check_time_budget(args.time_budget)
    except ValueError as e:
        return usage_error("init", str(e))
    from mcp_server.agents.clients import resolve_wiring

    wiring = resolve_wiring(args.wiring)
    ws = init_workspace(args.dir, tag=args.tag, corpus=args.corpus, time_budget=args.time_budget, force=args.force,
                        wiring=wiring)
    print(f"workspace ready: {ws.root} (campaign '{args.tag}', branch loopwright/{args.tag})")
    print("wiring: " + ", ".join(f"{c} via " + ("the installed plugin" if w == "plugin" else "the workspace's files")
                                 for c, w in (("Claude Code", wiring["claude"]), ("Codex", wiring["codex"])))
          + " (`loopwright wiring` checks it; install a plugin before init)")
    print(f"next: `loopwright serve --workspace {ws.root}` for an agent, or "
          f"`loopwright run --agent builtin --workspace {ws.root}`")
    return 0


def status_args(sp) -> None:
    sp.add_argument("--limit", type=int, default=10)
    sp.add_argument("--json", action="store_true")


def status(args) -> int:
    with open_engine(args) as eng:
        s, b = eng.summary(), eng.budget()
        rows = eng.recent_experiments(args.limit)
        from mcp_server.cli.approvals import waiting_lines  # the autonomy slider: what waits on a person
        waiting = waiting_lines(eng)
        if args.json:
            print(json.dumps({"summary": s.model_dump(), "budget": b.model_dump(), "waiting_approvals": waiting,
                              "recent": [{k: r[k] for k in ("id", "description", "status", "verdict", "val_bpb")}
                                         for r in rows]}, indent=2))
            return 0
        _print_status(s, b, rows)
        if waiting:
            print("waiting for a person (`loopwright approve ID`, `loopwright reject ID --why ...`):")
            for line in waiting:
                print(f"  {line}")
        return 0


def _print_status(s, b, rows) -> None:
    from rich.console import Console
    from rich.table import Table

    from mcp_server.loop.text import for_rich  # descriptions are agent-written: no raw markup or escapes

    con = Console()
    con.print(f"[bold]campaign[/] {s.tag}  branch {s.branch}  pinned {s.pinned_commit}")
    best = "—" if s.best_val_bpb is None else f"{s.best_val_bpb:.4f}"
    base = "—" if s.baseline_val_bpb is None else f"{s.baseline_val_bpb:.4f}"
    con.print(f"[bold]best[/] {best} (commit {s.best_commit})   baseline {base}   "
              f"{s.experiments} experiments, [green]{s.kept} kept[/], {s.discarded} discarded, "
              f"[red]{s.crashed} failed[/]")

    def left(v, unit=""):
        return "∞" if v is None else f"{v}{unit}"

    con.print(f"[bold]budget left[/] {left(b.experiments_left)} experiments, {left(b.hours_left, ' h')}, "
              f"${left(b.cost_left_usd)}   should_stop={b.should_stop} {'; '.join(b.reasons)}")
    t = Table(title="recent experiments")
    for col in ("id", "description", "status", "verdict", "val_bpb", "commit"):
        t.add_column(col)
    for r in rows:
        colour = {"keep": "green", "discard": "grey50", "retest": "yellow"}.get(r["verdict"] or "", "")
        val = "" if r["val_bpb"] is None else f"{r['val_bpb']:.4f}"
        t.add_row(str(r["id"]), for_rich(r["description"], 60), r["status"], f"[{colour}]{r['verdict'] or ''}[/]"
                  if colour else (r["verdict"] or ""), val, (r["commit_sha"] or "")[:8])
    con.print(t)


def export_tsv_args(sp) -> None:
    sp.add_argument("--output", "-o", default="-")


def export_tsv(args) -> int:
    from mcp_server.report.tsv import export_tsv as tsv

    with open_engine(args) as eng:
        text = tsv(eng.ledger, eng.campaign["id"])
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    return 0


def report(args) -> int:
    from mcp_server.report.writer import write_report

    files = write_report(args.workspace)
    print(f"{files.data.title}")
    for p in (files.markdown, files.plot.path, files.tsv):
        print(p)
    return 0
