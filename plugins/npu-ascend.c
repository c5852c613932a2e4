/* wsync plugin "npu-ascend": vLLM-Ascend on Huawei NPUs (target "vllm-ascend", built
 * by the "vllm" plugin; docs/vllm-ascend.md, cited below as §N).
 *
 * What a vllm-ascend rank file holds
 * ----------------------------------
 * Everything a `vllm` rank file of the same format holds (names, TP/EP slicing, packing,
 * vocabulary padding, and in the sharded-state format the scale buffers and expert
 * maps), with vLLM-Ascend's router alias (§2), and:
 *
 *   --format sharded-state  the loader layout, as `vllm serve --load-format
 *                           sharded_state` on vLLM-Ascend loads it before
 *                           process_weights_after_loading runs (§3, docs/vllm.md §6):
 *                           w13_weight [E_loc, 2*I/tp, H] rows [gate ; up], w2_weight
 *                           [E_loc, H, I/tp]
 *   --format kernel         the routed experts in the layout vLLM-Ascend's
 *                           AscendUnquantizedFusedMoEMethod.process_weights_after_loading
 *                           leaves them in and torch_npu.npu_grouped_matmul consumes (§3),
 *                           what a live update with is_checkpoint_format=false copies into:
 *                           w13_weight [E_loc, H, 2*I/tp] columns [gate | up], w2_weight
 *                           [E_loc, I/tp, H], both `w.transpose(1, 2).contiguous()` of the
 *                           loader layout
 *
 * The processed layout is written only in the kernel format: given to sharded_state, a
 * processed file fails in copy_, or loads transposed without an error when H == 2I/tp.
 *
 * Dense linear weights (qkv_proj, o_proj, gate_up_proj, down_proj, the router, shared
 * experts) stay [out, in]: AscendUnquantizedLinearMethod does not transpose them (§4).
 *
 * ND, not NZ: every weight is written in ND format (plain row-major).  Which format
 * vLLM-Ascend runs a weight in depends on the deployment (§3, §4):
 *
 *   A2/A3        maybe_trans_nz casts BF16/FP16 weights to FRACTAL_NZ only with
 *                `weight_nz_mode=2`; the default mode 1 casts quantized weights only, and
 *                RL deployments force mode 0 (`rl_config`; wake_up and start_weight_update
 *                refuse any non-zero mode), so BF16 weights stay ND there
 *   fused MC2    with `enable_fused_mc2` (off by default) the routed experts are cast to
 *                FRACTAL_NZ whatever the mode, or the MoE kernel runs per-expert copies
 *                of them (w13_weight_list / w2_weight_list)
 *   310P         maybe_trans_nz always casts (experts and dense linears alike)
 *
 * So the kernel format serves A2/A3 with weight_nz_mode 0 or 1 and without fused MC2; it
 * does not serve fused MC2, 310P or weight_nz_mode=2.  wsync cannot see the deployment:
 * the plan of a kernel-format output says this in a note.  The sharded-state format
 * holds the loader layout, which vLLM-Ascend's own process_weights_after_loading casts.
 *
 * Sleep mode: the vLLM-Ascend releases for vLLM 0.17 to 0.26.x replace w13_weight and
 * w2_weight in wake_up by views in the loader shape (§5 "Sleep / wake-up"); the files are
 * the same, and the plan for such a vllm-version says in a note that the processed
 * parameters must be put back before a kernel-format copy.
 *
 * Layout state is data
 * --------------------
 * Each rank file records in its `__metadata__` the layout of its experts:
 * `wsync.moe-layout` = "processed" | "preprocessed" for the rank, and
 * `wsync.layout.<tensor name>` for every expert tensor.  The hook
 * "ascend-processed-experts" runs after the vllm plugin built a rank's layout (the
 * loader layout), both for layouts being written and for rank files being read, and
 * swaps the last two axes of exactly the expert tensors that are to be (or are) in the
 * processed state:
 *
 *   writing   processed in the kernel format, preprocessed in the sharded-state format;
 *   reading   the state the file records (per tensor, else per rank file); a file that
 *             records none holds the loader layout.
 *
 * Because the transpose is a permutation of the tensor's axes in the plan (every
 * placement's strides permuted, wsync_layout_tensor_permute_last2()), not a step applied
 * to bytes, converting between any of hf, vllm and vllm-ascend (either format) copies
 * each element once from where the input holds it to where the output wants it, and
 * processed files are never transposed a second time.
 *
 * Option `moe-layout` is deprecated and ignored (the format decides); setting it prints
 * a warning.
 *
 * Environment (`wsync env --backend npu-ascend --mode colocate|server`): see the env
 * patches at the end of this file (§6), VLLM_ASCEND_ENABLE_NZ=0 among them: the kernel
 * format above serves weight_nz_mode 0 or 1, and the engine's own update entry points
 * accept only 0.
 */
