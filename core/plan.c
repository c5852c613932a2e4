/* wsync: planning a conversion from headers alone.
 *
 * 1. describe: the remapper that claims config.json's model_type declares the logical
 *    tensors and params;
 * 2. bind: the layout that describes the input (Hugging Face, or the target recorded in
 *    rank files' metadata) is built for reading, and each of its placements becomes a
 *    source of a logical tensor, bound to the input tensor of the same name;
 * 3. build: the target's converter (or the model's Hugging Face builder) builds each
 *    output rank's layout, then the hooks that serve the target run on it;
 * 4. resolve: each placement of an output tensor is cut into copies from the sources of
 *    its logical tensor (first source wins where replicas overlap); a box no source
 *    covers is an error;
 * 5. prove: the copies and fills of every output tensor must tile it exactly, and every
 *    input tensor must be used, or dropped by a named rule.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "files.h"
#include "plan.h"
#include "plan-private.h"

/* ------------------------------------------------------------------ small helpers */

static char *
format_dims(guint ndim, const guint64 *v)
{
  GString *s = g_string_new("[");

  for (guint d = 0; d < ndim; d++)
    g_string_append_printf(s, d ? ", %" G_GUINT64_FORMAT : "%" G_GUINT64_FORMAT, v[d]);
  g_string_append_c(s, ']');
  return g_string_free(s, FALSE);
}

/* "[a:b, c:d]" */
static char *
format_box(const WsyncBox *box)
{
  GString *s = g_string_new("[");

  for (guint d = 0; d < box->ndim; d++)
    g_string_append_printf(s, "%s%" G_GUINT64_FORMAT ":%" G_GUINT64_FORMAT, d ? ", " : "",
                           box->offset[d], box->offset[d] + box->extent[d]);
  g_string_append_c(s, ']');
  return g_string_free(s, FALSE);
}

/* Lists up to 8 names, then "and N more". */
static char *
format_list(GPtrArray *names)
{
  GString *s = g_string_new(NULL);

  for (guint i = 0; i < names->len && i < 8; i++)
    g_string_append_printf(s, "%s%s", i ? ", " : "", (const char *)names->pdata[i]);
  if (names->len > 8)
    g_string_append_printf(s, " and %u more", names->len - 8);
  return g_string_free(s, FALSE);
}

static gboolean
boxes_intersect(const WsyncBox *a, const WsyncBox *b, WsyncBox *out)
{
  out->ndim = a->ndim;
  for (guint d = 0; d < a->ndim; d++) {
    guint64 lo = MAX(a->offset[d], b->offset[d]);
    guint64 hi = MIN(a->offset[d] + a->extent[d], b->offset[d] + b->extent[d]);
    if (hi <= lo)
      return FALSE;
    out->offset[d] = lo;
    out->extent[d] = hi - lo;
  }
  return TRUE;
}

/* Appends the pieces of @u outside @cut (which intersects it) to @out. */
static void
box_subtract(const WsyncBox *u, const WsyncBox *cut, GArray *out)
{
  WsyncBox rest = *u;

  for (guint d = 0; d < u->ndim; d++) {
    guint64 lo = MAX(rest.offset[d], cut->offset[d]);
    guint64 hi = MIN(rest.offset[d] + rest.extent[d], cut->offset[d] + cut->extent[d]);
    if (rest.offset[d] < lo) {
      WsyncBox below = rest;
      below.extent[d] = lo - rest.offset[d];
      g_array_append_val(out, below);
    }
    if (hi < rest.offset[d] + rest.extent[d]) {
      WsyncBox above = rest;
      above.offset[d] = hi;
      above.extent[d] = rest.offset[d] + rest.extent[d] - hi;
      g_array_append_val(out, above);
    }
    rest.offset[d] = lo;
    rest.extent[d] = hi - lo;
  }
}

static guint64
region_element(const WsyncRegion *r, const WsyncBox *box, const WsyncBox *at)
{
  guint64 e = r->origin;

  for (guint d = 0; d < box->ndim; d++)
    e += (at->offset[d] - box->offset[d]) * r->stride[d];
  return e;
}

gboolean
wsync_tensor_box_of(guint ndim, const guint64 *shape, guint op_ndim, const guint64 *extent,
                    guint64 origin, const guint64 *stride, WsyncBox *out)
{
  guint64 rm[WSYNC_MAX_DIMS];
  gboolean used[WSYNC_MAX_DIMS] = {FALSE};
  guint64 s = 1;

  for (guint d = ndim; d > 0; d--) {
    rm[d - 1] = s;
    s *= shape[d - 1];
  }
  out->ndim = ndim;
  for (guint d = 0; d < ndim; d++) {
    out->offset[d] = shape[d] ? (origin / rm[d]) % shape[d] : 0;
    out->extent[d] = 1;
  }
  if (ndim > 0 && shape[0] && origin / rm[0] >= shape[0])
    return FALSE;
  for (guint k = 0; k < op_ndim; k++) {
    gboolean found = FALSE;
    if (extent[k] == 1)
      continue;
    for (guint d = 0; d < ndim && !found; d++)
      if (!used[d] && rm[d] == stride[k] && shape[d] > 1) {
        used[d] = found = TRUE;
        out->extent[d] = extent[k];
      }
    if (!found)
      return FALSE;
  }
  for (guint d = 0; d < ndim; d++)
    if (out->offset[d] + out->extent[d] > shape[d])
      return FALSE;
  return TRUE;
}

/* ------------------------------------------------------------------ plan object */

static void
layout_unref(gpointer data)
{
  wsync_layout_free(data);
}

void
wsync_plan_free(WsyncPlan *plan)
{
  if (plan == NULL)
    return;
  if (plan->outputs)
    g_ptr_array_unref(plan->outputs);
  if (plan->input_layouts)
    g_ptr_array_unref(plan->input_layouts);
  wsync_mapping_free(plan->mapping);
  wsync_checkpoint_free(plan->input);
  if (plan->chunk_tensors)
    g_ptr_array_unref(plan->chunk_tensors);
  wsync_dcp_free(plan->dcp);
  if (plan->inputs)
    g_array_unref(plan->inputs);
  if (plan->input_index)
    g_hash_table_unref(plan->input_index);
  if (plan->config)
    json_node_unref(plan->config);
  g_free(plan->src);
  g_free(plan->target);
  g_free(plan->input_target);
  g_free(plan->made_by_hf);
  g_free(plan);
}

guint64
wsync_plan_total_bytes(WsyncPlan *plan)
{
  guint64 total = 0;

  for (guint l = 0; l < plan->outputs->len; l++) {
    WsyncLayout *layout = plan->outputs->pdata[l];
    for (guint i = 0; i < layout->tensors->len; i++)
      total += ((WsyncLayoutTensor *)layout->tensors->pdata[i])->nbytes;
  }
  return total;
}

/* ------------------------------------------------------------------ step 1: describe */

/* config.json through the core's one loader (size limit, regular file, JSON depth and
 * duplicate-key checks); a missing file is named for what it is. */
static JsonNode *
load_config(const char *path, GError **error)
{
  struct stat st;

  if (stat(path, &st) != 0 && (errno == ENOENT || errno == ENOTDIR)) {
    g_autofree char *ppath = wsync_printable(path);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%s: missing (a checkpoint directory needs its config.json)", ppath);
    return NULL;
  }
  return wsync_config_json_load(path, error);
}

static char *
entry_label(const WsyncEntry *e)
{
  return g_strdup_printf("%s %s (plugin %s)", wsync_entry_kind_name(wsync_entry_get_kind(e)),
                         wsync_entry_get_name(e), wsync_entry_get_plugin(e));
}

