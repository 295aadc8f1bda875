"""Making workspaces: init (the pinned commit, the state directory, the first campaign), migrating an
old in-workspace layout, relinking a moved workspace. Above workspace.py and integrity.py, which it uses."""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import sys
import time
from pathlib import Path
from typing import Mapping, Optional

from mcp_server.common.locks import FileLock
from mcp_server.ledger.store import Ledger
from mcp_server.loop import config as cfgmod
from mcp_server.loop import gitops, integrity
from mcp_server.loop import settings as setmod
from mcp_server.loop.workspace import (
    BENCH_NOISE_NAME,
    EVALUATOR_PY,
    ID_NAME,
    LOCK_NAME,
    StateDirError,
    Workspace,
    WorkspaceError,
    bench_files,
    bench_noise_prior,
    bench_source_dir,
    bench_version,
    check_state_dir,
    data_hashes,
    is_inside,
    lock_workspace_id,
    make_private_dir,
    old_layout,
    prepare_data,
    read_record,
    sinks_for,
    state_dir_for,
    state_home,
    write_record,
)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def agent_pointer(kind: str, editable: tuple[str, ...] = ("train.py",)) -> str:
    who = "Claude Code" if kind == "claude" else "Codex"
    names = ", ".join(f"`{e}`" for e in editable)
    frozen = ("`prepare.py` (with `evaluate.py` and `pt2audit.py`), `loopwright.toml`, the data and `.loopwright/` "
              "are" if editable == ("train.py",) else
              "Everything else (the evaluator, its tests, `loopwright.toml`, `.loopwright/`) is")
    return (f"# loopwright workspace ({who})\n\n"
            "Read `program.md` first and follow it on every run: it is the spec of this research loop.\n\n"
            f"- Only {names} may be edited. {frozen} frozen and guarded.\n"
            "- Work through the loopwright MCP tools: `state_read`, `run_experiment`, `score`, `revert`, "
            "`budget_check`, `note`, `suggest_next`.\n"
            "- Never stop to ask whether to continue: the loop runs until `budget_check` says should_stop.\n")


def client_configs(root: Path, python: str, state_dir: Optional[Path] = None,
                   wiring: str | Mapping[str, str] = "workspace", corpus: str = cfgmod.DEFAULT_CORPUS,
                   mcp_url: Optional[str] = None) -> dict[str, str]:
    """The client files a workspace carries for `wiring` (agents/clients.py is their one home); a corpus
    on disk is kept from the agent's shell like the state dir. `mcp_url`: the clients reach a running server
    there (the separate-user deployment) instead of starting one."""
    from mcp_server.agents import clients
    from mcp_server.loop.sandbox import agent_private_paths

    private = agent_private_paths(corpus, root)
    return clients.workspace_files(root, python, state_dir, wiring, private=private, mcp_url=mcp_url)


