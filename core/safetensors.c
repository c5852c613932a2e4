/* wsync: reading and writing safetensors files.
 *
 * The reader mirrors the reference parser (huggingface/safetensors, tensor.rs) and
 * refuses a few things it lets through: duplicate keys, extra keys in a tensor entry
 * and JSON that nests deeper than the format ever needs.  The writer reproduces the
 * reference writer byte for byte (serde_json compact output, same order, same padding).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-glib/json-glib.h>

#include <wsync/error.h>
#include <wsync/safetensors.h>

#include "filekind.h"
#include "json-check.h"
#include "safetensors-private.h"

/* ================================================================ messages */

#define bad_input wsync_json_bad_tensor

/* "[2, 3]" */
static char *
format_shape(const guint64 *shape, guint ndim)
{
  GString *out = g_string_new("[");
  for (guint i = 0; i < ndim; i++)
    g_string_append_printf(out, "%s%" G_GUINT64_FORMAT, i ? ", " : "", shape[i]);
  g_string_append_c(out, ']');
  return g_string_free(out, FALSE);
}

/* What a JSON value is, for "X is VALUE, not Y" messages. */
static char *
describe_node(JsonNode *node)
{
  switch (JSON_NODE_TYPE(node)) {
  case JSON_NODE_OBJECT:
    return g_strdup("an object");
  case JSON_NODE_ARRAY:
    return g_strdup("an array");
  case JSON_NODE_NULL:
    return g_strdup("null");
  case JSON_NODE_VALUE:
    break;
  }
  GType type = json_node_get_value_type(node);
  if (type == G_TYPE_INT64)
    return g_strdup_printf("%" G_GINT64_FORMAT, json_node_get_int(node));
  if (type == G_TYPE_DOUBLE) {
    char buf[G_ASCII_DTOSTR_BUF_SIZE];
    return g_strdup(g_ascii_dtostr(buf, sizeof buf, json_node_get_double(node)));
  }
  if (type == G_TYPE_BOOLEAN)
    return g_strdup(json_node_get_boolean(node) ? "true" : "false");
  if (type == G_TYPE_STRING) {
    g_autofree char *s = wsync_json_printable(json_node_get_string(node));
    return g_strdup_printf("the string \"%s\"", s);
  }
  return g_strdup("a value of an unknown type");
}

/* ================================================================ JSON loading */

/* Parses @text into @parser, which must outlive the returned root object.  @what names
 * the text in messages ("header"). */
static JsonObject *
load_json_object(JsonParser *parser, const char *text, gsize len, const char *file,
                 const char *what, GError **error)
{
  if (!wsync_json_parse(parser, text, len, file, what, error))
    return NULL;
  JsonNode *root = json_parser_get_root(parser);
  if (root == NULL) {
    bad_input(error, file, NULL, "%s is empty, not a JSON object", what);
    return NULL;
  }
  if (!JSON_NODE_HOLDS_OBJECT(root)) {
    g_autofree char *desc = describe_node(root);
    bad_input(error, file, NULL, "%s is %s, not a JSON object", what, desc);
    return NULL;
  }
  return json_node_get_object(root);
}

/* A JSON integer that fits a guint64.  json-glib reads integers of 2^63 and more as
 * negative numbers, so those are refused too. */
static gboolean
node_get_uint(JsonNode *node, guint64 *out)
{
  if (!JSON_NODE_HOLDS_VALUE(node) || json_node_get_value_type(node) != G_TYPE_INT64)
    return FALSE;
  gint64 v = json_node_get_int(node);
  if (v < 0)
    return FALSE;
  *out = (guint64)v;
  return TRUE;
}

/* ================================================================ reader */

typedef struct {
  WsyncTensor t;
  guint64 begin, end; /* data_offsets */
} Entry;

struct _WsyncSafetensors {
  char *path;
  void *map; /* our own mapping, or NULL */
  gsize map_len;
  guint64 header_size;
  Entry *entries; /* in data order */
  guint n_entries;
  GHashTable *by_name;  /* name -> Entry*; names owned by the entries */
  GHashTable *metadata; /* string -> string */
  gboolean kept;        /* its descriptor is kept (see keep_descriptor()) */
};

/* ================================================================ kept descriptors */

/* The executor copies runs of bytes file to file with copy_file_range(2), which needs
 * the descriptors of the input files; they are kept open next to the maps, as long as
 * they use at most a quarter of the descriptors the process may open (a sharded
 * checkpoint can have thousands of files: the rest are read through their maps). */
typedef struct {
  const guint8 *map;
  gsize len;
  int fd;
} KeptFile;

static GMutex kept_lock;
static GArray *kept_files; /* KeptFile */

