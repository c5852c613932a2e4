#!/usr/bin/env python3
"""Tests of the Python module wsync (python/): the session fed from Python, load_rank,
the commands as functions.  Prints TAP; tests/tap-test runs it with the configured
$(PYTHON) (Debian's python3: numpy always, torch when python3-torch is installed).

What the user would see is asserted: the rank files a session writes from numpy arrays
and torch tensors are, byte for byte, the files `wsync convert` writes from the same
`wsync synth --pattern index` checkpoint (every element encodes its tensor and
position); every refusal's message fragment and exit_status; the parameters load_rank
fills, element for element.  Tests that need numpy or torch say "# SKIP no numpy" /
"# SKIP no torch" where they are missing; without numpy the module still imports and
works from bytes and memoryviews (checked in a subprocess that blocks numpy).

Environment (Makefile.am's AM_TESTS_ENVIRONMENT): WSYNC_TEST_PYTHONPATH (the package
and the built extension), WSYNC_TEST_BINARY, WSYNC_TEST_BUILT_PLUGIN_DIR,
WSYNC_TEST_CONF_DIR, G_TEST_SRCDIR.  Accepts and ignores --tap and -k."""

import concurrent.futures
import ctypes
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

sys.dont_write_bytecode = True  # never write into the source tree (make distcheck)
HERE = os.path.dirname(os.path.abspath(__file__))
SRCDIR = os.path.dirname(HERE)
for entry in reversed(os.environ.get("WSYNC_TEST_PYTHONPATH", "").split(os.pathsep)):
    if entry:
        sys.path.insert(0, entry)

import wsync  # noqa: E402

try:
    import numpy
except ImportError:
    numpy = None
try:
    import torch
except ImportError:
    torch = None

BINARY = os.environ.get("WSYNC_TEST_BINARY") or os.path.join(SRCDIR, "wsync")
PLUGIN_DIR = os.environ.get("WSYNC_TEST_BUILT_PLUGIN_DIR") or os.path.join(SRCDIR, "plugins", ".libs")
CONF_DIR = os.environ.get("WSYNC_TEST_CONF_DIR") or os.path.join(SRCDIR, "conf.d")
CONFIGS = os.path.join(SRCDIR, "configs")
KW = {"conf_dir": CONF_DIR, "plugin_dir": PLUGIN_DIR}
TMP = tempfile.mkdtemp(prefix="wsync-test-python.")

NUMPY_DTYPES = {"BF16": "uint16", "F16": "float16", "F32": "float32", "F64": "float64",
                "I64": "int64", "I32": "int32", "U8": "uint8", "I8": "int8", "BOOL": "bool"}
TORCH_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64",
                "I64": "int64", "I32": "int32", "U8": "uint8", "I8": "int8", "BOOL": "bool"}


class Skip(Exception):
    pass


def need_numpy():
    if numpy is None:
        raise Skip("no numpy")


def need_torch():
    if torch is None:
        raise Skip("no torch")


TESTS = []


def test(fn):
    TESTS.append(fn)
    return fn


# ------------------------------------------------------------------ helpers

def run_wsync(*args):
    cmd = [BINARY, "--conf-dir", CONF_DIR, "--plugin-dir", PLUGIN_DIR, "-q"] + list(args)
    env = dict(os.environ, WSYNC_PLUGIN_PATH="")
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                          universal_newlines=True)


def wsync_ok(*args):
    r = run_wsync(*args)
    assert r.returncode == 0, "wsync %s: exit %d: %s" % (" ".join(args), r.returncode, r.stderr)
    return r.stdout


def read_safetensors(path):
    """(metadata, {name: (dtype, shape, bytes)} in data order, header size), read with
    the format's rules only (not with wsync)."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, h in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        a, b = h["data_offsets"]
        tensors[name] = (h["dtype"], tuple(h["shape"]), data[8 + n + a:8 + n + b])
    return meta, tensors, 8 + n


def read_checkpoint(path):
    """Every tensor of a checkpoint directory: {name: (dtype, shape, bytes)}."""
    out = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            out.update(read_safetensors(os.path.join(path, name))[1])
    return out


def rank_files(path):
    return sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))


def assert_same_files(want_dir, got_dir):
    """The rank files (and config.json) of got_dir are want_dir's, byte for byte; on a
    difference, names the first differing tensor."""
    want, got = rank_files(want_dir), rank_files(got_dir)
    assert want == got, "files %s, expected %s" % (got, want)
    for name in want + ["config.json"]:
        with open(os.path.join(want_dir, name), "rb") as a, open(os.path.join(got_dir, name), "rb") as b:
            if a.read() == b.read():
                continue
        assert name != "config.json", "config.json differs"
        wm, wt, _ = read_safetensors(os.path.join(want_dir, name))
        gm, gt, _ = read_safetensors(os.path.join(got_dir, name))
        assert wm == gm, "%s: metadata %s, expected %s" % (name, gm, wm)
        assert list(wt) == list(gt), "%s: tensors %s, expected %s" % (name, list(gt), list(wt))
        for t in wt:
            assert wt[t][:2] == gt[t][:2], "%s: %s is %s, expected %s" % (name, t, gt[t][:2], wt[t][:2])
            assert wt[t][2] == gt[t][2], "%s: tensor %s differs" % (name, t)
        raise AssertionError("%s differs outside the tensors" % name)


def expect_error(fragment, fn, *args, status=None, kind=None, **kwargs):
    """fn(*args, **kwargs) raises (wsync.Error, or kind) with fragment in its message."""
    kind = kind or wsync.Error
    try:
        fn(*args, **kwargs)
    except kind as e:
        text = str(e)
        assert "\n" not in text, "a message of more than one line: %r" % text
        assert fragment in text, "message %r lacks %r" % (text, fragment)
        if status is not None:
            assert e.exit_status == status, "exit_status %d, expected %d (%s)" % (
                e.exit_status, status, text)
        return e
    raise AssertionError("no error; expected %r" % fragment)


_SYNTH = {}


def synth(config, pattern="index", seed=0, fused=False):
    """A `wsync synth` checkpoint of configs/CONFIG.json, made once."""
    key = (config, pattern, seed, fused)
    if key not in _SYNTH:
        dst = os.path.join(TMP, "synth-%s-%s-%d%s" % (config, pattern, seed, "-fused" if fused else ""))
        args = ["synth", "--config", os.path.join(CONFIGS, config + ".json"), "--pattern",
                pattern, "--seed", str(seed), dst]
        wsync_ok(*(args + (["--fused-experts"] if fused else [])))
        _SYNTH[key] = dst
    return _SYNTH[key]


_CONVERTED = {}


def converted(src, target, fmt, tp, ep):
    """`wsync convert` of src, made once."""
    key = (src, target, fmt, tp, ep)
    if key not in _CONVERTED:
        dst = os.path.join(TMP, "conv-%d" % len(_CONVERTED))
        wsync_ok("convert", src, dst, "--target", target, "--format", fmt, "--tp", str(tp),
                 "--ep", str(ep))
        _CONVERTED[key] = dst
    return _CONVERTED[key]


def arrays(src):
    """The checkpoint's tensors as numpy arrays (BF16 as uint16), in name order."""
    return {name: numpy.frombuffer(raw, dtype=NUMPY_DTYPES[dtype]).reshape(shape).copy()
            for name, (dtype, shape, raw) in sorted(read_checkpoint(src).items())}


def description(src):
    return [(name, dtype, shape) for name, (dtype, shape, _) in sorted(read_checkpoint(src).items())]


def new_session(src, out, target="vllm", fmt="sharded-state", tp=1, ep=1, **kw):
    s = wsync.Session(os.path.join(src, "config.json"), target=target, format=fmt, tp=tp,
                      ep=ep, out=out, **KW, **kw)
    return s


def fresh_dir(name):
    path = os.path.join(TMP, name)
    shutil.rmtree(path, ignore_errors=True)
    return path


def push_all(s, tensors, order_seed=0, threads=1):
    names = list(tensors)
    random.Random(order_seed).shuffle(names)
    if threads == 1:
        for name in names:
            s.push(name, tensors[name])
    else:
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda n: s.push(n, tensors[n]), names))


def record(path):
    with open(os.path.join(path, "wsync-commit.json")) as f:
        return json.load(f)


_XXH3 = ctypes.CDLL("libxxhash.so.0").XXH3_64bits
_XXH3.restype = ctypes.c_uint64
_XXH3.argtypes = (ctypes.c_char_p, ctypes.c_size_t)


def checksum_oracle(data):
    """docs/session.md §4's checksum, from libxxhash alone: XXH3-64 of the 64 KiB
    blocks' XXH3-64, 8 bytes little-endian each."""
    sums = b"".join(struct.pack("<Q", _XXH3(data[i:i + 65536], len(data[i:i + 65536])))
                    for i in range(0, len(data), 65536))
    return "%016x" % _XXH3(sums, len(sums))


def documented_checksum(path):
    """What the command docs/session.md §4 gives to check a file by hand prints."""
    with open(os.path.join(SRCDIR, "docs", "session.md")) as f:
        line = [l.strip() for l in f if l.startswith("    python3 -c '")]
    assert len(line) == 1, line
    code = line[0][len("python3 -c '"):line[0].rindex("' FILE")]
    return subprocess.run([sys.executable, "-c", code, path], check=True,
                          capture_output=True, text=True).stdout


def assert_record_checksums(path):
    """Every file of the record has the checksum object, its value the file's."""
    for f in record(path)["files"]:
        with open(os.path.join(path, f["file"]), "rb") as g:
            data = g.read()
        want = {"algorithm": "xxh3-64-blocks", "block": 65536, "value": checksum_oracle(data)}
        assert f["checksum"] == want, (f, want)
        assert sorted(f) == ["bytes", "checksum", "file", "rank"], f


# ------------------------------------------------------------------ the session

# (config, target, format, tp, ep, fused): kernel allows ep > tp; vllm-ascend's kernel
# format transposes the routed experts (a post-load hook), as convert does.
SESSION_CASES = [
    ("tiny-qwen3-moe", "vllm", "sharded-state", 1, 1, False),
    ("tiny-qwen3-moe", "vllm", "sharded-state", 2, 2, False),
    ("tiny-qwen3-moe", "vllm", "kernel", 4, 1, False),
    ("tiny-qwen3-moe", "vllm", "kernel", 2, 4, False),
    ("tiny-qwen3-moe", "vllm", "kernel", 2, 2, True),
    ("tiny-qwen3-moe", "vllm-ascend", "kernel", 2, 2, False),
    ("tiny-qwen3.5-moe", "vllm", "sharded-state", 2, 1, False),
    ("tiny-qwen3.5-moe", "vllm", "sharded-state", 4, 4, False),
    ("tiny-qwen3.5-moe", "vllm", "kernel", 2, 4, False),
    ("tiny-qwen3.5-moe", "vllm-ascend", "kernel", 1, 1, False),
]


def session_case(config, target, fmt, tp, ep, fused):
    def run():
        need_numpy()
        src = synth(config, fused=fused)
        want = converted(src, target, fmt, tp, ep)
        out = fresh_dir("sess-%s-%s-%s-%d-%d-%d" % (config, target, fmt, tp, ep, fused))
        with new_session(src, out, target, fmt, tp, ep) as s:
            s.describe(description(src))
            s.begin(1)
            push_all(s, arrays(src), order_seed=tp * 10 + ep, threads=2 if tp > 1 else 1)
            s.commit()
            assert_same_files(want, out)
            r = record(out)
            assert r["version"] == 1 and r["digest"] == s.digest, r
            assert (r["target"], r["tp"], r["ep"], r["world"]) == (target, tp, ep, s.world), r
            assert sorted(f["file"] for f in r["files"]) == rank_files(want), r
            assert_record_checksums(out)
    run.__name__ = "session %s --target %s --format %s --tp %d --ep %d%s = convert" % (
        config, target, fmt, tp, ep, " (fused experts)" if fused else "")
    return run


for _case in SESSION_CASES:
    test(session_case(*_case))


@test
def session_second_step_rewrites_in_place():
    """A second step with other values (a random synth) rewrites every file in place:
    the files equal convert's of the new values, the record's version and checksums change,
    the inodes stay."""
    need_numpy()
    first, second = synth("tiny-qwen3-moe"), synth("tiny-qwen3-moe", "random", 7)
    out = fresh_dir("sess-steps")
    with new_session(first, out, "vllm", "kernel", 2, 2) as s:
        s.describe(description(first))
        s.begin(10)
        push_all(s, arrays(first))
        s.commit()
        r1 = record(out)
        inodes = {n: os.stat(os.path.join(out, n)).st_ino for n in rank_files(out)}
        s.begin(11)
        assert not os.path.exists(os.path.join(out, "wsync-commit.json")), "begin left the record"
        push_all(s, arrays(second), order_seed=3, threads=2)
        s.commit()
    assert_same_files(converted(second, "vllm", "kernel", 2, 2), out)
    r2 = record(out)
    assert (r1["version"], r2["version"]) == (10, 11)
    assert r1["digest"] == r2["digest"]
    for a, b in zip(r1["files"], r2["files"]):
        assert a["file"] == b["file"] and a["checksum"] != b["checksum"], (a, b)
    assert_record_checksums(out)
    assert inodes == {n: os.stat(os.path.join(out, n)).st_ino for n in rank_files(out)}


@test
def session_shards():
    """A tensor described as two row shards, pushed as two shards, gives convert's files."""
    need_numpy()
    src = synth("tiny-qwen3-moe")
    tensors = arrays(src)
    name = "model.embed_tokens.weight"
    rows = tensors[name].shape[0]
    cut = rows // 3
    desc = [d for d in description(src) if d[0] != name]
    shape = tensors[name].shape
    desc += [(name, "BF16", (cut, shape[1]), (0, 0), shape),
             (name, "BF16", (rows - cut, shape[1]), (cut, 0), shape)]
    out = fresh_dir("sess-shards")
    with new_session(src, out, "vllm", "sharded-state", 2, 1) as s:
        s.describe(desc)
        s.begin(1)
        whole = tensors.pop(name)
        s.push(name, whole[cut:], offsets=(cut, 0))
        push_all(s, tensors)
        s.push(name, whole[:cut], offsets=[0, 0])
        s.commit()
    assert_same_files(converted(src, "vllm", "sharded-state", 2, 1), out)


@test
def numpy_integers_are_ints():
    """numpy's integers (shapes of numpy arrays of sizes, ranks and steps counted in
    numpy) are taken wherever an int is: describe's shapes, tp, begin's version and
    load_rank's rank."""
    need_numpy()
    src = synth("tiny-qwen3-moe")
    out = fresh_dir("sess-numpy-ints")
    s = wsync.Session(os.path.join(src, "config.json"), target="vllm", format="kernel",
                      tp=numpy.int64(2), out=out, **KW)
    s.describe((name, dtype, numpy.array(shape, dtype="int64"))
               for name, dtype, shape in description(src))
    s.begin(numpy.uint32(1))
    push_all(s, arrays(src))
    s.commit()
    s.close()
    assert_same_files(converted(src, "vllm", "kernel", 2, 1), out)
    want = rank_tensors(out, 1)
    params = zero_arrays(want)
    assert wsync.load_rank(out, numpy.int64(1), params)["version"] == 1
    assert all(params[n].tobytes() == raw for n, (_, _, raw) in want.items())


@test
def options_take_what_python_passes():
    """The commands and Session read their options by one rule: target and format are
    str; tp, ep, rank, threads and part_size an int (numpy's too: anything with
    __index__) or the command line's text ("2", "5G"); bucket_bytes and max_open_buckets
    an int.  A bool is refused, a number out of range is the command's usage error.
    (Before: the commands refused numpy.int64 that Session took, Session refused it for
    bucket_bytes and max_open_buckets, and tp=2**70 raised a bare OverflowError.)"""
    need_numpy()
    src = synth("tiny-qwen3-moe")
    want = json.loads(wsync_ok("plan", src, "--target", "vllm", "--format", "kernel", "--tp", "2",
                               "--ep", "2", "--rank", "1", "--threads", "2", "--json"))
    got = wsync.plan(src, target="vllm", format="kernel", tp=numpy.int64(2), ep=numpy.uint8(2),
                     rank=numpy.int32(1), threads=numpy.int16(2), **KW)
    assert got == want
    out = fresh_dir("py-convert-numpy")
    wsync.convert(src, out, target="vllm", format="kernel", tp=numpy.int64(2), ep=2, **KW)
    assert_same_files(converted(src, "vllm", "kernel", 2, 2), out)
    config = os.path.join(src, "config.json")
    for make in (lambda **kw: wsync.plan(src, target="vllm", **KW, **kw),
                 lambda **kw: wsync.Session(config, target="vllm", **KW, **kw)):
        expect_error("tp must be an int or its text, not bool", make, tp=True, kind=TypeError)
        expect_error("tp must be an int or its text, not float", make, tp=2.0, kind=TypeError)
        expect_error('tp must be a number from 1 to 4096, not "1180591620717411303424"', make,
                     tp=2 ** 70, status=2)
        expect_error('tp must be a number from 1 to 4096, not "-1"', make, tp=-1, status=2)
    expect_error("target must be a str, not int", wsync.plan, src, target=1, **KW,
                 kind=TypeError)
    expect_error("format must be a str, not bytes", wsync.Session, config, target="vllm",
                 format=b"kernel", **KW, kind=TypeError)
    buckets = []
    s = wsync.Session(config, target="vllm", format="kernel", tp=2, out=buckets.append,
                      bucket_bytes=numpy.int64(1), max_open_buckets=numpy.uint32(1000), **KW)
    s.describe(description(src))
    s.begin(1)
    push_all(s, arrays(src))
    s.commit()
    s.close()
    assert buckets and all(len(b.entries) == 1 for b in buckets), len(buckets)
    expect_error("max_open_buckets must be an int, not bool", wsync.Session, config,
                 target="vllm", out=buckets.append, max_open_buckets=True, **KW, kind=TypeError)
    expect_error("max_open_buckets must be a number of at least 1", wsync.Session, config,
                 target="vllm", out=buckets.append, max_open_buckets=0, **KW, status=2)


@test
def size_keywords_take_what_the_command_line_takes():
    """Every size keyword (part_size of the commands and Session, bucket_bytes) takes
    what the command line's sizes take: an int (numpy's too) or its text with K, M, G
    or T (powers of 1024), refuses a bool, and refuses a bad size with the command's
    size error naming the keyword.  (Before: bucket_bytes="4K" raised "bucket_bytes
    must be an int, not str" while part_size="5G" worked.)"""
    need_numpy()
    src = synth("tiny-qwen3-moe")
    config = os.path.join(src, "config.json")
    assert collect_buckets(src, "vllm", "kernel", 2, 1, "4K") == \
        collect_buckets(src, "vllm", "kernel", 2, 1, 4096)
    assert collect_buckets(src, "vllm", "kernel", 2, 1, "1m") == \
        collect_buckets(src, "vllm", "kernel", 2, 1, numpy.int64(1 << 20))
    size_error = ("%s must be a size from 1 byte to 2^64-1 bytes: a number, optionally "
                  'followed by K, M, G or T (powers of 1024), not "%s"')
    for name, make in (("bucket_bytes", lambda **kw: wsync.Session(config, target="vllm",
                                                                    out=print, **KW, **kw)),
                       ("part_size", lambda **kw: wsync.Session(config, target="vllm", **KW, **kw)),
                       ("part_size", lambda **kw: wsync.plan(src, target="vllm", **KW, **kw))):
        expect_error("%s must be an int or its text, not bool" % name, make, **{name: True},
                     kind=TypeError)
        expect_error("%s must be an int or its text, not float" % name, make, **{name: 4.0},
                     kind=TypeError)
        for bad in (0, -1, "0", "4Q", "", "K", 2 ** 64, "16777216T"):
            expect_error(size_error % (name, bad), make, **{name: bad}, status=2)
    want = json.loads(wsync_ok("plan", src, "--target", "vllm", "--part-size", "64K", "--json"))
    assert wsync.plan(src, target="vllm", part_size="64K", **KW) == want
    assert wsync.plan(src, target="vllm", part_size=65536, **KW) == want


@test
def session_init_again_keeps_no_earlier_callback():
    """Session.__init__ called again after a call that failed once it had taken its
    callback (a bad conf_dir) holds only the new callback: the first is freed.
    (Before: the first callback's reference leaked, the callable lived on.)"""
    import gc
    import weakref
    src = synth("tiny-qwen3-moe")
    config = os.path.join(src, "config.json")

    class Sink:
        def __call__(self, bucket):
            pass

    first, second = Sink(), Sink()
    gone, kept = weakref.ref(first), weakref.ref(second)
    s = wsync.Session.__new__(wsync.Session)
    expect_error("conf_dir", s.__init__, config, target="vllm", out=first, conf_dir=1,
                 plugin_dir=PLUGIN_DIR, kind=TypeError)
    s.__init__(config, target="vllm", out=second, **KW)
    del first, second
    gc.collect()
    assert gone() is None, "the first callback is still referenced"
    assert kept() is not None, "the session dropped its callback"
    s.close()
    # a failed __init__ alone keeps nothing either
    third = Sink()
    gone = weakref.ref(third)
    t = wsync.Session.__new__(wsync.Session)
    expect_error("conf_dir", t.__init__, config, target="vllm", out=third, conf_dir=1,
                 kind=TypeError)
    del third
    gc.collect()
    assert gone() is None, "a failed __init__ kept its callback"


@test
def session_refusals_speak_python():
    """The refusals name the Python methods and arguments, not the C functions behind
    them: a session not yet described, no step open, a shard pushed without its offsets
    or a whole tensor with offsets, a session without a sink.  Offsets of another
    number of axes than the shards' are refused as such."""
    need_numpy()
    src = synth("tiny-qwen3-moe")
    tensors = arrays(src)
    name = "model.embed_tokens.weight"
    norm = "model.norm.weight"
    s = new_session(src, fresh_dir("sess-python-words"), "vllm", "sharded-state", 2, 1)
    expect_error('push: tensor "%s": the session has not planned (call describe() first)' % norm,
                 s.push, norm, tensors[norm], status=2)
    expect_error("begin: the session has not planned (call describe() first)", s.begin, 1,
                 status=2)
    expect_error("commit: the session has not planned (call describe() first)", s.commit,
                 status=2)
    shape = tensors[name].shape
    cut = shape[0] // 2
    s.describe([d for d in description(src) if d[0] != name] +
               [(name, "BF16", (cut, shape[1]), (0, 0), shape),
                (name, "BF16", (shape[0] - cut, shape[1]), (cut, 0), shape)])
    expect_error('push: tensor "%s": no step is open (call begin() first)' % norm, s.push, norm,
                 tensors[norm], status=2)
    s.begin(1)
    expect_error('push: tensor "%s" was described as 2 shards: push each with '
                 'push(name, shard, offsets=...)' % name, s.push, name, tensors[name], status=3)
    # offsets of another number of axes: said so (the C session read past them)
    e = expect_error('push: tensor "%s": offsets [0] have 1 axis, but its shards have 2'
                     % name, s.push, name, tensors[name][:cut], offsets=(0,), status=3)
    assert str(e) == ('push: tensor "%s": offsets [0] have 1 axis, but its shards have 2'
                      % name), str(e)
    expect_error('push: tensor "%s": offsets [0, 0, 0] have 3 axes, but its shards have 2'
                 % name, s.push, name, tensors[name][:cut], offsets=(0, 0, 0), status=3)
    expect_error('push: tensor "%s" was described whole: push it without offsets' % norm,
                 s.push, norm, tensors[norm], offsets=(0,), status=3)
    s.close()
    s = new_session(src, None, "vllm", "sharded-state", 2, 1)
    s.describe(description(src))
    e = expect_error("begin: the session has no sink (it was made with out=None: plan, digest "
                     "and manifests only)", s.begin, 1, status=2)
    assert "wsync_session" not in str(e) and "on_bucket" not in str(e), str(e)


