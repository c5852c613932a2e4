/* wsync plugin "qwen3_5_moe": Qwen3.5 / Qwen3.6, MoE (Qwen3.5-35B-A3B, 122B-A10B,
 * 397B-A17B, Qwen3.6-35B-A3B) and dense (Qwen3.5-4B, 27B, Qwen3.6-27B), described from
 * config.json alone (docs/hf-checkpoints.md §3).
 *
 * One remapper, serving model_type "qwen3_5_moe" and "qwen3_5" (text model_type
 * "qwen3_5_moe_text" / "qwen3_5_text"); a config of a text model at the top level, or
 * whose architectures[0] is another class than the multimodal one, is refused (text-only
 * checkpoints are not supported, docs/hf-checkpoints.md §3 "Text-only Qwen3.5").  The published checkpoints are a multimodal
 * wrapper: the text model under `model.language_model.`, the vision tower under
 * `model.visual.`, `lm_head.weight` at the top (absent when the embeddings are tied) and
 * a multi-token-prediction block under `mtp.` (a draft block).
 *
 * The text model: layers of full attention (q_proj holds each head's query and output
 * gate) or Gated DeltaNet linear attention, by `layer_types`; a MoE block with a shared
 * expert in every layer of the MoE model (routed experts published fused), a gated MLP
 * in the dense one.  The vision tower (vision_config): patch embedding, position
 * embedding, `depth` blocks of LayerNorms, fused attn.qkv (q, k, v thirds split by
 * heads), attn.proj, MLP fc1/fc2 with biases, and the patch merger.  The MTP block:
 * fc [H, 2H], three norms and mtp_num_hidden_layers full-attention layers (routed
 * experts published per expert).
 *
 * Config fields are read from `text_config` (or the root when there is none) and
 * `vision_config` (no tower when there is none).  Every field that decides a shape is
 * required; defaults only where Transformers has one the published configs rely on:
 * head_dim (256), attn_output_gate (true), layer_types (from full_attention_interval,
 * default 4), mtp_num_hidden_layers (1), vision in_channels (3), tie_word_embeddings
 * (false, at the top level and in text_config alike; the two must agree), the dtype
 * (bfloat16), attention_bias (false).
 *
 * attention_bias gives q_proj, k_proj, v_proj AND o_proj a bias, as Transformers'
 * Qwen3_5(Moe)Attention builds them (`nn.Linear(..., bias=config.attention_bias)` on all
 * four, MOD-Q35MOE, docs/hf-checkpoints.md §3).  vLLM reads `qkv_bias` instead and gives
 * o_proj none (docs/vllm.md §9.2); that is the vllm target's business.
 *
 * Option (conf.d/31-qwen3_5_moe.conf):
 *   language-model-only  the engine builds no vision tower (vLLM's
 *                        `--language-model-only`): runtime targets drop the tower by the
 *                        rule "language-model-only"; the Hugging Face layouts keep it.
 *                        Rank files record it (wsync_model_begin_switched_group()) and
 *                        read back as they record it.
 */
#include <stdarg.h>
#include <string.h>

#include <wsync/model.h>
#include <wsync/plugin.h>

#define SIZE WSYNC_CONFIG_SIZE_MAX
#define COUNT WSYNC_CONFIG_COUNT_MAX

typedef struct {
  gboolean present;
  guint64 depth, hidden, inter, heads, patch, temporal, merge, in_channels, positions, out;
} Vision;

typedef struct {
  WsyncConfigSection root, text;
  gboolean moe; /* model_type "qwen3_5_moe": the sparse block in every layer */
  guint64 hidden, heads, kv_heads, head_dim, vocab, layers;
  gboolean output_gate;
  gboolean attention_bias; /* q/k/v/o_proj biases */
  guint *kind; /* per layer: an index into layer_kinds */
  WsyncLinearAttention linear;
  guint64 experts, moe_inter, shared_inter, inter;
  guint64 mtp_layers;
  gboolean tie;
  Vision vision;
} Qwen35;