static gboolean
keep_descriptor(const guint8 *map, gsize len, int fd)
{
  struct rlimit rl;
  guint64 budget = 256;
  gboolean ok;

  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    budget = rl.rlim_cur / 4;
  g_mutex_lock(&kept_lock);
  if (kept_files == NULL)
    kept_files = g_array_new(FALSE, FALSE, sizeof(KeptFile));
  ok = kept_files->len < budget;
  if (ok) {
    KeptFile k = {map, len, fd};
    g_array_append_val(kept_files, k);
  }
  g_mutex_unlock(&kept_lock);
  return ok;
}

static void
forget_descriptor(const guint8 *map)
{
  g_mutex_lock(&kept_lock);
  for (guint i = 0; kept_files != NULL && i < kept_files->len; i++) {
    KeptFile *k = &g_array_index(kept_files, KeptFile, i);
    if (k->map == map) {
      close(k->fd);
      g_array_remove_index_fast(kept_files, i);
      break;
    }
  }
  if (kept_files != NULL && kept_files->len == 0)
    g_clear_pointer(&kept_files, g_array_unref);
  g_mutex_unlock(&kept_lock);
}

gboolean
safetensors_source_file(const guint8 *data, guint64 len, int *fd, guint64 *offset)
{
  gboolean found = FALSE;

  g_mutex_lock(&kept_lock);
  for (guint i = 0; kept_files != NULL && i < kept_files->len && !found; i++) {
    const KeptFile *k = &g_array_index(kept_files, KeptFile, i);
    if (data >= k->map && data < k->map + k->len && len <= (guint64)(k->map + k->len - data)) {
      *fd = k->fd;
      *offset = (guint64)(data - k->map);
      found = TRUE;
    }
  }
  g_mutex_unlock(&kept_lock);
  return found;
}

void
wsync_safetensors_free(WsyncSafetensors *st)
{
  if (st == NULL)
    return;
  if (st->kept)
    forget_descriptor(st->map);
  if (st->map)
    munmap(st->map, st->map_len);
  for (guint i = 0; i < st->n_entries; i++)
    g_free((char *)st->entries[i].t.name);
  g_free(st->entries);
  if (st->by_name)
    g_hash_table_destroy(st->by_name);
  if (st->metadata)
    g_hash_table_destroy(st->metadata);
  g_free(st->path);
  g_free(st);
}

/* Reads the array of non-negative integers in member @key of a tensor entry. */
static gboolean
parse_uint_array(JsonObject *entry, const char *key, guint max_len, guint64 *out, guint *len,
                 const char *file, const char *name, GError **error)
{
  JsonNode *node = json_object_get_member(entry, key);
  if (node == NULL)
    return bad_input(error, file, name, "missing \"%s\"", key);
  if (!JSON_NODE_HOLDS_ARRAY(node)) {
    g_autofree char *desc = describe_node(node);
    return bad_input(error, file, name, "\"%s\" is %s, not an array", key, desc);
  }
  JsonArray *array = json_node_get_array(node);
  guint n = json_array_get_length(array);
  if (n > max_len) {
    if (max_len == WSYNC_MAX_DIMS)
      return bad_input(error, file, name, "shape has %u dimensions, more than %d", n,
                       WSYNC_MAX_DIMS);
    return bad_input(error, file, name, "\"%s\" has %u elements, not %u", key, n, max_len);
  }
  for (guint i = 0; i < n; i++) {
    JsonNode *elem = json_array_get_element(array, i);
    if (!node_get_uint(elem, &out[i])) {
      g_autofree char *desc = describe_node(elem);
      return bad_input(error, file, name,
                       "\"%s\" element %u is %s, not an integer from 0 to 2^63-1", key, i, desc);
    }
  }
  *len = n;
  return TRUE;
}

static gboolean
parse_dtype(JsonObject *entry, WsyncDtype *dtype, const char *file, const char *name,
            GError **error)
{
  JsonNode *node = json_object_get_member(entry, "dtype");
  if (node == NULL)
    return bad_input(error, file, name, "missing \"dtype\"");
  if (!JSON_NODE_HOLDS_VALUE(node) || json_node_get_value_type(node) != G_TYPE_STRING) {
    g_autofree char *desc = describe_node(node);
    return bad_input(error, file, name, "\"dtype\" is %s, not a string", desc);
  }
  const char *spelling = json_node_get_string(node);
  if (!wsync_dtype_from_name(spelling, dtype)) {
    g_autofree char *p = wsync_json_printable(spelling);
    return bad_input(error, file, name, "unknown dtype \"%s\"", p);
  }
  return TRUE;
}

