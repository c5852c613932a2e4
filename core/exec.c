/* wsync: executing a plan.
 *
 * Output files are created in a temporary sibling of DST, sized, and mapped; worker
 * threads run the plan's copies straight from the input maps into the output maps (no
 * whole-tensor buffers, so private memory does not grow with the model); the files are
 * flushed, the non-weight files of the source are copied, and only then is the
 * directory renamed into place (swapped atomically with an existing DST).
 *
 * The unit of work is a run of bytes, not a tensor: a copy bigger than CHUNK_BYTES is
 * split along its outermost axis, so one 1 GiB expert tensor keeps every thread busy.
 */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "companion.h"
#include "copy.h"
#include "plan-private.h"

#define CHUNK_BYTES (8u << 20)

/* ------------------------------------------------------------------ work items */

typedef struct {
  const WsyncPlan *plan;
  const Op *op;
  WsyncDtype dst_dtype;
  guint8 *dst_base;       /* the output tensor's first byte */
  guint64 outer_from;     /* range of the op's first axis this item does */
  guint64 outer_to;
  guint64 bytes;          /* output bytes this item writes, for progress */
  gint *remaining;
  guint64 *done_bytes;
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

static void
worker(gpointer data, gpointer user_data)
{
  WorkItem *item = data;
  (void)user_data;

  run_copy(item);
  __atomic_fetch_add(item->done_bytes, item->bytes, __ATOMIC_RELAXED);
  g_atomic_int_dec_and_test(item->remaining);
}

typedef struct {
  GThreadPool *pool;
  gint remaining;
  GPtrArray *items;
  guint64 done_bytes, total_bytes;
  gboolean progress;
  gint64 last_report; /* monotonic µs of the last progress line */
} Executor;

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

/* Queues the ops of one tensor, splitting big copies along their first axis. */
static void
queue_tensor(Executor *ex, WsyncPlan *plan, WsyncLayoutTensor *lt, guint8 *base)
{
  gsize esize = wsync_dtype_size(lt->dtype);

  for (guint i = 0; i < lt->ops->len; i++) {
    const Op *op = &g_array_index(lt->ops, Op, i);
    if (op->kind == OP_FILL) {
      copy_fill(base, op->fill, esize, lt->ndim, lt->shape); /* small: done inline */
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
      item->remaining = &ex->remaining;
      item->done_bytes = &ex->done_bytes;
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
    if (base == NULL && lt->nbytes > 0)
      return FALSE;
    queue_tensor(ex, plan, lt, base);
  }
  /* wait for this rank's copies before its files are flushed */
  while (g_atomic_int_get(&ex->remaining) > 0) {
    g_usleep(1000);
    report_progress(ex, FALSE);
  }
  for (guint p = 0; p < files->len; p++)
    if (!wsync_safetensors_writer_finish(((OutFile *)files->pdata[p])->writer, error))
      return FALSE;
  return TRUE;
}

/* ------------------------------------------------------------------ the directory */

/* config.json and every non-weight file of the source directory (core/companion.c). */
static gboolean
copy_other_files(WsyncPlan *plan, const char *dir, GError **error)
{
  if (plan->kind == PLAN_SYNTH || (plan->input != NULL && !wsync_checkpoint_is_dir(plan->input)))
    return companion_write_config(plan->ctx, plan->config, NULL, dir, error);
  return companion_copy_dir(plan->ctx, plan->config, plan->src, dir, !plan->no_config, error);
}

static void
remove_tree(const char *path)
{
  g_autoptr(GDir) d = g_dir_open(path, 0, NULL);
  const char *name;

  while (d != NULL && (name = g_dir_read_name(d)) != NULL) {
    g_autofree char *child = g_build_filename(path, name, NULL);
    if (g_file_test(child, G_FILE_TEST_IS_DIR) && !g_file_test(child, G_FILE_TEST_IS_SYMLINK))
      remove_tree(child);
    else
      g_unlink(child);
  }
  g_rmdir(path);
}

/* Puts the finished @tmp at @dst: swapped atomically with an existing directory (the old
 * one is removed after), renamed when there is none. */
static gboolean
install_dir(const char *tmp, const char *dst, GError **error)
{
  if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dst, RENAME_NOREPLACE) == 0)
    return TRUE;
  if (errno != EEXIST && errno != ENOTEMPTY) {
    wsync_set_io_error(error, errno, dst, "rename into place");
    return FALSE;
  }
  if (!g_file_test(dst, G_FILE_TEST_IS_DIR)) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_IO, "%s exists and is not a directory", dst);
    return FALSE;
  }
  if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dst, RENAME_EXCHANGE) != 0) {
    wsync_set_io_error(error, errno, dst, "swap into place");
    return FALSE;
  }
  remove_tree(tmp); /* now the previous DST */
  return TRUE;
}

static char *
make_temp_sibling(const char *dst, GError **error)
{
  g_autofree char *parent = g_path_get_dirname(dst);
  g_autofree char *base = g_path_get_basename(dst);
  g_autofree char *templ = g_strdup_printf("%s/.%s.wsync-XXXXXX", parent, base);

  /* like mkdir -p for the parent: `wsync convert SRC out/rank-files` should just work */
  if (g_mkdir_with_parents(parent, 0755) != 0) {
    wsync_set_io_error(error, errno, parent, "create");
    return NULL;
  }
  if (g_mkdtemp(templ) == NULL) {
    wsync_set_io_error(error, errno, templ, "create");
    return NULL;
  }
  return g_steal_pointer(&templ);
}

gboolean
wsync_plan_execute(WsyncPlan *plan, const char *dst, WsyncExecuteFlags flags, GError **error)
{
  gboolean progress = (flags & WSYNC_EXECUTE_PROGRESS) != 0;
  g_autofree char *tmp = make_temp_sibling(dst, error);
  g_autoptr(GHashTable) weight_map = NULL;
  Executor ex = {0};
  gboolean ok = TRUE;

  if (tmp == NULL)
    return FALSE;
  if (plan->out.info->writes_index)
    weight_map = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
  ex.items = g_ptr_array_new_with_free_func(g_free);
  ex.progress = progress;
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
  if (ok && weight_map != NULL) {
    g_autofree char *index = g_build_filename(tmp, WSYNC_INDEX_NAME, NULL);
    ok = wsync_index_write(index, wsync_plan_total_bytes(plan), weight_map, error);
  }
  if (ok)
    ok = copy_other_files(plan, tmp, error);
  if (ok)
    ok = install_dir(tmp, dst, error);
  if (!ok)
    remove_tree(tmp);
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
      return FALSE;
    }
  }
  return TRUE;
}
