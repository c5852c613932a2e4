/* Tests of the safetensors reader and writer (core/safetensors.c, core/dtype.c). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib.h>
#include <glib/gstdio.h>

#include <wsync/error.h>
#include <wsync/safetensors.h>

/* ================================================================ helpers */

/* A file image: the 8-byte length @n, @header, then @data_len bytes whose value is
 * their position (mod 251, so runs do not repeat on power-of-two boundaries). */
static GBytes *
image_n(guint64 n, const char *header, gsize data_len)
{
  GByteArray *b = g_byte_array_new();
  for (int i = 0; i < 8; i++) {
    guint8 c = (guint8)(n >> (8 * i));
    g_byte_array_append(b, &c, 1);
  }
  g_byte_array_append(b, (const guint8 *)header, (guint)strlen(header));
  for (gsize i = 0; i < data_len; i++) {
    guint8 c = (guint8)(i % 251);
    g_byte_array_append(b, &c, 1);
  }
  return g_byte_array_free_to_bytes(b);
}

static GBytes *
image(const char *header, gsize data_len)
{
  return image_n(strlen(header), header, data_len);
}

/* Checks the code, that the message is one line and that it holds @fragment. */
static void
check_error(const GError *err, WsyncError code, const char *fragment)
{
  g_assert_nonnull(err);
  if (strstr(err->message, fragment) == NULL)
    g_printerr("message \"%s\" lacks \"%s\"\n", err->message, fragment);
  g_assert_nonnull(strstr(err->message, fragment));
  /* one line, no control character: every refusal can be printed as it is */
  for (const guchar *c = (const guchar *)err->message; *c; c++)
    g_assert_true(*c >= 0x20 && *c != 0x7f);
  g_assert_cmpuint(err->domain, ==, WSYNC_ERROR);
  g_assert_cmpint(err->code, ==, code);
}

static WsyncSafetensors *
parse_bytes(GBytes *bytes, GError **error)
{
  gsize len;
  const guint8 *data = g_bytes_get_data(bytes, &len);
  return wsync_safetensors_parse(data, len, "x.safetensors", error);
}

/* Parses an image that must be refused with BAD_INPUT and @fragment. */
static void
expect_reject_image(GBytes *bytes, const char *fragment)
{
  g_autoptr(GError) err = NULL;
  g_autoptr(WsyncSafetensors) st = parse_bytes(bytes, &err);
  g_assert_null(st);
  check_error(err, WSYNC_ERROR_BAD_INPUT, fragment);
  g_bytes_unref(bytes);
}

static void
expect_reject(const char *header, gsize data_len, const char *fragment)
{
  expect_reject_image(image(header, data_len), fragment);
}

/* Parses an image that must be accepted; @bytes must outlive the result. */
static WsyncSafetensors *
expect_accept(GBytes *bytes)
{
  g_autoptr(GError) err = NULL;
  WsyncSafetensors *st = parse_bytes(bytes, &err);
  g_assert_no_error(err);
  g_assert_nonnull(st);
  return st;
}

static char *
read_whole(const char *path, gsize *len)
{
  char *text = NULL;
  g_autoptr(GError) err = NULL;
  g_assert_true(g_file_get_contents(path, &text, len, &err));
  g_assert_no_error(err);
  return text;
}

typedef struct {
  char *dir;
} Tmp;

static void
tmp_setup(Tmp *t, gconstpointer data)
{
  (void)data;
  g_autoptr(GError) err = NULL;
  t->dir = g_dir_make_tmp("wsync-st-XXXXXX", &err);
  g_assert_no_error(err);
}

/* The fixtures are flat: files in one directory. */
static void
tmp_teardown(Tmp *t, gconstpointer data)
{
  (void)data;
  GDir *d = g_dir_open(t->dir, 0, NULL);
  const char *name;
  while ((name = g_dir_read_name(d)) != NULL) {
    g_autofree char *path = g_build_filename(t->dir, name, NULL);
    if (g_remove(path) != 0)
      g_rmdir(path);
  }
  g_dir_close(d);
  g_assert_cmpint(g_rmdir(t->dir), ==, 0);
  g_free(t->dir);
}

/* ================================================================ dtype */

static void
test_dtype(void)
{
  WsyncDtype d;
  g_assert_true(wsync_dtype_from_name("BF16", &d));
  g_assert_cmpint(d, ==, WSYNC_DTYPE_BF16);
  g_assert_false(wsync_dtype_from_name("bf16", &d));
  g_assert_false(wsync_dtype_from_name("", &d));
  for (guint i = 0; i < WSYNC_DTYPE_COUNT; i++) {
    g_assert_true(wsync_dtype_from_name(wsync_dtype_name(i), &d));
    g_assert_cmpint(d, ==, i);
  }
  g_assert_cmpstr(wsync_dtype_name(WSYNC_DTYPE_F8_E4M3FNUZ), ==, "F8_E4M3FNUZ");
  g_assert_cmpuint(wsync_dtype_bits(WSYNC_DTYPE_F4), ==, 4);
  g_assert_cmpuint(wsync_dtype_bits(WSYNC_DTYPE_F6_E3M2), ==, 6);
  g_assert_cmpuint(wsync_dtype_bits(WSYNC_DTYPE_C64), ==, 64);
  g_assert_cmpuint(wsync_dtype_bits(WSYNC_DTYPE_BOOL), ==, 8);

  guint64 n;
  g_assert_true(wsync_dtype_nbytes(WSYNC_DTYPE_BF16, 6, &n));
  g_assert_cmpuint(n, ==, 12);
  g_assert_true(wsync_dtype_nbytes(WSYNC_DTYPE_F4, 4, &n));
  g_assert_cmpuint(n, ==, 2);
  g_assert_false(wsync_dtype_nbytes(WSYNC_DTYPE_F4, 3, &n));
  g_assert_true(wsync_dtype_nbytes(WSYNC_DTYPE_F6_E2M3, 4, &n));
  g_assert_cmpuint(n, ==, 3);
  g_assert_false(wsync_dtype_nbytes(WSYNC_DTYPE_F6_E2M3, 2, &n));
  g_assert_false(wsync_dtype_nbytes(WSYNC_DTYPE_U64, G_MAXUINT64 / 32, &n));
  g_assert_true(wsync_dtype_nbytes(WSYNC_DTYPE_U64, 0, &n));
  g_assert_cmpuint(n, ==, 0);
}

