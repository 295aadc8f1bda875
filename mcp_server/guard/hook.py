"""The guard: one program behind both clients' hooks (Claude Code and Codex).

    python -m mcp_server.guard pre-tool-use   < payload.json
    python -m mcp_server.guard stop           < payload.json
    python -m mcp_server.guard session-start  < payload.json

PreToolUse     denies writes to the frozen verifier (prepare.py, loopwright.toml, ...), the
               loop's state directory and .git, git commands that move the loop's refs, and
               reads of the hidden test split; everything else passes.
Stop           blocks the agent from stopping while the campaign budget remains.
SessionStart   tells a new, resumed or compacted session where the loop stands.

Hooks are the first line of defence, not the only one: a hook sees a command's text
before it runs, never what a program computes at run time. The frozen-manifest check
(mcp_server/integrity.py) catches the rest before every run and score.

A hook runs on every tool call, so the hot path imports only the standard library;
mcp_server.loop.config (pydantic) is imported only when loopwright.toml's [paths] table is
incomplete or invalid. Output formats: see `emit_pre_tool_use` and `main`.

Decisions worth knowing:
- The file-edit tools (Edit, Write, MultiEdit, NotebookEdit, apply_patch) may change only
  the editable files. The shell may also write other, unlisted files (logs, scratch), but
  never the frozen files, the state dir or .git.
- Reads: only the hidden split and the state dir's private records (state.db*,
  runs/*/eval.json, reports/**: they carry the hidden test score) are refused. Listing the
  state dir (ls) and reading a run's train.log are fine; the agent uses state_read.
- Scripts (python -c, heredocs, files run by an interpreter) are refused when they name
  the state dir or the hidden split at all, or name another protected file and contain a
  way to write (open(..., 'w'), unlink, shutil, ...). train.py itself is not inspected.
- git: read-only subcommands pass; anything that moves refs, changes the index or the
  config is refused (the loop owns git); `git checkout/restore -- train.py` is allowed.
- Stop: blocks while loop_status says budget remains. `stop_hook_active` alone does not
  release the agent; LOOPWRIGHT_STOP_MAX_IDLE_BLOCKS (default 20) consecutive blocks
  without progress do. Claude Code ends a turn after 8 consecutive Stop blocks unless
  CLAUDE_CODE_STOP_HOOK_BLOCK_CAP=0, which headless launchers set.
- Fail closed: a crash, bad payload or unusable interpreter blocks the tool call (exit 2);
  Stop and SessionStart fail open (a broken status must not trap the agent).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import sys
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Optional

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from mcp_server.guard.shell import ShellGuard

CONFIG_NAME = "loopwright.toml"
PATH_KEYS = ("editable", "frozen", "hidden", "state_dir")

EDIT_TOOLS = {"Edit", "Write", "MultiEdit", "NotebookEdit"}
READ_TOOLS = {"Read", "Grep", "Glob", "LS", "NotebookRead"}
PATCH_TOOLS = {"apply_patch", "ApplyPatch", "applypatch"}
SHELL_TOOLS = {"Bash", "shell", "exec_command", "local_shell", "shell_command", "container.exec",
               "unified_exec"}
STDIN_TOOLS = {"write_stdin"}    # Codex: keystrokes typed into a running shell session
GIT_TOOLS = {"EnterWorktree"}    # Claude Code: creates a branch + worktree in the loop's repository
PATH_KEYS_IN_INPUT = ("file_path", "notebook_path", "path")

# Results that carry the hidden test score live in the state dir; the agent gets val_bpb
# from run_experiment / state_read instead. Relative to state_dir.
PRIVATE_STATE = ("state.db*", "runs/*/eval.json", "reports/**")

DEFAULT_MAX_IDLE_STOP_BLOCKS = 20

_DESCRIPTIONS = {
    "prepare.py": "the frozen evaluator",
    "program.md": "the research spec you follow",
    "loopwright.toml": "the loop's frozen configuration: budgets, paths, metric",
    "agents.md": "the agent instructions", "claude.md": "the agent instructions",
    ".mcp.json": "the client configuration", ".claude": "the client configuration",
    ".codex": "the client configuration", ".gitignore": "what keeps the loop's state out of git",
}


@dataclass(frozen=True)
class Decision:
    allow: bool
    reason: str = ""


ALLOW = Decision(True)


# --------------------------------------------------------------------------- path policy

def _glob_regex(pattern: str) -> re.Pattern:
    """A loopwright.toml path glob as a regex over '/'-separated paths relative to the workspace.
    `*` stays within one segment, `**` spans segments, and every pattern also covers what lies
    below it (so "data" protects data/x). Case-insensitive: on macOS PREPARE.PY is prepare.py."""
    pat = pattern.strip("/")
    if pat.endswith("/**"):
        pat = pat[:-3]
    out, i = [], 0
    while i < len(pat):
        if pat.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pat.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        c = pat[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and pat.find("]", i + 2) > 0:
            j = pat.find("]", i + 2)
            body = pat[i + 1:j]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body).replace("\\", "\\\\") + "]")
            i = j
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + "(?:/.*)?", re.IGNORECASE)


def _literal_prefix(pattern: str) -> str:
    """The leading segments of a glob that contain no wildcard ('.claude/**' -> '.claude')."""
    segs = []
    for seg in pattern.strip("/").split("/"):
        if re.search(r"[*?\[]", seg):
            break
        segs.append(seg)
    return "/".join(segs)


def _mention_regex(literal: str) -> re.Pattern:
    """A name as it would appear in code or a command line, not as part of a longer name."""
    return re.compile(r"(?<![\w-])" + re.escape(literal) + r"(?![\w-])", re.IGNORECASE)


def _unique(items) -> list:
    return [x for x in dict.fromkeys(items) if x]


def _rel_under(path: str, base: str) -> Optional[str]:
    if path == base:
        return "."
    prefix = base if base.endswith("/") else base + "/"
    return path[len(prefix):] if path.startswith(prefix) else None


# Tokens that let a script change files. Conservative on purpose: together with the name of
# a protected file they deny the command; on their own they mean nothing.
_WRITE_TOKENS = re.compile(r"""
      ['"](?:[rbt]*[wax][rbt+]*|[rbt]*r\+[bt]*)['"]          # open() mode strings 'w' 'ab' 'r+'
    | \bmode\s*=
    | \.write\w*\s*\(                                      # .write( .write_text( .writelines(
    | \b(?:unlink|remove|removedirs|rmtree|rmdir|rename|renames|replace|truncate|ftruncate|chmod|
          chown|lchown|symlink|link|touch|copy\w*|move|utime|mknod|mkfifo|dup2|mmap|sysopen|syswrite)\b
    | \b(?:shutil|subprocess|sqlite3|Popen|pty|ctypes|system|popen|exec\w*|spawn\w*|eval)\b
    | \b(?:writeFile\w*|appendFile\w*|createWriteStream|rmSync|unlinkSync|renameSync|fs\.\w+)\b
    | \bFile\.(?:write|open|delete|rename)\b | \bIO\.write\b | \bfile_put_contents\b
    | `                                                   # perl/ruby backticks run a shell
    | ['"]\s*\+?(?:>>?|\|)                                  # perl/ruby open modes '>' '>>' '+<' '|'
    """, re.VERBOSE)
_AWK_WRITE_TOKENS = re.compile(r">|\||\bsystem\b")
_PRIVATE_NAMES = re.compile(r"state\.db|eval\.json|reports", re.IGNORECASE)


class Policy:
    """What the agent may touch in one workspace.

    Categories, first match wins: hidden (no read, no write) > private state (no read, no
    write) > state dir (no write) > .git (no write) > frozen (no write) > editable.
    Everything else inside the workspace may be written by the shell (logs, scratch files)
    but not by the file-edit tools, which may only change the editable files.
    """

    def __init__(self, root: str, editable, frozen, hidden, state_dir: str = ".loopwright"):
        self.root = os.path.abspath(root)
        self.root_real = os.path.realpath(root)
        self.editable = tuple(editable)
        self.frozen = tuple(frozen)
        self.hidden = tuple(hidden)
        self.state_abs = os.path.normpath(os.path.join(self.root, state_dir))
        self.state_real = os.path.realpath(self.state_abs)
        self.state_dir = os.path.relpath(self.state_abs, self.root)
        sd = self.state_dir
        self._hidden = [(p, _glob_regex(p)) for p in self.hidden]
        self._private = [(f"{sd}/{p}", _glob_regex(f"{sd}/{p}")) for p in PRIVATE_STATE]
        self._frozen = [(p, _glob_regex(p)) for p in self.frozen]
        self._editable = [_glob_regex(p) for p in self.editable]
        # literal locations of protected things, for "does this directory contain one?" checks
        # (config order, so messages name prepare.py before .claude)
        self._protected_prefixes = _unique([*map(_literal_prefix, self.frozen + self.hidden), sd, ".git"])
        self._hidden_prefixes = _unique([*map(_literal_prefix, self.hidden), sd])
        hidden_names = {os.path.basename(_literal_prefix(p) or p) for p in self.hidden}
        self._hidden_mentions = [(n, _mention_regex(n)) for n in sorted(hidden_names) if n]
        self._references = [(name, _mention_regex(name)) for name in self._protected_prefixes]
        self._references += [(f"{p[:-3]}.__file__", re.compile(re.escape(p[:-3]) + r"\.__file__"))
                             for p in self.frozen if p.endswith(".py") and "/" not in p]
        self._state_mention = _mention_regex(os.path.basename(sd))

    # -- resolution

    def _resolve(self, path: str, cwd: str) -> tuple[str, str]:
        """(lexical absolute path, real path) — the real one follows symlinks, the lexical one
        matters when the state dir itself is a symlink out of the workspace."""
        p = os.path.expanduser(str(path))
        if not os.path.isabs(p):
            p = os.path.join(cwd or self.root, p)
        return os.path.normpath(p), os.path.realpath(p)

    def _relatives(self, path: str, cwd: str) -> set[str]:
        """Every way this path can be named relative to the workspace ('.' = the root)."""
        lex, real = self._resolve(path, cwd)
        rels = set()
        for p in (lex, real):
            for base in (self.root, self.root_real):
                r = _rel_under(p, base)
                if r is not None:
                    rels.add(r)
            for base in (self.state_abs, self.state_real):
                r = _rel_under(p, base)
                if r is not None:
                    rels.add(self.state_dir if r == "." else f"{self.state_dir}/{r}")
        return rels

    def _hard_link_twin(self, path: str, cwd: str) -> Optional[str]:
        """A hard link made earlier (by means the hook could not see) shares the protected file's
        inode: writing it writes prepare.py. Only files with several links are compared."""
        try:
            st = os.stat(self._resolve(path, cwd)[1])
        except (OSError, ValueError):
            return None
        if st.st_nlink < 2 or not os.path.isfile(self._resolve(path, cwd)[1]):
            return None
        for prefix in self._protected_prefixes:
            try:
                other = os.stat(os.path.join(self.root, prefix))
            except (OSError, ValueError):
                continue
            if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
                return prefix
        return None

    def _category(self, rel: str) -> Optional[tuple[str, str]]:
        if rel == ".":
            return None
        for pat, rx in self._hidden:
            if rx.fullmatch(rel):
                return "hidden", pat
        for pat, rx in self._private:
            if rx.fullmatch(rel):
                return "private", pat
        if _rel_under(rel, self.state_dir) is not None:
            return "state", self.state_dir
        if rel.lower() == ".git" or rel.lower().startswith(".git/"):
            return "git", ".git"
        for pat, rx in self._frozen:
            if rx.fullmatch(rel):
                return "frozen", pat
        return None

    # -- questions the decisions ask

    def inside(self, path: str, cwd: str) -> bool:
        return bool(self._relatives(path, cwd))

    def in_state_dir(self, path: str, cwd: str) -> bool:
        return any(_rel_under(r, self.state_dir) is not None for r in self._relatives(path, cwd))

    def is_editable(self, path: str, cwd: str) -> bool:
        rels = self._relatives(path, cwd)
        if not rels or any(self._category(r) for r in rels):
            return False
        return any(rx.fullmatch(r) for r in rels for rx in self._editable)

    def write_problem(self, path: str, cwd: str, strict: bool = False) -> Optional[str]:
        """Why writing `path` is not allowed, or None. strict: only the editable files may be
        written (the file-edit tools); otherwise only protected paths are refused (the shell)."""
        rels = self._relatives(path, cwd)
        twin = self._hard_link_twin(path, cwd)
        if twin:
            rels.add(twin)
        if not rels:
            return None                                  # outside the workspace: not ours
        for rel in sorted(rels):
            cat = self._category(rel)
            if cat:
                return self._reason("state" if cat[0] == "private" else cat[0], rel)
        if strict and not any(rx.fullmatch(r) for r in rels for rx in self._editable):
            return self._reason("not-editable", sorted(rels)[0])
        return None

    def read_problem(self, path: str, cwd: str) -> Optional[str]:
        rels = self._relatives(path, cwd)
        twin = self._hard_link_twin(path, cwd)
        for rel in sorted(rels | ({twin} if twin else set())):
            cat = self._category(rel)
            if cat and cat[0] in ("hidden", "private"):
                return self._reason(cat[0], rel)
        return None

    def covers_problem(self, path: str, cwd: str) -> Optional[str]:
        """A recursive operation on `path` would reach a protected location."""
        return self._covers(path, cwd, self._protected_prefixes)

    def covers_hidden_problem(self, path: str, cwd: str) -> Optional[str]:
        """A recursive copy/archive of `path` would include the hidden split or private state."""
        return self._covers(path, cwd, self._hidden_prefixes)

    def _covers(self, path: str, cwd: str, prefixes) -> Optional[str]:
        lex, real = self._resolve(path, cwd)
        for p in (lex, real):
            for base in (self.root, self.root_real):
                if _rel_under(base, p) is not None:
                    return (f"{path} contains the whole workspace, including the frozen files and the "
                            f"loop's state; act on train.py or on specific files instead.")
        for rel in self._relatives(path, cwd):
            for prefix in prefixes:
                if _rel_under(prefix.lower(), rel.lower()) is not None:
                    cat = self._category(prefix) or ("frozen", prefix)
                    return f"{path} contains {prefix}: " + self._reason(cat[0], prefix)
        return None

    def pattern_hits(self, pattern: str, cwd: str, covers: bool = False,
                     hidden_only: bool = False) -> Optional[str]:
        """For a path only known at run time ('*' where a value is unknown): the protected
        location it could name, if any."""
        pats = [pattern.lower()] if pattern.startswith(("/", "*")) else []
        if not os.path.isabs(pattern):
            pats.append(os.path.normpath(os.path.join(cwd or self.root, pattern)).lower())
        prefixes = self._hidden_prefixes if hidden_only else self._protected_prefixes
        targets = {}
        for base in {self.root, self.root_real}:
            for prefix in prefixes:
                targets[os.path.join(base, prefix)] = prefix
                if covers:
                    parts = prefix.split("/")
                    for k in range(len(parts)):
                        targets[os.path.join(base, *parts[:k]) if k else base] = prefix
        for target, prefix in targets.items():
            if any(fnmatchcase(target.lower(), p) for p in pats):
                return prefix
        return None

    # -- text (scripts, commands)

    def hidden_mention(self, text: str) -> Optional[str]:
        for name, rx in self._hidden_mentions:
            if rx.search(text):
                return (f"this names {name}, the hidden test split; it is scored for humans only and is "
                        f"never shown to the agent. Judge changes by the val_bpb that run_experiment reports.")
        return None

    def mentions(self, text: str) -> Optional[str]:
        for name, rx in self._references + self._hidden_mentions:
            if rx.search(text):
                return name
        return None

    def mentions_state_dir(self, text: str) -> bool:
        return bool(self._state_mention.search(text))

    def script_problem(self, text: str, lang: str, any_state_reference: bool = True) -> Optional[str]:
        """Code run by an interpreter: any mention of the hidden split or of the state dir is
        refused (a script can build the rest of a path at run time); a mention of another
        protected path together with a way to write files is refused."""
        hidden = self.hidden_mention(text)
        if hidden:
            return hidden
        if self.mentions_state_dir(text) and (any_state_reference or _PRIVATE_NAMES.search(text)):
            return (f"this code refers to {self.state_dir}/, the loop's own state (ledger, runs, data, the "
                    f"hidden test split); scripts may not open it. Use the state_read tool; a training log "
                    f"can be read with tail or cat.")
        names = [name for name, rx in self._references if rx.search(text)]
        if not names:
            return None
        tokens = _AWK_WRITE_TOKENS if lang == "awk" else _WRITE_TOKENS
        m = tokens.search(text)
        if m is None:
            return None
        return (f"this {lang} code names {names[0]} and can write files ({m.group(0).strip()!r}). "
                f"{self._reason_for_name(names[0])} The guard cannot tell reading from writing inside "
                f"a script: read frozen files with cat, grep or sed -n, and put your changes in "
                f"{self.editable[0]}.")

    def frozen_script_problem(self, path: str, cwd: str, rest: list) -> Optional[str]:
        """Running a frozen script directly (python prepare.py ...): only `verify` is harmless —
        `prepare` rewrites the frozen data and `evaluate` prints the hidden test score."""
        rels = self._relatives(path, cwd)
        if not any((self._category(r) or ("",))[0] == "frozen" for r in rels) or not path.endswith(".py"):
            return None
        if rest and rest[0] in ("verify", "--help", "-h"):
            return None
        name = os.path.basename(path)
        return (f"{name} is run by the loop, not by the agent: its `prepare` step rewrites the frozen data "
                f"and `evaluate` reports the hidden test score. `python {name} verify` is allowed; to "
                f"measure a change to {self.editable[0]}, call run_experiment.")

    def apply_patch_problem(self, text: str, cwd: str) -> Optional[str]:
        for action, target in parse_apply_patch(text):
            problem = self.write_problem(target, cwd, strict=True)
            if problem:
                return f"apply_patch ({action} {target}): {problem}"
        return None

    # -- reasons the agent can act on

    def _reason(self, kind: str, rel: str) -> str:
        ed = ", ".join(self.editable)
        first = self.editable[0]
        if kind == "hidden":
            return (f"{rel} is the hidden test split; it is scored for humans only and is never shown to "
                    f"the agent. Judge changes by the val_bpb that run_experiment reports.")
        if kind == "private":
            return (f"{rel} holds results that include the hidden test score; read experiment results with "
                    f"the state_read tool instead.")
        if kind == "state":
            return (f"{rel} is in {self.state_dir}/, the loop's own state (ledger, runs, data); only the loop "
                    f"writes there. Read results with the state_read tool.")
        if kind == "git":
            return (f"{rel} is the loop's git state; run_experiment commits {first}, score keeps or resets "
                    f"the branch and revert restores {first}. Read-only git (status, diff, log, show) is fine.")
        if kind == "frozen":
            if os.path.basename(rel).lower() == "prepare.py":
                return (f"{rel} is the frozen evaluator; only {ed} may be edited. Make your change in "
                        f"{first} and call run_experiment.")
            what = _DESCRIPTIONS.get(rel.split("/")[0].lower(), "part of the frozen verifier")
            return (f"{rel} is frozen ({what}); only {ed} may be edited. Make your change in {first} and "
                    f"call run_experiment.")
        return (f"{rel} is not editable; only {ed} may be changed in this workspace. Put your code in "
                f"{first}; scratch files belong outside the workspace (e.g. /tmp).")

    def _reason_for_name(self, name: str) -> str:
        name = name.replace(".__file__", ".py")          # prepare.__file__ is prepare.py
        cat = self._category(name) or ("frozen", name)
        return self._reason(cat[0], name)


def policy_from_config(root, paths) -> Policy:
    """Policy from a workspace root and a PathsConfig (mcp_server.loop.config)."""
    return Policy(str(root), paths.editable, paths.frozen, paths.hidden, paths.state_dir)


def _paths_table_fast(table) -> Optional[dict]:
    """The [paths] table as Policy arguments, without pydantic, when it is complete and obviously
    valid (what `loopwright init` writes). Anything else goes through PathsConfig."""
    if not isinstance(table, dict) or set(table) != set(PATH_KEYS):
        return None
    lists = [table[k] for k in ("editable", "frozen", "hidden")]
    if not all(isinstance(v, list) and all(isinstance(p, str) for p in v) for v in lists):
        return None
    if not lists[0] or set(lists[0]) & set(lists[1]) or not isinstance(table["state_dir"], str):
        return None
    if any(p.startswith("/") or ".." in p.split("/") for v in lists for p in v):
        return None
    return {k: table[k] for k in PATH_KEYS}


def load_policy(root) -> Policy:
    """The workspace's policy from its loopwright.toml. An unreadable or invalid file falls back
    to the default paths (which protect at least as much): the guard fails closed, never open."""
    root = str(root)
    try:
        with open(os.path.join(root, CONFIG_NAME), "rb") as f:
            fast = _paths_table_fast(tomllib.load(f).get("paths"))
        if fast is not None:
            return Policy(root, **fast)
    except (OSError, ValueError) as e:          # TOMLDecodeError is a ValueError
        _note(f"loopwright guard: {CONFIG_NAME} unreadable ({e}); using the default protected paths")
        return policy_from_config(root, _default_paths())
    from mcp_server.loop.config import ConfigError, load_config
    try:
        paths = load_config(root).paths
    except (ConfigError, OSError, ValueError) as e:
        _note(f"loopwright guard: {e}; using the default protected paths")
        paths = _default_paths()
    return policy_from_config(root, paths)


def _default_paths():
    from mcp_server.loop.config import PathsConfig
    return PathsConfig()


# --------------------------------------------------------------------------- PreToolUse

_PATCH_HEADER = re.compile(r"^\*\*\* (Add File|Update File|Delete File|Move to):[ \t]*(.+?)[ \t]*$", re.M)


def parse_apply_patch(text: str) -> list[tuple[str, str]]:
    """[(action, path)] from a Codex apply_patch envelope."""
    return [(m.group(1), m.group(2)) for m in _PATCH_HEADER.finditer(text or "")]


def decide_pre_tool_use(payload: dict, policy: Policy) -> Decision:
    """Allow or deny one tool call for one workspace policy."""
    tool = str(payload.get("tool_name") or "")
    inp = _tool_input(payload)
    cwd = _payload_cwd(payload, inp)
    if tool.startswith("mcp__"):
        return ALLOW                                # the loop's own tools (and others') decide for themselves
    if tool in EDIT_TOOLS:
        return _decide_edit(tool, inp, cwd, policy)
    if tool in READ_TOOLS:
        return _decide_read(tool, inp, cwd, policy)
    if tool in PATCH_TOOLS:
        return _decide_patch(inp, cwd, policy)
    if tool in SHELL_TOOLS or tool in STDIN_TOOLS:
        return _decide_shell(tool, inp, cwd, policy)
    if tool in GIT_TOOLS:
        return _deny(f"{tool} creates a branch and a worktree in the loop's repository. The loop owns git: "
                     f"work in this workspace, edit {policy.editable[0]} and call run_experiment.")
    return _decide_unknown(tool, inp, cwd, policy)


def _tool_input(payload: dict) -> dict:
    inp = payload.get("tool_input")
    if isinstance(inp, dict):
        return inp
    if isinstance(inp, (str, list)):
        return {"command": inp}
    return {}


def _payload_cwd(payload: dict, inp: dict) -> str:
    base = payload.get("cwd") if isinstance(payload.get("cwd"), str) and payload.get("cwd") else os.getcwd()
    for key in ("workdir", "cwd", "working_directory"):     # Codex shell tools carry their own
        if isinstance(inp.get(key), str) and inp[key]:
            return os.path.join(base, inp[key])
    return base


def _patch_text(inp: dict) -> Optional[str]:
    for key in ("command", "patch", "input"):
        value = inp.get(key)
        if isinstance(value, list):
            value = "\n".join(map(str, value))
        if isinstance(value, str) and value.strip():
            return value
    return None


def _deny(reason: str) -> Decision:
    return Decision(False, reason)


def _decide_edit(tool: str, inp: dict, cwd: str, policy: Policy) -> Decision:
    paths = [inp[k] for k in PATH_KEYS_IN_INPUT if isinstance(inp.get(k), str) and inp[k]]
    if not paths:
        text = _patch_text(inp)
        if text and parse_apply_patch(text):        # Codex may route apply_patch under an edit alias
            return _decide_patch(inp, cwd, policy)
        return _deny(f"{tool} without a file path: the guard cannot tell which file it changes.")
    for path in paths:
        problem = policy.write_problem(path, cwd, strict=True)
        if problem:
            return _deny(problem)
    return ALLOW


def _decide_read(tool: str, inp: dict, cwd: str, policy: Policy) -> Decision:
    paths = [inp[k] for k in PATH_KEYS_IN_INPUT if isinstance(inp.get(k), str) and inp[k]]
    for path in paths:
        problem = policy.read_problem(path, cwd)
        if problem is None and tool == "Grep" and policy.in_state_dir(path, cwd):
            problem = policy.covers_hidden_problem(path, cwd)
        if problem:
            return _deny(problem)
    for key in ("glob", "pattern"):
        value = inp.get(key)
        if tool == "Grep" and key == "pattern":
            continue                                # a regex, not a file name
        if isinstance(value, str):
            problem = policy.hidden_mention(value) or policy.read_problem(value, cwd)
            if problem:
                return _deny(problem)
    return ALLOW


def _decide_patch(inp: dict, cwd: str, policy: Policy) -> Decision:
    text = _patch_text(inp)
    if text is None:
        return _deny("apply_patch without patch text: the guard cannot tell which files it changes.")
    problem = policy.apply_patch_problem(text, cwd)
    return _deny(problem) if problem else ALLOW


def _shell_text(tool: str, inp: dict) -> Optional[str]:
    keys = ("chars",) if tool in STDIN_TOOLS else ("command", "cmd", "argv", "args")
    for key in keys:
        value = inp.get(key)
        if isinstance(value, list) and value:
            return shlex.join(str(v) for v in value)   # ["bash", "-lc", "..."] is analysed as such
        if isinstance(value, str):
            shell = inp.get("shell")                   # Codex exec_command may name another interpreter
            if isinstance(shell, str) and shell and tool not in STDIN_TOOLS:
                return shlex.join([shell, "-c", value])
            return value
    return None


def _decide_shell(tool: str, inp: dict, cwd: str, policy: Policy) -> Decision:
    text = _shell_text(tool, inp)
    if text is None:
        if tool in STDIN_TOOLS:
            return ALLOW                            # polling a session without typing
        return _deny(f"{tool} call without a command: the guard cannot tell what it runs.")
    reason = ShellGuard(policy, cwd).check(text)
    return _deny(reason) if reason else ALLOW


def _decide_unknown(tool: str, inp: dict, cwd: str, policy: Policy) -> Decision:
    """A tool we do not know that names a file or carries a patch: treat it as a writer."""
    for path in (inp[k] for k in PATH_KEYS_IN_INPUT if isinstance(inp.get(k), str) and inp[k]):
        problem = policy.write_problem(path, cwd) or policy.read_problem(path, cwd)
        if problem:
            return _deny(problem)
    text = _patch_text(inp)
    if text and parse_apply_patch(text):
        return _decide_patch(inp, cwd, policy)
    return ALLOW


# --------------------------------------------------------------------------- workspaces

# Path-like words in a command: absolute, ~/..., or relative with a slash (../ws/prepare.py).
_PATH_WORD = re.compile(r"""(?<![\w$.])((?:/|~/|\.{1,2}/|[\w.-]+/)[^\s'"`;|&<>()$]*)""")


def find_workspace_roots(start: str) -> list[str]:
    """Every ancestor of `start` (itself included) holding a loopwright.toml, nearest first."""
    path = os.path.abspath(os.path.expanduser(start))
    found = []
    while True:
        if os.path.isfile(os.path.join(path, CONFIG_NAME)):
            found.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            return found
        path = parent


def payload_workspaces(payload: dict) -> list[str]:
    """The workspaces a tool call may touch: around its cwd, CLAUDE_PROJECT_DIR, and any absolute
    path it names. All of them are checked (a loopwright.toml planted in a subdirectory only adds
    protection; it never replaces the outer workspace's)."""
    inp = _tool_input(payload)
    cwd = _payload_cwd(payload, inp)
    starts = [cwd, os.environ.get("CLAUDE_PROJECT_DIR") or ""]
    for key in PATH_KEYS_IN_INPUT:
        if isinstance(inp.get(key), str):
            starts.append(os.path.join(cwd, inp[key]))
    home = os.path.expanduser("~")
    for value in inp.values():
        if isinstance(value, list):
            value = " ".join(map(str, value))
        if isinstance(value, str):
            value = value[:100_000].replace("${HOME}", home).replace("$HOME", home)
            starts.extend(os.path.join(cwd, m.group(1)) for m in _PATH_WORD.finditer(value))
            starts.extend(os.path.join(cwd, target) for _, target in parse_apply_patch(value))
    roots: list[str] = []
    for start in dict.fromkeys(s for s in starts[:200] if s):
        for candidate in {start, os.path.realpath(os.path.expanduser(start))}:
            for root in find_workspace_roots(candidate):
                if root not in roots:
                    roots.append(root)
    return roots


def decide_for_payload(payload: dict) -> Decision:
    """The PreToolUse decision across every workspace the call may touch (none: allow)."""
    if not isinstance(payload, dict):
        raise ValueError("hook payload is not a JSON object")
    for root in payload_workspaces(payload):
        decision = decide_pre_tool_use(payload, load_policy(root))
        if not decision.allow:
            return decision
    return ALLOW


# --------------------------------------------------------------------------- Stop

def _status_dict(status: Any) -> Optional[dict]:
    if status is None:
        return None
    if hasattr(status, "model_dump"):
        status = status.model_dump()
    elif not isinstance(status, dict):
        status = {k: getattr(status, k) for k in dir(status) if not k.startswith("_")
                  and not callable(getattr(status, k))}
    return dict(status)


def _default_next_step(reason: str) -> str:
    return (f"Budget remains{f' ({reason})' if reason else ''}. Do not stop and do not ask whether to "
            "continue: call suggest_next or state_read, make one change to train.py, call run_experiment, "
            "then score. Repeat until budget_check says should_stop.")


def stop_decision(payload: dict, status: Any, idle_blocks: int = 0,
                  max_idle_blocks: int = DEFAULT_MAX_IDLE_STOP_BLOCKS) -> Optional[dict]:
    """{"decision": "block", "reason": next step} while budget remains, else None (let it stop).

    status: {should_stop, reason, next_step} (dict or object); None = unknown -> let it stop.
    stop_hook_active (Claude Code and Codex: this stop follows one we blocked) does not by itself
    release the agent — the budget is the stop condition — but idle_blocks (consecutive blocks
    with no progress in between) at max_idle_blocks does, so a stuck agent cannot loop forever.
    max_idle_blocks 0 disables that cap.
    """
    st = _status_dict(status)
    if st is None or st.get("should_stop"):
        return None
    if max_idle_blocks and idle_blocks >= max_idle_blocks:
        return None
    reason = str(st.get("next_step") or "") or _default_next_step(str(st.get("reason") or ""))
    return {"decision": "block", "reason": reason}


def load_status(root) -> Optional[dict]:
    """The loop's budget status from mcp_server.loop.status.loop_status, or None when unknown."""
    try:
        from mcp_server.loop.status import loop_status
    except ImportError as e:
        _note(f"loopwright guard: loop status unavailable ({e}); letting the agent stop")
        return None
    return _status_dict(loop_status(root))


def _progress_mark(status: dict) -> str:
    """Changes when the loop made progress (an experiment ran). Prefer an explicit counter."""
    for key in ("progress", "experiments", "experiments_done", "n_experiments", "experiments_used"):
        if key in status:
            return json.dumps(status[key], default=str)
    return json.dumps(status, sort_keys=True, default=str)


def _stop_counter_path(policy: Policy, session_id: str) -> Optional[str]:
    if not os.path.isdir(policy.state_abs):
        return None
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", session_id or "default")[:100]
    return os.path.join(policy.state_abs, "guard", f"stop-{safe}.json")


def run_stop(payload: dict, root: str) -> Optional[dict]:
    """Stop hook for one workspace: the decision, with the idle-block counter kept on disk."""
    status = load_status(root)
    if status is None:
        return None
    counter = _stop_counter_path(load_policy(root), str(payload.get("session_id") or ""))
    mark = _progress_mark(status)
    saved = _read_json(counter) if counter else {}
    idle = 0
    if payload.get("stop_hook_active") and saved.get("mark") == mark:
        idle = int(saved.get("blocks", 0))
    cap = _int_env("LOOPWRIGHT_STOP_MAX_IDLE_BLOCKS", DEFAULT_MAX_IDLE_STOP_BLOCKS)
    decision = stop_decision(payload, status, idle, cap)
    if decision is None and status and not status.get("should_stop"):
        _note(f"loopwright guard: {idle} stop attempts in a row without progress; letting the agent stop")
    if counter:
        _write_json(counter, {"mark": mark, "blocks": idle + 1} if decision else {})
    return decision


# --------------------------------------------------------------------------- SessionStart

def session_start_context(payload: dict, root: str) -> str:
    """The text given to a starting, resumed or compacted session."""
    try:
        from mcp_server.loop.status import session_summary
    except ImportError:
        return _fallback_context(root)
    try:
        return str(session_summary(root))
    except Exception as e:                      # a broken ledger must not stop the session starting
        _note(f"loopwright guard: session summary failed ({type(e).__name__}: {e})")
        return _fallback_context(root)


def _fallback_context(root: str) -> str:
    try:
        editable = ", ".join(load_policy(root).editable)
    except Exception:
        editable = "train.py"
    return (f"This is a loopwright workspace ({root}). Read program.md first: it is the spec for this "
            f"research loop. Only {editable} may be edited; prepare.py, loopwright.toml and the state "
            f"directory are frozen and guarded. Work through the loopwright MCP tools: state_read, "
            f"suggest_next, run_experiment, score, budget_check. Do not stop while budget remains.")


# --------------------------------------------------------------------------- entry point

def emit_pre_tool_use(decision: Decision, exit_code_format: bool = False) -> int:
    """Allow: exit 0, no output. Deny: the reason on stderr, and either exit 0 with the
    hookSpecificOutput JSON on stdout (default; both clients) or exit 2 (exit_code_format)."""
    if decision.allow:
        return 0
    sys.stderr.write(decision.reason + "\n")
    if exit_code_format:
        return 2
    sys.stdout.write(json.dumps({"hookSpecificOutput": {
        "hookEventName": "PreToolUse",
        "permissionDecision": "deny",
        "permissionDecisionReason": decision.reason,
    }}) + "\n")
    return 0


def _main_pre_tool_use(raw: str, exit_code_format: bool) -> int:
    try:
        decision = decide_for_payload(json.loads(raw))
    except Exception as e:
        # fail closed: exit 2 blocks in both clients even when nothing else works
        sys.stderr.write(f"loopwright guard could not check this action ({type(e).__name__}: {e}), so it "
                         f"is blocked (the guard fails closed). Edit train.py with the edit tool and use "
                         f"the loopwright MCP tools; if this repeats, report it.\n")
        return 2
    return emit_pre_tool_use(decision, exit_code_format)


def _session_root(payload: dict) -> Optional[str]:
    """The workspace a Stop / SessionStart belongs to: around its cwd, else CLAUDE_PROJECT_DIR."""
    for start in (_payload_cwd(payload, {}), os.environ.get("CLAUDE_PROJECT_DIR")):
        roots = find_workspace_roots(start) if start else []
        if roots:
            return roots[0]
    return None


def _main_stop(raw: str, exit_code_format: bool) -> int:
    try:
        payload = json.loads(raw)
        root = _session_root(payload)
        decision = run_stop(payload, root) if root else None
    except Exception as e:
        # fail open here: blocking on a broken status could keep an agent spinning forever
        _note(f"loopwright guard: stop check failed ({type(e).__name__}: {e}); letting the agent stop")
        return 0
    if decision:
        sys.stdout.write(json.dumps(decision) + "\n")
    return 0


def _main_session_start(raw: str, exit_code_format: bool) -> int:
    try:
        payload = json.loads(raw)
        root = _session_root(payload)
        if root is None:
            return 0
        context = session_start_context(payload, root)
    except Exception as e:
        _note(f"loopwright guard: session-start failed ({type(e).__name__}: {e})")
        return 0
    sys.stdout.write(json.dumps({"hookSpecificOutput": {
        "hookEventName": "SessionStart", "additionalContext": context}}) + "\n")
    return 0


_EVENTS = {"pre-tool-use": _main_pre_tool_use, "pretooluse": _main_pre_tool_use,
           "stop": _main_stop, "session-start": _main_session_start, "sessionstart": _main_session_start}


def main(argv: Optional[list] = None) -> int:
    """python -m mcp_server.guard <pre-tool-use|stop|session-start> [--exit-code] < payload.

    --exit-code (or LOOPWRIGHT_GUARD_FORMAT=exit-code) denies with exit 2 + stderr instead of
    the JSON; without an event argument the payload's hook_event_name decides."""
    args = list(sys.argv[1:] if argv is None else argv)
    exit_code_format = "--exit-code" in args or os.environ.get("LOOPWRIGHT_GUARD_FORMAT") == "exit-code"
    events = [a for a in args if not a.startswith("--")]
    try:
        raw = sys.stdin.read()
    except Exception as e:
        sys.stderr.write(f"loopwright guard: cannot read the hook payload ({e}); blocked.\n")
        return 2
    event = events[0] if events else _event_from_payload(raw)
    handler = _EVENTS.get(event.lower().replace("_", "-"))
    if handler is None:
        sys.stderr.write(f"loopwright guard: unknown event {event!r}; use pre-tool-use, stop or "
                         f"session-start. Blocked.\n")
        return 2
    return handler(raw, exit_code_format)


def _event_from_payload(raw: str) -> str:
    try:
        name = json.loads(raw).get("hook_event_name", "")
    except Exception:
        return "pre-tool-use"                    # unreadable: fail closed through the strictest path
    return {"PreToolUse": "pre-tool-use", "Stop": "stop", "SessionStart": "session-start"}.get(name, name)


# --------------------------------------------------------------------------- small helpers

def _note(message: str):
    sys.stderr.write(message + "\n")


def _int_env(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_json(path: str, data: dict):
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError as e:
        _note(f"loopwright guard: cannot record the stop counter ({e})")


if __name__ == "__main__":
    sys.exit(main())
