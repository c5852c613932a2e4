/* wsync: executing a plan.
 *
 * Output files are created in a temporary sibling of DST, sized, and mapped; worker
 * threads run the plan's copies straight from the input maps into the output maps (no
 * whole-tensor buffers, so private memory does not grow with the model); the files are
 * flushed, the companion files of the source are copied, the marker .wsync-output is
 * written last, and only then is the directory renamed into place (swapped atomically
 * with an existing DST, which must be wsync's own output: see check_replaceable()).
 *
 * The unit of work is a run of bytes, not a tensor: a copy bigger than CHUNK_BYTES is
 * split along its outermost axis, so one 1 GiB expert tensor keeps every thread busy.
 */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "companion.h"
#include "copy.h"
#include "files.h"
#include "plan-private.h"

#define CHUNK_BYTES (8u << 20)

/* ------------------------------------------------------------------ work items */

typedef struct _Executor Executor;

typedef struct {
  const WsyncPlan *plan;
  const Op *op;
  WsyncDtype dst_dtype;
  guint8 *dst_base;       /* the output tensor's first byte */
  guint64 outer_from;     /* range of the op's first axis this item does */
  guint64 outer_to;
  guint64 bytes;          /* output bytes this item writes, for progress */
  const char *out_path;   /* the output file and tensor, for messages */
  const char *out_name;
  Executor *ex;
} WorkItem;

static void
run_copy(const WorkItem *item)
{
  const Source *source = item->op->source;
  const guint8 *src = source->kind == SOURCE_INPUT ? source->input->data : NULL;

  copy_op(item->plan, item->op, item->outer_from, item->outer_to, src, item->dst_base,
          item->dst_dtype);
}

/* ------------------------------------------------------------------ output files */

typedef struct {
  char *path;
  WsyncSafetensorsWriter *writer;
  guint64 bytes;
} OutFile;

static void
outfile_free(gpointer data)
{
  OutFile *f = data;
  g_free(f->path);
  wsync_safetensors_writer_free(f->writer);
  g_free(f);
}

/* Creates every output file of @layout with its header; returns one OutFile per part. */
static GPtrArray *
create_files(WsyncPlan *plan, WsyncLayout *layout, const char *dir, GHashTable *weight_map,
             GError **error)
{
  g_autoptr(GPtrArray) files = g_ptr_array_new_with_free_func(outfile_free);

  for (guint i = 0; i < layout->tensors->len; i++) {
    WsyncLayoutTensor *lt = layout->tensors->pdata[i];
    while (files->len <= lt->part) {
      OutFile *f = g_new0(OutFile, 1);
      g_autofree char *name = plan_file_name(plan, layout, files->len);
      GHashTableIter it;
      gpointer k, v;
      f->path = g_build_filename(dir, name, NULL);
      f->writer = wsync_safetensors_writer_new();
      wsync_safetensors_writer_set_metadata(f->writer, "format", "pt");
      g_hash_table_iter_init(&it, layout->metadata);
      while (g_hash_table_iter_next(&it, &k, &v))
        wsync_safetensors_writer_set_metadata(f->writer, k, v);
      g_ptr_array_add(files, f);
    }
    OutFile *f = files->pdata[lt->part];
    if (!wsync_safetensors_writer_add(f->writer, lt->name, lt->dtype, lt->ndim, lt->shape,
                                      error))
      return NULL;
    f->bytes += lt->nbytes;
    if (weight_map)
      g_hash_table_insert(weight_map, g_strdup(lt->name), g_path_get_basename(f->path));
  }
  for (guint p = 0; p < files->len; p++) {
    OutFile *f = files->pdata[p];
    if (!wsync_safetensors_writer_begin(f->writer, f->path, error))
      return NULL;
  }
  return g_steal_pointer(&files);
}

struct _Executor {
  GThreadPool *pool;
  gint remaining;
  GPtrArray *items;
  guint64 done_bytes, total_bytes;
  gboolean progress;
  gint64 last_report; /* monotonic µs of the last progress line */
  gint failed;        /* set once anything failed: the rest is skipped */
  const volatile sig_atomic_t *interrupted; /* wsync_plan_set_interrupt() */
  GMutex lock;
  GError *fault;      /* the first fault, under lock */
};