/* ================================================================ reader: rejects */

static void
test_reject_length(void)
{
  /* 0 and 7 bytes */
  expect_reject_image(g_bytes_new("", 0),
                      "x.safetensors: file is 0 bytes, too short for the 8-byte header length");
  expect_reject_image(g_bytes_new("\x02\0\0\0\0\0\0", 7), "file is 7 bytes, too short");
  expect_reject_image(image_n(100000001, "{}", 0),
                      "x.safetensors: header length 100000001 is larger than the limit of "
                      "100000000 bytes");
  expect_reject_image(image_n(G_MAXUINT64, "{}", 0),
                      "header length 18446744073709551615 is larger");
  /* 8 + 92 = 100 bytes in the file, the header claims 1000 */
  expect_reject_image(image_n(1000, "{}", 90),
                      "x.safetensors: header length 1000 goes beyond the end of the file "
                      "(100 bytes)");
}

static void
test_reject_not_utf8(void)
{
  expect_reject("{\"a\xff\":1}", 0,
                "x.safetensors: header is not valid UTF-8 (bad byte 0xff at byte 3 of the header)");
  /* An overlong encoding of '/' */
  expect_reject("{\"\xc0\xaf\":1}", 0, "header is not valid UTF-8 (bad byte 0xc0 at byte 2");
  /* NUL is valid UTF-8 but not JSON outside a string escape */
  expect_reject_image(image_n(3, "{}", 1),
                      "x.safetensors: header is not valid JSON: a NUL byte at byte 2");
}

/* A \u0000 escape in any string of the header: json-glib cut the string at the NUL
 * (a tensor "a\u0000b" was listed as "a"), where the safetensors crate (serde_json) and
 * Python read all of it: refused, with the offset of the escape in the header. */
static void
test_reject_nul_escape(void)
{
  expect_reject("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                "x.safetensors: header has a NUL character (\\u0000) in a string at byte 3 of "
                "the header");
  expect_reject("{\"__metadata__\":{\"k\":\"v\\u0000\"},"
                "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
                1, "header has a NUL character (\\u0000) in a string at byte 23 of the header");
  expect_reject("{\"a\":{\"dtype\":\"U8\\u0000\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                "header has a NUL character (\\u0000) in a string at byte 17 of the header");
  /* an escaped backslash then "u0000" is six plain characters of the name */
  g_autoptr(GBytes) img =
      image("{\"a\\\\u0000\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
  g_autoptr(WsyncSafetensors) st = expect_accept(img);
  g_assert_cmpuint(wsync_safetensors_n_tensors(st), ==, 1);
  g_assert_cmpstr(wsync_safetensors_tensor(st, 0)->name, ==, "a\\u0000");
}

static void
test_reject_not_json(void)
{
  expect_reject("{\"a\":", 0, "x.safetensors: header is not valid JSON at 1:5: ");
  /* refused before json-glib, which leaks the first value when more text follows it */
  expect_reject("{\"a\":{}},", 0,
                "header is not valid JSON: unexpected ',' after the top-level value at byte 8");
  expect_reject("\"a\" {}", 0, "header is not valid JSON: a second value begins at byte 4");
  expect_reject("1 2", 0, "header is not valid JSON: a second value begins at byte 2");
  expect_reject("[1,2]", 0, "x.safetensors: header is an array, not a JSON object");
  expect_reject("\"x\"", 0, "header is the string \"x\", not a JSON object");
  expect_reject("", 0, "x.safetensors: header is empty, not a JSON object");
  expect_reject("        ", 0, "header is empty, not a JSON object");
  /* What json-glib would accept but JSON does not */
  expect_reject("{} /* c */", 0, "header is not valid JSON: unexpected '/' at byte 3");
  expect_reject("{'a':{}}", 0, "header is not valid JSON: unexpected ''' at byte 1");
  expect_reject("{}{\"a\":1}", 0, "header is not valid JSON: a second value begins at byte 2");

  /* Deep enough to crash json-glib's recursive parser if it ever got there */
  GString *deep = g_string_new("{\"a\":");
  for (int i = 0; i < 200000; i++)
    g_string_append_c(deep, '[');
  for (int i = 0; i < 200000; i++)
    g_string_append_c(deep, ']');
  g_string_append_c(deep, '}');
  expect_reject(deep->str, 0, "header nests JSON deeper than 64 levels (at byte 68)");
  g_string_free(deep, TRUE);
}

static void
test_reject_entry_types(void)
{
  expect_reject("{\"a\":1}", 0, "x.safetensors: tensor \"a\": entry is 1, not an object");
  expect_reject("{\"a\":{\"shape\":[],\"data_offsets\":[0,1]}}", 1,
                "tensor \"a\": missing \"dtype\"");
  expect_reject("{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1,
                "tensor \"a\": missing \"shape\"");
  expect_reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[]}}", 1,
                "tensor \"a\": missing \"data_offsets\"");
  expect_reject("{\"a\":{\"dtype\":5,\"shape\":[],\"data_offsets\":[0,1]}}", 1,
                "tensor \"a\": \"dtype\" is 5, not a string");
  expect_reject("{\"a\":{\"dtype\":\"U8\",\"shape\":\"1\",\"data_offsets\":[0,1]}}", 1,
                "tensor \"a\": \"shape\" is the string \"1\", not an array");
  expect_reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,-3],\"data_offsets\":[0,1]}}", 1,
                "tensor \"a\": \"shape\" element 1 is -3, not an integer from 0 to 2^63-1");
  expect_reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 1,
                "\"shape\" element 0 is 1.5, not an integer");
  expect_reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[null],\"data_offsets\":[0,1]}}", 1,
                "\"shape\" element 0 is null, not an integer");
  /* json-glib reads 2^64-1 as -1; it must not slip through as anything */
  expect_reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[18446744073709551615],"
                "\"data_offsets\":[0,1]}}",
                1, "\"shape\" element 0 is -1, not an integer from 0 to 2^63-1");
  expect_reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1,
                "tensor \"a\": \"data_offsets\" has 1 elements, not 2");
  expect_reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1,
                "tensor \"a\": \"data_offsets\" has 3 elements, not 2");
  expect_reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,1]}}", 1,
                "\"data_offsets\" element 0 is -1");
  expect_reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":{}}}", 1,
                "\"data_offsets\" is an object, not an array");
}

