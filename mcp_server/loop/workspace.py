"""Workspaces: `loopwright init DIR` and the paths of one.

A workspace is a git repository whose first commit (the *pinned commit*) holds
the frozen evaluator, the editable train.py, the spec and the frozen config.

The loop's own state -- the ledger, the data (train/val/test), run directories,
locks, tamper evidence and the operational settings -- lives in a *state
directory* outside the workspace, where the agent's shell (confined to the
workspace by the client's sandbox) and train.py (bubblewrap) cannot write, and
the hidden splits cannot be read:

    ${LOOPWRIGHT_HOME:-${XDG_DATA_HOME:-~/.local/share}/loopwright}/workspaces/<id>/   (0700)

The workspace names it only by an id (`.loopwright/workspace-id`, and for new
workspaces also the committed loopwright.lock). The state directory records the
workspace path and the pinned commit (`workspace.json`); opening refuses a state
directory inside the workspace, not owned by the current user, group/world
writable, or recording another workspace. The git-ignored `.loopwright/` in the
workspace keeps only derived, human-facing things: the id, reports, and a copy
of the training split for train.py (`train_view_dir`).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Optional

from mcp_server.common.locks import FileLock
from mcp_server.ledger.store import Ledger
from mcp_server.loop import config as cfgmod
from mcp_server.loop import gitops
from mcp_server.loop import settings as setmod

LOCK_NAME = "loopwright.lock"   # committed manifest of what decides the score
BENCH_FILES = ("prepare.py", "train.py", "program.md")
ID_NAME = "workspace-id"          # in the workspace's .loopwright/: which state directory is ours
RECORD_NAME = "workspace.json"    # in the state directory: which workspace it belongs to, the pinned commit
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
# What train.py may see of the data: the training split and what decoding it needs. val/test never.
TRAIN_VIEW_FILES = ("meta.json", "token_bytes.npy", "tokenizer.json", "peak_flops.json")
QUICK_EVAL_MAX_TOKENS = 262_144   # train.py's quick "val" is this many tokens carved from the end of train


class WorkspaceError(RuntimeError):
    """A workspace problem, phrased as what to do about it."""


class StateDirError(WorkspaceError):
    """The state directory is missing, unsafe, or belongs to another workspace (possible tampering)."""


def bench_source_dir(name: str = "gpt") -> Path:
    """Where the bundled benchmark files live (source checkout or installed data files)."""
    candidates = [Path(__file__).resolve().parents[2] / "bench" / name]   # a source checkout
    try:   # an installed wheel: the benchmark is package data of mcp_server._bench, a namespace package
        import importlib.util  # (no __init__.py), so it may have several locations

        spec = importlib.util.find_spec("mcp_server._bench")
        candidates += [Path(p) / name for p in (spec.submodule_search_locations or [])] if spec else []
    except (ImportError, ValueError):
        pass
    for c in candidates:
        if all((c / f).is_file() for f in BENCH_FILES):
            return c
    raise WorkspaceError(f"bundled benchmark '{name}' not found (looked in {', '.join(map(str, candidates))}); "
                         "reinstall loopwright")


# ---------------------------------------------------------------------------
# the state directory

def state_home() -> Path:
    """Where state directories live: $LOOPWRIGHT_HOME, else $XDG_DATA_HOME/loopwright, else
    ~/.local/share/loopwright."""
    if os.environ.get("LOOPWRIGHT_HOME"):
        return Path(os.environ["LOOPWRIGHT_HOME"]).expanduser().resolve()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return (Path(base).expanduser() / "loopwright").resolve()


def state_dir_for(workspace_id: str) -> Path:
    if not _ID_RE.match(workspace_id or ""):
        raise StateDirError(f"workspace id {workspace_id!r} is malformed (letters, digits, . _ - only); "
                            "the id file .loopwright/workspace-id was changed -- restore it")
    return state_home() / "workspaces" / workspace_id


def _inside(child: Path, parent: Path) -> bool:
    try:
        child.relative_to(parent)
        return True
    except ValueError:
        return False


def check_state_dir(state: Path, root: Path) -> None:
    """Refuse a state directory the agent could write, or one inside the workspace."""
    try:
        st = os.lstat(state)
    except FileNotFoundError:
        raise StateDirError(f"the state directory {state} does not exist; if this workspace was moved from "
                            "another machine or its state was deleted, re-create it with `loopwright init`") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise StateDirError(f"{state} is a symlink or not a directory; the loop's state must be a plain "
                            "directory outside the workspace")
    real, ws = state.resolve(), root.resolve()
    if _inside(real, ws) or _inside(ws, real):
        raise StateDirError(f"the state directory {real} is inside the workspace {ws} (or contains it): the agent "
                            "could rewrite the ledger. Point LOOPWRIGHT_HOME outside the workspace")
    if st.st_uid != os.geteuid():
        raise StateDirError(f"{state} is owned by uid {st.st_uid}, not by the user running the loop "
                            f"(uid {os.geteuid()}); run the loop as the owner of its state")
    if st.st_mode & 0o022:
        raise StateDirError(f"{state} is group- or world-writable (mode {stat.S_IMODE(st.st_mode):o}); "
                            f"`chmod 700 {state}` and check its contents were not changed")


def _make_private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)


def read_record(state: Path) -> dict:
    try:
        return json.loads((state / RECORD_NAME).read_text())
    except (OSError, ValueError) as e:
        raise StateDirError(f"{state / RECORD_NAME} is missing or unreadable ({e}); the state directory is "
                            "incomplete -- restore it from a backup or re-create the workspace") from None


def write_record(state: Path, record: dict) -> None:
    tmp = state / (RECORD_NAME + ".tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, state / RECORD_NAME)


def lock_workspace_id(root: Path) -> Optional[str]:
    """The id in the working tree's loopwright.lock (new workspaces commit it at init)."""
    try:
        return json.loads((root / LOCK_NAME).read_text()).get("workspace_id")
    except (OSError, ValueError, AttributeError):
        return None


