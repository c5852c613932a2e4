/* wsync plugin "qwen3_moe": Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B and their 2507
 * variants) and Qwen3 dense, described from config.json alone (docs/hf-checkpoints.md
 * §2).
 *
 * A decoder of num_hidden_layers layers: input norm, attention with q/k norms, post
 * attention norm, and a MoE block (router, routed experts published per expert) or,
 * for Qwen3 dense and the layers in mlp_only_layers or off the decoder_sparse_step, a
 * gated MLP; embeddings, tied or not; the final norm.
 *
 * Config fields: read from `text_config` when the config has that object, else from the
 * root.  Every field that decides a shape is required; defaults only where Transformers
 * has one the published configs rely on: head_dim (Qwen3 dense: 128; Qwen3-MoE:
 * hidden_size / num_attention_heads), decoder_sparse_step (1), mlp_only_layers ([]),
 * tie_word_embeddings (false), attention_bias (false), the dtype (bfloat16).
 *
 * attention_bias gives q_proj, k_proj, v_proj AND o_proj a bias, as Transformers'
 * Qwen3Attention builds them (`bias=config.attention_bias` on all four; the Qwen3-MoE
 * attention is the same), docs/hf-checkpoints.md §2.
 */
#include <wsync/model.h>
#include <wsync/plugin.h>

typedef struct {
  WsyncConfigSection text;
  gboolean dense; /* model_type "qwen3": no experts anywhere */
  guint64 hidden, heads, kv_heads, head_dim, vocab, layers;
  guint64 experts, moe_inter, inter, sparse_step;
  gboolean *mlp_only; /* per layer */
  gboolean tie;
  gboolean attention_bias; /* q/k/v/o_proj biases (docs/hf-checkpoints.md §2) */
} Qwen3;

#define SIZE WSYNC_CONFIG_SIZE_MAX
#define COUNT WSYNC_CONFIG_COUNT_MAX

/* A layer is MoE unless it is in mlp_only_layers or (idx+1) % decoder_sparse_step != 0;
 * Transformers and vLLM use the same test, and both need experts (docs/vllm.md §8). */
static gboolean
layer_is_moe(const Qwen3 *c, guint64 layer)
{
  return !c->dense && c->experts > 0 && (layer + 1) % c->sparse_step == 0 &&
         !c->mlp_only[layer];
}

static gboolean
any_layer(const Qwen3 *c, gboolean moe)
{
  for (guint64 l = 0; l < c->layers; l++)
    if (layer_is_moe(c, l) == moe)
      return TRUE;
  return FALSE;
}

static gboolean
read_mlp(Qwen3 *c, GError **error)
{
  c->sparse_step = 1;
  c->mlp_only = g_new0(gboolean, c->layers);
  if (!c->dense &&
      (!wsync_config_get_uint(&c->text, "num_experts|num_local_experts", 0, COUNT, &c->experts,
                              error) ||
       !wsync_config_get_uint_or(&c->text, "decoder_sparse_step", 1, COUNT, &c->sparse_step,
                                 error) ||
       !wsync_config_get_indices(&c->text, "mlp_only_layers", c->layers, c->mlp_only, error)))
    return FALSE;
  if (any_layer(c, TRUE) &&
      !wsync_config_get_uint(&c->text, "moe_intermediate_size", 1, SIZE, &c->moe_inter, error))
    return FALSE;
  return !any_layer(c, FALSE) ||
         wsync_config_get_uint(&c->text, "intermediate_size", 1, SIZE, &c->inter, error);
}

/* Each KV head serves num_attention_heads / num_key_value_heads query heads, a whole
 * number in every consumer: vLLM's Attention asserts `num_heads % num_kv_heads == 0` on
 * every rank (vllm/model_executor/layers/attention/attention.py:319 @ df1376907b16,
 * docs/vllm.md §8), and Transformers groups the query heads by KV head as Llama's
 * attention does (`num_key_value_groups`, repeat_kv; docs/hf-checkpoints.md §5 "GQA"). */
static gboolean
check_kv_heads(const Qwen3 *c, GError **error)
{
  return wsync_config_check_divides(&c->text, "num_key_value_heads", c->kv_heads,
                                    "num_attention_heads", c->heads, error);
}

/* head_dim: the field, else Qwen3Config's default 128 (dense) or what Qwen3-MoE's
 * attention computes, hidden_size / num_attention_heads (docs/hf-checkpoints.md §2). */