#include <string.h>

#include <wsync/layout.h>
#include <wsync/plugin.h>
#include <wsync/target.h>

#define KEY_MOE_LAYOUT "wsync.moe-layout"
#define KEY_TENSOR_LAYOUT "wsync.layout."

typedef enum {
  MOE_PROCESSED,
  MOE_PREPROCESSED,
} MoeLayout;

static const char *const moe_layout_names[] = {"processed", "preprocessed"};

static gboolean
parse_moe_layout(const char *text, MoeLayout *layout)
{
  for (guint i = 0; text != NULL && i < G_N_ELEMENTS(moe_layout_names); i++)
    if (strcmp(text, moe_layout_names[i]) == 0) {
      *layout = (MoeLayout)i;
      return TRUE;
    }
  return FALSE;
}

/* The deprecated option still only takes its two old values; libconfuse calls this for
 * each value a file sets, and the message reads FILE:LINE: ... */
static int
validate_moe_layout(cfg_t *cfg, cfg_opt_t *opt)
{
  MoeLayout layout;
  const char *value;

  if (cfg_opt_size(opt) == 0)
    return 0;
  value = cfg_opt_getnstr(opt, cfg_opt_size(opt) - 1);
  if (parse_moe_layout(value, &layout))
    return 0;
  cfg_error(cfg, "moe-layout must be \"processed\" or \"preprocessed\", not \"%s\"",
            value != NULL ? value : "");
  return -1;
}

/* ------------------------------------------------------------------ the hook */

/* A routed-experts tensor: the vllm plugin records the param it built each tensor for;
 * shared experts and dense MLPs are plain linears. */
static gboolean
is_expert_tensor(const WsyncLayoutTensor *tensor)
{
  const WsyncParam *param = wsync_layout_tensor_get_param(tensor);

  /* w13_weight is led by the experts' gate stack, w2_weight holds their down stack */
  return param != NULL &&
         (param->role == WSYNC_ROLE_EXPERTS_GATE || param->role == WSYNC_ROLE_EXPERTS_DOWN);
}

/* A recorded state, or an error naming the key. */
static gboolean
recorded_state(WsyncLayout *layout, const char *key, MoeLayout fallback, MoeLayout *state,
               GError **error)
{
  const char *value = wsync_layout_get_input_metadata(layout, key);

  *state = fallback;
  if (value == NULL)
    return TRUE;
  if (parse_moe_layout(value, state))
    return TRUE;
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
              "rank %u of the vllm-ascend input: metadata %s is \"%s\", not \"processed\" or "
              "\"preprocessed\"",
              wsync_layout_get_rank(layout), key, value);
  return FALSE;
}

/* The deployments an ND kernel-format file serves (see the top of this file): a note,
 * not an error, since the plan cannot know which one will load the files. */
