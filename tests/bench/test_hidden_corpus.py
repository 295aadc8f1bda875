"""The default corpus, stdlib-hidden (issue 26 item 4): val/test are standard-library modules training never
needs, and train.py's sandbox hides their sources and caches, so a train.py cannot rebuild them; the
`stdlib` corpus, whose val/test any Python can read, stays an option."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from mcp_server.loop import sandbox

from bench_helpers import BENCH, load_prepare

INFO = sandbox.detect()
needs_bwrap = pytest.mark.skipif(INFO.kind != "bwrap", reason=f"no usable bubblewrap here: {INFO.detail}")


@pytest.fixture(scope="module")
def prep():
    return load_prepare(BENCH)   # no loopwright.toml beside it: the defaults


@pytest.fixture(scope="module")
def prepared(prep, tmp_path_factory):
    d = tmp_path_factory.mktemp("stdlib-hidden")
    return d, prep.prepare_data(data_dir=str(d), quiet=True)


def test_the_default_corpus_is_stdlib_hidden_everywhere(prep):
    from mcp_server.loop.config import DEFAULT_CORPUS, NAMED_CORPORA, parse_config

    assert prep.CORPUS == DEFAULT_CORPUS == parse_config("").benchmark.corpus == sandbox.HELDOUT_CORPUS
    assert "stdlib" in NAMED_CORPORA and "stdlib-hidden" in NAMED_CORPORA
    assert prep.HELDOUT_STDLIB == sandbox.HELDOUT_STDLIB   # the frozen file and the sandbox hide the same list


def test_training_numpy_torch_and_the_evaluator_import_none_of_the_held_out_modules(tmp_path):
    """What hiding them must not break: train.py's and prepare.py's imports, torch.export included."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(BENCH)!r})
        import numpy, torch, torch.export, torch.nn.functional
        import prepare
        held = set(prepare.HELDOUT_STDLIB)
        print(sorted(m for m in sys.modules if m.split(".")[0] in held))
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "[]"


def test_val_and_test_are_the_held_out_modules_and_train_has_none_of_them(prep, prepared):
    d, meta = prepared
    assert meta["corpus"] == "stdlib-hidden" and meta["python"] == sys.version.split()[0]
    held = list(prep._heldout_docs())
    names = [n for n, _ in held]
    assert names and all(n.startswith("heldout:") for n in names)
    assert {n.split(":", 1)[1].split("/")[0].split("#")[0].removesuffix(".py") for n in names} <= set(prep.HELDOUT_STDLIB)
    val = [t for n, t in held if prep.split_of(n, "stdlib-hidden") == "val"]
    test = [t for n, t in held if prep.split_of(n, "stdlib-hidden") == "test"]
    assert meta["splits"]["val"]["documents"] == len(val) and meta["splits"]["test"]["documents"] == len(test)
    for split in ("val", "test"):      # each split holds enough for the evaluator's windows
        assert meta["splits"][split]["tokens"] >= prep.EVAL_TOKENS
    # train: no document of a held-out module, and none of their text (a distinctive line of each)
    train = (Path(d) / "train.bin").read_bytes()[::2]      # uint16 LE byte tokens -> bytes
    for line in ("class IMAP4:", "class SMTP:", "class Mailbox:", "class SimpleXMLRPCServer("):
        assert any(line in t for t in val + test), line
        assert line.encode() not in train, f"{line!r} is in the training split"
    # deterministic and offline: the same documents again, the same split rule
    assert [n for n, _ in prep._heldout_docs()] == names
    assert prep.split_of("heldout:imaplib.py#0", "stdlib-hidden") in ("val", "test")
    assert prep.split_of("os.py", "stdlib-hidden") == "train"


