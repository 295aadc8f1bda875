"""Git operations of the loop (GitPython).

The loop owns git: each experiment is one commit on the campaign branch that
touches only editable paths; keep leaves the branch there, discard resets it
to the best commit. Replace refs are ignored so `git replace` cannot swap the
pinned evaluator's blobs.

Hardened: the workspace (its .git included) is the agent's, so nothing in it may
make the loop's git calls run a program. Every git process gets SAFE_ENV: no
global/system config (GIT_CONFIG_GLOBAL=/dev/null, GIT_CONFIG_NOSYSTEM), and, as
command-line config (GIT_CONFIG_COUNT, which beats .git/config), hooks pointed at
/dev/null, fsmonitor off, no external diff/textconv, pager `cat`, no credential
helper or ssh command, no prompts. GitPython's own commit runs no hooks
(skip_hooks). What .git/config and .git/hooks may contain is checked by
integrity.py (git_config_problems / git_hook_problems below).
"""
from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import stat
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Optional

# GitPython refuses to be imported where no git is on PATH; `loopwright doctor` says that itself, in one line
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
import git  # noqa: E402

from mcp_server.common.facts import CLIENT_SANDBOX_PLACEHOLDERS

os.environ.setdefault("GIT_NO_REPLACE_OBJECTS", "1")

# Command-line config for every git the loop runs (outranks .git/config; git >= 2.31).
_SAFE_CONFIG = (
    ("core.hooksPath", "/dev/null"), ("core.fsmonitor", "false"), ("core.untrackedCache", "false"),
    ("core.pager", "cat"), ("core.editor", ":"), ("core.askPass", ""), ("core.sshCommand", "false"),
    ("core.attributesFile", "/dev/null"), ("diff.noprefix", "false"),
    ("credential.helper", ""), ("protocol.allow", "never"), ("protocol.file.allow", "always"),
    ("gc.auto", "0"), ("maintenance.auto", "false"), ("commit.gpgSign", "false"), ("tag.gpgSign", "false"),
)
SAFE_ENV: dict[str, Optional[str]] = {
    "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat", "PAGER": "cat", "GIT_EDITOR": ":", "GIT_ASKPASS": "", "SSH_ASKPASS": "",
    "GIT_NO_REPLACE_OBJECTS": "1", "GIT_OPTIONAL_LOCKS": "0",
    # unset: anything in the loop's environment that would make git run a program or look elsewhere
    "GIT_EXTERNAL_DIFF": None, "GIT_SSH": None, "GIT_SSH_COMMAND": None, "GIT_PROXY_COMMAND": None,
    "GIT_EXEC_PATH": None, "GIT_TEMPLATE_DIR": None, "GIT_DIR": None, "GIT_WORK_TREE": None,
    "GIT_INDEX_FILE": None, "GIT_OBJECT_DIRECTORY": None, "GIT_ALTERNATE_OBJECT_DIRECTORIES": None,
    "GIT_CONFIG": None, "GIT_CONFIG_PARAMETERS": None, "GIT_TRACE": None,
    "GIT_CONFIG_COUNT": str(len(_SAFE_CONFIG)),
    **{f"GIT_CONFIG_KEY_{i}": k for i, (k, _) in enumerate(_SAFE_CONFIG)},
    **{f"GIT_CONFIG_VALUE_{i}": v for i, (_, v) in enumerate(_SAFE_CONFIG)},
}
# Flags for git commands that could print a patch (external diff and textconv run programs).
SAFE_DIFF_FLAGS = ("--no-ext-diff", "--no-textconv", "--no-color")


def safe_env(base: Optional[dict] = None) -> dict[str, str]:
    """`base` (default os.environ) with SAFE_ENV applied: for a git subprocess started directly."""
    env = dict(os.environ if base is None else base)
    for k, v in SAFE_ENV.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


AUTHOR_NAME, AUTHOR_EMAIL = "loopwright", "loopwright@localhost"   # str, where git.Actor's fields are Optional
AUTHOR = git.Actor(AUTHOR_NAME, AUTHOR_EMAIL)


class GitError(RuntimeError):
    pass


_DRIVER_KEY = re.compile(r"^(filter|diff|merge)\.(.+)\.(clean|smudge|process|textconv|command|driver)$", re.I)


