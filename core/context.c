/* wsync: the context a command runs with: conf.d, plugin loading, registration.
 *
 * Order of events in wsync_context_new(), and why:
 *
 *  1. Selection pass.  Every conf.d file is parsed (each into a fresh libconfuse object,
 *     unknown options ignored) only to learn which plugins the files name and whether
 *     the last explicit word on each is `enabled = false`.  Syntax errors stop here.
 *  2. Open.  Each named plugin is located and checked as ld.so and collectd's loaders
 *     reason (files.h: a regular file, not a symlink, owned by root or the user running
 *     wsync, and neither it nor any directory up to / writable by anyone else), then
 *     the very file checked is loaded through /proc/self/fd/N (no check-then-open
 *     race) and its descriptor read: ABI version, name, option table.  No plugin code
 *     runs.  conf.d directories and files pass the same checks.
 *  3. Strict pass.  Every file is parsed again against a schema holding the option
 *     tables of all opened plugins; a validation callback checks that each option
 *     belongs to the plugin whose section it is in, so errors carry the exact
 *     FILE:LINE.  Files are merged option by option, a later file winning.
 *  4. Register.  Enabled plugins register in name order, each into a table of its
 *     own.  A plugin that fails is refused with its entries; so is every plugin that
 *     registered an entry name another one registered too (register_plugins()).  The
 *     entries of the rest go into the context's table.
 *
 * Nothing is kept unless every file parsed: on a configuration error the whole context
 * is freed and only the error is returned.
 */
#define _GNU_SOURCE
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <ltdl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "context-private.h"
#include "files.h"
#include "registry-private.h"

#include <wsync/command.h>
#include <wsync/layout.h>
#include <wsync/model.h>

/* libconfuse's lexer keeps its state in globals and its callbacks take no user data:
 * parsing is serialised, and the strict pass finds its context here. */
G_LOCK_DEFINE_STATIC(parse_lock);

#define PLUGIN_SUFFIX ".so"
static WsyncContext *parsing_ctx;

static WsyncPlugin *find_plugin(WsyncContext *ctx, const char *name);

/* ------------------------------------------------------------------ errors from libconfuse */

/* One configuration source: a conf.d file, or the command line's overrides. */
typedef struct {
  char *name; /* what errors call it: the file's path, or "command line" */
  char *text; /* the overrides' text; NULL for a file */
} Source;

static void
source_free(gpointer data)
{
  Source *source = data;
  g_free(source->name);
  g_free(source->text);
  g_free(source);
}

typedef struct {
  GString *message; /* the first error of the current parse */
  const char *source_name;
} ParseErrors;

static ParseErrors parse_errors;

static void
collect_error(cfg_t *cfg, const char *fmt, va_list args)
{
  if (parse_errors.message->len > 0)
    return; /* keep the first: later ones are consequences */
  if (cfg != NULL) {
    g_autofree char *pname = wsync_printable(parse_errors.source_name);
    g_string_append_printf(parse_errors.message, "%s:%d: ", pname, cfg->line);
  }
  /* libconfuse quotes tokens, plugin validators quote values: one printable line */
  g_autofree char *raw = g_strdup_vprintf(fmt, args);
  g_autofree char *text = wsync_printable(raw);
  gboolean in_plugin = cfg != NULL && cfg->name != NULL && strcmp(cfg->name, "plugin") == 0 &&
                       cfg->title != NULL;
  WsyncPlugin *plugin = in_plugin && parsing_ctx ? find_plugin(parsing_ctx, cfg->title) : NULL;
  g_autofree char *title = in_plugin ? wsync_printable(cfg->title) : NULL;
  if (plugin != NULL && plugin->desc == NULL && g_str_has_prefix(text, "no such option '")) {
    /* A refused plugin's options are unknown because the plugin is: say why it was
     * refused rather than hide that behind "no such option". */
    const char *name = text + strlen("no such option '");
    g_string_append_printf(parse_errors.message,
                           "option '%.*s' of plugin \"%s\" cannot be checked: the plugin was "
                           "refused: %s",
                           (int)strcspn(name, "'"), name, title,
                           plugin->reason ? plugin->reason : "unknown reason");
    return;
  }
  g_string_append(parse_errors.message, text);
  if (in_plugin && g_str_has_prefix(text, "no such option"))
    g_string_append_printf(parse_errors.message, " in plugin \"%s\"", title);
}

/* libconfuse 3.3 (Debian 12) counts lines wrongly after comments: every `#` or `//`
 * line adds two, every block comment one, so its FILE:LINE points past the mistake.
 * Comments are therefore blanked out (newlines kept) before libconfuse sees the text;
 * quoted strings are skipped so that a '#' inside a value stays.  This knows only the
 * lexer's comment and quote rules; the parsing itself is libconfuse's. */
static void
blank_comments(char *text)
{
  enum { CODE, DQUOTE, SQUOTE, LINE_COMMENT, BLOCK_COMMENT } state = CODE;

  for (char *p = text; *p != '\0'; p++) {
    switch (state) {
    case CODE:
      if (*p == '"')
        state = DQUOTE;
      else if (*p == '\'')
        state = SQUOTE;
      else if (*p == '#' || (p[0] == '/' && p[1] == '/'))
        state = LINE_COMMENT;
      else if (p[0] == '/' && p[1] == '*') {
        state = BLOCK_COMMENT;
        *p++ = ' ';
      }
      break;
    case DQUOTE:
      if (*p == '\\' && p[1] != '\0')
        p++;
      else if (*p == '"')
        state = CODE;
      break;
    case SQUOTE:
      if (*p == '\\' && p[1] != '\0')
        p++;
      else if (*p == '\'')
        state = CODE;
      break;
    case LINE_COMMENT:
      if (*p == '\n')
        state = CODE;
      break;
    case BLOCK_COMMENT:
      if (p[0] == '*' && p[1] == '/') {
        *p++ = ' ';
        *p = ' ';
        state = CODE;
        continue;
      }
      break;
    }
    if ((state == LINE_COMMENT || state == BLOCK_COMMENT) && *p != '\n')
      *p = ' ';
  }
}

