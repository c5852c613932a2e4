/* wsync: element types of tensors, with the spellings of the safetensors format. */
#ifndef WSYNC_DTYPE_H
#define WSYNC_DTYPE_H

#include <glib.h>
#include <wsync/api.h>

G_BEGIN_DECLS

/**
 * WsyncDtype:
 *
 * The element types of the safetensors format, in the format's own order (increasing
 * alignment), which is also the order its reference writer sorts by.  The names are
 * the exact safetensors spellings without the prefix (`BF16`, `F8_E4M3`, ...).
 */
typedef enum {
  WSYNC_DTYPE_BOOL,
  WSYNC_DTYPE_F4,
  WSYNC_DTYPE_F6_E2M3,
  WSYNC_DTYPE_F6_E3M2,
  WSYNC_DTYPE_U8,
  WSYNC_DTYPE_I8,
  WSYNC_DTYPE_F8_E5M2,
  WSYNC_DTYPE_F8_E4M3,
  WSYNC_DTYPE_F8_E8M0,
  WSYNC_DTYPE_F8_E4M3FNUZ,
  WSYNC_DTYPE_F8_E5M2FNUZ,
  WSYNC_DTYPE_I16,
  WSYNC_DTYPE_U16,
  WSYNC_DTYPE_F16,
  WSYNC_DTYPE_BF16,
  WSYNC_DTYPE_I32,
  WSYNC_DTYPE_U32,
  WSYNC_DTYPE_F32,
  WSYNC_DTYPE_C64,
  WSYNC_DTYPE_F64,
  WSYNC_DTYPE_I64,
  WSYNC_DTYPE_U64,
  WSYNC_DTYPE_COUNT /*< skip >*/
} WsyncDtype;

/**
 * wsync_dtype_name:
 * @dtype: a valid dtype
 *
 * Returns: the safetensors spelling, e.g. "BF16".
 */
WSYNC_API const char *wsync_dtype_name(WsyncDtype dtype);

/**
 * wsync_dtype_from_name:
 * @name: a safetensors dtype spelling (case-sensitive)
 * @dtype: (out): the dtype
 *
 * Returns: %TRUE when @name is one of the format's dtypes.
 */
WSYNC_API gboolean wsync_dtype_from_name(const char *name, WsyncDtype *dtype);

/**
 * wsync_dtype_bits:
 * @dtype: a valid dtype
 *
 * Returns: the size of one element in bits: 4 for F4, 6 for the F6 types, 64 for C64.
 */
WSYNC_API guint wsync_dtype_bits(WsyncDtype dtype);

/**
 * wsync_dtype_size:
 * @dtype: a valid dtype
 *
 * Returns: the size of one element in bytes, or 0 for the sub-byte types (F4, F6).
 */
WSYNC_API gsize wsync_dtype_size(WsyncDtype dtype);

/**
 * wsync_dtype_nbytes:
 * @dtype: a valid dtype
 * @numel: number of elements
 * @nbytes: (out): the number of bytes they take
 *
 * Computes numel * bits / 8 with overflow and sub-byte checks.
 *
 * Returns: %FALSE on overflow or when the elements do not fill whole bytes (the
 *   safetensors "misaligned slice" rule for sub-byte types).
 */
WSYNC_API gboolean wsync_dtype_nbytes(WsyncDtype dtype, guint64 numel, guint64 *nbytes);

G_END_DECLS

#endif /* WSYNC_DTYPE_H */