@test
def session_manifest_and_digest():
    """manifest(rank) says where each tensor of the rank files lives; the digest is
    stable for the same description and changes with tp."""
    need_numpy()
    src = synth("tiny-qwen3-moe")
    want = converted(src, "vllm", "kernel", 2, 1)
    digests = []
    for tp in (2, 2, 4):
        s = new_session(src, None, "vllm", "kernel", tp, 1)
        s.describe(description(src))
        digests.append(s.digest)
        if tp == 2:
            for rank in range(s.world):
                entries = s.manifest(rank)
                files = {e.file for e in entries}
                assert files == {f for f in rank_files(want) if "rank-%d-" % rank in f}, files
                for e in entries:
                    meta, tensors, header = read_safetensors(os.path.join(want, e.file))
                    dtype, shape, raw = tensors[e.name]
                    assert (e.dtype, e.shape, e.nbytes) == (dtype, shape, len(raw)), e
                    with open(os.path.join(want, e.file), "rb") as f:
                        f.seek(e.offset)
                        assert f.read(e.nbytes) == raw, e
        s.close()
    assert len(digests[0]) == 64 and digests[0] == digests[1] != digests[2], digests
    s = new_session(src, None, "vllm", "kernel", 2)
    expect_error("manifest: the session has not planned", s.manifest, 0, status=2)
    s.describe(description(src))
    expect_error("manifest: rank 2 is outside the 2 ranks", s.manifest, 2, status=2)
    # a bool is no rank: True is not rank 1 (as tp=True is refused, options_take_what_python_passes)
    for flag in (True, False, numpy.bool_(True)):
        expect_error("manifest: rank must be an int, not %s" % type(flag).__qualname__.replace("bool_", "numpy.bool_"), s.manifest,
                     flag, kind=TypeError)
    expect_error("manifest: rank -1 is not a rank (ranks are numbered from 0)", s.manifest, -1,
                 status=2)
    assert [e.name for e in s.manifest(numpy.int64(1))] == [e.name for e in s.manifest(1)]


@test
def shapes_and_offsets_take_no_bools():
    """describe()'s shape, offsets and global_shape, and push()'s offsets, are ints: a bool
    among them (True as a size of 1) is refused, as every integer argument refuses one."""
    need_numpy()
    src = synth("tiny-qwen3-moe")
    s = new_session(src, None, "vllm", "kernel", 2)
    described = description(src)
    name, dtype, shape = described[0]
    bad = [(name, dtype, (True,) + tuple(shape[1:]))] + described[1:]
    expect_error("%s: a shape is a sequence of ints >= 0" % name, s.describe, bad, kind=TypeError)
    expect_error("%s: a shape is a sequence of ints >= 0" % name, s.describe,
                 [(name, dtype, shape, [False] * len(shape), shape)], kind=TypeError)
    s.close()


@test
def session_torch_tensors_through_dlpack():
    """torch CPU tensors, bfloat16 included, pushed through DLPack (the object and its
    capsule) without a copy, give convert's files."""
    need_torch()
    src = synth("tiny-qwen3.5-moe")
    out = fresh_dir("sess-torch")
    ck = read_checkpoint(src)
    tensors = {name: torch.frombuffer(bytearray(raw), dtype=getattr(torch, TORCH_DTYPES[dtype])).reshape(shape)
               for name, (dtype, shape, raw) in ck.items()}
    with new_session(src, out, "vllm", "kernel", 2, 2) as s:
        s.describe(description(src))
        s.begin(1)
        for i, (name, t) in enumerate(sorted(tensors.items())):
            s.push(name, t.__dlpack__() if i % 2 else t)
        s.commit()
    assert_same_files(converted(src, "vllm", "kernel", 2, 2), out)


@test
def session_bytes_and_memoryviews():
    """bytes and memoryviews (BF16 as a memoryview cast to 'H') are pushed as well."""
    src = synth("tiny-qwen3-moe")
    out = fresh_dir("sess-bytes")
    with new_session(src, out, "vllm", "sharded-state", 2, 1) as s:
        s.describe(description(src))
        s.begin(1)
        for i, (name, (dtype, shape, raw)) in enumerate(sorted(read_checkpoint(src).items())):
            if i % 3 == 0:
                s.push(name, raw)
            elif i % 3 == 1:
                s.push(name, bytearray(raw))
            else:
                fmt = {"BF16": "H", "F32": "f"}[dtype]
                s.push(name, memoryview(raw).cast(fmt, shape) if shape else memoryview(raw).cast(fmt))
        s.commit()
    assert_same_files(converted(src, "vllm", "sharded-state", 2, 1), out)


@test
def session_without_numpy():
    """With numpy unimportable, wsync imports, does not import numpy, and a session fed
    bytes writes convert's files (a subprocess that blocks numpy)."""
    src = synth("tiny-qwen3-moe")
    out = fresh_dir("sess-nonumpy")
    code = r"""
import os, sys, json, struct
sys.modules["numpy"] = None  # import numpy raises ImportError
import wsync
assert "numpy" not in sys.modules or sys.modules["numpy"] is None
src, out, conf, plugins = sys.argv[1:5]
files = sorted(n for n in os.listdir(src) if n.endswith(".safetensors"))
tensors = {}
for n in files:
    data = open(os.path.join(src, n), "rb").read()
    h = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + h]); header.pop("__metadata__", None)
    for name, t in header.items():
        a, b = t["data_offsets"]
        tensors[name] = (t["dtype"], t["shape"], memoryview(data)[8 + h + a:8 + h + b])
s = wsync.Session(os.path.join(src, "config.json"), target="vllm", tp=2, out=out,
                  conf_dir=conf, plugin_dir=plugins)
s.describe((n, d, sh) for n, (d, sh, _) in tensors.items())
s.begin(5)
for n, (_, _, view) in tensors.items():
    s.push(n, view)
s.commit()
print("pushed", len(tensors))
"""
    env = dict(os.environ, PYTHONPATH=os.environ.get("WSYNC_TEST_PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code, src, out, CONF_DIR, PLUGIN_DIR],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                       env=env)
    assert r.returncode == 0 and r.stdout.startswith("pushed"), r.stderr
    assert_same_files(converted(src, "vllm", "sharded-state", 2, 1), out)


def open_step(out, config="tiny-qwen3-moe", **kw):
    """A session (vllm kernel tp 2) writing into out, described, with step 1 open."""
    src = synth(config)
    s = new_session(src, out, "vllm", "kernel", 2, 1, **kw)
    s.describe(description(src))
    s.begin(1)
    return s, src


@test
def session_push_refusals():
    """Wrong dtype, shape or byte count, a non-contiguous array, device memory, an
    unknown or repeated name, a push outside a step: wsync.Error with one line naming
    the tensor, and nothing written (the step goes on)."""
    need_numpy()
    out = fresh_dir("sess-refusals")
    s, src = open_step(out)
    t = arrays(src)
    name = "model.layers.0.self_attn.k_proj.weight"
    a = t[name]
    assert a.shape[0] != a.shape[1], a.shape
    rows, cols = a.shape
    expect_error('push: tensor "%s" is BF16 [%d, %d], but the buffer holds F32 elements' % (name, rows, cols),
                 s.push, name, a.astype("float32"), status=3)
    expect_error("but the buffer holds F16 elements (numpy has no such type",
                 s.push, name, a.view("float16"), status=3)
    expect_error('push: tensor "%s" is BF16 [%d, %d], but the buffer has shape [%d, %d]' % (name, rows, cols, cols, rows),
                 s.push, name, a.reshape(cols, rows), status=3)
    expect_error("(%d bytes), but the buffer holds %d bytes" % (a.nbytes, a.nbytes - 2),
                 s.push, name, a.ravel()[1:], status=3)
    expect_error('push: tensor "%s" is not C-contiguous' % name,
                 s.push, name, numpy.ascontiguousarray(a.T).T, status=3)
    expect_error('push: tensor "no.such.tensor"', s.push, "no.such.tensor", a, status=3)
    # the rejected pushes wrote nothing: every tensor once, then commit
    for n, arr in t.items():
        s.push(n, arr)
    expect_error('push: tensor "%s"' % name, s.push, name, a, status=3)  # repeated
    s.commit()
    assert_same_files(converted(src, "vllm", "kernel", 2, 1), out)
    expect_error("push: ", s.push, name, a, status=2)  # no open step
    s.close()
    expect_error("the session is closed", s.push, name, a, status=2)


class FakeDeviceTensor:
    """What a CUDA tensor shows DLPack consumers: a device type before any export."""

    def __dlpack_device__(self):
        return (2, 1)

    def __dlpack__(self, stream=None):
        raise AssertionError("a device tensor must be refused before __dlpack__")


def device_capsule(nbytes):
    """A DLPack capsule of a tensor on cuda:0, made with ctypes (what torch.cuda would
    hand over), and the objects that keep it alive."""
    class DLTensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                    ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                    ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                    ("shape", ctypes.POINTER(ctypes.c_int64)),
                    ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]

    class Managed(ctypes.Structure):
        _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                    ("deleter", ctypes.c_void_p)]

    shape = (ctypes.c_int64 * 1)(nbytes // 2)
    managed = Managed(DLTensor(None, 2, 0, 1, 4, 16, 1, shape, None, 0), None, None)
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(ctypes.addressof(managed), b"dltensor", None), (managed, shape)


@test
def session_device_memory_refused():
    """A tensor in device memory (an object whose __dlpack_device__ says cuda, or a
    DLPack capsule of one) is refused with a message saying so."""
    s, src = open_step(fresh_dir("sess-device"))
    name = "model.norm.weight"
    expect_error('push: tensor "%s" is in device memory (DLPack device 2, cuda:1)' % name,
                 s.push, name, FakeDeviceTensor(), status=3)
    capsule, keep = device_capsule(128)
    expect_error('push: tensor "%s" is in device memory (DLPack device 2, cuda:0)' % name,
                 s.push, name, capsule, status=3)
    expect_error("wsync takes a buffer (numpy array, memoryview, bytes) or a DLPack tensor",
                 s.push, name, 3.5, status=3)
    s.close()


def _ctrl_c_during(fn, *args, sig=signal.SIGINT, handler=signal.default_int_handler,
                   kind=KeyboardInterrupt):
    """fn(*args) with sig (SIGINT) sent to this process 50 ms after the call began, from
    another thread, handler handling it; returns whether it raised kind
    (KeyboardInterrupt), and how long it ran."""
    previous = signal.signal(sig, handler)  # not SIG_IGN (make's)
    started = threading.Event()

    def interrupt():
        started.wait()
        time.sleep(0.05)
        os.kill(os.getpid(), sig)

    sender = threading.Thread(target=interrupt)
    sender.start()
    began = time.monotonic()
    try:
        started.set()
        fn(*args)
        time.sleep(1)  # the handler's KeyboardInterrupt, if fn returned first
    except kind:
        return True, time.monotonic() - began
    finally:
        sender.join()
        signal.signal(sig, previous)
    return False, time.monotonic() - began


class Terminated(Exception):
    pass


def _raise_terminated(signum, frame):
    raise Terminated(signum)


class _Handler:
    def on_signal(self, signum, frame):
        raise Terminated(signum)

    def __call__(self, signum, frame):
        raise Terminated(signum)


@test
def session_names_the_signal_whose_handler_raised():
    """A push or commit stopped by a SIGTERM handler that raises fails the step with an
    error naming SIGTERM, whatever the handler (a function, a bound method, a callable
    object); a handler that cannot be told from the others (a functools.partial) gives
    "interrupted by a signal", naming none.  (Before: "interrupted by SIGINT" whichever
    signal's handler raised.)"""
    need_numpy()
    import functools
    src = synth("tiny-qwen3-moe")
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    vocab = config["vocab_size"] = 1 << 21  # 256 MiB of BF16 embedding and as much lm_head
    big_dir = fresh_dir("sigterm-config")
    os.makedirs(big_dir)
    with open(os.path.join(big_dir, "config.json"), "w") as f:
        json.dump(config, f)
    big = "model.embed_tokens.weight"
    described = [(n, d, (vocab,) + tuple(shape[1:]) if n in (big, "lm_head.weight") else shape)
                 for n, d, shape in description(src)]
    zeros = {n: numpy.zeros(shape, dtype=NUMPY_DTYPES[d]) for n, d, shape in described}
    s = wsync.Session(os.path.join(big_dir, "config.json"), target="vllm", format="kernel",
                      out=fresh_dir("sigterm"), threads=1, **KW)
    s.describe(described)
    for step, (handler, named) in enumerate(((_raise_terminated, "SIGTERM"),
                                             (_Handler().on_signal, "SIGTERM"),
                                             (_Handler(), "SIGTERM"),
                                             (functools.partial(_raise_terminated), "a signal")), 1):
        s.begin(step)
        for n, _, _ in described:
            if n != big:
                s.push(n, zeros[n])
        heard, took = _ctrl_c_during(s.push, big, zeros[big], sig=signal.SIGTERM, handler=handler,
                                     kind=Terminated)
        assert heard and took < 1, (handler, heard, took)
        expect_error('commit: step %d failed (push: tensor "%s": interrupted by %s (abort the '
                     'step)): abort it' % (step, big, named), s.commit, status=2)
        s.abort()
    s.begin(9)
    for n, _, _ in described:
        s.push(n, zeros[n])
    heard, took = _ctrl_c_during(s.commit, sig=signal.SIGTERM, handler=_raise_terminated,
                                 kind=Terminated)
    assert heard, took
    expect_error("commit: step 9 failed (commit: step 9: interrupted by SIGTERM: no commit "
                 "record was written (abort the step)): abort it", s.commit, status=2)
    s.abort()
    s.close()


@test
def session_push_and_commit_hear_ctrl_c():
    """Ctrl-C (SIGINT from another thread) during a long push or commit of the directory
    sink, called from the main thread, raises KeyboardInterrupt there within a fraction
    of the call: the push stops and fails the step, the commit stops before the commit
    record (there is none since begin: readers wait, docs/session.md section 4); abort()
    then closes the step, as after any failed push."""
    need_numpy()
    src = synth("tiny-qwen3-moe")
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    vocab = config["vocab_size"] = 1 << 21  # 256 MiB of BF16 embedding and as much lm_head
    big_dir = fresh_dir("ctrl-c-config")
    os.makedirs(big_dir)
    with open(os.path.join(big_dir, "config.json"), "w") as f:
        json.dump(config, f)
    big = ("model.embed_tokens.weight", "lm_head.weight")
    described = [(n, d, (vocab,) + tuple(shape[1:]) if n in big else shape)
                 for n, d, shape in description(src)]
    out = fresh_dir("ctrl-c")
    s = wsync.Session(os.path.join(big_dir, "config.json"), target="vllm", format="kernel",
                      out=out, threads=1, **KW)
    s.describe(described)
    zeros = {n: numpy.zeros(shape, dtype=NUMPY_DTYPES[d]) for n, d, shape in described}

    s.begin(1)
    for n, _, _ in described:
        if n != big[0]:
            s.push(n, zeros[n])
    heard, took = _ctrl_c_during(s.push, big[0], zeros[big[0]])
    assert heard and took < 1, (heard, took)
    expect_error('commit: step 1 failed (push: tensor "%s": interrupted by SIGINT (abort the '
                 'step)): abort it' % big[0], s.commit, status=2)
    assert not os.path.exists(os.path.join(out, "wsync-commit.json"))
    s.abort()

    s.begin(2)
    for n, _, _ in described:
        s.push(n, zeros[n])
    heard, took = _ctrl_c_during(s.commit)
    assert heard, took
    assert not os.path.exists(os.path.join(out, "wsync-commit.json")), "a record was written"
    expect_error("commit: step 2 failed (commit: step 2: interrupted by SIGINT: no commit record "
                 "was written (abort the step)): abort it", s.commit, status=2)
    s.abort()
    s.begin(3)
    s.close()


@test
def session_hears_ctrl_c_in_a_child_forked_from_a_thread():
    """A child forked from a thread other than the main one (that thread is the child's
    main thread: threading.main_thread(), where Python runs signal handlers) hears
    Ctrl-C during a long push as the main thread of any process does: KeyboardInterrupt,
    the step failed.  (Before: the main thread's identity was kept from the first call,
    the parent's main thread, so in such a child the push ran to its end and the step
    was not failed: commit wrote the record.)"""
    need_numpy()
    src = synth("tiny-qwen3-moe")
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    vocab = config["vocab_size"] = 1 << 21  # 256 MiB of BF16 embedding and as much lm_head
    big_dir = fresh_dir("ctrl-c-thread-fork-config")
    os.makedirs(big_dir)
    with open(os.path.join(big_dir, "config.json"), "w") as f:
        json.dump(config, f)
    big = ("model.embed_tokens.weight", "lm_head.weight")
    described = [(n, d, (vocab,) + tuple(shape[1:]) if n in big else shape)
                 for n, d, shape in description(src)]
    out = fresh_dir("ctrl-c-thread-fork")
    # a commit (a call that may hear Ctrl-C) in the parent's main thread first
    s = new_session(src, fresh_dir("ctrl-c-thread-fork-parent"), "vllm", "kernel", threads=1)
    s.describe(description(src))
    expect_error("commit: no step is open", s.commit, status=2)
    s.close()
    zeros = {n: numpy.zeros(shape, dtype=NUMPY_DTYPES[d]) for n, d, shape in described}

    def child():
        s = wsync.Session(os.path.join(big_dir, "config.json"), target="vllm",
                          format="kernel", out=out, threads=1, **KW)
        s.describe(described)
        s.begin(1)
        for n, _, _ in described:
            if n != big[0]:
                s.push(n, zeros[n])
        heard, took = _ctrl_c_during(s.push, big[0], zeros[big[0]])
        assert heard, took
        expect_error('commit: step 1 failed (push: tensor "%s": interrupted by SIGINT' % big[0],
                     s.commit, status=2)
        s.abort()
        s.close()

    status = []

    def fork_here():
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                child()
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        status.append(os.waitpid(pid, 0)[1])

    forker = threading.Thread(target=fork_here)
    forker.start()
    forker.join(120)
    assert not forker.is_alive(), "the child did not end in 120 s"
    assert os.WIFEXITED(status[0]) and os.WEXITSTATUS(status[0]) == 0, status
    assert not os.path.exists(os.path.join(out, "wsync-commit.json"))


@test
def session_push_in_a_forked_child():
    """A process forked after the main thread pushed and committed (a DataLoader or
    multiprocessing worker) pushes and commits from its own main thread too.  (Before:
    the call that hears Ctrl-C ran on a GThreadPool thread; the child inherited the
    pool's idle thread count without the thread, and its first push waited forever.)"""
    need_numpy()
    src = synth("tiny-qwen3-moe")
    described = description(src)

    def one_step(out, threads):
        s = new_session(src, out, "vllm", "kernel", threads=threads)
        s.describe(described)
        s.begin(1)
        for n, d, shape in described:
            s.push(n, numpy.zeros(shape, dtype=NUMPY_DTYPES[d]))
        s.commit()
        s.close()

    # threads=1: no helper threads; threads=2: one helper (the session had used a
    # GThreadPool, whose idle-thread state a child inherits without the threads: the
    # child's close() waited for ever for a thread of its parent's)
    # (the hang came in most runs, not all: threads=2 is forked four times)
    for threads in (1, 2, 2, 2, 2):
        one_step(fresh_dir("fork-parent-%d" % threads), threads)
        child_out = fresh_dir("fork-child-%d" % threads)
        pid = os.fork()
        if pid == 0:
            try:
                one_step(child_out, threads)
                os._exit(0)
            except BaseException:
                os._exit(1)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError("threads=%d: the forked child's push, commit or close did "
                                 "not return in 30 s" % threads)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (threads, status)
        assert os.path.exists(os.path.join(child_out, "wsync-commit.json"))


@test
def session_closed_in_a_forked_child():
    """A session made (with helper threads) before a fork, closed by the child (os.fork()
    and a normal exit, which frees it, or an explicit close()): the child says nothing
    and exits 0, and the parent's session goes on.  (Before: the child joined its
    parent's threads and freed their queue: GLib-CRITICAL "g_async_queue_unref:
    assertion 'queue->waiting_threads == 0' failed", or an abort in pthread_join.)"""
    need_numpy()
    src = synth("tiny-qwen3-moe")
    described = description(src)
    out = fresh_dir("fork-inherited")
    s = new_session(src, out, "vllm", "kernel", threads=3)
    s.describe(described)

    def one_step(version):
        s.begin(version)
        for n, d, shape in described:
            s.push(n, numpy.zeros(shape, dtype=NUMPY_DTYPES[d]))
        s.commit()

    one_step(1)
    stderr_path = os.path.join(TMP, "fork-inherited.stderr")
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 2)
            one_step(2)
            s.close()
            os._exit(0)
        except BaseException:
            os._exit(1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise AssertionError("the forked child's close() did not return in 30 s")
    with open(stderr_path) as f:
        said = f.read()
    assert said == "", said
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert json.load(open(os.path.join(out, "wsync-commit.json")))["version"] == 2
    one_step(3)
    s.close()
    assert json.load(open(os.path.join(out, "wsync-commit.json")))["version"] == 3


@test
def session_torch_refusals():
    """torch: a tensor that requires grad cannot be exported (torch says use detach());
    a float32 tensor for a BF16 one is refused by dtype."""
    need_torch()
    s, src = open_step(fresh_dir("sess-torch-refusals"))
    name = "model.norm.weight"
    dtype, shape, raw = read_checkpoint(src)[name]
    param = torch.nn.Parameter(torch.zeros(shape, dtype=torch.bfloat16))
    expect_error('push: tensor "%s": __dlpack__() failed' % name, s.push, name, param, status=3)
    expect_error('push: tensor "%s" is BF16 [%d], but the buffer holds F32 elements' % (name, shape[0]),
                 s.push, name, torch.zeros(shape), status=3)
    s.push(name, param.detach())
    s.close()


@test
def session_commit_missing_tensor():
    """commit with a tensor not pushed names it; the step stays open (no record), and
    pushing it lets the commit through."""
    need_numpy()
    out = fresh_dir("sess-missing")
    s, src = open_step(out)
    t = arrays(src)
    missing = sorted(t)[5]
    for n, arr in t.items():
        if n != missing:
            s.push(n, arr)
    e = expect_error("commit: step 1", s.commit, status=3)
    assert missing in str(e), str(e)
    assert not os.path.exists(os.path.join(out, "wsync-commit.json"))
    s.push(missing, t[missing])
    s.commit()
    assert record(out)["version"] == 1
    expect_error("version must be a step number (an int or its decimal text), not -1",
                 s.begin, -1, status=2)
    s.close()


@test
def session_describe_refusals():
    """describe: an unknown dtype, a missing tensor the target needs, a bad item."""
    src = synth("tiny-qwen3-moe")
    desc = description(src)
    s = new_session(src, None)
    expect_error('dtype "BF17" is not a safetensors dtype', s.describe, [("x", "BF17", (2,))], status=2)
    s = new_session(src, None)
    expect_error('tensor "%s"' % desc[0][0], s.describe, desc[1:], status=3)
    s = new_session(src, None)
    expect_error("", s.describe, [("x", "BF16")], kind=TypeError)
    expect_error("no loaded plugin provides the target", wsync.Session,
                 os.path.join(src, "config.json"), target="nope", **KW)
    # the layout options are named as the keyword arguments they are, not as the
    # command's flags ("--tp")
    e = expect_error("tp must be a number from 1 to 4096", wsync.Session,
                     os.path.join(src, "config.json"), target="vllm", tp=0, **KW)
    assert "--tp" not in str(e), str(e)
    e = expect_error("part_size must be a size from 1 byte to 2^64-1 bytes", wsync.plan, src, target="vllm",
                     part_size=0, **KW)
    assert "--part-size" not in str(e), str(e)


def collect_buckets(src, target, fmt, tp, ep, bucket_bytes, keep=None, order_seed=0):
    buckets = []

    def sink(b):
        assert isinstance(b, wsync.Bucket)
        buckets.append((b.version, b.rank, b.file, b.file_offset, bytes(b.data), b.entries))
        if keep is not None:
            keep.append(numpy.frombuffer(b.data, dtype="uint8"))

    s = new_session(src, sink, target, fmt, tp, ep, bucket_bytes=bucket_bytes)
    s.describe(description(src))
    s.begin(3)
    push_all(s, arrays(src), order_seed=order_seed)
    s.commit()
    s.close()
    return buckets


@test
def session_callback_sink():
    """The callback receives buckets of whole tensors, at most bucket_bytes unless one
    tensor is larger, whose manifest slices cover them exactly; concatenated per rank
    file they are exactly the data of the directory sink's files."""
    need_numpy()
    src = synth("tiny-qwen3-moe")
    want = converted(src, "vllm", "kernel", 2, 2)
    size = 4096
    got = {}
    for version, rank, file, offset, data, entries in collect_buckets(src, "vllm", "kernel", 2, 2, size, order_seed=5):
        assert version == 3
        assert len(data) <= size or len(entries) == 1, (file, offset, len(data), len(entries))
        assert entries[0].offset == offset, (entries[0], offset)
        end = offset
        for e in entries:
            assert e.offset == end and e.file == file, (e, end)
            end += e.nbytes
        assert end == offset + len(data)
        got.setdefault((rank, file), []).append((offset, data))
    for name in rank_files(want):
        _, tensors, header = read_safetensors(os.path.join(want, name))
        with open(os.path.join(want, name), "rb") as f:
            body = f.read()[header:]
        rank = [r for (r, n) in got if n == name]
        assert len(rank) == 1, (name, rank)
        parts = sorted(got[(rank[0], name)])
        assert parts[0][0] == header, (name, parts[0][0], header)
        assert b"".join(d for _, d in parts) == body, name


@test
def session_callback_errors():
    """A callback that raises: push raises that exception as it is, and after abort()
    the next step runs.  A callback that keeps a view of the bucket: wsync.Error says
    the memory is freed."""
    need_numpy()
    src = synth("tiny-qwen3-moe")
    calls = []

    def failing(b):
        calls.append(b.rank)
        if len(calls) == 1:
            raise ValueError("the NCCL group is gone")

    s = new_session(src, failing, "vllm", "kernel", 2, 1, bucket_bytes=1)
    s.describe(description(src))
    s.begin(1)
    t = arrays(src)
    expect_error("the NCCL group is gone", push_all, s, t, kind=ValueError)
    s.abort()
    s.begin(2)
    push_all(s, t)
    s.commit()
    s.close()
    kept = []
    expect_error("is still referenced after the callback returned", collect_buckets, src,
                 "vllm", "kernel", 2, 1, 1 << 20, keep=kept, status=2)
    # the callback runs inside push or commit: calling the session from it is refused
    s = new_session(src, lambda b: s.commit(), "vllm", "kernel", 2, 1)
    s.describe(description(src))
    s.begin(1)
    expect_error("the bucket callback cannot call the session", push_all, s, arrays(src), status=2)
    s.close()
    # keeping the Bucket itself is fine: its data is released, not dangling
    buckets = []
    s = new_session(src, buckets.append, "vllm", "kernel", 2, 1)
    s.describe(description(src))
    s.begin(1)
    push_all(s, arrays(src))
    s.commit()
    assert buckets and buckets[0].entries[0].nbytes > 0
    expect_error("released", bytes, buckets[0].data, kind=ValueError)


@test
def session_callback_exception_is_its_own_calls():
    """The exception a bucket callback raises is raised by the push that ran it (the
    callback runs on the pushing thread), exactly once, and by no other call: pushes on
    several threads at once, each callback raising ValueError(its thread's name), and
    another thread pushing an undescribed name meanwhile.  Every push raises its own
    thread's ValueError, or wsync.Error saying the step failed and what the callback
    raised; every ValueError raised by a callback is raised by one push; the undescribed
    name is refused as such, always.  (Before: the exception waited in one slot of the
    session: a push of another thread that failed first took it, the undescribed name
    raised another thread's ValueError, and a second callback's exception replaced the
    first's, which was lost; the step's failure said only "bucket callback raised an
    exception".)  Many steps, since it is a race."""
    need_numpy()
    src = synth("tiny-qwen3-moe")
    tensors = arrays(src)
    raised = []

    def sink(b):
        name = threading.current_thread().name
        raised.append(name)
        raise ValueError(name)

    s = new_session(src, sink, "vllm", "kernel", 1, 1, bucket_bytes=1)
    s.describe(description(src))
    names = list(tensors)
    wrong = []
    failed_step = re.compile(r'^push: tensor "[^"]+": step \d+ failed \(bucket of rank 0, '
                             r'[^ ]+ at \d+: bucket callback raised ValueError: pusher-\d+\): '
                             r'abort it$')
    for version in range(200):
        raised.clear()
        s.begin(version)
        outcomes = []
        barrier = threading.Barrier(5)
        done = threading.Event()

        def pusher(i):
            barrier.wait()
            for name in names[i::4]:
                try:
                    s.push(name, tensors[name])
                except ValueError as e:
                    outcomes.append(("ValueError", str(e), threading.current_thread().name))
                    return
                except wsync.Error as e:
                    outcomes.append(("Error", str(e), threading.current_thread().name))
                    return

        def typo():
            barrier.wait()
            while not done.is_set():
                try:
                    s.push("no.such.tensor", b"")
                except BaseException as e:  # noqa: B902 -- whatever it raised is the test
                    if type(e) is not wsync.Error or str(e) != 'push: tensor "no.such.tensor" was not described':
                        wrong.append("the undescribed name raised %r" % e)

        threads = [threading.Thread(target=pusher, args=(i,), name="pusher-%d" % i) for i in range(4)]
        stealer = threading.Thread(target=typo)
        for t in threads + [stealer]:
            t.start()
        for t in threads:
            t.join()
        done.set()
        stealer.join()
        s.abort()
        for kind, text, thread in outcomes:
            if kind == "ValueError" and text != thread:
                wrong.append("%s raised %s's ValueError" % (thread, text))
            elif kind == "Error" and not failed_step.match(text):
                wrong.append("%s: %s" % (thread, text))
        got = sorted(text for kind, text, _ in outcomes if kind == "ValueError")
        if got != sorted(raised):
            wrong.append("callbacks raised %s, pushes %s" % (sorted(raised), got))
        if wrong:
            break
    s.close()
    assert not wrong, wrong[:5]


@test
def session_callback_pushing_into_another_session():
    """A callback that pushes into another session whose own callback raises: that push
    raises its callback's exception, which, not caught, is what the outer push raises,
    exactly; each session's next push says its step failed and why; after abort() and
    begin() nothing of it is left, and the next step commits."""
    need_numpy()
    src = synth("tiny-qwen3-moe")
    tensors = arrays(src)
    names = list(tensors)

    def inner_sink(b):
        raise KeyError("inner %d" % b.version)

    inner = new_session(src, inner_sink, "vllm", "kernel", 1, 1, bucket_bytes=1)
    inner.describe(description(src))

    def outer_sink(b):
        inner.push(names[0], tensors[names[0]])

    outer = new_session(src, outer_sink, "vllm", "kernel", 1, 1, bucket_bytes=1)
    outer.describe(description(src))
    inner.begin(7)
    outer.begin(8)
    e = expect_error("'inner 7'", push_all, outer, tensors, kind=KeyError)
    assert type(e) is KeyError and e.args == ("inner 7",), repr(e)
    for s, version in ((inner, 7), (outer, 8)):
        e = expect_error("", s.push, names[1], tensors[names[1]], status=2)
        assert re.match(r'^push: tensor "%s": step %d failed \(bucket of rank 0, [^ ]+ at \d+: '
                        r"bucket callback raised KeyError: 'inner 7'\): abort it$"
                        % (re.escape(names[1]), version), str(e)), str(e)
        s.abort()
    outer.close()
    inner.close()
    # the same session again, after abort(): the callback's old exception is gone
    calls = []

    def once(b):
        calls.append(b.version)
        if b.version == 1:
            raise RuntimeError("only in step 1")

    s = new_session(src, once, "vllm", "kernel", 1, 1, bucket_bytes=1)
    s.describe(description(src))
    s.begin(1)
    e = expect_error("only in step 1", push_all, s, tensors, kind=RuntimeError)
    assert type(e) is RuntimeError and e.args == ("only in step 1",), repr(e)
    s.abort()
    s.begin(2)
    push_all(s, tensors)
    s.commit()
    s.close()
    assert calls[0] == 1 and set(calls[1:]) == {2}, calls


@test
def session_describe_hears_ctrl_c_while_it_plans():
    """Ctrl-C while describe() plans raises KeyboardInterrupt and stops the plan: the
    session then refuses to plan again ("failed to plan (make a new one)"), closes, and
    leaves no file, no directory and no thread behind.  (Before: the plan ran on the
    caller's thread without hearing the signal; Ctrl-C was heard only once it had ended,
    and the session had planned.)  The signal comes from the test hook
    WSYNC_TEST_SIGNAL_AT=binding (wsync(1)), as the plan begins to bind the tensors, so
    that no timing decides where it lands; in a child process."""
    need_numpy()
    src = synth("tiny-qwen3-moe")
    parent = fresh_dir("describe-ctrl-c")
    os.makedirs(parent)
    items = os.path.join(parent, "items.json")
    with open(items, "w") as f:
        json.dump(list(description(src)), f)
    script = """if True:
        import json, os, sys, wsync
        config, items, out, conf_dir, plugin_dir = sys.argv[1:6]
        kw = dict(target="vllm", format="kernel", tp=2, conf_dir=conf_dir, plugin_dir=plugin_dir)
        with open(items) as f:
            described = [tuple(i) for i in json.load(f)]
        wsync.Session(config, out=out, **kw).describe(described)  # the threads it keeps
        threads = len(os.listdir("/proc/self/task"))
        s = wsync.Session(config, out=out, **kw)
        os.environ["WSYNC_TEST_SIGNAL_AT"] = "binding"
        try:
            s.describe(described)
            outcome = "returned"
        except KeyboardInterrupt as e:
            outcome = repr(e)
        del os.environ["WSYNC_TEST_SIGNAL_AT"]
        try:
            s.describe(described[:1])
            again = "described"
        except wsync.Error as e:
            again = str(e)
        s.close()
        print(json.dumps([outcome, again, os.path.exists(out),
                          len(os.listdir("/proc/self/task")) - threads]))
    """
    out = os.path.join(parent, "out")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), WSYNC_PLUGIN_PATH="")
    r = subprocess.run([sys.executable, "-c", script, os.path.join(src, "config.json"), items,
                        out, CONF_DIR, PLUGIN_DIR], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, timeout=600)
    assert r.returncode == 0, r.stderr
    outcome, again, out_exists, more_threads = json.loads(r.stdout)
    assert outcome == "KeyboardInterrupt()", outcome
    name = list(description(src))[0][0]
    assert again == ('describe: tensor "%s": the session has failed to plan (make a new one)'
                     % name), again
    assert not out_exists and sorted(os.listdir(parent)) == ["items.json"]
    assert more_threads == 0, "%d threads more than before" % more_threads


