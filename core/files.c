/* wsync: bounded reads, trusted files and safe tree removal (see files.h). */
#define _GNU_SOURCE
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "filekind.h"
#include "files.h"
#include "json-check.h"

/* ------------------------------------------------------------------ bounded reads */

static const char *
file_kind(mode_t mode)
{
  if (S_ISDIR(mode))
    return "a directory";
  if (S_ISFIFO(mode))
    return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode))
    return "a device";
  if (S_ISSOCK(mode))
    return "a socket";
  return "not a regular file";
}

int
wsync_file_open_regular(const char *path, gboolean nofollow, WsyncError code, struct stat *st,
                        GError **error)
{
  /* stat()ed first: a FIFO or a device is refused without being opened; opened
   * O_NONBLOCK and fstat()ed: a file swapped in after the stat() is not read
   * (core/filekind.h) */
  const char *special;
  int fd = wsync_file_open_judged(path, nofollow, st, &special);
  if (fd < 0) {
    int errsv = errno;
    if (special != NULL)
      wsync_fail_at(error, code, path, "is %s, not a regular file", special);
    else if (nofollow && errsv == ELOOP)
      wsync_fail_at(error, code, path, "is a symlink");
    else
      wsync_set_io_error(error, errsv, path, "open");
    errno = errsv; /* for the caller that words a missing file its own way */
    return -1;
  }
  if (!S_ISREG(st->st_mode)) {
    const char *kind = file_kind(st->st_mode);
    wsync_fail_at(error, code, path, "is %s%s", kind,
                  g_str_has_prefix(kind, "not") ? "" : ", not a regular file");
    close(fd);
    return -1;
  }
  return fd;
}

static char *
format_limit(gsize max)
{
  if (max >= (1u << 20) && max % (1u << 20) == 0)
    return g_strdup_printf("%" G_GSIZE_FORMAT " MiB", max >> 20);
  return g_strdup_printf("%" G_GSIZE_FORMAT " bytes", max);
}

gboolean
wsync_file_read_bounded(int fd, const char *path, gsize max, const char *what, WsyncError code,
                        char **text, gsize *len, GError **error)
{
  GString *buf = g_string_new(NULL);
  char chunk[65536];

  for (;;) {
    gsize want = MIN(sizeof chunk, max + 1 - buf->len);
    ssize_t k = read(fd, chunk, want);
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0) {
      wsync_set_io_error(error, errno, path, "read");
      g_string_free(buf, TRUE);
      return FALSE;
    }
    if (k == 0)
      break;
    g_string_append_len(buf, chunk, k);
    if (buf->len > max) {
      g_autofree char *limit = format_limit(max);
      g_string_free(buf, TRUE);
      return wsync_fail_at(error, code, path, "more than %s; a %s is never that big", limit, what);
    }
  }
  *len = buf->len;
  *text = g_string_free(buf, FALSE);
  return TRUE;
}

/* Reads all of @fd, opened on @path and described by @st, and closes it. */
static gboolean
read_opened(int fd, const struct stat *st, const char *path, gsize max, const char *what,
            WsyncError code, char **text, gsize *len, GError **error)
{
  if ((guint64)st->st_size > max) { /* refused before reading anything */
    g_autofree char *limit = format_limit(max);
    close(fd);
    return wsync_fail_at(error, code, path, "more than %s; a %s is never that big", limit, what);
  }
  gboolean ok = wsync_file_read_bounded(fd, path, max, what, code, text, len, error);
  close(fd);
  return ok;
}

gboolean
wsync_file_read_regular(const char *path, gsize max, const char *what, WsyncError code,
                        char **text, gsize *len, GError **error)
{
  struct stat st;
  int fd = wsync_file_open_regular(path, FALSE, code, &st, error);
  if (fd < 0)
    return FALSE;
  return read_opened(fd, &st, path, max, what, code, text, len, error);
}

/* ------------------------------------------------------------------ trust */

