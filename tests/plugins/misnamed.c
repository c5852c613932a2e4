/* Test plugin whose descriptor names another plugin than its file. */
#include <wsync/wsync.h>

static gboolean
misnamed_register(WsyncPlugin *plugin, GError **error)
{
  (void)plugin;
  (void)error;
  return TRUE;
}

WSYNC_PLUGIN_DEFINE("someone-else", "Descriptor name differs from the file name", NULL,
                    misnamed_register)