/* layer_types values: the first two are the names, the others their legacy spellings
 * that newer Transformers remaps (docs/hf-checkpoints.md §3). */
static const char *const layer_kinds[] = {"linear_attention", "full_attention", "mamba",
                                          "attention", NULL};

static gboolean
is_linear(const Qwen35 *c, guint64 layer)
{
  return c->kind[layer] == 0 || c->kind[layer] == 2;
}

static gboolean
any_linear(const Qwen35 *c)
{
  for (guint64 l = 0; l < c->layers; l++)
    if (is_linear(c, l))
      return TRUE;
  return FALSE;
}

/* ------------------------------------------------------------------ reading config.json */

/* text_config.model_type, when given, must be the text model of the wrapper: a MoE
 * wrapper around a dense text model (or the reverse) is a contradiction. */
static gboolean
check_text_model_type(WsyncModel *m, const Qwen35 *c, GError **error)
{
  const char *want = c->moe ? "qwen3_5_moe_text" : "qwen3_5_text";
  const char *given = want;

  if (c->text.object == c->root.object)
    return TRUE;
  if (!wsync_config_get_string_or(&c->text, "model_type", &given, error))
    return FALSE;
  if (strcmp(given, want) != 0)
    return wsync_fail(error, WSYNC_ERROR_BAD_INPUT,
                      "field \"text_config.model_type\" is \"%s\", but model_type \"%s\" has "
                      "the text model \"%s\"",
                      given, wsync_model_get_model_type(m), want);
  return TRUE;
}

/* layer_types, or Transformers' and vLLM's default: layer i is linear attention unless
 * (i+1) % full_attention_interval == 0 (docs/hf-checkpoints.md §3). */
static gboolean
read_layer_types(Qwen35 *c, GError **error)
{
  guint64 interval = 4;
  gboolean present;

  c->kind = g_new0(guint, c->layers);
  if (!wsync_config_get_choices(&c->text, "layer_types", layer_kinds, 2, c->layers,
                                "num_hidden_layers", c->kind, &present, error))
    return FALSE;
  if (present)
    return TRUE;
  if (!wsync_config_get_uint_or(&c->text, "full_attention_interval", 1, COUNT, &interval, error))
    return FALSE;
  for (guint64 l = 0; l < c->layers; l++)
    c->kind[l] = (l + 1) % interval != 0 ? 0 : 1;
  return TRUE;
}

/* The Gated DeltaNet sizes; the value heads are grouped by key head, so nv must be a
 * multiple of nk (docs/hf-checkpoints.md §3). */
static gboolean
read_linear(Qwen35 *c, GError **error)
{
  WsyncLinearAttention *a = &c->linear;

  a->hidden = c->hidden;
  /* A_log and linear_attn.norm are F32 in Qwen3.5-4B and 35B-A3B but BF16 in Qwen3.6-27B,
   * and no config field tells them apart: they keep their input's dtype, and synth
   * publishes them in F32, as Qwen3.5-4B and 35B-A3B do (docs/hf-checkpoints.md §3). */
  a->a_log_norm_dtype = WSYNC_DTYPE_F32;
  a->a_log_norm_dtype_varies = TRUE;
  if (!any_linear(c))
    return TRUE;
  if (!wsync_config_get_uint(&c->text, "linear_num_key_heads", 1, SIZE, &a->key_heads, error) ||
      !wsync_config_get_uint(&c->text, "linear_num_value_heads", 1, SIZE, &a->value_heads,
                             error) ||
      !wsync_config_get_uint(&c->text, "linear_key_head_dim", 1, SIZE, &a->key_dim, error) ||
      !wsync_config_get_uint(&c->text, "linear_value_head_dim", 1, SIZE, &a->value_dim, error) ||
      !wsync_config_get_uint(&c->text, "linear_conv_kernel_dim", 1, SIZE, &a->conv_kernel,
                             error))
    return FALSE;
  return wsync_config_check_divides(&c->text, "linear_num_key_heads", a->key_heads,
                                    "linear_num_value_heads", a->value_heads, error);
}

