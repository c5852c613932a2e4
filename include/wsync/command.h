/* wsync: what the `wsync` command does around the library's calls, for other front ends.
 *
 * The command finds its configuration and plugins in the installed directories, fills
 * unset options from the `sync { }` section of conf.d, checks their values, and prints
 * what it read as JSON.  A front end that offers the same commands (the Python module
 * `wsync`) calls these functions, so that it behaves, and words its errors, exactly as
 * the command line does.
 */
#ifndef WSYNC_COMMAND_H
#define WSYNC_COMMAND_H

#include <glib.h>
#include <json-glib/json-glib.h>
#include <wsync/api.h>
#include <wsync/checkpoint.h>
#include <wsync/plan.h>
#include <wsync/registry.h>
#include <wsync/target.h>

G_BEGIN_DECLS

/**
 * wsync_context_new_default:
 * @conf_dirs: (nullable) (array zero-terminated=1): configuration directories, or %NULL
 *   for the installed `$(sysconfdir)/wsync/conf.d` (none when it does not exist, as in an
 *   uninstalled build)
 * @plugin_dirs: (nullable) (array zero-terminated=1): where to look for plugins first
 * @overrides: (nullable): configuration text read after every file, as for
 *   wsync_context_new()
 * @error: return location for an error
 *
 * wsync_context_new() with the command's defaults: @plugin_dirs are searched first, then
 * the colon-separated directories of `$WSYNC_PLUGIN_PATH`, then the installed
 * `$(pkglibdir)/plugins`.
 *
 * An entry of @plugin_dirs that is missing or not a directory is a %WSYNC_ERROR_CONFIG
 * error, "DIR: cannot read plugin directory: REASON", as a bad entry of @conf_dirs is
 * ("DIR: cannot read configuration directory: REASON"); an empty entry is skipped.  The
 * directories of `$WSYNC_PLUGIN_PATH` and the installed one may be missing: they are
 * skipped.
 *
 * Returns: (transfer full) (nullable): the context, or %NULL with @error set.
 */
WSYNC_API WsyncContext *wsync_context_new_default(const char *const *conf_dirs,
                                                  const char *const *plugin_dirs,
                                                  const char *overrides, GError **error);

/**
 * WsyncPlanArgs:
 * @target: (nullable): `--target`
 * @format: (nullable): `--format`
 * @tp: (nullable): `--tp`, as text
 * @ep: (nullable): `--ep`, as text
 * @rank: (nullable): `--rank`, as text
 * @threads: (nullable): `--threads`, as text
 * @part_size: (nullable): `--part-size`, as text ("5G", "512M", a number of bytes)
 * @reserved: room for growth; zero
 *
 * The layout options of `wsync plan` and `wsync convert` as the user gave them; %NULL
 * means not given.  Zero-initialise it and set what was given.
 */
typedef struct {
  const char *target;
  const char *format;
  const char *tp;
  const char *ep;
  const char *rank;
  const char *threads;
  const char *part_size;
  gpointer reserved[4];
} WsyncPlanArgs;

/**
 * wsync_context_resolve_sync_option:
 * @ctx: the context
 * @given: (nullable): the value the user gave (a command-line option), or %NULL
 * @key: the option's key in the `sync { }` section of conf.d ("tp", "part-size")
 * @fallback: (nullable): the default
 *
 * The command's rule for every layout option: a given value wins over the `sync { }`
 * section of conf.d, which wins over the default.
 *
 * Returns: (transfer none) (nullable): @given, the configured value or @fallback.
 */
WSYNC_API const char *wsync_context_resolve_sync_option(WsyncContext *ctx, const char *given,
                                                        const char *key, const char *fallback);

/**
 * wsync_parse_count:
 * @what: the option's name, for the error ("--tp")
 * @text: the text the user gave
 * @min: the smallest value accepted
 * @max: the largest value accepted
 * @out: (out): the number
 * @error: return location for a #WSYNC_ERROR_USAGE error ("--tp must be a number from 1
 *   to 4096, not \"0\"")
 *
 * Reads a decimal number of an option, as the command's options are read.
 *
 * Returns: %TRUE when @text is a number from @min to @max.
 */
WSYNC_API gboolean wsync_parse_count(const char *what, const char *text, guint64 min,
                                     guint64 max, guint64 *out, GError **error);

/**
 * wsync_parse_size:
 * @what: the option's name, for the error ("--part-size")
 * @text: "5G", "512M", "1000": bytes, with K, M, G or T meaning powers of 1024
 * @out: (out): the number of bytes
 * @error: return location for a #WSYNC_ERROR_USAGE error naming @what
 *
 * Reads a size option, as the command's `--part-size` and `--bucket-size` are read.
 *
 * Returns: %TRUE when @text is a size from 1 byte that fits in 64 bits.
 */
