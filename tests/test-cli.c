/* The wsync command as a user sees it: output bytes, error lines, exit statuses. */
#include <json-glib/json-glib.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <wsync/wsync.h>

#include "testutil.h"

typedef TestRun Run;
/* the shared helpers of testutil.h under this file's short names */
#define run_wsync test_run
#define assert_has test_assert_has
#define run_clear test_run_clear

static void
test_version(void)
{
  Run r = run_wsync("--version", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.out, ==, "wsync " PACKAGE_VERSION_FOR_TEST " (plugin ABI 1)\n");
  g_assert_cmpstr(r.err, ==, "");
  run_clear(&r);
}

/* --version is an option of every command, as `wsync --help` lists it: after the command
 * word too, and before anything else the command would check (its missing arguments). */
static void
test_version_on_every_command(void)
{
  static const char *const commands[] = {"plugins", "inspect", "verify", "plan", "convert",
                                         "merge",   "synth",   "env",    "config"};

  for (guint i = 0; i < G_N_ELEMENTS(commands); i++) {
    Run r = run_wsync(commands[i], "--version", NULL);
    g_assert_cmpint(r.status, ==, 0);
    g_assert_cmpstr(r.out, ==, "wsync " PACKAGE_VERSION_FOR_TEST " (plugin ABI 1)\n");
    g_assert_cmpstr(r.err, ==, "");
    run_clear(&r);
  }
  Run r = run_wsync("--version", "inspect", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.out, ==, "wsync " PACKAGE_VERSION_FOR_TEST " (plugin ABI 1)\n");
  run_clear(&r);

  r = run_wsync("plan", "--help", NULL);
  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, "  --version  ");
  run_clear(&r);
}

/* -q and -v together: every command refused them (exit 2), naming both, before anything
 * else it checks; both were accepted, and -q silently won (no meaning is documented). */
static void
test_quiet_and_verbose_refused(void)
{
  static const char *const commands[] = {"plugins", "inspect", "verify", "plan", "convert",
                                         "merge",   "synth",   "env",    "config"};

  for (guint i = 0; i < G_N_ELEMENTS(commands); i++) {
    g_autofree char *want = g_strdup_printf(
        "wsync %s: -q (--quiet) and -v (--verbose) contradict each other: give one "
        "(see wsync %s --help)\n",
        commands[i], commands[i]);
    Run r = run_wsync(commands[i], "-q", "-v", NULL);
    g_assert_cmpint(r.status, ==, 2);
    g_assert_cmpstr(r.out, ==, "");
    g_assert_cmpstr(r.err, ==, want);
    run_clear(&r);
    /* long forms, before the command word */
    r = run_wsync("--verbose", commands[i], "--quiet", NULL);
    g_assert_cmpint(r.status, ==, 2);
    g_assert_cmpstr(r.err, ==, want);
    run_clear(&r);
  }
}

static void
test_help_lists_commands_and_exit_codes(void)
{
  Run r = run_wsync("--help", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_true(g_str_has_prefix(r.out, "Usage: wsync [OPTION...] COMMAND [ARGS]\n"));
  assert_has(r.out, "  plugins");
  assert_has(r.out, "  inspect  PATH");
  assert_has(r.out, "  verify   A B ");
  assert_has(r.out, "  config   CONFIG.json");
  assert_has(r.out, "  sync     SRC DST ");
  assert_has(r.out, "Exit status: 0 success, 1 a check found a difference, 2 usage, configuration or\n"
                    "plugin error, 3 bad input data, 4 I/O failure.\n");
  run_clear(&r);

  /* synth's --part-size is no limit (a larger tensor gets a file of its own): it said
   * "File size limit" */
  r = run_wsync("synth", "--help", NULL);
  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, "  --part-size=SIZE        Start a new file before a tensor that would pass "
                    "SIZE (default 5G)\n");
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

/* synth --layers cuts a config by the fields its remapper declares
 * (wsync_model_declare_layer_field()); the core knows none.  A remapper that declares
 * no layer count is refused by name, and nothing is written. */
static void
test_synth_layers_needs_declared_count(void)
{
  g_autofree char *conf = test_tmpdir();
  g_free(test_write(conf, "10-test.conf", "plugin \"good\" {}\n"));
  g_autofree char *config =
      test_write(conf, "config.json", "{\"model_type\": \"qwen3_moe\", \"num_hidden_layers\": 2}");
  g_autofree char *dst = g_build_filename(conf, "out", NULL);
  const char *pdir = test_env_dir("WSYNC_TEST_PLUGIN_DIR");
  Run r = run_wsync("synth", "--conf-dir", conf, "--plugin-dir", pdir, "--config", config, dst,
                    "--layers", "1", NULL);
  g_autofree char *expect = g_strdup_printf(
      "wsync: %s: remapper good-remap (plugin good) declares no field that counts the model's "
      "layers, so its config cannot be cut to the first layers\n",
      config);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==, expect);
  g_assert_cmpstr(r.out, ==, "");
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
  run_clear(&r);
  test_rmtree(conf);
}

/* synth's --layers and --seed are read as every number option is: --layers -1 is no
 * longer "no --layers" (the whole model, exit 0), text is refused in wsync's words (not
 * GLib's "Cannot parse integer value"), and nothing is written. */
static void
test_synth_numbers(void)
{
  g_autofree char *conf = test_tmpdir();
  g_free(test_write(conf, "10-test.conf", "plugin \"good\" {}\n"));
  g_autofree char *config =
      test_write(conf, "config.json", "{\"model_type\": \"qwen3_moe\", \"num_hidden_layers\": 2}");
  g_autofree char *dst = g_build_filename(conf, "out", NULL);
  const char *pdir = test_env_dir("WSYNC_TEST_PLUGIN_DIR");
  static const char *const bad[][3] = {
      {"--layers", "-1", "--layers must be a number from 1 to 65536, not \"-1\""},
      {"--layers", "0", "--layers must be a number from 1 to 65536, not \"0\""},
      {"--layers", "1x", "--layers must be a number from 1 to 65536, not \"1x\""},
      {"--seed", "-1", "--seed must be a number from 0 to 18446744073709551615, not \"-1\""},
      {"--seed", "abc", "--seed must be a number from 0 to 18446744073709551615, not \"abc\""}};

  for (guint i = 0; i < G_N_ELEMENTS(bad); i++) {
    Run r = run_wsync("synth", "--conf-dir", conf, "--plugin-dir", pdir, "--config", config, dst,
                      bad[i][0], bad[i][1], NULL);
    g_autofree char *expect =
        g_strdup_printf("wsync synth: %s (see wsync synth --help)\n", bad[i][2]);
    g_assert_cmpstr(r.err, ==, expect);
    g_assert_cmpstr(r.out, ==, "");
    g_assert_cmpint(r.status, ==, 2);
    g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
    run_clear(&r);
  }
  test_rmtree(conf);
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
      "    converter      good-target              priority 0  serves good-target\n"
      "    hook           good-hook                priority -5  serves vllm-ascend\n"
      "    config-patcher good-patch               priority 0  serves *\n"
      "    env-patch      good-env                 priority 0  serves test-backend\n"
      /* the options: in the table's order, with the conf.d file's level = 4 changing
       * nothing (defaults are the table's) */
      "    option         level                    int  default 3\n"
      "        How hard the \"good\" plugin tries.\n"
      "        values: 0 to 9\n"
      "    option         mode                     string  default \"fast\"\n"
      "        Fast or \"thorough\".\n"
      "        values: a string\n"
      "    option         flag                     bool  default false\n"
      "        Whether the flag is up.\n"
      "        values: true or false\n"
      "    option         names                    string list  default {\"a\", \"b c\"}\n"
      "        Names, as many as wanted.\n"
      "        values: a list of strings\n",
      pdir, pdir, pdir);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.out, ==, expect);
  g_autofree char *err = g_strdup_printf(
      "wsync: plugin \"bad-abi\" refused: %s/bad-abi.so: built for plugin ABI 999, this wsync "
      "has ABI 1\n",
      pdir);
  g_assert_cmpstr(r.err, ==, err);
  run_clear(&r);

  /* -q keeps stderr for errors only, and stdout for the listing the command is run for
   * (--help said "print only errors") */
  r = run_wsync("-q", "plugins", "--conf-dir", conf, "--plugin-dir", pdir, NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.err, ==, "");
  g_assert_cmpstr(r.out, ==, expect);
  run_clear(&r);
  r = run_wsync("--help", NULL);
  assert_has(r.out, "  -q, --quiet        print only errors and the command's result (no "
                    "warnings,\n                     no progress, no notes after a write)\n");
  /* only sync says more with -v (it said "say more", for every command) */
  assert_has(r.out, "  -v, --verbose      say more (sync only: when each phase ended; not with -q)\n");
  run_clear(&r);
  test_rmtree(conf);
}

/* Two plugins registering one remapper name: `wsync plugins` lists both as refused, and
 * says so on stderr, each line naming the other plugin and its file (before: the one
 * whose name sorted second was refused, the other ran). */
static void
test_plugins_name_clash(void)
{
  g_autofree char *conf = test_tmpdir();
  const char *pdir = test_env_dir("WSYNC_TEST_PLUGIN_DIR");
  g_free(test_write(conf, "10.conf", "plugin \"clash-b\" {}\nplugin \"clash-a\" {}\n"));
  Run r = run_wsync("plugins", "--conf-dir", conf, "--plugin-dir", pdir, NULL);
  const char *tail = "; one name, one plugin: all of them are refused (set enabled = false in "
                     "the sections of those not wanted)\n";
  g_autofree char *err = g_strdup_printf(
      "wsync: plugin \"clash-a\" refused: %s/clash-a.so: remapper \"shared-remap\" is also "
      "registered by plugin \"clash-b\" (%s/clash-b.so)%s"
      "wsync: plugin \"clash-b\" refused: %s/clash-b.so: remapper \"shared-remap\" is also "
      "registered by plugin \"clash-a\" (%s/clash-a.so)%s",
      pdir, pdir, tail, pdir, pdir, tail);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.err, ==, err);
  assert_has(r.out, "clash-a  refused  ");
  assert_has(r.out, "clash-b  refused  ");
  run_clear(&r);
  test_rmtree(conf);
}

/* A configuration that selects no plugin (a build tree run without --conf-dir, a conf.d
 * of other files) leaves plugins and the targets of --help empty: each says why instead
 * of printing nothing. */
