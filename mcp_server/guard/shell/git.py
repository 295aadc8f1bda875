"""git inside the loop's repository: read-only subcommands pass, anything that moves refs,
changes the index or the config is refused (the loop owns git)."""
from __future__ import annotations

import os
import re

from mcp_server.guard.shell.args import Denied, has_option, parse_opts
from mcp_server.guard.shell.handlers import GitCheck, Walk

_READONLY_GIT = {
    "status", "diff", "log", "show", "blame", "annotate", "grep", "ls-files", "ls-tree", "cat-file",
    "rev-parse", "rev-list", "describe", "shortlog", "merge-base", "name-rev", "show-ref",
    "for-each-ref", "whatchanged", "diff-tree", "diff-files", "diff-index", "count-objects", "fsck",
    "check-ignore", "check-attr", "var", "cherry", "range-diff", "show-branch", "verify-commit",
    "verify-tag", "help", "version", "difftool", "format-patch", "archive", "ls-remote",
}
_GIT_SAFE_CONFIG = re.compile(r"(color\.|core\.quotepath|core\.abbrev|log\.|i18n\.|advice\.|column\.)", re.I)

GIT_REASON = ("git {sub} changes the loop's git state. The loop owns git: run_experiment commits "
              "train.py, score keeps or resets the branch, and the revert tool restores train.py. "
              "Read-only git (status, diff, log, show) is fine.")


def handle_git(g: Walk, args, stdin, env):
    """The handler for `git ...`: in the loop's repository read-only git passes; anything that moves
    the loop's git state is Denied."""
    i, gdir, extra_dirs = 1, g.cwd, []
    while i < len(args) and args[i].text.startswith("-"):
        t = args[i].text
        if t == "-C" and i + 1 < len(args):
            gdir = os.path.normpath(os.path.join(gdir, args[i + 1].text))
            i += 2
            continue
        if t == "-c" and i + 1 < len(args):
            if not _GIT_SAFE_CONFIG.match(args[i + 1].text):
                raise Denied(f"git -c {args[i + 1].text} can make git run commands or change behaviour; "
                             "run git without -c.")
            i += 2
            continue
        if t.startswith(("--git-dir=", "--work-tree=")):
            extra_dirs.append(os.path.join(gdir, t.partition("=")[2]))
        elif t in ("--git-dir", "--work-tree", "--namespace", "--exec-path") and i + 1 < len(args):
            extra_dirs.append(os.path.join(gdir, args[i + 1].text))
            i += 1
        i += 1
    extra_dirs += [os.path.join(gdir, v) for k, v in env.items() if k in ("GIT_DIR", "GIT_WORK_TREE") and v]
    if not any(g.policy.inside(d, g.cwd) for d in [gdir] + extra_dirs):
        return                                   # not the loop's repository
    if i >= len(args):
        return
    sub, rest = args[i].text, args[i + 1:]
    g.cwd = gdir
    checker = _GIT_SUBCOMMANDS.get(sub)
    if checker is not None:
        checker(g, sub, rest)
    elif sub not in _READONLY_GIT:
        raise Denied(GIT_REASON.format(sub=sub))
    short = "o" if sub in ("format-patch", "archive") else ""
    for n, v in parse_opts(rest, short_val=short, long_val=("--output", "--output-directory"))[0]:
        if n in ("--output", "--output-directory", "-o") and v is not None:
            g.write(v, f"git {sub} {n}")


def _git_paths_editable(g: Walk, sub: str, paths: list):
    if not paths:
        raise Denied(GIT_REASON.format(sub=sub))
    for p in paths:
        if not (p.kind == "static" and g.policy.is_editable(p.text, g.cwd)):
            raise Denied(f"git {sub} {p.text}: only the editable files may be restored this way, and "
                         f"{GIT_REASON.format(sub=sub)}")


