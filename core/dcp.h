/* wsync: reading PyTorch distributed checkpoints (DCP), sharded over ranks.
 *
 * Private to libwsync (not installed, not exported): the planner (merge, and convert from
 * a sharded source), the tests and the fuzz harness, which link the core, call them; the
 * `wsync` command reaches them through the public wsync_sharded_checkpoint_to_json().
 *
 * Two on-disk formats (the facts are in `docs/dcp.md`: format A §2, format B §3, shard
 * boxes §4):
 *
 * - Format A, DCP in Hugging Face safetensors mode: every
 *   `shard-S-model-I-of-N.safetensors` of the directory, or of its `sharded/`
 *   subdirectory.  Each is a plain safetensors file (read with wsync_safetensors_open(),
 *   so all of that format's checks apply) whose `__metadata__` holds
 *   `DCP_SHARDING_INFO`, a JSON string mapping each tensor key to
 *   `{"saved_offsets": [...], "logical_fqn": "..."}`.  Chunks are grouped by
 *   `logical_fqn` (else by the key); the global shape is the largest offset + size per
 *   axis; a tensor's output part is the I-of-N of its files.  Gaps in the shard numbers
 *   are normal (a rank with nothing left after deduplication writes no file), so a
 *   missing file is seen only through the hole it leaves: a hole inside a tensor is
 *   refused, but a file that held the last rows of a tensor (the "tail hole" of torch PR
 *   #189945), or all of it, cannot be told from a smaller model.  Callers that know the
 *   model's shapes (config.json) should compare.
 * - Format B, the default layout: `.metadata` (a pickle of
 *   `torch.distributed.checkpoint.metadata.Metadata`, read by core/pickle.c, which runs
 *   nothing) and `__R_K.distcp` data files in which every chunk is a whole `torch.save`
 *   zip archive at `_StorageInfo.offset/length`.  The archive is read with libzip; its
 *   `data.pkl` gives the storage class, size, stride and storage offset, and its
 *   `data/0` entry must be stored (not compressed), so a chunk's bytes are a plain range
 *   of the mapped file.  The global shape is `TensorStorageMetadata.size`.
 *   `BytesStorageMetadata` entries (non-tensor values) are skipped and listed.
 *   A `.distcp` written with `SerializationFormat.SAFETENSORS` (a safetensors blob where
 *   the archive should be) is refused by name.
 * - Format B saved with `use_collectives=False`: no `.metadata`, but one
 *   `__{rank}.metadata` per rank, each a whole `Metadata` that lists only that rank's
 *   chunks and `storage_data` (docs/dcp.md §3).  torch itself never merges them (each
 *   rank loads its own); here every rank's file is read and their chunks are merged, in
 *   rank order, each bound through its own rank's `storage_data`.  Ranks must run from 0
 *   without a gap, and a `__R_K.distcp` data file needs its `__R.metadata`; the ranks
 *   must agree on every tensor's dtype and global shape.  Nothing is deduplicated across
 *   ranks (each rank writes its own copy of a replicated tensor): copies are compared
 *   byte for byte by the coverage check.
 *
 * Nothing is copied: chunks point into read-only maps that live as long as the
 * #WsyncDcp.  wsync_dcp_open() reads headers and metadata only; the proof that the chunks
 * tile every tensor is wsync_dcp_check_coverage(), which reads data only where chunks
 * overlap (replicas must be byte-identical there).
 *
 * Messages follow the safetensors reader: one #WSYNC_ERROR_BAD_INPUT line naming the
 * file, the tensor, the chunk's box ("[0:3, 0:4]", half-open ranges per axis) and the
 * numbers, e.g.
 *   "ckpt/sharded: tensor "w": no chunk covers [3:6, 0:4] (shape [10, 4])".
 */
#ifndef WSYNC_DCP_H
#define WSYNC_DCP_H

#include <string.h>

#include <glib.h>
#include <wsync/dtype.h>
#include <wsync/layout.h>
#include <wsync/safetensors.h>

G_BEGIN_DECLS

/** The name of format B's metadata file. */
#define WSYNC_DCP_METADATA_NAME ".metadata"
/** How format B names a rank's own metadata when saved with `use_collectives=False`:
 * `__` + the rank in decimal + this suffix (`__0.metadata`, `__1.metadata`, ...). */