static gboolean
describe_model(WsyncPlan *plan, const char *config_name, GError **error)
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
  plan->mapping = wsync_mapping_new(root, model_type);
  plan->mapping->remapper = entry_label(entry);
  if (!remap(plan->mapping, wsync_entry_get_user_data(entry), error)) {
    g_prefix_error(error, "%s: ", config_name);
    return FALSE;
  }
  if (plan->mapping->hf_build == NULL) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_PLUGIN, "%s set no Hugging Face layout builder",
                plan->mapping->remapper);
    return FALSE;
  }
  return TRUE;
}

/* ------------------------------------------------------------------ building layouts */

static gboolean
is_hf_target(const char *target)
{
  return strcmp(target, "hf") == 0 || strcmp(target, "hf-experts") == 0 ||
         strcmp(target, "hf-fused") == 0;
}

static gboolean
run_hooks(WsyncPlan *plan, WsyncLayout *layout, GError **error)
{
  g_autoptr(GPtrArray) hooks = wsync_registry_lookup(wsync_context_get_registry(plan->ctx),
                                                     WSYNC_ENTRY_HOOK, layout->target);

  if (hooks->len == 0 && layout->needs_hook != NULL) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                "target %s: %s, and no loaded plugin has a hook for it (see wsync plugins)",
                layout->target, layout->needs_hook);
    return FALSE;
  }

  for (guint i = 0; i < hooks->len; i++) {
    const WsyncEntry *e = hooks->pdata[i];
    g_autofree char *label = entry_label(e);
    layout->current_entry = label;
    gboolean ok = ((WsyncHookFunc)wsync_entry_get_callback(e))(layout, wsync_entry_get_user_data(e),
                                                               error);
    layout->current_entry = NULL;
    if (!ok) {
      g_prefix_error(error, "%s: ", label);
      return FALSE;
    }
  }
  return TRUE;
}

/* Builds one rank's layout of @target with the model's HF builder or the target's
 * converter, then the target's hooks. */
static WsyncLayout *
build_layout(WsyncPlan *plan, const char *target, guint tp, guint ep, guint rank,
             gboolean reading, GHashTable *input_names, GHashTable *input_metadata,
             GError **error)
{
  g_autoptr(WsyncLayout) layout =
      wsync_layout_new(plan->mapping, plan->ctx, target, tp, ep, rank, reading);
  g_autofree char *label = NULL;
  gboolean ok;

  if (input_names)
    layout->input_names = g_hash_table_ref(input_names);
  if (input_metadata)
    layout->input_metadata = g_hash_table_ref(input_metadata);
  if (is_hf_target(target)) {
    label = g_strdup_printf("hf layout of %s", plan->mapping->remapper);
    layout->current_entry = label;
    ok = plan->mapping->hf_build(layout, plan->mapping->hf_data, error);
  } else {
    g_autoptr(GPtrArray) converters = wsync_registry_lookup(
        wsync_context_get_registry(plan->ctx), WSYNC_ENTRY_CONVERTER, target);
    if (converters->len == 0) {
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                  "no loaded plugin provides the target \"%s\" (targets: hf, hf-experts, "
                  "hf-fused, and those of the converters wsync plugins lists)",
                  target);
      return NULL;
    }
    const WsyncEntry *e = converters->pdata[0];
    label = entry_label(e);
    layout->current_entry = label;
    ok = ((WsyncConvertFunc)wsync_entry_get_callback(e))(layout, wsync_entry_get_user_data(e),
                                                         error);
  }
  layout->current_entry = NULL;
  if (!ok)
    return NULL;
  if (!run_hooks(plan, layout, error))
    return NULL;
  return g_steal_pointer(&layout);
}

/* ------------------------------------------------------------------ step 2: bind inputs */

static guint
input_index(WsyncPlan *plan, const WsyncTensor *t)
{
  return GPOINTER_TO_UINT(g_hash_table_lookup(plan->input_index, t)) - 1;
}

static gboolean
parse_uint(const char *text, guint min, guint *value)
{
  guint64 v;

  if (text == NULL || !g_ascii_string_to_unsigned(text, 10, min, G_MAXUINT16, &v, NULL))
    return FALSE;
  *value = (guint)v;
  return TRUE;
}

/* Rank files written by wsync carry their layout in __metadata__ ("wsync.target" and
 * friends): then the input is read with that target's own layout, rank by rank. */
static gboolean
detect_input_layout(WsyncPlan *plan, GError **error)
{
  const WsyncSafetensors *first = wsync_checkpoint_file(plan->input, 0);
  GHashTable *md = wsync_safetensors_metadata(first);
  const char *target = g_hash_table_lookup(md, "wsync.target");

  if (target == NULL || is_hf_target(target)) {
    plan->input_target = g_strdup("hf");
    plan->in_tp = plan->in_ep = plan->in_world = 1;
    return TRUE;
  }
  plan->input_target = g_strdup(target);
  if (!parse_uint(g_hash_table_lookup(md, "wsync.tp"), 1, &plan->in_tp) ||
      !parse_uint(g_hash_table_lookup(md, "wsync.ep"), 1, &plan->in_ep) ||
      !parse_uint(g_hash_table_lookup(md, "wsync.world"), 1, &plan->in_world)) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%s: wsync.tp, wsync.ep and wsync.world metadata must be numbers",
                wsync_safetensors_path(first));
    return FALSE;
  }
  return TRUE;
}

/* The input tensors and first file's metadata of one rank (every file when there are
 * no ranks). */
static gboolean
rank_inputs(WsyncPlan *plan, guint rank, GHashTable **names, GHashTable **metadata,
            GError **error)
{
  gboolean ranked = plan->in_world > 1 || strcmp(plan->input_target, "hf") != 0;

  *names = g_hash_table_new(g_str_hash, g_str_equal);
  *metadata = NULL;
  for (guint f = 0; f < wsync_checkpoint_n_files(plan->input); f++) {
    const WsyncSafetensors *st = wsync_checkpoint_file(plan->input, f);
    GHashTable *md = wsync_safetensors_metadata(st);
    guint file_rank = 0;
    if (ranked && !parse_uint(g_hash_table_lookup(md, "wsync.rank"), 0, &file_rank)) {
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                  "%s: a %s rank file without a wsync.rank number in its metadata",
                  wsync_safetensors_path(st), plan->input_target);
      return FALSE;
    }
    if (file_rank != rank)
      continue;
    if (*metadata == NULL)
      *metadata = g_hash_table_ref(md);
    for (guint i = 0; i < wsync_safetensors_n_tensors(st); i++) {
      const WsyncTensor *t = wsync_safetensors_tensor(st, i);
      g_hash_table_insert(*names, (gpointer)t->name, (gpointer)t);
    }
  }
  if (*metadata == NULL) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%s: rank %u of the %u %s ranks has no file", plan->src, rank, plan->in_world,
                plan->input_target);
    return FALSE;
  }
  return TRUE;
}

/* The dtype of a logical tensor is the dtype its input holds it in. */
static gboolean
adopt_dtype(WsyncVTensor *vt, const WsyncTensor *t, GError **error)
{
  if (!vt->dtype_from_input) {
    vt->dtype = t->dtype;
    vt->dtype_from_input = TRUE;
    return TRUE;
  }
  if (vt->dtype != t->dtype) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%s: tensor \"%s\" is %s but other parts of %s are %s", t->file, t->name,
                wsync_dtype_name(t->dtype), vt->name, wsync_dtype_name(vt->dtype));
    return FALSE;
  }
  return TRUE;
}

