"""The built wheel is complete: `python -m build`, install it (not -e) into a fresh virtualenv, then
`loopwright init` and one experiment work from it (issue 9: the wheel once shipped no benchmark)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _run(argv, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, argv))}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def _source_copy(dest: Path) -> Path:
    """What the sdist would hold, outside the shared working tree (a build writes build/ and egg-info)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "out", "data")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    for name in ("mcp_server", "bench"):
        shutil.copytree(REPO / name, dest / name, ignore=ignore)
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
    for f in ("prepare.py", "train.py", "program.md"):
        assert f"mcp_server/_bench/gpt/{f}" in names
    from mcp_server import __version__
    assert wheel.name.startswith(f"loopwright-{__version__}-")


def test_installed_wheel_inits_a_workspace_and_runs_an_experiment(wheel, tmp_path):
    venv = tmp_path / "venv"
    # torch and the other dependencies come from this interpreter's site-packages (no download)
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], timeout=120)
    py, lw = venv / "bin" / "python", venv / "bin" / "loopwright"
    # the venv's own old setuptools would hide the one here that torch requires
    _run([str(py), "-m", "pip", "uninstall", "-y", "-q", "setuptools"], timeout=120)
    _run([str(py), "-m", "pip", "install", "--no-index", "--disable-pip-version-check", "-q", str(wheel)], timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LOOPWRIGHT_WORKSPACE")}
    env.update(LOOPWRIGHT_HOME=str(tmp_path / "home"), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
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