static void
test_reject_extra_key(void)
{
  expect_reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"strides\":[1]}}",
                1,
                "x.safetensors: tensor \"a\": unexpected key \"strides\" (an entry has only "
                "dtype, shape and data_offsets)");
}

static void
test_reject_dtype(void)
{
  expect_reject("{\"w\":{\"dtype\":\"bf16\",\"shape\":[1],\"data_offsets\":[0,2]}}", 2,
                "x.safetensors: tensor \"w\": unknown dtype \"bf16\"");
  expect_reject("{\"w\":{\"dtype\":\"F128\",\"shape\":[1],\"data_offsets\":[0,16]}}", 16,
                "unknown dtype \"F128\"");
}

static void
test_reject_dims(void)
{
  expect_reject("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"
                "\"data_offsets\":[0,1]}}",
                1, "x.safetensors: tensor \"w\": shape has 17 dimensions, more than 16");
  /* 16 is fine */
  g_autoptr(GBytes) img =
      image("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,2],"
            "\"data_offsets\":[0,2]}}",
            2);
  g_autoptr(WsyncSafetensors) st = expect_accept(img);
  g_assert_cmpuint(wsync_safetensors_tensor(st, 0)->ndim, ==, 16);
}

static void
test_reject_overflow(void)
{
  expect_reject("{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],"
                "\"data_offsets\":[0,0]}}",
                0,
                "tensor \"w\": the element count of shape [4294967296, 4294967296] overflows "
                "64 bits");
  expect_reject("{\"w\":{\"dtype\":\"F32\",\"shape\":[1152921504606846976],"
                "\"data_offsets\":[0,0]}}",
                0,
                "tensor \"w\": shape [1152921504606846976] of F32 has 1152921504606846976 "
                "elements, too many bits");
}

static void
test_reject_sub_byte(void)
{
  expect_reject("{\"w\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2,
                "x.safetensors: tensor \"w\": shape [3] of F4 is 12 bits, not a whole number "
                "of bytes");
  expect_reject("{\"w\":{\"dtype\":\"F6_E2M3\",\"shape\":[2,1],\"data_offsets\":[0,2]}}", 2,
                "shape [2, 1] of F6_E2M3 is 12 bits");
  /* 4 F6 values are 3 bytes */
  g_autoptr(GBytes) img =
      image("{\"w\":{\"dtype\":\"F6_E3M2\",\"shape\":[4],\"data_offsets\":[0,3]}}", 3);
  g_autoptr(WsyncSafetensors) st = expect_accept(img);
  g_assert_cmpuint(wsync_safetensors_tensor(st, 0)->nbytes, ==, 3);
}

static void
test_reject_offsets(void)
{
  expect_reject("{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4,
                "tensor \"w\": data_offsets [4, 0] end before they begin");
  expect_reject("{\"a.weight\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,10]}}", 10,
                "x.safetensors: tensor \"a.weight\": shape [2, 3] of BF16 needs 12 bytes but "
                "data_offsets [0, 10] give 10");
  expect_reject("{\"w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}", 4,
                "x.safetensors: tensor \"w\": data starts at byte 2 but the first tensor's data "
                "must start at 0");
  expect_reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]}}",
                5,
                "x.safetensors: tensor \"b\": data_offsets [3, 5] leave a gap of 1 bytes after "
                "tensor \"a\" [0, 2]");
  expect_reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}",
                4, "x.safetensors: tensor \"b\": data_offsets [2, 4] overlap tensor \"a\" [0, 4]");
  /* Two names for the same bytes (the reference's "JSON attack") */
  expect_reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
                4, "tensor \"b\": data_offsets [0, 4] overlap tensor \"a\" [0, 4]");
  /* An empty tensor inside another one's bytes */
  expect_reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,2]}}",
                4, "tensor \"z\": data_offsets [2, 2] overlap tensor \"a\" [0, 4]");
}

static void
test_reject_file_size(void)
{
  const char *h = "{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}";
  gsize hl = strlen(h);
  g_autofree char *trailing = g_strdup_printf(
      "x.safetensors: 3 trailing bytes: the data ends at byte %zu but the file has %zu bytes",
      8 + hl + 4, 8 + hl + 7);
  expect_reject(h, 7, trailing);
  g_autofree char *short_data = g_strdup_printf(
      "x.safetensors: tensor \"w\": data is short: it ends at byte 4 of the data (header %zu "
      "bytes) but the file has only %zu bytes, 1 missing",
      8 + hl, 8 + hl + 3);
  expect_reject(h, 3, short_data);
  /* A file with no tensors must end with its header too */
  expect_reject("{}", 1, "x.safetensors: 1 trailing bytes");
}

