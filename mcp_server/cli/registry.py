"""Every `loopwright` command, declared once: its name, one help line, and where its code lives.

A command's module is imported only when that command runs or its --help is asked for, so
`loopwright --help` lists everything without importing the engine, torch or the MCP SDK, and a
broken optional dependency breaks only the commands that use it.

Adding a command: in a module under mcp_server/cli/commands/ (one per topic) write

    def replay_args(parser):            # optional: the command's own arguments
        parser.add_argument("experiment_id", type=int)

    def replay(args) -> int:            # the handler; the exit status
        with open_engine(args) as eng:
            ...

and add `Command("replay", "loop:replay", "one help line")` to COMMANDS below.
"""
from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from typing import Callable, Optional

Handler = Callable[[argparse.Namespace], int]
ArgsBuilder = Callable[[argparse.ArgumentParser], None]

COMMANDS_PACKAGE = "mcp_server.cli.commands"


@dataclass(frozen=True)
class Command:
    name: str                 # as typed: `loopwright <name>`
    target: str               # "module:function", module relative to mcp_server.cli.commands (or dotted)
    help: str
    workspace: bool = True    # takes --workspace/-w (default: $LOOPWRIGHT_WORKSPACE or the cwd)

    def _module(self):
        module, _, _ = self.target.partition(":")
        return importlib.import_module(module if "." in module else f"{COMMANDS_PACKAGE}.{module}")

    def handler(self) -> Handler:
        return getattr(self._module(), self.target.partition(":")[2])

    def args_builder(self) -> Optional[ArgsBuilder]:
        own: Optional[ArgsBuilder] = getattr(self._module(), self.target.partition(":")[2] + "_args", None)

        def build(parser: argparse.ArgumentParser) -> None:
            # --debug after the command too (`loopwright init DIR --debug`), as the error hint suggests;
            # absent, it leaves the global option's value alone
            parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
            if own is not None:
                own(parser)
        return build


COMMANDS: dict[str, Command] = {}


def register(command: Command) -> Command:
    if command.name in COMMANDS:
        raise ValueError(f"loopwright command {command.name!r} is declared twice")
    if ":" not in command.target:
        raise ValueError(f"command {command.name!r}: target {command.target!r} is not 'module:function'")
    COMMANDS[command.name] = command
    return command


for _command in (
    # the workspace: create it, look at it, export from it
    Command("init", "workspace:init", "create a workspace (or a new campaign in one)", workspace=False),
    Command("target", "target:target", "target check [SRC]: validate a target's contract before the first run "
                                        "(globs; on a workspace also gate, run, evaluator, noise, hidden files)"),
    Command("status", "workspace:status", "campaign, best, budget left, recent experiments"),
    Command("export-tsv", "workspace:export_tsv", "results.tsv in autoresearch's columns"),
    Command("report", "workspace:report", "write progress.png, report.md and results.tsv to .loopwright/reports/"),
    Command("config", "settings:config", "the human's operational settings (budget, schedules, connectors): "
                                         "show | get KEY | set KEY VALUE | unset KEY | edit | path"),
    Command("migrate", "settings:migrate", "move an old workspace's state (.loopwright/state.db, data, runs) out "
                                           "of the agent's reach; --relink after moving a workspace"),
    # the loop by hand, and the MCP server agents drive it through
    Command("serve", "loop:serve", "run the MCP server (stdio by default)"),
    Command("run-experiment", "loop:run_experiment", "run one experiment by hand (as an agent would)"),
    Command("score", "loop:score", "score the latest (or a given) experiment"),
    Command("revert", "loop:revert", "reset train.py to the best (or a given) version"),
    Command("budget", "loop:budget", "remaining budget and should_stop"),
    Command("stop", "loop:stop", "ask the loop to stop at the next budget check"),
    Command("approve", "mcp_server.cli.approvals:approve", "approve a change that waits (autonomy approve-keeps / "
                                                           "approve-runs) and apply it; --apply retries"),
    Command("reject", "mcp_server.cli.approvals:reject", "reject a change that waits: reject ID --why REASON"),
    Command("replay", "mcp_server.cli.replay:replay", "re-run each kept change against its parent on fresh "
                                                      "seeds, interleaved, and say whether it holds"),
    Command("mechanisms", "mcp_server.cli.mechanisms:mechanisms", "search mechanisms: list, propose FILE, "
                                                                  "activate, revert; the built-in outer loop (auto "
                                                                  "on|off, step)"),
    # agents
    Command("run", "agents:run", "run an agent session on the workspace (the built-in agent needs no API key "
                                 "or network)"),
    Command("demo", "agents:demo", "the main job in one command: a fresh workspace, a short built-in-agent "
                                   "campaign shown live, and the report (no agent, API key or network needed)",
            workspace=False),
    Command("launch", "agents:launch", "run one headless claude / codex / builtin session, recorded in the ledger "
                                       "(budget caps, wall-clock limit)"),
    # what starts sessions and what tells people
    Command("cron", "triggers:cron", "start agent sessions on the schedules in the loop's settings "
                                     "(`loopwright config set schedule.0.cron ...`)"),
    Command("webhook", "triggers:webhook", "receive GitHub / Slack / Jira / signed webhooks that start sessions"),
    Command("notify", "triggers:notify", "deliver pending Slack / Jira messages now"),
    Command("dashboard", "dashboard:dashboard", "a live browser dashboard of the campaign (--all: every "
                                                "workspace): chart, experiments, Approve / Reject; loopback only"),
    # the clients' side: wiring checks, Codex config, the hook entry point
    Command("doctor", "clients:doctor", "check the workspace, server, hooks and agent CLIs; say what to fix"),
    Command("wiring", "clients:wiring", "how Claude Code / Codex reach loopwright here (plugin or workspace files, "
                                        "chosen at init with --wiring) and whether anything doubles it"),
    Command("plugin", "plugin:plugin", "plugin install: write the Claude Code / Codex plugin and a local "
                                       "marketplace from this package (its server runs this Python)", workspace=False),
    Command("codex-config", "clients:codex_config", "print (or --write) Codex config.toml entries for this workspace"),
    Command("guard", "clients:guard", "hook entry point used by Claude Code and Codex (reads stdin)", workspace=False),
):
    register(_command)


def add_workspace_arg(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--workspace", "-w", default=None,
                        help="workspace directory (default: $LOOPWRIGHT_WORKSPACE or the current directory)")
    return parser


def chosen_command(argv: list[str]) -> Optional[str]:
    """The command named on the command line (the first word that is not a global option)."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None
