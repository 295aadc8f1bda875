"""
prepare.py -- the frozen harness of loopwright's GPT benchmark.

The agent never edits this file. With its two frozen siblings it holds
everything that decides the score: here the data (corpus, split, tokenizer),
the constants, the training dataloader, the training budget (its clock), the
exporter and the metric (bpb_sums); evaluate.py scores an exported model and
pt2audit.py checks its archive first (prepare.sibling loads them; train.py
needs neither). Imports: stdlib, numpy, torch only.

What train.py may use (everything else is internal):

    SEQ_LEN, VOCAB_SIZE, TIME_BUDGET          frozen constants (from loopwright.toml [benchmark])
    make_dataloader("train", batch, device, seed)
                                              endless (x, y) batches of the training split; the tokens
                                              it serves are what the "steps" clock counts
    evaluate_bpb(model, "train_eval", max_tokens=, device=)
                                              quick bits-per-byte on a held-out tail of train.bin that
                                              training batches never sample (val/test are not visible
                                              to train.py; the score comes from the evaluator)
    start_budget(model, eval_tokens=, max_steps=, print_every=, device=) -> TrainingBudget
        budget.step(loss) -> bool             once per optimizer step: counts it, prints the progress
                                              line, True when the next step would not fit the budget
        budget.progress()                     fraction of the training phase done, 0..1 (LR schedules)
        budget.steps, budget.tokens           optimizer steps / training tokens so far
        budget.elapsed, budget.remaining      budget used / left, on the active clock
        budget.training_seconds               wall seconds of the training loop (for throughput)
        budget.summary(**metrics)             prints the summary block after "---"
    export_model(model)                       the model the evaluator scores (LOOPWRIGHT_EXPORT_PATH)
    peak_flops(device)                        the machine's peak, for an MFU figure

For the runner (not train.py): hard_limit_seconds() = the wall-clock limit to
enforce from outside for the active clock; summary keys `clock:`,
`budget_used:`, `cpu_seconds:`, `num_steps:`, `total_tokens_M:`; progress lines
`step=N loss=L elapsed=E remaining=R` (E, R on the budget clock).

    python prepare.py prepare  [--corpus stdlib-hidden|stdlib|tinystories|climbmix|PATH] [--tokenizer byte|bpe] [--data-dir D]
    python prepare.py verify   [--data-dir D]
    python prepare.py evaluate MODEL.pt2 [--data-dir D]
    python prepare.py limits                  # {"clock": ..., "hard_limit_seconds": ...} as JSON

Constants come from the [benchmark] section of loopwright.toml next to this
file (defaults below); never from environment variables, which train.py could
set before importing us.

Budget clock ([benchmark] clock). Every run gets the same amount of training,
measured on one of three clocks; train.py does not know which one is active:
  wall   seconds of wall clock since the process started (autoresearch's rule;
         right for a dedicated GPU, but other jobs on a shared CPU change how
         much training fits);
  cpu    CPU seconds of this process (all threads, children included, as the
         kernel counts them, startup included): when other jobs take the CPU
         the run waits without being charged, so the amount of training does
         not change. Speed-ups still pay off (fewer CPU seconds per step);
         using more cores does not buy more budget. On an idle machine a run
         takes between TIME_BUDGET / cores and TIME_BUDGET of wall clock,
         depending on how well it keeps the cores busy. Needs OMP_WAIT_POLICY=PASSIVE
         (train.py sets it): spinning OpenMP threads burn CPU seconds for
         nothing (8x more per step, measured);
  steps  a fixed number of training tokens (BUDGET_TOKENS, counted by the
         training dataloader, so a bigger batch buys fewer steps, not more
         data): the same seed gives a bit-identical result on the same machine;
  auto   (default) cpu when no CUDA/MPS device is present, wall with one (the
         CPU clock cannot see asynchronous GPU work).
The budget covers the whole run: startup, training, quick eval and export.

Metric. val_bpb = sum of cross-entropy nats over the scored target tokens
/ (ln 2 * sum of the UTF-8 bytes of those targets), computed here from the
model's logits over EVAL_TOKENS targets of the validation split, in windows of
SEQ_LEN spread evenly over the whole split (test_bpb the same on the test
split). Per-token byte lengths are exact (byte tokenizer: 1; BPE: the length
of the token's byte string), never taken from a lossy decode.

Document separators. Every document is preceded by one separator token SEP
(byte 0 for the byte tokenizer -- NUL never occurs in the corpus because NUL
characters are stripped and binary files skipped; a special token for BPE).
SEP stands for no text, so its byte length is 0: as a *target* it is excluded
from both sums (no nats, no bytes); as *input* it is ordinary context (it
tells the model a new document starts). A model is thus neither rewarded nor
penalised for predicting document boundaries, and uniform logits over the 256
bytes score exactly 8 bits per byte.

Evaluation (evaluate.py) runs the exported graph (torch.export, see export_model)
in this process on CPU; it never imports train.py, and when run as a script
this file drops its own directory and the cwd from sys.path so a file in the
workspace cannot shadow a library either (the siblings are loaded by path). A
causality probe (evaluate.causality_probe) rejects
models whose logits depend on future tokens -- at any single position -- or
on other rows of the batch; a model that changes its own state is rejected.
"""
import gc
import hashlib
import json
import math
import os
import sys
import time

if __name__ == "__main__":
    # The evaluator must not import anything from the workspace (train.py, or a
    # file shadowing a library): drop our directory and the cwd from sys.path
    # before importing numpy/torch. The runner also launches us with `python -I`.
    _blocked = {os.path.realpath(os.path.dirname(os.path.abspath(__file__))), os.path.realpath(os.getcwd())}
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") not in _blocked]
    # idle OpenMP threads sleep rather than spin: a busy shared CPU made evaluation ~3x slower otherwise
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))

# ---------------------------------------------------------------------------
# Constants (defaults; loopwright.toml [benchmark] overrides the first eight)

TIME_BUDGET = 30.0          # seconds per training run on the budget clock (train.py obeys it via TrainingBudget)
CLOCK = "auto"              # wall | cpu | steps | auto (see the module docstring)
BUDGET_TOKENS = 204_800     # training tokens per run on the steps clock (100 steps of the baseline's 2,048)
GRACE_SECONDS = 60.0        # what the runner allows beyond the budget before its hard kill
SEQ_LEN = 256               # context length; the exported model takes (B_EVAL, SEQ_LEN)
EVAL_TOKENS = 131072        # target tokens scored on val (and on test), in windows spread over the split
CORPUS = "stdlib-hidden"    # stdlib-hidden | stdlib | tinystories | climbmix | a path
TOKENIZER = "byte"          # byte | bpe

