/* wsync plan / convert / synth: the commands that run the engine. */
#include "config.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "files.h"

/* Writes @plan into @dst: progress on stderr when it is a terminal (and not -q), DST
 * replaced even when it is not wsync's output with --force, and SIGINT, SIGTERM or
 * SIGHUP stop the run with its temporary directory removed. */
static gboolean
execute(WsyncCli *cli, const WsyncCommand *cmd, WsyncPlan *plan, const char *dst,
        gboolean force, GError **error)
{
  WsyncExecuteFlags flags = force ? WSYNC_EXECUTE_FORCE : WSYNC_EXECUTE_NONE;

  if (!cli->quiet && isatty(STDERR_FILENO))
    flags |= WSYNC_EXECUTE_PROGRESS;
  wsync_plan_set_interrupt(plan, cli_catch_signals());
  if (!wsync_plan_execute(plan, dst, flags, error))
    return FALSE;
  /* a signal caught since the last check stopped nothing: DST is the new output, and
   * the end says so (a failed swap's error already says what DST is) */
  cli_note_swapped(cmd->name);
  return TRUE;
}

/* What convert and merge say when done: the bytes written, then the plan's notes (how to
 * load the output, the engine's naming era, rounded tensors), which a user who never
 * runs `wsync plan` would otherwise not see. */
static void
print_written(WsyncPlan *plan, const char *dst)
{
  guint n_notes;
  const char *const *notes = wsync_plan_get_notes(plan, &n_notes);

  printf("wrote %s: %" G_GUINT64_FORMAT " bytes\n", dst, wsync_plan_total_bytes(plan));
  for (guint i = 0; i < n_notes; i++)
    printf("note: %s\n", notes[i]);
}

#define LAYOUT_ENTRIES(a)                                                                       \
  {"target", 't', 0, G_OPTION_ARG_STRING, &(a).target,                                          \
   "Target layout (the targets of the selected plugins: see below)", "T"},          \
      {"format", 'f', 0, G_OPTION_ARG_STRING, &(a).format,                                    \
       "One of the target's file formats (default: its first; see below)", "F"},                                                                     \
      {"tp", 0, 0, G_OPTION_ARG_STRING, &(a).tp, "Tensor-parallel size (default 1)", "N"},    \
      {"ep", 0, 0, G_OPTION_ARG_STRING, &(a).ep,                                              \
       "Expert-parallel size: 1, or a multiple of --tp (default 1)", "N"},                     \
      {"rank", 0, 0, G_OPTION_ARG_STRING, &(a).rank, "Only this rank (default: every rank)",  \
       "R"},                                                                                    \
      {"threads", 0, 0, G_OPTION_ARG_STRING, &(a).threads,                                    \
       "Worker threads (default: the number of cores)", "N"},                                  \
      {"part-size", 0, 0, G_OPTION_ARG_STRING, &(a).part_size,                                \
       "Start a new file before a tensor that would pass SIZE (default 5G)", "SIZE"}

#define FORCE_ENTRY(force)                                                                      \
  {"force", 0, 0, G_OPTION_ARG_NONE, &(force),                                                  \
   "Replace DST even when it is not wsync's output (it and everything in it are removed)",     \
   NULL}

/* plan and convert: parse the layout options (and @force, when not NULL) and @n_paths
 * paths, build the plan of argv[1].  On failure returns NULL with *status set. */
static WsyncPlan *
plan_from_args(WsyncCli *cli, const WsyncCommand *cmd, int *argcp, char ***argvp, int n_paths,
               gboolean *force, int *status)
{
  CliLayoutArgs a = {0};
  gboolean unused = FALSE;
  GOptionEntry entries[] = {LAYOUT_ENTRIES(a), CLI_SELECT_ENTRY(a.select),
                            CLI_CONFIG_ENTRY(a.config),
                            FORCE_ENTRY(*(force ? force : &unused)), {NULL}};
  g_autoptr(GError) error = NULL;

  if (force == NULL)
    entries[G_N_ELEMENTS(entries) - 2] = entries[G_N_ELEMENTS(entries) - 1];
  WsyncPlanOptions o = {0};
  WsyncContext *ctx;
  WsyncPlan *plan = NULL;

  *status = WSYNC_EXIT_OK;
  if (!cli_parse(cli, cmd, entries, argcp, argvp))
    *status = WSYNC_EXIT_USAGE;
  else if (*argcp != n_paths + 1)
    *status = cli_usage_error(cmd, n_paths == 1 ? "expected one SRC" : "expected SRC and DST");
  else if ((ctx = cli_context(cli, &error)) == NULL ||
           !cli_resolve_layout_args(ctx, &a, &o, &error))
    *status = cli_fail(error);
  else {
    /* planning a whole model takes seconds: a signal ends it at once, with its line */
    cli_end_signals_while_planning();
    plan = wsync_plan_new(ctx, (*argvp)[1], &o, &error);
    /* from now on: convert's run hears a signal at its next piece of work; plan, which
     * only prints, ends by it at once (a print blocked on a full pipe would not) */
    if (force != NULL)
      cli_catch_signals();
    else
      cli_default_signals();
    if (plan == NULL)
      *status = cli_fail(error);
  }
  cli_layout_args_clear(&a);
  return plan;
}

