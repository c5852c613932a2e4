/* wsync: planning and executing a conversion, the library's main operation.
 *
 * A plan is made from headers alone: the model plugin that claims config.json's
 * model_type describes the model, the input's files are bound to it (a Hugging Face
 * checkpoint, a sharded training checkpoint, or rank files a target recognises), the
 * target's build function lays out every requested rank, and every output byte is
 * resolved to its source and proven covered exactly once.  Executing it writes the files
 * into a directory atomically.  `wsync plan`, `convert`, `merge` and `synth` are this.
 */
#ifndef WSYNC_PLAN_H
#define WSYNC_PLAN_H

#include <signal.h>
#include <stdio.h>

#include <glib.h>
#include <json-glib/json-glib.h>
#include <wsync/api.h>
#include <wsync/checkpoint.h>
#include <wsync/registry.h>

G_BEGIN_DECLS

/** A planned conversion. */
typedef struct _WsyncPlan WsyncPlan;

/**
 * WsyncPlanOptions:
 * @target: the target to write (`hf`, `vllm`, ...)
 * @format: (nullable): one of the target's formats, or %NULL for its default
 * @format_explicit: @format was asked for by the user (a target without named formats
 *   then refuses it); a default from configuration is ignored by such targets
 * @tp: tensor-parallel size (0 means 1)
 * @ep: expert-parallel size (0 means 1)
 * @rank: the only rank to build, or -1 for every rank
 * @part_size: start a new file before a tensor that would pass this many bytes; 0: no
 *   limit
 * @threads: worker threads when executing; 0: one per core
 * @select: (nullable): for a sharded training checkpoint (PyTorch DCP) whose saved state
 *   dict holds more than the model's (its optimizer beside it): the key of the model's
 *   state dict, a dotted path ("app.model"; "." for the top level); only the entries
 *   directly under it are read, named without it.  %NULL: such a checkpoint is refused,
 *   naming its keys.  Other sources refuse it
 * @config: (nullable): where the model's config.json is, in place of the source's own:
 *   a directory that holds config.json, or the path of a file named config.json.  The
 *   companion files (tokenizer, generation config, chat template: what an engine reads
 *   beside the weights) are then copied from that directory, and none from the source.
 *   Any source takes it (a sharded checkpoint, which holds none, or weights saved
 *   without one).  %NULL: the source's own (a sharded checkpoint's, or the one in the
 *   directory that holds it).  Read by wsync_plan_new() and wsync_plan_new_merge() only
 * @interrupt: (nullable): a flag that a signal handler sets to the signal's number, heard
 *   from the start of planning: when it becomes nonzero, wsync_plan_new(),
 *   wsync_plan_new_merge() and wsync_plan_new_synth() stop between the steps of planning
 *   (a whole model takes seconds) and fail with "planning was interrupted by SIGINT"
 *   (#WSYNC_ERROR_IO); the plan they return hears it too, as wsync_plan_set_interrupt()
 * @reserved: room for growth; zero
 *
 * What to plan.  Zero-initialise it and set what you need.
 */
typedef struct {
  const char *target;
  const char *format;
  gboolean format_explicit;
  guint tp;
  guint ep;
  gint rank;
  guint64 part_size;
  guint threads;
  const char *select;
  const char *config;
  const volatile sig_atomic_t *interrupt;
  gpointer reserved[5];
} WsyncPlanOptions;

/**
 * wsync_plan_new:
 * @ctx: the context (plugins, configuration)
 * @src: a checkpoint directory or file, a sharded training checkpoint (PyTorch DCP), or
 *   a directory of rank files a target recognises
 * @opts: what to plan
 * @error: return location for an error (exit classes: #WsyncError)
 *
 * Plans the conversion of @src; reads no tensor data.
 *
 * Returns: (transfer full) (nullable): the plan, or %NULL with @error set.
 */
WSYNC_API WsyncPlan *wsync_plan_new(WsyncContext *ctx, const char *src,
                                    const WsyncPlanOptions *opts, GError **error);

