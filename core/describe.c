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

/* The remapper that claims model_type describes the model; a config error it or its
 * building blocks recorded is reported with the config's name. */
gboolean
plan_describe(WsyncPlan *plan, const char *config_name, GError **error)
{
  JsonObject *root = json_node_get_object(plan->config);
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
    return FALSE;
  }
  remappers = wsync_registry_lookup(wsync_context_get_registry(plan->ctx), WSYNC_ENTRY_REMAPPER,
                                    model_type);
  if (remappers->len == 0) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                "%s: model_type \"%s\" is claimed by no loaded plugin (select a model plugin "
                "in conf.d; see wsync plugins)",
                config_name, model_type);
    return FALSE;
  }
  const WsyncEntry *entry = remappers->pdata[0];
  WsyncRemapFunc remap = (WsyncRemapFunc)wsync_entry_get_callback(entry);
  plan->model = wsync_model_new(root, model_type);
  plan->model->remapper = plan_entry_label(entry);
  if (!remap(plan->model, wsync_entry_get_user_data(entry), error)) {
    if (wsync_entry_explain_silence(error))
      g_prefix_error(error, "%s: ", plan->model->remapper);
    g_prefix_error(error, "%s: ", config_name);
    return FALSE;
  }
  if (plan->model->error != NULL) {
    g_propagate_prefixed_error(error, g_steal_pointer(&plan->model->error), "%s: ", config_name);
    return FALSE;
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
