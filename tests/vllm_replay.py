"""What vLLM would accept from per-rank weight files: a second, independent derivation.

This module replays, in pure Python 3 (standard library only), the two consumers of
per-rank weight files that vLLM has, over a mock of the module tree each rank of vLLM
builds.  It was written from the layout facts alone, never from wsync's plugins, so
that it can catch a wrong assumption in them.  Comments cite the facts where they live,
as "docs/<file>.md §N":

  docs/vllm.md             vLLM's runtime layouts, loaders and the two consumers
  docs/vllm-ascend.md      what vLLM-Ascend does differently
  docs/hf-checkpoints.md   Hugging Face checkpoints and config fields
  docs/safetensors.md      the safetensors format

Parts:
  Tensor, Parameter        strided views over byte storages, torch's copy_ semantics
  read_safetensors         a reader that refuses what the safetensors library refuses
  write_safetensors        a writer, for the test's negative controls
  Module                   state_dict(), named_parameters(), get_parameter() as torch
  filter_subtensors        vLLM ShardedStateLoader._filter_subtensors
  build_model              the per-rank module tree of Qwen3-MoE, Qwen3, Qwen3.5-MoE,
                           Qwen3.5 and Llama for a TP/EP rank, an era of vLLM and a platform
  load_checkpoint          vLLM's weight loaders, replayed on a Hugging Face checkpoint
  process_for_kernel       vLLM-Ascend's process_weights_after_loading for the experts
  ascend_wake_up           the experts transposed back by vLLM-Ascend 0.17-0.26's wake_up
  ShardedStateLoad         the sharded_state load loop (docs/vllm.md §6)
  kernel_update            the live update in kernel format (docs/vllm.md §7)
"""

import array
import copy
import glob
import itertools
import json
import math
import os
import re
import struct
import sys

if sys.byteorder != "little":  # safetensors data is little-endian (docs/safetensors.md §1)
    raise ImportError("vllm_replay needs a little-endian machine")


class ReplayError(Exception):
    """The checkpoint or the replay itself is inconsistent: vLLM's own weight loaders
    would have asserted (e.g. a Hugging Face tensor of the wrong shape)."""


class VllmRefuses(Exception):
    """vLLM would refuse to build the model at this TP/EP size (its divide() asserts)."""


# ------------------------------------------------------------------ dtypes

# Element sizes of the safetensors dtypes this replay handles (docs/safetensors.md §1).
DTYPE_SIZE = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
              "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
_RAW = {1: "B", 2: "H", 4: "I", 8: "Q"}
_INT_FMT = {"U8": "B", "I8": "b", "I16": "h", "U16": "H", "I32": "i", "U32": "I",
            "I64": "q", "U64": "Q", "BOOL": "B"}
# config.json dtype spellings (docs/hf-checkpoints.md §2: `dtype`, formerly `torch_dtype`).
TORCH_DTYPE = {"bfloat16": "BF16", "float16": "F16", "half": "F16", "float32": "F32",
               "float": "F32"}


def _decode(dtype, raw):
    """Python numbers from the raw element integers of @dtype."""
    if not raw:
        return []
    if dtype == "BF16":
        return array.array("f", array.array("I", [r << 16 for r in raw]).tobytes()).tolist()
    data = array.array(_RAW[DTYPE_SIZE[dtype]], raw).tobytes()
    if dtype == "F16":
        return list(struct.unpack("<%de" % len(raw), data))
    if dtype == "F32":
        return array.array("f", data).tolist()
    if dtype == "F64":
        return array.array("d", data).tolist()
    return list(struct.unpack("<%d%s" % (len(raw), _INT_FMT[dtype]), data))


def _f32_bits(value):
    try:
        return struct.unpack("<I", struct.pack("<f", value))[0]
    except OverflowError:
        return 0x7F800000 if value > 0 else 0xFF800000


def _pack_float(fmt, value):
    """struct.pack of one float, rounding to nearest even; a finite value beyond the
    format's range becomes an infinity of its sign, as a C cast (torch's copy_) gives it
    (struct raises OverflowError instead)."""
    try:
        return struct.pack(fmt, value)
    except OverflowError:
        return struct.pack(fmt, math.copysign(math.inf, value))


