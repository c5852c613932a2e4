#!/usr/bin/python3
"""sparse_checkpoint.py SRC DST LAYERS: a whole-model checkpoint that costs no disk.

SRC is a small checkpoint written by `wsync synth --layers 2` (or more); DST gets a
config.json with num_hidden_layers = LAYERS and safetensors files whose headers name
every tensor of the LAYERS-layer model (layer 0's tensors repeated for every layer, the
others as SRC has them), split into files of at most 5 GB as Transformers splits them
(the real Qwen3-30B-A3B has 16 files), and whose data is a hole: each file is truncated
to its full size, so `wsync plan`, which reads headers only, sees the whole model.  Used to measure the
planner's memory on a model the size of the real one (bench/measure.py).
"""
import json
import os
import re
import struct
import sys

ELEMENT_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4,
                 "I16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
LAYER = re.compile(r"model\.layers\.(\d+)\.(.*)")


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: sparse_checkpoint.py SRC DST LAYERS")
    src, dst, layers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    tensors, metadata = {}, None
    for name in sorted(os.listdir(src)):
        if not name.endswith(".safetensors"):
            continue
        header = read_header(os.path.join(src, name))
        metadata = header.pop("__metadata__", metadata)
        for key, info in header.items():
            match = LAYER.fullmatch(key)
            if match is None:
                tensors[key] = info
            elif match.group(1) == "0":
                for layer in range(layers):
                    tensors[f"model.layers.{layer}.{match.group(2)}"] = dict(info)
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config["num_hidden_layers"] = layers
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    files = split(tensors)
    weight_map, total = {}, 0
    for i, names in enumerate(files, 1):
        name = f"model-{i:05d}-of-{len(files):05d}.safetensors"
        total += write_sparse(os.path.join(dst, name), {k: tensors[k] for k in names},
                              metadata)
        weight_map.update((k, name) for k in names)
    with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f,
                  indent=2, sort_keys=True)
    print(f"{dst}: {len(tensors)} tensors, {total} bytes (sparse) in {len(files)} files")


def nbytes_of(info):
    n = ELEMENT_BYTES[info["dtype"]]
    for d in info["shape"]:
        n *= d
    return n


def split(tensors):
    """The names of each file, in order, as Transformers' save_pretrained splits a
    checkpoint at its default max_shard_size (5GB): a new file before a tensor that
    would pass it."""
    files, size = [[]], 0
    for key in sorted(tensors, key=natural):
        n = nbytes_of(tensors[key])
        if files[-1] and size + n > 5 * 10**9:
            files.append([])
            size = 0
        files[-1].append(key)
        size += n
    return files


def natural(name):
    """model.layers.10 after model.layers.9."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def write_sparse(path, tensors, metadata):
    """A safetensors file with TENSORS' header and a hole for their data; its bytes."""
    header, offset = {}, 0
    for key in sorted(tensors):
        header[key] = dict(tensors[key], data_offsets=[offset, offset + nbytes_of(tensors[key])])
        offset += nbytes_of(tensors[key])
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + offset)
    return offset

if __name__ == "__main__":
    main()
