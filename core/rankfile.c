/* wsync: the rank files of a plan's output layouts, as `wsync convert` writes them,
 * before any of them exists (see rankfile.h). */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "copy.h"
#include "files.h"
#include "rankfile.h"

void
rank_file_free(gpointer data)
{
  RankFile *f = data;

  g_free(f->name);
  g_free(f->header);
  g_array_unref(f->tensors);
  g_free(f);
}

static gint
compare_offsets(gconstpointer a, gconstpointer b)
{
  const RankTensor *x = a, *y = b;

  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

GPtrArray *
rank_files_new(WsyncPlan *plan, WsyncLayout *layout)
{
  GPtrArray *files = g_ptr_array_new_with_free_func(rank_file_free);
  guint n_files = 0;

  for (guint i = 0; i < layout->tensors->len; i++)
    n_files = MAX(n_files, ((WsyncLayoutTensor *)layout->tensors->pdata[i])->part + 1);
  for (guint p = 0; p < n_files; p++) {
    g_autoptr(WsyncSafetensorsWriter) w = wsync_safetensors_writer_new();
    RankFile *f = g_new0(RankFile, 1);
    GHashTableIter it;
    gpointer k, v;

    f->rank = layout->rank;
    f->part = p;
    f->name = plan_file_name(plan, layout, p);
    f->tensors = g_array_new(FALSE, FALSE, sizeof(RankTensor));
    wsync_safetensors_writer_set_metadata(w, "format", "pt");
    g_hash_table_iter_init(&it, layout->metadata);
    while (g_hash_table_iter_next(&it, &k, &v))
      wsync_safetensors_writer_set_metadata(w, k, v);
    for (guint i = 0; i < layout->tensors->len; i++) {
      WsyncLayoutTensor *lt = layout->tensors->pdata[i];
      if (lt->part != p)
        continue;
      /* the plan named and sized it: the writer cannot refuse it */
      gboolean ok = wsync_safetensors_writer_add(w, lt->name, lt->dtype, lt->ndim, lt->shape,
                                                 NULL);
      g_assert(ok);
    }
    f->header = wsync_safetensors_writer_header(w, &f->header_len);
    f->size = f->header_len + wsync_safetensors_writer_data_size(w);
    for (guint i = 0; i < layout->tensors->len; i++) {
      WsyncLayoutTensor *lt = layout->tensors->pdata[i];
      if (lt->part != p)
        continue;
      RankTensor t = {lt, f->header_len + wsync_safetensors_writer_tensor_offset(w, lt->name)};
      g_array_append_val(f->tensors, t);
    }
    g_array_sort(f->tensors, compare_offsets);
    g_ptr_array_add(files, f);
  }
  return files;
}

gboolean
rank_file_begin(int fd, const char *path, const guint8 *header, gsize header_len, guint64 size,
                GError **error)
{
  if (!wsync_file_pwrite_all(fd, path, header, header_len, 0, error))
    return FALSE;
  if (size > (guint64)G_MAXINT64 || ftruncate(fd, (off_t)size) != 0) {
    wsync_set_io_error(error, size > (guint64)G_MAXINT64 ? EFBIG : errno, path, "resize");
    return FALSE;
  }
  return TRUE;
}

guint8 *
rank_file_map_new(int fd, const char *path, const guint8 *header, gsize header_len,
                  guint64 size, GError **error)
{
  int rc;

  if (!rank_file_begin(fd, path, header, header_len, size, error))
    return NULL;
  /* reserve the blocks: writing through a map into a sparse file on a full disk would
   * kill the process with SIGBUS instead of failing here */
  rc = posix_fallocate(fd, 0, (off_t)size);
  if (rc != 0 && rc != EOPNOTSUPP && rc != EINVAL) {
    wsync_set_io_error(error, rc, path, "reserve space for");
    return NULL;
  }
  void *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    wsync_set_io_error(error, errno, path, "map");
    return NULL;
  }
  return map;
}

/* ------------------------------------------------------------------ ranges */

static void
range_free(gpointer data)
{
  RankRange *r = data;

  g_array_unref(r->pieces);
  g_free(r);
}

static guint64
tensor_rows(const WsyncLayoutTensor *lt)
{
  return lt->ndim > 0 ? lt->shape[0] : 1;
}

