/* wsync plugin "qwen3_moe": Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B and their 2507
 * variants) and Qwen3 dense, described from config.json alone.
 *
 * One remapper, serving model_type "qwen3_moe" and "qwen3".  It declares:
 *
 *  - the logical tensors, named like the published checkpoint tensors (hf-qwen.md §1.1),
 *    except that a MoE layer's experts are three stacked tensors
 *    `model.layers.L.mlp.experts.{gate,up,down}` ([E, I, H], [E, I, H], [E, H, I]), the
 *    shape Transformers 5 holds them in (hf-qwen.md §2.1);
 *  - the params, with vLLM's runtime names and how each is sharded (vllm-layouts.md §1,
 *    §2): qkv_proj packs q, k, v; gate_up_proj packs a dense layer's gate and up; the
 *    experts go to `model.layers.L.mlp.experts` (w13 = [gate, up], w2 = [down]);
 *  - the Hugging Face layouts ("hf", "hf-experts", "hf-fused"): every tensor as
 *    published, the experts either per expert (`experts.{e}.{gate,up,down}_proj.weight`,
 *    the published Qwen3-MoE form, hf-qwen.md §1.1) or fused (Transformers 5:
 *    `experts.gate_up_proj [E, 2I, H]` gate rows first, `experts.down_proj [E, H, I]`,
 *    hf-qwen.md §2.1, §2.2).  Target "hf" reads each layer in the form the input has.
 *
 * Config fields (hf-qwen.md §3): the text fields are read from `text_config` when the
 * config has that object, else from the root.  Every field that decides a shape is
 * required, because a default would invent a shape the checkpoint may not have; only
 * head_dim (H / heads, as Transformers computes it), decoder_sparse_step (1),
 * mlp_only_layers ([]), tie_word_embeddings (false) and the dtype (bfloat16) have
 * defaults.  Errors are one line naming the field; the engine prefixes the config
 * file's path.
 */
#include <string.h>

#include <wsync/engine.h>
#include <wsync/plugin.h>

/* A config value larger than this is refused: shapes stay far from overflowing. */
#define FIELD_MAX G_GUINT64_CONSTANT(0x7fffffff)

/* What the remapper needs from config.json. */
typedef struct {
  JsonObject *root;
  JsonObject *text;  /* text_config, or the root */
  const char *where; /* "text_config." or "": prefixed to field names in messages */
  gboolean dense;    /* model_type "qwen3": no experts anywhere */
  guint64 hidden, heads, kv_heads, head_dim, vocab, layers;
  guint64 experts, moe_inter, inter, sparse_step;
  guint8 *dense_layer; /* by layer: listed in mlp_only_layers (NULL: none listed) */
  gboolean tie;
  WsyncDtype dtype;
} Qwen3Config;

/* ------------------------------------------------------------------ reading config.json */

/* A member of the text object, NULL when absent or null (null means "not set" in
 * Transformers configs, e.g. "head_dim": null). */
static JsonNode *
field(const Qwen3Config *c, const char *key)
{
  JsonNode *node = json_object_get_member(c->text, key);

  return node != NULL && !JSON_NODE_HOLDS_NULL(node) ? node : NULL;
}

static gboolean
missing(const Qwen3Config *c, const char *key, const char *alternative, GError **error)
{
  if (alternative != NULL)
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "field \"%s%s\" (or %s) is missing", c->where, key, alternative);
  else
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "field \"%s%s\" is missing", c->where, key);
  return FALSE;
}

static gboolean
not_a(const Qwen3Config *c, const char *key, JsonNode *node, const char *want, GError **error)
{
  g_autofree char *text = json_to_string(node, FALSE);

  if (strlen(text) > 64) /* a long list is named, not quoted whole */
    strcpy(text + 60, "...");

  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
              "field \"%s%s\" must be %s, not %s", c->where, key, want, text);
  return FALSE;
}

