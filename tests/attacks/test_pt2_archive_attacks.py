"""The frozen evaluator against crafted .pt2 archives (red-team report, item 2).

train.py writes the archive, so its contents are the agent's: torch.export.load and ep.module()
turn parts of it into code (a symbolic size is parsed by sympy.sympify, an eval; guards_code is
exec'd; pickled constants, custom objects, AOTInductor libraries). Each archive here is an honest
tiny export edited the way an attacker would; the evaluator must refuse it and the payload (it
would create a marker file and print a forged verdict) must never run. A second group checks the
load-time layer alone (sinks disabled even if the archive check missed a path); the last tests
check that honest exports, the bundled GPT included, still load and score exactly as before."""
from __future__ import annotations

import importlib.util
import json
import math
import pickle
import stat
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from bench_helpers import bench_dir, evaluate, load_prepare, run_cli, text_corpus

V = 256
FORGED = {"ok": True, "causal": True, "val_bpb": 0.8123, "test_bpb": 0.8157, "eval_seconds": 1.0}


class Bigram(nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.table = nn.Parameter(torch.randn(V, V, generator=g))
        self.register_buffer("scale", torch.ones(V), persistent=False)  # stored as a constant tensor

    def forward(self, idx):
        return self.table[idx] * self.scale


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("pt2")
    d = bench_dir(root / "ws", train=True, seq_len=64, eval_tokens=2048, time_budget=10)
    code, _, proc = run_cli(d, "prepare", "--corpus", str(text_corpus(root / "corpus", n_docs=60)))
    assert code == 0, proc.stderr
    return d


@pytest.fixture(scope="module")
def prep(ws):
    return load_prepare(ws)


@pytest.fixture(scope="module")
def honest(prep, tmp_path_factory):
    return Path(prep.export_model(Bigram(), str(tmp_path_factory.mktemp("honest") / "honest.pt2")))


def data_dir(ws):
    return str(ws / ".loopwright" / "data")


# --------------------------------------------------------------------------- building crafted archives

def payload(marker: Path, exit_: bool) -> str:
    """Python that creates `marker`, then (exit_) prints a forged verdict line and exits 0 -- the
    red team's payload; in-process tests leave the exit out so a regression fails the test, not pytest."""
    code = f"open({str(marker)!r}, 'w').close()"
    if exit_:
        line = (json.dumps(FORGED) + "\n").encode()
        code = f"({code}, __import__('os').write(1, {line!r}), __import__('os')._exit(0))"
    return code


class Trap:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def read_entries(src: Path) -> list[tuple[zipfile.ZipInfo, bytes]]:
    with zipfile.ZipFile(src) as z:
        return [(info, z.read(info)) for info in z.infolist()]


def rewrite(src: Path, dst: Path, edit) -> Path:
    """Copy src, letting edit(files: dict name -> bytes, root) change, add or drop entries."""
    entries = read_entries(src)
    root = entries[0][0].filename.split("/")[0]
    files = {info.filename: data for info, data in entries}
    edit(files, root)
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return dst


def edit_json(files, root, rel, fn):
    name = f"{root}/{rel}"
    obj = json.loads(files[name])
    fn(obj)
    files[name] = json.dumps(obj).encode()


def sizes_expr(code):
    def fn(m):
        meta = next(iter(m["graph_module"]["graph"]["tensor_values"].values()))
        meta["sizes"][0] = {"as_expr": {"expr_str": code, "hint": {"as_int": 8}}}
    return fn


def craft(kind: str, marker: Path, exit_: bool = False):
    """An edit for rewrite(): one attack on the archive."""
    code = payload(marker, exit_)
    model, weights, consts = "models/model.json", "data/weights/model_weights_config.json", \
        "data/constants/model_constants_config.json"

    def edit(files, root):
        if kind == "size_expr":  # red-team route a: sympify on a tensor size in the graph
            edit_json(files, root, model, sizes_expr(code))
        elif kind == "weight_size_expr":  # the same in the weights' tensor meta (deserialize_size)
            def fn(cfg):
                cfg["config"]["table"]["tensor_meta"]["sizes"][0] = {"as_expr": {"expr_str": code, "hint": None}}
            edit_json(files, root, weights, fn)
        elif kind == "guards_code":  # red-team route b: exec'd by ep.module()
            edit_json(files, root, model, lambda m: m.__setitem__("guards_code", [code]))
        elif kind == "sym_int_values":
            edit_json(files, root, model, lambda m: m["graph_module"]["graph"]["sym_int_values"].__setitem__(
                "s0", {"as_expr": {"expr_str": code, "hint": {"as_int": 1}}}))
        elif kind == "range_constraints":
            edit_json(files, root, model, lambda m: m.__setitem__(
                "range_constraints", {code: {"min_val": 0, "max_val": 9}}))
        elif kind == "node_target":  # a node calling a Python function reachable from torch
            def fn(m):
                m["graph_module"]["graph"]["nodes"][0]["target"] = "torch.os.system"
            edit_json(files, root, model, fn)
        elif kind in ("opaque_constant", "custom_obj_constant", "pickled_constant"):
            # a constant stored as a pickle: opaque objects go through pickle.loads, torchbind objects
            # through torch._C._pickle_load_obj, pickled tensors through torch.load(weights_only=False)
            path = {"opaque_constant": "opaque_obj_0", "custom_obj_constant": "custom_obj_0",
                    "pickled_constant": "tensor_7"}[kind]

            def fn(cfg):
                cfg["config"]["scale"].update(path_name=path, use_pickle=True)
            edit_json(files, root, consts, fn)
            files[f"{root}/data/constants/{path}"] = pickle.dumps(Trap(marker), protocol=2)
        elif kind == "pickled_weight":
            def fn(cfg):
                cfg["config"]["table"]["use_pickle"] = True
            edit_json(files, root, weights, fn)
            path = json.loads(files[f"{root}/{weights}"])["config"]["table"]["path_name"]
            files[f"{root}/data/weights/{path}"] = pickle.dumps(Trap(marker), protocol=2)
        elif kind == "legacy_weights":  # torch prefers data/weights/model.pt (a pickle) when present
            files[f"{root}/data/weights/model.pt"] = pickle.dumps(Trap(marker), protocol=2)
        elif kind == "second_model":  # every models/*.json is deserialized
            files[f"{root}/models/other.json"] = files[f"{root}/{model}"]
        elif kind == "aoti":  # data/aotinductor/<name>/... makes torch dlopen a compiled package
            files[f"{root}/data/aotinductor/model/model.so"] = b"\x7fELF"
        elif kind == "extra_file":
            files[f"{root}/extra/notes.txt"] = b"hello"
        elif kind == "outside_root":
            files["elsewhere/models/model.json"] = files[f"{root}/{model}"]
        elif kind == "archive_version":
            files[f"{root}/archive_version"] = b"1"
        elif kind == "treespec_type":
            def fn(m):
                sig = m["graph_module"]["module_call_graph"][0]["signature"]
                spec = json.loads(sig["in_spec"])
                spec[1]["type"] = "collections.namedtuple"
                sig["in_spec"] = json.dumps(spec)
            edit_json(files, root, model, fn)
        else:
            raise AssertionError(kind)
    return edit


ATTACKS = {
    "size_expr": "symbolic expression", "weight_size_expr": "symbolic expression", "guards_code": "guards_code",
    "sym_int_values": "sym_int_values", "range_constraints": "range constraints", "node_target": "torch.os.system",
    "opaque_constant": "opaque_obj_0", "custom_obj_constant": "custom_obj_0",
    "pickled_constant": "pickle", "pickled_weight": "pickle", "legacy_weights": "data/weights/model.pt",
    "second_model": "models/other.json", "aoti": "aotinductor", "extra_file": "extra/notes.txt",
    "outside_root": "elsewhere", "archive_version": "version", "treespec_type": "tuple/list/dict",
}


# --------------------------------------------------------------------------- the archive check

@pytest.mark.parametrize("kind", sorted(ATTACKS))
def test_crafted_archives_are_refused_before_torch_reads_them(ws, prep, honest, tmp_path, kind):
    marker = tmp_path / "payload-ran"
    evil = rewrite(honest, tmp_path / "evil.pt2", craft(kind, marker))
    with pytest.raises(prep.EvalError, match="refused") as err:
        prep.evaluate_exported(str(evil), data_dir(ws))
    assert ATTACKS[kind] in str(err.value)
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["size_expr", "guards_code"])
def test_red_team_routes_through_the_cli_print_no_forged_verdict(ws, honest, tmp_path, kind):
    """The red team's two routes end to end (python -I prepare.py evaluate): the payload would print a
    forged keep-worthy verdict and exit 0; now the last line is the refusal and nothing forged is printed."""
    marker = tmp_path / "payload-ran"
    evil = rewrite(honest, tmp_path / "evil.pt2", craft(kind, marker, exit_=True))
    code, res, proc = evaluate(ws, evil)
    assert code == 1 and res["ok"] is False and "refused" in res["reason"], proc.stdout + proc.stderr
    assert "0.8123" not in proc.stdout and not marker.exists()


