"""The built wheel is complete: `python -m build`, install it (not -e) into a fresh virtualenv, then
`loopwright init` and one experiment work from it (issue 9: the wheel once shipped no benchmark)."""
from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
PLUGIN_DIRS = (".claude-plugin", ".codex-plugin", ".agents", "hooks", "skills", "agents", "bin")   # + .mcp.json


def _run(argv, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, argv))}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def _source_copy(dest: Path) -> Path:
    """What the sdist would hold, outside the shared working tree (a build writes build/ and egg-info)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "out", "data")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    for name in ("mcp_server", "bench", *PLUGIN_DIRS):
        shutil.copytree(REPO / name, dest / name, ignore=ignore)
    shutil.copy2(REPO / ".mcp.json", dest / ".mcp.json")
    # The bundled train.py stops after two steps in this copy: the smoke run then does not depend on the
    # machine's load (the campaign's baseline runs the pinned train.py on every baseline seed).
    train = dest / "bench" / "gpt" / "train.py"
    src, n = re.subn(r"^MAX_STEPS = \d+", "MAX_STEPS = 2", train.read_text(), count=1, flags=re.M)
    assert n == 1, "bench/gpt/train.py must define MAX_STEPS"
    train.write_text(src)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = _source_copy(tmp_path_factory.mktemp("src"))
    dist = tmp_path_factory.mktemp("dist")
    # --no-isolation: build with the setuptools already here (no download; CI installs the same)
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(src)], timeout=300)
    (whl,) = dist.glob("loopwright-*.whl")
    return whl


def test_wheel_holds_every_module_and_the_benchmark(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {p.relative_to(REPO).as_posix() for p in (REPO / "mcp_server").rglob("*.py")
                if "__pycache__" not in p.parts}
    assert expected - names == set(), "modules missing from the wheel"
    for f in ("prepare.py", "evaluate.py", "pt2audit.py", "train.py", "program.md"):
        assert f"mcp_server/_bench/gpt/{f}" in names
    # the bundled targets (loopwright init --target copies them): every file, hidden/ and tests/ included
    targets = {p.relative_to(REPO / "bench").as_posix() for p in (REPO / "bench" / "targets").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert targets and {f"mcp_server/_bench/{f}" for f in targets} - names == set(), "bundled target files missing"
    # the plugin's files (issue 24 item 9: `loopwright plugin install` writes the plugin from them)
    plugin = {p.relative_to(REPO).as_posix() for d in PLUGIN_DIRS for p in (REPO / d).rglob("*") if p.is_file()}
    assert {f"mcp_server/_plugin/{f}" for f in plugin | {".mcp.json"}} - names == set(), "plugin files missing"
    from mcp_server import __version__
    assert wheel.name.startswith(f"loopwright-{__version__}-")


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh virtualenv with the wheel installed (not -e)."""
    venv = tmp_path_factory.mktemp("wheel-venv") / "venv"
    # torch and the other dependencies come from this interpreter's site-packages (no download)
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], timeout=120)
    py = venv / "bin" / "python"
    if sys.prefix != sys.base_prefix:
        # run from a virtualenv (as the README sets up): --system-site-packages sees the base interpreter's
        # packages, not this one's, so list this one's site-packages too (their own .pth files, the editable
        # loopwright's among them, are not processed: the wheel's copy is what imports; pip leaves a package
        # outside the new environment alone)
        purelib = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
        Path(purelib, "outer-site-packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    # the venv's own old setuptools would hide the one here that torch requires
    _run([str(py), "-m", "pip", "uninstall", "-y", "-q", "setuptools"], timeout=120)
    _run([str(py), "-m", "pip", "install", "--no-index", "--disable-pip-version-check", "-q", str(wheel)], timeout=300)
    return venv


def _env(venv: Path, tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LOOPWRIGHT_WORKSPACE")}
    env.update(LOOPWRIGHT_HOME=str(tmp_path / "home"), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    return env


def test_installed_wheel_inits_a_workspace_and_runs_an_experiment(venv, tmp_path):
    py, lw = venv / "bin" / "python", venv / "bin" / "loopwright"
    env = _env(venv, tmp_path)
    where = _run([str(py), "-c", "import mcp_server; print(mcp_server.__file__)"], cwd=tmp_path, env=env).stdout
    assert where.strip().startswith(str(venv)), f"the wheel is not what runs: {where}"

    _run([str(lw), "init", str(tmp_path / "ws"), "--time-budget", "30"], cwd=tmp_path, env=env, timeout=300)
    assert re.search(r"^MAX_STEPS = 2", (tmp_path / "ws" / "train.py").read_text(), re.M)   # the wheel's copy
    r = _run([str(lw), "run-experiment", "smoke", "-w", str(tmp_path / "ws")], cwd=tmp_path, env=env, timeout=600)
    res = json.loads(r.stdout)
    assert res["status"] == "ok", res
    assert isinstance(res["val_bpb"], float) and res["val_bpb"] > 0     # trained, evaluated, recorded
    status = json.loads(_run([str(lw), "status", "--json", "-w", str(tmp_path / "ws")], cwd=tmp_path, env=env,
                             timeout=120).stdout)
    assert status["summary"]["baseline_val_bpb"] is not None and status["recent"], status


def _plain_path(tmp_path: Path) -> str:
    """A PATH with sh and the usual tools but no loopwright (and no python that has it): what a claude
    started from another shell, a desktop launcher or cron may get."""
    bare = tmp_path / "bare-bin"
    bare.mkdir()
    for tool in ("sh", "cat", "tr", "awk", "readlink", "dirname", "head", "sed"):
        found = shutil.which(tool)
        if found:
            (bare / tool).symlink_to(found)
    return str(bare)


async def _list_tools(command: str, args: list, env: dict, cwd: Path) -> list[str]:
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=command, args=args, env=env, cwd=str(cwd))
    async with Client(stdio_client(params)) as c:
        return [t.name for t in (await c.list_tools()).tools]


def test_installed_wheel_writes_a_plugin_whose_server_starts_without_loopwright_on_path(venv, tmp_path):
    """Issue 24 item 9: the wheel carried no plugin files, and the checkout's plugin failed to connect when
    `loopwright` was not on the PATH claude started with."""
    import anyio

    lw, dest = venv / "bin" / "loopwright", tmp_path / "plugin"
    r = _run([str(lw), "plugin", "install", "--dest", str(dest)], cwd=tmp_path, env=_env(venv, tmp_path), timeout=120)
    assert "claude plugin marketplace add" in r.stdout and str(dest) in r.stdout
    py = str(venv / "bin" / "python")                    # the venv's interpreter, not what it links to
    server = json.loads((dest / ".mcp.json").read_text())["mcpServers"]["loopwright"]
    assert server["command"] == py and server["args"] == ["-m", "mcp_server.cli", "serve"]
    hooks = json.loads((dest / "hooks" / "hooks.json").read_text())["hooks"]
    assert {h["hooks"][0]["command"].split()[0] for h in sum(hooks.values(), [])} == {py}
    for rel in ("skills/research-loop/SKILL.md", "skills/outer-loop/SKILL.md", "agents/reviewer.md",
                ".claude-plugin/marketplace.json", ".agents/plugins/marketplace.json"):
        assert (dest / rel).read_text() == (REPO / rel).read_text(), rel
    from mcp_server import __version__
    assert json.loads((dest / ".claude-plugin" / "plugin.json").read_text())["version"] == __version__

    path = _plain_path(tmp_path)
    assert shutil.which("loopwright", path=path) is None and shutil.which("python3", path=path) is None
    ws = tmp_path / "not-a-workspace-yet"      # the server starts anyway (so an agent can read why)
    ws.mkdir()
    env = {"PATH": path, "HOME": str(tmp_path), "LOOPWRIGHT_HOME": str(tmp_path / "home"), "LOOPWRIGHT_WORKSPACE": str(ws)}
    # Claude Code's entry, as written
    tools = anyio.run(_list_tools, server["command"], server["args"], env, ws)
    assert "run_experiment" in tools, tools
    # Codex's entry: sh bin/loopwright-mcp-codex in the plugin folder
    codex = json.loads((dest / ".codex-plugin" / "mcp.json").read_text())["mcpServers"]["loopwright"]
    tools = anyio.run(_list_tools, codex["command"], codex["args"], env, dest)
    assert "run_experiment" in tools, tools
    # the guard hook runs from that PATH too, and still denies a write to the evaluator
    (ws / "loopwright.toml").write_text("")
    payload = json.dumps({"hook_event_name": "PreToolUse", "tool_name": "Write", "cwd": str(ws),
                          "tool_input": {"file_path": str(ws / "prepare.py"), "content": "x"}})
    hook = subprocess.run(["/bin/sh", "-c", hooks["PreToolUse"][0]["hooks"][0]["command"]], input=payload,
                          capture_output=True, text=True, env=env, cwd=ws, timeout=60)
    assert hook.returncode == 0 and '"deny"' in hook.stdout, (hook.stdout, hook.stderr)


CLAUDE = REPO / "tests" / "realclients" / "node_modules" / ".bin" / "claude"


@pytest.mark.realclient
@pytest.mark.skipif(not CLAUDE.exists(), reason="npm ci --prefix tests/realclients installs the real claude")
def test_real_claude_installs_the_written_plugin_and_connects_without_loopwright_on_path(venv, tmp_path):
    lw, dest = venv / "bin" / "loopwright", tmp_path / "plugin"
    _run([str(lw), "plugin", "install", "--dest", str(dest)], cwd=tmp_path, env=_env(venv, tmp_path), timeout=120)
    env = {"PATH": _plain_path(tmp_path), "HOME": str(tmp_path), "CLAUDE_CONFIG_DIR": str(tmp_path / "claude"),
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "LOOPWRIGHT_HOME": str(tmp_path / "home")}
    claude = str(CLAUDE.resolve())
    _run([claude, "plugin", "marketplace", "add", str(dest)], env=env, cwd=tmp_path, timeout=120)
    _run([claude, "plugin", "install", "loopwright@loopwright"], env=env, cwd=tmp_path, timeout=120)
    (tmp_path / "proj").mkdir()
    r = _run([claude, "mcp", "list"], env=env, cwd=tmp_path / "proj", timeout=180)
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("plugin:loopwright:loopwright"))
    assert "Connected" in line, r.stdout
