/* wsync plugin "vllm": the tensors one vLLM tensor-/expert-parallel rank holds, under
 * vLLM's names, in the two forms vLLM reads per-rank weights in (docs/vllm.md, cited
 * below as §N):
 *
 *   sharded-state  `vllm serve DIR --load-format sharded_state --tensor-parallel-size N`:
 *                  ShardedStateLoader reads model-rank-{tp_rank}-part-{p}.safetensors and
 *                  insists on exactly the keys of its filtered state_dict (§6): the alias
 *                  winners, the persistent buffers, the loader layout
 *   kernel         a live weight update with is_checkpoint_format=false: each worker runs
 *                  `model.get_parameter(name).copy_(w)` for every tensor it receives (§7):
 *                  parameters only, in the layout the kernels run on; files
 *                  kernel-rank-{r}-part-{p}.safetensors, r the worker (EP rank with EP)
 *
 * Two targets, "vllm" and "vllm-ascend" (the npu-ascend plugin's hook puts the experts
 * of the latter's kernel format into vLLM-Ascend's processed layout, docs/vllm-ascend.md
 * §3).  The build function runs once per rank; it turns every param the model plugin
 * declared into tensors with placements (which box of which logical tensor lies where)
 * and fills (bytes that come from nowhere: vocabulary padding, scale buffers, expert
 * maps):
 *
 *   REPLICATED   whole, on every rank                       ReplicatedLinear, norms (§2)
 *   COLUMN       parts concatenated along axis 0, each part's units split over the tp
 *                ranks, KV heads replicated when tp > units  QKVParallelLinear,
 *                                                            MergedColumnParallelLinear (§2)
 *   ROW          last axis split over the tp ranks          RowParallelLinear (§2)
 *   VOCAB        rows padded to a multiple of 64, then split VocabParallelEmbedding,
 *                                                            ParallelLMHead (§3)
 *   EXPERTS_W13  [E_loc, 2*Ip, H], gate rows first (up      FusedMoE w13_weight (§4)
 *                first for FlashInfer CUTLASS's kernel format)
 *   EXPERTS_W2   [E_loc, H, Ip]                             FusedMoE w2_weight (§4)
 *   ATTENTION    four F32 scalars of 1.0 (sharded-state)    Attention scale buffers (§6)
 *
 * plus, with EP in the releases that keep it persistent, each MoE layer's expert map.
 *
 * Names.  vLLM registers some modules of a MoE block twice (under the block and under
 * its FusedMoE/MoERunner object), and which attribute holds what changed four times
 * (eras A to D, §5).  ShardedStateLoader keeps only the lexicographically smallest name
 * of a tensor registered twice (§6), so a file must use that name and no other; a live
 * update may use any name get_parameter resolves, and uses the same one.  The model
 * plugin says what a param is (wsync_param_set_role(): router, shared expert, routed
 * experts, and its block) and which other names it has (wsync_param_add_alias(): a tied
 * LM head); the era table below turns roles into names, and param_name() applies the
 * alias rule, in one place.
 *
 * With ep > 1 (a multiple of tp) the routed experts are spread over the ep ranks in
 * contiguous blocks and are not TP-sliced; everything else stays TP-sliced by the rank's
 * tp rank, rank % tp (§4).  sharded_state names files by TP rank only, so it can express
 * ep <= tp only (§6); the kernel format names files by worker.  Params of group "mtp"
 * are dropped (§9).
 *
 * Options (conf.d/20-vllm.conf):
 *   vllm-version  the vLLM release the files are for ("0.24.0", "v0.24.0", "0.18"), or
 *                 "latest" (the default: the newest naming era of the table)
 *   attn-scales   emit the attention scale buffers that sharded_state expects (§6)
 *   all2all-backend, prefill-context-parallel-size
 *                 the deployment's vLLM launch flags: with EP they decide whether the
 *                 shared expert is whole (use_sequence_parallel_moe, §9.4)
 *   enable-shared-expert-dp
 *                 vllm-ascend only: vLLM-Ascend's additional_config key, which alone
 *                 decides its shared expert (docs/vllm-ascend.md §2)
 *   mm-encoder-tp-mode
 *                 the deployment's --mm-encoder-tp-mode: "weights" (vLLM's default) slices
 *                 the vision tower like the text model, "data" holds it whole (§9.5)
 *   moe-backend   the deployment's unquantized --moe-backend, for the vllm target's kernel
 *                 format: "triton" the loader layout, "flashinfer-cutlass" each expert's
 *                 w13 as [w3; w1], "flashinfer-trtllm" refused (its block layout, §4)
 *   dtype         the deployment's --dtype, the dtype of every parameter but A_log (§2):
 *                 "auto" (vLLM's default) the config's, a float32 model in bfloat16
 *
 * Rank files record their target, format, parallel layout, rank, the vLLM version and
 * era, attn-scales, with EP the deployment options (vllm-ascend's also
 * enable-shared-expert-dp), mm-encoder-tp-mode when it is data, moe-backend when the
 * experts are not in the loader layout and the dtype when it is not the config's, in
 * `__metadata__`; files read back are named and laid out as they record, whatever the
 * options say.
 */
#include <stdarg.h>
#include <string.h>

#include <wsync/layout.h>
#include <wsync/model.h>
#include <wsync/plugin.h>
#include <wsync/target.h>

/* vllm/model_executor/layers/vocab_parallel_embedding.py: DEFAULT_VOCAB_PADDING_SIZE (§3). */
#define VOCAB_PADDING 64

#define FORMAT_SHARDED_STATE "sharded-state"
#define FORMAT_KERNEL "kernel"

static const char *const formats[] = {FORMAT_SHARDED_STATE, FORMAT_KERNEL, NULL};

/* ------------------------------------------------------------------ naming eras (§5) */

/* How one era names the tensors of a MoE block, relative to the block's module path
 * (`model.layers.3.mlp`).  Each name is the alias winner: the smallest of the names the
 * era's module tree registers the tensor under. */
typedef struct {
  const char *name;
  const char *router;        /* the router's weight */
  const char *shared;        /* the shared expert MLP module, with its dot */
  const char *routed;        /* the module holding w13_weight / w2_weight, with its dot */
  const char *map_module;    /* the module that registers the EP expert map */
  const char *summary;       /* for the plan */
} NamingEra;

static const NamingEra era_a = {
    "A", "experts._gate.weight", "experts._shared_experts.", "experts.", "experts.",
    "FusedMoE holds the router as _gate and the shared expert as _shared_experts"};
static const NamingEra era_b = {
    "B", "gate.weight", "shared_expert.", "experts.", "experts.",
    "the MoE runner and shared experts are plain objects: no aliases but the shared "
    "expert's gate"};
static const NamingEra era_c = {
    "C", "experts.runner.gate.weight", "shared_expert.", "experts.", "experts.",
    "FusedMoE.runner is a module holding the router"};
static const NamingEra era_d = {
    "D", "experts.gate.weight", "experts._shared_experts._layer.", "experts.routed_experts.",
    "experts.routed_experts.",
    "the MoERunner is mlp.experts and holds the router, the shared experts and the routed "
    "experts"};

/* vLLM-Ascend replaces vLLM's MoE classes with its own, which register aliases of their
 * own (docs/vllm-ascend.md §2 "Names by release").  Up to its release for vLLM 0.23.0 its
 * AscendFusedMoE (mlp.experts) sets `self._gate` and `self._shared_experts` from the
 * gate= and shared_experts= the model passes, whatever vLLM's era: era A's names.  From
 * 0.24.0 its AscendMoERunner (mlp.experts) sets `self._gate = gate`; in its releases for
 * vLLM 0.24 to 0.26 it also sets `self._shared_experts = shared_experts`, the shared
 * expert MLP itself, which replaces vLLM's SharedExperts wrapper (and its `_layer`);
 * vLLM-Ascend #13328 dropped that before its lane for 0.27.1. */
static const NamingEra era_a_ascend = {
    "A", "experts._gate.weight", "experts._shared_experts.", "experts.", "experts.",
    "vLLM-Ascend's AscendFusedMoE holds the router as _gate and the shared expert as "
    "_shared_experts"};
static const NamingEra era_d_ascend_unwrapped = {
    "D-unwrapped", "experts._gate.weight", "experts._shared_experts.", "experts.routed_experts.",
    "experts.routed_experts.",
    "vLLM-Ascend's AscendMoERunner is mlp.experts and holds the router as _gate, the shared "
    "expert MLP itself as _shared_experts and the routed experts"};
static const NamingEra era_d_ascend = {
    "D", "experts._gate.weight", "experts._shared_experts._layer.", "experts.routed_experts.",
    "experts.routed_experts.",
    "vLLM-Ascend's AscendMoERunner is mlp.experts and holds the router as _gate, the shared "
    "experts and the routed experts"};

/* Whether a release registers the expert map (int32 [E], with EP) as a persistent
 * buffer, which sharded_state then saves and insists on loading (§4, §6). */
typedef enum {
  MAP_PERSISTENT,
  MAP_ABSENT,  /* not persistent (#47206), or no EP */
  MAP_UNKNOWN, /* the table does not know: sharded-state with EP is refused */
} ExpertMap;

/* use_sequence_parallel_moe of a range of releases (§9.4): vLLM builds the shared
 * expert with disable_tp (whole on every rank) when the all2all backend, after the
 * renames ParallelConfig.__post_init__ makes ("naive", "pplx" -> allgather_reducescatter),
 * is in the property's list, EP is on, tp > 1 and dp > 1. */
typedef struct {
  const char *const *listed;  /* in the list */
  const char *const *unknown; /* whether these are in the list is not known */
  gboolean dp_known;          /* FALSE: whether these releases require dp > 1 is not known */
  const char *why;            /* why something is not known */
} SequenceParallelRule;

/* Every name ParallelConfig.all2all_backend has accepted (the All2AllBackend literal of
 * vLLM main, with "mori" of #28664 to #41751); a release refuses the names it lacks. */
static const char *const all2all_backends[] = {
    "allgather_reducescatter", "naive", "pplx", "deepep_high_throughput", "deepep_low_latency",
    "deepep_v2", "mori", "mori_high_throughput", "mori_low_latency", "nixl_ep",
    "flashinfer_all2allv", "flashinfer_nvlink_two_sided", "flashinfer_nvlink_one_sided", NULL};

#define DEFAULT_ALL2ALL_BACKEND "allgather_reducescatter"

/* Before 0.24.0: main's list from #26732 (2025-10-13) to #41751 (2026-05-27), with
 * "mori" from #28664, "nixl_ep" from #35627, "naive" listed until #36294 and renamed
 * after, so listed whichever a release accepts; "pplx" was a backend of its own until
 * #33724 (2026-02-26), renamed after, and these releases' tag commits were not read. */
static const char *const sp_listed_before_0_24[] = {
    "allgather_reducescatter", "naive", "deepep_high_throughput", "deepep_low_latency", "mori",
    "mori_high_throughput", "mori_low_latency", "nixl_ep", NULL};
static const char *const sp_unknown_before_0_24[] = {"pplx", NULL};
/* 0.24.0 on: main's list from #41751 (2026-05-27) until #51924 (2026-08-18). */
static const char *const sp_listed[] = {
    "allgather_reducescatter", "naive", "pplx", "deepep_high_throughput", "deepep_low_latency",
    "mori_high_throughput", "mori_low_latency", "nixl_ep", NULL};
static const char *const sp_unknown_none[] = {NULL};
/* #51924 (2026-08-18) added flashinfer_nvlink_one_sided after v0.27.1's cut. */
static const char *const sp_unknown_after_0_27[] = {"flashinfer_nvlink_one_sided", NULL};

static const SequenceParallelRule sp_before_0_24 = {
    sp_listed_before_0_24, sp_unknown_before_0_24, TRUE,
    "whether a release before 0.24.0 renames \"pplx\" to allgather_reducescatter (#33724, "
    "2026-02-26) is not known"};
static const SequenceParallelRule sp_pinned = {sp_listed, sp_unknown_none, TRUE, NULL};
static const SequenceParallelRule sp_0_25 = {
    sp_listed, sp_unknown_none, FALSE,
    "releases 0.25.0 to 0.27.0 were cut while vLLM main had dropped the rule's dp > 1 "
    "(#47070 to #47902, 2026-07-05 to 07-07, and #48036 to #48849, 07-14 to 07-17) and their "
    "tag commits were not read"};
static const SequenceParallelRule sp_after_0_27 = {
    sp_listed, sp_unknown_after_0_27, TRUE,
    "whether releases after 0.27.x list flashinfer_nvlink_one_sided (#51924, 2026-08-18) is "
    "not known"};

/* The release table: each row a range of releases, [first, last] (last NULL: open), the
 * era they name by, their expert map, and whether the row is verified.  The team's
 * reference note vllm-layouts.md rates each mapping (§0, its era table, and §8: before
 * v0.24.0 medium/low confidence, v0.24.0 on high; v0.25 and v0.26 not verified);
 * docs/vllm.md §5 gives the evidence.  Versions the table marks as unverified use their
 * era with a note in the plan. */
typedef struct {
  const char *label; /* the range, for people */
  const char *first;
  const char *last;
  const NamingEra *era;
  const NamingEra *ascend_era; /* vLLM-Ascend's names; NULL: no vLLM-Ascend release */
  ExpertMap map;
  gboolean verified;
  const char *why; /* why unverified */
  const SequenceParallelRule *sp;
} Release;

static const Release releases[] = {
    {"0.17 to 0.19.x", "0.17.0", "0.19.999", &era_a, &era_a_ascend, MAP_PERSISTENT, FALSE,
     "the era A release range is medium confidence, and Qwen3-MoE's router alias only came "
     "with vLLM #32082 (2026-01-23) (docs/vllm.md §5)", &sp_before_0_24},
    {"0.20.x", "0.20.0", "0.20.999", &era_b, &era_a_ascend, MAP_PERSISTENT, FALSE,
     "the era B release range is low confidence (docs/vllm.md §5)", &sp_before_0_24},
    {"0.21.0 to 0.23.x", "0.21.0", "0.23.999", &era_c, &era_a_ascend, MAP_PERSISTENT, FALSE,
     "the era C release range is medium-high confidence: vllm-ascend #11081 keeps v0.23.0 "
     "on that path, and the releases before 0.24.0 map to their eras with medium or low "
     "confidence (docs/vllm.md §5)", &sp_before_0_24},
    {"0.24.x", "0.24.0", "0.24.999", &era_d, &era_d_ascend_unwrapped, MAP_PERSISTENT, TRUE, NULL,
     &sp_pinned},
    {"0.25.0 to 0.26.x", "0.25.0", "0.26.999", &era_d, &era_d_ascend_unwrapped, MAP_UNKNOWN, FALSE,
     "0.25.0 to 0.27.0 were not checked; whether they keep the expert map persistent is "
     "not known (docs/vllm.md §5)", &sp_0_25},
    {"0.27.0", "0.27.0", "0.27.0", &era_d, NULL, MAP_UNKNOWN, FALSE,
     "0.25.0 to 0.27.0 were not checked; whether they keep the expert map persistent is "
     "not known (docs/vllm.md §5)", &sp_0_25},
    {"0.27.1 to 0.27.x", "0.27.1", "0.27.999", &era_d, &era_d_ascend, MAP_ABSENT, TRUE, NULL,
     &sp_pinned},
    {"0.28.0 and later", "0.28.0", NULL, &era_d, &era_d_ascend, MAP_ABSENT, FALSE,
     "releases after 0.27.x are assumed to name like 0.27.1", &sp_after_0_27},
};

/* The default, "latest": the release of the newest verified row (the vLLM that
 * vLLM-Ascend HEAD targets); find_release() looks it up like any other version. */
#define LATEST_VERSION "0.27.1"

