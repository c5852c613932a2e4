/* wsync: the plugin API.
 *
 * A plugin is one .c file.  Everything in it is static except the two symbols that
 * WSYNC_PLUGIN_DEFINE() writes at the bottom of the file:
 *
 *   - `wsync_plugin_descriptor`, a #WsyncPluginDescriptor: ABI version, name, one-line
 *     description and the plugin's libconfuse option table;
 *   - `wsync_plugin_register`, which adds the plugin's entries to the dispatch table
 *     (remappers: <wsync/model.h>; targets: <wsync/target.h>; hooks: <wsync/layout.h>;
 *     config patchers and environment patches: below).
 *
 * The loader reads the descriptor first and refuses a plugin built for another ABI
 * before any of its code runs.  Plugins are linked `-module -avoid-version` with their
 * exports restricted to those two symbols.
 *
 * A plugin file ends like this:
 *
 *   static cfg_opt_t options[] = {
 *     {.name = "moe-layout", .type = CFGT_STR, .def.string = "processed",
 *      .comment = WSYNC_OPTION_DOC("The layout the routed experts are written in.",
 *                                  "\"processed\" or \"preprocessed\"")},
 *     CFG_END()
 *   };
 *
 *   static gboolean
 *   ascend_register(WsyncPlugin *plugin, GError **error)
 *   {
 *     return wsync_plugin_add_hook(plugin, "ascend-transpose", WSYNC_PRIORITY_DEFAULT,
 *                                  "vllm-ascend", transpose_experts, NULL, NULL, error);
 *   }
 *
 *   WSYNC_PLUGIN_DEFINE("npu-ascend", "vLLM-Ascend processed expert layout", options,
 *                       ascend_register)
 */
#ifndef WSYNC_PLUGIN_H
#define WSYNC_PLUGIN_H

#include <confuse.h>
#include <glib.h>
#include <json-glib/json-glib.h>
#include <wsync/api.h>
#include <wsync/error.h>

G_BEGIN_DECLS

/**
 * WSYNC_PLUGIN_ABI_VERSION:
 *
 * Bumped whenever a change to this header or to the structures it exposes would make
 * a plugin built against the old header misbehave.  A plugin whose descriptor carries
 * another value is refused.
 */
#define WSYNC_PLUGIN_ABI_VERSION 1

/** Name of the exported descriptor symbol. */
#define WSYNC_PLUGIN_DESCRIPTOR_SYMBOL "wsync_plugin_descriptor"
/** Name of the exported register function. */
#define WSYNC_PLUGIN_REGISTER_SYMBOL "wsync_plugin_register"

/** Marks the two symbols a plugin exports (exports are also restricted at link time). */
#define WSYNC_PLUGIN_EXPORT __attribute__((visibility("default")))

/** A loaded plugin, as the core hands it to the plugin's register function. */
typedef struct _WsyncPlugin WsyncPlugin;

/**
 * WsyncPluginDescriptor:
 * @abi_version: #WSYNC_PLUGIN_ABI_VERSION at build time
 * @name: the plugin's name, as in `plugin "NAME" { ... }` and the file name `NAME.so`
 * @description: one line saying what it does
 * @options: (nullable): its option table (libconfuse; scalar and list options of
 *   type int, float, bool and string), terminated by CFG_END(); every option in a
 *   `plugin "NAME"` section must be declared here, each documented in its `comment`
 *   with WSYNC_OPTION_DOC()
 * @reserved: room for growth while the ABI stays 1; zero (WSYNC_PLUGIN_DEFINE() leaves it so)
 */
typedef struct {
  guint32 abi_version;
  const char *name;
  const char *description;
  cfg_opt_t *options;
  gpointer reserved[8];
} WsyncPluginDescriptor;

/**
 * WSYNC_OPTION_DOC:
 * @description: a string literal: what the option does, in sentences, on one line
 * @values: a string literal: the values it takes, in words (`"keep", "transformers5" or
 *   "transformers4"`), or "" to let wsync say them from the option's type
 *
 * The documentation of a plugin option, for the `comment` field of its cfg_opt_t
 * (libconfuse's CFG_STR() and friends leave it NULL: use designated initialisers, as
 * above).  cfg_init() copies it with the table.  `wsync plugins` (and `--json`) shows
 * it with the option's type and default, and wsync.conf(5) lists every in-tree
 * plugin's options from that output.
 *
 * The comment holds the description, a newline, then the values; a comment without a
 * newline is all description.  A plugin with an option whose description is missing,
 * empty or blanks only is refused when its descriptor is read.
 */
#define WSYNC_OPTION_DOC(description, values) (description "\n" values)

/**
 * WsyncPluginRegisterFunc:
 * @plugin: the plugin being registered; its options are already parsed
 * @error: return location for an error
 *
 * Adds the plugin's entries.  If it returns %FALSE the plugin is refused and every
 * entry it added so far is removed again.
 *
 * Returns: %TRUE on success.
 */
