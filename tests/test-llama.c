/* The llama plugin through the wsync command: synth, convert to vLLM's two formats at
 * tp 1, 2, 4 and 8, back to the Hugging Face layout, and refusals.
 *
 * The expected tensors are worked out here from config.json with the defaults of
 * LlamaConfig (docs/hf-checkpoints.md §5) and the per-rank table of vLLM's
 * LlamaForCausalLM (docs/vllm.md §10), not from the plugins.  `synth --pattern index`
 * makes every element of every tensor encode the tensor and its position, and every
 * element of every rank file is compared (tests/oracle.h) with the element of the
 * Hugging Face tensor vLLM's loader puts there (docs/vllm.md §2, §3).
 */
#include <json-glib/json-glib.h>

#include <wsync/wsync.h>

#include "oracle.h"
#include "testutil.h"

#define UNTIED "tiny-llama3.json"            /* GQA 8/2, head_dim absent, vocab 300 */
#define TIED "tiny-llama3-tied-bias.json"    /* tied, attention and MLP biases, vocab 200 */
/* tiny-llama3.json with the bias keys vLLM's LlamaDecoderLayer also reads (docs/vllm.md
 * §10 "Biases"): "bias" (q/k/v and o_proj biases), "qkv_bias": true (q/k/v only), and
 * "attention_bias": true with "qkv_bias": false (o_proj only) */
#define BIAS_KEY "tiny-llama3-bias-key.json"
#define QKV_BIAS "tiny-llama3-qkv-bias.json"
#define O_BIAS "tiny-llama3-o-bias.json"
/* O_BIAS with "qkv_bias": null: there to hasattr() and falsy, so o_proj only */
#define QKV_BIAS_NULL "tiny-llama3-qkv-bias-null.json"

static char *work_dir;  /* everything made, removed at the end */
static char *conf_dir;  /* hf, llama, vllm */
static const char *plugin_dir;
static GHashTable *synth_dirs; /* config -> its synth --pattern index checkpoint */
static guint n_made;

/* ------------------------------------------------------------------ running wsync */

/* wsync --conf-dir CONF --plugin-dir PLUGINS ARGS... (testutil.h: under memcheck too in
 * make check-valgrind). */
static TestRun
run_wsync(const char *first, ...)
{
  va_list ap;
  TestRun r;

  va_start(ap, first);
  r = test_run_in_va(conf_dir, plugin_dir, first, ap);
  va_end(ap);
  return r;
}

static void
expect_status(TestRun *r, int status, const char *what)
{
  if (r->status != status)
    g_error("%s: exit %d, expected %d\nstdout: %s\nstderr: %s", what, r->status, status,
            r->out, r->err);
  test_run_clear(r);
}

static char *
new_path(const char *what)
{
  return g_strdup_printf("%s/%u-%s", work_dir, n_made++, what);
}

static char *
config_path(const char *name)
{
  return g_test_build_filename(G_TEST_DIST, "data", "configs", name, NULL);
}

/* The synth --pattern index checkpoint of a config, made once. */
static const char *
synth(const char *config)
{
  char *dir = g_hash_table_lookup(synth_dirs, config);

  if (dir == NULL) {
    g_autofree char *path = config_path(config);
    TestRun r;
    dir = new_path("synth");
    r = run_wsync("synth", "--config", path, dir, "--pattern", "index", NULL);
    expect_status(&r, 0, "synth");
    g_hash_table_insert(synth_dirs, g_strdup(config), dir);
  }
  return dir;
}

/* ------------------------------------------------------------------ the model, from config.json */

typedef struct {
  JsonObject *root;
  guint64 H, nh, nkv, hd, I, V, L;
  gboolean tied, qkv_bias, o_bias, mlp_bias;
} Model;

static JsonObject *
load_json(const char *path)
{
  g_autoptr(JsonParser) parser = json_parser_new();
  GError *error = NULL;

  json_parser_load_from_file(parser, path, &error);
  g_assert_no_error(error);
  return json_object_ref(json_node_get_object(json_parser_get_root(parser)));
}

static guint64
int_or(JsonObject *o, const char *key, guint64 fallback)
{
  JsonNode *node = json_object_get_member(o, key);

  return node != NULL && !JSON_NODE_HOLDS_NULL(node) ? (guint64)json_node_get_int(node) : fallback;
}

/* LlamaConfig's defaults (docs/hf-checkpoints.md §5): num_key_value_heads =
 * num_attention_heads, head_dim = hidden_size / num_attention_heads, the flags false.
 * The attention biases as vLLM's LlamaDecoderLayer decides them (docs/vllm.md §10
 * "Biases"): attention_bias or bias gives o_proj's, and q/k/v's unless qkv_bias is
 * there. */
static Model
read_model(const char *config)
{
  g_autofree char *path = config_path(config);
  Model m = {.root = load_json(path)};

  m.H = int_or(m.root, "hidden_size", 0);
  m.nh = int_or(m.root, "num_attention_heads", 0);
  m.nkv = int_or(m.root, "num_key_value_heads", m.nh);
  m.hd = int_or(m.root, "head_dim", m.H / m.nh);
  m.I = int_or(m.root, "intermediate_size", 0);
  m.V = int_or(m.root, "vocab_size", 0);
  m.L = int_or(m.root, "num_hidden_layers", 0);
  m.tied = json_object_get_boolean_member_with_default(m.root, "tie_word_embeddings", FALSE);
  m.o_bias = json_object_get_boolean_member_with_default(m.root, "attention_bias", FALSE) ||
             json_object_get_boolean_member_with_default(m.root, "bias", FALSE);
  /* vLLM asks hasattr(config, "qkv_bias"), which "qkv_bias": null passes (None: no
   * bias) */
  JsonNode *qkv = json_object_get_member(m.root, "qkv_bias");
  m.qkv_bias = qkv == NULL ? m.o_bias : !JSON_NODE_HOLDS_NULL(qkv) && json_node_get_boolean(qkv);
  m.mlp_bias = json_object_get_boolean_member_with_default(m.root, "mlp_bias", FALSE);
  return m;
}

