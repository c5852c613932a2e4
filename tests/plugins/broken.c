/* Test plugin: a converter whose layouts break the engine's rules on purpose, so the
 * tests can show that the planner's proofs catch each kind of mistake.
 *   broken-overlap  places every replicated logical tensor twice into its tensor
 *   broken-gap      gives every replicated tensor one row more than it fills
 *   broken-lose     holds nothing and drops nothing: every input would be lost
 * Params other than replicated ones are dropped by a rule in the first two. */
#include <string.h>

#include <wsync/wsync.h>

static gboolean
build(WsyncLayout *layout, gpointer user_data, GError **error)
{
  const char *target = wsync_layout_get_target(layout);

  (void)user_data;
  if (strcmp(target, "broken-lose") == 0)
    return TRUE;
  for (guint i = 0; i < wsync_layout_n_params(layout); i++) {
    const WsyncParam *param = wsync_layout_param(layout, i);
    if (param->kind != WSYNC_PARAM_REPLICATED || param->n_parts != 1) {
      wsync_layout_drop_param(layout, param, "test-drops-it");
      continue;
    }
    WsyncLogicalTensor *lt = param->parts[0].lt;
    guint64 shape[WSYNC_MAX_DIMS];
    guint ndim = wsync_logical_get_ndim(lt);
    memcpy(shape, wsync_logical_get_shape(lt), ndim * sizeof(guint64));
    if (strcmp(target, "broken-gap") == 0)
      shape[0] += 1;
    WsyncLayoutTensor *t = wsync_layout_add_tensor(layout, param->name,
                                                   wsync_logical_get_dtype(lt), ndim, shape,
                                                   error);
    if (t == NULL)
      return FALSE;
    WsyncBox box;
    WsyncRegion region;
    wsync_box_whole(&box, ndim, wsync_logical_get_shape(lt));
    wsync_region_row_major(&region, ndim, shape, NULL);
    wsync_layout_place(layout, t, lt, &box, &region);
    if (strcmp(target, "broken-overlap") == 0)
      wsync_layout_place(layout, t, lt, &box, &region);
  }
  return TRUE;
}

static char *
file_name(WsyncLayout *layout, guint part, guint n_parts, gpointer user_data)
{
  (void)n_parts;
  (void)user_data;
  return g_strdup_printf("broken-rank-%u-part-%u.safetensors", wsync_layout_get_rank(layout),
                         part);
}

static gboolean
broken_register(WsyncPlugin *plugin, GError **error)
{
  static const char *const names[] = {"broken-overlap", "broken-gap", "broken-lose"};

  for (guint i = 0; i < G_N_ELEMENTS(names); i++) {
    WsyncTargetInfo info = {.name = names[i],
                            .description = "breaks the layout rules on purpose",
                            .build = build,
                            .file_name = file_name};
    if (!wsync_plugin_add_target(plugin, &info, 0, NULL, NULL, error))
      return FALSE;
  }
  return TRUE;
}

WSYNC_PLUGIN_DEFINE("broken", "Test converter that breaks the layout rules", NULL,
                    broken_register)