def old_layout(root: Path) -> bool:
    """A workspace made before the state moved out (its ledger still at .loopwright/state.db)."""
    return (root / ".loopwright" / "state.db").is_file() and not (root / ".loopwright" / ID_NAME).is_file()


_WARNED: set[str] = set()


class Workspace:
    """A workspace and its state directory. `cfg` is the merged configuration: the frozen sections from
    loopwright.toml, the operational ones from the state directory's settings.toml (re-read when it changes)."""

    def __init__(self, root: Path, cfg: cfgmod.LoopwrightConfig, state_dir: Path):
        self.root = Path(root)
        self._frozen = cfg
        self._state_dir = Path(state_dir)
        self._merged: Optional[tuple[object, cfgmod.LoopwrightConfig]] = None
        self.warnings: list[str] = []

    @classmethod
    def open(cls, root: Path | str) -> "Workspace":
        root = Path(root).expanduser().resolve()
        cfg = cfgmod.load_config(root)
        if not (root / ".git").exists():
            raise WorkspaceError(f"{root} has a loopwright.toml but is not a git repository; "
                                 "create workspaces with `loopwright init DIR`")
        if old_layout(root):
            raise WorkspaceError(f"{root} keeps the loop's state inside the workspace (.loopwright/state.db), where "
                                 "the agent can rewrite it. Move it out, keeping every row, with:\n"
                                 f"    loopwright migrate --workspace {root}")
        ws = cls(root, cfg, cls._resolve_state(root))
        ws._check_operational_edits()
        return ws

    @staticmethod
    def _resolve_state(root: Path) -> Path:
        id_file = root / ".loopwright" / ID_NAME
        try:
            wid = id_file.read_text().strip()
        except OSError:
            raise WorkspaceError(f"{root} has no {id_file.relative_to(root)} naming its state directory; if it "
                                 "was deleted, restore it (the id is in loopwright.lock, or in "
                                 f"{state_home() / 'workspaces'}/*/{RECORD_NAME}) -- or run `loopwright init`") from None
        locked = lock_workspace_id(root)
        if locked is not None and locked != wid:
            raise StateDirError(f"{id_file} says {wid!r} but the committed loopwright.lock says {locked!r}: the id "
                                f"was changed (tampering?). Restore it: echo {locked} > {id_file}")
        state = state_dir_for(wid)
        check_state_dir(state, root)
        rec = read_record(state)
        if rec.get("id") != wid or Path(rec.get("root", "")) != root:
            raise StateDirError(f"the state directory {state} belongs to workspace {rec.get('root')!r}, not {root}. "
                                "If you moved this workspace, record the new place with "
                                f"`loopwright migrate --workspace {root} --relink`; otherwise the id file was "
                                "tampered with -- restore it")
        return state

    @classmethod
    def find(cls, start: Path | str | None = None) -> "Workspace":
        """The workspace containing `start` (default: $LOOPWRIGHT_WORKSPACE or the cwd)."""
        start = Path(start or os.environ.get("LOOPWRIGHT_WORKSPACE") or Path.cwd()).expanduser().resolve()
        for d in (start, *start.parents):
            if (d / cfgmod.CONFIG_NAME).is_file():
                return cls.open(d)
        raise WorkspaceError(f"no loopwright.toml in {start} or its parents; run `loopwright init DIR` "
                             "or pass --workspace DIR")

    # -- configuration --------------------------------------------------------
    @property
    def settings_path(self) -> Path:
        return self._state_dir / setmod.SETTINGS_NAME

    def settings(self) -> setmod.Settings:
        return setmod.load(self.settings_path)

    @property
    def cfg(self) -> cfgmod.LoopwrightConfig:
        key = (id(self._frozen), setmod.stat_key(self.settings_path))
        if self._merged is None or self._merged[0] != key:
            data = self._frozen.model_dump(mode="json", include=set(cfgmod.FROZEN_SECTIONS))
            data.update(self.settings().model_dump(mode="json"))
            self._merged = (key, cfgmod.LoopwrightConfig.model_validate(data))
        return self._merged[1]

    @cfg.setter
    def cfg(self, value: cfgmod.LoopwrightConfig) -> None:
        self._frozen = value
        self._merged = None

    def reload_config(self) -> None:
        self.cfg = cfgmod.load_config(self.root)

    def _check_operational_edits(self) -> None:
        """Operational sections in loopwright.toml are ignored; say so when they differ from the settings."""
        try:
            found = cfgmod.operational_data((self.root / cfgmod.CONFIG_NAME).read_text(encoding="utf-8"))
        except OSError:
            return
        if not found:
            return
        mine = setmod.data_of(self.settings())
        try:
            theirs = setmod.data_of(setmod.Settings.model_validate({**mine, **found}))
        except Exception:  # noqa: BLE001 - invalid copies are ignored just the same
            theirs = None
        differ = sorted(k for k in found if theirs is None or theirs.get(k) != mine.get(k))
        if differ:
            msg = (f"loopwright.toml sets [{'], ['.join(differ)}], which the loop ignores: operational settings live "
                   f"in {self.settings_path} and change only with `loopwright config set KEY VALUE` "
                   "(`loopwright config show` prints them)")
            self.warnings.append(msg)
            if msg not in _WARNED:          # once per process (the server opens the workspace per call)
                _WARNED.add(msg)
                print(f"loopwright: warning: {msg}", file=sys.stderr)

    # -- paths ----------------------------------------------------------------
    @property
    def state_dir(self) -> Path:
        """The loop's private state (outside the workspace, 0700)."""
        return self._state_dir

    @property
    def local_dir(self) -> Path:
        """The workspace's git-ignored .loopwright/: id, reports, the train view. Agent-writable."""
        return self.root / self.cfg.paths.state_dir

    @property
    def data_dir(self) -> Path:
        """All splits (train, val, test) and meta.json: read by the evaluator only."""
        return self._state_dir / "data"

    @property
    def train_view_dir(self) -> Path:
        """What train.py may see of the data (prepared by sync_train_view): the training split minus a
        tail carved off as the 'val' of train.py's quick look, meta.json and the tokenizer files. The
        sandbox binds it read-only where prepare.py looks (<workspace>/.loopwright/data)."""
        return self._state_dir / "train-view"

    @property
    def workspace_data_dir(self) -> Path:
        """Where the workspace's prepare.py looks for data when train.py imports it."""
        return self.local_dir / "data"

    @property
    def runs_dir(self) -> Path:
        return self._state_dir / "runs"

    @property
    def reports_dir(self) -> Path:
        return self.local_dir / "reports"

    @property
    def tamper_dir(self) -> Path:
        return self._state_dir / "tamper"

    @property
    def db_path(self) -> Path:
        return self._state_dir / "state.db"

    @property
    def lock_path(self) -> Path:
        return self._state_dir / "server.lock"

    def run_dir(self, experiment_id: int) -> Path:
        return self.runs_dir / f"{experiment_id:05d}"

    def ledger(self) -> Ledger:
        return Ledger(self.db_path)

    def record(self) -> dict:
        return read_record(self._state_dir)

    @property
    def pinned_commit(self) -> Optional[str]:
        """The pinned commit as recorded at init in the state directory (cross-checked with the ledger)."""
        return self.record().get("pinned_commit")

    def sync_train_view(self, into: Optional[Path] = None) -> Path:
        """Build the train view (once per data change) and, for runs without a sandbox, copy it to
        `into` (default: the workspace's .loopwright/data). Returns the view directory."""
        view = self.train_view_dir
        src = self.data_dir / "train.bin"
        stamp = view / ".source"
        key = f"{src.stat().st_size}:{src.stat().st_mtime_ns}" if src.is_file() else ""
        if not stamp.is_file() or stamp.read_text() != key:
            tmp = self._state_dir / "train-view.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            _make_private_dir(tmp)
            if src.is_file():
                data = src.read_bytes()
                carve = 2 * min(QUICK_EVAL_MAX_TOKENS, len(data) // 20)   # uint16 tokens
                (tmp / "train.bin").write_bytes(data[:len(data) - carve])
                (tmp / "val.bin").write_bytes(data[len(data) - carve:])
            for name in TRAIN_VIEW_FILES:
                if (self.data_dir / name).is_file():
                    shutil.copyfile(self.data_dir / name, tmp / name)
            (tmp / ".source").write_text(key)
            shutil.rmtree(view, ignore_errors=True)
            os.replace(tmp, view)
        dest = self.workspace_data_dir if into is None else into
        if dest is not None:
            _mirror(view, dest)
        return view


def _mirror(src: Path, dest: Path) -> None:
    """Make `dest` hold exactly src's files (copies, never links: train.py must not reach the state dir)."""
    if dest.is_symlink():
        dest.unlink()
    dest.mkdir(parents=True, exist_ok=True)
    wanted = {p.name for p in src.iterdir() if p.is_file() and not p.name.startswith(".")}
    for p in dest.iterdir():
        if p.name not in wanted:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
    for name in wanted:
        s, d = src / name, dest / name
        ss = s.stat()
        if d.is_symlink() or not d.is_file() or (d.stat().st_size, d.stat().st_mtime_ns) != (ss.st_size, ss.st_mtime_ns):
            d.unlink(missing_ok=True)
            shutil.copy2(s, d)


# ---------------------------------------------------------------------------
# init

def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def agent_pointer(kind: str) -> str:
    who = "Claude Code" if kind == "claude" else "Codex"
    return (f"# loopwright workspace ({who})\n\n"
            "Read `program.md` first and follow it on every run: it is the spec of this research loop.\n\n"
            "- Only `train.py` may be edited. `prepare.py`, `loopwright.toml`, the data and `.loopwright/` are "
            "frozen and guarded.\n"
            "- Work through the loopwright MCP tools: `state_read`, `run_experiment`, `score`, `revert`, "
            "`budget_check`, `note`, `suggest_next`.\n"
            "- Never stop to ask whether to continue: the loop runs until `budget_check` says should_stop.\n")


def client_configs(root: Path, python: str, state_dir: Optional[Path] = None,
                   wiring: str | Mapping[str, str] = "workspace") -> dict[str, str]:
    """The client files a workspace carries for `wiring` (agents/clients.py is their one home)."""
    from mcp_server.agents import clients

    return clients.workspace_files(root, python, state_dir, wiring)


def prepare_data(root: Path, data_dir: Path, corpus: Optional[str] = None, prepare_py: Optional[Path] = None,
                 timeout: float = 1800) -> dict:
    """Run the workspace's prepare.py to build (or rebuild) the data; returns meta.json."""
    cmd = [sys.executable, str(prepare_py or root / "prepare.py"), "prepare", "--data-dir", str(data_dir)]
    if corpus:
        cmd += ["--corpus", corpus]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout)[-1500:]
        raise WorkspaceError(f"data preparation failed (exit {proc.returncode}):\n{tail}")
    meta = data_dir / "meta.json"
    if not meta.is_file():
        raise WorkspaceError(f"prepare.py did not write {meta}")
    return json.loads(meta.read_text())


