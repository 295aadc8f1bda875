"""What the cron and webhook triggers share: the session lock and the call into the launcher."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional

from mcp_server.common.locks import FileLock

# One file for every trigger, so a cron session and a webhook session never overlap either.
SESSION_LOCK = "session.lock"


SessionLock = FileLock   # the session lock is the package's one file lock


def connector_problems(root: Path | str, env: Optional[Mapping[str, str]] = None) -> list[str]:
    """A line for each configured connector (Slack, Jira) whose token is missing from `env`."""
    from mcp_server.loop.workspace import Workspace
    from mcp_server.notify.outbox import build_sinks

    ws = Workspace.open(root)
    with ws.ledger() as ledger:
        return list(build_sinks(ws.cfg, ledger, os.environ if env is None else env)[1])


def preflight(root: Path | str, agents, env: Optional[Mapping[str, str]] = None) -> list[str]:
    """What would make an unattended session fail here: a client binary not found with this
    environment's PATH / LOOPWRIGHT_*_BIN, a configured connector without its token."""
    from mcp_server.agents.launch import LaunchError, client_env, find_client

    env = dict(os.environ if env is None else env)
    problems = []
    for agent in dict.fromkeys(agents):
        if agent in ("claude", "codex"):
            try:
                find_client(agent, client_env(0, Path(root), env, agent=agent))
            except LaunchError as e:
                problems.append(str(e))
    return problems + connector_problems(root, env)


def record_failure(root: Path | str, agent: str, trigger: str, detail: str, error: str) -> None:
    """A session that could not start: a `launch_failed` event (what `status` shows, delivered
    to the connectors that can be reached now, kept for the others)."""
    from mcp_server.loop.workspace import Workspace, sinks_for

    ws = Workspace.open(root)
    sinks = sinks_for(ws.cfg)
    with ws.ledger() as ledger:
        campaign = ledger.campaign()
        if campaign is None:
            return
        ledger.add_event(campaign["id"], "launch_failed",
                         {"agent": agent, "trigger": trigger, "detail": detail, "error": error}, sinks)
    if sinks:
        try:
            from mcp_server.notify.outbox import notify_workspace
            notify_workspace(ws.root)
        except Exception:  # noqa: BLE001 - the outbox keeps it for `loopwright notify`
            pass


def launch(root: Path | str, *, agent: str, trigger: str, detail: str,
           max_session_minutes: Optional[float] = None, level: str = "inner") -> None:
    """Start one headless agent session with the launcher (mcp_server.agents.launch). Unattended,
    nobody sees a refusal: a missing connector token refuses the session too, and every refusal
    is recorded (record_failure) before it is raised."""
    from mcp_server.agents.launch import LaunchError, launch_session  # lazily: the triggers test without it

    try:
        missing = connector_problems(root)
        if missing:
            raise LaunchError("not starting an unattended session: " + "; ".join(missing) + ". Give this job "
                              "the variable (loopwright never writes tokens into a crontab or unit: put it in "
                              "the environment cron or systemd gives the job), or remove the connector")
        launch_session(Path(root), agent, trigger=trigger, detail=detail,
                       max_session_minutes=max_session_minutes, level=level)
    except LaunchError as e:
        record_failure(root, agent, trigger, detail, str(e))
        raise
