/* wsync: a plan (<wsync/plan.h>): made from headers alone, in five steps.
 *
 * 1. describe (describe.c): the remapper that claims config.json's model_type describes
 *    the model;
 * 2. bind (inputs.c): the layout that describes the input (Hugging Face, or the target
 *    that recognises rank files) is built for reading, and each of its placements
 *    becomes a source of a logical tensor, bound to the input tensor of the same name;
 * 3. build (resolve.c): the target's build function lays out each output rank, then the
 *    hooks that serve the target run on it;
 * 4. resolve (resolve.c): each placement of an output tensor is cut into copies from the
 *    sources of its logical tensor; a box no source covers is an error;
 * 5. prove (resolve.c): the copies and fills of every output tensor must tile it exactly,
 *    and every input tensor must be used, or dropped by a named rule.
 *
 * Printing is in plan-print.c, executing in exec.c; a session (session.c) runs the copies
 * of each input when a trainer pushes it.
 */
#define _GNU_SOURCE /* realpath */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "files.h"
#include "plan-private.h"

/* wsync_config_load() of @path: a socket, which cannot even be opened, is refused in
 * the words of a FIFO by wsync_file_open_regular() under it. */
static JsonNode *
load_config(const char *path, GError **error)
{
  return wsync_config_load(path, error);
}

/* ------------------------------------------------------------------ plan object */

void
plan_layout_unref(gpointer data)
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
  wsync_model_free(plan->model);
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
  if (plan->input_files)
    g_hash_table_unref(plan->input_files);
  if (plan->claimants)
    g_ptr_array_unref(plan->claimants);
  if (plan->notes)
    g_ptr_array_unref(plan->notes);
  if (plan->lossy_casts)
    g_hash_table_unref(plan->lossy_casts);
  g_free(plan->in.label);
  g_free(plan->out.label);
  g_free(plan->in_format);
  g_free(plan->out_format);
  g_free(plan->src);
  g_free(plan->model_dir);
  g_free(plan->target);
  g_free(plan->input_target);
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

const char *const *
wsync_plan_get_notes(WsyncPlan *plan, guint *n_notes)
{
  g_return_val_if_fail(plan != NULL && n_notes != NULL, NULL);
  *n_notes = plan->notes != NULL ? plan->notes->len : 0;
  return plan->notes != NULL ? (const char *const *)plan->notes->pdata : NULL;
}

/* "converter NAME (plugin PLUGIN)" */
char *
plan_entry_label(const WsyncEntry *e)
{
  return g_strdup_printf("%s %s (plugin %s)", wsync_entry_kind_name(wsync_entry_get_kind(e)),
                         wsync_entry_get_name(e), wsync_entry_get_plugin(e));
}

/* Lists up to 8 names, then "and N more". */
char *
plan_format_list(GPtrArray *names)
{
  GString *s = g_string_new(NULL);

  for (guint i = 0; i < names->len && i < 8; i++)
    g_string_append_printf(s, "%s%s", i ? ", " : "", (const char *)names->pdata[i]);
  if (names->len > 8)
    g_string_append_printf(s, " and %u more", names->len - 8);
  return g_string_free(s, FALSE);
}

/* How many files a rank's layout has: its parts, or what the source asks for. */
static guint
layout_n_parts(const WsyncLayout *layout)
{
  guint n_parts = 1;

  for (guint i = 0; i < layout->tensors->len; i++) {
    const WsyncLayoutTensor *lt = layout->tensors->pdata[i];
    n_parts = MAX(n_parts, MAX(lt->part + 1, lt->n_parts_hint));
  }
  return n_parts;
}

/* The target names its files. */
char *
plan_file_name(WsyncPlan *plan, const WsyncLayout *layout, guint part)
{
  return plan->out.info->file_name((WsyncLayout *)layout, part, layout_n_parts(layout),
                                   plan->out.user_data);
}