def _driver_overrides(root: Path | str) -> dict[str, str]:
    """Command-line config that blanks every filter/diff/merge driver the repository's config defines:
    a `.gitattributes` naming one (`* filter=x`) would otherwise run its command on add/status/checkout,
    and no single setting turns drivers off. `git config --list` only reads (includes too)."""
    cfg = Path(root) / ".git" / "config"
    if not cfg.is_file():
        return {}
    proc = subprocess.run(["git", "config", "--file", str(cfg), "--includes", "--name-only", "--list"],
                          env=safe_env(), capture_output=True, text=True, stdin=subprocess.DEVNULL)
    keys = sorted({k for k in proc.stdout.splitlines() if _DRIVER_KEY.match(k)})
    n = len(_SAFE_CONFIG)
    out = {"GIT_CONFIG_COUNT": str(n + len(keys))}
    for i, k in enumerate(keys, start=n):
        out[f"GIT_CONFIG_KEY_{i}"], out[f"GIT_CONFIG_VALUE_{i}"] = k, ""
    return out


def repo(root: Path | str) -> git.Repo:
    r = git.Repo(str(root))
    r.git.update_environment(**{**SAFE_ENV, **_driver_overrides(root)})   # None unsets
    return r


def campaign_branch(tag: str) -> str:
    return f"loopwright/{tag}"