/* An integer in [min, FIELD_MAX]. */
static gboolean
node_uint(const Qwen3Config *c, const char *key, JsonNode *node, guint64 min, guint64 *out,
          GError **error)
{
  gint64 v;

  if (!JSON_NODE_HOLDS_VALUE(node) || json_node_get_value_type(node) != G_TYPE_INT64)
    return not_a(c, key, node, min > 0 ? "a positive integer" : "a non-negative integer",
                 error);
  v = json_node_get_int(node);
  if (v < (gint64)min || (guint64)v > FIELD_MAX)
    return not_a(c, key, node,
                 min > 0 ? "a positive integer below 2^31" : "a non-negative integer below 2^31",
                 error);
  *out = (guint64)v;
  return TRUE;
}

/* A required integer field (@alternative: a second accepted key, or NULL). */
static gboolean
required_uint(const Qwen3Config *c, const char *key, const char *alternative, guint64 min,
              guint64 *out, GError **error)
{
  JsonNode *node = field(c, key);
  const char *used = key;

  if (node == NULL && alternative != NULL) {
    node = field(c, alternative);
    used = alternative;
  }
  if (node == NULL)
    return missing(c, key, alternative, error);
  return node_uint(c, used, node, min, out, error);
}

/* An optional integer field; *out keeps its default when the field is absent. */
static gboolean
optional_uint(const Qwen3Config *c, const char *key, guint64 min, guint64 *out, GError **error)
{
  JsonNode *node = field(c, key);

  return node == NULL || node_uint(c, key, node, min, out, error);
}

/* tie_word_embeddings: in the text object, else at the root (Qwen3.5-style nested
 * configs carry it in both places, hf-qwen.md §3); default false, as in
 * Qwen3MoeConfig and Qwen3Config. */
static gboolean
read_tie(Qwen3Config *c, GError **error)
{
  JsonNode *node = field(c, "tie_word_embeddings");

  if (node == NULL && c->text != c->root)
    node = json_object_get_member(c->root, "tie_word_embeddings");
  if (node == NULL || JSON_NODE_HOLDS_NULL(node))
    return TRUE;
  if (!JSON_NODE_HOLDS_VALUE(node) || json_node_get_value_type(node) != G_TYPE_BOOLEAN)
    return not_a(c, "tie_word_embeddings", node, "true or false", error);
  c->tie = json_node_get_boolean(node);
  return TRUE;
}

/* One dtype value: "bfloat16", "float16" or "float32" (@where: the message prefix). */
static gboolean
dtype_value(JsonNode *node, const char *where, const char *key, WsyncDtype *dtype,
            GError **error)
{
  static const char *const names[] = {"bfloat16", "float16", "float32"};
  static const WsyncDtype dtypes[] = {WSYNC_DTYPE_BF16, WSYNC_DTYPE_F16, WSYNC_DTYPE_F32};
  const char *value = JSON_NODE_HOLDS_VALUE(node) &&
                              json_node_get_value_type(node) == G_TYPE_STRING
                          ? json_node_get_string(node)
                          : NULL;
  g_autofree char *text = NULL;

  for (guint i = 0; value != NULL && i < G_N_ELEMENTS(names); i++)
    if (strcmp(value, names[i]) == 0) {
      *dtype = dtypes[i];
      return TRUE;
    }
  text = json_to_string(node, FALSE);
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
              "field \"%s%s\" must be \"bfloat16\", \"float16\" or \"float32\", "
              "not %s",
              where, key, text);
  return FALSE;
}

/* The published dtype: `dtype` (Transformers 5) or `torch_dtype` (Transformers 4), in
 * the text object then at the root (hf-qwen.md §3, "dtype key"); default bfloat16. */
static gboolean
read_dtype(Qwen3Config *c, GError **error)
{
  JsonObject *objects[] = {c->text, c->root};
  const char *keys[] = {"dtype", "torch_dtype"};

  c->dtype = WSYNC_DTYPE_BF16;
  for (guint o = 0; o < G_N_ELEMENTS(objects); o++)
    for (guint k = 0; k < G_N_ELEMENTS(keys); k++) {
      JsonNode *node = json_object_get_member(objects[o], keys[k]);

      if (node != NULL && !JSON_NODE_HOLDS_NULL(node))
        return dtype_value(node, objects[o] != c->root ? c->where : "", keys[k], &c->dtype,
                           error);
    }
  return TRUE;
}

/* Counts are capped as soon as they are read, before anything iterates over them: each
 * layer and each expert adds tensors to the plan, and written per expert, "hf" has
 * three tensors for every expert of every MoE layer (the largest published model has
 * 94 layers and 128 experts, hf-qwen.md §3). */
