/* wsync: binding a plan's inputs.
 *
 * The input's files are opened and each target that recognises its own files is asked
 * which are its (rank files repeat the names of replicas rank by rank); the input's
 * layout (the target that claims every file, else the Hugging Face layout) is built for
 * reading, rank by rank, and each of its placements becomes a source of a logical tensor,
 * bound to the input tensor of the same name.  A sharded training checkpoint is bound
 * chunk by chunk, and so are the tensors (whole, or shards) a session's trainer
 * described; synth binds generated values.
 */
#include "config.h"

#include <string.h>

#include "json-check.h"
#include "plan-private.h"

/* ------------------------------------------------------------------ step 2: bind inputs */

static guint
input_index(WsyncPlan *plan, const WsyncTensor *t)
{
  return GPOINTER_TO_UINT(g_hash_table_lookup(plan->input_index, t)) - 1;
}

/* ------------------------------------------------------------------ recognising input files */

static void
plan_target_free(gpointer data)
{
  PlanTarget *t = data;

  g_free(t->label);
  g_free(t);
}

GPtrArray *
plan_claimants(WsyncContext *ctx)
{
  g_autoptr(GPtrArray) converters =
      wsync_registry_lookup(wsync_context_get_registry(ctx), WSYNC_ENTRY_CONVERTER, NULL);
  GPtrArray *claimants = g_ptr_array_new_with_free_func(plan_target_free);

  for (guint i = 0; i < converters->len; i++) {
    const WsyncTargetInfo *info = wsync_entry_get_target(converters->pdata[i]);
    if (info == NULL || info->recognise == NULL)
      continue;
    PlanTarget *t = g_new0(PlanTarget, 1);
    t->info = info;
    t->user_data = wsync_entry_get_user_data(converters->pdata[i]);
    t->label = plan_entry_label(converters->pdata[i]);
    g_ptr_array_add(claimants, t);
  }
  return claimants;
}

typedef struct {
  GPtrArray *claimants; /* PlanTarget* */
  GHashTable *files;    /* const WsyncSafetensors* -> InputFile* */
} Recognition;

/* A #WsyncFileGroupFunc: asks each target whether @st is one of its files.  The rank a
 * target gives the file is its group, since ranks repeat the names of replicas. */
static gboolean
recognise_file(const WsyncSafetensors *st, gint64 *group, gpointer user_data, GError **error)
{
  Recognition *r = user_data;
  g_autofree char *base = g_path_get_basename(wsync_safetensors_path(st));
  InputFile *f = g_new0(InputFile, 1);

  *group = -1;
  g_hash_table_insert(r->files, (gpointer)st, f);
  if (!plan_recognise(r->claimants, base, wsync_safetensors_metadata(st), &f->rank_file,
                      &f->target, error)) {
    g_prefix_error(error, "%s: ", wsync_safetensors_path(st));
    return FALSE;
  }
  if (f->target != NULL)
    *group = f->rank_file.rank;
  return TRUE;
}

gboolean
plan_recognise(GPtrArray *claimants, const char *file_name, GHashTable *metadata,
               WsyncRankFile *out, const PlanTarget **which, GError **error)
{
  *which = NULL;
  for (guint i = 0; i < claimants->len; i++) {
    const PlanTarget *t = claimants->pdata[i];
    g_autoptr(GError) local = NULL;
    if (t->info->recognise(file_name, metadata, out, t->user_data, &local)) {
      *which = t;
      return TRUE;
    }
    if (local != NULL) {
      g_propagate_error(error, g_steal_pointer(&local));
      return FALSE;
    }
  }
  return TRUE;
}

/* Opens @path, recording what the targets of @ctx recognise in each file. */
static WsyncCheckpoint *
open_recognised(WsyncContext *ctx, const char *path, Recognition *r, GError **error)
{
  r->claimants = plan_claimants(ctx);
  r->files = g_hash_table_new_full(g_direct_hash, g_direct_equal, NULL, g_free);
  return wsync_checkpoint_open_grouped(path, recognise_file, r, error);
}

/* The plan's checkpoint, with what the targets recognise in its files. */
gboolean
plan_open_input(WsyncPlan *plan, GError **error)
{
  Recognition r;

  plan->input = open_recognised(plan->ctx, plan->src, &r, error);
  plan->claimants = r.claimants;
  plan->input_files = r.files;
  return plan->input != NULL;
}

