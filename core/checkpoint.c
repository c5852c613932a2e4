/* wsync: a checkpoint (a file, or a directory with or without an index) as one set of
 * tensors, and the index writer. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-glib/json-glib.h>

#include <wsync/checkpoint.h>
#include <wsync/error.h>

#include "dcp.h"
#include "files.h"
#include "json-check.h"

struct _WsyncCheckpoint {
  char *path;
  gboolean is_dir;
  GPtrArray *files;    /* WsyncSafetensors*, owned, sorted by path */
  GPtrArray *tensors;  /* const WsyncTensor*, sorted by name */
  GHashTable *by_name; /* name -> const WsyncTensor* */
  guint64 total_bytes;
  WsyncFileGroupFunc group; /* nullable: which files may repeat names */
  gpointer group_data;
};

/* ================================================================ messages */

#define bad_input wsync_json_bad_input

static const char *
node_kind(JsonNode *node)
{
  switch (JSON_NODE_TYPE(node)) {
  case JSON_NODE_OBJECT:
    return "an object";
  case JSON_NODE_ARRAY:
    return "an array";
  case JSON_NODE_NULL:
    return "null";
  case JSON_NODE_VALUE:
    break;
  }
  GType type = json_node_get_value_type(node);
  if (type == G_TYPE_STRING)
    return "a string";
  if (type == G_TYPE_BOOLEAN)
    return "a boolean";
  return "a number";
}

/* ================================================================ reading the index */

static JsonObject *
load_index_json(JsonParser *parser, const char *text, gsize len, const char *file, GError **error)
{
  if (!wsync_json_parse(parser, text, len, file, NULL, error))
    return NULL;
  JsonNode *root = json_parser_get_root(parser);
  if (root == NULL || !JSON_NODE_HOLDS_OBJECT(root)) {
    bad_input(error, file, "the top level is %s, not an object", root ? node_kind(root) : "empty");
    return NULL;
  }
  return json_node_get_object(root);
}

/* metadata.total_size, when there is one, must be a non-negative integer.  Python
 * writes an int; a float with an integral value is taken too (some conversion scripts
 * write one).  Its value is not compared with the tensors' sizes: published
 * checkpoints sometimes carry a slightly different number, and Transformers, which
 * never reads it, loads them. */
static gboolean
check_total_size(JsonObject *root, const char *file, GError **error)
{
  JsonNode *meta = json_object_get_member(root, "metadata");
  if (meta == NULL || JSON_NODE_HOLDS_NULL(meta))
    return TRUE;
  if (!JSON_NODE_HOLDS_OBJECT(meta))
    return bad_input(error, file, "\"metadata\" is %s, not an object", node_kind(meta));
  JsonNode *node = json_object_get_member(json_node_get_object(meta), "total_size");
  if (node == NULL)
    return TRUE;
  GType type = JSON_NODE_HOLDS_VALUE(node) ? json_node_get_value_type(node) : G_TYPE_INVALID;
  if (type == G_TYPE_INT64 && json_node_get_int(node) >= 0)
    return TRUE;
  if (type == G_TYPE_DOUBLE && json_node_get_double(node) >= 0 &&
      json_node_get_double(node) <= 9007199254740992.0 &&
      json_node_get_double(node) == (double)(guint64)json_node_get_double(node))
    return TRUE;
  return bad_input(error, file, "metadata.total_size is %s, not a non-negative integer",
                   node_kind(node));
}

/* ================================================================ shards */

typedef struct {
  WsyncCheckpoint *ck;
  const char *dir;
  char *real_dir;      /* realpath of dir */
  const char *index;   /* the index path, for messages */
  GHashTable *by_name; /* shard name as written -> WsyncSafetensors* */
  GHashTable *by_real; /* realpath -> WsyncSafetensors* */
} Shards;