def file_sha256(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# Hash cache for big data files: path -> ((size, mtime_ns, ctime_ns), sha256). ctime changes on any write and
# cannot be set by a user, so a rewritten file is always re-hashed.
_HASH_CACHE: dict[str, tuple[tuple[int, int, int], str]] = {}


def cached_file_sha256(path: Path | str) -> str:
    """file_sha256, remembered while the file's size, mtime and ctime stay the same."""
    st = os.stat(path)
    key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    hit = _HASH_CACHE.get(str(path))
    if hit and hit[0] == key:
        return hit[1]
    digest = file_sha256(path)
    _HASH_CACHE[str(path)] = (key, digest)
    return digest


def init_repo_and_pin(root: Path, message: str) -> str:
    """git init (if needed), commit everything not ignored, return the commit sha."""
    if not (root / ".git").exists():
        # an empty template: no sample hooks, nothing from a template dir named in someone's config
        subprocess.run(["git", "init", "-q", "--template=", str(root)], env=safe_env(), check=True,
                       stdin=subprocess.DEVNULL, capture_output=True)
    r = repo(root)
    with r.config_writer() as cw:  # commits must work on machines with no global identity
        if not r.config_reader("repository").has_option("user", "name"):
            cw.set_value("user", "name", "loopwright")
            cw.set_value("user", "email", "loopwright@localhost")
    r.git.add(A=True)
    r.index.commit(message, author=AUTHOR, committer=AUTHOR, skip_hooks=True)
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
    tracked = sorted({d.a_path for d in r.index.diff(None) if d.a_path} | {d.a_path for d in r.index.diff("HEAD") if d.a_path})
    untracked = sorted(r.untracked_files)
    return tracked, untracked


def client_placeholder(root: Path, rel: str) -> bool:
    """An empty file the agent's client sandbox puts in the workspace while a command runs (facts.py): not
    the agent's, so not refused. Only an empty regular file at one of those names: a planted .bashrc with
    content, a symlink or a module file is still refused (and never reaches a run: runs see the commit)."""
    if rel not in CLIENT_SANDBOX_PLACEHOLDERS:
        return False
    try:
        st = os.lstat(Path(root) / rel)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == 0


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
    stray = [p for p in untracked if not p.startswith(state_dir.rstrip("/") + "/") and not _matches(p, editable)
             and not client_placeholder(root, p)]
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
    sha = r.index.commit(message, author=AUTHOR, committer=AUTHOR, skip_hooks=True).hexsha
    return sha, []


def reset_to(root: Path, commit: str) -> None:
    """Move the current branch to `commit` and make the tree match it (tracked files only)."""
    r = repo(root)
    with _keeping_modes(r):
        r.head.reset(commit, index=True, working_tree=True)


@contextmanager
def _keeping_modes(r: git.Repo) -> Iterator[None]:
    """Git re-creates each file it changes with this process's umask and group. In a workspace shared with an
    agent running as another user (`loopwright init --agent-group`), the editable files are group-writable for
    the agent's group: put each tracked file's mode and group back, or a revert would lock the agent out."""
    root = Path(r.working_tree_dir or ".")
    before = {}
    for rel in r.git.ls_files("-z").split("\0"):
        try:
            st = os.lstat(root / rel)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            before[rel] = st
    yield
    for rel, old in before.items():
        try:
            now = os.lstat(root / rel)
            if not stat.S_ISREG(now.st_mode):
                continue
            if now.st_gid != old.st_gid:
                os.chown(root / rel, -1, old.st_gid)
            if stat.S_IMODE(now.st_mode) != stat.S_IMODE(old.st_mode):
                os.chmod(root / rel, stat.S_IMODE(old.st_mode))
        except OSError:
            continue


def move_branch(root: Path, commit: str) -> None:
    """Point the current branch at `commit`, leaving the working tree as it is."""
    repo(root).head.reset(commit, index=True, working_tree=False)


def checkout_files(root: Path, commit: str, paths: list[str]) -> None:
    """Make the working tree's `paths` equal to their version at `commit` (no commit made)."""
    r = repo(root)
    existing = [p for p in paths if _exists_in(r, commit, p)]
    if existing:
        with _keeping_modes(r):
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


def verified_object(r: git.Repo, hexsha: str, kind: bytes) -> bytes:
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
    body = verified_object(r, sha, b"commit")
    tree = body.split(b"\n", 1)[0].split(b" ", 1)[1].decode()
    parts = path.split("/")
    for name in parts:
        data = verified_object(r, tree, b"tree")
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
    return verified_object(r, tree, b"blob")


def tracked_files(root: Path, commit: str) -> list[str]:
    return [os.fspath(b.path) for b in repo(root).commit(commit).tree.traverse() if isinstance(b, git.Blob)]


def diff_stats(root: Path, old: str, new: str, path: str) -> tuple[int, int]:
    out = repo(root).git.diff(*SAFE_DIFF_FLAGS, "--numstat", old, new, "--", path)
    added = removed = 0
    for line in out.splitlines():
        a, r_, _ = line.split("\t", 2)
        if a != "-":
            added += int(a)
            removed += int(r_)
    return added, removed


def diff_text(root: Path, old: str, new: str, paths: list[str]) -> str:
    return repo(root).git.diff(*SAFE_DIFF_FLAGS, old, new, "--", *paths)


# ---------------------------------------------------------------------------
# What .git may hold (checked by integrity.py before every run and score)

# Keys .git/config may set: what `git init`, the loop and an ordinary clone write. Anything else
# (include.path, core.hooksPath, core.fsmonitor, filter/diff drivers, aliases, pagers, ...) is a way to
# make git run a program or read another file, and is removed.
_CONFIG_ALLOWED = re.compile(
    r"^(core\.(repositoryformatversion|filemode|bare|logallrefupdates|ignorecase|precomposeunicode|symlinks|"
    r"autocrlf|safecrlf|quotepath|compression|loosecompression|bigfilethreshold)"
    r"|user\.(name|email)|init\.defaultbranch|gc\.(auto|autodetach)|index\.version"
    r"|branch\..+\.(remote|merge|rebase|description)|remote\..+\.(url|fetch|pushurl|tagopt|prune))$", re.I)


def git_config_problems(root: Path | str) -> list[str]:
    """Keys of .git/config outside the allowed set (empty when clean)."""
    cfg = Path(root) / ".git" / "config"
    if cfg.is_symlink():
        return [".git/config is a symbolic link"]
    if not cfg.is_file():
        return []
    proc = subprocess.run(["git", "config", "--file", str(cfg), "--name-only", "--list"], env=safe_env(),
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        return [f".git/config is unreadable to git: {proc.stderr.strip()[:200]}"]
    return sorted({k for k in proc.stdout.splitlines() if k and not _CONFIG_ALLOWED.match(k)})


def clean_git_config(root: Path | str) -> list[str]:
    """Remove every key git_config_problems reports (a symlinked .git/config becomes a plain copy of
    its target first); returns what was removed."""
    cfg = Path(root) / ".git" / "config"
    removed = []
    if cfg.is_symlink():
        try:
            text = cfg.read_bytes()
        except OSError:
            text = b""
        cfg.unlink()
        cfg.write_bytes(text)
        removed.append("symlink .git/config")
    for key in git_config_problems(root):
        subprocess.run(["git", "config", "--file", str(cfg), "--unset-all", key], env=safe_env(),
                       capture_output=True, stdin=subprocess.DEVNULL)
        removed.append(key)
    return removed


def git_hook_problems(root: Path | str) -> list[str]:
    """Files under .git that make git run or reinterpret something: any non-sample hook, a symlinked
    hooks dir, .git/info/attributes (filters and diff drivers by path)."""
    git_dir = Path(root) / ".git"
    out: list[str] = []
    hooks = git_dir / "hooks"
    if hooks.is_symlink():
        out.append(".git/hooks")
    elif hooks.is_dir():
        out += sorted(f".git/hooks/{p.name}" for p in hooks.iterdir() if not p.name.endswith(".sample"))
    attrs = git_dir / "info" / "attributes"
    if attrs.is_symlink() or (attrs.exists() and (not attrs.is_file() or attrs.read_bytes().strip())):
        out.append(".git/info/attributes")
    return out


# -- snapshots and merges for asynchronous experiments (loop/asyncrun.py) ----------------------------

def _git(root: Path | str, *args: str, data: Optional[bytes] = None, env: Optional[dict] = None) -> bytes:
    proc = subprocess.run(["git", *args], cwd=root, input=data, capture_output=True,
                          env={**safe_env(), **_driver_overrides(root), **(env or {})},
                          stdin=None if data is not None else subprocess.DEVNULL)
    if proc.returncode != 0:
        raise GitError(f"git {args[0]} failed: {proc.stderr.decode(errors='replace').strip()[-500:]}")
    return proc.stdout


def commit_files(root: Path, parent: str, files: Mapping[str, Optional[bytes]], message: str) -> str:
    """A commit of `parent`'s tree with `files` replaced (None: removed), made with a private index file:
    the working tree, the agent's index and every branch are left alone, and the blobs are exactly these
    bytes (no filters). Returns its sha; nothing refers to it until a ref is set."""
    with tempfile.TemporaryDirectory(prefix="loopwright-index-") as d:
        env = {"GIT_INDEX_FILE": str(Path(d) / "index")}
        _git(root, "read-tree", parent, env=env)
        for rel, data in files.items():
            if data is None:
                _git(root, "update-index", "--force-remove", rel, env=env)
                continue
            blob = _git(root, "hash-object", "-w", "--no-filters", "--stdin", data=data).decode().strip()
            _git(root, "update-index", "--add", "--cacheinfo", f"100644,{blob},{rel}", env=env)
        tree = _git(root, "write-tree", env=env).decode().strip()
    env = {"GIT_AUTHOR_NAME": AUTHOR_NAME, "GIT_AUTHOR_EMAIL": AUTHOR_EMAIL,
           "GIT_COMMITTER_NAME": AUTHOR_NAME, "GIT_COMMITTER_EMAIL": AUTHOR_EMAIL}
    return _git(root, "commit-tree", tree, "-p", parent, data=message.encode(), env=env).decode().strip()


def snapshot_commit(root: Path, parent: str, files: dict[str, bytes], message: str, ref: str) -> str:
    """commit_files, kept alive by `ref` (refs/loopwright/...). Returns its sha."""
    sha = commit_files(root, parent, dict(files), message)
    _git(root, "update-ref", ref, sha)
    return sha


def set_branch(root: Path, branch: str, commit: str) -> None:
    """Point `branch` at `commit` without checking it out (the tree and HEAD stay)."""
    update_ref(root, f"refs/heads/{branch}", commit)


def blob_or_none(root: Path, commit: str, path: str) -> Optional[bytes]:
    """blob_bytes, or None when `path` is not in `commit`."""
    try:
        return blob_bytes(root, commit, path)
    except GitError:
        return None


def update_ref(root: Path, ref: str, sha: str) -> None:
    _git(root, "update-ref", ref, sha)


def merge_file(base: bytes, ours: bytes, theirs: bytes) -> tuple[bytes, bool]:
    """git's 3-way merge of one file's contents: (merged bytes, True when it conflicted)."""
    with tempfile.TemporaryDirectory(prefix="loopwright-merge-") as d:
        paths = []
        for name, data in (("ours", ours), ("base", base), ("theirs", theirs)):
            (Path(d) / name).write_bytes(data)
            paths.append(str(Path(d) / name))
        proc = subprocess.run(["git", "merge-file", "-p", "--quiet", *paths], capture_output=True,
                              env=safe_env(), stdin=subprocess.DEVNULL)
    if proc.returncode < 0 or proc.returncode > 127:
        raise GitError(f"git merge-file failed: {proc.stderr.decode(errors='replace').strip()[-300:]}")
    return proc.stdout, proc.returncode != 0
