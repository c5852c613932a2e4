/* wsync plugin "qwen3_5_moe": Qwen3.5 / Qwen3.6, MoE (Qwen3.5-35B-A3B, 122B-A10B,
 * 397B-A17B, Qwen3.6-35B-A3B) and dense (Qwen3.5-4B, 27B, Qwen3.6-27B), described from
 * config.json alone.
 *
 * One remapper, serving model_type "qwen3_5_moe" and "qwen3_5" (text model_type
 * "qwen3_5_moe_text" / "qwen3_5_text").  The published checkpoints are a multimodal
 * wrapper (hf-qwen.md §1.3, §1.4, §1.5): the text model under `model.language_model.`,
 * the vision tower under `model.visual.`, `lm_head.weight` at the top (absent when the
 * embeddings are tied) and a multi-token-prediction block under `mtp.`.  vLLM holds
 * them as `language_model.model.`, `visual.` and `language_model.lm_head.`
 * (`hf_to_vllm_mapper`, vllm-layouts.md §3.5) and skips `mtp.` (the params are in group
 * "mtp", which the vllm backend drops by its rule "vllm-skips-mtp").
 *
 * It declares:
 *
 *  - the logical tensors, named like the published checkpoint tensors, except that a
 *    MoE layer's experts are three stacked tensors `PREFIX.mlp.experts.{gate,up,down}`
 *    ([E, I, H], [E, I, H], [E, H, I]);
 *  - the params, with vLLM's runtime names and how each is sharded:
 *      full attention (vllm-layouts.md §3.2): qkv_proj = [q | k | v] where q_proj is
 *        [2*nh*hd, H] with each head's query and output gate interleaved ([q_h; gate_h],
 *        hf-qwen.md §1.3), so a q unit is 2*hd rows; KV heads replicated when tp > nkv;
 *      linear attention, Gated DeltaNet (vllm-layouts.md §3.3): in_proj_qkvz = [q_t |
 *        k_t | v_t | z_t] from the rows [0, kd), [kd, 2kd), [2kd, 2kd+vd) of in_proj_qkv
 *        and all of in_proj_z; in_proj_ba = [b_t | a_t]; conv1d sliced per q/k/v channel
 *        block; A_log held in float32; dt_bias sliced; norm replicated, in the model
 *        dtype; out_proj row-parallel;
 *      MoE (vllm-layouts.md §3.4): router and shared-expert gate replicated, the shared
 *        expert's gate_up_proj / down_proj column / row parallel, the routed experts as
 *        w13 / w2 under `language_model.model.layers.L.mlp.experts`; a dense model has
 *        mlp.gate_up_proj / mlp.down_proj;
 *      the vision tower (vllm-vision.md, default mm_encoder_tp_mode "weights"), group
 *        "visual": attn.qkv as three parts q, k, v of D rows each (one unit per head),
 *        the MLP and merger fc1 column-parallel, attn.proj / fc2 row-parallel, every
 *        norm, bias of a row-parallel layer, the patch embedding and the position
 *        embedding whole;
 *  - the Hugging Face layouts: "hf" is the published form, whose main layers hold their
 *    experts fused (`mlp.experts.gate_up_proj [E, 2I, H]`, gate rows first, and
 *    `mlp.experts.down_proj [E, H, I]`, no `.weight`) and whose MTP block holds them per
 *    expert (`mtp.layers.0.mlp.experts.{e}.{gate,up,down}_proj.weight`, hf-qwen.md §1.4);
 *    "hf-experts" is every expert per expert, "hf-fused" every expert fused.  Reading
 *    "hf", each layer is read in the form the input has.
 *
 * Dtypes.  The logical tensors are declared in the model dtype, except A_log and
 * linear_attn.norm.weight, which Qwen3.5-35B-A3B and Qwen3.5-4B publish in F32
 * (hf-qwen.md §1.3, §1.4): that is what `wsync synth` writes and what the Hugging Face
 * layouts write (a BF16 value, as Qwen3.6-27B publishes them, is widened exactly).
 * vLLM holds A_log in F32 (vLLM #37810) and RMSNormGated in the model dtype, so a
 * vllm target widens a BF16 A_log and rounds an F32 norm (nearest even, torch's
 * copy_); the plan prints both notes.  Reading rank files back to "hf" widens the
 * rounded norm exactly: the round trip is bit-exact for everything but that norm.
 * Rank files hold no `mtp.*` (nor `visual.*` with language-model-only), so "hf" can be
 * written from them only for a model without those (the engine refuses otherwise,
 * naming the first tensor no input holds).
 *
 * Config fields (hf-qwen.md §3): the text fields are read from `text_config` (or the
 * root when there is none), the vision fields from `vision_config` (no vision tower
 * when there is none).  Every field that decides a shape is required; defaults only
 * where Transformers has one that the published configs rely on: head_dim (H / heads),
 * attn_output_gate (true), layer_types (from full_attention_interval, default 4),
 * mtp_num_hidden_layers (1), vision in_channels (3), tie_word_embeddings (false) and
 * the dtype (bfloat16).  Errors are one line naming the field; the engine prefixes
 * the config file's path.
 *
 * Option (conf.d/31-qwen3_5_moe.conf):
 *   language-model-only  vLLM builds no vision tower when every multimodal limit is 0
 *                        (`--language-model-only`, vllm-layouts.md §3.5): every visual
 *                        param is dropped at runtime by the rule "language-model-only";
 *                        the Hugging Face layouts keep them.
 */
#include <string.h>

#include <wsync/engine.h>
#include <wsync/plugin.h>

/* A config value larger than this is refused: shapes stay far from overflowing. */
#define FIELD_MAX G_GUINT64_CONSTANT(0x7fffffff)

/* Layer, expert, vision block and MTP layer counts: each adds tensors to the plan (the
 * largest published model has 60 layers and 512 experts, hf-qwen.md §3). */
#define COUNT_MAX 65536
#define EXPERT_TENSORS_MAX (3u << 18)

/* One JSON object of the config and the prefix its fields carry in messages. */
typedef struct {
  JsonObject *obj;
  const char *where; /* "text_config.", "vision_config." or "" */
} Fields;

typedef struct {
  gboolean present;
  guint64 depth, hidden, inter, heads, patch, temporal, merge, in_channels, positions, out;
} VisionConfig;

/* What the remapper needs from config.json. */
typedef struct {
  JsonObject *root;
  Fields text;
  gboolean moe; /* model_type "qwen3_5_moe": the sparse block in every layer */
  guint64 hidden, heads, kv_heads, head_dim, vocab, layers;
  gboolean output_gate;
  guint8 *linear; /* per layer: linear attention (else full attention) */
  gboolean any_linear;
  guint64 nk, nv, dk, dv, conv;
  guint64 experts, moe_inter, shared_inter, inter;
  guint64 mtp_layers;
  gboolean tie;
  WsyncDtype dtype;
  VisionConfig vision;
} Q35Config;

