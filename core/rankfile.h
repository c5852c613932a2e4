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
  char *name;       /* base name, e.g. model-rank-0-part-0.safetensors */
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

/* Writes @header into the new, empty file @fd (called @path in messages), sizes it to
 * @size (the header and the data: never 0), reserves its blocks (so that a full disk is
 * an error here, not a SIGBUS in a write through the map) and maps it shared,
 * read-write.  Returns the map, or NULL with @error set. */
guint8 *rank_file_map_new(int fd, const char *path, const guint8 *header, gsize header_len,
                          guint64 size, GError **error);

#endif /* WSYNC_RANKFILE_H */