B_EVAL = 8                  # batch size of the exported evaluation graph
VAL_PERCENT = 5             # documents with sha256(name) % 100 < 5 -> val
TEST_PERCENT = 5            # next 5 % -> test, the rest -> train
STDLIB_MAX_BYTES = 12_000_000    # cap on the stdlib corpus (sorted files, then pydoc topics)
MAX_CORPUS_BYTES = 200_000_000   # cap on any other corpus
# stdlib-hidden: val/test are these standard-library modules and packages (cut into HELDOUT_PIECE_BYTES
# documents, half to each split), train is the rest of the stdlib. Training imports none of them (numpy,
# torch and this file do not either), so train.py's sandbox masks their sources and caches in every Python
# installation it can find (mcp_server/loop/sandbox.py): a train.py cannot rebuild val/test from them.
HELDOUT_STDLIB = ("xmlrpc", "wsgiref", "curses", "dbm", "mailbox", "imaplib", "smtplib", "ftplib", "poplib",
                  "nntplib", "telnetlib")   # packages (folders) or modules (NAME.py); absent ones are skipped
HELDOUT_PIECE_BYTES = 4096
STDLIB_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test",
                    "encodings", "pydoc_data"}  # tests/codec tables are not prose-like code; topics added separately
TEXT_PIECE_BYTES = 16_384   # a single text file is cut into documents of about this size (at line ends)
BPE_VOCAB_SIZE = 8192       # including the separator token
TRAIN_EVAL_TOKENS = 262_144 # the end of train.bin, never sampled for training: train.py's quick eval
                            # ("train_eval"); at most 5 % of the split
CPU_WALL_FACTOR = 4.0       # cpu/steps clocks: the runner's hard limit is this many times TIME_BUDGET of
                            # wall clock (+ grace): room for a machine shared with other jobs
CAUSAL_ATOL = 1e-4          # max change of an earlier logit allowed when later tokens change
                            # (leaks below it can gain at most ~2*atol/ln2 bits per token)
CAUSAL_MAX_TOL = 2e-3       # ... widened by the model's own run-to-run jitter on identical input, at most to this
TINYSTORIES_URL = "https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/TinyStoriesV2-GPT4-valid.txt"
CLIMBMIX_URL = "https://huggingface.co/datasets/karpathy/climbmix-400b-shuffle/resolve/main/shard_{:05d}.parquet"
CLIMBMIX_SHARDS = (0,)
SEP_TEXT = "<|doc|>"        # name of the BPE separator token


def _read_config():
    path = os.path.join(HERE, "loopwright.toml")
    if not os.path.isfile(path):
        return {}
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    with open(path, "rb") as f:
        return tomllib.load(f).get("benchmark", {})


_cfg = _read_config()
TIME_BUDGET = float(_cfg.get("time_budget", TIME_BUDGET))
CLOCK = str(_cfg.get("clock", CLOCK))
BUDGET_TOKENS = int(_cfg.get("budget_tokens", BUDGET_TOKENS))
GRACE_SECONDS = float(_cfg.get("grace_seconds", GRACE_SECONDS))
SEQ_LEN = int(_cfg.get("seq_len", SEQ_LEN))
EVAL_TOKENS = int(_cfg.get("eval_tokens", EVAL_TOKENS))
CORPUS = str(_cfg.get("corpus", CORPUS))
TOKENIZER = str(_cfg.get("tokenizer", TOKENIZER))
VOCAB_SIZE = 256 if TOKENIZER == "byte" else BPE_VOCAB_SIZE
DATA_DIR = os.path.join(HERE, ".loopwright", "data")
SPLITS = ("train", "val", "test")


class DataError(Exception):
    """Data missing or changed since prepare (evaluate exits 2)."""


class EvalError(Exception):
    """The model cannot be scored (evaluate exits 1 with the reason)."""


# ---------------------------------------------------------------------------
# Corpus: an iterator of (document name, text)

def _file_text(path):
    """Text of a file, or None for binary / non-UTF-8 files."""
    with open(path, "rb") as f:
        raw = f.read()
    if b"\x00" in raw[:8192]:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _stdlib_docs(skip=()):
    """Every .py of the standard library (sorted), then the pydoc topics; top-level names in `skip` left out."""
    import sysconfig
    root = sysconfig.get_paths()["stdlib"]
    for dirpath, dirnames, filenames in os.walk(root):
        top = dirpath == root
        dirnames[:] = sorted(d for d in dirnames if d not in STDLIB_SKIP_DIRS and not (top and d in skip))
        for fn in sorted(filenames):
            if fn.endswith(".py") and not (top and fn[:-3] in skip):
                text = _file_text(os.path.join(dirpath, fn))
                if text:
                    yield os.path.relpath(os.path.join(dirpath, fn), root).replace(os.sep, "/"), text
    import pydoc_data.topics
    for key in sorted(pydoc_data.topics.topics):
        yield "pydoc:" + key, pydoc_data.topics.topics[key]


def _heldout_docs():
    """stdlib-hidden's val/test text: the HELDOUT_STDLIB sources, in pieces named heldout:<path>#<i>."""
    import sysconfig
    root = sysconfig.get_paths()["stdlib"]
    for mod in HELDOUT_STDLIB:
        base = os.path.join(root, mod)
        files = [base + ".py"] if os.path.isfile(base + ".py") else []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d not in STDLIB_SKIP_DIRS)
            files += [os.path.join(dirpath, fn) for fn in sorted(filenames) if fn.endswith(".py")]
        for path in files:
            text = _file_text(path)
            if text:
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                yield from _pieces("heldout:" + rel, text, HELDOUT_PIECE_BYTES)


def _stdlib_hidden_docs():
    yield from _heldout_docs()
    yield from _stdlib_docs(skip=HELDOUT_STDLIB)


def _pieces(name, text, size=TEXT_PIECE_BYTES):
    """Cut one long text into documents at line ends, so that the split has something to split."""
    if SEP_TEXT in text or "<|endoftext|>" in text:
        parts = text.replace(SEP_TEXT, "<|endoftext|>").split("<|endoftext|>")
    else:
        parts, cur, n = [], [], 0
        for line in text.splitlines(keepends=True):
            cur.append(line)
            n += len(line)
            if n >= size:
                parts.append("".join(cur))
                cur, n = [], 0
        parts.append("".join(cur))
    for i, p in enumerate(parts):
        if p.strip():
            yield f"{name}#{i}", p