GPtrArray *
rank_file_cut(const RankFile *file, guint64 max_bytes)
{
  GPtrArray *ranges = g_ptr_array_new_with_free_func(range_free);
  RankRange *open = NULL;

  g_return_val_if_fail(max_bytes > 0, ranges);
  for (guint i = 0; i < file->tensors->len; i++) {
    const RankTensor *t = &g_array_index(file->tensors, RankTensor, i);
    guint64 rows = tensor_rows(t->lt);
    if (t->lt->nbytes == 0)
      continue;
    guint64 row_bytes = t->lt->nbytes / rows;
    for (guint64 row = 0; row < rows;) {
      if (open != NULL && open->nbytes + row_bytes > max_bytes)
        open = NULL; /* full: the next row starts a new range */
      if (open == NULL) {
        open = g_new0(RankRange, 1);
        open->offset = t->offset + row * row_bytes;
        open->pieces = g_array_new(FALSE, FALSE, sizeof(RankPiece));
        g_ptr_array_add(ranges, open);
      }
      /* the safetensors writer leaves no gaps: the range goes on where it ends */
      g_assert(open->offset + open->nbytes == t->offset + row * row_bytes);
      guint64 fit = MIN(rows - row, (max_bytes - MIN(open->nbytes, max_bytes)) / row_bytes);
      if (fit == 0)
        fit = 1; /* a row larger than a range has one of its own */
      RankPiece piece = {t, row, row + fit};
      g_array_append_val(open->pieces, piece);
      open->nbytes += fit * row_bytes;
      row += fit;
    }
  }
  return ranges;
}

/* Elements per row of @lt (its first axis's stride), 1 for a scalar. */
static guint64
row_elements(const WsyncLayoutTensor *lt)
{
  guint64 n = 1;

  if (lt->ndim > 1)
    wsync_shape_numel(lt->ndim - 1, lt->shape + 1, &n); /* a layout's sizes fit */
  return n;
}

/* Sets @item's cut of @op to the rows [@from, @to) of its output tensor, with its
 * destination relative to row @from: the op writes a box of the tensor (the planner
 * proved it), and the op's axis that walks the tensor's first axis, if any, is cut to
 * the rows.  FALSE when the op writes none of them. */
static gboolean
clip_op(const WsyncLayoutTensor *lt, const Op *op, guint64 from, guint64 to, RankItem *item)
{
  WsyncBox box;
  guint64 stride = row_elements(lt);

  item->cut_axis = RANK_ITEM_UNCUT;
  item->dst_origin = op->dst_origin;
  item->src_origin = op->src_origin;
  if (lt->ndim == 0)
    return TRUE; /* a scalar is one row */
  gboolean is_box = wsync_tensor_box_of(lt->ndim, lt->shape, op->ndim, op->extent, op->dst_origin,
                                        op->dst_stride, &box);
  g_assert(is_box);
  guint64 lo = MAX(box.offset[0], from), hi = MIN(box.offset[0] + box.extent[0], to);
  if (lo >= hi)
    return FALSE;
  gboolean cut = box.extent[0] == 1; /* within one row: nothing to cut */
  for (guint k = 0; k < op->ndim && !cut; k++)
    if (op->extent[k] > 1 && op->dst_stride[k] == stride) { /* that axis (layout.c) */
      guint64 skip = lo - box.offset[0];
      item->cut_axis = k;
      item->cut_extent = hi - lo;
      item->dst_origin += skip * stride;
      item->src_origin += skip * op->src_stride[k];
      cut = TRUE;
    }
  g_assert(cut);
  item->dst_origin -= from * stride;
  return TRUE;
}

/* Sets @op to @item's copy op, limited to the item's rows (see clip_op()). */
static void
rank_item_op(const RankItem *item, Op *op)
{
  layout_tensor_op(item->lt, item->op, op);
  if (item->cut_axis != RANK_ITEM_UNCUT)
    op->extent[item->cut_axis] = item->cut_extent;
  op->dst_origin = item->dst_origin;
  op->src_origin = item->src_origin;
}

/* @fill limited to the rows [@from, @to), relative to row @from. */
static gboolean
clip_fill(const WsyncLayoutTensor *lt, const Fill *fill, guint64 from, guint64 to, Fill *out)
{
  *out = *fill;
  if (lt->ndim == 0)
    return TRUE;
  guint64 lo = MAX(fill->box.offset[0], from);
  guint64 hi = MIN(fill->box.offset[0] + fill->box.extent[0], to);
  if (lo >= hi || wsync_box_volume(&fill->box) == 0)
    return FALSE;
  out->box.offset[0] = lo - from;
  out->box.extent[0] = hi - lo;
  return TRUE;
}