/* num_experts, the one spelling both readers take: Transformers' Qwen3_5MoeTextConfig
 * declares `num_experts: int = 256` and, unlike Qwen3MoeConfig, has no attribute_map
 * (CFG-Q35MOE, docs/hf-checkpoints.md §3); vLLM's own Qwen3_5MoeTextConfig takes
 * `num_experts=256` (vllm/transformers_utils/configs/qwen3_5_moe.py:69, 118 @
 * df1376907b16).  A `num_local_experts` is kept as an unread attribute by both, so the
 * old tree, which took it for num_experts, built a layout of that many experts where
 * both readers build 256 (or num_experts). */
static gboolean
read_experts(Qwen35 *c, GError **error)
{
  if (!json_object_has_member(c->text.object, "num_experts") &&
      json_object_has_member(c->text.object, "num_local_experts"))
    return wsync_fail(error, WSYNC_ERROR_BAD_INPUT,
                      "field \"%snum_experts\" is missing: Transformers' and vLLM's Qwen3.5 "
                      "configs read num_experts (default 256) and ignore \"%snum_local_experts\"",
                      c->text.where, c->text.where);
  return wsync_config_get_uint(&c->text, "num_experts", 1, COUNT, &c->experts, error);
}

/* MoE: experts, moe_intermediate_size and shared_expert_intermediate_size; dense:
 * intermediate_size. */
static gboolean
read_mlp(Qwen35 *c, GError **error)
{
  if (!c->moe)
    return wsync_config_get_uint(&c->text, "intermediate_size", 1, SIZE, &c->inter, error);
  return read_experts(c, error) &&
         wsync_config_get_uint(&c->text, "moe_intermediate_size", 1, SIZE, &c->moe_inter,
                               error) &&
         wsync_config_get_uint(&c->text, "shared_expert_intermediate_size", 1, SIZE,
                               &c->shared_inter, error);
}

/* mtp_num_hidden_layers (default 1).  With mtp_use_dedicated_embeddings the MTP block
 * would carry an embedding of its own, which no reference names: refused, not guessed. */
static gboolean
read_mtp(Qwen35 *c, GError **error)
{
  gboolean dedicated = FALSE;

  c->mtp_layers = 1;
  if (!wsync_config_get_uint_or(&c->text, "mtp_num_hidden_layers", 0, COUNT, &c->mtp_layers,
                                error) ||
      !wsync_config_get_bool_or(&c->text, "mtp_use_dedicated_embeddings", &dedicated, error))
    return FALSE;
  if (dedicated && c->mtp_layers > 0)
    return wsync_fail(error, WSYNC_ERROR_BAD_INPUT,
                      "field \"%smtp_use_dedicated_embeddings\" is true: an MTP block with "
                      "its own embedding is not a layout qwen3_5_moe knows",
                      c->text.where);
  return TRUE;
}

/* vision_config (docs/hf-checkpoints.md §3). */
static gboolean
read_vision(WsyncModel *m, Qwen35 *c, GError **error)
{
  Vision *v = &c->vision;
  WsyncConfigSection s;

  v->present = wsync_model_config_section(m, "vision_config", FALSE, &s);
  v->in_channels = 3;
  if (!v->present)
    return TRUE;
  if (!wsync_config_get_uint(&s, "depth", 1, COUNT, &v->depth, error) ||
      !wsync_config_get_uint(&s, "hidden_size", 1, SIZE, &v->hidden, error) ||
      !wsync_config_get_uint(&s, "intermediate_size", 1, SIZE, &v->inter, error) ||
      !wsync_config_get_uint(&s, "num_heads", 1, SIZE, &v->heads, error) ||
      !wsync_config_get_uint(&s, "patch_size", 1, SIZE, &v->patch, error) ||
      !wsync_config_get_uint(&s, "temporal_patch_size", 1, SIZE, &v->temporal, error) ||
      !wsync_config_get_uint(&s, "spatial_merge_size", 1, SIZE, &v->merge, error) ||
      !wsync_config_get_uint_or(&s, "in_channels", 1, SIZE, &v->in_channels, error) ||
      !wsync_config_get_uint(&s, "num_position_embeddings", 1, SIZE, &v->positions, error) ||
      !wsync_config_get_uint(&s, "out_hidden_size", 1, SIZE, &v->out, error))
    return FALSE;
  /* each head is hidden_size / num_heads wide (Qwen3_VisionTransformer, qwen3_vl.py:608
   * @ df1376907b16) */
  return wsync_config_check_divides(&s, "num_heads", v->heads, "hidden_size", v->hidden, error);
}

