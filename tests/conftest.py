"""Shared fixtures: small corpora and fast workspaces for loop tests."""
from __future__ import annotations

import os
import re
import shutil
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from bench_helpers import FROZEN_PY  # noqa: F401 - the frozen harness files, for the test modules

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench" / "gpt"

# Tests live in one folder per layer (tests/loop, tests/guard, ...); the helpers stay here. Put tests/ and every
# layer folder on sys.path so `from conftest import ...`, `from fakes ...` and the few imports of a sibling test
# module (`from test_approvals import held_keep`) work whatever order pytest collects the folders in.
_TESTS = Path(__file__).resolve().parent
for _d in [_TESTS, *sorted(p for p in _TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py")))]:
    if str(_d) not in sys.path:
        sys.path.insert(0, str(_d))

# Fast settings for loop tests: a few seconds of training, a small evaluation.
FAST = {"benchmark": {"time_budget": 25.0, "grace_seconds": 45.0, "eval_tokens": 8192},
        # the prior of the verdict tests' synthetic gains (0.05-0.1); the default (0.06) is the bundled
        # benchmark's measured noise at the demo's cost
        "noise": {"baseline_seeds": 2, "min_delta": 0.002, "sigma_prior": 0.02},
        "budget": {"max_experiments": 100, "max_hours": 10.0, "max_cost_usd": 10.0}}


# The start of a probe script run as the agent would run it: attempt(name, fn) records "ok" or the OSError's
# name in `out` (tests/e2e/test_deployments.py, tests/guard/test_workspace_configs.py).
PROBE_ATTEMPT = r'''
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = "ok"
    except OSError as e:
        out[name] = type(e).__name__
'''


@pytest.fixture(autouse=True, scope="session")
def _loopwright_home(tmp_path_factory):
    """Every test's state directories under one private temp home (never the user's ~/.local/share)."""
    if not os.environ.get("LOOPWRIGHT_HOME"):
        os.environ["LOOPWRIGHT_HOME"] = str(tmp_path_factory.mktemp("loopwright-home"))
    yield


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(k, raising=False)


def make_small_corpus(dest: Path, max_bytes: int = 400_000) -> Path:
    """A few hundred KB of real text (standard-library sources), enough to learn something in seconds."""
    dest.mkdir(parents=True, exist_ok=True)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for sub in ("json", "email", "http", "logging", "urllib", "xml/dom", "importlib"):
        for f in sorted((stdlib / sub).glob("*.py")):
            data = f.read_bytes()
            # ~3 KB documents: enough of them that every split gets some
            for i in range(0, len(data), 3000):
                (dest / f"{sub.replace('/', '_')}_{f.name}_{i}.txt").write_bytes(data[i:i + 3000])
            total += len(data)
            if total >= max_bytes:
                return dest
    return dest


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> Path:
    return make_small_corpus(tmp_path_factory.mktemp("corpus"))


# The loop tests' training recipe, whatever the bundled baseline's version: v1's (a cheap step: MLP ratio 1; the
# embedding at its own high rate; no warm-up or weight decay, so a few steps learn and an LR fix is a clear gain).
TEST_RECIPE = {"BATCH_SIZE": "8", "MLP_RATIO": "1", "EMBED_LR": "0.09", "WEIGHT_DECAY": "0.0", "BETA2": "0.95",
               "WARMUP_STEPS": "0", "WARMDOWN_FRAC": "0.2", "LOGIT_SOFTCAP": "15.0"}


def with_constants(src: str, values: dict[str, str]) -> str:
    """train.py's text with each top-level constant in values set (each must exist once)."""
    for name, value in values.items():
        src, n = re.subn(rf"^{name} = [^\s#]+", f"{name} = {value}", src, count=1, flags=re.M)
        assert n == 1, f"{name} is not a top-level constant of train.py"
    return src


# The bundled train.py with the constants the synthetic-ledger tests were written against, so retuning the
# benchmark's defaults does not change what those ledgers mean.
RECIPE_TRAIN = with_constants((BENCH / "train.py").read_text(), {**TEST_RECIPE, "BATCH_SIZE": "16", "LR": "0.004"})


def hobbled_bench(dest: Path, lr: str = "0.0002", max_steps: int = 24, tiny: bool = False) -> Path:
    """The bundled benchmark with a deliberately low learning rate, so a known fix is a real gain.

    Training is bounded by a step count (MAX_STEPS) well inside the time budget, so the outcome does
    not depend on how busy the machine is. tiny: two blocks of width 64 (a step costs ~1/8), for tests
    of the loop's flow that only need the LR fix to be a clear gain."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in (*FROZEN_PY, "program.md"):
        shutil.copyfile(BENCH / name, dest / name)
    src = (BENCH / "train.py").read_text()
    src, n = re.subn(r"^LR = [0-9.e-]+", f"LR = {lr}", src, count=1, flags=re.M)
    assert n == 1, "train.py must define LR as a top-level constant"
    (dest / "train.py").write_text(src)
    set_constant(dest / "train.py", "MAX_STEPS", str(max_steps))
    for name, value in TEST_RECIPE.items():
        set_constant(dest / "train.py", name, value)
    if tiny:
        set_constant(dest / "train.py", "DEPTH", "2")
        set_constant(dest / "train.py", "D_MODEL", "64")
    return dest


def set_constant(path: Path, name: str, value: str) -> None:
    src = path.read_text()
    src, n = re.subn(rf"^{name} = [^\s#]+", f"{name} = {value}", src, count=1, flags=re.M)
    assert n == 1, f"{name} not found in {path}"
    path.write_text(src)


# Data that the workspace's own prepare.py already made in this session, by what it was made from: the
# prepare.py's bytes, the tokenizer and SEQ_LEN it reads from loopwright.toml, and the corpus. `loopwright init`
# runs prepare.py (a Python process that imports numpy and reads the corpus) for every workspace; the tests'
# workspaces share a few corpora, so the same input gives the same bytes again. make_workspace reuses them (the
# lock, the ledger and the integrity checks then see exactly what a fresh run writes); init itself, prepare.py
# and their failures are tested without the cache (tests/bench/test_prepare.py, tests/cli, tests/e2e).
_PREPARED: dict[tuple, Path] = {}
_PREPARED_ROOT: list[Path] = []


def _corpus_stamp(corpus) -> tuple:
    """What a corpus folder (or file) holds, by name, size and change time: a test that writes a corpus again
    under the same path gets its data made anew."""
    path = Path(str(corpus))
    if not path.exists():
        return (str(corpus),)
    files = [path] if path.is_file() else sorted(f for f in path.rglob("*") if f.is_file())
    return (str(path),) + tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)


def _prepared_once():
    """A stand-in for mcp_server.loop.setup.prepare_data that runs it once per input and copies its output."""
    import hashlib
    import json
    import tempfile

    from mcp_server.loop import workspace as wsmod

    if not _PREPARED_ROOT:
        _PREPARED_ROOT.append(Path(tempfile.mkdtemp(prefix="lw-test-prepared-")))
        import atexit
        atexit.register(shutil.rmtree, _PREPARED_ROOT[0], True)

    def prepare_data(root: Path, data_dir: Path, corpus=None, prepare_py=None, timeout: float = 1800) -> dict:
        script = Path(prepare_py or root / "prepare.py")
        bench: dict = {}
        if (root / "loopwright.toml").is_file():
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib
            bench = tomllib.loads((root / "loopwright.toml").read_text()).get("benchmark", {})
        # what prepare.py's data depends on: its own code and constants, the tokenizer, the corpus (and
        # SEQ_LEN, which decides whether a split is too small)
        key = (hashlib.sha256(script.read_bytes()).hexdigest(), bench.get("tokenizer"), bench.get("seq_len"),
               _corpus_stamp(corpus))
        if key not in _PREPARED:
            made = _PREPARED_ROOT[0] / f"prepared-{len(_PREPARED)}"
            wsmod.prepare_data(root, made, corpus, prepare_py, timeout)
            _PREPARED[key] = made
        data_dir.mkdir(parents=True, exist_ok=True)
        for f in _PREPARED[key].iterdir():
            if f.is_file():
                shutil.copyfile(f, data_dir / f.name)
        return json.loads((data_dir / "meta.json").read_text())

    return prepare_data


def make_workspace(tmp: Path, corpus: Path, tag: str = "t", bench_dir: Path | None = None, **overrides):
    from mcp_server.loop import setup

    cfg = {k: dict(v) for k, v in FAST.items()}
    for section, values in overrides.items():
        cfg.setdefault(section, {}).update(values)
    real = setup.prepare_data
    setup.prepare_data = _prepared_once()
    try:
        return setup.init_workspace(tmp, tag=tag, corpus=str(corpus), overrides=cfg, bench_dir=bench_dir)
    finally:
        setup.prepare_data = real


def record_baseline(eng, values=(2.00, 2.01)) -> list[int]:
    """Ledger rows for a measured baseline, one per seed of the campaign's current seed set, so the
    next candidate pairs with them at once instead of first training the real baseline on each seed
    (a verdict or an attack is then tested without a minute of training per test)."""
    c = eng.campaign
    index, seeds = eng.seed_set(c)
    assert len(values) == len(seeds), f"{len(values)} baseline values for a seed set of {len(seeds)}"
    ids = []
    for i, (v, s) in enumerate(zip(values, seeds)):
        e = eng.ledger.start_experiment(c["id"], f"baseline {i}", is_baseline=1, commit_sha=c["best_commit"],
                                        parent_commit=c["best_commit"], seed=s, seed_set=index, role="baseline")
        eng.ledger.update_experiment(e, status="ok", val_bpb=v, verdict="baseline", finished_at=time.time())
        ids.append(e)
    return ids


def alive(pid: int) -> bool:
    """Running (a killed orphan may linger as a zombie until init reaps it)."""
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


# --------------------------------------------------------------------------- the quick tier

# Fixtures that build a workspace or a corpus (seconds each): a test that uses one, directly or
# through another fixture, is not in the quick tier.
HEAVY_FIXTURES = {"small_corpus"}
# Modules whose tests export and evaluate real models through prepare.py (tens of seconds together).
HEAVY_MODULES = {"test_prepare.py", "test_train.py"}


@pytest.hookimpl(tryfirst=True)   # before -m selects
def pytest_collection_modifyitems(config, items):
    """`pytest -m unit` (under a minute): every test that is not slow, does not drive a real client
    and builds no workspace. A test can also be marked unit by hand."""
    for item in items:
        if item.get_closest_marker("slow") or item.get_closest_marker("realclient"):
            continue
        if HEAVY_FIXTURES & set(getattr(item, "fixturenames", ())) or item.path.name in HEAVY_MODULES:
            continue
        item.add_marker(pytest.mark.unit)
