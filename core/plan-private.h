/* wsync: the plan's internals, shared by plan.c and exec.c. */
#ifndef WSYNC_PLAN_PRIVATE_H
#define WSYNC_PLAN_PRIVATE_H

#include "dcp.h"
#include "plan.h"

typedef struct {
  const WsyncTensor *tensor;
  gboolean bound;        /* a layout tensor of the input names it */
  gboolean runtime_only; /* it holds no model data (e.g. scale buffers) */
  GPtrArray *vtensors;   /* logical tensors it holds part of */
  const char *drop_rule; /* consumed by this rule instead */
} InputState;

/* A target the plan builds (or reads) layouts of. */
typedef struct {
  const WsyncTargetInfo *info;
  gpointer user_data;
  char *label; /* who builds it, for made_by: "converter vllm (plugin vllm)" */
} PlanTarget;

/* What a target recognised in an input file. */
typedef struct {
  const PlanTarget *target; /* NULL: no target claimed it */
  WsyncRankFile rank_file;
} InputFile;

struct _WsyncPlan {
  WsyncContext *ctx;
  char *src;
  char *target;
  gboolean synth;
  guint64 seed;
  gboolean pattern_index;
  guint threads;
  JsonNode *config;
  WsyncCheckpoint *input;
  WsyncDcp *dcp;             /* a sharded training checkpoint as the source */
  GPtrArray *chunk_tensors;  /* WsyncTensor*, one per DCP chunk, owned */
  gboolean merge;            /* no model: every DCP tensor as it is */
  gboolean no_config;        /* the source has no config.json (merge): write none */
  WsyncMapping *mapping;
  char *input_target;   /* the input's target name */
  PlanTarget in;        /* the target that reads the input */
  char *in_format;      /* its format, NULL for one without named formats */
  guint in_tp, in_ep, in_world;
  GPtrArray *claimants; /* PlanTarget*: the targets that recognise files, owned */
  GHashTable *input_files; /* const WsyncSafetensors* -> InputFile*, owned */
  GPtrArray *input_layouts; /* WsyncLayout*, reading */
  GArray *inputs;           /* InputState */
  GHashTable *input_index;  /* WsyncTensor* -> index + 1 */
  PlanTarget out;     /* the target written */
  char *out_format;   /* its format, NULL for one without named formats */
  guint out_tp, out_ep, out_world;
  GPtrArray *outputs; /* WsyncLayout*, one per rank written */
  GPtrArray *notes;   /* char*: what targets and hooks said about the plan, once each */
};

/* The box of a tensor that a strided walk covers, or FALSE when it is not a box. */
gboolean wsync_tensor_box_of(guint ndim, const guint64 *shape, guint op_ndim,
                             const guint64 *extent, guint64 origin, const guint64 *stride,
                             WsyncBox *out);

char *wsync_plan_file_name(WsyncPlan *plan, const WsyncLayout *layout, guint part);

#endif /* WSYNC_PLAN_PRIVATE_H */