/* The full-attention sizes (the MTP block's layers share them).  Each KV head serves
 * num_attention_heads / num_key_value_heads query heads: vLLM's Attention asserts
 * `num_heads % num_kv_heads == 0` on every rank (vllm/model_executor/layers/attention/
 * attention.py:319 @ df1376907b16, built by Qwen3NextAttention, qwen3_next.py:282-286,
 * for each full-attention layer, qwen3_5.py:153; docs/vllm.md §9.2), and Transformers groups the query heads by KV head
 * (`num_key_value_groups`, repeat_kv; docs/hf-checkpoints.md §5 "GQA"). */
static gboolean
read_text(Qwen35 *c, GError **error)
{
  c->output_gate = TRUE;
  return wsync_config_get_uint(&c->text, "hidden_size", 1, SIZE, &c->hidden, error) &&
         wsync_config_get_uint(&c->text, "num_attention_heads", 1, SIZE, &c->heads, error) &&
         wsync_config_get_uint(&c->text, "num_key_value_heads", 1, SIZE, &c->kv_heads, error) &&
         wsync_config_check_divides(&c->text, "num_key_value_heads", c->kv_heads,
                                    "num_attention_heads", c->heads, error) &&
         wsync_config_get_head_dim(&c->text, c->hidden, c->heads, 256, &c->head_dim, error) &&
         wsync_config_get_bool_or(&c->text, "attn_output_gate", &c->output_gate, error) &&
         wsync_config_get_bool_or(&c->text, "attention_bias", &c->attention_bias, error) &&
         wsync_config_get_uint(&c->text, "vocab_size", 1, SIZE, &c->vocab, error) &&
         wsync_config_get_uint(&c->text, "num_hidden_layers", 1, COUNT, &c->layers, error);
}

/* tie_word_embeddings.  Transformers ties the LM head of Qwen3_5(Moe)ForConditionalGeneration
 * by the top-level field (it reads `self.config.tie_word_embeddings`, the outer config);
 * vLLM by text_config's (`hf_text_config.tie_word_embeddings`).  Each is its own class's
 * field, default false, and neither library copies one into the other: a text_config
 * without the field is untied for vLLM whatever the top level says
 * (docs/hf-checkpoints.md §3).  Where the two words differ, an absent one counting as
 * false, one engine would load a random LM head (it wants lm_head.weight, the checkpoint
 * has none) or drop a trained one: refused, naming both.  A config without text_config
 * (the root stands in for it) has one word. */
static gboolean
read_tie(Qwen35 *c, GError **error)
{
  gboolean root = FALSE, text = FALSE;

  if (!wsync_config_get_bool_or(&c->root, "tie_word_embeddings", &root, error) ||
      !wsync_config_get_bool_or(&c->text, "tie_word_embeddings", &text, error))
    return FALSE;
  if (text != root)
    return wsync_fail(error, WSYNC_ERROR_BAD_INPUT,
                      "field \"%stie_word_embeddings\" is %s%s but the top-level "
                      "\"tie_word_embeddings\" is %s%s: Transformers ties the LM head by the "
                      "top-level field, vLLM by text_config's, so one of them would load a "
                      "random or drop a trained lm_head.weight; set both to the same value",
                      c->text.where, text ? "true" : "false",
                      json_object_has_member(c->text.object, "tie_word_embeddings")
                          ? ""
                          : " (absent: vLLM's default)",
                      root ? "true" : "false",
                      json_object_has_member(c->root.object, "tie_word_embeddings")
                          ? ""
                          : " (absent: Transformers' default)");
  c->tie = text;
  return TRUE;
}