/**
 * wsync_plan_new_merge:
 * @ctx: the context
 * @src: a sharded training checkpoint
 * @opts: @target is ignored (the layout the shards name is written); @part_size and
 *   @threads apply
 * @error: return location for an error
 *
 * Plans consolidating a sharded checkpoint into a plain one, every tensor as it is.
 *
 * Returns: (transfer full) (nullable): the plan, or %NULL with @error set.
 */
WSYNC_API WsyncPlan *wsync_plan_new_merge(WsyncContext *ctx, const char *src,
                                          const WsyncPlanOptions *opts, GError **error);

/**
 * wsync_plan_new_synth:
 * @ctx: the context
 * @config: the model's config.json (its root object)
 * @config_name: what messages call it (its path)
 * @opts: what to write
 * @seed: the seed of the generated values
 * @pattern_index: every element's bytes encode its tensor and position instead of
 *   random values (for tests)
 * @error: return location for an error
 *
 * Plans writing generated weights with the real names, shapes and dtypes of a model.
 *
 * Returns: (transfer full) (nullable): the plan, or %NULL with @error set.
 */
WSYNC_API WsyncPlan *wsync_plan_new_synth(WsyncContext *ctx, JsonNode *config,
                                          const char *config_name, const WsyncPlanOptions *opts,
                                          guint64 seed, gboolean pattern_index, GError **error);

/**
 * wsync_config_trim_layers:
 * @ctx: the context
 * @config: the model's config.json (its root object); rewritten in place
 * @config_name: what messages call it (its path)
 * @layers: how many decoder layers to keep, at least 1
 * @model_layers: (out) (optional): the model's layers as its config counts them, or 0
 *   when that is not known (the config was refused, or the remapper counts none)
 * @error: return location for an error
 *
 * Rewrites @config to describe the model's first @layers decoder layers, by the fields
 * the remapper that claims its model_type declared (wsync_model_declare_layer_field()):
 * what `wsync synth --layers` writes.  Refused (#WSYNC_ERROR_USAGE) when the model has
 * fewer layers, or when its remapper declares no layer count; a config the remapper
 * refuses is refused as it would be by wsync_plan_new_synth().
 *
 * Returns: %TRUE when @config was rewritten.
 */
WSYNC_API gboolean wsync_config_trim_layers(WsyncContext *ctx, JsonNode *config,
                                            const char *config_name, guint64 layers,
                                            guint64 *model_layers, GError **error);

/** wsync_plan_free: @plan: (nullable): frees it. */
WSYNC_API void wsync_plan_free(WsyncPlan *plan);

/**
 * WsyncExecuteFlags:
 * @WSYNC_EXECUTE_NONE: nothing special
 * @WSYNC_EXECUTE_PROGRESS: print progress on stderr
 * @WSYNC_EXECUTE_FORCE: replace an existing DST even when it is not wsync's own output
 *
 * How wsync_plan_execute() runs.
 */
typedef enum {
  WSYNC_EXECUTE_NONE = 0,
  WSYNC_EXECUTE_PROGRESS = 1 << 0,
  WSYNC_EXECUTE_FORCE = 1 << 1,
} WsyncExecuteFlags;

/**
 * WSYNC_OUTPUT_MARKER:
 *
 * The file that marks a directory as wsync's complete output: the last file written
 * into the temporary directory before it is swapped into place.
 */
#define WSYNC_OUTPUT_MARKER ".wsync-output"

/**
 * wsync_plan_execute:
 * @plan: a plan
 * @dst: the directory to write
 * @flags: how
 * @error: return location for an error
 *
 * Writes the planned files into @dst, atomically: into a temporary sibling (mode from
 * the user's umask), swapped into place only when complete, the parent synced; the
 * source's companion files (config.json through the config patchers, tokenizer files)
 * go with them.
 *
 * @dst is refused (#WSYNC_ERROR_USAGE, naming it) when it is the source, lies inside it
 * or contains it (compared by device and inode, however the paths are spelled), is a
 * symlink or not a directory, or is a directory that is neither empty nor wsync's own
 * output (it holds #WSYNC_OUTPUT_MARKER) unless %WSYNC_EXECUTE_FORCE.  The previous @dst
 * is then removed without following any symlink; temporaries that earlier runs left
 * (killed) beside @dst are removed when no run holds them.
 *
 * Returns: %TRUE on success; on failure an existing @dst is untouched.
 */
