/* wsync: internals of the engine (the model, layouts, the plan's copies), shared by the
 * core's own files only. */
#ifndef WSYNC_ENGINE_PRIVATE_H
#define WSYNC_ENGINE_PRIVATE_H

#include <wsync/checkpoint.h>
#include <wsync/layout.h>
#include <wsync/model.h>
#include <wsync/registry.h>
#include <wsync/target.h>

/* Where the bytes of a box of a logical tensor come from. */
typedef enum {
  SOURCE_INPUT,     /* an input tensor's bytes */
  SOURCE_GENERATED, /* synth: computed from (seed, tensor ordinal, element index) */
  SOURCE_UNDESCRIBED, /* a session: a tensor the trainer did not describe; an error only
                       * where an output needs its box */
} SourceKind;

typedef struct {
  SourceKind kind;
  guint ndim;            /* of its box and region: read them with source_geometry() */
  guint64 origin;        /* of its region */
  guint64 *axes;         /* owned: the box's offset and extent, the region's stride, ndim
                          * each (a whole model has ~19k sources: all WSYNC_MAX_DIMS axes
                          * inline would cost ~400 bytes each) */
  const WsyncTensor *input;
  guint input_index;     /* index into the plan's input list */
  const char *undescribed; /* SOURCE_UNDESCRIBED: the input layout's name for it */
} Source;

struct _WsyncLogicalTensor {
  char *name;
  WsyncDtype dtype;           /* the input's once bound, else as published */
  WsyncDtype published_dtype; /* as the model publishes it */
  gboolean dtype_from_input;  /* set once a source fixed it */
  gboolean dtype_follows_input; /* published in the input's dtype: checkpoints differ */
  guint ndim;
  guint64 shape[WSYNC_MAX_DIMS];
  guint ordinal;
  const WsyncParam *param; /* the param that holds it, or NULL */
  guint part_hint;   /* 1-based output file the source asks for (DCP -model-I-of-N), 0: none */
  guint n_parts_hint;
  GArray *sources; /* Source */
  gboolean used;   /* read by some output */
};

/* A group of blocks a deployment may switch off by a model option
 * (wsync_model_begin_switched_group()). */
typedef struct {
  char *option;        /* the option, and the rule that drops the blocks */
  gboolean on;         /* as the plan honours it */
  gboolean conf_on;    /* as conf.d sets it */
  gboolean from_files; /* on is what the source's rank files record */
} RuntimeSwitch;

struct _WsyncBlock {
  WsyncBlockKind kind;
  char *module;
  WsyncGroup group;
  char *runtime_drop;
  RuntimeSwitch *runtime_switch; /* the model's, or NULL */
  WsyncExpertsForm experts_form;
  const WsyncParam *by_role[WSYNC_ROLE_COUNT]; /* the first param of each role */
  GPtrArray *params;                           /* const WsyncParam*, in order */
};

typedef struct {
  char *rule;
  char *glob;
} DropRule;

/* An input tensor @name taken as a copy of @copy_of (wsync_model_add_copy_rule()). */
typedef struct {
  char *rule;
  char *name;
  char *copy_of;
} CopyRule;

/* A config field the remapper declared as describing the decoder layers
 * (wsync_model_declare_layer_field()). */
typedef struct {
  JsonObject *object; /* the section it is in, a ref */
  char *key;
  WsyncLayerField kind;
} LayerField;

struct _WsyncModel {
  JsonObject *config;
  char *model_type;
  char *architecture;
  char *config_name; /* the config.json's path as errors name it, or NULL */
  WsyncDtype dtype;
  GPtrArray *logical; /* WsyncLogicalTensor*, owned */
  GHashTable *logical_by_name;
  GPtrArray *params; /* WsyncParam*, owned */
  GPtrArray *blocks; /* WsyncBlock*, owned */
  GArray *drop_rules; /* DropRule */
  GArray *copy_rules; /* CopyRule */
  GArray *layer_fields; /* LayerField */
  WsyncGroup group;   /* of the blocks declared now */
  char *runtime_drop;
  RuntimeSwitch *runtime_switch; /* of the blocks declared now, or NULL */
  GPtrArray *switches;           /* RuntimeSwitch*, owned */
  GError *error;  /* the first config error a builder recorded */
  guint64 published;   /* tensors as checkpoints publish them, every expert's counted */
  gboolean spares_only; /* refused (too many tensors, or the remapper misused the API):
                          * builders hand out the spares below */
  WsyncLogicalTensor *spare_tensor;
  WsyncParam *spare_param;
  WsyncBlock *spare_block;
  char *remapper; /* "entry (plugin)" that described the model */
  char *remapper_plugin; /* the plugin alone: the conf.d section of its options */
};

