"""Command handlers: what each known program would write, delete, read or run. Each receives
(guard, argv, stdin text or None, env) and raises Denied on a forbidden effect."""
from __future__ import annotations

import os
import re

from mcp_server.guard.shell.args import (
    ASSIGNMENT,
    Arg,
    Denied,
    has_option,
    literal_text,
    option_values,
    parse_opts,
)
from mcp_server.guard.shell.git import handle_git
from mcp_server.guard.shell.handlers import Handler, Walk

_EDITORS = {"vi", "vim", "nvim", "view", "nano", "emacs", "ed", "ex", "pico", "micro", "joe", "kak", "hx"}
_COMPRESSORS = {"gzip", "gunzip", "bzip2", "bunzip2", "xz", "unxz", "zstd", "unzstd", "lz4", "lzma",
                "compress", "uncompress"}
_FIND_EXPR_STARTS = ("-", "(", "!", ")")


def _h_cd(g: Walk, args, stdin, env):
    pos = [a for a in args[1:] if not a.text.startswith("-")]
    if not pos:
        g.cwd = os.path.expanduser("~")
    elif pos[0].kind == "static":
        g.cwd = g.absolute(pos[0].text)


def _h_export(g: Walk, args, stdin, env):
    for a in args[1:]:
        m = ASSIGNMENT.match(a.text)
        if m:
            g.vars[m.group(1)] = a.text.partition("=")[2] if a.kind == "static" else None


def _h_delete(g: Walk, args, stdin, env):
    opts, pos = parse_opts(args[1:])
    recursive = has_option(opts, "-r", "-R", "--recursive")
    for a in pos:
        g.delete(a, f"{literal_text(args[0])} {a.shown}", recursive=recursive)


def _h_writes_all(short_val: str = "", long_val: tuple = ()):
    def handler(g: Walk, args, stdin, env):
        opts, pos = parse_opts(args[1:], short_val=short_val, long_val=long_val)
        for a in pos:
            g.write(a, f"{literal_text(args[0])} {a.shown}")
    return handler


def _h_chmod(g: Walk, args, stdin, env):
    name = literal_text(args[0])
    rest = args[1:]
    recursive = any(a.text in ("-R", "--recursive") for a in rest)
    flags = {"-R", "--recursive", "-v", "-c", "-f", "--verbose", "--changes", "--silent", "--quiet",
             "-h", "--no-dereference", "-H", "-L", "-P", "--preserve-root", "--no-preserve-root"}
    pos = [a for a in rest if a.text not in flags and not a.text.startswith("--")]
    has_ref = any(a.text.startswith("--reference") for a in rest)
    targets = pos if has_ref else pos[1:]          # first positional is the mode / owner
    for a in targets:
        g.write(a, f"{name} {a.shown}", recursive=recursive)


def _h_copy(move: bool):
    def handler(g: Walk, args, stdin, env):
        name = literal_text(args[0])
        opts, pos = parse_opts(args[1:], short_val="tSmog" if name == "install" else "tS",
                               long_val=("--target-directory", "--suffix", "--mode", "--owner", "--group"))
        recursive = move or has_option(opts, "-r", "-R", "-a", "--recursive", "--archive")
        tdir = option_values(opts, "-t", "--target-directory")
        if name == "install" and has_option(opts, "-d", "--directory"):
            for a in pos:
                g.write(a, f"install -d {a.shown}")
            return
        if tdir:
            dest, sources, into_dir = tdir[0], pos, True
        elif len(pos) >= 2:
            dest, sources = pos[-1], pos[:-1]
            into_dir = len(sources) > 1 or (dest.kind == "static" and os.path.isdir(g.absolute(dest.text)))
            into_dir = into_dir and not has_option(opts, "-T", "--no-target-directory")
        else:
            return
        for src in sources:
            if move:
                g.delete(src, f"{name} {src.shown}", recursive=True)
                g.replace(src, name)               # renaming train.py away fails in the sandbox too
            else:
                g.read(src, recursive=recursive)
            if into_dir:
                base = os.path.basename(src.text.rstrip("/")) or "."
                g.write(dest.derive(os.path.join(dest.text, base)), f"{name} into {dest.shown}",
                        recursive=recursive)
                if move:
                    g.replace(dest.derive(os.path.join(dest.text, base)), name)
        if not into_dir:
            g.write(dest, f"{name} onto {dest.shown}", recursive=recursive)
            if move:
                g.replace(dest, name)               # cp writes into the file (works); mv renames over it
    return handler


