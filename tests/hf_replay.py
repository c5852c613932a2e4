"""What Hugging Face Transformers' `from_pretrained` makes of a checkpoint directory.

This module replays, in pure Python 3 (standard library only), how Transformers 4
(4.5x) and Transformers 5 resolve, read and load a safetensors checkpoint into the
model class its config.json names, for the models wsync supports: Qwen3-MoE, Qwen3
(dense), Qwen3.5-MoE and Qwen3.5 (with their vision tower) and Llama.  It was written
from the consumer's rules alone, never from wsync's plugins, so that it can catch a
wrong assumption in them.  Comments cite the rules where they live, as
"docs/hf-checkpoints.md §N" (which cites Transformers' source, path:line @ commit) and
"docs/safetensors.md §N".

What Transformers does with a key, and what this replay reports:
  missing      a parameter of the model no checkpoint key fills: Transformers
               initialises it at random and only logs it (a silent corruption)
  unexpected   a checkpoint key the model has no parameter for (after the weight
               conversions): dropped with a warning (lost data)
  ignored      an unexpected key the class declares in
               `_keys_to_ignore_on_load_unexpected` (dropped without a warning)
  mismatched   a key whose shape is not the parameter's: Transformers raises
  discarded    the checkpoint holds a tied LM head: Transformers ties it to the
               embedding after loading, so its bytes are lost

Parts:
  read_safetensors     a reader that refuses what the safetensors library refuses
  read_checkpoint      Transformers' file resolution (model.safetensors, else the index)
  model_params         the parameters of the model class for a config and a major version
  convert_experts      Transformers 5's WeightConverter for per-expert MoE keys
  load                 the load: the report above and the state every parameter ends in
  canonical_state      a state under Transformers 5's names, to compare across versions
"""

import json
import os
import re
import struct
import sys

if sys.byteorder != "little":  # safetensors data is little-endian (docs/safetensors.md §1)
    raise ImportError("hf_replay needs a little-endian machine")


class LoadError(Exception):
    """Transformers (or the safetensors library under it) raises: the load fails."""


# ------------------------------------------------------------------ safetensors

# Bits per element of every safetensors dtype (docs/safetensors.md §1).
DTYPE_BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8,
              "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
              "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
              "C64": 64, "F64": 64, "I64": 64, "U64": 64}
MAX_HEADER = 100000000  # safetensors MAX_HEADER_SIZE (docs/safetensors.md §1)