static gboolean
shard_name_escapes(const char *name)
{
  if (g_path_is_absolute(name))
    return TRUE;
  g_auto(GStrv) parts = g_strsplit(name, "/", -1);
  for (char **p = parts; *p; p++)
    if (strcmp(*p, "..") == 0)
      return TRUE;
  return FALSE;
}

/* Opens the shard @name (once, however many tensors name it) and checks that it stays
 * inside the directory, also through symlinks. */
static WsyncSafetensors *
shard_open(Shards *sh, const char *name, const char *tensor, GError **error)
{
  WsyncSafetensors *st = g_hash_table_lookup(sh->by_name, name);
  if (st)
    return st;

  g_autofree char *pname = wsync_json_printable(name);
  g_autofree char *ptensor = wsync_json_printable(tensor);
  if (*name == '\0') {
    bad_input(error, sh->index, "tensor \"%s\" has an empty shard name", ptensor);
    return NULL;
  }
  if (shard_name_escapes(name)) {
    bad_input(error, sh->index, "shard \"%s\" of tensor \"%s\" leaves the checkpoint directory",
              pname, ptensor);
    return NULL;
  }
  g_autofree char *path = g_build_filename(sh->dir, name, NULL);
  g_autofree char *real = realpath(path, NULL);
  if (real == NULL) {
    /* what the name itself makes impossible is bad input; only the system failing
     * (EACCES, EIO, ENOMEM) is an I/O error */
    if (errno == ENOENT || errno == ENOTDIR)
      bad_input(error, sh->index, "shard \"%s\" (named for tensor \"%s\") is missing", pname,
                ptensor);
    else if (errno == ENAMETOOLONG || errno == ELOOP)
      bad_input(error, sh->index, "shard \"%s\" (named for tensor \"%s\") cannot be a file: %s",
                pname, ptensor, g_strerror(errno));
    else
      wsync_set_io_error(error, errno, path, "resolve");
    return NULL;
  }
  gsize n = strlen(sh->real_dir);
  /* realpath("/") is "/", the one directory whose name already ends in a slash. */
  gboolean inside = strncmp(real, sh->real_dir, n) == 0 &&
                    (real[n] == '/' || (n > 0 && sh->real_dir[n - 1] == '/'));
  if (!inside) {
    bad_input(error, sh->index, "shard \"%s\" of tensor \"%s\" leaves the checkpoint directory",
              pname, ptensor);
    return NULL;
  }

  /* Two spellings of one file ("a", "./a") are still one file. */
  st = g_hash_table_lookup(sh->by_real, real);
  if (st == NULL) {
    st = wsync_safetensors_open(path, error);
    if (st == NULL)
      return NULL;
    g_ptr_array_add(sh->ck->files, st);
    g_hash_table_insert(sh->by_real, g_steal_pointer(&real), st);
  }
  g_hash_table_insert(sh->by_name, g_strdup(name), st);
  return st;
}

/* What the index says, kept once the JSON is gone: the JSON tree of a large index takes
 * several times the size of its text, and keeping it while every shard's header is
 * read made that the peak of memory (issue 14). */
typedef struct {
  const char *tensor;    /* in IndexMap.strings */
  const char *shard;     /* as written, interned in IndexMap.strings */
  WsyncSafetensors *st;  /* set once the shard is open */
} IndexEntry;

typedef struct {
  GStringChunk *strings;
  GArray *entries;     /* IndexEntry, in the index's order until sorted by tensor */
  char *bad_tensor;    /* nullable: the first tensor whose shard is not a string, */
  const char *bad_kind; /* and what it is instead */
} IndexMap;

static void
index_map_clear(IndexMap *map)
{
  if (map->strings)
    g_string_chunk_free(map->strings);
  if (map->entries)
    g_array_unref(map->entries);
  g_free(map->bad_tensor);
}

/* Copies the weight map, in its order, up to the first shard that is not a string
 * (reported only after the entries before it, as when the JSON was walked). */
