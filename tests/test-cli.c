/* The wsync command as a user sees it: output bytes, error lines, exit statuses. */
#include <json-glib/json-glib.h>
#include <sys/wait.h>

#include <wsync/wsync.h>

#include "testutil.h"

typedef struct {
  char *out;
  char *err;
  int status;
} Run;

static void
run_clear(Run *r)
{
  g_free(r->out);
  g_free(r->err);
}

/* Runs wsync with @args (NULL-terminated), no configuration unless given. */
static Run
run_wsync(const char *first, ...)
{
  g_autoptr(GPtrArray) argv = g_ptr_array_new();
  GError *error = NULL;
  Run r = {0};
  int wait_status = 0;
  va_list ap;

  g_ptr_array_add(argv, (gpointer)test_env_dir("WSYNC_TEST_BINARY"));
  va_start(ap, first);
  for (const char *a = first; a != NULL; a = va_arg(ap, const char *))
    g_ptr_array_add(argv, (gpointer)a);
  va_end(ap);
  g_ptr_array_add(argv, NULL);
  g_spawn_sync(NULL, (char **)argv->pdata, NULL, G_SPAWN_DEFAULT, NULL, NULL, &r.out, &r.err,
               &wait_status, &error);
  g_assert_no_error(error);
  g_assert_true(WIFEXITED(wait_status));
  r.status = WEXITSTATUS(wait_status);
  return r;
}

static void
assert_has(const char *text, const char *fragment)
{
  if (strstr(text, fragment) == NULL)
    g_error("\"%s\" lacks \"%s\"", text, fragment);
}

static void
test_version(void)
{
  Run r = run_wsync("--version", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.out, ==, "wsync " PACKAGE_VERSION_FOR_TEST " (plugin ABI 1)\n");
  g_assert_cmpstr(r.err, ==, "");
  run_clear(&r);
}

static void
test_help_lists_commands_and_exit_codes(void)
{
  Run r = run_wsync("--help", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_true(g_str_has_prefix(r.out, "Usage: wsync [OPTION...] COMMAND [ARGS]\n"));
  assert_has(r.out, "  plugins");
  assert_has(r.out, "  inspect  PATH");
  assert_has(r.out, "  config   CONFIG.json");
  assert_has(r.out, "Exit status: 0 success, 1 a check found a difference, 2 usage or configuration\n"
                    "error, 3 bad input data, 4 I/O failure.\n");
  run_clear(&r);

  r = run_wsync("inspect", "--help", NULL);
  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, "Usage:\n  wsync inspect [OPTION");
  assert_has(r.out, "] PATH\n");
  assert_has(r.out, "--conf-dir");
  assert_has(r.out, "Exit status:");
  run_clear(&r);
}

static void
test_usage_errors(void)
{
  Run r = run_wsync(NULL, NULL);
  g_assert_cmpint(r.status, ==, 2);
  assert_has(r.err, "Usage: wsync");
  run_clear(&r);

  r = run_wsync("frobnicate", NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==, "wsync: unknown command \"frobnicate\" (see wsync --help)\n");
  run_clear(&r);

  r = run_wsync("inspect", NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==, "wsync inspect: missing PATH (see wsync inspect --help)\n");
  run_clear(&r);

  r = run_wsync("inspect", "--bogus", "x", NULL);
  g_assert_cmpint(r.status, ==, 2);
  assert_has(r.err, "Unknown option --bogus");
  run_clear(&r);
}

/* A conf.d selecting good and bad-abi, with an option set. */
static char *
plugin_conf(void)
{
  char *dir = test_tmpdir();
  g_free(test_write(dir, "10-test.conf",
                    "# the test plugins\nplugin \"good\" {\n  level = 4\n}\n"
                    "plugin \"bad-abi\" {}\n"));
  return dir;
}

static void
test_plugins_text(void)
{
  g_autofree char *conf = plugin_conf();
  const char *pdir = test_env_dir("WSYNC_TEST_PLUGIN_DIR");
  Run r = run_wsync("plugins", "--conf-dir", conf, "--plugin-dir", pdir, NULL);
  g_autofree char *expect = g_strdup_printf(
      "bad-abi  refused  %s/bad-abi.so\n"
      "    refused: %s/bad-abi.so: built for plugin ABI 999, this wsync has ABI 1\n"
      "good  active  %s/good.so\n"
      "    Test plugin with one entry of every kind\n"
      "    remapper       good-remap               priority 10  serves qwen3_moe, qwen3\n"
      "    converter      good-convert             priority 0  serves vllm\n"
      "    hook           good-hook                priority -5  serves vllm-ascend\n"
      "    config-patcher good-patch               priority 0  serves *\n",
      pdir, pdir, pdir);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.out, ==, expect);
  g_autofree char *err = g_strdup_printf(
      "wsync: plugin \"bad-abi\" refused: %s/bad-abi.so: built for plugin ABI 999, this wsync "
      "has ABI 1\n",
      pdir);
  g_assert_cmpstr(r.err, ==, err);
  run_clear(&r);

  /* -q keeps stderr for errors only */
  r = run_wsync("-q", "plugins", "--conf-dir", conf, "--plugin-dir", pdir, NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.err, ==, "");
  run_clear(&r);
  test_rmtree(conf);
}

