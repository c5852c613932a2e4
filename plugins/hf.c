/* wsync plugin "hf": the layouts models are published in (Hugging Face Transformers
 * checkpoints; docs/hf-checkpoints.md, docs/safetensors.md).
 *
 * Three targets, built from any model's description alone:
 *
 *   hf          every logical tensor whole under its published name and dtype; a MoE
 *               block's routed experts in the form the model publishes them in (or, read
 *               back, in the form the input has, layer by layer)
 *   hf-experts  every MoE block's experts one tensor per expert and projection,
 *               `experts.{e}.{gate,up,down}_proj.weight` (what vLLM's own loader takes)
 *   hf-fused    every MoE block's experts in Transformers 5's fused form,
 *               `experts.gate_up_proj` [E, 2I, H] (gate rows first) and
 *               `experts.down_proj` [E, H, I], no `.weight` (docs/hf-checkpoints.md §4)
 *
 * Files are Transformers' shards, `model-0000i-of-0000N.safetensors`, with
 * `model.safetensors.index.json` (docs/safetensors.md §2).  "hf" is also the layout
 * that reads any checkpoint no other target claims: a published checkpoint, a merged
 * sharded one, a Transformers 5 re-save.
 */
#include <string.h>

#include <wsync/layout.h>
#include <wsync/model.h>
#include <wsync/plugin.h>
#include <wsync/target.h>

typedef enum {
  FORM_PUBLISHED, /* hf: as published, or as the input has it */
  FORM_PER_EXPERT,
  FORM_FUSED,
} Form;

/* ------------------------------------------------------------------ experts */

/* Expert @e of a stacked [E, R, C] logical tensor as its own [R, C] tensor
 * PREFIX{e}.PROJ.weight: box [e:e+1, 0:R, 0:C], laid out as a [1, R, C] tensor. */
static gboolean
add_expert(WsyncLayout *layout, WsyncLogicalTensor *lt, const char *prefix, guint64 e,
           const char *proj, GError **error)
{
  const guint64 *shape = wsync_logical_get_shape(lt);
  g_autofree char *name = g_strdup_printf("%s%" G_GUINT64_FORMAT ".%s.weight", prefix, e, proj);
  WsyncLayoutTensor *t = wsync_layout_add_tensor(
      layout, name, wsync_logical_get_published_dtype(lt), 2, &shape[1], error);
  const guint64 one[3] = {1, shape[1], shape[2]};
  WsyncRegion region;
  WsyncBox box;

  if (t == NULL)
    return FALSE;
  wsync_layout_tensor_set_param(t, wsync_logical_get_param(lt));
  wsync_box_whole(&box, 3, one);
  box.offset[0] = e;
  /* the box's three axes walk the [R, C] tensor as if it were [1, R, C] */
  wsync_region_row_major(&region, 3, one, NULL);
  wsync_layout_place(layout, t, lt, &box, &region);
  return TRUE;
}

static gboolean
add_per_expert(WsyncLayout *layout, WsyncLogicalTensor *const lts[3], const char *prefix,
               GError **error)
{
  static const char *const projs[3] = {"gate_proj", "up_proj", "down_proj"};

  for (guint64 e = 0; e < wsync_logical_get_shape(lts[0])[0]; e++)
    for (guint p = 0; p < 3; p++)
      if (!add_expert(layout, lts[p], prefix, e, projs[p], error))
        return FALSE;
  return TRUE;
}

/* PREFIXgate_up_proj [E, 2I, H]: gate in rows [0, I), up in rows [I, 2I) of every expert
 * (Transformers 5's Concatenate(dim=1), gate first); PREFIXdown_proj [E, H, I]. */
static gboolean
add_fused(WsyncLayout *layout, WsyncLogicalTensor *const lts[3], const char *prefix,
          GError **error)
{
  const guint64 *s = wsync_logical_get_shape(lts[0]);
  const guint64 shape[3] = {s[0], 2 * s[1], s[2]};
  g_autofree char *gate_up = g_strconcat(prefix, "gate_up_proj", NULL);
  g_autofree char *down = g_strconcat(prefix, "down_proj", NULL);
  WsyncDtype dtype = wsync_logical_get_published_dtype(lts[0]);
  WsyncLayoutTensor *t = wsync_layout_add_tensor(layout, gate_up, dtype, 3, shape, error);
  WsyncBox box;

  if (t == NULL)
    return FALSE;
  wsync_layout_tensor_set_param(t, wsync_logical_get_param(lts[0]));
  wsync_box_whole(&box, 3, s);
  for (guint half = 0; half < 2; half++) {
    const guint64 at[3] = {0, half * s[1], 0};
    wsync_layout_place_at(layout, t, lts[half], &box, at);
  }
  t = wsync_layout_add_tensor(layout, down, dtype, 3, wsync_logical_get_shape(lts[2]), error);
  if (t == NULL)
    return FALSE;
  wsync_layout_tensor_set_param(t, wsync_logical_get_param(lts[2]));
  wsync_box_whole(&box, 3, wsync_logical_get_shape(lts[2]));
  wsync_layout_place_at(layout, t, lts[2], &box, NULL);
  return TRUE;
}