static void
test_no_plugin_selected(void)
{
  g_autofree char *conf = test_tmpdir();
  const char *pdir = test_env_dir("WSYNC_TEST_PLUGIN_DIR");
  Run r = run_wsync("plugins", "--conf-dir", conf, "--plugin-dir", pdir, NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.out, ==, "no plugin is selected: no file of the configuration has a "
                             "plugin section (see wsync.conf(5))\n");
  g_assert_cmpstr(r.err, ==, "");
  run_clear(&r);

  r = run_wsync("--json", "plugins", "--conf-dir", conf, "--plugin-dir", pdir, NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.out, ==, "{\n  \"plugins\" : []\n}\n");
  run_clear(&r);

  r = run_wsync("convert", "--help", "--conf-dir", conf, "--plugin-dir", pdir, NULL);
  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, "Targets (of the plugins the configuration selects):\n"
                    "  (none: no file of the configuration has a plugin section; see "
                    "wsync.conf(5))\n");
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
  g_assert_cmpuint(json_array_get_length(entries), ==, 5);
  JsonObject *remap = json_array_get_object_element(entries, 0);
  g_assert_cmpstr(json_object_get_string_member(remap, "kind"), ==, "remapper");
  g_assert_cmpint(json_object_get_int_member(remap, "priority"), ==, 10);
  g_assert_cmpstr(json_object_get_string_member(remap, "serves"), ==, "qwen3_moe, qwen3");
  JsonObject *patch = json_array_get_object_element(entries, 3);
  g_assert_true(json_object_get_null_member(patch, "serves"));
  /* the options, typed defaults and their documentation */
  g_assert_cmpuint(json_array_get_length(json_object_get_array_member(bad, "options")), ==, 0);
  JsonArray *options = json_object_get_array_member(good, "options");
  g_assert_cmpuint(json_array_get_length(options), ==, 4);
  JsonObject *level = json_array_get_object_element(options, 0);
  g_assert_cmpstr(json_object_get_string_member(level, "name"), ==, "level");
  g_assert_cmpstr(json_object_get_string_member(level, "type"), ==, "int");
  g_assert_false(json_object_get_boolean_member(level, "list"));
  g_assert_cmpint(json_object_get_int_member(level, "default"), ==, 3);
  g_assert_cmpstr(json_object_get_string_member(level, "values"), ==, "0 to 9");
  g_assert_cmpstr(json_object_get_string_member(level, "description"), ==,
                  "How hard the \"good\" plugin tries.");
  JsonObject *mode = json_array_get_object_element(options, 1);
  g_assert_cmpstr(json_object_get_string_member(mode, "default"), ==, "fast");
  g_assert_cmpstr(json_object_get_string_member(mode, "values"), ==, "a string");
  g_assert_cmpstr(json_object_get_string_member(mode, "description"), ==, "Fast or \"thorough\".");
  JsonObject *flag = json_array_get_object_element(options, 2);
  g_assert_cmpstr(json_object_get_string_member(flag, "type"), ==, "bool");
  g_assert_false(json_object_get_boolean_member(flag, "default"));
  g_assert_cmpstr(json_object_get_string_member(flag, "values"), ==, "true or false");
  g_assert_cmpstr(json_object_get_string_member(flag, "description"), ==,
                  "Whether the flag is up.");
  JsonObject *names = json_array_get_object_element(options, 3);
  g_assert_cmpstr(json_object_get_string_member(names, "type"), ==, "string");
  g_assert_true(json_object_get_boolean_member(names, "list"));
  JsonArray *names_default = json_object_get_array_member(names, "default");
  g_assert_cmpuint(json_array_get_length(names_default), ==, 2);
  g_assert_cmpstr(json_array_get_string_element(names_default, 1), ==, "b c");
  g_assert_cmpstr(json_object_get_string_member(names, "values"), ==, "a list of strings");
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

  /* A number out of its option's bounds is a bad value of that file and line too, not
   * an error of a flag nobody gave ("--tp must be ..."), and no command runs. */
  static const char *const bad[][2] = {
      {"tp = 0", "tp must be a number from 1 to 4096, not 0"},
      {"ep = 5000", "ep must be a number from 1 to 4096, not 5000"},
      {"rank = -1", "rank must be a number from 0 to 4095, not -1"},
      {"threads = 0", "threads must be a number from 1 to 1024, not 0"},
      {"part-size = \"5Q\"", "part-size must be a size from 1 byte to 2^64-1 bytes: a number, "
                              "optionally followed by K, M, G or T (powers of 1024), not \"5Q\""}};
  for (guint i = 0; i < G_N_ELEMENTS(bad); i++) {
    g_autofree char *text = g_strdup_printf("sync {\n  target = \"hf\"\n  %s\n}\n", bad[i][0]);
    g_free(test_write(conf, "10.conf", text));
    r = run_wsync("plugins", "--conf-dir", conf, NULL);
    g_autofree char *line = g_strdup_printf("wsync: %s:3: %s\n", path, bad[i][1]);
    g_assert_cmpstr(r.err, ==, line);
    g_assert_cmpstr(r.out, ==, "");
    g_assert_cmpint(r.status, ==, 2);
    run_clear(&r);
  }
  g_free(test_write(conf, "10.conf", "sync {\n  tp = 4096\n  rank = 4095\n  threads = 1024\n"
                                     "  part-size = \"1k\"\n}\n"));
  r = run_wsync("plugins", "--conf-dir", conf, NULL);
  g_assert_cmpstr(r.err, ==, "");
  g_assert_cmpint(r.status, ==, 0);
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
  /* on stdout the same text, with or without --json (wsync(1) says so) */
  for (guint json = 0; json < 2; json++) {
    r = run_wsync("config", in, json ? "--json" : "-q", "--conf-dir", conf, "--plugin-dir",
                  test_env_dir("WSYNC_TEST_PLUGIN_DIR"), NULL);
    g_assert_cmpint(r.status, ==, 0);
    g_assert_cmpstr(r.out, ==, text);
    run_clear(&r);
  }

  /* -o naming a directory: the error names it (not a temporary), nothing is left */
  g_autofree char *sub = g_build_filename(dir, "sub", NULL);
  g_assert_cmpint(g_mkdir(sub, 0755), ==, 0);
  r = run_wsync("config", in, "-o", sub, "--conf-dir", conf, "--plugin-dir",
                test_env_dir("WSYNC_TEST_PLUGIN_DIR"), NULL);
  g_assert_cmpint(r.status, ==, 4);
  g_autofree char *is_dir = g_strdup_printf("wsync: cannot replace %s: Is a directory\n", sub);
  g_assert_cmpstr(r.err, ==, is_dir);
  run_clear(&r);
  g_autoptr(GDir) listing = g_dir_open(dir, 0, NULL);
  guint n_entries = 0;
  while (g_dir_read_name(listing) != NULL)
    n_entries++;
  g_assert_cmpuint(n_entries, ==, 3); /* config.json, out.json, sub: no temporary */

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

/* A bad --rope-format is refused as the flag it is: the plugin's own check of the value,
 * without the source and line of the override text the CLI made of it ("command
 * line:3:"). */
static void
test_config_bad_rope_format(void)
{
  g_autofree char *conf = test_tmpdir();
  g_autofree char *in = test_write(conf, "config.json", "{\"model_type\": \"qwen3_moe\"}\n");
  Run r = run_wsync("config", in, "--rope-format", "bogus", "--conf-dir", conf, "--plugin-dir",
                    test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR"), NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==,
                  "wsync config: --rope-format: rope-format must be transformers5, "
                  "transformers4 or keep, not \"bogus\" (see wsync config --help)\n");
  g_assert_cmpstr(r.out, ==, "");
  run_clear(&r);
  test_rmtree(conf);
}

/* A --plugin-dir that is not a directory is refused as a --conf-dir is (exit 2, naming
 * it, in the library's words: wsync_context_new_default()); it was skipped without a
 * word, and the plugins of the next directories (the installed ones) loaded in place of
 * those the user pointed at. */
static void
test_plugin_dir_not_a_directory(void)
{
  g_autofree char *conf = test_tmpdir();
  g_autofree char *missing = g_build_filename(conf, "no-such", NULL);
  g_autofree char *file = test_write(conf, "a-file", "x");
  const char *dirs[][2] = {{missing, "No such file or directory"}, {file, "Not a directory"}};
  for (guint i = 0; i < G_N_ELEMENTS(dirs); i++) {
    for (guint c = 0; c < 2; c++) {
      Run r = c == 0 ? run_wsync("plugins", "--conf-dir", conf, "--plugin-dir", dirs[i][0], NULL)
                     : run_wsync("inspect", file, "--conf-dir", conf, "--plugin-dir", dirs[i][0],
                                 NULL);
      g_autofree char *want = g_strdup_printf(
          "wsync: %s: cannot read plugin directory: %s\n", dirs[i][0], dirs[i][1]);
      g_assert_cmpint(r.status, ==, 2);
      g_assert_cmpstr(r.err, ==, want);
      g_assert_cmpstr(r.out, ==, "");
      run_clear(&r);
    }
  }
  test_rmtree(conf);
}

/* ---------------------------------------------------------------- inputs judged before they are opened */

/* Runs wsync with tests/swap-after-stat.c preloaded and its variables set from @env
 * (NAME, VALUE, ..., NULL), then unset. */
