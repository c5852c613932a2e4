/* The checks the model and backend tests hold wsync's outputs to, written from the docs
 * (docs/hf-checkpoints.md, docs/vllm.md §2, §3), never from the plugins: a checkpoint's
 * exact tensor set and shapes, two checkpoints byte for byte, and vLLM rank files
 * element by element against the Hugging Face tensor each element must come from.
 * Shared by test-qwen3-moe, test-vllm, test-llama and test-qwen3-5-moe (which adds the
 * casts vLLM's copy_ makes: BF16 widened to F32, F32 rounded to BF16). */
#ifndef WSYNC_TEST_ORACLE_H
#define WSYNC_TEST_ORACLE_H

#include <stdio.h>

#include <wsync/wsync.h>

#include "testutil.h"

/* ------------------------------------------------------------------ checkpoints */

/* "[d0, d1, ...]" */
static inline char *
shape_text(const WsyncTensor *t)
{
  return wsync_shape_format(t->ndim, t->shape);
}

static inline WsyncCheckpoint *
open_ck(const char *path)
{
  GError *error = NULL;
  WsyncCheckpoint *ck = wsync_checkpoint_open(path, &error);

  g_assert_no_error(error);
  return ck;
}

static inline const WsyncTensor *
lookup(const WsyncCheckpoint *ck, const char *name)
{
  const WsyncTensor *t = wsync_checkpoint_lookup(ck, name);

  if (t == NULL)
    g_error("%s has no tensor %s", wsync_checkpoint_path(ck), name);
  return t;
}

/* Adds @name (taken) -> "[d0, d1, d2]" (the first @ndim) to @want. */
static inline void
expect_tensor(GHashTable *want, char *name, guint ndim, guint64 d0, guint64 d1, guint64 d2)
{
  const guint64 shape[3] = {d0, d1, d2};

  g_hash_table_insert(want, name, wsync_shape_format(ndim, shape));
}

/* The checkpoint at @dir has exactly the tensors @want says, all BF16, and an index. */
static inline void
assert_layout(const char *dir, GHashTable *want)
{
  g_autoptr(WsyncCheckpoint) ck = open_ck(dir);
  g_autofree char *index = g_build_filename(dir, WSYNC_INDEX_NAME, NULL);
  g_autofree char *config = g_build_filename(dir, "config.json", NULL);

  g_assert_true(g_file_test(index, G_FILE_TEST_IS_REGULAR));
  g_assert_true(g_file_test(config, G_FILE_TEST_IS_REGULAR));
  for (guint i = 0; i < wsync_checkpoint_n_tensors(ck); i++) {
    const WsyncTensor *t = wsync_checkpoint_tensor(ck, i);
    const char *shape = g_hash_table_lookup(want, t->name);
    g_autofree char *have = shape_text(t);

    if (shape == NULL)
      g_error("%s: unexpected tensor %s %s", dir, t->name, have);
    g_assert_cmpstr(have, ==, shape);
    g_assert_cmpint(t->dtype, ==, WSYNC_DTYPE_BF16);
  }
  g_assert_cmpuint(wsync_checkpoint_n_tensors(ck), ==, g_hash_table_size(want));
}

/* Own oracle for `verify`: the same names, dtypes, shapes and bytes. */
static inline void
assert_same_checkpoints(const char *a_path, const char *b_path)
{
  g_autoptr(WsyncCheckpoint) a = open_ck(a_path);
  g_autoptr(WsyncCheckpoint) b = open_ck(b_path);

  g_assert_cmpuint(wsync_checkpoint_n_tensors(a), ==, wsync_checkpoint_n_tensors(b));
  for (guint i = 0; i < wsync_checkpoint_n_tensors(a); i++) {
    const WsyncTensor *ta = wsync_checkpoint_tensor(a, i);
    const WsyncTensor *tb = lookup(b, ta->name);
    g_autofree char *sa = shape_text(ta);
    g_autofree char *sb = shape_text(tb);

    g_assert_cmpstr(sa, ==, sb);
    g_assert_cmpint(ta->dtype, ==, tb->dtype);
    if (memcmp(ta->data, tb->data, ta->nbytes) != 0)
      g_error("%s differs between %s and %s", ta->name, a_path, b_path);
  }
}

/* ------------------------------------------------------------------ vLLM rank files */

/* The files of one rank: model-rank-{r}-part-{p}.safetensors (sharded-state) or
 * kernel-rank-{r}-part-{p}.safetensors (kernel). */
typedef struct {
  GPtrArray *files; /* WsyncCheckpoint*, one per part */
} RankFiles;

static inline void
rank_files_clear(RankFiles *rf)
{
  g_ptr_array_unref(rf->files);
}

