/* wsync: a plan for people (text) and for scripts (JSON). */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "plan-private.h"

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
    g_autofree char *vbox = wsync_box_format(&op->lbox);
    return g_strdup_printf("generated %s%s (seed %" G_GUINT64_FORMAT ")", op->lt->name, vbox,
                           plan->seed);
  }
  g_autofree char *inbox = op_input_box(op, &in) ? wsync_box_format(&in) : g_strdup("[strided]");
  return g_strdup_printf("%s%s", op->source->input->name, inbox);
}

static void
print_tensor(WsyncPlan *plan, const WsyncLayoutTensor *lt, FILE *out)
{
  g_autofree char *shape = wsync_shape_format(lt->ndim, lt->shape);

  fprintf(out, "  %s  %s %s  %" G_GUINT64_FORMAT " bytes  by %s%s%s\n", lt->name,
          wsync_dtype_name(lt->dtype), shape, lt->nbytes, lt->made_by ? lt->made_by : "?",
          lt->state ? "  state " : "", lt->state ? lt->state : "");
  for (guint i = 0; i < lt->n_ops; i++) {
    Op op_buf;
    const Op *op = &op_buf;
    layout_tensor_op(lt, i, &op_buf);
    WsyncBox ob;
    g_autofree char *obox = op_output_box(lt, op, &ob) ? wsync_box_format(&ob) : g_strdup("?");
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

/* The metadata a rank's files carry, sorted by key. */
static GList *
sorted_metadata_keys(const WsyncLayout *layout)
{
  return g_list_sort(g_hash_table_get_keys(layout->metadata), (GCompareFunc)strcmp);
}

static void
print_metadata(const WsyncLayout *layout, FILE *out)
{
  g_autoptr(GList) keys = sorted_metadata_keys(layout);

  if (keys == NULL)
    return;
  fputs(" metadata", out);
  for (GList *k = keys; k != NULL; k = k->next)
    fprintf(out, " %s=%s", (const char *)k->data,
            (const char *)g_hash_table_lookup(layout->metadata, k->data));
  fputc('\n', out);
}

/* The inputs a rule dropped, each tensor once: a DCP source gives one input per chunk
 * of a tensor (core/inputs.c, collect_chunks), all of one name, and the user reads tensor
 * names, not chunks. */
static GPtrArray *
dropped_inputs(const WsyncPlan *plan)
{
  GPtrArray *dropped = g_ptr_array_new();
  g_autoptr(GHashTable) seen = g_hash_table_new(g_str_hash, g_str_equal);

  for (guint i = 0; plan->inputs && i < plan->inputs->len; i++) {
    InputState *s = &g_array_index(plan->inputs, InputState, i);
    if (s->drop_rule != NULL && g_hash_table_add(seen, (gpointer)s->tensor->name))
      g_ptr_array_add(dropped, s);
  }
  return dropped;
}

void
wsync_plan_print(WsyncPlan *plan, FILE *out)
{
  fprintf(out, "source %s (%s layout%s%s), model %s described by %s\n", plan->src,
          plan->kind == PLAN_SYNTH ? "generated" : plan->input_target, plan->in_format ? ", format " : "",
          plan->in_format ? plan->in_format : "", plan->model->model_type,
          plan->model->remapper);
  fprintf(out, "target %s%s%s, tp %u, ep %u, %u rank%s\n", plan->target,
          plan->out_format ? ", format " : "", plan->out_format ? plan->out_format : "",
          plan->out_tp, plan->out_ep, plan->out_world, plan->out_world == 1 ? "" : "s");
  for (guint l = 0; l < plan->outputs->len; l++) {
    WsyncLayout *layout = plan->outputs->pdata[l];
    guint last_part = G_MAXUINT;
    fprintf(out, "rank %u\n", layout->rank);
    print_metadata(layout, out);
    for (guint i = 0; i < layout->tensors->len; i++) {
      const WsyncLayoutTensor *lt = layout->tensors->pdata[i];
      if (lt->part != last_part) {
        g_autofree char *file = plan_file_name(plan, layout, lt->part);
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
  g_autoptr(GPtrArray) dropped = dropped_inputs(plan);
  for (guint i = 0; i < dropped->len; i++) {
    const InputState *s = dropped->pdata[i];
    if (s->copy_of != NULL)
      fprintf(out,
              "input %s dropped by rule %s (a copy of %s: same dtype and shape, values not "
              "compared)\n",
              s->tensor->name, s->drop_rule, s->copy_of);
    else
      fprintf(out, "input %s dropped by rule %s\n", s->tensor->name, s->drop_rule);
  }
  for (guint n = 0; n < plan->notes->len; n++)
    fprintf(out, "note: %s\n", (const char *)plan->notes->pdata[n]);
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
    json_builder_add_string_value(b, op->lt->name);
    add_box(b, "logical_box", &op->lbox);
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
  g_autofree char *file = plan_file_name(plan, layout, lt->part);

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
  for (guint i = 0; i < lt->n_ops; i++) {
    Op op;
    layout_tensor_op(lt, i, &op);
    add_op_json(plan, b, lt, &op);
  }
  json_builder_end_array(b);
  json_builder_end_object(b);
}

static void
add_string_or_null(JsonBuilder *b, const char *value)
{
  if (value != NULL)
    json_builder_add_string_value(b, value);
  else
    json_builder_add_null_value(b);
}

/* {"param" or "tensor": NAME, "rule": RULE}: what was dropped, and by which rule. */
/* {"WHAT": NAME, "rule": RULE}, with "copy_of" for an input a copy rule consumed (its
 * values not compared: the text line says so). */
static void
add_dropped_json(JsonBuilder *b, const char *what, const char *name, const char *rule,
                 const char *copy_of)
{
  json_builder_begin_object(b);
  json_builder_set_member_name(b, what);
  json_builder_add_string_value(b, name);
  json_builder_set_member_name(b, "rule");
  json_builder_add_string_value(b, rule);
  if (copy_of != NULL) {
    json_builder_set_member_name(b, "copy_of");
    json_builder_add_string_value(b, copy_of);
  }
  json_builder_end_object(b);
}

void
plan_json_add_layout(JsonBuilder *b, const WsyncPlan *plan)
{
  json_builder_set_member_name(b, "target");
  json_builder_add_string_value(b, plan->target);
  json_builder_set_member_name(b, "format");
  add_string_or_null(b, plan->out_format);
  json_builder_set_member_name(b, "tp");
  json_builder_add_int_value(b, plan->out_tp);
  json_builder_set_member_name(b, "ep");
  json_builder_add_int_value(b, plan->out_ep);
}

static void
add_metadata_json(JsonBuilder *b, const WsyncLayout *layout)
{
  g_autoptr(GList) keys = sorted_metadata_keys(layout);

  json_builder_set_member_name(b, "metadata");
  json_builder_begin_object(b);
  for (GList *k = keys; k != NULL; k = k->next) {
    json_builder_set_member_name(b, k->data);
    json_builder_add_string_value(b, g_hash_table_lookup(layout->metadata, k->data));
  }
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
  json_builder_add_string_value(b, plan->kind == PLAN_SYNTH ? "generated" : plan->input_target);
  json_builder_set_member_name(b, "model_type");
  json_builder_add_string_value(b, plan->model->model_type);
  json_builder_set_member_name(b, "remapper");
  json_builder_add_string_value(b, plan->model->remapper);
  json_builder_set_member_name(b, "source_format");
  add_string_or_null(b, plan->in_format);
  /* the config.json read (null: generated weights, a merge without one); a sharded
   * checkpoint's may be one directory up */
  g_autofree char *config = plan->model_dir != NULL && !plan->no_config
                                ? g_build_filename(plan->model_dir, "config.json", NULL)
                                : NULL;
  json_builder_set_member_name(b, "config");
  add_string_or_null(b, config);
  plan_json_add_layout(b, plan);
  json_builder_set_member_name(b, "world");
  json_builder_add_int_value(b, plan->out_world);
  json_builder_set_member_name(b, "ranks");
  json_builder_begin_array(b);
  for (guint l = 0; l < plan->outputs->len; l++) {
    WsyncLayout *layout = plan->outputs->pdata[l];
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "rank");
    json_builder_add_int_value(b, layout->rank);
    add_metadata_json(b, layout);
    json_builder_set_member_name(b, "tensors");
    json_builder_begin_array(b);
    for (guint i = 0; i < layout->tensors->len; i++)
      add_tensor_json(plan, b, layout, layout->tensors->pdata[i]);
    json_builder_end_array(b);
    json_builder_set_member_name(b, "dropped");
    json_builder_begin_array(b);
    for (guint d = 0; d < layout->dropped->len; d++) {
      DroppedParam *dp = &g_array_index(layout->dropped, DroppedParam, d);
      add_dropped_json(b, "param", dp->param->name, dp->rule, NULL);
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
  g_autoptr(GPtrArray) dropped = dropped_inputs(plan);
  for (guint i = 0; i < dropped->len; i++) {
    const InputState *s = dropped->pdata[i];
    add_dropped_json(b, "tensor", s->tensor->name, s->drop_rule, s->copy_of);
  }
  json_builder_end_array(b);
  json_builder_set_member_name(b, "notes");
  json_builder_begin_array(b);
  for (guint n = 0; n < plan->notes->len; n++)
    json_builder_add_string_value(b, plan->notes->pdata[n]);
  json_builder_end_array(b);
  json_builder_set_member_name(b, "bytes");
  json_builder_add_int_value(b, (gint64)wsync_plan_total_bytes(plan));
  json_builder_end_object(b);
  return json_builder_get_root(b);
}