@pytest.mark.filterwarnings("ignore:Duplicate name")
def test_zip_level_tricks_are_refused(ws, prep, honest, tmp_path):
    entries = read_entries(honest)

    def build(name, mutate):
        with zipfile.ZipFile(tmp_path / name, "w") as z:
            for info, data in entries:
                info = zipfile.ZipInfo(info.filename)
                extra = mutate(z, info, data)
                if extra is not False:
                    z.writestr(info, data)
        return tmp_path / name

    def symlink(z, info, data):
        if info.filename.endswith("weight_0"):
            info.external_attr = (stat.S_IFLNK | 0o777) << 16

    def deflated(z, info, data):
        info.compress_type = zipfile.ZIP_DEFLATED

    def duplicate(z, info, data):
        if info.filename.endswith("models/model.json"):
            z.writestr(zipfile.ZipInfo(info.filename), data)

    for name, mutate, why in (("link.pt2", symlink, "not a plain file"), ("zip.pt2", deflated, "compressed"),
                              ("dup.pt2", duplicate, "twice")):
        with pytest.raises(prep.EvalError, match=why):
            prep.evaluate_exported(str(build(name, mutate)), data_dir(ws))
    (tmp_path / "junk.pt2").write_bytes(b"not a zip at all")
    with pytest.raises(prep.EvalError, match="not a .pt2 archive"):
        prep.evaluate_exported(str(tmp_path / "junk.pt2"), data_dir(ws))


