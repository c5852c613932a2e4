/* The context: conf.d parsing and merging, plugin selection, loading and refusal. */
#define _GNU_SOURCE
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <wsync/wsync.h>

#include "testutil.h"

typedef struct {
  char *conf;    /* a fresh conf.d */
  char *scratch; /* a fresh directory for plugin copies */
} Fixture;

static void
fixture_setup(Fixture *f, gconstpointer data)
{
  (void)data;
  f->conf = test_tmpdir();
  f->scratch = test_tmpdir();
}

static void
fixture_teardown(Fixture *f, gconstpointer data)
{
  (void)data;
  chmod(f->scratch, 0700);
  chmod(f->conf, 0700);
  test_rmtree(f->conf);
  test_rmtree(f->scratch);
  g_free(f->conf);
  g_free(f->scratch);
}

static WsyncContext *
load(Fixture *f, const char *overrides, GError **error)
{
  const char *conf_dirs[] = {f->conf, NULL};
  const char *plugin_dirs[] = {test_env_dir("WSYNC_TEST_PLUGIN_DIR"), NULL};
  return wsync_context_new(conf_dirs, plugin_dirs, overrides, error);
}

typedef struct {
  GString *text;
} Listing;

static void
list_plugin(const char *name, WsyncPluginState state, const char *path, const char *description,
            const char *reason, gpointer user_data)
{
  Listing *l = user_data;
  static const char *states[] = {"active", "disabled", "refused"};
  (void)path;
  (void)description;
  g_string_append_printf(l->text, "%s=%s%s%s;", name, states[state], reason ? ":" : "",
                         reason ? reason : "");
}

static char *
listing(WsyncContext *ctx)
{
  Listing l = {g_string_new(NULL)};
  wsync_context_foreach_plugin(ctx, list_plugin, &l);
  return g_string_free(l.text, FALSE);
}

static void
free_path(char *p)
{
  g_free(p);
}

/* ------------------------------------------------------------------ selection and options */

static void
test_only_selected_plugins_load(Fixture *f, gconstpointer data)
{
  (void)data;
  free_path(test_write(f->conf, "10-good.conf", "plugin \"good\" {\n}\n"));
  g_autoptr(GError) error = NULL;
  g_autoptr(WsyncContext) ctx = load(f, NULL, &error);
  g_assert_no_error(error);
  g_autofree char *l = listing(ctx);
  /* rival, fails, bad-abi ... sit in the same directory but nobody selected them */
  g_assert_cmpstr(l, ==, "good=active;");
  WsyncRegistry *r = wsync_context_get_registry(ctx);
  g_assert_cmpuint(wsync_registry_size(r), ==, 5);
  g_autoptr(GPtrArray) hooks = wsync_registry_lookup(r, WSYNC_ENTRY_HOOK, "vllm-ascend");
  g_assert_cmpuint(hooks->len, ==, 1);
  g_assert_cmpstr(wsync_entry_get_name(hooks->pdata[0]), ==, "good-hook");
  g_assert_cmpstr(wsync_entry_get_plugin(hooks->pdata[0]), ==, "good");
  g_assert_cmpint(wsync_entry_get_priority(hooks->pdata[0]), ==, -5);
}

static void
test_no_configuration_no_plugins(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autoptr(GError) error = NULL;
  g_autoptr(WsyncContext) ctx = load(f, NULL, &error);
  g_assert_no_error(error);
  g_autofree char *l = listing(ctx);
  g_assert_cmpstr(l, ==, "");
  g_assert_cmpuint(wsync_registry_size(wsync_context_get_registry(ctx)), ==, 0);
}

static void
test_defaults_and_sorted_merge(Fixture *f, gconstpointer data)
{
  (void)data;
  /* written out of order on purpose: files are read sorted by name */
  free_path(test_write(f->conf, "20-b.conf", "plugin \"good\" {\n  mode = \"slow\"\n}\n"));
  free_path(test_write(f->conf, "10-a.conf",
                       "plugin \"good\" {\n  level = 5\n  mode = \"medium\"\n"
                       "  names = {\"x\", \"y\"}\n}\n"));
  free_path(test_write(f->conf, "README", "not a conf file: ignored {{{"));
  free_path(test_write(f->conf, ".90-hidden.conf", "plugin \"good\" { level = 99 }"));
  g_autoptr(GError) error = NULL;
  g_autoptr(WsyncContext) ctx = load(f, NULL, &error);
  g_assert_no_error(error);
  cfg_t *opts = wsync_context_get_plugin_options(ctx, "good");
  g_assert_nonnull(opts);
  g_assert_cmpint(cfg_getint(opts, "level"), ==, 5);      /* from 10-a, untouched by 20-b */
  g_assert_cmpstr(cfg_getstr(opts, "mode"), ==, "slow");  /* 20-b wins */
  g_assert_false(cfg_getbool(opts, "flag"));              /* default */
  g_assert_cmpuint(cfg_size(opts, "names"), ==, 2);
  g_assert_cmpstr(cfg_getnstr(opts, "names", 1), ==, "y");
}

static void
test_later_file_disables(Fixture *f, gconstpointer data)
{
  (void)data;
  free_path(test_write(f->conf, "10-a.conf", "plugin \"good\" {\n  level = 7\n}\n"
                                             "plugin \"rival\" {\n}\n"));
  free_path(test_write(f->conf, "90-off.conf", "plugin \"good\" {\n  enabled = false\n}\n"));
  g_autoptr(GError) error = NULL;
  g_autoptr(WsyncContext) ctx = load(f, NULL, &error);
  g_assert_no_error(error);
  g_autofree char *l = listing(ctx);
  g_assert_cmpstr(l, ==, "good=disabled;rival=active;");
  /* exactly rival's entries remain */
  WsyncRegistry *r = wsync_context_get_registry(ctx);
  g_assert_cmpuint(wsync_registry_size(r), ==, 3);
  g_autoptr(GPtrArray) remappers = wsync_registry_lookup(r, WSYNC_ENTRY_REMAPPER, NULL);
  g_assert_cmpuint(remappers->len, ==, 1);
  g_assert_cmpstr(wsync_entry_get_plugin(remappers->pdata[0]), ==, "rival");
  g_assert_null(wsync_context_get_plugin_options(ctx, "good"));
}

