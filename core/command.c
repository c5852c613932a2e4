/* wsync: what the command does around the library's calls (include/wsync/command.h),
 * shared by the `wsync` command and the Python module. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <string.h>

#include <wsync/command.h>
#include <wsync/error.h>

#include "context-private.h"
#include "dcp.h"
#include "plan-private.h"

/* A plugin directory the caller named that opendir(3) fails on, as the listing of its
 * plugins would: not there, not a directory, or not readable (no read or search
 * permission).  A configuration error, worded as a bad configuration directory's
 * (context.c list_conf_dir()).  Skipped without a word, a mistyped or unreadable one let
 * the plugins of the next directories load: the installed ones in place of a build's.
 * (A stat() alone let an unreadable directory pass.)  Only the caller's are checked:
 * $WSYNC_PLUGIN_PATH's and the installed one may be absent (an uninstalled build).  An
 * empty entry (an unset "$DIR") is skipped, as wsync_context_new() skips it. */
static gboolean
check_plugin_dirs(const char *const *dirs, GError **error)
{
  for (guint i = 0; dirs != NULL && dirs[i] != NULL; i++) {
    if (dirs[i][0] == '\0')
      continue;
    DIR *dir = opendir(dirs[i]); /* O_DIRECTORY: a FIFO or a device is not opened */
    if (dir == NULL) {
      int errsv = errno;
      g_autofree char *pdir = wsync_printable(dirs[i]);
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_CONFIG, "%s: cannot read plugin directory: %s",
                  pdir, g_strerror(errsv));
      return FALSE;
    }
    closedir(dir);
  }
  return TRUE;
}

WsyncContext *
wsync_context_new_default(const char *const *conf_dirs, const char *const *plugin_dirs,
                          const char *overrides, GError **error)
{
  const char *installed_conf[] = {WSYNC_CONF_DIR, NULL};
  g_autoptr(GStrvBuilder) search = g_strv_builder_new();
  g_auto(GStrv) path = NULL;
  const char *env = g_getenv("WSYNC_PLUGIN_PATH");

  if (!check_plugin_dirs(plugin_dirs, error))
    return NULL;
  /* The installed default may not exist (an uninstalled build): then there is none. */
  if (conf_dirs == NULL && g_file_test(WSYNC_CONF_DIR, G_FILE_TEST_IS_DIR))
    conf_dirs = installed_conf;
  if (plugin_dirs != NULL)
    g_strv_builder_addv(search, (const char **)plugin_dirs);
  if (env != NULL && env[0] != '\0') {
    g_auto(GStrv) parts = g_strsplit(env, ":", -1);
    g_strv_builder_addv(search, (const char **)parts);
  }
  g_strv_builder_add(search, WSYNC_PLUGIN_DIR);
  path = g_strv_builder_end(search);
  return wsync_context_new(conf_dirs, (const char *const *)path, overrides, error);
}

const char *
wsync_context_resolve_sync_option(WsyncContext *ctx, const char *given, const char *key,
                                  const char *fallback)
{
  const char *conf;

  if (given != NULL)
    return given;
  conf = wsync_context_get_sync_option(ctx, key);
  return conf != NULL ? conf : fallback;
}

gboolean
wsync_parse_count(const char *what, const char *text, guint64 min, guint64 max, guint64 *out,
                  GError **error)
{
  if (!g_ascii_string_to_unsigned(text, 10, min, max, out, NULL)) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                "%s must be a number from %" G_GUINT64_FORMAT " to %" G_GUINT64_FORMAT
                ", not \"%s\"",
                what, min, max, text);
    return FALSE;
  }
  return TRUE;
}

gboolean
wsync_parse_size(const char *what, const char *text, guint64 *out, GError **error)
{
  g_autofree char *digits = g_strdup(text);
  gsize len = strlen(digits);
  guint shift = 0;

  if (len > 0) {
    const char *units = "KMGT";
    const char *u = strchr(units, g_ascii_toupper(digits[len - 1]));
    if (u != NULL && digits[len - 1] != '\0') {
      shift = 10 * (guint)(u - units + 1);
      digits[len - 1] = '\0';
    }
  }
  /* the whole text in the message, and what a size may be: the count's own bounds
   * (2^64 >> shift) would name neither the suffix nor what was typed */
  if (!g_ascii_string_to_unsigned(digits, 10, 1, G_MAXUINT64 >> shift, out, NULL)) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                "%s must be a size from 1 byte to 2^64-1 bytes: a number, optionally followed "
                "by K, M, G or T (powers of 1024), not \"%s\"",
                what, text);
    return FALSE;
  }
  *out <<= shift;
  return TRUE;
}

