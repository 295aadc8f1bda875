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

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from mcp_server.ledger.store import Ledger
from mcp_server.loop import config as cfgmod
from mcp_server.loop import settings as setmod

LOCK_NAME = "loopwright.lock"   # committed manifest of what decides the score
BENCH_FILES = ("prepare.py", "train.py", "program.md")
# prepare.py's frozen siblings: the evaluator and the .pt2 archive audit, which prepare.py loads by path
# (prepare.sibling). Pinned, hashed and read-only like prepare.py; a workspace made before the split has none.
EVALUATOR_SIBLINGS = ("evaluate.py", "pt2audit.py")
EVALUATOR_PY = ("prepare.py", *EVALUATOR_SIBLINGS)
# A benchmark folder's VERSION names its reference baseline ("v1"): the bundled train.py never changes within
# a version (a campaign's keeps live on its branch, records in bench/gpt/RECORDS.md); init writes it to the lock.
BENCH_VERSION_NAME = "VERSION"
# Its noise.toml declares the baseline's measured paired noise per budget clock (bench_noise_prior).
BENCH_NOISE_NAME = "noise.toml"
_VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$")
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


def _bundled_dirs(name: str) -> list[Path]:
    """Where a bundled folder under bench/ may live: the source checkout, then the installed package data."""
    candidates = [Path(__file__).resolve().parents[2] / "bench" / name]   # a source checkout
    try:   # an installed wheel: the benchmark is package data of mcp_server._bench, a namespace package
        import importlib.util  # (no __init__.py), so it may have several locations

        spec = importlib.util.find_spec("mcp_server._bench")
        candidates += [Path(p) / name for p in (spec.submodule_search_locations or [])] if spec else []
    except (ImportError, ValueError):
        pass
    return candidates


def bench_source_dir(name: str = "gpt") -> Path:
    """Where the bundled benchmark files live (source checkout or installed data files)."""
    candidates = _bundled_dirs(name)
    for c in candidates:
        if all((c / f).is_file() for f in BENCH_FILES):
            return c
    raise WorkspaceError(f"bundled benchmark '{name}' not found (looked in {', '.join(map(str, candidates))}); "
                         "reinstall loopwright")


def bench_files(src: Path) -> tuple[str, ...]:
    """The files a workspace copies from benchmark folder `src`: BENCH_FILES, and the siblings where its
    prepare.py loads them (an older or hand-made prepare.py that holds its evaluator itself needs none)."""
    try:
        split = b"def sibling(" in (src / "prepare.py").read_bytes()
    except OSError:
        split = False
    return BENCH_FILES + (EVALUATOR_SIBLINGS if split else ())


def pinned_evaluator(root: Path, pinned: str) -> dict[str, bytes]:
    """The evaluator's files from the pinned commit's git objects (re-hashed on the way): prepare.py, its
    siblings where the commit has them (not in a workspace made before the split), loopwright.toml."""
    # imported here: GitPython fails at import without a git on PATH, and the MCP server, which imports this
    # module, must start anyway to tell the agent what is missing (tests/e2e/test_wheel.py)
    from mcp_server.loop import gitops

    tracked = set(gitops.tracked_files(root, pinned))
    names = ("prepare.py", *(n for n in EVALUATOR_SIBLINGS if n in tracked), cfgmod.CONFIG_NAME)
    return {n: gitops.verified_blob_bytes(root, pinned, n) for n in names}


def bundled_targets() -> dict[str, Path]:
    """The bundled target folders (bench/targets/<name>/, each with a loopwright.toml), by name."""
    found: dict[str, Path] = {}
    for root in _bundled_dirs("targets"):
        for d in sorted(root.iterdir()) if root.is_dir() else []:
            if (d / "loopwright.toml").is_file():
                found.setdefault(d.name, d)   # the first location wins, like bench_source_dir
    return found


def bench_version(src: Path) -> Optional[str]:
    """The version a benchmark folder names in its VERSION file, None for a folder without one."""
    path = Path(src) / BENCH_VERSION_NAME
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8", errors="replace").strip()
    if not _VERSION_RE.match(text):
        raise WorkspaceError(f"{path} must hold one version name such as v1 (letters, digits, . _ -), "
                             f"not {text[:40]!r}; fix the file or remove it")
    return text


def bench_noise_prior(src: Path, clock: str, budget_tokens: int) -> Optional[dict]:
    """The paired-noise prior a benchmark folder declares for its version and this budget clock, from its
    BENCH_NOISE_NAME: {"sigma_prior", "prior_pairs", "spread_alpha", "sha256"}; None when it declares none that fits (no file,
    another version, another clock, or a steps budget other than the one measured)."""
    path = Path(src) / BENCH_NOISE_NAME
    if not path.is_file():
        return None
    raw = path.read_bytes()
    try:
        data = tomllib.loads(raw.decode("utf-8"))
        entry = data.get(clock)
        if data.get("version") != bench_version(src) or not isinstance(entry, dict):
            return None
        if "budget_tokens" in entry and int(entry["budget_tokens"]) != int(budget_tokens):
            return None
        sigma, dof = float(entry["sigma_prior"]), float(entry["prior_pairs"])
        alpha = float(entry.get("spread_alpha", 0.0))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise WorkspaceError(f"{path} is not a valid noise prior ({e}); fix or remove it") from None
    if not (sigma >= 0 and dof >= 0 and 0 <= alpha < 0.5):
        raise WorkspaceError(f"{path}: sigma_prior and prior_pairs must be >= 0, spread_alpha in [0, 0.5)")
    return {"sigma_prior": sigma, "prior_pairs": dof, "spread_alpha": alpha, "sha256": hashlib.sha256(raw).hexdigest()}