/* ------------------------------------------------------------------ reading config.json */

/* A member, NULL when absent or null (null means "not set" in Transformers configs). */
static JsonNode *
field(const Fields *f, const char *key)
{
  JsonNode *node = json_object_get_member(f->obj, key);

  return node != NULL && !JSON_NODE_HOLDS_NULL(node) ? node : NULL;
}

static gboolean
missing(const Fields *f, const char *key, const char *alternative, GError **error)
{
  if (alternative != NULL)
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "field \"%s%s\" (or %s) is missing", f->where, key, alternative);
  else
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT, "field \"%s%s\" is missing", f->where,
                key);
  return FALSE;
}

static gboolean
not_a(const Fields *f, const char *key, JsonNode *node, const char *want, GError **error)
{
  g_autofree char *text = json_to_string(node, FALSE);

  if (strlen(text) > 64) /* a long list is named, not quoted whole */
    strcpy(text + 60, "...");
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT, "field \"%s%s\" must be %s, not %s",
              f->where, key, want, text);
  return FALSE;
}

/* An integer in [min, FIELD_MAX]. */
static gboolean
node_uint(const Fields *f, const char *key, JsonNode *node, guint64 min, guint64 *out,
          GError **error)
{
  gint64 v;

  if (!JSON_NODE_HOLDS_VALUE(node) || json_node_get_value_type(node) != G_TYPE_INT64)
    return not_a(f, key, node, min > 0 ? "a positive integer" : "a non-negative integer", error);
  v = json_node_get_int(node);
  if (v < (gint64)min || (guint64)v > FIELD_MAX)
    return not_a(f, key, node,
                 min > 0 ? "a positive integer below 2^31" : "a non-negative integer below 2^31",
                 error);
  *out = (guint64)v;
  return TRUE;
}

/* A required integer field (@alternative: a second accepted key, or NULL). */
static gboolean
required_uint(const Fields *f, const char *key, const char *alternative, guint64 min,
              guint64 *out, GError **error)
{
  JsonNode *node = field(f, key);
  const char *used = key;

  if (node == NULL && alternative != NULL) {
    node = field(f, alternative);
    used = alternative;
  }
  if (node == NULL)
    return missing(f, key, alternative, error);
  return node_uint(f, used, node, min, out, error);
}

/* An optional integer field; *out keeps its default when the field is absent. */
static gboolean
optional_uint(const Fields *f, const char *key, guint64 min, guint64 *out, GError **error)
{
  JsonNode *node = field(f, key);

  return node == NULL || node_uint(f, key, node, min, out, error);
}

/* An optional boolean field; *out keeps its default when the field is absent. */
static gboolean
optional_bool(const Fields *f, const char *key, gboolean *out, GError **error)
{
  JsonNode *node = field(f, key);

  if (node == NULL)
    return TRUE;
  if (!JSON_NODE_HOLDS_VALUE(node) || json_node_get_value_type(node) != G_TYPE_BOOLEAN)
    return not_a(f, key, node, "true or false", error);
  *out = json_node_get_boolean(node);
  return TRUE;
}

/* tie_word_embeddings: in text_config, else at the root (Qwen3.5 configs carry it in
 * both, hf-qwen.md §3); default false. */
static gboolean
read_tie(Q35Config *c, GError **error)
{
  Fields root = {c->root, ""};

  c->tie = FALSE;
  if (field(&c->text, "tie_word_embeddings") != NULL)
    return optional_bool(&c->text, "tie_word_embeddings", &c->tie, error);
  return optional_bool(&root, "tie_word_embeddings", &c->tie, error);
}

/* The published dtype: `dtype` (Transformers 5) or `torch_dtype` (Transformers 4), in
 * text_config then at the root (hf-qwen.md §3, "dtype key"); default bfloat16. */
static gboolean
read_dtype(Q35Config *c, GError **error)
{
  static const char *const names[] = {"bfloat16", "float16", "float32"};
  static const WsyncDtype dtypes[] = {WSYNC_DTYPE_BF16, WSYNC_DTYPE_F16, WSYNC_DTYPE_F32};
  Fields objects[2] = {c->text, {c->root, ""}};
  const char *keys[] = {"dtype", "torch_dtype"};

  c->dtype = WSYNC_DTYPE_BF16;
  for (guint o = 0; o < G_N_ELEMENTS(objects); o++)
    for (guint k = 0; k < G_N_ELEMENTS(keys); k++) {
      JsonNode *node = field(&objects[o], keys[k]);
      const char *value;

      if (node == NULL)
        continue;
      value = JSON_NODE_HOLDS_VALUE(node) && json_node_get_value_type(node) == G_TYPE_STRING
                  ? json_node_get_string(node)
                  : NULL;
      for (guint i = 0; value != NULL && i < G_N_ELEMENTS(names); i++)
        if (strcmp(value, names[i]) == 0) {
          c->dtype = dtypes[i];
          return TRUE;
        }
      return not_a(&objects[o], keys[k], node, "\"bfloat16\", \"float16\" or \"float32\"",
                   error);
    }
  return TRUE;
}

/* text_config.model_type, when given, must be the text model of the wrapper: a MoE
 * wrapper around a dense text model (or the reverse) is a contradiction, not a shape to
 * guess. */
static gboolean
check_text_model_type(Q35Config *c, const char *model_type, GError **error)
{
  const char *want = c->moe ? "qwen3_5_moe_text" : "qwen3_5_text";
  JsonNode *node;

  if (c->text.obj == c->root)
    return TRUE;
  node = field(&c->text, "model_type");
  if (node == NULL)
    return TRUE;
  if (!JSON_NODE_HOLDS_VALUE(node) || json_node_get_value_type(node) != G_TYPE_STRING ||
      strcmp(json_node_get_string(node), want) != 0) {
    g_autofree char *text = json_to_string(node, FALSE);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "field \"text_config.model_type\" is %s, but model_type \"%s\" has the text "
                "model \"%s\"",
                text, model_type, want);
    return FALSE;
  }
  return TRUE;
}

/* head_dim: the field when set, else hidden_size / num_attention_heads. */
static gboolean
read_head_dim(Q35Config *c, GError **error)
{
  c->head_dim = 0;
  if (!optional_uint(&c->text, "head_dim", 1, &c->head_dim, error))
    return FALSE;
  if (c->head_dim != 0)
    return TRUE;
  if (c->hidden % c->heads != 0) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "field \"%shead_dim\" is missing and %shidden_size %" G_GUINT64_FORMAT
                " is not a multiple of num_attention_heads %" G_GUINT64_FORMAT,
                c->text.where, c->text.where, c->hidden, c->heads);
    return FALSE;
  }
  c->head_dim = c->hidden / c->heads;
  return TRUE;
}