def _path_docs(path):
    path = os.path.abspath(path)
    if os.path.isfile(path):
        text = _file_text(path)
        if text is None:
            raise DataError(f"{path} is not a UTF-8 text file")
        yield from _pieces(os.path.basename(path), text)
        return
    if not os.path.isdir(path):
        raise DataError(f"corpus {path!r} is neither stdlib-hidden|stdlib|tinystories|climbmix nor an existing "
                        "file or folder")
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for fn in sorted(filenames):
            if os.path.islink(os.path.join(dirpath, fn)):
                continue  # its text lives elsewhere, where the training sandbox does not hide it
            text = _file_text(os.path.join(dirpath, fn))
            if text:
                yield os.path.relpath(os.path.join(dirpath, fn), path).replace(os.sep, "/"), text


def _sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download(url, dest, checksums):
    """Fetch url to dest once. The first download records its SHA-256 in
    `checksums` (kept in meta.json); later runs verify the cached or re-fetched
    file against it and raise DataError on a mismatch."""
    import urllib.request
    name = os.path.basename(dest)
    if not os.path.exists(dest):
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        print(f"downloading {url}", file=sys.stderr)
        tmp = dest + ".part"
        with urllib.request.urlopen(url, timeout=60) as r, open(tmp, "wb") as f:
            while True:
                block = r.read(1 << 20)
                if not block:
                    break
                f.write(block)
        os.replace(tmp, dest)
    digest = _sha256_file(dest)
    known = checksums.get(name, {}).get("sha256")
    if known is None:
        checksums[name] = {"url": url, "sha256": digest}
    elif known != digest:
        raise DataError(f"{dest}: SHA-256 {digest[:12]}... differs from the one recorded at first download "
                        f"({known[:12]}...); delete the file to fetch it again, or remove the entry from meta.json")
    return dest


def _tinystories_docs(raw_dir, checksums):
    path = download(TINYSTORIES_URL, os.path.join(raw_dir, os.path.basename(TINYSTORIES_URL)), checksums)
    with open(path, encoding="utf-8", errors="replace") as f:
        for i, story in enumerate(f.read().split("<|endoftext|>")):
            if story.strip():
                yield f"tinystories:{i}", story.strip() + "\n"


def _climbmix_docs(raw_dir, checksums):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError("the climbmix corpus is parquet: install pyarrow (pip install pyarrow) "
                        "or use --corpus stdlib / tinystories / PATH") from None
    for shard in CLIMBMIX_SHARDS:
        url = CLIMBMIX_URL.format(shard)
        path = download(url, os.path.join(raw_dir, os.path.basename(url)), checksums)
        texts = pq.read_table(path, columns=["text"]).column("text").to_pylist()
        for row, text in enumerate(texts):
            if text:
                yield f"climbmix:{shard}:{row}", text


def iter_documents(corpus, raw_dir, checksums):
    """(name, text) pairs, in a deterministic order, capped in total UTF-8 bytes."""
    if corpus == "stdlib-hidden":
        docs, cap = _stdlib_hidden_docs(), STDLIB_MAX_BYTES   # the held-out pieces come first: never capped
    elif corpus == "stdlib":
        docs, cap = _stdlib_docs(), STDLIB_MAX_BYTES
    elif corpus == "tinystories":
        docs, cap = _tinystories_docs(raw_dir, checksums), MAX_CORPUS_BYTES
    elif corpus == "climbmix":
        docs, cap = _climbmix_docs(raw_dir, checksums), MAX_CORPUS_BYTES
    else:
        docs, cap = _path_docs(corpus), MAX_CORPUS_BYTES
    total = 0
    for name, text in docs:
        text = text.replace("\x00", "")  # NUL is the byte tokenizer's separator
        n = len(text.encode("utf-8"))
        if total + n > cap:
            break
        total += n
        yield name, text


def split_of(name, corpus=None):
    """train / val / test by a hash of the document name: stable under corpus growth. stdlib-hidden: its
    held-out pieces go to val or test (half each, by the hash), everything else to train."""
    h = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big") % 100
    if corpus == "stdlib-hidden":
        return ("val" if h % 2 == 0 else "test") if name.startswith("heldout:") else "train"
    if h < VAL_PERCENT:
        return "val"
    return "test" if h < VAL_PERCENT + TEST_PERCENT else "train"


# ---------------------------------------------------------------------------
# Tokenizers

class ByteTokenizer:
    vocab_size = 256
    sep = 0

    def encode(self, text):
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)


class BPETokenizer:
    """rustbpe-trained BPE used through tiktoken; the separator is the last id
    (BPE_VOCAB_SIZE - 1), whatever the number of merges the corpus allowed."""

    def __init__(self, pattern, ranks):
        import tiktoken
        if len(ranks) >= BPE_VOCAB_SIZE:
            raise DataError(f"BPE has {len(ranks)} tokens; at most {BPE_VOCAB_SIZE - 1} fit before the separator")
        self.sep = BPE_VOCAB_SIZE - 1
        self.vocab_size = BPE_VOCAB_SIZE
        self.enc = tiktoken.Encoding(name="loopwright", pat_str=pattern, mergeable_ranks=ranks,
                                     special_tokens={SEP_TEXT: self.sep})
        self.pattern, self.ranks = pattern, ranks

    @classmethod
    def train(cls, texts, vocab_size=BPE_VOCAB_SIZE):
        try:
            import rustbpe
            import tiktoken  # noqa: F401
        except ImportError:
            raise DataError("--tokenizer bpe needs rustbpe and tiktoken (pip install rustbpe tiktoken); "
                            "the default byte tokenizer needs nothing") from None
        tok = rustbpe.Tokenizer()
        tok.train_from_iterator(texts, vocab_size=vocab_size - 1)  # one id left for the separator
        return cls(tok.get_pattern(), {bytes(b): int(r) for b, r in tok.get_mergeable_ranks()})

    def encode(self, text):
        return np.asarray(self.enc.encode_ordinary(text), dtype=np.uint16)

    def token_bytes(self):
        """Exact byte length of every token id (0 for the separator)."""
        lengths = np.zeros(self.vocab_size, dtype=np.int32)
        for b, r in self.ranks.items():
            lengths[r] = len(b)
        return lengths

    def save(self, path):
        import base64
        with open(path, "w") as f:
            json.dump({"pattern": self.pattern, "sep": self.sep,
                       "ranks": [[base64.b64encode(b).decode(), r] for b, r in sorted(self.ranks.items(), key=lambda kv: kv[1])]}, f)


