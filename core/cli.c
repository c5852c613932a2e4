/* wsync: option parsing and output helpers shared by the commands. */
#define _GNU_SOURCE /* O_CLOEXEC, fsync (POSIX 2008); sigabbrev_np */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

static GOptionEntry *
global_entries(WsyncCli *cli)
{
  GOptionEntry entries[] = {
      {"conf-dir", 0, 0, G_OPTION_ARG_FILENAME_ARRAY, &cli->conf_dirs,
       "Read DIR/*.conf (repeatable; replaces " WSYNC_CONF_DIR ")", "DIR"},
      {"plugin-dir", 0, 0, G_OPTION_ARG_FILENAME_ARRAY, &cli->plugin_dirs,
       "Look for plugins in DIR first (repeatable; then $WSYNC_PLUGIN_PATH, then "
       WSYNC_PLUGIN_DIR ")", "DIR"},
      {"json", 0, 0, G_OPTION_ARG_NONE, &cli->json, "Machine-readable output on stdout", NULL},
      /* plan, inspect, plugins, env and config still print what they are run for */
      {"quiet", 'q', 0, G_OPTION_ARG_NONE, &cli->quiet,
       "Print only errors and the command's result (no warnings, no progress, no notes "
       "after a write)",
       NULL},
      /* (only sync-mpi.c reads it; the other commands take it and print nothing more) */
      {"verbose", 'v', 0, G_OPTION_ARG_NONE, &cli->verbose,
       "Say more (sync only: when each phase ended; not with -q)", NULL},
      {NULL}};
  return g_memdup2(entries, sizeof entries);
}

/* --help: the options, then what the command adds (the targets of the configuration
 * that the same command line names). */
static void
print_help(WsyncCli *cli, const WsyncCommand *cmd, GOptionContext *octx)
{
  g_autofree char *options = g_option_context_get_help(octx, TRUE, NULL);
  GString *more = g_string_new(NULL);

  if (cmd->help_more != NULL)
    cmd->help_more(cli, more);
  printf("%s%s", options, more->str);
  g_string_free(more, TRUE);
}

gboolean
cli_parse(WsyncCli *cli, const WsyncCommand *cmd, GOptionEntry *entries, int *argc, char ***argv)
{
  g_autoptr(GError) error = NULL;

  if (cli_parse_checked(cli, cmd, entries, argc, argv, &error))
    return TRUE;
  cli_error_line("%s", error->message);
  return FALSE;
}

gboolean
cli_parse_checked(WsyncCli *cli, const WsyncCommand *cmd, GOptionEntry *entries, int *argc,
                  char ***argv, GError **error)
{
  g_autoptr(GOptionContext) octx = g_option_context_new(cmd->args);
  g_autofree GOptionEntry *globals = global_entries(cli);
  g_autoptr(GError) parse_error = NULL;
  gboolean help = FALSE, version = FALSE;
  GOptionEntry help_entry[] = {
      {"help", 'h', 0, G_OPTION_ARG_NONE, &help, "Show this help", NULL},
      {"version", 0, 0, G_OPTION_ARG_NONE, &version, "Show the version", NULL},
      {NULL}};

  g_option_context_set_help_enabled(octx, FALSE);
  g_option_context_set_summary(octx, cmd->summary);
  g_option_context_set_description(octx, "Exit status: 0 success, 1 a check found a difference, "
                                         "2 usage, configuration or plugin error,\n3 bad input data, "
                                         "4 I/O failure.");
  /* The command's own options first, then the global ones, all in one --help. */
  if (entries != NULL)
    g_option_context_add_main_entries(octx, entries, NULL);
  g_option_context_add_main_entries(octx, globals, NULL);
  g_option_context_add_main_entries(octx, help_entry, NULL);
  if (!g_option_context_parse(octx, argc, argv, &parse_error)) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE, "wsync %s: %s (see wsync %s --help)",
                cmd->name, parse_error->message, cmd->name);
    return FALSE;
  }
  if (help || version) {
    if (help)
      print_help(cli, cmd, octx);
    else
      cli_print_version();
    /* freed before exit(), which runs no cleanup: memcheck would count them lost */
    g_clear_pointer(&octx, g_option_context_free);
    g_clear_pointer(&globals, g_free);
    exit(WSYNC_EXIT_OK);
  }
  /* -q and -v ask for less and for more: no meaning is documented for both, so neither
   * silently wins (after --help, which says what each does) */
  if (cli->quiet && cli->verbose) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                "wsync %s: -q (--quiet) and -v (--verbose) contradict each other: give one "
                "(see wsync %s --help)",
                cmd->name, cmd->name);
    return FALSE;
  }
  return TRUE;
}

