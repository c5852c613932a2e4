/* wsync: the safetensors element types. */
#include <string.h>

#include <wsync/dtype.h>

typedef struct {
  const char *name;
  guint bits;
} DtypeInfo;

/* Indexed by WsyncDtype; the designated initialisers keep the table in step with the
 * enum even if someone reorders one of them. */
static const DtypeInfo dtype_info[WSYNC_DTYPE_COUNT] = {
    [WSYNC_DTYPE_BOOL] = {"BOOL", 8},
    [WSYNC_DTYPE_F4] = {"F4", 4},
    [WSYNC_DTYPE_F6_E2M3] = {"F6_E2M3", 6},
    [WSYNC_DTYPE_F6_E3M2] = {"F6_E3M2", 6},
    [WSYNC_DTYPE_U8] = {"U8", 8},
    [WSYNC_DTYPE_I8] = {"I8", 8},
    [WSYNC_DTYPE_F8_E5M2] = {"F8_E5M2", 8},
    [WSYNC_DTYPE_F8_E4M3] = {"F8_E4M3", 8},
    [WSYNC_DTYPE_F8_E8M0] = {"F8_E8M0", 8},
    [WSYNC_DTYPE_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8},
    [WSYNC_DTYPE_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8},
    [WSYNC_DTYPE_I16] = {"I16", 16},
    [WSYNC_DTYPE_U16] = {"U16", 16},
    [WSYNC_DTYPE_F16] = {"F16", 16},
    [WSYNC_DTYPE_BF16] = {"BF16", 16},
    [WSYNC_DTYPE_I32] = {"I32", 32},
    [WSYNC_DTYPE_U32] = {"U32", 32},
    [WSYNC_DTYPE_F32] = {"F32", 32},
    [WSYNC_DTYPE_C64] = {"C64", 64},
    [WSYNC_DTYPE_F64] = {"F64", 64},
    [WSYNC_DTYPE_I64] = {"I64", 64},
    [WSYNC_DTYPE_U64] = {"U64", 64},
};

const char *
wsync_dtype_name(WsyncDtype dtype)
{
  g_return_val_if_fail((guint)dtype < WSYNC_DTYPE_COUNT, "?");
  return dtype_info[dtype].name;
}

gboolean
wsync_dtype_from_name(const char *name, WsyncDtype *dtype)
{
  g_return_val_if_fail(name != NULL, FALSE);
  for (guint i = 0; i < WSYNC_DTYPE_COUNT; i++) {
    if (strcmp(dtype_info[i].name, name) == 0) {
      if (dtype)
        *dtype = (WsyncDtype)i;
      return TRUE;
    }
  }
  return FALSE;
}

guint
wsync_dtype_bits(WsyncDtype dtype)
{
  g_return_val_if_fail((guint)dtype < WSYNC_DTYPE_COUNT, 0);
  return dtype_info[dtype].bits;
}

gboolean
wsync_dtype_nbytes(WsyncDtype dtype, guint64 numel, guint64 *nbytes)
{
  g_return_val_if_fail((guint)dtype < WSYNC_DTYPE_COUNT, FALSE);
  /* Like the reference, multiply in bits first: that is where it can overflow, and it
   * is the only way to see whether sub-byte elements fill whole bytes. */
  guint64 bits;
  if (!g_uint64_checked_mul(&bits, numel, dtype_info[dtype].bits))
    return FALSE;
  if (bits % 8 != 0)
    return FALSE;
  if (nbytes)
    *nbytes = bits / 8;
  return TRUE;
}

gsize
wsync_dtype_size(WsyncDtype dtype)
{
  guint bits = wsync_dtype_bits(dtype);

  return bits % 8 == 0 ? bits / 8 : 0;
}