# ---------------------------------------------------------------------------
# prepare / verify

def _meta_path(data_dir):
    return os.path.join(data_dir, "meta.json")


def load_meta(data_dir=None):
    path = _meta_path(data_dir or DATA_DIR)
    if not os.path.isfile(path):
        raise DataError(f"{path} not found; run `python prepare.py prepare` first")
    with open(path) as f:
        return json.load(f)


def prepare_data(corpus=None, data_dir=None, tokenizer=None, quiet=False):
    """Build train/val/test .bin (uint16 little endian) + meta.json; returns meta."""
    corpus, data_dir, tokenizer = corpus or CORPUS, data_dir or DATA_DIR, tokenizer or TOKENIZER
    if corpus not in ("stdlib-hidden", "stdlib", "tinystories", "climbmix"):
        corpus = os.path.abspath(corpus)
    os.makedirs(data_dir, exist_ok=True)
    try:
        checksums = load_meta(data_dir).get("downloads", {})
    except (DataError, ValueError):
        checksums = {}
    docs = {s: [] for s in SPLITS}
    for name, text in iter_documents(corpus, os.path.join(data_dir, "raw"), checksums):
        docs[split_of(name, corpus)].append(text)
    if tokenizer == "byte":
        tok = ByteTokenizer()
    elif tokenizer == "bpe":
        tok = BPETokenizer.train(iter(docs["train"]))
    else:
        raise DataError(f"unknown tokenizer {tokenizer!r}; use byte or bpe")
    files, stats = {}, {}
    sep = np.array([tok.sep], dtype=np.uint16)
    for split in SPLITS:
        parts = []
        for text in docs[split]:
            parts += [sep, tok.encode(text)]
        ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)
        if split != "train" and len(ids) < SEQ_LEN + 1:
            raise DataError(f"the {split} split of corpus {corpus!r} has only {len(ids)} tokens (< SEQ_LEN+1 = "
                            f"{SEQ_LEN + 1}); use a bigger corpus (more documents)")
        path = os.path.join(data_dir, f"{split}.bin")
        ids.astype("<u2").tofile(path)
        files[f"{split}.bin"] = _sha256_file(path)
        stats[split] = {"documents": len(docs[split]), "tokens": int(len(ids))}
    token_bytes = None
    if tokenizer == "bpe":
        np.save(os.path.join(data_dir, "token_bytes.npy"), tok.token_bytes())
        tok.save(os.path.join(data_dir, "tokenizer.json"))
        token_bytes = "token_bytes.npy"
        files[token_bytes] = _sha256_file(os.path.join(data_dir, token_bytes))
    meta = {"tokenizer": tokenizer, "vocab_size": tok.vocab_size, "corpus": corpus, "files": files,
            "token_bytes": token_bytes, "separator": int(tok.sep), "splits": stats,
            "split_rule": (f"held-out stdlib ({', '.join(HELDOUT_STDLIB)}): sha256(name) even val, odd test; "
                           "the rest train") if corpus == "stdlib-hidden" else
                          f"sha256(name) % 100: < {VAL_PERCENT} val, < {VAL_PERCENT + TEST_PERCENT} test, else train",
            "python": sys.version.split()[0] if corpus in ("stdlib", "stdlib-hidden") else None,
            "downloads": checksums}
    tmp = _meta_path(data_dir) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
    os.replace(tmp, _meta_path(data_dir))
    if not quiet:
        print(f"prepared {corpus} ({tokenizer}) in {data_dir}: " +
              ", ".join(f"{s} {stats[s]['documents']} docs / {stats[s]['tokens']:,} tokens" for s in SPLITS))
    return meta


def verify_data(data_dir=None, names=None):
    """Check data files (default: all listed) against the SHA-256 in meta.json; returns meta or raises DataError."""
    data_dir = data_dir or DATA_DIR
    meta = load_meta(data_dir)
    for name in sorted(meta["files"]) if names is None else names:
        digest = meta["files"].get(name)
        path = os.path.join(data_dir, name)
        if digest is None:
            raise DataError(f"meta.json records no hash for {name}; re-run `python prepare.py prepare`")
        if not os.path.isfile(path):
            raise DataError(f"{path} is missing; re-run `python prepare.py prepare`")
        if _sha256_file(path) != digest:
            raise DataError(f"{path} changed since prepare (SHA-256 differs from meta.json); "
                            "the data is pinned -- restore it or re-run prepare in a new workspace")
    return meta


def _tokens(split, data_dir=None):
    return np.fromfile(os.path.join(data_dir or DATA_DIR, f"{split}.bin"), dtype="<u2")


def _token_bytes(meta, data_dir):
    """Exact UTF-8 byte length per token id (0 = separator, excluded from both sums).

    Decided by the frozen TOKENIZER constant, not by meta.json's fields (meta.json
    sits in the data dir; only the hashed data files are pinned): byte -> 1 for
    every id but the separator 0; bpe -> token_bytes.npy, whose hash is pinned."""
    if meta.get("tokenizer") != TOKENIZER or meta.get("vocab_size") != VOCAB_SIZE:
        raise DataError(f"the data was prepared with tokenizer {meta.get('tokenizer')!r} (vocab "
                        f"{meta.get('vocab_size')}) but the frozen config says {TOKENIZER!r} (vocab {VOCAB_SIZE})")
    if TOKENIZER == "byte":
        tb = np.ones(VOCAB_SIZE, dtype=np.int64)
        tb[ByteTokenizer.sep] = 0
    else:
        tb = np.load(os.path.join(data_dir, "token_bytes.npy")).astype(np.int64)
        if tb.shape != (VOCAB_SIZE,) or tb[VOCAB_SIZE - 1] != 0 or (tb < 0).any():
            raise DataError("token_bytes.npy does not match the BPE vocabulary")
    return torch.from_numpy(tb)


# ---------------------------------------------------------------------------
# Training data