/* Why the file or directory @st cannot be trusted, or NULL.  @dir: the directory @st
 * describes when it is one of the directories above the file (for the message). */
static char *
untrusted_reason(const char *path, const char *dir, const struct stat *st)
{
  uid_t me = geteuid();
  g_autofree char *ppath = wsync_printable(path);
  g_autofree char *pdir = dir ? wsync_printable(dir) : NULL;
  unsigned mode = st->st_mode & 07777;

  if (st->st_uid != 0 && st->st_uid != me) {
    if (dir)
      return g_strdup_printf("%s: lies in a directory owned by uid %u, neither root nor the user "
                             "running wsync (uid %u): %s",
                             ppath, (unsigned)st->st_uid, (unsigned)me, pdir);
    return g_strdup_printf("%s: is owned by uid %u, neither root nor the user running wsync "
                           "(uid %u)",
                           ppath, (unsigned)st->st_uid, (unsigned)me);
  }
  /* With the sticky bit only an entry's owner (or the directory's, or root) may rename
   * or remove it, and the entry below is checked in turn. */
  if (dir && (mode & S_ISVTX))
    return NULL;
  if (mode & (S_IWGRP | S_IWOTH)) {
    const char *who = (mode & S_IWOTH) ? "world" : "group";
    if (dir)
      return g_strdup_printf("%s: lies in a %s-writable directory (%s, mode %04o)", ppath, who,
                             pdir, mode);
    return g_strdup_printf("%s: is %s-writable (mode %04o)", ppath, who, mode);
  }
  return NULL;
}

char *
wsync_file_untrusted(const char *path, const struct stat *st)
{
  char *reason = untrusted_reason(path, NULL, st);
  if (reason)
    return reason;
  g_autofree char *dir = g_path_get_dirname(path);
  g_autofree char *real = realpath(dir, NULL);
  if (real == NULL) {
    g_autofree char *ppath = wsync_printable(path);
    return g_strdup_printf("%s: cannot resolve its directory: %s", ppath, g_strerror(errno));
  }
  /* every directory from the file's up to / */
  for (char *at = g_steal_pointer(&real);;) {
    struct stat dst;
    if (stat(at, &dst) != 0) {
      g_autofree char *ppath = wsync_printable(path);
      g_autofree char *pat = wsync_printable(at);
      reason = g_strdup_printf("%s: cannot stat %s: %s", ppath, pat, g_strerror(errno));
    } else
      reason = untrusted_reason(path, at, &dst);
    gboolean top = strcmp(at, "/") == 0;
    char *up = g_path_get_dirname(at);
    g_free(at);
    at = up;
    if (reason != NULL || top) {
      g_free(at);
      return reason;
    }
  }
}