int
cmd_plan(WsyncCli *cli, const WsyncCommand *cmd, int argc, char **argv)
{
  int status;
  g_autoptr(WsyncPlan) plan = plan_from_args(cli, cmd, &argc, &argv, 1, NULL, &status);

  if (plan == NULL)
    return status;
  if (cli->json) {
    g_autoptr(JsonNode) root = wsync_plan_to_json(plan);
    cli_print_json(root);
  } else
    wsync_plan_print(plan, stdout);
  return WSYNC_EXIT_OK;
}

int
cmd_convert(WsyncCli *cli, const WsyncCommand *cmd, int argc, char **argv)
{
  int status;
  g_autoptr(GError) error = NULL;
  gboolean force = FALSE;
  g_autoptr(WsyncPlan) plan = plan_from_args(cli, cmd, &argc, &argv, 2, &force, &status);

  if (plan == NULL)
    return status;
  const char *dst = argv[2]; /* option parsing left: program, SRC, DST */
  if (!execute(cli, cmd, plan, dst, force, &error))
    return cli_fail(error);
  if (cli->json) {
    g_autoptr(JsonNode) root = wsync_plan_to_json(plan);
    cli_print_json(root);
  } else if (!cli->quiet)
    print_written(plan, dst);
  return WSYNC_EXIT_OK;
}

int
cmd_synth(WsyncCli *cli, const WsyncCommand *cmd, int argc, char **argv)
{
  g_autofree char *config = NULL;
  g_autofree char *pattern = NULL;
  g_autofree char *part_size = NULL;
  g_autofree char *layers_text = NULL; /* numbers read as every command reads its own */
  g_autofree char *seed_text = NULL;
  guint64 layers = 0, seed = 0;
  gboolean fused = FALSE;
  gboolean force = FALSE;
  GOptionEntry entries[] = {
      {"config", 'c', 0, G_OPTION_ARG_FILENAME, &config, "The model's config.json", "CONFIG"},
      {"layers", 0, 0, G_OPTION_ARG_STRING, &layers_text,
       "Only the first N layers (at most the model's)", "N"},
      {"seed", 0, 0, G_OPTION_ARG_STRING, &seed_text, "Random seed (default 0)", "S"},
      {"fused-experts", 0, 0, G_OPTION_ARG_NONE, &fused,
       "Experts fused as Transformers 5 holds them (gate_up_proj [E, 2I, H])", NULL},
      {"pattern", 0, 0, G_OPTION_ARG_STRING, &pattern,
       "random (default): small finite values; index: each element's bytes encode its "
       "tensor and position",
       "P"},
      /* (not a limit: a tensor larger than SIZE gets a file of its own) */
      {"part-size", 0, 0, G_OPTION_ARG_STRING, &part_size,
       "Start a new file before a tensor that would pass SIZE (default 5G)", "SIZE"},
      FORCE_ENTRY(force),
      {NULL}};
  g_autoptr(GError) error = NULL;
  WsyncPlanOptions o = {0};
  WsyncContext *ctx;

  if (!cli_parse(cli, cmd, entries, &argc, &argv))
    return WSYNC_EXIT_USAGE;
  if (config == NULL)
    return cli_usage_error(cmd, "missing --config CONFIG.json");
  if (argc != 2)
    return cli_usage_error(cmd, argc < 2 ? "missing DST" : "expected one DST");
  if (pattern != NULL && strcmp(pattern, "random") != 0 && strcmp(pattern, "index") != 0)
    return cli_usage_error(cmd, "--pattern must be random or index, not \"%s\"", pattern);
  /* (--layers -1 was taken as no --layers, the whole model; "1x" got GLib's sentence) */
  if (layers_text != NULL && !wsync_parse_count("--layers", layers_text, 1,
                                                WSYNC_CONFIG_COUNT_MAX, &layers, &error))
    return cli_usage_error(cmd, "%s", error->message);
  if (seed_text != NULL &&
      !wsync_parse_count("--seed", seed_text, 0, G_MAXUINT64, &seed, &error))
    return cli_usage_error(cmd, "%s", error->message);
  ctx = cli_context(cli, &error);
  if (ctx == NULL)
    return cli_fail(error);

  g_autoptr(JsonNode) root = cli_config_load(config, &error);
  if (root == NULL)
    return cli_fail(error);
  /* the first N layers, by the fields the model's remapper declares (a number beyond
   * the model's is refused: that model does not exist) */
  guint64 model_layers = 0;
  if (layers > 0 && !wsync_config_trim_layers(ctx, root, config, layers, &model_layers, &error)) {
    if (model_layers > 0 && layers > model_layers)
      return cli_usage_error(cmd, "--layers %" G_GUINT64_FORMAT ": %s", layers, error->message);
    return cli_fail(error);
  }

  /* the published layout, or Transformers 5's fused experts (targets of plugin "hf") */
  o.target = fused ? "hf-fused" : "hf";
  o.rank = -1;
  if (!wsync_parse_size("--part-size", part_size ? part_size : "5G", &o.part_size, &error))
    return cli_fail(error);
  cli_end_signals_while_planning(); /* a signal ends planning at once, with its line */
  g_autoptr(WsyncPlan) plan =
      wsync_plan_new_synth(ctx, root, config, &o, seed,
                           pattern != NULL && strcmp(pattern, "index") == 0, &error);
  cli_catch_signals();
  if (plan == NULL || !execute(cli, cmd, plan, argv[1], force, &error))
    return cli_fail(error);
  if (cli->json) {
    g_autoptr(JsonNode) json = wsync_plan_to_json(plan);
    cli_print_json(json);
  } else if (!cli->quiet)
    printf("wrote %s: %" G_GUINT64_FORMAT " bytes\n", argv[1], wsync_plan_total_bytes(plan));
  return WSYNC_EXIT_OK;
}