/* Opens every rank file of @dir; returns how many ranks have files.  A file of the
 * other format is an error: its consumer would never read it. */
static inline guint
open_ranks_of(const char *dir, const char *format, RankFiles *ranks, guint max_ranks)
{
  g_autofree char *pattern = g_strdup_printf(
      "%s-rank-%%u-part-%%u%%31s", strcmp(format, "kernel") == 0 ? "kernel" : "model");
  GError *error = NULL;
  GDir *d = g_dir_open(dir, 0, &error);
  const char *name;
  guint n = 0;

  g_assert_no_error(error);
  for (guint r = 0; r < max_ranks; r++)
    ranks[r].files = g_ptr_array_new_with_free_func((GDestroyNotify)wsync_checkpoint_free);
  while ((name = g_dir_read_name(d)) != NULL) {
    unsigned rank, part;
    char tail[32];
    g_autofree char *path = g_build_filename(dir, name, NULL);
    WsyncCheckpoint *ck;
    if (g_str_has_suffix(name, ".safetensors") && strcmp(name, "config.json") != 0 &&
        !g_str_has_prefix(name, strcmp(format, "kernel") == 0 ? "kernel-rank-" : "model-rank-"))
      g_error("%s: a file of another format in a %s directory", name, format);
    if (sscanf(name, pattern, &rank, &part, tail) != 3 || strcmp(tail, ".safetensors") != 0)
      continue;
    g_assert_cmpuint(rank, <, max_ranks);
    ck = wsync_checkpoint_open(path, &error);
    g_assert_no_error(error);
    g_ptr_array_add(ranks[rank].files, ck);
  }
  g_dir_close(d);
  for (guint r = 0; r < max_ranks; r++)
    if (ranks[r].files->len > 0)
      n++;
  return n;
}

static inline const WsyncTensor *
rank_lookup(const RankFiles *rf, const char *name)
{
  for (guint i = 0; i < rf->files->len; i++) {
    const WsyncTensor *t = wsync_checkpoint_lookup(rf->files->pdata[i], name);
    if (t != NULL)
      return t;
  }
  return NULL;
}

static inline guint
rank_n_tensors(const RankFiles *rf)
{
  guint n = 0;

  for (guint i = 0; i < rf->files->len; i++)
    n += wsync_checkpoint_n_tensors(rf->files->pdata[i]);
  return n;
}

static inline void
assert_metadata(const RankFiles *rf, const char *key, const char *want)
{
  for (guint i = 0; i < rf->files->len; i++) {
    GHashTable *md = wsync_safetensors_metadata(wsync_checkpoint_file(rf->files->pdata[i], 0));
    g_assert_cmpstr(g_hash_table_lookup(md, key), ==, want);
  }
}

/* ------------------------------------------------------------------ elements */

/* One rank being checked against the Hugging Face checkpoint it was made from. */
typedef struct {
  WsyncCheckpoint *in;
  const RankFiles *rf;
  guint tp, ep, rank, t; /* t = rank % tp, the TP rank */
  guint checked;         /* output tensors checked on this rank */
  gboolean kernel;       /* the kernel format: parameters only, no buffers */
  const void *model;     /* the test's own description of the model, for its own checks */
} RankCheck;

static inline gsize
elem_size(WsyncDtype dtype)
{
  return wsync_dtype_bits(dtype) / 8;
}

static inline guint16
get16(const guint8 *p)
{
  guint16 v;
  memcpy(&v, p, 2);
  return GUINT16_FROM_LE(v);
}

static inline guint32
get32(const guint8 *p)
{
  guint32 v;
  memcpy(&v, p, 4);
  return GUINT32_FROM_LE(v);
}

/* F32 -> BF16, round to nearest, ties to even (what torch's copy_ does), written from
 * the definition: keep the high half, add one when the dropped half is more than half
 * an ulp, or exactly half and the kept half is odd.  (No NaN in these inputs.) */
static inline guint16
round_to_bf16(guint32 f32)
{
  guint16 hi = (guint16)(f32 >> 16);
  guint32 dropped = f32 & 0xffffu;

  if (dropped > 0x8000u || (dropped == 0x8000u && (hi & 1u)))
    hi++;
  return hi;
}

/* Output element @oi of @out must be input element @ii of @in, as vLLM's (or the
 * reader's) copy_ would put it: the same bytes when the dtypes agree, a BF16 widened to
 * F32 (exact: the BF16 bits are the high half), or an F32 rounded to BF16.  Any other
 * pair of dtypes is a defect of the test. */
