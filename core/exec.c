/* wsync: executing a plan.
 *
 * Output files are created in a temporary sibling of DST and written with pwrite(2);
 * worker threads take the output tensors in slabs of at most a few MiB, each a run of
 * whole rows along some axis (so one contiguous run of bytes in the file).  A slab that
 * is a run of bytes of an input tensor too (whole tensors, slices of rows, stacked
 * experts) is written straight from the input's map; any other (transposes, gathers of
 * columns, casts, fills, generated values) is assembled in the thread's staging buffer
 * first.  No output file is mapped: every page is written once, by the kernel, with no
 * page fault and no zero-filling; a full disk is an ENOSPC from pwrite(2), and free
 * space is checked before anything is written.  Private memory is the staging buffers
 * (STAGING_TOTAL at most, whatever the model's size) and the plan.
 *
 * Then the files are flushed, the companion files of the source are copied, the marker
 * .wsync-output is written last, and only then is the directory renamed into place
 * (swapped atomically with an existing DST, which must be wsync's own output: see
 * check_replaceable()).
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
#include <sys/statvfs.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "companion.h"
#include "copy.h"
#include "dst.h"
#include "entry-private.h"
#include "files.h"
#include "progress.h"
#include "plan-private.h"
#include "safetensors-private.h"

#define SLAB_MAX (2u << 20)       /* the most bytes one work item writes */
#define STAGING_TOTAL (16u << 20) /* the staging buffers of all threads together */

/* ------------------------------------------------------------------ output files */

/* How a tensor is cut into slabs (see cut_tensor()). */
typedef struct {
  guint axis;
  guint64 rows, chunks, count;
  guint64 rm[WSYNC_MAX_DIMS]; /* row-major element strides */
} Cut;

/* An output file, and the work left in it (under the executor's lock). */
typedef struct {
  char *path;
  WsyncSafetensorsWriter *writer;
  int fd;
  GPtrArray *tensors; /* WsyncLayoutTensor*, in the order of their bytes in the file */
  guint next;         /* the tensor being cut */
  guint64 next_slab;  /* its next slab */
  Cut cut;            /* of tensors[next] */
  guint writers;      /* threads writing a slab of it now */
  GMutex write_lock;  /* held while writing to it (see write_slab()) */
} OutFile;

static void
outfile_free(gpointer data)
{
  OutFile *f = data;
  g_mutex_clear(&f->write_lock);
  g_free(f->path);
  wsync_safetensors_writer_free(f->writer);
  g_ptr_array_unref(f->tensors);
  g_free(f);
}

static gint
compare_file_offsets(gconstpointer a, gconstpointer b, gpointer data)
{
  const WsyncLayoutTensor *x = *(WsyncLayoutTensor *const *)a, *y = *(WsyncLayoutTensor *const *)b;
  guint64 ox = 0, oy = 0;

  safetensors_writer_file_offset(data, x->name, &ox);
  safetensors_writer_file_offset(data, y->name, &oy);
  return ox < oy ? -1 : ox > oy;
}

/* Creates every output file of @layout with its header, and appends one OutFile per
 * part to @files. */
static gboolean
create_files(WsyncPlan *plan, WsyncLayout *layout, const char *dir, GHashTable *weight_map,
             GPtrArray *all, GError **error)
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
      f->fd = -1;
      f->tensors = g_ptr_array_new();
      g_mutex_init(&f->write_lock);
      wsync_safetensors_writer_set_metadata(f->writer, "format", "pt");
      g_hash_table_iter_init(&it, layout->metadata);
      while (g_hash_table_iter_next(&it, &k, &v))
        wsync_safetensors_writer_set_metadata(f->writer, k, v);
      g_ptr_array_add(files, f);
    }
    OutFile *f = files->pdata[lt->part];
    if (!wsync_safetensors_writer_add(f->writer, lt->name, lt->dtype, lt->ndim, lt->shape,
                                      error))
      return FALSE;
    g_ptr_array_add(f->tensors, lt);
    if (weight_map)
      g_hash_table_insert(weight_map, g_strdup(lt->name), g_path_get_basename(f->path));
  }
  for (guint p = 0; p < files->len; p++) {
    OutFile *f = files->pdata[p];
    if (!wsync_safetensors_writer_begin(f->writer, f->path, error))
      return FALSE;
    f->fd = safetensors_writer_fd(f->writer);
    /* written front to back, as a disk likes it */
    g_ptr_array_sort_with_data(f->tensors, compare_file_offsets, f->writer);
  }
  while (files->len > 0)
    g_ptr_array_add(all, g_ptr_array_steal_index(files, 0));
  return TRUE;
}