int
cmd_merge(WsyncCli *cli, const WsyncCommand *cmd, int argc, char **argv)
{
  gboolean force = FALSE;
  g_autofree char *part_size = NULL;
  g_autofree char *threads = NULL;
  g_autofree char *select = NULL;
  g_autofree char *config = NULL;
  GOptionEntry entries[] = {
      {"part-size", 0, 0, G_OPTION_ARG_STRING, &part_size,
       "When the shards name no output files: start a new file before a tensor that would "
       "pass SIZE (default 5G)",
       "SIZE"},
      {"threads", 0, 0, G_OPTION_ARG_STRING, &threads,
       "Worker threads (default: the number of cores)", "N"},
      CLI_SELECT_ENTRY(select),
      CLI_CONFIG_ENTRY(config),
      FORCE_ENTRY(force),
      {NULL}};
  g_autoptr(GError) error = NULL;
  WsyncPlanOptions o = {.rank = -1};
  WsyncContext *ctx;
  guint64 n = 0;

  if (!cli_parse(cli, cmd, entries, &argc, &argv))
    return WSYNC_EXIT_USAGE;
  if (argc != 3)
    return cli_usage_error(cmd, argc < 3 ? "missing SRC or DST" : "expected SRC and DST");
  ctx = cli_context(cli, &error);
  if (ctx == NULL)
    return cli_fail(error);
  g_autofree char *cores = g_strdup_printf("%u", g_get_num_processors());
  if (!wsync_parse_size("--part-size",
                        wsync_context_resolve_sync_option(ctx, part_size, "part-size", "5G"),
                        &o.part_size, &error) ||
      !wsync_parse_count("--threads",
                         wsync_context_resolve_sync_option(ctx, threads, "threads", cores), 1,
                         1024, &n, &error))
    return cli_fail(error);
  o.threads = (guint)n;
  o.select = select;
  o.config = config;
  cli_end_signals_while_planning(); /* a signal ends planning at once, with its line */
  g_autoptr(WsyncPlan) plan = wsync_plan_new_merge(ctx, argv[1], &o, &error);
  cli_catch_signals();
  if (plan == NULL || !execute(cli, cmd, plan, argv[2], force, &error))
    return cli_fail(error);
  if (cli->json) {
    g_autoptr(JsonNode) root = wsync_plan_to_json(plan);
    cli_print_json(root);
  } else if (!cli->quiet)
    print_written(plan, argv[2]);
  return WSYNC_EXIT_OK;
}
