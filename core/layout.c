/* wsync: layouts (see <wsync/layout.h>): the real tensors of one rank, their
 * placements and fills, and the geometry of boxes. */
#include <string.h>

#include "engine-private.h"

/* ------------------------------------------------------------------ geometry */

void
wsync_box_whole(WsyncBox *box, guint ndim, const guint64 *shape)
{
  memset(box, 0, sizeof *box);
  box->ndim = ndim;
  for (guint d = 0; d < ndim; d++)
    box->extent[d] = shape[d];
}

guint64
wsync_box_volume(const WsyncBox *box)
{
  guint64 v = 1;

  for (guint d = 0; d < box->ndim; d++)
    v *= box->extent[d];
  return v;
}

gboolean
wsync_box_intersect(const WsyncBox *a, const WsyncBox *b, WsyncBox *out)
{
  out->ndim = a->ndim;
  for (guint d = 0; d < a->ndim; d++) {
    guint64 lo = MAX(a->offset[d], b->offset[d]);
    guint64 hi = MIN(a->offset[d] + a->extent[d], b->offset[d] + b->extent[d]);
    if (hi <= lo)
      return FALSE;
    out->offset[d] = lo;
    out->extent[d] = hi - lo;
  }
  return TRUE;
}

char *
wsync_box_format(const WsyncBox *box)
{
  GString *s = g_string_new("[");

  for (guint d = 0; d < box->ndim; d++)
    g_string_append_printf(s, "%s%" G_GUINT64_FORMAT ":%" G_GUINT64_FORMAT, d ? ", " : "",
                           box->offset[d], box->offset[d] + box->extent[d]);
  g_string_append_c(s, ']');
  return g_string_free(s, FALSE);
}

char *
wsync_shape_format(guint ndim, const guint64 *shape)
{
  GString *s = g_string_new("[");

  for (guint d = 0; d < ndim; d++)
    g_string_append_printf(s, d ? ", %" G_GUINT64_FORMAT : "%" G_GUINT64_FORMAT, shape[d]);
  g_string_append_c(s, ']');
  return g_string_free(s, FALSE);
}

gboolean
wsync_shape_numel(guint ndim, const guint64 *shape, guint64 *numel)
{
  *numel = 1;
  for (guint d = 0; d < ndim; d++)
    if (!g_uint64_checked_mul(numel, *numel, shape[d])) {
      *numel = G_MAXUINT64;
      return FALSE;
    }
  return TRUE;
}

void
wsync_region_row_major(WsyncRegion *region, guint ndim, const guint64 *shape, const guint64 *at)
{
  guint64 stride = 1;

  memset(region, 0, sizeof *region);
  for (guint d = ndim; d > 0; d--) {
    region->stride[d - 1] = stride;
    if (at != NULL)
      region->origin += at[d - 1] * stride;
    stride *= shape[d - 1];
  }
}

gboolean
wsync_tensor_box_of(guint ndim, const guint64 *shape, guint op_ndim, const guint64 *extent,
                    guint64 origin, const guint64 *stride, WsyncBox *out)
{
  guint64 rm[WSYNC_MAX_DIMS];
  gboolean used[WSYNC_MAX_DIMS] = {FALSE};
  guint64 s = 1;

  for (guint d = ndim; d > 0; d--) {
    rm[d - 1] = s;
    s *= shape[d - 1];
  }
  out->ndim = ndim;
  for (guint d = 0; d < ndim; d++) {
    out->offset[d] = shape[d] ? (origin / rm[d]) % shape[d] : 0;
    out->extent[d] = 1;
  }
  if (ndim > 0 && shape[0] && origin / rm[0] >= shape[0])
    return FALSE;
  for (guint k = 0; k < op_ndim; k++) {
    gboolean found = FALSE;
    if (extent[k] == 1)
      continue;
    for (guint d = 0; d < ndim && !found; d++)
      if (!used[d] && rm[d] == stride[k] && shape[d] > 1) {
        used[d] = found = TRUE;
        out->extent[d] = extent[k];
      }
    if (!found)
      return FALSE;
  }
  for (guint d = 0; d < ndim; d++)
    if (out->offset[d] + out->extent[d] > shape[d])
      return FALSE;
  return TRUE;
}

/* ------------------------------------------------------------------ layouts */