static void
model_clear(Model *m)
{
  json_object_unref(m->root);
}

/* Writes @root as a config.json at @path. */
static void
write_config(JsonObject *root, const char *path)
{
  g_autoptr(JsonGenerator) gen = json_generator_new();
  g_autoptr(JsonNode) node = json_node_init_object(json_node_alloc(), root);
  GError *error = NULL;

  json_generator_set_root(gen, node);
  g_assert_true(json_generator_to_file(gen, path, &error));
  g_assert_no_error(error);
}

#define LAYER(l, s) g_strdup_printf("model.layers.%" G_GUINT64_FORMAT "." s, l)

/* Name -> "[shape]" of the published checkpoint (docs/hf-checkpoints.md §5). */
static GHashTable *
hf_tensors(const Model *m)
{
  GHashTable *want = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
  guint64 q = m->nh * m->hd, kv = m->nkv * m->hd;

  expect_tensor(want, g_strdup("model.embed_tokens.weight"), 2, m->V, m->H, 0);
  expect_tensor(want, g_strdup("model.norm.weight"), 1, m->H, 0, 0);
  if (!m->tied)
    expect_tensor(want, g_strdup("lm_head.weight"), 2, m->V, m->H, 0);
  for (guint64 l = 0; l < m->L; l++) {
    expect_tensor(want, LAYER(l, "input_layernorm.weight"), 1, m->H, 0, 0);
    expect_tensor(want, LAYER(l, "post_attention_layernorm.weight"), 1, m->H, 0, 0);
    expect_tensor(want, LAYER(l, "self_attn.q_proj.weight"), 2, q, m->H, 0);
    expect_tensor(want, LAYER(l, "self_attn.k_proj.weight"), 2, kv, m->H, 0);
    expect_tensor(want, LAYER(l, "self_attn.v_proj.weight"), 2, kv, m->H, 0);
    expect_tensor(want, LAYER(l, "self_attn.o_proj.weight"), 2, m->H, q, 0);
    expect_tensor(want, LAYER(l, "mlp.gate_proj.weight"), 2, m->I, m->H, 0);
    expect_tensor(want, LAYER(l, "mlp.up_proj.weight"), 2, m->I, m->H, 0);
    expect_tensor(want, LAYER(l, "mlp.down_proj.weight"), 2, m->H, m->I, 0);
    if (m->qkv_bias) {
      expect_tensor(want, LAYER(l, "self_attn.q_proj.bias"), 1, q, 0, 0);
      expect_tensor(want, LAYER(l, "self_attn.k_proj.bias"), 1, kv, 0, 0);
      expect_tensor(want, LAYER(l, "self_attn.v_proj.bias"), 1, kv, 0, 0);
    }
    if (m->o_bias)
      expect_tensor(want, LAYER(l, "self_attn.o_proj.bias"), 1, m->H, 0, 0);
    if (m->mlp_bias) {
      expect_tensor(want, LAYER(l, "mlp.gate_proj.bias"), 1, m->I, 0, 0);
      expect_tensor(want, LAYER(l, "mlp.up_proj.bias"), 1, m->I, 0, 0);
      expect_tensor(want, LAYER(l, "mlp.down_proj.bias"), 1, m->H, 0, 0);
    }
  }
  return want;
}

/* Name -> "[shape]" of what one vLLM rank holds (docs/vllm.md §10's table): the
 * sharded-state format adds the attention scale buffers (§6), the kernel format holds
 * parameters only (§7); a tied LM head is kept as lm_head.weight (§3). */
static GHashTable *
rank_tensors(const Model *m, guint tp, gboolean kernel)
{
  GHashTable *want = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
  guint64 vp = (m->V + 63) / 64 * 64, kvl = tp >= m->nkv ? 1 : m->nkv / tp;
  guint64 qkv = (m->nh / tp + 2 * kvl) * m->hd;
  static const char *const scales[] = {"_k_scale", "_v_scale", "_q_scale", "_prob_scale"};

  expect_tensor(want, g_strdup("lm_head.weight"), 2, vp / tp, m->H, 0);
  if (!m->tied)
    expect_tensor(want, g_strdup("model.embed_tokens.weight"), 2, vp / tp, m->H, 0);
  expect_tensor(want, g_strdup("model.norm.weight"), 1, m->H, 0, 0);
  for (guint64 l = 0; l < m->L; l++) {
    expect_tensor(want, LAYER(l, "input_layernorm.weight"), 1, m->H, 0, 0);
    expect_tensor(want, LAYER(l, "post_attention_layernorm.weight"), 1, m->H, 0, 0);
    expect_tensor(want, LAYER(l, "self_attn.qkv_proj.weight"), 2, qkv, m->H, 0);
    expect_tensor(want, LAYER(l, "self_attn.o_proj.weight"), 2, m->H, m->nh * m->hd / tp, 0);
    expect_tensor(want, LAYER(l, "mlp.gate_up_proj.weight"), 2, 2 * m->I / tp, m->H, 0);
    expect_tensor(want, LAYER(l, "mlp.down_proj.weight"), 2, m->H, m->I / tp, 0);
    if (m->qkv_bias)
      expect_tensor(want, LAYER(l, "self_attn.qkv_proj.bias"), 1, qkv, 0, 0);
    if (m->o_bias)
      expect_tensor(want, LAYER(l, "self_attn.o_proj.bias"), 1, m->H, 0, 0);
    if (m->mlp_bias) {
      expect_tensor(want, LAYER(l, "mlp.gate_up_proj.bias"), 1, 2 * m->I / tp, 0, 0);
      expect_tensor(want, LAYER(l, "mlp.down_proj.bias"), 1, m->H, 0, 0);
    }
    for (guint i = 0; !kernel && i < G_N_ELEMENTS(scales); i++) {
      char *name = g_strdup_printf("model.layers.%" G_GUINT64_FORMAT ".self_attn.attn.%s", l,
                                   scales[i]);
      expect_tensor(want, name, 0, 0, 0, 0);
    }
  }
  return want;
}

