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
#include "dst.h"
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
  ok = ok && companion_write_for_plan(plan, tmp, interrupted, error) && write_marker(tmp, error);
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