/* A layout option resolved (see wsync_context_resolve_sync_option()) and read as a
 * number from @min to @max. */
static gboolean
resolve_count(WsyncContext *ctx, const char *given, const char *key, const char *fallback,
              guint64 min, guint64 max, guint64 *out, GError **error)
{
  g_autofree char *what = g_strconcat("--", key, NULL);

  return wsync_parse_count(what, wsync_context_resolve_sync_option(ctx, given, key, fallback),
                           min, max, out, error);
}

/* A target conf.d names (no --target) that no plugin provides: refused naming FILE:LINE
 * where it is set, which the refusal of the plan ("no loaded plugin provides the target")
 * would not. */
static gboolean
configured_target_exists(WsyncContext *ctx, const WsyncPlanArgs *args, const char *target,
                         GError **error)
{
  const char *origin = wsync_context_sync_option_origin(ctx, "target");
  if (args->target != NULL || origin == NULL)
    return TRUE;
  g_autoptr(GPtrArray) converters = wsync_registry_lookup(wsync_context_get_registry(ctx),
                                                          WSYNC_ENTRY_CONVERTER, target);
  if (converters->len > 0 && wsync_entry_get_target(converters->pdata[0]) != NULL)
    return TRUE;
  g_autofree char *ptarget = wsync_printable(target);
  return wsync_fail(error, WSYNC_ERROR_USAGE,
                    "%s: sync target \"%s\": no loaded plugin provides it (wsync plugins lists "
                    "the targets; --target overrides it)",
                    origin, ptarget);
}

/* A --tp or --ep above 1 given to a target of one rank (no world function: plugin "hf"'s)
 * would be dropped without a word, and one checkpoint written where ranks were asked
 * for: refused as --format is for a target without formats (resolve.c choose_format).
 * conf.d's sync section may hold a deployment's sizes for every target: those apply to
 * the targets that have ranks.  An unknown target is refused later, naming it. */
static gboolean
parallel_sizes_apply(WsyncContext *ctx, const char *target, const WsyncPlanArgs *args,
                     guint64 tp, guint64 ep, GError **error)
{
  g_autoptr(GPtrArray) converters = wsync_registry_lookup(wsync_context_get_registry(ctx),
                                                          WSYNC_ENTRY_CONVERTER, target);
  const WsyncTargetInfo *info =
      converters->len > 0 ? wsync_entry_get_target(converters->pdata[0]) : NULL;

  if (info == NULL || info->world != NULL)
    return TRUE;
  gboolean tp_given = args->tp != NULL && tp > 1, ep_given = args->ep != NULL && ep > 1;
  if (!tp_given && !ep_given)
    return TRUE;
  g_autofree char *ptarget = wsync_printable(target);
  return wsync_fail(error, WSYNC_ERROR_USAGE,
                    "--%s %" G_GUINT64_FORMAT ": target %s has no ranks to split into (it "
                    "writes one checkpoint, whole)",
                    tp_given ? "tp" : "ep", tp_given ? tp : ep, ptarget);
}