/* Every copy runs through wsync_run_guarded() (files.h): a source or output file that
 * shrinks under its map (truncated by another process while wsync runs) makes the copy
 * fail with an I/O error naming the file, not kill the process with SIGBUS and leave
 * the temporary directory behind.  The copies only read and write memory (no locks, no
 * allocation), so leaving one in the middle is safe. */

/* Records the first fault as an I/O error naming the file that shrank: the input
 * tensor's when the address lies in it, else the output's. */
static void
record_fault(Executor *ex, const char *out_path, const char *out_name, const Op *op,
             const void *address)
{
  const WsyncTensor *in = op && op->source->kind != SOURCE_GENERATED ? op->source->input : NULL;
  gboolean reading = in != NULL && (const guint8 *)address >= in->data &&
                     (const guint8 *)address < in->data + in->nbytes;

  g_mutex_lock(&ex->lock);
  if (ex->fault == NULL) {
    g_autofree char *file = wsync_printable(reading ? in->file : out_path);
    g_autofree char *tensor = wsync_printable(reading ? in->name : out_name);
    g_set_error(&ex->fault, WSYNC_ERROR, WSYNC_ERROR_IO,
                "cannot %s %s: the file shrank while wsync was %s it (tensor \"%s\")",
                reading ? "read" : "write", file, reading ? "reading" : "writing", tensor);
  }
  g_mutex_unlock(&ex->lock);
  g_atomic_int_set(&ex->failed, 1);
}

static void
run_copy_cb(gpointer data)
{
  run_copy(data);
}

static void
worker(gpointer data, gpointer user_data)
{
  WorkItem *item = data;
  Executor *ex = item->ex;
  const void *address = NULL;
  (void)user_data;

  if (ex->interrupted != NULL && *ex->interrupted)
    g_atomic_int_set(&ex->failed, 1);
  if (!g_atomic_int_get(&ex->failed) && !wsync_run_guarded(run_copy_cb, item, &address))
    record_fault(ex, item->out_path, item->out_name, item->op, address);
  __atomic_fetch_add(&ex->done_bytes, item->bytes, __ATOMIC_RELAXED);
  g_atomic_int_dec_and_test(&ex->remaining);
}

/* "wsync: 12.3 GB of 60.1 GB written (20%)" on stderr, at most twice a second. */
static void
report_progress(Executor *ex, gboolean force)
{
  gint64 now = g_get_monotonic_time();
  guint64 done = __atomic_load_n(&ex->done_bytes, __ATOMIC_RELAXED);

  if (!ex->progress || ex->total_bytes == 0 || (!force && now - ex->last_report < 500000))
    return;
  ex->last_report = now;
  g_autofree char *d = g_format_size(done), *t = g_format_size(ex->total_bytes);
  fprintf(stderr, "\rwsync: %s of %s written (%u%%)   ", d, t,
          (guint)(100 * done / ex->total_bytes));
}

typedef struct {
  guint8 *base;
  const Fill *fill;
  gsize esize;
  const WsyncLayoutTensor *lt;
} FillJob;

static void
run_fill_cb(gpointer data)
{
  const FillJob *job = data;
  copy_fill(job->base, job->fill, job->esize, job->lt->ndim, job->lt->shape);
}

