/* The qwen3_moe plugin through the wsync command (synth, convert, plan, verify).
 *
 * The checks here do not trust the engine: outputs are opened with
 * wsync_checkpoint_open() and their bytes are compared with the input tensors at the
 * positions the published layouts say (docs/hf-checkpoints.md §2 per-expert tensors,
 * §4 the Transformers 5 fused experts, gate rows first), and the expected names and
 * shapes are worked out here from config.json, independently of the plugin.
 */
#include <json-glib/json-glib.h>
#include <sys/wait.h>

#include <wsync/wsync.h>

#include "oracle.h"
#include "testutil.h"

/* The conf.d and plugin directory every run uses. */
static char *conf_dir;
static const char *plugin_dir;
static gboolean have_vllm;

/* ------------------------------------------------------------------ running wsync */

typedef TestRun Run;
/* the shared helpers of testutil.h under this file's short names */
#define assert_has test_assert_has
#define run_clear test_run_clear

/* Runs wsync with the conf.d @conf, this test's plugins and the arguments @first, @ap
 * (NULL-terminated), through testutil.h, so that make check-valgrind runs it under
 * memcheck too. */
static Run
run_wsync_va(const char *conf, const char *first, va_list ap)
{
  return test_run_in_va(conf, plugin_dir, first, ap);
}

/* Runs wsync with @args (NULL-terminated) and this test's conf.d and plugins. */
static Run
run_wsync(const char *first, ...)
{
  va_list ap;

  va_start(ap, first);
  Run r = run_wsync_va(conf_dir, first, ap);
  va_end(ap);
  return r;
}

/* Checks the exit status, showing what wsync said when it is not the expected one. */
static void
expect_status(Run *r, int status, const char *what)
{
  if (r->status != status)
    g_error("%s: exit %d, expected %d\nstdout: %s\nstderr: %s", what, r->status, status,
            r->out, r->err);
}

static char *
config_path(const char *name)
{
  return g_test_build_filename(G_TEST_DIST, "..", "configs", name, NULL);
}

/* wsync synth --config CONFIG DST [EXTRA...], which must succeed. */
static void
synth(const char *config, const char *dst, const char *extra1, const char *extra2)
{
  g_autofree char *path = config_path(config);
  Run r = run_wsync("synth", "--config", path, dst, "--seed", "7", extra1, extra2, NULL);

  expect_status(&r, 0, "synth");
  run_clear(&r);
}

/* wsync convert SRC DST --target TARGET, which must succeed. */
static void
convert(const char *src, const char *dst, const char *target)
{
  Run r = run_wsync("convert", src, dst, "--target", target, NULL);

  expect_status(&r, 0, target);
  run_clear(&r);
}

static void
expect_verify(const char *a, const char *b, int status)
{
  Run r = run_wsync("verify", a, b, NULL);

  expect_status(&r, status, "verify");
  run_clear(&r);
}

/* ------------------------------------------------------------------ the model, from config.json */

/* What the test needs to know of a config, read here without the plugin. */
typedef struct {
  JsonObject *root;
  guint64 hidden, heads, kv_heads, head_dim, vocab, layers, experts, moe_inter, inter;
  gboolean dense, tie;
  JsonArray *mlp_only;
} Model;

static guint64
int_member(JsonObject *obj, const char *key)
{
  return json_object_has_member(obj, key) ? (guint64)json_object_get_int_member(obj, key) : 0;
}

static JsonNode *
load_json(const char *path)
{
  g_autoptr(JsonParser) parser = json_parser_new();
  GError *error = NULL;

  json_parser_load_from_file(parser, path, &error);
  g_assert_no_error(error);
  return json_node_copy(json_parser_get_root(parser));
}

static Model
load_model(const char *config)
{
  g_autofree char *path = config_path(config);
  JsonNode *root = load_json(path);
  Model m = {0};

  m.root = json_object_ref(json_node_get_object(root));
  json_node_unref(root);
  m.hidden = int_member(m.root, "hidden_size");
  m.heads = int_member(m.root, "num_attention_heads");
  m.kv_heads = int_member(m.root, "num_key_value_heads");
  m.head_dim = int_member(m.root, "head_dim");
  m.vocab = int_member(m.root, "vocab_size");
  m.layers = int_member(m.root, "num_hidden_layers");
  m.experts = int_member(m.root, "num_experts");
  m.moe_inter = int_member(m.root, "moe_intermediate_size");
  m.inter = int_member(m.root, "intermediate_size");
  m.dense = g_strcmp0(json_object_get_string_member(m.root, "model_type"), "qwen3") == 0;
  m.tie = json_object_get_boolean_member_with_default(m.root, "tie_word_embeddings", FALSE);
  m.mlp_only = json_object_has_member(m.root, "mlp_only_layers")
                   ? json_object_get_array_member(m.root, "mlp_only_layers")
                   : NULL;
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

  json_generator_set_pretty(gen, TRUE);
  json_generator_set_root(gen, node);
  g_assert_true(json_generator_to_file(gen, path, &error));
  g_assert_no_error(error);
}

/* "model.layers.L.mlp.experts.SUFFIX" */
static char *
experts_name(guint64 l, const char *suffix)
{
  return g_strdup_printf("model.layers.%" G_GUINT64_FORMAT ".mlp.experts.%s", l, suffix);
}

/* "model.layers.L.mlp.experts.E.PROJ.weight" */
static char *
expert_name(guint64 l, guint64 e, const char *proj)
{
  return g_strdup_printf("model.layers.%" G_GUINT64_FORMAT ".mlp.experts.%" G_GUINT64_FORMAT
                         ".%s.weight",
                         l, e, proj);
}

/* The tiny configs use decoder_sparse_step 1. */
static gboolean
model_layer_is_moe(const Model *m, guint64 layer)
{
  if (m->dense)
    return FALSE;
  for (guint i = 0; m->mlp_only != NULL && i < json_array_get_length(m->mlp_only); i++)
    if ((guint64)json_array_get_int_element(m->mlp_only, i) == layer)
      return FALSE;
  return TRUE;
}

/* Name -> "[shape]" of every tensor of the Hugging Face layout (docs/hf-checkpoints.md
 * §2, §4); @fused_layers: a bit per layer whose experts are fused. */
static GHashTable *
expected_tensors(const Model *m, guint64 layers, guint fused_layers)
{
  GHashTable *want = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
  guint64 h = m->hidden, q = m->heads * m->head_dim, kv = m->kv_heads * m->head_dim;
  guint64 e = m->experts, i = m->moe_inter;

  expect_tensor(want, g_strdup("model.embed_tokens.weight"), 2, m->vocab, h, 0);
  expect_tensor(want, g_strdup("model.norm.weight"), 1, h, 0, 0);
  if (!m->tie)
    expect_tensor(want, g_strdup("lm_head.weight"), 2, m->vocab, h, 0);
  for (guint64 l = 0; l < layers; l++) {
#define P(s) g_strdup_printf("model.layers.%" G_GUINT64_FORMAT "." s, l)
    expect_tensor(want, P("input_layernorm.weight"), 1, h, 0, 0);
    expect_tensor(want, P("post_attention_layernorm.weight"), 1, h, 0, 0);
    expect_tensor(want, P("self_attn.q_proj.weight"), 2, q, h, 0);
    expect_tensor(want, P("self_attn.k_proj.weight"), 2, kv, h, 0);
    expect_tensor(want, P("self_attn.v_proj.weight"), 2, kv, h, 0);
    expect_tensor(want, P("self_attn.o_proj.weight"), 2, h, q, 0);
    expect_tensor(want, P("self_attn.q_norm.weight"), 1, m->head_dim, 0, 0);
    expect_tensor(want, P("self_attn.k_norm.weight"), 1, m->head_dim, 0, 0);
    if (!model_layer_is_moe(m, l)) {
      expect_tensor(want, P("mlp.gate_proj.weight"), 2, m->inter, h, 0);
      expect_tensor(want, P("mlp.up_proj.weight"), 2, m->inter, h, 0);
      expect_tensor(want, P("mlp.down_proj.weight"), 2, h, m->inter, 0);
      continue;
    }
    expect_tensor(want, P("mlp.gate.weight"), 2, e, h, 0);
    if (fused_layers & (1u << l)) {
      expect_tensor(want, P("mlp.experts.gate_up_proj"), 3, e, 2 * i, h);
      expect_tensor(want, P("mlp.experts.down_proj"), 3, e, h, i);
      continue;
    }
    for (guint64 x = 0; x < e; x++) {
      expect_tensor(want, expert_name(l, x, "gate_proj"), 2, i, h, 0);
      expect_tensor(want, expert_name(l, x, "up_proj"), 2, i, h, 0);
      expect_tensor(want, expert_name(l, x, "down_proj"), 2, h, i, 0);
    }
#undef P
  }
  return want;
}

