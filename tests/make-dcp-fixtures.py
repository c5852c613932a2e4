#!/usr/bin/env python3
"""Writes PyTorch distributed-checkpoint (DCP) fixtures for tests/test-dcp.c.

Usage: make-dcp-fixtures.py OUTDIR          (every fixture below, into OUTDIR)
       make-dcp-fixtures.py --seeds OUTDIR  (the fuzz seed corpus, tests/data/dcp-fuzz-seeds)
       make-dcp-fixtures.py --shard-ep FILE... OUTDIR
                                            (as --shard, format A only, experts whole on
                                             their expert-parallel rank, a contiguous
                                             range of experts per rank, each FILE's
                                             tensors in its own output part, as the
                                             checkpoint's files split them: the benchmark)
       make-dcp-fixtures.py --shard FILE OUTDIR
                                            (FILE, a safetensors file, as FSDP2 over 4
                                             ranks would save it: OUTDIR/a in format A,
                                             OUTDIR/b in format B)

Python 3 standard library only; no torch.  The files follow docs/dcp.md:

* format A (Hugging Face mode): shard-S-model-I-of-N.safetensors, each a plain
  safetensors file whose __metadata__ holds DCP_SHARDING_INFO (a JSON string, written
  with json.dumps' default separators) plus DCP_VERSION and format (some files leave
  them out, as the NeMo backport does), keyed by fqn, or fqn.__dcp_shard_k with a
  logical_fqn when one file holds two chunks of a tensor (docs/dcp.md §2);
* format B (the default): .metadata, a pickle (protocol 2, 4 or 5) of
  torch.distributed.checkpoint.metadata.Metadata as docs/dcp.md §3 describes it (the
  layout as torch.serialization._get_layout('torch.strided'), the memory format
  pickled by value or by name, as Pythons 3.11.7 and 3.11.2 do, storage_data keyed by
  MetadataIndex objects whose state is {fqn, index, offset} with index the chunk's
  position in its tensor's chunks, or {fqn, index: None} for the non-tensor value), and
  __R_K.distcp files holding one torch.save zip archive per chunk (docs/dcp.md §3):
  archive/data.pkl (protocol 2, _rebuild_tensor_v2 with a persistent id, or
  _rebuild_tensor_v3 with an UntypedStorage for float8 and uint16), archive/data/0
  stored and 64-byte aligned by padding the local header's extra field, as torch's
  writer does; rank 0's non-tensor value (BYTE_IO) is a torch.save archive too, with no
  data/K record;
* the unsharded source of each model as a plain safetensors file, to compare bit for bit.

Every byte written depends only on the arguments, never on the Python that runs this
(any Python 3 from 3.6; 3.6 to 3.13 checked): the pickles and the zip archives are written opcode by opcode and field
by field below, not with the pickle and zipfile modules, whose output differs between
Python releases.  tests/test-dcp.c checks that --seeds reproduces the committed seeds.

The weights are synthetic and encoded: every element's bytes depend on the tensor and
the element's index, so a misplaced chunk shows.  Shard boxes follow docs/dcp.md §4
(torch.chunk semantics, FSDP2 Shard(0) with an empty last shard, FSDP2 x EP with
_StridedShard + Shard on a 2 x 2 mesh, FSDP2 x EP with Shard(1) + Shard(0) when
efsdp * ep > E, Shard(1), Replicate, dim 0 smaller than the world).
"""
import collections
import json
import os
import re
import shutil
import struct
import sys
import zlib

# ---------------------------------------------------------------- dtypes

# safetensors name -> (bytes per element, torch dtype name, legacy storage class or None
# when torch saves the dtype as an UntypedStorage with _rebuild_tensor_v3)
DTYPES = {
    "BOOL": (1, "bool", "BoolStorage"),
    "U8": (1, "uint8", "ByteStorage"),
    "I8": (1, "int8", "CharStorage"),
    "F8_E4M3": (1, "float8_e4m3fn", None),
    "I16": (2, "int16", "ShortStorage"),
    "U16": (2, "uint16", None),
    "F16": (2, "float16", "HalfStorage"),
    "BF16": (2, "bfloat16", "BFloat16Storage"),
    "I32": (4, "int32", "IntStorage"),
    "F32": (4, "float32", "FloatStorage"),
    "F64": (8, "float64", "DoubleStorage"),
    "I64": (8, "int64", "LongStorage"),
}
# The safetensors writer sorts data by dtype (this order, descending), then by name.
DTYPE_ORDER = ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3",
               "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32",
               "U32", "F32", "C64", "F64", "I64", "U64"]


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def encode(tensor_id, dtype, shape):
    """The global tensor's bytes, row-major: element e is a function of (tensor, e)."""
    es = DTYPES[dtype][0]
    out = bytearray()
    for e in range(numel(shape)):
        if dtype == "BOOL":
            out.append(1 if (e * 7 + tensor_id) % 3 == 0 else 0)
        else:
            v = (tensor_id * 1000003 + e * 2654435761 + 0x5A5A) % (1 << (8 * es))
            out += v.to_bytes(es, "little")
    return bytes(out)


def strides_of(shape):
    st, acc = [], 1
    for d in reversed(shape):
        st.append(acc)
        acc *= d
    return list(reversed(st))


def cut(data, shape, es, off, ext):
    """The bytes of box (off, ext) of a row-major tensor, row-major."""
    out = bytearray()
    gst = strides_of(shape)
    n = numel(ext)
    if n == 0:
        return b""
    if list(off[1:]) == [0] * (len(shape) - 1) and list(ext[1:]) == list(shape[1:]):
        # whole rows: one slice (the benchmark's gigabytes go this way)
        start = (off[0] * gst[0] if shape else 0) * es
        return data[start:start + n * es]
    idx = [0] * len(ext)
    for _ in range(n):
        e = sum((off[d] + idx[d]) * gst[d] for d in range(len(ext)))
        out += data[e * es:(e + 1) * es]
        for d in reversed(range(len(ext))):
            idx[d] += 1
            if idx[d] < ext[d]:
                break
            idx[d] = 0
    return bytes(out)


# ---------------------------------------------------------------- shard boxes (docs/dcp.md §4)

def chunk(length, n, r):
    """torch.chunk semantics of Shard.local_shard_size_and_offset (docs/dcp.md §4)."""
    if length % n == 0:
        return length // n, r * (length // n)
    c = (length + n - 1) // n
    start = c * r
    if start >= length:
        return 0, length
    return min(length, start + c) - start, start


def shard(shape, world, dim=0, ranks=None):
    """Shard(dim) over `world` ranks: [(rank, offsets, sizes)]."""
    out = []
    for r in range(world):
        s, o = chunk(shape[dim], world, r)
        off = [0] * len(shape)
        ext = list(shape)
        off[dim], ext[dim] = o, s
        out.append(((ranks or list(range(world)))[r], off, ext))
    return out


def strided_ep(shape, efsdp, ep):
    """(_StridedShard(0, sf=ep), Shard(0)) on the mesh (efsdp, ep) (docs/dcp.md §4)."""
    out = []
    E = shape[0]
    for i in range(efsdp):
        for j in range(ep):
            s_ep, o_ep = chunk(E, ep, j)
            s, o = chunk(s_ep, efsdp, i)
            off = [0] * len(shape)
            ext = list(shape)
            off[0], ext[0] = (E if s == 0 else o_ep + o), s
            out.append((i * ep + j, off, ext))
    return out


