"""Reading a hook payload: the tool's input, the directory it runs in, and the workspace a
Stop or SessionStart belongs to."""
from __future__ import annotations

import os
from typing import Optional

from mcp_server.guard.policy import find_workspace_roots


def tool_input(payload: dict) -> dict:
    inp = payload.get("tool_input")
    if isinstance(inp, dict):
        return inp
    if isinstance(inp, (str, list)):
        return {"command": inp}
    return {}


def payload_cwd(payload: dict, inp: dict) -> str:
    cwd = payload.get("cwd")
    base = cwd if isinstance(cwd, str) and cwd else os.getcwd()
    for key in ("workdir", "cwd", "working_directory"):     # Codex shell tools carry their own
        if isinstance(inp.get(key), str) and inp[key]:
            return os.path.join(base, inp[key])
    return base


def session_root(payload: dict) -> Optional[str]:
    """The workspace a Stop / SessionStart belongs to: around its cwd, else CLAUDE_PROJECT_DIR."""
    for start in (payload_cwd(payload, {}), os.environ.get("CLAUDE_PROJECT_DIR")):
        roots = find_workspace_roots(start) if start else []
        if roots:
            return roots[0]
    return None