static gsize
esize(const WsyncTensor *t)
{
  return wsync_dtype_bits(t->dtype) / 8;
}

/* Layer @l's experts: per-expert in @per, fused in @fused.  gate_up_proj[e, r, c] is
 * gate_proj(e)[r, c] for r < I and up_proj(e)[r - I, c] for r >= I; down_proj[e] is
 * down_proj(e) (docs/hf-checkpoints.md §4). */
static void
assert_fused_matches(const WsyncCheckpoint *per, const WsyncCheckpoint *fused, guint64 l,
                     const Model *m)
{
  g_autofree char *gu_name = experts_name(l, "gate_up_proj");
  g_autofree char *d_name = experts_name(l, "down_proj");
  const WsyncTensor *gu = lookup(fused, gu_name), *down = lookup(fused, d_name);
  guint64 i = m->moe_inter, h = m->hidden;
  gsize es = esize(gu), row = h * es;

  for (guint64 e = 0; e < m->experts; e++) {
    static const char *const halves[2] = {"gate_proj", "up_proj"};
    g_autofree char *d = expert_name(l, e, "down_proj");
    const WsyncTensor *de = lookup(per, d);

    for (guint half = 0; half < 2; half++) {
      g_autofree char *n = expert_name(l, e, halves[half]);
      const WsyncTensor *pe = lookup(per, n);

      g_assert_cmpint(pe->dtype, ==, gu->dtype);
      for (guint64 r = 0; r < i; r++) {
        const guint8 *want = pe->data + r * row;
        const guint8 *have = gu->data + ((e * 2 * i) + half * i + r) * row;
        if (memcmp(want, have, row) != 0)
          g_error("%s[%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT "] != %s[%" G_GUINT64_FORMAT "]",
                  gu_name, e, half * i + r, n, r);
      }
    }
    g_assert_cmpuint(de->nbytes, ==, h * i * es);
    if (memcmp(de->data, down->data + e * h * i * es, de->nbytes) != 0)
      g_error("%s[%" G_GUINT64_FORMAT "] != %s", d_name, e, d);
  }
}

/* Every tensor other than the experts is the same in both. */
static void
assert_same_non_experts(const WsyncCheckpoint *a, const WsyncCheckpoint *b)
{
  guint n = 0;

  for (guint i = 0; i < wsync_checkpoint_n_tensors(a); i++) {
    const WsyncTensor *ta = wsync_checkpoint_tensor(a, i);
    const WsyncTensor *tb;

    if (strstr(ta->name, ".mlp.experts.") != NULL)
      continue;
    tb = lookup(b, ta->name);
    g_assert_cmpuint(ta->nbytes, ==, tb->nbytes);
    g_assert_true(memcmp(ta->data, tb->data, ta->nbytes) == 0);
    n++;
  }
  g_assert_cmpuint(n, >, 0);
}

/* Different experts hold different bytes: otherwise the oracle above proves nothing. */
static void
assert_experts_differ(const WsyncCheckpoint *per)
{
  const WsyncTensor *a = lookup(per, "model.layers.0.mlp.experts.0.gate_proj.weight");
  const WsyncTensor *b = lookup(per, "model.layers.0.mlp.experts.1.gate_proj.weight");
  const WsyncTensor *c = lookup(per, "model.layers.0.mlp.experts.0.up_proj.weight");

  g_assert_true(memcmp(a->data, b->data, a->nbytes) != 0);
  g_assert_true(memcmp(a->data, c->data, a->nbytes) != 0);
}

/* ------------------------------------------------------------------ writing checkpoints by hand */

/* Writes DIR/model-00001-of-00001.safetensors holding @tensors (WsyncTensor*), its
 * index, and a copy of @config. */
static void
write_checkpoint(const char *dir, const char *config, GPtrArray *tensors)
{
  static const char file[] = "model-00001-of-00001.safetensors";
  g_autoptr(WsyncSafetensorsWriter) w = wsync_safetensors_writer_new();
  g_autoptr(GHashTable) map = g_hash_table_new(g_str_hash, g_str_equal);
  g_autofree char *path = g_build_filename(dir, file, NULL);
  g_autofree char *index = g_build_filename(dir, WSYNC_INDEX_NAME, NULL);
  g_autofree char *cfg = g_build_filename(dir, "config.json", NULL);
  GError *error = NULL;
  guint64 total = 0;

  g_assert_cmpint(g_mkdir_with_parents(dir, 0755), ==, 0);
  wsync_safetensors_writer_set_metadata(w, "format", "pt");
  for (guint i = 0; i < tensors->len; i++) {
    const WsyncTensor *t = tensors->pdata[i];
    g_assert_true(wsync_safetensors_writer_add(w, t->name, t->dtype, t->ndim, t->shape, &error));
    g_hash_table_insert(map, (gpointer)t->name, (gpointer)file);
    total += t->nbytes;
  }
  g_assert_true(wsync_safetensors_writer_begin(w, path, &error));
  for (guint i = 0; i < tensors->len; i++) {
    const WsyncTensor *t = tensors->pdata[i];
    guint8 *data = wsync_safetensors_writer_data(w, t->name, &error);
    g_assert_no_error(error);
    g_assert_cmpuint(wsync_safetensors_writer_tensor_nbytes(w, t->name), ==, t->nbytes);
    memcpy(data, t->data, t->nbytes);
  }
  g_assert_true(wsync_safetensors_writer_finish(w, &error));
  g_assert_true(wsync_index_write(index, total, map, &error));
  g_assert_no_error(error);
  test_copy(config, cfg);
}

/* Every tensor of @ck but @skip (nullable). */
static GPtrArray *
tensors_except(const WsyncCheckpoint *ck, const char *skip)
{
  GPtrArray *all = g_ptr_array_new();

  for (guint i = 0; i < wsync_checkpoint_n_tensors(ck); i++) {
    const WsyncTensor *t = wsync_checkpoint_tensor(ck, i);
    if (skip == NULL || strcmp(t->name, skip) != 0)
      g_ptr_array_add(all, (gpointer)t);
  }
  return all;
}

/* A new tensor called @name of @ndim axes, bytes taken from @like (which must be big
 * enough). */
static WsyncTensor *
tensor_like(const WsyncTensor *like, const char *name, guint ndim, guint64 d0, guint64 d1)
{
  WsyncTensor *t = g_new0(WsyncTensor, 1);

  *t = *like;
  t->name = name;
  t->ndim = ndim;
  t->shape[0] = d0;
  t->shape[1] = d1;
  t->numel = ndim == 1 ? d0 : d0 * d1;
  t->nbytes = t->numel * esize(like);
  g_assert_cmpuint(t->nbytes, <=, like->nbytes);
  return t;
}

/* ------------------------------------------------------------------ the tests */

typedef struct {
  char *dir; /* removed at the end */
} Fixture;

static void
fixture_setup(Fixture *f, gconstpointer data)
{
  (void)data;
  f->dir = test_tmpdir();
}

static void
fixture_teardown(Fixture *f, gconstpointer data)
{
  (void)data;
  test_rmtree(f->dir);
  g_free(f->dir);
}

static char *
sub(const Fixture *f, const char *name)
{
  return g_build_filename(f->dir, name, NULL);
}

/* synth writes the published Qwen3-MoE form: per-expert tensors, the names and shapes
 * of docs/hf-checkpoints.md §2, BF16, with an index and config.json. */
