/* wsync plugin "vllm": the tensors one vLLM tensor-/expert-parallel rank holds, under
 * vLLM's runtime names, in the loader layout that `load_format="sharded_state"` reads
 * back (../shared/reference/vllm-layouts.md, cited below as §N).
 *
 * One converter, "vllm", serving the targets "vllm" and "vllm-ascend" (the npu-ascend
 * plugin's hook transposes the experts of the latter afterwards, §6).  The engine calls
 * it once per rank; it turns every param the model plugin declared into tensors with
 * placements (which box of which logical tensor lies where) and fills (bytes that come
 * from nowhere: vocabulary padding, attention scales, expert maps):
 *
 *   REPLICATED   whole, on every rank                       ReplicatedLinear, norms (§1)
 *   COLUMN       parts concatenated along axis 0, each part's units split over the tp
 *                ranks, KV heads replicated when tp > units  QKVParallelLinear,
 *                                                            MergedColumnParallelLinear (§1)
 *   ROW          last axis split over the tp ranks          RowParallelLinear (§1)
 *   VOCAB        rows padded to a multiple of 64, then split VocabParallelEmbedding,
 *                                                            ParallelLMHead (§1)
 *   EXPERTS_W13  [E_loc, 2*Ip, H], gate rows first          FusedMoE w13_weight (§2.2)
 *   EXPERTS_W2   [E_loc, H, Ip]                             FusedMoE w2_weight (§2.2)
 *   ATTENTION    four F32 scalars of 1.0                    Attention scale buffers (§5)
 *
 * plus, before vLLM 0.22.1 with EP, each MoE layer's `_expert_map` buffer (§5).
 *
 * With ep > 1 (a multiple of tp) the routed experts are spread over the ep ranks in
 * contiguous blocks and are not TP-sliced; everything else stays TP-sliced by the rank's
 * tp rank, rank % tp (§7).  Params of group "mtp" are dropped (§3.5).
 *
 * Options (conf.d/20-vllm.conf):
 *   vllm-version  the vLLM release the files are for; from 0.22.1 on (PR #41184) the
 *                 experts live under `mlp.experts.routed_experts.` (§0, §4)
 *   attn-scales   emit the attention scale buffers that sharded_state expects (§5)
 *
 * Both are recorded in the rank files' metadata ("wsync.vllm-version",
 * "wsync.attn-scales"), and when rank files written by wsync are read back the values
 * they carry win over the options, so that files keep reading as they were written.
 */
#include <stdarg.h>
#include <string.h>

#include <wsync/engine.h>
#include <wsync/plugin.h>

/* vllm/model_executor/layers/vocab_parallel_embedding.py: DEFAULT_VOCAB_PADDING_SIZE. */
#define VOCAB_PADDING 64

/* The first vLLM release with `mlp.experts.routed_experts.` (PR #41184, §0). */
static const guint64 routed_experts_since[] = {0, 22, 1, 0};

#define VERSION_PARTS 4

/* The converter's user data. */
typedef struct {
  char *version;           /* vllm-version as configured */
  gboolean routed_experts; /* version >= 0.22.1 */
  gboolean attn_scales;
} VllmSettings;

/* One rank being built. */
typedef struct {
  WsyncLayout *layout;
  guint tp;    /* tensor-parallel size */
  guint ep;    /* expert-parallel size, 1 when experts are TP-sliced */
  guint rank;  /* 0 <= rank < world */
  guint world; /* ep if ep > 1 else tp */
  guint t;     /* the rank's tp rank: rank % tp */
  const char *version;
  gboolean routed_experts;
  gboolean attn_scales;
} Rank;

/* ------------------------------------------------------------------ options */

/* Parses a release number "X.Y.Z" or "X.Y.Z.W" (vLLM has shipped 0.10.1.1); missing
 * parts count as 0.  Pre-release and local suffixes (rc1, .post1, +cu128) are refused:
 * the name convention cannot be told from them for sure. */
static gboolean
parse_version(const char *text, guint64 parts[VERSION_PARTS])
{
  g_auto(GStrv) fields = NULL;
  guint n;

  if (text == NULL)
    return FALSE;
  fields = g_strsplit(text, ".", -1);
  n = g_strv_length(fields);
  if (n < 3 || n > VERSION_PARTS)
    return FALSE;
  memset(parts, 0, sizeof(guint64) * VERSION_PARTS);
  for (guint i = 0; i < n; i++) {
    size_t len = strlen(fields[i]);
    if (len == 0 || len > 6 || strspn(fields[i], "0123456789") != len)
      return FALSE;
    parts[i] = g_ascii_strtoull(fields[i], NULL, 10);
  }
  return TRUE;
}