static gboolean
bind_tensor(WsyncPlan *plan, WsyncLayoutTensor *lt, const WsyncTensor *t, GError **error)
{
  InputState *state = &g_array_index(plan->inputs, InputState, input_index(plan, t));
  gboolean same = lt->ndim == t->ndim;

  for (guint d = 0; same && d < t->ndim; d++)
    same = lt->shape[d] == t->shape[d];
  if (!same) {
    g_autofree char *have = format_dims(t->ndim, t->shape);
    g_autofree char *want = format_dims(lt->ndim, lt->shape);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%s: tensor \"%s\" has shape %s but the config says %s (%s)", t->file, t->name,
                have, want, lt->made_by ? lt->made_by : "layout");
    return FALSE;
  }
  state->bound = TRUE;
  state->runtime_only = lt->placements->len == 0;
  for (guint p = 0; p < lt->placements->len; p++) {
    Placement *pl = &g_array_index(lt->placements, Placement, p);
    Source s = {.kind = SOURCE_INPUT, .box = pl->box, .region = pl->region, .input = t,
                .input_index = input_index(plan, t)};
    if (!adopt_dtype(pl->vt, t, error))
      return FALSE;
    g_array_append_val(pl->vt->sources, s);
    g_ptr_array_add(state->vtensors, pl->vt);
  }
  return TRUE;
}

static gboolean
bind_layout(WsyncPlan *plan, WsyncLayout *layout, GHashTable *names, GPtrArray *missing,
            GError **error)
{
  for (guint i = 0; i < layout->tensors->len; i++) {
    WsyncLayoutTensor *lt = layout->tensors->pdata[i];
    const WsyncTensor *t = g_hash_table_lookup(names, lt->name);
    if (t == NULL) {
      g_ptr_array_add(missing, g_strdup(lt->name));
      continue;
    }
    if (!bind_tensor(plan, lt, t, error))
      return FALSE;
  }
  return TRUE;
}

static const char *
drop_rule_for(WsyncPlan *plan, const char *name)
{
  for (guint r = 0; r < plan->mapping->drop_rules->len; r++) {
    DropRule *rule = &g_array_index(plan->mapping->drop_rules, DropRule, r);
    if (g_pattern_match_simple(rule->glob, name))
      return rule->rule;
  }
  return NULL;
}

static void
input_state_clear(gpointer data)
{
  InputState *s = data;
  g_ptr_array_unref(s->vtensors);
}

/* After binding: every tensor the input layout names must exist, and every input tensor
 * no layout tensor names must be consumed by a drop rule (a name counted once, however
 * many chunks or ranks hold it). */
static gboolean
check_bound(WsyncPlan *plan, GPtrArray *missing, GError **error)
{
  g_autoptr(GPtrArray) unmapped = g_ptr_array_new();
  g_autoptr(GHashTable) seen = g_hash_table_new(g_str_hash, g_str_equal);

  if (missing->len > 0) {
    g_autofree char *list = format_list(missing);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%s: %u tensor%s the %s layout needs %s missing: %s", plan->src, missing->len,
                missing->len == 1 ? "" : "s", plan->input_target,
                missing->len == 1 ? "is" : "are", list);
    return FALSE;
  }
  for (guint i = 0; i < plan->inputs->len; i++) {
    InputState *s = &g_array_index(plan->inputs, InputState, i);
    if (s->bound)
      continue;
    s->drop_rule = drop_rule_for(plan, s->tensor->name);
    if (s->drop_rule == NULL && g_hash_table_add(seen, (gpointer)s->tensor->name))
      g_ptr_array_add(unmapped, (gpointer)s->tensor->name);
  }
  if (unmapped->len > 0) {
    g_autofree char *list = format_list(unmapped);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%s: %u input tensor%s no rule of %s maps: %s", plan->src, unmapped->len,
                unmapped->len == 1 ? "" : "s", plan->mapping->remapper, list);
    return FALSE;
  }
  return TRUE;
}

static gboolean
bind_inputs(WsyncPlan *plan, GError **error)
{
  g_autoptr(GPtrArray) missing = g_ptr_array_new_with_free_func(g_free);

  plan->inputs = g_array_new(FALSE, TRUE, sizeof(InputState));
  g_array_set_clear_func(plan->inputs, input_state_clear);
  plan->input_index = g_hash_table_new(g_direct_hash, g_direct_equal);
  for (guint i = 0; i < wsync_checkpoint_n_tensors(plan->input); i++) {
    InputState s = {.tensor = wsync_checkpoint_tensor(plan->input, i),
                    .vtensors = g_ptr_array_new()};
    g_array_append_val(plan->inputs, s);
    g_hash_table_insert(plan->input_index, (gpointer)s.tensor, GUINT_TO_POINTER(i + 1));
  }
  if (!detect_input_layout(plan, error))
    return FALSE;
  plan->input_layouts = g_ptr_array_new_with_free_func(layout_unref);
  for (guint r = 0; r < plan->in_world; r++) {
    g_autoptr(GHashTable) names = NULL;
    g_autoptr(GHashTable) md = NULL;
    if (!rank_inputs(plan, r, &names, &md, error))
      return FALSE;
    WsyncLayout *layout = build_layout(plan, plan->input_target, plan->in_tp, plan->in_ep, r,
                                       TRUE, names, md, error);
    if (layout == NULL)
      return FALSE;
    g_ptr_array_add(plan->input_layouts, layout);
    if (!bind_layout(plan, layout, names, missing, error))
      return FALSE;
  }
  return check_bound(plan, missing, error);
}

/* synth: every logical tensor has one generated source covering all of it. */
static void
bind_generated(WsyncPlan *plan)
{
  plan->inputs = g_array_new(FALSE, TRUE, sizeof(InputState));
  for (guint i = 0; i < plan->mapping->vtensors->len; i++) {
    WsyncVTensor *vt = plan->mapping->vtensors->pdata[i];
    Source s = {.kind = SOURCE_GENERATED};
    wsync_box_whole(&s.box, vt->ndim, vt->shape);
    wsync_region_row_major(&s.region, vt->ndim, vt->shape, NULL);
    g_array_append_val(vt->sources, s);
  }
}


/* ------------------------------------------------------------------ sharded sources (DCP) */

/* The box of @lt a placement fills, and which of the tensor's axes each box axis walks
 * (-1 for box axes of extent 1). */
static gboolean
placement_axes(const WsyncLayoutTensor *lt, const Placement *pl, WsyncBox *tb, gint *axis_of)
{
  guint64 rm[WSYNC_MAX_DIMS], s = 1;
  gboolean used[WSYNC_MAX_DIMS] = {FALSE};

  for (guint d = lt->ndim; d > 0; d--) {
    rm[d - 1] = s;
    s *= lt->shape[d - 1];
  }
  tb->ndim = lt->ndim;
  for (guint d = 0; d < lt->ndim; d++) {
    tb->offset[d] = lt->shape[d] ? (pl->region.origin / rm[d]) % lt->shape[d] : 0;
    tb->extent[d] = 1;
  }
  for (guint k = 0; k < pl->box.ndim; k++) {
    axis_of[k] = -1;
    if (pl->box.extent[k] == 1)
      continue;
    for (guint d = 0; d < lt->ndim && axis_of[k] < 0; d++)
      if (!used[d] && rm[d] == pl->region.stride[k] && lt->shape[d] > 1) {
        used[d] = TRUE;
        axis_of[k] = (gint)d;
        tb->extent[d] = pl->box.extent[k];
      }
    if (axis_of[k] < 0)
      return FALSE;
  }
  return TRUE;
}

