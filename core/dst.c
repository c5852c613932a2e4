/* wsync: the output directory DST: the checks before it is written and replaced, the
 * temporary sibling the output is written into, the marker, and the swap into place.
 * (Moved from core/exec.c; shared with the distributed sync.) */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include <wsync/plan.h>

#include "dst.h"
#include "files.h"

/* ------------------------------------------------------------------ DST */

void
dst_clear(Dst *d)
{
  g_free(d->path);
  g_free(d->parent);
  g_free(d->base);
}

gboolean
dst_parse(const char *arg, Dst *d, GError **error)
{
  gsize len = strlen(arg);

  while (len > 1 && arg[len - 1] == '/')
    len--;
  d->path = g_strndup(arg, len);
  d->parent = g_path_get_dirname(d->path);
  d->base = g_path_get_basename(d->path);
  if (len == 0 || strcmp(d->path, "/") == 0 || strcmp(d->base, ".") == 0 ||
      strcmp(d->base, "..") == 0)
    return wsync_fail_at(error, WSYNC_ERROR_USAGE, arg[0] ? arg : "\"\"",
                         "DST must name the output directory itself (not /, . or ..)");
  return TRUE;
}

static gboolean
same_file(const struct stat *a, const struct stat *b)
{
  return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* The stat of @path's resolved self and of every directory above it, self first. */
static GArray *
ancestry(const char *path)
{
  g_autofree char *real = realpath(path, NULL);
  GArray *chain = g_array_new(FALSE, FALSE, sizeof(struct stat));

  for (char *at = g_steal_pointer(&real); at != NULL;) {
    struct stat st;
    if (stat(at, &st) == 0)
      g_array_append_val(chain, st);
    char *up = strcmp(at, "/") == 0 ? NULL : g_path_get_dirname(at);
    g_free(at);
    at = up;
  }
  return chain;
}

/* The nearest directory at or above @path that exists. */
static char *
nearest_existing(const char *path)
{
  char *at = g_strdup(path);

  while (!g_file_test(at, G_FILE_TEST_EXISTS) && strcmp(at, "/") != 0 && strcmp(at, ".") != 0) {
    char *up = g_path_get_dirname(at);
    g_free(at);
    at = up;
  }
  return at;
}

/* DST must not be SRC, contain SRC or lie inside SRC: replacing it would destroy the
 * source.  Compared by device and inode, so no spelling (symlinks, "..", bind mounts
 * aside) gets around it. */
gboolean
check_not_source(const char *src, const Dst *d, GError **error)
{
  struct stat src_st, dst_st;

  if (src == NULL || stat(src, &src_st) != 0)
    return TRUE;
  g_autoptr(GArray) src_chain = ancestry(src);
  if (stat(d->path, &dst_st) == 0)
    for (guint i = 0; i < src_chain->len; i++)
      if (same_file(&g_array_index(src_chain, struct stat, i), &dst_st)) {
        g_autofree char *psrc = wsync_printable(src);
        return wsync_fail_at(error, WSYNC_ERROR_USAGE, d->path,
                             "DST %s the source %s; write the output elsewhere",
                             i == 0 ? "is" : "contains", psrc);
      }
  if (!S_ISDIR(src_st.st_mode))
    return TRUE;
  g_autofree char *existing = nearest_existing(d->parent);
  g_autoptr(GArray) dst_chain = ancestry(existing);
  for (guint i = 0; i < dst_chain->len; i++)
    if (same_file(&g_array_index(dst_chain, struct stat, i), &src_st)) {
      g_autofree char *psrc = wsync_printable(src);
      return wsync_fail_at(error, WSYNC_ERROR_USAGE, d->path,
                           "DST lies inside the source %s; write the output elsewhere", psrc);
    }
  return TRUE;
}

/* TRUE when the directory @path has no entries at all. */
static gboolean
dir_is_empty(const char *path)
{
  g_autoptr(GDir) dir = g_dir_open(path, 0, NULL);
  return dir != NULL && g_dir_read_name(dir) == NULL;
}

/* An existing DST may be replaced only when it is a real directory (never through a
 * symlink) that wsync wrote (it holds the marker, a regular file), or that is empty, or
 * with --force. */
gboolean
check_replaceable(const Dst *d, gboolean force, GError **error)
{
  struct stat st;

  if (lstat(d->path, &st) != 0) {
    if (errno == ENOENT)
      return TRUE;
    wsync_set_io_error(error, errno, d->path, "stat");
    return FALSE;
  }
  if (S_ISLNK(st.st_mode))
    return wsync_fail_at(error, WSYNC_ERROR_USAGE, d->path,
                         "DST is a symlink; wsync neither writes through nor replaces one: give "
                         "the directory itself");
  if (!S_ISDIR(st.st_mode))
    return wsync_fail_at(error, WSYNC_ERROR_USAGE, d->path, "DST exists and is not a directory");
  g_autofree char *marker = g_build_filename(d->path, WSYNC_OUTPUT_MARKER, NULL);
  struct stat mst;
  if ((lstat(marker, &mst) == 0 && S_ISREG(mst.st_mode)) || force || dir_is_empty(d->path))
    return TRUE;
  return wsync_fail_at(error, WSYNC_ERROR_USAGE, d->path,
                       "DST exists and is not wsync's output (it has no " WSYNC_OUTPUT_MARKER
                       " file); move it away, or pass --force to replace it and everything in "
                       "it");
}

/* ------------------------------------------------------------------ the temporary directory */

#define TEMP_INFIX ".wsync-"
#define TEMP_RANDOM 6

/* ".BASE.wsync-XXXXXX" */
static gboolean
is_temp_name(const char *name, const char *base)
{
  gsize blen = strlen(base), ilen = strlen(TEMP_INFIX);

  if (name[0] != '.' || strncmp(name + 1, base, blen) != 0 ||
      strncmp(name + 1 + blen, TEMP_INFIX, ilen) != 0)
    return FALSE;
  const char *rest = name + 1 + blen + ilen;
  if (strlen(rest) != TEMP_RANDOM)
    return FALSE;
  for (const char *p = rest; *p; p++)
    if (!g_ascii_isalnum(*p))
      return FALSE;
  return TRUE;
}

/* Every run holds an exclusive flock(2) on its temporary directory until it ends; the
 * kernel drops it when the process dies, even by kill -9.  A temporary of DST that this
 * user owns and that nobody holds is therefore left over by a run that is no longer
 * running: it is removed (holding its lock, so that no new run can take it meanwhile). */
static void
remove_stale_temps(const Dst *d)
{
  g_autoptr(GDir) dir = g_dir_open(d->parent, 0, NULL);
  const char *name;

  while (dir != NULL && (name = g_dir_read_name(dir)) != NULL)
    if (is_temp_name(name, d->base)) {
      g_autofree char *path = g_build_filename(d->parent, name, NULL);
      wsync_remove_abandoned_temp(path);
    }
}

/* Creates and locks a fresh ".BASE.wsync-XXXXXX" next to DST.  mkdir(0777) lets the
 * user's umask decide its mode, as for any directory the user creates (g_mkdtemp's 0700
 * would keep an inference server running as another user out). */
char *
make_temp(const Dst *d, int *lock_fd, GError **error)
{
  static const char chars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

  /* like mkdir -p for the parent: `wsync convert SRC out/rank-files` should just work */
  if (g_mkdir_with_parents(d->parent, 0777) != 0) {
    wsync_set_io_error(error, errno, d->parent, "create");
    return NULL;
  }
  remove_stale_temps(d);
  for (int attempt = 0; attempt < 100; attempt++) {
    char random[TEMP_RANDOM + 1] = {0};
    for (int i = 0; i < TEMP_RANDOM; i++)
      random[i] = chars[g_random_int_range(0, sizeof chars - 1)];
    g_autofree char *path = g_strdup_printf("%s/.%s" TEMP_INFIX "%s", d->parent, d->base, random);
    if (mkdir(path, 0777) != 0) {
      if (errno == EEXIST)
        continue;
      /* DST first: the user typed it, not the hidden name */
      int errsv = errno;
      g_autofree char *pdst = wsync_printable(d->path);
      g_autofree char *ppath = wsync_printable(path);
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_IO,
                  "cannot write %s: cannot create its temporary sibling %s: %s", pdst, ppath,
                  g_strerror(errsv));
      return NULL;
    }
    /* Another run's clean-up may see the directory between mkdir and flock, take it for
     * stale and remove it: then the lock fails, or the directory is gone (no links). */
    int fd = wsync_dir_lock(path);
    if (fd >= 0) {
      *lock_fd = fd;
      return g_steal_pointer(&path);
    }
  }
  wsync_set_io_error(error, EEXIST, d->parent, "create a temporary directory in");
  return NULL;
}

