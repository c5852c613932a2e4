/* wsync: the plan of a conversion, built from headers alone, and its execution. */
#ifndef WSYNC_PLAN_H
#define WSYNC_PLAN_H

#include <json-glib/json-glib.h>

#include "engine-private.h"

typedef struct {
  const char *target;
  guint tp, ep;
  gint rank;          /* -1: every rank */
  guint64 part_size;  /* bytes; a new part starts before a tensor that would pass it */
  guint threads;
  /* synth: no source checkpoint; every logical tensor is generated */
  gboolean synth;
  guint64 seed;
  gboolean pattern_index; /* element bytes encode (tensor ordinal, element index) */
  JsonNode *synth_config; /* the config to describe (already trimmed to --layers) */
  /* merge: SRC is a sharded training checkpoint, written as it is (no model plugin) */
  gboolean merge;
} WsyncPlanOptions;

typedef struct _WsyncPlan WsyncPlan;

/* Opens SRC (a checkpoint directory, a file, or rank files), describes the model with
 * the remapper that claims its model_type, binds the inputs, builds the target layout
 * of every requested rank, resolves every output byte to its source and proves the
 * coverage.  No tensor data is read. */
WsyncPlan *wsync_plan_new(WsyncContext *ctx, const char *src, const WsyncPlanOptions *opts,
                          GError **error);
void wsync_plan_free(WsyncPlan *plan);

/* The plan, for people and for scripts. */
void wsync_plan_print(WsyncPlan *plan, FILE *out);
JsonNode *wsync_plan_to_json(WsyncPlan *plan);

/* How wsync_plan_execute() treats DST and the terminal. */
typedef struct {
  gboolean progress; /* progress lines on stderr */
  gboolean force;    /* replace an existing DST even when it is not wsync's own output */
  /* When not NULL and it becomes nonzero (a signal handler stores the signal number),
   * the run stops at the next piece of work, removes its temporary directory and fails
   * with an error saying so; DST is left as it was. */
  const volatile sig_atomic_t *interrupted;
} WsyncExecOptions;

/* Writes the planned files into DST, atomically (temporary sibling, then rename), with
 * the source's companion files (config.json through the config patchers).
 *
 * DST is refused (#WSYNC_ERROR_USAGE, naming it) when it is SRC, lies inside SRC or
 * contains SRC (compared by device and inode, however the paths are spelled), is a
 * symlink or not a directory, or is a directory that is neither empty nor wsync's own
 * output (it holds WSYNC_OUTPUT_MARKER) unless @opts->force.  The marker is the last
 * file written into the temporary directory before it is swapped into place; the
 * previous DST is then removed without following any symlink. */
gboolean wsync_plan_execute(WsyncPlan *plan, const char *dst, const WsyncExecOptions *opts,
                            GError **error);

/* The file that marks a directory as wsync's output (written last, see above). */
#define WSYNC_OUTPUT_MARKER ".wsync-output"

/* Runs every config patcher on @root; TRUE when none failed. */
gboolean wsync_run_config_patchers(WsyncContext *ctx, JsonNode *root, GError **error);

guint64 wsync_plan_total_bytes(WsyncPlan *plan);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(WsyncPlan, wsync_plan_free)

#endif /* WSYNC_PLAN_H */