WsyncCheckpoint *
wsync_context_open_checkpoint(WsyncContext *ctx, const char *path, GError **error)
{
  Recognition r;
  WsyncCheckpoint *ck = open_recognised(ctx, path, &r, error);

  g_hash_table_unref(r.files);
  g_ptr_array_unref(r.claimants);
  return ck;
}

static const InputFile *
input_file(WsyncPlan *plan, const WsyncSafetensors *st)
{
  return g_hash_table_lookup(plan->input_files, st);
}

/* "FILE (TARGET, format FORMAT, tp 2, ep 1)" */
static char *
describe_input_file(const WsyncSafetensors *st, const InputFile *f)
{
  g_autofree char *base = g_path_get_basename(wsync_safetensors_path(st));

  if (f->target == NULL)
    return g_strdup_printf("%s (claimed by no target)", base);
  return g_strdup_printf("%s (%s%s%s, tp %u, ep %u)", base, f->target->info->name,
                         f->rank_file.format ? ", format " : "",
                         f->rank_file.format ? f->rank_file.format : "", f->rank_file.tp,
                         f->rank_file.ep);
}

static gboolean
same_layout(const InputFile *a, const InputFile *b)
{
  return a->target == b->target &&
         (a->target == NULL ||
          (g_strcmp0(a->rank_file.format, b->rank_file.format) == 0 &&
           a->rank_file.tp == b->rank_file.tp && a->rank_file.ep == b->rank_file.ep));
}

/* The input's layout: the target that claims every file (all in one format and one
 * parallel layout), or the Hugging Face layout when no target claims any. */
static gboolean
detect_input_layout(WsyncPlan *plan, GError **error)
{
  const WsyncSafetensors *first = wsync_checkpoint_file(plan->input, 0);
  const InputFile *f0 = input_file(plan, first);

  for (guint i = 1; i < wsync_checkpoint_n_files(plan->input); i++) {
    const WsyncSafetensors *st = wsync_checkpoint_file(plan->input, i);
    if (!same_layout(f0, input_file(plan, st))) {
      g_autofree char *a = describe_input_file(first, f0);
      g_autofree char *b = describe_input_file(st, input_file(plan, st));
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                  "%s: mixes files of different layouts: %s and %s", plan->src, a, b);
      return FALSE;
    }
  }
  if (f0->target == NULL) {
    plan->in_tp = plan->in_ep = plan->in_world = 1;
    if (!plan_unclaimed_reader(plan, &plan->in, error))
      return FALSE;
  } else {
    plan->in.info = f0->target->info;
    plan->in.user_data = f0->target->user_data;
    plan->in.label = g_strdup(f0->target->label);
    plan->in_format = g_strdup(f0->rank_file.format);
    plan->in_tp = f0->rank_file.tp;
    plan->in_ep = f0->rank_file.ep;
    plan->in_world = plan_target_world(&plan->in, plan->in_tp, plan->in_ep);
  }
  plan->input_target = g_strdup(plan->in.info->name);
  return TRUE;
}

/* A value of a record in a message: quoted and printable, or "absent". */
static char *
record_text(const char *value)
{
  g_autofree char *p = value != NULL ? wsync_json_printable(value) : NULL;

  return p != NULL ? g_strdup_printf("\"%s\"", p) : g_strdup("absent");
}

/* Refuses @st, a file of @rank that records @key otherwise than @first, the file the rank
 * is read with: they must record the same @what. */
static void
refuse_records(WsyncPlan *plan, const WsyncSafetensors *first, const WsyncSafetensors *st,
               const char *key, guint rank, const char *what, GError **error)
{
  GHashTable *ours = wsync_safetensors_metadata(st), *theirs = wsync_safetensors_metadata(first);
  g_autofree char *pkey = wsync_json_printable(key);
  g_autofree char *here = record_text(g_hash_table_lookup(ours, key));
  g_autofree char *there = record_text(g_hash_table_lookup(theirs, key));
  g_autofree char *group = input_file(plan, st)->target != NULL
                               ? g_strdup_printf("rank %u", rank)
                               : g_strdup("the checkpoint");
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
              "%s: metadata %s is %s, but %s in %s, another file of %s: they must record "
              "the same %s",
              wsync_safetensors_path(st), pkey, here, there, wsync_safetensors_path(first),
              group, what);
}

