/* An LD_PRELOAD shim for the tests: makes "a path replaced between stat() and open()"
 * happen every time, deterministically, instead of once in a while in a race; and lets a
 * test see which paths were opened, and make a directory unreadable even to root.
 *
 * When the process stat()s a path whose last component is $WSYNC_SWAP_NAME, the real
 * stat() runs, and then $WSYNC_SWAP_WITH (a FIFO or another file the test made) is
 * renamed over that path, before the stat() returns.  A reader that stat()s and then
 * opens the same path opens the file swapped in: it must see, by fstat() of what it
 * opened, that this is not the file it judged (core/filekind.h).  The rename(2) happens
 * once: afterwards $WSYNC_SWAP_WITH is gone.  fstat() is left alone (it looks at what
 * is open), and so is lstat() unless $WSYNC_SWAP_AFTER_LSTAT is set: the trusted files
 * (conf.d, plugins) are lstat()ed and opened O_NOFOLLOW, where most lstat()s are
 * followed by no open of the same path (a plugin directory's listing).
 *
 * Every open(2) of a path whose last component is $WSYNC_OPEN_NAME appends that path
 * and a newline to the file $WSYNC_OPEN_LOG: a FIFO or a device refused "without being
 * opened" leaves no line there.
 *
 * opendir(3) of a path whose last component is $WSYNC_DENY_OPENDIR fails with EACCES,
 * as it does for a user without read permission (the tests run as root, whom mode bits
 * do not stop).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* TRUE when the last component of @path is $@var */
static int
named(const char *path, const char *var)
{
  const char *name = getenv(var);
  if (path == NULL || name == NULL)
    return 0;
  const char *slash = strrchr(path, '/');
  return strcmp(slash != NULL ? slash + 1 : path, name) == 0;
}

static void
swap_if_named(int dir, const char *path)
{
  const char *with = getenv("WSYNC_SWAP_WITH");
  if (with != NULL && named(path, "WSYNC_SWAP_NAME"))
    renameat(AT_FDCWD, with, dir, path);
}

static void
swap_if_named_after_lstat(int dir, const char *path)
{
  if (getenv("WSYNC_SWAP_AFTER_LSTAT") != NULL)
    swap_if_named(dir, path);
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
  else if (!(flags & AT_EMPTY_PATH))
    swap_if_named_after_lstat(dir, path);
  return r;
}

int
fstatat64(int dir, const char *path, struct stat64 *st, int flags)
{
  REAL(int, "fstatat64", int, const char *, struct stat64 *, int);
  int r = real(dir, path, st, flags);
  if (!(flags & (AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH)))
    swap_if_named(dir, path);
  else if (!(flags & AT_EMPTY_PATH))
    swap_if_named_after_lstat(dir, path);
  return r;
}

int
lstat(const char *path, struct stat *st)
{
  REAL(int, "lstat", const char *, struct stat *);
  int r = real(path, st);
  swap_if_named_after_lstat(AT_FDCWD, path);
  return r;
}

int
lstat64(const char *path, struct stat64 *st)
{
  REAL(int, "lstat64", const char *, struct stat64 *);
  int r = real(path, st);
  swap_if_named_after_lstat(AT_FDCWD, path);
  return r;
}

/* ---------------------------------------------------------------- the open log */

static void
log_open(const char *path)
{
  const char *log = getenv("WSYNC_OPEN_LOG");
  if (log == NULL || !named(path, "WSYNC_OPEN_NAME"))
    return;
  /* the system call itself: the open() below would come back here */
  int fd = (int)syscall(SYS_openat, AT_FDCWD, log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0)
    return;
  if (write(fd, path, strlen(path)) < 0 || write(fd, "\n", 1) < 0)
    perror(log);
  close(fd);
}

/* the mode argument, there only with O_CREAT or O_TMPFILE */
#define MODE_ARG(flags, last) \
  mode_t mode = 0; \
  if ((flags) & (O_CREAT | O_TMPFILE)) { \
    va_list ap; \
    va_start(ap, last); \
    mode = (mode_t)va_arg(ap, int); \
    va_end(ap); \
  }

int
open(const char *path, int flags, ...)
{
  MODE_ARG(flags, flags);
  REAL(int, "open", const char *, int, ...);
  log_open(path);
  return real(path, flags, mode);
}

int
open64(const char *path, int flags, ...)
{
  MODE_ARG(flags, flags);
  REAL(int, "open64", const char *, int, ...);
  log_open(path);
  return real(path, flags, mode);
}

int
openat(int dir, const char *path, int flags, ...)
{
  MODE_ARG(flags, flags);
  REAL(int, "openat", int, const char *, int, ...);
  log_open(path);
  return real(dir, path, flags, mode);
}

int
openat64(int dir, const char *path, int flags, ...)
{
  MODE_ARG(flags, flags);
  REAL(int, "openat64", int, const char *, int, ...);
  log_open(path);
  return real(dir, path, flags, mode);
}

/* what _FORTIFY_SOURCE makes of an open() whose flags are not a constant */
int
__open_2(const char *path, int flags)
{
  REAL(int, "__open_2", const char *, int);
  log_open(path);
  return real(path, flags);
}

int
__open64_2(const char *path, int flags)
{
  REAL(int, "__open64_2", const char *, int);
  log_open(path);
  return real(path, flags);
}

/* ---------------------------------------------------------------- unreadable directories */

DIR *
opendir(const char *path)
{
  REAL(DIR *, "opendir", const char *);
  if (named(path, "WSYNC_DENY_OPENDIR")) {
    errno = EACCES;
    return NULL;
  }
  return real(path);
}
