"""`loopwright target check`: a user's own target's contract, checked before the first run.

On a target folder (or a bundled target's name): the contract parses and its globs name files. On a workspace
made from one: also the gate passes on the baseline (the pinned commit), the run exits 0, the evaluator prints
a finite metric, the noise kind holds over two seeds, and the hidden files cannot be read from the run's
sandbox. One line per check; exit 0 only when every check passes. Everything runs through the runner and the
sandbox the loop uses, on copies in a fresh folder of the state directory (never a shared temp dir), so a check
that passes here passes for the same reason in the loop.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

from mcp_server.cli.common import usage_error

_SKIP_PARTS = {".git", "__pycache__", ".loopwright", ".pytest_cache", ".mypy_cache"}   # as targets.py skips
CHECK_DIR = "target-check"      # in the state directory: each check's runs, removed after

# Run in the run's own sandbox: tries to read each path given; prints {path: sha256 | "empty" | error name}.
# A hidden file the sandbox masks reads as missing or empty (bubblewrap binds /dev/null over a file).
PROBE = r'''
import hashlib, json, sys
out = {}
for p in sys.argv[1:]:
    try:
        with open(p, "rb") as f:
            data = f.read()
        out[p] = hashlib.sha256(data).hexdigest() if data else "empty"
    except OSError as e:
        out[p] = type(e).__name__
print(json.dumps(out))
'''


class Report:
    """The check's lines, printed as they come (the runs take seconds each); ok only if none failed."""

    def __init__(self) -> None:
        self.failed = 0

    def line(self, ok: bool, name: str, detail: str) -> bool:
        print(f"{'ok  ' if ok else 'FAIL'}  {name}: {detail}", flush=True)
        self.failed += not ok
        return ok

    def note(self, text: str) -> None:
        print(f"      {text}", flush=True)


def target_args(sp) -> None:
    sp.add_argument("action", choices=["check", "patch"],
                    help="check: validate the target contract before the first run; patch: print the campaign's "
                         "best change to the editable files as a diff against the pinned baseline, for "
                         "`git apply` in the repository the target was copied from")
    sp.add_argument("src", nargs="?", metavar="SRC", default=None,
                    help="a target folder (or git repository) or a bundled target's name, not yet a workspace: "
                         "checks that its contract parses and its globs name files. Without it: the workspace "
                         "(--workspace, $LOOPWRIGHT_WORKSPACE or the current directory), checked in full")


def target(args) -> int:
    if args.action == "patch":
        return patch(args)
    if args.src is not None and args.workspace is not None:
        return usage_error("target", "give a target folder (SRC) or --workspace WS, not both")
    rep = Report()
    if args.src is not None and not _is_workspace(Path(args.src).expanduser()):
        check_source(args.src, rep)
    else:
        check_workspace(args.workspace if args.src is None else args.src, rep)
    print("all checks passed" if not rep.failed else f"{rep.failed} check(s) failed")
    return 0 if not rep.failed else 1


def patch(args) -> int:
    """The best version's editable files against the pinned commit's, as a unified diff on stdout (the
    workspace is a copy of the target: its history starts at the pin, so the diff is what carries a result back)."""
    from mcp_server.cli.common import open_engine
    from mcp_server.loop import gitops

    if args.src is not None:
        return usage_error("target", "patch reads a workspace: give it with --workspace WS, not as SRC")
    with open_engine(args) as eng:
        c = eng.campaign
        diff = gitops.diff_text(eng.ws.root, c["pinned_commit"], c["best_commit"], list(eng.ws.cfg.paths.editable))
        if not diff.strip():
            print(f"loopwright target: campaign {c['tag']!r} has kept nothing yet: its best is the pinned baseline",
                  file=sys.stderr)
            return 1
        print(diff if diff.endswith("\n") else diff + "\n", end="")
        best = eng.ledger.experiment(c["best_experiment_id"]) if c["best_experiment_id"] else None
        print(f"loopwright target: the best of campaign {c['tag']!r} (commit {c['best_commit'][:10]}"
              + (f", experiment #{best['id']}: {best['description'][:80]}" if best else "")
              + "); apply it in your repository with `git apply`", file=sys.stderr)
    return 0


def _is_workspace(path: Path) -> bool:
    # a folder `loopwright init` made: a git repository with the lock and the id of its state directory
    return (path / ".git").exists() and (path / "loopwright.lock").is_file() and (path / ".loopwright").is_dir()


