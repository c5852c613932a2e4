/* wsync: reading PyTorch distributed checkpoints (formats A and B, docs/dcp.md §2, §3).
 * See core/dcp.h for the contract. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-glib/json-glib.h>
#include <zip.h>

#include <wsync/error.h>

#include "dcp.h"
#include "filekind.h"
#include "json-check.h"
#include "pickle.h"

/* ================================================================ messages */

#define bad_input wsync_json_bad_tensor

static gboolean
dtype_is_whole_bytes(WsyncDtype dtype)
{
  return wsync_dtype_bits(dtype) % 8 == 0;
}

/* ================================================================ the checkpoint */

/* Format B: where a chunk's torch.save archive is. */
typedef struct {
  char *relative_path;
  guint64 offset, length;
  const char *meta; /* per-rank metadata: the __R.metadata that recorded it (owned by the
                     * checkpoint's meta_files); NULL: the checkpoint's own `where` */
} StorageRef;

typedef struct {
  WsyncDcpTensor t;
  GArray *refs; /* format B: StorageRef per chunk; NULL for format A */
  gboolean shape_stored; /* format B: t.shape is TensorStorageMetadata.size */
  const char *meta;      /* per-rank metadata: the first __R.metadata that lists it */
} Tensor;

typedef struct {
  char *path;
  guint8 *data;
  gsize len;
} MappedFile;

struct _WsyncDcp {
  char *dir;
  char *where;   /* names the checkpoint in messages: the shard directory or .metadata */
  WsyncDcpFormat format;
  GArray *tensors;      /* Tensor; sorted by name once built */
  GHashTable *by_name;  /* name -> index + 1 into tensors */
  GPtrArray *shards;    /* format A: WsyncSafetensors* */
  GHashTable *maps;     /* format B: relative path -> MappedFile* */
  GPtrArray *skipped;   /* format B: names of BytesStorageMetadata entries */
  GPtrArray *meta_files; /* format B, per-rank metadata: the __R.metadata paths, by rank */
  GHashTable *paths;    /* format B: fqn -> its object path in the saved state dict
                         * (char **), when planner_data records one; see read_planner_data() */
  char *wrapper;        /* the keys dropped from every name, dotted, or NULL */
  guint n_dropped;      /* entries outside the one state dict taken (--select) */
  char *refusal;        /* list_all: why merge would refuse the names, or NULL */
};

static void
storage_ref_clear(gpointer p)
{
  StorageRef *ref = p;
  g_free(ref->relative_path);
}

static void
tensor_clear(gpointer p)
{
  Tensor *t = p;
  g_free(t->t.name);
  if (t->t.chunks)
    g_array_unref(t->t.chunks);
  if (t->refs)
    g_array_unref(t->refs);
}

static void
mapped_file_free(gpointer p)
{
  MappedFile *mf = p;
  if (mf->data && mf->len)
    munmap(mf->data, mf->len);
  g_free(mf->path);
  g_free(mf);
}

static void
shard_free(gpointer p)
{
  wsync_safetensors_free(p);
}

static WsyncDcp *
dcp_new(const char *dir, const char *where, WsyncDcpFormat format)
{
  WsyncDcp *dcp = g_new0(WsyncDcp, 1);
  dcp->dir = g_strdup(dir);
  dcp->where = g_strdup(where);
  dcp->format = format;
  dcp->tensors = g_array_new(FALSE, TRUE, sizeof(Tensor));
  g_array_set_clear_func(dcp->tensors, tensor_clear);
  dcp->by_name = g_hash_table_new(g_str_hash, g_str_equal);
  dcp->shards = g_ptr_array_new_with_free_func(shard_free);
  dcp->maps = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, mapped_file_free);
  dcp->skipped = g_ptr_array_new_with_free_func(g_free);
  dcp->meta_files = g_ptr_array_new_with_free_func(g_free);
  dcp->paths = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, (GDestroyNotify)g_strfreev);
  return dcp;
}

void
wsync_dcp_free(WsyncDcp *dcp)
{
  if (dcp == NULL)
    return;
  g_hash_table_destroy(dcp->by_name);
  g_array_unref(dcp->tensors);
  g_ptr_array_unref(dcp->shards);
  g_hash_table_destroy(dcp->maps);
  g_ptr_array_unref(dcp->skipped);
  g_ptr_array_unref(dcp->meta_files);
  g_hash_table_destroy(dcp->paths);
  g_free(dcp->wrapper);
  g_free(dcp->refusal);
  g_free(dcp->dir);
  g_free(dcp->where);
  g_free(dcp);
}

WsyncDcpFormat
wsync_dcp_format(const WsyncDcp *dcp)
{
  g_return_val_if_fail(dcp != NULL, WSYNC_DCP_FORMAT_HF_SAFETENSORS);
  return dcp->format;
}

guint
wsync_dcp_n_tensors(const WsyncDcp *dcp)
{
  g_return_val_if_fail(dcp != NULL, 0);
  return dcp->tensors->len;
}

const WsyncDcpTensor *
wsync_dcp_tensor(const WsyncDcp *dcp, guint i)
{
  g_return_val_if_fail(dcp != NULL, NULL);
  g_return_val_if_fail(i < dcp->tensors->len, NULL);
  return &g_array_index(dcp->tensors, Tensor, i).t;
}

const WsyncDcpTensor *
wsync_dcp_lookup(const WsyncDcp *dcp, const char *name)
{
  g_return_val_if_fail(dcp != NULL && name != NULL, NULL);
  guint at = GPOINTER_TO_UINT(g_hash_table_lookup(dcp->by_name, name));
  return at ? &g_array_index(dcp->tensors, Tensor, at - 1).t : NULL;
}

guint
wsync_dcp_n_skipped(const WsyncDcp *dcp)
{
  g_return_val_if_fail(dcp != NULL, 0);
  return dcp->skipped->len;
}

const char *
wsync_dcp_skipped(const WsyncDcp *dcp, guint i)
{
  g_return_val_if_fail(dcp != NULL && i < dcp->skipped->len, NULL);
  return g_ptr_array_index(dcp->skipped, i);
}

const char *
wsync_dcp_wrapper(const WsyncDcp *dcp)
{
  g_return_val_if_fail(dcp != NULL, NULL);
  return dcp->wrapper;
}

guint
wsync_dcp_n_dropped(const WsyncDcp *dcp)
{
  g_return_val_if_fail(dcp != NULL, 0);
  return dcp->n_dropped;
}

const char *
wsync_dcp_refusal(const WsyncDcp *dcp)
{
  g_return_val_if_fail(dcp != NULL, NULL);
  return dcp->refusal;
}

/* The tensor called @name, created when new. */
static Tensor *
tensor_get(WsyncDcp *dcp, const char *name, gboolean *created)
{
  guint at = GPOINTER_TO_UINT(g_hash_table_lookup(dcp->by_name, name));
  *created = at == 0;
  if (at == 0) {
    Tensor t = {0};
    t.t.name = g_strdup(name);
    t.t.chunks = g_array_new(FALSE, TRUE, sizeof(WsyncDcpChunk));
    g_array_append_val(dcp->tensors, t);
    at = dcp->tensors->len;
    g_hash_table_insert(dcp->by_name, g_array_index(dcp->tensors, Tensor, at - 1).t.name,
                        GUINT_TO_POINTER(at));
  }
  return &g_array_index(dcp->tensors, Tensor, at - 1);
}

static int
compare_tensors(gconstpointer a, gconstpointer b)
{
  return strcmp(((const Tensor *)a)->t.name, ((const Tensor *)b)->t.name);
}

/* Sorts the tensors by name, indexes them again, and checks that each one's size in
 * elements and bytes fits 64 bits. */
static gboolean
finish_tensors(WsyncDcp *dcp, GError **error)
{
  g_array_sort(dcp->tensors, compare_tensors);
  g_hash_table_remove_all(dcp->by_name);
  for (guint i = 0; i < dcp->tensors->len; i++) {
    Tensor *t = &g_array_index(dcp->tensors, Tensor, i);
    g_hash_table_insert(dcp->by_name, t->t.name, GUINT_TO_POINTER(i + 1));
    guint64 numel = 1, nbytes;
    gboolean ok = TRUE;
    for (guint d = 0; d < t->t.ndim && ok; d++)
      ok = g_uint64_checked_mul(&numel, numel, t->t.shape[d]);
    if (!ok || !g_uint64_checked_mul(&nbytes, numel, wsync_dtype_size(t->t.dtype))) {
      g_autofree char *shape = wsync_shape_format(t->t.ndim, t->t.shape);
      return bad_input(error, dcp->where, t->t.name, "shape %s of %s is too large for 64 bits",
                       shape, wsync_dtype_name(t->t.dtype));
    }
  }
  return TRUE;
}

static gboolean name_entries(WsyncDcp *dcp, const WsyncDcpOpenOptions *opts, GError **error);

/* ================================================================ format A */

/* "shard-S-model-I-of-N.safetensors", each number one or more decimal digits. */
static gboolean
parse_shard_name(const char *name, guint64 *s, guint64 *i, guint64 *n)
{
  static const char *const parts[] = {"shard-", "-model-", "-of-", ".safetensors"};
  guint64 *out[] = {s, i, n};
  const char *p = name;
  for (guint k = 0; k < 4; k++) {
    if (!g_str_has_prefix(p, parts[k]))
      return FALSE;
    p += strlen(parts[k]);
    if (k == 3)
      return *p == '\0';
    guint64 v = 0;
    guint digits = 0;
    while (g_ascii_isdigit(*p)) {
      if (++digits > 9)
        return FALSE;
      v = v * 10 + (guint64)(*p++ - '0');
    }
    if (digits == 0)
      return FALSE;
    *out[k] = v;
  }
  return FALSE;
}

typedef struct {
  char *path;
  char *base;
  guint64 s, i, n;
} ShardName;

static void
shard_name_clear(gpointer p)
{
  ShardName *sn = p;
  g_free(sn->path);
  g_free(sn->base);
}

static int
compare_shard_names(gconstpointer a, gconstpointer b)
{
  const ShardName *x = a, *y = b;
  if (x->s != y->s)
    return x->s < y->s ? -1 : 1;
  if (x->i != y->i)
    return x->i < y->i ? -1 : 1;
  return strcmp(x->base, y->base);
}

/* The shard files of @dir, sorted by shard number, then output part.  An unreadable
 * directory holds none. */
static GArray *
list_shards(const char *dir)
{
  GArray *out = g_array_new(FALSE, TRUE, sizeof(ShardName));
  g_array_set_clear_func(out, shard_name_clear);
  GDir *d = g_dir_open(dir, 0, NULL);
  if (d == NULL)
    return out;
  const char *name;
  while ((name = g_dir_read_name(d)) != NULL) {
    ShardName sn = {0};
    if (!parse_shard_name(name, &sn.s, &sn.i, &sn.n))
      continue;
    sn.path = g_build_filename(dir, name, NULL);
    sn.base = g_strdup(name);
    g_array_append_val(out, sn);
  }
  g_dir_close(d);
  g_array_sort(out, compare_shard_names);
  return out;
}

/* A non-negative JSON integer. */
static gboolean
json_uint(JsonNode *node, guint64 *out)
{
  if (node == NULL || !JSON_NODE_HOLDS_VALUE(node) ||
      json_node_get_value_type(node) != G_TYPE_INT64 || json_node_get_int(node) < 0)
    return FALSE;
  *out = (guint64)json_node_get_int(node);
  return TRUE;
}

/* Adds one chunk of format A.  @part and @n_parts are 0 when the file name is not a
 * shard name (a fuzzed image). */
static gboolean
add_chunk_a(WsyncDcp *dcp, const char *file, const char *name, const WsyncTensor *st,
            const guint64 *offsets, guint part, guint n_parts, GError **error)
{
  if (!dtype_is_whole_bytes(st->dtype))
    return bad_input(error, file, st->name,
                     "dtype %s packs several elements per byte; a sharded checkpoint of it is "
                     "not supported",
                     wsync_dtype_name(st->dtype));
  WsyncDcpChunk chunk = {.data = st->data, .file = st->file};
  chunk.box.ndim = st->ndim;
  for (guint d = 0; d < st->ndim; d++) {
    chunk.box.offset[d] = offsets[d];
    chunk.box.extent[d] = st->shape[d];
    guint64 end;
    if (!g_uint64_checked_add(&end, offsets[d], st->shape[d]))
      return bad_input(error, file, st->name,
                       "saved_offsets %" G_GUINT64_FORMAT " + shape %" G_GUINT64_FORMAT
                       " on axis %u overflow 64 bits",
                       offsets[d], st->shape[d], d);
  }
  wsync_region_row_major(&chunk.region, st->ndim, st->shape, NULL);

  gboolean created;
  Tensor *t = tensor_get(dcp, name, &created);
  if (created) {
    t->t.dtype = st->dtype;
    t->t.ndim = st->ndim;
    t->t.part = part;
    t->t.n_parts = n_parts;
  } else {
    const WsyncDcpChunk *first = &g_array_index(t->t.chunks, WsyncDcpChunk, 0);
    g_autofree char *pfirst = wsync_json_printable(first->file);
    if (t->t.dtype != st->dtype)
      return bad_input(error, file, name, "dtype %s, but %s in %s", wsync_dtype_name(st->dtype),
                       wsync_dtype_name(t->t.dtype), pfirst);
    if (t->t.ndim != st->ndim)
      return bad_input(error, file, name, "%u dimensions, but %u in %s", st->ndim, t->t.ndim,
                       pfirst);
    if (t->t.part != part || t->t.n_parts != n_parts)
      return bad_input(error, file, name, "in output part %u of %u, but in part %u of %u in %s",
                       part, n_parts, t->t.part, t->t.n_parts, pfirst);
  }
  for (guint d = 0; d < st->ndim; d++)
    t->t.shape[d] = MAX(t->t.shape[d], offsets[d] + st->shape[d]);
  g_array_append_val(t->t.chunks, chunk);
  return TRUE;
}