static void
layout_tensor_free(gpointer data)
{
  WsyncLayoutTensor *t = data;

  if (t == NULL) /* released (layout_tensor_release()) */
    return;
  g_free(t->name);
  for (guint i = 0; t->fills != NULL && i < t->fills->len; i++)
    g_free(g_array_index(t->fills, Fill, i).reason);
  if (t->fills)
    g_array_unref(t->fills);
  g_free(t->state);
  g_free(t->ops); /* and op_axes, in the same allocation */
  g_free(t);
}

/* Blocks of the arena: big enough that their overhead does not count, small enough to
 * come from the heap (glibc maps 128 KiB and more on their own). */
#define ARENA_BLOCK (64 * 1024)

/* @size bytes from @layout's arena, aligned for guint64 and pointers. */
static gpointer
layout_arena_alloc(WsyncLayout *layout, gsize size)
{
  gpointer p;

  size = (size + 7) & ~(gsize)7;
  if (size > ARENA_BLOCK / 4) { /* a block of its own, not a block's worth of waste */
    p = g_malloc(size);
    g_ptr_array_add(layout->arena, p);
    return p;
  }
  if (size > layout->arena_left) {
    layout->arena_next = g_malloc(ARENA_BLOCK);
    layout->arena_left = ARENA_BLOCK;
    g_ptr_array_add(layout->arena, layout->arena_next);
  }
  p = layout->arena_next;
  layout->arena_next += size;
  layout->arena_left -= size;
  return p;
}

void
layout_forget_placements(WsyncLayout *layout)
{
  for (guint i = 0; i < layout->tensors->len; i++) {
    WsyncLayoutTensor *t = layout->tensors->pdata[i];
    t->placements = NULL;
    t->n_placements = t->placements_cap = 0;
  }
  /* not set_size: that would keep the storage */
  g_ptr_array_unref(layout->arena);
  layout->arena = g_ptr_array_new_with_free_func(g_free);
  layout->arena_next = NULL;
  layout->arena_left = 0;
}

guint
layout_tensor_n_placements(const WsyncLayoutTensor *lt)
{
  return lt->n_placements;
}

void
layout_tensor_placement(const WsyncLayoutTensor *lt, guint i, Placement *out)
{
  const StoredPlacement *stored = &lt->placements[i];
  const guint64 *axes = stored->axes;
  guint n = stored->ndim;

  memset(out, 0, sizeof *out);
  out->lt = stored->lt;
  out->box.ndim = n;
  memcpy(out->box.offset, axes, n * sizeof(guint64));
  memcpy(out->box.extent, axes + n, n * sizeof(guint64));
  out->region.origin = stored->origin;
  memcpy(out->region.stride, axes + 2 * n, n * sizeof(guint64));
}

/* Sets the region of placement @i of @lt (a region has the axes of its box, which stays). */
static void
layout_tensor_set_region(WsyncLayoutTensor *lt, guint i, const WsyncRegion *region)
{
  StoredPlacement *stored = &lt->placements[i];

  stored->origin = region->origin;
  memcpy(stored->axes + 2 * stored->ndim, region->stride, stored->ndim * sizeof(guint64));
}

GPtrArray *
layout_take_tensors(WsyncLayout *layout)
{
  GPtrArray *tensors = layout->tensors;

  g_hash_table_remove_all(layout->by_name);
  layout->tensors = g_ptr_array_new_with_free_func(layout_tensor_free);
  return tensors;
}

void
layout_tensor_release(GPtrArray *tensors, guint i)
{
  layout_tensor_free(tensors->pdata[i]);
  tensors->pdata[i] = NULL;
}


void
ops_builder_init(OpsBuilder *b)
{
  b->ops = g_array_new(FALSE, TRUE, sizeof(StoredOp));
  b->axes = g_array_new(FALSE, FALSE, sizeof(guint64));
}

void
ops_builder_clear(OpsBuilder *b)
{
  g_clear_pointer(&b->ops, g_array_unref);
  g_clear_pointer(&b->axes, g_array_unref);
}

/* The index in @b's axes of @op's extent and strides: the previous op's, when they
 * are the same, else a new copy. */