# ---------------------------------------------------------------------------
# checks 1-2: the contract and its globs

def source_files(root: Path) -> list[str]:
    """The files a target folder offers, as `loopwright init` copies them: a git repository's committed files
    at HEAD (and its loopwright.toml, which may be uncommitted), else the folder's files, caches left out."""
    from mcp_server.loop import gitops
    from mcp_server.loop.config import CONFIG_NAME

    if (root / ".git").exists():
        return sorted({*gitops.tracked_files(root, "HEAD"), CONFIG_NAME})
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_PARTS]
        out += [(Path(dirpath) / n).relative_to(root).as_posix() for n in filenames
                if not n.endswith(".pyc") and (Path(dirpath) / n).is_file() and not (Path(dirpath) / n).is_symlink()]
    return sorted(out)


def check_globs(rep: Report, cfg, files: list[str], hidden_files: list[str], where: str, git: bool) -> bool:
    """Each editable, frozen and hidden glob names at least one file (hidden may be an empty list). The files
    loopwright itself writes at init (AGENTS.md, .mcp.json, the lock...) are frozen always and not checked."""
    from mcp_server.loop import targets
    from mcp_server.loop.config import PathsConfig

    # a target that leaves `hidden` out gets the GPT benchmark's default (a file in .loopwright/): none declared
    hidden_globs = [] if cfg.paths.hidden == PathsConfig().hidden else cfg.paths.hidden
    ok = True
    for kind, globs, pool in (("editable", cfg.paths.editable, files),
                              ("frozen", [g for g in cfg.paths.frozen if g not in targets.ALWAYS_FROZEN], files),
                              ("hidden", hidden_globs, hidden_files)):
        named = {g: [rel for rel in pool if targets.matches(rel, [g])] for g in globs}
        empty = [g for g, hits in named.items() if not hits]
        if empty:
            ok = rep.line(False, f"{kind} globs", f"{', '.join(map(repr, empty))} "
                          f"{'matches' if len(empty) == 1 else 'match'} no file of {where}; fix [paths] {kind} in "
                          "loopwright.toml (globs are relative to the target's folder and `*` crosses folders"
                          + ("; only committed files count in a git repository)" if git else ")")) and ok
        elif not globs:
            rep.line(True, f"{kind} globs", "none declared")
        else:
            count = len({rel for hits in named.values() for rel in hits})
            shown = ", ".join(sorted({rel for hits in named.values() for rel in hits})[:6])
            rep.line(True, f"{kind} globs", f"{len(globs)} glob(s) match {count} file(s): {shown}"
                     + (", ..." if count > 6 else ""))
    return ok


def check_source(spec: str, rep: Report) -> None:
    """Checks 1-2 on a target folder or bundled name; the rest need a workspace."""
    from mcp_server.loop import config as cfgmod
    from mcp_server.loop import targets
    from mcp_server.loop.workspace import WorkspaceError, bundled_targets

    path = Path(spec).expanduser()
    bundled = bundled_targets()
    root = bundled[spec] if spec in bundled and not path.exists() else path.resolve()
    toml = root / cfgmod.CONFIG_NAME
    try:
        if not root.is_dir():
            raise WorkspaceError(f"{spec!r} is neither a bundled target ({', '.join(sorted(bundled))}) nor a folder")
        if not toml.is_file():
            raise WorkspaceError(f"{root} has no {cfgmod.CONFIG_NAME}; write one with a [target] section (README, "
                                 "'Your own target')")
        cfg = cfgmod.parse_config(toml.read_text(encoding="utf-8"), toml)
        if cfg.target is None:
            raise WorkspaceError(f"{toml} has no [target] section: name its run, evaluate, metric, direction and "
                                 "noise there (README, 'Your own target')")
        files = source_files(root)
    except (WorkspaceError, cfgmod.ConfigError, OSError) as e:
        rep.line(False, "contract", str(e))
        return
    except Exception as e:  # noqa: BLE001 - a git repository git cannot read: say so, as a failed check
        rep.line(False, "contract", f"cannot read the files of {root} ({e}); commit them, or give a plain folder")
        return
    t = cfg.target
    rep.line(True, "contract", f"target {t.name} in {toml}: {t.direction} {t.metric} ({t.noise}); run `{t.run}`, "
             f"gate `{t.gate or 'none'}`, evaluate `{t.evaluate}`")
    hidden = [rel for rel in files if targets.matches(rel, cfg.paths.hidden)]
    if check_globs(rep, cfg, files, hidden, str(root), git=(root / ".git").exists()):
        # what init checks besides (a file both editable and hidden, an always-frozen file made editable...)
        try:
            src = targets.resolve_source(str(root))
            rep.line(True, "init would accept it", "no file is both editable and hidden or frozen")
        except (WorkspaceError, cfgmod.ConfigError) as e:
            rep.line(False, "init would accept it", str(e))
        else:
            back = cfgmod.parse_config(cfgmod.dump_config(src.cfg))
            if src.cfg.frozen_hash() in back.frozen_hashes():
                rep.line(True, "frozen config", "the loopwright.toml init writes reads back as this contract")
            else:
                rep.line(False, "frozen config", _round_trip_problem(src.cfg, back, "would refuse"))
    rep.note(f"make the workspace with `loopwright init WS --target {spec}`, then `loopwright target check "
             "--workspace WS` runs the rest (gate, run, evaluator, noise, hidden files)")