static WsyncPlan *
plan_alloc(WsyncContext *ctx, PlanKind kind, const char *src, const WsyncPlanOptions *opts)
{
  WsyncPlan *plan = g_new0(WsyncPlan, 1);

  plan->ctx = ctx;
  plan->kind = kind;
  plan->src = g_strdup(src);
  plan->target = g_strdup(opts->target);
  plan->threads = opts->threads > 0 ? opts->threads : g_get_num_processors();
  plan->interrupted = opts->interrupt; /* planning hears it (plan_interrupted()) */
  return plan;
}

/* The layout written: the target asked for, or for merge the Hugging Face layout (the
 * target that reads files no target claims). */
static gboolean
choose_output(WsyncPlan *plan, GError **error)
{
  if (plan->kind == PLAN_MERGE) {
    if (!plan_unclaimed_reader(plan, &plan->out, error))
      return FALSE;
    g_free(plan->target);
    plan->target = g_strdup(plan->out.info->name);
    return TRUE;
  }
  return plan_find_target(plan, plan->target, &plan->out, error);
}

/* The directory of the model's config.json (and its companion files) for the sharded
 * checkpoint @src: @src itself when it holds config.json, else the directory that holds
 * @src when that one does, else NULL.  A trainer saves a DCP checkpoint as one directory
 * of a step's directory (the model's beside the optimizer's), and the model's config.json
 * and tokenizer beside them, not inside (docs/dcp.md §3, "Where config.json is"); only
 * the one level above is looked at, and the plan says so in a note. */
static char *
parent_dir(const char *path)
{
  g_autofree char *trimmed = g_strdup(path);
  gsize n = strlen(trimmed);

  while (n > 1 && trimmed[n - 1] == G_DIR_SEPARATOR) /* "step/dcp/": step, not step/dcp */
    trimmed[--n] = '\0';
  /* "." (SRC given from inside the checkpoint), "step/dcp/." or "x/..": the name's
   * dirname is the directory itself or another one; the real path's is the one above */
  g_autofree char *base = g_path_get_basename(trimmed);
  if (strcmp(base, ".") == 0 || strcmp(base, "..") == 0) {
    g_autofree char *real = realpath(trimmed, NULL);
    if (real != NULL)
      return g_path_get_dirname(real);
  }
  return g_path_get_dirname(trimmed);
}

static char *
sharded_model_dir(const char *src)
{
  g_autofree char *here = g_build_filename(src, "config.json", NULL);
  g_autofree char *parent = parent_dir(src);
  g_autofree char *above = g_build_filename(parent, "config.json", NULL);

  if (g_file_test(here, G_FILE_TEST_EXISTS))
    return g_strdup(src);
  if (g_file_test(above, G_FILE_TEST_EXISTS))
    return g_steal_pointer(&parent);
  return NULL;
}

/* --config PATH (WsyncPlanOptions.config): the directory of the model's config.json,
 * PATH itself or, for a file named config.json, the directory that holds it.  A file by
 * another name is refused: the companion files are copied from the directory of
 * config.json, and a directory of several models' configs would give the wrong
 * tokenizer.  The config.json itself is parsed (and refused naming it) when the plan
 * reads it. */
static gboolean
take_config_option(WsyncPlan *plan, const char *path, GError **error)
{
  g_autofree char *ppath = wsync_printable(path);
  g_autofree char *base = g_path_get_basename(path);
  struct stat st;

  if (stat(path, &st) != 0) {
    /* a path that is not there is the I/O error a missing SRC is (exit 4); one there but
     * of the wrong kind (below) is a usage error */
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_IO, "--config %s: %s", ppath,
                g_strerror(errno));
    return FALSE;
  }
  if (S_ISDIR(st.st_mode)) {
    g_autofree char *config = g_build_filename(path, "config.json", NULL);
    if (!g_file_test(config, G_FILE_TEST_EXISTS)) {
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                  "--config %s: the directory holds no config.json; name the directory of "
                  "the model's config.json (and tokenizer), or that file",
                  ppath);
      return FALSE;
    }
    plan->model_dir = g_strdup(path);
  } else if (strcmp(base, "config.json") == 0)
    plan->model_dir = g_path_get_dirname(path);
  else {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                "--config %s: neither a directory nor a file named config.json; name the "
                "directory of the model's config.json (its companion files, the tokenizer, "
                "are copied from there), or that config.json",
                ppath);
    return FALSE;
  }
  plan->config_given = TRUE;
  return TRUE;
}

