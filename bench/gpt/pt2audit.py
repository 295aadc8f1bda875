"""
pt2audit.py -- the frozen audit of the .pt2 archive a train.py exports (loopwright's GPT benchmark).

The agent never edits this file (it is pinned, hashed and read-only like
prepare.py). The archive is written by train.py, i.e. by the agent: it is
untrusted input, and torch.export.load runs code from it in several ways. The
evaluator (evaluate.py) therefore calls, in this order:

    checked_archive(path)      the archive checked against what torch.export.save writes for a static-shape
                               export (prepare.export_model), returned as a rebuilt copy of the checked entries
    _pickle_free(), _no_code_in_load()
                               while torch loads that copy: no pickle but the weights-only one, and every sink
                               that turns archive text into code refuses
    _audit_graph(ep)           the loaded graph: torch operators only, no file/print/uninitialised-memory or
                               random op, no write into the model's own tensors

Every refusal is a prepare.EvalError. Loaded by prepare.sibling("pt2audit").
Imports: stdlib, torch (and sympy, torch's own dependency) only.
"""
import contextlib
import json
import os
import re
import sys

import torch

# Loaded by prepare.sibling(), `prepare` is already here: the module that loaded us, with its constants.
# Imported on its own (a test, a REPL), it is the prepare.py beside this file.
if "prepare" not in globals():
    import prepare

EvalError = prepare.EvalError


# ---------------------------------------------------------------------------
# Load-time guards

@contextlib.contextmanager
def _pickle_free():
    """While loading a .pt2, allow only torch's restricted weights-only unpickler.
    torch.export.load falls back to full pickle for some payloads (torch.load
    with weights_only=False, pickle.loads): a crafted archive could otherwise
    run code in the evaluator and print its own verdict."""
    import pickle

    def refuse(*args, **kwargs):
        raise EvalError("the archive holds pickled Python objects; only tensors and the graph are allowed")

    real_load = torch.load

    def weights_only_load(f, *args, **kwargs):
        kwargs["weights_only"] = True
        return real_load(f, *args, **kwargs)

    saved = torch.load, pickle.loads, pickle.load, torch._C._pickle_load_obj
    torch.load, pickle.loads, pickle.load, torch._C._pickle_load_obj = weights_only_load, refuse, refuse, refuse
    try:
        yield
    finally:
        torch.load, pickle.loads, pickle.load, torch._C._pickle_load_obj = saved


# ---------------------------------------------------------------------------
# The .pt2 archive is written by train.py, i.e. by the agent: it is untrusted input.
# torch.export.load runs code from it in several ways (a symbolic size or stride is
# parsed with sympy.sympify, an eval; the archive's guards_code is exec'd by
# ep.module(); pickled weights, constants, custom objects; AOTInductor shared
# libraries; the legacy format). So the archive is checked first against what
# torch.export.save writes for a static-shape export (what export_model makes),
# and torch then loads a copy rebuilt from the checked entries only.

PT2_MAX_ENTRIES = 100_000           # an honest archive: ~10 fixed entries + one per weight/constant tensor
PT2_MAX_JSON_BYTES = 256 << 20      # each JSON entry (the graph of a large model is a few MB)
PT2_MAX_NESTING = 200               # JSON nesting depth (the graph: ~20 levels; subgraphs add some)
_PT2_FIXED = ("archive_format", "archive_version", "byteorder", ".data/version", ".data/serialization_id",
              "models/model.json", "data/sample_inputs/model.pt", "data/weights/model_weights_config.json",
              "data/constants/model_constants_config.json")
_PT2_JSON_ENTRIES = ("models/model.json", "data/weights/model_weights_config.json",
                     "data/constants/model_constants_config.json")
_PT2_TENSOR_FILE = {"weights": re.compile(r"weight_(0|[1-9][0-9]{0,8})"),
                    "constants": re.compile(r"tensor_(0|[1-9][0-9]{0,8})")}