class Tensor:
    """One tensor as a checkpoint holds it: dtype, shape and its bytes."""
    __slots__ = ("dtype", "shape", "data")

    def __init__(self, dtype, shape, data):
        self.dtype, self.shape, self.data = dtype, tuple(shape), data

    def __eq__(self, other):
        return (self.dtype, self.shape, self.data) == (other.dtype, other.shape, other.data)

    def __repr__(self):
        return "%s%s" % (self.dtype, list(self.shape))


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def read_safetensors(path):
    """(metadata or None, {name: Tensor}) of one file, refusing what the safetensors
    library refuses (docs/safetensors.md §1): a short file, a header too large or not
    JSON, an unknown dtype, offsets with a hole or an overlap, a size that is not
    numel * bits / 8, trailing bytes.  Raises LoadError naming the file."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise LoadError("%s: HeaderTooSmall" % path)
    (n,) = struct.unpack("<Q", blob[:8])
    if n > MAX_HEADER:
        raise LoadError("%s: HeaderTooLarge (%d bytes)" % (path, n))
    if 8 + n > len(blob):
        raise LoadError("%s: InvalidHeaderLength" % path)
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise LoadError("%s: InvalidHeaderDeserialization: %s" % (path, e))
    if not isinstance(header, dict):
        raise LoadError("%s: InvalidHeaderDeserialization: not an object" % path)
    metadata = header.pop("__metadata__", None)
    if metadata is not None and (not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise LoadError("%s: InvalidHeaderDeserialization: __metadata__ is not a "
                        "string-to-string map" % path)
    entries = []
    for name, info in header.items():
        if not isinstance(info, dict) or info.get("dtype") not in DTYPE_BITS:
            raise LoadError("%s: InvalidHeaderDeserialization: tensor %s: bad entry %r"
                            % (path, name, info))
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if (not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0
                                                   for d in shape)
                or not isinstance(offsets, list) or len(offsets) != 2):
            raise LoadError("%s: InvalidHeaderDeserialization: tensor %s: bad shape or "
                            "offsets" % (path, name))
        entries.append((offsets[0], offsets[1], name, info["dtype"], shape))
    entries.sort()
    data_start, expected = 8 + n, 0
    tensors = {}
    for begin, end, name, dtype, shape in entries:
        if begin != expected or end < begin:
            raise LoadError("%s: InvalidOffset(%s)" % (path, name))
        bits = _numel(shape) * DTYPE_BITS[dtype]
        if bits % 8 or end - begin != bits // 8:
            raise LoadError("%s: TensorInvalidInfo(%s)" % (path, name))
        tensors[name] = Tensor(dtype, shape, blob[data_start + begin:data_start + end])
        expected = end
    if data_start + expected != len(blob):
        raise LoadError("%s: MetadataIncompleteBuffer" % path)
    return metadata, tensors


# ------------------------------------------------------------------ the checkpoint

SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"


class Checkpoint:
    """What from_pretrained reads from a directory: every tensor, and the problems a
    consumer would not notice but a careful reader does (docs/safetensors.md §2)."""

    def __init__(self):
        self.tensors = {}
        self.files = []
        self.index = None
        self.problems = []  # inconsistencies Transformers does not check


def _check_format(path, metadata):
    """Transformers' load_state_dict: a `__metadata__` whose `format` is not pt, tf, flax
    or mlx is refused ("does not contain the valid metadata"); Transformers 4 releases
    before the `metadata is not None` check call `metadata.get` on a file without one
    (AttributeError), and older ones refuse a format other than pt (docs/hf-checkpoints.md
    §7).  So: present, and "pt"."""
    if metadata is None:
        raise LoadError("%s: no __metadata__: Transformers 4 releases before the "
                        "`metadata is not None` check fail on metadata.get" % path)
    if metadata.get("format") != "pt":
        raise LoadError("%s: The safetensors archive passed at %s does not contain the valid "
                        "metadata (format %r, want \"pt\")" % (path, path,
                                                               metadata.get("format")))


def read_checkpoint(directory):
    """Transformers' resolution of a local directory: `model.safetensors` when present,
    else `model.safetensors.index.json`, whose `weight_map` names the shards and whose
    `metadata` must exist (`get_checkpoint_shard_files` reads `index["metadata"]` and
    `index["weight_map"]`, docs/hf-checkpoints.md §7).  Transformers 4 takes the keys from
    `weight_map` (`all_checkpoint_keys`) and loads from each shard only the keys listed,
    so a listed key missing from its shard, or a shard key not listed, is reported."""
    ck = Checkpoint()
    single = os.path.join(directory, SAFE_WEIGHTS_NAME)
    index_path = os.path.join(directory, SAFE_WEIGHTS_INDEX_NAME)
    if os.path.exists(single):
        metadata, tensors = read_safetensors(single)
        _check_format(single, metadata)
        ck.files, ck.tensors = [SAFE_WEIGHTS_NAME], tensors
        return ck
    if not os.path.exists(index_path):
        raise LoadError("%s: no file named %s or %s" % (directory, SAFE_WEIGHTS_NAME,
                                                         SAFE_WEIGHTS_INDEX_NAME))
    with open(index_path) as f:
        try:
            index = json.load(f)
        except ValueError as e:
            raise LoadError("%s: not JSON: %s" % (index_path, e))
    for key in ("metadata", "weight_map"):
        if not isinstance(index.get(key), dict):
            raise LoadError("%s: KeyError %r (get_checkpoint_shard_files)" % (index_path, key))
    ck.index = index
    weight_map = index["weight_map"]
    ck.files = sorted(set(weight_map.values()))
    for name in ck.files:
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            raise LoadError("%s: the shard %s the index names does not exist" % (directory,
                                                                                 name))
        metadata, tensors = read_safetensors(path)
        _check_format(path, metadata)
        for key, t in tensors.items():
            if weight_map.get(key) != name:
                ck.problems.append("%s holds %s, which weight_map %s" % (
                    name, key, "maps to %s" % weight_map[key] if key in weight_map
                    else "does not list (Transformers 4 never loads it)"))
                continue
            ck.tensors[key] = t
    for key, name in sorted(weight_map.items()):
        if key not in ck.tensors and not any(p.startswith("%s holds %s," % (name, key))
                                             for p in ck.problems):
            ck.problems.append("weight_map maps %s to %s, which does not hold it" % (key, name))
    total = sum(len(t.data) for t in ck.tensors.values())
    if index["metadata"].get("total_size") != total:
        # save_pretrained writes the sum of the tensor bytes (docs/safetensors.md §2)
        ck.problems.append("metadata.total_size is %r, the tensors hold %d bytes"
                           % (index["metadata"].get("total_size"), total))
    return ck


# ------------------------------------------------------------------ the model classes

# model_type -> (Transformers class, the Transformers majors that have it).  Qwen3.5
# came with Transformers 5 (docs/hf-checkpoints.md §7).
CLASSES = {"qwen3_moe": ("Qwen3MoeForCausalLM", (4, 5)),
           "qwen3": ("Qwen3ForCausalLM", (4, 5)),
           "llama": ("LlamaForCausalLM", (4, 5)),
           "qwen3_5": ("Qwen3_5ForConditionalGeneration", (5,)),
           "qwen3_5_moe": ("Qwen3_5MoeForConditionalGeneration", (5,))}


class Consumer:
    """One Transformers release line.  @major 4 or 5; @qwen35_moe_converts: whether the
    `qwen3_5_moe_text` conversion entry carries the qwen2_moe expert converters (the
    newest conversion_mapping.py seen does; an earlier v5 one maps it to the
    `qwen3_5_text` renaming alone, docs/hf-checkpoints.md §7, "Weight conversions")."""

    def __init__(self, name, major, qwen35_moe_converts=True):
        self.name, self.major, self.qwen35_moe_converts = name, major, qwen35_moe_converts

    def has(self, model_type):
        return model_type in CLASSES and self.major in CLASSES[model_type][1]


TRANSFORMERS4 = Consumer("transformers4", 4)
TRANSFORMERS5 = Consumer("transformers5", 5)
TRANSFORMERS5_EARLY = Consumer("transformers5-early", 5, qwen35_moe_converts=False)
CONSUMERS = [TRANSFORMERS4, TRANSFORMERS5, TRANSFORMERS5_EARLY]


class Model:
    """The parameters of one model class: {name: shape}, the tied LM head
    ({target: source}), the unexpected-key patterns it ignores, and the scope of
    Transformers 5's expert converters (None: none; "": every key; else a prefix)."""

    def __init__(self):
        self.params = {}
        self.tied = {}
        self.ignore_unexpected = []
        self.expert_scope = None