def shard1_ep(shape, efsdp, ep):
    """(Shard(1), Shard(0)) on the mesh (efsdp, ep): torchtitan's FSDP placement of the
    experts when efsdp * ep > E (docs/dcp.md §4), the experts Shard(0) on ep and FSDP
    on the next axis.  The two placements shard different axes, so each rank's box is
    its ep chunk of axis 0 by its efsdp chunk of axis 1."""
    out = []
    for i in range(efsdp):
        for j in range(ep):
            s_ep, o_ep = chunk(shape[0], ep, j)
            s, o = chunk(shape[1], efsdp, i)
            out.append((i * ep + j, [o_ep, o] + [0] * (len(shape) - 2),
                        [s_ep, s] + list(shape[2:])))
    return out


def dedup(boxes):
    """DCP keeps one write item per (fqn, offsets), in one rank's plan (docs/dcp.md §4:
    the least-loaded plan, or the lowest rank with save_to_lowest_rank); here the lowest
    rank."""
    seen, out = set(), []
    for r, off, ext in sorted(boxes, key=lambda b: b[0]):
        if tuple(off) in seen:
            continue
        seen.add(tuple(off))
        out.append((r, off, ext))
    return out


# ---------------------------------------------------------------- models

class T:
    """A tensor of a model and where its chunks are, per format."""

    def __init__(self, tid, name, dtype, shape, boxes_a, boxes_b=None, part=1):
        self.name, self.dtype, self.shape = name, dtype, list(shape)
        self.data = encode(tid, dtype, shape)
        self.boxes_a = boxes_a
        self.boxes_b = boxes_b if boxes_b is not None else boxes_a
        self.part = part


def good_model():
    W = 4
    rep = [(0, [0], [6]), (2, [0], [6])]                        # not deduplicated
    hsdp = [(r, [2 * (r % 2), 0], [2, 6]) for r in range(4)]    # (Replicate, Shard(0)), 2 x 2
    ts = [
        T(1, "model.embed_tokens.weight", "BF16", [10, 4], shard([10, 4], W)),  # 3,3,3,1
        T(2, "model.layers.0.self_attn.q_proj.weight", "BF16", [9, 8], shard([9, 8], W)),  # 3,3,3,0
        T(3, "model.layers.0.self_attn.o_proj.weight", "BF16", [4, 10], shard([4, 10], W, dim=1)),
        T(4, "model.layers.0.mlp.experts.w1", "F32", [8, 3, 4], strided_ep([8, 3, 4], 2, 2), part=2),
        T(5, "model.layers.0.mlp.experts.w2", "F32", [6, 4, 3], strided_ep([6, 4, 3], 2, 2), part=2),
        T(6, "model.norm.weight", "BF16", [4], dedup([(r, [0], [4]) for r in range(W)])),
        # Replicated and not deduplicated: whole copies in format A; in format B (whose
        # storage is keyed by offsets) two overlapping chunks that agree.
        T(7, "model.layers.0.input_layernorm.weight", "F16", [6], rep,
          [(0, [0], [4]), (2, [2], [4])]),
        T(8, "model.layers.0.mlp.gate.weight", "F32", [4, 6], hsdp),
        T(9, "lm_head.weight", "BF16", [6, 4], shard([6, 4], 2), part=2),
        T(10, "model.scale", "F32", [], [(1, [], [])]),
        T(11, "model.position_ids", "I64", [3, 5], dedup(shard([3, 5], W))),  # 1,1,1,0
        T(12, "model.tiny.weight", "BF16", [2, 16], dedup(shard([2, 16], W))),  # 1,1,0 (one empty kept)
        T(13, "model.mask", "BOOL", [7], shard([7], W)),
        T(14, "model.counts", "I32", [5, 2], dedup(shard([5, 2], W))),
        T(15, "model.bytes", "U8", [8], shard([8], W)),
        T(16, "model.i8", "I8", [5], dedup(shard([5], W))),
        T(17, "model.i16", "I16", [4, 3], dedup(shard([4, 3], W, dim=1))),
        T(18, "model.f64", "F64", [3, 2], [(3, [0, 0], [3, 2])]),
        T(19, "model.fp8.weight", "F8_E4M3", [4, 4], shard([4, 4], W), part=2),
        T(20, "model.u16", "U16", [6], shard([6], 2), part=2),
        # Two chunks of one tensor in one rank's file (keys fqn.__dcp_shard_k).
        T(21, "model.layers.0.mlp.down.weight", "BF16", [8, 4],
          [(0, [0, 0], [4, 4]), (0, [4, 0], [4, 4])], part=2),
        # FSDP2 x EP with 2 experts on a 2 x 2 mesh (efsdp * ep = 4 > 2): rank (i, j) =
        # 2i + j holds expert j, rows [3i, 3i + 3) of axis 1.
        T(22, "model.layers.1.mlp.experts.w1", "F32", [2, 6, 4], shard1_ep([2, 6, 4], 2, 2),
          part=2),
    ]
    return ts


def rank_model(collective):
    """FSDP2 Shard(0) over 2 ranks (uneven: 3 + 2 rows; 1 + an empty shard at offset 1)
    and a plain tensor, which every rank saves (docs/dcp.md §3): saved with
    use_collectives=False no plan is deduplicated across ranks, so each rank writes its
    own copy; the collective save (.metadata) keeps one."""
    norm = [(0, [0], [4]), (1, [0], [4])]
    return [
        T(41, "model.embed_tokens.weight", "BF16", [5, 4], shard([5, 4], 2)),
        T(42, "model.layers.0.mlp.down_proj.weight", "F32", [4, 6], shard([4, 6], 2)),
        T(43, "model.norm.weight", "BF16", [4], dedup(norm) if collective else norm),
        T(44, "model.tiny", "I64", [1, 3], shard([1, 3], 2)),
    ]


def flat_model():
    """A tensor whose chunks are on ranks 0, 2 and 3 (rank 1 holds nothing: no file)."""
    return [
        T(31, "w", "F32", [6, 2], [(0, [0, 0], [2, 2]), (2, [2, 0], [2, 2]), (3, [4, 0], [2, 2])]),
        T(32, "b", "I64", [3], [(2, [0], [3])]),
    ]


def optimizer_state(model, keys, flatten=False):
    """Adam's state for each tensor of model, as get_optimizer_state_dict returns it
    under keys (docs/dcp.md §3, "Names"): {"state": {fqn: {"exp_avg", "exp_avg_sq" (F32,
    the parameter's shape and boxes), "step" (an F32 scalar, rank 0)}}, "param_groups":
    [{"lr", "params"}]}: tensors with their object paths, and the paths of the two
    non-tensor values (traverse_state_dict numbers a list's items).  flatten: the keys
    flatten_optimizer_state_dict=True writes, "state.FQN.exp_avg" one key each."""
    tensors, tid = [], 60
    for t in model:
        for what in ("exp_avg", "exp_avg_sq", "step"):
            tid += 1
            shape, boxes = (t.shape, t.boxes_b) if what != "step" else ([], [(0, [], [])])
            rest = ("state.%s.%s" % (t.name, what),) if flatten else ("state", t.name, what)
            u = T(tid, ".".join(keys + rest), "F32", shape, boxes)
            u.path = keys + rest
            tensors.append(u)
    groups = ("param_groups.lr",) if flatten else ("param_groups", 0, "lr")
    params = ("param_groups.params",) if flatten else ("param_groups", 0, "params")
    return tensors, [keys + groups, keys + params]


