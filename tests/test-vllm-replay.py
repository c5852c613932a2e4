#!/usr/bin/env python3
"""Replays vLLM's two consumers of per-rank weight files over what `wsync convert`
writes (issue 9, part 3), with tests/vllm_replay.py, a derivation of vLLM's behaviour
from the layout facts of docs/ that is independent of wsync's plugins.

For each tiny config of configs/ and of tests/data/configs/ in CONFIGS (the variants of
real checkpoints among them: explicit head_dim, one KV head, vocabularies that are no
multiple of 64, F16 and F32, dense layers in a MoE model, an expert count ep does not
divide, tied embeddings, Llama's biases), one `wsync synth --pattern index` checkpoint
with the RoPE buffers older checkpoints carry added (vLLM skips them), then
`wsync convert` over the matrix: tp 1, 2, 4, 8 (other sizes where a config divides by
them); ep 1, ep == tp and EXTRA_EPS for MoE models;
vLLM releases of each era (docs/vllm.md §5); targets vllm (CUDA) and vllm-ascend;
formats sharded-state (vLLM's ShardedStateLoader at engine start, docs/vllm.md §6) and
kernel (a live weight update, docs/vllm.md §7).  Where vLLM (or only vLLM-Ascend) would
refuse the sizes, wsync must refuse too (exit status 2, one line on stderr naming tp, or
ep where only vLLM-Ascend refuses).  Each rank's files
must then load through the replayed consumer without an error, a warning or a silent
cast, and every tensor's bytes must be what vLLM's weight loaders put into that
parameter from the same checkpoint.

Prints TAP.  Accepts and ignores --tap and -k (tests/tap-test passes them).
Environment (set by Makefile.am's AM_TESTS_ENVIRONMENT): WSYNC_TEST_BINARY,
WSYNC_TEST_BUILT_PLUGIN_DIR, WSYNC_TEST_CONF_DIR, G_TEST_SRCDIR."""

import concurrent.futures
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # never write into the source tree (make distcheck)
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vllm_replay as vr  # noqa: E402

# vllm-version values and what each release registers (docs/vllm.md §5): the era of the MoE
# block's names, and whether _expert_map is a persistent buffer with EP (#47206
# made it non-persistent after v0.24.0; "latest" is v0.27.1).  The vLLM-Ascend release
# for 0.24.0 sets its runner's _shared_experts to the shared expert MLP itself
# (docs/vllm-ascend.md §2 "Names by release"): ASCEND_UNWRAPPED.
ERAS = [("0.18.1", "A", True), ("0.20.0", "B", True), ("0.22.0", "C", True),
        ("0.24.0", "D", True), ("latest", "D", False)]
ASCEND_UNWRAPPED = {"0.24.0"}
TARGETS = [("vllm", "cuda"), ("vllm-ascend", "ascend")]
FORMATS = ["sharded-state", "kernel"]
CONFIGS = ["tiny-qwen3-moe", "tiny-qwen3-moe-tied", "tiny-qwen3-moe-8heads", "tiny-qwen3",
           "tiny-qwen3.5-moe", "tiny-qwen3.5-moe-nk2", "tiny-qwen3.5",
           "tiny-llama3", "tiny-llama3-tied-bias",
           # config variants of real checkpoints (tests/data/configs): an explicit head_dim
           # other than hidden_size / heads, one KV head (replicated over every tp), a
           # vocabulary that is no multiple of 64, an F16 or F32 model, dense layers inside
           # a MoE model (mlp_only_layers, decoder_sparse_step 2), an expert count ep does
           # not divide, tied embeddings on Qwen3.5-MoE, Llama's attention_bias alone
           "tiny-qwen3-moe-odd", "tiny-qwen3-moe-odd-f32", "tiny-qwen3-moe-6heads",
           "tiny-qwen3-moe-e6", "tiny-qwen3-tied-headdim", "tiny-qwen3.5-moe-kv1-tied",
           "tiny-llama3-bias-mqa", "tiny-llama3-wide-vocab",
           # attention_bias on Qwen3-MoE and Qwen3: q/k/v biases packed into qkv_proj.bias
           # and sliced like its rows, o_proj.bias ignored as vLLM does (docs/vllm.md §8)
           "tiny-qwen3-moe-bias", "tiny-qwen3-bias",
           # the other keys vLLM's LlamaDecoderLayer reads for Llama's attention biases
           # (docs/vllm.md §10 "Biases"): "bias" (q/k/v and o_proj), "qkv_bias": true (q/k/v
           # only), "attention_bias": true with "qkv_bias": false (o_proj only)
           "tiny-llama3-bias-key", "tiny-llama3-qkv-bias", "tiny-llama3-o-bias"]
TP_SIZES = [1, 2, 4, 8]
# tp sizes other than TP_SIZES: 6 heads (and a vocabulary padded to 384) divide by 3 and 6;
# 12 heads of 128 wide by 1, 2 and 4, where a vocabulary of 65 rows (padded to 128) leaves
# rank 2 one real row and rank 3 padding only (docs/vllm.md §3).
TP_SIZES_OF = {"tiny-qwen3-moe-6heads": [1, 2, 3, 6], "tiny-llama3-wide-vocab": [1, 2, 4],
               # 2 KV heads: tp 4 replicates them, with their biases
               "tiny-qwen3-moe-bias": [1, 2, 4], "tiny-qwen3-bias": [2, 4],
               "tiny-llama3-bias-key": [2], "tiny-llama3-qkv-bias": [2, 4],
               "tiny-llama3-o-bias": [2]}
# EP sizes beside 1 and tp (with every tp they are a multiple of): 4 over 6 experts gives
# 2, 2, 1, 1 on vLLM (docs/vllm.md §4) and is refused on vLLM-Ascend
# (docs/vllm-ascend.md §2 "Expert placement").
EXTRA_EPS = {"tiny-qwen3-moe-e6": [4]}
PLUGIN_CONFS = ["10-hf.conf", "20-vllm.conf", "30-qwen3_moe.conf", "31-qwen3_5_moe.conf",
                "32-llama.conf", "40-npu-ascend.conf"]
MAX_DIAGNOSTICS = 6
SMALL_PART = "16K"  # several parts per rank for the tiny configs


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


DEFAULT_DEPLOYMENT = (1, "allgather_reducescatter", False, "weights", False, "triton", "auto")