_PT2_ROOT = re.compile(r"[A-Za-z0-9_.-]{1,200}")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,200}")
_FQN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,200}(\.[A-Za-z0-9_]{1,200}){0,50}")
_OP_TARGET = re.compile(r"torch\.ops\.(aten|prims)\.[A-Za-z_][A-Za-z0-9_]{0,100}\.[A-Za-z_][A-Za-z0-9_]{0,100}")
# higher-order ops whose operands are tensors and subgraphs only (control flow); the graph audit
# and the evaluator's checks apply to their subgraphs as to the main graph
_HOP_TARGETS = {"torch.ops.higher_order." + n for n in ("cond", "while_loop", "scan", "map_impl",
                                                       "wrap_with_set_grad_enabled", "wrap_with_autocast")}
_OTHER_TARGETS = {"_operator.getitem"}
# argument kinds and fields that carry code, Python objects or symbolic expressions: an export at
# a fixed shape (export_model) never writes them
_PT2_FORBIDDEN_KEYS = {"as_expr": "a symbolic expression (parsed as Python code by torch)",
                       "expr_str": "a symbolic expression (parsed as Python code by torch)",
                       "as_custom_obj": "a custom (pickled) object", "custom_obj_name": "a custom (pickled) object",
                       "as_operator": "an operator argument", "as_sym_float": "a symbolic float",
                       "as_sym_bool": "a symbolic bool", "token": "an effect token"}
_PT2_EMPTY_TABLES = ("sym_int_values", "sym_bool_values", "sym_float_values", "custom_obj_values")
_TREESPEC_TYPES = {None, "builtins.tuple", "builtins.list", "builtins.dict", "collections.OrderedDict"}
_PROGRAM_KEYS = {"graph_module", "opset_version", "range_constraints", "schema_version", "verifiers",
                 "torch_version", "guards_code"}
_GRAPH_MODULE_KEYS = {"graph", "signature", "module_call_graph", "metadata", "treespec_namedtuple_fields"}
_INPUT_KINDS = {"parameter", "buffer", "tensor_constant", "user_input"}
_PAYLOAD_KEYS = {"path_name", "is_param", "use_pickle", "tensor_meta"}


def _refuse_archive(why):
    raise EvalError(f"the model archive is refused: {why}. Only what prepare.export_model writes (a graph "
                    "exported at the fixed evaluation shape, its weights and constants as raw tensors) is "
                    "accepted; save the model with prepare.export_model(model)")


def _is_ident(s):
    return isinstance(s, str) and _IDENT.fullmatch(s) is not None


def _is_fqn(s):
    return isinstance(s, str) and (s == "" or _FQN.fullmatch(s) is not None)


def _check_json_tree(obj, where, depth=0):
    """Every dict and list below obj: no forbidden key, identifiers where torch makes names,
    allowed operator targets, empty symbol/custom-object tables; node metadata (stack traces,
    module paths: text only torch never needs to run the graph) is dropped."""
    if depth > PT2_MAX_NESTING:
        _refuse_archive(f"{where} is nested more than {PT2_MAX_NESTING} levels deep")
    if isinstance(obj, list):
        for v in obj:
            _check_json_tree(v, where, depth + 1)
        return
    if not isinstance(obj, dict):
        if not (obj is None or isinstance(obj, (str, int, float, bool))):
            _refuse_archive(f"{where} holds a {type(obj).__name__}")
        return
    for key in obj:
        if key in _PT2_FORBIDDEN_KEYS:
            _refuse_archive(f"{where} holds {_PT2_FORBIDDEN_KEYS[key]} ({key!r}); only static shapes are allowed")
    for key in _PT2_EMPTY_TABLES:
        if obj.get(key, {}) != {}:
            _refuse_archive(f"{where} has a non-empty {key}; only static shapes and tensors are allowed")
    if "name" in obj and not _is_ident(obj["name"]):
        _refuse_archive(f"{where} has the name {str(obj['name'])[:80]!r}, which is not a plain identifier")
    for key in ("parameter_name", "buffer_name", "tensor_constant_name", "fqn"):
        if key in obj and not _is_fqn(obj[key]):
            _refuse_archive(f"{where} has the {key} {str(obj[key])[:80]!r}, which is not a dotted identifier")
    if "tensor_values" in obj:
        if not isinstance(obj["tensor_values"], dict) or not all(_is_ident(k) for k in obj["tensor_values"]):
            _refuse_archive(f"{where} has tensor values whose names are not plain identifiers")
    if "target" in obj and "inputs" in obj:  # a graph node
        target = obj["target"]
        if not isinstance(target, str) or not (_OP_TARGET.fullmatch(target) or target in _HOP_TARGETS
                                               or target in _OTHER_TARGETS):
            _refuse_archive(f"{where} has a node calling {str(target)[:80]!r}; only aten/prims operators "
                            "(and getitem, cond, while_loop, scan, map) are allowed")
        obj["metadata"] = {}
    for v in obj.values():
        _check_json_tree(v, where, depth + 1)