void
plan_refuse_different_records(WsyncPlan *plan, const WsyncSafetensors *first,
                              const WsyncSafetensors *st, const char *key, guint rank,
                              GError **error)
{
  g_autofree char *what = g_strdup_printf("value, which the %s target reads", plan->in.info->name);

  refuse_records(plan, first, st, key, rank, what, error);
}

/* Every file of a rank carries the rank's published-dtype records (exec.c writes the
 * layout's metadata into each), and the rank is read with its first file's: a file
 * @st that says otherwise than @first is refused rather than silently overruled, even
 * where no tensor of the model reads the record. */
static gboolean
check_same_records(WsyncPlan *plan, const WsyncSafetensors *first, const WsyncSafetensors *st,
                   guint rank, GError **error)
{
  const char *key = wsync_published_dtype_first_difference(wsync_safetensors_metadata(st),
                                                          wsync_safetensors_metadata(first));

  if (key == NULL)
    return TRUE;
  refuse_records(plan, first, st, key, rank, "published dtypes", error);
  return FALSE;
}

/* The input tensors and files of one rank (every file when the input has no ranks), the
 * one whose metadata the rank is read with first; the rank's other files must carry the
 * same published-dtype records (and whatever else the target reads: plan_build_layout()). */
static gboolean
rank_inputs(WsyncPlan *plan, guint rank, GHashTable **names, GPtrArray **files,
            GError **error)
{
  *names = g_hash_table_new(g_str_hash, g_str_equal);
  *files = g_ptr_array_new();
  for (guint f = 0; f < wsync_checkpoint_n_files(plan->input); f++) {
    const WsyncSafetensors *st = wsync_checkpoint_file(plan->input, f);
    const InputFile *in = input_file(plan, st);
    guint file_rank = in->target != NULL ? in->rank_file.rank : 0;
    if (file_rank >= plan->in_world) {
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                  "%s: a file of rank %u, but a %s layout of tp %u ep %u has %u ranks",
                  wsync_safetensors_path(st), file_rank, plan->input_target, plan->in_tp,
                  plan->in_ep, plan->in_world);
      return FALSE;
    }
    if (file_rank != rank)
      continue;
    if ((*files)->len > 0 && !check_same_records(plan, (*files)->pdata[0], st, rank, error))
      return FALSE;
    g_ptr_array_add(*files, (gpointer)st);
    for (guint i = 0; i < wsync_safetensors_n_tensors(st); i++) {
      const WsyncTensor *t = wsync_safetensors_tensor(st, i);
      g_hash_table_insert(*names, (gpointer)t->name, (gpointer)t);
    }
  }
  if ((*files)->len == 0) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%s: rank %u of the %u %s ranks has no file", plan->src, rank, plan->in_world,
                plan->input_target);
    return FALSE;
  }
  return TRUE;
}

/* A target that refuses what a rank's files record (wsync_layout_get_input_metadata())
 * knows the values, not the file they came from: an error about bad input that names no
 * file of the input is prefixed with the rank's first file, whose metadata the target
 * read. */
static void
name_metadata_file(WsyncPlan *plan, const char *first_path, GError **error)
{
  if (error == NULL || *error == NULL || first_path == NULL ||
      !g_error_matches(*error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT) ||
      strstr((*error)->message, plan->src) != NULL)
    return;
  g_prefix_error(error, "%s: ", first_path);
}

/* The dtype a checkpoint publishes @vt in, for a tensor whose dtype follows its input:
 * the one the input's rank records (its file held it in an engine's dtype), else the
 * dtype @t holds it in.  @layout: the input layout that names @t, or NULL. */