static void
index_map_fill(IndexMap *map, JsonObject *weight_map)
{
  guint n = json_object_get_size(weight_map);
  map->strings = g_string_chunk_new(4096);
  map->entries = g_array_sized_new(FALSE, FALSE, sizeof(IndexEntry), n);
  JsonObjectIter iter;
  const char *tensor;
  JsonNode *node;
  json_object_iter_init_ordered(&iter, weight_map);
  while (json_object_iter_next_ordered(&iter, &tensor, &node)) {
    if (!JSON_NODE_HOLDS_VALUE(node) || json_node_get_value_type(node) != G_TYPE_STRING) {
      map->bad_tensor = g_strdup(tensor);
      map->bad_kind = node_kind(node);
      return;
    }
    IndexEntry e = {
        .tensor = g_string_chunk_insert(map->strings, tensor),
        .shard = g_string_chunk_insert_const(map->strings, json_node_get_string(node)),
    };
    g_array_append_val(map->entries, e);
  }
}

static int
compare_entries(const void *a, const void *b)
{
  return strcmp(((const IndexEntry *)a)->tensor, ((const IndexEntry *)b)->tensor);
}

/* Every tensor of every shard must be named in the index, for that shard.  @map is
 * sorted by tensor name. */
static gboolean
check_shards_named(WsyncCheckpoint *ck, const IndexMap *map, const char *index, GError **error)
{
  for (guint f = 0; f < ck->files->len; f++) {
    const WsyncSafetensors *st = g_ptr_array_index(ck->files, f);
    for (guint i = 0; i < wsync_safetensors_n_tensors(st); i++) {
      const char *name = wsync_safetensors_tensor(st, i)->name;
      g_autofree char *pname = wsync_json_printable(name);
      IndexEntry key = {.tensor = name};
      const IndexEntry *e = map->entries->len == 0
                                ? NULL
                                : bsearch(&key, map->entries->data, map->entries->len,
                                          sizeof(IndexEntry), compare_entries);
      if (e == NULL)
        return bad_input(error, wsync_safetensors_path(st), "tensor \"%s\" is not named in %s",
                         pname, index);
      if (e->st != st) {
        g_autofree char *pother = wsync_json_printable(e->shard);
        return bad_input(error, wsync_safetensors_path(st),
                         "tensor \"%s\" is named for shard \"%s\" in %s", pname, pother, index);
      }
    }
  }
  return TRUE;
}

/* Opens the shards @map names and checks that each holds the tensors named for it. */
static gboolean
open_named_shards(Shards *sh, IndexMap *map, GError **error)
{
  for (guint i = 0; i < map->entries->len; i++) {
    IndexEntry *e = &g_array_index(map->entries, IndexEntry, i);
    WsyncSafetensors *st = shard_open(sh, e->shard, e->tensor, error);
    if (st == NULL)
      return FALSE;
    if (wsync_safetensors_lookup(st, e->tensor) == NULL) {
      g_autofree char *ptensor = wsync_json_printable(e->tensor);
      g_autofree char *pshard = wsync_json_printable(e->shard);
      return bad_input(error, sh->index, "tensor \"%s\" is not in its shard \"%s\" (%s)", ptensor,
                       pshard, wsync_safetensors_path(st));
    }
    e->st = st;
  }
  if (map->bad_tensor) {
    g_autofree char *ptensor = wsync_json_printable(map->bad_tensor);
    return bad_input(error, sh->index, "the shard of tensor \"%s\" is %s, not a string", ptensor,
                     map->bad_kind);
  }
  return TRUE;
}

