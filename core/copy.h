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