/* TRUE when @parts is at least 0.22.1: the experts path has `routed_experts.` (§0). */
static gboolean
version_has_routed_experts(const guint64 parts[VERSION_PARTS])
{
  for (guint i = 0; i < VERSION_PARTS; i++)
    if (parts[i] != routed_experts_since[i])
      return parts[i] > routed_experts_since[i];
  return TRUE;
}

#define VERSION_RULE "vllm-version must be a vLLM release number like \"0.22.1\""

/* libconfuse calls this for each value a file sets; the core calls it with the file's
 * position, so the message reads FILE:LINE: ... */
static int
validate_version(cfg_t *cfg, cfg_opt_t *opt)
{
  guint64 parts[VERSION_PARTS];
  const char *value;

  if (cfg_opt_size(opt) == 0)
    return 0;
  value = cfg_opt_getnstr(opt, cfg_opt_size(opt) - 1);
  if (parse_version(value, parts))
    return 0;
  cfg_error(cfg, VERSION_RULE ", not \"%s\"", value != NULL ? value : "");
  return -1;
}

static void
free_settings(gpointer data)
{
  VllmSettings *settings = data;

  g_free(settings->version);
  g_free(settings);
}

/* ------------------------------------------------------------------ small helpers */

static gboolean
usage_error(GError **error, const char *format, ...) G_GNUC_PRINTF(2, 3);

/* A parallel layout the model cannot take: exit status 2, one line. */
static gboolean
usage_error(GError **error, const char *format, ...)
{
  g_autofree char *message = NULL;
  va_list ap;

  va_start(ap, format);
  message = g_strdup_vprintf(format, ap);
  va_end(ap);
  g_set_error_literal(error, WSYNC_ERROR, WSYNC_ERROR_USAGE, message);
  return FALSE;
}

/* A param the model plugin declared wrongly for its kind (a bug, not the user's). */
static gboolean
param_error(GError **error, const WsyncParam *param, const char *problem)
{
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_FAILED, "vllm: param %s: %s", param->name,
              problem);
  return FALSE;
}

/* The dtype vLLM holds @param in: the model plugin's runtime dtype (e.g. F32 A_log, §3.3)
 * or else the source's.  Parameters are created in the model dtype and loading casts to
 * it (§1 "Dtypes"). */
static WsyncDtype
param_dtype(const WsyncParam *param)
{
  if (param->has_runtime_dtype)
    return param->runtime_dtype;
  return wsync_vtensor_get_dtype(param->parts[0].vt);
}

/* Number of axis-0 indices of a part (its length, or to the end), checked against its
 * logical tensor. */
static gboolean
part_rows(const WsyncParam *param, const WsyncPart *part, guint64 *rows, GError **error)
{
  const guint64 *shape = wsync_vtensor_get_shape(part->vt);

  if (wsync_vtensor_get_ndim(part->vt) == 0)
    return param_error(error, param, "a part is a scalar where rows were expected");
  if (part->start > shape[0] || part->length > shape[0] - part->start)
    return param_error(error, param, "a part's rows lie outside its logical tensor");
  *rows = part->length != 0 ? part->length : shape[0] - part->start;
  return TRUE;
}

/* Adds a real tensor of the rank. */
static WsyncLayoutTensor *
add_tensor(Rank *r, const char *name, WsyncDtype dtype, guint ndim, const guint64 *shape,
           GError **error)
{
  return wsync_layout_add_tensor(r->layout, name, dtype, ndim, shape, error);
}

/* Places box @box of @vt into @tensor (of @shape) with the box's first element at @at,
 * axes in order (a slice, a concatenation or a stacking: all row-major). */
static void
place_at(Rank *r, WsyncLayoutTensor *tensor, guint ndim, const guint64 *shape, WsyncVTensor *vt,
         const WsyncBox *box, const guint64 *at)
{
  WsyncRegion region;

  wsync_region_row_major(&region, ndim, shape, at);
  wsync_layout_place(r->layout, tensor, vt, box, &region);
}

/* The box of rows [row, row + rows) of @vt, every other axis whole. */
static void
rows_box(WsyncBox *box, WsyncVTensor *vt, guint64 row, guint64 rows)
{
  wsync_box_whole(box, wsync_vtensor_get_ndim(vt), wsync_vtensor_get_shape(vt));
  box->offset[0] = row;
  box->extent[0] = rows;
}

/* ------------------------------------------------------------------ REPLICATED */

/* ReplicatedLinear, RMSNorm, the router (§1, §2): every rank holds the whole param.
 * Several parts are concatenated along axis 0, like a merged layer without TP. */
