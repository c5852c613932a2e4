/* wsync: fast 2-D transposes, the kernel of every copy whose axes are permuted
 * (vLLM-Ascend's processed experts, and reading them back).
 *
 * wsync_transpose() copies a rows x cols block of @src (row-major, elements contiguous
 * along a row, rows @src_row_stride bytes apart) into the cols x rows block of @dst
 * (rows @dst_row_stride bytes apart): dst[j][i] = src[i][j].  It reads straight from
 * the input map and writes straight into the output map, in cache-sized tiles.
 *
 * Paths, chosen once at run time: AVX-512 (16x32 tiles of 2-byte elements, 32x32 where
 * destination rows are a multiple of 4 KiB apart, 16x16 of 4-byte: whole cache lines)
 * when the CPU has AVX512F and AVX512BW, else AVX2 (16x16
 * and 8x8), else SSE2 (8x8 and 4x4), else the portable blocked loop.  Only 2- and
 * 4-byte elements have vector kernels; other sizes always take the portable loop.
 * Every path moves the same bytes to the same places, so the output is identical
 * whichever runs.  WSYNC_TRANSPOSE=portable|sse2|avx2|avx512 in the environment forces
 * a path (a path the CPU lacks falls back to the best one it has below it).
 */
#ifndef WSYNC_TRANSPOSE_H
#define WSYNC_TRANSPOSE_H

#include <glib.h>

G_BEGIN_DECLS

typedef enum {
  WSYNC_TRANSPOSE_PORTABLE,
  WSYNC_TRANSPOSE_SSE2,
  WSYNC_TRANSPOSE_AVX2,
  WSYNC_TRANSPOSE_AVX512,
  WSYNC_TRANSPOSE_N_PATHS /*< skip >*/
} WsyncTransposePath;

/**
 * wsync_transpose:
 * @src: the first element of the source block
 * @src_row_stride: bytes from one source row to the next
 * @dst: the first element of the destination block
 * @dst_row_stride: bytes from one destination row (a source column) to the next
 * @rows: source rows (destination columns)
 * @cols: source columns (destination rows)
 * @esize: bytes per element (any size; 2 and 4 are vectorised)
 *
 * Transposes with the active path.  The blocks must not overlap.
 */
void wsync_transpose(const guint8 *src, gsize src_row_stride, guint8 *dst,
                     gsize dst_row_stride, guint64 rows, guint64 cols, gsize esize);

/**
 * wsync_transpose_with:
 * @path: a path; one the CPU does not support runs the portable loop instead
 *
 * wsync_transpose() with a given path (tests and benchmarks compare paths with it).
 */
void wsync_transpose_with(WsyncTransposePath path, const guint8 *src, gsize src_row_stride,
                          guint8 *dst, gsize dst_row_stride, guint64 rows, guint64 cols,
                          gsize esize);

/** wsync_transpose_path_supported: Returns: %TRUE when this CPU (and build) can run @path. */
gboolean wsync_transpose_path_supported(WsyncTransposePath path);

/** wsync_transpose_path_name: Returns: "portable", "sse2", "avx2" or "avx512". */
const char *wsync_transpose_path_name(WsyncTransposePath path);

/**
 * wsync_transpose_active_path:
 *
 * The path wsync_transpose() takes: the best the CPU supports, unless
 * WSYNC_TRANSPOSE (read once, at the first call) asks for another.
 *
 * Returns: the active path.
 */
WsyncTransposePath wsync_transpose_active_path(void);

G_END_DECLS

#endif /* WSYNC_TRANSPOSE_H */
