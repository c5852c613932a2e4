/* wsync: the objects plugins describe a model and its layouts with (see engine.h). */
#include <string.h>

#include "engine-private.h"

/* ------------------------------------------------------------------ geometry */

void
wsync_box_whole(WsyncBox *box, guint ndim, const guint64 *shape)
{
  memset(box, 0, sizeof *box);
  box->ndim = ndim;
  for (guint d = 0; d < ndim; d++)
    box->extent[d] = shape[d];
}

guint64
wsync_box_volume(const WsyncBox *box)
{
  guint64 v = 1;

  for (guint d = 0; d < box->ndim; d++)
    v *= box->extent[d];
  return v;
}

void
wsync_region_row_major(WsyncRegion *region, guint ndim, const guint64 *shape, const guint64 *at)
{
  guint64 stride = 1;

  memset(region, 0, sizeof *region);
  for (guint d = ndim; d > 0; d--) {
    region->stride[d - 1] = stride;
    if (at != NULL)
      region->origin += at[d - 1] * stride;
    stride *= shape[d - 1];
  }
}

gsize
wsync_dtype_size(WsyncDtype dtype)
{
  guint bits = wsync_dtype_bits(dtype);
  return bits % 8 == 0 ? bits / 8 : 0;
}

gboolean
wsync_dtype_from_torch(const char *name, WsyncDtype *dtype)
{
  static const struct {
    const char *torch;
    WsyncDtype dtype;
  } names[] = {{"bfloat16", WSYNC_DTYPE_BF16}, {"float16", WSYNC_DTYPE_F16},
               {"half", WSYNC_DTYPE_F16},      {"float32", WSYNC_DTYPE_F32},
               {"float", WSYNC_DTYPE_F32},     {"float64", WSYNC_DTYPE_F64}};

  for (guint i = 0; name != NULL && i < G_N_ELEMENTS(names); i++)
    if (strcmp(name, names[i].torch) == 0) {
      *dtype = names[i].dtype;
      return TRUE;
    }
  return FALSE;
}

/* ------------------------------------------------------------------ logical tensors */

static void
vtensor_free(gpointer data)
{
  WsyncVTensor *vt = data;

  g_free(vt->name);
  g_array_unref(vt->sources);
  g_free(vt);
}

const char *
wsync_vtensor_get_name(const WsyncVTensor *vt)
{
  return vt->name;
}

WsyncDtype
wsync_vtensor_get_dtype(const WsyncVTensor *vt)
{
  return vt->dtype;
}

guint
wsync_vtensor_get_ndim(const WsyncVTensor *vt)
{
  return vt->ndim;
}

const guint64 *
wsync_vtensor_get_shape(const WsyncVTensor *vt)
{
  return vt->shape;
}

/* ------------------------------------------------------------------ the mapping */

static void
param_free(gpointer data)
{
  WsyncParam *param = data;

  g_free(param->name);
  g_free(param->runtime_name);
  g_free(param->note);
  g_free(param->group);
  g_free(param->runtime_drop);
  g_free(param->block);
  g_strfreev(param->aliases);
  g_free(param);
}

static void
drop_rule_clear(gpointer data)
{
  DropRule *rule = data;

  g_free(rule->rule);
  g_free(rule->glob);
}

WsyncMapping *
wsync_mapping_new(JsonObject *config, const char *model_type)
{
  WsyncMapping *m = g_new0(WsyncMapping, 1);

  m->config = json_object_ref(config);
  m->model_type = g_strdup(model_type);
  m->vtensors = g_ptr_array_new_with_free_func(vtensor_free);
  m->vt_by_name = g_hash_table_new(g_str_hash, g_str_equal);
  m->params = g_ptr_array_new_with_free_func(param_free);
  m->drop_rules = g_array_new(FALSE, TRUE, sizeof(DropRule));
  g_array_set_clear_func(m->drop_rules, drop_rule_clear);
  return m;
}