/* numel and nbytes of a shape, with the reference's overflow and sub-byte rules. */
static gboolean
check_size(Entry *e, const char *file, GError **error)
{
  WsyncTensor *t = &e->t;
  g_autofree char *shape = format_shape(t->shape, t->ndim);
  t->numel = 1;
  for (guint i = 0; i < t->ndim; i++)
    if (!g_uint64_checked_mul(&t->numel, t->numel, t->shape[i]))
      return bad_input(error, file, t->name, "the element count of shape %s overflows 64 bits",
                       shape);
  guint bits = wsync_dtype_bits(t->dtype);
  const char *dtype = wsync_dtype_name(t->dtype);
  guint64 total_bits;
  if (!g_uint64_checked_mul(&total_bits, t->numel, bits))
    return bad_input(error, file, t->name,
                     "shape %s of %s has %" G_GUINT64_FORMAT
                     " elements, too many bits for 64-bit arithmetic",
                     shape, dtype, t->numel);
  if (!wsync_dtype_nbytes(t->dtype, t->numel, &t->nbytes))
    return bad_input(error, file, t->name,
                     "shape %s of %s is %" G_GUINT64_FORMAT " bits, not a whole number of bytes",
                     shape, dtype, total_bits);
  if (e->end < e->begin)
    return bad_input(error, file, t->name,
                     "data_offsets [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                     "] end before they begin",
                     e->begin, e->end);
  if (e->end - e->begin != t->nbytes)
    return bad_input(error, file, t->name,
                     "shape %s of %s needs %" G_GUINT64_FORMAT
                     " bytes but data_offsets [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                     "] give %" G_GUINT64_FORMAT,
                     shape, dtype, t->nbytes, e->begin, e->end, e->end - e->begin);
  return TRUE;
}

static gboolean
parse_entry(const char *name, JsonNode *node, Entry *e, const char *file, GError **error)
{
  if (!JSON_NODE_HOLDS_OBJECT(node)) {
    g_autofree char *desc = describe_node(node);
    return bad_input(error, file, name, "entry is %s, not an object", desc);
  }
  JsonObject *obj = json_node_get_object(node);

  /* The schema says additionalProperties: false; a key we do not know could be a
   * field some other reader honours (strides, a byte order), so refuse it. */
  JsonObjectIter iter;
  const char *key;
  json_object_iter_init_ordered(&iter, obj);
  while (json_object_iter_next_ordered(&iter, &key, NULL)) {
    if (strcmp(key, "dtype") != 0 && strcmp(key, "shape") != 0 &&
        strcmp(key, "data_offsets") != 0) {
      g_autofree char *p = wsync_json_printable(key);
      return bad_input(error, file, name,
                       "unexpected key \"%s\" (an entry has only dtype, shape and data_offsets)",
                       p);
    }
  }

  e->t.name = g_strdup(name);
  guint64 offsets[2];
  guint n_offsets;
  if (!parse_dtype(obj, &e->t.dtype, file, name, error) ||
      !parse_uint_array(obj, "shape", WSYNC_MAX_DIMS, e->t.shape, &e->t.ndim, file, name, error) ||
      !parse_uint_array(obj, "data_offsets", 2, offsets, &n_offsets, file, name, error))
    return FALSE;
  if (n_offsets != 2)
    return bad_input(error, file, name, "\"data_offsets\" has %u elements, not 2", n_offsets);
  e->begin = offsets[0];
  e->end = offsets[1];
  return check_size(e, file, error);
}

static gboolean
parse_metadata(JsonNode *node, GHashTable *metadata, const char *file, GError **error)
{
  if (!JSON_NODE_HOLDS_OBJECT(node)) {
    g_autofree char *desc = describe_node(node);
    return bad_input(error, file, NULL, "__metadata__ is %s, not an object", desc);
  }
  JsonObjectIter iter;
  const char *key;
  JsonNode *value;
  json_object_iter_init_ordered(&iter, json_node_get_object(node));
  while (json_object_iter_next_ordered(&iter, &key, &value)) {
    if (!JSON_NODE_HOLDS_VALUE(value) || json_node_get_value_type(value) != G_TYPE_STRING) {
      g_autofree char *p = wsync_json_printable(key);
      g_autofree char *desc = describe_node(value);
      return bad_input(error, file, NULL, "__metadata__ value of \"%s\" is %s, not a string", p,
                       desc);
    }
    g_hash_table_insert(metadata, g_strdup(key), g_strdup(json_node_get_string(value)));
  }
  return TRUE;
}

static int
compare_entries(const void *a, const void *b)
{
  const Entry *x = a, *y = b;
  if (x->begin != y->begin)
    return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end)
    return x->end < y->end ? -1 : 1;
  return strcmp(x->t.name, y->t.name);
}

/* Sorted by offset, the tensors must tile [0, last end) exactly: every byte has one
 * owner, so no two names share bytes and nothing hides between them. */