/* Reads DCP_SHARDING_INFO of one opened shard and adds its chunks. */
static gboolean
add_shard(WsyncDcp *dcp, const WsyncSafetensors *st, guint part, guint n_parts, GError **error)
{
  const char *file = wsync_safetensors_path(st);
  const char *info = g_hash_table_lookup(wsync_safetensors_metadata(st), "DCP_SHARDING_INFO");
  if (info == NULL)
    return bad_input(error, file, NULL,
                     "no DCP_SHARDING_INFO in __metadata__: not a shard of a DCP sharded save "
                     "(torch's consolidator refuses it too)");
  g_autoptr(JsonParser) parser = json_parser_new();
  if (!wsync_json_parse(parser, info, strlen(info), file, "DCP_SHARDING_INFO", error))
    return FALSE;
  JsonNode *root = json_parser_get_root(parser);
  if (root == NULL || !JSON_NODE_HOLDS_OBJECT(root))
    return bad_input(error, file, NULL, "DCP_SHARDING_INFO is not a JSON object");
  JsonObject *obj = json_node_get_object(root);

  /* Every key must be a tensor of the file. */
  JsonObjectIter iter;
  const char *key;
  JsonNode *node;
  json_object_iter_init_ordered(&iter, obj);
  while (json_object_iter_next_ordered(&iter, &key, &node))
    if (wsync_safetensors_lookup(st, key) == NULL)
      return bad_input(error, file, key,
                       "named in DCP_SHARDING_INFO but the file has no such tensor");

  for (guint i = 0; i < wsync_safetensors_n_tensors(st); i++) {
    const WsyncTensor *t = wsync_safetensors_tensor(st, i);
    node = json_object_get_member(obj, t->name);
    if (node == NULL)
      return bad_input(error, file, t->name, "no entry in DCP_SHARDING_INFO");
    if (!JSON_NODE_HOLDS_OBJECT(node))
      return bad_input(error, file, t->name, "its DCP_SHARDING_INFO entry is not an object");
    JsonObject *entry = json_node_get_object(node);
    JsonNode *offs = json_object_get_member(entry, "saved_offsets");
    if (offs == NULL || !JSON_NODE_HOLDS_ARRAY(offs))
      return bad_input(error, file, t->name,
                       "its DCP_SHARDING_INFO entry has no \"saved_offsets\" array");
    JsonArray *array = json_node_get_array(offs);
    guint n = json_array_get_length(array);
    if (n != t->ndim) {
      g_autofree char *shape = wsync_shape_format(t->ndim, t->shape);
      return bad_input(error, file, t->name,
                       "saved_offsets has %u elements but the shape %s has %u dimensions", n,
                       shape, t->ndim);
    }
    guint64 offsets[WSYNC_MAX_DIMS];
    for (guint d = 0; d < n; d++)
      if (!json_uint(json_array_get_element(array, d), &offsets[d]))
        return bad_input(error, file, t->name,
                         "saved_offsets element %u is not an integer from 0 to 2^63-1", d);
    const char *logical = t->name;
    JsonNode *lnode = json_object_get_member(entry, "logical_fqn");
    if (lnode != NULL) {
      if (!JSON_NODE_HOLDS_VALUE(lnode) || json_node_get_value_type(lnode) != G_TYPE_STRING ||
          *json_node_get_string(lnode) == '\0')
        return bad_input(error, file, t->name, "logical_fqn is not a non-empty string");
      logical = json_node_get_string(lnode);
    }
    if (!add_chunk_a(dcp, file, logical, t, offsets, part, n_parts, error))
      return FALSE;
  }
  return TRUE;
}

static WsyncDcp *
open_a(const char *dir, const char *shard_dir, GArray *names, const WsyncDcpOpenOptions *opts,
       GError **error)
{
  g_autoptr(WsyncDcp) dcp = dcp_new(dir, shard_dir, WSYNC_DCP_FORMAT_HF_SAFETENSORS);
  guint64 n_parts = 0;
  const char *n_from = NULL;
  for (guint k = 0; k < names->len; k++) {
    const ShardName *sn = &g_array_index(names, ShardName, k);
    if (sn->s == 0 || sn->i == 0 || sn->n == 0 || sn->i > sn->n) {
      bad_input(error, sn->path, NULL,
                "the name says shard %" G_GUINT64_FORMAT ", output part %" G_GUINT64_FORMAT
                " of %" G_GUINT64_FORMAT "; numbers start at 1 and the part is at most N",
                sn->s, sn->i, sn->n);
      return NULL;
    }
    if (n_from && sn->n != n_parts) {
      bad_input(error, sn->path, NULL,
                "the name says %" G_GUINT64_FORMAT " output parts but %s says %" G_GUINT64_FORMAT,
                sn->n, n_from, n_parts);
      return NULL;
    }
    n_parts = sn->n;
    n_from = sn->base;
    WsyncSafetensors *st = wsync_safetensors_open(sn->path, error);
    if (st == NULL)
      return NULL;
    g_ptr_array_add(dcp->shards, st);
    if (!add_shard(dcp, st, (guint)sn->i, (guint)sn->n, error))
      return NULL;
  }
  if (!name_entries(dcp, opts, error))
    return NULL;
  return g_steal_pointer(&dcp);
}

WsyncDcp *
wsync_dcp_parse_shard(const guint8 *data, gsize len, const char *file, GError **error)
{
  g_return_val_if_fail(data != NULL || len == 0, NULL);
  g_return_val_if_fail(file != NULL, NULL);
  g_autofree char *base = g_path_get_basename(file);
  guint64 s = 0, i = 0, n = 0;
  if (!parse_shard_name(base, &s, &i, &n) || i == 0 || i > n || n > G_MAXUINT)
    i = n = 0;
  g_autoptr(WsyncDcp) dcp = dcp_new(file, file, WSYNC_DCP_FORMAT_HF_SAFETENSORS);
  WsyncSafetensors *st = wsync_safetensors_parse(data, len, file, error);
  if (st == NULL)
    return NULL;
  g_ptr_array_add(dcp->shards, st);
  if (!add_shard(dcp, st, (guint)i, (guint)n, error) || !finish_tensors(dcp, error))
    return NULL;
  return g_steal_pointer(&dcp);
}

/* ================================================================ format B: the metadata */

/* A torch.Size (REDUCE(torch.Size, ((d0, d1, ...),))) or a plain tuple of integers. */
static gboolean
get_dims(const WsyncPickleValue *v, guint *ndim, guint64 *dims)
{
  if (wsync_pickle_is_instance(v, WSYNC_PG_SIZE)) {
    if (v->newobj || v->state != NULL || wsync_pickle_n_items(v->args) != 1)
      return FALSE;
    v = wsync_pickle_item(v->args, 0);
  }
  if (v == NULL || v->kind != WSYNC_PICKLE_TUPLE)
    return FALSE;
  guint n = wsync_pickle_n_items(v);
  if (n > WSYNC_MAX_DIMS)
    return FALSE;
  for (guint i = 0; i < n; i++) {
    const WsyncPickleValue *d = wsync_pickle_item(v, i);
    if (d->kind != WSYNC_PICKLE_INT || d->integer < 0)
      return FALSE;
    dims[i] = (guint64)d->integer;
  }
  *ndim = n;
  return TRUE;
}

/* The BUILD state dict of a dataclass instance of @global (NULL when it is not one). */
static const WsyncPickleValue *
dataclass_state(const WsyncPickleValue *v, WsyncPickleGlobal global)
{
  if (!wsync_pickle_is_instance(v, global) || !v->newobj || v->state == NULL ||
      v->state->kind != WSYNC_PICKLE_DICT)
    return NULL;
  return v->state;
}

/* The key of a chunk in storage_data: fqn and offsets. */
static char *
chunk_key(const char *fqn, guint ndim, const guint64 *offsets)
{
  GString *key = g_string_new(NULL);
  g_string_append_printf(key, "%u:", ndim);
  for (guint d = 0; d < ndim; d++)
    g_string_append_printf(key, "%s%" G_GUINT64_FORMAT, d ? "," : "", offsets[d]);
  g_string_append_c(key, '|');
  g_string_append(key, fqn);
  return g_string_free(key, FALSE);
}

typedef struct {
  StorageRef ref;
  const char *transform; /* the first transform descriptor, or NULL */
} StorageEntry;

static void
storage_entry_free(gpointer p)
{
  StorageEntry *e = p;
  g_free(e->ref.relative_path);
  g_free(e);
}

/* storage_data: {MetadataIndex(fqn, offset): _StorageInfo(relative_path, offset, length
 * [, transform_descriptors])}.  Entries without an offset (non-tensor values) are
 * skipped. */
static gboolean
read_storage_data(const WsyncPickleValue *sd, GHashTable *out, const char *file, GError **error)
{
  for (guint i = 0; i < wsync_pickle_n_items(sd); i++) {
    const WsyncPickleValue *k = wsync_pickle_dict_key(sd, i), *v = wsync_pickle_dict_value(sd, i);
    const WsyncPickleValue *ks = dataclass_state(k, WSYNC_PG_METADATA_INDEX);
    if (ks == NULL) {
      g_autofree char *d = wsync_pickle_describe(k);
      return bad_input(error, file, NULL, "storage_data key %u is %s, not a MetadataIndex", i, d);
    }
    const WsyncPickleValue *fqn = wsync_pickle_dict_lookup(ks, "fqn");
    if (fqn == NULL || fqn->kind != WSYNC_PICKLE_STR)
      return bad_input(error, file, NULL, "storage_data key %u has no fqn string", i);
    const WsyncPickleValue *off = wsync_pickle_dict_lookup(ks, "offset");
    if (off == NULL || off->kind == WSYNC_PICKLE_NONE)
      continue; /* a BYTE_IO item */
    guint ndim;
    guint64 offsets[WSYNC_MAX_DIMS];
    if (!get_dims(off, &ndim, offsets))
      return bad_input(error, file, fqn->str, "storage_data key %u: offset is not a torch.Size", i);

    const WsyncPickleValue *vs = dataclass_state(v, WSYNC_PG_STORAGE_INFO);
    if (vs == NULL) {
      g_autofree char *d = wsync_pickle_describe(v);
      return bad_input(error, file, fqn->str, "storage_data value %u is %s, not a _StorageInfo",
                       i, d);
    }
    const WsyncPickleValue *rp = wsync_pickle_dict_lookup(vs, "relative_path");
    const WsyncPickleValue *o = wsync_pickle_dict_lookup(vs, "offset");
    const WsyncPickleValue *l = wsync_pickle_dict_lookup(vs, "length");
    const WsyncPickleValue *td = wsync_pickle_dict_lookup(vs, "transform_descriptors");
    if (rp == NULL || rp->kind != WSYNC_PICKLE_STR || o == NULL || o->kind != WSYNC_PICKLE_INT ||
        o->integer < 0 || l == NULL || l->kind != WSYNC_PICKLE_INT || l->integer < 0)
      return bad_input(error, file, fqn->str,
                       "storage_data value %u lacks a relative_path string and non-negative "
                       "offset and length",
                       i);
    const char *transform = NULL;
    if (td != NULL && td->kind != WSYNC_PICKLE_NONE) {
      if (td->kind != WSYNC_PICKLE_LIST && td->kind != WSYNC_PICKLE_TUPLE)
        return bad_input(error, file, fqn->str,
                         "storage_data value %u: transform_descriptors is not a list", i);
      for (guint j = 0; j < wsync_pickle_n_items(td); j++) {
        const WsyncPickleValue *s = wsync_pickle_item(td, j);
        if (s->kind != WSYNC_PICKLE_STR)
          return bad_input(error, file, fqn->str,
                           "storage_data value %u: a transform descriptor is not a str", i);
        if (transform == NULL)
          transform = s->str;
      }
    }
    char *key = chunk_key(fqn->str, ndim, offsets);
    if (g_hash_table_contains(out, key)) {
      g_autofree char *dims = wsync_shape_format(ndim, offsets);
      g_free(key);
      return bad_input(error, file, fqn->str, "storage_data has the chunk at offsets %s twice",
                       dims);
    }
    StorageEntry *e = g_new0(StorageEntry, 1);
    e->ref.relative_path = g_strdup(rp->str);
    e->ref.offset = (guint64)o->integer;
    e->ref.length = (guint64)l->integer;
    e->transform = transform;
    g_hash_table_insert(out, key, e);
  }
  return TRUE;
}

/* TensorProperties: BUILD state is the 5-tuple (dtype, layout, requires_grad,
 * memory_format, pin_memory), or a dict with "dtype" and "layout" in versions without
 * __getstate__.  Only dense tensors (layout torch.strided) can be read.  requires_grad,
 * pin_memory and the memory format do not change the bytes: each chunk's archive
 * carries its own size and stride (the pickle reader has already checked that the
 * memory format is a member of its enum). */
static gboolean
read_properties(const WsyncPickleValue *p, WsyncDtype *dtype, const char *file, const char *fqn,
                GError **error)
{
  const WsyncPickleValue *dt = NULL, *layout = NULL;
  if (wsync_pickle_is_instance(p, WSYNC_PG_TENSOR_PROPERTIES) && p->newobj && p->state) {
    if (p->state->kind == WSYNC_PICKLE_TUPLE && wsync_pickle_n_items(p->state) == 5) {
      dt = wsync_pickle_item(p->state, 0);
      layout = wsync_pickle_item(p->state, 1);
    } else if (p->state->kind == WSYNC_PICKLE_DICT) {
      dt = wsync_pickle_dict_lookup(p->state, "dtype");
      layout = wsync_pickle_dict_lookup(p->state, "layout");
    }
  }
  if (dt == NULL || dt->kind != WSYNC_PICKLE_GLOBAL || dt->global != WSYNC_PG_DTYPE) {
    g_autofree char *d = wsync_pickle_describe(dt ? dt : p);
    return bad_input(error, file, fqn,
                     "properties hold %s, not TensorProperties with a torch dtype", d);
  }
  if (!dt->has_dtype)
    return bad_input(error, file, fqn, "dtype %s.%s has no safetensors equivalent", dt->module,
                     dt->name);
  if (layout == NULL || layout->kind != WSYNC_PICKLE_LAYOUT) {
    g_autofree char *d = wsync_pickle_describe(layout);
    return bad_input(error, file, fqn, "properties hold %s as the layout, not a torch.layout", d);
  }
  if (strcmp(layout->name, "torch.strided") != 0)
    return bad_input(error, file, fqn,
                     "layout %s is not supported; only dense tensors (torch.strided) are",
                     layout->name);
  *dtype = dt->dtype;
  return TRUE;
}