/* ------------------------------------------------------------------ slabs */

/* A work item: elements [first, first + n) of an output tensor, which are the box @box
 * of it: fixed indices on the axes before some axis A, a range of A, all of the axes
 * after it. */
typedef struct {
  const WsyncLayoutTensor *lt;
  OutFile *file;
  WsyncBox box;
  guint64 first;  /* the first element */
  guint64 nbytes; /* bytes, all contiguous in the file */
} Slab;

/* A tensor is cut along one axis, @rows indices at a time, for every combination of
 * indices of the axes before it; @count slabs in all.  The axis is the first whose rows
 * fit in @max bytes, and a slab has as many of them as fit.  A
 * tensor of sub-byte elements (F4, F6) is one slab: its elements share bytes. */
static void
cut_tensor(const WsyncLayoutTensor *lt, guint64 max, Cut *c)
{
  gsize esize = wsync_dtype_size(lt->dtype);
  guint64 s = 1;

  memset(c, 0, sizeof *c);
  for (guint d = lt->ndim; d > 0; d--) {
    c->rm[d - 1] = s;
    s *= lt->shape[d - 1];
  }
  if (lt->nbytes == 0) {
    c->count = 0;
    return;
  }
  if (lt->ndim == 0 || esize == 0) {
    c->axis = 0;
    c->count = 1;
    return;
  }
  guint a = 0;
  while (a + 1 < lt->ndim && c->rm[a] * esize > max)
    a++;
  guint64 prefix = 1;
  for (guint d = 0; d < a; d++)
    prefix *= lt->shape[d];
  c->axis = a;
  c->rows = MAX(max / (c->rm[a] * esize), 1);
  c->chunks = (lt->shape[a] + c->rows - 1) / c->rows;
  c->count = prefix * c->chunks;
}

/* Slab @j of @lt as @c cuts it. */
static void
slab_of(const WsyncLayoutTensor *lt, const Cut *c, guint64 j, Slab *slab)
{
  slab->lt = lt;
  wsync_box_whole(&slab->box, lt->ndim, lt->shape);
  if (lt->ndim == 0 || wsync_dtype_size(lt->dtype) == 0) {
    slab->first = 0;
    slab->nbytes = lt->nbytes;
    return;
  }
  guint64 chunk = j % c->chunks, prefix = j / c->chunks;
  slab->first = 0;
  for (guint d = c->axis; d > 0; d--) {
    slab->box.offset[d - 1] = prefix % lt->shape[d - 1];
    slab->box.extent[d - 1] = 1;
    prefix /= lt->shape[d - 1];
    slab->first += slab->box.offset[d - 1] * c->rm[d - 1];
  }
  slab->box.offset[c->axis] = chunk * c->rows;
  slab->box.extent[c->axis] = MIN(c->rows, lt->shape[c->axis] - chunk * c->rows);
  slab->first += slab->box.offset[c->axis] * c->rm[c->axis];
  slab->nbytes = slab->box.extent[c->axis] * c->rm[c->axis] * wsync_dtype_size(lt->dtype);
}

/* ------------------------------------------------------------------ the executor */

typedef struct {
  WsyncPlan *plan;
  guint64 slab_max; /* bytes of a slab, and of each thread's staging buffer */
  guint n_threads;
  guint8 **buffers; /* one staging buffer per thread, allocated when first needed */
  GPtrArray *files; /* OutFile*: of every rank, written at once */
  guint running;
  GCond finished;
  guint64 done_bytes, total_bytes;
  WsyncProgress progress;
  gint failed;        /* set once anything failed: the rest is skipped */
  gint no_copy_range; /* copy_file_range(2) does not work between these file systems */
  const volatile sig_atomic_t *interrupted; /* wsync_plan_set_interrupt() */
  GMutex lock;
  GError *error; /* the first failure, under lock */
} Executor;