static gboolean
read_config(WsyncModel *m, Qwen35 *c, GError **error)
{
  WsyncConfigSection sections[2];
  WsyncDtype dtype;

  wsync_model_config_section(m, NULL, FALSE, &c->root);
  wsync_model_config_section(m, "text_config", TRUE, &c->text);
  sections[0] = c->text;
  sections[1] = c->root;
  c->moe = g_strcmp0(wsync_model_get_model_type(m), "qwen3_5_moe") == 0;
  if (!check_text_model_type(m, c, error) || !read_text(c, error) ||
      !read_layer_types(c, error) || !read_linear(c, error) ||
      !read_mlp(c, error) || !read_mtp(c, error) || !read_tie(c, error) ||
      !wsync_config_get_dtype(sections, 2, &dtype, error) || !read_vision(m, c, error))
    return FALSE;
  wsync_model_set_dtype(m, dtype);
  /* what the config of the first N layers changes (synth --layers); the MTP layers and
   * the vision blocks are counted apart and stay */
  wsync_model_declare_layer_field(m, &c->text, "num_hidden_layers", WSYNC_LAYER_FIELD_COUNT);
  wsync_model_declare_layer_field(m, &c->text, "layer_types", WSYNC_LAYER_FIELD_PER_LAYER);
  return TRUE;
}

/* ------------------------------------------------------------------ the model */

static char *
path(const char *module, const char *leaf)
{
  return g_strconcat(module, ".", leaf, NULL);
}

/* Decoder layer @l of @layers (e.g. `model.language_model.layers`): norms, attention of
 * its kind, the MoE block or the MLP. */
static void
describe_layer(WsyncModel *m, const Qwen35 *c, const char *layers, guint64 l,
               gboolean linear, WsyncExpertsForm published)
{
  const WsyncAttention a = {.hidden = c->hidden, .heads = c->heads, .kv_heads = c->kv_heads,
                            .head_dim = c->head_dim, .output_gate = c->output_gate,
                            .qk_norm = TRUE, .qkv_bias = c->attention_bias,
                            .o_bias = c->attention_bias};
  const WsyncMoe moe = {.hidden = c->hidden, .experts = c->experts, .intermediate = c->moe_inter,
                        .shared_intermediate = c->shared_inter, .published = published};
  const WsyncMlp dense = {.hidden = c->hidden, .intermediate = c->inter};
  /* the RMSNorms compute x * (1 + w): the weight is copied verbatim */
  const WsyncDecoderLayer layer = {.hidden = c->hidden,
                                   .attention = linear ? NULL : &a,
                                   .linear_attention = linear ? &c->linear : NULL,
                                   .mlp = c->moe ? NULL : &dense,
                                   .moe = c->moe ? &moe : NULL};

  wsync_model_add_decoder_layer(m, layers, l, &layer);
}

/* A param of all of a new logical tensor MODULE.LEAF. */
static void
whole(WsyncModel *m, WsyncBlock *b, const char *leaf, WsyncParamKind kind, guint ndim,
      guint64 d0, guint64 d1)
{
  g_autofree char *name = path(wsync_block_get_module(b), leaf);

  wsync_model_add_whole(m, b, name, kind, WSYNC_ROLE_NONE, ndim, d0, d1, 0);
}

/* A vision block: LayerNorms, the fused qkv (q, k, v thirds split by heads, repacked
 * per rank), attn.proj and fc2 row-parallel with their biases whole, fc1 column-parallel. */