gboolean
wsync_plan_args_resolve(WsyncContext *ctx, const WsyncPlanArgs *args, WsyncPlanOptions *opts,
                        GError **error)
{
  guint64 tp, ep, threads, rank = 0;
  const char *rank_text = wsync_context_resolve_sync_option(ctx, args->rank, "rank", NULL);
  const char *part_size =
      wsync_context_resolve_sync_option(ctx, args->part_size, "part-size", "5G");
  g_autofree char *cores = g_strdup_printf("%u", g_get_num_processors());

  memset(opts, 0, sizeof *opts);
  opts->target = wsync_context_resolve_sync_option(ctx, args->target, "target", NULL);
  if (opts->target == NULL)
    return wsync_fail(error, WSYNC_ERROR_USAGE,
                      "no --target given (and no sync { target = ... } in conf.d)");
  if (!configured_target_exists(ctx, args, opts->target, error))
    return FALSE;
  opts->format = wsync_context_resolve_sync_option(ctx, args->format, "format", NULL);
  opts->format_explicit = args->format != NULL;
  if (!resolve_count(ctx, args->tp, "tp", "1", 1, WSYNC_MAX_TP, &tp, error) ||
      !resolve_count(ctx, args->ep, "ep", "1", 1, WSYNC_MAX_EP, &ep, error) ||
      !resolve_count(ctx, args->threads, "threads", cores, 1, WSYNC_MAX_THREADS, &threads,
                     error) ||
      !wsync_parse_size("--part-size", part_size, &opts->part_size, error))
    return FALSE;
  if (rank_text != NULL && !wsync_parse_count("--rank", rank_text, 0, WSYNC_MAX_RANK, &rank, error))
    return FALSE;
  if (!parallel_sizes_apply(ctx, opts->target, args, tp, ep, error))
    return FALSE;
  opts->tp = (guint)tp;
  opts->ep = (guint)ep;
  opts->threads = (guint)threads;
  opts->rank = rank_text != NULL ? (gint)rank : -1;
  return TRUE;
}

/* Opens a tensor's object of `inspect --json` and fills the members every source has:
 * name, dtype, shape and bytes (the caller adds its own and ends the object). */
static void
begin_tensor_json(JsonBuilder *b, const char *name, WsyncDtype dtype, guint ndim,
                  const guint64 *shape, guint64 nbytes)
{
  json_builder_begin_object(b);
  json_builder_set_member_name(b, "name");
  json_builder_add_string_value(b, name);
  json_builder_set_member_name(b, "dtype");
  json_builder_add_string_value(b, wsync_dtype_name(dtype));
  json_builder_set_member_name(b, "shape");
  json_builder_begin_array(b);
  for (guint d = 0; d < ndim; d++)
    json_builder_add_int_value(b, (gint64)shape[d]);
  json_builder_end_array(b);
  json_builder_set_member_name(b, "bytes");
  json_builder_add_int_value(b, (gint64)nbytes);
}

JsonNode *
wsync_checkpoint_to_json(WsyncCheckpoint *ck)
{
  g_autoptr(JsonBuilder) b = json_builder_new();
  guint n = wsync_checkpoint_n_tensors(ck);

  json_builder_begin_object(b);
  json_builder_set_member_name(b, "path");
  json_builder_add_string_value(b, wsync_checkpoint_path(ck));
  json_builder_set_member_name(b, "files");
  json_builder_begin_array(b);
  for (guint f = 0; f < wsync_checkpoint_n_files(ck); f++)
    json_builder_add_string_value(b, wsync_safetensors_path(wsync_checkpoint_file(ck, f)));
  json_builder_end_array(b);
  json_builder_set_member_name(b, "metadata");
  json_builder_begin_object(b);
  for (guint f = 0; f < wsync_checkpoint_n_files(ck); f++) {
    const WsyncSafetensors *st = wsync_checkpoint_file(ck, f);
    GHashTable *metadata = wsync_safetensors_metadata(st);
    g_autoptr(GList) keys = g_list_sort(g_hash_table_get_keys(metadata), (GCompareFunc)strcmp);
    json_builder_set_member_name(b, wsync_safetensors_path(st));
    json_builder_begin_object(b);
    for (GList *k = keys; k != NULL; k = k->next) {
      json_builder_set_member_name(b, k->data);
      json_builder_add_string_value(b, g_hash_table_lookup(metadata, k->data));
    }
    json_builder_end_object(b);
  }
  json_builder_end_object(b);
  json_builder_set_member_name(b, "tensors");
  json_builder_begin_array(b);
  for (guint i = 0; i < n; i++) {
    const WsyncTensor *t = wsync_checkpoint_tensor(ck, i);
    begin_tensor_json(b, t->name, t->dtype, t->ndim, t->shape, t->nbytes);
    json_builder_set_member_name(b, "file");
    json_builder_add_string_value(b, t->file);
    json_builder_end_object(b);
  }
  json_builder_end_array(b);
  json_builder_set_member_name(b, "total_tensors");
  json_builder_add_int_value(b, n);
  json_builder_set_member_name(b, "total_bytes");
  json_builder_add_int_value(b, (gint64)wsync_checkpoint_total_bytes(ck));
  json_builder_end_object(b);
  return json_builder_get_root(b);
}