static gboolean
read_tensor_metadata(WsyncDcp *dcp, const char *fqn, const WsyncPickleValue *tsm,
                     GHashTable *storage, const char *file, GError **error)
{
  const WsyncPickleValue *props = wsync_pickle_dict_lookup(tsm, "properties");
  const WsyncPickleValue *size = wsync_pickle_dict_lookup(tsm, "size");
  const WsyncPickleValue *chunks = wsync_pickle_dict_lookup(tsm, "chunks");
  WsyncDtype dtype = WSYNC_DTYPE_F32;
  if (!read_properties(props, &dtype, file, fqn, error))
    return FALSE;
  guint ndim;
  guint64 shape[WSYNC_MAX_DIMS];
  if (!get_dims(size, &ndim, shape)) {
    g_autofree char *d = wsync_pickle_describe(size);
    return bad_input(error, file, fqn, "size is %s, not a torch.Size of at most %d dimensions", d,
                     WSYNC_MAX_DIMS);
  }
  if (chunks == NULL || (chunks->kind != WSYNC_PICKLE_LIST && chunks->kind != WSYNC_PICKLE_TUPLE)) {
    g_autofree char *d = wsync_pickle_describe(chunks);
    return bad_input(error, file, fqn, "chunks is %s, not a list", d);
  }

  gboolean created;
  Tensor *t = tensor_get(dcp, fqn, &created);
  if (!created)
    return bad_input(error, file, fqn, "appears twice in state_dict_metadata");
  t->t.dtype = dtype;
  t->t.ndim = ndim;
  memcpy(t->t.shape, shape, sizeof shape);
  t->shape_stored = TRUE;
  t->refs = g_array_new(FALSE, TRUE, sizeof(StorageRef));
  g_array_set_clear_func(t->refs, storage_ref_clear);

  for (guint c = 0; c < wsync_pickle_n_items(chunks); c++) {
    const WsyncPickleValue *cs =
        dataclass_state(wsync_pickle_item(chunks, c), WSYNC_PG_CHUNK_STORAGE_METADATA);
    WsyncDcpChunk chunk = {0};
    guint n_off = 0, n_size = 0;
    if (cs == NULL ||
        !get_dims(wsync_pickle_dict_lookup(cs, "offsets"), &n_off, chunk.box.offset) ||
        !get_dims(wsync_pickle_dict_lookup(cs, "sizes"), &n_size, chunk.box.extent))
      return bad_input(error, file, fqn,
                       "chunk %u is not a ChunkStorageMetadata with torch.Size offsets and sizes",
                       c);
    if (n_off != ndim || n_size != ndim) {
      g_autofree char *dims = wsync_shape_format(ndim, shape);
      return bad_input(error, file, fqn,
                       "chunk %u has %u offsets and %u sizes but the shape %s has %u dimensions",
                       c, n_off, n_size, dims, ndim);
    }
    chunk.box.ndim = ndim;
    g_autofree char *box = wsync_box_format(&chunk.box);
    for (guint d = 0; d < ndim; d++)
      if (chunk.box.offset[d] > shape[d] || chunk.box.extent[d] > shape[d] - chunk.box.offset[d]) {
        g_autofree char *dims = wsync_shape_format(ndim, shape);
        return bad_input(error, file, fqn, "chunk %s lies outside the shape %s", box, dims);
      }
    g_autofree char *key = chunk_key(fqn, ndim, chunk.box.offset);
    StorageEntry *e = g_hash_table_lookup(storage, key);
    if (e == NULL)
      return bad_input(error, file, fqn, "chunk %s has no storage_data entry", box);
    if (e->transform != NULL) {
      g_autofree char *p = wsync_json_printable(e->transform);
      return bad_input(error, file, fqn,
                       "chunk %s is stored with the transform \"%s\" (e.g. zstd compression by "
                       "a DCP extension); only plain torch.save archives are supported",
                       box, p);
    }
    StorageRef ref = {g_strdup(e->ref.relative_path), e->ref.offset, e->ref.length, NULL};
    g_array_append_val(t->t.chunks, chunk);
    g_array_append_val(t->refs, ref);
  }
  return TRUE;
}

/* planner_data: {fqn: object path}, the path in the saved (nested) state dict that
 * flatten_state_dict joined with "." into the fqn (docs/dcp.md §3, "Names"): a str per
 * dict key, an int per list index (traverse_state_dict).  Records in @paths, per fqn, the
 * path's elements as strings when they join back to the fqn.  Only a naming hint:
 * anything else in it (None when the planner did not flatten, a path of other values)
 * records nothing and refuses nothing. */
static void
read_planner_data(const WsyncPickleValue *pd, GHashTable *paths)
{
  for (guint i = 0; pd != NULL && pd->kind == WSYNC_PICKLE_DICT && i < wsync_pickle_n_items(pd);
       i++) {
    const WsyncPickleValue *k = wsync_pickle_dict_key(pd, i), *path = wsync_pickle_dict_value(pd, i);
    if (k->kind != WSYNC_PICKLE_STR || (path->kind != WSYNC_PICKLE_TUPLE &&
                                        path->kind != WSYNC_PICKLE_LIST))
      continue;
    guint n = wsync_pickle_n_items(path);
    GPtrArray *elements = g_ptr_array_new();
    gboolean ok = n >= 1;
    for (guint j = 0; ok && j < n; j++) {
      const WsyncPickleValue *e = wsync_pickle_item(path, j);
      if (e->kind == WSYNC_PICKLE_STR)
        g_ptr_array_add(elements, g_strdup(e->str));
      else if (e->kind == WSYNC_PICKLE_INT)
        g_ptr_array_add(elements, g_strdup_printf("%" G_GINT64_FORMAT, e->integer));
      else
        ok = FALSE;
    }
    g_ptr_array_add(elements, NULL);
    char **v = (char **)g_ptr_array_free(elements, FALSE);
    g_autofree char *joined = g_strjoinv(".", v); /* ".".join(map(str, path)) */
    if (ok && strcmp(joined, k->str) == 0)
      g_hash_table_replace(paths, g_strdup(k->str), v);
    else
      g_strfreev(v);
  }
}

/* One entry of the saved state dict, a tensor or a skipped value, and its object path. */
typedef struct {
  gboolean tensor;
  guint index; /* into tensors, or into skipped */
  char **path; /* owned by the checkpoint's paths or by the caller */
  guint n;     /* its length, at least 1 */
} Entry;

/* Every entry with its path: the one planner_data records, else the fqn as one top-level
 * key.  When the checkpoint records no path at all (format A; planner_data None), the
 * fqn of an entry saved under @key is still "KEY.rest" (flatten_state_dict joins with
 * "."), so with --select KEY such an entry gets the path (KEY, rest).  Paths made here
 * go to @owned. */
static GArray *
list_entries(WsyncDcp *dcp, const char *key, GPtrArray *owned)
{
  gboolean any_path = g_hash_table_size(dcp->paths) > 0;
  guint n_tensors = dcp->tensors->len, n = n_tensors + dcp->skipped->len;
  GArray *entries = g_array_sized_new(FALSE, TRUE, sizeof(Entry), n);
  for (guint i = 0; i < n; i++) {
    Entry e = {i < n_tensors, i < n_tensors ? i : i - n_tensors, NULL, 0};
    const char *fqn = e.tensor ? g_array_index(dcp->tensors, Tensor, i).t.name
                               : g_ptr_array_index(dcp->skipped, e.index);
    e.path = g_hash_table_lookup(dcp->paths, fqn);
    if (e.path == NULL) {
      gsize k = key != NULL ? strlen(key) : 0;
      gboolean under = !any_path && k > 0 && strncmp(fqn, key, k) == 0 && fqn[k] == '.';
      e.path = g_new0(char *, 3);
      e.path[0] = g_strdup(under ? key : fqn);
      e.path[1] = under ? g_strdup(fqn + k + 1) : NULL;
      g_ptr_array_add(owned, e.path);
    }
    e.n = g_strv_length(e.path);
    g_array_append_val(entries, e);
  }
  return entries;
}

/* The first @d elements of @path, joined with ".". */
static char *
join_prefix(char **path, guint d)
{
  GString *s = g_string_new(NULL);
  for (guint j = 0; j < d; j++)
    g_string_append_printf(s, "%s%s", j ? "." : "", path[j]);
  return g_string_free(s, FALSE);
}

/* The depth of the deepest node of the saved state dict that holds every entry: the keys
 * above it wrap the whole state dict, as accelerate's {"model": state_dict} (docs/dcp.md
 * §3, "Names"). */
static guint
common_depth(GArray *entries)
{
  for (guint d = 0;; d++) {
    const char *child = NULL;
    for (guint i = 0; i < entries->len; i++) {
      const Entry *e = &g_array_index(entries, Entry, i);
      if (e->n <= d + 1 || (child != NULL && strcmp(child, e->path[d]) != 0))
        return d;
      child = e->path[d];
    }
    if (child == NULL)
      return d;
  }
}

/* The depth of the model's node: the deepest node that holds every tensor entry (every
 * entry when there is no tensor).  A non-tensor value (BytesStorageMetadata: an object
 * torch.save'd into bytes, docs/dcp.md §3) is no weight, so one saved beside the model
 * (a step counter beside accelerate's {"model": sd}) does not hide the wrapper key. */
static guint
model_depth(GArray *entries)
{
  g_autoptr(GArray) tensors = g_array_new(FALSE, FALSE, sizeof(Entry));

  for (guint i = 0; i < entries->len; i++)
    if (g_array_index(entries, Entry, i).tensor)
      g_array_append_val(tensors, g_array_index(entries, Entry, i));
  return common_depth(tensors->len > 0 ? tensors : entries);
}

/* The first tensor entry, else the first entry; NULL when there is none. */
static const Entry *
model_entry(GArray *entries)
{
  for (guint i = 0; i < entries->len; i++)
    if (g_array_index(entries, Entry, i).tensor)
      return &g_array_index(entries, Entry, i);
  return entries->len > 0 ? &g_array_index(entries, Entry, 0) : NULL;
}

/* TRUE when @e lies under the node of depth @d that @model lies under. */
static gboolean
entry_under(const Entry *e, const Entry *model, guint d)
{
  if (e->n <= d)
    return FALSE;
  for (guint j = 0; j < d; j++)
    if (strcmp(e->path[j], model->path[j]) != 0)
      return FALSE;
  return TRUE;
}

/* The entries under the model's node of depth @d, which describe_node() lists (values
 * saved outside it are skipped anyway and not described). */
static GArray *
entries_under(GArray *entries, guint d)
{
  const Entry *model = model_entry(entries);
  GArray *under = g_array_new(FALSE, FALSE, sizeof(Entry));

  for (guint i = 0; model != NULL && i < entries->len; i++)
    if (entry_under(&g_array_index(entries, Entry, i), model, d))
      g_array_append_val(under, g_array_index(entries, Entry, i));
  return under;
}

/* "2 tensors", "1 tensor, 3 other values", "1 other value" */
static char *
count_text(guint tensors, guint values)
{
  g_autofree char *t = g_strdup_printf("%u tensor%s", tensors, tensors == 1 ? "" : "s");
  g_autofree char *v = g_strdup_printf("%u other value%s", values, values == 1 ? "" : "s");
  if (tensors && values)
    return g_strdup_printf("%s, %s", t, v);
  return g_strdup(tensors ? t : v);
}

/* What the node at depth @d (the common node) holds, each item led by what --select takes
 * for it: "under app, app.model (2 tensors) and app.optim (6 tensors, 2 other values)";
 * at the top level, its own entries are ". (N tensors of its own)". */
static char *
describe_node(GArray *entries, guint d)
{
  guint own[2] = {0, 0};
  g_autoptr(GHashTable) groups = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
  g_autofree char *prefix = NULL;
  for (guint i = 0; i < entries->len; i++) {
    const Entry *e = &g_array_index(entries, Entry, i);
    if (prefix == NULL)
      prefix = join_prefix(e->path, d);
    if (e->n == d + 1) {
      own[e->tensor ? 0 : 1]++;
      continue;
    }
    char *key = join_prefix(e->path, d + 1);
    guint *counts = g_hash_table_lookup(groups, key);
    if (counts == NULL)
      g_hash_table_insert(groups, key, counts = g_new0(guint, 2));
    else
      g_free(key);
    counts[e->tensor ? 0 : 1]++;
  }
  g_autoptr(GPtrArray) items = g_ptr_array_new_with_free_func(g_free);
  if (own[0] + own[1]) {
    g_autofree char *c = count_text(own[0], own[1]);
    g_ptr_array_add(items, g_strdup_printf("%s (%s of its own)", d ? prefix : ".", c));
  }
  g_autoptr(GList) keys = g_list_sort(g_hash_table_get_keys(groups), (GCompareFunc)strcmp);
  for (GList *k = keys; k != NULL; k = k->next) {
    const guint *counts = g_hash_table_lookup(groups, k->data);
    g_autofree char *c = count_text(counts[0], counts[1]);
    g_ptr_array_add(items, g_strdup_printf("%s (%s)", (const char *)k->data, c));
  }
  GString *s = g_string_new(NULL);
  if (d)
    g_string_append_printf(s, "under %s, ", prefix);
  else
    g_string_append(s, "at the top level, ");
  guint shown = MIN(items->len, 8);
  for (guint i = 0; i < shown; i++)
    g_string_append_printf(s, "%s%s", i == 0 ? "" : i + 1 == items->len ? " and " : ", ",
                           (const char *)items->pdata[i]);
  if (items->len > shown)
    g_string_append_printf(s, " and %u more", items->len - shown);
  return g_string_free(s, FALSE);
}