# ---------------------------------------------------------------- safetensors

def safetensors_bytes(tensors, metadata=None):
    """tensors: [(name, dtype, shape, data)] -> the file, as the reference writer lays it
    out (data sorted by dtype descending, then name; header padded with spaces)."""
    order = sorted(tensors, key=lambda t: (-DTYPE_ORDER.index(t[1]), t[0]))
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    off = 0
    for name, dtype, shape, data in order:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(t[3] for t in order)


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def write_source(path, model):
    write(path, safetensors_bytes([(t.name, t.dtype, t.shape, t.data) for t in model]))


# ---------------------------------------------------------------- format A

# DCP_SHARDING_INFO styles, per rank: the newest writer (logical_fqn, DCP_VERSION,
# format), the NeMo torch-2.7 backport (no format), an older writer (no logical_fqn).
STYLES = ["newest", "nemo", "old", "newest"]


def write_format_a(root, model, n_parts, subdir="sharded", corrupt=None, no_info_rank=None,
                   skip=None):
    """One file per (rank, part) that holds something.  corrupt=(name, rank) flips a
    byte of that rank's chunk; no_info_rank writes that rank's files without
    DCP_SHARDING_INFO; skip=(rank, part) leaves that file out."""
    out = os.path.join(root, subdir) if subdir else root
    ranks = sorted({r for t in model for r, _, _ in t.boxes_a})
    for rank in ranks:
        style = STYLES[rank % len(STYLES)]
        for part in range(1, n_parts + 1):
            items = [(t, off, ext) for t in model if t.part == part
                     for r, off, ext in t.boxes_a if r == rank]
            if not items or skip == (rank, part):
                continue
            count = collections.Counter(t.name for t, _, _ in items)
            seen = collections.Counter()
            tensors, info = [], {}
            for t, off, ext in items:
                es = DTYPES[t.dtype][0]
                data = cut(t.data, t.shape, es, off, ext)
                if corrupt == (t.name, rank) and data:
                    data = bytes([data[0] ^ 0x01]) + data[1:]
                key = t.name
                if count[t.name] > 1:
                    key = "%s.__dcp_shard_%d" % (t.name, seen[t.name])
                    seen[t.name] += 1
                entry = {}
                if style != "old" or key != t.name:
                    entry["logical_fqn"] = t.name
                entry["saved_offsets"] = off
                info[key] = entry
                tensors.append((key, t.dtype, ext, data))
            meta = {}
            if rank != no_info_rank:
                meta["DCP_SHARDING_INFO"] = json.dumps(info)
            if style != "old":
                meta["DCP_VERSION"] = "1.0"
            if style == "newest":
                meta["format"] = "pt"
            name = "shard-%05d-model-%05d-of-%05d.safetensors" % (rank + 1, part, n_parts)
            write(os.path.join(out, name), safetensors_bytes(tensors, meta))


# ---------------------------------------------------------------- pickles, opcode by opcode (docs/dcp.md §3)
#
# The pickles are written here opcode by opcode rather than with the pickle module, so
# that they do not depend on the Python that runs this script: what the pickle module
# writes for an object depends on the Python (an enum member is written by name by
# Debian 12's Python 3.11.2, by value by Python 3.11.7; the pure-Python pickler is
# private).  The writer follows CPython's pickler (Lib/pickle.py) for the opcodes, the
# memo and the framing.  Two choices keep it free of object identity, which differs
# between Pythons: strs and globals are memoized by value, tuples are memoized but never
# fetched back.  Both are valid pickles of the same objects.

class Global:
    """A module-level name (a class or a function), written as GLOBAL or STACK_GLOBAL."""

    def __init__(self, module, name):
        self.module, self.name = module, name


class Reduce:
    """What an object whose __reduce__ returns (func, args) pickles as: func(*args)."""

    def __init__(self, func, args):
        self.func, self.args = func, tuple(args)


class NewObj:
    """cls.__new__(cls), then BUILD with state (when not None): how a dataclass
    instance pickles (copyreg.__newobj__ with the instance's __dict__ or __getstate__)."""

    def __init__(self, cls, state):
        self.cls, self.state = cls, state


class PersistentId:
    """A reference to something outside the pickle (torch.save's storages)."""

    def __init__(self, pid):
        self.pid = pid


# Protocol 2 spells a few modules as Python 2 did (CPython's fix_imports).
PY2_MODULES = {"builtins": "__builtin__"}
FRAME_SIZE_TARGET = 64 * 1024