/* libconfuse 3.3 parses nested blocks by recursion without a limit (a later release
 * added one): a file nesting some 50000 blocks overflows its stack.  Nothing wsync
 * reads nests more than two levels, so deeper text is refused before libconfuse sees
 * it, and so is a quoted string left open, and a block or list the file ends in (3.3
 * takes the end of the file for the missing '}').  Runs on text whose comments are
 * blanked; quoted strings are skipped. */
#define CONF_MAX_DEPTH 16

static gboolean
check_nesting(const char *text, const char *source_name, GError **error)
{
  guint depth = 0, line = 1, quote_line = 0;
  guint open_line[CONF_MAX_DEPTH + 1]; /* where each block still open began */
  char open_char[CONF_MAX_DEPTH + 1];
  char quote = 0;

  for (const char *p = text; *p != '\0'; p++) {
    if (*p == '\n')
      line++;
    if (quote) {
      if (*p == '\\' && p[1] != '\0') {
        p++;
        line += *p == '\n';
      } else if (*p == quote)
        quote = 0;
      continue;
    }
    if (*p == '"' || *p == '\'') {
      quote = *p;
      quote_line = line;
    }
    else if ((*p == '{' || *p == '(') && ++depth > CONF_MAX_DEPTH) {
      g_autofree char *pname = wsync_printable(source_name);
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_CONFIG,
                  "%s:%u: blocks nest deeper than %d levels", pname, line, CONF_MAX_DEPTH);
      return FALSE;
    } else if (*p == '{' || *p == '(') {
      open_line[depth] = line;
      open_char[depth] = *p;
    } else if ((*p == '}' || *p == ')') && depth > 0)
      depth--;
  }
  /* libconfuse's lexer echoes the rest of an unclosed string to stdout (flex's default
   * rule), into the output of plan --json: refused here instead */
  if (quote) {
    g_autofree char *pname = wsync_printable(source_name);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_CONFIG, "%s:%u: a quoted string is not closed",
                pname, quote_line);
    return FALSE;
  }
  if (depth > 0) {
    g_autofree char *pname = wsync_printable(source_name);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_CONFIG, "%s:%u: the %s opened here is not closed",
                pname, open_line[depth], open_char[depth] == '{' ? "block" : "list");
    return FALSE;
  }
  return TRUE;
}

/* A conf.d file: a regular file (a FIFO would block every command) of at most
 * WSYNC_CONF_FILE_MAX bytes, NUL-terminated for libconfuse. */
static gboolean
read_conf_file(const char *path, char **text, GError **error)
{
  gsize len;
  struct stat st;
  g_autofree char *reason = NULL;

  /* a conf file decides what is written where: trusted like a plugin */
  int fd = wsync_file_open_trusted(path, "configuration files", &st, &reason);
  if (fd < 0) {
    g_set_error_literal(error, WSYNC_ERROR, WSYNC_ERROR_CONFIG, reason);
    return FALSE;
  }
  if ((guint64)st.st_size > WSYNC_CONF_FILE_MAX) {
    g_autofree char *ppath = wsync_printable(path);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_CONFIG,
                "%s: more than 1 MiB; a configuration file is never that big", ppath);
    close(fd);
    return FALSE;
  }
  gboolean ok = wsync_file_read_bounded(fd, path, WSYNC_CONF_FILE_MAX, "configuration file",
                                        WSYNC_ERROR_CONFIG, text, &len, error);
  close(fd);
  if (!ok)
    return FALSE;
  if (memchr(*text, '\0', len) != NULL) {
    g_autofree char *ppath = wsync_printable(path);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_CONFIG, "%s: holds a NUL byte; not a text file",
                ppath);
    g_free(*text);
    *text = NULL;
    return FALSE;
  }
  return TRUE;
}

/* libconfuse gives a section the line of the '}' that closes it (its lexer moves the
 * section's line on while the section's body is read), so a mistake in a section's
 * title would point at the end of the section.  This finds where each top-level
 * `plugin TITLE {` begins, in file order, which is the order of cfg_getnsec(): a title
 * appears once per file (CFGF_NO_TITLE_DUPES).  Runs on text whose comments are
 * blanked; knows only the lexer's token rules (quotes, the characters that end an
 * unquoted word). */
static GArray *
plugin_section_lines(const char *text)
{
  GArray *lines = g_array_new(FALSE, FALSE, sizeof(guint));
  guint depth = 0, line = 1;
  /* the last two tokens at depth 0: 1 = the word `plugin`, 2 = a title after it */
  guint matched = 0, keyword_line = 0;

  for (const char *p = text; *p != '\0'; p++) {
    if (*p == '\n')
      line++;
    if (g_ascii_isspace(*p))
      continue;
    if (*p == '"' || *p == '\'') {
      char quote = *p;
      for (p++; *p != '\0' && *p != quote; p++) {
        if (*p == '\\' && p[1] != '\0')
          p++;
        line += *p == '\n';
      }
      if (*p == '\0')
        break;
      matched = matched == 1 && depth == 0 ? 2 : 0;
      continue;
    }
    if (strchr("{}()=,+", *p) != NULL) {
      if (*p == '{' && matched == 2)
        g_array_append_val(lines, keyword_line);
      matched = 0;
      if (*p == '{' || *p == '(')
        depth++;
      else if ((*p == '}' || *p == ')') && depth > 0)
        depth--;
      continue;
    }
    const char *word = p;
    while (p[1] != '\0' && !g_ascii_isspace(p[1]) && strchr("\"'{}()=,+", p[1]) == NULL)
      p++;
    gboolean is_keyword = depth == 0 && p - word + 1 == 6 && strncmp(word, "plugin", 6) == 0;
    if (matched == 1 && depth == 0)
      matched = 2; /* an unquoted title */
    else if (is_keyword) {
      matched = 1;
      keyword_line = line;
    } else
      matched = 0;
  }
  return lines;
}

/* Parses @source into a fresh @cfg, turning libconfuse's error report into a GError.
 * @plugin_lines, if not NULL, receives plugin_section_lines() of the text. */