/* Keeps @err (owned) as the run's error unless one came first, and stops the rest. */
static void
record_error(Executor *ex, GError *err)
{
  g_mutex_lock(&ex->lock);
  if (ex->error == NULL)
    ex->error = err;
  else
    g_error_free(err);
  g_mutex_unlock(&ex->lock);
  g_atomic_int_set(&ex->failed, 1);
}

/* A source file that shrinks under its map (truncated by another process while wsync
 * runs) makes a read of the map fault: staging runs behind wsync_run_guarded()
 * (files.h), so that it fails with an I/O error naming the file instead of killing the
 * process with SIGBUS and leaving the temporary directory behind; pwrite(2) from such a
 * map fails with EFAULT.  The copies only read and write memory (no locks, no
 * allocation), so leaving one in the middle is safe.  Outputs are not mapped. */
static void
record_shrunk_source(Executor *ex, const Slab *slab, const Op *op)
{
  const WsyncTensor *in = op->source->input;
  g_autofree char *file = wsync_printable(in->file);
  g_autofree char *tensor = wsync_printable(in->name);
  g_autofree char *out = wsync_printable(slab->lt->name);

  record_error(ex, g_error_new(WSYNC_ERROR, WSYNC_ERROR_IO,
                               "cannot read %s: the file shrank while wsync was reading it "
                               "(tensor \"%s\", for tensor \"%s\")",
                               file, tensor, out));
}

/* pwrite(2) of all @len bytes at @pos of the slab's file.  @op: the op whose input map
 * @buf points into, or NULL for a staging buffer. */
static gboolean
write_bytes(Executor *ex, const Slab *slab, const Op *op, const guint8 *buf, guint64 len,
            guint64 pos)
{
  while (len > 0) {
    ssize_t k = pwrite(slab->file->fd, buf, MIN(len, G_GUINT64_CONSTANT(1) << 30), (off_t)pos);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0) {
      int errsv = k == 0 ? ENOSPC : errno;
      if (errsv == EFAULT && op != NULL) {
        record_shrunk_source(ex, slab, op);
        return FALSE;
      }
      g_autofree char *file = wsync_printable(slab->file->path);
      g_autofree char *tensor = wsync_printable(slab->lt->name);
      record_error(ex, g_error_new(WSYNC_ERROR, WSYNC_ERROR_IO, "cannot write %s: %s (tensor \"%s\")",
                                   file, g_strerror(errsv), tensor));
      return FALSE;
    }
    buf += k;
    len -= (guint64)k;
    pos += (guint64)k;
  }
  return TRUE;
}

/* The part of @op inside @slab, or FALSE when it writes nothing there. */
static gboolean
op_in_slab(const Op *op, const Slab *slab, Op *part)
{
  const WsyncLayoutTensor *lt = slab->lt;
  return copy_op_window(op, lt->ndim, lt->shape, &slab->box, slab->first, part);
}

/* TRUE when every op that writes inside @slab copies one run of input bytes: then the
 * slab needs no staging. */
static gboolean
slab_is_runs(const Slab *slab)
{
  const WsyncLayoutTensor *lt = slab->lt;

  for (guint i = 0; i < lt->n_ops; i++) {
    Op op_buf;
    const Op *op = &op_buf;
    layout_tensor_op(lt, i, &op_buf);
    WsyncBox inter;
    Op part;
    guint64 s, d, n;
    if (op->kind == OP_FILL) {
      if (wsync_box_intersect(&op->fill->box, &slab->box, &inter))
        return FALSE;
    } else if (op_in_slab(op, slab, &part) && !copy_op_is_run(&part, lt->dtype, &s, &d, &n))
      return FALSE;
  }
  return TRUE;
}

/* copy_file_range(2) of @len bytes of the input file @in_fd at @in_pos to @pos of the
 * slab's file: the kernel copies page cache to page cache, and the input's pages are
 * never mapped.  *@unsupported when the pair of file systems cannot (nothing copied). */