static void
test_reject_duplicates(void)
{
  expect_reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}",
                4, "x.safetensors: header has the key \"a\" twice");
  expect_reject("{\"a\":{\"dtype\":\"U8\",\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[0,2]}}",
                2, "header has the key \"dtype\" twice");
  expect_reject("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0,
                "header has the key \"k\" twice");
  expect_reject("{\"__metadata__\":{},\"__metadata__\":{}}", 0,
                "header has the key \"__metadata__\" twice");
}

static void
test_reject_metadata(void)
{
  expect_reject("{\"__metadata__\":[]}", 0,
                "x.safetensors: __metadata__ is an array, not an object");
  expect_reject("{\"__metadata__\":{\"format\":\"pt\",\"epoch\":3}}", 0,
                "x.safetensors: __metadata__ value of \"epoch\" is 3, not a string");
  expect_reject("{\"__metadata__\":{\"x\":null}}", 0, "__metadata__ value of \"x\" is null");
  expect_reject("{\"__metadata__\":{\"x\":[\"a\"]}}", 0, "__metadata__ value of \"x\" is an array");
}

static void
test_reject_hostile_name(void)
{
  /* A newline in a name must not break the message into two lines */
  expect_reject("{\"a\\nb\":1}", 0, "tensor \"a\\x0ab\": entry is 1");
}

/* ================================================================ reader: accepts */

static void
test_accept_whitespace(void)
{
  static const char header[] =
      " \t\r\n{\"w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}} \t\r\n     ";
  g_autoptr(GBytes) img = image(header, 2);
  g_autoptr(WsyncSafetensors) st = expect_accept(img);
  g_assert_cmpuint(wsync_safetensors_n_tensors(st), ==, 1);
  const WsyncTensor *t = wsync_safetensors_tensor(st, 0);
  g_assert_cmpstr(t->name, ==, "w");
  g_assert_cmpuint(t->data[0], ==, 0);
  g_assert_cmpuint(t->data[1], ==, 1);
  g_assert_cmpuint(wsync_safetensors_header_size(st), ==, 8 + strlen(header));
}

static void
test_accept_scalar_and_empty_dims(void)
{
  g_autoptr(GBytes) img = image("{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                                "\"z\":{\"dtype\":\"BF16\",\"shape\":[2,0],\"data_offsets\":[4,4]},"
                                "\"y\":{\"dtype\":\"F4\",\"shape\":[0],\"data_offsets\":[4,4]}}",
                                4);
  g_autoptr(WsyncSafetensors) st = expect_accept(img);
  g_assert_cmpuint(wsync_safetensors_n_tensors(st), ==, 3);
  const WsyncTensor *s = wsync_safetensors_lookup(st, "s");
  g_assert_nonnull(s);
  g_assert_cmpuint(s->ndim, ==, 0);
  g_assert_cmpuint(s->numel, ==, 1);
  g_assert_cmpuint(s->nbytes, ==, 4);
  g_assert_cmpstr(s->file, ==, "x.safetensors");
  const WsyncTensor *z = wsync_safetensors_lookup(st, "z");
  g_assert_cmpuint(z->ndim, ==, 2);
  g_assert_cmpuint(z->shape[0], ==, 2);
  g_assert_cmpuint(z->shape[1], ==, 0);
  g_assert_cmpuint(z->numel, ==, 0);
  g_assert_cmpuint(z->nbytes, ==, 0);
  g_assert_null(wsync_safetensors_lookup(st, "nope"));
}

static void
test_accept_empty(void)
{
  g_autoptr(GBytes) img = image("{}", 0);
  g_autoptr(WsyncSafetensors) st = expect_accept(img);
  g_assert_cmpuint(wsync_safetensors_n_tensors(st), ==, 0);
  g_assert_cmpuint(g_hash_table_size(wsync_safetensors_metadata(st)), ==, 0);
  g_assert_cmpuint(wsync_safetensors_header_size(st), ==, 10);
}

static void
test_accept_metadata(void)
{
  g_autoptr(GBytes) img =
      image("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
            "\"__metadata__\":{\"format\":\"pt\",\"note\":\"a \\\"quoted\\\" \\u00e9\"}}",
            1);
  g_autoptr(WsyncSafetensors) st = expect_accept(img);
  GHashTable *md = wsync_safetensors_metadata(st);
  g_assert_cmpuint(g_hash_table_size(md), ==, 2);
  g_assert_cmpstr(g_hash_table_lookup(md, "format"), ==, "pt");
  g_assert_cmpstr(g_hash_table_lookup(md, "note"), ==, "a \"quoted\" \xc3\xa9");
  g_assert_cmpuint(wsync_safetensors_n_tensors(st), ==, 1);
}

/* Tensors come in data order, whatever the header's order */
static void
test_accept_data_order(void)
{
  g_autoptr(GBytes) img = image("{\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[2,5]},"
                                "\"c\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[5,5]},"
                                "\"a\":{\"dtype\":\"I16\",\"shape\":[1],\"data_offsets\":[0,2]}}",
                                5);
  g_autoptr(WsyncSafetensors) st = expect_accept(img);
  g_assert_cmpstr(wsync_safetensors_tensor(st, 0)->name, ==, "a");
  g_assert_cmpstr(wsync_safetensors_tensor(st, 1)->name, ==, "b");
  g_assert_cmpstr(wsync_safetensors_tensor(st, 2)->name, ==, "c");
  const WsyncTensor *b = wsync_safetensors_lookup(st, "b");
  g_assert_cmpuint(b->data[0], ==, 2);
  g_assert_cmpuint(b->data[2], ==, 4);
}