def _h_ln(g: Walk, args, stdin, env):
    # Both ends count: a link (hard or symbolic) to a frozen file is a way to write it later.
    opts, pos = parse_opts(args[1:], short_val="tS", long_val=("--target-directory", "--suffix"))
    tdir = option_values(opts, "-t", "--target-directory")
    for a in pos + tdir:
        g.write(a, f"ln {a.shown} (a link to a protected file is a way to write it)")
    if len(pos) == 1 and not tdir:
        g.write(pos[0].derive(os.path.basename(pos[0].text)), "ln into the current directory")


def _h_rsync(g: Walk, args, stdin, env):
    opts, pos = parse_opts(args[1:], short_val="efT", long_val=("--exclude", "--include", "--filter",
                                                               "--temp-dir", "--backup-dir", "--rsh"))
    if len(pos) < 2:
        return
    for src in pos[:-1]:
        if ":" not in src.text:
            g.read(src, recursive=True)
    dest = pos[-1]
    if ":" not in dest.text:
        g.write(dest, f"rsync to {dest.shown}", recursive=True)


def _h_dd(g: Walk, args, stdin, env):
    for a in args[1:]:
        if a.text.startswith("of="):
            g.write(a.derive(a.text[3:]), "dd of=")


def _h_tee(g: Walk, args, stdin, env):
    opts, pos = parse_opts(args[1:])
    for a in pos:
        g.write(a, f"tee {a.shown}")
        if a.kind == "static" and stdin is not None:
            g.written[g.absolute(a.text)] = stdin


def _h_truncate(g: Walk, args, stdin, env):
    opts, pos = parse_opts(args[1:], short_val="sr", long_val=("--size", "--reference"))
    for a in pos:
        g.write(a, f"truncate {a.shown}")


def _h_touch(g: Walk, args, stdin, env):
    opts, pos = parse_opts(args[1:], short_val="dtr", long_val=("--date", "--reference", "--time"))
    for a in pos:
        g.write(a, f"touch {a.shown}")


def _h_sed(g: Walk, args, stdin, env):
    opts, pos = parse_opts(args[1:], short_val="efl", long_val=("--expression", "--file", "--line-length"))
    scripts = [v.text for v in option_values(opts, "-e", "--expression")]
    files = pos
    if not scripts and not option_values(opts, "-f", "--file") and pos:
        scripts, files = [pos[0].text], pos[1:]
    if _sed_in_place(args[1:]):
        for a in files:
            g.write(a, f"sed -i on {a.shown}")
            g.replace(a, "sed -i")
    for script in scripts:
        # sed's own w/W commands (and the s///w flag) write files; e runs a shell command
        for m in re.finditer(r"(?:^|[;}\n/0-9$gpIiMme])\s*[wW]\s*([^;\n}]+)", script):
            g.write(Arg(m.group(1).strip()), "sed's w command")
        for m in re.finditer(r"(?:^|[;}\n])\s*\d*\s*e\s+([^;\n}]+)", script):
            g.shell_text(m.group(1))
        if re.search(r"/[gpIiMm0-9]*e[gpIiMmw0-9]*\s*(?:$|[;}\n])", script) and g.policy.mentions(script):
            raise Denied("this sed script executes its pattern space as a shell command (s///e) and names a "
                         "protected path; use plain sed -n to read files.")