def _check_treespec(text, where):
    try:
        spec = json.loads(text)
    except (TypeError, ValueError):
        _refuse_archive(f"{where} is not a JSON tree spec")
    if not (isinstance(spec, list) and len(spec) == 2 and isinstance(spec[1], dict)):
        _refuse_archive(f"{where} is not a tree spec")
    todo = [spec[1]]
    while todo:
        node = todo.pop()
        if not isinstance(node, dict) or node.get("type") not in _TREESPEC_TYPES \
                or not isinstance(node.get("children_spec"), list) or len(todo) > PT2_MAX_ENTRIES:
            _refuse_archive(f"{where} holds a container type other than tuple/list/dict")
        todo.extend(node["children_spec"])


def _check_program(m):
    """models/model.json (parsed): a static-shape exported program, nothing that runs code."""
    where = "models/model.json"
    if not isinstance(m, dict) or not set(m) <= _PROGRAM_KEYS or "graph_module" not in m:
        _refuse_archive(f"{where} has unexpected fields {sorted(set(m) - _PROGRAM_KEYS)[:5] if isinstance(m, dict) else ''}")
    if m.get("guards_code", []) != []:
        _refuse_archive(f"{where} holds guards_code (Python that torch would exec)")
    if m.get("range_constraints", {}) != {}:
        _refuse_archive(f"{where} holds range constraints (symbolic shapes); only static shapes are allowed")
    sv = m.get("schema_version")
    if not (isinstance(sv, dict) and set(sv) == {"major", "minor"} and all(type(v) is int for v in sv.values())):
        _refuse_archive(f"{where} has a malformed schema_version")
    ov = m.get("opset_version", {})
    if not (isinstance(ov, dict) and all(_is_ident(k) and type(v) is int for k, v in ov.items())):
        _refuse_archive(f"{where} has a malformed opset_version")
    if not (isinstance(m.get("verifiers", []), list) and all(_is_ident(v) for v in m.get("verifiers", []))):
        _refuse_archive(f"{where} has malformed verifiers")
    if not isinstance(m.get("torch_version", ""), str):
        _refuse_archive(f"{where} has a malformed torch_version")
    gm = m["graph_module"]
    if not isinstance(gm, dict) or not set(gm) <= _GRAPH_MODULE_KEYS or "graph" not in gm or "signature" not in gm:
        _refuse_archive(f"{where}: graph_module has unexpected fields")
    if gm.get("treespec_namedtuple_fields", {}) != {}:
        _refuse_archive(f"{where} holds named-tuple types")
    gm["metadata"] = {}
    sig = gm["signature"]
    specs = sig.get("input_specs") if isinstance(sig, dict) else None
    if not isinstance(specs, list):
        _refuse_archive(f"{where} has no input signature")
    users = 0
    for spec in specs:
        if not (isinstance(spec, dict) and len(spec) == 1 and next(iter(spec)) in _INPUT_KINDS):
            _refuse_archive(f"{where} has an input that is not a parameter, buffer, tensor constant or the "
                            f"model's token input ({str(spec)[:80]})")
        if "user_input" in spec:
            users += 1
            arg = spec["user_input"].get("arg") if isinstance(spec["user_input"], dict) else None
            if not (isinstance(arg, dict) and set(arg) == {"as_tensor"}):
                _refuse_archive(f"{where} has a user input that is not a tensor")
    if users != 1:
        _refuse_archive(f"{where} has {users} user inputs; the model takes one token tensor")
    calls = gm.get("module_call_graph", [])
    if not isinstance(calls, list):
        _refuse_archive(f"{where} has a malformed module_call_graph")
    for entry in calls:
        s = entry.get("signature") if isinstance(entry, dict) else None
        if isinstance(s, dict):
            _check_treespec(s.get("in_spec"), f"{where} (in_spec)")
            _check_treespec(s.get("out_spec"), f"{where} (out_spec)")
            if not all(_is_ident(n) for n in s.get("forward_arg_names") or []):
                _refuse_archive(f"{where} has forward argument names that are not identifiers")
    _check_json_tree(m, where)