static gboolean
parse_source(cfg_t *cfg, const Source *source, GArray **plugin_lines, GError **error)
{
  g_autofree char *text = NULL;
  int rc;

  if (source->text != NULL)
    text = g_strdup(source->text);
  else if (!read_conf_file(source->name, &text, error))
    return FALSE;
  blank_comments(text);
  if (!check_nesting(text, source->name, error))
    return FALSE;
  if (plugin_lines != NULL)
    *plugin_lines = plugin_section_lines(text);
  parse_errors.message = g_string_new(NULL);
  parse_errors.source_name = source->name;
  cfg_set_error_function(cfg, collect_error);
  rc = cfg_parse_buf(cfg, text);
  if (rc == CFG_SUCCESS) {
    g_string_free(parse_errors.message, TRUE);
    return TRUE;
  }
  if (parse_errors.message->len == 0) {
    g_autofree char *pname = wsync_printable(source->name);
    g_string_printf(parse_errors.message, "%s: syntax error", pname);
  }
  g_set_error_literal(error, WSYNC_ERROR, WSYNC_ERROR_CONFIG, parse_errors.message->str);
  g_string_free(parse_errors.message, TRUE);
  return FALSE;
}

/* ------------------------------------------------------------------ listing conf.d */

static gint
compare_strings(gconstpointer a, gconstpointer b)
{
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A conf.d directory is checked like the directories above a plugin, itself included:
 * whoever can add a file to it decides what wsync writes. */
static gboolean
conf_dir_is_trusted(const char *dir, GError **error)
{
  g_autofree char *real = realpath(dir, NULL);
  struct stat st;

  if (real == NULL || stat(real, &st) != 0) {
    wsync_set_io_error(error, errno, dir, "resolve");
    (*error)->code = WSYNC_ERROR_CONFIG;
    return FALSE;
  }
  /* the directory as if it were a file: no exception for a sticky one */
  g_autofree char *reason = wsync_file_untrusted(real, &st);
  if (reason != NULL) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_CONFIG, "configuration directory %s", reason);
    return FALSE;
  }
  return TRUE;
}

/* Appends DIR/NAME.conf for every visible *.conf in @dir, sorted by name. */
static gboolean
list_conf_dir(const char *dir, GPtrArray *sources, GError **error)
{
  /* with errno, not GLib's message, which named the directory a second time in its own
   * quotes ("nodir: cannot read configuration directory: Error opening directory
   * “nodir”: No such file or directory") */
  DIR *d = opendir(dir);
  const struct dirent *entry;
  g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);

  if (d == NULL) {
    int errsv = errno;
    g_autofree char *pdir = wsync_printable(dir);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_CONFIG, "%s: cannot read configuration directory: %s",
                pdir, g_strerror(errsv));
    return FALSE;
  }
  if (!conf_dir_is_trusted(dir, error)) {
    closedir(d);
    return FALSE;
  }
  while ((entry = readdir(d)) != NULL)
    if (entry->d_name[0] != '.' && g_str_has_suffix(entry->d_name, ".conf"))
      g_ptr_array_add(names, g_strdup(entry->d_name));
  closedir(d);
  g_ptr_array_sort(names, compare_strings);
  for (guint i = 0; i < names->len; i++) {
    Source *source = g_new0(Source, 1);
    source->name = g_build_filename(dir, names->pdata[i], NULL);
    g_ptr_array_add(sources, source);
  }
  return TRUE;
}

/* ------------------------------------------------------------------ plugins */

static void
plugin_free(gpointer data)
{
  WsyncPlugin *plugin = data;

  if (plugin->options != NULL)
    cfg_free(plugin->options);
  wsync_registry_free(plugin->staged); /* (its entries' destroy functions are in the code) */
  if (plugin->handle != NULL)
    lt_dlclose(plugin->handle);
  if (plugin->fd >= 0)
    close(plugin->fd);
  g_free(plugin->name);
  g_free(plugin->path);
  g_free(plugin->reason);
  g_free(plugin->selected_by);
  if (plugin->warnings != NULL)
    g_ptr_array_unref(plugin->warnings);
  g_free(plugin);
}

static WsyncPlugin *
find_plugin(WsyncContext *ctx, const char *name)
{
  for (guint i = 0; i < ctx->plugins->len; i++) {
    WsyncPlugin *plugin = ctx->plugins->pdata[i];
    if (strcmp(plugin->name, name) == 0)
      return plugin;
  }
  return NULL;
}

static void
refuse(WsyncPlugin *plugin, const char *fmt, ...) G_GNUC_PRINTF(2, 3);

static void
refuse(WsyncPlugin *plugin, const char *fmt, ...)
{
  va_list args;

  va_start(args, fmt);
  g_autofree char *reason = g_strdup_vprintf(fmt, args);
  va_end(args);
  g_free(plugin->reason);
  /* one printable line: it quotes the plugin's path (its directory comes from the
   * command line, the environment or conf.d) and what the plugin's descriptor says, and
   * goes into configuration errors and wsync_context_foreach_plugin() as it is */
  plugin->reason = wsync_printable(reason);
  plugin->state = WSYNC_PLUGIN_REFUSED;
  if (plugin->handle != NULL) {
    lt_dlclose(plugin->handle);
    plugin->handle = NULL;
  }
  if (plugin->fd >= 0) {
    close(plugin->fd);
    plugin->fd = -1;
  }
  plugin->desc = NULL;
}

/* Plugin names become file names: letters, digits, '-' and '_' only. */
static gboolean
plugin_name_is_valid(const char *name)
{
  if (name == NULL || name[0] == '\0')
    return FALSE;
  for (const char *p = name; *p != '\0'; p++)
    if (!g_ascii_isalnum(*p) && *p != '-' && *p != '_')
      return FALSE;
  return TRUE;
}

/* Finds NAME.so in the first plugin directory that has it.  The file found is the file
 * checked and the file opened: lt_dlopenext() opens a name that already has a module
 * extension as it is, so no .la file can redirect it elsewhere. */
static char *
locate_plugin(WsyncContext *ctx, const char *name)
{
  g_autofree char *file = g_strconcat(name, PLUGIN_SUFFIX, NULL);

  for (guint d = 0; d < ctx->plugin_dirs->len; d++) {
    g_autofree char *path = g_build_filename(ctx->plugin_dirs->pdata[d], file, NULL);
    struct stat st;
    if (lstat(path, &st) == 0)
      return g_steal_pointer(&path);
  }
  return NULL;
}

/* lt_dlerror() names the /proc path the plugin was loaded through: name its file. */
static char *
load_error(const WsyncPlugin *plugin, const char *through)
{
  const char *e = lt_dlerror();
  g_autofree char *msg = g_strdup(e ? e : "unknown error");
  const char *at = strstr(msg, through);

  if (at == NULL)
    return g_steal_pointer(&msg);
  return g_strdup_printf("%.*s%s%s", (int)(at - msg), msg, plugin->path, at + strlen(through));
}