@test
def session_closed_by_another_thread_while_it_plans():
    """close() from another thread while describe() plans (or reads the items) waits for
    it, or makes it raise "the session is closed"; it never frees the session under the
    call.  The plan, digest, world and manifest read the session under its lock too, and
    a bucket callback still reads digest and world (it runs under the push's lock).
    (Before: describe() called wsync_session_describe() and wsync_session_plan()
    without the session's lock, and a close() meanwhile freed the session under them:
    SIGSEGV.)  In a child process with freed memory scribbled over (MALLOC_PERTURB_),
    twenty times, so that a use after free crashes."""
    script = """if True:
        import json, sys, threading, wsync
        config, conf_dir, plugin_dir, described = sys.argv[1:5]
        described = json.loads(described)
        kw = dict(target="vllm", format="kernel", tp=2, conf_dir=conf_dir, plugin_dir=plugin_dir)
        outcomes = set()
        for trial in range(20):
            s = wsync.Session(config, **kw)
            closer = threading.Thread(target=s.close)
            def items():
                yield from ((name, dtype, shape) for name, dtype, shape, _ in described)
                closer.start()  # it runs when describe() lets go of the GIL to plan
            try:
                s.describe(items())
                outcomes.add("planned")
            except wsync.Error as e:
                assert (str(e), e.exit_status) == ("the session is closed", 2), str(e)
                outcomes.add("closed")
            closer.join()
            for read in (lambda: s.digest, lambda: s.world, lambda: s.manifest(0)):
                try:
                    read()
                    raise AssertionError("no error")
                except wsync.Error as e:
                    assert str(e) == "the session is closed", str(e)
        seen = []
        def look(bucket):
            seen.append((s.world, len(s.digest)))
        s = wsync.Session(config, out=look, **kw)
        s.describe((name, dtype, shape) for name, dtype, shape, _ in described)
        s.begin(1)
        for name, _, _, nbytes in described:
            s.push(name, bytes(nbytes))
        s.commit()
        assert seen and set(seen) == {(2, 64)}, seen
        s.close()
        print(" ".join(sorted(outcomes)))
    """
    src = synth("tiny-qwen3-moe")
    described = [(name, dtype, shape, len(raw))
                 for name, (dtype, shape, raw) in sorted(read_checkpoint(src).items())]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), WSYNC_PLUGIN_PATH="",
               MALLOC_PERTURB_="165", G_SLICE="always-malloc")
    try:
        r = subprocess.run([sys.executable, "-c", script, os.path.join(src, "config.json"),
                            CONF_DIR, PLUGIN_DIR, json.dumps(described)], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise AssertionError("the session hung") from None
    assert r.returncode == 0, "exit %d: %s" % (r.returncode, r.stderr)
    assert r.stderr == "", r.stderr
    assert r.stdout.strip() in ("planned", "closed", "closed planned"), r.stdout


@test
def session_closed_and_context_manager():
    """close() twice is fine; every other call on a closed session raises wsync.Error
    "the session is closed" (status 2), never crashes; `with` closes the session.  A
    bucket callback that closes the session, by close() or by leaving a `with` block of
    it, is refused instead of waiting for ever on the push that runs it.  (Before:
    __exit__ from the callback hung the process.)  Checked in a child process with a
    time limit, so that a hang fails the test."""
    script = """if True:
        import json, os, sys, wsync
        config, conf_dir, plugin_dir, described = sys.argv[1:5]
        described = json.loads(described)
        kw = dict(target="vllm", format="kernel", tp=2, conf_dir=conf_dir, plugin_dir=plugin_dir)
        with wsync.Session(config, **kw) as s:
            assert s.world == 0 and s.digest is None
        s.close()
        s.close()
        for call in (lambda: s.digest, lambda: s.world, lambda: s.describe([]),
                     lambda: s.manifest(0), lambda: s.begin(1), lambda: s.push("x", b""),
                     lambda: s.commit(), lambda: s.abort()):
            try:
                call()
                raise AssertionError("no error")
            except wsync.Error as e:
                assert (str(e), e.exit_status) == ("the session is closed", 2), str(e)
        names = []
        def leave(bucket):
            names.append(bucket.entries[0].name)
            with s:
                pass
        s = wsync.Session(config, out=leave, **kw)
        s.describe(described)
        s.begin(1)
        try:
            for name, dtype, shape in described:  # BF16 and F32 only
                n = 2 if dtype == "BF16" else 4
                for d in shape:
                    n *= d
                s.push(name, bytes(n))
            raise AssertionError("no error")
        except wsync.Error as e:
            print(str(e), e.exit_status, names)
        s.abort()
        s.close()
    """
    src = synth("tiny-qwen3-moe")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), WSYNC_PLUGIN_PATH="")
    described = description(src)
    assert {d for _, d, _ in described} <= {"BF16", "F32"}, described
    try:
        r = subprocess.run([sys.executable, "-c", script, os.path.join(src, "config.json"),
                            CONF_DIR, PLUGIN_DIR, json.dumps(described)], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("the session hung") from None
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith("the bucket callback cannot call the session 2 "), r.stdout


# ------------------------------------------------------------------ load_rank

def committed_dir(config="tiny-qwen3-moe", fmt="kernel", tp=2, ep=1, version=1, target="vllm",
                  conf_dir=None):
    src = synth(config)
    out = fresh_dir("committed-%s-%s-%s-%d-%d%s" % (config, target, fmt, tp, ep,
                                                     "-" + os.path.basename(conf_dir) if conf_dir else ""))
    kw = {"conf_dir": conf_dir} if conf_dir else {}
    with wsync.Session(os.path.join(src, "config.json"), target=target, format=fmt, tp=tp, ep=ep,
                       out=out, **dict(KW, **kw)) as s:
        s.describe(description(src))
        s.begin(version)
        if numpy is not None:
            push_all(s, arrays(src))
        else:
            for name, (_, _, raw) in read_checkpoint(src).items():
                s.push(name, raw)
        s.commit()
        digest = s.digest
    return out, digest


def rank_tensors(path, rank):
    """{name: (dtype, shape, bytes)} of the rank's files, read with the format only."""
    out = {}
    for f in record(path)["files"] if os.path.exists(os.path.join(path, "wsync-commit.json")) else []:
        if f["rank"] == rank:
            out.update(read_safetensors(os.path.join(path, f["file"]))[1])
    return out


def zero_arrays(tensors):
    return {n: numpy.zeros(shape, dtype=NUMPY_DTYPES[d]) for n, (d, shape, _) in tensors.items()}


@test
def load_rank_numpy():
    """load_rank fills numpy arrays (BF16 as uint16) with exactly the rank's tensors and
    returns the commit record; extra entries in params are left alone."""
    need_numpy()
    path, digest = committed_dir()
    for rank in (0, 1):
        want = rank_tensors(path, rank)
        params = zero_arrays(want)
        params["something.else"] = numpy.full(3, 7, dtype="int64")
        r = wsync.load_rank(path, rank, params, version=1, digest=digest)
        assert r["version"] == 1 and r["digest"] == digest, r
        for n, (_, _, raw) in want.items():
            assert params[n].tobytes() == raw, n
        assert params["something.else"].tolist() == [7, 7, 7]


@test
def rank_files_readinto_refuses_ranges_outside_the_entry():
    """files.readinto (what load_rank copies torch parameters through) refuses a range
    outside the entry or longer than the buffer, naming both numbers as given.  (Before:
    the message printed offset + length, which overflowed: "bytes 4611686018427387904 to
    -9223372036854775808".)"""
    path, _ = committed_dir()
    import _wsync
    files = _wsync._open_rank(path, 0, **KW)
    name, dtype, shape, _ = files.entries[0]
    itemsize = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4}[dtype]
    nbytes = itemsize
    for d in shape:
        nbytes *= d
    buf = bytearray(16)
    files.readinto(0, nbytes - 16, 16, buf)
    files.readinto(0, nbytes, 0, buf)
    for offset, length in ((-1, 1), (0, -1), (nbytes - 15, 16), (0, 17), (2 ** 62, 2 ** 62)):
        try:
            files.readinto(0, offset, length, buf)
        except ValueError as e:
            want = ("readinto: %d bytes from byte %d of a tensor of %d bytes into a buffer of 16"
                    % (length, offset, nbytes))
            assert str(e) == want, (str(e), want)
        else:
            raise AssertionError("readinto(0, %d, %d) was not refused" % (offset, length))


@test
def rank_files_calls_refuse_a_bool_index():
    """The internal calls load_rank copies through (files.check, files.copy,
    files.readinto) refuse a bool where they take an entry index, an offset or a length,
    as the public calls refuse one, and copy nothing.  (Before: True was taken as entry 1
    and False as entry 0.)"""
    need_numpy()
    path, _ = committed_dir()
    import _wsync
    files = _wsync._open_rank(path, 0, **KW)
    _, dtype, shape, _ = files.entries[1]
    dest = numpy.zeros(shape, dtype=NUMPY_DTYPES[dtype])
    for call in (files.check, files.copy):
        expect_error("index must be an int, not bool", call, [(True, dest)], kind=TypeError)
    assert not dest.any()
    buf = bytearray(16)
    for args, what in (((True, 0, 2), "index"), ((0, False, 2), "offset"), ((0, 0, True), "length")):
        expect_error("readinto: %s must be an int, not bool" % what, files.readinto, *args, buf,
                     kind=TypeError)
    assert buf == bytearray(16)
    files.copy([(numpy.int64(1), dest)])  # numpy's integers are still indices
    assert dest.any()


def torch_model(tensors):
    """A module tree with a zero parameter at every dotted name."""
    root = torch.nn.Module()
    for name, (dtype, shape, _) in tensors.items():
        *path, leaf = name.split(".")
        mod = root
        for p in path:
            if p not in mod._modules:
                mod.add_module(p, torch.nn.Module())
            mod = mod._modules[p]
        mod.register_parameter(leaf, torch.nn.Parameter(torch.zeros(shape, dtype=getattr(torch, TORCH_DTYPES[dtype]))))
    return root


def torch_bytes(t):
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


@test
def load_rank_torch_module():
    """load_rank into a torch module (get_parameter resolves the names): bf16 and f32
    parameters get exactly the rank's bytes, copied with param.copy_() from the staging
    buffer (load_rank_torch_copies_in_bounded_pieces), without a warning."""
    need_torch()
    import warnings
    path, digest = committed_dir("tiny-qwen3.5-moe", "kernel", 2, 2)
    for rank in range(2):
        want = rank_tensors(path, rank)
        model = torch_model(want)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            wsync.load_rank(path, rank, model, digest=digest)
        for n, (_, _, raw) in want.items():
            assert torch_bytes(model.get_parameter(n)) == raw, n
    # a mapping of torch tensors works as well
    want = rank_tensors(path, 1)
    params = {n: torch.zeros(shape, dtype=getattr(torch, TORCH_DTYPES[d])) for n, (d, shape, _) in want.items()}
    wsync.load_rank(path, 1, params)
    assert all(torch_bytes(params[n]) == raw for n, (_, _, raw) in want.items())