/* layer_types ("linear_attention" / "full_attention", or the legacy "mamba" /
 * "attention", one per layer) or, when absent,
 * Transformers' and vLLM's default: layer i is linear attention when
 * (i+1) % full_attention_interval != 0, interval 4 by default (hf-qwen.md §3,
 * vllm-layouts.md §3.1). */
static gboolean
read_layer_types(Q35Config *c, GError **error)
{
  JsonNode *node = field(&c->text, "layer_types");
  guint64 interval = 4;

  c->linear = g_new0(guint8, c->layers);
  if (node == NULL) {
    if (!optional_uint(&c->text, "full_attention_interval", 1, &interval, error))
      return FALSE;
    for (guint64 l = 0; l < c->layers; l++)
      c->linear[l] = (l + 1) % interval != 0;
  } else {
    JsonArray *types;

    if (!JSON_NODE_HOLDS_ARRAY(node))
      return not_a(&c->text, "layer_types", node,
                   "a list of \"linear_attention\" / \"full_attention\"", error);
    types = json_node_get_array(node);
    if (json_array_get_length(types) != c->layers) {
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                  "field \"%slayer_types\" has %u entries but %snum_hidden_layers is "
                  "%" G_GUINT64_FORMAT,
                  c->text.where, json_array_get_length(types), c->text.where, c->layers);
      return FALSE;
    }
    for (guint64 l = 0; l < c->layers; l++) {
      JsonNode *item = json_array_get_element(types, (guint)l);
      const char *value = JSON_NODE_HOLDS_VALUE(item) &&
                                  json_node_get_value_type(item) == G_TYPE_STRING
                              ? json_node_get_string(item)
                              : "";
      g_autofree char *key = g_strdup_printf("layer_types[%" G_GUINT64_FORMAT "]", l);

      /* (and the legacy names newer Transformers remaps, hf-qwen.md §3) */
      if (strcmp(value, "linear_attention") == 0 || strcmp(value, "mamba") == 0)
        c->linear[l] = TRUE;
      else if (strcmp(value, "full_attention") != 0 && strcmp(value, "attention") != 0)
        return not_a(&c->text, key, item, "\"linear_attention\" or \"full_attention\"", error);
    }
  }
  for (guint64 l = 0; l < c->layers; l++)
    c->any_linear |= c->linear[l];
  return TRUE;
}

/* The Gated DeltaNet sizes (vllm-layouts.md §3.3).  The value heads are grouped by key
 * head (hf-qwen.md §1.3), so nv must be a multiple of nk. */
static gboolean
read_linear_fields(Q35Config *c, GError **error)
{
  if (!c->any_linear)
    return TRUE;
  if (!required_uint(&c->text, "linear_num_key_heads", NULL, 1, &c->nk, error) ||
      !required_uint(&c->text, "linear_num_value_heads", NULL, 1, &c->nv, error) ||
      !required_uint(&c->text, "linear_key_head_dim", NULL, 1, &c->dk, error) ||
      !required_uint(&c->text, "linear_value_head_dim", NULL, 1, &c->dv, error) ||
      !required_uint(&c->text, "linear_conv_kernel_dim", NULL, 1, &c->conv, error))
    return FALSE;
  if (c->nv % c->nk != 0) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "field \"%slinear_num_value_heads\" (%" G_GUINT64_FORMAT
                ") must be a multiple of %slinear_num_key_heads (%" G_GUINT64_FORMAT ")",
                c->text.where, c->nv, c->text.where, c->nk);
    return FALSE;
  }
  return TRUE;
}

/* MoE: experts (num_experts, or num_local_experts as Transformers 5 may re-save it),
 * moe_intermediate_size and shared_expert_intermediate_size; dense: intermediate_size. */
static gboolean
read_mlp_fields(Q35Config *c, GError **error)
{
  if (!c->moe)
    return required_uint(&c->text, "intermediate_size", NULL, 1, &c->inter, error);
  return required_uint(&c->text, "num_experts", "num_local_experts", 1, &c->experts, error) &&
         required_uint(&c->text, "moe_intermediate_size", NULL, 1, &c->moe_inter, error) &&
         required_uint(&c->text, "shared_expert_intermediate_size", NULL, 1, &c->shared_inter,
                       error);
}

/* vision_config (vllm-vision.md, notation): depth, hidden_size D, intermediate_size,
 * num_heads, patch_size, temporal_patch_size, spatial_merge_size, in_channels (3),
 * num_position_embeddings, out_hidden_size. */
static gboolean
read_vision(Q35Config *c, GError **error)
{
  JsonNode *node = json_object_get_member(c->root, "vision_config");
  VisionConfig *v = &c->vision;
  Fields f;

  memset(v, 0, sizeof *v);
  if (node == NULL || JSON_NODE_HOLDS_NULL(node))
    return TRUE;
  f.where = "vision_config.";
  f.obj = c->root;
  if (!JSON_NODE_HOLDS_OBJECT(node))
    return not_a(&(Fields){c->root, ""}, "vision_config", node, "an object", error);
  f.obj = json_node_get_object(node);
  v->present = TRUE;
  v->in_channels = 3;
  if (!required_uint(&f, "depth", NULL, 1, &v->depth, error) ||
      !required_uint(&f, "hidden_size", NULL, 1, &v->hidden, error) ||
      !required_uint(&f, "intermediate_size", NULL, 1, &v->inter, error) ||
      !required_uint(&f, "num_heads", NULL, 1, &v->heads, error) ||
      !required_uint(&f, "patch_size", NULL, 1, &v->patch, error) ||
      !required_uint(&f, "temporal_patch_size", NULL, 1, &v->temporal, error) ||
      !required_uint(&f, "spatial_merge_size", NULL, 1, &v->merge, error) ||
      !optional_uint(&f, "in_channels", 1, &v->in_channels, error) ||
      !required_uint(&f, "num_position_embeddings", NULL, 1, &v->positions, error) ||
      !required_uint(&f, "out_hidden_size", NULL, 1, &v->out, error))
    return FALSE;
  if (v->hidden % v->heads != 0) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "field \"vision_config.hidden_size\" (%" G_GUINT64_FORMAT
                ") must be a multiple of vision_config.num_heads (%" G_GUINT64_FORMAT ")",
                v->hidden, v->heads);
    return FALSE;
  }
  return TRUE;
}