/* Whether @opt's comment has a description (WSYNC_OPTION_DOC(): the text before the first
 * newline) with a word in it: one of blanks alone says no more than none. */
static gboolean
option_is_described(const cfg_opt_t *opt)
{
  for (const char *c = opt->comment; c != NULL && *c != '\0' && *c != '\n'; c++)
    if (!g_ascii_isspace(*c))
      return TRUE;
  return FALSE;
}

/* libconfuse option types a plugin may use; sections and functions could not be merged
 * across files option by option. */
static gboolean
option_table_is_valid(WsyncPlugin *plugin)
{
  for (const cfg_opt_t *opt = plugin->desc->options; opt != NULL && opt->name != NULL; opt++) {
    if (opt->type != CFGT_INT && opt->type != CFGT_FLOAT && opt->type != CFGT_BOOL &&
        opt->type != CFGT_STR) {
      refuse(plugin, "%s: option \"%s\" has a type plugins cannot use (int, float, bool and "
                     "string options only)",
             plugin->path, opt->name);
      return FALSE;
    }
    if (strcmp(opt->name, "enabled") == 0) {
      refuse(plugin, "%s: option \"enabled\" is reserved for the core", plugin->path);
      return FALSE;
    }
    /* `wsync plugins` is where a user learns what an option does: one it would list
     * without a word is the descriptor's mistake, found before any of its code runs
     * (as the in-tree plugins' are when wsync.conf(5) is made, man/plugin-options.py) */
    if (!option_is_described(opt)) {
      refuse(plugin, "%s: option \"%s\" has no description (its comment must say what it "
                     "does: WSYNC_OPTION_DOC(description, values), <wsync/plugin.h>)",
             plugin->path, opt->name);
      return FALSE;
    }
  }
  return TRUE;
}

/* Opens the plugin and reads its descriptor; runs none of its code. */
static void
open_plugin(WsyncContext *ctx, WsyncPlugin *plugin)
{
  const WsyncPluginDescriptor *desc;

  plugin->path = locate_plugin(ctx, plugin->name);
  if (plugin->path == NULL) {
    g_autofree char *dirs = ctx->plugin_dirs->len
                                ? g_strjoinv(":", (char **)ctx->plugin_dirs->pdata)
                                : g_strdup("(none)");
    /* (a misspelt name: say where the configuration names it) */
    refuse(plugin, "no %s.so in the plugin path %s (selected in %s)", plugin->name, dirs,
           plugin->selected_by);
    return;
  }
  struct stat st;
  char *reason = NULL;
  plugin->fd = wsync_file_open_trusted(plugin->path, "plugins", &st, &reason);
  if (plugin->fd < 0) {
    refuse(plugin, "%s", reason);
    g_free(reason);
    return;
  }
  /* The descriptor stays open while the plugin is loaded: ld.so and libltdl know loaded
   * objects by name, and a later plugin must not get the same /proc/self/fd/N. */
  g_autofree char *through = g_strdup_printf("/proc/self/fd/%d", plugin->fd);
  if (access(through, F_OK) != 0) {
    refuse(plugin, "%s: cannot load the checked file through %s (is /proc mounted?)",
           plugin->path, through);
    return;
  }
  plugin->handle = lt_dlopen(through);
  if (plugin->handle == NULL) {
    g_autofree char *why = load_error(plugin, through);
    refuse(plugin, "%s: cannot load: %s (ldd(1) shows missing libraries)", plugin->path, why);
    return;
  }
  desc = lt_dlsym(plugin->handle, WSYNC_PLUGIN_DESCRIPTOR_SYMBOL);
  if (desc == NULL) {
    refuse(plugin, "%s: lacks the symbol %s (not a wsync plugin?)", plugin->path,
           WSYNC_PLUGIN_DESCRIPTOR_SYMBOL);
    return;
  }
  /* The ABI check comes before anything else in the descriptor is trusted. */
  if (desc->abi_version != WSYNC_PLUGIN_ABI_VERSION) {
    refuse(plugin, "%s: built for plugin ABI %u, this wsync has ABI %d", plugin->path,
           desc->abi_version, WSYNC_PLUGIN_ABI_VERSION);
    return;
  }
  if (desc->name == NULL || strcmp(desc->name, plugin->name) != 0) {
    refuse(plugin, "%s: its descriptor names it \"%s\"", plugin->path,
           desc->name ? desc->name : "(null)");
    return;
  }
  plugin->desc = desc;
  plugin->register_func =
      (WsyncPluginRegisterFunc)lt_dlsym(plugin->handle, WSYNC_PLUGIN_REGISTER_SYMBOL);
  if (plugin->register_func == NULL) {
    refuse(plugin, "%s: lacks the symbol %s", plugin->path, WSYNC_PLUGIN_REGISTER_SYMBOL);
    return;
  }
  option_table_is_valid(plugin);
}

static const cfg_opt_t *
plugin_option(const WsyncPlugin *plugin, const char *name)
{
  if (plugin == NULL || plugin->desc == NULL)
    return NULL;
  for (const cfg_opt_t *opt = plugin->desc->options; opt != NULL && opt->name != NULL; opt++)
    if (strcmp(opt->name, name) == 0)
      return opt;
  return NULL;
}

/* ------------------------------------------------------------------ schemas */

static cfg_opt_t sync_options[] = {
    CFG_STR("target", NULL, CFGF_NODEFAULT),   CFG_INT("tp", 0, CFGF_NODEFAULT),
    CFG_INT("ep", 0, CFGF_NODEFAULT),          CFG_INT("rank", 0, CFGF_NODEFAULT),
    CFG_INT("threads", 0, CFGF_NODEFAULT),     CFG_STR("part-size", NULL, CFGF_NODEFAULT),
    CFG_STR("format", NULL, CFGF_NODEFAULT),   CFG_END()};

static const char *const sync_keys[] = {"target", "tp",        "ep",    "rank",
                                        "threads", "part-size", "format"};