def test_sample_inputs_pickle_is_refused_and_never_handed_to_torch(prep, honest, tmp_path):
    marker = tmp_path / "payload-ran"

    def edit(files, root):
        files[f"{root}/data/sample_inputs/model.pt"] = pickle.dumps(Trap(marker), protocol=2)
    evil = rewrite(honest, tmp_path / "evil.pt2", edit)
    with pytest.raises(prep.EvalError, match="pickled Python objects"):
        prep.checked_archive(str(evil))
    assert not marker.exists()
    with zipfile.ZipFile(prep.checked_archive(str(honest))) as z:  # torch gets no sample inputs at all
        assert z.read("model/data/sample_inputs/model.pt") == b""


# --------------------------------------------------------------------------- the load-time layer alone

def test_load_sinks_refuse_even_without_the_archive_check(prep, honest, tmp_path):
    """If the archive check missed a path: inside _no_code_in_load, sympify of a string and the guards
    code generator refuse, so the same payloads still do not run."""
    marker = tmp_path / "payload-ran"
    evil = rewrite(honest, tmp_path / "expr.pt2", craft("size_expr", marker))
    with pytest.raises(prep.EvalError, match="tried to run code"):
        with prep._pickle_free(), prep._no_code_in_load():
            torch.export.load(str(evil))
    evil = rewrite(honest, tmp_path / "guards.pt2", craft("guards_code", marker))
    with prep._pickle_free(), prep._no_code_in_load():
        ep = torch.export.load(str(evil))  # loading does not run guards; building the module would
        with pytest.raises(prep.EvalError, match="tried to run code"):
            ep.module()
        ep.module(check_guards=False)  # what the evaluator calls: no guards function is generated
    assert not marker.exists()
    import sympy
    assert sympy.sympify("2 + 3") == 5  # the sinks are restored afterwards


# --------------------------------------------------------------------------- honest exports

def _direct_val_bpb(prep, ws, path):
    """val_bpb of the archive loaded the old way (torch.export.load(path).module(), no checks)."""
    module = torch.export.load(str(path)).module()
    meta = prep.load_meta(data_dir(ws))
    tokens = prep._tokens("val", data_dir(ws))
    with torch.no_grad():
        nats, nbytes, _ = prep.bpb_sums(module, tokens, prep._token_bytes(meta, data_dir(ws)), prep.EVAL_TOKENS,
                                        prep.B_EVAL, fixed_batch=True)
    return nats / (math.log(2) * nbytes)