static gboolean
input_published_dtype(WsyncLayout *layout, const WsyncLogicalTensor *vt, const WsyncTensor *t,
                      WsyncDtype *dtype, gboolean *recorded_out, GError **error)
{
  g_autofree char *key = g_strconcat(WSYNC_PUBLISHED_DTYPE_KEY, vt->name, NULL);
  const char *recorded = layout != NULL ? wsync_layout_get_input_metadata(layout, key) : NULL;

  *dtype = t->dtype;
  *recorded_out = recorded != NULL;
  if (recorded == NULL)
    return TRUE;
  if (!wsync_dtype_from_name(recorded, dtype)) {
    g_autofree char *p = wsync_json_printable(recorded);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%s: tensor \"%s\": metadata %s is \"%s\", not a dtype", t->file, t->name, key, p);
    return FALSE;
  }
  /* only a float dtype the tensor can be cast back to (resolve.c's casts) is a record
   * wsync writes: anything else would be carried into new files, or fail far from here */
  if (*dtype != WSYNC_DTYPE_BF16 && *dtype != WSYNC_DTYPE_F16 && *dtype != WSYNC_DTYPE_F32) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%s: tensor \"%s\": metadata %s is \"%s\", not a dtype it can be published in "
                "(BF16, F16 or F32)",
                t->file, t->name, key, recorded);
    return FALSE;
  }
  return TRUE;
}

/* The dtype of a logical tensor is the dtype its input holds it in; a tensor whose dtype
 * follows its input is also published in the input's (wsync_logical_set_dtype_follows_input()). */
static gboolean
adopt_dtype(WsyncLayout *layout, WsyncLogicalTensor *vt, const WsyncTensor *t, GError **error)
{
  WsyncDtype published = vt->published_dtype;
  gboolean recorded = FALSE;

  if (vt->dtype_follows_input &&
      !input_published_dtype(layout, vt, t, &published, &recorded, error))
    return FALSE;
  if (!vt->dtype_from_input) {
    vt->dtype = t->dtype;
    vt->published_dtype = published;
    vt->dtype_from_input = TRUE;
    return TRUE;
  }
  if (vt->dtype != t->dtype) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%s: tensor \"%s\" is %s but other parts of %s are %s", t->file, t->name,
                wsync_dtype_name(t->dtype), vt->name, wsync_dtype_name(vt->dtype));
    return FALSE;
  }
  if (published != vt->published_dtype) {
    g_autofree char *here =
        recorded ? g_strdup_printf("records %s as the published dtype of %s",
                                   wsync_dtype_name(published), vt->name)
                 : g_strdup_printf("holds %s and records no published dtype of %s",
                                   wsync_dtype_name(published), vt->name);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%s: tensor \"%s\" %s, but other parts make it %s", t->file, t->name, here,
                wsync_dtype_name(vt->published_dtype));
    return FALSE;
  }
  return TRUE;
}

static gboolean
bind_tensor(WsyncPlan *plan, WsyncLayout *layout, WsyncLayoutTensor *lt, const WsyncTensor *t,
            GError **error)
{
  InputState *state = &g_array_index(plan->inputs, InputState, input_index(plan, t));
  gboolean same = lt->ndim == t->ndim;

  for (guint d = 0; same && d < t->ndim; d++)
    same = lt->shape[d] == t->shape[d];
  if (!same) {
    g_autofree char *have = wsync_shape_format(t->ndim, t->shape);
    g_autofree char *want = wsync_shape_format(lt->ndim, lt->shape);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%s: tensor \"%s\" has shape %s but the config says %s (%s)", t->file, t->name,
                have, want, lt->made_by ? lt->made_by : "layout");
    return FALSE;
  }
  state->bound = TRUE;
  state->runtime_only = layout_tensor_n_placements(lt) == 0;
  for (guint p = 0; p < layout_tensor_n_placements(lt); p++) {
    Placement placement;
    const Placement *pl = &placement;
    layout_tensor_placement(lt, p, &placement);
    Source s = {.kind = SOURCE_INPUT, .input = t, .input_index = input_index(plan, t)};
    if (!adopt_dtype(layout, pl->lt, t, error))
      return FALSE;
    source_set_geometry(&s, &pl->box, &pl->region);
    g_array_append_val(pl->lt->sources, s);
    g_ptr_array_add(state->logical, pl->lt);
  }
  return TRUE;
}

