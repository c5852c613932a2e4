/* wsync: preparing a deployment's environment (the `wsync env` command).
 *
 * Backends register environment patches (wsync_plugin_add_env_patch(), which read and
 * set variables with wsync_env_getenv() and wsync_env_set(), and advise engine settings
 * with wsync_env_advise()); this runs them.
 */
#ifndef WSYNC_ENV_H
#define WSYNC_ENV_H

#include <glib.h>
#include <wsync/api.h>
#include <wsync/plugin.h>
#include <wsync/registry.h>

G_BEGIN_DECLS

/**
 * wsync_env_new:
 * @backend: the backend being deployed, e.g. "npu-ascend"
 * @mode: "colocate" (training and rollout share the devices) or "server"
 *
 * Returns: (transfer full): a fresh environment with nothing set.
 */
WSYNC_API WsyncEnv *wsync_env_new(const char *backend, const char *mode);

/** wsync_env_free: @env: (nullable): frees it. */
WSYNC_API void wsync_env_free(WsyncEnv *env);

/**
 * wsync_env_run:
 * @ctx: a context
 * @env: the environment
 * @error: return location for an error
 *
 * Runs every env patch that serves the backend, in dispatch order.
 *
 * Returns: %TRUE when every patch succeeded.
 */
WSYNC_API gboolean wsync_env_run(WsyncContext *ctx, WsyncEnv *env, GError **error);

/** wsync_env_n_vars: Returns: the number of variables set. */
WSYNC_API guint wsync_env_n_vars(WsyncEnv *env);

/**
 * wsync_env_var:
 * @env: the environment
 * @index: 0 <= @index < wsync_env_n_vars(), in the order variables were first set
 * @name: (out) (transfer none): its name
 * @value: (out) (transfer none): its value
 * @reason: (out) (transfer none): why it is set
 */
WSYNC_API void wsync_env_var(WsyncEnv *env, guint index, const char **name, const char **value,
                             const char **reason);

/** wsync_env_n_settings: Returns: the number of engine settings advised. */
WSYNC_API guint wsync_env_n_settings(WsyncEnv *env);

/**
 * wsync_env_setting:
 * @env: the environment
 * @index: 0 <= @index < wsync_env_n_settings(), in the order settings were first advised
 * @name: (out) (transfer none): the setting
 * @value: (out) (transfer none): what it must be
 * @reason: (out) (transfer none): why, and how to give it to the engine
 */
WSYNC_API void wsync_env_setting(WsyncEnv *env, guint index, const char **name,
                                 const char **value, const char **reason);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(WsyncEnv, wsync_env_free)

G_END_DECLS

#endif /* WSYNC_ENV_H */
