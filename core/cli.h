/* wsync: what the command-line tool's commands share. */
#ifndef WSYNC_CLI_H
#define WSYNC_CLI_H

#include <signal.h>

#include <json-glib/json-glib.h>

#include <wsync/wsync.h>

/* The global options, valid on every command, and the context they lead to. */
typedef struct {
  char **conf_dirs;   /* --conf-dir, repeatable; replaces the default */
  char **plugin_dirs; /* --plugin-dir, repeatable */
  gboolean json;      /* --json: machine-readable output on stdout */
  gboolean quiet;     /* -q */
  gboolean verbose;   /* -v */
  GString *overrides; /* configuration text commands add (e.g. from --rope-format) */
  WsyncContext *ctx;
} WsyncCli;

typedef struct _WsyncCommand WsyncCommand;
typedef int (*WsyncCommandFunc)(WsyncCli *cli, const WsyncCommand *cmd, int argc, char **argv);

struct _WsyncCommand {
  const char *name;
  const char *args;    /* e.g. "PATH" */
  const char *summary; /* one line */
  WsyncCommandFunc run;
  /* nullable: more --help text, made with the configuration the options name */
  void (*help_more)(WsyncCli *cli, GString *out);
};

/* Parses a command's options (plus the global ones); on --help or --version prints and
 * exits 0, on a usage error prints the message and returns FALSE (exit 2). */
gboolean cli_parse(WsyncCli *cli, const WsyncCommand *cmd, GOptionEntry *entries, int *argc,
                   char ***argv);

/* cli_parse(), but a usage error is returned in @error (#WSYNC_ERROR_USAGE, "wsync CMD:
 * ... (see wsync CMD --help)") instead of printed. */
gboolean cli_parse_checked(WsyncCli *cli, const WsyncCommand *cmd, GOptionEntry *entries,
                           int *argc, char ***argv, GError **error);

/* Prints "wsync VERSION (plugin ABI N)" on stdout: what --version says, with or without a
 * command. */
void cli_print_version(void);

/* Builds the context (configuration, plugins) once; reports refused plugins on stderr. */
WsyncContext *cli_context(WsyncCli *cli, GError **error);

/* Writes one line to stderr: @fmt formatted, then passed whole through wsync_printable()
 * (control characters and invalid UTF-8 escaped), then a newline.  Every error, refusal
 * and warning wsync prints goes through here, so no text read from a file (a tensor or
 * shard name, a JSON parser's quote, a conf token, a metadata value) can break a message
 * into lines or drive the terminal. */
void cli_error_line(const char *fmt, ...) G_GNUC_PRINTF(1, 2);

/* Prints "wsync: MESSAGE" on stderr (through cli_error_line()) and returns the error's
 * exit status. */
int cli_fail(const GError *error);

/* Prints a usage error and returns 2. */
int cli_usage_error(const WsyncCommand *cmd, const char *fmt, ...) G_GNUC_PRINTF(2, 3);

/* Reads the config.json at @path, a path the command line names (`wsync config
 * CONFIG.json`, `synth --config`): one that is not there is the I/O error (exit 4) a
 * missing SRC is, "cannot open PATH: REASON"; wsync_config_load() calls a missing
 * config.json bad input (3), right for the one a checkpoint directory lacks. */
JsonNode *cli_config_load(const char *path, GError **error);

/* Writes @root as pretty JSON (indent 2) and a newline to stdout. */
void cli_print_json(JsonNode *root);

/* Writes @contents to @path atomically: a temporary sibling, then rename. */
gboolean cli_write_file_atomically(const char *path, const char *contents, gsize len,
                                   GError **error);

/* Catches SIGINT, SIGTERM and SIGHUP from now on: the handler only records the signal
 * (no SA_RESTART, so a blocking call returns), for wsync_plan_execute() to stop at the
 * next piece of work and remove its temporary directory.  Returns the flag to pass as
 * wsync_plan_set_interrupt(). */
const volatile sig_atomic_t *cli_catch_signals(void);

/* While plan, convert, merge or synth plans (nothing written yet): SIGINT, SIGTERM or
 * SIGHUP end wsync at once, by the signal, after the line "wsync: planning was
 * interrupted by SIGINT".  cli_catch_signals() (or the default action) takes over once
 * planning is done. */