static Run
run_shimmed(const char *const *env, const char *const *args)
{
  g_autofree char *shim =
      g_build_filename(test_env_dir("G_TEST_BUILDDIR"), ".libs", "swap-after-stat.so", NULL);
  g_assert_true(g_file_test(shim, G_FILE_TEST_IS_REGULAR));
  g_setenv("LD_PRELOAD", shim, TRUE);
  /* an ASan build wants its runtime first among the libraries: the shim comes first */
  g_autofree char *asan_options = g_strdup(g_getenv("ASAN_OPTIONS"));
  if (TEST_UNDER_ASAN) {
    g_autofree char *more = g_strconcat(asan_options ? asan_options : "",
                                        asan_options ? ":" : "", "verify_asan_link_order=0", NULL);
    g_setenv("ASAN_OPTIONS", more, TRUE);
  }
  /* nor under valgrind (make check-valgrind's WSYNC_TEST_WRAPPER), which does not run
   * the shim's stat() and open(2) in its place: these runs test which file is read, the
   * same code runs under memcheck in the other tests */
  g_autofree char *wrapper = g_strdup(g_getenv("WSYNC_TEST_WRAPPER"));
  g_unsetenv("WSYNC_TEST_WRAPPER");
  for (guint i = 0; env[i] != NULL; i += 2)
    g_setenv(env[i], env[i + 1], TRUE);
  Run r = test_run_wsync_argv(args);
  if (wrapper != NULL)
    g_setenv("WSYNC_TEST_WRAPPER", wrapper, TRUE);
  if (TEST_UNDER_ASAN && asan_options != NULL)
    g_setenv("ASAN_OPTIONS", asan_options, TRUE);
  else if (TEST_UNDER_ASAN)
    g_unsetenv("ASAN_OPTIONS");
  g_unsetenv("LD_PRELOAD");
  for (guint i = 0; env[i] != NULL; i += 2)
    g_unsetenv(env[i]);
  return r;
}

/* The lines of the shim's open log @log ("" when nothing was opened), removed. */
static char *
take_open_log(const char *log)
{
  char *text = NULL;
  if (!g_file_get_contents(log, &text, NULL, NULL))
    return g_strdup("");
  g_unlink(log);
  return text;
}

/* A FIFO named as an input is refused without being opened (core/filekind.h: stat()ed
 * first; opening some devices does something, a watchdog arms).  The FIFO has no
 * writer, so an open(2) without O_NONBLOCK would hang: wsync opened it O_NONBLOCK and
 * refused it by fstat(), which the shim's open log shows.  Before: the refusal was the
 * same, but the log held the FIFO's path (`wsync config` opened it twice: in its own
 * check and in wsync_config_load(); `inspect` opened a DCP's .metadata). */
static void
test_fifo_input_never_opened(void)
{
  g_autofree char *conf = hf_conf_dir();
  const char *plugins = test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR");
  g_autofree char *log = g_build_filename(conf, "opens.log", NULL);
  g_autofree char *fifo = g_build_filename(conf, "watched.json", NULL);
  g_autofree char *dcp = g_build_filename(conf, "dcp", NULL);
  g_autofree char *metadata = g_build_filename(dcp, ".metadata", NULL);
  g_assert_cmpint(g_mkdir(dcp, 0755), ==, 0);

  /* the log does see wsync's opens: a regular file of that name is logged */
  g_autofree char *other = g_build_filename(conf, "other", NULL);
  g_assert_cmpint(g_mkdir(other, 0755), ==, 0);
  g_autofree char *regular = test_write(other, "watched.json", "{}");
  const char *env[] = {"WSYNC_OPEN_NAME", "watched.json", "WSYNC_OPEN_LOG", log, NULL};
  const char *read_regular[] = {"config", "--conf-dir", conf, "--plugin-dir", plugins, regular, NULL};
  Run r = run_shimmed(env, read_regular);
  g_autofree char *seen = take_open_log(log);
  g_autofree char *want_seen = g_strdup_printf("%s\n", regular);
  g_assert_true(g_str_has_prefix(seen, want_seen));
  run_clear(&r);

  g_assert_cmpint(mkfifo(fifo, 0600), ==, 0);
  g_assert_cmpint(mkfifo(metadata, 0600), ==, 0);
  const char *read_fifo[] = {"config", "--conf-dir", conf, "--plugin-dir", plugins, fifo, NULL};
  r = run_shimmed(env, read_fifo);
  g_autofree char *want = g_strdup_printf("wsync: %s: is a FIFO, not a regular file\n", fifo);
  g_assert_cmpstr(r.err, ==, want);
  g_assert_cmpint(r.status, ==, 3);
  g_autofree char *opened = take_open_log(log);
  g_assert_cmpstr(opened, ==, "");
  run_clear(&r);

  const char *env_dcp[] = {"WSYNC_OPEN_NAME", ".metadata", "WSYNC_OPEN_LOG", log, NULL};
  const char *inspect[] = {"inspect", "--conf-dir", conf, "--plugin-dir", plugins, dcp, NULL};
  r = run_shimmed(env_dcp, inspect);
  g_autofree char *want_dcp = g_strdup_printf("wsync: %s: not a regular file\n", metadata);
  g_assert_cmpstr(r.err, ==, want_dcp);
  g_assert_cmpint(r.status, ==, 3);
  g_autofree char *opened_dcp = take_open_log(log);
  g_assert_cmpstr(opened_dcp, ==, "");
  run_clear(&r);
  test_rmtree(conf);
}

/* wsync run with the shim renaming @other over @victim right after @victim is stat()ed:
 * refused in words that say so, exit 4, nothing printed on stdout. */
static void
assert_replaced_refused(const char *victim, const char *other, const char *const *args)
{
  g_autofree char *name = g_path_get_basename(victim);
  const char *env[] = {"WSYNC_SWAP_NAME", name, "WSYNC_SWAP_WITH", other, NULL};
  Run r = run_shimmed(env, args);
  g_autofree char *want = g_strdup_printf(
      "wsync: %s: was replaced while it was being opened; nothing was read\n", victim);
  g_assert_cmpstr(r.err, ==, want);
  g_assert_cmpstr(r.out, ==, "");
  g_assert_cmpint(r.status, ==, 4);
  g_assert_false(g_file_test(other, G_FILE_TEST_EXISTS)); /* the shim did swap */
  run_clear(&r);
}

/* An input replaced by another regular file between the stat() that judged it and the
 * open (the shim renames the other file over it right after the stat()) is not read:
 * fstat() of what was opened is not the file stat() saw.  It is named with what
 * happened, by every reader (core/error.c words the errno of core/filekind.h): a
 * config.json (core/files.c), a DCP's .metadata (core/dcp.c).  Before b617ad0 wsync
 * read the file swapped in (the config printed, exit 0); after it, both said "cannot open
 * PATH: Resource temporarily unavailable" (EAGAIN, which also is open(2)'s answer for a
 * file under a lease): as if retrying were the cure, and not what happened. */
static void
test_input_replaced_after_stat(void)
{
  g_autofree char *conf = test_tmpdir();
  const char *plugins = test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR");

  g_autofree char *victim = test_write(conf, "victim.json", "{\"model_type\": \"first\"}");
  g_autofree char *other = test_write(conf, "other.json", "{\"model_type\": \"second\"}");
  const char *config[] = {"config", "--conf-dir", conf, victim, NULL};
  assert_replaced_refused(victim, other, config);

  g_autofree char *dcp = g_build_filename(conf, "dcp", NULL);
  g_assert_cmpint(g_mkdir(dcp, 0755), ==, 0);
  g_autofree char *metadata = test_write(dcp, ".metadata", "not read");
  g_autofree char *other_md = test_write(conf, "other.metadata", "not read either");
  const char *inspect_dcp[] = {"inspect", "--conf-dir", conf, "--plugin-dir", plugins, dcp, NULL};
  assert_replaced_refused(metadata, other_md, inspect_dcp);
  test_rmtree(conf);
}

/* A FIFO in conf.d, or in a plugin directory in a plugin's place, is refused without
 * being opened (core/files.c wsync_file_open_trusted(): lstat()ed first, as the inputs
 * are stat()ed, core/filekind.h), in the words it had: the shim's open log stays empty.
 * Before: both were opened (O_NONBLOCK) and refused by fstat() of the descriptor; a
 * device there was opened too (a watchdog arms). */
static void
test_trusted_fifo_never_opened(void)
{
  g_autofree char *top = test_tmpdir();
  g_autofree char *conf = g_build_filename(top, "conf", NULL);
  g_autofree char *plugins = g_build_filename(top, "plugins", NULL);
  g_autofree char *log = g_build_filename(top, "opens.log", NULL);
  g_assert_cmpint(g_mkdir(conf, 0755), ==, 0);
  g_assert_cmpint(g_mkdir(plugins, 0755), ==, 0);

  g_autofree char *fifo_conf = g_build_filename(conf, "10-fifo.conf", NULL);
  g_assert_cmpint(mkfifo(fifo_conf, 0600), ==, 0);
  const char *env[] = {"WSYNC_OPEN_NAME", "10-fifo.conf", "WSYNC_OPEN_LOG", log, NULL};
  const char *args[] = {"plugins", "--conf-dir", conf, "--plugin-dir", plugins, NULL};
  Run r = run_shimmed(env, args);
  g_autofree char *want = g_strdup_printf("wsync: %s: is a FIFO, not a regular file\n", fifo_conf);
  g_assert_cmpstr(r.err, ==, want);
  g_assert_cmpstr(r.out, ==, "");
  g_assert_cmpint(r.status, ==, 2);
  g_autofree char *opened = take_open_log(log);
  g_assert_cmpstr(opened, ==, "");
  run_clear(&r);
  g_assert_cmpint(g_unlink(fifo_conf), ==, 0);

  g_free(test_write(conf, "10.conf", "plugin \"watched\" {}\n"));
  g_autofree char *fifo_so = g_build_filename(plugins, "watched.so", NULL);
  g_assert_cmpint(mkfifo(fifo_so, 0600), ==, 0);
  const char *env_so[] = {"WSYNC_OPEN_NAME", "watched.so", "WSYNC_OPEN_LOG", log, NULL};
  r = run_shimmed(env_so, args);
  g_autofree char *want_so = g_strdup_printf(
      "wsync: plugin \"watched\" refused: %s: is a FIFO, not a regular file\n", fifo_so);
  g_assert_cmpstr(r.err, ==, want_so);
  g_autofree char *listed = g_strdup_printf("    refused: %s: is a FIFO, not a regular file\n", fifo_so);
  assert_has(r.out, listed);
  g_assert_cmpint(r.status, ==, 0);
  g_autofree char *opened_so = take_open_log(log);
  g_assert_cmpstr(opened_so, ==, "");
  run_clear(&r);
  test_rmtree(top);
}

/* A conf.d file replaced by another regular file between its lstat() and its open (the
 * shim renames the other over it right after the lstat()) is not read: "PATH: was
 * replaced while it was being opened; nothing was read", a configuration error (exit 2),
 * as every refusal of a conf.d file is.  Before: opened without a stat() before it, the
 * file swapped in was read (with the lstat() of this fix and the old identity-blind
 * open, it would have been too). */