#define VERSION_PARTS 4

/* Parses a release number: an optional "v", then 2 to 4 dot-separated numbers ("0.18",
 * "0.18.1", "v0.24.0", "0.10.1.1"); missing parts count as 0.  Pre-release and local
 * suffixes (rc1, .post1, +cu128) are refused: which era they name by is not known. */
static gboolean
parse_version(const char *text, guint64 parts[VERSION_PARTS])
{
  g_auto(GStrv) fields = NULL;
  guint n;

  if (text == NULL)
    return FALSE;
  if (text[0] == 'v')
    text++;
  fields = g_strsplit(text, ".", -1);
  n = g_strv_length(fields);
  if (n < 2 || n > VERSION_PARTS)
    return FALSE;
  memset(parts, 0, sizeof(guint64) * VERSION_PARTS);
  for (guint i = 0; i < n; i++) {
    size_t len = strlen(fields[i]);
    if (len == 0 || len > 6 || strspn(fields[i], "0123456789") != len)
      return FALSE;
    parts[i] = g_ascii_strtoull(fields[i], NULL, 10);
  }
  return TRUE;
}

static int
compare_versions(const guint64 a[VERSION_PARTS], const guint64 b[VERSION_PARTS])
{
  for (guint i = 0; i < VERSION_PARTS; i++)
    if (a[i] != b[i])
      return a[i] < b[i] ? -1 : 1;
  return 0;
}

static gboolean
in_release(const Release *row, const guint64 v[VERSION_PARTS])
{
  guint64 first[VERSION_PARTS], last[VERSION_PARTS];

  parse_version(row->first, first);
  if (compare_versions(v, first) < 0)
    return FALSE;
  return row->last == NULL || (parse_version(row->last, last) && compare_versions(v, last) <= 0);
}

#define VERSION_RULE                                                                           \
  "vllm-version must be \"latest\" or a vLLM release number like \"0.24.0\" (no rc/post "  \
  "suffix), from 0.17.0 on"

/* The table row of a version (text as configured or recorded), or NULL with the reason
 * in @why. */
static const Release *
find_release(const char *text, const char **why)
{
  guint64 v[VERSION_PARTS];

  if (g_strcmp0(text, "latest") == 0)
    text = LATEST_VERSION;
  if (!parse_version(text, v)) {
    *why = VERSION_RULE;
    return NULL;
  }
  for (guint i = 0; i < G_N_ELEMENTS(releases); i++)
    if (in_release(&releases[i], v))
      return &releases[i];
  *why = "vLLM before 0.17.0 is not in the naming table (docs/vllm.md §5)";
  return NULL;
}

/* libconfuse calls this for each value a file sets; the core calls it with the file's
 * position, so the message reads FILE:LINE: ... */
static int
validate_version(cfg_t *cfg, cfg_opt_t *opt)
{
  const char *value, *why = NULL;

  if (cfg_opt_size(opt) == 0)
    return 0;
  value = cfg_opt_getnstr(opt, cfg_opt_size(opt) - 1);
  if (find_release(value, &why) != NULL)
    return 0;
  cfg_error(cfg, "%s, not \"%s\"", why, value != NULL ? value : "");
  return -1;
}

static gboolean
is_all2all_backend(const char *name)
{
  return name != NULL && g_strv_contains(all2all_backends, name);
}

/* "a, b or c", for messages */
static char *
all2all_backend_names(void)
{
  g_autofree char *head = NULL;
  guint n = g_strv_length((GStrv)all2all_backends);

  head = g_strjoinv(", ", (GStrv)all2all_backends);
  *strrchr(head, ',') = '\0';
  return g_strdup_printf("%s or %s", head, all2all_backends[n - 1]);
}

#define ALL2ALL_RULE "all2all-backend must be one of vLLM's --all2all-backend names"

static int
validate_all2all_backend(cfg_t *cfg, cfg_opt_t *opt)
{
  const char *value;
  g_autofree char *names = NULL;

  if (cfg_opt_size(opt) == 0)
    return 0;
  value = cfg_opt_getnstr(opt, cfg_opt_size(opt) - 1);
  if (is_all2all_backend(value))
    return 0;
  names = all2all_backend_names();
  cfg_error(cfg, ALL2ALL_RULE " (%s), not \"%s\"", names, value != NULL ? value : "");
  return -1;
}

#define MAX_PCP 65535

static int
validate_pcp(cfg_t *cfg, cfg_opt_t *opt)
{
  long value;

  if (cfg_opt_size(opt) == 0)
    return 0;
  value = cfg_opt_getnint(opt, cfg_opt_size(opt) - 1);
  if (value >= 1 && value <= MAX_PCP)
    return 0;
  cfg_error(cfg, "prefill-context-parallel-size must be a whole number from 1 to %d, not %ld",
            MAX_PCP, value);
  return -1;
}

/* ------------------------------------------------------------------ settings and ranks */

/* vLLM's WeightsMapper of a model class: prefixes of the published names it renames
 * (hf_to_vllm_mapper.orig_to_new_prefix), applied in order (§9). */
typedef struct {
  const char *from;
  const char *to;
} Prefix;

/* vLLM's MMEncoderTPMode (vllm/config/multimodal.py, docs/vllm.md §9.5). */
static int
validate_encoder_mode(cfg_t *cfg, cfg_opt_t *opt)
{
  const char *value;

  if (cfg_opt_size(opt) == 0)
    return 0;
  value = cfg_opt_getnstr(opt, cfg_opt_size(opt) - 1);
  if (value != NULL && (strcmp(value, "weights") == 0 || strcmp(value, "data") == 0))
    return 0;
  cfg_error(cfg, "mm-encoder-tp-mode must be weights or data, not \"%s\"",
            value != NULL ? value : "");
  return -1;
}

/* The unquantized MoE backend the deployment runs (vLLM's --moe-backend): what
 * process_weights_after_loading does to the routed experts, and so what a live update in
 * kernel format must bring (docs/vllm.md §4). */
typedef enum {
  MOE_TRITON,             /* the loader layout */
  MOE_FLASHINFER_CUTLASS, /* each expert's w13 halves swapped to [w3; w1] (swap_w13_to_w31) */
  MOE_FLASHINFER_TRTLLM,  /* FlashInfer's block layout: not written */
} MoeBackend;

/* wsync's names; vLLM's spellings (underscores) are accepted too, as vLLM turns dashes
 * into underscores (vllm/config/kernel.py:242-246 @ df1376907b16). */
static const char *const moe_backends[] = {"triton", "flashinfer-cutlass", "flashinfer-trtllm",
                                           NULL};

#define MOE_BACKEND_RULE                                                                   \
  "moe-backend must be triton, flashinfer-cutlass or flashinfer-trtllm (the deployment's " \
  "vLLM --moe-backend; auto is not a layout)"

/* The backend a name gives, or -1. */
static int
moe_backend_of(const char *name)
{
  g_autofree char *dashed = NULL;

  if (name == NULL)
    return -1;
  dashed = g_strdelimit(g_strdup(name), "_", '-');
  for (guint i = 0; moe_backends[i] != NULL; i++)
    if (strcmp(dashed, moe_backends[i]) == 0)
      return (int)i;
  return -1;
}

static int
validate_moe_backend(cfg_t *cfg, cfg_opt_t *opt)
{
  const char *value;

  if (cfg_opt_size(opt) == 0)
    return 0;
  value = cfg_opt_getnstr(opt, cfg_opt_size(opt) - 1);
  if (moe_backend_of(value) >= 0)
    return 0;
  cfg_error(cfg, MOE_BACKEND_RULE ", not \"%s\"", value != NULL ? value : "");
  return -1;
}

/* The dtype the deployment's vLLM builds its parameters in (--dtype, docs/vllm.md §2
 * "Dtype on load"): vLLM's ModelDType spellings (vllm/config/model.py:100 @ df1376907b16),
 * "auto" (vLLM's default) as DTYPE_AUTO. */
#define DTYPE_AUTO WSYNC_DTYPE_COUNT

static const struct {
  const char *name;
  WsyncDtype dtype;
} served_dtypes[] = {{"auto", DTYPE_AUTO},          {"bfloat16", WSYNC_DTYPE_BF16},
                     {"float16", WSYNC_DTYPE_F16},  {"half", WSYNC_DTYPE_F16},
                     {"float32", WSYNC_DTYPE_F32},  {"float", WSYNC_DTYPE_F32}};

#define DTYPE_RULE                                                                          \
  "dtype must be auto, bfloat16, float16, half, float32 or float (the deployment's vLLM " \
  "--dtype)"

/* The dtype a name gives (DTYPE_AUTO for auto); FALSE for a name vLLM does not take. */
static gboolean
served_dtype_of(const char *name, WsyncDtype *dtype)
{
  for (guint i = 0; name != NULL && i < G_N_ELEMENTS(served_dtypes); i++)
    if (strcmp(name, served_dtypes[i].name) == 0) {
      *dtype = served_dtypes[i].dtype;
      return TRUE;
    }
  return FALSE;
}

static gboolean
is_float(WsyncDtype dtype)
{
  return dtype == WSYNC_DTYPE_BF16 || dtype == WSYNC_DTYPE_F16 || dtype == WSYNC_DTYPE_F32;
}

static int
validate_dtype(cfg_t *cfg, cfg_opt_t *opt)
{
  const char *value;
  WsyncDtype dtype;

  if (cfg_opt_size(opt) == 0)
    return 0;
  value = cfg_opt_getnstr(opt, cfg_opt_size(opt) - 1);
  if (served_dtype_of(value, &dtype))
    return 0;
  cfg_error(cfg, DTYPE_RULE ", not \"%s\"", value != NULL ? value : "");
  return -1;
}

/* A target's user data (one per target: "vllm", "vllm-ascend"). */
typedef struct {
  const char *target; /* static */
  char *version;      /* vllm-version as configured */
  gboolean attn_scales;
  char *all2all_backend;     /* vLLM's --all2all-backend */
  guint pcp;                 /* vLLM's --prefill-context-parallel-size */
  gboolean shared_expert_dp; /* vLLM-Ascend's additional_config enable_shared_expert_dp */
  gboolean encoder_data;     /* vLLM's --mm-encoder-tp-mode data */
  MoeBackend moe_backend;    /* vLLM's --moe-backend */
  WsyncDtype dtype;          /* vLLM's --dtype, DTYPE_AUTO for auto */
  char *help;                /* the target's help text */
} VllmSettings;

/* Which rule decides whether the shared expert is whole or TP-sliced. */
typedef enum {
  RULE_VLLM,   /* vLLM's use_sequence_parallel_moe (§9.4): target vllm */
  RULE_ASCEND, /* vLLM-Ascend's enable_shared_expert_dp (docs/vllm-ascend.md §2) */
  /* vllm-ascend files of a wsync before enable-shared-expert-dp, which applied vLLM's
   * rule to them: they record all2all-backend but not enable-shared-expert-dp */
  RULE_ASCEND_AS_VLLM,
  /* files of a wsync before the deployment options, which record none: whole when
   * ep > tp > 1 */
  RULE_LEGACY,
} SharedRule;

/* One rank being built. */
typedef struct {
  WsyncLayout *layout;
  gboolean kernel;   /* the kernel format (else sharded-state) */
  gboolean ascend;   /* target vllm-ascend */
  guint tp;          /* tensor-parallel size */
  guint ep;          /* expert-parallel size, 1 when experts are TP-sliced */
  guint rank;        /* 0 <= rank < world */
  guint world;       /* ep if ep > 1 else tp */
  guint t;           /* the rank's tp rank: rank % tp */
  const char *version;
  const Release *release;
  const NamingEra *naming; /* the release's names on the target's engine */
  gboolean attn_scales;
  const char *all2all_backend;
  guint pcp;           /* prefill-context-parallel size */
  guint dp;            /* data-parallel replicas: ep / (pcp * tp) with EP, else 1 */
  gboolean shared_expert_dp; /* vLLM-Ascend's enable_shared_expert_dp */
  SharedRule rule;     /* how the shared expert is laid out (see read_deployment) */
  gboolean encoder_data; /* mm_encoder_tp_mode "data": the vision tower whole (§9.5) */
  MoeBackend moe_backend; /* the unquantized MoE backend the kernel format is for (§4) */
  WsyncDtype served;      /* the dtype vLLM builds the model's parameters in (§2) */
  const Prefix *prefixes; /* how vLLM renames the model's modules, or NULL */
} Rank;

static void
free_settings(gpointer data)
{
  VllmSettings *settings = data;

  g_free(settings->version);
  g_free(settings->all2all_backend);
  g_free(settings->help);
  g_free(settings);
}

/* ------------------------------------------------------------------ module names */

/* Qwen3VLForConditionalGeneration.hf_to_vllm_mapper, inherited by the Qwen3.5 classes. */
static const Prefix qwen3_vl_prefixes[] = {{"model.visual.", "visual."},
                                           {"lm_head.", "language_model.lm_head."},
                                           {"model.language_model.", "language_model.model."},
                                           {NULL, NULL}};

static const struct {
  const char *architecture;
  const Prefix *prefixes;
} mappers[] = {
    {"Qwen3_5MoeForConditionalGeneration", qwen3_vl_prefixes},
    {"Qwen3_5ForConditionalGeneration", qwen3_vl_prefixes},
};

static const Prefix *
prefixes_of(WsyncModel *model)
{
  const char *architecture = wsync_model_get_architecture(model);

  for (guint i = 0; i < G_N_ELEMENTS(mappers); i++)
    if (g_strcmp0(architecture, mappers[i].architecture) == 0)
      return mappers[i].prefixes;
  return NULL;
}

/* Architectures vLLM registers whose parameter names this backend does not know, so it
 * would write (or read) names the class does not hold: vLLM's text-only Qwen3.5 classes
 * (vllm/model_executor/models/registry.py:208-209 @ df1376907b16, since #50210 of
 * 2026-07-29, after the 0.24.0 cut; their loader strips `model.language_model.` to
 * `model.`, qwen3_5.py:318-323, and holds no `language_model.` or `visual.` prefix,
 * docs/vllm.md §9.6).  The bundled model plugins refuse a config naming a class they do
 * not describe (wsync_model_accept_architecture()); a plugin that uses the legacy
 * wsync_model_set_architecture() passes config.json's architectures[0] whatever it
 * names, and without a row in mappers[] the names would pass unchanged, and
 * sharded_state would refuse them.  The old tree wrote such files, exit 0. */
static const char *const unnamed_architectures[] = {"Qwen3_5ForCausalLM",
                                                    "Qwen3_5MoeForCausalLM"};

/* config.json as the core names it in errors (its path), for the refusals below; the
 * bare name when the model was not described from a file. */
static const char *
config_name(WsyncModel *model)
{
  const char *name = wsync_model_get_config_name(model);

  return name != NULL ? name : "config.json";
}

static gboolean
check_names_known(WsyncModel *model, GError **error)
{
  const char *architecture = wsync_model_get_architecture(model);

  for (guint i = 0; i < G_N_ELEMENTS(unnamed_architectures); i++)
    if (g_strcmp0(architecture, unnamed_architectures[i]) == 0)
      return wsync_fail(error, WSYNC_ERROR_BAD_INPUT,
                        "%s: field \"architectures\" begins with \"%s\": the vllm "
                        "targets do not know the parameter names of vLLM's %s (a text-only "
                        "Qwen3.5 class); of Qwen3.5 they support "
                        "\"Qwen3_5MoeForConditionalGeneration\" and "
                        "\"Qwen3_5ForConditionalGeneration\"",
                        config_name(model), architecture, architecture);
  return TRUE;
}