#define NOTE_KERNEL_ND                                                                   \
  "format kernel on vllm-ascend: every weight is written in ND format, which serves "    \
  "A2/A3 with weight_nz_mode 0 or 1 (the default) and enable_fused_mc2 off (the "        \
  "default); it does not serve 310P (which casts weights to FRACTAL_NZ), fused MC2 "     \
  "(enable_fused_mc2: the MoE kernel runs the experts in FRACTAL_NZ or from per-expert " \
  "copies) or weight_nz_mode=2 (BF16/FP16 in FRACTAL_NZ); vLLM-Ascend's own sleep-mode " \
  "wake-up and start_weight_update refuse to run unless VLLM_ASCEND_ENABLE_NZ is 0 (the " \
  "releases for vLLM 0.22 to 0.26 read it in start_weight_update whatever "              \
  "additional_config says) and so is an additional_config weight_nz_mode if given; "     \
  "`wsync env --backend npu-ascend --mode colocate|server` sets the variable and "       \
  "advises additional_config weight_nz_mode = 0, the one setting left once main drops "  \
  "the variable "                                                                        \
  "(docs/vllm-ascend.md §3, §4, §6)"

/* vLLM-Ascend's release branches for vLLM 0.17 to 0.26.x (v0.17.0rc1 to
 * releases/v0.26.0rc) transpose the routed experts back to the loader shape in
 * NPUWorker.wake_up, for a checkpoint-format reload that process_weights_after_loading
 * follows; vllm-ascend #13012 removed that before its lane for vLLM 0.27.1
 * (docs/vllm-ascend.md §5 "Sleep / wake-up"). */
#define NOTE_WAKE_UP_TRANSPOSE                                                             \
  "format kernel on vllm-ascend for vLLM 0.17 to 0.26.x: vLLM-Ascend's releases for "     \
  "them transpose the routed experts back to the loader shape when the weights wake up "  \
  "(NPUWorker.wake_up with tags None or \"weights\"; removed by vllm-ascend #13012 "      \
  "for 0.27.1), so these files match the experts of an engine whose weights did not "    \
  "sleep; after such a wake_up w13_weight and w2_weight are views [E_loc, 2I/tp, H] and " \
  "[E_loc, H, I/tp] of the restored storage until the processed parameters are put "      \
  "back, which wsync.vllm_worker.wsync_load does before it copies; vLLM-Ascend's own "    \
  "kernel-format update does not (docs/vllm-ascend.md §5)"

/* Whether the vLLM release the files are for (the vllm plugin's vllm-version, "latest"
 * meaning 0.27.1) is served by a vLLM-Ascend whose wake_up transposes the experts: a
 * release before 0.27.  The vllm plugin refuses versions it does not know. */
static gboolean
wake_up_transposes(WsyncLayout *layout)
{
  cfg_t *vllm = wsync_layout_get_option(layout, "vllm");
  const char *text = vllm != NULL ? cfg_getstr(vllm, "vllm-version") : NULL;
  g_auto(GStrv) fields = NULL;
  guint64 major, minor;

  if (text == NULL || strcmp(text, "latest") == 0)
    return FALSE;
  fields = g_strsplit(text[0] == 'v' ? text + 1 : text, ".", 3);
  if (g_strv_length(fields) < 2 ||
      !g_ascii_string_to_unsigned(fields[0], 10, 0, G_MAXUINT32, &major, NULL) ||
      !g_ascii_string_to_unsigned(fields[1], 10, 0, G_MAXUINT32, &minor, NULL))
    return FALSE;
  return major == 0 && minor < 27;
}

/* After the vllm plugin built a rank (in the loader layout): puts the expert tensors
 * into the processed layout where they are to be (writing: the kernel format) or are
 * (reading: the files' metadata), and records every state. */
