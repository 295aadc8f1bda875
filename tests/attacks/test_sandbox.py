"""The OS boundary: attacks from inside a sandboxed script standing in for train.py or the evaluator,
and from a planted git configuration against the loop's git calls.

Real bubblewrap, real git, real sockets and processes; the tests skip (with the reason) only where
bwrap cannot make namespaces on this machine. CI installs it (.ci/run).
"""
from __future__ import annotations

import hashlib
import json
import os
import resource
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from mcp_server.loop import gitops, sandbox

INFO = sandbox.detect()
needs_bwrap = pytest.mark.skipif(INFO.kind != "bwrap", reason=f"no usable bubblewrap here: {INFO.detail}")


# --------------------------------------------------------------------------- a fake workspace + state dir

@pytest.fixture()
def box(tmp_path):
    """A workspace, a state dir outside it (val/test/ledger), a train view and a scratch dir."""
    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    (ws / "prepare.py").write_text("FROZEN = True\n")
    (ws / "train.py").write_text("print('hi')\n")
    state = tmp_path / "state"
    data = state / "data"
    data.mkdir(parents=True)
    for name in ("train.bin", "val.bin", "test.bin", "meta.json"):
        (data / name).write_text(f"{name} content\n")
    (state / "state.db").write_text("ledger\n")
    scratch = state / "runs" / "00001" / "scratch"
    (ws / "link_to_ledger").symlink_to(state / "state.db")
    return {"ws": ws, "state": state, "data": data, "scratch": scratch, "tmp": tmp_path}


def run_in_box(b, code: str, *args: str, mode: str = "train", timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    script = b["tmp"] / "attack.py"
    script.write_text(textwrap.dedent(code))
    view = b["ws"] / ".loopwright" / "data"     # where prepare.py looks for the training data
    files = {str(view / "train.bin"): b["data"] / "train.bin", str(view / "meta.json"): b["data"] / "meta.json"}
    cmd = sandbox.build_command([sys.executable, str(script), *args], mode=mode, workspace=b["ws"],
                                hide=[b["state"], b["ws"] / ".loopwright"], scratch=b["scratch"], files=files,
                                ro_binds=[script], cwd=b["ws"], **kw)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={"PATH": os.environ.get("PATH", ""), "HOME": os.path.expanduser("~")})


# --------------------------------------------------------------------------- detection

def test_missing_bubblewrap_is_refused_with_how_to_fix(monkeypatch):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    monkeypatch.setattr(sandbox.sys, "platform", "linux")
    monkeypatch.delenv(sandbox.UNSAFE_ENV, raising=False)
    try:
        info = sandbox.detect(refresh=True)
        assert info.kind == "none" and not info.available
        with pytest.raises(sandbox.SandboxUnavailable) as e:
            sandbox.require()
        assert "apt-get install bubblewrap" in str(e.value) and "--unsafe-no-sandbox" in str(e.value)
        assert sandbox.require(unsafe=True).kind == "none"          # the explicit opt-out runs bare
        assert sandbox.build_command(["true"], info=info) == ["true"]
        monkeypatch.setenv(sandbox.UNSAFE_ENV, "1")
        ok, line = sandbox.mode_line()
        assert not ok and "UNSAFE" in line
    finally:
        sandbox._CACHE.clear()


def test_unusable_namespaces_are_reported(monkeypatch, tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: str(fake))
    monkeypatch.setattr(sandbox.sys, "platform", "linux")
    try:
        info = sandbox.detect(refresh=True)
        assert info.kind == "none" and "No permissions to create new namespace" in info.detail
    finally:
        sandbox._CACHE.clear()


@needs_bwrap
def test_doctor_line_names_bubblewrap():
    ok, line = sandbox.mode_line()
    assert ok and "bubblewrap" in line


# --------------------------------------------------------------------------- attacks from train.py

@needs_bwrap
def test_double_forked_setsid_daemon_dies_with_the_run(box):
    marker = box["scratch"] / "daemon_alive"
    pidfile = box["scratch"] / "daemon_pid"
    res = run_in_box(box, f"""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                open({str(pidfile)!r}, "w").write(str(os.getpid()))
                time.sleep(2)
                open({str(marker)!r}, "w").write("still here")
                time.sleep(60)
                os._exit(0)
            os._exit(0)
        time.sleep(0.5)
        print("parent exits")
    """)
    assert res.returncode == 0 and "parent exits" in res.stdout, res.stderr
    assert pidfile.is_file()             # the daemon did start
    time.sleep(3)
    assert not marker.exists()           # ... and was gone before it could act


@needs_bwrap
def test_no_network_not_even_loopback(box):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    res = run_in_box(box, """
        import socket, sys
        try:
            socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3)
            print("CONNECTED")
        except OSError as e:
            print("refused", e)
        try:
            socket.create_connection(("1.1.1.1", 443), timeout=3)
            print("INTERNET")
        except OSError as e:
            print("no internet", e)
    """, str(srv.getsockname()[1]))
    srv.setblocking(False)
    with pytest.raises(BlockingIOError):      # nobody reached the host's listening socket
        srv.accept()
    srv.close()
    assert "refused" in res.stdout and "no internet" in res.stdout, res.stdout + res.stderr
    assert "CONNECTED" not in res.stdout


@needs_bwrap
def test_unix_socket_of_the_host_is_unreachable(box, tmp_path):
    path = tmp_path / "agent.sock"        # like ssh-agent or docker.sock under /tmp or /run
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen()
    res = run_in_box(box, f"""
        import socket
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect({str(path)!r}); print("CONNECTED")
        except OSError as e:
            print("no socket", e)
    """)
    srv.close()
    assert "no socket" in res.stdout, res.stdout + res.stderr