class Case:
    def __init__(self, config, tp, ep, target, platform, fmt, version, era, persistent,
                 refusal=None, part_size=None, pcp=1, backend="allgather_reducescatter",
                 sedp=False, encoder="weights", lm_only=False, moe="triton", dtype="auto"):
        self.config, self.tp, self.ep = config, tp, ep
        # the deployment (docs/vllm.md §9.4, docs/vllm-ascend.md §2; the vision tower's
        # mm_encoder_tp_mode and language-model-only, docs/vllm.md §9.5)
        self.pcp, self.backend, self.sedp = pcp, backend, sedp
        self.encoder, self.lm_only = encoder, lm_only
        self.moe = moe  # the unquantized MoE backend vLLM runs (--moe-backend, docs/vllm.md §4)
        self.dtype = dtype  # vLLM's --dtype (docs/vllm.md §2 "Dtype on load")
        self.target, self.platform, self.fmt = target, platform, fmt
        self.version, self.era, self.persistent = version, era, persistent
        self.refusal = refusal  # None, or (why vLLM refuses, a fragment the message must hold)
        self.part_size = part_size  # --part-size, or None for the default

    def name(self):
        what = "refused: " if self.refusal else ""
        parts = " --part-size %s" % self.part_size if self.part_size else ""
        if self.conf_key() != self.version:
            parts += " prefill-context-parallel-size %d all2all-backend %s" % (self.pcp,
                                                                               self.backend)
            parts += " enable-shared-expert-dp %s" % ("true" if self.sedp else "false")
            parts += " mm-encoder-tp-mode %s language-model-only %s moe-backend %s" % (
                self.encoder, "true" if self.lm_only else "false", self.moe)
            parts += " dtype %s" % self.dtype
        return "%s%s --target %s --format %s vllm-version %s --tp %d --ep %d%s" % (
            what, self.config, self.target, self.fmt, self.version, self.tp, self.ep, parts)

    def conf_key(self):
        """The conf dir of write_conf_dirs this case runs with."""
        return conf_key(self.version, self.pcp, self.backend, self.sedp, self.encoder,
                        self.lm_only, self.moe, self.dtype)

    def parallel(self, tp_rank, ep_rank):
        return vr.Parallel(self.tp, tp_rank, self.ep, ep_rank, self.pcp, self.backend,
                           self.sedp)


def conf_key(version, pcp, backend, sedp, encoder="weights", lm_only=False, moe="triton",
             dtype="auto"):
    if (pcp, backend, sedp, encoder, lm_only, moe, dtype) == DEFAULT_DEPLOYMENT:
        return version
    return "%s|%d|%s|%s|%s|%s|%s|%s" % (version, pcp, backend, sedp, encoder, lm_only, moe,
                                        dtype)


# Deployments other than the default, for the shared expert (docs/vllm.md §9.4,
# docs/vllm-ascend.md §2) and for the vision tower (docs/vllm.md §9.5): (vllm-version,
# prefill-context-parallel-size, all2all-backend, enable-shared-expert-dp,
# mm-encoder-tp-mode, language-model-only).
DEPLOYMENTS = [("latest", 2, "allgather_reducescatter", False, "weights", False),
               ("latest", 1, "flashinfer_nvlink_two_sided", False, "weights", False),
               ("latest", 1, "allgather_reducescatter", True, "weights", False)]
VISION_DEPLOYMENTS = [("latest", 1, "allgather_reducescatter", False, "data", False),
                      ("latest", 1, "allgather_reducescatter", False, "weights", True)]
# The unquantized MoE backend vLLM runs, for the kernel format (docs/vllm.md §4): the
# vllm-version, its naming era and whether its expert map is persistent, and the backend.
MOE_DEPLOYMENTS = [("latest", "D", False, "flashinfer-cutlass"),
                   ("0.24.0", "D", True, "flashinfer-cutlass")]
# vLLM's --dtype other than its default auto (docs/vllm.md §2 "Dtype on load"): the
# vllm-version, its era and expert map, and the dtype.  auto builds a float32 model in
# bfloat16; these keep it in float32, or build a bfloat16 one in float16 or float32.
DTYPE_DEPLOYMENTS = [("latest", "D", False, "float32"), ("0.18.1", "A", True, "float32"),
                     ("latest", "D", False, "float16")]


def write_conf_dirs(root):
    """One conf dir per vllm-version, and one per deployment of DEPLOYMENTS: the plugin
    sections of conf.d, with vllm-version (and the deployment's options) set."""
    dirs = {}
    settings = [(version,) + DEFAULT_DEPLOYMENT for version, _, _ in ERAS]
    settings += [d + ("triton", "auto") for d in DEPLOYMENTS + VISION_DEPLOYMENTS]
    settings += [(version,) + DEFAULT_DEPLOYMENT[:-2] + (moe, "auto")
                 for version, _, _, moe in MOE_DEPLOYMENTS + [("latest", "D", False,
                                                                "flashinfer-trtllm")]]
    settings += [(version,) + DEFAULT_DEPLOYMENT[:-1] + (dtype,)
                 for version, _, _, dtype in DTYPE_DEPLOYMENTS]
    for version, pcp, backend, sedp, encoder, lm_only, moe, dtype in settings:
        key = conf_key(version, pcp, backend, sedp, encoder, lm_only, moe, dtype)
        d = os.path.join(root, "conf-%d" % len(dirs))
        os.mkdir(d)
        for name in PLUGIN_CONFS:
            with open(os.path.join(CONF_DIR, name)) as f:
                text = f.read()
            if name == "20-vllm.conf":
                text, n = re.subn(r'(?m)^(\s*)vllm-version\s*=\s*"[^"]*"',
                                  r'\1vllm-version = "%s"' % version, text)
                if n != 1:
                    raise SystemExit("Bail out! %s: expected one vllm-version setting, found %d"
                                     % (name, n))
                text, n = re.subn(r'(?m)^(\s*)prefill-context-parallel-size\s*=\s*\d+',
                                  r'\1prefill-context-parallel-size = %d' % pcp, text)
                text, m = re.subn(r'(?m)^(\s*)all2all-backend\s*=\s*"[^"]*"',
                                  r'\1all2all-backend = "%s"' % backend, text)
                text, k = re.subn(r'(?m)^(\s*)enable-shared-expert-dp\s*=\s*\w+',
                                  r'\1enable-shared-expert-dp = %s'
                                  % ("true" if sedp else "false"), text)
                text, e = re.subn(r'(?m)^(\s*)mm-encoder-tp-mode\s*=\s*"[^"]*"',
                                  r'\1mm-encoder-tp-mode = "%s"' % encoder, text)
                text, b = re.subn(r'(?m)^(\s*)moe-backend\s*=\s*"[^"]*"',
                                  r'\1moe-backend = "%s"' % moe, text)
                text, t = re.subn(r'(?m)^(\s*)dtype\s*=\s*"[^"]*"',
                                  r'\1dtype = "%s"' % dtype, text)
                if (n, m, k, e, b, t) != (1, 1, 1, 1, 1, 1):
                    raise SystemExit("Bail out! %s: expected one prefill-context-parallel-size, "
                                     "one all2all-backend, one enable-shared-expert-dp, one "
                                     "mm-encoder-tp-mode, one moe-backend and one dtype setting"
                                     % name)
            if name == "31-qwen3_5_moe.conf":
                text, n = re.subn(r'(?m)^(\s*)language-model-only\s*=\s*\w+',
                                  r'\1language-model-only = %s'
                                  % ("true" if lm_only else "false"), text)
                if n != 1:
                    raise SystemExit("Bail out! %s: expected one language-model-only setting"
                                     % name)
            with open(os.path.join(d, name), "w") as f:
                f.write(text)
        dirs[key] = d
    return dirs