static void
test_later_file_reenables(Fixture *f, gconstpointer data)
{
  (void)data;
  free_path(test_write(f->conf, "10-a.conf", "plugin \"good\" {\n  enabled = false\n}\n"));
  free_path(test_write(f->conf, "20-b.conf", "plugin \"good\" {\n  enabled = true\n}\n"));
  g_autoptr(GError) error = NULL;
  g_autoptr(WsyncContext) ctx = load(f, NULL, &error);
  g_assert_no_error(error);
  g_autofree char *l = listing(ctx);
  g_assert_cmpstr(l, ==, "good=active;");
}

static void
test_dispatch_order_across_plugins(Fixture *f, gconstpointer data)
{
  (void)data;
  free_path(test_write(f->conf, "10.conf", "plugin \"good\" {}\nplugin \"rival\" {}\n"));
  g_autoptr(GError) error = NULL;
  g_autoptr(WsyncContext) ctx = load(f, NULL, &error);
  g_assert_no_error(error);
  WsyncRegistry *r = wsync_context_get_registry(ctx);
  g_autoptr(GPtrArray) patchers = wsync_registry_lookup(r, WSYNC_ENTRY_CONFIG_PATCHER, NULL);
  g_assert_cmpuint(patchers->len, ==, 2);
  g_assert_cmpstr(wsync_entry_get_name(patchers->pdata[0]), ==, "rival-patch"); /* priority 50 */
  g_assert_cmpstr(wsync_entry_get_name(patchers->pdata[1]), ==, "good-patch");
  g_autoptr(GPtrArray) remappers = wsync_registry_lookup(r, WSYNC_ENTRY_REMAPPER, "qwen3_moe");
  g_assert_cmpuint(remappers->len, ==, 2);
  g_assert_cmpstr(wsync_entry_get_name(remappers->pdata[0]), ==, "a-remap"); /* tie: by name */
  g_autoptr(GPtrArray) dense = wsync_registry_lookup(r, WSYNC_ENTRY_REMAPPER, "qwen3");
  g_assert_cmpuint(dense->len, ==, 1);
  g_assert_cmpstr(wsync_entry_get_name(dense->pdata[0]), ==, "good-remap");
}

static void
test_sync_section(Fixture *f, gconstpointer data)
{
  (void)data;
  free_path(test_write(f->conf, "10.conf", "sync {\n  target = \"vllm\"\n  tp = 2\n}\n"));
  free_path(test_write(f->conf, "20.conf", "sync {\n  tp = 4\n}\n"));
  g_autoptr(GError) error = NULL;
  g_autoptr(WsyncContext) ctx = load(f, NULL, &error);
  g_assert_no_error(error);
  g_assert_cmpstr(wsync_context_get_sync_option(ctx, "target"), ==, "vllm");
  g_assert_cmpstr(wsync_context_get_sync_option(ctx, "tp"), ==, "4");
  g_assert_null(wsync_context_get_sync_option(ctx, "ep"));
}

static void
test_overrides_come_last(Fixture *f, gconstpointer data)
{
  (void)data;
  free_path(test_write(f->conf, "10.conf", "plugin \"good\" {\n  level = 5\n}\n"));
  g_autoptr(GError) error = NULL;
  g_autoptr(WsyncContext) ctx = load(f, "plugin \"good\" {\n  level = 9\n}\n", &error);
  g_assert_no_error(error);
  g_assert_cmpint(cfg_getint(wsync_context_get_plugin_options(ctx, "good"), "level"), ==, 9);
}

/* ------------------------------------------------------------------ configuration errors */

static void
expect_config_error(Fixture *f, const char *file, const char *text, const char *line_prefix,
                    const char *fragment)
{
  g_autofree char *path = test_write(f->conf, file, text);
  g_autoptr(GError) error = NULL;
  g_autoptr(WsyncContext) ctx = load(f, NULL, &error);
  g_assert_null(ctx);
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_CONFIG);
  g_autofree char *where = g_strdup_printf("%s:%s", path, line_prefix);
  if (!g_str_has_prefix(error->message, where))
    g_error("message \"%s\" does not start with \"%s\"", error->message, where);
  assert_message_has(error, fragment);
}

static void
test_syntax_error_file_line(Fixture *f, gconstpointer data)
{
  (void)data;
  expect_config_error(f, "10.conf", "plugin \"good\" {\n  level = 5\n  }\n}\n", "4: ",
                      "unexpected closing brace");
}

static void
test_unknown_plugin_option(Fixture *f, gconstpointer data)
{
  (void)data;
  expect_config_error(f, "10.conf", "plugin \"good\" {\n  level = 5\n  bogus = 1\n}\n", "3: ",
                      "no such option 'bogus' in plugin \"good\"");
}

static void
test_option_of_another_plugin(Fixture *f, gconstpointer data)
{
  (void)data;
  /* `mode` exists, but it is good's, not rival's */
  expect_config_error(f, "10.conf",
                      "plugin \"good\" {}\nplugin \"rival\" {\n  weight = 2\n  mode = \"x\"\n}\n",
                      "4: ", "no such option 'mode' in plugin \"rival\"");
}

static void
test_bad_value(Fixture *f, gconstpointer data)
{
  (void)data;
  expect_config_error(f, "10.conf", "plugin \"good\" {\n\n  level = many\n}\n", "3: ",
                      "level");
}

static void
test_bad_bool(Fixture *f, gconstpointer data)
{
  (void)data;
  expect_config_error(f, "10.conf", "plugin \"good\" {\n  enabled = perhaps\n}\n", "2: ",
                      "enabled");
}

static void
test_unknown_sync_option(Fixture *f, gconstpointer data)
{
  (void)data;
  expect_config_error(f, "10.conf", "sync {\n  tp = 2\n  speed = 11\n}\n", "3: ",
                      "no such option 'speed'");
}