@needs_bwrap
def test_hidden_data_and_the_ledger_are_invisible(box):
    res = run_in_box(box, f"""
        import json, os
        out = {{}}
        for p in {[str(box['data'] / n) for n in ('val.bin', 'test.bin')] + [str(box['state'] / 'state.db')]!r} + [
                {str(box['ws'] / 'link_to_ledger')!r}, {str(box['ws'] / '.loopwright/data/val.bin')!r}]:
            try:
                out[p] = open(p).read()
            except OSError as e:
                out[p] = "ERR " + type(e).__name__
        out["train"] = open({str(box['ws'] / '.loopwright/data/train.bin')!r}).read()
        out["listing"] = sorted(os.listdir({str(box['ws'] / '.loopwright/data')!r}))
        print(json.dumps(out))
    """)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out.pop("train") == "train.bin content\n"            # the training split is there
    assert out.pop("listing") == ["meta.json", "train.bin"]
    assert all(v.startswith("ERR") for v in out.values()), out


@needs_bwrap
def test_no_capabilities_so_no_mask_can_be_unmounted(box):
    """Red team (2026-12-07): run as root, bwrap kept every capability in the sandbox, and train.py could
    umount2() the tmpfs over the state dir and read val.bin. No capability is left, whoever runs it."""
    res = run_in_box(box, f"""
        import ctypes, json, os
        libc = ctypes.CDLL(None, use_errno=True)
        cap = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff:")][0]
        parts = {str(box['data'] / 'val.bin')!r}.split("/")
        for _ in range(3):                                    # every mount above val.bin, the masks among them
            for i in range(len(parts) - 1, 1, -1):
                while libc.umount2("/".join(parts[:i]).encode(), 2) == 0:   # MNT_DETACH
                    pass
        try:
            seen = open({str(box['data'] / 'val.bin')!r}).read()
        except OSError as e:
            seen = "ERR " + type(e).__name__
        print(json.dumps({{"cap": cap, "val": seen}}))
    """)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert int(out["cap"], 16) == 0 and out["val"].startswith("ERR"), out


def _stand_in_workspace(tmp_path, state_dir, corpus):
    """A workspace as the sandbox sees it: a .git, a train.py, the state dir's train view holding 'TRAIN'."""
    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    (ws / ".git" / "HEAD").write_text("ref: refs/heads/loopwright/t\n")
    (ws / "train.py").write_text("x = 1\n")
    view = state_dir / "train-view"
    view.mkdir()
    (view / "train.bin").write_text("TRAIN\n")
    wsobj = SimpleNamespace(root=ws, state_dir=state_dir, workspace_data_dir=ws / ".loopwright" / "data",
                            data_dir=state_dir / "data",
                            cfg=SimpleNamespace(benchmark=SimpleNamespace(corpus=str(corpus))))
    return ws, view, wsobj


@needs_bwrap
@pytest.mark.parametrize("corpus_kind", ["folder", "file"])
def test_train_py_reads_neither_other_workspaces_state_nor_the_corpus(tmp_path, monkeypatch, corpus_kind):
    """Red team, 2026-12-01: with the state home on a disk the default masks do not cover (here: /tmp
    unmasked), train.py read another workspace's val/test/ledger, and a corpus given as a PATH is
    the held-out text itself. Both must be invisible to the training sandbox."""
    masks = sandbox.default_masks
    tmp_root = os.path.realpath(tmp_path).split(os.sep)[1]
    monkeypatch.setattr(sandbox, "default_masks",
                        lambda home=None: [m for m in masks(home) if m.split(os.sep)[1] != tmp_root])
    home = tmp_path / "lwhome" / "workspaces"
    mine, other = home / "ws-a", home / "ws-b"
    for st in (mine, other):
        (st / "data").mkdir(parents=True)
        (st / "data" / "val.bin").write_text(f"VAL OF {st.name}\n")
        (st / "state.db").write_text(f"LEDGER OF {st.name}\n")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "doc.txt").write_text("HELD-OUT TEXT\n")
    if corpus_kind == "file":
        corpus = corpus / "doc.txt"
    ws, view, wsobj = _stand_in_workspace(tmp_path, mine, corpus)
    targets = [str(other / "data" / "val.bin"), str(other / "state.db"), str(mine / "state.db"),
               str(tmp_path / "corpus" / "doc.txt"), str(ws / ".git" / "HEAD")]
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent(f"""
        import json
        out = {{}}
        for p in {targets!r}:
            try:
                out[p] = open(p).read()
            except OSError as e:
                out[p] = "ERR " + type(e).__name__
        out["train"] = open({str(ws / ".loopwright" / "data" / "train.bin")!r}).read()
        print(json.dumps(out))
    """))
    cmd = sandbox.training_command(wsobj, [sys.executable, str(script)], view=view, scratch=tmp_path / "scratch",
                                   env={"PATH": os.environ.get("PATH", "")})
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={"PATH": os.environ.get("PATH", "")})
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out.pop("train") == "TRAIN\n"                       # the sandbox works, the train view is there
    leaked = {p: v for p, v in out.items() if v and not v.startswith("ERR")}
    assert not leaked, f"train.py read {leaked}"


@needs_bwrap
def test_writes_outside_scratch_fail_or_stay_private(box, tmp_path):
    import site
    home = Path(os.path.expanduser("~"))
    host_tmp = Path("/tmp") / f"loopwright-sandbox-test-{os.getpid()}"
    site_pth = Path(site.getsitepackages()[0]) / "zz_loopwright_attack.pth"
    targets = {"prepare": box["ws"] / "prepare.py", "train": box["ws"] / "train.py",
               "new_ws_file": box["ws"] / "planted.py", "gitconfig": home / ".gitconfig.loopwright-test",
               "pth": site_pth, "host_tmp": host_tmp, "ledger": box["state"] / "state.db",
               "git_hook": box["ws"] / ".git" / "hooks" / "pre-commit"}
    before = {k: (p.read_bytes() if p.exists() else None) for k, p in targets.items()}
    paths = {k: str(v) for k, v in targets.items()}
    res = run_in_box(box, f"""
        import json, os
        out = {{}}
        for name, p in {paths!r}.items():
            try:
                os.makedirs(os.path.dirname(p), exist_ok=True)
                with open(p, "w") as f:
                    f.write("import os; os.system('echo pwned')\\n")
                out[name] = "written"
            except OSError as e:
                out[name] = "ERR " + type(e).__name__
        open({str(box['scratch'] / 'ok.txt')!r}, "w").write("scratch works")
        print(json.dumps(out))
    """)
    assert res.returncode == 0, res.stderr
    for k, p in targets.items():
        assert (p.read_bytes() if p.exists() else None) == before[k], f"{k} changed on the host"
    assert (box["scratch"] / "ok.txt").read_text() == "scratch works"
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["prepare"].startswith("ERR") and out["train"].startswith("ERR") and out["pth"].startswith("ERR")