static gboolean
emit_replicated(Rank *r, const WsyncParam *param, GError **error)
{
  const WsyncVTensor *first = param->parts[0].vt;
  guint ndim = wsync_vtensor_get_ndim(first);
  guint64 shape[WSYNC_MAX_DIMS], at[WSYNC_MAX_DIMS] = {0}, rows[WSYNC_PARAM_MAX_PARTS];
  WsyncLayoutTensor *tensor;
  WsyncBox box;

  memcpy(shape, wsync_vtensor_get_shape(first), sizeof(guint64) * ndim);
  if (ndim == 0) { /* a scalar: one part, whole */
    if (param->n_parts != 1)
      return param_error(error, param, "several scalar parts cannot be concatenated");
    tensor = add_tensor(r, param->runtime_name, param_dtype(param), 0, shape, error);
    if (tensor == NULL)
      return FALSE;
    wsync_box_whole(&box, 0, shape);
    place_at(r, tensor, 0, shape, param->parts[0].vt, &box, at);
    return TRUE;
  }
  shape[0] = 0;
  for (guint p = 0; p < param->n_parts; p++) {
    if (!part_rows(param, &param->parts[p], &rows[p], error))
      return FALSE;
    shape[0] += rows[p];
  }
  tensor = add_tensor(r, param->runtime_name, param_dtype(param), ndim, shape, error);
  if (tensor == NULL)
    return FALSE;
  for (guint p = 0; p < param->n_parts; p++) {
    rows_box(&box, param->parts[p].vt, param->parts[p].start, rows[p]);
    place_at(r, tensor, ndim, shape, param->parts[p].vt, &box, at);
    at[0] += rows[p];
  }
  return TRUE;
}

/* ------------------------------------------------------------------ COLUMN */

/* The rows of one part that tp rank r->t holds (§1).
 *
 * Plain split (ColumnParallelLinear, MergedColumnParallelLinear, the q shard of
 * QKVParallelLinear): the part's n units are divided evenly, rank t holds units
 * [t*n/tp, (t+1)*n/tp).
 *
 * KV replication (QKVParallelLinear k/v shards, linear.py): when tp > n,
 * num_kv_head_replicas = tp/n and `shard_rank = tp_rank // num_kv_head_replicas`: rank t
 * holds the one unit t / (tp/n). */
static gboolean
column_share(Rank *r, const WsyncParam *param, const WsyncPart *part, guint64 *first_row,
             guint64 *rows, GError **error)
{
  guint64 total, unit = part->unit != 0 ? part->unit : 1, n;
  const char *name = wsync_vtensor_get_name(part->vt);

  if (!part_rows(param, part, &total, error))
    return FALSE;
  if (total == 0 || total % unit != 0)
    return param_error(error, param, "a part's rows are not a whole number of units");
  n = total / unit;
  if (part->replicate && r->tp > n && r->tp % n == 0) {
    *first_row = part->start + (r->t / (r->tp / n)) * unit;
    *rows = unit;
    return TRUE;
  }
  if (n % r->tp != 0) { /* (also every tp > n that replication could not take) */
    g_autofree char *hint =
        part->replicate
            ? g_strdup_printf(" (replicating needs tp to be a multiple of %" G_GUINT64_FORMAT ")",
                              n)
            : g_strdup("");
    /* a part that is only some rows of its tensor (q, k, v of in_proj_qkv) says which */
    g_autofree char *rows_of =
        total != wsync_vtensor_get_shape(part->vt)[0]
            ? g_strdup_printf(" (rows %" G_GUINT64_FORMAT ":%" G_GUINT64_FORMAT ")", part->start,
                              part->start + total)
            : g_strdup("");
    return usage_error(error,
                       "tp %u does not divide the %" G_GUINT64_FORMAT " units of %" G_GUINT64_FORMAT
                       " rows of %s%s%s",
                       r->tp, n, total, name, rows_of, hint);
  }
  *first_row = part->start + r->t * (n / r->tp) * unit;
  *rows = n / r->tp * unit;
  return TRUE;
}

/* Per-rank packing: the parts' shares concatenated in the param's part order, e.g.
 * qkv_proj = [q_t | k_t | v_t], gate_up_proj = [gate_t | up_t] (§1, "Gate comes
 * first").  Trailing axes are whole. */
static gboolean
emit_column(Rank *r, const WsyncParam *param, GError **error)
{
  guint ndim = wsync_vtensor_get_ndim(param->parts[0].vt);
  guint64 shape[WSYNC_MAX_DIMS], at[WSYNC_MAX_DIMS] = {0};
  guint64 first[WSYNC_PARAM_MAX_PARTS], rows[WSYNC_PARAM_MAX_PARTS];
  WsyncLayoutTensor *tensor;

  if (ndim == 0)
    return param_error(error, param, "a column-parallel param cannot be a scalar");
  memcpy(shape, wsync_vtensor_get_shape(param->parts[0].vt), sizeof(guint64) * ndim);
  shape[0] = 0;
  for (guint p = 0; p < param->n_parts; p++) {
    const WsyncVTensor *vt = param->parts[p].vt;
    if (wsync_vtensor_get_ndim(vt) != ndim ||
        memcmp(wsync_vtensor_get_shape(vt) + 1, shape + 1, sizeof(guint64) * (ndim - 1)) != 0)
      return param_error(error, param, "its parts differ beyond axis 0");
    if (!column_share(r, param, &param->parts[p], &first[p], &rows[p], error))
      return FALSE;
    shape[0] += rows[p];
  }
  tensor = add_tensor(r, param->runtime_name, param_dtype(param), ndim, shape, error);
  if (tensor == NULL)
    return FALSE;
  for (guint p = 0; p < param->n_parts; p++) {
    WsyncBox box;
    rows_box(&box, param->parts[p].vt, first[p], rows[p]);
    place_at(r, tensor, ndim, shape, param->parts[p].vt, &box, at);
    at[0] += rows[p];
  }
  return TRUE;
}

