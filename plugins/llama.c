/* wsync plugin "llama": Llama 3.x dense models (Llama-3.1-8B/70B, Llama-3.2-1B/3B and
 * their Instruct variants), `model_type` "llama", described from config.json alone
 * (docs/hf-checkpoints.md §5).
 *
 * A decoder of num_hidden_layers layers: input norm, attention (grouped-query: fewer KV
 * heads than query heads, no q/k norms), post-attention norm, gated MLP; embeddings,
 * tied or not; the final norm.  attention_bias gives q/k/v AND o_proj biases, mlp_bias
 * gives gate/up/down biases (Transformers' LlamaAttention and LlamaMLP; vLLM's
 * LlamaDecoderLayer, vllm/model_executor/models/llama.py:266-272, 303 @ df1376907b16,
 * docs/vllm.md §10 "Biases").  Two more keys that LlamaConfig does not have
 * (configuration_llama.py @ 008e57439125) are read as LlamaDecoderLayer reads them,
 * the one reader that gives them a meaning (llama.py:265-272): `bias` counts as
 * attention_bias (abacusai/Smaug-72B-v0.1), and `qkv_bias`, when present, decides the
 * q/k/v biases alone (internlm/internlm3-8b), o_proj keeping attention_bias or bias.
 * How an engine packs, names and slices these is the target's business, not this file's.
 *
 * RoPE (rope_theta, rope_scaling of type "llama3", or Transformers 5's rope_parameters)
 * changes no tensor name or shape (docs/hf-checkpoints.md §5), so it is not read here;
 * the rope-compat plugin, when selected, rewrites it in the config.json a conversion
 * writes (docs/hf-checkpoints.md §6).
 *
 * Config fields, all at the root.  Every field that decides a shape is required;
 * defaults only where LlamaConfig has one (docs/hf-checkpoints.md §5,
 * configuration_llama.py:69-90 @ 008e57439125): num_key_value_heads (num_attention_heads),
 * head_dim (hidden_size / num_attention_heads), tie_word_embeddings, attention_bias,
 * bias and mlp_bias (false), qkv_bias (attention_bias or bias), the dtype (bfloat16).
 */
#include <wsync/model.h>
#include <wsync/plugin.h>

typedef struct {
  WsyncConfigSection root;
  guint64 hidden, heads, kv_heads, head_dim, vocab, layers, inter;
  gboolean tie, qkv_bias, o_bias, mlp_bias;
} Llama;

#define SIZE WSYNC_CONFIG_SIZE_MAX
#define COUNT WSYNC_CONFIG_COUNT_MAX

/* The attention biases, as vLLM's LlamaDecoderLayer decides them (llama.py:265-272 @
 * df1376907b16, docs/vllm.md §10 "Biases"): `attention_bias or bias` gives o_proj's and,
 * unless the config has `qkv_bias`, q/k/v's.  Without this, a config saying `bias` or
 * `qkv_bias` had no biases here: wsync refused the checkpoint's bias tensors as unmapped,
 * and from a checkpoint without them wrote rank files that vLLM's sharded_state loader
 * refuses for the missing (or, with "qkv_bias": false, extra) qkv_proj.bias. */
static gboolean
read_biases(Llama *c, GError **error)
{
  gboolean attention_bias = FALSE, bias = FALSE;

  if (!wsync_config_get_bool_or(&c->root, "attention_bias", &attention_bias, error) ||
      !wsync_config_get_bool_or(&c->root, "bias", &bias, error))
    return FALSE;
  c->o_bias = attention_bias || bias;
  /* vLLM asks hasattr(config, "qkv_bias"): "qkv_bias": null passes it and gives None,
   * no q/k/v biases, where a null elsewhere counts as absent (it is falsy there too) */
  JsonNode *qkv = json_object_get_member(c->root.object, "qkv_bias");
  c->qkv_bias = qkv == NULL ? c->o_bias : FALSE;
  return wsync_config_get_bool_or(&c->root, "qkv_bias", &c->qkv_bias, error) &&
         wsync_config_get_bool_or(&c->root, "mlp_bias", &c->mlp_bias, error);
}

/* head_dim: the field (null counts as absent), else hidden_size / num_attention_heads,
 * as LlamaConfig.__post_init__ and vLLM's LlamaAttention (llama.py:156-157 @ df1376907b16)
 * both compute it (docs/hf-checkpoints.md §5, docs/vllm.md §10). */
