#!/usr/bin/env python3
"""Writes PyTorch distributed-checkpoint (DCP) fixtures for tests/test-dcp.c.

Usage: make-dcp-fixtures.py OUTDIR          (every fixture below, into OUTDIR)
       make-dcp-fixtures.py --seeds OUTDIR  (the fuzz seed corpus, tests/data/dcp-fuzz-seeds)
       make-dcp-fixtures.py --shard-ep FILE OUTDIR
                                            (as --shard, format A only, experts whole on
                                             their expert-parallel rank: the benchmark)
       make-dcp-fixtures.py --shard FILE OUTDIR
                                            (FILE, a safetensors file, as FSDP2 over 4
                                             ranks would save it: OUTDIR/a in format A,
                                             OUTDIR/b in format B)

Python 3 standard library only; no torch.  The files follow
../shared/reference/dcp-format.md:

* format A (Hugging Face mode): shard-S-model-I-of-N.safetensors, each a plain
  safetensors file whose __metadata__ holds DCP_SHARDING_INFO (a JSON string, written
  with json.dumps' default separators) plus DCP_VERSION and format (some files leave
  them out, as the NeMo backport does), keyed by fqn, or fqn.__dcp_shard_k with a
  logical_fqn when one file holds two chunks of a tensor (section A.3);
* format B (the default): .metadata, a pickle (protocol 2, 4 or 5) of
  torch.distributed.checkpoint.metadata.Metadata built from stub classes whose
  __module__ and __qualname__ are torch's and whose reduce/state match section B.3, and
  __R_K.distcp files holding one torch.save zip archive per chunk (section B.2):
  archive/data.pkl (protocol 2, _rebuild_tensor_v2 with a persistent id, or
  _rebuild_tensor_v3 with an UntypedStorage for float8 and uint16), archive/data/0
  stored and 64-byte aligned by padding the local header's extra field, as torch's
  writer does;
* the unsharded source of each model as a plain safetensors file, to compare bit for bit.

The weights are synthetic and encoded: every element's bytes depend on the tensor and
the element's index, so a misplaced chunk shows.  Shard boxes follow section C
(torch.chunk semantics, FSDP2 Shard(0) with an empty last shard, FSDP2 x EP with
_StridedShard + Shard on a 2 x 2 mesh, Shard(1), Replicate, dim 0 smaller than the world).
"""
import collections
import dataclasses
import enum
import io
import json
import os
import pickle
import re
import shutil
import struct
import sys
import types
import zipfile

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


# ---------------------------------------------------------------- shard boxes (section C)

def chunk(length, n, r):
    """torch.chunk semantics of Shard.local_shard_size_and_offset (section C.1)."""
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
    """(_StridedShard(0, sf=ep), Shard(0)) on the mesh (efsdp, ep) (section C.5)."""
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


def dedup(boxes):
    """DCP keeps one write item per (fqn, offsets): the lowest rank (section C.4)."""
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
    ]
    return ts


def flat_model():
    """A tensor whose chunks are on ranks 0, 2 and 3 (rank 1 holds nothing: no file)."""
    return [
        T(31, "w", "F32", [6, 2], [(0, [0, 0], [2, 2]), (2, [2, 0], [2, 2]), (3, [4, 0], [2, 2])]),
        T(32, "b", "I64", [3], [(2, [0], [3])]),
    ]


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


# ---------------------------------------------------------------- pickling stubs (section B.3)

class StubPickler(pickle._Pickler):
    """Names every global by its __module__ and __qualname__ (or the name its reduce
    returns), without importing it: the stubs stand in for torch's objects."""

    dispatch = dict(pickle._Pickler.dispatch)
    dispatch[types.FunctionType] = lambda self, obj: self.save_global(obj)

    def __init__(self, f, protocol, storages=None):
        super().__init__(f, protocol=protocol)
        self.storages = storages

    def persistent_id(self, obj):
        if self.storages is not None and isinstance(obj, StorageStub):
            return ("storage", obj.cls, "0", "cpu", obj.numel)
        return None

    def save_global(self, obj, name=None):
        if name is None:
            name = obj.__qualname__
        module = obj.__module__
        if self.proto >= 4:
            self.save(module)
            self.save(name)
            self.write(pickle.STACK_GLOBAL)
        else:
            self.write(pickle.GLOBAL + module.encode() + b"\n" + name.encode() + b"\n")
        self.memoize(obj)