/* One WsyncTensor per chunk, so that the planner reads chunks like any input tensor. */
static void
collect_chunks(WsyncPlan *plan)
{
  plan->chunk_tensors = g_ptr_array_new_with_free_func(g_free);
  plan->inputs = g_array_new(FALSE, TRUE, sizeof(InputState));
  g_array_set_clear_func(plan->inputs, input_state_clear);
  plan->input_index = g_hash_table_new(g_direct_hash, g_direct_equal);
  for (guint i = 0; i < wsync_dcp_n_tensors(plan->dcp); i++) {
    const WsyncDcpTensor *g = wsync_dcp_tensor(plan->dcp, i);
    for (guint c = 0; c < g->chunks->len; c++) {
      const WsyncDcpChunk *chunk = &g_array_index(g->chunks, WsyncDcpChunk, c);
      WsyncTensor *t = g_new0(WsyncTensor, 1);
      t->name = g->name;
      t->dtype = g->dtype;
      t->ndim = g->ndim;
      memcpy(t->shape, chunk->box.extent, sizeof t->shape);
      t->numel = wsync_box_volume(&chunk->box);
      wsync_dtype_nbytes(t->dtype, t->numel, &t->nbytes);
      t->data = chunk->data;
      t->file = chunk->file;
      g_ptr_array_add(plan->chunk_tensors, t);
      InputState st = {.tensor = t, .vtensors = g_ptr_array_new()};
      g_array_append_val(plan->inputs, st);
      g_hash_table_insert(plan->input_index, t, GUINT_TO_POINTER(plan->inputs->len));
    }
  }
}

/* Binds a layout tensor to the chunks of the global tensor of the same name: each
 * placement is cut by each chunk's box. */
static gboolean
bind_tensor_chunks(WsyncPlan *plan, WsyncLayoutTensor *lt, const WsyncDcpTensor *g,
                   guint first_input, GError **error)
{
  gboolean same = lt->ndim == g->ndim;

  for (guint d = 0; same && d < g->ndim; d++)
    same = lt->shape[d] == g->shape[d];
  if (!same) {
    g_autofree char *have = format_dims(g->ndim, g->shape);
    g_autofree char *want = format_dims(lt->ndim, lt->shape);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%s: tensor \"%s\" has shape %s but the config says %s (%s)", plan->src, g->name,
                have, want, lt->made_by ? lt->made_by : "layout");
    return FALSE;
  }
  for (guint c = 0; c < g->chunks->len; c++) {
    const WsyncDcpChunk *chunk = &g_array_index(g->chunks, WsyncDcpChunk, c);
    InputState *state = &g_array_index(plan->inputs, InputState, first_input + c);
    state->bound = TRUE;
    state->runtime_only = lt->placements->len == 0;
    for (guint p = 0; p < lt->placements->len; p++) {
      const Placement *pl = &g_array_index(lt->placements, Placement, p);
      WsyncBox tb, ib;
      gint axis_of[WSYNC_MAX_DIMS];
      if (!placement_axes(lt, pl, &tb, axis_of)) {
        g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_PLUGIN,
                    "%s: a placement into tensor \"%s\" is not a box inside it", lt->made_by,
                    lt->name);
        return FALSE;
      }
      if (!boxes_intersect(&tb, &chunk->box, &ib) || wsync_box_volume(&ib) == 0)
        continue;
      Source src = {.kind = SOURCE_INPUT, .box = pl->box, .input = state->tensor,
                    .input_index = first_input + c};
      for (guint d = 0; d < g->ndim; d++)
        src.region.origin += (ib.offset[d] - chunk->box.offset[d]) * chunk->region.stride[d];
      for (guint k = 0; k < pl->box.ndim; k++) {
        gint d = axis_of[k];
        src.region.stride[k] = d >= 0 ? chunk->region.stride[d] : 0;
        if (d >= 0) {
          src.box.offset[k] = pl->box.offset[k] + ib.offset[d] - tb.offset[d];
          src.box.extent[k] = ib.extent[d];
        }
      }
      if (!adopt_dtype(pl->vt, state->tensor, error))
        return FALSE;
      g_array_append_val(pl->vt->sources, src);
      g_ptr_array_add(state->vtensors, pl->vt);
    }
  }
  return TRUE;
}

/* A sharded checkpoint holds the Hugging Face names of the model: its global tensors
 * are read through the model's HF layout, chunk by chunk. */
static gboolean
bind_dcp(WsyncPlan *plan, GError **error)
{
  g_autoptr(GHashTable) names = g_hash_table_new(g_str_hash, g_str_equal);
  g_autoptr(GPtrArray) missing = g_ptr_array_new_with_free_func(g_free);
  g_autoptr(GHashTable) first_input = g_hash_table_new(g_str_hash, g_str_equal);
  guint at = 0;

  collect_chunks(plan);
  for (guint i = 0; i < wsync_dcp_n_tensors(plan->dcp); i++) {
    const WsyncDcpTensor *g = wsync_dcp_tensor(plan->dcp, i);
    g_hash_table_insert(names, g->name, (gpointer)g);
    g_hash_table_insert(first_input, g->name, GUINT_TO_POINTER(at));
    at += g->chunks->len;
  }
  plan->input_target = g_strdup("hf");
  plan->in_tp = plan->in_ep = plan->in_world = 1;
  plan->input_layouts = g_ptr_array_new_with_free_func(layout_unref);
  WsyncLayout *layout = build_layout(plan, "hf", 1, 1, 0, TRUE, names, NULL, error);
  if (layout == NULL)
    return FALSE;
  g_ptr_array_add(plan->input_layouts, layout);
  for (guint i = 0; i < layout->tensors->len; i++) {
    WsyncLayoutTensor *lt = layout->tensors->pdata[i];
    const WsyncDcpTensor *g = g_hash_table_lookup(names, lt->name);
    if (g == NULL) {
      g_ptr_array_add(missing, g_strdup(lt->name));
      continue;
    }
    if (!bind_tensor_chunks(plan, lt, g,
                            GPOINTER_TO_UINT(g_hash_table_lookup(first_input, lt->name)), error))
      return FALSE;
  }
  return check_bound(plan, missing, error);
}

/* merge: the model is the checkpoint's own tensors, each written whole under its name,
 * into the output file its shards name (-model-I-of-N). */
static gboolean
build_identity_hf(WsyncLayout *layout, gpointer user_data, GError **error)
{
  WsyncPlan *plan = user_data;

  for (guint i = 0; i < wsync_dcp_n_tensors(plan->dcp); i++) {
    const WsyncDcpTensor *g = wsync_dcp_tensor(plan->dcp, i);
    WsyncVTensor *vt = wsync_layout_lookup_vtensor(layout, g->name);
    WsyncLayoutTensor *lt = wsync_layout_add_tensor(layout, g->name, g->dtype, g->ndim,
                                                    g->shape, error);
    WsyncBox box;
    WsyncRegion region;
    if (lt == NULL)
      return FALSE;
    wsync_box_whole(&box, g->ndim, g->shape);
    wsync_region_row_major(&region, g->ndim, g->shape, NULL);
    wsync_layout_place(layout, lt, vt, &box, &region);
    lt->part_hint = g->part;
    lt->n_parts_hint = g->n_parts;
  }
  return TRUE;
}

static void
describe_identity(WsyncPlan *plan)
{
  JsonObject *root = json_node_get_object(plan->config);

  plan->mapping = wsync_mapping_new(root, "(sharded checkpoint)");
  plan->mapping->remapper = g_strdup("merge (core)");
  for (guint i = 0; i < wsync_dcp_n_tensors(plan->dcp); i++) {
    const WsyncDcpTensor *g = wsync_dcp_tensor(plan->dcp, i);
    wsync_mapping_add_vtensor(plan->mapping, g->name, g->dtype, g->ndim, g->shape);
  }
  wsync_mapping_set_hf_layout(plan->mapping, build_identity_hf, plan);
}

