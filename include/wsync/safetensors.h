/* wsync: safetensors files and checkpoint directories.
 *
 * The reader memory-maps a file and validates every rule of the format before it hands
 * out a single tensor (see `docs/safetensors.md` §1 for the reference parser's reject
 * list).  The writer streams: it writes the header, sizes the file, and
 * lets the caller fill each tensor's bytes in place, so no tensor is ever held whole in
 * private memory.
 */
#ifndef WSYNC_SAFETENSORS_H
#define WSYNC_SAFETENSORS_H

#include <glib.h>
#include <wsync/api.h>
#include <wsync/dtype.h>

G_BEGIN_DECLS

/** The most dimensions a tensor may have; files with more are refused by name. */
#define WSYNC_MAX_DIMS 16

/** The largest header the reference parser accepts (100 MB, decimal). */
#define WSYNC_SAFETENSORS_MAX_HEADER 100000000u

/**
 * WsyncTensor:
 * @name: the tensor's name in its file
 * @dtype: element type
 * @ndim: number of dimensions (0 for a scalar)
 * @shape: the first @ndim entries are the dimensions
 * @numel: product of the dimensions (1 for a scalar)
 * @nbytes: size of the data in bytes
 * @data: the tensor's bytes inside the read-only map of its file
 * @file: path of the file that holds it
 *
 * One tensor of an opened file.  It lives as long as the object that returned it.
 */
typedef struct {
  const char *name;
  WsyncDtype dtype;
  guint ndim;
  guint64 shape[WSYNC_MAX_DIMS];
  guint64 numel;
  guint64 nbytes;
  const guint8 *data;
  const char *file;
} WsyncTensor;

/* ---------------------------------------------------------------- reading one file */

/** An opened, validated safetensors file. */
typedef struct _WsyncSafetensors WsyncSafetensors;

/**
 * wsync_safetensors_open:
 * @path: a safetensors file
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT or #WSYNC_ERROR_IO error
 *
 * Maps @path read-only and validates it: header length, UTF-8, JSON, dtype names,
 * shapes, byte sizes, contiguous offsets starting at 0, no trailing bytes, unique
 * names, a string-to-string `__metadata__`.  The error message names the file, the
 * tensor when there is one, and the rule that was broken.
 *
 * Returns: (transfer full) (nullable): the file, or %NULL with @error set.
 */
WSYNC_API WsyncSafetensors *wsync_safetensors_open(const char *path, GError **error);

/**
 * wsync_safetensors_parse:
 * @data: a whole safetensors file in memory; it must outlive the result
 * @len: its length
 * @display_name: the name used in error messages and as WsyncTensor.file
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT error
 *
 * Validates a file image that is already in memory, by the same rules as
 * wsync_safetensors_open().  Used by tests and fuzzers.
 *
 * Returns: (transfer full) (nullable): the file, or %NULL with @error set.
 */
WSYNC_API WsyncSafetensors *wsync_safetensors_parse(const guint8 *data, gsize len, const char *display_name,
                                          GError **error);

/**
 * wsync_safetensors_free:
 * @st: (nullable): a file
 *
 * Unmaps and frees it.  Tensors obtained from it become invalid.
 */
WSYNC_API void wsync_safetensors_free(WsyncSafetensors *st);

/** wsync_safetensors_path: Returns: the path (or display name) the file was opened with. */
WSYNC_API const char *wsync_safetensors_path(const WsyncSafetensors *st);

/** wsync_safetensors_n_tensors: Returns: the number of tensors in the file. */
WSYNC_API guint wsync_safetensors_n_tensors(const WsyncSafetensors *st);

/**
 * wsync_safetensors_tensor:
 * @st: a file
 * @index: 0 <= @index < wsync_safetensors_n_tensors()
 *
 * Tensors are numbered in the order of their data in the file.
 *
 * Returns: (transfer none): the tensor.
 */
WSYNC_API const WsyncTensor *wsync_safetensors_tensor(const WsyncSafetensors *st, guint index);

/**
 * wsync_safetensors_lookup:
 * @st: a file
 * @name: a tensor name
 *
 * Returns: (transfer none) (nullable): the tensor called @name, or %NULL.
 */
WSYNC_API const WsyncTensor *wsync_safetensors_lookup(const WsyncSafetensors *st, const char *name);

/**
 * wsync_safetensors_metadata:
 * @st: a file
 *
 * Returns: (transfer none): the `__metadata__` map (string to string); empty when
 *   the file has none.  Do not modify it.
 */
WSYNC_API GHashTable *wsync_safetensors_metadata(const WsyncSafetensors *st);

/** wsync_safetensors_header_size: Returns: 8 + the header length N: where the data begins. */
WSYNC_API guint64 wsync_safetensors_header_size(const WsyncSafetensors *st);

/* ---------------------------------------------------------------- writing one file */

/** A safetensors file being written. */
typedef struct _WsyncSafetensorsWriter WsyncSafetensorsWriter;

/**
 * wsync_safetensors_writer_new:
 *
 * Starts describing a file.  Declare every tensor with wsync_safetensors_writer_add()
 * and any metadata, then call wsync_safetensors_writer_begin().
 *
 * Returns: (transfer full): a new writer.
 */
WSYNC_API WsyncSafetensorsWriter *wsync_safetensors_writer_new(void);

/**
 * wsync_safetensors_writer_set_metadata:
 * @w: a writer that has not begun
 * @key: a key of `__metadata__`
 * @value: its value
 *
 * Adds or replaces one `__metadata__` entry.  Entries are written sorted by key.
 */
