/* wsync: building and resolving a plan's layouts.
 *
 * The target's build function lays out each rank (then the hooks that serve the target
 * change it); each placement of an output tensor is cut into copies from the sources of
 * its logical tensor (first source wins where replicas overlap); the copies and fills of
 * every output tensor must tile it exactly, and every input tensor must be used, or
 * dropped by a named rule.
 */
#include "config.h"

#include <string.h>

#include "context-private.h"
#include "entry-private.h"
#include "plan-private.h"

/* Appends the pieces of @u outside @cut (which intersects it) to @out. */
void
plan_box_subtract(const WsyncBox *u, const WsyncBox *cut, GArray *out)
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

/* ------------------------------------------------------------------ building layouts */

static void
set_target(PlanTarget *out, const WsyncEntry *e)
{
  out->info = wsync_entry_get_target(e);
  out->user_data = wsync_entry_get_user_data(e);
  g_free(out->label);
  out->label = plan_entry_label(e);
}

/* The target called @name, from the dispatch table. */
gboolean
plan_find_target(WsyncPlan *plan, const char *name, PlanTarget *out, GError **error)
{
  g_autoptr(GPtrArray) converters = wsync_registry_lookup(wsync_context_get_registry(plan->ctx),
                                                          WSYNC_ENTRY_CONVERTER, name);

  if (converters->len > 0 && wsync_entry_get_target(converters->pdata[0]) != NULL) {
    set_target(out, converters->pdata[0]);
    return TRUE;
  }
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
              "no loaded plugin provides the target \"%s\" (wsync plugins lists the targets; "
              "wsync convert --help describes them)",
              name);
  return FALSE;
}

/* The target that reads files no target claims (the Hugging Face layout, plugin "hf"):
 * the highest-priority one. */
gboolean
plan_unclaimed_reader(WsyncPlan *plan, PlanTarget *out, GError **error)
{
  g_autoptr(GPtrArray) converters = wsync_registry_lookup(
      wsync_context_get_registry(plan->ctx), WSYNC_ENTRY_CONVERTER, NULL);

  for (guint i = 0; i < converters->len; i++) {
    const WsyncTargetInfo *info = wsync_entry_get_target(converters->pdata[i]);
    if (info != NULL && info->reads_unclaimed) {
      set_target(out, converters->pdata[i]);
      return TRUE;
    }
  }
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
              "%s: no loaded plugin reads checkpoints in their published layout (select the "
              "plugin \"hf\" in conf.d)",
              plan->src);
  return FALSE;
}

/* The format a target is written in: the one asked for, else its default.  A target
 * without named formats takes none; a format set in conf.d's sync section only applies
 * to targets that have it. */
static gboolean
choose_format(const PlanTarget *t, const char *asked, gboolean explicit, const char *origin,
              char **format, GError **error)
{
  const char *const *formats = t->info->formats;
  g_autofree char *list = NULL;

  if (formats == NULL || formats[0] == NULL) {
    if (asked != NULL && explicit) {
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                  "--format %s: target %s has no formats to choose from", asked, t->info->name);
      return FALSE;
    }
    return TRUE;
  }
  if (asked == NULL || g_strv_contains(formats, asked)) {
    *format = g_strdup(asked != NULL ? asked : formats[0]);
    return TRUE;
  }
  list = g_strjoinv(", ", (char **)formats);
  /* a format conf.d set is named where it is set, FILE:LINE */
  g_autofree char *where = explicit           ? g_strdup("--")
                           : origin != NULL ? g_strdup_printf("%s: sync ", origin)
                                            : g_strdup("conf.d sync { } ");
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
              "%sformat \"%s\" is not one of target %s's formats (%s)", where, asked,
              t->info->name, list);
  return FALSE;
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
    g_autofree char *label = plan_entry_label(e);
    layout->current_entry = label;
    gboolean ok = ((WsyncHookFunc)wsync_entry_get_callback(e))(layout, wsync_entry_get_user_data(e),
                                                               error);
    layout->current_entry = NULL;
    if (!ok) {
      wsync_entry_explain_silence(error);
      g_prefix_error(error, "%s: ", label);
      return FALSE;
    }
  }
  return TRUE;
}

/* The number of ranks of @t for @tp and @ep (one for a target without ranks). */
guint
plan_target_world(const PlanTarget *t, guint tp, guint ep)
{
  return t->info->world != NULL ? t->info->world(tp, ep, t->user_data) : 1;
}

