"""The workspace's path policy: which files are editable, frozen, hidden or the loop's state,
read from loopwright.toml's [paths] table, and the reason shown to the agent for each refusal.

- The file-edit tools may change only the editable files. The shell may also write other,
  unlisted files (logs, scratch), but never the frozen files, the state dir or .git.
- Reads: only the hidden split and the state dir's private records (state.db*,
  runs/*/eval.json, reports/**: they carry the hidden test score) are refused.
- Scripts are refused when they name the state dir or the hidden split at all, or name another
  protected file and contain a way to write (open(..., 'w'), unlink, shutil, ...).

Stdlib only on the hot path: mcp_server.loop.config (pydantic) is imported only when the
[paths] table is incomplete or invalid.
"""
from __future__ import annotations

import os
import re
import sys
from fnmatch import fnmatchcase
from typing import Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10, where tomli is a declared dependency
    import tomli as tomllib

CONFIG_NAME = "loopwright.toml"
PATH_KEYS = ("editable", "frozen", "hidden", "state_dir")

# Results that carry the hidden test score live in the state dir; the agent gets val_bpb
# from run_experiment / state_read instead. Relative to state_dir.
PRIVATE_STATE = ("state.db*", "runs/*/eval.json", "reports/**")
# How paths inside the loop's external state home (ledger, val/test data, settings) are named.
STATE_HOME_REL = "<loopwright state>"


def loop_state_home() -> str:
    """Same rule as mcp_server.loop.workspace.state_home (not imported: the hook must start fast)."""
    if os.environ.get("LOOPWRIGHT_HOME"):
        return os.path.abspath(os.path.expanduser(os.environ["LOOPWRIGHT_HOME"]))
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(os.path.abspath(os.path.expanduser(base)), "loopwright")

_DESCRIPTIONS = {
    "prepare.py": "the frozen evaluator", "evaluate.py": "the frozen evaluator",
    "pt2audit.py": "the frozen check of the exported model archive",
    "program.md": "the research spec you follow",
    "loopwright.toml": "the loop's frozen configuration: benchmark, paths, noise",
    "agents.md": "the agent instructions", "claude.md": "the agent instructions",
    ".mcp.json": "the client configuration", ".claude": "the client configuration",
    ".codex": "the client configuration", ".gitignore": "what keeps the loop's state out of git",
}



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
# loopwright's own code: the agent's scripts never import or run it (decisions, approvals, settings
# belong to the person running the loop; the agent has the MCP tools)
_LOOPWRIGHT_CODE = re.compile(r"mcp_server", re.IGNORECASE)
# the loopwright CLI named in code (not `.loopwright/`, `loopwright.toml`) together with a person's command
_CLI_NAME = re.compile(r"(?<![\w.-])loopwright(?![\w.-])", re.IGNORECASE)
HUMAN_COMMANDS = ("approve", "reject", "config", "stop", "init", "launch", "cron", "webhook", "notify", "dashboard")
_HUMAN_WORD = re.compile(r"\b(?:" + "|".join(HUMAN_COMMANDS) + r")\b")
_STATE_HOME_NAMES = re.compile(r"LOOPWRIGHT_HOME|XDG_DATA_HOME|share/loopwright")
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
        # the loop's state directories outside the workspace: no read, no write
        home = loop_state_home()
        self.state_home = tuple(_unique([home, os.path.realpath(home)]))

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
            for base in self.state_home:
                r = _rel_under(p, base)
                if r is not None:
                    rels.add(STATE_HOME_REL if r == "." else f"{STATE_HOME_REL}/{r}")
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
        if rel == STATE_HOME_REL or rel.startswith(STATE_HOME_REL + "/"):
            return "statehome", STATE_HOME_REL
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
            if cat and cat[0] in ("hidden", "private", "statehome"):
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
        if _LOOPWRIGHT_CODE.search(text):
            return ("this code imports or runs loopwright's own code (mcp_server): decisions on waiting changes, "
                    "approvals and the loop's settings belong to the person running the loop. Use the MCP tools "
                    "(state_read, run_experiment, score, revert, budget_check, note, suggest_next).")
        cli = _CLI_NAME.search(text) and _HUMAN_WORD.search(text)
        if cli:
            return (f"this code runs `loopwright {cli.group(0)}`, a command for the person running the loop "
                    "(approvals, settings, sessions). Use the MCP tools instead.")
        if _STATE_HOME_NAMES.search(text) or any(h in text for h in self.state_home):
            return self._reason("statehome", STATE_HOME_REL)
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
        if kind == "statehome":
            return (f"{rel} is the loop's own state outside the workspace (ledger, validation and test data, "
                    "settings); neither the agent nor train.py may read or write it. Use the MCP tools "
                    "(state_read, budget_check); budgets and connectors are changed by a human with "
                    "`loopwright config`.")
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
        note(f"loopwright guard: {CONFIG_NAME} unreadable ({e}); using the default protected paths")
        return policy_from_config(root, _default_paths())
    from mcp_server.loop.config import ConfigError, load_config
    try:
        paths = load_config(root).paths
    except (ConfigError, OSError, ValueError) as e:
        note(f"loopwright guard: {e}; using the default protected paths")
        paths = _default_paths()
    return policy_from_config(root, paths)


def _default_paths():
    from mcp_server.loop.config import PathsConfig
    return PathsConfig()



_PATCH_HEADER = re.compile(r"^\*\*\* (Add File|Update File|Delete File|Move to):[ \t]*(.+?)[ \t]*$", re.M)


def parse_apply_patch(text: str) -> list[tuple[str, str]]:
    """[(action, path)] from a Codex apply_patch envelope."""
    return [(m.group(1), m.group(2)) for m in _PATCH_HEADER.finditer(text or "")]


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



def note(message: str):
    sys.stderr.write(message + "\n")