/* ------------------------------------------------------------------ ROW */

/* RowParallelLinear (§1): rank t holds columns [t*C/tp, (t+1)*C/tp) of the last axis
 * (`input_size_per_partition = divide(input_size, tp_size)`, linear.py). */
static gboolean
emit_row(Rank *r, const WsyncParam *param, GError **error)
{
  const WsyncPart *part = &param->parts[0];
  guint ndim = wsync_vtensor_get_ndim(part->vt);
  guint64 shape[WSYNC_MAX_DIMS], at[WSYNC_MAX_DIMS] = {0}, rows, cols;
  WsyncLayoutTensor *tensor;
  WsyncBox box;

  if (param->n_parts != 1)
    return param_error(error, param, "a row-parallel param has exactly one part");
  if (!part_rows(param, part, &rows, error))
    return FALSE;
  rows_box(&box, part->vt, part->start, rows);
  /* (Of a 1-D part, the part's rows are the columns.) */
  cols = box.extent[ndim - 1];
  if (cols % r->tp != 0)
    return usage_error(error, "tp %u does not divide the %" G_GUINT64_FORMAT " columns of %s",
                       r->tp, cols, wsync_vtensor_get_name(part->vt));
  box.offset[ndim - 1] += r->t * (cols / r->tp);
  box.extent[ndim - 1] = cols / r->tp;
  memcpy(shape, box.extent, sizeof(guint64) * ndim);
  tensor = add_tensor(r, param->runtime_name, param_dtype(param), ndim, shape, error);
  if (tensor == NULL)
    return FALSE;
  place_at(r, tensor, ndim, shape, part->vt, &box, at);
  return TRUE;
}

/* ------------------------------------------------------------------ VOCAB */

/* Bytes of one element of @dtype, or 0 for the sub-byte types. */
static gsize
element_size(WsyncDtype dtype)
{
  guint bits = wsync_dtype_bits(dtype);

  return bits % 8 == 0 ? bits / 8 : 0;
}

/* VocabParallelEmbedding / ParallelLMHead (§1, vocab_parallel_embedding.py): the V
 * rows are padded to Vp = ceil(V/64)*64 (pad_vocab_size), rank t holds rows
 * [t*Vp/tp, (t+1)*Vp/tp) of the padded table, and rows >= V are zero
 * (`param[loaded_weight.shape[0]:].data.fill_(0)`). */
static gboolean
emit_vocab(Rank *r, const WsyncParam *param, GError **error)
{
  static const guint8 zero[16] = {0};
  const WsyncPart *part = &param->parts[0];
  guint ndim = wsync_vtensor_get_ndim(part->vt);
  guint64 shape[WSYNC_MAX_DIMS], at[WSYNC_MAX_DIMS] = {0}, vocab, padded, lo, hi, real_end;
  WsyncDtype dtype = param_dtype(param);
  WsyncLayoutTensor *tensor;
  WsyncBox box;

  if (param->n_parts != 1)
    return param_error(error, param, "a vocabulary param has exactly one part");
  if (!part_rows(param, part, &vocab, error))
    return FALSE;
  if (element_size(dtype) == 0 || element_size(dtype) > sizeof(zero))
    return param_error(error, param, "its dtype cannot be padded element by element");
  padded = (vocab + VOCAB_PADDING - 1) / VOCAB_PADDING * VOCAB_PADDING;
  if (padded % r->tp != 0)
    return usage_error(error,
                       "tp %u does not divide the padded vocabulary of %" G_GUINT64_FORMAT
                       " rows of %s",
                       r->tp, padded, wsync_vtensor_get_name(part->vt));
  lo = r->t * (padded / r->tp);
  hi = lo + padded / r->tp;
  real_end = MIN(hi, vocab);
  memcpy(shape, wsync_vtensor_get_shape(part->vt), sizeof(guint64) * ndim);
  shape[0] = hi - lo;
  tensor = add_tensor(r, param->runtime_name, dtype, ndim, shape, error);
  if (tensor == NULL)
    return FALSE;
  if (real_end > lo) {
    rows_box(&box, part->vt, part->start + lo, real_end - lo);
    place_at(r, tensor, ndim, shape, part->vt, &box, at);
  }
  if (hi > vocab) {
    wsync_box_whole(&box, ndim, shape);
    box.offset[0] = MAX(lo, vocab) - lo;
    box.extent[0] = hi - MAX(lo, vocab);
    wsync_layout_fill(r->layout, tensor, &box, zero, element_size(dtype),
                      "vocabulary padding to a multiple of 64");
  }
  return TRUE;
}

