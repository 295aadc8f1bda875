"""Where the baseline's seed noise comes from: model init vs data order.

    python bench/perf/seed_decomposition.py 1,1 2,1 3,1 4,1 1,2 1,3 1,4     # INIT,DATA pairs
    python bench/perf/seed_decomposition.py --tiny     # a smoke run: 1,1 and 2,1 for 2 steps, tiny corpus

Trains the baseline (bench/gpt/train.py's model and hyperparameters, AdamW,
warm-up and linear warm-down) for a fixed number of steps (--steps, default
100, the baseline's step count in a 30 s budget) in this process, with the init
seed and the dataloader seed set separately, and scores each model on 256
windows spread over the val split (prepare.bpb_sums). Varying one seed with the
other fixed gives the SD due to init alone and to data order alone.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpt"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tiny  # noqa: E402

from mcp_server.loop.workspace import EVALUATOR_PY  # noqa: E402  (prepare.py and its frozen siblings)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pairs", nargs="*", help="INIT,DATA seed pairs (at least one unless --tiny)")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--tiny", action="store_true", help="a smoke run: pairs 1,1 and 2,1 for 2 steps on a tiny corpus, "
                   "scored on 4 windows (seconds; the figures mean nothing)")
    args = p.parse_args()
    windows = 256
    if args.tiny:
        args.pairs, args.steps, windows = args.pairs or ["1,1", "2,1"], 2, 4
    if not args.pairs:
        p.error("give at least one INIT,DATA seed pair, e.g. 1,1 2,1 1,2")
    tmp = Path(tempfile.mkdtemp(prefix="lw-seeds-"))
    try:
        for name in (*EVALUATOR_PY, "train.py"):
            shutil.copyfile(BENCH / name, tmp / name)
        if args.tiny:
            (tmp / "loopwright.toml").write_text(
                "\n".join(["[benchmark]", *tiny.toml_lines(tiny.tiny_corpus(tmp / "corpus"))]) + "\n")
        subprocess.run([sys.executable, "prepare.py", "prepare"], cwd=tmp, check=True, capture_output=True)
        sys.path.insert(0, str(tmp))
        import torch
        import torch.nn.functional as F
        import train as T

        import prepare as P

        torch.set_num_threads(len(os.sched_getaffinity(0)))
        torch.use_deterministic_algorithms(True)
        val, tb = P._tokens("val"), P._token_bytes(P.load_meta(), P.DATA_DIR)
        for spec in args.pairs:
            init_seed, data_seed = map(int, spec.split(","))
            torch.manual_seed(init_seed)
            m = T.GPT(P.VOCAB_SIZE, T.D_MODEL, T.DEPTH, T.N_HEAD, T.MLP_RATIO, P.SEQ_LEN)
            mats = [q for b in m.blocks for q in b.parameters()]
            opt = torch.optim.AdamW([dict(params=[m.embed.weight], lr=T.EMBED_LR, weight_decay=0.0),
                                     dict(params=[m.head.weight], lr=T.LR, weight_decay=0.0),
                                     dict(params=mats, lr=T.LR, weight_decay=T.WEIGHT_DECAY)],
                                    betas=(T.BETA1, T.BETA2), eps=1e-8, fused=True)
            for g in opt.param_groups:
                g["base_lr"] = g["lr"]
            loader = P.make_dataloader("train", T.BATCH_SIZE, "cpu", data_seed)
            for step in range(args.steps):
                x, y = next(loader)
                F.cross_entropy(m(x).view(-1, P.VOCAB_SIZE), y.reshape(-1)).backward()
                torch.nn.utils.clip_grad_norm_(m.parameters(), T.GRAD_CLIP)
                warm = min(1.0, (step + 1) / T.WARMUP_STEPS) if T.WARMUP_STEPS else 1.0   # 0 = no warm-up
                scale = warm * min(1.0, max(0.0, (1 - step / args.steps) / T.WARMDOWN_FRAC))
                for g in opt.param_groups:
                    g["lr"] = g["base_lr"] * scale
                opt.step()
                m.zero_grad(set_to_none=True)
            m.eval()
            nats, nbytes, _ = P.bpb_sums(m, val, tb, windows * P.SEQ_LEN)
            print(json.dumps({"init": init_seed, "data": data_seed, "val_bpb": round(nats / math.log(2) / nbytes, 4)}),
                  flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