/* The rank's files hold exactly the names and shapes of @want. */
static void
assert_rank_keys(const RankFiles *rf, guint rank, GHashTable *want)
{
  guint n = 0;

  for (guint f = 0; f < rf->files->len; f++) {
    const WsyncCheckpoint *ck = rf->files->pdata[f];
    for (guint i = 0; i < wsync_checkpoint_n_tensors(ck); i++, n++) {
      const WsyncTensor *t = wsync_checkpoint_tensor(ck, i);
      const char *shape = g_hash_table_lookup(want, t->name);
      g_autofree char *have = shape_text(t);
      if (shape == NULL)
        g_error("rank %u: unexpected tensor %s %s", rank, t->name, have);
      if (strcmp(shape, have) != 0)
        g_error("rank %u: %s is %s, want %s", rank, t->name, have, shape);
    }
  }
  g_assert_cmpuint(n, ==, g_hash_table_size(want));
}

/* ------------------------------------------------------------------ one rank, element by element */

/* The attention scale buffers: F32 scalars of 1.0 (docs/vllm.md §6). */
static void
check_scales(RankCheck *c, guint64 l)
{
  static const char *const scales[] = {"_k_scale", "_v_scale", "_q_scale", "_prob_scale"};
  static const guint8 one[4] = {0x00, 0x00, 0x80, 0x3f}; /* 1.0f, little-endian */

  for (guint i = 0; i < G_N_ELEMENTS(scales); i++) {
    g_autofree char *name = g_strdup_printf("model.layers.%" G_GUINT64_FORMAT ".self_attn.attn.%s",
                                            l, scales[i]);
    const WsyncTensor *out = output(c, name, WSYNC_DTYPE_F32, 0, NULL);
    g_assert_cmpint(memcmp(out->data, one, 4), ==, 0);
  }
}

static void
check_layer(RankCheck *c, const Model *m, guint64 l, gboolean kernel)
{
  g_autofree char *attn = LAYER(l, "self_attn");
  g_autofree char *mlp = LAYER(l, "mlp");
  g_autofree char *in_norm = LAYER(l, "input_layernorm.weight");
  g_autofree char *post_norm = LAYER(l, "post_attention_layernorm.weight");
  g_autofree char *o_proj = LAYER(l, "self_attn.o_proj.weight");
  g_autofree char *o_bias = LAYER(l, "self_attn.o_proj.bias");
  g_autofree char *down = LAYER(l, "mlp.down_proj.weight");
  g_autofree char *down_bias = LAYER(l, "mlp.down_proj.bias");

  check_replicated_as(c, in_norm, in_norm);
  check_replicated_as(c, post_norm, post_norm);
  check_qkv(c, attn, "weight", m->nh, m->nkv, m->hd);
  check_row(c, o_proj);
  check_gate_up(c, mlp, "weight", m->I);
  check_row(c, down);
  /* biases are split like their weights' rows; a row-parallel layer's bias is whole
   * (docs/vllm.md §2, §10) */
  if (m->qkv_bias)
    check_qkv(c, attn, "bias", m->nh, m->nkv, m->hd);
  if (m->o_bias)
    check_replicated_as(c, o_bias, o_bias);
  if (m->mlp_bias) {
    check_gate_up(c, mlp, "bias", m->I);
    check_replicated_as(c, down_bias, down_bias);
  }
  if (!kernel)
    check_scales(c, l);
}

static void
check_rank(const Model *m, WsyncCheckpoint *in, const RankFiles *rf, guint tp, guint rank,
           const char *format)
{
  gboolean kernel = strcmp(format, "kernel") == 0;
  RankCheck c = {.in = in, .rf = rf, .tp = tp, .ep = 1, .rank = rank, .t = rank};
  g_autoptr(GHashTable) want = rank_tensors(m, tp, kernel);
  g_autofree char *tp_text = g_strdup_printf("%u", tp);
  g_autofree char *rank_text = g_strdup_printf("%u", rank);

  assert_metadata(rf, "wsync.target", "vllm");
  assert_metadata(rf, "wsync.format", format);
  assert_metadata(rf, "wsync.tp", tp_text);
  assert_metadata(rf, "wsync.ep", "1");
  assert_metadata(rf, "wsync.rank", rank_text);
  assert_metadata(rf, "wsync.world", tp_text);
  assert_rank_keys(rf, rank, want);
  /* tied: the embedding is kept under lm_head.weight, the smaller name (docs/vllm.md §3) */
  if (m->tied) {
    check_vocab_as(&c, "model.embed_tokens.weight", "lm_head.weight", m->V);
  } else {
    check_vocab_as(&c, "model.embed_tokens.weight", "model.embed_tokens.weight", m->V);
    check_vocab_as(&c, "lm_head.weight", "lm_head.weight", m->V);
  }
  check_replicated_as(&c, "model.norm.weight", "model.norm.weight");
  for (guint64 l = 0; l < m->L; l++)
    check_layer(&c, m, l, kernel);
  /* every tensor of the rank was checked, element by element */
  g_assert_cmpuint(rank_n_tensors(rf), ==, c.checked);
}

/* ------------------------------------------------------------------ the tests */

/* synth writes the published layout: exactly the tensors of docs/hf-checkpoints.md §5
 * with the config's defaults applied, BF16, an index, config.json as given. */