def wsync(conf_dir, *args):
    cmd = [BINARY, "--conf-dir", conf_dir, "--plugin-dir", PLUGIN_DIR] + list(args)
    env = dict(os.environ, WSYNC_PLUGIN_PATH="")
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                          universal_newlines=True)


def vllm_refusal(cfg, tp, ep, platform="cuda"):
    """Why vLLM (or vLLM-Ascend) would refuse to start at these sizes (its divide()
    asserts, or a model class raises, while building the model), or None.  EP rank 0 is
    one of the ranks every refusal reaches (docs/vllm-ascend.md §2: the ranks below the
    remainder)."""
    try:
        vr.build_model(cfg, vr.Parallel(tp, 0, ep, 0), "D", platform)
    except vr.VllmRefuses as e:
        return str(e)
    return None


def refusal_cases(config, cfg, tp, ep):
    """The refusals of one (tp, ep), one case per target that refuses, and whether vLLM
    itself refuses (then no target writes anything).  wsync's one line must name the
    size that does not fit: tp where vLLM refuses, ep where only vLLM-Ascend does."""
    cases = []
    cuda = vllm_refusal(cfg, tp, ep)
    for target, platform in TARGETS:
        why = cuda or vllm_refusal(cfg, tp, ep, platform)
        if why:
            fmt = "sharded-state" if ep <= tp else "kernel"
            fragment = "tp %d" % tp if cuda else "ep %d" % ep
            cases.append(Case(config, tp, ep, target, platform, fmt, "latest", "D", False,
                              (why, fragment)))
    return cases, cuda is not None


def plan_cases(configs):
    cases = []
    for config in CONFIGS:
        cfg = configs[config]
        for tp in TP_SIZES_OF.get(config, TP_SIZES):
            refused, _ = refusal_cases(config, cfg, tp, 1)
            if refused:
                cases += refused
                continue
            eps = [1, tp] if cfg.moe and tp > 1 else [1]
            eps += [ep for ep in EXTRA_EPS.get(config, []) if ep not in eps and ep % tp == 0]
            for ep in eps:
                refused, everywhere = refusal_cases(config, cfg, tp, ep)
                cases += refused
                if everywhere:
                    continue
                refused_targets = {c.target for c in refused}
                for version, era, persistent in ERAS:
                    for target, platform in TARGETS:
                        if target in refused_targets:
                            continue
                        for fmt in FORMATS:
                            if fmt == "sharded-state" and ep > tp:
                                continue  # named by TP rank only (docs/vllm.md §6)
                            cases.append(Case(config, tp, ep, target, platform, fmt, version,
                                              era, persistent))
        if cfg.moe:
            # sharded_state files are named by TP rank only: ep > tp cannot be expressed
            # (docs/vllm.md §6, "DP + EP"); wsync must say to use --format kernel.
            for target, platform in TARGETS:
                cases.append(Case(config, 1, 2, target, platform, "sharded-state", "latest",
                                  "D", False, ("ep > tp in sharded_state", "--format kernel")))
    # One worker per EP rank with ep = 2*tp, i.e. data parallelism (docs/vllm.md §4, §7).
    for version, era, persistent in ERAS:
        for target, platform in TARGETS:
            cases.append(Case("tiny-qwen3-moe", 2, 4, target, platform, "kernel", version, era,
                              persistent))
    for target, platform in TARGETS:
        cases.append(Case("tiny-qwen3.5-moe", 1, 2, target, platform, "kernel", "latest", "D",
                          False))
    # ep = 2*tp with tp > 1 on a model with a shared expert: sequence-parallel MoE, the
    # shared expert full on every worker on vLLM (docs/vllm.md §9.4), TP-sliced on
    # vLLM-Ascend, which replicates it only with enable_shared_expert_dp
    # (docs/vllm-ascend.md §2).
    for version, era, persistent in (ERAS[0], ERAS[-1]):
        for target, platform in TARGETS:
            cases.append(Case("tiny-qwen3.5-moe", 2, 4, target, platform, "kernel", version,
                              era, persistent))
    # The same with one data-parallel replica (prefill-context-parallel-size 2), and with
    # a backend outside the list: the shared expert TP-sliced (docs/vllm.md §9.4); with
    # enable-shared-expert-dp whole on both (vllm ignores it; docs/vllm-ascend.md §2).
    for version, pcp, backend, sedp, _, _ in DEPLOYMENTS:
        for target, platform in TARGETS:
            cases.append(Case("tiny-qwen3.5-moe", 2, 4, target, platform, "kernel", version,
                              "D", False, pcp=pcp, backend=backend, sedp=sedp))
    # The vision tower with --mm-encoder-tp-mode data (whole on every rank, vLLM and
    # vLLM-Ascend alike) and without a tower (language-model-only: no visual.*), the
    # MoE model with EP too (docs/vllm.md §9.5).
    for version, pcp, backend, sedp, encoder, lm_only in VISION_DEPLOYMENTS:
        for config, tp, ep in (("tiny-qwen3.5", 2, 1), ("tiny-qwen3.5", 4, 1),
                               ("tiny-qwen3.5-moe", 2, 2)):
            for target, platform in TARGETS:
                for fmt in FORMATS:
                    cases.append(Case(config, tp, ep, target, platform, fmt, version, "D",
                                      False, encoder=encoder, lm_only=lm_only))
    # vLLM started with --moe-backend flashinfer_cutlass: the kernel format holds the
    # experts as that backend's process_weights_after_loading leaves them, TP-sliced,
    # with EP, and with ep = 2*tp; the sharded-state format and vLLM-Ascend (its own MoE
    # kernels) the layouts they hold without it (docs/vllm.md §4).
    for version, era, persistent, moe in MOE_DEPLOYMENTS:
        for config, tp, ep in (("tiny-qwen3-moe", 2, 1), ("tiny-qwen3-moe", 2, 2),
                               ("tiny-qwen3.5-moe", 2, 4)):
            for target, platform in TARGETS:
                for fmt in FORMATS:
                    if fmt == "sharded-state" and ep > tp:
                        continue
                    cases.append(Case(config, tp, ep, target, platform, fmt, version, era,
                                      persistent, moe=moe))
    # vLLM started with --dtype other than auto: a float32 model kept in float32 (a dense
    # and a MoE model, with EP in an era with the expert map), a bfloat16 one built in
    # float16 (docs/vllm.md §2 "Dtype on load").
    for version, era, persistent, dtype in DTYPE_DEPLOYMENTS:
        configs_of = (["tiny-qwen3-moe"] if dtype == "float16"
                      else ["tiny-qwen3-moe-odd-f32", "tiny-qwen3-tied-headdim"])
        for config in configs_of:
            for tp, ep in ((2, 1), (2, 2)) if configs[config].moe else ((2, 1), (4, 1)):
                for target, platform in TARGETS:
                    for fmt in FORMATS:
                        cases.append(Case(config, tp, ep, target, platform, fmt, version, era,
                                          persistent, dtype=dtype))
    # FlashInfer TRTLLM's block layout is not written: the vllm kernel format refuses it
    # and names the --moe-backend a deployment can run instead (docs/vllm.md §4).
    cases.append(Case("tiny-qwen3-moe", 2, 1, "vllm", "cuda", "kernel", "latest", "D", False,
                      ("FlashInfer TRTLLM block layout", "--moe-backend triton"),
                      moe="flashinfer-trtllm"))
    # vLLM-Ascend with enable_shared_expert_dp and one data-parallel replica (tp 2, ep 2,
    # where vLLM's rule does not hold): whole, in both formats (docs/vllm-ascend.md §2).
    for fmt in FORMATS:
        cases.append(Case("tiny-qwen3.5-moe", 2, 2, "vllm-ascend", "ascend", fmt, "latest", "D",
                          False, sedp=True))
    # Several files per rank, as every rank of a real model has at the default 5G: the
    # loaders glob a rank's parts and read them in turn (docs/vllm.md §6, §7).
    for config, tp, ep in (("tiny-qwen3-moe", 2, 2), ("tiny-qwen3.5-moe", 2, 1)):
        for target, platform in TARGETS:
            for fmt in FORMATS:
                cases.append(Case(config, tp, ep, target, platform, fmt, "latest", "D", False,
                                  part_size=SMALL_PART))
    return cases


