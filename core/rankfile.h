/* wsync: the rank files of a plan's output layouts, byte for byte as `wsync convert`
 * writes them (core/rankfile.c): each file's name, header and tensor offsets, known
 * before any file exists; creating one from its header; and cutting its data into
 * ranges of whole rows that can be filled one at a time, anywhere (a bucket in memory,
 * a map of the file).  Shared by the session (core/session.c) and the distributed sync
 * (core/sync-mpi.c). */
#ifndef WSYNC_RANKFILE_H
#define WSYNC_RANKFILE_H

#include "plan-private.h"

/* One tensor of a rank file. */
typedef struct {
  WsyncLayoutTensor *lt;
  guint64 offset; /* of its data in the file, the header included */
} RankTensor;

/* One file of one rank. */
typedef struct {
  guint rank;
  guint part;
  char *name;       /* base name, as the target names its files */
  guint8 *header;   /* the safetensors header the writer makes for it */
  gsize header_len;
  guint64 size;     /* header and data */
  GArray *tensors;  /* RankTensor, in data order: each starts where the previous ends */
} RankFile;

/* The files of @layout, by part: the safetensors writer's headers with the metadata
 * `wsync convert` writes (so that the headers are convert's) and every tensor's offset.
 * Returns a GPtrArray of RankFile* that frees them. */
GPtrArray *rank_files_new(WsyncPlan *plan, WsyncLayout *layout);

void rank_file_free(gpointer file);

/* Writes @header into the new, empty file @fd (called @path in messages) and sizes it to
 * @size (the header and the data), for the data to be written with pwrite(2) (which
 * fails cleanly on a full disk).  FALSE with @error set when it cannot. */
gboolean rank_file_begin(int fd, const char *path, const guint8 *header, gsize header_len,
                         guint64 size, GError **error);

/* rank_file_begin(), then reserves the file's blocks (so that a full disk is an error
 * here, not a SIGBUS in a write through the map) and maps it shared, read-write; @size
 * is never 0 (it holds the header).  Returns the map, or NULL with @error set. */
guint8 *rank_file_map_new(int fd, const char *path, const guint8 *header, gsize header_len,
                          guint64 size, GError **error);

/* ------------------------------------------------------------------ ranges */

/* Rows [from, to) of one tensor of a rank file (rows along its first axis; a scalar is
 * one row). */
typedef struct {
  const RankTensor *tensor; /* in its file's tensors */
  guint64 from, to;
} RankPiece;

/* Consecutive data bytes of a rank file, made of whole rows of its tensors. */
typedef struct {
  guint64 offset; /* in the file, the header included */
  guint64 nbytes;
  GArray *pieces; /* RankPiece, in file order */
} RankRange;

/* Cuts the data of @file into ranges of at most @max_bytes, each made of whole rows: a
 * range starts a tensor's rows where the previous one is full, so a tensor larger than
 * @max_bytes spans several, and a single row larger than @max_bytes is a range of its
 * own.  Together they hold every data byte once, in file order.  Returns a GPtrArray of
 * RankRange* that frees them. */
GPtrArray *rank_file_cut(const RankFile *file, guint64 max_bytes);

/* A piece of work that writes part of a range: one of the plan's copy ops limited to the
 * range's rows (cut along its first axis into runs of at most RANK_ITEM_BYTES), or one of
 * its fills limited to them. */
typedef struct {
  const WsyncPlan *plan;
  const WsyncLayoutTensor *lt; /* the output tensor (its name for messages) */
  guint op;          /* op @op of @lt: kept as a reference, rebuilt on the stack when the
                      * item runs (a whole Op is ~700 bytes) */
  gboolean is_fill;
  guint64 from, to;  /* the range's rows of @lt */
  /* a copy: the op limited to those rows */
  guint cut_axis;    /* the op's axis cut to the rows (RANK_ITEM_UNCUT: none) */
  guint64 cut_extent; /* its extent then */
  guint64 dst_origin; /* the op's origins moved to the rows, the destination relative to */
  guint64 src_origin; /* row @from */
  guint64 outer_from, outer_to; /* the rows of the op's first axis this item runs */
  guint64 at;       /* where the tensor's first row in the range is, from the range's start */
  guint64 bytes;    /* output bytes the item writes */
  const char *file; /* the rank file, for messages */
} RankItem;

#define RANK_ITEM_UNCUT G_MAXUINT

#define RANK_ITEM_BYTES (8u << 20)

/* Appends to @items (a GArray of RankItem) the work that writes every byte of @range of
 * @file, wherever the range's bytes are put (rank_item_run()).  The items write disjoint
 * bytes: any threads may run them at once. */
void rank_range_items(const WsyncPlan *plan, const RankFile *file, const RankRange *range,
                      GArray *items);

/* Runs @item into the range whose first byte is at @base (a bucket, or the file's map at
 * the range's offset), behind the SIGBUS guard of wsync_run_guarded(): a mapped input
 * file that shrank while it was read (or a mapped output file) is an I/O error naming
 * the file and tensor, not a crash.  Returns FALSE with @error set then. */
gboolean rank_item_run(const RankItem *item, guint8 *base, GError **error);

/* When @item copies one contiguous run of input bytes, unchanged, to one contiguous run
 * of the range (no cast, no transpose, no fill): TRUE, with the input bytes at *@src and
 * where they go in the range (*@at, *@nbytes).  Those bytes can be sent from the input's
 * map as they are. */
gboolean rank_item_run_of_input(const RankItem *item, const guint8 **src, guint64 *at,
                                guint64 *nbytes);

#endif /* WSYNC_RANKFILE_H */