gboolean
wsync_sharded_checkpoint_detect(const char *path)
{
  g_return_val_if_fail(path != NULL, FALSE);
  return wsync_dcp_detect(path);
}

static guint64
dcp_tensor_bytes(const WsyncDcpTensor *t)
{
  guint64 n = wsync_dtype_size(t->dtype); /* no overflow: checked when opened */
  for (guint d = 0; d < t->ndim; d++)
    n *= t->shape[d];
  return n;
}

static void
add_string_or_null(JsonBuilder *b, const char *member, const char *value)
{
  json_builder_set_member_name(b, member);
  if (value != NULL)
    json_builder_add_string_value(b, value);
  else
    json_builder_add_null_value(b);
}

JsonNode *
wsync_sharded_checkpoint_to_json(const char *path, const char *select, GError **error)
{
  g_return_val_if_fail(path != NULL, NULL);
  /* every entry listed, even of a save merge refuses without --select (with the reason) */
  WsyncDcpOpenOptions opts = {.select = select, .list_all = TRUE};
  g_autoptr(WsyncDcp) dcp = wsync_dcp_open_with(path, &opts, error);
  if (dcp == NULL) {
    wsync_error_make_printable(*error);
    return NULL;
  }
  g_autoptr(JsonBuilder) b = json_builder_new();
  guint n = wsync_dcp_n_tensors(dcp);
  guint64 total = 0;

  json_builder_begin_object(b);
  json_builder_set_member_name(b, "path");
  json_builder_add_string_value(b, path);
  json_builder_set_member_name(b, "format");
  json_builder_add_string_value(b, wsync_dcp_format(dcp) == WSYNC_DCP_FORMAT_TORCH_SAVE
                                       ? "dcp"
                                       : "dcp-hf-safetensors");
  json_builder_set_member_name(b, "tensors");
  json_builder_begin_array(b);
  for (guint i = 0; i < n; i++) {
    const WsyncDcpTensor *t = wsync_dcp_tensor(dcp, i);
    begin_tensor_json(b, t->name, t->dtype, t->ndim, t->shape, dcp_tensor_bytes(t));
    json_builder_set_member_name(b, "chunks");
    json_builder_add_int_value(b, t->chunks->len);
    json_builder_end_object(b);
    total += dcp_tensor_bytes(t);
  }
  json_builder_end_array(b);
  json_builder_set_member_name(b, "skipped");
  json_builder_begin_array(b);
  for (guint i = 0; i < wsync_dcp_n_skipped(dcp); i++)
    json_builder_add_string_value(b, wsync_dcp_skipped(dcp, i));
  json_builder_end_array(b);
  add_string_or_null(b, "wrapper", wsync_dcp_wrapper(dcp));
  json_builder_set_member_name(b, "dropped");
  json_builder_add_int_value(b, wsync_dcp_n_dropped(dcp));
  add_string_or_null(b, "refusal", wsync_dcp_refusal(dcp));
  json_builder_set_member_name(b, "total_tensors");
  json_builder_add_int_value(b, n);
  json_builder_set_member_name(b, "total_bytes");
  json_builder_add_int_value(b, (gint64)total);
  json_builder_end_object(b);
  return json_builder_get_root(b);
}

gboolean
wsync_context_recognise_file(WsyncContext *ctx, const char *file_name, GHashTable *metadata,
                             const char **target, WsyncRankFile *out, GError **error)
{
  g_autoptr(GPtrArray) claimants = plan_claimants(ctx);
  const PlanTarget *which = NULL;

  if (!plan_recognise(claimants, file_name, metadata, out, &which, error) || which == NULL)
    return FALSE;
  if (target != NULL)
    *target = which->info->name;
  return TRUE;
}