/* ================================================================ open() */

static void
test_open_errors(Tmp *t, gconstpointer data)
{
  (void)data;
  g_autoptr(GError) err = NULL;
  g_autofree char *missing = g_build_filename(t->dir, "missing.safetensors", NULL);
  g_assert_null(wsync_safetensors_open(missing, &err));
  g_autofree char *msg = g_strdup_printf("cannot open %s: ", missing);
  check_error(err, WSYNC_ERROR_IO, msg);
  g_clear_error(&err);

  /* a directory is not a safetensors file: bad input (an index can name one) */
  g_assert_null(wsync_safetensors_open(t->dir, &err));
  g_autofree char *msg_dir = g_strdup_printf("%s: is a directory, not a safetensors file", t->dir);
  check_error(err, WSYNC_ERROR_BAD_INPUT, msg_dir);
  g_clear_error(&err);

  g_autofree char *empty = g_build_filename(t->dir, "empty.safetensors", NULL);
  g_assert_true(g_file_set_contents(empty, "", 0, NULL));
  g_assert_null(wsync_safetensors_open(empty, &err));
  g_autofree char *msg2 = g_strdup_printf("%s: file is 0 bytes, too short", empty);
  check_error(err, WSYNC_ERROR_BAD_INPUT, msg2);
  g_clear_error(&err);

  /* A FIFO must neither hang open() nor be read */
  g_autofree char *fifo = g_build_filename(t->dir, "fifo.safetensors", NULL);
  g_assert_cmpint(mkfifo(fifo, 0600), ==, 0);
  g_assert_null(wsync_safetensors_open(fifo, &err));
  g_autofree char *msg4 = g_strdup_printf("%s: not a regular file", fifo);
  check_error(err, WSYNC_ERROR_BAD_INPUT, msg4);
  g_clear_error(&err);

  /* The real path shows up in messages about the contents */
  g_autofree char *bad = g_build_filename(t->dir, "bad.safetensors", NULL);
  g_autoptr(GBytes) img = image("{\"w\":{\"dtype\":\"X\",\"shape\":[],\"data_offsets\":[0,0]}}", 0);
  g_assert_true(
      g_file_set_contents(bad, g_bytes_get_data(img, NULL), (gssize)g_bytes_get_size(img), NULL));
  g_assert_null(wsync_safetensors_open(bad, &err));
  g_autofree char *msg3 = g_strdup_printf("%s: tensor \"w\": unknown dtype \"X\"", bad);
  check_error(err, WSYNC_ERROR_BAD_INPUT, msg3);
}

/* ================================================================ writer */

static void
test_writer_empty_headers(void)
{
  gsize len;
  g_autoptr(WsyncSafetensorsWriter) w = wsync_safetensors_writer_new();
  g_autofree guint8 *h = wsync_safetensors_writer_header(w, &len);
  g_assert_cmpmem(h, len, "\x08\0\0\0\0\0\0\0{}      ", 16);

  g_autoptr(WsyncSafetensorsWriter) w2 = wsync_safetensors_writer_new();
  wsync_safetensors_writer_set_metadata(w2, "framework", "pt");
  g_autofree guint8 *h2 = wsync_safetensors_writer_header(w2, &len);
  g_assert_cmpmem(h2, len, "\x28\0\0\0\0\0\0\0{\"__metadata__\":{\"framework\":\"pt\"}}     ", 48);
}

/* safetensors' test_serialization: F32 "test" [1,2,3] holding 0..5, header length 64 */
static void
test_writer_reference_vector(Tmp *t, gconstpointer data)
{
  (void)data;
  static const char expected_header[] = "@\0\0\0\0\0\0\0{\"test\":{\"dtype\":\"F32\",\"shape\":[1,"
                                        "2,3],\"data_offsets\":[0,24]}}     ";
  static const float values[6] = {0, 1, 2, 3, 4, 5};
  g_autofree char *path = g_build_filename(t->dir, "vector.safetensors", NULL);
  g_autoptr(GError) err = NULL;
  g_autoptr(WsyncSafetensorsWriter) w = wsync_safetensors_writer_new();
  g_assert_true(
      wsync_safetensors_writer_add(w, "test", WSYNC_DTYPE_F32, 3, (guint64[]){1, 2, 3}, &err));
  g_assert_true(wsync_safetensors_writer_begin(w, path, &err));
  g_assert_no_error(err);
  g_assert_true(wsync_safetensors_writer_pwrite(w, "test", 0, values, sizeof values, &err));
  g_assert_true(wsync_safetensors_writer_finish(w, &err));
  g_assert_no_error(err);

  gsize len;
  g_autofree char *bytes = read_whole(path, &len);
  g_assert_cmpuint(len, ==, 72 + 24);
  g_assert_cmpmem(bytes, 72, expected_header, 72);
  static const guint8 le_floats[24] = {0, 0, 0,    0,    0, 0, 0x80, 0x3f, 0, 0, 0,    0x40,
                                       0, 0, 0x40, 0x40, 0, 0, 0x80, 0x40, 0, 0, 0xa0, 0x40};
  g_assert_cmpmem(bytes + 72, 24, le_floats, 24);
}