def _sed_in_place(args: list) -> bool:
    """-i, -i.bak, -ni, --in-place[=SUF]; a cluster stops at e/f/l, which take a value."""
    for a in args:
        t = a.text
        if t == "--in-place" or t.startswith("--in-place="):
            return True
        if t.startswith("-") and not t.startswith("--"):
            for ch in t[1:]:
                if ch == "i":
                    return True
                if ch in "efl":
                    break
    return False


def _perl_like(lang: str):
    """perl / ruby: -i edits files in place; -e code; otherwise the first positional is a script."""
    def handler(g: Walk, args, stdin, env):
        code, in_place, i = [], False, 1
        while i < len(args):
            t = args[i].text
            if t == "--":
                i += 1
                break
            if not t.startswith("-") or t == "-":
                break
            for j, ch in enumerate(t[1:], 1):
                if ch == "i":
                    in_place = True
                    break                       # the rest of the cluster is the backup suffix
                if ch in ("eE" if lang == "perl" else "e"):
                    rest = t[j + 1:]
                    if rest:
                        code.append(rest)
                    elif i + 1 < len(args):
                        code.append(args[i + 1].text)
                        i += 1
                    break
                if ch in ("MmIdDxlC0" if lang == "perl" else "rIxCEFK"):
                    break                       # the rest of the cluster is this option's value
            i += 1
        files = args[i:]
        for c in code:
            g.script(c, lang, f"{lang} -e")
        if not code:
            if files:
                g.script_file(files[0], files[1:], lang, stdin)
                files = files[1:]
            else:
                g.code_on_stdin(stdin, lang, lang)
        if in_place:
            for a in files:
                g.write(a, f"{lang} -i on {a.shown}")
                g.replace(a, f"{lang} -i")
    return handler


# The loopwright CLI is the human's: the agent works through the MCP tools. These read-only
# commands show nothing hidden (no test split scores), so they stay allowed.
_AGENT_CLI = {"status", "budget", "doctor", "--help", "-h", "--version"}
# Decisions on waiting changes (the autonomy slider) belong to a person, never to the agent.
_HUMAN_DECISIONS = {"approve", "reject"}


def loopwright_cli(module: str, rest: list):
    """`python -m <module> <rest>` or `loopwright <rest>`: the agent's subcommands pass, a person's
    decisions and loopwright internals are Denied."""
    if module not in ("mcp_server.cli", "mcp_server"):
        if module == "mcp_server.guard":
            return
        raise Denied(f"python -m {module} runs loopwright internals; use the loopwright MCP tools instead")
    words, texts = [], [a.text for a in rest]
    i = 0
    while i < len(texts):
        t = texts[i]
        if t in ("-w", "--workspace"):
            i += 2                      # an option with a value
            continue
        if not t.startswith("-") or t in _AGENT_CLI:
            words.append(t)
        i += 1
    sub = words[0] if words else "--help"
    if sub in _HUMAN_DECISIONS:
        raise Denied(f"`loopwright {sub}` decides a change that waits for a person's approval; the agent never "
                     "decides it. Keep working from the current best; the Stop hook lets you stop when "
                     "everything waits on a person.")
    if sub not in _AGENT_CLI:
        raise Denied(f"`loopwright {sub}` is for the person running the loop (it can reveal the hidden test "
                     "split or change the campaign). Use the MCP tools: state_read, run_experiment, score, "
                     "revert, budget_check, note, suggest_next.")


def _h_loopwright(g: Walk, args, stdin, env):
    loopwright_cli("mcp_server.cli", args[1:])


def _h_python(g: Walk, args, stdin, env):
    g.python_command(args, stdin)


def _h_node(g: Walk, args, stdin, env):
    opts, pos = parse_opts(args[1:], short_val="ep", long_val=("--eval", "--print", "--require", "-r"),
                           first_positional_stops=True)
    code = option_values(opts, "-e", "-p", "--eval", "--print")
    if code:
        g.script(code[0].text, "node", "node -e")
    elif pos:
        g.script_file(pos[0], pos[1:], "node", stdin)
    else:
        g.code_on_stdin(stdin, "node", "node")


