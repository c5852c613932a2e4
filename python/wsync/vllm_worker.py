"""A vLLM worker extension that loads wsync rank files into the running model.

Start vLLM with it:
    vllm serve MODEL --tensor-parallel-size 4 \\
        --worker-extension-cls wsync.vllm_worker.WsyncWorkerExtension
(or LLM(..., worker_extension_cls="wsync.vllm_worker.WsyncWorkerExtension")).  After the
trainer's wsync.Session has committed a step into DIR (target vllm or vllm-ascend,
format "kernel", the engine's tp and ep), every worker loads its own rank:
    llm.collective_rpc("wsync_load", args=(DIR,))
or, on a server started with VLLM_SERVER_DEV_MODE=1, POST /collective_rpc with
{"method": "wsync_load", "args": [DIR]}.  Each worker copies, in place, the kernel-layout
tensors of its rank file into the parameters (model.get_parameter(name).copy_(w), the
copy vLLM's own kernel-format update does, docs/vllm.md section 7): parameter addresses,
and so CUDA graphs, stay valid.  Before copying anything it checks the files (the kernel
format, every name a parameter of the right dtype and shape) and the engine (each MoE
layer's backend, no expert load balancing, no reload in progress, on vLLM-Ascend the
weight NZ mode 0 that its own weight updates require).

On vLLM-Ascend for vLLM 0.17 to 0.26.x, whose wake_up leaves the routed experts as
transposed views in the loader shape, it puts the processed parameters back first
(docs/vllm-ascend.md section 5).  Never run process_weights_after_loading after a
kernel-format update: the experts would be transposed a second time.

Call it while no request runs, outside start_weight_update / finish_weight_update, and
drop what the engine computed with the old weights: POST /pause (which clears the prefix
and encoder caches) before and POST /resume after, or llm.reset_prefix_cache() (and for
a model with a vision tower llm.llm_engine.reset_encoder_cache()) after
(docs/vllm.md section 7).

vLLM is not installed where wsync is tested: tests/test-python.py runs this module with
fake vllm parallel-state modules and fake module trees, replaying the rules cited here.
"""

import logging
import os as _os
import re

import _wsync
from wsync import Error, _bad_input, _flag, _is_torch_tensor, _load_opened, _shape_text

_log = logging.getLogger(__name__)


def rank_file_index(tp_rank, tp_size, expert_parallel=False, dp_rank=0, pcp_rank=0, pcp_size=1):
    """The rank of the wsync files a vLLM worker loads (docs/vllm.md sections 4 and 7).

    With expert parallelism the EP rank, vLLM's flattened rank
    dp_rank*pcp*tp + pcp_rank*tp + tp_rank (files of `--format kernel --ep dp*pcp*tp`);
    else the TP rank (every data-parallel replica loads the same files, which fit only
    where the replicas hold the same shapes: see replica_shape_hint)."""
    if expert_parallel:
        return dp_rank * pcp_size * tp_size + pcp_rank * tp_size + tp_rank
    return tp_rank


# How load_rank refuses a tensor of the wrong size: a torch parameter's shape, a
# buffer's size ("... (N bytes), but the buffer holds M bytes") or shape
# (wsync/__init__.py _check_torch, python/buffer.c); not its dtype.
_SIZE_REFUSALS = (re.compile(r", but the parameter has shape \["),
                  re.compile(r", but the buffer has shape \["),
                  re.compile(r" bytes\), but the buffer holds \d+ bytes"))


# The routed experts' tensors, whatever the naming era (mlp.experts.w13_weight,
# mlp.experts.routed_experts.w2_weight, ...): not the router or the shared expert, which
# era D also keeps under mlp.experts. (docs/vllm.md section 5) and vLLM does not slice
# over the replicas.
_ROUTED_EXPERTS = re.compile(r"\.experts\.(?:routed_experts\.)?w(?:13|2)_")