void
wsync_mapping_free(WsyncMapping *m)
{
  if (m == NULL)
    return;
  json_object_unref(m->config);
  g_free(m->model_type);
  g_hash_table_unref(m->vt_by_name);
  g_ptr_array_unref(m->vtensors);
  g_ptr_array_unref(m->params);
  g_array_unref(m->drop_rules);
  g_free(m->remapper);
  g_free(m);
}

JsonObject *
wsync_mapping_get_config(WsyncMapping *m)
{
  return m->config;
}

const char *
wsync_mapping_get_model_type(WsyncMapping *m)
{
  return m->model_type;
}

WsyncVTensor *
wsync_mapping_add_vtensor(WsyncMapping *m, const char *name, WsyncDtype dtype, guint ndim,
                          const guint64 *shape)
{
  WsyncVTensor *vt;

  g_return_val_if_fail(ndim <= WSYNC_MAX_DIMS, NULL);
  g_return_val_if_fail(g_hash_table_lookup(m->vt_by_name, name) == NULL, NULL);
  vt = g_new0(WsyncVTensor, 1);
  vt->name = g_strdup(name);
  vt->dtype = dtype;
  vt->ndim = ndim;
  memcpy(vt->shape, shape, ndim * sizeof(guint64));
  vt->ordinal = m->vtensors->len;
  vt->sources = g_array_new(FALSE, TRUE, sizeof(Source));
  g_ptr_array_add(m->vtensors, vt);
  g_hash_table_insert(m->vt_by_name, vt->name, vt);
  return vt;
}

WsyncParam *
wsync_mapping_add_param(WsyncMapping *m, const char *name, const char *runtime_name,
                        WsyncParamKind kind, guint n_parts, const WsyncPart *parts)
{
  WsyncParam *param;

  g_return_val_if_fail(n_parts <= WSYNC_PARAM_MAX_PARTS, NULL);
  param = g_new0(WsyncParam, 1);
  param->name = g_strdup(name);
  param->runtime_name = g_strdup(runtime_name);
  param->kind = kind;
  param->n_parts = n_parts;
  for (guint i = 0; i < n_parts; i++) {
    param->parts[i] = parts[i];
    if (param->parts[i].unit == 0)
      param->parts[i].unit = 1;
    /* length 0 means: to the end of axis 0 */
    if (param->parts[i].length == 0 && parts[i].vt != NULL)
      param->parts[i].length = parts[i].vt->shape[0] - parts[i].start;
  }
  g_ptr_array_add(m->params, param);
  return param;
}

void
wsync_param_set_runtime_dtype(WsyncParam *param, WsyncDtype dtype, const char *note)
{
  param->runtime_dtype = dtype;
  param->has_runtime_dtype = TRUE;
  g_free(param->note);
  param->note = g_strdup(note);
}

void
wsync_param_set_group(WsyncParam *param, const char *group)
{
  g_free(param->group);
  param->group = g_strdup(group);
}

void
wsync_param_drop_at_runtime(WsyncParam *param, const char *rule)
{
  g_free(param->runtime_drop);
  param->runtime_drop = g_strdup(rule);
}

void
wsync_param_set_role(WsyncParam *param, WsyncParamRole role, const char *block)
{
  param->role = role;
  g_free(param->block);
  param->block = g_strdup(block);
}

void
wsync_param_add_alias(WsyncParam *param, const char *runtime_name)
{
  guint n = param->aliases != NULL ? g_strv_length(param->aliases) : 0;

  param->aliases = g_renew(char *, param->aliases, n + 2);
  param->aliases[n] = g_strdup(runtime_name);
  param->aliases[n + 1] = NULL;
}

void
wsync_mapping_add_drop_rule(WsyncMapping *m, const char *rule, const char *glob)
{
  DropRule r = {g_strdup(rule), g_strdup(glob)};
  g_array_append_val(m->drop_rules, r);
}

void
wsync_mapping_set_hf_layout(WsyncMapping *m, WsyncConvertFunc build, gpointer user_data)
{
  m->hf_build = build;
  m->hf_data = user_data;
}