/* ------------------------------------------------------------------ experts */

/* The global experts a rank holds (§7, fused_moe/expert_map_manager.py
 * determine_expert_map, strategy "linear", no redundant experts): contiguous blocks,
 * the remainder one each to the LOWEST ranks.  Without EP every rank holds all. */
typedef struct {
  guint64 first;  /* first global expert (index into the part) */
  guint64 count;  /* E_loc */
  guint64 ip;     /* intermediate rows per expert on this rank */
  guint64 ip_off; /* first of them in the checkpoint's intermediate axis */
} ExpertShare;

static gboolean
expert_share(Rank *r, const WsyncParam *param, guint64 experts, guint64 inter, ExpertShare *share,
             GError **error)
{
  if (r->ep > 1) {
    /* FusedMoEParallelConfig.make (fused_moe/config.py): with EP the MoE tp size is 1,
     * so experts are whole (Ip = I). */
    guint64 base = experts / r->ep, rem = experts % r->ep;
    share->count = base + (r->rank < rem ? 1 : 0);
    share->first = r->rank * base + MIN(r->rank, rem);
    share->ip = inter;
    share->ip_off = 0;
    if (share->count == 0)
      return usage_error(error,
                         "ep %u is more than the %" G_GUINT64_FORMAT
                         " experts of %s: rank %u would hold none",
                         r->ep, experts, param->runtime_name, r->rank);
    return TRUE;
  }
  /* UnquantizedFusedMoEMethod.create_weights: intermediate_size_per_partition = I // tp
   * (`assert intermediate_size % self.tp_size == 0`, §2.2). */
  if (inter % r->tp != 0)
    return usage_error(error,
                       "tp %u does not divide the intermediate size %" G_GUINT64_FORMAT
                       " of the experts of %s",
                       r->tp, inter, param->runtime_name);
  share->first = 0;
  share->count = experts;
  share->ip = inter / r->tp;
  share->ip_off = r->t * share->ip;
  return TRUE;
}

/* `<prefix>.w13_weight`, or `<prefix>.routed_experts.w13_weight` from vLLM 0.22.1 on
 * (PR #41184; RoutedExperts.make_expert_params_mapping, routed_experts.py, §2.1). */
static char *
experts_name(Rank *r, const WsyncParam *param, const char *leaf)
{
  return g_strconcat(param->runtime_name, r->routed_experts ? ".routed_experts." : ".", leaf,
                     NULL);
}

/* Checks that every part is a 3-D [E, a, b] stack of the same E; returns E. */
static gboolean
expert_parts(const WsyncParam *param, guint n_parts, guint64 *experts, GError **error)
{
  if (param->n_parts != n_parts)
    return param_error(error, param, n_parts == 2 ? "w13 experts need parts gate and up"
                                                  : "w2 experts need one part, down");
  for (guint p = 0; p < n_parts; p++) {
    guint64 rows;
    if (wsync_vtensor_get_ndim(param->parts[p].vt) != 3)
      return param_error(error, param, "expert parts must be 3-D [E, out, in]");
    if (!part_rows(param, &param->parts[p], &rows, error))
      return FALSE;
    if (p > 0 && rows != *experts)
      return param_error(error, param, "its expert parts hold different numbers of experts");
    *experts = rows;
  }
  if (n_parts == 2 && memcmp(wsync_vtensor_get_shape(param->parts[0].vt) + 1,
                             wsync_vtensor_get_shape(param->parts[1].vt) + 1,
                             2 * sizeof(guint64)) != 0)
    return param_error(error, param, "its gate and up parts differ in shape");
  return TRUE;
}

/* The expert map of vLLM before 0.22.1 with EP (§5, §7): FusedMoE registers
 * determine_expert_map()'s result as the persistent buffer `_expert_map`, int32 [E]
 * (no redundant experts), global expert e -> its local index on this rank, -1 where
 * another rank holds it, so sharded_state saves it and insists on loading it.  Without
 * EP it is None, and from 0.22.1 on RoutedExperts registers it persistent=False: absent
 * either way.  Every element is a fill (a constant per box). */
