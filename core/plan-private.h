/* wsync: the plan's internals, shared by the files that make, print and execute it. */
#ifndef WSYNC_PLAN_PRIVATE_H
#define WSYNC_PLAN_PRIVATE_H

#include <json-glib/json-glib.h>
#include <wsync/plan.h>

#include "dcp.h"
#include "engine-private.h"

/* What a plan is made from, beyond its public options. */
typedef enum {
  PLAN_CONVERT, /* a checkpoint, rank files or a sharded checkpoint, through the model */
  PLAN_MERGE,   /* a sharded checkpoint, every tensor as it is */
  PLAN_SYNTH,   /* generated values */
  PLAN_SESSION, /* tensors a trainer described, pushed later (core/session.c) */
} PlanKind;

/* A target the plan builds (or reads) layouts of. */
typedef struct {
  const WsyncTargetInfo *info;
  gpointer user_data;
  char *label; /* who builds it, for made_by: "converter NAME (plugin PLUGIN)" */
} PlanTarget;

/* What a target recognised in an input file. */
typedef struct {
  const PlanTarget *target; /* NULL: no target claimed it */
  WsyncRankFile rank_file;
} InputFile;

typedef struct {
  const WsyncTensor *tensor;
  gboolean bound;        /* a layout tensor of the input names it */
  gboolean runtime_only; /* it holds no model data (e.g. scale buffers) */
  GPtrArray *logical;    /* logical tensors it holds part of */
  const char *drop_rule; /* consumed by this rule instead */
  const char *copy_of;   /* ... as a copy of this input tensor (a copy rule) */
} InputState;

struct _WsyncPlan {
  WsyncContext *ctx;
  PlanKind kind;
  char *src;
  char *target;
  guint64 seed;           /* synth */
  gboolean pattern_index; /* synth: element bytes encode (tensor ordinal, element index) */
  guint threads;
  JsonNode *config;
  WsyncCheckpoint *input;
  WsyncDcp *dcp;            /* a sharded training checkpoint as the source */
  GPtrArray *chunk_tensors; /* WsyncTensor*, one per DCP chunk or described shard, owned */
  gboolean no_config;       /* the source has no config.json (merge): write none */
  char *model_dir;          /* where config.json and the companion files are read: the
                             * source directory, the one above a DCP directory, or the
                             * one --config names */
  gboolean config_given;    /* model_dir is --config's (WsyncPlanOptions.config) */
  WsyncModel *model;
  char *input_target;      /* the input's target name */
  PlanTarget in;           /* the target that reads the input */
  char *in_format;         /* its format, NULL for one without named formats */
  guint in_tp, in_ep, in_world;
  GPtrArray *claimants;    /* PlanTarget*: the targets that recognise files, owned */
  GHashTable *input_files; /* const WsyncSafetensors* -> InputFile*, owned */
  GPtrArray *input_layouts; /* WsyncLayout*, reading */
  GArray *inputs;           /* InputState */
  GHashTable *input_index;  /* WsyncTensor* -> index + 1 */
  PlanTarget out;           /* the target written */
  char *out_format;         /* its format, NULL for one without named formats */
  guint out_tp, out_ep, out_world;
  GPtrArray *outputs; /* WsyncLayout*, one per rank written */
  GPtrArray *notes;   /* char*: what targets and hooks said about the plan, once each */
  GHashTable *lossy_casts; /* WsyncLogicalTensor* -> WsyncDtype it is rounded to, while
                            * the outputs are resolved (the notes then say it) */
  const volatile sig_atomic_t *interrupted; /* wsync_plan_set_interrupt() */
};

/* plan.c */
WsyncPlan *plan_new_session(WsyncContext *ctx, const char *config_path,
                            const WsyncPlanOptions *opts, GError **error);
gboolean plan_session_bind(WsyncPlan *plan, const WsyncPlanOptions *opts, GPtrArray *described,
                           GError **error);