static void
test_plugins_json(void)
{
  g_autofree char *conf = plugin_conf();
  const char *pdir = test_env_dir("WSYNC_TEST_PLUGIN_DIR");
  Run r = run_wsync("plugins", "--json", "-q", "--conf-dir", conf, "--plugin-dir", pdir, NULL);
  g_autoptr(JsonParser) parser = json_parser_new();
  GError *error = NULL;

  g_assert_cmpint(r.status, ==, 0);
  json_parser_load_from_data(parser, r.out, -1, &error);
  g_assert_no_error(error);
  JsonArray *plugins =
      json_object_get_array_member(json_node_get_object(json_parser_get_root(parser)), "plugins");
  g_assert_cmpuint(json_array_get_length(plugins), ==, 2);
  JsonObject *bad = json_array_get_object_element(plugins, 0);
  g_assert_cmpstr(json_object_get_string_member(bad, "name"), ==, "bad-abi");
  g_assert_cmpstr(json_object_get_string_member(bad, "state"), ==, "refused");
  assert_has(json_object_get_string_member(bad, "reason"), "built for plugin ABI 999");
  g_assert_true(json_object_get_null_member(bad, "description"));
  JsonObject *good = json_array_get_object_element(plugins, 1);
  g_assert_cmpstr(json_object_get_string_member(good, "state"), ==, "active");
  g_assert_true(json_object_get_null_member(good, "reason"));
  JsonArray *entries = json_object_get_array_member(good, "entries");
  g_assert_cmpuint(json_array_get_length(entries), ==, 4);
  JsonObject *remap = json_array_get_object_element(entries, 0);
  g_assert_cmpstr(json_object_get_string_member(remap, "kind"), ==, "remapper");
  g_assert_cmpint(json_object_get_int_member(remap, "priority"), ==, 10);
  g_assert_cmpstr(json_object_get_string_member(remap, "serves"), ==, "qwen3_moe, qwen3");
  JsonObject *patch = json_array_get_object_element(entries, 3);
  g_assert_true(json_object_get_null_member(patch, "serves"));
  run_clear(&r);
  test_rmtree(conf);
}