static void
test_conf_file_replaced_after_lstat(void)
{
  g_autofree char *conf = test_tmpdir();
  g_autofree char *spare = test_tmpdir(); /* not listed as a conf.d file */
  g_autofree char *victim = test_write(conf, "10.conf", "# first\n");
  g_autofree char *other = test_write(spare, "other.conf", "plugin \"nowhere\" {}\n");
  const char *env[] = {"WSYNC_SWAP_NAME", "10.conf", "WSYNC_SWAP_WITH", other,
                       "WSYNC_SWAP_AFTER_LSTAT", "1", NULL};
  const char *args[] = {"plugins", "--conf-dir", conf, NULL};
  Run r = run_shimmed(env, args);
  g_autofree char *want = g_strdup_printf(
      "wsync: %s: was replaced while it was being opened; nothing was read\n", victim);
  g_assert_cmpstr(r.err, ==, want);
  g_assert_cmpstr(r.out, ==, "");
  g_assert_cmpint(r.status, ==, 2);
  g_assert_false(g_file_test(other, G_FILE_TEST_EXISTS)); /* the shim did swap */
  run_clear(&r);
  test_rmtree(conf);
  test_rmtree(spare);
}

/* A --plugin-dir that cannot be read (opendir(3) fails: no read or search permission;
 * the shim fails it with EACCES, as mode bits do not stop root) is refused as a missing
 * one is, exit 2.  Before: only stat()ed, it passed, its plugins were skipped without a
 * word and the run went on with the next directories' plugins. */
static void
test_plugin_dir_unreadable(void)
{
  g_autofree char *conf = test_tmpdir();
  g_autofree char *denied = g_build_filename(conf, "denied", NULL);
  g_assert_cmpint(g_mkdir(denied, 0755), ==, 0);
  const char *env[] = {"WSYNC_DENY_OPENDIR", "denied", NULL};
  const char *args[] = {"plugins", "--conf-dir", conf, "--plugin-dir", denied, NULL};
  Run r = run_shimmed(env, args);
  g_autofree char *want =
      g_strdup_printf("wsync: %s: cannot read plugin directory: Permission denied\n", denied);
  g_assert_cmpstr(r.err, ==, want);
  g_assert_cmpstr(r.out, ==, "");
  g_assert_cmpint(r.status, ==, 2);
  run_clear(&r);
  test_rmtree(conf);
}

/* An empty argument (an unset shell variable's "$SRC") is named as one: the message
 * said "cannot open : No such file or directory", the name gone from the line. */
static void
test_empty_path_named(void)
{
  g_autofree char *conf = test_tmpdir();
  const char *commands[][3] = {{"inspect", "", NULL}, {"config", "", NULL}, {"verify", "", ""}};
  for (guint i = 0; i < G_N_ELEMENTS(commands); i++) {
    Run r = run_wsync(commands[i][0], "--conf-dir", conf, commands[i][1], commands[i][2], NULL);
    g_assert_cmpint(r.status, ==, 4);
    g_assert_cmpstr(r.err, ==, "wsync: cannot open an empty path (\"\"): No such file or "
                               "directory\n");
    run_clear(&r);
  }
  test_rmtree(conf);
}

/* An empty or blank config.json: "empty", not "the top level is not an object" (there is
 * none), exit 3, naming the file; an array is still "not an object". */
static void
test_config_empty(void)
{
  g_autofree char *conf = test_tmpdir();
  const char *texts[][2] = {{"", "empty, not a JSON object"},
                            {" \n\t\n", "empty, not a JSON object"},
                            {"[1]\n", "the top level is not an object"}};
  for (guint i = 0; i < G_N_ELEMENTS(texts); i++) {
    g_autofree char *in = test_write(conf, "config.json", texts[i][0]);
    Run r = run_wsync("config", in, "--conf-dir", conf, NULL);
    g_autofree char *want = g_strdup_printf("wsync: %s: %s\n", in, texts[i][1]);
    g_assert_cmpint(r.status, ==, 3);
    g_assert_cmpstr(r.err, ==, want);
    g_assert_cmpstr(r.out, ==, "");
    run_clear(&r);
  }
  test_rmtree(conf);
}

/* A \u0000 escape in a string of config.json, a safetensors header or an index: json-glib
 * cut the string at the NUL, so `wsync config` printed "model_type": "qwen3_moe" for
 * "qwen3_moe\u0000x" (exit 0), synth wrote a model whose config.json said so, and
 * inspect listed a tensor "a" for "a\u0000b", where Transformers, vLLM and the
 * safetensors crate read the whole string (core/json-check.c).  Refused: exit 3, one
 * line naming the file and the byte of the escape, nothing written. */
static void
test_json_nul_escape_refused(void)
{
  g_autofree char *conf = test_tmpdir();
  g_free(test_write(conf, "10-test.conf", "plugin \"good\" {}\n"));
  const char *pdir = test_env_dir("WSYNC_TEST_PLUGIN_DIR");
  g_autofree char *config = test_write(
      conf, "config.json",
      "{\"model_type\": \"qwen3_moe\\u0000x\", \"architectures\": [\"Qwen3MoeForCausalLM\"], "
      "\"num_hidden_layers\": 2}");
  g_autofree char *want =
      g_strdup_printf("wsync: %s: a NUL character (\\u0000) in a string at byte 25\n", config);
  Run r = run_wsync("config", config, "--conf-dir", conf, "--plugin-dir", pdir, NULL);
  g_assert_cmpstr(r.err, ==, want);
  g_assert_cmpstr(r.out, ==, "");
  g_assert_cmpint(r.status, ==, 3);
  run_clear(&r);
  g_autofree char *dst = g_build_filename(conf, "out", NULL);
  r = run_wsync("synth", "--conf-dir", conf, "--plugin-dir", pdir, "--config", config, dst, NULL);
  g_assert_cmpstr(r.err, ==, want);
  g_assert_cmpstr(r.out, ==, "");
  g_assert_cmpint(r.status, ==, 3);
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
  run_clear(&r);

  /* a header with the name "a\u0000b" */
  g_autofree char *dir = test_tmpdir();
  g_autofree char *no_conf = test_tmpdir();
  static const char header[] = "{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],"
                               "\"data_offsets\":[0,1]}}";
  GString *image = g_string_new(NULL);
  for (int i = 0; i < 8; i++)
    g_string_append_c(image, (char)(i == 0 ? strlen(header) : 0));
  g_string_append(image, header);
  g_string_append_c(image, 7);
  g_autofree char *file = g_build_filename(dir, "nul.safetensors", NULL);
  g_assert_true(g_file_set_contents(file, image->str, (gssize)image->len, NULL));
  g_string_free(image, TRUE);
  r = run_wsync("inspect", "--conf-dir", no_conf, file, NULL);
  g_autofree char *want_header = g_strdup_printf(
      "wsync: %s: header has a NUL character (\\u0000) in a string at byte 3 of the header\n",
      file);
  g_assert_cmpstr(r.err, ==, want_header);
  g_assert_cmpstr(r.out, ==, "");
  g_assert_cmpint(r.status, ==, 3);
  run_clear(&r);
  g_assert_cmpint(g_unlink(file), ==, 0);

  /* an index that maps "layer.a\u0000x" */
  g_autofree char *small = write_small_file(dir);
  g_autofree char *index = test_write(
      dir, "model.safetensors.index.json",
      "{\"weight_map\": {\"layer.a\\u0000x\": \"small.safetensors\", "
      "\"layer.b\": \"small.safetensors\"}}");
  r = run_wsync("inspect", "--conf-dir", no_conf, dir, NULL);
  g_autofree char *want_index =
      g_strdup_printf("wsync: %s: a NUL character (\\u0000) in a string at byte 24\n", index);
  g_assert_cmpstr(r.err, ==, want_index);
  g_assert_cmpstr(r.out, ==, "");
  g_assert_cmpint(r.status, ==, 3);
  run_clear(&r);
  test_rmtree(dir);
  test_rmtree(no_conf);
  test_rmtree(conf);
}

/* ---------------------------------------------------------------- verify */

/* A tensor of the verify tests.  Its bytes encode its position: byte i of the tensor
 * with seed s is 16 * s + i, wherever and in whatever file it is written. */
typedef struct {
  const char *name;
  WsyncDtype dtype;
  guint ndim;
  guint64 shape[2];
  guint seed;
} TestTensor;

#define T_EMBED {"embed", WSYNC_DTYPE_BF16, 2, {3, 4}, 1}    /* 24 bytes */
#define T_LAYER {"layer.0.w", WSYNC_DTYPE_F32, 2, {2, 3}, 2} /* 24 bytes */
#define T_NORM {"norm", WSYNC_DTYPE_U8, 1, {5}, 3}           /* 5 bytes */
#define T_EXTRA {"extra", WSYNC_DTYPE_U8, 1, {2}, 4}         /* 2 bytes */

/* Writes DIR/FILE with @n tensors and the __metadata__ @metadata (key, value, ...,
 * NULL; NULL for none); when @flip_name is set, byte @flip_byte of that tensor is
 * inverted.  Returns the path. */
static char *
write_tensors_md(const char *dir, const char *file, const TestTensor *tensors, guint n,
                 const char *flip_name, guint64 flip_byte, const char *const *metadata)
{
  g_autoptr(WsyncSafetensorsWriter) w = wsync_safetensors_writer_new();
  char *path = g_build_filename(dir, file, NULL);
  GError *error = NULL;

  for (guint k = 0; metadata != NULL && metadata[k] != NULL; k += 2)
    wsync_safetensors_writer_set_metadata(w, metadata[k], metadata[k + 1]);

  for (guint t = 0; t < n; t++)
    g_assert_true(wsync_safetensors_writer_add(w, tensors[t].name, tensors[t].dtype,
                                               tensors[t].ndim, tensors[t].shape, &error));
  g_assert_true(wsync_safetensors_writer_begin(w, path, &error));
  for (guint t = 0; t < n; t++) {
    guint8 *data = wsync_safetensors_writer_data(w, tensors[t].name, &error);
    guint64 nbytes = wsync_safetensors_writer_tensor_nbytes(w, tensors[t].name);
    g_assert_no_error(error);
    for (guint64 i = 0; i < nbytes; i++)
      data[i] = (guint8)(16 * tensors[t].seed + i);
    if (flip_name != NULL && strcmp(flip_name, tensors[t].name) == 0) {
      g_assert_cmpuint(flip_byte, <, nbytes);
      data[flip_byte] ^= 0xff;
    }
  }
  g_assert_true(wsync_safetensors_writer_finish(w, &error));
  g_assert_no_error(error);
  return path;
}