static void
describe_vision_block(WsyncModel *m, const Vision *v, guint64 b)
{
  g_autofree char *module = g_strdup_printf("model.visual.blocks.%" G_GUINT64_FORMAT, b);
  WsyncBlock *block = wsync_model_add_block(m, WSYNC_BLOCK_OTHER, module);
  guint64 dm = v->hidden, hd = v->hidden / v->heads;
  static const char *const qkv_leaves[2] = {"attn.qkv.weight", "attn.qkv.bias"};

  whole(m, block, "norm1.weight", WSYNC_PARAM_REPLICATED, 1, dm, 0);
  whole(m, block, "norm1.bias", WSYNC_PARAM_REPLICATED, 1, dm, 0);
  whole(m, block, "norm2.weight", WSYNC_PARAM_REPLICATED, 1, dm, 0);
  whole(m, block, "norm2.bias", WSYNC_PARAM_REPLICATED, 1, dm, 0);
  for (guint i = 0; i < 2; i++) {
    g_autofree char *name = path(module, qkv_leaves[i]);
    const guint64 shape[2] = {3 * dm, dm};
    WsyncLogicalTensor *qkv = wsync_model_add_tensor(m, name, wsync_model_get_dtype(m), 2 - i, shape);
    WsyncPart parts[3];
    for (guint p = 0; p < 3; p++)
      parts[p] = (WsyncPart){qkv, p * dm, dm, hd, FALSE};
    wsync_model_add_param(m, block, name, WSYNC_PARAM_COLUMN, WSYNC_ROLE_NONE, 3, parts);
  }
  whole(m, block, "attn.proj.weight", WSYNC_PARAM_ROW, 2, dm, dm);
  whole(m, block, "attn.proj.bias", WSYNC_PARAM_REPLICATED, 1, dm, 0);
  whole(m, block, "mlp.linear_fc1.weight", WSYNC_PARAM_COLUMN, 2, v->inter, dm);
  whole(m, block, "mlp.linear_fc1.bias", WSYNC_PARAM_COLUMN, 1, v->inter, 0);
  whole(m, block, "mlp.linear_fc2.weight", WSYNC_PARAM_ROW, 2, dm, v->inter);
  whole(m, block, "mlp.linear_fc2.bias", WSYNC_PARAM_REPLICATED, 1, dm, 0);
}

/* The vision tower (docs/hf-checkpoints.md §3, docs/vllm.md §9.5). */
static void
describe_vision(WsyncModel *m, const Vision *v)
{
  WsyncBlock *top = wsync_model_add_block(m, WSYNC_BLOCK_OTHER, "model.visual");
  guint64 dm = v->hidden, merged = v->hidden * v->merge * v->merge;
  const guint64 patch[5] = {dm, v->in_channels, v->temporal, v->patch, v->patch};
  WsyncPart part = {wsync_model_add_tensor(m, "model.visual.patch_embed.proj.weight",
                                           wsync_model_get_dtype(m), 5, patch),
                    0, 0, 1, FALSE};

  /* Conv3d keeps its 5-D weight, whole on every rank; nn.Embedding positions */
  wsync_model_add_param(m, top, "model.visual.patch_embed.proj.weight", WSYNC_PARAM_REPLICATED,
                        WSYNC_ROLE_NONE, 1, &part);
  whole(m, top, "patch_embed.proj.bias", WSYNC_PARAM_REPLICATED, 1, dm, 0);
  whole(m, top, "pos_embed.weight", WSYNC_PARAM_REPLICATED, 2, v->positions, dm);
  for (guint64 b = 0; b < v->depth; b++)
    describe_vision_block(m, v, b);
  /* the patch merger: LayerNorm(D), Column(M -> M), Row(M -> O) */
  whole(m, top, "merger.norm.weight", WSYNC_PARAM_REPLICATED, 1, dm, 0);
  whole(m, top, "merger.norm.bias", WSYNC_PARAM_REPLICATED, 1, dm, 0);
  whole(m, top, "merger.linear_fc1.weight", WSYNC_PARAM_COLUMN, 2, merged, merged);
  whole(m, top, "merger.linear_fc1.bias", WSYNC_PARAM_COLUMN, 1, merged, 0);
  whole(m, top, "merger.linear_fc2.weight", WSYNC_PARAM_ROW, 2, v->out, merged);
  whole(m, top, "merger.linear_fc2.bias", WSYNC_PARAM_REPLICATED, 1, v->out, 0);
}