def init_workspace(directory: Path | str, tag: str = "main", corpus: str = cfgmod.DEFAULT_CORPUS,
                   time_budget: Optional[float] = None, force: bool = False,
                   overrides: Optional[dict] = None, bench_dir: Optional[Path] = None,
                   wiring: str | Mapping[str, str] = "workspace", mcp_url: Optional[str] = None,
                   target: Optional[str] = None) -> Workspace:
    """Create a workspace (or a new campaign in an existing one) and return it.

    `bench_dir` holds prepare.py, train.py and program.md (default: the bundled GPT benchmark).
    `target`: a bundled target's name or a folder (or git repository) with a loopwright.toml that has a
    [target] section (loop/targets.py); the workspace is made from a copy of it.

    Refuses an existing tag, and a dirty or foreign repository unless force=True.
    """
    root = Path(directory).expanduser().resolve()
    cfgmod.CampaignConfig(tag=tag)  # validates the tag early, with a clear message
    existing = (root / cfgmod.CONFIG_NAME).is_file()
    if existing:
        if target is not None:
            raise WorkspaceError(f"{root} is already a loopwright workspace; --target makes a new one: name a new "
                                 "(or empty) directory")
        return _new_campaign(Workspace.open(root), tag, force)
    if target is not None:
        return _init_target(root, target, tag, force, wiring, mcp_url)

    src = Path(bench_dir) if bench_dir else bench_source_dir()
    missing = [f for f in bench_files(src) if not (src / f).is_file()]
    if missing:
        raise WorkspaceError(f"benchmark folder {src} lacks {', '.join(missing)}")
    if root == src.resolve():
        # keeps commit train.py in the workspace: here they would rewrite the reference baseline itself
        raise WorkspaceError(f"{root} is the benchmark folder itself; its train.py is the reference baseline, "
                             "which a campaign's keeps must never rewrite. Choose another directory")
    bench_version(src)   # a malformed VERSION is refused before anything is created
    if corpus not in cfgmod.NAMED_CORPORA:
        if not Path(corpus).expanduser().exists():
            raise WorkspaceError(f"--corpus {corpus!r}: no such file or folder; use stdlib-hidden, stdlib, "
                                 "tinystories, climbmix or a path to text files")
        corpus = str(Path(corpus).expanduser().resolve())
        if Path(corpus) == root or root in Path(corpus).parents or Path(corpus) in root.parents:
            raise WorkspaceError(f"--corpus {corpus} is inside the workspace {root} (or contains it): the agent "
                                 "edits and reads the workspace, and its val/test text must stay out of reach; "
                                 "keep the corpus in a folder of its own, outside the workspace")
    from mcp_server.loop.sandbox import SandboxUnavailable, refuse_python_inside

    try:
        refuse_python_inside(root)
    except SandboxUnavailable as e:
        raise WorkspaceError(str(e)) from None
    fresh = not root.exists() or not any(root.iterdir())
    if not fresh:
        if (root / ".git").exists() and not force:
            raise WorkspaceError(f"{root} is an existing git repository that is not a loopwright workspace; "
                                 "choose an empty directory, or pass --force to add a workspace to it")
        if not force:
            raise WorkspaceError(f"{root} is not empty; choose a new directory or pass --force")
        if (root / ".git").exists() and gitops.is_dirty(root):
            raise WorkspaceError(f"{root} has uncommitted changes; commit or stash them first")
    existed = root.exists()
    try:
        return _create(root, src, tag, corpus, time_budget, overrides, wiring, mcp_url)
    except BaseException:
        # A half-made workspace would block the next `init`: remove what this call created.
        if fresh:
            shutil.rmtree(root, ignore_errors=True)
            if existed:
                root.mkdir(parents=True, exist_ok=True)
        raise


def _new_id(root: Path) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", root.name).strip("-.")[:40] or "ws"
    return f"{slug}-{secrets.token_hex(6)}"


def create_state_dir(root: Path, workspace_id: Optional[str] = None) -> tuple[str, Path]:
    """Make a fresh private state directory for the workspace at `root`; returns (id, path)."""
    home = state_home()
    _inside_ws = is_inside(home, root.resolve())
    if _inside_ws:
        raise StateDirError(f"LOOPWRIGHT_HOME={home} is inside the workspace {root}; the loop's state must live "
                            "outside it (the agent can write the workspace)")
    for d in (home, home / "workspaces"):
        if not d.exists():
            make_private_dir(d)
    wid = workspace_id or _new_id(root)
    state = state_dir_for(wid)
    state.mkdir(mode=0o700)          # never reuse an existing one
    os.chmod(state, 0o700)
    check_state_dir(state, root)
    write_record(state, {"id": wid, "root": str(root.resolve()), "pinned_commit": None, "uid": os.geteuid(),
                         "created_at": time.time(), "layout": 2})
    return wid, state


def _write_id(root: Path, wid: str) -> None:
    _write(root / ".loopwright" / ID_NAME, wid + "\n")