static char *
write_tensors(const char *dir, const char *file, const TestTensor *tensors, guint n,
              const char *flip_name, guint64 flip_byte)
{
  return write_tensors_md(dir, file, tensors, n, flip_name, flip_byte, NULL);
}

/* The three tensors of the reference checkpoint A. */
static char *
write_reference(const char *dir, const char *file)
{
  const TestTensor tensors[] = {T_EMBED, T_LAYER, T_NORM};
  return write_tensors(dir, file, tensors, G_N_ELEMENTS(tensors), NULL, 0);
}

static Run
run_verify(const char *conf, const char *a, const char *b, gboolean json)
{
  if (json)
    return run_wsync("verify", "--json", "--conf-dir", conf, a, b, NULL);
  return run_wsync("verify", "--conf-dir", conf, a, b, NULL);
}

/* Runs verify A B and checks its whole output. */
static void
expect_verify(const char *conf, const char *a, const char *b, int status, const char *out)
{
  Run r = run_verify(conf, a, b, FALSE);
  g_assert_cmpstr(r.out, ==, out);
  g_assert_cmpstr(r.err, ==, "");
  g_assert_cmpint(r.status, ==, status);
  run_clear(&r);
}

static void
test_verify_equal_files(void)
{
  g_autofree char *dir = test_tmpdir();
  g_autofree char *conf = test_tmpdir();
  g_autofree char *a = write_reference(dir, "a.safetensors");
  /* Another file, the same tensors declared in another order */
  const TestTensor tensors[] = {T_NORM, T_LAYER, T_EMBED};
  g_autofree char *b = write_tensors(dir, "b.safetensors", tensors, 3, NULL, 0);

  expect_verify(conf, a, b, 0, "equal: 3 tensors, 53 bytes\n");
  expect_verify(conf, a, a, 0, "equal: 3 tensors, 53 bytes\n");

  /* -q prints only errors: nothing when equal; a difference is still named */
  Run r = run_wsync("verify", "-q", "--conf-dir", conf, a, b, NULL);
  g_assert_cmpstr(r.out, ==, "");
  g_assert_cmpstr(r.err, ==, "");
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  const TestTensor other[] = {T_EMBED, T_LAYER};
  g_autofree char *c = write_tensors(dir, "c.safetensors", other, 2, NULL, 0);
  r = run_wsync("verify", "-q", "--conf-dir", conf, a, c, NULL);
  g_autofree char *expect_c = g_strdup_printf("differ: tensor \"norm\" only in A (%s)\n", a);
  g_assert_cmpstr(r.out, ==, expect_c);
  g_assert_cmpint(r.status, ==, 1);
  run_clear(&r);
  test_rmtree(dir);
  test_rmtree(conf);
}

/* A single file against a directory of two shards with an index: the same tensors. */
static void
test_verify_file_vs_sharded_dir(void)
{
  g_autofree char *dir = test_tmpdir();
  g_autofree char *conf = test_tmpdir();
  g_autofree char *a = write_reference(dir, "model.safetensors");
  g_autofree char *ck = g_build_filename(dir, "ck", NULL);
  g_assert_cmpint(g_mkdir(ck, 0755), ==, 0);
  const TestTensor shard1[] = {T_LAYER, T_EMBED};
  const TestTensor shard2[] = {T_NORM};
  g_free(write_tensors(ck, "model-00001-of-00002.safetensors", shard1, 2, NULL, 0));
  g_free(write_tensors(ck, "model-00002-of-00002.safetensors", shard2, 1, NULL, 0));
  g_autoptr(GHashTable) map = g_hash_table_new(g_str_hash, g_str_equal);
  g_hash_table_insert(map, "embed", "model-00001-of-00002.safetensors");
  g_hash_table_insert(map, "layer.0.w", "model-00001-of-00002.safetensors");
  g_hash_table_insert(map, "norm", "model-00002-of-00002.safetensors");
  g_autofree char *index = g_build_filename(ck, WSYNC_INDEX_NAME, NULL);
  GError *error = NULL;
  g_assert_true(wsync_index_write(index, 53, map, &error));
  g_assert_no_error(error);

  expect_verify(conf, a, ck, 0, "equal: 3 tensors, 53 bytes\n");
  expect_verify(conf, ck, a, 0, "equal: 3 tensors, 53 bytes\n");
  test_rmtree(dir);
  test_rmtree(conf);
}

static void
test_verify_data_differs(void)
{
  g_autofree char *dir = test_tmpdir();
  g_autofree char *conf = test_tmpdir();
  g_autofree char *a = write_reference(dir, "a.safetensors");
  const TestTensor tensors[] = {T_EMBED, T_LAYER, T_NORM};

  /* layer.0.w is F32 [2, 3]; its byte 21 is the second byte of element 5, [1, 2].
   * Element 5 is bytes 0x34 0x35 0x36 0x37, 0x35 becomes 0xca. */
  g_autofree char *b = write_tensors(dir, "b.safetensors", tensors, 3, "layer.0.w", 21);
  expect_verify(conf, a, b, 1,
                "differ: tensor \"layer.0.w\": first difference at element 5 (index [1, 2]): "
                "bytes 0x37363534 in A, 0x3736ca34 in B\n");

  /* embed is BF16 [3, 4]; byte 0 is element 0, [0, 0], bytes 0x10 0x11. */
  g_autofree char *c = write_tensors(dir, "c.safetensors", tensors, 3, "embed", 0);
  expect_verify(conf, c, a, 1,
                "differ: tensor \"embed\": first difference at element 0 (index [0, 0]): "
                "bytes 0x11ef in A, 0x1110 in B\n");

  /* norm is U8 [5]; its last byte */
  g_autofree char *d = write_tensors(dir, "d.safetensors", tensors, 3, "norm", 4);
  expect_verify(conf, a, d, 1,
                "differ: tensor \"norm\": first difference at element 4 (index [4]): "
                "bytes 0x34 in A, 0xcb in B\n");

  /* Past the first chunks of a large tensor: U16 [1024, 1537], 3147776 bytes */
  const TestTensor big[] = {{"big", WSYNC_DTYPE_U16, 2, {1024, 1537}, 6}};
  g_autofree char *g = write_tensors(dir, "g.safetensors", big, 1, NULL, 0);
  g_autofree char *h = write_tensors(dir, "h.safetensors", big, 1, "big", 2 * 1024 * 1024 + 1001);
  expect_verify(conf, g, h, 1,
                "differ: tensor \"big\": first difference at element 1049076 (index [682, 842]): "
                "bytes 0x4948 in A, 0xb648 in B\n");
  expect_verify(conf, g, g, 0, "equal: 1 tensor, 3147776 bytes\n");
  Run one = run_wsync("inspect", "--conf-dir", conf, g, NULL);
  g_assert_cmpint(one.status, ==, 0);
  g_assert_cmpstr(one.out, ==,
                  "NAME  DTYPE  SHAPE         BYTES\n"
                  "big   U16    [1024, 1537]  3147776\n"
                  "1 tensor, 3147776 bytes in 1 file\n");
  run_clear(&one);

  /* F4 [6] packs two elements in a byte: the byte offset is reported instead */
  const TestTensor packed[] = {{"q", WSYNC_DTYPE_F4, 1, {6}, 5}};
  g_autofree char *e = write_tensors(dir, "e.safetensors", packed, 1, NULL, 0);
  g_autofree char *f = write_tensors(dir, "f.safetensors", packed, 1, "q", 1);
  expect_verify(conf, e, f, 1,
                "differ: tensor \"q\": first difference at byte 1: 0x51 in A, 0xae in B\n");
  test_rmtree(dir);
  test_rmtree(conf);
}

static void
test_verify_dtype_differs(void)
{
  g_autofree char *dir = test_tmpdir();
  g_autofree char *conf = test_tmpdir();
  g_autofree char *a = write_reference(dir, "a.safetensors");
  /* Same bytes, other dtype; and a data difference in a later tensor that is not
   * reached. */
  const TestTensor tensors[] = {T_EMBED, {"layer.0.w", WSYNC_DTYPE_I32, 2, {2, 3}, 2}, T_NORM};
  g_autofree char *b = write_tensors(dir, "b.safetensors", tensors, 3, "norm", 0);
  expect_verify(conf, a, b, 1, "differ: tensor \"layer.0.w\": dtype F32 in A, I32 in B\n");
  test_rmtree(dir);
  test_rmtree(conf);
}

static void
test_verify_shape_differs(void)
{
  g_autofree char *dir = test_tmpdir();
  g_autofree char *conf = test_tmpdir();
  g_autofree char *a = write_reference(dir, "a.safetensors");
  const TestTensor tensors[] = {T_EMBED, {"layer.0.w", WSYNC_DTYPE_F32, 2, {3, 2}, 2}, T_NORM};
  g_autofree char *b = write_tensors(dir, "b.safetensors", tensors, 3, NULL, 0);
  expect_verify(conf, a, b, 1, "differ: tensor \"layer.0.w\": shape [2, 3] in A, [3, 2] in B\n");

  const TestTensor flat[] = {T_EMBED, {"layer.0.w", WSYNC_DTYPE_F32, 1, {6}, 2}, T_NORM};
  g_autofree char *c = write_tensors(dir, "c.safetensors", flat, 3, NULL, 0);
  expect_verify(conf, a, c, 1, "differ: tensor \"layer.0.w\": shape [2, 3] in A, [6] in B\n");
  test_rmtree(dir);
  test_rmtree(conf);
}

/* A name on one side only is reported before any other difference. */
static void
test_verify_missing_tensor(void)
{
  g_autofree char *dir = test_tmpdir();
  g_autofree char *conf = test_tmpdir();
  g_autofree char *a = write_reference(dir, "a.safetensors");

  /* B has one tensor more, and embed (first in name order) differs too */
  const TestTensor more[] = {T_EMBED, T_LAYER, T_NORM, T_EXTRA};
  g_autofree char *b = write_tensors(dir, "b.safetensors", more, 4, "embed", 0);
  g_autofree char *expect_b = g_strdup_printf("differ: tensor \"extra\" only in B (%s)\n", b);
  expect_verify(conf, a, b, 1, expect_b);

  /* B lacks embed and has extra: embed comes first in name order */
  const TestTensor other[] = {T_LAYER, T_NORM, T_EXTRA};
  g_autofree char *c = write_tensors(dir, "c.safetensors", other, 3, NULL, 0);
  g_autofree char *expect_c = g_strdup_printf("differ: tensor \"embed\" only in A (%s)\n", a);
  expect_verify(conf, a, c, 1, expect_c);
  test_rmtree(dir);
  test_rmtree(conf);
}

