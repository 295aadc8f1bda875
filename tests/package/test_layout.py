"""The package's shape: it parses as Python 3.10, uses no newer stdlib unguarded, has no import
cycles (function-local and TYPE_CHECKING imports included), and the wheel's package list names every package."""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "mcp_server"
OLDEST = (3, 10)

# Standard-library modules and names that appeared after 3.10: importing one needs a guard
# (try/except ImportError, or `if sys.version_info >= ...`).
NEWER_MODULES = {"tomllib", "wsgiref.types"}
NEWER_NAMES = {
    "typing": {"Self", "LiteralString", "Never", "assert_never", "assert_type", "reveal_type", "TypeVarTuple",
               "Unpack", "Required", "NotRequired", "dataclass_transform", "override", "TypeAliasType",
               "get_overloads", "clear_overloads"},
    "enum": {"StrEnum", "ReprEnum", "verify", "EnumCheck", "FlagBoundary", "member", "nonmember", "global_enum"},
    "datetime": {"UTC"},
    "asyncio": {"TaskGroup", "timeout", "timeout_at", "Runner", "Barrier"},
    "hashlib": {"file_digest"},
    "itertools": {"batched"},
    "contextlib": {"chdir"},
    "operator": {"call"},
    "logging": {"getLevelNamesMapping"},
}


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py")) + sorted((REPO / "bench" / "gpt").glob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def test_every_module_parses_as_python_310():
    bad = []
    for path in _sources():
        try:
            ast.parse(path.read_text(encoding="utf-8"), str(path), feature_version=OLDEST)
        except SyntaxError as e:
            bad.append(f"{path.relative_to(REPO)}:{e.lineno}: {e.msg}")
    assert not bad, "syntax newer than Python 3.10:\n" + "\n".join(bad)


def _guarded_lines(tree: ast.AST) -> set[int]:
    """Lines inside `try: ... except ImportError/ModuleNotFoundError` or `if sys.version_info ...`."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        guarded = False
        if isinstance(node, ast.Try):
            names = {ast.unparse(h.type) for h in node.handlers if h.type is not None}
            guarded = any(n in ("ImportError", "ModuleNotFoundError", "AttributeError") or "ImportError" in n
                          for n in names)
        elif isinstance(node, ast.If):
            guarded = "version_info" in ast.unparse(node.test)
        if guarded:
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _newer_stdlib_uses(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name in NEWER_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module in NEWER_MODULES:
                found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                      if a.name in NEWER_NAMES.get(node.module, ())]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.attr in NEWER_NAMES.get(node.value.id, ()):
                found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return sorted(found)


def test_no_unguarded_stdlib_newer_than_310():
    bad = []
    for path in _sources():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        guarded = _guarded_lines(tree)
        bad += [f"{path.relative_to(REPO)}:{line}: {what}" for line, what in _newer_stdlib_uses(tree)
                if line not in guarded]
    assert not bad, ("standard library newer than Python 3.10 without a guard (try/except ImportError "
                     "or a sys.version_info check):\n" + "\n".join(bad))


def test_the_newer_stdlib_check_sees_what_it_must():
    tree = ast.parse("import tomllib\nfrom typing import Self\nimport asyncio\nasyncio.TaskGroup()\n"
                     "try:\n    import tomllib\nexcept ModuleNotFoundError:\n    import tomli as tomllib\n")
    uses = _newer_stdlib_uses(tree)
    assert [w for _, w in uses] == ["tomllib", "typing.Self", "asyncio.TaskGroup", "tomllib"]
    assert [line for line, _ in uses if line not in _guarded_lines(tree)] == [1, 2, 4]


# --------------------------------------------------------------------------- import cycles

def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def module_imports(tree: ast.AST, mod: str, is_package: bool, modules: set[str],
                   type_checking: bool = True) -> set[str]:
    """The package modules `mod` imports anywhere (function bodies included; `if TYPE_CHECKING:` blocks too
    unless type_checking is False). `from a.b import c` counts as a.b.c when that is a module."""
    skip = set() if type_checking else _type_checking_lines(tree)
    package = mod if is_package else mod.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for t in targets:
            while t and t not in modules:        # `import mcp_server.loop.engine as e`, `mcp_server.x.attr`
                t = t.rpartition(".")[0]
            if t and t != mod:
                found.add(t)
    return found


def import_graph(type_checking: bool = True) -> dict[str, set[str]]:
    """module -> the package modules it imports (see module_imports). An import behind TYPE_CHECKING never
    runs, but a cycle through one still ties the two modules together (issue 25): it counts by default."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {mod: module_imports(ast.parse(path.read_text(encoding="utf-8")), mod, path.name == "__init__.py",
                                set(paths), type_checking)
            for mod, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _edges_within(graph, comp) -> list[str]:
    return [f"{a} -> {b}" for a in comp for b in sorted(graph[a]) if b in comp]