/* Reads the index into @map; the JSON text and tree are freed on return. */
static gboolean
read_index(const char *index, IndexMap *map, GError **error)
{
  g_autofree char *text = NULL;
  gsize len;
  /* a regular file of bounded size: a FIFO or /dev/zero in its place is refused by
   * fstat() of what was opened, and a socket, which cannot even be opened, in the same
   * words (wsync_file_open_regular()) */
  if (!wsync_file_read_regular(index, WSYNC_INDEX_JSON_MAX, WSYNC_INDEX_NAME,
                               WSYNC_ERROR_BAD_INPUT, &text, &len, error))
    return FALSE;
  g_autoptr(JsonParser) parser = json_parser_new();
  JsonObject *root = load_index_json(parser, text, len, index, error);
  if (root == NULL)
    return FALSE;
  g_clear_pointer(&text, g_free);

  JsonNode *wm = json_object_get_member(root, "weight_map");
  if (wm == NULL)
    return bad_input(error, index, "no \"weight_map\"");
  if (!JSON_NODE_HOLDS_OBJECT(wm))
    return bad_input(error, index, "\"weight_map\" is %s, not an object", node_kind(wm));
  if (!check_total_size(root, index, error))
    return FALSE;
  index_map_fill(map, json_node_get_object(wm));
  return TRUE;
}

static gboolean
open_indexed(WsyncCheckpoint *ck, const char *dir, const char *index, GError **error)
{
  IndexMap map = {0};
  if (!read_index(index, &map, error)) {
    index_map_clear(&map);
    return FALSE;
  }

  g_autofree char *real_dir = realpath(dir, NULL);
  if (real_dir == NULL) {
    wsync_set_io_error(error, errno, dir, "resolve");
    index_map_clear(&map);
    return FALSE;
  }
  Shards sh = {
      .ck = ck,
      .dir = dir,
      .real_dir = real_dir,
      .index = index,
      .by_name = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL),
      .by_real = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL),
  };
  gboolean ok = open_named_shards(&sh, &map, error);
  g_hash_table_destroy(sh.by_name);
  g_hash_table_destroy(sh.by_real);
  if (ok) {
    g_array_sort(map.entries, compare_entries);
    ok = check_shards_named(ck, &map, index, error);
  }
  index_map_clear(&map);
  return ok;
}

/* ================================================================ directory without index */

static int
compare_cstrings(const void *a, const void *b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every *.safetensors of @dir, as a shell glob sees them: sorted, without dotfiles. */
static gboolean
open_plain_dir(WsyncCheckpoint *ck, const char *dir, GError **error)
{
  DIR *d = opendir(dir);
  if (d == NULL) {
    wsync_set_io_error(error, errno, dir, "open");
    return FALSE;
  }
  g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
  struct dirent *ent;
  errno = 0;
  while ((ent = readdir(d)) != NULL) {
    if (ent->d_name[0] != '.' && g_str_has_suffix(ent->d_name, ".safetensors"))
      g_ptr_array_add(names, g_strdup(ent->d_name));
    errno = 0;
  }
  int errsv = errno;
  closedir(d);
  if (errsv != 0) {
    wsync_set_io_error(error, errsv, dir, "read");
    return FALSE;
  }
  if (names->len == 0) {
    /* A directory of a trainer's checkpoints (a step directory, per-rank torch.save
     * archives) is what users most often pass here by mistake: say what it holds, as
     * `wsync merge` does. */
    g_autofree char *pdir = wsync_json_printable(dir);
    g_autofree char *hint = wsync_dcp_below_hint(dir);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT, "no safetensors files in %s%s%s",
                pdir, hint[0] != '\0' ? " and it is not a sharded checkpoint" : "", hint);
    return FALSE;
  }
  g_ptr_array_sort(names, compare_cstrings);
  for (guint i = 0; i < names->len; i++) {
    g_autofree char *path = g_build_filename(dir, g_ptr_array_index(names, i), NULL);
    WsyncSafetensors *st = wsync_safetensors_open(path, error);
    if (st == NULL)
      return FALSE;
    g_ptr_array_add(ck->files, st);
  }
  return TRUE;
}

/* ================================================================ the checkpoint */

static int
compare_files(const void *a, const void *b)
{
  return strcmp(wsync_safetensors_path(*(WsyncSafetensors *const *)a),
                wsync_safetensors_path(*(WsyncSafetensors *const *)b));
}