static gboolean
processed_experts(WsyncLayout *layout, gpointer user_data, GError **error)
{
  gboolean reading = wsync_layout_is_reading(layout);
  gboolean kernel = g_strcmp0(wsync_layout_get_format(layout), "kernel") == 0;
  guint n = wsync_layout_n_tensors(layout);
  MoeLayout rank_state = kernel ? MOE_PROCESSED : MOE_PREPROCESSED;

  (void)user_data;
  if (kernel && !reading) {
    wsync_layout_add_note(layout, NOTE_KERNEL_ND);
    if (wake_up_transposes(layout))
      wsync_layout_add_note(layout, NOTE_WAKE_UP_TRANSPOSE);
  }
  /* Rank files that record no state hold the loader layout. */
  if (reading && !recorded_state(layout, KEY_MOE_LAYOUT, MOE_PREPROCESSED, &rank_state, error))
    return FALSE;
  wsync_layout_set_metadata(layout, KEY_MOE_LAYOUT, moe_layout_names[rank_state]);
  for (guint i = 0; i < n; i++) {
    WsyncLayoutTensor *tensor = wsync_layout_tensor(layout, i);
    const char *name = wsync_layout_tensor_get_name(tensor);
    g_autofree char *key = NULL;
    MoeLayout state = rank_state;

    if (!is_expert_tensor(tensor))
      continue;
    key = g_strconcat(KEY_TENSOR_LAYOUT, name, NULL);
    if (reading && !recorded_state(layout, key, rank_state, &state, error))
      return FALSE;
    /* The vllm plugin built it preprocessed; only that state is transposed, once. */
    if (state == MOE_PROCESSED)
      wsync_layout_tensor_permute_last2(tensor);
    wsync_layout_set_metadata(layout, key, moe_layout_names[state]);
    wsync_layout_tensor_set_state(layout, tensor, moe_layout_names[state]);
  }
  return TRUE;
}

/* ------------------------------------------------------------------ environment */

/* torch_npu picks devices by ASCEND_RT_VISIBLE_DEVICES; launchers written for GPUs
 * (Ray, torchrun wrappers, RL frameworks) set CUDA_VISIBLE_DEVICES only. */
static gboolean
env_visible_devices(WsyncEnv *env, gpointer user_data, GError **error)
{
  const char *cuda = wsync_env_getenv(env, "CUDA_VISIBLE_DEVICES");

  (void)user_data;
  (void)error;
  if (cuda == NULL || wsync_env_getenv(env, "ASCEND_RT_VISIBLE_DEVICES") != NULL)
    return TRUE;
  wsync_env_set(env, "ASCEND_RT_VISIBLE_DEVICES", cuda,
                "torch_npu selects NPUs by ASCEND_RT_VISIBLE_DEVICES and does not translate "
                "CUDA_VISIBLE_DEVICES, which is the only one set: copied");
  return TRUE;
}

/* The CANN toolkit's Python packages first on PYTHONPATH (each other entry kept once,
 * in order, empty ones included: an empty entry means the current directory). */
static gboolean
env_cann_pythonpath(WsyncEnv *env, gpointer user_data, GError **error)
{
  const char *home = wsync_env_getenv(env, "ASCEND_TOOLKIT_HOME");
  const char *old;
  g_autofree char *site = NULL;
  GString *path;

  (void)user_data;
  (void)error;
  if (home == NULL || home[0] == '\0')
    return TRUE;
  site = g_build_filename(home, "python", "site-packages", NULL);
  path = g_string_new(site);
  old = wsync_env_getenv(env, "PYTHONPATH");
  if (old != NULL && old[0] != '\0') {
    g_auto(GStrv) entries = g_strsplit(old, ":", -1);
    for (guint i = 0; entries[i] != NULL; i++)
      if (strcmp(entries[i], site) != 0)
        g_string_append_printf(path, ":%s", entries[i]);
  }
  wsync_env_set(env, "PYTHONPATH", path->str,
                "Ray workers do not inherit the toolkit's shell set-up (set_env.sh): the CANN "
                "Python packages in $ASCEND_TOOLKIT_HOME/python/site-packages go first on "
                "PYTHONPATH");
  g_string_free(path, TRUE);
  return TRUE;
}