def run_case(case, work, synth_dirs, conf_dirs, serial):
    dst = os.path.join(work, "out-%s" % serial)
    r = wsync(conf_dirs[case.conf_key()], "convert", synth_dirs[case.config], dst,
              "--target", case.target, "--format", case.fmt, "--tp", str(case.tp),
              "--ep", str(case.ep), "--threads", "1", "-q",
              *(["--part-size", case.part_size] if case.part_size else []))
    return r, dst


def check_refusal(case, result, dst):
    why, fragment = case.refusal
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    problems = []
    if result.returncode != 2:
        problems.append("exit status %d, want 2: vLLM refuses (%s)" % (result.returncode, why))
    if len(lines) != 1:
        problems.append("%d lines on stderr, want one: %r" % (len(lines), result.stderr[:300]))
    elif fragment not in lines[0]:
        problems.append("the message does not name %r: %s" % (fragment, lines[0]))
    if os.path.exists(dst):
        problems.append("%s exists after a refusal" % os.path.basename(dst))
    return problems


def rank_files(dst, fmt, ranks):
    """Safetensors files in @dst that the consumer of @fmt never reads."""
    prefix = "model-rank-" if fmt == "sharded-state" else "kernel-rank-"
    stray = []
    for name in sorted(os.listdir(dst)):
        if not name.endswith(".safetensors"):
            continue
        m = re.match(r"^%s(\d+)-part-\d+\.safetensors$" % prefix, name)
        if not m or int(m.group(1)) >= ranks:
            stray.append("%s: a file the %s consumer never reads (docs/vllm.md §6, §7: one "
                         "file set per %s)"
                         % (name, fmt, "TP rank" if fmt == "sharded-state" else "worker"))
    return stray


def parts_problems(case, dst):
    """With a small --part-size, every rank must have several parts (else the case
    would prove nothing about reading a rank's parts in turn)."""
    if not case.part_size:
        return []
    counts = {}
    for name in os.listdir(dst):
        m = re.match(r"^(model|kernel)-rank-(\d+)-part-\d+\.safetensors$", name)
        if m:
            counts[int(m.group(2))] = counts.get(int(m.group(2)), 0) + 1
    return ["rank %d has %d file(s) at --part-size %s, want several" % (r, n, case.part_size)
            for r, n in sorted(counts.items()) if n < 2] or \
        ([] if counts else ["no rank files at --part-size %s" % case.part_size])


def value_problems(fname, key, tensor, want):
    diff = vr.first_difference(tensor.tobytes(), want, tensor.shape, tensor.dtype)
    if diff is None:
        return []
    index, got, exp = diff
    return ["%s: %s: element %s is 0x%x, vLLM's loaders put 0x%x there (%s)"
            % (fname, key, index, got, exp, getattr(tensor, "rule", None)
               or "docs/vllm.md §2-§4, §8-§10")]