static gboolean
check_layout(const WsyncSafetensors *st, gsize len, GError **error)
{
  const char *file = st->path;
  guint64 expected = 0;
  for (guint i = 0; i < st->n_entries; i++) {
    const Entry *e = &st->entries[i], *prev = i ? &st->entries[i - 1] : NULL;
    if (e->begin == expected) {
      expected = e->end;
      continue;
    }
    if (prev == NULL)
      return bad_input(error, file, e->t.name,
                       "data starts at byte %" G_GUINT64_FORMAT
                       " but the first tensor's data must start at 0",
                       e->begin);
    g_autofree char *pname = wsync_json_printable(prev->t.name);
    if (e->begin > expected)
      return bad_input(error, file, e->t.name,
                       "data_offsets [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                       "] leave a gap of %" G_GUINT64_FORMAT
                       " bytes after tensor \"%s\" [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT "]",
                       e->begin, e->end, e->begin - expected, pname, prev->begin, prev->end);
    return bad_input(error, file, e->t.name,
                     "data_offsets [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                     "] overlap tensor \"%s\" [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT "]",
                     e->begin, e->end, pname, prev->begin, prev->end);
  }

  /* The anti-polyglot rule: the file is exactly header + data. */
  guint64 have = len - st->header_size;
  if (expected < have)
    return bad_input(error, file, NULL,
                     "%" G_GUINT64_FORMAT
                     " trailing bytes: the data ends at byte %" G_GUINT64_FORMAT
                     " but the file has %" G_GSIZE_FORMAT " bytes",
                     have - expected, st->header_size + expected, len);
  if (expected > have) {
    const Entry *last = &st->entries[st->n_entries - 1];
    return bad_input(error, file, last->t.name,
                     "data is short: it ends at byte %" G_GUINT64_FORMAT
                     " of the data (header %" G_GUINT64_FORMAT
                     " bytes) but the file has only %" G_GSIZE_FORMAT " bytes, %" G_GUINT64_FORMAT
                     " missing",
                     expected, st->header_size, len, expected - have);
  }
  return TRUE;
}

/* Reads the 8-byte length and checks that the header fits the file. */
static gboolean
check_header_length(const guint8 *data, gsize len, const char *file, guint64 *n_out, GError **error)
{
  if (len < 8)
    return bad_input(error, file, NULL,
                     "file is %" G_GSIZE_FORMAT " bytes, too short for the 8-byte header length",
                     len);
  guint64 n = 0;
  for (int i = 7; i >= 0; i--)
    n = (n << 8) | data[i];
  if (n > WSYNC_SAFETENSORS_MAX_HEADER)
    return bad_input(error, file, NULL,
                     "header length %" G_GUINT64_FORMAT " is larger than the limit of %u bytes", n,
                     WSYNC_SAFETENSORS_MAX_HEADER);
  if (n > len - 8)
    return bad_input(error, file, NULL,
                     "header length %" G_GUINT64_FORMAT
                     " goes beyond the end of the file (%" G_GSIZE_FORMAT " bytes)",
                     n, len);
  *n_out = n;
  return TRUE;
}

/* Fills @st from the header.  Tensor entries get their data pointers later. */
static gboolean
parse_header(WsyncSafetensors *st, const char *text, gsize n, GError **error)
{
  const char *file = st->path;
  g_autoptr(JsonParser) parser = json_parser_new();
  JsonObject *root = load_json_object(parser, text, n, file, "header", error);
  if (root == NULL)
    return FALSE;

  guint size = json_object_get_size(root);
  st->entries = g_new0(Entry, size);
  JsonObjectIter iter;
  const char *name;
  JsonNode *node;
  json_object_iter_init_ordered(&iter, root);
  while (json_object_iter_next_ordered(&iter, &name, &node)) {
    if (strcmp(name, "__metadata__") == 0) {
      if (!parse_metadata(node, st->metadata, file, error))
        return FALSE;
      continue;
    }
    /* Counted before parsing so that free() sees the name even on failure. */
    Entry *e = &st->entries[st->n_entries++];
    if (!parse_entry(name, node, e, file, error))
      return FALSE;
  }
  return TRUE;
}

static WsyncSafetensors *
safetensors_new(const char *path)
{
  WsyncSafetensors *st = g_new0(WsyncSafetensors, 1);
  st->path = g_strdup(path);
  st->by_name = g_hash_table_new(g_str_hash, g_str_equal);
  st->metadata = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
  return st;
}

/* Validates @data into @st (whose path is set). */
static gboolean
safetensors_load(WsyncSafetensors *st, const guint8 *data, gsize len, GError **error)
{
  guint64 n = 0;
  if (!check_header_length(data, len, st->path, &n, error))
    return FALSE;
  st->header_size = 8 + n;
  if (!parse_header(st, (const char *)data + 8, n, error))
    return FALSE;
  if (st->n_entries > 1)
    qsort(st->entries, st->n_entries, sizeof(Entry), compare_entries);
  if (!check_layout(st, len, error))
    return FALSE;
  for (guint i = 0; i < st->n_entries; i++) {
    Entry *e = &st->entries[i];
    e->t.data = data + st->header_size + e->begin;
    e->t.file = st->path;
    g_hash_table_insert(st->by_name, (char *)e->t.name, e);
  }
  return TRUE;
}

WsyncSafetensors *
wsync_safetensors_parse(const guint8 *data, gsize len, const char *display_name, GError **error)
{
  g_return_val_if_fail(data != NULL || len == 0, NULL);
  g_return_val_if_fail(display_name != NULL, NULL);
  g_return_val_if_fail(error == NULL || *error == NULL, NULL);

  g_autoptr(WsyncSafetensors) st = safetensors_new(display_name);
  if (!safetensors_load(st, data, len, error))
    return NULL;
  return g_steal_pointer(&st);
}