/* mtp_num_hidden_layers (default 1).  With mtp_use_dedicated_embeddings the MTP block
 * would carry an embedding of its own, a tensor no reference here names: refused rather
 * than guessed (the published configs set it false, hf-qwen.md §3). */
static gboolean
read_mtp(Q35Config *c, GError **error)
{
  gboolean dedicated = FALSE;

  c->mtp_layers = 1;
  if (!optional_uint(&c->text, "mtp_num_hidden_layers", 0, &c->mtp_layers, error) ||
      !optional_bool(&c->text, "mtp_use_dedicated_embeddings", &dedicated, error))
    return FALSE;
  if (dedicated && c->mtp_layers > 0) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "field \"%smtp_use_dedicated_embeddings\" is true: an MTP block with its own "
                "embedding is not a layout qwen3_5_moe knows",
                c->text.where);
    return FALSE;
  }
  return TRUE;
}

static gboolean
read_config(WsyncMapping *m, Q35Config *c, GError **error)
{
  const char *model_type = wsync_mapping_get_model_type(m);
  JsonNode *text;

  c->root = wsync_mapping_get_config(m);
  text = json_object_get_member(c->root, "text_config");
  c->text.obj =
      text != NULL && JSON_NODE_HOLDS_OBJECT(text) ? json_node_get_object(text) : c->root;
  c->text.where = c->text.obj != c->root ? "text_config." : "";
  c->moe = g_strcmp0(model_type, "qwen3_5_moe") == 0;
  c->output_gate = TRUE;
  if (!check_text_model_type(c, model_type, error) ||
      !required_uint(&c->text, "hidden_size", NULL, 1, &c->hidden, error) ||
      !required_uint(&c->text, "num_attention_heads", NULL, 1, &c->heads, error) ||
      !required_uint(&c->text, "num_key_value_heads", NULL, 1, &c->kv_heads, error) ||
      !read_head_dim(c, error) ||
      !optional_bool(&c->text, "attn_output_gate", &c->output_gate, error) ||
      !required_uint(&c->text, "vocab_size", NULL, 1, &c->vocab, error) ||
      !required_uint(&c->text, "num_hidden_layers", NULL, 1, &c->layers, error))
    return FALSE;
  if (c->layers > COUNT_MAX) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "field \"%snum_hidden_layers\" is %" G_GUINT64_FORMAT ", more than %d",
                c->text.where, c->layers, COUNT_MAX);
    return FALSE;
  }
  return read_layer_types(c, error) && read_linear_fields(c, error) &&
         read_mlp_fields(c, error) && read_mtp(c, error) && read_tie(c, error) &&
         read_dtype(c, error) && read_vision(c, error);
}

/* ------------------------------------------------------------------ sizes */

/* Every field is below 2^31; a tensor's element count must stay below 2^57 (so no
 * shape or byte count overflows anywhere). */
static gboolean
fits(guint n, const guint64 *factors)
{
  guint64 numel = 1;

  for (guint i = 0; i < n; i++)
    if (!g_uint64_checked_mul(&numel, numel, factors[i]))
      return FALSE;
  return numel <= (G_GUINT64_CONSTANT(1) << 57);
}

#define FITS(...)                                                                          \
  fits(G_N_ELEMENTS(((const guint64[]){__VA_ARGS__})), (const guint64[]){__VA_ARGS__})

static gboolean
too_many(const char *where, const char *key, guint64 value, GError **error)
{
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
              "field \"%s%s\" is %" G_GUINT64_FORMAT ", more than %d", where, key, value,
              COUNT_MAX);
  return FALSE;
}

static gboolean
check_sizes(const Q35Config *c, GError **error)
{
  const VisionConfig *v = &c->vision;
  guint64 kd = c->nk * c->dk, vd = c->nv * c->dv, merged = v->hidden * v->merge * v->merge;
  gboolean ok;

  if (c->experts > COUNT_MAX)
    return too_many(c->text.where, "num_experts", c->experts, error);
  if (c->mtp_layers > COUNT_MAX)
    return too_many(c->text.where, "mtp_num_hidden_layers", c->mtp_layers, error);
  if (v->depth > COUNT_MAX)
    return too_many("vision_config.", "depth", v->depth, error);
  /* hf-experts writes three tensors for every expert of every layer, MTP included */
  guint64 expert_tensors = (c->layers + c->mtp_layers) * c->experts * 3;
  if (expert_tensors > EXPERT_TENSORS_MAX) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%" G_GUINT64_FORMAT " layers of %" G_GUINT64_FORMAT " experts make %"
                G_GUINT64_FORMAT " expert tensors, more than %u",
                c->layers + c->mtp_layers, c->experts, expert_tensors, EXPERT_TENSORS_MAX);
    return FALSE;
  }
  /* each pair of factors is below 2^62, so the sums below cannot overflow */
  ok = FITS(c->vocab, c->hidden) && FITS(2, c->hidden, c->hidden) &&
       FITS(2, c->heads, c->head_dim, c->hidden) && FITS(c->kv_heads, c->head_dim, c->hidden) &&
       FITS(c->experts, c->moe_inter, c->hidden) && FITS(c->shared_inter, c->hidden) &&
       FITS(c->inter, c->hidden) && FITS(c->experts, c->hidden) && FITS(c->nk, c->dk) &&
       FITS(c->nv, c->dv) && FITS(2 * kd + vd, c->hidden) && FITS(2 * kd + vd, c->conv) &&
       FITS(c->nv, c->hidden);
  if (!ok) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "the sizes in %s make a tensor of more than 2^57 elements",
                c->text.where[0] != '\0' ? "text_config" : "the config");
    return FALSE;
  }
  ok = !v->present ||
       (FITS(v->hidden, v->merge, v->merge, v->hidden, v->merge, v->merge) &&
        FITS(3, v->hidden, v->hidden) && FITS(v->inter, v->hidden) &&
        FITS(v->positions, v->hidden) &&
        FITS(v->hidden, v->in_channels, v->temporal, v->patch, v->patch) &&
        FITS(v->out, merged));
  if (!ok) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "the sizes in vision_config make a tensor of more than 2^57 elements");
    return FALSE;
  }
  return TRUE;
}

/* ------------------------------------------------------------------ logical tensors and params */

/* The dtype a tensor is published in: A_log and linear_attn.norm.weight in F32, as
 * Qwen3.5-35B-A3B and Qwen3.5-4B publish them (hf-qwen.md §1.3, §1.4), everything else
 * in the model dtype. */