def check_sharded_state(case, cfg, checkpoint, dst):
    problems = rank_files(dst, case.fmt, case.tp)
    for r in range(case.tp):
        # The file set of TP rank r; with ep == tp the EP rank equals it (docs/vllm.md §6, §4).
        par = case.parallel(r, r if case.ep > 1 else 0)
        model = vr.build_model(cfg.served_as(case.dtype), par, case.era, case.platform,
                               case.persistent, case.version in ASCEND_UNWRAPPED, case.encoder,
                               case.lm_only)
        vr.load_checkpoint(model, checkpoint)
        state = vr.filter_subtensors(model.state_dict())
        want = {k: t.tobytes() for k, t in state.items()}
        for t in state.values():
            t.scramble_()
        load = vr.ShardedStateLoad(model)
        failed = True
        try:
            load.run(dst, r, dict(state))
            failed = False
        except KeyError as e:
            problems.append("%s: %s: KeyError %s: not a key of the filtered state_dict (an "
                            "extra tensor or an alias that lost, docs/vllm.md §5, §6)"
                            % (load.current[0], load.current[1], e))
        except (RuntimeError, IndexError) as e:
            problems.append("%s: %s: copy_ raises %s: %s (larger than the parameter, "
                            "docs/vllm.md §6)"
                            % (load.current[0], load.current[1], type(e).__name__, e))
        except ValueError as e:
            where = load.current[0] or "model-rank-%d" % r
            problems.append("%s: %s (docs/vllm.md §6)"
                            % (where + (": " + load.current[1] if load.current[1] else ""), e))
        problems += ["%s: %s: %s" % item for item in load.silent]
        if failed:
            continue
        for key, t in state.items():
            problems += value_problems(load.source.get(key, "?"), key, t, want[key])
    return problems


def check_kernel(case, cfg, checkpoint, dst):
    world = case.ep if case.ep > 1 else case.tp  # one file set per worker (docs/vllm.md §4, §7)
    problems = rank_files(dst, case.fmt, world)
    for r in range(world):
        # Worker r: TP rank r % tp; with EP its EP rank is dp_rank * tp + tp_rank = r
        # (docs/vllm.md §4).
        par = case.parallel(r % case.tp, r if case.ep > 1 else 0)
        model = vr.build_model(cfg.served_as(case.dtype), par, case.era, case.platform,
                               case.persistent, case.version in ASCEND_UNWRAPPED, case.encoder,
                               case.lm_only)
        vr.load_checkpoint(model, checkpoint)
        vr.process_for_kernel(model, case.platform, case.moe)
        params = list(model.named_parameters())
        want = {id(p): p.tobytes() for _, p in params}
        for _, p in params:
            p.scramble_()
        sources = {}
        found = vr.kernel_update(model, dst, r, sources)
        problems += ["%s: %s: %s" % item for item in found]
        if found:
            continue
        for name, p in params:
            problems += value_problems(sources.get(id(p), "?"), name, p, want[id(p)])
    return problems


def check_case(case, result, dst, configs, checkpoints):
    if case.refusal:
        return check_refusal(case, result, dst)
    if result.returncode != 0:
        return ["exit status %d: %s" % (result.returncode, result.stderr.strip()[:500])]
    cfg, checkpoint = configs[case.config], checkpoints[case.config]
    try:
        problems = parts_problems(case, dst)
        if case.fmt == "sharded-state":
            return problems + check_sharded_state(case, cfg, checkpoint, dst)
        return problems + check_kernel(case, cfg, checkpoint, dst)
    except vr.ReplayError as e:
        return ["replay of vLLM's weight loaders on the checkpoint: %s" % e]
    except ValueError as e:  # a file the safetensors reader refuses
        return ["unreadable rank file: %s" % e]


# ------------------------------------------------------------------ negative controls
# A replay that cannot fail proves nothing: each control breaks one good output the way
# a converter could, and the replay must name it (and it must be new, not a problem the
# unbroken output already had).  Base: Qwen3.5-MoE on vLLM-Ascend 0.24.0, tp 2, ep 2;
# the Llama controls: the tied Llama with biases on vLLM, tp 8 (KV heads replicated).

CONTROL_BASE = ("tiny-qwen3.5-moe", 2, 2, "vllm-ascend", "ascend", "0.24.0", "D", True)
LLAMA_BASE = ("tiny-llama3-tied-bias", 8, 1, "vllm", "cuda", "latest", "D", False)
# 6 experts over ep 4 (2, 2, 1, 1), dense layers 0, 2 and 3 (docs/vllm.md §4, §8)
E6_BASE = ("tiny-qwen3-moe-e6", 4, 4, "vllm", "cuda", "latest", "D", False)
L0 = "language_model.model.layers.0."


def edit(files, suffix, change):
    """Applies change(items, index) to the rank file holding a tensor named *suffix."""
    for path in files:
        items = vr.read_safetensors(path)
        hits = [i for i, (name, _) in enumerate(items) if name.endswith(suffix)]
        if hits:
            vr.write_safetensors(path, change(items, hits[0]))
            return
    raise SystemExit("Bail out! control: no tensor *%s in %s" % (suffix, files))


def rename(suffix, new_suffix):
    def change(items, i):
        name, t = items[i]
        items[i] = (name[:len(name) - len(suffix)] + new_suffix, t)
        return items
    return lambda dst, files: edit(files, suffix, change)


def add_copy(suffix, new_name):
    return lambda dst, files: edit(files, suffix, lambda items, i: items + [(new_name, items[i][1])])


def drop(suffix):
    return lambda dst, files: edit(files, suffix, lambda items, i: items[:i] + items[i + 1:])


def replace(suffix, make):
    def change(items, i):
        items[i] = (items[i][0], make(items[i][1]))
        return items
    return lambda dst, files: edit(files, suffix, change)


def transposed(d0, d1):
    return lambda t: t.transpose(d0, d1).contiguous()


def cast(dtype):
    return lambda t: vr.Tensor.empty(t.shape, dtype).copy_(t)


def rows(delta):
    def make(t):
        out = vr.Tensor.empty((t.shape[0] + delta,) + t.shape[1:], t.dtype)
        n = min(t.shape[0], out.shape[0])
        out.narrow(0, 0, n).copy_(t.narrow(0, 0, n))
        return out
    return make


def swap_first_two(t):
    out = t.contiguous()
    out.select(0, 0).copy_(t.select(0, 1))
    out.select(0, 1).copy_(t.select(0, 0))
    return out


def counting(t):
    return vr.Tensor.from_bytes(b"".join(i.to_bytes(4, "little") for i in range(t.numel())),
                                "I32", t.shape)


def stray_file(dst, files):
    shutil.copy(files[0], os.path.join(dst, "model-rank-2-part-0.safetensors"))


def add_scalar(name):
    scalar = vr.Tensor.empty((), "F32").fill_(1.0)
    return lambda dst, files: edit(files, "", lambda items, i: items + [(name, scalar)])


