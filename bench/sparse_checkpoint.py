#!/usr/bin/python3
"""sparse_checkpoint.py SRC DST LAYERS: a whole-model checkpoint that costs no disk.

SRC is a small checkpoint written by `wsync synth --layers 2` (or more); DST gets a
config.json with num_hidden_layers = LAYERS and one model.safetensors whose header names
every tensor of the LAYERS-layer model (layer 0's tensors repeated for every layer, the
others as SRC has them) and whose data is a hole: the file is truncated to its full size,
so `wsync plan`, which reads headers only, sees the whole model.  Used to measure the
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
    offset = 0
    for key in sorted(tensors):
        info = tensors[key]
        nbytes = ELEMENT_BYTES[info["dtype"]]
        for d in info["shape"]:
            nbytes *= d
        info["data_offsets"] = [offset, offset + nbytes]
        offset += nbytes
    if metadata is not None:
        tensors["__metadata__"] = metadata
    text = json.dumps(tensors).encode()
    text += b" " * (-len(text) % 8)
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config["num_hidden_layers"] = layers
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(dst, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + offset)
    print(f"{dst}: {len(tensors) - (metadata is not None)} tensors, {offset} bytes (sparse)")


if __name__ == "__main__":
    main()
