/* Fuzzing conf.d: the bytes become a conf.d file read by wsync_context_new() with the
 * test plugins and the built ones on the plugin path: the bounded trusted read, comment
 * blanking, the nesting check, libconfuse's two passes, option ownership, plugin
 * validators and the merge.  A refusal must be one clean line of configuration error.
 * See fuzz-driver.h.  The plugin directories come from WSYNC_TEST_PLUGIN_DIR and
 * WSYNC_TEST_BUILT_PLUGIN_DIR (set by make check, and by tests/fuzz.sh). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <unistd.h>

#include <wsync/wsync.h>

#define FUZZ_NAME "conf"
#include "fuzz-driver.h"

static char *conf_dir;
static char *conf_file;

static void
fuzz_setup(void)
{
  GError *error = NULL;
  conf_dir = g_dir_make_tmp("wsync-fuzz-conf-XXXXXX", &error);
  g_assert_no_error(error);
  conf_file = g_build_filename(conf_dir, "10-fuzz.conf", NULL);
}

static void
fuzz_teardown(void)
{
  g_unlink(conf_file);
  g_rmdir(conf_dir);
  g_free(conf_file);
  g_free(conf_dir);
}

static void
fuzz_seeds(GPtrArray *seeds)
{
  static const char *const texts[] = {
      "# the test plugins\nplugin \"good\" {\n  level = 4\n  mode = \"slow\"\n  flag = true\n"
      "  names = {\"a\", \"b\"}\n}\nplugin \"rival\" {}\n",
      "plugin \"good\" { enabled = false }\nsync {\n  target = \"vllm\"\n  tp = 4\n"
      "  part-size = \"5G\"\n}\n",
      "/* block */ plugin \"vllm\" {\n  vllm-version = \"0.22.1\"\n  attn-scales = true\n}\n"
      "// line\nplugin 'qwen3_moe' {}\n",
      "plugin \"rope-compat\" {\n  rope-format = \"keep\"\n}\nplugin \"bad-abi\" {}\n",
      "",
  };
  for (guint i = 0; i < G_N_ELEMENTS(texts); i++)
    g_ptr_array_add(seeds, g_bytes_new_static(texts[i], strlen(texts[i])));
}

static const char *const *
fuzz_dictionary(void)
{
  static const char *const tokens[] = {
    "plugin", "sync", "enabled", "true", "false", "\"good\"", "\"rival\"", "\"vllm\"",
    "\"bad-abi\"", "\"nonexistent\"", "level", "mode", "flag", "names", "target", "tp",
    "vllm-version", "attn-scales", "rope-format", "{", "}", "(", ")", "=", "+=", ",", "\"",
    "'", "\\", "\\n", "\\x1b", "#", "//", "/*", "*/", "include(\"x\")", "9223372036854775808",
    "-1", "1e999", "\n", NULL};
  return tokens;
}

static gboolean
fuzz_one(const guint8 *data, gsize len)
{
  static const WsyncError allowed[] = {WSYNC_ERROR_CONFIG};
  const char *plugin_dirs[] = {g_getenv("WSYNC_TEST_PLUGIN_DIR"),
                               g_getenv("WSYNC_TEST_BUILT_PLUGIN_DIR"), NULL};
  const char *conf_dirs[] = {conf_dir, NULL};
  GError *error = NULL;

  if (plugin_dirs[0] == NULL || plugin_dirs[1] == NULL)
    g_error("WSYNC_TEST_PLUGIN_DIR and WSYNC_TEST_BUILT_PLUGIN_DIR must be set");
  int fd = open(conf_file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || (len > 0 && write(fd, data, len) != (ssize_t)len) || close(fd) != 0)
    g_error("cannot write %s", conf_file);
  WsyncContext *ctx = wsync_context_new(conf_dirs, plugin_dirs, NULL, &error);
  if (ctx == NULL) {
    fuzz_check_refusal(error, allowed, G_N_ELEMENTS(allowed));
    g_error_free(error);
    return FALSE;
  }
  wsync_context_free(ctx);
  return TRUE;
}