static WsyncDtype
published_dtype(const char *name, WsyncDtype model_dtype)
{
  if (g_str_has_suffix(name, ".linear_attn.A_log") ||
      g_str_has_suffix(name, ".linear_attn.norm.weight"))
    return WSYNC_DTYPE_F32;
  return model_dtype;
}

/* The remapper at work. */
typedef struct {
  WsyncMapping *m;
  const Q35Config *c;
  gboolean language_model_only;
} Describer;

/* Where a group of tensors lives: checkpoint and runtime prefixes, the param group, and
 * the rule by which runtime targets drop its params (or NULL). */
typedef struct {
  const char *ck;
  const char *rt;
  const char *group;
  const char *runtime_drop;
} Scope;

/* Declares the logical tensor CK-PREFIX + @suffix of @ndim axes. */
static WsyncVTensor *
tensor_nd(Describer *d, const Scope *s, const char *suffix, guint ndim, const guint64 *shape)
{
  g_autofree char *name = g_strconcat(s->ck, suffix, NULL);

  return wsync_mapping_add_vtensor(d->m, name, published_dtype(name, d->c->dtype), ndim, shape);
}

/* ... of up to three axes (a 0 ends the shape). */
static WsyncVTensor *
tensor(Describer *d, const Scope *s, const char *suffix, guint64 d0, guint64 d1, guint64 d2)
{
  const guint64 shape[3] = {d0, d1, d2};

  return tensor_nd(d, s, suffix, d1 == 0 ? 1 : d2 == 0 ? 2 : 3, shape);
}

/* Rows [start, start + length) of @vt (length 0: to the end), @unit rows per head. */
static WsyncPart
rows(WsyncVTensor *vt, guint64 start, guint64 length, guint64 unit, gboolean replicate)
{
  WsyncPart p = {vt, start, length, unit, replicate};

  return p;
}

/* A param named CK-PREFIX + @name, held as RT-PREFIX + @runtime, in the scope's group. */
static WsyncParam *
param(Describer *d, const Scope *s, const char *name, const char *runtime, WsyncParamKind kind,
      guint n_parts, const WsyncPart *parts)
{
  g_autofree char *ck = g_strconcat(s->ck, name, NULL);
  g_autofree char *rt = g_strconcat(s->rt, runtime, NULL);
  WsyncParam *p = wsync_mapping_add_param(d->m, ck, rt, kind, n_parts, parts);

  if (s->group != NULL)
    wsync_param_set_group(p, s->group);
  if (s->runtime_drop != NULL)
    wsync_param_drop_at_runtime(p, s->runtime_drop);
  return p;
}

/* A param of one whole tensor, whose runtime name has the same suffix. */
static WsyncParam *
whole(Describer *d, const Scope *s, const char *suffix, WsyncVTensor *vt, WsyncParamKind kind)
{
  WsyncPart p = rows(vt, 0, 0, 1, FALSE);

  return param(d, s, suffix, suffix, kind, 1, &p);
}

/* A replicated [n] tensor (RMSNorm / LayerNorm weights and biases, vllm-layouts.md §2,
 * vllm-vision.md).  Qwen3.5's RMSNorms compute x * (1 + w): the weight is copied
 * verbatim, the engine adds the 1 at run time (vllm-layouts.md §3.2). */
static void
replicated_1d(Describer *d, const Scope *s, const char *suffix, guint64 n)
{
  whole(d, s, suffix, tensor(d, s, suffix, n, 0, 0), WSYNC_PARAM_REPLICATED);
}

/* Full attention with the output gate (vllm-layouts.md §3.2, hf-qwen.md §1.3): q_proj
 * [g*nh*hd, H] (g = 2 with attn_output_gate) is per head [q_h; gate_h], so a q unit is
 * g*hd rows and a rank's q slice is whole heads with their gates; k/v one unit per
 * head, replicated when tp > nkv; o_proj row-parallel; q_norm/k_norm replicated; the
 * data-less attention marker for the backend's runtime-only buffers. */
static void
describe_attention(Describer *d, const Scope *s)
{
  const Q35Config *c = d->c;
  guint64 g = c->output_gate ? 2 : 1, q_rows = g * c->heads * c->head_dim;
  guint64 kv_rows = c->kv_heads * c->head_dim;
  WsyncPart qkv[3];

  qkv[0] = rows(tensor(d, s, "self_attn.q_proj.weight", q_rows, c->hidden, 0), 0, 0,
                g * c->head_dim, FALSE);
  qkv[1] = rows(tensor(d, s, "self_attn.k_proj.weight", kv_rows, c->hidden, 0), 0, 0,
                c->head_dim, TRUE);
  qkv[2] = rows(tensor(d, s, "self_attn.v_proj.weight", kv_rows, c->hidden, 0), 0, 0,
                c->head_dim, TRUE);
  param(d, s, "self_attn.{q,k,v}_proj.weight", "self_attn.qkv_proj.weight", WSYNC_PARAM_COLUMN,
        3, qkv);
  whole(d, s, "self_attn.o_proj.weight",
        tensor(d, s, "self_attn.o_proj.weight", c->hidden, c->heads * c->head_dim, 0),
        WSYNC_PARAM_ROW);
  replicated_1d(d, s, "self_attn.q_norm.weight", c->head_dim);
  replicated_1d(d, s, "self_attn.k_norm.weight", c->head_dim);
  param(d, s, "self_attn.attn", "self_attn.attn", WSYNC_PARAM_ATTENTION, 0, NULL);
}

/* Gated DeltaNet (vllm-layouts.md §3.3; kd = nk*dk, vd = nv*dv).  The q, k and v
 * blocks of in_proj_qkv and of the conv1d channels are split per key head (unit dk) and
 * value head (unit dv), so tp must divide nk and nv; the backend refuses it otherwise,
 * naming the tensor. */
