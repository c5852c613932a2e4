/* Fuzzing the safetensors reader (wsync_safetensors_parse): header length, JSON checks,
 * dtypes, shapes, offsets, metadata.  An accepted file must hand out only tensors whose
 * bytes lie inside the input (each is read whole, so ASan and valgrind see a stray
 * range); a refusal must be one clean line of bad input.  See fuzz-driver.h. */
#include <wsync/safetensors.h>

#define FUZZ_NAME "safetensors"
#include "fuzz-driver.h"

static void
fuzz_setup(void)
{
}

static void
fuzz_teardown(void)
{
}

/* A file: the 8-byte little-endian header length, the header, @data_len data bytes (each
 * byte its own offset, so the reader's view of them can be checked). */
static GBytes *
file_bytes(const char *header, gsize data_len)
{
  gsize n = strlen(header);
  GByteArray *b = g_byte_array_new();

  for (int i = 0; i < 8; i++) {
    guint8 c = (guint8)(n >> (8 * i));
    g_byte_array_append(b, &c, 1);
  }
  g_byte_array_append(b, (const guint8 *)header, (guint)n);
  for (gsize i = 0; i < data_len; i++) {
    guint8 c = (guint8)i;
    g_byte_array_append(b, &c, 1);
  }
  return g_byte_array_free_to_bytes(b);
}

static void
fuzz_seeds(GPtrArray *seeds)
{
  g_ptr_array_add(seeds, file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24));
  g_ptr_array_add(seeds,
                  file_bytes("{\"__metadata__\":{\"format\":\"pt\",\"wsync.target\":\"vllm\"},"
                             "\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[4,2],"
                             "\"data_offsets\":[0,16]},\"b\":{\"dtype\":\"I64\",\"shape\":[],"
                             "\"data_offsets\":[16,24]}}      ",
                             24));
  g_ptr_array_add(seeds, file_bytes("{\"e\":{\"dtype\":\"F8_E4M3\",\"shape\":[0,4],\"data_offsets\":"
                                    "[0,0]},\"f\":{\"dtype\":\"BOOL\",\"shape\":[3],\"data_offsets\":"
                                    "[0,3]},\"g\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1],"
                                    "\"data_offsets\":[3,4]}}",
                                    4));
  g_ptr_array_add(seeds, file_bytes("{}", 0));
}

static const char *const *
fuzz_dictionary(void)
{
  static const char *const tokens[] = {
    "\"dtype\"", "\"shape\"", "\"data_offsets\"", "\"__metadata__\"", "\"F32\"", "\"BF16\"",
    "\"F16\"", "\"F64\"", "\"I8\"", "\"I64\"", "\"U64\"", "\"BOOL\"", "\"F8_E5M2\"",
    "\"F8_E8M0\"", "\"F4\"", "\"F6_E2M3\"", "[", "]", "{", "}", ",", ":", "\"", "\\u0000",
    "\\ud800", "\\n", "0", "-1", "1e309", "4294967296", "18446744073709551616",
    "9007199254740993", "null", "true", "[0,0]", "[]", "        ", NULL};
  return tokens;
}

static gboolean
fuzz_one(const guint8 *data, gsize len)
{
  static const WsyncError allowed[] = {WSYNC_ERROR_BAD_INPUT};
  GError *error = NULL;
  WsyncSafetensors *st = wsync_safetensors_parse(data, len, "fuzz.safetensors", &error);

  if (st == NULL) {
    fuzz_check_refusal(error, allowed, G_N_ELEMENTS(allowed));
    g_error_free(error);
    return FALSE;
  }
  guint64 sum = 0;
  for (guint i = 0; i < wsync_safetensors_n_tensors(st); i++) {
    const WsyncTensor *t = wsync_safetensors_tensor(st, i);
    if (t->nbytes > 0 && (t->data < data || t->data + t->nbytes > data + len))
      g_error("tensor %s lies outside the input", t->name);
    for (guint64 k = 0; k < t->nbytes; k++)
      sum += t->data[k];
    if (wsync_safetensors_lookup(st, t->name) != t)
      g_error("tensor %s is not found by its name", t->name);
  }
  (void)sum;
  wsync_safetensors_free(st);
  return TRUE;
}

