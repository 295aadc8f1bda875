"""Static analysis of a shell command for the guard: what would it write, delete or read?

The PreToolUse hook sees only the command text, before it runs. This module lexes
that text the way bash would (quotes, escapes, $(...), backticks, heredocs,
redirections, ;, &&, ||, |, subshells), expands what can be known in advance
(literal words, variables assigned earlier in the same command, ~, {a,b}, globs
against the real filesystem), and checks every file the command would touch
against the workspace policy. Commands that run other code (bash -c, eval,
python -c, heredocs fed to an interpreter, xargs, find -exec) are followed into
that code.

What cannot be known before running (a path computed at run time, a script
fetched or decoded on the fly) is the manifest check's job, not this module's:
see mcp_server/integrity.py.

The policy object is duck-typed (mcp_server.guard.hook.Policy); this module does not
import guard.py so the two stay independently testable.
"""
from __future__ import annotations

import glob as _glob
import os
import re
import shlex
from dataclasses import dataclass, field
from itertools import islice
from typing import Callable, Optional

MAX_DEPTH = 8            # nested bash -c / $(...) levels before we give up (and deny)
MAX_SCRIPT_BYTES = 1 << 20
MAX_GLOB_MATCHES = 2000  # beyond this a glob is judged by its pattern, not by listing every match


class Denied(Exception):
    """Raised on the first forbidden effect; the message is the reason shown to the agent."""


class ShellParseError(ValueError):
    pass


# --------------------------------------------------------------------------- lexer

@dataclass
class Word:
    # parts: ("lit", text) unquoted, ("q", text) quoted, ("var", name) unquoted $X (word-split),
    # ("qvar", name) "$X", ("sub", inner text)
    parts: list
    src: str = ""                # as written, for messages


@dataclass
class Redir:
    op: str                      # > >> >| &> &>> <> < << <<- <<< >& <&
    target: Optional[Word]       # None for heredocs and fd duplications
    text: Optional[str] = None   # heredoc body
    delim: str = ""
    strip_tabs: bool = False
    expand: bool = True          # unquoted heredoc delimiter: body undergoes $(...) expansion


@dataclass
class Op:
    op: str


@dataclass
class Command:
    words: list = field(default_factory=list)
    redirs: list = field(default_factory=list)
    pipe_from: Optional["Command"] = None


_METACHARS = set(" \t\r\n;&|()<>")
_OPERATORS = ("&&", "||", ";;&", ";;", ";&", "|&", ";", "&", "|", "(", ")")
_REDIR_OPS = ("<<<", "<<-", "<<", "<>", "<&", "<", ">>", ">|", ">&", ">", "&>>", "&>")
_ANSI_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "e": "\x1b",
                 "E": "\x1b", "f": "\f", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}


class _Lexer:
    """One pass over the text; collects tokens and the inner text of every substitution."""

    def __init__(self, text: str):
        self.s = text
        self.i = 0
        self.tokens: list = []
        self.subs: list[str] = []        # command substitutions / process substitutions to analyse
        self.pending: list[Redir] = []   # heredocs whose body starts after the next newline

    def lex(self):
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c == "\n":
                self.tokens.append(Op("\n"))
                self.i += 1
                self._read_heredoc_bodies()
            elif c in " \t\r":
                self.i += 1
            elif s.startswith("\\\n", self.i):
                self.i += 2
            elif c == "#":
                nl = s.find("\n", self.i)
                self.i = len(s) if nl < 0 else nl
            elif c in "<>" and s.startswith("(", self.i + 1):
                self.tokens.append(self._word())          # process substitution <(...) >(...)
            elif self._try_redirection():
                pass
            elif c in ";&|()":
                op = next(o for o in _OPERATORS if s.startswith(o, self.i))
                self.tokens.append(Op(op))
                self.i += len(op)
            else:
                self.tokens.append(self._word())
        self._read_heredoc_bodies()
        return self.tokens, self.subs

    # -- redirections and heredocs

    def _try_redirection(self) -> bool:
        s, j = self.s, self.i
        while j < len(s) and s[j].isdigit():
            j += 1
        op = next((o for o in _REDIR_OPS if s.startswith(o, j)), None)
        if op is None or (j > self.i and op.startswith("&")):
            return False
        self.i = j + len(op)
        while self.i < len(s) and s[self.i] in " \t":
            self.i += 1
        if self.i >= len(s) or s[self.i] in "\n;&|()<>":
            raise ShellParseError(f"redirection {op!r} has no target")
        if op in ("<<", "<<-"):
            start = self.i
            word = self._word()
            raw = s[start:self.i]
            red = Redir(op, None, delim=_plain(word), strip_tabs=(op == "<<-"),
                        expand=not any(q in raw for q in "'\"\\"))
            self.pending.append(red)
        elif op in (">&", "<&"):
            word = self._word()
            text = _plain(word)
            if text == "-" or text.isdigit():
                red = Redir(op, None)                      # fd duplication, not a file
            else:
                red = Redir("&>" if op == ">&" else "<", word)
        else:
            red = Redir(op, self._word())
        self.tokens.append(red)
        return True

    def _read_heredoc_bodies(self):
        s = self.s
        for red in self.pending:
            lines = []
            while self.i < len(s):
                nl = s.find("\n", self.i)
                end = len(s) if nl < 0 else nl
                line = s[self.i:end]
                self.i = end + 1
                if (line.lstrip("\t") if red.strip_tabs else line) == red.delim:
                    break
                lines.append(line)
            red.text = "\n".join(lines) + ("\n" if lines else "")
            if red.expand:
                self._scan_expansions(red.text)
        self.pending = []

    def _scan_expansions(self, text: str):
        """$(...) and `...` inside an unquoted heredoc body run when the heredoc is read."""
        sub = _Lexer(text)
        while sub.i < len(text):
            c = text[sub.i]
            if c == "\\":
                sub.i += 2
            elif c == "$":
                sub._dollar([])
            elif c == "`":
                sub._backtick([])
            else:
                sub.i += 1
        self.subs.extend(sub.subs)

    # -- words

    def _word(self) -> Word:
        s, start = self.s, self.i
        parts: list = []
        if s[self.i] in "<>":                              # <(...) / >(...)
            end = self._match_paren(self.i + 1)
            inner = s[self.i + 2:end]
            self.subs.append(inner)
            self.i = end + 1
            parts.append(("sub", inner))
        while self.i < len(s):
            c = s[self.i]
            if c in _METACHARS:
                break
            if c == "\\":
                if s.startswith("\\\n", self.i):
                    self.i += 2
                    continue
                parts.append(("q", s[self.i + 1:self.i + 2]))
                self.i += 2
            elif c == "'":
                end = s.find("'", self.i + 1)
                if end < 0:
                    raise ShellParseError("unterminated single quote")
                parts.append(("q", s[self.i + 1:end]))
                self.i = end + 1
            elif c == '"':
                self._dquote(parts)
            elif c == "$":
                self._dollar(parts)
            elif c == "`":
                self._backtick(parts)
            else:
                parts.append(("lit", c))
                self.i += 1
        return Word(_merge(parts), s[start:self.i])

    def _dquote(self, parts: list):
        s = self.s
        self.i += 1
        while True:
            if self.i >= len(s):
                raise ShellParseError("unterminated double quote")
            c = s[self.i]
            if c == '"':
                self.i += 1
                return
            if c == "\\" and self.i + 1 < len(s) and s[self.i + 1] in '$`"\\\n':
                if s[self.i + 1] != "\n":
                    parts.append(("q", s[self.i + 1]))
                self.i += 2
            elif c == "$":
                self._dollar(parts, quoted=True)
            elif c == "`":
                self._backtick(parts)
            else:
                parts.append(("q", c))
                self.i += 1

    def _dollar(self, parts: list, quoted: bool = False):
        s, i = self.s, self.i
        nxt = s[i + 1] if i + 1 < len(s) else ""
        if nxt == "(":                                     # $(cmd) and $((arith))
            end = self._match_paren(i + 1)
            inner = s[i + 2:end]
            if inner.startswith("(") and inner.endswith(")"):
                inner = inner[1:-1]
            self.subs.append(inner)
            parts.append(("sub", inner))
            self.i = end + 1
        elif nxt == "{":
            end = self._match_brace(i + 1)
            inner = s[i + 2:end]
            m = re.match(r"[#!]?([A-Za-z_][A-Za-z0-9_]*|\d+|[@*#?$!-])", inner)
            name = m.group(1) if m else ""
            kind = "qvar" if quoted else "var"
            if m and m.end() < len(inner):
                self.subs.append(inner[m.end():])          # ${X:-$(cmd)} runs cmd
                parts.append((kind, name + "?"))           # modifiers: value only if X is known
            else:
                parts.append((kind, name))
            self.i = end + 1
        elif nxt == "'" and not quoted:
            self.i += 2
            parts.append(("q", self._ansi_c()))
        elif nxt == '"' and not quoted:
            self.i += 1
            self._dquote(parts)
        else:
            m = re.match(r"[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-]", s[i + 1:])
            if m:
                parts.append(("qvar" if quoted else "var", m.group(0)))
                self.i = i + 1 + m.end()
            else:
                parts.append(("q" if quoted else "lit", "$"))
                self.i += 1

    def _ansi_c(self) -> str:
        s, out = self.s, []
        while self.i < len(s) and s[self.i] != "'":
            c = s[self.i]
            if c == "\\" and self.i + 1 < len(s):
                e = s[self.i + 1]
                m = re.match(r"x([0-9a-fA-F]{1,2})|([0-7]{1,3})", s[self.i + 1:])
                if e in _ANSI_ESCAPES:
                    out.append(_ANSI_ESCAPES[e])
                    self.i += 2
                elif m:
                    out.append(chr(int(m.group(1), 16) if m.group(1) else int(m.group(2), 8)))
                    self.i += 1 + m.end()
                else:
                    out.append(c + e)
                    self.i += 2
            else:
                out.append(c)
                self.i += 1
        if self.i >= len(s):
            raise ShellParseError("unterminated $'...' string")
        self.i += 1
        return "".join(out)

    def _backtick(self, parts: list):
        s = self.s
        j = self.i + 1
        while j < len(s) and s[j] != "`":
            j += 2 if s[j] == "\\" else 1
        if j >= len(s):
            raise ShellParseError("unterminated backtick")
        inner = re.sub(r"\\([`$\\])", r"\1", s[self.i + 1:j])
        self.subs.append(inner)
        parts.append(("sub", inner))
        self.i = j + 1

    def _match_paren(self, i: int) -> int:
        return self._match(i, "(", ")")

    def _match_brace(self, i: int) -> int:
        return self._match(i, "{", "}")

    def _match(self, i: int, open_: str, close: str) -> int:
        """Index of the bracket closing s[i], skipping quoted text."""
        s, depth = self.s, 0
        while i < len(s):
            c = s[i]
            if c == "\\":
                i += 2
                continue
            if c == "'":
                end = s.find("'", i + 1)
                if end < 0:
                    break
                i = end + 1
                continue
            if c == '"':
                i += 1
                while i < len(s) and s[i] != '"':
                    i += 2 if s[i] == "\\" else 1
                i += 1
                continue
            if c == open_:
                depth += 1
            elif c == close:
                depth -= 1
                if depth == 0:
                    return i
            i += 1
        raise ShellParseError(f"unbalanced {open_!r}")


