/* The commit record `wsync-commit.json` (docs/session.md section 4) as python/load.c
 * (wsync.load_rank) reads it: parsed from its bytes, nothing read or mapped here.
 *
 * Private to the Python module (not in libwsync); in a file of its own, without
 * Python.h, so that tests/fuzz-record.c reaches the parser, which takes bytes a session
 * (or anyone) wrote into the directory. */
#ifndef WSYNC_PYTHON_RECORD_H
#define WSYNC_PYTHON_RECORD_H

#include <json-glib/json-glib.h>

typedef struct {
  char *file;
  guint64 rank, bytes;
  char *checksum; /* 16 hex digits */
} RecordFile;

typedef struct {
  JsonNode *root;
  guint64 version, world;
  const char *digest;
  GPtrArray *files; /* RecordFile*, in record order */
} Record;

/* Frees what @r holds and zeroes it (a zeroed or partly parsed @r too). */
void record_clear(Record *r);

/* Parses the @len bytes of @text, the record @path (named in errors), into @r (zeroed
 * before); FALSE with a #WSYNC_ERROR_BAD_INPUT @error on one line, @r then partly
 * filled: record_clear() it either way. */
gboolean record_parse(const char *path, const char *text, gsize len, Record *r,
                      GError **error);

#endif /* WSYNC_PYTHON_RECORD_H */