/* Architectures whose attention vLLM builds with `o_proj = RowParallelLinear(...,
 * bias=False)` whatever attention_bias says, the q/k/v bias alone following it
 * (`qkv_bias=getattr(config, "attention_bias", False)`), and whose loader ignores the
 * checkpoint's o_proj.bias as an unexpected `.bias` (docs/vllm.md §8 "Biases"; in every
 * release since Qwen3 came, #15289).  Transformers' Qwen3Attention has the o_proj bias
 * (docs/hf-checkpoints.md §2). */
static const char *const no_o_proj_bias[] = {"Qwen3ForCausalLM", "Qwen3MoeForCausalLM"};

static gboolean
drops_o_proj_bias(WsyncModel *model)
{
  for (guint i = 0; i < G_N_ELEMENTS(no_o_proj_bias); i++)
    if (g_strcmp0(wsync_model_get_architecture(model), no_o_proj_bias[i]) == 0)
      return TRUE;
  return FALSE;
}

/* Architectures whose vLLM model runs its gated MLPs with SiluAndMul alone, whatever
 * `hidden_act` says: their MLP classes raise `ValueError(f"Unsupported activation:
 * {hidden_act}. Only silu is supported for now.")` when built with anything else, so
 * vLLM does not start from the files (docs/vllm.md §2 "Activation").  Transformers runs
 * any ACT2FN activation, so the model plugins take the field as it is; this rule is
 * vLLM's.  vLLM-Ascend builds the same classes (docs/vllm-ascend.md §7 "Model
 * classes"). */
#define UNSUPPORTED " raises \"Unsupported activation\" "
#define NO_START ": vLLM would not start from these files"
static const struct {
  const char *architecture;
  const char *why; /* what vLLM does with another activation, at df1376907b16 */
} silu_only[] = {
    {"LlamaForCausalLM",
     "its MLP, LlamaMLP," UNSUPPORTED "(vllm/model_executor/models/llama.py:110-113)" NO_START},
    {"Qwen3ForCausalLM", "its MLP, Qwen2MLP," UNSUPPORTED
                         "(vllm/model_executor/models/qwen2.py:104-107)" NO_START},
    /* a Qwen3-MoE whose every layer is sparse builds no Qwen3MoeMLP and starts, but its
     * routed experts run FusedMoE's default "silu" (fused_moe/layer.py:115): not what
     * the config says either.  The message says both, as wsync does not tell which. */
    {"Qwen3MoeForCausalLM",
     "the MLP of a dense layer, Qwen3MoeMLP," UNSUPPORTED
     "(vllm/model_executor/models/qwen3_moe.py:112-115), and the routed experts run silu "
     "whatever hidden_act says (FusedMoE's default, "
     "vllm/model_executor/layers/fused_moe/layer.py:115): vLLM would not start from these "
     "files, or would run them with another activation than the config's"},
    {"Qwen3_5ForConditionalGeneration", "its MLP, Qwen2MoeMLP," UNSUPPORTED
                                        "(vllm/model_executor/models/qwen2_moe.py:103-106)"
                                        NO_START},
    {"Qwen3_5MoeForConditionalGeneration", "its shared expert, Qwen2MoeMLP," UNSUPPORTED
                                           "(vllm/model_executor/models/qwen2_moe.py:103-106)"
                                           NO_START},
};

/* hidden_act, read where vLLM reads it (hf_text_config: text_config, else the root),
 * must be "silu" for the architectures above; absent, each config class's default is
 * "silu".  The old tree wrote rank files vLLM would not start from. */
static gboolean
check_activation(WsyncModel *model, GError **error)
{
  const char *architecture = wsync_model_get_architecture(model);
  const char *act = "silu";
  WsyncConfigSection text;

  for (guint i = 0; i < G_N_ELEMENTS(silu_only); i++) {
    if (g_strcmp0(architecture, silu_only[i].architecture) != 0)
      continue;
    if (!wsync_model_config_section(model, "text_config", TRUE, &text) ||
        !wsync_config_get_string_or(&text, "hidden_act", &act, error))
      return FALSE;
    if (strcmp(act, "silu") == 0)
      return TRUE;
    g_autofree char *printable = g_strescape(act, NULL);
    return wsync_fail(error, WSYNC_ERROR_BAD_INPUT,
                      "%s: field \"%shidden_act\" is \"%s\", but vLLM's %s accepts "
                      "only \"silu\": %s",
                      config_name(model), text.where, printable, architecture,
                      silu_only[i].why);
  }
  return TRUE;
}

/* Config fields that vLLM's model reads differently from Transformers' class of the same
 * architecture, so that it holds other parameters than a Hugging Face checkpoint of that
 * config has (the model plugins describe the checkpoint as Transformers builds it).  The
 * rank files could only leave parameters out or drop trained ones: sharded_state refuses
 * missing keys (§6), a live update leaves them as vLLM initialised them. */
#define NO_CHECKPOINT_HOLDS                                                                     \
  ", which Transformers' model does not have and no checkpoint of it holds"
#define BUILDS_LAYER_SCALE                                                                      \
  "then builds attn_layer_scale and ffn_layer_scale in every layer "                           \
  "(vllm/model_executor/models/qwen3_5.py:189-204)" NO_CHECKPOINT_HOLDS
#define BUILDS_QKV_BIAS                                                                         \
  "then builds a qkv_proj.bias in every full-attention layer "                                 \
  "(vllm/model_executor/models/qwen3_next.py:252)" NO_CHECKPOINT_HOLDS
#define IGNORES_ATTENTION_BIAS                                                                  \
  "builds none of the q/k/v_proj and o_proj biases Transformers' model then has (it reads "    \
  "qkv_bias, and its o_proj has no bias: vllm/model_executor/models/qwen3_next.py:252, 260), " \
  "so it would run without the checkpoint's trained biases"
static const struct {
  const char *architecture;
  const char *field;   /* read where vLLM reads it: text_config, else the root */
  const char *problem; /* what vLLM does when it is true or above 0, and where */
  gboolean kernel_ok;  /* vLLM's initial value is what the checkpoint means: a live
                        * update without them computes what Transformers computes */
  gboolean compared;   /* vLLM tests `getattr(config, FIELD, 0) > 0`, not the value's
                        * truth (`if getattr(config, FIELD, False)`, `bias=` of a layer) */
} vllm_config_divergences[] = {
    /* Transformers' Qwen3-MoE has no shared expert (docs/hf-checkpoints.md §2) */
    {"Qwen3MoeForCausalLM", "shared_expert_intermediate_size",
     "then builds a shared expert and its gate in every MoE layer "
     "(vllm/model_executor/models/qwen3_moe.py:176-197)" NO_CHECKPOINT_HOLDS,
     FALSE, TRUE},
    /* zeros, applied as x * (1 + scale) (qwen3_next.py:498-506): the identity;
     * Qwen3_5(Moe)TextConfig has no layer_scale field (docs/hf-checkpoints.md §3) */
    {"Qwen3_5ForConditionalGeneration", "layer_scale", BUILDS_LAYER_SCALE, TRUE, FALSE},
    {"Qwen3_5MoeForConditionalGeneration", "layer_scale", BUILDS_LAYER_SCALE, TRUE, FALSE},
    /* Transformers' Qwen3.5 attention reads attention_bias (all four projections) and
     * not qkv_bias; vLLM's Qwen3NextAttention the reverse (docs/vllm.md §9.2) */
    {"Qwen3_5ForConditionalGeneration", "qkv_bias", BUILDS_QKV_BIAS, FALSE, FALSE},
    {"Qwen3_5MoeForConditionalGeneration", "qkv_bias", BUILDS_QKV_BIAS, FALSE, FALSE},
    {"Qwen3_5ForConditionalGeneration", "attention_bias", IGNORES_ATTENTION_BIAS, FALSE, FALSE},
    {"Qwen3_5MoeForConditionalGeneration", "attention_bias", IGNORES_ATTENTION_BIAS, FALSE,
     FALSE},
};

/* Whether vLLM builds what @node, a config field's value (NULL: absent), asks for: with
 * @compared, `value > 0` (a string or a list, which Python cannot compare with 0 and
 * vLLM fails on, counts as asking); otherwise Python's truth of the value, as
 * `if getattr(config, FIELD, False)` tests it: false, 0, "", [], {} and null are false,
 * and a negative number is true (the old test, `> 0` for every field, let a
 * "layer_scale": -1 through, for which vLLM builds the scales). */
static gboolean
vllm_builds_for(JsonNode *node, gboolean compared)
{
  GType type;

  if (node == NULL || JSON_NODE_HOLDS_NULL(node))
    return FALSE;
  if (JSON_NODE_HOLDS_OBJECT(node))
    return compared || json_object_get_size(json_node_get_object(node)) > 0;
  if (JSON_NODE_HOLDS_ARRAY(node))
    return compared || json_array_get_length(json_node_get_array(node)) > 0;
  type = json_node_get_value_type(node);
  if (type == G_TYPE_BOOLEAN)
    return json_node_get_boolean(node);
  if (type == G_TYPE_INT64)
    return compared ? json_node_get_int(node) > 0 : json_node_get_int(node) != 0;
  if (type == G_TYPE_DOUBLE)
    return compared ? json_node_get_double(node) > 0 : json_node_get_double(node) != 0;
  return compared || *json_node_get_string(node) != '\0';
}

/* The old tree ignored these fields and wrote rank files vLLM refuses or runs wrong. */
static gboolean
check_config_divergences(WsyncModel *model, gboolean kernel, GError **error)
{
  const char *architecture = wsync_model_get_architecture(model);
  WsyncConfigSection text;

  for (guint i = 0; i < G_N_ELEMENTS(vllm_config_divergences); i++) {
    if (g_strcmp0(architecture, vllm_config_divergences[i].architecture) != 0 ||
        (kernel && vllm_config_divergences[i].kernel_ok) ||
        !wsync_model_config_section(model, "text_config", TRUE, &text))
      continue;
    JsonNode *node = json_object_get_member(text.object, vllm_config_divergences[i].field);
    if (!vllm_builds_for(node, vllm_config_divergences[i].compared))
      continue;
    g_autofree char *value = json_to_string(node, FALSE);
    return wsync_fail(error, WSYNC_ERROR_BAD_INPUT,
                      "%s: field \"%s%s\" is %s: vLLM's %s %s; %s accepts only 0, "
                      "false or absent",
                      config_name(model), text.where, vllm_config_divergences[i].field, value,
                      architecture, vllm_config_divergences[i].problem,
                      kernel ? "--format kernel" : "--format sharded-state");
  }
  return TRUE;
}

/* The rules on what vLLM builds from the config (check_activation(),
 * check_config_divergences()) are for files vLLM is to load: they apply when writing.
 * Rank files read back are translated to the checkpoint they hold, which vLLM never
 * loads: what they lack or hold beyond the model is refused by the reader (unmapped
 * inputs, uncovered outputs), and the hf targets take these configs.  Refusing them
 * there left the owner of rank files an earlier wsync wrote from such a config (exit 0)
 * with no way back to the checkpoint. */
static gboolean
check_vllm_builds_it(const Rank *r, GError **error)
{
  WsyncModel *model = wsync_layout_get_model(r->layout);

  if (wsync_layout_is_reading(r->layout))
    return TRUE;
  return check_activation(model, error) && check_config_divergences(model, r->kernel, error);
}

/* A published name (or module path) as vLLM names it. */
static char *
runtime_of(const Prefix *prefixes, const char *name)
{
  char *key = g_strdup(name);

  for (guint i = 0; prefixes != NULL && prefixes[i].from != NULL; i++)
    if (g_str_has_prefix(key, prefixes[i].from)) {
      char *mapped = g_strconcat(prefixes[i].to, key + strlen(prefixes[i].from), NULL);
      g_free(key);
      key = mapped;
    }
  return key;
}

/* ------------------------------------------------------------------ packing */

/* Where a packed tensor lives under its block's module. */
typedef enum {
  UNDER_BLOCK,  /* MODULE.LEAF.<weight|bias> */
  UNDER_SHARED, /* MODULE.<era's shared expert module>LEAF.<weight|bias> */
  UNDER_ROUTED, /* MODULE.<era's routed experts module>LEAF */
} Under;

/* vLLM's packed_modules (stacked_params_mapping, fused expert mapping): the params of a
 * block that one runtime tensor holds, in order (§2, §4, §9). */
typedef struct {
  WsyncRole lead;
  WsyncRole rest[2]; /* NONE-terminated */
  Under under;
  const char *leaf;
} Pack;

static const Pack packs[] = {
    {WSYNC_ROLE_Q, {WSYNC_ROLE_K, WSYNC_ROLE_V}, UNDER_BLOCK, "qkv_proj"},
    {WSYNC_ROLE_GATE, {WSYNC_ROLE_UP, WSYNC_ROLE_NONE}, UNDER_BLOCK, "gate_up_proj"},
    {WSYNC_ROLE_SHARED_GATE, {WSYNC_ROLE_SHARED_UP, WSYNC_ROLE_NONE}, UNDER_SHARED,
     "gate_up_proj"},
    {WSYNC_ROLE_LINEAR_QKV, {WSYNC_ROLE_LINEAR_Z, WSYNC_ROLE_NONE}, UNDER_BLOCK, "in_proj_qkvz"},
    {WSYNC_ROLE_LINEAR_B, {WSYNC_ROLE_LINEAR_A, WSYNC_ROLE_NONE}, UNDER_BLOCK, "in_proj_ba"},
    {WSYNC_ROLE_EXPERTS_GATE, {WSYNC_ROLE_EXPERTS_UP, WSYNC_ROLE_NONE}, UNDER_ROUTED,
     "w13_weight"},
};

/* Tensors of their own that vLLM names by its module structure. */
typedef struct {
  WsyncRole role;
  Under under;
  const char *leaf;
} Named;

static const Named named[] = {
    {WSYNC_ROLE_SHARED_DOWN, UNDER_SHARED, "down_proj.weight"},
    {WSYNC_ROLE_SHARED_EXPERT_GATE, UNDER_SHARED, "expert_gate.weight"},
    {WSYNC_ROLE_EXPERTS_DOWN, UNDER_ROUTED, "w2_weight"},
};

static const Pack *
pack_led_by(WsyncRole role)
{
  for (guint i = 0; i < G_N_ELEMENTS(packs); i++)
    if (packs[i].lead == role)
      return &packs[i];
  return NULL;
}

/* TRUE when @role is packed into a tensor another role leads. */
static gboolean
packed_into_another(WsyncRole role)
{
  for (guint i = 0; i < G_N_ELEMENTS(packs); i++)
    for (guint k = 0; k < G_N_ELEMENTS(packs[i].rest); k++)
      if (packs[i].rest[k] == role && role != WSYNC_ROLE_NONE)
        return TRUE;
  return FALSE;
}

/* ------------------------------------------------------------------ one runtime tensor */

/* What one runtime tensor is made of: the parts of the params packed into it. */
typedef struct {
  const WsyncParam *param; /* the (leading) param it is recorded for */
  WsyncParamKind kind;
  guint n_parts;
  WsyncPart parts[WSYNC_PARAM_MAX_PARTS];
  char *name;
  WsyncDtype dtype;
} Runtime;

/* A param the model plugin declared wrongly for its kind (a bug, not the user's). */
static gboolean
param_error(GError **error, const Runtime *rt, const char *problem)
{
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_FAILED, "vllm: param %s: %s", rt->param->name,
              problem);
  return FALSE;
}

/* Number of axis-0 indices of a part, checked against its logical tensor. */
static gboolean
part_rows(const Runtime *rt, const WsyncPart *part, guint64 *rows, GError **error)
{
  const guint64 *shape = wsync_logical_get_shape(part->lt);

  if (wsync_logical_get_ndim(part->lt) == 0)
    return param_error(error, rt, "a part is a scalar where rows were expected");
  if (part->start > shape[0] || part->length > shape[0] - part->start)
    return param_error(error, rt, "a part's rows lie outside its logical tensor");
  *rows = part->length != 0 ? part->length : shape[0] - part->start;
  return TRUE;
}