class PickleWriter:
    def __init__(self, protocol):
        assert 2 <= protocol <= 5
        self.proto = protocol
        self.out = bytearray()
        self.frame = bytearray() if protocol >= 4 else None
        self.memo = {}   # key -> memo index
        self.keep = []   # keeps memoized objects alive, so that their ids stay theirs

    def dumps(self, obj):
        self.out += b"\x80" + bytes([self.proto])
        self.save(obj)
        self.write(b".")
        self.commit_frame(force=True)
        return bytes(self.out)

    def write(self, data):
        if self.frame is not None:
            self.frame += data
        else:
            self.out += data

    def commit_frame(self, force=False):
        if self.frame is None or not self.frame or (len(self.frame) < FRAME_SIZE_TARGET and not force):
            return
        if len(self.frame) >= 4:
            self.out += b"\x95" + struct.pack("<Q", len(self.frame))
        self.out += self.frame
        self.frame = bytearray()

    @staticmethod
    def memo_key(obj):
        if isinstance(obj, str):
            return ("str", obj)
        if isinstance(obj, Global):
            return ("global", obj.module, obj.name)
        return ("id", id(obj))

    def memoize(self, obj):
        key = self.memo_key(obj)
        index = len(self.memo)
        self.memo[key] = index
        self.keep.append(obj)
        if self.proto >= 4:
            self.write(b"\x94")                              # MEMOIZE
        elif index < 256:
            self.write(b"q" + bytes([index]))                # BINPUT
        else:
            self.write(b"r" + struct.pack("<I", index))      # LONG_BINPUT

    def save(self, obj):
        self.commit_frame()
        if isinstance(obj, PersistentId):
            self.save(obj.pid)
            self.write(b"Q")                                 # BINPERSID
            return
        if obj is None:
            self.write(b"N")
            return
        if obj is True or obj is False:
            self.write(b"\x88" if obj else b"\x89")
            return
        if isinstance(obj, int):
            self.save_int(obj)
            return
        if isinstance(obj, tuple):
            self.save_tuple(obj)
            return
        index = self.memo.get(self.memo_key(obj))
        if index is not None:
            self.write(b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index))
            return
        if isinstance(obj, str):
            self.save_str(obj)
        elif isinstance(obj, list):
            self.write(b"]")
            self.memoize(obj)
            self.save_items(obj, b"a", b"e")
        elif isinstance(obj, dict):
            self.write(b"}")
            self.memoize(obj)
            self.save_items(list(obj.items()), b"s", b"u")
        elif isinstance(obj, Global):
            self.save_global(obj)
        elif isinstance(obj, Reduce):
            self.save(obj.func)
            self.save(obj.args)
            self.write(b"R")
            self.memoize(obj)
        elif isinstance(obj, NewObj):
            self.save(obj.cls)
            self.save(())
            self.write(b"\x81")                              # NEWOBJ
            self.memoize(obj)
            if obj.state is not None:
                self.save(obj.state)
                self.write(b"b")                             # BUILD
        else:
            raise TypeError("cannot pickle %r" % (obj,))

    def save_int(self, n):
        if 0 <= n <= 0xff:
            self.write(b"K" + bytes([n]))
        elif 0 <= n <= 0xffff:
            self.write(b"M" + struct.pack("<H", n))
        elif -0x80000000 <= n <= 0x7fffffff:
            self.write(b"J" + struct.pack("<i", n))
        else:
            # LONG1: two's complement, little-endian, as short as the sign allows
            data = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
            if n < 0 and len(data) > 1 and data[-1] == 0xff and data[-2] & 0x80:
                data = data[:-1]
            self.write(b"\x8a" + bytes([len(data)]) + data)

    def save_str(self, s):
        data = s.encode("utf-8", "surrogatepass")
        if self.proto >= 4 and len(data) < 256:
            self.write(b"\x8c" + bytes([len(data)]) + data)  # SHORT_BINUNICODE
        elif len(data) > 0xffffffff and self.proto >= 4:
            self.write(b"\x8d" + struct.pack("<Q", len(data)) + data)
        else:
            self.write(b"X" + struct.pack("<I", len(data)) + data)
        self.memoize(s)

    def save_tuple(self, t):
        if not t:
            self.write(b")")                                 # EMPTY_TUPLE
            return
        if len(t) <= 3:
            for item in t:
                self.save(item)
            self.write(b"\x85\x86\x87"[len(t) - 1:len(t)])    # TUPLE1, TUPLE2, TUPLE3
        else:
            self.write(b"(")
            for item in t:
                self.save(item)
            self.write(b"t")
        self.memoize(t)

    def save_items(self, items, one, many):
        """APPEND/SETITEM for a batch of one, MARK ... APPENDS/SETITEMS for more, in
        batches of 1000 as CPython does."""
        for start in range(0, len(items), 1000):
            batch = items[start:start + 1000]
            if len(batch) > 1:
                self.write(b"(")
            for item in batch:
                for value in (item if one == b"s" else (item,)):
                    self.save(value)
            self.write(many if len(batch) > 1 else one)

    def save_global(self, g):
        if self.proto >= 4:
            self.save(g.module)
            self.save(g.name)
            self.write(b"\x93")                              # STACK_GLOBAL
        else:
            module = PY2_MODULES.get(g.module, g.module)
            self.write(b"c" + module.encode() + b"\n" + g.name.encode() + b"\n")
        self.memoize(g)


def dumps(obj, protocol):
    return PickleWriter(protocol).dumps(obj)


# ---------------------------------------------------------------- what torch pickles (docs/dcp.md §3)

META = "torch.distributed.checkpoint.metadata"
FS = "torch.distributed.checkpoint.filesystem"
TORCH_SIZE = Global("torch", "Size")


def torch_size(dims):
    return Reduce(TORCH_SIZE, (tuple(dims),))


def dataclass(module, name, state):
    return NewObj(Global(module, name), state)


# A torch.layout: torch registers copyreg.pickle(torch.layout, lambda obj: (_get_layout,
# (str(obj),))), so every layout is this REDUCE; dense tensors are 'torch.strided'.
def torch_layout(name):
    return Reduce(Global("torch.serialization", "_get_layout"), (name,))


STRIDED = torch_layout("torch.strided")

# TensorProperties.__getstate__ writes the memory format as a member of this Enum.
MEM_FORMAT = Global(META, "_MEM_FORMAT_ENCODING")
MEM_FORMAT_MEMBERS = {"TORCH_CONTIGUOUS_FORMAT": 0, "TORCH_CHANNELS_LAST": 1,
                      "TORCH_PRESERVE_FORMAT": 2}


def enum_member(cls, name, style):
    """An Enum member as the writing Python pickles it: by value, REDUCE(cls, (value,))
    (Python 3.11.7), or by name, REDUCE(builtins.getattr, (cls, name)) (Debian 12's
    Python 3.11.2).  Both were observed with pickletools."""
    if style == "value":
        return Reduce(cls, (MEM_FORMAT_MEMBERS[name],))
    return Reduce(Global("builtins", "getattr"), (cls, name))


CONTIGUOUS = {style: enum_member(MEM_FORMAT, "TORCH_CONTIGUOUS_FORMAT", style)
              for style in ("value", "name")}
TORCH_DTYPE = {v[1]: Global("torch", v[1]) for v in DTYPES.values()}


def tensor_properties(dtype_name, layout, mem_format):
    """TensorProperties.__getstate__: (dtype, layout, requires_grad, memory_format,
    pin_memory)."""
    return dataclass(META, "TensorProperties",
                     (TORCH_DTYPE[dtype_name], layout, False, mem_format, False))


def metadata_index(fqn, offset=None, index=None):
    """A storage_data key.  MetadataIndex.__init__ sets fqn, then index, then offset only
    when it is not None (metadata.py @ 57ba412974d8), so the pickled __dict__ is
    {fqn, index, offset} for a tensor chunk and {fqn, index} for a BYTE_IO item (offset
    left at the class default, not in the state).  create_default_global_save_plan
    rewrites a tensor chunk's index to the chunk's position in its tensor's chunks
    (dataclasses.replace, which calls __init__ again); BYTE_IO items keep index None."""
    state = {"fqn": fqn, "index": index}
    if offset is not None:
        state["offset"] = torch_size(offset)
    return dataclass(META, "MetadataIndex", state)


def storage_info(relative_path, offset, length, transform_descriptors=None):
    state = {"relative_path": relative_path, "offset": offset, "length": length}
    if transform_descriptors is not None:
        state["transform_descriptors"] = transform_descriptors
    return dataclass(FS, "_StorageInfo", state)


def posix_path(style):
    """pathlib.PosixPath of Python <= 3.12 (args: the parts) or pathlib._local.PosixPath
    of Python 3.13 (args: one string)."""
    if style == "parts":
        return Reduce(Global("pathlib", "PosixPath"), ("/", "ckpt", "step-10"))
    return Reduce(Global("pathlib._local", "PosixPath"), ("/ckpt/step-10",))