static void
describe_linear_attention(Describer *d, const Scope *s)
{
  const Q35Config *c = d->c;
  guint64 kd = c->nk * c->dk, vd = c->nv * c->dv;
  WsyncVTensor *qkv = tensor(d, s, "linear_attn.in_proj_qkv.weight", 2 * kd + vd, c->hidden, 0);
  WsyncVTensor *z = tensor(d, s, "linear_attn.in_proj_z.weight", vd, c->hidden, 0);
  WsyncVTensor *b = tensor(d, s, "linear_attn.in_proj_b.weight", c->nv, c->hidden, 0);
  WsyncVTensor *a = tensor(d, s, "linear_attn.in_proj_a.weight", c->nv, c->hidden, 0);
  WsyncVTensor *conv = tensor(d, s, "linear_attn.conv1d.weight", 2 * kd + vd, 1, c->conv);
  WsyncVTensor *a_log = tensor(d, s, "linear_attn.A_log", c->nv, 0, 0);
  WsyncVTensor *norm = tensor(d, s, "linear_attn.norm.weight", c->dv, 0, 0);
  g_autofree char *norm_note = NULL;
  WsyncPart parts[4];
  WsyncParam *p;

  /* in_proj_qkvz = MergedColumnParallelLinear [kd, kd, vd, vd]: rank t holds
   * [q_t | k_t | v_t | z_t] ("in_proj_qkv" shards 0, 1, 2 and "in_proj_z" shard 3). */
  parts[0] = rows(qkv, 0, kd, c->dk, FALSE);
  parts[1] = rows(qkv, kd, kd, c->dk, FALSE);
  parts[2] = rows(qkv, 2 * kd, vd, c->dv, FALSE);
  parts[3] = rows(z, 0, 0, c->dv, FALSE);
  param(d, s, "linear_attn.in_proj_{qkv,z}.weight", "linear_attn.in_proj_qkvz.weight",
        WSYNC_PARAM_COLUMN, 4, parts);
  /* in_proj_ba = MergedColumnParallelLinear [nv, nv]: [b_t | a_t]. */
  parts[0] = rows(b, 0, 0, 1, FALSE);
  parts[1] = rows(a, 0, 0, 1, FALSE);
  param(d, s, "linear_attn.in_proj_{b,a}.weight", "linear_attn.in_proj_ba.weight",
        WSYNC_PARAM_COLUMN, 2, parts);
  /* conv1d [2kd+vd, 1, K]: mamba_v2_sharded_weight_loader over the q, k, v channel
   * blocks. */
  parts[0] = rows(conv, 0, kd, c->dk, FALSE);
  parts[1] = rows(conv, kd, kd, c->dk, FALSE);
  parts[2] = rows(conv, 2 * kd, vd, c->dv, FALSE);
  param(d, s, "linear_attn.conv1d.weight", "linear_attn.conv1d.weight", WSYNC_PARAM_COLUMN, 3,
        parts);
  /* A_log and dt_bias [nv]: sharded_weight_loader(0). */
  p = whole(d, s, "linear_attn.A_log", a_log, WSYNC_PARAM_COLUMN);
  wsync_param_set_runtime_dtype(p, WSYNC_DTYPE_F32,
                                "vLLM holds A_log in float32 (vLLM #37810); a BF16 checkpoint "
                                "value is widened exactly");
  whole(d, s, "linear_attn.dt_bias", tensor(d, s, "linear_attn.dt_bias", c->nv, 0, 0),
        WSYNC_PARAM_COLUMN);
  /* norm: RMSNormGated(dv), whole on every rank, in the model dtype. */
  p = whole(d, s, "linear_attn.norm.weight", norm, WSYNC_PARAM_REPLICATED);
  if (c->dtype != WSYNC_DTYPE_F32)
    norm_note = g_strdup_printf("vLLM's RMSNormGated is created in the model dtype: an F32 "
                                "checkpoint value is rounded to %s to nearest-even, as "
                                "torch's copy_ does",
                                wsync_dtype_name(c->dtype));
  else
    norm_note = g_strdup("vLLM's RMSNormGated is created in the model dtype, F32");
  wsync_param_set_runtime_dtype(p, c->dtype, norm_note);
  whole(d, s, "linear_attn.out_proj.weight",
        tensor(d, s, "linear_attn.out_proj.weight", c->hidden, vd, 0), WSYNC_PARAM_ROW);
}

/* The sparse block in every layer of the MoE model (vllm-layouts.md §3.4, §2.1, §2.2):
 * router and shared-expert gate replicated; the shared expert's gate_up_proj packs gate
 * then up, column-parallel, and its down_proj is row-parallel; the routed experts are
 * stacked gate [E, I, H], up [E, I, H], down [E, H, I] for w13 = [gate, up] and w2 =
 * [down] under the module prefix `...mlp.experts`. */
static void
describe_moe(Describer *d, const Scope *s, gboolean published_fused)
{
  const Q35Config *c = d->c;
  guint64 e = c->experts, i = c->moe_inter, h = c->hidden, is = c->shared_inter;
  WsyncPart parts[2];

  whole(d, s, "mlp.gate.weight", tensor(d, s, "mlp.gate.weight", e, h, 0),
        WSYNC_PARAM_REPLICATED);
  parts[0] = rows(tensor(d, s, "mlp.experts.gate", e, i, h), 0, 0, 1, FALSE);
  parts[1] = rows(tensor(d, s, "mlp.experts.up", e, i, h), 0, 0, 1, FALSE);
  param(d, s,
        published_fused ? "mlp.experts.gate_up_proj" : "mlp.experts.*.{gate,up}_proj.weight",
        "mlp.experts", WSYNC_PARAM_EXPERTS_W13, 2, parts);
  parts[0] = rows(tensor(d, s, "mlp.experts.down", e, h, i), 0, 0, 1, FALSE);
  param(d, s, published_fused ? "mlp.experts.down_proj" : "mlp.experts.*.down_proj.weight",
        "mlp.experts", WSYNC_PARAM_EXPERTS_W2, 1, parts);
  parts[0] = rows(tensor(d, s, "mlp.shared_expert.gate_proj.weight", is, h, 0), 0, 0, 1, FALSE);
  parts[1] = rows(tensor(d, s, "mlp.shared_expert.up_proj.weight", is, h, 0), 0, 0, 1, FALSE);
  param(d, s, "mlp.shared_expert.{gate,up}_proj.weight", "mlp.shared_expert.gate_up_proj.weight",
        WSYNC_PARAM_COLUMN, 2, parts);
  whole(d, s, "mlp.shared_expert.down_proj.weight",
        tensor(d, s, "mlp.shared_expert.down_proj.weight", h, is, 0), WSYNC_PARAM_ROW);
  whole(d, s, "mlp.shared_expert_gate.weight",
        tensor(d, s, "mlp.shared_expert_gate.weight", 1, h, 0), WSYNC_PARAM_REPLICATED);
}

/* The dense model's MLP (Qwen2MoeMLP, vllm-layouts.md §3.4): gate_up_proj packs gate
 * then up, column-parallel; down_proj row-parallel. */
static void
describe_dense_mlp(Describer *d, const Scope *s)
{
  const Q35Config *c = d->c;
  WsyncPart parts[2];

  parts[0] = rows(tensor(d, s, "mlp.gate_proj.weight", c->inter, c->hidden, 0), 0, 0, 1, FALSE);
  parts[1] = rows(tensor(d, s, "mlp.up_proj.weight", c->inter, c->hidden, 0), 0, 0, 1, FALSE);
  param(d, s, "mlp.{gate,up}_proj.weight", "mlp.gate_up_proj.weight", WSYNC_PARAM_COLUMN, 2,
        parts);
  whole(d, s, "mlp.down_proj.weight", tensor(d, s, "mlp.down_proj.weight", c->hidden, c->inter, 0),
        WSYNC_PARAM_ROW);
}