def _create(root: Path, src: Path, tag: str, corpus: str, time_budget: Optional[float],
            overrides: Optional[dict], wiring: str | Mapping[str, str] = "workspace",
            mcp_url: Optional[str] = None) -> Workspace:
    root.mkdir(parents=True, exist_ok=True)
    wid, state = create_state_dir(root)
    try:
        return _create_in(root, state, wid, src, tag, corpus, time_budget, overrides, wiring, mcp_url)
    except BaseException:
        shutil.rmtree(state, ignore_errors=True)
        raise


def _create_in(root: Path, state: Path, wid: str, src: Path, tag: str, corpus: str, time_budget: Optional[float],
               overrides: Optional[dict], wiring: str | Mapping[str, str] = "workspace",
               mcp_url: Optional[str] = None) -> Workspace:
    for name in bench_files(src):
        shutil.copyfile(src / name, root / name)

    data: dict = {"campaign": {"tag": tag}, "benchmark": {"corpus": corpus}}
    if time_budget is not None:
        data["benchmark"]["time_budget"] = float(time_budget)
    for section, values in (overrides or {}).items():
        if isinstance(values, dict):
            data.setdefault(section, {}).update(values)
        else:
            data[section] = values
    cfg = cfgmod.LoopwrightConfig.model_validate(data)
    # the benchmark's measured noise for this clock, unless the user chose a prior (frozen with [noise])
    prior = bench_noise_prior(src, cfg.benchmark.clock, cfg.benchmark.budget_tokens)
    raw_noise = data.get("noise")
    user_noise: dict = raw_noise if isinstance(raw_noise, dict) else {}
    if prior is not None and "sigma_prior" not in user_noise:
        data.setdefault("noise", {}).update({"sigma_prior": prior["sigma_prior"], **{
            k: prior[k] for k in ("prior_pairs", "spread_alpha") if k not in user_noise}})
        cfg = cfgmod.LoopwrightConfig.model_validate(data)
    else:
        prior = None
    # Operational settings go to the state directory, the frozen ones to the workspace.
    setmod.save(state / setmod.SETTINGS_NAME, setmod.validate(
        {k: v for k, v in cfg.model_dump(mode="json", exclude_none=True).items() if k in cfgmod.OPERATIONAL_SECTIONS}))
    _write(root / cfgmod.CONFIG_NAME, _config_header() + cfgmod.dump_config(cfg))
    _write(root / "AGENTS.md", agent_pointer("codex"))
    _write(root / "CLAUDE.md", agent_pointer("claude"))
    for rel, text in client_configs(root, sys.executable, state, wiring, corpus, mcp_url).items():
        _write(root / rel, text)
    _ignore_state(root, cfg, ("*.pt2",))
    _write_id(root, wid)

    ws = Workspace(root, cfg, state)
    meta = prepare_data(root, ws.data_dir, corpus)
    lock = {**{n: gitops.file_sha256(root / n) for n in EVALUATOR_PY if (root / n).is_file()},
            "config_frozen": cfg.frozen_hash(),
            "data": data_hashes(meta), "tokenizer": meta.get("tokenizer"), "corpus": meta.get("corpus"),
            "workspace_id": wid, "benchmark_version": bench_version(src),
            **({"noise_prior": {"file": BENCH_NOISE_NAME, "sha256": prior["sha256"], "clock": cfg.benchmark.clock}}
               if prior is not None else {})}
    _pin_and_start(ws, lock, tag, f"loopwright: pin evaluator and baseline ({tag})", {})
    ws.sync_train_view()
    return ws


def _pin_and_start(ws: Workspace, lock: dict, tag: str, message: str, event: dict) -> str:
    """Write the lock, make the pinned commit, record it where the agent cannot write, open the campaign's
    branch and its first ledger rows; the pinned commit."""
    _write(ws.root / LOCK_NAME, json.dumps(lock, indent=2, sort_keys=True) + "\n")
    pinned = gitops.init_repo_and_pin(ws.root, message)
    # The pinned commit, recorded in a second place the agent cannot write (the ledger is the first).
    write_record(ws.state_dir, {**read_record(ws.state_dir), "pinned_commit": pinned,
                                "lock_sha256": gitops.file_sha256(ws.root / LOCK_NAME)})
    branch = gitops.campaign_branch(tag)
    gitops.create_branch(ws.root, branch, pinned, checkout=True)
    with ws.ledger() as ledger:
        cid = ledger.create_campaign(tag, branch, pinned)
        ledger.add_event(cid, "campaign_start", {"tag": tag, "pinned_commit": pinned, **event},
                         sinks=sinks_for(ws.cfg))
    integrity.snapshot_pin(ws, pinned)      # a copy of the pinned objects, to repair a rewritten one
    return pinned