#define WSYNC_DCP_RANK_METADATA_SUFFIX ".metadata"
/** The subdirectory format A's shards may be in. */
#define WSYNC_DCP_SHARDED_DIR "sharded"
/** The most entries a torch.save archive of one chunk may have (torch writes 7). */
#define WSYNC_DCP_MAX_ZIP_ENTRIES 64
/** The largest `data.pkl` of one chunk accepted (torch's are a few hundred bytes). */
#define WSYNC_DCP_MAX_DATA_PKL (1u << 20)

/**
 * WsyncDcpChunk:
 * @box: the chunk's place in the global tensor: @box.offset and @box.extent per axis
 *   (@box.ndim is the tensor's ndim; a 0-dim tensor's one chunk has ndim 0)
 * @data: the chunk's first element inside a read-only map (for an empty chunk, some
 *   valid address that must not be read)
 * @region: element strides of the chunk's bytes, origin 0: element (i_0, ..., i_n-1) of
 *   the box is at @data + dtype size * (@region.origin + sum(i_k * @region.stride[k])).
 *   Row-major for format A; `_rebuild_tensor_v2`'s stride for format B (any order, e.g.
 *   transposed)
 * @file: the file that holds the bytes
 *
 * One saved piece of a tensor.
 */
typedef struct {
  WsyncBox box;
  const guint8 *data;
  WsyncRegion region;
  const char *file;
} WsyncDcpChunk;

/**
 * WsyncDcpTensor:
 * @name: the tensor's fully qualified name
 * @dtype: element type (never a sub-byte type)
 * @ndim: number of axes (0 for a scalar)
 * @shape: the global shape
 * @chunks: (element-type WsyncDcpChunk) (nullable): its chunks, in file order (format A:
 *   files by shard number, then data order) or in `.metadata` order (format B; per-rank
 *   metadata: rank by rank, each in its file's order); NULL for a tensor that is one
 *   whole row-major chunk with no data yet in @whole_file (a session's whole tensors: a
 *   whole model has ~19k, and a WsyncDcpChunk array each cost ~560 bytes, issue 14).
 *   Read them with wsync_dcp_tensor_n_chunks() and wsync_dcp_tensor_chunk().
 * @whole_file: with @chunks NULL, the file of its one chunk
 * @part: format A: the output file index I of `shard-S-model-I-of-N` (1-based), the same
 *   for all the tensor's files; 0 when unknown (format B)
 * @n_parts: format A: N; 0 when unknown
 *
 * One logical tensor of the checkpoint.
 */
typedef struct {
  char *name;
  WsyncDtype dtype;
  guint ndim;
  guint64 shape[WSYNC_MAX_DIMS];
  GArray *chunks;
  const char *whole_file;
  guint part;
  guint n_parts;
} WsyncDcpTensor;

/* The number of chunks of @g. */
static inline guint
wsync_dcp_tensor_n_chunks(const WsyncDcpTensor *g)
{
  return g->chunks != NULL ? g->chunks->len : 1;
}

/* Chunk @c of @g: in @g's chunks, or made in @buf for a whole tensor. */
static inline const WsyncDcpChunk *
wsync_dcp_tensor_chunk(const WsyncDcpTensor *g, guint c, WsyncDcpChunk *buf)
{
  if (g->chunks != NULL)
    return &g_array_index(g->chunks, WsyncDcpChunk, c);
  g_assert(c == 0);
  memset(buf, 0, sizeof *buf);
  buf->box.ndim = g->ndim;
  memcpy(buf->box.extent, g->shape, sizeof buf->box.extent);
  wsync_region_row_major(&buf->region, g->ndim, g->shape, NULL);
  buf->file = g->whole_file;
  return buf;
}

/**
 * WsyncDcpFormat:
 * @WSYNC_DCP_FORMAT_HF_SAFETENSORS: format A (shard-*-model-*-of-*.safetensors)
 * @WSYNC_DCP_FORMAT_TORCH_SAVE: format B (.metadata and __R_K.distcp)
 */
typedef enum {
  WSYNC_DCP_FORMAT_HF_SAFETENSORS,
  WSYNC_DCP_FORMAT_TORCH_SAVE,
} WsyncDcpFormat;

/** An opened sharded checkpoint. */
typedef struct _WsyncDcp WsyncDcp;