WsyncSafetensors *
wsync_safetensors_open(const char *path, GError **error)
{
  g_return_val_if_fail(path != NULL, NULL);
  g_return_val_if_fail(error == NULL || *error == NULL, NULL);

  /* judged before it is opened, and what is opened is what was judged (core/filekind.h):
   * a FIFO, a device and a socket are refused without being opened, in this reader's
   * words for all three (python/load.c, which reads rank files, says the same) */
  struct stat sb;
  const char *special;
  int fd = wsync_file_open_input(path, &sb, &special);
  if (fd < 0 && special != NULL) {
    bad_input(error, path, NULL, "not a regular file");
    return NULL;
  }
  if (fd < 0) {
    wsync_set_io_error(error, errno, path, "open");
    return NULL;
  }
  if (S_ISDIR(sb.st_mode)) { /* named by an index, say: bad input, like a FIFO */
    bad_input(error, path, NULL, "is a directory, not a safetensors file");
    close(fd);
    return NULL;
  }
  if (!S_ISREG(sb.st_mode)) {
    bad_input(error, path, NULL, "not a regular file");
    close(fd);
    return NULL;
  }
  if ((guint64)sb.st_size > G_MAXSIZE) {
    wsync_set_io_error(error, EFBIG, path, "map");
    close(fd);
    return NULL;
  }

  g_autoptr(WsyncSafetensors) st = safetensors_new(path);
  /* A 0-byte file cannot be mapped; it is simply too short, which the checks say. */
  if (sb.st_size > 0) {
    void *map = mmap(NULL, (gsize)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      wsync_set_io_error(error, errno, path, "map");
      close(fd);
      return NULL;
    }
    st->map = map;
    st->map_len = (gsize)sb.st_size;
  }
  /* the mapping keeps the file; the descriptor is kept for copy_file_range(2) */
  int flags = fcntl(fd, F_GETFL);
  if (st->map != NULL && flags >= 0 && fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == 0 &&
      keep_descriptor(st->map, st->map_len, fd))
    st->kept = TRUE;
  else
    close(fd);

  static const guint8 empty[1];
  const guint8 *data = st->map ? st->map : empty;
  if (!safetensors_load(st, data, st->map_len, error))
    return NULL;
  return g_steal_pointer(&st);
}

const char *
wsync_safetensors_path(const WsyncSafetensors *st)
{
  g_return_val_if_fail(st != NULL, NULL);
  return st->path;
}

guint
wsync_safetensors_n_tensors(const WsyncSafetensors *st)
{
  g_return_val_if_fail(st != NULL, 0);
  return st->n_entries;
}

const WsyncTensor *
wsync_safetensors_tensor(const WsyncSafetensors *st, guint index)
{
  g_return_val_if_fail(st != NULL, NULL);
  g_return_val_if_fail(index < st->n_entries, NULL);
  return &st->entries[index].t;
}

const WsyncTensor *
wsync_safetensors_lookup(const WsyncSafetensors *st, const char *name)
{
  g_return_val_if_fail(st != NULL, NULL);
  g_return_val_if_fail(name != NULL, NULL);
  Entry *e = g_hash_table_lookup(st->by_name, name);
  return e ? &e->t : NULL;
}

GHashTable *
wsync_safetensors_metadata(const WsyncSafetensors *st)
{
  g_return_val_if_fail(st != NULL, NULL);
  return st->metadata;
}

guint64
wsync_safetensors_header_size(const WsyncSafetensors *st)
{
  g_return_val_if_fail(st != NULL, 0);
  return st->header_size;
}

/* ================================================================ writer */

typedef struct {
  char *name;
  WsyncDtype dtype;
  guint ndim;
  guint64 shape[WSYNC_MAX_DIMS];
  guint64 nbytes;
  guint64 offset; /* in the data region; valid once laid out */
} WEntry;

struct _WsyncSafetensorsWriter {
  GPtrArray *entries;  /* WEntry*; in data order once laid out */
  GHashTable *by_name; /* name -> WEntry* */
  GTree *metadata;     /* key -> value, sorted */
  guint64 data_size;
  gboolean laid_out;

  /* From begin() on: */
  char *path;
  int fd;
  guint64 header_size;
  GMutex map_lock; /* guards map */
  guint8 *map;     /* the whole file, mapped on the first data() call */
};

static void
wentry_free(gpointer p)
{
  WEntry *e = p;
  g_free(e->name);
  g_free(e);
}

static int
compare_strings(gconstpointer a, gconstpointer b, gpointer data)
{
  (void)data;
  return strcmp(a, b);
}