/* ------------------------------------------------------------------ layouts */

static void
layout_tensor_free(gpointer data)
{
  WsyncLayoutTensor *t = data;

  g_free(t->name);
  g_array_unref(t->placements);
  for (guint i = 0; i < t->fills->len; i++)
    g_free(g_array_index(t->fills, Fill, i).reason);
  g_array_unref(t->fills);
  g_free(t->made_by);
  g_free(t->state);
  if (t->ops)
    g_array_unref(t->ops);
  g_free(t);
}

WsyncLayout *
wsync_layout_new(WsyncMapping *m, WsyncContext *ctx, const char *target, const char *format,
                 guint tp, guint ep, guint rank, guint world, gboolean reading)
{
  WsyncLayout *layout = g_new0(WsyncLayout, 1);

  layout->mapping = m;
  layout->ctx = ctx;
  layout->target = g_strdup(target);
  layout->format = g_strdup(format);
  layout->tp = tp;
  layout->ep = ep;
  layout->rank = rank;
  layout->world = world;
  layout->reading = reading;
  layout->tensors = g_ptr_array_new_with_free_func(layout_tensor_free);
  layout->by_name = g_hash_table_new(g_str_hash, g_str_equal);
  layout->dropped = g_array_new(FALSE, TRUE, sizeof(DroppedParam));
  layout->omitted = g_array_new(FALSE, TRUE, sizeof(DroppedParam));
  layout->metadata = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
  return layout;
}

void
wsync_layout_free(WsyncLayout *layout)
{
  if (layout == NULL)
    return;
  g_free(layout->target);
  g_free(layout->format);
  g_free(layout->needs_hook);
  g_hash_table_unref(layout->by_name);
  g_ptr_array_unref(layout->tensors);
  for (guint i = 0; i < layout->dropped->len; i++)
    g_free(g_array_index(layout->dropped, DroppedParam, i).rule);
  g_array_unref(layout->dropped);
  for (guint i = 0; i < layout->omitted->len; i++)
    g_free(g_array_index(layout->omitted, DroppedParam, i).rule);
  g_array_unref(layout->omitted);
  g_hash_table_unref(layout->metadata);
  if (layout->notes)
    g_ptr_array_unref(layout->notes);
  if (layout->input_names)
    g_hash_table_unref(layout->input_names);
  if (layout->input_metadata)
    g_hash_table_unref(layout->input_metadata);
  g_free(layout);
}

const char *
wsync_layout_get_target(WsyncLayout *layout)
{
  return layout->target;
}

guint
wsync_layout_get_tp(WsyncLayout *layout)
{
  return layout->tp;
}

guint
wsync_layout_get_ep(WsyncLayout *layout)
{
  return layout->ep;
}

guint
wsync_layout_get_rank(WsyncLayout *layout)
{
  return layout->rank;
}

guint
wsync_layout_get_world(WsyncLayout *layout)
{
  return layout->world;
}

const char *
wsync_layout_get_format(WsyncLayout *layout)
{
  return layout->format;
}

gboolean
wsync_layout_is_reading(WsyncLayout *layout)
{
  return layout->reading;
}

JsonObject *
wsync_layout_get_config(WsyncLayout *layout)
{
  return layout->mapping->config;
}

/* `dtype` (Transformers 5) or `torch_dtype`, at the top or in text_config. */
WsyncDtype
wsync_layout_get_model_dtype(WsyncLayout *layout)
{
  JsonObject *objs[2] = {layout->mapping->config, NULL};
  static const char *const keys[] = {"dtype", "torch_dtype"};
  WsyncDtype dtype = WSYNC_DTYPE_BF16;

  if (json_object_has_member(objs[0], "text_config") &&
      JSON_NODE_HOLDS_OBJECT(json_object_get_member(objs[0], "text_config")))
    objs[1] = json_object_get_object_member(objs[0], "text_config");
  for (int o = 1; o >= 0; o--)
    for (guint k = 0; objs[o] != NULL && k < G_N_ELEMENTS(keys); k++) {
      JsonNode *node = json_object_get_member(objs[o], keys[k]);
      if (node != NULL && JSON_NODE_HOLDS_VALUE(node) &&
          json_node_get_value_type(node) == G_TYPE_STRING &&
          wsync_dtype_from_torch(json_node_get_string(node), &dtype))
        return dtype;
    }
  return dtype;
}