WSYNC_API gboolean wsync_plan_execute(WsyncPlan *plan, const char *dst, WsyncExecuteFlags flags,
                                      GError **error);

/**
 * wsync_plan_set_interrupt:
 * @plan: a plan
 * @flag: (nullable): a flag that a signal handler sets to the signal's number, or %NULL
 *
 * When @flag becomes nonzero during wsync_plan_execute(), the run stops at the next
 * piece of work, removes its temporary directory and fails with an error naming the
 * signal; @dst stays as it was.
 */
WSYNC_API void wsync_plan_set_interrupt(WsyncPlan *plan, const volatile sig_atomic_t *flag);

/**
 * wsync_plan_print:
 * @plan: a plan
 * @out: where to
 *
 * Prints the plan for people: every output tensor of every rank, where each of its
 * regions comes from, and the rules that dropped or omitted anything.
 */
WSYNC_API void wsync_plan_print(WsyncPlan *plan, FILE *out);

/**
 * wsync_plan_to_json:
 * @plan: a plan
 *
 * Returns: (transfer full): the plan as data (what `wsync plan --json` prints).
 */
WSYNC_API JsonNode *wsync_plan_to_json(WsyncPlan *plan);

/**
 * wsync_plan_get_notes:
 * @plan: a plan
 * @n_notes: (out): how many notes there are
 *
 * What the targets, the hooks and the planner said about the plan, each once, in the
 * order said: how to load the output, which naming rules of the engine apply, which
 * tensors are rounded by a cast.  `wsync plan` and `wsync convert` print them as "note:"
 * lines.
 *
 * Returns: (transfer none) (array length=n_notes): the notes, valid as long as @plan.
 */
WSYNC_API const char *const *wsync_plan_get_notes(WsyncPlan *plan, guint *n_notes);

/** wsync_plan_total_bytes: Returns: the bytes of tensor data the plan writes. */
WSYNC_API guint64 wsync_plan_total_bytes(WsyncPlan *plan);

/**
 * wsync_context_open_checkpoint:
 * @ctx: a context
 * @path: a safetensors file or a checkpoint directory
 * @error: return location for an error
 *
 * wsync_checkpoint_open() for directories that may hold the rank files of a target,
 * which repeat the names of replicated tensors rank by rank: the targets of @ctx say
 * which rank each file belongs to.
 *
 * Returns: (transfer full) (nullable): the checkpoint, or %NULL with @error set.
 */
WSYNC_API WsyncCheckpoint *wsync_context_open_checkpoint(WsyncContext *ctx, const char *path,
                                                         GError **error);

/**
 * wsync_config_load:
 * @path: a model's config.json
 * @error: return location for an error
 *
 * Reads a config.json as every command does: a regular file of at most 16 MiB, through
 * the checks wsync applies to every JSON it reads (nesting depth, duplicate keys), whose
 * top level must be an object.  A missing file or bad content is #WSYNC_ERROR_BAD_INPUT,
 * and so is a socket, a FIFO or a device ("PATH: is a socket, not a regular file"); a
 * failing read is #WSYNC_ERROR_IO; the message names @path.
 *
 * Returns: (transfer full) (nullable): the root node, or %NULL with @error set.
 */
WSYNC_API JsonNode *wsync_config_load(const char *path, GError **error);

/**
 * wsync_context_patch_config:
 * @ctx: a context
 * @root: a parsed config.json (its root is an object), changed in place
 * @error: return location for an error
 *
 * Runs every config patcher, in dispatch order.
 *
 * Returns: %TRUE when none failed.
 */
WSYNC_API gboolean wsync_context_patch_config(WsyncContext *ctx, JsonNode *root,
                                              GError **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(WsyncPlan, wsync_plan_free)

G_END_DECLS

#endif /* WSYNC_PLAN_H */