static void
test_unknown_top_level(Fixture *f, gconstpointer data)
{
  (void)data;
  expect_config_error(f, "10.conf", "# comment\nloadplugin = \"good\"\n", "2: ",
                      "no such option 'loadplugin'");
}

static void
test_invalid_plugin_name(Fixture *f, gconstpointer data)
{
  (void)data;
  expect_config_error(f, "10.conf", "\nplugin \"../../tmp/evil\" {}\n", "2: ",
                      "invalid plugin name \"../../tmp/evil\"");
}

/* The line of the section's title, not of the '}' that closes it (libconfuse gives a
 * section that line): in a file where an earlier section, comments and a title spread
 * over lines come first. */
static void
test_invalid_plugin_name_line(Fixture *f, gconstpointer data)
{
  (void)data;
  expect_config_error(f, "10.conf",
                      "plugin \"good\" {\n  mode = \"{plugin \\\"x\\\" {\"\n}\n"
                      "# plugin \"commented\" {\n"
                      "sync { target = \"plugin\" }\n"
                      "plugin \"no such\" {\n  enabled = true\n\n}\n",
                      "6: ", "invalid plugin name \"no such\"");
  expect_config_error(f, "10.conf", "plugin\n  no-such.x\n{\n  enabled = true\n}\n",
                      "1: ", "invalid plugin name \"no-such.x\"");
}

static void
test_duplicate_section_in_one_file(Fixture *f, gconstpointer data)
{
  (void)data;
  expect_config_error(f, "10.conf", "plugin \"good\" {}\nplugin \"good\" {}\n", "2: ",
                      "duplicate");
}

static void
test_error_in_second_file_uses_nothing(Fixture *f, gconstpointer data)
{
  (void)data;
  free_path(test_write(f->conf, "10-ok.conf", "plugin \"good\" { level = 1 }\n"));
  expect_config_error(f, "20-broken.conf", "plugin \"good\" {\n  level = 2\n  level\n}\n", "",
                      "20-broken.conf");
}

static void
test_options_of_unloadable_plugin(Fixture *f, gconstpointer data)
{
  (void)data;
  expect_config_error(f, "10.conf", "plugin \"nonexistent\" {\n  speed = 3\n}\n", "2: ",
                      "plugin \"nonexistent\"");
}

static void
test_error_in_overrides(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autoptr(GError) error = NULL;
  g_autoptr(WsyncContext) ctx = load(f, "plugin \"good\" {\n  level = x\n}\n", &error);
  g_assert_null(ctx);
  g_assert_true(g_str_has_prefix(error->message, "command line:2: "));
}

static void
test_missing_conf_dir(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *missing = g_build_filename(f->conf, "nope", NULL);
  const char *conf_dirs[] = {missing, NULL};
  g_autoptr(GError) error = NULL;
  g_autoptr(WsyncContext) ctx = wsync_context_new(conf_dirs, NULL, NULL, &error);
  g_assert_null(ctx);
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_CONFIG);
  /* one line, the directory named once, the system's reason (not GLib's own sentence) */
  g_autofree char *expect =
      g_strdup_printf("%s: cannot read configuration directory: No such file or directory",
                      missing);
  g_assert_cmpstr(error->message, ==, expect);
}

/* A plugin directory the caller names that is missing or not a directory is refused by
 * wsync_context_new_default() in the words of a bad conf dir, whatever its place in the
 * list; an empty entry is skipped.  (Before, the library skipped it without a word, and
 * the command and the Python module each checked it in their own words.) */
static void
test_plugin_dir_not_a_directory(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *missing = g_build_filename(f->scratch, "nope", NULL);
  g_autofree char *file = test_write(f->scratch, "a-file", "x");
  const char *conf_dirs[] = {f->conf, NULL};
  const char *cases[][2] = {{missing, "No such file or directory"}, {file, "Not a directory"}};
  free_path(test_write(f->conf, "10.conf", "plugin \"good\" {}\n"));
  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    const char *plugin_dirs[] = {test_env_dir("WSYNC_TEST_PLUGIN_DIR"), cases[i][0], NULL};
    g_autoptr(GError) error = NULL;
    g_autoptr(WsyncContext) ctx = wsync_context_new_default(conf_dirs, plugin_dirs, NULL, &error);
    g_assert_null(ctx);
    g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_CONFIG);
    g_autofree char *expect =
        g_strdup_printf("%s: cannot read plugin directory: %s", cases[i][0], cases[i][1]);
    g_assert_cmpstr(error->message, ==, expect);
  }
  const char *with_empty[] = {"", test_env_dir("WSYNC_TEST_PLUGIN_DIR"), NULL};
  g_autoptr(GError) error = NULL;
  g_autoptr(WsyncContext) ctx = wsync_context_new_default(conf_dirs, with_empty, NULL, &error);
  g_assert_no_error(error);
  g_autofree char *l = listing(ctx);
  g_assert_cmpstr(l, ==, "good=active;");
}

/* The directories wsync_context_new_default() adds on its own may be missing (an
 * uninstalled build has no installed one; $WSYNC_PLUGIN_PATH may name a directory not
 * made yet): they are skipped, and the plugins come from the next one. */