static void
test_synth_published_form(Fixture *f, gconstpointer data)
{
  g_autofree char *dst = sub(f, "synth");
  g_autofree char *one = sub(f, "one-layer");
  g_autofree char *copied = g_build_filename(dst, "config.json", NULL);
  g_autofree char *src_config = config_path("tiny-qwen3-moe.json");
  Model m = load_model("tiny-qwen3-moe.json");
  g_autoptr(GHashTable) want = expected_tensors(&m, m.layers, 0);
  g_autoptr(GHashTable) want_one = expected_tensors(&m, 1, 0);
  g_autoptr(JsonNode) a = NULL, b = NULL;

  (void)data;
  synth("tiny-qwen3-moe.json", dst, NULL, NULL);
  assert_layout(dst, want);
  /* 1 embedding + 2 layers * (8 + 1 router + 3 * 8 experts) + norm + lm_head */
  g_assert_cmpuint(g_hash_table_size(want), ==, 69);
  a = load_json(src_config);
  b = load_json(copied);
  g_assert_true(json_node_equal(a, b));
  {
    g_autoptr(WsyncCheckpoint) ck = open_ck(dst);
    assert_experts_differ(ck);
  }
  synth("tiny-qwen3-moe.json", one, "--layers", "1");
  assert_layout(one, want_one);
  model_clear(&m);
}

/* per-expert -> hf-fused -> hf-experts is the identity; hf of a fused input is the
 * published per-expert form again. */
static void
test_fused_round_trip(Fixture *f, gconstpointer pattern)
{
  g_autofree char *per = sub(f, "per");
  g_autofree char *fused = sub(f, "fused");
  g_autofree char *back = sub(f, "back");
  g_autofree char *as_is = sub(f, "as-is");
  Model m = load_model("tiny-qwen3-moe.json");
  g_autoptr(GHashTable) want = expected_tensors(&m, m.layers, 0x3);
  g_autoptr(GHashTable) want_per = expected_tensors(&m, m.layers, 0);

  synth("tiny-qwen3-moe.json", per, "--pattern", pattern);
  assert_layout(per, want_per);
  convert(per, fused, "hf-fused");
  assert_layout(fused, want);
  {
    g_autoptr(WsyncCheckpoint) a = open_ck(per);
    g_autoptr(WsyncCheckpoint) b = open_ck(fused);
    assert_experts_differ(a);
    for (guint64 l = 0; l < m.layers; l++)
      assert_fused_matches(a, b, l, &m);
    assert_same_non_experts(a, b);
  }
  convert(fused, back, "hf-experts");
  expect_verify(per, back, 0);
  assert_same_checkpoints(per, back);
  /* "hf" written is the published per-expert form, whatever the input's form: the
   * engine builds output layouts without the input's names (engine.h,
   * wsync_layout_input_has(): always FALSE when writing); only reading follows the
   * input. */
  convert(fused, as_is, "hf");
  assert_layout(as_is, want_per);
  expect_verify(per, as_is, 0);
  assert_same_checkpoints(per, as_is);
  /* and verify does see a difference between the two forms */
  expect_verify(per, fused, 1);
  model_clear(&m);
}

/* synth --fused-experts writes the Transformers 5 form; hf-experts expands it. */
static void
test_synth_fused(Fixture *f, gconstpointer data)
{
  g_autofree char *fused = sub(f, "fused");
  g_autofree char *per = sub(f, "per");
  g_autofree char *hf = sub(f, "hf");
  Model m = load_model("tiny-qwen3-moe.json");
  g_autoptr(GHashTable) want_fused = expected_tensors(&m, m.layers, 0x3);
  g_autoptr(GHashTable) want_per = expected_tensors(&m, m.layers, 0);

  (void)data;
  synth("tiny-qwen3-moe.json", fused, "--fused-experts", NULL);
  assert_layout(fused, want_fused);
  convert(fused, per, "hf-experts");
  assert_layout(per, want_per);
  {
    g_autoptr(WsyncCheckpoint) a = open_ck(per);
    g_autoptr(WsyncCheckpoint) b = open_ck(fused);
    assert_experts_differ(a);
    for (guint64 l = 0; l < m.layers; l++)
      assert_fused_matches(a, b, l, &m);
    assert_same_non_experts(a, b);
  }
  /* and the per-expert output, written as "hf", is the published form */
  convert(per, hf, "hf");
  assert_same_checkpoints(per, hf);
  model_clear(&m);
}

/* Layer 0 fused, layer 1 per-expert: "hf" reads it as it is; hf-experts and hf give
 * the per-expert original back, hf-fused the fused one. */
static void
test_mixed_input(Fixture *f, gconstpointer data)
{
  g_autofree char *per = sub(f, "per");
  g_autofree char *fused = sub(f, "fused");
  g_autofree char *mixed = sub(f, "mixed");
  g_autofree char *back = sub(f, "back");
  g_autofree char *as_is = sub(f, "as-is");
  g_autofree char *all_fused = sub(f, "all-fused");
  g_autofree char *config = g_build_filename(per, "config.json", NULL);
  Model m = load_model("tiny-qwen3-moe.json");
  g_autoptr(GHashTable) want_mixed = expected_tensors(&m, m.layers, 0x1);
  g_autoptr(GHashTable) want_fused = expected_tensors(&m, m.layers, 0x3);

  (void)data;
  synth("tiny-qwen3-moe.json", per, NULL, NULL);
  convert(per, fused, "hf-fused");
  {
    g_autoptr(WsyncCheckpoint) a = open_ck(per);
    g_autoptr(WsyncCheckpoint) b = open_ck(fused);
    g_autoptr(GPtrArray) tensors = g_ptr_array_new();

    for (guint i = 0; i < wsync_checkpoint_n_tensors(a); i++) {
      const WsyncTensor *t = wsync_checkpoint_tensor(a, i);
      if (!g_str_has_prefix(t->name, "model.layers.0.mlp.experts."))
        g_ptr_array_add(tensors, (gpointer)t);
    }
    g_ptr_array_add(tensors, (gpointer)lookup(b, "model.layers.0.mlp.experts.gate_up_proj"));
    g_ptr_array_add(tensors, (gpointer)lookup(b, "model.layers.0.mlp.experts.down_proj"));
    write_checkpoint(mixed, config, tensors);
  }
  assert_layout(mixed, want_mixed);
  convert(mixed, back, "hf-experts");
  expect_verify(per, back, 0);
  assert_same_checkpoints(per, back);
  /* read as it is, written in the published form (see test_fused_round_trip) */
  convert(mixed, as_is, "hf");
  assert_same_checkpoints(per, as_is);
  convert(mixed, all_fused, "hf-fused");
  assert_layout(all_fused, want_fused);
  assert_same_checkpoints(fused, all_fused);
  model_clear(&m);
}

/* tie_word_embeddings: no lm_head; mlp_only_layers [1]: layer 1 is a dense MLP. */
static void
test_tied_with_dense_layer(Fixture *f, gconstpointer data)
{
  g_autofree char *per = sub(f, "per");
  g_autofree char *fused = sub(f, "fused");
  g_autofree char *back = sub(f, "back");
  Model m = load_model("tiny-qwen3-moe-tied.json");
  g_autoptr(GHashTable) want = expected_tensors(&m, m.layers, 0);
  g_autoptr(GHashTable) want_fused = expected_tensors(&m, m.layers, 0x1);

  (void)data;
  g_assert_true(m.tie);
  g_assert_false(g_hash_table_contains(want, "lm_head.weight"));
  g_assert_true(g_hash_table_contains(want, "model.layers.1.mlp.gate_proj.weight"));
  g_assert_false(g_hash_table_contains(want, "model.layers.1.mlp.gate.weight"));
  synth("tiny-qwen3-moe-tied.json", per, NULL, NULL);
  assert_layout(per, want);
  convert(per, fused, "hf-fused");
  assert_layout(fused, want_fused);
  {
    g_autoptr(WsyncCheckpoint) a = open_ck(per);
    g_autoptr(WsyncCheckpoint) b = open_ck(fused);
    assert_fused_matches(a, b, 0, &m);
    assert_same_non_experts(a, b);
  }
  convert(fused, back, "hf-experts");
  expect_verify(per, back, 0);
  assert_same_checkpoints(per, back);
  model_clear(&m);
}