/* The multi-token-prediction block: fc [H, 2H], three norms, full-attention layers with
 * routed experts per expert (docs/hf-checkpoints.md §3). */
static void
describe_mtp(WsyncModel *m, const Qwen35 *c)
{
  WsyncBlock *top = wsync_model_add_block(m, WSYNC_BLOCK_OTHER, "mtp");

  whole(m, top, "fc.weight", WSYNC_PARAM_COLUMN, 2, c->hidden, 2 * c->hidden);
  wsync_model_add_norm(m, "mtp.pre_fc_norm_embedding.weight", c->hidden);
  wsync_model_add_norm(m, "mtp.pre_fc_norm_hidden.weight", c->hidden);
  for (guint64 l = 0; l < c->mtp_layers; l++)
    describe_layer(m, c, "mtp.layers", l, FALSE, WSYNC_EXPERTS_PER_EXPERT);
  wsync_model_add_norm(m, "mtp.norm.weight", c->hidden);
}

/* This plugin describes the published checkpoint of
 * Qwen3_5(Moe)ForConditionalGeneration: text under model.language_model., the vision
 * tower under model.visual., lm_head at the top.  Transformers' Qwen3_5(Moe)ForCausalLM,
 * which AutoModelForCausalLM builds for these model_types too, is a text-only model of
 * other names (model.layers.*, model.embed_tokens, model.norm; the tower is ignored on
 * load) and vLLM's class of that name holds other names again (docs/hf-checkpoints.md §3
 * "Text-only Qwen3.5").  Neither is described here: a config naming them, or any other
 * class, is refused (wsync_model_accept_architecture()) rather than described under a
 * class whose names they are not. */
#define ONLY_MULTIMODAL                                                                         \
  "(the published multimodal checkpoint: model.language_model.*, model.visual.*, "           \
  "lm_head.weight); a text-only checkpoint (Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM) is "  \
  "not supported"

/* model_type "qwen3_5_moe_text" / "qwen3_5_text" at the top level: a text-only
 * checkpoint, the config of Transformers' Qwen3_5(Moe)ForCausalLM (config class
 * Qwen3_5(Moe)TextConfig).  Claimed only to refuse it with what is supported: left
 * unclaimed, the user was told to select a model plugin, exit 2. */
static gboolean
check_not_text_only(WsyncModel *m, GError **error)
{
  const char *model_type = wsync_model_get_model_type(m);

  if (!g_str_has_suffix(model_type, "_text"))
    return TRUE;
  return wsync_fail(error, WSYNC_ERROR_BAD_INPUT,
                    "field \"model_type\" is \"%s\": a text-only Qwen3.5 checkpoint "
                    "(Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM) is not supported; qwen3_5_moe "
                    "supports model_type \"qwen3_5_moe\" and \"qwen3_5\" (the published "
                    "multimodal checkpoint: model.language_model.*, model.visual.*, "
                    "lm_head.weight)",
                    model_type);
}

