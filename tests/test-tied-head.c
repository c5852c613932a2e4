/* A tied model whose checkpoint also carries lm_head.weight, through the wsync command.
 *
 * torch's state_dict() keeps both keys of a tied parameter (named_parameters() does
 * not), so checkpoints saved from it, and DCP checkpoints of tied models, hold
 * `lm_head.weight` beside the embedding.  vLLM skips it or loads it into the one tensor
 * both names hold (docs/vllm.md §3).  The model plugins (qwen3_moe for Qwen3 and
 * Qwen3-MoE, qwen3_5_moe, llama) consume it by the copy rule `tied-lm-head` when the
 * model is tied: the output is byte for byte that of the checkpoint without it, and the
 * plan says so; a tensor of another dtype or shape is refused (exit 3, nothing written);
 * an untied model keeps its lm_head.weight.
 *
 * The extra tensor is written here with the library's safetensors writer, from the
 * embedding's header and bytes as `wsync synth` wrote them.
 */
#include <json-glib/json-glib.h>

#include <wsync/wsync.h>

#include "testutil.h"

typedef struct {
  const char *config;    /* under the source tree */
  const char *embedding; /* the published name of the embedding */
  const char *remapper;  /* as messages name it */
  char *synth;           /* its `wsync synth` checkpoint, made once */
} Case;

static Case tied_cases[] = {
  {"configs/tiny-qwen3-moe-tied.json", "model.embed_tokens.weight",
   "remapper qwen3_moe (plugin qwen3_moe)", NULL},
  {"tests/data/configs/tiny-qwen3-tied-headdim.json", "model.embed_tokens.weight",
   "remapper qwen3_moe (plugin qwen3_moe)", NULL},
  {"configs/tiny-qwen3.5.json", "model.language_model.embed_tokens.weight",
   "remapper qwen3_5_moe (plugin qwen3_5_moe)", NULL},
  {"tests/data/configs/tiny-qwen3.5-moe-kv1-tied.json",
   "model.language_model.embed_tokens.weight", "remapper qwen3_5_moe (plugin qwen3_5_moe)",
   NULL},
  {"tests/data/configs/tiny-llama3-tied-bias.json", "model.embed_tokens.weight",
   "remapper llama (plugin llama)", NULL},
};

static Case untied_cases[] = {
  {"configs/tiny-qwen3-moe.json", "model.embed_tokens.weight", NULL, NULL},
  {"configs/tiny-qwen3.json", "model.embed_tokens.weight", NULL, NULL},
  {"configs/tiny-qwen3.5-moe.json", "model.language_model.embed_tokens.weight", NULL, NULL},
  {"tests/data/configs/tiny-llama3.json", "model.embed_tokens.weight", NULL, NULL},
};

static char *work_dir; /* everything made, removed at the end */
static char *conf_dir; /* hf, llama, qwen3_moe, qwen3_5_moe, vllm */
static const char *plugin_dir;
static guint n_made;

/* ------------------------------------------------------------------ running wsync */

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
}

static char *
new_path(const char *what)
{
  return g_strdup_printf("%s/%s-%u", work_dir, what, n_made++);
}

static const char *
synth(Case *c)
{
  if (c->synth == NULL) {
    g_autofree char *config = g_test_build_filename(G_TEST_DIST, "..", c->config, NULL);
    c->synth = new_path("synth");
    TestRun r = run_wsync("synth", "--config", config, c->synth, "--pattern", "index", NULL);
    expect_status(&r, 0, c->config);
    test_run_clear(&r);
  }
  return c->synth;
}

/* ------------------------------------------------------------------ checkpoints */