/* Qwen3 dense: no router, no experts; every hf target is the same layout. */
static void
test_dense_round_trip(Fixture *f, gconstpointer data)
{
  g_autofree char *src = sub(f, "src");
  g_autofree char *hf = sub(f, "hf");
  g_autofree char *fused = sub(f, "fused");
  Model m = load_model("tiny-qwen3.json");
  g_autoptr(GHashTable) want = expected_tensors(&m, m.layers, 0);

  (void)data;
  g_assert_true(m.dense);
  synth("tiny-qwen3.json", src, NULL, NULL);
  assert_layout(src, want);
  convert(src, hf, "hf");
  expect_verify(src, hf, 0);
  assert_same_checkpoints(src, hf);
  convert(src, fused, "hf-fused");
  assert_same_checkpoints(src, fused);
  model_clear(&m);
}

/* num_local_experts (Transformers 5 re-saves) is accepted for num_experts, and the old
 * RoPE buffers rotary_emb.inv_freq, cos_cached and sin_cached (which vLLM's
 * AutoWeightsLoader skips, docs/vllm.md §8) are dropped by the named rules. */
static void
test_config_variants_and_drop_rule(Fixture *f, gconstpointer data)
{
  g_autofree char *per = sub(f, "per");
  g_autofree char *renamed = sub(f, "renamed");
  g_autofree char *renamed_out = sub(f, "renamed-out");
  g_autofree char *inv = sub(f, "inv-freq");
  g_autofree char *inv_out = sub(f, "inv-freq-out");
  g_autofree char *config = g_build_filename(per, "config.json", NULL);
  g_autofree char *renamed_config = NULL;
  Model m = load_model("tiny-qwen3-moe.json");
  Run r;

  (void)data;
  synth("tiny-qwen3-moe.json", per, NULL, NULL);
  /* the same checkpoint with num_local_experts */
  json_object_remove_member(m.root, "num_experts");
  json_object_set_int_member(m.root, "num_local_experts", 8);
  renamed_config = sub(f, "renamed-config.json");
  write_config(m.root, renamed_config);
  {
    g_autoptr(WsyncCheckpoint) ck = open_ck(per);
    g_autoptr(GPtrArray) all = tensors_except(ck, NULL);
    g_autofree WsyncTensor *extra =
        tensor_like(lookup(ck, "model.norm.weight"), "model.layers.0.self_attn.rotary_emb.inv_freq",
                    1, 8, 0);
    g_autofree WsyncTensor *cos =
        tensor_like(lookup(ck, "model.norm.weight"), "model.layers.0.self_attn.rotary_emb.cos_cached",
                    1, 16, 0);
    g_autofree WsyncTensor *sin =
        tensor_like(lookup(ck, "model.norm.weight"), "model.layers.1.self_attn.rotary_emb.sin_cached",
                    1, 16, 0);

    write_checkpoint(renamed, renamed_config, all);
    g_ptr_array_add(all, extra);
    g_ptr_array_add(all, cos);
    g_ptr_array_add(all, sin);
    write_checkpoint(inv, config, all);
  }
  convert(renamed, renamed_out, "hf-fused");
  r = run_wsync("plan", inv, "--target", "hf-experts", NULL);
  expect_status(&r, 0, "plan with the RoPE buffers");
  assert_has(r.out, "model.layers.0.self_attn.rotary_emb.inv_freq dropped by rule rotary-inv-freq");
  assert_has(r.out, "model.layers.0.self_attn.rotary_emb.cos_cached dropped by rule rotary-cache");
  assert_has(r.out, "model.layers.1.self_attn.rotary_emb.sin_cached dropped by rule rotary-cache");
  run_clear(&r);
  convert(inv, inv_out, "hf-experts");
  assert_same_checkpoints(per, inv_out);
  model_clear(&m);
}

/* A config without tie_word_embeddings is untied: Qwen3MoeConfig and Qwen3Config default
 * it to false in Transformers 4 and 5, and vLLM reads that same config object's field
 * (docs/hf-checkpoints.md §2, §3).  Hand-written configs often leave it out: synth
 * writes lm_head.weight, exactly the untied tensor set, for the MoE and the dense model
 * (both starting from a config that says true or false). */
static void
test_tie_absent(Fixture *f, gconstpointer data)
{
  static const char *const configs[] = {"tiny-qwen3-moe-tied.json", "tiny-qwen3.json"};

  (void)data;
  for (guint i = 0; i < G_N_ELEMENTS(configs); i++) {
    g_autofree char *name = g_strdup_printf("no-tie-%u.json", i);
    g_autofree char *path = sub(f, name);
    g_autofree char *dst = g_strdup_printf("%s/no-tie-%u", f->dir, i);
    Model m = load_model(configs[i]);
    g_autoptr(GHashTable) want = NULL;
    Run r;

    json_object_remove_member(m.root, "tie_word_embeddings");
    write_config(m.root, path);
    m.tie = FALSE;
    want = expected_tensors(&m, m.layers, 0);
    g_assert_true(g_hash_table_contains(want, "lm_head.weight"));
    r = run_wsync("synth", "--config", path, dst, "--seed", "7", NULL);
    expect_status(&r, 0, "synth without tie_word_embeddings");
    run_clear(&r);
    assert_layout(dst, want);
    model_clear(&m);
  }
}

/* ---------------------------------------------------------------- bad input: one clear line */

/* Runs plan and convert on @src; both must exit with @status and say every fragment. */
static void
expect_refused(const Fixture *f, const char *src, const char *target, int status,
               const char *const *fragments)
{
  g_autofree char *dst = sub(f, "refused-out");
  const char *what[2] = {"plan", "convert"};

  for (guint i = 0; i < 2; i++) {
    Run r = i == 0 ? run_wsync("plan", src, "--target", target, NULL)
                   : run_wsync("convert", src, dst, "--target", target, NULL);
    expect_status(&r, status, what[i]);
    for (const char *const *frag = fragments; *frag != NULL; frag++)
      assert_has(r.err, *frag);
    /* one line */
    g_assert_true(r.err[0] != '\0' && strchr(r.err, '\n') == r.err + strlen(r.err) - 1);
    if (g_test_verbose())
      g_printerr("%s: %s", what[i], r.err);
    run_clear(&r);
  }
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
}

static void
test_missing_expert(Fixture *f, gconstpointer data)
{
  static const char gone[] = "model.layers.1.mlp.experts.5.up_proj.weight";
  g_autofree char *per = sub(f, "per");
  g_autofree char *bad = sub(f, "bad");
  g_autofree char *config = g_build_filename(per, "config.json", NULL);
  const char *const fragments[] = {gone, NULL};

  (void)data;
  synth("tiny-qwen3-moe.json", per, NULL, NULL);
  {
    g_autoptr(WsyncCheckpoint) ck = open_ck(per);
    g_autoptr(GPtrArray) tensors = tensors_except(ck, gone);
    write_checkpoint(bad, config, tensors);
  }
  expect_refused(f, bad, "hf-fused", 3, fragments);
  expect_refused(f, bad, "hf", 3, fragments);
}

static void
test_shape_contradicts_config(Fixture *f, gconstpointer data)
{
  static const char name[] = "model.layers.0.self_attn.k_proj.weight";
  g_autofree char *per = sub(f, "per");
  g_autofree char *bad = sub(f, "bad");
  g_autofree char *config = g_build_filename(per, "config.json", NULL);
  /* [nkv*D, H] = [32, 64] by the config; the file says [16, 64] */
  const char *const fragments[] = {name, "16", "32", "64", NULL};

  (void)data;
  synth("tiny-qwen3-moe.json", per, NULL, NULL);
  {
    g_autoptr(WsyncCheckpoint) ck = open_ck(per);
    g_autoptr(GPtrArray) tensors = tensors_except(ck, name);
    g_autofree WsyncTensor *half = tensor_like(lookup(ck, name), name, 2, 16, 64);
    g_ptr_array_add(tensors, half);
    write_checkpoint(bad, config, tensors);
  }
  expect_refused(f, bad, "hf-fused", 3, fragments);
}