/**
 * wsync_dcp_detect:
 * @dir: a directory
 *
 * Cheap test, for choosing a reader: does @dir hold a `.metadata` file, a per-rank
 * `__R.metadata` file, or a file named `shard-S-model-I-of-N.safetensors` (directly or in
 * `@dir/sharded`)?  Opens no file.
 *
 * Returns: %TRUE when @dir looks like a sharded checkpoint.
 */
gboolean wsync_dcp_detect(const char *dir);

/**
 * wsync_dcp_below_hint:
 * @dir: a directory that is not a sharded checkpoint itself
 *
 * Trainers save a model's checkpoint as one subdirectory of a step directory
 * (accelerate: `pytorch_model_fsdp_0/` beside `optimizer_0/`, `config.json` and the
 * scheduler's file), so a refusal of @dir names the subdirectories wsync_dcp_detect()
 * accepts (format A's `sharded/` excepted: that one makes @dir a checkpoint), sorted:
 * "; its subdirectories optimizer_0 and pytorch_model_fsdp_0 are: pass one of them as
 * SRC", or "; its subdirectory X is one: pass it as SRC".
 *
 * When @dir itself holds `torch.save` archives (recognised by content, whatever their
 * names: a zip whose first entry's directory holds `data.pkl`), the text also says so,
 * naming the first three (sorted) and counting the rest: "; it holds torch.save archives
 * (a.pt, b.pt, c.pt and 9 more): wsync does not read torch.save archives (a whole
 * model's or each rank's state dict), only safetensors files and DCP checkpoints".  verl and lmms-engine save FSDP2
 * models that way (`docs/torch-save.md`).
 *
 * Returns: (transfer full): that text, to append to a message; "" when there is none.
 */
char *wsync_dcp_below_hint(const char *dir);

/**
 * wsync_dcp_open:
 * @dir: the checkpoint directory (for format A, the directory whose `sharded/` holds the
 *   shards may be given too)
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT or #WSYNC_ERROR_IO error
 *
 * wsync_dcp_open_with() without options.  Reads the headers (format A) or the `.metadata` (or every `__R.metadata`) and every
 * chunk's archive directory and `data.pkl` (format B), maps the data files and validates
 * everything that does not need the data: names, dtypes (one per tensor, and for format
 * B the archive's storage class against `TensorProperties.dtype`), shapes (for per-rank
 * metadata: the same in every rank's file), chunk sizes against the archive's size,
 * strides and storage offsets inside the storage, byte ranges inside the files, one
 * output part per tensor, no rank's metadata missing.  A directory that holds more than
 * one of a `.metadata`, `__R.metadata` files and shard files, or shard files both in @dir
 * and in `@dir/sharded`, is refused as ambiguous.
 *
 * Returns: (transfer full) (nullable): the checkpoint, or %NULL with @error set.
 */
WsyncDcp *wsync_dcp_open(const char *dir, GError **error);

/**
 * WsyncDcpOpenOptions:
 * @select: (nullable): the key of the model's state dict in the saved state dict, a
 *   dotted path as flatten_state_dict joins it ("app.model"; "." for the top level): only
 *   the entries directly under it are read, named without it; %NULL: see
 *   wsync_dcp_open_with()
 * @list_all: for listing (inspect): a checkpoint of several state dicts is not refused;
 *   its entries keep their saved names and wsync_dcp_refusal() says why merge would refuse
 *
 * How wsync_dcp_open_with() names the entries.  Zero-initialise.
 */
typedef struct {
  const char *select;
  gboolean list_all;
} WsyncDcpOpenOptions;

/**
 * wsync_dcp_open_with:
 * @dir: as for wsync_dcp_open()
 * @opts: (nullable): how to name the entries; %NULL: as zero options
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT or #WSYNC_ERROR_IO error
 *
 * wsync_dcp_open(), naming the entries as the model names its tensors (docs/dcp.md §3,
 * "Names"): a model's state dict is flat, so the model is the entries directly under one
 * node of the saved state dict, the node @opts->select names or, without it, the deepest
 * node that holds every tensor (the keys above it are wrappers, dropped:
 * wsync_dcp_wrapper(); non-tensor values anywhere are skipped).  Without a selection, a
 * save with tensors below that node (a model beside its optimizer) is refused, listing the keys there and the numbers of
 * tensors and other values under each: "the checkpoint holds more than one state dict:
 * under app, app.model (2 tensors) and app.optim (6 tensors, 2 other values); pass
 * --select KEY, ...".  A selection under which no tensor lies is refused the same way.
 * Entries outside the selection are dropped before their data files are opened.
 *
 * Returns: (transfer full) (nullable): the checkpoint, or %NULL with @error set.
 */
