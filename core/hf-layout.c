/* wsync: Hugging Face layout helpers for model plugins.  These are Transformers'
 * conventions, shared by every model that follows them (hf-qwen.md §1.1, §2.1, §2.2:
 * the qwen2_moe converters that Qwen3-MoE, Qwen3-Next and Qwen3.5 share). */
#include <string.h>

#include "engine-private.h"

gboolean
wsync_layout_add_whole(WsyncLayout *layout, WsyncVTensor *vt, WsyncDtype dtype, GError **error)
{
  WsyncLayoutTensor *t =
      wsync_layout_add_tensor(layout, vt->name, dtype, vt->ndim, vt->shape, error);
  WsyncBox box;
  WsyncRegion region;

  if (t == NULL)
    return FALSE;
  wsync_box_whole(&box, vt->ndim, vt->shape);
  wsync_region_row_major(&region, vt->ndim, vt->shape, NULL);
  wsync_layout_place(layout, t, vt, &box, &region);
  return TRUE;
}

/* Per-expert form: expert @e of a stacked [E, R, C] tensor as its own [R, C] tensor
 * `PREFIX{e}.PROJ.weight`: box [e:e+1, 0:R, 0:C] at origin 0 with the strides of a
 * [1, R, C] tensor. */
static gboolean
add_expert(WsyncLayout *layout, WsyncVTensor *vt, const char *prefix, guint64 e,
           const char *proj, WsyncDtype dtype, GError **error)
{
  const guint64 one[3] = {1, vt->shape[1], vt->shape[2]};
  g_autofree char *name = g_strdup_printf("%s%" G_GUINT64_FORMAT ".%s.weight", prefix, e, proj);
  WsyncLayoutTensor *t = wsync_layout_add_tensor(layout, name, dtype, 2, &vt->shape[1], error);
  WsyncBox box;
  WsyncRegion region;

  if (t == NULL)
    return FALSE;
  wsync_box_whole(&box, 3, one);
  box.offset[0] = e;
  wsync_region_row_major(&region, 3, one, NULL);
  wsync_layout_place(layout, t, vt, &box, &region);
  return TRUE;
}

/* Fused form (Transformers 5): `PREFIXgate_up_proj` [E, 2I, H] with gate in rows [0, I)
 * and up in rows [I, 2I) of every expert (Concatenate(dim=1) of the stacked gate and up,
 * gate first), and `PREFIXdown_proj` [E, H, I]; no .weight suffix on either. */
static gboolean
add_fused(WsyncLayout *layout, WsyncVTensor *vts[3], const char *prefix, WsyncDtype dtype,
          GError **error)
{
  const guint64 *s = vts[0]->shape;
  const guint64 shape[3] = {s[0], 2 * s[1], s[2]};
  g_autofree char *gate_up = g_strconcat(prefix, "gate_up_proj", NULL);
  g_autofree char *down = g_strconcat(prefix, "down_proj", NULL);
  WsyncLayoutTensor *t = wsync_layout_add_tensor(layout, gate_up, dtype, 3, shape, error);
  WsyncBox box;
  WsyncRegion region;

  if (t == NULL)
    return FALSE;
  wsync_box_whole(&box, 3, s);
  for (guint half = 0; half < 2; half++) {
    const guint64 at[3] = {0, half * s[1], 0};
    wsync_region_row_major(&region, 3, shape, at);
    wsync_layout_place(layout, t, vts[half], &box, &region);
  }
  t = wsync_layout_add_tensor(layout, down, dtype, 3, vts[2]->shape, error);
  if (t == NULL)
    return FALSE;
  wsync_box_whole(&box, 3, vts[2]->shape);
  wsync_region_row_major(&region, 3, vts[2]->shape, NULL);
  wsync_layout_place(layout, t, vts[2], &box, &region);
  return TRUE;
}

gboolean
wsync_layout_add_hf_experts(WsyncLayout *layout, WsyncVTensor *gate, WsyncVTensor *up,
                            WsyncVTensor *down, const char *prefix, gboolean fused,
                            WsyncDtype dtype, GError **error)
{
  static const char *const projs[3] = {"gate_proj", "up_proj", "down_proj"};
  WsyncVTensor *vts[3] = {gate, up, down};

  if (fused)
    return add_fused(layout, vts, prefix, dtype, error);
  for (guint64 e = 0; e < gate->shape[0]; e++)
    for (guint p = 0; p < 3; p++)
      if (!add_expert(layout, vts[p], prefix, e, projs[p], dtype, error))
        return FALSE;
  return TRUE;
}

/* ------------------------------------------------------------------ the Hugging Face targets */

/* The model plugin's own description of its published layout. */
static gboolean
hf_build(WsyncLayout *layout, gpointer user_data, GError **error)
{
  (void)user_data;
  return layout->mapping->hf_build(layout, layout->mapping->hf_data, error);
}

/* Transformers' shard names: model-00001-of-00003.safetensors. */
static char *
hf_file_name(WsyncLayout *layout, guint part, guint n_parts, gpointer user_data)
{
  (void)layout;
  (void)user_data;
  return g_strdup_printf("model-%05u-of-%05u.safetensors", part + 1, n_parts);
}

#define HF_TARGET(target_name, text)                                                          \
  {.name = target_name,                                                                       \
   .description = text,                                                                       \
   .build = hf_build,                                                                         \
   .file_name = hf_file_name,                                                                 \
   .writes_index = TRUE,                                                                      \
   .reads_unclaimed = TRUE}

static const WsyncTargetInfo hf_targets[] = {
    HF_TARGET("hf", "the layout the model's checkpoints are published in"),
    HF_TARGET("hf-experts", "every expert as per-expert tensors"),
    HF_TARGET("hf-fused", "Transformers 5's fused experts"),
};

const WsyncTargetInfo *
wsync_hf_target_at(guint index)
{
  return index < G_N_ELEMENTS(hf_targets) ? &hf_targets[index] : NULL;
}

const WsyncTargetInfo *
wsync_hf_target(const char *name)
{
  for (guint i = 0; i < G_N_ELEMENTS(hf_targets); i++)
    if (g_strcmp0(name, hf_targets[i].name) == 0)
      return &hf_targets[i];
  return NULL;
}
