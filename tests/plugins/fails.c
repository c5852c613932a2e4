/* Test plugin whose registration fails half-way: its first entry must be removed. */
#include <wsync/wsync.h>

static gboolean
fails_patch(JsonNode *config, gpointer user_data, GError **error)
{
  (void)config;
  (void)user_data;
  (void)error;
  return TRUE;
}

static gboolean
fails_register(WsyncPlugin *plugin, GError **error)
{
  if (!wsync_plugin_add_config_patcher(plugin, "fails-patch", 0, NULL, fails_patch,
                                       g_strdup("owned"), g_free, error))
    return FALSE;
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_PLUGIN, "deliberate failure after one entry");
  return FALSE;
}

WSYNC_PLUGIN_DEFINE("fails", "Fails to register", NULL, fails_register)