void
cli_print_version(void)
{
  printf("wsync %s (plugin ABI %d)\n", PACKAGE_VERSION, WSYNC_PLUGIN_ABI_VERSION);
}

/* One target: its name and formats, its description, its own help. */
static void
help_target(GString *out, const WsyncTargetInfo *info)
{
  g_autofree char *formats =
      info->formats != NULL ? g_strjoinv(", ", (char **)info->formats) : NULL;

  g_string_append_printf(out, "  %s%s%s%s: %s\n", info->name, formats ? " (formats " : "",
                         formats ? formats : "", formats ? ")" : "", info->description);
  if (info->help != NULL)
    g_string_append(out, info->help);
}

static void
count_plugin(const char *name, WsyncPluginState state, const char *path,
             const char *description, const char *reason, gpointer user_data)
{
  (void)name, (void)state, (void)path, (void)description, (void)reason;
  (*(guint *)user_data)++;
}

char *
cli_no_plugin_reason(WsyncCli *cli, WsyncContext *ctx)
{
  guint n = 0;

  wsync_context_foreach_plugin(ctx, count_plugin, &n);
  if (n > 0)
    return NULL;
  /* an uninstalled build run without --conf-dir: the installed default is not there */
  if (cli->conf_dirs == NULL && !g_file_test(WSYNC_CONF_DIR, G_FILE_TEST_IS_DIR))
    return g_strdup("there is no configuration: " WSYNC_CONF_DIR " does not exist and no "
                    "--conf-dir was given");
  return g_strdup("no file of the configuration has a plugin section");
}

void
cli_help_targets(WsyncCli *cli, GString *out)
{
  guint n_targets = 0;
  g_autoptr(GError) error = NULL;
  gboolean quiet = cli->quiet;
  WsyncContext *ctx;

  g_string_append(out, "\nTargets (of the plugins the configuration selects):\n");
  cli->quiet = TRUE; /* help is not the place for plugin warnings */
  ctx = cli_context(cli, &error);
  cli->quiet = quiet;
  if (ctx == NULL) {
    g_string_append_printf(out, "  (and those of the plugins; the configuration could not be "
                                "read: %s)\n",
                           error->message);
    return;
  }
  g_autoptr(GPtrArray) targets =
      wsync_registry_lookup(wsync_context_get_registry(ctx), WSYNC_ENTRY_CONVERTER, NULL);
  for (guint i = 0; i < targets->len; i++)
    if (wsync_entry_get_target(targets->pdata[i]) != NULL) {
      help_target(out, wsync_entry_get_target(targets->pdata[i]));
      n_targets++;
    }
  if (n_targets == 0) {
    g_autofree char *why = cli_no_plugin_reason(cli, ctx);
    g_string_append_printf(out, "  (none: %s; see wsync.conf(5))\n",
                           why != NULL ? why : "no selected plugin provides a target");
  }
}

static void
report_refused(const char *name, WsyncPluginState state, const char *path,
               const char *description, const char *reason, gpointer user_data)
{
  (void)path;
  (void)description;
  (void)user_data;
  if (state == WSYNC_PLUGIN_REFUSED)
    cli_error_line("wsync: plugin \"%s\" refused: %s", name, reason);
}

static void
report_warning(const char *plugin_name, const char *message, gpointer user_data)
{
  (void)user_data;
  fprintf(stderr, "wsync: plugin \"%s\": %s\n", plugin_name, message);
}