def dumps(obj, protocol, storages=None):
    f = io.BytesIO()
    StubPickler(f, protocol, storages).dump(obj)
    return f.getvalue()


def stub_class(module, name, base=object, body=None):
    cls = type(name, (base,), dict(body or {}))
    cls.__module__ = module
    cls.__qualname__ = name
    return cls


class _Named:
    """torch.dtype and torch.layout: pickled as the global torch.<name> (their reduce
    returns the name)."""

    def __init__(self, name):
        self.name = name

    def __reduce__(self):
        return self.name


dtype = stub_class("torch", "dtype", _Named)
layout = stub_class("torch", "layout", _Named)
TORCH_DTYPE = {v[1]: dtype(v[1]) for v in DTYPES.values()}
strided = layout("strided")


class Size(tuple):
    def __reduce__(self):
        return (Size, (tuple(self),))


Size.__module__ = "torch"
Size.__qualname__ = "Size"

META = "torch.distributed.checkpoint.metadata"
FS = "torch.distributed.checkpoint.filesystem"


@dataclasses.dataclass
class ChunkStorageMetadata:
    offsets: object
    sizes: object


_MEM_FORMAT_ENCODING = enum.Enum(
    "_MEM_FORMAT_ENCODING",
    [("TORCH_CONTIGUOUS_FORMAT", 0), ("TORCH_CHANNELS_LAST", 1), ("TORCH_PRESERVE_FORMAT", 2)],
    module=META, qualname="_MEM_FORMAT_ENCODING")


@dataclasses.dataclass
class TensorProperties:
    dtype: object = None
    layout: object = None
    requires_grad: bool = False
    memory_format: object = None
    pin_memory: bool = False

    def __getstate__(self):
        return (self.dtype, self.layout, self.requires_grad,
                _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT, self.pin_memory)


@dataclasses.dataclass
class TensorStorageMetadata:
    properties: object
    size: object
    chunks: list


@dataclasses.dataclass
class BytesStorageMetadata:
    pass


@dataclasses.dataclass
class StorageMeta:
    checkpoint_id: object = None
    save_id: object = None
    load_id: object = None
    modules: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Metadata:
    state_dict_metadata: dict
    planner_data: object = None
    storage_data: object = None
    storage_meta: object = None
    version: object = None


@dataclasses.dataclass(frozen=True)
class MetadataIndex:
    fqn: str
    offset: object = None
    index: object = dataclasses.field(hash=False, compare=False, default=None)

    def __init__(self, fqn, offset=None, index=None):
        object.__setattr__(self, "fqn", fqn)
        object.__setattr__(self, "index", index)
        if offset is not None:
            object.__setattr__(self, "offset", Size(offset))


@dataclasses.dataclass
class _StorageInfo:
    relative_path: str
    offset: int
    length: int
    transform_descriptors: object = None

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if v is not None}


for _cls in (ChunkStorageMetadata, TensorProperties, TensorStorageMetadata, BytesStorageMetadata,
             StorageMeta, Metadata, MetadataIndex):
    _cls.__module__ = META
_StorageInfo.__module__ = FS


def posix_path_class(module):
    def reduce(self):
        return (type(self), self.args)
    return stub_class(module, "PosixPath", body={
        "__init__": lambda self, *args: setattr(self, "args", args), "__reduce__": reduce})


PosixPath = posix_path_class("pathlib")             # Python <= 3.12: args are the parts
PosixPathLocal = posix_path_class("pathlib._local")  # Python 3.13: one string


def _rebuild_tensor_v2(*args):
    raise RuntimeError("stub")


def _rebuild_tensor_v3(*args):
    raise RuntimeError("stub")


_rebuild_tensor_v2.__module__ = _rebuild_tensor_v3.__module__ = "torch._utils"
STORAGE_CLASS = {v[2]: stub_class("torch", v[2]) for v in DTYPES.values() if v[2]}
UntypedStorage = stub_class("torch", "UntypedStorage")


class StorageStub:
    def __init__(self, cls, n):
        self.cls, self.numel = cls, n


class TensorStub:
    def __init__(self, rv):
        self.rv = rv

    def __reduce_ex__(self, proto):
        return self.rv


def os_system(*args):
    raise RuntimeError("stub")


os_system.__module__, os_system.__qualname__ = "os", "system"


class Evil:
    def __reduce__(self):
        return (os_system, ("true",))


# ---------------------------------------------------------------- torch.save archives (section B.2)

