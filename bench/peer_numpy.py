#!/usr/bin/python3
"""The numpy peer of `make bench`: the same conversion as `wsync convert`, as a Python
user would write it with numpy.

    peer_numpy.py PLAN.json SRC DST

PLAN.json is `wsync plan SRC --target ... --json`: it serves only as the recipe (which
output tensor takes which box of which checkpoint tensor, transposed or not), so that
this script converts for any target and tp and its files can be compared with
wsync's, tensor by tensor.  What it does is what a hand-written numpy converter does:

  - opens every *.safetensors of SRC with np.memmap (no copy: what safetensors'
    safe_open does) and views each tensor as an array (BF16/F16 as uint16: numpy has
    no bfloat16; the bytes are what matters);
  - for each rank, allocates every output tensor (np.empty) and fills it by slice
    assignment, `out[to] = src[from]` (`.T` where the plan transposes, as
    np.ascontiguousarray(w.transpose(...)) would);
  - writes each rank's safetensors file (the JSON header, tensors sorted by dtype
    then name as the reference writer sorts them, then each array's buffer with one
    write) -- leaner than safetensors.numpy.save_file, which copies each tensor once
    more with tobytes().

A rank at a time is held in memory (a whole-model copy per rank, as such a script
does).  Casts are not needed by the bench and are refused.
"""
import glob
import json
import os
import struct
import sys

import numpy as np

DTYPES = {"BF16": np.uint16, "F16": np.uint16, "F32": np.float32, "F64": np.float64,
          "I8": np.int8, "U8": np.uint8, "I16": np.int16, "I32": np.int32, "I64": np.int64,
          "BOOL": np.bool_}


def open_checkpoint(src):
    """Every tensor of SRC's safetensors files, as a read-only array over a memmap."""
    tensors = {}
    for path in sorted(glob.glob(os.path.join(src, "*.safetensors"))):
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
        for name, t in header.items():
            if name == "__metadata__":
                continue
            begin, end = t["data_offsets"]
            dtype = np.dtype(DTYPES[t["dtype"]])
            tensors[name] = data[begin:end].view(dtype).reshape(t["shape"])
    return tensors


def box(b):
    """The index of a box ((...) for a scalar's, so that it stays an array)."""
    return tuple(slice(o, o + e) for o, e in zip(b["offset"], b["extent"])) or (Ellipsis,)


def build(tensor, inputs):
    out = np.empty(tensor["shape"], dtype=DTYPES[tensor["dtype"]])
    for op in tensor["ops"]:
        dst = out[box(op["to"])]
        if op["op"] == "fill":
            dst[...] = np.frombuffer(bytes.fromhex(op["value"]), dtype=out.dtype)[0]
            continue
        if op["cast"] is not None:
            sys.exit("peer_numpy: casts are not supported")
        block = inputs[op["from"]][box(op["from_box"])]
        if op["transposed"]:
            block = block.T
        dst[...] = block.reshape(dst.shape)
    return out


def save(path, arrays, dtypes, metadata):
    """A safetensors file: header (sorted as the reference writer sorts), then data."""
    size = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "BF16": 2, "F16": 2, "I16": 2}
    names = sorted(arrays, key=lambda k: (-size.get(dtypes[k], 1), k))
    header, offset = {"__metadata__": metadata}, 0
    for k in names:
        header[k] = {"dtype": dtypes[k], "shape": list(arrays[k].shape),
                     "data_offsets": [offset, offset + arrays[k].nbytes]}
        offset += arrays[k].nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for k in names:
            f.write(memoryview(arrays[k]).cast("B"))


def main():
    plan_path, src, dst = sys.argv[1:4]
    with open(plan_path) as f:
        plan = json.load(f)
    inputs = open_checkpoint(src)
    os.makedirs(dst, exist_ok=True)
    for rank in plan["ranks"]:
        files = {}
        for t in rank["tensors"]:
            files.setdefault(t["file"], []).append(t)
        for name, tensors in files.items():
            arrays = {t["name"]: build(t, inputs) for t in tensors}
            dtypes = {t["name"]: t["dtype"] for t in tensors}
            save(os.path.join(dst, name), arrays, dtypes, dict(rank["metadata"], format="pt"))
            del arrays


if __name__ == "__main__":
    main()