def _h_eval_code(flag: str, lang: str):
    """php -r, lua -e, Rscript -e, deno eval...: a code string after a flag."""
    def handler(g: Walk, args, stdin, env):
        for i, a in enumerate(args[1:], 1):
            if a.text == flag and i + 1 < len(args):
                g.script(args[i + 1].text, lang, f"{literal_text(args[0])} {flag}")
                return
        pos = [a for a in args[1:] if not a.text.startswith("-")]
        if pos:
            g.script_file(pos[0], pos[1:], lang, stdin)
    return handler


def _h_awk(g: Walk, args, stdin, env):
    opts, pos = parse_opts(args[1:], short_val="fvFi", long_val=("--file", "--assign", "--include"))
    progs = [g.file_text(f) for f in option_values(opts, "-f", "--file")]
    files = pos
    if not option_values(opts, "-f", "--file") and pos:
        progs, files = [pos[0].text], pos[1:]
    for p in progs:
        g.script(p, "awk", "awk program")
    if any(v.text == "inplace" for v in option_values(opts, "-i", "--include")):
        for a in files:
            g.write(a, f"awk -i inplace on {a.shown}")


def _h_sh(g: Walk, args, stdin, env):
    i = 1
    while i < len(args):
        t = args[i].text
        if t in ("-o", "+o", "-O", "+O") and i + 1 < len(args):
            i += 2
            continue
        if t == "--":
            i += 1
            break
        if (t.startswith("-") or t.startswith("+")) and len(t) > 1:
            if "c" in t[1:] and not t.startswith("--"):
                if i + 1 < len(args):
                    g.shell_text(args[i + 1].text)
                return
            i += 1
            continue
        break
    if i < len(args) and args[i].text != "-":
        g.script_file(args[i], args[i + 1:], "sh", stdin)
    else:
        g.code_on_stdin(stdin, "sh", literal_text(args[0]))


def _h_alias(g: Walk, args, stdin, env):
    for a in args[1:]:
        name, eq, value = a.text.partition("=")
        if eq:
            g.aliases[name] = value


def _h_eval(g: Walk, args, stdin, env):
    g.shell_text(" ".join(a.text for a in args[1:]))


def _h_source(g: Walk, args, stdin, env):
    if len(args) > 1:
        g.script_file(args[1], args[2:], "sh", stdin)


def _h_find(g: Walk, args, stdin, env):
    i = 1
    while i < len(args) and args[i].text in ("-H", "-L", "-P", "-O0", "-O1", "-O2", "-O3"):
        i += 1
    roots = []
    while i < len(args) and not args[i].text.startswith(_FIND_EXPR_STARTS):
        roots.append(args[i])
        i += 1
    roots = roots or [Arg(".")]
    expr = args[i:]
    j = 0
    while j < len(expr):
        t = expr[j].text
        if t == "-delete":
            for r in roots:
                g.delete(r, "find -delete", recursive=True)
        elif t in ("-exec", "-execdir", "-ok", "-okdir"):
            k = j + 1
            while k < len(expr) and expr[k].text not in (";", "+"):
                k += 1
            for r in roots:   # {} stands for any path under the root
                under = os.path.join(g.absolute(r.text) if r.kind == "static" else "*", "*")
                sub = [Arg(a.text.replace("{}", under), "dynamic", f"{a.shown} (each path find visits)")
                       if "{}" in a.text else a for a in expr[j + 1:k]]
                if sub:
                    g.dispatch(sub, None, {})
            j = k
        elif t in ("-fprint", "-fprint0", "-fls", "-fprintf") and j + 1 < len(expr):
            g.write(expr[j + 1], f"find {t}")
            j += 1
        j += 1


_SQLITE_VALUE_OPTS = {"-cmd", "-init", "-separator", "-newline", "-nullvalue", "-vfs", "-maxsize",
                     "-mmap", "-pagecache", "-lookaside", "-heap", "-A", "-archive"}


