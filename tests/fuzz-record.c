/* Fuzzing the commit record's parser: the bytes of `wsync-commit.json` (docs/session.md
 * section 4), which wsync.load_rank reads from the directory a session writes, through
 * record_parse() (python/record.c, the Python module's parser, here without Python).
 * A refusal must be one clean line of bad input.  An accepted record must hold only what
 * the reader may use and print later: plain file names (no directory part), a checksum
 * value of 16 hex digits and a digest of 64 (load.c prints both when they differ from
 * what it computes), so nothing the record says reaches a message raw.  See
 * fuzz-driver.h. */
#include <wsync/session.h>

#include "../python/record.h"

#define FUZZ_NAME "record"
#define FUZZ_CASES
#include "fuzz-driver.h"

#define RECORD_PATH "run/wsync-commit.json"

static void
fuzz_setup(void)
{
}

static void
fuzz_teardown(void)
{
}

/* A record as a session writes it (python/session.c, core/session.c). */
#define DIGEST "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define SUM(v) "{\"algorithm\": \"xxh3-64-blocks\", \"block\": 65536, \"value\": \"" v "\"}"

static void
fuzz_seeds(GPtrArray *seeds)
{
  static const char *const texts[] = {
      "{\"version\": 3, \"digest\": \"" DIGEST "\", \"target\": \"vllm\", \"format\": null, "
      "\"tp\": 2, \"ep\": 1, \"world\": 2, \"files\": [{\"file\": "
      "\"model-rank-0-part-0.safetensors\", \"rank\": 0, \"bytes\": 1024, \"checksum\": "
      SUM("00112233445566aa") "}, {\"file\": \"model-rank-1-part-0.safetensors\", \"rank\": 1, "
      "\"bytes\": 0, \"checksum\": " SUM("FFEEDDCCBBAA9988") "}]}",
      "{\"version\": 0, \"digest\": \"" DIGEST "\", \"world\": 1, \"files\": []}\n",
      "{\n  \"files\": [\n    {\"checksum\": " SUM("0000000000000000") ", \"bytes\": "
      "9223372036854775807, \"rank\": 7, \"file\": \"a\"}\n  ],\n  \"world\": 8,\n  "
      "\"version\": 9223372036854775807,\n  \"digest\": \"" DIGEST "\",\n  \"extra\": [1, {}]\n}\n",
  };
  for (guint i = 0; i < G_N_ELEMENTS(texts); i++)
    g_ptr_array_add(seeds, g_bytes_new_static(texts[i], strlen(texts[i])));
}

static const char *const *
fuzz_dictionary(void)
{
  static const char *const tokens[] = {
    "\"version\"", "\"digest\"", "\"world\"", "\"files\"", "\"file\"", "\"rank\"", "\"bytes\"",
    "\"checksum\"", "\"algorithm\"", "\"block\"", "\"value\"", "\"xxh3-64-blocks\"", "65536",
    "\"" DIGEST "\"", "\"0123456789abcdef\"", "\"..\"", "\".\"", "\"a/b\"", "\"\"",
    "\"\\u0000\"", "\"\\n\"", "\"\\u007f\"", "\"\\u001b[31m\"", "\\u0000", "\\n", "\\u007f",
    "\\ud800", "\xff", "\x7f", "\x01", "{", "}", "[", "]", ",", ":", "null", "true", "-1",
    "1.5", "1e400", "9223372036854775808", "18446744073709551616", NULL};
  return tokens;
}

/* @s: @n hex digits. */
static gboolean
is_hex(const char *s, gsize n)
{
  gsize i = 0;
  for (; s[i] != '\0'; i++)
    if (!g_ascii_isxdigit(s[i]))
      return FALSE;
  return i == n;
}

static gboolean
is_printable(const char *s)
{
  for (const guchar *c = (const guchar *)s; *c; c++)
    if (*c < 0x20 || *c == 0x7f)
      return FALSE;
  return TRUE;
}

/* The rules of an accepted record (see the top of the file). */
static void
check_accepted(const Record *r)
{
  if (r->root == NULL || r->files == NULL || r->digest == NULL)
    g_error("record: accepted without its root, files or digest");
  if (!is_hex(r->digest, 64))
    g_error("record: accepted with digest \"%s\"", g_strescape(r->digest, NULL));
  for (guint i = 0; i < r->files->len; i++) {
    const RecordFile *f = r->files->pdata[i];
    if (f->file[0] == '\0' || strchr(f->file, '/') != NULL || strcmp(f->file, ".") == 0 ||
        strcmp(f->file, "..") == 0 || !is_printable(f->file))
      g_error("record: accepted with file \"%s\"", g_strescape(f->file, NULL));
    if (!is_hex(f->checksum, 16))
      g_error("record: accepted with checksum \"%s\"", g_strescape(f->checksum, NULL));
  }
}

