/* An LD_PRELOAD shim for the tests: makes "a path replaced between stat() and open()"
 * happen every time, deterministically, instead of once in a while in a race.
 *
 * When the process stat()s a path whose last component is $WSYNC_SWAP_NAME, the real
 * stat() runs, and then $WSYNC_SWAP_WITH (a FIFO the test made) is renamed over that
 * path, before the stat() returns.  A reader that stat()s and then opens the same path
 * opens the FIFO; one that opens first and fstat()s the descriptor never stat()s it by
 * name, and reads the file that was there.  The rename(2) happens once: afterwards
 * $WSYNC_SWAP_WITH is gone.  lstat() and fstat() are left alone (neither is the
 * stat-then-open pattern: an lstat() is followed by no open of the same meaning, an
 * fstat() looks at what is open).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void
swap_if_named(int dir, const char *path)
{
  const char *name = getenv("WSYNC_SWAP_NAME");
  const char *with = getenv("WSYNC_SWAP_WITH");
  if (path == NULL || name == NULL || with == NULL)
    return;
  const char *slash = strrchr(path, '/');
  if (strcmp(slash != NULL ? slash + 1 : path, name) == 0)
    renameat(AT_FDCWD, with, dir, path);
}

#define REAL(type, name, ...) \
  static type (*real)(__VA_ARGS__); \
  if (real == NULL) \
    real = (type (*)(__VA_ARGS__))dlsym(RTLD_NEXT, name)

int
stat(const char *path, struct stat *st)
{
  REAL(int, "stat", const char *, struct stat *);
  int r = real(path, st);
  swap_if_named(AT_FDCWD, path);
  return r;
}

int
stat64(const char *path, struct stat64 *st)
{
  REAL(int, "stat64", const char *, struct stat64 *);
  int r = real(path, st);
  swap_if_named(AT_FDCWD, path);
  return r;
}

int
fstatat(int dir, const char *path, struct stat *st, int flags)
{
  REAL(int, "fstatat", int, const char *, struct stat *, int);
  int r = real(dir, path, st, flags);
  if (!(flags & (AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH)))
    swap_if_named(dir, path);
  return r;
}

int
fstatat64(int dir, const char *path, struct stat64 *st, int flags)
{
  REAL(int, "fstatat64", int, const char *, struct stat64 *, int);
  int r = real(dir, path, st, flags);
  if (!(flags & (AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH)))
    swap_if_named(dir, path);
  return r;
}