/* ------------------------------------------------------------------ step 4: resolve */

static gboolean
cast_is_supported(WsyncDtype from, WsyncDtype to)
{
  if (from == to)
    return TRUE;
  return (from == WSYNC_DTYPE_BF16 || from == WSYNC_DTYPE_F16 || from == WSYNC_DTYPE_F32) &&
         (to == WSYNC_DTYPE_BF16 || to == WSYNC_DTYPE_F16 || to == WSYNC_DTYPE_F32);
}

static gboolean
resolve_placement(WsyncPlan *plan, WsyncLayout *layout, WsyncLayoutTensor *lt,
                  const Placement *pl, GError **error)
{
  g_autoptr(GArray) uncovered = g_array_new(FALSE, FALSE, sizeof(WsyncBox));
  WsyncVTensor *vt = pl->vt;

  (void)plan;
  if (!cast_is_supported(vt->dtype, lt->dtype)) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "tensor \"%s\" of rank %u: %s holds %s, which cannot be converted to %s",
                lt->name, layout->rank, vt->name, wsync_dtype_name(vt->dtype),
                wsync_dtype_name(lt->dtype));
    return FALSE;
  }
  g_array_append_val(uncovered, pl->box);
  for (guint s = 0; s < vt->sources->len && uncovered->len > 0; s++) {
    const Source *src = &g_array_index(vt->sources, Source, s);
    g_autoptr(GArray) left = g_array_new(FALSE, FALSE, sizeof(WsyncBox));
    for (guint u = 0; u < uncovered->len; u++) {
      const WsyncBox *ub = &g_array_index(uncovered, WsyncBox, u);
      WsyncBox inter;
      if (!boxes_intersect(ub, &src->box, &inter)) {
        g_array_append_val(left, *ub);
        continue;
      }
      Op op = {.kind = OP_COPY, .ndim = inter.ndim, .source = src, .src_dtype = vt->dtype,
               .vt = vt, .vbox = inter};
      memcpy(op.extent, inter.extent, sizeof op.extent);
      op.dst_origin = region_element(&pl->region, &pl->box, &inter);
      memcpy(op.dst_stride, pl->region.stride, sizeof op.dst_stride);
      op.src_origin = region_element(&src->region, &src->box, &inter);
      memcpy(op.src_stride, src->region.stride, sizeof op.src_stride);
      g_array_append_val(lt->ops, op);
      box_subtract(ub, &inter, left);
    }
    g_array_set_size(uncovered, 0);
    g_array_append_vals(uncovered, left->data, left->len);
  }
  if (uncovered->len > 0) {
    g_autofree char *box = format_box(&g_array_index(uncovered, WsyncBox, 0));
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%s: no input holds %s%s of %s, needed for tensor \"%s\" of rank %u", plan->src,
                box, uncovered->len > 1 ? " (and more)" : "", vt->name, lt->name, layout->rank);
    return FALSE;
  }
  vt->used = TRUE;
  return TRUE;
}

static guint64
tensor_numel(const WsyncLayoutTensor *lt)
{
  guint64 n = 1;

  for (guint d = 0; d < lt->ndim; d++)
    n *= lt->shape[d];
  return n;
}

/* Every element of @lt is produced by exactly one op. */
static gboolean
prove_coverage(WsyncLayout *layout, WsyncLayoutTensor *lt, GError **error)
{
  g_autoptr(GArray) boxes = g_array_sized_new(FALSE, FALSE, sizeof(WsyncBox), lt->ops->len);
  guint64 total = 0;

  for (guint i = 0; i < lt->ops->len; i++) {
    Op *op = &g_array_index(lt->ops, Op, i);
    WsyncBox b;
    if (op->kind == OP_FILL)
      b = op->fill->box;
    else if (!wsync_tensor_box_of(lt->ndim, lt->shape, op->ndim, op->extent, op->dst_origin,
                                  op->dst_stride, &b)) {
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_PLUGIN,
                  "%s: a placement into tensor \"%s\" of rank %u is not a box inside it",
                  lt->made_by, lt->name, layout->rank);
      return FALSE;
    }
    for (guint d = 0; d < b.ndim; d++)
      if (b.offset[d] + b.extent[d] > lt->shape[d]) {
        g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_PLUGIN,
                    "%s: a fill of tensor \"%s\" of rank %u lies outside it", lt->made_by,
                    lt->name, layout->rank);
        return FALSE;
      }
    for (guint j = 0; j < boxes->len; j++) {
      WsyncBox inter;
      if (boxes_intersect(&b, &g_array_index(boxes, WsyncBox, j), &inter) &&
          wsync_box_volume(&inter) > 0) {
        g_autofree char *where = format_box(&inter);
        g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_PLUGIN,
                    "%s: elements %s of tensor \"%s\" of rank %u are written twice",
                    lt->made_by, where, lt->name, layout->rank);
        return FALSE;
      }
    }
    total += wsync_box_volume(&b);
    g_array_append_val(boxes, b);
  }
  if (total != tensor_numel(lt)) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_PLUGIN,
                "%s: %" G_GUINT64_FORMAT " of the %" G_GUINT64_FORMAT
                " elements of tensor \"%s\" of rank %u are written by no placement or fill",
                lt->made_by, tensor_numel(lt) - total, tensor_numel(lt), lt->name, layout->rank);
    return FALSE;
  }
  return TRUE;
}

/* The rule by which the source's own layout left @vt out (rank files of a backend that
 * does not hold it, e.g. vLLM and the MTP block), or NULL. */
static const char *
dropped_by_source(WsyncPlan *plan, const WsyncVTensor *vt)
{
  for (guint l = 0; plan->input_layouts != NULL && l < plan->input_layouts->len; l++) {
    WsyncLayout *in = plan->input_layouts->pdata[l];
    for (guint d = 0; d < in->dropped->len; d++) {
      DroppedParam *dp = &g_array_index(in->dropped, DroppedParam, d);
      for (guint p = 0; p < dp->param->n_parts; p++)
        if (dp->param->parts[p].vt == vt)
          return dp->rule;
    }
  }
  return NULL;
}

/* An output tensor whose logical tensor the source never held (it was dropped by a rule
 * when the source was written) cannot be produced: it is left out, by that rule, and
 * the plan says so.  Anything else without a source stays an error. */
static const char *
omitted_rule(WsyncPlan *plan, const WsyncLayoutTensor *lt)
{
  for (guint p = 0; p < lt->placements->len; p++) {
    const WsyncVTensor *vt = g_array_index(lt->placements, Placement, p).vt;
    if (vt->sources->len == 0)
      return dropped_by_source(plan, vt);
  }
  return NULL;
}