/* The selection pass only needs `enabled`; everything else is skipped. */
static cfg_t *
selection_schema(void)
{
  cfg_opt_t plugin_opts[] = {CFG_BOOL("enabled", cfg_true, CFGF_NODEFAULT), CFG_END()};
  cfg_opt_t opts[] = {
      CFG_SEC("plugin", plugin_opts, CFGF_MULTI | CFGF_TITLE | CFGF_NO_TITLE_DUPES),
      CFG_SEC("sync", sync_options, CFGF_NONE), CFG_END()};
  /* cfg_init() deep-copies the tables, so stack arrays are fine here. */
  return cfg_init(opts, CFGF_IGNORE_UNKNOWN);
}

/* Called by libconfuse for every plugin option right after it is set, with the section
 * being parsed: its title says whose section it is, its line is the option's line. */
static int
check_option_owner(cfg_t *section, cfg_opt_t *opt)
{
  WsyncPlugin *plugin = find_plugin(parsing_ctx, cfg_title(section));
  const cfg_opt_t *own;

  if (plugin == NULL || plugin->desc == NULL) {
    cfg_error(section, "option '%s' of plugin \"%s\" cannot be checked: the plugin was refused: %s",
              opt->name, cfg_title(section),
              plugin && plugin->reason ? plugin->reason : "unknown plugin");
    return -1;
  }
  own = plugin_option(plugin, opt->name);
  if (own == NULL) {
    cfg_error(section, "no such option '%s' in plugin \"%s\"", opt->name, plugin->name);
    return -1;
  }
  if (own->type != opt->type) {
    cfg_error(section, "option '%s' of plugin \"%s\" has another type than the same option "
                       "of another plugin",
              opt->name, plugin->name);
    return -1;
  }
  /* The plugin's own validator, if it has one, judges the value. */
  if (own->validcb != NULL)
    return own->validcb(section, opt);
  return 0;
}

/* The FILE:LINE of each sync key the file being parsed sets (strict pass), which
 * merge_file() keeps beside the value: libconfuse keeps no line per option, but the
 * section's line, when a validator runs, is the option's. */
static GHashTable *parsing_sync_origins;

static int
note_sync_origin(cfg_t *section, cfg_opt_t *opt)
{
  if (parsing_sync_origins != NULL) {
    g_autofree char *pname = wsync_printable(parse_errors.source_name);
    g_hash_table_insert(parsing_sync_origins, g_strdup(opt->name),
                        g_strdup_printf("%s:%d", pname, section->line));
  }
  return 0;
}

/* A number of the sync section out of the bounds of its command option (`tp = 0`) is
 * refused as the file is read, with its FILE:LINE, like any bad value of conf.d: found
 * only when a command resolved it, the error named the flag (--tp) nobody gave. */
static int
check_sync_value(cfg_t *section, cfg_opt_t *opt)
{
  note_sync_origin(section, opt);
  static const struct {
    const char *key;
    long min, max;
  } bounds[] = {{"tp", 1, WSYNC_MAX_TP},
                {"ep", 1, WSYNC_MAX_EP},
                {"rank", 0, WSYNC_MAX_RANK},
                {"threads", 1, WSYNC_MAX_THREADS}};

  if (opt->type == CFGT_STR) { /* part-size */
    g_autoptr(GError) local = NULL;
    guint64 size;
    if (wsync_parse_size(opt->name, cfg_opt_getnstr(opt, 0), &size, &local))
      return 0;
    cfg_error(section, "%s", local->message);
    return -1;
  }
  for (guint i = 0; i < G_N_ELEMENTS(bounds); i++) {
    long v = cfg_opt_getnint(opt, 0);
    if (strcmp(opt->name, bounds[i].key) == 0 && (v < bounds[i].min || v > bounds[i].max)) {
      cfg_error(section, "%s must be a number from %ld to %ld, not %ld", opt->name,
                bounds[i].min, bounds[i].max, v);
      return -1;
    }
  }
  return 0;
}

/* Schema of the strict pass: `enabled`, plus every option of every opened plugin
 * (without defaults, so that cfg_size() tells whether a file set it). */
static cfg_t *
strict_schema(WsyncContext *ctx, GPtrArray *union_names)
{
  g_autoptr(GArray) plugin_opts = g_array_new(TRUE, TRUE, sizeof(cfg_opt_t));
  cfg_opt_t enabled = CFG_BOOL("enabled", cfg_true, CFGF_NODEFAULT);
  cfg_opt_t end = CFG_END();
  cfg_t *cfg;

  g_array_append_val(plugin_opts, enabled);
  for (guint i = 0; i < ctx->plugins->len; i++) {
    WsyncPlugin *plugin = ctx->plugins->pdata[i];
    if (plugin->desc == NULL)
      continue;
    for (const cfg_opt_t *opt = plugin->desc->options; opt && opt->name; opt++) {
      if (g_ptr_array_find_with_equal_func(union_names, opt->name, g_str_equal, NULL))
        continue;
      cfg_opt_t copy = *opt;
      copy.flags |= CFGF_NODEFAULT;
      copy.validcb = NULL;
      copy.validcb2 = NULL;
      g_array_append_val(plugin_opts, copy);
      g_ptr_array_add(union_names, (gpointer)opt->name);
    }
  }
  g_array_append_val(plugin_opts, end);

  cfg_opt_t opts[] = {CFG_SEC("plugin", (cfg_opt_t *)plugin_opts->data,
                              CFGF_MULTI | CFGF_TITLE | CFGF_NO_TITLE_DUPES),
                      CFG_SEC("sync", sync_options, CFGF_NONE), CFG_END()};
  cfg = cfg_init(opts, CFGF_NONE);
  for (guint i = 0; i < union_names->len; i++) {
    g_autofree char *path = g_strconcat("plugin|", (const char *)union_names->pdata[i], NULL);
    cfg_set_validate_func(cfg, path, check_option_owner);
  }
  for (const char *const *key = (const char *const[]){"tp", "ep", "rank", "threads",
                                                      "part-size", NULL};
       *key != NULL; key++) {
    g_autofree char *path = g_strconcat("sync|", *key, NULL);
    cfg_set_validate_func(cfg, path, check_sync_value);
  }
  cfg_set_validate_func(cfg, "sync|target", note_sync_origin);
  cfg_set_validate_func(cfg, "sync|format", note_sync_origin);
  return cfg;
}