/* Adds the runtime tensor, recorded as its leading param's. */
static WsyncLayoutTensor *
add_tensor(Rank *r, const Runtime *rt, guint ndim, const guint64 *shape, GError **error)
{
  WsyncLayoutTensor *tensor =
      wsync_layout_add_tensor(r->layout, rt->name, rt->dtype, ndim, shape, error);

  if (tensor != NULL)
    wsync_layout_tensor_set_param(tensor, rt->param);
  return tensor;
}

/* The box of rows [row, row + rows) of @lt, every other axis whole. */
static void
rows_box(WsyncBox *box, WsyncLogicalTensor *lt, guint64 row, guint64 rows)
{
  wsync_box_whole(box, wsync_logical_get_ndim(lt), wsync_logical_get_shape(lt));
  box->offset[0] = row;
  box->extent[0] = rows;
}

/* ------------------------------------------------------------------ REPLICATED */

/* ReplicatedLinear, RMSNorm, the router (§2): every rank holds the whole tensor; several
 * parts are concatenated along axis 0. */
static gboolean
emit_replicated(Rank *r, const Runtime *rt, GError **error)
{
  WsyncLogicalTensor *first = rt->parts[0].lt;
  guint ndim = wsync_logical_get_ndim(first);
  guint64 shape[WSYNC_MAX_DIMS], at[WSYNC_MAX_DIMS] = {0}, rows[WSYNC_PARAM_MAX_PARTS];
  WsyncLayoutTensor *tensor;
  WsyncBox box;

  memcpy(shape, wsync_logical_get_shape(first), sizeof(guint64) * ndim);
  if (ndim == 0) { /* a scalar: one part, whole */
    if (rt->n_parts != 1)
      return param_error(error, rt, "several scalar parts cannot be concatenated");
    if ((tensor = add_tensor(r, rt, 0, shape, error)) == NULL)
      return FALSE;
    wsync_box_whole(&box, 0, shape);
    wsync_layout_place_at(r->layout, tensor, first, &box, at);
    return TRUE;
  }
  shape[0] = 0;
  for (guint p = 0; p < rt->n_parts; p++) {
    if (!part_rows(rt, &rt->parts[p], &rows[p], error))
      return FALSE;
    shape[0] += rows[p];
  }
  if ((tensor = add_tensor(r, rt, ndim, shape, error)) == NULL)
    return FALSE;
  for (guint p = 0; p < rt->n_parts; p++) {
    rows_box(&box, rt->parts[p].lt, rt->parts[p].start, rows[p]);
    wsync_layout_place_at(r->layout, tensor, rt->parts[p].lt, &box, at);
    at[0] += rows[p];
  }
  return TRUE;
}

/* ------------------------------------------------------------------ COLUMN */

/* The rows of one part that tp rank r->t holds (§2).
 *
 * Plain split (ColumnParallelLinear, MergedColumnParallelLinear, the q shard of
 * QKVParallelLinear): the part's n units are divided evenly, rank t holds units
 * [t*n/tp, (t+1)*n/tp).
 *
 * KV replication (QKVParallelLinear k/v shards, linear.py): when tp > n,
 * num_kv_head_replicas = tp/n and `shard_rank = tp_rank // num_kv_head_replicas`: rank t
 * holds the one unit t / (tp/n). */
static gboolean
column_share(Rank *r, const Runtime *rt, const WsyncPart *part, guint64 *first_row,
             guint64 *rows, GError **error)
{
  guint64 total, unit = part->unit != 0 ? part->unit : 1, n;
  const char *name = wsync_logical_get_name(part->lt);

  if (!part_rows(rt, part, &total, error))
    return FALSE;
  if (total == 0 || total % unit != 0)
    return param_error(error, rt, "a part's rows are not a whole number of units");
  n = total / unit;
  if (part->replicate && r->tp > n && r->tp % n == 0) {
    *first_row = part->start + (r->t / (r->tp / n)) * unit;
    *rows = unit;
    return TRUE;
  }
  if (n % r->tp != 0) { /* (also every tp > n that replication could not take) */
    g_autofree char *hint =
        part->replicate
            ? g_strdup_printf(" (replicating needs tp to be a multiple of %" G_GUINT64_FORMAT ")",
                              n)
            : g_strdup("");
    /* a part that is only some rows of its tensor (q, k, v of in_proj_qkv) says which */
    g_autofree char *rows_of =
        total != wsync_logical_get_shape(part->lt)[0]
            ? g_strdup_printf(" (rows %" G_GUINT64_FORMAT ":%" G_GUINT64_FORMAT ")", part->start,
                              part->start + total)
            : g_strdup("");
    return wsync_fail(error, WSYNC_ERROR_USAGE,
                      "tp %u does not divide the %" G_GUINT64_FORMAT " units of %" G_GUINT64_FORMAT
                      " rows (%" G_GUINT64_FORMAT " rows in all) of %s%s%s",
                      r->tp, n, unit, total, name, rows_of, hint);
  }
  *first_row = part->start + r->t * (n / r->tp) * unit;
  *rows = n / r->tp * unit;
  return TRUE;
}

/* Per-rank packing: the parts' shares concatenated in order, e.g. qkv_proj = [q_t | k_t
 * | v_t], gate_up_proj = [gate_t | up_t] (§2; gate first, §8).  Trailing axes whole. */
static gboolean
emit_column(Rank *r, const Runtime *rt, GError **error)
{
  guint ndim = wsync_logical_get_ndim(rt->parts[0].lt);
  guint64 shape[WSYNC_MAX_DIMS], at[WSYNC_MAX_DIMS] = {0};
  guint64 first[WSYNC_PARAM_MAX_PARTS], rows[WSYNC_PARAM_MAX_PARTS];
  WsyncLayoutTensor *tensor;

  if (ndim == 0)
    return param_error(error, rt, "a column-parallel param cannot be a scalar");
  memcpy(shape, wsync_logical_get_shape(rt->parts[0].lt), sizeof(guint64) * ndim);
  shape[0] = 0;
  for (guint p = 0; p < rt->n_parts; p++) {
    const WsyncLogicalTensor *lt = rt->parts[p].lt;
    if (wsync_logical_get_ndim(lt) != ndim ||
        memcmp(wsync_logical_get_shape(lt) + 1, shape + 1, sizeof(guint64) * (ndim - 1)) != 0)
      return param_error(error, rt, "its parts differ beyond axis 0");
    if (!column_share(r, rt, &rt->parts[p], &first[p], &rows[p], error))
      return FALSE;
    shape[0] += rows[p];
  }
  if ((tensor = add_tensor(r, rt, ndim, shape, error)) == NULL)
    return FALSE;
  for (guint p = 0; p < rt->n_parts; p++) {
    WsyncBox box;
    rows_box(&box, rt->parts[p].lt, first[p], rows[p]);
    wsync_layout_place_at(r->layout, tensor, rt->parts[p].lt, &box, at);
    at[0] += rows[p];
  }
  return TRUE;
}

/* ------------------------------------------------------------------ ROW */

/* RowParallelLinear (§2): rank t holds columns [t*C/tp, (t+1)*C/tp) of the last axis
 * (`input_size_per_partition = divide(input_size, tp_size)`, linear.py). */
static gboolean
emit_row(Rank *r, const Runtime *rt, GError **error)
{
  const WsyncPart *part = &rt->parts[0];
  guint ndim = wsync_logical_get_ndim(part->lt);
  guint64 shape[WSYNC_MAX_DIMS], at[WSYNC_MAX_DIMS] = {0}, rows, cols;
  WsyncLayoutTensor *tensor;
  WsyncBox box;

  if (rt->n_parts != 1)
    return param_error(error, rt, "a row-parallel param has exactly one part");
  if (!part_rows(rt, part, &rows, error))
    return FALSE;
  rows_box(&box, part->lt, part->start, rows);
  /* (Of a 1-D part, the part's rows are the columns.) */
  cols = box.extent[ndim - 1];
  if (cols % r->tp != 0)
    return wsync_fail(error, WSYNC_ERROR_USAGE,
                      "tp %u does not divide the %" G_GUINT64_FORMAT " columns of %s", r->tp, cols,
                      wsync_logical_get_name(part->lt));
  box.offset[ndim - 1] += r->t * (cols / r->tp);
  box.extent[ndim - 1] = cols / r->tp;
  memcpy(shape, box.extent, sizeof(guint64) * ndim);
  if ((tensor = add_tensor(r, rt, ndim, shape, error)) == NULL)
    return FALSE;
  wsync_layout_place_at(r->layout, tensor, part->lt, &box, at);
  return TRUE;
}

/* ------------------------------------------------------------------ VOCAB */

/* VocabParallelEmbedding / ParallelLMHead (§3, vocab_parallel_embedding.py): the V
 * rows are padded to Vp = ceil(V/64)*64 (pad_vocab_size), rank t holds rows
 * [t*Vp/tp, (t+1)*Vp/tp) of the padded table, and rows >= V are zero
 * (`param[loaded_weight.shape[0]:].data.fill_(0)`). */
static gboolean
emit_vocab(Rank *r, const Runtime *rt, GError **error)
{
  static const guint8 zero[16] = {0};
  const WsyncPart *part = &rt->parts[0];
  guint ndim = wsync_logical_get_ndim(part->lt);
  guint64 shape[WSYNC_MAX_DIMS], at[WSYNC_MAX_DIMS] = {0}, vocab, padded, lo, hi, real_end;
  gsize esize = wsync_dtype_size(rt->dtype);
  WsyncLayoutTensor *tensor;
  WsyncBox box;

  if (rt->n_parts != 1)
    return param_error(error, rt, "a vocabulary param has exactly one part");
  if (!part_rows(rt, part, &vocab, error))
    return FALSE;
  if (esize == 0 || esize > sizeof(zero))
    return param_error(error, rt, "its dtype cannot be padded element by element");
  padded = (vocab + VOCAB_PADDING - 1) / VOCAB_PADDING * VOCAB_PADDING;
  if (padded % r->tp != 0)
    return wsync_fail(error, WSYNC_ERROR_USAGE,
                      "tp %u does not divide the padded vocabulary of %" G_GUINT64_FORMAT
                      " rows of %s",
                      r->tp, padded, wsync_logical_get_name(part->lt));
  lo = r->t * (padded / r->tp);
  hi = lo + padded / r->tp;
  real_end = MIN(hi, vocab);
  memcpy(shape, wsync_logical_get_shape(part->lt), sizeof(guint64) * ndim);
  shape[0] = hi - lo;
  if ((tensor = add_tensor(r, rt, ndim, shape, error)) == NULL)
    return FALSE;
  if (real_end > lo) {
    rows_box(&box, part->lt, part->start + lo, real_end - lo);
    wsync_layout_place_at(r->layout, tensor, part->lt, &box, at);
  }
  if (hi > vocab) {
    wsync_box_whole(&box, ndim, shape);
    box.offset[0] = MAX(lo, vocab) - lo;
    box.extent[0] = hi - MAX(lo, vocab);
    wsync_layout_fill(r->layout, tensor, &box, zero, esize,
                      "vocabulary padding to a multiple of 64");
  }
  return TRUE;
}

/* ------------------------------------------------------------------ experts */

/* The global experts a rank holds (§4, fused_moe/expert_map_manager.py
 * determine_expert_map, strategy "linear", no redundant experts): contiguous blocks,
 * the remainder one each to the LOWEST ranks.  Without EP every rank holds all. */
typedef struct {
  guint64 first;  /* first global expert (index into the part) */
  guint64 count;  /* E_loc */
  guint64 ip;     /* intermediate rows per expert on this rank */
  guint64 ip_off; /* first of them in the checkpoint's intermediate axis */
} ExpertShare;

static gboolean
expert_share(Rank *r, const Runtime *rt, guint64 experts, guint64 inter, ExpertShare *share,
             GError **error)
{
  const char *module = wsync_block_get_module(rt->param->block);

  /* The MoE blocks of the model classes vLLM runs these models with raise
   * ValueError("Tensor parallel size N is greater than the number of experts E") at
   * init, with EP or without (Qwen3MoeSparseMoeBlock, qwen3_moe.py:151-155;
   * Qwen3NextSparseMoeBlock, also Qwen3.5's, qwen3_next.py:109-113 @ df1376907b16; the
   * same since era A, qwen3_moe.py:141 @ 344a0017c06e; docs/vllm.md §4). */
  if (r->tp > experts)
    return wsync_fail(error, WSYNC_ERROR_USAGE,
                      "tp %u is more than the %" G_GUINT64_FORMAT
                      " experts of %s.experts: vLLM refuses a tensor-parallel size greater "
                      "than the number of experts",
                      r->tp, experts, module);
  if (r->ep > 1) {
    /* FusedMoEParallelConfig.make (fused_moe/config.py): with EP the MoE tp size is 1,
     * so experts are whole (Ip = I). */
    guint64 base = experts / r->ep, rem = experts % r->ep;
    share->count = base + (r->rank < rem ? 1 : 0);
    share->first = r->rank * base + MIN(r->rank, rem);
    share->ip = inter;
    share->ip_off = 0;
    if (share->count == 0)
      return wsync_fail(error, WSYNC_ERROR_USAGE,
                        "ep %u is more than the %" G_GUINT64_FORMAT
                        " experts of %s.experts: rank %u would hold none",
                        r->ep, experts, module, r->rank);
    /* vLLM-Ascend sizes every EP rank for E // ep experts while the upstream map gives
     * the lowest ranks one more: those fail to load (0.18 to 0.23) or refuse at init
     * ("EPLB local expert capacity mismatch", 0.24 on) (docs/vllm-ascend.md §2). */
    if (r->ascend && rem != 0)
      return wsync_fail(error, WSYNC_ERROR_USAGE,
                        "ep %u does not divide the %" G_GUINT64_FORMAT
                        " experts of %s.experts: vLLM-Ascend runs only an even split of the "
                        "experts over the EP ranks",
                        r->ep, experts, module);
    return TRUE;
  }
  /* UnquantizedFusedMoEMethod.create_weights: intermediate_size_per_partition = I // tp
   * (`assert intermediate_size % self.tp_size == 0`, §4). */
  if (inter % r->tp != 0)
    return wsync_fail(error, WSYNC_ERROR_USAGE,
                      "tp %u does not divide the intermediate size %" G_GUINT64_FORMAT
                      " of the experts of %s.experts",
                      r->tp, inter, module);
  share->first = 0;
  share->count = experts;
  share->ip = inter / r->tp;
  share->ip_off = r->t * share->ip;
  return TRUE;
}

/* Checks that every part is a whole 3-D [E, a, b] stack of the same shape; returns E. */
static gboolean
expert_parts(const Runtime *rt, guint n_parts, guint64 *experts, GError **error)
{
  if (rt->n_parts != n_parts)
    return param_error(error, rt, n_parts == 2 ? "w13 experts need parts gate and up"
                                                 : "w2 experts need one part, down");
  for (guint p = 0; p < n_parts; p++) {
    guint64 rows;
    if (wsync_logical_get_ndim(rt->parts[p].lt) != 3)
      return param_error(error, rt, "expert parts must be 3-D [E, out, in]");
    if (!part_rows(rt, &rt->parts[p], &rows, error))
      return FALSE;
    if (p > 0 && rows != *experts)
      return param_error(error, rt, "its expert parts hold different numbers of experts");
    *experts = rows;
  }
  if (n_parts == 2 && memcmp(wsync_logical_get_shape(rt->parts[0].lt) + 1,
                             wsync_logical_get_shape(rt->parts[1].lt) + 1,
                             2 * sizeof(guint64)) != 0)
    return param_error(error, rt, "its gate and up parts differ in shape");
  return TRUE;
}

