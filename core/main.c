/* wsync: the command-line tool.  `wsync [GLOBAL OPTIONS] COMMAND [ARGS]`. */
#include "config.h"

#include <locale.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

const WsyncCommand wsync_commands[] = {
    {"plugins", "", "List the loaded plugins and everything each registered.", cmd_plugins, NULL},
    {"inspect", "PATH",
     "List the tensors (name, dtype, shape, bytes) of a safetensors file, a checkpoint "
     "directory or a sharded training checkpoint (global shapes), and each file's metadata.",
     cmd_inspect, NULL},
    {"verify", "A B",
     "Compare two checkpoints tensor by tensor, bit-exact, and their published-dtype records "
     "(no other metadata); exit 0 when equal, 1 when not.",
     cmd_verify, NULL},
    {"plan", "SRC",
     "Show, without writing, every output tensor, where its bytes come from and what makes "
     "it.",
     cmd_plan, cli_help_targets},
    {"convert", "SRC DST", "Write the target layout of SRC into DST.", cmd_convert,
     cli_help_targets},
    {"sync", "SRC DST",
     "Under mpirun: write the target layout of SRC (read by process 0) into DST on every "
     "process's host, each process receiving only the bytes of the ranks it writes.",
     cmd_sync, NULL},
    {"merge", "SRC DST",
     "Consolidate a sharded training checkpoint (PyTorch DCP, FSDP2/EP) into a plain one.",
     cmd_merge, NULL},
    {"synth", "DST",
     "Write a checkpoint of generated weights with the real names, shapes and dtypes of "
     "--config.",
     cmd_synth, NULL},
    {"env", "",
     "Print the environment settings a backend's deployment needs (--backend B --mode "
     "colocate|server).",
     cmd_env, NULL},
    {"config", "CONFIG.json",
     "Run the config patchers (e.g. rope-compat) on a config.json and print or write the "
     "result.",
     cmd_config, NULL},
    {NULL}};

static void
print_main_help(FILE *out)
{
  fprintf(out, "Usage: wsync [OPTION...] COMMAND [ARGS]\n\n"
               "Move LLM weights from a trainer's layout to an inference engine's layout.\n\n"
               "Commands:\n");
  for (const WsyncCommand *cmd = wsync_commands; cmd->name != NULL; cmd++)
    fprintf(out, "  %-8s %-12s %s\n", cmd->name, cmd->args, cmd->summary);
  fprintf(out,
          "\nOptions of every command:\n"
          "  --conf-dir DIR     read DIR/*.conf (repeatable; replaces %s)\n"
          "  --plugin-dir DIR   look for plugins in DIR first (repeatable; then\n"
          "                     $WSYNC_PLUGIN_PATH, then %s)\n"
          "  --json             machine-readable output on stdout\n"
          "  -q, --quiet        print only errors and the command's result (no warnings,\n"
          "                     no progress, no notes after a write)\n"
          "  -v, --verbose      say more (sync only: when each phase ended; not with -q)\n"
          "  -h, --help         show help (wsync COMMAND --help for a command's options)\n"
          "  --version          show the version\n\n"
          "Exit status: 0 success, 1 a check found a difference, 2 usage, configuration or\n"
          "plugin error, 3 bad input data, 4 I/O failure.\n",
          WSYNC_CONF_DIR, WSYNC_PLUGIN_DIR);
}

/* Global options that take a value: the word after them is not the command. */
static gboolean
takes_value(const char *arg)
{
  return strcmp(arg, "--conf-dir") == 0 || strcmp(arg, "--plugin-dir") == 0;
}

/* Index of the command word in argv, or 0 when there is none. */
static int
find_command(int argc, char **argv)
{
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--") == 0)
      return i + 1 < argc ? i + 1 : 0;
    if (argv[i][0] != '-')
      return i;
    if (takes_value(argv[i]))
      i++;
  }
  return 0;
}

static gboolean
has_flag(int argc, char **argv, const char *flag, const char *short_flag)
{
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], flag) == 0 || (short_flag && strcmp(argv[i], short_flag) == 0))
      return TRUE;
  return FALSE;
}

int
main(int argc, char **argv)
{
  WsyncCli cli = {0};
  int at, status;

  setlocale(LC_ALL, "");
  at = find_command(argc, argv);
  if (at == 0) {
    if (has_flag(argc, argv, "--version", NULL)) {
      cli_print_version();
      return WSYNC_EXIT_OK;
    }
    if (has_flag(argc, argv, "--help", "-h")) {
      print_main_help(stdout);
      return WSYNC_EXIT_OK;
    }
    print_main_help(stderr);
    return WSYNC_EXIT_USAGE;
  }
  const WsyncCommand *cmd = NULL;
  for (const WsyncCommand *c = wsync_commands; c->name != NULL; c++)
    if (strcmp(c->name, argv[at]) == 0)
      cmd = c;
  if (cmd == NULL) {
    cli_error_line("wsync: unknown command \"%s\" (see wsync --help)", argv[at]);
    return WSYNC_EXIT_USAGE;
  }
  /* The command sees argv without its own name; global options may stand anywhere. */
  memmove(&argv[at], &argv[at + 1], (size_t)(argc - at) * sizeof(char *));
  argc--;
  argv[0] = g_strdup_printf("wsync %s", cmd->name);
  status = cmd->run(&cli, cmd, argc, argv);

  wsync_context_free(cli.ctx);
  g_strfreev(cli.conf_dirs);
  g_strfreev(cli.plugin_dirs);
  if (cli.overrides)
    g_string_free(cli.overrides, TRUE);
  g_free(argv[0]);
  cli_end_by_caught_signal(); /* after the clean-up a caught signal stopped the run for */
  return status;
}