/* When config.json came from elsewhere than the source (--config, or the directory
 * above the sharded checkpoint): a note, first, naming it (plan, convert and merge
 * print the notes; --json lists them). */
static void
note_model_dir(WsyncPlan *plan)
{
  if (plan->no_config || (!plan->config_given && strcmp(plan->model_dir, plan->src) == 0))
    return;
  g_autofree char *config = g_build_filename(plan->model_dir, "config.json", NULL);
  g_ptr_array_insert(plan->notes, 0,
                     plan->config_given
                         ? g_strdup_printf("config.json from %s, as --config names it; the "
                                           "companion files (tokenizer, generation config) "
                                           "from there too, none from the source",
                                           config)
                         : g_strdup_printf("config.json from %s, the directory that holds the "
                                           "sharded checkpoint (which has none); the companion "
                                           "files (tokenizer, generation config) from there too",
                                           config));
}

/* A refusal of the tensors (a shape the config does not give, a tensor missing) when
 * config.json came from elsewhere than the source: it says which config.json they were
 * held against, the likeliest thing wrong (--config naming another model's).  Returns
 * FALSE. */
static gboolean
name_config_in_error(WsyncPlan *plan, GError **error)
{
  gboolean elsewhere = plan->config_given || (plan->dcp != NULL && !plan->no_config &&
                                              strcmp(plan->model_dir, plan->src) != 0);

  if (!elsewhere || error == NULL || *error == NULL || plan_interrupted(plan, NULL))
    return FALSE; /* an interruption is no refusal of the tensors */
  g_autofree char *config = g_build_filename(plan->model_dir, "config.json", NULL);
  g_autofree char *pconfig = wsync_printable(config);
  char *message = g_strdup_printf("%s; the config is %s%s", (*error)->message, pconfig,
                                  plan->config_given ? ", as --config names it" : "");
  g_free((*error)->message);
  (*error)->message = message;
  return FALSE;
}

/* A sharded training checkpoint: consolidated on the fly, through the model's layout
 * (convert, plan) or as it is (merge).  Its config.json, beside the shards or one
 * directory up, is optional for merge. */
static gboolean
plan_sharded(WsyncPlan *plan, const WsyncPlanOptions *opts, GError **error)
{
  gboolean merge = plan->kind == PLAN_MERGE;

  WsyncDcpOpenOptions dcp_opts = {.select = opts->select};
  plan->dcp = wsync_dcp_open_with(plan->src, &dcp_opts, error);
  if (plan->dcp == NULL || !wsync_dcp_check_coverage(plan->dcp, error))
    return FALSE;
  if (!plan->config_given)
    plan->model_dir = sharded_model_dir(plan->src);
  if (plan->model_dir == NULL && !merge) {
    g_autofree char *parent = parent_dir(plan->src);
    g_autofree char *psrc = wsync_printable(plan->src);
    g_autofree char *pparent = wsync_printable(parent);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%s: no config.json, neither beside the shards nor in %s, the directory "
                "that holds them: name the model's directory (its config.json and "
                "tokenizer) with --config DIR, or put its config.json in one of the two",
                psrc, pparent);
    return FALSE;
  }
  if (plan->model_dir == NULL)
    plan->model_dir = g_strdup(plan->src);
  g_autofree char *config_path = g_build_filename(plan->model_dir, "config.json", NULL);
  if (merge && !g_file_test(config_path, G_FILE_TEST_EXISTS)) {
    g_autoptr(JsonObject) empty = json_object_new();
    plan->config = json_node_init_object(json_node_alloc(), empty);
    plan->no_config = TRUE;
  } else if ((plan->config = load_config(config_path, error)) == NULL)
    return FALSE;
  if (plan_interrupted(plan, error))
    return FALSE;
  if (merge)
    plan_describe_identity(plan);
  else if (!plan_describe(plan, config_path, error))
    return FALSE;
  if (plan_interrupted(plan, error) || !choose_output(plan, error))
    return FALSE;
  if (!plan_bind_dcp(plan, error) || plan_interrupted(plan, error) ||
      !plan_build_outputs(plan, opts, error) || plan_interrupted(plan, error) ||
      !plan_check_inputs_used(plan, error))
    return name_config_in_error(plan, error);
  note_model_dir(plan);
  return TRUE;
}