static inline gboolean
elem_ok(const WsyncTensor *out, guint64 oi, const WsyncTensor *in, guint64 ii)
{
  gsize os = elem_size(out->dtype), is = elem_size(in->dtype);

  g_assert_cmpuint(oi, <, out->numel);
  g_assert_cmpuint(ii, <, in->numel);
  if (out->dtype == in->dtype)
    return memcmp(out->data + oi * os, in->data + ii * is, os) == 0;
  if (in->dtype == WSYNC_DTYPE_BF16 && out->dtype == WSYNC_DTYPE_F32)
    return get32(out->data + oi * os) == (guint32)get16(in->data + ii * is) << 16;
  if (in->dtype == WSYNC_DTYPE_F32 && out->dtype == WSYNC_DTYPE_BF16)
    return get16(out->data + oi * os) == round_to_bf16(get32(in->data + ii * is));
  g_error("%s is %s but %s is %s: no such cast expected", out->name, wsync_dtype_name(out->dtype),
          in->name, wsync_dtype_name(in->dtype));
  return FALSE;
}

/* The input tensor @name, which must be there. */
static inline const WsyncTensor *
input(RankCheck *c, const char *name)
{
  const WsyncTensor *t = wsync_checkpoint_lookup(c->in, name);

  if (t == NULL)
    g_error("the synth input has no tensor %s", name);
  return t;
}

/* The output tensor @name, with its dtype and shape checked; counted as checked. */
static inline const WsyncTensor *
output(RankCheck *c, const char *name, WsyncDtype dtype, guint ndim, const guint64 *shape)
{
  const WsyncTensor *t = rank_lookup(c->rf, name);

  if (t == NULL)
    g_error("rank %u lacks %s", c->rank, name);
  if (t->dtype != dtype)
    g_error("rank %u: %s is %s, want %s", c->rank, name, wsync_dtype_name(t->dtype),
            wsync_dtype_name(dtype));
  g_assert_cmpuint(t->ndim, ==, ndim);
  for (guint d = 0; d < ndim; d++)
    if (t->shape[d] != shape[d])
      g_error("rank %u: %s axis %u is %" G_GUINT64_FORMAT ", want %" G_GUINT64_FORMAT, c->rank,
              name, d, t->shape[d], shape[d]);
  c->checked++;
  return t;
}

static inline void
same_elem(RankCheck *c, const WsyncTensor *out, guint64 oi, const WsyncTensor *in, guint64 ii)
{
  if (!elem_ok(out, oi, in, ii))
    g_error("rank %u (tp %u ep %u): %s element %" G_GUINT64_FORMAT
            " is not %s element %" G_GUINT64_FORMAT,
            c->rank, c->tp, c->ep, out->name, oi, in->name, ii);
}

static inline void
zero_elem(RankCheck *c, const WsyncTensor *out, guint64 oi)
{
  gsize es = elem_size(out->dtype);

  for (gsize b = 0; b < es; b++)
    if (out->data[oi * es + b] != 0)
      g_error("rank %u: %s element %" G_GUINT64_FORMAT " should be padding zero", c->rank,
              out->name, oi);
}

/* Elements per row: 1 for a bias, H for a [rows, H] weight. */
static inline guint64
row_width(const WsyncTensor *t)
{
  return t->ndim > 1 ? t->numel / t->shape[0] : 1;
}

/* Whole, on every rank (norms, the router, row-parallel biases: ReplicatedLinear,
 * RMSNorm, RowParallelLinear's full bias, §2); @name held as @out_name in @dtype (a cast
 * when it is not the input's). */
static inline void
check_replicated_cast(RankCheck *c, const char *name, const char *out_name, WsyncDtype dtype)
{
  const WsyncTensor *in = input(c, name);
  const WsyncTensor *out = output(c, out_name, dtype, in->ndim, in->shape);

  for (guint64 i = 0; i < in->numel; i++)
    same_elem(c, out, i, in, i);
}

static inline void
check_replicated_as(RankCheck *c, const char *name, const char *out_name)
{
  check_replicated_cast(c, name, out_name, input(c, name)->dtype);
}

/* RowParallelLinear (§2): columns [t*C/tp, (t+1)*C/tp) of a [R, C] weight; @name held
 * as @out_name. */
static inline void
check_row_as(RankCheck *c, const char *name, const char *out_name)
{
  const WsyncTensor *in = input(c, name);
  guint64 rows = in->shape[0], cols = in->shape[1], per = cols / c->tp;
  guint64 shape[2] = {rows, per};
  const WsyncTensor *out = output(c, out_name, in->dtype, 2, shape);

  g_assert_cmpuint(cols % c->tp, ==, 0);
  for (guint64 r = 0; r < rows; r++)
    for (guint64 j = 0; j < per; j++)
      same_elem(c, out, r * per + j, in, r * cols + c->t * per + j);
}

