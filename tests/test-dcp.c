/* Tests of the DCP readers (core/dcp.c, core/pickle.c).
 *
 * tests/make-dcp-fixtures.py writes both DCP formats into a temporary directory (see its
 * docstring); every good fixture is opened, proven covered and reassembled from its
 * chunks (boxes and strides, by a loop of this file's own) and compared bit for bit with
 * the unsharded source; every bad one must be refused with the expected words. */
#define _GNU_SOURCE
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <glib.h>
#include <glib/gstdio.h>

#include <wsync/error.h>
#include <wsync/safetensors.h>

#include "../core/dcp.h"
#include "../core/pickle.h"
#include "testutil.h"

static char *fixtures; /* the directory the script wrote */

static char *
fixture(const char *name)
{
  return g_build_filename(fixtures, name, NULL);
}

/* Checks the code, that the message is one line and that it holds every fragment. */
static void
check_error(const GError *err, const char *const *fragments)
{
  g_assert_nonnull(err);
  for (guint i = 0; fragments[i]; i++) {
    if (strstr(err->message, fragments[i]) == NULL)
      g_printerr("message \"%s\" lacks \"%s\"\n", err->message, fragments[i]);
    g_assert_nonnull(strstr(err->message, fragments[i]));
  }
  g_assert_null(strchr(err->message, '\n'));
  g_assert_cmpuint(err->domain, ==, WSYNC_ERROR);
  g_assert_cmpint(err->code, ==, WSYNC_ERROR_BAD_INPUT);
}

/* ================================================================ reassembly */

/* Rebuilds every tensor of @dcp from its chunks, with a loop over each chunk's box and
 * region, checks that every element was written, and compares with the tensor of the
 * same name in @source (bit for bit).  Both must hold the same names. */
static void
compare_with_source(const WsyncDcp *dcp, const char *source)
{
  g_autofree char *path = fixture(source);
  GError *error = NULL;
  g_autoptr(WsyncSafetensors) src = wsync_safetensors_open(path, &error);
  g_assert_no_error(error);
  g_assert_cmpuint(wsync_dcp_n_tensors(dcp), ==, wsync_safetensors_n_tensors(src));

  for (guint i = 0; i < wsync_dcp_n_tensors(dcp); i++) {
    const WsyncDcpTensor *t = wsync_dcp_tensor(dcp, i);
    if (i > 0)
      g_assert_cmpint(strcmp(wsync_dcp_tensor(dcp, i - 1)->name, t->name), <, 0);
    g_assert_true(wsync_dcp_lookup(dcp, t->name) == t);
    const WsyncTensor *want = wsync_safetensors_lookup(src, t->name);
    if (want == NULL)
      g_error("tensor %s is not in %s", t->name, source);
    g_assert_cmpint(t->dtype, ==, want->dtype);
    g_assert_cmpuint(t->ndim, ==, want->ndim);
    for (guint d = 0; d < t->ndim; d++)
      g_assert_cmpuint(t->shape[d], ==, want->shape[d]);

    gsize es = wsync_dtype_bits(t->dtype) / 8;
    guint64 gstride[WSYNC_MAX_DIMS], acc = 1;
    for (guint d = t->ndim; d > 0; d--) {
      gstride[d - 1] = acc;
      acc *= t->shape[d - 1];
    }
    g_autofree guint8 *buf = g_malloc0(want->nbytes + 1);
    g_autofree guint8 *seen = g_malloc0(want->numel + 1);
    for (guint c = 0; c < t->chunks->len; c++) {
      const WsyncDcpChunk *ch = &g_array_index(t->chunks, WsyncDcpChunk, c);
      g_assert_cmpuint(ch->box.ndim, ==, t->ndim);
      g_assert_nonnull(ch->file);
      guint64 n = wsync_box_volume(&ch->box);
      guint64 idx[WSYNC_MAX_DIMS] = {0};
      for (guint64 e = 0; e < n; e++) {
        guint64 from = ch->region.origin, to = 0;
        for (guint d = 0; d < t->ndim; d++) {
          from += idx[d] * ch->region.stride[d];
          to += (ch->box.offset[d] + idx[d]) * gstride[d];
        }
        memcpy(buf + to * es, ch->data + from * es, es);
        seen[to] = 1;
        for (guint d = t->ndim; d > 0; d--) {
          if (++idx[d - 1] < ch->box.extent[d - 1])
            break;
          idx[d - 1] = 0;
        }
      }
    }
    for (guint64 e = 0; e < want->numel; e++)
      if (!seen[e])
        g_error("%s: element %" G_GUINT64_FORMAT " not written", t->name, e);
    if (memcmp(buf, want->data, want->nbytes) != 0)
      g_error("%s differs from the unsharded source", t->name);
  }
}

/* Opens fixture @name, taking the entries under @select (NULL: none given). */
static WsyncDcp *
open_selected(const char *name, const char *select)
{
  g_autofree char *path = fixture(name);
  GError *error = NULL;
  WsyncDcpOpenOptions opts = {.select = select};
  g_assert_true(wsync_dcp_detect(path));
  WsyncDcp *dcp = wsync_dcp_open_with(path, &opts, &error);
  g_assert_no_error(error);
  g_assert_nonnull(dcp);
  g_assert_true(wsync_dcp_check_coverage(dcp, &error));
  g_assert_no_error(error);
  return dcp;
}

static WsyncDcp *
open_good(const char *name)
{
  return open_selected(name, NULL);
}

/* Opening fixture @name with @select (NULL: none) is refused with exactly @want, after
 * "FIXTURES/NAME/.metadata: ". */
static void
assert_open_refused(const char *name, const char *select, gboolean list_all, const char *want)
{
  g_autofree char *path = fixture(name);
  g_autofree char *full = g_strdup_printf("%s/.metadata: %s", path, want);
  GError *error = NULL;
  WsyncDcpOpenOptions opts = {.select = select, .list_all = list_all};
  g_autoptr(WsyncDcp) dcp = wsync_dcp_open_with(path, &opts, &error);
  g_assert_null(dcp);
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT);
  g_assert_cmpstr(error->message, ==, full);
  g_clear_error(&error);
}

static const WsyncDcpChunk *
chunk(const WsyncDcpTensor *t, guint i)
{
  g_assert_cmpuint(i, <, t->chunks->len);
  return &g_array_index(t->chunks, WsyncDcpChunk, i);
}

/* ================================================================ good checkpoints */

static void
test_detect(void)
{
  g_autofree char *a = fixture("good-a"), *b = fixture("good-b"), *flat = fixture("flat-a");
  g_autofree char *file = fixture("good.safetensors"), *none = fixture("nowhere");
  g_autofree char *per_rank = fixture("ranks-b-per-rank"), *no0 = fixture("ranks-missing-meta0");
  g_assert_true(wsync_dcp_detect(a));
  g_assert_true(wsync_dcp_detect(b));
  g_assert_true(wsync_dcp_detect(per_rank)); /* __0.metadata, __1.metadata */
  g_assert_true(wsync_dcp_detect(no0));      /* __1.metadata only: refused by the reader */
  g_assert_true(wsync_dcp_detect(flat));
  g_assert_false(wsync_dcp_detect(fixtures));
  g_assert_false(wsync_dcp_detect(file));
  g_assert_false(wsync_dcp_detect(none));
}

/* FSDP2 x EP with efsdp * ep > E (2 experts, 2 x 2 mesh): (Shard(1), Shard(0)), so rank
 * (i, j) = 2i + j holds expert j, rows [3i, 3i + 3) of axis 1. */
static void
check_shard1_ep(const WsyncDcp *dcp)
{
  const WsyncDcpTensor *t = wsync_dcp_lookup(dcp, "model.layers.1.mlp.experts.w1");
  g_assert_cmpuint(t->chunks->len, ==, 4);
  for (guint r = 0; r < 4; r++) {
    const WsyncDcpChunk *c = chunk(t, r);
    g_assert_cmpuint(c->box.offset[0], ==, r % 2);
    g_assert_cmpuint(c->box.extent[0], ==, 1);
    g_assert_cmpuint(c->box.offset[1], ==, 3 * (r / 2));
    g_assert_cmpuint(c->box.extent[1], ==, 3);
    g_assert_cmpuint(c->box.offset[2], ==, 0);
    g_assert_cmpuint(c->box.extent[2], ==, 4);
  }
}

static void
test_a_good(void)
{
  g_autoptr(WsyncDcp) dcp = open_good("good-a");
  g_assert_cmpint(wsync_dcp_format(dcp), ==, WSYNC_DCP_FORMAT_HF_SAFETENSORS);
  g_assert_cmpuint(wsync_dcp_n_skipped(dcp), ==, 0);
  compare_with_source(dcp, "good.safetensors");

  /* Output parts from -model-I-of-N. */
  const WsyncDcpTensor *embed = wsync_dcp_lookup(dcp, "model.embed_tokens.weight");
  g_assert_cmpuint(embed->part, ==, 1);
  g_assert_cmpuint(embed->n_parts, ==, 2);
  g_assert_cmpuint(embed->chunks->len, ==, 4);
  const WsyncDcpTensor *w1 = wsync_dcp_lookup(dcp, "model.layers.0.mlp.experts.w1");
  g_assert_cmpuint(w1->part, ==, 2);
  g_assert_cmpuint(w1->n_parts, ==, 2);
  /* FSDP2 x EP: rank (i, j) = 2i + j holds rows [4j + 2i, 4j + 2i + 2). */
  g_assert_cmpuint(chunk(w1, 0)->box.offset[0], ==, 0);
  g_assert_cmpuint(chunk(w1, 1)->box.offset[0], ==, 4);
  g_assert_cmpuint(chunk(w1, 2)->box.offset[0], ==, 2);
  g_assert_cmpuint(chunk(w1, 3)->box.offset[0], ==, 6);
  check_shard1_ep(dcp);
  /* The empty last shard of an uneven split: offset = dim size, extent 0. */
  const WsyncDcpTensor *q = wsync_dcp_lookup(dcp, "model.layers.0.self_attn.q_proj.weight");
  g_assert_cmpuint(q->chunks->len, ==, 4);
  g_assert_cmpuint(chunk(q, 3)->box.offset[0], ==, 9);
  g_assert_cmpuint(chunk(q, 3)->box.extent[0], ==, 0);
  g_assert_cmpuint(chunk(q, 3)->box.extent[1], ==, 8);
  /* Two chunks of one tensor in one file (fqn.__dcp_shard_k, logical_fqn). */
  const WsyncDcpTensor *down = wsync_dcp_lookup(dcp, "model.layers.0.mlp.down.weight");
  g_assert_cmpuint(down->chunks->len, ==, 2);
  g_assert_cmpstr(chunk(down, 0)->file, ==, chunk(down, 1)->file);
  g_assert_null(wsync_dcp_lookup(dcp, "model.layers.0.mlp.down.weight.__dcp_shard_0"));
  /* A scalar. */
  const WsyncDcpTensor *scale = wsync_dcp_lookup(dcp, "model.scale");
  g_assert_cmpuint(scale->ndim, ==, 0);
  g_assert_cmpuint(scale->chunks->len, ==, 1);
  /* Replicas that were not deduplicated: both kept, both compared. */
  const WsyncDcpTensor *ln = wsync_dcp_lookup(dcp, "model.layers.0.input_layernorm.weight");
  g_assert_cmpuint(ln->chunks->len, ==, 2);
  g_assert_cmpuint(wsync_dcp_lookup(dcp, "model.layers.0.mlp.gate.weight")->chunks->len, ==, 4);
}

static void
test_a_flat(void)
{
  /* Shards directly in the directory, shard numbers 1, 3, 4 (rank 1 wrote nothing). */
  g_autoptr(WsyncDcp) dcp = open_good("flat-a");
  compare_with_source(dcp, "flat.safetensors");
  const WsyncDcpTensor *w = wsync_dcp_lookup(dcp, "w");
  g_assert_cmpuint(w->part, ==, 1);
  g_assert_cmpuint(w->n_parts, ==, 1);
  g_assert_cmpuint(w->chunks->len, ==, 3);
  g_assert_true(
      g_str_has_suffix(chunk(w, 1)->file, "shard-00003-model-00001-of-00001.safetensors"));
}

static void
check_good_b(const char *name)
{
  g_autoptr(WsyncDcp) dcp = open_good(name);
  g_assert_cmpint(wsync_dcp_format(dcp), ==, WSYNC_DCP_FORMAT_TORCH_SAVE);
  compare_with_source(dcp, "good.safetensors");
  g_assert_cmpuint(wsync_dcp_n_skipped(dcp), ==, 1);
  g_assert_cmpstr(wsync_dcp_skipped(dcp, 0), ==, "train_state");

  /* The transposed chunk keeps its strides. */
  const WsyncDcpTensor *lm = wsync_dcp_lookup(dcp, "lm_head.weight");
  g_assert_cmpuint(lm->part, ==, 0);
  g_assert_cmpuint(lm->n_parts, ==, 0);
  g_assert_cmpuint(chunk(lm, 0)->region.stride[0], ==, 4);
  g_assert_cmpuint(chunk(lm, 0)->region.stride[1], ==, 1);
  g_assert_cmpuint(chunk(lm, 1)->region.stride[0], ==, 1);
  g_assert_cmpuint(chunk(lm, 1)->region.stride[1], ==, 3);
  /* The dim-0-smaller-than-world tensor: the one empty chunk DCP keeps. */
  const WsyncDcpTensor *tiny = wsync_dcp_lookup(dcp, "model.tiny.weight");
  g_assert_cmpuint(tiny->chunks->len, ==, 3);
  g_assert_cmpuint(chunk(tiny, 2)->box.offset[0], ==, 2);
  g_assert_cmpuint(chunk(tiny, 2)->box.extent[0], ==, 0);
  /* float8 and uint16 come through _rebuild_tensor_v3. */
  g_assert_cmpint(wsync_dcp_lookup(dcp, "model.fp8.weight")->dtype, ==, WSYNC_DTYPE_F8_E4M3);
  g_assert_cmpint(wsync_dcp_lookup(dcp, "model.u16")->dtype, ==, WSYNC_DTYPE_U16);
  g_assert_cmpint(wsync_dcp_lookup(dcp, "model.mask")->dtype, ==, WSYNC_DTYPE_BOOL);
  g_assert_cmpint(wsync_dcp_lookup(dcp, "model.position_ids")->dtype, ==, WSYNC_DTYPE_I64);
  check_shard1_ep(dcp);
}

