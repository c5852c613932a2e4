/* wsync: internals of the context, shared by the core's own files only. */
#ifndef WSYNC_CONTEXT_PRIVATE_H
#define WSYNC_CONTEXT_PRIVATE_H

#include <ltdl.h>

#include <wsync/registry.h>

/* The bounds of the numbers of conf.d's sync section, which are those of the command
 * options they give defaults for: checked as the file is read (with its line) and again
 * when a command resolves its options (core/command.c). */
#define WSYNC_MAX_TP 4096
#define WSYNC_MAX_EP 4096
#define WSYNC_MAX_RANK (WSYNC_MAX_TP - 1)
#define WSYNC_MAX_THREADS 1024

struct _WsyncPlugin {
  char *name;
  char *path;   /* the file found in the plugin path, or NULL */
  char *reason; /* why it was refused */
  char *selected_by; /* FILE:LINE of the first section that named it */
  WsyncPluginState state;
  gboolean enabled;     /* the configuration's last word */
  gboolean registering; /* inside its register function */
  WsyncRegistry *staged; /* what it registers, until checked against the others */
  lt_dlhandle handle;
  int fd; /* the checked file, loaded through /proc/self/fd; open while handle is */
  const WsyncPluginDescriptor *desc; /* NULL until the ABI check passed */
  WsyncPluginRegisterFunc register_func;
  cfg_t *options; /* merged effective options */
  GPtrArray *warnings; /* char*: wsync_plugin_warn(), or NULL */
  WsyncContext *ctx;
};

struct _WsyncContext {
  WsyncRegistry *registry;
  GPtrArray *plugins;     /* WsyncPlugin*, sorted by name */
  GPtrArray *plugin_dirs; /* char*, NULL-terminated pdata */
  GHashTable *sync_options;
  GHashTable *sync_origins; /* key -> "FILE:LINE" of the value sync_options holds */
  gboolean ltdl_ready;
};

/* Where conf.d set the sync section's @key ("FILE:LINE"), or NULL when it did not: for
 * the errors a value from conf.d causes later, which name no flag the user gave. */
const char *wsync_context_sync_option_origin(WsyncContext *ctx, const char *key);

#endif /* WSYNC_CONTEXT_PRIVATE_H */