def rebuild_tensor(scls, n_storage, storage_offset, size, stride, dtype_name=None, key="0"):
    """torch.save's record of one tensor: _rebuild_tensor_v2 on a typed storage, or
    _rebuild_tensor_v3 on an UntypedStorage with the dtype (float8, uint16).  key: the
    storage's key (torch writes "0", "1", ...: the data/K record)."""
    pid = PersistentId(("storage", Global("torch", scls or "UntypedStorage"), key, "cpu",
                        n_storage))
    args = [pid, storage_offset, tuple(size), tuple(stride), False,
            Reduce(Global("collections", "OrderedDict"), ())]
    if scls is None:
        return Reduce(Global("torch._utils", "_rebuild_tensor_v3"), args + [TORCH_DTYPE[dtype_name]])
    return Reduce(Global("torch._utils", "_rebuild_tensor_v2"), args)


EVIL = Reduce(Global("os", "system"), ("true",))


# ---------------------------------------------------------------- torch.save archives (docs/dcp.md §3)

def zip_archive(entries):
    """A zip archive, laid out as Python's zipfile writes one into a seekable file (no
    data descriptors, version 2.0, date 1980-01-01, mode 0600).  entries: (name, data,
    align, deflate, zip64).  align pads the local header's extra field (id 0x4246, as
    torch's writer does) so that the data starts at a multiple of it; deflate stores the
    data as one uncompressed deflate block (method 8, whatever the zlib); zip64 adds a
    zip64 extra field to the local header."""
    out, central = bytearray(), bytearray()
    for name, data, align, deflate, zip64 in entries:
        fname = name.encode()
        payload = data
        if deflate:
            payload = b"\x01" + struct.pack("<HH", len(data), len(data) ^ 0xffff) + data
        crc = zlib.crc32(data) & 0xffffffff
        version = 45 if zip64 else 20
        extra = b""
        if align:
            start = len(out) + 30 + len(fname) + (20 if zip64 else 0) + 4
            pad = (-start) % align
            extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad
        local_extra = extra
        csize, usize = len(payload), len(data)
        if zip64:
            local_extra += struct.pack("<HHQQ", 1, 16, usize, csize)
            csize = usize = 0xffffffff
        method = 8 if deflate else 0
        offset = len(out)
        out += struct.pack("<4s2B4HL2L2H", b"PK\x03\x04", version, 0, 0, method, 0, 33, crc,
                           csize, usize, len(fname), len(local_extra)) + fname + local_extra
        out += payload
        central += struct.pack("<4s4B4HL2L5H2L", b"PK\x01\x02", version, 3, version, 0, 0,
                               method, 0, 33, crc, len(payload), len(data), len(fname),
                               len(extra), 0, 0, 0, 0o600 << 16, offset) + fname + extra
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(entries), len(entries), len(central),
                      len(out), 0)
    return bytes(out + central + end)


def torch_save_archive(pkl, storages=(), byteorder="little", name="archive"):
    """torch.save's zip archive written to a stream (DCP's "archive/" prefix; name= another
    top directory): data.pkl, .format_version, .storage_alignment and byteorder, then one
    data/K record per storage (storages: (data, align, deflate, zip64)), then the writer's
    end records."""
    return zip_archive(
        [(name + "/data.pkl", pkl, 0, False, False),
         (name + "/.format_version", b"1", 0, False, False),
         (name + "/.storage_alignment", b"64", 0, False, False),
         (name + "/byteorder", byteorder.encode(), 0, False, False)]
        + [(name + "/data/%d" % k,) + tuple(st) for k, st in enumerate(storages)]
        + [(name + "/version", b"3\n", 0, False, False),
           (name + "/.data/serialization_id", b"1234567890" * 4, 0, False, False)])


def torch_save(dt, size, stride, storage_offset, storage, deflate=False, byteorder="little",
               zip64=False, storage_dtype=None, key="0"):
    """A torch.save archive of one tensor (key: its storage's key in data.pkl)."""
    es, tname, scls = DTYPES[storage_dtype or dt]
    n_storage = len(storage) if scls is None else len(storage) // es
    pkl = dumps(rebuild_tensor(scls, n_storage, storage_offset, size, stride, tname, key), 2)
    blob = torch_save_archive(pkl, [(storage, 64, deflate, zip64)], byteorder)
    return blob, pkl


def torch_save_object(obj):
    """A torch.save archive of a value without tensors (no data/K record): what the
    default planner's resolve_data writes into the BytesIO of a BYTE_IO item."""
    return torch_save_archive(dumps(obj, 2))


# ---------------------------------------------------------------- format B

# Special chunks of the good model: (tensor, rank) -> how its archive is written.
TRANSPOSED = ("lm_head.weight", 1)       # stride (1, 3): the chunk's transpose in storage
OFFSET = ("model.embed_tokens.weight", 3)  # two junk elements before the data
ZIP64 = ("lm_head.weight", 0)            # zip64 local header