def data_hashes(meta: dict) -> dict[str, str]:
    return dict(sorted(meta.get("files", {}).items()))


def init_workspace(directory: Path | str, tag: str = "main", corpus: str = "stdlib",
                   time_budget: Optional[float] = None, force: bool = False,
                   overrides: Optional[dict] = None, bench_dir: Optional[Path] = None,
                   wiring: str | Mapping[str, str] = "workspace") -> Workspace:
    """Create a workspace (or a new campaign in an existing one) and return it.

    `bench_dir` holds prepare.py, train.py and program.md (default: the bundled GPT benchmark).

    Refuses an existing tag, and a dirty or foreign repository unless force=True.
    """
    root = Path(directory).expanduser().resolve()
    cfgmod.CampaignConfig(tag=tag)  # validates the tag early, with a clear message
    existing = (root / cfgmod.CONFIG_NAME).is_file()
    if existing:
        return _new_campaign(Workspace.open(root), tag, force)

    src = Path(bench_dir) if bench_dir else bench_source_dir()
    missing = [f for f in BENCH_FILES if not (src / f).is_file()]
    if missing:
        raise WorkspaceError(f"benchmark folder {src} lacks {', '.join(missing)}")
    if corpus not in ("stdlib", "tinystories", "climbmix"):
        if not Path(corpus).expanduser().exists():
            raise WorkspaceError(f"--corpus {corpus!r}: no such file or folder; use stdlib, tinystories, climbmix "
                                 "or a path to text files")
        corpus = str(Path(corpus).expanduser().resolve())
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
        return _create(root, src, tag, corpus, time_budget, overrides, wiring)
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
    _inside_ws = _inside(home, root.resolve())
    if _inside_ws:
        raise StateDirError(f"LOOPWRIGHT_HOME={home} is inside the workspace {root}; the loop's state must live "
                            "outside it (the agent can write the workspace)")
    for d in (home, home / "workspaces"):
        if not d.exists():
            _make_private_dir(d)
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
            overrides: Optional[dict], wiring: str | Mapping[str, str] = "workspace") -> Workspace:
    root.mkdir(parents=True, exist_ok=True)
    wid, state = create_state_dir(root)
    try:
        return _create_in(root, state, wid, src, tag, corpus, time_budget, overrides, wiring)
    except BaseException:
        shutil.rmtree(state, ignore_errors=True)
        raise