# ---------------------------------------------------------------------------
# checks 3-5 on a workspace

def check_workspace(root: Optional[str], rep: Report) -> None:
    from mcp_server.loop import config as cfgmod
    from mcp_server.loop import gitops
    from mcp_server.loop.workspace import LOCK_NAME, Workspace, WorkspaceError

    try:
        ws = Workspace.find(root)
        pinned = ws.pinned_commit or gitops.root_commit(ws.root)
        lock = json.loads(gitops.verified_blob_bytes(ws.root, pinned, LOCK_NAME))
    except (WorkspaceError, cfgmod.ConfigError, OSError, ValueError) as e:
        rep.line(False, "contract", f"cannot open the workspace: {e}")
        return
    cfg = ws.cfg
    t = cfg.target
    if t is None:
        rep.line(False, "contract", f"{ws.root} runs the GPT benchmark, not a target (its loopwright.toml has no "
                 "[target] section); make a target workspace with `loopwright init WS --target NAME|DIR`")
        return
    rep.line(True, "contract", f"target {t.name} in {ws.root}: {t.direction} {t.metric} ({t.noise}), baseline = "
             f"pinned commit {pinned[:10]}")
    _check_frozen_config(ws, pinned, lock, rep)
    files = gitops.tracked_files(ws.root, pinned)
    check_globs(rep, cfg, files, sorted(lock.get("data", {})), f"the pinned commit {pinned[:10]}", git=True)

    from mcp_server.loop import sandbox
    try:
        info = sandbox.require()
    except sandbox.SandboxUnavailable as e:
        rep.line(False, "sandbox", str(e))
        return
    tree = {rel: gitops.verified_blob_bytes(ws.root, pinned, rel) for rel in files}
    base = ws.state_dir / CHECK_DIR
    base.mkdir(mode=0o700, exist_ok=True)
    box = Path(tempfile.mkdtemp(prefix="check-", dir=base))
    try:
        seeds = [cfg.noise.first_seed, cfg.noise.first_seed + 1]
        first = _baseline(ws, pinned, tree, box / f"seed-{seeds[0]}", seeds[0], rep, full=True)
        second = _baseline(ws, pinned, tree, box / f"seed-{seeds[1]}", seeds[1], rep, full=False) \
            if first is not None else None
        _check_noise(t, seeds, first, second, rep)
        _check_hidden(ws, lock, tree, box / "probe", info, rep)
    finally:
        shutil.rmtree(box, ignore_errors=True)


def _round_trip_problem(cfg, back, verb: str) -> str:
    """Why a contract does not read back from the loopwright.toml written for it: the fields that change."""
    from mcp_server.loop.config import FROZEN_SECTIONS

    changed = [f"{name}.{k}" for name in FROZEN_SECTIONS if getattr(cfg, name) is not None
               for k, v in getattr(cfg, name).model_dump(mode="json").items()
               if getattr(back, name) is None or getattr(back, name).model_dump(mode="json").get(k) != v]
    hint = (" An explicit `hidden = []` is left out when loopwright.toml is written, and the default comes back: "
            "leave `hidden` out of the target's [paths] instead (it means the same: no hidden file)."
            if cfg.paths.hidden == [] else "")
    return (f"loopwright.toml reads back with {', '.join(changed) or 'its frozen sections'} changed, so its frozen "
            f"hash is not the one loopwright.lock pins and the loop {verb} every run as tampering.{hint}")