/* The dims of a torch.Size (REDUCE(torch.Size, ((d0, ...),))). */
static const WsyncPickleValue *
size_dims(const WsyncPickleValue *v)
{
  g_assert_true(wsync_pickle_is_instance(v, WSYNC_PG_SIZE));
  g_assert_cmpuint(wsync_pickle_n_items(v->args), ==, 1);
  const WsyncPickleValue *dims = wsync_pickle_item(v->args, 0);
  g_assert_cmpint(dims->kind, ==, WSYNC_PICKLE_TUPLE);
  return dims;
}

static void
assert_same_dims(const WsyncPickleValue *a, const WsyncPickleValue *b)
{
  const WsyncPickleValue *da = size_dims(a), *db = size_dims(b);
  g_assert_cmpuint(wsync_pickle_n_items(da), ==, wsync_pickle_n_items(db));
  for (guint d = 0; d < wsync_pickle_n_items(da); d++)
    g_assert_cmpint(wsync_pickle_item(da, d)->integer, ==, wsync_pickle_item(db, d)->integer);
}

/* The storage_data of fixture @name's metadata @md, as torch's MetadataIndex pickles:
 * every key's BUILD state is the __dict__ that MetadataIndex.__init__ fills, in its
 * order: {fqn, index, offset} for a tensor chunk, index the chunk's position in its
 * tensor's chunks (create_default_global_save_plan), or None when @index_hints is FALSE
 * (rewrite_index_hints=False); {fqn, index: None} for the non-tensor value, whose bytes
 * are a torch.save zip archive exactly filling its byte range. */
static void
check_storage_keys(const char *name, const WsyncPickleValue *md, gboolean index_hints)
{
  const WsyncPickleValue *sdm = wsync_pickle_dict_lookup(md->state, "state_dict_metadata");
  const WsyncPickleValue *sd = wsync_pickle_dict_lookup(md->state, "storage_data");
  guint n_bytes_io = 0;
  g_assert_cmpuint(wsync_pickle_n_items(sd), >, 0);
  for (guint i = 0; i < wsync_pickle_n_items(sd); i++) {
    const WsyncPickleValue *k = wsync_pickle_dict_key(sd, i);
    g_assert_true(wsync_pickle_is_instance(k, WSYNC_PG_METADATA_INDEX));
    g_assert_true(k->newobj);
    const WsyncPickleValue *st = k->state;
    g_assert_cmpint(st->kind, ==, WSYNC_PICKLE_DICT);
    g_assert_cmpstr(wsync_pickle_dict_key(st, 0)->str, ==, "fqn");
    g_assert_cmpstr(wsync_pickle_dict_key(st, 1)->str, ==, "index");
    const WsyncPickleValue *fqn = wsync_pickle_dict_value(st, 0);
    const WsyncPickleValue *index = wsync_pickle_dict_value(st, 1);
    const WsyncPickleValue *tsm = wsync_pickle_dict_lookup(sdm, fqn->str);
    g_assert_nonnull(tsm);
    if (wsync_pickle_is_instance(tsm, WSYNC_PG_BYTES_STORAGE_METADATA)) {
      n_bytes_io++;
      g_assert_cmpuint(wsync_pickle_n_items(st), ==, 2); /* no offset */
      g_assert_cmpint(index->kind, ==, WSYNC_PICKLE_NONE);
      const WsyncPickleValue *info = wsync_pickle_dict_value(sd, i)->state;
      const WsyncPickleValue *rp = wsync_pickle_dict_lookup(info, "relative_path");
      guint64 off = (guint64)wsync_pickle_dict_lookup(info, "offset")->integer;
      guint64 len = (guint64)wsync_pickle_dict_lookup(info, "length")->integer;
      g_autofree char *path = g_build_filename(fixtures, name, rp->str, NULL);
      g_autofree char *data = NULL;
      gsize flen = 0;
      g_assert_true(g_file_get_contents(path, &data, &flen, NULL));
      g_assert_cmpuint(off + len, <=, flen);
      g_assert_cmpuint(len, >, 22);
      g_assert_cmpmem(data + off, 4, "PK\x03\x04", 4);
      g_assert_cmpmem(data + off + len - 22, 4, "PK\x05\x06", 4); /* no comment */
      g_assert_nonnull(memmem(data + off, len, "archive/data.pkl", 16));
      g_assert_null(memmem(data + off, len, "archive/data/0", 14)); /* no storage */
      continue;
    }
    g_assert_cmpuint(wsync_pickle_n_items(st), ==, 3);
    g_assert_cmpstr(wsync_pickle_dict_key(st, 2)->str, ==, "offset");
    const WsyncPickleValue *offset = wsync_pickle_dict_value(st, 2);
    const WsyncPickleValue *chunks = wsync_pickle_dict_lookup(tsm->state, "chunks");
    if (!index_hints) {
      g_assert_cmpint(index->kind, ==, WSYNC_PICKLE_NONE);
      continue;
    }
    g_assert_cmpint(index->kind, ==, WSYNC_PICKLE_INT);
    g_assert_cmpint(index->integer, >=, 0);
    g_assert_cmpint(index->integer, <, wsync_pickle_n_items(chunks));
    const WsyncPickleValue *ch = wsync_pickle_item(chunks, (guint)index->integer);
    assert_same_dims(wsync_pickle_dict_lookup(ch->state, "offsets"), offset);
  }
  g_assert_cmpuint(n_bytes_io, ==, 1);
}

/* The .metadata of fixture @name pickles the layout as real torch does
 * (torch.serialization._get_layout('torch.strided')) and the memory format by name
 * (builtins.getattr, as Python 3.11.2 does; __builtin__ at protocol 2) or by value (as
 * Python 3.11.7 does), and the reader takes both as the same member. */
static void
check_metadata_forms(const char *name, const char *getattr_global, gboolean index_hints)
{
  g_autofree char *path = g_build_filename(fixtures, name, ".metadata", NULL);
  g_autofree char *data = NULL;
  gsize len = 0;
  GError *error = NULL;
  g_assert_true(g_file_get_contents(path, &data, &len, &error));
  g_assert_no_error(error);
  g_assert_nonnull(memmem(data, len, "_get_layout", 11));
  g_assert_nonnull(memmem(data, len, "torch.strided", 13));
  if (getattr_global)
    g_assert_nonnull(memmem(data, len, getattr_global, strlen(getattr_global)));
  else
    g_assert_null(memmem(data, len, "getattr", 7));

  g_autoptr(WsyncPickle) pk = wsync_pickle_load((const guint8 *)data, len, path, &error);
  g_assert_no_error(error);
  const WsyncPickleValue *md = wsync_pickle_root(pk);
  g_assert_true(wsync_pickle_is_instance(md, WSYNC_PG_METADATA));
  check_storage_keys(name, md, index_hints);
  const WsyncPickleValue *sdm = wsync_pickle_dict_lookup(md->state, "state_dict_metadata");
  guint n_tensors = 0;
  for (guint i = 0; i < wsync_pickle_n_items(sdm); i++) {
    const WsyncPickleValue *tsm = wsync_pickle_dict_value(sdm, i);
    if (!wsync_pickle_is_instance(tsm, WSYNC_PG_TENSOR_STORAGE_METADATA))
      continue; /* train_state */
    n_tensors++;
    const WsyncPickleValue *props = wsync_pickle_dict_lookup(tsm->state, "properties");
    g_assert_true(wsync_pickle_is_instance(props, WSYNC_PG_TENSOR_PROPERTIES));
    g_assert_cmpuint(wsync_pickle_n_items(props->state), ==, 5);
    const WsyncPickleValue *layout = wsync_pickle_item(props->state, 1);
    g_assert_cmpint(layout->kind, ==, WSYNC_PICKLE_LAYOUT);
    g_assert_cmpstr(layout->name, ==, "torch.strided");
    const WsyncPickleValue *mem = wsync_pickle_item(props->state, 3);
    g_assert_cmpint(mem->kind, ==, WSYNC_PICKLE_ENUM);
    g_assert_cmpint(mem->cls->global, ==, WSYNC_PG_MEM_FORMAT_ENCODING);
    g_assert_cmpstr(mem->name, ==, "TORCH_CONTIGUOUS_FORMAT");
    g_assert_cmpint(mem->integer, ==, 0);
  }
  g_assert_cmpuint(n_tensors, >, 0);
}

static void
test_b_good(void)
{
  check_metadata_forms("good-b", NULL, TRUE);
  check_good_b("good-b"); /* protocol 4, by value, pathlib.PosixPath */
}

static void
test_b_by_name(void)
{
  check_metadata_forms("good-b-by-name", "\x8c\x08" "builtins\x94\x8c\x07" "getattr", TRUE);
  check_good_b("good-b-by-name"); /* protocol 4, by name */
}

static void
test_b_protocol2(void)
{
  check_metadata_forms("good-b-p2", "c__builtin__\ngetattr\n", TRUE);
  check_good_b("good-b-p2"); /* protocol 2, by name */
}

static void
test_b_protocol5(void)
{
  check_metadata_forms("good-b-p5", NULL, TRUE);
  check_good_b("good-b-p5"); /* protocol 5, by value, pathlib._local.PosixPath */
}

/* Tolerance: index hints never rewritten (every key's index None), as
 * create_default_global_save_plan(rewrite_index_hints=False) leaves them; the reader
 * finds chunks by (fqn, offset) alone. */
static void
test_b_no_index_hints(void)
{
  check_metadata_forms("good-b-no-index-hints", NULL, FALSE);
  check_good_b("good-b-no-index-hints");
}

static void
test_b_flat(void)
{
  check_metadata_forms("flat-b", "getattr", TRUE);
  g_autoptr(WsyncDcp) dcp = open_good("flat-b");
  compare_with_source(dcp, "flat.safetensors");
}

/* Saved with use_collectives=False: __0.metadata and __1.metadata, each with its own
 * rank's chunks, merged; the same model saved collectively (.metadata, the plain tensor
 * deduplicated) gives the same bytes. */
static void
test_b_per_rank(void)
{
  g_autoptr(WsyncDcp) dcp = open_good("ranks-b-per-rank");
  g_assert_cmpint(wsync_dcp_format(dcp), ==, WSYNC_DCP_FORMAT_TORCH_SAVE);
  compare_with_source(dcp, "ranks.safetensors");
  g_assert_cmpuint(wsync_dcp_n_skipped(dcp), ==, 1);
  g_assert_cmpstr(wsync_dcp_skipped(dcp, 0), ==, "train_state");
  /* Shard(0), 3 + 2 rows: rank 0's chunk first, each in its own rank's file. */
  const WsyncDcpTensor *embed = wsync_dcp_lookup(dcp, "model.embed_tokens.weight");
  g_assert_cmpuint(embed->chunks->len, ==, 2);
  g_assert_cmpuint(chunk(embed, 0)->box.offset[0], ==, 0);
  g_assert_cmpuint(chunk(embed, 0)->box.extent[0], ==, 3);
  g_assert_cmpuint(chunk(embed, 1)->box.offset[0], ==, 3);
  g_assert_cmpuint(chunk(embed, 1)->box.extent[0], ==, 2);
  g_assert_true(g_str_has_suffix(chunk(embed, 0)->file, "/__0_0.distcp"));
  g_assert_true(g_str_has_prefix(strrchr(chunk(embed, 1)->file, '/'), "/__1_"));
  /* The plain tensor: one copy per rank, both kept (and compared by the coverage check). */
  const WsyncDcpTensor *norm = wsync_dcp_lookup(dcp, "model.norm.weight");
  g_assert_cmpuint(norm->chunks->len, ==, 2);
  g_assert_true(g_str_has_suffix(chunk(norm, 0)->file, "/__0_0.distcp"));
  g_assert_true(g_str_has_prefix(strrchr(chunk(norm, 1)->file, '/'), "/__1_"));
  /* Rank 1's empty shard of a one-row tensor, at offset 1. */
  const WsyncDcpTensor *tiny = wsync_dcp_lookup(dcp, "model.tiny");
  g_assert_cmpuint(tiny->chunks->len, ==, 2);
  g_assert_cmpuint(chunk(tiny, 1)->box.offset[0], ==, 1);
  g_assert_cmpuint(chunk(tiny, 1)->box.extent[0], ==, 0);

  g_autoptr(WsyncDcp) collective = open_good("ranks-b");
  compare_with_source(collective, "ranks.safetensors");
  g_assert_cmpuint(wsync_dcp_lookup(collective, "model.norm.weight")->chunks->len, ==, 1);
}

/* A state dict saved inside a one-key dict ({"model": state_dict}, accelerate's
 * save_fsdp_model): named as the model names its tensors, the wrapper key dropped, as
 * accelerate's merge does (docs/dcp.md §3, "Names"); from one .metadata and from
 * per-rank metadata (where rank 1's file alone lacks the non-tensor value); also beside a
 * non-tensor value at the top level, which is no weight and is skipped. */