def _get(c, key, default):
    v = c.get(key)
    return default if v is None else v


def _attention(m, p, c, head_dim, gated, norms):
    h, nq, nkv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    bias = bool(c.get("attention_bias", False))
    q_rows = nq * head_dim * (2 if gated else 1)
    for name, shape in (("q_proj", (q_rows, h)), ("k_proj", (nkv * head_dim, h)),
                        ("v_proj", (nkv * head_dim, h)), ("o_proj", (h, nq * head_dim))):
        m.params[p + "self_attn.%s.weight" % name] = shape
        if bias:  # bias=config.attention_bias on all four (docs/hf-checkpoints.md §2, §5)
            m.params[p + "self_attn.%s.bias" % name] = (shape[0],)
    if norms:
        m.params[p + "self_attn.q_norm.weight"] = (head_dim,)
        m.params[p + "self_attn.k_norm.weight"] = (head_dim,)


def _mlp(m, p, h, inter, bias=False):
    for name, shape in (("gate_proj", (inter, h)), ("up_proj", (inter, h)),
                        ("down_proj", (h, inter))):
        m.params[p + name + ".weight"] = shape
        if bias:
            m.params[p + name + ".bias"] = (shape[0],)


def _experts(m, p, e, h, inter, major):
    """Transformers 4: an nn.ModuleList of MLPs; 5: Qwen3MoeExperts' fused parameters
    gate_up_proj [E, 2I, H] and down_proj [E, H, I] (docs/hf-checkpoints.md §4)."""
    if major == 4:
        for x in range(e):
            _mlp(m, p + "experts.%d." % x, h, inter)
    else:
        m.params[p + "experts.gate_up_proj"] = (e, 2 * inter, h)
        m.params[p + "experts.down_proj"] = (e, h, inter)