def _check_frozen_config(ws, pinned: str, lock: dict, rep: Report) -> None:
    """The loop refuses to run when loopwright.toml's frozen sections do not hash to the lock's config_frozen
    (integrity.check): on disk, and at the pinned commit (a workspace made wrong, not edited since)."""
    from mcp_server.loop import config as cfgmod
    from mcp_server.loop import gitops

    want = lock.get("config_frozen")
    try:
        pinned_cfg = cfgmod.parse_config(gitops.verified_blob_bytes(ws.root, pinned, cfgmod.CONFIG_NAME).decode())
        disk_cfg = cfgmod.load_config(ws.root)
    except cfgmod.ConfigError as e:
        rep.line(False, "frozen config", str(e).splitlines()[0])
        return
    if want not in pinned_cfg.frozen_hashes():
        rep.line(False, "frozen config", "the pinned loopwright.toml's frozen sections are not the ones "
                 "loopwright.lock pins, so the loop refuses every run as tampering: the workspace was made wrong. "
                 "Run `loopwright target check` on the target's folder (it says what does not read back), fix it "
                 "and make the workspace again")
    elif want not in disk_cfg.frozen_hashes():
        rep.line(False, "frozen config", f"loopwright.toml was edited since the pin ({pinned[:10]}): its frozen "
                 "sections are not the ones loopwright.lock pins, and the loop would restore it and record a tamper "
                 f"event before any run. Restore it: git -C {ws.root} checkout {pinned[:10]} -- loopwright.toml")
    else:
        rep.line(True, "frozen config", "loopwright.toml's frozen sections are the ones loopwright.lock pins")


def _baseline(ws, pinned: str, tree: dict[str, bytes], run_dir: Path, seed: int, rep: Report,
              full: bool) -> Optional[float]:
    """The baseline's run on `seed` through the loop's own runner (gate, run, evaluator); its metric in the
    user's sign, or None after a failed line. `full`: a line for each stage; else one line for the repeat."""
    from mcp_server.loop import runner

    t = ws.cfg.target
    tr = runner.run_training(ws, run_dir, seed, sources=tree)
    gate_failed = tr.status != "ok" and t.gate is not None and f"the gate `{t.gate}`" in tr.reason
    tail = f"\n{_indent(tr.log_tail)}" if tr.log_tail.strip() else ""
    stage = f"seed {seed}"
    if t.gate is not None and (full or gate_failed):
        if not rep.line(not gate_failed, "gate", f"`{t.gate}` passes on the baseline ({stage})" if not gate_failed
                        else f"`{t.gate}` fails on the baseline ({stage}): {tr.reason}; the baseline must pass its "
                        f"own gate, or every candidate is discarded{tail}"):
            return None
    elif t.gate is None and full:
        rep.line(True, "gate", "none declared (a correctness gate is optional)")
    if tr.status != "ok":
        rep.line(False, "run", f"`{t.run}` on the baseline ({stage}): {tr.status}: {tr.reason}{tail}")
        return None
    if full:
        rep.line(True, "run", f"`{t.run}` exits 0 on the baseline ({stage}, {tr.wall_seconds:.2f} s wall, "
                 f"{tr.cpu_seconds or 0:.2f} s CPU; time_budget {t.time_budget:g} s)")
    assert tr.model_path is not None
    ev = runner.run_evaluation(ws, pinned, run_dir, tr.model_path)
    if not ev.ok:
        rep.line(False, "evaluator", f"`{t.evaluate}` on the baseline ({stage}): {ev.reason}")
        return None
    value = ev.raw.get("metric")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        rep.line(False, "evaluator", f"the metric {value!r} is not a finite number")   # the runner refuses it too
        return None
    extras = sorted(k for k in ev.raw if k not in ("ok", "metric", "output_sha256"))
    if full:
        rep.line(True, "evaluator", f"`{t.evaluate}` prints a valid JSON line: {t.metric} = {value!r}"
                 + (f" (extras: {', '.join(extras)})" if extras else ""))
    return float(value)