def replica_shape_hint(message, tp_size, dp_size, expert_parallel, pcp_size=1):
    """message, with the likely cause added where a worker of several data-parallel (or
    prefill-context-parallel) replicas without expert parallelism finds a tensor of the
    wrong size.

    vLLM then slices every MoE layer's experts over dp*pcp*tp ranks, not tp (reference
    note vllm-layouts.md section 5: "Without EP but with DP > 1, MoE experts are
    TP-sliced over dp * tp"; FusedMoEParallelConfig.make, docs/vllm.md section 4), a
    layout no wsync target writes, while the TP-rank files a replica loads slice them
    over tp.  load_rank refuses the first such tensor before copying anything; this says
    why and what works instead."""
    flat = dp_size * pcp_size * tp_size
    if (expert_parallel or flat <= tp_size or not _ROUTED_EXPERTS.search(message)
            or not any(f.search(message) for f in _SIZE_REFUSALS)):
        return message
    return (f"{message} (vLLM without expert parallelism slices MoE experts over "
            f"dp*pcp*tp = {flat} ranks, not over the {tp_size} TP ranks the files are "
            f"written for, a layout wsync does not write: start vLLM with "
            f"--enable-expert-parallel and write the files with --ep {flat})")


def shared_expert_hint(message, tp_size, dp_size, expert_parallel, pcp_size=1,
                       all2all_backend="allgather_reducescatter", ascend_shared_expert_dp=None):
    """message, with the likely cause added where a worker with expert parallelism finds
    a shared-expert tensor (gate_up_proj, down_proj) of the wrong size.

    vLLM holds the shared expert whole when ParallelConfig.use_sequence_parallel_moe
    holds and TP-sliced otherwise (docs/vllm.md section 9.4); wsync decides it from its
    vllm options all2all-backend and prefill-context-parallel-size, which must be the
    deployment's.  This says which settings this worker runs with.

    On vLLM-Ascend (ascend_shared_expert_dp not None: its additional_config
    enable_shared_expert_dp as get_ascend_config() reads it) the rule is Ascend's own:
    whole only with that option (docs/vllm-ascend.md section 2), which wsync's option
    enable-shared-expert-dp must then match."""
    if (not expert_parallel or tp_size <= 1 or "shared_expert" not in message
            or "expert_gate" in message
            or not any(f.search(message) for f in _SIZE_REFUSALS)):
        return message
    flat = dp_size * pcp_size * tp_size
    if ascend_shared_expert_dp is not None:
        value = "true" if ascend_shared_expert_dp else "false"
        return (f"{message} (vLLM-Ascend holds the shared expert whole only with "
                f"additional_config enable_shared_expert_dp, and this worker runs with it "
                f"{'on' if ascend_shared_expert_dp else 'off'}: write the files for target "
                f"vllm-ascend with enable-shared-expert-dp = {value} in the plugin \"vllm\" "
                f"section of the configuration, and --ep {flat})")
    return (f"{message} (the files hold the shared expert whole or TP-sliced as the vllm "
            f"plugin's options all2all-backend and prefill-context-parallel-size decide, by "
            f"vLLM's use_sequence_parallel_moe: this worker runs with --all2all-backend "
            f"{all2all_backend}, --prefill-context-parallel-size {pcp_size}, data-parallel "
            f"size {dp_size} and tp {tp_size}: write the files with all2all-backend = "
            f"\"{all2all_backend}\" and prefill-context-parallel-size = {pcp_size} in the "
            f"plugin \"vllm\" section of the configuration, and --ep {flat})")


def _ascend_config():
    """vLLM-Ascend's configuration (vllm_ascend/ascend_config.py get_ascend_config()), or
    None when this is not vLLM-Ascend."""
    try:
        from vllm_ascend.ascend_config import get_ascend_config
        return get_ascend_config()
    except Exception:  # noqa: BLE001 - not vLLM-Ascend, or not initialised (RuntimeError,
        # ascend_config.py:1340-1343 @ 182b75ea84ff): a hint must never hide the error
        return None


def _ascend_shared_expert_dp():
    """vLLM-Ascend's enable_shared_expert_dp (additional_config, EP on), or None when
    this is not vLLM-Ascend."""
    config = _ascend_config()
    if config is None:
        return None
    return bool(getattr(config, "enable_shared_expert_dp", False))