WsyncContext *
cli_context(WsyncCli *cli, GError **error)
{
  if (cli->ctx != NULL)
    return cli->ctx;
  cli->ctx = wsync_context_new_default((const char *const *)cli->conf_dirs,
                                       (const char *const *)cli->plugin_dirs,
                                       cli->overrides ? cli->overrides->str : NULL, error);
  if (cli->ctx != NULL && !cli->quiet) {
    wsync_context_foreach_plugin(cli->ctx, report_refused, NULL);
    wsync_context_foreach_warning(cli->ctx, report_warning, NULL);
  }
  return cli->ctx;
}

void
cli_error_line(const char *fmt, ...)
{
  va_list args;

  va_start(args, fmt);
  g_autofree char *line = g_strdup_vprintf(fmt, args);
  va_end(args);
  g_autofree char *safe = wsync_printable(line);
  fprintf(stderr, "%s\n", safe);
}

int
cli_fail(const GError *error)
{
  cli_error_line("wsync: %s", error->message);
  return wsync_error_exit_code(error);
}

JsonNode *
cli_config_load(const char *path, GError **error)
{
  GError *local = NULL;
  struct stat st;

  /* One check: wsync_config_load() judges @path as it opens it (a FIFO, a socket, a
   * device or a directory refused in its words, none of them opened: core/filekind.h).
   * Only the words of a missing one differ ("PATH: no such file", bad input): then the
   * path is stat()ed for the reason of the I/O error. */
  JsonNode *root = wsync_config_load(path, &local);
  if (root == NULL && g_error_matches(local, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT) &&
      stat(path, &st) != 0 && (errno == ENOENT || errno == ENOTDIR)) {
    int errsv = errno;
    g_clear_error(&local);
    wsync_set_io_error(&local, errsv, path, "open");
  }
  if (local != NULL)
    g_propagate_error(error, local);
  return root;
}

int
cli_usage_error(const WsyncCommand *cmd, const char *fmt, ...)
{
  va_list args;
  g_autofree char *message = NULL;

  va_start(args, fmt);
  message = g_strdup_vprintf(fmt, args);
  va_end(args);
  cli_error_line("wsync %s: %s (see wsync %s --help)", cmd->name, message, cmd->name);
  return WSYNC_EXIT_USAGE;
}

void
cli_print_json(JsonNode *root)
{
  g_autoptr(JsonGenerator) gen = json_generator_new();
  g_autofree char *text = NULL;

  json_generator_set_pretty(gen, TRUE);
  json_generator_set_indent(gen, 2);
  json_generator_set_root(gen, root);
  text = json_generator_to_data(gen, NULL);
  printf("%s\n", text);
}

/* write(2) until all of @data is written; FALSE with errno set on failure */
static gboolean
write_all(int fd, const char *data, gsize len)
{
  while (len > 0) {
    ssize_t k = write(fd, data, len);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0) {
      if (k == 0)
        errno = ENOSPC;
      return FALSE;
    }
    data += k;
    len -= (gsize)k;
  }
  return TRUE;
}

gboolean
cli_write_file_atomically(const char *path, const char *contents, gsize len, GError **error)
{
  /* A temporary sibling, flushed, then renamed into place; errors name @path, the file
   * the user asked for, not the temporary (g_file_set_contents() named only that). */
  g_autofree char *tmp = g_strconcat(path, ".wsync-XXXXXX", NULL);
  const char *what = "create";
  int fd = g_mkstemp_full(tmp, O_WRONLY | O_CLOEXEC, 0666);
  gboolean ok = fd >= 0;

  if (ok) {
    what = "write";
    gboolean written = write_all(fd, contents, len) && fsync(fd) == 0;
    int errsv = errno;
    gboolean closed = close(fd) == 0;
    /* the reason of the first failure: the write's, else the close's own errno */
    errno = written ? errno : errsv;
    ok = written && closed;
    if (ok) {
      what = "replace";
      ok = rename(tmp, path) == 0;
    }
  }
  if (!ok) {
    int errsv = errno;
    if (fd >= 0)
      unlink(tmp);
    wsync_set_io_error(error, errsv, path, what);
  }
  return ok;
}

static volatile sig_atomic_t caught_signal;

static void
record_signal(int sig)
{
  caught_signal = sig;
}