static void
test_b_wrapped(void)
{
  g_autoptr(WsyncDcp) dcp = open_good("wrapped-b");
  compare_with_source(dcp, "good.safetensors");
  g_assert_cmpuint(wsync_dcp_n_skipped(dcp), ==, 1);
  g_assert_cmpstr(wsync_dcp_skipped(dcp, 0), ==, "train_state");
  g_assert_cmpstr(wsync_dcp_wrapper(dcp), ==, "model");

  g_autoptr(WsyncDcp) ranks = open_good("wrapped-b-per-rank");
  compare_with_source(ranks, "ranks.safetensors");
  g_assert_cmpstr(wsync_dcp_skipped(ranks, 0), ==, "train_state");
  g_assert_cmpstr(wsync_dcp_wrapper(ranks), ==, "model");

  /* two wrappers, slime's {"model_state": {"model": sd}}: both dropped */
  g_autoptr(WsyncDcp) deep = open_good("model-state-b");
  compare_with_source(deep, "flat.safetensors");
  g_assert_cmpstr(wsync_dcp_wrapper(deep), ==, "model_state.model");
  g_assert_cmpuint(wsync_dcp_n_skipped(deep), ==, 0);

  /* a non-tensor value beside the wrapper ({"model": sd, "train_state": ...}): no
   * weight, so the wrapper is dropped as without it and the value skipped (it was
   * refused, "at the top level, . (1 other value of its own) and model (2 tensors)") */
  g_autoptr(WsyncDcp) beside = open_good("wrapped-two-keys");
  compare_with_source(beside, "flat.safetensors");
  g_assert_cmpstr(wsync_dcp_wrapper(beside), ==, "model");
  g_assert_cmpuint(wsync_dcp_n_skipped(beside), ==, 1);
  g_assert_cmpstr(wsync_dcp_skipped(beside, 0), ==, "train_state");
  g_assert_cmpuint(wsync_dcp_n_dropped(beside), ==, 0);
  g_autoptr(WsyncDcp) two = open_selected("wrapped-two-keys", "model");
  compare_with_source(two, "flat.safetensors");
  g_assert_cmpuint(wsync_dcp_n_skipped(two), ==, 0);
  g_assert_cmpuint(wsync_dcp_n_dropped(two), ==, 1);
  g_assert_cmpstr(wsync_dcp_wrapper(two), ==, "model");

  g_autoptr(WsyncDcp) plain = open_good("good-b");
  g_assert_null(wsync_dcp_wrapper(plain));
  g_assert_cmpuint(wsync_dcp_n_dropped(plain), ==, 0);
}

/* A model saved beside its optimizer (docs/dcp.md §3, "Names"): the torch DCP recipe's
 * and slime's {"app": {"model": ..., "optim": ...}}, the two side by side, and
 * torchtitan's model at the top level beside "optimizer" and "train_state".  Without
 * --select each is refused, listing its keys; with it, the model's tensors alone, under
 * their own names, the rest dropped unread.  A selection with no tensor under it is
 * refused; --select on format A (which records no object paths) matches the fqn's
 * dotted start. */
static void
test_select(void)
{
  assert_open_refused("app-b", NULL, FALSE,
                      "the checkpoint holds more than one state dict: under app, app.model (2 "
                      "tensors) and app.optim (6 tensors, 2 other values); pass --select KEY, KEY "
                      "the one that is the model's (the tensors directly under it are taken)");
  assert_open_refused("model-optimizer-b", NULL, FALSE,
                      "the checkpoint holds more than one state dict: at the top level, model (2 "
                      "tensors) and optimizer (6 tensors, 2 other values); pass --select KEY, KEY "
                      "the one that is the model's (the tensors directly under it are taken)");
  assert_open_refused("titan-b", NULL, FALSE,
                      "the checkpoint holds more than one state dict: at the top level, . (2 "
                      "tensors of its own), optimizer (6 tensors, 2 other values) and "
                      "train_state (1 other value); pass --select KEY, KEY the one that is the "
                      "model's (the tensors directly under it are taken)");
  assert_open_refused("app-b", "app", FALSE,
                      "--select app: no tensor of the saved state dict is directly under it "
                      "(under app, app.model (2 tensors) and app.optim (6 tensors, 2 other "
                      "values))");
  assert_open_refused("app-b", "app.mod", TRUE,
                      "--select app.mod: no tensor of the saved state dict is directly under it "
                      "(under app, app.model (2 tensors) and app.optim (6 tensors, 2 other "
                      "values))");

  const struct {
    const char *fixture, *select, *wrapper;
    guint dropped;
  } cases[] = {{"app-b", "app.model", "app.model", 8},
               {"model-optimizer-b", "model", "model", 8},
               {"titan-b", ".", NULL, 9}};
  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_autoptr(WsyncDcp) dcp = open_selected(cases[i].fixture, cases[i].select);
    compare_with_source(dcp, "flat.safetensors");
    g_assert_cmpstr(wsync_dcp_wrapper(dcp), ==, cases[i].wrapper);
    g_assert_cmpuint(wsync_dcp_n_dropped(dcp), ==, cases[i].dropped);
    g_assert_cmpuint(wsync_dcp_n_skipped(dcp), ==, 0);
  }

  /* for listing: every entry under its saved name, and why merge refuses */
  g_autofree char *path = fixture("app-b");
  WsyncDcpOpenOptions all = {.list_all = TRUE};
  GError *error = NULL;
  g_autoptr(WsyncDcp) listed = wsync_dcp_open_with(path, &all, &error);
  g_assert_no_error(error);
  g_assert_cmpuint(wsync_dcp_n_tensors(listed), ==, 8);
  g_assert_cmpstr(wsync_dcp_tensor(listed, 0)->name, ==, "app.model.b");
  g_assert_cmpstr(wsync_dcp_tensor(listed, 7)->name, ==, "app.optim.state.w.step");
  g_assert_cmpuint(wsync_dcp_n_skipped(listed), ==, 2);
  g_assert_cmpstr(wsync_dcp_skipped(listed, 0), ==, "app.optim.param_groups.0.lr");
  g_assert_true(g_str_has_prefix(wsync_dcp_refusal(listed),
                                 "the checkpoint holds more than one state dict: under app, "));
  g_assert_null(wsync_dcp_wrapper(listed));

  /* format A: "model." at the start of 21 of its 22 names */
  g_autoptr(WsyncDcp) a = open_selected("good-a", "model");
  g_assert_cmpuint(wsync_dcp_n_tensors(a), ==, 21);
  g_assert_cmpuint(wsync_dcp_n_dropped(a), ==, 1);
  g_assert_null(wsync_dcp_lookup(a, "lm_head.weight"));
  g_assert_nonnull(wsync_dcp_lookup(a, "embed_tokens.weight"));
  g_assert_cmpstr(wsync_dcp_wrapper(a), ==, "model");
}

/* `wsync inspect` of a sharded checkpoint lists its logical tensors (global shapes) as
 * merge reads them, the non-tensor values skipped, the wrapper dropped, what --select
 * leaves out, and why merge refuses a save of several state dicts; --json likewise. */
static void
test_inspect_cli(void)
{
  g_autofree char *conf = hf_conf_dir();
  const char *plugins = test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR");
  const struct {
    const char *fixture, *select, *want;
  } cases[] = {
      {"wrapped-two-keys", NULL,
       "NAME  DTYPE  SHAPE   BYTES\n"
       "b     I64    [3]     24\n"
       "w     F32    [6, 2]  48\n"
       "2 tensors, 72 bytes in 4 chunks (PyTorch DCP, .metadata and __R_K.distcp files)\n"
       "not tensors, skipped: train_state\n"
       "names without the key model, under which the state dict was saved\n"},
      {"wrapped-b-per-rank", NULL,
       "NAME                                 DTYPE  SHAPE   BYTES\n"
       "model.embed_tokens.weight            BF16   [5, 4]  40\n"
       "model.layers.0.mlp.down_proj.weight  F32    [4, 6]  96\n"
       "model.norm.weight                    BF16   [4]     8\n"
       "model.tiny                           I64    [1, 3]  24\n"
       "4 tensors, 168 bytes in 8 chunks (PyTorch DCP, .metadata and __R_K.distcp files)\n"
       "not tensors, skipped: train_state\n"
       "names without the key model, under which the state dict was saved\n"},
      {"titan-b", ".",
       "NAME  DTYPE  SHAPE   BYTES\n"
       "b     I64    [3]     24\n"
       "w     F32    [6, 2]  48\n"
       "2 tensors, 72 bytes in 4 chunks (PyTorch DCP, .metadata and __R_K.distcp files)\n"
       "left out by --select: 9 entries\n"},
      {"flat-a", NULL,
       "NAME  DTYPE  SHAPE   BYTES\n"
       "b     I64    [3]     24\n"
       "w     F32    [6, 2]  48\n"
       "2 tensors, 72 bytes in 4 chunks (PyTorch DCP in Hugging Face mode, "
       "shard-S-model-I-of-N.safetensors files)\n"},
  };
  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_autofree char *path = fixture(cases[i].fixture);
    TestRun run = cases[i].select
                      ? test_run("inspect", path, "--select", cases[i].select, "--conf-dir", conf, "--plugin-dir", plugins,
                                 NULL)
                      : test_run("inspect", path, "--conf-dir", conf, "--plugin-dir", plugins, NULL);
    if (run.status != 0)
      g_error("inspect %s: exit %d: %s", cases[i].fixture, run.status, run.err);
    g_assert_cmpstr(run.out, ==, cases[i].want);
    g_assert_cmpstr(run.err, ==, "");
    test_run_clear(&run);
  }

  g_autofree char *app = fixture("app-b");
  TestRun run = test_run("inspect", app, "--select", "app.model", "--json", "--conf-dir", conf, "--plugin-dir", plugins,
                         NULL);
  g_autofree char *want = g_strdup_printf(
      "{\n"
      "  \"path\" : \"%s\",\n"
      "  \"format\" : \"dcp\",\n"
      "  \"tensors\" : [\n"
      "    {\n"
      "      \"name\" : \"b\",\n"
      "      \"dtype\" : \"I64\",\n"
      "      \"shape\" : [\n"
      "        3\n"
      "      ],\n"
      "      \"bytes\" : 24,\n"
      "      \"chunks\" : 1\n"
      "    },\n"
      "    {\n"
      "      \"name\" : \"w\",\n"
      "      \"dtype\" : \"F32\",\n"
      "      \"shape\" : [\n"
      "        6,\n"
      "        2\n"
      "      ],\n"
      "      \"bytes\" : 48,\n"
      "      \"chunks\" : 3\n"
      "    }\n"
      "  ],\n"
      "  \"skipped\" : [],\n"
      "  \"wrapper\" : \"app.model\",\n"
      "  \"dropped\" : 8,\n"
      "  \"refusal\" : null,\n"
      "  \"total_tensors\" : 2,\n"
      "  \"total_bytes\" : 72\n"
      "}\n",
      app);
  g_assert_cmpint(run.status, ==, 0);
  g_assert_cmpstr(run.out, ==, want);
  test_run_clear(&run);

  /* the refusal as JSON; a selection with nothing under it is an error, exit 3 */
  run = test_run("inspect", app, "--json", "--conf-dir", conf, "--plugin-dir", plugins, NULL);
  g_assert_cmpint(run.status, ==, 0);
  test_assert_has(run.out, "\"refusal\" : \"the checkpoint holds more than one state dict: "
                           "under app, app.model (2 tensors) and app.optim (6 tensors, 2 other "
                           "values); pass --select KEY");
  test_assert_has(run.out, "\"name\" : \"app.optim.state.w.exp_avg\"");
  test_run_clear(&run);
  /* the text names every command that refuses (it named merge and convert, not plan) */
  run = test_run("inspect", app, "--conf-dir", conf, "--plugin-dir", plugins, NULL);
  g_assert_cmpint(run.status, ==, 0);
  test_assert_has(run.out, "\nnote: merge, convert, plan and sync refuse these names: the "
                           "checkpoint holds more than one state dict: under app, ");
  test_run_clear(&run);
  run = test_run("plan", app, "--target", "hf", "--conf-dir", conf, "--plugin-dir", plugins,
                 NULL);
  g_assert_cmpint(run.status, ==, 3);
  test_assert_has(run.err, "the checkpoint holds more than one state dict: under app, ");
  test_run_clear(&run);
  run = test_run("inspect", app, "--select", "app", "--conf-dir", conf, "--plugin-dir", plugins, NULL);
  g_assert_cmpint(run.status, ==, 3);
  g_assert_cmpstr(run.out, ==, "");
  test_assert_has(run.err, "/.metadata: --select app: no tensor of the saved state dict is "
                           "directly under it (under app, ");
  test_run_clear(&run);
  test_rmtree(conf);
}

/* What the user sees: merge refuses a model beside its optimizer, exit 3, one line and
 * nothing written; with --select it writes the model alone, equal to the unsharded
 * source; --select on a source that is no DCP is a usage error. */
