/* wsync: a session, for syncing the weights of a running trainer.
 *
 * A session is made once, from the model's config.json, a target, format, tp and ep and
 * a context (its conf.d and plugins).  The trainer describes its tensors once (Hugging
 * Face names, per-expert or fused experts; whole, or as shards of a global tensor) and
 * the session plans exactly as `wsync convert` does: every output byte is covered once,
 * every described tensor is used or dropped by a named rule.  The plan gives each
 * destination rank's manifest (name, dtype, shape, file, byte offset) and a digest of
 * all of them that both sides of a sync can compare.
 *
 * Then, every training step: wsync_session_begin(), wsync_session_push() of every
 * described tensor, in any order and from any threads, and wsync_session_commit().  Each
 * pushed tensor is cut, cast and packed into every destination rank's bytes as it
 * arrives (post-load hooks such as vLLM-Ascend's transposed experts included); nothing
 * stages the whole model.  The bytes go to one of two sinks:
 *
 * - a directory (@out_dir, e.g. on /dev/shm): the rank files `wsync convert` writes for
 *   the same target, format, tp and ep, with the same names, tensors and metadata,
 *   created at the first step and then rewritten in place (kept mapped: no allocation,
 *   and on a tmpfs no page faults, in the steady state), config.json and the companion
 *   files of config.json's directory written at the first commit, and the commit record
 *   `wsync-commit.json` (#WSYNC_SESSION_COMMIT_RECORD), written atomically last at every
 *   commit and removed first at every begin;
 * - the caller (@on_bucket): filled buckets of whole consecutive tensors of one rank
 *   file, of bounded size, each with its slice of the manifest.
 *
 * docs/session.md describes the commit record, the canonical manifest the digest
 * hashes, and what a reader of the directory may rely on.
 *
 * Errors are one line naming the tensor and the problem, in the exit classes of
 * <wsync/error.h>: an unknown, repeated or wrongly sized tensor is
 * %WSYNC_ERROR_BAD_INPUT (exit 3), a call out of order %WSYNC_ERROR_USAGE (exit 2), a
 * failed write %WSYNC_ERROR_IO (exit 4).  A refused push writes nothing and leaves the
 * step open.
 */
#ifndef WSYNC_SESSION_H
#define WSYNC_SESSION_H

#include <signal.h>

#include <glib.h>
#include <wsync/api.h>
#include <wsync/dtype.h>
#include <wsync/registry.h>
#include <wsync/safetensors.h>

G_BEGIN_DECLS

/** The commit record's name inside the directory sink. */
#define WSYNC_SESSION_COMMIT_RECORD "wsync-commit.json"

/** The name of the rank files' checksum in the commit record (docs/session.md). */
#define WSYNC_SESSION_CHECKSUM_ALGORITHM "xxh3-64-blocks"

/** The block size of that checksum: 64 KiB. */
#define WSYNC_SESSION_CHECKSUM_BLOCK 65536

/** The default size of a caller-sink bucket: 512 MiB. */
#define WSYNC_SESSION_BUCKET_BYTES (G_GUINT64_CONSTANT(512) << 20)

/** A planned sync from a trainer to the ranks of an engine. */
typedef struct _WsyncSession WsyncSession;

/**
 * WsyncManifestEntry:
 * @name: the tensor's name as the target writes it (e.g. vLLM's name)
 * @dtype: its element type
 * @ndim: its number of axes
 * @shape: the first @ndim entries are its dimensions
 * @file: the base name of the rank file that holds it, e.g.
 *   `model-rank-0-part-0.safetensors`
 * @offset: the byte offset of its data in that file (the safetensors header included)
 * @nbytes: the size of its data
 * @reserved: room for growth; zero
 *
 * One tensor of one destination rank and where it lives in that rank's files.  A
 * rank's entries are in file order: its files by part, each file's tensors by offset
 * (the order the safetensors writer lays them out in: dtype, then name), so the
 * entries of one file are contiguous and each starts where the previous one ends.
 */
