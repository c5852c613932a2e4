/* The commit record's parser (record.h), moved out of python/load.c for the fuzz harness. */
#include "config.h"

#include <string.h>

#include <wsync/error.h>
#include <wsync/session.h>

#include "../core/json-check.h"
#include "record.h"

static void
record_file_free(gpointer p)
{
  RecordFile *f = p;

  g_free(f->file);
  g_free(f->checksum);
  g_free(f);
}

static gboolean
bad_record(GError **error, const char *path, const char *what)
{
  return wsync_fail_at(error, WSYNC_ERROR_BAD_INPUT, path, "%s", what);
}

/* @s: @n hex digits (either case: load.c compares them so). */
static gboolean
hex_digits(const char *s, gsize n)
{
  gsize i = 0;

  while (g_ascii_isxdigit(s[i]))
    i++;
  return s[i] == '\0' && i == n;
}

static gboolean
member_uint(JsonObject *o, const char *name, guint64 *out)
{
  JsonNode *n = json_object_get_member(o, name);

  if (n == NULL || !JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_INT64 ||
      json_node_get_int(n) < 0)
    return FALSE;
  *out = (guint64)json_node_get_int(n);
  return TRUE;
}

static const char *
member_string(JsonObject *o, const char *name)
{
  JsonNode *n = json_object_get_member(o, name);

  if (n == NULL || !JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_STRING)
    return NULL;
  return json_node_get_string(n);
}

/* A safe base name: no directory part, not "." or "..", and nothing a message about the
 * file (load.c names it in every one) would print raw: no control character (a session
 * names its files model-rank-R-part-P.safetensors). */
static gboolean
plain_file_name(const char *name)
{
  for (const guchar *c = (const guchar *)name; *c != '\0'; c++)
    if (*c < 0x20 || *c == 0x7f)
      return FALSE;
  return name[0] != '\0' && strchr(name, '/') == NULL && strcmp(name, ".") != 0 &&
         strcmp(name, "..") != 0;
}

void
record_clear(Record *r)
{
  if (r->root != NULL)
    json_node_unref(r->root);
  if (r->files != NULL)
    g_ptr_array_unref(r->files);
  memset(r, 0, sizeof *r);
}

gboolean
record_parse(const char *path, const char *text, gsize len, Record *r, GError **error)
{
  g_autoptr(JsonParser) parser = json_parser_new();
  JsonObject *o;
  JsonNode *files;

  /* the checks of every JSON wsync reads (core/json-check.h, compiled into the module
   * too): json-glib alone overflowed its stack on a record nested some 100000 deep (a
   * segfault of the Python process), leaked what it had parsed when a second value
   * followed the first, and kept the last of two equal keys */
  if (!wsync_json_parse(parser, text, len, path, NULL, error))
    return FALSE;
  /* (json-glib parses an empty or blank text as no root, without an error) */
  if (json_parser_get_root(parser) == NULL)
    return bad_record(error, path, "the commit record is empty, not a JSON object");
  r->root = json_node_copy(json_parser_get_root(parser));
  if (!JSON_NODE_HOLDS_OBJECT(r->root))
    return bad_record(error, path, "the commit record is not a JSON object");
  o = json_node_get_object(r->root);
  if (!member_uint(o, "version", &r->version) || !member_uint(o, "world", &r->world) ||
      (r->digest = member_string(o, "digest")) == NULL)
    return bad_record(error, path, "the commit record lacks version, world or digest");
  /* the plan digest (docs/session.md section 2): SHA-256 as hex; load.c prints it when
   * it is not the caller's */
  if (!hex_digits(r->digest, 64)) {
    g_autofree char *digest = wsync_printable(r->digest);
    g_autofree char *what = g_strdup_printf(
        "the commit record's digest \"%s\" is not a plan digest (64 hex digits)", digest);
    return bad_record(error, path, what);
  }
  files = json_object_get_member(o, "files");
  if (files == NULL || !JSON_NODE_HOLDS_ARRAY(files))
    return bad_record(error, path, "the commit record has no list of files");
  r->files = g_ptr_array_new_with_free_func(record_file_free);
  for (guint i = 0; i < json_array_get_length(json_node_get_array(files)); i++) {
    JsonNode *n = json_array_get_element(json_node_get_array(files), i);
    JsonObject *fo = JSON_NODE_HOLDS_OBJECT(n) ? json_node_get_object(n) : NULL;
    RecordFile *f = g_new0(RecordFile, 1);
    g_ptr_array_add(r->files, f);
    const char *name = fo ? member_string(fo, "file") : NULL;
    JsonNode *sum = fo ? json_object_get_member(fo, "checksum") : NULL;
    JsonObject *so = sum != NULL && JSON_NODE_HOLDS_OBJECT(sum) ? json_node_get_object(sum) : NULL;
    const char *algorithm = so ? member_string(so, "algorithm") : NULL;
    const char *value = so ? member_string(so, "value") : NULL;
    guint64 block;
    if (name == NULL || so == NULL || !member_uint(fo, "rank", &f->rank) ||
        !member_uint(fo, "bytes", &f->bytes) || !plain_file_name(name))
      return bad_record(error, path,
                        "a file of the commit record lacks its plain file name, rank, bytes or "
                        "checksum");
    if (algorithm == NULL || value == NULL || !member_uint(so, "block", &block) ||
        strcmp(algorithm, WSYNC_SESSION_CHECKSUM_ALGORITHM) != 0 ||
        block != WSYNC_SESSION_CHECKSUM_BLOCK) {
      /* (json-glib 1.6's generator leaves 0x1f raw, core/json-check.h) */
      g_autofree char *json = json_to_string(sum, FALSE);
      g_autofree char *text = wsync_printable(json);
      return wsync_fail_at(error, WSYNC_ERROR_BAD_INPUT, path,
                           "file %s: checksum %s is not one this reader computes (algorithm "
                           "\"%s\", block %d)",
                           name, text, WSYNC_SESSION_CHECKSUM_ALGORITHM,
                           WSYNC_SESSION_CHECKSUM_BLOCK);
    }
    /* docs/session.md section 4: 16 hex digits; load.c prints it when the file's differs */
    if (!hex_digits(value, 16)) {
      g_autofree char *shown = wsync_printable(value);
      return wsync_fail_at(error, WSYNC_ERROR_BAD_INPUT, path,
                           "file %s: checksum value \"%s\" is not 16 hex digits", name, shown);
    }
    f->file = g_strdup(name);
    f->checksum = g_strdup(value);
  }
  return TRUE;
}