/* Which box of which logical tensor a layout tensor holds, and where: the whole form,
 * read with layout_tensor_placement(). */
typedef struct {
  WsyncLogicalTensor *lt;
  WsyncBox box;
  WsyncRegion region;
} Placement;

/* A placement as a layout tensor keeps it: only its ndim axes are stored (a whole model
 * has tens of thousands of placements per rank; a Placement with all WSYNC_MAX_DIMS axes
 * is 408 bytes, this is 32 plus 24 per axis).  Both live in the layout's arena (see
 * WsyncLayout).  A region has a stride per box axis: any past the box's ndim are never
 * read. */
typedef struct {
  WsyncLogicalTensor *lt;
  guint64 *axes;  /* its box's offset and extent and its region's stride, ndim each */
  guint64 origin; /* of its region */
  guint ndim;     /* of its box */
} StoredPlacement;

typedef struct {
  WsyncBox box;
  guint8 value[16];
  gsize value_len;
  char *reason;
} Fill;

struct _WsyncLayoutTensor {
  char *name;
  WsyncDtype dtype;
  guint ndim;
  StoredPlacement *placements; /* in the layout's arena: read them with
                                * layout_tensor_placement() */
  guint n_placements, placements_cap;
  GArray *fills;      /* Fill, or NULL for none */
  const char *made_by; /* "entry (plugin)", interned (a few distinct ones per plan) */
  const WsyncParam *param; /* the param a target built it for, or NULL */
  gboolean permuted;  /* a hook swapped its last two axes */
  char *state;        /* its layout state, for the plan, or NULL */
  guint part_hint;    /* 1-based output file the source asks for, 0: none */
  guint n_parts_hint;
  /* filled by the planner */
  guint part;
  guint64 nbytes;
  struct _StoredOp *ops; /* n_ops of them, read with layout_tensor_op(), followed in the
                          * same allocation by op_axes (layout_tensor_seal_ops()) */
  guint n_ops;
  const guint64 *op_axes; /* the ops' axes (see StoredOp): each op's lbox offset, and
                           * extent and strides shared by runs of ops */
  /* its ndim axes, allocated with it (a whole model has tens of thousands of layout
   * tensors per rank, nearly all of 1 to 3 axes) */
  guint64 shape[];
};

typedef struct {
  const WsyncParam *param;
  char *rule;
} DroppedParam;

struct _WsyncLayout {
  WsyncModel *model;
  char *target;
  char *format; /* NULL for a target without named formats */
  guint tp, ep, rank, world;
  gboolean reading;
  GHashTable *input_names;    /* reading: name -> WsyncTensor* of this rank */
  GHashTable *input_metadata; /* reading: first file's __metadata__ (inputs.c: the
                               * rank's files agree on its published-dtype records) */
  GPtrArray *input_files;     /* reading, while the layout is built: the rank's files
                               * (const WsyncSafetensors*, first first), which must
                               * record what the target reads alike */
  GPtrArray *switches_asked;  /* RuntimeSwitch* the target asked about, or NULL */
  char *disagreeing_key;      /* the first key the target read that they do not */
  guint disagreeing_file;     /* the index in input_files of a file that differs */
  GPtrArray *tensors;         /* WsyncLayoutTensor*, owned */
  GHashTable *by_name;
  GArray *dropped; /* DroppedParam */
  GArray *omitted; /* DroppedParam with param NULL: output tensors the source lacks */
  GHashTable *metadata;
  WsyncContext *ctx;
  const char *current_entry; /* "entry (plugin)" running now */
  GPtrArray *notes;          /* char*: what the builders said for the plan, or NULL */
  char *needs_hook;          /* why a post-load hook must finish this layout, or NULL */
  /* The placements of its tensors and their axes, bump-allocated in blocks and freed
   * together (layout_forget_placements()): a whole model's input layout has a placement
   * or two per tensor, and an allocation each cost more than the placements did. */
  GPtrArray *arena; /* blocks, owned */
  guint8 *arena_next;
  gsize arena_left;
};

/* One operation that produces part of an output tensor. */
typedef enum {
  OP_COPY,
  OP_FILL,
} OpKind;

typedef struct {
  OpKind kind;
  guint ndim;                       /* axes of the copy */
  guint64 extent[WSYNC_MAX_DIMS];
  guint64 dst_origin;               /* element index in the output tensor */
  guint64 dst_stride[WSYNC_MAX_DIMS];
  /* OP_COPY */
  const Source *source;
  guint64 src_origin;               /* element index in the input tensor */
  guint64 src_stride[WSYNC_MAX_DIMS];
  WsyncDtype src_dtype;
  const WsyncLogicalTensor *lt;
  WsyncBox lbox;                    /* the logical box being copied, for the plan */
  /* OP_FILL */
  const Fill *fill;
} Op;