/* Queues the ops of one tensor, splitting big copies along their first axis. */
static void
queue_tensor(Executor *ex, WsyncPlan *plan, WsyncLayoutTensor *lt, const char *out_path,
             guint8 *base)
{
  gsize esize = wsync_dtype_size(lt->dtype);

  for (guint i = 0; i < lt->ops->len && !g_atomic_int_get(&ex->failed); i++) {
    const Op *op = &g_array_index(lt->ops, Op, i);
    if (op->kind == OP_FILL) {
      FillJob job = {base, op->fill, esize, lt}; /* small: done inline */
      const void *address = NULL;
      if (!wsync_run_guarded(run_fill_cb, &job, &address))
        record_fault(ex, out_path, lt->name, NULL, address);
      continue;
    }
    guint64 outer = op->ndim ? op->extent[0] : 1, bytes = esize;
    for (guint k = 0; k < op->ndim; k++)
      bytes *= op->extent[k];
    guint64 per_outer = MAX(bytes / MAX(outer, 1), 1);
    guint64 step = MAX(CHUNK_BYTES / per_outer, 1);
    for (guint64 from = 0; from < outer; from += step) {
      WorkItem *item = g_new0(WorkItem, 1);
      item->plan = plan;
      item->op = op;
      item->dst_dtype = lt->dtype;
      item->dst_base = base;
      item->outer_from = from;
      item->outer_to = MIN(from + step, outer);
      item->out_path = out_path;
      item->out_name = lt->name;
      item->ex = ex;
      item->bytes = (item->outer_to - item->outer_from) * per_outer;
      g_ptr_array_add(ex->items, item);
      g_atomic_int_inc(&ex->remaining);
      g_thread_pool_push(ex->pool, item, NULL);
    }
  }
}

static gboolean
write_layout(WsyncPlan *plan, WsyncLayout *layout, const char *dir, Executor *ex,
             GHashTable *weight_map, GError **error)
{
  g_autoptr(GPtrArray) files = create_files(plan, layout, dir, weight_map, error);

  if (files == NULL)
    return FALSE;
  for (guint i = 0; i < layout->tensors->len; i++) {
    WsyncLayoutTensor *lt = layout->tensors->pdata[i];
    OutFile *f = files->pdata[lt->part];
    guint8 *base = wsync_safetensors_writer_data(f->writer, lt->name, error);
    if (base == NULL && lt->nbytes > 0) {
      g_atomic_int_set(&ex->failed, 1);
      break;
    }
    queue_tensor(ex, plan, lt, f->path, base);
  }
  /* wait for this rank's copies before its files are flushed (or, after a failure,
   * before they are unmapped) */
  while (g_atomic_int_get(&ex->remaining) > 0) {
    g_usleep(1000);
    if (ex->interrupted != NULL && *ex->interrupted)
      g_atomic_int_set(&ex->failed, 1);
    report_progress(ex, FALSE);
  }
  if (g_atomic_int_get(&ex->failed)) {
    g_mutex_lock(&ex->lock);
    if (ex->fault != NULL && (error == NULL || *error == NULL))
      g_propagate_error(error, g_steal_pointer(&ex->fault));
    g_mutex_unlock(&ex->lock);
    return FALSE;
  }
  for (guint p = 0; p < files->len; p++)
    if (!wsync_safetensors_writer_finish(((OutFile *)files->pdata[p])->writer, error))
      return FALSE;
  return TRUE;
}

/* ------------------------------------------------------------------ the directory */

/* config.json (patched) and the companion files of the source directory. */
static gboolean
copy_other_files(WsyncPlan *plan, const char *dir, const volatile sig_atomic_t *stop,
                 GError **error)
{
  if (plan->kind == PLAN_SYNTH || (plan->input != NULL && !wsync_checkpoint_is_dir(plan->input)))
    return companion_write_config(plan->ctx, plan->config, NULL, dir, stop, error);
  return companion_copy_dir(plan->ctx, plan->config, plan->src, dir, !plan->no_config, stop,
                            error);
}

/* ------------------------------------------------------------------ DST */

/* DST as given, cleaned: "out/" and "out" are one directory. */
typedef struct {
  char *path;   /* without trailing slashes */
  char *parent; /* its directory */
  char *base;   /* its last component */
} Dst;

static void
dst_clear(Dst *d)
{
  g_free(d->path);
  g_free(d->parent);
  g_free(d->base);
}

static gboolean
usage_refusal(GError **error, const char *path, const char *fmt, ...) G_GNUC_PRINTF(3, 4);

static gboolean
usage_refusal(GError **error, const char *path, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  g_autofree char *msg = g_strdup_vprintf(fmt, ap);
  va_end(ap);
  g_autofree char *ppath = wsync_printable(path);
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE, "%s: %s", ppath, msg);
  return FALSE;
}