/* A layout written holds some tensor whose dtype follows its input in another dtype
 * than published (an engine's): its files record the published one, which reading them
 * back restores (wsync_logical_set_dtype_follows_input()). */
static void
record_published_dtypes(WsyncLayout *layout)
{
  for (guint i = 0; i < layout->tensors->len; i++) {
    WsyncLayoutTensor *t = layout->tensors->pdata[i];
    for (guint p = 0; p < layout_tensor_n_placements(t); p++) {
      Placement pl;
      layout_tensor_placement(t, p, &pl);
      if (pl.lt->dtype_follows_input && pl.lt->published_dtype != t->dtype) {
        g_autofree char *key = g_strconcat(WSYNC_PUBLISHED_DTYPE_KEY, pl.lt->name, NULL);
        wsync_layout_set_metadata(layout, key, wsync_dtype_name(pl.lt->published_dtype));
      }
    }
  }
}

/* ------------------------------------------------------------------ switched groups */

/* Rank files record whether they were written without the blocks of each switch their
 * target asked about (wsync_layout_get_runtime_drop()).  Read back, the record decides
 * for the whole plan: the inputs are read before the outputs are built, so every output
 * is written as the source was (a deployment switch is the files' fact, not conf.d's). */
static gboolean
apply_recorded_switches(WsyncPlan *plan, WsyncLayout *layout, GError **error)
{
  for (guint i = 0; i < plan->model->switches->len; i++) {
    RuntimeSwitch *sw = plan->model->switches->pdata[i];
    g_autofree char *key = g_strconcat(WSYNC_RUNTIME_DROP_KEY, sw->option, NULL);
    const char *value = wsync_layout_get_input_metadata(layout, key);
    gboolean on;

    if (value == NULL)
      continue; /* an earlier wsync, or a target that holds the blocks whatever it says */
    if (strcmp(value, "true") != 0 && strcmp(value, "false") != 0) {
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                  "metadata %s is \"%s\", not \"true\" or \"false\"", key, value);
      return FALSE;
    }
    on = strcmp(value, "true") == 0;
    if (sw->from_files && sw->on != on) {
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                  "metadata %s is \"%s\" in rank %u's files and \"%s\" in an earlier "
                  "rank's: the ranks were not written for one deployment",
                  key, value, layout->rank, sw->on ? "true" : "false");
      return FALSE;
    }
    sw->on = on;
    sw->from_files = TRUE;
  }
  return TRUE;
}

char *
plan_switch_note(const RuntimeSwitch *sw, const char *plugin)
{
  /* (a remapper without a plugin has no conf.d section: what it set is its own
   * option's value, as check_unrecorded_switches() says it) */
  g_autofree char *set_by =
      plugin != NULL ? g_strdup_printf("as conf.d sets it (plugin \"%s\")", plugin)
                     : g_strdup("as the remapper sets it");

  return g_strdup_printf("%s = %s, as the source's rank files record (metadata %s%s), not %s "
                         "%s: the plan reads and writes the blocks it switches off as the "
                         "source was written",
                         sw->option, sw->on ? "true" : "false", WSYNC_RUNTIME_DROP_KEY,
                         sw->option, sw->conf_on ? "true" : "false", set_by);
}

/* A layout to write records each switch its target asked about; where the source's
 * files decided one against conf.d, the plan says so. */
static void
record_switches(WsyncPlan *plan, WsyncLayout *layout)
{
  for (guint i = 0; layout->switches_asked != NULL && i < layout->switches_asked->len; i++) {
    RuntimeSwitch *sw = layout->switches_asked->pdata[i];
    g_autofree char *key = g_strconcat(WSYNC_RUNTIME_DROP_KEY, sw->option, NULL);
    wsync_layout_set_metadata(layout, key, sw->on ? "true" : "false");
  }
  for (guint i = 0; i < plan->model->switches->len; i++) {
    RuntimeSwitch *sw = plan->model->switches->pdata[i];
    if (!sw->from_files || sw->on == sw->conf_on)
      continue;
    g_autofree char *note = plan_switch_note(sw, plan->model->remapper_plugin);
    wsync_layout_add_note(layout, note);
  }
}

/* The names of @layout's tensors of @sw's blocks; *n_held: how many of them the rank's
 * files hold. */