def _check_payload_config(cfg, kind, names):
    """data/{weights,constants}/*_config.json: raw CPU tensors stored in this archive, no pickles."""
    where = f"data/{kind}/model_{kind}_config.json"
    if not (isinstance(cfg, dict) and set(cfg) == {"config"} and isinstance(cfg["config"], dict)):
        _refuse_archive(f"{where} is malformed")
    for fqn, meta in cfg["config"].items():
        if not _is_fqn(fqn) or not fqn:
            _refuse_archive(f"{where} names a tensor {fqn[:80]!r}, not a dotted identifier")
        if not (isinstance(meta, dict) and set(meta) == _PAYLOAD_KEYS):
            _refuse_archive(f"{where}: {fqn} has unexpected fields")
        if meta["use_pickle"] is not False:
            _refuse_archive(f"{where}: {fqn} holds pickled Python objects; only raw tensors are allowed")
        path = meta["path_name"]
        if not (isinstance(path, str) and _PT2_TENSOR_FILE[kind].fullmatch(path) and f"data/{kind}/{path}" in names):
            _refuse_archive(f"{where}: {fqn} points to {str(path)[:80]!r}, not a tensor file of this archive")
        tm = meta["tensor_meta"]
        if not isinstance(tm, dict) or tm.get("device") != {"type": "cpu", "index": None}:
            _refuse_archive(f"{where}: {fqn} is not a CPU tensor (export_model saves on the CPU)")
    _check_json_tree(cfg, where)