static void
fill_i32(Rank *r, WsyncLayoutTensor *tensor, guint64 offset, guint64 extent, gint32 value,
         const char *reason)
{
  guint32 bits = GUINT32_TO_LE((guint32)value);
  guint8 bytes[sizeof(bits)];
  WsyncBox box = {.ndim = 1, .offset = {offset}, .extent = {extent}};

  if (extent == 0)
    return;
  memcpy(bytes, &bits, sizeof(bytes));
  wsync_layout_fill(r->layout, tensor, &box, bytes, sizeof(bytes), reason);
}

static gboolean
emit_expert_map(Rank *r, const WsyncParam *param, guint64 experts, const ExpertShare *share,
                GError **error)
{
  g_autofree char *name = NULL;
  guint64 shape[1] = {experts}, end = share->first + share->count;
  WsyncLayoutTensor *tensor;

  if (r->ep == 1 || r->routed_experts)
    return TRUE;
  name = g_strconcat(param->runtime_name, "._expert_map", NULL);
  tensor = add_tensor(r, name, WSYNC_DTYPE_I32, 1, shape, error);
  if (tensor == NULL)
    return FALSE;
  fill_i32(r, tensor, 0, share->first, -1, "vLLM expert map: held by another rank");
  for (guint64 j = 0; j < share->count; j++)
    fill_i32(r, tensor, share->first + j, 1, (gint32)j, "vLLM expert map: local index");
  fill_i32(r, tensor, end, experts - end, -1, "vLLM expert map: held by another rank");
  return TRUE;
}

/* w13_weight [E_loc, 2*Ip, H] (§2.2 create_weights, `_load_w13`): for local expert j
 * (global e), rows [0, Ip) are gate_e[ip_off : ip_off+Ip] ("w1" -> first half) and rows
 * [Ip, 2Ip) are up_e[...] ("w3" -> second half).  One placement per part covers every
 * local expert: the box [first:first+E_loc, ip_off:ip_off+Ip, 0:H] lands with strides
 * {2Ip*H, H, 1} at origin 0 (gate) or Ip*H (up). */
static gboolean
emit_experts_w13(Rank *r, const WsyncParam *param, GError **error)
{
  const guint64 *gate = wsync_vtensor_get_shape(param->parts[0].vt);
  g_autofree char *name = NULL;
  guint64 experts = 0, shape[3], at[3] = {0, 0, 0};
  WsyncLayoutTensor *tensor;
  ExpertShare share;

  if (!expert_parts(param, 2, &experts, error) ||
      !expert_share(r, param, experts, gate[1], &share, error))
    return FALSE;
  shape[0] = share.count;
  shape[1] = 2 * share.ip;
  shape[2] = gate[2];
  name = experts_name(r, param, "w13_weight");
  tensor = add_tensor(r, name, param_dtype(param), 3, shape, error);
  if (tensor == NULL)
    return FALSE;
  for (guint p = 0; p < 2; p++) { /* gate, then up */
    const WsyncPart *part = &param->parts[p];
    WsyncBox box;
    wsync_box_whole(&box, 3, wsync_vtensor_get_shape(part->vt));
    box.offset[0] = part->start + share.first;
    box.extent[0] = share.count;
    box.offset[1] = share.ip_off;
    box.extent[1] = share.ip;
    at[1] = p * share.ip;
    place_at(r, tensor, 3, shape, part->vt, &box, at);
  }
  return emit_expert_map(r, param, experts, &share, error);
}

/* w2_weight [E_loc, H, Ip] (§2.2): w2 is narrowed along its input axis, so local expert
 * j (global e) holds down_e[:, ip_off : ip_off+Ip]. */
static gboolean
emit_experts_w2(Rank *r, const WsyncParam *param, GError **error)
{
  const WsyncPart *part = &param->parts[0];
  const guint64 *down = wsync_vtensor_get_shape(part->vt);
  g_autofree char *name = NULL;
  guint64 experts = 0, shape[3], at[3] = {0, 0, 0};
  WsyncLayoutTensor *tensor;
  ExpertShare share;
  WsyncBox box;

  if (!expert_parts(param, 1, &experts, error) ||
      !expert_share(r, param, experts, down[2], &share, error))
    return FALSE;
  shape[0] = share.count;
  shape[1] = down[1];
  shape[2] = share.ip;
  name = experts_name(r, param, "w2_weight");
  tensor = add_tensor(r, name, param_dtype(param), 3, shape, error);
  if (tensor == NULL)
    return FALSE;
  wsync_box_whole(&box, 3, down);
  box.offset[0] = part->start + share.first;
  box.extent[0] = share.count;
  box.offset[2] = share.ip_off;
  box.extent[2] = share.ip;
  place_at(r, tensor, 3, shape, part->vt, &box, at);
  return TRUE;
}

/* ------------------------------------------------------------------ ATTENTION */

/* The scale buffers every full-attention layer registers as persistent buffers
 * (`set_default_quant_scales(layer, register_buffer=True)`,
 * vllm/model_executor/layers/attention/attention.py), float32 0-dim tensors of 1.0, which
 * ShardedStateLoader saves and insists on loading (§4, §5 "Keys that do not come from
 * the HF checkpoint"). */