typedef struct {
  const char *name;
  WsyncDtype dtype;
  guint ndim;
  guint64 shape[WSYNC_MAX_DIMS];
  const char *file;
  guint64 offset;
  guint64 nbytes;
  gpointer reserved[2];
} WsyncManifestEntry;

/**
 * WsyncBucket:
 * @version: the step's version (wsync_session_begin())
 * @rank: the destination rank
 * @file: the rank file the bytes belong to (a manifest entry's @file)
 * @file_offset: where @data[0] goes in that file
 * @data: (array length=nbytes): the bytes; valid only during the callback (%NULL when
 *   @nbytes is 0)
 * @nbytes: how many
 * @entries: (array length=n_entries): the manifest slice the bucket holds: whole
 *   tensors, consecutive in the file, the first at @file_offset, the last ending at
 *   @file_offset + @nbytes
 * @n_entries: how many
 * @reserved: room for growth; zero
 *
 * A filled bucket of the caller sink.  Buckets hold whole tensors: consecutive tensors
 * of one rank file, at most the session's bucket size, except that a tensor larger than
 * the bucket size gets a bucket of its own (so a receiver can `copy_` every tensor of a
 * bucket into its parameter; splitting one in byte ranges would not allow it).  The
 * buckets of one step, concatenated per (rank, file) in @file_offset order, are exactly
 * the data bytes of that rank file.
 */
typedef struct {
  guint64 version;
  guint rank;
  const char *file;
  guint64 file_offset;
  const guint8 *data;
  gsize nbytes;
  const WsyncManifestEntry *entries;
  guint n_entries;
  gpointer reserved[2];
} WsyncBucket;

/**
 * WsyncBucketFunc:
 * @bucket: a filled bucket; its memory is freed when the callback returns
 * @user_data: the options' @user_data
 * @error: return location for an error
 *
 * The caller sink.  It is called from the thread whose push (or commit) completed the
 * bucket, never from two threads at once, and must not call the session itself.
 *
 * Returns: %TRUE to go on; %FALSE with @error set fails the push (or commit) that
 *   delivered the bucket, and the step (see wsync_session_abort()).
 */
typedef gboolean (*WsyncBucketFunc)(const WsyncBucket *bucket, gpointer user_data,
                                    GError **error);

/**
 * WsyncSessionOptions:
 * @target: the target to write, e.g. "vllm" (required)
 * @format: (nullable): one of the target's formats; %NULL: the target's default
 * @tp: tensor-parallel size; 0 means 1
 * @ep: expert-parallel size; 0 means 1
 * @out_dir: (nullable): the directory sink
 * @on_bucket: (nullable): the caller sink
 * @user_data: passed to @on_bucket
 * @bucket_bytes: the caller sink's bucket size; 0: #WSYNC_SESSION_BUCKET_BYTES
 * @threads: threads that copy a pushed tensor (the pushing thread among them); 0: one
 *   per core.  A process forked after wsync_session_new() has none of the helper
 *   threads: its pushes copy on the pushing thread alone, and wsync_session_free()
 *   there leaves the parent's threads alone
 * @part_size: start a new rank file before a tensor that would pass this many bytes;
 *   0: 5 GiB, the default of `wsync convert --part-size` (added to the interface so that
 *   a session writes the same files as a convert run with another part size)
 * @max_open_buckets: the caller sink: refuse (#WSYNC_ERROR_USAGE, nothing written) a
 *   push that would make more buckets open (started, not yet filled) than this; 0: no
 *   cap (added: see wsync_session_push() for the memory bound)
 * @reserved: room for growth; zero
 *
 * How a session is made.  Zero-initialise it and set what you need.  At most one sink:
 * a session with neither plans and gives its manifest and digest (what the receiving
 * side needs to check what it is sent) but cannot begin a step.
 */
typedef struct {
  const char *target;
  const char *format;
  guint tp, ep;
  const char *out_dir;
  WsyncBucketFunc on_bucket;
  gpointer user_data;
  guint64 bucket_bytes;
  guint threads;
  guint64 part_size;
  guint max_open_buckets;
  gpointer reserved[6];
} WsyncSessionOptions;

