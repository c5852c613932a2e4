/* Test plugin with a register function but no descriptor. */
#include <wsync/wsync.h>

WSYNC_PLUGIN_EXPORT gboolean wsync_plugin_register(WsyncPlugin *plugin, GError **error);

WSYNC_PLUGIN_EXPORT gboolean
wsync_plugin_register(WsyncPlugin *plugin, GError **error)
{
  (void)plugin;
  (void)error;
  return TRUE;
}
