/* wsync plugins: every plugin the configuration named, its state, its entries and its
 * options. */
#include "config.h"

#include <stdio.h>
#include <string.h>

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
  WsyncContext *ctx;
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

/* ------------------------------------------------------------------ options */

/* A plugin's options as `wsync plugins` shows them: from the descriptor's table, each
 * with its documentation (WSYNC_OPTION_DOC()) and its default.  The defaults are read
 * the way the core reads them: from a fresh libconfuse object made from the table, so
 * a list default given as text ("{a, b}") shows as its values. */
typedef struct {
  const cfg_opt_t *table; /* the descriptor's, or NULL */
  cfg_t *defaults;        /* cfg_init() of it, or NULL */
} Options;

static void
options_init(Options *o, WsyncContext *ctx, const char *plugin)
{
  const WsyncPluginDescriptor *desc = wsync_context_get_plugin_descriptor(ctx, plugin);

  o->table = desc != NULL ? desc->options : NULL;
  o->defaults = o->table != NULL ? cfg_init((cfg_opt_t *)o->table, CFGF_NONE) : NULL;
}

static void
options_clear(Options *o)
{
  if (o->defaults != NULL)
    cfg_free(o->defaults);
}

static gboolean
option_is_list(const cfg_opt_t *opt)
{
  return (opt->flags & CFGF_LIST) != 0;
}

static const char *
option_type_name(const cfg_opt_t *opt)
{
  switch (opt->type) {
  case CFGT_INT:
    return "int";
  case CFGT_FLOAT:
    return "float";
  case CFGT_BOOL:
    return "bool";
  case CFGT_STR:
    return "string";
  default:
    return "other"; /* a table the loader refuses; never shown for an active plugin */
  }
}

/* The comment's first line (WSYNC_OPTION_DOC()), or NULL when it has none. */
static char *
option_description(const cfg_opt_t *opt)
{
  size_t len = opt->comment != NULL ? strcspn(opt->comment, "\n") : 0;

  return len > 0 ? g_strndup(opt->comment, len) : NULL;
}

/* What follows the comment's first newline, else the values the type allows. */
static char *
option_values(const cfg_opt_t *opt)
{
  const char *nl = opt->comment != NULL ? strchr(opt->comment, '\n') : NULL;
  gboolean list = option_is_list(opt);

  if (nl != NULL && nl[1] != '\0')
    return g_strdup(nl + 1);
  switch (opt->type) {
  case CFGT_INT:
    return g_strdup(list ? "a list of integers" : "an integer");
  case CFGT_FLOAT:
    return g_strdup(list ? "a list of numbers" : "a number");
  case CFGT_BOOL:
    return g_strdup(list ? "a list of true or false" : "true or false");
  case CFGT_STR:
    return g_strdup(list ? "a list of strings" : "a string");
  default:
    return g_strdup("");
  }
}

/* The option in the defaults object, or NULL when it has no default (CFGF_NODEFAULT). */
static cfg_opt_t *
option_default(const Options *o, const cfg_opt_t *opt)
{
  cfg_opt_t *d = o->defaults != NULL ? cfg_getopt(o->defaults, opt->name) : NULL;

  if (d == NULL || (opt->flags & CFGF_NODEFAULT) != 0)
    return NULL;
  if (!option_is_list(opt) && cfg_opt_size(d) == 0)
    return NULL;
  return d;
}

/* One value as a conf.d file writes it. */
static void
append_value_text(GString *out, cfg_opt_t *d, unsigned int i)
{
  switch (d->type) {
  case CFGT_INT:
    g_string_append_printf(out, "%ld", cfg_opt_getnint(d, i));
    break;
  case CFGT_FLOAT:
    g_string_append_printf(out, "%g", cfg_opt_getnfloat(d, i));
    break;
  case CFGT_BOOL:
    g_string_append(out, cfg_opt_getnbool(d, i) ? "true" : "false");
    break;
  case CFGT_STR: {
    const char *text = cfg_opt_getnstr(d, i);
    g_string_append_c(out, '"');
    for (const char *p = text != NULL ? text : ""; *p != '\0'; p++) {
      if (*p == '"' || *p == '\\')
        g_string_append_c(out, '\\');
      g_string_append_c(out, *p);
    }
    g_string_append_c(out, '"');
    break;
  }
  default:
    break;
  }
}