static int
compare_tensors(const void *a, const void *b)
{
  return strcmp((*(WsyncTensor *const *)a)->name, (*(WsyncTensor *const *)b)->name);
}

/* Gathers the tensors of all files; a name in two files (of one group) is an error. */
static gboolean
collect_tensors(WsyncCheckpoint *ck, GError **error)
{
  g_autoptr(GHashTable) seen = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);

  g_ptr_array_sort(ck->files, compare_files);
  for (guint f = 0; f < ck->files->len; f++) {
    const WsyncSafetensors *st = g_ptr_array_index(ck->files, f);
    gint64 rank = -1;
    if (ck->group != NULL && !ck->group(st, &rank, ck->group_data, error))
      return FALSE;
    for (guint i = 0; i < wsync_safetensors_n_tensors(st); i++) {
      const WsyncTensor *t = wsync_safetensors_tensor(st, i);
      char *key = g_strdup_printf("%" G_GINT64_FORMAT ":%s", rank, t->name);
      const WsyncTensor *other = g_hash_table_lookup(seen, key);
      if (other) {
        g_free(key);
        g_autofree char *pname = wsync_json_printable(t->name);
        g_autofree char *pother = wsync_json_printable(other->file);
        return bad_input(error, t->file, "tensor \"%s\" is also in %s", pname, pother);
      }
      g_hash_table_insert(seen, key, (gpointer)t);
      if (!g_hash_table_contains(ck->by_name, t->name))
        g_hash_table_insert(ck->by_name, (char *)t->name, (gpointer)t);
      g_ptr_array_add(ck->tensors, (gpointer)t);
      ck->total_bytes += t->nbytes;
    }
  }
  g_ptr_array_sort(ck->tensors, compare_tensors);
  return TRUE;
}

static void
safetensors_free_cb(gpointer p)
{
  wsync_safetensors_free(p);
}

WsyncCheckpoint *
wsync_checkpoint_open(const char *path, GError **error)
{
  return wsync_checkpoint_open_grouped(path, NULL, NULL, error);
}

WsyncCheckpoint *
wsync_checkpoint_open_grouped(const char *path, WsyncFileGroupFunc group, gpointer user_data,
                              GError **error)
{
  g_return_val_if_fail(path != NULL, NULL);
  g_return_val_if_fail(error == NULL || *error == NULL, NULL);

  g_autoptr(WsyncCheckpoint) ck = g_new0(WsyncCheckpoint, 1);
  ck->path = g_strdup(path);
  ck->group = group;
  ck->group_data = user_data;
  ck->files = g_ptr_array_new_with_free_func(safetensors_free_cb);
  ck->tensors = g_ptr_array_new();
  ck->by_name = g_hash_table_new(g_str_hash, g_str_equal);

  struct stat sb;
  if (stat(path, &sb) != 0) {
    wsync_set_io_error(error, errno, path, "open");
    return NULL;
  }
  ck->is_dir = S_ISDIR(sb.st_mode);
  if (ck->is_dir) {
    g_autofree char *index = g_build_filename(path, WSYNC_INDEX_NAME, NULL);
    struct stat isb;
    gboolean has_index = lstat(index, &isb) == 0;
    if (has_index ? !open_indexed(ck, path, index, error) : !open_plain_dir(ck, path, error))
      return NULL;
  } else {
    WsyncSafetensors *st = wsync_safetensors_open(path, error);
    if (st == NULL)
      return NULL;
    g_ptr_array_add(ck->files, st);
  }
  if (!collect_tensors(ck, error))
    return NULL;
  return g_steal_pointer(&ck);
}

void
wsync_checkpoint_free(WsyncCheckpoint *ck)
{
  if (ck == NULL)
    return;
  /* The tensors live in the files: drop the views before the files. */
  g_hash_table_destroy(ck->by_name);
  g_ptr_array_unref(ck->tensors);
  g_ptr_array_unref(ck->files);
  g_free(ck->path);
  g_free(ck);
}