/* One decoder layer under @s: norms, attention of its kind, MLP. */
static void
describe_layer(Describer *d, const Scope *s, gboolean linear, gboolean published_fused)
{
  replicated_1d(d, s, "input_layernorm.weight", d->c->hidden);
  if (linear)
    describe_linear_attention(d, s);
  else
    describe_attention(d, s);
  replicated_1d(d, s, "post_attention_layernorm.weight", d->c->hidden);
  if (d->c->moe)
    describe_moe(d, s, published_fused);
  else
    describe_dense_mlp(d, s);
}

/* The vision tower (vllm-vision.md table, mm_encoder_tp_mode "weights"). */
static void
describe_vision(Describer *d)
{
  const VisionConfig *v = &d->c->vision;
  Scope s = {"model.visual.", "visual.", "visual",
             d->language_model_only ? "language-model-only" : NULL};
  guint64 dm = v->hidden, hd = v->hidden / v->heads, m = v->hidden * v->merge * v->merge;
  const guint64 patch[5] = {dm, v->in_channels, v->temporal, v->patch, v->patch};
  WsyncPart parts[3];

  /* Conv3dLayer keeps its 5-D weight, whole on every rank; nn.Embedding positions. */
  whole(d, &s, "patch_embed.proj.weight", tensor_nd(d, &s, "patch_embed.proj.weight", 5, patch),
        WSYNC_PARAM_REPLICATED);
  replicated_1d(d, &s, "patch_embed.proj.bias", dm);
  whole(d, &s, "pos_embed.weight", tensor(d, &s, "pos_embed.weight", v->positions, dm, 0),
        WSYNC_PARAM_REPLICATED);
  for (guint64 b = 0; b < v->depth; b++) {
    g_autofree char *ck = g_strdup_printf("model.visual.blocks.%" G_GUINT64_FORMAT ".", b);
    g_autofree char *rt = g_strdup_printf("visual.blocks.%" G_GUINT64_FORMAT ".", b);
    Scope bs = {ck, rt, s.group, s.runtime_drop};
    WsyncVTensor *qkv_w = tensor(d, &bs, "attn.qkv.weight", 3 * dm, dm, 0);
    WsyncVTensor *qkv_b;

    replicated_1d(d, &bs, "norm1.weight", dm);
    replicated_1d(d, &bs, "norm1.bias", dm);
    replicated_1d(d, &bs, "norm2.weight", dm);
    replicated_1d(d, &bs, "norm2.bias", dm);
    /* QKVParallelLinear with as many KV heads as heads: the fused qkv's thirds, each
     * sliced by heads, repacked [q_t; k_t; v_t] (vllm-vision.md §1). */
    for (guint p = 0; p < 3; p++)
      parts[p] = rows(qkv_w, p * dm, dm, hd, FALSE);
    param(d, &bs, "attn.qkv.weight", "attn.qkv.weight", WSYNC_PARAM_COLUMN, 3, parts);
    qkv_b = tensor(d, &bs, "attn.qkv.bias", 3 * dm, 0, 0);
    for (guint p = 0; p < 3; p++)
      parts[p] = rows(qkv_b, p * dm, dm, hd, FALSE);
    param(d, &bs, "attn.qkv.bias", "attn.qkv.bias", WSYNC_PARAM_COLUMN, 3, parts);
    /* RowParallelLinear: the weight's columns split, the bias whole. */
    whole(d, &bs, "attn.proj.weight", tensor(d, &bs, "attn.proj.weight", dm, dm, 0),
          WSYNC_PARAM_ROW);
    replicated_1d(d, &bs, "attn.proj.bias", dm);
    whole(d, &bs, "mlp.linear_fc1.weight", tensor(d, &bs, "mlp.linear_fc1.weight", v->inter, dm, 0),
          WSYNC_PARAM_COLUMN);
    whole(d, &bs, "mlp.linear_fc1.bias", tensor(d, &bs, "mlp.linear_fc1.bias", v->inter, 0, 0),
          WSYNC_PARAM_COLUMN);
    whole(d, &bs, "mlp.linear_fc2.weight", tensor(d, &bs, "mlp.linear_fc2.weight", dm, v->inter, 0),
          WSYNC_PARAM_ROW);
    replicated_1d(d, &bs, "mlp.linear_fc2.bias", dm);
  }
  /* The patch merger: LayerNorm(D), Column(M -> M), Row(M -> O) (vllm-vision.md §5). */
  replicated_1d(d, &s, "merger.norm.weight", dm);
  replicated_1d(d, &s, "merger.norm.bias", dm);
  whole(d, &s, "merger.linear_fc1.weight", tensor(d, &s, "merger.linear_fc1.weight", m, m, 0),
        WSYNC_PARAM_COLUMN);
  whole(d, &s, "merger.linear_fc1.bias", tensor(d, &s, "merger.linear_fc1.bias", m, 0, 0),
        WSYNC_PARAM_COLUMN);
  whole(d, &s, "merger.linear_fc2.weight", tensor(d, &s, "merger.linear_fc2.weight", v->out, m, 0),
        WSYNC_PARAM_ROW);
  replicated_1d(d, &s, "merger.linear_fc2.bias", v->out);
}

/* The multi-token-prediction block (hf-qwen.md §1.3, §1.4): fc [H, 2H], three norms,
 * and mtp_num_hidden_layers full-attention layers (MoE with per-expert experts in the
 * MoE model, dense MLP in the dense one).  vLLM's main model skips it (group "mtp");
 * the runtime names are the checkpoint names. */
static void
describe_mtp(Describer *d)
{
  const Q35Config *c = d->c;
  Scope s = {"mtp.", "mtp.", "mtp", NULL};

  whole(d, &s, "fc.weight", tensor(d, &s, "fc.weight", c->hidden, 2 * c->hidden, 0),
        WSYNC_PARAM_COLUMN);
  replicated_1d(d, &s, "pre_fc_norm_embedding.weight", c->hidden);
  replicated_1d(d, &s, "pre_fc_norm_hidden.weight", c->hidden);
  for (guint64 l = 0; l < c->mtp_layers; l++) {
    g_autofree char *pre = g_strdup_printf("mtp.layers.%" G_GUINT64_FORMAT ".", l);
    Scope ls = {pre, pre, "mtp", NULL};

    describe_layer(d, &ls, FALSE, FALSE);
  }
  replicated_1d(d, &s, "norm.weight", c->hidden);
}

