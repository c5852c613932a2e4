/* wsync: the byte kernels of a plan's operations (core/copy.c). */
#ifndef WSYNC_COPY_H
#define WSYNC_COPY_H

#include "plan-private.h"

/* Runs the rows [@outer_from, @outer_to) of the first axis of @op (all of it when the op
 * has no axes): an OP_COPY reads the input tensor whose first byte is @src_base (unused
 * for generated values) and writes the output tensor of dtype @dst_dtype whose first
 * byte is @dst_base, transposing and casting as the op's strides and dtypes say.
 * Threads may run disjoint ops or row ranges at once. */
void copy_op(const WsyncPlan *plan, const Op *op, guint64 outer_from, guint64 outer_to,
             const guint8 *src_base, guint8 *dst_base, WsyncDtype dst_dtype);

/* Writes @fill's value over its box of the output tensor of @ndim axes, @shape and
 * element size @esize whose first byte is @base. */
void copy_fill(guint8 *base, const Fill *fill, gsize esize, guint ndim, const guint64 *shape);

/* Windows: the executor writes an output tensor in contiguous pieces, each a box of the
 * tensor that begins at element @window_first (a run of whole rows along some axis, so
 * that its elements are one run of bytes); these cut an op or a fill to one window. */

/* The part of @op that writes inside @window, a box of its output tensor of @ndim axes
 * and @shape: @part becomes @op over that part only, with its dst_origin counted from
 * element @window_first of the tensor.  FALSE when @op writes nothing inside @window. */
gboolean copy_op_window(const Op *op, guint ndim, const guint64 *shape, const WsyncBox *window,
                        guint64 window_first, Op *part);

/* TRUE when the OP_COPY @op reads one run of bytes and writes them unchanged as one run
 * (no cast, no transpose, no gather), like a slice of whole rows: then @src_offset is
 * the run's first byte in the input tensor, @dst_offset in the output counted as
 * @op->dst_origin is, and @nbytes its length. */
gboolean copy_op_is_run(const Op *op, WsyncDtype dst_dtype, guint64 *src_offset,
                        guint64 *dst_offset, guint64 *nbytes);

/* Writes the part of @fill that lies inside @window into @base, the window's first byte
 * (@window_first: its first element), for an output tensor of @ndim axes, @shape and
 * element size @esize. */
void copy_fill_window(guint8 *base, guint64 window_first, const Fill *fill,
                      const WsyncBox *window, gsize esize, guint ndim, const guint64 *shape);

/* When the rows [@outer_from, @outer_to) of the copy @op read one contiguous run of its
 * input tensor and write it unchanged (same dtype @dst_dtype, no transpose) as one
 * contiguous run of the output tensor: TRUE, with the run's byte offsets from the input
 * tensor's and the output tensor's first byte, and its length.  (What copy_op() would
 * then do is one memcpy.) */
gboolean copy_op_run(const Op *op, guint64 outer_from, guint64 outer_to, WsyncDtype dst_dtype,
                     guint64 *src_offset, guint64 *dst_offset, guint64 *nbytes);

/* The bytes @op writes: its extents' product times the element size of @dst_dtype. */
guint64 copy_op_bytes(const Op *op, WsyncDtype dst_dtype);

/* Receives one contiguous run of @length bytes at @offset (see copy_op_runs()). */
typedef void (*CopyRunFunc)(gpointer data, guint64 offset, guint64 length);

/* Calls @run(@data, offset, length) for every contiguous run of bytes that
 * copy_op(@op, @outer_from, @outer_to, ..., @dst_dtype) writes, the offsets counted
 * from the output tensor's first byte, in increasing order (runs as long as the
 * destination allows: a slice of whole rows is one run; a column slice, one run per
 * row).  It says where the bytes go without moving any, for callers that track which
 * parts of the output are written. */
void copy_op_runs(const Op *op, guint64 outer_from, guint64 outer_to, WsyncDtype dst_dtype,
                  CopyRunFunc run, gpointer data);

#endif /* WSYNC_COPY_H */