/* An op as a layout tensor keeps it: only its ndim axes are stored, in the tensor's
 * op_axes (a whole model has tens of thousands of ops per rank; an Op with all
 * WSYNC_MAX_DIMS axes is ~700 bytes, this is 48 plus 8 per axis).  An op's extent and
 * strides are those of the op before it more often than not (a rank's slice of each
 * expert in turn): such ops share one copy of them. */
typedef struct _StoredOp {
  guint8 kind;        /* OpKind */
  guint8 ndim;
  WsyncDtype src_dtype;
  guint geometry;     /* index in op_axes of its extent, dst_stride and src_stride, ndim
                       * values each (lbox's extent is the extent) */
  guint lbox;         /* index in op_axes of its lbox offset, ndim values */
  guint64 dst_origin;
  guint64 src_origin;
  const WsyncLogicalTensor *lt;
  union {
    const Source *source; /* OP_COPY */
    const Fill *fill;     /* OP_FILL */
  } from;
} StoredOp;

/* model.c */

/* Sets the box of @src (in the logical tensor's coordinates) and its region (inside the
 * input tensor). */
void source_set_geometry(Source *src, const WsyncBox *box, const WsyncRegion *region);

/* Reads them back, whole (axes past ndim are zero). */
void source_geometry(const Source *src, WsyncBox *box, WsyncRegion *region);

WsyncModel *wsync_model_new(JsonObject *config, const char *model_type);
void wsync_model_free(WsyncModel *m);

/* layout.c */
WsyncLayout *wsync_layout_new(WsyncModel *m, WsyncContext *ctx, const char *target,
                              const char *format, guint tp, guint ep, guint rank, guint world,
                              gboolean reading);
void wsync_layout_free(WsyncLayout *layout);

/* Empties the placements of every tensor of @layout, once nothing reads them again:
 * bound to sources (an input layout) or resolved into ops (an output layout).  A whole
 * model's placements cost several MiB per layout. */
void layout_forget_placements(WsyncLayout *layout);

/* The number of placements of @lt. */
guint layout_tensor_n_placements(const WsyncLayoutTensor *lt);

/* Sets @out to placement @i of @lt, whole (axes past its box's ndim are zero). */
void layout_tensor_placement(const WsyncLayoutTensor *lt, guint i, Placement *out);

/* Hands the tensors of @layout to the caller, leaving the layout none (what it dropped
 * stays): what an input layout still says once its tensors are bound to sources.
 * Reading binds each tensor and frees it at once with layout_tensor_release(), so that a
 * whole model's input layout and its sources are not held together; the array frees
 * what is left when it goes.  Their placements stay in the layout's arena until
 * layout_forget_placements(). */
GPtrArray *layout_take_tensors(WsyncLayout *layout);

/* Frees tensor @i of @tensors (from layout_take_tensors()) now. */
void layout_tensor_release(GPtrArray *tensors, guint i);

/* The ops of one layout tensor while they are made, in arrays that grow; reused from
 * tensor to tensor of a layout, so that a tensor keeps only the exact storage
 * layout_tensor_seal_ops() gives it (a whole model has tens of thousands of layout
 * tensors per rank, nearly all of one op: two growing arrays each cost more than the
 * ops, issue 14). */
typedef struct {
  GArray *ops;  /* StoredOp */
  GArray *axes; /* guint64, as WsyncLayoutTensor.op_axes */
} OpsBuilder;

void ops_builder_init(OpsBuilder *b);
void ops_builder_clear(OpsBuilder *b);

/* Appends @op to the ops being made in @b, keeping only its ndim axes. */
void layout_tensor_add_op(OpsBuilder *b, const Op *op);

/* Moves the ops made in @b into @lt (which has none yet), and empties @b. */
void layout_tensor_seal_ops(WsyncLayoutTensor *lt, OpsBuilder *b);

/* Sets @op to op @i of @lt, whole (axes past its ndim are zero). */
void layout_tensor_op(const WsyncLayoutTensor *lt, guint i, Op *op);

/* The box of a tensor of @shape that a strided walk from @origin covers, or FALSE when
 * the walk is not a box of it. */
gboolean wsync_tensor_box_of(guint ndim, const guint64 *shape, guint op_ndim,
                             const guint64 *extent, guint64 origin, const guint64 *stride,
                             WsyncBox *out);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(WsyncModel, wsync_model_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(WsyncLayout, wsync_layout_free)

#endif /* WSYNC_ENGINE_PRIVATE_H */
