/* wsync: the files that go beside the weight files of an output directory. */
#include "config.h"

#include <errno.h>
#include <string.h>

#include <wsync/checkpoint.h>
#include <wsync/plan.h>

#include "companion.h"

static gboolean
copy_file(const char *from, const char *to, GError **error)
{
  g_autofree char *data = NULL;
  gsize len = 0;
  g_autoptr(GError) local = NULL;

  if (!g_file_get_contents(from, &data, &len, &local) ||
      !g_file_set_contents(to, data, (gssize)len, &local)) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_IO, "%s", local->message);
    return FALSE;
  }
  return TRUE;
}

static char *
config_text(JsonNode *root)
{
  g_autoptr(JsonGenerator) gen = json_generator_new();
  json_generator_set_pretty(gen, TRUE);
  json_generator_set_indent(gen, 2);
  json_generator_set_root(gen, root);
  g_autofree char *text = json_generator_to_data(gen, NULL);
  return g_strconcat(text, "\n", NULL);
}

gboolean
companion_write_config(WsyncContext *ctx, JsonNode *config, const char *src_config,
                       const char *dir, GError **error)
{
  g_autofree char *out = g_build_filename(dir, "config.json", NULL);
  g_autoptr(JsonNode) patched = json_node_copy(config);
  g_autofree char *before = config_text(config);

  if (!wsync_context_patch_config(ctx, patched, error))
    return FALSE;
  g_autofree char *after = config_text(patched);
  if (src_config != NULL && strcmp(before, after) == 0)
    return copy_file(src_config, out, error);
  if (!g_file_set_contents(out, after, -1, NULL)) {
    wsync_set_io_error(error, errno, out, "write");
    return FALSE;
  }
  return TRUE;
}

gboolean
companion_copy_dir(WsyncContext *ctx, JsonNode *config, const char *src_dir, const char *dir,
                   gboolean want_config, GError **error)
{
  g_autoptr(GDir) d = g_dir_open(src_dir, 0, NULL);
  const char *name;

  while (d != NULL && (name = g_dir_read_name(d)) != NULL) {
    g_autofree char *from = g_build_filename(src_dir, name, NULL);
    g_autofree char *to = g_build_filename(dir, name, NULL);
    if (!g_file_test(from, G_FILE_TEST_IS_REGULAR) || g_str_has_suffix(name, ".safetensors") ||
        g_str_has_suffix(name, ".distcp") || strcmp(name, WSYNC_INDEX_NAME) == 0 ||
        name[0] == '.')
      continue;
    if (strcmp(name, "config.json") == 0) {
      if (!companion_write_config(ctx, config, from, dir, error))
        return FALSE;
    } else if (!copy_file(from, to, error))
      return FALSE;
  }
  g_autofree char *written = g_build_filename(dir, "config.json", NULL);
  if (want_config && !g_file_test(written, G_FILE_TEST_EXISTS))
    return companion_write_config(ctx, config, NULL, dir, error);
  return TRUE;
}