/* The remapper. */
static gboolean
describe(WsyncModel *m, gpointer user_data, GError **error)
{
  gboolean language_model_only = user_data != NULL && *(const gboolean *)user_data;
  g_autofree guint *kind = NULL;
  Qwen35 c = {0};
  gboolean ok;

  if (!check_not_text_only(m, error))
    return FALSE;
  ok = read_config(m, &c, error);
  kind = c.kind;
  if (!ok)
    return FALSE;
  if (!wsync_model_accept_architecture(m,
                                       c.moe ? "Qwen3_5MoeForConditionalGeneration"
                                             : "Qwen3_5ForConditionalGeneration",
                                       NULL, ONLY_MULTIMODAL, error))
    return FALSE;
  wsync_model_add_vocab(m, "model.language_model.embed_tokens.weight", "lm_head.weight", c.vocab,
                        c.hidden, c.tie);
  /* Tied: torch's state_dict() and checkpoints saved from it carry lm_head.weight beside
   * the embedding.  vLLM's Qwen3.5 before #51665 loads it into the module both names
   * hold (`self.lm_head = self.model.embed_tokens`, qwen3_5.py:503-504, 549-553 @ cut24),
   * main skips every tied alias (docs/vllm.md §3).  A copy of the embedding is therefore
   * the embedding: dropped; anything else is refused. */
  if (c.tie)
    wsync_model_add_copy_rule(m, "tied-lm-head", "lm_head.weight",
                              "model.language_model.embed_tokens.weight");
  for (guint64 l = 0; l < c.layers; l++)
    describe_layer(m, &c, "model.language_model.layers", l, is_linear(&c, l),
                   WSYNC_EXPERTS_FUSED);
  wsync_model_add_norm(m, "model.language_model.norm.weight", c.hidden);
  if (c.vision.present) {
    /* vLLM's --language-model-only builds no tower (docs/vllm.md §9.5); rank files record
     * the switch, and read back as they record it */
    wsync_model_begin_switched_group(m, WSYNC_GROUP_VISION, "language-model-only",
                                     language_model_only);
    describe_vision(m, &c.vision);
  }
  if (c.mtp_layers > 0) {
    wsync_model_begin_group(m, WSYNC_GROUP_DRAFT, NULL);
    describe_mtp(m, &c);
  }
  /* Older PyTorch checkpoints saved the RoPE buffers (the vision tower's
   * rotary_pos_emb.inv_freq too), and checkpoints of early ColossalAI or GPTQModel the
   * caches; they are derived from the config, nothing holds them, and vLLM's
   * AutoWeightsLoader skips them all (docs/vllm.md §9.1). */
  wsync_model_add_drop_rule(m, "rotary-inv-freq", "*.rotary_emb.inv_freq");
  wsync_model_add_drop_rule(m, "rotary-cache", "*.rotary_emb.*_cached");
  wsync_model_add_drop_rule(m, "rotary-pos-inv-freq", "*.rotary_pos_emb.inv_freq");
  return TRUE;
}

/* Designated initialisers: CFG_BOOL() has no slot for a comment. */
static cfg_opt_t options[] = {
    {.name = "language-model-only",
     .type = CFGT_BOOL,
     .flags = CFGF_NONE,
     .def.boolean = cfg_false,
     .comment = WSYNC_OPTION_DOC(
         "True when vLLM runs without the vision tower (--language-model-only, or every "
         "multimodal limit 0): vLLM then holds no visual.* params, and the runtime targets "
         "drop them by the rule language-model-only; the Hugging Face targets always keep "
         "them. Rank files record it (metadata wsync.runtime-drop.language-model-only) and "
         "are read back as they record it, whatever this option says; only rank files of "
         "an earlier wsync, which record nothing, are read by it.",
         "")},
    CFG_END()};

static gboolean
qwen3_5_moe_register(WsyncPlugin *plugin, GError **error)
{
  gboolean *language_model_only = g_new(gboolean, 1);

  *language_model_only =
      cfg_getbool(wsync_plugin_get_options(plugin), "language-model-only") == cfg_true;
  return wsync_plugin_add_remapper(plugin, "qwen3_5_moe", WSYNC_PRIORITY_DEFAULT,
                                   "qwen3_5_moe,qwen3_5,qwen3_5_moe_text,qwen3_5_text", describe, language_model_only, g_free,
                                   error);
}

WSYNC_PLUGIN_DEFINE("qwen3_5_moe",
                    "Qwen3.5 / Qwen3.6, MoE and dense: text, vision tower, MTP, expert forms",
                    options, qwen3_5_moe_register)