def write_format_b(root, model, protocol=4, enum_style="value", path_style="parts",
                   corrupt=None, drop=None, zstd=None, deflate=None, big=None, wrong_dtype=None,
                   oob=None, evil=False, missing=None, bad_stride=None, layout_of=None,
                   mem_format_of=None, blobs=None, metadata_name=".metadata", shape_of=None,
                   serialization="torch_save", index_hints=True, wrapper=None,
                   wrap_train_state=True, values=None, bad_key=None):
    """Writes .metadata (or metadata_name) and __R_K.distcp.  enum_style: how the memory
    format is pickled ("value" or "name", see enum_member).  Options name (tensor, rank)
    chunks to spoil; layout_of and mem_format_of map tensor names to what their
    TensorProperties hold instead, shape_of to the global size recorded; blobs, when a
    list, receives (name, archive bytes, data.pkl bytes).  serialization="safetensors"
    writes as FileSystemWriter(serialization_format=SerializationFormat.SAFETENSORS)
    does (docs/dcp.md §3): no archive per chunk, but one safetensors blob per file after
    its non-tensor items, and every tensor's _StorageInfo holds the position before that
    blob and numel * element size.  index_hints=False leaves every storage_data key's
    index None, as create_default_global_save_plan(rewrite_index_hints=False) does
    (torch_xla's SPMDSavePlanner calls it so); torch's DefaultSavePlanner rewrites them.
    wrapper saves the state dict inside a one-key dict, {wrapper: state_dict}, as
    accelerate's save_fsdp_model does with "model" (docs/dcp.md §3, "Names"): every fqn
    is flattened to "wrapper.name" and planner_data maps it to the object path
    (wrapper, name); without it the path is (name,), a state dict's key being one path
    element however many dots it holds (flatten_state_dict).  wrap_train_state=False
    keeps the non-tensor value beside the wrapper, a second top-level key.  wrapper may
    be a tuple of keys ({"model_state": {"model": sd}}: ("model_state", "model")), and a
    tensor of the model may carry its own object path (t.path, a tuple: an optimizer's
    state beside the model).  values, when given, lists the object paths of the
    non-tensor values written instead of train_state (each a torch.save of {"step": 10}).
    bad_key names a (tensor, rank) chunk whose data.pkl keys its storage "\\x10", a
    control byte, not a decimal number."""
    os.makedirs(root, exist_ok=True)
    ranks = sorted({r for t in model for r, _, _ in t.boxes_b})
    sdm, storage, planner = {}, {}, {}

    keys = (wrapper,) if isinstance(wrapper, str) else tuple(wrapper or ())

    def fqn(name):
        return ".".join(keys + (name,))

    def path(name):
        return keys + (name,)

    def fqn_of(t):
        return ".".join(map(str, t.path)) if getattr(t, "path", None) else fqn(t.name)

    def path_of(t):
        return tuple(t.path) if getattr(t, "path", None) else path(t.name)
    stored = set()  # (fqn, offsets): storage_data is keyed by MetadataIndex(fqn, offsets)
    files = collections.defaultdict(bytearray)
    pending = collections.defaultdict(list)  # serialization="safetensors": file -> tensors
    n_items = collections.Counter()
    for vpath in values or ():
        raw = torch_save_object({"step": 10})
        vname = ".".join(map(str, vpath))
        storage[metadata_index(vname)] = storage_info("__0_0.distcp", len(files["__0_0.distcp"]),
                                                      len(raw))
        files["__0_0.distcp"] += raw
        sdm[vname] = dataclass(META, "BytesStorageMetadata", None)
        planner[vname] = tuple(vpath)
    if 0 in ranks and not evil and values is None:
        # A non-tensor value first, as DCP writes BYTE_IO items before tensors: the
        # planner's torch.save of it, written raw.
        raw = torch_save_object({"step": 10})
        files["__0_0.distcp"] += raw
        ts = fqn("train_state") if wrap_train_state else "train_state"
        sdm[ts] = dataclass(META, "BytesStorageMetadata", None)
        storage[metadata_index(ts)] = storage_info("__0_0.distcp", 0, len(raw))
        planner[ts] = path("train_state") if wrap_train_state else ("train_state",)
    for t in model:
        es = DTYPES[t.dtype][0]
        chunks = []
        for rank, off, ext in t.boxes_b:
            if drop == (t.name, rank):
                continue
            real = off
            if oob == (t.name, rank):
                off = [o + 1 for o in off]  # recorded one step off; the bytes are right
            chunks.append(dataclass(META, "ChunkStorageMetadata",
                                    {"offsets": torch_size(off), "sizes": torch_size(ext)}))
            index = len(chunks) - 1 if index_hints else None  # the chunk's position
            if (t.name, tuple(off)) in stored:
                continue  # the same chunk listed twice: one archive (storage is keyed by offsets)
            stored.add((t.name, tuple(off)))
            data = cut(t.data, t.shape, es, real, ext)
            if corrupt == (t.name, rank):
                data = bytes([data[0] ^ 0x01]) + data[1:]
            stride, offset, store = strides_of(ext), 0, data
            if (t.name, rank) == TRANSPOSED:
                rows, cols = ext
                store = b"".join(data[(i * cols + j) * es:(i * cols + j + 1) * es]
                                 for j in range(cols) for i in range(rows))
                stride = [1, rows]
            if (t.name, rank) == OFFSET:
                offset, store = 2, b"\xee" * (2 * es) + data
            if bad_stride == (t.name, rank):
                stride = [2 * s for s in stride]
            if serialization == "safetensors":
                fname = "__%d_0.distcp" % rank
                storage[metadata_index(fqn_of(t), off, index)] = storage_info(
                    fname, len(files[fname]), len(data))
                pending[fname].append((fqn_of(t), t.dtype, ext, data, off))
                continue
            blob, pkl = torch_save(t.dtype, ext, stride, offset, store,
                                   deflate=deflate == (t.name, rank),
                                   byteorder="big" if big == (t.name, rank) else "little",
                                   zip64=(t.name, rank) == ZIP64,
                                   storage_dtype="F16" if wrong_dtype == (t.name, rank) else None,
                                   key="\x10" if bad_key == (t.name, rank) else "0")
            if blobs is not None:
                blobs.append(("%s-%d" % (t.name, rank), blob, pkl))
            # Rank 1 writes with two threads: two files, items alternating.
            k = (n_items[rank] % 2) if rank == 1 else 0
            n_items[rank] += 1
            fname = "__%d_%d.distcp" % (rank, k)
            transform = ["stream.zstd/1"] if zstd == (t.name, rank) else None
            storage[metadata_index(fqn_of(t), off, index)] = storage_info(
                fname, len(files[fname]), len(blob), transform)
            files[fname] += blob
        props = tensor_properties(DTYPES[t.dtype][1], (layout_of or {}).get(t.name, STRIDED),
                                  (mem_format_of or {}).get(t.name, CONTIGUOUS[enum_style]))
        sdm[fqn_of(t)] = dataclass(META, "TensorStorageMetadata",
                                {"properties": props,
                                 "size": torch_size((shape_of or {}).get(t.name, t.shape)),
                                 "chunks": chunks})
        planner[fqn_of(t)] = path_of(t)
    if evil:
        sdm["evil"] = EVIL
    storage_meta = dataclass(META, "StorageMeta", {
        "checkpoint_id": posix_path(path_style),
        "save_id": "0f2c5b6e-1111-2222-3333-444455556666", "load_id": None, "modules": []})
    md = dataclass(META, "Metadata", {
        "state_dict_metadata": sdm, "planner_data": planner, "storage_data": storage,
        "storage_meta": storage_meta, "version": "1.0.0"})
    for fname, items in sorted(pending.items()):
        info = {name: {"logical_fqn": name, "saved_offsets": off}
                for name, _, _, _, off in items}
        files[fname] += safetensors_bytes(
            [item[:4] for item in items],
            {"DCP_SHARDING_INFO": json.dumps(info), "DCP_VERSION": "1.0", "format": "pt"})
    write(os.path.join(root, metadata_name), dumps(md, protocol))
    for fname, data in files.items():
        if fname != missing:
            write(os.path.join(root, fname), bytes(data))


def write_format_b_per_rank(root, model, drop_meta=None, shape_of=None, **kw):
    """Format B as save(..., use_collectives=False) writes it (docs/dcp.md §3): no
    .metadata; each rank R plans alone and writes its own __R_K.distcp and __R.metadata,
    a Metadata of its own chunks and storage_data only (the non-tensor value on rank 0,
    the coordinator).  drop_meta leaves that rank's metadata out; shape_of maps
    (tensor, rank) to another global size recorded in that rank's metadata."""
    ranks = sorted({r for t in model for r, _, _ in t.boxes_b})
    for rank in ranks:
        mine = []
        for t in model:
            boxes = [b for b in t.boxes_b if b[0] == rank]
            if boxes:
                u = T.__new__(T)
                u.name, u.dtype, u.shape, u.data, u.part = t.name, t.dtype, t.shape, t.data, t.part
                u.boxes_a = u.boxes_b = boxes
                mine.append(u)
        shapes = {name: shape for (name, r), shape in (shape_of or {}).items() if r == rank}
        name = "__%d.metadata" % rank if rank != drop_meta else "__%d.metadata.dropped" % rank
        write_format_b(root, mine, metadata_name=name, shape_of=shapes, **kw)
        if rank == drop_meta:
            os.remove(os.path.join(root, name))


# ---------------------------------------------------------------- all fixtures