/* The marker, written last: a directory that has it is complete and wsync's. */
gboolean
write_marker(const char *dir, GError **error)
{
  g_autofree char *path = g_build_filename(dir, WSYNC_OUTPUT_MARKER, NULL);
  static const char text[] =
      "This directory was written by wsync " PACKAGE_VERSION ".\n"
      "A later wsync run into it replaces it whole; without this file, wsync refuses to.\n";

  return wsync_file_write_synced(path, FALSE, text, sizeof text - 1, error) &&
         wsync_dir_sync(dir, error);
}

/* Syncs DST's parent after the rename that put the new DST there: NULL when done, else
 * the error ("cannot sync PARENT: ERRNO").  WSYNC_TEST_FAIL_SWAP_SYNC (for tests: no file
 * system at hand fails fsync on demand) makes it fail with EIO.  Called once per swap: a
 * second fsync(2) after a failed one may succeed without having written anything. */
static GError *
sync_parent(const Dst *d)
{
  GError *sync_error = NULL;

  if (g_getenv("WSYNC_TEST_FAIL_SWAP_SYNC") != NULL)
    wsync_set_io_error(&sync_error, EIO, d->parent, "sync");
  else
    wsync_dir_sync(d->parent, &sync_error);
  return sync_error;
}

/* The error of a swap done whose parent could not be synced (@sync_error, freed).  The
 * rename is done, so it says first that DST is in place, then the directory and the errno
 * ("cannot sync PARENT: ..." alone read, and the distributed sync reported it, as though
 * DST had not been replaced), then, when @previous is not NULL, where the previous DST is
 * kept (keep_previous()) and that the user may remove it. */