#define COUNT_MAX 65536
#define EXPERT_TENSORS_MAX (3u << 18)

static gboolean
too_many(const Qwen3Config *c, const char *key, const char *unit, guint64 value, GError **error)
{
  if (unit != NULL)
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "field \"%s%s\" has %" G_GUINT64_FORMAT " %s, more than %d", c->where, key,
                value, unit, COUNT_MAX);
  else
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "field \"%s%s\" is %" G_GUINT64_FORMAT ", more than %d", c->where, key, value,
                COUNT_MAX);
  return FALSE;
}

/* mlp_only_layers: a list of layer indices (hf-qwen.md §1.1), kept as one flag per
 * layer, so that telling a layer's kind costs the same however long the list is.
 * Indices past the last layer match no layer, as in Transformers and vLLM. */
static gboolean
read_mlp_only(Qwen3Config *c, GError **error)
{
  JsonNode *node = field(c, "mlp_only_layers");
  JsonArray *list;

  if (node == NULL)
    return TRUE;
  if (!JSON_NODE_HOLDS_ARRAY(node))
    return not_a(c, "mlp_only_layers", node, "a list of layer indices", error);
  list = json_node_get_array(node);
  if (json_array_get_length(list) > COUNT_MAX)
    return too_many(c, "mlp_only_layers", "entries", json_array_get_length(list), error);
  c->dense_layer = g_new0(guint8, c->layers);
  for (guint i = 0; i < json_array_get_length(list); i++) {
    guint64 layer;

    if (!node_uint(c, "mlp_only_layers", json_array_get_element(list, i), 0, &layer, NULL))
      return not_a(c, "mlp_only_layers", node, "a list of layer indices", error);
    if (layer < c->layers)
      c->dense_layer[layer] = TRUE;
  }
  return TRUE;
}

/* head_dim: the field when set, else hidden_size / num_attention_heads (Transformers
 * Qwen3 attention: getattr(config, "head_dim", hidden_size // num_heads); the published
 * configs all set it, hf-qwen.md §3). */
static gboolean
read_head_dim(Qwen3Config *c, GError **error)
{
  c->head_dim = 0;
  if (!optional_uint(c, "head_dim", 1, &c->head_dim, error))
    return FALSE;
  if (c->head_dim != 0)
    return TRUE;
  if (c->hidden % c->heads != 0) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "field \"%shead_dim\" is missing and %shidden_size %" G_GUINT64_FORMAT
                " is not a multiple of num_attention_heads %" G_GUINT64_FORMAT,
                c->where, c->where, c->hidden, c->heads);
    return FALSE;
  }
  c->head_dim = c->hidden / c->heads;
  return TRUE;
}

static gboolean
read_attention_fields(Qwen3Config *c, GError **error)
{
  return required_uint(c, "hidden_size", NULL, 1, &c->hidden, error) &&
         required_uint(c, "num_attention_heads", NULL, 1, &c->heads, error) &&
         required_uint(c, "num_key_value_heads", NULL, 1, &c->kv_heads, error) &&
         read_head_dim(c, error) &&
         required_uint(c, "vocab_size", NULL, 1, &c->vocab, error) &&
         required_uint(c, "num_hidden_layers", NULL, 1, &c->layers, error) &&
         (c->layers <= COUNT_MAX || too_many(c, "num_hidden_layers", NULL, c->layers, error));
}

/* Whether layer @layer is MoE.  Transformers v4 Qwen3MoeDecoderLayer and vLLM
 * qwen3_moe.py use the same test (hf-qwen.md §1.1, vllm-layouts.md §2): MoE unless the
 * layer is in mlp_only_layers or (idx+1) % decoder_sparse_step != 0; both also require
 * num_experts > 0.  Qwen3 dense has no experts at all. */
static gboolean
layer_is_moe(const Qwen3Config *c, guint64 layer)
{
  if (c->dense || c->experts == 0 || (layer + 1) % c->sparse_step != 0)
    return FALSE;
  return c->dense_layer == NULL || !c->dense_layer[layer];
}