/* Colocated training and rollout: PYTORCH_NPU_ALLOC_CONF with expandable_segments:False,
 * other allocator settings kept in place. */
static gboolean
env_alloc_conf(WsyncEnv *env, gpointer user_data, GError **error)
{
  const char *old = wsync_env_getenv(env, "PYTORCH_NPU_ALLOC_CONF");
  GString *conf;
  gboolean replaced = FALSE;

  (void)user_data;
  (void)error;
  if (strcmp(wsync_env_get_mode(env), "colocate") != 0)
    return TRUE;
  conf = g_string_new(NULL);
  if (old != NULL && old[0] != '\0') {
    g_auto(GStrv) options = g_strsplit(old, ",", -1);
    for (guint i = 0; options[i] != NULL; i++) {
      const char *item = g_strstrip(options[i]);
      g_autofree char *key = g_strstrip(g_strndup(item, strcspn(item, ":")));
      if (item[0] == '\0')
        continue;
      if (strcmp(key, "expandable_segments") == 0) {
        if (replaced)
          continue;
        item = "expandable_segments:False";
        replaced = TRUE;
      }
      g_string_append_printf(conf, "%s%s", conf->len > 0 ? "," : "", item);
    }
  }
  if (!replaced)
    g_string_append_printf(conf, "%sexpandable_segments:False", conf->len > 0 ? "," : "");
  wsync_env_set(env, "PYTORCH_NPU_ALLOC_CONF", conf->str,
                "colocated memory saving (sleep/wake-up) breaks with the expandable_segments:True "
                "that NPU images set; an empty value is not enough, it must be set to False "
                "explicitly");
  g_string_free(conf, TRUE);
  return TRUE;
}

/* Whether @text is what Python's int() reads as 0 in envs.py: surrounding blanks, one
 * sign and one or more zeros.  ("++0" and "+-0" are not: int() raises ValueError on
 * them, so vLLM-Ascend fails when it reads the variable.  "0_0", which int() reads as 0,
 * is not recognised: it gets the export of 0 it needs no more, which is harmless.) */
static gboolean
is_python_int_zero(const char *text)
{
  g_autofree char *copy = g_strstrip(g_strdup(text));
  const char *zeros = copy[0] == '+' || copy[0] == '-' ? copy + 1 : copy;

  return zeros[0] != '\0' && zeros[strspn(zeros, "0")] == '\0';
}

/* FRACTAL_NZ off: vLLM-Ascend refuses its weight updates while weight_nz_mode is not 0,
 * and its default is 1.  wake_up (sleep mode, colocated) raises "FRACTAL_NZ mode is
 * enabled" in every release (reading VLLM_ASCEND_ENABLE_NZ at v0.18.0, weight_nz_mode
 * later), and so does start_weight_update (the weight-transfer API, server or colocated),
 * which reads the variable itself in the releases for 0.22 to 0.26 (docs/vllm-ascend.md
 * §4, §6).  In both modes: both update paths refuse.
 *
 * Two settings, since no one of them works in every release:
 * - the variable, the only switch up to the releases for vLLM 0.19 (v0.19.1rc1:
 *   vllm_ascend/utils.py:167-172 reads it, no additional_config key) and the one
 *   start_weight_update reads from 0.22 to 0.26;
 * - additional_config weight_nz_mode, which takes precedence over the variable from the
 *   releases for 0.20 on (ascend_config.py:218-224 @ 792ea0c6de31, :240-245 @
 *   182b75ea84ff) and is the only one left once the variable goes: main warns that it
 *   "will be removed in the next release" (_get_config_value, ascend_config.py:361-372
 *   @ 182b75ea84ff) and its refusal says "Please set weight_nz_mode=0 via
 *   --additional-config" (worker.py:248-255, 288-295).  Releases before 0.20 read the
 *   additional_config keys they know with .get() and ignore this one.  wsync cannot see
 *   the engine's additional_config, so this is advised whatever the variable says. */
