#!/usr/bin/env python3
"""Replays Hugging Face Transformers' `from_pretrained` over what `wsync convert` writes
to the targets hf, hf-experts and hf-fused, with tests/hf_replay.py, a derivation of
Transformers' loading rules from docs/hf-checkpoints.md that is independent of wsync's
plugins.

For each tiny config of configs/ (and the Llama ones of tests/data/configs/), one
`wsync synth --pattern index` checkpoint in the form the model is published in and, for
MoE models, one with Transformers 5's fused experts (`--fused-experts`); each converted
to every Hugging Face target, in many small shards and (hf) in one.  Every output must
follow the safetensors and index rules Transformers and the safetensors library apply
(format "pt" metadata, weight_map naming every tensor once, metadata.total_size), carry
the source's config.json unchanged, and load into the model class of Transformers 4
(4.5x) and 5 with no key missing (random init), unexpected (dropped), misshapen or
discarded, every parameter ending with the bytes it gets from the source.  Where a
Transformers release cannot load an output (the fused experts before Transformers 5;
per-expert Qwen3.5-MoE experts in the Transformers 5 releases without the converter),
exactly the expert keys must be what it misses.  Controls mutate good outputs and
require the replay to report each mutation; config.json checks cover the tied LM head
(Transformers ties by the top-level config, vLLM by text_config) and the RoPE
parameters (every llama3 scaling field included) that each Transformers major, and vLLM
run on Transformers 4, builds after `rope-format`.

Prints TAP.  Accepts and ignores --tap and -k (tests/tap-test passes them).
Environment (set by Makefile.am's AM_TESTS_ENVIRONMENT): WSYNC_TEST_BINARY,
WSYNC_TEST_BUILT_PLUGIN_DIR, WSYNC_TEST_CONF_DIR, G_TEST_SRCDIR."""

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # never write into the source tree (make distcheck)
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_replay as hr  # noqa: E402

CONFIGS = ["tiny-qwen3-moe", "tiny-qwen3-moe-tied", "tiny-qwen3-moe-8heads", "tiny-qwen3",
           "tiny-qwen3.5-moe", "tiny-qwen3.5-moe-nk2", "tiny-qwen3.5",
           "tiny-llama3", "tiny-llama3-tied-bias",
           "tiny-qwen3-moe-bias", "tiny-qwen3-bias"]  # attention_bias: q/k/v/o biases
TARGETS = ["hf", "hf-experts", "hf-fused"]
SMALL_PART = "16K"  # many shards for the tiny configs
PLUGIN_CONFS = ["10-hf.conf", "30-qwen3_moe.conf", "31-qwen3_5_moe.conf", "32-llama.conf",
                "50-rope-compat.conf"]
MAX_DIAGNOSTICS = 6
EXPERT_PARAM = re.compile(r"\.mlp\.experts\.")


def env_path(name, fallback):
    value = os.environ.get(name)
    return value if value else fallback


SRCDIR = os.path.dirname(HERE)
BINARY = env_path("WSYNC_TEST_BINARY", os.path.join(SRCDIR, "wsync"))
PLUGIN_DIR = env_path("WSYNC_TEST_BUILT_PLUGIN_DIR", os.path.join(SRCDIR, "plugins", ".libs"))
CONF_DIR = env_path("WSYNC_TEST_CONF_DIR", os.path.join(SRCDIR, "conf.d"))
CONFIG_DIR = os.path.join(os.path.dirname(env_path("G_TEST_SRCDIR", HERE)), "configs")
TEST_CONFIG_DIR = os.path.join(env_path("G_TEST_SRCDIR", HERE), "data", "configs")


def config_path(config):
    """configs/NAME.json (the project's), else tests/data/configs/NAME.json."""
    path = os.path.join(CONFIG_DIR, config + ".json")
    return path if os.path.exists(path) else os.path.join(TEST_CONFIG_DIR, config + ".json")


def write_conf_dir(root):
    """The plugin sections of conf.d this test needs (no vllm: only the hf targets)."""
    d = os.path.join(root, "conf")
    os.mkdir(d)
    for name in PLUGIN_CONFS:
        shutil.copy(os.path.join(CONF_DIR, name), d)
    return d