/* ------------------------------------------------------------------ the passes */

static gboolean
selection_pass(WsyncContext *ctx, GPtrArray *sources, GError **error)
{
  for (guint f = 0; f < sources->len; f++) {
    const Source *source = sources->pdata[f];
    cfg_t *cfg = selection_schema();
    g_autoptr(GArray) lines = NULL;
    if (!parse_source(cfg, source, &lines, error)) {
      cfg_free(cfg);
      return FALSE;
    }
    for (guint s = 0; s < cfg_size(cfg, "plugin"); s++) {
      cfg_t *section = cfg_getnsec(cfg, "plugin", s);
      const char *name = cfg_title(section);
      WsyncPlugin *plugin;

      /* the title's line; section->line is that of the closing '}' */
      guint line = s < lines->len ? g_array_index(lines, guint, s) : (guint)section->line;
      if (!plugin_name_is_valid(name)) {
        g_autofree char *psource = wsync_printable(source->name);
        g_autofree char *pname = wsync_printable(name ? name : "");
        g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_CONFIG,
                    "%s:%u: invalid plugin name \"%s\" (letters, digits, '-' and '_' only)",
                    psource, line, pname);
        cfg_free(cfg);
        return FALSE;
      }
      plugin = find_plugin(ctx, name);
      if (plugin == NULL) {
        plugin = g_new0(WsyncPlugin, 1);
        plugin->fd = -1;
        plugin->name = g_strdup(name);
        plugin->ctx = ctx;
        plugin->enabled = TRUE; /* a section selects its plugin */
        /* FILE:LINE of the section's title, as every other conf.d error says where; the
         * command line's text is wsync's own, its lines mean nothing to the user */
        g_autofree char *psource = wsync_printable(source->name);
        plugin->selected_by = source->text == NULL ? g_strdup_printf("%s:%u", psource, line)
                                                   : g_strdup(psource);
        g_ptr_array_add(ctx->plugins, plugin);
      }
      if (cfg_size(section, "enabled") > 0)
        plugin->enabled = cfg_getbool(section, "enabled");
    }
    cfg_free(cfg);
  }
  return TRUE;
}

static void
merge_value(cfg_opt_t *dst, cfg_opt_t *src)
{
  cfg_free_value(dst);
  for (unsigned int i = 0; i < cfg_opt_size(src); i++) {
    switch (src->type) {
    case CFGT_INT:
      cfg_opt_setnint(dst, cfg_opt_getnint(src, i), i);
      break;
    case CFGT_FLOAT:
      cfg_opt_setnfloat(dst, cfg_opt_getnfloat(src, i), i);
      break;
    case CFGT_BOOL:
      cfg_opt_setnbool(dst, cfg_opt_getnbool(src, i), i);
      break;
    case CFGT_STR:
      cfg_opt_setnstr(dst, cfg_opt_getnstr(src, i), i);
      break;
    default:
      break;
    }
  }
}

static char *
sync_value_text(cfg_t *sync, const char *key)
{
  cfg_opt_t *opt = cfg_getopt(sync, key);

  if (opt->type == CFGT_INT)
    return g_strdup_printf("%ld", cfg_getint(sync, key));
  return g_strdup(cfg_getstr(sync, key));
}

/* Copies what one parsed file set into the plugins' option objects and the sync map. */
static void
merge_file(WsyncContext *ctx, cfg_t *cfg)
{
  for (guint s = 0; s < cfg_size(cfg, "plugin"); s++) {
    cfg_t *section = cfg_getnsec(cfg, "plugin", s);
    WsyncPlugin *plugin = find_plugin(ctx, cfg_title(section));
    if (plugin == NULL || plugin->options == NULL)
      continue;
    for (const cfg_opt_t *opt = plugin->desc->options; opt && opt->name; opt++)
      if (cfg_size(section, opt->name) > 0)
        merge_value(cfg_getopt(plugin->options, opt->name), cfg_getopt(section, opt->name));
  }
  cfg_t *sync = cfg_getsec(cfg, "sync");
  for (guint k = 0; sync != NULL && k < G_N_ELEMENTS(sync_keys); k++)
    if (cfg_size(sync, sync_keys[k]) > 0) {
      g_hash_table_insert(ctx->sync_options, g_strdup(sync_keys[k]),
                          sync_value_text(sync, sync_keys[k]));
      const char *origin = g_hash_table_lookup(parsing_sync_origins, sync_keys[k]);
      if (origin != NULL)
        g_hash_table_insert(ctx->sync_origins, g_strdup(sync_keys[k]), g_strdup(origin));
      else
        g_hash_table_remove(ctx->sync_origins, sync_keys[k]);
    }
}

static gboolean
strict_pass(WsyncContext *ctx, GPtrArray *sources, GError **error)
{
  g_autoptr(GPtrArray) union_names = g_ptr_array_new();

  /* Each opened plugin starts from its own defaults. */
  for (guint i = 0; i < ctx->plugins->len; i++) {
    WsyncPlugin *plugin = ctx->plugins->pdata[i];
    if (plugin->desc != NULL) {
      cfg_opt_t none[] = {CFG_END()};
      plugin->options = cfg_init(plugin->desc->options ? plugin->desc->options : none, 0);
    }
  }
  parsing_ctx = ctx;
  for (guint f = 0; f < sources->len; f++) {
    g_ptr_array_set_size(union_names, 0);
    cfg_t *cfg = strict_schema(ctx, union_names);
    parsing_sync_origins = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    gboolean parsed = parse_source(cfg, sources->pdata[f], NULL, error);
    if (parsed)
      merge_file(ctx, cfg);
    g_clear_pointer(&parsing_sync_origins, g_hash_table_unref);
    cfg_free(cfg);
    if (!parsed) {
      parsing_ctx = NULL;
      return FALSE;
    }
  }
  parsing_ctx = NULL;
  return TRUE;
}

static gint
compare_plugins(gconstpointer a, gconstpointer b)
{
  const WsyncPlugin *pa = *(const WsyncPlugin *const *)a;
  const WsyncPlugin *pb = *(const WsyncPlugin *const *)b;
  return strcmp(pa->name, pb->name);
}

/* Runs one plugin's register function into a table of its own (plugin->staged), so
 * that what it registers does not depend on which plugins registered before it.
 * Returns FALSE, the plugin refused, when the function fails. */