static gboolean
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
    return usage_refusal(error, arg[0] ? arg : "\"\"",
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
static gboolean
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
        return usage_refusal(error, d->path, "DST %s the source %s; write the output elsewhere",
                             i == 0 ? "is" : "contains", psrc);
      }
  if (!S_ISDIR(src_st.st_mode))
    return TRUE;
  g_autofree char *existing = nearest_existing(d->parent);
  g_autoptr(GArray) dst_chain = ancestry(existing);
  for (guint i = 0; i < dst_chain->len; i++)
    if (same_file(&g_array_index(dst_chain, struct stat, i), &src_st)) {
      g_autofree char *psrc = wsync_printable(src);
      return usage_refusal(error, d->path,
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
static gboolean
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
    return usage_refusal(error, d->path,
                         "DST is a symlink; wsync neither writes through nor replaces one: give "
                         "the directory itself");
  if (!S_ISDIR(st.st_mode))
    return usage_refusal(error, d->path, "DST exists and is not a directory");
  g_autofree char *marker = g_build_filename(d->path, WSYNC_OUTPUT_MARKER, NULL);
  struct stat mst;
  if ((lstat(marker, &mst) == 0 && S_ISREG(mst.st_mode)) || force || dir_is_empty(d->path))
    return TRUE;
  return usage_refusal(error, d->path,
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

  while (dir != NULL && (name = g_dir_read_name(dir)) != NULL) {
    if (!is_temp_name(name, d->base))
      continue;
    g_autofree char *path = g_build_filename(d->parent, name, NULL);
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0)
      continue;
    if (fstat(fd, &st) == 0 && st.st_uid == geteuid() && flock(fd, LOCK_EX | LOCK_NB) == 0)
      wsync_remove_tree(path, NULL);
    close(fd);
  }
}

/* Creates and locks a fresh ".BASE.wsync-XXXXXX" next to DST.  mkdir(0777) lets the
 * user's umask decide its mode, as for any directory the user creates (g_mkdtemp's 0700
 * would keep an inference server running as another user out). */
static char *
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
      wsync_set_io_error(error, errno, path, "create");
      return NULL;
    }
    /* Another run's clean-up may see the directory between mkdir and flock, take it for
     * stale and remove it: then the lock fails, or the directory is gone (no links). */
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0 && fstat(fd, &st) == 0 && st.st_nlink > 0) {
      *lock_fd = fd;
      return g_steal_pointer(&path);
    }
    if (fd >= 0)
      close(fd);
  }
  wsync_set_io_error(error, EEXIST, d->parent, "create a temporary directory in");
  return NULL;
}

static gboolean
sync_dir(const char *path, GError **error)
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

/* The marker, written last: a directory that has it is complete and wsync's. */
static gboolean
write_marker(const char *dir, GError **error)
{
  g_autofree char *path = g_build_filename(dir, WSYNC_OUTPUT_MARKER, NULL);
  static const char text[] =
      "This directory was written by wsync " PACKAGE_VERSION ".\n"
      "A later wsync run into it replaces it whole; without this file, wsync refuses to.\n";
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);

  if (fd < 0) {
    wsync_set_io_error(error, errno, path, "create");
    return FALSE;
  }
  gboolean ok = write(fd, text, sizeof text - 1) == (ssize_t)(sizeof text - 1) && fsync(fd) == 0;
  if (!ok)
    wsync_set_io_error(error, errno ? errno : ENOSPC, path, "write");
  close(fd);
  return ok && sync_dir(dir, error);
}

/* Puts the finished @tmp at DST: renamed when there is none, else swapped atomically
 * with it (RENAME_EXCHANGE swaps the directory entries, never what a symlink points
 * to, and DST was checked not to be one), and the previous DST, now at @tmp, removed.
 * The parent is synced so that the new name survives a crash. */
