/* wsync: what the executor needs of a safetensors writer beyond the public API. */
#ifndef WSYNC_SAFETENSORS_PRIVATE_H
#define WSYNC_SAFETENSORS_PRIVATE_H

#include <wsync/safetensors.h>

/* The file descriptor of a writer that has begun (open for reading and writing), for
 * pwrite(2) and copy_file_range(2) from several threads. */
int safetensors_writer_fd(WsyncSafetensorsWriter *w);

/* Where tensor @name's first byte lies in the file of a writer that has begun (header
 * included); FALSE when @name was not declared. */
gboolean safetensors_writer_file_offset(WsyncSafetensorsWriter *w, const char *name,
                                        guint64 *offset);

/* When @data (@len bytes) lies in a file opened by wsync_safetensors_open() whose
 * descriptor is kept: that descriptor (read-only, owned by the file) and the offset of
 * @data in the file.  FALSE otherwise: read it through the map. */
gboolean safetensors_source_file(const guint8 *data, guint64 len, int *fd, guint64 *offset);

#endif /* WSYNC_SAFETENSORS_PRIVATE_H */
