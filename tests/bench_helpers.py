"""Helpers for the GPT benchmark tests: throw-away benchmark directories
(prepare.py [+ train.py] + loopwright.toml + data), the evaluate CLI as a
subprocess, and tiny hand-made models exported through prepare.export_model."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench" / "gpt"
FROZEN_PY = ("prepare.py", "evaluate.py", "pt2audit.py")   # the frozen harness: prepare.py and its siblings


def write_toml(dest: Path, **benchmark) -> None:
    lines = ["[benchmark]"]
    for k, v in benchmark.items():
        lines.append(f"{k} = {json.dumps(v)}")
    (dest / "loopwright.toml").write_text("\n".join(lines) + "\n")


def bench_dir(dest: Path, *, train: bool = False, **benchmark) -> Path:
    """A directory with a copy of the frozen harness (prepare.py and its siblings; and train.py), and a
    loopwright.toml."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in FROZEN_PY:
        shutil.copyfile(BENCH / name, dest / name)
    if train:
        shutil.copyfile(BENCH / "train.py", dest / "train.py")
    write_toml(dest, **benchmark)
    return dest


def load_prepare(d: Path):
    """Import d/prepare.py as a fresh module (its constants come from d/loopwright.toml)."""
    name = f"prepare_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, d / "prepare.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod   # as an import does: prepare.sibling() binds evaluate.py/pt2audit.py to it
    spec.loader.exec_module(mod)
    return mod


def text_corpus(dest: Path, n_docs: int = 120, doc_bytes: int = 3000, seed: int = 0) -> Path:
    """A folder of small, learnable English-like documents (deterministic)."""
    import random

    rng = random.Random(seed)
    words = ("the a model loop agent verifier train score budget keep discard seed noise data byte token "
             "file run test value learn rate step loss time small large fast slow good bad new old").split()
    dest.mkdir(parents=True, exist_ok=True)
    for i in range(n_docs):
        out, n = [], 0
        while n < doc_bytes:
            line = " ".join(rng.choice(words) for _ in range(rng.randint(4, 12))).capitalize() + ".\n"
            out.append(line)
            n += len(line)
        (dest / f"doc{i:04d}.txt").write_text("".join(out))
    return dest


def run_cli(d: Path, *args: str, isolated: bool = True, cwd: Path | None = None, timeout: float = 300):
    """Run `python [-I] d/prepare.py ARGS`; returns (returncode, last-line JSON or None, completed process)."""
    cmd = [sys.executable] + (["-I"] if isolated else []) + [str(d / "prepare.py"), *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    proc = subprocess.run(cmd, cwd=cwd or d, capture_output=True, text=True, timeout=timeout, env=env)
    result = None
    lines = proc.stdout.strip().splitlines()
    if lines:
        try:
            result = json.loads(lines[-1])
        except json.JSONDecodeError:
            pass
    return proc.returncode, result, proc


def evaluate(d: Path, model: Path, **kw):
    return run_cli(d, "evaluate", str(model), **kw)


def parse_summary(stdout: str) -> dict[str, str]:
    lines = stdout.strip().splitlines()
    start = len(lines) - 1 - lines[::-1].index("---")
    out = {}
    for line in lines[start + 1:]:
        key, _, value = line.partition(":")
        out[key.strip()] = value.strip()
    return out


def booby_trap_pt2(src: Path, dst: Path, marker: Path, where: str) -> None:
    """Copy an exported .pt2, planting a pickle that creates `marker` when unpickled:
    as the sample inputs (torch retries those with weights_only=False) or as a
    weight flagged use_pickle (torch loads those with weights_only=False)."""
    import pickle
    import zipfile

    class Trap:
        def __reduce__(self):
            return open, (str(marker), "w")

    payload = pickle.dumps(Trap(), protocol=2)
    with zipfile.ZipFile(src) as zin:
        files = {info.filename: zin.read(info.filename) for info in zin.infolist()}
    if where == "sample_inputs":
        name = next(n for n in files if n.endswith("sample_inputs/model.pt"))
        files[name] = payload
    else:
        cfg_name = next(n for n in files if n.endswith("model_weights_config.json"))
        cfg = json.loads(files[cfg_name])
        first = cfg["config"][sorted(cfg["config"])[0]]
        first["use_pickle"] = True
        files[cfg_name] = json.dumps(cfg).encode()
        files[next(n for n in files if n.endswith("weights/" + first["path_name"]))] = payload
    with zipfile.ZipFile(dst, "w") as zout:
        for name, data in files.items():
            zout.writestr(name, data)
