#!/usr/bin/python3
"""The torch peer of `make bench`: the conversion done the way vLLM's loaders do it.

    peer_torch.py PLAN.json SRC DST

PLAN.json is `wsync plan SRC --target ... --json`, the recipe (which parameter takes
which box of which checkpoint tensor), so that the files can be compared with wsync's
tensor by tensor.  For each rank, as each rank's worker process of vLLM would:

  - preallocates the rank's parameters (torch.empty, the parameters' shapes and
    dtypes);
  - walks the checkpoint tensor by tensor in file order, as safetensors_weights_iterator
    does, each a zero-copy torch.frombuffer view of an mmap of its file;
  - for each parameter part the tensor feeds, does what the weight_loader functions do
    (ColumnParallelLinear, QKVParallelLinear, RowParallelLinear, FusedMoE): narrow the
    loaded tensor to this rank's shard, narrow the parameter to the part's place, and
    copy_ (where the plan transposes, as vLLM-Ascend's kernel layout does after
    loading with w.transpose(1, 2).contiguous(), the copy_ takes the transposed view
    directly: one copy instead of vLLM-Ascend's two);
  - then writes the rank's safetensors file: the JSON header, and each parameter's bytes
    with one write (a safetensors writer's work, without safetensors.torch.save_file's
    extra copy into one bytes object).

Casts are not needed by the bench and are refused.
"""
import glob
import json
import mmap
import os
import struct
import sys

import torch

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32,
          "F64": torch.float64, "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16,
          "I32": torch.int32, "I64": torch.int64, "BOOL": torch.bool}
SIZE = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "BF16": 2, "F16": 2, "I16": 2}


def checkpoint_tensors(src):
    """(name, tensor) of SRC's safetensors files in file order, as zero-copy views."""
    for path in sorted(glob.glob(os.path.join(src, "*.safetensors"))):
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        entries = [(k, v) for k, v in header.items() if k != "__metadata__"]
        for name, t in sorted(entries, key=lambda kv: kv[1]["data_offsets"][0]):
            begin, end = t["data_offsets"]
            dtype = DTYPES[t["dtype"]]
            count = (end - begin) // torch.empty((), dtype=dtype).element_size()
            view = torch.frombuffer(buf, dtype=dtype, count=count, offset=8 + n + begin)
            yield name, view.view(t["shape"])


def narrow(t, b):
    for d, (o, e) in enumerate(zip(b["offset"], b["extent"])):
        t = t.narrow(d, o, e)
    return t


def save(path, params, dtypes, metadata):
    names = sorted(params, key=lambda k: (-SIZE.get(dtypes[k], 1), k))
    header, offset = {"__metadata__": metadata}, 0
    for k in names:
        nbytes = params[k].numel() * params[k].element_size()
        header[k] = {"dtype": dtypes[k], "shape": list(params[k].shape),
                     "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for k in names:
            p = params[k]
            raw = p.view(torch.int16) if p.dtype in (torch.bfloat16, torch.float16) else p
            f.write(memoryview(raw.numpy()).cast("B"))


def main():
    plan_path, src, dst = sys.argv[1:4]
    with open(plan_path) as f:
        plan = json.load(f)
    os.makedirs(dst, exist_ok=True)
    torch.set_num_threads(1)  # one loader per rank process, as vLLM runs it
    for rank in plan["ranks"]:
        params = {t["name"]: torch.empty(t["shape"], dtype=DTYPES[t["dtype"]])
                  for t in rank["tensors"]}
        loaders = {}  # checkpoint tensor -> [(parameter, op)]
        for t in rank["tensors"]:
            for op in t["ops"]:
                if op["op"] == "fill":
                    narrow(params[t["name"]], op["to"]).fill_(
                        torch.frombuffer(bytearray.fromhex(op["value"]),
                                         dtype=DTYPES[t["dtype"]])[0])
                elif op["cast"] is not None:
                    sys.exit("peer_torch: casts are not supported")
                else:
                    loaders.setdefault(op["from"], []).append((t["name"], op))
        for name, loaded in checkpoint_tensors(src):
            for param, op in loaders.get(name, ()):
                shard = narrow(loaded, op["from_box"])
                if op["transposed"]:
                    shard = shard.t()
                dst_view = narrow(params[param], op["to"])
                dst_view.copy_(shard.reshape(dst_view.shape))
        files = {}
        for t in rank["tensors"]:
            files.setdefault(t["file"], []).append(t)
        for fname, tensors in files.items():
            save(os.path.join(dst, fname), {t["name"]: params[t["name"]] for t in tensors},
                 {t["name"]: t["dtype"] for t in tensors}, dict(rank["metadata"], format="pt"))
        del params


if __name__ == "__main__":
    main()