/* "default VALUE" in conf.d syntax ({a, b} for a list), or "no default". */
static char *
option_default_text(const Options *o, const cfg_opt_t *opt)
{
  cfg_opt_t *d = option_default(o, opt);
  GString *out = g_string_new(NULL);

  if (d == NULL) {
    g_string_append(out, "no default");
  } else if (option_is_list(opt)) {
    g_string_append(out, "default {");
    for (unsigned int i = 0; i < cfg_opt_size(d); i++) {
      if (i > 0)
        g_string_append(out, ", ");
      append_value_text(out, d, i);
    }
    g_string_append_c(out, '}');
  } else {
    g_string_append(out, "default ");
    append_value_text(out, d, 0);
  }
  return g_string_free(out, FALSE);
}

static void
print_options_text(const Options *o)
{
  for (const cfg_opt_t *opt = o->table; opt != NULL && opt->name != NULL; opt++) {
    g_autofree char *description = option_description(opt);
    g_autofree char *values = option_values(opt);
    g_autofree char *deflt = option_default_text(o, opt);
    /* a plugin's own words: printable, one line each */
    g_autofree char *pname = wsync_printable(opt->name);
    g_autofree char *pdesc = description ? wsync_printable(description) : NULL;
    g_autofree char *pvalues = wsync_printable(values);
    g_autofree char *pdefault = wsync_printable(deflt);

    printf("    %-14s %-24s %s%s  %s\n", "option", pname, option_type_name(opt),
           option_is_list(opt) ? " list" : "", pdefault);
    if (pdesc)
      printf("        %s\n", pdesc);
    printf("        values: %s\n", pvalues);
  }
}

static void
add_value_json(JsonBuilder *b, cfg_opt_t *d, unsigned int i)
{
  switch (d->type) {
  case CFGT_INT:
    json_builder_add_int_value(b, cfg_opt_getnint(d, i));
    break;
  case CFGT_FLOAT:
    json_builder_add_double_value(b, cfg_opt_getnfloat(d, i));
    break;
  case CFGT_BOOL:
    json_builder_add_boolean_value(b, cfg_opt_getnbool(d, i) != cfg_false);
    break;
  case CFGT_STR:
    json_builder_add_string_value(b, cfg_opt_getnstr(d, i));
    break;
  default:
    json_builder_add_null_value(b);
    break;
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

/* "options": [{name, type, list, default (typed; an array for a list; null for none),
 * values, description}] in the table's order. */
static void
add_options_json(JsonBuilder *b, const Options *o)
{
  json_builder_set_member_name(b, "options");
  json_builder_begin_array(b);
  for (const cfg_opt_t *opt = o->table; opt != NULL && opt->name != NULL; opt++) {
    g_autofree char *description = option_description(opt);
    g_autofree char *values = option_values(opt);
    cfg_opt_t *d = option_default(o, opt);

    json_builder_begin_object(b);
    add_string_or_null(b, "name", opt->name);
    add_string_or_null(b, "type", option_type_name(opt));
    json_builder_set_member_name(b, "list");
    json_builder_add_boolean_value(b, option_is_list(opt));
    json_builder_set_member_name(b, "default");
    if (d == NULL) {
      json_builder_add_null_value(b);
    } else if (option_is_list(opt)) {
      json_builder_begin_array(b);
      for (unsigned int i = 0; i < cfg_opt_size(d); i++)
        add_value_json(b, d, i);
      json_builder_end_array(b);
    } else {
      add_value_json(b, d, 0);
    }
    add_string_or_null(b, "values", values);
    add_string_or_null(b, "description", description);
    json_builder_end_object(b);
  }
  json_builder_end_array(b);
}

/* ------------------------------------------------------------------ plugins */

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
  Options o;
  options_init(&o, ls->ctx, name);
  print_options_text(&o);
  options_clear(&o);
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
  Options o;
  options_init(&o, ls->ctx, name);
  add_options_json(b, &o);
  options_clear(&o);
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
  ls.ctx = ctx;
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
    g_autofree char *why = cli_no_plugin_reason(cli, ctx);
    if (why != NULL)
      printf("no plugin is selected: %s (see wsync.conf(5))\n", why);
    wsync_context_foreach_plugin(ctx, visit_plugin, &ls);
  }
  return WSYNC_EXIT_OK;
}