static gboolean
emit_attention(Rank *r, const WsyncParam *param, GError **error)
{
  static const char *const scales[] = {"._k_scale", "._v_scale", "._q_scale", "._prob_scale"};
  const float one = 1.0f;
  guint32 bits;
  guint8 value[sizeof(bits)];
  guint64 shape[1] = {0};
  WsyncBox box;

  if (!r->attn_scales)
    return TRUE;
  /* safetensors data is little-endian */
  memcpy(&bits, &one, sizeof(bits));
  bits = GUINT32_TO_LE(bits);
  memcpy(value, &bits, sizeof(value));
  wsync_box_whole(&box, 0, shape);
  for (guint i = 0; i < G_N_ELEMENTS(scales); i++) {
    g_autofree char *name = g_strconcat(param->runtime_name, scales[i], NULL);
    WsyncLayoutTensor *tensor = add_tensor(r, name, WSYNC_DTYPE_F32, 0, shape, error);
    if (tensor == NULL)
      return FALSE;
    wsync_layout_fill(r->layout, tensor, &box, value, sizeof(value),
                      "vLLM attention scale buffer, 1.0");
  }
  return TRUE;
}

/* ------------------------------------------------------------------ params */

/* The language model's params: one rule per kind. */
static gboolean
emit_param(Rank *r, const WsyncParam *param, GError **error)
{
  if (param->kind != WSYNC_PARAM_ATTENTION && param->n_parts == 0)
    return param_error(error, param, "it has no parts");
  switch (param->kind) {
  case WSYNC_PARAM_REPLICATED:
    return emit_replicated(r, param, error);
  case WSYNC_PARAM_COLUMN:
    return emit_column(r, param, error);
  case WSYNC_PARAM_ROW:
    return emit_row(r, param, error);
  case WSYNC_PARAM_VOCAB:
    return emit_vocab(r, param, error);
  case WSYNC_PARAM_EXPERTS_W13:
    return emit_experts_w13(r, param, error);
  case WSYNC_PARAM_EXPERTS_W2:
    return emit_experts_w2(r, param, error);
  case WSYNC_PARAM_ATTENTION:
    return emit_attention(r, param, error);
  }
  return param_error(error, param, "unknown param kind");
}

/* The vision tower (group "visual", ../shared/reference/vllm-vision.md): with the
 * default `mm_encoder_tp_mode="weights"` it is sharded by the same linear-layer rules as
 * the language model (QKVParallelLinear with as many KV heads as heads, Column/Row
 * parallel MLPs, whole norms and patch embedding), which the model plugin expresses with
 * the same kinds.  Its own rules go here: `mm_encoder_tp_mode="data"` (every weight
 * whole), and a language-model-only load, where `_mark_tower_model` registers no
 * `visual.*` params at all (§3.5) and the group is dropped. */
static gboolean
emit_visual_param(Rank *r, const WsyncParam *param, GError **error)
{
  return emit_param(r, param, error);
}

static gboolean
handle_param(Rank *r, const WsyncParam *param, GError **error)
{
  /* `AutoWeightsLoader(self, skip_prefixes=["mtp."])`: the main model never holds the
   * multi-token-prediction layers (§3.5). */
  if (g_strcmp0(param->group, "mtp") == 0) {
    wsync_layout_drop_param(r->layout, param, "vllm-skips-mtp");
    return TRUE;
  }
  /* The model says the running engine does not hold it (e.g. a vision tower switched
   * off by a language-model-only deployment): drop it by the model's rule. */
  if (param->runtime_drop != NULL) {
    wsync_layout_drop_param(r->layout, param, param->runtime_drop);
    return TRUE;
  }
  if (g_strcmp0(param->group, "visual") == 0)
    return emit_visual_param(r, param, error);
  return emit_param(r, param, error);
}

/* ------------------------------------------------------------------ the converter */

/* The convention of the files: when this layout reads rank files that wsync wrote for
 * vLLM, the version and attn-scales they record; otherwise the options. */
static gboolean
choose_convention(Rank *r, const VllmSettings *settings, GError **error)
{
  const char *target = wsync_layout_get_input_metadata(r->layout, "wsync.target");
  const char *version = wsync_layout_get_input_metadata(r->layout, "wsync.vllm-version");
  const char *scales = wsync_layout_get_input_metadata(r->layout, "wsync.attn-scales");
  guint64 parts[VERSION_PARTS];

  r->version = settings->version;
  r->routed_experts = settings->routed_experts;
  r->attn_scales = settings->attn_scales;
  if (target == NULL || (strcmp(target, "vllm") != 0 && strcmp(target, "vllm-ascend") != 0))
    return TRUE;
  if (version != NULL) {
    if (!parse_version(version, parts)) {
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                  "rank %u: metadata wsync.vllm-version is \"%s\", not a vLLM release number",
                  r->rank, version);
      return FALSE;
    }
    r->version = version;
    r->routed_experts = version_has_routed_experts(parts);
  }
  if (scales != NULL)
    r->attn_scales = strcmp(scales, "true") == 0;
  return TRUE;
}

