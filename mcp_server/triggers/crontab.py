"""The user's crontab: read it, install loopwright's entry for one workspace, and the environment cron gives it.

The crontab is read and written with `crontab -l` / `crontab -` or, when LOOPWRIGHT_CRONTAB names a
file, that file (a test, or a machine whose cron reads a file loopwright may write). One entry per
workspace, after a marker comment; installing again replaces it. Cron runs an entry with only
HOME, LOGNAME, SHELL=/bin/sh and PATH=/usr/bin:/bin, plus the `NAME=value` lines of the crontab
itself (a person may put a token there; loopwright never writes one).
"""
from __future__ import annotations

import os
import pwd
import re
import subprocess
from pathlib import Path
from typing import Mapping, Optional

FILE_VAR = "LOOPWRIGHT_CRONTAB"
MARK = "# loopwright cron tick for "
_ASSIGN = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


class CrontabError(RuntimeError):
    """The crontab could not be read or written; the message says what to do."""


def _file(env: Mapping[str, str]) -> Optional[Path]:
    return Path(env[FILE_VAR]) if env.get(FILE_VAR) else None


def read(env: Optional[Mapping[str, str]] = None) -> str:
    env = os.environ if env is None else env
    path = _file(env)
    if path is not None:
        return path.read_text() if path.is_file() else ""
    try:
        r = subprocess.run(["crontab", "-l"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise CrontabError("`crontab` is not installed (Debian: apt-get install cron); or install the systemd "
                           "timer that `loopwright cron --install --print` shows") from None
    if r.returncode != 0:
        return ""   # "no crontab for USER"
    return r.stdout


def write(text: str, env: Optional[Mapping[str, str]] = None) -> str:
    """Replace the crontab with `text`; returns where it went."""
    env = os.environ if env is None else env
    path = _file(env)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        return str(path)
    try:
        r = subprocess.run(["crontab", "-"], input=text, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise CrontabError("`crontab` is not installed (Debian: apt-get install cron)") from None
    if r.returncode != 0:
        raise CrontabError(f"`crontab -` refused the new crontab: {r.stderr.strip()}")
    return "the user's crontab (`crontab -l` shows it)"


def with_entry(text: str, workspace: Path, line: str) -> str:
    """`text` with this workspace's entry replaced by (or added as) `line`."""
    mark = MARK + str(workspace)
    lines, out, skip = text.splitlines(), [], False
    for ln in lines:
        if skip:
            skip = False
            continue
        if ln.strip() == mark:
            skip = True
            continue
        out.append(ln)
    return "\n".join(out + [mark, line.rstrip("\n")]) + "\n"


def entry(text: str, workspace: Path) -> Optional[str]:
    """This workspace's installed entry line, or None."""
    lines = text.splitlines()
    for i, ln in enumerate(lines):
        if ln.strip() == MARK + str(workspace) and i + 1 < len(lines):
            return lines[i + 1]
    return None


def cron_environment(text: str, user_env: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """What cron gives an entry of this crontab: its defaults plus the crontab's NAME=value lines."""
    user_env = os.environ if user_env is None else user_env
    try:
        pw = pwd.getpwuid(os.getuid())
        home, name = pw.pw_dir, pw.pw_name
    except KeyError:
        home, name = user_env.get("HOME", "/"), user_env.get("USER", "")
    env = {"HOME": home, "LOGNAME": name, "SHELL": "/bin/sh", "PATH": "/usr/bin:/bin"}
    for ln in text.splitlines():
        if ln.lstrip().startswith("#"):
            continue
        m = _ASSIGN.match(ln)
        if m and not re.match(r"^\s*[\d*@]", ln):
            value = m.group(2)
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            env[m.group(1)] = value
    return env


def command_of(line: str) -> str:
    """The command of a five-field crontab line (what cron hands to /bin/sh), `%` unescaped."""
    parts = line.split(None, 5)
    if len(parts) < 6:
        raise CrontabError(f"not a five-field crontab line: {line!r}")
    return parts[5].replace("\\%", "%")