static gint
compare_names(gconstpointer a, gconstpointer b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The *.safetensors files of @dir, sorted. */
static GPtrArray *
safetensors_files(const char *dir)
{
  GPtrArray *names = g_ptr_array_new_with_free_func(g_free);
  g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
  const char *name;

  g_assert_nonnull(d);
  while ((name = g_dir_read_name(d)) != NULL)
    if (g_str_has_suffix(name, ".safetensors"))
      g_ptr_array_add(names, g_strdup(name));
  g_ptr_array_sort(names, compare_names);
  return names;
}

/* The file of @dir holding tensor @name (opened into *@st), or NULL. */
static const WsyncTensor *
find_tensor(const char *dir, const char *name, WsyncSafetensors **st)
{
  g_autoptr(GPtrArray) files = safetensors_files(dir);

  for (guint f = 0; f < files->len; f++) {
    g_autofree char *path = g_build_filename(dir, files->pdata[f], NULL);
    GError *error = NULL;
    WsyncSafetensors *file = wsync_safetensors_open(path, &error);
    g_assert_no_error(error);
    for (guint i = 0; i < wsync_safetensors_n_tensors(file); i++) {
      const WsyncTensor *t = wsync_safetensors_tensor(file, i);
      if (strcmp(t->name, name) == 0) {
        *st = file;
        return t;
      }
    }
    wsync_safetensors_free(file);
  }
  return NULL;
}

/* A copy of @src's config.json and safetensors files (without its index, which would
 * list only its own files) plus `tied-head.safetensors` holding lm_head.weight: with
 * @data, of @like's dtype, shape and bytes; else of @dtype and @shape, zero. */
static char *
with_head(const char *src, const WsyncTensor *like, WsyncDtype dtype, const guint64 *shape,
          gboolean data)
{
  char *dir = new_path("with-head");
  g_autoptr(GPtrArray) files = safetensors_files(src);
  g_autoptr(WsyncSafetensorsWriter) w = wsync_safetensors_writer_new();
  g_autofree char *head = g_build_filename(dir, "tied-head.safetensors", NULL);
  GError *error = NULL;

  g_assert_cmpint(g_mkdir(dir, 0755), ==, 0);
  g_ptr_array_add(files, g_strdup("config.json"));
  for (guint f = 0; f < files->len; f++) {
    g_autofree char *from = g_build_filename(src, files->pdata[f], NULL);
    g_autofree char *to = g_build_filename(dir, files->pdata[f], NULL);
    test_copy(from, to);
  }
  if (data) {
    dtype = like->dtype;
    shape = like->shape;
  }
  wsync_safetensors_writer_add(w, "lm_head.weight", dtype, like->ndim, shape, &error);
  g_assert_no_error(error);
  wsync_safetensors_writer_begin(w, head, &error);
  g_assert_no_error(error);
  if (data)
    wsync_safetensors_writer_pwrite(w, "lm_head.weight", 0, like->data, like->nbytes, &error);
  g_assert_no_error(error);
  wsync_safetensors_writer_finish(w, &error);
  g_assert_no_error(error);
  return dir;
}

/* @got holds exactly @want's files, byte for byte. */
static void
assert_same_dirs(const char *want, const char *got)
{
  g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
  g_autoptr(GPtrArray) got_names = g_ptr_array_new_with_free_func(g_free);
  const char *dirs[] = {want, got};
  GPtrArray *lists[] = {names, got_names};

  for (guint i = 0; i < 2; i++) {
    g_autoptr(GDir) d = g_dir_open(dirs[i], 0, NULL);
    const char *name;
    g_assert_nonnull(d);
    while ((name = g_dir_read_name(d)) != NULL)
      g_ptr_array_add(lists[i], g_strdup(name));
    g_ptr_array_sort(lists[i], compare_names);
  }
  g_assert_cmpuint(names->len, ==, got_names->len);
  g_assert_cmpuint(names->len, >, 1);
  for (guint i = 0; i < names->len; i++) {
    g_autofree char *a = g_build_filename(want, names->pdata[i], NULL);
    g_autofree char *b = g_build_filename(got, names->pdata[i], NULL);
    g_autofree char *x = NULL, *y = NULL;
    gsize nx = 0, ny = 0;
    g_assert_cmpstr(names->pdata[i], ==, got_names->pdata[i]);
    g_assert_true(g_file_get_contents(a, &x, &nx, NULL));
    g_assert_true(g_file_get_contents(b, &y, &ny, NULL));
    if (nx != ny || memcmp(x, y, nx) != 0)
      g_error("%s differs from %s", b, a);
  }
}

/* ------------------------------------------------------------------ tests */

static const char *const targets[][5] = {
  {"--target", "vllm", "--tp", "2", NULL},
  {"--target", "hf", NULL},
};

/* A copy of the embedding as lm_head.weight: consumed by the rule, the output of every
 * target the bytes of the checkpoint without it, the plan's line and JSON entry. */
static void
test_copy_dropped(gconstpointer data)
{
  Case *c = (Case *)data;
  const char *src = synth(c);
  g_autoptr(WsyncSafetensors) st = NULL;
  g_autoptr(WsyncSafetensors) no_head = NULL;
  const WsyncTensor *embed = find_tensor(src, c->embedding, &st);
  g_autofree char *with = NULL;
  g_autofree char *line = g_strdup_printf(
      "\ninput lm_head.weight dropped by rule tied-lm-head (a copy of %s: same dtype and "
      "shape, values not compared)\n",
      c->embedding);

  g_assert_nonnull(embed);
  g_assert_null(find_tensor(src, "lm_head.weight", &no_head)); /* tied: synth writes none */
  with = with_head(src, embed, 0, NULL, TRUE);
  for (guint t = 0; t < G_N_ELEMENTS(targets); t++) {
    const char *const *tg = targets[t];
    g_autofree char *out = new_path("out");
    g_autofree char *ref = new_path("ref");
    TestRun r = run_wsync("plan", with, tg[0], tg[1], tg[2], tg[3], NULL);
    expect_status(&r, 0, "plan with lm_head.weight");
    test_assert_has(r.out, line);
    test_run_clear(&r);

    r = run_wsync("plan", with, "--json", tg[0], tg[1], tg[2], tg[3], NULL);
    expect_status(&r, 0, "plan --json with lm_head.weight");
    {
      g_autoptr(JsonParser) parser = json_parser_new();
      g_autoptr(JsonGenerator) gen = json_generator_new();
      g_autofree char *want = g_strdup_printf(
          "[{\"tensor\":\"lm_head.weight\",\"rule\":\"tied-lm-head\",\"copy_of\":\"%s\"}]",
          c->embedding);
      GError *error = NULL;
      json_parser_load_from_data(parser, r.out, -1, &error);
      g_assert_no_error(error);
      /* the entries of lm_head.weight and of any copy rule (Qwen3.5's MTP block is
       * dropped in vllm too, by its own rule) */
      JsonArray *all = json_object_get_array_member(
          json_node_get_object(json_parser_get_root(parser)), "dropped_inputs");
      g_autoptr(JsonArray) ours = json_array_new();
      for (guint i = 0; i < json_array_get_length(all); i++) {
        JsonObject *e = json_array_get_object_element(all, i);
        if (json_object_has_member(e, "copy_of") ||
            g_strcmp0(json_object_get_string_member(e, "tensor"), "lm_head.weight") == 0)
          json_array_add_element(ours, json_node_copy(json_array_get_element(all, i)));
      }
      g_autoptr(JsonNode) root = json_node_init_array(json_node_alloc(), ours);
      json_generator_set_root(gen, root);
      g_autofree char *got = json_generator_to_data(gen, NULL);
      g_assert_cmpstr(got, ==, want);
    }
    test_run_clear(&r);

    r = run_wsync("convert", with, out, tg[0], tg[1], tg[2], tg[3], NULL);
    expect_status(&r, 0, "convert with lm_head.weight");
    test_run_clear(&r);
    r = run_wsync("convert", src, ref, tg[0], tg[1], tg[2], tg[3], NULL);
    expect_status(&r, 0, "convert without lm_head.weight");
    test_run_clear(&r);
    assert_same_dirs(ref, out);
    r = run_wsync("verify", ref, out, NULL);
    expect_status(&r, 0, "verify");
    test_run_clear(&r);
  }
}

/* lm_head.weight of another dtype, or another shape: an engine would keep only one of
 * two different tensors, so plan and convert refuse it, exit 3, naming both and the
 * rule, and convert writes nothing. */
static void
test_other_refused(gconstpointer data)
{
  Case *c = (Case *)data;
  const char *src = synth(c);
  g_autoptr(WsyncSafetensors) st = NULL;
  const WsyncTensor *embed = find_tensor(src, c->embedding, &st);
  WsyncDtype other_dtype =
      embed->dtype == WSYNC_DTYPE_BF16 ? WSYNC_DTYPE_F32 : WSYNC_DTYPE_BF16;
  guint64 fewer_rows[2] = {embed->shape[0] - 1, embed->shape[1]};
  struct {
    WsyncDtype dtype;
    const guint64 *shape;
  } variants[] = {{other_dtype, embed->shape}, {embed->dtype, fewer_rows}};
  g_autofree char *embed_shape = wsync_shape_format(embed->ndim, embed->shape);

  g_assert_cmpuint(embed->ndim, ==, 2);
  for (guint v = 0; v < G_N_ELEMENTS(variants); v++) {
    g_autofree char *with = with_head(src, embed, variants[v].dtype, variants[v].shape, FALSE);
    g_autofree char *out = new_path("refused-out");
    g_autofree char *head_shape = wsync_shape_format(2, variants[v].shape);
    g_autofree char *want = g_strdup_printf(
        "wsync: %s: input tensor \"lm_head.weight\" is %s %s but \"%s\" is %s %s: rule "
        "tied-lm-head of %s takes the first for a copy of the second (the model ties them), "
        "and an engine keeps only one of two different tensors\n",
        with, wsync_dtype_name(variants[v].dtype), head_shape, c->embedding,
        wsync_dtype_name(embed->dtype), embed_shape, c->remapper);
    TestRun r = run_wsync("plan", with, "--target", "vllm", NULL);
    expect_status(&r, 3, "plan with another lm_head.weight");
    g_assert_cmpstr(r.err, ==, want);
    test_run_clear(&r);
    for (guint t = 0; t < G_N_ELEMENTS(targets); t++) {
      const char *const *tg = targets[t];
      r = run_wsync("convert", with, out, tg[0], tg[1], tg[2], tg[3], NULL);
      expect_status(&r, 3, "convert with another lm_head.weight");
      g_assert_cmpstr(r.err, ==, want);
      g_assert_false(g_file_test(out, G_FILE_TEST_EXISTS));
      test_run_clear(&r);
    }
  }
}

/* An untied model's lm_head.weight is its own tensor: no rule takes it, and the hf
 * output holds it, the bytes of the source's. */
static void
test_untied_kept(gconstpointer data)
{
  Case *c = (Case *)data;
  const char *src = synth(c);
  g_autofree char *out = new_path("untied-out");
  g_autoptr(WsyncSafetensors) st = NULL;
  g_autoptr(WsyncSafetensors) out_st = NULL;
  const WsyncTensor *head = find_tensor(src, "lm_head.weight", &st);
  const WsyncTensor *kept = NULL;
  TestRun r;

  g_assert_nonnull(head);
  r = run_wsync("plan", src, "--target", "vllm", "--tp", "2", NULL);
  expect_status(&r, 0, "plan of an untied model");
  g_assert_null(strstr(r.out, "tied-lm-head"));
  g_assert_null(strstr(r.out, "input lm_head.weight"));
  test_run_clear(&r);
  r = run_wsync("convert", src, out, "--target", "hf", NULL);
  expect_status(&r, 0, "convert of an untied model");
  test_run_clear(&r);
  kept = find_tensor(out, "lm_head.weight", &out_st);
  g_assert_nonnull(kept);
  g_assert_cmpuint(kept->nbytes, ==, head->nbytes);
  g_assert_true(memcmp(kept->data, head->data, head->nbytes) == 0);
}

int
main(int argc, char **argv)
{
  int status;

  g_test_init(&argc, &argv, NULL);
  plugin_dir = test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR");
  work_dir = test_tmpdir();
  conf_dir = g_build_filename(work_dir, "conf", NULL);
  g_assert_cmpint(g_mkdir(conf_dir, 0755), ==, 0);
  g_free(test_write(conf_dir, "10-test.conf",
                    "plugin \"hf\" {}\nplugin \"llama\" {}\nplugin \"qwen3_moe\" {}\n"
                    "plugin \"qwen3_5_moe\" {}\nplugin \"vllm\" {}\n"));
  for (guint i = 0; i < G_N_ELEMENTS(tied_cases); i++) {
    g_autofree char *base = g_path_get_basename(tied_cases[i].config);
    g_autofree char *copy = g_strdup_printf("/tied-head/copy-dropped/%s", base);
    g_autofree char *other = g_strdup_printf("/tied-head/other-refused/%s", base);
    g_test_add_data_func(copy, &tied_cases[i], test_copy_dropped);
    g_test_add_data_func(other, &tied_cases[i], test_other_refused);
  }
  for (guint i = 0; i < G_N_ELEMENTS(untied_cases); i++) {
    g_autofree char *base = g_path_get_basename(untied_cases[i].config);
    g_autofree char *path = g_strdup_printf("/tied-head/untied-kept/%s", base);
    g_test_add_data_func(path, &untied_cases[i], test_untied_kept);
  }
  status = g_test_run();
  test_rmtree(work_dir);
  g_free(work_dir);
  g_free(conf_dir);
  for (guint i = 0; i < G_N_ELEMENTS(tied_cases); i++)
    g_free(tied_cases[i].synth);
  for (guint i = 0; i < G_N_ELEMENTS(untied_cases); i++)
    g_free(untied_cases[i].synth);
  return status;
}
