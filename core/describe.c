/* wsync: describing the model of a plan.
 *
 * config.json is read, and the remapper that claims its model_type describes the model
 * (<wsync/model.h>); merge describes a sharded checkpoint's own tensors instead.
 */
#include "config.h"

#include <string.h>

#include "entry-private.h"
#include "files.h"
#include "plan-private.h"

/* The remapper that claims model_type describes the model of @root; a config error it or
 * its building blocks recorded is reported with the config's name. */
static WsyncModel *
describe_model(WsyncContext *ctx, JsonObject *root, const char *config_name, GError **error)
{
  JsonNode *type_node = json_object_get_member(root, "model_type");
  /* (json-glib's getters complain on stderr about a member of another type) */
  const char *model_type = type_node != NULL && JSON_NODE_HOLDS_VALUE(type_node) &&
                                   json_node_get_value_type(type_node) == G_TYPE_STRING
                               ? json_node_get_string(type_node)
                               : NULL;
  g_autoptr(GPtrArray) remappers = NULL;

  if (model_type == NULL) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT, "%s: no \"model_type\" string",
                config_name);
    return NULL;
  }
  remappers = wsync_registry_lookup(wsync_context_get_registry(ctx), WSYNC_ENTRY_REMAPPER,
                                    model_type);
  if (remappers->len == 0) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                "%s: model_type \"%s\" is claimed by no loaded plugin (select a model plugin "
                "in conf.d; see wsync plugins)",
                config_name, model_type);
    return NULL;
  }
  const WsyncEntry *entry = remappers->pdata[0];
  WsyncRemapFunc remap = (WsyncRemapFunc)wsync_entry_get_callback(entry);
  WsyncModel *model = wsync_model_new(root, model_type);
  model->config_name = g_strdup(config_name); /* for backends' errors */
  model->remapper = plan_entry_label(entry);
  model->remapper_plugin = g_strdup(wsync_entry_get_plugin(entry));
  if (!remap(model, wsync_entry_get_user_data(entry), error)) {
    if (wsync_entry_explain_silence(error))
      g_prefix_error(error, "%s: ", model->remapper);
    g_prefix_error(error, "%s: ", config_name);
    wsync_model_free(model);
    return NULL;
  }
  if (model->error != NULL) {
    g_propagate_prefixed_error(error, g_steal_pointer(&model->error), "%s: ", config_name);
    wsync_model_free(model);
    return NULL;
  }
  return model;
}

gboolean
plan_describe(WsyncPlan *plan, const char *config_name, GError **error)
{
  plan->model = describe_model(plan->ctx, json_node_get_object(plan->config), config_name, error);
  return plan->model != NULL;
}

/* ------------------------------------------------------------------ the first N layers */

/* The declared layer count's field, or NULL when the remapper declared none that the
 * config holds as an integer. */
static const LayerField *
layer_count_field(const WsyncModel *model, gint64 *count)
{
  for (guint i = 0; i < model->layer_fields->len; i++) {
    const LayerField *f = &g_array_index(model->layer_fields, LayerField, i);
    JsonNode *node = json_object_get_member(f->object, f->key);
    if (f->kind == WSYNC_LAYER_FIELD_COUNT && node != NULL && JSON_NODE_HOLDS_VALUE(node) &&
        json_node_get_value_type(node) == G_TYPE_INT64) {
      *count = json_node_get_int(node);
      return f;
    }
  }
  return NULL;
}

/* A per-layer list keeps its first @layers elements; an index list the integers below
 * @layers (anything else in it is left for the remapper to name). */
static void
trim_list(JsonArray *list, WsyncLayerField kind, guint64 layers)
{
  for (guint i = json_array_get_length(list); i-- > 0;) {
    JsonNode *e = json_array_get_element(list, i);
    gboolean cut = kind == WSYNC_LAYER_FIELD_PER_LAYER
                       ? i >= layers
                       : JSON_NODE_HOLDS_VALUE(e) &&
                             json_node_get_value_type(e) == G_TYPE_INT64 &&
                             json_node_get_int(e) >= (gint64)layers;
    if (cut)
      json_array_remove_element(list, i);
  }
}

gboolean
wsync_config_trim_layers(WsyncContext *ctx, JsonNode *config, const char *config_name,
                         guint64 layers, guint64 *model_layers, GError **error)
{
  g_return_val_if_fail(ctx != NULL && config != NULL && JSON_NODE_HOLDS_OBJECT(config), FALSE);
  g_return_val_if_fail(config_name != NULL && layers >= 1, FALSE);
  g_autoptr(WsyncModel) model =
      describe_model(ctx, json_node_get_object(config), config_name, error);
  gint64 count = -1;

  if (model_layers != NULL)
    *model_layers = 0;
  if (model == NULL)
    return FALSE;
  const LayerField *count_field = layer_count_field(model, &count);
  if (count_field == NULL) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                "%s: %s declares no field that counts the model's layers, so its "
                "config cannot be cut to the first layers",
                config_name, model->remapper);
    return FALSE;
  }
  if (model_layers != NULL)
    *model_layers = (guint64)MAX(count, 0);
  if ((gint64)layers > count) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE, "%s has only %" G_GINT64_FORMAT " layer%s",
                config_name, count, count == 1 ? "" : "s");
    return FALSE;
  }
  for (guint i = 0; i < model->layer_fields->len; i++) {
    const LayerField *f = &g_array_index(model->layer_fields, LayerField, i);
    JsonNode *node = json_object_get_member(f->object, f->key);
    if (f->kind == WSYNC_LAYER_FIELD_COUNT) {
      if (node != NULL)
        json_object_set_int_member(f->object, f->key, (gint64)layers);
    } else if (node != NULL && JSON_NODE_HOLDS_ARRAY(node))
      trim_list(json_node_get_array(node), f->kind, layers);
  }
  return TRUE;
}

/* merge: the model is the checkpoint's own tensors, each written whole under its name
 * into the output file its shards name (-model-I-of-N). */
void
plan_describe_identity(WsyncPlan *plan)
{
  JsonObject *root = json_node_get_object(plan->config);

  plan->model = wsync_model_new(root, "(sharded checkpoint)");
  plan->model->remapper = g_strdup("merge (core)");
  for (guint i = 0; i < wsync_dcp_n_tensors(plan->dcp); i++) {
    const WsyncDcpTensor *g = wsync_dcp_tensor(plan->dcp, i);
    WsyncLogicalTensor *lt =
        wsync_model_add_tensor(plan->model, g->name, g->dtype, g->ndim, g->shape);
    lt->part_hint = g->part;
    lt->n_parts_hint = g->n_parts;
  }
}