/* Drops the entries not taken and names the others by the last element of their path. */
static void
keep_entries(WsyncDcp *dcp, GArray *entries, const gboolean *take)
{
  g_hash_table_remove_all(dcp->by_name); /* its keys are the names replaced below */
  for (guint i = entries->len; i-- > 0;) {
    const Entry *e = &g_array_index(entries, Entry, i);
    if (!take[i]) {
      dcp->n_dropped++;
      if (e->tensor)
        g_array_remove_index(dcp->tensors, e->index);
      else
        g_ptr_array_remove_index(dcp->skipped, e->index);
      continue;
    }
    char *name = g_strdup(e->path[e->n - 1]);
    if (e->tensor) {
      Tensor *t = &g_array_index(dcp->tensors, Tensor, e->index);
      g_free(t->t.name);
      t->t.name = name;
    } else {
      g_free(g_ptr_array_index(dcp->skipped, e->index));
      g_ptr_array_index(dcp->skipped, e->index) = name;
    }
  }
}

/* Names the entries as the model names its tensors (docs/dcp.md §3, "Names").  A model's
 * state dict is flat (one key per tensor, dots and all), so the model is the entries
 * directly under one node of the saved state dict:
 * - with @select (a dotted path as listed; "." for the top level), the entries directly
 *   under it; every other entry is dropped, and a selection without a tensor is refused;
 * - without, the deepest node that holds every tensor (the keys above it wrap the state
 *   dict and are dropped: accelerate's {"model": sd}, slime's {"model_state": {"model":
 *   sd}}; a non-tensor value outside it is skipped), when no tensor lies below it; a node
 *   with more tensors below it (a model beside its
 *   optimizer, {"app": {"model": ..., "optim": ...}}) is refused, naming what it holds,
 *   or with @list_all keeps every name as saved and notes the refusal.
 * Sorts and indexes the tensors again. */
static gboolean
name_entries(WsyncDcp *dcp, const WsyncDcpOpenOptions *opts, GError **error)
{
  const char *select = opts != NULL ? opts->select : NULL;
  const char *key = select != NULL && strcmp(select, ".") == 0 ? "" : select;
  g_autoptr(GPtrArray) owned = g_ptr_array_new_with_free_func((GDestroyNotify)g_strfreev);
  g_autoptr(GArray) entries = list_entries(dcp, key, owned);
  guint d = model_depth(entries);
  g_autoptr(GArray) under = entries_under(entries, d);
  gboolean nested = FALSE;
  guint n_taken_tensors = 0;
  g_autofree gboolean *take = g_new0(gboolean, entries->len + 1);

  for (guint i = 0; i < entries->len; i++) {
    const Entry *e = &g_array_index(entries, Entry, i);
    nested = nested || (e->tensor && e->n > d + 1);
    if (key != NULL) {
      g_autofree char *parent = join_prefix(e->path, e->n - 1);
      take[i] = strcmp(parent, key) == 0;
    } else
      take[i] = TRUE;
    n_taken_tensors += take[i] && e->tensor;
  }
  if (key != NULL && n_taken_tensors == 0) {
    g_autofree char *held = describe_node(under, d);
    return bad_input(error, dcp->where, NULL,
                     "--select %s: no tensor of the saved state dict is directly under it (%s)",
                     select, held);
  }
  if (key == NULL && nested) {
    g_autofree char *held = describe_node(under, d);
    g_autofree char *why = g_strdup_printf(
        "the checkpoint holds more than one state dict: %s; pass --select KEY, KEY the one "
        "that is the model's (the tensors directly under it are taken)",
        held);
    if (opts == NULL || !opts->list_all)
      return bad_input(error, dcp->where, NULL, "%s", why);
    dcp->refusal = g_steal_pointer(&why);
    return finish_tensors(dcp, error); /* every name as saved */
  }
  if (key != NULL)
    dcp->wrapper = *key ? g_strdup(key) : NULL;
  else if (d > 0 && entries->len > 0)
    dcp->wrapper = join_prefix(model_entry(entries)->path, d);
  keep_entries(dcp, entries, take);
  return finish_tensors(dcp, error);
}

WsyncDcp *
wsync_dcp_parse_metadata(const guint8 *data, gsize len, const char *file, GError **error)
{
  g_return_val_if_fail(data != NULL || len == 0, NULL);
  g_return_val_if_fail(file != NULL, NULL);
  g_autoptr(WsyncPickle) pk = wsync_pickle_load(data, len, file, error);
  if (pk == NULL)
    return NULL;
  const WsyncPickleValue *root = wsync_pickle_root(pk);
  const WsyncPickleValue *state = dataclass_state(root, WSYNC_PG_METADATA);
  if (state == NULL) {
    g_autofree char *d = wsync_pickle_describe(root);
    bad_input(error, file, NULL,
              "the pickle holds %s, not a torch.distributed.checkpoint Metadata object", d);
    return NULL;
  }
  const WsyncPickleValue *sdm = wsync_pickle_dict_lookup(state, "state_dict_metadata");
  const WsyncPickleValue *sd = wsync_pickle_dict_lookup(state, "storage_data");
  if (sdm == NULL || sdm->kind != WSYNC_PICKLE_DICT) {
    bad_input(error, file, NULL, "Metadata has no state_dict_metadata dict");
    return NULL;
  }
  if (sd == NULL || sd->kind != WSYNC_PICKLE_DICT) {
    bad_input(error, file, NULL,
              "Metadata has no storage_data dict (a checkpoint not written by FileSystemWriter?)");
    return NULL;
  }

  g_autofree char *dir = g_path_get_dirname(file);
  g_autoptr(WsyncDcp) dcp = dcp_new(dir, file, WSYNC_DCP_FORMAT_TORCH_SAVE);
  g_autoptr(GHashTable) storage =
      g_hash_table_new_full(g_str_hash, g_str_equal, g_free, storage_entry_free);
  if (!read_storage_data(sd, storage, file, error))
    return NULL;

  read_planner_data(wsync_pickle_dict_lookup(state, "planner_data"), dcp->paths);

  g_autoptr(GHashTable) seen = g_hash_table_new(g_str_hash, g_str_equal);
  for (guint i = 0; i < wsync_pickle_n_items(sdm); i++) {
    const WsyncPickleValue *k = wsync_pickle_dict_key(sdm, i), *v = wsync_pickle_dict_value(sdm, i);
    if (k->kind != WSYNC_PICKLE_STR) {
      g_autofree char *d = wsync_pickle_describe(k);
      bad_input(error, file, NULL, "state_dict_metadata key %u is %s, not a str", i, d);
      return NULL;
    }
    if (!g_hash_table_add(seen, (gpointer)k->str)) {
      bad_input(error, file, k->str, "appears twice in state_dict_metadata");
      return NULL;
    }
    if (wsync_pickle_is_instance(v, WSYNC_PG_BYTES_STORAGE_METADATA)) {
      g_ptr_array_add(dcp->skipped, g_strdup(k->str));
      continue;
    }
    const WsyncPickleValue *tsm = dataclass_state(v, WSYNC_PG_TENSOR_STORAGE_METADATA);
    if (tsm == NULL) {
      g_autofree char *d = wsync_pickle_describe(v);
      bad_input(error, file, k->str,
                "is %s, not TensorStorageMetadata or BytesStorageMetadata", d);
      return NULL;
    }
    if (!read_tensor_metadata(dcp, k->str, tsm, storage, file, error))
      return NULL;
  }
  if (!finish_tensors(dcp, error))
    return NULL;
  return g_steal_pointer(&dcp);
}

/* ================================================================ format B: the archives */

/* A libzip source over memory that notes where libzip reads, so that the data offset of
 * a stored entry can be confirmed (libzip 1.7 has no call that returns it). */
#define READ_LOG 32

typedef struct {
  const guint8 *data;
  zip_uint64_t len;
  zip_uint64_t pos;
  zip_error_t error;
  gboolean recording;
  guint n_reads;
  zip_uint64_t reads[READ_LOG]; /* where the first reads since recording began started */
} MemSource;

static zip_int64_t
mem_source_callback(void *user, void *data, zip_uint64_t len, zip_source_cmd_t cmd)
{
  MemSource *ms = user;
  switch (cmd) {
  case ZIP_SOURCE_OPEN:
    ms->pos = 0;
    return 0;
  case ZIP_SOURCE_READ: {
    zip_uint64_t n = ms->pos < ms->len ? MIN(len, ms->len - ms->pos) : 0;
    if (ms->recording && ms->n_reads < READ_LOG && n > 0)
      ms->reads[ms->n_reads++] = ms->pos;
    if (n)
      memcpy(data, ms->data + ms->pos, n);
    ms->pos += n;
    return (zip_int64_t)n;
  }
  case ZIP_SOURCE_CLOSE:
    return 0;
  case ZIP_SOURCE_STAT: {
    zip_stat_t *st = data;
    zip_stat_init(st);
    st->size = ms->len;
    st->comp_size = ms->len;
    st->comp_method = ZIP_CM_STORE;
    st->encryption_method = ZIP_EM_NONE;
    st->valid =
        ZIP_STAT_SIZE | ZIP_STAT_COMP_SIZE | ZIP_STAT_COMP_METHOD | ZIP_STAT_ENCRYPTION_METHOD;
    return sizeof(*st);
  }
  case ZIP_SOURCE_ERROR:
    return zip_error_to_data(&ms->error, data, len);
  case ZIP_SOURCE_FREE:
    return 0;
  case ZIP_SOURCE_SEEK: {
    zip_int64_t at = zip_source_seek_compute_offset(ms->pos, ms->len, data, len, &ms->error);
    if (at < 0)
      return -1;
    ms->pos = (zip_uint64_t)at;
    return 0;
  }
  case ZIP_SOURCE_TELL:
    return (zip_int64_t)ms->pos;
  case ZIP_SOURCE_SUPPORTS:
    return zip_source_make_command_bitmap(ZIP_SOURCE_OPEN, ZIP_SOURCE_READ, ZIP_SOURCE_CLOSE,
                                          ZIP_SOURCE_STAT, ZIP_SOURCE_ERROR, ZIP_SOURCE_FREE,
                                          ZIP_SOURCE_SEEK, ZIP_SOURCE_TELL, ZIP_SOURCE_SUPPORTS,
                                          -1);
  default:
    zip_error_set(&ms->error, ZIP_ER_OPNOTSUPP, 0);
    return -1;
  }
}

static guint
le16(const guint8 *p)
{
  return (guint)p[0] | (guint)p[1] << 8;
}

/* Reads a small entry whole (libzip checks its CRC at the end). */
static guint8 *
read_entry(zip_t *za, zip_uint64_t index, const char *entry, guint64 max, gsize *out_len,
           const char *what, GError **error)
{
  zip_stat_t st;
  if (zip_stat_index(za, index, 0, &st) != 0 || !(st.valid & ZIP_STAT_SIZE)) {
    bad_input(error, what, NULL, "entry \"%s\": %s", entry, zip_strerror(za));
    return NULL;
  }
  if (st.size > max) {
    bad_input(error, what, NULL,
              "entry \"%s\" is %" G_GUINT64_FORMAT " bytes, more than %" G_GUINT64_FORMAT, entry,
              (guint64)st.size, max);
    return NULL;
  }
  zip_file_t *zf = zip_fopen_index(za, index, 0);
  if (zf == NULL) {
    bad_input(error, what, NULL, "entry \"%s\" cannot be read: %s", entry, zip_strerror(za));
    return NULL;
  }
  guint8 *buf = g_malloc(st.size + 1);
  zip_int64_t n = zip_fread(zf, buf, st.size);
  guint8 extra;
  zip_int64_t more = n == (zip_int64_t)st.size ? zip_fread(zf, &extra, 1) : 0;
  if (n != (zip_int64_t)st.size || more != 0) {
    bad_input(error, what, NULL, "entry \"%s\" cannot be read: %s", entry,
              zip_file_strerror(zf));
    zip_fclose(zf);
    g_free(buf);
    return NULL;
  }
  zip_fclose(zf);
  *out_len = st.size;
  return buf;
}

/* The storage's dtype and element count from the persistent id
 * ('storage', torch.XStorage, key, location, numel). */