def ascend_nz_mode(ascend_config):
    """vLLM-Ascend's weight NZ mode (0 off, 1 quantized weights in FRACTAL_NZ, the
    default, 2 BF16/FP16 too), read as its own worker reads it, or None when this is
    not vLLM-Ascend (ascend_config None):

      the releases for vLLM 0.20 on: get_ascend_config().weight_nz_mode, which is
        additional_config["weight_nz_mode"], else VLLM_ASCEND_ENABLE_NZ
        (vllm_ascend/ascend_config.py:240-245, 361-372 @ 182b75ea84ff), as
        _check_nz_disabled reads it (vllm_ascend/worker/worker.py:288-289);
      before (no such attribute): the variable itself, int(os.getenv(
        "VLLM_ASCEND_ENABLE_NZ", 1)) (vllm_ascend/envs.py, read by
        worker.py:208-212 and utils.py:148-153 @ e18643f8a4d5, v0.18.0)."""
    if ascend_config is None:
        return None
    # the attribute as it is, None included: additional_config {"weight_nz_mode": null}
    # is what the engine's `if not nz_mode` reads as off (utils.py:264-268), not a
    # reason to fall back to the variable
    if hasattr(ascend_config, "weight_nz_mode"):
        return ascend_config.weight_nz_mode
    text = _os.getenv("VLLM_ASCEND_ENABLE_NZ", "1")
    try:
        return int(text)
    except ValueError:  # the engine's own int() fails on it: no mode 0 either
        return text


def nz_mode_refusal(dir, rank, mode):
    """None, or why wsync_load refuses to copy into this vLLM-Ascend engine: its weight
    NZ mode is not 0.  Then maybe_trans_nz has cast weights to FRACTAL_NZ (quantized
    ones in mode 1, BF16/FP16 too in mode 2: vllm_ascend/utils.py:249-286 @
    182b75ea84ff), and wsync_load copies each parameter a piece at a time through views
    of it (wsync._copy_torch), a copy torch_npu's copy_ does not show to be right for a
    FRACTAL_NZ tensor (copy_h2d casts a staging tensor of the piece's sizes into the
    parameter's NZ storage: torch_npu/csrc/aten/common/CopyKernel.cpp @ 028285dee356;
    not run).  vLLM-Ascend refuses its own weight updates in any mode but 0 for the
    same engine (_check_nz_disabled, called by start_weight_update; wake_up:
    vllm_ascend/worker/worker.py:247-255, 288-306 @ 182b75ea84ff), and wsync_load,
    called by collective_rpc, never passes there (docs/vllm-ascend.md section 4)."""
    if not mode:
        return None
    # a mode that is no int (additional_config {"weight_nz_mode": "0"}, which the
    # engine's `if nz_mode` takes as on) is shown quoted, not as the 0 it looks like
    shown = mode if isinstance(mode, int) else repr(mode)
    return (f"{dir}: rank {rank}: this vLLM-Ascend engine runs with weight NZ mode {shown} "
            f"(FRACTAL_NZ on; its default is 1), whose parameters wsync_load does not copy "
            f"into, as vLLM-Ascend refuses its own weight updates in it: start the engine "
            f"with additional_config {{\"weight_nz_mode\": 0}} and VLLM_ASCEND_ENABLE_NZ=0, "
            f"as `wsync env --backend npu-ascend --mode colocate|server` says "
            f"(docs/vllm-ascend.md section 4)")


def expert_load_balancing(parallel_config, ascend_config=None):
    """None, or the setting by which the engine places experts by load instead of vLLM's
    linear placement, which wsync's files hold (docs/vllm.md section 4):

      vLLM: --enable-eplb (ParallelConfig.enable_eplb); EplbState.rearrange moves
        experts between the EP ranks by load at run time (vllm/distributed/eplb/
        eplb_state.py:725-731 @ df1376907b16);
      vLLM-Ascend: additional_config eplb_config dynamic_eplb, or an expert_map_path
        placement file (init_eplb_config, vllm_ascend/eplb/core/eplb_utils.py:73-92 @
        182b75ea84ff: the linear determine_expert_map only without both)."""
    if getattr(parallel_config, "enable_eplb", False):
        return "--enable-eplb, whose load balancer moves experts between ranks at run time"
    eplb = getattr(ascend_config, "eplb_config", None)
    if getattr(eplb, "dynamic_eplb", False):
        return ("vLLM-Ascend's additional_config eplb_config dynamic_eplb, which moves "
                "experts between ranks at run time")
    path = getattr(eplb, "expert_map_path", None)
    if path:
        return (f"vLLM-Ascend's additional_config eplb_config expert_map_path {path}, a "
                "placement of its own")
    return None


def check_expert_placement(files, balancing):
    """Raises wsync.Error at the first routed-expert tensor of files when balancing (what
    expert_load_balancing returned) is not None: the experts a file holds for a rank are
    then not the ones the engine keeps there."""
    if balancing is None:
        return
    for name, _, _, path in files.entries:
        if _ROUTED_EXPERTS.search(name):
            raise _bad_input(f"{path}: tensor \"{name}\": this engine places the experts by "
                             f"{balancing}, and wsync's files hold each rank's experts in "
                             f"vLLM's linear placement (docs/vllm.md section 4): start it "
                             f"without expert load balancing")