def zip_add(zf, buf, name, data, align=0, deflate=False, zip64=False):
    zi = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    zi.compress_type = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
    if align:
        start = buf.tell() + 30 + len(name.encode()) + (20 if zip64 else 0) + 4
        pad = (-start) % align
        zi.extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad
    with zf.open(zi, "w", force_zip64=zip64) as f:
        f.write(data)


def torch_save(dt, size, stride, storage_offset, storage, deflate=False, byteorder="little",
               zip64=False, storage_dtype=None):
    """A torch.save archive of one tensor (DCP's "archive/" prefix)."""
    es, tname, scls = DTYPES[storage_dtype or dt]
    if scls is None:
        pid = StorageStub(UntypedStorage, len(storage))
        rv = (_rebuild_tensor_v3, (pid, storage_offset, tuple(size), tuple(stride), False,
                                   collections.OrderedDict(), TORCH_DTYPE[tname]))
    else:
        pid = StorageStub(STORAGE_CLASS[scls], len(storage) // es)
        rv = (_rebuild_tensor_v2, (pid, storage_offset, tuple(size), tuple(stride), False,
                                   collections.OrderedDict()))
    pkl = dumps(TensorStub(rv), 2, storages=True)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zip_add(zf, buf, "archive/data.pkl", pkl)
        zip_add(zf, buf, "archive/.format_version", b"1")
        zip_add(zf, buf, "archive/.storage_alignment", b"64")
        zip_add(zf, buf, "archive/byteorder", byteorder.encode())
        zip_add(zf, buf, "archive/data/0", storage, align=64, deflate=deflate, zip64=zip64)
        zip_add(zf, buf, "archive/version", b"3\n")
        zip_add(zf, buf, "archive/.data/serialization_id", b"1234567890" * 4)
    return buf.getvalue(), pkl


# ---------------------------------------------------------------- format B

# Special chunks of the good model: (tensor, rank) -> how its archive is written.
TRANSPOSED = ("lm_head.weight", 1)       # stride (1, 3): the chunk's transpose in storage
OFFSET = ("model.embed_tokens.weight", 3)  # two junk elements before the data
ZIP64 = ("lm_head.weight", 0)            # zip64 local header


def write_format_b(root, model, protocol=4, path_module=PosixPath, corrupt=None, drop=None,
                   zstd=None, deflate=None, big=None, wrong_dtype=None, oob=None, evil=False,
                   missing=None, bad_stride=None, blobs=None):
    """Writes .metadata and __R_K.distcp.  Options name (tensor, rank) chunks to spoil;
    blobs, when a list, receives (name, archive bytes, data.pkl bytes)."""
    os.makedirs(root, exist_ok=True)
    ranks = sorted({r for t in model for r, _, _ in t.boxes_b})
    sdm, storage, planner = {}, {}, {}
    files = collections.defaultdict(bytearray)
    n_items = collections.Counter()
    if 0 in ranks and not evil:
        # A non-tensor value first, as DCP writes BYTE_IO items before tensors.
        raw = pickle.dumps({"step": 10})
        files["__0_0.distcp"] += raw
        sdm["train_state"] = BytesStorageMetadata()
        storage[MetadataIndex("train_state")] = _StorageInfo("__0_0.distcp", 0, len(raw))
        planner["train_state"] = ("train_state",)
    for t in model:
        es = DTYPES[t.dtype][0]
        chunks = []
        for rank, off, ext in t.boxes_b:
            if drop == (t.name, rank):
                continue
            real = off
            if oob == (t.name, rank):
                off = [o + 1 for o in off]  # recorded one step off; the bytes are right
            chunks.append(ChunkStorageMetadata(Size(off), Size(ext)))
            key = MetadataIndex(t.name, off)
            if key in storage:
                continue  # the same chunk listed twice: one archive (storage is keyed by offsets)
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
            blob, pkl = torch_save(t.dtype, ext, stride, offset, store,
                                   deflate=deflate == (t.name, rank),
                                   byteorder="big" if big == (t.name, rank) else "little",
                                   zip64=(t.name, rank) == ZIP64,
                                   storage_dtype="F16" if wrong_dtype == (t.name, rank) else None)
            if blobs is not None:
                blobs.append(("%s-%d" % (t.name, rank), blob, pkl))
            # Rank 1 writes with two threads: two files, items alternating.
            k = (n_items[rank] % 2) if rank == 1 else 0
            n_items[rank] += 1
            fname = "__%d_%d.distcp" % (rank, k)
            info = _StorageInfo(fname, len(files[fname]), len(blob))
            if zstd == (t.name, rank):
                info.transform_descriptors = ["stream.zstd/1"]
            files[fname] += blob
            storage[key] = info
        props = TensorProperties(TORCH_DTYPE[DTYPES[t.dtype][1]], strided)
        sdm[t.name] = TensorStorageMetadata(props, Size(t.shape), chunks)
        planner[t.name] = tuple(t.name.split("."))
    if evil:
        sdm["evil"] = Evil()
    ckpt = path_module("/", "ckpt", "step-10") if path_module is PosixPath else \
        path_module("/ckpt/step-10")
    md = Metadata(sdm, planner, storage,
                  StorageMeta(ckpt, "0f2c5b6e-1111-2222-3333-444455556666", None, []), "1.0.0")
    write(os.path.join(root, ".metadata"), dumps(md, protocol))
    for fname, data in files.items():
        if fname != missing:
            write(os.path.join(root, fname), bytes(data))


# ---------------------------------------------------------------- all fixtures

def make_all(out):
    good, flat = good_model(), flat_model()
    write_source(os.path.join(out, "good.safetensors"), good)
    write_source(os.path.join(out, "flat.safetensors"), flat)

    write_format_a(os.path.join(out, "good-a"), good, 2)
    write_format_a(os.path.join(out, "flat-a"), flat, 1, subdir=None)
    write_format_b(os.path.join(out, "good-b"), good)
    write_format_b(os.path.join(out, "good-b-p2"), good, protocol=2)
    write_format_b(os.path.join(out, "good-b-p5"), good, protocol=5, path_module=PosixPathLocal)
    write_format_b(os.path.join(out, "flat-b"), flat)

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
    # Both formats in one directory.
    write_format_b(os.path.join(out, "ambiguous"), flat)
    write_format_a(os.path.join(out, "ambiguous"), flat, 1, subdir=None)


def make_seeds(out):
    """The fuzz corpus: metadata-*, blob-*, pickle-* (data.pkl) and shard-* seeds."""
    import tempfile
    os.makedirs(out, exist_ok=True)
    good = good_model()
    with tempfile.TemporaryDirectory() as tmp:
        blobs = []
        for proto in (2, 4, 5):
            d = os.path.join(tmp, "b%d" % proto)
            write_format_b(d, good, protocol=proto, blobs=blobs if proto == 4 else None,
                           path_module=PosixPathLocal if proto == 5 else PosixPath)
            shutil.copy(os.path.join(d, ".metadata"), os.path.join(out, "metadata-p%d.bin" % proto))
        wanted = {"lm_head.weight-1": "transposed", "lm_head.weight-0": "zip64",
                  "model.embed_tokens.weight-3": "offset", "model.fp8.weight-0": "v3",
                  "model.tiny.weight-2": "empty", "model.scale-1": "scalar"}
        for name, blob, pkl in blobs:
            if name in wanted:
                write(os.path.join(out, "blob-%s.bin" % wanted[name]), blob)
                write(os.path.join(out, "pickle-%s.bin" % wanted[name]), pkl)
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


def shard_file(path, out, ep=False, formats="ab"):
    """Every tensor as FSDP2 shards it on 4 ranks: Shard(0), uneven splits and empty
    last shards included (section C.5); scalars whole on rank 0.  With ep, each
    per-expert tensor lives whole on one rank (expert parallelism: torchtitan's HF
    export, section C.5) and the rest is FSDP2-sharded."""
    model = []
    for name, dtype, shape, data in read_safetensors(path):
        t = T.__new__(T)
        t.name, t.dtype, t.shape, t.data, t.part = name, dtype, list(shape), data, 1
        m = EXPERT.search(name) if ep else None
        if m:
            t.boxes_a = [(int(m.group(1)) % 4, [0] * len(shape), list(shape))]
        else:
            t.boxes_a = shard(shape, 4) if shape else [(0, [], [])]
        t.boxes_b = t.boxes_a
        model.append(t)
    if "a" in formats:
        write_format_a(os.path.join(out, "a"), model, 1)
    if "b" in formats:
        write_format_b(os.path.join(out, "b"), model)


def main(argv):
    if len(argv) == 4 and argv[1] == "--shard":
        shard_file(argv[2], argv[3])
    elif len(argv) == 4 and argv[1] == "--shard-ep":
        shard_file(argv[2], argv[3], ep=True, formats="a")
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