CONTROLS = [
    ("sharded-state", "an alias that loses (mlp.gate for mlp.experts._gate)",
     rename("mlp.experts._gate.weight", "mlp.gate.weight"), "KeyError"),
    ("sharded-state", "an extra tensor",
     add_copy("model.norm.weight", "language_model.model.extra.weight"), "KeyError"),
    ("sharded-state", "a missing attention scale",
     drop("layers.3.self_attn.attn._k_scale"), "Missing keys"),
    ("sharded-state", "a square tensor transposed",
     replace(L0 + "linear_attn.out_proj.weight", transposed(0, 1)), "out_proj.weight: element"),
    ("sharded-state", "a dtype copy_ would cast",
     replace(L0 + "linear_attn.A_log", cast("BF16")), "dtype BF16, the parameter is F32"),
    ("sharded-state", "a tensor one row short",
     replace("embed_tokens.weight", rows(-1)), "loads into a prefix"),
    ("sharded-state", "a tensor one row long",
     replace("embed_tokens.weight", rows(1)), "copy_ raises RuntimeError"),
    ("sharded-state", "two experts swapped",
     replace(L0 + "mlp.experts.routed_experts.w13_weight", swap_first_two), "w13_weight: element"),
    ("sharded-state", "an expert map without -1",
     replace(L0 + "mlp.experts.routed_experts._expert_map", counting), "_expert_map: element"),
    ("sharded-state", "a file for a TP rank vLLM does not have", stray_file, "never reads"),
    ("kernel", "a buffer in a live update",
     add_scalar("language_model.model.layers.3.self_attn.attn._k_scale"),
     "is not an nn.Parameter"),
    ("kernel", "a second name of one parameter",
     add_copy("mlp.experts._gate.weight", L0 + "mlp.gate.weight"), "sent twice"),
    ("kernel", "an unknown name",
     rename(L0 + "linear_attn.dt_bias", L0 + "linear_attn.dt_biass"), "has no attribute"),
    ("kernel", "a parameter left out", drop(L0 + "linear_attn.dt_bias"), "parameter never sent"),
    ("kernel", "Ascend w2 in the loader layout",
     replace(L0 + "mlp.experts.routed_experts.w2_weight", transposed(1, 2)),
     "w2_weight: BF16 [4, 64, 32], the parameter is BF16 [4, 32, 64]"),
    ("kernel", "Ascend w13 in the loader layout (square: only the bytes show)",
     replace(L0 + "mlp.experts.routed_experts.w13_weight", transposed(1, 2)),
     "w13_weight: element"),
    ("sharded-state", "Llama: gate_up_proj.bias rows swapped",
     replace("model.layers.0.mlp.gate_up_proj.bias", swap_first_two),
     "gate_up_proj.bias: element", LLAMA_BASE),
    ("sharded-state", "Llama: qkv_proj.bias rows swapped",
     replace("model.layers.1.self_attn.qkv_proj.bias", swap_first_two),
     "qkv_proj.bias: element", LLAMA_BASE),
    ("sharded-state", "Llama: the tied head kept as embed_tokens (the alias that loses)",
     rename("lm_head.weight", "model.embed_tokens.weight"), "KeyError", LLAMA_BASE),
    ("kernel", "Llama: the tied head sent under both names",
     add_copy("lm_head.weight", "model.embed_tokens.weight"), "sent twice", LLAMA_BASE),
    ("sharded-state", "uneven EP: rank 1's two experts swapped",
     replace("model.layers.1.mlp.experts.routed_experts.w13_weight", swap_first_two),
     "w13_weight: element", E6_BASE),
    ("sharded-state", "a dense layer of a MoE model: gate_up_proj rows swapped",
     replace("model.layers.0.mlp.gate_up_proj.weight", swap_first_two),
     "gate_up_proj.weight: element", E6_BASE),
    ("sharded-state", "uneven EP: rank 1 given a third expert",
     replace("model.layers.1.mlp.experts.routed_experts.w2_weight", rows(1)),
     "copy_ raises RuntimeError", E6_BASE),
]


# Files written for one deployment, loaded by another: (what, the case the files are
# written by, the case that loads them, a fragment the replay must report).  The whole
# shared expert the vllm-ascend target wrote before enable-shared-expert-dp (vLLM's rule,
# docs/vllm.md §9.4) is what it writes now with the option on; vLLM-Ascend with the
# option off must refuse it, and the TP-sliced files with it on (docs/vllm-ascend.md §2).
SHARED_GATE_UP = L0 + "mlp.experts._shared_experts._layer.gate_up_proj.weight"
CROSS_CONTROLS = [
    ("a whole shared expert (vllm-ascend files of vLLM's rule) on vLLM-Ascend without "
     "enable_shared_expert_dp",
     Case("tiny-qwen3.5-moe", 2, 4, "vllm-ascend", "ascend", "kernel", "latest", "D", False,
          sedp=True),
     Case("tiny-qwen3.5-moe", 2, 4, "vllm-ascend", "ascend", "kernel", "latest", "D", False),
     SHARED_GATE_UP + ": BF16 [64, 64], the parameter is BF16 [32, 64]"),
    ("a TP-sliced shared expert on vLLM-Ascend with enable_shared_expert_dp",
     Case("tiny-qwen3.5-moe", 2, 4, "vllm-ascend", "ascend", "kernel", "latest", "D", False),
     Case("tiny-qwen3.5-moe", 2, 4, "vllm-ascend", "ascend", "kernel", "latest", "D", False,
          sedp=True),
     SHARED_GATE_UP + ": BF16 [32, 64], the parameter is BF16 [64, 64]"),
    # The vision tower of one mm_encoder_tp_mode loaded by the other (docs/vllm.md §9.5).
    ("a TP-sliced vision tower on vLLM with --mm-encoder-tp-mode data",
     Case("tiny-qwen3.5", 2, 1, "vllm", "cuda", "kernel", "latest", "D", False),
     Case("tiny-qwen3.5", 2, 1, "vllm", "cuda", "kernel", "latest", "D", False,
          encoder="data"),
     "visual.blocks.0.attn.qkv.weight: BF16 [48, 32], the parameter is BF16 [96, 32]"),
    ("a whole vision tower on vLLM-Ascend in the default mm_encoder_tp_mode",
     Case("tiny-qwen3.5", 2, 1, "vllm-ascend", "ascend", "sharded-state", "latest", "D",
          False, encoder="data"),
     Case("tiny-qwen3.5", 2, 1, "vllm-ascend", "ascend", "sharded-state", "latest", "D",
          False),
     "visual.blocks.0.attn.proj.weight: copy_ raises"),
    ("a vision tower on vLLM with --language-model-only",
     Case("tiny-qwen3.5", 2, 1, "vllm", "cuda", "sharded-state", "latest", "D", False),
     Case("tiny-qwen3.5", 2, 1, "vllm", "cuda", "sharded-state", "latest", "D", False,
          lm_only=True),
     "KeyError 'visual."),
]