/* The expert map (§4, §6): with EP, FusedMoE registers determine_expert_map()'s result,
 * int32 [E] (no redundant experts), global expert e -> its local index on this rank, -1
 * where another rank holds it; in the releases that make it a persistent buffer
 * sharded_state saves it and insists on loading it.  A live update never sends it (a
 * buffer, not a parameter, §7).  Every element is a fill (a constant per box). */
static void
fill_i32(Rank *r, WsyncLayoutTensor *tensor, guint64 offset, guint64 extent, gint32 value,
         const char *reason)
{
  guint32 bits = GUINT32_TO_LE((guint32)value);
  guint8 bytes[sizeof(bits)];
  WsyncBox box = {.ndim = 1, .offset = {offset}, .extent = {extent}};

  if (extent == 0)
    return;
  memcpy(bytes, &bits, sizeof(bytes));
  wsync_layout_fill(r->layout, tensor, &box, bytes, sizeof(bytes), reason);
}

static gboolean
emit_expert_map(Rank *r, const Runtime *rt, guint64 experts, const ExpertShare *share,
                GError **error)
{
  g_autofree char *module = runtime_of(r->prefixes, wsync_block_get_module(rt->param->block));
  g_autofree char *name = NULL;
  guint64 shape[1] = {experts}, end = share->first + share->count;
  WsyncLayoutTensor *tensor;

  if (r->ep == 1 || r->kernel || r->release->map != MAP_PERSISTENT)
    return TRUE;
  name = g_strconcat(module, ".", r->naming->map_module, "_expert_map", NULL);
  tensor = wsync_layout_add_tensor(r->layout, name, WSYNC_DTYPE_I32, 1, shape, error);
  if (tensor == NULL)
    return FALSE;
  fill_i32(r, tensor, 0, share->first, -1, "vLLM expert map: held by another rank");
  for (guint64 j = 0; j < share->count; j++)
    fill_i32(r, tensor, share->first + j, 1, (gint32)j, "vLLM expert map: local index");
  fill_i32(r, tensor, end, experts - end, -1, "vLLM expert map: held by another rank");
  return TRUE;
}

/* The layout of the routed experts the files hold: the backend's in vLLM's kernel format;
 * the loader layout in the sharded-state format (vLLM re-lays it after loading) and on
 * vLLM-Ascend, whose platform is out of tree, so vLLM's oracle never reads --moe-backend
 * there (§4). */
static MoeBackend
moe_layout(const Rank *r)
{
  return r->kernel && !r->ascend ? r->moe_backend : MOE_TRITON;
}

#define TRTLLM_REFUSAL                                                                       \
  "moe-backend flashinfer-trtllm: FlashInfer TRTLLM re-lays the routed experts into its "   \
  "block layout after loading, which --format kernel does not write (docs/vllm.md §4); "    \
  "start vLLM with --moe-backend triton (before v0.24 VLLM_USE_FLASHINFER_MOE_FP16=0) or " \
  "--moe-backend flashinfer_cutlass and set moe-backend to match"

/* w13_weight [E_loc, 2*Ip, H] (§4 create_weights, `_load_w13`): for local expert j
 * (global e), rows [0, Ip) are gate_e[ip_off : ip_off+Ip] ("w1" -> first half) and rows
 * [Ip, 2Ip) are up_e[...] ("w3" -> second half).  One placement per part covers every
 * local expert: the box [first:first+E_loc, ip_off:ip_off+Ip, 0:H] lands with strides
 * {2Ip*H, H, 1} at origin 0 (gate) or Ip*H (up).  The kernel format for FlashInfer
 * CUTLASS swaps the halves of each expert, up first, as its swap_w13_to_w31 does (§4):
 * the same boxes, the other origins. */
static gboolean
emit_experts_w13(Rank *r, const Runtime *rt, GError **error)
{
  const guint64 *gate = wsync_logical_get_shape(rt->parts[0].lt);
  guint64 experts = 0, shape[3], at[3] = {0, 0, 0};
  WsyncLayoutTensor *tensor;
  ExpertShare share;

  gboolean up_first = moe_layout(r) == MOE_FLASHINFER_CUTLASS;

  if (moe_layout(r) == MOE_FLASHINFER_TRTLLM)
    return wsync_fail(error, WSYNC_ERROR_USAGE, "vllm: %s: " TRTLLM_REFUSAL, rt->name);
  if (!expert_parts(rt, 2, &experts, error) ||
      !expert_share(r, rt, experts, gate[1], &share, error))
    return FALSE;
  shape[0] = share.count;
  shape[1] = 2 * share.ip;
  shape[2] = gate[2];
  if ((tensor = add_tensor(r, rt, 3, shape, error)) == NULL)
    return FALSE;
  for (guint p = 0; p < 2; p++) { /* gate, then up */
    const WsyncPart *part = &rt->parts[p];
    WsyncBox box;
    wsync_box_whole(&box, 3, wsync_logical_get_shape(part->lt));
    box.offset[0] = part->start + share.first;
    box.extent[0] = share.count;
    box.offset[1] = share.ip_off;
    box.extent[1] = share.ip;
    at[1] = (up_first ? 1 - p : p) * share.ip;
    wsync_layout_place_at(r->layout, tensor, part->lt, &box, at);
  }
  return emit_expert_map(r, rt, experts, &share, error);
}

/* w2_weight [E_loc, H, Ip] (§4): w2 is narrowed along its input axis, so local expert j
 * (global e) holds down_e[:, ip_off : ip_off+Ip]. */
static gboolean
emit_experts_w2(Rank *r, const Runtime *rt, GError **error)
{
  const WsyncPart *part = &rt->parts[0];
  const guint64 *down = wsync_logical_get_shape(part->lt);
  guint64 experts = 0, shape[3], at[3] = {0, 0, 0};
  WsyncLayoutTensor *tensor;
  ExpertShare share;
  WsyncBox box;

  if (!expert_parts(rt, 1, &experts, error) ||
      !expert_share(r, rt, experts, down[2], &share, error))
    return FALSE;
  shape[0] = share.count;
  shape[1] = down[1];
  shape[2] = share.ip;
  if ((tensor = add_tensor(r, rt, 3, shape, error)) == NULL)
    return FALSE;
  wsync_box_whole(&box, 3, down);
  box.offset[0] = part->start + share.first;
  box.extent[0] = share.count;
  box.offset[2] = share.ip_off;
  box.extent[2] = share.ip;
  wsync_layout_place_at(r->layout, tensor, part->lt, &box, at);
  return TRUE;
}

/* ------------------------------------------------------------------ attention scales */

/* The scale buffers every full-attention layer registers as persistent buffers
 * (`set_default_quant_scales(layer, register_buffer=True)`,
 * vllm/model_executor/layers/attention/attention.py), float32 0-dim tensors of 1.0, which
 * ShardedStateLoader saves and insists on loading (§6).  Never in a live update. */
static gboolean
emit_attention_scales(Rank *r, const WsyncBlock *block, GError **error)
{
  static const char *const scales[] = {"._k_scale", "._v_scale", "._q_scale", "._prob_scale"};
  g_autofree char *module = runtime_of(r->prefixes, wsync_block_get_module(block));
  const float one = 1.0f;
  guint32 bits;
  guint8 value[sizeof(bits)];
  guint64 shape[1] = {0};
  WsyncBox box;

  if (r->kernel || !r->attn_scales)
    return TRUE;
  /* safetensors data is little-endian */
  memcpy(&bits, &one, sizeof(bits));
  bits = GUINT32_TO_LE(bits);
  memcpy(value, &bits, sizeof(value));
  wsync_box_whole(&box, 0, shape);
  for (guint i = 0; i < G_N_ELEMENTS(scales); i++) {
    g_autofree char *name = g_strconcat(module, ".attn", scales[i], NULL);
    WsyncLayoutTensor *tensor =
        wsync_layout_add_tensor(r->layout, name, WSYNC_DTYPE_F32, 0, shape, error);
    if (tensor == NULL)
      return FALSE;
    wsync_layout_fill(r->layout, tensor, &box, value, sizeof(value),
                      "vLLM attention scale buffer, 1.0");
  }
  return TRUE;
}

/* ------------------------------------------------------------------ naming */

/* MODULE.<under>LEAF in vLLM's names. */
static char *
name_under(const Rank *r, const WsyncBlock *block, Under under, const char *leaf)
{
  g_autofree char *module = runtime_of(r->prefixes, wsync_block_get_module(block));
  const NamingEra *era = r->naming;
  const char *middle = under == UNDER_SHARED ? era->shared
                       : under == UNDER_ROUTED ? era->routed
                                               : "";

  return g_strconcat(module, module[0] != '\0' ? "." : "", middle, leaf, NULL);
}

/* The router in the era's module structure. */
static char *
router_name(const Rank *r, const WsyncBlock *block)
{
  return name_under(r, block, UNDER_BLOCK, r->naming->router);
}

/* The alias rule, in one place: of the names vLLM registers a tensor under, the
 * lexicographically smallest (ShardedStateLoader keeps only that one, §6;
 * get_parameter resolves it as well as any other, §7).  @name is the one the module
 * structure gives; a param's aliases (a tied LM head) are the others. */
static char *
alias_winner(const Rank *r, const WsyncParam *param, char *name)
{
  for (guint i = 0; param->aliases != NULL && param->aliases[i] != NULL; i++) {
    g_autofree char *alias = runtime_of(r->prefixes, param->aliases[i]);
    if (strcmp(alias, name) < 0) {
      g_free(name);
      name = g_steal_pointer(&alias);
    }
  }
  return name;
}

/* The name of a tensor that holds @param alone. */
static char *
own_name(const Rank *r, const WsyncParam *param)
{
  char *name = NULL;

  if (param->role == WSYNC_ROLE_ROUTER)
    name = router_name(r, param->block);
  for (guint i = 0; name == NULL && i < G_N_ELEMENTS(named); i++)
    if (named[i].role == param->role)
      name = name_under(r, param->block, named[i].under, named[i].leaf);
  if (name == NULL)
    name = runtime_of(r->prefixes, param->name);
  return alias_winner(r, param, name);
}

/* ------------------------------------------------------------------ runtime tensors */

/* The dtype vLLM holds a tensor in: the source's, except where vLLM creates the
 * parameter in its own dtype (§9.3): A_log in float32 (vLLM #37810), RMSNormGated in the
 * model dtype; loading casts to it (§2 "Dtype on load").  The plan says which cast, if
 * any, that takes from the dtype the tensor is read in (a checkpoint may publish either
 * in BF16 or F32; the files then record the published dtype, see
 * wsync_logical_set_dtype_follows_input()).  The note names no layer: said once for every
 * layer, it stays one line of `wsync convert`'s output however deep the model. */
static WsyncDtype
runtime_dtype(Rank *r, const WsyncParam *param)
{
  WsyncDtype model = r->served;
  WsyncDtype source = wsync_logical_get_dtype(param->parts[0].lt);
  g_autofree char *note = NULL;

  if (param->role == WSYNC_ROLE_LINEAR_A_LOG) {
    note = source != WSYNC_DTYPE_F32
               ? g_strdup_printf("linear_attn.A_log of every linear-attention layer: vLLM "
                                 "holds A_log in float32 (vLLM #37810): the %s value is "
                                 "widened exactly",
                                 wsync_dtype_name(source))
               : g_strdup("linear_attn.A_log of every linear-attention layer: vLLM holds "
                          "A_log in float32 (vLLM #37810), as read");
    wsync_layout_add_note(r->layout, note);
    return WSYNC_DTYPE_F32;
  }
  if (param->role == WSYNC_ROLE_LINEAR_NORM) {
    note = source != model
               ? g_strdup_printf("linear_attn.norm.weight of every linear-attention layer: "
                                 "vLLM's RMSNormGated is created in the model dtype: the %s "
                                 "value is %s",
                                 wsync_dtype_name(source),
                                 model == WSYNC_DTYPE_F32
                                     ? "widened exactly"
                                     : model == WSYNC_DTYPE_BF16
                                           ? "rounded to BF16 to nearest-even, as torch's "
                                             "copy_ does"
                                           : "rounded to nearest-even, as torch's copy_ does")
               : g_strdup_printf("linear_attn.norm.weight of every linear-attention layer: "
                                 "vLLM's RMSNormGated is created in the model dtype, %s, "
                                 "as read",
                                 wsync_dtype_name(model));
    wsync_layout_add_note(r->layout, note);
    return model;
  }
  /* every other parameter is created in the model dtype (§2 "Dtype on load") */
  return is_float(source) ? model : source;
}

static void
add_parts(Runtime *rt, const WsyncParam *param)
{
  for (guint p = 0; p < param->n_parts && rt->n_parts < WSYNC_PARAM_MAX_PARTS; p++)
    rt->parts[rt->n_parts++] = param->parts[p];
}

/* The runtime tensor @param leads: alone, or packed with the params of its block that
 * the pack table lists (the same leaf: a bias packs with biases). */
static gboolean
runtime_of_param(Rank *r, const WsyncParam *param, Runtime *rt, GError **error)
{
  const Pack *pack = pack_led_by(param->role);
  const char *leaf = wsync_param_get_leaf(param);

  memset(rt, 0, sizeof *rt);
  rt->param = param;
  rt->kind = param->kind;
  rt->dtype = runtime_dtype(r, param);
  add_parts(rt, param);
  if (pack == NULL) {
    rt->name = own_name(r, param);
    return TRUE;
  }
  for (guint k = 0; k < G_N_ELEMENTS(pack->rest) && pack->rest[k] != WSYNC_ROLE_NONE; k++) {
    /* (the experts' stacks carry no weight/bias leaf: one of each role per block) */
    const WsyncParam *member = pack->under == UNDER_ROUTED
                                   ? wsync_block_get_param(param->block, pack->rest[k])
                                   : wsync_block_find_param(param->block, pack->rest[k], leaf);
    if (member == NULL || member->kind != param->kind) {
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_FAILED,
                  "vllm: param %s has no %s partner of its kind to pack with", param->name,
                  member == NULL ? "matching" : "");
      return FALSE;
    }
    add_parts(rt, member);
  }
  rt->name = name_under(r, param->block, pack->under, pack->leaf);
  if (pack->under != UNDER_ROUTED) { /* the experts' names carry no leaf */
    char *with_leaf = g_strconcat(rt->name, ".", leaf, NULL);
    g_free(rt->name);
    rt->name = with_leaf;
  }
  return TRUE;
}

typedef enum { SHARED_SLICED, SHARED_WHOLE, SHARED_NOT_KNOWN } SharedLayout;

static gboolean
is_shared_expert(const WsyncParam *param)
{
  return param->role == WSYNC_ROLE_SHARED_GATE || param->role == WSYNC_ROLE_SHARED_DOWN;
}

/* Whether vLLM's ParallelConfig.use_sequence_parallel_moe holds (§9.4): then the shared
 * expert MLP is built with disable_tp=is_sequence_parallel and every rank holds it whole;
 * else it is TP-sliced by rank % tp like any MLP (§4).  @why says why, for the plan (a
 * note) or, when the release's rule is not known for these settings, the error.  EP is
 * on and tp > 1. */