/* Largest alignment first, then by name */
static void
test_writer_order(void)
{
  g_autoptr(GError) err = NULL;
  g_autoptr(WsyncSafetensorsWriter) w = wsync_safetensors_writer_new();
  g_assert_true(wsync_safetensors_writer_add(w, "a", WSYNC_DTYPE_BF16, 1, (guint64[]){1}, &err));
  g_assert_true(wsync_safetensors_writer_add(w, "b", WSYNC_DTYPE_F32, 1, (guint64[]){1}, &err));
  g_assert_true(wsync_safetensors_writer_add(w, "c", WSYNC_DTYPE_U8, 0, NULL, &err));
  g_assert_true(wsync_safetensors_writer_add(w, "B", WSYNC_DTYPE_BF16, 1, (guint64[]){2}, &err));
  g_assert_no_error(err);
  gsize len;
  g_autofree guint8 *h = wsync_safetensors_writer_header(w, &len);
  static const char json[] = "{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                             "\"B\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[4,8]},"
                             "\"a\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[8,10]},"
                             "\"c\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[10,11]}}";
  g_assert_cmpuint(len % 8, ==, 0);
  g_assert_cmpmem(h + 8, strlen(json), json, strlen(json));
  for (gsize i = 8 + strlen(json); i < len; i++)
    g_assert_cmpint(h[i], ==, ' ');
  g_assert_cmpuint(h[0] + 8, ==, len);
  g_assert_cmpuint(wsync_safetensors_writer_data_size(w), ==, 11);
  g_assert_cmpuint(wsync_safetensors_writer_tensor_nbytes(w, "B"), ==, 4);
  g_assert_cmpuint(wsync_safetensors_writer_tensor_nbytes(w, "nope"), ==, 0);
}

/* Names that need escaping come out as serde_json writes them and read back intact */
static void
test_writer_escaping(void)
{
  g_autoptr(GError) err = NULL;
  g_autoptr(WsyncSafetensorsWriter) w = wsync_safetensors_writer_new();
  const char *name = "q\"b\\s/n\nt\tc\x01\x1f\x7f \xc3\xa9";
  g_assert_true(wsync_safetensors_writer_add(w, name, WSYNC_DTYPE_U8, 0, NULL, &err));
  wsync_safetensors_writer_set_metadata(w, "k", "v\x02");
  gsize len;
  g_autofree guint8 *h = wsync_safetensors_writer_header(w, &len);
  static const char json[] =
      "{\"__metadata__\":{\"k\":\"v\\u0002\"},"
      "\"q\\\"b\\\\s/n\\nt\\tc\\u0001\\u001f\x7f \xc3\xa9\":{\"dtype\":\"U8\",\"shape\":[],"
      "\"data_offsets\":[0,1]}}";
  g_assert_cmpmem(h + 8, strlen(json), json, strlen(json));

  /* Read it back: header, then the one data byte */
  GByteArray *file = g_byte_array_new_take(g_steal_pointer(&h), len);
  g_byte_array_append(file, (const guint8 *)"\x2a", 1);
  g_autoptr(WsyncSafetensors) st = wsync_safetensors_parse(file->data, file->len, "esc", &err);
  g_assert_no_error(err);
  g_assert_cmpstr(wsync_safetensors_tensor(st, 0)->name, ==, name);
  g_assert_cmpuint(wsync_safetensors_tensor(st, 0)->data[0], ==, 0x2a);
  g_assert_cmpstr(g_hash_table_lookup(wsync_safetensors_metadata(st), "k"), ==, "v\x02");
  g_byte_array_unref(file);
}

static void
test_writer_add_errors(void)
{
  g_autoptr(GError) err = NULL;
  g_autoptr(WsyncSafetensorsWriter) w = wsync_safetensors_writer_new();
  g_assert_true(wsync_safetensors_writer_add(w, "a", WSYNC_DTYPE_U8, 1, (guint64[]){1}, &err));
  g_assert_false(wsync_safetensors_writer_add(w, "a", WSYNC_DTYPE_U8, 1, (guint64[]){1}, &err));
  check_error(err, WSYNC_ERROR_USAGE, "tensor \"a\": declared twice");
  g_clear_error(&err);
  g_assert_false(wsync_safetensors_writer_add(w, "__metadata__", WSYNC_DTYPE_U8, 0, NULL, &err));
  check_error(err, WSYNC_ERROR_USAGE, "tensor \"__metadata__\": the name is reserved");
  g_clear_error(&err);
  guint64 shape[17];
  for (int i = 0; i < 17; i++)
    shape[i] = 1;
  g_assert_false(wsync_safetensors_writer_add(w, "d", WSYNC_DTYPE_U8, 17, shape, &err));
  check_error(err, WSYNC_ERROR_USAGE, "tensor \"d\": 17 dimensions, more than 16");
  g_clear_error(&err);
  g_assert_false(wsync_safetensors_writer_add(w, "f4", WSYNC_DTYPE_F4, 1, (guint64[]){3}, &err));
  check_error(err, WSYNC_ERROR_USAGE, "tensor \"f4\": shape [3] of F4 does not fill");
  g_clear_error(&err);
  g_assert_false(
      wsync_safetensors_writer_add(w, "o", WSYNC_DTYPE_U8, 2, (guint64[]){G_MAXUINT64, 2}, &err));
  check_error(err, WSYNC_ERROR_USAGE, "overflows 64 bits");
}