WSYNC_API void wsync_safetensors_writer_set_metadata(WsyncSafetensorsWriter *w, const char *key,
                                           const char *value);

/**
 * wsync_safetensors_writer_add:
 * @w: a writer that has not begun
 * @name: tensor name (not `__metadata__`, not a name already added)
 * @dtype: element type
 * @ndim: number of dimensions, at most #WSYNC_MAX_DIMS
 * @shape: the dimensions
 * @error: return location for a #WSYNC_ERROR_USAGE error
 *
 * Declares one tensor.  As the reference writer does, the data is laid out sorted by
 * dtype (largest alignment first), then by name, so every tensor is naturally aligned.
 *
 * Returns: %TRUE, or %FALSE for a duplicate or reserved name, too many dimensions or
 *   a size that overflows.
 */
WSYNC_API gboolean wsync_safetensors_writer_add(WsyncSafetensorsWriter *w, const char *name,
                                      WsyncDtype dtype, guint ndim, const guint64 *shape,
                                      GError **error);

/**
 * wsync_safetensors_writer_header:
 * @w: a writer
 * @len: (out): length of the result
 *
 * Builds the bytes that precede the data: the 8-byte little-endian length, then the
 * compact JSON header (`__metadata__` first, then the tensors in data order), padded
 * with spaces to a multiple of 8.
 *
 * Returns: (transfer full): the header bytes.
 */
WSYNC_API guint8 *wsync_safetensors_writer_header(WsyncSafetensorsWriter *w, gsize *len);

/**
 * wsync_safetensors_writer_begin:
 * @w: a writer
 * @path: the file to create (an existing file is replaced)
 * @error: return location for a #WSYNC_ERROR_IO error
 *
 * Creates @path, writes the header and sizes the file to its final length (sparse: no
 * block is reserved yet).  The data region is then filled with
 * wsync_safetensors_writer_data() and/or wsync_safetensors_writer_pwrite(), from any
 * number of threads.
 *
 * Returns: %TRUE on success.
 */
WSYNC_API gboolean wsync_safetensors_writer_begin(WsyncSafetensorsWriter *w, const char *path,
                                        GError **error);

/**
 * wsync_safetensors_writer_data:
 * @w: a writer that has begun
 * @name: a declared tensor
 * @error: return location for a #WSYNC_ERROR_IO error
 *
 * Maps the file for writing (once) and returns where @name's bytes go.  The first call
 * reserves the file's blocks (posix_fallocate(3)), so that a full disk fails here with
 * an ENOSPC error instead of killing the process with SIGBUS when a page of the map is
 * first written.
 *
 * Returns: (transfer none) (nullable): a pointer to nbytes writable bytes.
 */
WSYNC_API guint8 *wsync_safetensors_writer_data(WsyncSafetensorsWriter *w, const char *name,
                                      GError **error);

/**
 * wsync_safetensors_writer_pwrite:
 * @w: a writer that has begun
 * @name: a declared tensor
 * @offset: byte offset inside the tensor
 * @buf: bytes to write
 * @len: how many; @offset + @len must not pass the tensor's end
 * @error: return location for a #WSYNC_ERROR_IO error
 *
 * Writes part of a tensor with pwrite(2).  Safe to call from several threads.  A full
 * disk is an ENOSPC error.
 *
 * Returns: %TRUE on success.
 */
WSYNC_API gboolean wsync_safetensors_writer_pwrite(WsyncSafetensorsWriter *w, const char *name,
                                         guint64 offset, const void *buf, gsize len,
                                         GError **error);

/**
 * wsync_safetensors_writer_tensor_nbytes:
 * @w: a writer
 * @name: a declared tensor
 *
 * Returns: the byte size of @name, or 0 when it was not declared.
 */
WSYNC_API guint64 wsync_safetensors_writer_tensor_nbytes(WsyncSafetensorsWriter *w, const char *name);

/**
 * wsync_safetensors_writer_tensor_offset:
 * @w: a writer
 * @name: a declared tensor
 *
 * Where @name's bytes begin in the data region, once every tensor is declared (the
 * layout wsync_safetensors_writer_header() writes).  Its offset in the file is this plus
 * the length of that header.  The session uses it to tell, before any file exists,
 * where each tensor lives.
 *
 * Returns: the byte offset of @name from the start of the data, or 0 when it was not
 *   declared.
 */
WSYNC_API guint64 wsync_safetensors_writer_tensor_offset(WsyncSafetensorsWriter *w,
                                                         const char *name);

/**
 * wsync_safetensors_writer_data_size:
 * @w: a writer
 *
 * Returns: the total size of the data region (the sum of the tensors' sizes).
 */
WSYNC_API guint64 wsync_safetensors_writer_data_size(WsyncSafetensorsWriter *w);

/**
 * wsync_safetensors_writer_finish:
 * @w: a writer that has begun
 * @error: return location for a #WSYNC_ERROR_IO error
 *
 * Unmaps, flushes to stable storage and closes the file.
 *
 * Returns: %TRUE on success.
 */
WSYNC_API gboolean wsync_safetensors_writer_finish(WsyncSafetensorsWriter *w, GError **error);

/**
 * wsync_safetensors_writer_free:
 * @w: (nullable): a writer
 *
 * Frees the writer; a file begun but not finished is closed as it is (the caller
 * writes into a temporary directory and discards it on failure).
 */
WSYNC_API void wsync_safetensors_writer_free(WsyncSafetensorsWriter *w);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(WsyncSafetensors, wsync_safetensors_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(WsyncSafetensorsWriter, wsync_safetensors_writer_free)

G_END_DECLS

#endif /* WSYNC_SAFETENSORS_H */