static gboolean
copy_range(Executor *ex, const Slab *slab, const Op *op, int in_fd, guint64 in_pos, guint64 len,
           guint64 pos, gboolean *unsupported)
{
  gboolean first = TRUE;

  *unsupported = FALSE;
  while (len > 0) {
    loff_t from = (loff_t)in_pos, to = (loff_t)pos;
    ssize_t k = copy_file_range(in_fd, &from, slab->file->fd, &to,
                                MIN(len, G_GUINT64_CONSTANT(1) << 30), 0);
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0 && first &&
        (errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP || errno == ENOSYS ||
         errno == EBADF)) {
      *unsupported = TRUE;
      return FALSE;
    }
    if (k == 0) { /* the end of the input file, before the end of the tensor */
      record_shrunk_source(ex, slab, op);
      return FALSE;
    }
    if (k < 0) {
      g_autofree char *file = wsync_printable(slab->file->path);
      g_autofree char *tensor = wsync_printable(slab->lt->name);
      record_error(ex, g_error_new(WSYNC_ERROR, WSYNC_ERROR_IO,
                                   "cannot write %s: %s (tensor \"%s\")", file,
                                   g_strerror(errno), tensor));
      return FALSE;
    }
    first = FALSE;
    in_pos += (guint64)k;
    pos += (guint64)k;
    len -= (guint64)k;
  }
  return TRUE;
}

/* Each op's run straight from its input into the file: file to file when the input's
 * descriptor is at hand and the file systems allow it, else from the input's map. */
static gboolean
write_runs(Executor *ex, const Slab *slab, guint64 pos)
{
  const WsyncLayoutTensor *lt = slab->lt;

  for (guint i = 0; i < lt->n_ops; i++) {
    Op op_buf;
    const Op *op = &op_buf;
    layout_tensor_op(lt, i, &op_buf);
    Op part;
    guint64 s, d, n, in_pos;
    int in_fd;
    gboolean unsupported = FALSE;
    if (!op_in_slab(op, slab, &part) || !copy_op_is_run(&part, lt->dtype, &s, &d, &n) || n == 0)
      continue;
    const guint8 *src = op->source->input->data + s;
    if (!g_atomic_int_get(&ex->no_copy_range) && safetensors_source_file(src, n, &in_fd, &in_pos)) {
      if (copy_range(ex, slab, op, in_fd, in_pos, n, pos + d, &unsupported))
        continue;
      if (!unsupported)
        return FALSE;
      g_atomic_int_set(&ex->no_copy_range, 1);
    }
    if (!write_bytes(ex, slab, op, src, n, pos + d))
      return FALSE;
  }
  return TRUE;
}

typedef struct {
  Executor *ex;
  const Slab *slab;
  guint8 *buf;
  const Op *op; /* the op running, for the message of a fault: NULL or &current */
  Op current;   /* read from the tensor's ops here, as it outlives a fault */
} Staging;

/* Every op and fill of the slab's tensor, cut to the slab, into the staging buffer. */
static void
stage_cb(gpointer data)
{
  Staging *st = data;
  const Slab *slab = st->slab;
  const WsyncLayoutTensor *lt = slab->lt;
  gsize esize = wsync_dtype_size(lt->dtype);

  for (guint i = 0; i < lt->n_ops; i++) {
    const Op *op = &st->current;
    Op part;
    layout_tensor_op(lt, i, &st->current);
    st->op = op;
    if (op->kind == OP_FILL)
      copy_fill_window(st->buf, slab->first, op->fill, &slab->box, esize, lt->ndim, lt->shape);
    else if (op_in_slab(op, slab, &part)) {
      const guint8 *src = op->source->kind == SOURCE_INPUT ? op->source->input->data : NULL;
      copy_op(st->ex->plan, &part, 0, part.ndim ? part.extent[0] : 1, src, st->buf, lt->dtype);
    }
  }
}

/* A tensor of sub-byte elements can only be copied whole, byte for byte: an op that
 * takes all of one input tensor of the same dtype and size into all of it.  Sets @op to
 * it, or returns FALSE. */
static gboolean
whole_packed_copy(const WsyncLayoutTensor *lt, Op *op)
{
  guint64 stride = 1;

  if (lt->n_ops != 1)
    return FALSE;
  layout_tensor_op(lt, 0, op);
  if (op->kind != OP_COPY || op->source->kind != SOURCE_INPUT ||
      op->src_dtype != lt->dtype || op->source->input->nbytes != lt->nbytes ||
      op->src_origin != 0 || op->dst_origin != 0 || op->ndim != lt->ndim)
    return FALSE;
  for (guint d = lt->ndim; d > 0; d--) {
    if (op->extent[d - 1] != lt->shape[d - 1] || op->src_stride[d - 1] != stride ||
        op->dst_stride[d - 1] != stride)
      return FALSE;
    stride *= lt->shape[d - 1];
  }
  return TRUE;
}

