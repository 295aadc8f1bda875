"""
train.py -- the baseline GPT that the agent improves. The only editable file.

A small decoder-only transformer over the tokens of prepare.py: RMSNorm,
rotary position embeddings, causal scaled-dot-product attention, squared-ReLU
MLP, tanh logit soft-capping, AdamW (QK-norm and Muon optional). It trains
within the frozen budget, *in total* (startup, training, quick eval and export
together): prepare.start_budget() keeps the clock, says when to stop and how
far training is (for the LR schedule), and prints the progress lines and the
summary block. It hands the model to prepare.export_model; the score is
computed afterwards by the frozen evaluator (`python prepare.py evaluate
model.pt2`), not by this file.

Environment (set by the runner): LOOPWRIGHT_SEED (int, default 0),
LOOPWRIGHT_EXPORT_PATH (where the model goes, default model.pt2).
"""
import os
import sys

# Idle OpenMP threads sleep instead of spinning. On a CPU shared with other
# jobs, spinning threads steal time from the working ones (training steps
# measured 3x slower on a busy 2-core machine); when quiet it costs little.
# Must be set before torch loads its OpenMP runtime.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
import torch.nn as nn
import torch.nn.functional as F

import prepare

# ---------------------------------------------------------------------------
# Hyperparameters. Top-level literals on purpose: tools edit them by parsing this file.
# Benchmark v2 (bench/gpt/VERSION): these values are the reference baseline and never change within v2.
# The recipe is nanoGPT's, not a configuration tuned on any machine: its README's CPU example ("I only have a
# macbook": n_layer 4, n_head 4, n_embd 128, batch 12, dropout 0) with config/train_shakespeare_char.py's optimizer
# (lr 1e-3, beta2 0.99, warmup, decay to the end of the run), at v1's model size. Better configurations
# found by campaigns are records (bench/gpt/RECORDS.md), never edits here; v1 (a baseline tuned on 2 CPU cores) is
# in RECORDS.md with the commit that holds it.

DEPTH = 2               # transformer blocks: v1's size for 30 s of 2 CPU cores (nanoGPT's CPU example has 4,
                        # which trains ~57 steps in 30 s of CPU here)
D_MODEL = 64            # residual width: v1's size (nanoGPT's CPU example has 128)
N_HEAD = 4              # attention heads, head dim 16 (= D_MODEL // N_HEAD): nanoGPT's CPU example (n_head 4)
MLP_RATIO = 4           # MLP hidden = MLP_RATIO * D_MODEL: GPT-2's and nanoGPT's 4 * n_embd
BATCH_SIZE = 12         # sequences per step (tokens per step = BATCH_SIZE * prepare.SEQ_LEN): nanoGPT's CPU
                        # example (--batch_size=12)
LR = 0.001              # AdamW peak learning rate (matrices when Muon is off, and everything else): nanoGPT's
                        # train_shakespeare_char.py (learning_rate = 1e-3, "baby networks can afford a bit higher")
EMBED_LR = 0.001        # AdamW learning rate of the embedding: nanoGPT trains every parameter at one rate (= LR)
WEIGHT_DECAY = 0.1      # AdamW decoupled weight decay on the block matrices: nanoGPT's default (GPT-3's 0.1)
BETA1 = 0.9             # AdamW beta1: the GPT-3 / nanoGPT value
BETA2 = 0.99            # AdamW beta2: nanoGPT's train_shakespeare_char.py (0.99, "few tokens per iteration")
WARMUP_STEPS = 20       # linear LR warm-up: nanoGPT's warmup_iters (100) cut down for a run of ~170-500 steps
WARMDOWN_FRAC = 1.0     # the LR decays linearly to 0 over this last fraction of the run: nanoGPT decays over the
                        # whole run (lr_decay_iters = max_iters; cosine there, linear here)
GRAD_CLIP = 1.0         # max global grad norm (0 = off): nanoGPT's default
LOGIT_SOFTCAP = 0.0     # logits = cap * tanh(logits / cap) (0 = off): GPT-2 and nanoGPT have none
QK_NORM = False         # RMS-normalise queries and keys: off, as in GPT-2 and nanoGPT (autoresearch's model has it)
USE_MUON = False        # Muon for block matrices: off, as in nanoGPT (modded-nanogpt and autoresearch use it)
MUON_LR = 0.02          # Muon's learning rate when on: the order of magnitude Muon is used with in
                        # modded-nanogpt; not screened here
COMPILE_ON_CUDA = True  # torch.compile the training model on CUDA (unreliable on CPU, so never there)
MAX_STEPS = 0           # 0 = train until the budget; > 0 = also stop after that many steps and
                        # schedule the LR by step count (reproducible runs on any clock)
