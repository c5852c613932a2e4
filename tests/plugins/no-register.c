/* Test plugin with a descriptor but no register function. */
#include <wsync/wsync.h>

WSYNC_PLUGIN_EXPORT const WsyncPluginDescriptor wsync_plugin_descriptor = {
    WSYNC_PLUGIN_ABI_VERSION, "no-register", "Lacks its register function", NULL};
