"""`loopwright config` (the human's operational settings) and `loopwright migrate`.

The settings live in the state directory, outside the workspace: the agent's shell
cannot write them (its client sandbox confines it to the workspace), so a budget
or a connector endpoint changes only when a person runs these commands.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path


def config_args(p) -> None:
    sub = p.add_subparsers(dest="action", metavar="show|get|set|unset|edit|path")
    show = sub.add_parser("show", help="print the settings (TOML), or every key with --keys")
    show.add_argument("--keys", action="store_true", help="list every settable key")
    show.add_argument("--json", action="store_true")
    g = sub.add_parser("get", help="print one value")
    g.add_argument("key")
    s = sub.add_parser("set", help="set KEY to VALUE (a TOML value: 4, 2.5, true, \"text\"; bare text is a string)")
    s.add_argument("key")
    s.add_argument("value")
    u = sub.add_parser("unset", help="back to the default (a whole [slack] or [jira] section is removed)")
    u.add_argument("key")
    sub.add_parser("edit", help="edit settings.toml in $VISUAL / $EDITOR (also a broken one); saved only if valid")
    sub.add_parser("path", help="print where the settings live")


def _open(args):
    from mcp_server.loop.workspace import Workspace

    return Workspace.find(getattr(args, "workspace", None))


def config(args) -> int:
    from mcp_server.loop import settings as setmod
    from mcp_server.loop.workspace import WorkspaceError

    action = args.action or "show"
    try:
        ws = _open(args)
        if action == "path":
            print(ws.settings_path)
            return 0
        if action == "edit":     # before loading them: edit is how a broken file gets fixed
            new = _edit(ws.settings_path)
            if new is None:
                print("no change")
                return 0
            setmod.save(ws.settings_path, new)
            print(f"saved {ws.settings_path}; the loop uses it at its next check")
            return 0
        current = ws.settings()
        if action == "show":
            if args.keys:
                print("\n".join(setmod.keys()))
            elif args.json:
                print(json.dumps(setmod.data_of(current), indent=2))
            else:
                print(f"# {ws.settings_path}")
                print(setmod.to_text(current), end="")
            return 0
        if action == "get":
            v = setmod.get(current, args.key)
            print(json.dumps(v) if isinstance(v, (dict, list)) else ("" if v is None else v))
            return 0
        if action == "set":
            new = setmod.set_value(current, args.key, args.value)
        elif action == "unset":
            new = setmod.unset(current, args.key)
        else:
            print(f"loopwright config: unknown action {action!r}; use show, get, set, unset, edit or path",
                  file=sys.stderr)
            return 2
        setmod.save(ws.settings_path, new)
    except (setmod.SettingsError, WorkspaceError) as e:
        print(f"loopwright config: {e}", file=sys.stderr)
        return 2
    try:
        shown = json.dumps(setmod.get(new, args.key))
    except setmod.SettingsError:
        shown = "(default)"
    shown = "(not set)" if shown == "null" else shown
    print(f"{args.key} = {shown}  (saved to {ws.settings_path}; the loop uses it at its next check)")
    return 0


def _edit(settings_path: Path):
    """Edit a copy of the settings file in $VISUAL / $EDITOR; the new settings once they are valid, None
    when unchanged. A broken file (invalid TOML or values) opens as it is, so that this is how to fix it;
    an invalid edit is offered again on a terminal, refused otherwise (nothing saved)."""
    from mcp_server.loop import settings as setmod

    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    try:
        text = setmod.to_text(setmod.load(settings_path))
    except setmod.SettingsError as e:
        text = settings_path.read_text(encoding="utf-8")
        print(f"loopwright config: {settings_path} is broken ({str(e).splitlines()[0]}); opening it as it is",
              file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="loopwright-settings-") as d:
        path = Path(d) / "settings.toml"
        path.write_text(text, encoding="utf-8")
        while True:
            try:
                rc = subprocess.call([*shlex.split(editor), str(path)])
            except OSError as e:
                raise setmod.SettingsError(f"cannot start the editor {editor!r} ({e.strerror or e}); set VISUAL or "
                                           "EDITOR to an installed one (e.g. EDITOR=nano), or fix "
                                           f"{settings_path} by hand") from None
            if rc != 0:
                raise setmod.SettingsError(f"the editor ({editor}) exited with {rc}; nothing saved")
            new_text = path.read_text(encoding="utf-8")
            if new_text == text:
                try:    # unchanged, but a broken file still is broken
                    setmod.parse(new_text, str(settings_path))
                except setmod.SettingsError as e:
                    raise setmod.SettingsError(f"no change made, and {e}") from None
                return None
            try:
                return setmod.parse(new_text, "the edited settings", hint=False)
            except setmod.SettingsError as e:
                if not (sys.stdin.isatty() and sys.stderr.isatty()):
                    raise setmod.SettingsError(f"{e}\nnothing saved; run `loopwright config edit` again") from None
                print(f"loopwright config: {e}", file=sys.stderr)
                answer = input("edit again? [Y/n] ").strip().lower()
                if answer not in ("", "y", "yes"):
                    raise setmod.SettingsError("nothing saved") from None


def migrate_args(p) -> None:
    p.add_argument("--relink", action="store_true",
                   help="the workspace directory was moved: record its new path in its state directory")


def migrate(args) -> int:
    from mcp_server.loop.setup import migrate_workspace, relink_workspace
    from mcp_server.loop.workspace import WorkspaceError

    root = Path(getattr(args, "workspace", None) or os.environ.get("LOOPWRIGHT_WORKSPACE") or Path.cwd())
    try:
        if args.relink:
            print(relink_workspace(root))
        else:
            for line in migrate_workspace(root):
                print(f"- {line}")
    except (WorkspaceError, OSError) as e:
        print(f"loopwright migrate: {e}", file=sys.stderr)
        return 2
    return 0