def test_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_import_graph_sees_imports_behind_type_checking():
    planted = ("from typing import TYPE_CHECKING\n"
               "from pkg import a\n"
               "if TYPE_CHECKING:\n"
               "    from pkg.b import Thing\n"
               "def f():\n"
               "    from .c import helper\n")
    modules = {"pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d"}
    tree = ast.parse(planted)
    assert module_imports(tree, "pkg.d", False, modules) == {"pkg.a", "pkg.b", "pkg.c"}
    assert module_imports(tree, "pkg.d", False, modules, type_checking=False) == {"pkg.a", "pkg.c"}


# Cycles allowed through an import behind TYPE_CHECKING (the run-time graph has none): none now. Issue 25
# item 1 took engine<->asyncrun away: asyncrun and outcome type the engine by outcome.py's LoopEngine protocol.
CYCLE_EXEMPT: list[list[str]] = []


def _describe(graph, found) -> str:
    return "\n".join("  " + " | ".join(_edges_within(graph, comp)) for comp in found)


def test_no_import_cycles_in_the_package():
    runtime = import_graph(type_checking=False)
    assert "mcp_server.loop.engine" in runtime["mcp_server.mcp.server"]    # the graph sees real imports
    found = cycles(runtime)
    assert not found, "import cycles (function-local imports included):\n" + _describe(runtime, found)
    graph = import_graph()
    found = cycles(graph)
    extra = [comp for comp in found if comp not in CYCLE_EXEMPT]
    assert not extra, ("import cycles through `if TYPE_CHECKING:` imports (move the shared type to a module "
                       "both import, e.g. a Protocol as in guard/shell/handlers.py):\n" + _describe(graph, extra))
    gone = [comp for comp in CYCLE_EXEMPT if comp not in found]
    assert not gone, f"these cycles are gone: delete them from CYCLE_EXEMPT: {gone}"


# --------------------------------------------------------------------------- the wheel's package list

def test_the_wheel_lists_every_package():
    text = (REPO / "pyproject.toml").read_text()
    listed = set(re.findall(r'"(mcp_server(?:\.[\w]+)*)"', text.split("packages = [", 1)[1].split("]", 1)[0]))
    on_disk = {_module_name(p.parent) for p in PACKAGE.rglob("__init__.py")
               if "__pycache__" not in p.parts}
    assert on_disk - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - on_disk == {"mcp_server._bench", "mcp_server._plugin"}   # data packages


# --------------------------------------------------------------------------- SQL lives in the ledger

LEDGER = PACKAGE / "ledger"
# SQL as SQL (upper-case keywords in their grammar), not prose that happens to say "select" or "where".
_SQL = re.compile(
    r"\bSELECT\b.+\bFROM\b|\bINSERT\s+(?:OR\s+[A-Z]+\s+)?INTO\b|\bUPDATE\s+\w+\s+SET\b|\bDELETE\s+FROM\b"
    r"|\bWHERE\b|\b(?:CREATE|DROP|ALTER)\s+(?:TABLE|INDEX)\b|\bPRAGMA\b|\bIS\s+(?:NOT\s+)?NULL\b"
    r"|\w\s*(?:=|!=|<>|<|>)\s*\S+\s+(?:AND|OR)\s+\w|\bNOT\s+IN\s*\(|\bLIKE\s+['?]|\bCOALESCE\s*\("
    r"|^\s*[a-z_]+\s*(?:=|!=|<>|<=|>=|<|>)\s*(?:\?|'[^']*'|\d+)\s*$", re.S)   # a lone condition: "id > ?"