/* Parses @len bytes of @text: NULL when accepted (checked), else the refusal's message
 * (checked: one clean line of bad input). */
static char *
parse(const char *text, gsize len)
{
  static const WsyncError allowed[] = {WSYNC_ERROR_BAD_INPUT};
  Record r = {0};
  GError *error = NULL;
  char *message = NULL;

  if (record_parse(RECORD_PATH, text, len, &r, &error)) {
    if (error != NULL)
      g_error("record: accepted with an error set: %s", error->message);
    check_accepted(&r);
  } else {
    fuzz_check_refusal(error, allowed, G_N_ELEMENTS(allowed));
    message = g_strdup(error->message);
    g_error_free(error);
  }
  record_clear(&r);
  return message;
}

static gboolean
fuzz_one(const guint8 *data, gsize len)
{
  /* (an empty input arrives as NULL; load.c reads an empty file as "") */
  g_autofree char *message = parse(data ? (const char *)data : "", len);
  return message == NULL;
}

/* The refusal of @text, which must hold @fragment. */
static void
assert_refused(const char *text, const char *fragment)
{
  g_autofree char *message = parse(text, strlen(text));
  if (message == NULL)
    g_error("record: accepted: %s", text);
  if (strstr(message, fragment) == NULL)
    g_error("record: refused with \"%s\", not with \"%s\"", message, fragment);
}

#define ONE_FILE(name, sum) \
  "{\"version\": 1, \"digest\": \"" DIGEST "\", \"world\": 1, \"files\": [{\"file\": \"" name \
  "\", \"rank\": 0, \"bytes\": 8, \"checksum\": " sum "}]}"

/* What fuzzing found: json-glib unguarded (the first three), a NULL root copied (a
 * critical warning) for an empty record, four records accepted whose values load.c
 * prints raw, and a raw 0x1f in the message about a checksum. */
static void
fuzz_cases(void)
{
  /* json-glib alone: a stack overflow some 100000 levels deep (a segfault of load_rank),
   * the first value leaked when a second follows, the last of two equal keys kept */
  GString *deep = g_string_new(NULL);
  for (int i = 0; i < 200000; i++)
    g_string_append_c(deep, '[');
  for (int i = 0; i < 200000; i++)
    g_string_append_c(deep, ']');
  assert_refused(deep->str, RECORD_PATH ": JSON nests deeper than 64 levels (at byte 64)");
  g_string_free(deep, TRUE);
  assert_refused("{\"version\": 1} {\"version\": 2}",
                 RECORD_PATH ": not valid JSON: a second value begins at byte 15");
  assert_refused("{\"version\": 1, \"version\": 2}",
                 RECORD_PATH ": the key \"version\" appears twice");
  /* no root: json_node_copy(NULL), a critical warning (fatal under make check) */
  assert_refused("", RECORD_PATH ": the commit record is empty, not a JSON object");
  assert_refused(" \n\t", RECORD_PATH ": the commit record is empty, not a JSON object");
  /* a checksum value load.c would print raw when the file's differs */
  assert_refused(ONE_FILE("a", SUM("0011\\n")),
                 RECORD_PATH ": file a: checksum value \"0011\\x0a\" is not 16 hex digits");
  assert_refused(ONE_FILE("a", SUM("00112233445566778")), "is not 16 hex digits");
  /* a digest load.c would print raw when it is not the caller's */
  assert_refused("{\"version\": 1, \"digest\": \"x\\u007f\", \"world\": 1, \"files\": []}",
                 RECORD_PATH ": the commit record's digest \"x\\x7f\" is not a plan digest "
                             "(64 hex digits)");
  /* a file name every message of load.c would print raw */
  assert_refused(ONE_FILE("a\\nb", SUM("0011223344556677")),
                 RECORD_PATH ": a file of the commit record lacks its plain file name");
  /* a file name json-glib cut at the NUL ("a"), which Python's json reads whole */
  assert_refused(ONE_FILE("a\\u0000b", SUM("0011223344556677")),
                 RECORD_PATH ": a NUL character (\\u0000) in a string at byte 126");
  /* the checksum it quotes: json-glib 1.6's generator leaves 0x1f raw */
  assert_refused(ONE_FILE("a", "{\"algorithm\": \"x\\u001f\", \"block\": 65536, "
                               "\"value\": \"0011223344556677\"}"),
                 RECORD_PATH ": file a: checksum {\"algorithm\":\"x\\x1f\",");
  /* (it escapes the other control characters, DEL included) */
  assert_refused(ONE_FILE("a", "{\"algorithm\": \"x\\u007f\", \"block\": 65536, "
                               "\"value\": \"0011223344556677\"}"),
                 RECORD_PATH ": file a: checksum {\"algorithm\":\"x\\u007f\",");
}