const char *
wsync_checkpoint_path(const WsyncCheckpoint *ck)
{
  g_return_val_if_fail(ck != NULL, NULL);
  return ck->path;
}

gboolean
wsync_checkpoint_is_dir(const WsyncCheckpoint *ck)
{
  g_return_val_if_fail(ck != NULL, FALSE);
  return ck->is_dir;
}

guint
wsync_checkpoint_n_tensors(const WsyncCheckpoint *ck)
{
  g_return_val_if_fail(ck != NULL, 0);
  return ck->tensors->len;
}

const WsyncTensor *
wsync_checkpoint_tensor(const WsyncCheckpoint *ck, guint index)
{
  g_return_val_if_fail(ck != NULL, NULL);
  g_return_val_if_fail(index < ck->tensors->len, NULL);
  return g_ptr_array_index(ck->tensors, index);
}

const WsyncTensor *
wsync_checkpoint_lookup(const WsyncCheckpoint *ck, const char *name)
{
  g_return_val_if_fail(ck != NULL, NULL);
  g_return_val_if_fail(name != NULL, NULL);
  return g_hash_table_lookup(ck->by_name, name);
}

guint
wsync_checkpoint_n_files(const WsyncCheckpoint *ck)
{
  g_return_val_if_fail(ck != NULL, 0);
  return ck->files->len;
}

const WsyncSafetensors *
wsync_checkpoint_file(const WsyncCheckpoint *ck, guint index)
{
  g_return_val_if_fail(ck != NULL, NULL);
  g_return_val_if_fail(index < ck->files->len, NULL);
  return g_ptr_array_index(ck->files, index);
}

guint64
wsync_checkpoint_total_bytes(const WsyncCheckpoint *ck)
{
  g_return_val_if_fail(ck != NULL, 0);
  return ck->total_bytes;
}

/* ================================================================ writing the index */

gboolean
wsync_index_write(const char *path, guint64 total_size, GHashTable *weight_map, GError **error)
{
  g_return_val_if_fail(path != NULL, FALSE);
  g_return_val_if_fail(weight_map != NULL, FALSE);
  g_return_val_if_fail(error == NULL || *error == NULL, FALSE);

  guint n;
  g_autofree gpointer *names = g_hash_table_get_keys_as_array(weight_map, &n);
  if (n > 1)
    qsort(names, n, sizeof(gpointer), compare_cstrings);
  for (guint i = 0; i < n; i++) {
    const char *shard = g_hash_table_lookup(weight_map, names[i]);
    if (!g_utf8_validate(names[i], -1, NULL) || shard == NULL ||
        !g_utf8_validate(shard, -1, NULL)) {
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                  "%s: a tensor name or shard name is not valid UTF-8", path);
      return FALSE;
    }
  }

  /* json.dumps(index, indent=2, sort_keys=True) + "\n", byte for byte.  json-glib's
   * pretty printer writes "key" : value and {  }, so the layout is spelled out here. */
  GString *out = g_string_new(NULL);
  g_string_append_printf(out,
                         "{\n  \"metadata\": {\n    \"total_size\": %" G_GUINT64_FORMAT
                         "\n  },\n  \"weight_map\": {",
                         total_size);
  for (guint i = 0; i < n; i++) {
    g_string_append(out, i ? ",\n    " : "\n    ");
    wsync_json_append_string(out, WSYNC_JSON_ASCII, names[i]);
    g_string_append(out, ": ");
    wsync_json_append_string(out, WSYNC_JSON_ASCII,
                             g_hash_table_lookup(weight_map, names[i]));
  }
  g_string_append(out, n ? "\n  }\n}\n" : "}\n}\n");

  gboolean ok = wsync_file_write_synced(path, TRUE, out->str, out->len, error);
  g_string_free(out, TRUE);
  return ok;
}