static gboolean
read_persistent_id(const WsyncPickleValue *pid, gboolean v3, const WsyncPickleValue *v3_dtype,
                   WsyncDcpBlob *out, const char **key, const char *what, GError **error)
{
  const WsyncPickleValue *id = pid->kind == WSYNC_PICKLE_PERSID ? pid->args : NULL;
  if (id == NULL || id->kind != WSYNC_PICKLE_TUPLE || wsync_pickle_n_items(id) != 5)
    return bad_input(error, what, NULL,
                     "data.pkl: the storage is not a persistent id ('storage', class, key, "
                     "location, numel)");
  const WsyncPickleValue *tag = wsync_pickle_item(id, 0), *cls = wsync_pickle_item(id, 1),
                         *k = wsync_pickle_item(id, 2), *loc = wsync_pickle_item(id, 3),
                         *numel = wsync_pickle_item(id, 4);
  if (tag->kind != WSYNC_PICKLE_STR || strcmp(tag->str, "storage") != 0 ||
      k->kind != WSYNC_PICKLE_STR || loc->kind != WSYNC_PICKLE_STR ||
      numel->kind != WSYNC_PICKLE_INT || numel->integer < 0 || cls->kind != WSYNC_PICKLE_GLOBAL)
    return bad_input(error, what, NULL,
                     "data.pkl: the storage is not a persistent id ('storage', class, key, "
                     "location, numel)");
  if (k->len == 0 || k->len > 20 || strspn(k->str, "0123456789") != k->len) {
    /* escaped: the key is the pickle's bytes, and a message is one printable line */
    g_autofree char *pkey = k->len <= 20 ? wsync_json_printable(k->str) : g_strdup("(long)");
    return bad_input(error, what, NULL, "data.pkl: storage key \"%s\" is not a decimal number",
                     pkey);
  }
  *key = k->str;
  guint64 count = (guint64)numel->integer;
  if (!v3) {
    if (cls->global != WSYNC_PG_TYPED_STORAGE)
      return bad_input(error, what, NULL,
                       "data.pkl: _rebuild_tensor_v2 of a %s.%s, not a typed storage", cls->module,
                       cls->name);
    if (!cls->has_dtype)
      return bad_input(error, what, NULL, "data.pkl: storage class %s.%s has no safetensors dtype",
                       cls->module, cls->name);
    out->dtype = cls->dtype;
    out->storage_numel = count;
  } else {
    if (cls->global != WSYNC_PG_UNTYPED_STORAGE)
      return bad_input(error, what, NULL,
                       "data.pkl: _rebuild_tensor_v3 of a %s.%s, not an UntypedStorage",
                       cls->module, cls->name);
    if (v3_dtype->kind != WSYNC_PICKLE_GLOBAL || v3_dtype->global != WSYNC_PG_DTYPE)
      return bad_input(error, what, NULL, "data.pkl: _rebuild_tensor_v3 without a torch dtype");
    if (!v3_dtype->has_dtype)
      return bad_input(error, what, NULL, "data.pkl: dtype %s.%s has no safetensors equivalent",
                       v3_dtype->module, v3_dtype->name);
    out->dtype = v3_dtype->dtype;
    guint es = wsync_dtype_size(out->dtype);
    if (count % es)
      return bad_input(error, what, NULL,
                       "data.pkl: an UntypedStorage of %" G_GUINT64_FORMAT
                       " bytes is not a whole number of %s elements",
                       count, wsync_dtype_name(out->dtype));
    out->storage_numel = count / es;
  }
  if (!g_uint64_checked_mul(&out->data_len, out->storage_numel, wsync_dtype_size(out->dtype)))
    return bad_input(error, what, NULL, "data.pkl: storage size overflows 64 bits");
  return TRUE;
}

/* data.pkl: _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
 * backward_hooks[, metadata]) or _rebuild_tensor_v3(..., backward_hooks, dtype[,
 * metadata]). */
static gboolean
read_data_pkl(const WsyncPickleValue *root, WsyncDcpBlob *out, const char **key, const char *what,
              GError **error)
{
  gboolean v2 = wsync_pickle_is_instance(root, WSYNC_PG_REBUILD_TENSOR_V2);
  gboolean v3 = wsync_pickle_is_instance(root, WSYNC_PG_REBUILD_TENSOR_V3);
  if ((!v2 && !v3) || root->state != NULL) {
    g_autofree char *d = wsync_pickle_describe(root);
    return bad_input(error, what, NULL, "data.pkl holds %s, not one tensor (_rebuild_tensor_v2)",
                     d);
  }
  const WsyncPickleValue *args = root->args;
  guint n = wsync_pickle_n_items(args), base = v3 ? 7 : 6;
  if (n != base && n != base + 1)
    return bad_input(error, what, NULL, "data.pkl: %s with %u arguments, not %u",
                     root->cls->name, n, base);
  if (n == base + 1) {
    const WsyncPickleValue *meta = wsync_pickle_item(args, base);
    if (meta->kind != WSYNC_PICKLE_DICT || wsync_pickle_n_items(meta) != 0)
      return bad_input(error, what, NULL,
                       "data.pkl: the tensor carries metadata (%s); not supported",
                       meta->kind == WSYNC_PICKLE_DICT ? "a non-empty dict" : "not a dict");
  }
  const WsyncPickleValue *offset = wsync_pickle_item(args, 1), *size = wsync_pickle_item(args, 2),
                         *stride = wsync_pickle_item(args, 3), *grad = wsync_pickle_item(args, 4),
                         *hooks = wsync_pickle_item(args, 5);
  if (offset->kind != WSYNC_PICKLE_INT || offset->integer < 0)
    return bad_input(error, what, NULL, "data.pkl: storage offset is not a non-negative int");
  out->storage_offset = (guint64)offset->integer;
  guint n_stride = 0;
  if (!get_dims(size, &out->ndim, out->size) || !get_dims(stride, &n_stride, out->stride) ||
      n_stride != out->ndim)
    return bad_input(error, what, NULL,
                     "data.pkl: size and stride are not tuples of the same length (at most %d) "
                     "of non-negative ints",
                     WSYNC_MAX_DIMS);
  if (grad->kind != WSYNC_PICKLE_BOOL)
    return bad_input(error, what, NULL, "data.pkl: requires_grad is not a bool");
  if (hooks->kind != WSYNC_PICKLE_DICT || wsync_pickle_n_items(hooks) != 0)
    return bad_input(error, what, NULL, "data.pkl: backward hooks are not an empty OrderedDict");
  return read_persistent_id(wsync_pickle_item(args, 0), v3, v3 ? wsync_pickle_item(args, 6) : NULL,
                            out, key, what, error);
}

/* Size and stride must stay inside the storage. */
static gboolean
check_view(const WsyncDcpBlob *b, const char *what, GError **error)
{
  guint64 numel = 1;
  for (guint d = 0; d < b->ndim; d++)
    if (!g_uint64_checked_mul(&numel, numel, b->size[d]))
      return bad_input(error, what, NULL, "data.pkl: the size overflows 64 bits");
  if (numel == 0)
    return TRUE;
  guint64 last = b->storage_offset;
  for (guint d = 0; d < b->ndim; d++) {
    guint64 step;
    if (!g_uint64_checked_mul(&step, b->size[d] - 1, b->stride[d]) ||
        !g_uint64_checked_add(&last, last, step))
      return bad_input(error, what, NULL, "data.pkl: the view overflows 64 bits");
  }
  if (last >= b->storage_numel) {
    g_autofree char *size = wsync_shape_format(b->ndim, b->size);
    g_autofree char *stride = wsync_shape_format(b->ndim, b->stride);
    return bad_input(error, what, NULL,
                     "data.pkl: size %s, stride %s and storage offset %" G_GUINT64_FORMAT
                     " reach element %" G_GUINT64_FORMAT " of a storage of %" G_GUINT64_FORMAT,
                     size, stride, b->storage_offset, last, b->storage_numel);
  }
  return TRUE;
}

/* Finds the entry named @name exactly; refuses a name that appears twice. */
static gboolean
find_entry(zip_t *za, zip_int64_t n, const char *name, zip_int64_t *index, const char *what,
           GError **error)
{
  *index = -1;
  for (zip_int64_t i = 0; i < n; i++) {
    const char *e = zip_get_name(za, (zip_uint64_t)i, ZIP_FL_ENC_RAW);
    if (e == NULL || strcmp(e, name) != 0)
      continue;
    if (*index >= 0)
      return bad_input(error, what, NULL, "the archive has two entries \"%s\"", name);
    *index = i;
  }
  return TRUE;
}

/* Where the bytes of stored entry @index begin: its local header, found where libzip
 * read it, parsed here, and checked against where libzip then read the data. */
static gboolean
locate_stored_data(zip_t *za, zip_uint64_t index, const char *name, guint64 size, MemSource *ms,
                   guint64 *data_offset, const char *what, GError **error)
{
  ms->n_reads = 0;
  ms->recording = TRUE;
  zip_file_t *zf = zip_fopen_index(za, index, 0);
  guint8 first = 0;
  zip_int64_t got = zf ? zip_fread(zf, &first, 1) : -1;
  ms->recording = FALSE;
  if (zf == NULL || got != 1) {
    g_autofree char *msg = g_strdup(zf ? zip_file_strerror(zf) : zip_strerror(za));
    if (zf)
      zip_fclose(zf);
    return bad_input(error, what, NULL, "entry \"%s\" cannot be read: %s", name, msg);
  }
  zip_fclose(zf);

  /* libzip reads some part of the 30-byte header (1.7 reads its name and extra lengths at
   * +26; later versions read it whole): a header that starts within 30 bytes before a
   * read, carries the entry's name, and whose data libzip then read, is the one. */
  gsize name_len = strlen(name);
  for (guint r = 0; r < ms->n_reads * 30; r++) {
    guint64 read_at = ms->reads[r / 30], back = r % 30;
    if (read_at < back)
      continue;
    guint64 at = read_at - back;
    if (at > ms->len || ms->len - at < 30 || memcmp(ms->data + at, "PK\003\004", 4) != 0)
      continue;
    const guint8 *h = ms->data + at;
    guint flags = le16(h + 6), method = le16(h + 8), n_name = le16(h + 26), n_extra = le16(h + 28);
    if (n_name != name_len || ms->len - at - 30 < n_name ||
        memcmp(h + 30, name, name_len) != 0)
      continue;
    if (flags & 1)
      return bad_input(error, what, NULL, "entry \"%s\" is encrypted", name);
    if (method != 0)
      return bad_input(error, what, NULL,
                       "entry \"%s\" is compressed (method %u in its local header); only stored "
                       "entries are supported",
                       name, method);
    guint64 begin = at + 30 + n_name + n_extra;
    if (begin > ms->len || size > ms->len - begin)
      return bad_input(error, what, NULL,
                       "entry \"%s\": its %" G_GUINT64_FORMAT " bytes from byte %" G_GUINT64_FORMAT
                       " pass the end of the archive (%" G_GUINT64_FORMAT " bytes)",
                       name, size, begin, (guint64)ms->len);
    for (guint k = 0; k < ms->n_reads; k++)
      if (ms->reads[k] == begin && ms->data[begin] == first) {
        *data_offset = begin;
        return TRUE;
      }
  }
  return bad_input(error, what, NULL,
                   "entry \"%s\": cannot confirm where its data begins (the local header does not "
                   "match what libzip read)",
                   name);
}

/* Everything after libzip opened the archive. */
static gboolean
read_archive(zip_t *za, MemSource *ms, const char *what, WsyncDcpBlob *out, GError **error)
{
  zip_int64_t n = zip_get_num_entries(za, 0);
  if (n < 0 || n > WSYNC_DCP_MAX_ZIP_ENTRIES)
    return bad_input(error, what, NULL,
                     "the archive has %" G_GINT64_FORMAT " entries, more than %d", (gint64)n,
                     WSYNC_DCP_MAX_ZIP_ENTRIES);

  /* The one "DIR/data.pkl" (torch's archive name is the directory; DCP's is "archive"). */
  zip_int64_t pkl_index = -1;
  g_autofree char *prefix = NULL;
  for (zip_int64_t i = 0; i < n; i++) {
    const char *e = zip_get_name(za, (zip_uint64_t)i, ZIP_FL_ENC_RAW);
    const char *slash = e ? strchr(e, '/') : NULL;
    if (slash == NULL || slash == e || strcmp(slash, "/data.pkl") != 0)
      continue;
    if (pkl_index >= 0)
      return bad_input(error, what, NULL, "the archive has two data.pkl records");
    pkl_index = i;
    prefix = g_strndup(e, (gsize)(slash - e + 1));
  }
  if (pkl_index < 0)
    return bad_input(error, what, NULL,
                     "the archive has no DIR/data.pkl record: not a torch.save archive");
  gsize pkl_len = 0;
  g_autofree char *pkl_entry = g_strconcat(prefix, "data.pkl", NULL);
  g_autofree guint8 *pkl = read_entry(za, (zip_uint64_t)pkl_index, pkl_entry,
                                      WSYNC_DCP_MAX_DATA_PKL, &pkl_len, what, error);
  if (pkl == NULL)
    return FALSE;
  g_autofree char *pkl_what = g_strdup_printf("%s: %s", what, pkl_entry);
  g_autoptr(WsyncPickle) pk = wsync_pickle_load(pkl, pkl_len, pkl_what, error);
  if (pk == NULL)
    return FALSE;
  const char *key = NULL;
  if (!read_data_pkl(wsync_pickle_root(pk), out, &key, what, error) ||
      !check_view(out, what, error))
    return FALSE;

  /* byteorder: absent in old archives (little-endian then); else it must be "little". */
  g_autofree char *bo_name = g_strconcat(prefix, "byteorder", NULL);
  zip_int64_t bo_index;
  if (!find_entry(za, n, bo_name, &bo_index, what, error))
    return FALSE;
  if (bo_index >= 0) {
    gsize bo_len;
    g_autofree guint8 *bo =
        read_entry(za, (zip_uint64_t)bo_index, bo_name, 16, &bo_len, what, error);
    if (bo == NULL)
      return FALSE;
    if (bo_len != 6 || memcmp(bo, "little", 6) != 0) {
      bo[bo_len] = '\0';
      g_autofree char *p = wsync_json_printable((const char *)bo);
      return bad_input(error, what, NULL,
                       "byteorder is \"%s\"; only little-endian archives are supported", p);
    }
  }

  g_autofree char *data_name = g_strconcat(prefix, "data/", key, NULL);
  zip_int64_t data_index;
  if (!find_entry(za, n, data_name, &data_index, what, error))
    return FALSE;
  if (data_index < 0)
    return bad_input(error, what, NULL, "the archive has no entry \"%s\" for its storage",
                     data_name);
  zip_stat_t st;
  if (zip_stat_index(za, (zip_uint64_t)data_index, 0, &st) != 0)
    return bad_input(error, what, NULL, "entry \"%s\": %s", data_name, zip_strerror(za));
  const zip_uint64_t need =
      ZIP_STAT_SIZE | ZIP_STAT_COMP_SIZE | ZIP_STAT_COMP_METHOD | ZIP_STAT_ENCRYPTION_METHOD;
  if ((st.valid & need) != need)
    return bad_input(error, what, NULL, "entry \"%s\": libzip gives no size or method", data_name);
  if (st.comp_method != ZIP_CM_STORE)
    return bad_input(error, what, NULL,
                     "entry \"%s\" is compressed (method %u); only stored entries are supported, "
                     "so that the data is a plain byte range",
                     data_name, (guint)st.comp_method);
  if (st.encryption_method != ZIP_EM_NONE)
    return bad_input(error, what, NULL, "entry \"%s\" is encrypted", data_name);
  if (st.size != st.comp_size || st.size != out->data_len)
    return bad_input(error, what, NULL,
                     "entry \"%s\" is %" G_GUINT64_FORMAT
                     " bytes but the storage of %" G_GUINT64_FORMAT " %s elements needs %"
                     G_GUINT64_FORMAT,
                     data_name, (guint64)st.size, out->storage_numel, wsync_dtype_name(out->dtype),
                     out->data_len);
  if (st.size > 0 && !locate_stored_data(za, (zip_uint64_t)data_index, data_name, st.size, ms,
                                         &out->data_offset, what, error))
    return FALSE;
  return TRUE;
}