def _create_in(root: Path, state: Path, wid: str, src: Path, tag: str, corpus: str, time_budget: Optional[float],
               overrides: Optional[dict], wiring: str | Mapping[str, str] = "workspace") -> Workspace:
    for name in BENCH_FILES:
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
    # Operational settings go to the state directory, the frozen ones to the workspace.
    setmod.save(state / setmod.SETTINGS_NAME, setmod.validate(
        {k: v for k, v in cfg.model_dump(mode="json", exclude_none=True).items() if k in cfgmod.OPERATIONAL_SECTIONS}))
    _write(root / cfgmod.CONFIG_NAME, _config_header() + cfgmod.dump_config(cfg))
    _write(root / "AGENTS.md", agent_pointer("codex"))
    _write(root / "CLAUDE.md", agent_pointer("claude"))
    for rel, text in client_configs(root, sys.executable, state, wiring).items():
        _write(root / rel, text)
    gitignore = root / ".gitignore"
    lines = gitignore.read_text().splitlines() if gitignore.exists() else []
    for entry in (f"/{cfg.paths.state_dir}/", "__pycache__/", "*.pt2"):
        if entry not in lines:
            lines.append(entry)
    _write(gitignore, "\n".join(lines) + "\n")
    _write_id(root, wid)

    ws = Workspace(root, cfg, state)
    meta = prepare_data(root, ws.data_dir, corpus)
    lock = {"prepare.py": gitops.file_sha256(root / "prepare.py"), "config_frozen": cfg.frozen_hash(),
            "data": data_hashes(meta), "tokenizer": meta.get("tokenizer"), "corpus": meta.get("corpus"),
            "workspace_id": wid}
    _write(root / LOCK_NAME, json.dumps(lock, indent=2, sort_keys=True) + "\n")

    pinned = gitops.init_repo_and_pin(root, f"loopwright: pin evaluator and baseline ({tag})")
    # The pinned commit, recorded in a second place the agent cannot write (the ledger is the first).
    write_record(state, {**read_record(state), "pinned_commit": pinned,
                         "lock_sha256": gitops.file_sha256(root / LOCK_NAME)})
    branch = gitops.campaign_branch(tag)
    gitops.create_branch(root, branch, pinned, checkout=True)
    with ws.ledger() as ledger:
        cid = ledger.create_campaign(tag, branch, pinned)
        ledger.add_event(cid, "campaign_start", {"tag": tag, "pinned_commit": pinned}, sinks=sinks_for(ws.cfg))
    from mcp_server.loop import integrity  # (integrity imports this module)
    integrity.snapshot_pin(ws, pinned)      # a copy of the pinned objects, to repair a rewritten one
    ws.sync_train_view()
    return ws


def sinks_for(cfg: cfgmod.LoopwrightConfig) -> list[str]:
    return [name for name in ("slack", "jira") if getattr(cfg, name) is not None]


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
    return [r[0] for r in ledger.conn.execute("SELECT tag FROM campaigns ORDER BY id")]


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
            _make_private_dir(keep)
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
            from mcp_server.loop import integrity
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
    return f"{state} now belongs to {root} (was {old})"
