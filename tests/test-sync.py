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


def sync(apps):
    """mpirun with one app context per (np, args) of @apps (an MPMD launch when there is
    more than one): each process runs `wsync sync ARGS`."""
    cmd = mpirun_prefix()
    for i, (np, args) in enumerate(apps):
        if i:
            cmd.append(":")
        cmd += ["-np", str(np)] + wsync_cmd("sync", *args)
    return run(cmd, MPI_ENV)


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
    return ["--target", target, "--format", fmt, "--tp", str(tp), "--ep", str(ep)]


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
]


def check_equal(job, case):
    config, np, target, fmt, tp, ep, extra = case
    c = Checks()
    src = job.synth(config)
    layout = layout_args(target, fmt, tp, ep)
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
            m = re.match(r"(?:model|kernel)-rank-(\d+)-part-\d+\.safetensors$", name)
            if m and int(m.group(1)) in p["ranks"]:
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
    ("process 2 cannot write its DST; the shared DST stays as it was", check_dst_fails_on_process_2),
    ("3 processes do not divide 4 ranks (exit 2)", check_not_dividing),
    ("--ranks refusals (exit 2)", check_bad_ranks),
    ("DST that is not wsync's output refused (exit 2)", check_not_wsync_output),
    ("usage errors from every process (exit 2)", check_usage),
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
                  lambda: check_not_installed(job))]
        why_not = None
        if os.environ.get("WSYNC_TEST_MPI") != "yes":
            why_not = "wsync-mpi was not built (./configure found no MPI, or --without-mpi)"
        elif shutil.which("mpirun") is None:
            why_not = "mpirun is not installed (apt-get install openmpi-bin)"
        if why_not is None:
            for case in EQUAL_CASES:
                config, np, target, fmt, tp, ep, extra = case
                name = "-np %d %s --target %s --format %s --tp %d --ep %d%s equals convert" % (
                    np, config, target, fmt, tp, ep, "".join(" " + e for e in extra))
                tests.append((name, lambda case=case: check_equal(job, case)))
            tests.append(("--select: a DCP save of the model beside its optimizer",
                          lambda: check_select(job)))
            tests.append(("--config: a DCP save with no config.json, the model's elsewhere",
                          lambda: check_config_option(job)))
            tests.append(("two DSTs on one host (MPMD), each swapped in once",
                          lambda: check_two_directories(job)))
            tests.append(("a second sync replaces its own output",
                          lambda: check_replaces_own_output(job)))
            tests.append(("-q --json prints the summary", lambda: check_quiet_json(job)))
            tests.append(("the text summary: rank 0, ranks 1-3, the totals",
                          lambda: check_text_summary(job)))
            tests.append(("--progress reports on stderr, which is not a terminal",
                          lambda: check_progress(job)))
            for name, check in FAULTS:
                tests.append((name, lambda check=check: check(job)))
        else:
            # keep the one test that means something without MPI (wsync-mpi is absent)
            tests = tests[:1]
        print("1..%d" % len(tests))
        if why_not is not None:
            print("# skipping the runs under mpirun: " + why_not)
        failures = 0
        for number, (name, check) in enumerate(tests, 1):
            problems = check()
            print("%s %d - %s" % ("not ok" if problems else "ok", number, name))
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