static void
test_synth(gconstpointer data)
{
  const char *config = data;
  Model m = read_model(config);
  g_autoptr(GHashTable) want = hf_tensors(&m);
  const char *dir = synth(config);
  g_autofree char *copied = g_build_filename(dir, "config.json", NULL);
  g_autoptr(JsonObject) written = load_json(copied);
  g_autoptr(JsonNode) a = json_node_init_object(json_node_alloc(), m.root);
  g_autoptr(JsonNode) b = json_node_init_object(json_node_alloc(), written);

  assert_layout(dir, want);
  g_assert_true(json_node_equal(a, b));
  model_clear(&m);
}

typedef struct {
  const char *config;
  guint tp;
  const char *format;
} Case;

/* hf -> vllm (tp, format): every rank's key set, shapes, dtypes, metadata and every
 * element; then the rank files -> hf is the source, bit for bit. */
static void
test_vllm(gconstpointer data)
{
  const Case *k = data;
  const char *src = synth(k->config);
  g_autofree char *ranks_dir = new_path("vllm");
  g_autofree char *back = new_path("back");
  g_autofree char *tp = g_strdup_printf("%u", k->tp);
  g_autoptr(WsyncCheckpoint) in = open_ck(src);
  Model m = read_model(k->config);
  RankFiles ranks[8];
  TestRun r;

  r = run_wsync("convert", src, ranks_dir, "--target", "vllm", "--format", k->format, "--tp",
                tp, NULL);
  expect_status(&r, 0, "convert to vllm");
  g_assert_cmpuint(open_ranks_of(ranks_dir, k->format, ranks, G_N_ELEMENTS(ranks)), ==, k->tp);
  for (guint rank = 0; rank < k->tp; rank++)
    check_rank(&m, in, &ranks[rank], k->tp, rank, k->format);
  for (guint i = 0; i < G_N_ELEMENTS(ranks); i++)
    rank_files_clear(&ranks[i]);
  r = run_wsync("convert", ranks_dir, back, "--target", "hf", NULL);
  expect_status(&r, 0, "convert back to hf");
  r = run_wsync("verify", src, back, NULL);
  expect_status(&r, 0, "verify");
  assert_same_checkpoints(src, back);
  model_clear(&m);
}

/* Without num_key_value_heads and with "head_dim": null, LlamaConfig's defaults apply:
 * one KV head per query head, head_dim = hidden_size / num_attention_heads. */
static void
test_defaults(void)
{
  Model m = read_model(UNTIED);
  g_autofree char *config = new_path("mha-config.json");
  g_autofree char *dir = new_path("mha");
  g_autoptr(GHashTable) want = NULL;
  TestRun r;

  json_object_remove_member(m.root, "num_key_value_heads");
  json_object_set_null_member(m.root, "head_dim");
  write_config(m.root, config);
  r = run_wsync("synth", "--config", config, dir, NULL);
  expect_status(&r, 0, "synth without num_key_value_heads");
  m.nkv = m.nh;
  want = hf_tensors(&m);
  g_assert_cmpstr(g_hash_table_lookup(want, "model.layers.0.self_attn.k_proj.weight"), ==,
                  "[64, 64]");
  assert_layout(dir, want);
  model_clear(&m);
}

/* A config without tie_word_embeddings is untied: LlamaConfig defaults it to false in
 * Transformers 4 and 5, and vLLM's LlamaForCausalLM reads that same config object's field
 * (docs/hf-checkpoints.md §3, §5).  tiny-llama3.json (the vLLM cases above) already has
 * no such key, as the Llama-3.1-8B configs; here the tied config loses it: synth writes
 * exactly the untied tensor set, lm_head.weight included. */
static void
test_tie_absent(void)
{
  Model m = read_model(TIED);
  g_autofree char *config = new_path("untied-config.json");
  g_autofree char *dir = new_path("untied");
  g_autoptr(GHashTable) want = NULL;
  TestRun r;

  g_assert_true(m.tied);
  json_object_remove_member(m.root, "tie_word_embeddings");
  write_config(m.root, config);
  r = run_wsync("synth", "--config", config, dir, NULL);
  expect_status(&r, 0, "synth without tie_word_embeddings");
  m.tied = FALSE;
  want = hf_tensors(&m);
  g_assert_true(g_hash_table_contains(want, "lm_head.weight"));
  assert_layout(dir, want);
  model_clear(&m);
}

/* Converted Llama checkpoints may carry the RoPE buffers `rotary_emb.inv_freq`,
 * `cos_cached` and `sin_cached`; vLLM skips them (docs/vllm.md §10), and so do the
 * plugin's named drop rules: the output is the same as without them. */
static void
test_rotary_buffers_dropped(void)
{
  static const char *const names[] = {"model.layers.0.self_attn.rotary_emb.inv_freq",
                                      "model.layers.0.self_attn.rotary_emb.cos_cached",
                                      "model.layers.1.self_attn.rotary_emb.sin_cached"};
  const char *src = synth(UNTIED);
  g_autofree char *dir = new_path("rotary");
  g_autofree char *out = new_path("rotary-back");
  g_autoptr(GString) header = g_string_new("{");
  g_autoptr(GString) file = g_string_new(NULL);
  GError *error = NULL;
  TestRun r;

  /* the checkpoint without its index (an index lists the files that count), plus one
   * file holding three F32 [4] buffers */
  g_assert_cmpint(g_mkdir(dir, 0755), ==, 0);
  for (const char *const *f = (const char *const[]){"config.json",
                                                     "model-00001-of-00001.safetensors", NULL};
       *f != NULL; f++) {
    g_autofree char *from = g_build_filename(src, *f, NULL);
    g_autofree char *to = g_build_filename(dir, *f, NULL);
    test_copy(from, to);
  }
  for (guint i = 0; i < G_N_ELEMENTS(names); i++)
    g_string_append_printf(header, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[4],"
                           "\"data_offsets\":[%u,%u]}",
                           i ? "," : "", names[i], 16 * i, 16 * (i + 1));
  g_string_append_c(header, '}');
  while (header->len % 8 != 0)
    g_string_append_c(header, ' ');
  guint64 len = GUINT64_TO_LE(header->len);
  g_string_append_len(file, (const char *)&len, 8);
  g_string_append_len(file, header->str, header->len);
  for (guint i = 0; i < 16 * G_N_ELEMENTS(names); i++)
    g_string_append_c(file, '\0');
  {
    g_autofree char *path = g_build_filename(dir, "rope.safetensors", NULL);
    g_assert_true(g_file_set_contents(path, file->str, (gssize)file->len, &error));
    g_assert_no_error(error);
  }

  r = run_wsync("plan", dir, "--target", "vllm", "--tp", "2", NULL);
  test_assert_has(r.out, "dropped by rule rotary-inv-freq");
  test_assert_has(r.out, "model.layers.0.self_attn.rotary_emb.cos_cached dropped by rule "
                         "rotary-cache");
  test_assert_has(r.out, "model.layers.1.self_attn.rotary_emb.sin_cached dropped by rule "
                         "rotary-cache");
  expect_status(&r, 0, "plan with the RoPE buffers");
  r = run_wsync("convert", dir, out, "--target", "hf", NULL);
  expect_status(&r, 0, "convert with the RoPE buffers");
  assert_same_checkpoints(src, out);
}