static SharedLayout
vllm_shared_layout(const Rank *r, const char *sizes, char **why)
{
  const SequenceParallelRule *rule = r->release->sp;
  const char *backend = r->all2all_backend;
  gboolean listed = g_strv_contains(rule->listed, backend);
  gboolean unknown = g_strv_contains(rule->unknown, backend);

  if (unknown || (!rule->dp_known && r->dp == 1 && listed)) {
    *why = g_strdup_printf("vllm-version %s: whether vLLM builds the shared expert whole "
                           "(use_sequence_parallel_moe) with all2all-backend \"%s\" and %s is "
                           "not known: %s (docs/vllm.md §9.4)",
                           r->version, backend, sizes, rule->why);
    return SHARED_NOT_KNOWN;
  }
  if (listed && r->dp > 1) {
    *why = g_strdup_printf("sequence-parallel MoE (%s, all2all-backend \"%s\"): vLLM's "
                           "use_sequence_parallel_moe holds (the backend is in vllm-version "
                           "%s's list, tp > 1, dp > 1), so it builds the shared expert with "
                           "disable_tp, whole on every rank",
                           sizes, backend, r->version);
    return SHARED_WHOLE;
  }
  if (!listed)
    *why = g_strdup_printf("the shared expert stays TP-sliced (%s): all2all-backend \"%s\" is "
                           "not in vllm-version %s's use_sequence_parallel_moe list, so vLLM "
                           "keeps disable_tp off",
                           sizes, backend, r->version);
  else
    *why = g_strdup_printf("the shared expert stays TP-sliced (%s): vLLM's "
                           "use_sequence_parallel_moe needs dp > 1, and one data-parallel "
                           "replica (prefill-context-parallel-size %u) keeps disable_tp off",
                           sizes, r->pcp);
  return SHARED_SLICED;
}

/* The newest vLLM release whose vLLM-Ascend was read for the shared expert's rule: main
 * at 182b75ea84ff targets it (docs/vllm-ascend.md §1, §2). */
#define ASCEND_READ_UP_TO "0.27.1"

/* Whether vllm-version @text is a release after ASCEND_READ_UP_TO. */
static gboolean
after_ascend_read(const char *text)
{
  guint64 v[VERSION_PARTS], last[VERSION_PARTS];

  if (g_strcmp0(text, "latest") == 0)
    text = LATEST_VERSION;
  return parse_version(text, v) && parse_version(ASCEND_READ_UP_TO, last) &&
         compare_versions(v, last) > 0;
}

/* vLLM-Ascend's rule (docs/vllm-ascend.md §2): its linear layers replicate a
 * shared-expert linear exactly when shared_expert_dp_enabled(), i.e. additional_config
 * enable_shared_expert_dp with EP on and tp > 1.  vLLM's use_sequence_parallel_moe does
 * not decide it in any vLLM-Ascend read: until #13946 the platform set all2all_backend
 * to flashinfer_all2allv, which turns it off, and from #13946 get_parallel_op ignores
 * disable_tp for a shared expert.  Until #13946 FlashComm1 and vLLM's SP compile pass
 * replicated it too; both are off by default and assumed off.  EP is on and tp > 1. */
static SharedLayout
ascend_shared_layout(const Rank *r, const char *sizes, char **why)
{
  g_autofree char *unverified =
      after_ascend_read(r->version)
          ? g_strdup_printf("; not verified for vllm-version %s: vLLM-Ascend was read up to "
                            "the one for vLLM " ASCEND_READ_UP_TO,
                            r->version)
          : g_strdup("");

  *why = g_strdup_printf(
      "vllm-ascend: the shared expert %s (%s, enable-shared-expert-dp = %s): vLLM-Ascend "
      "replicates a shared-expert linear only with additional_config enable_shared_expert_dp, "
      "EP and tp > 1, whatever vLLM's use_sequence_parallel_moe says (until #13946 also with "
      "FlashComm1 or the SP compile pass on, which this assumes off) (docs/vllm-ascend.md "
      "§2)%s",
      r->shared_expert_dp ? "is whole on every rank" : "stays TP-sliced", sizes,
      r->shared_expert_dp ? "true" : "false", unverified);
  return r->shared_expert_dp ? SHARED_WHOLE : SHARED_SLICED;
}

/* Whether the shared expert is whole on every rank or TP-sliced by rank % tp, by the
 * rule of the target (or of the files read back).  @why says why, for the plan (a note)
 * or the error; NULL when there is nothing to say (no EP, or tp 1: TP-sliced by every
 * rule, and tp 1 holds it whole anyway). */
static SharedLayout
shared_expert_layout(const Rank *r, char **why)
{
  g_autofree char *sizes = g_strdup_printf("ep %u = dp %u * pcp %u * tp %u", r->ep, r->dp, r->pcp,
                                           r->tp);
  g_autofree char *vllm_why = NULL;
  SharedLayout layout;

  *why = NULL;
  if (r->ep == 1 || r->tp == 1)
    return SHARED_SLICED;
  switch (r->rule) {
  case RULE_LEGACY: /* with EP, written by the rule of an earlier wsync: ep > tp > 1 */
    *why = g_strdup_printf("the shared expert is %s as rank files of an earlier wsync (no "
                           "wsync.all2all-backend recorded) hold it: whole when ep > tp > 1",
                           r->ep > r->tp ? "whole" : "TP-sliced");
    return r->ep > r->tp ? SHARED_WHOLE : SHARED_SLICED;
  case RULE_ASCEND:
    return ascend_shared_layout(r, sizes, why);
  case RULE_ASCEND_AS_VLLM:
    layout = vllm_shared_layout(r, sizes, &vllm_why);
    *why = g_strdup_printf("vllm-ascend rank files of an earlier wsync (no "
                           "wsync.enable-shared-expert-dp recorded) hold the shared expert by "
                           "vLLM's rule, which vLLM-Ascend does not follow (docs/vllm-ascend.md "
                           "§2): %s",
                           vllm_why);
    return layout;
  case RULE_VLLM:
    break;
  }
  return vllm_shared_layout(r, sizes, why);
}

/* One runtime tensor, by its kind. */
static gboolean
emit_runtime(Rank *r, Runtime *rt, GError **error)
{
  /* mm_encoder_tp_mode "data" builds the encoder's layers with disable_tp, so every rank
   * holds the full tensors, qkv in the checkpoint's [q; k; v] order (§9.5) */
  if (r->encoder_data && wsync_block_get_group(rt->param->block) == WSYNC_GROUP_VISION)
    return emit_replicated(r, rt, error);
  if (is_shared_expert(rt->param)) {
    g_autofree char *why = NULL;
    SharedLayout shared = shared_expert_layout(r, &why);

    if (shared == SHARED_NOT_KNOWN)
      return wsync_fail(error, WSYNC_ERROR_CONFIG, "vllm: %s: %s", rt->name, why);
    if (why != NULL)
      wsync_layout_add_note(r->layout, why);
    if (shared == SHARED_WHOLE)
      return emit_replicated(r, rt, error);
  }
  switch (rt->kind) {
  case WSYNC_PARAM_REPLICATED:
    return emit_replicated(r, rt, error);
  case WSYNC_PARAM_COLUMN:
    return emit_column(r, rt, error);
  case WSYNC_PARAM_ROW:
    return emit_row(r, rt, error);
  case WSYNC_PARAM_VOCAB:
    return emit_vocab(r, rt, error);
  case WSYNC_PARAM_EXPERTS_COLUMN:
    return emit_experts_w13(r, rt, error);
  case WSYNC_PARAM_EXPERTS_ROW:
    return emit_experts_w2(r, rt, error);
  }
  return param_error(error, rt, "unknown param kind");
}

/* A model's param: dropped by a rule, part of a tensor another param leads, or the
 * runtime tensor it leads. */
static gboolean
handle_param(Rank *r, const WsyncParam *param, GError **error)
{
  const char *drop = wsync_layout_get_runtime_drop(r->layout, param->block);
  Runtime rt;
  gboolean ok;

  /* `AutoWeightsLoader(self, skip_prefixes=["mtp."])`: the main model never holds a
   * draft (multi-token-prediction) block (§9). */
  if (wsync_block_get_group(param->block) == WSYNC_GROUP_DRAFT) {
    wsync_layout_drop_param(r->layout, param, "vllm-skips-mtp");
    return TRUE;
  }
  /* The model says the running engine does not hold it (e.g. a vision tower switched
   * off by a language-model-only deployment): drop it by the model's rule. */
  if (drop != NULL) {
    wsync_layout_drop_param(r->layout, param, drop);
    return TRUE;
  }
  if (param->role == WSYNC_ROLE_O && strcmp(wsync_param_get_leaf(param), "bias") == 0 &&
      drops_o_proj_bias(wsync_layout_get_model(r->layout))) {
    wsync_layout_drop_param(r->layout, param, "vllm-qwen3-o-proj-has-no-bias");
    wsync_layout_add_note(r->layout,
                          "self_attn.o_proj.bias of every layer: vLLM's Qwen3 attention has no "
                          "o_proj bias and ignores the checkpoint's (qkv_proj holds the q/k/v "
                          "biases): vLLM computes without it, Transformers with it");
    return TRUE;
  }
  if (packed_into_another(param->role))
    return TRUE;
  if (!runtime_of_param(r, param, &rt, error))
    return FALSE;
  ok = emit_runtime(r, &rt, error);
  g_free(rt.name);
  /* the scale buffers follow the attention's qkv_proj weight, once per layer */
  if (ok && param->role == WSYNC_ROLE_Q && strcmp(wsync_param_get_leaf(param), "weight") == 0)
    ok = emit_attention_scales(r, param->block, error);
  return ok;
}

/* ------------------------------------------------------------------ the target */

/* The metadata wsync writes into every rank file (and reads back). */
#define KEY_TARGET "wsync.target"
#define KEY_FORMAT "wsync.format"
#define KEY_TP "wsync.tp"
#define KEY_EP "wsync.ep"
#define KEY_RANK "wsync.rank"
#define KEY_WORLD "wsync.world"
#define KEY_VERSION "wsync.vllm-version"
#define KEY_ERA "wsync.vllm-era"
#define KEY_SCALES "wsync.attn-scales"
#define KEY_ALL2ALL "wsync.all2all-backend"
#define KEY_PCP "wsync.prefill-context-parallel-size"
#define KEY_SHARED_EXPERT_DP "wsync.enable-shared-expert-dp"
#define KEY_ENCODER_TP_MODE "wsync.mm-encoder-tp-mode"
#define KEY_MOE_BACKEND "wsync.moe-backend"
#define KEY_DTYPE "wsync.dtype"

static gboolean
bad_metadata(GError **error, const char *key, const char *value, const char *want)
{
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT, "metadata %s is \"%s\", not %s", key,
              value != NULL ? value : "(missing)", want);
  return FALSE;
}

/* The deployment the files were written for, as they record it: the all2all backend
 * and the prefill-context-parallel size, and vllm-ascend's enable-shared-expert-dp.
 * Files without EP record none (they hold the shared expert TP-sliced).  Files of an
 * earlier wsync hold it as its rule had it: those that record no all2all backend whole
 * when ep > tp > 1; vllm-ascend files that record the backend but not
 * enable-shared-expert-dp by vLLM's rule. */
static gboolean
read_deployment(Rank *r, GError **error)
{
  const char *backend = wsync_layout_get_input_metadata(r->layout, KEY_ALL2ALL);
  const char *pcp = wsync_layout_get_input_metadata(r->layout, KEY_PCP);
  const char *sedp = wsync_layout_get_input_metadata(r->layout, KEY_SHARED_EXPERT_DP);
  guint64 value;

  if (backend == NULL && (!r->ascend || sedp == NULL)) {
    r->rule = RULE_LEGACY;
    r->pcp = 1; /* that wsync had no prefill context parallelism: not the option's */
    return TRUE;
  }
  if (!is_all2all_backend(backend))
    return bad_metadata(error, KEY_ALL2ALL, backend, "one of vLLM's --all2all-backend names");
  if (pcp == NULL || !g_ascii_string_to_unsigned(pcp, 10, 1, MAX_PCP, &value, NULL))
    return bad_metadata(error, KEY_PCP, pcp, "a number from 1 to 65535");
  r->all2all_backend = backend;
  r->pcp = (guint)value;
  r->rule = RULE_VLLM; /* the vllm target ignores enable-shared-expert-dp */
  if (!r->ascend)
    return TRUE;
  r->rule = RULE_ASCEND;
  if (sedp == NULL)
    r->rule = RULE_ASCEND_AS_VLLM;
  else if (strcmp(sedp, "true") == 0 || strcmp(sedp, "false") == 0)
    r->shared_expert_dp = strcmp(sedp, "true") == 0;
  else
    return bad_metadata(error, KEY_SHARED_EXPERT_DP, sedp, "\"true\" or \"false\"");
  return TRUE;
}

/* The vision tower's layout the files record: "data" whole, "weights" (or nothing, as
 * files of an earlier wsync and files for the default record) TP-sliced (§9.5). */
static gboolean
read_encoder_mode(Rank *r, GError **error)
{
  const char *mode = wsync_layout_get_input_metadata(r->layout, KEY_ENCODER_TP_MODE);

  if (mode != NULL && strcmp(mode, "weights") != 0 && strcmp(mode, "data") != 0)
    return bad_metadata(error, KEY_ENCODER_TP_MODE, mode, "\"weights\" or \"data\"");
  r->encoder_data = g_strcmp0(mode, "data") == 0;
  return TRUE;
}

/* The routed experts' layout the files record: flashinfer-cutlass's swapped w13, or (nothing,
 * as files of an earlier wsync and files in the loader layout record) triton's (§4).
 * Only the kernel format of the target vllm is ever written with it. */
static gboolean
read_moe_backend(Rank *r, GError **error)
{
  const char *name = wsync_layout_get_input_metadata(r->layout, KEY_MOE_BACKEND);
  int backend = name != NULL ? moe_backend_of(name) : MOE_TRITON;

  if (backend < 0 || backend == MOE_FLASHINFER_TRTLLM ||
      (backend != MOE_TRITON && (!r->kernel || r->ascend)))
    return bad_metadata(error, KEY_MOE_BACKEND, name,
                        "\"triton\" or, in the vllm target's kernel format, "
                        "\"flashinfer-cutlass\"");
  r->moe_backend = (MoeBackend)backend;
  return TRUE;
}

/* The dtype vLLM builds the model's parameters in (§2 "Dtype on load"): the option, i.e.
 * the deployment's --dtype, or for auto what vLLM's _resolve_auto_dtype picks: the
 * config's dtype, a float32 one downcast to the platform's first dtype, which is bfloat16
 * on GPUs with BF16 (compute capability 8.0 on) and on vLLM-Ascend.  Files read back hold
 * the dtype they record, else the model's (files for a served dtype equal to the model's,
 * and files of an earlier wsync, record none). */
static gboolean
choose_dtype(Rank *r, const VllmSettings *settings, GError **error)
{
  WsyncDtype model = wsync_model_get_dtype(wsync_layout_get_model(r->layout));

  if (wsync_layout_is_reading(r->layout)) {
    const char *recorded = wsync_layout_get_input_metadata(r->layout, KEY_DTYPE);
    r->served = model;
    if (recorded != NULL &&
        (!wsync_dtype_from_name(recorded, &r->served) || !is_float(r->served)))
      return bad_metadata(error, KEY_DTYPE, recorded, "\"BF16\", \"F16\" or \"F32\"");
    return TRUE;
  }
  if (settings->dtype != DTYPE_AUTO)
    r->served = settings->dtype;
  else
    r->served = model == WSYNC_DTYPE_F32 ? WSYNC_DTYPE_BF16 : model;
  return TRUE;
}

/* What the plan says when the files hold the parameters in another dtype than the
 * model's config (the core notes each rounding cast with its count). */