static gboolean
bind_layout(WsyncPlan *plan, WsyncLayout *layout, GHashTable *names, GPtrArray *missing,
            GError **error)
{
  /* the sources say all that the tensors said (resolving reads only what the layout
   * dropped): each tensor goes once bound */
  g_autoptr(GPtrArray) tensors = layout_take_tensors(layout);

  for (guint i = 0; i < tensors->len; i++) {
    WsyncLayoutTensor *lt = tensors->pdata[i];
    const WsyncTensor *t = g_hash_table_lookup(names, lt->name);
    if (t == NULL)
      g_ptr_array_add(missing, g_strdup(lt->name));
    else if (!bind_tensor(plan, layout, lt, t, error))
      return FALSE;
    layout_tensor_release(tensors, i);
  }
  layout_forget_placements(layout);
  return TRUE;
}

static const char *
drop_rule_for(WsyncPlan *plan, const char *name)
{
  for (guint r = 0; r < plan->model->drop_rules->len; r++) {
    DropRule *rule = &g_array_index(plan->model->drop_rules, DropRule, r);
    if (g_pattern_match_simple(rule->glob, name))
      return rule->rule;
  }
  return NULL;
}

static void
input_state_clear(gpointer data)
{
  InputState *s = data;
  g_ptr_array_unref(s->logical);
}

static const CopyRule *
copy_rule_for(WsyncPlan *plan, const char *name)
{
  for (guint r = 0; r < plan->model->copy_rules->len; r++) {
    const CopyRule *rule = &g_array_index(plan->model->copy_rules, CopyRule, r);
    if (strcmp(rule->name, name) == 0)
      return rule;
  }
  return NULL;
}

/* What a copy rule compares: a tensor's dtype and its whole shape. */
typedef struct {
  WsyncDtype dtype;
  guint ndim;
  const guint64 *shape;
} Header;

/* The header of the input tensor @name as the source holds it: from @globals (name ->
 * WsyncDcpTensor*) when its inputs are chunks of global tensors, else from the input
 * tensor of that name, the one in @file first (rank files repeat names).  FALSE when the
 * source holds none. */
static gboolean
input_header(WsyncPlan *plan, GHashTable *globals, const char *name, const char *file,
             Header *out)
{
  const WsyncTensor *found = NULL;

  if (globals != NULL) {
    const WsyncDcpTensor *g = g_hash_table_lookup(globals, name);
    if (g == NULL)
      return FALSE;
    *out = (Header){g->dtype, g->ndim, g->shape};
    return TRUE;
  }
  for (guint i = 0; i < plan->inputs->len; i++) {
    const WsyncTensor *t = g_array_index(plan->inputs, InputState, i).tensor;
    if (strcmp(t->name, name) != 0)
      continue;
    if (found == NULL || g_strcmp0(t->file, file) == 0)
      found = t;
    if (g_strcmp0(t->file, file) == 0)
      break;
  }
  if (found == NULL)
    return FALSE;
  *out = (Header){found->dtype, found->ndim, found->shape};
  return TRUE;
}

/* @s, an input tensor no layout tensor names, is what @rule says: a copy of another
 * input tensor, of the same dtype and shape.  An engine that ties the two keeps only one
 * (docs/vllm.md §3), so two tensors that differ in either are refused; their values are
 * not compared (a plan reads headers only). */
static gboolean
check_copy(WsyncPlan *plan, GHashTable *globals, const InputState *s, const CopyRule *rule,
           GError **error)
{
  Header self = {s->tensor->dtype, s->tensor->ndim, s->tensor->shape}, other;
  gboolean held, same;

  if (globals != NULL) /* @s is a chunk: its global tensor's header */
    input_header(plan, globals, rule->name, NULL, &self);
  held = input_header(plan, globals, rule->copy_of, s->tensor->file, &other);
  same = held && self.dtype == other.dtype && self.ndim == other.ndim;
  for (guint d = 0; same && d < self.ndim; d++)
    same = self.shape[d] == other.shape[d];
  if (same)
    return TRUE;
  g_autofree char *self_shape = wsync_shape_format(self.ndim, self.shape);
  g_autofree char *other_text = NULL;
  if (held) {
    g_autofree char *other_shape = wsync_shape_format(other.ndim, other.shape);
    other_text = g_strdup_printf("\"%s\" is %s %s", rule->copy_of,
                                 wsync_dtype_name(other.dtype), other_shape);
  } else {
    other_text = g_strdup_printf("the source holds no \"%s\"", rule->copy_of);
  }
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
              "%s: input tensor \"%s\" is %s %s but %s: rule %s of %s takes the first for a "
              "copy of the second (the model ties them), and an engine keeps only one of two "
              "different tensors",
              plan->src, rule->name, wsync_dtype_name(self.dtype), self_shape, other_text,
              rule->rule, plan->model->remapper);
  return FALSE;
}