/* Writes @m's config with @key removed (or set to @value) to a new file. */
static char *
config_variant(const char *config, const char *key, JsonNode *value)
{
  Model m = read_model(config);
  char *path = new_path("bad-config.json");

  if (value != NULL)
    json_object_set_member(m.root, key, value);
  else
    json_object_remove_member(m.root, key);
  write_config(m.root, path);
  model_clear(&m);
  return path;
}

/* A config that lacks a field deciding a shape, gives a flag that is not a boolean, or
 * KV heads that do not divide the query heads: exit 3, one line naming the field, and
 * nothing written; for a checkpoint of that config, plan and convert refuse the same
 * way. */
static void
test_refused(void)
{
  static const struct {
    const char *key;
    const char *message;
    gint64 value; /* set to this integer, 0: removed */
  } cases[] = {
      {"intermediate_size", "config.json: field \"intermediate_size\" is missing\n", 0},
      {"num_attention_heads", "config.json: field \"num_attention_heads\" is missing\n", 0},
      {"attention_bias", "config.json: field \"attention_bias\" must be true or false, not 1\n",
       1},
      {"bias", "config.json: field \"bias\" must be true or false, not 1\n", 1},
      {"qkv_bias", "config.json: field \"qkv_bias\" must be true or false, not 1\n", 1},
      /* head_dim absent: hidden_size / num_attention_heads, which must divide */
      {"num_attention_heads",
       "config.json: field \"head_dim\" is missing and hidden_size 64 is not a multiple of "
       "num_attention_heads 7\n",
       7},
      /* each KV head serves a whole number of query heads: Transformers' repeat_kv and
       * vLLM's Attention (`assert num_heads % num_kv_heads == 0`) need it
       * (docs/hf-checkpoints.md §5 "GQA", docs/vllm.md §10) */
      {"num_key_value_heads",
       "config.json: field \"num_key_value_heads\" is 3, which does not divide "
       "num_attention_heads 8\n",
       3},
      {"num_key_value_heads",
       "config.json: field \"num_key_value_heads\" is 16, which does not divide "
       "num_attention_heads 8\n",
       16},
  };
  const char *src = synth(UNTIED);

  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    JsonNode *value =
        cases[i].value != 0 ? json_node_init_int(json_node_alloc(), cases[i].value) : NULL;
    g_autofree char *config = config_variant(UNTIED, cases[i].key, value);
    g_autofree char *out = new_path("refused");
    g_autofree char *ck = new_path("bad-checkpoint");
    g_autofree char *ck_config = g_build_filename(ck, "config.json", NULL);
    const char *what[] = {"synth", "plan", "convert"};

    /* the checkpoint: the good tensors under the bad config */
    g_assert_cmpint(g_mkdir(ck, 0755), ==, 0);
    {
      g_autoptr(GDir) d = g_dir_open(src, 0, NULL);
      const char *name;
      while ((name = g_dir_read_name(d)) != NULL) {
        g_autofree char *from = g_build_filename(src, name, NULL);
        g_autofree char *to = g_build_filename(ck, name, NULL);
        if (strcmp(name, "config.json") != 0)
          test_copy(from, to);
      }
    }
    test_copy(config, ck_config);
    for (guint w = 0; w < G_N_ELEMENTS(what); w++) {
      TestRun r = w == 0   ? run_wsync("synth", "--config", config, out, NULL)
                  : w == 1 ? run_wsync("plan", ck, "--target", "vllm", "--tp", "2", NULL)
                           : run_wsync("convert", ck, out, "--target", "vllm", "--tp", "2", NULL);
      if (r.status != 3)
        g_error("%s with %s: exit %d, expected 3: %s", what[w], cases[i].key, r.status, r.err);
      test_assert_has(r.err, cases[i].message);
      /* one line */
      g_assert_true(strchr(r.err, '\n') == r.err + strlen(r.err) - 1);
      g_assert_false(g_file_test(out, G_FILE_TEST_EXISTS));
      test_run_clear(&r);
    }
  }
}

/* hidden_act other than "silu": Transformers' LlamaMLP runs it (ACT2FN), so synth and the
 * hf target take it; vLLM's LlamaMLP raises "Unsupported activation" (llama.py:110-113 @
 * df1376907b16, docs/vllm.md §2 "Activation"), so plan and convert to vllm refuse it:
 * exit 3, one line naming config.json, the field, the value and "silu", nothing written.
 * The old tree wrote rank files vLLM would not start from. */