/* A checkpoint directory or file, or rank files: config.json beside it, or where
 * --config names it. */
static gboolean
plan_checkpoint(WsyncPlan *plan, const WsyncPlanOptions *opts, GError **error)
{
  g_autofree char *config_path = NULL;

  /* each step of planning a whole model takes a fraction of its seconds: a signal is
   * heard between them (plan_interrupted()) */
  if (plan_interrupted(plan, error) || !plan_open_input(plan, error) ||
      plan_interrupted(plan, error))
    return FALSE;
  if (plan->config_given)
    config_path = g_build_filename(plan->model_dir, "config.json", NULL);
  else if (wsync_checkpoint_is_dir(plan->input))
    config_path = g_build_filename(plan->src, "config.json", NULL);
  else {
    g_autofree char *dir = g_path_get_dirname(plan->src);
    config_path = g_build_filename(dir, "config.json", NULL);
  }
  if (plan->model_dir == NULL)
    plan->model_dir = g_path_get_dirname(config_path);
  plan->config = load_config(config_path, error);
  if (plan->config == NULL || !plan_describe(plan, config_path, error) ||
      plan_interrupted(plan, error) || !choose_output(plan, error))
    return FALSE;
  if (!plan_bind_inputs(plan, error) || plan_interrupted(plan, error) ||
      !plan_build_outputs(plan, opts, error) || plan_interrupted(plan, error) ||
      !plan_check_inputs_used(plan, error))
    return name_config_in_error(plan, error);
  if (plan->config_given) /* a file's directory is no model directory: no note without */
    note_model_dir(plan);
  return TRUE;
}

static WsyncPlan *
plan_convert(WsyncContext *ctx, const char *src, const WsyncPlanOptions *opts, GError **error)
{
  g_autoptr(WsyncPlan) plan = plan_alloc(ctx, PLAN_CONVERT, src, opts);

  if (!wsync_dcp_detect(src) && opts->select != NULL) {
    /* only a DCP records the object paths --select names */
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                "%s: --select applies to a sharded training checkpoint (PyTorch DCP), and "
                "this is none", src);
    return NULL;
  }
  if (opts->config != NULL && !take_config_option(plan, opts->config, error))
    return NULL;
  plan_signal_if_asked(plan->interrupted, "planning began", "planning");
  if (wsync_dcp_detect(src) ? !plan_sharded(plan, opts, error)
                            : !plan_checkpoint(plan, opts, error))
    return NULL;
  return g_steal_pointer(&plan);
}

static WsyncPlan *
plan_merge(WsyncContext *ctx, const char *src, const WsyncPlanOptions *opts, GError **error)
{
  g_autoptr(WsyncPlan) plan = plan_alloc(ctx, PLAN_MERGE, src, opts);

  if (!wsync_dcp_detect(src)) {
    struct stat st;
    if (stat(src, &st) != 0) { /* as convert and inspect say it of a SRC not there */
      wsync_set_io_error(error, errno, src, "open");
      return NULL;
    }
    g_autofree char *hint = wsync_dcp_below_hint(src);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%s: not a sharded checkpoint (no shard-*-model-*-of-*.safetensors, here or in "
                "sharded/, no .metadata, no __R.metadata and no __R_K.distcp)%s",
                src, hint);
    return NULL;
  }
  if (opts->config != NULL && !take_config_option(plan, opts->config, error))
    return NULL;
  plan_signal_if_asked(plan->interrupted, "planning began", "planning");
  if (!plan_sharded(plan, opts, error))
    return NULL;
  return g_steal_pointer(&plan);
}

