/* wsync: open a file to read without a stat() before it, and one refusal for a socket,
 * a FIFO or a device where a file is read.
 *
 * A reader that stat()ed a path and then opened it looked at two files when the path
 * was replaced in between: a FIFO swapped in after the stat() hung a blocking open(2)
 * for ever.  wsync_file_open_input() opens first (O_NONBLOCK, so that opening a FIFO
 * does not wait for a writer) and asks fstat() of the descriptor what was opened.
 *
 * open(2) of a Unix socket fails with ENXIO (Linux, open(2): "the file is a UNIX domain
 * socket") before fstat() can say what it is: only then is the path stat()ed, to word
 * the refusal of a socket as that of a FIFO ("X: is a socket, not a regular file", exit
 * 3, not "cannot open X: No such device or address", exit 4).  Nothing is read after
 * that stat(), so a replaced path can change the words of the refusal, never what is
 * read.
 *
 * Inline, and built on the public wsync_fail_at() only: the command (core/cli.c), which
 * links nothing private of libwsync, refuses its CONFIG.json with it too.
 */
#ifndef WSYNC_FILEKIND_H
#define WSYNC_FILEKIND_H

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* Opens @path, following symlinks, to read it, and fills @st from fstat() of the
 * descriptor.  Returns:
 *   a descriptor (back to blocking reads) of what is not a socket, a FIFO or a device:
 *     a regular file or a directory, which the caller tells apart by @st;
 *   -1 with *@kind set ("a FIFO", from wsync_file_special_kind()) for one that is:
 *     nothing is left open, and @st describes it;
 *   -1 with *@kind NULL when open(2) or fstat() failed: errno says why. */
static inline int
wsync_file_open_input(const char *path, struct stat *st, const char **kind)
{
  /* O_NONBLOCK: opening a FIFO must not wait for a writer; O_NOCTTY: a terminal
   * device named by mistake does not become the controlling terminal */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);

  *kind = NULL;
  if (fd < 0) {
    int errsv = errno;
    if (errsv == ENXIO && stat(path, st) == 0) /* a socket (see above) */
      *kind = wsync_file_special_kind(st->st_mode);
    errno = errsv;
    return -1;
  }
  if (fstat(fd, st) != 0) {
    int errsv = errno;
    close(fd);
    errno = errsv;
    return -1;
  }
  if ((*kind = wsync_file_special_kind(st->st_mode)) != NULL) {
    close(fd);
    return -1;
  }
  int flags = fcntl(fd, F_GETFL);
  if (flags >= 0)
    fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

/* Refuses @path, following symlinks, when it is a socket, a FIFO or a device: an error
 * of class @code "PATH: is a socket, not a regular file" (the path made printable).
 * Returns TRUE when it is none of them, or cannot be opened (the open that follows says
 * why).  It opens and fstat()s (wsync_file_open_input()), so it cannot block on a FIFO;
 * but the caller opens again after it: that open must refuse by its own fstat() what is
 * not a regular file (wsync_file_open_regular() does, in the same words), as the path
 * may have been replaced in between. */
static inline gboolean
wsync_file_check_not_special(const char *path, WsyncError code, GError **error)
{
  struct stat st;
  const char *kind;
  int fd = wsync_file_open_input(path, &st, &kind);

  if (fd >= 0)
    close(fd);
  if (kind == NULL)
    return TRUE;
  return wsync_fail_at(error, code, path, "is %s, not a regular file", kind);
}

#endif /* WSYNC_FILEKIND_H */