# A colocated vLLM-Ascend: weights put to sleep and woken before the kernel-format copy
# (docs/vllm-ascend.md §5 "Sleep / wake-up").  The releases for vLLM 0.17 to 0.26.x
# transpose the routed experts back to views in the loader shape in wake_up: the copy
# must fail on each expert parameter whose shape that changed, and accepts silently (the
# bytes land transposed in the storage) one that is square, H == 2I/tp (tiny-qwen3.5-moe
# with EP); put back before the copy, the processed parameters load bit for bit.  From
# 0.27.1 on wake_up changes nothing.  (config, tp, ep, vllm-version, era, expert map
# persistent)
ASCEND_WAKE_UP_TRANSPOSES = {"0.18.1", "0.20.0", "0.22.0", "0.24.0"}
WAKE_UP_CASES = [("tiny-qwen3-moe", 2, 1, "0.24.0", "D", True),
                 ("tiny-qwen3.5-moe", 2, 2, "0.18.1", "A", True),
                 ("tiny-qwen3-moe", 2, 2, "latest", "D", False)]


def woken_model(case, cfg, checkpoint, par):
    """The model of one worker as a kernel-format update finds it after a sleep and a
    wake_up of its weights (scrambled: the copy must bring every byte), and the bytes
    and shapes each parameter must end with."""
    model = vr.build_model(cfg, par, case.era, case.platform, case.persistent,
                           case.version in ASCEND_UNWRAPPED)
    vr.load_checkpoint(model, checkpoint)
    vr.process_for_kernel(model, case.platform)
    want = {name: (p.tobytes(), p.shape) for name, p in model.named_parameters()}
    for _, p in model.named_parameters():
        p.scramble_()
    if case.version in ASCEND_WAKE_UP_TRANSPOSES:
        vr.ascend_wake_up(model, cfg.hidden)
    return model, want


def wake_up_problems(case, cfg, checkpoint, dst):
    """The kernel-format update of every worker after a sleep and wake_up of the weights
    on case.version's vLLM-Ascend, as WAKE_UP_CASES says it must go."""
    world = case.ep if case.ep > 1 else case.tp
    problems = []
    for r in range(world):
        par = case.parallel(r % case.tp, r if case.ep > 1 else 0)
        if case.version in ASCEND_WAKE_UP_TRANSPOSES:
            # copied into the woken parameters as they are
            model, want = woken_model(case, cfg, checkpoint, par)
            woken = dict(model.named_parameters())
            experts = {n for n in want if n.endswith(("w13_weight", "w2_weight"))}
            moved = {n for n in experts if woken[n].shape != want[n][1]}
            square = experts - moved
            found = vr.kernel_update(model, dst, r)
            failed = {name for _, name, msg in found if "copy_ raises RuntimeError" in msg}
            if not moved or failed != moved or len(found) != len(moved):
                problems.append("worker %d after wake_up on vLLM-Ascend %s: the copy must "
                                "fail on the %d expert parameters wake_up reshaped exactly; "
                                "it reported: %s"
                                % (r, case.version, len(moved), found[:3] or "nothing"))
            problems += ["worker %d: %s accepted into the woken view, but its storage does "
                         "not hold the processed layout" % (r, n)
                         for n in square if woken[n].is_contiguous()]
            # the remedy: the processed parameters put back first
            model, want = woken_model(case, cfg, checkpoint, par)
            vr.ascend_restore_processed(model)
        else:
            model, want = woken_model(case, cfg, checkpoint, par)
        found = vr.kernel_update(model, dst, r)
        problems += ["worker %d: %s: %s: %s" % ((r,) + item) for item in found]
        if found:
            continue
        for name, p in model.named_parameters():
            problems += value_problems("kernel-rank-%d" % r, name, p, want[name][0])
    return problems


def run_wake_up_checks(work, synth_dirs, conf_dirs, configs, checkpoints):
    """Runs WAKE_UP_CASES; yields (ok, name, diagnostics)."""
    for serial, (config, tp, ep, version, era, persistent) in enumerate(WAKE_UP_CASES):
        case = Case(config, tp, ep, "vllm-ascend", "ascend", "kernel", version, era, persistent)
        result, dst = run_case(case, work, synth_dirs, conf_dirs, "wake-%d" % serial)
        if result.returncode != 0:
            problems = ["exit status %d: %s" % (result.returncode, result.stderr.strip()[:300])]
        else:
            problems = wake_up_problems(case, configs[config], checkpoints[config], dst)
        shutil.rmtree(dst, ignore_errors=True)
        what = ("the copy fails on the experts, and loads once they are put back"
                if version in ASCEND_WAKE_UP_TRANSPOSES else "wake_up changes nothing")
        yield not problems, "colocated: %s, weights woken: %s" % (case.name(), what), \
            problems[:MAX_DIAGNOSTICS]


def run_cross_controls(work, synth_dirs, conf_dirs, configs, checkpoints):
    """Runs CROSS_CONTROLS; yields (ok, name, diagnostics)."""
    for serial, (what, written, loaded, fragment) in enumerate(CROSS_CONTROLS):
        result, dst = run_case(written, work, synth_dirs, conf_dirs, "cross-%d" % serial)
        if result.returncode != 0:
            yield False, "control: %s" % what, ["exit status %d: %s" % (
                result.returncode, result.stderr.strip()[:300])]
            continue
        problems = check_case(loaded, result, dst, configs, checkpoints)
        shutil.rmtree(dst, ignore_errors=True)
        caught = any(fragment in p for p in problems)
        diag = [] if caught else ["the replay did not report %r; it reported: %s"
                                  % (fragment, problems[:3] or "nothing")]
        yield caught, "control: %s is caught (%s)" % (what, fragment), diag