static void
test_hidden_act(void)
{
  g_autofree char *config =
      config_variant(UNTIED, "hidden_act", json_node_init_string(json_node_alloc(), "gelu"));
  g_autofree char *ck = new_path("gelu");
  g_autofree char *ck_config = g_build_filename(ck, "config.json", NULL);
  g_autofree char *hf = new_path("gelu-hf");
  g_autofree char *ranks = new_path("gelu-vllm");
  TestRun r;

  r = run_wsync("synth", "--config", config, ck, NULL);
  expect_status(&r, 0, "synth with hidden_act gelu");
  r = run_wsync("convert", ck, hf, "--target", "hf", NULL);
  expect_status(&r, 0, "convert to hf with hidden_act gelu");
  for (guint kernel = 0; kernel < 2; kernel++) {
    r = kernel ? run_wsync("convert", ck, ranks, "--target", "vllm", "--tp", "2", "--format",
                           "kernel", NULL)
               : run_wsync("plan", ck, "--target", "vllm", "--tp", "2", NULL);
    if (r.status != 3)
      g_error("hidden_act gelu to vllm: exit %d, expected 3: %s", r.status, r.err);
    test_assert_has(r.err, "config.json: field \"hidden_act\" is \"gelu\", but vLLM's "
                           "LlamaForCausalLM accepts only \"silu\": its MLP, LlamaMLP, "
                           "raises \"Unsupported activation\" "
                           "(vllm/model_executor/models/llama.py:110-113): vLLM would not "
                           "start from these files\n");
    g_assert_true(strchr(r.err, '\n') == r.err + strlen(r.err) - 1);
    g_assert_false(g_file_test(ranks, G_FILE_TEST_EXISTS));
    test_run_clear(&r);
  }
  /* "silu" itself, as the published configs say it, converts */
  g_autofree char *silu =
      config_variant(UNTIED, "hidden_act", json_node_init_string(json_node_alloc(), "silu"));
  test_copy(silu, ck_config);
  r = run_wsync("plan", ck, "--target", "vllm", "--tp", "2", NULL);
  expect_status(&r, 0, "plan with hidden_act silu");
}

/* ------------------------------------------------------------------ architectures */

/* A copy of @src (a flat directory) whose config.json is @config. */
static char *
checkpoint_with_config(const char *src, const char *config)
{
  char *ck = new_path("arch-checkpoint");
  g_autofree char *ck_config = g_build_filename(ck, "config.json", NULL);
  g_autoptr(GDir) d = g_dir_open(src, 0, NULL);
  const char *name;

  g_assert_cmpint(g_mkdir(ck, 0755), ==, 0);
  while ((name = g_dir_read_name(d)) != NULL) {
    g_autofree char *from = g_build_filename(src, name, NULL);
    g_autofree char *to = g_build_filename(ck, name, NULL);
    if (strcmp(name, "config.json") != 0)
      test_copy(from, to);
  }
  test_copy(config, ck_config);
  return ck;
}

/* @a and @b hold the same file names, and every file but config.json byte for byte. */
static void
assert_same_files(const char *a, const char *b)
{
  g_autoptr(GDir) da = g_dir_open(a, 0, NULL);
  g_autoptr(GDir) db = g_dir_open(b, 0, NULL);
  guint n_a = 0, n_b = 0;
  const char *name;

  if (da == NULL || db == NULL)
    g_error("%s or %s is not a directory", a, b);
  while ((name = g_dir_read_name(da)) != NULL) {
    g_autofree char *pa = g_build_filename(a, name, NULL);
    g_autofree char *pb = g_build_filename(b, name, NULL);
    g_autofree char *ca = NULL, *cb = NULL;
    gsize la = 0, lb = 0;
    n_a++;
    if (g_file_test(pa, G_FILE_TEST_IS_DIR)) {
      assert_same_files(pa, pb);
      continue;
    }
    if (!g_file_get_contents(pb, &cb, &lb, NULL))
      g_error("%s has %s, %s has not", a, name, b);
    if (strcmp(name, "config.json") == 0)
      continue;
    g_assert_true(g_file_get_contents(pa, &ca, &la, NULL));
    if (la != lb || memcmp(ca, cb, la) != 0)
      g_error("%s and %s differ", pa, pb);
  }
  while (g_dir_read_name(db) != NULL)
    n_b++;
  g_assert_cmpuint(n_a, ==, n_b);
}

/* The refusal of a llama config whose architectures[0] is @shown (as printed). */
static char *
llama_refusal(const char *shown)
{
  return g_strdup_printf("field \"architectures\" begins with %s, but model_type \"llama\" is "
                         "supported only as \"LlamaForCausalLM\", or as its alias "
                         "\"LLaMAForCausalLM\"\n",
                         shown);
}

/* A llama config whose architectures[0] names a class the plugin does not describe: a
 * classification head of other names (LlamaForSequenceClassification,
 * LlamaForTokenClassification: score.weight, no lm_head), vLLM's text-only Qwen3.5
 * classes (registry.py:208-209 @ df1376907b16), vLLM's MistralForCausalLM (another class,
 * mistral.py:230), or a made-up name.  The old tree described them all as
 * LlamaForCausalLM's names and wrote the files, exit 0 (then the vllm target keyed its
 * rules by the other name).  Now synth, plan and convert exit 3 with one line naming
 * config.json's path, the field, the class and the classes described; nothing written.
 * `architectures` that is not a list of names is refused the same way. */