WsyncSafetensorsWriter *
wsync_safetensors_writer_new(void)
{
  WsyncSafetensorsWriter *w = g_new0(WsyncSafetensorsWriter, 1);
  w->entries = g_ptr_array_new_with_free_func(wentry_free);
  w->by_name = g_hash_table_new(g_str_hash, g_str_equal);
  w->metadata = g_tree_new_full(compare_strings, NULL, g_free, g_free);
  w->fd = -1;
  g_mutex_init(&w->map_lock);
  return w;
}

void
wsync_safetensors_writer_free(WsyncSafetensorsWriter *w)
{
  if (w == NULL)
    return;
  if (w->map)
    munmap(w->map, w->header_size + w->data_size);
  if (w->fd >= 0)
    close(w->fd);
  g_mutex_clear(&w->map_lock);
  g_hash_table_destroy(w->by_name);
  g_ptr_array_unref(w->entries);
  g_tree_destroy(w->metadata);
  g_free(w->path);
  g_free(w);
}

static gboolean
writer_started(const WsyncSafetensorsWriter *w)
{
  return w->path != NULL;
}

void
wsync_safetensors_writer_set_metadata(WsyncSafetensorsWriter *w, const char *key, const char *value)
{
  g_return_if_fail(w != NULL && !writer_started(w));
  g_return_if_fail(key != NULL && g_utf8_validate(key, -1, NULL));
  g_return_if_fail(value != NULL && g_utf8_validate(value, -1, NULL));
  g_tree_replace(w->metadata, g_strdup(key), g_strdup(value));
}

static gboolean usage_error(GError **error, const char *name, const char *fmt, ...)
    G_GNUC_PRINTF(3, 4);

static gboolean
usage_error(GError **error, const char *name, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  g_autofree char *msg = g_strdup_vprintf(fmt, ap);
  va_end(ap);
  g_autofree char *p = wsync_json_printable(name);
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE, "tensor \"%s\": %s", p, msg);
  return FALSE;
}

gboolean
wsync_safetensors_writer_add(WsyncSafetensorsWriter *w, const char *name, WsyncDtype dtype,
                             guint ndim, const guint64 *shape, GError **error)
{
  g_return_val_if_fail(w != NULL && !writer_started(w), FALSE);
  g_return_val_if_fail(name != NULL, FALSE);
  g_return_val_if_fail((guint)dtype < WSYNC_DTYPE_COUNT, FALSE);
  g_return_val_if_fail(shape != NULL || ndim == 0, FALSE);
  g_return_val_if_fail(error == NULL || *error == NULL, FALSE);

  if (!g_utf8_validate(name, -1, NULL))
    return usage_error(error, name, "the name is not valid UTF-8");
  if (strcmp(name, "__metadata__") == 0)
    return usage_error(error, name, "the name is reserved for the file's metadata");
  if (g_hash_table_contains(w->by_name, name))
    return usage_error(error, name, "declared twice");
  if (ndim > WSYNC_MAX_DIMS)
    return usage_error(error, name, "%u dimensions, more than %d", ndim, WSYNC_MAX_DIMS);

  guint64 numel = 1, nbytes, total;
  for (guint i = 0; i < ndim; i++)
    if (!g_uint64_checked_mul(&numel, numel, shape[i])) {
      g_autofree char *s = format_shape(shape, ndim);
      return usage_error(error, name, "the element count of shape %s overflows 64 bits", s);
    }
  if (!wsync_dtype_nbytes(dtype, numel, &nbytes)) {
    g_autofree char *s = format_shape(shape, ndim);
    return usage_error(error, name,
                       "shape %s of %s does not fill a whole number of bytes or overflows", s,
                       wsync_dtype_name(dtype));
  }
  if (!g_uint64_checked_add(&total, w->data_size, nbytes))
    return usage_error(error, name, "the file's data would exceed 2^64 bytes");

  WEntry *e = g_new0(WEntry, 1);
  e->name = g_strdup(name);
  e->dtype = dtype;
  e->ndim = ndim;
  if (ndim)
    memcpy(e->shape, shape, ndim * sizeof *shape);
  e->nbytes = nbytes;
  g_ptr_array_add(w->entries, e);
  g_hash_table_insert(w->by_name, e->name, e);
  w->data_size = total;
  w->laid_out = FALSE;
  return TRUE;
}

/* The reference order: dtype descending (largest alignment first), then name. */
static int
compare_wentries(gconstpointer a, gconstpointer b)
{
  const WEntry *x = *(WEntry *const *)a, *y = *(WEntry *const *)b;
  if (x->dtype != y->dtype)
    return x->dtype > y->dtype ? -1 : 1;
  return strcmp(x->name, y->name);
}

static void
writer_layout(WsyncSafetensorsWriter *w)
{
  if (w->laid_out)
    return;
  g_ptr_array_sort(w->entries, compare_wentries);
  guint64 offset = 0;
  for (guint i = 0; i < w->entries->len; i++) {
    WEntry *e = g_ptr_array_index(w->entries, i);
    e->offset = offset;
    offset += e->nbytes;
  }
  w->laid_out = TRUE;
}