static gboolean
write_slab(Executor *ex, guint thread, const Slab *slab)
{
  const WsyncLayoutTensor *lt = slab->lt;
  guint64 pos;

  if (!safetensors_writer_file_offset(slab->file->writer, lt->name, &pos))
    g_return_val_if_reached(FALSE);
  if (wsync_dtype_size(lt->dtype) == 0) {
    Op op;
    if (whole_packed_copy(lt, &op))
      return write_bytes(ex, slab, &op, op.source->input->data, lt->nbytes, pos);
    g_autofree char *name = wsync_printable(lt->name);
    record_error(ex, g_error_new(WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                                 "tensor \"%s\": %s elements share bytes, so wsync copies such "
                                 "a tensor only whole and unchanged, not sliced, joined or cast",
                                 name, wsync_dtype_name(lt->dtype)));
    return FALSE;
  }
  pos += slab->first * wsync_dtype_size(lt->dtype);
  /* One thread at a time writes to a file: the kernel would serialise the writes anyway
   * (a write holds the file's inode lock while it copies), and a thread that waits for
   * that lock spins on it, burning the CPU that another thread could stage with. */
  gboolean ok;
  if (slab_is_runs(slab)) {
    g_mutex_lock(&slab->file->write_lock);
    ok = write_runs(ex, slab, pos);
    g_mutex_unlock(&slab->file->write_lock);
    return ok;
  }
  if (ex->buffers[thread] == NULL)
    ex->buffers[thread] = g_malloc(ex->slab_max);
  Staging st = {.ex = ex, .slab = slab, .buf = ex->buffers[thread], .op = NULL};
  const void *address = NULL;
  if (!wsync_run_guarded(stage_cb, &st, &address)) {
    record_shrunk_source(ex, slab, st.op);
    return FALSE;
  }
  g_mutex_lock(&slab->file->write_lock);
  ok = write_bytes(ex, slab, NULL, st.buf, slab->nbytes, pos);
  g_mutex_unlock(&slab->file->write_lock);
  return ok;
}

static gboolean
should_stop(Executor *ex)
{
  if (ex->interrupted != NULL && *ex->interrupted)
    g_atomic_int_set(&ex->failed, 1);
  return g_atomic_int_get(&ex->failed) != 0;
}

/* The next slab to write, from the file that the fewest threads are writing (each file
 * takes its writes one at a time: pwrite(2) and copy_file_range(2) hold the file's
 * inode lock while they copy), or FALSE when every slab is handed out. */
static gboolean
next_slab(Executor *ex, Slab *slab)
{
  OutFile *best = NULL;

  g_mutex_lock(&ex->lock);
  for (guint p = 0; p < ex->files->len; p++) {
    OutFile *f = ex->files->pdata[p];
    while (f->next < f->tensors->len) {
      if (f->next_slab == 0)
        cut_tensor(f->tensors->pdata[f->next], ex->slab_max, &f->cut);
      if (f->next_slab < f->cut.count)
        break;
      f->next++;
      f->next_slab = 0;
    }
    if (f->next < f->tensors->len && (best == NULL || f->writers < best->writers))
      best = f;
  }
  if (best != NULL) {
    slab_of(best->tensors->pdata[best->next], &best->cut, best->next_slab++, slab);
    slab->file = best;
    best->writers++;
  }
  g_mutex_unlock(&ex->lock);
  return best != NULL;
}

typedef struct {
  Executor *ex;
  guint index;
} Worker;

static gpointer
worker_main(gpointer data)
{
  Worker *w = data;
  Executor *ex = w->ex;
  Slab slab;

  while (!should_stop(ex) && next_slab(ex, &slab)) {
    write_slab(ex, w->index, &slab);
    __atomic_fetch_add(&ex->done_bytes, slab.nbytes, __ATOMIC_RELAXED);
    g_mutex_lock(&ex->lock);
    slab.file->writers--;
    g_mutex_unlock(&ex->lock);
  }
  g_mutex_lock(&ex->lock);
  ex->running--;
  g_cond_signal(&ex->finished);
  g_mutex_unlock(&ex->lock);
  return NULL;
}