/**
 * wsync_session_new:
 * @ctx: the context (conf.d, plugins); it must outlive the session
 * @config_path: the model's config.json (the model plugin that claims its model_type
 *   describes the model, as for `wsync convert`)
 * @opts: the target, format, parallel sizes and sink
 * @error: return location for an error
 *
 * Makes a session and describes the model; the trainer's tensors come next.
 *
 * Returns: (transfer full) (nullable): the session, or %NULL with @error set (a
 *   @config_path that is not there or cannot be opened: %WSYNC_ERROR_IO, "cannot open
 *   PATH: No such file or directory", exit status 4, as for a path named on the
 *   command line (README "Exit status"); a bad config.json, or a socket, a FIFO or a
 *   directory in its place: %WSYNC_ERROR_BAD_INPUT; an unknown target, a model no
 *   plugin claims, two sinks: %WSYNC_ERROR_USAGE).
 */
WSYNC_API WsyncSession *wsync_session_new(WsyncContext *ctx, const char *config_path,
                                          const WsyncSessionOptions *opts, GError **error);

/**
 * wsync_session_describe:
 * @s: a session that has not planned
 * @name: the trainer's name of the tensor (a Hugging Face name)
 * @dtype: its element type
 * @ndim: its number of axes, at most #WSYNC_MAX_DIMS
 * @shape: (array length=ndim): its dimensions
 * @error: return location for an error
 *
 * Describes one whole tensor the trainer will push every step.  Experts may be
 * described per expert (`experts.{e}.gate_proj.weight`) or fused as Transformers 5 holds
 * them (`experts.gate_up_proj`), as a checkpoint may hold them; the output is the same.
 *
 * Returns: %TRUE, or %FALSE for a name described before, too many axes or a size that
 *   overflows (%WSYNC_ERROR_BAD_INPUT), or a session that has planned
 *   (%WSYNC_ERROR_USAGE).
 */
WSYNC_API gboolean wsync_session_describe(WsyncSession *s, const char *name, WsyncDtype dtype,
                                          guint ndim, const guint64 *shape, GError **error);

/**
 * wsync_session_describe_shard:
 * @s: a session that has not planned
 * @name: the global tensor's name
 * @dtype: its element type (the same for every shard)
 * @ndim: its number of axes
 * @global_shape: (array length=ndim): the global tensor's shape (the same for every
 *   shard)
 * @offsets: (array length=ndim): where the shard starts in the global tensor
 * @sizes: (array length=ndim): the shard's extent per axis; its bytes are pushed
 *   row-major
 * @error: return location for an error
 *
 * Describes one shard (a box) of a global tensor, as PyTorch DCP describes chunks, so
 * that a sharded trainer rank pushes only its own part.  The shards of a tensor must
 * tile it: each inside the global shape, no two overlapping (replicas are not compared
 * as merge does: push each element once), and together covering it (checked by
 * wsync_session_plan()).  A name is described whole or as shards, not both.
 *
 * Returns: %TRUE, or %FALSE with @error set (%WSYNC_ERROR_BAD_INPUT: a shard outside
 *   the shape, overlapping another, a dtype or global shape other than the first
 *   shard's, a name described whole).
 */
WSYNC_API gboolean wsync_session_describe_shard(WsyncSession *s, const char *name,
                                                WsyncDtype dtype, guint ndim,
                                                const guint64 *global_shape,
                                                const guint64 *offsets, const guint64 *sizes,
                                                GError **error);

/**
 * wsync_session_plan:
 * @s: a session that has not planned
 * @error: return location for an error
 *
 * Ends describing and plans, as `wsync convert` does from a checkpoint holding the
 * described tensors: every output byte covered exactly once, every described tensor
 * used or dropped by a named rule, the output files named and laid out.  A tensor the
 * target needs that was not described is refused here, by name ("tensor "X" was not
 * described, and the vllm layout needs it (for tensor "Y" of rank 0)"); one the target
 * drops (e.g. the MTP block for vLLM) need not be described.  Computes the manifests,
 * the digest and, for the caller sink, the buckets.
 *
 * Returns: %TRUE, or %FALSE with @error set (the session stays unplanned; free it).
 */
