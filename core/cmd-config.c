/* wsync config CONFIG.json: run the registered config patchers on a config.json. */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "files.h"

/* A refusal of the override text --rope-format made ("command line:3: rope-format must
 * be ..."), without the source and line: the user gave a flag, not line 3 of a file. */
static const char *
flag_refusal(const char *message)
{
  const char *rest = message + strlen("command line:");

  while (g_ascii_isdigit(*rest))
    rest++;
  return rest[0] == ':' && rest[1] == ' ' ? rest + 2 : message;
}

int
cmd_config(WsyncCli *cli, const WsyncCommand *cmd, int argc, char **argv)
{
  g_autofree char *output = NULL;
  g_autofree char *rope_format = NULL;
  g_autoptr(GError) error = NULL;
  g_autoptr(JsonNode) root = NULL;
  g_autoptr(JsonGenerator) gen = json_generator_new();
  g_autofree char *text = NULL;
  WsyncContext *ctx;
  GOptionEntry entries[] = {
      {"output", 'o', 0, G_OPTION_ARG_FILENAME, &output, "Write to FILE (default: stdout)",
       "FILE"},
      {"rope-format", 0, 0, G_OPTION_ARG_STRING, &rope_format,
       "Set the rope-compat plugin's rope-format: transformers5, transformers4 or keep "
       "(selects the plugin)",
       "FORMAT"},
      {NULL}};

  if (!cli_parse(cli, cmd, entries, &argc, &argv))
    return WSYNC_EXIT_USAGE;
  if (argc != 2)
    return cli_usage_error(cmd, argc < 2 ? "missing CONFIG.json" : "expected one CONFIG.json");
  if (rope_format != NULL) {
    /* The flag is the plugin's own option, given on the command line: it is checked by
     * the plugin's option table like any conf.d setting. */
    if (strpbrk(rope_format, "\"\\\n") != NULL)
      return cli_usage_error(cmd, "invalid --rope-format \"%s\"", rope_format);
    if (cli->overrides == NULL)
      cli->overrides = g_string_new(NULL);
    g_string_append_printf(cli->overrides, "plugin \"rope-compat\" {\n  enabled = true\n"
                                           "  rope-format = \"%s\"\n}\n",
                           rope_format);
  }
  ctx = cli_context(cli, &error);
  if (ctx == NULL && rope_format != NULL && g_str_has_prefix(error->message, "command line:"))
    return cli_usage_error(cmd, "--rope-format: %s", flag_refusal(error->message));
  if (ctx == NULL)
    return cli_fail(error);
  root = cli_config_load(argv[1], &error);
  if (root == NULL || !wsync_context_patch_config(ctx, root, &error))
    return cli_fail(error);

  json_generator_set_pretty(gen, TRUE);
  json_generator_set_indent(gen, 2);
  json_generator_set_root(gen, root);
  text = json_generator_to_data(gen, NULL);
  if (output == NULL) {
    printf("%s\n", text);
    return WSYNC_EXIT_OK;
  }
  g_autofree char *with_newline = g_strconcat(text, "\n", NULL);
  if (!cli_write_file_atomically(output, with_newline, strlen(with_newline), &error))
    return cli_fail(error);
  return WSYNC_EXIT_OK;
}