# ------------------------------------------------------------------ names through LoRA

def _base_layer(module):
    try:
        return module.get_submodule("base_layer")
    except AttributeError:
        return None


def lora_submodule(model, path):
    """model.get_submodule(path), through vLLM's LoRA wrappers: with --enable-lora vLLM
    replaces a layer by a BaseLayerWithLoRA that holds it as base_layer (vllm/lora/layers/
    base.py), so a dense layer's parameters move under `...qkv_proj.base_layer.`, and a
    MoE block's under `...mlp.experts.base_layer.` (FusedMoEWithLoRA wraps the MoERunner,
    vllm/lora/layers/fused_moe.py:29-38 @ df1376907b16)."""
    module = model
    for part in path.split(".") if path else []:
        try:
            module = module.get_submodule(part)
        except AttributeError:
            base = _base_layer(module)
            if base is None:
                raise
            module = base.get_submodule(part)
    return module


def lora_parameter_owner(model, name):
    """(module, leaf): the module holding the parameter name resolves to through vLLM's
    LoRA wrappers (lora_submodule), and the parameter's name on it; AttributeError as
    get_parameter raises it when there is none."""
    path, _, leaf = name.rpartition(".")
    module = lora_submodule(model, path)
    try:
        module.get_parameter(leaf)
        return module, leaf
    except AttributeError:
        base = _base_layer(module)
        if base is None:
            raise
        base.get_parameter(leaf)
        return base, leaf


def lora_parameter(model, name):
    """model.get_parameter(name), through vLLM's LoRA wrappers (lora_submodule).  vLLM's
    own kernel-format reload resolves names so since #39935 (_get_parameter_for_reload,
    vllm/v1/worker/gpu_model_runner.py:260-266 @ df1376907b16; it unwraps only the layer
    holding the parameter, so not a wrapped MoE block's routed_experts)."""
    module, leaf = lora_parameter_owner(model, name)
    return module.get_parameter(leaf)


# ------------------------------------------------------------------ checks before copying

# What a live update copies (docs/vllm.md section 7): the kernel format of a vLLM target,
# parameters only, in the layout the kernels run on.  The sharded-state format holds the
# loader layout and persistent buffers (attention scales, with EP the expert map), which
# vLLM loads at engine start and then re-lays; copied into a running engine it is wrong
# without a word wherever the shapes agree (FlashInfer CUTLASS's swapped w13 halves,
# vLLM-Ascend's transposed experts when H == 2I/tp, fp8 KV-cache scales reset to 1.0).
_LIVE_TARGETS = ("vllm", "vllm-ascend")


def file_refusal(path, metadata):
    """None, or why a live update must not copy the rank file at path, from its
    __metadata__ (wsync.target and wsync.format, which wsync records in every rank file;
    plugins/vllm.c set_metadata)."""
    target, fmt = metadata.get("wsync.target"), metadata.get("wsync.format")
    if target in _LIVE_TARGETS and fmt == "kernel":
        return None
    if target in _LIVE_TARGETS:
        return (f"{path}: the file is in the {fmt} format of target {target}, for vLLM's "
                f"engine start (--load-format sharded_state: the loader layout, with buffers); "
                f"a live update copies the kernel format (parameters only, in the layout the "
                f"kernels run on; docs/vllm.md section 7): write the files with format "
                f"\"kernel\"")
    return (f"{path}: the file is of target {target or '(none recorded)'}: a live update "
            f"copies the kernel format of target vllm or vllm-ascend (docs/vllm.md section 7)")


# How vLLM's unquantized MoE backends (UnquantizedMoeBackend, the `unquantized_backend`
# of the layer's UnquantizedFusedMoEMethod since vLLM #31827) lay the routed experts out,
# as the vllm plugin's option moe-backend names the layouts it writes (docs/vllm.md
# section 4): Triton and batched Triton run the loader layout, FlashInfer CUTLASS swaps
# each expert's w13 halves, TRTLLM re-lays both tensors into blocks (wsync refuses to
# write it).  The others (ROCm AITER shuffles, XPU transposes, CPU prepacks, TPU and
# out-of-tree platforms run their own) have no moe-backend.
_VLLM_BACKENDS = {"TRITON": "triton", "BATCHED_TRITON": "triton",
                  "FLASHINFER_CUTLASS": "flashinfer-cutlass",
                  "FLASHINFER_TRTLLM": "flashinfer-trtllm"}