static gboolean
any_layer(const Qwen3Config *c, gboolean moe)
{
  for (guint64 l = 0; l < c->layers; l++)
    if (layer_is_moe(c, l) == moe)
      return TRUE;
  return FALSE;
}

/* The MLP fields: experts (num_experts, or num_local_experts as Transformers 5 re-saves
 * Qwen3-MoE configs, hf-qwen.md §3) and moe_intermediate_size when a layer is MoE,
 * intermediate_size when a layer is dense. */
static gboolean
read_mlp_fields(Qwen3Config *c, GError **error)
{
  c->sparse_step = 1;
  if (!c->dense &&
      (!required_uint(c, "num_experts", "num_local_experts", 0, &c->experts, error) ||
       (c->experts > COUNT_MAX && !too_many(c, "num_experts", NULL, c->experts, error)) ||
       !optional_uint(c, "decoder_sparse_step", 1, &c->sparse_step, error) ||
       !read_mlp_only(c, error)))
    return FALSE;
  if (any_layer(c, TRUE) &&
      !required_uint(c, "moe_intermediate_size", NULL, 1, &c->moe_inter, error))
    return FALSE;
  return !any_layer(c, FALSE) ||
         required_uint(c, "intermediate_size", NULL, 1, &c->inter, error);
}

static gboolean
read_config(WsyncMapping *m, Qwen3Config *c, GError **error)
{
  JsonNode *text;

  memset(c, 0, sizeof *c); /* c->dense_layer: NULL until mlp_only_layers is read */
  c->root = wsync_mapping_get_config(m);
  text = json_object_get_member(c->root, "text_config");
  c->text = text != NULL && JSON_NODE_HOLDS_OBJECT(text) ? json_node_get_object(text) : c->root;
  c->where = c->text != c->root ? "text_config." : "";
  c->dense = g_strcmp0(wsync_mapping_get_model_type(m), "qwen3") == 0;
  return read_attention_fields(c, error) && read_mlp_fields(c, error) && read_tie(c, error) &&
         read_dtype(c, error);
}

/* ------------------------------------------------------------------ logical tensors and params */

/* Declares a logical tensor of up to three axes (a 0 ends the shape). */
static WsyncVTensor *
vtensor(WsyncMapping *m, const Qwen3Config *c, const char *name, guint64 d0, guint64 d1,
        guint64 d2)
{
  const guint64 shape[3] = {d0, d1, d2};
  guint ndim = d1 == 0 ? 1 : d2 == 0 ? 2 : 3;

  return wsync_mapping_add_vtensor(m, name, c->dtype, ndim, shape);
}

static WsyncPart
part(WsyncVTensor *vt, guint64 unit, gboolean replicate)
{
  WsyncPart p = {vt, 0, 0, unit, replicate};

  return p;
}

/* A param of one part, whose checkpoint name and runtime name are the tensor's name. */
static void
param_same_name(WsyncMapping *m, WsyncVTensor *vt, WsyncParamKind kind)
{
  const char *name = wsync_vtensor_get_name(vt);
  WsyncPart p = part(vt, 1, FALSE);

  wsync_mapping_add_param(m, name, name, kind, 1, &p);
}

/* A replicated [H] norm (RMSNorm weights are replicated, vllm-layouts.md §2). */
static void
norm(WsyncMapping *m, const Qwen3Config *c, const char *name)
{
  param_same_name(m, vtensor(m, c, name, c->hidden, 0, 0), WSYNC_PARAM_REPLICATED);
}

/* Attention (hf-qwen.md §1.1; vllm-layouts.md §1 QKVParallelLinear, §2): q, k, v packed
 * into qkv_proj in that order, one unit per head, KV heads replicated when tp exceeds
 * them; o_proj row-parallel; q_norm/k_norm replicated [D]; plus the data-less
 * attention marker for backends that emit runtime-only buffers. */
