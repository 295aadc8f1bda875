"""Helpers shared by the end-to-end client tests (test_e2e_clients.py) and the launcher tests
(test_launch.py): fast workspaces, a recorded baseline, and Codex with an installed plugin."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from conftest import hobbled_bench, make_workspace, record_baseline, set_constant  # noqa: E402
from realclients import harness as h  # noqa: E402

BASELINE_BPB = 8.0   # a uniform byte model scores exactly 8 bits per byte


def fast_workspace(tmp: Path, corpus: Path, max_experiments: int = 2, **overrides) -> Path:
    """A workspace whose experiments train a one-block GPT for a few steps (MAX_STEPS-bounded) and
    evaluate on 2k tokens (export and evaluation dominate: a small graph halves them), with one
    baseline seed and a small experiment budget."""
    cfg = {"benchmark": {"time_budget": 20.0, "grace_seconds": 60.0, "eval_tokens": 2048},
           "noise": {"baseline_seeds": 1},
           "budget": {"max_experiments": max_experiments, "max_hours": 10.0, "max_cost_usd": 10.0}}
    for section, values in overrides.items():
        cfg.setdefault(section, {}).update(values)
    bench = hobbled_bench(tmp / "bench", max_steps=4)
    set_constant(bench / "train.py", "DEPTH", "1")
    set_constant(bench / "train.py", "D_MODEL", "64")
    ws = make_workspace(tmp / "ws", corpus, bench_dir=bench, **cfg)
    return ws.root


def seed_baseline(root: Path, val_bpb: float = BASELINE_BPB) -> int:
    """Record the pinned train.py's baseline as already measured on the campaign's seed set (as in a
    resumed campaign), so a client test trains only its own candidate. It counts as one experiment of
    the budget per seed."""
    from mcp_server.loop.engine import Engine

    with Engine(root) as eng:
        _, seeds = eng.seed_set(eng.campaign)
        return record_baseline(eng, (val_bpb,) * len(seeds))[0]


def experiments(root: Path) -> list[dict]:
    from mcp_server.loop.workspace import Workspace

    with Workspace.open(root).ledger() as ledger:
        return [dict(r) for r in ledger.conn.execute("SELECT * FROM experiments ORDER BY id")]


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout


# --------------------------------------------------------------------------- Codex with the plugin

def clean_checkout(dest: Path) -> Path:
    """The repository's files as a clone has them (tracked + new, not ignored): Codex copies a
    local marketplace's plugin folder into its cache, and a dev checkout carries ~1 GB of
    node_modules."""
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"],
                           capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def install_codex_plugin(run_dir: Path, source: Path) -> dict:
    """`codex plugin marketplace add SOURCE` + `codex plugin add loopwright@loopwright` into
    run_dir/codex-home; returns the config.toml tables they wrote (marketplaces, plugins)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    exe = h.require_binary("codex")
    env = h.codex_env(run_dir)
    for args in (["plugin", "marketplace", "add", str(source)], ["plugin", "add", "loopwright@loopwright"]):
        proc = h.run_process([exe, *args], cwd=run_dir, env=env, timeout=120, log_prefix=run_dir / f"codex-{args[1]}")
        assert proc.exit_code == 0, f"codex {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    cfg = tomllib.loads((Path(env["CODEX_HOME"]) / "config.toml").read_text())
    assert cfg.get("plugins", {}).get("loopwright@loopwright", {}).get("enabled") is True, cfg
    return {k: cfg[k] for k in ("marketplaces", "plugins")}


def run_codex_with_plugins(workdir: Path, fake, run_dir: Path, installed: dict, *, timeout: float,
                           extra_env: dict | None = None, cwd: Path | None = None) -> "h.ClientRun":
    """Like harness.run_codex, but with plugins enabled (run_codex passes `--disable plugins`) and the
    installed plugin's config kept."""
    import tomli_w

    exe = h.require_binary("codex")
    argv = [exe, "exec", "--json", "--dangerously-bypass-hook-trust", "--disable", "shell_snapshot",
            "-c", "analytics.enabled=false", "-s", "workspace-write", "-c", 'approval_policy="never"',
            "-C", str(workdir), "go"]
    with fake:
        env = h.codex_env(run_dir, extra_env)
        cfg = h.codex_config(fake.url, config=installed)
        (Path(env["CODEX_HOME"]) / "config.toml").write_text(tomli_w.dumps(cfg))
        proc = h.run_process(argv, cwd=cwd or workdir, env=env, timeout=timeout, log_prefix=run_dir / "codex")
    events, noise = h.parse_jsonl(proc.stdout)
    return h.ClientRun("codex", proc.argv, proc.exit_code, events, proc.stderr, proc.stdout, fake, workdir,
                       run_dir, proc.duration, proc.timed_out, noise)


# --------------------------------------------------------------------------- the launcher's environment

def use_environment(monkeypatch, env: dict[str, str]) -> None:
    """Make os.environ exactly `env` for the test (the launcher reads the process environment)."""
    for key in list(os.environ):
        if key not in env:
            monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