static guint
op_geometry(OpsBuilder *b, const Op *op)
{
  guint n = op->ndim;

  if (n == 0)
    return b->axes->len; /* no axes (a fill's box is its Fill's) */
  if (b->ops->len > 0) {
    const StoredOp *prev = &g_array_index(b->ops, StoredOp, b->ops->len - 1);
    const guint64 *axes = &g_array_index(b->axes, guint64, prev->geometry);
    if (prev->ndim == n && memcmp(axes, op->extent, n * sizeof(guint64)) == 0 &&
        memcmp(axes + n, op->dst_stride, n * sizeof(guint64)) == 0 &&
        memcmp(axes + 2 * n, op->src_stride, n * sizeof(guint64)) == 0)
      return prev->geometry;
  }
  g_array_append_vals(b->axes, op->extent, n);
  g_array_append_vals(b->axes, op->dst_stride, n);
  g_array_append_vals(b->axes, op->src_stride, n);
  return b->axes->len - 3 * n;
}

void
layout_tensor_add_op(OpsBuilder *b, const Op *op)
{
  StoredOp stored = {.kind = op->kind, .ndim = op->ndim, .src_dtype = op->src_dtype,
                     .dst_origin = op->dst_origin, .src_origin = op->src_origin, .lt = op->lt};

  g_assert(op->ndim <= WSYNC_MAX_DIMS);
  g_assert(b->axes->len + 4 * op->ndim <= G_MAXUINT);
  g_assert(b->ops->len < G_MAXUINT);
  if (op->kind == OP_FILL)
    stored.from.fill = op->fill;
  else
    stored.from.source = op->source;
  stored.geometry = op_geometry(b, op);
  stored.lbox = b->axes->len;
  g_array_append_vals(b->axes, op->lbox.offset, op->ndim);
  g_array_append_val(b->ops, stored);
}

void
layout_tensor_seal_ops(WsyncLayoutTensor *lt, OpsBuilder *b)
{
  gsize ops_bytes = (gsize)b->ops->len * sizeof(StoredOp);
  gsize axes_bytes = (gsize)b->axes->len * sizeof(guint64);

  G_STATIC_ASSERT(sizeof(StoredOp) % sizeof(guint64) == 0); /* the axes stay aligned */
  g_assert(lt->ops == NULL);
  lt->n_ops = b->ops->len;
  lt->ops = g_malloc(ops_bytes + axes_bytes);
  if (ops_bytes > 0)
    memcpy(lt->ops, b->ops->data, ops_bytes);
  lt->op_axes = (const guint64 *)((guint8 *)lt->ops + ops_bytes);
  if (axes_bytes > 0)
    memcpy((guint8 *)lt->ops + ops_bytes, b->axes->data, axes_bytes);
  g_array_set_size(b->ops, 0);
  g_array_set_size(b->axes, 0);
}

void
layout_tensor_op(const WsyncLayoutTensor *lt, guint i, Op *op)
{
  const StoredOp *stored;
  const guint64 *geometry;
  guint n;

  g_assert(i < lt->n_ops);
  stored = &lt->ops[i];
  n = stored->ndim;
  memset(op, 0, sizeof *op);
  op->kind = stored->kind;
  op->ndim = n;
  op->src_dtype = stored->src_dtype;
  op->dst_origin = stored->dst_origin;
  op->src_origin = stored->src_origin;
  op->lt = stored->lt;
  if (stored->kind == OP_FILL)
    op->fill = stored->from.fill;
  else
    op->source = stored->from.source;
  if (n == 0)
    return; /* it stored no axes (a fill: its box is its Fill's) */
  geometry = &lt->op_axes[stored->geometry];
  memcpy(op->extent, geometry, n * sizeof(guint64));
  memcpy(op->dst_stride, geometry + n, n * sizeof(guint64));
  memcpy(op->src_stride, geometry + 2 * n, n * sizeof(guint64));
  op->lbox.ndim = n;
  memcpy(op->lbox.offset, &lt->op_axes[stored->lbox], n * sizeof(guint64));
  memcpy(op->lbox.extent, geometry, n * sizeof(guint64));
}

WsyncLayout *
wsync_layout_new(WsyncModel *m, WsyncContext *ctx, const char *target, const char *format,
                 guint tp, guint ep, guint rank, guint world, gboolean reading)
{
  WsyncLayout *layout = g_new0(WsyncLayout, 1);

  layout->model = m;
  layout->ctx = ctx;
  layout->target = g_strdup(target);
  layout->format = g_strdup(format);
  layout->tp = tp;
  layout->ep = ep;
  layout->rank = rank;
  layout->world = world;
  layout->reading = reading;
  layout->tensors = g_ptr_array_new_with_free_func(layout_tensor_free);
  layout->by_name = g_hash_table_new(g_str_hash, g_str_equal);
  layout->dropped = g_array_new(FALSE, TRUE, sizeof(DroppedParam));
  layout->omitted = g_array_new(FALSE, TRUE, sizeof(DroppedParam));
  layout->metadata = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
  layout->arena = g_ptr_array_new_with_free_func(g_free);
  return layout;
}

