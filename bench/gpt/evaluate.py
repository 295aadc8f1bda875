"""
evaluate.py -- the frozen evaluator of loopwright's GPT benchmark: the score.

The agent never edits this file (it is pinned, hashed and read-only like
prepare.py). train.py never imports it: `python prepare.py evaluate MODEL.pt2`
runs it, in the runner's evaluation sandbox, on the archive train.py exported.
It checks the archive (pt2audit.py) before torch reads a byte of it, loads the
rebuilt copy with code execution refused, probes the model for causality and
statelessness, and scores val and test with prepare.py's bpb_sums (the metric).

Loaded by prepare.sibling("evaluate"), which binds `prepare` below to the
prepare.py that loaded it (its constants come from the loopwright.toml next to
that file). Imports: stdlib, numpy, torch, and its two frozen siblings only.
"""
import math
import os
import time

import numpy as np
import torch

# Loaded by prepare.sibling(), `prepare` is already here: the module that loaded us, with its constants.
# Imported on its own (a test, a REPL), it is the prepare.py beside this file.
if "prepare" not in globals():
    import prepare

pt2audit = prepare.sibling("pt2audit")

# What the score takes from prepare.py: its constants, data checks and the metric itself.
EvalError = prepare.EvalError
B_EVAL, SEQ_LEN, VOCAB_SIZE, EVAL_TOKENS = prepare.B_EVAL, prepare.SEQ_LEN, prepare.VOCAB_SIZE, prepare.EVAL_TOKENS
CAUSAL_ATOL, CAUSAL_MAX_TOL = prepare.CAUSAL_ATOL, prepare.CAUSAL_MAX_TOL
DATA_DIR, TOKENIZER = prepare.DATA_DIR, prepare.TOKENIZER
verify_data, _tokens, _token_bytes = prepare.verify_data, prepare._tokens, prepare._token_bytes
bpb_sums, sampling_error = prepare.bpb_sums, prepare.sampling_error
eval_starts, _eval_batches, _windows, _check_logits = (prepare.eval_starts, prepare._eval_batches, prepare._windows,
                                                      prepare._check_logits)


# ---------------------------------------------------------------------------
# Causality probe

def _urandom_int(n):
    return int.from_bytes(os.urandom(8), "little") % n


def _urandom_permutation(n):
    keys = np.frombuffer(os.urandom(8 * n), dtype="<u8")
    return np.argsort(keys, kind="stable")


def _random_tokens(n, vocab):
    return torch.from_numpy(np.frombuffer(os.urandom(4 * n), dtype="<u4") % vocab).long()


def causality_probe(forward_fn, tokens, vocab, max_tokens=None):
    """Raise EvalError if a logit depends on a later token or on another row.

    The base input is one of the very batches that will be scored (picked with
    os.urandom, so the model cannot tell a probe from scoring). Tokens are then
    replaced by random ones and every logit that must not see them is compared
    with the base run:
      A. exhaustive over positions: every cut c = 1 .. SEQ_LEN-1 is tried once
         (B_EVAL cuts per forward pass, each in a row drawn at random): tokens
         from c on are replaced, logits before c must not move. A leak at any
         single position t (logit t reading token t+1 or later) is caught with
         certainty; a leak that only some rows of the batch commit is caught
         with probability 1/B_EVAL per (row, position) it touches.
         ceil((SEQ_LEN-1)/B_EVAL) passes: 32 for 256/8;
      B. eval batches hold windows of the same split, so a row could peek at
         another: whole rows are replaced, split by each bit of the row index
         both ways (any two rows are on opposite sides in some trial); the rows
         left alone must not move at all.
    Every pass has the same shape (B_EVAL, SEQ_LEN), so the same kernels run and an honest causal
    model's earlier logits are bit-identical (measured: 0 of thousands of rows move on CPU). Where
    kernels are not run-to-run deterministic, though, two passes over the *same* input differ too, and
    that is no leak: the base is computed twice, and a trial that exceeds the tolerance is rerun
    with the base, so the tolerance is CAUSAL_ATOL plus twice the largest jitter seen on identical
    inputs (never more than CAUSAL_MAX_TOL; a model noisier than that is refused as such)."""
    starts = eval_starts(len(tokens), max_tokens or EVAL_TOKENS)
    batches = list(_eval_batches(starts, B_EVAL, fixed_batch=True))
    x, _ = _windows(tokens, batches[_urandom_int(len(batches))][1])
    cuts = 1 + _urandom_permutation(SEQ_LEN - 1)        # every cut once, in random rows
    trials = []
    for first in range(0, len(cuts), B_EVAL):
        rows = [int(c) for c in cuts[first:first + B_EVAL]]
        trials.append(("later tokens of the same row", rows + [SEQ_LEN] * (B_EVAL - len(rows))))
    for bit in range((B_EVAL - 1).bit_length()):
        for side in (0, 1):
            trials.append(("tokens of other rows of the batch",
                           [0 if (r >> bit) & 1 == side else SEQ_LEN for r in range(B_EVAL)]))
    def worst(a, b, cuts):
        """(largest change of a checked logit, its row, its cut)."""
        return max((float((a[r, :c] - b[r, :c]).abs().max()), r, c) for r, c in enumerate(cuts) if c > 0)

    def tolerance(jitter):
        if jitter > CAUSAL_MAX_TOL / 2:
            raise EvalError(f"causality probe failed: the model's logits differ by {jitter:.3g} between two runs on "
                            f"the same input (more than {CAUSAL_MAX_TOL / 2:g}), so a dependence on future tokens "
                            "cannot be told from noise; make the model deterministic")
        return CAUSAL_ATOL + 2 * jitter

    with torch.no_grad():
        base = _check_logits(forward_fn(x), B_EVAL, vocab)
        jitter = float((_check_logits(forward_fn(x), B_EVAL, vocab) - base).abs().max())  # 0 where deterministic
        tol = tolerance(jitter)
        for what, cuts in trials:  # cuts[r]: positions >= cuts[r] replaced, positions < cuts[r] checked
            x2 = x.clone()
            for r, c in enumerate(cuts):
                if c < SEQ_LEN:
                    x2[r, c:] = _random_tokens(SEQ_LEN - c, vocab)
                    x2[r, c] = (x[r, c] + 1 + _urandom_int(vocab - 1)) % vocab  # surely different
            probe = _check_logits(forward_fn(x2), B_EVAL, vocab)
            diff, r, c = worst(probe, base, cuts)
            if diff > tol:   # a leak, or kernel jitter: rerun both inputs, and judge the smaller difference
                again = _check_logits(forward_fn(x2), B_EVAL, vocab)
                base2 = _check_logits(forward_fn(x), B_EVAL, vocab)
                jitter = max(jitter, float((again - probe).abs().max()), float((base2 - base).abs().max()))
                tol = tolerance(jitter)
                diff, r, c = min((diff, r, c), worst(again, base2, cuts))
                if diff > tol:
                    raise EvalError(f"causality probe failed: the logits of row {r} before position {c} changed "
                                    f"by {diff:.3g} (> {tol:.3g}) when {what} were replaced; the model "
                                    "reads future tokens")