def checked_archive(model_path):
    """Validate the .pt2 at model_path and return a rebuilt copy (io.BytesIO) that holds only the
    checked entries, with the JSON as parsed here and no sample inputs: torch never reads a byte
    this function did not look at (no zip-parser differences, no file changed in between)."""
    import io
    import stat
    import zipfile
    try:
        src = zipfile.ZipFile(model_path)
    except (OSError, zipfile.BadZipFile, ValueError) as e:
        raise EvalError(f"cannot load the exported model {model_path}: not a .pt2 archive ({e})") from None
    with src:
        infos = src.infolist()
        if not infos or len(infos) > PT2_MAX_ENTRIES:
            _refuse_archive(f"it has {len(infos)} entries")
        root = infos[0].filename.split("/", 1)[0]
        if not _PT2_ROOT.fullmatch(root):
            _refuse_archive(f"its root folder {root[:80]!r} is not a plain name")
        size = os.path.getsize(model_path)
        names, total = {}, 0
        for info in infos:
            name = info.filename
            rel = name[len(root) + 1:] if name.startswith(root + "/") else None
            kind = rel.split("/")[1] if rel and rel.count("/") == 2 and rel.startswith("data/") else None
            if rel is None or not (rel in _PT2_FIXED or (kind in _PT2_TENSOR_FILE
                                                       and _PT2_TENSOR_FILE[kind].fullmatch(rel.split("/")[2]))):
                _refuse_archive(f"it holds the entry {name[:120]!r}, which torch.export.save does not write "
                                "for a static-shape export")
            if rel in names:
                _refuse_archive(f"it holds the entry {name[:120]!r} twice")
            mode = info.external_attr >> 16
            if info.is_dir() or stat.S_IFMT(mode) not in (0, stat.S_IFREG):  # 0: only permission bits
                _refuse_archive(f"its entry {name[:120]!r} is not a plain file (a link or a folder)")
            if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
                _refuse_archive(f"its entry {name[:120]!r} is compressed or encrypted (torch stores entries as is)")
            total += info.file_size
            if info.file_size != info.compress_size or total > size:
                _refuse_archive(f"its entries claim more bytes ({total}) than the file has ({size})")
            names[rel] = info
        missing = [n for n in _PT2_FIXED if n not in names]
        if missing:
            _refuse_archive(f"it lacks {', '.join(missing)}")

        def small(rel, limit=64):
            if names[rel].file_size > limit:
                _refuse_archive(f"{rel} is {names[rel].file_size} bytes")
            return src.read(names[rel])

        from torch.export.pt2_archive.constants import ARCHIVE_FORMAT_VALUE, ARCHIVE_VERSION_VALUE
        if small("archive_format") != ARCHIVE_FORMAT_VALUE.encode() \
                or small("archive_version") != ARCHIVE_VERSION_VALUE.encode():
            _refuse_archive("its archive format or version is not the one torch.export.save writes")
        if small("byteorder") != sys.byteorder.encode():
            _refuse_archive("its byte order is not this machine's")
        if not re.fullmatch(rb"[0-9]{1,10}\n?", small(".data/version")) \
                or not re.fullmatch(rb"[0-9]{1,64}", small(".data/serialization_id")):
            _refuse_archive("its .data/version or .data/serialization_id is malformed")
        parsed = {}
        for rel in _PT2_JSON_ENTRIES:
            raw = small(rel, PT2_MAX_JSON_BYTES)
            try:
                parsed[rel] = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError, RecursionError):
                _refuse_archive(f"{rel} is not valid JSON")
        try:
            _check_program(parsed["models/model.json"])
            _check_payload_config(parsed["data/weights/model_weights_config.json"], "weights", names)
            _check_payload_config(parsed["data/constants/model_constants_config.json"], "constants", names)
        except RecursionError:
            _refuse_archive("its JSON is nested too deeply")
        # the sample inputs (a torch.save pickle): only the restricted weights-only unpickler may
        # read them, and torch does not get them at all (not needed to run the graph)
        sample = src.read(names["data/sample_inputs/model.pt"])
        if sample:
            try:
                with _pickle_free():
                    torch.load(io.BytesIO(sample), weights_only=True)
            except Exception:
                raise EvalError("the archive holds pickled Python objects (in its sample inputs); only tensors "
                                "and the graph are allowed (save the model with prepare.export_model)") from None
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
            for rel, info in names.items():
                if rel in parsed:
                    data = json.dumps(parsed[rel]).encode()
                elif rel == "data/sample_inputs/model.pt":
                    data = b""
                else:
                    data = src.read(info)
                dst.writestr(zipfile.ZipInfo(f"model/{rel}"), data)
    out.seek(0)
    return out


@contextlib.contextmanager
def _no_code_in_load():
    """Second layer, in case a path of the archive check above is missed: while torch loads the
    rebuilt archive and builds the module, the sinks that turn archive text into code refuse:
    sympy's string parser (sympify of a string -> parse_expr -> eval), AOTInductor's shared
    libraries, and the guards code generator (exec)."""
    import sympy
    import sympy.parsing.sympy_parser as sp
    import torch.export._unlift as unlift
    import torch.export.pt2_archive._package as package

    def refuse(*args, **kwargs):
        raise EvalError("the archive tried to run code while loading (a symbolic expression, guards code or "
                        "a compiled library); only what prepare.export_model writes is accepted")

    real_sympify = sympy.sympify

    def sympify(a, *args, **kwargs):
        if isinstance(a, (str, bytes)):
            refuse()
        return real_sympify(a, *args, **kwargs)

    patches = [(sp, "parse_expr", refuse), (sp, "eval_expr", refuse), (sympy, "sympify", sympify),
               (package, "_load_aoti", refuse), (unlift, "_convert_guards_code_to_fn", refuse)]
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in patches]
    for mod, name, fn in patches:
        setattr(mod, name, fn)
    try:
        yield
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)


# aten ops with effects outside the tensors: from_file reads a file (the split being scored), _print
# writes to the evaluator's stdout (a forged verdict line: red team, 2026-12-01); and ops that hand out
# memory without clearing it (what the evaluator freed a moment ago: the window holding the targets,
# red team round 5), or re-point a tensor at other memory
FORBIDDEN_OPS = ("from_file", "_print", "empty", "resize", "set_")