static void
add_dtype_note(Rank *r, const VllmSettings *settings)
{
  WsyncDtype model = wsync_model_get_dtype(wsync_layout_get_model(r->layout));
  g_autofree char *note = NULL;

  if (r->served == model || wsync_layout_is_reading(r->layout))
    return;
  if (settings->dtype == DTYPE_AUTO)
    note = g_strdup_printf("dtype auto: vLLM's --dtype auto builds a float32 model in "
                           "bfloat16 (on a GPU with BF16 and on vLLM-Ascend, docs/vllm.md "
                           "§2), so the files hold its parameters in %s; for a deployment "
                           "started with --dtype float32 set dtype = \"float32\" (plugin "
                           "\"vllm\"), on a GPU without BF16 dtype = \"float16\"",
                           wsync_dtype_name(r->served));
  else
    note = g_strdup_printf("dtype: the files hold the %s model's parameters in %s, as vLLM "
                           "started with the same --dtype builds them (docs/vllm.md §2)",
                           wsync_dtype_name(model), wsync_dtype_name(r->served));
  wsync_layout_add_note(r->layout, note);
}

/* The names the release gives on the target's engine: vLLM's era, or vLLM-Ascend's
 * (NULL where no vLLM-Ascend release targets that vLLM). */
static gboolean
choose_naming(Rank *r, GError **error)
{
  r->naming = r->ascend ? r->release->ascend_era : r->release->era;
  if (r->naming == NULL)
    return wsync_fail(error, WSYNC_ERROR_CONFIG,
                      "vllm-version %s: no vLLM-Ascend release targets vLLM %s, so its names "
                      "are not known (docs/vllm-ascend.md §2); set the vLLM release the "
                      "deployment's vLLM-Ascend targets (0.26.x or 0.27.1)",
                      r->version, r->release->label);
  return TRUE;
}

/* Rank files whose recorded era is not the one the table gives their version.  Files of
 * the target vllm-ascend that record vLLM's era for it were written by a wsync that named
 * them as vLLM does, which vLLM-Ascend does not load (docs/vllm-ascend.md §2). */
static gboolean
era_mismatch(Rank *r, const char *era, GError **error)
{
  if (r->ascend && g_strcmp0(era, r->release->era->name) == 0)
    return wsync_fail(error, WSYNC_ERROR_BAD_INPUT,
                      "metadata %s is \"%s\", not %s: these vllm-ascend rank files carry "
                      "vLLM's names for vllm-version %s, which vLLM-Ascend does not load "
                      "(an earlier wsync); convert again from the Hugging Face checkpoint",
                      KEY_ERA, era, r->naming->name, r->version);
  return bad_metadata(error, KEY_ERA, era, r->naming->name);
}

/* The naming rules of the files: when reading rank files, the version, attn-scales and
 * deployment they record (and the era they record must be the one the table gives that
 * version on the target's engine); when writing, the options. */
static gboolean
choose_convention(Rank *r, const VllmSettings *settings, GError **error)
{
  const char *version = settings->version, *why = NULL;

  r->attn_scales = settings->attn_scales;
  r->all2all_backend = settings->all2all_backend;
  r->pcp = settings->pcp;
  r->shared_expert_dp = settings->shared_expert_dp;
  r->encoder_data = settings->encoder_data;
  r->moe_backend = settings->moe_backend;
  r->rule = r->ascend ? RULE_ASCEND : RULE_VLLM;
  if (wsync_layout_is_reading(r->layout)) {
    const char *era = wsync_layout_get_input_metadata(r->layout, KEY_ERA);
    const char *scales = wsync_layout_get_input_metadata(r->layout, KEY_SCALES);
    if (!read_deployment(r, error) || !read_encoder_mode(r, error) ||
        !read_moe_backend(r, error))
      return FALSE;
    version = wsync_layout_get_input_metadata(r->layout, KEY_VERSION);
    r->release = find_release(version, &why);
    if (r->release == NULL)
      return bad_metadata(error, KEY_VERSION, version, "a vLLM release wsync knows");
    r->version = version;
    if (!choose_naming(r, error))
      return FALSE;
    if (g_strcmp0(era, r->naming->name) != 0)
      return era_mismatch(r, era, error);
    if (scales != NULL && strcmp(scales, "true") != 0 && strcmp(scales, "false") != 0)
      return bad_metadata(error, KEY_SCALES, scales, "\"true\" or \"false\"");
    if (scales != NULL)
      r->attn_scales = strcmp(scales, "true") == 0;
    return TRUE;
  }
  if ((r->release = find_release(version, &why)) == NULL) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_CONFIG, "%s, not \"%s\"", why, version);
    return FALSE;
  }
  r->version = version;
  return choose_naming(r, error);
}

/* world = ep if ep > 1 else tp; with EP, ep must be a multiple of tp and the rank's tp
 * rank is rank % tp (ep_rank = dp_rank*pcp*tp + pcp_rank*tp + tp_rank, §4). */
static gboolean
check_parallel(Rank *r, GError **error)
{
  if (r->tp == 0 || r->ep == 0)
    return wsync_fail(error, WSYNC_ERROR_USAGE, "tp %u and ep %u must be at least 1", r->tp, r->ep);
  if (r->ep > 1 && r->ep % r->tp != 0)
    return wsync_fail(error, WSYNC_ERROR_USAGE, "ep %u is not a multiple of tp %u", r->ep, r->tp);
  r->world = r->ep > 1 ? r->ep : r->tp;
  if (r->rank >= r->world)
    return wsync_fail(error, WSYNC_ERROR_USAGE, "rank %u is outside the %u ranks of tp %u ep %u",
                      r->rank, r->world, r->tp, r->ep);
  r->t = r->rank % r->tp;
  return TRUE;
}

/* With EP vLLM's expert-parallel group is dp*pcp*tp ranks (§4), so the number of
 * data-parallel replicas, which decides the shared expert's layout (§9.4), is
 * ep / (pcp * tp); it must be a whole number. */
static gboolean
check_replicas(Rank *r, GError **error)
{
  r->dp = 1;
  if (r->ep == 1)
    return TRUE;
  if (r->ep % (r->pcp * r->tp) != 0 && wsync_layout_is_reading(r->layout)) {
    g_autofree char *pcp = g_strdup_printf("%u", r->pcp);
    g_autofree char *want = g_strdup_printf("a size that divides ep %u / tp %u", r->ep, r->tp);
    return bad_metadata(error, KEY_PCP, pcp, want);
  }
  if (r->ep % (r->pcp * r->tp) != 0)
    return wsync_fail(error, WSYNC_ERROR_CONFIG,
                      "ep %u is not a whole number of data-parallel replicas of "
                      "prefill-context-parallel-size %u * tp %u (vLLM's expert-parallel group "
                      "is dp*pcp*tp ranks): set prefill-context-parallel-size and --ep as the "
                      "deployment's --prefill-context-parallel-size and dp*pcp*tp",
                      r->ep, r->pcp, r->tp);
  r->dp = r->ep / (r->pcp * r->tp);
  return TRUE;
}

/* What sharded_state cannot express (§6): files are read by TP rank only, so with
 * ep > tp the other EP ranks' files would never be read (and data-parallel replicas
 * would load replica 0's experts without an error); and a release whose expert map is
 * not known cannot be given the exact key set with EP. */
/* A row of the release table is a range ("0.20.x", "0.28.0 and later") or one release
 * ("0.27.0"): the words that go with its label. */
static gboolean
is_range(const Release *release)
{
  return release->last == NULL || strcmp(release->first, release->last) != 0;
}

static const char *
release_noun(const Release *release)
{
  return is_range(release) ? "releases" : "release";
}

static gboolean
check_sharded_state(Rank *r, GError **error)
{
  if (r->kernel)
    return TRUE;
  if (r->ep > r->tp)
    return wsync_fail(error, WSYNC_ERROR_USAGE,
                      "--format sharded-state cannot hold ep %u > tp %u: vLLM's sharded_state "
                      "loader reads files by TP rank only, so the experts of EP ranks %u to "
                      "%u would never load (use --format kernel, for a live weight update)",
                      r->ep, r->tp, r->tp, r->ep - 1);
  if (r->ep > 1 && r->release->map == MAP_UNKNOWN)
    return wsync_fail(error, WSYNC_ERROR_USAGE,
                      "vllm-version %s: whether its sharded_state files hold the expert map "
                      "is not known (%s %s %s not checked, docs/vllm.md §5); with --ep use a "
                      "verified release or --format kernel",
                      r->version, release_noun(r->release), r->release->label,
                      is_range(r->release) ? "were" : "was");
  return TRUE;
}

static void
set_metadata_uint(Rank *r, const char *key, guint value)
{
  char text[16];

  g_snprintf(text, sizeof(text), "%u", value);
  wsync_layout_set_metadata(r->layout, key, text);
}

/* Layout state that travels with the data: the files are read back with it. */
static void
set_metadata(Rank *r)
{
  wsync_layout_set_metadata(r->layout, KEY_TARGET, wsync_layout_get_target(r->layout));
  wsync_layout_set_metadata(r->layout, KEY_FORMAT, wsync_layout_get_format(r->layout));
  set_metadata_uint(r, KEY_TP, r->tp);
  set_metadata_uint(r, KEY_EP, r->ep);
  set_metadata_uint(r, KEY_RANK, r->rank);
  set_metadata_uint(r, KEY_WORLD, r->world);
  wsync_layout_set_metadata(r->layout, KEY_VERSION, r->version);
  wsync_layout_set_metadata(r->layout, KEY_ERA, r->naming->name);
  wsync_layout_set_metadata(r->layout, KEY_SCALES, r->attn_scales ? "true" : "false");
  /* only with EP, where they decide the shared expert (§9.4, docs/vllm-ascend.md §2);
   * files read back keep what they record */
  if (r->ep > 1 && r->rule != RULE_LEGACY) {
    wsync_layout_set_metadata(r->layout, KEY_ALL2ALL, r->all2all_backend);
    set_metadata_uint(r, KEY_PCP, r->pcp);
  }
  if (r->ep > 1 && r->rule == RULE_ASCEND)
    wsync_layout_set_metadata(r->layout, KEY_SHARED_EXPERT_DP,
                              r->shared_expert_dp ? "true" : "false");
  /* only when not vLLM's default: files without it hold the vision tower TP-sliced */
  if (r->encoder_data)
    wsync_layout_set_metadata(r->layout, KEY_ENCODER_TP_MODE, "data");
  /* only when the experts are not in the loader layout */
  if (moe_layout(r) != MOE_TRITON)
    wsync_layout_set_metadata(r->layout, KEY_MOE_BACKEND, moe_backends[moe_layout(r)]);
  /* only when not the model's dtype: files without it hold the model's */
  if (r->served != wsync_model_get_dtype(wsync_layout_get_model(r->layout)))
    wsync_layout_set_metadata(r->layout, KEY_DTYPE, wsync_dtype_name(r->served));
}

/* What the plan says about moe-backend when it is not the default: what it did to the
 * routed experts, or why it did nothing (§4). */
static void
add_moe_note(Rank *r)
{
  if (r->moe_backend == MOE_TRITON)
    return;
  if (moe_layout(r) == MOE_FLASHINFER_CUTLASS)
    wsync_layout_add_note(r->layout, "moe-backend flashinfer-cutlass: each routed expert's "
                                     "w13_weight holds its up rows first, then its gate rows "
                                     "([w3; w1]), as FlashInfer CUTLASS runs them (docs/vllm.md "
                                     "§4); only a deployment started with --moe-backend "
                                     "flashinfer_cutlass may load these files");
  else if (r->ascend)
    wsync_layout_add_note(r->layout, "moe-backend is ignored for vllm-ascend: vLLM-Ascend "
                                     "runs its own MoE kernels and never reads --moe-backend "
                                     "(docs/vllm.md §4)");
  else
    wsync_layout_add_note(r->layout, "moe-backend is ignored for the sharded-state format: it "
                                     "holds the loader layout, which vLLM re-lays for its MoE "
                                     "backend after loading (docs/vllm.md §4)");
}

/* What the plan says about the files: who reads them, and by which naming rules. */
static void
add_notes(Rank *r)
{
  g_autofree char *consumer =
      r->kernel ? g_strdup("format kernel: each rank's files are a live weight update in "
                           "kernel format, every tensor a parameter in the layout the "
                           "kernels run on, copied by model.get_parameter(name).copy_ as "
                           "reload_weights with is_checkpoint_format=False (vLLM #32133 on, "
                           "through collective_rpc) and wsync_load (wsync.vllm_worker) do; "
                           "start_weight_update takes is_checkpoint_format=false only in "
                           "vLLM #39212 to #44353 and vLLM-Ascend #9152 to #12876 "
                           "(docs/vllm.md §7)")
                : g_strdup_printf("format sharded-state: load with `vllm serve DIR "
                                  "--load-format sharded_state --tensor-parallel-size %u`",
                                  r->tp);
  g_autofree char *era = g_strdup_printf(
      "vllm-version %s: naming era %s of %s %s (%s)%s%s", r->version, r->naming->name,
      release_noun(r->release), r->release->label, r->naming->summary,
      r->release->verified ? "" : "; not verified: ", r->release->verified ? "" : r->release->why);

  wsync_layout_add_note(r->layout, consumer);
  wsync_layout_add_note(r->layout, era);
  add_moe_note(r);
  /* vllm-layouts.md §5: the attention scales are persistent buffers in every release the
   * reference covers, and the loader raises ValueError("Missing keys ...") for any key
   * the file lacks */
  if (!r->kernel && !r->attn_scales)
    wsync_layout_add_note(r->layout,
                          "attn-scales = false: these files lack each attention layer's "
                          "_k_scale, _v_scale, _q_scale and _prob_scale, which vLLM's "
                          "sharded_state loader requires (it refuses the files with "
                          "\"Missing keys\"); they serve only a loader that does not "
                          "expect them");
}

/* The build function of both targets: every param of the model, for one rank. */
static gboolean
build_rank(WsyncLayout *layout, gpointer user_data, GError **error)
{
  const VllmSettings *settings = user_data;
  Rank r = {.layout = layout,
            .kernel = g_strcmp0(wsync_layout_get_format(layout), FORMAT_KERNEL) == 0,
            .ascend = strcmp(settings->target, "vllm-ascend") == 0,
            .tp = wsync_layout_get_tp(layout),
            .ep = wsync_layout_get_ep(layout),
            .rank = wsync_layout_get_rank(layout)};
  guint n = wsync_layout_n_params(layout);

  if (!check_parallel(&r, error) || !choose_convention(&r, settings, error) ||
      !choose_dtype(&r, settings, error) || !check_replicas(&r, error) ||
      !check_sharded_state(&r, error) || !check_vllm_builds_it(&r, error) ||
      !check_names_known(wsync_layout_get_model(layout), error))
    return FALSE;
  r.prefixes = prefixes_of(wsync_layout_get_model(layout));
  /* vllm-ascend's kernel format is this layout finished by another plugin's post-load
   * hook; without it the files would carry the target's name and the loader layout
   * (docs/vllm-ascend.md §3).  Its sharded-state format is the loader layout itself. */
  if (r.ascend && r.kernel)
    wsync_layout_require_hook(layout, "its routed experts must be put in vLLM-Ascend's "
                                      "processed layout by a post-load hook (plugin npu-ascend)");
  set_metadata(&r);
  add_notes(&r);
  add_dtype_note(&r, settings);
  for (guint i = 0; i < n; i++)
    if (!handle_param(&r, wsync_layout_param(layout, i), error))
      return FALSE;
  return TRUE;
}

/* One rank per TP rank, or per EP rank with expert parallelism (§4). */
static guint
world_size(guint tp, guint ep, gpointer user_data)
{
  (void)user_data;
  return ep > 1 ? ep : tp;
}

/* sharded_state's DEFAULT_PATTERN, by TP rank (§6); the kernel format by worker, under a
 * name sharded_state never globs, so a kernel-layout file is never loaded as a
 * checkpoint (§7). */