static void
test_config_field_missing(Fixture *f, gconstpointer data)
{
  g_autofree char *per = sub(f, "per");
  g_autofree char *bad = sub(f, "bad");
  g_autofree char *bad_config = sub(f, "bad-config.json");
  g_autofree char *synth_out = sub(f, "synth-out");
  Model m = load_model("tiny-qwen3-moe.json");
  const char *const fragments[] = {
      "config.json: field \"num_experts\" (or num_local_experts) is missing\n", NULL};
  Run r;

  (void)data;
  synth("tiny-qwen3-moe.json", per, NULL, NULL);
  json_object_remove_member(m.root, "num_experts");
  write_config(m.root, bad_config);
  {
    g_autoptr(WsyncCheckpoint) ck = open_ck(per);
    g_autoptr(GPtrArray) tensors = tensors_except(ck, NULL);
    write_checkpoint(bad, bad_config, tensors);
  }
  expect_refused(f, bad, "hf-experts", 3, fragments);
  r = run_wsync("synth", "--config", bad_config, synth_out, NULL);
  expect_status(&r, 3, "synth with a bad config");
  assert_has(r.err, fragments[0]);
  g_assert_false(g_file_test(synth_out, G_FILE_TEST_EXISTS));
  run_clear(&r);
  model_clear(&m);
}

/* KV heads that do not divide the query heads (fewer, as 3 of 4, or more, as 8 of 4),
 * in Qwen3 dense and Qwen3-MoE: vLLM's Attention asserts `num_heads % num_kv_heads == 0`
 * (docs/vllm.md §8), so such a config is refused, naming the field: synth writes nothing,
 * and plan and convert of a checkpoint whose k_proj and v_proj have that config's
 * [nkv*D, H] (which wsync used to convert, exit 0) exit 3, one line. */
static void
test_kv_heads_not_dividing(Fixture *f, gconstpointer data)
{
  static const struct {
    const char *config;
    gint64 kv_heads;
    const char *message;
  } cases[] = {
      {"tiny-qwen3.json", 3,
       "config.json: field \"num_key_value_heads\" is 3, which does not divide "
       "num_attention_heads 4\n"},
      {"tiny-qwen3-moe.json", 3,
       "config.json: field \"num_key_value_heads\" is 3, which does not divide "
       "num_attention_heads 4\n"},
      {"tiny-qwen3-moe.json", 8,
       "config.json: field \"num_key_value_heads\" is 8, which does not divide "
       "num_attention_heads 4\n"},
  };

  (void)data;
  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_autofree char *name = g_strdup_printf("good-%u", i);
    g_autofree char *good = sub(f, name);
    g_autofree char *bad = sub(f, "bad");
    g_autofree char *bad_config = sub(f, "bad-config.json");
    g_autofree char *synth_out = sub(f, "synth-out");
    const char *const fragments[] = {cases[i].message, NULL};
    Model m = load_model(cases[i].config);
    Run r;

    synth(cases[i].config, good, NULL, NULL);
    json_object_set_int_member(m.root, "num_key_value_heads", cases[i].kv_heads);
    write_config(m.root, bad_config);
    {
      g_autoptr(WsyncCheckpoint) ck = open_ck(good);
      g_autoptr(GPtrArray) tensors = g_ptr_array_new();
      g_autoptr(GPtrArray) kv = g_ptr_array_new_with_free_func(g_free);
      g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
      const WsyncTensor *embed = lookup(ck, "model.embed_tokens.weight");

      for (guint t = 0; t < wsync_checkpoint_n_tensors(ck); t++) {
        const WsyncTensor *x = wsync_checkpoint_tensor(ck, t);
        if (!g_str_has_suffix(x->name, ".self_attn.k_proj.weight") &&
            !g_str_has_suffix(x->name, ".self_attn.v_proj.weight"))
          g_ptr_array_add(tensors, (gpointer)x);
      }
      for (guint64 l = 0; l < m.layers; l++)
        for (guint p = 0; p < 2; p++) {
          char *tname = g_strdup_printf("model.layers.%" G_GUINT64_FORMAT ".self_attn.%s.weight",
                                        l, p == 0 ? "k_proj" : "v_proj");
          WsyncTensor *t =
              tensor_like(embed, tname, 2, cases[i].kv_heads * m.head_dim, m.hidden);
          g_ptr_array_add(names, tname);
          g_ptr_array_add(kv, t);
          g_ptr_array_add(tensors, t);
        }
      write_checkpoint(bad, bad_config, tensors);
    }
    expect_refused(f, bad, "hf", 3, fragments);
    r = run_wsync("synth", "--config", bad_config, synth_out, NULL);
    expect_status(&r, 3, "synth with KV heads that do not divide the query heads");
    assert_has(r.err, cases[i].message);
    g_assert_false(g_file_test(synth_out, G_FILE_TEST_EXISTS));
    run_clear(&r);
    test_rmtree(bad);
    model_clear(&m);
  }
}

static void
test_unknown_tensor(Fixture *f, gconstpointer data)
{
  static const char extra_name[] = "model.layers.0.mlp.shared_expert.gate_proj.weight";
  g_autofree char *per = sub(f, "per");
  g_autofree char *bad = sub(f, "bad");
  g_autofree char *config = g_build_filename(per, "config.json", NULL);
  const char *const fragments[] = {extra_name, NULL};

  (void)data;
  synth("tiny-qwen3-moe.json", per, NULL, NULL);
  {
    g_autoptr(WsyncCheckpoint) ck = open_ck(per);
    g_autoptr(GPtrArray) tensors = tensors_except(ck, NULL);
    g_autofree WsyncTensor *extra =
        tensor_like(lookup(ck, "model.layers.0.mlp.experts.0.gate_proj.weight"), extra_name, 2,
                    32, 64);
    g_ptr_array_add(tensors, extra);
    write_checkpoint(bad, config, tensors);
  }
  expect_refused(f, bad, "hf-experts", 3, fragments);
}

/* No remapper claims "gpt_neox" (only qwen3_moe and vllm are loaded). */
static void
test_unclaimed_model_type(Fixture *f, gconstpointer data)
{
  g_autofree char *per = sub(f, "per");
  g_autofree char *bad = sub(f, "bad");
  g_autofree char *bad_config = sub(f, "gpt-neox-config.json");
  Model m = load_model("tiny-qwen3-moe.json");
  const char *const fragments[] = {"model_type \"gpt_neox\"", NULL};

  (void)data;
  synth("tiny-qwen3-moe.json", per, NULL, NULL);
  json_object_set_string_member(m.root, "model_type", "gpt_neox");
  write_config(m.root, bad_config);
  {
    g_autoptr(WsyncCheckpoint) ck = open_ck(per);
    g_autoptr(GPtrArray) tensors = tensors_except(ck, NULL);
    write_checkpoint(bad, bad_config, tensors);
  }
  /* The engine reports a model_type no loaded remapper serves as a usage/configuration
   * error (exit 2): the remedy is selecting a model plugin in conf.d. */
  expect_refused(f, bad, "hf", 2, fragments);
  model_clear(&m);
}

/* A config of model_type "qwen3" or "qwen3_moe" whose architectures[0] names a class
 * the plugin does not describe for it: the other model_type's class (Transformers builds
 * the class of model_type, vLLM the class of architectures[0]: two different models), a
 * classification head (score.weight, no lm_head), a made-up name.  The old tree
 * described them as the model_type's class and wrote the files under the other name,
 * exit 0.  Now synth exits 3 with one line naming config.json's path, the field, the
 * class found and the class described; plan and convert refuse a checkpoint of that
 * config the same way; nothing is written. */