def make_all(out):
    good, flat = good_model(), flat_model()
    write_source(os.path.join(out, "good.safetensors"), good)
    write_source(os.path.join(out, "flat.safetensors"), flat)

    write_format_a(os.path.join(out, "good-a"), good, 2)
    write_format_a(os.path.join(out, "flat-a"), flat, 1, subdir=None)
    # The memory format pickled by value (Python 3.11.7) and by name (Python 3.11.2).
    write_format_b(os.path.join(out, "good-b"), good)
    write_format_b(os.path.join(out, "good-b-by-name"), good, enum_style="name")
    write_format_b(os.path.join(out, "good-b-p2"), good, protocol=2, enum_style="name")
    write_format_b(os.path.join(out, "good-b-p5"), good, protocol=5, path_style="local")
    write_format_b(os.path.join(out, "flat-b"), flat, enum_style="name")
    # Tolerance: storage_data keys whose index hint was never rewritten (None for every
    # chunk), as create_default_global_save_plan(rewrite_index_hints=False) leaves them.
    write_format_b(os.path.join(out, "good-b-no-index-hints"), good, index_hints=False)
    # The state dict inside a one-key dict, as accelerate's save_fsdp_model writes it
    # ({"model": state_dict}: HF Trainer, ms-swift with FSDP2 and SHARDED_STATE_DICT), and
    # the same wrapper beside a second top-level key, which keeps the names as saved.
    write_format_b(os.path.join(out, "wrapped-b"), good, wrapper="model")
    write_format_b_per_rank(os.path.join(out, "wrapped-b-per-rank"), rank_model(False),
                            enum_style="name", wrapper="model")
    write_format_b(os.path.join(out, "wrapped-two-keys"), flat, wrapper="model",
                   wrap_train_state=False)
    # A model beside its optimizer: the torch DCP recipe's and slime's {"app":
    # AppState} with AppState.state_dict() = {"model": ..., "optim": ...}; the two side by
    # side at the top level; slime's later {"model_state": {"model": sd}} (model alone,
    # two wrappers); torchtitan's model flattened into the top level beside "optimizer"
    # (flattened optimizer keys) and "train_state" (docs/dcp.md §3, "Names").
    optim, optim_values = optimizer_state(flat, ("app", "optim"))
    write_format_b(os.path.join(out, "app-b"), flat + optim, wrapper=("app", "model"),
                   values=optim_values)
    optim, optim_values = optimizer_state(flat, ("optimizer",))
    write_format_b(os.path.join(out, "model-optimizer-b"), flat + optim, wrapper="model",
                   values=optim_values)
    write_format_b(os.path.join(out, "model-state-b"), flat, wrapper=("model_state", "model"),
                   values=[])
    optim, optim_values = optimizer_state(flat, ("optimizer",), flatten=True)
    write_format_b(os.path.join(out, "titan-b"), flat + optim,
                   values=optim_values + [("train_state", "step")])
    # An HF Trainer step directory: accelerate's model and optimizer checkpoints are two
    # of its subdirectories, beside config.json.
    step = os.path.join(out, "trainer-step")
    write_format_b(os.path.join(step, "pytorch_model_fsdp_0"), good, wrapper="model")
    write_format_b(os.path.join(step, "optimizer_0"), flat, wrapper="optimizer")
    write(os.path.join(step, "config.json"), b"{}\n")

    # Refusals.
    write_format_a(os.path.join(out, "a-missing-shard"), good, 2, skip=(1, 1))
    write_format_a(os.path.join(out, "a-corrupt-replica"), good, 2,
                   corrupt=("model.layers.0.input_layernorm.weight", 2))
    write_format_a(os.path.join(out, "a-no-info"), good, 2, no_info_rank=2)
    write_format_b(os.path.join(out, "b-missing-file"), good, missing="__2_0.distcp")
    write_format_b(os.path.join(out, "b-missing-chunk"), good,
                   drop=("model.embed_tokens.weight", 1))
    write_format_b(os.path.join(out, "b-corrupt-replica"), good,
                   corrupt=("model.layers.0.input_layernorm.weight", 2))
    write_format_b(os.path.join(out, "b-zstd"), good, zstd=("model.norm.weight", 0))
    write_format_b(os.path.join(out, "b-deflate"), good, deflate=("model.norm.weight", 0))
    write_format_b(os.path.join(out, "b-bigendian"), good, big=("model.norm.weight", 0))
    write_format_b(os.path.join(out, "b-dtype"), good, wrong_dtype=("model.norm.weight", 0))
    write_format_b(os.path.join(out, "b-oob"), good, oob=("model.embed_tokens.weight", 3))
    write_format_b(os.path.join(out, "b-evil"), good, evil=True)
    write_format_b(os.path.join(out, "b-view"), good, bad_stride=("model.norm.weight", 0))
    write_format_b(os.path.join(out, "b-key-control"), good, bad_key=("model.norm.weight", 0))
    norm = "model.norm.weight"
    write_format_b(os.path.join(out, "b-sparse"), good,
                   layout_of={norm: torch_layout("torch.sparse_coo")})
    write_format_b(os.path.join(out, "b-layout-unknown"), good,
                   layout_of={norm: torch_layout("torch.bogus")})
    getattr_ = Global("builtins", "getattr")
    write_format_b(os.path.join(out, "b-getattr-member"), good, enum_style="name",
                   mem_format_of={norm: Reduce(getattr_, (MEM_FORMAT, "TORCH_EVIL_FORMAT"))})
    write_format_b(os.path.join(out, "b-getattr-class"), good, enum_style="name",
                   mem_format_of={norm: Reduce(getattr_, (TORCH_SIZE, "TORCH_CONTIGUOUS_FORMAT"))})
    write_format_b(os.path.join(out, "b-enum-value"), good,
                   mem_format_of={norm: Reduce(MEM_FORMAT, (7,))})
    # Saved with use_collectives=False (one __R.metadata per rank), and the same model
    # saved collectively (.metadata), which must merge to the same bytes.
    per_rank, collective = rank_model(False), rank_model(True)
    write_source(os.path.join(out, "ranks.safetensors"), per_rank)
    write_format_b(os.path.join(out, "ranks-b"), collective, enum_style="name")
    write_format_b_per_rank(os.path.join(out, "ranks-b-per-rank"), per_rank, enum_style="name")
    write_format_b_per_rank(os.path.join(out, "ranks-missing-meta"), per_rank, drop_meta=1)
    write_format_b_per_rank(os.path.join(out, "ranks-missing-meta0"), per_rank, drop_meta=0)
    write_format_b_per_rank(os.path.join(out, "ranks-shape-disagree"), per_rank,
                            shape_of={("model.embed_tokens.weight", 1): [6, 4]})
    write_format_b_per_rank(os.path.join(out, "ranks-ambiguous"), per_rank)
    write_format_b(os.path.join(out, "ranks-ambiguous"), collective)
    write_format_b(os.path.join(out, "b-safetensors"), collective, serialization="safetensors")
    # Both formats in one directory.
    write_format_b(os.path.join(out, "ambiguous"), flat)
    write_format_a(os.path.join(out, "ambiguous"), flat, 1, subdir=None)
    write_torch_save_ranks(os.path.join(out, "torch-save-ranks"))


