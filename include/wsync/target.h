/* wsync: targets, the layouts a plugin knows how to write and to read back.
 *
 * A target is a descriptor that a plugin registers with wsync_plugin_add_target(): its
 * name ("vllm"), the formats it writes ("sharded-state", "kernel"), the function that
 * builds the layout of one rank, how its files are named, and how it recognises its own
 * files when they are read back.  The core knows no target by name: `convert --target T`
 * looks T up in the dispatch table, and an input directory is read with the layout of
 * the target that claims its files (the Hugging Face layout when none does).
 *
 * The same build function describes a rank for writing and for reading
 * (wsync_layout_is_reading()), so every target reads back what it writes.
 */
#ifndef WSYNC_TARGET_H
#define WSYNC_TARGET_H

#include <glib.h>
#include <wsync/api.h>
#include <wsync/plugin.h>

G_BEGIN_DECLS

/**
 * WsyncBuildFunc:
 * @layout: the layout of one rank to fill (its target, format, tp, ep, rank; the model)
 * @user_data: the data given at registration
 * @error: return location for an error
 *
 * A target's build function (a layout converter): lays out one rank from the model's
 * params, for writing or for reading (wsync_layout_is_reading()).
 *
 * Returns: %TRUE on success.
 */
typedef gboolean (*WsyncBuildFunc)(WsyncLayout *layout, gpointer user_data, GError **error);

/**
 * WsyncRankFile:
 * @format: (not nullable): the format the file is in, one of the target's @formats
 *   (a static string of the plugin)
 * @tp: the tensor-parallel size of the layout the file belongs to
 * @ep: the expert-parallel size (1 when experts are not spread over ranks)
 * @rank: the rank whose layout the file holds (part of), 0 <= @rank < world size
 *
 * What a target recognised in one of its files.
 */
typedef struct {
  const char *format;
  guint tp;
  guint ep;
  guint rank;
} WsyncRankFile;

/**
 * WsyncRecogniseFunc:
 * @file_name: the file's base name
 * @metadata: (element-type utf8 utf8): the file's `__metadata__`
 * @out: (out caller-allocates): what the file is, when the target claims it
 * @user_data: the data given at registration
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT error
 *
 * Decides whether a safetensors file was written by this target (libvips' loaders
 * recognise their own files the same way).
 *
 * Returns: %TRUE when the target claims the file (@out filled); %FALSE with @error unset
 *   when the file is not the target's; %FALSE with @error set when the target claims the
 *   file but its metadata is broken.
 */
typedef gboolean (*WsyncRecogniseFunc)(const char *file_name, GHashTable *metadata,
                                       WsyncRankFile *out, gpointer user_data, GError **error);

/**
 * WsyncFileNameFunc:
 * @layout: a rank's finished layout
 * @part: 0-based number of the file among the rank's files
 * @n_parts: how many files the rank has
 * @user_data: the data given at registration
 *
 * Returns: (transfer full): the base name of the file, e.g.
 *   `model-rank-0-part-0.safetensors`.
 */
typedef char *(*WsyncFileNameFunc)(WsyncLayout *layout, guint part, guint n_parts,
                                   gpointer user_data);

/**
 * WsyncWorldFunc:
 * @tp: the tensor-parallel size asked for (at least 1)
 * @ep: the expert-parallel size asked for (at least 1)
 * @user_data: the data given at registration
 *
 * Returns: the number of ranks a layout of this target has for @tp and @ep; each rank
 *   is built separately.
 */
typedef guint (*WsyncWorldFunc)(guint tp, guint ep, gpointer user_data);

/**
 * WsyncTargetInfo:
 * @name: the target's name, as in `--target NAME`
 * @description: one line saying what DST holds
 * @help: (nullable): more lines for `wsync convert --help` (each format, what reads it,
 *   the options that change the files), indented by two spaces
 * @formats: (nullable) (array zero-terminated=1): the formats the target writes, the
 *   default first; %NULL when it has a single, unnamed format (then `--format` is
 *   refused)
 * @build: builds the layout of one rank
 * @world: (nullable): the number of ranks for a tp and ep; %NULL: one rank, and
 *   `--tp` / `--ep` do not apply (one above 1 given is refused; conf.d's sync section's
 *   are ignored)
 * @file_name: names the files of a rank
 * @recognise: (nullable): claims the target's files when they are read back; %NULL
 *   when its files are never read back
 * @writes_index: write `model.safetensors.index.json` (the Hugging Face index of every
 *   tensor's file) beside the files
 * @reads_unclaimed: this target reads input files that no target claims (the Hugging
 *   Face layout); the highest-priority such target is used
 * @reserved: room for growth without an ABI change; must be zero
 *
 * A target's descriptor.  wsync_plugin_add_target() copies the structure; the strings
 * and arrays it points to must live as long as the plugin is loaded (static data).
 */
typedef struct {
  const char *name;
  const char *description;
  const char *help;
  const char *const *formats;
  WsyncBuildFunc build;
  WsyncWorldFunc world;
  WsyncFileNameFunc file_name;
  WsyncRecogniseFunc recognise;
  gboolean writes_index;
  gboolean reads_unclaimed;
  gpointer reserved[8];
} WsyncTargetInfo;

/**
 * wsync_plugin_add_target:
 * @plugin: the plugin being registered
 * @info: the target's descriptor (copied)
 * @priority: when two plugins provide the same target name, the higher wins
 * @user_data: (transfer full) (nullable): passed to every callback of @info
 * @destroy: (nullable): frees @user_data
 * @error: return location for a #WSYNC_ERROR_PLUGIN error
 *
 * Registers a target (a dispatch-table entry of kind %WSYNC_ENTRY_CONVERTER named and
 * serving @info->name).  Ownership of @user_data passes to the core at the call, even
 * when it fails.
 *
 * Returns: %TRUE when the target was added.
 */
WSYNC_API gboolean wsync_plugin_add_target(WsyncPlugin *plugin, const WsyncTargetInfo *info, int priority,
                                 gpointer user_data, GDestroyNotify destroy, GError **error);

/**
 * wsync_layout_get_format:
 * @layout: a layout being built
 *
 * Returns: (transfer none) (nullable): the format being built (writing: the one asked
 *   for, or the target's default; reading: the one the input files are in), %NULL for
 *   a target without named formats.
 */
WSYNC_API const char *wsync_layout_get_format(WsyncLayout *layout);

/**
 * wsync_layout_is_reading:
 * @layout: a layout being built
 *
 * Returns: %TRUE when the layout describes input files being read, %FALSE when it
 *   describes files to be written.
 */
WSYNC_API gboolean wsync_layout_is_reading(WsyncLayout *layout);

/**
 * wsync_layout_get_world:
 * @layout: a layout being built
 *
 * Returns: the number of ranks of the layout (the target's #WsyncWorldFunc).
 */
WSYNC_API guint wsync_layout_get_world(WsyncLayout *layout);

G_END_DECLS

#endif /* WSYNC_TARGET_H */