static GPtrArray *
switched_tensors(WsyncLayout *layout, const RuntimeSwitch *sw, guint *n_held)
{
  GPtrArray *names = g_ptr_array_new();

  *n_held = 0;
  for (guint i = 0; i < layout->tensors->len; i++) {
    const WsyncLayoutTensor *lt = layout->tensors->pdata[i];
    if (lt->param == NULL || lt->param->block->runtime_switch != sw)
      continue;
    g_ptr_array_add(names, lt->name);
    *n_held += wsync_layout_input_has(layout, lt->name) ? 1 : 0;
  }
  return names;
}

/* The layout @t builds of a rank's files with @sw the other way (then put back). */
static WsyncLayout *
build_flipped(WsyncPlan *plan, const PlanTarget *t, WsyncLayout *layout, RuntimeSwitch *sw,
              GPtrArray *input_files)
{
  WsyncLayout *flipped =
      wsync_layout_new(plan->model, plan->ctx, layout->target, layout->format, layout->tp,
                       layout->ep, layout->rank, layout->world, TRUE);
  gboolean ok;

  flipped->input_names = g_hash_table_ref(layout->input_names);
  if (layout->input_metadata != NULL)
    flipped->input_metadata = g_hash_table_ref(layout->input_metadata);
  flipped->input_files = input_files;
  flipped->current_entry = t->label;
  sw->on = !sw->on;
  ok = t->info->build(flipped, t->user_data, NULL);
  sw->on = !sw->on;
  flipped->input_files = NULL;
  flipped->current_entry = NULL;
  if (!ok)
    g_clear_pointer(&flipped, wsync_layout_free);
  return flipped;
}

/* Rank files that record no switch (an earlier wsync) are read as conf.d sets it.  When
 * they hold the switched blocks as the other setting has them (none of their tensors,
 * or all of them), conf.d is what is wrong: refused, naming the setting to make. */
static gboolean
check_unrecorded_switches(WsyncPlan *plan, const PlanTarget *t, WsyncLayout *layout,
                          GPtrArray *input_files, GError **error)
{
  for (guint i = 0; layout->switches_asked != NULL && i < layout->switches_asked->len; i++) {
    RuntimeSwitch *sw = layout->switches_asked->pdata[i];
    g_autoptr(GPtrArray) names = NULL;
    g_autoptr(WsyncLayout) flipped = NULL;
    guint held = 0;
    gboolean other = FALSE;

    if (sw->from_files)
      continue;
    if (!sw->on) {
      names = switched_tensors(layout, sw, &held);
      other = names->len > 0 && held == 0;
    } else if ((flipped = build_flipped(plan, t, layout, sw, input_files)) != NULL) {
      names = switched_tensors(flipped, sw, &held);
      other = names->len > 0 && held == names->len;
    }
    if (!other)
      continue;
    g_autofree char *list = plan_format_list(names);
    const char *plugin = plan->model->remapper_plugin;
    /* (a remapper the program registered itself has no conf.d section to name) */
    g_autofree char *setting =
        plugin != NULL ? g_strdup_printf("set in conf.d: plugin \"%s\" { %s = %s }", plugin,
                                         sw->option, sw->on ? "false" : "true")
                       : g_strdup_printf("set the remapper's option %s = %s", sw->option,
                                         sw->on ? "false" : "true");
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                "%s: rank %u's files hold %s of the %u tensors of the blocks that %s switches "
                "off (%s) and do not record %s%s (an earlier wsync wrote them): they were "
                "written with %s = %s, and conf.d sets %s; to read them, %s",
                plan->src, layout->rank, sw->on ? "all" : "none", names->len, sw->option, list,
                WSYNC_RUNTIME_DROP_KEY, sw->option, sw->option, sw->on ? "false" : "true",
                sw->on ? "true" : "false", setting);
    return FALSE;
  }
  return TRUE;
}

/* Builds one rank's layout of target @t with its build function, then the target's
 * hooks; a layout to write records the published dtypes it does not keep. */
