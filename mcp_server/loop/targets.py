"""A user's own target: where its files come from, which of them are editable, frozen or hidden, and the
argv of its commands (the [target] section of loopwright.toml, config.TargetConfig).

A target is a folder -- a bundled one (bench/targets/<name>), any folder, or a git repository, of which only
the committed files of HEAD are read, so the user's working tree is never touched -- holding a
loopwright.toml with a [target] section. `loopwright init WS --target SRC` makes the workspace WS from a copy
of it: the hidden files go to WS's state directory (only the evaluator sees them), everything else into WS,
pinned by its first commit. The runner (loop/runner.py) runs the gate and the run in train.py's sandbox and
the evaluator in a fresh private directory of the pinned bytes.
"""
from __future__ import annotations

import fnmatch
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from mcp_server.loop import config as cfgmod
from mcp_server.loop import gitops
from mcp_server.loop.workspace import LOCK_NAME, WorkspaceError, bundled_targets

# What every workspace keeps frozen besides the target's own list (the loop's files and the clients' config)
ALWAYS_FROZEN = (cfgmod.CONFIG_NAME, LOCK_NAME, "AGENTS.md", "CLAUDE.md", ".mcp.json", ".claude/**", ".codex/**",
                 ".gitignore", ".git/**")
_SKIP_PARTS = {".git", "__pycache__", ".loopwright", ".pytest_cache", ".mypy_cache"}
MAX_TARGET_BYTES = 256 << 20     # a target is source code and a little data; a bigger one is a mistake


def matches(rel: str, globs: Iterable[str]) -> bool:
    """`rel` (a /-separated path in the workspace) is named by one of `globs` (fnmatch: * crosses folders)."""
    return any(rel == g or fnmatch.fnmatch(rel, g) for g in globs)


@dataclass
class TargetSource:
    root: Path                  # the folder or repository the target was read from
    cfg: cfgmod.LoopwrightConfig
    files: dict[str, bytes]     # every file of the target, by path


def resolve_source(spec: str) -> TargetSource:
    """The target named by `spec`: a bundled target's name, or a folder / git repository with a loopwright.toml
    that has a [target] section. Validated: each editable glob names a file, no file is both editable and
    hidden, the commands split into words."""
    bundled = bundled_targets()
    path = Path(spec).expanduser()
    if spec in bundled and not path.exists():
        root = bundled[spec]
    elif path.is_dir():
        root = path.resolve()
    else:
        names = ", ".join(sorted(bundled)) or "none found"
        raise WorkspaceError(f"--target {spec!r} is neither a bundled target ({names}) nor a folder; give a bundled "
                             "name or the path of a folder (or git repository) holding a loopwright.toml with a "
                             "[target] section (README, 'Your own target')")
    toml = root / cfgmod.CONFIG_NAME
    if not toml.is_file():
        raise WorkspaceError(f"{root} has no {cfgmod.CONFIG_NAME}; write one with a [target] section (run, evaluate, "
                             "metric, direction, noise) and [paths] editable/frozen/hidden: see the README's "
                             "'Your own target' section or `loopwright init --list-targets`")
    cfg = cfgmod.parse_config(toml.read_text(encoding="utf-8"), toml)
    if cfg.target is None:
        raise WorkspaceError(f"{toml} has no [target] section: a target names its run, evaluate, metric, direction "
                             "and noise there (the README's 'Your own target' has a complete example)")
    frozen = list(dict.fromkeys([*cfg.paths.frozen, *ALWAYS_FROZEN]))
    clash = [g for g in frozen if g in cfg.paths.editable]
    if clash:
        raise WorkspaceError(f"{toml}: {clash} are editable but loopwright always freezes them; edit other files")
    cfg.paths = cfgmod.PathsConfig(editable=cfg.paths.editable, frozen=frozen, hidden=cfg.paths.hidden,
                                   state_dir=cfg.paths.state_dir)
    files = _read_files(root)
    unmatched = [g for g in cfg.paths.editable if not any(matches(rel, [g]) for rel in files)]
    if unmatched:
        raise WorkspaceError(f"{toml}: the editable path(s) {unmatched} name no file of {root}"
                             + (" (a git repository: only committed files count; commit them first)"
                                if (root / ".git").exists() else ""))
    # the loop edits, commits and reverts named files: the editable globs become the files they match now (an
    # agent changes those; it does not add files)
    editable: list[str] = []
    for g in cfg.paths.editable:
        editable += [rel for rel in sorted(files) if matches(rel, [g]) and rel not in editable]
    frozen_too = [rel for rel in editable if matches(rel, frozen)]
    if frozen_too:
        raise WorkspaceError(f"{toml}: {frozen_too} match both an editable and a frozen path; narrow the frozen globs")
    cfg.paths = cfgmod.PathsConfig(editable=editable, frozen=frozen, hidden=cfg.paths.hidden,
                                   state_dir=cfg.paths.state_dir)
    both = sorted(rel for rel in files if matches(rel, cfg.paths.editable) and matches(rel, cfg.paths.hidden))
    if both:
        raise WorkspaceError(f"{toml}: {both} are both editable and hidden; a hidden file is the evaluator's alone")
    frozen_hidden = sorted(rel for rel in files if matches(rel, cfg.paths.hidden) and matches(rel, frozen))
    if frozen_hidden:
        raise WorkspaceError(f"{toml}: {frozen_hidden} are both frozen and hidden; list each in one of them "
                             "(hidden files are pinned by hash in the lock)")
    return TargetSource(root, cfg, files)