static void
describe_attention(WsyncMapping *m, const Qwen3Config *c, const char *pre)
{
  guint64 q_rows = c->heads * c->head_dim, kv_rows = c->kv_heads * c->head_dim;
  g_autofree char *q = g_strconcat(pre, "self_attn.q_proj.weight", NULL);
  g_autofree char *k = g_strconcat(pre, "self_attn.k_proj.weight", NULL);
  g_autofree char *v = g_strconcat(pre, "self_attn.v_proj.weight", NULL);
  g_autofree char *o = g_strconcat(pre, "self_attn.o_proj.weight", NULL);
  g_autofree char *qn = g_strconcat(pre, "self_attn.q_norm.weight", NULL);
  g_autofree char *kn = g_strconcat(pre, "self_attn.k_norm.weight", NULL);
  g_autofree char *qkv_name = g_strconcat(pre, "self_attn.{q,k,v}_proj.weight", NULL);
  g_autofree char *qkv_runtime = g_strconcat(pre, "self_attn.qkv_proj.weight", NULL);
  g_autofree char *attn = g_strconcat(pre, "self_attn.attn", NULL);
  WsyncPart qkv[3];

  qkv[0] = part(vtensor(m, c, q, q_rows, c->hidden, 0), c->head_dim, FALSE);
  qkv[1] = part(vtensor(m, c, k, kv_rows, c->hidden, 0), c->head_dim, TRUE);
  qkv[2] = part(vtensor(m, c, v, kv_rows, c->hidden, 0), c->head_dim, TRUE);
  wsync_mapping_add_param(m, qkv_name, qkv_runtime, WSYNC_PARAM_COLUMN, 3, qkv);
  param_same_name(m, vtensor(m, c, o, c->hidden, q_rows, 0), WSYNC_PARAM_ROW);
  param_same_name(m, vtensor(m, c, qn, c->head_dim, 0, 0), WSYNC_PARAM_REPLICATED);
  param_same_name(m, vtensor(m, c, kn, c->head_dim, 0, 0), WSYNC_PARAM_REPLICATED);
  wsync_mapping_add_param(m, attn, attn, WSYNC_PARAM_ATTENTION, 0, NULL);
}

/* A MoE block (hf-qwen.md §1.1, §2.1; vllm-layouts.md §2, §2.1, §2.2): the router
 * mlp.gate [E, H], replicated on every rank; the experts stacked as gate [E, I, H],
 * up [E, I, H], down [E, H, I]; w13 packs gate then up (gate first), w2 is down, both
 * under the module prefix `model.layers.L.mlp.experts` to which the backend appends
 * its own names. */
static void
describe_moe(WsyncMapping *m, const Qwen3Config *c, const char *pre)
{
  guint64 e = c->experts, i = c->moe_inter, h = c->hidden;
  g_autofree char *router = g_strconcat(pre, "mlp.gate.weight", NULL);
  g_autofree char *gate = g_strconcat(pre, "mlp.experts.gate", NULL);
  g_autofree char *up = g_strconcat(pre, "mlp.experts.up", NULL);
  g_autofree char *down = g_strconcat(pre, "mlp.experts.down", NULL);
  g_autofree char *w13 = g_strconcat(pre, "mlp.experts.*.{gate,up}_proj.weight", NULL);
  g_autofree char *w2 = g_strconcat(pre, "mlp.experts.*.down_proj.weight", NULL);
  g_autofree char *runtime = g_strconcat(pre, "mlp.experts", NULL);
  WsyncPart parts[2];

  param_same_name(m, vtensor(m, c, router, e, h, 0), WSYNC_PARAM_REPLICATED);
  parts[0] = part(vtensor(m, c, gate, e, i, h), 1, FALSE);
  parts[1] = part(vtensor(m, c, up, e, i, h), 1, FALSE);
  wsync_mapping_add_param(m, w13, runtime, WSYNC_PARAM_EXPERTS_W13, 2, parts);
  parts[0] = part(vtensor(m, c, down, e, h, i), 1, FALSE);
  wsync_mapping_add_param(m, w2, runtime, WSYNC_PARAM_EXPERTS_W2, 1, parts);
}

/* A dense MLP (Qwen3 dense, or a Qwen3-MoE layer in mlp_only_layers; vllm-layouts.md
 * §1 MergedColumnParallelLinear, §2): gate_up_proj packs gate then up, down_proj is
 * row-parallel. */