def wsync(conf_dir, *args):
    cmd = [BINARY, "--conf-dir", conf_dir, "--plugin-dir", PLUGIN_DIR] + list(args)
    env = dict(os.environ, WSYNC_PLUGIN_PATH="")
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                          universal_newlines=True)


class Tap:
    def __init__(self):
        self.number, self.failures = 0, 0

    def result(self, ok, name, diagnostics=()):
        self.number += 1
        self.failures += 0 if ok else 1
        print("%s %d - %s" % ("ok" if ok else "not ok", self.number, name))
        diagnostics = list(diagnostics)
        for line in diagnostics[:MAX_DIAGNOSTICS]:
            print("# " + line)
        if len(diagnostics) > MAX_DIAGNOSTICS:
            print("# ... and %d more" % (len(diagnostics) - MAX_DIAGNOSTICS))
        sys.stdout.flush()


# ------------------------------------------------------------------ what each output holds

def expert_form(model_type, target):
    """The form of the routed experts of the main layers in DST: hf writes the form the
    model is published in (Qwen3-MoE per expert, Qwen3.5-MoE fused; an input in the
    other form is read, not copied), hf-experts per expert, hf-fused fused; None
    without routed experts."""
    published = {"qwen3_moe": "per-expert", "qwen3_5_moe": "fused"}.get(model_type)
    if published is None:
        return None
    return {"hf": published, "hf-experts": "per-expert", "hf-fused": "fused"}[target]


def loads(model_type, form, consumer):
    """Whether @consumer's release can load routed experts in @form: Transformers 4 only
    per expert (nn.ModuleList); Transformers 5 fused, and per expert through its
    converters: Qwen3-MoE's always, Qwen3.5-MoE's main layers only in the releases whose
    `qwen3_5_moe_text` entry carries them (docs/hf-checkpoints.md §4, §8)."""
    if form is None:
        return True
    if consumer.major == 4:
        return form == "per-expert"
    return form == "fused" or model_type == "qwen3_moe" or consumer.qwen35_moe_converts


def read_all(directory):
    """{name: Tensor} of a checkpoint, for the source (read by the same rules)."""
    ck = hr.read_checkpoint(directory)
    if ck.problems:
        raise hr.LoadError("; ".join(ck.problems))
    return ck.tensors


def check_output(dst, source_dir, config, reference, consumers):
    """Problems (strings) of one output directory DST against its source: @reference is
    (the Transformers 5 state of the source, its ignored tensors with the experts fused)."""
    problems = []
    try:
        ck = hr.read_checkpoint(dst)
    except hr.LoadError as e:
        return ["reading %s: %s" % (dst, e)]
    problems += ck.problems
    # (.wsync-output: wsync's mark of a directory it wrote, which --force looks for)
    expected_files = {"config.json", hr.SAFE_WEIGHTS_INDEX_NAME, ".wsync-output"} | set(ck.files)
    stray = sorted(set(os.listdir(dst)) - expected_files)
    if stray:
        problems.append("files Transformers does not read: %s" % stray)
    with open(os.path.join(dst, "config.json"), "rb") as f, \
            open(os.path.join(source_dir, "config.json"), "rb") as g:
        if f.read() != g.read():
            problems.append("config.json differs from the source's (rope-format keep)")
    state, ignored = reference
    for consumer, form, model_type in consumers:
        try:
            rep = hr.load(ck.tensors, config, consumer)
        except hr.LoadError as e:
            problems.append("%s: %s" % (consumer.name, e))
            continue
        if loads(model_type, form, consumer):
            problems += ["%s: %s" % (consumer.name, p) for p in rep.problems()]
            if rep.clean():
                diff = hr.first_difference(hr.canonical_state(rep.state, config), state)
                if diff:
                    problems.append("%s: %s" % (consumer.name, diff))
        else:
            # the documented limitation: the experts, and nothing else
            wrong = [k for k in rep.missing + rep.unexpected if not EXPERT_PARAM.search(k)]
            if rep.clean() or wrong or rep.mismatched or rep.discarded:
                problems.append("%s: expected only the routed experts to be missing and "
                                "unexpected (%s experts), got: %s" % (
                                    consumer.name, form, (rep.problems() or ["a clean load"])
                                    [:3]))
        if consumer.major == 5:
            # what Transformers ignores (the MTP block) is still the published layout's:
            # the same tensors as the source's, whatever form its experts take
            diff = hr.first_difference(hr.convert_experts(rep.ignored_state, ""), ignored)
            if diff:
                problems.append("%s ignores: %s" % (consumer.name, diff))
    return problems