static gboolean
read_config(WsyncModel *m, Llama *c, GError **error)
{
  WsyncDtype dtype;

  wsync_model_config_section(m, NULL, FALSE, &c->root);
  if (!wsync_config_get_uint(&c->root, "hidden_size", 1, SIZE, &c->hidden, error) ||
      !wsync_config_get_uint(&c->root, "num_attention_heads", 1, SIZE, &c->heads, error))
    return FALSE;
  c->kv_heads = c->heads; /* LlamaConfig: no GQA unless the config says so */
  if (!wsync_config_get_uint_or(&c->root, "num_key_value_heads", 1, SIZE, &c->kv_heads, error) ||
      !wsync_config_get_head_dim(&c->root, c->hidden, c->heads, 0, &c->head_dim, error) ||
      !wsync_config_get_uint(&c->root, "vocab_size", 1, SIZE, &c->vocab, error) ||
      !wsync_config_get_uint(&c->root, "num_hidden_layers", 1, COUNT, &c->layers, error) ||
      !wsync_config_get_uint(&c->root, "intermediate_size", 1, SIZE, &c->inter, error) ||
      !wsync_config_get_bool_or(&c->root, "tie_word_embeddings", &c->tie, error) ||
      !read_biases(c, error) ||
      !wsync_config_get_dtype(&c->root, 1, &dtype, error))
    return FALSE;
  /* Each KV head serves num_attention_heads / num_key_value_heads query heads, a whole
   * number in every consumer: Transformers' repeat_kv (modeling_llama.py:194-203, 240
   * @ 5dd4a6354885, docs/hf-checkpoints.md §5 "GQA") and vLLM's Attention (`assert
   * num_heads % num_kv_heads == 0`, attention.py:319 @ df1376907b16, docs/vllm.md §10).
   * LlamaConfig does not check it, so a checkpoint would load and fail at its first
   * forward, and vLLM would refuse to start. */
  if (!wsync_config_check_divides(&c->root, "num_key_value_heads", c->kv_heads,
                                  "num_attention_heads", c->heads, error))
    return FALSE;
  wsync_model_set_dtype(m, dtype);
  /* what the config of the first N layers changes (synth --layers) */
  wsync_model_declare_layer_field(m, &c->root, "num_hidden_layers", WSYNC_LAYER_FIELD_COUNT);
  return TRUE;
}

/* One decoder layer, LlamaDecoderLayer (docs/hf-checkpoints.md §5). */
static void
describe_layer(WsyncModel *m, const Llama *c, guint64 l)
{
  const WsyncAttention a = {.hidden = c->hidden, .heads = c->heads, .kv_heads = c->kv_heads,
                            .head_dim = c->head_dim, .qkv_bias = c->qkv_bias,
                            .o_bias = c->o_bias};
  const WsyncMlp dense = {.hidden = c->hidden, .intermediate = c->inter, .bias = c->mlp_bias};
  const WsyncDecoderLayer layer = {.hidden = c->hidden, .attention = &a, .mlp = &dense};

  wsync_model_add_decoder_layer(m, "model.layers", l, &layer);
}

/* The classes described: LlamaForCausalLM, and the name the decapoda-research/llama-*
 * conversions published, which vLLM builds as its LlamaForCausalLM (registry.py:155-156
 * @ df1376907b16; Transformers builds the class of model_type "llama" whatever
 * architectures says).  Any other class (LlamaForSequenceClassification, vLLM's
 * MistralForCausalLM, ...) is refused: its names or its engine class are not these
 * (docs/hf-checkpoints.md §5 "Architectures").  An alias is described as
 * LlamaForCausalLM, so that the vllm backend's rules for that class apply to it. */
static const char *const llama_aliases[] = {"LLaMAForCausalLM", NULL};

/* The remapper. */
static gboolean
describe(WsyncModel *m, gpointer user_data, GError **error)
{
  Llama c = {0};

  (void)user_data;
  if (!read_config(m, &c, error) ||
      !wsync_model_accept_architecture(m, "LlamaForCausalLM", llama_aliases, NULL, error))
    return FALSE;
  /* tied: lm_head.weight is the embedding under a second name (`lm_head.tie_weights`,
   * llama.py:486-493 @ df1376907b16; docs/vllm.md §3, §10) */
  wsync_model_add_vocab(m, "model.embed_tokens.weight", "lm_head.weight", c.vocab, c.hidden,
                        c.tie);
  /* Tied: torch's state_dict() and checkpoints saved from it carry lm_head.weight beside
   * the embedding; vLLM's Llama skips it (`skip_prefixes=["lm_head."]` when tied,
   * llama.py:572 @ cut24, llama.py:646 @ 344a0017c06e; main skips every tied alias since
   * #51665, docs/vllm.md §3).  A copy of the embedding is dropped; anything else is
   * refused. */
  if (c.tie)
    wsync_model_add_copy_rule(m, "tied-lm-head", "lm_head.weight", "model.embed_tokens.weight");
  for (guint64 l = 0; l < c.layers; l++)
    describe_layer(m, &c, l);
  wsync_model_add_norm(m, "model.norm.weight", c.hidden);
  /* Older converted checkpoints saved the RoPE buffers; vLLM skips them and nothing
   * holds them (docs/vllm.md §10 "Skipped checkpoint names"). */
  wsync_model_add_drop_rule(m, "rotary-inv-freq", "*.rotary_emb.inv_freq");
  wsync_model_add_drop_rule(m, "rotary-cache", "*.rotary_emb.*_cached");
  return TRUE;
}

static gboolean
llama_register(WsyncPlugin *plugin, GError **error)
{
  return wsync_plugin_add_remapper(plugin, "llama", WSYNC_PRIORITY_DEFAULT, "llama", describe,
                                   NULL, NULL, error);
}

WSYNC_PLUGIN_DEFINE("llama", "Llama 3.x dense: names, shapes, GQA, tied embeddings, biases",
                    NULL, llama_register)