def _h_sqlite(g: Walk, args, stdin, env):
    pos, sql, i = [], [], 1
    while i < len(args):
        t = args[i].text
        if t in _SQLITE_VALUE_OPTS and i + 1 < len(args):
            sql.append(args[i + 1].text)
            i += 2
            continue
        if not t.startswith("-"):
            pos.append(args[i])
        i += 1
    if pos:
        for path in g.concrete(pos[0]):
            if g.policy.in_state_dir(path, g.cwd):
                raise Denied(f"{pos[0].text} is in the loop's state directory; only the loop opens it. "
                             "Use the state_read tool to see past experiments.")
        sql += [a.text for a in pos[1:]]
    if g.policy.mentions_state_dir("\n".join(sql) + "\n" + (stdin or "")):
        raise Denied("this SQL attaches a file in the loop's state directory; use the state_read tool.")


def _h_patch(g: Walk, args, stdin, env):
    opts, pos = parse_opts(args[1:], short_val="pioFdDrBVYzg",
                           long_val=("--input", "--output", "--directory", "--strip", "--reject-file"))
    if has_option(opts, "--dry-run", "-C", "--check"):
        return
    for v in option_values(opts, "-o", "--output"):
        g.write(v, "patch -o")
    if pos:
        g.write(pos[0], f"patch {pos[0].shown}")
        return
    inputs = option_values(opts, "-i", "--input")
    text = g.file_text(inputs[0]) if inputs else stdin
    if text is None:
        raise Denied("patch without a target file changes files named inside the patch, which the guard "
                     "cannot read here; edit train.py with your edit tool instead.")
    for m in re.finditer(r"^(?:\+\+\+|---) (\S+)", text, re.M):
        name = m.group(1)
        if name != "/dev/null":
            for cand in {name, re.sub(r"^[ab]/", "", name)}:
                g.write(Arg(cand), f"patch of {name}")


def _h_apply_patch(g: Walk, args, stdin, env):
    text = args[1].text if len(args) > 1 else stdin
    if text is None:
        return
    problem = g.policy.apply_patch_problem(text, g.cwd)
    if problem:
        raise Denied(problem)


def _h_tar(g: Walk, args, stdin, env):
    rest = args[1:]
    if rest and not rest[0].text.startswith("-"):
        rest = [rest[0].derive("-" + rest[0].text)] + rest[1:]     # old style: tar xzf a.tgz
    opts, pos = parse_opts(rest, short_val="fCTXbHIKN", long_val=("--file", "--directory", "--exclude",
                                                                   "--files-from", "--exclude-from"))
    where = (option_values(opts, "-C", "--directory") or [Arg(".")])[0]
    if has_option(opts, "-x", "--extract", "--get"):
        g.write(where, f"tar extracting into {where.shown}", recursive=True)
    if has_option(opts, "-c", "-r", "-u", "-A", "--create", "--append", "--update", "--concatenate"):
        for v in option_values(opts, "-f", "--file"):
            g.write(v, "tar -f")
        for a in pos:
            g.read(a.derive(os.path.join(where.text, a.text)), recursive=True)
            if has_option(opts, "--remove-files"):
                g.delete(a.derive(os.path.join(where.text, a.text)), "tar --remove-files", recursive=True)


def _h_unzip(g: Walk, args, stdin, env):
    opts, pos = parse_opts(args[1:], short_val="dxP")
    if has_option(opts, "-l", "-t", "-v", "-p", "-Z", "-z"):
        return
    where = (option_values(opts, "-d") or [Arg(".")])[0]
    g.write(where, f"unzip extracting into {where.shown}", recursive=True)


def _h_zip(g: Walk, args, stdin, env):
    opts, pos = parse_opts(args[1:], short_val="xibnt")
    if pos:
        g.write(pos[0], f"zip {pos[0].shown}")
        for a in pos[1:]:
            g.read(a, recursive=has_option(opts, "-r", "-R"))
            if has_option(opts, "-m", "--move"):
                g.delete(a, f"zip -m {a.shown} (deletes it)", recursive=True)