static void
test_architecture_refused(void)
{
  static const struct {
    const char *value; /* JSON */
    const char *message;
  } cases[] = {
      {"[\"LlamaForSequenceClassification\"]", NULL},
      {"[\"LlamaForTokenClassification\"]", NULL},
      {"[\"Qwen3_5ForCausalLM\"]", NULL},
      {"[\"Qwen3_5MoeForCausalLM\"]", NULL},
      {"[\"MistralForCausalLM\", \"LlamaForCausalLM\"]", NULL},
      {"[\"Made\\nUp\"]", NULL},
      {"[5]", "field \"architectures\" begins with 5, not a class name\n"},
      {"\"LlamaForCausalLM\"",
       "field \"architectures\" is \"LlamaForCausalLM\", not a list of class names\n"},
  };
  const char *src = synth(UNTIED);

  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_autoptr(JsonNode) value = json_from_string(cases[i].value, NULL);
    g_autofree char *config = config_variant(UNTIED, "architectures", json_node_copy(value));
    g_autofree char *ck = checkpoint_with_config(src, config);
    g_autofree char *ck_config = g_build_filename(ck, "config.json", NULL);
    g_autofree char *out = new_path("arch-refused");
    g_autofree char *shown = NULL;
    g_autofree char *message = NULL;
    g_autofree char *line = NULL;

    if (cases[i].message == NULL) {
      JsonNode *first = json_array_get_element(json_node_get_array(value), 0);
      g_autofree char *escaped = g_strescape(json_node_get_string(first), NULL);
      shown = g_strdup_printf("\"%s\"", escaped);
      message = llama_refusal(shown);
    } else
      message = g_strdup(cases[i].message);
    g_test_message("architectures %s", cases[i].value);
    for (guint w = 0; w < 4; w++) {
      TestRun r = w == 0   ? run_wsync("synth", "--config", config, out, NULL)
                  : w == 1 ? run_wsync("plan", ck, "--target", "vllm", "--tp", "2", NULL)
                  : w == 2 ? run_wsync("convert", ck, out, "--target", "vllm", "--tp", "2",
                                       "--format", "kernel", NULL)
                           : run_wsync("convert", ck, out, "--target", "hf", NULL);
      if (r.status != 3)
        g_error("%s (%u): exit %d, expected 3: %s", cases[i].value, w, r.status, r.err);
      g_free(line);
      line = g_strdup_printf("wsync: %s: %s", w == 0 ? config : ck_config, message);
      g_assert_cmpstr(r.err, ==, line);
      g_assert_false(g_file_test(out, G_FILE_TEST_EXISTS));
      test_run_clear(&r);
    }
  }
}

/* A long value of `architectures` is shown clipped, as the other fields' values are
 * (model.c not_a()): a class name of more than 64 characters as its first 60 and its
 * length, a long value that is not a list as its first 60 bytes of JSON.  The old tree
 * quoted them whole: a config naming a class of a megabyte got a refusal line of a
 * megabyte on the terminal. */
static void
test_architecture_long(void)
{
  const char *src = synth(UNTIED);
  g_autofree char *long_name = g_strnfill(5000, 'A');
  g_autofree char *long_text = g_strnfill(100, 'x');
  g_autofree char *head = g_strnfill(60, 'A');
  g_autofree char *text_head = g_strnfill(54, 'x');
  g_autofree char *shown = g_strdup_printf("\"%s...\" (5000 characters)", head);
  JsonArray *list = json_array_new();
  JsonObject *object = json_object_new();
  /* two-byte characters from an odd offset: byte 60 falls inside one, and the cut goes
   * back to the character before (before: "\xc3..." on the terminal, and in Python a
   * UnicodeDecodeError in place of wsync.Error) */
  JsonObject *accented = json_object_new();
  GString *e_acute = g_string_new(NULL);
  for (int i = 0; i < 100; i++)
    g_string_append(e_acute, "\u00e9");
  GString *e_head = g_string_new(NULL);
  for (int i = 0; i < 26; i++)
    g_string_append(e_head, "\u00e9");
  struct {
    JsonNode *value;
    char *message;
  } cases[] = {
      {json_node_init_array(json_node_alloc(), list), llama_refusal(shown)},
      {json_node_init_object(json_node_alloc(), object),
       g_strdup_printf("field \"architectures\" is {\"k\":\"%s..., not a list of class names\n",
                       text_head)},
      {json_node_init_object(json_node_alloc(), accented),
       g_strdup_printf("field \"architectures\" is {\"kk\":\"%s..., not a list of class names\n",
                       e_head->str)},
  };

  json_array_add_string_element(list, long_name);
  json_object_set_string_member(object, "k", long_text);
  json_object_set_string_member(accented, "kk", e_acute->str);
  g_string_free(e_acute, TRUE);
  g_string_free(e_head, TRUE);
  json_array_unref(list);
  json_object_unref(object);
  json_object_unref(accented);
  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_autofree char *config = config_variant(UNTIED, "architectures", cases[i].value);
    g_autofree char *ck = checkpoint_with_config(src, config);
    g_autofree char *ck_config = g_build_filename(ck, "config.json", NULL);
    g_autofree char *out = new_path("arch-long");
    for (guint w = 0; w < 2; w++) {
      TestRun r = w == 0 ? run_wsync("synth", "--config", config, out, NULL)
                         : run_wsync("plan", ck, "--target", "vllm", "--tp", "2", NULL);
      g_autofree char *line =
          g_strdup_printf("wsync: %s: %s", w == 0 ? config : ck_config, cases[i].message);
      g_assert_cmpint(r.status, ==, 3);
      g_assert_cmpstr(r.err, ==, line);
      g_assert_false(g_file_test(out, G_FILE_TEST_EXISTS));
      test_run_clear(&r);
    }
    g_free(cases[i].message);
  }
}

/* LLaMAForCausalLM, the name of the decapoda-research/llama-* conversions, which vLLM
 * builds as its LlamaForCausalLM (registry.py:155-156 @ df1376907b16), and a config with
 * no class (architectures absent, null or []) are described as LlamaForCausalLM: the same
 * rank files, byte for byte, as the canonical name, in both formats, and the same hf
 * output.  The vllm target applies LlamaForCausalLM's rules to the alias too: hidden_act
 * "gelu" is refused naming vLLM's LlamaForCausalLM (the old tree, keyed by
 * "LLaMAForCausalLM", wrote the files, exit 0). */