static JsonObject *
parse_object(JsonParser *parser, const char *text)
{
  GError *error = NULL;
  json_parser_load_from_data(parser, text, -1, &error);
  g_assert_no_error(error);
  return json_node_get_object(json_parser_get_root(parser));
}

static void
test_verify_json(void)
{
  g_autofree char *dir = test_tmpdir();
  g_autofree char *conf = test_tmpdir();
  g_autofree char *a = write_reference(dir, "a.safetensors");
  const TestTensor tensors[] = {T_EMBED, T_LAYER, T_NORM};
  g_autofree char *b = write_tensors(dir, "b.safetensors", tensors, 3, "layer.0.w", 21);

  /* A data difference: embed was compared and equal before it */
  Run r = run_verify(conf, a, b, TRUE);
  g_assert_cmpint(r.status, ==, 1);
  g_assert_cmpstr(r.err, ==, "");
  g_autoptr(JsonParser) p1 = json_parser_new();
  JsonObject *root = parse_object(p1, r.out);
  g_assert_false(json_object_get_boolean_member(root, "equal"));
  g_assert_cmpint(json_object_get_int_member(root, "tensors"), ==, 1);
  g_assert_cmpint(json_object_get_int_member(root, "bytes"), ==, 24);
  JsonObject *diff = json_object_get_object_member(root, "difference");
  g_assert_cmpstr(json_object_get_string_member(diff, "tensor"), ==, "layer.0.w");
  g_assert_cmpstr(json_object_get_string_member(diff, "kind"), ==, "data");
  g_assert_cmpint(json_object_get_int_member(diff, "element"), ==, 5);
  JsonArray *index = json_object_get_array_member(diff, "index");
  g_assert_cmpuint(json_array_get_length(index), ==, 2);
  g_assert_cmpint(json_array_get_int_element(index, 0), ==, 1);
  g_assert_cmpint(json_array_get_int_element(index, 1), ==, 2);
  run_clear(&r);

  /* A missing name: nothing compared yet, no element */
  const TestTensor fewer[] = {T_LAYER, T_NORM};
  g_autofree char *c = write_tensors(dir, "c.safetensors", fewer, 2, NULL, 0);
  r = run_verify(conf, c, a, TRUE);
  g_assert_cmpint(r.status, ==, 1);
  g_autoptr(JsonParser) p2 = json_parser_new();
  root = parse_object(p2, r.out);
  g_assert_false(json_object_get_boolean_member(root, "equal"));
  g_assert_cmpint(json_object_get_int_member(root, "tensors"), ==, 0);
  diff = json_object_get_object_member(root, "difference");
  g_assert_cmpstr(json_object_get_string_member(diff, "tensor"), ==, "embed");
  g_assert_cmpstr(json_object_get_string_member(diff, "kind"), ==, "missing-in-a");
  g_assert_true(json_object_get_null_member(diff, "element"));
  g_assert_true(json_object_get_null_member(diff, "index"));
  run_clear(&r);

  /* Equal: no difference */
  r = run_verify(conf, a, a, TRUE);
  g_assert_cmpint(r.status, ==, 0);
  g_autoptr(JsonParser) p3 = json_parser_new();
  root = parse_object(p3, r.out);
  g_assert_true(json_object_get_boolean_member(root, "equal"));
  g_assert_cmpint(json_object_get_int_member(root, "tensors"), ==, 3);
  g_assert_cmpint(json_object_get_int_member(root, "bytes"), ==, 53);
  g_assert_true(json_object_get_null_member(root, "difference"));
  run_clear(&r);
  test_rmtree(dir);
  test_rmtree(conf);
}

/* The reference tensors with @metadata (key, value, ..., NULL). */
static char *
write_reference_md(const char *dir, const char *file, const char *const *metadata)
{
  const TestTensor tensors[] = {T_EMBED, T_LAYER, T_NORM};
  return write_tensors_md(dir, file, tensors, G_N_ELEMENTS(tensors), NULL, 0, metadata);
}

#define RECORD "wsync.published-dtype.layer.0.w"

/* The same tensors whose files record another published dtype differ; other metadata
 * (a version stamp) is not compared. */
static void
test_verify_records(void)
{
  g_autofree char *dir = test_tmpdir();
  g_autofree char *conf = test_tmpdir();
  const char *const md_a[] = {RECORD, "BF16", "wsync.version", "1", NULL};
  const char *const md_b[] = {RECORD, "F32", "wsync.version", "1", NULL};
  const char *const md_c[] = {RECORD, "BF16", "wsync.version", "2", "format", "pt", NULL};
  const char *const md_d[] = {"wsync.version", "1", NULL};
  g_autofree char *a = write_reference_md(dir, "a.safetensors", md_a);
  g_autofree char *b = write_reference_md(dir, "b.safetensors", md_b);
  g_autofree char *c = write_reference_md(dir, "c.safetensors", md_c);
  g_autofree char *d = write_reference_md(dir, "d.safetensors", md_d);
  g_autofree char *ab = g_strdup_printf(
      "differ: metadata \"" RECORD "\": \"BF16\" in A (%s), \"F32\" in B (%s)\n", a, b);
  g_autofree char *ad = g_strdup_printf(
      "differ: metadata \"" RECORD "\": \"BF16\" in A (%s), absent in B (%s)\n", a, d);
  g_autofree char *da = g_strdup_printf(
      "differ: metadata \"" RECORD "\": absent in A (%s), \"BF16\" in B (%s)\n", d, a);

  expect_verify(conf, a, b, 1, ab);
  expect_verify(conf, a, d, 1, ad);
  expect_verify(conf, d, a, 1, da);
  expect_verify(conf, a, c, 0, "equal: 3 tensors, 53 bytes\n");

  /* A record difference comes after a missing name, before any tensor's data */
  const TestTensor flipped[] = {T_EMBED, T_LAYER, T_NORM};
  g_autofree char *e = write_tensors_md(dir, "e.safetensors", flipped, 3, "embed", 0, md_b);
  g_autofree char *ae = g_strdup_printf(
      "differ: metadata \"" RECORD "\": \"BF16\" in A (%s), \"F32\" in B (%s)\n", a, e);
  expect_verify(conf, a, e, 1, ae);
  const TestTensor fewer[] = {T_EMBED, T_LAYER};
  g_autofree char *f = write_tensors_md(dir, "f.safetensors", fewer, 2, NULL, 0, md_b);
  g_autofree char *af = g_strdup_printf("differ: tensor \"norm\" only in A (%s)\n", a);
  expect_verify(conf, a, f, 1, af);

  /* Files are paired by the tensors they hold: a sharded B whose second shard (norm)
   * lacks the record differs there, against A's one file */
  g_autofree char *ck = g_build_filename(dir, "ck", NULL);
  g_assert_cmpint(g_mkdir(ck, 0755), ==, 0);
  const TestTensor shard1[] = {T_LAYER, T_EMBED};
  const TestTensor shard2[] = {T_NORM};
  g_free(write_tensors_md(ck, "1.safetensors", shard1, 2, NULL, 0, md_a));
  g_autofree char *s2 = write_tensors_md(ck, "2.safetensors", shard2, 1, NULL, 0, md_d);
  g_autofree char *as = g_strdup_printf(
      "differ: metadata \"" RECORD "\": \"BF16\" in A (%s), absent in B (%s)\n", a, s2);
  expect_verify(conf, a, ck, 1, as);

  /* --json: kind "metadata", no tensor, the key, both files and both values */
  Run r = run_verify(conf, d, a, TRUE);
  g_assert_cmpint(r.status, ==, 1);
  g_assert_cmpstr(r.err, ==, "");
  g_autoptr(JsonParser) p = json_parser_new();
  JsonObject *root = parse_object(p, r.out);
  g_assert_false(json_object_get_boolean_member(root, "equal"));
  g_assert_cmpint(json_object_get_int_member(root, "tensors"), ==, 0);
  g_assert_cmpint(json_object_get_int_member(root, "bytes"), ==, 0);
  JsonObject *diff = json_object_get_object_member(root, "difference");
  g_assert_cmpuint(json_object_get_size(diff), ==, 9);
  g_assert_true(json_object_get_null_member(diff, "tensor"));
  g_assert_cmpstr(json_object_get_string_member(diff, "kind"), ==, "metadata");
  g_assert_true(json_object_get_null_member(diff, "element"));
  g_assert_true(json_object_get_null_member(diff, "index"));
  g_assert_cmpstr(json_object_get_string_member(diff, "key"), ==, RECORD);
  g_assert_cmpstr(json_object_get_string_member(diff, "file_a"), ==, d);
  g_assert_true(json_object_get_null_member(diff, "value_a"));
  g_assert_cmpstr(json_object_get_string_member(diff, "file_b"), ==, a);
  g_assert_cmpstr(json_object_get_string_member(diff, "value_b"), ==, "BF16");
  run_clear(&r);
  test_rmtree(dir);
  test_rmtree(conf);
}

/* Each file's __metadata__, after the totals: "metadata of FILE:" and one "  KEY=VALUE"
 * line per key, in key order, control characters escaped; a file without metadata has no
 * block.  --json: "metadata" by file, every file, the values as they are. */