static void
test_select_cli(void)
{
  g_autofree char *conf = hf_conf_dir();
  g_autofree char *dst = g_build_filename(conf, "merged", NULL);
  g_autofree char *app = fixture("app-b"), *titan = fixture("titan-b");
  g_autofree char *source = fixture("flat.safetensors");
  const char *plugins = test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR");
  TestRun run = test_run("merge", app, dst, "--conf-dir", conf, "--plugin-dir", plugins, NULL);
  g_autofree char *want = g_strdup_printf(
      "wsync: %s/.metadata: the checkpoint holds more than one state dict: under app, "
      "app.model (2 tensors) and app.optim (6 tensors, 2 other values); pass --select KEY, KEY "
      "the one that is the model's (the tensors directly under it are taken)\n",
      app);
  g_assert_cmpint(run.status, ==, 3);
  g_assert_cmpstr(run.out, ==, "");
  g_assert_cmpstr(run.err, ==, want);
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
  test_run_clear(&run);

  const char *const selected[][2] = {{app, "app.model"}, {titan, "."}};
  for (guint i = 0; i < G_N_ELEMENTS(selected); i++) {
    run = test_run("merge", selected[i][0], dst, "--select", selected[i][1], "--force",
                   "--conf-dir", conf, "--plugin-dir", plugins, NULL);
    if (run.status != 0)
      g_error("merge --select %s: exit %d: %s", selected[i][1], run.status, run.err);
    test_run_clear(&run);
    run = test_run("verify", source, dst, "--conf-dir", conf, NULL);
    g_assert_cmpint(run.status, ==, 0);
    g_assert_cmpstr(run.out, ==, "equal: 2 tensors, 72 bytes\n");
    test_run_clear(&run);
  }

  g_autofree char *dst2 = g_build_filename(conf, "merged2", NULL);
  run = test_run("merge", source, dst2, "--select", "model", "--conf-dir", conf, "--plugin-dir",
                 plugins, NULL);
  g_assert_cmpint(run.status, ==, 3); /* merge: not a sharded checkpoint at all */
  test_assert_has(run.err, "not a sharded checkpoint");
  test_run_clear(&run);
  run = test_run("plan", source, "--target", "hf", "--select", "model", "--conf-dir", conf,
                 "--plugin-dir", plugins, NULL);
  g_autofree char *want_plan = g_strdup_printf(
      "wsync: %s: --select applies to a sharded training checkpoint (PyTorch DCP), and this is "
      "none\n",
      source);
  g_assert_cmpint(run.status, ==, 2);
  g_assert_cmpstr(run.err, ==, want_plan);
  g_assert_false(g_file_test(dst2, G_FILE_TEST_EXISTS));
  test_run_clear(&run);
  test_rmtree(conf);
}

/* A copy of the directory tree @from at @to (files and directories only). */
static void
copy_tree(const char *from, const char *to)
{
  g_autoptr(GDir) d = g_dir_open(from, 0, NULL);
  const char *name;

  g_assert_nonnull(d);
  g_assert_cmpint(g_mkdir(to, 0700), ==, 0);
  while ((name = g_dir_read_name(d)) != NULL) {
    g_autofree char *a = g_build_filename(from, name, NULL);
    g_autofree char *b = g_build_filename(to, name, NULL);
    if (g_file_test(a, G_FILE_TEST_IS_DIR))
      copy_tree(a, b);
    else
      test_copy(a, b);
  }
}

/* A Unix socket (bound, then left behind) or a FIFO in place of the file @path. */
static void
replace_by_special(const char *path, gboolean socket_file)
{
  g_assert_cmpint(g_unlink(path), ==, 0);
  if (!socket_file) {
    g_assert_cmpint(mkfifo(path, 0600), ==, 0);
    return;
  }
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  g_assert_cmpuint(strlen(path), <, sizeof addr.sun_path);
  strcpy(addr.sun_path, path);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  g_assert_cmpint(fd, >=, 0);
  g_assert_cmpint(bind(fd, (struct sockaddr *)&addr, sizeof addr), ==, 0);
  close(fd);
}

/* merge and inspect refuse a socket in a sharded checkpoint as they refuse a FIFO, in
 * the same words (exit 3, naming it): a shard of format A, the .metadata and a data file
 * of format B.  A socket was "cannot open ...: No such device or address" (exit 4), and a
 * socket or FIFO .metadata "no .metadata", as if there were none. */
static void
test_merge_special_files_cli(void)
{
  g_autofree char *conf = hf_conf_dir();
  const char *plugins = test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR");
  const struct {
    const char *fixture, *file, *want; /* want: after "wsync: SRC/" */
  } cases[] = {
      {"good-a", "sharded/shard-00001-model-00001-of-00002.safetensors",
       "sharded/shard-00001-model-00001-of-00002.safetensors: not a regular file\n"},
      {"good-b", ".metadata", ".metadata: not a regular file\n"},
      {"good-b", "__1_0.distcp",
       ".metadata: tensor \"lm_head.weight\": chunk [3:6, 0:4]: \"__1_0.distcp\" is not a "
       "regular file that can be mapped\n"},
  };

  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    for (guint k = 0; k < 2; k++) {
      g_autofree char *from = fixture(cases[i].fixture);
      g_autofree char *src = g_build_filename(conf, "src", NULL);
      g_autofree char *dst = g_build_filename(conf, "merged", NULL);
      copy_tree(from, src);
      g_autofree char *odd = g_build_filename(src, cases[i].file, NULL);
      replace_by_special(odd, k == 0);
      g_autofree char *want = g_strdup_printf("wsync: %s/%s", src, cases[i].want);
      TestRun run = test_run("merge", src, dst, "--conf-dir", conf, "--plugin-dir", plugins, NULL);
      g_assert_cmpint(run.status, ==, 3);
      g_assert_cmpstr(run.err, ==, want);
      g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
      test_run_clear(&run);
      run = test_run("inspect", src, "--conf-dir", conf, "--plugin-dir", plugins, NULL);
      g_assert_cmpint(run.status, ==, 3);
      g_assert_cmpstr(run.out, ==, "");
      g_assert_cmpstr(run.err, ==, want);
      test_run_clear(&run);
      test_rmtree(src);
    }
  }
  test_rmtree(conf);
}

/* Through the command: both saves merge to the same files, byte for byte, and to the
 * unsharded source. */
