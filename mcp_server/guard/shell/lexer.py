"""Shell lexer and parser: the command text as bash would split it (quotes, escapes, $(...),
backticks, heredocs, redirections, ;, &&, ||, |, subshells)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional


class ShellParseError(ValueError):
    pass



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
            red = Redir(op, None, delim=plain_text(word), strip_tabs=(op == "<<-"),
                        expand=not any(q in raw for q in "'\"\\"))
            self.pending.append(red)
        elif op in (">&", "<&"):
            word = self._word()
            text = plain_text(word)
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


def plain_text(word: Word) -> str:
    """The word's text with quotes removed and expansions left as written (for delimiters, fds)."""
    return "".join(t if k in ("lit", "q") else "$" + t for k, t in word.parts)


KEYWORDS = {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "{", "}",
             "time", "function", "esac", "in", "[[", "]]"}
HEADER_KEYWORDS = {"for", "select", "case"}   # the rest of such a "command" is a header, not a command


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
            array = plain_text(cur.words[-1]).endswith("=")                               # a=(1 2)
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