void
wsync_layout_free(WsyncLayout *layout)
{
  if (layout == NULL)
    return;
  g_free(layout->target);
  g_free(layout->format);
  g_free(layout->needs_hook);
  g_hash_table_unref(layout->by_name);
  g_ptr_array_unref(layout->tensors);
  g_ptr_array_unref(layout->arena);
  for (guint i = 0; i < layout->dropped->len; i++)
    g_free(g_array_index(layout->dropped, DroppedParam, i).rule);
  g_array_unref(layout->dropped);
  for (guint i = 0; i < layout->omitted->len; i++)
    g_free(g_array_index(layout->omitted, DroppedParam, i).rule);
  g_array_unref(layout->omitted);
  g_hash_table_unref(layout->metadata);
  if (layout->notes)
    g_ptr_array_unref(layout->notes);
  if (layout->input_names)
    g_hash_table_unref(layout->input_names);
  if (layout->input_metadata)
    g_hash_table_unref(layout->input_metadata);
  if (layout->switches_asked)
    g_ptr_array_unref(layout->switches_asked);
  g_free(layout->disagreeing_key);
  g_free(layout);
}

const char *
wsync_layout_get_target(WsyncLayout *layout)
{
  return layout->target;
}

guint
wsync_layout_get_tp(WsyncLayout *layout)
{
  return layout->tp;
}

guint
wsync_layout_get_ep(WsyncLayout *layout)
{
  return layout->ep;
}

guint
wsync_layout_get_rank(WsyncLayout *layout)
{
  return layout->rank;
}


guint
wsync_layout_get_world(WsyncLayout *layout)
{
  return layout->world;
}

WsyncModel *
wsync_layout_get_model(WsyncLayout *layout)
{
  return layout->model;
}

guint
wsync_layout_n_logical(WsyncLayout *layout)
{
  return layout->model->logical->len;
}

WsyncLogicalTensor *
wsync_layout_logical(WsyncLayout *layout, guint index)
{
  return layout->model->logical->pdata[index];
}

const char *
wsync_layout_get_format(WsyncLayout *layout)
{
  return layout->format;
}

gboolean
wsync_layout_is_reading(WsyncLayout *layout)
{
  return layout->reading;
}






guint
wsync_layout_n_params(WsyncLayout *layout)
{
  return layout->model->params->len;
}

const WsyncParam *
wsync_layout_param(WsyncLayout *layout, guint index)
{
  return layout->model->params->pdata[index];
}

const char *
wsync_layout_get_runtime_drop(WsyncLayout *layout, const WsyncBlock *block)
{
  RuntimeSwitch *sw = block->runtime_switch;

  if (sw != NULL) {
    if (layout->switches_asked == NULL)
      layout->switches_asked = g_ptr_array_new();
    if (!g_ptr_array_find(layout->switches_asked, sw, NULL))
      g_ptr_array_add(layout->switches_asked, sw);
  }
  return wsync_block_get_runtime_drop(block);
}

gboolean
wsync_layout_input_has(WsyncLayout *layout, const char *name)
{
  return layout->reading && layout->input_names != NULL &&
         g_hash_table_contains(layout->input_names, name);
}

WsyncLayoutTensor *
wsync_layout_add_tensor(WsyncLayout *layout, const char *name, WsyncDtype dtype, guint ndim,
                        const guint64 *shape, GError **error)
{
  WsyncLayoutTensor *t;

  if (g_hash_table_contains(layout->by_name, name)) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                "%s: tensor \"%s\" is added twice to the %s layout of rank %u",
                layout->current_entry ? layout->current_entry : "layout", name, layout->target,
                layout->rank);
    return NULL;
  }
  if (ndim > WSYNC_MAX_DIMS) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE, "tensor \"%s\" has %u axes", name, ndim);
    return NULL;
  }
  t = g_malloc0(sizeof *t + ndim * sizeof t->shape[0]);
  t->name = g_strdup(name);
  t->dtype = dtype;
  t->ndim = ndim;
  memcpy(t->shape, shape, ndim * sizeof(guint64));
  t->made_by = g_intern_string(layout->current_entry);
  g_ptr_array_add(layout->tensors, t);
  g_hash_table_insert(layout->by_name, t->name, t);
  return t;
}

