/* wsync: the environment a deployment needs, built by env patches (see plugin.h). */
#include <string.h>

#include <wsync/env.h>
#include <wsync/error.h>

#include "entry-private.h"

typedef struct {
  char *name;
  char *value;
  char *reason;
} EnvVar;

struct _WsyncEnv {
  const char *backend;
  const char *mode;
  GArray *vars;     /* EnvVar, in the order first set */
  GArray *settings; /* EnvVar too: engine settings no export can make */
};

static void
env_var_clear(gpointer data)
{
  EnvVar *v = data;
  g_free(v->name);
  g_free(v->value);
  g_free(v->reason);
}

const char *
wsync_env_get_backend(WsyncEnv *env)
{
  return env->backend;
}

const char *
wsync_env_get_mode(WsyncEnv *env)
{
  return env->mode;
}

static EnvVar *
find_entry(GArray *entries, const char *name)
{
  for (guint i = 0; i < entries->len; i++) {
    EnvVar *v = &g_array_index(entries, EnvVar, i);
    if (strcmp(v->name, name) == 0)
      return v;
  }
  return NULL;
}

static EnvVar *
find_var(WsyncEnv *env, const char *name)
{
  return find_entry(env->vars, name);
}

/* Sets @name in @entries, replacing an earlier value and reason in place. */
static void
put_entry(GArray *entries, const char *name, const char *value, const char *reason)
{
  EnvVar *v = find_entry(entries, name);

  if (v == NULL) {
    EnvVar fresh = {g_strdup(name), NULL, NULL};
    g_array_append_val(entries, fresh);
    v = &g_array_index(entries, EnvVar, entries->len - 1);
  }
  g_free(v->value);
  g_free(v->reason);
  v->value = g_strdup(value);
  v->reason = g_strdup(reason);
}

const char *
wsync_env_getenv(WsyncEnv *env, const char *name)
{
  EnvVar *v = find_var(env, name);
  return v != NULL ? v->value : g_getenv(name);
}

void
wsync_env_set(WsyncEnv *env, const char *name, const char *value, const char *reason)
{
  put_entry(env->vars, name, value, reason);
}

void
wsync_env_advise(WsyncEnv *env, const char *name, const char *value, const char *reason)
{
  g_return_if_fail(name != NULL);
  put_entry(env->settings, name, value, reason);
}

WsyncEnv *
wsync_env_new(const char *backend, const char *mode)
{
  WsyncEnv *env = g_new0(WsyncEnv, 1);

  env->backend = g_strdup(backend);
  env->mode = g_strdup(mode);
  env->vars = g_array_new(FALSE, TRUE, sizeof(EnvVar));
  g_array_set_clear_func(env->vars, env_var_clear);
  env->settings = g_array_new(FALSE, TRUE, sizeof(EnvVar));
  g_array_set_clear_func(env->settings, env_var_clear);
  return env;
}

void
wsync_env_free(WsyncEnv *env)
{
  if (env == NULL)
    return;
  g_free((char *)env->backend);
  g_free((char *)env->mode);
  g_array_unref(env->vars);
  g_array_unref(env->settings);
  g_free(env);
}

guint
wsync_env_n_vars(WsyncEnv *env)
{
  return env->vars->len;
}

void
wsync_env_var(WsyncEnv *env, guint index, const char **name, const char **value,
              const char **reason)
{
  EnvVar *v = &g_array_index(env->vars, EnvVar, index);
  *name = v->name;
  *value = v->value;
  *reason = v->reason;
}

guint
wsync_env_n_settings(WsyncEnv *env)
{
  return env->settings->len;
}

void
wsync_env_setting(WsyncEnv *env, guint index, const char **name, const char **value,
                  const char **reason)
{
  EnvVar *v = &g_array_index(env->settings, EnvVar, index);
  *name = v->name;
  *value = v->value;
  *reason = v->reason;
}

/* A variable name a shell accepts. */
static gboolean
valid_name(const char *name)
{
  if (name == NULL || !(g_ascii_isalpha(name[0]) || name[0] == '_'))
    return FALSE;
  for (const char *p = name; *p != '\0'; p++)
    if (!g_ascii_isalnum(*p) && *p != '_')
      return FALSE;
  return TRUE;
}

/* Text printed inside a comment line: one line, nothing a terminal acts on, so that an
 * eval of `wsync env`'s output runs its exports and nothing else: what wsync_printable()
 * leaves as it is (no C0 or C1 control, DEL, U+2028/U+2029 or invalid UTF-8). */
static gboolean
valid_comment_text(const char *text)
{
  if (text == NULL)
    return FALSE;
  g_autofree char *printable = wsync_printable(text);
  return strcmp(printable, text) == 0;
}

gboolean
wsync_env_run(WsyncContext *ctx, WsyncEnv *env, GError **error)
{
  g_autoptr(GPtrArray) patches = wsync_registry_lookup(wsync_context_get_registry(ctx),
                                                       WSYNC_ENTRY_ENV_PATCH, env->backend);

  for (guint i = 0; i < patches->len; i++) {
    const WsyncEntry *e = patches->pdata[i];
    WsyncEnvPatchFunc patch = (WsyncEnvPatchFunc)wsync_entry_get_callback(e);
    if (!patch(env, wsync_entry_get_user_data(e), error)) {
      wsync_entry_explain_silence(error);
      g_prefix_error(error, "env patch \"%s\" (plugin \"%s\"): ", wsync_entry_get_name(e),
                     wsync_entry_get_plugin(e));
      if (error != NULL)
        wsync_error_make_printable(*error); /* a plugin's words: one line */
      return FALSE;
    }
  }
  for (guint i = 0; i < env->vars->len; i++) {
    EnvVar *v = &g_array_index(env->vars, EnvVar, i);
    if (!valid_name(v->name)) {
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_PLUGIN,
                  "an env patch set \"%s\", which is not a variable name", v->name);
      return FALSE;
    }
    /* the reason is the comment line above the export: a line break in it would put
     * the rest of it on a line of its own, which an eval runs */
    if (!valid_comment_text(v->reason)) {
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_PLUGIN,
                  "an env patch set \"%s\" with a line break or control character in its "
                  "reason, which a comment cannot hold",
                  v->name);
      return FALSE;
    }
  }
  for (guint i = 0; i < env->settings->len; i++) {
    EnvVar *v = &g_array_index(env->settings, EnvVar, i);
    if (!valid_comment_text(v->name) || !valid_comment_text(v->value) ||
        !valid_comment_text(v->reason)) {
      g_autofree char *shown = g_strescape(v->name, NULL);
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_PLUGIN,
                  "an env patch advised setting \"%s\" with a line break or control "
                  "character in its name, value or reason, which a comment cannot hold",
                  shown);
      return FALSE;
    }
  }
  return TRUE;
}

