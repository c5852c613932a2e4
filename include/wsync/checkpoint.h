/* wsync: a checkpoint directory (or a single file) opened as one set of tensors. */
#ifndef WSYNC_CHECKPOINT_H
#define WSYNC_CHECKPOINT_H

#include <glib.h>
#include <wsync/api.h>
#include <wsync/safetensors.h>

G_BEGIN_DECLS

/** The index file name of a sharded Hugging Face checkpoint. */
#define WSYNC_INDEX_NAME "model.safetensors.index.json"

/**
 * WsyncCheckpoint:
 *
 * Every tensor of a checkpoint, however many files it is split into.
 *
 * - A path to a file: that one safetensors file.
 * - A directory with `model.safetensors.index.json`: the shards named by its
 *   `weight_map`, and only those.  Every shard name must stay inside the directory
 *   (no absolute path, no `..`, no symlink that leads out); every tensor the index
 *   names must be in the shard it names, and every tensor of a shard must be named.
 * - A directory without an index: every `*.safetensors` file in it, in sorted order.
 *   A name found in two files is an error, except in files of different groups (see
 *   wsync_checkpoint_open_grouped(): the rank files of an engine hold replicas under
 *   the same names; then the tensor list has the name once per group, and lookups
 *   return the first file's).
 */
typedef struct _WsyncCheckpoint WsyncCheckpoint;

/**
 * wsync_checkpoint_open:
 * @path: a safetensors file or a checkpoint directory
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT or #WSYNC_ERROR_IO error
 *
 * Opens and validates every file of the checkpoint (headers only: no tensor data is
 * read).  Errors name the file and the tensor.
 *
 * Returns: (transfer full) (nullable): the checkpoint, or %NULL with @error set.
 */
WSYNC_API WsyncCheckpoint *wsync_checkpoint_open(const char *path, GError **error);

/**
 * WsyncFileGroupFunc:
 * @file: one file of the checkpoint
 * @group: (out): the file's group (e.g. the rank whose files repeat the names of other
 *   ranks), or -1 for none
 * @user_data: the data given to wsync_checkpoint_open_grouped()
 * @error: return location for an error
 *
 * Returns: %TRUE on success; %FALSE with @error set stops the opening.
 */
typedef gboolean (*WsyncFileGroupFunc)(const WsyncSafetensors *file, gint64 *group,
                                       gpointer user_data, GError **error);

/**
 * wsync_checkpoint_open_grouped:
 * @path: a safetensors file or a checkpoint directory
 * @group: (nullable): puts each file in a group; a tensor name must be unique within
 *   a group (files of group -1 form one group)
 * @user_data: passed to @group
 * @error: return location for an error
 *
 * wsync_checkpoint_open() for files that may repeat each other's names by group.
 *
 * Returns: (transfer full) (nullable): the checkpoint, or %NULL with @error set.
 */
WSYNC_API WsyncCheckpoint *wsync_checkpoint_open_grouped(const char *path, WsyncFileGroupFunc group,
                                               gpointer user_data, GError **error);

/** wsync_checkpoint_free: @ck: (nullable): frees a checkpoint and unmaps its files. */
WSYNC_API void wsync_checkpoint_free(WsyncCheckpoint *ck);

/** wsync_checkpoint_path: Returns: the path the checkpoint was opened with. */
WSYNC_API const char *wsync_checkpoint_path(const WsyncCheckpoint *ck);

/** wsync_checkpoint_is_dir: Returns: %TRUE when the checkpoint was opened from a directory. */
WSYNC_API gboolean wsync_checkpoint_is_dir(const WsyncCheckpoint *ck);

/** wsync_checkpoint_n_tensors: Returns: the number of tensors in all files. */
WSYNC_API guint wsync_checkpoint_n_tensors(const WsyncCheckpoint *ck);

/**
 * wsync_checkpoint_tensor:
 * @ck: a checkpoint
 * @index: 0 <= @index < wsync_checkpoint_n_tensors()
 *
 * Tensors are numbered by name, in strcmp() order, whatever file holds them (equal
 * names of different ranks in file order).
 *
 * Returns: (transfer none): the tensor.
 */
WSYNC_API const WsyncTensor *wsync_checkpoint_tensor(const WsyncCheckpoint *ck, guint index);

/**
 * wsync_checkpoint_lookup:
 * @ck: a checkpoint
 * @name: a tensor name
 *
 * Returns: (transfer none) (nullable): the tensor, or %NULL when there is none.
 */
WSYNC_API const WsyncTensor *wsync_checkpoint_lookup(const WsyncCheckpoint *ck, const char *name);

/** wsync_checkpoint_n_files: Returns: how many safetensors files the checkpoint has. */
WSYNC_API guint wsync_checkpoint_n_files(const WsyncCheckpoint *ck);

/**
 * wsync_checkpoint_file:
 * @ck: a checkpoint
 * @index: 0 <= @index < wsync_checkpoint_n_files(), in sorted path order
 *
 * Returns: (transfer none): one of its files.
 */
WSYNC_API const WsyncSafetensors *wsync_checkpoint_file(const WsyncCheckpoint *ck, guint index);

/**
 * wsync_checkpoint_total_bytes:
 * @ck: a checkpoint
 *
 * Returns: the sum of the tensors' byte sizes (what an index calls `total_size`).
 */
WSYNC_API guint64 wsync_checkpoint_total_bytes(const WsyncCheckpoint *ck);

/**
 * wsync_index_write:
 * @path: the index file to write
 * @total_size: the sum of the tensors' sizes
 * @weight_map: (element-type utf8 utf8): tensor name to shard file name
 * @error: return location for a #WSYNC_ERROR_IO error
 *
 * Writes `{"metadata": {"total_size": N}, "weight_map": {...}}` with the names sorted,
 * indented by 2, ending in a newline, as Transformers writes it.
 *
 * Returns: %TRUE on success.
 */
WSYNC_API gboolean wsync_index_write(const char *path, guint64 total_size, GHashTable *weight_map,
                           GError **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(WsyncCheckpoint, wsync_checkpoint_free)

/**
 * wsync_run_guarded:
 * @fn: a function that reads or writes tensor data through memory maps
 * @data: its argument
 * @fault_address: (out): where the fault was, when this returns %FALSE
 *
 * Tensor data (#WsyncTensor.data) lives in memory maps of the files.  This runs
 * @fn(@data) so that a SIGBUS it raises, by touching a page that a file no longer has
 * (another process truncated it under the map), ends @fn instead of the process.  Per
 * thread, so worker threads use it side by side; a SIGBUS outside any guarded call goes
 * to the handler there was before.  The SIGBUS handler is installed only while guarded
 * calls are under way: when the last one returns, the handler there was before is back
 * (a host program's own, such as Python's faulthandler).  @fn must only read and write
 * memory (no locks, no allocation): it may stop anywhere.  @fn may make guarded calls
 * of its own: a fault in one ends that one only, and the rest of @fn stays guarded.
 *
 * Returns: %TRUE when @fn returned, %FALSE when a fault ended it.
 */
WSYNC_API gboolean wsync_run_guarded(void (*fn)(gpointer data), gpointer data,
                                     const void **fault_address);

G_END_DECLS

#endif /* WSYNC_CHECKPOINT_H */