gboolean
wsync_dcp_read_blob(const guint8 *blob, gsize len, const char *what, WsyncDcpBlob *out,
                    GError **error)
{
  g_return_val_if_fail(blob != NULL || len == 0, FALSE);
  g_return_val_if_fail(what != NULL && out != NULL, FALSE);
  memset(out, 0, sizeof *out);
  if (len < 22) /* the end-of-central-directory record alone is 22 bytes */
    return bad_input(error, what, NULL,
                     "%" G_GSIZE_FORMAT " bytes, too short for a torch.save zip archive", len);

  MemSource ms = {.data = blob, .len = len};
  zip_error_init(&ms.error);
  zip_error_t zerr;
  zip_error_init(&zerr);
  zip_source_t *src = zip_source_function_create(mem_source_callback, &ms, &zerr);
  zip_t *za = NULL;
  if (src != NULL) {
    za = zip_open_from_source(src, ZIP_RDONLY | ZIP_CHECKCONS, &zerr);
    if (za == NULL)
      zip_source_free(src);
  }
  gboolean ok;
  if (za == NULL) {
    ok = bad_input(error, what, NULL, "not a torch.save zip archive (libzip: %s)",
                   zip_error_strerror(&zerr));
  } else {
    ok = read_archive(za, &ms, what, out, error);
    zip_discard(za);
  }
  zip_error_fini(&zerr);
  zip_error_fini(&ms.error);
  return ok;
}

/* ================================================================ format B: open */

static gboolean
relative_path_ok(const char *p)
{
  return *p != '\0' && strcmp(p, ".") != 0 && strcmp(p, "..") != 0 && strchr(p, '/') == NULL;
}

/* Maps DIR/@relative_path once.  Errors name @where (the metadata that recorded the
 * chunk), the tensor and the chunk. */
static MappedFile *
get_map(WsyncDcp *dcp, const char *relative_path, const char *where, const char *fqn,
        const char *box, GError **error)
{
  MappedFile *mf = g_hash_table_lookup(dcp->maps, relative_path);
  if (mf)
    return mf;
  g_autofree char *prel = wsync_json_printable(relative_path);
  if (!relative_path_ok(relative_path)) {
    bad_input(error, where, fqn,
              "chunk %s: relative_path \"%s\" is not a file name inside the checkpoint", box, prel);
    return NULL;
  }
  g_autofree char *path = g_build_filename(dcp->dir, relative_path, NULL);
  /* stat()ed and judged before it is opened, then fstat()ed, and not read if another
   * file was swapped in between (core/filekind.h wsync_file_open_judged()): a FIFO, a
   * device and a socket are refused alike, below, without being opened */
  struct stat sb;
  const char *special;
  int fd = wsync_file_open_input(path, &sb, &special);
  if (fd < 0 && special == NULL) {
    int errsv = errno;
    if (errsv == ENOENT)
      bad_input(error, where, fqn, "chunk %s: its data file \"%s\" is missing", box, prel);
    else
      wsync_set_io_error(error, errsv, path, "open");
    return NULL;
  }
  if (fd < 0 || !S_ISREG(sb.st_mode) || (guint64)sb.st_size > G_MAXSIZE) {
    bad_input(error, where, fqn, "chunk %s: \"%s\" is not a regular file that can be mapped", box,
              prel);
    if (fd >= 0)
      close(fd);
    return NULL;
  }
  mf = g_new0(MappedFile, 1);
  mf->path = g_steal_pointer(&path);
  mf->len = (gsize)sb.st_size;
  if (mf->len > 0) {
    void *map = mmap(NULL, mf->len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      wsync_set_io_error(error, errno, mf->path, "map");
      close(fd);
      mapped_file_free(mf);
      return NULL;
    }
    mf->data = map;
  }
  close(fd);
  g_hash_table_insert(dcp->maps, g_strdup(relative_path), mf);
  return mf;
}

/* Does @mf hold a safetensors blob at @offset rather than a torch.save archive?
 * SerializationFormat.SAFETENSORS with a plain FileSystemWriter writes no archive per
 * tensor but one safetensors blob after the file's non-tensor items, and records the
 * stream position before that blob as every tensor's offset (docs/dcp.md §3).  The two
 * cannot be confused: a torch.save archive begins with a zip local header ("PK\3\4"), a
 * safetensors file with its header's length (8 bytes, little-endian) and then the JSON
 * header's '{'. */
static gboolean
holds_safetensors_blob(const MappedFile *mf, guint64 offset)
{
  if (mf->data == NULL || offset > mf->len || mf->len - offset < 10)
    return FALSE;
  const guint8 *p = mf->data + offset;
  if (memcmp(p, "PK\003\004", 4) == 0)
    return FALSE;
  guint64 n = 0;
  for (guint i = 8; i > 0; i--)
    n = n << 8 | p[i - 1];
  return n >= 2 && n <= mf->len - offset - 8 && p[8] == '{';
}

/* Binds every chunk of a parsed .metadata (or of the merged per-rank metadata) to its
 * bytes. */
static gboolean
resolve_chunks(WsyncDcp *dcp, GError **error)
{
  for (guint i = 0; i < dcp->tensors->len; i++) {
    Tensor *t = &g_array_index(dcp->tensors, Tensor, i);
    guint es = wsync_dtype_size(t->t.dtype);
    for (guint c = 0; c < t->t.chunks->len; c++) {
      WsyncDcpChunk *chunk = &g_array_index(t->t.chunks, WsyncDcpChunk, c);
      const StorageRef *ref = &g_array_index(t->refs, StorageRef, c);
      const char *where = ref->meta ? ref->meta : dcp->where;
      g_autofree char *box = wsync_box_format(&chunk->box);
      MappedFile *mf = get_map(dcp, ref->relative_path, where, t->t.name, box, error);
      if (mf == NULL)
        return FALSE;
      g_autofree char *pname = wsync_json_printable(mf->path);
      if (holds_safetensors_blob(mf, ref->offset))
        return bad_input(error, mf->path, t->t.name,
                         "chunk %s: a safetensors blob at byte %" G_GUINT64_FORMAT
                         ", not a torch.save archive: the checkpoint was written with "
                         "SerializationFormat.SAFETENSORS, which wsync does not read (it reads "
                         "the default TORCH_SAVE, and HuggingFaceStorageWriter's shards)",
                         box, ref->offset);
      if (ref->offset > mf->len || ref->length > mf->len - ref->offset)
        return bad_input(error, where, t->t.name,
                         "chunk %s: bytes [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                         ") pass the end of %s (%" G_GSIZE_FORMAT " bytes)",
                         box, ref->offset, ref->offset + ref->length, pname, mf->len);
      g_autofree char *ptensor = wsync_json_printable(t->t.name);
      g_autofree char *what =
          g_strdup_printf("%s: tensor \"%s\": chunk %s: archive at byte %" G_GUINT64_FORMAT, pname,
                          ptensor, box, ref->offset);
      WsyncDcpBlob b;
      const guint8 *base = mf->data ? mf->data + ref->offset : (const guint8 *)"";
      if (!wsync_dcp_read_blob(base, ref->length, what, &b, error))
        return FALSE;
      if (b.dtype != t->t.dtype)
        return bad_input(error, what, NULL, "holds %s data but the metadata says %s",
                         wsync_dtype_name(b.dtype), wsync_dtype_name(t->t.dtype));
      gboolean same = b.ndim == chunk->box.ndim;
      for (guint d = 0; same && d < b.ndim; d++)
        same = b.size[d] == chunk->box.extent[d];
      if (!same) {
        g_autofree char *size = wsync_shape_format(b.ndim, b.size);
        g_autofree char *want = wsync_shape_format(chunk->box.ndim, chunk->box.extent);
        return bad_input(error, what, NULL, "holds a tensor of size %s but the chunk's size is %s",
                         size, want);
      }
      guint64 numel = wsync_box_volume(&chunk->box);
      chunk->data = base + b.data_offset + (numel ? b.storage_offset * es : 0);
      chunk->file = mf->path;
      memset(&chunk->region, 0, sizeof chunk->region);
      memcpy(chunk->region.stride, b.stride, sizeof b.stride);
    }
  }
  return TRUE;
}

/* Maps and parses one format B metadata file. */
static WsyncDcp *
parse_metadata_file(const char *path, GError **error)
{
  g_autoptr(GMappedFile) mf = NULL;
  GError *local = NULL;
  struct stat sb;
  const char *special;
  /* not a regular file (a directory, a FIFO, a socket): bad input, said once.  Judged
   * as it is opened (core/filekind.h): a FIFO is never opened, and one put in place of
   * the file after the stat() is refused, not waited on (a g_file_test() before
   * g_mapped_file_new(), whose open(2) blocks, hung for ever on it). */
  int fd = wsync_file_open_input(path, &sb, &special);
  if (fd < 0 && special == NULL) {
    wsync_set_io_error(error, errno, path, "read"); /* "cannot read PATH", made printable */
    return NULL;
  }
  if (fd < 0 || !S_ISREG(sb.st_mode)) {
    g_autofree char *p = wsync_json_printable(path);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT, "%s: not a regular file", p);
    if (fd >= 0)
      close(fd);
    return NULL;
  }
  mf = g_mapped_file_new_from_fd(fd, FALSE, &local);
  close(fd); /* a mapping outlives its descriptor */
  if (mf == NULL) {
    g_autofree char *p = wsync_json_printable(path);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_IO, "cannot read %s: %s", p, local->message);
    g_error_free(local);
    return NULL;
  }
  const guint8 *data = (const guint8 *)g_mapped_file_get_contents(mf);
  gsize len = g_mapped_file_get_length(mf);
  return wsync_dcp_parse_metadata(data ? data : (const guint8 *)"", len, path, error);
}

static WsyncDcp *
open_b(const char *dir, const WsyncDcpOpenOptions *opts, GError **error)
{
  g_autofree char *path = g_build_filename(dir, WSYNC_DCP_METADATA_NAME, NULL);
  g_autoptr(WsyncDcp) dcp = parse_metadata_file(path, error);
  if (dcp == NULL)
    return NULL;
  g_free(dcp->dir);
  dcp->dir = g_strdup(dir);
  if (!name_entries(dcp, opts, error) || !resolve_chunks(dcp, error))
    return NULL;
  return g_steal_pointer(&dcp);
}

/* ================================================================ format B, per-rank metadata */

/* A rank as torch writes it in a file name (f"__{rank}..."): decimal, no sign, no
 * leading zero. */
static gboolean
parse_rank(const char **p, guint *rank)
{
  guint64 v = 0;
  guint digits = 0;
  const char *s = *p;
  while (g_ascii_isdigit(s[digits])) {
    if (digits == 9)
      return FALSE;
    v = v * 10 + (guint64)(s[digits++] - '0');
  }
  if (digits == 0 || (digits > 1 && s[0] == '0'))
    return FALSE;
  *rank = (guint)v;
  *p = s + digits;
  return TRUE;
}

/* "__R.metadata": the metadata rank R writes with use_collectives=False. */
static gboolean
parse_rank_metadata_name(const char *name, guint *rank)
{
  const char *p = name;
  return g_str_has_prefix(p, "__") && (p += 2, parse_rank(&p, rank)) &&
         strcmp(p, WSYNC_DCP_RANK_METADATA_SUFFIX) == 0;
}

/* "__R_K.distcp": file K of rank R (docs/dcp.md §3). */
static gboolean
parse_data_file_name(const char *name, guint *rank)
{
  const char *p = name;
  guint k;
  return g_str_has_prefix(p, "__") && (p += 2, parse_rank(&p, rank)) && *p++ == '_' &&
         parse_rank(&p, &k) && strcmp(p, ".distcp") == 0;
}

static gint
compare_guint(gconstpointer x, gconstpointer y)
{
  guint a = *(const guint *)x, b = *(const guint *)y;
  return a < b ? -1 : a > b;
}

/* The ranks of @dir's __R.metadata files and of its __R_K.distcp files, each sorted,
 * without repeats.  An unreadable directory has none. */
static void
list_ranks(const char *dir, GArray *meta_ranks, GArray *data_ranks)
{
  GDir *d = g_dir_open(dir, 0, NULL);
  if (d == NULL)
    return;
  const char *name;
  guint r;
  while ((name = g_dir_read_name(d)) != NULL) {
    if (parse_rank_metadata_name(name, &r))
      g_array_append_val(meta_ranks, r);
    else if (parse_data_file_name(name, &r))
      g_array_append_val(data_ranks, r);
  }
  g_dir_close(d);
  GArray *both[] = {meta_ranks, data_ranks};
  for (guint k = 0; k < 2; k++) {
    GArray *a = both[k];
    g_array_sort(a, compare_guint);
    guint n = 0;
    for (guint i = 0; i < a->len; i++)
      if (n == 0 || g_array_index(a, guint, i) != g_array_index(a, guint, n - 1))
        g_array_index(a, guint, n++) = g_array_index(a, guint, i);
    g_array_set_size(a, n);
  }
}

/* Adds the tensors and chunks of one rank's parsed metadata (@one, read from @meta) to
 * @all.  The ranks must agree on a tensor's dtype and global shape. */