WsyncLayout *
plan_build_layout(WsyncPlan *plan, const PlanTarget *t, const char *format, guint tp,
                  guint ep, guint rank, gboolean reading, GHashTable *input_names,
                  GPtrArray *input_files, GError **error)
{
  g_autoptr(WsyncLayout) layout =
      wsync_layout_new(plan->model, plan->ctx, t->info->name, format, tp, ep, rank,
                       plan_target_world(t, tp, ep), reading);
  gboolean ok;

  if (input_names)
    layout->input_names = g_hash_table_ref(input_names);
  if (input_files != NULL && input_files->len > 0) {
    layout->input_metadata = g_hash_table_ref(wsync_safetensors_metadata(input_files->pdata[0]));
    layout->input_files = input_files;
  }
  layout->current_entry = t->label;
  ok = !reading || apply_recorded_switches(plan, layout, error);
  ok = ok && t->info->build(layout, t->user_data, error);
  if (!ok && wsync_entry_explain_silence(error))
    g_prefix_error(error, "%s: ", t->label);
  ok = ok && run_hooks(plan, layout, error);
  layout->current_entry = NULL;
  layout->input_files = NULL;
  /* files that record what the target read differently are the cause to name, whatever
   * the target made of the first one's */
  if (layout->disagreeing_key != NULL) {
    g_clear_error(error);
    plan_refuse_different_records(plan, input_files->pdata[0],
                                  input_files->pdata[layout->disagreeing_file],
                                  layout->disagreeing_key, rank, error);
    return NULL;
  }
  if (!ok)
    return NULL;
  if (reading && layout->input_names != NULL &&
      !check_unrecorded_switches(plan, t, layout, input_files, error))
    return NULL;
  if (!reading) {
    record_published_dtypes(layout);
    record_switches(plan, layout);
  }
  return g_steal_pointer(&layout);
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

/* Every cast but to F32 can change a value: F32 and F16 lose mantissa bits in BF16, F32
 * and BF16 lose range in F16. */
static gboolean
cast_is_lossy(WsyncDtype from, WsyncDtype to)
{
  return from != to && to != WSYNC_DTYPE_F32;
}

static gboolean
resolve_placement(WsyncPlan *plan, WsyncLayout *layout, WsyncLayoutTensor *lt,
                  const Placement *pl, OpsBuilder *builder, GError **error)
{
  g_autoptr(GArray) uncovered = g_array_new(FALSE, FALSE, sizeof(WsyncBox));
  WsyncLogicalTensor *vt = pl->lt;

  if (!cast_is_supported(vt->dtype, lt->dtype)) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "tensor \"%s\" of rank %u: %s holds %s, which cannot be converted to %s",
                lt->name, layout->rank, vt->name, wsync_dtype_name(vt->dtype),
                wsync_dtype_name(lt->dtype));
    return FALSE;
  }
  if (cast_is_lossy(vt->dtype, lt->dtype) && !g_hash_table_contains(plan->lossy_casts, vt))
    g_hash_table_insert(plan->lossy_casts, vt, GINT_TO_POINTER(lt->dtype));
  g_array_append_val(uncovered, pl->box);
  for (guint s = 0; s < vt->sources->len && uncovered->len > 0; s++) {
    const Source *src = &g_array_index(vt->sources, Source, s);
    g_autoptr(GArray) left = g_array_new(FALSE, FALSE, sizeof(WsyncBox));
    WsyncBox src_box;
    WsyncRegion src_region;
    source_geometry(src, &src_box, &src_region);
    for (guint u = 0; u < uncovered->len; u++) {
      const WsyncBox *ub = &g_array_index(uncovered, WsyncBox, u);
      WsyncBox inter;
      if (!wsync_box_intersect(ub, &src_box, &inter)) {
        g_array_append_val(left, *ub);
        continue;
      }
      if (src->kind == SOURCE_UNDESCRIBED) {
        g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                    "%s: tensor \"%s\" was not described, and the %s layout needs it (for "
                    "tensor \"%s\" of rank %u)",
                    plan->src, src->undescribed, plan->target, lt->name, layout->rank);
        return FALSE;
      }
      Op op = {.kind = OP_COPY, .ndim = inter.ndim, .source = src, .src_dtype = vt->dtype,
               .lt = vt, .lbox = inter};
      memcpy(op.extent, inter.extent, sizeof op.extent);
      op.dst_origin = region_element(&pl->region, &pl->box, &inter);
      memcpy(op.dst_stride, pl->region.stride, sizeof op.dst_stride);
      op.src_origin = region_element(&src_region, &src_box, &inter);
      memcpy(op.src_stride, src_region.stride, sizeof op.src_stride);
      layout_tensor_add_op(builder, &op);
      plan_box_subtract(ub, &inter, left);
    }
    g_array_set_size(uncovered, 0);
    g_array_append_vals(uncovered, left->data, left->len);
  }
  if (uncovered->len > 0) {
    g_autofree char *box = wsync_box_format(&g_array_index(uncovered, WsyncBox, 0));
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
  guint64 n;

  wsync_shape_numel(lt->ndim, lt->shape, &n); /* a layout's tensors have fitting sizes */
  return n;
}