int
wsync_file_open_trusted(const char *path, const char *what, struct stat *st, char **reason)
{
  g_autofree char *ppath = wsync_printable(path);
  g_autofree char *dir = g_path_get_dirname(path);
  g_autofree char *base = g_path_get_basename(path);
  g_autofree char *real_dir = realpath(dir, NULL);

  if (real_dir == NULL) {
    *reason = g_strdup_printf("%s: cannot resolve its directory: %s", ppath, g_strerror(errno));
    return -1;
  }
  g_autofree char *real = g_build_filename(real_dir, base, NULL);
  /* lstat()ed first: a FIFO or a device in conf.d or a plugin directory is refused
   * without being opened (a FIFO with no writer, opened blocking, hung every command);
   * then opened O_NOFOLLOW | O_NONBLOCK and fstat()ed: a file swapped in after the
   * lstat() is not read, nor loaded (core/filekind.h) */
  const char *special;
  int fd = wsync_file_open_judged(real, TRUE, st, &special);
  if (fd < 0) {
    int errsv = errno;
    if (special != NULL)
      *reason = g_strdup_printf("%s: is %s, not a regular file", ppath, special);
    else if (errsv == ELOOP)
      *reason = g_strdup_printf("%s: is a symlink; %s must be regular files", ppath, what);
    else if (errsv == WSYNC_FILE_REPLACED_ERRNO)
      *reason = g_strdup_printf("%s: " WSYNC_FILE_REPLACED_WORDS, ppath);
    else
      *reason = g_strdup_printf("%s: cannot open: %s", ppath, g_strerror(errsv));
    return -1;
  }
  if (!S_ISREG(st->st_mode)) {
    const char *kind = file_kind(st->st_mode);
    *reason = g_strdup_printf("%s: is %s%s", ppath, kind,
                              g_str_has_prefix(kind, "not") ? "" : ", not a regular file");
    close(fd);
    return -1;
  }
  *reason = wsync_file_untrusted(real, st);
  if (*reason != NULL) {
    /* name the path as the user gave it, not the resolved one */
    if (strcmp(real, path) != 0) {
      g_autofree char *preal = wsync_printable(real);
      if (g_str_has_prefix(*reason, preal)) {
        char *fixed = g_strconcat(ppath, *reason + strlen(preal), NULL);
        g_free(*reason);
        *reason = fixed;
      }
    }
    close(fd);
    return -1;
  }
  return fd; /* (back to blocking reads: wsync_file_open_judged()) */
}

/* ------------------------------------------------------------------ removal */

typedef struct {
  dev_t dev;       /* the file system of the tree's top */
  GError **error;  /* the first failure */
  gboolean failed;
} Removal;

static void
removal_failed(Removal *rm, int errsv, const char *path, const char *what)
{
  if (!rm->failed)
    wsync_set_io_error(rm->error, errsv, path, what);
  rm->failed = TRUE;
}

static void remove_at(Removal *rm, int parent, const char *name, const char *path);

/* Removes the entries of the directory open as @dfd (a descriptor this function owns). */
static void
remove_entries(Removal *rm, int dfd, const char *path)
{
  DIR *d = fdopendir(dfd);
  if (d == NULL) {
    removal_failed(rm, errno, path, "read");
    close(dfd);
    return;
  }
  /* collect first: removing while reading may skip entries */
  g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
  struct dirent *ent;
  while ((ent = readdir(d)) != NULL)
    if (strcmp(ent->d_name, ".") != 0 && strcmp(ent->d_name, "..") != 0)
      g_ptr_array_add(names, g_strdup(ent->d_name));
  for (guint i = 0; i < names->len; i++) {
    g_autofree char *child = g_build_filename(path, names->pdata[i], NULL);
    remove_at(rm, dirfd(d), names->pdata[i], child);
  }
  closedir(d);
}

static void
remove_at(Removal *rm, int parent, const char *name, const char *path)
{
  struct stat st;

  if (fstatat(parent, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno != ENOENT)
      removal_failed(rm, errno, path, "stat");
    return;
  }
  if (!S_ISDIR(st.st_mode)) {
    if (unlinkat(parent, name, 0) != 0 && errno != ENOENT)
      removal_failed(rm, errno, path, "remove");
    return;
  }
  if (st.st_dev != rm->dev) {
    removal_failed(rm, EXDEV, path, "remove (another file system is mounted there)");
    return;
  }
  /* O_NOFOLLOW | O_DIRECTORY: swapped for a symlink since fstatat, it is not entered */
  int dfd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) {
    removal_failed(rm, errno, path, "open");
    return;
  }
  struct stat again;
  if (fstat(dfd, &again) != 0 || again.st_dev != st.st_dev || again.st_ino != st.st_ino) {
    removal_failed(rm, EAGAIN, path, "remove (it changed while being removed)");
    close(dfd);
    return;
  }
  remove_entries(rm, dfd, path);
  if (unlinkat(parent, name, AT_REMOVEDIR) != 0 && errno != ENOENT)
    removal_failed(rm, errno, path, "remove");
}