WsyncDcp *wsync_dcp_open_with(const char *dir, const WsyncDcpOpenOptions *opts, GError **error);

/** wsync_dcp_n_dropped: Returns: the number of entries (tensors and other values) left out
 * because they are not under the selection. */
guint wsync_dcp_n_dropped(const WsyncDcp *dcp);

/**
 * wsync_dcp_refusal:
 * @dcp: a checkpoint opened with @list_all
 *
 * Returns: (transfer none) (nullable): why merge, convert, plan and sync refuse its names
 *   without --select (the message without the file), or %NULL when they do not.
 */
const char *wsync_dcp_refusal(const WsyncDcp *dcp);

/** wsync_dcp_format: Returns: which of the two formats @dcp is. */
WsyncDcpFormat wsync_dcp_format(const WsyncDcp *dcp);

/** wsync_dcp_n_tensors: Returns: the number of tensors of @dcp. */
guint wsync_dcp_n_tensors(const WsyncDcp *dcp);

/**
 * wsync_dcp_tensor:
 * @dcp: a checkpoint
 * @i: 0 <= @i < wsync_dcp_n_tensors()
 *
 * Tensors are sorted by name (strcmp order).
 *
 * Returns: (transfer none): tensor @i; it lives as long as @dcp.
 */
const WsyncDcpTensor *wsync_dcp_tensor(const WsyncDcp *dcp, guint i);

/**
 * wsync_dcp_lookup:
 * @dcp: a checkpoint
 * @name: a tensor name
 *
 * Returns: (transfer none) (nullable): the tensor called @name, or %NULL.
 */
const WsyncDcpTensor *wsync_dcp_lookup(const WsyncDcp *dcp, const char *name);

/**
 * wsync_dcp_n_skipped:
 * @dcp: a checkpoint
 *
 * Returns: the number of non-tensor entries (format B `BytesStorageMetadata`) that were
 *   skipped; 0 for format A.
 */
guint wsync_dcp_n_skipped(const WsyncDcp *dcp);

/**
 * wsync_dcp_skipped:
 * @dcp: a checkpoint
 * @i: 0 <= @i < wsync_dcp_n_skipped()
 *
 * Returns: (transfer none): the name of skipped entry @i, in `.metadata` order.
 */
const char *wsync_dcp_skipped(const WsyncDcp *dcp, guint i);

/**
 * wsync_dcp_wrapper:
 * @dcp: a checkpoint
 *
 * Each entry is named by the last element of its object path in the saved state dict
 * (format B's `planner_data`; without one, by its fqn), the keys above it dropped: those
 * of the selection, or the wrappers of the whole state dict, as accelerate's
 * `merge_fsdp_weights` drops the "model" of its `{"model": state_dict}`
 * (wsync_dcp_open_with(), docs/dcp.md §3, "Names").
 *
 * Returns: (transfer none) (nullable): the keys dropped, joined with ".", or %NULL (none).
 */
const char *wsync_dcp_wrapper(const WsyncDcp *dcp);

/**
 * wsync_dcp_check_tensor:
 * @dcp: a checkpoint
 * @tensor: one of its tensors
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT error
 *
 * Proves that the chunks of @tensor tile it: every box inside the shape, and every
 * element covered.  Chunks may overlap only as byte-identical replicas: where boxes
 * overlap, the first chunk (in @tensor's chunk order) wins and every later one must hold
 * the same bytes on the overlap (compared, not assumed; this is the only data read).
 * Zero-size chunks are allowed and ignored; a 0-dim tensor needs one chunk.  A gap is
 * reported with the first missing box (lowest in row-major order):
 * "WHERE: tensor "w": no chunk covers [3:6, 0:4] (shape [10, 4], 3 chunks)".
 *
 * Returns: %TRUE when @tensor is covered.
 */
gboolean wsync_dcp_check_tensor(const WsyncDcp *dcp, const WsyncDcpTensor *tensor, GError **error);

