#!/usr/bin/python3
"""session_setup.py SRC TP dir|caller: the private memory a session takes to plan.

SRC is a checkpoint, typically a header-only whole model (bench/sparse_checkpoint.py):
only its headers are read.  A wsync.Session (target vllm, tp TP, rank files into a
directory that is never created, or a caller sink) is described every tensor of SRC,
which plans it; no step is begun and nothing is pushed.  Prints the private memory
(RssAnon) the session added, after planning and at its peak (sampled every 2 ms).
WSYNC_BENCH_CONF_DIR and WSYNC_BENCH_PLUGIN_DIR point at an uninstalled build's conf.d
and plugins, as for bench/session_bench.py.
"""
import os
import sys

import wsync
from benchlib import PeakSampler, rss_anon_kib, safetensors_headers


def described(src):
    """(name, dtype, shape) of every tensor of SRC's safetensors files, by name."""
    return sorted((name, h["dtype"], tuple(h["shape"]))
                  for _, _, header in safetensors_headers(src) for name, h in header.items())


def main(argv):
    if len(argv) != 4 or argv[3] not in ("dir", "caller"):
        sys.exit(__doc__)
    src, tp, sink = argv[1], int(argv[2]), argv[3]
    tensors = described(src)
    options = {k: v for k, v in (("conf_dir", os.environ.get("WSYNC_BENCH_CONF_DIR")),
                                 ("plugin_dir", os.environ.get("WSYNC_BENCH_PLUGIN_DIR"))) if v}
    out = os.path.join(src, "never-created") if sink == "dir" else (lambda bucket: None)
    base = rss_anon_kib()
    sampler = PeakSampler(0.002)
    sampler.start()
    session = wsync.Session(os.path.join(src, "config.json"), target="vllm", tp=tp, out=out,
                            threads=2, **options)
    session.describe(tensors)
    after = rss_anon_kib()
    peak = sampler.stop()
    print("session set-up, vllm tp %d, %s sink, %d tensors: private memory +%d KiB after "
          "planning, peak +%d KiB" % (tp, "directory" if sink == "dir" else "caller", len(tensors),
                                      after - base, peak - base))
    session.close()


if __name__ == "__main__":
    main(sys.argv)
