/* wsync inspect PATH: the tensors of a safetensors file or a checkpoint directory, and
 * each file's __metadata__. */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "cli.h"

/* A file's __metadata__ (none: nothing), under the table: "metadata of FILE:", then
 * "  KEY=VALUE" in key order.  Metadata is whatever the file says: every key and value
 * is printed printable, one line each. */
static void
print_metadata(const WsyncSafetensors *st)
{
  GHashTable *metadata = wsync_safetensors_metadata(st);
  g_autoptr(GList) keys = g_list_sort(g_hash_table_get_keys(metadata), (GCompareFunc)strcmp);
  g_autofree char *path = NULL;

  if (keys == NULL)
    return;
  path = wsync_printable(wsync_safetensors_path(st));
  printf("metadata of %s:\n", path);
  for (GList *k = keys; k != NULL; k = k->next) {
    g_autofree char *key = wsync_printable(k->data);
    g_autofree char *value = wsync_printable(g_hash_table_lookup(metadata, k->data));
    printf("  %s=%s\n", key, value);
  }
}

static void
print_text(WsyncCheckpoint *ck)
{
  guint n = wsync_checkpoint_n_tensors(ck);
  int name_w = 4, dtype_w = 5, shape_w = 5;
  g_autoptr(GPtrArray) shapes = g_ptr_array_new_with_free_func(g_free);
  g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);

  for (guint i = 0; i < n; i++) {
    const WsyncTensor *t = wsync_checkpoint_tensor(ck, i);
    char *shape = wsync_shape_format(t->ndim, t->shape);
    g_ptr_array_add(shapes, shape);
    g_ptr_array_add(names, wsync_printable(t->name)); /* one line per tensor, whatever its name */
    name_w = MAX(name_w, (int)strlen(names->pdata[i]));
    dtype_w = MAX(dtype_w, (int)strlen(wsync_dtype_name(t->dtype)));
    shape_w = MAX(shape_w, (int)strlen(shape));
  }
  printf("%-*s  %-*s  %-*s  %s\n", name_w, "NAME", dtype_w, "DTYPE", shape_w, "SHAPE", "BYTES");
  for (guint i = 0; i < n; i++) {
    const WsyncTensor *t = wsync_checkpoint_tensor(ck, i);
    printf("%-*s  %-*s  %-*s  %" G_GUINT64_FORMAT "\n", name_w, (const char *)names->pdata[i], dtype_w,
           wsync_dtype_name(t->dtype), shape_w, (const char *)shapes->pdata[i], t->nbytes);
  }
  printf("%u tensors, %" G_GUINT64_FORMAT " bytes in %u file%s\n", n,
         wsync_checkpoint_total_bytes(ck), wsync_checkpoint_n_files(ck),
         wsync_checkpoint_n_files(ck) == 1 ? "" : "s");
  for (guint f = 0; f < wsync_checkpoint_n_files(ck); f++)
    print_metadata(wsync_checkpoint_file(ck, f));
}

static void
print_json(WsyncCheckpoint *ck)
{
  g_autoptr(JsonNode) root = wsync_checkpoint_to_json(ck);
  cli_print_json(root);
}

int
cmd_inspect(WsyncCli *cli, const WsyncCommand *cmd, int argc, char **argv)
{
  g_autoptr(GError) error = NULL;
  WsyncContext *ctx;
  g_autoptr(WsyncCheckpoint) ck = NULL;

  if (!cli_parse(cli, cmd, NULL, &argc, &argv))
    return WSYNC_EXIT_USAGE;
  if (argc != 2)
    return cli_usage_error(cmd, argc < 2 ? "missing PATH" : "expected one PATH");
  /* inspect needs no plugin, but a broken configuration is still an error. */
  if ((ctx = cli_context(cli, &error)) == NULL)
    return cli_fail(error);
  ck = wsync_context_open_checkpoint(ctx, argv[1], &error);
  if (ck == NULL)
    return cli_fail(error);
  if (cli->json)
    print_json(ck);
  else
    print_text(ck);
  return WSYNC_EXIT_OK;
}