static gboolean
register_alone(WsyncPlugin *plugin)
{
  g_autoptr(GError) local = NULL;

  plugin->staged = wsync_registry_new();
  plugin->registering = TRUE;
  gboolean ok = plugin->register_func(plugin, &local);
  plugin->registering = FALSE;
  if (!ok) {
    /* before refuse() unloads the code the entries' destroy functions live in */
    g_clear_pointer(&plugin->staged, wsync_registry_free);
    g_autofree char *why = wsync_printable(local ? local->message : "(no reason given)");
    refuse(plugin, "%s: failed to register: %s", plugin->path, why);
  }
  return ok;
}

/* Why @plugin cannot be used: the first of its entries (kind by kind, in lookup order)
 * whose name another plugin registered too, naming every such plugin and its file; or
 * NULL. */
static char *
clash_reason(WsyncContext *ctx, WsyncPlugin *plugin)
{
  for (int k = 0; k < WSYNC_ENTRY_KIND_COUNT; k++) {
    g_autoptr(GPtrArray) mine = wsync_registry_lookup(plugin->staged, k, NULL);
    for (guint e = 0; e < mine->len; e++) {
      const char *name = wsync_entry_get_name(mine->pdata[e]);
      g_autoptr(GString) others = g_string_new(NULL);
      for (guint i = 0; i < ctx->plugins->len; i++) {
        WsyncPlugin *other = ctx->plugins->pdata[i];
        if (other == plugin || other->staged == NULL ||
            !wsync_registry_contains(other->staged, k, name))
          continue;
        g_string_append_printf(others, "%splugin \"%s\" (%s)", others->len ? ", " : "",
                               other->name, other->path);
      }
      if (others->len > 0)
        return g_strdup_printf("%s: %s \"%s\" is also registered by %s; one name, one "
                               "plugin: all of them are refused (set enabled = false in the "
                               "sections of those not wanted)",
                               plugin->path, wsync_entry_kind_name(k), name, others->str);
    }
  }
  return NULL;
}

/* Enabled plugins register, each alone; then an entry name of one kind that two plugins
 * registered (two targets "vllm", two remappers of one name) refuses every plugin that
 * registered it, each naming the others.  The rule does not depend on the order the
 * plugins are read or register in, which a first-come rule would (the second one was
 * refused, so renaming a plugin changed which one ran), and it does not guess: which of
 * the two the user meant only the configuration can say.  Priority is no tie-break
 * here: it orders entries of different names that serve one key (registry.c), as
 * GStreamer's rank orders differently named features (reference/style.md §2.3, §5).
 * Finally the entries of the plugins left go into the context's table, in name order. */
static void
register_plugins(WsyncContext *ctx)
{
  for (guint i = 0; i < ctx->plugins->len; i++) {
    WsyncPlugin *plugin = ctx->plugins->pdata[i];

    if (plugin->state == WSYNC_PLUGIN_REFUSED)
      continue;
    if (!plugin->enabled) {
      plugin->state = WSYNC_PLUGIN_DISABLED;
      continue;
    }
    register_alone(plugin);
  }
  /* every reason first: refusing one plugin must not hide its clash from the others */
  g_autoptr(GPtrArray) reasons = g_ptr_array_new_with_free_func(g_free);
  for (guint i = 0; i < ctx->plugins->len; i++) {
    WsyncPlugin *plugin = ctx->plugins->pdata[i];
    g_ptr_array_add(reasons, plugin->staged != NULL ? clash_reason(ctx, plugin) : NULL);
  }
  for (guint i = 0; i < ctx->plugins->len; i++) {
    WsyncPlugin *plugin = ctx->plugins->pdata[i];
    if (plugin->staged == NULL)
      continue;
    if (reasons->pdata[i] != NULL) {
      g_clear_pointer(&plugin->staged, wsync_registry_free);
      refuse(plugin, "%s", (const char *)reasons->pdata[i]);
      continue;
    }
    wsync_registry_move_all(ctx->registry, plugin->staged);
    g_clear_pointer(&plugin->staged, wsync_registry_free);
    plugin->state = WSYNC_PLUGIN_ACTIVE;
  }
}

/* ------------------------------------------------------------------ public */

WsyncContext *
wsync_context_new(const char *const *conf_dirs, const char *const *plugin_dirs,
                  const char *overrides, GError **error)
{
  g_autoptr(WsyncContext) ctx = g_new0(WsyncContext, 1);
  g_autoptr(GPtrArray) paths = g_ptr_array_new_with_free_func(source_free);
  gboolean ok;

  ctx->registry = wsync_registry_new();
  ctx->plugins = g_ptr_array_new_with_free_func(plugin_free);
  ctx->plugin_dirs = g_ptr_array_new_null_terminated(4, g_free, TRUE);
  ctx->sync_options = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
  ctx->sync_origins = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
  for (guint i = 0; plugin_dirs != NULL && plugin_dirs[i] != NULL; i++)
    if (plugin_dirs[i][0] != '\0')
      g_ptr_array_add(ctx->plugin_dirs, g_strdup(plugin_dirs[i]));

  for (guint i = 0; conf_dirs != NULL && conf_dirs[i] != NULL; i++)
    if (!list_conf_dir(conf_dirs[i], paths, error))
      return NULL;
  if (overrides != NULL && overrides[0] != '\0') {
    Source *source = g_new0(Source, 1);
    source->name = g_strdup("command line");
    source->text = g_strdup(overrides);
    g_ptr_array_add(paths, source);
  }

  if (lt_dlinit() != 0) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_PLUGIN, "cannot initialise libltdl: %s",
                lt_dlerror());
    return NULL;
  }
  ctx->ltdl_ready = TRUE;

  G_LOCK(parse_lock);
  ok = selection_pass(ctx, paths, error);
  if (ok) {
    g_ptr_array_sort(ctx->plugins, compare_plugins);
    for (guint i = 0; i < ctx->plugins->len; i++)
      open_plugin(ctx, ctx->plugins->pdata[i]);
    ok = strict_pass(ctx, paths, error);
  }
  G_UNLOCK(parse_lock);
  if (!ok)
    return NULL;

  register_plugins(ctx);
  return g_steal_pointer(&ctx);
}

