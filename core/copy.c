/* wsync: the byte kernels that run one operation of a plan (a copy with its transposes
 * and casts, a fill, generated values), between a source pointer and a destination
 * pointer.  Shared by the executor (core/exec.c, into files) and the session.
 */
#include "config.h"

#include <string.h>

#include "copy.h"
#include "transpose.h"

/* ------------------------------------------------------------------ element conversions */

static inline float
bf16_to_f32(guint16 v)
{
  guint32 bits = (guint32)v << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* Round to nearest, ties to even, as torch's copy_ does; NaN stays NaN. */
static inline guint16
f32_to_bf16(float f)
{
  guint32 bits;
  memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return (guint16)((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (guint16)(bits >> 16);
}

static inline float
f16_to_f32(guint16 h)
{
  guint32 sign = (guint32)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  float f;

  if (exp == 0) {
    if (mant == 0)
      bits = sign;
    else { /* subnormal: normalise */
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        exp--;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31)
    bits = sign | 0x7f800000u | (mant << 13);
  else
    bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  memcpy(&f, &bits, 4);
  return f;
}

static inline guint16
f32_to_f16(float f)
{
  guint32 bits, sign, mant;
  gint32 exp;

  memcpy(&bits, &f, 4);
  sign = (bits >> 16) & 0x8000;
  exp = (gint32)((bits >> 23) & 0xff) - 127 + 15;
  mant = bits & 0x7fffff;
  if (((bits >> 23) & 0xff) == 0xff)
    return (guint16)(sign | 0x7c00 | (mant ? 0x200 : 0));
  if (exp >= 31)
    return (guint16)(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10)
      return (guint16)sign;
    mant |= 0x800000;
    guint32 shift = (guint32)(14 - exp);
    guint32 half = 1u << (shift - 1), rest = mant & ((1u << shift) - 1);
    guint32 v = mant >> shift;
    if (rest > half || (rest == half && (v & 1)))
      v++;
    return (guint16)(sign | v);
  }
  guint32 v = ((guint32)exp << 10) | (mant >> 13), rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (v & 1)))
    v++;
  return (guint16)(sign | v);
}

static inline float
load_float(const guint8 *p, WsyncDtype dtype)
{
  guint16 h;
  float f;

  switch (dtype) {
  case WSYNC_DTYPE_BF16:
    memcpy(&h, p, 2);
    return bf16_to_f32(h);
  case WSYNC_DTYPE_F16:
    memcpy(&h, p, 2);
    return f16_to_f32(h);
  default:
    memcpy(&f, p, 4);
    return f;
  }
}

static inline void
store_float(guint8 *p, WsyncDtype dtype, float f)
{
  guint16 h;

  switch (dtype) {
  case WSYNC_DTYPE_BF16:
    h = f32_to_bf16(f);
    memcpy(p, &h, 2);
    break;
  case WSYNC_DTYPE_F16:
    h = f32_to_f16(f);
    memcpy(p, &h, 2);
    break;
  default:
    memcpy(p, &f, 4);
    break;
  }
}

/* ------------------------------------------------------------------ generated values (synth) */

static inline guint64
splitmix64(guint64 x)
{
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* The bytes of element @index of logical tensor @ordinal.  "index" patterns encode
 * where the element came from, so a misplaced byte shows; random ones are small finite
 * floats (or random integers). */
static void
generate_element(const WsyncPlan *plan, guint ordinal, guint64 index, WsyncDtype dtype,
                 guint8 *out)
{
  gsize size = wsync_dtype_size(dtype);

  if (plan->pattern_index) {
    guint64 code = ((guint64)(ordinal + 1) << 32) | (index & 0xffffffffu);
    if (size == 2) {
      guint16 v = (guint16)(((ordinal + 1) * 40503u + index) & 0x7fff);
      if (dtype == WSYNC_DTYPE_BF16 && ((v >> 7) & 0xff) == 0xff)
        v ^= 0x4000; /* keep it finite */
      if (dtype == WSYNC_DTYPE_F16 && ((v >> 10) & 0x1f) == 0x1f)
        v ^= 0x2000;
      memcpy(out, &v, 2);
    } else if (size == 4) {
      guint32 v = (guint32)(((ordinal + 1) << 22) ^ (index & 0x3fffff));
      if (dtype == WSYNC_DTYPE_F32 && ((v >> 23) & 0xff) == 0xff)
        v ^= 0x20000000u;
      memcpy(out, &v, 4);
    } else
      memcpy(out, &code, MIN(size, sizeof code));
    return;
  }
  guint64 r = splitmix64(plan->seed ^ splitmix64(((guint64)ordinal << 40) ^ index));
  if (dtype == WSYNC_DTYPE_BF16 || dtype == WSYNC_DTYPE_F16 || dtype == WSYNC_DTYPE_F32) {
    float f = ((float)(r >> 40) / (float)(1u << 24) - 0.5f) * 0.25f;
    store_float(out, dtype, f);
  } else
    memcpy(out, &r, MIN(size, sizeof r));
}

/* ------------------------------------------------------------------ copy kernels */

typedef struct {
  guint ndim;
  guint64 extent[WSYNC_MAX_DIMS];
  gint64 src_stride[WSYNC_MAX_DIMS]; /* bytes */
  gint64 dst_stride[WSYNC_MAX_DIMS]; /* bytes */
} Walk;

/* Drops axes of extent 1 and merges neighbours that are contiguous on both sides, so
 * that a slice of rows becomes one long run. */
static void
walk_normalise(Walk *w)
{
  guint n = 0;

  for (guint k = 0; k < w->ndim; k++)
    if (w->extent[k] != 1) {
      w->extent[n] = w->extent[k];
      w->src_stride[n] = w->src_stride[k];
      w->dst_stride[n] = w->dst_stride[k];
      n++;
    }
  w->ndim = n;
  for (guint k = n; k > 1; k--) {
    guint a = k - 2, b = k - 1;
    if (w->src_stride[a] == w->src_stride[b] * (gint64)w->extent[b] &&
        w->dst_stride[a] == w->dst_stride[b] * (gint64)w->extent[b]) {
      w->extent[a] *= w->extent[b];
      w->src_stride[a] = w->src_stride[b];
      w->dst_stride[a] = w->dst_stride[b];
      for (guint j = b; j + 1 < w->ndim; j++) {
        w->extent[j] = w->extent[j + 1];
        w->src_stride[j] = w->src_stride[j + 1];
        w->dst_stride[j] = w->dst_stride[j + 1];
      }
      w->ndim--;
    }
  }
}

/* Copies the inner walk of axes [from, ndim) with a row memcpy when the last axis is
 * contiguous on both sides, and a cache-blocked 2-D loop otherwise. */
static void
copy_inner(const Walk *w, guint from, const guint8 *src, guint8 *dst, gsize esize)
{
  if (from == w->ndim) {
    memcpy(dst, src, esize);
    return;
  }
  if (from + 1 == w->ndim) {
    guint64 n = w->extent[from];
    if (w->src_stride[from] == (gint64)esize && w->dst_stride[from] == (gint64)esize) {
      memcpy(dst, src, n * esize);
      return;
    }
    for (guint64 i = 0; i < n; i++)
      memcpy(dst + i * w->dst_stride[from], src + i * w->src_stride[from], esize);
    return;
  }
  if (from + 2 == w->ndim &&
      (w->src_stride[from + 1] != (gint64)esize || w->dst_stride[from + 1] != (gint64)esize)) {
    /* a transpose: 2- and 4-byte elements with one side row-major and the other its
     * transpose go to the fast kernels (core/transpose.c); anything else walks in 32x32
     * tiles so both sides stay in cache */
    const gint64 e = (gint64)esize, *ss = &w->src_stride[from], *ds = &w->dst_stride[from];
    if ((esize == 2 || esize == 4) && ss[1] == e && ds[0] == e && ss[0] > 0 && ds[1] > 0) {
      wsync_transpose(src, (gsize)ss[0], dst, (gsize)ds[1], w->extent[from],
                      w->extent[from + 1], esize);
      return;
    }
    if ((esize == 2 || esize == 4) && ss[0] == e && ds[1] == e && ss[1] > 0 && ds[0] > 0) {
      wsync_transpose(src, (gsize)ss[1], dst, (gsize)ds[0], w->extent[from + 1],
                      w->extent[from], esize);
      return;
    }
    const guint64 B = 32, n0 = w->extent[from], n1 = w->extent[from + 1];
    for (guint64 i0 = 0; i0 < n0; i0 += B)
      for (guint64 j0 = 0; j0 < n1; j0 += B)
        for (guint64 i = i0; i < MIN(i0 + B, n0); i++)
          for (guint64 j = j0; j < MIN(j0 + B, n1); j++)
            memcpy(dst + i * w->dst_stride[from] + j * w->dst_stride[from + 1],
                   src + i * w->src_stride[from] + j * w->src_stride[from + 1], esize);
    return;
  }
  for (guint64 i = 0; i < w->extent[from]; i++)
    copy_inner(w, from + 1, src + i * w->src_stride[from], dst + i * w->dst_stride[from], esize);
}

/* Element by element with a dtype conversion (casts are rare and small). */
static void
cast_inner(const Walk *w, guint from, const guint8 *src, guint8 *dst, WsyncDtype sd,
           WsyncDtype dd)
{
  if (from == w->ndim) {
    store_float(dst, dd, load_float(src, sd));
    return;
  }
  for (guint64 i = 0; i < w->extent[from]; i++)
    cast_inner(w, from + 1, src + i * w->src_stride[from], dst + i * w->dst_stride[from], sd,
               dd);
}

/* Repeats one element's bytes over a box of the tensor. */
static void
fill_inner(const Walk *w, guint from, guint8 *dst, const guint8 *value, gsize esize)
{
  if (from == w->ndim) {
    memcpy(dst, value, esize);
    return;
  }
  for (guint64 i = 0; i < w->extent[from]; i++)
    fill_inner(w, from + 1, dst + i * w->dst_stride[from], value, esize);
}

void
copy_fill(guint8 *base, const Fill *fill, gsize esize, guint ndim, const guint64 *shape)
{
  Walk w = {.ndim = fill->box.ndim};
  guint64 stride = esize, origin = 0;

  for (guint d = ndim; d > 0; d--) {
    w.dst_stride[d - 1] = (gint64)stride;
    origin += fill->box.offset[d - 1] * stride;
    stride *= shape[d - 1];
  }
  memcpy(w.extent, fill->box.extent, sizeof w.extent);
  fill_inner(&w, 0, base + origin, fill->value, esize);
}

/* ------------------------------------------------------------------ windows */

/* Row-major element strides of a tensor of @ndim axes and @shape. */
static void
row_major_strides(guint ndim, const guint64 *shape, guint64 *rm)
{
  guint64 s = 1;

  for (guint d = ndim; d > 0; d--) {
    rm[d - 1] = s;
    s *= shape[d - 1];
  }
}

/* Which axis of the output tensor each axis of @op walks (-1 for an axis of extent 1),
 * matched by stride as wsync_tensor_box_of() matches them, and the box @op covers.
 * The planner proved every op's walk a box of its tensor (resolve.c), so this cannot
 * fail for an op of a plan. */
static gboolean
op_dst_axes(const Op *op, guint ndim, const guint64 *shape, int *axis_of, WsyncBox *box)
{
  guint64 rm[WSYNC_MAX_DIMS];
  gboolean used[WSYNC_MAX_DIMS] = {FALSE};

  if (!wsync_tensor_box_of(ndim, shape, op->ndim, op->extent, op->dst_origin, op->dst_stride,
                           box))
    return FALSE;
  row_major_strides(ndim, shape, rm);
  for (guint k = 0; k < op->ndim; k++) {
    axis_of[k] = -1;
    if (op->extent[k] == 1)
      continue;
    for (guint d = 0; d < ndim && axis_of[k] < 0; d++)
      if (!used[d] && rm[d] == op->dst_stride[k] && shape[d] > 1) {
        used[d] = TRUE;
        axis_of[k] = (int)d;
      }
  }
  return TRUE;
}

gboolean
copy_op_window(const Op *op, guint ndim, const guint64 *shape, const WsyncBox *window,
               guint64 window_first, Op *part)
{
  int axis_of[WSYNC_MAX_DIMS];
  WsyncBox box, inter;

  if (op->kind != OP_COPY)
    return FALSE;
  /* first the elements each spans, which rejects most ops of a tensor at once */
  guint64 rm[WSYNC_MAX_DIMS], op_last = op->dst_origin, window_last = window_first;
  row_major_strides(ndim, shape, rm);
  for (guint k = 0; k < op->ndim; k++) {
    if (op->extent[k] == 0)
      return FALSE;
    op_last += (op->extent[k] - 1) * op->dst_stride[k];
  }
  for (guint d = 0; d < ndim; d++) {
    if (window->extent[d] == 0)
      return FALSE;
    window_last += (window->extent[d] - 1) * rm[d];
  }
  if (op_last < window_first || op->dst_origin > window_last)
    return FALSE;
  if (!op_dst_axes(op, ndim, shape, axis_of, &box) || !wsync_box_intersect(&box, window, &inter))
    return FALSE;
  *part = *op;
  for (guint k = 0; k < op->ndim; k++) {
    if (axis_of[k] < 0)
      continue;
    guint64 skip = inter.offset[axis_of[k]] - box.offset[axis_of[k]];
    part->extent[k] = inter.extent[axis_of[k]];
    part->src_origin += skip * op->src_stride[k];
    part->dst_origin += skip * op->dst_stride[k];
  }
  part->dst_origin -= window_first;
  return TRUE;
}

guint64
copy_op_bytes(const Op *op, WsyncDtype dst_dtype)
{
  guint64 bytes = wsync_dtype_size(dst_dtype);

  for (guint k = 0; k < op->ndim; k++)
    bytes *= op->extent[k];
  return bytes;
}

gboolean
copy_op_is_run(const Op *op, WsyncDtype dst_dtype, guint64 *src_offset, guint64 *dst_offset,
               guint64 *nbytes)
{
  if (!copy_op_run(op, 0, op->ndim > 0 ? op->extent[0] : 0, dst_dtype, src_offset, dst_offset,
                   nbytes))
    return FALSE;
  for (guint k = 0; k < op->ndim; k++)
    if (op->extent[k] == 0)
      *nbytes = 0;
  return TRUE;
}

void
copy_fill_window(guint8 *base, guint64 window_first, const Fill *fill, const WsyncBox *window,
                 gsize esize, guint ndim, const guint64 *shape)
{
  guint64 rm[WSYNC_MAX_DIMS], first = 0;
  WsyncBox inter;
  Walk w = {.ndim = ndim};

  if (!wsync_box_intersect(&fill->box, window, &inter))
    return;
  row_major_strides(ndim, shape, rm);
  for (guint d = 0; d < ndim; d++) {
    w.extent[d] = inter.extent[d];
    w.dst_stride[d] = (gint64)(rm[d] * esize);
    first += inter.offset[d] * rm[d];
  }
  fill_inner(&w, 0, base + (first - window_first) * esize, fill->value, esize);
}

static void
run_generated(const WsyncPlan *plan, const Op *op, guint64 outer_from, guint64 outer_to,
              guint8 *dst_base, WsyncDtype dst_dtype)
{
  gsize esize = wsync_dtype_size(dst_dtype);
  guint64 idx[WSYNC_MAX_DIMS] = {0};
  guint64 total = 1;

  for (guint k = 1; k < op->ndim; k++)
    total *= op->extent[k];
  for (guint64 outer = outer_from; outer < outer_to; outer++) {
    for (guint64 flat = 0; flat < total; flat++) {
      guint64 rem = flat, src = op->src_origin, dst = op->dst_origin;
      for (guint k = op->ndim; k > 1; k--) {
        idx[k - 1] = rem % op->extent[k - 1];
        rem /= op->extent[k - 1];
      }
      if (op->ndim > 0)
        idx[0] = outer;
      for (guint k = 0; k < op->ndim; k++) {
        src += idx[k] * op->src_stride[k];
        dst += idx[k] * op->dst_stride[k];
      }
      generate_element(plan, op->lt->ordinal, src, dst_dtype, dst_base + dst * esize);
    }
    if (op->ndim == 0)
      break;
  }
}

void
copy_op(const WsyncPlan *plan, const Op *op, guint64 outer_from, guint64 outer_to,
        const guint8 *src_base, guint8 *dst_base, WsyncDtype dst_dtype)
{
  gsize dsize = wsync_dtype_size(dst_dtype), ssize = wsync_dtype_size(op->src_dtype);
  Walk w = {.ndim = op->ndim};

  if (op->source->kind == SOURCE_GENERATED) {
    run_generated(plan, op, outer_from, outer_to, dst_base, dst_dtype);
    return;
  }
  for (guint k = 0; k < op->ndim; k++) {
    w.extent[k] = op->extent[k];
    w.src_stride[k] = (gint64)(op->src_stride[k] * ssize);
    w.dst_stride[k] = (gint64)(op->dst_stride[k] * dsize);
  }
  const guint8 *src = src_base + op->src_origin * ssize;
  guint8 *dst = dst_base + op->dst_origin * dsize;
  if (op->ndim > 0) {
    src += outer_from * w.src_stride[0];
    dst += outer_from * w.dst_stride[0];
    w.extent[0] = outer_to - outer_from;
  }
  if (op->src_dtype != dst_dtype) {
    cast_inner(&w, 0, src, dst, op->src_dtype, dst_dtype);
    return;
  }
  walk_normalise(&w);
  copy_inner(&w, 0, src, dst, dsize);
}

gboolean
copy_op_run(const Op *op, guint64 outer_from, guint64 outer_to, WsyncDtype dst_dtype,
            guint64 *src_offset, guint64 *dst_offset, guint64 *nbytes)
{
  gsize size = wsync_dtype_size(dst_dtype);
  Walk w = {.ndim = op->ndim};

  if (op->kind != OP_COPY || op->source->kind != SOURCE_INPUT || op->src_dtype != dst_dtype ||
      size == 0)
    return FALSE;
  for (guint k = 0; k < op->ndim; k++) {
    w.extent[k] = op->extent[k];
    w.src_stride[k] = (gint64)(op->src_stride[k] * size);
    w.dst_stride[k] = (gint64)(op->dst_stride[k] * size);
  }
  *src_offset = op->src_origin * size;
  *dst_offset = op->dst_origin * size;
  if (op->ndim > 0) {
    *src_offset += outer_from * (guint64)w.src_stride[0];
    *dst_offset += outer_from * (guint64)w.dst_stride[0];
    w.extent[0] = outer_to - outer_from;
  }
  walk_normalise(&w);
  if (w.ndim > 1 || (w.ndim == 1 && (w.src_stride[0] != (gint64)size ||
                                     w.dst_stride[0] != (gint64)size)))
    return FALSE;
  *nbytes = size * (w.ndim == 1 ? w.extent[0] : 1);
  return TRUE;
}

/* ------------------------------------------------------------------ destination runs */

void
copy_op_runs(const Op *op, guint64 outer_from, guint64 outer_to, WsyncDtype dst_dtype,
             CopyRunFunc run, gpointer data)
{
  const guint64 esize = wsync_dtype_size(dst_dtype);
  guint64 extent[WSYNC_MAX_DIMS], stride[WSYNC_MAX_DIMS], idx[WSYNC_MAX_DIMS] = {0};
  guint64 origin = op->dst_origin * esize, len = esize;
  guint n = 0;

  if (op->ndim > 0) {
    if (outer_to <= outer_from)
      return;
    origin += outer_from * op->dst_stride[0] * esize;
  }
  /* the axes that move, by decreasing destination stride (insertion sort: a few axes),
   * so that the runs come out in increasing offset order */
  for (guint k = 0; k < op->ndim; k++) {
    guint64 e = k == 0 ? outer_to - outer_from : op->extent[k], st = op->dst_stride[k] * esize;
    guint at = n;
    if (e == 0)
      return;
    if (e == 1)
      continue;
    while (at > 0 && stride[at - 1] < st) {
      extent[at] = extent[at - 1];
      stride[at] = stride[at - 1];
      at--;
    }
    extent[at] = e;
    stride[at] = st;
    n++;
  }
  /* the innermost axes that are contiguous become the run */
  while (n > 0 && stride[n - 1] == len) {
    len *= extent[n - 1];
    n--;
  }
  for (;;) {
    guint64 offset = origin;
    for (guint k = 0; k < n; k++)
      offset += idx[k] * stride[k];
    run(data, offset, len);
    guint k = n;
    while (k > 0 && ++idx[k - 1] == extent[k - 1])
      idx[--k] = 0;
    if (k == 0)
      return;
  }
}