static gboolean
resolve_layout(WsyncPlan *plan, WsyncLayout *layout, GError **error)
{
  for (guint i = 0; i < layout->tensors->len;) {
    WsyncLayoutTensor *lt = layout->tensors->pdata[i];
    const char *rule = omitted_rule(plan, lt);
    if (rule != NULL) {
      DroppedParam omitted = {NULL, g_strdup_printf("%s (not in the source: %s)", lt->name, rule)};
      g_array_append_val(layout->omitted, omitted);
      g_hash_table_remove(layout->by_name, lt->name);
      g_ptr_array_remove_index(layout->tensors, i);
      continue;
    }
    i++;
    lt->ops = g_array_new(FALSE, TRUE, sizeof(Op));
    if (!wsync_dtype_nbytes(lt->dtype, tensor_numel(lt), &lt->nbytes)) {
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_PLUGIN, "tensor \"%s\": size overflows",
                  lt->name);
      return FALSE;
    }
    for (guint p = 0; p < lt->placements->len; p++)
      if (!resolve_placement(plan, layout, lt,
                             &g_array_index(lt->placements, Placement, p), error))
        return FALSE;
    for (guint f = 0; f < lt->fills->len; f++) {
      Op op = {.kind = OP_FILL, .fill = &g_array_index(lt->fills, Fill, f)};
      g_array_append_val(lt->ops, op);
    }
    if (!prove_coverage(layout, lt, error))
      return FALSE;
  }
  return TRUE;
}

/* Parts: the files the source asks for (a sharded checkpoint's -model-I-of-N), else a
 * new part before a tensor that would pass the size limit. */
static void
assign_parts(WsyncLayout *layout, guint64 part_size)
{
  guint part = 0;
  guint64 in_part = 0;
  gboolean hinted = layout->tensors->len > 0;

  for (guint i = 0; i < layout->tensors->len; i++)
    hinted = hinted && ((WsyncLayoutTensor *)layout->tensors->pdata[i])->part_hint > 0;
  if (hinted) {
    for (guint i = 0; i < layout->tensors->len; i++) {
      WsyncLayoutTensor *lt = layout->tensors->pdata[i];
      lt->part = lt->part_hint - 1;
    }
    return;
  }

  for (guint i = 0; i < layout->tensors->len; i++) {
    WsyncLayoutTensor *lt = layout->tensors->pdata[i];
    if (in_part > 0 && in_part + lt->nbytes > part_size) {
      part++;
      in_part = 0;
    }
    lt->part = part;
    in_part += lt->nbytes;
  }
}

/* ------------------------------------------------------------------ step 5: inputs used */

static gboolean
vtensor_dropped(WsyncPlan *plan, const WsyncVTensor *vt, const char **rule)
{
  for (guint l = 0; l < plan->outputs->len; l++) {
    WsyncLayout *layout = plan->outputs->pdata[l];
    for (guint d = 0; d < layout->dropped->len; d++) {
      DroppedParam *dp = &g_array_index(layout->dropped, DroppedParam, d);
      for (guint p = 0; p < dp->param->n_parts; p++)
        if (dp->param->parts[p].vt == vt) {
          *rule = dp->rule;
          return TRUE;
        }
    }
  }
  return FALSE;
}

/* An input tensor is used when every logical tensor it holds part of is read by some
 * output (replicas of the same bytes in several rank files count as used), or dropped
 * by a named rule of the target. */
static gboolean
check_inputs_used(WsyncPlan *plan, GError **error)
{
  g_autoptr(GPtrArray) unused = g_ptr_array_new();

  for (guint i = 0; i < plan->inputs->len; i++) {
    InputState *s = &g_array_index(plan->inputs, InputState, i);
    if (!s->bound || s->runtime_only)
      continue;
    for (guint v = 0; v < s->vtensors->len; v++) {
      const WsyncVTensor *vt = s->vtensors->pdata[v];
      const char *rule = NULL;
      if (vt->used)
        continue;
      if (vtensor_dropped(plan, vt, &rule)) {
        s->drop_rule = rule;
        continue;
      }
      g_ptr_array_add(unused, (gpointer)s->tensor->name);
      break;
    }
  }
  if (unused->len > 0) {
    g_autofree char *list = format_list(unused);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_PLUGIN,
                "%u input tensor%s would be lost: the %s layout neither holds nor drops %s: %s",
                unused->len, unused->len == 1 ? "" : "s", plan->target,
                unused->len == 1 ? "it" : "them", list);
    return FALSE;
  }
  return TRUE;
}

/* ------------------------------------------------------------------ public */

static gboolean
build_outputs(WsyncPlan *plan, const WsyncPlanOptions *opts, GError **error)
{
  gboolean hf = is_hf_target(plan->target);
  guint tp = hf ? 1 : MAX(opts->tp, 1), ep = hf ? 1 : MAX(opts->ep, 1);
  guint world = ep > 1 ? ep : tp;

  if (opts->rank >= 0 && (guint)opts->rank >= world) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                "--rank %d is not a rank of a %u-rank layout (tp %u, ep %u)", opts->rank, world,
                tp, ep);
    return FALSE;
  }
  plan->out_tp = tp;
  plan->out_ep = ep;
  plan->out_world = world;
  plan->outputs = g_ptr_array_new_with_free_func(layout_unref);
  for (guint r = 0; r < world; r++) {
    if (opts->rank >= 0 && (guint)opts->rank != r)
      continue;
    WsyncLayout *layout = build_layout(plan, plan->target, tp, ep, r, FALSE, NULL, NULL, error);
    if (layout == NULL)
      return FALSE;
    g_ptr_array_add(plan->outputs, layout);
    if (!resolve_layout(plan, layout, error))
      return FALSE;
    assign_parts(layout, opts->part_size ? opts->part_size : G_MAXUINT64);
  }
  return TRUE;
}

/* A sharded training checkpoint: consolidated on the fly, through the model's layout
 * (convert, plan) or as it is (merge).  Its config.json is optional for merge. */
static WsyncPlan *
plan_sharded(WsyncPlan *plan_in, const WsyncPlanOptions *opts, GError **error)
{
  g_autoptr(WsyncPlan) plan = plan_in;
  g_autofree char *config_path = g_build_filename(plan->src, "config.json", NULL);

  plan->merge = opts->merge;
  plan->dcp = wsync_dcp_open(plan->src, error);
  if (plan->dcp == NULL || !wsync_dcp_check_coverage(plan->dcp, error))
    return NULL;
  if (opts->merge && !g_file_test(config_path, G_FILE_TEST_EXISTS)) {
    g_autoptr(JsonObject) empty = json_object_new();
    plan->config = json_node_init_object(json_node_alloc(), empty);
    plan->no_config = TRUE;
  }
  else if ((plan->config = load_config(config_path, error)) == NULL)
    return NULL;
  if (opts->merge)
    describe_identity(plan);
  else if (!describe_model(plan, config_path, error))
    return NULL;
  if (!bind_dcp(plan, error) || !build_outputs(plan, opts, error) ||
      !check_inputs_used(plan, error))
    return NULL;
  return g_steal_pointer(&plan);
}

static WsyncPlan *plan_new(WsyncContext *ctx, const char *src, const WsyncPlanOptions *opts,
                           GError **error);

/* Every refusal of the planner leaves it as one printable line, whatever a plugin, a
 * config value or a file's metadata put into it. */
WsyncPlan *
wsync_plan_new(WsyncContext *ctx, const char *src, const WsyncPlanOptions *opts,
               GError **error)
{
  WsyncPlan *plan = plan_new(ctx, src, opts, error);

  if (plan == NULL && error != NULL)
    wsync_error_make_printable(*error);
  return plan;
}