/* Fill via data() and pwrite(), read back with the reader and compare every byte. */
static void
test_writer_round_trip(Tmp *t, gconstpointer data)
{
  (void)data;
  g_autofree char *path = g_build_filename(t->dir, "rt.safetensors", NULL);
  g_autoptr(GError) err = NULL;
  g_autoptr(WsyncSafetensorsWriter) w = wsync_safetensors_writer_new();
  wsync_safetensors_writer_set_metadata(w, "format", "pt");
  g_assert_true(
      wsync_safetensors_writer_add(w, "mapped", WSYNC_DTYPE_BF16, 2, (guint64[]){3, 5}, &err));
  g_assert_true(
      wsync_safetensors_writer_add(w, "written", WSYNC_DTYPE_F32, 1, (guint64[]){7}, &err));
  g_assert_true(
      wsync_safetensors_writer_add(w, "empty", WSYNC_DTYPE_F64, 2, (guint64[]){0, 4}, &err));
  g_assert_true(wsync_safetensors_writer_begin(w, path, &err));
  g_assert_no_error(err);

  /* The file already has its final size */
  struct stat sb;
  g_assert_cmpint(g_stat(path, &sb), ==, 0);
  gsize hlen;
  g_autofree guint8 *header = wsync_safetensors_writer_header(w, &hlen);
  g_assert_cmpint(sb.st_size, ==, hlen + 30 + 28);

  guint8 *m = wsync_safetensors_writer_data(w, "mapped", &err);
  g_assert_no_error(err);
  g_assert_nonnull(m);
  for (int i = 0; i < 30; i++)
    m[i] = (guint8)(100 + i);
  g_assert_nonnull(wsync_safetensors_writer_data(w, "empty", &err));
  g_assert_no_error(err);

  /* In two pieces, the second first */
  guint8 buf[28];
  for (int i = 0; i < 28; i++)
    buf[i] = (guint8)(200 + i);
  g_assert_true(wsync_safetensors_writer_pwrite(w, "written", 10, buf + 10, 18, &err));
  g_assert_true(wsync_safetensors_writer_pwrite(w, "written", 0, buf, 10, &err));
  g_assert_true(wsync_safetensors_writer_pwrite(w, "written", 28, buf, 0, &err));
  g_assert_no_error(err);

  g_assert_false(wsync_safetensors_writer_pwrite(w, "written", 20, buf, 9, &err));
  check_error(err, WSYNC_ERROR_USAGE,
              "rt.safetensors: tensor \"written\": writing 9 bytes at offset "
              "20 passes its end (28 bytes)");
  g_clear_error(&err);
  g_assert_false(wsync_safetensors_writer_pwrite(w, "nope", 0, buf, 1, &err));
  check_error(err, WSYNC_ERROR_USAGE, "tensor \"nope\" was not declared");
  g_clear_error(&err);
  g_assert_null(wsync_safetensors_writer_data(w, "nope", &err));
  check_error(err, WSYNC_ERROR_USAGE, "tensor \"nope\" was not declared");
  g_clear_error(&err);

  g_assert_true(wsync_safetensors_writer_finish(w, &err));
  g_assert_no_error(err);

  g_autoptr(WsyncSafetensors) st = wsync_safetensors_open(path, &err);
  g_assert_no_error(err);
  g_assert_cmpuint(wsync_safetensors_header_size(st), ==, hlen);
  g_assert_cmpuint(wsync_safetensors_n_tensors(st), ==, 3);
  /* F64 before F32 before BF16 */
  g_assert_cmpstr(wsync_safetensors_tensor(st, 0)->name, ==, "empty");
  g_assert_cmpstr(wsync_safetensors_tensor(st, 1)->name, ==, "written");
  g_assert_cmpstr(wsync_safetensors_tensor(st, 2)->name, ==, "mapped");
  const WsyncTensor *tm = wsync_safetensors_lookup(st, "mapped");
  g_assert_cmpint(tm->dtype, ==, WSYNC_DTYPE_BF16);
  g_assert_cmpuint(tm->shape[1], ==, 5);
  for (int i = 0; i < 30; i++)
    g_assert_cmpuint(tm->data[i], ==, 100 + i);
  g_assert_cmpmem(wsync_safetensors_lookup(st, "written")->data, 28, buf, 28);
  g_assert_cmpstr(g_hash_table_lookup(wsync_safetensors_metadata(st), "format"), ==, "pt");

  /* The header on disk is the one header() builds */
  gsize len;
  g_autofree char *bytes = read_whole(path, &len);
  g_assert_cmpmem(bytes, hlen, header, hlen);
}

/* A file with no data at all: data() needs no map */
static void
test_writer_no_data(Tmp *t, gconstpointer data)
{
  (void)data;
  g_autofree char *path = g_build_filename(t->dir, "nodata.safetensors", NULL);
  g_autoptr(GError) err = NULL;
  g_autoptr(WsyncSafetensorsWriter) w = wsync_safetensors_writer_new();
  g_assert_true(wsync_safetensors_writer_add(w, "z", WSYNC_DTYPE_F32, 1, (guint64[]){0}, &err));
  g_assert_true(wsync_safetensors_writer_begin(w, path, &err));
  g_assert_nonnull(wsync_safetensors_writer_data(w, "z", &err));
  g_assert_true(wsync_safetensors_writer_finish(w, &err));
  g_assert_no_error(err);
  g_autoptr(WsyncSafetensors) st = wsync_safetensors_open(path, &err);
  g_assert_no_error(err);
  g_assert_cmpuint(wsync_safetensors_lookup(st, "z")->nbytes, ==, 0);
}

static void
test_writer_begin_error(Tmp *t, gconstpointer data)
{
  (void)data;
  g_autofree char *path = g_build_filename(t->dir, "no-such-dir", "x.safetensors", NULL);
  g_autoptr(GError) err = NULL;
  g_autoptr(WsyncSafetensorsWriter) w = wsync_safetensors_writer_new();
  g_assert_false(wsync_safetensors_writer_begin(w, path, &err));
  g_autofree char *msg = g_strdup_printf("cannot create %s: ", path);
  check_error(err, WSYNC_ERROR_IO, msg);
}

#define N_THREADS 8
#define THREAD_TENSOR_BYTES 4096

typedef struct {
  WsyncSafetensorsWriter *w;
  int index;
} Job;