static gboolean
append_metadata_entry(gpointer key, gpointer value, gpointer data)
{
  GString *out = data;
  if (out->str[out->len - 1] != '{')
    g_string_append_c(out, ',');
  wsync_json_append_string(out, WSYNC_JSON_UTF8, key);
  g_string_append_c(out, ':');
  wsync_json_append_string(out, WSYNC_JSON_UTF8, value);
  return FALSE; /* keep going */
}

static void
append_tensor_entry(GString *out, const WEntry *e)
{
  wsync_json_append_string(out, WSYNC_JSON_UTF8, e->name);
  g_string_append(out, ":{\"dtype\":");
  wsync_json_append_string(out, WSYNC_JSON_UTF8, wsync_dtype_name(e->dtype));
  g_string_append(out, ",\"shape\":[");
  for (guint i = 0; i < e->ndim; i++)
    g_string_append_printf(out, "%s%" G_GUINT64_FORMAT, i ? "," : "", e->shape[i]);
  g_string_append_printf(out, "],\"data_offsets\":[%" G_GUINT64_FORMAT ",%" G_GUINT64_FORMAT "]}",
                         e->offset, e->offset + e->nbytes);
}

guint8 *
wsync_safetensors_writer_header(WsyncSafetensorsWriter *w, gsize *len)
{
  g_return_val_if_fail(w != NULL, NULL);
  g_return_val_if_fail(len != NULL, NULL);
  writer_layout(w);

  GString *out = g_string_new(NULL);
  g_string_append_len(out, "\0\0\0\0\0\0\0\0", 8); /* the length, filled in below */
  g_string_append_c(out, '{');
  if (g_tree_nnodes(w->metadata) > 0) {
    g_string_append(out, "\"__metadata__\":{");
    g_tree_foreach(w->metadata, append_metadata_entry, out);
    g_string_append_c(out, '}');
  }
  for (guint i = 0; i < w->entries->len; i++) {
    if (out->len > 9)
      g_string_append_c(out, ',');
    append_tensor_entry(out, g_ptr_array_index(w->entries, i));
  }
  g_string_append_c(out, '}');
  /* As the reference does: spaces until the data starts at a multiple of 8. */
  while (out->len % 8 != 0)
    g_string_append_c(out, ' ');

  guint64 n = out->len - 8;
  for (int i = 0; i < 8; i++)
    out->str[i] = (char)((n >> (8 * i)) & 0xff);
  *len = out->len;
  return (guint8 *)g_string_free(out, FALSE);
}

/* pwrite(2) until all of @buf is written. */
static gboolean
pwrite_all(int fd, const void *buf, gsize len, guint64 pos, const char *path, GError **error)
{
  const guint8 *p = buf;
  while (len > 0) {
    ssize_t k = pwrite(fd, p, len, (off_t)pos);
    if (k < 0) {
      if (errno == EINTR)
        continue;
      wsync_set_io_error(error, errno, path, "write");
      return FALSE;
    }
    if (k == 0) {
      wsync_set_io_error(error, ENOSPC, path, "write");
      return FALSE;
    }
    p += k;
    len -= (gsize)k;
    pos += (guint64)k;
  }
  return TRUE;
}

gboolean
wsync_safetensors_writer_begin(WsyncSafetensorsWriter *w, const char *path, GError **error)
{
  g_return_val_if_fail(w != NULL && !writer_started(w), FALSE);
  g_return_val_if_fail(path != NULL, FALSE);
  g_return_val_if_fail(error == NULL || *error == NULL, FALSE);

  gsize header_len;
  g_autofree guint8 *header = wsync_safetensors_writer_header(w, &header_len);
  w->header_size = header_len;
  w->path = g_strdup(path);

  /* O_RDWR, not O_WRONLY: a shared writable mapping needs read access too. */
  w->fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd < 0) {
    wsync_set_io_error(error, errno, path, "create");
    return FALSE;
  }
  if (!pwrite_all(w->fd, header, header_len, 0, path, error))
    return FALSE;
  guint64 size = w->header_size + w->data_size;
  if (size > (guint64)G_MAXINT64 || ftruncate(w->fd, (off_t)size) != 0) {
    wsync_set_io_error(error, size > (guint64)G_MAXINT64 ? EFBIG : errno, path, "resize");
    return FALSE;
  }
  /* The file is sparse until its data is written: pwrite() reports a full disk as
   * ENOSPC; the map of wsync_safetensors_writer_data() reserves the blocks first. */
  return TRUE;
}

int
safetensors_writer_fd(WsyncSafetensorsWriter *w)
{
  return w->fd;
}

gboolean
safetensors_writer_file_offset(WsyncSafetensorsWriter *w, const char *name, guint64 *offset)
{
  WEntry *e = g_hash_table_lookup(w->by_name, name);

  if (e == NULL || !writer_started(w))
    return FALSE;
  *offset = w->header_size + e->offset;
  return TRUE;
}