/* Every element of @lt is produced by exactly one op. */
static gboolean
prove_coverage(WsyncLayout *layout, WsyncLayoutTensor *lt, GError **error)
{
  g_autoptr(GArray) boxes = g_array_sized_new(FALSE, FALSE, sizeof(WsyncBox), lt->n_ops);
  guint64 total = 0;

  for (guint i = 0; i < lt->n_ops; i++) {
    Op op_buf;
    const Op *op = &op_buf;
    WsyncBox b;

    layout_tensor_op(lt, i, &op_buf);
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
      if (wsync_box_intersect(&b, &g_array_index(boxes, WsyncBox, j), &inter) &&
          wsync_box_volume(&inter) > 0) {
        g_autofree char *where = wsync_box_format(&inter);
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
dropped_by_source(WsyncPlan *plan, const WsyncLogicalTensor *vt)
{
  for (guint l = 0; plan->input_layouts != NULL && l < plan->input_layouts->len; l++) {
    WsyncLayout *in = plan->input_layouts->pdata[l];
    for (guint d = 0; d < in->dropped->len; d++) {
      DroppedParam *dp = &g_array_index(in->dropped, DroppedParam, d);
      for (guint p = 0; p < dp->param->n_parts; p++)
        if (dp->param->parts[p].lt == vt)
          return dp->rule;
    }
  }
  return NULL;
}

/* An output tensor whose logical tensor the source never held (it was dropped by a rule
 * when the source was written) cannot be produced.  Returns that rule, or NULL; sets
 * @draft when every such logical tensor belongs to a draft block. */
static const char *
omitted_rule(WsyncPlan *plan, const WsyncLayoutTensor *lt, gboolean *draft)
{
  const char *rule = NULL;

  *draft = TRUE;
  for (guint p = 0; p < layout_tensor_n_placements(lt); p++) {
    Placement pl;
    layout_tensor_placement(lt, p, &pl);
    const WsyncLogicalTensor *vt = pl.lt;
    const char *by = vt->sources->len == 0 ? dropped_by_source(plan, vt) : NULL;
    if (by == NULL)
      continue;
    rule = rule != NULL ? rule : by;
    if (vt->param == NULL || wsync_block_get_group(vt->param->block) != WSYNC_GROUP_DRAFT)
      *draft = FALSE;
  }
  return rule;
}

/* Output tensors of a draft block (which a model's own class does not load:
 * wsync_model_begin_group()) that the source never held are left out, by the source's
 * rule, and the plan lists them as omitted.  Any other tensor the target needs and the
 * source's files were written without is part of the model itself: writing the output
 * without it would leave a checkpoint whose loader fills the gap at random, so the plan
 * is refused, naming the source, the rule and the tensors. */
static gboolean
refuse_needed_omissions(WsyncPlan *plan, GPtrArray *needed, const char *rule, GError **error)
{
  g_autofree char *list = plan_format_list(needed);

  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
              "%s: the %s layout needs %u tensor%s that the source does not hold (its files "
              "were written without %s, by rule %s): %s; convert a checkpoint that holds "
              "them instead, or a target that does not need them",
              plan->src, plan->target, needed->len, needed->len == 1 ? "" : "s",
              needed->len == 1 ? "it" : "them", rule, list);
  return FALSE;
}

/* The draft tensors left out because the source does not hold them, per rule, across
 * the output ranks: a user of convert, which prints no omitted line, learns it from a
 * note (note_draft_omissions()). */
typedef struct {
  GHashTable *names; /* char* (owned): every name counted once, whatever the rank */
  GPtrArray *rules;  /* DraftOmission*, in the order first met */
} DraftOmissions;

typedef struct {
  const char *rule;
  guint count;
  char *first;
} DraftOmission;

static void
draft_omission_free(gpointer p)
{
  DraftOmission *o = p;
  g_free(o->first);
  g_free(o);
}

static void
count_draft_omission(DraftOmissions *seen, const char *name, const char *rule)
{
  if (!g_hash_table_add(seen->names, g_strdup(name)))
    return;
  DraftOmission *o = NULL;
  for (guint i = 0; i < seen->rules->len && o == NULL; i++)
    if (strcmp(((DraftOmission *)seen->rules->pdata[i])->rule, rule) == 0)
      o = seen->rules->pdata[i];
  if (o == NULL) {
    o = g_new0(DraftOmission, 1);
    o->rule = rule;
    o->first = g_strdup(name);
    g_ptr_array_add(seen->rules, o);
  }
  o->count++;
}

static void
note_draft_omissions(WsyncPlan *plan, DraftOmissions *seen)
{
  for (guint i = 0; i < seen->rules->len; i++) {
    const DraftOmission *o = seen->rules->pdata[i];
    g_ptr_array_add(plan->notes,
                    g_strdup_printf("%u tensor%s of a draft block left out (the first: %s): "
                                    "the source's files were written without %s, by rule %s",
                                    o->count, o->count == 1 ? "" : "s", o->first,
                                    o->count == 1 ? "it" : "them", o->rule));
  }
}

static gboolean
resolve_layout(WsyncPlan *plan, WsyncLayout *layout, DraftOmissions *drafts,
               OpsBuilder *builder, GError **error)
{
  g_autoptr(GPtrArray) needed = g_ptr_array_new_with_free_func(g_free);
  const char *needed_rule = NULL;
  guint seen = 0;

  for (guint i = 0; i < layout->tensors->len;) {
    WsyncLayoutTensor *lt = layout->tensors->pdata[i];
    /* a whole model's layout takes a second or more: a signal is heard within it */
    if (++seen % PLAN_ITEMS_PER_INTERRUPT_CHECK == 0 && plan_interrupted(plan, error))
      return FALSE;
    gboolean draft;
    const char *rule = omitted_rule(plan, lt, &draft);
    if (rule != NULL && !draft) {
      needed_rule = needed_rule != NULL ? needed_rule : rule;
      g_ptr_array_add(needed, g_strdup(lt->name));
    }
    if (rule != NULL && draft)
      count_draft_omission(drafts, lt->name, rule);
    if (rule != NULL) {
      DroppedParam omitted = {NULL, g_strdup_printf("%s (not in the source: %s)", lt->name, rule)};
      g_array_append_val(layout->omitted, omitted);
      g_hash_table_remove(layout->by_name, lt->name);
      g_ptr_array_remove_index(layout->tensors, i);
      continue;
    }
    i++;
    if (!wsync_dtype_nbytes(lt->dtype, tensor_numel(lt), &lt->nbytes)) {
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_PLUGIN, "tensor \"%s\": size overflows",
                  lt->name);
      return FALSE;
    }
    for (guint p = 0; p < layout_tensor_n_placements(lt); p++) {
      Placement pl;
      layout_tensor_placement(lt, p, &pl);
      if (!resolve_placement(plan, layout, lt, &pl, builder, error))
        return FALSE;
    }
    for (guint f = 0; lt->fills != NULL && f < lt->fills->len; f++) {
      Op op = {.kind = OP_FILL, .fill = &g_array_index(lt->fills, Fill, f)};
      layout_tensor_add_op(builder, &op);
    }
    layout_tensor_seal_ops(lt, builder);
    if (!prove_coverage(layout, lt, error))
      return FALSE;
  }
  if (needed->len > 0)
    return refuse_needed_omissions(plan, needed, needed_rule, error);
  layout_forget_placements(layout); /* the ops say all that they said */
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
logical_dropped(WsyncPlan *plan, const WsyncLogicalTensor *vt, const char **rule)
{
  for (guint l = 0; l < plan->outputs->len; l++) {
    WsyncLayout *layout = plan->outputs->pdata[l];
    for (guint d = 0; d < layout->dropped->len; d++) {
      DroppedParam *dp = &g_array_index(layout->dropped, DroppedParam, d);
      for (guint p = 0; p < dp->param->n_parts; p++)
        if (dp->param->parts[p].lt == vt) {
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
gboolean
plan_check_inputs_used(WsyncPlan *plan, GError **error)
{
  g_autoptr(GPtrArray) unused = g_ptr_array_new();

  for (guint i = 0; i < plan->inputs->len; i++) {
    InputState *s = &g_array_index(plan->inputs, InputState, i);
    if (!s->bound || s->runtime_only)
      continue;
    for (guint v = 0; v < s->logical->len; v++) {
      const WsyncLogicalTensor *vt = s->logical->pdata[v];
      const char *rule = NULL;
      if (vt->used)
        continue;
      if (logical_dropped(plan, vt, &rule)) {
        s->drop_rule = rule;
        continue;
      }
      g_ptr_array_add(unused, (gpointer)s->tensor->name);
      break;
    }
  }
  if (unused->len > 0) {
    g_autofree char *list = plan_format_list(unused);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_PLUGIN,
                "%u input tensor%s would be lost: the %s layout neither holds nor drops %s: %s",
                unused->len, unused->len == 1 ? "" : "s", plan->target,
                unused->len == 1 ? "it" : "them", list);
    return FALSE;
  }
  return TRUE;
}

/* Keeps each note once, in the order first seen. */
static void
collect_notes(WsyncPlan *plan, WsyncLayout *layout)
{
  for (guint i = 0; layout->notes != NULL && i < layout->notes->len; i++)
    if (!g_ptr_array_find_with_equal_func(plan->notes, layout->notes->pdata[i], g_str_equal,
                                          NULL))
      g_ptr_array_add(plan->notes, g_strdup(layout->notes->pdata[i]));
}

static gint
compare_ordinals(gconstpointer a, gconstpointer b)
{
  const WsyncLogicalTensor *x = *(WsyncLogicalTensor *const *)a;
  const WsyncLogicalTensor *y = *(WsyncLogicalTensor *const *)b;
  return (x->ordinal > y->ordinal) - (x->ordinal < y->ordinal);
}

/* A kind of lossy cast: from, to, how many logical tensors and the first of them. */
typedef struct {
  WsyncDtype from, to;
  guint count;
  const WsyncLogicalTensor *first;
} CastKind;

/* One note per kind of lossy cast, with a count and the first tensor, in the model's
 * order: a trainer's F32 master weights written as BF16 are rounded, which the plan
 * shows op by op but a user of convert would otherwise not learn. */
static void
note_lossy_casts(WsyncPlan *plan)
{
  g_autoptr(GPtrArray) cast = g_ptr_array_new();
  g_autoptr(GArray) kinds = g_array_new(FALSE, FALSE, sizeof(CastKind));
  GHashTableIter iter;
  gpointer vt;

  g_hash_table_iter_init(&iter, plan->lossy_casts);
  while (g_hash_table_iter_next(&iter, &vt, NULL))
    g_ptr_array_add(cast, vt);
  g_ptr_array_sort(cast, compare_ordinals);
  for (guint i = 0; i < cast->len; i++) {
    const WsyncLogicalTensor *t = cast->pdata[i];
    CastKind k = {t->dtype, GPOINTER_TO_INT(g_hash_table_lookup(plan->lossy_casts, t)), 0, t};
    guint n = 0;
    while (n < kinds->len && (g_array_index(kinds, CastKind, n).from != k.from ||
                              g_array_index(kinds, CastKind, n).to != k.to))
      n++;
    if (n == kinds->len) /* a few kinds at most: between BF16, F16 and F32 */
      g_array_append_val(kinds, k);
    g_array_index(kinds, CastKind, n).count++;
  }
  for (guint n = 0; n < kinds->len; n++) {
    const CastKind *k = &g_array_index(kinds, CastKind, n);
    g_ptr_array_add(plan->notes,
                    g_strdup_printf("%u tensor%s cast %s->%s, rounded to nearest even (the "
                                    "first: %s): the %s layout holds them in %s",
                                    k->count, k->count == 1 ? "" : "s",
                                    wsync_dtype_name(k->from), wsync_dtype_name(k->to),
                                    k->first->name, plan->target, wsync_dtype_name(k->to)));
  }
}

/* Where conf.d's sync section set @key, when the value planned with (@value) is the one
 * set there: the options do not say whether it was typed, but a value that equals
 * conf.d's is conf.d's even when typed too, so naming the place is never false. */
static const char *
configured_origin(WsyncPlan *plan, const char *key, guint64 value)
{
  const char *origin = wsync_context_sync_option_origin(plan->ctx, key);
  const char *text = wsync_context_get_sync_option(plan->ctx, key);
  guint64 set;

  if (origin == NULL || text == NULL ||
      !g_ascii_string_to_unsigned(text, 10, 0, G_MAXUINT64, &set, NULL) || set != value)
    return NULL;
  return origin;
}

/* A layout refused for sizes conf.d's sync section set ("tp 3 does not divide the padded
 * vocabulary ..." from a target's build): the user, who typed no --tp, is told where tp
 * came from ("(tp 3 comes from FILE:LINE, conf.d's sync section; --tp overrides it)").
 * Only sizes above 1 are named: a size of 1 splits nothing. */
static void
name_configured_sizes(WsyncPlan *plan, guint tp, guint ep, GError **error)
{
  const struct {
    const char *key;
    guint value;
  } sizes[] = {{"tp", tp}, {"ep", ep}};
  g_autoptr(GString) places = g_string_new(NULL);
  g_autoptr(GString) flags = g_string_new(NULL);
  guint n = 0;

  if (error == NULL || *error == NULL || !g_error_matches(*error, WSYNC_ERROR, WSYNC_ERROR_USAGE))
    return;
  for (guint i = 0; i < G_N_ELEMENTS(sizes); i++) {
    const char *origin = configured_origin(plan, sizes[i].key, sizes[i].value);
    if (sizes[i].value <= 1 || origin == NULL)
      continue;
    g_string_append_printf(places, n == 0 ? "%s %u comes from %s" : " and %s %u from %s",
                           sizes[i].key, sizes[i].value, origin);
    g_string_append_printf(flags, n == 0 ? "--%s" : " and --%s", sizes[i].key);
    n++;
  }
  if (n == 0)
    return;
  char *message = g_strdup_printf("%s (%s, conf.d's sync section; %s override%s)",
                                  (*error)->message, places->str, flags->str,
                                  n == 1 ? "s it" : " them");
  g_free((*error)->message);
  (*error)->message = message;
}

gboolean
plan_build_outputs(WsyncPlan *plan, const WsyncPlanOptions *opts, GError **error)
{
  gboolean ranked = plan->out.info->world != NULL;
  guint tp = ranked ? MAX(opts->tp, 1) : 1, ep = ranked ? MAX(opts->ep, 1) : 1;
  guint world = plan_target_world(&plan->out, tp, ep);

  if (!choose_format(&plan->out, opts->format, opts->format_explicit,
                     wsync_context_sync_option_origin(plan->ctx, "format"), &plan->out_format,
                     error))
    return FALSE;
  if (opts->rank >= 0 && (guint)opts->rank >= world) {
    /* a rank conf.d set is named where it is set, as a format is */
    const char *origin = configured_origin(plan, "rank", (guint64)opts->rank);
    g_autofree char *where = origin != NULL ? g_strdup_printf("%s: sync ", origin)
                                            : g_strdup("--");
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                "%srank %d is not a rank of a %u-rank layout (tp %u, ep %u)", where, opts->rank,
                world, tp, ep);
    name_configured_sizes(plan, tp, ep, error);
    return FALSE;
  }
  plan->out_tp = tp;
  plan->out_ep = ep;
  plan->out_world = world;
  plan->outputs = g_ptr_array_new_with_free_func(plan_layout_unref);
  plan->notes = g_ptr_array_new_with_free_func(g_free);
  plan->lossy_casts = g_hash_table_new(NULL, NULL);
  DraftOmissions drafts = {g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL),
                           g_ptr_array_new_with_free_func(draft_omission_free)};
  OpsBuilder builder;
  ops_builder_init(&builder);
  gboolean ok = TRUE;
  for (guint r = 0; ok && r < world; r++) {
    if (opts->rank >= 0 && (guint)opts->rank != r)
      continue;
    if (plan_interrupted(plan, error)) {
      ok = FALSE;
      break;
    }
    WsyncLayout *layout = plan_build_layout(plan, &plan->out, plan->out_format, tp, ep, r, FALSE,
                                       NULL, NULL, error);
    if (layout == NULL) {
      name_configured_sizes(plan, tp, ep, error);
      ok = FALSE;
      break;
    }
    g_ptr_array_add(plan->outputs, layout);
    collect_notes(plan, layout);
    ok = !plan_interrupted(plan, error) && resolve_layout(plan, layout, &drafts, &builder, error);
    if (ok)
      assign_parts(layout, opts->part_size ? opts->part_size : G_MAXUINT64);
  }
  ops_builder_clear(&builder);
  if (ok)
    note_draft_omissions(plan, &drafts);
  g_hash_table_unref(drafts.names);
  g_ptr_array_unref(drafts.rules);
  if (!ok)
    return FALSE;
  note_lossy_casts(plan);
  g_clear_pointer(&plan->lossy_casts, g_hash_table_unref);
  return TRUE;
}