def _ignore_state(root: Path, cfg: cfgmod.LoopwrightConfig, extra: tuple[str, ...]) -> None:
    """The workspace's .gitignore keeps the local state dir and caches out of every commit."""
    gitignore = root / ".gitignore"
    lines = gitignore.read_text().splitlines() if gitignore.exists() else []
    for entry in (f"/{cfg.paths.state_dir}/", "__pycache__/", *extra):
        if entry not in lines:
            lines.append(entry)
    _write(gitignore, "\n".join(lines) + "\n")


def _init_target(root: Path, target: str, tag: str, force: bool, wiring: str | Mapping[str, str],
                 mcp_url: Optional[str]) -> Workspace:
    from mcp_server.loop import targets
    from mcp_server.loop.sandbox import SandboxUnavailable, refuse_python_inside

    src = targets.resolve_source(target)
    if root == src.root or is_inside(root, src.root) or is_inside(src.root, root):
        raise WorkspaceError(f"the workspace {root} and the target {src.root} overlap; the workspace is a copy of "
                             "the target (its keeps must never rewrite the original): choose another directory")
    try:
        refuse_python_inside(root)
    except SandboxUnavailable as e:
        raise WorkspaceError(str(e)) from None
    fresh = not root.exists() or not any(root.iterdir())
    if not fresh and not force:
        raise WorkspaceError(f"{root} is not empty; choose a new directory (a target workspace is a fresh copy)")
    if not fresh and (root / ".git").exists():
        raise WorkspaceError(f"{root} is a git repository; a target workspace is a fresh copy of the target: "
                             "choose a new directory")
    existed = root.exists()
    root.mkdir(parents=True, exist_ok=True)
    wid, state = create_state_dir(root)
    try:
        return _create_target_in(root, state, wid, src, tag, wiring, mcp_url)
    except BaseException:
        shutil.rmtree(state, ignore_errors=True)
        if fresh:
            shutil.rmtree(root, ignore_errors=True)
            if existed:
                root.mkdir(parents=True, exist_ok=True)
        raise


def _create_target_in(root: Path, state: Path, wid: str, src, tag: str, wiring: str | Mapping[str, str],
                      mcp_url: Optional[str]) -> Workspace:
    from mcp_server.loop import targets

    cfg = src.cfg.model_copy(update={"campaign": cfgmod.CampaignConfig(tag=tag)})
    assert cfg.target is not None
    ws = Workspace(root, cfg, state)
    # the hidden files go to the state directory (the evaluator's data), never into the workspace
    hidden = {}
    for rel, data in sorted(src.files.items()):
        if targets.matches(rel, cfg.paths.hidden):
            dest = ws.data_dir / rel
            dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            dest.write_bytes(data)
            hidden[rel] = gitops.file_sha256(dest)
        elif rel not in (cfgmod.CONFIG_NAME, LOCK_NAME):
            _write_bytes(root / rel, data)
    setmod.save(state / setmod.SETTINGS_NAME, setmod.validate(
        {k: v for k, v in cfg.model_dump(mode="json", exclude_none=True).items() if k in cfgmod.OPERATIONAL_SECTIONS}))
    _write(root / cfgmod.CONFIG_NAME, _config_header() + cfgmod.dump_config(cfg))
    editable = tuple(targets.editable_files(root, cfg))
    _write(root / "AGENTS.md", agent_pointer("codex", editable))
    _write(root / "CLAUDE.md", agent_pointer("claude", editable))
    for rel, text in client_configs(root, sys.executable, state, wiring, "", mcp_url).items():
        _write(root / rel, text)
    _ignore_state(root, cfg, ())
    _write_id(root, wid)
    lock = {"config_frozen": cfg.frozen_hash(), "data": hidden, "workspace_id": wid,
            "target": cfg.target.name, "target_source": str(src.root), "benchmark_version": None}
    _pin_and_start(ws, lock, tag, f"loopwright: pin target {cfg.target.name} ({tag})", {"target": cfg.target.name})
    return ws