void cli_end_signals_while_planning(void);

/* SIGINT, SIGTERM and SIGHUP end wsync at once again (their default action): for a
 * command that only prints once it has planned. */
void cli_default_signals(void);

/* Says that @command (static: "convert", "merge", "synth") swapped its complete output
 * into DST, so that a signal caught from then on, which stops nothing,
 * cli_end_by_caught_signal() reports as such. */
void cli_note_swapped(const char *command);

/* When a signal was caught: flushes stdout, restores the signal's default action and
 * raises it, so that wsync ends as the signal's sender expects (status 128 + N in a
 * shell).  After cli_note_swapped() it first prints "wsync: COMMAND: interrupted by
 * SIGTERM after DST was swapped in: DST is the new output, complete". */
void cli_end_by_caught_signal(void);

/* The layout options of plan, convert and sync, as given; strings so that unset is
 * visible. */
typedef struct {
  char *target;
  char *format;
  char *tp;
  char *ep;
  char *rank;
  char *threads;
  char *part_size;
  char *select; /* --select KEY, of a DCP source (WsyncPlanOptions.select) */
  char *config; /* --config DIR (WsyncPlanOptions.config) */
} CliLayoutArgs;

/* --select KEY of plan, convert, merge and sync, one text for all (docs/dcp.md §3,
 * "Names"). */
#define CLI_SELECT_ENTRY(select)                                                                \
  {"select", 0, 0, G_OPTION_ARG_STRING, &(select),                                             \
   "A sharded checkpoint (DCP) that holds more than the model (its optimizer): take the "       \
   "tensors directly under KEY, a dotted path into the saved state dict as its refusal lists " \
   "them (. for the top level)",                                                              \
   "KEY"}

/* --config DIR of plan, convert, merge and sync, one text for all (docs/dcp.md §3,
 * "Where config.json is"). */
#define CLI_CONFIG_ENTRY(config)                                                               \
  {"config", 0, 0, G_OPTION_ARG_FILENAME, &(config),                                           \
   "Read the model's config.json from DIR (or DIR is that config.json), not from SRC, and "   \
   "copy the tokenizer and generation config from DIR, none from SRC: for a sharded "          \
   "checkpoint saved without them, or weights saved without config.json",                     \
   "DIR"}

void cli_layout_args_clear(CliLayoutArgs *a);

/* @o from the options, conf.d's `sync` section and the defaults (tp 1, ep 1, a thread per
 * core, parts of 5G, every rank); @o->select and @o->config point into @a. */
gboolean cli_resolve_layout_args(WsyncContext *ctx, const CliLayoutArgs *a,
                                 WsyncPlanOptions *o, GError **error);

/* Why @ctx has no plugin at all (no configuration, or none of its files selects one), or
 * NULL when it has some: what an empty listing says instead of nothing. */
char *cli_no_plugin_reason(WsyncCli *cli, WsyncContext *ctx);

/* --help of plan and convert: the targets the configuration's plugins provide. */
void cli_help_targets(WsyncCli *cli, GString *out);

int cmd_plugins(WsyncCli *cli, const WsyncCommand *cmd, int argc, char **argv);
int cmd_inspect(WsyncCli *cli, const WsyncCommand *cmd, int argc, char **argv);
int cmd_verify(WsyncCli *cli, const WsyncCommand *cmd, int argc, char **argv);
int cmd_config(WsyncCli *cli, const WsyncCommand *cmd, int argc, char **argv);
int cmd_plan(WsyncCli *cli, const WsyncCommand *cmd, int argc, char **argv);
int cmd_convert(WsyncCli *cli, const WsyncCommand *cmd, int argc, char **argv);
int cmd_merge(WsyncCli *cli, const WsyncCommand *cmd, int argc, char **argv);
int cmd_env(WsyncCli *cli, const WsyncCommand *cmd, int argc, char **argv);
int cmd_synth(WsyncCli *cli, const WsyncCommand *cmd, int argc, char **argv);
int cmd_sync(WsyncCli *cli, const WsyncCommand *cmd, int argc, char **argv);

extern const WsyncCommand wsync_commands[];

#endif /* WSYNC_CLI_H */