def _encode(dtype, values):
    """Raw element integers of @dtype for Python numbers, as torch's copy_ casts:
    floats to bfloat16 round to nearest even, NaN becomes 0x7FC0 (c10::BFloat16)."""
    if dtype == "BF16":
        out = []
        for v in values:
            u = _f32_bits(v)
            if (u & 0x7F800000) == 0x7F800000 and (u & 0x7FFFFF):
                out.append(0x7FC0)
            else:
                out.append(((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)
        return out
    size = DTYPE_SIZE[dtype]
    if dtype in ("F16", "F32", "F64"):
        fmt = "<" + {"F16": "e", "F32": "f", "F64": "d"}[dtype]
        packed = b"".join(_pack_float(fmt, v) for v in values)
    else:
        bits = size * 8
        if dtype == "BOOL":
            ints = [1 if v else 0 for v in values]
        else:
            ints = [int(v) % (1 << bits) for v in values]
        packed = array.array(_RAW[size], ints).tobytes()
    return array.array(_RAW[size], packed).tolist()


# ------------------------------------------------------------------ tensors

class Storage:
    """The bytes behind one or more tensor views (torch's untyped storage)."""
    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data


def _contiguous_strides(shape):
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def _numel(shape):
    n = 1
    for k in shape:
        n *= k
    return n


def _merge_dims(shape, *strides):
    """Drops axes of size 1 and merges neighbours contiguous in every stride list, so a
    slice of whole rows becomes one run: [(size, (stride, ...)), ...] outermost first."""
    dims = []
    for k, n in enumerate(shape):
        if n == 1:
            continue
        st = tuple(s[k] for s in strides)
        if dims and all(prev == inner * n for prev, inner in zip(dims[-1][1], st)):
            dims[-1] = (dims[-1][0] * n, st)
        else:
            dims.append((n, st))
    return dims


class Tensor:
    """A strided view of a Storage, enough of torch.Tensor for weight loading."""

    def __init__(self, storage, dtype, shape, strides=None, offset=0):
        self.storage = storage
        self.dtype = dtype
        self.shape = tuple(shape)
        self.strides = tuple(strides) if strides is not None else _contiguous_strides(shape)
        self.offset = offset  # in elements

    @classmethod
    def empty(cls, shape, dtype):
        """Uninitialised memory as torch.empty gives it: a 0xA5 filler here, so that a
        slot nothing wrote shows."""
        return cls(Storage(bytearray(b"\xa5" * (_numel(shape) * DTYPE_SIZE[dtype]))), dtype,
                   shape)

    @classmethod
    def from_bytes(cls, data, dtype, shape):
        if len(data) != _numel(shape) * DTYPE_SIZE[dtype]:
            raise ValueError("%d bytes for %s %s" % (len(data), dtype, list(shape)))
        return cls(Storage(bytearray(data)), dtype, shape)

    @property
    def elsize(self):
        return DTYPE_SIZE[self.dtype]

    @property
    def ndim(self):
        return len(self.shape)

    def numel(self):
        return _numel(self.shape)

    def data_ptr(self):
        return self.offset * self.elsize

    def end_ptr(self):
        """One past the last byte of the view (vLLM's get_end_ptr)."""
        last = self.offset + sum((n - 1) * s for n, s in zip(self.shape, self.strides))
        return (last + 1) * self.elsize

    def is_contiguous(self):
        return all(n == 1 or s == c for n, s, c in
                   zip(self.shape, self.strides, _contiguous_strides(self.shape)))

    def _dim(self, dim):
        if not -self.ndim <= dim < max(self.ndim, 1):
            raise IndexError("Dimension out of range (expected to be in range of [%d, %d], "
                             "but got %d)" % (-self.ndim, self.ndim - 1, dim))
        return dim % self.ndim

    def narrow(self, dim, start, length):
        dim = self._dim(dim)
        size = self.shape[dim]
        if start < 0 or length < 0 or start + length > size:
            raise RuntimeError("start (%d) + length (%d) exceeds dimension size (%d)."
                               % (start, length, size))
        shape = list(self.shape)
        shape[dim] = length
        return Tensor(self.storage, self.dtype, shape, self.strides,
                      self.offset + start * self.strides[dim])

    def select(self, dim, index):
        dim = self._dim(dim)
        if not 0 <= index < self.shape[dim]:
            raise IndexError("index %d is out of bounds for dimension %d with size %d"
                             % (index, dim, self.shape[dim]))
        return Tensor(self.storage, self.dtype, self.shape[:dim] + self.shape[dim + 1:],
                      self.strides[:dim] + self.strides[dim + 1:],
                      self.offset + index * self.strides[dim])

    def transpose(self, d0, d1):
        d0, d1 = self._dim(d0), self._dim(d1)
        shape, strides = list(self.shape), list(self.strides)
        shape[d0], shape[d1] = shape[d1], shape[d0]
        strides[d0], strides[d1] = strides[d1], strides[d0]
        return Tensor(self.storage, self.dtype, shape, strides, self.offset)

    def chunk(self, n, dim):
        dim = self._dim(dim)
        size = -(-self.shape[dim] // n)
        return [self.narrow(dim, s, min(size, self.shape[dim] - s))
                for s in range(0, self.shape[dim], size)]

    def contiguous(self):
        out = Tensor.empty(self.shape, self.dtype)
        out.copy_(self)
        return out

    def tobytes(self):
        if self.is_contiguous():
            start = self.offset * self.elsize
            return bytes(self.storage.data[start:start + self.numel() * self.elsize])
        return self.contiguous().tobytes()

    def raw(self):
        """The elements as raw integers, in C order."""
        return array.array(_RAW[self.elsize], self.tobytes()).tolist()

    def _broadcast_strides(self, src):
        """The strides that expand @src to this tensor's shape, as copy_ broadcasts it,
        or torch's RuntimeError."""
        if src.ndim > self.ndim:
            raise RuntimeError("output with shape %s doesn't match the broadcast shape %s"
                               % (list(self.shape), list(src.shape)))
        lead = self.ndim - src.ndim
        strides = [0] * lead
        for k in range(src.ndim):
            s, d = src.shape[k], self.shape[lead + k]
            if s == d:
                strides.append(src.strides[k])
            elif s == 1:
                strides.append(0)
            elif d == 1:
                raise RuntimeError("output with shape %s doesn't match the broadcast shape %s"
                                   % (list(self.shape), list(src.shape)))
            else:
                raise RuntimeError("The size of tensor a (%d) must match the size of tensor "
                                   "b (%d) at non-singleton dimension %d" % (d, s, lead + k))
        return strides

    def copy_(self, src):
        """torch's Tensor.copy_: broadcasts @src, casts its dtype silently."""
        sstrides = self._broadcast_strides(src)
        if src.dtype != self.dtype:
            cast = _encode(self.dtype, _decode(src.dtype, src.raw()))
            src = Tensor(Storage(bytearray(array.array(_RAW[self.elsize], cast).tobytes())),
                         self.dtype, src.shape)
            sstrides = self._broadcast_strides(src)
        fmt = _RAW[self.elsize]
        dst_mv = memoryview(self.storage.data).cast(fmt)
        src_mv = memoryview(src.storage.data).cast(fmt)
        dims = _merge_dims(self.shape, self.strides, sstrides)
        if not dims:
            dst_mv[self.offset] = src_mv[src.offset]
            return self
        outer, (n, (dl, sl)) = dims[:-1], dims[-1]
        for idx in itertools.product(*(range(size) for size, _ in outer)):
            do = self.offset + sum(i * st[0] for i, (_, st) in zip(idx, outer))
            so = src.offset + sum(i * st[1] for i, (_, st) in zip(idx, outer))
            if sl == 0:
                dst_mv[do:do + (n - 1) * dl + 1:dl] = array.array(fmt, [src_mv[so]]) * n
            else:
                dst_mv[do:do + (n - 1) * dl + 1:dl] = src_mv[so:so + (n - 1) * sl + 1:sl]
        return self

    def fill_(self, value):
        raw = _encode(self.dtype, [value])[0]
        one = Tensor(Storage(bytearray(array.array(_RAW[self.elsize], [raw]).tobytes())),
                     self.dtype, ())
        return self.copy_(one)

    def scramble_(self):
        """Back to uninitialised memory (the 0xA5 filler of empty())."""
        fill = Tensor.empty(self.shape, self.dtype)
        return self.copy_(fill)


class Parameter(Tensor):
    """nn.Parameter: a tensor a module registers as a parameter, with the weight loader
    vLLM attaches to it."""

    def __init__(self, tensor, weight_loader=None, rule=None):
        super().__init__(tensor.storage, tensor.dtype, tensor.shape, tensor.strides,
                         tensor.offset)
        self.weight_loader = weight_loader
        self.rule = rule or getattr(tensor, "rule", None)  # for diagnostics
        self.loaded = 0  # weight-loader calls that wrote into it (replay bookkeeping)

    @classmethod
    def new(cls, shape, dtype, weight_loader=None, rule=None):
        return cls(Tensor.empty(shape, dtype), weight_loader, rule)


# ------------------------------------------------------------------ safetensors

MAX_HEADER = 100_000_000


def read_safetensors(path):
    """[(name, Tensor)] in the order of the file's header (docs/vllm.md §6: "keys in file
    order"), after the checks of the safetensors reader (docs/safetensors.md §1): header
    length, JSON, known dtypes, offsets that tile the data buffer with no hole or
    overlap, sizes matching the shapes, nothing after the last tensor.  Raises ValueError naming the problem."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError("HeaderTooSmall")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER:
        raise ValueError("HeaderTooLarge")
    if 8 + n > len(data):
        raise ValueError("InvalidHeaderLength")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError("InvalidHeaderDeserialization: %s" % e)
    if not isinstance(header, dict):
        raise ValueError("InvalidHeaderDeserialization: not an object")
    base = 8 + n
    entries = []
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise ValueError("InvalidHeaderDeserialization: __metadata__ must map "
                                 "strings to strings")
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ValueError("InvalidHeaderDeserialization: %s" % name)
        if dtype not in DTYPE_SIZE:
            raise ValueError("%s: dtype %s is not handled by this replay" % (name, dtype))
        if end - begin != _numel(shape) * DTYPE_SIZE[dtype]:
            raise ValueError("TensorInvalidInfo: %s" % name)
        entries.append((name, dtype, shape, begin, end))
    pos = 0
    for name, dtype, shape, begin, end in sorted(entries, key=lambda e: (e[3], e[4])):
        if begin != pos or end < begin:
            raise ValueError("InvalidOffset: %s" % name)
        pos = end
    if base + pos != len(data):
        raise ValueError("MetadataIncompleteBuffer")
    return [(name, Tensor.from_bytes(data[base + b:base + e], dtype, shape))
            for name, dtype, shape, b, e in entries]


def write_safetensors(path, items):
    """Writes [(name, Tensor)] in that order, the header padded with spaces to a
    multiple of 8 (docs/safetensors.md §1).  For the test's negative controls."""
    header, blobs, pos = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in items:
        data = t.tobytes()
        header[name] = {"dtype": t.dtype, "shape": list(t.shape),
                        "data_offsets": [pos, pos + len(data)]}
        blobs.append(data)
        pos += len(data)
    text = json.dumps(header).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


# ------------------------------------------------------------------ modules

class Module:
    """torch.nn.Module's registration and lookup: parameters, buffers (persistent or
    not) and children; the same child may be registered under several names, which is
    how vLLM's aliases arise (docs/vllm.md §5, §6)."""

    def __init__(self, kind="Module"):
        self._kind = kind
        self._parameters = {}
        self._buffers = {}
        self._non_persistent = set()
        self._modules = {}

    def register_parameter(self, name, param):
        assert isinstance(param, Parameter)
        self._parameters[name] = param
        return param

    def register_buffer(self, name, tensor, persistent=True):
        self._buffers[name] = tensor
        if not persistent:
            self._non_persistent.add(name)
        return tensor

    def add_module(self, name, module):
        self._modules[name] = module
        return module

    def _lookup(self, name):
        """nn.Module.__getattr__: parameters, then buffers, then modules."""
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                return table[name]
        raise AttributeError("%s has no attribute `%s`" % (self._kind, name))

    def state_dict(self, destination=None, prefix=""):
        """torch's state_dict: own parameters, then persistent buffers, then every
        registered child under every name it has (no de-duplication)."""
        if destination is None:
            destination = {}
        for name, p in self._parameters.items():
            destination[prefix + name] = p
        for name, b in self._buffers.items():
            if name not in self._non_persistent:
                destination[prefix + name] = b
        for name, child in self._modules.items():
            child.state_dict(destination, prefix + name + ".")
        return destination

    def named_modules(self, memo=None, prefix=""):
        if memo is None:
            memo = set()
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            yield from child.named_modules(memo, prefix + ("." if prefix else "") + name)

    def named_parameters(self):
        """torch's named_parameters(): each parameter once, under its first name."""
        seen = set()
        for mprefix, module in self.named_modules():
            for name, p in module._parameters.items():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield (mprefix + "." if mprefix else "") + name, p

    def get_submodule(self, target):
        mod = self
        if target == "":
            return mod
        for item in target.split("."):
            mod = mod._lookup(item)
            if not isinstance(mod, Module):
                raise AttributeError("`%s` is not an nn.Module" % item)
        return mod

    def get_parameter(self, target):
        """torch's get_parameter: any dotted path through registered modules to a
        parameter; a buffer or an unknown name raises AttributeError (docs/vllm.md §7)."""
        module_path, _, param_name = target.rpartition(".")
        param = self.get_submodule(module_path)._lookup(param_name)
        if not isinstance(param, Parameter):
            raise AttributeError("`%s` is not an nn.Parameter" % param_name)
        return param


def filter_subtensors(tensors):
    """vLLM's ShardedStateLoader._filter_subtensors (docs/vllm.md §6 "What is in a file"):
    drops tensors of numel 0 and tensors whose memory another tensor covers; of identical
    tensors (tied or aliased) keeps the one with the lexicographically smallest key."""
    groups = {}
    for key, t in tensors.items():
        if t.numel():
            groups.setdefault(id(t.storage), []).append((key, t))
    result = {}
    for group in groups.values():
        for k, t in group:
            a, b = t.data_ptr(), t.end_ptr()
            keep = True
            for k2, t2 in group:
                if not t2.is_contiguous():
                    continue
                a2, b2 = t2.data_ptr(), t2.end_ptr()
                if a < a2 or b2 < b:
                    continue
                if a2 < a or b < b2 or not t.is_contiguous():
                    keep = False  # t2 covers strictly more memory than t
                    break
                if k2 < k:
                    keep = False  # same tensors: keep the smaller key
                    break
            if keep:
                result[k] = t
    return result


# ------------------------------------------------------------------ parallel state

class Parallel:
    """Where one worker sits: TP size and rank, EP size and rank (docs/vllm.md §4: with EP
    the experts are not TP-sliced, moe tp_size = 1, and ep = dp * tp), and the deployment
    settings that decide the shared expert: vLLM's all2all backend and prefill context
    parallelism (docs/vllm.md §9.4), vLLM-Ascend's enable_shared_expert_dp
    (docs/vllm-ascend.md §2)."""

    # ParallelConfig.use_sequence_parallel_moe's list at v0.24.0 and v0.27.1, with the
    # names __post_init__ renames to allgather_reducescatter (docs/vllm.md §9.4).
    SEQUENCE_PARALLEL_BACKENDS = ("allgather_reducescatter", "naive", "pplx",
                                  "deepep_high_throughput", "deepep_low_latency",
                                  "mori_high_throughput", "mori_low_latency", "nixl_ep")

    def __init__(self, tp, tp_rank, ep=1, ep_rank=0, pcp=1,
                 all2all_backend="allgather_reducescatter", enable_shared_expert_dp=False):
        self.tp, self.tp_rank, self.ep, self.ep_rank = tp, tp_rank, ep, ep_rank
        self.moe_tp = 1 if ep > 1 else tp
        self.moe_tp_rank = 0 if ep > 1 else tp_rank
        dp = ep // (pcp * tp) if ep > 1 else 1  # with EP, ep = dp * pcp * tp (docs/vllm.md §4)
        # ParallelConfig.use_sequence_parallel_moe: the backend listed, EP, TP > 1, DP > 1
        # (docs/vllm.md §9.4).
        self.sequence_parallel_moe = (all2all_backend in self.SEQUENCE_PARALLEL_BACKENDS
                                      and ep > 1 and tp > 1 and dp > 1)
        # AscendConfig.enable_shared_expert_dp: the additional_config key, EP and TP > 1
        # (docs/vllm-ascend.md §2).
        self.shared_expert_dp = bool(enable_shared_expert_dp) and ep > 1 and tp > 1


def divide(numerator, denominator, what):
    """vLLM's divide(): asserts, so the engine refuses to start."""
    if denominator <= 0 or numerator % denominator:
        raise VllmRefuses("%s: %d is not divisible by %d" % (what, numerator, denominator))
    return numerator // denominator


def _check_shape(dst, src, where):
    # vLLM's loaders assert `param_data.shape == loaded_weight.shape` before copy_.
    if dst.shape != src.shape:
        raise ReplayError("%s: checkpoint slice of shape %s for a slot of shape %s"
                          % (where, list(src.shape), list(dst.shape)))


def _mark(param):
    param.loaded += 1


def default_weight_loader(param, loaded, shard_id=None):
    # Replicated tensors are copied whole; copy_ casts to the parameter dtype
    # (docs/vllm.md §2 "Dtype on load").
    _check_shape(param, loaded, "default_weight_loader")
    param.copy_(loaded)
    _mark(param)


# ------------------------------------------------------------------ layers (docs/vllm.md §2, §3)

def replicated_linear(inp, out, dtype, bias=False):
    """ReplicatedLinear: [out, in], the full tensor on every rank (docs/vllm.md §2)."""
    rule = "ReplicatedLinear: the full tensor on every rank (docs/vllm.md §2)"
    m = Module("ReplicatedLinear")
    m.register_parameter("weight", Parameter.new((out, inp), dtype, default_weight_loader, rule))
    if bias:
        m.register_parameter("bias", Parameter.new((out,), dtype, default_weight_loader, rule))
    return m


def column_linear(inp, out, par, dtype, bias=False):
    """ColumnParallelLinear: [out/tp, in], rows [t*out/tp, (t+1)*out/tp) (docs/vllm.md
    §2); the bias is sliced the same way (§2 "Biases"; the vision linear_fc1.bias, §9.5)."""
    per = divide(out, par.tp, "ColumnParallelLinear output %d over tp %d" % (out, par.tp))

    def loader(param, loaded, shard_id=None):
        piece = loaded.narrow(0, par.tp_rank * per, per)
        _check_shape(param, piece, "ColumnParallelLinear")
        param.copy_(piece)
        _mark(param)

    rule = "ColumnParallelLinear: rows [t*out/tp, (t+1)*out/tp) (docs/vllm.md §2)"
    m = Module("ColumnParallelLinear")
    m.register_parameter("weight", Parameter.new((per, inp), dtype, loader, rule))
    if bias:
        m.register_parameter("bias", Parameter.new((per,), dtype, loader, rule))
    return m


def merged_column_linear(inp, sizes, par, dtype, bias=False):
    """MergedColumnParallelLinear(output_sizes): [sum/tp, in]; shard i sits at
    sum_{j<i} s_j/tp, size s_i/tp, narrowed at t*s_i/tp.  A tuple shard id splits the
    loaded tensor into those shards at their full sizes first (docs/vllm.md §2, §9.3
    in_proj_qkvz).  The bias [sum/tp] is sliced per part the same way (§2 "Biases")."""
    per = [divide(s, par.tp, "MergedColumnParallelLinear shard %d over tp %d" % (s, par.tp))
           for s in sizes]

    def loader(param, loaded, shard_id=None):
        if isinstance(shard_id, tuple):
            start = 0
            for i in shard_id:
                loader(param, loaded.narrow(0, start, sizes[i]), i)
                start += sizes[i]
            return
        if shard_id is None:  # the whole fused tensor, shard by shard
            loader(param, loaded, tuple(range(len(sizes))))
            return
        offset = sum(per[:shard_id])
        dst = param.narrow(0, offset, per[shard_id])
        piece = loaded.narrow(0, par.tp_rank * per[shard_id], per[shard_id])
        _check_shape(dst, piece, "MergedColumnParallelLinear shard %s" % shard_id)
        dst.copy_(piece)
        _mark(param)

    rule = ("MergedColumnParallelLinear%s: each part's rank-t rows, packed in order "
            "(docs/vllm.md §2)"
            % sizes)
    m = Module("MergedColumnParallelLinear")
    m.register_parameter("weight", Parameter.new((sum(per), inp), dtype, loader, rule))
    if bias:
        m.register_parameter("bias", Parameter.new((sum(per),), dtype, loader, rule))
    return m


def qkv_linear(hidden, hd, nh_total, nkv_total, par, dtype, bias=False):
    """QKVParallelLinear: per rank [q | k | v] with nh/tp query heads and kvl KV heads;
    when tp >= nkv each KV head is replicated over tp/nkv ranks and rank t takes head
    t // replicas (docs/vllm.md §2 "QKV rules").  Without a shard id the fused tensor is
    split into its q, k, v thirds first (§2 "Which loader runs"; the vision tower's
    attn.qkv, §9.5)."""
    nh = divide(nh_total, par.tp, "QKVParallelLinear heads %d over tp %d" % (nh_total, par.tp))
    if par.tp >= nkv_total:
        kvl, replicas = 1, divide(par.tp, nkv_total,
                                  "QKVParallelLinear tp %d over %d KV heads" % (par.tp, nkv_total))
    else:
        kvl, replicas = divide(nkv_total, par.tp,
                               "QKVParallelLinear KV heads %d over tp %d" % (nkv_total, par.tp)), 1
    rows = {"q": (0, nh * hd, par.tp_rank),
            "k": (nh * hd, kvl * hd, par.tp_rank // replicas),
            "v": ((nh + kvl) * hd, kvl * hd, par.tp_rank // replicas)}
    full = {"q": nh_total * hd, "k": nkv_total * hd, "v": nkv_total * hd}

    def loader(param, loaded, shard_id=None):
        if shard_id is None:
            start = 0
            for sid in ("q", "k", "v"):
                loader(param, loaded.narrow(0, start, full[sid]), sid)
                start += full[sid]
            return
        offset, size, shard_rank = rows[shard_id]
        dst = param.narrow(0, offset, size)
        piece = loaded.narrow(0, shard_rank * size, size)
        _check_shape(dst, piece, "QKVParallelLinear shard %s" % shard_id)
        dst.copy_(piece)
        _mark(param)

    total = (nh + 2 * kvl) * hd
    rule = ("QKVParallelLinear: [q | k | v] of rank t, KV head t // %d "
            "(docs/vllm.md §2 QKV rules)"
            % replicas)
    m = Module("QKVParallelLinear")
    m.register_parameter("weight", Parameter.new((total, hidden), dtype, loader, rule))
    if bias:
        m.register_parameter("bias", Parameter.new((total,), dtype, loader, rule))
    return m


def row_linear(inp, out, par, dtype, bias=False):
    """RowParallelLinear: [out, in/tp], columns [t*in/tp, (t+1)*in/tp); the bias is
    full (docs/vllm.md §2 "Biases"; the vision attn.proj.bias, §9.5)."""
    per = divide(inp, par.tp, "RowParallelLinear input %d over tp %d" % (inp, par.tp))

    def loader(param, loaded, shard_id=None):
        piece = loaded.narrow(1, par.tp_rank * per, per)
        _check_shape(param, piece, "RowParallelLinear")
        param.copy_(piece)
        _mark(param)

    rule = "RowParallelLinear: columns [t*in/tp, (t+1)*in/tp), the bias full (docs/vllm.md §2)"
    m = Module("RowParallelLinear")
    m.register_parameter("weight", Parameter.new((out, per), dtype, loader, rule))
    if bias:
        m.register_parameter("bias", Parameter.new((out,), dtype, default_weight_loader, rule))
    return m


def vocab_parallel(vocab, hidden, par, dtype):
    """VocabParallelEmbedding / ParallelLMHead: [Vp/tp, H], Vp = ceil(V/64)*64; rank t
    holds rows [t*Vp/tp, (t+1)*Vp/tp) of the padded vocabulary, rows >= V zero-filled
    (docs/vllm.md §3: `param[loaded_weight.shape[0] :].data.fill_(0)`)."""
    padded = -(-vocab // 64) * 64
    per = divide(padded, par.tp, "vocabulary %d (padded) over tp %d" % (padded, par.tp))
    start = par.tp_rank * per
    real = max(0, min(start + per, vocab) - start)

    def loader(param, loaded, shard_id=None):
        # the rank's real rows are its padded range clipped to V; a rank of padding only
        # narrows at V, length 0 (docs/vllm.md §3: the real rows are the range clipped to V)
        piece = loaded.narrow(0, min(start, vocab), real)
        dst = param.narrow(0, 0, real)
        _check_shape(dst, piece, "VocabParallelEmbedding")
        dst.copy_(piece)
        if real < per:
            param.narrow(0, real, per - real).fill_(0)
        _mark(param)

    rule = ("VocabParallelEmbedding: rows of the vocabulary padded to 64, padding zero "
            "(docs/vllm.md §3)")
    m = Module("VocabParallelEmbedding")
    m.register_parameter("weight", Parameter.new((per, hidden), dtype, loader, rule))
    return m


def norm(n, dtype):
    """RMSNorm / GemmaRMSNorm / RMSNormGated: a replicated [n] weight, copied verbatim
    (docs/vllm.md §8, §9.1: GemmaRMSNorm's +1 is applied at run time, not stored)."""
    m = Module("RMSNorm")
    m.register_parameter("weight", Parameter.new((n,), dtype, default_weight_loader,
                                                 "norm weight: replicated, verbatim "
                                                 "(docs/vllm.md §9.1)"))
    return m


def layer_norm(n, dtype):
    """nn.LayerNorm: weight and bias, full on every rank (docs/vllm.md §9.5)."""
    rule = "LayerNorm: full on every rank (docs/vllm.md §9.5)"
    m = Module("LayerNorm")
    m.register_parameter("weight", Parameter.new((n,), dtype, default_weight_loader, rule))
    m.register_parameter("bias", Parameter.new((n,), dtype, default_weight_loader, rule))
    return m


def attention_scales(heads=None, kv_heads=None, par=None):
    """Attention: set_default_quant_scales(register_buffer=True) registers _k_scale,
    _v_scale, _q_scale and _prob_scale as persistent float32 0-dim buffers of 1.0
    (docs/vllm.md §6 "Persistent buffers that do not come from the Hugging Face
    checkpoint").  Given the model's @heads and @kv_heads, its `assert num_heads %
    num_kv_heads == 0` on this rank's heads (nh/tp and max(1, nkv/tp), docs/vllm.md §8,
    §9.2, §10)."""
    if heads is not None:
        local_heads = heads // par.tp
        local_kv = max(1, kv_heads // par.tp)
        if local_heads % local_kv:
            raise VllmRefuses("Attention: num_heads (%d) is not divisible by num_kv_heads (%d)"
                              % (local_heads, local_kv))
    m = Module("Attention")
    for name in ("_k_scale", "_v_scale", "_q_scale", "_prob_scale"):
        scale = m.register_buffer(name, Tensor.empty((), "F32").fill_(1.0))
        scale.rule = "attention scale: F32 scalar 1.0, a persistent buffer (docs/vllm.md §6)"
    return m


def rotary(rot_dim):
    """Rotary caches are persistent=False, so never in a state_dict (docs/vllm.md §6).  The
    size does not matter: nothing reads it."""
    m = Module("RotaryEmbedding")
    m.register_buffer("cos_sin_cache", Tensor.empty((2, rot_dim), "F32"), persistent=False)
    return m


# ------------------------------------------------------------------ experts (docs/vllm.md §4)

def expert_placement(num_experts, ep, ep_rank):
    """determine_expert_map, "linear" placement (docs/vllm.md §4): contiguous blocks, the
    remainder to the first ranks.  Returns (first global expert, local count)."""
    base, rem = divmod(num_experts, ep)
    local = base + 1 if ep_rank < rem else base
    return ep_rank * base + min(ep_rank, rem), local


def routed_experts(num_experts, inter, hidden, par, dtype, map_persistent, platform="cuda"):
    """FusedMoE's (vLLM-new: RoutedExperts') w13_weight [E_loc, 2*I/tp_moe, H] and
    w2_weight [E_loc, H, I/tp_moe] in the loader layout (docs/vllm.md §4); with EP the
    _expert_map buffer, int32 [E], -1 for experts of other ranks (§4), persistent or not
    by release (§5, §6).  vLLM-Ascend sizes every EP rank for E // ep experts, so a split
    that leaves a remainder does not load or start there (docs/vllm-ascend.md §2 "Expert
    placement")."""
    ip = divide(inter, par.moe_tp, "moe_intermediate_size %d over tp %d" % (inter, par.moe_tp))
    if platform == "ascend" and par.ep > 1:
        divide(num_experts, par.ep, "vLLM-Ascend: %d experts over ep %d" % (num_experts, par.ep))
    first, local = expert_placement(num_experts, par.ep, par.ep_rank)
    m = Module("FusedMoE")
    m.register_parameter("w13_weight", Parameter.new(
        (local, 2 * ip, hidden), dtype,
        rule="w13: local experts [%d, %d), [gate rows | up rows] of TP rank t (docs/vllm.md §4)"
        % (first, first + local)))
    m.register_parameter("w2_weight", Parameter.new(
        (local, hidden, ip), dtype,
        rule="w2: local experts [%d, %d), down columns of TP rank t (docs/vllm.md §4)"
        % (first, first + local)))
    if par.ep > 1:
        emap = Tensor.empty((num_experts,), "I32").fill_(-1)
        emap.narrow(0, first, local).copy_(
            Tensor.from_bytes(array.array("i", range(local)).tobytes(), "I32", (local,)))
        m.register_buffer("_expert_map", emap, persistent=map_persistent)
        emap.rule = "_expert_map: int32, local index of experts [%d, %d), -1 elsewhere " \
            "(docs/vllm.md §4)" \
            % (first, first + local)
    m.py_first, m.py_local, m.py_filled = first, local, set()

    def load(loaded, shard_id, expert_id):
        """FusedMoE.weight_loader for one expert's gate (w1), up (w3) or down (w2): only
        experts local to this rank load; w1 fills the first half of w13, w3 the second,
        each narrowed at tp_rank*I/tp; w2 is narrowed on its input dim (docs/vllm.md §4)."""
        if not first <= expert_id < first + local:
            return
        j = expert_id - first
        if shard_id in ("w1", "w3"):
            param = m._parameters["w13_weight"]
            data = param.select(0, j)
            half = data.shape[0] // 2
            piece = loaded.narrow(0, half * par.moe_tp_rank, half)
            dst = data.narrow(0, 0 if shard_id == "w1" else half, half)
        else:
            param = m._parameters["w2_weight"]
            dst = param.select(0, j)
            size = dst.shape[1]
            piece = loaded.narrow(1, size * par.moe_tp_rank, size)
        _check_shape(dst, piece, "FusedMoE expert %d %s" % (expert_id, shard_id))
        dst.copy_(piece)
        _mark(param)
        m.py_filled.add((j, shard_id))

    m.py_load = load
    return m


def dense_mlp(hidden, inter, par, dtype, bias=False):
    """Qwen3MoeMLP / Qwen2MLP / Qwen2MoeMLP / LlamaMLP: gate_up_proj Merged[I, I] (gate
    first), down_proj Row (docs/vllm.md §8 stacked mapping and dense layers, §9.4);
    LlamaMLP's mlp_bias gives both biases, gate_up's sliced, down's full (§10
    "Biases")."""
    m = Module("MLP")
    m.add_module("gate_up_proj", merged_column_linear(hidden, [inter, inter], par, dtype, bias))
    m.add_module("down_proj", row_linear(inter, hidden, par, dtype, bias))
    return m


def moe_block(cfg, par, era, platform, map_persistent, ascend_unwrapped=False):
    """The sparse MoE block (Qwen3MoeSparseMoeBlock, Qwen3NextSparseMoeBlock) with the
    modules each era of vLLM registers twice (docs/vllm.md §5 table):
      A  FusedMoE at mlp.experts also holds _gate and _shared_experts;
      B  no aliases;
      C  FusedMoE.runner is a module holding gate;
      D  MoERunner *is* mlp.experts: gate, routed_experts, _shared_experts._layer.
    The shared expert's expert_gate aliases shared_expert_gate in every era (#26145).
    vLLM-Ascend's own classes add aliases of their own (docs/vllm-ascend.md §2 "Names
    by release"): in eras A to C its AscendFusedMoE (mlp.experts) holds the router as
    _gate and the shared expert MLP as _shared_experts; in era D its AscendMoERunner
    holds the router as _gate and, in the releases for vLLM 0.24 to 0.26
    (@ascend_unwrapped), sets _shared_experts to the shared expert MLP itself, which
    replaces the SharedExperts wrapper (nn.Module.__setattr__)."""
    h, dtype = cfg.hidden, cfg.dtype
    if par.tp > cfg.num_experts:
        # `if self.tp_size > config.num_experts: raise ValueError(...)`, EP or not
        # (docs/vllm.md §4 "Tensor parallelism larger than the number of experts")
        raise VllmRefuses("tp %d is greater than the %d experts" % (par.tp, cfg.num_experts))
    block = Module("SparseMoeBlock")
    # docs/vllm.md §8, §9.4
    gate = block.add_module("gate", replicated_linear(h, cfg.num_experts, dtype))
    shared = None
    if cfg.shared_inter > 0:  # docs/vllm.md §8 "Shared expert", §9.4
        seg = block.add_module("shared_expert_gate", replicated_linear(h, 1, dtype))
        # With sequence-parallel MoE the shared expert MLP is built with
        # disable_tp=is_sequence_parallel: gate_up_proj and down_proj full
        # (docs/vllm.md §9.4).  vLLM-Ascend's linear layers replicate a shared-expert
        # linear only with shared-expert DP; vLLM's use_sequence_parallel_moe never
        # reaches them (docs/vllm-ascend.md §2).
        whole = par.shared_expert_dp if platform == "ascend" else par.sequence_parallel_moe
        shared_par = Parallel(1, 0) if whole else par
        shared = block.add_module("shared_expert",
                                  dense_mlp(h, cfg.shared_inter, shared_par, dtype))
        shared.add_module("expert_gate", seg)
    routed = routed_experts(cfg.num_experts, cfg.moe_inter, h, par, dtype, map_persistent,
                            platform)
    if era == "A":
        experts = routed
        experts.add_module("_gate", gate)
        if shared is not None:
            experts.add_module("_shared_experts", shared)
    elif era == "B":
        experts = routed
    elif era == "C":
        experts = routed
        runner = experts.add_module("runner", Module("MoERunner"))
        runner.add_module("gate", gate)
    elif era == "D":
        experts = Module("MoERunner")
        experts.add_module("gate", gate)
        experts.add_module("routed_experts", routed)
        if shared is not None:
            wrapper = experts.add_module("_shared_experts", Module("SharedExperts"))
            wrapper.add_module("_layer", shared)
    else:
        raise ValueError("unknown era %r" % era)
    if platform == "ascend":
        experts.add_module("_gate", gate)
        if shared is not None and (era != "D" or ascend_unwrapped):
            experts.add_module("_shared_experts", shared)
    block.add_module("experts", experts)
    block.py_routed = routed
    return block


# ------------------------------------------------------------------ config

class ModelConfig:
    """The config.json fields that decide the layout (docs/hf-checkpoints.md §2, §3): text
    fields under text_config for Qwen3.5, num_experts or num_local_experts, dtype or
    torch_dtype."""

    FAMILIES = {"qwen3_moe": "qwen3", "qwen3": "qwen3", "qwen3_5_moe": "qwen3_5",
                "qwen3_5": "qwen3_5", "llama": "llama"}

    def __init__(self, raw):
        self.model_type = raw["model_type"]
        if self.model_type not in self.FAMILIES:
            raise ReplayError("model_type %s is not replayed" % self.model_type)
        self.family = self.FAMILIES[self.model_type]
        text = raw.get("text_config", raw) if self.family == "qwen3_5" else raw
        self.text = text
        self.vision = raw.get("vision_config") if self.family == "qwen3_5" else None
        self.hidden = text["hidden_size"]
        self.layers = text["num_hidden_layers"]
        self.heads = text["num_attention_heads"]
        self.kv_heads = text.get("num_key_value_heads", self.heads)
        self.head_dim = text.get("head_dim") or self.hidden // self.heads
        self.vocab = text["vocab_size"]
        self.inter = text.get("intermediate_size", 0)
        self.moe = self.model_type in ("qwen3_moe", "qwen3_5_moe")
        self.num_experts = text.get("num_experts", text.get("num_local_experts", 0)) if self.moe else 0
        self.moe_inter = text.get("moe_intermediate_size", 0)
        self.shared_inter = text.get("shared_expert_intermediate_size", 0) if self.moe else 0
        self.mlp_only_layers = set(text.get("mlp_only_layers") or [])
        self.sparse_step = text.get("decoder_sparse_step", 1) or 1
        # vLLM ties by hf_text_config's field alone, false when absent: for Qwen3.5 its own
        # config classes default it to false and never copy the top level's
        # (docs/hf-checkpoints.md §3 "Who ties the LM head"); flat configs: text is raw.
        self.tied = bool(text.get("tie_word_embeddings", False))
        # LlamaDecoderLayer: attention_bias = config.attention_bias or config.bias sets
        # the qkv_proj AND o_proj biases, config.qkv_bias (if present) overrides the qkv
        # one; mlp_bias the gate_up_proj and down_proj biases (docs/vllm.md §10 "Biases").
        self.attention_bias = bool(raw.get("attention_bias", False) or raw.get("bias", False))
        self.qkv_bias = bool(raw.get("qkv_bias", self.attention_bias))
        self.mlp_bias = bool(raw.get("mlp_bias", False))
        # Qwen3 / Qwen3-MoE: qkv_proj has a bias by `getattr(config, "attention_bias",
        # False)`, o_proj none (bias=False) in every release; Qwen3NextAttention (Qwen3.5)
        # by `qkv_bias` (docs/vllm.md §8 "Biases", §9.2).
        self.qwen_qkv_bias = bool(text.get("attention_bias" if self.family == "qwen3"
                                           else "qkv_bias", False))
        name = text.get("dtype") or text.get("torch_dtype") or raw.get("dtype") \
            or raw.get("torch_dtype") or "bfloat16"
        self.config_dtype = TORCH_DTYPE[name]
        self.dtype = self.served(self.config_dtype, "auto")
        if self.family == "qwen3_5":
            interval = text.get("full_attention_interval", 4)
            self.layer_types = text.get("layer_types") or [
                "linear_attention" if (i + 1) % interval else "full_attention"
                for i in range(self.layers)]  # docs/vllm.md §9.1, docs/hf-checkpoints.md §3
            self.attn_output_gate = text.get("attn_output_gate", True)  # docs/vllm.md §9.2
            self.nk = text["linear_num_key_heads"]
            self.nv = text["linear_num_value_heads"]
            self.hk = text["linear_key_head_dim"]
            self.hv = text["linear_value_head_dim"]
            self.conv_k = text["linear_conv_kernel_dim"]

    @staticmethod
    def served(config_dtype, option):
        """The dtype vLLM builds the parameters in (docs/vllm.md §2 "Dtype on load"):
        --dtype @option, or for auto (its default) the config's, a float32 model
        downcast to the platform's first dtype, bfloat16 on GPUs with BF16 and on
        vLLM-Ascend (_resolve_auto_dtype)."""
        if option != "auto":
            return TORCH_DTYPE[option]
        return "BF16" if config_dtype == "F32" else config_dtype

    def served_as(self, option):
        """This config as vLLM started with --dtype @option builds it."""
        other = copy.copy(self)
        other.dtype = self.served(self.config_dtype, option)
        return other

    def is_sparse(self, i):
        """Dense MLP when the layer is in mlp_only_layers or (i+1) % decoder_sparse_step
        != 0 (docs/vllm.md §8); Qwen3.5-MoE uses the sparse block in every layer (§9.1)."""
        if not self.moe:
            return False
        if self.model_type == "qwen3_5_moe":
            return True
        return i not in self.mlp_only_layers and (i + 1) % self.sparse_step == 0


# ------------------------------------------------------------------ model trees

def _full_attention(cfg, par, gate_factor):
    """Qwen3 / Qwen3-MoE attention (gate_factor 1) or Qwen3NextAttention, shared by
    Qwen3.5, with the output gate folded into q_proj (gate_factor 2; docs/vllm.md §9.2)."""
    h, hd, dtype = cfg.hidden, cfg.head_dim, cfg.dtype
    divide(cfg.heads, par.tp, "attention heads %d over tp %d" % (cfg.heads, par.tp))
    m = Module("Attention")
    m.add_module("qkv_proj", qkv_linear(h, hd, cfg.heads * gate_factor, cfg.kv_heads, par, dtype,
                                        bias=cfg.qwen_qkv_bias))
    m.add_module("o_proj", row_linear(cfg.heads * hd, h, par, dtype))  # bias=False
    m.add_module("q_norm", norm(hd, dtype))
    m.add_module("k_norm", norm(hd, dtype))
    m.add_module("rotary_emb", rotary(hd))
    # Qwen3NextAttention passes its own heads, not the gate's (qwen3_next.py:282-286)
    m.add_module("attn", attention_scales(cfg.heads, cfg.kv_heads, par))
    return m


def _llama_attention(cfg, par):
    """LlamaAttention (docs/vllm.md §10): qkv_proj QKVParallelLinear with KV-head
    replication, o_proj Row, their biases by attention_bias / qkv_bias; no q_norm /
    k_norm; the Attention's scale buffers (§6)."""
    h, hd, dtype = cfg.hidden, cfg.head_dim, cfg.dtype
    divide(cfg.heads, par.tp, "attention heads %d over tp %d" % (cfg.heads, par.tp))
    m = Module("LlamaAttention")
    m.add_module("qkv_proj", qkv_linear(h, hd, cfg.heads, cfg.kv_heads, par, dtype,
                                        bias=cfg.qkv_bias))
    m.add_module("o_proj", row_linear(cfg.heads * hd, h, par, dtype, bias=cfg.attention_bias))
    m.add_module("rotary_emb", rotary(hd))
    m.add_module("attn", attention_scales(cfg.heads, cfg.kv_heads, par))
    return m


def _gated_delta_net(cfg, par):
    """Qwen3.5's GatedDeltaNet (docs/vllm.md §9.3): in_proj_qkvz Merged[kd,kd,vd,vd],
    in_proj_ba Merged[nv,nv], conv1d [(2kd+vd)/tp, 1, K] by channel blocks, A_log [nv/tp]
    float32, dt_bias [nv/tp], norm [hv] replicated, out_proj Row(vd -> H).  The key and
    value heads must divide over tp (§9.3 "Divisibility")."""
    h, dtype, tp, t = cfg.hidden, cfg.dtype, par.tp, par.tp_rank
    divide(cfg.nk, tp, "linear_num_key_heads %d over tp %d" % (cfg.nk, tp))
    nvl = divide(cfg.nv, tp, "linear_num_value_heads %d over tp %d" % (cfg.nv, tp))
    kd, vd = cfg.nk * cfg.hk, cfg.nv * cfg.hv
    m = Module("GatedDeltaNet")
    m.add_module("in_proj_qkvz", merged_column_linear(h, [kd, kd, vd, vd], par, dtype))
    m.add_module("in_proj_ba", merged_column_linear(h, [cfg.nv, cfg.nv], par, dtype))
    sections = [kd, kd, vd]

    def conv_loader(param, loaded, shard_id=None):
        # mamba_v2_sharded_weight_loader: each section's rank-t slice, packed
        # (docs/vllm.md §9.3).
        boundary, loaded_boundary = 0, 0
        for full in sections:
            per = full // tp
            dst = param.narrow(0, boundary, per)
            piece = loaded.narrow(0, loaded_boundary + t * per, per)
            _check_shape(dst, piece, "conv1d")
            dst.copy_(piece)
            boundary += per
            loaded_boundary += full
        _mark(param)

    for s in sections:
        divide(s, tp, "conv1d channels %d over tp %d" % (s, tp))
    conv = m.add_module("conv1d", Module("ColumnParallelLinear"))
    conv.register_parameter("weight", Parameter.new(
        (sum(sections) // tp, 1, cfg.conv_k), dtype, conv_loader,
        "conv1d: rank-t channels of the q, k and v blocks, packed (docs/vllm.md §9.3)"))

    def sharded0(param, loaded, shard_id=None):
        # sharded_weight_loader(0): rows [t*n, (t+1)*n) (docs/vllm.md §9.3)
        piece = loaded.narrow(0, t * param.shape[0], param.shape[0])
        _check_shape(param, piece, "sharded_weight_loader(0)")
        param.copy_(piece)
        _mark(param)

    m.register_parameter("A_log", Parameter.new(  # fp32 (docs/vllm.md §9.3)
        (nvl,), "F32", sharded0,
        "A_log: float32, rows [t*nv/tp, (t+1)*nv/tp) (docs/vllm.md §9.3)"))
    m.register_parameter("dt_bias", Parameter.new(
        (nvl,), dtype, sharded0, "dt_bias: rows [t*nv/tp, (t+1)*nv/tp) (docs/vllm.md §9.3)"))
    m.add_module("norm", norm(cfg.hv, dtype))
    m.add_module("out_proj", row_linear(vd, h, par, dtype))
    return m


def _decoder_layer(cfg, par, i, era, platform, map_persistent, ascend_unwrapped):
    layer = Module("DecoderLayer")
    h, dtype = cfg.hidden, cfg.dtype
    layer.add_module("input_layernorm", norm(h, dtype))
    if cfg.family == "llama":
        layer.add_module("self_attn", _llama_attention(cfg, par))
    elif cfg.family == "qwen3":
        layer.add_module("self_attn", _full_attention(cfg, par, 1))
    elif cfg.layer_types[i] == "linear_attention":
        layer.add_module("linear_attn", _gated_delta_net(cfg, par))
    else:
        layer.add_module("self_attn", _full_attention(cfg, par, 2 if cfg.attn_output_gate else 1))
    if cfg.is_sparse(i):
        layer.add_module("mlp", moe_block(cfg, par, era, platform, map_persistent,
                                          ascend_unwrapped))
    else:
        layer.add_module("mlp", dense_mlp(h, cfg.inter, par, dtype, cfg.mlp_bias))
    layer.add_module("post_attention_layernorm", norm(h, dtype))
    return layer


def _text_model(cfg, par, era, platform, map_persistent, ascend_unwrapped):
    model = Module("Model")
    model.add_module("embed_tokens", vocab_parallel(cfg.vocab, cfg.hidden, par, cfg.dtype))
    layers = model.add_module("layers", Module("ModuleList"))
    for i in range(cfg.layers):
        layers.add_module(str(i), _decoder_layer(cfg, par, i, era, platform, map_persistent,
                                                 ascend_unwrapped))
    model.add_module("norm", norm(cfg.hidden, cfg.dtype))
    return model


def _vision_tower(vcfg, par, dtype, encoder_tp_mode="weights"):
    """Qwen3_VisionTransformer (docs/vllm.md §9.5): patch_embed 5-D and pos_embed
    replicated, LayerNorms full, attn.qkv a QKVParallelLinear with bias, attn.proj / fc2
    RowParallel with full biases, fc1 ColumnParallel with sliced biases, the merger
    likewise; no deepstack.  mm_encoder_tp_mode "data" builds the same classes with
    disable_tp, i.e. tp_size 1 and tp_rank 0 (§9.5): every rank holds the full tensors."""
    if encoder_tp_mode == "data":
        par = Parallel(1, 0)
    elif encoder_tp_mode != "weights":
        raise ValueError("mm_encoder_tp_mode %r" % encoder_tp_mode)
    d, heads, inter = vcfg["hidden_size"], vcfg["num_heads"], vcfg["intermediate_size"]
    merge, out = vcfg["spatial_merge_size"], vcfg["out_hidden_size"]
    big = d * merge * merge
    divide(heads, par.tp, "vision heads %d over tp %d" % (heads, par.tp))
    v = Module("VisionTransformer")
    pe = v.add_module("patch_embed", Module("PatchEmbed"))
    proj = pe.add_module("proj", Module("Conv3dLayer"))
    rule = "vision patch_embed / pos_embed: 5-D / full, replicated (docs/vllm.md §9.5)"
    proj.register_parameter("weight", Parameter.new(
        (d, vcfg.get("in_channels", 3), vcfg["temporal_patch_size"], vcfg["patch_size"],
         vcfg["patch_size"]), dtype, default_weight_loader, rule))
    proj.register_parameter("bias", Parameter.new((d,), dtype, default_weight_loader, rule))
    pos = v.add_module("pos_embed", Module("Embedding"))
    pos.register_parameter("weight", Parameter.new(
        (vcfg["num_position_embeddings"], d), dtype, default_weight_loader, rule))
    # a computed buffer only (docs/vllm.md §9.5)
    v.add_module("rotary_pos_emb", rotary(d // heads // 2))
    blocks = v.add_module("blocks", Module("ModuleList"))
    for b in range(vcfg["depth"]):
        blk = blocks.add_module(str(b), Module("VisionBlock"))
        blk.add_module("norm1", layer_norm(d, dtype))
        blk.add_module("norm2", layer_norm(d, dtype))
        attn = blk.add_module("attn", Module("VisionAttention"))
        attn.add_module("qkv", qkv_linear(d, d // heads, heads, heads, par, dtype, bias=True))
        attn.add_module("proj", row_linear(d, d, par, dtype, bias=True))
        mlp = blk.add_module("mlp", Module("VisionMLP"))
        mlp.add_module("linear_fc1", column_linear(d, inter, par, dtype, bias=True))
        mlp.add_module("linear_fc2", row_linear(inter, d, par, dtype, bias=True))
    merger = v.add_module("merger", Module("PatchMerger"))
    merger.add_module("norm", layer_norm(d, dtype))
    merger.add_module("linear_fc1", column_linear(big, big, par, dtype, bias=True))
    merger.add_module("linear_fc2", row_linear(big, out, par, dtype, bias=True))
    return v


def build_model(cfg, par, era, platform="cuda", map_persistent=True, ascend_unwrapped=False,
                encoder_tp_mode="weights", language_model_only=False):
    """The module tree one vLLM worker builds for @cfg (a ModelConfig).
    era: "A", "B", "C" or "D" (docs/vllm.md §5); platform: "cuda" or "ascend";
    map_persistent: whether the release registers _expert_map persistent (§5, §6);
    ascend_unwrapped: on "ascend" in era D, whether the vLLM-Ascend release sets the
    runner's _shared_experts to the shared expert MLP (docs/vllm-ascend.md §2).
    encoder_tp_mode: vLLM's mm_encoder_tp_mode, "weights" (its default) or "data";
    language_model_only: the tower is a StageMissingLayer, which holds nothing and whose
    checkpoint tensors are ignored (§9.5).
    Raises VllmRefuses where vLLM's divide() would assert.  MTP is not in the model
    (docs/vllm.md §9.1: mtp.* skipped); the vision tower is, by default (§9.5)."""
    root = Module("ForCausalLM")
    if cfg.family in ("qwen3", "llama"):
        model = root.add_module("model", _text_model(cfg, par, era, platform, map_persistent,
                                                     ascend_unwrapped))
        head = root.add_module("lm_head", Module("ParallelLMHead"))
        if cfg.tied:
            # `lm_head.tie_weights(embed_tokens)`: `layer.weight = embed_tokens.weight`
            # (docs/vllm.md §3; Llama §10)
            head.register_parameter("weight", model.get_submodule("embed_tokens")._parameters["weight"])
        else:
            head.register_parameter("weight", vocab_parallel(cfg.vocab, cfg.hidden, par, cfg.dtype)
                                    ._parameters["weight"])
    else:
        # Qwen3_5(Moe)ForConditionalGeneration: visual.*, language_model.model.*,
        # language_model.lm_head.* (docs/vllm.md §9.1)
        if cfg.vision is not None and language_model_only:
            root.add_module("visual", Module("StageMissingLayer"))
        elif cfg.vision is not None:
            root.add_module("visual", _vision_tower(cfg.vision, par, cfg.dtype,
                                                    encoder_tp_mode))
        lm = root.add_module("language_model", Module("ForCausalLM"))
        model = lm.add_module("model", _text_model(cfg, par, era, platform, map_persistent,
                                                   ascend_unwrapped))
        if cfg.tied:
            # the same module (docs/vllm.md §9.1)
            lm.add_module("lm_head", model.get_submodule("embed_tokens"))
        else:
            lm.add_module("lm_head", vocab_parallel(cfg.vocab, cfg.hidden, par, cfg.dtype))
    root.py_cfg, root.py_par = cfg, par
    root.py_no_visual = language_model_only
    root.py_routed = [m for _, m in root.named_modules() if hasattr(m, "py_load")]
    return root


# ------------------------------------------------------------------ loading a checkpoint

# The packed mapping of qwen3_moe.py, qwen2.py, qwen3_5.py (docs/vllm.md §8 "Stacked
# mapping") and Qwen3.5's GatedDeltaNet projections (§9.3, the mapper and
# packed_modules_mapping).
STACKED = [(".qkv_proj.", ".q_proj.", "q"), (".qkv_proj.", ".k_proj.", "k"),
           (".qkv_proj.", ".v_proj.", "v"),
           (".gate_up_proj.", ".gate_proj.", 0), (".gate_up_proj.", ".up_proj.", 1),
           (".in_proj_qkvz.", ".in_proj_qkv.", (0, 1, 2)), (".in_proj_qkvz.", ".in_proj_z.", 3),
           (".in_proj_ba.", ".in_proj_b.", 0), (".in_proj_ba.", ".in_proj_a.", 1)]

# Qwen3.5's hf_to_vllm_mapper (docs/vllm.md §9.1).
QWEN3_5_PREFIXES = [("model.visual.", "visual."), ("lm_head.", "language_model.lm_head."),
                    ("model.language_model.", "language_model.model.")]

_PER_EXPERT = re.compile(r"^(.*\.mlp)\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")
_FUSED_EXPERTS = re.compile(r"^(.*\.mlp)\.experts\.(gate_up_proj|down_proj)$")


# AutoWeightsLoader.ROTARY_EMBEDS_UNUSED_WEIGHTS, skipped by every model class here
# (docs/vllm.md §8 "Skipped checkpoint names", §9.1, §10).
ROTARY_UNUSED = ("rotary_pos_emb.inv_freq", "rotary_emb.inv_freq", "rotary_emb.cos_cached",
                 "rotary_emb.sin_cached")


def _runtime_name(cfg, name):
    """The vLLM name of a checkpoint tensor, or None for what vLLM skips."""
    if any(unused in name for unused in ROTARY_UNUSED):
        return None
    if cfg.family == "qwen3_5":
        # AutoWeightsLoader(skip_prefixes=["mtp."]) (docs/vllm.md §9.1)
        if name.startswith("mtp."):
            return None
        for old, new in QWEN3_5_PREFIXES:
            if name.startswith(old):
                name = new + name[len(old):]
                break
        else:
            raise ReplayError("%s: no prefix of Qwen3.5's hf_to_vllm_mapper matches" % name)
        if cfg.tied and name.startswith("language_model.lm_head."):
            return None  # tied: the head is the embedding module (docs/vllm.md §9.1)
    elif cfg.tied and name == "lm_head.weight":
        return None  # tied: the head is the embedding parameter (docs/vllm.md §3)
    return name


def load_checkpoint(model, checkpoint):
    """Runs vLLM's weight loaders over @checkpoint ({name: Tensor}, the Hugging Face
    tensors) into @model, then checks that every parameter and every local expert
    slot was written.  Raises ReplayError otherwise."""
    cfg = model.py_cfg
    for hf_name, tensor in checkpoint.items():
        name = _runtime_name(cfg, hf_name)
        if name is None:
            continue
        if model.py_no_visual and name.startswith("visual."):
            continue  # a StageMissingLayer ignores what is loaded into it (docs/vllm.md §9.5)
        if name.endswith(".bias") and not _holds(model, name):
            continue  # AutoWeightsLoader ignores an unexpected .bias (docs/vllm.md §8 "Biases")
        try:
            _load_one(model, name, tensor)
        except (AttributeError, RuntimeError) as e:
            raise ReplayError("%s: %s" % (hf_name, e))
    for pname, p in model.named_parameters():
        if p.loaded == 0:
            raise ReplayError("%s: nothing in the checkpoint loads it" % pname)
    for experts in model.py_routed:
        want = {(j, s) for j in range(experts.py_local) for s in ("w1", "w2", "w3")}
        if experts.py_filled != want:
            raise ReplayError("experts: slots %s never loaded" % sorted(want - experts.py_filled)[:4])


def _holds(model, name):
    """Whether @model has the parameter the checkpoint tensor @name loads into (after the
    stacked mapping: q_proj.bias into qkv_proj.bias)."""
    for param_part, weight_part, _ in STACKED:
        if weight_part in name:
            name = name.replace(weight_part, param_part)
            break
    try:
        model.get_parameter(name)
    except AttributeError:
        return False
    return True


def _load_one(model, name, tensor):
    m = _PER_EXPERT.match(name)
    if m:  # experts.{e}.{gate,up,down}_proj -> w13 (w1, w3) / w2 (docs/vllm.md §4)
        block = model.get_submodule(m.group(1))
        shard = {"gate": "w1", "up": "w3", "down": "w2"}[m.group(3)]
        block.py_routed.py_load(tensor, shard, int(m.group(2)))
        return
    m = _FUSED_EXPERTS.match(name)
    if m:  # fused [E, 2I, H]: chunk(2, dim=-2) -> w1, w3; [E, H, I] -> w2 (docs/vllm.md §4)
        block = model.get_submodule(m.group(1))
        for e in range(tensor.shape[0]):
            one = tensor.select(0, e)
            if m.group(2) == "gate_up_proj":
                gate, up = one.chunk(2, 0)
                block.py_routed.py_load(gate, "w1", e)
                block.py_routed.py_load(up, "w3", e)
            else:
                block.py_routed.py_load(one, "w2", e)
        return
    for param_part, weight_part, shard in STACKED:
        if weight_part in name:
            param = model.get_parameter(name.replace(weight_part, param_part))
            param.weight_loader(param, tensor, shard)
            return
    param = model.get_parameter(name)
    param.weight_loader(param, tensor)


def swap_w13_to_w31(x):
    """vLLM's swap_w13_to_w31 (docs/vllm.md §4): x.reshape(-1, 2, x.shape[-2] // 2,
    x.shape[-1]).flip(dims=[1]).reshape(x.shape), i.e. the two halves of dim -2 of each
    [2*Ip, H] matrix exchanged; a new contiguous tensor."""
    out = Tensor.empty(x.shape, x.dtype)
    half = x.shape[1] // 2
    for j in range(x.shape[0]):
        src, dst = x.select(0, j), out.select(0, j)
        dst.narrow(0, 0, half).copy_(src.narrow(0, half, half))
        dst.narrow(0, half, half).copy_(src.narrow(0, 0, half))
    return out


def process_for_kernel(model, platform, moe_backend="triton"):
    """process_weights_after_loading as far as it changes what a live update in kernel
    format must hold (docs/vllm.md §7): on CUDA the unquantized MoE backend's
    convert_to_unquantized_kernel_format (§4): Triton nothing; FlashInfer CUTLASS
    w13 = swap_w13_to_w31(w13) (the models here are all gated, is_act_and_mul), put back
    under the same name by replace_parameter; on vLLM-Ascend (an out-of-tree platform,
    which never reads --moe-backend, §4) the experts are transposed and
    replace_parameter'ed, w13 [E_loc, H, 2I/tp] and w2 [E_loc, I/tp, H], contiguous, ND
    (docs/vllm-ascend.md §3, §4)."""
    if platform != "ascend":
        if moe_backend == "flashinfer-cutlass":
            for experts in model.py_routed:
                experts._parameters["w13_weight"] = Parameter(
                    swap_w13_to_w31(experts._parameters["w13_weight"]),
                    rule="FlashInfer CUTLASS kernel layout: w13_weight halves swapped to "
                         "[w3; w1] (docs/vllm.md §4)")
        elif moe_backend != "triton":
            raise ReplayError("no replay of the %s MoE backend's layout" % moe_backend)
        return
    for experts in model.py_routed:
        for name in ("w13_weight", "w2_weight"):
            old = experts._parameters[name]
            experts._parameters[name] = Parameter(
                old.transpose(1, 2).contiguous(),
                rule="vLLM-Ascend kernel layout: %s transposed to [E_loc, %s] "
                     "(docs/vllm-ascend.md §3)"
                % (name, "H, 2I/tp" if name == "w13_weight" else "I/tp, H"))


def ascend_wake_up(model, hidden):
    """NPUWorker.wake_up of vLLM-Ascend's releases for vLLM 0.17 to 0.26.x, once the
    allocator restored the weights (tags None or "weights"; from v0.19.1rc1 only
    without a quant_config, as for BF16): in named_parameters() order, a w2_weight whose
    dim 2 is the hidden size, or else a w13_weight whose dim 1 is, is replaced on its
    module (setattr) by a new Parameter that is param.transpose(1, 2), a view of the same
    storage in the loader shape (docs/vllm-ascend.md §5 "Sleep / wake-up").  From
    vllm-ascend #13012 (its lane for 0.27.1) wake_up only restores buffers."""
    for name, param in list(model.named_parameters()):
        if ("w2_weight" in name and param.shape[2] == hidden) or \
                ("w13_weight" in name and param.shape[1] == hidden):
            module_path, _, pname = name.rpartition(".")
            model.get_submodule(module_path)._parameters[pname] = Parameter(
                param.transpose(1, 2),
                rule="vLLM-Ascend wake_up: %s transposed back to the loader shape, a view "
                     "(docs/vllm-ascend.md §5)" % pname)


def ascend_restore_processed(model):
    """Puts back the processed expert parameters after ascend_wake_up, as a consumer of
    kernel-format files on those releases must before copying: each routed-experts
    w13_weight / w2_weight that is a transposed view of contiguous storage becomes
    Parameter(view.transpose(1, 2)), the processed tensor over the same storage
    (ms-swift #9800 reinstalls the Parameters it saved before wake_up, to the same end;
    docs/vllm-ascend.md §5)."""
    for experts in model.py_routed:
        for name in ("w13_weight", "w2_weight"):
            param = experts._parameters[name]
            back = param.transpose(1, 2)
            if not param.is_contiguous() and back.is_contiguous():
                experts._parameters[name] = Parameter(
                    back, rule="vLLM-Ascend kernel layout, restored after wake_up "
                               "(docs/vllm-ascend.md §3, §5)")


# ------------------------------------------------------------------ the two consumers

class ShardedStateLoad:
    """vLLM's ShardedStateLoader.load_weights, exactly as docs/vllm.md §6 describes it
    ("The load loop, exactly"): files globbed as model-rank-{rank}-part-*.safetensors and
    read in glob order, keys in file order; state_dict[key] raises a bare KeyError for a
    key the filtered state_dict lacks; each dim where the file is smaller narrows the
    parameter to [0:size); a shape mismatch only logs a warning; copy_ raises where the
    file is larger and casts the dtype silently; the key is popped; keys left raise
    ValueError.

    After run(): `warnings` holds what vLLM would log, `silent` what it would accept
    silently but wrongly (a shape or dtype other than the parameter's), each as
    (file, key, message); `current` the (file, key) being loaded when it raised."""

    PATTERN = "model-rank-{rank}-part-{part}.safetensors"

    def __init__(self, model):
        self.model = model
        self.warnings, self.silent, self.current = [], [], (None, None)
        self.source = {}  # key -> file it came from

    def run(self, directory, rank, state_dict):
        pattern = os.path.join(directory, self.PATTERN.format(rank=rank, part="*"))
        filepaths = glob.glob(pattern)
        if not filepaths:
            raise ValueError("Could not find checkpoint files '%s', only pre-sharded "
                             "checkpoints are currently supported!" % pattern)
        for path in filepaths:
            self.current = (os.path.basename(path), None)
            for key, tensor in read_safetensors(path):
                self.current = (os.path.basename(path), key)
                param_data = state_dict[key]
                param_shape = param_data.shape
                for dim, size in enumerate(tensor.shape):
                    if size < param_shape[dim]:
                        param_data = param_data.narrow(dim, 0, size)
                if tensor.shape != param_shape:
                    msg = ("loading tensor of shape %s into parameter '%s' of shape %s"
                           % (list(tensor.shape), key, list(param_shape)))
                    self.warnings.append((self.current[0], key, msg))
                    self.silent.append((self.current[0], key, "shape %s, the parameter is %s "
                                        "(vLLM only warns, then loads into a prefix or "
                                        "broadcasts)" % (list(tensor.shape), list(param_shape))))
                if tensor.dtype != param_data.dtype:
                    self.silent.append((self.current[0], key, "dtype %s, the parameter is %s "
                                        "(copy_ would cast silently)"
                                        % (tensor.dtype, param_data.dtype)))
                param_data.copy_(tensor)
                self.source[key] = self.current[0]
                state_dict.pop(key)
        self.current = (None, None)
        if state_dict:
            raise ValueError("Missing keys %s in loaded state!" % (tuple(state_dict),))


def kernel_update(model, directory, rank, sources=None):
    """The live weight update in kernel format (docs/vllm.md §7): for each (name, tensor)
    of kernel-rank-{rank}-part-*.safetensors, `param = model.get_parameter(name);
    param.copy_(weight)`.  Returns the problems as (file, name, message): a name
    get_parameter refuses (a buffer, an unknown name), a second name of a parameter
    already sent (it would be copied twice), a shape or dtype other than the
    parameter's (copy_ would broadcast or cast silently), a parameter never sent."""
    problems = []
    pattern = os.path.join(directory, "kernel-rank-%d-part-*.safetensors" % rank)
    filepaths = glob.glob(pattern)
    if not filepaths:
        return [(os.path.basename(pattern), None, "no file for worker %d" % rank)]
    sent = {}
    for path in filepaths:
        fname = os.path.basename(path)
        for name, weight in read_safetensors(path):
            try:
                param = model.get_parameter(name)
            except AttributeError as e:
                problems.append((fname, name, "get_parameter raises AttributeError: %s" % e))
                continue
            if id(param) in sent:
                problems.append((fname, name, "the same parameter as %s, sent twice"
                                 % sent[id(param)]))
                continue
            sent[id(param)] = name
            if sources is not None:
                sources[id(param)] = fname
            mismatch = weight.shape != param.shape or weight.dtype != param.dtype
            what = "%s %s, the parameter is %s %s" % (weight.dtype, list(weight.shape),
                                                      param.dtype, list(param.shape))
            try:
                param.copy_(weight)
            except RuntimeError as e:
                problems.append((fname, name, "%s: copy_ raises RuntimeError: %s" % (what, e)))
                continue
            if mismatch:
                problems.append((fname, name, what + " (copy_ would broadcast or cast silently)"))
    for name, param in model.named_parameters():
        if id(param) not in sent:
            problems.append(("kernel-rank-%d-*" % rank, name, "parameter never sent"))
    return problems


def first_difference(got, want, shape, dtype):
    """(multi-index, got raw, want raw) of the first element where two byte strings of
    one tensor differ, or None."""
    if got == want:
        return None
    size = DTYPE_SIZE[dtype]
    limit = min(len(got), len(want))
    i = next((k for k in range(limit) if got[k] != want[k]), limit) // size
    index, rest = [], i
    for n in reversed(shape):
        index.append(rest % n if n else 0)
        rest = rest // n if n else 0
    g = got[i * size:(i + 1) * size]
    w = want[i * size:(i + 1) * size]
    return list(reversed(index)), int.from_bytes(g, "little"), int.from_bytes(w, "little")