@needs_bwrap
def test_memory_limit_is_enforced_from_outside(box):
    code = """
        try:
            blob = bytearray(3 << 30)
            print("ALLOCATED")
        except MemoryError:
            print("MemoryError")
    """
    script = box["tmp"] / "mem.py"
    script.write_text(textwrap.dedent(code))
    cmd = sandbox.build_command([sys.executable, str(script)], workspace=box["ws"], hide=[box["state"]],
                                ro_binds=[script], env={"CUDA_VISIBLE_DEVICES": ""})
    res = subprocess.run(sandbox.limited(cmd, 1 << 30, gpu=False), capture_output=True, text=True, timeout=60)
    assert "MemoryError" in res.stdout, res.stdout + res.stderr


def test_limits_wrapper_sets_them_keeps_the_pid_and_runs_no_fork_handlers(tmp_path):
    """sandbox.limited() applies the limits by exec, not by a preexec_fn: the child is the command itself (its
    pid is Popen's), and no at-fork handler of this process runs in it (gRPC's aborted a gate under Ray)."""
    marker = tmp_path / "forked"
    probe = ("import os, resource, sys; print(os.getpid(), *resource.getrlimit(resource.RLIMIT_AS), "
             "*resource.getrlimit(resource.RLIMIT_CORE), *resource.getrlimit(resource.RLIMIT_CPU))")
    # in a fresh interpreter, so that the at-fork handler does not outlive the test
    parent = textwrap.dedent(f"""
        import os, subprocess, sys
        from mcp_server.loop import sandbox
        os.register_at_fork(after_in_child=lambda: open({str(marker)!r}, "w").write("ran"))
        proc = subprocess.Popen(sandbox.limited([sys.executable, "-c", {probe!r}], 3 << 30, CPU=(50, 51)),
                                stdout=subprocess.PIPE, text=True)
        print(proc.pid, proc.communicate(timeout=60)[0].strip())
    """)
    res = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    popen_pid, pid, as_soft, as_hard, core_soft, core_hard, cpu_soft, cpu_hard = map(int, res.stdout.split())
    assert pid == popen_pid
    assert (as_soft, as_hard, core_soft, core_hard, cpu_soft, cpu_hard) == (3 << 30, 3 << 30, 0, 0, 50, 51)
    assert not marker.exists()
    gpu = subprocess.run(sandbox.limited([sys.executable, "-c", probe], 3 << 30, gpu=True),
                         capture_output=True, text=True, timeout=60)
    assert int(gpu.stdout.split()[1]) == resource.getrlimit(resource.RLIMIT_AS)[0]   # CUDA maps more than it uses
    missing = subprocess.run(sandbox.limited(["/nonexistent/tool"], None), capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode == 127 and "cannot run /nonexistent/tool" in missing.stderr


# --------------------------------------------------------------------------- the evaluator's inputs

def test_fifo_symlink_and_directory_are_refused_as_the_model(tmp_path):
    fifo = tmp_path / "model.pt2"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(sandbox.UnsafeFile, match="FIFO"):
        sandbox.copy_regular_file(fifo, tmp_path / "copy1")
    assert time.monotonic() - t0 < 5                     # refused, not blocked on a writer
    secret = tmp_path / "secret"
    secret.write_text("val data")
    link = tmp_path / "link.pt2"
    link.symlink_to(secret)
    with pytest.raises(sandbox.UnsafeFile, match="symbolic link"):
        sandbox.copy_regular_file(link, tmp_path / "copy2")
    with pytest.raises(sandbox.UnsafeFile, match="directory"):
        sandbox.copy_regular_file(tmp_path, tmp_path / "copy3")
    big = tmp_path / "big.pt2"
    big.write_bytes(b"x" * 2048)
    with pytest.raises(sandbox.UnsafeFile, match="limit"):
        sandbox.copy_regular_file(big, tmp_path / "copy4", max_bytes=1024)


def test_eval_dir_is_private_and_holds_a_hashed_copy(tmp_path):
    import hashlib
    model = tmp_path / "model.pt2"
    model.write_bytes(os.urandom(5000))
    d = sandbox.make_eval_dir({"prepare.py": b"print(1)\n", "loopwright.toml": b"[benchmark]\n"}, model,
                              tmp_path / "state" / "eval")
    try:
        assert (d.path.stat().st_mode & 0o777) == 0o700
        assert d.prepare.read_bytes() == b"print(1)\n"
        assert d.model_sha256 == hashlib.sha256(model.read_bytes()).hexdigest() and d.model_bytes == 5000
        model.write_bytes(b"changed after the copy")       # the evaluator reads the private copy
        assert hashlib.sha256(d.model.read_bytes()).hexdigest() == d.model_sha256
    finally:
        d.cleanup()
    assert not d.path.exists()
    fifo = tmp_path / "fifo.pt2"
    os.mkfifo(fifo)
    before = set(Path(d.path.parent).glob("loopwright-eval-*"))
    with pytest.raises(sandbox.UnsafeFile):
        sandbox.make_eval_dir({"prepare.py": b""}, fifo, d.path.parent)
    assert set(Path(d.path.parent).glob("loopwright-eval-*")) == before    # nothing left behind


@needs_bwrap
def test_planted_json_py_and_pth_in_site_packages_do_not_run_in_the_evaluator(box, tmp_path):
    """The evaluator's bootstrap: stdlib first, site dirs last, no .pth processing."""
    planted = tmp_path / "site"
    planted.mkdir()
    marker = tmp_path / "PTH_RAN"
    (planted / "json.py").write_text("raise SystemExit('planted json imported')\n")
    (planted / "evil.pth").write_text(f"import os; open({str(marker)!r}, 'w').write('x')\n")
    (planted / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    (planted / "only_here.py").write_text("VALUE = 42\n")    # site dirs are still importable
    model = tmp_path / "model.pt2"
    model.write_bytes(b"weights")
    script = b"import json, sys, only_here\nprint(json.dumps({'json': json.__file__, 'v': only_here.VALUE}))\n"
    d = sandbox.make_eval_dir({"prepare.py": script}, model, tmp_path / "state" / "eval")
    try:
        code = sandbox.eval_bootstrap(d.prepare, ["evaluate", str(d.model)], [str(planted)],
                                      hashlib.sha256(script).hexdigest())
        cmd = sandbox.build_command([sys.executable, "-I", "-S", "-c", code], mode="eval",
                                    workspace=box["ws"], hide=[box["state"]], ro_binds=[d.path, planted],
                                    cwd=d.path)
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    finally:
        d.cleanup()
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["v"] == 42 and not out["json"].startswith(str(planted)), out
    assert not marker.exists()


# --------------------------------------------------------------------------- git

def _git(root, *args, env=None):
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, env=env)


@pytest.fixture()
def attacked_repo(tmp_path, monkeypatch):
    """A workspace repo with every program-running git setting an attacker can plant."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    root = tmp_path / "ws"
    root.mkdir()
    (root / "train.py").write_text("a = 1\n")
    pinned = gitops.init_repo_and_pin(root, "pin")
    gitops.create_branch(root, "loopwright/t", pinned)
    marker = tmp_path / "PWNED"
    evil = tmp_path / "evil.sh"
    evil.write_text(f"#!/bin/sh\necho \"$0 $*\" >> {marker}\nexit 0\n")
    evil.chmod(0o755)
    hooks_elsewhere = tmp_path / "hooks"
    hooks_elsewhere.mkdir()
    for d in (root / ".git" / "hooks", hooks_elsewhere):
        d.mkdir(exist_ok=True)
        for h in ("pre-commit", "commit-msg", "post-commit", "post-checkout", "reference-transaction",
                  "post-index-change", "pre-auto-gc"):
            (d / h).write_text(evil.read_text())
            (d / h).chmod(0o755)
    (home / ".gitconfig").write_text(f"[core]\n\thooksPath = {hooks_elsewhere}\n\tfsmonitor = {evil}\n"
                                     f"\tpager = {evil}\n[diff]\n\texternal = {evil}\n")
    with open(root / ".git" / "config", "a") as f:
        f.write(f"[core]\n\tfsmonitor = {evil}\n\thooksPath = {hooks_elsewhere}\n[diff]\n\texternal = {evil}\n"
                f"[diff \"x\"]\n\ttextconv = {evil}\n[filter \"x\"]\n\tclean = {evil}\n\tsmudge = {evil}\n"
                f"[alias]\n\tst = !{evil}\n")
    (root / ".git" / "info").mkdir(exist_ok=True)
    (root / ".git" / "info" / "attributes").write_text("* diff=x filter=x\n")
    # the planted settings are live: a plain git status runs them
    _git(root, "status")
    assert marker.exists(), "the attack setup should run evil.sh under a plain git"
    marker.unlink()
    return root, pinned, marker


def test_planted_hooks_fsmonitor_filters_and_gitconfig_do_not_run_in_loop_git_calls(attacked_repo):
    root, pinned, marker = attacked_repo
    (root / "train.py").write_text("a = 2\n")
    assert gitops.is_dirty(root)
    assert gitops.changed_paths(root) == (["train.py"], [])
    sha, _ = gitops.commit_editable(root, ["train.py"], ".loopwright", "experiment")
    assert sha and gitops.diff_stats(root, pinned, sha, "train.py") == (1, 1)
    assert "+a = 2" in gitops.diff_text(root, pinned, sha, ["train.py"])
    gitops.checkout_files(root, pinned, ["train.py"])
    gitops.move_branch(root, sha)
    gitops.reset_to(root, pinned)
    assert gitops.verified_blob_bytes(root, sha, "train.py") == b"a = 2\n"
    assert (root / "train.py").read_text() == "a = 1\n"
    assert not marker.exists(), marker.read_text()


def test_git_config_and_hooks_problems_are_found_and_cleaned(attacked_repo):
    root, _, marker = attacked_repo
    problems = gitops.git_config_problems(root)
    assert {"core.fsmonitor", "core.hookspath", "diff.external", "filter.x.clean", "alias.st"} <= set(problems)
    assert "core.bare" not in problems and "user.name" not in problems
    hooks = gitops.git_hook_problems(root)
    assert ".git/hooks/pre-commit" in hooks and ".git/info/attributes" in hooks
    removed = gitops.clean_git_config(root)
    assert set(problems) <= set(removed) and gitops.git_config_problems(root) == []
    assert _git(root, "config", "user.name").stdout.strip() == "loopwright"   # the identity stays


def test_fresh_workspace_repo_has_no_hooks_and_a_clean_config(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    (root / "train.py").write_text("x = 1\n")
    gitops.init_repo_and_pin(root, "pin")
    assert gitops.git_config_problems(root) == [] and gitops.git_hook_problems(root) == []


def test_integrity_check_catches_and_removes_planted_git_config_and_hooks(tmp_path, small_corpus):
    from mcp_server.loop import integrity

    from conftest import make_workspace

    ws = make_workspace(tmp_path / "ws", small_corpus)
    pinned = gitops.root_commit(ws.root)
    assert integrity.check(ws, pinned) == []
    hook = ws.root / ".git" / "hooks" / "post-checkout"
    hook.parent.mkdir(exist_ok=True)
    hook.write_text("#!/bin/sh\ntouch /tmp/pwned\n")
    hook.chmod(0o755)
    with open(ws.root / ".git" / "config", "a") as f:
        f.write("[core]\n\tfsmonitor = /tmp/evil.sh\n[include]\n\tpath = ../evil.config\n")
    mism = integrity.check(ws, pinned)
    assert {(m.kind, m.path) for m in mism} >= {("githook", ".git/hooks/post-checkout"), ("gitconfig", ".git/config")}
    assert any("core.fsmonitor" in m.detail for m in mism) and any("include.path" in m.detail for m in mism)
    actions = integrity.restore(ws, pinned, mism)
    assert integrity.restored(mism, actions), actions
    assert integrity.check(ws, pinned) == [] and not hook.exists()
    assert list(ws.tamper_dir.glob("*/.git/hooks/post-checkout"))      # the evidence is kept


# --------------------------------------------------------------------------- through the runner

TINY = '''
import json, os, sys, time
import torch
import torch.nn as nn
import prepare

class Bigram(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.zeros(prepare.VOCAB_SIZE, prepare.VOCAB_SIZE))
    def forward(self, idx):
        return self.table[idx]
'''


def _attempts(paths: dict) -> str:
    """train.py body: try to read and write what it must not, plant a daemon, then export honestly."""
    return TINY + f'''
P = {paths!r}
out = {{}}
x, y = next(prepare.make_dataloader("train", 2, "cpu", 0))       # the training split is readable
out["train_batch"] = list(x.shape)
for name in ("val", "test", "ledger"):
    try:
        open(P[name], "rb").read(1); out["read_" + name] = "READ"
    except OSError as e:
        out["read_" + name] = type(e).__name__
for name in ("ledger", "prepare", "workspace_file"):
    try:
        with open(P[name], "ab") as f:
            f.write(b"tampered")
        out["write_" + name] = "WROTE"
    except OSError as e:
        out["write_" + name] = type(e).__name__
if os.fork() == 0:                      # a daemon that would rewrite the ledger after the run
    os.setsid()
    if os.fork() == 0:
        time.sleep(3)
        try:
            open(P["ledger"], "ab").write(b"late tamper")
        finally:
            os._exit(0)
    os._exit(0)
print("ATTEMPTS " + json.dumps(out), flush=True)
prepare.export_model(Bigram())
print("---")
print("num_steps:        1")
'''


@pytest.fixture()
def real_ws(tmp_path, small_corpus):
    from conftest import make_workspace
    return make_workspace(tmp_path / "ws", small_corpus)


@needs_bwrap
def test_runner_trains_and_scores_inside_the_sandbox_and_attacks_fail(real_ws):
    from mcp_server.loop import runner

    ws = real_ws
    pinned = gitops.root_commit(ws.root)
    paths = {"val": str(ws.data_dir / "val.bin"), "test": str(ws.data_dir / "test.bin"),
             "ledger": str(ws.db_path), "prepare": str(ws.root / "prepare.py"),
             "workspace_file": str(ws.root / "program.md")}
    before = {k: Path(p).read_bytes() for k, p in paths.items()}
    (ws.root / "train.py").write_text(_attempts(paths))
    run_dir = ws.run_dir(1)
    tr = runner.run_training(ws, run_dir, seed=5)
    assert tr.status == "ok" and tr.sandbox == "bwrap", (tr.reason, tr.log_tail)
    line = next(l for l in tr.log_tail.splitlines() if l.startswith("ATTEMPTS "))
    out = json.loads(line[len("ATTEMPTS "):])
    assert out.pop("train_batch") == [2, 256]
    assert all(out[k] != "READ" for k in ("read_val", "read_test", "read_ledger")), out
    assert out["write_prepare"] != "WROTE" and out["write_workspace_file"] != "WROTE", out   # read-only
    # (a write to the ledger's path lands in an empty private tmpfs: the host file is checked below)
    time.sleep(4)                                    # the daemon would have struck by now
    assert {k: Path(p).read_bytes() for k, p in paths.items()} == before
    assert tr.model_path.parent == run_dir / "scratch"

    ev = runner.run_evaluation(ws, pinned, run_dir, tr.model_path)
    assert ev.ok, ev.reason
    assert ev.model_sha256 == gitops.file_sha256(tr.model_path)
    assert json.loads((run_dir / "eval.json").read_text())["model_sha256"] == ev.model_sha256
    assert 7.9 < ev.val_bpb < 8.1                   # uniform logits: 8 bits per byte
    assert not list(Path(ws.root).glob("**/loopwright-eval-*"))     # the eval dir is outside the workspace


@needs_bwrap
def test_runner_refuses_a_fifo_or_symlink_as_the_model(real_ws, tmp_path):
    from mcp_server.loop import runner

    ws = real_ws
    pinned = gitops.root_commit(ws.root)
    fifo = tmp_path / "model.pt2"
    os.mkfifo(fifo)
    ev = runner.run_evaluation(ws, pinned, ws.run_dir(2), fifo)
    assert not ev.ok and "FIFO" in ev.reason
    link = tmp_path / "link.pt2"
    link.symlink_to(ws.data_dir / "val.bin")
    ev = runner.run_evaluation(ws, pinned, ws.run_dir(2), link)
    assert not ev.ok and "symbolic link" in ev.reason
    # and from inside train.py: a FIFO where the export should be is not a model
    (ws.root / "train.py").write_text("import os\nos.mkfifo(os.environ['LOOPWRIGHT_EXPORT_PATH'])\n")
    tr = runner.run_training(ws, ws.run_dir(3), seed=1)
    assert tr.status == "crash" and "without exporting a model" in tr.reason


def test_runner_refuses_to_run_without_a_sandbox_unless_opted_out(real_ws, monkeypatch):
    from mcp_server.loop import runner

    ws = real_ws
    monkeypatch.delenv(sandbox.UNSAFE_ENV, raising=False)
    monkeypatch.setitem(sandbox._CACHE, "info", sandbox.SandboxInfo("none", None, "bubblewrap is not installed"))
    (ws.root / "train.py").write_text(TINY + "prepare.export_model(Bigram())\n")
    with pytest.raises(sandbox.SandboxUnavailable, match="apt-get install bubblewrap"):
        runner.run_training(ws, ws.run_dir(1), seed=1)
    monkeypatch.setenv(sandbox.UNSAFE_ENV, "1")
    tr = runner.run_training(ws, ws.run_dir(1), seed=1)
    assert tr.status == "ok" and tr.sandbox == "none", tr.log_tail
    ev = runner.run_evaluation(ws, gitops.root_commit(ws.root), ws.run_dir(1), tr.model_path)
    assert ev.ok, ev.reason


def test_an_unsandboxed_experiment_is_on_the_record(real_ws, monkeypatch):
    """With --unsafe-no-sandbox every experiment carries sandboxed=0 and an unsafe_no_sandbox event."""
    from mcp_server.loop import runner
    from mcp_server.loop.engine import Engine

    monkeypatch.setenv(sandbox.UNSAFE_ENV, "1")
    monkeypatch.setitem(sandbox._CACHE, "info", sandbox.SandboxInfo("none", None, "bubblewrap is not installed"))
    (real_ws.root / "train.py").write_text(TINY + "prepare.export_model(Bigram())\n")
    eng = Engine(real_ws.root)
    c = eng.campaign
    res = eng._execute(c, "unsandboxed baseline", None, c["best_commit"], c["best_commit"], None, None,
                       seed=1, is_baseline=True)
    row = eng.ledger.experiment(res.experiment_id)
    assert json.loads(row["metrics_json"])["sandboxed"] == 0
    assert eng.ledger.events(c["id"], kind="unsafe_no_sandbox")
    eng.close()
    assert runner.TrainResult("ok", 0, "", 0.0).sandbox == "unknown"


def test_doctor_says_which_sandbox_is_active(capsys, tmp_path, monkeypatch):
    from mcp_server.cli.doctor import run_doctor

    run_doctor(str(tmp_path), skip_server=True)
    line = next(l for l in capsys.readouterr().out.splitlines() if "sandbox:" in l)
    assert ("bubblewrap" in line and line.startswith("✔")) if INFO.kind == "bwrap" else line.startswith("✘")
    monkeypatch.setitem(sandbox._CACHE, "info", sandbox.SandboxInfo("none", None, "bwrap is not installed"))
    monkeypatch.setenv(sandbox.UNSAFE_ENV, "1")
    run_doctor(str(tmp_path), skip_server=True)
    out = capsys.readouterr().out
    assert "✘ sandbox: NONE" in out and "UNSAFE" in out and "apt-get install bubblewrap" in out


@needs_bwrap
def test_hard_kill_takes_every_descendant_with_it(tmp_path, small_corpus):
    """At the hard limit the runner kills the sandbox: a child in its own session stops beating."""
    from mcp_server.loop import runner

    from conftest import make_workspace

    ws = make_workspace(tmp_path / "ws", small_corpus, benchmark={"time_budget": 2.0, "grace_seconds": 2.0})
    (ws.root / "train.py").write_text(textwrap.dedent('''
        import os, subprocess, sys, time
        d = os.environ["LOOPWRIGHT_RUN_DIR"]
        open(d + "/child.py", "w").write(
            "import os, time\\nn = 0\\nwhile True:\\n    n += 1\\n"
            "    open(os.path.join(os.path.dirname(__file__), 'beat'), 'w').write(str(n))\\n    time.sleep(0.1)\\n")
        subprocess.Popen([sys.executable, d + "/child.py"], start_new_session=True)
        time.sleep(10_000)
    '''))
    tr = runner.run_training(ws, ws.run_dir(1), seed=1)
    assert tr.status == "timeout", (tr.status, tr.reason, tr.log_tail)
    beat = ws.run_dir(1) / "scratch" / "beat"
    assert beat.is_file()
    time.sleep(0.5)
    last = beat.read_text()
    time.sleep(1.5)
    assert beat.read_text() == last, "a descendant of train.py outlived the hard kill"


def test_unsafe_flag_is_on_the_experiment_commands_only_and_warns_loudly(tmp_path, capsys, monkeypatch):
    from mcp_server.cli.main import build_parser, main

    monkeypatch.delenv(sandbox.UNSAFE_ENV, raising=False)
    for cmd in (["serve"], ["run-experiment", "x"], ["run"], ["demo"]):
        argv = [cmd[0], "--unsafe-no-sandbox", *cmd[1:]]
        assert build_parser(argv).parse_args(argv).unsafe_no_sandbox is True
    with pytest.raises(SystemExit):
        build_parser(["score", "--unsafe-no-sandbox"]).parse_args(["score", "--unsafe-no-sandbox"])
    capsys.readouterr()
    code = main(["run-experiment", "--unsafe-no-sandbox", "-w", str(tmp_path / "nowhere"), "x"])
    err = capsys.readouterr().err
    assert code == 2 and "WARNING: --unsafe-no-sandbox" in err and "not trustworthy" in err
    assert os.environ.get(sandbox.UNSAFE_ENV) == "1"      # inherited by the agents' MCP servers
    monkeypatch.delenv(sandbox.UNSAFE_ENV, raising=False)


def test_macos_profile_denies_network_writes_and_the_state_dir(box):
    """The sandbox-exec profile (not executable here: its text is what CI can check)."""
    info = sandbox.SandboxInfo("sandbox-exec", "/usr/bin/sandbox-exec", "test")
    mount = box["ws"] / ".loopwright" / "data"
    cmd = sandbox.build_command(["python", "train.py"], workspace=box["ws"], hide=[box["state"], mount.parent],
                                scratch=box["scratch"], files={str(mount / "train.bin"): box["data"] / "train.bin"},
                                info=info)
    assert cmd[:2] == ["/usr/bin/sandbox-exec", "-p"] and cmd[-2:] == ["python", "train.py"]
    profile = cmd[2].splitlines()
    assert "(deny network*)" in profile and not any(l.startswith("(allow network") for l in profile)
    assert "(deny file-write*)" in profile
    assert f'(allow file-write* (subpath "{os.path.realpath(box["scratch"])}"))' in profile
    deny_state = f'(deny file-read* (subpath "{os.path.realpath(box["state"])}"))'
    allow_view = f'(allow file-read* (subpath "{os.path.realpath(mount)}"))'
    assert deny_state in profile and allow_view in profile
    assert profile.index(allow_view) > profile.index(deny_state)     # the last matching rule wins


# --------------------------------------------------------------------------- one policy for all agent code

PROBE = """
import json
out = {}
for p in TARGETS:
    try:
        with open(p, "rb") as f:
            out[p] = f.read(200).decode("latin-1")
    except OSError as e:
        out[p] = "ERR " + type(e).__name__
"""


@needs_bwrap
def test_every_kind_of_agent_code_is_denied_the_same_hidden_paths(tmp_path, monkeypatch):
    """Red team B1: a mechanism read val.bin, test.bin and a `--corpus PATH` file byte-exact (its sandbox
    hid only temp dirs and homes), while train.py's hid them. One list (sandbox.hidden_paths: every state
    home, every corpus, the worker's cache and working copies) now bounds train.py, the evaluator and a
    mechanism alike. Laid out where the default masks do not reach (the temp dir unmasked here), each kind
    of code tries to open every file of that list: none is readable, while each still does its work."""
    from mcp_server.loop.workspace import RECORD_NAME
    from mcp_server.mechanisms import validate

    masks = sandbox.default_masks
    tmp_root = os.path.realpath(tmp_path).split(os.sep)[1]
    monkeypatch.setattr(sandbox, "default_masks",
                        lambda home=None: [m for m in masks(home) if m.split(os.sep)[1] != tmp_root])
    home = tmp_path / "lwhome"
    monkeypatch.setenv("LOOPWRIGHT_HOME", str(home))
    mine, other = home / "workspaces" / "ws-a", home / "workspaces" / "ws-b"
    for st in (mine, other):
        (st / "data").mkdir(parents=True)
        for split in ("val.bin", "test.bin"):
            (st / "data" / split).write_text(f"{split} OF {st.name}\n")
        (st / "state.db").write_text(f"LEDGER OF {st.name}\n")
    corpus, other_corpus = tmp_path / "corpus", tmp_path / "corpus-b"
    for c in (corpus, other_corpus):
        c.mkdir()
        (c / "doc.txt").write_text(f"HELD-OUT TEXT OF {c.name}\n")
    other_root = tmp_path / "ws-b-root"            # another workspace, registered in the state home
    other_root.mkdir()
    (other_root / "loopwright.toml").write_text(f'[benchmark]\ncorpus = "{other_corpus}"\n')
    (other / RECORD_NAME).write_text(json.dumps({"id": "ws-b", "root": str(other_root)}))
    worker = sandbox.worker_root()
    (worker / "data").mkdir(parents=True)
    (worker / "data" / ("ab" * 32)).write_text("CACHED TEST SPLIT\n")
    (worker / "work" / "loopwright-run-x" / "state" / "data").mkdir(parents=True)
    (worker / "work" / "loopwright-run-x" / "state" / "data" / "val.bin").write_text("ANOTHER RUN'S VAL\n")
    ws, view, wsobj = _stand_in_workspace(tmp_path, mine, corpus)

    hidden = sandbox.hidden_paths(wsobj)
    targets = sorted(str(p) for h in hidden for p in ([h] if h.is_file() else h.rglob("*")) if p.is_file())
    for must in (other / "data" / "test.bin", mine / "data" / "val.bin", corpus / "doc.txt",
                 other_corpus / "doc.txt", worker / "data" / ("ab" * 32), ws / ".git" / "HEAD",
                 worker / "work" / "loopwright-run-x" / "state" / "data" / "val.bin"):
        assert str(must) in targets, f"{must} is not in the one policy's hidden paths {hidden}"
    probe = PROBE.replace("TARGETS", repr(targets))
    env = {"PATH": os.environ.get("PATH", "")}

    def leaked(out: dict) -> dict:
        return {p: v for p, v in out.items() if p in targets and not v.startswith("ERR")}

    # train.py
    script = tmp_path / "train_probe.py"
    script.write_text(probe + "out['train'] = open(%r).read()\nprint(json.dumps(out))\n"
                      % str(ws / ".loopwright" / "data" / "train.bin"))
    cmd = sandbox.training_command(wsobj, [sys.executable, str(script)], view=view, scratch=tmp_path / "scratch",
                                   env=env)
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["train"] == "TRAIN\n" and not leaked(out), f"train.py read {leaked(out)}"

    # the evaluator (a model's graph runs in it), with its own data files bound
    model = tmp_path / "model.pt2"
    model.write_bytes(b"weights")
    eprobe = (probe + "import sys\nout['val'] = open(sys.argv[1]).read()\nprint(json.dumps(out))\n").encode()
    box = sandbox.make_eval_dir({"prepare.py": eprobe}, model, mine / "eval")
    try:
        code = sandbox.eval_bootstrap(box.prepare, [str(box.path / "data" / "val.bin")], sandbox.site_dirs(),
                                      hashlib.sha256(eprobe).hexdigest())
        cmd = sandbox.evaluation_command(wsobj, [sys.executable, "-I", "-S", "-c", code], eval_dir=box,
                                         data_dir=mine / "data", data_files=["val.bin"])
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    finally:
        box.cleanup()
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["val"] == "val.bin OF ws-a\n" and not leaked(out), f"the evaluator read {leaked(out)}"

    # a mechanism: no static checks on this path (they are friendly early errors); the OS stops it
    mech = probe.replace("\nimport json\n", "\n") + "\ndef advise(history, source):\n    return {'read': out}\n"
    res = validate.run_sandboxed("probe", mech, [{"label": "x", "history": {}, "source": ""}], 30.0, ws=wsobj)
    assert res.imported and res.cases and res.cases[0].ok, (res.import_error, res.stderr)
    out = res.cases[0].advice["read"]
    assert set(out) == set(targets) and not leaked(out), f"a mechanism read {leaked(out)}"


def test_the_bootstrap_runs_only_the_pinned_bytes(tmp_path):
    """R11b, the second half: whatever could write the evaluator's file, the bootstrap reads it once,
    hashes it and runs exactly those bytes, or refuses."""
    model = tmp_path / "model.pt2"
    model.write_bytes(b"weights")
    pinned = b"print('pinned evaluator')\n"
    d = sandbox.make_eval_dir({"prepare.py": pinned}, model, tmp_path / "state" / "eval")
    try:
        assert (d.path.parent.stat().st_mode & 0o777) == 0o700
        code = sandbox.eval_bootstrap(d.prepare, [], [], hashlib.sha256(pinned).hexdigest())
        ok = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60)
        assert ok.returncode == 0 and ok.stdout == "pinned evaluator\n", ok.stderr
        d.prepare.write_bytes(b"print('{\"ok\": true, \"val_bpb\": 0.1}')\n")     # a swap
        bad = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60)
    finally:
        d.cleanup()
    assert bad.returncode == sandbox.EVALUATOR_CHANGED_EXIT and bad.stdout == ""
    assert "not the pinned prepare.py" in bad.stderr


def test_the_bootstrap_runs_only_the_pinned_siblings(tmp_path):
    """The same for prepare.py's siblings: checked before anything runs, and handed over as the bytes that
    were checked (prepare.sibling loads those, never the file on disk again)."""
    model = tmp_path / "model.pt2"
    model.write_bytes(b"weights")
    main = b"print(sorted(_PINNED_SOURCES), _PINNED_SOURCES['evaluate'].decode().strip())\n"
    sib = b"SCORE = 'pinned'\n"
    d = sandbox.make_eval_dir({"prepare.py": main, "evaluate.py": sib}, model, tmp_path / "state" / "eval")
    try:
        code = sandbox.eval_bootstrap(d.prepare, [], [], hashlib.sha256(main).hexdigest(),
                                      {str(d.path / "evaluate.py"): hashlib.sha256(sib).hexdigest()})
        ok = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60)
        assert ok.returncode == 0 and ok.stdout == "['evaluate'] SCORE = 'pinned'\n", ok.stderr
        (d.path / "evaluate.py").write_bytes(b"SCORE = 'swapped'\n")
        bad = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60)
    finally:
        d.cleanup()
    assert bad.returncode == sandbox.EVALUATOR_CHANGED_EXIT and bad.stdout == ""
    assert "not the pinned evaluate.py" in bad.stderr


WATCHER = r"""
import os, sys
# a fake evaluator: whatever nonce it is given, it prints a verdict with a wonderful score
FAKE = (b"import json, sys\na = sys.argv\nn = a[a.index('--nonce') + 1] if '--nonce' in a else None\n"
        b"print(json.dumps({'ok': True, 'val_bpb': 0.123, 'test_bpb': 0.123, 'eval_seconds': 1.0, 'nonce': n}))\n")
roots, stop = sys.argv[2:], sys.argv[1]
rewritten = 0
open(stop + ".ready", "w").close()
while not os.path.exists(stop):
    for root in roots:
        for d, _, names in os.walk(root):
            for n in names:
                p = os.path.join(d, n)
                try:
                    with open(p, "rb") as f:
                        if f.read(len(FAKE) + 1) == FAKE:
                            continue
                    with open(p, "wb") as f:
                        f.write(FAKE)
                    rewritten += 1
                except OSError:
                    pass
print(rewritten)
"""


@needs_bwrap
@pytest.mark.slow
def test_a_watcher_rewriting_the_temp_dirs_changes_no_score(tmp_path, monkeypatch, small_corpus):
    """Red team R11b: the evaluator's working dir was in the system temp dir and its pinned prepare.py was
    never re-checked; a watcher of the agent's user swapped in a fake that echoes the nonce, and a 3-step
    model was kept at 1.1 (honest 5.9). A same-user process rewrites every file it finds under the temp
    dirs (tempfile.gettempdir() and TMPDIR: the test's own temp dir stands for the shared /tmp, /var/tmp,
    which other people's processes on this machine use) during an evaluation: the score is the one
    computed without it."""
    import tempfile

    from mcp_server.loop import runner

    from conftest import hobbled_bench, make_workspace

    ws = make_workspace(tmp_path / "ws", small_corpus, bench_dir=hobbled_bench(tmp_path / "bench", max_steps=3,
                                                                              tiny=True),
                        benchmark={"clock": "steps", "budget_tokens": 3 * 8 * 256, "eval_tokens": 2048})
    run_dir = tmp_path / "run"
    tr = runner.run_training(ws, run_dir, seed=1)
    assert tr.status == "ok", (tr.reason, tr.log_tail)
    honest = runner.run_evaluation(ws, ws.pinned_commit, run_dir, tr.model_path)
    assert honest.ok and honest.val_bpb and honest.val_bpb > 1.0, honest.reason

    systmp = tmp_path / "systmp"
    systmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(systmp))
    monkeypatch.setattr(tempfile, "tempdir", str(systmp))
    stop = tmp_path / "stop"
    watcher = subprocess.Popen([sys.executable, "-c", WATCHER, str(stop), tempfile.gettempdir(), str(systmp)],
                               stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(600):                      # until it has started (bounded by polls, not by a clock)
            if (tmp_path / "stop.ready").exists() or watcher.poll() is not None:
                break
            time.sleep(0.05)
        watched = runner.run_evaluation(ws, ws.pinned_commit, run_dir, tr.model_path)
    finally:
        stop.touch()
        rewritten = watcher.communicate(timeout=60)[0]
    print(f"the watcher rewrote {rewritten.strip()} files; {watched}")
    assert watched.ok, watched.reason
    assert watched.val_bpb == honest.val_bpb and watched.test_bpb == honest.test_bpb, (watched, honest)
    assert watched.model_sha256 == honest.model_sha256