# ------------------------------------------------------------------ controls

def write_safetensors(path, metadata, tensors):
    """A safetensors file as the library writes it (docs/safetensors.md §1), for the
    controls' mutants."""
    header, offset, blobs = {}, 0, []
    if metadata is not None:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        t = tensors[name]
        header[name] = {"dtype": t.dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(t.data)]}
        offset += len(t.data)
        blobs.append(t.data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def rewrite_shards(dst, edit):
    """Applies @edit(metadata, tensors) -> (metadata, tensors) to every shard of DST and
    rewrites the index to match."""
    index_path = os.path.join(dst, hr.SAFE_WEIGHTS_INDEX_NAME)
    with open(index_path) as f:
        index = json.load(f)
    weight_map, total = {}, 0
    for name in sorted(set(index["weight_map"].values())):
        path = os.path.join(dst, name)
        metadata, tensors = hr.read_safetensors(path)
        metadata, tensors = edit(metadata, tensors)
        write_safetensors(path, metadata, tensors)
        for key, t in tensors.items():
            weight_map[key] = name
            total += len(t.data)
    index["weight_map"], index["metadata"]["total_size"] = weight_map, total
    with open(index_path, "w") as f:
        json.dump(index, f, indent=2)


def swap_gate_up(metadata, tensors):
    """The up rows before the gate rows in one expert of the first fused gate_up_proj."""
    for name in sorted(tensors):
        if name.endswith("mlp.experts.gate_up_proj"):
            t = tensors[name]
            e, rows, cols = t.shape
            size = len(t.data) // (e * rows * cols)
            half = rows // 2 * cols * size
            data = t.data[half:2 * half] + t.data[:half] + t.data[2 * half:]
            tensors[name] = hr.Tensor(t.dtype, t.shape, data)
            break
    return metadata, tensors


def rename(old, new):
    def edit(metadata, tensors):
        return metadata, {(new + k[len(old):] if k.startswith(old) else k): t
                          for k, t in tensors.items()}
    return edit


def drop(prefix):
    def edit(metadata, tensors):
        return metadata, {k: t for k, t in tensors.items() if not k.startswith(prefix)}
    return edit


def add_tied_head(metadata, tensors):
    """The embedding a second time, as lm_head.weight, next to it."""
    if "model.embed_tokens.weight" in tensors:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    return metadata, tensors


def no_metadata(metadata, tensors):
    del metadata
    return None, tensors


def edit_index(change):
    def mutate(dst):
        path = os.path.join(dst, hr.SAFE_WEIGHTS_INDEX_NAME)
        with open(path) as f:
            index = json.load(f)
        change(index)
        with open(path, "w") as f:
            json.dump(index, f)
    return mutate


def unlist_one(index):
    """Drops from weight_map one key of a shard that holds others too."""
    shards = {}
    for key, name in sorted(index["weight_map"].items()):
        shards.setdefault(name, []).append(key)
    del index["weight_map"][max(shards.values(), key=len)[0]]


def total_plus_one(index):
    index["metadata"]["total_size"] += 1


def no_index_metadata(index):
    del index["metadata"]


# (config, source form, target, what, mutate(dst), fragment the replay must report)
CONTROLS = [
    ("tiny-qwen3-moe", "per-expert", "hf-fused", "up rows before gate rows",
     lambda d: rewrite_shards(d, swap_gate_up), "bytes differ"),
    ("tiny-qwen3.5-moe", "fused", "hf", "up rows before gate rows",
     lambda d: rewrite_shards(d, swap_gate_up), "bytes differ"),
    ("tiny-qwen3.5", "published", "hf", "the vision tower under visual.",
     lambda d: rewrite_shards(d, rename("model.visual.", "visual.")),
     "missing (random init): model.visual."),
    ("tiny-qwen3.5", "published", "hf", "the MTP block dropped",
     lambda d: rewrite_shards(d, drop("mtp.")), "ignores: mtp."),
    ("tiny-qwen3-moe", "per-expert", "hf", "no lm_head.weight",
     lambda d: rewrite_shards(d, drop("lm_head.")), "missing (random init): lm_head.weight"),
    ("tiny-qwen3-moe-tied", "per-expert", "hf", "a tied lm_head.weight written",
     lambda d: rewrite_shards(d, add_tied_head),
     "tied (bytes discarded): lm_head.weight"),
    ("tiny-llama3", "published", "hf", "no __metadata__",
     lambda d: rewrite_shards(d, no_metadata), "no __metadata__"),
    ("tiny-llama3", "published", "hf", "a tensor weight_map does not list",
     edit_index(unlist_one), "does not list"),
    ("tiny-llama3", "published", "hf", "metadata.total_size one too many",
     edit_index(total_plus_one), "metadata.total_size"),
    ("tiny-llama3", "published", "hf", "an index without metadata",
     edit_index(no_index_metadata), "KeyError 'metadata'"),
]


# ------------------------------------------------------------------ config.json

def tie_variants(work, config):
    """Configs of @config whose tie_word_embeddings disagree between the top level
    (Transformers' word) and text_config (vLLM's word), an absent word being its class's
    default, false (docs/hf-checkpoints.md §3): [(what, path)]."""
    with open(config_path(config)) as f:
        base = json.load(f)
    out = []
    for what, root, text in (("absent at the top level, true in text_config", None, True),
                             ("false at the top level, true in text_config", False, True),
                             ("true at the top level, false in text_config", True, False),
                             ("true at the top level, absent in text_config", True, None)):
        c = json.loads(json.dumps(base))
        c.pop("tie_word_embeddings", None)
        c["text_config"].pop("tie_word_embeddings", None)
        if root is not None:
            c["tie_word_embeddings"] = root
        if text is not None:
            c["text_config"]["tie_word_embeddings"] = text
        path = os.path.join(work, "%s-tie-%d.json" % (config, len(out)))
        with open(path, "w") as f:
            json.dump(c, f, indent=2)
        out.append((what, path))
    return out


# The readers of a config.json's RoPE keys: Transformers 4 and 5, and vLLM from #30046 to
# #45161 running on Transformers 4 (it builds its own rope_parameters from the
# Transformers 4 config class, docs/vllm.md §10 "RoPE config"; vLLM on Transformers 5 runs
# Transformers 5's standardisation, the same as Transformers 5).  (name, the Transformers
# major whose config classes it uses, what it builds)
ROPE_READERS = [("Transformers 4", 4, hr.rope_transformers4),
                ("Transformers 5", 5, hr.rope_transformers5),
                ("vLLM on Transformers 4", 4, hr.rope_vllm_transformers4)]


def effective_rope(config, major):
    """The RoPE parameters Transformers @major builds from @config (tests/hf_replay.py,
    docs/hf-checkpoints.md §6): type, theta, partial_rotary_factor and every scaling
    field (llama3's factor, low_freq_factor, high_freq_factor,
    original_max_position_embeddings)."""
    return hr.rope_transformers4(config) if major == 4 else hr.rope_transformers5(config)


# (config, the Transformers major its keys are written for)
ROPE_CONFIGS = [("tiny-qwen3-moe", 4), ("tiny-llama3", 4), ("tiny-llama3-tied-bias", 5),
                ("tiny-qwen3.5-moe", 5)]


def rope_checks(conf_dir, work):
    """Yields (ok, name, diagnostics): what each reader of the RoPE keys that has the
    model builds from the config.json `wsync config --rope-format F` writes, against
    what the source config means to the Transformers major it is written for.  Then a
    control: the Transformers 5 form of a Llama config, kept as it is, is misread by
    vLLM on Transformers 4 (rope_theta 10000.0, docs/vllm.md §10 "RoPE config"), which
    is why rope-format transformers4 exists; the replay must see it."""
    for config, written_for in ROPE_CONFIGS:
        with open(config_path(config)) as f:
            source = json.load(f)
        want = effective_rope(source, written_for)
        has = [c.major for c in (hr.TRANSFORMERS4, hr.TRANSFORMERS5)
               if c.has(source["model_type"])]
        for fmt, majors in (("keep", (written_for,)), ("transformers4", (4, 5)),
                            ("transformers5", (5,))):
            readers = [r for r in ROPE_READERS if r[1] in majors and r[1] in has]
            out = os.path.join(work, "rope-%s-%s.json" % (config, fmt))
            r = wsync(conf_dir, "config", "--rope-format", fmt, "-o", out, config_path(config))
            name = "%s: config.json of rope-format %s read by %s" % (
                config, fmt, " and ".join(reader[0] for reader in readers))
            if r.returncode != 0:
                yield False, name, ["exit status %d: %s" % (r.returncode, r.stderr.strip())]
                continue
            with open(out) as f:
                written = json.load(f)
            diag = ["%s builds RoPE %r, the source means %r" % (what, build(written), want)
                    for what, _, build in readers if build(written) != want]
            text = written.get("text_config", written)
            if "ignore_keys_at_rope_validation" in text:
                diag.append("ignore_keys_at_rope_validation is written (docs/hf-checkpoints.md §6)")
            yield not diag, name, diag
    config = "tiny-llama3-tied-bias"
    with open(config_path(config)) as f:
        source = json.load(f)
    got = hr.rope_vllm_transformers4(source)
    want = effective_rope(source, 5)
    yield (got != want and got["rope_theta"] == hr.DEFAULT_THETA,
           "control: %s (Transformers 5 form) kept as it is is misread by vLLM on "
           "Transformers 4 (rope_theta %r)" % (config, got["rope_theta"]),
           [] if got != want else ["the replay builds %r, as Transformers 5 does" % got])


# ------------------------------------------------------------------ main

def scratch_root():
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return tempfile.mkdtemp(prefix="wsync-hf-replay-", dir=shm)
    return tempfile.mkdtemp(prefix="wsync-hf-replay-")


def synth_sources(conf_dir, work, configs):
    """{(config, form): directory}: the published form of every config, and the fused
    form of the MoE ones (Transformers 5's; Qwen3.5-MoE publishes it already, MTP aside)."""
    sources = {}
    for config, cfg in configs.items():
        forms = [("published", [])]
        if cfg["model_type"] in ("qwen3_moe", "qwen3_5_moe"):
            published = "per-expert" if cfg["model_type"] == "qwen3_moe" else "fused"
            forms = [(published, []), ("fused" if published == "per-expert" else "fused-mtp",
                                       ["--fused-experts"])]
        for form, extra in forms:
            d = os.path.join(work, "src-%s-%s" % (config, form))
            r = wsync(conf_dir, "synth", "--config", config_path(config), "--pattern", "index",
                      "-q", *(extra + [d]))
            if r.returncode != 0:
                raise RuntimeError("wsync synth --config %s %s: exit %d: %s" % (
                    config_path(config), " ".join(extra), r.returncode, r.stderr.strip()))
            sources[config, form] = d
    return sources


def main(argv):
    for arg in argv[1:]:
        if arg not in ("--tap", "-k"):
            print("usage: %s [--tap] [-k]" % argv[0], file=sys.stderr)
            return 2
    work = scratch_root()
    tap = Tap()
    try:
        conf_dir = write_conf_dir(work)
        configs = {}
        for config in CONFIGS:
            with open(config_path(config)) as f:
                configs[config] = json.load(f)
        try:
            sources = synth_sources(conf_dir, work, configs)
        except RuntimeError as e:
            print("Bail out! %s" % e)
            return 1
        references = {}
        for config in CONFIGS:
            # the reference: every parameter of Transformers 5's model from the published
            # checkpoint, which must itself load cleanly, and what it ignores
            form = next(f for c, f in sources if c == config)
            rep = hr.load(read_all(sources[config, form]), configs[config], hr.TRANSFORMERS5)
            tap.result(rep.clean(), "%s: the published synth loads in Transformers 5" % config,
                       rep.problems())
            references[config] = (hr.canonical_state(rep.state, configs[config]),
                                  hr.convert_experts(rep.ignored_state, ""))
        for (config, form), src in sorted(sources.items()):
            cfg = configs[config]
            model_type = cfg["model_type"]
            for target in TARGETS:
                parts = [SMALL_PART] + ([None] if target == "hf" else [])
                for part in parts:
                    dst = os.path.join(work, "out")
                    args = ["convert", "-q", "--force", "-t", target, src, dst]
                    if part:
                        args += ["--part-size", part]
                    r = wsync(conf_dir, *args)
                    consumers = [(c, expert_form(model_type, target), model_type)
                                 for c in hr.CONSUMERS if c.has(model_type)]
                    name = "%s (%s source) --target %s%s: %s" % (
                        config, form, target, " --part-size " + part if part else "",
                        ", ".join("%s %s" % (c.name, "loads" if loads(model_type, f, c)
                                             else "misses the experts")
                                  for c, f, _ in consumers))
                    if r.returncode != 0:
                        tap.result(False, name, ["exit status %d: %s" % (r.returncode,
                                                                         r.stderr.strip())])
                        continue
                    problems = check_output(dst, src, cfg, references[config], consumers)
                    tap.result(not problems, name, problems)
                    shutil.rmtree(dst, ignore_errors=True)
        for config, form, target, what, mutate, fragment in CONTROLS:
            dst = os.path.join(work, "control")
            model_type = configs[config]["model_type"]
            r = wsync(conf_dir, "convert", "-q", "--force", "-t", target, "--part-size",
                      SMALL_PART, sources[config, form], dst)
            consumers = [(c, expert_form(model_type, target), model_type)
                         for c in hr.CONSUMERS if c.has(model_type)]
            problems = []
            if r.returncode == 0:
                mutate(dst)
                problems = check_output(dst, sources[config, form], configs[config],
                                        references[config], consumers)
            caught = any(fragment in p for p in problems)
            tap.result(caught, "control: %s --target %s, %s, is caught (%s)" % (
                config, target, what, fragment),
                [] if caught else ["the replay did not report %r; it reported: %s"
                                   % (fragment, problems[:3] or "nothing")])
            shutil.rmtree(dst, ignore_errors=True)
        for config in ("tiny-qwen3.5", "tiny-qwen3.5-moe"):
            for what, path in tie_variants(work, config):
                dst = os.path.join(work, "tie")
                r = wsync(conf_dir, "synth", "--pattern", "index", "-q", "--force", "--config",
                          path, dst)
                name = ("%s with tie_word_embeddings %s: refused (exit 3) naming the file "
                        "and the key, not written for one engine to misload" % (config, what))
                diag = []
                if (r.returncode != 3 or "tie_word_embeddings" not in r.stderr
                        or os.path.basename(path) not in r.stderr):
                    diag.append("exit status %d, stderr %r" % (r.returncode, r.stderr.strip()))
                    if r.returncode == 0:
                        with open(path) as f:
                            cfg = json.load(f)
                        rep = hr.load(read_all(dst), cfg, hr.TRANSFORMERS5)
                        diag += ["Transformers 5: %s" % p for p in rep.problems()]
                tap.result(not diag, name, diag)
                shutil.rmtree(dst, ignore_errors=True)
        for ok, name, diag in rope_checks(conf_dir, work):
            tap.result(ok, name, diag)
        print("1..%d" % tap.number)
        return 1 if tap.failures else 0
    finally:
        if not os.environ.get("WSYNC_TEST_KEEP"):
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