/* "wsync: 12.3 GB of 60.1 GB written (20%)" on stderr, at most twice a second. */
static void
report_progress(Executor *ex)
{
  wsync_progress_show(&ex->progress, __atomic_load_n(&ex->done_bytes, __ATOMIC_RELAXED), FALSE);
}

/* Creates the files of every rank, writes them all at once, and flushes them. */
static gboolean
write_outputs(WsyncPlan *plan, const char *dir, Executor *ex, GHashTable *weight_map,
              GError **error)
{
  g_autoptr(GPtrArray) files = g_ptr_array_new_with_free_func(outfile_free);
  g_autofree GThread **threads = g_new0(GThread *, ex->n_threads);
  g_autofree Worker *workers = g_new0(Worker, ex->n_threads);

  for (guint l = 0; l < plan->outputs->len; l++)
    if (!create_files(plan, plan->outputs->pdata[l], dir, weight_map, files, error))
      return FALSE;
  ex->files = files;
  ex->running = ex->n_threads;
  for (guint t = 0; t < ex->n_threads; t++) {
    workers[t] = (Worker){ex, t};
    threads[t] = g_thread_new("wsync-writer", worker_main, &workers[t]);
  }
  /* wait for every slab before the files are flushed, reporting progress and watching
   * for a signal meanwhile */
  g_mutex_lock(&ex->lock);
  while (ex->running > 0) {
    g_cond_wait_until(&ex->finished, &ex->lock, g_get_monotonic_time() + 50000);
    g_mutex_unlock(&ex->lock);
    should_stop(ex);
    report_progress(ex);
    g_mutex_lock(&ex->lock);
  }
  g_mutex_unlock(&ex->lock);
  for (guint t = 0; t < ex->n_threads; t++)
    g_thread_join(threads[t]);
  ex->files = NULL;
  if (g_atomic_int_get(&ex->failed)) {
    g_mutex_lock(&ex->lock);
    if (ex->error != NULL && (error == NULL || *error == NULL))
      g_propagate_error(error, g_steal_pointer(&ex->error));
    g_mutex_unlock(&ex->lock);
    return FALSE;
  }
  /* every byte of every tensor was in exactly one slab: anything else is a bug here,
   * and must not leave a file with a hole of zeros that looks complete */
  guint64 done = __atomic_load_n(&ex->done_bytes, __ATOMIC_RELAXED);
  if (done != ex->total_bytes) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_IO,
                "internal error: %" G_GUINT64_FORMAT " of the %" G_GUINT64_FORMAT
                " bytes of the output were written",
                done, ex->total_bytes);
    return FALSE;
  }
  for (guint p = 0; p < files->len; p++)
    if (!wsync_safetensors_writer_finish(((OutFile *)files->pdata[p])->writer, error))
      return FALSE;
  return TRUE;
}

/* Refuses to start (naming @dst) when the file system of the temporary directory @dir
 * has less room than the output's data needs, so that a full disk is found before
 * anything is written (the writes would fail with ENOSPC anyway, after filling it).  A file system that does not count
 * its blocks (f_blocks 0) is not checked. */
static gboolean
check_space(const char *dir, const char *dst, guint64 needed, GError **error)
{
  struct statvfs sv;

  if (statvfs(dir, &sv) != 0 || sv.f_blocks == 0)
    return TRUE;
  guint64 avail = (guint64)sv.f_bavail * sv.f_frsize;
  if (avail >= needed)
    return TRUE;
  g_autofree char *pdir = wsync_printable(dst);
  g_autofree char *need = g_format_size(needed), *have = g_format_size(avail);
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_IO,
              "cannot write %s: %s (the output needs %s, the file system has %s free)", pdir,
              g_strerror(ENOSPC), need, have);
  return FALSE;
}

