"""What a command handler may ask of the walk, and the handlers' shapes.

The walker (walker.ShellGuard) calls the handlers in commands.py, wrappers.py and git.py, and they call
back into it: write this path, run this shell text, dispatch this command. They type that argument as
Walk, declared here, instead of importing the walker that imports them, so the import graph has no
cycle even behind TYPE_CHECKING (issue 25). ShellGuard satisfies Walk without naming it; mypy checks
that where the walker passes itself to HANDLERS and WRAPPERS, which are typed with Handler and Wrapper.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Protocol

from mcp_server.guard.shell.args import Arg


class Walk(Protocol):
    """The part of ShellGuard the handlers use: the walk's state and the effects they report."""

    policy: Any       # duck-typed mcp_server.guard.policy.Policy (see the package docstring)
    cwd: str          # the walk's current directory; cd, env -C and git -C change it
    vars: dict        # shell variables known so far in this command line
    written: dict     # path -> text written to it earlier in this command line
    aliases: dict     # alias name -> replacement text

    def absolute(self, text: str) -> str: ...

    def concrete(self, arg: Arg) -> list[str]: ...

    def file_text(self, arg: Arg) -> Optional[str]: ...

    def write(self, arg: Arg, how: str, recursive: bool = False, strict: bool = False) -> None: ...

    def read(self, arg: Arg, recursive: bool = False) -> None: ...

    def delete(self, arg: Arg, how: str, recursive: bool = False) -> None: ...

    def replace(self, arg: Arg, how: str) -> None: ...

    def script(self, text: Optional[str], lang: str, origin: str) -> None: ...

    def code_on_stdin(self, stdin: Optional[str], lang: str, name: str) -> None: ...

    def shell_text(self, text: Optional[str], cwd: Optional[str] = None) -> None: ...

    def dispatch(self, args: list, stdin: Optional[str], env: dict) -> None: ...

    def python_command(self, args: list, stdin: Optional[str]) -> None: ...

    def script_file(self, path_arg: Arg, rest: list, lang: str, stdin: Optional[str] = None) -> None: ...


# handler(walk, argv, stdin text or None, env assignments): raises Denied on a forbidden effect
Handler = Callable[[Walk, list, Optional[str], dict], object]
# wrapper(walk, argv, stdin, env) -> the wrapped command's argv ([] when it has been handled)
Wrapper = Callable[[Walk, list, Optional[str], dict], list]
# a git subcommand's check(walk, subcommand, its arguments)
GitCheck = Callable[[Walk, str, list], object]
