/* wsync: open a file to read without opening what is not one, without reading a file
 * swapped in after it was judged, and one refusal for a socket, a FIFO or a device where
 * a file is read.
 *
 * Two things to hold at once:
 *  - a device, a FIFO or a socket named as an input is refused without being opened:
 *    opening some devices does something (a watchdog, /dev/watchdog, arms; a tape
 *    rewinds when closed), and a blocking open(2) of a FIFO waits for a writer for ever.
 *    So the path is stat()ed first and only a regular file or a directory is opened.
 *  - what is read is what was judged: a path replaced between that stat() and the
 *    open(2) (a FIFO renamed over it) must not be read.  So the open is O_NONBLOCK (a
 *    FIFO swapped in cannot hang it), and fstat() of the descriptor must show the file
 *    the stat() saw: the same kind, st_dev and st_ino, else nothing is read.
 * (tests/swap-after-stat.c makes both happen every time: it swaps a path right after it
 * is stat()ed, and logs every open(2) of a path.)
 *
 * Inline, with no call into libwsync: the Python module (python/load.c) includes it too.
 */
#ifndef WSYNC_FILEKIND_H
#define WSYNC_FILEKIND_H

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* errno of wsync_file_open_judged() when @path was replaced, between its stat() and its
 * open(2), by another file that is not a FIFO, a socket or a device (those are refused
 * as they are).  No system call sets it: one above the largest errno the kernel returns
 * (MAX_ERRNO, 4095, linux include/linux/err.h), so it cannot be a real failure mistaken
 * for a replacement (EAGAIN, its old value, is also open(2)'s answer for O_NONBLOCK on a
 * file under a lease).  wsync_set_io_error() words it WSYNC_FILE_REPLACED_WORDS after the
 * path, so every reader that turns errno into its message says what happened. */
#define WSYNC_FILE_REPLACED_ERRNO 4096
#define WSYNC_FILE_REPLACED_WORDS "was replaced while it was being opened; nothing was read"

/* TRUE when @a and @b describe the same file: the same kind, device and inode. */
static inline int
wsync_file_same(const struct stat *a, const struct stat *b)
{
  return (a->st_mode & S_IFMT) == (b->st_mode & S_IFMT) && a->st_dev == b->st_dev &&
         a->st_ino == b->st_ino;
}

/* Opens @path to read it (with @nofollow, a symlink as its last component is refused
 * with ELOOP, as open(2) with O_NOFOLLOW refuses it) and fills @st.  Returns:
 *   a descriptor (blocking reads) of a regular file or a directory, which the caller
 *     tells apart by @st (from fstat() of the descriptor);
 *   -1 with *@kind set ("a FIFO", from wsync_file_special_kind()) for a socket, a FIFO
 *     or a device: nothing is left open, @st describes it, and unless it was swapped in
 *     after the stat() it was never opened;
 *   -1 with *@kind NULL when stat(), open(2) or fstat() failed, errno saying why, or
 *     when the path was replaced by another file between the stat() and the open(2):
 *     errno is then WSYNC_FILE_REPLACED_ERRNO. */
static inline int
wsync_file_open_judged(const char *path, int nofollow, struct stat *st, const char **kind)
{
  struct stat before;

  *kind = NULL;
  if ((nofollow ? lstat(path, &before) : stat(path, &before)) != 0)
    return -1;
  if (nofollow && S_ISLNK(before.st_mode)) {
    *st = before;
    errno = ELOOP;
    return -1;
  }
  if ((*kind = wsync_file_special_kind(before.st_mode)) != NULL) { /* not opened */
    *st = before;
    return -1;
  }
  /* O_NONBLOCK: a FIFO swapped in after the stat() must not wait for a writer; O_NOCTTY:
   * nor may a terminal swapped in become the controlling terminal */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (nofollow ? O_NOFOLLOW : 0));
  if (fd < 0) {
    int errsv = errno;
    /* ENXIO: a socket swapped in (open(2) of one fails so) is refused as one */
    if (errsv == ENXIO && (nofollow ? lstat(path, st) : stat(path, st)) == 0)
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
  *kind = wsync_file_special_kind(st->st_mode);
  if (*kind != NULL || !wsync_file_same(&before, st)) {
    close(fd);
    errno = WSYNC_FILE_REPLACED_ERRNO;
    return -1;
  }
  int flags = fcntl(fd, F_GETFL);
  if (flags >= 0)
    fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

/* wsync_file_open_judged() following symlinks: what the readers of a checkpoint use. */
static inline int
wsync_file_open_input(const char *path, struct stat *st, const char **kind)
{
  return wsync_file_open_judged(path, 0, st, kind);
}

#endif /* WSYNC_FILEKIND_H */