static char *
file_name(WsyncLayout *layout, guint part, guint n_parts, gpointer user_data)
{
  guint rank = wsync_layout_get_rank(layout);

  (void)n_parts;
  (void)user_data;
  if (g_strcmp0(wsync_layout_get_format(layout), FORMAT_KERNEL) == 0)
    return g_strdup_printf("kernel-rank-%u-part-%u.safetensors", rank, part);
  return g_strdup_printf("model-rank-%u-part-%u.safetensors", rank % wsync_layout_get_tp(layout),
                         part);
}

static gboolean
metadata_uint(GHashTable *md, const char *key, guint min, guint *out, GError **error)
{
  const char *text = g_hash_table_lookup(md, key);
  guint64 v;

  if (text == NULL || !g_ascii_string_to_unsigned(text, 10, min, 65535, &v, NULL))
    return bad_metadata(error, key, text, "a number");
  *out = (guint)v;
  return TRUE;
}

/* A file is this target's when its metadata says so (file names can be changed; the
 * metadata travels with the data). */
static gboolean
recognise(const char *name, GHashTable *md, WsyncRankFile *out, gpointer user_data,
          GError **error)
{
  const VllmSettings *settings = user_data;
  const char *format = g_hash_table_lookup(md, KEY_FORMAT);

  (void)name;
  if (g_strcmp0(g_hash_table_lookup(md, KEY_TARGET), settings->target) != 0)
    return FALSE;
  if (format == NULL) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "a %s rank file of an older wsync, without %s: its names load in no vLLM "
                "release; convert again from the Hugging Face checkpoint",
                settings->target, KEY_FORMAT);
    return FALSE;
  }
  out->format = NULL;
  for (guint i = 0; formats[i] != NULL; i++)
    if (strcmp(format, formats[i]) == 0)
      out->format = formats[i];
  if (out->format == NULL)
    return bad_metadata(error, KEY_FORMAT, format, "\"sharded-state\" or \"kernel\"");
  if (!metadata_uint(md, KEY_TP, 1, &out->tp, error) ||
      !metadata_uint(md, KEY_EP, 1, &out->ep, error) ||
      !metadata_uint(md, KEY_RANK, 0, &out->rank, error))
    return FALSE;
  if (out->ep > 1 && out->ep % out->tp != 0)
    return bad_metadata(error, KEY_EP, g_hash_table_lookup(md, KEY_EP), "a multiple of wsync.tp");
  return TRUE;
}

/* ------------------------------------------------------------------ registration */

/* Designated initialisers: CFG_STR() has no slot for a validating callback or a comment. */
static cfg_opt_t options[] = {
    {.name = "vllm-version",
     .type = CFGT_STR,
     .flags = CFGF_NONE,
     .def.string = "latest",
     .validcb = validate_version,
     .comment = WSYNC_OPTION_DOC(
         "The vLLM release the rank files are for, which decides their tensor names: vLLM "
         "renamed the MoE block's tensors four times (eras A to D; wsync convert --help shows "
         "the release table); latest is the naming of 0.27.1 and later.",
         "\"latest\", or a vLLM release number from 0.17.0 on without an rc or post suffix "
         "(\"0.18\", \"0.18.1\", \"v0.24.0\")")},
    {.name = "attn-scales",
     .type = CFGT_BOOL,
     .flags = CFGF_NONE,
     .def.boolean = cfg_true,
     .comment = WSYNC_OPTION_DOC(
         "In the sharded-state format, write each attention layer's _k_scale, _v_scale, "
         "_q_scale and _prob_scale (F32 scalars of 1.0): vLLM registers them as persistent "
         "buffers and its sharded_state loader refuses files that lack them; turn off only "
         "for a loader that does not expect them.",
         "")},
    {.name = "all2all-backend",
     .type = CFGT_STR,
     .flags = CFGF_NONE,
     .def.string = DEFAULT_ALL2ALL_BACKEND,
     .validcb = validate_all2all_backend,
     .comment = WSYNC_OPTION_DOC(
         "The deployment's vLLM --all2all-backend. With expert parallelism, tp > 1 and more "
         "than one data-parallel replica, vLLM holds the shared expert of Qwen3.5-MoE and "
         "Qwen3-Next whole on every rank when this backend is in its sequence-parallel MoE "
         "list (use_sequence_parallel_moe), and TP-sliced otherwise.",
         "allgather_reducescatter (vLLM's default), naive, pplx, deepep_high_throughput, "
         "deepep_low_latency, deepep_v2, mori, mori_high_throughput, mori_low_latency, "
         "nixl_ep, flashinfer_all2allv, flashinfer_nvlink_two_sided or "
         "flashinfer_nvlink_one_sided")},
    {.name = "prefill-context-parallel-size",
     .type = CFGT_INT,
     .flags = CFGF_NONE,
     .def.number = 1,
     .validcb = validate_pcp,
     .comment = WSYNC_OPTION_DOC(
         "The deployment's vLLM --prefill-context-parallel-size. With expert parallelism "
         "vLLM's expert-parallel group is dp*pcp*tp ranks, so --ep / (this * --tp) is the "
         "number of data-parallel replicas, which must be whole and decides whether the "
         "shared expert is whole (more than one replica) or TP-sliced.",
         "a whole number from 1 to 65535")},
    {.name = "enable-shared-expert-dp",
     .type = CFGT_BOOL,
     .flags = CFGF_NONE,
     .def.boolean = cfg_false,
     .comment = WSYNC_OPTION_DOC(
         "For the vllm-ascend target: the deployment's vLLM-Ascend additional_config "
         "enable_shared_expert_dp (default false, as vLLM-Ascend's). vLLM-Ascend holds the "
         "shared expert of Qwen3.5-MoE and Qwen3-Next whole on every rank exactly when it is "
         "on with expert parallelism and tp > 1, and TP-sliced otherwise, whatever "
         "all2all-backend says. The vllm target ignores it, so setting it for a vllm "
         "deployment is harmless.",
         "")},
    {.name = "mm-encoder-tp-mode",
     .type = CFGT_STR,
     .flags = CFGF_NONE,
     .def.string = "weights",
     .validcb = validate_encoder_mode,
     .comment = WSYNC_OPTION_DOC(
         "The deployment's vLLM --mm-encoder-tp-mode, for models with a vision tower "
         "(Qwen3.5). With weights (vLLM's default) each rank holds its TP slice of the "
         "tower's linear layers; with data every rank holds the whole tower, as with one "
         "rank. vLLM and vLLM-Ascend alike.",
         "weights (vLLM's default) or data")},
    {.name = "moe-backend",
     .type = CFGT_STR,
     .flags = CFGF_NONE,
     .def.string = "triton",
     .validcb = validate_moe_backend,
     .comment = WSYNC_OPTION_DOC(
         "The unquantized MoE backend the deployment's vLLM runs (--moe-backend; the log "
         "line \"Using ... Unquantized MoE backend\" names it), for the vllm target's kernel "
         "format: vLLM re-lays the routed experts for it after loading, so a live update must "
         "bring that layout. triton keeps the loader layout; flashinfer-cutlass holds each "
         "expert's w13_weight up rows first ([w3; w1]); flashinfer-trtllm (FlashInfer's block "
         "layout) is refused. On Blackwell with FlashInfer vLLM's auto picks a FlashInfer "
         "backend: start it with --moe-backend triton or flashinfer_cutlass. The "
         "sharded-state format and vllm-ascend ignore it.",
         "triton (the loader layout), flashinfer-cutlass or flashinfer-trtllm; vLLM's "
         "spellings with underscores too")},
    {.name = "dtype",
     .type = CFGT_STR,
     .flags = CFGF_NONE,
     .def.string = "auto",
     .validcb = validate_dtype,
     .comment = WSYNC_OPTION_DOC(
         "The deployment's vLLM --dtype, the dtype vLLM builds the model's parameters in "
         "(A_log of Qwen3.5's linear attention stays float32). auto (vLLM's default) is the "
         "config's dtype, except that a float32 model is built in bfloat16 (on GPUs with "
         "BF16 and on vLLM-Ascend; on a GPU without BF16 vLLM picks float16: set it). "
         "Rank files in another dtype than the config's record it, and read back to hf "
         "widened to the config's.",
         "auto (vLLM's default), bfloat16, float16 (or half), float32 (or float)")},
    CFG_END()};

/* The help `wsync convert --help` shows for the target: formats, their consumers and
 * the release table. */
static char *
help_text(const char *target)
{
  gboolean ascend = strcmp(target, "vllm-ascend") == 0;
  GString *h = g_string_new(NULL);

  g_string_append_printf(
      h,
      "    --format sharded-state (the default): for `vllm serve DIR --load-format\n"
      "      sharded_state --tensor-parallel-size N`; model-rank-{tp_rank}-part-{p}.safetensors;\n"
      "      the loader layout%s; ep <= tp only\n"
      "    --format kernel: for a live weight update in kernel format, copied by\n"
      "      get_parameter(name).copy_ (reload_weights with is_checkpoint_format=False,\n"
      "      or wsync_load; start_weight_update takes is_checkpoint_format=false only\n"
      "      in vLLM #39212 to #44353 and vLLM-Ascend #9152 to #12876);\n"
      "      kernel-rank-{rank}-part-{p}.safetensors, one set per worker (the EP rank with\n"
      "      --ep); parameters only%s\n",
      ascend ? " (experts not transposed)" : "",
      ascend ? ";\n      experts transposed as vLLM-Ascend runs them; every weight in ND format,\n"
               "      which serves A2/A3 with weight_nz_mode 0 or 1 and enable_fused_mc2 off,\n"
               "      not 310P, fused MC2 or weight_nz_mode=2 (docs/vllm-ascend.md §4)"
             : ";\n      the routed experts for the deployment's --moe-backend, which the option\n"
               "      moe-backend (conf.d, plugin \"vllm\") names: triton (the default) the\n"
               "      loader layout, flashinfer-cutlass w13 up rows first, flashinfer-trtllm\n"
               "      refused (docs/vllm.md §4)");
  if (ascend) {
    g_string_append(h, "    vllm-version (conf.d, plugin \"vllm\") chooses the names vLLM-Ascend's\n"
                       "      MoE classes give (docs/vllm-ascend.md §2):\n");
    for (guint i = 0; i < G_N_ELEMENTS(releases); i++) {
      const Release *row = &releases[i];
      if (row->ascend_era == NULL)
        g_string_append_printf(h, "      %-18s no vLLM-Ascend release targets it: refused\n",
                               row->label);
      else
        g_string_append_printf(h, "      %-18s era %s%s\n        router mlp.%s, shared expert mlp.%s*\n",
                               row->label, row->ascend_era->name,
                               row->verified ? "" : "  (not verified)", row->ascend_era->router,
                               row->ascend_era->shared);
    }
    g_string_append(h, "      latest (default)   as " LATEST_VERSION "\n"
                       "    with --ep and tp > 1 the shared expert is whole only with\n"
                       "      enable-shared-expert-dp (conf.d, plugin \"vllm\"), as vLLM-Ascend\n"
                       "      holds it (docs/vllm-ascend.md §2)\n"
                       "    --ep must divide the routed experts: vLLM-Ascend runs no uneven\n"
                       "      split (docs/vllm-ascend.md §2)\n");
    return g_string_free(h, FALSE);
  }
  g_string_append(h, "    vllm-version (conf.d, plugin \"vllm\") chooses the naming era:\n");
  for (guint i = 0; i < G_N_ELEMENTS(releases); i++) {
    const Release *row = &releases[i];
    g_string_append_printf(h, "      %-18s era %s  router mlp.%s%s\n", row->label, row->era->name,
                           row->era->router, row->verified ? "" : "  (not verified)");
  }
  g_string_append(h, "      latest (default)   as " LATEST_VERSION "\n");
  return g_string_free(h, FALSE);
}

static VllmSettings *
settings_new(const char *target, cfg_t *cfg)
{
  VllmSettings *settings = g_new0(VllmSettings, 1);

  settings->target = target;
  settings->version = g_strdup(cfg_getstr(cfg, "vllm-version"));
  settings->attn_scales = cfg_getbool(cfg, "attn-scales");
  settings->all2all_backend = g_strdup(cfg_getstr(cfg, "all2all-backend"));
  settings->pcp = (guint)cfg_getint(cfg, "prefill-context-parallel-size");
  settings->shared_expert_dp = cfg_getbool(cfg, "enable-shared-expert-dp");
  settings->encoder_data = strcmp(cfg_getstr(cfg, "mm-encoder-tp-mode"), "data") == 0;
  settings->moe_backend = (MoeBackend)moe_backend_of(cfg_getstr(cfg, "moe-backend"));
  if (!served_dtype_of(cfg_getstr(cfg, "dtype"), &settings->dtype))
    settings->dtype = DTYPE_AUTO; /* (vllm_register refused it first) */
  settings->help = help_text(target);
  return settings;
}

static gboolean
add_target(WsyncPlugin *plugin, const char *name, const char *description, cfg_t *cfg,
           GError **error)
{
  VllmSettings *settings = settings_new(name, cfg);
  WsyncTargetInfo info = {.name = name,
                          .description = description,
                          .help = settings->help,
                          .formats = formats,
                          .build = build_rank,
                          .world = world_size,
                          .file_name = file_name,
                          .recognise = recognise};

  return wsync_plugin_add_target(plugin, &info, WSYNC_PRIORITY_DEFAULT, settings, free_settings,
                                 error);
}

static gboolean
vllm_register(WsyncPlugin *plugin, GError **error)
{
  cfg_t *cfg = wsync_plugin_get_options(plugin);
  const char *version = cfg_getstr(cfg, "vllm-version"), *why = NULL;
  const char *backend = cfg_getstr(cfg, "all2all-backend");
  const char *mode = cfg_getstr(cfg, "mm-encoder-tp-mode");
  long pcp = cfg_getint(cfg, "prefill-context-parallel-size");
  const char *moe = cfg_getstr(cfg, "moe-backend");
  const char *dtype_name = cfg_getstr(cfg, "dtype");
  WsyncDtype dtype;

  /* The validators have seen every value a file set; this catches anything else. */
  if (find_release(version, &why) == NULL) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_CONFIG, "%s, not \"%s\"", why,
                version != NULL ? version : "");
    return FALSE;
  }
  if (!is_all2all_backend(backend)) {
    g_autofree char *names = all2all_backend_names();
    return wsync_fail(error, WSYNC_ERROR_CONFIG, ALL2ALL_RULE " (%s), not \"%s\"", names,
                      backend != NULL ? backend : "");
  }
  if (g_strcmp0(mode, "weights") != 0 && g_strcmp0(mode, "data") != 0)
    return wsync_fail(error, WSYNC_ERROR_CONFIG, "mm-encoder-tp-mode must be weights or data, "
                      "not \"%s\"", mode != NULL ? mode : "");
  if (moe_backend_of(moe) < 0)
    return wsync_fail(error, WSYNC_ERROR_CONFIG, MOE_BACKEND_RULE ", not \"%s\"",
                      moe != NULL ? moe : "");
  if (!served_dtype_of(dtype_name, &dtype))
    return wsync_fail(error, WSYNC_ERROR_CONFIG, DTYPE_RULE ", not \"%s\"",
                      dtype_name != NULL ? dtype_name : "");
  if (pcp < 1 || pcp > MAX_PCP)
    return wsync_fail(error, WSYNC_ERROR_CONFIG,
                      "prefill-context-parallel-size must be a whole number from 1 to %d, "
                      "not %ld",
                      MAX_PCP, pcp);
  return add_target(plugin, "vllm", "each vLLM TP/EP rank's tensors under vLLM's names", cfg,
                    error) &&
         add_target(plugin, "vllm-ascend",
                    "as vllm, for vLLM-Ascend on Huawei NPUs",
                    cfg, error);
}

WSYNC_PLUGIN_DEFINE("vllm", "vLLM per-rank layouts: sharded_state checkpoints, live updates",
                    options, vllm_register)