def test_honest_export_still_scores_exactly_as_before(ws, prep, honest):
    code, res, proc = evaluate(ws, honest)
    assert code == 0 and res["ok"] is True, proc.stdout + proc.stderr
    assert res["val_bpb"] == pytest.approx(_direct_val_bpb(prep, ws, honest), abs=1e-12)


def test_bundled_gpt_export_passes_the_check_unchanged(ws, prep, tmp_path, monkeypatch):
    """The bundled train.py's GPT (untrained; export_model is the same code on the CUDA path): the
    checked copy loads to a module whose logits equal those of the archive loaded directly."""
    monkeypatch.setitem(sys.modules, "prepare", prep)
    spec = importlib.util.spec_from_file_location("bench_train_for_pt2_test", ws / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    torch.manual_seed(0)
    model = train.GPT(prep.VOCAB_SIZE, train.D_MODEL, train.DEPTH, train.N_HEAD, train.MLP_RATIO, prep.SEQ_LEN)
    nn.init.normal_(model.head.weight, std=0.02)  # not the all-zero head of step 0: logits that differ
    path = prep.export_model(model, str(tmp_path / "gpt.pt2"))
    with prep._pickle_free(), prep._no_code_in_load():
        ep = torch.export.load(prep.checked_archive(path))
        prep._audit_graph(ep)
        checked = ep.module(check_guards=False)
    direct = torch.export.load(path).module()
    x = torch.randint(0, V, (prep.B_EVAL, prep.SEQ_LEN), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(checked(x), direct(x))


# --------------------------------------------------------------------------- round 2: what the graph itself does
# Archives exported normally (no hand-editing): the graph's own operators are the attack.

class PrintsAVerdict(Bigram):
    """aten._print writes to the evaluator's stdout: a forged verdict line (red team, round 2)."""

    def forward(self, idx):
        torch.ops.aten._print(json.dumps(FORGED))
        return super().forward(idx)


class CountsCalls(Bigram):
    """State in a constant tensor, updated in place: behave while probed, then read the next token."""

    def __init__(self, through_view: bool = False):
        super().__init__()
        self.calls = torch.zeros(1)
        self.through_view = through_view

    def forward(self, idx):
        (self.calls.view(-1) if self.through_view else self.calls).add_(1.0)
        ahead = torch.cat([idx[:, 1:], idx[:, -1:]], dim=1)
        return super().forward(idx) + (self.calls > 40).float() * 30.0 * nn.functional.one_hot(ahead, V).float()


class CountsInABuffer(Bigram):
    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.zeros(1))

    def forward(self, idx):
        self.seen += 1.0
        return super().forward(idx)


class InPlaceOnItsOwnActivations(Bigram):
    """x += y on intermediates is ordinary model code and stays allowed."""

    def forward(self, idx):
        x = self.table[idx]
        x += 1.0
        x.mul_(self.scale)
        return x


@pytest.mark.parametrize("model, says", [(PrintsAVerdict, "reads files or prints"), (CountsCalls, "writes in place"),
                                         (lambda: CountsCalls(through_view=True), "writes in place"),
                                         (CountsInABuffer, "writes in place")],
                         ids=["print", "constant", "constant-through-a-view", "buffer"])
def test_graph_ops_that_print_or_keep_state_are_refused(ws, prep, tmp_path, model, says):
    path = Path(prep.export_model(model(), str(tmp_path / "m.pt2")))
    code, res, proc = evaluate(ws, path)
    assert code == 1 and res["ok"] is False and says in res["reason"], proc.stdout[-500:] + proc.stderr[-500:]
    assert "0.8123" not in proc.stdout


def test_the_statelessness_check_sees_constants_too(ws, prep, tmp_path, monkeypatch):
    """The second layer alone (the graph audit switched off): the state snapshot now covers what export
    keeps as constants, not only weights and buffers, so the counting model is caught at its first call."""
    path = Path(prep.export_model(CountsCalls(), str(tmp_path / "m.pt2")))
    monkeypatch.setattr(prep, "_audit_graph", lambda ep: None)
    with pytest.raises(prep.EvalError, match="changes its own state"):
        prep.evaluate_exported(str(path), data_dir(ws))


def test_in_place_ops_on_activations_still_score(ws, prep, tmp_path):
    path = Path(prep.export_model(InPlaceOnItsOwnActivations(), str(tmp_path / "ok.pt2")))
    code, res, proc = evaluate(ws, path)
    assert code == 0 and res["ok"] is True, proc.stdout[-500:] + proc.stderr[-500:]


def test_the_verdict_carries_the_callers_nonce(ws, honest):
    code, res, _ = evaluate(ws, honest)
    assert code == 0 and "nonce" not in res
    code, res, _ = run_cli(ws, "evaluate", str(honest), "--nonce", "c0ffee")
    assert code == 0 and res["nonce"] == "c0ffee"


# --------------------------------------------------------------------------- round 4: the input, views, randomness

class OverwritesItsInput(nn.Module):
    """Writes the token it bets on into its input, which used to share memory with the targets."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.zeros(V, V))

    def forward(self, idx):
        idx.fill_(97)
        return self.table[idx] + 30.0 * nn.functional.one_hot(torch.full_like(idx, 97), V).float()


class CountsThroughAnUnsafeView(Bigram):
    def __init__(self):
        super().__init__()
        self.calls = torch.zeros(2)

    def forward(self, idx):
        torch.ops.aten._unsafe_view(self.calls, [2]).add_(1.0)
        return super().forward(idx)


class Samples(Bigram):
    def forward(self, idx):
        return super().forward(idx) + torch.rand(idx.shape[0], idx.shape[1], V)


class ZeroDimConstant(Bigram):
    def forward(self, idx):
        return super().forward(idx) * torch.tensor(1.0)


@pytest.mark.parametrize("model, says", [(OverwritesItsInput, "may not change its input"),
                                         (CountsThroughAnUnsafeView, "stateful models are not allowed"),
                                         (Samples, "random operator")],
                         ids=["input", "unsafe-view", "random"])
def test_writes_into_the_input_or_through_hidden_views_and_random_ops_are_refused(ws, prep, tmp_path, model, says):
    path = Path(prep.export_model(model(), str(tmp_path / "m.pt2")))
    code, res, proc = evaluate(ws, path)
    assert code == 1 and res["ok"] is False and says in res["reason"], proc.stdout[-500:] + proc.stderr[-500:]


def test_the_evaluator_never_lets_the_model_touch_its_targets(ws, prep, tmp_path, monkeypatch):
    """The second layer alone (audit off): the model gets its own copy of the input, and the targets are
    a separate tensor, so overwriting the input buys nothing."""
    path = Path(prep.export_model(OverwritesItsInput(), str(tmp_path / "m.pt2")))
    monkeypatch.setattr(prep, "_audit_graph", lambda ep: None)
    res = prep.evaluate_exported(str(path), data_dir(ws))
    assert res["val_bpb"] > 5.0, res     # it bets on one byte everywhere: far worse than uniform, not 0.16


def test_a_zero_dim_constant_is_an_honest_model(ws, prep, tmp_path):
    path = Path(prep.export_model(ZeroDimConstant(), str(tmp_path / "m.pt2")))
    code, res, proc = evaluate(ws, path)
    assert code == 0 and res["ok"] is True, proc.stdout[-500:] + proc.stderr[-500:]


class ReadsFreedMemory(Bigram):
    """torch.empty handed out the window the evaluator had just freed, targets included (red team round 5)."""

    def forward(self, idx):
        peek = torch.empty(idx.shape[0], idx.shape[1] + 1, dtype=torch.long)
        return super().forward(idx) + 0.0 * peek[:, :-1, None].float()


def test_uninitialised_memory_is_refused_and_filled_anyway(ws, prep, tmp_path, monkeypatch):
    path = Path(prep.export_model(ReadsFreedMemory(), str(tmp_path / "m.pt2")))
    code, res, proc = evaluate(ws, path)
    assert code == 1 and "uninitialised memory" in res["reason"], proc.stdout[-500:] + proc.stderr[-500:]
    # the second layer: with the audit off, new tensors come filled, and the window is wiped before it is freed
    monkeypatch.setattr(prep, "_audit_graph", lambda ep: None)
    was = torch.are_deterministic_algorithms_enabled()
    try:
        prep.evaluate_exported(str(path), data_dir(ws))
        assert torch.utils.deterministic.fill_uninitialized_memory and torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(was)
    tokens = torch.arange(1000) % 200
    x, y = prep._windows(tokens.numpy(), [0, 300])
    assert torch.equal(y[0], tokens[1:prep.SEQ_LEN + 1]) and not x.data_ptr() == y.data_ptr()
