#!/usr/bin/env python3
"""The distributed sync (issue 13) under mpirun: `mpirun -np N wsync sync SRC DST ...`
must write, file for file and byte for byte, what `wsync convert SRC DST` writes for the
same target, format, tp and ep (the marker .wsync-output aside), for Qwen3-MoE and
Qwen3.5-MoE from `wsync synth --pattern index` (every element encodes where it came
from), both formats, with ep, vLLM-Ascend's transposed experts, buckets of 4 KiB (tensors
cut across buckets, runs of inputs sent as they are) and the default, -np 2 and -np 4,
--ranks, processes with no ranks and two output directories on one host.  Then the
faults: bad input on process 0, a DST that process 2 cannot write (an MPMD launch gives
it its own DST), a process count that does not divide the ranks, a DST that is not
wsync's, and wsync-mpi not installed: every process exits with the same status and
prints the same one line naming the process and the cause, no temporary directory is
left and an existing DST is untouched.

Every process runs on this host: mpirun --oversubscribe, --mca plm isolated (no ssh or
rsh needed, as in a chroot), --allow-run-as-root when root, Open MPI's single-copy
transport off (CMA needs ptrace rights that containers often withhold; the copy-in /
copy-out path is as correct).  Skips, saying why, when wsync-mpi was not built or
mpirun is missing.

Prints TAP.  Accepts and ignores --tap and -k (tests/tap-test passes them).
Environment (set by Makefile.am's AM_TESTS_ENVIRONMENT): WSYNC_TEST_BINARY,
WSYNC_TEST_BUILT_PLUGIN_DIR, WSYNC_TEST_CONF_DIR, WSYNC_LIBEXECDIR, WSYNC_TEST_MPI,
G_TEST_SRCDIR."""

import filecmp
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRCDIR = os.path.dirname(HERE)


def env_path(name, fallback):
    value = os.environ.get(name)
    return value if value else fallback


BINARY = env_path("WSYNC_TEST_BINARY", os.path.join(SRCDIR, "wsync"))
PLUGIN_DIR = env_path("WSYNC_TEST_BUILT_PLUGIN_DIR", os.path.join(SRCDIR, "plugins", ".libs"))
CONF_DIR = env_path("WSYNC_TEST_CONF_DIR", os.path.join(SRCDIR, "conf.d"))
CONFIG_DIR = os.path.join(os.path.dirname(env_path("G_TEST_SRCDIR", HERE)), "configs")
MARKER = ".wsync-output"
# what convert copies beside the weights, and what it leaves behind
COMPANIONS = {"tokenizer.json": '{"model": "sync-test"}\n',
              "generation_config.json": '{"temperature": 0.6}\n'}
LEFT_BEHIND = {"optimizer.pt": "not for engines\n"}


def wsync_cmd(*args):
    return [BINARY, "--conf-dir", CONF_DIR, "--plugin-dir", PLUGIN_DIR] + list(args)


def run(cmd, env=None):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, env=dict(os.environ, WSYNC_PLUGIN_PATH="",
                                                            **(env or {})))