static void
test_architecture_refused(Fixture *f, gconstpointer data)
{
  static const struct {
    const char *config, *architecture, *shown, *model_type, *described;
  } cases[] = {
      {"tiny-qwen3.json", "Qwen3MoeForCausalLM", "Qwen3MoeForCausalLM", "qwen3",
       "Qwen3ForCausalLM"},
      {"tiny-qwen3.json", "Qwen3ForSequenceClassification", "Qwen3ForSequenceClassification",
       "qwen3", "Qwen3ForCausalLM"},
      {"tiny-qwen3-moe.json", "Qwen3ForCausalLM", "Qwen3ForCausalLM", "qwen3_moe",
       "Qwen3MoeForCausalLM"},
      {"tiny-qwen3-moe.json", "Qwen3MoeForTokenClassification",
       "Qwen3MoeForTokenClassification", "qwen3_moe", "Qwen3MoeForCausalLM"},
      {"tiny-qwen3-moe.json", "Made\tUp", "Made\\tUp", "qwen3_moe", "Qwen3MoeForCausalLM"},
  };

  (void)data;
  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_autofree char *name = g_strdup_printf("arch-%u", i);
    g_autofree char *dir = sub(f, name);
    g_autofree char *per = g_build_filename(dir, "per", NULL);
    g_autofree char *bad = g_build_filename(dir, "bad", NULL);
    g_autofree char *bad_config = g_build_filename(dir, "config.json", NULL);
    g_autofree char *synth_out = g_build_filename(dir, "synth-out", NULL);
    g_autofree char *message = g_strdup_printf(
        "field \"architectures\" begins with \"%s\", but model_type \"%s\" is supported only "
        "as \"%s\"\n",
        cases[i].shown, cases[i].model_type, cases[i].described);
    g_autofree char *line = g_strdup_printf("wsync: %s: %s", bad_config, message);
    const char *const fragments[] = {message, NULL};
    Model m = load_model(cases[i].config);
    JsonArray *list = json_array_new();
    Run r;

    g_assert_cmpint(g_mkdir(dir, 0755), ==, 0);
    synth(cases[i].config, per, NULL, NULL);
    json_array_add_string_element(list, cases[i].architecture);
    json_object_set_array_member(m.root, "architectures", list);
    write_config(m.root, bad_config);
    {
      g_autoptr(WsyncCheckpoint) ck = open_ck(per);
      g_autoptr(GPtrArray) tensors = tensors_except(ck, NULL);
      write_checkpoint(bad, bad_config, tensors);
    }
    r = run_wsync("synth", "--config", bad_config, synth_out, NULL);
    expect_status(&r, 3, "synth with another class");
    g_assert_cmpstr(r.err, ==, line);
    g_assert_false(g_file_test(synth_out, G_FILE_TEST_EXISTS));
    run_clear(&r);
    expect_refused(f, bad, "hf", 3, fragments);
    if (have_vllm)
      expect_refused(f, bad, "vllm", 3, fragments);
    model_clear(&m);
  }
}