gboolean
wsync_remove_tree(const char *path, GError **error)
{
  g_autofree char *dir = g_path_get_dirname(path);
  g_autofree char *base = g_path_get_basename(path);
  Removal rm = {.error = error};
  struct stat st;

  int parent = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (parent < 0) {
    wsync_set_io_error(error, errno, dir, "open");
    return FALSE;
  }
  if (fstatat(parent, base, &st, AT_SYMLINK_NOFOLLOW) == 0)
    rm.dev = st.st_dev;
  remove_at(&rm, parent, base, path);
  close(parent);
  return !rm.failed;
}

/* ------------------------------------------------------------------ temporaries' locks */

/* Locks @path and returns the descriptor; *@owner says whether this user owns it. */
static int
lock_dir(const char *path, gboolean *owner)
{
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st;

  if (fd < 0)
    return -1;
  if (flock(fd, LOCK_EX | LOCK_NB) != 0 || fstat(fd, &st) != 0 || st.st_nlink == 0) {
    close(fd);
    return -1;
  }
  *owner = st.st_uid == geteuid();
  return fd;
}

int
wsync_dir_lock(const char *path)
{
  gboolean owner;
  return lock_dir(path, &owner);
}

void
wsync_remove_abandoned_temp(const char *path)
{
  gboolean owner = FALSE;
  int fd = lock_dir(path, &owner);

  if (fd < 0)
    return;
  if (owner)
    wsync_remove_tree(path, NULL);
  close(fd);
}

/* ------------------------------------------------------------------ config.json */

JsonNode *
wsync_config_json_parse(const char *text, gsize len, const char *file, GError **error)
{
  g_autoptr(JsonParser) parser = json_parser_new();

  if (!wsync_json_parse(parser, text, len, file, NULL, error))
    return NULL;
  JsonNode *root = json_parser_get_root(parser);
  if (root == NULL) { /* (an empty or blank file: there is no top level to speak of) */
    wsync_json_bad_input(error, file, "empty, not a JSON object");
    return NULL;
  }
  if (!JSON_NODE_HOLDS_OBJECT(root)) {
    wsync_json_bad_input(error, file, "the top level is not an object");
    return NULL;
  }
  return json_node_copy(root);
}

/* wsync_config_load() and wsync_config_load_named(): one open of @path, whose failure
 * with ENOENT or ENOTDIR is "PATH: no such file" (bad input) unless @named, when it
 * stays "cannot open PATH: REASON" (I/O). */
static JsonNode *
config_load(const char *path, gboolean named, GError **error)
{
  g_autofree char *text = NULL;
  gsize len = 0;
  struct stat st;
  GError *local = NULL;

  int fd = wsync_file_open_regular(path, FALSE, WSYNC_ERROR_BAD_INPUT, &st, &local);
  if (fd < 0) {
    int errsv = errno;
    if (!named && g_error_matches(local, WSYNC_ERROR, WSYNC_ERROR_IO) &&
        (errsv == ENOENT || errsv == ENOTDIR)) {
      g_autofree char *ppath = wsync_printable(path);
      g_clear_error(&local);
      g_set_error(&local, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT, "%s: no such file", ppath);
    }
    g_propagate_error(error, local);
    return NULL;
  }
  if (!read_opened(fd, &st, path, WSYNC_CONFIG_JSON_MAX, "config.json", WSYNC_ERROR_BAD_INPUT,
                   &text, &len, error))
    return NULL;
  return wsync_config_json_parse(text, len, path, error);
}

JsonNode *
wsync_config_load(const char *path, GError **error)
{
  return config_load(path, FALSE, error);
}

JsonNode *
wsync_config_load_named(const char *path, GError **error)
{
  return config_load(path, TRUE, error);
}

/* ------------------------------------------------------------------ faults on maps */

/* The handler is installed while guarded calls are under way, and the one there was
 * before is put back when the last one ends: a host program's own handler (Python's
 * faulthandler, a debugger's) is not replaced for good.  Guarded calls run side by side
 * on several threads: the count of those under way decides, under guard_lock. */