void
wsync_layout_place(WsyncLayout *layout, WsyncLayoutTensor *tensor, WsyncLogicalTensor *lt,
                   const WsyncBox *box, const WsyncRegion *region)
{
  guint n = box->ndim;
  StoredPlacement *stored;

  g_return_if_fail(n <= WSYNC_MAX_DIMS);
  if (tensor->n_placements == tensor->placements_cap) {
    /* doubled: what it leaves behind goes with the arena */
    guint cap = tensor->placements_cap ? 2 * tensor->placements_cap : 1;
    StoredPlacement *grown = layout_arena_alloc(layout, cap * sizeof *grown);
    if (tensor->n_placements > 0)
      memcpy(grown, tensor->placements, tensor->n_placements * sizeof *grown);
    tensor->placements = grown;
    tensor->placements_cap = cap;
  }
  stored = &tensor->placements[tensor->n_placements++];
  stored->lt = lt;
  stored->ndim = n;
  stored->origin = region->origin;
  stored->axes = layout_arena_alloc(layout, MAX(3 * n, 1) * sizeof(guint64));
  memcpy(stored->axes, box->offset, n * sizeof(guint64));
  memcpy(stored->axes + n, box->extent, n * sizeof(guint64));
  memcpy(stored->axes + 2 * n, region->stride, n * sizeof(guint64));
}

void
wsync_layout_place_at(WsyncLayout *layout, WsyncLayoutTensor *tensor, WsyncLogicalTensor *lt,
                      const WsyncBox *box, const guint64 *at)
{
  WsyncRegion region;

  wsync_region_row_major(&region, tensor->ndim, tensor->shape, at);
  wsync_layout_place(layout, tensor, lt, box, &region);
}

WsyncLayoutTensor *
wsync_layout_add_whole(WsyncLayout *layout, WsyncLogicalTensor *lt, GError **error)
{
  WsyncLayoutTensor *t =
      wsync_layout_add_tensor(layout, lt->name, lt->published_dtype, lt->ndim, lt->shape, error);
  WsyncBox box;

  if (t == NULL)
    return NULL;
  wsync_box_whole(&box, lt->ndim, lt->shape);
  wsync_layout_place_at(layout, t, lt, &box, NULL);
  t->param = lt->param;
  /* the output file a sharded source asks for (DCP -model-I-of-N) */
  t->part_hint = lt->part_hint;
  t->n_parts_hint = lt->n_parts_hint;
  return t;
}

void
wsync_layout_fill(WsyncLayout *layout, WsyncLayoutTensor *tensor, const WsyncBox *box,
                  const guint8 *value, gsize value_len, const char *reason)
{
  Fill fill = {.box = *box, .value_len = MIN(value_len, sizeof fill.value)};

  (void)layout;
  memcpy(fill.value, value, fill.value_len);
  fill.reason = g_strdup(reason);
  if (tensor->fills == NULL)
    tensor->fills = g_array_new(FALSE, TRUE, sizeof(Fill));
  g_array_append_val(tensor->fills, fill);
}

void
wsync_layout_drop_param(WsyncLayout *layout, const WsyncParam *param, const char *rule)
{
  DroppedParam d = {param, g_strdup(rule)};
  g_array_append_val(layout->dropped, d);
}

guint
wsync_layout_n_tensors(WsyncLayout *layout)
{
  return layout->tensors->len;
}

WsyncLayoutTensor *
wsync_layout_tensor(WsyncLayout *layout, guint index)
{
  return layout->tensors->pdata[index];
}

const char *
wsync_layout_tensor_get_name(const WsyncLayoutTensor *tensor)
{
  return tensor->name;
}

void
wsync_layout_tensor_set_param(WsyncLayoutTensor *tensor, const WsyncParam *param)
{
  tensor->param = param;
}

const WsyncParam *
wsync_layout_tensor_get_param(const WsyncLayoutTensor *tensor)
{
  return tensor->param;
}