static gboolean
merge_rank(WsyncDcp *all, WsyncDcp *one, const char *meta, GError **error)
{
  for (guint i = 0; i < one->tensors->len; i++) {
    const Tensor *src = &g_array_index(one->tensors, Tensor, i);
    gboolean created;
    Tensor *t = tensor_get(all, src->t.name, &created);
    if (created) {
      t->t.dtype = src->t.dtype;
      t->t.ndim = src->t.ndim;
      memcpy(t->t.shape, src->t.shape, sizeof t->t.shape);
      t->shape_stored = TRUE;
      t->meta = meta;
      t->refs = g_array_new(FALSE, TRUE, sizeof(StorageRef));
      g_array_set_clear_func(t->refs, storage_ref_clear);
    } else {
      g_autofree char *first = wsync_json_printable(t->meta);
      if (t->t.dtype != src->t.dtype)
        return bad_input(error, meta, src->t.name, "dtype %s, but %s in %s",
                         wsync_dtype_name(src->t.dtype), wsync_dtype_name(t->t.dtype), first);
      gboolean same = t->t.ndim == src->t.ndim;
      for (guint d = 0; same && d < t->t.ndim; d++)
        same = t->t.shape[d] == src->t.shape[d];
      if (!same) {
        g_autofree char *here = wsync_shape_format(src->t.ndim, src->t.shape);
        g_autofree char *there = wsync_shape_format(t->t.ndim, t->t.shape);
        return bad_input(error, meta, src->t.name,
                         "global shape %s, but %s in %s: the ranks' metadata disagree", here,
                         there, first);
      }
    }
    for (guint c = 0; c < src->t.chunks->len; c++) {
      const StorageRef *from = &g_array_index(src->refs, StorageRef, c);
      StorageRef ref = {g_strdup(from->relative_path), from->offset, from->length, meta};
      g_array_append_val(t->t.chunks, g_array_index(src->t.chunks, WsyncDcpChunk, c));
      g_array_append_val(t->refs, ref);
    }
  }
  /* planner_data: the union of the ranks' (each lists only its own entries) */
  GHashTableIter iter;
  gpointer key, path;
  g_hash_table_iter_init(&iter, one->paths);
  while (g_hash_table_iter_next(&iter, &key, &path))
    if (!g_hash_table_contains(all->paths, key))
      g_hash_table_insert(all->paths, g_strdup(key), g_strdupv(path));
  for (guint i = 0; i < one->skipped->len; i++) {
    const char *name = g_ptr_array_index(one->skipped, i);
    gboolean seen = FALSE;
    for (guint j = 0; j < all->skipped->len && !seen; j++)
      seen = strcmp(g_ptr_array_index(all->skipped, j), name) == 0;
    if (!seen)
      g_ptr_array_add(all->skipped, g_strdup(name));
  }
  return TRUE;
}

/* Refuses a missing rank: torch names every rank's metadata __R.metadata, from rank 0
 * (filesystem.py's _get_metadata_path), so the ranks must be 0, 1, ..., n-1, and a rank
 * that wrote data files wrote its metadata too. */
static gboolean
check_ranks(const char *dir, GArray *meta_ranks, GArray *data_ranks, GError **error)
{
  guint n = meta_ranks->len;
  guint last = g_array_index(meta_ranks, guint, n - 1);
  for (guint k = 0; k < n; k++)
    if (g_array_index(meta_ranks, guint, k) != k) {
      g_autofree char *name = g_strdup_printf("__%u" WSYNC_DCP_RANK_METADATA_SUFFIX, k);
      g_autofree char *path = g_build_filename(dir, name, NULL);
      return bad_input(error, path, NULL,
                       "missing, but __%u" WSYNC_DCP_RANK_METADATA_SUFFIX
                       " is there: a checkpoint saved with use_collectives=False has one "
                       "__R.metadata per rank, from __0.metadata on",
                       last);
    }
  for (guint k = 0; k < data_ranks->len; k++) {
    guint r = g_array_index(data_ranks, guint, k);
    if (r >= n) {
      g_autofree char *name = g_strdup_printf("__%u" WSYNC_DCP_RANK_METADATA_SUFFIX, r);
      g_autofree char *path = g_build_filename(dir, name, NULL);
      return bad_input(error, path, NULL,
                       "missing, but rank %u's data files (__%u_K.distcp) are there: a "
                       "checkpoint saved with use_collectives=False has one __R.metadata per "
                       "rank",
                       r, r);
    }
  }
  return TRUE;
}

/* Format B saved with use_collectives=False: every rank's __R.metadata, merged. */
static WsyncDcp *
open_b_ranks(const char *dir, GArray *meta_ranks, GArray *data_ranks,
             const WsyncDcpOpenOptions *opts, GError **error)
{
  if (!check_ranks(dir, meta_ranks, data_ranks, error))
    return NULL;
  g_autofree char *where = g_build_filename(dir, "__*" WSYNC_DCP_RANK_METADATA_SUFFIX, NULL);
  g_autoptr(WsyncDcp) dcp = dcp_new(dir, where, WSYNC_DCP_FORMAT_TORCH_SAVE);
  for (guint r = 0; r < meta_ranks->len; r++) {
    g_autofree char *name = g_strdup_printf("__%u" WSYNC_DCP_RANK_METADATA_SUFFIX, r);
    char *path = g_build_filename(dir, name, NULL);
    g_ptr_array_add(dcp->meta_files, path);
    g_autoptr(WsyncDcp) one = parse_metadata_file(path, error);
    if (one == NULL || !merge_rank(dcp, one, path, error))
      return NULL;
  }
  if (!name_entries(dcp, opts, error) || !resolve_chunks(dcp, error))
    return NULL;
  return g_steal_pointer(&dcp);
}

/* ================================================================ detect and open */

/* A .metadata of any kind: one that is not a regular file (a FIFO, a socket) is refused
 * naming it when it is read (parse_metadata_file()), not taken for a missing one. */
static gboolean
has_metadata(const char *dir)
{
  g_autofree char *path = g_build_filename(dir, WSYNC_DCP_METADATA_NAME, NULL);
  return g_file_test(path, G_FILE_TEST_EXISTS);
}

static gboolean
has_shards(const char *dir)
{
  GDir *d = g_dir_open(dir, 0, NULL);
  if (d == NULL)
    return FALSE;
  const char *name;
  gboolean found = FALSE;
  guint64 s, i, n;
  while (!found && (name = g_dir_read_name(d)) != NULL)
    found = parse_shard_name(name, &s, &i, &n);
  g_dir_close(d);
  return found;
}

gboolean
wsync_dcp_detect(const char *dir)
{
  g_return_val_if_fail(dir != NULL, FALSE);
  if (!g_file_test(dir, G_FILE_TEST_IS_DIR))
    return FALSE;
  g_autofree char *sub = g_build_filename(dir, WSYNC_DCP_SHARDED_DIR, NULL);
  if (has_metadata(dir) || has_shards(dir) || has_shards(sub))
    return TRUE;
  g_autoptr(GArray) meta_ranks = g_array_new(FALSE, FALSE, sizeof(guint));
  g_autoptr(GArray) data_ranks = g_array_new(FALSE, FALSE, sizeof(guint));
  list_ranks(dir, meta_ranks, data_ranks);
  return meta_ranks->len > 0 || data_ranks->len > 0;
}