static void
test_default_plugin_dirs_may_be_missing(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *missing = g_build_filename(f->scratch, "nope", NULL);
  g_autofree char *file = test_write(f->scratch, "a-file", "x");
  g_autofree char *saved = g_strdup(g_getenv("WSYNC_PLUGIN_PATH"));
  g_autofree char *env =
      g_strjoin(":", missing, file, test_env_dir("WSYNC_TEST_PLUGIN_DIR"), NULL);
  const char *conf_dirs[] = {f->conf, NULL};
  free_path(test_write(f->conf, "10.conf", "plugin \"good\" {}\n"));
  g_setenv("WSYNC_PLUGIN_PATH", env, TRUE);
  g_autoptr(GError) error = NULL;
  g_autoptr(WsyncContext) ctx = wsync_context_new_default(conf_dirs, NULL, NULL, &error);
  if (saved != NULL)
    g_setenv("WSYNC_PLUGIN_PATH", saved, TRUE);
  else
    g_unsetenv("WSYNC_PLUGIN_PATH");
  g_assert_no_error(error);
  g_autofree char *l = listing(ctx);
  g_assert_cmpstr(l, ==, "good=active;");
  /* The installed directory comes last in the path.  In a build that is not installed
   * (as `make check` runs) it is missing too, and the asserts above cover it; where it
   * exists, nothing here says whether it was skipped, so the test says which case ran. */
  g_test_message("%s (installed plugin directory) %s", WSYNC_PLUGIN_DIR,
                 g_file_test(WSYNC_PLUGIN_DIR, G_FILE_TEST_EXISTS)
                     ? "exists: its being missing was not tested"
                     : "is missing: the context was made all the same");
}

/* ------------------------------------------------------------------ refused plugins */

static void
expect_refused(Fixture *f, const char *name, const char *fragment)
{
  g_autofree char *text = g_strdup_printf("plugin \"%s\" {}\nplugin \"good\" {}\n", name);
  free_path(test_write(f->conf, "10.conf", text));
  g_autoptr(GError) error = NULL;
  g_autoptr(WsyncContext) ctx = load(f, NULL, &error);
  g_assert_no_error(error); /* a refused plugin does not fail the context */
  g_autofree char *l = listing(ctx);
  g_autofree char *expect = g_strdup_printf("%s=refused:", name);
  if (strstr(l, expect) == NULL || strstr(l, fragment) == NULL || strstr(l, "good=active;") == NULL)
    g_error("listing \"%s\" lacks \"%s\" ... \"%s\"", l, expect, fragment);
  /* only good's entries are in the table */
  g_assert_cmpuint(wsync_registry_size(wsync_context_get_registry(ctx)), ==, 5);
}

static void
test_refuse_abi_mismatch(Fixture *f, gconstpointer data)
{
  (void)data;
  expect_refused(f, "bad-abi", "bad-abi.so: built for plugin ABI 999, this wsync has ABI 1");
}

static void
test_refuse_missing_register(Fixture *f, gconstpointer data)
{
  (void)data;
  expect_refused(f, "no-register", "no-register.so: lacks the symbol wsync_plugin_register");
}

static void
test_refuse_missing_descriptor(Fixture *f, gconstpointer data)
{
  (void)data;
  expect_refused(f, "no-descriptor",
                 "no-descriptor.so: lacks the symbol wsync_plugin_descriptor");
}

static void
test_refuse_failed_registration(Fixture *f, gconstpointer data)
{
  (void)data;
  expect_refused(f, "fails", "failed to register: deliberate failure after one entry");
}

/* An option `wsync plugins` would list without saying what it does */
static void
test_refuse_undocumented_option(Fixture *f, gconstpointer data)
{
  (void)data;
  expect_refused(f, "undocumented",
                 "undocumented.so: option \"unsaid\" has no description (its comment must say "
                 "what it does: WSYNC_OPTION_DOC(description, values), <wsync/plugin.h>);");
}

/* A description of blanks only says no more than none */
static void
test_refuse_blank_option_description(Fixture *f, gconstpointer data)
{
  (void)data;
  expect_refused(f, "blank-doc",
                 "blank-doc.so: option \"blank\" has no description (its comment must say "
                 "what it does: WSYNC_OPTION_DOC(description, values), <wsync/plugin.h>);");
}

static void
test_refuse_misnamed(Fixture *f, gconstpointer data)
{
  (void)data;
  expect_refused(f, "misnamed", "its descriptor names it \"someone-else\"");
}

static void
test_refuse_missing(Fixture *f, gconstpointer data)
{
  (void)data;
  expect_refused(f, "nonexistent", "no nonexistent.so in the plugin path");
  /* a misspelt name: the refusal says which file names it, and on which line */
  g_autofree char *where = g_strdup_printf(" (selected in %s/10.conf:1)", f->conf);
  expect_refused(f, "nonexistent", where);

  /* the line of the section's title, not of its closing '}' (libconfuse's), and the
   * first section to name it when two files do */
  free_path(test_write(f->conf, "10.conf",
                       "# a comment\n\nplugin \"good\" {}\nplugin \"nonexistent\" {\n"
                       "  enabled = true\n}\n"));
  free_path(test_write(f->conf, "20.conf", "plugin \"nonexistent\" {}\n"));
  g_autoptr(GError) error = NULL;
  g_autoptr(WsyncContext) ctx = load(f, NULL, &error);
  g_assert_no_error(error);
  g_autofree char *l = listing(ctx);
  g_autofree char *at_line = g_strdup_printf(" (selected in %s/10.conf:4);", f->conf);
  if (strstr(l, at_line) == NULL)
    g_error("listing \"%s\" lacks \"%s\"", l, at_line);
}

static char *
built_plugin(const char *name)
{
  g_autofree char *file = g_strconcat(name, ".so", NULL);
  return g_build_filename(test_env_dir("WSYNC_TEST_PLUGIN_DIR"), file, NULL);
}

static WsyncContext *
load_from(Fixture *f, const char *plugin_dir, GError **error)
{
  const char *conf_dirs[] = {f->conf, NULL};
  const char *plugin_dirs[] = {plugin_dir, test_env_dir("WSYNC_TEST_PLUGIN_DIR"), NULL};
  return wsync_context_new(conf_dirs, plugin_dirs, NULL, error);
}

/* A plugin refused from a directory whose name holds a newline: the reason, which
 * quotes its path, is one printable line (it was two: "DIR/a", "b/misnamed.so: ..."). */