WSYNC_API gboolean wsync_session_plan(WsyncSession *s, GError **error);

/**
 * wsync_session_get_digest:
 * @s: a planned session
 *
 * The plan digest: SHA-256 of the canonical manifest, a text of one line per tensor of
 * every rank after a few lines naming the target, format, tp and ep (the exact text is
 * in docs/session.md).  Equal digests mean equal names, dtypes, shapes, files and
 * offsets on every rank.
 *
 * Returns: (transfer none) (nullable): 64 lowercase hex digits, or %NULL before
 *   planning.
 */
WSYNC_API const char *wsync_session_get_digest(WsyncSession *s);

/**
 * wsync_session_get_world:
 * @s: a planned session
 *
 * Returns: the number of destination ranks (0 before planning).
 */
WSYNC_API guint wsync_session_get_world(WsyncSession *s);

/**
 * wsync_session_get_manifest:
 * @s: a planned session
 * @rank: 0 <= @rank < wsync_session_get_world()
 * @n_entries: (out): how many entries
 *
 * Returns: (transfer none) (array length=n_entries) (nullable): the rank's tensors in
 *   file order (#WsyncManifestEntry), valid as long as @s; %NULL (and 0) before
 *   planning or for a rank out of range.
 */
WSYNC_API const WsyncManifestEntry *wsync_session_get_manifest(WsyncSession *s, guint rank,
                                                               guint *n_entries);

/**
 * wsync_session_begin:
 * @s: a planned session with a sink and no open step
 * @version: the step's version (at most %G_MAXINT64), recorded in the commit record and
 *   the buckets
 * @error: return location for an error
 *
 * Opens a step.  The directory sink first removes the previous commit record (and syncs
 * the directory), so that from here until the next commit a reader sees no complete
 * step; at the first step it creates the rank files (refusing a directory that holds
 * other safetensors files) and maps them.
 *
 * Returns: %TRUE, or %FALSE with @error set.
 */
WSYNC_API gboolean wsync_session_begin(WsyncSession *s, guint64 version, GError **error);

/**
 * wsync_session_push:
 * @s: a session with an open step
 * @name: a tensor described whole
 * @data: (array length=nbytes): its bytes, row-major, in the described dtype; read
 *   during the call only
 * @nbytes: the described shape's size in bytes
 * @error: return location for an error
 *
 * Cuts, casts and packs @data into every destination rank's bytes that come from it,
 * with the session's threads, and returns when they are written.  Any order, any
 * thread; pushes of different tensors may run at once (not concurrently with begin,
 * commit or abort).  A refused push (wrong byte count, unknown name, repeated in the
 * step, no open step) writes nothing and leaves the step open.
 *
 * Caller sink: a bucket's memory is allocated when its first byte arrives and freed
 * when its last byte has arrived and the callback has returned.  In the order of the
 * manifest at most one bucket per rank file is open at a time; in the worst order (every
 * bucket receiving its first tensor before any is complete) every bucket is open at
 * once, i.e. the whole output.  @max_open_buckets caps that: a push that would open more
 * is refused before writing, and can be retried after pushes that complete buckets.
 *
 * Returns: %TRUE when every byte from @data is written (and every bucket it completed
 *   was delivered); %FALSE with @error set.
 */
WSYNC_API gboolean wsync_session_push(WsyncSession *s, const char *name, const void *data,
                                      gsize nbytes, GError **error);

/**
 * wsync_session_push_shard:
 * @s: a session with an open step
 * @name: a tensor described as shards
 * @offsets: (array): the shard's offsets, as described
 * @data: (array length=nbytes): the shard's bytes, row-major over its sizes
 * @nbytes: the shard's size in bytes
 * @error: return location for an error
 *
 * wsync_session_push() for one described shard.
 *
 * Returns: %TRUE, or %FALSE with @error set (also for offsets no shard was described
 *   at).
 */
WSYNC_API gboolean wsync_session_push_shard(WsyncSession *s, const char *name,
                                            const guint64 *offsets, const void *data,
                                            gsize nbytes, GError **error);