guint
wsync_layout_n_vtensors(WsyncLayout *layout)
{
  return layout->mapping->vtensors->len;
}

WsyncVTensor *
wsync_layout_vtensor(WsyncLayout *layout, guint index)
{
  return layout->mapping->vtensors->pdata[index];
}

WsyncVTensor *
wsync_layout_lookup_vtensor(WsyncLayout *layout, const char *name)
{
  return g_hash_table_lookup(layout->mapping->vt_by_name, name);
}

guint
wsync_layout_n_params(WsyncLayout *layout)
{
  return layout->mapping->params->len;
}

const WsyncParam *
wsync_layout_param(WsyncLayout *layout, guint index)
{
  return layout->mapping->params->pdata[index];
}

gboolean
wsync_layout_input_has(WsyncLayout *layout, const char *name)
{
  return layout->reading && layout->input_names != NULL &&
         g_hash_table_contains(layout->input_names, name);
}

WsyncLayoutTensor *
wsync_layout_add_tensor(WsyncLayout *layout, const char *name, WsyncDtype dtype, guint ndim,
                        const guint64 *shape, GError **error)
{
  WsyncLayoutTensor *t;

  if (g_hash_table_contains(layout->by_name, name)) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                "%s: tensor \"%s\" is added twice to the %s layout of rank %u",
                layout->current_entry ? layout->current_entry : "layout", name, layout->target,
                layout->rank);
    return NULL;
  }
  if (ndim > WSYNC_MAX_DIMS) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE, "tensor \"%s\" has %u axes", name, ndim);
    return NULL;
  }
  t = g_new0(WsyncLayoutTensor, 1);
  t->name = g_strdup(name);
  t->dtype = dtype;
  t->ndim = ndim;
  memcpy(t->shape, shape, ndim * sizeof(guint64));
  t->placements = g_array_new(FALSE, TRUE, sizeof(Placement));
  t->fills = g_array_new(FALSE, TRUE, sizeof(Fill));
  t->made_by = g_strdup(layout->current_entry);
  g_ptr_array_add(layout->tensors, t);
  g_hash_table_insert(layout->by_name, t->name, t);
  return t;
}

void
wsync_layout_place(WsyncLayout *layout, WsyncLayoutTensor *tensor, WsyncVTensor *vt,
                   const WsyncBox *box, const WsyncRegion *region)
{
  Placement p = {vt, *box, *region};

  (void)layout;
  g_array_append_val(tensor->placements, p);
}

void
wsync_layout_fill(WsyncLayout *layout, WsyncLayoutTensor *tensor, const WsyncBox *box,
                  const guint8 *value, gsize value_len, const char *reason)
{
  Fill fill = {.box = *box, .value_len = MIN(value_len, sizeof fill.value)};

  (void)layout;
  memcpy(fill.value, value, fill.value_len);
  fill.reason = g_strdup(reason);
  g_array_append_val(tensor->fills, fill);
}

void
wsync_layout_drop_param(WsyncLayout *layout, const WsyncParam *param, const char *rule)
{
  DroppedParam d = {param, g_strdup(rule)};
  g_array_append_val(layout->dropped, d);
}

guint
wsync_layout_n_tensors(WsyncLayout *layout)
{
  return layout->tensors->len;
}

WsyncLayoutTensor *
wsync_layout_tensor(WsyncLayout *layout, guint index)
{
  return layout->tensors->pdata[index];
}