def _check_noise(t, seeds: list[int], a: Optional[float], b: Optional[float], rep: Report) -> None:
    if a is None or b is None:
        rep.line(False, "noise", f"not measured: the baseline did not score on both seeds {seeds[0]} and {seeds[1]}")
        return
    spread = abs(a - b)
    if t.noise == "deterministic":
        rep.line(a == b, "noise", f"deterministic: {t.metric} is {a!r} on seeds {seeds[0]} and {seeds[1]}" if a == b
                 else f"declared deterministic but the metric varies: {a!r} vs {b!r}; declare noise = \"repeat\" "
                 "or \"seeded\"")
        return
    mean = (abs(a) + abs(b)) / 2
    rel = f", {100 * spread / mean:.1f}% of their mean" if mean > 0 else ""
    rep.line(True, "noise", f"{t.noise}: {t.metric} is {a!r} on seed {seeds[0]} and {b!r} on seed {seeds[1]} "
             f"(spread {spread:.6g}{rel}); the loop measures this noise on its baseline seeds")


def _check_hidden(ws, lock: dict, tree: dict[str, bytes], probe_dir: Path, info, rep: Report) -> None:
    """Check 5: from the sandbox a run gets (train.py's, on the pinned tree), try to read each hidden file where
    it lives (the state directory's data), in the state directory, in the workspace and in the target's folder."""
    from mcp_server.loop import runner, sandbox
    from mcp_server.loop.workspace import bundled_targets

    hidden = sorted(lock.get("data", {}))
    if not hidden:
        rep.line(True, "hidden files", "none declared")
        return
    source = Path(lock["target_source"]) if lock.get("target_source") else None
    paths: dict[str, str] = {}
    for rel in hidden:
        places = [("state data", ws.data_dir / rel), ("state dir", ws.state_dir / rel), ("workspace", ws.root / rel)]
        if source is not None:
            places.append(("target folder", source / rel))
        for where, p in places:
            paths.setdefault(str(p), where)
    view, scratch = _fresh(probe_dir / "view"), _fresh(probe_dir / "scratch")
    copies: dict[str, Path] = {}
    for rel, data in tree.items():    # the run's view: private copies of the pinned files, as the runner makes
        dest = probe_dir / "source" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        copies[str(ws.root / rel)] = dest
    env = runner.clean_env({"TMPDIR": "/tmp", "HOME": os.path.expanduser("~"), "LOOPWRIGHT_OUTPUT": str(scratch)})
    cmd = sandbox.training_command(ws, [sys.executable, "-I", "-c", PROBE, *paths], view=view, scratch=scratch,
                                   env=env, info=info, sources=copies)
    try:
        proc = subprocess.run(sandbox.limited(cmd, sandbox.default_memory_limit()), cwd=ws.root, env=env,
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                              start_new_session=True)
    except subprocess.TimeoutExpired:
        rep.line(False, "hidden files", "the probe ran over 60 s in the sandbox; is the machine overloaded?")
        return
    try:
        found = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        rep.line(False, "hidden files", f"the probe did not report from the sandbox (exit {proc.returncode}): "
                 f"{proc.stderr.strip()[-300:]}")
        return
    # a read that returned bytes (a sha256) is a leak; a masked file reads as missing or empty
    read = {p: where for p, where in paths.items() if len(str(found.get(p, ""))) == 64}
    bundled = source is not None and source.resolve() in {d.resolve() for d in bundled_targets().values()}
    public = {p for p, where in read.items() if where == "target folder" and bundled}
    leaks = {p: w for p, w in read.items() if p not in public}
    if leaks:
        how = ("a target folder outside your home directory and /tmp is visible to the sandbox: keep the target "
               "under your home (masked), or move its hidden files out of it after `loopwright init`"
               if "target folder" in leaks.values() else
               "no sandbox runs (the unsafe opt-out is on): the run can read everything" if info.kind == "none" else
               "the sandbox does not hide them: a loopwright bug, report it with this output")
        rep.line(False, "hidden files", "readable from the run's sandbox: "
                 + "; ".join(f"{p} ({w})" for p, w in sorted(leaks.items())) + f"; {how}")
        return
    rep.line(True, "hidden files", f"{len(hidden)} hidden file(s) unreadable from the run's sandbox "
             f"({len(paths) - len(public)} path(s) tried: the state directory's data, the state directory, the "
             "workspace" + (", the target's folder)" if source is not None and not bundled else ")"))
    if public:
        rep.note(f"the bundled target's own folder {source} is readable, as is the whole installed package: a "
                 "bundled target's hidden files are a demo's, not secrets")


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, mode=0o700)
    return path


def _indent(text: str, keep: int = 12) -> str:
    return "\n".join(f"        {ln}" for ln in text.splitlines()[-keep:])