def write_torch_save_ranks(root):
    """A checkpoint saved with torch.save by each rank, as verl lays one out
    (docs/torch-save.md §2), which wsync does not read: model, optimizer and extra-state
    archives of 2 ranks (one tensor each; what their pickles hold does not matter here),
    fsdp_config.json and huggingface/config.json; beside them a zip that is no torch.save
    archive (no directory) and a truncated archive, which must not be named as archives."""
    pkl = dumps(rebuild_tensor("FloatStorage", 2, 0, (2,), (1,)), 2)
    storage = struct.pack("<2f", 1.0, 2.0)
    names = ["model_world_size_2_rank_0", "model_world_size_2_rank_1",
             "optim_world_size_2_rank_0", "optim_world_size_2_rank_1",
             "extra_state_world_size_2_rank_0"]
    for name in names:
        write(os.path.join(root, name + ".pt"),
              torch_save_archive(pkl, [(storage, 64, False, False)], name=name))
    write(os.path.join(root, "fsdp_config.json"), b'{"FSDP_version": 2, "world_size": 2}')
    write(os.path.join(root, "huggingface", "config.json"), b"{}\n")
    write(os.path.join(root, "notes.zip"),
          zip_archive([("data.pkl", b"not a pickle", 0, False, False)]))
    whole = torch_save_archive(pkl, [(storage, 64, False, False)], name="broken")
    write(os.path.join(root, "broken.pt"), whole[:len(whole) // 2])
    one = os.path.join(root + "-one")
    write(os.path.join(one, "model.pt"), torch_save_archive(pkl, [(storage, 64, False, False)]))


def make_seeds(out):
    """The fuzz corpus: metadata-*, blob-*, pickle-* (data.pkl) and shard-* seeds."""
    import tempfile
    os.makedirs(out, exist_ok=True)
    good = good_model()
    with tempfile.TemporaryDirectory() as tmp:
        blobs = []
        # (seed name, protocol, enum style, path style)
        for name, proto, enum_style, path_style in (("p2", 2, "name", "parts"),
                                                    ("p4", 4, "value", "parts"),
                                                    ("p4-by-name", 4, "name", "parts"),
                                                    ("p5", 5, "value", "local")):
            d = os.path.join(tmp, name)
            write_format_b(d, good, protocol=proto, enum_style=enum_style, path_style=path_style,
                           blobs=blobs if name == "p4" else None)
            shutil.copy(os.path.join(d, ".metadata"), os.path.join(out, "metadata-%s.bin" % name))
        wanted = {"lm_head.weight-1": "transposed", "lm_head.weight-0": "zip64",
                  "model.embed_tokens.weight-3": "offset", "model.fp8.weight-0": "v3",
                  "model.tiny.weight-2": "empty", "model.scale-1": "scalar"}
        for name, blob, pkl in blobs:
            if name in wanted:
                write(os.path.join(out, "blob-%s.bin" % wanted[name]), blob)
                write(os.path.join(out, "pickle-%s.bin" % wanted[name]), pkl)
        # One rank's __R.metadata of a use_collectives=False save (only its own chunks).
        write_format_b_per_rank(os.path.join(tmp, "ranks"), rank_model(False), enum_style="name")
        shutil.copy(os.path.join(tmp, "ranks", "__1.metadata"),
                    os.path.join(out, "metadata-rank-1.bin"))
        # Every form of a layout and a memory-format member, alone, for the pickle target.
        write(os.path.join(out, "pickle-forms.bin"), dumps(
            (STRIDED, CONTIGUOUS["value"], CONTIGUOUS["name"], torch_layout("torch.sparse_coo")),
            2))
        write_format_a(os.path.join(tmp, "a"), good, 2)
        for rank, style in ((1, "newest"), (2, "nemo")):
            src = os.path.join(tmp, "a", "sharded",
                               "shard-%05d-model-00001-of-00002.safetensors" % rank)
            shutil.copy(src, os.path.join(out, "shard-%s.bin" % style))


def read_safetensors(path):
    """[(name, dtype, shape, data)] of a plain safetensors file (data: views of a map)."""
    import mmap
    with open(path, "rb") as f:
        blob = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(bytes(blob[8:8 + n]))
    header.pop("__metadata__", None)
    base = 8 + n
    return [(name, e["dtype"], e["shape"], blob[base + e["data_offsets"][0]:base + e["data_offsets"][1]])
            for name, e in sorted(header.items())]


EXPERT = re.compile(r"\.experts\.(\d+)\.")


def shard_file(paths, out, ep=False, formats="ab"):
    """Every tensor of the safetensors files PATHS as FSDP2 shards it on 4 ranks:
    Shard(0), uneven splits and empty last shards included (docs/dcp.md §4); scalars
    whole on rank 0.  With ep, each per-expert tensor lives whole on one rank (expert
    parallelism: torchtitan's HF export, docs/dcp.md §4; the experts Shard(0) on an ep
    mesh of 4, so rank r holds the contiguous range chunk(E, 4, r) of each layer's E
    experts) and the rest is FSDP2-sharded.
    The I-th file's tensors go to output part I (format A's -model-I-of-N)."""
    files = [(part, read_safetensors(path)) for part, path in enumerate(paths, 1)]
    n_experts = collections.Counter()  # the tensor name's part before ".experts." -> E
    for _, tensors in files:
        for name, _, _, _ in tensors:
            m = EXPERT.search(name) if ep else None
            if m:
                key = name[:m.start()]
                n_experts[key] = max(n_experts[key], int(m.group(1)) + 1)
    model = []
    for part, tensors in files:
        for name, dtype, shape, data in tensors:
            model.append(sharded_tensor(name, dtype, shape, data, part, n_experts))
    if "a" in formats:
        write_format_a(os.path.join(out, "a"), model, len(paths))
    if "b" in formats:
        write_format_b(os.path.join(out, "b"), model, enum_style="name")


def expert_rank(e, n_experts, world):
    """The rank holding expert e when the experts are Shard(0) on an ep mesh of `world`
    (docs/dcp.md §4): torch.chunk of the expert axis, so each rank holds a contiguous
    range of experts."""
    for r in range(world):
        size, off = chunk(n_experts, world, r)
        if off <= e < off + size:
            return r
    raise ValueError("expert %d of %d" % (e, n_experts))


def sharded_tensor(name, dtype, shape, data, part, n_experts):
    """n_experts maps a name's part before ".experts." to its number of experts (empty:
    no expert parallelism)."""
    t = T.__new__(T)
    t.name, t.dtype, t.shape, t.data, t.part = name, dtype, list(shape), data, part
    m = EXPERT.search(name)
    if m and name[:m.start()] in n_experts:
        rank = expert_rank(int(m.group(1)), n_experts[name[:m.start()]], 4)
        t.boxes_a = [(rank, [0] * len(shape), list(shape))]
    else:
        t.boxes_a = shard(shape, 4) if shape else [(0, [], [])]
    t.boxes_b = t.boxes_a
    return t


def main(argv):
    if len(argv) == 4 and argv[1] == "--shard":
        shard_file([argv[2]], argv[3])
    elif len(argv) >= 4 and argv[1] == "--shard-ep":
        shard_file(argv[2:-1], argv[-1], ep=True, formats="a")
    elif len(argv) == 3 and argv[1] == "--seeds":
        make_seeds(argv[2])
    elif len(argv) == 2:
        make_all(argv[1])
    else:
        sys.stderr.write(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