const char *
wsync_layout_tensor_get_name(const WsyncLayoutTensor *tensor)
{
  return tensor->name;
}

void
wsync_layout_tensor_set_param(WsyncLayoutTensor *tensor, const WsyncParam *param)
{
  tensor->param = param;
}

const WsyncParam *
wsync_layout_tensor_get_param(const WsyncLayoutTensor *tensor)
{
  return tensor->param;
}

void
wsync_layout_tensor_set_state(WsyncLayout *layout, WsyncLayoutTensor *tensor, const char *state)
{
  g_free(tensor->state);
  tensor->state = g_strdup(state);
  if (layout->current_entry != NULL && tensor->made_by != NULL &&
      strstr(tensor->made_by, layout->current_entry) == NULL) {
    char *by = g_strdup_printf("%s, then %s", tensor->made_by, layout->current_entry);
    g_free(tensor->made_by);
    tensor->made_by = by;
  }
}

void
wsync_layout_tensor_permute_last2(WsyncLayoutTensor *t)
{
  guint a = t->ndim - 2, b = t->ndim - 1;

  g_return_if_fail(t->ndim >= 2);
  /* A placement's region maps box axes to element strides of the tensor.  After the
   * swap, element (.., i, j) of the old tensor is element (.., j, i) of the new one:
   * strides along the old axes a and b become the new row-major strides of b and a. */
  guint64 old_stride_a = t->shape[b], new_stride_b = t->shape[a];
  for (guint i = 0; i < t->placements->len; i++) {
    Placement *p = &g_array_index(t->placements, Placement, i);
    guint64 outer_stride = t->shape[a] * t->shape[b];
    /* decompose the origin into (outer, i, j) of the old tensor */
    guint64 outer = p->region.origin / outer_stride;
    guint64 rem = p->region.origin % outer_stride;
    guint64 oi = rem / old_stride_a, oj = rem % old_stride_a;
    p->region.origin = outer * outer_stride + oj * new_stride_b + oi;
    for (guint k = 0; k < p->box.ndim; k++) {
      guint64 s = p->region.stride[k];
      if (s % outer_stride == 0 && s >= outer_stride)
        continue; /* an outer axis: unchanged */
      /* within one matrix: s = di*old_stride_a + dj */
      guint64 di = s / old_stride_a, dj = s % old_stride_a;
      p->region.stride[k] = dj * new_stride_b + di;
    }
  }
  for (guint i = 0; i < t->fills->len; i++) {
    Fill *f = &g_array_index(t->fills, Fill, i);
    guint64 o = f->box.offset[a], e = f->box.extent[a];
    f->box.offset[a] = f->box.offset[b];
    f->box.extent[a] = f->box.extent[b];
    f->box.offset[b] = o;
    f->box.extent[b] = e;
  }
  guint64 s = t->shape[a];
  t->shape[a] = t->shape[b];
  t->shape[b] = s;
  t->permuted = !t->permuted;
}

void
wsync_layout_set_metadata(WsyncLayout *layout, const char *key, const char *value)
{
  g_hash_table_insert(layout->metadata, g_strdup(key), g_strdup(value));
}

const char *
wsync_layout_get_input_metadata(WsyncLayout *layout, const char *key)
{
  return layout->input_metadata ? g_hash_table_lookup(layout->input_metadata, key) : NULL;
}

void
wsync_layout_add_note(WsyncLayout *layout, const char *note)
{
  if (layout->notes == NULL)
    layout->notes = g_ptr_array_new_with_free_func(g_free);
  g_ptr_array_add(layout->notes, g_strdup(note));
}

void
wsync_layout_require_hook(WsyncLayout *layout, const char *reason)
{
  g_free(layout->needs_hook);
  layout->needs_hook = g_strdup(reason);
}

cfg_t *
wsync_layout_get_option(WsyncLayout *layout, const char *plugin_name)
{
  return layout->ctx ? wsync_context_get_plugin_options(layout->ctx, plugin_name) : NULL;
}