static void
test_architecture_alias(void)
{
  static const char *const values[] = {"[\"LLaMAForCausalLM\"]", NULL, "null", "[]"};
  const char *src = synth(UNTIED);
  g_autofree char *canonical = new_path("arch-canonical");
  TestRun r;

  g_assert_cmpint(g_mkdir(canonical, 0755), ==, 0);
  for (guint f = 0; f < 3; f++) {
    g_autofree char *dst = g_strdup_printf("%s/%u", canonical, f);
    r = f == 2 ? run_wsync("convert", src, dst, "--target", "hf", NULL)
               : run_wsync("convert", src, dst, "--target", "vllm", "--tp", "2", "--format",
                           f == 0 ? "sharded-state" : "kernel", NULL);
    expect_status(&r, 0, "convert the canonical name");
  }
  for (guint i = 0; i < G_N_ELEMENTS(values); i++) {
    JsonNode *value = values[i] != NULL ? json_from_string(values[i], NULL) : NULL;
    g_autofree char *config = config_variant(UNTIED, "architectures", value);
    g_autofree char *ck = checkpoint_with_config(src, config);
    g_autofree char *made = new_path("arch-alias-synth");
    g_autofree char *outs = new_path("arch-alias");

    g_test_message("architectures %s", values[i] != NULL ? values[i] : "absent");
    r = run_wsync("synth", "--config", config, made, "--pattern", "index", NULL);
    expect_status(&r, 0, "synth");
    assert_same_files(src, made);
    g_assert_cmpint(g_mkdir(outs, 0755), ==, 0);
    for (guint f = 0; f < 3; f++) {
      g_autofree char *dst = g_strdup_printf("%s/%u", outs, f);
      r = f == 2 ? run_wsync("convert", ck, dst, "--target", "hf", NULL)
                 : run_wsync("convert", ck, dst, "--target", "vllm", "--tp", "2", "--format",
                             f == 0 ? "sharded-state" : "kernel", NULL);
      expect_status(&r, 0, "convert");
    }
    assert_same_files(canonical, outs);
  }

  /* the alias gets LlamaForCausalLM's rules in the vllm target */
  g_autofree char *gelu = new_path("alias-gelu.json");
  {
    Model m = read_model(UNTIED);
    JsonArray *list = json_array_new();
    json_array_add_string_element(list, "LLaMAForCausalLM");
    json_object_set_string_member(m.root, "hidden_act", "gelu");
    json_object_set_array_member(m.root, "architectures", list);
    write_config(m.root, gelu);
    model_clear(&m);
  }
  g_autofree char *ck = checkpoint_with_config(src, gelu);
  g_autofree char *ranks = new_path("arch-alias-gelu");
  r = run_wsync("convert", ck, ranks, "--target", "vllm", "--tp", "2", NULL);
  if (r.status != 3)
    g_error("LLaMAForCausalLM with gelu: exit %d, expected 3: %s", r.status, r.err);
  /* naming config.json by its path (wsync_model_get_config_name()); the old tree said
   * "config.json" alone */
  g_autofree char *want = g_strdup_printf("wsync: %s/config.json: field \"hidden_act\" is "
                                          "\"gelu\", but vLLM's LlamaForCausalLM accepts only "
                                          "\"silu\"",
                                          ck);
  test_assert_has(r.err, want);
  g_assert_false(g_file_test(ranks, G_FILE_TEST_EXISTS));
  test_run_clear(&r);
}

int
main(int argc, char **argv)
{
  static const char *const configs[] = {UNTIED, TIED, BIAS_KEY, QKV_BIAS, O_BIAS,
                                         QKV_BIAS_NULL};
  static const char *const formats[] = {"sharded-state", "kernel"};
  static const guint tps[] = {1, 2, 4, 8};
  static Case cases[G_N_ELEMENTS(configs) * G_N_ELEMENTS(formats) * G_N_ELEMENTS(tps)];
  guint n = 0;
  int status;

  g_test_init(&argc, &argv, NULL);
  plugin_dir = test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR");
  work_dir = test_tmpdir();
  conf_dir = g_build_filename(work_dir, "conf", NULL);
  g_assert_cmpint(g_mkdir(conf_dir, 0755), ==, 0);
  g_free(test_write(conf_dir, "10-test.conf",
                    "plugin \"hf\" {}\nplugin \"llama\" {}\nplugin \"vllm\" {}\n"));
  synth_dirs = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);

  for (guint i = 0; i < G_N_ELEMENTS(configs); i++) {
    g_autofree char *path = g_strdup_printf("/llama/synth/%s", configs[i]);
    g_test_add_data_func(path, configs[i], test_synth);
  }
  g_test_add_func("/llama/config/defaults", test_defaults);
  g_test_add_func("/llama/config/tie-absent", test_tie_absent);
  g_test_add_func("/llama/config/refused", test_refused);
  g_test_add_func("/llama/config/hidden-act", test_hidden_act);
  g_test_add_func("/llama/rotary-buffers-dropped", test_rotary_buffers_dropped);
  g_test_add_func("/llama/config/architecture-refused", test_architecture_refused);
  g_test_add_func("/llama/config/architecture-alias", test_architecture_alias);
  g_test_add_func("/llama/config/architecture-long", test_architecture_long);
  for (guint i = 0; i < G_N_ELEMENTS(configs); i++)
    for (guint f = 0; f < G_N_ELEMENTS(formats); f++)
      for (guint t = 0; t < G_N_ELEMENTS(tps); t++, n++) {
        g_autofree char *path =
            g_strdup_printf("/llama/vllm/%s/%s/tp%u", configs[i], formats[f], tps[t]);
        cases[n] = (Case){configs[i], tps[t], formats[f]};
        g_test_add_data_func(path, &cases[n], test_vllm);
      }

  status = g_test_run();
  test_rmtree(work_dir);
  g_free(work_dir);
  g_free(conf_dir);
  g_hash_table_unref(synth_dirs);
  return status;
}