WSYNC_API gboolean wsync_parse_size(const char *what, const char *text, guint64 *out,
                                    GError **error);

/**
 * wsync_plan_args_resolve:
 * @ctx: the context (its `sync { }` section fills what @args leaves unset)
 * @args: what the user gave
 * @opts: (out caller-allocates): the options to plan with; the strings point into @args
 *   or into @ctx, so they live as long as both
 * @error: return location for a #WSYNC_ERROR_USAGE error naming the option
 *   ("--tp must be a number from 1 to 4096, not \"0\"")
 *
 * Resolves the layout options as the command does: a given option wins over the
 * `sync { }` section of conf.d, which wins over the default (tp 1, ep 1, every rank, one
 * thread per core, parts of 5G).  A target is required (given or configured).
 *
 * Returns: %TRUE on success.
 */
WSYNC_API gboolean wsync_plan_args_resolve(WsyncContext *ctx, const WsyncPlanArgs *args,
                                           WsyncPlanOptions *opts, GError **error);

/**
 * wsync_checkpoint_to_json:
 * @ck: a checkpoint
 *
 * What `wsync inspect --json` prints: `{"path", "files": [...], "metadata": {FILE:
 * {KEY: VALUE...}...}, "tensors": [{"name", "dtype", "shape", "bytes", "file"}...],
 * "total_tensors", "total_bytes"}`: "metadata" has every file's `__metadata__` (an empty
 * object for a file without), keys sorted; the tensors in the order of
 * wsync_checkpoint_tensor(); "total_bytes" is the sum of their "bytes"
 * (wsync_checkpoint_total_bytes(), an index's `total_size`), not the files' size.
 *
 * Returns: (transfer full): the description.
 */
WSYNC_API JsonNode *wsync_checkpoint_to_json(WsyncCheckpoint *ck);

/**
 * wsync_sharded_checkpoint_detect:
 * @path: a path
 *
 * Returns: %TRUE when @path is a directory that holds a sharded training checkpoint
 *   (PyTorch DCP: a `.metadata`, per-rank `__R.metadata` files, or
 *   `shard-S-model-I-of-N.safetensors` files in it or in its `sharded/`), the source
 *   `wsync merge` reads; opens no file.
 */
WSYNC_API gboolean wsync_sharded_checkpoint_detect(const char *path);

/**
 * wsync_sharded_checkpoint_to_json:
 * @path: a sharded training checkpoint (wsync_sharded_checkpoint_detect())
 * @select: (nullable): as `--select KEY` (#WsyncPlanOptions): only the entries directly
 *   under KEY
 * @error: return location for an error
 *
 * What `wsync inspect --json` prints for it, read by the reader `merge` uses (its
 * metadata and headers; no tensor data): `{"path", "format": "dcp" |
 * "dcp-hf-safetensors",
 * "tensors": [{"name", "dtype", "shape" (global), "bytes", "chunks"}...], "skipped":
 * [names of the non-tensor values merge skips], "wrapper": the keys dropped from every
 * name or null, "dropped": entries left out by @select, "refusal": why merge and
 * convert refuse the names without --select (a model beside its optimizer; the entries
 * are then listed under their saved names) or null, "total_tensors", "total_bytes"}`,
 * tensors sorted by name.
 *
 * Returns: (transfer full) (nullable): the description, or %NULL with @error set.
 */
WSYNC_API JsonNode *wsync_sharded_checkpoint_to_json(const char *path, const char *select,
                                                     GError **error);

/**
 * wsync_context_recognise_file:
 * @ctx: a context
 * @file_name: a safetensors file's base name
 * @metadata: (element-type utf8 utf8): its `__metadata__`
 * @target: (out) (optional) (transfer none): the name of the target that claims it
 * @out: (out caller-allocates): what that target recognised (format, tp, ep, rank)
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT error, when a target claims the
 *   file but its metadata is broken
 *
 * Asks the targets of @ctx, in dispatch order, whose file this is, as reading rank files
 * back does (the core knows no target's file names).
 *
 * Returns: %TRUE when a target claims the file; %FALSE with @error unset when none does.
 */
WSYNC_API gboolean wsync_context_recognise_file(WsyncContext *ctx, const char *file_name,
                                                GHashTable *metadata, const char **target,
                                                WsyncRankFile *out, GError **error);

G_END_DECLS

#endif /* WSYNC_COMMAND_H */
