"""Git operations of the loop (GitPython).

The loop owns git: each experiment is one commit on the campaign branch that
touches only editable paths; keep leaves the branch there, discard resets it
to the best commit. Replace refs are ignored so `git replace` cannot swap the
pinned evaluator's blobs.
"""
from __future__ import annotations

import fnmatch
import hashlib
import os
from pathlib import Path
from typing import Iterable, Optional

import git

os.environ.setdefault("GIT_NO_REPLACE_OBJECTS", "1")

AUTHOR = git.Actor("loopwright", "loopwright@localhost")


class GitError(RuntimeError):
    pass


def repo(root: Path | str) -> git.Repo:
    return git.Repo(str(root))


def campaign_branch(tag: str) -> str:
    return f"loopwright/{tag}"


def file_sha256(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def init_repo_and_pin(root: Path, message: str) -> str:
    """git init (if needed), commit everything not ignored, return the commit sha."""
    r = git.Repo.init(str(root)) if not (root / ".git").exists() else repo(root)
    with r.config_writer() as cw:  # commits must work on machines with no global identity
        if not r.config_reader().has_option("user", "name"):
            cw.set_value("user", "name", "loopwright")
            cw.set_value("user", "email", "loopwright@localhost")
    r.git.add(A=True)
    r.index.commit(message, author=AUTHOR, committer=AUTHOR)
    return r.head.commit.hexsha


def root_commit(root: Path) -> str:
    return repo(root).git.rev_list("--max-parents=0", "HEAD").splitlines()[-1]


def create_branch(root: Path, branch: str, at: str, checkout: bool = True) -> None:
    r = repo(root)
    if branch in r.heads:
        raise GitError(f"branch {branch} already exists")
    head = r.create_head(branch, at)
    if checkout:
        head.checkout()


def current_branch(root: Path) -> Optional[str]:
    """The checked-out branch, read from .git/HEAD (cheap: called on every tool call)."""
    try:
        head = (Path(root) / ".git" / "HEAD").read_text().strip()
    except OSError:
        r = repo(root)
        return None if r.head.is_detached else r.active_branch.name
    return head[len("ref: refs/heads/"):] if head.startswith("ref: refs/heads/") else None


def head_sha(root: Path) -> str:
    return repo(root).head.commit.hexsha


def is_dirty(root: Path) -> bool:
    return repo(root).is_dirty(untracked_files=False)


def _matches(path: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatch(path, p) or path == p for p in patterns)


def changed_paths(root: Path) -> tuple[list[str], list[str]]:
    """(modified/deleted tracked paths, untracked paths), relative to the root."""
    r = repo(root)
    tracked = sorted({d.a_path for d in r.index.diff(None)} | {d.a_path for d in r.index.diff("HEAD")})
    untracked = sorted(r.untracked_files)
    return tracked, untracked


def commit_editable(root: Path, editable: list[str], state_dir: str, message: str) -> tuple[Optional[str], list[str]]:
    """Commit changes to editable paths. Returns (new sha or None if nothing changed, warnings).

    Raises GitError naming the file if any non-editable tracked file changed, or an
    untracked file exists that train.py could import (it would not be in the commit).
    """
    tracked, untracked = changed_paths(root)
    foreign = [p for p in tracked if not _matches(p, editable)]
    if foreign:
        raise GitError(f"changes outside the editable files: {', '.join(foreign)}. Only "
                       f"{', '.join(editable)} may change; undo the others (the guard or the integrity check "
                       "restores frozen files).")
    stray = [p for p in untracked if not p.startswith(state_dir.rstrip("/") + "/") and not _matches(p, editable)]
    if stray:
        raise GitError(f"untracked files in the workspace: {', '.join(stray[:10])}. Everything an experiment "
                       f"uses must live in {', '.join(editable)}; delete these files or move their content there.")
    r = repo(root)
    to_add = [p for p in tracked + untracked if _matches(p, editable)]
    if not to_add:
        return None, []
    present = [p for p in to_add if (root / p).exists()]
    gone = [p for p in to_add if not (root / p).exists()]
    if present:
        r.index.add(present)
    if gone:
        r.index.remove(gone)
    if not r.index.diff("HEAD"):
        return None, []
    sha = r.index.commit(message, author=AUTHOR, committer=AUTHOR).hexsha
    return sha, []


def reset_to(root: Path, commit: str) -> None:
    """Move the current branch to `commit` and make the tree match it (tracked files only)."""
    r = repo(root)
    r.head.reset(commit, index=True, working_tree=True)


def move_branch(root: Path, commit: str) -> None:
    """Point the current branch at `commit`, leaving the working tree as it is."""
    repo(root).head.reset(commit, index=True, working_tree=False)


def checkout_files(root: Path, commit: str, paths: list[str]) -> None:
    """Make the working tree's `paths` equal to their version at `commit` (no commit made)."""
    r = repo(root)
    existing = [p for p in paths if _exists_in(r, commit, p)]
    if existing:
        r.git.checkout(commit, "--", *existing)


def _exists_in(r: git.Repo, commit: str, path: str) -> bool:
    try:
        r.commit(commit).tree / path
        return True
    except KeyError:
        return False


def blob_bytes(root: Path, commit: str, path: str) -> bytes:
    """The content of `path` at `commit`, from git's object store (never the working tree)."""
    r = repo(root)
    try:
        blob = r.commit(commit).tree / path
    except KeyError:
        raise GitError(f"{path} is not in commit {commit[:10]}") from None
    return blob.data_stream.read()


def _verified_object(r: git.Repo, hexsha: str, kind: bytes) -> bytes:
    """Read an object and check that its content really hashes to its name.

    git does not re-hash objects on read, so an overwritten object file would otherwise be
    served under the old name; re-hashing makes the pinned commit a real root of trust."""
    stream = r.odb.stream(bytes.fromhex(hexsha))
    data = stream.read()
    if stream.type != kind or hashlib.sha1(kind + b" %d\0" % len(data) + data).hexdigest() != hexsha:
        raise GitError(f"git object {hexsha[:10]} ({kind.decode()}) is corrupted or was tampered with")
    return data


def verified_blob_bytes(root: Path, commit: str, path: str) -> bytes:
    """Like blob_bytes, but every object from the commit down to the blob is re-hashed."""
    r = repo(root)
    sha = r.commit(commit).hexsha
    body = _verified_object(r, sha, b"commit")
    tree = body.split(b"\n", 1)[0].split(b" ", 1)[1].decode()
    parts = path.split("/")
    for i, name in enumerate(parts):
        data = _verified_object(r, tree, b"tree")
        entry = None
        pos = 0
        while pos < len(data):
            space = data.index(b" ", pos)
            nul = data.index(b"\0", space)
            if data[space + 1:nul].decode() == name:
                entry = data[nul + 1:nul + 21].hex()
                break
            pos = nul + 21
        if entry is None:
            raise GitError(f"{path} is not in commit {sha[:10]}")
        tree = entry
    return _verified_object(r, tree, b"blob")


def tracked_files(root: Path, commit: str) -> list[str]:
    return [b.path for b in repo(root).commit(commit).tree.traverse() if b.type == "blob"]


def diff_stats(root: Path, old: str, new: str, path: str) -> tuple[int, int]:
    out = repo(root).git.diff("--numstat", old, new, "--", path)
    added = removed = 0
    for line in out.splitlines():
        a, r_, _ = line.split("\t", 2)
        if a != "-":
            added += int(a)
            removed += int(r_)
    return added, removed


def diff_text(root: Path, old: str, new: str, paths: list[str]) -> str:
    return repo(root).git.diff(old, new, "--", *paths)