static gboolean
not_durable(const Dst *d, GError *sync_error, const char *previous, GError **error)
{
  g_autofree char *pdst = wsync_printable(d->path);
  g_autofree char *kept = NULL;

  if (previous != NULL) {
    g_autofree char *pprev = wsync_printable(previous);
    g_autofree char *name = g_path_get_basename(previous);
    kept = g_strdup_printf("; the previous output is kept as %s%s: remove it once the new one "
                           "is confirmed",
                           pprev,
                           is_temp_name(name, d->base) ? " (the next run into DST removes it)"
                                                       : "");
  }
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_IO,
              "%s is in place, but its durability is not confirmed (it may not survive a "
              "crash): %s%s",
              pdst, sync_error->message, kept ? kept : ""); /* "cannot sync PARENT: ERRNO" */
  g_error_free(sync_error);
  return FALSE;
}

#define PREVIOUS_INFIX ".wsync-previous"
#define PREVIOUS_TRIES 100

/* The previous DST, now at @tmp after the swap, kept when the swap is not known to be
 * durable: removing it then could leave neither output after a crash, since a file
 * system that does not order directory operations may keep the removal and lose the
 * rename that put the new DST in place (after a failed fsync(2), Linux may drop the
 * entries it could not write).  It is renamed (never copied, never removed) to
 * "BASE.wsync-previous" beside DST ("BASE.wsync-previous-2", ... when taken), a visible
 * name that no run removes, unlike the temporary's (remove_stale_temps()).  Returns
 * where it is: that name, or @tmp itself when no rename succeeded. */
static char *
keep_previous(const char *tmp, const Dst *d)
{
  for (int i = 1; i <= PREVIOUS_TRIES; i++) {
    g_autofree char *path =
        i == 1 ? g_strdup_printf("%s/%s" PREVIOUS_INFIX, d->parent, d->base)
               : g_strdup_printf("%s/%s" PREVIOUS_INFIX "-%d", d->parent, d->base, i);
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) == 0)
      return g_steal_pointer(&path);
    if (errno != EEXIST && errno != ENOTEMPTY)
      break;
  }
  return g_strdup(tmp);
}

/* Puts the finished @tmp at DST: renamed when there is none, else swapped atomically
 * with it (RENAME_EXCHANGE swaps the directory entries, never what a symlink points
 * to, and DST was checked not to be one), and the previous DST, now at @tmp, removed.
 * The parent is synced so that the new name survives a crash.
 *
 * When that sync fails, DST has been replaced all the same: *@swapped says so, and the
 * error says "is in place, but its durability is not confirmed".  It is still a
 * failure (WSYNC_ERROR_IO, exit 4), as every failed fsync of wsync's output is
 * (write_marker(), the file writes, core/session.c's commit record): a run that ends 0
 * promises an output that survives a crash, and after a failed fsync(2) the kernel may
 * have dropped the entry it could not write, so no later fsync can confirm it.  The
 * previous DST is then kept, not removed (keep_previous()), and the error says where. */
gboolean
install_dir(const char *tmp, const Dst *d, gboolean force, gboolean *swapped, GError **error)
{
  if (swapped != NULL)
    *swapped = FALSE;
  /* checked again: DST may have changed while the run was writing */
  if (!check_replaceable(d, force, error))
    return FALSE;
  if (renameat2(AT_FDCWD, tmp, AT_FDCWD, d->path, RENAME_NOREPLACE) == 0) {
    if (swapped != NULL)
      *swapped = TRUE;
    GError *sync_error = sync_parent(d);
    return sync_error == NULL || not_durable(d, sync_error, NULL, error);
  }
  if (errno != EEXIST && errno != ENOTEMPTY) {
    wsync_set_io_error(error, errno, d->path, "rename into place");
    return FALSE;
  }
  if (renameat2(AT_FDCWD, tmp, AT_FDCWD, d->path, RENAME_EXCHANGE) != 0) {
    wsync_set_io_error(error, errno, d->path, "swap into place");
    return FALSE;
  }
  if (swapped != NULL)
    *swapped = TRUE;
  GError *sync_error = sync_parent(d);
  if (sync_error == NULL) {
    wsync_remove_tree(tmp, NULL); /* now the previous DST; a later run removes what is left */
    return TRUE;
  }
  g_autofree char *previous = keep_previous(tmp, d);
  return not_durable(d, sync_error, previous, error);
}