static void
test_refuse_reason_one_line(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *dir = g_build_filename(f->scratch, "a\nb", NULL);
  g_assert_cmpint(g_mkdir(dir, 0755), ==, 0);
  g_autofree char *built = built_plugin("misnamed");
  g_autofree char *copy = g_build_filename(dir, "misnamed.so", NULL);
  g_autofree char *bytes = NULL;
  gsize len;
  g_assert_true(g_file_get_contents(built, &bytes, &len, NULL));
  g_assert_true(g_file_set_contents(copy, bytes, (gssize)len, NULL));
  free_path(test_write(f->conf, "10.conf", "plugin \"misnamed\" {}\n"));
  g_autoptr(GError) error = NULL;
  g_autoptr(WsyncContext) ctx = load_from(f, dir, &error);
  g_assert_no_error(error);
  g_autofree char *l = listing(ctx);
  g_autofree char *want = g_strdup_printf(
      "misnamed=refused:%s/a\\x0ab/misnamed.so: its descriptor names it \"someone-else\";",
      f->scratch);
  g_assert_cmpstr(l, ==, want);
}

static void
test_refuse_symlink(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *target = built_plugin("good");
  g_autofree char *link = g_build_filename(f->scratch, "good.so", NULL);
  g_assert_cmpint(symlink(target, link), ==, 0);
  free_path(test_write(f->conf, "10.conf", "plugin \"good\" {}\n"));
  g_autoptr(GError) error = NULL;
  g_autoptr(WsyncContext) ctx = load_from(f, f->scratch, &error);
  g_assert_no_error(error);
  g_autofree char *l = listing(ctx);
  /* the first match in the path is the symlink: refused, not skipped over */
  g_autofree char *expect = g_strdup_printf("good=refused:%s: is a symlink", link);
  g_assert_true(g_str_has_prefix(l, expect));
  g_assert_cmpuint(wsync_registry_size(wsync_context_get_registry(ctx)), ==, 0);
}

static void
test_refuse_world_writable_dir(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *source = built_plugin("good");
  g_autofree char *copy = g_build_filename(f->scratch, "good.so", NULL);
  test_copy(source, copy);
  g_assert_cmpint(chmod(f->scratch, 0777), ==, 0);
  free_path(test_write(f->conf, "10.conf", "plugin \"good\" {}\n"));
  g_autoptr(GError) error = NULL;
  g_autoptr(WsyncContext) ctx = load_from(f, f->scratch, &error);
  g_assert_no_error(error);
  g_autofree char *l = listing(ctx);
  g_autofree char *expect =
      g_strdup_printf("good=refused:%s: lies in a world-writable directory (%s, mode 0777);",
                      copy, f->scratch);
  g_assert_cmpstr(l, ==, expect);
}

/* ------------------------------------------------------------------ trust, as ld.so reasons */

static char *listing_from(Fixture *f, const char *dir);

/* Copies good.so into @dir (made with @mode) and returns the listing after loading from
 * @dir first. */
static char *
load_copy_from(Fixture *f, const char *dir, mode_t dir_mode, mode_t file_mode)
{
  g_autofree char *source = built_plugin("good");
  g_autofree char *copy = g_build_filename(dir, "good.so", NULL);
  g_mkdir_with_parents(dir, 0755);
  test_copy(source, copy);
  g_assert_cmpint(chmod(copy, file_mode), ==, 0);
  g_assert_cmpint(chmod(dir, dir_mode), ==, 0);
  return listing_from(f, dir);
}

/* The listing after loading good from @dir first (as it is). */
static char *
listing_from(Fixture *f, const char *dir)
{
  free_path(test_write(f->conf, "10.conf", "plugin \"good\" {}\n"));
  g_autoptr(GError) error = NULL;
  g_autoptr(WsyncContext) ctx = load_from(f, dir, &error);
  g_assert_no_error(error);
  char *l = listing(ctx);
  if (strstr(l, "refused") != NULL)
    g_assert_cmpuint(wsync_registry_size(wsync_context_get_registry(ctx)), ==, 0);
  return l;
}

static void
test_refuse_writable_file(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *copy = g_build_filename(f->scratch, "good.so", NULL);
  g_autofree char *l = load_copy_from(f, f->scratch, 0755, 0666);
  g_autofree char *expect =
      g_strdup_printf("good=refused:%s: is world-writable (mode 0666);", copy);
  g_assert_cmpstr(l, ==, expect);
  g_free(l);
  l = load_copy_from(f, f->scratch, 0755, 0775);
  g_free(expect);
  expect = g_strdup_printf("good=refused:%s: is group-writable (mode 0775);", copy);
  g_assert_cmpstr(l, ==, expect);
}

/* A safe-looking directory inside one anybody can write to can be swapped whole. */
static void
test_refuse_writable_ancestor(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *sub = g_build_filename(f->scratch, "lib", "plugins", NULL);
  g_autofree char *lib = g_build_filename(f->scratch, "lib", NULL);
  g_autofree char *copy = g_build_filename(sub, "good.so", NULL);
  g_mkdir_with_parents(sub, 0755);
  g_assert_cmpint(chmod(f->scratch, 0777), ==, 0);
  g_autofree char *l = load_copy_from(f, sub, 0755, 0755);
  g_autofree char *expect = g_strdup_printf(
      "good=refused:%s: lies in a world-writable directory (%s, mode 0777);", copy, f->scratch);
  g_assert_cmpstr(l, ==, expect);
  g_free(l);

  /* with the sticky bit (as /tmp has) nobody else may rename what is in it: accepted */
  g_assert_cmpint(chmod(f->scratch, 01777), ==, 0);
  l = load_copy_from(f, sub, 0755, 0755);
  g_assert_cmpstr(l, ==, "good=active;");
  g_free(l);
  /* the group may not write to any of them either */
  g_assert_cmpint(chmod(f->scratch, 0700), ==, 0);
  g_assert_cmpint(chmod(lib, 0770), ==, 0);
  l = load_copy_from(f, sub, 0755, 0755);
  g_free(expect);
  expect = g_strdup_printf("good=refused:%s: lies in a group-writable directory (%s, mode 0770);",
                           copy, lib);
  g_assert_cmpstr(l, ==, expect);
}