/**
 * wsync_dcp_check_coverage:
 * @dcp: a checkpoint
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT error
 *
 * Runs wsync_dcp_check_tensor() on every tensor, in order, and stops at the first
 * failure.
 *
 * Returns: %TRUE when every tensor is covered.
 */
gboolean wsync_dcp_check_coverage(const WsyncDcp *dcp, GError **error);

/**
 * wsync_dcp_free:
 * @dcp: (nullable): a checkpoint
 *
 * Unmaps its files and frees it; its tensors and chunks become invalid.
 */
void wsync_dcp_free(WsyncDcp *dcp);

/* ---------------------------------------------------------------- parts, for tests and fuzzing */

/**
 * WsyncDcpBlob:
 * @dtype: element type, from the storage class (`torch.BFloat16Storage` -> BF16, ...) or,
 *   for `_rebuild_tensor_v3` (float8 and unsigned 16/32/64-bit dtypes, which torch saves
 *   as an `UntypedStorage`), from its dtype argument
 * @ndim: number of axes of the saved tensor
 * @size: its size per axis
 * @stride: its stride per axis, in elements
 * @storage_offset: the element index of its first element in the storage
 * @storage_numel: the number of elements of the storage
 * @data_offset: where the storage's bytes begin, relative to the start of the archive
 *   (0 when the storage is empty)
 * @data_len: the storage's size in bytes (@storage_numel times the element size)
 *
 * What one `torch.save` archive of a single tensor holds.
 */
typedef struct {
  WsyncDtype dtype;
  guint ndim;
  guint64 size[WSYNC_MAX_DIMS];
  guint64 stride[WSYNC_MAX_DIMS];
  guint64 storage_offset;
  guint64 storage_numel;
  guint64 data_offset;
  guint64 data_len;
} WsyncDcpBlob;

/**
 * wsync_dcp_read_blob:
 * @blob: a whole `torch.save` zip archive in memory
 * @len: its length
 * @what: names it in messages, e.g. "ckpt/__0_0.distcp at byte 512"
 * @out: (out caller-allocates): what it holds
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT error
 *
 * Opens @blob with libzip (consistency checks on), finds the one `DIR/data.pkl`, reads it
 * with the restricted pickle reader, checks `DIR/byteorder` (when present) is "little",
 * and locates the storage entry `DIR/data/KEY`, which must be stored uncompressed and
 * unencrypted and be exactly the storage's size.  libzip 1.7 has no call that returns an
 * entry's data offset, so the archive is given to libzip through a source that notes
 * where libzip reads; the entry's 30-byte local header is then parsed here (bounds
 * checked) at the place libzip read it, and the data offset it gives must be where
 * libzip read the data.  Also checks that the size and stride stay inside the storage.
 *
 * Returns: %TRUE on success.
 */
gboolean wsync_dcp_read_blob(const guint8 *blob, gsize len, const char *what, WsyncDcpBlob *out,
                             GError **error);

/**
 * wsync_dcp_parse_metadata:
 * @data: the bytes of a format B `.metadata` file
 * @len: their number
 * @file: its name, for messages
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT error
 *
 * Interprets the metadata alone: the tensors with their dtypes, global shapes and chunk
 * boxes.  No data file is opened: the chunks' @data and @file are %NULL.  Used by
 * wsync_dcp_open() and by the fuzz harness.
 *
 * Returns: (transfer full) (nullable): a checkpoint without data, or %NULL.
 */
WsyncDcp *wsync_dcp_parse_metadata(const guint8 *data, gsize len, const char *file,
                                   GError **error);

/**
 * wsync_dcp_parse_shard:
 * @data: the bytes of a format A shard file; must outlive the result
 * @len: their number
 * @file: its name, for messages (parsed like a real shard name when it is one, for the
 *   output part)
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT error
 *
 * Validates one shard image (wsync_safetensors_parse() and its `DCP_SHARDING_INFO`) and
 * returns it as a checkpoint of its own chunks.  Used by the fuzz harness.
 *
 * Returns: (transfer full) (nullable): a checkpoint, or %NULL.
 */
WsyncDcp *wsync_dcp_parse_shard(const guint8 *data, gsize len, const char *file, GError **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(WsyncDcp, wsync_dcp_free)

G_END_DECLS

#endif /* WSYNC_DCP_H */