def _merge(parts: list) -> list:
    out: list = []
    for kind, text in parts:
        if out and out[-1][0] == kind and kind in ("lit", "q"):
            out[-1] = (kind, out[-1][1] + text)
        else:
            out.append((kind, text))
    return out


def _plain(word: Word) -> str:
    """The word's text with quotes removed and expansions left as written (for delimiters, fds)."""
    return "".join(t if k in ("lit", "q") else "$" + t for k, t in word.parts)


_KEYWORDS = {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "{", "}",
             "time", "function", "esac", "in", "[[", "]]"}
_HEADER_KEYWORDS = {"for", "select", "case"}   # the rest of such a "command" is a header, not a command


def parse(text: str) -> tuple[list[Command], list[str], bool]:
    """Commands in order (pipelines linked through pipe_from), the substitutions to analyse, and
    whether the text is not really shell: `word(args)` is a bash syntax error but a function call in
    Python, JavaScript, ... (Codex's exec_command can run its text with another `shell`)."""
    tokens, subs = _Lexer(text).lex()
    commands: list[Command] = []
    cur = Command()
    not_shell = False
    for k, tok in enumerate(tokens):
        if isinstance(tok, Op) and tok.op == "(" and cur.words:
            nxt = tokens[k + 1] if k + 1 < len(tokens) else None
            function_def = isinstance(nxt, Op) and nxt.op == ")"                     # f() { ...; }
            array = _plain(cur.words[-1]).endswith("=")                               # a=(1 2)
            not_shell = not_shell or not (function_def or array)
        if isinstance(tok, Word):
            cur.words.append(tok)
        elif isinstance(tok, Redir):
            cur.redirs.append(tok)
        else:
            if cur.words or cur.redirs:
                commands.append(cur)
            nxt = Command()
            if tok.op in ("|", "|&") and (cur.words or cur.redirs):
                nxt.pipe_from = cur
            cur = nxt
    if cur.words or cur.redirs:
        commands.append(cur)
    return commands, subs, not_shell


# --------------------------------------------------------------------------- expansion

@dataclass(frozen=True)
class Arg:
    """One expanded argument. kind: 'static' (exact), 'glob' (unquoted wildcards; text is a glob
    pattern with quoted parts escaped) or 'dynamic' (text is an fnmatch pattern, '*' where a value
    is unknown until run time)."""
    text: str
    kind: str = "static"
    src: str = ""              # the word as written (for messages about dynamic values)

    def derive(self, text: str) -> "Arg":
        return Arg(text, self.kind)

    @property
    def shown(self) -> str:
        return self.src or self.text


_GLOB_CHARS = re.compile(r"[*?\[]")
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\+?=")


def _brace_expand(s: str, limit: int = 64) -> list[str]:
    """bash {a,b} and {1..3} on an unquoted fragment (enough for paths; capped)."""
    depth, start = 0, -1
    for i, c in enumerate(s):
        if c == "{":
            if depth == 0:
                start = i
            depth += 1
        elif c == "}" and depth:
            depth -= 1
            if depth == 0:
                inner, pre, post = s[start + 1:i], s[:start], s[i + 1:]
                alts = _split_top(inner)
                if len(alts) == 1:
                    m = re.fullmatch(r"(-?\d+)\.\.(-?\d+)|([A-Za-z])\.\.([A-Za-z])", inner)
                    if not m:
                        return [pre + "{" + inner + "}" + x for x in _brace_expand(post, limit)]
                    if m.group(1) is not None:
                        a, b = int(m.group(1)), int(m.group(2))
                        step = 1 if b >= a else -1
                        alts = [str(v) for v in range(a, b + step, step)[:limit]]
                    else:
                        a, b = ord(m.group(3)), ord(m.group(4))
                        step = 1 if b >= a else -1
                        alts = [chr(v) for v in range(a, b + step, step)[:limit]]
                out = []
                for alt in alts:
                    for tail in _brace_expand(alt + post, limit):
                        out.append(pre + tail)
                        if len(out) >= limit:
                            return out
                return out
    return [s]


def _split_top(s: str) -> list[str]:
    out, depth, cur = [], 0, []
    for c in s:
        if c == "," and depth == 0:
            out.append("".join(cur))
            cur = []
            continue
        depth += c == "{"
        depth -= c == "}"
        cur.append(c)
    out.append("".join(cur))
    return out


# --------------------------------------------------------------------------- option parsing

def parse_opts(args: list, short_val: str = "", long_val: tuple = (), first_positional_stops: bool = False):
    """GNU-style options: ([(name, Arg|None)], [positional Args]). '--' ends options."""
    opts: list = []
    pos: list = []
    i = 0
    while i < len(args):
        a = args[i]
        t = a.text
        if t == "--":
            pos.extend(args[i + 1:])
            break
        if t.startswith("--") and len(t) > 2:
            name, eq, val = t.partition("=")
            if eq:
                opts.append((name, a.derive(val)))
            elif name in long_val and i + 1 < len(args):
                opts.append((name, args[i + 1]))
                i += 1
            else:
                opts.append((name, None))
        elif t.startswith("-") and len(t) > 1:
            for j in range(1, len(t)):
                ch = t[j]
                if ch in short_val:
                    if t[j + 1:]:
                        opts.append(("-" + ch, a.derive(t[j + 1:])))
                    elif i + 1 < len(args):
                        opts.append(("-" + ch, args[i + 1]))
                        i += 1
                    else:
                        opts.append(("-" + ch, None))
                    break
                opts.append(("-" + ch, None))
        else:
            pos.append(a)
            if first_positional_stops:
                pos.extend(args[i + 1:])
                break
        i += 1
    return opts, pos


def _has(opts, *names) -> bool:
    return any(n in names for n, _ in opts)


def _vals(opts, *names) -> list:
    return [v for n, v in opts if n in names and v is not None]


# --------------------------------------------------------------------------- analyser