/* The file and the directories must belong to root or to the user running wsync. */
static void
test_refuse_other_owner(Fixture *f, gconstpointer data)
{
  (void)data;
  if (geteuid() != 0) {
    g_test_skip("needs root, to give files to another user");
    return;
  }
  g_autofree char *sub = g_build_filename(f->scratch, "plugins", NULL);
  g_autofree char *copy = g_build_filename(sub, "good.so", NULL);
  g_autofree char *l = load_copy_from(f, sub, 0755, 0755);
  g_assert_cmpstr(l, ==, "good=active;");
  g_free(l);
  g_assert_cmpint(chown(copy, 65534, 65534), ==, 0);
  l = listing_from(f, sub);
  g_autofree char *expect = g_strdup_printf(
      "good=refused:%s: is owned by uid 65534, neither root nor the user running wsync (uid 0);",
      copy);
  g_assert_cmpstr(l, ==, expect);
  g_free(l);
  g_assert_cmpint(chown(copy, 0, 0), ==, 0);
  g_assert_cmpint(chown(sub, 65534, 65534), ==, 0);
  l = listing_from(f, sub);
  g_free(expect);
  expect = g_strdup_printf("good=refused:%s: lies in a directory owned by uid 65534, neither root "
                           "nor the user running wsync (uid 0): %s;",
                           copy, sub);
  g_assert_cmpstr(l, ==, expect);
}

/* A symlink among the directories is resolved, and the resolved ones are checked. */
static void
test_symlinked_plugin_dir(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *real = g_build_filename(f->scratch, "real", NULL);
  g_autofree char *link = g_build_filename(f->scratch, "link", NULL);
  g_autofree char *l = load_copy_from(f, real, 0755, 0755);
  g_assert_cmpstr(l, ==, "good=active;");
  g_free(l);
  g_assert_cmpint(symlink(real, link), ==, 0);
  l = load_copy_from(f, link, 0755, 0755);
  g_assert_cmpstr(l, ==, "good=active;");
  g_free(l);
  /* the link itself may sit anywhere, but what it leads to must be safe */
  g_assert_cmpint(chmod(real, 0777), ==, 0);
  g_autoptr(GError) error = NULL;
  g_autoptr(WsyncContext) ctx = load_from(f, link, &error);
  g_assert_no_error(error);
  l = listing(ctx);
  g_autofree char *copy = g_build_filename(link, "good.so", NULL);
  g_autofree char *expect = g_strdup_printf(
      "good=refused:%s: lies in a world-writable directory (%s, mode 0777);", copy, real);
  g_assert_cmpstr(l, ==, expect);
}

/* conf.d: symlinks, writable files and directories are refused like plugins. */
static void
expect_conf_refused(Fixture *f, const char *message)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(WsyncContext) ctx = load(f, NULL, &error);
  g_assert_null(ctx);
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_CONFIG);
  g_assert_cmpstr(error->message, ==, message);
}

static void
test_conf_d_trust(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *elsewhere = test_write(f->scratch, "elsewhere.conf", "plugin \"good\" {}\n");
  g_autofree char *link = g_build_filename(f->conf, "10.conf", NULL);
  g_assert_cmpint(symlink(elsewhere, link), ==, 0);
  g_autofree char *m1 =
      g_strdup_printf("%s: is a symlink; configuration files must be regular files", link);
  expect_conf_refused(f, m1);
  g_unlink(link);

  g_autofree char *file = test_write(f->conf, "10.conf", "plugin \"good\" {}\n");
  g_assert_cmpint(chmod(file, 0646), ==, 0);
  g_autofree char *m2 = g_strdup_printf("%s: is world-writable (mode 0646)", file);
  expect_conf_refused(f, m2);
  g_assert_cmpint(chmod(file, 0644), ==, 0);

  g_assert_cmpint(chmod(f->conf, 0777), ==, 0);
  g_autofree char *m3 =
      g_strdup_printf("configuration directory %s: is world-writable (mode 0777)", f->conf);
  expect_conf_refused(f, m3);
  /* the sticky bit does not help a conf.d: anybody could add a file to it */
  g_assert_cmpint(chmod(f->conf, 01777), ==, 0);
  g_autofree char *m4 =
      g_strdup_printf("configuration directory %s: is world-writable (mode 1777)", f->conf);
  expect_conf_refused(f, m4);
  g_assert_cmpint(chmod(f->conf, 0700), ==, 0);

  if (geteuid() == 0) {
    g_assert_cmpint(chown(file, 65534, 65534), ==, 0);
    g_autofree char *m5 = g_strdup_printf(
        "%s: is owned by uid 65534, neither root nor the user running wsync (uid 0)", file);
    expect_conf_refused(f, m5);
  } else
    g_test_message("not root: the owner check of conf.d files is not exercised");
}

/* A Unix socket (bound, then left behind: its file stays) or a FIFO at @path. */
static void
make_special(const char *path, const char *kind)
{
  if (strcmp(kind, "FIFO") == 0) {
    g_assert_cmpint(mkfifo(path, 0600), ==, 0);
    return;
  }
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  g_assert_cmpuint(strlen(path), <, sizeof addr.sun_path);
  strcpy(addr.sun_path, path);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  g_assert_cmpint(fd, >=, 0);
  g_assert_cmpint(bind(fd, (struct sockaddr *)&addr, sizeof addr), ==, 0);
  close(fd);
}

/* A conf.d file that is a socket is refused as one that is a FIFO is, "PATH: is a
 * socket, not a regular file" (a configuration error), and so is a config.json read
 * through the library's wsync_config_load() (bad input): open(2) of a socket fails with
 * ENXIO before fstat() can tell, and they were "PATH: cannot open: No such device or
 * address" and "cannot open PATH: No such device or address" (an I/O error). */