typedef gboolean (*WsyncPluginRegisterFunc)(WsyncPlugin *plugin, GError **error);

/**
 * WSYNC_PLUGIN_DEFINE:
 * @plugin_name: string literal, the plugin's name
 * @plugin_description: string literal, one line
 * @plugin_options: a `cfg_opt_t[]` or NULL
 * @register_func: a #WsyncPluginRegisterFunc
 *
 * Defines the two exported symbols.  Put it last in the plugin's file.
 */
#define WSYNC_PLUGIN_DEFINE(plugin_name, plugin_description, plugin_options, register_func) \
  WSYNC_PLUGIN_EXPORT const WsyncPluginDescriptor wsync_plugin_descriptor = {                  \
      .abi_version = WSYNC_PLUGIN_ABI_VERSION,                                             \
      .name = plugin_name,                                                                 \
      .description = plugin_description,                                                   \
      .options = plugin_options};                                                          \
  WSYNC_PLUGIN_EXPORT gboolean wsync_plugin_register(WsyncPlugin *plugin, GError **error);     \
  WSYNC_PLUGIN_EXPORT gboolean wsync_plugin_register(WsyncPlugin *plugin, GError **error)      \
  {                                                                                        \
    return register_func(plugin, error);                                                   \
  }

/* ------------------------------------------------------------------ entry kinds */

/**
 * WsyncEntryKind:
 * @WSYNC_ENTRY_REMAPPER: a weight-name remapper (model plugins): checkpoint names to
 *   logical tensors and back
 * @WSYNC_ENTRY_CONVERTER: a layout converter (backend plugins): a target, whose build
 *   function turns logical tensors into the boxes each rank holds (see
 *   wsync_plugin_add_target(), <wsync/target.h>)
 * @WSYNC_ENTRY_HOOK: a post-load hook: a whole-model step after every tensor is placed
 * @WSYNC_ENTRY_CONFIG_PATCHER: a config.json rewrite
 * @WSYNC_ENTRY_ENV_PATCH: environment settings a backend's deployment needs
 *   (`wsync env`)
 *
 * The kinds of dispatch-table entries.  New kinds are added at the end.
 */
typedef enum {
  WSYNC_ENTRY_REMAPPER,
  WSYNC_ENTRY_CONVERTER,
  WSYNC_ENTRY_HOOK,
  WSYNC_ENTRY_CONFIG_PATCHER,
  WSYNC_ENTRY_ENV_PATCH,
  WSYNC_ENTRY_KIND_COUNT /*< skip >*/
} WsyncEntryKind;

/** Named anchors for priorities; any int is valid.  Higher runs (or wins) first. */
enum {
  WSYNC_PRIORITY_LOW = -100,
  WSYNC_PRIORITY_DEFAULT = 0,
  WSYNC_PRIORITY_HIGH = 100,
};

/* The layout of one rank that targets build and hooks change (<wsync/layout.h>). */
typedef struct _WsyncLayout WsyncLayout;

/**
 * WsyncConfigPatchFunc:
 * @config: the parsed config.json, to be modified in place (its root is an object)
 * @user_data: the data given at registration
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT error when the config cannot
 *   be converted
 *
 * A config patcher.  Patchers run in dispatch order on the config.json that a command
 * writes.  A patcher must be idempotent.
 *
 * Returns: %TRUE on success.
 */
typedef gboolean (*WsyncConfigPatchFunc)(JsonNode *config, gpointer user_data, GError **error);

/** The environment a deployment is being prepared for (`wsync env`). */
typedef struct _WsyncEnv WsyncEnv;

/** wsync_env_get_backend: Returns: (transfer none): the backend, e.g. "npu-ascend". */
WSYNC_API const char *wsync_env_get_backend(WsyncEnv *env);

/** wsync_env_get_mode: Returns: (transfer none): "colocate" or "server". */
WSYNC_API const char *wsync_env_get_mode(WsyncEnv *env);

/**
 * wsync_env_getenv:
 * @env: the environment
 * @name: a variable
 *
 * Returns: (transfer none) (nullable): its value as the deployment will see it: what an
 *   earlier patch set, else the value in wsync's own environment, else %NULL.
 */
WSYNC_API const char *wsync_env_getenv(WsyncEnv *env, const char *name);

/**
 * wsync_env_set:
 * @env: the environment
 * @name: a variable
 * @value: its value (may be empty: it is still set explicitly)
 * @reason: one line saying why; printed as a comment above the export, so wsync_env_run()
 *   refuses (#WSYNC_ERROR_PLUGIN) a reason with a line break or another character
 *   wsync_printable() would escape
 *
 * Sets a variable.  A later setting of the same variable replaces the earlier one.
 */
