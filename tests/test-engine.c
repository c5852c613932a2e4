/* The engine through the command line: its proofs (coverage, inputs used), its refusals
 * of bad input, atomic output, parts, threads, conf.d defaults and config patchers.
 * Model- and backend-specific rules are tested in test-qwen3-moe and test-vllm. */
#define _GNU_SOURCE /* realpath */
#include <json-glib/json-glib.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <wsync/wsync.h>

#include "testutil.h"

typedef TestRun Run;
/* the shared helpers of testutil.h under this file's short names */
#define assert_has test_assert_has

typedef struct {
  char *dir;  /* scratch */
  char *conf; /* conf.d selecting qwen3_moe, vllm, broken */
  char *tiny; /* a synthesised tiny Qwen3-MoE checkpoint */
} Fixture;

#define run_clear test_run_clear

/* wsync with the fixture's conf.d and both plugin directories, then @args. */
static Run
run_wsync(Fixture *f, const char *first, ...)
{
  g_autoptr(GPtrArray) args = g_ptr_array_new();
  va_list ap;

  va_start(ap, first);
  for (const char *a = first; a != NULL; a = va_arg(ap, const char *))
    g_ptr_array_add(args, (gpointer)a);
  va_end(ap);
  g_ptr_array_add(args, "--conf-dir");
  g_ptr_array_add(args, f->conf);
  g_ptr_array_add(args, "--plugin-dir");
  g_ptr_array_add(args, (gpointer)test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR"));
  g_ptr_array_add(args, "--plugin-dir");
  g_ptr_array_add(args, (gpointer)test_env_dir("WSYNC_TEST_PLUGIN_DIR"));
  g_ptr_array_add(args, NULL);
  return test_run_wsync_argv((const char *const *)args->pdata);
}

/* wsync with @args (which this extends), then the fixture's conf.d and plugins. */
static Run
run_args(Fixture *f, GPtrArray *args)
{
  g_ptr_array_add(args, "--conf-dir");
  g_ptr_array_add(args, f->conf);
  g_ptr_array_add(args, "--plugin-dir");
  g_ptr_array_add(args, (gpointer)test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR"));
  g_ptr_array_add(args, "--plugin-dir");
  g_ptr_array_add(args, (gpointer)test_env_dir("WSYNC_TEST_PLUGIN_DIR"));
  g_ptr_array_add(args, NULL);
  return test_run_wsync_argv((const char *const *)args->pdata);
}

static char *
tiny_config(void)
{
  return g_test_build_filename(G_TEST_DIST, "..", "configs", "tiny-qwen3-moe.json", NULL);
}

static void
fixture_setup(Fixture *f, gconstpointer data)
{
  (void)data;
  f->dir = test_tmpdir();
  f->conf = g_build_filename(f->dir, "conf.d", NULL);
  g_mkdir(f->conf, 0700);
  g_free(test_write(f->conf, "10.conf",
                    "plugin \"hf\" {}\nplugin \"qwen3_moe\" {}\nplugin \"vllm\" {}\nplugin \"broken\" {}\n"));
  f->tiny = g_build_filename(f->dir, "tiny", NULL);
  g_autofree char *config = tiny_config();
  Run r = run_wsync(f, "synth", "--config", config, f->tiny, "--pattern", "index", "-q", NULL);
  if (r.status != 0)
    g_error("synth failed: %s", r.err);
  run_clear(&r);
}

static void
fixture_teardown(Fixture *f, gconstpointer data)
{
  (void)data;
  test_rmtree(f->dir);
  g_free(f->dir);
  g_free(f->conf);
  g_free(f->tiny);
}

static char *
path_in(Fixture *f, const char *name)
{
  return g_build_filename(f->dir, name, NULL);
}

/* ------------------------------------------------------------------ the proofs */

static void
test_overlap_refused(Fixture *f, gconstpointer data)
{
  (void)data;
  Run r = run_wsync(f, "plan", f->tiny, "--target", "broken-overlap", NULL);
  g_assert_cmpint(r.status, ==, 2);
  assert_has(r.err, "converter broken-overlap (plugin broken): elements [0:64] of tensor "
                    "\"model.layers.0.input_layernorm.weight\" of rank 0 are written twice");
  g_assert_cmpstr(r.out, ==, "");
  run_clear(&r);
}

static void
test_gap_refused(Fixture *f, gconstpointer data)
{
  (void)data;
  Run r = run_wsync(f, "plan", f->tiny, "--target", "broken-gap", NULL);
  g_assert_cmpint(r.status, ==, 2);
  assert_has(r.err, "1 of the 65 elements of tensor \"model.layers.0.input_layernorm.weight\" "
                    "of rank 0 are written by no placement or fill");
  run_clear(&r);
}

static void
test_lost_inputs_refused(Fixture *f, gconstpointer data)
{
  (void)data;
  Run r = run_wsync(f, "plan", f->tiny, "--target", "broken-lose", NULL);
  g_assert_cmpint(r.status, ==, 2);
  assert_has(r.err, "input tensors would be lost: the broken-lose layout neither holds nor "
                    "drops them: lm_head.weight, model.embed_tokens.weight");
  run_clear(&r);
}

/* ------------------------------------------------------------------ bad input */

/* Rewrites the tiny checkpoint as a directory without an index, with @extra_name added
 * (when not NULL) and @removed_name left out (when not NULL). */
static char *
edited_checkpoint(Fixture *f, const char *removed_name, const char *extra_name)
{
  g_autofree char *src = g_build_filename(f->tiny, "model-00001-of-00001.safetensors", NULL);
  char *dir = path_in(f, "edited");
  g_autofree char *dst = g_build_filename(dir, "model.safetensors", NULL);
  g_autofree char *cfg_from = g_build_filename(f->tiny, "config.json", NULL);
  g_autofree char *cfg_to = g_build_filename(dir, "config.json", NULL);
  GError *error = NULL;

  g_mkdir(dir, 0700);
  test_copy(cfg_from, cfg_to);
  g_autoptr(WsyncSafetensors) in = wsync_safetensors_open(src, &error);
  g_assert_no_error(error);
  g_autoptr(WsyncSafetensorsWriter) w = wsync_safetensors_writer_new();
  for (guint i = 0; i < wsync_safetensors_n_tensors(in); i++) {
    const WsyncTensor *t = wsync_safetensors_tensor(in, i);
    if (removed_name && strcmp(t->name, removed_name) == 0)
      continue;
    g_assert_true(wsync_safetensors_writer_add(w, t->name, t->dtype, t->ndim, t->shape, &error));
  }
  guint64 shape[] = {4};
  if (extra_name)
    g_assert_true(wsync_safetensors_writer_add(w, extra_name, WSYNC_DTYPE_F32, 1, shape, &error));
  g_assert_true(wsync_safetensors_writer_begin(w, dst, &error));
  for (guint i = 0; i < wsync_safetensors_n_tensors(in); i++) {
    const WsyncTensor *t = wsync_safetensors_tensor(in, i);
    if (removed_name && strcmp(t->name, removed_name) == 0)
      continue;
    g_assert_true(wsync_safetensors_writer_pwrite(w, t->name, 0, t->data, t->nbytes, &error));
  }
  if (extra_name) {
    guint8 zero[16] = {0};
    g_assert_true(wsync_safetensors_writer_pwrite(w, extra_name, 0, zero, 16, &error));
  }
  g_assert_true(wsync_safetensors_writer_finish(w, &error));
  g_assert_no_error(error);
  return dir;
}

static void
test_unmapped_input_refused(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *dir = edited_checkpoint(f, NULL, "model.layers.0.mystery.weight");
  Run r = run_wsync(f, "plan", dir, "--target", "vllm", NULL);
  g_assert_cmpint(r.status, ==, 3);
  assert_has(r.err, "1 input tensor no rule of remapper qwen3_moe (plugin qwen3_moe) maps: "
                    "model.layers.0.mystery.weight");
  run_clear(&r);
}

static void
test_drop_rule_consumes(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *dir =
      edited_checkpoint(f, NULL, "model.layers.1.self_attn.rotary_emb.inv_freq");
  Run r = run_wsync(f, "plan", dir, "--target", "vllm", "--tp", "2", NULL);
  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, "input model.layers.1.self_attn.rotary_emb.inv_freq dropped by rule "
                    "rotary-inv-freq\n");
  run_clear(&r);
}

static void
test_missing_tensor_refused(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *dir = edited_checkpoint(f, "model.layers.1.mlp.experts.5.up_proj.weight", NULL);
  g_autofree char *never = path_in(f, "never");
  Run r = run_wsync(f, "convert", dir, never, "--target", "vllm", NULL);
  g_assert_cmpint(r.status, ==, 3);
  assert_has(r.err, "1 tensor the hf layout needs is missing: "
                    "model.layers.1.mlp.experts.5.up_proj.weight");
  g_assert_false(g_file_test(never, G_FILE_TEST_EXISTS));
  run_clear(&r);
}

static void
test_unknown_target(Fixture *f, gconstpointer data)
{
  (void)data;
  Run r = run_wsync(f, "plan", f->tiny, "--target", "tensorrt", NULL);
  g_assert_cmpint(r.status, ==, 2);
  assert_has(r.err, "no loaded plugin provides the target \"tensorrt\"");
  run_clear(&r);
}

/* vllm leaves the experts of vllm-ascend's kernel format to a hook; with no plugin
 * providing it, that format is refused rather than written in the loader layout under
 * its name.  The sharded-state format is the loader layout and needs no hook. */
static void
test_target_needing_a_hook(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *dst = path_in(f, "ascend");
  Run r = run_wsync(f, "convert", f->tiny, dst, "--target", "vllm-ascend", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  test_rmtree(dst);
  r = run_wsync(f, "convert", f->tiny, dst, "--target", "vllm-ascend", "--format", "kernel",
                NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==,
                  "wsync: target vllm-ascend: its routed experts must be put in vLLM-Ascend's "
                  "processed layout by a post-load hook (plugin npu-ascend), and no loaded "
                  "plugin has a hook for it (see wsync plugins)\n");
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
  run_clear(&r);
}

static void
test_unclaimed_model_type(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *config = g_build_filename(f->tiny, "config.json", NULL);
  g_free(test_write(f->tiny, "config.json", "{\"model_type\": \"llama\"}\n"));
  Run r = run_wsync(f, "plan", f->tiny, "--target", "vllm", NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_autofree char *expect =
      g_strdup_printf("wsync: %s: model_type \"llama\" is claimed by no loaded plugin", config);
  g_assert_true(g_str_has_prefix(r.err, expect));
  run_clear(&r);
}

/* ------------------------------------------------------------------ output */

static void
test_existing_dst_untouched_on_failure_replaced_on_success(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *dst = path_in(f, "out");
  /* a previous run's output (wsync replaces only its own output; see test-reliability) */
  Run r = run_wsync(f, "convert", f->tiny, dst, "--target", "hf", "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  g_free(test_write(dst, "marker", "previous run"));

  /* a failing run (bad target layout) leaves DST as it was */
  r = run_wsync(f, "convert", f->tiny, dst, "--target", "broken-gap", NULL);
  g_assert_cmpint(r.status, ==, 2);
  run_clear(&r);
  g_autofree char *marker = g_build_filename(dst, "marker", NULL);
  g_assert_true(g_file_test(marker, G_FILE_TEST_EXISTS));

  r = run_wsync(f, "convert", f->tiny, dst, "--target", "vllm", "--tp", "2", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_autofree char *expect = g_strdup_printf("wrote %s: ", dst);
  g_assert_true(g_str_has_prefix(r.out, expect));
  run_clear(&r);
  g_assert_false(g_file_test(marker, G_FILE_TEST_EXISTS));
  g_autofree char *rank1 = g_build_filename(dst, "model-rank-1-part-0.safetensors", NULL);
  g_assert_true(g_file_test(rank1, G_FILE_TEST_IS_REGULAR));
  /* no temporary directory is left next to DST */
  g_autoptr(GDir) d = g_dir_open(f->dir, 0, NULL);
  const char *name;
  while ((name = g_dir_read_name(d)) != NULL)
    g_assert_false(g_str_has_prefix(name, ".out.wsync-"));
}

static void
test_part_size_splits_files(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *dst = path_in(f, "parts");
  Run r = run_wsync(f, "convert", f->tiny, dst, "--target", "hf", "--part-size", "40000", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  GError *error = NULL;
  g_autoptr(WsyncCheckpoint) ck = wsync_checkpoint_open(dst, &error);
  g_assert_no_error(error);
  g_assert_cmpuint(wsync_checkpoint_n_files(ck), >, 5);
  for (guint i = 0; i < wsync_checkpoint_n_files(ck); i++) {
    const WsyncSafetensors *st = wsync_checkpoint_file(ck, i);
    guint64 bytes = 0;
    for (guint t = 0; t < wsync_safetensors_n_tensors(st); t++)
      bytes += wsync_safetensors_tensor(st, t)->nbytes;
    /* over the limit only when one tensor alone is larger (a tensor is never split) */
    if (bytes > 40000)
      g_assert_cmpuint(wsync_safetensors_n_tensors(st), ==, 1);
    g_autofree char *base = g_path_get_basename(wsync_safetensors_path(st));
    g_autofree char *expect = g_strdup_printf("model-%05u-of-%05u.safetensors", i + 1,
                                              wsync_checkpoint_n_files(ck));
    g_assert_cmpstr(base, ==, expect);
  }
  r = run_wsync(f, "verify", f->tiny, dst, NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
}

static void
test_threads_give_identical_bytes(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *one = path_in(f, "one");
  g_autofree char *four = path_in(f, "four");
  Run r = run_wsync(f, "convert", f->tiny, one, "--target", "vllm", "--tp", "2", "--threads", "1",
                    NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  r = run_wsync(f, "convert", f->tiny, four, "--target", "vllm", "--tp", "2", "--threads", "4",
                NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  for (int rank = 0; rank < 2; rank++) {
    g_autofree char *name = g_strdup_printf("model-rank-%d-part-0.safetensors", rank);
    g_autofree char *a = g_build_filename(one, name, NULL);
    g_autofree char *b = g_build_filename(four, name, NULL);
    g_autofree char *da = NULL, *db = NULL;
    gsize la = 0, lb = 0;
    g_assert_true(g_file_get_contents(a, &da, &la, NULL));
    g_assert_true(g_file_get_contents(b, &db, &lb, NULL));
    g_assert_cmpmem(da, la, db, lb);
  }
}

/* The bytes of every file under @a and @b are equal, and they hold the same names. */
static void
assert_same_files(const char *a, const char *b)
{
  g_autoptr(GDir) d = g_dir_open(a, 0, NULL);
  const char *name;
  guint n = 0, m = 0;

  g_assert_nonnull(d);
  while ((name = g_dir_read_name(d)) != NULL) {
    g_autofree char *pa = g_build_filename(a, name, NULL);
    g_autofree char *pb = g_build_filename(b, name, NULL);
    g_autofree char *da = NULL, *db = NULL;
    gsize la = 0, lb = 0;
    g_assert_true(g_file_get_contents(pa, &da, &la, NULL));
    if (!g_file_get_contents(pb, &db, &lb, NULL))
      g_error("%s has %s, %s has not", a, name, b);
    if (la != lb || memcmp(da, db, la) != 0)
      g_error("%s differs from %s", pa, pb);
    n++;
  }
  g_autoptr(GDir) e = g_dir_open(b, 0, NULL);
  while ((name = g_dir_read_name(e)) != NULL)
    m++;
  g_assert_cmpuint(n, ==, m);
}

/* The executor writes each output tensor in slabs of at most 16 MiB / threads bytes.
 * With 256 threads, slabs of 64 KiB cut the tensors of a model whose experts are 384
 * KiB: inside an expert of w13 (between its gate and its up rows), across the
 * transposed experts of vllm-ascend's kernel layout, through the padding rows of the
 * vocabulary (a fill); and the files are byte for byte those of one slab per tensor
 * (--threads 1), at tp 1 and tp 4, read back to hf, and in an output split in parts. */
static void
test_slabs_give_identical_bytes(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *config =
      g_test_build_filename(G_TEST_DIST, "data", "configs", "medium-qwen3-moe.json", NULL);
  g_autofree char *src = path_in(f, "medium");
  g_free(test_write(f->conf, "40.conf", "plugin \"npu-ascend\" {}\n"));
  Run r = run_wsync(f, "synth", "--config", config, src, "--pattern", "index", "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  static const char *const targets[][7] = {
      {"--target", "vllm", "--tp", "1", NULL},
      {"--target", "vllm", "--tp", "4", NULL},
      {"--target", "vllm-ascend", "--format", "kernel", "--tp", "1", NULL},
      {"--target", "vllm-ascend", "--format", "kernel", "--tp", "2", NULL},
      {"--target", "hf", "--part-size", "300000", NULL},
  };
  for (guint t = 0; t < G_N_ELEMENTS(targets); t++) {
    g_autofree char *one = g_strdup_printf("%s/one-%u", f->dir, t);
    g_autofree char *many = g_strdup_printf("%s/many-%u", f->dir, t);
    g_autofree char *back = g_strdup_printf("%s/back-%u", f->dir, t);
    g_autofree char *back1 = g_strdup_printf("%s/back1-%u", f->dir, t);
    for (int k = 0; k < 2; k++) {
      g_autoptr(GPtrArray) args = g_ptr_array_new();
      g_ptr_array_add(args, "convert");
      g_ptr_array_add(args, src);
      g_ptr_array_add(args, k == 0 ? one : many);
      for (guint i = 0; targets[t][i] != NULL; i++)
        g_ptr_array_add(args, (gpointer)targets[t][i]);
      g_ptr_array_add(args, "--threads");
      g_ptr_array_add(args, k == 0 ? "1" : "256");
      r = run_args(f, args);
      g_assert_cmpint(r.status, ==, 0);
      run_clear(&r);
    }
    assert_same_files(one, many);
    /* and back: the gathers of the read-back cut into slabs too */
    r = run_wsync(f, "convert", many, back, "--target", "hf", "--threads", "256", NULL);
    g_assert_cmpint(r.status, ==, 0);
    run_clear(&r);
    r = run_wsync(f, "convert", many, back1, "--target", "hf", "--threads", "1", NULL);
    g_assert_cmpint(r.status, ==, 0);
    run_clear(&r);
    assert_same_files(back1, back);
    r = run_wsync(f, "verify", src, back, NULL);
    g_assert_cmpint(r.status, ==, 0);
    run_clear(&r);
  }
}

static void
test_sync_section_defaults(Fixture *f, gconstpointer data)
{
  (void)data;
  g_free(test_write(f->conf, "20-sync.conf", "sync {\n  target = \"vllm\"\n  tp = 2\n}\n"));
  Run r = run_wsync(f, "plan", f->tiny, "--json", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_autoptr(JsonParser) parser = json_parser_new();
  g_assert_true(json_parser_load_from_data(parser, r.out, -1, NULL));
  JsonObject *root = json_node_get_object(json_parser_get_root(parser));
  g_assert_cmpstr(json_object_get_string_member(root, "target"), ==, "vllm");
  g_assert_cmpint(json_object_get_int_member(root, "tp"), ==, 2);
  run_clear(&r);
  /* the command line wins */
  r = run_wsync(f, "plan", f->tiny, "--json", "--tp", "4", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_autoptr(JsonParser) p2 = json_parser_new();
  g_assert_true(json_parser_load_from_data(p2, r.out, -1, NULL));
  g_assert_cmpint(json_object_get_int_member(json_node_get_object(json_parser_get_root(p2)), "tp"),
                  ==, 4);
  run_clear(&r);
}

static void
test_plan_json_names_sources(Fixture *f, gconstpointer data)
{
  (void)data;
  Run r = run_wsync(f, "plan", f->tiny, "--target", "vllm", "--tp", "2", "--rank", "1", "--json",
                    NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_autoptr(JsonParser) parser = json_parser_new();
  g_assert_true(json_parser_load_from_data(parser, r.out, -1, NULL));
  JsonObject *root = json_node_get_object(json_parser_get_root(parser));
  JsonArray *ranks = json_object_get_array_member(root, "ranks");
  g_assert_cmpuint(json_array_get_length(ranks), ==, 1);
  JsonObject *rank = json_array_get_object_element(ranks, 0);
  g_assert_cmpint(json_object_get_int_member(rank, "rank"), ==, 1);
  JsonArray *tensors = json_object_get_array_member(rank, "tensors");
  JsonObject *qkv = NULL;
  for (guint i = 0; i < json_array_get_length(tensors); i++) {
    JsonObject *t = json_array_get_object_element(tensors, i);
    if (strcmp(json_object_get_string_member(t, "name"),
               "model.layers.0.self_attn.qkv_proj.weight") == 0)
      qkv = t;
  }
  g_assert_nonnull(qkv);
  g_assert_cmpstr(json_object_get_string_member(qkv, "file"), ==,
                  "model-rank-1-part-0.safetensors");
  JsonArray *ops = json_object_get_array_member(qkv, "ops");
  g_assert_cmpuint(json_array_get_length(ops), ==, 3);
  /* rank 1 of tp 2: q rows 32..64, k rows 16..32 of the checkpoint */
  JsonObject *q = json_array_get_object_element(ops, 0);
  g_assert_cmpstr(json_object_get_string_member(q, "from"), ==,
                  "model.layers.0.self_attn.q_proj.weight");
  JsonObject *from_box = json_object_get_object_member(q, "from_box");
  g_assert_cmpint(json_array_get_int_element(json_object_get_array_member(from_box, "offset"), 0),
                  ==, 32);
  JsonObject *k = json_array_get_object_element(ops, 1);
  JsonObject *k_to = json_object_get_object_member(k, "to");
  g_assert_cmpint(json_array_get_int_element(json_object_get_array_member(k_to, "offset"), 0), ==,
                  32);
  JsonObject *k_from = json_object_get_object_member(k, "from_box");
  g_assert_cmpint(json_array_get_int_element(json_object_get_array_member(k_from, "offset"), 0),
                  ==, 16);
  run_clear(&r);
}

static void
test_config_patchers_and_other_files(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *dst = path_in(f, "patched");
  g_autofree char *same = path_in(f, "same");
  g_free(test_write(f->tiny, "tokenizer.json", "{\"tok\": 1}"));
  g_free(test_write(f->tiny, "generation_config.json", "{\"gen\": 2}"));
  g_free(test_write(f->conf, "50.conf", "plugin \"rope-compat\" {\n  rope-format = \"keep\"\n}\n"));

  /* keep changes nothing: config.json is copied byte for byte */
  Run r = run_wsync(f, "convert", f->tiny, same, "--target", "vllm", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  g_autofree char *src_cfg = g_build_filename(f->tiny, "config.json", NULL);
  g_autofree char *same_cfg = g_build_filename(same, "config.json", NULL);
  g_autofree char *a = NULL, *b = NULL;
  g_assert_true(g_file_get_contents(src_cfg, &a, NULL, NULL));
  g_assert_true(g_file_get_contents(same_cfg, &b, NULL, NULL));
  g_assert_cmpstr(a, ==, b);
  g_autofree char *tok = g_build_filename(same, "tokenizer.json", NULL);
  g_autofree char *tok_text = NULL;
  g_assert_true(g_file_get_contents(tok, &tok_text, NULL, NULL));
  g_assert_cmpstr(tok_text, ==, "{\"tok\": 1}");
  g_autofree char *gen = g_build_filename(same, "generation_config.json", NULL);
  g_assert_true(g_file_test(gen, G_FILE_TEST_IS_REGULAR));
  g_autofree char *index = g_build_filename(same, WSYNC_INDEX_NAME, NULL);
  g_assert_false(g_file_test(index, G_FILE_TEST_EXISTS)); /* rank files have no index */

  /* transformers5 rewrites the RoPE keys in the written config.json */
  g_free(test_write(f->conf, "50.conf",
                    "plugin \"rope-compat\" {\n  rope-format = \"transformers5\"\n}\n"));
  r = run_wsync(f, "convert", f->tiny, dst, "--target", "vllm", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  g_autofree char *cfg = g_build_filename(dst, "config.json", NULL);
  g_autofree char *text = NULL;
  g_assert_true(g_file_get_contents(cfg, &text, NULL, NULL));
  assert_has(text, "\"rope_parameters\"");
  g_assert_null(strstr(text, "\"rope_scaling\""));
}

/* @file (a safetensors file) as FSDP2 over 4 ranks saves it, in @out/a (DCP format A)
 * and @out/b (format B). */
static void
shard_file(const char *file, const char *out)
{
  g_autofree char *script = g_test_build_filename(G_TEST_DIST, "make-dcp-fixtures.py", NULL);
  const char *argv[] = {"python3", script, "--shard", file, out, NULL};
  g_autofree char *err = NULL;
  int wait_status = 0;
  GError *error = NULL;

  g_spawn_sync(NULL, (char **)argv, NULL, G_SPAWN_SEARCH_PATH, NULL, NULL, NULL, &err,
               &wait_status, &error);
  g_assert_no_error(error);
  if (!g_spawn_check_wait_status(wait_status, NULL))
    g_error("make-dcp-fixtures.py --shard failed: %s", err);
}

/* The lines of @text that start with @prefix, joined. */
static char *
lines_starting(const char *text, const char *prefix)
{
  g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
  GString *s = g_string_new(NULL);
  for (guint i = 0; lines[i] != NULL; i++)
    if (g_str_has_prefix(lines[i], prefix))
      g_string_append_printf(s, "%s\n", lines[i]);
  return g_string_free(s, FALSE);
}

/* A tensor a rule drops, saved in 4 chunks (one per rank): plan names it once, in the
 * text and in --json (it printed one line per chunk, 4 identical lines). */
static void
test_sharded_drop_named_once(Fixture *f, gconstpointer data)
{
  (void)data;
  const char *name = "model.layers.1.self_attn.rotary_emb.inv_freq";
  g_autofree char *dir = edited_checkpoint(f, NULL, name);
  g_autofree char *file = g_build_filename(dir, "model.safetensors", NULL);
  g_autofree char *sharded = path_in(f, "sharded-drop");
  g_autofree char *src = g_build_filename(sharded, "b", NULL);
  g_autofree char *cfg_from = g_build_filename(f->tiny, "config.json", NULL);
  g_autofree char *cfg_to = g_build_filename(src, "config.json", NULL);

  shard_file(file, sharded);
  test_copy(cfg_from, cfg_to);
  Run r = run_wsync(f, "plan", src, "--target", "vllm", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_autofree char *inputs = lines_starting(r.out, "input ");
  g_assert_cmpstr(inputs, ==,
                  "input model.layers.1.self_attn.rotary_emb.inv_freq dropped by rule "
                  "rotary-inv-freq\n");
  run_clear(&r);

  r = run_wsync(f, "plan", src, "--target", "vllm", "--json", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_autoptr(JsonParser) parser = json_parser_new();
  g_assert_true(json_parser_load_from_data(parser, r.out, -1, NULL));
  JsonObject *root = json_node_get_object(json_parser_get_root(parser));
  g_autofree char *dropped =
      json_to_string(json_object_get_member(root, "dropped_inputs"), FALSE);
  g_assert_cmpstr(dropped, ==,
                  "[{\"tensor\":\"model.layers.1.self_attn.rotary_emb.inv_freq\","
                  "\"rule\":\"rotary-inv-freq\"}]");
  run_clear(&r);
}

static gint
compare_names(gconstpointer a, gconstpointer b)
{
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The names of the files in @dir, sorted, one per line. */
static char *
dir_listing(const char *dir)
{
  g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
  g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
  const char *name;

  g_assert_nonnull(d);
  while ((name = g_dir_read_name(d)) != NULL)
    g_ptr_array_add(names, g_strdup(name));
  g_ptr_array_sort(names, compare_names);
  GString *s = g_string_new(NULL);
  for (guint i = 0; i < names->len; i++)
    g_string_append_printf(s, "%s\n", (const char *)names->pdata[i]);
  return g_string_free(s, FALSE);
}

/* A trainer's step directory: the DCP checkpoint in a subdirectory (accelerate's
 * pytorch_model_fsdp_0/), config.json, the tokenizer and the generation config beside
 * it (docs/dcp.md §3, "Where config.json is").  convert, plan and merge take config.json
 * and the companion files from there and say so; they refused (plan, convert: "SRC/
 * config.json: no such file", exit 3) or wrote no config.json (merge).  With
 * config.json in neither directory, the refusal names both. */
static void
test_sharded_config_above(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *file = g_build_filename(f->tiny, "model-00001-of-00001.safetensors", NULL);
  g_autofree char *step = path_in(f, "checkpoint-500");
  g_autofree char *src = g_build_filename(step, "b", NULL);
  g_autofree char *cfg_from = g_build_filename(f->tiny, "config.json", NULL);
  g_autofree char *cfg_to = g_build_filename(step, "config.json", NULL);
  g_autofree char *converted = path_in(f, "converted");
  g_autofree char *merged = path_in(f, "merged");
  g_autofree char *text = NULL, *copied = NULL;

  shard_file(file, step);
  test_copy(cfg_from, cfg_to);
  g_free(test_write(step, "tokenizer.json", "{\"model\": \"step\"}\n"));
  g_free(test_write(step, "generation_config.json", "{\"temperature\": 0.6}\n"));
  g_free(test_write(step, "trainer_state.json", "{\"global_step\": 500}\n"));
  g_autofree char *note = g_strdup_printf(
      "note: config.json from %s, the directory that holds the sharded checkpoint (which "
      "has none); the companion files (tokenizer, generation config) from there too\n",
      cfg_to);

  Run r = run_wsync(f, "plan", src, "--target", "vllm", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_autofree char *notes = lines_starting(r.out, "note: config.json");
  g_assert_cmpstr(notes, ==, note);
  run_clear(&r);
  r = run_wsync(f, "plan", src, "--target", "vllm", "--json", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_autoptr(JsonParser) parser = json_parser_new();
  g_assert_true(json_parser_load_from_data(parser, r.out, -1, NULL));
  JsonObject *root = json_node_get_object(json_parser_get_root(parser));
  g_assert_cmpstr(json_object_get_string_member(root, "config"), ==, cfg_to);
  run_clear(&r);
  /* SRC named "STEP/b/." or "." from inside it: the directory above is STEP (its real
   * path), not the name's dirname, STEP/b itself (before: refused, "neither beside the
   * shards nor in ., the directory that holds them", exit 3) */
  g_autofree char *dotted = g_strconcat(src, G_DIR_SEPARATOR_S ".", NULL);
  g_autofree char *real_step = realpath(step, NULL);
  g_autofree char *real_cfg = g_build_filename(real_step, "config.json", NULL);
  g_autofree char *real_note = g_strdup_printf(
      "note: config.json from %s, the directory that holds the sharded checkpoint (which "
      "has none); the companion files (tokenizer, generation config) from there too\n",
      real_cfg);
  r = run_wsync(f, "plan", dotted, "--target", "vllm", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_autofree char *dotted_notes = lines_starting(r.out, "note: config.json");
  g_assert_cmpstr(dotted_notes, ==, real_note);
  run_clear(&r);

  r = run_wsync(f, "convert", src, converted, "--target", "vllm", NULL);
  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, note);
  run_clear(&r);
  g_autofree char *listed = dir_listing(converted);
  g_assert_cmpstr(listed, ==,
                  ".wsync-output\nconfig.json\ngeneration_config.json\n"
                  "model-rank-0-part-0.safetensors\ntokenizer.json\n");
  g_autofree char *cfg_out = g_build_filename(converted, "config.json", NULL);
  g_assert_true(g_file_get_contents(cfg_from, &text, NULL, NULL));
  g_assert_true(g_file_get_contents(cfg_out, &copied, NULL, NULL));
  g_assert_cmpstr(copied, ==, text);

  r = run_wsync(f, "merge", src, merged, NULL);
  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, note);
  run_clear(&r);
  g_autofree char *merged_listed = dir_listing(merged);
  g_assert_cmpstr(merged_listed, ==,
                  ".wsync-output\nconfig.json\ngeneration_config.json\n"
                  "model-00001-of-00001.safetensors\nmodel.safetensors.index.json\n"
                  "tokenizer.json\n");
  r = run_wsync(f, "verify", f->tiny, merged, NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);

  g_assert_cmpint(g_remove(cfg_to), ==, 0);
  g_autofree char *never = path_in(f, "never");
  r = run_wsync(f, "convert", src, never, "--target", "vllm", NULL);
  g_assert_cmpint(r.status, ==, 3);
  g_autofree char *want = g_strdup_printf(
      "wsync: %s: no config.json, neither beside the shards nor in %s, the directory that "
      "holds them: name the model's directory (its config.json and tokenizer) with --config "
      "DIR, or put its config.json in one of the two\n",
      src, step);
  g_assert_cmpstr(r.err, ==, want);
  g_assert_false(g_file_test(never, G_FILE_TEST_EXISTS));
  run_clear(&r);
  r = run_wsync(f, "plan", dotted, "--target", "vllm", NULL);
  g_assert_cmpint(r.status, ==, 3);
  g_autofree char *dotted_want = g_strdup_printf(
      "wsync: %s: no config.json, neither beside the shards nor in %s, the directory that "
      "holds them: name the model's directory (its config.json and tokenizer) with --config "
      "DIR, or put its config.json in one of the two\n",
      dotted, real_step);
  g_assert_cmpstr(r.err, ==, dotted_want);
  run_clear(&r);
}

/* --config DIR: a DCP checkpoint saved with no config.json anywhere (HF Trainer's
 * SHARDED_STATE_DICT, torchtitan; docs/dcp.md §3) and the base model's directory
 * elsewhere.  config.json comes from DIR through the config patchers (rope-compat's
 * transformers5 rewrites rope_scaling), the tokenizer and generation config from DIR and
 * nothing else of it; the note and --json name DIR's config.json.  A DIR without
 * config.json, a file not named config.json and another model's config are refused
 * naming them.  Before: "--config" was an unknown option (exit 2). */
static void
test_config_option(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *file = g_build_filename(f->tiny, "model-00001-of-00001.safetensors", NULL);
  g_autofree char *step = path_in(f, "step");
  g_autofree char *src = g_build_filename(step, "b", NULL);
  g_autofree char *base = path_in(f, "base");
  g_autofree char *other = path_in(f, "other");
  g_autofree char *tiny_cfg = g_build_filename(f->tiny, "config.json", NULL);
  g_autofree char *base_cfg = g_build_filename(base, "config.json", NULL);
  g_autofree char *converted = path_in(f, "converted");
  g_autofree char *never = path_in(f, "never");

  shard_file(file, step);
  g_mkdir(base, 0700);
  g_mkdir(other, 0700);
  test_copy(tiny_cfg, base_cfg);
  g_free(test_write(base, "tokenizer.json", "{\"model\": \"base\"}\n"));
  g_free(test_write(base, "generation_config.json", "{\"temperature\": 0.6}\n"));
  g_free(test_write(base, "model.safetensors", "not copied: weights of the base model\n"));
  g_free(test_write(f->conf, "50.conf",
                    "plugin \"rope-compat\" {\n  rope-format = \"transformers5\"\n}\n"));
  g_autofree char *note = g_strdup_printf(
      "note: config.json from %s, as --config names it; the companion files (tokenizer, "
      "generation config) from there too, none from the source\n",
      base_cfg);

  Run r = run_wsync(f, "plan", src, "--target", "vllm", "--config", base, NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_autofree char *notes = lines_starting(r.out, "note: config.json");
  g_assert_cmpstr(notes, ==, note);
  run_clear(&r);
  /* the file itself names the same directory */
  r = run_wsync(f, "plan", src, "--target", "vllm", "--config", base_cfg, "--json", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_autoptr(JsonParser) parser = json_parser_new();
  g_assert_true(json_parser_load_from_data(parser, r.out, -1, NULL));
  JsonObject *root = json_node_get_object(json_parser_get_root(parser));
  g_assert_cmpstr(json_object_get_string_member(root, "config"), ==, base_cfg);
  run_clear(&r);

  r = run_wsync(f, "convert", src, converted, "--target", "vllm", "--config", base, NULL);
  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, note);
  run_clear(&r);
  g_autofree char *listed = dir_listing(converted);
  g_assert_cmpstr(listed, ==,
                  ".wsync-output\nconfig.json\ngeneration_config.json\n"
                  "model-rank-0-part-0.safetensors\ntokenizer.json\n");
  g_autofree char *cfg_out = g_build_filename(converted, "config.json", NULL);
  g_autofree char *tok_out = g_build_filename(converted, "tokenizer.json", NULL);
  g_autofree char *text = NULL, *tok = NULL;
  g_assert_true(g_file_get_contents(cfg_out, &text, NULL, NULL));
  assert_has(text, "\"rope_parameters\"");
  g_assert_null(strstr(text, "\"rope_scaling\""));
  g_assert_true(g_file_get_contents(tok_out, &tok, NULL, NULL));
  g_assert_cmpstr(tok, ==, "{\"model\": \"base\"}\n");

  /* refusals name the path and the problem; nothing is written */
  r = run_wsync(f, "convert", src, never, "--target", "vllm", "--config", other, NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_autofree char *no_config = g_strdup_printf(
      "wsync: --config %s: the directory holds no config.json; name the directory of the "
      "model's config.json (and tokenizer), or that file\n",
      other);
  g_assert_cmpstr(r.err, ==, no_config);
  run_clear(&r);
  g_autofree char *base_tok = g_build_filename(base, "tokenizer.json", NULL);
  r = run_wsync(f, "merge", src, never, "--config", base_tok, NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_autofree char *not_config = g_strdup_printf(
      "wsync: --config %s: neither a directory nor a file named config.json; name the "
      "directory of the model's config.json (its companion files, the tokenizer, are copied "
      "from there), or that config.json\n",
      base_tok);
  g_assert_cmpstr(r.err, ==, not_config);
  run_clear(&r);
  g_autofree char *other_cfg = g_build_filename(other, "config.json", NULL);
  g_autofree char *eight = g_test_build_filename(G_TEST_DIST, "..", "configs",
                                                 "tiny-qwen3-moe-8heads.json", NULL);
  test_copy(eight, other_cfg);
  r = run_wsync(f, "convert", src, never, "--target", "vllm", "--config", other, NULL);
  g_assert_cmpint(r.status, ==, 3);
  g_autofree char *mismatch = g_strdup_printf(
      "wsync: %s: tensor \"model.layers.0.self_attn.q_proj.weight\" has shape [64, 64] but "
      "the config says [128, 64] (converter hf (plugin hf)); the config is %s, as --config "
      "names it\n",
      src, other_cfg);
  g_assert_cmpstr(r.err, ==, mismatch);
  run_clear(&r);
  g_assert_false(g_file_test(never, G_FILE_TEST_EXISTS));
}

/* --config DIR of a plain checkpoint (a bare save_file(model.state_dict())) beside a
 * wrong config.json and tokenizer: DIR's config.json wins and only DIR's companion files
 * are copied.  Before: "--config" was an unknown option (exit 2); without it, the
 * source's config.json was read and refused. */
static void
test_config_option_plain(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *bare = path_in(f, "bare");
  g_autofree char *base = path_in(f, "base");
  g_autofree char *file = g_build_filename(f->tiny, "model-00001-of-00001.safetensors", NULL);
  g_autofree char *bare_file = g_build_filename(bare, "model.safetensors", NULL);
  g_autofree char *tiny_cfg = g_build_filename(f->tiny, "config.json", NULL);
  g_autofree char *base_cfg = g_build_filename(base, "config.json", NULL);
  g_autofree char *converted = path_in(f, "converted");

  g_mkdir(bare, 0700);
  g_mkdir(base, 0700);
  g_autofree char *eight = g_test_build_filename(G_TEST_DIST, "..", "configs",
                                                 "tiny-qwen3-moe-8heads.json", NULL);
  g_autofree char *bare_cfg = g_build_filename(bare, "config.json", NULL);
  test_copy(file, bare_file);
  test_copy(eight, bare_cfg);
  g_free(test_write(bare, "tokenizer.json", "{\"model\": \"not this one\"}\n"));
  test_copy(tiny_cfg, base_cfg);
  g_free(test_write(base, "tokenizer_config.json", "{\"chat_template\": \"x\"}\n"));
  Run r = run_wsync(f, "convert", bare, converted, "--target", "vllm", "--config", base, "-q",
                    NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.err, ==, "");
  run_clear(&r);
  g_autofree char *listed = dir_listing(converted);
  g_assert_cmpstr(listed, ==,
                  ".wsync-output\nconfig.json\nmodel-rank-0-part-0.safetensors\n"
                  "tokenizer_config.json\n");
  /* the same rank file as from the checkpoint with its config */
  g_autofree char *reference = path_in(f, "reference");
  r = run_wsync(f, "convert", f->tiny, reference, "--target", "vllm", "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  r = run_wsync(f, "verify", reference, converted, NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  /* SRC the file: DIR's companion files too (without --config a file's directory gives
   * only config.json) */
  g_autofree char *from_file = path_in(f, "from-file");
  r = run_wsync(f, "convert", bare_file, from_file, "--target", "vllm", "--config", base, "-q",
                NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  g_autofree char *file_listed = dir_listing(from_file);
  g_assert_cmpstr(file_listed, ==, listed);
}

/* A sharded training checkpoint (FSDP2 over 4 ranks, uneven and empty shards, in both
 * DCP formats) of the tiny model: merge gives back the checkpoint, and convert and plan
 * read it directly, consolidating on the fly, into the same rank files as from the
 * plain checkpoint. */
static void
test_sharded_source(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *file = g_build_filename(f->tiny, "model-00001-of-00001.safetensors", NULL);
  g_autofree char *sharded = path_in(f, "sharded");
  g_autofree char *reference = path_in(f, "reference");

  shard_file(file, sharded);
  Run r = run_wsync(f, "convert", f->tiny, reference, "--target", "vllm", "--tp", "2", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);

  for (const char *const *format = (const char *const[]){"a", "b", NULL}; *format; format++) {
    g_autofree char *src = g_build_filename(sharded, *format, NULL);
    g_autofree char *cfg_from = g_build_filename(f->tiny, "config.json", NULL);
    g_autofree char *cfg_to = g_build_filename(src, "config.json", NULL);
    g_autofree char *merged = g_strdup_printf("%s/merged-%s", f->dir, *format);
    g_autofree char *ranks = g_strdup_printf("%s/ranks-%s", f->dir, *format);
    test_copy(cfg_from, cfg_to);

    r = run_wsync(f, "merge", src, merged, NULL);
    g_assert_cmpint(r.status, ==, 0);
    run_clear(&r);
    r = run_wsync(f, "verify", f->tiny, merged, NULL);
    g_assert_cmpstr(r.out, ==, "equal: 69 tensors, 325376 bytes\n");
    run_clear(&r);

    r = run_wsync(f, "plan", src, "--target", "vllm", "--tp", "2", "--json", NULL);
    g_assert_cmpint(r.status, ==, 0);
    assert_has(r.out, "\"source_layout\" : \"hf\"");
    run_clear(&r);
    r = run_wsync(f, "convert", src, ranks, "--target", "vllm", "--tp", "2", NULL);
    g_assert_cmpint(r.status, ==, 0);
    run_clear(&r);
    for (int rank = 0; rank < 2; rank++) {
      g_autofree char *name = g_strdup_printf("model-rank-%d-part-0.safetensors", rank);
      g_autofree char *a = g_build_filename(reference, name, NULL);
      g_autofree char *b = g_build_filename(ranks, name, NULL);
      r = run_wsync(f, "verify", a, b, NULL);
      g_assert_cmpint(r.status, ==, 0);
      run_clear(&r);
    }
  }

  /* merge refuses what is not sharded */
  r = run_wsync(f, "merge", f->tiny, reference, NULL);
  g_assert_cmpint(r.status, ==, 3);
  assert_has(r.err, "not a sharded checkpoint");
  run_clear(&r);

  /* a SRC that does not exist is the I/O error convert and inspect give, not bad input */
  g_autofree char *missing = path_in(f, "no-such-checkpoint");
  g_autofree char *msg = g_strdup_printf("wsync: cannot open %s: No such file or directory\n",
                                         missing);
  r = run_wsync(f, "merge", missing, reference, NULL);
  g_assert_cmpint(r.status, ==, 4);
  g_assert_cmpstr(r.err, ==, msg);
  run_clear(&r);
  r = run_wsync(f, "convert", missing, reference, "--target", "hf", NULL);
  g_assert_cmpint(r.status, ==, 4);
  g_assert_cmpstr(r.err, ==, msg);
  run_clear(&r);
}

/* --tp or --ep above 1 for a target of one rank (hf) was dropped without a word: the
 * plan said "tp 1" and convert wrote one checkpoint.  Refused now, as --format is for a
 * target without formats; conf.d's sync sizes, a deployment's for every target, still
 * apply only to the targets with ranks. */
static void
test_parallel_sizes_of_a_target_without_ranks(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *dst = path_in(f, "whole");
  Run r = run_wsync(f, "convert", f->tiny, dst, "--target", "hf", "--tp", "2", NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==, "wsync: --tp 2: target hf has no ranks to split into (it writes "
                             "one checkpoint, whole)\n");
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
  run_clear(&r);
  r = run_wsync(f, "plan", f->tiny, "--target", "hf", "--ep", "4", NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==, "wsync: --ep 4: target hf has no ranks to split into (it writes "
                             "one checkpoint, whole)\n");
  run_clear(&r);
  r = run_wsync(f, "plan", f->tiny, "--target", "hf", "--tp", "1", "--ep", "1", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);

  g_free(test_write(f->conf, "20.conf", "sync {\n  tp = 2\n}\n"));
  r = run_wsync(f, "plan", f->tiny, "--target", "hf", NULL);
  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, "target hf, tp 1, ep 1, 1 rank\n");
  run_clear(&r);
  r = run_wsync(f, "plan", f->tiny, "--target", "vllm", NULL);
  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, ", tp 2, ep 1, 2 ranks\n");
  run_clear(&r);
}

/* A target or format conf.d's sync section sets that is refused names FILE:LINE where
 * it is set, as conf.d's other errors do: the target was "no loaded plugin provides the
 * target", which named no file; the format "conf.d sync { } format ...", no file. */
static void
test_sync_section_refusals_name_the_place(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *conf = g_build_filename(f->conf, "20.conf", NULL);
  g_free(test_write(f->conf, "20.conf", "# the deployment\nsync {\n  target = \"tensorrt\"\n}\n"));
  g_autofree char *want = g_strdup_printf(
      "wsync: %s:3: sync target \"tensorrt\": no loaded plugin provides it (wsync plugins "
      "lists the targets; --target overrides it)\n",
      conf);
  Run r = run_wsync(f, "plan", f->tiny, NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==, want);
  run_clear(&r);
  r = run_wsync(f, "plan", f->tiny, "--target", "vllm", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);

  g_free(test_write(f->conf, "20.conf", "sync {\n  target = \"vllm\"\n\n  format = \"fp8\"\n}\n"));
  g_autofree char *format = g_strdup_printf(
      "wsync: %s:4: sync format \"fp8\" is not one of target vllm's formats (sharded-state, "
      "kernel)\n",
      conf);
  r = run_wsync(f, "plan", f->tiny, NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==, format);
  run_clear(&r);
  /* a later file's value, and its place, win */
  g_free(test_write(f->conf, "30.conf", "sync {\n  format = \"kernel\"\n}\n"));
  r = run_wsync(f, "plan", f->tiny, NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  g_free(test_write(f->conf, "30.conf", "\nsync {\n  format = \"int4\"\n}\n"));
  g_autofree char *later = g_build_filename(f->conf, "30.conf", NULL);
  g_autofree char *int4 = g_strdup_printf(
      "wsync: %s:3: sync format \"int4\" is not one of target vllm's formats (sharded-state, "
      "kernel)\n",
      later);
  r = run_wsync(f, "plan", f->tiny, NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==, int4);
  run_clear(&r);
}

/* A size conf.d's sync section sets that the target's layout refuses deeper in planning
 * ("tp 3 does not divide the padded vocabulary ...") says where it was set: the user
 * typed no --tp.  It said nothing of conf.d.  A size typed on the command line, which
 * differs from conf.d's, gets no such note; a rank conf.d sets that the layout lacks is
 * "FILE:LINE: sync rank", not "--rank". */
static void
test_sync_section_sizes_name_the_place(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *conf = g_build_filename(f->conf, "20.conf", NULL);
  g_free(test_write(f->conf, "20.conf", "sync {\n  target = \"vllm\"\n  tp = 3\n}\n"));
  g_autofree char *want = g_strdup_printf(
      "wsync: tp 3 does not divide the padded vocabulary of 320 rows of "
      "model.embed_tokens.weight (tp 3 comes from %s:3, conf.d's sync section; --tp overrides "
      "it)\n",
      conf);
  Run r = run_wsync(f, "plan", f->tiny, NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.out, ==, "");
  g_assert_cmpstr(r.err, ==, want);
  run_clear(&r);
  g_autofree char *dst = path_in(f, "out");
  r = run_wsync(f, "convert", f->tiny, dst, NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==, want);
  run_clear(&r);
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));

  /* typed: the user knows where it came from */
  g_free(test_write(f->conf, "20.conf", "sync {\n  target = \"vllm\"\n  tp = 2\n}\n"));
  r = run_wsync(f, "plan", f->tiny, "--tp", "3", NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==, "wsync: tp 3 does not divide the padded vocabulary of 320 rows of "
                             "model.embed_tokens.weight\n");
  run_clear(&r);

  /* both sizes */
  g_free(test_write(f->conf, "20.conf",
                    "sync {\n  target = \"vllm\"\n  tp = 3\n  ep = 2\n}\n"));
  g_autofree char *both = g_strdup_printf(
      "(tp 3 comes from %s:3 and ep 2 from %s:4, conf.d's sync section; --tp and --ep "
      "override them)\n",
      conf, conf);
  r = run_wsync(f, "plan", f->tiny, NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_true(g_str_has_prefix(r.err, "wsync: "));
  g_assert_true(g_str_has_suffix(r.err, both));
  run_clear(&r);

  /* a rank */
  g_free(test_write(f->conf, "20.conf",
                    "sync {\n  target = \"vllm\"\n  tp = 2\n  rank = 5\n}\n"));
  g_autofree char *rank = g_strdup_printf(
      "wsync: %s:4: sync rank 5 is not a rank of a 2-rank layout (tp 2, ep 1) (tp 2 comes "
      "from %s:3, conf.d's sync section; --tp overrides it)\n",
      conf, conf);
  r = run_wsync(f, "plan", f->tiny, NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==, rank);
  run_clear(&r);
  r = run_wsync(f, "plan", f->tiny, "--rank", "7", "--tp", "4", NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==, "wsync: --rank 7 is not a rank of a 4-rank layout (tp 4, ep 1)\n");
  run_clear(&r);
}

/* verify of a directory of rank files against the checkpoint they came from: each rank
 * holds lm_head.weight, the checkpoint once; verify said "only in A", which it is not. */
static void
test_verify_rank_files_against_checkpoint(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *ranks = path_in(f, "ranks");
  Run r = run_wsync(f, "convert", f->tiny, ranks, "--target", "vllm", "--tp", "2", "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  g_autofree char *want = g_strdup_printf(
      "differ: tensor \"lm_head.weight\" is in 2 files of A (%s), in 1 of B (%s)\n", ranks,
      f->tiny);
  r = run_wsync(f, "verify", ranks, f->tiny, NULL);
  g_assert_cmpint(r.status, ==, 1);
  g_assert_cmpstr(r.out, ==, want);
  g_assert_cmpstr(r.err, ==, "");
  run_clear(&r);
  /* --json said kind "missing-in-b", which it is not: a kind of its own, with the files
   * that hold the name on each side (B's first here, A's in name order) */
  g_autofree char *json = g_strdup_printf(
      "{\n  \"equal\" : false,\n  \"tensors\" : 0,\n  \"bytes\" : 0,\n"
      "  \"difference\" : {\n    \"tensor\" : \"lm_head.weight\",\n"
      "    \"kind\" : \"file-count\",\n    \"element\" : null,\n    \"index\" : null,\n"
      "    \"files_a\" : [\n      \"%s/model-00001-of-00001.safetensors\"\n    ],\n"
      "    \"files_b\" : [\n      \"%s/model-rank-0-part-0.safetensors\",\n"
      "      \"%s/model-rank-1-part-0.safetensors\"\n    ]\n  }\n}\n",
      f->tiny, ranks, ranks);
  r = run_wsync(f, "--json", "verify", f->tiny, ranks, NULL);
  g_assert_cmpint(r.status, ==, 1);
  g_assert_cmpstr(r.out, ==, json);
  g_assert_cmpstr(r.err, ==, "");
  run_clear(&r);
}

/* The exit status of a path that is not there, whichever command and argument names it
 * (README "Exit status"): what the command line names (SRC, A, B, CONFIG.json, --config)
 * is an I/O failure, 4, "cannot open PATH" as for an unreadable one; what the input
 * lacks (SRC's own config.json) is bad input, 3.  (Before: config and synth --config
 * said "PATH: no such file", exit 3, and --config PATH exit 2, while a missing SRC was
 * 4.) */
static void
test_missing_paths_exit_status(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *missing = path_in(f, "no-such");
  g_autofree char *dst = path_in(f, "dst");
  g_autofree char *file = g_build_filename(f->tiny, "model-00001-of-00001.safetensors", NULL);
  g_autofree char *step = path_in(f, "step");
  g_autofree char *dcp = g_build_filename(step, "b", NULL);
  g_autofree char *cannot = g_strdup_printf("wsync: cannot open %s: No such file or directory\n",
                                            missing);
  g_autofree char *flag = g_strdup_printf("wsync: --config %s: No such file or directory\n",
                                          missing);
  shard_file(file, step);
  g_assert_cmpint(g_mkdir(dst, 0700), ==, 0); /* (a DST to keep: nothing replaces it) */
  g_free(test_write(dst, "keep", "x"));
  const struct {
    const char *args[10];
    const char *err;
  } cases[] = {
      {{"inspect", missing}, cannot},
      {{"verify", missing, f->tiny}, cannot},
      {{"verify", f->tiny, missing}, cannot},
      {{"plan", missing, "--target", "vllm"}, cannot},
      {{"convert", missing, dst, "--target", "vllm", "--force"}, cannot},
      {{"merge", missing, dst, "--force"}, cannot},
      {{"config", missing}, cannot},
      {{"synth", "--config", missing, dst, "--force"}, cannot},
      {{"plan", f->tiny, "--target", "vllm", "--config", missing}, flag},
      {{"convert", f->tiny, dst, "--target", "vllm", "--force", "--config", missing}, flag},
      {{"merge", dcp, dst, "--force", "--config", missing}, flag},
  };
  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_autoptr(GPtrArray) args = g_ptr_array_new();
    for (guint k = 0; cases[i].args[k] != NULL; k++)
      g_ptr_array_add(args, (gpointer)cases[i].args[k]);
    Run r = run_args(f, args);
    if (r.status != 4 || g_strcmp0(r.err, cases[i].err) != 0)
      g_error("wsync %s %s: exit %d, \"%s\"; expected exit 4, \"%s\"", cases[i].args[0],
              cases[i].args[1], r.status, r.err, cases[i].err);
    run_clear(&r);
  }
  g_autofree char *kept = g_build_filename(dst, "keep", NULL);
  g_assert_true(g_file_test(kept, G_FILE_TEST_IS_REGULAR));

  /* a checkpoint directory without its config.json: the input is incomplete, 3 */
  g_autofree char *config = g_build_filename(f->tiny, "config.json", NULL);
  g_assert_cmpint(unlink(config), ==, 0);
  g_autofree char *lacks = g_strdup_printf("wsync: %s: no such file\n", config);
  Run r = run_wsync(f, "plan", f->tiny, "--target", "vllm", NULL);
  g_assert_cmpint(r.status, ==, 3);
  g_assert_cmpstr(r.err, ==, lacks);
  run_clear(&r);
}

/* A trainer's F32 weights written in the config's BF16 are rounded: convert says so in
 * one note (the 27 logical tensors of the 2-layer model: 3 outside the layers, 12 in
 * each, the experts one per projection), after the bytes it wrote; widening to F32 is
 * exact and says nothing. */
static void
test_lossy_cast_noted(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *config = tiny_config();
  g_autofree char *text = NULL;
  g_autofree char *f32_config = path_in(f, "f32.json");
  g_autofree char *f32 = path_in(f, "f32");
  g_autofree char *dst = path_in(f, "rounded");
  g_autofree char *in_config = g_build_filename(f32, "config.json", NULL);

  g_assert_true(g_file_get_contents(config, &text, NULL, NULL));
  g_auto(GStrv) halves = g_strsplit(text, "\"bfloat16\"", 2);
  g_assert_nonnull(halves[1]);
  g_autofree char *f32_text = g_strconcat(halves[0], "\"float32\"", halves[1], NULL);
  g_assert_true(g_file_set_contents(f32_config, f32_text, -1, NULL));
  Run r = run_wsync(f, "synth", "--config", f32_config, f32, "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  test_copy(config, in_config); /* the F32 tensors, published as BF16 */

  r = run_wsync(f, "convert", f32, dst, "--target", "hf", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_autofree char *want = g_strdup_printf(
      "wrote %s: 325376 bytes\n"
      "note: 27 tensors cast F32->BF16, rounded to nearest even (the first: "
      "model.embed_tokens.weight): the hf layout holds them in BF16\n",
      dst);
  g_assert_cmpstr(r.out, ==, want);
  run_clear(&r);

  /* BF16 to F32 widens exactly: no note */
  g_assert_true(g_file_set_contents(in_config, f32_text, -1, NULL));
  g_autofree char *tiny_as_f32 = path_in(f, "tiny-f32");
  g_autofree char *tiny_config_copy = g_build_filename(tiny_as_f32, "config.json", NULL);
  g_autofree char *tiny_file = g_build_filename(f->tiny, "model-00001-of-00001.safetensors", NULL);
  g_autofree char *tiny_file_copy = g_build_filename(tiny_as_f32, "model.safetensors", NULL);
  g_autofree char *widened = path_in(f, "widened");
  g_mkdir(tiny_as_f32, 0700);
  test_copy(tiny_file, tiny_file_copy);
  g_assert_true(g_file_set_contents(tiny_config_copy, f32_text, -1, NULL));
  r = run_wsync(f, "convert", tiny_as_f32, widened, "--target", "hf", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_autofree char *wrote = g_strdup_printf("wrote %s: 650752 bytes\n", widened);
  g_assert_cmpstr(r.out, ==, wrote);
  run_clear(&r);
}

/* synth --json prints what convert --json and merge --json print, the plan of what it
 * wrote, and nothing else on stdout (was the text line "wrote DST: N bytes"). */
static void
test_synth_json(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *config = tiny_config();
  g_autofree char *dst = path_in(f, "synth-json");
  Run r = run_wsync(f, "synth", "--config", config, dst, "--layers", "1", "--json", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.err, ==, "");
  g_autoptr(JsonParser) parser = json_parser_new();
  g_assert_true(json_parser_load_from_data(parser, r.out, -1, NULL));
  JsonObject *root = json_node_get_object(json_parser_get_root(parser));
  g_assert_cmpstr(json_object_get_string_member(root, "target"), ==, "hf");
  g_assert_cmpint(json_object_get_int_member(root, "tp"), ==, 1);
  g_assert_true(json_object_has_member(root, "ranks"));
  g_assert_true(json_object_has_member(root, "bytes"));
  run_clear(&r);
}

/* synth --layers N keeps the first N layers; more layers than the model has is refused
 * (it wrote a model of N layers with a config.json the model never had). */
static void
test_synth_layers_beyond_the_model(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *config = tiny_config();
  g_autofree char *dst = path_in(f, "synth-layers");
  Run r = run_wsync(f, "synth", "--config", config, dst, "--layers", "3", NULL);
  g_autofree char *msg = g_strdup_printf(
      "wsync synth: --layers 3: %s has only 2 layers (see wsync synth --help)\n", config);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==, msg);
  g_assert_cmpstr(r.out, ==, "");
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
  run_clear(&r);
  /* all of them is fine */
  r = run_wsync(f, "synth", "--config", config, dst, "--layers", "2", "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
}

/* --layers N keeps the entries of mlp_only_layers below N (the model refuses an index
 * that names no layer): a 2-layer model whose layers are both dense, cut to 1, is one
 * dense layer. */
static void
test_synth_layers_trims_mlp_only(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *tiny = tiny_config();
  g_autoptr(JsonParser) parser = json_parser_new();
  GError *error = NULL;
  json_parser_load_from_file(parser, tiny, &error);
  g_assert_no_error(error);
  JsonObject *root = json_node_get_object(json_parser_get_root(parser));
  JsonArray *dense = json_array_new();
  json_array_add_int_element(dense, 0);
  json_array_add_int_element(dense, 1);
  json_object_set_array_member(root, "mlp_only_layers", dense);
  g_autofree char *text = json_to_string(json_parser_get_root(parser), TRUE);
  g_autofree char *config = path_in(f, "dense.json");
  g_assert_true(g_file_set_contents(config, text, -1, NULL));
  g_autofree char *dst = path_in(f, "synth-dense");

  Run r = run_wsync(f, "synth", "--config", config, dst, "--layers", "1", "-q", NULL);
  if (r.status != 0)
    g_error("exit %d: %s", r.status, r.err);
  run_clear(&r);
  g_autofree char *written = g_build_filename(dst, "config.json", NULL);
  g_autoptr(JsonParser) back = json_parser_new();
  json_parser_load_from_file(back, written, &error);
  g_assert_no_error(error);
  JsonObject *wrote = json_node_get_object(json_parser_get_root(back));
  JsonArray *kept = json_object_get_array_member(wrote, "mlp_only_layers");
  g_assert_cmpuint(json_array_get_length(kept), ==, 1);
  g_assert_cmpint(json_array_get_int_element(kept, 0), ==, 0);
  g_assert_cmpint(json_object_get_int_member(wrote, "num_hidden_layers"), ==, 1);
  r = run_wsync(f, "inspect", dst, NULL);
  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, "model.layers.0.mlp.gate_proj.weight");
  g_assert_null(strstr(r.out, "experts"));
  run_clear(&r);
}

/* A DST whose directory takes no new entry: the error names DST, which the user typed,
 * and then the temporary sibling wsync tried to make (was only ".DST.wsync-XXXXXX").
 * /proc refuses every mkdir, even root's, so the test holds whoever runs it. */
static void
test_unwritable_dst_named(Fixture *f, gconstpointer data)
{
  (void)data;
  if (!g_file_test("/proc/self", G_FILE_TEST_IS_DIR)) {
    g_test_skip("no /proc");
    return;
  }
  Run r = run_wsync(f, "convert", f->tiny, "/proc/wsync-test-out", "--target", "hf", NULL);
  g_assert_cmpint(r.status, ==, 4);
  if (!g_str_has_prefix(r.err, "wsync: cannot write /proc/wsync-test-out: cannot create its "
                               "temporary sibling /proc/.wsync-test-out.wsync-") ||
      strchr(r.err, '\n') != r.err + strlen(r.err) - 1)
    g_error("stderr \"%s\"", r.err);
  g_assert_cmpstr(r.out, ==, "");
  run_clear(&r);
}

#define ADD(path, fn) g_test_add(path, Fixture, NULL, fixture_setup, fn, fixture_teardown)

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  ADD("/engine/proof/overlap", test_overlap_refused);
  ADD("/engine/proof/gap", test_gap_refused);
  ADD("/engine/proof/lost-inputs", test_lost_inputs_refused);
  ADD("/engine/input/unmapped", test_unmapped_input_refused);
  ADD("/engine/input/missing-paths", test_missing_paths_exit_status);
  ADD("/engine/conf/sync-refusals-name-the-place", test_sync_section_refusals_name_the_place);
  ADD("/engine/conf/sync-sizes-name-the-place", test_sync_section_sizes_name_the_place);
  ADD("/engine/verify/rank-files-against-checkpoint", test_verify_rank_files_against_checkpoint);
  ADD("/engine/layout/sizes-without-ranks", test_parallel_sizes_of_a_target_without_ranks);
  ADD("/engine/input/drop-rule", test_drop_rule_consumes);
  ADD("/engine/input/missing-tensor", test_missing_tensor_refused);
  ADD("/engine/input/unknown-target", test_unknown_target);
  ADD("/engine/input/unclaimed-model-type", test_unclaimed_model_type);
  ADD("/engine/input/target-needs-a-hook", test_target_needing_a_hook);
  ADD("/engine/output/atomic", test_existing_dst_untouched_on_failure_replaced_on_success);
  ADD("/engine/output/unwritable-dst", test_unwritable_dst_named);
  ADD("/engine/output/part-size", test_part_size_splits_files);
  ADD("/engine/output/threads", test_threads_give_identical_bytes);
  ADD("/engine/output/slabs", test_slabs_give_identical_bytes);
  ADD("/engine/output/lossy-cast-noted", test_lossy_cast_noted);
  ADD("/engine/conf/sync-defaults", test_sync_section_defaults);
  ADD("/engine/plan/json", test_plan_json_names_sources);
  ADD("/engine/synth/json", test_synth_json);
  ADD("/engine/synth/layers-beyond-the-model", test_synth_layers_beyond_the_model);
  ADD("/engine/synth/layers-trims-mlp-only", test_synth_layers_trims_mlp_only);
  ADD("/engine/input/sharded", test_sharded_source);
  ADD("/engine/input/sharded-drop-named-once", test_sharded_drop_named_once);
  ADD("/engine/input/sharded-config-above", test_sharded_config_above);
  ADD("/engine/input/config-option", test_config_option);
  ADD("/engine/input/config-option-plain", test_config_option_plain);
  ADD("/engine/output/config-and-other-files", test_config_patchers_and_other_files);
  return g_test_run();
}