_PY = re.compile(r"python[0-9.]*[dmu]?|pypy[0-9.]*")
_STDIN_PATHS = {"/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"}
_SHELLS = {"sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "fish", "busybox-sh"}
_AWKS = {"awk", "gawk", "mawk", "nawk"}
# Commands that only look at names / metadata: naming a hidden file is fine for them.
_METADATA = {"ls", "stat", "du", "test", "[", "[[", "realpath", "readlink", "basename", "dirname",
             "cd", "pushd", "popd", "export", "true", "false", ":", "which", "type", "command"}
_EDITORS = {"vi", "vim", "nvim", "view", "nano", "emacs", "ed", "ex", "pico", "micro", "joe", "kak", "hx"}
_COMPRESSORS = {"gzip", "gunzip", "bzip2", "bunzip2", "xz", "unxz", "zstd", "unzstd", "lz4", "lzma",
                "compress", "uncompress"}
_READONLY_GIT = {
    "status", "diff", "log", "show", "blame", "annotate", "grep", "ls-files", "ls-tree", "cat-file",
    "rev-parse", "rev-list", "describe", "shortlog", "merge-base", "name-rev", "show-ref",
    "for-each-ref", "whatchanged", "diff-tree", "diff-files", "diff-index", "count-objects", "fsck",
    "check-ignore", "check-attr", "var", "cherry", "range-diff", "show-branch", "verify-commit",
    "verify-tag", "help", "version", "difftool", "format-patch", "archive", "ls-remote",
}
_GIT_SAFE_CONFIG = re.compile(r"(color\.|core\.quotepath|core\.abbrev|log\.|i18n\.|advice\.|column\.)", re.I)
_FIND_EXPR_STARTS = ("-", "(", "!", ")")

GIT_REASON = ("git {sub} changes the loop's git state. The loop owns git: run_experiment commits "
              "train.py, score keeps or resets the branch, and the revert tool restores train.py. "
              "Read-only git (status, diff, log, show) is fine.")


class ShellGuard:
    """Walks one shell string and raises Denied on the first effect the policy forbids."""

    def __init__(self, policy, cwd: str, depth: int = 0, variables: Optional[dict] = None,
                 written: Optional[dict] = None, aliases: Optional[dict] = None):
        self.policy = policy
        self.cwd = cwd
        self.depth = depth
        self.vars = dict(variables) if variables is not None else _initial_vars(cwd)
        self.written = written if written is not None else {}   # path -> text written earlier in this command
        self.aliases = aliases if aliases is not None else {}   # alias name -> replacement text

    # -- entry points

    def check(self, text: str) -> Optional[str]:
        """None if the command may run, else the reason it may not."""
        try:
            self.run(text)
        except Denied as d:
            return str(d)
        return None

    def run(self, text: str):
        if self.depth > MAX_DEPTH:
            raise Denied("the command nests shells or substitutions too deeply for the guard to "
                         "check; run the steps as separate, plain commands.")
        try:
            commands, subs, not_shell = parse(text)
        except ShellParseError as e:
            self._unparsable(text, e)
            return
        if not_shell:
            problem = self.policy.script_problem(text, "script", any_state_reference=False)
            if problem:
                raise Denied(f"this command is not valid shell (it may run under another interpreter): {problem}")
        for sub in subs:
            self._child().run(sub)
        for cmd in commands:
            self._command(cmd)

    def _child(self, cwd: Optional[str] = None) -> "ShellGuard":
        return ShellGuard(self.policy, cwd or self.cwd, self.depth + 1, self.vars, self.written, self.aliases)

    def _unparsable(self, text: str, err: Exception):
        # bash would reject it too; refuse only if it names something protected.
        what = self.policy.mentions(text)
        if what:
            raise Denied(f"the guard could not parse this command ({err}) and it names {what}; "
                         "write it as plain shell without protected paths.")

    # -- one simple command

    def _command(self, cmd: Command):
        words = list(cmd.words)
        assigns = []
        while words and _is_assignment(words[0]):
            assigns.append(words.pop(0))
        words = self._strip_keywords(words)
        env = {}
        for w in assigns:
            name, value = self._assignment(w)
            env[name] = value
        args = [a for w in words for a in self._expand(w)]
        if not args:
            self.vars.update(env)                  # plain X=... statement
        stdin = self._stdin_text(cmd)
        for red in cmd.redirs:
            self._redirect(red, args, stdin)
        if args:
            self._dispatch(args, stdin, env)

    def _strip_keywords(self, words: list) -> list:
        while words:
            first = _literal(words[0])
            if first in _HEADER_KEYWORDS:
                if first in ("for", "select") and len(words) > 1:
                    self.vars[_plain(words[1])] = None     # loop variable: unknown
                return []
            if first not in _KEYWORDS:
                break
            words = words[1:]
        return words

    def _assignment(self, word: Word):
        first_kind, first_text = word.parts[0]
        m = _ASSIGN.match(first_text)
        rest = [(first_kind, first_text[m.end():])] + word.parts[1:]
        args = self._expand(Word(rest), split=False)
        value = args[0].text if args and args[0].kind == "static" else None
        return m.group(1), value

    def _expand(self, word: Word, split: bool = True) -> list:
        """Quote removal, ~, variables (an unquoted $X is split on IFS, as bash does), brace
        expansion and glob marking. Returns one Arg per resulting word."""
        fields: list = [[]]      # each field: [(text, kind)] with kind lit / q / dyn
        for idx, (kind, text) in enumerate(word.parts):
            if kind == "lit" and idx == 0 and text.startswith("~"):
                head, sep, tail = text.partition("/")
                home = os.path.expanduser(head)
                if home != head:
                    fields[-1].append((home, "q"))
                    text = sep + tail
            if kind in ("lit", "q"):
                fields[-1].append((text, kind))
            elif kind in ("var", "qvar"):
                value = self.vars.get(text.rstrip("?"))
                if value is None:
                    fields[-1].append(("*", "dyn"))
                elif kind == "var" and split:
                    chunks = self._ifs_split(value)
                    fields[-1].append((chunks[0], "q"))
                    fields.extend([(c, "q")] for c in chunks[1:])
                else:
                    fields[-1].append((value, "q"))
            else:
                fields[-1].append(("*", "dyn"))
        args = []
        for pieces in fields:
            if not pieces or (len(fields) > 1 and not "".join(t for t, _ in pieces)):
                continue                                   # empty fields from splitting vanish
            variants = [[]]
            for text, kind in pieces:
                if kind == "lit" and "{" in text and split:
                    alts = _brace_expand(text)
                    variants = [v + [(alt, kind)] for v in variants for alt in alts][:64]
                else:
                    variants = [v + [(text, kind)] for v in variants]
            args.extend(self._arg(v, word.src) for v in variants)
        return args or [Arg("")]

    def _ifs_split(self, value: str) -> list:
        ifs = self.vars.get("IFS")
        ifs = " \t\n" if ifs is None else ifs
        if not ifs:
            return [value]
        return re.split("[" + re.escape(ifs) + "]+", value)

    @staticmethod
    def _arg(pieces: list, src: str) -> Arg:
        if any(k == "dyn" for _, k in pieces):
            return Arg("".join(t if k == "dyn" else _fn_escape(t) for t, k in pieces), "dynamic", src)
        if any(k == "lit" and _GLOB_CHARS.search(t) for t, k in pieces):
            return Arg("".join(t if k == "lit" else _glob.escape(t) for t, k in pieces), "glob")
        return Arg("".join(t for t, _ in pieces))

    # -- stdin and redirections

    def _stdin_text(self, cmd: Command) -> Optional[str]:
        """The text a command reads on stdin when it is knowable: heredoc, herestring, < file, or
        the output of echo/printf/cat earlier in the pipe."""
        for red in reversed(cmd.redirs):
            if red.op in ("<<", "<<-"):
                return red.text
            if red.op == "<<<":
                arg = self._expand(red.target, split=False)[0]
                return arg.text + "\n"
            if red.op == "<":
                arg = self._expand(red.target, split=False)[0]
                return self._file_text(arg) if arg.kind == "static" else None
        src = cmd.pipe_from
        if src is None:
            return None
        args = [a for w in self._strip_keywords(list(src.words)) for a in self._expand(w)]
        if not args:
            return None
        name = os.path.basename(args[0].text)
        if name in ("echo", "printf"):
            return " ".join(a.text for a in args[1:] if not (name == "echo" and a.text in ("-e", "-n", "-E")))
        if name == "cat":
            files = [a for a in args[1:] if not a.text.startswith("-")]
            if not files:
                return self._stdin_text(src)
            texts = [self._file_text(a) for a in files]
            return None if any(t is None for t in texts) else "".join(texts)
        return None

    def _file_text(self, arg: Arg) -> Optional[str]:
        path = self._abs(arg.text)
        if path in self.written:
            return self.written[path]
        try:
            if os.path.isfile(path) and os.path.getsize(path) <= MAX_SCRIPT_BYTES:
                with open(path, encoding="utf-8", errors="replace") as f:
                    return f.read()
        except OSError:
            pass
        return None

    def _redirect(self, red: Redir, args: list, stdin: Optional[str]):
        if red.target is None or red.op in ("<<", "<<-", "<<<"):
            return
        target = self._expand(red.target, split=False)[0]
        if red.op == "<":
            self.read(target)
            return
        self.write(target, f"the redirection '{red.op} {target.shown}'")
        if red.op == "<>":
            self.read(target)
        # remember what simple writers put in a file, for a later `python that-file`
        name = os.path.basename(args[0].text) if args else ""
        if target.kind == "static" and red.op in (">", ">|", "&>"):
            if name == "cat" and len(args) == 1 and stdin is not None:
                self.written[self._abs(target.text)] = stdin
            elif name in ("echo", "printf"):
                self.written[self._abs(target.text)] = " ".join(a.text for a in args[1:])

    # -- effects checked against the policy

    def _abs(self, text: str) -> str:
        return os.path.normpath(os.path.join(self.cwd, os.path.expanduser(text)))

    def _concrete(self, arg: Arg) -> list[str]:
        if arg.kind == "static":
            return [arg.text]
        if arg.kind == "glob":
            matches = list(islice(_glob.iglob(self._abs(arg.text)), MAX_GLOB_MATCHES + 1))
            return matches or [arg.text]
        return []

    def _too_wide(self, arg: Arg) -> bool:
        """A glob with more matches than we list: check it like a run-time value instead."""
        return arg.kind == "glob" and len(self._concrete(arg)) > MAX_GLOB_MATCHES

    def write(self, arg: Arg, how: str, recursive: bool = False, strict: bool = False):
        for path in self._concrete(arg):
            problem = self.policy.write_problem(path, self.cwd, strict=strict)
            if problem is None and (recursive or os.path.isdir(self._abs(path))):
                problem = self.policy.covers_problem(path, self.cwd)
            if problem:
                raise Denied(f"{how} would modify a protected path: {problem}")
        if arg.kind == "dynamic" or self._too_wide(arg):
            hit = self.policy.pattern_hits(arg.text, self.cwd, covers=recursive)
            if hit:
                raise Denied(f"{how}: the guard cannot resolve {arg.shown} before the command runs, and it "
                             f"could be {hit}. Use a literal path outside the protected files.")

    def read(self, arg: Arg, recursive: bool = False):
        for path in self._concrete(arg):
            problem = self.policy.read_problem(path, self.cwd)
            if problem is None and recursive:
                problem = self.policy.covers_hidden_problem(path, self.cwd)
            if problem:
                raise Denied(problem)
        if recursive and arg.kind == "dynamic":
            hit = self.policy.pattern_hits(arg.text, self.cwd, covers=True, hidden_only=True)
            if hit:
                raise Denied(f"copying {arg.shown} could include {hit}, which is hidden from the agent; "
                             "copy the specific files you need.")

    def delete(self, arg: Arg, how: str, recursive: bool = False):
        self.write(arg, how, recursive=recursive)

    def mention(self, arg: Arg):
        problem = self.policy.hidden_mention(arg.text)
        if problem:
            raise Denied(problem)

    def script(self, text: Optional[str], lang: str, origin: str):
        if text is None:
            return
        problem = self.policy.script_problem(text, lang)
        if problem:
            raise Denied(f"{origin}: {problem}")

    def code_on_stdin(self, stdin: Optional[str], lang: str, name: str):
        """A shell or interpreter reading its program from stdin. Unknown stdin (a terminal, or a
        pipe from a program) is refused: Codex does not run PreToolUse for write_stdin, so an
        interactive shell would take commands the guard never sees."""
        if stdin is None:
            raise Denied(f"{name} started without a script reads its commands from a terminal or a pipe the "
                         f"guard cannot see; run the command itself, or pass the code with -c or a heredoc.")
        if lang == "sh":
            self.shell_text(stdin)
        else:
            self.script(stdin, lang, f"the {lang} code on stdin")

    def shell_text(self, text: Optional[str], cwd: Optional[str] = None):
        if text is not None:
            self._child(cwd).run(text)

    # -- dispatch

    def _dispatch(self, args: list, stdin: Optional[str], env: dict):
        is_cd = _literal_text(args[0]) in ("cd", "pushd")
        saved_cwd = self.cwd          # env -C, git -C: the directory changes for one command only
        try:
            unwrapped = self._unwrap(args, stdin, env)
            if unwrapped is None:
                return
            name, args = unwrapped
            if name not in _METADATA:
                for a in args[1:]:
                    self.mention(a)
                    self._generic_read(a)
            handler = _HANDLERS.get(name)
            if handler is not None:
                handler(self, args, stdin, env)
        finally:
            if not is_cd:
                self.cwd = saved_cwd

    def _generic_read(self, arg: Arg):
        text = arg.text
        if text.startswith("-") and "=" in text:
            arg = arg.derive(text.partition("=")[2])
        elif re.match(r"^(if|of)=", text):
            arg = arg.derive(text[3:])
        elif text.startswith("-"):
            return
        self.read(arg)

    def _unwrap(self, args: list, stdin: Optional[str], env: dict):
        """Peel sudo/env/nice/timeout/xargs/... and return (command name, argv) or None when the
        wrapped command has been handled (e.g. as a shell string)."""
        while args:
            head = args[0]
            if head.kind != "static":
                self._dynamic_command(args)
                return None
            if head.text in self.aliases:             # Claude Code's shell may expand aliases
                alias = self.aliases.pop(head.text)   # not inside its own expansion: `alias ls='ls -la'`
                try:
                    self.shell_text(alias + " " + " ".join(shlex.quote(a.text) for a in args[1:]))
                finally:
                    self.aliases[head.text] = alias
                return None
            name = _normalize(os.path.basename(head.text))
            wrapper = _WRAPPERS.get(name)
            if wrapper is None:
                return name, args
            args = wrapper(self, args, stdin, env)
        return None

    def _dynamic_command(self, args: list):
        # `$CMD prepare.py`: we cannot know what runs, so refuse if it names a protected path.
        for a in args[1:]:
            for path in self._concrete(a):
                problem = self.policy.write_problem(path, self.cwd)
                if problem:
                    raise Denied(f"the command name {args[0].text!r} is not known before it runs and it is "
                                 f"given a protected path: {problem}")

    # -- interpreters

    def _python(self, args: list, stdin: Optional[str]):
        opts, pos = parse_opts(args[1:], short_val="cmWXQ", first_positional_stops=True)
        code = _vals(opts, "-c")
        if code:
            self.script(code[0].text, "python", "python -c")
            return
        if _has(opts, "-m"):
            module = _vals(opts, "-m")
            if module and module[0].text.split(".")[0] == "mcp_server":
                _loopwright_cli(module[0].text, pos)
            return
        if not pos or pos[0].text == "-":
            self.code_on_stdin(stdin, "python", "python")
            return
        self._script_file(pos[0], pos[1:], "python", stdin)

    def _script_file(self, path_arg: Arg, rest: list, lang: str, stdin: Optional[str] = None):
        """An interpreter running a file: look inside it unless it is the editable file."""
        if path_arg.kind != "static":
            return
        if path_arg.text in _STDIN_PATHS:
            text = stdin
        elif self.policy.is_editable(path_arg.text, self.cwd):
            return        # train.py runs under the loop anyway; the manifest check covers what it does
        else:
            frozen = self.policy.frozen_script_problem(path_arg.text, self.cwd, [a.text for a in rest])
            if frozen:
                raise Denied(frozen)
            if self.policy.write_problem(path_arg.text, self.cwd) is not None:
                return    # another frozen file run as a script; nothing the agent wrote
            text = self._file_text(path_arg)
        if lang == "sh":
            self.shell_text(text)
        else:
            self.script(text, lang, f"the script {path_arg.text}")

# --------------------------------------------------------------------------- helpers

def _initial_vars(cwd: str) -> dict:
    return {"HOME": os.path.expanduser("~"), "PWD": cwd, "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
            "USER": os.environ.get("USER", "")}


def _is_assignment(word: Word) -> bool:
    return bool(word.parts) and word.parts[0][0] == "lit" and bool(_ASSIGN.match(word.parts[0][1]))


def _literal(word: Word) -> Optional[str]:
    if len(word.parts) == 1 and word.parts[0][0] == "lit":
        return word.parts[0][1]
    return None


def _literal_text(arg: Arg) -> str:
    return os.path.basename(arg.text) if arg.kind == "static" else ""


def _fn_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def _normalize(name: str) -> str:
    if _PY.fullmatch(name):
        return "python"
    if re.fullmatch(r"perl[0-9.]*", name):
        return "perl"
    if name in ("nodejs", "node"):
        return "node"
    if name in _AWKS:
        return "awk"
    if name in _SHELLS:
        return "sh"
    return name


def _opt_index(args: list, with_value: set, start: int = 1) -> int:
    """Index of the first non-option argument (wrapped command) after simple options."""
    i = start
    while i < len(args):
        t = args[i].text
        if t == "--":
            return i + 1
        if not t.startswith("-") or t == "-":
            return i
        if t in with_value:
            i += 1
        i += 1
    return i


# --------------------------------------------------------------------------- wrappers
# Each returns the wrapped argv (possibly empty when it handled everything itself).

def _w_skip(with_value: set, fixed: int = 0):
    def wrap(g: ShellGuard, args, stdin, env):
        i = _opt_index(args, with_value) + fixed
        return args[i:]
    return wrap


def _w_sudo(g: ShellGuard, args, stdin, env):
    i = _opt_index(args, {"-u", "-g", "-C", "-p", "-r", "-t", "-U", "-h", "-D", "-R", "-T"})
    flags = {a.text for a in args[1:i]}
    if i >= len(args) and ("-s" in flags or "-i" in flags):
        g.code_on_stdin(stdin, "sh", "sudo -s")
    return args[i:]


def _w_env(g: ShellGuard, args, stdin, env):
    i = 1
    while i < len(args):
        t = args[i].text
        if t in ("-u", "--unset") and i + 1 < len(args):
            i += 2
        elif t in ("-C", "--chdir") and i + 1 < len(args):
            g.cwd = g._abs(args[i + 1].text)
            i += 2
        elif t.startswith("--chdir="):
            g.cwd = g._abs(t.partition("=")[2])
            i += 1
        elif t in ("-S", "--split-string") and i + 1 < len(args):
            g.shell_text(args[i + 1].text + " " + " ".join(shlex.quote(a.text) for a in args[i + 2:]))
            return []
        elif t.startswith("-") and t != "-":
            i += 1
        elif _ASSIGN.match(t):
            env[_ASSIGN.match(t).group(1)] = t.partition("=")[2]
            i += 1
        else:
            break
    return args[i:]


def _w_command(g: ShellGuard, args, stdin, env):
    if any(a.text in ("-v", "-V") for a in args[1:2]):
        return []                     # lookup only
    return args[_opt_index(args, set()):]


def _w_exec(g: ShellGuard, args, stdin, env):
    return args[_opt_index(args, {"-a"}):]


def _w_timeout(g: ShellGuard, args, stdin, env):
    i = _opt_index(args, {"-s", "-k", "--signal", "--kill-after"})
    return args[i + 1:]               # skip DURATION


def _w_time(g: ShellGuard, args, stdin, env):
    i = 1
    while i < len(args) and args[i].text.startswith("-"):
        if args[i].text in ("-o", "--output") and i + 1 < len(args):
            g.write(args[i + 1], "time -o")
            i += 1
        elif args[i].text in ("-f", "--format"):
            i += 1
        i += 1
    return args[i:]


def _w_run(g: ShellGuard, args, stdin, env):
    """uv run / poetry run / pipenv run / pdm run / hatch run / conda run: the command follows."""
    if len(args) < 2 or args[1].text != "run":
        return []
    i = _opt_index(args, {"--with", "--python", "-p", "--project", "--directory", "-n", "--name",
                          "--prefix", "--env", "-e", "--extra", "--group", "--env-file"}, start=2)
    rest = args[i:]
    if rest and rest[0].kind == "static" and rest[0].text.endswith(".py"):
        rest = [Arg("python")] + rest             # `uv run train.py`
    return rest


def _w_dash_c(g: ShellGuard, args, stdin, env):
    """su / runuser / script: `-c STRING` is run by a shell; without it nothing we can see runs."""
    for i, a in enumerate(args[1:-1], 1):
        if a.text in ("-c", "--command"):
            g.shell_text(args[i + 1].text)
    return []


def _w_watch(g: ShellGuard, args, stdin, env):
    rest = args[_opt_index(args, {"-n", "--interval", "-d", "--differences"}):]
    g.shell_text(" ".join(a.text for a in rest))      # watch runs its arguments through sh -c
    return []


def _w_flock(g: ShellGuard, args, stdin, env):
    for i, a in enumerate(args[1:-1], 1):
        if a.text in ("-c", "--command"):
            g.shell_text(args[i + 1].text)
            return []
    return args[_opt_index(args, {"-w", "--timeout", "-E", "--conflict-exit-code"}) + 1:]   # skip the lock file


def _w_xargs(g: ShellGuard, args, stdin, env):
    """xargs CMD...: CMD gets extra arguments we cannot see; model them as one unknown path."""
    opts, pos = parse_opts(args[1:], short_val="IadELnPsS", first_positional_stops=True)
    repl = _vals(opts, "-I", "--replace")
    if not pos:
        return []
    if repl:
        return [Arg(a.text.replace(repl[0].text, "*"), "dynamic", f"{a.shown} (from xargs)")
                if repl[0].text in a.text else a for a in pos]
    return pos + [Arg("*", "dynamic", "the arguments xargs reads from stdin")]


def _w_strace(g: ShellGuard, args, stdin, env):
    i = 1
    while i < len(args) and args[i].text.startswith("-"):
        if args[i].text == "-o" and i + 1 < len(args):
            g.write(args[i + 1], "strace -o")
            i += 1
        elif args[i].text in ("-e", "-p", "-s", "-u", "-E", "-P", "-I", "-a", "-b", "-X"):
            i += 1
        i += 1
    return args[i:]


_WRAPPERS: dict[str, Callable] = {
    "sudo": _w_sudo, "doas": _w_sudo, "env": _w_env, "command": _w_command, "builtin": _w_skip(set()),
    "exec": _w_exec, "nohup": _w_skip(set()), "nice": _w_skip({"-n", "--adjustment"}),
    "ionice": _w_skip({"-c", "-n", "-p", "-t"}), "setsid": _w_skip(set()), "unbuffer": _w_skip(set()),
    "stdbuf": _w_skip({"-i", "-o", "-e"}), "chrt": _w_skip(set(), fixed=1),
    "taskset": _w_skip(set(), fixed=1), "timeout": _w_timeout, "time": _w_time,
    "caffeinate": _w_skip({"-t", "-w"}), "busybox": _w_skip(set()), "chroot": _w_skip(set(), fixed=1),
    "uv": _w_run, "poetry": _w_run, "pipenv": _w_run, "pdm": _w_run, "hatch": _w_run,
    "conda": _w_run, "mamba": _w_run, "micromamba": _w_run,
    "watch": _w_watch, "flock": _w_flock,
    "su": _w_dash_c, "runuser": _w_dash_c, "script": _w_dash_c,
    "xargs": _w_xargs, "strace": _w_strace, "ltrace": _w_strace, "valgrind": _w_skip(set()),
}


# --------------------------------------------------------------------------- handlers
# Each receives (guard, argv, stdin text or None, env) and raises Denied on a forbidden effect.

def _h_cd(g: ShellGuard, args, stdin, env):
    pos = [a for a in args[1:] if not a.text.startswith("-")]
    if not pos:
        g.cwd = os.path.expanduser("~")
    elif pos[0].kind == "static":
        g.cwd = g._abs(pos[0].text)


def _h_export(g: ShellGuard, args, stdin, env):
    for a in args[1:]:
        m = _ASSIGN.match(a.text)
        if m:
            g.vars[m.group(1)] = a.text.partition("=")[2] if a.kind == "static" else None


def _h_delete(g: ShellGuard, args, stdin, env):
    opts, pos = parse_opts(args[1:])
    recursive = _has(opts, "-r", "-R", "--recursive")
    for a in pos:
        g.delete(a, f"{_literal_text(args[0])} {a.shown}", recursive=recursive)


def _h_writes_all(short_val: str = "", long_val: tuple = ()):
    def handler(g: ShellGuard, args, stdin, env):
        opts, pos = parse_opts(args[1:], short_val=short_val, long_val=long_val)
        for a in pos:
            g.write(a, f"{_literal_text(args[0])} {a.shown}")
    return handler


def _h_chmod(g: ShellGuard, args, stdin, env):
    name = _literal_text(args[0])
    rest = args[1:]
    recursive = any(a.text in ("-R", "--recursive") for a in rest)
    flags = {"-R", "--recursive", "-v", "-c", "-f", "--verbose", "--changes", "--silent", "--quiet",
             "-h", "--no-dereference", "-H", "-L", "-P", "--preserve-root", "--no-preserve-root"}
    pos = [a for a in rest if a.text not in flags and not a.text.startswith("--")]
    has_ref = any(a.text.startswith("--reference") for a in rest)
    targets = pos if has_ref else pos[1:]          # first positional is the mode / owner
    for a in targets:
        g.write(a, f"{name} {a.shown}", recursive=recursive)


def _h_copy(move: bool):
    def handler(g: ShellGuard, args, stdin, env):
        name = _literal_text(args[0])
        opts, pos = parse_opts(args[1:], short_val="tSmog" if name == "install" else "tS",
                               long_val=("--target-directory", "--suffix", "--mode", "--owner", "--group"))
        recursive = move or _has(opts, "-r", "-R", "-a", "--recursive", "--archive")
        tdir = _vals(opts, "-t", "--target-directory")
        if name == "install" and _has(opts, "-d", "--directory"):
            for a in pos:
                g.write(a, f"install -d {a.shown}")
            return
        if tdir:
            dest, sources, into_dir = tdir[0], pos, True
        elif len(pos) >= 2:
            dest, sources = pos[-1], pos[:-1]
            into_dir = len(sources) > 1 or (dest.kind == "static" and os.path.isdir(g._abs(dest.text)))
            into_dir = into_dir and not _has(opts, "-T", "--no-target-directory")
        else:
            return
        for src in sources:
            if move:
                g.delete(src, f"{name} {src.shown}", recursive=True)
            else:
                g.read(src, recursive=recursive)
            if into_dir:
                base = os.path.basename(src.text.rstrip("/")) or "."
                g.write(dest.derive(os.path.join(dest.text, base)), f"{name} into {dest.shown}",
                        recursive=recursive)
        if not into_dir:
            g.write(dest, f"{name} onto {dest.shown}", recursive=recursive)
    return handler


def _h_ln(g: ShellGuard, args, stdin, env):
    # Both ends count: a link (hard or symbolic) to a frozen file is a way to write it later.
    opts, pos = parse_opts(args[1:], short_val="tS", long_val=("--target-directory", "--suffix"))
    tdir = _vals(opts, "-t", "--target-directory")
    for a in pos + tdir:
        g.write(a, f"ln {a.shown} (a link to a protected file is a way to write it)")
    if len(pos) == 1 and not tdir:
        g.write(pos[0].derive(os.path.basename(pos[0].text)), "ln into the current directory")


def _h_rsync(g: ShellGuard, args, stdin, env):
    opts, pos = parse_opts(args[1:], short_val="efT", long_val=("--exclude", "--include", "--filter",
                                                               "--temp-dir", "--backup-dir", "--rsh"))
    if len(pos) < 2:
        return
    for src in pos[:-1]:
        if ":" not in src.text:
            g.read(src, recursive=True)
    dest = pos[-1]
    if ":" not in dest.text:
        g.write(dest, f"rsync to {dest.shown}", recursive=True)


def _h_dd(g: ShellGuard, args, stdin, env):
    for a in args[1:]:
        if a.text.startswith("of="):
            g.write(a.derive(a.text[3:]), "dd of=")


def _h_tee(g: ShellGuard, args, stdin, env):
    opts, pos = parse_opts(args[1:])
    for a in pos:
        g.write(a, f"tee {a.shown}")
        if a.kind == "static" and stdin is not None:
            g.written[g._abs(a.text)] = stdin


def _h_truncate(g: ShellGuard, args, stdin, env):
    opts, pos = parse_opts(args[1:], short_val="sr", long_val=("--size", "--reference"))
    for a in pos:
        g.write(a, f"truncate {a.shown}")


def _h_touch(g: ShellGuard, args, stdin, env):
    opts, pos = parse_opts(args[1:], short_val="dtr", long_val=("--date", "--reference", "--time"))
    for a in pos:
        g.write(a, f"touch {a.shown}")


def _h_sed(g: ShellGuard, args, stdin, env):
    opts, pos = parse_opts(args[1:], short_val="efl", long_val=("--expression", "--file", "--line-length"))
    scripts = [v.text for v in _vals(opts, "-e", "--expression")]
    files = pos
    if not scripts and not _vals(opts, "-f", "--file") and pos:
        scripts, files = [pos[0].text], pos[1:]
    if _sed_in_place(args[1:]):
        for a in files:
            g.write(a, f"sed -i on {a.shown}")
    for script in scripts:
        # sed's own w/W commands (and the s///w flag) write files; e runs a shell command
        for m in re.finditer(r"(?:^|[;}\n/0-9$gpIiMme])\s*[wW]\s*([^;\n}]+)", script):
            g.write(Arg(m.group(1).strip()), "sed's w command")
        for m in re.finditer(r"(?:^|[;}\n])\s*\d*\s*e\s+([^;\n}]+)", script):
            g.shell_text(m.group(1))
        if re.search(r"/[gpIiMm0-9]*e[gpIiMmw0-9]*\s*(?:$|[;}\n])", script) and g.policy.mentions(script):
            raise Denied("this sed script executes its pattern space as a shell command (s///e) and names a "
                         "protected path; use plain sed -n to read files.")


def _sed_in_place(args: list) -> bool:
    """-i, -i.bak, -ni, --in-place[=SUF]; a cluster stops at e/f/l, which take a value."""
    for a in args:
        t = a.text
        if t == "--in-place" or t.startswith("--in-place="):
            return True
        if t.startswith("-") and not t.startswith("--"):
            for ch in t[1:]:
                if ch == "i":
                    return True
                if ch in "efl":
                    break
    return False


def _perl_like(lang: str):
    """perl / ruby: -i edits files in place; -e code; otherwise the first positional is a script."""
    def handler(g: ShellGuard, args, stdin, env):
        code, in_place, i = [], False, 1
        while i < len(args):
            t = args[i].text
            if t == "--":
                i += 1
                break
            if not t.startswith("-") or t == "-":
                break
            for j, ch in enumerate(t[1:], 1):
                if ch == "i":
                    in_place = True
                    break                       # the rest of the cluster is the backup suffix
                if ch in ("eE" if lang == "perl" else "e"):
                    rest = t[j + 1:]
                    if rest:
                        code.append(rest)
                    elif i + 1 < len(args):
                        code.append(args[i + 1].text)
                        i += 1
                    break
                if ch in ("MmIdDxlC0" if lang == "perl" else "rIxCEFK"):
                    break                       # the rest of the cluster is this option's value
            i += 1
        files = args[i:]
        for c in code:
            g.script(c, lang, f"{lang} -e")
        if not code:
            if files:
                g._script_file(files[0], files[1:], lang, stdin)
                files = files[1:]
            else:
                g.code_on_stdin(stdin, lang, lang)
        if in_place:
            for a in files:
                g.write(a, f"{lang} -i on {a.shown}")
    return handler


# The loopwright CLI is the human's: the agent works through the MCP tools. These read-only
# commands show nothing hidden (no test split scores), so they stay allowed.
_AGENT_CLI = {"status", "budget", "doctor", "--help", "-h", "--version"}


def _loopwright_cli(module: str, rest: list):
    if module not in ("mcp_server.cli", "mcp_server"):
        if module == "mcp_server.guard":
            return
        raise Denied(f"python -m {module} runs loopwright internals; use the loopwright MCP tools instead")
    words, texts = [], [a.text for a in rest]
    i = 0
    while i < len(texts):
        t = texts[i]
        if t in ("-w", "--workspace"):
            i += 2                      # an option with a value
            continue
        if not t.startswith("-") or t in _AGENT_CLI:
            words.append(t)
        i += 1
    sub = words[0] if words else "--help"
    if sub not in _AGENT_CLI:
        raise Denied(f"`loopwright {sub}` is for the person running the loop (it can reveal the hidden test "
                     "split or change the campaign). Use the MCP tools: state_read, run_experiment, score, "
                     "revert, budget_check, note, suggest_next.")


def _h_loopwright(g: ShellGuard, args, stdin, env):
    _loopwright_cli("mcp_server.cli", args[1:])


def _h_python(g: ShellGuard, args, stdin, env):
    g._python(args, stdin)


def _h_node(g: ShellGuard, args, stdin, env):
    opts, pos = parse_opts(args[1:], short_val="ep", long_val=("--eval", "--print", "--require", "-r"),
                           first_positional_stops=True)
    code = _vals(opts, "-e", "-p", "--eval", "--print")
    if code:
        g.script(code[0].text, "node", "node -e")
    elif pos:
        g._script_file(pos[0], pos[1:], "node", stdin)
    else:
        g.code_on_stdin(stdin, "node", "node")


def _h_eval_code(flag: str, lang: str):
    """php -r, lua -e, Rscript -e, deno eval...: a code string after a flag."""
    def handler(g: ShellGuard, args, stdin, env):
        for i, a in enumerate(args[1:], 1):
            if a.text == flag and i + 1 < len(args):
                g.script(args[i + 1].text, lang, f"{_literal_text(args[0])} {flag}")
                return
        pos = [a for a in args[1:] if not a.text.startswith("-")]
        if pos:
            g._script_file(pos[0], pos[1:], lang, stdin)
    return handler


def _h_awk(g: ShellGuard, args, stdin, env):
    opts, pos = parse_opts(args[1:], short_val="fvFi", long_val=("--file", "--assign", "--include"))
    progs = [g._file_text(f) for f in _vals(opts, "-f", "--file")]
    files = pos
    if not _vals(opts, "-f", "--file") and pos:
        progs, files = [pos[0].text], pos[1:]
    for p in progs:
        g.script(p, "awk", "awk program")
    if any(v.text == "inplace" for v in _vals(opts, "-i", "--include")):
        for a in files:
            g.write(a, f"awk -i inplace on {a.shown}")


def _h_sh(g: ShellGuard, args, stdin, env):
    i = 1
    while i < len(args):
        t = args[i].text
        if t in ("-o", "+o", "-O", "+O") and i + 1 < len(args):
            i += 2
            continue
        if t == "--":
            i += 1
            break
        if (t.startswith("-") or t.startswith("+")) and len(t) > 1:
            if "c" in t[1:] and not t.startswith("--"):
                if i + 1 < len(args):
                    g.shell_text(args[i + 1].text)
                return
            i += 1
            continue
        break
    if i < len(args) and args[i].text != "-":
        g._script_file(args[i], args[i + 1:], "sh", stdin)
    else:
        g.code_on_stdin(stdin, "sh", _literal_text(args[0]))


def _h_alias(g: ShellGuard, args, stdin, env):
    for a in args[1:]:
        name, eq, value = a.text.partition("=")
        if eq:
            g.aliases[name] = value


def _h_eval(g: ShellGuard, args, stdin, env):
    g.shell_text(" ".join(a.text for a in args[1:]))


def _h_source(g: ShellGuard, args, stdin, env):
    if len(args) > 1:
        g._script_file(args[1], args[2:], "sh", stdin)


def _h_find(g: ShellGuard, args, stdin, env):
    i = 1
    while i < len(args) and args[i].text in ("-H", "-L", "-P", "-O0", "-O1", "-O2", "-O3"):
        i += 1
    roots = []
    while i < len(args) and not args[i].text.startswith(_FIND_EXPR_STARTS):
        roots.append(args[i])
        i += 1
    roots = roots or [Arg(".")]
    expr = args[i:]
    j = 0
    while j < len(expr):
        t = expr[j].text
        if t == "-delete":
            for r in roots:
                g.delete(r, "find -delete", recursive=True)
        elif t in ("-exec", "-execdir", "-ok", "-okdir"):
            k = j + 1
            while k < len(expr) and expr[k].text not in (";", "+"):
                k += 1
            for r in roots:   # {} stands for any path under the root
                under = os.path.join(g._abs(r.text) if r.kind == "static" else "*", "*")
                sub = [Arg(a.text.replace("{}", under), "dynamic", f"{a.shown} (each path find visits)")
                       if "{}" in a.text else a for a in expr[j + 1:k]]
                if sub:
                    g._dispatch(sub, None, {})
            j = k
        elif t in ("-fprint", "-fprint0", "-fls", "-fprintf") and j + 1 < len(expr):
            g.write(expr[j + 1], f"find {t}")
            j += 1
        j += 1


def _h_git(g: ShellGuard, args, stdin, env):
    i, gdir, extra_dirs = 1, g.cwd, []
    while i < len(args) and args[i].text.startswith("-"):
        t = args[i].text
        if t == "-C" and i + 1 < len(args):
            gdir = os.path.normpath(os.path.join(gdir, args[i + 1].text))
            i += 2
            continue
        if t == "-c" and i + 1 < len(args):
            if not _GIT_SAFE_CONFIG.match(args[i + 1].text):
                raise Denied(f"git -c {args[i + 1].text} can make git run commands or change behaviour; "
                             "run git without -c.")
            i += 2
            continue
        if t.startswith(("--git-dir=", "--work-tree=")):
            extra_dirs.append(os.path.join(gdir, t.partition("=")[2]))
        elif t in ("--git-dir", "--work-tree", "--namespace", "--exec-path") and i + 1 < len(args):
            extra_dirs.append(os.path.join(gdir, args[i + 1].text))
            i += 1
        i += 1
    extra_dirs += [os.path.join(gdir, v) for k, v in env.items() if k in ("GIT_DIR", "GIT_WORK_TREE") and v]
    if not any(g.policy.inside(d, g.cwd) for d in [gdir] + extra_dirs):
        return                                   # not the loop's repository
    if i >= len(args):
        return
    sub, rest = args[i].text, args[i + 1:]
    g.cwd = gdir
    checker = _GIT_SUBCOMMANDS.get(sub)
    if checker is not None:
        checker(g, sub, rest)
    elif sub not in _READONLY_GIT:
        raise Denied(GIT_REASON.format(sub=sub))
    short = "o" if sub in ("format-patch", "archive") else ""
    for n, v in parse_opts(rest, short_val=short, long_val=("--output", "--output-directory"))[0]:
        if n in ("--output", "--output-directory", "-o") and v is not None:
            g.write(v, f"git {sub} {n}")


def _git_paths_editable(g: ShellGuard, sub: str, paths: list):
    if not paths:
        raise Denied(GIT_REASON.format(sub=sub))
    for p in paths:
        if not (p.kind == "static" and g.policy.is_editable(p.text, g.cwd)):
            raise Denied(f"git {sub} {p.text}: only the editable files may be restored this way, and "
                         f"{GIT_REASON.format(sub=sub)}")


def _git_checkout(g: ShellGuard, sub: str, rest: list):
    opts, pos = parse_opts(rest, short_val="bBc", long_val=("--orphan",))
    if _has(opts, "-b", "-B", "-c", "--orphan", "--detach", "-p", "--patch", "--pathspec-from-file"):
        raise Denied(GIT_REASON.format(sub=sub))
    if any(a.text == "--" for a in rest):
        k = [a.text for a in rest].index("--")
        _git_paths_editable(g, sub, rest[k + 1:])
    else:
        _git_paths_editable(g, sub, pos)   # a non-path (branch, commit) here means switching HEAD


def _git_restore(g: ShellGuard, sub: str, rest: list):
    opts, pos = parse_opts(rest, short_val="s", long_val=("--source",))
    if _has(opts, "-S", "--staged", "-p", "--patch", "--pathspec-from-file"):
        raise Denied(GIT_REASON.format(sub=sub))
    _git_paths_editable(g, sub, pos)


def _git_listing(*allowed_subs: str, list_flags: tuple = (), bare_lists: bool = True):
    """branch/tag/stash/remote/...: fine while only listing."""
    def check(g: ShellGuard, sub: str, rest: list):
        opts, pos = parse_opts(rest)
        if pos and pos[0].text in allowed_subs:
            return
        if not pos and (opts or bare_lists) and all(n in list_flags for n, _ in opts):
            return
        if _has(opts, "-l", "--list") and sub in ("branch", "tag"):
            if not any(n in ("-d", "-D", "-m", "-M", "-c", "-C", "-f", "--force", "--delete") for n, _ in opts):
                return
        raise Denied(GIT_REASON.format(sub=sub))
    return check


def _git_config(g: ShellGuard, sub: str, rest: list):
    opts, pos = parse_opts(rest, long_val=("--file", "-f", "--type", "--default"))
    readers = ("--get", "--get-all", "--get-regexp", "--list", "-l", "--get-urlmatch", "--show-origin",
               "--show-scope", "--name-only", "--null", "-z", "--global", "--local", "--system",
               "--includes", "--type", "--default", "--file", "-f", "--bool", "--int", "--path")
    if all(n in readers for n, _ in opts):
        if not pos or (pos[0].text in ("get", "list") and len(pos) <= 2):
            return
        if len(pos) == 1 and pos[0].text not in ("set", "unset", "edit", "rename-section", "remove-section"):
            return
    raise Denied("git config changes how git behaves for the loop (hooks, filters, aliases); "
                 "only reading config (git config --get / --list) is allowed.")


def _git_apply(g: ShellGuard, sub: str, rest: list):
    if any(a.text in ("--check", "--stat", "--numstat", "--summary") for a in rest) and \
            not any(a.text == "--apply" for a in rest):
        return
    raise Denied("git apply writes files the guard cannot see in advance; apply changes to train.py "
                 "with your edit tool instead.")


def _git_reflog(g: ShellGuard, sub: str, rest: list):
    if rest and rest[0].text in ("expire", "delete", "drop"):
        raise Denied(GIT_REASON.format(sub="reflog " + rest[0].text))


def _git_hash_object(g: ShellGuard, sub: str, rest: list):
    if any(a.text == "-w" for a in rest):
        raise Denied(GIT_REASON.format(sub="hash-object -w"))


_GIT_SUBCOMMANDS: dict[str, Callable] = {
    "checkout": _git_checkout, "restore": _git_restore,
    "branch": _git_listing(list_flags=("-a", "-r", "-v", "-vv", "--all", "--remotes", "--verbose",
                                        "--show-current", "--no-color", "--color")),
    "tag": _git_listing(list_flags=("-n",)),
    "stash": _git_listing("list", "show", bare_lists=False),     # bare `git stash` pushes
    "remote": _git_listing("show", "get-url", list_flags=("-v", "--verbose")),
    "worktree": _git_listing("list"), "notes": _git_listing("list", "show"),
    "submodule": _git_listing("status", "summary"),
    "config": _git_config, "apply": _git_apply, "reflog": _git_reflog, "hash-object": _git_hash_object,
}


_SQLITE_VALUE_OPTS = {"-cmd", "-init", "-separator", "-newline", "-nullvalue", "-vfs", "-maxsize",
                     "-mmap", "-pagecache", "-lookaside", "-heap", "-A", "-archive"}


def _h_sqlite(g: ShellGuard, args, stdin, env):
    pos, sql, i = [], [], 1
    while i < len(args):
        t = args[i].text
        if t in _SQLITE_VALUE_OPTS and i + 1 < len(args):
            sql.append(args[i + 1].text)
            i += 2
            continue
        if not t.startswith("-"):
            pos.append(args[i])
        i += 1
    if pos:
        for path in g._concrete(pos[0]):
            if g.policy.in_state_dir(path, g.cwd):
                raise Denied(f"{pos[0].text} is in the loop's state directory; only the loop opens it. "
                             "Use the state_read tool to see past experiments.")
        sql += [a.text for a in pos[1:]]
    if g.policy.mentions_state_dir("\n".join(sql) + "\n" + (stdin or "")):
        raise Denied("this SQL attaches a file in the loop's state directory; use the state_read tool.")


def _h_patch(g: ShellGuard, args, stdin, env):
    opts, pos = parse_opts(args[1:], short_val="pioFdDrBVYzg",
                           long_val=("--input", "--output", "--directory", "--strip", "--reject-file"))
    if _has(opts, "--dry-run", "-C", "--check"):
        return
    for v in _vals(opts, "-o", "--output"):
        g.write(v, "patch -o")
    if pos:
        g.write(pos[0], f"patch {pos[0].shown}")
        return
    inputs = _vals(opts, "-i", "--input")
    text = g._file_text(inputs[0]) if inputs else stdin
    if text is None:
        raise Denied("patch without a target file changes files named inside the patch, which the guard "
                     "cannot read here; edit train.py with your edit tool instead.")
    for m in re.finditer(r"^(?:\+\+\+|---) (\S+)", text, re.M):
        name = m.group(1)
        if name != "/dev/null":
            for cand in {name, re.sub(r"^[ab]/", "", name)}:
                g.write(Arg(cand), f"patch of {name}")


def _h_apply_patch(g: ShellGuard, args, stdin, env):
    text = args[1].text if len(args) > 1 else stdin
    if text is None:
        return
    problem = g.policy.apply_patch_problem(text, g.cwd)
    if problem:
        raise Denied(problem)


def _h_tar(g: ShellGuard, args, stdin, env):
    rest = args[1:]
    if rest and not rest[0].text.startswith("-"):
        rest = [rest[0].derive("-" + rest[0].text)] + rest[1:]     # old style: tar xzf a.tgz
    opts, pos = parse_opts(rest, short_val="fCTXbHIKN", long_val=("--file", "--directory", "--exclude",
                                                                   "--files-from", "--exclude-from"))
    where = (_vals(opts, "-C", "--directory") or [Arg(".")])[0]
    if _has(opts, "-x", "--extract", "--get"):
        g.write(where, f"tar extracting into {where.shown}", recursive=True)
    if _has(opts, "-c", "-r", "-u", "-A", "--create", "--append", "--update", "--concatenate"):
        for v in _vals(opts, "-f", "--file"):
            g.write(v, "tar -f")
        for a in pos:
            g.read(a.derive(os.path.join(where.text, a.text)), recursive=True)
            if _has(opts, "--remove-files"):
                g.delete(a.derive(os.path.join(where.text, a.text)), "tar --remove-files", recursive=True)


def _h_unzip(g: ShellGuard, args, stdin, env):
    opts, pos = parse_opts(args[1:], short_val="dxP")
    if _has(opts, "-l", "-t", "-v", "-p", "-Z", "-z"):
        return
    where = (_vals(opts, "-d") or [Arg(".")])[0]
    g.write(where, f"unzip extracting into {where.shown}", recursive=True)


def _h_zip(g: ShellGuard, args, stdin, env):
    opts, pos = parse_opts(args[1:], short_val="xibnt")
    if pos:
        g.write(pos[0], f"zip {pos[0].shown}")
        for a in pos[1:]:
            g.read(a, recursive=_has(opts, "-r", "-R"))
            if _has(opts, "-m", "--move"):
                g.delete(a, f"zip -m {a.shown} (deletes it)", recursive=True)


def _h_compress(g: ShellGuard, args, stdin, env):
    opts, pos = parse_opts(args[1:], short_val="S")
    if _has(opts, "-c", "--stdout", "-l", "--list", "-t", "--test"):
        return
    for a in pos:
        g.write(a, f"{_literal_text(args[0])} {a.shown} (replaces the file)")


def _h_download(out_flags: tuple):
    def handler(g: ShellGuard, args, stdin, env):
        for i, a in enumerate(args[1:], 1):
            if a.text in out_flags and i + 1 < len(args):
                g.write(args[i + 1], f"{_literal_text(args[0])} {a.shown}")
            elif any(a.text.startswith(f + "=") for f in out_flags if f.startswith("--")):
                g.write(a.derive(a.text.partition("=")[2]), _literal_text(args[0]))
    return handler


def _h_sort(g: ShellGuard, args, stdin, env):
    opts, pos = parse_opts(args[1:], short_val="otkSTt", long_val=("--output",))
    for v in _vals(opts, "-o", "--output"):
        g.write(v, "sort -o")


def _h_second_positional(g: ShellGuard, args, stdin, env):
    """uniq IN OUT, xxd -r IN OUT: the second positional is written."""
    pos = [a for a in args[1:] if not a.text.startswith("-")]
    if len(pos) >= 2:
        g.write(pos[1], f"{_literal_text(args[0])} {pos[1].shown}")


_HANDLERS: dict[str, Callable] = {
    "loopwright": _h_loopwright,
    "cd": _h_cd, "pushd": _h_cd, "export": _h_export, "declare": _h_export, "typeset": _h_export,
    "local": _h_export, "readonly": _h_export,
    "rm": _h_delete, "unlink": _h_delete, "rmdir": _h_delete, "shred": _h_delete, "srm": _h_delete,
    "touch": _h_touch, "truncate": _h_truncate, "mkdir": _h_writes_all("m", ("--mode",)),
    "mkfifo": _h_writes_all("m"), "mknod": _h_writes_all("m"), "fallocate": _h_writes_all("lon"),
    "chmod": _h_chmod, "chown": _h_chmod, "chgrp": _h_chmod, "chattr": _h_chmod, "setfacl": _h_chmod,
    "chcon": _h_chmod, "chflags": _h_chmod, "setfattr": _h_writes_all("nvx"),
    "cp": _h_copy(move=False), "install": _h_copy(move=False), "mv": _h_copy(move=True),
    "ln": _h_ln, "link": _h_ln, "rsync": _h_rsync, "dd": _h_dd, "tee": _h_tee,
    "sed": _h_sed, "gsed": _h_sed, "perl": _perl_like("perl"), "ruby": _perl_like("ruby"),
    "node": _h_node, "bun": _h_node, "deno": _h_eval_code("eval", "node"),
    "php": _h_eval_code("-r", "php"), "lua": _h_eval_code("-e", "lua"), "Rscript": _h_eval_code("-e", "R"),
    "python": _h_python, "awk": _h_awk, "sh": _h_sh, "eval": _h_eval, "source": _h_source, ".": _h_source,
    "alias": _h_alias, "find": _h_find, "git": _h_git, "sqlite3": _h_sqlite, "patch": _h_patch,
    "apply_patch": _h_apply_patch, "applypatch": _h_apply_patch,
    "tar": _h_tar, "bsdtar": _h_tar, "unzip": _h_unzip, "zip": _h_zip,
    "curl": _h_download(("-o", "--output")), "wget": _h_download(("-O", "--output-document")),
    "sort": _h_sort, "uniq": _h_second_positional, "xxd": _h_second_positional,
    "iconv": _h_download(("-o", "--output")),
    **{e: _h_writes_all("c", ("-c", "--cmd")) for e in _EDITORS},
    **{c: _h_compress for c in _COMPRESSORS},
}