static void
test_config_error_exit_2(void)
{
  g_autofree char *conf = test_tmpdir();
  g_autofree char *path = test_write(conf, "10.conf", "sync {\n  tp = two\n}\n");
  Run r = run_wsync("plugins", "--conf-dir", conf, NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_autofree char *expect = g_strdup_printf("wsync: %s:2: ", path);
  g_assert_true(g_str_has_prefix(r.err, expect));
  assert_has(r.err, "tp");
  g_assert_cmpstr(r.out, ==, "");
  run_clear(&r);
  test_rmtree(conf);
}

/* A two-tensor file whose bytes encode their position. */
static char *
write_small_file(const char *dir)
{
  g_autoptr(WsyncSafetensorsWriter) w = wsync_safetensors_writer_new();
  char *path = g_build_filename(dir, "small.safetensors", NULL);
  guint64 shape_a[] = {2, 3};
  guint64 shape_b[] = {4};
  GError *error = NULL;

  g_assert_true(wsync_safetensors_writer_add(w, "layer.a", WSYNC_DTYPE_BF16, 2, shape_a, &error));
  g_assert_true(wsync_safetensors_writer_add(w, "layer.b", WSYNC_DTYPE_F32, 1, shape_b, &error));
  g_assert_true(wsync_safetensors_writer_begin(w, path, &error));
  for (int t = 0; t < 2; t++) {
    const char *name = t ? "layer.b" : "layer.a";
    guint8 *data = wsync_safetensors_writer_data(w, name, &error);
    g_assert_no_error(error);
    for (guint64 i = 0; i < wsync_safetensors_writer_tensor_nbytes(w, name); i++)
      data[i] = (guint8)(t * 100 + i);
  }
  g_assert_true(wsync_safetensors_writer_finish(w, &error));
  g_assert_no_error(error);
  return path;
}

static void
test_inspect_text_and_json(void)
{
  g_autofree char *dir = test_tmpdir();
  g_autofree char *path = write_small_file(dir);
  g_autofree char *conf = test_tmpdir();

  Run r = run_wsync("inspect", "--conf-dir", conf, path, NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.out, ==,
                  "NAME     DTYPE  SHAPE   BYTES\n"
                  "layer.a  BF16   [2, 3]  12\n"
                  "layer.b  F32    [4]     16\n"
                  "2 tensors, 28 bytes in 1 file\n");
  g_assert_cmpstr(r.err, ==, "");
  run_clear(&r);

  r = run_wsync("--json", "inspect", "--conf-dir", conf, path, NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_autoptr(JsonParser) parser = json_parser_new();
  GError *error = NULL;
  json_parser_load_from_data(parser, r.out, -1, &error);
  g_assert_no_error(error);
  JsonObject *root = json_node_get_object(json_parser_get_root(parser));
  g_assert_cmpint(json_object_get_int_member(root, "total_tensors"), ==, 2);
  g_assert_cmpint(json_object_get_int_member(root, "total_bytes"), ==, 28);
  JsonObject *a = json_array_get_object_element(json_object_get_array_member(root, "tensors"), 0);
  g_assert_cmpstr(json_object_get_string_member(a, "name"), ==, "layer.a");
  g_assert_cmpstr(json_object_get_string_member(a, "dtype"), ==, "BF16");
  JsonArray *shape = json_object_get_array_member(a, "shape");
  g_assert_cmpint(json_array_get_int_element(shape, 0), ==, 2);
  g_assert_cmpint(json_array_get_int_element(shape, 1), ==, 3);
  g_assert_cmpint(json_object_get_int_member(a, "bytes"), ==, 12);
  run_clear(&r);
  test_rmtree(dir);
  test_rmtree(conf);
}

static void
test_inspect_bad_input_exit_3(void)
{
  g_autofree char *dir = test_tmpdir();
  g_autofree char *path = test_write(dir, "broken.safetensors", "abc");
  g_autofree char *conf = test_tmpdir();
  Run r = run_wsync("inspect", "--conf-dir", conf, path, NULL);
  g_assert_cmpint(r.status, ==, 3);
  g_autofree char *prefix = g_strdup_printf("wsync: %s", path);
  g_assert_true(g_str_has_prefix(r.err, prefix));
  g_assert_cmpstr(r.out, ==, "");
  run_clear(&r);

  g_autofree char *missing = g_build_filename(dir, "missing.safetensors", NULL);
  r = run_wsync("inspect", "--conf-dir", conf, missing, NULL);
  g_assert_cmpint(r.status, ==, 4);
  assert_has(r.err, "missing.safetensors");
  run_clear(&r);
  test_rmtree(dir);
  test_rmtree(conf);
}

static void
test_config_runs_patchers_in_order(void)
{
  g_autofree char *conf = test_tmpdir();
  g_autofree char *dir = test_tmpdir();
  g_free(test_write(conf, "10.conf",
                    "plugin \"good\" {\n  level = 4\n  flag = true\n  names = {\"a\"}\n}\n"
                    "plugin \"rival\" {}\n"));
  g_autofree char *in = test_write(dir, "config.json", "{\"model_type\": \"qwen3_moe\"}\n");
  g_autofree char *out = g_build_filename(dir, "out.json", NULL);
  Run r = run_wsync("config", in, "-o", out, "--conf-dir", conf, "--plugin-dir",
                    test_env_dir("WSYNC_TEST_PLUGIN_DIR"), NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.out, ==, "");
  g_autofree char *text = NULL;
  g_assert_true(g_file_get_contents(out, &text, NULL, NULL));
  /* rival (priority 50) ran before good (0); good saw the merged options */
  g_assert_cmpstr(text, ==,
                  "{\n"
                  "  \"model_type\" : \"qwen3_moe\",\n"
                  "  \"order\" : [\n"
                  "    \"rival\",\n"
                  "    \"good\"\n"
                  "  ],\n"
                  "  \"patched_by_good\" : \"level=4 mode=fast flag=true names=1\"\n"
                  "}\n");
  run_clear(&r);

  g_autofree char *not_json = test_write(dir, "bad.json", "{\"a\": ");
  r = run_wsync("config", not_json, "--conf-dir", conf, "--plugin-dir",
                test_env_dir("WSYNC_TEST_PLUGIN_DIR"), NULL);
  g_assert_cmpint(r.status, ==, 3);
  g_autofree char *prefix = g_strdup_printf("wsync: %s: not valid JSON", not_json);
  g_assert_true(g_str_has_prefix(r.err, prefix));
  run_clear(&r);
  test_rmtree(conf);
  test_rmtree(dir);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/cli/version", test_version);
  g_test_add_func("/cli/help", test_help_lists_commands_and_exit_codes);
  g_test_add_func("/cli/usage-errors", test_usage_errors);
  g_test_add_func("/cli/plugins-text", test_plugins_text);
  g_test_add_func("/cli/plugins-json", test_plugins_json);
  g_test_add_func("/cli/config-error", test_config_error_exit_2);
  g_test_add_func("/cli/inspect", test_inspect_text_and_json);
  g_test_add_func("/cli/inspect-bad-input", test_inspect_bad_input_exit_3);
  g_test_add_func("/cli/config-patchers", test_config_runs_patchers_in_order);
  return g_test_run();
}