def _write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _new_campaign(ws: Workspace, tag: str, force: bool) -> Workspace:
    with ws.ledger() as ledger:
        if ledger.campaign(tag=tag) is not None:
            raise WorkspaceError(f"campaign tag {tag!r} already exists in {ws.root}; choose another --tag "
                                 f"(existing: {', '.join(c for c in _tags(ledger))})")
        if gitops.is_dirty(ws.root) and not force:
            raise WorkspaceError(f"{ws.root} has uncommitted changes to tracked files; revert them "
                                 "(`loopwright revert`) or pass --force")
        pinned = ws.pinned_commit or gitops.root_commit(ws.root)
        branch = gitops.campaign_branch(tag)
        gitops.create_branch(ws.root, branch, pinned, checkout=True)
        cid = ledger.create_campaign(tag, branch, pinned)
        ledger.add_event(cid, "campaign_start", {"tag": tag, "pinned_commit": pinned}, sinks=sinks_for(ws.cfg))
    return ws


def _tags(ledger: Ledger) -> list[str]:
    return [tag for tag, _ in ledger.campaign_names()]


def _config_header() -> str:
    return ("# loopwright workspace configuration: what decides the score.\n"
            "# [benchmark], [paths] and [noise] are frozen at `loopwright init`; any change is tampering.\n"
            "# Budgets, schedules and connectors ([budget], [[schedule]], [slack], [jira], [webhook], [campaign])\n"
            "# do not go here: they live outside the workspace, out of the agent's reach. Change them with\n"
            "#     loopwright config set budget.max_experiments 40\n"
            "# (`loopwright config show` prints them). Copies of them in this file are ignored.\n\n")


# ---------------------------------------------------------------------------
# migration of old workspaces (state inside the workspace) and relinking a moved one

