/* wsync: one refusal for a socket, a FIFO or a device where a file is read.
 *
 * open(2) of a Unix socket fails with ENXIO (Linux, open(2): "the file is a UNIX domain
 * socket") before fstat() can say what it is: a socket was "cannot open X: No such
 * device or address" (exit 4) where a FIFO was "X: is a FIFO, not a regular file"
 * (exit 3).  The readers ask here before they open, so that a socket is refused as a
 * FIFO is at the same place: those that read through core/files.c in its words
 * (wsync_file_check_not_special()), the safetensors and DCP readers in their own
 * (wsync_file_special_kind()).
 *
 * Inline, and built on the public wsync_fail_at() only: the command (core/cli.c), which
 * links nothing private of libwsync, refuses its CONFIG.json with it too.
 */
#ifndef WSYNC_FILEKIND_H
#define WSYNC_FILEKIND_H

#include <sys/stat.h>

#include <wsync/error.h>

/* "a socket", "a FIFO" or "a device" for a file of mode @mode that is one, else NULL
 * (a regular file, a directory, a symlink). */
static inline const char *
wsync_file_special_kind(mode_t mode)
{
  if (S_ISSOCK(mode))
    return "a socket";
  if (S_ISFIFO(mode))
    return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode))
    return "a device";
  return NULL;
}

/* Refuses @path, following symlinks, when it is a socket, a FIFO or a device: an error
 * of class @code "PATH: is a socket, not a regular file" (the path made printable).
 * Returns TRUE when it is none of them, or cannot be stat()ed (the open that follows
 * says why). */
static inline gboolean
wsync_file_check_not_special(const char *path, WsyncError code, GError **error)
{
  struct stat st;
  const char *kind;

  if (stat(path, &st) != 0 || (kind = wsync_file_special_kind(st.st_mode)) == NULL)
    return TRUE;
  return wsync_fail_at(error, code, path, "is %s, not a regular file", kind);
}

#endif /* WSYNC_FILEKIND_H */