void
wsync_layout_tensor_set_state(WsyncLayout *layout, WsyncLayoutTensor *tensor, const char *state)
{
  g_free(tensor->state);
  tensor->state = g_strdup(state);
  if (layout->current_entry != NULL && tensor->made_by != NULL &&
      strstr(tensor->made_by, layout->current_entry) == NULL) {
    g_autofree char *by =
        g_strdup_printf("%s, then %s", tensor->made_by, layout->current_entry);
    tensor->made_by = g_intern_string(by);
  }
}

void
wsync_layout_tensor_permute_last2(WsyncLayoutTensor *t)
{
  guint a = t->ndim - 2, b = t->ndim - 1;

  g_return_if_fail(t->ndim >= 2);
  /* A placement's region maps box axes to element strides of the tensor.  After the
   * swap, element (.., i, j) of the old tensor is element (.., j, i) of the new one:
   * strides along the old axes a and b become the new row-major strides of b and a. */
  guint64 old_stride_a = t->shape[b], new_stride_b = t->shape[a];
  for (guint i = 0; i < layout_tensor_n_placements(t); i++) {
    Placement p;
    layout_tensor_placement(t, i, &p);
    guint64 outer_stride = t->shape[a] * t->shape[b];
    /* decompose the origin into (outer, i, j) of the old tensor */
    guint64 outer = p.region.origin / outer_stride;
    guint64 rem = p.region.origin % outer_stride;
    guint64 oi = rem / old_stride_a, oj = rem % old_stride_a;
    p.region.origin = outer * outer_stride + oj * new_stride_b + oi;
    for (guint k = 0; k < p.box.ndim; k++) {
      guint64 s = p.region.stride[k];
      if (s % outer_stride == 0 && s >= outer_stride)
        continue; /* an outer axis: unchanged */
      /* within one matrix: s = di*old_stride_a + dj */
      guint64 di = s / old_stride_a, dj = s % old_stride_a;
      p.region.stride[k] = dj * new_stride_b + di;
    }
    layout_tensor_set_region(t, i, &p.region);
  }
  for (guint i = 0; t->fills != NULL && i < t->fills->len; i++) {
    Fill *f = &g_array_index(t->fills, Fill, i);
    guint64 o = f->box.offset[a], e = f->box.extent[a];
    f->box.offset[a] = f->box.offset[b];
    f->box.extent[a] = f->box.extent[b];
    f->box.offset[b] = o;
    f->box.extent[b] = e;
  }
  guint64 s = t->shape[a];
  t->shape[a] = t->shape[b];
  t->shape[b] = s;
  t->permuted = !t->permuted;
}

void
wsync_layout_set_metadata(WsyncLayout *layout, const char *key, const char *value)
{
  g_hash_table_insert(layout->metadata, g_strdup(key), g_strdup(value));
}

/* A target reads a rank's records from its first file; the first of the rank's other
 * files that holds another value of @key (or lacks it) is remembered, and the layout is
 * refused once built (plan_build_layout()), rather than read as the first file says. */
static void
check_input_files_agree(WsyncLayout *layout, const char *key, const char *value)
{
  if (layout->input_files == NULL || layout->disagreeing_key != NULL)
    return;
  for (guint i = 1; i < layout->input_files->len; i++) {
    GHashTable *md = wsync_safetensors_metadata(layout->input_files->pdata[i]);
    if (g_strcmp0(g_hash_table_lookup(md, key), value) != 0) {
      layout->disagreeing_key = g_strdup(key);
      layout->disagreeing_file = i;
      return;
    }
  }
}

const char *
wsync_layout_get_input_metadata(WsyncLayout *layout, const char *key)
{
  const char *value;

  if (layout->input_metadata == NULL)
    return NULL;
  value = g_hash_table_lookup(layout->input_metadata, key);
  check_input_files_agree(layout, key, value);
  return value;
}

void
wsync_layout_add_note(WsyncLayout *layout, const char *note)
{
  if (layout->notes == NULL)
    layout->notes = g_ptr_array_new_with_free_func(g_free);
  g_ptr_array_add(layout->notes, g_strdup(note));
}

void
wsync_layout_require_hook(WsyncLayout *layout, const char *reason)
{
  g_free(layout->needs_hook);
  layout->needs_hook = g_strdup(reason);
}

cfg_t *
wsync_layout_get_option(WsyncLayout *layout, const char *plugin_name)
{
  return layout->ctx ? wsync_context_get_plugin_options(layout->ctx, plugin_name) : NULL;
}