_WRITTEN_BACKENDS = ("triton", "flashinfer-cutlass")
ASCEND_LAYOUT = "vllm-ascend"


class MoeBackend:
    """How one MoE layer of the running engine holds its routed experts: layout, the
    layout's name as wsync files record it (a moe-backend, or "vllm-ascend" for
    vLLM-Ascend's transposed experts), None for one wsync does not write; described,
    what vLLM calls it; remedy, when wsync writes nothing for it."""

    def __init__(self, layout, described, remedy=None):
        self.layout, self.described, self.remedy = layout, described, remedy


def layer_moe_backend(layer):
    """The MoeBackend of the module holding a MoE layer's w13_weight, or None where the
    worker cannot tell (a quantized method, or a vLLM before #25503).

    vLLM: the quant_method's unquantized_backend (oracle/unquantized.py, from #31827,
    2026-01-15); before, its flashinfer_cutlass_moe_enabled and rocm_aiter_moe_enabled
    (#25503 to #31827).  A FusedMoEModularMethod (LoRA, some all2all backends) wraps the
    method that processed the weights as old_quant_method.  vLLM-Ascend: its methods
    (module vllm_ascend...) transpose the experts whatever unquantized_backend says
    (OOT); with fused MC2 the kernel runs the per-expert copies w13_weight_list /
    w2_weight_list instead of the parameters (docs/vllm-ascend.md section 3)."""
    method = getattr(layer, "quant_method", None)
    method = getattr(method, "old_quant_method", method)
    if method is None:
        return None
    if type(method).__module__.split(".")[0] == "vllm_ascend":
        if isinstance(getattr(layer, "w13_weight_list", None), list):
            return MoeBackend(None, f"vLLM-Ascend's {type(method).__name__} with fused MC2, "
                              "which runs per-expert copies (w13_weight_list) that a copy "
                              "into w13_weight does not reach",
                              "start vLLM-Ascend without additional_config enable_fused_mc2 "
                              "(docs/vllm-ascend.md section 4)")
        return MoeBackend(ASCEND_LAYOUT, f"vLLM-Ascend's {type(method).__name__}")
    backend = getattr(method, "unquantized_backend", None)
    if backend is not None:
        name = getattr(backend, "name", str(backend))
        return MoeBackend(_VLLM_BACKENDS.get(name), f"the unquantized MoE backend {name}")
    if hasattr(method, "flashinfer_cutlass_moe_enabled"):
        if getattr(method, "rocm_aiter_moe_enabled", False):
            return MoeBackend(None, "the unquantized MoE backend ROCm AITER")
        if method.flashinfer_cutlass_moe_enabled:
            return MoeBackend("flashinfer-cutlass", "the unquantized MoE backend FlashInfer "
                              "CUTLASS (flashinfer_cutlass_moe_enabled)")
        return MoeBackend("triton", "the unquantized MoE backend Triton")
    return None


def file_moe_layout(metadata):
    """The routed experts' layout a kernel-format rank file holds, from its __metadata__:
    vLLM-Ascend's for target vllm-ascend, else its wsync.moe-backend (none recorded: the
    loader layout, "triton"; plugins/vllm.c set_metadata)."""
    if metadata.get("wsync.target") == ASCEND_LAYOUT:
        return ASCEND_LAYOUT
    return metadata.get("wsync.moe-backend", "triton")


def _layout_text(layout):
    return "target vllm-ascend" if layout == ASCEND_LAYOUT else f"moe-backend {layout}"


def moe_backend_refusal(path, name, file_layout, layer_name, backend):
    """None, or why the routed-expert tensor name of the file at path (holding
    file_layout) must not be copied into layer layer_name, which runs backend."""
    if backend is None or backend.layout == file_layout:
        return None
    if backend.remedy is not None:
        remedy = backend.remedy
    elif backend.layout == ASCEND_LAYOUT:
        remedy = "write the files for target vllm-ascend"
    elif backend.layout in _WRITTEN_BACKENDS:
        remedy = (f"write the files for target vllm with moe-backend = \"{backend.layout}\" "
                  "in the plugin \"vllm\" section of the configuration (docs/vllm.md "
                  "section 4)")
    else:
        remedy = ("wsync writes no kernel format for it: start vLLM with --moe-backend "
                  "triton or flashinfer_cutlass (docs/vllm.md section 4)")
    shown = f" (moe-backend {backend.layout})" if backend.layout not in (None, ASCEND_LAYOUT) else ""
    return (f"{path}: tensor \"{name}\": the file holds the routed experts for "
            f"{_layout_text(file_layout)}, but layer {layer_name} of this engine runs them "
            f"with {backend.described}{shown}: {remedy}")