/* Which form a MoE block's experts take: the target's, else (hf) the input's for this
 * block when reading, else the one the model publishes. */
static gboolean
fused_form(WsyncLayout *layout, Form form, const WsyncBlock *block, const char *prefix)
{
  g_autofree char *fused = g_strconcat(prefix, "gate_up_proj", NULL);
  g_autofree char *expert0 = g_strconcat(prefix, "0.gate_proj.weight", NULL);

  if (form != FORM_PUBLISHED)
    return form == FORM_FUSED;
  if (wsync_layout_input_has(layout, fused))
    return TRUE;
  if (wsync_layout_input_has(layout, expert0))
    return FALSE;
  return wsync_block_get_experts_form(block) == WSYNC_EXPERTS_FUSED;
}

/* A MoE block's three stacks, under `MODULE.experts.`. */
static gboolean
add_experts(WsyncLayout *layout, Form form, const WsyncBlock *block, GError **error)
{
  static const WsyncRole roles[3] = {WSYNC_ROLE_EXPERTS_GATE, WSYNC_ROLE_EXPERTS_UP,
                                     WSYNC_ROLE_EXPERTS_DOWN};
  g_autofree char *prefix = g_strconcat(wsync_block_get_module(block), ".experts.", NULL);
  WsyncLogicalTensor *lts[3];

  for (guint i = 0; i < 3; i++) {
    const WsyncParam *param = wsync_block_get_param(block, roles[i]);
    if (param == NULL) {
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_FAILED,
                  "hf: the MoE block %s lacks its stacked experts", prefix);
      return FALSE;
    }
    lts[i] = param->parts[0].lt;
  }
  return fused_form(layout, form, block, prefix) ? add_fused(layout, lts, prefix, error)
                                                 : add_per_expert(layout, lts, prefix, error);
}

/* ------------------------------------------------------------------ the targets */

static gboolean
is_expert_stack(const WsyncParam *param, WsyncRole role)
{
  return param != NULL && param->role == role;
}

/* Every logical tensor whole, in its published dtype, except the routed experts, which
 * take one of the two forms. */
static gboolean
build(WsyncLayout *layout, gpointer user_data, GError **error)
{
  Form form = (Form)GPOINTER_TO_INT(user_data);

  for (guint i = 0; i < wsync_layout_n_logical(layout); i++) {
    WsyncLogicalTensor *lt = wsync_layout_logical(layout, i);
    const WsyncParam *param = wsync_logical_get_param(lt);
    gboolean ok;

    if (is_expert_stack(param, WSYNC_ROLE_EXPERTS_UP) ||
        is_expert_stack(param, WSYNC_ROLE_EXPERTS_DOWN))
      continue; /* placed with their block's gate stack */
    ok = is_expert_stack(param, WSYNC_ROLE_EXPERTS_GATE)
             ? add_experts(layout, form, param->block, error)
             : wsync_layout_add_whole(layout, lt, error) != NULL;
    if (!ok)
      return FALSE;
  }
  return TRUE;
}

/* Transformers' shard names (docs/safetensors.md §2). */
static char *
file_name(WsyncLayout *layout, guint part, guint n_parts, gpointer user_data)
{
  (void)layout;
  (void)user_data;
  return g_strdup_printf("model-%05u-of-%05u.safetensors", part + 1, n_parts);
}

static gboolean
add_target(WsyncPlugin *plugin, const char *name, const char *description, Form form,
           gboolean reads_unclaimed, GError **error)
{
  WsyncTargetInfo info = {.name = name,
                          .description = description,
                          .build = build,
                          .file_name = file_name,
                          .writes_index = TRUE,
                          .reads_unclaimed = reads_unclaimed};

  return wsync_plugin_add_target(plugin, &info, WSYNC_PRIORITY_DEFAULT, GINT_TO_POINTER(form),
                                 NULL, error);
}

static gboolean
hf_register(WsyncPlugin *plugin, GError **error)
{
  return add_target(plugin, "hf", "the layout the model's checkpoints are published in",
                    FORM_PUBLISHED, TRUE, error) &&
         add_target(plugin, "hf-experts", "every expert as per-expert tensors", FORM_PER_EXPERT,
                    FALSE, error) &&
         add_target(plugin, "hf-fused", "Transformers 5's fused experts", FORM_FUSED, FALSE,
                    error);
}

WSYNC_PLUGIN_DEFINE("hf", "Hugging Face checkpoints: published, per-expert, fused", NULL,
                    hf_register)