char *plan_entry_label(const WsyncEntry *e);
char *plan_format_list(GPtrArray *names);
char *plan_file_name(WsyncPlan *plan, const WsyncLayout *layout, guint part);
void plan_layout_unref(gpointer data);

/* plan-print.c */
/* The members "target", "format" (null without named formats), "tp" and "ep" of the
 * layout written, as every JSON report states them. */
void plan_json_add_layout(JsonBuilder *b, const WsyncPlan *plan);

/* describe.c */
gboolean plan_describe(WsyncPlan *plan, const char *config_name, GError **error);

/* TRUE with @error set ("planning was interrupted by SIGINT", WSYNC_ERROR_IO as the run's
 * interruption) when the plan's interrupt flag (wsync_plan_set_interrupt(), which a
 * session's wsync_session_set_interrupt() sets too) is set: checked between the phases
 * of planning, so that a plan of a whole model (seconds) stops within a fraction of it. */
gboolean plan_interrupted(const WsyncPlan *plan, GError **error);
/* exec.c: for tests, raises a signal at a named moment when the environment asks
 * (WSYNC_TEST_SIGNAL_AFTER=@phase: SIGTERM, when @interrupted is watched;
 * WSYNC_TEST_SIGNAL_AT=@point: SIGINT) */
void plan_signal_if_asked(const volatile sig_atomic_t *interrupted, const char *phase,
                          const char *point);
/* Items (tensors) a long loop of planning handles between two plan_interrupted() checks */
#define PLAN_ITEMS_PER_INTERRUPT_CHECK 4096
void plan_describe_identity(WsyncPlan *plan);

/* resolve.c */
/* The plan's note for a runtime switch @sw the source's rank files decided against
 * conf.d; @plugin: the remapper's plugin, NULL for one without (no conf.d section). */
char *plan_switch_note(const RuntimeSwitch *sw, const char *plugin);

/* inputs.c */
gboolean plan_open_input(WsyncPlan *plan, GError **error);
/* Every target that recognises its own files (PlanTarget*), in dispatch order. */
GPtrArray *plan_claimants(WsyncContext *ctx);
/* Asks each of @claimants whether @file_name (with its safetensors @metadata) is one of
 * its files: *@which is the first that says so (and @out what it read), or NULL.  FALSE
 * only with an error: a file a target claims but cannot read. */
gboolean plan_recognise(GPtrArray *claimants, const char *file_name, GHashTable *metadata,
                        WsyncRankFile *out, const PlanTarget **which, GError **error);
gboolean plan_bind_inputs(WsyncPlan *plan, GError **error);
/* Refuses @st, a file of @rank whose metadata @key differs from @first's, the file the
 * rank's records are read from (a bad-input error naming both files and values). */
void plan_refuse_different_records(WsyncPlan *plan, const WsyncSafetensors *first,
                                   const WsyncSafetensors *st, const char *key, guint rank,
                                   GError **error);
gboolean plan_bind_dcp(WsyncPlan *plan, GError **error);
gboolean plan_bind_chunked(WsyncPlan *plan, GPtrArray *globals, GError **error);
void plan_bind_generated(WsyncPlan *plan);

/* resolve.c */
void plan_box_subtract(const WsyncBox *u, const WsyncBox *cut, GArray *out);
gboolean plan_find_target(WsyncPlan *plan, const char *name, PlanTarget *out, GError **error);
gboolean plan_unclaimed_reader(WsyncPlan *plan, PlanTarget *out, GError **error);
guint plan_target_world(const PlanTarget *t, guint tp, guint ep);
WsyncLayout *plan_build_layout(WsyncPlan *plan, const PlanTarget *t, const char *format,
                               guint tp, guint ep, guint rank, gboolean reading,
                               GHashTable *input_names, GPtrArray *input_files,
                               GError **error);
gboolean plan_build_outputs(WsyncPlan *plan, const WsyncPlanOptions *opts, GError **error);
gboolean plan_check_inputs_used(WsyncPlan *plan, GError **error);

#endif /* WSYNC_PLAN_PRIVATE_H */
