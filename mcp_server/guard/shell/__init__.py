"""Static analysis of a shell command for the guard: what would it write, delete or read?

The PreToolUse hook sees only the command text, before it runs. This package lexes
that text the way bash would (lexer.py: quotes, escapes, $(...), backticks, heredocs,
redirections, ;, &&, ||, |, subshells), expands what can be known in advance
(walker.py: literal words, variables assigned earlier in the same command, ~, {a,b},
globs against the real filesystem), and checks every file the command would touch
against the workspace policy (commands.py, wrappers.py, git.py; they call back into the
walker through the Walk protocol of handlers.py, not by importing it). Commands that run
other code (bash -c, eval, python -c, heredocs fed to an interpreter, xargs, find -exec)
are followed into that code.

What cannot be known before running (a path computed at run time, a script
fetched or decoded on the fly) is the manifest check's job, not this package's:
see mcp_server/loop/integrity.py.

The policy object is duck-typed (mcp_server.guard.policy.Policy); this package does not
import the policy so the two stay independently testable.
"""
from mcp_server.guard.shell.args import Arg, Denied, parse_opts
from mcp_server.guard.shell.lexer import ShellParseError, parse
from mcp_server.guard.shell.walker import ShellGuard

__all__ = ["Arg", "Denied", "ShellGuard", "ShellParseError", "parse", "parse_opts"]