def _h_compress(g: Walk, args, stdin, env):
    opts, pos = parse_opts(args[1:], short_val="S")
    if has_option(opts, "-c", "--stdout", "-l", "--list", "-t", "--test"):
        return
    for a in pos:
        g.write(a, f"{literal_text(args[0])} {a.shown} (replaces the file)")


def _h_download(out_flags: tuple):
    def handler(g: Walk, args, stdin, env):
        for i, a in enumerate(args[1:], 1):
            if a.text in out_flags and i + 1 < len(args):
                g.write(args[i + 1], f"{literal_text(args[0])} {a.shown}")
            elif any(a.text.startswith(f + "=") for f in out_flags if f.startswith("--")):
                g.write(a.derive(a.text.partition("=")[2]), literal_text(args[0]))
    return handler


def _h_sort(g: Walk, args, stdin, env):
    opts, pos = parse_opts(args[1:], short_val="otkSTt", long_val=("--output",))
    for v in option_values(opts, "-o", "--output"):
        g.write(v, "sort -o")


def _h_second_positional(g: Walk, args, stdin, env):
    """uniq IN OUT, xxd -r IN OUT: the second positional is written."""
    pos = [a for a in args[1:] if not a.text.startswith("-")]
    if len(pos) >= 2:
        g.write(pos[1], f"{literal_text(args[0])} {pos[1].shown}")


HANDLERS: dict[str, Handler] = {
    "loopwright": _h_loopwright,
    "cd": _h_cd, "pushd": _h_cd, "export": _h_export, "declare": _h_export, "typeset": _h_export,
    "local": _h_export, "readonly": _h_export,
    "rm": _h_delete, "unlink": _h_delete, "rmdir": _h_delete, "shred": _h_delete, "srm": _h_delete,
    "touch": _h_touch, "truncate": _h_truncate, "mkdir": _h_writes_all("m", ("--mode",)),
    "mkfifo": _h_writes_all("m"), "mknod": _h_writes_all("m"), "fallocate": _h_writes_all("lon"),
    "chmod": _h_chmod, "chown": _h_chmod, "chgrp": _h_chmod, "chattr": _h_chmod, "setfacl": _h_chmod,
    "chcon": _h_chmod, "chflags": _h_chmod, "setfattr": _h_writes_all("nvx"),
    "cp": _h_copy(move=False), "install": _h_copy(move=False), "mv": _h_copy(move=True),
    "ln": _h_ln, "link": _h_ln, "rsync": _h_rsync, "dd": _h_dd, "tee": _h_tee,
    "sed": _h_sed, "gsed": _h_sed, "perl": _perl_like("perl"), "ruby": _perl_like("ruby"),
    "node": _h_node, "bun": _h_node, "deno": _h_eval_code("eval", "node"),
    "php": _h_eval_code("-r", "php"), "lua": _h_eval_code("-e", "lua"), "Rscript": _h_eval_code("-e", "R"),
    "python": _h_python, "awk": _h_awk, "sh": _h_sh, "eval": _h_eval, "source": _h_source, ".": _h_source,
    "alias": _h_alias, "find": _h_find, "git": handle_git, "sqlite3": _h_sqlite, "patch": _h_patch,
    "apply_patch": _h_apply_patch, "applypatch": _h_apply_patch,
    "tar": _h_tar, "bsdtar": _h_tar, "unzip": _h_unzip, "zip": _h_zip,
    "curl": _h_download(("-o", "--output")), "wget": _h_download(("-O", "--output-document")),
    "sort": _h_sort, "uniq": _h_second_positional, "xxd": _h_second_positional,
    "iconv": _h_download(("-o", "--output")),
    **{e: _h_writes_all("c", ("-c", "--cmd")) for e in _EDITORS},
    **{c: _h_compress for c in _COMPRESSORS},
}