def check_moe_backends(files, model):
    """Raises wsync.Error, before anything is copied, at the first routed-expert tensor
    of files (an opened _RankFiles) whose layout is not the one its layer runs."""
    layouts = {path: file_moe_layout(metadata) for path, metadata in files.files}
    seen = set()
    for name, _, _, path in files.entries:
        layer_name = name.rpartition(".")[0]
        if not _ROUTED_EXPERTS.search(name) or layer_name in seen:
            continue
        seen.add(layer_name)
        try:
            layer = lora_submodule(model, layer_name)
        except AttributeError:
            continue  # refused by name when the copy resolves it
        refusal = moe_backend_refusal(path, name, layouts[path], layer_name,
                                      layer_moe_backend(layer))
        if refusal is not None:
            raise _bad_input(refusal)


# ------------------------------------------------------------------ experts woken in the loader shape

# vLLM-Ascend's releases for vLLM 0.17 to 0.26.x (v0.17.0rc1 to releases/v0.26.0rc)
# transpose the routed experts back in NPUWorker.wake_up once the allocator has restored
# the weights (tags None or holding "weights"; from v0.19.1rc1 only when quant_config is
# None): each w2_weight whose dim 2 is the hidden size, else each w13_weight whose dim 1
# is, is replaced on its module (setattr) by torch.nn.Parameter(param.transpose(1, 2),
# requires_grad=False), a view of the same storage in the loader shape
# (vllm_ascend/worker/worker.py:208-236 @ e18643f8a4d5, v0.18.0; :213-241 @
# da421afad719, v0.19.1rc1, the quant_config test at :224; :247-276 @ cf0baa38dfb2,
# releases/v0.26.0rc; docs/vllm-ascend.md section 5).  Their RL flow reloads checkpoint
# names into the views and runs process_weights_after_loading, which transposes them into
# new contiguous processed tensors (vllm_ascend/ops/fused_moe/fused_moe.py:75-82 @
# e18643f8a4d5).  A kernel-format copy into a view fails on its shape, or, where the
# expert is square (H == 2I/tp for w13, H == I/tp for w2), writes through its strides and
# leaves the storage transposed without an error; wsync_load puts the processed
# Parameter back first, as ms-swift #9800 does after wake_up.
_WOKEN_LEAVES = ("w13_weight", "w2_weight")


def processed_expert_tensors(files):
    """{name: (path, dtype, shape)} of the routed experts' w13_weight and w2_weight that
    files (an opened _RankFiles) record in vLLM-Ascend's processed layout: metadata
    wsync.layout.<name>, else the file's wsync.moe-layout, "processed" (the rule by which
    plugins/npu-ascend.c reads them)."""
    metadata = dict(files.files)
    out = {}
    for name, dtype, shape, path in files.entries:
        if name.rpartition(".")[2] not in _WOKEN_LEAVES or not _ROUTED_EXPERTS.search(name):
            continue
        recorded = metadata[path]
        if recorded.get("wsync.layout." + name, recorded.get("wsync.moe-layout")) == "processed":
            out[name] = (path, dtype, tuple(shape))
    return out


def is_woken_view(param, shape):
    """Whether param is what wake_up leaves of a processed tensor of shape: a torch tensor
    of 3 dimensions, not contiguous, whose transpose(1, 2) is contiguous and of shape.

    Contiguous is torch's Tensor.is_contiguous(): the strides of a dense row-major tensor,
    dimensions of size 1 aside.  The storage then holds the processed tensor densely, and
    Parameter(param.transpose(1, 2)) is the one process_weights_after_loading made; a
    square expert keeps its shape in wake_up, and only the strides tell.  (A view that
    torch calls contiguous, where I/tp or H is 1, is not recognised and is refused by
    loader_shape_refusal: nothing is copied.)"""
    if not _is_torch_tensor(param) or param.dim() != 3 or param.is_contiguous():
        return False
    processed = param.transpose(1, 2)
    return processed.is_contiguous() and tuple(processed.shape) == tuple(shape)