WSYNC_API void wsync_env_set(WsyncEnv *env, const char *name, const char *value, const char *reason);

/**
 * wsync_env_advise:
 * @env: the environment
 * @name: an engine setting that is no environment variable, e.g. a configuration key
 * @value: what it must be, as the user writes it
 * @reason: one line saying why and how to give it to the engine
 *
 * Advises a setting wsync cannot make with an export (nor see, so it is advised
 * whatever the deployment already has): `wsync env` prints it as comments only, so an
 * eval of its output stays a plain list of exports, and wsync_env_run() refuses
 * (#WSYNC_ERROR_PLUGIN) a @name, @value or @reason with a line break or another
 * character wsync_printable() would escape.  A later advice of the same @name replaces
 * the earlier one.
 */
WSYNC_API void wsync_env_advise(WsyncEnv *env, const char *name, const char *value,
                                const char *reason);

/**
 * WsyncEnvPatchFunc:
 * @env: the environment being prepared
 * @user_data: the data given at registration
 * @error: return location for an error
 *
 * An environment patch: reads @env with wsync_env_getenv() and sets what the backend
 * needs with wsync_env_set(), or advises it with wsync_env_advise() when no variable
 * makes it.  Patches run in dispatch order.
 *
 * Returns: %TRUE on success.
 */
typedef gboolean (*WsyncEnvPatchFunc)(WsyncEnv *env, gpointer user_data, GError **error);

/* ------------------------------------------------------------------ registration */

/**
 * wsync_plugin_add_entry:
 * @plugin: the plugin being registered
 * @kind: the kind of entry
 * @name: the entry's name, unique among entries of its kind
 * @priority: dispatch order: higher first, ties broken by name
 * @serves: (nullable): a comma-separated list of what the entry applies to (model
 *   types for remappers, targets for converters and hooks, config formats for
 *   patchers), or %NULL for everything; an empty string or an empty item is refused
 * @callback: the function, of the type that goes with @kind
 * @user_data: (transfer full) (nullable): data passed to @callback
 * @destroy: (nullable): frees @user_data
 * @error: return location for a #WSYNC_ERROR_PLUGIN error
 *
 * Adds an entry to the dispatch table, recorded as @plugin's.  Ownership of
 * @user_data passes to the core at the call, even when it fails: on failure @destroy
 * is called at once.  An entry whose kind and name are already taken is refused.
 *
 * Returns: %TRUE when the entry was added.
 */
WSYNC_API gboolean wsync_plugin_add_entry(WsyncPlugin *plugin, WsyncEntryKind kind, const char *name,
                                int priority, const char *serves, GCallback callback,
                                gpointer user_data, GDestroyNotify destroy, GError **error);


/* Converters (targets) are added with wsync_plugin_add_target(), <wsync/target.h>. */


/** wsync_plugin_add_config_patcher: wsync_plugin_add_entry() for a #WsyncConfigPatchFunc. */
WSYNC_API gboolean wsync_plugin_add_config_patcher(WsyncPlugin *plugin, const char *name, int priority,
                                         const char *serves, WsyncConfigPatchFunc func,
                                         gpointer user_data, GDestroyNotify destroy,
                                         GError **error);

/** wsync_plugin_add_env_patch: wsync_plugin_add_entry() for a #WsyncEnvPatchFunc; @serves names backends. */
WSYNC_API gboolean wsync_plugin_add_env_patch(WsyncPlugin *plugin, const char *name, int priority,
                                    const char *serves, WsyncEnvPatchFunc func,
                                    gpointer user_data, GDestroyNotify destroy, GError **error);

/* ------------------------------------------------------------------ plugin queries */

/**
 * wsync_plugin_warn:
 * @plugin: the plugin being registered
 * @format: printf-style format of one line (no newline)
 * @...: arguments
 *
 * Records a warning about the plugin's configuration (e.g. a deprecated option), which
 * the command prints on stderr as `wsync: plugin "NAME": MESSAGE` (not with -q).
 */
WSYNC_API void wsync_plugin_warn(WsyncPlugin *plugin, const char *format, ...) G_GNUC_PRINTF(2, 3);

/** wsync_plugin_get_name: Returns: (transfer none): the plugin's name. */
WSYNC_API const char *wsync_plugin_get_name(const WsyncPlugin *plugin);

/**
 * wsync_plugin_get_options:
 * @plugin: a plugin
 *
 * The plugin's options after every configuration file was merged: an option keeps its
 * default from the plugin's table unless a file set it; a later file wins.
 *
 * Returns: (transfer none): a libconfuse section to read with cfg_getstr(),
 *   cfg_getint(), cfg_getbool(), cfg_getfloat(), cfg_size() and cfg_getn*().
 */
WSYNC_API cfg_t *wsync_plugin_get_options(WsyncPlugin *plugin);

G_END_DECLS

#endif /* WSYNC_PLUGIN_H */