static gboolean
install_dir(const char *tmp, const Dst *d, gboolean force, GError **error)
{
  /* checked again: DST may have changed while the run was writing */
  if (!check_replaceable(d, force, error))
    return FALSE;
  if (renameat2(AT_FDCWD, tmp, AT_FDCWD, d->path, RENAME_NOREPLACE) == 0)
    return sync_dir(d->parent, error);
  if (errno != EEXIST && errno != ENOTEMPTY) {
    wsync_set_io_error(error, errno, d->path, "rename into place");
    return FALSE;
  }
  if (renameat2(AT_FDCWD, tmp, AT_FDCWD, d->path, RENAME_EXCHANGE) != 0) {
    wsync_set_io_error(error, errno, d->path, "swap into place");
    return FALSE;
  }
  if (!sync_dir(d->parent, error))
    return FALSE;
  wsync_remove_tree(tmp, NULL); /* now the previous DST; a later run removes what is left */
  return TRUE;
}

gboolean
wsync_plan_execute(WsyncPlan *plan, const char *dst_arg, WsyncExecuteFlags flags,
                   GError **error)
{
  gboolean progress = (flags & WSYNC_EXECUTE_PROGRESS) != 0;
  gboolean force = (flags & WSYNC_EXECUTE_FORCE) != 0;
  const volatile sig_atomic_t *interrupted = plan->interrupted;
  Dst d = {0};
  g_autoptr(GHashTable) weight_map = NULL;
  Executor ex = {0};
  int lock_fd = -1;
  g_autofree char *tmp = NULL;
  gboolean ok;

  ok = dst_parse(dst_arg, &d, error) && check_not_source(plan->src, &d, error) &&
       check_replaceable(&d, force, error) && (tmp = make_temp(&d, &lock_fd, error)) != NULL;
  if (!ok) {
    dst_clear(&d);
    return FALSE;
  }
  if (plan->out.info->writes_index)
    weight_map = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
  ex.items = g_ptr_array_new_with_free_func(g_free);
  ex.progress = progress;
  ex.interrupted = interrupted;
  ex.total_bytes = wsync_plan_total_bytes(plan);
  ex.pool = g_thread_pool_new(worker, NULL, (gint)MAX(plan->threads, 1), TRUE, NULL);
  for (guint l = 0; ok && l < plan->outputs->len; l++) {
    WsyncLayout *layout = plan->outputs->pdata[l];
    ok = write_layout(plan, layout, tmp, &ex, weight_map, error);
  }
  if (progress && ok) {
    ex.done_bytes = ex.total_bytes; /* fills are not counted as they go */
    report_progress(&ex, TRUE);
    fputc('\n', stderr);
  }
  g_thread_pool_free(ex.pool, FALSE, TRUE);
  g_ptr_array_unref(ex.items);
  g_clear_error(&ex.fault);
  if (ok && weight_map != NULL) {
    g_autofree char *index = g_build_filename(tmp, WSYNC_INDEX_NAME, NULL);
    ok = wsync_index_write(index, wsync_plan_total_bytes(plan), weight_map, error);
  }
  ok = ok && copy_other_files(plan, tmp, interrupted, error) && write_marker(tmp, error);
  /* the last moment a signal can stop the run: after this, DST is the new output */
  if (interrupted != NULL && *interrupted)
    ok = companion_interrupted(error, *interrupted);
  ok = ok && install_dir(tmp, &d, force, error);
  if (!ok)
    wsync_remove_tree(tmp, NULL);
  close(lock_fd);
  dst_clear(&d);
  return ok;
}

gboolean
wsync_context_patch_config(WsyncContext *ctx, JsonNode *root, GError **error)
{
  g_autoptr(GPtrArray) patchers = wsync_registry_lookup(wsync_context_get_registry(ctx),
                                                        WSYNC_ENTRY_CONFIG_PATCHER, NULL);

  for (guint i = 0; i < patchers->len; i++) {
    const WsyncEntry *e = patchers->pdata[i];
    WsyncConfigPatchFunc patch = (WsyncConfigPatchFunc)wsync_entry_get_callback(e);
    if (!patch(root, wsync_entry_get_user_data(e), error)) {
      g_prefix_error(error, "config patcher \"%s\" (plugin \"%s\"): ", wsync_entry_get_name(e),
                     wsync_entry_get_plugin(e));
      if (error != NULL)
        wsync_error_make_printable(*error); /* it may quote the config */
      return FALSE;
    }
  }
  return TRUE;
}
