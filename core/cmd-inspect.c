/* wsync inspect PATH: the tensors of a safetensors file or a checkpoint directory, and
 * each file's __metadata__; of a sharded training checkpoint (PyTorch DCP), the logical
 * tensors merge would write, read by the same reader. */
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

/* The table of tensors, columns as wide as their widest cell: NAME DTYPE SHAPE BYTES. */
static void
print_table(guint n, const char *const *names, const WsyncDtype *dtypes,
            const char *const *shapes, const guint64 *bytes)
{
  int name_w = 4, dtype_w = 5, shape_w = 5;
  for (guint i = 0; i < n; i++) {
    name_w = MAX(name_w, (int)strlen(names[i]));
    dtype_w = MAX(dtype_w, (int)strlen(wsync_dtype_name(dtypes[i])));
    shape_w = MAX(shape_w, (int)strlen(shapes[i]));
  }
  printf("%-*s  %-*s  %-*s  %s\n", name_w, "NAME", dtype_w, "DTYPE", shape_w, "SHAPE", "BYTES");
  for (guint i = 0; i < n; i++)
    printf("%-*s  %-*s  %-*s  %" G_GUINT64_FORMAT "\n", name_w, names[i], dtype_w,
           wsync_dtype_name(dtypes[i]), shape_w, shapes[i], bytes[i]);
}

/* A sharded training checkpoint, from what `inspect --json` prints
 * (wsync_sharded_checkpoint_to_json()): the logical tensors (global shapes) in the
 * table, then what merge leaves out of the names and of the output:
 *   "22 tensors, 1744 bytes in 37 chunks (PyTorch DCP, .metadata and __R_K.distcp files)"
 *   "not tensors, skipped: train_state"
 *   "names without the key model, under which the state dict was saved"
 *   "left out by --select: 8 entries"
 *   "note: merge, convert, plan and sync refuse these names: ..." (without --select) */
static void
print_sharded_text(JsonObject *root)
{
  JsonArray *tensors = json_object_get_array_member(root, "tensors");
  JsonArray *skipped = json_object_get_array_member(root, "skipped");
  guint n = json_array_get_length(tensors);
  gint64 chunks = 0;
  g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
  g_autoptr(GPtrArray) shapes = g_ptr_array_new_with_free_func(g_free);
  g_autofree WsyncDtype *dtypes = g_new0(WsyncDtype, n + 1);
  g_autofree guint64 *bytes = g_new0(guint64, n + 1);

  for (guint i = 0; i < n; i++) {
    JsonObject *t = json_array_get_object_element(tensors, i);
    JsonArray *shape = json_object_get_array_member(t, "shape");
    guint64 dims[WSYNC_MAX_DIMS];
    guint ndim = MIN(json_array_get_length(shape), WSYNC_MAX_DIMS);
    for (guint d = 0; d < ndim; d++)
      dims[d] = (guint64)json_array_get_int_element(shape, d);
    g_ptr_array_add(names, wsync_printable(json_object_get_string_member(t, "name")));
    g_ptr_array_add(shapes, wsync_shape_format(ndim, dims));
    wsync_dtype_from_name(json_object_get_string_member(t, "dtype"), &dtypes[i]);
    bytes[i] = (guint64)json_object_get_int_member(t, "bytes");
    chunks += json_object_get_int_member(t, "chunks");
  }
  print_table(n, (const char *const *)names->pdata, dtypes, (const char *const *)shapes->pdata,
              bytes);
  printf("%u tensor%s, %" G_GINT64_FORMAT " bytes in %" G_GINT64_FORMAT " chunk%s (%s)\n", n,
         n == 1 ? "" : "s", json_object_get_int_member(root, "total_bytes"), chunks,
         chunks == 1 ? "" : "s",
         strcmp(json_object_get_string_member(root, "format"), "dcp") == 0
             ? "PyTorch DCP, .metadata and __R_K.distcp files"
             : "PyTorch DCP in Hugging Face mode, shard-S-model-I-of-N.safetensors files");
  if (json_array_get_length(skipped) > 0) {
    GString *line = g_string_new("not tensors, skipped: ");
    for (guint i = 0; i < json_array_get_length(skipped); i++)
      g_string_append_printf(line, "%s%s", i ? ", " : "",
                             json_array_get_string_element(skipped, i));
    g_autofree char *safe = wsync_printable(line->str);
    printf("%s\n", safe);
    g_string_free(line, TRUE);
  }
  if (!json_object_get_null_member(root, "wrapper")) {
    g_autofree char *key = wsync_printable(json_object_get_string_member(root, "wrapper"));
    printf("names without the key %s, under which the state dict was saved\n", key);
  }
  gint64 dropped = json_object_get_int_member(root, "dropped");
  if (dropped > 0)
    printf("left out by --select: %" G_GINT64_FORMAT " entr%s\n", dropped,
           dropped == 1 ? "y" : "ies");
  if (!json_object_get_null_member(root, "refusal")) {
    g_autofree char *why = wsync_printable(json_object_get_string_member(root, "refusal"));
    printf("note: merge, convert, plan and sync refuse these names: %s\n", why);
  }
}