def mpirun_prefix():
    cmd = ["mpirun", "-q", "--oversubscribe", "--bind-to", "none", "--mca", "plm", "isolated"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


MPI_ENV = {"OMPI_MCA_btl_vader_single_copy_mechanism": "none"}
# Without /sys (a chroot, as the fresh-Debian CI runs in), hwloc's Linux discovery
# cannot read the CPU topology and says so on every process's stderr, which the tests
# hold to wsync's lines alone: tell hwloc not to try (README, "Running it").
if not os.path.isdir("/sys/devices/system/cpu"):
    MPI_ENV["HWLOC_COMPONENTS"] = "-linux"
# The runs whose processes are all signalled after the last exchange: when the first ends
# by its signal, mpirun sends the others SIGTERM and, odls_base_sigkill_timeout seconds
# later (1 by default), SIGKILL.  Each caught its own signal and prints its line before it
# ends by it; on a loaded machine that took more than a second, and SIGKILL took the line
# with it.  (Not for the other signal tests: there a process may wait on one that ended,
# and would wait out the timeout.)
SIGNALLED_ENV = dict(MPI_ENV, OMPI_MCA_odls_base_sigkill_timeout="5")


def sync(apps):
    """mpirun with one app context per (np, args) of @apps (an MPMD launch when there is
    more than one): each process runs `wsync sync ARGS`."""
    cmd = mpirun_prefix()
    for i, (np, args) in enumerate(apps):
        if i:
            cmd.append(":")
        cmd += ["-np", str(np)] + wsync_cmd("sync", *args)
    return run(cmd, MPI_ENV)


# Why the test under way was skipped (skip()), for its TAP line: a case that could not
# run must read "ok N - ... # SKIP why", not pass.
SKIPPED = []


def skip(why):
    SKIPPED.append(why)


class Checks:
    def __init__(self):
        self.problems = []

    def that(self, ok, what):
        if not ok:
            self.problems.append(what)
        return ok


def data_files(d):
    return sorted(n for n in os.listdir(d) if n != MARKER)


def temporaries(parent, base):
    return [n for n in os.listdir(parent) if n.startswith("." + base + ".wsync-")]


def compare_dirs(c, expected, got, names=None):
    """@got holds exactly the files @names of @expected (all by default), equal byte for
    byte, and the marker."""
    want = sorted(names) if names is not None else data_files(expected)
    if not c.that(os.path.isdir(got), "%s was not written" % got):
        return
    c.that(data_files(got) == want, "%s holds %s, expected %s" % (got, data_files(got), want))
    for name in want:
        a, b = os.path.join(expected, name), os.path.join(got, name)
        c.that(os.path.isfile(b) and filecmp.cmp(a, b, shallow=False),
               "%s differs from convert's %s" % (b, a))
    c.that(os.path.isfile(os.path.join(got, MARKER)), "%s has no %s" % (got, MARKER))


def one_line_from_every_process(c, result, n, status, fragments):
    """Every one of the @n processes printed the same one line, naming the failing process
    and the cause (@fragments), and exited with @status."""
    c.that(result.returncode == status,
           "exit %d, expected %d (stderr: %s)" % (result.returncode, status, result.stderr.strip()))
    lines = result.stderr.splitlines()
    c.that(len(lines) == n and len(set(lines)) == 1,
           "expected one identical line from each of %d processes, got: %r" % (n, lines))
    for line in set(lines):
        c.that(line.startswith("wsync: sync: process "), "not a wsync line: %r" % line)
        for f in fragments:
            c.that(f in line, "%r lacks %r" % (line, f))


class Job:
    def __init__(self, work):
        self.work = work
        self.made = {}
        self.count = 0

    def path(self, what):
        self.count += 1
        return os.path.join(self.work, "%s-%d" % (what, self.count))

    def synth(self, config):
        if config not in self.made:
            d = os.path.join(self.work, "src-" + config)
            r = run(wsync_cmd("synth", "--config", os.path.join(CONFIG_DIR, config + ".json"),
                              "--pattern", "index", d, "-q"))
            if r.returncode != 0:
                raise SystemExit("Bail out! wsync synth %s: exit %d: %s"
                                 % (config, r.returncode, r.stderr.strip()))
            for name, text in list(COMPANIONS.items()) + list(LEFT_BEHIND.items()):
                with open(os.path.join(d, name), "w") as f:
                    f.write(text)
            self.made[config] = d
        return self.made[config]

    def convert(self, src, layout):
        key = (src, tuple(layout))
        if key not in self.made:
            d = self.path("convert")
            r = run(wsync_cmd("convert", src, d, "-q", *layout))
            if r.returncode != 0:
                raise SystemExit("Bail out! wsync convert %s: exit %d: %s"
                                 % (" ".join(layout), r.returncode, r.stderr.strip()))
            self.made[key] = d
        return self.made[key]


def layout_args(target, fmt, tp, ep):
    """The layout options; @fmt None for a target without named formats (hf...)."""
    return (["--target", target] + (["--format", fmt] if fmt else []) +
            ["--tp", str(tp), "--ep", str(ep)])


def split_extra(extra):
    """@extra's options that shape the files (--part-size: convert's too), and those
    of sync alone."""
    both, sync_only = [], []
    for i in range(0, len(extra), 2):
        (both if extra[i] == "--part-size" else sync_only).extend(extra[i:i + 2])
    return both, sync_only


def rank_of_file(name):
    """The rank whose file @name is (a rank file, or a part of the one checkpoint of a
    target of one rank, hf...), or None for the other files."""
    m = re.match(r"(?:model|kernel)-rank-(\d+)-part-\d+\.safetensors$", name)
    if m:
        return int(m.group(1))
    return 0 if name.endswith(".safetensors") else None


# (config, np, target, format, tp, ep, extra sync options)
EQUAL_CASES = [
    ("tiny-qwen3-moe", 2, "vllm", "sharded-state", 2, 1, []),
    ("tiny-qwen3-moe", 4, "vllm", "kernel", 2, 4, ["--bucket-size", "4K"]),
    ("tiny-qwen3-moe", 4, "vllm-ascend", "kernel", 2, 4, []),
    ("tiny-qwen3-moe", 2, "vllm", "sharded-state", 4, 4, ["--bucket-size", "4K"]),
    ("tiny-qwen3-moe", 2, "vllm-ascend", "kernel", 2, 4, ["--ranks", "1,3/0,2"]),
    ("tiny-qwen3-moe", 3, "vllm", "kernel", 2, 4, ["--ranks", "/0-1/2-3", "--bucket-size", "4K"]),
    ("tiny-qwen3.5-moe", 2, "vllm", "kernel", 2, 2, []),
    ("tiny-qwen3.5-moe", 4, "vllm", "sharded-state", 4, 1, ["--bucket-size", "4K"]),
    ("tiny-qwen3.5-moe", 4, "vllm-ascend", "kernel", 2, 4, ["--bucket-size", "4K"]),
    ("tiny-qwen3.5-moe", 2, "vllm-ascend", "sharded-state", 2, 2, []),
    # the targets of one rank, --part-size (several files per rank, the index), a dense
    # model, tied embeddings, tp 1 with ep 3, a single process
    ("tiny-qwen3-moe", 1, "hf", None, 1, 1, ["--part-size", "64K"]),
    ("tiny-qwen3-moe", 2, "hf-experts", None, 1, 1, ["--part-size", "30K", "--ranks", "/0"]),
    ("tiny-qwen3.5-moe", 1, "hf-fused", None, 1, 1, ["--part-size", "100K",
                                                     "--bucket-size", "4K"]),
    ("tiny-qwen3-moe", 2, "vllm", "kernel", 2, 2, ["--part-size", "50K", "--bucket-size", "4K"]),
    ("tiny-qwen3.5-moe", 4, "vllm-ascend", "sharded-state", 4, 1, ["--part-size", "40K"]),
    ("tiny-qwen3", 2, "vllm", "sharded-state", 2, 1, ["--bucket-size", "4K"]),
    ("tiny-qwen3-moe-tied", 2, "vllm-ascend", "kernel", 2, 2, ["--part-size", "32K"]),
    ("tiny-qwen3-moe", 3, "vllm", "kernel", 1, 3, []),
]


def check_equal(job, case):
    config, np, target, fmt, tp, ep, extra = case
    c = Checks()
    src = job.synth(config)
    both, extra = split_extra(extra)
    layout = layout_args(target, fmt, tp, ep) + both
    expected = job.convert(src, layout)
    dst = job.path("sync")
    r = sync([(np, [src, dst, "--json"] + layout + extra)])
    if not c.that(r.returncode == 0, "exit %d: %s" % (r.returncode, r.stderr.strip())):
        return c.problems
    c.that(r.stderr == "", "stderr: %r" % r.stderr)
    compare_dirs(c, expected, dst)
    for name in COMPANIONS:
        c.that(os.path.isfile(os.path.join(dst, name)), "%s: no %s" % (dst, name))
    for name in LEFT_BEHIND:
        c.that(not os.path.exists(os.path.join(dst, name)), "%s: %s was copied" % (dst, name))
    c.that(temporaries(job.work, os.path.basename(dst)) == [], "a temporary is left")
    # what process 0 says: every process wrote the data of its ranks' files, and
    # received more than that (the manifest) or, process 0, nothing
    summary = json.loads(r.stdout)
    ranks = sorted(r for p in summary["processes"] for r in p["ranks"])
    c.that(len(summary["processes"]) == np and ranks == list(range(summary["world"])),
           "summary: %r" % summary)
    for p in summary["processes"]:
        data = 0
        for name in data_files(dst):
            if rank_of_file(name) in p["ranks"]:
                with open(os.path.join(dst, name), "rb") as f:
                    header = int.from_bytes(f.read(8), "little")
                data += os.path.getsize(os.path.join(dst, name)) - 8 - header
        c.that(p["written"] == data, "process %d wrote %d bytes of tensor data, its files "
               "hold %d" % (p["process"], p["written"], data))
        if p["process"] == 0:
            c.that(p["received"] == 0, "process 0 received %d bytes" % p["received"])
        elif p["ranks"]:
            c.that(p["received"] > data, "process %d received %d bytes, its data is %d"
                   % (p["process"], p["received"], data))
    return c.problems


def fixtures_module():
    """tests/make-dcp-fixtures.py as a module: its writers of DCP saves."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("dcp_fixtures",
                                                  os.path.join(HERE, "make-dcp-fixtures.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def model_beside_optimizer(job, src):
    """@src's weights as a DCP save (FSDP2 over 4 ranks, .metadata and __R_K.distcp) of
    {"model": state_dict, "optimizer": Adam's state}, with @src's config.json and
    companion files beside the shards."""
    fx = fixtures_module()
    weights = [n for n in os.listdir(src) if n.endswith(".safetensors")]
    model = [fx.sharded_tensor(name, dtype, shape, data, 1, {})
             for name, dtype, shape, data in fx.read_safetensors(os.path.join(src, weights[0]))]
    optim, values = fx.optimizer_state(model, ("optimizer",))
    dcp = job.path("dcp")
    fx.write_format_b(dcp, model + optim, wrapper="model", values=values)
    for name in ["config.json"] + list(COMPANIONS):
        shutil.copy(os.path.join(src, name), os.path.join(dcp, name))
    return dcp


def check_select(job):
    """A DCP save of the model beside its optimizer: sync refuses it as convert does,
    naming the keys and --select, from every process (exit 3); with --select model it
    writes what convert --select model writes, which is the model's own conversion."""
    c = Checks()
    src = job.synth("tiny-qwen3-moe")
    dcp = model_beside_optimizer(job, src)
    layout = layout_args("vllm", "kernel", 2, 2)
    refused = run(wsync_cmd("convert", dcp, job.path("convert"), *layout))
    c.that(refused.returncode == 3, "convert without --select: exit %d" % refused.returncode)
    why = refused.stderr.strip()[len("wsync: "):]
    c.that("pass --select KEY" in why and "model (" in why and "optimizer (" in why,
           "convert's refusal: %r" % why)
    r = sync([(2, [dcp, job.path("sync")] + layout)])
    one_line_from_every_process(c, r, 2, 3, ["process 0: ", why])
    expected = job.convert(dcp, layout + ["--select", "model"])
    compare_dirs(c, job.convert(src, layout), expected)
    dst = job.path("sync")
    r = sync([(2, [dcp, dst, "-q", "--select", "model"] + layout)])
    if c.that(r.returncode == 0, "exit %d: %s" % (r.returncode, r.stderr.strip())):
        compare_dirs(c, expected, dst)
    r = sync([(2, [src, job.path("sync"), "--select", "model"] + layout)])
    one_line_from_every_process(c, r, 2, 2, ["process 0: ", "--select applies to a sharded "
                                             "training checkpoint (PyTorch DCP), and this is "
                                             "none"])
    return c.problems


def check_config_option(job):
    """A DCP checkpoint with no config.json beside it or above it (HF Trainer's
    SHARDED_STATE_DICT, torchtitan): sync refuses it as convert does, naming --config, from
    every process (exit 3); with --config SRC it writes what convert --config SRC writes,
    config.json and SRC's companion files included, which is SRC's own conversion."""
    c = Checks()
    src = job.synth("tiny-qwen3-moe")
    step = job.path("step")
    weights = [n for n in os.listdir(src) if n.endswith(".safetensors")]
    subprocess.run([sys.executable, os.path.join(HERE, "make-dcp-fixtures.py"), "--shard",
                    os.path.join(src, weights[0]), step], check=True, stdout=subprocess.DEVNULL)
    dcp = os.path.join(step, "b")
    layout = layout_args("vllm", "kernel", 2, 2)
    r = sync([(2, [dcp, job.path("sync")] + layout)])
    one_line_from_every_process(c, r, 2, 3, ["process 0: ", "no config.json, neither beside "
                                             "the shards nor in ", "with --config DIR"])
    expected = job.convert(dcp, layout + ["--config", src])
    compare_dirs(c, job.convert(src, layout), expected)
    dst = job.path("sync")
    r = sync([(2, [dcp, dst, "-q", "--config", src] + layout)])
    if c.that(r.returncode == 0, "exit %d: %s" % (r.returncode, r.stderr.strip())):
        compare_dirs(c, expected, dst)
    return c.problems


def check_conf_sync_section(job):
    """conf.d's `sync { }` section gives the layout when the command line does not
    (target, format, tp, ep, part-size), as for convert; its `rank` is convert's alone
    (every rank is written)."""
    c = Checks()
    src = job.synth("tiny-qwen3-moe")
    conf = job.path("conf.d")
    shutil.copytree(CONF_DIR, conf)
    with open(os.path.join(conf, "90-sync.conf"), "w") as f:
        f.write('sync {\n  target = "vllm-ascend"\n  format = "kernel"\n  tp = 2\n  ep = 2\n'
                '  rank = 1\n  part-size = "40K"\n}\n')
    expected = job.convert(src, layout_args("vllm-ascend", "kernel", 2, 2) +
                           ["--part-size", "40K"])
    dst = job.path("sync")
    cmd = mpirun_prefix() + ["-np", "2", BINARY, "--conf-dir", conf, "--plugin-dir",
                             PLUGIN_DIR, "sync", src, dst, "-q"]
    r = run(cmd, MPI_ENV)
    if c.that(r.returncode == 0 and r.stderr == "",
              "exit %d: %s" % (r.returncode, r.stderr.strip())):
        compare_dirs(c, expected, dst)
        c.that(len([n for n in data_files(dst) if n.startswith("kernel-rank-0-")]) > 1,
               "one file for rank 0: --part-size from conf.d not applied")
    return c.problems


def check_two_directories(job):
    """Processes 0-1 write into one DST, 2-3 into another (MPMD): each directory holds
    its ranks' files, config.json and the companion files, and is swapped in once."""
    c = Checks()
    src = job.synth("tiny-qwen3-moe")
    layout = layout_args("vllm", "kernel", 2, 4)
    expected = job.convert(src, layout)
    a, b = job.path("sync-a"), job.path("sync-b")
    r = sync([(2, [src, a, "-q"] + layout), (2, [src, b, "-q"] + layout)])
    if not c.that(r.returncode == 0, "exit %d: %s" % (r.returncode, r.stderr.strip())):
        return c.problems
    others = [n for n in data_files(expected) if not n.endswith(".safetensors")]
    compare_dirs(c, expected, a, others + ["kernel-rank-0-part-0.safetensors",
                                           "kernel-rank-1-part-0.safetensors"])
    compare_dirs(c, expected, b, others + ["kernel-rank-2-part-0.safetensors",
                                           "kernel-rank-3-part-0.safetensors"])
    return c.problems


def check_replaces_own_output(job):
    """A second sync into the same DST replaces it (wsync's own output), from another
    layout, and leaves no temporary."""
    c = Checks()
    src = job.synth("tiny-qwen3-moe")
    first, second = layout_args("vllm", "kernel", 2, 4), layout_args("vllm", "sharded-state", 2, 1)
    dst = job.path("sync")
    for layout in (first, second):
        r = sync([(2, [src, dst, "-q"] + layout)])
        c.that(r.returncode == 0, "exit %d: %s" % (r.returncode, r.stderr.strip()))
    compare_dirs(c, job.convert(src, second), dst)
    c.that(temporaries(job.work, os.path.basename(dst)) == [], "a temporary is left")
    return c.problems


def check_quiet_json(job):
    """-q --json: the summary on stdout all the same (as convert and plan print their
    JSON under -q), nothing on stderr."""
    c = Checks()
    src = job.synth("tiny-qwen3-moe")
    dst = job.path("sync")
    r = sync([(2, [src, dst, "-q", "--json"] + layout_args("vllm", "kernel", 2, 4))])
    if not c.that(r.returncode == 0, "exit %d: %s" % (r.returncode, r.stderr.strip())):
        return c.problems
    c.that(r.stderr == "", "stderr: %r" % r.stderr)
    try:
        summary = json.loads(r.stdout)
    except ValueError:
        c.that(False, "stdout is not JSON: %r" % r.stdout)
        return c.problems
    c.that(summary.get("world") == 4 and
           [p["ranks"] for p in summary.get("processes", [])] == [[0, 1], [2, 3]],
           "summary: %r" % summary)
    return c.problems


def check_text_summary(job):
    """The text summary names each process's ranks, in the singular for one ("rank 0",
    not "ranks 0"), and ends with the totals line."""
    c = Checks()
    src = job.synth("tiny-qwen3-moe")
    dst = job.path("sync")
    r = sync([(2, [src, dst, "--ranks", "0/1-3"] + layout_args("vllm", "kernel", 2, 4))])
    if not c.that(r.returncode == 0, "exit %d: %s" % (r.returncode, r.stderr.strip())):
        return c.problems
    lines = r.stdout.splitlines()
    c.that(len(lines) == 3, "stdout: %r" % r.stdout)
    if len(lines) == 3:
        c.that(re.fullmatch(r"process 0 on \S+: rank 0 into %s: \d+ bytes written, 0 received"
                            % re.escape(dst), lines[0]) is not None, "line 1: %r" % lines[0])
        c.that(re.fullmatch(r"process 1 on \S+: ranks 1-3 into %s: \d+ bytes written, \d+ "
                            r"received" % re.escape(dst), lines[1]) is not None,
               "line 2: %r" % lines[1])
        c.that(lines[2].startswith("synced 4 ranks of ") and
               lines[2].endswith(" on 2 processes: %s bytes sent" % lines[1].split()[-2]),
               "line 3: %r" % lines[2])
    return c.problems


def check_progress(job):
    """--progress: process 0 reports on stderr, which under mpirun is a pipe, never a
    terminal: a tiny sync takes less than the ten seconds between lines, so it shows only
    its last, 100% of the bytes; -q silences it; without --progress stderr stays empty."""
    c = Checks()
    src = job.synth("tiny-qwen3-moe")
    dst = job.path("sync")
    args = [src, dst] + layout_args("vllm", "kernel", 2, 4)
    r = sync([(2, args + ["--progress"])])
    if not c.that(r.returncode == 0, "exit %d: %s" % (r.returncode, r.stderr.strip())):
        return c.problems
    c.that(re.fullmatch(r"wsync: (\d+(?:\.\d)?\s[kM]B) of \1 sent and written \(100%\)\n",
                        r.stderr) is not None, "stderr with --progress: %r" % r.stderr)
    for extra in (["--progress", "-q"], []):
        r = sync([(2, args + extra)])
        c.that(r.returncode == 0 and r.stderr == "",
               "%s: exit %d, stderr %r" % (" ".join(extra) or "no --progress", r.returncode,
                                           r.stderr))
    return c.problems


def existing_dst(job):
    """A DST a previous sync wrote, and a copy of it to compare with."""
    src = job.synth("tiny-qwen3-moe")
    dst = job.path("existing")
    r = sync([(2, [src, dst, "-q"] + layout_args("vllm", "kernel", 2, 4))])
    if r.returncode != 0:
        raise SystemExit("Bail out! a first sync: %s" % r.stderr.strip())
    copy = job.path("existing-copy")
    shutil.copytree(dst, copy)
    return src, dst, copy


def check_untouched(c, job, dst, copy):
    c.that(data_files(dst) == data_files(copy), "DST changed: %s" % data_files(dst))
    for name in data_files(copy):
        c.that(filecmp.cmp(os.path.join(copy, name), os.path.join(dst, name), shallow=False),
               "DST's %s changed" % name)
    c.that(temporaries(os.path.dirname(dst), os.path.basename(dst)) == [], "a temporary is left")


def check_src_missing(job):
    c = Checks()
    src, dst, copy = existing_dst(job)
    missing = os.path.join(job.work, "no-such-checkpoint")
    r = sync([(4, [missing, dst] + layout_args("vllm", "kernel", 2, 4))])
    one_line_from_every_process(c, r, 4, 4, ["process 0: ", "no-such-checkpoint",
                                             "No such file"])
    # a --config that is not there is the same I/O failure (README "Exit status"; was 2)
    r = sync([(2, [src, dst, "--config", missing] + layout_args("vllm", "kernel", 2, 4))])
    one_line_from_every_process(c, r, 2, 4, ["process 0: --config ", "no-such-checkpoint",
                                             "No such file"])
    check_untouched(c, job, dst, copy)
    return c.problems


def check_bad_input(job):
    """A safetensors file cut short on process 0: exit 3, from every process."""
    c = Checks()
    src, dst, copy = existing_dst(job)
    bad = job.path("truncated")
    shutil.copytree(src, bad)
    weights = [n for n in os.listdir(bad) if n.endswith(".safetensors")][0]
    path = os.path.join(bad, weights)
    os.truncate(path, os.path.getsize(path) - 2)
    r = sync([(2, [bad, dst] + layout_args("vllm", "kernel", 2, 4))])
    one_line_from_every_process(c, r, 2, 3, ["process 0: ", weights])
    check_untouched(c, job, dst, copy)
    return c.problems


def bind_socket(path):
    """A Unix socket at @path, left behind (its file stays once closed)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(path)
    finally:
        s.close()


def check_socket_input(job):
    """A socket on process 0 where a file is read, SRC itself or a checkpoint's
    config.json: exit 3 from every process, in the words of a FIFO at the same place (it
    was "cannot open SRC: No such device or address", exit 4)."""
    c = Checks()
    src, dst, copy = existing_dst(job)
    sock = job.path("socket")
    bind_socket(sock)
    r = sync([(2, [sock, dst] + layout_args("vllm", "kernel", 2, 4))])
    one_line_from_every_process(c, r, 2, 3, ["process 0: %s: not a regular file" % sock])
    bad = job.path("socket-config")
    shutil.copytree(src, bad)
    config = os.path.join(bad, "config.json")
    os.unlink(config)
    bind_socket(config)
    r = sync([(2, [bad, dst] + layout_args("vllm", "kernel", 2, 4))])
    one_line_from_every_process(c, r, 2, 3, ["process 0: %s: is a socket, not a regular file"
                                             % config])
    check_untouched(c, job, dst, copy)
    return c.problems


def check_conf_sync_size_refused(job):
    """A tp conf.d's sync section sets that the target's layout refuses names where it is
    set (the user typed no --tp), from every process, exit 2."""
    c = Checks()
    src, dst, copy = existing_dst(job)
    conf = job.path("conf.d")
    shutil.copytree(CONF_DIR, conf)
    place = os.path.join(conf, "90-sync.conf")
    with open(place, "w") as f:
        f.write('sync {\n  target = "vllm"\n  tp = 3\n}\n')
    cmd = mpirun_prefix() + ["-np", "2", BINARY, "--conf-dir", conf, "--plugin-dir",
                             PLUGIN_DIR, "sync", src, dst, "-q"]
    r = run(cmd, MPI_ENV)
    one_line_from_every_process(c, r, 2, 2, [
        "process 0: tp 3 does not divide the padded vocabulary of ",
        " (tp 3 comes from %s:3, conf.d's sync section; --tp overrides it)" % place])
    check_untouched(c, job, dst, copy)
    return c.problems


def check_dst_fails_on_process_2(job):
    """Process 2 is given a DST under a regular file (an MPMD launch); the others share
    an existing DST, which stays as it was: every process names process 2 and the
    cause."""
    c = Checks()
    src, dst, copy = existing_dst(job)
    blocker = job.path("a-file")
    with open(blocker, "w") as f:
        f.write("a regular file, not a directory\n")
    layout = layout_args("vllm", "kernel", 2, 4)
    r = sync([(2, [src, dst] + layout), (1, [src, os.path.join(blocker, "dst")] + layout),
              (1, [src, dst] + layout)])
    one_line_from_every_process(c, r, 4, 4, ["process 2: ", "a-file", "Not a directory"])
    check_untouched(c, job, dst, copy)
    return c.problems


def check_not_dividing(job):
    c = Checks()
    src = job.synth("tiny-qwen3-moe")
    dst = job.path("sync")
    r = sync([(3, [src, dst] + layout_args("vllm", "kernel", 4, 4))])
    one_line_from_every_process(c, r, 3, 2, ["process 0: ", "3 processes cannot write the 4 "
                                             "ranks of vllm --format kernel --tp 4 --ep 4",
                                             "--ranks"])
    c.that(not os.path.exists(dst), "DST was written")
    c.that(temporaries(job.work, os.path.basename(dst)) == [], "a temporary is left")
    # a target of one rank (hf) on two processes: "the 1 rank", not "the 1 ranks"
    r = sync([(2, [src, dst, "--target", "hf"])])
    one_line_from_every_process(c, r, 2, 2, ["process 0: 2 processes cannot write the 1 rank "
                                             "of hf --tp 1 --ep 1 in equal contiguous blocks"])
    return c.problems


def check_steps(job):
    """Two training steps into one DST (the RL loop): SRC's weights are rewritten in place
    between them.  The second sync writes exactly what convert writes from the new
    weights (none of the first step's bytes is left), and its --json summary is the
    first's: the same plan, the same bytes written and received by each process, each
    process's written bytes the tensor data of its files."""
    c = Checks()
    config = os.path.join(CONFIG_DIR, "tiny-qwen3-moe.json")
    src, step2 = job.path("step"), job.path("step")
    for d, seed in ((src, "1"), (step2, "2")):
        r = run(wsync_cmd("synth", "--config", config, "--seed", seed, d, "-q"))
        if not c.that(r.returncode == 0, "synth: %s" % r.stderr.strip()):
            return c.problems
    layout = layout_args("vllm-ascend", "kernel", 2, 2)
    dst = job.path("sync")
    summaries = []
    for step in (1, 2):
        if step == 2:
            for name in os.listdir(step2):
                if name.endswith(".safetensors"):
                    shutil.copy(os.path.join(step2, name), os.path.join(src, name))
        r = sync([(2, [src, dst, "--json", "--bucket-size", "4K"] + layout)])
        if not c.that(r.returncode == 0 and r.stderr == "",
                      "step %d: exit %d: %s" % (step, r.returncode, r.stderr.strip())):
            return c.problems
        summaries.append(json.loads(r.stdout))
    compare_dirs(c, job.convert(step2, layout), dst)
    first, second = summaries
    c.that(first == second, "the summaries of the two steps differ: %r, %r" % (first, second))
    c.that(sorted(second) == ["ep", "format", "processes", "target", "tp", "world"] and
           [sorted(p) for p in second["processes"]] ==
           [["dst", "host", "process", "ranks", "received", "written"]] * 2,
           "summary keys: %r" % second)
    for p in second["processes"]:
        name = os.path.join(dst, "kernel-rank-%d-part-0.safetensors" % p["process"])
        with open(name, "rb") as f:
            header = int.from_bytes(f.read(8), "little")
        c.that(p["ranks"] == [p["process"]] and p["dst"] == dst and
               p["written"] == os.path.getsize(name) - 8 - header,
               "process %d: %r" % (p["process"], p))
    return c.problems


def check_bad_ranks(job):
    c = Checks()
    src = job.synth("tiny-qwen3-moe")
    layout = layout_args("vllm", "kernel", 2, 4)
    for ranks, fragment in (("0-1", "--ranks \"0-1\" has 1 entry, but 2 processes run"),
                            ("0-1/1-3", "--ranks gives rank 1 to processes 0 and 1"),
                            ("0/1-2", "--ranks gives rank 3 to no process"),
                            ("0-1/2-7", "\"2-7\" (process 1) is not a rank or a range"),
                            # an empty item: no GLib warning, the entry quoted
                            ("0-1,/2-3", "--ranks: \"0-1,\" (process 0) has an empty item"),
                            ("0-1/2-3,3", "--ranks gives rank 3 twice to process 1")):
        r = sync([(2, [src, job.path("sync"), "--ranks", ranks] + layout)])
        one_line_from_every_process(c, r, 2, 2, ["process 0: ", fragment])
    r = sync([(1, [src, job.path("sync"), "--ranks", "0-1/2-3"] + layout)])
    one_line_from_every_process(c, r, 1, 2, ["process 0: ", "--ranks \"0-1/2-3\" has 2 entries, "
                                             "but 1 process runs (one entry per process"])
    return c.problems


def check_mismatched_args(job):
    """An MPMD launch whose app contexts disagree on what only process 0 reads (the
    layout, SRC, --ranks): process 0's alone used to be taken, and the others' ignored
    without a word (exit 0, tp 2 written for a process told --tp 4).  Every process now
    refuses, naming the first process that differs, the option, both values (exit 2); an
    existing DST stays as it was.  A DST of their own, and -q, are each process's."""
    c = Checks()
    src, dst, copy = existing_dst(job)
    other = job.synth("tiny-qwen3.5-moe")
    layout = layout_args("vllm", "kernel", 2, 4)
    tail = ": give every process the same SRC and options (only DST, --force, -q, -v, " \
           "--json and --progress may differ)"
    for second, third, fragment in (
            ([src, dst] + layout_args("vllm", "kernel", 4, 4), [src, dst] + layout,
             "process 1: --tp 4 here, --tp 2 on process 0" + tail),
            ([src, dst] + layout, [other, dst] + layout,
             "process 2: SRC %s here, SRC %s on process 0" % (other, src) + tail),
            ([src, dst] + layout, [src, dst, "--ranks", "0/1/2/3"] + layout,
             "process 2: --ranks 0/1/2/3 here, no --ranks on process 0" + tail)):
        r = sync([(1, [src, dst] + layout), (1, second), (1, third), (1, [src, dst] + layout)])
        one_line_from_every_process(c, r, 4, 2, [fragment])
        check_untouched(c, job, dst, copy)
    r = sync([(1, [src, dst, "-q"] + layout), (1, [src, dst] + layout)])
    c.that(r.returncode == 0 and r.stderr == "" and r.stdout == "",
           "-q on process 0 alone: exit %d, %r %r" % (r.returncode, r.stdout, r.stderr))
    return c.problems


def process_pids(mpirun_pid):
    """{MPI process number: pid} of the processes @mpirun_pid started (its children, which
    any of its threads may have forked)."""
    pids = {}
    for task in os.listdir("/proc/%d/task" % mpirun_pid):
        try:
            with open("/proc/%d/task/%s/children" % (mpirun_pid, task)) as f:
                children = [int(p) for p in f.read().split()]
        except OSError:
            continue
        for pid in children:
            try:
                with open("/proc/%d/environ" % pid, "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            for item in env:
                if item.startswith(b"OMPI_COMM_WORLD_RANK="):
                    pids[int(item.split(b"=", 1)[1])] = pid
    return pids


def slow_sync(job, extra=()):
    """A model of 40 MB, a DST an earlier sync of it wrote, a copy of that DST, and a
    second sync into it, -np 2 --tp 2, started (a Popen): buckets of 4 KiB make it last
    long enough (a second) to be caught in the middle."""
    with open(os.path.join(CONFIG_DIR, "tiny-qwen3-moe.json")) as f:
        config = json.load(f)
    config.update(vocab_size=40000, hidden_size=256)
    config_path = os.path.join(job.work, "wide-qwen3-moe.json")
    with open(config_path, "w") as f:
        json.dump(config, f)
    src = job.path("wide")
    r = run(wsync_cmd("synth", "--config", config_path, src, "-q"))
    if r.returncode != 0:
        raise SystemExit("Bail out! synth: %s" % r.stderr.strip())
    layout = layout_args("vllm", "sharded-state", 2, 1)
    dst = job.path("existing")
    r = sync([(2, [src, dst, "-q"] + layout)])
    if r.returncode != 0:
        raise SystemExit("Bail out! a first sync: %s" % r.stderr.strip())
    copy = job.path("existing-copy")
    shutil.copytree(dst, copy)
    cmd = mpirun_prefix() + ["-np", "2"] + wsync_cmd("sync", src, dst, "--bucket-size", "4K",
                                                     *(layout + list(extra)))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True,
                            env=dict(os.environ, WSYNC_PLUGIN_PATH="", **MPI_ENV))
    return src, dst, copy, proc


INTERRUPTED = ("wsync: sync: interrupted by SIGTERM before every process was done (mpirun "
               "was interrupted, or a process ended or was killed): DST is as it was")


MISSED_TRIES = 3


def catch_mid_sync(job, act, extra=(), acted_too_late=None):
    """slow_sync(), caught in the middle: once process 1's file is in the temporary
    directory, process 0 is stopped (SIGSTOP), the temporary checked to be still there,
    act(src, pids) done, and process 0 resumed (SIGCONT).  Process 0 reads SRC, sends
    the data and, as the leader of the one DST, swaps it in: while it is stopped nothing
    moves, so act() lands before the swap whatever the machine's load (a check of the
    directory followed by act() alone could land after it, the sync then ending 0 and
    DST replaced: a false failure).  Returns (src, dst, copy, returncode, out, err) of
    the first try that was caught, or None when every try of MISSED_TRIES ran past the
    window (ended, or swapped in, before it was seen, or acted_too_late(returncode, err,
    dst, copy)); the caller skips then."""
    for attempt in range(MISSED_TRIES):
        src, dst, copy, proc = slow_sync(job, extra)
        base = os.path.basename(dst)
        caught = False
        while proc.poll() is None and not caught:
            if not any(os.path.exists(os.path.join(job.work, tmp,
                                                   "model-rank-1-part-0.safetensors"))
                       for tmp in temporaries(job.work, base)):
                continue
            pids = process_pids(proc.pid)
            if 0 not in pids or 1 not in pids:
                continue
            try:  # (a process that has just ended is a window missed)
                os.kill(pids[0], signal.SIGSTOP)
                try:
                    if temporaries(job.work, base) != []:
                        act(src, pids)
                        caught = True
                finally:
                    os.kill(pids[0], signal.SIGCONT)
            except ProcessLookupError:
                caught = False
            break
        out, err = proc.communicate()
        missed = acted_too_late is not None and acted_too_late(proc.returncode, err, dst, copy)
        if caught and not missed:
            return src, dst, copy, proc.returncode, out, err
    return None


INTERRUPTED_PREFIX = INTERRUPTED[:-len("DST is as it was")]


def signalled_at(job, phase, unseen=False, fail_swap_sync=False, late=False):
    """A DST an earlier sync (-np 2 --tp 2, one DST: process 0 leads it, process 1 shares
    it) wrote, its inode, a copy of it, and a second sync into it, WSYNC_TEST_SIGNAL_AFTER
    =@phase: SIGTERM at that exact point of the end (core/sync-mpi.c, signal_if_asked()),
    where no signal from outside lands reliably (the phases last microseconds); @unseen:
    WSYNC_TEST_SIGNAL_UNSEEN_AFTER, the signal caught there but left to a later check;
    @fail_swap_sync: WSYNC_TEST_FAIL_SWAP_SYNC too; @late: a signal after the last
    exchange, which every process outlives to print its line (SIGNALLED_ENV)."""
    src = job.synth("tiny-qwen3-moe")
    layout = layout_args("vllm", "kernel", 2, 1)
    dst = job.path("signalled")
    r = sync([(2, [src, dst, "-q"] + layout)])
    if r.returncode != 0:
        raise SystemExit("Bail out! a first sync: %s" % r.stderr.strip())
    copy = job.path("signalled-copy")
    shutil.copytree(dst, copy)
    inode = os.stat(dst).st_ino
    cmd = mpirun_prefix() + ["-np", "2"] + wsync_cmd("sync", src, dst, *layout)
    hook = "WSYNC_TEST_SIGNAL_UNSEEN_AFTER" if unseen else "WSYNC_TEST_SIGNAL_AFTER"
    env = dict(SIGNALLED_ENV if late else MPI_ENV, **{hook: phase})
    if fail_swap_sync:
        env["WSYNC_TEST_FAIL_SWAP_SYNC"] = "1"
    r = run(cmd, env)
    return r, dst, inode, copy


def check_signal_after_swap(job):
    """SIGTERM on both processes once the leader has swapped DST in: process 1, which
    shares DST without leading it, used to say "DST is as it was" (always), process 0
    "this host's DST was already swapped in".  Now the leader tells the group whether
    it swapped, and both say "DST was already swapped in", which it was."""
    c = Checks()
    r, dst, inode, copy = signalled_at(job, "swap ended")
    c.that(r.returncode != 0, "exit 0 though every process was signalled")
    lines = r.stderr.splitlines()
    c.that(lines == [INTERRUPTED_PREFIX + "DST was already swapped in"] * 2,
           "stderr: %r" % r.stderr)
    c.that(os.stat(dst).st_ino != inode and os.path.isfile(os.path.join(dst, MARKER)),
           "DST was not swapped in")
    c.that(temporaries(job.work, os.path.basename(dst)) == [], "a temporary is left")
    return c.problems


def check_signal_before_every_process_has_verdict(job):
    """Process 1 ends (SIGTERM) on learning the verdict of success, before saying it has
    it: process 0 used to swap DST in all the same, and then, ended by mpirun, say it
    had while process 1 said "DST is as it was".  Now no leader swaps before every
    process has the verdict: DST stays as it was, and both processes say so."""
    c = Checks()
    r, dst, inode, copy = signalled_at(job, "1:verdict known")
    c.that(r.returncode != 0, "exit 0 though process 1 was signalled")
    c.that(r.stderr.splitlines() == [INTERRUPTED] * 2, "stderr: %r" % r.stderr)
    check_untouched(c, job, dst, copy)
    return c.problems


def check_signal_before_leader_says(job):
    """Process 1 ends (SIGTERM) after every process has the verdict, before process 0,
    which leads DST, has said whether it swapped: process 1 cannot know, and says so
    instead of "DST is as it was"; process 0 says what it did, which DST shows."""
    c = Checks()
    r, dst, inode, copy = signalled_at(job, "1:verdict shared")
    c.that(r.returncode != 0, "exit 0 though process 1 was signalled")
    swapped = os.stat(dst).st_ino != inode
    expected = sorted([INTERRUPTED_PREFIX + "this process cannot tell whether process 0, "
                       "which leads DST, swapped it in",
                       INTERRUPTED_PREFIX + ("DST was already swapped in" if swapped
                                             else "DST is as it was")])
    c.that(sorted(r.stderr.splitlines()) == expected,
           "stderr: %r, expected %r" % (r.stderr, expected))
    c.that(temporaries(job.work, os.path.basename(dst)) == [], "a temporary is left")
    return c.problems


def check_signal_in_barrier_before_swap(job):
    """SIGTERM on process 0, which leads DST, caught during the barrier where every
    process says it has the verdict but seen by no wait (the barrier was done at its
    next test; WSYNC_TEST_SIGNAL_UNSEEN_AFTER): process 0 used to swap DST in all the
    same, a signalled process going on to replace the output.  Now the swap is decided
    only if no signal was caught, so it ends exactly as when the signal is seen at once
    (WSYNC_TEST_SIGNAL_AFTER): the same lines ("DST is as it was" from process 0), the
    same exit status, the previous DST intact and no temporary left."""
    return leader_signalled_unseen(job, "0:verdict shared")


def check_signal_while_marker_written(job):
    """SIGTERM on process 0, which leads DST, caught while it writes and syncs the marker
    of a verdict of success, and seen by no wait (WSYNC_TEST_SIGNAL_UNSEEN_AFTER after the
    phase "marker written", which only a leader ends): process 0 used to check for a
    signal before the marker only, and swapped DST in all the same after its fsyncs.
    Now it checks right before the swap, as convert does: the same lines, exit status,
    previous DST and no temporary as when the signal is seen at once."""
    return leader_signalled_unseen(job, "0:marker written")


def leader_signalled_unseen(job, phase):
    """The checks of the two cases above: SIGTERM raised on process 0 after PHASE and
    seen by no wait ends the sync exactly as a signal seen at once after "verdict
    shared" does (the same lines, the same exit status), DST not swapped (its inode and
    files as they were) and no temporary left."""
    c = Checks()
    seen, _, _, _ = signalled_at(job, "0:verdict shared")
    r, dst, inode, copy = signalled_at(job, phase, unseen=True)
    expected = sorted([INTERRUPTED, INTERRUPTED_PREFIX + "this process cannot tell whether "
                       "process 0, which leads DST, swapped it in"])
    c.that(sorted(seen.stderr.splitlines()) == expected,
           "signal seen at once: stderr: %r, expected %r" % (seen.stderr, expected))
    c.that(sorted(r.stderr.splitlines()) == expected,
           "stderr: %r, expected %r" % (r.stderr, expected))
    c.that(r.returncode == seen.returncode and r.returncode != 0,
           "exit %d, expected %d as when the signal is seen at once"
           % (r.returncode, seen.returncode))
    c.that(os.stat(dst).st_ino == inode, "DST was swapped in by a signalled process")
    check_untouched(c, job, dst, copy)
    return c.problems


LATE = "wsync: sync: interrupted by SIGTERM after every process was done: "


def check_late_signal_after_swap(job):
    """SIGTERM caught after the last exchange, which no wait sees (WSYNC_TEST_SIGNAL_
    UNSEEN_AFTER=done; WSYNC_TEST_SIGNAL_AFTER=done alike, as there is no wait left to
    end at): every process used to end by it at exit silently, process 1 (which does
    not lead DST) as process 0, so that mpirun reported a process killed and nothing said
    what became of DST.  Now each says it in one line: DST was swapped in.  Process 1
    alone signalled: its line (and process 0's, when mpirun ends it by SIGTERM in
    turn)."""
    c = Checks()
    expected = LATE + "DST was already swapped in"
    for hook, phase in (("unseen", "done"), ("seen", "done"), ("unseen", "1:done")):
        r, dst, inode, copy = signalled_at(job, phase, unseen=hook == "unseen", late=True)
        what = "%s %s" % (hook, phase)
        lines = r.stderr.splitlines()
        c.that(r.returncode != 0, "%s: exit 0 though a process was signalled" % what)
        if phase == "done":
            c.that(lines == [expected] * 2, "%s: stderr: %r" % (what, r.stderr))
        else:
            c.that(lines in ([expected], [expected] * 2), "%s: stderr: %r" % (what, r.stderr))
        c.that(os.stat(dst).st_ino != inode and os.path.isfile(os.path.join(dst, MARKER)),
               "%s: DST was not swapped in" % what)
        c.that(temporaries(job.work, os.path.basename(dst)) == [],
               "%s: a temporary is left" % what)
    return c.problems


def check_late_signal_without_dst(job):
    """The same with a process that writes no DST (-np 3 --ranks /0/1: process 0 has no
    ranks): it says that every DST was swapped in, which the last exchange told it."""
    c = Checks()
    src = job.synth("tiny-qwen3-moe")
    dst = job.path("late-no-dst")
    r = run(mpirun_prefix() + ["-np", "3"] +
            wsync_cmd("sync", src, dst, "-q", "--ranks", "/0/1",
                      *layout_args("vllm", "kernel", 2, 1)),
            dict(SIGNALLED_ENV, WSYNC_TEST_SIGNAL_UNSEEN_AFTER="done"))
    c.that(r.returncode != 0, "exit 0 though every process was signalled")
    expected = sorted([LATE + "this process writes no DST; every DST was already swapped in"] +
                      [LATE + "DST was already swapped in"] * 2)
    c.that(sorted(r.stderr.splitlines()) == expected,
           "stderr: %r, expected %r" % (r.stderr, expected))
    c.that(os.path.isfile(os.path.join(dst, MARKER)), "DST was not swapped in")
    return c.problems


def check_late_signal_after_failure(job):
    """A late signal after a verdict of failure (a DST that is not wsync's, refused),
    which every process has printed: it changes nothing, every process exits with the
    refusal's status and prints the refusal alone (no second line, which mpirun's own
    SIGTERM to the processes still finishing, once the first has exited 2, would add
    at random)."""
    c = Checks()
    src = job.synth("tiny-qwen3-moe")
    dst = job.path("late-mine")
    os.mkdir(dst)
    with open(os.path.join(dst, "notes.txt"), "w") as f:
        f.write("mine\n")
    r = run(mpirun_prefix() + ["-np", "2"] +
            wsync_cmd("sync", src, dst, *layout_args("vllm", "kernel", 2, 4)),
            dict(MPI_ENV, WSYNC_TEST_SIGNAL_UNSEEN_AFTER="done"))
    one_line_from_every_process(c, r, 2, 2, ["process 0: ", "is not wsync's output"])
    c.that(os.listdir(dst) == ["notes.txt"], "DST changed: %s" % os.listdir(dst))
    c.that(temporaries(job.work, os.path.basename(dst)) == [], "a temporary is left")
    return c.problems


def not_durable_line(dst):
    return ("%s is in place, but its durability is not confirmed (it may not survive a "
            "crash): cannot sync %s: Input/output error" % (dst, os.path.dirname(dst)))


def previous_kept(dst):
    """Where a swap whose parent could not be synced keeps the previous DST."""
    return dst + ".wsync-previous"


def kept_line(dst):
    """not_durable_line() of a swap that replaced a DST, which it keeps."""
    return (not_durable_line(dst) + "; the previous output is kept as %s: remove it once "
            "the new one is confirmed" % previous_kept(dst))


def check_previous_kept(c, dst, inode, copy):
    """The previous DST (inode @inode, a copy of it at @copy) is kept, whole, where
    kept_line() says."""
    previous = previous_kept(dst)
    c.that(os.path.isdir(previous) and os.stat(previous).st_ino == inode,
           "the previous DST is not at %s" % previous)
    if os.path.isdir(previous):
        compare_dirs(c, copy, previous)
        c.that(os.path.isfile(os.path.join(previous, MARKER)),
               "the previous DST at %s lost its marker" % previous)


def check_swap_not_durable(job):
    """The sync of DST's parent fails after the swap (WSYNC_TEST_FAIL_SWAP_SYNC: EIO, as a
    failing disk's; core/dst.c, sync_after_swap()).  The leader used to report "cannot
    sync PARENT", count its DST as not swapped (a signal then had every process say
    "DST is as it was") and remove the temporary, which was the new DST's old name.  Now
    DST is the new output, and every process says so, naming the directory and the
    errno; exit 4, as every failed fsync of the output is; a signal after it has every
    process say "DST was already swapped in".  The previous DST used to be removed all
    the same, so that a crash could keep that removal and lose the swap (neither output
    left); now it is kept as DST.wsync-previous, whole, and the line says so."""
    c = Checks()
    src, dst, copy = existing_dst(job)
    inode = os.stat(dst).st_ino
    r = run(mpirun_prefix() + ["-np", "2"] +
            wsync_cmd("sync", src, dst, *layout_args("vllm", "kernel", 2, 4)),
            dict(MPI_ENV, WSYNC_TEST_FAIL_SWAP_SYNC="1"))
    one_line_from_every_process(c, r, 2, 4, ["wsync: sync: process 0: " + kept_line(dst)])
    c.that(all(line == "wsync: sync: process 0: " + kept_line(dst)
               for line in r.stderr.splitlines()), "stderr: %r" % r.stderr)
    c.that(os.stat(dst).st_ino != inode, "DST was not swapped in")
    compare_dirs(c, copy, dst)
    check_previous_kept(c, dst, inode, copy)
    c.that(temporaries(job.work, os.path.basename(dst)) == [], "a temporary is left")
    r, dst, inode, copy = signalled_at(job, "swap ended", fail_swap_sync=True)
    c.that(r.returncode != 0, "exit 0 though every process was signalled")
    c.that(r.stderr.splitlines() == [INTERRUPTED_PREFIX + "DST was already swapped in"] * 2,
           "signalled after the swap: stderr: %r" % r.stderr)
    c.that(os.stat(dst).st_ino != inode, "signalled after the swap: DST was not swapped in")
    check_previous_kept(c, dst, inode, copy)
    c.that(temporaries(job.work, os.path.basename(dst)) == [], "a temporary is left")
    return c.problems


def check_swap_not_durable_two_dsts(job):
    """Two DSTs (processes 0-1 into one, 2-3 into another, both existing), neither
    leader's parent synced after its swap: every process printed process 0's line alone
    (the verdict's first failure), so that nothing said the second DST was in place nor
    that its previous output was kept beside it, a whole copy the user never learned of.
    Now the second DST's leader (process 2) says so too, in its own line."""
    c = Checks()
    src = job.synth("tiny-qwen3-moe")
    layout = layout_args("vllm", "kernel", 2, 4)
    a, b = job.path("kept-a"), job.path("kept-b")
    r = sync([(2, [src, a, "-q"] + layout), (2, [src, b, "-q"] + layout)])
    if r.returncode != 0:
        raise SystemExit("Bail out! a first sync: %s" % r.stderr.strip())
    inodes = {d: os.stat(d).st_ino for d in (a, b)}
    cmd = mpirun_prefix()
    for d in (a, b):
        if d == b:
            cmd.append(":")
        cmd += ["-np", "2"] + wsync_cmd("sync", src, d, "-q", *layout)
    r = run(cmd, dict(MPI_ENV, WSYNC_TEST_FAIL_SWAP_SYNC="1"))
    c.that(r.returncode == 4, "exit %d, expected 4" % r.returncode)
    expected = sorted(["wsync: sync: process 0: " + kept_line(a) +
                       " (2 of 4 processes failed)"] * 4 +
                      ["wsync: sync: process 2: " + kept_line(b)])
    c.that(sorted(r.stderr.splitlines()) == expected,
           "stderr: %r, expected %r" % (r.stderr, expected))
    for d in (a, b):
        c.that(os.stat(d).st_ino != inodes[d], "%s was not swapped in" % d)
        previous = previous_kept(d)
        c.that(os.path.isdir(previous) and os.stat(previous).st_ino == inodes[d],
               "the previous %s is not at %s" % (d, previous))
    return c.problems


def check_convert_not_durable(job):
    """convert shares DST's installation with sync (core/dst.c): a failed sync of the
    parent after the rename into a new DST said "cannot sync PARENT" as though nothing
    was written.  Now: DST is in place, exit 4, the directory and errno named.  Into an
    existing DST (swapped), the previous DST used to be removed all the same; now it is
    kept as DST.wsync-previous, byte for byte, and the line says so."""
    c = Checks()
    src = os.path.join(job.work, "convert-src")
    r = run(wsync_cmd("synth", "--config", os.path.join(CONFIG_DIR, "tiny-qwen3-moe.json"),
                      "--pattern", "index", src, "-q"))
    if r.returncode != 0:
        raise SystemExit("Bail out! wsync synth: %s" % r.stderr.strip())
    dst = job.path("convert-not-durable")
    r = run(wsync_cmd("convert", src, dst, "-q", *layout_args("vllm", "kernel", 2, 1)),
            {"WSYNC_TEST_FAIL_SWAP_SYNC": "1"})
    c.that(r.returncode == 4, "exit %d, expected 4" % r.returncode)
    c.that(r.stderr == "wsync: " + not_durable_line(dst) + "\n", "stderr: %r" % r.stderr)
    c.that(os.path.isfile(os.path.join(dst, MARKER)) and
           "kernel-rank-1-part-0.safetensors" in os.listdir(dst), "DST was not written")
    c.that(temporaries(job.work, os.path.basename(dst)) == [], "a temporary is left")
    c.that(not os.path.exists(previous_kept(dst)), "a new DST kept a previous one")
    # into the DST just written, another layout (tp 1), so that the two differ
    copy = job.path("convert-not-durable-copy")
    shutil.copytree(dst, copy)
    inode = os.stat(dst).st_ino
    r = run(wsync_cmd("convert", src, dst, "-q", *layout_args("vllm", "kernel", 1, 1)),
            {"WSYNC_TEST_FAIL_SWAP_SYNC": "1"})
    c.that(r.returncode == 4, "into an existing DST: exit %d, expected 4" % r.returncode)
    c.that(r.stderr == "wsync: " + kept_line(dst) + "\n",
           "into an existing DST: stderr: %r" % r.stderr)
    c.that(os.stat(dst).st_ino != inode and os.path.isfile(os.path.join(dst, MARKER)) and
           "kernel-rank-1-part-0.safetensors" not in os.listdir(dst),
           "DST is not the new output: %s" % sorted(os.listdir(dst)))
    check_previous_kept(c, dst, inode, copy)
    c.that(temporaries(job.work, os.path.basename(dst)) == [], "a temporary is left")
    # once more: DST.wsync-previous is taken (and kept), so the next is DST.wsync-previous-2
    inode = os.stat(dst).st_ino
    r = run(wsync_cmd("convert", src, dst, "-q", *layout_args("vllm", "kernel", 2, 1)),
            {"WSYNC_TEST_FAIL_SWAP_SYNC": "1"})
    second = previous_kept(dst) + "-2"
    c.that(r.returncode == 4 and r.stderr == "wsync: " + not_durable_line(dst) +
           "; the previous output is kept as %s: remove it once the new one is confirmed\n"
           % second, "a second time: exit %d, stderr: %r" % (r.returncode, r.stderr))
    c.that(os.path.isdir(second) and os.stat(second).st_ino == inode,
           "a second time: the previous DST is not at %s" % second)
    check_previous_kept(c, dst, os.stat(previous_kept(dst)).st_ino, copy)
    return c.problems


def skip_missed(what):
    skip("%d syncs of a 40 MB model were not caught in the middle, before %s "
         "(a machine faster, or a test process slower, than this test expects)"
         % (MISSED_TRIES, what))


def truncate_source(src, pids):
    os.truncate(os.path.join(src, "model-00001-of-00001.safetensors"), 1 << 20)


def caught_truncated(job, extra=()):
    """catch_mid_sync() with SRC truncated.  A sync that still ends 0, saying nothing, and
    wrote what the first sync of the same SRC wrote had read all of SRC before process 0
    was stopped (only on a very fast machine): a window missed, tried again, not a
    failure.  One that ends 0 with other bytes is a failure the caller reports."""
    def read_all_before(status, err, dst, copy):
        return (status == 0 and err == "" and data_files(dst) == data_files(copy) and
                all(filecmp.cmp(os.path.join(copy, n), os.path.join(dst, n), shallow=False)
                    for n in data_files(copy)))
    return catch_mid_sync(job, truncate_source, extra, read_all_before)


def check_source_shrinks(job):
    """SRC's file truncated while process 0 sends it (a trainer rewriting its checkpoint
    in place): Open MPI copies the runs sent from the input's map inside its own calls,
    where the read faulted, and process 0 died of SIGBUS with Open MPI's backtrace on
    stderr and the temporary directory left behind.  Now process 0 names the file and a
    tensor, as convert does, and exits 4 (process 1, ended by mpirun, says it was
    interrupted; or, when the fault came in the plan's own copies, it prints process 0's
    line too); the existing DST stays as it was and no temporary is left."""
    c = Checks()
    caught = caught_truncated(job)
    if caught is None:
        skip_missed("SRC could be truncated")
        return c.problems
    src, dst, copy, status, out, err = caught
    weights = os.path.join(src, "model-00001-of-00001.safetensors")
    c.that(status == 4, "exit %d, expected 4" % status)
    lines = err.splitlines()
    said = re.escape("wsync: sync: process 0: cannot read %s: the file shrank while wsync "
                     "was reading it (tensor \"" % weights) + r"[\w.]+\"\)"
    c.that(len(lines) == 2 and re.fullmatch(said, lines[0]) is not None and
           (lines[1] == INTERRUPTED or lines[1] == lines[0]), "stderr: %r" % err)
    c.that(out == "", "stdout: %r" % out)
    check_untouched(c, job, dst, copy)
    return c.problems


def check_source_shrinks_own_ranks(job):
    """SRC's file truncated while process 0 writes its own ranks (--ranks 0-1/: all of
    them), stopped (SIGSTOP) once its files exist and resumed after the truncation: its
    pwrite(2) from the input's map fails with EFAULT, which used to read "cannot write
    .../model-rank-0-part-0.safetensors: Bad address", blaming the output.  Now every
    process prints process 0's line naming the input and a tensor, as convert does, and
    exits 4; the existing DST stays as it was."""
    c = Checks()
    caught = caught_truncated(job, ["--ranks", "0-1/"])
    if caught is None:
        skip_missed("process 0 could be stopped with SRC left to read")
        return c.problems
    src, dst, copy, status, out, err = caught
    weights = os.path.join(src, "model-00001-of-00001.safetensors")
    c.that(status == 4, "exit %d, expected 4" % status)
    said = re.escape("wsync: sync: process 0: cannot read %s: the file shrank while wsync "
                     "was reading it (tensor \"" % weights) + r"[\w.]+\"\)"
    lines = err.splitlines()
    c.that(len(lines) == 2 and len(set(lines)) == 1 and re.fullmatch(said, lines[0]),
           "stderr: %r" % err)
    check_untouched(c, job, dst, copy)
    return c.problems


def check_killed_process(job):
    """kill -9 of process 1 while it receives (its file is in the temporary directory):
    mpirun ends process 0 (SIGTERM, then SIGKILL a second later), which used to wait for
    process 1 until killed, silently, its temporary directory left behind.  Now it
    removes it, prints one line saying what happened, and ends by the signal; the
    existing DST stays as it was."""
    c = Checks()
    caught = catch_mid_sync(job, lambda src, pids: os.kill(pids[1], signal.SIGKILL))
    if caught is None:
        skip_missed("process 1 could be killed")
        return c.problems
    src, dst, copy, status, out, err = caught
    c.that(status != 0, "exit 0 after a process was killed")
    c.that(err.splitlines() == [INTERRUPTED], "stderr: %r" % err)
    c.that(out == "", "stdout: %r" % out)
    check_untouched(c, job, dst, copy)
    return c.problems


def check_full_disk(job):
    """A DST on a small file system (a tmpfs of 1.2 MB in a mount namespace of its own;
    root only), holding an earlier sync's output.  With 150 kB free, less than the
    files' sizes: refused before any data, as convert refuses (it used to write until
    the disk was full).  With room for the files' sizes rounded up to a page, but not
    for config.json's page and each file's last one: the write that fails is named, file
    and tensor, as convert's (it used to name the file alone).  Both: exit 4, the same
    line from every process, the previous DST as it was, no temporary left."""
    c = Checks()
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        skip("a full disk needs root and unshare(1), to mount a small tmpfs")
        return c.problems
    probe = subprocess.run(["unshare", "-m", "true"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True)
    if probe.returncode != 0:  # a container or chroot without CAP_SYS_ADMIN
        skip("cannot make a mount namespace here: %s" % probe.stderr.strip())
        return c.problems
    import shlex
    q = shlex.quote
    src = job.synth("tiny-qwen3-moe")
    small, saved = job.path("small"), job.path("saved")
    os.mkdir(saved)
    out, fill = os.path.join(small, "out"), os.path.join(small, "fill")
    layout = layout_args("vllm", "kernel", 2, 2)

    def mpi(*args):
        return " ".join(q(a) for a in mpirun_prefix() + ["-np", "2"] +
                        wsync_cmd("sync", src, out, *args))

    def attempt(name):
        """The second sync, its stderr and status, DST and the file system's names."""
        return [
            "%s 2> %s; echo $? > %s" % (mpi(*layout), q(os.path.join(saved, name + ".err")),
                                         q(os.path.join(saved, name + ".status"))),
            "cp -a %s %s" % (q(out), q(os.path.join(saved, name))),
            "ls -a %s > %s; rm -f %s" % (q(small), q(os.path.join(saved, name + ".ls")),
                                         q(fill))]
    script = "\n".join([
        "mount --make-rprivate / && mkdir -p %s && mount -t tmpfs -o size=1200000 wsync-test"
        " %s || exit 99" % (q(small), q(small)),
        "%s || exit 98" % mpi("-q", *layout),
        "cp -a %s %s" % (q(out), q(os.path.join(saved, "before"))),
        "avail() { df -B1 --output=avail %s | tail -n 1; }" % q(small),
        "head -c $(($(avail) - 150000 / 4096 * 4096)) /dev/zero > %s" % q(fill)] +
        attempt("refused") + [
        "need=$(cat %s/*.safetensors | wc -c)" % q(out),
        "head -c $(($(avail) - (need + 4095) / 4096 * 4096)) /dev/zero > %s" % q(fill)] +
        attempt("short"))
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True,
                       env=dict(os.environ, WSYNC_PLUGIN_PATH="", **MPI_ENV))
    if r.returncode == 99:
        skip("cannot mount a tmpfs here: %s" % r.stderr.strip())
        return c.problems
    if not c.that(r.returncode == 0, "the run in its mount namespace: exit %d: %s"
                  % (r.returncode, r.stderr.strip())):
        return c.problems
    said = {
        "refused": r"wsync: sync: process 0: cannot write %s: No space left on device \(the "
                   r"output needs \d+\.\d\skB, the file system has 1[45]\d\.\d\skB free\)"
                   % re.escape(out),
        "short": r"wsync: sync: process [01]: cannot write %s/\.out\.wsync-\w+/"
                 r"kernel-rank-[01]-part-0\.safetensors: No space left on device "
                 r"\(tensor \"[\w.]+\"\)( \(2 of 2 processes failed\))?" % re.escape(small)}
    for name, pattern in sorted(said.items()):
        with open(os.path.join(saved, name + ".status")) as f:
            status = f.read().strip()
        with open(os.path.join(saved, name + ".err")) as f:
            err = f.read()
        c.that(status == "4", "%s: exit %s, expected 4" % (name, status))
        lines = err.splitlines()
        c.that(len(lines) == 2 and len(set(lines)) == 1 and
               re.fullmatch(pattern, lines[0]) is not None, "%s: stderr: %r" % (name, err))
        check_untouched(c, job, os.path.join(saved, name), os.path.join(saved, "before"))
        with open(os.path.join(saved, name + ".ls")) as f:
            listing = f.read().split()
        c.that(sorted(listing) == [".", "..", "fill", "out"], "%s: on the tmpfs: %r"
               % (name, listing))
    return c.problems


def check_full_disk_two_dsts(job):
    """Two DSTs of one host on one small file system (an MPMD launch, one process each,
    on a tmpfs in a mount namespace of its own; root only), with room for either's files
    but not for both: refused before any data, naming both needs (each leader used to
    check its own DST alone, both passed, and the processes wrote until the disk was
    full).  Exit 4, the same line from both processes, nothing left on the tmpfs.  The
    second DST is reached through a bind mount of the tmpfs: another mount, the same
    file system and free space (and st_dev, by which core/sync-mpi.c groups them)."""
    c = Checks()
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        skip("a full disk needs root and unshare(1), to mount a small tmpfs")
        return c.problems
    probe = subprocess.run(["unshare", "-m", "true"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True)
    if probe.returncode != 0:  # a container or chroot without CAP_SYS_ADMIN
        skip("cannot make a mount namespace here: %s" % probe.stderr.strip())
        return c.problems
    import shlex
    q = shlex.quote
    src = job.synth("tiny-qwen3-moe")
    small, bound, saved = job.path("small"), job.path("bound"), job.path("saved")
    os.mkdir(saved)
    a, fill = (os.path.join(small, n) for n in ("a", "fill"))
    b = os.path.join(bound, "b")
    layout = layout_args("vllm", "kernel", 2, 2)
    probe_cmd = mpirun_prefix() + ["-np", "2"] + wsync_cmd("sync", src, a, "-q", *layout)
    both = mpirun_prefix() + ["-np", "1"] + wsync_cmd("sync", src, a, *layout) + [":"] + \
        ["-np", "1"] + wsync_cmd("sync", src, b, *layout)
    script = "\n".join([
        "mount --make-rprivate / && mkdir -p %s %s && mount -t tmpfs -o size=1200000 "
        "wsync-test %s && mount --bind %s %s || exit 99"
        % (q(small), q(bound), q(small), q(small), q(bound)),
        "%s || exit 98" % " ".join(q(x) for x in probe_cmd),
        "need=$(cat %s/*.safetensors | wc -c); rm -rf %s" % (q(a), q(a)),
        "avail() { df -B1 --output=avail %s | tail -n 1; }" % q(small),
        # room for the two files' sizes, each rounded up to a page, and config.json's
        # page: either DST fits, both do not
        "head -c $(($(avail) - (need * 3 / 4 + 8191) / 4096 * 4096)) /dev/zero > %s" % q(fill),
        "%s 2> %s; echo $? > %s" % (" ".join(q(x) for x in both),
                                     q(os.path.join(saved, "err")),
                                     q(os.path.join(saved, "status"))),
        "ls -a %s > %s" % (q(small), q(os.path.join(saved, "ls")))])
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True,
                       env=dict(os.environ, WSYNC_PLUGIN_PATH="", **MPI_ENV))
    if r.returncode == 99:
        skip("cannot mount a tmpfs here: %s" % r.stderr.strip())
        return c.problems
    if not c.that(r.returncode == 0, "the run in its mount namespace: exit %d: %s"
                  % (r.returncode, r.stderr.strip())):
        return c.problems
    with open(os.path.join(saved, "status")) as f:
        status = f.read().strip()
    with open(os.path.join(saved, "err")) as f:
        err = f.read()
    with open(os.path.join(saved, "ls")) as f:
        listing = f.read().split()
    said = (r"wsync: sync: process 0: cannot write %s: No space left on device \(the output "
            r"needs \d+\.\d\skB, \d+\.\d\skB with the other DSTs this host writes on the "
            r"same file system, which has \d+\.\d\skB free\) \(2 of 2 processes failed\)"
            % re.escape(a))
    lines = err.splitlines()
    c.that(status == "4", "exit %s, expected 4" % status)
    c.that(len(lines) == 2 and len(set(lines)) == 1 and re.fullmatch(said, lines[0]),
           "stderr: %r" % err)
    c.that(sorted(listing) == [".", "..", "fill"], "on the tmpfs: %r" % listing)
    return c.problems


def check_not_wsync_output(job):
    c = Checks()
    src = job.synth("tiny-qwen3-moe")
    dst = job.path("mine")
    os.mkdir(dst)
    with open(os.path.join(dst, "notes.txt"), "w") as f:
        f.write("mine\n")
    r = sync([(2, [src, dst] + layout_args("vllm", "kernel", 2, 4))])
    one_line_from_every_process(c, r, 2, 2, ["process 0: ", "is not wsync's output",
                                             "--force"])
    c.that(os.listdir(dst) == ["notes.txt"], "DST changed: %s" % os.listdir(dst))
    return c.problems


def check_usage(job):
    c = Checks()
    r = sync([(2, [job.synth("tiny-qwen3-moe"), "--target", "vllm"])])
    one_line_from_every_process(c, r, 2, 2, ["process 0: ", "expected SRC and DST"])
    r = sync([(2, [job.synth("tiny-qwen3-moe"), job.path("sync"), "--target", "vllm",
                   "--bucket-size", "2G"])])
    one_line_from_every_process(c, r, 2, 2, ["process 0: ", "--bucket-size must be from 4K "
                                             "to 1G"])
    return c.problems


def check_quiet_and_verbose(job):
    """-q with -v, refused as by the other commands (exit 2; tests/test-cli.c
    /cli/quiet-and-verbose has them without mpirun): process 0 used to print its -v lines
    ("started", "planned") before the refusal.  Now every process prints the refusal
    alone, also where only process 1 was given both and process 0 only -v."""
    c = Checks()
    src = job.synth("tiny-qwen3-moe")
    layout = layout_args("vllm", "kernel", 2, 4)
    refusal = "-q (--quiet) and -v (--verbose) contradict each other: give one " \
              "(see wsync sync --help)"
    r = sync([(2, [src, job.path("sync"), "-q", "-v"] + layout)])
    one_line_from_every_process(c, r, 2, 2, ["wsync: sync: process 0: " + refusal])
    c.that(r.stdout == "", "stdout: %r" % r.stdout)
    dst = job.path("sync")
    r = sync([(1, [src, dst, "-v"] + layout), (1, [src, dst, "-q", "-v"] + layout)])
    one_line_from_every_process(c, r, 2, 2, ["wsync: sync: process 1: " + refusal])
    c.that(not os.path.exists(dst), "%s was written" % dst)
    return c.problems


def check_not_installed(job):
    """Without wsync-mpi, `wsync sync` says so in one line and exits 2."""
    c = Checks()
    empty = job.path("libexec")
    os.mkdir(empty)
    r = run(wsync_cmd("sync", "src", "dst", "--target", "vllm"), {"WSYNC_LIBEXECDIR": empty})
    c.that(r.returncode == 2, "exit %d" % r.returncode)
    lines = r.stderr.splitlines()
    c.that(len(lines) == 1 and lines[0].startswith("wsync sync: the distributed sync is not "
                                                   "installed")
           and "./configure --with-mpi" in lines[0] and "wsync-mpi package" in lines[0],
           "stderr: %r" % r.stderr)
    return c.problems


FAULTS = [
    ("bad input on process 0: SRC missing (exit 4)", check_src_missing),
    ("bad input on process 0: a safetensors file cut short (exit 3)", check_bad_input),
    ("a socket on process 0 (SRC, its config.json): refused as a FIFO (exit 3)",
     check_socket_input),
    ("a tp from conf.d the layout refuses names its file and line (exit 2)",
     check_conf_sync_size_refused),
    ("process 2 cannot write its DST; the shared DST stays as it was", check_dst_fails_on_process_2),
    ("3 processes do not divide 4 ranks (exit 2)", check_not_dividing),
    ("--ranks refusals (exit 2)", check_bad_ranks),
    ("DST that is not wsync's output refused (exit 2)", check_not_wsync_output),
    ("processes given different SRC or options refused (exit 2)", check_mismatched_args),
    ("kill -9 of a process mid-sync: one line, no temporary, DST as it was",
     check_killed_process),
    ("a full disk: refused before the data, or the file and tensor named; DST as it was",
     check_full_disk),
    ("two DSTs on one full file system: refused before the data, naming both needs",
     check_full_disk_two_dsts),
    ("SRC truncated mid-sync: exit 4, the file and a tensor named, DST as it was",
     check_source_shrinks),
    ("SRC truncated while process 0 writes its own ranks: the input named, exit 4",
     check_source_shrinks_own_ranks),
    ("SIGTERM after the swap: every process says DST was swapped in", check_signal_after_swap),
    ("a process ends before every process has the verdict: no swap, all say so",
     check_signal_before_every_process_has_verdict),
    ("a process ends before its leader says whether it swapped: it says it cannot tell",
     check_signal_before_leader_says),
    ("a leader signalled in the barrier before the swap: no swap, as if seen at once",
     check_signal_in_barrier_before_swap),
    ("a leader signalled while it writes the marker: no swap, as if seen at once",
     check_signal_while_marker_written),
    ("a signal after the last exchange: every process says DST was swapped in",
     check_late_signal_after_swap),
    ("a signal after the last exchange on a process without ranks: all DSTs swapped in",
     check_late_signal_without_dst),
    ("a signal after a refusal's last exchange: the refusal alone, its status (exit 2)",
     check_late_signal_after_failure),
    ("DST swapped in, its parent not synced: said in place, previous kept (exit 4)",
     check_swap_not_durable),
    ("two DSTs swapped in, neither parent synced: each leader names its kept previous",
     check_swap_not_durable_two_dsts),
    ("usage errors from every process (exit 2)", check_usage),
    ("-q with -v refused before any -v line, from every process (exit 2)",
     check_quiet_and_verbose),
]


def scratch_root():
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return tempfile.mkdtemp(prefix="wsync-sync-test-", dir=shm)
    return tempfile.mkdtemp(prefix="wsync-sync-test-")


def main(argv):
    for arg in argv[1:]:
        if arg not in ("--tap", "-k"):
            print("usage: %s [--tap] [-k]" % argv[0], file=sys.stderr)
            return 2
    work = scratch_root()
    try:
        job = Job(work)
        tests = [("wsync sync without wsync-mpi: one line, exit 2",
                  lambda: check_not_installed(job)),
                 ("convert: DST renamed in, its parent not synced: said in place (exit 4)",
                  lambda: check_convert_not_durable(job))]
        why_not = None
        if os.environ.get("WSYNC_TEST_MPI") != "yes":
            why_not = "wsync-mpi was not built (./configure found no MPI, or --without-mpi)"
        elif shutil.which("mpirun") is None:
            why_not = "mpirun is not installed (apt-get install openmpi-bin)"
        if why_not is None:
            for case in EQUAL_CASES:
                config, np, target, fmt, tp, ep, extra = case
                name = "-np %d %s %s%s equals convert" % (
                    np, config, " ".join(layout_args(target, fmt, tp, ep)),
                    "".join(" " + e for e in extra))
                tests.append((name, lambda case=case: check_equal(job, case)))
            tests.append(("--select: a DCP save of the model beside its optimizer",
                          lambda: check_select(job)))
            tests.append(("--config: a DCP save with no config.json, the model's elsewhere",
                          lambda: check_config_option(job)))
            tests.append(("conf.d's sync section gives the layout (its rank is convert's)",
                          lambda: check_conf_sync_section(job)))
            tests.append(("two DSTs on one host (MPMD), each swapped in once",
                          lambda: check_two_directories(job)))
            tests.append(("a second sync replaces its own output",
                          lambda: check_replaces_own_output(job)))
            tests.append(("two steps into one DST, SRC rewritten between them",
                          lambda: check_steps(job)))
            tests.append(("-q --json prints the summary", lambda: check_quiet_json(job)))
            tests.append(("the text summary: rank 0, ranks 1-3, the totals",
                          lambda: check_text_summary(job)))
            tests.append(("--progress reports on stderr, which is not a terminal",
                          lambda: check_progress(job)))
            for name, check in FAULTS:
                tests.append((name, lambda check=check: check(job)))
        else:
            # keep the tests that mean something without MPI (wsync-mpi is absent)
            tests = tests[:2]
        print("1..%d" % len(tests))
        if why_not is not None:
            print("# skipping the runs under mpirun: " + why_not)
        failures = 0
        for number, (name, check) in enumerate(tests, 1):
            del SKIPPED[:]
            problems = check()
            directive = (" # SKIP " + " ".join(SKIPPED[0].split())) if SKIPPED and not problems else ""
            print("%s %d - %s%s" % ("not ok" if problems else "ok", number, name, directive))
            for p in problems[:8]:
                print("# " + p)
            failures += 1 if problems else 0
            sys.stdout.flush()
        return 1 if failures else 0
    finally:
        if not os.environ.get("WSYNC_TEST_KEEP"):
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