PROBE = r'''
import glob, hashlib, json, os, sys, sysconfig
import numpy as np
import prepare

# the attack: rebuild val.bin with prepare.py's own corpus code, and look for the held-out sources anywhere
docs = [(n, t.replace("\x00", "")) for n, t in prepare._heldout_docs()
        if prepare.split_of(n, "stdlib-hidden") == "val"]
ids = []
for _, text in docs:
    ids += [0] + list(text.encode("utf-8"))
val = np.asarray(ids, dtype="<u2").tobytes()
roots = {p for p in sys.path if p and os.path.isdir(p)} | {sysconfig.get_paths()["stdlib"]}
roots |= set(glob.glob("/usr/lib/python3*")) | set(glob.glob("/usr/local/lib/python3*"))
found = {}
for root in sorted(roots):
    for mod in prepare.HELDOUT_STDLIB:
        paths = [os.path.join(root, mod + ".py")] + glob.glob(os.path.join(root, "__pycache__", mod + ".*.pyc"))
        paths += glob.glob(os.path.join(root, mod, "**", "*.py"), recursive=True)
        for p in paths:
            try:
                data = open(p, "rb").read()
            except OSError:
                continue
            if data:
                found[p] = len(data)
alive = []
for mod, attr in (("imaplib", "IMAP4"), ("smtplib", "SMTP"), ("mailbox", "Mailbox"), ("xmlrpc.client", "ServerProxy")):
    try:
        m = __import__(mod, fromlist=["x"])
    except Exception:
        continue
    if hasattr(m, attr):
        alive.append(mod)
print(json.dumps({"val_docs": len(docs), "val_sha256": hashlib.sha256(val).hexdigest(), "found": found,
                  "alive": alive}))
'''


def _stand_in(tmp_path: Path, corpus: str):
    """A workspace as train.py's sandbox sees it: prepare.py, the probe as train.py, a train view."""
    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    shutil.copyfile(BENCH / "prepare.py", ws / "prepare.py")
    (ws / "train.py").write_text(PROBE)
    state = tmp_path / "state"
    view = state / "train-view"
    view.mkdir(parents=True)
    (view / "train.bin").write_bytes(b"\0\0")
    wsobj = SimpleNamespace(root=ws, state_dir=state, workspace_data_dir=ws / ".loopwright" / "data",
                            data_dir=state / "data", cfg=SimpleNamespace(benchmark=SimpleNamespace(corpus=corpus)))
    return ws, view, wsobj


def _probe(cmd, cwd) -> dict:
    env = {"PATH": os.environ.get("PATH", ""), "OMP_WAIT_POLICY": "PASSIVE"}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@needs_bwrap
def test_a_train_py_cannot_rebuild_val_or_test_inside_its_sandbox(tmp_path, prepared):
    """Red team, 2026-12-01: a train.py rebuilt the stdlib corpus's val and test byte for byte. On the
    default corpus the same attack -- prepare.py's own corpus code, a walk of sys.path and of every Python's
    library for the held-out files, importing them -- finds nothing inside the sandbox; outside it (the
    control) it rebuilds val.bin exactly, so the probe is a real attack."""
    d, meta = prepared
    ws, view, wsobj = _stand_in(tmp_path, "stdlib-hidden")
    outside = _probe([sys.executable, str(ws / "train.py")], ws)
    assert outside["val_docs"] == meta["splits"]["val"]["documents"]
    assert outside["val_sha256"] == hashlib.sha256((Path(d) / "val.bin").read_bytes()).hexdigest()
    assert outside["found"] and set(outside["alive"]) == {"imaplib", "smtplib", "mailbox", "xmlrpc.client"}

    cmd = sandbox.training_command(wsobj, [sys.executable, str(ws / "train.py")], view=view,
                                   scratch=tmp_path / "scratch", env={"PATH": os.environ.get("PATH", "")})
    inside = _probe(cmd, ws)
    assert inside["val_docs"] == 0 and inside["found"] == {} and inside["alive"] == [], inside

    # the stdlib corpus stays an option, and its own corpus hides nothing (its note says so); hidden_paths may
    # still list the held-out modules when another workspace in the same state home uses stdlib-hidden
    _, _, public = _stand_in(tmp_path / "public", "stdlib")
    assert sandbox.corpus_sources(public) == []
    assert sandbox.corpus_is_public("stdlib") and not sandbox.corpus_is_public("stdlib-hidden")


def test_every_python_found_has_its_held_out_modules_hidden():
    """Another Python on the machine (the system's beside a pyenv one) holds nearly the same text."""
    paths = {str(p) for p in sandbox.heldout_stdlib_paths()}
    for root in sandbox.stdlib_roots():
        for name in ("imaplib", "smtplib"):
            if (root / f"{name}.py").is_file():
                assert str(root / f"{name}.py") in paths
        if (root / "xmlrpc").is_dir():
            assert str(root / "xmlrpc") in paths
    import sysconfig
    assert Path(os.path.realpath(sysconfig.get_paths()["stdlib"])) in sandbox.stdlib_roots()
