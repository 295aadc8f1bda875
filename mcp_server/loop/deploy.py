"""The separate-user deployment: the loop as one OS user, the agent as another (docs/security.md).

The loop's user owns the workspace and its state directory (0700, in that user's home); the agent's user
is in a group that may read the workspace and write only its editable files. So the agent cannot read or
write the ledger, the pins, the settings or the held-out data even with no client sandbox at all, nor
write a frozen file, `.git`, or create a file next to them: the kernel's file permissions say so, not a
hook. The agent reaches the loop only through the MCP server, which runs as the loop's user.

`loopwright init DIR --agent-group GROUP` (run as the loop's user) calls `share_with_group` below; git
keeps those modes across reverts (gitops._keeping_modes). tests/e2e/test_deployments.py builds the two users
and checks both sides.
"""
from __future__ import annotations

import grp
import os
from pathlib import Path
from typing import Iterable

HOOKS_DIR = ".loopwright/hooks"   # the guard (run as the agent's user) leaves its heartbeats here


class DeployError(RuntimeError):
    """A deployment problem, phrased as what to do about it."""


def group_id(group: str) -> int:
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        raise DeployError(f"group {group!r} does not exist: create it (`groupadd {group}`) and add the loop's user "
                          f"and the agent's user to it (`usermod -aG {group} USER`)") from None
    if os.geteuid() != 0 and gid not in os.getgroups() and gid != os.getegid():
        raise DeployError(f"this user is not in group {group!r}, so it cannot hand the workspace to it: "
                          f"`usermod -aG {group} $USER` and log in again (or `sg {group} ...`)")
    return gid


def share_with_group(root: Path, group: str, editable: Iterable[str] = ("train.py",)) -> list[str]:
    """Let `group` (the agent's) read the workspace and write its editable files, nothing else of it.
    Returns what was changed, for the user."""
    root = Path(root)
    gid = group_id(group)
    done = []
    # the directory: the group may enter and list it, not create, rename or delete files in it (a frozen
    # file stays the loop's); setgid so a file git re-creates keeps the group; others get nothing
    os.chown(root, -1, gid)
    os.chmod(root, 0o2750)
    done.append(f"{root}: group {group}, mode 2750 (the group reads; only the loop's user creates or deletes)")
    for rel in editable:
        path = root / rel
        if path.is_file():
            os.chown(path, -1, gid)
            os.chmod(path, 0o664)
            done.append(f"{path}: group {group}, mode 664 (the agent edits it in place)")
    hooks = root / HOOKS_DIR
    hooks.mkdir(parents=True, exist_ok=True)
    os.chown(hooks, -1, gid)
    os.chmod(hooks, 0o2770)
    done.append(f"{hooks}: group {group}, mode 2770 (the guard's heartbeats, a diagnostic)")
    return done
