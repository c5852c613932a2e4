/* wsync: running the env patches, for the `wsync env` command. */
#ifndef WSYNC_ENV_PRIVATE_H
#define WSYNC_ENV_PRIVATE_H

#include <wsync/registry.h>

/* A fresh environment for @backend in @mode ("colocate" or "server"). */
WsyncEnv *wsync_env_new(const char *backend, const char *mode);
void wsync_env_free(WsyncEnv *env);

/* Runs every env patch that serves the backend, in dispatch order. */
gboolean wsync_env_run(WsyncContext *ctx, WsyncEnv *env, GError **error);

/* The variables set, in the order they were first set. */
guint wsync_env_n_vars(WsyncEnv *env);
void wsync_env_var(WsyncEnv *env, guint index, const char **name, const char **value,
                   const char **reason);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(WsyncEnv, wsync_env_free)

#endif /* WSYNC_ENV_PRIVATE_H */