def processed_parameter(view):
    """The Parameter wake_up replaced by view: view.transpose(1, 2), over the same storage
    (torch.nn.Parameter aliases its data), with the view's requires_grad."""
    import torch

    return torch.nn.Parameter(view.detach().transpose(1, 2), requires_grad=view.requires_grad)


def loader_shape_refusal(path, name, dtype, shape, param):
    """None, or why the tensor name of the file at path, of dtype and shape in the
    processed layout, must not be copied into param: a parameter of the loader shape (the
    processed shape with its last two dimensions swapped, not square) that is_woken_view
    does not take for wake_up's view, e.g. a copy."""
    have = tuple(getattr(param, "shape", ()))
    if len(shape) != 3 or have != (shape[0], shape[2], shape[1]) or have == tuple(shape):
        return None
    return (f"{path}: tensor \"{name}\" is {dtype} {_shape_text(shape)} in vLLM-Ascend's "
            f"processed layout, but the parameter has the loader shape {_shape_text(have)} "
            f"and is not the transposed view of processed storage that wsync_load puts back: "
            f"likely the weights woke up on a vLLM-Ascend for vLLM 0.17 to 0.26.x, whose "
            f"NPUWorker.wake_up transposes the routed experts to the loader shape, and the "
            f"view was replaced since, or the files were written for another format than "
            f"the engine runs (docs/vllm-ascend.md section 5)")


class _ParametersThroughLora:
    """A model as load_rank resolves names: get_parameter through LoRA wrappers.

    processed ({name: (path, dtype, shape)}, processed_expert_tensors) are the tensors
    the files hold in vLLM-Ascend's processed layout.  Where such a name resolves to
    wake_up's view (is_woken_view), the destination is the processed Parameter over the
    same storage, which load_rank checks and copies into, and which put_back registers on
    the module before the first copy; a parameter of the loader shape that is not such a
    view is refused (loader_shape_refusal)."""

    def __init__(self, model, processed=None):
        self.model, self.processed = model, processed or {}
        self.woken = {}  # (id(module), leaf): (module, leaf, processed Parameter, name)

    def get_parameter(self, name):
        module, leaf = lora_parameter_owner(self.model, name)
        param = module.get_parameter(leaf)
        if name not in self.processed:
            return param
        key = (id(module), leaf)
        if key in self.woken:
            return self.woken[key][2]
        path, dtype, shape = self.processed[name]
        if is_woken_view(param, shape):
            self.woken[key] = (module, leaf, processed_parameter(param), name)
            return self.woken[key][2]
        refusal = loader_shape_refusal(path, name, dtype, shape, param)
        if refusal is not None:
            raise _bad_input(refusal)
        return param

    def restored(self):
        """The names of the parameters put back (or to be), in the files' order."""
        return [name for _, _, _, name in self.woken.values()]

    def put_back(self, dir, rank):
        """Registers each processed Parameter on its module, as wake_up registered the
        view (setattr), and says so in a warning of the logger wsync.vllm_worker."""
        for module, leaf, param, _ in self.woken.values():
            setattr(module, leaf, param)
        if self.woken:
            _log.warning("%s: rank %d: put back the processed routed experts that "
                         "vLLM-Ascend's wake_up had replaced by views in the loader shape "
                         "(%s) before copying into them; do not run "
                         "process_weights_after_loading on this model after a kernel-format "
                         "update: it would transpose them a second time (docs/vllm-ascend.md "
                         "section 5)", dir, rank, ", ".join(self.restored()))


def layerwise_reload_hint(message):
    """message, with the likely cause added where a parameter is on the meta device:
    vLLM's checkpoint-format update puts every layer's parameters there between
    start_weight_update and finish_weight_update (initialize_layerwise_reload,
    vllm/model_executor/model_loader/reload/layerwise.py:84-119 @ df1376907b16; from
    vLLM #44353 the start of every nccl or ipc update), and a kernel-format copy into
    them would be lost."""
    if not message.endswith("the parameter is on the meta device, which holds no data (a "
                            "model being built, or reloaded)"):
        return message
    return (f"{message}: vLLM's start_weight_update (a checkpoint-format update) holds the "
            f"parameters there until finish_weight_update; call wsync_load outside that "
            f"bracket (docs/vllm.md section 7.1)")