def _read_files(root: Path) -> dict[str, bytes]:
    """A git repository's committed files at HEAD (its working tree, index and branches untouched; the
    loopwright.toml may be uncommitted), or a plain folder's files; caches and VCS folders left out."""
    out: dict[str, bytes] = {}
    if (root / ".git").exists():
        try:
            for rel in gitops.tracked_files(root, "HEAD"):
                out[rel] = gitops.blob_bytes(root, "HEAD", rel)
        except Exception as e:  # noqa: BLE001 - any git failure: say what to do
            raise WorkspaceError(f"cannot read the committed files of {root} ({e}); commit the target's files, "
                                 "or give a plain folder") from None
        out[cfgmod.CONFIG_NAME] = (root / cfgmod.CONFIG_NAME).read_bytes()
    else:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_PARTS)
            for name in sorted(filenames):
                path = Path(dirpath) / name
                if path.is_symlink() or not path.is_file() or name.endswith(".pyc"):
                    continue
                out[path.relative_to(root).as_posix()] = path.read_bytes()
    total = sum(len(b) for b in out.values())
    if total > MAX_TARGET_BYTES:
        raise WorkspaceError(f"{root} holds {total >> 20} MiB; a target is code and a little data (at most "
                             f"{MAX_TARGET_BYTES >> 20} MiB): keep large data outside and read it from the evaluator")
    return out


def editable_files(root: Path, cfg: cfgmod.LoopwrightConfig) -> list[str]:
    """The workspace's files the agent may edit, in the order of the editable globs (the first is the one the
    built-in agent tunes)."""
    tracked = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                     if p.is_file() and not (set(p.relative_to(root).parts) & _SKIP_PARTS))
    out: list[str] = []
    for g in cfg.paths.editable:
        out += [rel for rel in tracked if matches(rel, [g]) and rel not in out]
    return out


def argv(command: str, python: str = sys.executable) -> list[str]:
    """A [target] command as an argv: split like a shell would (never run through one); a leading `python`
    (or python3) is the interpreter loopwright runs on, so the target runs where its dependencies are."""
    words = shlex.split(command)
    if words and words[0] in ("python", "python3"):
        words[0] = python
    return words


def metric_label(cfg: cfgmod.LoopwrightConfig) -> str:
    """What the score is called in messages and reports: the target's metric, else the benchmark's."""
    return cfg.target.metric if cfg.target is not None else cfg.benchmark.metric


def shown(cfg: cfgmod.LoopwrightConfig, stored: Optional[float]) -> Optional[float]:
    """A stored score as the user's metric (a maximised one is stored negated)."""
    if stored is None or cfg.target is None:
        return stored
    return stored * cfg.target.sign()


def evaluator_files(ws, pinned: str) -> dict[str, bytes]:
    """What the target's evaluator sees, all by content: every file of the pinned commit except the editable
    ones (nothing the agent wrote), and the hidden files from the state directory."""
    return {**pinned_files(ws, pinned), **hidden_files(ws, pinned)}


def pinned_files(ws, pinned: str) -> dict[str, bytes]:
    """Every file of the pinned commit except the editable ones, each git object re-hashed."""
    return {rel: gitops.verified_blob_bytes(ws.root, pinned, rel) for rel in gitops.tracked_files(ws.root, pinned)
            if not matches(rel, ws.cfg.paths.editable)}


def hidden_files(ws, pinned: str) -> dict[str, bytes]:
    """The hidden files from the state directory, each checked against the hash the pinned loopwright.lock
    records for it (the bytes read are the bytes checked)."""
    import hashlib
    import json

    out: dict[str, bytes] = {}
    lock = json.loads(gitops.verified_blob_bytes(ws.root, pinned, LOCK_NAME))
    for rel, digest in sorted(lock.get("data", {}).items()):
        path = Path(ws.data_dir) / rel
        data = path.read_bytes() if path.is_file() and not path.is_symlink() else None
        if data is None or hashlib.sha256(data).hexdigest() != digest:
            raise WorkspaceError(f"the hidden file {rel} in {ws.data_dir} is missing or not the one pinned in "
                                 f"loopwright.lock (sha256 {digest[:12]}): restore it from the target "
                                 f"({lock.get('target_source', 'its folder')}) or make the workspace again")
        out[rel] = data
    return out
