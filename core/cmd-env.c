/* wsync env --backend B --mode colocate|server: the environment a deployment needs,
 * as shell export lines, each preceded by a comment saying why; then the engine
 * settings no export can make, as comments only (an eval of the output runs the
 * exports and nothing else). */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "cli.h"
#include <wsync/env.h>

/* 'value' with every ' written as '\'' : safe for any shell. */
static char *
shell_quote(const char *value)
{
  GString *s = g_string_new("'");

  for (const char *p = value; *p != '\0'; p++) {
    if (*p == '\'')
      g_string_append(s, "'\\''");
    else
      g_string_append_c(s, *p);
  }
  g_string_append_c(s, '\'');
  return g_string_free(s, FALSE);
}

typedef void (*EnvEntryFunc)(WsyncEnv *env, guint index, const char **name,
                             const char **value, const char **reason);

/* "MEMBER": [{"name", "value", "reason"}, ...] of @n entries read by @get. */
static void
add_entries_json(JsonBuilder *b, const char *member, WsyncEnv *env, guint n, EnvEntryFunc get)
{
  json_builder_set_member_name(b, member);
  json_builder_begin_array(b);
  for (guint i = 0; i < n; i++) {
    const char *name, *value, *reason;
    get(env, i, &name, &value, &reason);
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "name");
    json_builder_add_string_value(b, name);
    json_builder_set_member_name(b, "value");
    json_builder_add_string_value(b, value);
    json_builder_set_member_name(b, "reason");
    json_builder_add_string_value(b, reason);
    json_builder_end_object(b);
  }
  json_builder_end_array(b);
}

static void
print_json(WsyncEnv *env)
{
  g_autoptr(JsonBuilder) b = json_builder_new();

  json_builder_begin_object(b);
  json_builder_set_member_name(b, "backend");
  json_builder_add_string_value(b, wsync_env_get_backend(env));
  json_builder_set_member_name(b, "mode");
  json_builder_add_string_value(b, wsync_env_get_mode(env));
  add_entries_json(b, "variables", env, wsync_env_n_vars(env), wsync_env_var);
  add_entries_json(b, "settings", env, wsync_env_n_settings(env), wsync_env_setting);
  json_builder_end_object(b);
  g_autoptr(JsonNode) root = json_builder_get_root(b);
  cli_print_json(root);
}

static gint
compare_strings(gconstpointer a, gconstpointer b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The backends that some loaded env patch serves, sorted and comma-separated: what a
 * user who typed a backend nobody patches may have meant. */
static char *
patched_backends(WsyncContext *ctx)
{
  g_autoptr(GPtrArray) all = wsync_registry_lookup(wsync_context_get_registry(ctx),
                                                   WSYNC_ENTRY_ENV_PATCH, NULL);
  g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);

  for (guint i = 0; i < all->len; i++) {
    const char *serves = wsync_entry_get_serves(all->pdata[i]);
    if (serves == NULL)
      continue; /* serves every backend, so the lookup of any found it */
    g_auto(GStrv) served = g_strsplit(serves, ",", -1);
    for (char **s = served; *s != NULL; s++)
      if (!g_ptr_array_find_with_equal_func(names, *s, g_str_equal, NULL))
        g_ptr_array_add(names, g_strdup(*s));
  }
  g_ptr_array_sort(names, compare_strings);
  g_ptr_array_add(names, NULL);
  return names->len > 1 ? g_strjoinv(", ", (char **)names->pdata) : g_strdup("none");
}

/* A backend no env patch serves prints nothing, which is right for a backend that
 * needs no environment but also what a misspelt one gets: say so on stderr, where it
 * does not reach an eval of stdout. */
static void
note_unpatched_backend(WsyncContext *ctx, const char *backend)
{
  g_autoptr(GPtrArray) patches = wsync_registry_lookup(wsync_context_get_registry(ctx),
                                                       WSYNC_ENTRY_ENV_PATCH, backend);
  if (patches->len > 0)
    return;
  g_autofree char *known = patched_backends(ctx);
  /* cli_error_line() escapes what a terminal would act on, as every other message does */
  cli_error_line("wsync env: note: no plugin patches the environment of backend \"%s\", so "
                 "there is nothing to set (backends with patches: %s)",
                 backend, known);
}

int
cmd_env(WsyncCli *cli, const WsyncCommand *cmd, int argc, char **argv)
{
  g_autofree char *backend = NULL;
  g_autofree char *mode = NULL;
  GOptionEntry entries[] = {
      {"backend", 'b', 0, G_OPTION_ARG_STRING, &backend, "The backend (a plugin's env patches serve it)", "B"},
      {"mode", 'm', 0, G_OPTION_ARG_STRING, &mode,
       "colocate (training and rollout share the devices) or server", "MODE"},
      {NULL}};
  g_autoptr(GError) error = NULL;
  WsyncContext *ctx;

  if (!cli_parse(cli, cmd, entries, &argc, &argv))
    return WSYNC_EXIT_USAGE;
  if (argc > 1)
    return cli_usage_error(cmd, "unexpected argument \"%s\"", argv[1]);
  if (backend == NULL)
    return cli_usage_error(cmd, "missing --backend");
  if (mode == NULL || (strcmp(mode, "colocate") != 0 && strcmp(mode, "server") != 0))
    return cli_usage_error(cmd, "--mode must be colocate or server");
  ctx = cli_context(cli, &error);
  if (ctx == NULL)
    return cli_fail(error);

  g_autoptr(WsyncEnv) env = wsync_env_new(backend, mode);
  if (!wsync_env_run(ctx, env, &error))
    return cli_fail(error);
  if (!cli->quiet)
    note_unpatched_backend(ctx, backend);
  if (cli->json) {
    print_json(env);
    return WSYNC_EXIT_OK;
  }
  for (guint i = 0; i < wsync_env_n_vars(env); i++) {
    const char *name, *value, *reason;
    wsync_env_var(env, i, &name, &value, &reason);
    g_autofree char *quoted = shell_quote(value);
    printf("# %s\nexport %s=%s\n", reason, name, quoted);
  }
  for (guint i = 0; i < wsync_env_n_settings(env); i++) {
    const char *name, *value, *reason;
    wsync_env_setting(env, i, &name, &value, &reason);
    printf("# %s\n# engine setting (no export makes it): %s = %s\n", reason, name, value);
  }
  return WSYNC_EXIT_OK;
}