/* After binding: every tensor the input layout names must exist, and every input tensor
 * no layout tensor names must be consumed by a copy rule or a drop rule (a name counted
 * once, however many chunks or ranks hold it).  @globals: see input_header(). */
static gboolean
check_bound(WsyncPlan *plan, GPtrArray *missing, GHashTable *globals, GError **error)
{
  g_autoptr(GPtrArray) unmapped = g_ptr_array_new();
  g_autoptr(GHashTable) seen = g_hash_table_new(g_str_hash, g_str_equal);

  if (missing->len > 0) {
    g_autofree char *list = plan_format_list(missing);
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
    const CopyRule *copy = copy_rule_for(plan, s->tensor->name);
    if (copy != NULL) {
      if (!check_copy(plan, globals, s, copy, error))
        return FALSE;
      s->drop_rule = copy->rule;
      s->copy_of = copy->copy_of;
      continue;
    }
    s->drop_rule = drop_rule_for(plan, s->tensor->name);
    if (s->drop_rule == NULL && g_hash_table_add(seen, (gpointer)s->tensor->name))
      g_ptr_array_add(unmapped, (gpointer)s->tensor->name);
  }
  if (unmapped->len > 0) {
    g_autofree char *list = plan_format_list(unmapped);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%s: %u input tensor%s no rule of %s maps: %s", plan->src, unmapped->len,
                unmapped->len == 1 ? "" : "s", plan->model->remapper, list);
    return FALSE;
  }
  return TRUE;
}

gboolean
plan_bind_inputs(WsyncPlan *plan, GError **error)
{
  g_autoptr(GPtrArray) missing = g_ptr_array_new_with_free_func(g_free);

  plan->inputs = g_array_new(FALSE, TRUE, sizeof(InputState));
  g_array_set_clear_func(plan->inputs, input_state_clear);
  plan->input_index = g_hash_table_new(g_direct_hash, g_direct_equal);
  for (guint i = 0; i < wsync_checkpoint_n_tensors(plan->input); i++) {
    InputState s = {.tensor = wsync_checkpoint_tensor(plan->input, i),
                    .logical = g_ptr_array_new()};
    g_array_append_val(plan->inputs, s);
    g_hash_table_insert(plan->input_index, (gpointer)s.tensor, GUINT_TO_POINTER(i + 1));
  }
  if (!detect_input_layout(plan, error))
    return FALSE;
  plan->input_layouts = g_ptr_array_new_with_free_func(plan_layout_unref);
  for (guint r = 0; r < plan->in_world; r++) {
    g_autoptr(GHashTable) names = NULL;
    g_autoptr(GPtrArray) files = NULL;
    if (!rank_inputs(plan, r, &names, &files, error))
      return FALSE;
    WsyncLayout *layout = plan_build_layout(plan, &plan->in, plan->in_format, plan->in_tp,
                                       plan->in_ep, r, TRUE, names, files, error);
    if (layout == NULL) {
      name_metadata_file(plan, wsync_safetensors_path(files->pdata[0]), error);
      return FALSE;
    }
    g_ptr_array_add(plan->input_layouts, layout);
    if (!bind_layout(plan, layout, names, missing, error))
      return FALSE;
    /* bound: the rank's names were for its target's build and the binding only (a whole
     * model's table is ~40 bytes a tensor, alive while the outputs are resolved) */
    g_clear_pointer(&layout->input_names, g_hash_table_unref);
  }
  g_clear_pointer(&plan->input_index, g_hash_table_unref); /* likewise */
  return check_bound(plan, missing, NULL, error);
}