static gboolean build_hf(WsyncLayout *layout, gpointer user_data, GError **error);

/* The remapper. */
static gboolean
describe(WsyncMapping *m, gpointer user_data, GError **error)
{
  g_autofree guint8 *linear = NULL;
  Q35Config c;
  Describer d = {m, &c, user_data != NULL && *(const gboolean *)user_data};
  Scope text = {"model.language_model.", "language_model.model.", NULL, NULL};
  Scope top = {"", "language_model.", NULL, NULL};
  gboolean ok;

  memset(&c, 0, sizeof c);
  ok = read_config(m, &c, error);
  linear = c.linear;
  if (!ok || !check_sizes(&c, error))
    return FALSE;
  /* Vocabulary-parallel embedding and LM head (vllm-layouts.md §1); a tied LM head is
   * the embedding itself (`self.lm_head = self.model.embed_tokens`, §3.5), so it has no
   * tensor of its own (hf-qwen.md §1.3: Qwen3.5-4B has no lm_head.weight). */
  whole(&d, &text, "embed_tokens.weight",
        tensor(&d, &text, "embed_tokens.weight", c.vocab, c.hidden, 0), WSYNC_PARAM_VOCAB);
  for (guint64 l = 0; l < c.layers; l++) {
    g_autofree char *ck = g_strdup_printf("model.language_model.layers.%" G_GUINT64_FORMAT ".", l);
    g_autofree char *rt = g_strdup_printf("language_model.model.layers.%" G_GUINT64_FORMAT ".", l);
    Scope ls = {ck, rt, NULL, NULL};

    describe_layer(&d, &ls, c.linear[l], TRUE);
  }
  replicated_1d(&d, &text, "norm.weight", c.hidden);
  if (!c.tie)
    whole(&d, &top, "lm_head.weight", tensor(&d, &top, "lm_head.weight", c.vocab, c.hidden, 0),
          WSYNC_PARAM_VOCAB);
  if (c.vision.present)
    describe_vision(&d);
  if (c.mtp_layers > 0)
    describe_mtp(&d);
  /* Older PyTorch checkpoints saved the RoPE buffer; nothing holds it. */
  wsync_mapping_add_drop_rule(m, "rotary-inv-freq", "*.rotary_emb.inv_freq");
  wsync_mapping_set_hf_layout(m, build_hf, NULL);
  return TRUE;
}

/* ------------------------------------------------------------------ the Hugging Face layouts */

/* One layer's experts, from its stacked gate tensor `PREFIXgate`.  "hf-fused" and
 * "hf-experts" say the form; "hf" reads each layer in the form the input has (fused
 * when it has PREFIXgate_up_proj, per expert when it has PREFIX0.gate_proj.weight) and
 * writes the published one: fused in the main layers, per expert in the MTP block. */
static gboolean
place_experts(WsyncLayout *layout, WsyncVTensor *gate, const char *target, WsyncDtype dtype,
              GError **error)
{
  const char *name = wsync_vtensor_get_name(gate);
  g_autofree char *prefix = g_strndup(name, strlen(name) - strlen("gate"));
  g_autofree char *up = g_strconcat(prefix, "up", NULL);
  g_autofree char *down = g_strconcat(prefix, "down", NULL);
  g_autofree char *fused_name = g_strconcat(prefix, "gate_up_proj", NULL);
  g_autofree char *expert0_name = g_strconcat(prefix, "0.gate_proj.weight", NULL);
  WsyncVTensor *vts[3] = {gate, wsync_layout_lookup_vtensor(layout, up),
                          wsync_layout_lookup_vtensor(layout, down)};
  gboolean fused;

  if (vts[1] == NULL || vts[2] == NULL) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_FAILED,
                "qwen3_5_moe: %s has no matching %s and %s", name, up, down);
    return FALSE;
  }
  if (strcmp(target, "hf-fused") == 0)
    fused = TRUE;
  else if (strcmp(target, "hf-experts") == 0)
    fused = FALSE;
  else if (wsync_layout_input_has(layout, fused_name))
    fused = TRUE;
  else if (wsync_layout_input_has(layout, expert0_name))
    fused = FALSE;
  else
    fused = !g_str_has_prefix(name, "mtp.");
  return wsync_layout_add_hf_experts(layout, vts[0], vts[1], vts[2], prefix, fused, dtype,
                                     error);
}

/* The Hugging Face layout builder: every logical tensor under its own name, whole, in
 * its published dtype, except the stacked experts, which take one of the two forms. */
static gboolean
build_hf(WsyncLayout *layout, gpointer user_data, GError **error)
{
  const char *target = wsync_layout_get_target(layout);
  WsyncDtype dtype = wsync_layout_get_model_dtype(layout);

  (void)user_data;
  if (strcmp(target, "hf") != 0 && strcmp(target, "hf-experts") != 0 &&
      strcmp(target, "hf-fused") != 0) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                "qwen3_5_moe: no Hugging Face layout called \"%s\" (hf, hf-experts, hf-fused)",
                target);
    return FALSE;
  }
  for (guint i = 0; i < wsync_layout_n_vtensors(layout); i++) {
    WsyncVTensor *vt = wsync_layout_vtensor(layout, i);
    const char *name = wsync_vtensor_get_name(vt);
    gboolean ok;

    if (g_str_has_suffix(name, ".mlp.experts.up") || g_str_has_suffix(name, ".mlp.experts.down"))
      continue; /* placed with their layer's gate */
    ok = g_str_has_suffix(name, ".mlp.experts.gate")
             ? place_experts(layout, vt, target, dtype, error)
             : wsync_layout_add_whole(layout, vt, published_dtype(name, dtype), error);
    if (!ok)
      return FALSE;
  }
  return TRUE;
}

/* ------------------------------------------------------------------ registration */

static cfg_opt_t options[] = {CFG_BOOL("language-model-only", cfg_false, CFGF_NONE), CFG_END()};

static gboolean
qwen3_5_moe_register(WsyncPlugin *plugin, GError **error)
{
  gboolean *language_model_only = g_new(gboolean, 1);

  *language_model_only =
      cfg_getbool(wsync_plugin_get_options(plugin), "language-model-only") == cfg_true;
  return wsync_plugin_add_remapper(plugin, "qwen3_5_moe", WSYNC_PRIORITY_DEFAULT,
                                   "qwen3_5_moe,qwen3_5", describe, language_model_only, g_free,
                                   error);
}

WSYNC_PLUGIN_DEFINE("qwen3_5_moe",
                    "Qwen3.5 / Qwen3.6, MoE and dense: text, vision tower, MTP, expert forms",
                    options, qwen3_5_moe_register)