static void
describe_dense_mlp(WsyncMapping *m, const Qwen3Config *c, const char *pre)
{
  g_autofree char *gate = g_strconcat(pre, "mlp.gate_proj.weight", NULL);
  g_autofree char *up = g_strconcat(pre, "mlp.up_proj.weight", NULL);
  g_autofree char *down = g_strconcat(pre, "mlp.down_proj.weight", NULL);
  g_autofree char *name = g_strconcat(pre, "mlp.{gate,up}_proj.weight", NULL);
  g_autofree char *runtime = g_strconcat(pre, "mlp.gate_up_proj.weight", NULL);
  WsyncPart parts[2];

  parts[0] = part(vtensor(m, c, gate, c->inter, c->hidden, 0), 1, FALSE);
  parts[1] = part(vtensor(m, c, up, c->inter, c->hidden, 0), 1, FALSE);
  wsync_mapping_add_param(m, name, runtime, WSYNC_PARAM_COLUMN, 2, parts);
  param_same_name(m, vtensor(m, c, down, c->hidden, c->inter, 0), WSYNC_PARAM_ROW);
}

static void
describe_layer(WsyncMapping *m, const Qwen3Config *c, guint64 layer)
{
  g_autofree char *pre = g_strdup_printf("model.layers.%" G_GUINT64_FORMAT ".", layer);
  g_autofree char *in_norm = g_strconcat(pre, "input_layernorm.weight", NULL);
  g_autofree char *post_norm = g_strconcat(pre, "post_attention_layernorm.weight", NULL);

  norm(m, c, in_norm);
  describe_attention(m, c, pre);
  norm(m, c, post_norm);
  if (layer_is_moe(c, layer))
    describe_moe(m, c, pre);
  else
    describe_dense_mlp(m, c, pre);
}

/* Sizes.  Every field is below 2^31, so a product of two fits in 64 bits; the
 * three-factor shapes ([E, I, H], [nq*D, H], [nkv*D, H]) are checked here, so that no
 * shape overflows and no tensor passes 2^60 bytes.  (The counts were checked as they
 * were read, see COUNT_MAX.) */

static gboolean
product_ok(guint64 a, guint64 b, guint64 c)
{
  guint64 numel;

  return g_uint64_checked_mul(&numel, a, b) && g_uint64_checked_mul(&numel, numel, c) &&
         numel <= (G_GUINT64_CONSTANT(1) << 57);
}

static gboolean
check_sizes(const Qwen3Config *c, GError **error)
{
  guint64 moe_layers = 0;

  for (guint64 l = 0; l < c->layers; l++)
    moe_layers += layer_is_moe(c, l);
  if (moe_layers * c->experts * 3 > EXPERT_TENSORS_MAX) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%" G_GUINT64_FORMAT " MoE layers of %" G_GUINT64_FORMAT " experts make %"
                G_GUINT64_FORMAT " expert tensors, more than %u",
                moe_layers, c->experts, moe_layers * c->experts * 3, EXPERT_TENSORS_MAX);
    return FALSE;
  }
  if (!product_ok(c->experts, c->moe_inter, c->hidden) ||
      !product_ok(c->heads, c->head_dim, c->hidden) ||
      !product_ok(c->kv_heads, c->head_dim, c->hidden) || !product_ok(c->vocab, c->hidden, 1) ||
      !product_ok(c->inter, c->hidden, 1)) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "the sizes in %s make a tensor of more than 2^57 elements",
                c->where[0] != '\0' ? "text_config" : "the config");
    return FALSE;
  }
  return TRUE;
}

static gboolean build_hf(WsyncLayout *layout, gpointer user_data, GError **error);

/* The remapper. */
static gboolean
describe(WsyncMapping *m, gpointer user_data, GError **error)
{
  Qwen3Config c;
  WsyncVTensor *embed;

  (void)user_data;
  if (!read_config(m, &c, error) || !check_sizes(&c, error)) {
    g_free(c.dense_layer);
    return FALSE;
  }
  /* Vocabulary-parallel embedding and LM head (vllm-layouts.md §1, §2); a tied LM head
   * is the embedding itself, so it has no tensor of its own (hf-qwen.md §1.1, §1.3). */
  embed = vtensor(m, &c, "model.embed_tokens.weight", c.vocab, c.hidden, 0);
  param_same_name(m, embed, WSYNC_PARAM_VOCAB);
  for (guint64 l = 0; l < c.layers; l++)
    describe_layer(m, &c, l);
  norm(m, &c, "model.norm.weight");
  if (!c.tie)
    param_same_name(m, vtensor(m, &c, "lm_head.weight", c.vocab, c.hidden, 0),
                    WSYNC_PARAM_VOCAB);
  /* Older PyTorch checkpoints saved the RoPE buffer; nothing holds it. */
  wsync_mapping_add_drop_rule(m, "rotary-inv-freq", "*.rotary_emb.inv_freq");
  wsync_mapping_set_hf_layout(m, build_hf, NULL);
  g_free(c.dense_layer);
  return TRUE;
}

