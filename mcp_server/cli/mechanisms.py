"""`loopwright mechanisms`: list, propose, activate and revert search mechanisms; switch the built-in
outer loop on or off (it then steps on every suggest_next), or run one step of it by hand."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def mechanisms_args(sp) -> None:
    sp.add_argument("action", choices=["list", "auto", "step", "propose", "activate", "revert"])
    sp.add_argument("arg", nargs="?", default=None, help="auto: on|off; propose: FILE; activate/revert: NAME")
    sp.add_argument("--name", default=None, help="propose: the mechanism's name (default: the file's stem)")
    sp.add_argument("--window", type=int, default=None, help="trial window in experiments")
    sp.add_argument("--reason", default="reverted by hand", help="revert: why")


def _fail(msg: str) -> int:
    print(f"loopwright mechanisms: {msg}", file=sys.stderr)
    return 2


def mechanisms(args) -> int:
    from mcp_server.loop.engine import Engine
    from mcp_server.mechanisms import registry, trial

    with Engine(args.workspace) as eng:
        try:
            if args.action == "list":
                trial.tick(eng)
                out = {"outer_builtin": trial.outer_enabled(eng.ledger), "mechanisms": registry.listing(eng.ledger)}
            elif args.action == "auto":
                if args.arg not in ("on", "off"):
                    return _fail("auto takes on or off")
                trial.set_outer(eng.ledger, args.arg == "on", args.window)
                out = {"outer_builtin": args.arg == "on"}
            elif args.action == "step":
                out = {"activated": trial.outer_step(eng, window=args.window)}
            elif args.action == "propose":
                if not args.arg or not Path(args.arg).is_file():
                    return _fail("propose takes the mechanism's .py file")
                res = registry.propose(eng, args.name or Path(args.arg).stem, Path(args.arg).read_text(),
                                       author="cli")
                out = res.__dict__
            elif args.action == "activate":
                out = registry.activate(eng, args.arg or "", window=args.window or registry.DEFAULT_WINDOW,
                                        author="cli")
            else:
                out = registry.revert(eng, args.arg or "", args.reason)
        except registry.MechanismError as e:
            return _fail(str(e))
    print(json.dumps(out, indent=2, default=str))
    return 0 if out.get("valid", True) else 1
