"""A synthetic benchmark directory for orchestration measurements: the real frozen prepare.py and
program.md, and a train.py that sleeps instead of training and then writes one fixed exported model
(a unigram model with uniform logits, made once with prepare.export_model). A run then costs wall
time but almost no CPU, so a 2-core machine measures the loop and the executor, not the arithmetic;
the frozen evaluator still scores every model for real (bits per byte = 8.0).

    bench = synthetic_bench(Path("/tmp/b"), sleep_s=20)
    set_variant(ws.root / "train.py", 3)     # a new candidate: a real (if useless) change of the code
"""
from __future__ import annotations

import base64
import re
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

from mcp_server.loop.workspace import EVALUATOR_PY  # prepare.py and its frozen siblings

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "gpt"

_EXPORT = """
import sys, torch
sys.path.insert(0, ".")
import prepare

class Uniform(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.logits = torch.nn.Parameter(torch.zeros(prepare.VOCAB_SIZE))

    def forward(self, idx):
        return idx.unsqueeze(-1).to(self.logits.dtype) * 0.0 + self.logits

prepare.export_model(Uniform(), sys.argv[1])
"""

TRAIN = '''"""Synthetic train.py (bench/perf/synthetic.py): sleeps SLEEP_S seconds instead of training, then
writes a fixed exported model. For measuring the loop's orchestration, not a model."""
import base64
import os
import time
import zlib

SLEEP_S = {sleep!r}
VARIANT = 0   # the benchmark sets a new value for every candidate
MODEL = (   # the exported model, zlib + base64
{model}
)

t0 = time.time()
time.sleep(SLEEP_S)
path = os.environ.get("LOOPWRIGHT_EXPORT_PATH", "model.pt2")
with open(path, "wb") as f:
    f.write(zlib.decompress(base64.b64decode(MODEL)))
elapsed = time.time() - t0
print(f"step=1 loss=5.5452 elapsed={{elapsed:.2f}} remaining=0.00", flush=True)
print("---")
print(f"training_seconds: {{elapsed:.2f}}")
print("num_steps: 1")
print(f"variant: {{VARIANT}}")
'''


def synthetic_bench(dest: Path, sleep_s: float) -> Path:
    """dest/ with prepare.py, program.md and the sleeping train.py (the model exported once, here)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in (*EVALUATOR_PY, "program.md"):
        shutil.copyfile(BENCH / name, dest / name)
    model = dest / "uniform.pt2"
    subprocess.run([sys.executable, "-c", _EXPORT, str(model)], cwd=dest, check=True, capture_output=True)
    blob = base64.b64encode(zlib.compress(model.read_bytes(), 9)).decode()
    model.unlink()
    lines = "\n".join(f'    "{blob[i:i + 100]}"' for i in range(0, len(blob), 100))
    (dest / "train.py").write_text(TRAIN.format(sleep=float(sleep_s), model=lines))
    return dest


def set_variant(train: Path, value: int) -> None:
    src = train.read_text()
    src, n = re.subn(r"^VARIANT = \d+", f"VARIANT = {value}", src, count=1, flags=re.M)
    if n != 1:
        raise ValueError(f"{train} has no VARIANT constant: not a synthetic train.py")
    train.write_text(src)