_VIEW_PREFIXES = ("view", "alias", "as_strided", "unfold", "expand", "narrow", "select", "slice", "diagonal",
                  "transpose", "permute", "squeeze", "unsqueeze", "unbind", "split", "chunk", "detach", "reshape",
                  "flatten", "unflatten", "movedim", "swapaxes", "swapdims")


def _view_source(node):
    """The node a view chain starts from (x.view(...).transpose(...) -> x): through every op whose
    result may alias its first argument (by its schema, or by name: _unsafe_view says nothing)."""
    while node.op == "call_function" and node.args and hasattr(node.args[0], "op"):
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            rets = target._schema.returns
            base = target._schema.name.split("::")[-1].lstrip("_")
            if not ((rets and rets[0].alias_info is not None) or base.startswith(_VIEW_PREFIXES) or base == "t"):
                break
        elif getattr(target, "__name__", "") != "getitem":
            break
        node = node.args[0]
    return node


# random operators: a score must be a function of the model and the text, and a generator's state is
# state kept between calls
_RANDOM_OPS = {"rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "randperm", "bernoulli",
               "normal", "multinomial", "poisson", "uniform", "exponential", "geometric", "cauchy", "log_normal",
               "random", "native_dropout", "dropout", "feature_dropout", "alpha_dropout", "rrelu",
               "rrelu_with_noise"}


def _audit_nodes(graph, held):
    """One graph's nodes: torch operators only, none in FORBIDDEN_OPS, and none that writes in place
    into a tensor the model holds (`held`: its weights, buffers and constants) -- a counter kept there
    is state that survives from one call to the next (a model that behaves while probed, then reads
    ahead: red team, 2026-12-01). In-place ops on the model's own intermediates stay allowed."""
    import operator
    for node in graph.nodes:
        if node.op in ("call_module", "call_method"):
            raise EvalError(f"the graph has a {node.op} node ({node.target}); export with prepare.export_model")
        if node.op != "call_function":
            continue
        target = node.target
        if target is operator.getitem:
            continue
        if not isinstance(target, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)):
            raise EvalError(f"the graph calls {target!r}, which is not a torch operator")
        if any(bad in str(target) for bad in FORBIDDEN_OPS):
            raise EvalError(f"the graph calls {target}, which reads files or prints or hands out uninitialised "
                            "memory (acts outside the tensors); not allowed")
        if isinstance(target, torch._ops.OpOverload) and target._schema.name.split("::")[-1].rstrip("_") \
                in _RANDOM_OPS:
            raise EvalError(f"the graph calls {target}, a random operator: the evaluator scores a deterministic "
                            "model (export it in eval mode, without dropout or sampling)")
        if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
            args = list(node.args) + [node.kwargs.get(a.name) for a in target._schema.arguments[len(node.args):]]
            for a, v in zip(target._schema.arguments, args):
                src = _view_source(v) if hasattr(v, "op") else None
                if a.alias_info is not None and a.alias_info.is_write and src is not None \
                        and (src.op in ("get_attr", "placeholder") or src.name in held):
                    raise EvalError(f"the graph writes in place into {src.target}, which it did not create "
                                    f"({target}): a model must be a pure function of its input and may not "
                                    "change its input or its own tensors; stateful models are not allowed")


def _audit_graph(ep):
    """Only torch operators (and getitem on their results) may run; none that reads files or
    prints, none that changes the model's own tensors. torch.export never emits the first two
    kinds, but a hand-edited archive could; the third it does emit (x.add_() on a constant)."""
    sig = ep.graph_signature
    held = {spec.arg.name for spec in sig.input_specs if spec.kind.name != "USER_INPUT"}
    written = sorted(spec.kind.name for spec in sig.output_specs if spec.kind.name != "USER_OUTPUT")
    if written:
        raise EvalError(f"the model updates its own tensors in forward ({', '.join(written)}): a model must be a "
                        "pure function of its input; stateful models are not allowed")
    _audit_nodes(ep.graph_module.graph, held)
    for name, module in ep.graph_module.named_modules():
        if name and hasattr(module, "graph"):  # subgraphs of higher-order ops (cond, map, ...)
            _audit_nodes(module.graph, set())
