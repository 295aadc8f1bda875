"""Wrappers (sudo, env, timeout, xargs, uv run, ...): each peels itself off and returns the
wrapped argv (possibly empty when it handled everything itself)."""
from __future__ import annotations

import shlex

from mcp_server.guard.shell.args import ASSIGNMENT, Arg, operand_index, option_values, parse_opts
from mcp_server.guard.shell.handlers import Walk, Wrapper


def _w_skip(with_value: set, fixed: int = 0):
    def wrap(g: Walk, args, stdin, env):
        i = operand_index(args, with_value) + fixed
        return args[i:]
    return wrap


def _w_sudo(g: Walk, args, stdin, env):
    i = operand_index(args, {"-u", "-g", "-C", "-p", "-r", "-t", "-U", "-h", "-D", "-R", "-T"})
    flags = {a.text for a in args[1:i]}
    if i >= len(args) and ("-s" in flags or "-i" in flags):
        g.code_on_stdin(stdin, "sh", "sudo -s")
    return args[i:]


def _w_env(g: Walk, args, stdin, env):
    i = 1
    while i < len(args):
        t = args[i].text
        if t in ("-u", "--unset") and i + 1 < len(args):
            i += 2
        elif t in ("-C", "--chdir") and i + 1 < len(args):
            g.cwd = g.absolute(args[i + 1].text)
            i += 2
        elif t.startswith("--chdir="):
            g.cwd = g.absolute(t.partition("=")[2])
            i += 1
        elif t in ("-S", "--split-string") and i + 1 < len(args):
            g.shell_text(args[i + 1].text + " " + " ".join(shlex.quote(a.text) for a in args[i + 2:]))
            return []
        elif t.startswith("-") and t != "-":
            i += 1
        elif m := ASSIGNMENT.match(t):
            env[m.group(1)] = t.partition("=")[2]
            i += 1
        else:
            break
    return args[i:]


def _w_command(g: Walk, args, stdin, env):
    if any(a.text in ("-v", "-V") for a in args[1:2]):
        return []                     # lookup only
    return args[operand_index(args, set()):]


def _w_exec(g: Walk, args, stdin, env):
    return args[operand_index(args, {"-a"}):]


def _w_timeout(g: Walk, args, stdin, env):
    i = operand_index(args, {"-s", "-k", "--signal", "--kill-after"})
    return args[i + 1:]               # skip DURATION


def _w_time(g: Walk, args, stdin, env):
    i = 1
    while i < len(args) and args[i].text.startswith("-"):
        if args[i].text in ("-o", "--output") and i + 1 < len(args):
            g.write(args[i + 1], "time -o")
            i += 1
        elif args[i].text in ("-f", "--format"):
            i += 1
        i += 1
    return args[i:]


def _w_run(g: Walk, args, stdin, env):
    """uv run / poetry run / pipenv run / pdm run / hatch run / conda run: the command follows."""
    if len(args) < 2 or args[1].text != "run":
        return []
    i = operand_index(args, {"--with", "--python", "-p", "--project", "--directory", "-n", "--name",
                          "--prefix", "--env", "-e", "--extra", "--group", "--env-file"}, start=2)
    rest = args[i:]
    if rest and rest[0].kind == "static" and rest[0].text.endswith(".py"):
        rest = [Arg("python")] + rest             # `uv run train.py`
    return rest


def _w_dash_c(g: Walk, args, stdin, env):
    """su / runuser / script: `-c STRING` is run by a shell; without it nothing we can see runs."""
    for i, a in enumerate(args[1:-1], 1):
        if a.text in ("-c", "--command"):
            g.shell_text(args[i + 1].text)
    return []


def _w_watch(g: Walk, args, stdin, env):
    rest = args[operand_index(args, {"-n", "--interval", "-d", "--differences"}):]
    g.shell_text(" ".join(a.text for a in rest))      # watch runs its arguments through sh -c
    return []


def _w_flock(g: Walk, args, stdin, env):
    for i, a in enumerate(args[1:-1], 1):
        if a.text in ("-c", "--command"):
            g.shell_text(args[i + 1].text)
            return []
    return args[operand_index(args, {"-w", "--timeout", "-E", "--conflict-exit-code"}) + 1:]   # skip the lock file


def _w_xargs(g: Walk, args, stdin, env):
    """xargs CMD...: CMD gets extra arguments we cannot see; model them as one unknown path."""
    opts, pos = parse_opts(args[1:], short_val="IadELnPsS", first_positional_stops=True)
    repl = option_values(opts, "-I", "--replace")
    if not pos:
        return []
    if repl:
        return [Arg(a.text.replace(repl[0].text, "*"), "dynamic", f"{a.shown} (from xargs)")
                if repl[0].text in a.text else a for a in pos]
    return pos + [Arg("*", "dynamic", "the arguments xargs reads from stdin")]


def _w_strace(g: Walk, args, stdin, env):
    i = 1
    while i < len(args) and args[i].text.startswith("-"):
        if args[i].text == "-o" and i + 1 < len(args):
            g.write(args[i + 1], "strace -o")
            i += 1
        elif args[i].text in ("-e", "-p", "-s", "-u", "-E", "-P", "-I", "-a", "-b", "-X"):
            i += 1
        i += 1
    return args[i:]


WRAPPERS: dict[str, Wrapper] = {
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