def _train_eval_size(n):
    """Tokens carved from the end of a train split of n tokens for train.py's quick eval."""
    return min(TRAIN_EVAL_TOKENS, n // 20)


def _train_part(split, data_dir=None):
    """'train': what training batches are drawn from; 'train_eval': the tail after it."""
    tokens = _tokens("train", data_dir)
    cut = len(tokens) - _train_eval_size(len(tokens))
    return tokens[:cut] if split == "train" else tokens[cut:]


_served = {"train": 0}   # tokens served by training dataloaders in this process: the steps clock


class Dataloader:
    """Endless iterator of (x, y) int64 batches: random windows of SEQ_LEN+1
    tokens, drawn by a seeded numpy generator, from the training split minus
    its last few percent ("train") or from that tail ("train_eval")."""

    def __init__(self, split="train", batch_size=16, device="cpu", seed=0, seq_len=None, data_dir=None):
        if split not in ("train", "train_eval"):
            raise ValueError(f"split {split!r}: only 'train' (and its held-out tail 'train_eval') may be used "
                             "by train.py; val and test decide the score")
        data_dir = data_dir or DATA_DIR
        meta = load_meta(data_dir)
        if meta["vocab_size"] != VOCAB_SIZE:
            raise DataError(f"data in {data_dir} has vocab {meta['vocab_size']} but TOKENIZER={TOKENIZER!r} "
                            f"implies {VOCAB_SIZE}; re-run prepare")
        self.split = split
        self.tokens = _train_part(split, data_dir)
        self.seq_len = seq_len or SEQ_LEN
        if len(self.tokens) < self.seq_len + 2:
            raise DataError(f"the {split} part of the training data has only {len(self.tokens)} tokens "
                            f"(< SEQ_LEN+2 = {self.seq_len + 2}); use a bigger corpus")
        self.batch_size, self.device = batch_size, torch.device(device)
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.offsets = np.arange(self.seq_len + 1)

    def __iter__(self):
        return self

    def __next__(self):
        starts = self.rng.integers(0, len(self.tokens) - self.seq_len - 1, size=self.batch_size)
        w = torch.from_numpy(self.tokens[starts[:, None] + self.offsets].astype(np.int64))
        if self.device.type == "cuda":
            w = w.pin_memory().to(self.device, non_blocking=True)
        else:
            w = w.to(self.device)
        if self.split == "train":
            _served["train"] += self.batch_size * self.seq_len
        return w[:, :-1], w[:, 1:]


def make_dataloader(split="train", batch_size=16, device="cpu", seed=0, **kw):
    return Dataloader(split, batch_size, device, seed, **kw)


# ---------------------------------------------------------------------------
# Training budget: the clock every train.py runs against (see the module docstring)

CLOCKS = ("wall", "cpu", "steps", "auto")


def _gpu_present():
    if torch.cuda.is_available():
        return True
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def active_clock():
    """The clock in force: CLOCK, with "auto" resolved (cpu without CUDA/MPS, wall with one)."""
    if CLOCK not in CLOCKS:
        raise ValueError(f"[benchmark] clock = {CLOCK!r} in loopwright.toml; use one of {', '.join(CLOCKS)}")
    if CLOCK == "auto":
        return "wall" if _gpu_present() else "cpu"
    return CLOCK


def hard_limit_seconds(clock=None):
    """Wall-clock seconds after which the runner kills a training run, for `clock` (default CLOCK;
    "auto" gets the larger limit, since the runner does not know the device). wall: TIME_BUDGET +
    GRACE_SECONDS. cpu / steps: CPU_WALL_FACTOR * TIME_BUDGET + GRACE_SECONDS, because those
    clocks do not advance while other jobs hold the CPU (cpu), or do not look at time at all
    (steps: TIME_BUDGET is then what BUDGET_TOKENS is expected to take)."""
    clock = CLOCK if clock is None else clock
    if clock not in CLOCKS:
        raise ValueError(f"unknown clock {clock!r}; use one of {', '.join(CLOCKS)}")
    factor = 1.0 if clock == "wall" else CPU_WALL_FACTOR
    return factor * TIME_BUDGET + GRACE_SECONDS


def _children_cpu_seconds():
    """CPU seconds of live descendant processes (Linux /proc; 0 elsewhere). Reaped children are
    in resource.RUSAGE_CHILDREN; live ones would otherwise escape the cpu clock."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total, todo, seen = 0.0, [os.getpid()], set()
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except (OSError, ValueError):
                continue
            for kid in kids:
                if kid in seen:
                    continue
                seen.add(kid)
                todo.append(kid)
                try:
                    with open(f"/proc/{kid}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    total += (int(fields[11]) + int(fields[12])) / tick   # utime, stime
                except (OSError, ValueError, IndexError):
                    pass
    return total


def cpu_seconds():
    """CPU seconds used by this process since it started (all threads) and by its children."""
    import resource
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime + _children_cpu_seconds()


def _process_start_time():
    """time.time() at which this process started, from the kernel (Linux), else None."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        started = time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return started if 0 <= time.time() - started < 3600 else None   # implausible: not a fresh process


_IMPORTED_AT = time.time()


class TrainingBudget:
    """The budget bookkeeping of one training run, on the active clock (see start_budget).

    Times are in budget units: seconds for the wall clock, CPU seconds of the process (all
    threads, children included) for the cpu clock. On the steps clock the budget is
    BUDGET_TOKENS tokens served by make_dataloader("train"); elapsed/remaining are then wall
    seconds and an estimate. The loop stops early enough for the quick eval and the export to fit:
    the export is predicted from the start-up just measured (both single-threaded Python work) and
    the parameter count, the quick eval from the warm step time."""

    def __init__(self, model=None, eval_tokens=0, max_steps=0, print_every=1.0, device="cpu",
                 since_process_start=True, clock=None):
        self.clock = clock or active_clock()
        if self.clock not in ("wall", "cpu", "steps"):
            raise ValueError(f"clock {self.clock!r}: use wall, cpu or steps")
        self.device = str(device)
        self.max_steps, self.eval_tokens, self.print_every = int(max_steps), int(eval_tokens), float(print_every)
        wall_now, cpu_now = time.time(), cpu_seconds()
        started = _process_start_time() if since_process_start else None
        if since_process_start and started is None:
            started = _IMPORTED_AT   # no /proc: from the import of this module
        self._wall0 = started if since_process_start else wall_now
        self._cpu0 = 0.0 if since_process_start else cpu_now
        self.budget = float(BUDGET_TOKENS if self.clock == "steps" else TIME_BUDGET)
        self.steps, self.tokens = 0, 0
        self._served0 = _served["train"]
        self._loop_wall = wall_now
        self._loop_clock = self._now()
        self._startup = self._loop_clock
        n_tensors = len(list(model.parameters())) if model is not None else 18
        wall_export = 1.0 + 0.045 * n_tensors        # tracing cost grows with the layers: ~1.8 s for the baseline
        self._export = max(wall_export, 0.5 * self._startup)
        self._step_time = 0.0      # per step, budget units (smoothed once warm)
        self._step_tokens = 0
        self._prev = self._loop_clock
        self._train_end = self.budget - self._export - 1.0
        self._last_print, self.last_loss = -1e9, float("nan")
        self._done = False
        self.training_seconds = 0.0

    # -- clocks ---------------------------------------------------------------
    def _now(self):
        if self.clock == "cpu":
            return cpu_seconds() - self._cpu0
        if self.clock == "steps":
            return float(self.tokens)
        return time.time() - self._wall0

    def _sync(self):
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        elif self.device.startswith("mps"):
            torch.mps.synchronize()

    @property
    def elapsed(self):
        """Budget used so far (wall: seconds; cpu: CPU seconds; steps: wall seconds)."""
        return time.time() - self._wall0 if self.clock == "steps" else self._now()

    @property
    def remaining(self):
        if self.clock == "steps":
            done = self.progress()
            spent = time.time() - self._loop_wall
            return spent * (1 - done) / done if done > 0 else float("nan")
        return max(0.0, self.budget - self._now())

    def progress(self):
        """Fraction of the training phase done, in [0, 1]: by step count when max_steps is set,
        else by tokens (steps clock) or by the clock against the planned end of training."""
        if self.max_steps > 0:
            frac = self.steps / self.max_steps
        elif self.clock == "steps":
            frac = self.tokens / self.budget
        else:
            frac = (self._now() - self._loop_clock) / max(1e-6, self._train_end - self._loop_clock)
        return min(1.0, max(0.0, frac))

    def should_stop(self, step_time=None):
        """Would one more step (of step_time budget units; default the smoothed last ones) overrun?"""
        if self.max_steps > 0 and self.steps >= self.max_steps:
            return True
        if self.clock == "steps":
            return self.tokens + (self._step_tokens if step_time is None else step_time) > self.budget
        step_time = self._step_time if step_time is None else step_time
        return self._now() + step_time > self._train_end

    # -- the loop -------------------------------------------------------------
    def step(self, loss=None):
        """Call once after every optimizer step. Counts it (and the training tokens the dataloader
        served since the last call), refines the plan, prints a progress line about every
        print_every seconds and at the end, and returns True when training should stop.
        A non-finite loss ends the run (exit 1) with a `loss=nan -- diverged` line."""
        self._sync()
        served = _served["train"] - self._served0
        self._step_tokens, self.tokens = served - self.tokens, served
        self.steps += 1
        if self.clock == "steps" and self._step_tokens <= 0:
            raise RuntimeError("the steps clock counts the tokens served by prepare.make_dataloader('train'); "
                               "no batch was drawn from it since the last budget.step()")
        if self.clock != "steps":
            now = self._now()
            dt, self._prev = now - self._prev, now
            if self.steps <= 3:      # warm-up steps are slow: "does one more fit?" only, no plan from them
                self._step_time = dt
            else:                    # warm: smooth the step time and refine the plan
                self._step_time = dt if self.steps == 4 else 0.8 * self._step_time + 0.2 * dt
                quick_eval = self._step_time / 3 * self.eval_tokens / max(1, self._step_tokens)
                self._train_end = self.budget - self._export - quick_eval - 0.2
        self._done = self.should_stop()
        wall = time.time()
        if wall - self._last_print >= self.print_every or self._done:
            value = float(loss.item() if hasattr(loss, "item") else loss) if loss is not None else float("nan")
            self.last_loss = value
            if loss is not None and not math.isfinite(value):
                print(f"step={self.steps} loss={value} -- diverged", flush=True)
                sys.exit(1)
            print(f"step={self.steps} loss={value:.6f} elapsed={self.elapsed:.2f} "
                  f"remaining={self.remaining:.2f}", flush=True)
            self._last_print = wall
        if self._done:
            self.training_seconds = time.time() - self._loop_wall
        return self._done

    def summary(self, **metrics):
        """Print the summary block: '---', then `key: value` lines -- the given metrics first (in
        order), then the budget's own: training_seconds, total_seconds, total_tokens_M, num_steps,
        final_loss, clock, budget_used (fraction of the budget), cpu_seconds."""
        if not self.training_seconds:
            self.training_seconds = time.time() - self._loop_wall
        used = self.tokens / self.budget if self.clock == "steps" else self._now() / self.budget
        lines = dict(metrics)
        lines.update(training_seconds=f"{self.training_seconds:.1f}",
                     total_seconds=f"{time.time() - self._wall0:.1f}",
                     total_tokens_M=f"{self.tokens / 1e6:.6f}", num_steps=self.steps,
                     final_loss=f"{self.last_loss:.6f}", clock=self.clock, budget_used=f"{used:.3f}",
                     cpu_seconds=f"{cpu_seconds() - self._cpu0:.1f}")
        print("---")
        for key, value in lines.items():
            if isinstance(value, float):
                value = f"{value:.6f}".rstrip("0").rstrip(".")
            print(f"{key + ':':<18}{value}")
        sys.stdout.flush()


def start_budget(model=None, eval_tokens=0, max_steps=0, print_every=1.0, device="cpu", **kw):
    """Start the training clock (call it right before the training loop; the budget counts from
    the start of the process, so imports and model setup are paid for too).
    model: to predict the export time from its size; eval_tokens: the tokens of the quick eval
    after the loop (reserved from the budget); max_steps > 0: also stop after that many steps,
    and progress() follows the step count (reproducible runs on any clock)."""
    return TrainingBudget(model, eval_tokens, max_steps, print_every, device, **kw)


# ---------------------------------------------------------------------------
# Export

def export_model(model, path=None):
    """Export `model` (idx int64 (B, T) -> logits (B, T, VOCAB_SIZE)) with
    torch.export at the evaluation shape (B_EVAL, SEQ_LEN) and save it.

    The model is put in eval mode and moved to the CPU (in place): the graph
    is exported in fp32 on CPU so that the evaluator can run it anywhere.
    path: argument, else env LOOPWRIGHT_EXPORT_PATH (set by the runner), else
    model.pt2. Returns the path."""
    path = path or os.environ.get("LOOPWRIGHT_EXPORT_PATH") or "model.pt2"
    model = getattr(model, "_orig_mod", model)  # a torch.compile wrapper: export the module inside
    model = model.to("cpu").eval()
    x = torch.zeros((B_EVAL, SEQ_LEN), dtype=torch.long)
    with torch.no_grad():
        ep = torch.export.export(model, (x,))
    out = [n for n in ep.graph.nodes if n.op == "output"][0].args[0]
    val = out[0].meta.get("val") if len(out) else None
    shape = tuple(val.shape) if val is not None and hasattr(val, "shape") else None
    if shape != (B_EVAL, SEQ_LEN, VOCAB_SIZE):
        raise ValueError(f"the model must return logits of shape (B, T, {VOCAB_SIZE}); "
                         f"at (B={B_EVAL}, T={SEQ_LEN}) it returned {shape or type(val).__name__}")
    if os.path.dirname(os.path.abspath(path)):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.export.save(ep, path)
    # The model is saved; what is left of the run is its exit, where collecting torch.export's many
    # objects costs ~1.5 CPU s on the runner's meter (0.3 s frozen). Frozen objects are never collected,
    # which is harmless this late: new garbage still is, and the process ends soon.
    gc.freeze()
    return path


# ---------------------------------------------------------------------------
# Evaluation

def _check_logits(out, batch, vocab):
    if isinstance(out, (tuple, list)) and len(out) == 1:
        out = out[0]
    if not isinstance(out, torch.Tensor):
        raise EvalError(f"the model must return one logits tensor, got {type(out).__name__}")
    if tuple(out.shape) != (batch, SEQ_LEN, vocab):
        raise EvalError(f"logits have shape {tuple(out.shape)}, expected (B, T, V) = ({batch}, {SEQ_LEN}, {vocab})")
    if not out.is_floating_point():
        raise EvalError(f"logits have dtype {out.dtype}, expected a floating point type")
    out = out.detach().to("cpu", torch.float64)
    if not torch.isfinite(out).all():
        raise EvalError("logits contain NaN or infinite values")
    return out


def _windows(tokens, starts):
    w = tokens[np.asarray(starts)[:, None] + np.arange(SEQ_LEN + 1)]
    w = torch.from_numpy(w.astype(np.int64))
    # two tensors, not two views of one: a model that writes into its input must not rewrite the
    # targets it is scored on (red team, round 4); and the window is wiped before its memory is freed,
    # so no later allocation hands the targets back (round 5)
    x, y = w[:, :-1].clone(), w[:, 1:].clone()
    w.zero_()
    return x, y


def eval_starts(n_tokens, max_tokens):
    """Start offsets of the scored windows: min(max_tokens, n_tokens - 1) // SEQ_LEN windows of
    SEQ_LEN+1 tokens, spread evenly from the start to the end of the split (never overlapping).
    Spread rather than consecutive: the score then covers every part of the split (all its
    documents), so its sampling error is far smaller than that of the same number of tokens
    taken from the first few documents."""
    n = min(max_tokens, n_tokens - 1) // SEQ_LEN
    if n < 1:
        raise EvalError(f"only {n_tokens} tokens, fewer than SEQ_LEN+1 = {SEQ_LEN + 1}")
    span = n_tokens - 1 - SEQ_LEN  # last possible start
    return np.array([0]) if n == 1 else np.arange(n, dtype=np.int64) * span // (n - 1)


def _eval_batches(starts, batch_size, fixed_batch):
    """Rows of `starts` per batch; fixed_batch pads the last batch by repeating its last window."""
    for first in range(0, len(starts), batch_size):
        rows = min(batch_size, len(starts) - first)
        idx = np.arange(first, first + (batch_size if fixed_batch else rows)).clip(max=len(starts) - 1)
        yield rows, starts[idx]


def bpb_sums(forward_fn, tokens, token_bytes, max_tokens, batch_size=B_EVAL, device="cpu", fixed_batch=False,
             per_window=None):
    """(nats, bytes, targets) over the windows of eval_starts(len(tokens), max_tokens).
    Separator targets (0 bytes) count in neither sum. fixed_batch pads the last
    batch (exported graphs have a fixed shape); padding rows are not counted.
    per_window: a list that receives (nats, bytes) of every window (noise studies)."""
    starts = eval_starts(len(tokens), max_tokens)
    vocab = len(token_bytes)
    nats, nbytes = 0.0, 0
    for rows, batch_starts in _eval_batches(starts, batch_size, fixed_batch):
        x, y = _windows(tokens, batch_starts)
        with torch.no_grad():
            logits = _check_logits(forward_fn(x.to(device)), len(batch_starts), vocab)[:rows]
        y = y[:rows]
        nll = -torch.log_softmax(logits, dim=-1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
        tb = token_bytes[y]
        nll = torch.where(tb > 0, nll, torch.zeros_like(nll))
        nats += float(nll.sum())
        nbytes += int(tb.sum())
        if per_window is not None:
            per_window.extend(zip(nll.sum(1).tolist(), tb.sum(1).tolist()))
    return nats, nbytes, len(starts) * SEQ_LEN


def sampling_error(windows):
    """Standard error of a bits-per-byte figure from its windows' (nats, bytes): the spread of
    the per-window values / sqrt(n), for a ratio of sums (delta method). How much the score would
    move with another sample of the same size from the same text; it does not include seed noise."""
    n = len(windows)
    nats = np.array([w[0] for w in windows], dtype=np.float64) / math.log(2)
    nbytes = np.array([w[1] for w in windows], dtype=np.float64)
    if n < 2 or nbytes.sum() <= 0:
        return float("nan")
    resid = nats - nats.sum() / nbytes.sum() * nbytes
    return float(math.sqrt(n) * resid.std(ddof=1) / nbytes.sum())


def evaluate_bpb(forward_fn, split="train_eval", max_tokens=None, batch_size=B_EVAL, device="cpu", data_dir=None):
    """Bits per byte of forward_fn (x int64 (B, T) on `device` -> logits), for
    train.py's quick look; the score comes from the evaluate CLI on the exported
    graph. split "train_eval": the held-out end of the training split (never
    sampled by make_dataloader("train")); "val" only where val.bin is readable
    (not inside the loop's sandbox); test is hidden."""
    if split not in ("train_eval", "val"):
        raise ValueError(f"split {split!r}: train.py may evaluate on 'train_eval' (the held-out end of the "
                         "training split); test is hidden, and val is hidden in the sandbox")
    data_dir = data_dir or DATA_DIR
    meta = load_meta(data_dir)
    if split == "val" and not os.access(os.path.join(data_dir, "val.bin"), os.R_OK):
        raise DataError("val.bin is not visible to train.py (it decides the score); use split='train_eval'")
    tokens = _train_part(split, data_dir) if split == "train_eval" else _tokens("val", data_dir)
    nats, nbytes, _ = bpb_sums(forward_fn, tokens, _token_bytes(meta, data_dir),
                               max_tokens or EVAL_TOKENS, batch_size, device)
    return nats / (math.log(2) * nbytes)



# ---------------------------------------------------------------------------
# Hardware peak, for train.py's MFU figure (informational, not part of the score)

GPU_PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "H800": 989e12, "A100": 312e12, "A800": 312e12,
                 "L40S": 362e12, "L4": 121e12, "A10G": 70e12, "4090": 165e12, "3090": 71e12}


def measure_matmul_flops(device="cpu", dtype=torch.float32, sizes=(512, 1024, 2048), seconds=0.15):
    """Best achieved FLOP/s of square matmuls: the machine's practical peak."""
    best = 0.0
    import time
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        a @ b  # warm up
        k, t0 = 0, time.perf_counter()
        while True:
            a @ b
            k += 1
            if device != "cpu":
                torch.cuda.synchronize() if str(device).startswith("cuda") else None
            dt = time.perf_counter() - t0
            if dt > seconds:
                break
        best = max(best, 2 * n ** 3 * k / dt)
    return best


def peak_flops(device="cpu", data_dir=None):
    """(flops, source). CUDA: nominal bf16 peak of known GPUs; CPU: measured fp32
    matmul peak at the current thread count, cached by prepare in peak_flops.json."""
    device = str(device)
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name()
        for key, value in GPU_PEAK_BF16.items():
            if key in name:
                return value, f"nominal bf16 peak of {name}"
        return measure_matmul_flops(device, torch.bfloat16), "measured bf16 matmul"
    if device.startswith("mps"):
        return measure_matmul_flops("mps"), "measured fp32 matmul"
    key = f"{torch.__version__}/{torch.get_num_threads()}threads"
    path = os.path.join(data_dir or DATA_DIR, "peak_flops.json")
    try:
        with open(path) as f:
            return json.load(f)[key], f"measured fp32 matmul ({key}, cached)"
    except (OSError, KeyError, ValueError):
        return measure_matmul_flops(), f"measured fp32 matmul ({key})"


def _cache_peak(data_dir):
    key = f"{torch.__version__}/{torch.get_num_threads()}threads"
    with open(os.path.join(data_dir, "peak_flops.json"), "w") as f:
        json.dump({key: measure_matmul_flops()}, f)


# ---------------------------------------------------------------------------
# The other frozen files: evaluate.py (the score) and pt2audit.py (the archive check)

SIBLINGS = ("evaluate", "pt2audit")
_siblings = {}


def sibling(name):
    """evaluate.py or pt2audit.py beside this file, as a module bound to this prepare (its constants).
    By path, never through sys.path: run as the evaluator this file drops its own directory from
    sys.path, and an installed package of the same name (Hugging Face's `evaluate`) must not stand in.
    Under the runner the bootstrap has checked the siblings' bytes against the pinned blobs and hands
    exactly those over (_PINNED_SOURCES): nothing is read from disk again, and a sibling that was not
    pinned is not loaded at all."""
    if name not in SIBLINGS:
        raise ValueError(f"no frozen sibling {name!r} (one of {', '.join(SIBLINGS)})")
    if name not in _siblings:
        import types
        path = os.path.join(HERE, name + ".py")
        pinned = globals().get("_PINNED_SOURCES")
        if pinned is not None:
            code = pinned[name]
        else:
            with open(path, "rb") as f:
                code = f.read()
        mod = types.ModuleType(name)
        mod.__file__ = path
        mod.prepare = sys.modules[__name__]   # the siblings take constants and the metric from this module
        _siblings[name] = mod                 # before it runs: evaluate.py asks for pt2audit while it loads
        try:
            exec(compile(code, path, "exec"), mod.__dict__)
        except BaseException:
            del _siblings[name]
            raise
    return _siblings[name]


# ---------------------------------------------------------------------------
# CLI

def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(description="loopwright GPT benchmark: data, verification, evaluation")
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare", help="build the data (train/val/test .bin + meta.json)")
    pp.add_argument("--corpus", default=CORPUS,
                    help="stdlib-hidden | stdlib | tinystories | climbmix | PATH (folder or text file)")
    pp.add_argument("--tokenizer", default=TOKENIZER, choices=["byte", "bpe"])
    pv = sub.add_parser("verify", help="check the data against the hashes in meta.json")
    pe = sub.add_parser("evaluate", help="score an exported model; prints one JSON line")
    pe.add_argument("model")
    pe.add_argument("--nonce", default=None,
                    help="echoed in the result line: the caller knows the verdict is this process's own, not a "
                         "line the model printed (a model never sees the command line)")
    sub.add_parser("limits", help="the budget clock and the runner's hard limit, as one JSON line")
    for q in (pp, pv, pe):
        q.add_argument("--data-dir", default=DATA_DIR)
    args = p.parse_args(argv)

    if args.cmd == "limits":
        print(json.dumps({"clock": CLOCK, "active_clock": active_clock(), "time_budget": TIME_BUDGET,
                          "budget_tokens": BUDGET_TOKENS, "hard_limit_seconds": hard_limit_seconds()}))
        return 0
    if args.cmd == "prepare":
        try:
            prepare_data(args.corpus, args.data_dir, args.tokenizer)
        except DataError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        _cache_peak(args.data_dir)
        return 0
    if args.cmd == "verify":
        try:
            meta = verify_data(args.data_dir)
        except (DataError, ValueError, KeyError) as e:
            print(json.dumps({"ok": False, "reason": str(e)}))
            return 1
        print(json.dumps({"ok": True, "files": len(meta["files"]), "corpus": meta["corpus"]}))
        return 0
    # evaluate: one JSON object on the last stdout line, whatever happens
    try:
        result, code = sibling("evaluate").evaluate_exported(args.model, args.data_dir), 0
    except DataError as e:
        result, code = {"ok": False, "reason": f"data check failed: {e}"}, 2
    except EvalError as e:
        result, code = {"ok": False, "reason": str(e)}, 1
        if str(e).startswith("causality probe failed"):
            result["causal"] = False
    except Exception as e:  # never a traceback instead of a verdict
        result, code = {"ok": False, "reason": f"evaluation error: {type(e).__name__}: {e}"}, 1
    if args.nonce:
        result["nonce"] = args.nonce
    sys.stdout.flush()
    print(json.dumps(result))
    return code


if __name__ == "__main__":
    sys.exit(main())