class WsyncWorkerExtension:
    """Mixed into vLLM's worker class by --worker-extension-cls."""

    def wsync_rank(self):
        """This worker's rank file index, from vLLM's parallel state."""
        from vllm.distributed import parallel_state as ps

        parallel = self.vllm_config.parallel_config
        tp_size = ps.get_tensor_model_parallel_world_size()
        pcp_size = getattr(parallel, "prefill_context_parallel_size", 1) or 1
        pcp_rank = ps.get_pcp_group().rank_in_group if pcp_size > 1 else 0
        dp_size = parallel.data_parallel_size
        expert_parallel = bool(parallel.enable_expert_parallel) and dp_size * pcp_size * tp_size > 1
        return rank_file_index(ps.get_tensor_model_parallel_rank(), tp_size, expert_parallel,
                               parallel.data_parallel_rank, pcp_rank, pcp_size)

    def wsync_load(self, dir, version=None, digest=None, verify=True):
        """Loads this worker's rank of the step committed in dir; returns its commit
        record.  version and digest, when given, must be the record's; version and verify
        may also be given as text ("12", "false"), as POST /collective_rpc passes them.

        As vLLM's kernel-format update (docs/vllm.md section 7): every name resolves to a
        parameter (model.get_parameter), never to a buffer; unlike it, nothing is copied
        until every file, name, dtype and shape is checked: the files must be of the
        kernel format.

        Experts woken in the loader shape (vLLM-Ascend for vLLM 0.17 to 0.26.x: after
        wake_up of the weights, each routed-expert w13_weight / w2_weight that the files
        hold in the processed layout is Parameter(p.transpose(1, 2)) of the processed
        parameter p, a view of its storage): each is put back on its module as the
        processed Parameter over that storage (view.transpose(1, 2), requires_grad
        kept) once every check has passed, taking the processed shapes, and before the
        first copy.  Then a warning of the logger wsync.vllm_worker names them, and the
        returned record has one member more, "restored", the list of their names (in
        the files' order; absent when nothing was put back).  A routed-expert parameter
        in the loader shape that is not such a view is refused.  Do not run
        process_weights_after_loading after a kernel-format update (vLLM-Ascend's own RL
        flow runs it after reloading checkpoint names into the views): it transposes the
        experts again, into the loader shape."""
        verify = _flag("verify", verify)  # version: _open_rank reads an int or its text
        runner = self.model_runner
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        rank = self.wsync_rank()
        try:
            files = _wsync._open_rank(dir, rank, verify=verify, version=version, digest=digest)
            for path, metadata in files.files:
                refusal = file_refusal(path, metadata)
                if refusal is not None:
                    raise _bad_input(refusal)
            ascend_config = _ascend_config()
            refusal = nz_mode_refusal(dir, rank, ascend_nz_mode(ascend_config))
            if refusal is not None:
                raise _bad_input(refusal)
            check_moe_backends(files, model)
            check_expert_placement(files, expert_load_balancing(
                self.vllm_config.parallel_config, ascend_config))
            params = _ParametersThroughLora(model, processed_expert_tensors(files))
            record = _load_opened(files, dir, rank, params, buffers=False,
                                  before_copy=lambda: params.put_back(dir, rank))
            if params.woken and record is not None:
                record = dict(record, restored=params.restored())
            return record
        except Error as e:
            hinted = self._wsync_hint(str(e))
            if hinted == str(e):
                raise
            error = Error(hinted)
            error.exit_status = getattr(e, "exit_status", 3)
            raise error from e

    def _wsync_hint(self, message):
        """message with the first hint (at most one) that applies to this worker."""
        from vllm.distributed import parallel_state as ps

        parallel = self.vllm_config.parallel_config
        sizes = (ps.get_tensor_model_parallel_world_size(), parallel.data_parallel_size,
                 bool(parallel.enable_expert_parallel),
                 getattr(parallel, "prefill_context_parallel_size", 1) or 1)
        hints = (lambda: layerwise_reload_hint(message),
                 lambda: replica_shape_hint(message, *sizes),
                 lambda: shared_expert_hint(
                     message, *sizes,
                     getattr(parallel, "all2all_backend", "allgather_reducescatter"),
                     _ascend_shared_expert_dp()))
        for hint in hints:
            hinted = hint()
            if hinted != message:
                return hinted
        return message