const volatile sig_atomic_t *
cli_catch_signals(void)
{
  static const int signals[] = {SIGINT, SIGTERM, SIGHUP};
  struct sigaction sa;

  memset(&sa, 0, sizeof sa);
  sa.sa_handler = record_signal;
  sigemptyset(&sa.sa_mask);
  for (guint i = 0; i < G_N_ELEMENTS(signals); i++)
    sigaction(signals[i], &sa, NULL);
  return &caught_signal;
}

/* A signal while the command plans: nothing is written yet, so wsync ends at once, by
 * the signal, after the line the planner's own check gives ("planning was interrupted
 * by SIGINT", core/plan.c plan_interrupted()); a flag would be heard only between the
 * planner's steps, and reading the headers of a whole model's files is one step of
 * seconds.  Only async-signal-safe calls (signal-safety(7)): write(2), signal(2),
 * raise(3). */
static void
end_planning(int sig)
{
  static const char intr[] = "wsync: planning was interrupted by SIGINT\n";
  static const char term[] = "wsync: planning was interrupted by SIGTERM\n";
  static const char hup[] = "wsync: planning was interrupted by SIGHUP\n";
  const char *line = sig == SIGINT ? intr : sig == SIGTERM ? term : hup;
  size_t len = sig == SIGINT ? sizeof intr - 1 : sig == SIGTERM ? sizeof term - 1 : sizeof hup - 1;

  if (write(STDERR_FILENO, line, len) < 0) {
    /* nothing more to say it with */
  }
  signal(sig, SIG_DFL);
  raise(sig); /* delivered as the handler returns: the default action ends wsync */
}

void
cli_end_signals_while_planning(void)
{
  static const int signals[] = {SIGINT, SIGTERM, SIGHUP};
  struct sigaction sa;

  memset(&sa, 0, sizeof sa);
  sa.sa_handler = end_planning;
  sigemptyset(&sa.sa_mask);
  for (guint i = 0; i < G_N_ELEMENTS(signals); i++)
    sigaddset(&sa.sa_mask, signals[i]); /* one line, whichever signals come together */
  for (guint i = 0; i < G_N_ELEMENTS(signals); i++)
    sigaction(signals[i], &sa, NULL);
}

void
cli_default_signals(void)
{
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  signal(SIGHUP, SIG_DFL);
}

/* The command that swapped its output into DST (cli_note_swapped()), or NULL. */
static const char *swapped_by;

void
cli_note_swapped(const char *command)
{
  swapped_by = command;
}

/* A signal caught after the swap stopped nothing: wsync used to end by it silently, so
 * that a user or a script saw death by a signal and could not tell whether DST was the
 * new output.  The line says so, as the distributed sync's does (core/sync-mpi.c,
 * end_after_report()).  The flag is read once: a signal landing after that read is
 * recorded and changes nothing.  stdout (the command's report, "wrote DST: N bytes" or
 * the JSON) is flushed first: the signal's default action ends the process without
 * flushing it, and into a pipe or a file it was lost. */
void
cli_end_by_caught_signal(void)
{
  int sig = caught_signal;

  if (sig == 0)
    return;
  fflush(stdout);
  if (swapped_by != NULL) {
    const char *name = sigabbrev_np(sig);
    cli_error_line("wsync: %s: interrupted by SIG%s after DST was swapped in: DST is the new "
                   "output, complete",
                   swapped_by, name ? name : "NAL");
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

/* ------------------------------------------------------------------ layout options */

void
cli_layout_args_clear(CliLayoutArgs *a)
{
  g_free(a->target);
  g_free(a->format);
  g_free(a->tp);
  g_free(a->ep);
  g_free(a->rank);
  g_free(a->threads);
  g_free(a->part_size);
  g_free(a->select);
  g_free(a->config);
}

gboolean
cli_resolve_layout_args(WsyncContext *ctx, const CliLayoutArgs *a, WsyncPlanOptions *o,
                        GError **error)
{
  WsyncPlanArgs given = {.target = a->target, .format = a->format, .tp = a->tp, .ep = a->ep,
                         .rank = a->rank, .threads = a->threads, .part_size = a->part_size};

  if (!wsync_plan_args_resolve(ctx, &given, o, error))
    return FALSE;
  o->select = a->select; /* resolving zeroes @o first */
  o->config = a->config;
  return TRUE;
}