static WsyncPlan *
plan_new(WsyncContext *ctx, const char *src, const WsyncPlanOptions *opts, GError **error)
{
  g_autoptr(WsyncPlan) plan = g_new0(WsyncPlan, 1);
  g_autofree char *config_path = NULL;

  plan->ctx = ctx;
  plan->src = g_strdup(src);
  plan->target = g_strdup(opts->target);
  plan->synth = opts->synth;
  plan->seed = opts->seed;
  plan->pattern_index = opts->pattern_index;
  plan->threads = opts->threads;
  if (opts->synth) {
    plan->config = json_node_copy(opts->synth_config);
    config_path = g_strdup(src);
  } else if (wsync_dcp_detect(src)) {
    return plan_sharded(g_steal_pointer(&plan), opts, error);
  } else if (opts->merge) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%s: not a sharded checkpoint (no shard-*-model-*-of-*.safetensors, here or in "
                "sharded/, and no .metadata)",
                src);
    return NULL;
  } else {
    plan->input = wsync_checkpoint_open(src, error);
    if (plan->input == NULL)
      return NULL;
    if (wsync_checkpoint_is_dir(plan->input))
      config_path = g_build_filename(src, "config.json", NULL);
    else {
      g_autofree char *dir = g_path_get_dirname(src);
      config_path = g_build_filename(dir, "config.json", NULL);
    }
    plan->config = load_config(config_path, error);
    if (plan->config == NULL)
      return NULL;
  }
  if (!describe_model(plan, config_path, error))
    return NULL;
  if (opts->synth)
    bind_generated(plan);
  else if (!bind_inputs(plan, error))
    return NULL;
  if (!build_outputs(plan, opts, error))
    return NULL;
  if (!opts->synth && !check_inputs_used(plan, error))
    return NULL;
  return g_steal_pointer(&plan);
}

/* ------------------------------------------------------------------ printing */

static char *
file_name_of(WsyncPlan *plan, const WsyncLayout *layout, guint part)
{
  if (is_hf_target(plan->target)) {
    guint n_parts = 1;
    for (guint i = 0; i < layout->tensors->len; i++) {
      const WsyncLayoutTensor *lt = layout->tensors->pdata[i];
      n_parts = MAX(n_parts, MAX(lt->part + 1, lt->n_parts_hint));
    }
    return g_strdup_printf("model-%05u-of-%05u.safetensors", part + 1, n_parts);
  }
  return g_strdup_printf("model-rank-%u-part-%u.safetensors", layout->rank, part);
}

char *
wsync_plan_file_name(WsyncPlan *plan, const WsyncLayout *layout, guint part)
{
  return file_name_of(plan, layout, part);
}

/* The input box an op reads, in the input tensor's own axes. */
static gboolean
op_input_box(const Op *op, WsyncBox *box)
{
  const WsyncTensor *t = op->source->input;
  return wsync_tensor_box_of(t->ndim, t->shape, op->ndim, op->extent, op->src_origin,
                             op->src_stride, box);
}

static gboolean
op_output_box(const WsyncLayoutTensor *lt, const Op *op, WsyncBox *box)
{
  if (op->kind == OP_FILL) {
    *box = op->fill->box;
    return TRUE;
  }
  return wsync_tensor_box_of(lt->ndim, lt->shape, op->ndim, op->extent, op->dst_origin,
                             op->dst_stride, box);
}

/* TRUE when the op walks its source and destination in a different axis order. */
static gboolean
op_is_permuted(const Op *op)
{
  guint64 last_src = G_MAXUINT64, last_dst = G_MAXUINT64;

  for (guint k = 0; k < op->ndim; k++) {
    if (op->extent[k] == 1)
      continue;
    gboolean src_desc = op->src_stride[k] <= last_src, dst_desc = op->dst_stride[k] <= last_dst;
    if (src_desc != dst_desc)
      return TRUE;
    last_src = op->src_stride[k];
    last_dst = op->dst_stride[k];
  }
  return FALSE;
}

static char *
describe_op_source(WsyncPlan *plan, const Op *op)
{
  WsyncBox in;

  if (op->source->kind == SOURCE_GENERATED) {
    g_autofree char *vbox = format_box(&op->vbox);
    return g_strdup_printf("generated %s%s (seed %" G_GUINT64_FORMAT ")", op->vt->name, vbox,
                           plan->seed);
  }
  g_autofree char *inbox = op_input_box(op, &in) ? format_box(&in) : g_strdup("[strided]");
  return g_strdup_printf("%s%s", op->source->input->name, inbox);
}

static void
print_tensor(WsyncPlan *plan, const WsyncLayoutTensor *lt, FILE *out)
{
  g_autofree char *shape = format_dims(lt->ndim, lt->shape);

  fprintf(out, "  %s  %s %s  %" G_GUINT64_FORMAT " bytes  by %s%s%s\n", lt->name,
          wsync_dtype_name(lt->dtype), shape, lt->nbytes, lt->made_by ? lt->made_by : "?",
          lt->state ? "  state " : "", lt->state ? lt->state : "");
  for (guint i = 0; i < lt->ops->len; i++) {
    const Op *op = &g_array_index(lt->ops, Op, i);
    WsyncBox ob;
    g_autofree char *obox = op_output_box(lt, op, &ob) ? format_box(&ob) : g_strdup("?");
    if (op->kind == OP_FILL) {
      fprintf(out, "    %s <- fill (%s)\n", obox, op->fill->reason);
      continue;
    }
    g_autofree char *from = describe_op_source(plan, op);
    fprintf(out, "    %s <- %s%s", obox, from, op_is_permuted(op) ? " transposed" : "");
    if (op->src_dtype != lt->dtype)
      fprintf(out, " cast %s->%s", wsync_dtype_name(op->src_dtype), wsync_dtype_name(lt->dtype));
    fputc('\n', out);
  }
}

void
wsync_plan_print(WsyncPlan *plan, FILE *out)
{
  fprintf(out, "source %s (%s layout), model %s described by %s\n", plan->src,
          plan->synth ? "generated" : plan->input_target, plan->mapping->model_type,
          plan->mapping->remapper);
  fprintf(out, "target %s, tp %u, ep %u, %u rank%s\n", plan->target, plan->out_tp, plan->out_ep,
          plan->out_world, plan->out_world == 1 ? "" : "s");
  for (guint l = 0; l < plan->outputs->len; l++) {
    WsyncLayout *layout = plan->outputs->pdata[l];
    guint last_part = G_MAXUINT;
    fprintf(out, "rank %u\n", layout->rank);
    for (guint i = 0; i < layout->tensors->len; i++) {
      const WsyncLayoutTensor *lt = layout->tensors->pdata[i];
      if (lt->part != last_part) {
        g_autofree char *file = file_name_of(plan, layout, lt->part);
        fprintf(out, " %s\n", file);
        last_part = lt->part;
      }
      print_tensor(plan, lt, out);
    }
    for (guint d = 0; d < layout->dropped->len; d++) {
      DroppedParam *dp = &g_array_index(layout->dropped, DroppedParam, d);
      fprintf(out, " dropped %s by rule %s\n", dp->param->name, dp->rule);
    }
    for (guint d = 0; d < layout->omitted->len; d++)
      fprintf(out, " omitted %s\n", g_array_index(layout->omitted, DroppedParam, d).rule);
  }
  for (guint i = 0; plan->inputs && i < plan->inputs->len; i++) {
    InputState *s = &g_array_index(plan->inputs, InputState, i);
    if (s->drop_rule != NULL)
      fprintf(out, "input %s dropped by rule %s\n", s->tensor->name, s->drop_rule);
  }
  for (guint p = 0; p < plan->mapping->params->len; p++) {
    const WsyncParam *param = plan->mapping->params->pdata[p];
    if (param->note != NULL)
      fprintf(out, "note: %s: %s\n", param->name, param->note);
  }
  fprintf(out, "%" G_GUINT64_FORMAT " bytes to write\n", wsync_plan_total_bytes(plan));
}

