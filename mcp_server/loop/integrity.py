"""The frozen manifest and the integrity check (the second line of defence).

Hooks can be bypassed (a Python one-liner, a script train.py runs); this check
cannot: before every run and every score the working tree's frozen files are
compared with the pinned commit's blobs, the score-deciding config sections
with their pinned hash, and the data with the hashes in the committed
`loopwright.lock`. A mismatch is restored from the pinned commit (the tampered
copy is kept under .loopwright/tamper/ for a human), recorded as a tamper event,
and the run or score is refused.
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from mcp_server.loop import config as cfgmod
from mcp_server.loop import gitops
from mcp_server.loop.workspace import ID_NAME, LOCK_NAME, Workspace, prepare_data


@dataclass(frozen=True)
class Mismatch:
    path: str
    kind: str          # "file" | "missing" | "config" | "data" | "git" | "pin" | "gitconfig" | "githook"
    detail: str


def pinned_lock(ws: Workspace, pinned: str) -> dict:
    return json.loads(gitops.verified_blob_bytes(ws.root, pinned, LOCK_NAME))


def frozen_tracked(ws: Workspace, pinned: str) -> list[str]:
    pats = ws.cfg.paths.frozen
    return [p for p in gitops.tracked_files(ws.root, pinned)
            if any(fnmatch.fnmatch(p, g) or p == g for g in pats) and p != cfgmod.CONFIG_NAME]


def check(ws: Workspace, pinned: str) -> list[Mismatch]:
    pin = check_pin(ws, pinned)
    if pin:
        return pin
    try:
        return _check(ws, pinned)
    except gitops.GitError as e:
        # A pinned git object was rewritten. The state directory keeps a copy of every pinned object
        # (snapshot_pin): restore() writes them back; without a copy nothing can be restored.
        return [Mismatch(".git/objects", "git", str(e))]


def check_pin(ws: Workspace, pinned: str) -> list[Mismatch]:
    """The pinned commit is recorded at init in two places out of the agent's reach (the ledger and the
    state directory's workspace.json); both must agree, and the pinned loopwright.lock must still hash
    to what was recorded. A disagreement cannot be repaired by the loop: refuse."""
    try:
        rec = ws.record()
    except Exception as e:  # noqa: BLE001 - reported as a mismatch
        return [Mismatch("workspace.json", "pin", str(e))]
    recorded = rec.get("pinned_commit")
    if recorded and recorded != pinned:
        return [Mismatch("state.db", "pin", f"the ledger's pinned commit {pinned[:10]} is not the one recorded at "
                                            f"init ({recorded[:10]}): the ledger was rewritten")]
    want = rec.get("lock_sha256")
    if want:
        try:
            got = hashlib.sha256(gitops.verified_blob_bytes(ws.root, pinned, LOCK_NAME)).hexdigest()
        except gitops.GitError:
            return []          # a rewritten object: check() reports and repairs it
        if got != want:
            return [Mismatch(LOCK_NAME, "pin", f"the pinned commit's loopwright.lock hashes to {got[:12]}, not "
                                               f"{want[:12]} as recorded at init")]
    return []


def _check(ws: Workspace, pinned: str) -> list[Mismatch]:
    out: list[Mismatch] = []
    for rel in frozen_tracked(ws, pinned):
        path = ws.root / rel
        if not path.is_file():
            out.append(Mismatch(rel, "missing", "frozen file is missing"))
        elif path.read_bytes() != gitops.verified_blob_bytes(ws.root, pinned, rel):
            out.append(Mismatch(rel, "file", "differs from the pinned commit"))

    lock = pinned_lock(ws, pinned)
    try:
        current = cfgmod.load_config(ws.root)
        if lock["config_frozen"] not in current.frozen_hashes():
            out.append(Mismatch(cfgmod.CONFIG_NAME, "config",
                                "the frozen sections [benchmark] [paths] [noise] [target] changed"))
    except cfgmod.ConfigError as e:
        out.append(Mismatch(cfgmod.CONFIG_NAME, "config", f"unreadable: {str(e).splitlines()[0]}"))

    for name, digest in lock["data"].items():
        path = ws.data_dir / name
        if not path.is_file():
            out.append(Mismatch(f"data/{name}", "data", "data file is missing"))
        elif gitops.cached_file_sha256(path) != digest:
            out.append(Mismatch(f"data/{name}", "data", "data file hash changed"))
    out += check_git_dir(ws)
    # The id that names our state directory: changed, the next open would refuse (or, under a forged
    # state directory, be fooled): put it back now, while the loop still knows the right one.
    id_file = ws.local_dir / ID_NAME
    try:
        ok = id_file.read_text().strip() == ws.state_dir.name and not id_file.is_symlink()
    except OSError:
        ok = False
    if not ok:
        out.append(Mismatch(f"{ws.cfg.paths.state_dir}/{ID_NAME}", "id", "the workspace id was changed"))
    return out


def check_git_dir(ws: Workspace) -> list[Mismatch]:
    """.git/config keys and .git files that could make git run a program (the loop's git calls ignore
    them anyway: gitops hardens every call; this catches the attempt and removes it)."""
    out = [Mismatch(".git/config", "gitconfig", f"{key} is not allowed in .git/config")
           for key in gitops.git_config_problems(ws.root)]
    out += [Mismatch(rel, "githook", "git hooks and attributes are not allowed in the workspace")
            for rel in gitops.git_hook_problems(ws.root)]
    return out


def restore(ws: Workspace, pinned: str, mismatches: list[Mismatch]) -> list[str]:
    """Put the pinned state back; keep tampered copies as evidence. Returns what was done."""
    done: list[str] = []
    evidence = ws.tamper_dir / time.strftime("%Y%m%d-%H%M%S")
    if any(m.kind == "git" for m in mismatches):
        done.extend(repair_objects(ws, pinned))
        if not check_objects(ws, pinned):
            mismatches = [m for m in mismatches if m.kind != "git"] + _check(ws, pinned)
        else:
            return done      # nothing else can be compared with an unreadable pin
    if any(m.kind == "pin" for m in mismatches):
        done.append("nothing restored: the pinned commit recorded in the ledger or loopwright.lock disagrees "
                    "with the record made at init")
    files = [m for m in mismatches if m.kind in ("file", "missing", "config")]
    for m in files:
        path = ws.root / m.path
        if path.is_file():
            (evidence / m.path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, evidence / m.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            path.unlink()
        path.write_bytes(gitops.verified_blob_bytes(ws.root, pinned, m.path))
        done.append(f"restored {m.path} from the pinned commit")
    if any(m.kind == "gitconfig" for m in mismatches):
        cfg = ws.root / ".git" / "config"
        evidence.mkdir(parents=True, exist_ok=True)
        if cfg.exists():
            shutil.copyfile(cfg, evidence / "git-config")
        removed = gitops.clean_git_config(ws.root)
        done.append(f"removed {', '.join(removed)} from .git/config")
    for m in (m for m in mismatches if m.kind == "githook"):
        path = ws.root / m.path
        (evidence / m.path).parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            path.unlink()
        elif path.exists():
            shutil.move(str(path), str(evidence / m.path))   # kept for a human to look at
        done.append(f"removed {m.path}")
    if any(m.kind == "id" for m in mismatches):
        id_file = ws.local_dir / ID_NAME
        if id_file.is_symlink() or id_file.is_dir():
            shutil.rmtree(id_file) if id_file.is_dir() and not id_file.is_symlink() else id_file.unlink()
        id_file.parent.mkdir(parents=True, exist_ok=True)
        id_file.write_text(ws.state_dir.name + "\n")
        done.append(f"restored {ID_NAME}")
    if any(m.kind == "data" for m in mismatches):
        done.append(_rebuild_data(ws, pinned))
    if files:
        ws.reload_config()
    return done


def _rebuild_data(ws: Workspace, pinned: str) -> str:
    """Data is not in git: rebuild it with the pinned prepare.py (deterministic) and re-verify."""
    lock = pinned_lock(ws, pinned)
    for name in lock["data"]:
        (ws.data_dir / name).unlink(missing_ok=True)
    try:
        prepare_data(ws.root, ws.data_dir, lock.get("corpus_arg") or ws.cfg.benchmark.corpus)
    except Exception as e:  # noqa: BLE001 - reported to the caller as text
        return f"could not rebuild the data: {e}"
    bad = [n for n, d in lock["data"].items()
           if not (ws.data_dir / n).is_file() or gitops.file_sha256(ws.data_dir / n) != d]
    if bad:
        return (f"rebuilt the data but {', '.join(bad)} still differ from loopwright.lock; the corpus changed "
                "on this machine -- start a new workspace with `loopwright init`")
    return "rebuilt the data with the pinned prepare.py; hashes match loopwright.lock again"


def describe(mismatches: list[Mismatch]) -> str:
    return "; ".join(f"{m.path}: {m.detail}" for m in mismatches)


def restored(mismatches: list[Mismatch], actions: list[str]) -> bool:
    """Whether the restore put everything back (for an honest message)."""
    if any(m.kind == "pin" for m in mismatches):
        return False
    return not any(a.startswith(("could not", "nothing restored", "rebuilt the data but")) for a in actions)


# ---------------------------------------------------------------------------
# A copy of the pinned commit's git objects in the state directory

def _objects_dir(ws: Workspace) -> Path:
    return ws.state_dir / "pinned" / "objects"


def _pinned_objects(ws: Workspace, pinned: str) -> list[tuple[str, bytes, bytes]]:
    """(sha, kind, data) of the pinned commit, its trees and blobs, each verified by re-hashing."""
    r = gitops.repo(ws.root)
    out: list[tuple[str, bytes, bytes]] = []
    body = gitops.verified_object(r, pinned, b"commit")
    out.append((pinned, b"commit", body))
    todo = [body.split(b"\n", 1)[0].split(b" ", 1)[1].decode()]
    while todo:
        sha = todo.pop()
        data = gitops.verified_object(r, sha, b"tree")
        out.append((sha, b"tree", data))
        pos = 0
        while pos < len(data):
            space = data.index(b" ", pos)
            nul = data.index(b"\0", space)
            mode, entry = data[pos:space], data[nul + 1:nul + 21].hex()
            if mode in (b"40000", b"040000"):
                todo.append(entry)
            elif mode != b"160000":           # not a submodule link
                out.append((entry, b"blob", gitops.verified_object(r, entry, b"blob")))
            pos = nul + 21
    return out


def snapshot_pin(ws: Workspace, pinned: str) -> int:
    """Keep the pinned objects (loose-object format) in the state directory; returns how many."""
    d = _objects_dir(ws)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    objs = _pinned_objects(ws, pinned)
    for sha, kind, data in objs:
        path = d / sha
        if not path.is_file():
            path.write_bytes(zlib.compress(kind + b" %d\0" % len(data) + data))
            os.chmod(path, 0o400)
    return len(objs)


def _stored(ws: Workspace) -> dict[str, bytes]:
    d = _objects_dir(ws)
    return {p.name: p.read_bytes() for p in d.iterdir()} if d.is_dir() else {}


def check_objects(ws: Workspace, pinned: str) -> Optional[str]:
    """None when every pinned object verifies, else the git error."""
    try:
        _pinned_objects(ws, pinned)
        return None
    except gitops.GitError as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - a missing or unparsable object is the same problem
        return f"pinned object unreadable: {type(e).__name__}: {e}"


def repair_objects(ws: Workspace, pinned: str) -> list[str]:
    """Write back every pinned object whose copy in .git/objects is missing or rewritten, from the state
    directory's copy. Honest about what it could not do."""
    stored = _stored(ws)
    if not stored:
        return [f"could not repair the pinned git objects: this workspace has no copy of them in {ws.state_dir} "
                "(made before loopwright kept one). Start a new workspace with `loopwright init`, or restore "
                ".git/objects from a backup"]
    objects = ws.root / ".git" / "objects"
    fixed = []
    for sha, raw in stored.items():
        body = zlib.decompress(raw)
        if hashlib.sha1(body).hexdigest() != sha:
            return [f"could not repair: the state directory's copy of object {sha[:10]} is itself corrupted"]
        path = objects / sha[:2] / sha[2:]
        try:
            ok = path.is_file() and zlib.decompress(path.read_bytes()) == body
        except (OSError, zlib.error):
            ok = False
        if not ok:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists() or path.is_symlink():
                path.unlink()
            path.write_bytes(raw)
            os.chmod(path, 0o444)
            fixed.append(sha[:10])
    problem = check_objects(ws, pinned)
    if problem:
        return [f"could not repair the pinned git objects ({problem}); rewrote {len(fixed)} loose object(s) but "
                "git still serves a different copy (a rewritten pack?). Restore .git from a backup or start a new "
                "workspace with `loopwright init`"]
    return [f"rewrote {len(fixed)} pinned git object(s) ({', '.join(fixed) or 'none'}) from the state directory's "
            "copy; the pinned commit verifies again"]