QUICK_EVAL_TOKENS = 8192  # held-out train tokens for the train_eval_bpb printed here (not the score); small so
                          # it costs well under a second
AVERAGE_FRAC = 0.0      # score the mean of the weights over this last fraction of the run (0 = off): checkpoint
                        # averaging (LAWA, Kaddour 2022; SWA, Izmailov et al. 2018) to lower the noise of the end
PRINT_EVERY_S = 1.0     # seconds between progress lines (a harness choice, not part of the recipe)


# ---------------------------------------------------------------------------
# Model

def rotary(x, cos, sin):
    """Rotary embedding as x*cos + swap_halves(x)*sin; the sign of the rotation
    lives in `sin` (see GPT.__init__). Three tensor ops instead of six: on a CPU
    these small elementwise ops cost as much as the matmuls."""
    h = x.shape[-1] // 2
    return torch.addcmul(x * cos, torch.cat((x[..., h:], x[..., :h]), dim=-1), sin)


class ReluSquare(torch.autograd.Function):
    """relu(x)^2 with a one-line backward (2*relu(x)*grad): cheaper than
    autograd's pow backward and no threshold_backward. Used only with grad;
    inference (and torch.export) sees plain ops."""

    @staticmethod
    def forward(ctx, x):
        r = torch.relu(x)
        ctx.save_for_backward(r)
        return r * r

    @staticmethod
    def backward(ctx, grad):
        (r,) = ctx.saved_tensors
        return grad * (r + r)


def relu_square(x):
    if torch.is_grad_enabled():
        return ReluSquare.apply(x)
    return torch.relu(x).square()


class Block(nn.Module):
    def __init__(self, d, n_head, mlp_ratio):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.fc = nn.Linear(d, mlp_ratio * d, bias=False)
        self.out = nn.Linear(mlp_ratio * d, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = F.rms_norm(x, (C,))
        q, k, v = self.qkv(h).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        if QK_NORM:
            q, k = F.rms_norm(q, (q.shape[-1],)), F.rms_norm(k, (k.shape[-1],))
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        h = F.rms_norm(x, (C,))
        return x + self.out(relu_square(self.fc(h)))


class GPT(nn.Module):
    def __init__(self, vocab, d, depth, n_head, mlp_ratio, seq_len):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, n_head, mlp_ratio) for _ in range(depth))
        self.head = nn.Linear(d, vocab, bias=False)
        hd = d // n_head
        freqs = 1.0 / (10000 ** (torch.arange(0, hd // 2, dtype=torch.float32) / (hd // 2)))
        angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), freqs)
        # full-width tables for rotary(): (x1, x2) -> (x1*cos - x2*sin, x2*cos + x1*sin)
        self.register_buffer("cos", torch.cat((angles.cos(), angles.cos()), dim=-1), persistent=False)
        self.register_buffer("sin", torch.cat((-angles.sin(), angles.sin()), dim=-1), persistent=False)
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.normal_(self.embed.weight, std=1.0)
        for b in self.blocks:
            for lin in (b.qkv, b.fc):
                nn.init.normal_(lin.weight, std=lin.in_features ** -0.5)
            # residual branches start as identity: stable early training
            nn.init.zeros_(b.proj.weight)
            nn.init.zeros_(b.out.weight)
        nn.init.zeros_(self.head.weight)  # uniform predictions (8 bits/byte) at step 0

    def forward(self, idx):
        T = idx.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.embed(idx)
        for b in self.blocks:
            x = b(x, cos, sin)
        logits = self.head(F.rms_norm(x, (x.shape[-1],))).float()
        if LOGIT_SOFTCAP > 0:
            logits = LOGIT_SOFTCAP * torch.tanh(logits / LOGIT_SOFTCAP)
        return logits


def flops_per_token(model, seq_len):
    """Training FLOPs per token: 6 per matmul weight, plus causal attention
    (QK^T and AV over on average T/2 keys: 6 * depth * T * d). The embedding
    lookup is not a matmul and is not counted."""
    matmul = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and not n.startswith("embed"))
    return 6 * matmul + 6 * len(model.blocks) * seq_len * model.embed.embedding_dim


# ---------------------------------------------------------------------------
# Muon (optional): momentum, then an approximate orthogonalisation of each update