static void
add_box(JsonBuilder *b, const char *member, const WsyncBox *box)
{
  json_builder_set_member_name(b, member);
  json_builder_begin_object(b);
  json_builder_set_member_name(b, "offset");
  json_builder_begin_array(b);
  for (guint d = 0; d < box->ndim; d++)
    json_builder_add_int_value(b, (gint64)box->offset[d]);
  json_builder_end_array(b);
  json_builder_set_member_name(b, "extent");
  json_builder_begin_array(b);
  for (guint d = 0; d < box->ndim; d++)
    json_builder_add_int_value(b, (gint64)box->extent[d]);
  json_builder_end_array(b);
  json_builder_end_object(b);
}

static void
add_op_json(WsyncPlan *plan, JsonBuilder *b, const WsyncLayoutTensor *lt, const Op *op)
{
  WsyncBox box;

  (void)plan;
  json_builder_begin_object(b);
  json_builder_set_member_name(b, "op");
  json_builder_add_string_value(b, op->kind == OP_FILL ? "fill" : "copy");
  if (op_output_box(lt, op, &box))
    add_box(b, "to", &box);
  if (op->kind == OP_FILL) {
    json_builder_set_member_name(b, "reason");
    json_builder_add_string_value(b, op->fill->reason);
    g_autofree char *hex = g_malloc0(op->fill->value_len * 2 + 1);
    for (gsize i = 0; i < op->fill->value_len; i++)
      sprintf(hex + 2 * i, "%02x", op->fill->value[i]);
    json_builder_set_member_name(b, "value");
    json_builder_add_string_value(b, hex);
  } else {
    json_builder_set_member_name(b, "logical");
    json_builder_add_string_value(b, op->vt->name);
    add_box(b, "logical_box", &op->vbox);
    if (op->source->kind == SOURCE_INPUT) {
      json_builder_set_member_name(b, "from");
      json_builder_add_string_value(b, op->source->input->name);
      if (op_input_box(op, &box))
        add_box(b, "from_box", &box);
    } else {
      json_builder_set_member_name(b, "from");
      json_builder_add_string_value(b, "generated");
    }
    json_builder_set_member_name(b, "transposed");
    json_builder_add_boolean_value(b, op_is_permuted(op));
    json_builder_set_member_name(b, "cast");
    if (op->src_dtype != lt->dtype) {
      g_autofree char *cast = g_strdup_printf("%s->%s", wsync_dtype_name(op->src_dtype),
                                              wsync_dtype_name(lt->dtype));
      json_builder_add_string_value(b, cast);
    } else
      json_builder_add_null_value(b);
  }
  json_builder_end_object(b);
}

static void
add_tensor_json(WsyncPlan *plan, JsonBuilder *b, const WsyncLayout *layout,
                const WsyncLayoutTensor *lt)
{
  g_autofree char *file = file_name_of(plan, layout, lt->part);

  json_builder_begin_object(b);
  json_builder_set_member_name(b, "name");
  json_builder_add_string_value(b, lt->name);
  json_builder_set_member_name(b, "file");
  json_builder_add_string_value(b, file);
  json_builder_set_member_name(b, "dtype");
  json_builder_add_string_value(b, wsync_dtype_name(lt->dtype));
  json_builder_set_member_name(b, "shape");
  json_builder_begin_array(b);
  for (guint d = 0; d < lt->ndim; d++)
    json_builder_add_int_value(b, (gint64)lt->shape[d]);
  json_builder_end_array(b);
  json_builder_set_member_name(b, "bytes");
  json_builder_add_int_value(b, (gint64)lt->nbytes);
  json_builder_set_member_name(b, "made_by");
  json_builder_add_string_value(b, lt->made_by ? lt->made_by : "");
  json_builder_set_member_name(b, "layout_state");
  if (lt->state)
    json_builder_add_string_value(b, lt->state);
  else
    json_builder_add_null_value(b);
  json_builder_set_member_name(b, "ops");
  json_builder_begin_array(b);
  for (guint i = 0; i < lt->ops->len; i++)
    add_op_json(plan, b, lt, &g_array_index(lt->ops, Op, i));
  json_builder_end_array(b);
  json_builder_end_object(b);
}

JsonNode *
wsync_plan_to_json(WsyncPlan *plan)
{
  g_autoptr(JsonBuilder) b = json_builder_new();

  json_builder_begin_object(b);
  json_builder_set_member_name(b, "source");
  json_builder_add_string_value(b, plan->src);
  json_builder_set_member_name(b, "source_layout");
  json_builder_add_string_value(b, plan->synth ? "generated" : plan->input_target);
  json_builder_set_member_name(b, "model_type");
  json_builder_add_string_value(b, plan->mapping->model_type);
  json_builder_set_member_name(b, "remapper");
  json_builder_add_string_value(b, plan->mapping->remapper);
  json_builder_set_member_name(b, "target");
  json_builder_add_string_value(b, plan->target);
  json_builder_set_member_name(b, "tp");
  json_builder_add_int_value(b, plan->out_tp);
  json_builder_set_member_name(b, "ep");
  json_builder_add_int_value(b, plan->out_ep);
  json_builder_set_member_name(b, "world");
  json_builder_add_int_value(b, plan->out_world);
  json_builder_set_member_name(b, "ranks");
  json_builder_begin_array(b);
  for (guint l = 0; l < plan->outputs->len; l++) {
    WsyncLayout *layout = plan->outputs->pdata[l];
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "rank");
    json_builder_add_int_value(b, layout->rank);
    json_builder_set_member_name(b, "tensors");
    json_builder_begin_array(b);
    for (guint i = 0; i < layout->tensors->len; i++)
      add_tensor_json(plan, b, layout, layout->tensors->pdata[i]);
    json_builder_end_array(b);
    json_builder_set_member_name(b, "dropped");
    json_builder_begin_array(b);
    for (guint d = 0; d < layout->dropped->len; d++) {
      DroppedParam *dp = &g_array_index(layout->dropped, DroppedParam, d);
      json_builder_begin_object(b);
      json_builder_set_member_name(b, "param");
      json_builder_add_string_value(b, dp->param->name);
      json_builder_set_member_name(b, "rule");
      json_builder_add_string_value(b, dp->rule);
      json_builder_end_object(b);
    }
    json_builder_end_array(b);
    json_builder_set_member_name(b, "omitted");
    json_builder_begin_array(b);
    for (guint d = 0; d < layout->omitted->len; d++)
      json_builder_add_string_value(b, g_array_index(layout->omitted, DroppedParam, d).rule);
    json_builder_end_array(b);
    json_builder_end_object(b);
  }
  json_builder_end_array(b);
  json_builder_set_member_name(b, "dropped_inputs");
  json_builder_begin_array(b);
  for (guint i = 0; plan->inputs && i < plan->inputs->len; i++) {
    InputState *s = &g_array_index(plan->inputs, InputState, i);
    if (s->drop_rule == NULL)
      continue;
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "tensor");
    json_builder_add_string_value(b, s->tensor->name);
    json_builder_set_member_name(b, "rule");
    json_builder_add_string_value(b, s->drop_rule);
    json_builder_end_object(b);
  }
  json_builder_end_array(b);
  json_builder_set_member_name(b, "notes");
  json_builder_begin_array(b);
  for (guint p = 0; p < plan->mapping->params->len; p++) {
    const WsyncParam *param = plan->mapping->params->pdata[p];
    if (param->note == NULL)
      continue;
    g_autofree char *note = g_strdup_printf("%s: %s", param->name, param->note);
    json_builder_add_string_value(b, note);
  }
  json_builder_end_array(b);
  json_builder_set_member_name(b, "bytes");
  json_builder_add_int_value(b, (gint64)wsync_plan_total_bytes(plan));
  json_builder_end_object(b);
  return json_builder_get_root(b);
}
