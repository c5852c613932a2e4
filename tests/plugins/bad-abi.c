/* Test plugin built "for another ABI": the loader must refuse it without running it. */
#include <stdlib.h>

#include <wsync/wsync.h>

WSYNC_PLUGIN_EXPORT const WsyncPluginDescriptor wsync_plugin_descriptor = {
    999, "bad-abi", "Claims a plugin ABI nobody has", NULL};

WSYNC_PLUGIN_EXPORT gboolean wsync_plugin_register(WsyncPlugin *plugin, GError **error);

WSYNC_PLUGIN_EXPORT gboolean
wsync_plugin_register(WsyncPlugin *plugin, GError **error)
{
  (void)plugin;
  (void)error;
  abort(); /* if the ABI check let this run, the test process dies */
}