/* @a and @b hold the same file names, and every file but config.json byte for byte. */
static void
assert_same_files(const char *a, const char *b)
{
  g_autoptr(GDir) da = g_dir_open(a, 0, NULL);
  g_autoptr(GDir) db = g_dir_open(b, 0, NULL);
  guint n_a = 0, n_b = 0;
  const char *name;

  g_assert_nonnull(da);
  g_assert_nonnull(db);
  while ((name = g_dir_read_name(da)) != NULL) {
    g_autofree char *pa = g_build_filename(a, name, NULL);
    g_autofree char *pb = g_build_filename(b, name, NULL);
    g_autofree char *ca = NULL, *cb = NULL;
    gsize la = 0, lb = 0;
    n_a++;
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

/* A config without `architectures` (or with null or []) is described as the
 * model_type's class: synth writes the same checkpoint, and convert the same files, byte
 * for byte, as with the class named. */
static void
test_architecture_absent(Fixture *f, gconstpointer data)
{
  static const char *const configs[] = {"tiny-qwen3.json", "tiny-qwen3-moe.json"};
  static const char *const values[] = {NULL, "null", "[]"};
  const char *target = have_vllm ? "vllm" : "hf";

  (void)data;
  for (guint c = 0; c < G_N_ELEMENTS(configs); c++) {
    g_autofree char *name = g_strdup_printf("named-%u", c);
    g_autofree char *named = sub(f, name);
    g_autofree char *named_out = g_strconcat(named, "-out", NULL);
    synth(configs[c], named, "--pattern", "index");
    convert(named, named_out, target);
    for (guint v = 0; v < G_N_ELEMENTS(values); v++) {
      g_autofree char *vname = g_strdup_printf("none-%u-%u", c, v);
      g_autofree char *none = sub(f, vname);
      g_autofree char *none_out = g_strconcat(none, "-out", NULL);
      g_autofree char *config = g_strconcat(none, ".json", NULL);
      Model m = load_model(configs[c]);
      Run r;

      if (values[v] == NULL)
        json_object_remove_member(m.root, "architectures");
      else
        json_object_set_member(m.root, "architectures", json_from_string(values[v], NULL));
      write_config(m.root, config);
      r = run_wsync("synth", "--config", config, none, "--seed", "7", "--pattern", "index",
                    NULL);
      expect_status(&r, 0, "synth without architectures");
      run_clear(&r);
      assert_same_files(named, none);
      convert(none, none_out, target);
      assert_same_files(named_out, none_out);
      model_clear(&m);
    }
  }
}

/* ---------------------------------------------------------------- through the vllm backend */

typedef struct {
  const char *config;
  const char *tp;
  const char *ep;     /* nullable */
  const char *format; /* sharded-state or kernel */
} VllmCase;

/* hf -> vllm (tp, ep) -> hf is the identity: the vocabulary padding rows are fills,
 * which reading back ignores. */
static void
test_vllm_round_trip(Fixture *f, gconstpointer data)
{
  const VllmCase *c = data;
  g_autofree char *per = sub(f, "per");
  g_autofree char *ranks = sub(f, "ranks");
  g_autofree char *back = sub(f, "back");
  Run r;

  if (!have_vllm) {
    g_test_skip("the vllm plugin is not built");
    return;
  }
  synth(c->config, per, NULL, NULL);
  r = c->ep != NULL ? run_wsync("convert", per, ranks, "--target", "vllm", "--format", c->format,
                                "--tp", c->tp, "--ep", c->ep, NULL)
                    : run_wsync("convert", per, ranks, "--target", "vllm", "--format", c->format,
                                "--tp", c->tp, NULL);
  expect_status(&r, 0, "convert to vllm");
  run_clear(&r);
  convert(ranks, back, "hf");
  expect_verify(per, back, 0);
  assert_same_checkpoints(per, back);
}

/* Runs wsync with @conf (a conf.d of its own) instead of the test's. */
static Run
run_wsync_conf(const char *conf, const char *first, ...)
{
  va_list ap;

  va_start(ap, first);
  Run r = run_wsync_va(conf, first, ap);
  va_end(ap);
  return r;
}

/* A conf.d under the fixture selecting hf, qwen3_moe and vllm with moe-backend @backend. */
static char *
moe_conf(const Fixture *f, const char *backend)
{
  g_autofree char *name = g_strconcat("conf-", backend, NULL);
  char *dir = sub(f, name);
  g_autofree char *text =
      g_strdup_printf("plugin \"hf\" {}\nplugin \"qwen3_moe\" {}\n"
                      "plugin \"vllm\" {\n  moe-backend = \"%s\"\n}\n", backend);

  g_assert_cmpint(g_mkdir_with_parents(dir, 0700), ==, 0);
  g_free(test_write(dir, "10-test.conf", text));
  return dir;
}

/* Checks w13_weight of layer 0 in worker @rank's kernel file of @dir against the
 * published per-expert gate and up projections: expert e's rows [0, Ip) hold
 * @first_proj's TP slice of rank @rank, rows [Ip, 2Ip) the other's (docs/vllm.md §4:
 * the loader layout is [w1; w3], FlashInfer CUTLASS's kernel layout [w3; w1]).  Returns
 * the file's wsync.moe-backend record, or NULL. */
static char *
assert_w13_rows(const char *per, const char *dir, guint rank, guint tp, const char *first_proj)
{
  g_autofree char *file = g_strdup_printf("%s/kernel-rank-%u-part-0.safetensors", dir, rank);
  g_autoptr(WsyncCheckpoint) hf = open_ck(per);
  GError *error = NULL;
  g_autoptr(WsyncSafetensors) st = wsync_safetensors_open(file, &error);
  const char *second_proj = strcmp(first_proj, "gate_proj") == 0 ? "up_proj" : "gate_proj";
  const WsyncTensor *w13;
  const char *record;

  g_assert_no_error(error);
  w13 = wsync_safetensors_lookup(st, "model.layers.0.mlp.experts.routed_experts.w13_weight");
  g_assert_nonnull(w13);
  for (guint64 e = 0; e < w13->shape[0]; e++) {
    g_autofree char *first = expert_name(0, e, first_proj);
    g_autofree char *second = expert_name(0, e, second_proj);
    const WsyncTensor *a = lookup(hf, first), *b = lookup(hf, second);
    guint64 ip = a->shape[0] / tp, row = a->shape[1] * esize(a);
    const guint8 *expert = w13->data + e * 2 * ip * row;

    g_assert_cmpuint(w13->shape[1], ==, 2 * ip);
    g_assert_cmpmem(expert, ip * row, a->data + rank * ip * row, ip * row);
    g_assert_cmpmem(expert + ip * row, ip * row, b->data + rank * ip * row, ip * row);
  }
  record = g_hash_table_lookup(wsync_safetensors_metadata(st), "wsync.moe-backend");
  return g_strdup(record);
}

/* moe-backend (docs/vllm.md §4): vLLM's FlashInfer CUTLASS backend swaps each expert's
 * w13 halves after loading, so the vllm kernel format for it holds the up rows first,
 * records the choice, and reads back to the original bytes with the default options;
 * the default keeps the loader layout and records nothing; flashinfer-trtllm (a block
 * layout) is refused in one line, before anything is written; a bad record is refused. */
/* shared_expert_intermediate_size > 0: vLLM's Qwen3-MoE then builds a shared expert and
 * its gate in every MoE layer (qwen3_moe.py:176-197 @ df1376907b16), which Transformers'
 * Qwen3-MoE does not have and no checkpoint holds.  The hf targets take the config;
 * the vllm target refuses it in both formats (exit 3, the field, its value, what vLLM
 * builds), writing nothing.  The old tree wrote rank files without them, which
 * sharded_state refuses and a live update leaves uninitialised. */
static void
test_vllm_shared_expert_size(Fixture *f, gconstpointer data)
{
  g_autofree char *ck = sub(f, "shared");
  g_autofree char *config = sub(f, "shared-config.json");
  g_autofree char *hf = sub(f, "shared-hf");
  g_autofree char *ranks = sub(f, "shared-ranks");
  Model m = load_model("tiny-qwen3-moe.json");
  Run r;

  (void)data;
  if (!have_vllm) {
    g_test_skip("the vllm plugin was not built");
    model_clear(&m);
    return;
  }
  json_object_set_int_member(m.root, "shared_expert_intermediate_size", 16);
  write_config(m.root, config);
  r = run_wsync("synth", "--config", config, ck, NULL);
  expect_status(&r, 0, "synth with shared_expert_intermediate_size");
  run_clear(&r);
  convert(ck, hf, "hf");
  for (guint kernel = 0; kernel < 2; kernel++) {
    r = run_wsync("convert", ck, ranks, "--target", "vllm", "--tp", "2", "--format",
                  kernel ? "kernel" : "sharded-state", NULL);
    expect_status(&r, 3, "convert to vllm with shared_expert_intermediate_size");
    assert_has(r.err, "config.json: field \"shared_expert_intermediate_size\" is 16: vLLM's "
                      "Qwen3MoeForCausalLM then builds a shared expert and its gate in every "
                      "MoE layer (vllm/model_executor/models/qwen3_moe.py:176-197)");
    g_assert_false(g_file_test(ranks, G_FILE_TEST_EXISTS));
    run_clear(&r);
  }
  /* 0, what vLLM's getattr default says too, converts */
  json_object_set_int_member(m.root, "shared_expert_intermediate_size", 0);
  write_config(m.root, config);
  {
    g_autofree char *ck_config = g_build_filename(ck, "config.json", NULL);
    test_copy(config, ck_config);
  }
  r = run_wsync("plan", ck, "--target", "vllm", "--tp", "2", NULL);
  expect_status(&r, 0, "plan with shared_expert_intermediate_size 0");
  run_clear(&r);
  model_clear(&m);
}

/* hidden_act "gelu" for Qwen3-MoE and Qwen3 dense: vLLM's Qwen3MoeMLP and Qwen2MLP raise
 * "Unsupported activation" (qwen3_moe.py:112-115, qwen2.py:104-107 @ df1376907b16), and
 * an all-sparse Qwen3-MoE, which builds neither, runs FusedMoE's default silu
 * (fused_moe/layer.py:115; docs/vllm.md §2 "Activation").  The vllm target refuses it
 * (exit 3, config.json, the field, the value, "silu"); the hf targets take it, as
 * Transformers runs any ACT2FN activation.  The old tree converted it (exit 0). */
static void
test_vllm_hidden_act(Fixture *f, gconstpointer data)
{
  static const struct {
    const char *config, *architecture, *why;
  } cases[] = {
      /* every layer sparse: vLLM starts, and runs silu (the old message said only that
       * Qwen3MoeMLP raises, which such a model never builds) */
      {"tiny-qwen3-moe.json", "Qwen3MoeForCausalLM",
       "the routed experts run silu whatever hidden_act says (FusedMoE's default, "
       "vllm/model_executor/layers/fused_moe/layer.py:115): vLLM would not start from these "
       "files, or would run them with another activation than the config's\n"},
      {"tiny-qwen3.json", "Qwen3ForCausalLM",
       "\"silu\": its MLP, Qwen2MLP, raises \"Unsupported activation\" "
       "(vllm/model_executor/models/qwen2.py:104-107): vLLM would not start from these "
       "files\n"}};

  (void)data;
  if (!have_vllm) {
    g_test_skip("the vllm plugin was not built");
    return;
  }
  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_autofree char *ck = sub(f, cases[i].architecture);
    g_autofree char *config = g_strconcat(ck, ".json", NULL);
    g_autofree char *hf = g_strconcat(ck, "-hf", NULL);
    g_autofree char *ranks = g_strconcat(ck, "-ranks", NULL);
    g_autofree char *message = g_strdup_printf(
        "config.json: field \"hidden_act\" is \"gelu\", but vLLM's %s accepts only \"silu\"",
        cases[i].architecture);
    Model m = load_model(cases[i].config);
    Run r;

    json_object_set_string_member(m.root, "hidden_act", "gelu");
    write_config(m.root, config);
    model_clear(&m);
    r = run_wsync("synth", "--config", config, ck, NULL);
    expect_status(&r, 0, "synth with hidden_act gelu");
    run_clear(&r);
    convert(ck, hf, "hf");
    r = run_wsync("convert", ck, ranks, "--target", "vllm", "--tp", "2", NULL);
    expect_status(&r, 3, "convert to vllm with hidden_act gelu");
    assert_has(r.err, message);
    assert_has(r.err, cases[i].why);
    g_assert_false(g_file_test(ranks, G_FILE_TEST_EXISTS));
    run_clear(&r);
  }
}

/* Rank files whose config.json says hidden_act "gelu" or shared_expert_intermediate_size
 * 16 (as an earlier wsync wrote them, exit 0) read back to hf: vLLM's rules on what it
 * builds are for files it is to load, and the files hold the checkpoint's bytes.  The
 * old tree refused the read-back with the write's message (exit 3), leaving no way
 * back to the checkpoint. */
static void
test_vllm_read_back_divergent_config(Fixture *f, gconstpointer data)
{
  static const struct {
    const char *key;
    int value; /* 0: the string "gelu" */
  } cases[] = {{"hidden_act", 0}, {"shared_expert_intermediate_size", 16}};

  (void)data;
  if (!have_vllm) {
    g_test_skip("the vllm plugin was not built");
    return;
  }
  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_autofree char *ck = sub(f, cases[i].key);
    g_autofree char *plain = g_strconcat(ck, "-plain", NULL);
    g_autofree char *plain_config = g_build_filename(plain, "config.json", NULL);
    g_autofree char *config = g_strconcat(ck, ".json", NULL);
    g_autofree char *ranks = g_strconcat(ck, "-ranks", NULL);
    g_autofree char *rank_config = g_build_filename(ranks, "config.json", NULL);
    g_autofree char *back = g_strconcat(ck, "-back", NULL);
    Model m = load_model("tiny-qwen3-moe.json");
    Run r;

    g_assert_cmpint(g_mkdir_with_parents(plain, 0755), ==, 0);
    write_config(m.root, plain_config);
    if (cases[i].value == 0)
      json_object_set_string_member(m.root, cases[i].key, "gelu");
    else
      json_object_set_int_member(m.root, cases[i].key, cases[i].value);
    write_config(m.root, config);
    model_clear(&m);
    r = run_wsync("synth", "--config", config, ck, NULL);
    expect_status(&r, 0, "synth");
    run_clear(&r);
    /* the rank files an earlier wsync wrote: the same tensors, the config as it is */
    r = run_wsync("convert", ck, ranks, "--target", "vllm", "--tp", "2", "--config", plain, NULL);
    expect_status(&r, 0, "convert to vllm with the plain config");
    run_clear(&r);
    test_copy(config, rank_config);
    r = run_wsync("convert", ranks, back, "--target", "hf", NULL);
    expect_status(&r, 0, "read the rank files back to hf");
    run_clear(&r);
    expect_verify(ck, back, 0);
  }
}