def _vocab(m, c, root, embed):
    """lm_head is tied when the top-level config says tie_word_embeddings (absent: the
    classes' default, false): Transformers 5 reads `self.config.tie_word_embeddings` of
    the class being loaded, the outer config of a ...ForConditionalGeneration; the
    Transformers 4 classes here have a flat config (docs/hf-checkpoints.md §7)."""
    m.params[embed] = (c["vocab_size"], c["hidden_size"])
    m.params["lm_head.weight"] = (c["vocab_size"], c["hidden_size"])
    if root.get("tie_word_embeddings") is True:
        m.tied["lm_head.weight"] = embed


def _qwen3(config, major):
    """Qwen3MoeForCausalLM / Qwen3ForCausalLM (docs/hf-checkpoints.md §2; the v5 layer
    rule and experts §7)."""
    c, m = config, Model()
    dense = c["model_type"] == "qwen3"
    h = c["hidden_size"]
    # Qwen3Config: head_dim default 128; Qwen3-MoE: getattr(config, "head_dim", H / nq)
    head_dim = _get(c, "head_dim", 128 if dense else h // c["num_attention_heads"])
    _vocab(m, c, c, "model.embed_tokens.weight")
    m.params["model.norm.weight"] = (h,)
    experts = _get(c, "num_experts", _get(c, "num_local_experts", 0))
    only = _get(c, "mlp_only_layers", [])
    step = _get(c, "decoder_sparse_step", 1)
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        m.params[p + "input_layernorm.weight"] = (h,)
        m.params[p + "post_attention_layernorm.weight"] = (h,)
        _attention(m, p, c, head_dim, gated=False, norms=True)
        if not dense and i not in only and experts > 0 and (i + 1) % step == 0:
            m.params[p + "mlp.gate.weight"] = (experts, h)
            _experts(m, p + "mlp.", experts, h, c["moe_intermediate_size"], major)
        else:
            _mlp(m, p + "mlp.", h, c["intermediate_size"])
    if major == 5 and not dense:
        m.expert_scope = ""  # qwen3_moe -> qwen2_moe's converters, unscoped
    return m


def _llama(config, major):
    """LlamaForCausalLM (docs/hf-checkpoints.md §5)."""
    c, m = config, Model()
    h = c["hidden_size"]
    head_dim = _get(c, "head_dim", h // c["num_attention_heads"])
    _vocab(m, c, c, "model.embed_tokens.weight")
    m.params["model.norm.weight"] = (h,)
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        m.params[p + "input_layernorm.weight"] = (h,)
        m.params[p + "post_attention_layernorm.weight"] = (h,)
        _attention(m, p, c, head_dim, gated=False, norms=False)
        _mlp(m, p + "mlp.", h, c["intermediate_size"], bias=bool(c.get("mlp_bias", False)))
    return m


def _layer_types(t):
    if t.get("layer_types") is not None:
        return t["layer_types"]
    interval = _get(t, "full_attention_interval", 4)
    return ["linear_attention" if (i + 1) % interval else "full_attention"
            for i in range(t["num_hidden_layers"])]


def _vision(m, v):
    """Qwen3_5VisionModel under model.visual (docs/hf-checkpoints.md §7)."""
    hid, inter = v["hidden_size"], v["intermediate_size"]
    p = "model.visual."
    m.params[p + "patch_embed.proj.weight"] = (hid, _get(v, "in_channels", 3),
                                               v["temporal_patch_size"], v["patch_size"],
                                               v["patch_size"])
    m.params[p + "patch_embed.proj.bias"] = (hid,)
    m.params[p + "pos_embed.weight"] = (v["num_position_embeddings"], hid)
    for b in range(v["depth"]):
        q = p + "blocks.%d." % b
        for norm in ("norm1", "norm2"):
            m.params[q + norm + ".weight"] = (hid,)
            m.params[q + norm + ".bias"] = (hid,)
        for name, shape in (("attn.qkv", (3 * hid, hid)), ("attn.proj", (hid, hid)),
                            ("mlp.linear_fc1", (inter, hid)), ("mlp.linear_fc2", (hid, inter))):
            m.params[q + name + ".weight"] = shape
            m.params[q + name + ".bias"] = (shape[0],)
    merged = hid * v["spatial_merge_size"] ** 2
    m.params[p + "merger.norm.weight"] = (hid,)
    m.params[p + "merger.norm.bias"] = (hid,)
    m.params[p + "merger.linear_fc1.weight"] = (merged, merged)
    m.params[p + "merger.linear_fc1.bias"] = (merged,)
    m.params[p + "merger.linear_fc2.weight"] = (v["out_hidden_size"], merged)
    m.params[p + "merger.linear_fc2.bias"] = (v["out_hidden_size"],)


def _qwen3_5(config, major, consumer):
    """Qwen3_5(Moe)ForConditionalGeneration (docs/hf-checkpoints.md §3, §7): every layer
    of the MoE model is a sparse MoE block (Qwen3_5MoeDecoderLayer builds it
    unconditionally), `^mtp.*` is ignored on load."""
    t, m = config["text_config"], Model()
    moe = config["model_type"] == "qwen3_5_moe"
    h = t["hidden_size"]
    head_dim = _get(t, "head_dim", 256)
    p0 = "model.language_model."
    _vocab(m, t, config, p0 + "embed_tokens.weight")
    m.params[p0 + "norm.weight"] = (h,)
    nk, nv = _get(t, "linear_num_key_heads", 16), _get(t, "linear_num_value_heads", 32)
    dk, dv = _get(t, "linear_key_head_dim", 128), _get(t, "linear_value_head_dim", 128)
    conv = 2 * nk * dk + nv * dv
    for i, kind in enumerate(_layer_types(t)):
        p = p0 + "layers.%d." % i
        m.params[p + "input_layernorm.weight"] = (h,)
        m.params[p + "post_attention_layernorm.weight"] = (h,)
        if kind == "linear_attention":
            a = p + "linear_attn."
            for name, shape in (("in_proj_qkv.weight", (conv, h)),
                                ("in_proj_z.weight", (nv * dv, h)),
                                ("in_proj_b.weight", (nv, h)), ("in_proj_a.weight", (nv, h)),
                                ("conv1d.weight", (conv, 1, _get(t, "linear_conv_kernel_dim", 4))),
                                ("A_log", (nv,)), ("dt_bias", (nv,)), ("norm.weight", (dv,)),
                                ("out_proj.weight", (h, nv * dv))):
                m.params[a + name] = shape
        else:
            _attention(m, p, t, head_dim, gated=True, norms=True)
        if moe:
            e, inter = t["num_experts"], t["moe_intermediate_size"]
            m.params[p + "mlp.gate.weight"] = (e, h)
            _experts(m, p + "mlp.", e, h, inter, major)
            _mlp(m, p + "mlp.shared_expert.", h, t["shared_expert_intermediate_size"])
            m.params[p + "mlp.shared_expert_gate.weight"] = (1, h)
        else:
            _mlp(m, p + "mlp.", h, t["intermediate_size"])
    _vision(m, config["vision_config"])
    m.ignore_unexpected = [r"^mtp.*"]
    if moe and consumer.qwen35_moe_converts:
        m.expert_scope = "model.language_model"  # the text sub-model's scoped converters
    return m


def model_params(config, consumer):
    """The Model Transformers builds from @config, or LoadError when @consumer has no
    class for its model_type."""
    model_type = config.get("model_type")
    if not consumer.has(model_type):
        raise LoadError("%s: model_type %r is not known (no %s)" % (
            consumer.name, model_type, CLASSES.get(model_type, ("a class",))[0]))
    if model_type in ("qwen3_moe", "qwen3"):
        return _qwen3(config, consumer.major)
    if model_type == "llama":
        return _llama(config, consumer.major)
    return _qwen3_5(config, consumer.major, consumer)


# ------------------------------------------------------------------ the conversion

EXPERT_KEY = re.compile(r"^(?P<pre>.*\.)?mlp\.experts\.(?P<e>\d+)\.(?P<proj>gate|up|down)"
                        r"_proj\.weight$")


def convert_experts(tensors, scope):
    """Transformers 5's qwen2_moe converters (docs/hf-checkpoints.md §4):
    `mlp.experts.*.gate_proj.weight` + `mlp.experts.*.up_proj.weight` ->
    `mlp.experts.gate_up_proj` by MergeModulelist(dim=0) (stack in expert order) then
    Concatenate(dim=1) (gate first), `mlp.experts.*.down_proj.weight` ->
    `mlp.experts.down_proj` by MergeModulelist(dim=0).  @scope "" converts every key;
    a prefix only the keys under it.  Returns the converted {name: Tensor}."""
    if scope is None:
        return dict(tensors)
    out, groups = {}, {}
    for name, t in tensors.items():
        m = EXPERT_KEY.match(name)
        if m is None or (scope and not name.startswith(scope + ".")):
            out[name] = t
            continue
        groups.setdefault(m.group("pre") or "", {}).setdefault(m.group("proj"), {})[
            int(m.group("e"))] = t
    for pre, projs in groups.items():
        stacks = {}
        for proj, experts in projs.items():
            order = sorted(experts)
            ts = [experts[e] for e in order]
            stacks[proj] = (ts, len(order))
        if "gate" in stacks and "up" in stacks:
            (gates, n), (ups, n_up) = stacks["gate"], stacks["up"]
            if n != n_up or any(g.shape != u.shape for g, u in zip(gates, ups)):
                raise LoadError("%smlp.experts: Concatenate of %d gate and %d up experts "
                                "of different shapes" % (pre, n, n_up))
            rows, cols = gates[0].shape
            out[pre + "mlp.experts.gate_up_proj"] = Tensor(
                gates[0].dtype, (n, 2 * rows, cols),
                b"".join(g.data + u.data for g, u in zip(gates, ups)))
        else:
            for proj in ("gate", "up"):
                for e, t in zip(sorted(projs.get(proj, {})), stacks.get(proj, ([], 0))[0]):
                    out["%smlp.experts.%d.%s_proj.weight" % (pre, e, proj)] = t
        if "down" in stacks:
            downs, n = stacks["down"]
            out[pre + "mlp.experts.down_proj"] = Tensor(
                downs[0].dtype, (n,) + downs[0].shape, b"".join(d.data for d in downs))
    return out


# ------------------------------------------------------------------ the load

class Report:
    """What one from_pretrained does (module docstring) and the state each parameter
    ends in ({name: Tensor}, the tied LM head being the embedding)."""

    def __init__(self):
        self.state = {}
        self.ignored_state = {}  # the ignored keys' tensors (the MTP block)
        self.missing, self.unexpected, self.ignored, self.discarded = [], [], [], []
        self.mismatched = []  # (name, checkpoint shape, parameter shape)

    def clean(self):
        return not (self.missing or self.unexpected or self.mismatched or self.discarded)

    def problems(self):
        out = ["missing (random init): %s" % k for k in self.missing]
        out += ["unexpected (dropped): %s" % k for k in self.unexpected]
        out += ["shape mismatch (raises): %s is %s, the parameter %s" % (k, list(got),
                                                                         list(want))
                for k, got, want in self.mismatched]
        out += ["tied (bytes discarded): %s" % k for k in self.discarded]
        return out


def load(tensors, config, consumer):
    """Replays @consumer's from_pretrained of @tensors ({name: Tensor}) into the class of
    @config (a dict).  Returns a Report; raises LoadError where Transformers raises."""
    model = model_params(config, consumer)
    if consumer.major == 5:
        tensors = convert_experts(tensors, model.expert_scope)
    rep = Report()
    for name in sorted(tensors):
        t = tensors[name]
        if name in model.tied:
            rep.discarded.append(name)
        elif name not in model.params:
            if any(re.search(p, name) for p in model.ignore_unexpected):
                rep.ignored.append(name)
                rep.ignored_state[name] = t
            else:
                rep.unexpected.append(name)
        elif tuple(model.params[name]) != t.shape:
            rep.mismatched.append((name, t.shape, tuple(model.params[name])))
        else:
            rep.state[name] = t
    for name in sorted(model.params):
        if name in model.tied:
            source = model.tied[name]
            if source in rep.state:
                rep.state[name] = rep.state[source]
        elif name not in tensors:
            rep.missing.append(name)
    return rep


def canonical_state(state, config):
    """@state under Transformers 5's names: a Transformers 4 Qwen3-MoE state's
    per-expert parameters through the same converters, so that two releases' states
    compare key by key."""
    if config.get("model_type") != "qwen3_moe":
        return dict(state)
    return convert_experts(state, "")


def first_difference(got, want):
    """A sentence naming the first key whose dtype, shape or bytes differ between two
    states (or that only one has), else None."""
    for name in sorted(set(got) | set(want)):
        if name not in got:
            return "%s: absent, want %r" % (name, want[name])
        if name not in want:
            return "%s: present (%r), the source has no such parameter" % (name, got[name])
        g, w = got[name], want[name]
        if (g.dtype, g.shape) != (w.dtype, w.shape):
            return "%s: %r, want %r" % (name, g, w)
        if g.data != w.data:
            at = next(i for i in range(len(g.data)) if g.data[i] != w.data[i])
            return "%s: bytes differ from byte %d of %d" % (name, at, len(g.data))
    return None


# ------------------------------------------------------------------ RoPE

# The RoPE types whose parameters include original_max_position_embeddings, which
# Transformers 5's standardize_rope_params() fills (docs/hf-checkpoints.md §6, step 4).
_ROPE_TYPES_WITH_ORIGINAL_MAX = ("llama3", "yarn", "longrope")
# Text config classes whose __post_init__ does kwargs.setdefault("partial_rotary_factor",
# 0.25) (docs/hf-checkpoints.md §3, §6 step 3).
_QUARTER_ROTARY_ROOTS = ("qwen3_5", "qwen3_5_moe", "qwen3_next")
# `rope_theta` when a config gives none: RotaryEmbeddingConfigMixin.default_theta in
# Transformers 5, which LlamaConfig and Qwen3Config do not override, and the
# `rope_theta=10000.0` default of Transformers 4's LlamaConfig.__init__
# (docs/hf-checkpoints.md §6).
DEFAULT_THETA = 10000.0


def _rope_text(config):
    """The object holding the RoPE keys: text_config for Qwen3.5, else the root."""
    return config.get("text_config", config)


def _canonical_rope(params, prf):
    """@params as the rotary embedding reads them: numbers as floats, the legacy `type`
    gone (Transformers 5's _check_received_keys drops it; Transformers 4's LlamaConfig
    copies it to rope_type), partial_rotary_factor always present (1.0 when unset, as
    every rope init function defaults it)."""
    out = {}
    for key, value in params.items():
        if key == "type":
            continue
        out[key] = float(value) if isinstance(value, (int, float)) and \
            not isinstance(value, bool) else value
    out["partial_rotary_factor"] = float(prf if prf is not None else 1.0)
    return out


def rope_transformers4(config):
    """The RoPE parameters Transformers 4 builds from @config (docs/hf-checkpoints.md §6,
    "Transformers 4"): rope_scaling as it is, its rope_type or the legacy type, default
    when it is null; rope_theta and partial_rotary_factor from the top level only
    (LlamaConfig's rope_theta defaults to 10000.0); a rope_parameters key is not read."""
    c = _rope_text(config)
    params = dict(c.get("rope_scaling") or {})
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    params["rope_theta"] = c.get("rope_theta", DEFAULT_THETA)
    return _canonical_rope(params, c.get("partial_rotary_factor"))


def rope_transformers5(config):
    """The RoPE parameters Transformers 5 builds from @config (docs/hf-checkpoints.md §6,
    "Transformers 5", steps 1 to 4): a non-empty rope_scaling whole, else
    rope_parameters; rope_theta by setdefault from the top level or default_theta;
    partial_rotary_factor from the top level, else the dict, else the class default;
    rope_type from type, else default; original_max_position_embeddings for llama3,
    yarn and longrope from the top-level attribute, else the dict, else
    max_position_embeddings.  Where a top-level key and the dict disagree the order of
    Transformers' steps would matter; rope-compat refuses such configs, so none is
    replayed here."""
    c = _rope_text(config)
    params = dict(c.get("rope_scaling") or c.get("rope_parameters") or {})
    params.setdefault("rope_theta", c.get("rope_theta", DEFAULT_THETA))
    prf = c.get("partial_rotary_factor", params.get("partial_rotary_factor"))
    if prf is None and config.get("model_type") in _QUARTER_ROTARY_ROOTS:
        prf = 0.25
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    if params["rope_type"] in _ROPE_TYPES_WITH_ORIGINAL_MAX:
        if "original_max_position_embeddings" in c:
            params["original_max_position_embeddings"] = c["original_max_position_embeddings"]
        else:
            params.setdefault("original_max_position_embeddings",
                              c.get("max_position_embeddings"))
    return _canonical_rope(params, prf)


def rope_vllm_transformers4(config):
    """The RoPE parameters vLLM builds from @config when it runs on Transformers 4, from
    #30046 (2025-12-04) until #45161 (2026-06-11) made it require Transformers 5
    (docs/vllm.md §10 "RoPE config"): the Transformers 4 config class's attributes, then
    vllm/transformers_utils/config.py patch_rope_parameters():
        rope_parameters = rope_scaling if it is not None, else the config.json
            rope_parameters key (kept as an attribute), else {"rope_type": "default"}
        rope_parameters["rope_theta"] = config.rope_theta
    where config.rope_theta is the top-level key or the class default (10000.0), so a
    rope_parameters dict's own rope_theta is overwritten; partial_rotary_factor and
    original_max_position_embeddings likewise from the top level when present; the
    legacy type becomes rope_type (patch_rope_parameters_dict)."""
    c = _rope_text(config)
    scaling = c.get("rope_scaling")
    params = dict(scaling) if scaling is not None else dict(c.get("rope_parameters") or {})
    if not params:
        params = {"rope_type": "default"}
    params["rope_theta"] = c.get("rope_theta", DEFAULT_THETA)
    prf = c.get("partial_rotary_factor", params.get("partial_rotary_factor"))
    if "original_max_position_embeddings" in c:
        params["original_max_position_embeddings"] = c["original_max_position_embeddings"]
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    return _canonical_rope(params, prf)