def orthogonalize(g, steps=5):
    """Newton-Schulz iteration towards the nearest semi-orthogonal matrix."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g / (g.norm() + 1e-7)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if tall else x


class Muon(torch.optim.Optimizer):
    def __init__(self, params, lr=0.02, momentum=0.95):
        super().__init__(params, dict(lr=lr, momentum=momentum))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum", torch.zeros_like(p))
                buf.mul_(group["momentum"]).add_(p.grad)
                update = orthogonalize(p.grad.add(buf, alpha=group["momentum"]))  # Nesterov
                p.add_(update, alpha=-group["lr"] * max(1.0, p.shape[0] / p.shape[1]) ** 0.5)


class WeightAverage:
    """A running mean of the model's parameters over the steps it is given (checkpoint averaging)."""

    def __init__(self):
        self.mean, self.n = None, 0

    @torch.no_grad()
    def add(self, model):
        self.n += 1
        if self.mean is None:
            self.mean = [p.detach().clone() for p in model.parameters()]
            return
        for m, p in zip(self.mean, model.parameters()):
            m.add_(p.detach() - m, alpha=1.0 / self.n)

    @torch.no_grad()
    def load_into(self, model):
        if self.mean is not None:
            for m, p in zip(self.mean, model.parameters()):
                p.copy_(m)


# ---------------------------------------------------------------------------
# Setup

def pick_device():
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def main():
    seed = int(os.environ.get("LOOPWRIGHT_SEED", "0"))
    device = pick_device()
    if device == "cpu":
        # a fixed thread count + deterministic kernels make a fixed seed reproduce bit for bit
        torch.set_num_threads(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
        torch.use_deterministic_algorithms(True)
        torch.utils.deterministic.fill_uninitialized_memory = False  # NaN-filling every new tensor costs ~8 %
    torch.manual_seed(seed)
    seq_len = prepare.SEQ_LEN
    model = GPT(prepare.VOCAB_SIZE, D_MODEL, DEPTH, N_HEAD, MLP_RATIO, seq_len).to(device)
    num_params = sum(p.numel() for p in model.parameters())

    matrices = [p for b in model.blocks for p in b.parameters()]
    adam_groups = [dict(params=[model.embed.weight], lr=EMBED_LR, weight_decay=0.0),
                   dict(params=[model.head.weight], lr=LR, weight_decay=0.0)]
    optimizers = []
    if USE_MUON:
        optimizers.append(Muon(matrices, lr=MUON_LR))
    else:
        adam_groups.append(dict(params=matrices, lr=LR, weight_decay=WEIGHT_DECAY))
    optimizers.append(torch.optim.AdamW(adam_groups, betas=(BETA1, BETA2), eps=1e-8,
                                        fused=device in ("cuda", "cpu")))
    for opt in optimizers:
        for g in opt.param_groups:
            g["base_lr"] = g["lr"]

    train_model = model
    if device == "cuda" and COMPILE_ON_CUDA:
        train_model = torch.compile(model)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else torch.autocast("cpu", enabled=False)
    loader = prepare.make_dataloader("train", BATCH_SIZE, device, seed)
    # the budget counts from the start of this process: imports and setup are paid for too
    budget = prepare.start_budget(model, eval_tokens=QUICK_EVAL_TOKENS, max_steps=MAX_STEPS,
                                  print_every=PRINT_EVERY_S, device=device)

    average = WeightAverage()
    model.train()
    while True:
        x, y = next(loader)
        with autocast:
            logits = train_model(x)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        if GRAD_CLIP > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        warmup = min(1.0, (budget.steps + 1) / WARMUP_STEPS) if WARMUP_STEPS > 0 else 1.0
        warmdown = min(1.0, max(0.0, (1.0 - budget.progress()) / WARMDOWN_FRAC))
        for opt in optimizers:
            for g in opt.param_groups:
                g["lr"] = g["base_lr"] * warmup * warmdown
            opt.step()
        model.zero_grad(set_to_none=True)
        if AVERAGE_FRAC > 0 and budget.progress() >= 1.0 - AVERAGE_FRAC:
            average.add(model)
        if budget.step(loss):   # counts the step, prints progress; True when the next one would not fit
            break

    average.load_into(model)   # no-op when nothing was averaged
    model.eval()
    with torch.no_grad(), autocast:
        train_eval_bpb = prepare.evaluate_bpb(model, "train_eval", max_tokens=QUICK_EVAL_TOKENS, device=device)
    peak_mem = (torch.cuda.max_memory_allocated() / 2 ** 20 if device == "cuda"
                else _max_rss_mb())
    peak, _ = prepare.peak_flops(device)
    mfu = flops_per_token(model, seq_len) * budget.tokens / max(1e-9, budget.training_seconds) / peak * 100
    prepare.export_model(model)
    budget.summary(train_eval_bpb=train_eval_bpb, mfu_percent=round(mfu, 2), num_params_M=round(num_params / 1e6, 3),
                   depth=DEPTH, device=device,
                   **{"peak_vram_mb" if device == "cuda" else "peak_memory_mb": round(peak_mem, 1)})


def _max_rss_mb():
    import resource
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2 ** 20 if sys.platform == "darwin" else rss / 1024  # bytes on macOS, KiB on Linux


if __name__ == "__main__":
    main()