static void
test_vllm_moe_backend(Fixture *f, gconstpointer data)
{
  g_autofree char *per = sub(f, "per");
  g_autofree char *cutlass = sub(f, "cutlass");
  g_autofree char *triton = sub(f, "triton");
  g_autofree char *trtllm = sub(f, "trtllm");
  g_autofree char *back = sub(f, "back");
  g_autofree char *conf_cutlass = moe_conf(f, "flashinfer-cutlass");
  g_autofree char *conf_trtllm = moe_conf(f, "flashinfer-trtllm");
  Run r;

  (void)data;
  if (!have_vllm) {
    g_test_skip("the vllm plugin is not built");
    return;
  }
  synth("tiny-qwen3-moe.json", per, NULL, NULL);
  r = run_wsync_conf(conf_cutlass, "convert", per, cutlass, "--target", "vllm", "--format",
                     "kernel", "--tp", "2", NULL);
  expect_status(&r, 0, "convert with moe-backend flashinfer-cutlass");
  run_clear(&r);
  for (guint rank = 0; rank < 2; rank++) {
    g_autofree char *record = assert_w13_rows(per, cutlass, rank, 2, "up_proj");
    g_assert_cmpstr(record, ==, "flashinfer-cutlass");
  }
  convert(cutlass, back, "hf"); /* the test's conf.d: moe-backend triton */
  expect_verify(per, back, 0);
  assert_same_checkpoints(per, back);

  r = run_wsync("convert", per, triton, "--target", "vllm", "--format", "kernel", "--tp", "2",
                NULL);
  expect_status(&r, 0, "convert with the default moe-backend");
  run_clear(&r);
  {
    g_autofree char *record = assert_w13_rows(per, triton, 1, 2, "gate_proj");
    g_assert_null(record);
  }

  r = run_wsync_conf(conf_trtllm, "convert", per, trtllm, "--target", "vllm", "--format",
                     "kernel", "--tp", "2", NULL);
  expect_status(&r, 2, "convert with moe-backend flashinfer-trtllm");
  assert_has(r.err, "model.layers.0.mlp.experts.routed_experts.w13_weight: moe-backend "
                    "flashinfer-trtllm: FlashInfer TRTLLM re-lays the routed experts into its "
                    "block layout");
  assert_has(r.err, "--moe-backend triton");
  g_assert_true(strchr(r.err, '\n') == r.err + strlen(r.err) - 1);
  g_assert_false(g_file_test(trtllm, G_FILE_TEST_EXISTS));
  run_clear(&r);

  test_set_rank_file_metadata(cutlass, "wsync.moe-backend", "flashinfer-trtllm");
  r = run_wsync("convert", cutlass, trtllm, "--target", "hf", NULL);
  expect_status(&r, 3, "read back a flashinfer-trtllm record");
  assert_has(r.err, "metadata wsync.moe-backend is \"flashinfer-trtllm\", not \"triton\" or, "
                    "in the vllm target's kernel format, \"flashinfer-cutlass\"");
  run_clear(&r);
}

int
main(int argc, char **argv)
{
  static const VllmCase vllm_cases[] = {
      {"tiny-qwen3-moe.json", "1", NULL, "sharded-state"},
      {"tiny-qwen3-moe.json", "2", NULL, "sharded-state"},
      {"tiny-qwen3-moe.json", "4", NULL, "sharded-state"},
      {"tiny-qwen3-moe-8heads.json", "8", NULL, "sharded-state"},
      {"tiny-qwen3-moe.json", "2", "2", "sharded-state"},
      {"tiny-qwen3-moe.json", "2", "4", "kernel"},
      {"tiny-qwen3-moe.json", "4", NULL, "kernel"},
      {"tiny-qwen3-moe-tied.json", "2", NULL, "sharded-state"},
      {"tiny-qwen3-moe-tied.json", "2", NULL, "kernel"},
      {"tiny-qwen3.json", "4", NULL, "sharded-state"},
  };
  g_autofree char *vllm_so = NULL;
  int status;

  g_test_init(&argc, &argv, NULL);
  plugin_dir = test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR");
  vllm_so = g_build_filename(plugin_dir, "vllm.so", NULL);
  have_vllm = g_file_test(vllm_so, G_FILE_TEST_IS_REGULAR);
  conf_dir = test_tmpdir();
  g_free(test_write(conf_dir, "10-test.conf",
                    have_vllm ? "plugin \"hf\" {}\nplugin \"qwen3_moe\" {}\nplugin \"vllm\" {}\n"
                              : "plugin \"hf\" {}\nplugin \"qwen3_moe\" {}\n"));

#define ADD(path, func, data)                                                                 \
  g_test_add("/qwen3-moe/" path, Fixture, data, fixture_setup, func, fixture_teardown)
  ADD("synth/published-form", test_synth_published_form, NULL);
  ADD("fused/round-trip-random", test_fused_round_trip, "random");
  ADD("fused/round-trip-index", test_fused_round_trip, "index");
  ADD("fused/synth-fused", test_synth_fused, NULL);
  ADD("fused/mixed-input", test_mixed_input, NULL);
  ADD("config/tied-with-dense-layer", test_tied_with_dense_layer, NULL);
  ADD("config/tie-absent", test_tie_absent, NULL);
  ADD("config/dense-qwen3", test_dense_round_trip, NULL);
  ADD("config/variants-and-drop-rule", test_config_variants_and_drop_rule, NULL);
  ADD("bad-input/missing-expert", test_missing_expert, NULL);
  ADD("bad-input/shape-contradicts-config", test_shape_contradicts_config, NULL);
  ADD("bad-input/config-field-missing", test_config_field_missing, NULL);
  ADD("bad-input/kv-heads-not-dividing", test_kv_heads_not_dividing, NULL);
  ADD("bad-input/unknown-tensor", test_unknown_tensor, NULL);
  ADD("bad-input/unclaimed-model-type", test_unclaimed_model_type, NULL);
  ADD("bad-input/architecture-refused", test_architecture_refused, NULL);
  ADD("config/architecture-absent", test_architecture_absent, NULL);
  ADD("vllm/moe-backend", test_vllm_moe_backend, NULL);
  ADD("vllm/shared-expert-size", test_vllm_shared_expert_size, NULL);
  ADD("vllm/hidden-act", test_vllm_hidden_act, NULL);
  ADD("vllm/read-back-divergent-config", test_vllm_read_back_divergent_config, NULL);
  for (guint i = 0; i < G_N_ELEMENTS(vllm_cases); i++) {
    g_autofree char *path =
        g_strdup_printf("vllm/%s/%s/tp%s%s%s", vllm_cases[i].config, vllm_cases[i].format,
                        vllm_cases[i].tp, vllm_cases[i].ep != NULL ? "-ep" : "",
                        vllm_cases[i].ep != NULL ? vllm_cases[i].ep : "");
    g_autofree char *full = g_strconcat("/qwen3-moe/", path, NULL);
    g_test_add(full, Fixture, &vllm_cases[i], fixture_setup, test_vllm_round_trip,
               fixture_teardown);
  }
#undef ADD
  status = g_test_run();
  test_rmtree(conf_dir);
  g_free(conf_dir);
  return status;
}