def lock_noise_prior(root: Path) -> Optional[dict]:
    """The benchmark noise prior loopwright.lock records (init took sigma_prior from noise.toml), or None."""
    try:
        v = json.loads((Path(root) / LOCK_NAME).read_text()).get("noise_prior")
    except (OSError, ValueError, AttributeError):
        return None
    return v if isinstance(v, dict) else None


def lock_benchmark_version(root: Path) -> Optional[str]:
    """The benchmark version committed in the workspace's loopwright.lock (None: made before versions, or
    from a benchmark folder without a VERSION)."""
    try:
        v = json.loads((Path(root) / LOCK_NAME).read_text()).get("benchmark_version")
    except (OSError, ValueError, AttributeError):
        return None
    return v if isinstance(v, str) else None


# ---------------------------------------------------------------------------
# the state directory

def state_home() -> Path:
    """Where state directories live: $LOOPWRIGHT_HOME, else $XDG_DATA_HOME/loopwright, else
    ~/.local/share/loopwright."""
    if os.environ.get("LOOPWRIGHT_HOME"):
        return Path(os.environ["LOOPWRIGHT_HOME"]).expanduser().resolve()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return (Path(base).expanduser() / "loopwright").resolve()


def state_home_note() -> str:
    """Which variable decided state_home() here, for messages about a state directory not found."""
    if os.environ.get("LOOPWRIGHT_HOME"):
        return f"LOOPWRIGHT_HOME is set ({os.environ['LOOPWRIGHT_HOME']}), so state lives under {state_home()}."
    if os.environ.get("XDG_DATA_HOME"):
        return (f"LOOPWRIGHT_HOME is not set and XDG_DATA_HOME is ({os.environ['XDG_DATA_HOME']}), so state lives "
                f"under {state_home()}.")
    return f"Neither LOOPWRIGHT_HOME nor XDG_DATA_HOME is set, so state lives under {state_home()}."


def state_dir_for(workspace_id: str) -> Path:
    if not _ID_RE.match(workspace_id or ""):
        raise StateDirError(f"workspace id {workspace_id!r} is malformed (letters, digits, . _ - only); "
                            "the id file .loopwright/workspace-id was changed -- restore it")
    return state_home() / "workspaces" / workspace_id


def is_inside(child: Path, parent: Path) -> bool:
    """Whether `child` is `parent` or below it (lexically: resolve both first where links matter)."""
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
        raise StateDirError(f"the state directory {state} does not exist. {state_home_note()} If this "
                            "process runs with a different LOOPWRIGHT_HOME / XDG_DATA_HOME than the one that "
                            "created the workspace (cron, systemd, an MCP client's environment), set it the same "
                            "here; if the workspace was moved from another machine or its state was deleted, "
                            "re-create it with `loopwright init`") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise StateDirError(f"{state} is a symlink or not a directory; the loop's state must be a plain "
                            "directory outside the workspace")
    real, ws = state.resolve(), root.resolve()
    if is_inside(real, ws) or is_inside(ws, real):
        raise StateDirError(f"the state directory {real} is inside the workspace {ws} (or contains it): the agent "
                            "could rewrite the ledger. Point LOOPWRIGHT_HOME outside the workspace")
    if st.st_uid != os.geteuid():
        raise StateDirError(f"{state} is owned by uid {st.st_uid}, not by the user running the loop "
                            f"(uid {os.geteuid()}); run the loop as the owner of its state")
    if st.st_mode & 0o022:
        raise StateDirError(f"{state} is group- or world-writable (mode {stat.S_IMODE(st.st_mode):o}); "
                            f"`chmod 700 {state}` and check its contents were not changed")


def make_private_dir(path: Path) -> None:
    """Create `path` (and parents) readable by its owner only, tightening an existing one."""
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
        try:
            mine = setmod.data_of(self.settings())
        except setmod.SettingsError:
            return      # a broken settings file is reported where it is used (and `loopwright config edit` fixes it)
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
    def benchmark_version(self) -> Optional[str]:
        """The reference baseline's version, from the committed (frozen) loopwright.lock."""
        return lock_benchmark_version(self.root)

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
            make_private_dir(tmp)
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


def sinks_for(cfg: cfgmod.LoopwrightConfig) -> list[str]:
    return [name for name in ("slack", "jira") if getattr(cfg, name) is not None]