static void
test_inspect_metadata(void)
{
  g_autofree char *dir = test_tmpdir();
  g_autofree char *conf = test_tmpdir();
  g_autofree char *small = write_small_file(dir);
  const TestTensor tensors[] = {T_LAYER};
  const char *const md[] = {RECORD, "BF16", "note", "two\nlines \x1b[31mred", "format", "pt",
                            NULL};
  g_autofree char *with = write_tensors_md(dir, "with.safetensors", tensors, 1, NULL, 0, md);
  g_autofree char *expect = g_strdup_printf("NAME       DTYPE  SHAPE   BYTES\n"
                                            "layer.0.w  F32    [2, 3]  24\n"
                                            "layer.a    BF16   [2, 3]  12\n"
                                            "layer.b    F32    [4]     16\n"
                                            "3 tensors, 52 bytes in 2 files\n"
                                            "metadata of %s:\n"
                                            "  format=pt\n"
                                            "  note=two\\x0alines \\x1b[31mred\n"
                                            "  " RECORD "=BF16\n",
                                            with);
  GError *error = NULL;

  Run r = run_wsync("inspect", "--conf-dir", conf, dir, NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.out, ==, expect);
  g_assert_cmpstr(r.err, ==, "");
  run_clear(&r);

  r = run_wsync("--json", "inspect", "--conf-dir", conf, dir, NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_false(test_has_control(r.out, TRUE));
  g_autoptr(JsonParser) parser = json_parser_new();
  json_parser_load_from_data(parser, r.out, -1, &error);
  g_assert_no_error(error);
  JsonObject *metadata =
      json_object_get_object_member(json_node_get_object(json_parser_get_root(parser)), "metadata");
  g_assert_cmpuint(json_object_get_size(metadata), ==, 2);
  g_assert_cmpuint(json_object_get_size(json_object_get_object_member(metadata, small)), ==, 0);
  JsonObject *of_with = json_object_get_object_member(metadata, with);
  g_assert_cmpuint(json_object_get_size(of_with), ==, 3);
  g_assert_cmpstr(json_object_get_string_member(of_with, RECORD), ==, "BF16");
  g_assert_cmpstr(json_object_get_string_member(of_with, "note"), ==, "two\nlines \x1b[31mred");
  g_assert_cmpstr(json_object_get_string_member(of_with, "format"), ==, "pt");
  /* keys sorted */
  const char *format_at = strstr(r.out, "\"format\"");
  const char *note_at = strstr(r.out, "\"note\"");
  const char *record_at = strstr(r.out, "\"" RECORD "\"");
  g_assert_true(format_at != NULL && format_at < note_at && note_at < record_at);
  run_clear(&r);
  test_rmtree(dir);
  test_rmtree(conf);
}

static void
test_verify_usage_errors(void)
{
  g_autofree char *conf = test_tmpdir();
  Run r = run_wsync("verify", "--conf-dir", conf, "a.safetensors", NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==, "wsync verify: missing B (see wsync verify --help)\n");
  g_assert_cmpstr(r.out, ==, "");
  run_clear(&r);

  r = run_wsync("verify", NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==, "wsync verify: missing A and B (see wsync verify --help)\n");
  run_clear(&r);

  r = run_wsync("verify", "--conf-dir", conf, "a", "b", "c", NULL);
  g_assert_cmpint(r.status, ==, 2);
  assert_has(r.err, "wsync verify: expected two paths, A and B");
  run_clear(&r);
  test_rmtree(conf);
}

static void
test_verify_bad_input(void)
{
  g_autofree char *dir = test_tmpdir();
  g_autofree char *conf = test_tmpdir();
  g_autofree char *a = write_reference(dir, "a.safetensors");
  g_autofree char *broken = test_write(dir, "broken.safetensors", "abc");

  Run r = run_verify(conf, a, broken, FALSE);
  g_assert_cmpint(r.status, ==, 3);
  g_autofree char *prefix = g_strdup_printf("wsync: %s: ", broken);
  g_assert_true(g_str_has_prefix(r.err, prefix));
  g_assert_cmpstr(r.out, ==, "");
  run_clear(&r);

  g_autofree char *missing = g_build_filename(dir, "missing.safetensors", NULL);
  r = run_verify(conf, missing, a, FALSE);
  g_assert_cmpint(r.status, ==, 4);
  assert_has(r.err, "missing.safetensors");
  g_assert_cmpstr(r.out, ==, "");
  run_clear(&r);

  /* A broken configuration is an error even though verify needs no plugin */
  g_free(test_write(conf, "10.conf", "sync {\n  tp = two\n}\n"));
  r = run_verify(conf, a, a, FALSE);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.out, ==, "");
  run_clear(&r);
  test_rmtree(dir);
  test_rmtree(conf);
}

static void
test_env_exports(void)
{
  g_autofree char *conf = test_tmpdir();
  const char *pdir = test_env_dir("WSYNC_TEST_PLUGIN_DIR");
  g_free(test_write(conf, "10.conf", "plugin \"good\" {}\nplugin \"rival\" {}\n"));

  /* rival (priority 50) sets GOOD_MODE first; good replaces it, keeping its place */
  Run r = run_wsync("env", "--backend", "test-backend", "--mode", "colocate", "--conf-dir", conf,
                    "--plugin-dir", pdir, NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.out, ==,
                  "# the mode, after what rival set\n"
                  "export GOOD_MODE='colocate-rival'\n"
                  "# an empty value is still set explicitly\n"
                  "export RIVAL_EMPTY=''\n"
                  "# a value with a quote\n"
                  "export GOOD_QUOTE='it'\\''s here'\n");
  run_clear(&r);

  r = run_wsync("env", "--backend", "test-backend", "--mode", "server", "--json", "--conf-dir",
                conf, "--plugin-dir", pdir, NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_autoptr(JsonParser) parser = json_parser_new();
  g_assert_true(json_parser_load_from_data(parser, r.out, -1, NULL));
  JsonObject *root = json_node_get_object(json_parser_get_root(parser));
  g_assert_cmpstr(json_object_get_string_member(root, "mode"), ==, "server");
  JsonArray *vars = json_object_get_array_member(root, "variables");
  g_assert_cmpuint(json_array_get_length(vars), ==, 3);
  JsonObject *first = json_array_get_object_element(vars, 0);
  g_assert_cmpstr(json_object_get_string_member(first, "name"), ==, "GOOD_MODE");
  g_assert_cmpstr(json_object_get_string_member(first, "value"), ==, "server-rival");
  run_clear(&r);

  /* a backend nobody patches (or a misspelt one): nothing on stdout, which a shell may
   * eval, and a note on stderr naming the backends that have patches */
  r = run_wsync("env", "--backend", "cuda", "--mode", "server", "--conf-dir", conf,
                "--plugin-dir", pdir, NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.out, ==, "");
  g_assert_cmpstr(r.err, ==,
                  "wsync env: note: no plugin patches the environment of backend \"cuda\", so "
                  "there is nothing to set (backends with patches: test-backend)\n");
  run_clear(&r);
  /* the backend as every message names a value: escaped, not raw to the terminal */
  r = run_wsync("env", "--backend", "cu\033[2Jda", "--mode", "server", "--conf-dir", conf,
                "--plugin-dir", pdir, NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.out, ==, "");
  g_assert_cmpstr(r.err, ==,
                  "wsync env: note: no plugin patches the environment of backend "
                  "\"cu\\x1b[2Jda\", so there is nothing to set (backends with patches: "
                  "test-backend)\n");
  run_clear(&r);
  r = run_wsync("env", "-q", "--backend", "cuda", "--mode", "server", "--conf-dir", conf,
                "--plugin-dir", pdir, NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.out, ==, "");
  g_assert_cmpstr(r.err, ==, "");
  run_clear(&r);

  /* an engine setting: comment lines after the exports (an eval runs only the exports),
   * "settings" in --json; one with a line break, which would end the comment and put
   * the rest on a line of its own, is a broken plugin's and refused */
  g_setenv("GOOD_SETTING", "{\"k\": 'v'}", TRUE);
  r = run_wsync("env", "--backend", "test-backend", "--mode", "server", "--conf-dir", conf,
                "--plugin-dir", pdir, NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.out, ==,
                  "# the mode, after what rival set\n"
                  "export GOOD_MODE='server-rival'\n"
                  "# an empty value is still set explicitly\n"
                  "export RIVAL_EMPTY=''\n"
                  "# a value with a quote\n"
                  "export GOOD_QUOTE='it'\\''s here'\n"
                  "# a setting no variable makes\n"
                  "# engine setting (no export makes it): good.setting = {\"k\": 'v'}\n");
  run_clear(&r);
  r = run_wsync("env", "--backend", "test-backend", "--mode", "server", "--json", "--conf-dir",
                conf, "--plugin-dir", pdir, NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_true(json_parser_load_from_data(parser, r.out, -1, NULL));
  root = json_node_get_object(json_parser_get_root(parser));
  JsonArray *settings = json_object_get_array_member(root, "settings");
  g_assert_cmpuint(json_array_get_length(settings), ==, 1);
  first = json_array_get_object_element(settings, 0);
  g_assert_cmpuint(json_object_get_size(first), ==, 3);
  g_assert_cmpstr(json_object_get_string_member(first, "name"), ==, "good.setting");
  g_assert_cmpstr(json_object_get_string_member(first, "value"), ==, "{\"k\": 'v'}");
  g_assert_cmpstr(json_object_get_string_member(first, "reason"), ==,
                  "a setting no variable makes");
  run_clear(&r);
  g_setenv("GOOD_SETTING", "0\nrm -rf ~", TRUE);
  r = run_wsync("env", "--backend", "test-backend", "--mode", "server", "--conf-dir", conf,
                "--plugin-dir", pdir, NULL);
  g_unsetenv("GOOD_SETTING");
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.out, ==, "");
  g_assert_cmpstr(r.err, ==,
                  "wsync: an env patch advised setting \"good.setting\" with a line break "
                  "or control character in its name, value or reason, which a comment cannot "
                  "hold\n");
  run_clear(&r);
  /* a C1 control (U+009B, CSI) drives a terminal as ESC [ does: refused as well (the old
   * tree let it through, exit 0) */
  g_setenv("GOOD_SETTING", "0\xc2\x9b" "2J", TRUE);
  r = run_wsync("env", "--backend", "test-backend", "--mode", "server", "--conf-dir", conf,
                "--plugin-dir", pdir, NULL);
  g_unsetenv("GOOD_SETTING");
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.out, ==, "");
  g_assert_cmpstr(r.err, ==,
                  "wsync: an env patch advised setting \"good.setting\" with a line break "
                  "or control character in its name, value or reason, which a comment cannot "
                  "hold\n");
  run_clear(&r);
  /* a variable's reason is the comment above its export: a line break in it would make
   * the rest a command of its own for an eval.  The old tree printed
   * "# a\nrm -rf ~\nexport GOOD_QUOTE=...", exit 0. */
  g_setenv("GOOD_REASON", "a\nrm -rf ~", TRUE);
  r = run_wsync("env", "--backend", "test-backend", "--mode", "server", "--conf-dir", conf,
                "--plugin-dir", pdir, NULL);
  g_unsetenv("GOOD_REASON");
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.out, ==, "");
  g_assert_cmpstr(r.err, ==,
                  "wsync: an env patch set \"GOOD_QUOTE\" with a line break or control "
                  "character in its reason, which a comment cannot hold\n");
  run_clear(&r);

  r = run_wsync("env", "--backend", "test-backend", "--mode", "hybrid", "--conf-dir", conf, NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==, "wsync env: --mode must be colocate or server (see wsync env --help)\n");
  run_clear(&r);
  test_rmtree(conf);
}