void
wsync_context_free(WsyncContext *ctx)
{
  if (ctx == NULL)
    return;
  /* Entries first: their destroy functions live in the plugins' code. */
  wsync_registry_free(ctx->registry);
  if (ctx->plugins != NULL)
    g_ptr_array_unref(ctx->plugins);
  if (ctx->plugin_dirs != NULL)
    g_ptr_array_unref(ctx->plugin_dirs);
  if (ctx->sync_options != NULL)
    g_hash_table_unref(ctx->sync_options);
  if (ctx->sync_origins != NULL)
    g_hash_table_unref(ctx->sync_origins);
  if (ctx->ltdl_ready)
    lt_dlexit();
  g_free(ctx);
}

WsyncRegistry *
wsync_context_get_registry(WsyncContext *ctx)
{
  return ctx->registry;
}

void
wsync_context_foreach_plugin(WsyncContext *ctx, WsyncPluginInfoFunc func, gpointer user_data)
{
  for (guint i = 0; i < ctx->plugins->len; i++) {
    WsyncPlugin *plugin = ctx->plugins->pdata[i];
    func(plugin->name, plugin->state, plugin->path,
         plugin->desc ? plugin->desc->description : NULL, plugin->reason, user_data);
  }
}

const char *
wsync_context_get_sync_option(WsyncContext *ctx, const char *key)
{
  return g_hash_table_lookup(ctx->sync_options, key);
}

const char *
wsync_context_sync_option_origin(WsyncContext *ctx, const char *key)
{
  return g_hash_table_lookup(ctx->sync_origins, key);
}

cfg_t *
wsync_context_get_plugin_options(WsyncContext *ctx, const char *plugin_name)
{
  WsyncPlugin *plugin = find_plugin(ctx, plugin_name);

  if (plugin == NULL || plugin->state != WSYNC_PLUGIN_ACTIVE)
    return NULL;
  return plugin->options;
}

const WsyncPluginDescriptor *
wsync_context_get_plugin_descriptor(WsyncContext *ctx, const char *plugin_name)
{
  WsyncPlugin *plugin = find_plugin(ctx, plugin_name);

  if (plugin == NULL || plugin->state == WSYNC_PLUGIN_REFUSED)
    return NULL;
  return plugin->desc;
}

/* ------------------------------------------------------------------ the plugin-facing API */

const char *
wsync_plugin_get_name(const WsyncPlugin *plugin)
{
  return plugin->name;
}

void
wsync_plugin_warn(WsyncPlugin *plugin, const char *format, ...)
{
  va_list ap;

  if (plugin->warnings == NULL)
    plugin->warnings = g_ptr_array_new_with_free_func(g_free);
  va_start(ap, format);
  g_ptr_array_add(plugin->warnings, g_strdup_vprintf(format, ap));
  va_end(ap);
}

void
wsync_context_foreach_warning(WsyncContext *ctx, WsyncWarningFunc func, gpointer user_data)
{
  for (guint i = 0; i < ctx->plugins->len; i++) {
    WsyncPlugin *plugin = ctx->plugins->pdata[i];
    for (guint w = 0; plugin->warnings != NULL && w < plugin->warnings->len; w++)
      func(plugin->name, plugin->warnings->pdata[w], user_data);
  }
}

cfg_t *
wsync_plugin_get_options(WsyncPlugin *plugin)
{
  return plugin->options;
}

gboolean
wsync_plugin_add_entry(WsyncPlugin *plugin, WsyncEntryKind kind, const char *name, int priority,
                       const char *serves, GCallback callback, gpointer user_data,
                       GDestroyNotify destroy, GError **error)
{
  if (plugin == NULL || !plugin->registering) {
    /* Entries may only be added while the plugin registers: that is what ties each
     * entry to exactly one plugin. */
    if (destroy != NULL && user_data != NULL)
      destroy(user_data);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_PLUGIN,
                "%s \"%s\" added outside the plugin's register function",
                wsync_entry_kind_name(kind), name ? name : "");
    return FALSE;
  }
  return wsync_registry_add(plugin->staged, plugin->name, kind, name, priority, serves,
                            callback, user_data, destroy, error);
}

gboolean
wsync_plugin_add_remapper(WsyncPlugin *plugin, const char *name, int priority,
                          const char *serves, WsyncRemapFunc func, gpointer user_data,
                          GDestroyNotify destroy, GError **error)
{
  return wsync_plugin_add_entry(plugin, WSYNC_ENTRY_REMAPPER, name, priority, serves,
                                (GCallback)func, user_data, destroy, error);
}

gboolean
wsync_plugin_add_target(WsyncPlugin *plugin, const WsyncTargetInfo *info, int priority,
                        gpointer user_data, GDestroyNotify destroy, GError **error)
{
  if (plugin == NULL || !plugin->registering) {
    if (destroy != NULL && user_data != NULL)
      destroy(user_data);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_PLUGIN,
                "target \"%s\" added outside the plugin's register function",
                info && info->name ? info->name : "");
    return FALSE;
  }
  return wsync_registry_add_target(plugin->staged, plugin->name, info, priority,
                                   user_data, destroy, error);
}

gboolean
wsync_plugin_add_hook(WsyncPlugin *plugin, const char *name, int priority, const char *serves,
                      WsyncHookFunc func, gpointer user_data, GDestroyNotify destroy,
                      GError **error)
{
  return wsync_plugin_add_entry(plugin, WSYNC_ENTRY_HOOK, name, priority, serves,
                                (GCallback)func, user_data, destroy, error);
}

gboolean
wsync_plugin_add_env_patch(WsyncPlugin *plugin, const char *name, int priority,
                           const char *serves, WsyncEnvPatchFunc func, gpointer user_data,
                           GDestroyNotify destroy, GError **error)
{
  return wsync_plugin_add_entry(plugin, WSYNC_ENTRY_ENV_PATCH, name, priority, serves,
                                (GCallback)func, user_data, destroy, error);
}

gboolean
wsync_plugin_add_config_patcher(WsyncPlugin *plugin, const char *name, int priority,
                                const char *serves, WsyncConfigPatchFunc func,
                                gpointer user_data, GDestroyNotify destroy, GError **error)
{
  return wsync_plugin_add_entry(plugin, WSYNC_ENTRY_CONFIG_PATCHER, name, priority, serves,
                                (GCallback)func, user_data, destroy, error);
}