@test
def load_rank_refusals():
    """A missing name, a wrong shape or dtype, no commit record, another version or
    digest, a rank the record lacks, a file changed after its commit: refused before
    anything is copied, naming the file and the tensor."""
    need_numpy()
    path, digest = committed_dir()
    want = rank_tensors(path, 0)
    names = list(want)
    first = [f["file"] for f in record(path)["files"] if f["rank"] == 0][0]
    where = os.path.join(path, first)

    params = zero_arrays(want)
    del params[names[-1]]
    expect_error('tensor "%s": params has no entry of that name' % names[-1], wsync.load_rank,
                 path, 0, params, status=3)
    assert all(not a.any() for a in params.values()), "copied before refusing"

    params = zero_arrays(want)
    d, shape, _ = want[names[0]]
    params[names[0]] = numpy.zeros(tuple(reversed(shape)), dtype=NUMPY_DTYPES[d])
    if len(shape) > 1 and shape[0] != shape[1]:
        expect_error('%s: tensor "%s" is %s %s, but the buffer has shape' % (where, names[0], d, list(shape)),
                     wsync.load_rank, path, 0, params, status=3)
    params[names[0]] = numpy.zeros(shape, dtype="float32")
    expect_error('tensor "%s" is %s' % (names[0], d), wsync.load_rank, path, 0, params, status=3)
    params[names[0]] = numpy.zeros(shape, dtype=NUMPY_DTYPES[d])[::1]
    params[names[0]].setflags(write=False)
    expect_error('tensor "%s" is read-only' % names[0], wsync.load_rank, path, 0, params, status=3)
    assert all(not a.any() for a in params.values()), "copied before refusing"

    params = zero_arrays(want)
    expect_error("the commit record is of version 1, not 2", wsync.load_rank, path, 0, params,
                 version=2, status=3)
    expect_error("the commit record is of plan digest %s, not %s" % (digest, "0" * 64),
                 wsync.load_rank, path, 0, params, digest="0" * 64, status=3)
    expect_error("rank 2 is outside the 2 ranks of the commit record", wsync.load_rank, path, 2,
                 params, status=2)

    conv = converted(synth("tiny-qwen3-moe"), "vllm", "kernel", 2, 1)
    expect_error("wsync-commit.json: no commit record: no step is complete", wsync.load_rank,
                 conv, 0, params, status=3)
    # convert's rank files load when asked: the targets recognise which files are rank 0
    wsync.load_rank(conv, 0, params, require_commit=False, **KW)
    assert all(params[n].tobytes() == raw for n, (_, _, raw) in want.items())

    # one byte changed after the commit (in a copy of the directory): in the header, in
    # a middle block, in the last, short block
    entry = [f for f in record(path)["files"] if f["file"] == first][0]
    assert entry["checksum"]["value"] == documented_checksum(where).strip()
    size = os.path.getsize(where)
    assert size > 2 * 65536 and size % 65536, size  # a first, a middle, a short last block
    with open(where, "rb") as f:
        head = f.read(65536)
    in_header = head.index(b'":{"dtype"') - 1  # the last letter of a tensor name
    for at in (in_header, size // 2, size - 1):
        bad = fresh_dir("committed-corrupt")
        shutil.copytree(path, bad)
        with open(os.path.join(bad, first), "r+b") as f:
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 1]))
            f.seek(0)
            now = checksum_oracle(f.read())
        assert now != entry["checksum"]["value"]
        params = zero_arrays(want)
        expect_error("%s: checksum %s, but the commit record says %s (the file changed after "
                     "its commit)" % (os.path.join(bad, first), now, entry["checksum"]["value"]),
                     wsync.load_rank, bad, 0, params, status=3)
        assert all(not a.any() for a in params.values()), "copied before refusing"
        if at != in_header:  # (the renamed tensor is not in params)
            wsync.load_rank(bad, 0, params, verify=False)  # verify=False trusts the record

    # a checksum this reader does not compute (another algorithm or block) is refused
    for key, value in (("algorithm", "xxh3-64"), ("block", 4096)):
        other = fresh_dir("committed-other-checksum")
        shutil.copytree(path, other)
        r = record(other)
        r["files"][0]["checksum"][key] = value
        with open(os.path.join(other, "wsync-commit.json"), "w") as f:
            json.dump(r, f)
        expect_error("file %s: checksum {" % r["files"][0]["file"], wsync.load_rank, other, 0,
                     zero_arrays(want), status=3)
        expect_error('is not one this reader computes (algorithm "xxh3-64-blocks", block 65536)',
                     wsync.load_rank, other, 0, zero_arrays(want), status=3)


@test
def load_rank_rank_and_directory_refusals():
    """A rank that is no rank (negative, or past 2^32, which must not wrap around to rank
    0) is refused by its value, before anything is copied; a directory that does not
    exist is an I/O error naming it, not "no step is complete" (which a reader would
    wait on for ever)."""
    need_numpy()
    path, _ = committed_dir()
    want = rank_tensors(path, 0)
    params = zero_arrays(want)
    expect_error("rank -1 is not a rank (ranks are numbered from 0)", wsync.load_rank, path, -1,
                 params, status=2)
    expect_error("%s: rank 4294967296 is outside the 2 ranks of the commit record"
                 % os.path.join(path, "wsync-commit.json"), wsync.load_rank, path, 2 ** 32,
                 params, status=2)
    expect_error("rank %d is not a rank" % 2 ** 64, wsync.load_rank, path, 2 ** 64, params,
                 status=2)
    expect_error("rank must be an int, not str", wsync.load_rank, path, "0", params,
                 kind=TypeError)
    for flag in (True, False, numpy.bool_(True)):  # True is not rank 1
        expect_error("rank must be an int, not %s" % type(flag).__qualname__.replace("bool_", "numpy.bool_"), wsync.load_rank, path,
                     flag, params, kind=TypeError)
    assert all(not a.any() for a in params.values()), "copied before refusing"
    missing = os.path.join(TMP, "no-such-dir")
    e = expect_error("cannot open %s: No such file or directory" % missing, wsync.load_rank,
                     missing, 0, params, status=4)
    assert str(e) == "cannot open %s: No such file or directory" % missing, str(e)
    a_file = os.path.join(path, "kernel-rank-0-part-0.safetensors")
    expect_error("cannot open %s: Not a directory" % a_file, wsync.load_rank, a_file, 0, params,
                 status=4)


@test
def load_rank_messages_print_paths_printable():
    """load_rank's own messages name the directory's files made printable, as every
    other message does (wsync_printable(): a newline is \\x0a): a directory whose name
    holds a newline gives one line, not two.  (Before: "DIR\n/wsync-commit.json: the
    commit record is of version 1, not 2", the path printed raw; a digest asked for is
    the caller's str and is made printable too.)"""
    path, digest = committed_dir()
    odd = os.path.join(fresh_dir("printable"), "step\none")
    shutil.copytree(path, odd)
    shown = os.path.join(odd, "wsync-commit.json").replace("\n", "\\x0a")
    for said, status, kw in (
            ("%s: the commit record is of version 1, not 2" % shown, 3, {"version": 2}),
            ("%s: the commit record is of plan digest %s, not 0\\x0a1 (another model, "
             "target, format, tp or ep)" % (shown, digest), 3, {"digest": "0\n1"}),
            ("%s: rank 2 is outside the 2 ranks of the commit record" % shown, 2, {"rank": 2})):
        e = expect_error(said, wsync.load_rank, odd, kw.pop("rank", 0), {}, status=status, **kw)
        assert str(e) == said, str(e)
    r = record(odd)
    first = [f for f in r["files"] if f["rank"] == 0][0]
    first["bytes"] += 1
    with open(os.path.join(odd, "wsync-commit.json"), "w") as f:
        json.dump(r, f)
    said = "%s: %d bytes, but the commit record says %d" % (
        os.path.join(odd, first["file"]).replace("\n", "\\x0a"), first["bytes"] - 1, first["bytes"])
    e = expect_error(said, wsync.load_rank, odd, 0, {}, status=3)
    assert str(e) == said, str(e)
    os.unlink(os.path.join(odd, "wsync-commit.json"))
    e = expect_error("%s: no commit record: no step is complete" % shown, wsync.load_rank, odd, 0,
                     {}, status=3)
    e = expect_error("%s: no rank file of rank 7 (no commit record; " % odd.replace("\n", "\\x0a"),
                     wsync.load_rank, odd, 7, {}, require_commit=False, status=3, **KW)


@test
def load_rank_torch_refusals():
    """torch: a missing parameter, a wrong dtype or shape: refused, nothing copied."""
    need_torch()
    path, _ = committed_dir()
    want = rank_tensors(path, 0)
    names = list(want)
    model = torch_model({n: v for n, v in want.items() if n != names[1]})
    expect_error('tensor "%s": the model has no parameter or buffer of that name' % names[1],
                 wsync.load_rank, path, 0, model, status=3)
    d, shape, _ = want[names[0]]
    model = torch_model(want)
    model.get_parameter(names[0]).data = torch.zeros(shape, dtype=torch.float32)
    expect_error('tensor "%s" is %s %s, but the parameter is F32' % (names[0], d, list(shape)),
                 wsync.load_rank, path, 0, model, status=3)
    model.get_parameter(names[0]).data = torch.zeros((1,) + tuple(shape), dtype=getattr(torch, TORCH_DTYPES[d]))
    expect_error("but the parameter has shape [1, ", wsync.load_rank, path, 0, model, status=3)
    assert all(not p.detach().float().abs().sum() for p in model.parameters()), "copied before refusing"


@test
def load_rank_meta_parameters():
    """A torch parameter on the meta device holds no data, and copy_ into it does nothing
    without an error: load_rank refuses it before copying anything, naming the file and
    the tensor; wsync_load adds that vLLM's checkpoint-format update holds the parameters
    there between start_weight_update and finish_weight_update.  (Before: load_rank
    returned as if it had loaded.)"""
    need_torch()
    path, _ = committed_dir()
    want = rank_tensors(path, 0)
    file = os.path.join(path, "kernel-rank-0-part-0.safetensors")
    name = sorted(want)[-1]
    d, shape, _ = want[name]
    fragment = ('%s: tensor "%s": the parameter is on the meta device, which holds no data (a '
                'model being built, or reloaded)' % (file, name))

    model = torch_model(want)
    holder, _, leaf = name.rpartition(".")
    model.get_submodule(holder).register_parameter(leaf, torch.nn.Parameter(
        torch.empty(shape, dtype=getattr(torch, TORCH_DTYPES[d]), device="meta")))
    expect_error(fragment, wsync.load_rank, path, 0, model, status=3)
    assert all(not p.detach().float().abs().sum() for p in model.parameters() if not p.is_meta)

    with FakeVllm(2, 0):
        e = expect_error(fragment, fake_worker(model).wsync_load, path, status=3)
    assert str(e) == (fragment + ": vLLM's start_weight_update (a checkpoint-format update) "
                      "holds the parameters there until finish_weight_update; call wsync_load "
                      "outside that bracket (docs/vllm.md section 7.1)"), str(e)


# Run in a child: on a tree without the guard, the truncated file's SIGBUS killed it.
# kind: numpy, torch (python3-torch) or the torch stand-in (fake_torch of this file, so
# that the torch path runs where python3-torch is missing); budget: wsync._STAGING_BYTES,
# or "default".
_SHRINKING_LOAD = r"""
import json, os, sys
import wsync
import faulthandler
faulthandler.enable()  # its SIGBUS handler, as pytest installs it: the guard must still hold
path, rank_file, kind, cut, budget, this_file = sys.argv[1:7]
names = json.loads(sys.argv[7])
if budget != "default":
    wsync._STAGING_BYTES = int(budget)
if kind == "numpy":
    import numpy
    params = {n: numpy.zeros(shape, dtype=dtype) for n, dtype, shape in names}
else:
    if kind == "the torch stand-in":
        import importlib.util, shutil
        spec = importlib.util.spec_from_file_location("wsync_test_python", this_file)
        tests = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(tests)
        shutil.rmtree(tests.TMP)
        sys.modules["torch"] = tests.fake_torch()
    import torch
    params = {n: torch.zeros(shape, dtype=getattr(torch, dtype)) for n, dtype, shape in names}


def raw(t):
    if kind == "numpy":
        return t.tobytes()
    if kind == "torch":
        return t.view(torch.int16).numpy().tobytes()  # BF16 has no numpy dtype
    return t.numpy().tobytes()


class Shrinking(dict):
    # another process truncates the rank file once load_rank has mapped and checked it
    def __getitem__(self, name):
        if name == names[-1][0]:
            os.truncate(rank_file, int(cut))
        return dict.__getitem__(self, name)


try:
    wsync.load_rank(path, 0, Shrinking(params))
except wsync.Error as e:
    print(json.dumps({"message": str(e), "status": e.exit_status, "copied": e.copied,
                      "bytes": {n: raw(t).hex() for n, t in params.items()}}))
else:
    print(json.dumps({"message": None}))
"""