static void
test_merge_per_rank_cli(void)
{
  const char *names[] = {"ranks-b", "ranks-b-per-rank"};
  g_autofree char *conf = hf_conf_dir();
  g_autofree char *source = fixture("ranks.safetensors");
  char *dst[2];
  for (guint i = 0; i < 2; i++) {
    g_autofree char *path = fixture(names[i]);
    dst[i] = g_build_filename(conf, names[i], NULL);
    TestRun run = test_run("merge", path, dst[i], "--conf-dir", conf, "--plugin-dir",
                           test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR"), NULL);
    if (run.status != 0)
      g_error("merge %s: exit %d: %s", names[i], run.status, run.err);
    test_run_clear(&run);
    run = test_run("verify", source, dst[i], "--conf-dir", conf, NULL);
    g_assert_cmpint(run.status, ==, 0);
    g_assert_cmpstr(run.out, ==, "equal: 4 tensors, 168 bytes\n");
    test_run_clear(&run);
  }
  guint n = 0;
  GError *error = NULL;
  GDir *dir = g_dir_open(dst[0], 0, &error);
  g_assert_no_error(error);
  for (const char *name; (name = g_dir_read_name(dir)) != NULL; n++) {
    g_autofree char *p0 = g_build_filename(dst[0], name, NULL);
    g_autofree char *p1 = g_build_filename(dst[1], name, NULL);
    g_autofree char *b0 = NULL, *b1 = NULL;
    gsize n0 = 0, n1 = 0;
    g_assert_true(g_file_get_contents(p0, &b0, &n0, NULL));
    if (!g_file_get_contents(p1, &b1, &n1, NULL))
      g_error("merging the per-rank save wrote no %s", name);
    if (n0 != n1 || memcmp(b0, b1, n0) != 0)
      g_error("%s differs between the collective and the per-rank save", name);
  }
  g_dir_close(dir);
  g_assert_cmpuint(n, >, 0);
  for (guint i = 0; i < 2; i++)
    g_free(dst[i]);
  test_rmtree(conf);
}

/* ================================================================ refusals */

typedef struct {
  const char *fixture;
  gboolean at_open; /* refused by wsync_dcp_open (else by the coverage check) */
  const char *fragments[6];
  gboolean cli; /* also run `wsync merge` on it (exit 3, the same message) */
} Refusal;

static const Refusal refusals[] = {
    {"a-missing-shard", FALSE,
     {"a-missing-shard/sharded: tensor \"model.bytes\": no chunk covers [2:4] (shape [8], 3 "
      "chunks)",
      "the checkpoint is incomplete", NULL}, FALSE},
    {"a-corrupt-replica", FALSE,
     {"tensor \"model.layers.0.input_layernorm.weight\": chunk [0:6] (",
      "shard-00001-model-00001-of-00002.safetensors) and chunk [0:6] (",
      "shard-00003-model-00001-of-00002.safetensors) overlap on [0:6] but differ at element [0]",
      "replicas must be byte-identical", NULL}, FALSE},
    {"a-no-info", TRUE,
     {"shard-00003-model-00001-of-00002.safetensors: no DCP_SHARDING_INFO in __metadata__",
      "torch's consolidator refuses it too", NULL}, FALSE},
    {"b-missing-file", TRUE,
     {"b-missing-file/.metadata: tensor \"model.bytes\": chunk [4:6]: its data file "
      "\"__2_0.distcp\" is missing",
      NULL}, FALSE},
    {"b-missing-chunk", FALSE,
     {"b-missing-chunk/.metadata: tensor \"model.embed_tokens.weight\": no chunk covers [3:6, "
      "0:4] (shape [10, 4], 3 chunks)",
      NULL}, FALSE},
    {"b-corrupt-replica", FALSE,
     {"tensor \"model.layers.0.input_layernorm.weight\": chunk [0:4] (",
      "__0_0.distcp) and chunk [2:6] (", "__2_0.distcp) overlap on [2:4] but differ at element [2]",
      NULL}, FALSE},
    {"b-zstd", TRUE,
     {"tensor \"model.norm.weight\": chunk [0:4] is stored with the transform \"stream.zstd/1\"",
      "only plain torch.save archives are supported", NULL}, FALSE},
    {"b-deflate", TRUE,
     {"__0_0.distcp: tensor \"model.norm.weight\": chunk [0:4]: archive at byte ",
      ": entry \"archive/data/0\" is compressed (method 8); only stored entries are supported",
      NULL}, FALSE},
    {"b-bigendian", TRUE,
     {"tensor \"model.norm.weight\": chunk [0:4]",
      "byteorder is \"big\"; only little-endian archives are supported", NULL}, FALSE},
    {"b-dtype", TRUE,
     {"tensor \"model.norm.weight\": chunk [0:4]", "holds F16 data but the metadata says BF16",
      NULL}, FALSE},
    {"b-oob", TRUE,
     {"b-oob/.metadata: tensor \"model.embed_tokens.weight\": chunk [10:11, 1:5] lies outside "
      "the shape [10, 4]",
      NULL}, FALSE},
    {"b-evil", TRUE,
     {"b-evil/.metadata: pickle byte ",
      ": the global os.system is not one DCP writes (refused; nothing is imported)", NULL},
     TRUE},
    {"b-sparse", TRUE,
     {"b-sparse/.metadata: tensor \"model.norm.weight\": layout torch.sparse_coo is not "
      "supported; only dense tensors (torch.strided) are",
      NULL},
     TRUE},
    {"b-layout-unknown", TRUE,
     {"b-layout-unknown/.metadata: pickle byte ",
      ": torch.serialization._get_layout of \"torch.bogus\", which is not a torch layout", NULL},
     TRUE},
    {"b-getattr-member", TRUE,
     {"b-getattr-member/.metadata: pickle byte ",
      ": torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING has no member "
      "\"TORCH_EVIL_FORMAT\" (refused; nothing is called)",
      NULL},
     TRUE},
    {"b-getattr-class", TRUE,
     {"b-getattr-class/.metadata: pickle byte ",
      ": builtins.getattr on the global torch.Size: getattr is read only as a member of a DCP "
      "enum class (refused; nothing is called)",
      NULL},
     TRUE},
    {"b-enum-value", TRUE,
     {"b-enum-value/.metadata: pickle byte ",
      ": torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING has no member of value 7",
      NULL},
     TRUE},
    {"b-view", TRUE,
     {"tensor \"model.norm.weight\": chunk [0:4]",
      "data.pkl: size [4], stride [2] and storage offset 0 reach element 6 of a storage of 4",
      NULL}, FALSE},
    /* the key is the pickle's bytes: quoted printable, the message one line */
    {"b-key-control", TRUE,
     {"tensor \"model.norm.weight\": chunk [0:4]",
      ": data.pkl: storage key \"\\x10\" is not a decimal number", NULL}, FALSE},
    {"ambiguous", TRUE, {"holds both a .metadata", "ambiguous", NULL}, FALSE},
    {"ranks-missing-meta", TRUE,
     {"ranks-missing-meta/__1.metadata: missing, but rank 1's data files (__1_K.distcp) are "
      "there: a checkpoint saved with use_collectives=False has one __R.metadata per rank",
      NULL},
     TRUE},
    {"ranks-missing-meta0", TRUE,
     {"ranks-missing-meta0/__0.metadata: missing, but __1.metadata is there: a checkpoint "
      "saved with use_collectives=False has one __R.metadata per rank, from __0.metadata on",
      NULL},
     TRUE},
    {"ranks-shape-disagree", TRUE,
     {"ranks-shape-disagree/__1.metadata: tensor \"model.embed_tokens.weight\": global shape "
      "[6, 4], but [5, 4] in ",
      "ranks-shape-disagree/__0.metadata: the ranks' metadata disagree", NULL},
     TRUE},
    {"ranks-ambiguous", TRUE,
     {"ranks-ambiguous: holds both a .metadata and per-rank __R.metadata files (a save with "
      "use_collectives=False); which one is the checkpoint is ambiguous (torch would take "
      ".metadata)",
      NULL}, FALSE},
    {"b-safetensors", TRUE,
     {"b-safetensors/__0_0.distcp: tensor \"model.embed_tokens.weight\": chunk [0:3, 0:4]: a "
      "safetensors blob at byte 803, not a torch.save archive: the checkpoint was written with "
      "SerializationFormat.SAFETENSORS, which wsync does not read",
      NULL},
     TRUE},
    {"good.safetensors", TRUE, {"not a directory", NULL}, FALSE},
};

static void
test_refusal(gconstpointer data)
{
  const Refusal *r = data;
  g_autofree char *path = fixture(r->fixture);
  GError *error = NULL;
  g_autoptr(WsyncDcp) dcp = wsync_dcp_open(path, &error);
  if (r->at_open) {
    g_assert_null(dcp);
    check_error(error, r->fragments);
  } else {
    g_assert_no_error(error);
    g_assert_nonnull(dcp);
    g_assert_false(wsync_dcp_check_coverage(dcp, &error));
    check_error(error, r->fragments);
  }
  g_clear_error(&error);
}

/* What the user sees: `wsync merge` exits 3 with the same one-line message, and writes
 * nothing. */
static void
test_refusal_cli(gconstpointer data)
{
  const Refusal *r = data;
  g_autofree char *path = fixture(r->fixture);
  g_autofree char *conf = hf_conf_dir();
  g_autofree char *dst = g_build_filename(conf, "merged", NULL);
  TestRun run = test_run("merge", path, dst, "--conf-dir", conf, "--plugin-dir",
                         test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR"), NULL);
  g_assert_cmpint(run.status, ==, 3);
  g_assert_cmpstr(run.out, ==, "");
  g_assert_true(g_str_has_prefix(run.err, "wsync: "));
  g_assert_true(strchr(run.err, '\n') == run.err + strlen(run.err) - 1); /* one line */
  for (guint i = 0; r->fragments[i]; i++)
    test_assert_has(run.err, r->fragments[i]);
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
  test_run_clear(&run);
  test_rmtree(conf);
}

/* Both pickling styles of the memory format, protocols 2, 4 and 5 (pathlib._local),
 * format A, and a state dict under accelerate's "model" key, through the command: merge
 * exits 0 and gives back the unsharded source, bit for bit. */
static void
test_merge_cli(void)
{
  const char *names[] = {"good-b", "good-b-by-name", "good-b-p2", "good-b-p5", "good-a",
                         "wrapped-b"};
  g_autofree char *source = fixture("good.safetensors");
  for (guint i = 0; i < G_N_ELEMENTS(names); i++) {
    g_autofree char *path = fixture(names[i]);
    g_autofree char *conf = hf_conf_dir();
    g_autofree char *dst = g_build_filename(conf, "merged", NULL);
    TestRun run = test_run("merge", path, dst, "--conf-dir", conf, "--plugin-dir",
                           test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR"), NULL);
    if (run.status != 0)
      g_error("merge %s: exit %d: %s", names[i], run.status, run.err);
    test_run_clear(&run);
    run = test_run("verify", source, dst, "--conf-dir", conf, NULL);
    g_assert_cmpint(run.status, ==, 0);
    g_assert_cmpstr(run.out, ==, "equal: 22 tensors, 1744 bytes\n");
    test_run_clear(&run);
    test_rmtree(conf);
  }
}

static gint
compare_names(gconstpointer a, gconstpointer b)
{
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The names in @dir, sorted, joined by spaces. */
static char *
sorted_names(const char *dir)
{
  g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
  g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
  const char *name;

  g_assert_nonnull(d);
  while ((name = g_dir_read_name(d)) != NULL)
    g_ptr_array_add(names, g_strdup(name));
  g_ptr_array_sort(names, compare_names);
  g_ptr_array_add(names, NULL);
  return g_strjoinv(" ", (char **)names->pdata);
}

/* A signal caught by merge after DST was swapped in stops nothing: merge says so in one
 * line after its report ("DST is the new output, complete") and ends by the signal, and
 * DST holds the new output, byte for byte what a merge that was not signalled writes.
 * WSYNC_TEST_SIGNAL_AFTER="swap ended" raises SIGTERM at that exact point (core/exec.c
 * signal_if_asked()); tests/test-reliability.c /reliability/signal/after-swap checks
 * convert and synth the same way. */
static void
test_merge_signal_after_swap_cli(void)
{
  g_autofree char *conf = hf_conf_dir();
  g_autofree char *dst = g_build_filename(conf, "merged", NULL);
  g_autofree char *plain = g_build_filename(conf, "plain", NULL);
  g_autofree char *app = fixture("app-b"), *good = fixture("good-b");
  const char *plugins = test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR");

  /* DST first holds another merge's output (2 tensors), which the signalled run replaces */
  TestRun run = test_run("merge", app, dst, "--select", "app.model", "--conf-dir", conf,
                         "--plugin-dir", plugins, NULL);
  g_assert_cmpint(run.status, ==, 0);
  test_run_clear(&run);
  run = test_run("merge", good, plain, "--conf-dir", conf, "--plugin-dir", plugins, NULL);
  g_assert_cmpint(run.status, ==, 0);
  g_autofree char *report = g_strdup(run.out);
  test_run_clear(&run);

  g_setenv("WSYNC_TEST_SIGNAL_AFTER", "swap ended", TRUE);
  run = test_run("merge", good, dst, "--force", "--conf-dir", conf, "--plugin-dir", plugins,
                 NULL);
  g_unsetenv("WSYNC_TEST_SIGNAL_AFTER");
  g_assert_cmpint(run.signal, ==, SIGTERM);
  g_assert_cmpstr(run.err, ==,
                  "wsync: merge: interrupted by SIGTERM after DST was swapped in: DST is the "
                  "new output, complete\n");
  g_autoptr(GString) report_for_dst = g_string_new(report);
  g_string_replace(report_for_dst, plain, dst, 0);
  g_assert_cmpstr(run.out, ==, report_for_dst->str); /* the report, whole */
  test_run_clear(&run);

  /* DST is the new output, byte for byte; nothing else is left beside it */
  g_autofree char *names = sorted_names(dst), *plain_names = sorted_names(plain);
  g_assert_cmpstr(names, ==, plain_names);
  g_auto(GStrv) files = g_strsplit(names, " ", -1);
  for (guint i = 0; files[i] != NULL; i++) {
    g_autofree char *a = g_build_filename(dst, files[i], NULL);
    g_autofree char *b = g_build_filename(plain, files[i], NULL);
    g_autofree char *got = NULL, *want = NULL;
    gsize got_len = 0, want_len = 0;
    g_assert_true(g_file_get_contents(a, &got, &got_len, NULL));
    g_assert_true(g_file_get_contents(b, &want, &want_len, NULL));
    g_assert_cmpmem(got, got_len, want, want_len);
  }
  g_autofree char *beside = sorted_names(conf);
  g_assert_cmpstr(beside, ==, "10-hf.conf merged plain");
  test_rmtree(conf);
}

/* A metadata file that cannot be read is named printably, as every other message of the
 * reader names its paths: the directory's newline and ESC as \x0a and \x1b, not raw
 * bytes that split the line or drive a terminal (the I/O error of parse_metadata_file()
 * printed the path as it was). */
static void
test_metadata_unreadable_path_printable(void)
{
  g_autofree char *tmp = test_tmpdir();
  g_autofree char *dir = g_build_filename(tmp, "a\nb\033c", NULL);
  g_assert_cmpint(g_mkdir(dir, 0755), ==, 0);
  g_autofree char *meta = g_build_filename(dir, "__0.metadata", NULL);
  g_assert_cmpint(symlink("nowhere", meta), ==, 0); /* listed, but cannot be opened */
  GError *error = NULL;
  g_autoptr(WsyncDcp) dcp = wsync_dcp_open(dir, &error);
  g_assert_null(dcp);
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_IO);
  g_autofree char *want =
      g_strdup_printf("cannot read %s/a\\x0ab\\x1bc/__0.metadata: No such file or directory", tmp);
  g_assert_cmpstr(error->message, ==, want);
  g_clear_error(&error);
  test_rmtree(tmp);
}

static void
test_not_a_checkpoint(void)
{
  GError *error = NULL;
  g_autoptr(WsyncDcp) dcp = wsync_dcp_open(fixtures, &error);
  g_assert_null(dcp);
  const char *const frags[] = {"not a sharded checkpoint: no .metadata, no __R.metadata and no "
                               "shard-S-model-I-of-N.safetensors files",
                               NULL};
  check_error(error, frags);
  g_clear_error(&error);

  /* Data files alone: detected (a DCP directory), refused with what is missing. */
  g_autofree char *tmp = test_tmpdir();
  g_autofree char *from = fixture("ranks-b-per-rank/__0_0.distcp");
  g_autofree char *to = g_build_filename(tmp, "__0_0.distcp", NULL);
  test_copy(from, to);
  g_assert_true(wsync_dcp_detect(tmp));
  dcp = wsync_dcp_open(tmp, &error);
  g_assert_null(dcp);
  const char *const data_frags[] = {"holds __R_K.distcp data files but no .metadata and no "
                                    "__R.metadata: the checkpoint's metadata is missing",
                                    NULL};
  check_error(error, data_frags);
  g_clear_error(&error);
  test_rmtree(tmp);

  /* A rank's metadata that is not a regular file: bad input, named once. */
  g_autofree char *odd = test_tmpdir();
  g_autofree char *odd_meta = g_build_filename(odd, "__0.metadata", NULL);
  g_assert_cmpint(g_mkdir(odd_meta, 0700), ==, 0);
  g_assert_true(wsync_dcp_detect(odd));
  dcp = wsync_dcp_open(odd, &error);
  g_assert_null(dcp);
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT);
  g_autofree char *odd_want = g_strdup_printf("%s: not a regular file", odd_meta);
  g_assert_cmpstr(error->message, ==, odd_want);
  g_clear_error(&error);
  test_rmtree(odd);

  g_autofree char *none = fixture("nowhere");
  dcp = wsync_dcp_open(none, &error);
  g_assert_null(dcp);
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_IO);
  g_clear_error(&error);
}

/* A state dict saved with torch.save by each rank (verl's model_world_size_W_rank_R.pt
 * beside optim_ and extra_state_ archives, docs/torch-save.md) is not read: refused by the
 * reader and by `wsync merge` (exit 3, nothing written), the archives recognised by
 * content and named (three, then a count), not the zip without a directory nor the
 * truncated archive beside them. */
static void
test_torch_save_ranks(void)
{
  g_autofree char *path = fixture("torch-save-ranks");
  const char *const frags[] = {
      "torch-save-ranks: not a sharded checkpoint: no .metadata, no __R.metadata and no "
      "shard-S-model-I-of-N.safetensors files (in it or in sharded/); it holds torch.save "
      "archives (extra_state_world_size_2_rank_0.pt, model_world_size_2_rank_0.pt, "
      "model_world_size_2_rank_1.pt and 2 more): wsync does not read torch.save archives (a "
      "whole model's or each rank's state dict), only safetensors files and DCP checkpoints",
      NULL};
  GError *error = NULL;
  g_assert_false(wsync_dcp_detect(path));
  g_autoptr(WsyncDcp) dcp = wsync_dcp_open(path, &error);
  g_assert_null(dcp);
  check_error(error, frags);
  g_assert_null(strstr(error->message, "notes.zip"));
  g_assert_null(strstr(error->message, "broken.pt"));
  g_clear_error(&error);

  g_autofree char *one = fixture("torch-save-ranks-one");
  dcp = wsync_dcp_open(one, &error);
  g_assert_null(dcp);
  const char *const one_frags[] = {
      "; it holds a torch.save archive (model.pt): wsync does not read torch.save archives",
      NULL};
  check_error(error, one_frags);
  g_clear_error(&error);

  g_autofree char *conf = hf_conf_dir();
  g_autofree char *dst = g_build_filename(conf, "merged", NULL);
  TestRun run = test_run("merge", path, dst, "--conf-dir", conf, "--plugin-dir",
                         test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR"), NULL);
  g_assert_cmpint(run.status, ==, 3);
  g_assert_cmpstr(run.out, ==, "");
  test_assert_has(run.err, "torch-save-ranks: not a sharded checkpoint (");
  test_assert_has(run.err, "; it holds torch.save archives (extra_state_world_size_2_rank_0.pt, "
                           "model_world_size_2_rank_0.pt, model_world_size_2_rank_1.pt and 2 "
                           "more): wsync does not read torch.save archives (a whole model's "
                           "or each rank's state dict), only safetensors files and DCP "
                           "checkpoints\n");
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
  test_run_clear(&run);

  /* inspect and convert take it for a Hugging Face directory: they say the same */
  run = test_run("inspect", path, "--conf-dir", conf, "--plugin-dir",
                 test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR"), NULL);
  g_assert_cmpint(run.status, ==, 3);
  g_assert_cmpstr(run.out, ==, "");
  g_autofree char *ranks_want = g_strdup_printf(
      "wsync: no safetensors files in %s and it is not a sharded checkpoint; it holds "
      "torch.save archives (extra_state_world_size_2_rank_0.pt, model_world_size_2_rank_0.pt, "
      "model_world_size_2_rank_1.pt and 2 more): wsync does not read torch.save archives (a "
      "whole model's or each rank's state dict), only safetensors files and DCP checkpoints\n",
      path);
  g_assert_cmpstr(run.err, ==, ranks_want);
  test_run_clear(&run);
  /* one archive, a model saved whole with torch.save: not "by each rank", and wsync
   * does read safetensors (before: "... by each rank is not a format wsync reads (only DCP
   * checkpoints are)") */
  run = test_run("inspect", one, "--conf-dir", conf, "--plugin-dir",
                 test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR"), NULL);
  g_assert_cmpint(run.status, ==, 3);
  g_autofree char *one_want = g_strdup_printf(
      "wsync: no safetensors files in %s and it is not a sharded checkpoint; it holds a "
      "torch.save archive (model.pt): wsync does not read torch.save archives (a whole "
      "model's or each rank's state dict), only safetensors files and DCP checkpoints\n",
      one);
  g_assert_cmpstr(run.err, ==, one_want);
  test_run_clear(&run);
  run = test_run("convert", path, dst, "--target", "hf", "--conf-dir", conf, "--plugin-dir",
                 test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR"), NULL);
  g_assert_cmpint(run.status, ==, 3);
  test_assert_has(run.err, "no safetensors files in ");
  test_assert_has(run.err, "torch-save-ranks and it is not a sharded checkpoint; it holds "
                           "torch.save archives (");
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
  test_run_clear(&run);
  test_rmtree(conf);
}

/* Both shard sets: SRC/shard-* and SRC/sharded/shard-*. */
/* An HF Trainer step directory holds accelerate's checkpoints as subdirectories
 * (pytorch_model_fsdp_0/, optimizer_0/): refused, naming them, by the reader and by
 * `wsync merge` (exit 3, nothing written). */
static void
test_step_directory(void)
{
  g_autofree char *path = fixture("trainer-step");
  const char *const frags[] = {
      "trainer-step: not a sharded checkpoint",
      "; its subdirectories optimizer_0 and pytorch_model_fsdp_0 are: pass one of them as SRC",
      NULL};
  GError *error = NULL;
  g_assert_false(wsync_dcp_detect(path));
  g_autoptr(WsyncDcp) dcp = wsync_dcp_open(path, &error);
  g_assert_null(dcp);
  check_error(error, frags);
  g_clear_error(&error);

  g_autofree char *conf = hf_conf_dir();
  g_autofree char *dst = g_build_filename(conf, "merged", NULL);
  TestRun run = test_run("merge", path, dst, "--conf-dir", conf, "--plugin-dir",
                         test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR"), NULL);
  g_assert_cmpint(run.status, ==, 3);
  g_assert_cmpstr(run.out, ==, "");
  for (guint i = 0; frags[i]; i++)
    test_assert_has(run.err, frags[i]);
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
  test_run_clear(&run);
  run = test_run("inspect", path, "--conf-dir", conf, "--plugin-dir",
                 test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR"), NULL);
  g_assert_cmpint(run.status, ==, 3);
  g_autofree char *step_want = g_strdup_printf(
      "wsync: no safetensors files in %s and it is not a sharded checkpoint; its "
      "subdirectories optimizer_0 and pytorch_model_fsdp_0 are: pass one of them as SRC\n",
      path);
  g_assert_cmpstr(run.err, ==, step_want);
  test_run_clear(&run);

  /* the model's subdirectory, as told: merged to the model's names */
  g_autofree char *model = fixture("trainer-step/pytorch_model_fsdp_0");
  g_autofree char *source = fixture("good.safetensors");
  run = test_run("merge", model, dst, "--conf-dir", conf, "--plugin-dir",
                 test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR"), NULL);
  g_assert_cmpint(run.status, ==, 0);
  test_run_clear(&run);
  run = test_run("verify", source, dst, "--conf-dir", conf, NULL);
  g_assert_cmpint(run.status, ==, 0);
  g_assert_cmpstr(run.out, ==, "equal: 22 tensors, 1744 bytes\n");
  test_run_clear(&run);
  test_rmtree(conf);
}

static void
test_both_shard_dirs(void)
{
  g_autofree char *tmp = test_tmpdir();
  g_autofree char *sub = g_build_filename(tmp, "sharded", NULL);
  g_assert_cmpint(g_mkdir(sub, 0700), ==, 0);
  g_autofree char *from = fixture("flat-a/shard-00001-model-00001-of-00001.safetensors");
  const char *name = "shard-00001-model-00001-of-00001.safetensors";
  g_autofree char *to1 = g_build_filename(tmp, name, NULL);
  g_autofree char *to2 = g_build_filename(sub, name, NULL);
  test_copy(from, to1);
  test_copy(from, to2);
  GError *error = NULL;
  g_autoptr(WsyncDcp) dcp = wsync_dcp_open(tmp, &error);
  const char *const frags[] = {"both directly and in sharded/", NULL};
  check_error(error, frags);
  g_clear_error(&error);
  test_rmtree(tmp);
}

/* A shard whose name promises another number of parts than its siblings. */
static void
test_parts_disagree(void)
{
  g_autofree char *tmp = test_tmpdir();
  g_autofree char *from = fixture("flat-a/shard-00001-model-00001-of-00001.safetensors");
  g_autofree char *from3 = fixture("flat-a/shard-00003-model-00001-of-00001.safetensors");
  g_autofree char *to1 =
      g_build_filename(tmp, "shard-00001-model-00001-of-00001.safetensors", NULL);
  g_autofree char *to2 =
      g_build_filename(tmp, "shard-00003-model-00001-of-00002.safetensors", NULL);
  test_copy(from, to1);
  test_copy(from3, to2);
  GError *error = NULL;
  g_autoptr(WsyncDcp) dcp = wsync_dcp_open(tmp, &error);
  const char *const frags[] = {"shard-00003-model-00001-of-00002.safetensors: the name says 2 "
                               "output parts but shard-00001-model-00001-of-00001.safetensors "
                               "says 1",
                               NULL};
  check_error(error, frags);
  g_clear_error(&error);
  test_rmtree(tmp);
}

/* ================================================================ coverage, on hand-made shards */

typedef struct {
  guint64 off[3], ext[3];
  gint64 corrupt; /* a chunk element whose value is spoiled, or -1 */
} Piece;

/* One format A shard image holding pieces of the I32 tensor "t" of @shape (element value
 * = its global row-major index), keys t.__dcp_shard_K with logical_fqn "t"; then
 * wsync_dcp_check_coverage() of it.  Returns the error, or NULL when covered. */
static GError *
coverage_of(guint ndim, const guint64 *shape, const Piece *pieces, guint n)
{
  g_autoptr(WsyncSafetensorsWriter) w = wsync_safetensors_writer_new();
  GString *info = g_string_new("{");
  GError *error = NULL;
  for (guint i = 0; i < n; i++) {
    g_autofree char *key = g_strdup_printf("t.__dcp_shard_%u", i);
    g_string_append_printf(info, "%s\"%s\": {\"logical_fqn\": \"t\", \"saved_offsets\": [",
                           i ? ", " : "", key);
    for (guint d = 0; d < ndim; d++)
      g_string_append_printf(info, "%s%" G_GUINT64_FORMAT, d ? ", " : "", pieces[i].off[d]);
    g_string_append(info, "]}");
    g_assert_true(
        wsync_safetensors_writer_add(w, key, WSYNC_DTYPE_I32, ndim, pieces[i].ext, &error));
  }
  g_string_append_c(info, '}');
  wsync_safetensors_writer_set_metadata(w, "DCP_SHARDING_INFO", info->str);
  g_string_free(info, TRUE);
  gsize hlen;
  g_autofree guint8 *header = wsync_safetensors_writer_header(w, &hlen);
  gsize total = hlen + wsync_safetensors_writer_data_size(w);
  g_autofree guint8 *image = g_malloc0(total + 1);
  memcpy(image, header, hlen);
  g_autoptr(WsyncSafetensors) st = wsync_safetensors_parse(image, total, "img", &error);
  g_assert_no_error(error);
  for (guint i = 0; i < n; i++) {
    g_autofree char *key = g_strdup_printf("t.__dcp_shard_%u", i);
    const WsyncTensor *t = wsync_safetensors_lookup(st, key);
    guint8 *out = image + (t->data - image);
    guint64 idx[3] = {0};
    for (guint64 e = 0; e < t->numel; e++) {
      guint64 g = 0;
      for (guint d = 0; d < ndim; d++)
        g = g * shape[d] + pieces[i].off[d] + idx[d];
      gint32 v = (gint32)g ^ ((gint64)e == pieces[i].corrupt ? 0x100 : 0);
      memcpy(out + 4 * e, &v, 4);
      for (guint d = ndim; d > 0; d--) {
        if (++idx[d - 1] < pieces[i].ext[d - 1])
          break;
        idx[d - 1] = 0;
      }
    }
  }
  g_autoptr(WsyncDcp) dcp = wsync_dcp_parse_shard(image, total, "img", &error);
  g_assert_no_error(error);
  const WsyncDcpTensor *t = wsync_dcp_lookup(dcp, "t");
  g_assert_nonnull(t);
  for (guint d = 0; d < ndim; d++)
    g_assert_cmpuint(t->shape[d], ==, shape[d]);
  if (wsync_dcp_check_coverage(dcp, &error))
    return NULL;
  g_assert_nonnull(error);
  g_assert_null(strchr(error->message, '\n'));
  return error;
}

static void
expect_coverage(guint ndim, const guint64 *shape, const Piece *pieces, guint n,
                const char *fragment)
{
  g_autoptr(GError) error = coverage_of(ndim, shape, pieces, n);
  if (fragment == NULL) {
    g_assert_no_error(error);
    return;
  }
  check_error(error, (const char *const[]){"img: tensor \"t\": ", fragment, NULL});
}

static void
test_coverage(void)
{
  const guint64 s46[] = {4, 6}, s33[] = {3, 3}, s42[] = {4, 2}, s4[] = {4}, s222[] = {2, 2, 2};
  /* A missing block of a 2 x 2 grid. */
  const Piece grid[] = {{{0, 0}, {2, 3}, -1}, {{0, 3}, {2, 3}, -1}, {{2, 0}, {2, 3}, -1}};
  expect_coverage(2, s46, grid, 3, "no chunk covers [2:4, 3:6] (shape [4, 6], 3 chunks)");
  /* A hole in the middle. */
  const Piece ring[] = {{{0, 0}, {1, 3}, -1}, {{2, 0}, {1, 3}, -1}, {{1, 0}, {1, 1}, -1},
                        {{1, 2}, {1, 1}, -1}};
  expect_coverage(2, s33, ring, 4, "no chunk covers [1:2, 1:2] (shape [3, 3], 4 chunks)");
  /* Partial overlaps that agree, and one that does not (element (2, 1)). */
  const Piece agree[] = {{{0, 0}, {3, 2}, -1}, {{1, 0}, {3, 2}, -1}};
  expect_coverage(2, s42, agree, 2, NULL);
  const Piece differ[] = {{{0, 0}, {3, 2}, -1}, {{1, 0}, {3, 2}, 3}};
  expect_coverage(2, s42, differ, 2,
                  "chunk [0:3, 0:2] (img) and chunk [1:4, 0:2] (img) overlap on [1:3, 0:2] but "
                  "differ at element [2, 1]");
  /* Three replicas, the third spoiled; an empty chunk beside them. */
  const Piece reps[] = {{{0}, {4}, -1}, {{4}, {0}, -1}, {{0}, {4}, -1}, {{0}, {4}, 2}};
  expect_coverage(1, s4, reps, 4, "chunk [0:4] (img) and chunk [0:4] (img) overlap on [0:4] but "
                                  "differ at element [2]");
  expect_coverage(1, s4, reps, 3, NULL);
  /* A scalar, replicated; then spoiled. */
  const Piece scalar[] = {{{0}, {0}, -1}, {{0}, {0}, -1}, {{0}, {0}, 0}};
  expect_coverage(0, NULL, scalar, 2, NULL);
  expect_coverage(0, NULL, scalar, 3, "overlap on [] but differ at element []");
  /* 3-D: an overlap across two axes, covered. */
  const Piece cube[] = {{{0, 0, 0}, {2, 2, 1}, -1}, {{0, 0, 1}, {2, 1, 1}, -1},
                        {{0, 1, 0}, {2, 1, 2}, -1}};
  expect_coverage(3, s222, cube, 3, NULL);
  expect_coverage(3, s222, cube, 2, "no chunk covers [0:2, 1:2, 1:2] (shape [2, 2, 2], 2 chunks)");
}

/* ================================================================ the pickle reader */

static WsyncPickle *
load(const char *bytes, gsize len, GError **error)
{
  return wsync_pickle_load((const guint8 *)bytes, len, "x.pkl", error);
}

#define LOAD(lit, err) load(lit, sizeof(lit) - 1, err)

static void
expect_pickle_error(const char *bytes, gsize len, const char *fragment)
{
  GError *error = NULL;
  g_autoptr(WsyncPickle) pk = load(bytes, len, &error);
  g_assert_null(pk);
  const char *const frags[] = {"x.pkl: pickle byte ", fragment, NULL};
  check_error(error, frags);
  g_clear_error(&error);
}

#define REFUSE(lit, frag) expect_pickle_error(lit, sizeof(lit) - 1, frag)

static void
test_pickle_values(void)
{
  GError *error = NULL;
  /* (70000, -2, 2^40, -2^63, True, "é", [None, 1], {"k": 2}, memo get) */
  static const char p[] = "\x80\x04"
                          "(J\x70\x11\x01\x00"          /* BININT 70000 */
                          "J\xfe\xff\xff\xff"           /* BININT -2 */
                          "\x8a\x06\x00\x00\x00\x00\x00\x01" /* LONG1 2^40 */
                          "\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80" /* LONG1 -2^63 */
                          "\x88"                        /* NEWTRUE */
                          "\x8c\x02\xc3\xa9\x94"        /* SHORT_BINUNICODE "é", MEMOIZE */
                          "](Nq\x01K\x01" "e"              /* [None, 1] with a BINPUT */
                          "}X\x01\x00\x00\x00kK\x02s"   /* {"k": 2} */
                          "h\x00"                       /* BINGET 0: "é" again */
                          "t.";
  g_autoptr(WsyncPickle) pk = LOAD(p, &error);
  g_assert_no_error(error);
  g_assert_cmpuint(wsync_pickle_protocol(pk), ==, 4);
  const WsyncPickleValue *root = wsync_pickle_root(pk);
  g_assert_cmpint(root->kind, ==, WSYNC_PICKLE_TUPLE);
  g_assert_cmpuint(wsync_pickle_n_items(root), ==, 9);
  g_assert_cmpint(wsync_pickle_item(root, 0)->integer, ==, 70000);
  g_assert_cmpint(wsync_pickle_item(root, 1)->integer, ==, -2);
  g_assert_cmpint(wsync_pickle_item(root, 2)->integer, ==, G_GINT64_CONSTANT(1) << 40);
  g_assert_cmpint(wsync_pickle_item(root, 3)->integer, ==, G_MININT64);
  g_assert_cmpint(wsync_pickle_item(root, 4)->kind, ==, WSYNC_PICKLE_BOOL);
  g_assert_cmpstr(wsync_pickle_item(root, 5)->str, ==, "é");
  const WsyncPickleValue *list = wsync_pickle_item(root, 6);
  g_assert_cmpuint(wsync_pickle_n_items(list), ==, 2);
  g_assert_cmpint(wsync_pickle_item(list, 0)->kind, ==, WSYNC_PICKLE_NONE);
  const WsyncPickleValue *dict = wsync_pickle_item(root, 7);
  g_assert_cmpint(wsync_pickle_dict_lookup(dict, "k")->integer, ==, 2);
  g_assert_null(wsync_pickle_dict_lookup(dict, "other"));
  g_assert_true(wsync_pickle_item(root, 8) == wsync_pickle_item(root, 5));

  /* Allowed globals, both spellings; a dtype without a safetensors name is known. */
  static const char g[] = "\x80\x02(ctorch\nbfloat16\nctorch\ncomplex128\n"
                          "cpathlib._local\nPosixPath\nX\x02\x00\x00\x00/a\x85R"
                          "t.";
  g_autoptr(WsyncPickle) pg = LOAD(g, &error);
  g_assert_no_error(error);
  root = wsync_pickle_root(pg);
  g_assert_cmpint(wsync_pickle_item(root, 0)->global, ==, WSYNC_PG_DTYPE);
  g_assert_true(wsync_pickle_item(root, 0)->has_dtype);
  g_assert_cmpint(wsync_pickle_item(root, 0)->dtype, ==, WSYNC_DTYPE_BF16);
  g_assert_false(wsync_pickle_item(root, 1)->has_dtype);
  g_assert_true(wsync_pickle_is_instance(wsync_pickle_item(root, 2), WSYNC_PG_POSIX_PATH));
}

/* Layouts and enum members are read as data, in every form torch and Python write. */
static void
test_pickle_layout_and_enum(void)
{
  GError *error = NULL;
  /* (_get_layout('torch.strided'), _MEM_FORMAT_ENCODING(1), getattr(_MEM_FORMAT_ENCODING,
   *  'TORCH_PRESERVE_FORMAT'), the bare global torch.strided, _get_layout('torch.sparse_csr')) */
  static const char p4[] =
      "\x80\x04("
      "\x8c\x13" "torch.serialization\x8c\x0b" "_get_layout\x93\x8c\x0d" "torch.strided\x85R"
      "\x8c\x25" "torch.distributed.checkpoint.metadata\x8c\x14" "_MEM_FORMAT_ENCODING\x93\x94"
      "K\x01\x85R"
      "\x8c\x08" "builtins\x8c\x07" "getattr\x93h\x00\x8c\x15" "TORCH_PRESERVE_FORMAT\x86R"
      "ctorch\nstrided\n"
      "ctorch.serialization\n_get_layout\n\x8c\x10" "torch.sparse_csr\x85R"
      "t.";
  g_autoptr(WsyncPickle) pk = LOAD(p4, &error);
  g_assert_no_error(error);
  const WsyncPickleValue *root = wsync_pickle_root(pk);
  g_assert_cmpuint(wsync_pickle_n_items(root), ==, 5);
  const WsyncPickleValue *v = wsync_pickle_item(root, 0);
  g_assert_cmpint(v->kind, ==, WSYNC_PICKLE_LAYOUT);
  g_assert_cmpstr(v->name, ==, "torch.strided");
  v = wsync_pickle_item(root, 1);
  g_assert_cmpint(v->kind, ==, WSYNC_PICKLE_ENUM);
  g_assert_cmpint(v->cls->global, ==, WSYNC_PG_MEM_FORMAT_ENCODING);
  g_assert_cmpstr(v->name, ==, "TORCH_CHANNELS_LAST");
  g_assert_cmpint(v->integer, ==, 1);
  g_autofree char *d = wsync_pickle_describe(v);
  g_assert_cmpstr(d, ==, "the member _MEM_FORMAT_ENCODING.TORCH_CHANNELS_LAST");
  v = wsync_pickle_item(root, 2);
  g_assert_cmpint(v->kind, ==, WSYNC_PICKLE_ENUM);
  g_assert_cmpstr(v->name, ==, "TORCH_PRESERVE_FORMAT");
  g_assert_cmpint(v->integer, ==, 2);
  g_assert_true(v->cls == wsync_pickle_item(root, 1)->cls);
  v = wsync_pickle_item(root, 3);
  g_assert_cmpint(v->kind, ==, WSYNC_PICKLE_LAYOUT);
  g_assert_cmpstr(v->name, ==, "torch.strided");
  v = wsync_pickle_item(root, 4);
  g_assert_cmpint(v->kind, ==, WSYNC_PICKLE_LAYOUT);
  g_autofree char *dl = wsync_pickle_describe(v);
  g_assert_cmpstr(dl, ==, "the layout torch.sparse_csr");

  /* Protocol 2: getattr as Python 2's __builtin__, and the enum under its older name in
   * torch.distributed._shard, by value. */
  static const char p2[] =
      "\x80\x02("
      "c__builtin__\ngetattr\nctorch.distributed.checkpoint.metadata\n_MEM_FORMAT_ENCODING\n"
      "X\x17\x00\x00\x00" "TORCH_CONTIGUOUS_FORMAT\x86R"
      "ctorch.distributed._shard.sharded_tensor.metadata\nMEM_FORMAT_ENCODING\nK\x02\x85R"
      "t.";
  g_autoptr(WsyncPickle) pk2 = LOAD(p2, &error);
  g_assert_no_error(error);
  root = wsync_pickle_root(pk2);
  v = wsync_pickle_item(root, 0);
  g_assert_cmpint(v->kind, ==, WSYNC_PICKLE_ENUM);
  g_assert_cmpstr(v->name, ==, "TORCH_CONTIGUOUS_FORMAT");
  g_assert_cmpint(v->integer, ==, 0);
  v = wsync_pickle_item(root, 1);
  g_assert_cmpint(v->kind, ==, WSYNC_PICKLE_ENUM);
  g_assert_cmpstr(v->name, ==, "TORCH_PRESERVE_FORMAT");
  g_assert_cmpstr(v->cls->name, ==, "MEM_FORMAT_ENCODING");
}

/* getattr and _get_layout are never calls: anything but a member of a DCP enum class or
 * a torch layout's name is refused, by name. */
static void
test_pickle_layout_and_enum_refusals(void)
{
#define ENUM_CLASS "ctorch.distributed.checkpoint.metadata\n_MEM_FORMAT_ENCODING\n"
#define GETATTR "c__builtin__\ngetattr\n"
#define GET_LAYOUT "ctorch.serialization\n_get_layout\n"
  REFUSE("\x80\x02" GETATTR "ctorch\nSize\nX\x01\x00\x00\x00x\x86R.",
         "__builtin__.getattr on the global torch.Size: getattr is read only as a member of a "
         "DCP enum class (refused; nothing is called)");
  REFUSE("\x80\x02" GETATTR "X\x02\x00\x00\x00osX\x06\x00\x00\x00system\x86R.",
         "__builtin__.getattr on the str \"os\": getattr is read only as a member");
  REFUSE("\x80\x04\x8c\x08" "builtins\x8c\x07" "getattr\x93" ENUM_CLASS
         "X\x09\x00\x00\x00__class__\x86R.",
         "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING has no member \"__class__\" "
         "(refused; nothing is called)");
  REFUSE("\x80\x02" GETATTR ENUM_CLASS "K\x00\x86R.",
         "__builtin__.getattr on torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING with "
         "the int 0, not a member name");
  REFUSE("\x80\x02" GETATTR ENUM_CLASS "X\x01\x00\x00\x00xN\x87R.",
         "REDUCE of __builtin__.getattr with 3 arguments is not something DCP writes");
  REFUSE("\x80\x02" GETATTR ENUM_CLASS "X\x01\x00\x00\x00x\x86\x81.",
         "NEWOBJ of __builtin__.getattr with 2 arguments is not something DCP writes");
  REFUSE("\x80\x02" ENUM_CLASS "K\x07\x85R.",
         "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING has no member of value 7");
  REFUSE("\x80\x02" ENUM_CLASS "X\x01\x00\x00\x00x\x85R.",
         "REDUCE of torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING with 1 arguments "
         "is not something DCP writes (one int is: the member's value)");
  REFUSE("\x80\x02" GET_LAYOUT "X\x0b\x00\x00\x00torch.bogus\x85R.",
         "torch.serialization._get_layout of \"torch.bogus\", which is not a torch layout");
  REFUSE("\x80\x02" GET_LAYOUT "K\x00\x85R.",
         "REDUCE of torch.serialization._get_layout with 1 arguments is not something DCP "
         "writes (one str is: the layout's name)");
  REFUSE("\x80\x02" GET_LAYOUT ")R.",
         "REDUCE of torch.serialization._get_layout with 0 arguments");
  REFUSE("\x80\x02" "ctorch\nstrided\n)R.", "REDUCE of the layout torch.strided, not a class");
  REFUSE("\x80\x02" "c__builtin__\nsetattr\n.",
         "the global __builtin__.setattr is not one DCP writes (refused; nothing is imported)");
  REFUSE("\x80\x02" "cbuiltins\neval\n.", "the global builtins.eval is not one DCP writes");
  REFUSE("\x80\x02" "ctorch.serialization\nload\n.",
         "the global torch.serialization.load is not one DCP writes");
  REFUSE("\x80\x02" "cos\ngetattr\n.", "the global os.getattr is not one DCP writes");
#undef ENUM_CLASS
#undef GETATTR
#undef GET_LAYOUT
}

static void
test_pickle_refusals(void)
{
  REFUSE("", "empty file, not a pickle");
  REFUSE("N.", "does not start with PROTO");
  REFUSE("\x80\x01N.", "pickle protocol 1 is not supported (2 to 5 are)");
  REFUSE("\x80\x06N.", "pickle protocol 6 is not supported");
  REFUSE("\x80\x02N", "ends without STOP");
  REFUSE("\x80\x02N.N", "1 bytes after STOP");
  REFUSE("\x80\x02NN.", "STOP leaves 1 values on the stack");
  REFUSE("\x80\x02(N.", "STOP inside a MARK");
  REFUSE("\x80\x02.", "STOP needs a value but the stack is empty");
  REFUSE("\x80\x02\x85.", "TUPLE1 needs 1 values but the stack holds fewer");
  REFUSE("\x80\x02N(\x85N.", "TUPLE1 needs 1 values");
  REFUSE("\x80\x02t.", "TUPLE without a MARK");
  REFUSE("\x80\x02\x80\x02N.", "PROTO after the first byte");
  REFUSE("\x80\x02" "cos\nsystem\n.",
         "the global os.system is not one DCP writes (refused; nothing is imported)");
  REFUSE("\x80\x04\x8c\x08" "builtins\x8c\x04" "eval\x93.",
         "the global builtins.eval is not one DCP writes");
  REFUSE("\x80\x02" "ctorch.distributed.checkpoint.metadata\nEvil\n.",
         "the global torch.distributed.checkpoint.metadata.Evil");
  REFUSE("\x80\x02" "ctorch\nload\n.", "the global torch.load is not one DCP writes");
  /* a module under an accepted prefix, but no Python module: refused, and named in
   * printable text (the class was accepted, and later messages that named it carried
   * the raw control byte) */
  REFUSE("\x80\x02" "ctorch.distributed.checkpoint\x0emetadata\nTensorStorageMetadata\n.",
         "the global torch.distributed.checkpoint\\x0emetadata.TensorStorageMetadata is not one "
         "DCP writes");
  REFUSE("\x80\x02" "ctorch\nfloat32 \n.", "the global torch.float32  is not one DCP writes");
  REFUSE("\x80\x02" "ctorch..serialization\n_get_layout\n.",
         "the global torch..serialization._get_layout is not one DCP writes");
  REFUSE("\x80\x02" "ctorch\nbfloat16", "GLOBAL line is not terminated");
  REFUSE("\x80\x02G\x00\x00\x00\x00\x00\x00\x00\x00.",
         "opcode BINFLOAT (0x47) is not one DCP writes");
  REFUSE("\x80\x02i__main__\nX\n.", "opcode INST (0x69) is not one DCP writes");
  REFUSE("\x80\x02\xff.", "0xff is not a pickle opcode");
  REFUSE("\x80\x02h\x05.", "memo entry 5 was never stored");
  REFUSE("\x80\x02X\xff\xff\xff\x7f",
         "string of 2147483647 bytes goes past the end (0 bytes left)");
  REFUSE("\x80\x02X\x02\x00\x00\x00\xc3(.", "string is not valid UTF-8");
  REFUSE("\x80\x02X\x01\x00\x00\x00\x00.", "string holds a NUL byte");
  REFUSE("\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01.",
         "LONG1 integer of 9 bytes does not fit 64 bits");
  REFUSE("\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00.",
         "LONG1 integer of 9 bytes does not fit 64 bits");
  REFUSE("\x80\x02]NNs.", "SETITEM on a list of 0, not a dict");
  REFUSE("\x80\x02}Na.", "APPEND on a dict of 0, not a list");
  REFUSE("\x80\x02}]Ns.", "dict key is unhashable (a list)");
  REFUSE("\x80\x02" "ctorch\nSize\n)\x81.",
         "NEWOBJ of torch.Size with 0 arguments is not something DCP writes");
  REFUSE("\x80\x02" "ctorch.distributed.checkpoint.metadata\nMetadata\n)R.",
         "REDUCE of torch.distributed.checkpoint.metadata.Metadata with 0 arguments");
  REFUSE("\x80\x02NN\x85R.", "REDUCE of None, not a class");
  REFUSE("\x80\x02" "ctorch\nSize\nNR.", "REDUCE arguments are None, not a tuple");
  REFUSE("\x80\x02" "ctorch.distributed.checkpoint.metadata\nMetadata\n)\x81}b}b.",
         "BUILD twice on one torch.distributed.checkpoint.metadata.Metadata object");
  REFUSE("\x80\x02N}b.", "BUILD on None, not an object");
  REFUSE("\x80\x04\x95\xff\x00\x00\x00\x00\x00\x00\x00N.", "FRAME of 255 bytes goes past the end");

  /* Values and memo entries are capped by the size: one per two bytes, plus 4096. */
  GString *many = g_string_new("\x80\x02");
  for (int i = 0; i < 20000; i++)
    g_string_append_c(many, ']');
  expect_pickle_error(many->str, many->len, "more than 14097 values in 20002 bytes");
  g_string_truncate(many, 2);
  g_string_append_c(many, 'N');
  for (int i = 0; i < 20000; i++)
    g_string_append_c(many, '\x94');
  expect_pickle_error(many->str, many->len, "the memo holds more than 14097 values");
  g_string_free(many, TRUE);

  /* MARKs nested deeper than the limit. */
  GString *deep = g_string_new("\x80\x02");
  for (int i = 0; i <= WSYNC_PICKLE_MAX_MARKS; i++)
    g_string_append_c(deep, '(');
  expect_pickle_error(deep->str, deep->len, "MARKs nest deeper than 64");
  g_string_free(deep, TRUE);
}

/* ================================================================ archives and seeds */

static GBytes *
seed(const char *name)
{
  g_autofree char *path = g_test_build_filename(G_TEST_DIST, "data", "dcp-fuzz-seeds", name, NULL);
  GError *error = NULL;
  char *data;
  gsize len;
  g_file_get_contents(path, &data, &len, &error);
  g_assert_no_error(error);
  return g_bytes_new_take(data, len);
}

static void
read_blob_ok(const char *name, WsyncDcpBlob *b)
{
  g_autoptr(GBytes) bytes = seed(name);
  GError *error = NULL;
  gsize len;
  const guint8 *data = g_bytes_get_data(bytes, &len);
  g_assert_true(wsync_dcp_read_blob(data, len, name, b, &error));
  g_assert_no_error(error);
  g_assert_cmpuint(b->data_offset + b->data_len, <=, len);
  if (b->data_len)
    g_assert_cmpuint(b->data_offset % 64, ==, 0); /* the writer aligns data/0 */
}

static void
test_blobs(void)
{
  WsyncDcpBlob b;
  read_blob_ok("blob-transposed.bin", &b);
  g_assert_cmpint(b.dtype, ==, WSYNC_DTYPE_BF16);
  g_assert_cmpuint(b.ndim, ==, 2);
  g_assert_cmpuint(b.size[0], ==, 3);
  g_assert_cmpuint(b.size[1], ==, 4);
  g_assert_cmpuint(b.stride[0], ==, 1);
  g_assert_cmpuint(b.stride[1], ==, 3);
  g_assert_cmpuint(b.storage_numel, ==, 12);
  g_assert_cmpuint(b.data_len, ==, 24);

  read_blob_ok("blob-offset.bin", &b);
  g_assert_cmpuint(b.storage_offset, ==, 2);
  g_assert_cmpuint(b.storage_numel, ==, 6);

  read_blob_ok("blob-zip64.bin", &b);
  g_assert_cmpuint(b.size[0], ==, 3);

  read_blob_ok("blob-v3.bin", &b);
  g_assert_cmpint(b.dtype, ==, WSYNC_DTYPE_F8_E4M3);
  g_assert_cmpuint(b.storage_numel, ==, 4);

  read_blob_ok("blob-empty.bin", &b);
  g_assert_cmpuint(b.size[0], ==, 0);
  g_assert_cmpuint(b.size[1], ==, 16);
  g_assert_cmpuint(b.data_len, ==, 0);

  read_blob_ok("blob-scalar.bin", &b);
  g_assert_cmpuint(b.ndim, ==, 0);
  g_assert_cmpint(b.dtype, ==, WSYNC_DTYPE_F32);
  g_assert_cmpuint(b.data_len, ==, 4);

  /* Not an archive, and a truncated one. */
  g_autoptr(GBytes) bytes = seed("blob-transposed.bin");
  gsize len;
  const guint8 *data = g_bytes_get_data(bytes, &len);
  GError *error = NULL;
  g_assert_false(wsync_dcp_read_blob(data, len / 2, "half", &b, &error));
  const char *const frags[] = {"half: not a torch.save zip archive (libzip: ", NULL};
  check_error(error, frags);
  g_clear_error(&error);
  g_assert_false(wsync_dcp_read_blob((const guint8 *)"", 0, "empty", &b, &error));
  const char *const short_frags[] = {"empty: 0 bytes, too short for a torch.save zip archive",
                                     NULL};
  check_error(error, short_frags);
  g_clear_error(&error);
}

static void
test_seeds_parse(void)
{
  const char *names[] = {"metadata-p2.bin", "metadata-p4.bin", "metadata-p4-by-name.bin",
                         "metadata-p5.bin"};
  for (guint i = 0; i < G_N_ELEMENTS(names); i++) {
    g_autoptr(GBytes) bytes = seed(names[i]);
    gsize len;
    const guint8 *data = g_bytes_get_data(bytes, &len);
    GError *error = NULL;
    g_autoptr(WsyncDcp) dcp = wsync_dcp_parse_metadata(data, len, names[i], &error);
    g_assert_no_error(error);
    g_assert_cmpuint(wsync_dcp_n_tensors(dcp), ==, 22);
    const WsyncDcpTensor *t = wsync_dcp_tensor(dcp, 0);
    g_assert_null(chunk(t, 0)->data);
  }
  /* Rank 1's own metadata of a use_collectives=False save: its chunks only. */
  g_autoptr(GBytes) rank1 = seed("metadata-rank-1.bin");
  gsize rank1_len;
  const guint8 *rank1_data = g_bytes_get_data(rank1, &rank1_len);
  GError *rank1_error = NULL;
  g_autoptr(WsyncDcp) one =
      wsync_dcp_parse_metadata(rank1_data, rank1_len, "__1.metadata", &rank1_error);
  g_assert_no_error(rank1_error);
  g_assert_cmpuint(wsync_dcp_n_tensors(one), ==, 4);
  g_assert_cmpuint(wsync_dcp_n_skipped(one), ==, 0);
  const WsyncDcpTensor *embed = wsync_dcp_lookup(one, "model.embed_tokens.weight");
  g_assert_cmpuint(embed->shape[0], ==, 5);
  g_assert_cmpuint(embed->chunks->len, ==, 1);
  g_assert_cmpuint(chunk(embed, 0)->box.offset[0], ==, 3);

  g_autoptr(GBytes) shard = seed("shard-newest.bin");
  gsize len;
  const guint8 *data = g_bytes_get_data(shard, &len);
  GError *error = NULL;
  g_autoptr(WsyncDcp) dcp =
      wsync_dcp_parse_shard(data, len, "shard-00002-model-00001-of-00002.safetensors", &error);
  g_assert_no_error(error);
  g_assert_cmpuint(wsync_dcp_lookup(dcp, "model.embed_tokens.weight")->part, ==, 1);
}

/* The committed seeds are what the script writes, byte for byte, with the python3 that
 * runs the tests: the script's output does not depend on the Python. */
static void
test_seeds_reproducible(void)
{
  g_autofree char *script = g_test_build_filename(G_TEST_DIST, "make-dcp-fixtures.py", NULL);
  g_autofree char *committed = g_test_build_filename(G_TEST_DIST, "data", "dcp-fuzz-seeds", NULL);
  g_autofree char *tmp = test_tmpdir();
  const char *argv[] = {"python3", script, "--seeds", tmp, NULL};
  g_autofree char *err = NULL;
  int status = 0;
  GError *error = NULL;
  g_spawn_sync(NULL, (char **)argv, NULL, G_SPAWN_SEARCH_PATH | G_SPAWN_STDOUT_TO_DEV_NULL, NULL,
               NULL, NULL, &err, &status, &error);
  g_assert_no_error(error);
  if (!g_spawn_check_wait_status(status, NULL))
    g_error("%s --seeds failed: %s", script, err);

  guint n = 0;
  GDir *dir = g_dir_open(committed, 0, &error);
  g_assert_no_error(error);
  for (const char *name; (name = g_dir_read_name(dir)) != NULL; n++) {
    g_autofree char *want_path = g_build_filename(committed, name, NULL);
    g_autofree char *got_path = g_build_filename(tmp, name, NULL);
    g_autofree char *want = NULL, *got = NULL;
    gsize want_len = 0, got_len = 0;
    g_assert_true(g_file_get_contents(want_path, &want, &want_len, NULL));
    if (!g_file_get_contents(got_path, &got, &got_len, NULL))
      g_error("the script no longer writes the seed %s", name);
    if (want_len != got_len || memcmp(want, got, want_len) != 0)
      g_error("seed %s differs from what the script writes now (%" G_GSIZE_FORMAT " bytes, "
              "committed %" G_GSIZE_FORMAT ")",
              name, got_len, want_len);
  }
  g_dir_close(dir);
  g_autoptr(GDir) written = g_dir_open(tmp, 0, &error);
  g_assert_no_error(error);
  guint m = 0;
  while (g_dir_read_name(written) != NULL)
    m++;
  g_assert_cmpuint(m, ==, n); /* and no seed it writes is missing from the tree */
  test_rmtree(tmp);
}

/* ================================================================ main */

static gboolean
make_fixtures(void)
{
  g_autofree char *script = g_test_build_filename(G_TEST_DIST, "make-dcp-fixtures.py", NULL);
  fixtures = test_tmpdir();
  const char *argv[] = {"python3", script, fixtures, NULL};
  GError *error = NULL;
  g_autofree char *out = NULL, *err = NULL;
  int status = 0;
  if (!g_spawn_sync(NULL, (char **)argv, NULL, G_SPAWN_SEARCH_PATH, NULL, NULL, &out, &err,
                    &status, &error)) {
    g_printerr("cannot run python3 (install it: apt-get install python3): %s\n", error->message);
    g_error_free(error);
    return FALSE;
  }
  if (!g_spawn_check_wait_status(status, &error)) {
    g_printerr("%s failed: %s\n%s", script, error->message, err);
    g_error_free(error);
    return FALSE;
  }
  return TRUE;
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  if (!make_fixtures())
    return 1;

  g_test_add_func("/dcp/detect", test_detect);
  g_test_add_func("/dcp/a/good", test_a_good);
  g_test_add_func("/dcp/a/flat-with-gaps", test_a_flat);
  g_test_add_func("/dcp/b/good-protocol-4", test_b_good);
  g_test_add_func("/dcp/b/good-protocol-4-by-name", test_b_by_name);
  g_test_add_func("/dcp/b/good-protocol-2", test_b_protocol2);
  g_test_add_func("/dcp/b/good-protocol-5", test_b_protocol5);
  g_test_add_func("/dcp/b/no-index-hints", test_b_no_index_hints);
  g_test_add_func("/dcp/b/flat", test_b_flat);
  g_test_add_func("/dcp/b/per-rank-metadata", test_b_per_rank);
  g_test_add_func("/dcp/b/wrapped-state-dict", test_b_wrapped);
  g_test_add_func("/dcp/b/select", test_select);
  g_test_add_func("/dcp/cli/select", test_select_cli);
  g_test_add_func("/dcp/cli/inspect", test_inspect_cli);
  for (guint i = 0; i < G_N_ELEMENTS(refusals); i++) {
    g_autofree char *name = g_strdup_printf("/dcp/refuse/%s", refusals[i].fixture);
    g_test_add_data_func(name, &refusals[i], test_refusal);
    if (refusals[i].cli) {
      g_autofree char *cli = g_strdup_printf("/dcp/cli/refuse/%s", refusals[i].fixture);
      g_test_add_data_func(cli, &refusals[i], test_refusal_cli);
    }
  }
  g_test_add_func("/dcp/cli/merge", test_merge_cli);
  g_test_add_func("/dcp/cli/merge-per-rank-metadata", test_merge_per_rank_cli);
  g_test_add_func("/dcp/cli/merge-special-files", test_merge_special_files_cli);
  g_test_add_func("/dcp/cli/merge-signal-after-swap", test_merge_signal_after_swap_cli);
  g_test_add_func("/dcp/refuse/not-a-checkpoint", test_not_a_checkpoint);
  g_test_add_func("/dcp/refuse/both-shard-dirs", test_both_shard_dirs);
  g_test_add_func("/dcp/refuse/step-directory", test_step_directory);
  g_test_add_func("/dcp/refuse/torch-save-per-rank", test_torch_save_ranks);
  g_test_add_func("/dcp/refuse/parts-disagree", test_parts_disagree);
  g_test_add_func("/dcp/coverage", test_coverage);
  g_test_add_func("/dcp/pickle/values", test_pickle_values);
  g_test_add_func("/dcp/pickle/refusals", test_pickle_refusals);
  g_test_add_func("/dcp/pickle/layout-and-enum", test_pickle_layout_and_enum);
  g_test_add_func("/dcp/pickle/layout-and-enum-refusals", test_pickle_layout_and_enum_refusals);
  g_test_add_func("/dcp/blob", test_blobs);
  g_test_add_func("/dcp/metadata-unreadable-path-printable", test_metadata_unreadable_path_printable);
  g_test_add_func("/dcp/seeds", test_seeds_parse);
  g_test_add_func("/dcp/seeds/reproducible", test_seeds_reproducible);

  int rc = g_test_run();
  test_rmtree(fixtures);
  g_free(fixtures);
  return rc;
}