/* A session (core/session.c), made in two steps: the model of @config_path and the
 * target, at once; the trainer's tensors later, with plan_session_bind().  Messages call
 * the source "session". */
WsyncPlan *
plan_new_session(WsyncContext *ctx, const char *config_path, const WsyncPlanOptions *opts,
                 GError **error)
{
  g_autoptr(WsyncPlan) plan = plan_alloc(ctx, PLAN_SESSION, "session", opts);

  /* the caller named it: missing is an I/O error, as on the command line */
  plan->config = wsync_config_load_named(config_path, error);
  if (plan->config == NULL || !plan_describe(plan, config_path, error) ||
      !choose_output(plan, error))
    return NULL;
  return g_steal_pointer(&plan);
}

/* Binds the global tensors (WsyncDcpTensor*, owned by the caller, outliving the plan)
 * the trainer described, whose chunks hold no data yet, and plans the outputs. */
gboolean
plan_session_bind(WsyncPlan *plan, const WsyncPlanOptions *opts, GPtrArray *described,
                  GError **error)
{
  plan_signal_if_asked(plan->interrupted, "binding began", "binding");
  return !plan_interrupted(plan, error) && plan_bind_chunked(plan, described, error) &&
         !plan_interrupted(plan, error) &&
         plan_build_outputs(plan, opts, error) && !plan_interrupted(plan, error) &&
         plan_check_inputs_used(plan, error);
}

static WsyncPlan *
plan_synth(WsyncContext *ctx, JsonNode *config, const char *config_name,
           const WsyncPlanOptions *opts, guint64 seed, gboolean pattern_index, GError **error)
{
  g_autoptr(WsyncPlan) plan = plan_alloc(ctx, PLAN_SYNTH, config_name, opts);

  plan->seed = seed;
  plan->pattern_index = pattern_index;
  plan->config = json_node_copy(config);
  plan_signal_if_asked(plan->interrupted, "planning began", "planning");
  if (plan_interrupted(plan, error) || !plan_describe(plan, config_name, error) ||
      plan_interrupted(plan, error) || !choose_output(plan, error))
    return NULL;
  plan_bind_generated(plan);
  if (plan_interrupted(plan, error) || !plan_build_outputs(plan, opts, error))
    return NULL;
  return g_steal_pointer(&plan);
}

/* Every refusal of the planner is one printable line, whatever a plugin, a config value
 * or a file's metadata put into it. */
static WsyncPlan *
printable(WsyncPlan *plan, GError **error)
{
  if (plan == NULL && error != NULL && *error != NULL)
    wsync_error_make_printable(*error);
  return plan;
}

WsyncPlan *
wsync_plan_new(WsyncContext *ctx, const char *src, const WsyncPlanOptions *opts,
               GError **error)
{
  return printable(plan_convert(ctx, src, opts, error), error);
}

WsyncPlan *
wsync_plan_new_merge(WsyncContext *ctx, const char *src, const WsyncPlanOptions *opts,
                     GError **error)
{
  return printable(plan_merge(ctx, src, opts, error), error);
}

WsyncPlan *
wsync_plan_new_synth(WsyncContext *ctx, JsonNode *config, const char *config_name,
                     const WsyncPlanOptions *opts, guint64 seed, gboolean pattern_index,
                     GError **error)
{
  return printable(plan_synth(ctx, config, config_name, opts, seed, pattern_index, error),
                   error);
}

void
wsync_plan_set_interrupt(WsyncPlan *plan, const volatile sig_atomic_t *flag)
{
  plan->interrupted = flag;
}

gboolean
plan_interrupted(const WsyncPlan *plan, GError **error)
{
  int sig = plan->interrupted != NULL ? *plan->interrupted : 0;
  const char *name = sig > 0 ? sigabbrev_np(sig) : NULL;

  if (sig == 0)
    return FALSE;
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_IO, "planning was interrupted by %s%s",
              name != NULL ? "SIG" : "a signal", name != NULL ? name : "");
  return TRUE;
}
