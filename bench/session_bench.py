#!/usr/bin/env python3
"""The session from Python against numpy.copyto of the same bytes (`make bench`).

Usage: session_bench.py SRC OUT [--tp N] [--steps N]

SRC is a checkpoint (tests/bench.sh's Qwen3-30B-A3B-shaped synth); its tensors are
read into numpy arrays (private memory, as a trainer's CPU copy would be; BF16 as
uint16).  A wsync.Session (target vllm, sharded-state, tp N) writes into OUT, a
directory on a tmpfs: the first step creates the rank files; the steps after it are the
steady state, rewriting the same pages in place (begin, a push of every array in name
order from one Python thread, commit: the checksums of the rank files and the commit
record included).  Each steady step is paired with one pass of numpy.copyto of every array
into a preallocated, already written array of the same shape: the same bytes read and
written by the plainest copy Python has.  Prints the median time and throughput of
each (paired runs), their ratio (the bar: the session at least 0.8 of copyto's throughput), the minor
page faults per steady step (median), and the peak private memory (RssAnon) the session adds
beyond the arrays, sampled every 5 ms.
"""

import os
import resource
import statistics
import sys
import time

try:
    import numpy
except ImportError:
    print("session from Python: skipped (no numpy for %s)" % sys.executable)
    sys.exit(0)
import wsync
from benchlib import PeakSampler, rss_anon_kib, safetensors_headers

DTYPES = {"BF16": numpy.uint16, "F16": numpy.float16, "F32": numpy.float32,
          "F64": numpy.float64, "I64": numpy.int64, "I32": numpy.int32, "U8": numpy.uint8}


def load_arrays(src):
    """{name: array} of every tensor of the checkpoint, read into private memory, and
    {name: safetensors dtype}."""
    arrays, dtypes = {}, {}
    for path, start, header in safetensors_headers(src):
        with open(path, "rb") as f:
            for name, h in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
                a, b = h["data_offsets"]
                array = numpy.empty(h["shape"], dtype=DTYPES[h["dtype"]])
                f.seek(start + a)
                f.readinto(memoryview(array).cast("B"))
                assert array.nbytes == b - a
                arrays[name] = array
                dtypes[name] = h["dtype"]
    return dict(sorted(arrays.items())), dtypes


def main(argv):
    args = argv[1:]
    tp, steps = 4, 5
    while len(args) > 2:
        if args[0] == "--tp":
            tp = int(args[1])
        elif args[0] == "--steps":
            steps = int(args[1])
        else:
            break
        args = args[2:]
    if len(args) != 2:
        sys.exit(__doc__)
    src, out = args
    conf = {k: v for k, v in (("conf_dir", os.environ.get("WSYNC_BENCH_CONF_DIR")),
                              ("plugin_dir", os.environ.get("WSYNC_BENCH_PLUGIN_DIR"))) if v}

    arrays, dtypes = load_arrays(src)
    total = sum(a.nbytes for a in arrays.values())
    gb = total / 1e9
    copies = {name: numpy.ones_like(a) for name, a in arrays.items()}  # preallocated, written
    base = rss_anon_kib()

    sampler = PeakSampler()
    sampler.start()
    session = wsync.Session(os.path.join(src, "config.json"), target="vllm",
                            format="sharded-state", tp=tp, out=out, **conf)
    session.describe((name, dtypes[name], a.shape) for name, a in arrays.items())

    def step(version):
        t0 = time.perf_counter()
        session.begin(version)
        for name, a in arrays.items():
            session.push(name, a)
        session.commit()
        return time.perf_counter() - t0

    def copy_pass():
        t0 = time.perf_counter()
        for name, a in arrays.items():
            numpy.copyto(copies[name], a)
        return time.perf_counter() - t0

    first = step(1)
    t_session, t_copy, faults = [], [], []
    for i in range(steps):  # paired, so that both see the same moments of a shared machine
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t_session.append(step(2 + i))
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        t_copy.append(copy_pass())
    peak = sampler.stop()
    session.close()
    for name in arrays:
        if not numpy.array_equal(copies[name], arrays[name]):
            sys.exit("copyto did not copy %s" % name)
    faults = statistics.median(faults)

    ts, tc = statistics.median(t_session), statistics.median(t_copy)
    print("session from Python: %.2f GB as numpy arrays, vllm tp %d, %d steady steps "
          "(first step, creating the files: %.2f s)" % (gb, tp, steps, first))
    print("%-28s %7.2f s %7.2f GB/s" % ("numpy.copyto (median)", tc, gb / tc))
    print("%-28s %7.2f s %7.2f GB/s  ratio to copyto %.2f (bar 0.80)  %.0f minor faults/step  "
          "session's private memory beyond the arrays %d KiB" % (
              "session step (median)", ts, gb / ts, tc / ts, faults, max(peak - base, 0)))


if __name__ == "__main__":
    main(sys.argv)
