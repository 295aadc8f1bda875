"""The workspace: `loopwright init`, `status`, `export-tsv`, `report`."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from urllib.parse import urlparse

from mcp_server.cli.common import open_engine, usage_error


def init_args(sp) -> None:
    from mcp_server.loop.config import DEFAULT_CORPUS

    sp.add_argument("dir", nargs="?", help="the workspace to make (a new or empty directory)")
    sp.add_argument("--tag", default="main", help="campaign tag; branch loopwright/<tag>")
    sp.add_argument("--target", metavar="NAME|DIR", default=None,
                    help="make the workspace from your own target instead of the GPT benchmark: a bundled target's "
                         "name (--list-targets) or a folder / git repository with a loopwright.toml that has a "
                         "[target] section (only its committed files are copied; it is never changed)")
    sp.add_argument("--list-targets", action="store_true", help="list the bundled targets and exit")
    sp.add_argument("--corpus", default=DEFAULT_CORPUS,
                    help="stdlib-hidden (default, offline: val/test are stdlib modules hidden from train.py), stdlib "
                         "(val/test readable by train.py: for trying loopwright), tinystories, climbmix or a PATH")
    sp.add_argument("--time-budget", type=float, default=None, metavar="S",
                    help="seconds each experiment's train.py may run, start-up (imports, data loading, compilation) "
                         "included, on the budget clock: CPU time without a GPU, wall-clock with one "
                         "([benchmark] clock, default auto); at least 30 (default 30)")
    sp.add_argument("--force", action="store_true", help="allow a non-empty directory or an existing git repo")
    sp.add_argument("--wiring", choices=["auto", "plugin", "workspace"], default="auto",
                    help="how Claude Code / Codex reach loopwright: plugin (the installed plugin brings the server "
                         "and hooks; the workspace gets none), workspace (the workspace carries .mcp.json, hooks "
                         "and .codex/config.toml), auto (default: plugin for a client that has it installed)")
    sp.add_argument("--agent-group", metavar="GROUP",
                    help="the agent runs as another OS user in GROUP: the group may read the workspace and write "
                         "only its editable files; the state stays this user's alone (docs/security.md). "
                         "The workspace's clients then reach the MCP server at --mcp-url")
    sp.add_argument("--mcp-url", metavar="URL", default=None,
                    help="with --agent-group: where `loopwright serve --http` (run as this user) listens "
                         "(default http://127.0.0.1:8765/mcp)")


def init(args) -> int:
    from mcp_server.loop.budget import check_time_budget
    from mcp_server.loop.config import CONFIG_NAME, DEFAULT_CORPUS, tag_problem
    from mcp_server.loop.setup import init_workspace

    if args.list_targets:
        return _list_targets()
    if not args.dir:
        return usage_error("init", "name the workspace directory to make, e.g. `loopwright init ~/lw-demo` "
                                   "(or --list-targets to see the bundled targets)")
    try:
        check_time_budget(args.time_budget)
    except ValueError as e:
        return usage_error("init", str(e))
    if args.target is not None and (args.corpus != DEFAULT_CORPUS or args.time_budget is not None):
        return usage_error("init", "--corpus and --time-budget belong to the GPT benchmark; a target sets its own "
                                   "[target] time_budget in its loopwright.toml")
    if tag_problem(args.tag):
        return usage_error("init", str(tag_problem(args.tag)))
    target = Path(args.dir).expanduser()
    if target.exists() and not target.is_dir():
        return usage_error("init", f"{target} exists and is not a directory; name a new (or empty) directory "
                                   "for the workspace")
    from mcp_server.agents.clients import installed_plugin, resolve_wiring

    wiring = resolve_wiring(args.wiring)
    existing = (target / CONFIG_NAME).is_file()
    if args.agent_group:
        from mcp_server.loop.deploy import DeployError, group_id

        try:
            group_id(args.agent_group)    # before anything is made
        except DeployError as e:
            return usage_error("init", str(e))
    elif args.mcp_url:
        return usage_error("init", "--mcp-url goes with --agent-group (a server run by another user); without it "
                                   "the clients start the server themselves")
    mcp_url = (args.mcp_url or "http://127.0.0.1:8765/mcp") if args.agent_group else None
    try:
        ws = init_workspace(args.dir, tag=args.tag, corpus=args.corpus, time_budget=args.time_budget,
                            force=args.force, wiring=wiring, mcp_url=mcp_url, target=args.target)
    except OSError as e:   # a directory that cannot be made or written (permissions, a file in the path)
        where = f" ({e.filename})" if e.filename else ""
        return usage_error("init", f"cannot create the workspace in {target}: {e.strerror or e}{where}; choose a "
                                   "directory you can write")
    if existing:
        with ws.ledger() as ledger:
            others = [tag for tag, _ in ledger.campaign_names() if tag != args.tag]
        print(f"existing workspace {ws.root}: new campaign '{args.tag}' on branch loopwright/{args.tag}, now checked "
              f"out" + (f"; the earlier campaign(s) {', '.join(others)} keep their branches (`git checkout "
                        f"loopwright/{others[-1]}` goes back to one)" if others else ""))
        return 0
    print(f"workspace ready: {ws.root} (campaign '{args.tag}', branch loopwright/{args.tag})"
          + (f"; target {ws.cfg.target.name}: {ws.cfg.target.direction} {ws.cfg.target.metric} ({ws.cfg.target.noise})"
             if ws.cfg.target is not None else ""))
    if args.agent_group:
        from mcp_server.loop.deploy import share_with_group

        for line in share_with_group(ws.root, args.agent_group, ws.cfg.paths.editable):
            print(f"shared: {line}")
        print(f"the state ({ws.state_dir}) stays this user's alone; the agent's clients reach the loop at {mcp_url}: "
              f"keep `loopwright serve --http --port {urlparse(mcp_url).port or 8765} --workspace {ws.root}` running "
              "as this user (docs/security.md)")
    names = (("claude", "Claude Code"), ("codex", "Codex"))
    print("wiring: " + ", ".join(f"{name} via " + ("its plugin" if wiring[c] == "plugin" else "the workspace's files")
                                 for c, name in names) + " (`loopwright wiring` checks it)")
    for c, name in names:
        if wiring[c] == "plugin" and installed_plugin(c) is None:
            print(f"warning: the loopwright plugin is not installed for {name}: it will not reach this workspace "
                  f"until it is (see the README's install section), or make the workspace again with "
                  f"--wiring workspace", file=sys.stderr)
    from mcp_server.loop.sandbox import PUBLIC_CORPUS_NOTE, corpus_is_public

    if corpus_is_public(ws.cfg.benchmark.corpus):
        print(f"note: {PUBLIC_CORPUS_NOTE}")
    print(f"next: `loopwright serve --workspace {ws.root}` for an agent, or "
          f"`loopwright run --agent builtin --workspace {ws.root}`")
    return 0


def _list_targets() -> int:
    from mcp_server.loop.config import parse_config
    from mcp_server.loop.workspace import bundled_targets

    for name, path in bundled_targets().items():
        t = parse_config((path / "loopwright.toml").read_text(encoding="utf-8"), path / "loopwright.toml").target
        what = f"{t.direction} {t.metric}, noise {t.noise}" if t else "no [target] section"
        print(f"{name:12s} {what}  ({path})")
    print("make one with: loopwright init DIR --target NAME (or --target PATH for your own)")
    return 0


def status_args(sp) -> None:
    sp.add_argument("--limit", type=int, default=10)
    sp.add_argument("--json", action="store_true")


def status(args) -> int:
    from mcp_server.loop.status import executor_view

    if args.limit < 1:
        return usage_error("status", "--limit must be at least 1")
    with open_engine(args) as eng:
        s, b = eng.summary(), eng.budget()
        rows = eng.recent_experiments(args.limit)
        from mcp_server.cli.approvals import waiting_lines  # the autonomy slider: what waits on a person
        waiting = waiting_lines(eng)
        ex = executor_view(eng)
        if args.json:
            print(json.dumps({"summary": s.model_dump(), "budget": b.model_dump(), "waiting_approvals": waiting,
                              "executor": ex,
                              "recent": [{k: r[k] for k in ("id", "description", "status", "verdict", "val_bpb")}
                                         for r in rows]}, indent=2))
            return 0
        _print_status(s, b, rows, eng.ws.cfg)
        failed = _last_launch_failure(eng)
        if failed:
            print(failed)
        _print_executor(ex)
        if waiting:
            print("waiting for a person (`loopwright approve ID`, `loopwright reject ID --why ...`):")
            for line in waiting:
                print(f"  {line}")
        return 0


def _last_launch_failure(eng) -> str:
    """The newest unattended session that could not start, unless a session started after it."""
    import time

    fails = eng.ledger.events(campaign_id=eng.campaign["id"], kind="launch_failed")
    if not fails:
        return ""
    last = fails[-1]
    started = [x["started_at"] for x in eng.ledger.sessions()]
    if started and max(started) > last["created_at"]:
        return ""
    p = last["payload"]
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(last["created_at"]))
    return (f"last {p.get('trigger', '?')} session FAILED TO START at {when} ({p.get('agent', '?')}): "
            f"{p.get('error', '?')}")


def _print_status(s, b, rows, cfg) -> None:
    from rich.console import Console
    from rich.table import Table

    from mcp_server.loop.text import for_rich  # descriptions are agent-written: no raw markup or escapes

    con = Console()
    from mcp_server.loop.targets import metric_label, shown

    what = (f"target {cfg.target.name} ({cfg.target.direction} {cfg.target.metric})" if cfg.target is not None
            else f"benchmark {b.benchmark_version or 'unversioned'}")
    con.print(f"[bold]campaign[/] {s.tag}  branch {s.branch}  pinned {s.pinned_commit}  {what}")
    best = "—" if s.best_val_bpb is None else f"{shown(cfg, s.best_val_bpb):.4f}"
    base = "—" if s.baseline_val_bpb is None else f"{shown(cfg, s.baseline_val_bpb):.4f}"
    con.print(f"[bold]best[/] {best} (commit {s.best_commit})   baseline {base}   "
              f"{s.experiments} experiments, [green]{s.kept} kept[/], {s.discarded} discarded, "
              f"[red]{s.crashed} failed[/]")

    def left(v, unit=""):
        return "∞" if v is None else f"{v}{unit}"

    con.print(f"[bold]budget left[/] {left(b.experiments_left)} experiments, {left(b.hours_left, ' h')}, "
              f"${left(b.cost_left_usd)}   should_stop={b.should_stop} {'; '.join(b.reasons)}")
    t = Table(title="recent experiments")
    for col in ("id", "description", "status", "verdict", metric_label(cfg), "commit"):
        t.add_column(col)
    for r in rows:
        colour = {"keep": "green", "discard": "grey50", "retest": "yellow"}.get(r["verdict"] or "", "")
        val = "" if r["val_bpb"] is None else f"{shown(cfg, r['val_bpb']):.4f}"
        t.add_row(str(r["id"]), for_rich(r["description"], 60), r["status"], f"[{colour}]{r['verdict'] or ''}[/]"
                  if colour else (r["verdict"] or ""), val, (r["commit_sha"] or "")[:8])
    con.print(t)


def _ago(seconds) -> str:
    if seconds is None:
        return "—"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _print_executor(ex: dict) -> None:
    """In-flight runs and workers: shown once experiments go through an executor (submit_experiment)."""
    from rich.console import Console
    from rich.table import Table

    from mcp_server.loop.text import for_rich

    cfg = ex["executor"]
    if cfg["kind"] == "local" and cfg["parallel"] == 1 and not (ex["in_flight"] or ex["open"] or ex["workers"]):
        return   # one experiment at a time on this machine: nothing more to show
    con = Console()
    where = f"the Ray cluster at {cfg['address']}" if cfg["kind"] == "ray" else "this machine"
    gpus = f", {cfg['num_gpus']:g} GPU(s) per run" if cfg["num_gpus"] else ""
    driver = ("a driver is running" if ex["driver_alive"] else
              "no driver running" + (" (runs in flight resume when one starts: `loopwright run` or an agent's "
                                     "submit_experiment)" if ex["in_flight"] else ""))
    con.print(f"[bold]executor[/] {cfg['kind']} ({where}), {cfg['parallel']} run(s) at once{gpus}; {driver}")
    n_exp = len({r["experiment_id"] for r in ex["in_flight"]})
    con.print(f"[bold]in flight[/] {len(ex['in_flight'])} run(s) of {n_exp} experiment(s); "
              f"{len(ex['open'])} submitted experiment(s) await a verdict" +
              (f": {', '.join(f'#{i}' for i in ex['open'][:12])}" if ex["open"] else ""))
    if ex["in_flight"]:
        t = Table(title="runs in flight (queued or running)")
        for col in ("run", "experiment", "role", "seed", "attempt", "queued for"):
            t.add_column(col)
        for r in ex["in_flight"]:
            t.add_row(str(r["run_id"]), f"#{r['experiment_id']} {for_rich(r['description'], 40)}", str(r["role"] or ""),
                      str(r["seed"] if r["seed"] is not None else ""),
                      str(r["attempt"]) + (" (re-queued)" if r["attempt"] > 1 else ""), _ago(r["for_s"]))
        con.print(t)
    if ex["workers"]:
        t = Table(title="workers (recent runs)")
        for col in ("worker", "runs", "ok", "failed", "lost", "last run ended"):
            t.add_column(col)
        for w in ex["workers"]:
            t.add_row(for_rich(w["worker"], 48), str(w["runs"]), str(w["ok"]), str(w["failed"]),
                      f"[red]{w['lost']}[/]" if w["lost"] else "0", _ago(w["last_s"]) + " ago")
        con.print(t)
    for r in ex["lost"][:5]:
        con.print(f"[red]lost[/] run #{r['run_id']} on {for_rich(r['worker'] or '?', 40)}: {for_rich(r['reason'], 120)}")


def export_tsv_args(sp) -> None:
    sp.add_argument("--output", "-o", default="-")


def export_tsv(args) -> int:
    from mcp_server.report.tsv import export_tsv as tsv

    with open_engine(args) as eng:
        text = tsv(eng.ledger, eng.campaign["id"])
    if args.output == "-":
        sys.stdout.write(text)
    else:
        try:
            Path(args.output).write_text(text)
        except OSError as e:
            return usage_error("export-tsv", f"cannot write {args.output}: {e.strerror or e}; check that its "
                                             "directory exists and is writable (or use -o - for stdout)")
        print(f"wrote {args.output}")
    return 0


def report(args) -> int:
    from mcp_server.report.writer import write_report

    files = write_report(args.workspace)
    print(f"{files.data.title}")
    for p in (files.markdown, files.plot.path, files.tsv):
        print(p)
    return 0