@test
def load_rank_file_truncated_under_the_map():
    """A rank file truncated by another process after load_rank mapped it (before or
    while it copies) is wsync.Error (exit status 4) naming the file and the first
    tensor whose bytes are gone, as `wsync convert` says it, not SIGBUS killing the
    process; .copied names the parameters copied before it, in order, that tensor's holds
    no byte past the cut, and the others hold what they held.  Numpy destinations
    (copied in C: the message says "this one in part") and torch ones (copied a piece at
    a time from a guarded read: the pieces before the cut hold their bytes, and the
    message says "in part" only where there were such pieces) alike; torch through the
    stand-in too, where python3-torch is missing."""
    need_numpy()
    path, _ = committed_dir(tp=1)
    files = [f["file"] for f in record(path)["files"] if f["rank"] == 0]
    assert len(files) == 1, files
    rank_file = os.path.join(path, files[0])
    with open(rank_file, "rb") as f:
        pristine = f.read()
    _, tensors, header = read_safetensors(rank_file)
    # cut at a page past half of the tensors; the header's pages are read (pread) into
    # memory of load_rank's own when it opens the file, so the first tensor lost is the
    # first to end past both
    page = os.sysconf("SC_PAGESIZE")
    order = list(tensors)
    cut = (header + sum(len(tensors[n][2]) for n in order[:len(order) // 2])) // page * page
    kept, at = max(cut, min(-(-header // page) * page, len(pristine))), header
    for lost, name in enumerate(order):
        at += len(tensors[name][2])
        if at > kept:
            break
    assert 0 < lost < len(order) - 1, (lost, len(order))
    start = header + sum(len(tensors[n][2]) for n in order[:lost])  # of the lost tensor
    dtype, shape, _ = tensors[order[lost]]
    row = len(tensors[order[lost]][2]) // shape[0]
    budget = 1024  # whole rows of the lost tensor (o_proj, 128-byte rows), below the cut
    assert row <= budget < cut - start, (row, budget, cut - start)
    piece = budget // row * row
    kinds = [("numpy", NUMPY_DTYPES, "default", cut - start),
             ("the torch stand-in", TORCH_DTYPES, str(budget), (cut - start) // piece * piece),
             ("the torch stand-in", TORCH_DTYPES, "default", 0)]  # one piece: not begun
    if torch is not None:
        kinds.append(("torch", TORCH_DTYPES, str(budget), (cut - start) // piece * piece))
    for kind, dtypes, staging, held in kinds:
        with open(rank_file, "wb") as f:
            f.write(pristine)
        names = [(n, dtypes[d], shape) for n, (d, shape, _) in tensors.items()]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        r = subprocess.run([sys.executable, "-c", _SHRINKING_LOAD, path, rank_file, kind,
                            str(cut), staging, os.path.abspath(__file__), json.dumps(names)],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=120)
        where = "%s, staging %s" % (kind, staging)
        assert r.returncode == 0, "%s: exit %d: %s" % (where, r.returncode, r.stderr)
        got = json.loads(r.stdout)
        assert got["message"] == (
            'cannot read %s: the file shrank while wsync was reading it (tensor "%s"): %d of '
            'the %d tensors were copied before it (Error.copied names them), %sthe others '
            'are as they were; load again'
            % (rank_file, order[lost], lost, len(order), "this one in part, " if held else "")), \
            (where, got["message"])
        assert got["status"] == 4, (where, got)
        assert got["copied"] == order[:lost], (where, got["copied"])
        for i, name in enumerate(order):
            have, want = bytes.fromhex(got["bytes"][name]), tensors[name][2]
            if i == lost:  # in part: numpy's up to the fault, torch's its pieces before it
                assert have[cut - start:] == bytes(len(have) - (cut - start)), (where, name)
                if kind != "numpy":
                    assert have[:held] == want[:held], (where, name)
                    assert have[held:] == bytes(len(have) - held), (where, name)
                continue
            assert have == (want if i < lost else bytes(len(want))), (where, name)
    with open(rank_file, "wb") as f:
        f.write(pristine)


class _DlpackOnly:
    """An object that offers only DLPack (no buffer protocol), as a CPU tensor of another
    framework does."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


@test
def load_rank_file_too_short_from_the_start():
    """A rank file of fewer than 8 bytes (its header length cannot be read) is refused in
    the words `wsync inspect` uses for it (the C reader's), naming the file, status 3: it
    did not shrink while it was read, it was always too short."""
    path, _ = committed_dir(tp=1)
    first = [f["file"] for f in record(path)["files"] if f["rank"] == 0][0]
    short = fresh_dir("committed-too-short")
    shutil.copytree(path, short)
    where = os.path.join(short, first)
    for size in (0, 5, 7):
        with open(where, "r+b") as f:
            f.truncate(size)
        r = run_wsync("inspect", where)
        assert r.returncode == 3, (size, r.returncode, r.stderr)
        said = "%s: file is %d bytes, too short for the 8-byte header length" % (where, size)
        assert r.stderr == "wsync: %s\n" % said, (size, r.stderr)
        for require_commit in (True, False):
            e = expect_error(said, wsync.load_rank, short, 0, {}, require_commit=require_commit,
                             verify=False, status=3)
            assert str(e) == said, (size, str(e))


def bind_socket(where):
    """A Unix socket at where: bound, then closed (its file stays; open(2) of it fails
    with ENXIO)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(where)
    sock.close()


_LOAD_IN_CHILD = """
import json, sys
sys.path[:0] = [p for p in sys.argv[2].split(":") if p]
import wsync
try:
    wsync.load_rank(sys.argv[1], 0, {}, require_commit=False)
    print(json.dumps(None))
except wsync.Error as e:
    print(json.dumps([str(e), e.exit_status]))
"""


@test
def load_rank_file_not_a_regular_file():
    """A directory or a FIFO where a rank file should be is refused in the C reader's
    words, status 3.  (Before: the directory was "cannot map FILE: No such device",
    status 4, and the FIFO hung load_rank for ever in open(2); the load runs in a child
    with a timeout so that a hang fails the test.)  A Unix socket is refused as the FIFO
    is: open(2) of one fails with ENXIO, and it was "cannot open FILE: No such device or
    address", status 4."""
    path, _ = committed_dir(tp=1)
    first = [f["file"] for f in record(path)["files"] if f["rank"] == 0][0]
    for kind, make, said in (("directory", os.mkdir, "is a directory, not a safetensors file"),
                             ("fifo", os.mkfifo, "not a regular file"),
                             ("socket", bind_socket, "not a regular file")):
        odd = fresh_dir("committed-%s" % kind)
        shutil.copytree(path, odd)
        where = os.path.join(odd, first)
        os.unlink(where)
        make(where)
        try:
            r = subprocess.run([sys.executable, "-c", _LOAD_IN_CHILD, odd, os.pathsep.join(sys.path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               universal_newlines=True, timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError("%s: load_rank did not return in 60 s" % kind)
        assert r.returncode == 0, (kind, r.stderr)
        assert json.loads(r.stdout) == ["%s: %s" % (where, said), 3], (kind, r.stdout)


@test
def load_rank_record_not_a_regular_file():
    """A FIFO, a socket or a directory where the commit record (wsync-commit.json) should
    be is refused as a rank file is, "RECORD: not a regular file", status 3.  (Before:
    the FIFO hung load_rank for ever in g_file_get_contents()'s open(2), the socket was
    status 4, "No such device or address"; the load runs in a child with a timeout.)"""
    path, _ = committed_dir(tp=1)
    for kind, make in (("fifo", os.mkfifo), ("socket", bind_socket), ("directory", os.mkdir)):
        odd = fresh_dir("record-%s" % kind)
        shutil.copytree(path, odd)
        where = os.path.join(odd, "wsync-commit.json")
        os.unlink(where)
        make(where)
        try:
            r = subprocess.run([sys.executable, "-c", _LOAD_IN_CHILD, odd, os.pathsep.join(sys.path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               universal_newlines=True, timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError("%s: load_rank did not return in 60 s" % kind)
        assert r.returncode == 0, (kind, r.stderr)
        assert json.loads(r.stdout) == ["%s: not a regular file" % where, 3], (kind, r.stdout)


@test
def load_rank_record_empty_or_nested_too_deep():
    """An empty commit record, and one nested 300000 deep, are refused in the record
    reader's words (python/record.c record_parse, core/json-check.c), status 3: a guard
    against regressions, since json-glib alone takes an empty text for no value without
    an error and overflowed its stack on a record nested some 100000 deep (a segfault of
    the Python process).  The load runs in a child so that a crash fails this test only."""
    path, _ = committed_dir(tp=1)
    child = [sys.executable, "-c", _LOAD_IN_CHILD.replace("require_commit=False", "require_commit=True"),
             None, os.pathsep.join(sys.path)]
    for kind, text, said in (
            ("empty", "", "the commit record is empty, not a JSON object"),
            ("deep", "[" * 300000 + "]" * 300000, "JSON nests deeper than 64 levels (at byte 64)")):
        odd = fresh_dir("record-%s" % kind)
        shutil.copytree(path, odd)
        where = os.path.join(odd, "wsync-commit.json")
        with open(where, "w") as f:
            f.write(text)
        child[3] = odd
        r = subprocess.run(child, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=60)
        assert (r.returncode, r.stderr) == (0, ""), (kind, r)
        assert json.loads(r.stdout) == ["%s: %s" % (where, said), 3], (kind, r.stdout)


def run_swapping_after_stat(cmd, victim, copy_of=None):
    """Runs cmd with tests/swap-after-stat.c preloaded: a stat() of a path named as
    victim is is followed, before it returns, by a FIFO (with copy_of, a copy of that
    file: another regular file) renamed over that path (the race of a path replaced
    between stat() and open(), made to happen every time).  Returns the
    CompletedProcess; a run that does not end in 60 s fails the test."""
    shim = os.path.join(os.environ.get("G_TEST_BUILDDIR") or HERE, ".libs", "swap-after-stat.so")
    assert os.path.exists(shim), shim
    fifo = os.path.join(TMP, "swap-fifo")
    if os.path.lexists(fifo):
        os.unlink(fifo)
    if copy_of is not None:
        shutil.copyfile(copy_of, fifo)
    else:
        os.mkfifo(fifo)
    env = dict(os.environ, WSYNC_PLUGIN_PATH="", LD_PRELOAD=shim,
               WSYNC_SWAP_NAME=os.path.basename(victim), WSYNC_SWAP_WITH=fifo)
    try:
        return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                              universal_newlines=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("%s: did not end in 60 s (a FIFO opened without O_NONBLOCK)"
                             % " ".join(cmd))
    finally:
        if os.path.lexists(fifo):
            os.unlink(fifo)


@test
def a_file_swapped_after_it_was_judged_is_not_read():
    """What a reader reads is what it checked: it stat()s a path (so that a FIFO or a
    device is refused without being opened), then opens it without blocking and fstat()s
    the descriptor, and refuses what is not the file the stat() saw (core/filekind.h).  A
    FIFO put in place of the file right after the stat() (made to happen every time by an
    LD_PRELOAD shim, tests/swap-after-stat.c) is refused, not waited on and not read:
    `wsync inspect` of a DCP checkpoint (its .metadata) and load_rank (the commit
    record).  (Long ago it hung for ever: g_mapped_file_new() of the .metadata and
    g_file_get_contents() of the record, after a stat(), waited for a writer.)"""
    import stat
    # the shim does swap a file stat()ed by name (else this test could not fail)
    probe = fresh_dir("swap-probe")
    os.mkdir(probe)
    with open(os.path.join(probe, "victim"), "w") as f:
        f.write("x")
    r = run_swapping_after_stat([sys.executable, "-c", "import os, stat, sys; os.stat(sys.argv[1]); "
                                 "print(stat.S_ISFIFO(os.stat(sys.argv[1]).st_mode))",
                                 os.path.join(probe, "victim")], os.path.join(probe, "victim"))
    assert (r.returncode, r.stdout) == (0, "True\n"), r

    src = synth("tiny-qwen3-moe")
    single = [n for n in os.listdir(src) if n.endswith(".safetensors")]
    # ... and in wsync itself, which stat()s a SRC file by name (core/checkpoint.c) before
    # its reader opens it: the FIFO swapped in is refused, not waited on.  Without this,
    # a shim that did not reach wsync's own calls (a wrapper that drops LD_PRELOAD, a
    # stat() symbol it does not replace) would let the cases below pass on any tree.
    victim = os.path.join(probe, "victim.safetensors")
    shutil.copyfile(os.path.join(src, single[0]), victim)
    r = run_swapping_after_stat([BINARY, "--conf-dir", CONF_DIR, "--plugin-dir", PLUGIN_DIR, "-q",
                                 "inspect", victim], victim)
    assert (r.returncode, r.stdout, r.stderr) == (3, "", "wsync: %s: not a regular file\n" % victim), r
    assert stat.S_ISFIFO(os.lstat(victim).st_mode), "the shim did not swap in wsync"

    step = fresh_dir("swap-dcp")
    subprocess.run([sys.executable, os.path.join(HERE, "make-dcp-fixtures.py"), "--shard",
                    os.path.join(src, single[0]), step], check=True, stdout=subprocess.DEVNULL)
    dcp = os.path.join(step, "b")
    cmd = [BINARY, "--conf-dir", CONF_DIR, "--plugin-dir", PLUGIN_DIR, "-q", "inspect", dcp]
    plain = run_wsync("-q", "inspect", dcp)
    assert plain.returncode == 0, plain
    metadata = os.path.join(dcp, ".metadata")
    r = run_swapping_after_stat(cmd, metadata)
    assert (r.returncode, r.stdout, r.stderr) == (3, "", "wsync: %s: not a regular file\n" % metadata), r
    assert stat.S_ISFIFO(os.lstat(metadata).st_mode), "the shim did not swap the .metadata"

    path, _ = committed_dir(tp=1)
    record_path = os.path.join(path, "wsync-commit.json")
    child = [sys.executable, "-c", _LOAD_IN_CHILD.replace("require_commit=False", "require_commit=True"),
             path, os.pathsep.join(sys.path)]
    plain = subprocess.run(child, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=60)
    assert plain.returncode == 0 and "wsync-commit.json" not in plain.stdout, plain
    r = run_swapping_after_stat(child, record_path)
    assert (r.returncode, r.stderr) == (0, ""), r
    assert json.loads(r.stdout) == ["%s: not a regular file" % record_path, 3], r.stdout
    assert stat.S_ISFIFO(os.lstat(record_path).st_mode), "the shim did not swap the record"


@test
def load_rank_refuses_a_file_replaced_between_stat_and_open():
    """A commit record or a rank file replaced by another regular file between load_rank's
    stat() of it and its open(2) (a copy renamed over it, every time, by the LD_PRELOAD
    shim tests/swap-after-stat.c) is not read: "FILE: was replaced while it was being
    opened; nothing was read", status 4 (core/filekind.h), whatever the new file holds
    (here the same bytes)."""
    path, _ = committed_dir(tp=1)
    first = [f["file"] for f in record(path)["files"] if f["rank"] == 0][0]
    child = [sys.executable, "-c", _LOAD_IN_CHILD.replace("require_commit=False", "require_commit=True"),
             None, os.pathsep.join(sys.path)]
    for name in ("wsync-commit.json", first):
        step = fresh_dir("swap-regular")
        shutil.copytree(path, step)
        victim = os.path.join(step, name)
        before = os.stat(victim).st_ino
        child[3] = step
        r = run_swapping_after_stat(child, victim, copy_of=victim)
        assert (r.returncode, r.stderr) == (0, ""), r
        assert json.loads(r.stdout) == [
            "%s: was replaced while it was being opened; nothing was read" % victim, 4], r.stdout
        assert os.stat(victim).st_ino != before, "the shim did not swap %s" % name


@test
def load_rank_size_one_dimensions_take_any_stride():
    """A destination whose dimension of size 1 has an arbitrary stride (x[None], a
    [1, N] bias, as_strided) is contiguous as torch's is_contiguous() says it
    (c10/core/TensorImpl.h compute_contiguous skips size-1 dimensions): numpy arrays
    (the buffer protocol), DLPack tensors and torch tensors all take the bytes.  (This
    worked already; the test keeps it so.)"""
    need_numpy()
    from numpy.lib.stride_tricks import as_strided
    path, _ = committed_dir(tp=1, ep=8)  # one expert per rank: w13_weight is [1, 64, 64]
    want = rank_tensors(path, 0)
    ones = [n for n, (_, shape, _) in want.items() if shape[0] == 1]
    assert ones, "no tensor with a dimension of size 1"
    for wrap in (lambda a: a, _DlpackOnly):
        params, bases = zero_arrays(want), {}
        for n in ones:
            dtype, shape, _ = want[n]
            bases[n] = numpy.zeros(shape, dtype=NUMPY_DTYPES[dtype])
            strides = (6,) + bases[n].strides[1:]  # dim 0, of size 1: any stride
            params[n] = wrap(as_strided(bases[n], shape=shape, strides=strides))
        wsync.load_rank(path, 0, params)
        assert all(bases[n].tobytes() == want[n][2] for n in ones)
    if torch is None:
        return
    params = {n: torch.zeros(shape, dtype=getattr(torch, TORCH_DTYPES[d]))
              for n, (d, shape, _) in want.items()}
    for n in ones:
        shape = want[n][1]
        params[n] = torch.zeros(shape[1:], dtype=torch.bfloat16).as_strided(
            shape, (5,) + tuple(torch.zeros(shape[1:]).stride()))
        assert params[n].is_contiguous()
    wsync.load_rank(path, 0, params)
    assert all(torch_bytes(params[n]) == want[n][2] for n in ones)


def handmade_rank_dir(name, arrays):
    """A directory holding one rank file of rank 0 and no commit record (load_rank with
    require_commit=False): arrays ({name: numpy array}, F32 or F64) in that order,
    under the file name and __metadata__ of committed_dir's tp 1 rank file, which its
    targets recognise."""
    path, _ = committed_dir(tp=1)
    first = [f["file"] for f in record(path)["files"] if f["rank"] == 0][0]
    header = {"__metadata__": read_safetensors(os.path.join(path, first))[0]}
    data = b""
    for n, a in arrays.items():
        header[n] = {"dtype": {"float32": "F32", "float64": "F64"}[a.dtype.name],
                     "shape": list(a.shape), "data_offsets": [len(data), len(data) + a.nbytes]}
        data += a.tobytes()
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    out = fresh_dir(name)
    os.makedirs(out)
    with open(os.path.join(out, first), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
    return out


@test
def load_rank_torch_copies_in_bounded_pieces():
    """load_rank copies into torch parameters a piece at a time through one staging
    buffer of wsync._STAGING_BYTES (64 MiB; here 64 bytes), whatever the tensor: a
    tensor of many rows, tensors whose one row (200 bytes; 800, whose rows of 160 bytes
    exceed it too) exceeds the budget, a 0-dim tensor and an empty one load bit-exact,
    into contiguous parameters and into transposed views (written through their
    strides); every buffer torch.frombuffer gets is the one staging buffer, of the
    budget, every copy_ takes at most the budget, and each byte is read once.  With the
    default budget, the staging buffer is the largest tensor's size.  Run with the torch
    stand-in (which logs what load_rank hands to torch) and with python3-torch where
    installed (bytes only).  (Before: files.read() returned a bytearray of the whole
    tensor, 805 MB for each layer's w13_weight of Qwen3-30B-A3B.)"""
    need_numpy()
    arrays = {"a.rows": numpy.arange(37 * 3, dtype="float32").reshape(37, 3) + 1,
              "a.scalar": numpy.array(-2.5, dtype="float32"),
              "a.wide": numpy.arange(3 * 50, dtype="float32").reshape(3, 50) + 1000,
              "a.empty": numpy.zeros((0, 5), dtype="float32"),
              "a.deep": numpy.arange(2 * 5 * 40, dtype="float32").reshape(2, 5, 40) + 2000,
              "a.f64": numpy.arange(9 * 2, dtype="float64").reshape(9, 2) + 0.25}
    path = handmade_rank_dir("bounded-pieces", arrays)
    nbytes = sum(a.nbytes for a in arrays.values())
    budget = 64

    def transposed(T, a):  # a view of storage laid out the other way round: no dense stride
        dtype = getattr(T, a.dtype.name)
        if a.ndim < 2:
            return T.zeros(a.shape, dtype=dtype)
        return T.zeros(tuple(reversed(a.shape)), dtype=dtype).transpose(0, a.ndim - 1)

    for label, T, installed in torch_flavours():
        for layout in ("contiguous", "transposed"):
            for staging in (budget, None):
                with installed:
                    if layout == "contiguous":
                        params = {n: T.zeros(a.shape, dtype=getattr(T, a.dtype.name))
                                  for n, a in arrays.items()}
                    else:
                        params = {n: transposed(T, a) for n, a in arrays.items()}
                        assert not params["a.deep"].is_contiguous()
                    logged = hasattr(T, "frombuffer_calls")
                    if logged:
                        del T.frombuffer_calls[:], T.copy_calls[:]
                    saved = wsync._STAGING_BYTES
                    if staging is not None:
                        wsync._STAGING_BYTES = staging
                    try:
                        assert wsync.load_rank(path, 0, params, require_commit=False, **KW) is None
                    finally:
                        wsync._STAGING_BYTES = saved
                where = "%s, %s, staging %s" % (label, layout, staging)
                for n, a in arrays.items():
                    got = numpy.ascontiguousarray(params[n].detach().numpy())
                    assert got.tobytes() == a.tobytes(), "%s: %s: %s" % (where, n, got)
                if not logged:
                    continue
                buffers = T.frombuffer_calls
                size = staging if staging is not None else max(a.nbytes for a in arrays.values())
                assert buffers and all(b is buffers[0][0] for b, _, _ in buffers), where
                assert {length for _, length, _ in buffers} == {size}, (where, buffers)
                assert max(spanned for _, _, spanned in buffers) <= size, where
                assert sum(spanned for _, _, spanned in buffers) == nbytes, where
                assert [src for src, _ in T.copy_calls] == [
                    spanned for _, _, spanned in buffers], where
                if staging is not None:  # the 200-byte rows of a.wide went in parts of rows
                    assert (16,) in [shape for _, shape in T.copy_calls], (where, T.copy_calls)


@test
def load_rank_sees_a_new_step():
    """A step begun while load_rank copies (the record replaced) is reported: the
    parameters hold a mix of steps."""
    need_numpy()
    path, _ = committed_dir()
    want = rank_tensors(path, 0)

    class Racing(dict):
        def __getitem__(self, name):
            if name == list(want)[-1]:  # the trainer commits version 2 meanwhile
                r = record(path)
                r["version"] = 2
                with open(os.path.join(path, "wsync-commit.json"), "w") as f:
                    json.dump(r, f)
            return dict.__getitem__(self, name)

    expect_error("a new step began while rank 0 was loading", wsync.load_rank, path, 0,
                 Racing(zero_arrays(want)), status=3)


@test
def vllm_worker_rank_index():
    """The worker extension's rank file index: the TP rank, or with expert parallelism
    vLLM's flattened EP rank dp_rank*pcp*tp + pcp_rank*tp + tp_rank."""
    from wsync.vllm_worker import WsyncWorkerExtension, rank_file_index
    assert rank_file_index(3, 4) == 3
    assert rank_file_index(3, 4, expert_parallel=False, dp_rank=1) == 3
    assert rank_file_index(3, 4, expert_parallel=True, dp_rank=1) == 7
    assert rank_file_index(1, 2, expert_parallel=True, dp_rank=2, pcp_rank=1, pcp_size=2) == 11
    assert callable(WsyncWorkerExtension.wsync_load)


@test
def vllm_worker_replica_hint():
    """A data-parallel worker without expert parallelism that finds an expert tensor of
    the wrong shape (vLLM slices experts over dp*tp there) is told why and what works;
    every other refusal is left as it is."""
    from wsync.vllm_worker import replica_shape_hint
    need_numpy()
    out = converted(synth("tiny-qwen3-moe"), "vllm", "kernel", 2, 1)
    # rank 0's parameters as a dp 2 x tp 2 worker holds them: experts sliced over 4
    params = {}
    for name, (dtype, shape, _) in read_safetensors(os.path.join(out, rank_files(out)[0]))[1].items():
        if name.endswith("w13_weight"):
            shape = (shape[0], shape[1] // 2, shape[2])
        elif name.endswith("w2_weight"):
            shape = (shape[0], shape[1], shape[2] // 2)
        params[name] = numpy.zeros(shape, dtype=NUMPY_DTYPES[dtype])
    e = expect_error("but the buffer holds 16384 bytes", wsync.load_rank, out, 0, params,
                     require_commit=False, verify=False, **KW)
    hinted = replica_shape_hint(str(e), 2, 2, False)
    assert hinted.startswith(str(e) + " (vLLM without expert parallelism slices MoE experts "
                             "over dp*pcp*tp = 4 ranks, not over the 2 TP ranks the files are "
                             "written for, a layout wsync does not write"), hinted
    assert hinted.endswith("write the files with --ep 4)"), hinted
    assert replica_shape_hint(str(e), 2, 2, True) == str(e)
    assert replica_shape_hint(str(e), 2, 1, False) == str(e)
    assert replica_shape_hint(str(e), 2, 1, False, pcp_size=2).endswith("--ep 4)")
    assert replica_shape_hint(str(e), 2, 2, False, pcp_size=2).endswith("--ep 8)")
    assert replica_shape_hint("no parameter or buffer of that name", 2, 2, False) == \
        "no parameter or buffer of that name"


@test
def vllm_worker_replica_hint_only_experts():
    """The replica hint is about MoE experts (vLLM slices only them over dp*pcp*tp): a
    refusal of another tensor's shape, or of a dtype, is left as it is.  (Reviewer's test:
    today both get the hint.)"""
    from wsync.vllm_worker import replica_shape_hint
    dense = ('model.layers.0.self_attn.qkv_proj.weight is BF16 [48, 64], but the parameter '
             'has shape [24, 64]')
    assert replica_shape_hint(dense, 2, 2, False) == dense, replica_shape_hint(dense, 2, 2, False)
    # era D keeps the router and the shared expert under mlp.experts.: not sliced over dp
    for name in ("language_model.model.layers.0.mlp.experts._shared_experts._layer."
                 "gate_up_proj.weight", "model.layers.0.mlp.experts.gate.weight"):
        other = name + " is BF16 [64, 64], but the parameter has shape [32, 64]"
        assert replica_shape_hint(other, 2, 2, False) == other, other
    routed = ("language_model.model.layers.0.mlp.experts.routed_experts.w2_weight is BF16 "
              "[2, 64, 64], but the parameter has shape [2, 64, 32]")
    assert replica_shape_hint(routed, 2, 2, False).endswith("--ep 4)")
    dtype = ('model.layers.0.mlp.experts.w13_weight is BF16 [4, 32, 64], but the buffer holds '
             'F32 elements')
    assert replica_shape_hint(dtype, 2, 2, False) == dtype, replica_shape_hint(dtype, 2, 2, False)


@test
def vllm_worker_shared_expert_hint():
    """An expert-parallel worker that finds a shared-expert tensor of the wrong size is
    told which vllm options make the files match (docs/vllm.md section 9.4); other
    tensors, dtypes and workers without EP or with tp 1 are left alone."""
    from wsync.vllm_worker import shared_expert_hint
    name = "language_model.model.layers.0.mlp.experts._shared_experts._layer.gate_up_proj.weight"
    size = name + " is BF16 [64, 64], but the parameter has shape [32, 64]"
    hinted = shared_expert_hint(size, 2, 1, True, pcp_size=2)
    assert hinted == (size + " (the files hold the shared expert whole or TP-sliced as the "
                      "vllm plugin's options all2all-backend and prefill-context-parallel-size "
                      "decide, by vLLM's use_sequence_parallel_moe: this worker runs with "
                      "--all2all-backend allgather_reducescatter, --prefill-context-parallel-"
                      "size 2, data-parallel size 1 and tp 2: write the files with "
                      "all2all-backend = \"allgather_reducescatter\" and "
                      "prefill-context-parallel-size = 2 in the plugin \"vllm\" section of "
                      "the configuration, and --ep 4)"), hinted
    assert "--all2all-backend pplx," in shared_expert_hint(size, 2, 2, True, 1, "pplx")
    assert shared_expert_hint(size, 2, 2, False) == size
    assert shared_expert_hint(size, 1, 4, True) == size
    gate = ("language_model.model.layers.0.mlp.experts._shared_experts._layer.expert_gate."
            "weight is BF16 [1, 64], but the parameter has shape [1, 32]")
    assert shared_expert_hint(gate, 2, 2, True) == gate
    dtype = name + " is BF16 [64, 64], but the buffer holds F32 elements"
    assert shared_expert_hint(dtype, 2, 2, True) == dtype
    routed = ("language_model.model.layers.0.mlp.experts.routed_experts.w13_weight is BF16 "
              "[2, 64, 64], but the parameter has shape [2, 32, 64]")
    assert shared_expert_hint(routed, 2, 2, True) == routed
    # vLLM-Ascend: its own rule, named by its own option
    ascend = shared_expert_hint(size, 2, 2, True, 1, "flashinfer_all2allv", False)
    assert ascend == (size + " (vLLM-Ascend holds the shared expert whole only with "
                      "additional_config enable_shared_expert_dp, and this worker runs with it "
                      "off: write the files for target vllm-ascend with "
                      "enable-shared-expert-dp = false in the plugin \"vllm\" section of the "
                      "configuration, and --ep 4)"), ascend
    assert "it on: " in shared_expert_hint(size, 2, 2, True, 1, "x", True)
    assert "= true in" in shared_expert_hint(size, 2, 2, True, 1, "x", True)
    assert shared_expert_hint(routed, 2, 2, True, 1, "x", True) == routed


# ------------------------------------------------------------------ the worker, faked

class FakeModule:
    """What the worker extension uses of a torch.nn.Module (get_submodule, get_parameter,
    get_buffer, with torch's AttributeError for what they do not find), holding numpy
    arrays: no torch and no vLLM are needed to run wsync_load."""

    def __init__(self):
        self.children, self.params, self.buffers = {}, {}, {}

    def get_submodule(self, target):
        module = self
        for part in target.split(".") if target else []:
            if part not in module.children:
                raise AttributeError("FakeModule has no attribute `%s`" % part)
            module = module.children[part]
        return module

    def _leaf(self, name):
        path, _, leaf = name.rpartition(".")
        return self.get_submodule(path), leaf

    def get_parameter(self, target):
        module, leaf = self._leaf(target)
        if leaf not in module.params:
            raise AttributeError("`%s` is not an nn.Parameter" % leaf)
        return module.params[leaf]

    def get_buffer(self, target):
        module, leaf = self._leaf(target)
        if leaf not in module.buffers:
            raise AttributeError("`%s` is not a buffer" % leaf)
        return module.buffers[leaf]

    def add(self, name, array, buffer=False):
        path, _, leaf = name.rpartition(".")
        module = self
        for part in path.split(".") if path else []:
            module = module.children.setdefault(part, FakeModule())
        (module.buffers if buffer else module.params)[leaf] = array


def fake_model(tensors, buffers=()):
    """A FakeModule with a zero array at every name of tensors ({name: (dtype, shape,
    bytes)}), parameters but for the names in buffers."""
    model = FakeModule()
    for name, (dtype, shape, _) in tensors.items():
        model.add(name, numpy.zeros(shape, dtype=NUMPY_DTYPES[dtype]), name in buffers)
    return model


def model_arrays(model, names):
    """{name: the model's array at name}, parameter or buffer."""
    out = {}
    for name in names:
        module, leaf = model._leaf(name)
        out[name] = module.params[leaf] if leaf in module.params else module.buffers[leaf]
    return out


def untouched(model, names):
    return not any(a.any() for a in model_arrays(model, names).values())


class FakeVllm:
    """sys.modules entries standing in for vllm.distributed.parallel_state (the calls
    wsync_rank makes) and, given ascend_config, vllm_ascend.ascend_config, while a test
    runs the worker extension."""

    def __init__(self, tp_size, tp_rank, ascend_config=None):
        import types
        ps = types.ModuleType("vllm.distributed.parallel_state")
        ps.get_tensor_model_parallel_world_size = lambda: tp_size
        ps.get_tensor_model_parallel_rank = lambda: tp_rank
        ps.get_pcp_group = lambda: types.SimpleNamespace(rank_in_group=0)
        distributed = types.ModuleType("vllm.distributed")
        distributed.parallel_state = ps
        vllm = types.ModuleType("vllm")
        vllm.distributed = distributed
        self.modules = {"vllm": vllm, "vllm.distributed": distributed,
                        "vllm.distributed.parallel_state": ps}
        if ascend_config is not None:
            ascend = types.ModuleType("vllm_ascend.ascend_config")
            ascend.get_ascend_config = lambda: ascend_config
            self.modules.update({"vllm_ascend": types.ModuleType("vllm_ascend"),
                                 "vllm_ascend.ascend_config": ascend})

    def __enter__(self):
        self.saved = {n: sys.modules.get(n) for n in self.modules}
        sys.modules.update(self.modules)
        return self

    def __exit__(self, *exc):
        for name, module in self.saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def fake_worker(model, dp=1, dp_rank=0, expert_parallel=False, enable_eplb=False):
    """A WsyncWorkerExtension as vLLM mixes it into its worker: model_runner and
    vllm_config.parallel_config with the fields the extension reads."""
    import types
    from wsync.vllm_worker import WsyncWorkerExtension
    worker = WsyncWorkerExtension()
    worker.model_runner = types.SimpleNamespace(get_model=lambda: model)
    worker.vllm_config = types.SimpleNamespace(parallel_config=types.SimpleNamespace(
        data_parallel_size=dp, data_parallel_rank=dp_rank,
        enable_expert_parallel=expert_parallel, enable_eplb=enable_eplb,
        prefill_context_parallel_size=1, all2all_backend="allgather_reducescatter"))
    return worker


@test
def vllm_worker_loads_kernel_files():
    """wsync_load, run as vLLM runs it (the worker's model, vLLM's parallel state), fills
    each TP rank's parameters with exactly its kernel-format file's tensors and returns
    the commit record."""
    need_numpy()
    path, digest = committed_dir()
    for rank in (0, 1):
        want = rank_tensors(path, rank)
        model = fake_model(want)
        with FakeVllm(2, rank):
            r = fake_worker(model).wsync_load(path, version=1, digest=digest)
        assert r["digest"] == digest, r
        got = model_arrays(model, want)
        assert all(got[n].tobytes() == raw for n, (_, _, raw) in want.items())
        if torch is not None:  # a torch module: get_submodule/get_parameter are torch's
            module = torch_model(want)
            with FakeVllm(2, rank):
                fake_worker(module).wsync_load(path, digest=digest)
            assert all(torch_bytes(module.get_parameter(n)) == raw for n, (_, _, raw) in want.items())


@test
def vllm_worker_refuses_sharded_state_files():
    """Files of the sharded-state format (the loader layout and persistent buffers, for
    vLLM's engine start) are refused by a live update before anything is copied, naming
    the file, the format and the remedy; vLLM's kernel-format copy resolves parameters
    only, and so does wsync_load.  (Before: they loaded, buffers included.)"""
    need_numpy()
    path, _ = committed_dir("tiny-qwen3-moe", "sharded-state", 2, 1)
    want = rank_tensors(path, 0)
    scales = {n for n in want if n.endswith("_scale")}
    assert scales, "the sharded-state files hold the attention scale buffers"
    model = fake_model(want, buffers=scales)
    first = os.path.join(path, [f["file"] for f in record(path)["files"] if f["rank"] == 0][0])
    with FakeVllm(2, 0):
        e = expect_error("%s: the file is in the sharded-state format of target vllm, for "
                         "vLLM's engine start (--load-format sharded_state: the loader layout, "
                         "with buffers); a live update copies the kernel format" % first,
                         fake_worker(model).wsync_load, path, status=3)
    assert str(e).endswith('write the files with format "kernel"'), str(e)
    assert untouched(model, want), "copied before refusing"

    # a kernel-format name that resolves to a buffer is refused, as get_parameter does
    path, _ = committed_dir()
    want = rank_tensors(path, 0)
    name = sorted(want)[0]
    model = fake_model(want, buffers={name})
    with FakeVllm(2, 0):
        expect_error('tensor "%s": the model has no parameter of that name' % name,
                     fake_worker(model).wsync_load, path, status=3)
    assert untouched(model, want), "copied before refusing"


def conf_with(name, vllm_options):
    """A copy of the configuration with vllm_options ({option: value}) set in the plugin
    "vllm" section, made once."""
    out = os.path.join(TMP, "conf-" + name)
    if not os.path.isdir(out):
        shutil.copytree(CONF_DIR, out)
        path = os.path.join(out, "20-vllm.conf")
        with open(path) as f:
            lines = f.readlines()
        for option, value in vllm_options.items():
            at = [i for i, line in enumerate(lines) if line.strip().startswith(option + " =")]
            assert len(at) == 1, option
            lines[at[0]] = '    %s = "%s"\n' % (option, value)
        with open(path, "w") as f:
            f.writelines(lines)
    return out


class UnquantizedMoeBackend:
    """vLLM's enum's members as the worker sees them (.name; vllm/model_executor/layers/
    fused_moe/oracle/unquantized.py @ df1376907b16)."""

    def __init__(self, name):
        self.name = name


class UnquantizedFusedMoEMethod:
    """vLLM's method since #31827: the backend it selected in unquantized_backend."""

    def __init__(self, backend):
        self.unquantized_backend = UnquantizedMoeBackend(backend)


class FusedMoEModularMethod:
    """vLLM's wrapper (LoRA, some all2all backends) of the method that processed the
    weights."""

    def __init__(self, old_quant_method):
        self.old_quant_method = old_quant_method


class LegacyUnquantizedFusedMoEMethod:
    """vLLM #25503 to #31827: booleans instead of a backend."""

    def __init__(self, cutlass, aiter=False):
        self.flashinfer_cutlass_moe_enabled = cutlass
        self.rocm_aiter_moe_enabled = aiter


AscendUnquantizedFusedMoEMethod = type(
    "AscendUnquantizedFusedMoEMethod", (UnquantizedFusedMoEMethod,),
    {"__module__": "vllm_ascend.ops.fused_moe.routed_experts"})


def moe_layers(tensors):
    return sorted({n.rpartition(".")[0] for n in tensors if n.endswith("w13_weight")})


def with_methods(model, tensors, method, **attributes):
    """model, each MoE layer (the module holding w13_weight) given quant_method method()
    and attributes."""
    for layer in moe_layers(tensors):
        module = model.get_submodule(layer)
        module.quant_method = method()
        for key, value in attributes.items():
            setattr(module, key, value)
    return model


@test
def vllm_worker_moe_backend():
    """wsync_load refuses, before copying anything, files whose routed experts are laid out
    for another MoE backend than the one each MoE layer runs (the quant_method's
    unquantized_backend, or vLLM-Ascend's own method), naming the file, the tensor, the
    layer and both backends; matching ones load.  (Before: every file loaded, the
    experts' w13 halves swapped or transposed without a word where the shapes agree.)"""
    need_numpy()
    triton, _ = committed_dir("tiny-qwen3-moe", "kernel", 2, 1)
    cutlass, _ = committed_dir("tiny-qwen3-moe", "kernel", 2, 1, conf_dir=conf_with(
        "cutlass", {"moe-backend": "flashinfer-cutlass"}))
    ascend, _ = committed_dir("tiny-qwen3-moe", "kernel", 2, 1, target="vllm-ascend")
    assert read_safetensors(os.path.join(cutlass, "kernel-rank-0-part-0.safetensors"))[0][
        "wsync.moe-backend"] == "flashinfer-cutlass"

    def load(path, method, **attributes):
        want = rank_tensors(path, 0)
        model = with_methods(fake_model(want), want, method, **attributes)
        with FakeVllm(2, 0):
            fake_worker(model).wsync_load(path)
        assert all(a.tobytes() == want[n][2] for n, a in model_arrays(model, want).items())

    def refused(path, method, fragment, **attributes):
        want = rank_tensors(path, 0)
        model = with_methods(fake_model(want), want, method, **attributes)
        layer = moe_layers(want)[0]
        file = os.path.join(path, "kernel-rank-0-part-0.safetensors")
        with FakeVllm(2, 0):
            e = expect_error(fragment, fake_worker(model).wsync_load, path, status=3)
        assert str(e).startswith('%s: tensor "%s.w' % (file, layer)), str(e)
        assert " but layer %s of this engine runs them with " % layer in str(e), str(e)
        assert untouched(model, want), "copied before refusing"
        return str(e)

    cuda = lambda name: (lambda: UnquantizedFusedMoEMethod(name))
    load(triton, cuda("TRITON"))
    load(triton, cuda("BATCHED_TRITON"))
    load(cutlass, cuda("FLASHINFER_CUTLASS"))
    load(ascend, lambda: AscendUnquantizedFusedMoEMethod("OOT"))
    load(triton, lambda: object())  # a method the worker cannot read: not checked
    load(triton, lambda: None)
    load(triton, lambda: LegacyUnquantizedFusedMoEMethod(False))
    load(cutlass, lambda: LegacyUnquantizedFusedMoEMethod(True))

    message = refused(triton, cuda("FLASHINFER_CUTLASS"), "the file holds the routed experts "
                      "for moe-backend triton, but layer")
    assert message.endswith("runs them with the unquantized MoE backend FLASHINFER_CUTLASS "
                            "(moe-backend flashinfer-cutlass): write the files for target vllm "
                            "with moe-backend = \"flashinfer-cutlass\" in the plugin \"vllm\" "
                            "section of the configuration (docs/vllm.md section 4)"), message
    refused(triton, lambda: FusedMoEModularMethod(UnquantizedFusedMoEMethod("FLASHINFER_CUTLASS")),
            "backend FLASHINFER_CUTLASS (moe-backend flashinfer-cutlass): write")
    refused(triton, lambda: LegacyUnquantizedFusedMoEMethod(True),
            "FlashInfer CUTLASS (flashinfer_cutlass_moe_enabled) (moe-backend flashinfer-cutlass)")
    refused(cutlass, cuda("TRITON"), "for moe-backend flashinfer-cutlass, but layer")
    refused(cutlass, cuda("TRITON"), 'with moe-backend = "triton" in the plugin')
    message = refused(triton, cuda("FLASHINFER_TRTLLM"), "the unquantized MoE backend "
                      "FLASHINFER_TRTLLM (moe-backend flashinfer-trtllm): wsync writes no kernel "
                      "format for it: start vLLM with --moe-backend triton or flashinfer_cutlass")
    refused(triton, cuda("AITER"), "the unquantized MoE backend AITER: wsync writes no kernel")
    refused(triton, lambda: LegacyUnquantizedFusedMoEMethod(False, aiter=True),
            "the unquantized MoE backend ROCm AITER: wsync writes no kernel")
    # vLLM-Ascend's transposed experts against vLLM's, both ways
    message = refused(triton, lambda: AscendUnquantizedFusedMoEMethod("OOT"),
                      "for moe-backend triton, but layer")
    assert message.endswith("with vLLM-Ascend's AscendUnquantizedFusedMoEMethod: write the "
                            "files for target vllm-ascend"), message
    refused(ascend, cuda("TRITON"), "the file holds the routed experts for target vllm-ascend, "
            "but layer")
    refused(ascend, cuda("TRITON"), 'write the files for target vllm with moe-backend = "triton"')
    # fused MC2: the kernel runs per-expert copies, not the parameters
    message = refused(ascend, lambda: AscendUnquantizedFusedMoEMethod("OOT"),
                      "with fused MC2, which runs per-expert copies (w13_weight_list)",
                      w13_weight_list=[])
    assert message.endswith("start vLLM-Ascend without additional_config enable_fused_mc2 "
                            "(docs/vllm-ascend.md section 4)"), message


@test
def vllm_worker_expert_load_balancing():
    """With expert load balancing (vLLM's --enable-eplb, vLLM-Ascend's dynamic_eplb or
    expert_map_path) the experts a rank holds are not the linear placement wsync's files
    hold (same shapes): wsync_load refuses, before copying, at the first routed expert,
    saying which setting; files without experts (a dense model) still load.  (Before:
    they loaded into the wrong experts without a word.)"""
    import types
    need_numpy()
    path, _ = committed_dir("tiny-qwen3-moe", "kernel", 2, 2)
    want = rank_tensors(path, 1)
    file = os.path.join(path, "kernel-rank-1-part-0.safetensors")
    expert = [n for n in want if n.endswith("w13_weight") or n.endswith("w2_weight")][0]
    refusal = '%s: tensor "%s": this engine places the experts by ' % (file, expert)
    ascend = lambda dynamic, path: types.SimpleNamespace(
        eplb_config=types.SimpleNamespace(dynamic_eplb=dynamic, expert_map_path=path),
        weight_nz_mode=0)

    def load(ascend_config=None, **kw):
        model = fake_model(want)
        with FakeVllm(2, 1, ascend_config):  # tp 2, EP: the files of EP rank 1
            fake_worker(model, expert_parallel=True, **kw).wsync_load(path)
        assert all(a.tobytes() == want[n][2] for n, a in model_arrays(model, want).items())

    def refused(fragment, ascend_config=None, **kw):
        model = fake_model(want)
        with FakeVllm(2, 1, ascend_config):
            e = expect_error(refusal + fragment, fake_worker(
                model, expert_parallel=True, **kw).wsync_load, path, status=3)
        assert untouched(model, want), "copied before refusing"
        return str(e)

    load()
    load(ascend(False, None))
    refused("--enable-eplb, whose load balancer moves experts between ranks at run time, "
            "and wsync's files hold each rank's experts in vLLM's linear placement "
            "(docs/vllm.md section 4): start it without expert load balancing",
            enable_eplb=True)
    refused("vLLM-Ascend's additional_config eplb_config dynamic_eplb, which moves experts "
            "between ranks at run time, and", ascend(True, None))
    refused("vLLM-Ascend's additional_config eplb_config expert_map_path /x/map.json, a "
            "placement of its own, and", ascend(False, "/x/map.json"))

    dense, _ = committed_dir("tiny-qwen3", "kernel", 2, 1)
    want = rank_tensors(dense, 0)
    model = fake_model(want)
    with FakeVllm(2, 0):
        fake_worker(model, enable_eplb=True).wsync_load(dense)
    assert all(a.tobytes() == want[n][2] for n, a in model_arrays(model, want).items())


@test
def vllm_worker_refuses_nz_mode():
    """On vLLM-Ascend with a weight NZ mode other than 0 (its default is 1) wsync_load
    refuses before copying, as vLLM-Ascend's own start_weight_update and wake_up do
    (_check_nz_disabled, vllm_ascend/worker/worker.py:288-306 @ 182b75ea84ff), which a
    collective_rpc call never passes: the mode is get_ascend_config().weight_nz_mode, or
    VLLM_ASCEND_ENABLE_NZ (default 1) in releases whose config has no such attribute
    (v0.18.0).  Mode 0 loads; so does vLLM, whatever the variable says.  (Before: it
    copied piece by piece into parameters vLLM-Ascend may hold in FRACTAL_NZ.)"""
    import types
    need_numpy()
    path, _ = committed_dir("tiny-qwen3", "kernel", 2, 1)
    want = rank_tensors(path, 0)
    saved = os.environ.get("VLLM_ASCEND_ENABLE_NZ")
    advice = ("(FRACTAL_NZ on; its default is 1), whose parameters wsync_load does not copy "
              "into, as vLLM-Ascend refuses its own weight updates in it: start the engine "
              "with additional_config {\"weight_nz_mode\": 0} and VLLM_ASCEND_ENABLE_NZ=0, "
              "as `wsync env --backend npu-ascend --mode colocate|server` says "
              "(docs/vllm-ascend.md section 4)")

    def run(config, env):
        if env is None:
            os.environ.pop("VLLM_ASCEND_ENABLE_NZ", None)
        else:
            os.environ["VLLM_ASCEND_ENABLE_NZ"] = env
        model = fake_model(want)
        return model, fake_worker(model).wsync_load

    def loads(config, env):
        model, load = run(config, env)
        with FakeVllm(2, 0, config):
            load(path)
        assert all(a.tobytes() == want[n][2] for n, a in model_arrays(model, want).items())

    def refused(config, env, shown):
        model, load = run(config, env)
        with FakeVllm(2, 0, config):
            expect_error("%s: rank 0: this vLLM-Ascend engine runs with weight NZ mode %s %s"
                         % (path, shown, advice), load, path, status=3)
        assert untouched(model, want), "copied before refusing"

    new = lambda mode: types.SimpleNamespace(weight_nz_mode=mode)
    old = types.SimpleNamespace()  # v0.18.0: no weight_nz_mode, the variable decides
    try:
        loads(new(0), None)
        loads(new(0), "1")  # additional_config's 0 overrides the variable
        refused(new(1), None, "1")
        refused(new(2), "0", "2")
        refused(old, None, "1")
        refused(old, "2", "2")
        refused(old, "on", "'on'")
        loads(old, "0")
        loads(None, "1")  # not vLLM-Ascend
        # additional_config {"weight_nz_mode": null}: the engine's `if not nz_mode`
        # reads it as off, so the variable does not decide (the old code refused, mode 1)
        loads(new(None), "1")
        # the text "0", which the engine's `if nz_mode` takes as on: shown quoted (the
        # old code said "weight NZ mode 0", which reads as the mode it asks for)
        refused(new("0"), None, "'0'")
    finally:
        if saved is None:
            os.environ.pop("VLLM_ASCEND_ENABLE_NZ", None)
        else:
            os.environ["VLLM_ASCEND_ENABLE_NZ"] = saved


@test
def step_numbers_and_flags_by_one_rule():
    """A step's version is read by one rule everywhere (Session.begin, load_rank,
    wsync_load): an int (numpy's too) or its decimal text, as vLLM keeps weight versions
    as text (LLM.finish_weight_update(weight_version: str | None),
    vllm/entrypoints/llm.py:895 @ df1376907b16); anything else is a usage error naming
    version.  load_rank's verify and require_commit take a bool or "true"/"false" as
    wsync_load's verify does, and digest must be text.  (Before: load_rank refused
    version=numpy.int64(1) and "1" with "an integer is required", -1 with a bare
    OverflowError, took True as version 1 and verify="false" as true, and a bytes
    digest raised a TypeError naming "_open_rank() argument 6".)"""
    need_numpy()
    path, digest = committed_dir()
    want = rank_tensors(path, 0)
    for version in (1, numpy.int64(1), numpy.uint8(1), "1", " 1".strip()):
        params = zero_arrays(want)
        assert wsync.load_rank(path, 0, params, version=version)["version"] == 1, version
        assert all(params[n].tobytes() == raw for n, (_, _, raw) in want.items())
    expect_error("the commit record is of version 1, not 2", wsync.load_rank, path, 0,
                 zero_arrays(want), version="2", status=3)
    for bad, shown in ((True, "True"), (-1, "-1"), ("1.0", "'1.0'"), ("", "''"), (1.0, "1.0"),
                       ("\u0661", "'\u0661'"), (2 ** 64, str(2 ** 64))):
        expect_error("version must be a step number (an int or its decimal text), not %s"
                     % shown, wsync.load_rank, path, 0, zero_arrays(want), version=bad, status=2)
    expect_error("digest must be a str, not bytes", wsync.load_rank, path, 0, zero_arrays(want),
                 digest=digest.encode(), kind=TypeError)
    expect_error("verify must be true or false, not 'no'", wsync.load_rank, path, 0,
                 zero_arrays(want), verify="no", status=2)
    # verify "false" skips the checksums (a file changed after its commit loads), "TRUE"
    # checks them
    bad = fresh_dir("committed-load-rank-flags")
    shutil.copytree(path, bad)
    with open(os.path.join(bad, "kernel-rank-0-part-0.safetensors"), "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    expect_error("(the file changed after its commit)", wsync.load_rank, bad, 0,
                 zero_arrays(want), verify="TRUE", status=3)
    wsync.load_rank(bad, 0, zero_arrays(want), verify="false")
    os.unlink(os.path.join(bad, "wsync-commit.json"))
    expect_error("no commit record", wsync.load_rank, bad, 0, zero_arrays(want),
                 require_commit="true", status=3)
    assert wsync.load_rank(bad, 0, zero_arrays(want), require_commit="False", **KW) is None
    # the trainer side: begin takes the same numbers
    src = synth("tiny-qwen3-moe")
    out = fresh_dir("sess-begin-text")
    s = new_session(src, out, "vllm", "kernel", 2, 1)
    s.describe(description(src))
    for version in ("7", numpy.int64(8)):
        s.begin(version)
        push_all(s, arrays(src))
        s.commit()
        assert record(out)["version"] == int(version)
    expect_error("version must be a step number (an int or its decimal text), not True",
                 s.begin, True, status=2)
    s.close()
    with FakeVllm(2, 0):
        model = fake_model(want)
        assert fake_worker(model).wsync_load(path, numpy.int64(1))["version"] == 1
        expect_error("version must be a step number (an int or its decimal text), not True",
                     fake_worker(model).wsync_load, path, True, status=2)


@test
def vllm_worker_string_arguments():
    """POST /collective_rpc passes arguments as text by vLLM's convention: wsync_load takes
    version "1" and verify "false"/"true" as the int and bools they spell, and refuses
    other text with a usage error.  (Before: version "1" raised a TypeError, and verify
    "false" verified.)"""
    need_numpy()
    path, digest = committed_dir()
    want = rank_tensors(path, 0)
    model = fake_model(want)
    with FakeVllm(2, 0):
        assert fake_worker(model).wsync_load(path, "1", digest, "true")["version"] == 1
        expect_error("the commit record is of version 1, not 2", fake_worker(model).wsync_load,
                     path, version="2", status=3)
        expect_error("version must be a step number (an int or its decimal text), not '1.0'",
                     fake_worker(model).wsync_load, path, version="1.0", status=2)
        expect_error("verify must be true or false, not 'no'", fake_worker(model).wsync_load,
                     path, verify="no", status=2)
    assert all(a.tobytes() == want[n][2] for n, a in model_arrays(model, want).items())

    # verify "false" skips the checksums: a file changed after its commit loads
    bad = fresh_dir("committed-string-arguments")
    shutil.copytree(path, bad)
    file = os.path.join(bad, "kernel-rank-0-part-0.safetensors")
    with open(file, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    with FakeVllm(2, 0):
        expect_error("(the file changed after its commit)", fake_worker(fake_model(want)).wsync_load,
                     bad, verify="true", status=3)
        fake_worker(fake_model(want)).wsync_load(bad, verify="false")


def lora_wrap(model, path):
    """vLLM's LoRA wrapping of the module at path: a module holding it as base_layer
    (vllm/lora/layers/base.py BaseLayerWithLoRA)."""
    parent, _, leaf = path.rpartition(".")
    holder = model.get_submodule(parent)
    wrapper = FakeModule()
    wrapper.children["base_layer"] = holder.children[leaf]
    holder.children[leaf] = wrapper


@test
def vllm_worker_through_lora():
    """With --enable-lora vLLM wraps layers as base_layer (a dense layer's weight moves to
    ...qkv_proj.base_layer.weight, a MoE block's experts under mlp.experts.base_layer.):
    wsync_load resolves the files' names through the wrappers, as vLLM's own reload does,
    and still checks the MoE backend of the wrapped layers.  (Before: "the model has no
    parameter or buffer of that name".)"""
    need_numpy()
    path, _ = committed_dir()
    want = rank_tensors(path, 0)
    wrapped = sorted({n.rpartition(".")[0] for n in want if n.endswith("_proj.weight")} |
                     {n.split(".experts.")[0] + ".experts" for n in want if ".experts." in n})
    assert any(w.endswith(".mlp.experts") for w in wrapped), wrapped

    def lora_model(method):
        """The model, wrapped, and its arrays by the files' names (taken before)."""
        model = with_methods(fake_model(want), want, method)
        arrays = model_arrays(model, want)
        for layer in wrapped:
            lora_wrap(model, layer)
        return model, arrays

    model, arrays = lora_model(lambda: UnquantizedFusedMoEMethod("TRITON"))
    name = [n for n in want if n.endswith("qkv_proj.weight")][0]
    expect_error("", model.get_parameter, name, kind=AttributeError)  # the name moved
    with FakeVllm(2, 0):
        fake_worker(model).wsync_load(path)
    assert all(arrays[n].tobytes() == raw for n, (_, _, raw) in want.items())

    model, _ = lora_model(lambda: UnquantizedFusedMoEMethod("FLASHINFER_CUTLASS"))
    with FakeVllm(2, 0):
        expect_error("of this engine runs them with the unquantized MoE backend "
                     "FLASHINFER_CUTLASS", fake_worker(model).wsync_load, path, status=3)


# ------------------------------------------------------------------ torch, where its strides matter

class _FakeDtype:
    """A torch dtype as wsync sees it: str() gives "torch.NAME"."""

    def __init__(self, name, numpy_name):
        self.name, self.numpy_name = name, numpy_name

    def __str__(self):
        return "torch." + self.name

    __repr__ = __str__


def fake_torch():
    """A module standing in for torch where its strides matter, so that those tests run
    without python3-torch: numpy arrays are the storage (a view shares it, with its own
    strides).  It mirrors the torch semantics wsync and the tests use, as torch 1.13
    (Debian's python3-torch) has them, and the same tests run against that torch too
    where it is installed (torch_flavours):
      - Tensor.shape, .dtype (str "torch.float32"), .is_meta, .requires_grad, dim(),
        detach() (a view that does not require grad), numpy() (the elements as a numpy
        view), data_ptr() (the address of the first element), reshape(),
        element_size();
      - Tensor[index] of integers and slices ending in a slice: a view (basic indexing);
      - Tensor.transpose(d0, d1): a view with the two dimensions' sizes and strides
        swapped, requires_grad kept;
      - Tensor.is_contiguous(): c10's TensorImpl::compute_contiguous: true when every
        dimension of size other than 1 has the stride of a dense row-major tensor (the
        product of the sizes after it), or when the tensor is empty;
      - Tensor.copy_(src): src's elements written through self's strides, src
        broadcast to self's shape (same dtype only, as wsync copies);
      - nn.Parameter(data, requires_grad=True): aliases data's storage and strides
        (torch/nn/parameter.py: Tensor._make_subclass of data, detached);
      - nn.Module: register_parameter, add_module, setattr of a Parameter registers it
        in place of the parameter of that name, setattr of anything else under a
        parameter's name raises TypeError, getattr finds parameters and submodules,
        get_submodule and get_parameter raise AttributeError as torch does ("`x` is not
        an nn.Parameter"), named_parameters yields each Parameter once, module by module
        in registration order (torch/nn/modules/module.py);
      - frombuffer(buffer, dtype=, count=-1) (a view of buffer's first count elements),
        zeros, no_grad, and the dtypes float32 and float64 (and bfloat16, as uint16).
    What load_rank hands to torch is logged: frombuffer_calls gets (buffer, its length,
    the bytes the tensor made of it spans) at each frombuffer, copy_calls (the source's
    bytes, the destination's shape) at each copy_."""
    import types
    torch = types.ModuleType("torch")
    nn = types.ModuleType("torch.nn")
    torch.nn = nn
    torch.float32 = _FakeDtype("float32", "float32")
    torch.float64 = _FakeDtype("float64", "float64")
    torch.bfloat16 = _FakeDtype("bfloat16", "uint16")
    torch.frombuffer_calls, torch.copy_calls = [], []

    class Tensor:
        def __init__(self, array, dtype, requires_grad=False):
            self._array, self.dtype, self.requires_grad = array, dtype, requires_grad

        is_meta = False

        @property
        def shape(self):
            return tuple(self._array.shape)

        def dim(self):
            return self._array.ndim

        def detach(self):
            return Tensor(self._array, self.dtype)

        def numpy(self):
            return self._array

        def data_ptr(self):
            return self._array.__array_interface__["data"][0]

        def reshape(self, shape):
            return Tensor(self._array.reshape(shape), self.dtype, self.requires_grad)

        def element_size(self):
            return self._array.itemsize

        def __getitem__(self, index):
            view = self._array[index]
            assert isinstance(view, numpy.ndarray) and numpy.shares_memory(view, self._array), \
                "the stand-in indexes views only"
            return Tensor(view, self.dtype, self.requires_grad)

        def transpose(self, d0, d1):
            return Tensor(self._array.swapaxes(d0, d1), self.dtype, self.requires_grad)

        def is_contiguous(self):
            if self._array.size == 0:
                return True
            expected = self._array.itemsize
            for size, stride in reversed(list(zip(self._array.shape, self._array.strides))):
                if size != 1:
                    if stride != expected:
                        return False
                    expected *= size
            return True

        def copy_(self, src):
            assert str(src.dtype) == str(self.dtype), "the stand-in copies one dtype"
            torch.copy_calls.append((src._array.nbytes, self.shape))
            self._array[...] = src._array
            return self

    class Parameter(Tensor):
        def __init__(self, data, requires_grad=True):
            Tensor.__init__(self, data._array, data.dtype, requires_grad)

    class Module:
        def __init__(self):
            object.__setattr__(self, "_parameters", {})
            object.__setattr__(self, "_modules", {})

        def register_parameter(self, name, param):
            self._parameters[name] = param

        def add_module(self, name, module):
            self._modules[name] = module

        def __setattr__(self, name, value):
            if isinstance(value, Parameter):
                self.__dict__.pop(name, None)
                self._modules.pop(name, None)
                self.register_parameter(name, value)
            elif name in self._parameters:
                raise TypeError("cannot assign '%s' as parameter '%s' (torch.nn.Parameter or "
                                "None expected)" % (type(value).__name__, name))
            elif isinstance(value, Module):
                self.__dict__.pop(name, None)
                self._modules[name] = value
            else:
                object.__setattr__(self, name, value)

        def __getattr__(self, name):
            for members in (self.__dict__["_parameters"], self.__dict__["_modules"]):
                if name in members:
                    return members[name]
            raise AttributeError("'%s' object has no attribute '%s'" % (type(self).__name__, name))

        def get_submodule(self, target):
            module = self
            for item in target.split(".") if target else []:
                if not hasattr(module, item):
                    raise AttributeError("Module has no attribute `%s`" % item)
                module = getattr(module, item)
                if not isinstance(module, Module):
                    raise AttributeError("`%s` is not an nn.Module" % item)
            return module

        def get_parameter(self, target):
            path, _, leaf = target.rpartition(".")
            module = self.get_submodule(path)
            if not hasattr(module, leaf):
                raise AttributeError("Module has no attribute `%s`" % leaf)
            param = getattr(module, leaf)
            if not isinstance(param, Parameter):
                raise AttributeError("`%s` is not an nn.Parameter" % leaf)
            return param

        def named_parameters(self, prefix=""):
            seen, out = set(), []
            stack = [(prefix, self)]
            while stack:
                path, module = stack.pop(0)
                for name, param in module._parameters.items():
                    if id(param) not in seen:
                        seen.add(id(param))
                        out.append((path + ("." if path else "") + name, param))
                stack[0:0] = [(path + ("." if path else "") + n, m) for n, m in module._modules.items()]
            return iter(out)

    class no_grad:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    torch.Tensor, nn.Parameter, nn.Module, torch.no_grad = Tensor, Parameter, Module, no_grad

    def frombuffer(buffer, dtype, count=-1):
        array = numpy.frombuffer(buffer, dtype=dtype.numpy_name, count=count)
        torch.frombuffer_calls.append((buffer, len(buffer), array.nbytes))
        return Tensor(array, dtype)

    torch.frombuffer = frombuffer
    torch.zeros = lambda shape, dtype: Tensor(numpy.zeros(shape, dtype=dtype.numpy_name), dtype)
    return torch


class _Installed:
    """sys.modules["torch"] set to a stand-in while a test runs."""

    def __init__(self, module):
        self.module = module

    def __enter__(self):
        self.saved = sys.modules.get("torch")
        sys.modules["torch"] = self.module
        return self

    def __exit__(self, *exc):
        if self.saved is None:
            sys.modules.pop("torch", None)
        else:
            sys.modules["torch"] = self.saved


def torch_flavours():
    """[(label, torch module, context)]: the stand-in (fake_torch, in sys.modules while
    the context is entered) always; Debian's python3-torch as well where installed."""
    need_numpy()
    import contextlib
    flavours = [("the torch stand-in", fake_torch(), None)]
    if torch is not None:
        flavours.append(("torch %s" % torch.__version__, torch, None))
    return [(label, module, _Installed(module) if module is not torch else contextlib.nullcontext())
            for label, module, _ in flavours]


def _torch_trace(T):
    """What the tests see of the torch semantics fake_torch mirrors, run with T."""
    def counted(shape):
        n = 1
        for d in shape:
            n *= d
        raw = bytearray(numpy.arange(n, dtype="float32").tobytes())
        return T.frombuffer(raw, dtype=T.float32).reshape(shape)

    def elements(t):
        return numpy.ascontiguousarray(t.detach().numpy()).tobytes()

    seen = []
    for shape in ((2, 3, 4), (2, 3, 3), (2, 1, 4), (2, 4, 1), (1, 3, 4)):
        t = counted(shape)
        v = t.transpose(1, 2)
        p = T.nn.Parameter(v)
        q = T.nn.Parameter(v, requires_grad=False)
        seen.append((shape, t.is_contiguous(), v.shape, v.is_contiguous(), v.dim(),
                     v.transpose(1, 2).is_contiguous(), v.data_ptr() == t.data_ptr(),
                     p.data_ptr() == t.data_ptr(), p.shape, p.is_contiguous(), p.requires_grad,
                     q.requires_grad, isinstance(p, T.Tensor), elements(v)))
        # copy_ writes through the view's strides (square: no error, the storage transposed)
        if shape[1] == shape[2]:
            v.copy_(counted(shape))
            seen.append(("copied through", elements(t)))
    # load_rank's pieces: the first count elements of a buffer, copied into rows of a
    # view (basic indexing), through a transposed view's strides
    t = counted((2, 3, 4))
    v = t.transpose(0, 2)
    raw = bytearray(numpy.arange(100, 124, dtype="float32").tobytes())
    v[1:2].copy_(T.frombuffer(raw, dtype=T.float32, count=6).reshape((1, 3, 2)))
    v[(3, slice(1, 3))].copy_(T.frombuffer(raw, dtype=T.float32, count=4).reshape((2, 2)))
    seen.append(("pieces", v.element_size(), v[1:2].shape, v[1:2].is_contiguous(),
                 v[(3, slice(1, 3))].shape, v[(3, slice(1, 3))].data_ptr() - t.data_ptr(),
                 elements(t)))
    root = T.nn.Module()
    root.add_module("a", T.nn.Module())
    root.a.register_parameter("w", T.nn.Parameter(counted((2, 2)), requires_grad=False))
    root.a.add_module("b", T.nn.Module())
    root.a.b.register_parameter("x", T.nn.Parameter(counted((3,))))
    root.register_parameter("y", root.a.w)  # the same Parameter twice: named once
    root.a.plain = 5
    seen.append([n for n, _ in root.named_parameters()])
    replacement = T.nn.Parameter(counted((2, 2)).transpose(0, 1), requires_grad=False)
    setattr(root.a, "w", replacement)
    seen.append((root.get_parameter("a.w") is replacement, [n for n, _ in root.named_parameters()]))
    for call in (lambda: setattr(root.a, "w", counted((2, 2))), lambda: root.get_parameter("a.plain"),
                 lambda: root.get_parameter("a.nothing"), lambda: root.get_submodule("a.c")):
        try:
            call()
            seen.append("no error")
        except (TypeError, AttributeError) as e:
            seen.append((type(e).__name__, "is not an nn.Parameter" in str(e)))
    return seen


@test
def torch_stand_in_is_torch():
    """The torch stand-in the woken-expert tests use does what Debian's python3-torch
    does with the same calls: shapes, strides (is_contiguous, data_ptr) of transposed
    views and the Parameters made of them, copies through a view's strides, module
    registration and lookup errors."""
    need_numpy()
    need_torch()
    with _Installed(fake_torch()) as installed:
        fake = _torch_trace(installed.module)
    real = _torch_trace(torch)
    for got, want in zip(fake, real):
        assert got == want, (got, want)
    assert len(fake) == len(real)


# ------------------------------------------------------------------ experts woken by vLLM-Ascend

# tests/data/configs/tiny-qwen3-moe-odd-f32.json: F32, H = 40, I = 20, experts in layers 0
# and 2 (layer 1 dense).  At tp 1 vLLM-Ascend's processed w13_weight is [8, 40, 40],
# square (H == 2I/tp), and w2_weight [8, 20, 40], not.
WOKEN_CONFIG = "tiny-qwen3-moe-odd-f32"
WOKEN_H, WOKEN_I, WOKEN_E = 40, 20, 8
GATE, UP, DOWN = 0, 1, 2


def expert_code(layer, proj, expert, row, column):
    """The value the woken-expert tests give element [row, column] of expert `expert`'s
    gate_proj (proj 0), up_proj (1) or down_proj (2) in layer `layer`: every digit
    group readable in a failure, exact in F32 (below 2^24)."""
    return layer * 1000000 + proj * 100000 + expert * 10000 + row * 100 + column


def processed_experts_want(layer, leaf):
    """The values vLLM-Ascend's processed layer holds (docs/vllm-ascend.md section 3),
    derived from the Hugging Face layout alone: w13_weight[e, h, j] is gate_proj[j, h]
    (j < I), then up_proj[j - I, h]; w2_weight[e, i, h] is down_proj[h, i]."""
    e = numpy.arange(WOKEN_E)[:, None, None]
    if leaf == "w13_weight":
        h = numpy.arange(WOKEN_H)[None, :, None]
        j = numpy.arange(2 * WOKEN_I)[None, None, :]
        return expert_code(layer, numpy.where(j < WOKEN_I, GATE, UP), e, j % WOKEN_I, h).astype("float32")
    i = numpy.arange(WOKEN_I)[None, :, None]
    h = numpy.arange(WOKEN_H)[None, None, :]
    return expert_code(layer, DOWN, e, h, i).astype("float32")


_WOKEN_DIR = []


def woken_experts_dir():
    """(dir, digest): one committed step of WOKEN_CONFIG for target vllm-ascend, format
    kernel, tp 1, dtype float32, in parts of at most 16 KiB (so each expert tensor has a file of its own,
    and model.norm.weight comes last, in a later file), every routed-expert element its
    expert_code; the other tensors `wsync synth --pattern index`'s; made once."""
    if not _WOKEN_DIR:
        src = os.path.join(TMP, "synth-" + WOKEN_CONFIG)
        wsync_ok("synth", "--config", os.path.join(HERE, "data", "configs", WOKEN_CONFIG + ".json"),
                 "--pattern", "index", src)
        tensors = arrays(src)
        for name in tensors:
            parts = name.split(".")
            if ".experts." in name and parts[-2] in ("gate_proj", "up_proj", "down_proj"):
                layer, expert = int(parts[2]), int(parts[5])
                proj = ("gate_proj", "up_proj", "down_proj").index(parts[-2])
                rows, columns = numpy.indices(tensors[name].shape)
                tensors[name] = expert_code(layer, proj, expert, rows, columns).astype("float32")
        out = fresh_dir("woken-experts")
        f32 = conf_with("dtype-float32", {"dtype": "float32"})  # not vLLM's BF16 default
        with wsync.Session(os.path.join(src, "config.json"), target="vllm-ascend", format="kernel",
                           tp=1, ep=1, out=out, part_size=16384, **dict(KW, conf_dir=f32)) as s:
            s.describe(description(src))
            s.begin(1)
            push_all(s, tensors)
            s.commit()
            _WOKEN_DIR.append((out, s.digest))
    return _WOKEN_DIR[0]


def rank_entries(path, rank):
    """[(file, name)] of the rank's files, in the record's and the files' order."""
    return [(os.path.join(path, f["file"]), name) for f in record(path)["files"] if f["rank"] == rank
            for name in read_safetensors(os.path.join(path, f["file"]))[1]]


def ascend_engine(T, tensors, lora=False):
    """A vLLM-Ascend model as a worker holds it after loading (T: a torch flavour): a zero
    Parameter (requires_grad False, as vLLM's) at every name of tensors, each MoE layer's
    quant_method vLLM-Ascend's; with lora, each MoE block wrapped as LoRA's base_layer
    (FusedMoEWithLoRA wraps mlp.experts, docs/vllm.md section 7.1)."""
    root = T.nn.Module()
    for name, (dtype, shape, _) in tensors.items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if part not in module._modules:
                module.add_module(part, T.nn.Module())
            module = module._modules[part]
        module.register_parameter(leaf, T.nn.Parameter(
            T.zeros(shape, dtype=getattr(T, TORCH_DTYPES[dtype])), requires_grad=False))
    for layer in moe_layers(tensors):
        root.get_submodule(layer).quant_method = AscendUnquantizedFusedMoEMethod("OOT")
    if lora:
        for block in sorted({n.split(".experts.")[0] for n in tensors if ".experts." in n}):
            mlp = root.get_submodule(block)
            wrapper = T.nn.Module()
            wrapper.add_module("base_layer", mlp._modules["experts"])
            mlp._modules["experts"] = wrapper
    return root


def ascend_wake_up(T, model, hidden_size):
    """NPUWorker.wake_up of vLLM-Ascend's releases for vLLM 0.17 to 0.26.x once the
    allocator restored the weights, as it is written (vllm_ascend/worker/worker.py:218-234
    @ e18643f8a4d5, v0.18.0; docs/vllm-ascend.md section 5)."""
    for name, param in model.named_parameters():
        if "w2_weight" in name and param.shape[2] == hidden_size:
            parts = name.split(".")
            parent_module = model.get_submodule(".".join(parts[:-1]))
            w2_data = T.nn.Parameter(param.transpose(1, 2), requires_grad=False)
            setattr(parent_module, parts[-1], w2_data)
        elif "w13_weight" in name and param.shape[1] == hidden_size:
            parts = name.split(".")
            parent_module = model.get_submodule(".".join(parts[:-1]))
            w13_data = T.nn.Parameter(param.transpose(1, 2), requires_grad=False)
            setattr(parent_module, parts[-1], w13_data)


class _Warnings(list):
    """The messages the logger wsync.vllm_worker emits while the context is entered."""

    def __enter__(self):
        import logging
        self.handler = logging.Handler()
        self.handler.emit = lambda r: self.append((r.levelname, r.getMessage()))
        logging.getLogger("wsync.vllm_worker").addHandler(self.handler)
        return self

    def __exit__(self, *exc):
        import logging
        logging.getLogger("wsync.vllm_worker").removeHandler(self.handler)


def lora_name(name, lora):
    return name.replace(".experts.", ".experts.base_layer.") if lora else name


def all_zero(params):
    return not any(numpy.asarray(p.detach().numpy()).any() for p in params)


@test
def vllm_worker_puts_back_woken_experts():
    """On vLLM-Ascend for vLLM 0.17 to 0.26.x, wake_up leaves each routed-expert
    w13_weight / w2_weight a transposed view of its storage: wsync_load puts the
    processed Parameter back on its module (same storage, contiguous, requires_grad
    False) before copying, so every expert element lands where the kernel reads it,
    square (w13 [8, 40, 40]) or not (w2); it logs and returns what it put back.  An
    engine that did not sleep, or whose experts were put back, is loaded as before, its
    parameters the same objects, the commit record returned as it is.  Run with the
    torch stand-in and with python3-torch where installed.  (Before: refused, "is F32
    [8, 20, 40], but the parameter has shape [8, 40, 20]", at w2; the square w13 had
    passed the checks, and where no other tensor stops the load it is copied through
    the view's strides, leaving the storage transposed without a word.)"""
    path, digest = woken_experts_dir()
    want = rank_tensors(path, 0)
    entries = rank_entries(path, 0)
    experts = [n for _, n in entries if n.endswith(("w13_weight", "w2_weight"))]
    assert len(experts) == 4, experts
    for label, T, installed in torch_flavours():
        for lora in (False, True):
            with installed:
                model = ascend_engine(T, want, lora)
                stored = {n: model.get_parameter(lora_name(n, lora)) for n in experts}
                ascend_wake_up(T, model, WOKEN_H)
                views = {n: model.get_parameter(lora_name(n, lora)) for n in experts}
                for n in experts:
                    assert views[n] is not stored[n] and not views[n].is_contiguous(), (label, n)
                assert [tuple(views[n].shape) for n in experts[:2]] == [
                    (WOKEN_E, WOKEN_H, 2 * WOKEN_I), (WOKEN_E, WOKEN_H, WOKEN_I)], label
                with FakeVllm(1, 0), _Warnings() as warned:
                    r = fake_worker(model).wsync_load(path, digest=digest)
                assert r == dict(record(path), restored=experts), (label, r)
                assert warned == [("WARNING", "%s: rank 0: put back the processed routed experts "
                                   "that vLLM-Ascend's wake_up had replaced by views in the loader "
                                   "shape (%s) before copying into them; do not run "
                                   "process_weights_after_loading on this model after a "
                                   "kernel-format update: it would transpose them a second time "
                                   "(docs/vllm-ascend.md section 5)" % (path, ", ".join(experts)))], \
                    (label, warned)
                for n in experts:
                    p = model.get_parameter(lora_name(n, lora))
                    where = "%s, lora %s: %s" % (label, lora, n)
                    assert isinstance(p, T.nn.Parameter) and p.is_contiguous(), where
                    assert tuple(p.shape) == tuple(want[n][1]) and p.requires_grad is False, where
                    assert p.data_ptr() == stored[n].data_ptr() == views[n].data_ptr(), where
                    expected = processed_experts_want(int(n.split(".")[2]), n.rpartition(".")[2])
                    got = numpy.ascontiguousarray(p.detach().numpy())
                    assert (got == expected).all(), "%s: first wrong element %s" % (
                        where, numpy.argwhere(got != expected)[0])
                    assert got.tobytes() == expected.tobytes() == want[n][2], where
                    # the storage wake_up left is the processed parameter's, now loaded
                    assert numpy.ascontiguousarray(stored[n].detach().numpy()).tobytes() == want[n][2], where
                for _, n in entries:
                    got = numpy.ascontiguousarray(model.get_parameter(lora_name(n, lora)).detach().numpy())
                    assert got.tobytes() == want[n][2], (label, n)

                # loaded again, now that they are put back: nothing to put back
                loaded = {n: model.get_parameter(lora_name(n, lora)) for _, n in entries}
                with FakeVllm(1, 0), _Warnings() as warned:
                    r = fake_worker(model).wsync_load(path, digest=digest)
                assert r == record(path) and warned == [], (label, r, warned)
                assert all(model.get_parameter(lora_name(n, lora)) is p for n, p in loaded.items())

                # an engine that did not sleep
                model = ascend_engine(T, want, lora)
                before = {n: model.get_parameter(lora_name(n, lora)) for _, n in entries}
                with FakeVllm(1, 0), _Warnings() as warned:
                    r = fake_worker(model).wsync_load(path, digest=digest)
                assert r == record(path) and warned == [], (label, r, warned)
                for n, p in before.items():
                    assert model.get_parameter(lora_name(n, lora)) is p, (label, n)
                    assert numpy.ascontiguousarray(p.detach().numpy()).tobytes() == want[n][2], (label, n)


@test
def vllm_worker_woken_experts_refusals():
    """Nothing is put back nor copied unless every file and every tensor passes, the
    woken experts taken in their processed shape: a refusal in a file after theirs leaves
    the views registered and every storage untouched.  A routed-expert parameter in the
    loader shape that is not wake_up's view (a contiguous copy) is refused naming the
    file, the tensor, both shapes and the likely causes.  (Before: the square view was
    copied through, a loader-shaped parameter refused as a bare shape difference.)"""
    path, digest = woken_experts_dir()
    want = rank_tensors(path, 0)
    entries = rank_entries(path, 0)
    experts = [n for _, n in entries if n.endswith(("w13_weight", "w2_weight"))]
    last_file, last = entries[-1]
    assert last == "model.norm.weight", last
    assert all(f != last_file for f, n in entries if n in experts), "the last file holds an expert"
    for label, T, installed in torch_flavours():
        with installed:
            # a later file's tensor refused: the views stay, nothing copied
            model = ascend_engine(T, want)
            stored = [model.get_parameter(n) for n in experts]
            ascend_wake_up(T, model, WOKEN_H)
            views = {n: model.get_parameter(n) for n in experts}
            model.get_submodule("model.norm").weight = T.nn.Parameter(
                T.zeros((WOKEN_H,), dtype=T.float64), requires_grad=False)
            with FakeVllm(1, 0), _Warnings() as warned:
                expect_error('%s: tensor "model.norm.weight" is F32 [40], but the parameter is '
                             'F64' % last_file, fake_worker(model).wsync_load, path, status=3)
            assert warned == [], (label, warned)
            assert all(model.get_parameter(n) is v for n, v in views.items()), label
            assert all_zero(stored) and all_zero(model.get_parameter(n) for _, n in entries), label

            # a loader-shaped copy, not a view, in a woken engine and in one that did not sleep
            for woken in (True, False):
                model = ascend_engine(T, want)
                if woken:
                    ascend_wake_up(T, model, WOKEN_H)
                w2 = experts[1]
                assert w2.endswith("layers.0.mlp.experts.routed_experts.w2_weight"), experts
                file = [f for f, n in entries if n == w2][0]
                holder = model.get_submodule(w2.rpartition(".")[0])
                holder.w2_weight = T.nn.Parameter(T.zeros((WOKEN_E, WOKEN_H, WOKEN_I), dtype=T.float32),
                                                  requires_grad=False)
                kept = {n: model.get_parameter(n) for _, n in entries}
                with FakeVllm(1, 0), _Warnings() as warned:
                    e = expect_error(
                        '%s: tensor "%s" is F32 [8, 20, 40] in vLLM-Ascend\'s processed layout, '
                        'but the parameter has the loader shape [8, 40, 20] and is not the '
                        'transposed view of processed storage that wsync_load puts back: likely '
                        'the weights woke up on a vLLM-Ascend for vLLM 0.17 to 0.26.x, whose '
                        'NPUWorker.wake_up transposes the routed experts to the loader shape, '
                        'and the view was replaced since, or the files were written for another '
                        'format than the engine runs (docs/vllm-ascend.md section 5)' % (file, w2),
                        fake_worker(model).wsync_load, path, status=3)
                assert str(e).startswith(file), str(e)
                assert warned == [], (label, warned)
                assert all(model.get_parameter(n) is p for n, p in kept.items()), label
                assert all_zero(kept.values()), (label, "copied before refusing")


# ------------------------------------------------------------------ the commands

@test
def commands_as_functions():
    """convert writes what `wsync convert` writes and returns what --json prints; plan
    and inspect return what `wsync plan/inspect --json` print; errors carry the
    command's message and exit status."""
    src = synth("tiny-qwen3-moe")
    out = fresh_dir("py-convert")
    p = wsync.convert(src, out, target="vllm", format="kernel", tp=2, ep=2, **KW)
    assert_same_files(converted(src, "vllm", "kernel", 2, 2), out)
    want = json.loads(wsync_ok("plan", src, "--target", "vllm", "--format", "kernel", "--tp", "2",
                               "--ep", "2", "--json"))
    assert p == want
    assert wsync.plan(src, target="vllm", format="kernel", tp="2", ep=2, **KW) == want
    assert wsync.inspect(out, **KW) == json.loads(wsync_ok("inspect", out, "--json"))
    r = run_wsync("plan", src, "--target", "vllm", "--tp", "3")
    e = expect_error(r.stderr.strip()[len("wsync: "):], wsync.plan, src, target="vllm", tp=3, **KW)
    assert e.exit_status == r.returncode, (e.exit_status, r.returncode)
    expect_error("no target given", wsync.plan, src, **KW, status=2)
    # DST that is not wsync's output is replaced only with force=True, as --force
    other = fresh_dir("py-convert-other")
    os.makedirs(other)
    with open(os.path.join(other, "notes.txt"), "w") as f:
        f.write("mine")
    r = run_wsync("convert", src, other, "--target", "vllm")
    assert r.returncode != 0 and os.path.exists(os.path.join(other, "notes.txt")), r.stderr
    expect_error(r.stderr.strip()[len("wsync: "):], wsync.convert, src, other, target="vllm", **KW,
                 status=r.returncode)
    wsync.convert(src, other, target="vllm", force=True, **KW)
    assert not os.path.exists(os.path.join(other, "notes.txt"))
    assert_same_files(converted(src, "vllm", "sharded-state", 1, 1), other)
    expect_error("cannot open", wsync.inspect, os.path.join(TMP, "nothing"), **KW, status=4)


def big_checkpoint():
    """A Llama checkpoint of about 210 MB (`wsync synth`), made once: large enough that
    writing it takes a while."""
    key = ("big-llama",)
    if key not in _SYNTH:
        with open(os.path.join(SRCDIR, "tests", "data", "configs", "tiny-llama3.json")) as f:
            config = json.load(f)
        config.update(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                      vocab_size=32000, num_attention_heads=16, num_key_value_heads=4)
        path = os.path.join(TMP, "big-llama.json")
        with open(path, "w") as f:
            json.dump(config, f)
        dst = os.path.join(TMP, "synth-big-llama")
        wsync_ok("synth", "--config", path, "--pattern", "random", dst)
        _SYNTH[key] = dst
    return _SYNTH[key]


@test
def convert_hears_ctrl_c_and_other_threads_run():
    """While convert works, other Python threads run (the GIL is released), and Ctrl-C
    stops it as it stops `wsync convert`: at the next piece of work, KeyboardInterrupt
    raised, the temporary directory removed, DST never created.  (Before: the SIGINT was
    heard only once the conversion had ended and DST was written.)  Checked in a child
    process: a second thread sends SIGINT when it sees the temporary directory, which
    exists only while convert is in C, so it sees it only if the GIL is free then."""
    src = big_checkpoint()
    parent = fresh_dir("ctrl-c")
    os.makedirs(parent)
    dst = os.path.join(parent, "out")
    script = """if True:
        import os, signal, sys, threading, time, wsync
        src, dst, conf_dir, plugin_dir = sys.argv[1:5]
        parent = os.path.dirname(dst)
        done = threading.Event()
        def watch():
            while not done.is_set():
                if any(n.startswith(".out.wsync-") for n in os.listdir(parent)):
                    os.kill(os.getpid(), signal.SIGINT)
                    return
                time.sleep(0.0002)
        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            wsync.convert(src, dst, target="vllm", tp=2, conf_dir=conf_dir,
                          plugin_dir=plugin_dir)
            outcome = "returned"
        except KeyboardInterrupt:
            outcome = "KeyboardInterrupt"
        done.set()
        watcher.join()
        print(outcome, os.path.exists(dst), sorted(os.listdir(parent)))
    """
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), WSYNC_PLUGIN_PATH="")
    r = subprocess.run([sys.executable, "-c", script, src, dst, CONF_DIR, PLUGIN_DIR], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "KeyboardInterrupt False []", r.stdout + r.stderr


def _convert_signalled_at(point, src, dst, call="convert"):
    """convert(src, dst) (or with @call "plan", plan(src)) in a child process with
    WSYNC_TEST_SIGNAL_AT=@point (SIGINT at that point of the run, core/exec.c
    plan_signal_if_asked()); returns the line the child prints: what convert returned or
    raised, as repr()."""
    script = """if True:
        import sys, wsync
        src, dst, conf_dir, plugin_dir, call = sys.argv[1:6]
        kw = dict(conf_dir=conf_dir, plugin_dir=plugin_dir)
        try:
            if call == "convert":
                wsync.convert(src, dst, target="vllm", format="kernel", tp=2, **kw)
            else:
                wsync.plan(src, target="vllm", format="kernel", tp=2, **kw)
            print("returned")
        except BaseException as e:
            print(repr(e))
    """
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), WSYNC_PLUGIN_PATH="",
               WSYNC_TEST_SIGNAL_AT=point)
    r = subprocess.run([sys.executable, "-c", script, src, dst, CONF_DIR, PLUGIN_DIR, call],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@test
def convert_and_plan_interrupted_while_planning():
    """Ctrl-C while convert() or plan() plans (a whole model takes seconds)
    stops the planning at its next step: KeyboardInterrupt at once, saying so, nothing
    written, DST as it was.  (Before: the plan heard no interrupt flag until it was
    planned, so Ctrl-C waited for the whole plan, and then said the temporary directory
    was removed.)  WSYNC_TEST_SIGNAL_AT=planning raises SIGINT as planning begins."""
    src = synth("tiny-qwen3-moe")
    parent = fresh_dir("signal-planning")
    os.makedirs(parent)
    dst = os.path.join(parent, "out")
    wsync_ok("convert", synth("tiny-qwen3"), dst, "--target", "vllm", "--tp", "2")
    before = read_checkpoint(dst)
    inode = os.stat(dst).st_ino

    said = _convert_signalled_at("planning", src, dst)
    assert said == ("KeyboardInterrupt('convert: planning was interrupted by SIGINT: nothing "
                    "was written; DST is as it was')"), said
    assert os.stat(dst).st_ino == inode and read_checkpoint(dst) == before
    assert sorted(os.listdir(parent)) == ["out"], os.listdir(parent)

    said = _convert_signalled_at("planning", src, dst, call="plan")
    assert said == "KeyboardInterrupt()", said


@test
def convert_interrupted_at_the_swap_says_what_dst_is():
    """Ctrl-C at the last moments of convert: KeyboardInterrupt says what became of DST,
    truly.  Just before the swap (every file written): the run stops, "DST is as it was"
    and it is (the same directory, the same bytes), no temporary left.  Just after the
    swap: nothing can stop it any more, and the text says DST is the new output,
    complete; it is (the output `wsync convert` writes).  (Before: KeyboardInterrupt
    had no text, and convert's help said "dst stays as it was" whatever the moment; a
    signal in the run's last 50 ms was heard after convert returned, by the next
    bytecode.)"""
    src = synth("tiny-qwen3-moe")
    want = converted(src, "vllm", "kernel", 2, 1)
    parent = fresh_dir("signal-at")
    os.makedirs(parent)
    dst = os.path.join(parent, "out")
    old = synth("tiny-qwen3")  # an earlier output, as a user's DST would be
    wsync_ok("convert", old, dst, "--target", "vllm", "--tp", "2")
    before = read_checkpoint(dst)
    inode = os.stat(dst).st_ino

    said = _convert_signalled_at("written", src, dst)
    assert said == ("KeyboardInterrupt('convert: interrupted by SIGINT: the temporary "
                    "directory is removed; DST is as it was')"), said
    assert os.stat(dst).st_ino == inode and read_checkpoint(dst) == before
    assert sorted(os.listdir(parent)) == ["out"], os.listdir(parent)

    said = _convert_signalled_at("swapped", src, dst)
    assert said == ("KeyboardInterrupt('convert: interrupted by SIGINT as DST was swapped in: "
                    "DST is the new output, complete')"), said
    assert os.stat(dst).st_ino != inode
    assert_same_files(want, dst)
    assert sorted(os.listdir(parent)) == ["out"], os.listdir(parent)


@test
def missing_path_is_an_io_failure():
    """A path the caller names that is not there is an I/O failure (status 4) in every
    entry point, as the command's exit status is for it (README "Exit status"; commit
    953feca): wsync.Session's config_path was "PATH: no such file", status 3, where
    `wsync config PATH` says "cannot open PATH: No such file or directory", exit 4."""
    src = synth("tiny-qwen3-moe")
    step = fresh_dir("missing-path-dcp")
    single = [n for n in os.listdir(src) if n.endswith(".safetensors")]
    subprocess.run([sys.executable, os.path.join(HERE, "make-dcp-fixtures.py"), "--shard",
                    os.path.join(src, single[0]), step], check=True, stdout=subprocess.DEVNULL)
    dcp = os.path.join(step, "b")
    gone = fresh_dir("missing-path")
    config = os.path.join(gone, "config.json")
    out = fresh_dir("missing-path-out")
    enoent = "No such file or directory"
    cannot = "cannot open %s: %s" % (gone, enoent)
    said_config = "--config %s: %s" % (config, enoent)
    calls = [
        ("convert", cannot, wsync.convert, (gone, out), {"target": "vllm"}),
        ("plan", cannot, wsync.plan, (gone,), {"target": "vllm"}),
        ("merge", cannot, wsync.merge, (gone, out), {}),
        ("inspect", cannot, wsync.inspect, (gone,), {}),
        ("load_rank", cannot, wsync.load_rank, (gone, 0, {}), None),
        ("Session", "cannot open %s: %s" % (config, enoent), wsync.Session, (config,),
         {"target": "vllm"}),
        ("convert config=", said_config, wsync.convert, (src, out),
         {"target": "vllm", "config": config}),
        ("plan config=", said_config, wsync.plan, (src,), {"target": "vllm", "config": config}),
        ("merge config=", said_config, wsync.merge, (dcp, out), {"config": config}),
    ]
    for what, said, fn, args, kw in calls:
        e = expect_error(said, fn, *args, **(dict(KW, **kw) if kw is not None else {}))
        assert (str(e), e.exit_status) == (said, 4), (what, str(e), e.exit_status)
    assert not os.path.exists(out)
    # the command says the same of the same path
    r = run_wsync("config", config)
    assert (r.returncode, r.stderr) == (4, "wsync: cannot open %s: %s\n" % (config, enoent)), r


@test
def plugin_dir_not_a_directory_is_refused():
    """A plugin_dir that is not there or not a directory is refused as the command's
    --plugin-dir is (commit 6cc41a4), in the same words (the library's,
    wsync_context_new_default()), status 2, in every entry point that loads plugins; an
    entry of a list too.  (Before: skipped without a word, so a mistyped one loaded the
    installed plugins in place of a build's.)"""
    src = synth("tiny-qwen3-moe")
    gone = fresh_dir("plugin-dir-gone")
    a_file = os.path.join(src, "config.json")
    for bad, reason in ((gone, "No such file or directory"), (a_file, "Not a directory")):
        said = "%s: cannot read plugin directory: %s" % (bad, reason)
        for what, fn, args, kw in (
                ("plan", wsync.plan, (src,), {"target": "vllm", "plugin_dir": bad}),
                ("plan list", wsync.plan, (src,), {"target": "vllm", "plugin_dir": [PLUGIN_DIR, bad]}),
                ("convert", wsync.convert, (src, fresh_dir("plugin-dir-out")),
                 {"target": "vllm", "plugin_dir": bad}),
                ("inspect", wsync.inspect, (src,), {"plugin_dir": bad}),
                ("Session", wsync.Session, (a_file,), {"target": "vllm", "plugin_dir": bad})):
            e = expect_error(said, fn, *args, conf_dir=CONF_DIR, **kw)
            assert (str(e), e.exit_status) == (said, 2), (what, str(e), e.exit_status)
        # the command's words
        r = run_wsync("--plugin-dir", bad, "inspect", src)
        assert (r.returncode, r.stderr) == (2, "wsync: %s\n" % said), r
    assert not os.path.exists(fresh_dir("plugin-dir-out"))


@test
def merge_as_function():
    """merge consolidates a sharded checkpoint (DCP's safetensors mode) as `wsync merge`."""
    src = synth("tiny-qwen3-moe")
    shards = fresh_dir("dcp")
    script = os.path.join(HERE, "make-dcp-fixtures.py")
    single = [n for n in os.listdir(src) if n.endswith(".safetensors")]
    assert len(single) == 1
    subprocess.run([sys.executable, script, "--shard", os.path.join(src, single[0]), shards],
                   check=True, stdout=subprocess.DEVNULL)
    out, ref = fresh_dir("py-merge"), fresh_dir("cli-merge")
    got = wsync.merge(os.path.join(shards, "a"), out, **KW)
    want = json.loads(wsync_ok("merge", os.path.join(shards, "a"), ref, "--json"))
    got["source"] = want["source"] = None
    assert got == want
    assert read_checkpoint(out) == read_checkpoint(ref) == read_checkpoint(src)


@test
def merge_select_as_function():
    """A DCP save of the model beside its optimizer ({"app": {"model", "optim"}}, the torch
    recipe's and slime's): merge refuses it as `wsync merge` does, and select= is
    --select."""
    fixtures = fresh_dir("dcp-fixtures")
    subprocess.run([sys.executable, os.path.join(HERE, "make-dcp-fixtures.py"), fixtures],
                   check=True, stdout=subprocess.DEVNULL)
    src = os.path.join(fixtures, "app-b")
    refused = fresh_dir("py-merge-refused")
    expect_error("app.model (2 tensors) and app.optim (6 tensors, 2 other values); "
                 "pass --select KEY", wsync.merge, src, refused, status=3, **KW)
    assert not os.path.exists(refused)
    out, ref = fresh_dir("py-merge-select"), fresh_dir("cli-merge-select")
    got = wsync.merge(src, out, select="app.model", **KW)
    want = json.loads(wsync_ok("merge", src, ref, "--select", "app.model", "--json"))
    got["source"] = want["source"] = None
    assert got == want
    assert sorted(read_checkpoint(out)) == ["b", "w"]
    assert read_checkpoint(out) == read_checkpoint(ref)
    expect_error("select must be a str, not int", wsync.merge, src, out, select=1,
                 kind=TypeError, **KW)
    # inspect reads it as `wsync inspect --json` does, the refusal's reason and --select
    # included; select= on a checkpoint that is not sharded is a usage error
    for select in (None, "app.model"):
        args = ["--select", select] if select else []
        want = json.loads(wsync_ok("inspect", src, "--json", *args))
        got = wsync.inspect(src, select=select, **KW)
        assert got == want, (got, want)
    names = [t["name"] for t in wsync.inspect(src, select="app.model", **KW)["tensors"]]
    assert names == ["b", "w"], names
    assert wsync.inspect(src, **KW)["refusal"].startswith(
        "the checkpoint holds more than one state dict: under app, app.model (2 tensors)")
    expect_error("--select applies to a sharded training checkpoint (PyTorch DCP), and %s is "
                 "none" % out, wsync.inspect, out, select="app.model", status=2, **KW)


@test
def config_as_keyword():
    """config= is --config DIR: a DCP checkpoint with no config.json anywhere converts,
    plans and merges with DIR's config.json (or that file, os.PathLike too) and tokenizer,
    as the command does; a DIR without config.json is refused naming it.  (Before:
    TypeError, an unexpected keyword.)"""
    import pathlib
    src = synth("tiny-qwen3-moe")
    step = fresh_dir("config-kw-step")
    single = [n for n in os.listdir(src) if n.endswith(".safetensors")]
    subprocess.run([sys.executable, os.path.join(HERE, "make-dcp-fixtures.py"), "--shard",
                    os.path.join(src, single[0]), step], check=True, stdout=subprocess.DEVNULL)
    dcp, base = os.path.join(step, "b"), fresh_dir("config-kw-base")
    os.makedirs(base)
    shutil.copy(os.path.join(src, "config.json"), os.path.join(base, "config.json"))
    with open(os.path.join(base, "tokenizer.json"), "w") as f:
        f.write('{"model": "base"}\n')
    note = ("config.json from %s, as --config names it; the companion files (tokenizer, "
            "generation config) from there too, none from the source"
            % os.path.join(base, "config.json"))
    out, ref = fresh_dir("py-config-kw"), fresh_dir("cli-config-kw")
    got = wsync.convert(dcp, out, target="vllm", config=base, **KW)
    want = json.loads(wsync_ok("convert", dcp, ref, "--target", "vllm", "--config", base,
                               "--json"))
    assert got == want, (got, want)
    assert got["config"] == os.path.join(base, "config.json") and got["notes"][0] == note
    assert_same_files(ref, out)
    assert sorted(os.listdir(out)) == [".wsync-output", "config.json",
                                       "model-rank-0-part-0.safetensors", "tokenizer.json"]
    planned = wsync.plan(dcp, target="vllm", config=pathlib.Path(base, "config.json"), **KW)
    assert planned["config"] == os.path.join(base, "config.json"), planned["config"]
    merged = fresh_dir("py-config-kw-merge")
    wsync.merge(dcp, merged, config=base, **KW)
    assert {"config.json", "tokenizer.json"} <= set(os.listdir(merged))
    expect_error("--config %s: the directory holds no config.json" % step, wsync.convert, dcp,
                 fresh_dir("py-config-kw-never"), target="vllm", config=step, status=2, **KW)
    assert not os.path.exists(os.path.join(TMP, "py-config-kw-never"))


# ------------------------------------------------------------------ the module's surface

# Every public callable's signature, as inspect.signature (and so help(), IDEs and
# documentation tools) sees it: the C functions' docstrings carry it in CPython's
# __text_signature__ form.
SIGNATURES = {
    "convert": "(src, dst, *, target=None, format=None, tp=None, ep=None, rank=None, "
               "threads=None, part_size=None, conf_dir=None, plugin_dir=None, select=None, "
               "config=None, force=False)",
    "plan": "(src, *, target=None, format=None, tp=None, ep=None, rank=None, threads=None, "
            "part_size=None, conf_dir=None, plugin_dir=None, select=None, config=None)",
    "merge": "(src, dst, *, part_size=None, threads=None, conf_dir=None, plugin_dir=None, "
             "select=None, config=None, force=False)",
    "inspect": "(path, *, conf_dir=None, plugin_dir=None, select=None)",
    "load_rank": "(dir, rank, params, *, verify=True, require_commit=True, version=None, "
                 "digest=None, conf_dir=None, plugin_dir=None)",
    "Session": "(config_path, *, target=None, format=None, tp=None, ep=None, out=None, "
               "conf_dir=None, plugin_dir=None, threads=None, part_size=None, "
               "bucket_bytes=None, max_open_buckets=None)",
    "Session.describe": "(self, tensors, /)",
    "Session.manifest": "(self, rank, /)",
    "Session.begin": "(self, version, /)",
    "Session.push": "(self, /, name, tensor, offsets=None)",
    "Session.commit": "(self, /)",
    "Session.abort": "(self, /)",
    "Session.close": "(self, /)",
    "Session.__enter__": "(self, /)",
    "Session.__exit__": "(self, exc_type, exc_value, traceback, /)",
}


@test
def signatures_and_docstrings():
    """inspect.signature works on every public function, class and method, and gives
    the parameters they take; each has a docstring that does not repeat the signature
    as text.  (Before: "no signature found for builtin" for everything written in C.)"""
    import inspect
    for path, want in SIGNATURES.items():
        obj = wsync
        for part in path.split("."):
            obj = getattr(obj, part)
        got = str(inspect.signature(obj))
        assert got == want, "%s%s, expected %s%s" % (path, got, path, want)
        doc = inspect.getdoc(obj) or ""
        assert len(doc) > 20 and not doc.startswith(path.rpartition(".")[2] + "("), (path, doc)
    for name in wsync.__all__:
        assert inspect.getdoc(getattr(wsync, name)), name
    # the keywords the signatures show are the ones the calls take
    assert not os.path.exists(os.path.join(TMP, "nothing"))
    expect_error("cannot open", wsync.inspect, path=os.path.join(TMP, "nothing"), **KW, status=4)


@test
def every_keyword_is_documented():
    """help() of each public callable (the functions, Session and its methods) names every
    keyword it accepts, as a word of its docstring.  (Before: load_rank did not name
    conf_dir and plugin_dir, without which rank files of no commit record fail with "no
    rank file of rank 0" where no configuration is installed; Session named neither
    threads, part_size nor max_open_buckets; plan named none of its options.)"""
    import inspect
    callables = [(name, getattr(wsync, name)) for name in wsync.__all__]
    callables += [("Session." + name, getattr(wsync.Session, name)) for name in dir(wsync.Session)
                  if callable(getattr(wsync.Session, name)) and name in SESSION_METHODS]
    checked = 0
    for path, obj in callables:
        try:
            parameters = inspect.signature(obj).parameters.values()
        except ValueError:  # Error, Bucket, ManifestEntry: built-in constructors
            assert path in ("Error", "Bucket", "ManifestEntry"), path
            continue
        doc = inspect.getdoc(obj) or ""
        keywords = [p.name for p in parameters if p.name != "self" and
                    p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        missing = [k for k in keywords if not re.search(r"\b%s\b" % re.escape(k), doc)]
        assert not missing, "help(wsync.%s) does not name %s" % (path, ", ".join(missing))
        checked += len(keywords)
    assert checked >= 60, checked  # every function's keywords were seen


SESSION_METHODS = {name.split(".")[1] for name in SIGNATURES if name.startswith("Session.")}


@test
def public_names_are_the_documented_api():
    """dir(wsync) of a fresh import shows the API and nothing else: its public names are
    __all__, and each is named as wsync.NAME in README's section on the Python module.
    (Before: itertools and sys, the package's own imports, were among them.)"""
    code = "import wsync; print(' '.join(n for n in dir(wsync) if not n.startswith('_')))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    public = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env,
                            universal_newlines=True, check=True).stdout.split()
    assert sorted(public) == sorted(wsync.__all__), (public, wsync.__all__)
    with open(os.path.join(SRCDIR, "README.md")) as f:
        readme = f.read()
    section = readme.split("### The Python module `wsync`")[1].split("\n### ")[0]
    documented = set(re.findall(r"\bwsync\.([A-Za-z_]\w*)", section))
    assert set(public) <= documented, sorted(set(public) - documented)


@test
def session_takes_a_tied_state_dict():
    """A tied model's state_dict() keeps lm_head.weight beside the embedding (torch dedups
    tied keys in named_parameters(), not in state_dict()): the README's
    describe((name, "BF16", t.shape) for name, t in state_dict.items()) plans, push
    accepts lm_head.weight and writes nothing from it (its values are not compared: a
    session plans before any data), and the rank files are those `wsync convert` writes
    from the checkpoint without it.  A lm_head.weight of another shape, or without the
    embedding, is refused when the session plans.  (Self-contained: the copy rule
    tied-lm-head of the qwen3_moe plugin, docs/vllm.md §3.)"""
    need_numpy()
    src = synth("tiny-qwen3-moe-tied")
    config = os.path.join(src, "config.json")
    embed = "model.embed_tokens.weight"
    tensors = arrays(src)
    assert "lm_head.weight" not in tensors and embed in tensors
    state_dict = dict(tensors)
    state_dict["lm_head.weight"] = tensors[embed]
    want = converted(src, "vllm", "kernel", 2, 1)
    out = fresh_dir("py-tied-head")
    s = wsync.Session(config, target="vllm", format="kernel", tp=2, out=out, **KW)
    s.describe((name, "BF16", t.shape) for name, t in state_dict.items())
    s.begin(1)
    for name, t in state_dict.items():
        s.push(name, t)
    s.commit()
    assert_same_files(want, out)
    # the pushed copy is ignored: other values change nothing
    s.begin(2)
    for name, t in state_dict.items():
        s.push(name, numpy.zeros_like(t) if name == "lm_head.weight" else t)
    s.commit()
    assert_same_files(want, out)

    vocab, hidden = tensors[embed].shape
    e = expect_error('session: input tensor "lm_head.weight" is BF16 [%d, %d] but "%s" is BF16 '
                     "[%d, %d]: rule tied-lm-head of remapper qwen3_moe (plugin qwen3_moe) takes "
                     "the first for a copy of the second (the model ties them), and an engine "
                     "keeps only one of two different tensors"
                     % (vocab - 1, hidden, embed, vocab, hidden),
                     wsync.Session(config, target="vllm", out=fresh_dir("py-tied-bad"), **KW).describe,
                     [(name, "BF16", (vocab - 1, hidden) if name == "lm_head.weight" else t.shape)
                      for name, t in state_dict.items()])
    assert e.exit_status == 3, e.exit_status
    e = expect_error('session: input tensor "lm_head.weight" is BF16 [%d, %d] but the source holds '
                     'no "%s": rule tied-lm-head' % (vocab, hidden, embed),
                     wsync.Session(config, target="vllm", out=fresh_dir("py-tied-alone"), **KW).describe,
                     [(name, "BF16", t.shape) for name, t in state_dict.items() if name != embed])
    assert e.exit_status == 3, e.exit_status


# ------------------------------------------------------------------ TAP

def main(argv):
    print("1..%d" % len(TESTS))
    failed = 0
    for number, fn in enumerate(TESTS, 1):
        name = fn.__name__.replace("_", " ")
        try:
            fn()
        except Skip as why:
            print("ok %d - %s # SKIP %s" % (number, name, why))
        except Exception:
            failed += 1
            print("not ok %d - %s" % (number, name))
            for line in traceback.format_exc().splitlines():
                print("# " + line)
        else:
            print("ok %d - %s" % (number, name))
        sys.stdout.flush()
    shutil.rmtree(TMP, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