static void
print_text(WsyncCheckpoint *ck)
{
  guint n = wsync_checkpoint_n_tensors(ck);
  g_autoptr(GPtrArray) shapes = g_ptr_array_new_with_free_func(g_free);
  g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
  g_autofree WsyncDtype *dtypes = g_new0(WsyncDtype, n + 1);
  g_autofree guint64 *bytes = g_new0(guint64, n + 1);

  for (guint i = 0; i < n; i++) {
    const WsyncTensor *t = wsync_checkpoint_tensor(ck, i);
    g_ptr_array_add(shapes, wsync_shape_format(t->ndim, t->shape));
    g_ptr_array_add(names, wsync_printable(t->name)); /* one line per tensor, whatever its name */
    dtypes[i] = t->dtype;
    bytes[i] = t->nbytes;
  }
  print_table(n, (const char *const *)names->pdata, dtypes, (const char *const *)shapes->pdata,
              bytes);
  printf("%u tensor%s, %" G_GUINT64_FORMAT " bytes in %u file%s\n", n, n == 1 ? "" : "s",
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
  g_autofree char *select = NULL;
  GOptionEntry entries[] = {
      {"select", 0, 0, G_OPTION_ARG_STRING, &select,
       "A sharded checkpoint (DCP): list only the tensors directly under KEY, as merge "
       "--select takes them",
       "KEY"},
      {NULL}};

  if (!cli_parse(cli, cmd, entries, &argc, &argv))
    return WSYNC_EXIT_USAGE;
  if (argc != 2)
    return cli_usage_error(cmd, argc < 2 ? "missing PATH" : "expected one PATH");
  /* inspect needs no plugin, but a broken configuration is still an error. */
  if ((ctx = cli_context(cli, &error)) == NULL)
    return cli_fail(error);
  if (wsync_sharded_checkpoint_detect(argv[1])) {
    g_autoptr(JsonNode) root = wsync_sharded_checkpoint_to_json(argv[1], select, &error);
    if (root == NULL)
      return cli_fail(error);
    if (cli->json)
      cli_print_json(root);
    else
      print_sharded_text(json_node_get_object(root));
    return WSYNC_EXIT_OK;
  }
  if (select != NULL)
    return cli_usage_error(cmd, "--select applies to a sharded training checkpoint (PyTorch "
                                "DCP), and %s is none", argv[1]);
  ck = wsync_context_open_checkpoint(ctx, argv[1], &error);
  if (ck == NULL)
    return cli_fail(error);
  if (cli->json)
    print_json(ck);
  else
    print_text(ck);
  return WSYNC_EXIT_OK;
}