static gint
compare_strings(gconstpointer a, gconstpointer b)
{
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The names of the entries of @dir whose path @accept takes, sorted. */
static GPtrArray *
list_dir_names(const char *dir, gboolean (*accept)(const char *name, const char *path))
{
  GPtrArray *found = g_ptr_array_new_with_free_func(g_free);
  GDir *d = g_dir_open(dir, 0, NULL);
  if (d == NULL)
    return found;
  const char *name;
  while ((name = g_dir_read_name(d)) != NULL) {
    g_autofree char *path = g_build_filename(dir, name, NULL);
    if (accept(name, path))
      g_ptr_array_add(found, g_strdup(name));
  }
  g_dir_close(d);
  g_ptr_array_sort(found, compare_strings);
  return found;
}

/* A subdirectory that wsync_dcp_detect() accepts (format A's sharded/ excepted: that
 * one makes its parent a checkpoint). */
static gboolean
is_checkpoint_below(const char *name, const char *path)
{
  return strcmp(name, WSYNC_DCP_SHARDED_DIR) != 0 && wsync_dcp_detect(path);
}

/* Appends @names (sorted) as "A", "A and B" or "A, B and C", printable; past @max
 * names, the rest as a count: "A, B and 190 more" (one line, however many ranks). */
static void
append_names(GString *out, GPtrArray *names, guint max)
{
  guint shown = names->len > max ? max : names->len;
  for (guint i = 0; i < shown; i++) {
    g_autofree char *p = wsync_json_printable(g_ptr_array_index(names, i));
    if (i > 0)
      g_string_append(out, i + 1 == names->len ? " and " : ", ");
    g_string_append(out, p);
  }
  if (shown < names->len)
    g_string_append_printf(out, " and %u more", names->len - shown);
}

/* Is @path a torch.save archive?  Recognised by content, whatever its name, as torch's
 * reader does: a zip whose first entry lies in a directory (the archive name,
 * `PyTorchStreamReader` in caffe2/serialize/inline_container.cc, docs/torch-save.md §3.6)
 * that holds data.pkl.  Only the zip's central directory is read. */
static gboolean
is_torch_save_archive(const char *name, const char *path)
{
  (void)name;
  /* stat()ed and judged first, opened only when a regular file or a directory, then
   * fstat()ed to be sure it is the file judged (core/filekind.h wsync_file_open_judged()):
   * zip_open() of a FIFO put in place after a g_file_test() blocked for ever */
  struct stat sb;
  const char *special;
  int fd = wsync_file_open_input(path, &sb, &special);
  if (fd < 0)
    return FALSE;
  int zerr = 0;
  zip_t *za = S_ISREG(sb.st_mode) ? zip_fdopen(fd, ZIP_RDONLY, &zerr) : NULL;
  if (za == NULL) { /* (zip_fdopen() takes @fd only when it succeeds, zip_fdopen(3)) */
    close(fd);
    return FALSE;
  }
  gboolean found = FALSE;
  const char *first = zip_get_num_entries(za, 0) > 0 ? zip_get_name(za, 0, ZIP_FL_ENC_RAW) : NULL;
  const char *slash = first != NULL ? strchr(first, '/') : NULL;
  if (slash != NULL && slash != first) {
    g_autofree char *pkl = g_strdup_printf("%.*s/data.pkl", (int)(slash - first), first);
    found = zip_name_locate(za, pkl, ZIP_FL_ENC_RAW) >= 0;
  }
  zip_discard(za);
  return found;
}

/* "; its subdirectories A and B are: pass one of them as SRC" when @dir has checkpoint
 * subdirectories; "; it holds torch.save archives (...)" when it holds those (a state
 * dict saved by each rank with torch.save, as verl and lmms-engine save FSDP2 models:
 * not read, docs/torch-save.md); both, or "". */
static char *
below_hint(const char *dir)
{
  g_autoptr(GPtrArray) below = list_dir_names(dir, is_checkpoint_below);
  g_autoptr(GPtrArray) archives = list_dir_names(dir, is_torch_save_archive);
  GString *hint = g_string_new(NULL);
  if (below->len > 0) {
    g_string_append(hint, below->len == 1 ? "; its subdirectory " : "; its subdirectories ");
    append_names(hint, below, G_MAXUINT);
    g_string_append(hint, below->len == 1 ? " is one: pass it as SRC"
                                          : " are: pass one of them as SRC");
  }
  if (archives->len > 0) {
    g_string_append(hint, archives->len == 1 ? "; it holds a torch.save archive ("
                                             : "; it holds torch.save archives (");
    append_names(hint, archives, 3);
    /* (inspect and convert say it too, of a directory of a model saved whole with
     * torch.save: "each rank" alone was wrong there, and so was "only DCP") */
    g_string_append(hint, "): wsync does not read torch.save archives (a whole model's or "
                          "each rank's state dict), only safetensors files and DCP "
                          "checkpoints");
  }
  return g_string_free(hint, FALSE);
}

char *
wsync_dcp_below_hint(const char *dir)
{
  g_return_val_if_fail(dir != NULL, NULL);
  return below_hint(dir);
}

WsyncDcp *
wsync_dcp_open(const char *dir, GError **error)
{
  return wsync_dcp_open_with(dir, NULL, error);
}

WsyncDcp *
wsync_dcp_open_with(const char *dir, const WsyncDcpOpenOptions *opts, GError **error)
{
  g_return_val_if_fail(dir != NULL, NULL);
  g_return_val_if_fail(error == NULL || *error == NULL, NULL);

  if (!g_file_test(dir, G_FILE_TEST_IS_DIR)) {
    if (!g_file_test(dir, G_FILE_TEST_EXISTS))
      wsync_set_io_error(error, ENOENT, dir, "open");
    else
      bad_input(error, dir, NULL, "not a directory, so not a sharded checkpoint");
    return NULL;
  }
  g_autofree char *sub = g_build_filename(dir, WSYNC_DCP_SHARDED_DIR, NULL);
  g_autoptr(GArray) here = list_shards(dir);
  g_autoptr(GArray) below = list_shards(sub);
  g_autoptr(GArray) meta_ranks = g_array_new(FALSE, FALSE, sizeof(guint));
  g_autoptr(GArray) data_ranks = g_array_new(FALSE, FALSE, sizeof(guint));
  list_ranks(dir, meta_ranks, data_ranks);
  gboolean meta = has_metadata(dir), per_rank = meta_ranks->len > 0;

  if (meta && per_rank) {
    bad_input(error, dir, NULL,
              "holds both a .metadata and per-rank __R.metadata files (a save with "
              "use_collectives=False); which one is the checkpoint is ambiguous (torch would "
              "take .metadata)");
    return NULL;
  }
  if ((meta || per_rank) && (here->len || below->len)) {
    bad_input(error, dir, NULL,
              "holds both %s (the default DCP format) and "
              "shard-*-model-*-of-*.safetensors files (Hugging Face mode); which one is the "
              "checkpoint is ambiguous",
              meta ? "a .metadata" : "__R.metadata files");
    return NULL;
  }
  if (meta)
    return open_b(dir, opts, error);
  if (per_rank)
    return open_b_ranks(dir, meta_ranks, data_ranks, opts, error);
  if (here->len && below->len) {
    bad_input(error, dir, NULL,
              "holds shard-*-model-*-of-*.safetensors files both directly and in sharded/; which "
              "set is the checkpoint is ambiguous");
    return NULL;
  }
  if (here->len)
    return open_a(dir, dir, here, opts, error);
  if (below->len)
    return open_a(dir, sub, below, opts, error);
  if (data_ranks->len) {
    bad_input(error, dir, NULL,
              "holds __R_K.distcp data files but no .metadata and no __R.metadata: the "
              "checkpoint's metadata is missing");
    return NULL;
  }
  g_autofree char *hint = below_hint(dir);
  bad_input(error, dir, NULL,
            "not a sharded checkpoint: no .metadata, no __R.metadata and no "
            "shard-S-model-I-of-N.safetensors files (in it or in sharded/)%s",
            hint);
  return NULL;
}

/* ================================================================ coverage */

static gboolean
box_equal(const WsyncBox *a, const WsyncBox *b)
{
  for (guint d = 0; d < a->ndim; d++)
    if (a->offset[d] != b->offset[d] || a->extent[d] != b->extent[d])
      return FALSE;
  return TRUE;
}

/* Where element @idx (relative to @at's origin inside the global tensor) of a chunk is. */
static const guint8 *
chunk_element(const WsyncDcpChunk *c, const guint64 *global, guint ndim, guint es)
{
  guint64 e = c->region.origin;
  for (guint d = 0; d < ndim; d++)
    e += (global[d] - c->box.offset[d]) * c->region.stride[d];
  return c->data + e * es;
}

/* Compares two chunks on box @on (inside both).  On a difference, @at gets the global
 * index of the first differing element. */
static gboolean
same_on_box(const WsyncDcpChunk *a, const WsyncDcpChunk *b, const WsyncBox *on, guint es,
            guint64 *at)
{
  guint nd = on->ndim;
  if (nd == 0)
    return memcmp(chunk_element(a, at, 0, es), chunk_element(b, at, 0, es), es) == 0;
  guint last = nd - 1;
  guint64 idx[WSYNC_MAX_DIMS];
  for (guint d = 0; d < nd; d++)
    idx[d] = on->offset[d];
  gboolean runs = a->region.stride[last] == 1 && b->region.stride[last] == 1;
  guint64 n_last = on->extent[last];
  for (;;) {
    idx[last] = on->offset[last];
    const guint8 *pa = chunk_element(a, idx, nd, es), *pb = chunk_element(b, idx, nd, es);
    if (!runs || memcmp(pa, pb, n_last * es) != 0) {
      for (guint64 j = 0; j < n_last; j++) {
        const guint8 *ea = pa + j * a->region.stride[last] * es;
        const guint8 *eb = pb + j * b->region.stride[last] * es;
        if (memcmp(ea, eb, es) != 0) {
          memcpy(at, idx, nd * sizeof *idx);
          at[last] = on->offset[last] + j;
          return FALSE;
        }
      }
    }
    if (last == 0)
      return TRUE;
    guint d = last;
    for (;;) {
      d--;
      if (++idx[d] < on->offset[d] + on->extent[d])
        break;
      idx[d] = on->offset[d];
      if (d == 0)
        return TRUE;
    }
  }
}

typedef struct {
  const WsyncDcp *dcp;
  const WsyncDcpTensor *t;
  guint es;
  GError **error;
} Coverage;

static const WsyncDcpChunk *
chunk_at(const WsyncDcpTensor *t, guint i)
{
  return &g_array_index(t->chunks, WsyncDcpChunk, i);
}

/* Chunks @i < @j overlap on @on: the later one must hold the same bytes there. */
static gboolean
check_replica(Coverage *cv, guint i, guint j, const WsyncBox *on)
{
  const WsyncDcpChunk *a = chunk_at(cv->t, i), *b = chunk_at(cv->t, j);
  guint64 at[WSYNC_MAX_DIMS] = {0};
  if (same_on_box(a, b, on, cv->es, at))
    return TRUE;
  g_autofree char *ba = wsync_box_format(&a->box), *bb = wsync_box_format(&b->box), *bo = wsync_box_format(on);
  g_autofree char *el = wsync_shape_format(on->ndim, at);
  g_autofree char *fa = wsync_json_printable(a->file ? a->file : "?");
  g_autofree char *fb = wsync_json_printable(b->file ? b->file : "?");
  return bad_input(cv->error, cv->dcp->where, cv->t->name,
                   "chunk %s (%s) and chunk %s (%s) overlap on %s but differ at element %s: "
                   "replicas must be byte-identical",
                   ba, fa, bb, fb, bo, el);
}

static gint
compare_by_box(gconstpointer x, gconstpointer y, gpointer user)
{
  const WsyncDcpChunk *chunks = user;
  const WsyncDcpChunk *a = &chunks[*(const guint *)x], *b = &chunks[*(const guint *)y];
  for (guint d = 0; d < a->box.ndim; d++) {
    if (a->box.offset[d] != b->box.offset[d])
      return a->box.offset[d] < b->box.offset[d] ? -1 : 1;
    if (a->box.extent[d] != b->box.extent[d])
      return a->box.extent[d] < b->box.extent[d] ? -1 : 1;
  }
  guint i = *(const guint *)x, j = *(const guint *)y;
  return i < j ? -1 : i > j;
}

typedef struct {
  const WsyncDcpChunk *chunks;
  guint axis;
} SweepOrder;

static gint
compare_on_axis(gconstpointer x, gconstpointer y, gpointer user)
{
  const SweepOrder *so = user;
  guint i = *(const guint *)x, j = *(const guint *)y;
  guint64 a = so->chunks[i].box.offset[so->axis], b = so->chunks[j].box.offset[so->axis];
  if (a != b)
    return a < b ? -1 : 1;
  return i < j ? -1 : i > j;
}

static gint
compare_u64(gconstpointer x, gconstpointer y)
{
  guint64 a = *(const guint64 *)x, b = *(const guint64 *)y;
  return a < b ? -1 : a > b;
}

/* Box subtraction: the parts of @whole no chunk of @reps covers, or FALSE (error set)
 * when they become too many to track. */
#define MAX_PIECES 65536

static gboolean
uncovered_boxes(Coverage *cv, const WsyncBox *whole, const guint *reps, guint n_reps, GArray *out)
{
  g_array_set_size(out, 0);
  g_array_append_val(out, *whole);
  g_autoptr(GArray) next = g_array_new(FALSE, FALSE, sizeof(WsyncBox));
  for (guint r = 0; r < n_reps && out->len; r++) {
    const WsyncBox *c = &chunk_at(cv->t, reps[r])->box;
    g_array_set_size(next, 0);
    for (guint u = 0; u < out->len; u++) {
      WsyncBox rest = g_array_index(out, WsyncBox, u), inter;
      if (!wsync_box_intersect(&rest, c, &inter)) {
        g_array_append_val(next, rest);
        continue;
      }
      for (guint d = 0; d < rest.ndim; d++) {
        guint64 end = rest.offset[d] + rest.extent[d];
        if (rest.offset[d] < inter.offset[d]) {
          WsyncBox piece = rest;
          piece.extent[d] = inter.offset[d] - rest.offset[d];
          g_array_append_val(next, piece);
        }
        guint64 iend = inter.offset[d] + inter.extent[d];
        if (iend < end) {
          WsyncBox piece = rest;
          piece.offset[d] = iend;
          piece.extent[d] = end - iend;
          g_array_append_val(next, piece);
        }
        rest.offset[d] = inter.offset[d];
        rest.extent[d] = inter.extent[d];
      }
    }
    if (next->len > MAX_PIECES)
      return bad_input(cv->error, cv->dcp->where, cv->t->name,
                       "the chunks cut the tensor into more than %d pieces; coverage cannot be "
                       "proven",
                       MAX_PIECES);
    g_array_set_size(out, 0);
    g_array_append_vals(out, next->data, next->len);
  }
  return TRUE;
}

gboolean
wsync_dcp_check_tensor(const WsyncDcp *dcp, const WsyncDcpTensor *t, GError **error)
{
  g_return_val_if_fail(dcp != NULL && t != NULL, FALSE);
  Coverage cv = {dcp, t, wsync_dtype_size(t->dtype), error};
  guint n = t->chunks->len, nd = t->ndim;
  g_autofree char *shape = wsync_shape_format(nd, t->shape);

  /* 1. Every box inside the shape. */
  g_autoptr(GArray) live = g_array_new(FALSE, FALSE, sizeof(guint));
  for (guint i = 0; i < n; i++) {
    const WsyncDcpChunk *c = chunk_at(t, i);
    gboolean inside = c->box.ndim == nd;
    for (guint d = 0; inside && d < nd; d++)
      inside = c->box.offset[d] <= t->shape[d] &&
               c->box.extent[d] <= t->shape[d] - c->box.offset[d];
    if (!inside) {
      g_autofree char *box = wsync_box_format(&c->box);
      g_autofree char *file = wsync_json_printable(c->file ? c->file : "?");
      return bad_input(error, dcp->where, t->name, "chunk %s (%s) lies outside the shape %s", box,
                       file, shape);
    }
    if (wsync_box_volume(&c->box) > 0)
      g_array_append_val(live, i);
  }
  WsyncBox whole;
  wsync_box_whole(&whole, nd, t->shape);
  guint64 volume = wsync_box_volume(&whole);
  if (volume == 0)
    return TRUE;

  /* 2. Chunks with the same box: replicas of the first one. */
  g_autoptr(GArray) reps = g_array_new(FALSE, FALSE, sizeof(guint));
  guint *ix = (guint *)(gpointer)live->data;
  g_qsort_with_data(ix, (gint)live->len, sizeof(guint), compare_by_box, t->chunks->data);
  for (guint k = 0; k < live->len;) {
    guint first = ix[k], m = k + 1;
    const WsyncBox *fb = &chunk_at(t, first)->box;
    for (; m < live->len && box_equal(&chunk_at(t, ix[m])->box, fb); m++)
      if (!check_replica(&cv, first, ix[m], fb))
        return FALSE;
    g_array_append_val(reps, first);
    k = m;
  }

  /* 3. Partial overlaps between distinct boxes: sweep along the axis with the most
   * distinct offsets, compare every overlapping pair. */
  gboolean overlap = FALSE;
  guint64 sum = 0;
  for (guint r = 0; r < reps->len; r++) {
    guint64 v = wsync_box_volume(&chunk_at(t, g_array_index(reps, guint, r))->box);
    if (!g_uint64_checked_add(&sum, sum, v))
      sum = G_MAXUINT64;
  }
  if (nd > 0 && reps->len > 1) {
    guint axis = 0, best = 0;
    g_autoptr(GArray) offs = g_array_sized_new(FALSE, FALSE, sizeof(guint64), reps->len);
    for (guint d = 0; d < nd; d++) {
      g_array_set_size(offs, 0);
      for (guint r = 0; r < reps->len; r++)
        g_array_append_val(offs, chunk_at(t, g_array_index(reps, guint, r))->box.offset[d]);
      g_array_sort(offs, compare_u64);
      guint distinct = 0;
      for (guint r = 0; r < offs->len; r++)
        distinct +=
            r == 0 || g_array_index(offs, guint64, r) != g_array_index(offs, guint64, r - 1);
      if (distinct > best) {
        best = distinct;
        axis = d;
      }
    }
    g_autoptr(GArray) order = g_array_copy(reps);
    SweepOrder so = {(const WsyncDcpChunk *)(gconstpointer)t->chunks->data, axis};
    g_qsort_with_data(order->data, (gint)order->len, sizeof(guint), compare_on_axis, &so);
    g_autoptr(GArray) active = g_array_new(FALSE, FALSE, sizeof(guint));
    for (guint k = 0; k < order->len; k++) {
      guint j = g_array_index(order, guint, k);
      const WsyncBox *bj = &chunk_at(t, j)->box;
      for (guint a = 0; a < active->len;) {
        guint i = g_array_index(active, guint, a);
        const WsyncBox *bi = &chunk_at(t, i)->box;
        if (bi->offset[axis] + bi->extent[axis] <= bj->offset[axis]) {
          g_array_remove_index_fast(active, a);
          continue;
        }
        WsyncBox on;
        if (wsync_box_intersect(bi, bj, &on)) {
          overlap = TRUE;
          if (!check_replica(&cv, MIN(i, j), MAX(i, j), &on))
            return FALSE;
        }
        a++;
      }
      g_array_append_val(active, j);
    }
  }

  /* 4. Coverage: disjoint boxes inside the shape cover it when their volumes add up;
   * otherwise subtract them (in chunk order) from the whole and report the first piece
   * left, in row-major order. */
  if (!overlap && sum == volume)
    return TRUE;
  g_array_sort(reps, compare_guint);
  g_autoptr(GArray) left = g_array_new(FALSE, FALSE, sizeof(WsyncBox));
  if (!uncovered_boxes(&cv, &whole, (const guint *)(gconstpointer)reps->data, reps->len, left))
    return FALSE;
  if (left->len == 0)
    return TRUE;
  const WsyncBox *first = &g_array_index(left, WsyncBox, 0);
  for (guint k = 1; k < left->len; k++) {
    const WsyncBox *b = &g_array_index(left, WsyncBox, k);
    for (guint d = 0; d < nd; d++)
      if (b->offset[d] != first->offset[d]) {
        if (b->offset[d] < first->offset[d])
          first = b;
        break;
      }
  }
  g_autofree char *gap = wsync_box_format(first);
  return bad_input(error, dcp->where, t->name,
                   "no chunk covers %s (shape %s, %u chunk%s): the checkpoint is incomplete", gap,
                   shape, n, n == 1 ? "" : "s");
}

gboolean
wsync_dcp_check_coverage(const WsyncDcp *dcp, GError **error)
{
  g_return_val_if_fail(dcp != NULL, FALSE);
  for (guint i = 0; i < dcp->tensors->len; i++)
    if (!wsync_dcp_check_tensor(dcp, &g_array_index(dcp->tensors, Tensor, i).t, error))
      return FALSE;
  return TRUE;
}