/* Each thread writes its own tensor, half through pwrite() and half through data(). */
static gpointer
write_job(gpointer data)
{
  Job *job = data;
  g_autofree char *name = g_strdup_printf("t%d", job->index);
  guint8 buf[THREAD_TENSOR_BYTES / 2];
  for (gsize i = 0; i < sizeof buf; i++)
    buf[i] = (guint8)(job->index * 16 + i % 13);
  for (gsize off = 0; off < sizeof buf; off += 256)
    if (!wsync_safetensors_writer_pwrite(job->w, name, off, buf + off, 256, NULL))
      return GINT_TO_POINTER(1);
  guint8 *m = wsync_safetensors_writer_data(job->w, name, NULL);
  if (m == NULL)
    return GINT_TO_POINTER(1);
  for (gsize i = 0; i < sizeof buf; i++)
    m[sizeof buf + i] = (guint8)(job->index * 16 + 7 + i % 5);
  return NULL;
}

static void
test_writer_threads(Tmp *t, gconstpointer data)
{
  (void)data;
  g_autofree char *path = g_build_filename(t->dir, "threads.safetensors", NULL);
  g_autoptr(GError) err = NULL;
  g_autoptr(WsyncSafetensorsWriter) w = wsync_safetensors_writer_new();
  for (int i = 0; i < N_THREADS; i++) {
    g_autofree char *name = g_strdup_printf("t%d", i);
    g_assert_true(wsync_safetensors_writer_add(w, name, WSYNC_DTYPE_U8, 1,
                                               (guint64[]){THREAD_TENSOR_BYTES}, &err));
  }
  g_assert_true(wsync_safetensors_writer_begin(w, path, &err));
  g_assert_no_error(err);

  Job jobs[N_THREADS];
  GThread *threads[N_THREADS];
  for (int i = 0; i < N_THREADS; i++) {
    jobs[i] = (Job){w, i};
    threads[i] = g_thread_new("writer", write_job, &jobs[i]);
  }
  for (int i = 0; i < N_THREADS; i++)
    g_assert_null(g_thread_join(threads[i]));
  g_assert_true(wsync_safetensors_writer_finish(w, &err));
  g_assert_no_error(err);

  g_autoptr(WsyncSafetensors) st = wsync_safetensors_open(path, &err);
  g_assert_no_error(err);
  for (int k = 0; k < N_THREADS; k++) {
    g_autofree char *name = g_strdup_printf("t%d", k);
    const WsyncTensor *tt = wsync_safetensors_lookup(st, name);
    g_assert_nonnull(tt);
    for (gsize i = 0; i < THREAD_TENSOR_BYTES / 2; i++) {
      g_assert_cmpuint(tt->data[i], ==, (guint8)(k * 16 + i % 13));
      g_assert_cmpuint(tt->data[THREAD_TENSOR_BYTES / 2 + i], ==, (guint8)(k * 16 + 7 + i % 5));
    }
  }
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);

  g_test_add_func("/safetensors/dtype", test_dtype);

  g_test_add_func("/safetensors/reject/length", test_reject_length);
  g_test_add_func("/safetensors/reject/not-utf8", test_reject_not_utf8);
  g_test_add_func("/safetensors/reject/not-json", test_reject_not_json);
  g_test_add_func("/safetensors/reject/nul-escape", test_reject_nul_escape);
  g_test_add_func("/safetensors/reject/entry-types", test_reject_entry_types);
  g_test_add_func("/safetensors/reject/extra-key", test_reject_extra_key);
  g_test_add_func("/safetensors/reject/dtype", test_reject_dtype);
  g_test_add_func("/safetensors/reject/dims", test_reject_dims);
  g_test_add_func("/safetensors/reject/overflow", test_reject_overflow);
  g_test_add_func("/safetensors/reject/sub-byte", test_reject_sub_byte);
  g_test_add_func("/safetensors/reject/offsets", test_reject_offsets);
  g_test_add_func("/safetensors/reject/file-size", test_reject_file_size);
  g_test_add_func("/safetensors/reject/duplicates", test_reject_duplicates);
  g_test_add_func("/safetensors/reject/metadata", test_reject_metadata);
  g_test_add_func("/safetensors/reject/hostile-name", test_reject_hostile_name);

  g_test_add_func("/safetensors/accept/whitespace", test_accept_whitespace);
  g_test_add_func("/safetensors/accept/scalar-and-empty-dims", test_accept_scalar_and_empty_dims);
  g_test_add_func("/safetensors/accept/empty", test_accept_empty);
  g_test_add_func("/safetensors/accept/metadata", test_accept_metadata);
  g_test_add_func("/safetensors/accept/data-order", test_accept_data_order);

  g_test_add("/safetensors/open/errors", Tmp, NULL, tmp_setup, test_open_errors, tmp_teardown);

  g_test_add_func("/safetensors/writer/empty-headers", test_writer_empty_headers);
  g_test_add("/safetensors/writer/reference-vector", Tmp, NULL, tmp_setup,
             test_writer_reference_vector, tmp_teardown);
  g_test_add_func("/safetensors/writer/order", test_writer_order);
  g_test_add_func("/safetensors/writer/escaping", test_writer_escaping);
  g_test_add_func("/safetensors/writer/add-errors", test_writer_add_errors);
  g_test_add("/safetensors/writer/round-trip", Tmp, NULL, tmp_setup, test_writer_round_trip,
             tmp_teardown);
  g_test_add("/safetensors/writer/no-data", Tmp, NULL, tmp_setup, test_writer_no_data,
             tmp_teardown);
  g_test_add("/safetensors/writer/begin-error", Tmp, NULL, tmp_setup, test_writer_begin_error,
             tmp_teardown);
  g_test_add("/safetensors/writer/threads", Tmp, NULL, tmp_setup, test_writer_threads,
             tmp_teardown);

  return g_test_run();
}