def migrate_workspace(directory: Path | str) -> list[str]:
    """Move an old workspace's state (.loopwright/state.db, data, runs, ...) to a new state directory.

    The ledger is copied with SQLite's online backup (a consistent snapshot; every row), then the raw
    old files are kept in the state directory as well, and only then removed from the workspace.
    Operational sections of loopwright.toml are copied into settings.toml once. Returns what was done."""
    import sqlite3

    root = Path(directory).expanduser().resolve()
    local = root / ".loopwright"
    if not old_layout(root):
        if (local / ID_NAME).is_file():
            raise WorkspaceError(f"{root} already keeps its state outside the workspace "
                                 f"({(local / ID_NAME).read_text().strip()}); nothing to migrate")
        raise WorkspaceError(f"{root} has no .loopwright/state.db; it is not an old loopwright workspace")
    cfg = cfgmod.load_config(root)
    toml_ops = cfgmod.operational_data((root / cfgmod.CONFIG_NAME).read_text(encoding="utf-8"))
    seeded = setmod.validate(toml_ops, f"{root / cfgmod.CONFIG_NAME} (operational sections)")
    held = FileLock(local / "server.lock").try_acquire()
    if held is None:
        raise WorkspaceError("an experiment is running in this workspace; migrate when it has finished "
                             "(stop the MCP server / agent session first)")
    try:
        locked = lock_workspace_id(root)     # a workspace whose lock already names its id keeps it
        wid, state = create_state_dir(root, locked if locked and not state_dir_for(locked).exists() else None)
        done: list[str] = [f"created the state directory {state} (0700)"]
        try:
            src = sqlite3.connect(local / "state.db")
            dst = sqlite3.connect(state / "state.db")
            try:
                src.backup(dst)       # a consistent copy of every row, WAL included
            finally:
                dst.close()
                src.close()
            os.chmod(state / "state.db", 0o600)
            with Ledger(state / "state.db") as ledger:
                c = ledger.campaign(campaign_id=1) or ledger.campaign()
                pinned = c["pinned_commit"] if c else None
            done.append("copied the ledger (SQLite backup)")
            setmod.save(state / setmod.SETTINGS_NAME, seeded)
            if toml_ops:
                done.append(f"copied [{'], ['.join(toml_ops)}] from loopwright.toml into settings.toml; from now on "
                            "change them with `loopwright config set`")
            keep = state / "pre-migration"
            make_private_dir(keep)
            for name in ("state.db", "state.db-wal", "state.db-shm"):
                if (local / name).is_file():
                    shutil.copy2(local / name, keep / name)
            for entry in sorted(local.iterdir()):
                if entry.name in ("reports", "server.lock", ID_NAME) or entry.name.startswith("state.db"):
                    continue
                target = state / entry.name
                if entry.is_dir() and not entry.is_symlink():
                    shutil.copytree(entry, target, symlinks=True)
                elif not entry.is_symlink():
                    shutil.copy2(entry, target)
            write_record(state, {**read_record(state), "pinned_commit": pinned,
                                 "lock_sha256": gitops.file_sha256(root / LOCK_NAME) if (root / LOCK_NAME).is_file()
                                 else None, "migrated_at": time.time()})
        except BaseException:
            shutil.rmtree(state, ignore_errors=True)
            raise
        # Everything is in place: switch over, then remove the agent-reachable originals.
        _write_id(root, wid)
        for entry in sorted(local.iterdir()):
            if entry.name in ("reports", "server.lock", ID_NAME):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        done.append(f"moved data, runs and logs to {state}; the workspace keeps reports/ and the id only")
        ws = Workspace(root, cfg, state)
        if (ws.data_dir / "train.bin").is_file():
            ws.sync_train_view()
        if pinned:
            try:
                integrity.snapshot_pin(ws, pinned)
                done.append("kept a copy of the pinned git objects in the state directory")
            except gitops.GitError as e:
                done.append(f"could not copy the pinned git objects ({e}); check the history with `git fsck`")
        return done
    finally:
        held.release()


def relink_workspace(directory: Path | str) -> str:
    """After moving a workspace directory: record its new path in its state directory, once the pinned
    commit there is found in this repository (so a copy cannot adopt another workspace's state)."""
    root = Path(directory).expanduser().resolve()
    wid = (root / ".loopwright" / ID_NAME).read_text().strip()
    state = state_dir_for(wid)
    check_state_dir(state, root)
    rec = read_record(state)
    locked = lock_workspace_id(root)
    if locked is not None and locked != wid:
        raise StateDirError(f"the id file says {wid!r} but loopwright.lock says {locked!r}; restore the id file")
    pinned = rec.get("pinned_commit")
    try:
        ok = bool(pinned) and gitops.verified_blob_bytes(root, str(pinned), LOCK_NAME) is not None
    except Exception:  # noqa: BLE001 - any git failure means "not this repository's pin"
        ok = False
    if not ok:
        raise StateDirError(f"the state directory {state} was pinned at {pinned}, which is not in {root}'s history; "
                            "this is not the same workspace")
    old = rec.get("root")
    if old and old != str(root) and Path(old).exists() and (Path(old) / ".loopwright" / ID_NAME).is_file():
        raise StateDirError(f"{old} still exists and uses this state directory; a state directory serves one "
                            "workspace (make a new one with `loopwright init`)")
    write_record(state, {**rec, "root": str(root), "relinked_at": time.time()})
    note = ""
    if old and old != str(root):
        note = (f"; the client files frozen at init (.mcp.json, .claude/settings.json, .codex/config.toml) still "
                f"name {old}: Claude Code and Codex sessions need the workspace back there, or a new workspace "
                "(the built-in agent needs neither; `loopwright doctor` checks)")
    return f"{state} now belongs to {root} (was {old}){note}"