/**
 * wsync_session_commit:
 * @s: a session with an open step
 * @error: return location for an error
 *
 * Closes the step.  Refused (%WSYNC_ERROR_BAD_INPUT, naming the first tensor or shard
 * not pushed) while a described tensor was not pushed: the step then stays open, so the
 * missing tensors can still be pushed and the commit retried (or the step abandoned
 * with wsync_session_abort()); the directory holds no commit record meanwhile.
 *
 * Directory sink: flushes the maps, computes the checksum of every rank file
 * (wsync_session_checksum(), from the blocks' hashes the pushes computed), writes
 * config.json (through the config patchers, as `wsync convert` writes it) and the
 * companion files at the first commit, then the commit record (a temporary file,
 * fsync, rename, fsync of the directory).  Caller sink: delivers the buckets that no
 * push fills (fill values only).
 *
 * Returns: %TRUE when the step is complete; %FALSE with @error set.
 */
WSYNC_API gboolean wsync_session_commit(WsyncSession *s, GError **error);

/**
 * wsync_session_abort:
 * @s: a session
 *
 * Abandons the open step, if any (added to the interface: a step whose push or commit
 * failed in the sink cannot be completed, and the next begin needs a closed step).  The
 * caller sink's open buckets are freed undelivered; the directory sink's files keep
 * whatever was written, without a commit record.
 */
WSYNC_API void wsync_session_abort(WsyncSession *s);

/**
 * wsync_session_set_interrupt:
 * @s: a session
 * @flag: (nullable): a flag that a signal handler sets to the signal's number (-1 when
 *   it does not know which signal: the error then names none), or %NULL
 *
 * When @flag becomes nonzero during wsync_session_push() or wsync_session_commit()
 * (as wsync_plan_set_interrupt() for a plan), the call stops at the next piece of work
 * and fails the step with an error naming the signal: a push leaves its tensor written
 * in part, a commit writes no commit record (the directory holds none since the step
 * began), and wsync_session_abort() then closes the step.  A call that begins while the
 * flag is set fails at once; the caller clears it before the next wsync_session_begin().
 * wsync_session_plan() hears it too, between its phases (a plan of a whole model takes
 * seconds): it fails with "planning was interrupted by SIGINT", and the session, failed
 * to plan, is only good for wsync_session_free().
 */
WSYNC_API void wsync_session_set_interrupt(WsyncSession *s, const volatile sig_atomic_t *flag);

/**
 * wsync_session_free:
 * @s: (nullable): a session
 *
 * Abandons an open step, unmaps and closes the rank files (they stay on disk, with the
 * last commit record, if any) and frees the session.
 */
WSYNC_API void wsync_session_free(WsyncSession *s);

/**
 * wsync_session_checksum:
 * @data: (array length=len) (nullable): the bytes of a whole file (%NULL when @len is
 *   0)
 * @len: how many
 *
 * The checksum the commit record gives each rank file (algorithm
 * #WSYNC_SESSION_CHECKSUM_ALGORITHM): the file is cut into blocks of
 * #WSYNC_SESSION_CHECKSUM_BLOCK bytes from its first byte (the last one shorter, none
 * for an empty file); the checksum is the XXH3-64 (seed 0) of the concatenation of the
 * blocks' XXH3-64 (seed 0), each as 8 bytes little-endian.  Blocks, unlike one hash of
 * the whole file, can be hashed in any order: the session hashes each as the pushes
 * complete it, while its bytes are in cache.  A reader of the directory (e.g.
 * `wsync.load_rank`) checks a file against the record with this function;
 * docs/session.md §4 shows how to compute it by hand (Python and libxxhash).
 *
 * Returns: the checksum; the record writes it as 16 lowercase hex digits
 *   (`"%016" G_GINT64_MODIFIER "x"`).
 */
WSYNC_API guint64 wsync_session_checksum(const void *data, gsize len);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(WsyncSession, wsync_session_free)

G_END_DECLS

#endif /* WSYNC_SESSION_H */