/* The declared tensor @name of a writer that has begun, or NULL with an error. */
static WEntry *
writer_entry(WsyncSafetensorsWriter *w, const char *name, GError **error)
{
  WEntry *e = g_hash_table_lookup(w->by_name, name);
  if (e == NULL) {
    g_autofree char *p = wsync_json_printable(name);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE, "%s: tensor \"%s\" was not declared",
                w->path, p);
  }
  return e;
}

guint8 *
wsync_safetensors_writer_data(WsyncSafetensorsWriter *w, const char *name, GError **error)
{
  g_return_val_if_fail(w != NULL && w->fd >= 0, NULL);
  g_return_val_if_fail(name != NULL, NULL);
  g_return_val_if_fail(error == NULL || *error == NULL, NULL);

  WEntry *e = writer_entry(w, name, error);
  if (e == NULL)
    return NULL;
  /* Nothing to map for an empty tensor (and a file of no data cannot be mapped
   * usefully); any non-NULL pointer does for zero bytes. */
  static guint8 no_bytes[1];
  if (e->nbytes == 0)
    return no_bytes;

  g_mutex_lock(&w->map_lock);
  if (w->map == NULL) {
    /* Reserve the blocks first: writing through a map into a sparse file on a full disk
     * would kill the process with SIGBUS instead of failing with ENOSPC here.  File
     * systems that cannot preallocate (EOPNOTSUPP) keep the sparse file. */
    guint64 size = w->header_size + w->data_size;
    int rc = posix_fallocate(w->fd, 0, (off_t)size);
    if (rc != 0 && rc != EOPNOTSUPP && rc != EINVAL)
      wsync_set_io_error(error, rc, w->path, "reserve space for");
    else {
      void *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, w->fd, 0);
      if (map == MAP_FAILED)
        wsync_set_io_error(error, errno, w->path, "map");
      else
        w->map = map;
    }
  }
  guint8 *map = w->map;
  g_mutex_unlock(&w->map_lock);
  return map ? map + w->header_size + e->offset : NULL;
}

gboolean
wsync_safetensors_writer_pwrite(WsyncSafetensorsWriter *w, const char *name, guint64 offset,
                                const void *buf, gsize len, GError **error)
{
  g_return_val_if_fail(w != NULL && w->fd >= 0, FALSE);
  g_return_val_if_fail(name != NULL, FALSE);
  g_return_val_if_fail(buf != NULL || len == 0, FALSE);
  g_return_val_if_fail(error == NULL || *error == NULL, FALSE);

  WEntry *e = writer_entry(w, name, error);
  if (e == NULL)
    return FALSE;
  if (offset > e->nbytes || len > e->nbytes - offset) {
    g_autofree char *p = wsync_json_printable(name);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                "%s: tensor \"%s\": writing %" G_GSIZE_FORMAT " bytes at offset %" G_GUINT64_FORMAT
                " passes its end (%" G_GUINT64_FORMAT " bytes)",
                w->path, p, len, offset, e->nbytes);
    return FALSE;
  }
  return pwrite_all(w->fd, buf, len, w->header_size + e->offset + offset, w->path, error);
}

guint64
wsync_safetensors_writer_tensor_nbytes(WsyncSafetensorsWriter *w, const char *name)
{
  g_return_val_if_fail(w != NULL && name != NULL, 0);
  WEntry *e = g_hash_table_lookup(w->by_name, name);
  return e ? e->nbytes : 0;
}

guint64
wsync_safetensors_writer_tensor_offset(WsyncSafetensorsWriter *w, const char *name)
{
  g_return_val_if_fail(w != NULL && name != NULL, 0);
  WEntry *e = g_hash_table_lookup(w->by_name, name);
  if (e == NULL)
    return 0;
  writer_layout(w);
  return e->offset;
}

guint64
wsync_safetensors_writer_data_size(WsyncSafetensorsWriter *w)
{
  g_return_val_if_fail(w != NULL, 0);
  return w->data_size;
}

gboolean
wsync_safetensors_writer_finish(WsyncSafetensorsWriter *w, GError **error)
{
  g_return_val_if_fail(w != NULL && w->fd >= 0, FALSE);
  g_return_val_if_fail(error == NULL || *error == NULL, FALSE);

  gboolean ok = TRUE;
  /* munmap keeps the dirty pages in the page cache; fsync then writes them. */
  if (w->map) {
    if (munmap(w->map, w->header_size + w->data_size) != 0) {
      wsync_set_io_error(error, errno, w->path, "unmap");
      ok = FALSE;
    }
    w->map = NULL;
  }
  if (ok && fsync(w->fd) != 0) {
    wsync_set_io_error(error, errno, w->path, "sync");
    ok = FALSE;
  }
  /* close() can report a delayed write error (NFS); it closes the descriptor anyway. */
  if (close(w->fd) != 0 && ok) {
    wsync_set_io_error(error, errno, w->path, "close");
    ok = FALSE;
  }
  w->fd = -1;
  return ok;
}
