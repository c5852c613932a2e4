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

/* When the rows [@outer_from, @outer_to) of the copy @op read one contiguous run of its
 * input tensor and write it unchanged (same dtype @dst_dtype, no transpose) as one
 * contiguous run of the output tensor: TRUE, with the run's byte offsets from the input
 * tensor's and the output tensor's first byte, and its length.  (What copy_op() would
 * then do is one memcpy.) */
gboolean copy_op_run(const Op *op, guint64 outer_from, guint64 outer_to, WsyncDtype dst_dtype,
                     guint64 *src_offset, guint64 *dst_offset, guint64 *nbytes);

#endif /* WSYNC_COPY_H */