/* world = ep if ep > 1 else tp; with EP, ep must be a multiple of tp and the rank's tp
 * rank is rank % tp (ep_rank = dp_rank*pcp*tp + pcp_rank*tp + tp_rank, §7). */
static gboolean
check_parallel(Rank *r, GError **error)
{
  if (r->tp == 0 || r->ep == 0)
    return usage_error(error, "tp %u and ep %u must be at least 1", r->tp, r->ep);
  if (r->ep > 1 && r->ep % r->tp != 0)
    return usage_error(error, "ep %u is not a multiple of tp %u", r->ep, r->tp);
  r->world = r->ep > 1 ? r->ep : r->tp;
  if (r->rank >= r->world)
    return usage_error(error, "rank %u is outside the %u ranks of tp %u ep %u", r->rank,
                       r->world, r->tp, r->ep);
  r->t = r->rank % r->tp;
  return TRUE;
}

static void
set_metadata_uint(Rank *r, const char *key, guint value)
{
  char text[16];

  g_snprintf(text, sizeof(text), "%u", value);
  wsync_layout_set_metadata(r->layout, key, text);
}

/* Layout state that travels with the data: the engine reads rank files back with it. */
static void
set_metadata(Rank *r)
{
  wsync_layout_set_metadata(r->layout, "wsync.target", wsync_layout_get_target(r->layout));
  set_metadata_uint(r, "wsync.tp", r->tp);
  set_metadata_uint(r, "wsync.ep", r->ep);
  set_metadata_uint(r, "wsync.rank", r->rank);
  set_metadata_uint(r, "wsync.world", r->world);
  wsync_layout_set_metadata(r->layout, "wsync.vllm-version", r->version);
  wsync_layout_set_metadata(r->layout, "wsync.attn-scales", r->attn_scales ? "true" : "false");
}

/* The converter: every param of the model, for one rank. */
static gboolean
build_rank(WsyncLayout *layout, gpointer user_data, GError **error)
{
  Rank r = {.layout = layout,
            .tp = wsync_layout_get_tp(layout),
            .ep = wsync_layout_get_ep(layout),
            .rank = wsync_layout_get_rank(layout)};
  guint n = wsync_layout_n_params(layout);

  if (!check_parallel(&r, error) || !choose_convention(&r, user_data, error))
    return FALSE;
  /* vllm-ascend is this layout finished by another plugin's post-load hook; without it
   * the files would carry the target's name and the loader layout (§6). */
  if (strcmp(wsync_layout_get_target(layout), "vllm-ascend") == 0)
    wsync_layout_require_hook(layout, "its routed experts must be put in vLLM-Ascend's "
                                      "processed layout by a post-load hook (plugin npu-ascend)");
  set_metadata(&r);
  for (guint i = 0; i < n; i++)
    if (!handle_param(&r, wsync_layout_param(layout, i), error))
      return FALSE;
  return TRUE;
}

/* ------------------------------------------------------------------ registration */

/* Designated initialisers: CFG_STR() has no slot for a validating callback. */
static cfg_opt_t options[] = {
    {.name = "vllm-version",
     .type = CFGT_STR,
     .flags = CFGF_NONE,
     .def.string = "0.22.1",
     .validcb = validate_version},
    CFG_BOOL("attn-scales", cfg_true, CFGF_NONE),
    CFG_END()};

static gboolean
vllm_register(WsyncPlugin *plugin, GError **error)
{
  cfg_t *cfg = wsync_plugin_get_options(plugin);
  const char *version = cfg_getstr(cfg, "vllm-version");
  guint64 parts[VERSION_PARTS];
  VllmSettings *settings;

  /* The validator has seen every value a file set; this catches anything else. */
  if (!parse_version(version, parts)) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_CONFIG, VERSION_RULE ", not \"%s\"",
                version != NULL ? version : "");
    return FALSE;
  }
  settings = g_new0(VllmSettings, 1);
  settings->version = g_strdup(version);
  settings->routed_experts = version_has_routed_experts(parts);
  settings->attn_scales = cfg_getbool(cfg, "attn-scales");
  return wsync_plugin_add_converter(plugin, "vllm", WSYNC_PRIORITY_DEFAULT, "vllm,vllm-ascend",
                                    build_rank, settings, free_settings, error);
}

WSYNC_PLUGIN_DEFINE("vllm", "vLLM runtime layout per TP/EP rank (sharded_state)", options,
                    vllm_register)
