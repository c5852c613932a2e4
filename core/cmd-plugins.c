/* wsync plugins: every plugin the configuration named, its state and its entries. */
#include "config.h"

#include <stdio.h>

#include "cli.h"

static const char *
state_name(WsyncPluginState state)
{
  switch (state) {
  case WSYNC_PLUGIN_ACTIVE:
    return "active";
  case WSYNC_PLUGIN_DISABLED:
    return "disabled";
  case WSYNC_PLUGIN_REFUSED:
  default:
    return "refused";
  }
}

typedef struct {
  WsyncRegistry *registry;
  JsonBuilder *json; /* NULL: text */
} ListState;

/* Entries of one plugin, every kind, in dispatch order. */
static GPtrArray *
entries_of(WsyncRegistry *registry, const char *plugin)
{
  GPtrArray *mine = g_ptr_array_new();

  for (int k = 0; k < WSYNC_ENTRY_KIND_COUNT; k++) {
    g_autoptr(GPtrArray) all = wsync_registry_lookup(registry, k, NULL);
    for (guint i = 0; i < all->len; i++)
      if (g_strcmp0(wsync_entry_get_plugin(all->pdata[i]), plugin) == 0)
        g_ptr_array_add(mine, all->pdata[i]);
  }
  return mine;
}

static void
print_plugin_text(const char *name, WsyncPluginState state, const char *path,
                  const char *description, const char *reason, ListState *ls)
{
  g_autoptr(GPtrArray) entries = entries_of(ls->registry, name);

  /* a path or a plugin's own words: printable, one line each */
  g_autofree char *ppath = wsync_printable(path ? path : "(not found)");
  g_autofree char *pdesc = description ? wsync_printable(description) : NULL;
  g_autofree char *preason = reason ? wsync_printable(reason) : NULL;
  printf("%s  %s  %s\n", name, state_name(state), ppath);
  if (pdesc)
    printf("    %s\n", pdesc);
  if (preason)
    printf("    refused: %s\n", preason);
  for (guint i = 0; i < entries->len; i++) {
    const WsyncEntry *e = entries->pdata[i];
    const char *serves = wsync_entry_get_serves(e);
    const WsyncTargetInfo *target = wsync_entry_get_target(e);
    g_autofree char *formats = NULL;

    if (target != NULL && target->formats != NULL)
      formats = g_strjoinv(", ", (char **)target->formats);
    printf("    %-14s %-24s priority %d  serves %s%s%s\n",
           wsync_entry_kind_name(wsync_entry_get_kind(e)), wsync_entry_get_name(e),
           wsync_entry_get_priority(e), serves ? serves : "*", formats ? "  formats " : "",
           formats ? formats : "");
  }
}

static void
add_string_or_null(JsonBuilder *b, const char *member, const char *value)
{
  json_builder_set_member_name(b, member);
  if (value)
    json_builder_add_string_value(b, value);
  else
    json_builder_add_null_value(b);
}

/* A target's formats (converters only), default first. */
static void
add_formats_json(JsonBuilder *b, const WsyncTargetInfo *target)
{
  if (target == NULL)
    return;
  json_builder_set_member_name(b, "formats");
  json_builder_begin_array(b);
  for (guint f = 0; target->formats != NULL && target->formats[f] != NULL; f++)
    json_builder_add_string_value(b, target->formats[f]);
  json_builder_end_array(b);
}

static void
add_plugin_json(const char *name, WsyncPluginState state, const char *path,
                const char *description, const char *reason, ListState *ls)
{
  JsonBuilder *b = ls->json;
  g_autoptr(GPtrArray) entries = entries_of(ls->registry, name);

  json_builder_begin_object(b);
  add_string_or_null(b, "name", name);
  add_string_or_null(b, "state", state_name(state));
  add_string_or_null(b, "path", path);
  add_string_or_null(b, "description", description);
  add_string_or_null(b, "reason", reason);
  json_builder_set_member_name(b, "entries");
  json_builder_begin_array(b);
  for (guint i = 0; i < entries->len; i++) {
    const WsyncEntry *e = entries->pdata[i];
    json_builder_begin_object(b);
    add_string_or_null(b, "kind", wsync_entry_kind_name(wsync_entry_get_kind(e)));
    add_string_or_null(b, "name", wsync_entry_get_name(e));
    json_builder_set_member_name(b, "priority");
    json_builder_add_int_value(b, wsync_entry_get_priority(e));
    add_string_or_null(b, "serves", wsync_entry_get_serves(e));
    add_formats_json(b, wsync_entry_get_target(e));
    json_builder_end_object(b);
  }
  json_builder_end_array(b);
  json_builder_end_object(b);
}

static void
visit_plugin(const char *name, WsyncPluginState state, const char *path,
             const char *description, const char *reason, gpointer user_data)
{
  ListState *ls = user_data;

  if (ls->json)
    add_plugin_json(name, state, path, description, reason, ls);
  else
    print_plugin_text(name, state, path, description, reason, ls);
}

int
cmd_plugins(WsyncCli *cli, const WsyncCommand *cmd, int argc, char **argv)
{
  g_autoptr(GError) error = NULL;
  WsyncContext *ctx;
  ListState ls = {0};

  if (!cli_parse(cli, cmd, NULL, &argc, &argv))
    return WSYNC_EXIT_USAGE;
  if (argc > 1)
    return cli_usage_error(cmd, "unexpected argument \"%s\"", argv[1]);
  ctx = cli_context(cli, &error);
  if (ctx == NULL)
    return cli_fail(error);
  ls.registry = wsync_context_get_registry(ctx);
  if (cli->json) {
    g_autoptr(JsonBuilder) b = json_builder_new();
    ls.json = b;
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "plugins");
    json_builder_begin_array(b);
    wsync_context_foreach_plugin(ctx, visit_plugin, &ls);
    json_builder_end_array(b);
    json_builder_end_object(b);
    g_autoptr(JsonNode) root = json_builder_get_root(b);
    cli_print_json(root);
  } else {
    wsync_context_foreach_plugin(ctx, visit_plugin, &ls);
  }
  return WSYNC_EXIT_OK;
}