# ---------------------------------------------------------------------------
# Evaluation of an exported archive

def evaluate_exported(model_path, data_dir=None):
    """Score an exported graph: the evaluate CLI's work, as a dict."""
    t0 = time.time()
    data_dir = data_dir or DATA_DIR
    pinned = ["val.bin", "test.bin"] + (["token_bytes.npy"] if TOKENIZER == "bpe" else [])
    meta = verify_data(data_dir, names=pinned)  # DataError -> exit 2
    if not os.path.isfile(model_path):
        raise EvalError(f"{model_path} not found; train.py must call prepare.export_model(model)")
    archive = pt2audit.checked_archive(model_path)  # EvalError: refused before torch reads a byte of it
    # every new tensor filled (NaN / max int) instead of handed out with what freed memory held
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        with pt2audit._pickle_free(), pt2audit._no_code_in_load():
            ep = torch.export.load(archive)
            ep._guards_code = []  # checked empty above; never exec'd (and guards are not generated at all)
            pt2audit._audit_graph(ep)
            module = ep.module(check_guards=False)  # input shapes: checked by a pre-hook, and by _check_logits
    except Exception as e:
        if isinstance(e, EvalError) and "pickled" not in str(e):
            raise
        if isinstance(e, EvalError) or type(e).__name__ == "UnpicklingError":
            raise EvalError(f"{model_path} holds pickled Python objects; only tensors and the graph are allowed "
                            "(save the model with prepare.export_model)") from None
        raise EvalError(f"cannot load the exported model {model_path}: {type(e).__name__}: {str(e)[:300]}") from None
    token_bytes = _token_bytes(meta, data_dir)
    vocab = VOCAB_SIZE

    # A model must be a pure function of its input: one that updates its own
    # buffers could carry information between calls (e.g. learn from val).
    def state():
        """Every tensor the module holds (weights, buffers, and the plain tensor attributes export keeps
        constants in), bitwise: NaN-safe."""
        tensors = list(module.named_parameters()) + list(module.named_buffers())
        for prefix, sub in module.named_modules():
            tensors += [(f"{prefix}.{k}" if prefix else k, v) for k, v in vars(sub).items()
                        if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter)]
        return {k: v.detach().contiguous().reshape(-1).view(torch.uint8).clone() for k, v in tensors}

    initial = state()

    def forward(x):
        try:
            out = module(x.clone())   # the model's own copy: what it writes there changes nothing of ours
        except Exception as e:
            raise EvalError(f"the model failed on input of shape {tuple(x.shape)} "
                            f"(expected (B_EVAL, SEQ_LEN) = ({B_EVAL}, {SEQ_LEN})): {type(e).__name__}: {e}") from None
        if not checked[0]:
            check_stateless()
            checked[0] = True
        return out

    def check_stateless():
        now = state()
        changed = [k for k in initial if k not in now or not torch.equal(now[k], initial[k])]
        if changed:
            raise EvalError(f"the model changes its own state in forward ({', '.join(changed[:3])}); "
                            "stateful models are not allowed")

    checked = [False]
    val = _tokens("val", data_dir)
    causality_probe(forward, val, vocab)
    result = {"ok": True, "causal": True}
    for split, tokens in (("val", val), ("test", _tokens("test", data_dir))):
        windows = []
        nats, nbytes, ntok = bpb_sums(forward, tokens, token_bytes, EVAL_TOKENS, B_EVAL, fixed_batch=True,
                                      per_window=windows)
        result[f"{split}_bpb"] = nats / (math.log(2) * nbytes)
        result[f"{split}_tokens"], result[f"{split}_bytes"] = ntok, nbytes
        result[f"{split}_se"] = sampling_error(windows)
    check_stateless()
    result["eval_seconds"] = round(time.time() - t0, 3)
    return result