static inline void
check_row(RankCheck *c, const char *name)
{
  check_row_as(c, name, name);
}

/* QKVParallelLinear (§2) of MODULE.{q,k,v}_proj.LEAF as MODULE.qkv_proj.LEAF, a weight
 * or a bias: [q_t | k_s | v_s] with nh/tp query heads, kvl = nkv/tp KV heads (1 when
 * tp >= nkv) and s = t / (tp/nkv) when KV heads are replicated. */
static inline void
check_qkv(RankCheck *c, const char *module, const char *leaf, guint64 nh, guint64 nkv,
          guint64 hd)
{
  g_autofree char *qn = g_strdup_printf("%s.q_proj.%s", module, leaf);
  g_autofree char *kn = g_strdup_printf("%s.k_proj.%s", module, leaf);
  g_autofree char *vn = g_strdup_printf("%s.v_proj.%s", module, leaf);
  g_autofree char *name = g_strdup_printf("%s.qkv_proj.%s", module, leaf);
  const WsyncTensor *q = input(c, qn), *k = input(c, kn), *v = input(c, vn);
  guint64 width = row_width(q), qrows = nh / c->tp * hd;
  guint64 kvl = c->tp >= nkv ? 1 : nkv / c->tp;
  guint64 replicas = c->tp >= nkv ? c->tp / nkv : 1;
  guint64 shard = c->t / replicas, kvrows = kvl * hd;
  guint64 shape[2] = {qrows + 2 * kvrows, width};
  const WsyncTensor *out = output(c, name, q->dtype, q->ndim, shape);

  g_assert_cmpuint(q->shape[0], ==, nh * hd);
  g_assert_cmpuint(k->shape[0], ==, nkv * hd);
  for (guint64 r = 0; r < shape[0]; r++) {
    const WsyncTensor *src;
    guint64 row;
    if (r < qrows) {
      src = q;
      row = c->t * qrows + r;
    } else if (r < qrows + kvrows) {
      src = k;
      row = shard * kvrows + (r - qrows);
    } else {
      src = v;
      row = shard * kvrows + (r - qrows - kvrows);
    }
    for (guint64 h = 0; h < width; h++)
      same_elem(c, out, r * width + h, src, row * width + h);
  }
}

/* MergedColumnParallelLinear (§2) of MODULE.{gate,up}_proj.LEAF as
 * MODULE.gate_up_proj.LEAF, a weight or a bias: [gate_t ; up_t], gate first, each part's
 * rows [t*I/tp, (t+1)*I/tp). */
static inline void
check_gate_up(RankCheck *c, const char *module, const char *leaf, guint64 inter)
{
  g_autofree char *gn = g_strdup_printf("%s.gate_proj.%s", module, leaf);
  g_autofree char *un = g_strdup_printf("%s.up_proj.%s", module, leaf);
  g_autofree char *name = g_strdup_printf("%s.gate_up_proj.%s", module, leaf);
  const WsyncTensor *gate = input(c, gn), *up = input(c, un);
  guint64 width = row_width(gate), ip = inter / c->tp, shape[2] = {2 * ip, width};
  const WsyncTensor *out = output(c, name, gate->dtype, gate->ndim, shape);

  g_assert_cmpuint(gate->shape[0], ==, inter);
  for (guint64 r = 0; r < 2 * ip; r++) {
    const WsyncTensor *src = r < ip ? gate : up;
    guint64 row = c->t * ip + (r < ip ? r : r - ip);
    for (guint64 h = 0; h < width; h++)
      same_elem(c, out, r * width + h, src, row * width + h);
  }
}

/* VocabParallelEmbedding / ParallelLMHead (§3): Vp = ceil(V/64)*64, rows
 * [t*Vp/tp, (t+1)*Vp/tp), rows >= V zero; the input @name held as @out_name. */
static inline void
check_vocab_as(RankCheck *c, const char *name, const char *out_name, guint64 vocab)
{
  const WsyncTensor *in = input(c, name);
  guint64 hidden = in->shape[1];
  guint64 vp = (vocab + 63) / 64 * 64, rows = vp / c->tp, shape[2] = {rows, hidden};
  const WsyncTensor *out = output(c, out_name, in->dtype, 2, shape);

  g_assert_cmpuint(in->shape[0], ==, vocab);
  for (guint64 r = 0; r < rows; r++) {
    guint64 g = c->t * rows + r;
    for (guint64 h = 0; h < hidden; h++) {
      if (g < vocab)
        same_elem(c, out, r * hidden + h, in, g * hidden + h);
      else
        zero_elem(c, out, r * hidden + h);
    }
  }
}

#endif /* WSYNC_TEST_ORACLE_H */