def sql_in(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of each string constant that reads as SQL (f-string parts included)."""
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _SQL.search(node.value)]


def test_the_sql_check_sees_what_it_must():
    planted = ('rows = led.experiments(1, where="is_baseline=0 AND confirm_of IS NULL")\n'
               'n = c.execute(f"SELECT COUNT(*) FROM {t} WHERE id=?", (1,))\n'
               'c.execute("UPDATE kv SET value=? WHERE key=?")\n'
               'c.execute("INSERT OR IGNORE INTO kv(key, value) VALUES (?,?)")\n'
               'q = "status NOT IN (\'running\')"\n'
               'led.experiments(1, where="id > ?")\n'
               'led.experiments(1, where="status != \'running\'")\n'
               'led.count(1, "is_baseline=0")\n'
               'msg = "select a run where the seed is fresh; update the settings and insert a note"\n'
               'ax.step(xs, ys, where="post")\n')
    assert sorted({line for line, _ in sql_in(ast.parse(planted))}) == [1, 2, 3, 4, 5, 6, 7, 8]


def test_no_sql_outside_the_ledger():
    """The ledger's methods are named questions; no other module writes SQL or passes a fragment of it."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if LEDGER in path.parents:
            continue
        bad += [f"{path.relative_to(REPO)}:{line}: {text[:80]!r}"
                for line, text in sql_in(ast.parse(path.read_text(encoding="utf-8")))]
    assert not bad, "SQL outside mcp_server/ledger/ (add a named method to the Ledger instead):\n" + "\n".join(bad)


# --------------------------------------------------------------------------- private names stay home

def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_definitions(tree: ast.AST) -> set[str]:
    """Private names a module defines: functions, classes, methods, assigned names and attributes."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            out.add(node.attr)
    return {n for n in out if _is_private(n)}


def private_uses(tree: ast.AST, module: str, modules: set[str], elsewhere: set[str],
                 is_package: bool = False) -> list[tuple[int, str]]:
    """(line, what) for each use of another package module's private name in `module`:
    `from pkg.x import _y`, `x._y` with x an imported package module, and `obj._y` where `_y` is defined
    in another package module and not in this one (an object of another module's class)."""
    package = module if is_package else module.rpartition(".")[0]
    own = private_definitions(tree)
    aliases: set[str] = set()      # local names bound to package modules
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base not in modules:
                continue
            for a in node.names:
                if f"{base}.{a.name}" in modules:
                    aliases.add(a.asname or a.name)
                elif _is_private(a.name):
                    found.append((node.lineno, f"from {base} import {a.name}"))
        elif isinstance(node, ast.Import):
            aliases.update(a.asname for a in node.names if a.asname and a.name in modules)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
            continue
        owner = node.value.id if isinstance(node.value, ast.Name) else None
        if owner in ("self", "cls"):
            continue
        if owner in aliases or (node.attr in elsewhere and node.attr not in own):
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_the_private_name_check_sees_what_it_must():
    modules = {"pkg", "pkg.a", "pkg.b"}
    planted = ("from pkg.a import _helper, public\n"        # 1: imported private name
               "from pkg import a\n"
               "from . import b as bee\n"
               "a._table\n"                                  # 4: a module's private attribute
               "bee._other()\n"                              # 5: the same through a relative alias
               "eng._pairs(c)\n"                             # 6: another module's class's private method
               "self._mine = 1\n"
               "x._mine\n"                                   # defined here: fine
               "os._exit(0)\n"                               # not the package's: not this check's business
               "a.__name__\n")
    uses = private_uses(ast.parse(planted), "pkg.c", modules, elsewhere={"_pairs", "_mine"})
    assert [line for line, _ in uses] == [1, 4, 5, 6]
    assert uses[0][1] == "from pkg.a import _helper"


def test_no_module_uses_another_modules_private_names():
    """A name shared between modules is public (no underscore, a docstring); a private one stays home."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    trees = {m: ast.parse(p.read_text(encoding="utf-8")) for m, p in paths.items()}
    defined = {m: private_definitions(t) for m, t in trees.items()}
    bad = []
    for mod, tree in trees.items():
        rel = str(paths[mod].relative_to(REPO))
        elsewhere = set().union(*(d for m, d in defined.items() if m != mod))
        bad += [f"{rel}:{line}: {what}" for line, what in private_uses(tree, mod, set(paths), elsewhere,
                                                                              paths[mod].name == "__init__.py")]
    assert not bad, ("private names used outside their module (make them public, or move the code to the "
                     "module that owns them):\n" + "\n".join(sorted(bad)))


def test_mypy_exempts_no_module():
    """mypy checks the whole package: no override block switches its errors off (issue 25 item 3)."""
    text = (REPO / "pyproject.toml").read_text()
    assert "[tool.mypy]" in text
    assert "ignore_errors" not in text and "[[tool.mypy.overrides]]" not in text


def test_tests_are_grouped_by_layer():
    """Tests sit in one folder per layer, never at tests/'s top level (the helpers do), and no two test files
    share a name: without __init__.py files pytest imports each by its basename (issue 25 item 7)."""
    tests = REPO / "tests"
    assert not sorted(p.name for p in tests.glob("test_*.py")), "a test file at tests/ top level: move it to its layer"
    files = list(tests.glob("*/test_*.py"))
    names = [p.name for p in files]
    assert len(files) > 50 and len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert not list(tests.glob("*/*/test_*.py")), "one level of layer folders"