static gboolean
read_config(WsyncModel *m, Qwen3 *c, GError **error)
{
  WsyncConfigSection sections[2];
  WsyncDtype dtype;

  wsync_model_config_section(m, "text_config", TRUE, &c->text);
  wsync_model_config_section(m, NULL, FALSE, &sections[1]);
  sections[0] = c->text;
  c->dense = g_strcmp0(wsync_model_get_model_type(m), "qwen3") == 0;
  if (!wsync_config_get_uint(&c->text, "hidden_size", 1, SIZE, &c->hidden, error) ||
      !wsync_config_get_uint(&c->text, "num_attention_heads", 1, SIZE, &c->heads, error) ||
      !wsync_config_get_uint(&c->text, "num_key_value_heads", 1, SIZE, &c->kv_heads, error) ||
      !wsync_config_get_head_dim(&c->text, c->hidden, c->heads, c->dense ? 128 : 0,
                                 &c->head_dim, error) ||
      !wsync_config_get_uint(&c->text, "vocab_size", 1, SIZE, &c->vocab, error) ||
      !wsync_config_get_uint(&c->text, "num_hidden_layers", 1, COUNT, &c->layers, error) ||
      !read_mlp(c, error) ||
      !wsync_config_get_bool_or(&c->text, "attention_bias", &c->attention_bias, error) ||
      !wsync_config_get_bool_or(&c->text, "tie_word_embeddings", &c->tie, error) ||
      (c->text.object != sections[1].object &&
       !wsync_config_get_bool_or(&sections[1], "tie_word_embeddings", &c->tie, error)) ||
      !wsync_config_get_dtype(sections, 2, &dtype, error) ||
      !check_kv_heads(c, error))
    return FALSE;
  wsync_model_set_dtype(m, dtype);
  /* what the config of the first N layers changes (synth --layers) */
  wsync_model_declare_layer_field(m, &c->text, "num_hidden_layers", WSYNC_LAYER_FIELD_COUNT);
  wsync_model_declare_layer_field(m, &c->text, "mlp_only_layers", WSYNC_LAYER_FIELD_INDICES);
  return TRUE;
}

/* One decoder layer (docs/hf-checkpoints.md §2). */
static void
describe_layer(WsyncModel *m, const Qwen3 *c, guint64 l)
{
  const WsyncAttention a = {.hidden = c->hidden, .heads = c->heads, .kv_heads = c->kv_heads,
                            .head_dim = c->head_dim, .qk_norm = TRUE,
                            .qkv_bias = c->attention_bias, .o_bias = c->attention_bias};
  const WsyncMoe moe = {.hidden = c->hidden, .experts = c->experts,
                        .intermediate = c->moe_inter, .published = WSYNC_EXPERTS_PER_EXPERT};
  const WsyncMlp dense = {.hidden = c->hidden, .intermediate = c->inter};
  const gboolean sparse = layer_is_moe(c, l);
  const WsyncDecoderLayer layer = {.hidden = c->hidden, .attention = &a,
                                   .mlp = sparse ? NULL : &dense, .moe = sparse ? &moe : NULL};

  wsync_model_add_decoder_layer(m, "model.layers", l, &layer);
}

/* The remapper. */
static gboolean
describe(WsyncModel *m, gpointer user_data, GError **error)
{
  g_autofree gboolean *mlp_only = NULL;
  Qwen3 c = {0};
  gboolean ok;

  (void)user_data;
  ok = read_config(m, &c, error);
  mlp_only = c.mlp_only;
  if (!ok)
    return FALSE;
  /* one class per model_type, no alias in vLLM's registry (registry.py:206-207 @
   * df1376907b16): Qwen3MoeForCausalLM under "qwen3", a classification head, ... are
   * refused (docs/hf-checkpoints.md §2 "Architectures") */
  if (!wsync_model_accept_architecture(m, c.dense ? "Qwen3ForCausalLM" : "Qwen3MoeForCausalLM",
                                       NULL, NULL, error))
    return FALSE;
  wsync_model_add_vocab(m, "model.embed_tokens.weight", "lm_head.weight", c.vocab, c.hidden,
                        c.tie);
  /* Tied: torch's state_dict() and checkpoints saved from it carry lm_head.weight beside
   * the embedding.  vLLM's Qwen3 skips it (`skip_prefixes=["lm_head."]` when tied,
   * qwen3.py:344 @ cut24, qwen3.py:336 @ 344a0017c06e); its Qwen3-MoE loads it into the
   * one Parameter both names hold (qwen3_moe.py:698-699, 769-771 @ cut24), and main
   * skips every tied alias since #51665 (docs/vllm.md §3).  A copy of the embedding is
   * therefore the embedding: dropped; anything else is refused. */
  if (c.tie)
    wsync_model_add_copy_rule(m, "tied-lm-head", "lm_head.weight", "model.embed_tokens.weight");
  for (guint64 l = 0; l < c.layers; l++)
    describe_layer(m, &c, l);
  wsync_model_add_norm(m, "model.norm.weight", c.hidden);
  /* Older PyTorch checkpoints saved the RoPE buffer, and checkpoints of early
   * ColossalAI or GPTQModel its caches; they are derived from the config, nothing holds
   * them, and vLLM's AutoWeightsLoader skips all three (docs/vllm.md §8). */
  wsync_model_add_drop_rule(m, "rotary-inv-freq", "*.rotary_emb.inv_freq");
  wsync_model_add_drop_rule(m, "rotary-cache", "*.rotary_emb.*_cached");
  return TRUE;
}

static gboolean
qwen3_moe_register(WsyncPlugin *plugin, GError **error)
{
  return wsync_plugin_add_remapper(plugin, "qwen3_moe", WSYNC_PRIORITY_DEFAULT,
                                   "qwen3_moe,qwen3", describe, NULL, NULL, error);
}

WSYNC_PLUGIN_DEFINE("qwen3_moe", "Qwen3-MoE and Qwen3 dense: names, shapes, expert forms", NULL,
                    qwen3_moe_register)