/* synth: every logical tensor has one generated source covering all of it. */
void
plan_bind_generated(WsyncPlan *plan)
{
  plan->inputs = g_array_new(FALSE, TRUE, sizeof(InputState));
  for (guint i = 0; i < plan->model->logical->len; i++) {
    WsyncLogicalTensor *vt = plan->model->logical->pdata[i];
    Source s = {.kind = SOURCE_GENERATED};
    WsyncBox box;
    WsyncRegion region;
    wsync_box_whole(&box, vt->ndim, vt->shape);
    wsync_region_row_major(&region, vt->ndim, vt->shape, NULL);
    source_set_geometry(&s, &box, &region);
    g_array_append_val(vt->sources, s);
  }
}


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
collect_chunks(WsyncPlan *plan, GPtrArray *globals)
{
  plan->chunk_tensors = g_ptr_array_new_with_free_func(g_free);
  plan->inputs = g_array_new(FALSE, TRUE, sizeof(InputState));
  g_array_set_clear_func(plan->inputs, input_state_clear);
  plan->input_index = g_hash_table_new(g_direct_hash, g_direct_equal);
  for (guint i = 0; i < globals->len; i++) {
    const WsyncDcpTensor *g = globals->pdata[i];
    for (guint c = 0; c < wsync_dcp_tensor_n_chunks(g); c++) {
      WsyncDcpChunk buf;
      const WsyncDcpChunk *chunk = wsync_dcp_tensor_chunk(g, c, &buf);
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
      InputState st = {.tensor = t, .logical = g_ptr_array_new()};
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
    g_autofree char *have = wsync_shape_format(g->ndim, g->shape);
    g_autofree char *want = wsync_shape_format(lt->ndim, lt->shape);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%s: tensor \"%s\" has shape %s but the config says %s (%s)", plan->src, g->name,
                have, want, lt->made_by ? lt->made_by : "layout");
    return FALSE;
  }
  for (guint c = 0; c < wsync_dcp_tensor_n_chunks(g); c++) {
    WsyncDcpChunk buf;
    const WsyncDcpChunk *chunk = wsync_dcp_tensor_chunk(g, c, &buf);
    InputState *state = &g_array_index(plan->inputs, InputState, first_input + c);
    state->bound = TRUE;
    state->runtime_only = layout_tensor_n_placements(lt) == 0;
    for (guint p = 0; p < layout_tensor_n_placements(lt); p++) {
      Placement placement;
      const Placement *pl = &placement;
      layout_tensor_placement(lt, p, &placement);
      WsyncBox tb, ib;
      gint axis_of[WSYNC_MAX_DIMS];
      if (!placement_axes(lt, pl, &tb, axis_of)) {
        g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_PLUGIN,
                    "%s: a placement into tensor \"%s\" is not a box inside it", lt->made_by,
                    lt->name);
        return FALSE;
      }
      if (!wsync_box_intersect(&tb, &chunk->box, &ib) || wsync_box_volume(&ib) == 0)
        continue;
      Source src = {.kind = SOURCE_INPUT, .input = state->tensor,
                    .input_index = first_input + c};
      WsyncBox box = pl->box;
      WsyncRegion region = {0};
      for (guint d = 0; d < g->ndim; d++)
        region.origin += (ib.offset[d] - chunk->box.offset[d]) * chunk->region.stride[d];
      for (guint k = 0; k < pl->box.ndim; k++) {
        gint d = axis_of[k];
        region.stride[k] = d >= 0 ? chunk->region.stride[d] : 0;
        if (d >= 0) {
          box.offset[k] = pl->box.offset[k] + ib.offset[d] - tb.offset[d];
          box.extent[k] = ib.extent[d];
        }
      }
      if (!adopt_dtype(NULL, pl->lt, state->tensor, error))
        return FALSE;
      source_set_geometry(&src, &box, &region);
      g_array_append_val(pl->lt->sources, src);
      g_ptr_array_add(state->logical, pl->lt);
    }
  }
  return TRUE;
}

/* A session: a tensor of the input layout the trainer did not describe is an error only
 * where an output needs it (the target may drop it, e.g. vLLM the MTP block), so each of
 * its placements becomes a source that resolving refuses by name. */
static void
bind_undescribed(WsyncLayoutTensor *lt)
{
  for (guint p = 0; p < layout_tensor_n_placements(lt); p++) {
    Placement placement;
    const Placement *pl = &placement;
    layout_tensor_placement(lt, p, &placement);
    Source src = {.kind = SOURCE_UNDESCRIBED, .undescribed = lt->name};
    source_set_geometry(&src, &pl->box, &pl->region);
    g_array_append_val(pl->lt->sources, src);
  }
}