static void
test_socket_refused_as_fifo(Fixture *f, gconstpointer data)
{
  (void)data;
  static const char *const kinds[] = {"socket", "FIFO"};
  g_autofree char *conf = g_build_filename(f->conf, "10.conf", NULL);
  g_autofree char *config = g_build_filename(f->scratch, "config.json", NULL);

  for (guint k = 0; k < G_N_ELEMENTS(kinds); k++) {
    g_autoptr(GError) error = NULL;
    make_special(conf, kinds[k]);
    g_autofree char *m1 = g_strdup_printf("%s: is a %s, not a regular file", conf, kinds[k]);
    expect_conf_refused(f, m1);
    g_assert_cmpint(g_unlink(conf), ==, 0);

    make_special(config, kinds[k]);
    g_assert_null(wsync_config_load(config, &error));
    g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT);
    g_autofree char *m2 = g_strdup_printf("%s: is a %s, not a regular file", config, kinds[k]);
    g_assert_cmpstr(error->message, ==, m2);
    g_assert_cmpint(g_unlink(config), ==, 0);
  }
}

/* The options of a refused plugin are unknown because the plugin is: the error says
 * why it was refused instead of only "no such option". */
static void
test_refused_plugin_options_say_why(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *path =
      test_write(f->conf, "10.conf", "plugin \"bad-abi\" {\n  speed = 3\n}\n");
  g_autoptr(GError) error = NULL;
  g_autoptr(WsyncContext) ctx = load(f, NULL, &error);
  g_assert_null(ctx);
  g_autofree char *expect = g_strdup_printf(
      "%s:2: option 'speed' of plugin \"bad-abi\" cannot be checked: the plugin was refused: "
      "%s/bad-abi.so: built for plugin ABI 999, this wsync has ABI 1",
      path, test_env_dir("WSYNC_TEST_PLUGIN_DIR"));
  g_assert_cmpstr(error->message, ==, expect);
  g_clear_error(&error);
  /* the same when another loaded plugin has an option of that name */
  free_path(test_write(f->conf, "10.conf",
                       "plugin \"good\" {}\nplugin \"bad-abi\" {\n  level = 3\n}\n"));
  g_autoptr(WsyncContext) ctx2 = load(f, NULL, &error);
  g_assert_null(ctx2);
  g_autofree char *expect2 = g_strdup_printf(
      "%s:3: option 'level' of plugin \"bad-abi\" cannot be checked: the plugin was refused: "
      "%s/bad-abi.so: built for plugin ABI 999, this wsync has ABI 1",
      path, test_env_dir("WSYNC_TEST_PLUGIN_DIR"));
  g_assert_cmpstr(error->message, ==, expect2);
}

static void
test_first_directory_wins(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *source = built_plugin("good");
  g_autofree char *copy = g_build_filename(f->scratch, "good.so", NULL);
  test_copy(source, copy);
  free_path(test_write(f->conf, "10.conf", "plugin \"good\" {}\n"));
  g_autoptr(GError) error = NULL;
  g_autoptr(WsyncContext) ctx = load_from(f, f->scratch, &error);
  g_assert_no_error(error);
  g_autofree char *l = listing(ctx);
  g_assert_cmpstr(l, ==, "good=active;");
}

/* Loads with the plugin path @first, @second, then the built test plugins. */
static WsyncContext *
load_from_two(Fixture *f, const char *first, const char *second, GError **error)
{
  const char *conf_dirs[] = {f->conf, NULL};
  const char *plugin_dirs[] = {first, second, test_env_dir("WSYNC_TEST_PLUGIN_DIR"), NULL};
  return wsync_context_new(conf_dirs, plugin_dirs, NULL, error);
}

/* clash-a and clash-b both register the remapper "shared-remap" (clash-b at the higher
 * priority): both are refused, each naming the other and its file, and only good's
 * entries are in the table, whatever order the conf.d files name them in and whatever
 * order the plugin path finds them in.  (Before: plugins registered first come, first
 * served, so clash-a ran and clash-b was refused because of its name.) */
static void
test_clash_refuses_both_in_any_order(Fixture *f, gconstpointer data)
{
  static const struct {
    const char *file, *text, *other_file, *other_text;
  } confs[] = {
      {"10.conf", "plugin \"clash-a\" {}\nplugin \"clash-b\" {}\nplugin \"good\" {}\n", NULL, NULL},
      {"10.conf", "plugin \"clash-b\" {}\nplugin \"good\" {}\nplugin \"clash-a\" {}\n", NULL, NULL},
      {"10-b.conf", "plugin \"clash-b\" {}\n", "20-a.conf", "plugin \"good\" {}\nplugin \"clash-a\" {}\n"},
      {"10-a.conf", "plugin \"good\" {}\nplugin \"clash-a\" {}\n", "20-b.conf", "plugin \"clash-b\" {}\n"},
  };
  g_autofree char *dir_a = g_build_filename(f->scratch, "a", NULL);
  g_autofree char *dir_b = g_build_filename(f->scratch, "b", NULL);
  g_autofree char *built_a = built_plugin("clash-a");
  g_autofree char *built_b = built_plugin("clash-b");
  g_autofree char *so_a = g_build_filename(dir_a, "clash-a.so", NULL);
  g_autofree char *so_b = g_build_filename(dir_b, "clash-b.so", NULL);
  const char *tail = "; one name, one plugin: all of them are refused (set enabled = false in "
                     "the sections of those not wanted);";
  g_autofree char *expect = g_strdup_printf(
      "clash-a=refused:%s: remapper \"shared-remap\" is also registered by plugin \"clash-b\" "
      "(%s)%sclash-b=refused:%s: remapper \"shared-remap\" is also registered by plugin "
      "\"clash-a\" (%s)%sgood=active;",
      so_a, so_b, tail, so_b, so_a, tail);

  (void)data;
  g_assert_cmpint(g_mkdir(dir_a, 0700), ==, 0);
  g_assert_cmpint(g_mkdir(dir_b, 0700), ==, 0);
  test_copy(built_a, so_a);
  test_copy(built_b, so_b);
  for (guint c = 0; c < G_N_ELEMENTS(confs); c++) {
    for (guint d = 0; d < 2; d++) {
      g_autoptr(GError) error = NULL;
      test_rmtree(f->conf);
      g_assert_cmpint(g_mkdir(f->conf, 0700), ==, 0);
      free_path(test_write(f->conf, confs[c].file, confs[c].text));
      if (confs[c].other_file != NULL)
        free_path(test_write(f->conf, confs[c].other_file, confs[c].other_text));
      g_autoptr(WsyncContext) ctx = d == 0 ? load_from_two(f, dir_a, dir_b, &error)
                                           : load_from_two(f, dir_b, dir_a, &error);
      g_assert_no_error(error);
      g_autofree char *l = listing(ctx);
      if (g_strcmp0(l, expect) != 0)
        g_error("conf %u, plugin path %u: listing\n  %s\nnot\n  %s", c, d, l, expect);
      WsyncRegistry *r = wsync_context_get_registry(ctx);
      g_assert_cmpuint(wsync_registry_size(r), ==, 5); /* good's, and none of theirs */
      g_autoptr(GPtrArray) remappers = wsync_registry_lookup(r, WSYNC_ENTRY_REMAPPER, "qwen3_moe");
      g_assert_cmpuint(remappers->len, ==, 1);
      g_assert_cmpstr(wsync_entry_get_name(remappers->pdata[0]), ==, "good-remap");
    }
  }
}