/* `wsync sync` runs wsync-mpi, the program that links MPI; without it, one line naming
 * the package and the configure switch, exit 2 (WSYNC_LIBEXECDIR names the only place
 * wsync then looks). */
static void
test_sync_not_installed(void)
{
  g_autofree char *empty = test_tmpdir();
  g_autofree char *expected = g_strdup_printf(
      "wsync sync: the distributed sync is not installed (no wsync-mpi in %s): install the "
      "wsync-mpi package, or build wsync with MPI (./configure --with-mpi)\n",
      empty);
  g_autofree char *saved = g_strdup(g_getenv("WSYNC_LIBEXECDIR"));

  g_setenv("WSYNC_LIBEXECDIR", empty, TRUE);
  Run r = run_wsync("sync", "src", "dst", "--target", "vllm", NULL);
  if (saved != NULL)
    g_setenv("WSYNC_LIBEXECDIR", saved, TRUE);
  else
    g_unsetenv("WSYNC_LIBEXECDIR");
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.out, ==, "");
  g_assert_cmpstr(r.err, ==, expected);
  run_clear(&r);
  g_rmdir(empty);
}

/* Runs wsync COMMAND ARGS... with conf.d selecting hf and sloppy (its option mistake =
 * @mistake), both plugin directories, and a config.json of model_type "sloppy" in @dir
 * (the argument "CONFIG" stands for its path). */
static Run
run_sloppy(const char *dir, const char *mistake, const char *first, ...)
{
  g_autofree char *conf = g_build_filename(dir, "conf", NULL);
  g_autofree char *config = g_build_filename(dir, "config.json", NULL);
  g_autofree char *section = g_strdup_printf("plugin \"hf\" {}\nplugin \"sloppy\" {\n"
                                             "  mistake = \"%s\"\n}\n", mistake);
  g_autoptr(GPtrArray) args = g_ptr_array_new();
  va_list ap;

  g_assert_cmpint(g_mkdir_with_parents(conf, 0755), ==, 0);
  g_free(test_write(conf, "10.conf", section));
  g_free(test_write(dir, "config.json", "{\"model_type\": \"sloppy\", \"hidden_size\": 8}\n"));
  va_start(ap, first);
  for (const char *a = first; a != NULL; a = va_arg(ap, const char *))
    g_ptr_array_add(args, (gpointer)(strcmp(a, "CONFIG") == 0 ? config : a));
  va_end(ap);
  g_ptr_array_add(args, "--conf-dir");
  g_ptr_array_add(args, conf);
  g_ptr_array_add(args, "--plugin-dir");
  g_ptr_array_add(args, (gpointer)test_env_dir("WSYNC_TEST_PLUGIN_DIR"));
  g_ptr_array_add(args, "--plugin-dir");
  g_ptr_array_add(args, (gpointer)test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR"));
  return test_run_args(args);
}

/* A remapper that misuses the model API (a tensor declared twice, too many axes, a
 * param of no parts) is one line naming the remapper and the mistake, exit 2, not a
 * crash: the model records the first mistake as the describe step records a config
 * error, and hands out placeholders so the plugin's code runs on to its end. */
static void
test_remapper_mistakes(void)
{
  static const char *const cases[][2] = {
      {"duplicate-tensor", "declares tensor \"model.x.weight\" twice"},
      {"too-many-axes", "declares tensor \"model.y\" of 17 axes, more than 16"},
      {"no-parts", "declares param \"model.z\" of 0 parts (1 to 8)"},
  };

  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_autofree char *dir = test_tmpdir();
    g_autofree char *dst = g_build_filename(dir, "out", NULL);
    g_autofree char *config = g_build_filename(dir, "config.json", NULL);
    g_autofree char *expected = g_strdup_printf(
        "wsync: %s: remapper sloppy (plugin sloppy) %s\n", config, cases[i][1]);
    Run r = run_sloppy(dir, cases[i][0], "synth", "--config", "CONFIG", dst, NULL);
    g_assert_cmpint(r.status, ==, 2);
    g_assert_cmpstr(r.err, ==, expected);
    g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
    run_clear(&r);
    test_rmtree(dir);
  }
}

/* A callback that returns FALSE and sets no error (the GError convention broken) is
 * reported as that entry's failure, exit 2, not a crash or a silent exit. */
static void
test_callbacks_failing_silently(void)
{
  g_autofree char *dir = test_tmpdir();
  g_autofree char *config = g_build_filename(dir, "config.json", NULL);
  g_autofree char *hf = g_build_filename(dir, "hf", NULL);
  g_autofree char *out = g_build_filename(dir, "out", NULL);
  g_autofree char *expected = NULL;

  Run r = run_sloppy(dir, "silent-remapper", "synth", "--config", "CONFIG", out, NULL);
  expected = g_strdup_printf("wsync: %s: remapper sloppy (plugin sloppy): failed and gave no "
                             "reason\n", config);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==, expected);
  g_assert_false(g_file_test(out, G_FILE_TEST_EXISTS));
  run_clear(&r);

  r = run_sloppy(dir, "silent", "config", "CONFIG", NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.out, ==, "");
  g_assert_cmpstr(r.err, ==, "wsync: config patcher \"sloppy-patch\" (plugin \"sloppy\"): "
                             "failed and gave no reason\n");
  run_clear(&r);

  r = run_sloppy(dir, "silent", "env", "--backend", "sloppy", "--mode", "server", NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.out, ==, "");
  g_assert_cmpstr(r.err, ==, "wsync: env patch \"sloppy-env\" (plugin \"sloppy\"): failed "
                             "and gave no reason\n");
  run_clear(&r);

  r = run_sloppy(dir, "none", "synth", "--config", "CONFIG", hf, NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  r = run_sloppy(dir, "silent", "plan", hf, "--target", "hf-experts", NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==, "wsync: hook sloppy-hook (plugin sloppy): failed and gave no "
                             "reason\n");
  run_clear(&r);
  r = run_sloppy(dir, "silent", "convert", hf, out, "--target", "sloppy", NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==, "wsync: converter sloppy (plugin sloppy): failed and gave no "
                             "reason\n");
  g_assert_false(g_file_test(out, G_FILE_TEST_EXISTS));
  run_clear(&r);
  test_rmtree(dir);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/cli/env", test_env_exports);
  g_test_add_func("/cli/version", test_version);
  g_test_add_func("/cli/version-on-every-command", test_version_on_every_command);
  g_test_add_func("/cli/help", test_help_lists_commands_and_exit_codes);
  g_test_add_func("/cli/quiet-and-verbose", test_quiet_and_verbose_refused);
  g_test_add_func("/cli/usage-errors", test_usage_errors);
  g_test_add_func("/cli/sync-not-installed", test_sync_not_installed);
  g_test_add_func("/cli/plugins-text", test_plugins_text);
  g_test_add_func("/cli/plugins-json", test_plugins_json);
  g_test_add_func("/cli/plugins-name-clash", test_plugins_name_clash);
  g_test_add_func("/cli/config-bad-rope-format", test_config_bad_rope_format);
  g_test_add_func("/cli/config-empty", test_config_empty);
  g_test_add_func("/cli/empty-path-named", test_empty_path_named);
  g_test_add_func("/cli/plugin-dir-not-a-directory", test_plugin_dir_not_a_directory);
  g_test_add_func("/cli/plugin-dir-unreadable", test_plugin_dir_unreadable);
  g_test_add_func("/cli/fifo-input-never-opened", test_fifo_input_never_opened);
  g_test_add_func("/cli/input-replaced-after-stat", test_input_replaced_after_stat);
  g_test_add_func("/cli/trusted-fifo-never-opened", test_trusted_fifo_never_opened);
  g_test_add_func("/cli/conf-file-replaced-after-lstat", test_conf_file_replaced_after_lstat);
  g_test_add_func("/cli/synth-layers-needs-declared-count", test_synth_layers_needs_declared_count);
  g_test_add_func("/cli/synth-numbers", test_synth_numbers);
  g_test_add_func("/cli/no-plugin-selected", test_no_plugin_selected);
  g_test_add_func("/cli/config-error", test_config_error_exit_2);
  g_test_add_func("/cli/inspect", test_inspect_text_and_json);
  g_test_add_func("/cli/inspect-bad-input", test_inspect_bad_input_exit_3);
  g_test_add_func("/cli/inspect-metadata", test_inspect_metadata);
  g_test_add_func("/cli/json-nul-escape", test_json_nul_escape_refused);
  g_test_add_func("/cli/config-patchers", test_config_runs_patchers_in_order);
  g_test_add_func("/cli/verify/equal", test_verify_equal_files);
  g_test_add_func("/cli/verify/file-vs-sharded-dir", test_verify_file_vs_sharded_dir);
  g_test_add_func("/cli/verify/data", test_verify_data_differs);
  g_test_add_func("/cli/verify/dtype", test_verify_dtype_differs);
  g_test_add_func("/cli/verify/shape", test_verify_shape_differs);
  g_test_add_func("/cli/verify/missing", test_verify_missing_tensor);
  g_test_add_func("/cli/verify/json", test_verify_json);
  g_test_add_func("/cli/verify/records", test_verify_records);
  g_test_add_func("/cli/verify/usage-errors", test_verify_usage_errors);
  g_test_add_func("/cli/verify/bad-input", test_verify_bad_input);
  g_test_add_func("/cli/plugin-mistakes/remapper", test_remapper_mistakes);
  g_test_add_func("/cli/plugin-mistakes/silent-failures", test_callbacks_failing_silently);
  return g_test_run();
}