static __thread sigjmp_buf *fault_jump;
static __thread const void *fault_address;
static struct sigaction previous_sigbus;
static GMutex guard_lock;
static guint guarded_calls;

static void
on_sigbus(int sig, siginfo_t *info, void *context)
{
  (void)sig;
  (void)context;
  if (fault_jump != NULL) {
    fault_address = info->si_addr;
    siglongjmp(*fault_jump, 1);
  }
  /* not a guarded call's: the access repeats when this returns, under the old action */
  sigaction(SIGBUS, &previous_sigbus, NULL);
}

static gboolean
sigbus_handler_is_ours(void)
{
  struct sigaction current;

  return sigaction(SIGBUS, NULL, &current) == 0 && (current.sa_flags & SA_SIGINFO) != 0 &&
         current.sa_sigaction == on_sigbus;
}

static void
guard_enter(void)
{
  g_mutex_lock(&guard_lock);
  /* also when another handler replaced ours while calls were under way: it is the one
   * to put back */
  if (guarded_calls++ == 0 || !sigbus_handler_is_ours()) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &previous_sigbus);
  }
  g_mutex_unlock(&guard_lock);
}

static void
guard_leave(void)
{
  g_mutex_lock(&guard_lock);
  if (--guarded_calls == 0 && sigbus_handler_is_ours())
    sigaction(SIGBUS, &previous_sigbus, NULL);
  g_mutex_unlock(&guard_lock);
}

gboolean
wsync_run_guarded(void (*fn)(gpointer data), gpointer data, const void **address)
{
  sigjmp_buf jump;
  /* a guarded call made by @fn of another (on this thread) puts the outer one's jump
   * back when it ends: NULL would leave the rest of the outer call unguarded */
  sigjmp_buf *volatile outer = fault_jump;

  guard_enter();
  if (sigsetjmp(jump, 1) != 0) { /* the mask is restored: SIGBUS is deliverable again */
    fault_jump = outer;
    *address = fault_address;
    guard_leave();
    return FALSE;
  }
  fault_jump = &jump;
  fn(data);
  fault_jump = outer;
  guard_leave();
  return TRUE;
}

gboolean
wsync_file_pwrite_all(int fd, const char *path, const void *data, gsize len, guint64 offset,
                      GError **error)
{
  const guint8 *p = data;

  while (len > 0) {
    ssize_t k = pwrite(fd, p, len, (off_t)offset);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0) {
      wsync_set_io_error(error, k < 0 ? errno : ENOSPC, path, "write");
      return FALSE;
    }
    p += k;
    len -= (gsize)k;
    offset += (guint64)k;
  }
  return TRUE;
}

gboolean
wsync_file_write_synced(const char *path, gboolean replace, const void *data, gsize len,
                        GError **error)
{
  int fd = open(path, O_WRONLY | O_CREAT | (replace ? O_TRUNC : O_EXCL) | O_CLOEXEC, 0666);

  if (fd < 0) {
    wsync_set_io_error(error, errno, path, "create");
    return FALSE;
  }
  if (!wsync_file_pwrite_all(fd, path, data, len, 0, error)) {
    close(fd);
    return FALSE;
  }
  if (fsync(fd) != 0) {
    wsync_set_io_error(error, errno, path, "sync");
    close(fd);
    return FALSE;
  }
  if (close(fd) != 0) {
    wsync_set_io_error(error, errno, path, "close");
    return FALSE;
  }
  return TRUE;
}

gboolean
wsync_dir_sync(const char *path, GError **error)
{
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

  if (fd < 0) {
    wsync_set_io_error(error, errno, path, "open");
    return FALSE;
  }
  if (fsync(fd) != 0 && errno != EINVAL) { /* EINVAL: a file system without dir fsync */
    wsync_set_io_error(error, errno, path, "sync");
    close(fd);
    return FALSE;
  }
  close(fd);
  return TRUE;
}