/* The way out the refusal names: switching one of the two off leaves the other whole. */
static void
test_clash_resolved_by_disabling_one(Fixture *f, gconstpointer data)
{
  (void)data;
  free_path(test_write(f->conf, "10.conf", "plugin \"clash-a\" {}\nplugin \"clash-b\" {}\n"));
  free_path(test_write(f->conf, "90-off.conf", "plugin \"clash-b\" {\n  enabled = false\n}\n"));
  g_autoptr(GError) error = NULL;
  g_autoptr(WsyncContext) ctx = load(f, NULL, &error);
  g_assert_no_error(error);
  g_autofree char *l = listing(ctx);
  g_assert_cmpstr(l, ==, "clash-a=active;clash-b=disabled;");
  WsyncRegistry *r = wsync_context_get_registry(ctx);
  g_assert_cmpuint(wsync_registry_size(r), ==, 2);
  g_autoptr(GPtrArray) remappers = wsync_registry_lookup(r, WSYNC_ENTRY_REMAPPER, "qwen3_moe");
  g_assert_cmpuint(remappers->len, ==, 1);
  g_assert_cmpstr(wsync_entry_get_plugin(remappers->pdata[0]), ==, "clash-a");
}

#define ADD(path, fn) g_test_add(path, Fixture, NULL, fixture_setup, fn, fixture_teardown)

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  ADD("/context/only-selected-plugins-load", test_only_selected_plugins_load);
  ADD("/context/no-configuration", test_no_configuration_no_plugins);
  ADD("/context/defaults-and-sorted-merge", test_defaults_and_sorted_merge);
  ADD("/context/later-file-disables", test_later_file_disables);
  ADD("/context/later-file-reenables", test_later_file_reenables);
  ADD("/context/dispatch-order", test_dispatch_order_across_plugins);
  ADD("/context/sync-section", test_sync_section);
  ADD("/context/overrides-come-last", test_overrides_come_last);
  ADD("/context/error/syntax", test_syntax_error_file_line);
  ADD("/context/error/unknown-plugin-option", test_unknown_plugin_option);
  ADD("/context/error/option-of-another-plugin", test_option_of_another_plugin);
  ADD("/context/error/bad-value", test_bad_value);
  ADD("/context/error/bad-bool", test_bad_bool);
  ADD("/context/error/unknown-sync-option", test_unknown_sync_option);
  ADD("/context/error/unknown-top-level", test_unknown_top_level);
  ADD("/context/error/invalid-plugin-name", test_invalid_plugin_name);
  ADD("/context/error/invalid-plugin-name-line", test_invalid_plugin_name_line);
  ADD("/context/error/duplicate-section", test_duplicate_section_in_one_file);
  ADD("/context/error/second-file", test_error_in_second_file_uses_nothing);
  ADD("/context/error/options-of-unloadable-plugin", test_options_of_unloadable_plugin);
  ADD("/context/error/overrides", test_error_in_overrides);
  ADD("/context/error/missing-conf-dir", test_missing_conf_dir);
  ADD("/context/error/plugin-dir-not-a-directory", test_plugin_dir_not_a_directory);
  ADD("/context/default-plugin-dirs-may-be-missing", test_default_plugin_dirs_may_be_missing);
  ADD("/context/refuse/abi-mismatch", test_refuse_abi_mismatch);
  ADD("/context/refuse/missing-register", test_refuse_missing_register);
  ADD("/context/refuse/missing-descriptor", test_refuse_missing_descriptor);
  ADD("/context/refuse/failed-registration", test_refuse_failed_registration);
  ADD("/context/refuse/misnamed", test_refuse_misnamed);
  ADD("/context/refuse/reason-one-line", test_refuse_reason_one_line);
  ADD("/context/refuse/undocumented-option", test_refuse_undocumented_option);
  ADD("/context/refuse/blank-option-description", test_refuse_blank_option_description);
  ADD("/context/refuse/missing", test_refuse_missing);
  ADD("/context/refuse/symlink", test_refuse_symlink);
  ADD("/context/refuse/world-writable-dir", test_refuse_world_writable_dir);
  ADD("/context/first-directory-wins", test_first_directory_wins);
  ADD("/context/clash/refuses-both-in-any-order", test_clash_refuses_both_in_any_order);
  ADD("/context/clash/resolved-by-disabling-one", test_clash_resolved_by_disabling_one);
  ADD("/context/trust/writable-file", test_refuse_writable_file);
  ADD("/context/trust/writable-ancestor", test_refuse_writable_ancestor);
  ADD("/context/trust/other-owner", test_refuse_other_owner);
  ADD("/context/trust/symlinked-dir", test_symlinked_plugin_dir);
  ADD("/context/trust/conf-d", test_conf_d_trust);
  ADD("/context/trust/conf-d-socket", test_socket_refused_as_fifo);
  ADD("/context/trust/refused-plugin-options", test_refused_plugin_options_say_why);
  return g_test_run();
}