def _git_checkout(g: Walk, sub: str, rest: list):
    opts, pos = parse_opts(rest, short_val="bBc", long_val=("--orphan",))
    if has_option(opts, "-b", "-B", "-c", "--orphan", "--detach", "-p", "--patch", "--pathspec-from-file"):
        raise Denied(GIT_REASON.format(sub=sub))
    if any(a.text == "--" for a in rest):
        k = [a.text for a in rest].index("--")
        _git_paths_editable(g, sub, rest[k + 1:])
    else:
        _git_paths_editable(g, sub, pos)   # a non-path (branch, commit) here means switching HEAD


def _git_restore(g: Walk, sub: str, rest: list):
    opts, pos = parse_opts(rest, short_val="s", long_val=("--source",))
    if has_option(opts, "-S", "--staged", "-p", "--patch", "--pathspec-from-file"):
        raise Denied(GIT_REASON.format(sub=sub))
    _git_paths_editable(g, sub, pos)


def _git_listing(*allowed_subs: str, list_flags: tuple = (), bare_lists: bool = True):
    """branch/tag/stash/remote/...: fine while only listing."""
    def check(g: Walk, sub: str, rest: list):
        opts, pos = parse_opts(rest)
        if pos and pos[0].text in allowed_subs:
            return
        if not pos and (opts or bare_lists) and all(n in list_flags for n, _ in opts):
            return
        if has_option(opts, "-l", "--list") and sub in ("branch", "tag"):
            if not any(n in ("-d", "-D", "-m", "-M", "-c", "-C", "-f", "--force", "--delete") for n, _ in opts):
                return
        raise Denied(GIT_REASON.format(sub=sub))
    return check


def _git_config(g: Walk, sub: str, rest: list):
    opts, pos = parse_opts(rest, long_val=("--file", "-f", "--type", "--default"))
    readers = ("--get", "--get-all", "--get-regexp", "--list", "-l", "--get-urlmatch", "--show-origin",
               "--show-scope", "--name-only", "--null", "-z", "--global", "--local", "--system",
               "--includes", "--type", "--default", "--file", "-f", "--bool", "--int", "--path")
    if all(n in readers for n, _ in opts):
        if not pos or (pos[0].text in ("get", "list") and len(pos) <= 2):
            return
        if len(pos) == 1 and pos[0].text not in ("set", "unset", "edit", "rename-section", "remove-section"):
            return
    raise Denied("git config changes how git behaves for the loop (hooks, filters, aliases); "
                 "only reading config (git config --get / --list) is allowed.")


def _git_apply(g: Walk, sub: str, rest: list):
    if any(a.text in ("--check", "--stat", "--numstat", "--summary") for a in rest) and \
            not any(a.text == "--apply" for a in rest):
        return
    raise Denied("git apply writes files the guard cannot see in advance; apply changes to train.py "
                 "with your edit tool instead.")


def _git_reflog(g: Walk, sub: str, rest: list):
    if rest and rest[0].text in ("expire", "delete", "drop"):
        raise Denied(GIT_REASON.format(sub="reflog " + rest[0].text))


def _git_hash_object(g: Walk, sub: str, rest: list):
    if any(a.text == "-w" for a in rest):
        raise Denied(GIT_REASON.format(sub="hash-object -w"))


_GIT_SUBCOMMANDS: dict[str, GitCheck] = {
    "checkout": _git_checkout, "restore": _git_restore,
    "branch": _git_listing(list_flags=("-a", "-r", "-v", "-vv", "--all", "--remotes", "--verbose",
                                        "--show-current", "--no-color", "--color")),
    "tag": _git_listing(list_flags=("-n",)),
    "stash": _git_listing("list", "show", bare_lists=False),     # bare `git stash` pushes
    "remote": _git_listing("show", "get-url", list_flags=("-v", "--verbose")),
    "worktree": _git_listing("list"), "notes": _git_listing("list", "show"),
    "submodule": _git_listing("status", "summary"),
    "config": _git_config, "apply": _git_apply, "reflog": _git_reflog, "hash-object": _git_hash_object,
}