/* Binds each of @tensors (of the input layout) to the chunks of the global tensor of its
 * name in @names.  Outside a session each tensor is released once bound (@tensors is
 * then the layout's, taken with layout_take_tensors()). */
static gboolean
bind_globals(WsyncPlan *plan, GPtrArray *tensors, GHashTable *names, GHashTable *first_input,
             GPtrArray *missing, GError **error)
{
  gboolean session = plan->kind == PLAN_SESSION;

  for (guint i = 0; i < tensors->len; i++) {
    WsyncLayoutTensor *lt = tensors->pdata[i];
    const WsyncDcpTensor *g = g_hash_table_lookup(names, lt->name);
    if (g == NULL && session)
      bind_undescribed(lt);
    else if (g == NULL)
      g_ptr_array_add(missing, g_strdup(lt->name));
    else if (!bind_tensor_chunks(plan, lt, g,
                                 GPOINTER_TO_UINT(g_hash_table_lookup(first_input, lt->name)),
                                 error))
      return FALSE;
    if (!session)
      layout_tensor_release(tensors, i);
  }
  return TRUE;
}

/* Global tensors (WsyncDcpTensor*) hold the published names of the model, each as
 * chunks that are boxes of it: they are read through the layout of the target that
 * reads unclaimed files (the Hugging Face layout), chunk by chunk.  A sharded checkpoint
 * gives its tensors; a session the tensors the trainer described. */
gboolean
plan_bind_chunked(WsyncPlan *plan, GPtrArray *globals, GError **error)
{
  g_autoptr(GHashTable) names = g_hash_table_new(g_str_hash, g_str_equal);
  g_autoptr(GPtrArray) missing = g_ptr_array_new_with_free_func(g_free);
  g_autoptr(GHashTable) first_input = g_hash_table_new(g_str_hash, g_str_equal);
  guint at = 0;

  collect_chunks(plan, globals);
  for (guint i = 0; i < globals->len; i++) {
    const WsyncDcpTensor *g = globals->pdata[i];
    g_hash_table_insert(names, g->name, (gpointer)g);
    g_hash_table_insert(first_input, g->name, GUINT_TO_POINTER(at));
    at += wsync_dcp_tensor_n_chunks(g);
  }
  plan->in_tp = plan->in_ep = plan->in_world = 1;
  if (plan_interrupted(plan, error) || !plan_unclaimed_reader(plan, &plan->in, error))
    return FALSE;
  plan->input_target = g_strdup(plan->in.info->name);
  plan->input_layouts = g_ptr_array_new_with_free_func(plan_layout_unref);
  WsyncLayout *layout =
      plan_build_layout(plan, &plan->in, NULL, 1, 1, 0, TRUE, names, NULL, error);
  if (layout == NULL)
    return FALSE;
  g_ptr_array_add(plan->input_layouts, layout);
  if (plan_interrupted(plan, error)) /* the input layout alone takes a while */
    return FALSE;
  if (plan->kind == PLAN_SESSION) {
    /* a session's undescribed sources keep the names of its tensors */
    if (!bind_globals(plan, layout->tensors, names, first_input, missing, error))
      return FALSE;
    layout_forget_placements(layout);
  } else {
    /* the sources say all that the tensors said: each tensor goes once bound */
    g_autoptr(GPtrArray) tensors = layout_take_tensors(layout);
    if (!bind_globals(plan, tensors, names, first_input, missing, error))
      return FALSE;
    layout_forget_placements(layout);
  }
  return check_bound(plan, missing, names, error);
}

/* A sharded training checkpoint, bound chunk by chunk. */
gboolean
plan_bind_dcp(WsyncPlan *plan, GError **error)
{
  g_autoptr(GPtrArray) globals = g_ptr_array_new();

  for (guint i = 0; i < wsync_dcp_n_tensors(plan->dcp); i++)
    g_ptr_array_add(globals, (gpointer)wsync_dcp_tensor(plan->dcp, i));
  return plan_bind_chunked(plan, globals, error);
}
