"""The walker: ShellGuard follows one shell string command by command, expands what can be
known in advance and checks every effect against the workspace policy."""
from __future__ import annotations

import glob as _glob
import os
import re
import shlex
from itertools import islice
from typing import Optional

from mcp_server.guard.policy import HUMAN_COMMANDS
from mcp_server.guard.shell.args import (
    ASSIGNMENT,
    GLOB_CHARS,
    Arg,
    Denied,
    brace_expand,
    has_option,
    literal_text,
    option_values,
    parse_opts,
)
from mcp_server.guard.shell.commands import HANDLERS, loopwright_cli
from mcp_server.guard.shell.lexer import (
    HEADER_KEYWORDS,
    KEYWORDS,
    Command,
    Redir,
    ShellParseError,
    Word,
    parse,
    plain_text,
)
from mcp_server.guard.shell.wrappers import WRAPPERS

MAX_DEPTH = 8            # nested bash -c / $(...) levels before we give up (and deny)
MAX_SCRIPT_BYTES = 1 << 20
MAX_GLOB_MATCHES = 2000  # beyond this a glob is judged by its pattern, not by listing every match


_PY = re.compile(r"python[0-9.]*[dmu]?|pypy[0-9.]*")
_STDIN_PATHS = {"/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"}
_SHELLS = {"sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "fish", "busybox-sh"}
_AWKS = {"awk", "gawk", "mawk", "nawk"}
# Commands that only look at names / metadata: naming a hidden file is fine for them.
_METADATA = {"ls", "stat", "du", "test", "[", "[[", "realpath", "readlink", "basename", "dirname",
             "cd", "pushd", "popd", "export", "true", "false", ":", "which", "type", "command"}


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
            self.dispatch(args, stdin, env)

    def _strip_keywords(self, words: list) -> list:
        while words:
            first = _literal(words[0])
            if first in HEADER_KEYWORDS:
                if first in ("for", "select") and len(words) > 1:
                    self.vars[plain_text(words[1])] = None     # loop variable: unknown
                return []
            if first not in KEYWORDS:
                break
            words = words[1:]
        return words

    def _assignment(self, word: Word):
        first_kind, first_text = word.parts[0]
        m = ASSIGNMENT.match(first_text)
        assert m is not None                       # only called on words _is_assignment accepted
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
        args: list[Arg] = []
        for pieces in fields:
            if not pieces or (len(fields) > 1 and not "".join(t for t, _ in pieces)):
                continue                                   # empty fields from splitting vanish
            variants: list[list[tuple[str, str]]] = [[]]
            for text, kind in pieces:
                if kind == "lit" and "{" in text and split:
                    alts = brace_expand(text)
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
        if any(k == "lit" and GLOB_CHARS.search(t) for t, k in pieces):
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
                return self.file_text(arg) if arg.kind == "static" else None
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
            texts = [self.file_text(a) for a in files]
            known = [t for t in texts if t is not None]
            return "".join(known) if len(known) == len(texts) else None
        return None

    def file_text(self, arg: Arg) -> Optional[str]:
        """The file's text as this command line would see it (written earlier in it, or on disk; None
        when unknown or too large)."""
        path = self.absolute(arg.text)
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
                self.written[self.absolute(target.text)] = stdin
            elif name in ("echo", "printf"):
                self.written[self.absolute(target.text)] = " ".join(a.text for a in args[1:])

    # -- effects checked against the policy

    def absolute(self, text: str) -> str:
        """A path as written, made absolute against the walk's current directory."""
        return os.path.normpath(os.path.join(self.cwd, os.path.expanduser(text)))

    def concrete(self, arg: Arg) -> list[str]:
        """The paths an argument names: itself, a glob's matches (capped), or none for a dynamic value."""
        if arg.kind == "static":
            return [arg.text]
        if arg.kind == "glob":
            matches = list(islice(_glob.iglob(self.absolute(arg.text)), MAX_GLOB_MATCHES + 1))
            return matches or [arg.text]
        return []

    def _too_wide(self, arg: Arg) -> bool:
        """A glob with more matches than we list: check it like a run-time value instead."""
        return arg.kind == "glob" and len(self.concrete(arg)) > MAX_GLOB_MATCHES

    def write(self, arg: Arg, how: str, recursive: bool = False, strict: bool = False):
        for path in self.concrete(arg):
            problem = self.policy.write_problem(path, self.cwd, strict=strict)
            if problem is None and (recursive or os.path.isdir(self.absolute(path))):
                problem = self.policy.covers_problem(path, self.cwd)
            if problem:
                raise Denied(f"{how} would modify a protected path: {problem}")
        if arg.kind == "dynamic" or self._too_wide(arg):
            hit = self.policy.pattern_hits(arg.text, self.cwd, covers=recursive)
            if hit:
                raise Denied(f"{how}: the guard cannot resolve {arg.shown} before the command runs, and it "
                             f"could be {hit}. Use a literal path outside the protected files.")

    def read(self, arg: Arg, recursive: bool = False):
        for path in self.concrete(arg):
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

    def replace(self, arg: Arg, how: str):
        """`how` swaps a new file in by rename (sed -i, perl -i, mv). On an editable file that fails inside
        Claude Code's sandbox, which makes only the file itself writable, not its folder ("cannot rename ...:
        Device or resource busy"): say what works instead."""
        for path in self.concrete(arg):
            if self.policy.is_editable(path, self.cwd):
                name = os.path.basename(path)
                raise Denied(f"{how} replaces {name} by renaming a new file over it, which fails inside the "
                             f"agent's sandbox (only {name} itself is writable, not its folder: \"Device or "
                             f"resource busy\"). Edit {name} with your Edit tool (Read it first), or rewrite it "
                             f"in place: `cat > {name} <<'EOF' ... EOF`, `sed 's/a/b/' {name} > /tmp/t && "
                             f"cat /tmp/t > {name}`, or `cp NEWFILE {name}`.")

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

    def dispatch(self, args: list, stdin: Optional[str], env: dict):
        """Check one simple command (wrappers unwrapped, then its handler); the handlers call it for a
        command they run in turn (find -exec)."""
        is_cd = literal_text(args[0]) in ("cd", "pushd")
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
            handler = HANDLERS.get(name)
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
            wrapper = WRAPPERS.get(name)
            if wrapper is None:
                return name, args
            args = wrapper(self, args, stdin, env)
        return None

    def _dynamic_command(self, args: list):
        # `$CMD prepare.py`: we cannot know what runs, so refuse if it names a protected path
        # or reads as a person's loopwright command (`$(which loopwright) approve 3`).
        _human_words(args[0], args[1:])
        for a in args[1:]:
            for path in self.concrete(a):
                problem = self.policy.write_problem(path, self.cwd)
                if problem:
                    raise Denied(f"the command name {args[0].text!r} is not known before it runs and it is "
                                 f"given a protected path: {problem}")

    # -- interpreters

    def python_command(self, args: list, stdin: Optional[str]):
        """`python ...`: -c code, -m module (loopwright's own refused), stdin, or a script file."""
        opts, pos = parse_opts(args[1:], short_val="cmWXQ", first_positional_stops=True)
        code = option_values(opts, "-c")
        if code:
            self.script(code[0].text, "python", "python -c")
            return
        if has_option(opts, "-m"):
            module = option_values(opts, "-m")
            if module and module[0].text.split(".")[0] == "mcp_server":
                loopwright_cli(module[0].text, pos)
            elif any("mcp_server" in a.text for a in pos):      # python -m runpy mcp_server.cli ...
                raise Denied(f"python -m {module[0].text if module else ''} is given loopwright's own code "
                             "(mcp_server); use the loopwright MCP tools instead")
            return
        if not pos or pos[0].text == "-":
            self.code_on_stdin(stdin, "python", "python")
            return
        self.script_file(pos[0], pos[1:], "python", stdin)

    def script_file(self, path_arg: Arg, rest: list, lang: str, stdin: Optional[str] = None):
        """An interpreter running a file: look inside it unless it is the editable file."""
        if path_arg.kind != "static":
            _human_words(path_arg, rest)          # python "$(which loopwright)" approve 3
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
            text = self.file_text(path_arg)
        if lang == "sh":
            self.shell_text(text)
        else:
            self.script(text, lang, f"the script {path_arg.text}")


# --------------------------------------------------------------------------- helpers

def _human_words(head: Arg, rest: list):
    """A program known only at run time, given a person's loopwright subcommand as its first word."""
    words = [a.text for a in rest if a.kind == "static" and not a.text.startswith("-")]
    if words and words[0] in HUMAN_COMMANDS:
        raise Denied(f"{head.shown!r} is not known before it runs and its arguments read as `loopwright "
                     f"{words[0]}`, a command for the person running the loop; use the MCP tools instead")


def _initial_vars(cwd: str) -> dict:
    return {"HOME": os.path.expanduser("~"), "PWD": cwd, "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
            "USER": os.environ.get("USER", "")}


def _is_assignment(word: Word) -> bool:
    return bool(word.parts) and word.parts[0][0] == "lit" and bool(ASSIGNMENT.match(word.parts[0][1]))


def _literal(word: Word) -> Optional[str]:
    if len(word.parts) == 1 and word.parts[0][0] == "lit":
        return word.parts[0][1]
    return None



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