static void
piece_items(const WsyncPlan *plan, const RankFile *file, const RankPiece *piece, guint64 at,
            GArray *items)
{
  const WsyncLayoutTensor *lt = piece->tensor->lt;

  for (guint i = 0; i < lt->n_ops; i++) {
    Op op_buf;
    const Op *op = &op_buf;
    layout_tensor_op(lt, i, &op_buf);
    RankItem item = {.plan = plan, .lt = lt, .op = i, .from = piece->from, .to = piece->to,
                     .at = at, .file = file->name};
    if (op->kind == OP_FILL) {
      Fill fill;
      if (!clip_fill(lt, op->fill, piece->from, piece->to, &fill))
        continue;
      item.is_fill = TRUE;
      item.bytes = wsync_box_volume(&fill.box) * wsync_dtype_size(lt->dtype);
      g_array_append_val(items, item);
      continue;
    }
    if (copy_op_bytes(op, lt->dtype) == 0 || !clip_op(lt, op, piece->from, piece->to, &item))
      continue;
    /* cut along the op's first axis into runs of at most RANK_ITEM_BYTES, as the executor
     * does, so that one big tensor keeps every thread busy */
    Op clipped;
    rank_item_op(&item, &clipped);
    guint64 bytes = copy_op_bytes(&clipped, lt->dtype);
    guint64 outer = clipped.ndim ? clipped.extent[0] : 1;
    guint64 per_outer = MAX(bytes / MAX(outer, 1), 1);
    guint64 step = MAX(RANK_ITEM_BYTES / per_outer, 1);
    for (guint64 from = 0; from < outer; from += step) {
      item.outer_from = from;
      item.outer_to = MIN(from + step, outer);
      item.bytes = (item.outer_to - item.outer_from) * per_outer;
      g_array_append_val(items, item);
    }
  }
}

void
rank_range_items(const WsyncPlan *plan, const RankFile *file, const RankRange *range,
                 GArray *items)
{
  for (guint i = 0; i < range->pieces->len; i++) {
    const RankPiece *piece = &g_array_index(range->pieces, RankPiece, i);
    const WsyncLayoutTensor *lt = piece->tensor->lt;
    guint64 row_bytes = lt->nbytes / tensor_rows(lt);
    guint64 at = piece->tensor->offset + piece->from * row_bytes - range->offset;
    piece_items(plan, file, piece, at, items);
  }
}

typedef struct {
  const RankItem *item;
  guint8 *base;
} Run;

static void
run_item(gpointer data)
{
  const Run *run = data;
  const RankItem *item = run->item;
  const WsyncLayoutTensor *lt = item->lt;
  guint8 *dst = run->base + item->at;
  Op op;

  if (item->is_fill) {
    Fill fill;
    guint64 shape[WSYNC_MAX_DIMS] = {0};
    layout_tensor_op(lt, item->op, &op);
    gboolean some = clip_fill(lt, op.fill, item->from, item->to, &fill);
    g_assert(some); /* piece_items() kept it */
    memcpy(shape, lt->shape, lt->ndim * sizeof shape[0]);
    if (lt->ndim > 0)
      shape[0] = item->to - item->from; /* the rows written */
    copy_fill(dst, &fill, wsync_dtype_size(lt->dtype), lt->ndim, shape);
    return;
  }
  rank_item_op(item, &op);
  copy_op(item->plan, &op, item->outer_from, item->outer_to,
          op.source->kind == SOURCE_INPUT ? op.source->input->data : NULL, dst, lt->dtype);
}

gboolean
rank_item_run_of_input(const RankItem *item, const guint8 **src, guint64 *at, guint64 *nbytes)
{
  guint64 src_offset, dst_offset;
  Op op;

  if (item->is_fill)
    return FALSE;
  rank_item_op(item, &op);
  if (op.source->kind != SOURCE_INPUT ||
      !copy_op_run(&op, item->outer_from, item->outer_to, item->lt->dtype, &src_offset,
                   &dst_offset, nbytes))
    return FALSE;
  *src = op.source->input->data + src_offset;
  *at = item->at + dst_offset;
  return TRUE;
}

gboolean
rank_item_run(const RankItem *item, guint8 *base, GError **error)
{
  const void *address = NULL;
  Run run = {item, base};

  if (wsync_run_guarded(run_item, &run, &address))
    return TRUE;
  /* as the executor says it (core/exec.c): the input's file when the address lies in it */
  const Source *source = NULL;
  if (!item->is_fill) {
    Op op;
    layout_tensor_op(item->lt, item->op, &op);
    source = op.source;
  }
  const WsyncTensor *in = source != NULL && source->kind == SOURCE_INPUT ? source->input : NULL;
  gboolean reading = in != NULL && (const guint8 *)address >= in->data &&
                     (const guint8 *)address < in->data + in->nbytes;
  g_autofree char *file = wsync_printable(reading ? in->file : item->file);
  g_autofree char *tensor = wsync_printable(reading ? in->name : item->lt->name);
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_IO,
              "cannot %s %s: the file shrank while wsync was %s it (tensor \"%s\")",
              reading ? "read" : "write", file, reading ? "reading" : "writing", tensor);
  return FALSE;
}