/* ------------------------------------------------------------------ the Hugging Face layouts */

/* One MoE layer's experts, from its stacked gate tensor `PREFIXgate`.  "hf" takes the
 * form the input has for this layer (fused when it has PREFIXgate_up_proj), so a mixed
 * input reads as it is; written, "hf" is the published per-expert form. */
static gboolean
place_experts(WsyncLayout *layout, WsyncVTensor *gate, const char *target, WsyncDtype dtype,
              GError **error)
{
  const char *name = wsync_vtensor_get_name(gate);
  g_autofree char *prefix = g_strndup(name, strlen(name) - strlen("gate"));
  g_autofree char *up = g_strconcat(prefix, "up", NULL);
  g_autofree char *down = g_strconcat(prefix, "down", NULL);
  g_autofree char *fused_name = g_strconcat(prefix, "gate_up_proj", NULL);
  WsyncVTensor *vts[3] = {gate, wsync_layout_lookup_vtensor(layout, up),
                          wsync_layout_lookup_vtensor(layout, down)};
  gboolean fused = strcmp(target, "hf-fused") == 0 ||
                   (strcmp(target, "hf") == 0 && wsync_layout_input_has(layout, fused_name));

  if (vts[1] == NULL || vts[2] == NULL) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_FAILED,
                "qwen3_moe: %s has no matching %s and %s", name, up, down);
    return FALSE;
  }
  return wsync_layout_add_hf_experts(layout, vts[0], vts[1], vts[2], prefix, fused, dtype,
                                     error);
}

static gboolean
is_stacked_expert(const char *name, const char *which)
{
  g_autofree char *suffix = g_strconcat(".mlp.experts.", which, NULL);

  return g_str_has_prefix(name, "model.layers.") && g_str_has_suffix(name, suffix);
}

/* The Hugging Face layout builder: every logical tensor under its own name, whole,
 * except the stacked experts, which take one of the two published forms. */
static gboolean
build_hf(WsyncLayout *layout, gpointer user_data, GError **error)
{
  const char *target = wsync_layout_get_target(layout);
  WsyncDtype dtype = wsync_layout_get_model_dtype(layout);

  (void)user_data;
  if (strcmp(target, "hf") != 0 && strcmp(target, "hf-experts") != 0 &&
      strcmp(target, "hf-fused") != 0) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                "qwen3_moe: no Hugging Face layout called \"%s\" (hf, hf-experts, hf-fused)",
                target);
    return FALSE;
  }
  for (guint i = 0; i < wsync_layout_n_vtensors(layout); i++) {
    WsyncVTensor *vt = wsync_layout_vtensor(layout, i);
    const char *name = wsync_vtensor_get_name(vt);
    gboolean ok;

    if (is_stacked_expert(name, "up") || is_stacked_expert(name, "down"))
      continue; /* placed with their layer's gate */
    ok = is_stacked_expert(name, "gate") ? place_experts(layout, vt, target, dtype, error)
                                         : wsync_layout_add_whole(layout, vt, dtype, error);
    if (!ok)
      return FALSE;
  }
  return TRUE;
}

/* ------------------------------------------------------------------ registration */

static gboolean
qwen3_moe_register(WsyncPlugin *plugin, GError **error)
{
  return wsync_plugin_add_remapper(plugin, "qwen3_moe", WSYNC_PRIORITY_DEFAULT,
                                   "qwen3_moe,qwen3", describe, NULL, NULL, error);
}

WSYNC_PLUGIN_DEFINE("qwen3_moe", "Qwen3-MoE and Qwen3 dense: names, shapes, expert forms", NULL,
                    qwen3_moe_register)