#define WHY_NZ_CONFIG                                                                      \
  "vLLM-Ascend main warns that VLLM_ASCEND_ENABLE_NZ will be removed in the next "        \
  "release: from then on only additional_config weight_nz_mode turns FRACTAL_NZ off "     \
  "(read from the releases for vLLM 0.20 on, where it overrides the variable; ignored "   \
  "before), so give both: vllm serve --additional-config '{\"weight_nz_mode\": 0}', or " \
  "LLM(..., additional_config={\"weight_nz_mode\": 0}), merged into any additional_config " \
  "already given"

static gboolean
env_nz_off(WsyncEnv *env, gpointer user_data, GError **error)
{
  const char *old = wsync_env_getenv(env, "VLLM_ASCEND_ENABLE_NZ");

  (void)user_data;
  (void)error;
  if (old == NULL || !is_python_int_zero(old))
    wsync_env_set(env, "VLLM_ASCEND_ENABLE_NZ", "0",
                  "vLLM-Ascend refuses weight updates with FRACTAL_NZ on (its default, mode 1): "
                  "wake_up and start_weight_update raise \"FRACTAL_NZ mode is enabled\" unless "
                  "it is 0; an additional_config weight_nz_mode, which takes precedence, must be "
                  "0 as well");
  wsync_env_advise(env, "additional_config.weight_nz_mode", "0", WHY_NZ_CONFIG);
  return TRUE;
}

/* ------------------------------------------------------------------ registration */

/* Designated initialisers: CFG_STR() has no slot for a validating callback or a comment. */
static cfg_opt_t options[] = {
    {.name = "moe-layout",
     .type = CFGT_STR,
     .flags = CFGF_NODEFAULT,
     .validcb = validate_moe_layout,
     .comment = WSYNC_OPTION_DOC(
         "Deprecated and ignored, with a warning: the format decides the expert layout "
         "(--format kernel writes the processed layout, --format sharded-state the loader "
         "layout).",
         "\"processed\" or \"preprocessed\"")},
    CFG_END()};

static gboolean
ascend_register(WsyncPlugin *plugin, GError **error)
{
  const char *value = cfg_getstr(wsync_plugin_get_options(plugin), "moe-layout");

  /* Deprecated: the format decides (sharded-state: the loader layout, kernel: processed). */
  if (value != NULL)
    wsync_plugin_warn(plugin,
                      "option moe-layout = \"%s\" is deprecated and ignored: vllm-ascend "
                      "writes the processed expert layout with --format kernel and the "
                      "loader layout with --format sharded-state",
                      value);
  return wsync_plugin_add_hook(plugin, "ascend-processed-experts", WSYNC_PRIORITY_DEFAULT,
                               "vllm-ascend", processed_experts, NULL, NULL, error) &&
         wsync_plugin_add_env_patch(plugin, "ascend-visible-devices", WSYNC_PRIORITY_DEFAULT,
                                    "npu-ascend", env_visible_devices, NULL, NULL, error) &&
         wsync_plugin_add_env_patch(plugin, "cann-pythonpath", WSYNC_PRIORITY_DEFAULT,
                                    "npu-ascend", env_cann_pythonpath, NULL, NULL, error) &&
         wsync_plugin_add_env_patch(plugin, "npu-alloc-conf", WSYNC_PRIORITY_DEFAULT,
                                    "npu-ascend", env_alloc_conf, NULL, NULL, error) &&
         wsync_plugin_add_env_patch(plugin, "npu-nz-off", WSYNC_PRIORITY_DEFAULT,
                                    "npu-ascend", env_nz_off, NULL, NULL, error);
}

WSYNC_PLUGIN_DEFINE("npu-ascend",
                    "vLLM-Ascend: MoE experts in the npu_grouped_matmul layout, NPU environment",
                    options, ascend_register)