/* For tests, where no signal from outside lands reliably (the end's steps last
 * microseconds):
 *  - of the command-line tool (wsync(1), WSYNC_TEST_SIGNAL_AFTER=PHASE): raises SIGTERM
 *    after @phase: "marker written" (every file and the marker written, right before the
 *    last check for a signal) or "swap ended" (DST swapped in), the phases the
 *    distributed sync names (core/sync-mpi.c, say()); only in a run that watches for
 *    signals (@interrupted, a handler that records them: cli_catch_signals());
 *  - of the Python module (tests/test-python.py, convert_interrupted_at_the_swap;
 *    WSYNC_TEST_SIGNAL_AT=POINT): raises SIGINT at @point, "written" or "swapped", the
 *    same two moments.  At "written" it then waits (up to 10 s) for the flag: the module
 *    hears the signal on another thread (python/module.c plan_job_wait()) and sets it a
 *    little later.
 * Planning (core/plan.c) has a third moment: "planning began" / "planning", as plan,
 * convert and merge begin to plan, before the first check of the flag (wsync(1) ends
 * at once there, core/cli.c end_planning(): its SIGTERM comes whatever @interrupted);
 * the module's SIGINT then waits for the flag as at "written".  A session's plan has its
 * own: "binding", as wsync_session_plan() begins to bind the trainer's tensors (in Python,
 * Session.describe(); tests/test-python.py, session_describe_hears_ctrl_c_while_it_plans),
 * where the module's SIGINT waits for the flag too. */
void
plan_signal_if_asked(const volatile sig_atomic_t *interrupted, const char *phase,
                     const char *point)
{
  gboolean wait = strcmp(point, "written") == 0 || strcmp(point, "planning") == 0 ||
                  strcmp(point, "binding") == 0;

  const char *after = g_getenv("WSYNC_TEST_SIGNAL_AFTER");
  const char *at = g_getenv("WSYNC_TEST_SIGNAL_AT");

  if ((interrupted != NULL || strcmp(phase, "planning began") == 0) && after != NULL &&
      strcmp(after, phase) == 0)
    raise(SIGTERM);
  if (at == NULL || strcmp(at, point) != 0)
    return;
  raise(SIGINT);
  for (int i = 0; wait && interrupted != NULL && !*interrupted && i < 1000; i++)
    g_usleep(10 * G_TIME_SPAN_MILLISECOND);
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
  ex.plan = plan;
  wsync_progress_init(&ex.progress, progress ? WSYNC_PROGRESS_TERMINAL : WSYNC_PROGRESS_OFF,
                      "written", wsync_plan_total_bytes(plan));
  ex.interrupted = interrupted;
  ex.total_bytes = wsync_plan_total_bytes(plan);
  ex.n_threads = MAX(plan->threads, 1);
  ex.slab_max = CLAMP(STAGING_TOTAL / ex.n_threads, 4096, SLAB_MAX);
  ex.buffers = g_new0(guint8 *, ex.n_threads);
  g_mutex_init(&ex.lock);
  g_cond_init(&ex.finished);
  ok = check_space(tmp, d.path, ex.total_bytes, error) &&
       write_outputs(plan, tmp, &ex, weight_map, error);
  if (ok)
    wsync_progress_show(&ex.progress, ex.total_bytes, TRUE);
  wsync_progress_end(&ex.progress); /* before an error too */
  for (guint t = 0; t < ex.n_threads; t++)
    g_free(ex.buffers[t]);
  g_free(ex.buffers);
  g_clear_error(&ex.error);
  g_cond_clear(&ex.finished);
  g_mutex_clear(&ex.lock);
  if (ok && weight_map != NULL) {
    g_autofree char *index = g_build_filename(tmp, WSYNC_INDEX_NAME, NULL);
    ok = wsync_index_write(index, wsync_plan_total_bytes(plan), weight_map, error);
  }
  ok = ok && companion_write_for_plan(plan, tmp, interrupted, error) && write_marker(tmp, error);
  if (ok)
    plan_signal_if_asked(interrupted, "marker written", "written");
  /* the last moment a signal can stop the run: after this, DST is the new output (a
   * signal caught later is the caller's to report: cli_end_by_caught_signal()) */
  if (interrupted != NULL && *interrupted)
    ok = companion_interrupted(error, *interrupted);
  gboolean swapped = FALSE;
  ok = ok && install_dir(tmp, &d, force, &swapped, error);
  if (swapped)
    plan_signal_if_asked(interrupted, "swap ended", "swapped");
  if (!ok && !swapped) /* swapped: @tmp is gone, or holds the previous DST, kept */
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
      wsync_entry_explain_silence(error);
      g_prefix_error(error, "config patcher \"%s\" (plugin \"%s\"): ", wsync_entry_get_name(e),
                     wsync_entry_get_plugin(e));
      if (error != NULL)
        wsync_error_make_printable(*error); /* it may quote the config */
      return FALSE;
    }
  }
  return TRUE;
}