def run_controls(work, synth_dirs, conf_dirs, configs, checkpoints):
    """Runs CONTROLS (each on CONTROL_BASE unless it names its own); yields (ok, name,
    diagnostics)."""
    bases = {}
    for fmt, _, _, _, *own in CONTROLS:
        base = own[0] if own else CONTROL_BASE
        if (base, fmt) in bases:
            continue
        config, tp, ep, target, platform, version, era, persistent = base
        case = Case(config, tp, ep, target, platform, fmt, version, era, persistent)
        result, dst = run_case(case, work, synth_dirs, conf_dirs,
                               "control-%d-%s" % (len(bases), fmt))
        bases[base, fmt] = (case, dst, set(check_case(case, result, dst, configs, checkpoints)))
    for serial, (fmt, what, mutate, fragment, *own) in enumerate(CONTROLS):
        case, base_dst, base_problems = bases[own[0] if own else CONTROL_BASE, fmt]
        dst = os.path.join(work, "mutant-%d" % serial)
        shutil.copytree(base_dst, dst)
        prefix = "model-rank-1-" if fmt == "sharded-state" else "kernel-rank-1-"
        files = sorted(os.path.join(dst, n) for n in os.listdir(dst) if n.startswith(prefix))
        mutate(dst, files)
        ok = subprocess.CompletedProcess([], 0, "", "")
        problems = check_case(case, ok, dst, configs, checkpoints)
        shutil.rmtree(dst, ignore_errors=True)
        new = [p for p in problems if p not in base_problems]
        caught = any(fragment in p for p in new)
        diag = [] if caught else ["the replay did not report %r; it reported: %s"
                                  % (fragment, new[:3] or "nothing new")]
        yield caught, "control: %s %s is caught (%s)" % (case.name(), what, fragment), diag
    for _, dst, _ in bases.values():
        shutil.rmtree(dst, ignore_errors=True)


def add_rope_buffers(directory, cfg):
    """Adds the RoPE buffers older checkpoints carry (a rotary_emb.inv_freq per attention
    layer, cos_cached and sin_cached in the first one, the vision tower's
    rotary_pos_emb.inv_freq) in a shard of their own, listed in the index: vLLM skips
    them (docs/vllm.md §8 "Skipped checkpoint names"), so must wsync."""
    def f32(values):
        return vr.Tensor.from_bytes(vr.array.array("f", values).tobytes(), "F32", (len(values),))

    prefix = "model.language_model." if cfg.family == "qwen3_5" else "model."
    half = cfg.head_dim // 2
    items = []
    for i in range(cfg.layers):
        if cfg.family == "qwen3_5" and cfg.layer_types[i] != "full_attention":
            continue
        rope = "%slayers.%d.self_attn.rotary_emb." % (prefix, i)
        items.append((rope + "inv_freq", f32([1.0 / (k + 1) for k in range(half)])))
        if len(items) == 1:
            items += [(rope + "cos_cached", f32([0.5] * cfg.head_dim)),
                      (rope + "sin_cached", f32([0.25] * cfg.head_dim))]
    if cfg.vision is not None:
        width = cfg.vision["hidden_size"] // cfg.vision["num_heads"] // 4
        items.append(("model.visual.rotary_pos_emb.inv_freq", f32([1.0] * width)))
    vr.write_safetensors(os.path.join(directory, "model-rope.safetensors"), items)
    index = os.path.join(directory, "model.safetensors.index.json")
    if not os.path.exists(index):
        return  # every *.safetensors counts (docs/safetensors.md §2)
    with open(index) as f:
        table = json.load(f)
    table["weight_map"].update((name, "model-rope.safetensors") for name, _ in items)
    with open(index, "w") as f:
        json.dump(table, f)


def read_checkpoint(directory):
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):  # shards only through weight_map (docs/safetensors.md §2)
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = sorted(n for n in os.listdir(directory) if n.endswith(".safetensors"))
    tensors = {}
    for name in files:
        tensors.update(vr.read_safetensors(os.path.join(directory, name)))
    return tensors


def scratch_root():
    # A tmpfs when there is one: hundreds of small conversions.
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return tempfile.mkdtemp(prefix="wsync-replay-", dir=shm)
    return tempfile.mkdtemp(prefix="wsync-replay-")


def main(argv):
    for arg in argv[1:]:
        if arg not in ("--tap", "-k"):
            print("usage: %s [--tap] [-k]" % argv[0], file=sys.stderr)
            return 2
    work = scratch_root()
    try:
        conf_dirs = write_conf_dirs(work)
        configs, checkpoints, synth_dirs = {}, {}, {}
        for config in CONFIGS:
            path = config_path(config)
            with open(path) as f:
                configs[config] = vr.ModelConfig(json.load(f))
            synth_dirs[config] = os.path.join(work, "hf-" + config)
            r = wsync(conf_dirs["latest"], "synth", "--config", path, "--pattern", "index",
                      synth_dirs[config], "-q")
            if r.returncode != 0:
                print("Bail out! wsync synth --config %s: exit %d: %s"
                      % (path, r.returncode, r.stderr.strip()))
                return 1
            add_rope_buffers(synth_dirs[config], configs[config])
            checkpoints[config] = read_checkpoint(synth_dirs[config])
        cases = plan_cases(configs)
        print("1..%d" % (len(cases) + len(CONTROLS) + len(CROSS_CONTROLS)
                         + len(WAKE_UP_CASES)))
        sys.stdout.flush()
        failures = 0
        # One conversion runs ahead in a thread while this one checks the previous
        # output: two processes busy at most.
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            window = []
            submitted = 0
            for number in range(1, len(cases) + 1):
                while submitted < len(cases) and len(window) < 2:
                    window.append(pool.submit(run_case, cases[submitted], work, synth_dirs,
                                              conf_dirs, submitted))
                    submitted += 1
                result, dst = window.pop(0).result()
                case = cases[number - 1]
                problems = check_case(case, result, dst, configs, checkpoints)
                shutil.rmtree(dst, ignore_errors=True)
                if problems:
                    failures += 1
                    print("not ok %d - %s" % (number, case.name()))
                    for p in problems[:MAX_DIAGNOSTICS]:
                        print("# " + p)
                    if len(problems) > MAX_DIAGNOSTICS:
                        print("# ... and %d more" % (len(problems) - MAX_DIAGNOSTICS))
                else:
                    print("ok %d - %s" % (number, case.name()))
                sys.stdout.flush()
        number = len(cases)
        controls = itertools.chain(
            run_controls(work, synth_dirs, conf_dirs, configs, checkpoints),
            run_cross_controls(work, synth_dirs, conf_dirs, configs, checkpoints),
            run_wake_up_checks(work, synth_dirs, conf_dirs, configs, checkpoints))
        for caught, name, diag in controls:
            number += 1
            print("%s %d - %s" % ("ok" if caught else "not ok", number, name))
            for line in diag:
                print("# " + line)
            failures += 0 if caught else 1
        return 1 if failures else 0
    finally:
        if not os.environ.get("WSYNC_TEST_KEEP"):
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
