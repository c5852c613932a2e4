/* wsync: the model the engine converts, as plugins describe it.
 *
 * The design in one paragraph: every layout conversion is a set of copies between boxes
 * of tensors.  A *logical tensor* (WsyncVTensor) is a tensor of the model in global
 * coordinates, as one device holding the whole model would see it (q_proj [nh*hd, H],
 * the stacked gate projections of a layer's experts [E, I, H]).  A *layout* is a set of
 * real tensors (the files of a checkpoint, one vLLM rank's tensors) each of which says,
 * with *placements*, which box of which logical tensor it holds and where (an origin and
 * a stride per axis, so slices, concatenations, stacking and transposes are all the same
 * thing), plus *fills* for bytes that come from nowhere (vocabulary padding, constant
 * scales).  A layout read from disk is a source: its placements bind logical boxes to
 * input bytes.  A layout written is a sink: its placements say what to copy where.  The
 * core resolves sinks against sources box by box, proves every output byte is written
 * exactly once and every input is used or dropped by a named rule, and copies.
 *
 * Who describes what:
 *  - a model plugin (remapper) declares the logical tensors and *params* from config.json
 *    alone (WsyncMapping), and the Hugging Face layouts of the model (target "hf",
 *    "hf-experts", "hf-fused"), which are also how a Hugging Face input is read;
 *  - a backend plugin (converter) builds the layout of one rank of its target from the
 *    params (WsyncLayout), which is also how that backend's files are read back;
 *  - a hook changes a built layout (e.g. transposes expert tensors) and records it.
 */
#ifndef WSYNC_ENGINE_H
#define WSYNC_ENGINE_H

#include <glib.h>
#include <json-glib/json-glib.h>
#include <wsync/dtype.h>
#include <wsync/plugin.h>
#include <wsync/safetensors.h>
#include <wsync/target.h>

G_BEGIN_DECLS

/* ------------------------------------------------------------------ geometry */

/**
 * WsyncBox:
 * @ndim: number of axes
 * @offset: first index on each axis
 * @extent: number of indices on each axis
 *
 * An axis-aligned box of indices of a tensor.
 */
typedef struct {
  guint ndim;
  guint64 offset[WSYNC_MAX_DIMS];
  guint64 extent[WSYNC_MAX_DIMS];
} WsyncBox;

/**
 * WsyncRegion:
 * @origin: element index of the box's first element inside the real tensor
 * @stride: element step inside the real tensor for one step along each box axis
 *
 * Where the elements of a box lie inside a real (row-major) tensor: element
 * (i_0, ..., i_n-1) of the box is element origin + sum(i_k * stride[k]).  A plain slice
 * has the tensor's own strides; a transposed placement has them permuted.
 */
typedef struct {
  guint64 origin;
  guint64 stride[WSYNC_MAX_DIMS];
} WsyncRegion;

/** wsync_box_whole: Sets @box to all of a tensor of @ndim axes and @shape. */
void wsync_box_whole(WsyncBox *box, guint ndim, const guint64 *shape);

/** wsync_box_volume: Returns: the number of elements in @box. */
guint64 wsync_box_volume(const WsyncBox *box);

/**
 * wsync_region_row_major:
 * @region: (out): the region
 * @ndim: axes of the real tensor
 * @shape: its shape
 * @at: (nullable): index of the box's first element in the tensor (NULL: all zeros)
 *
 * The region of a box placed, axes in order, inside a row-major tensor of @shape.
 */
void wsync_region_row_major(WsyncRegion *region, guint ndim, const guint64 *shape,
                            const guint64 *at);

/* ------------------------------------------------------------------ the model */

/** A logical tensor: global coordinates, model dtype. */
typedef struct _WsyncVTensor WsyncVTensor;

/** wsync_vtensor_get_name: Returns: (transfer none): its name. */
const char *wsync_vtensor_get_name(const WsyncVTensor *vt);
/** wsync_vtensor_get_dtype: Returns: its dtype (that of the source it is read from). */
WsyncDtype wsync_vtensor_get_dtype(const WsyncVTensor *vt);
/** wsync_vtensor_get_ndim: Returns: its number of axes. */
guint wsync_vtensor_get_ndim(const WsyncVTensor *vt);
/** wsync_vtensor_get_shape: Returns: (transfer none) (array length=ndim): its shape. */
const guint64 *wsync_vtensor_get_shape(const WsyncVTensor *vt);

/**
 * WsyncParamKind:
 * @WSYNC_PARAM_REPLICATED: every rank holds all of it (norms, routers, q/k norms)
 * @WSYNC_PARAM_COLUMN: its parts are concatenated along axis 0; each part is split
 *   along axis 0 across the tensor-parallel ranks (q/k/v packing, gate/up packing,
 *   plain column-parallel linears)
 * @WSYNC_PARAM_ROW: one part, split along its last axis (o_proj, down_proj)
 * @WSYNC_PARAM_VOCAB: one part, the vocabulary axis 0, padded then split
 * @WSYNC_PARAM_EXPERTS_W13: parts gate [E, I, H] then up [E, I, H]: routed experts'
 *   first projection
 * @WSYNC_PARAM_EXPERTS_W2: one part down [E, H, I]: routed experts' second projection
 * @WSYNC_PARAM_ATTENTION: no data: marks a full-attention layer (a backend may emit
 *   runtime-only tensors for it, such as vLLM's scale buffers)
 *
 * How a backend shards a param.  The vocabulary is backend-neutral: a model plugin says
 * what a tensor is, a backend says how its engine holds it.
 */
typedef enum {
  WSYNC_PARAM_REPLICATED,
  WSYNC_PARAM_COLUMN,
  WSYNC_PARAM_ROW,
  WSYNC_PARAM_VOCAB,
  WSYNC_PARAM_EXPERTS_W13,
  WSYNC_PARAM_EXPERTS_W2,
  WSYNC_PARAM_ATTENTION,
} WsyncParamKind;

/**
 * WsyncParamRole:
 * @WSYNC_ROLE_NONE: a tensor whose runtime name is @runtime_name itself
 * @WSYNC_ROLE_MOE_ROUTER: the router (gate) of a mixture-of-experts block
 * @WSYNC_ROLE_SHARED_EXPERT_GATE_UP: the packed gate/up projection of a MoE block's
 *   shared expert
 * @WSYNC_ROLE_SHARED_EXPERT_DOWN: the down projection of a MoE block's shared expert
 * @WSYNC_ROLE_SHARED_EXPERT_GATE: the sigmoid gate of a MoE block's shared expert
 * @WSYNC_ROLE_ROUTED_EXPERTS: the routed experts of a MoE block (the params of kind
 *   %WSYNC_PARAM_EXPERTS_W13 and %WSYNC_PARAM_EXPERTS_W2)
 *
 * What a param is inside its block, for the tensors whose names an engine chooses by
 * its own module structure (and changes between releases): a backend names them from
 * the param's block (see wsync_param_set_role()) and its own naming rules, instead of
 * the model plugin spelling an engine's final name.
 */
typedef enum {
  WSYNC_ROLE_NONE,
  WSYNC_ROLE_MOE_ROUTER,
  WSYNC_ROLE_SHARED_EXPERT_GATE_UP,
  WSYNC_ROLE_SHARED_EXPERT_DOWN,
  WSYNC_ROLE_SHARED_EXPERT_GATE,
  WSYNC_ROLE_ROUTED_EXPERTS,
} WsyncParamRole;

/**
 * WsyncPart:
 * @vt: the logical tensor
 * @start: first index along axis 0 of @vt that belongs to the part
 * @length: how many indices along axis 0 (0 means: to the end)
 * @unit: indices per head; a rank's share is a whole number of units
 * @replicate: when there are fewer units than ranks, ranks share units (KV heads)
 *
 * One part of a param: a range of rows of a logical tensor.  For COLUMN params the
 * part's rows are divided among the tp ranks: rank t holds units
 * [t*n/tp, (t+1)*n/tp) of its n units; with @replicate and tp > n (tp a multiple of n),
 * rank t holds unit t / (tp/n).
 */
typedef struct {
  WsyncVTensor *vt;
  guint64 start;
  guint64 length;
  guint64 unit;
  gboolean replicate;
} WsyncPart;

#define WSYNC_PARAM_MAX_PARTS 8

/**
 * WsyncParam:
 * @name: its checkpoint-style name (what `wsync plan` shows as its origin)
 * @runtime_name: the engine's parameter name; for expert params the module prefix
 *   (e.g. `model.layers.3.mlp.experts`) to which the backend appends its own names
 * @kind: how it is sharded
 * @n_parts: number of parts
 * @parts: the parts, in packing order
 * @dtype_policy: %WSYNC_DTYPE_POLICY_SOURCE keeps the source dtype; the others name the
 *   dtype the engine holds it in (see wsync_param_set_runtime_dtype())
 * @runtime_dtype: the dtype the engine holds it in when the policy says so
 * @note: (nullable): a sentence the plan prints (e.g. why a cast happens)
 * @group: (nullable): the name of a group of params a backend may drop together by a
 *   rule (e.g. "mtp", "visual")
 * @runtime_drop: (nullable): when set, the name of the rule by which every runtime
 *   target (all but the Hugging Face ones) drops this param; see
 *   wsync_param_drop_at_runtime()
 * @role: what the param is inside its block (%WSYNC_ROLE_NONE for most)
 * @block: (nullable): with a role, the runtime module path of the block it belongs to
 *   (e.g. `model.layers.3.mlp`), from which a backend builds its name
 * @aliases: (nullable) (array zero-terminated=1): other runtime names under which the
 *   engine holds the same tensor (a tied LM head is the embedding: `lm_head.weight`);
 *   see wsync_param_add_alias()
 *
 * A tensor of the running model, as a backend needs to know it.
 */
typedef struct {
  char *name;
  char *runtime_name;
  WsyncParamKind kind;
  guint n_parts;
  WsyncPart parts[WSYNC_PARAM_MAX_PARTS];
  WsyncDtype runtime_dtype;
  gboolean has_runtime_dtype;
  char *note;
  char *group;
  char *runtime_drop;
  WsyncParamRole role;
  char *block;
  char **aliases;
} WsyncParam;

/* ------------------------------------------------------------------ the mapping (remappers) */

/**
 * wsync_mapping_get_config:
 * @m: the mapping
 *
 * Returns: (transfer none): the root object of the model's config.json.
 */
JsonObject *wsync_mapping_get_config(WsyncMapping *m);

/**
 * wsync_mapping_get_model_type:
 * @m: the mapping
 *
 * Returns: (transfer none): `model_type` of config.json (the key remappers serve).
 */
const char *wsync_mapping_get_model_type(WsyncMapping *m);

/**
 * wsync_mapping_add_vtensor:
 * @m: the mapping
 * @name: unique name (by convention the checkpoint name it comes from)
 * @dtype: the dtype the model is published in
 * @ndim: axes
 * @shape: shape
 *
 * Declares a logical tensor.
 *
 * Returns: (transfer none): the logical tensor, owned by the mapping.
 */
WsyncVTensor *wsync_mapping_add_vtensor(WsyncMapping *m, const char *name, WsyncDtype dtype,
                                        guint ndim, const guint64 *shape);

/**
 * wsync_mapping_add_param:
 * @m: the mapping
 * @name: checkpoint-style name
 * @runtime_name: the engine's name (see #WsyncParam)
 * @kind: how it is sharded
 * @n_parts: 0 to %WSYNC_PARAM_MAX_PARTS
 * @parts: (array length=n_parts): its parts
 *
 * Declares a param.  The mapping copies @parts.
 *
 * Returns: (transfer none): the param, to set further fields on.
 */
WsyncParam *wsync_mapping_add_param(WsyncMapping *m, const char *name, const char *runtime_name,
                                    WsyncParamKind kind, guint n_parts, const WsyncPart *parts);

/** wsync_param_set_runtime_dtype: the engine holds @param in @dtype (a cast when they differ). */
void wsync_param_set_runtime_dtype(WsyncParam *param, WsyncDtype dtype, const char *note);

/** wsync_param_set_group: puts @param in a named group that a backend may drop by a rule. */
void wsync_param_set_group(WsyncParam *param, const char *group);

/**
 * wsync_param_drop_at_runtime:
 * @param: a param
 * @rule: the rule's name, shown in the plan (e.g. "language-model-only")
 *
 * Says that the running engine does not hold @param (a tower the deployment switches
 * off, a draft-model block the engine skips): backends drop it by @rule instead of
 * building it.  The Hugging Face layouts keep it.
 */
void wsync_param_drop_at_runtime(WsyncParam *param, const char *rule);

/**
 * wsync_param_set_role:
 * @param: a param
 * @role: what it is inside its block
 * @block: the runtime module path of the block (e.g. `model.layers.3.mlp`)
 *
 * Says what @param is inside a block whose tensors an engine names by its own module
 * structure (a MoE block's router, shared expert and routed experts).  The backend
 * builds the name from @block and its own rules; @runtime_name stays the name used
 * where the backend has no such rule.
 */
void wsync_param_set_role(WsyncParam *param, WsyncParamRole role, const char *block);

/**
 * wsync_param_add_alias:
 * @param: a param
 * @runtime_name: another runtime name of the same tensor
 *
 * Records that the engine registers @param under a second name too (tied weights: the
 * LM head that is the embedding).  A backend whose loader keeps one name of a tensor
 * registered twice chooses among the names by its own rule.
 */
void wsync_param_add_alias(WsyncParam *param, const char *runtime_name);

/**
 * wsync_mapping_add_drop_rule:
 * @m: the mapping
 * @rule: the rule's name, shown in the plan (e.g. "rotary-inv-freq")
 * @glob: a GLib pattern (g_pattern_match_simple) on input tensor names
 *
 * Input tensors that match and that no layout tensor names are consumed by @rule
 * instead of being reported as unmapped.
 */
void wsync_mapping_add_drop_rule(WsyncMapping *m, const char *rule, const char *glob);

/**
 * wsync_mapping_set_hf_layout:
 * @m: the mapping
 * @build: builds the Hugging Face layout of this model in @layout (see below)
 * @user_data: passed to @build
 *
 * The remapper's Hugging Face layout builder.  It is called with a layout whose target
 * is "hf", "hf-experts" or "hf-fused"; for "hf" it asks wsync_layout_input_has() which
 * expert form the input uses per layer, so a mixed input reads as it is.  The same
 * builder describes how to read a Hugging Face input and how to write one.
 */
void wsync_mapping_set_hf_layout(WsyncMapping *m, WsyncConvertFunc build, gpointer user_data);

/* ------------------------------------------------------------------ layouts (converters, hooks) */

/** wsync_layout_get_target: Returns: (transfer none): the target being built ("vllm", "hf", ...). */
const char *wsync_layout_get_target(WsyncLayout *layout);
/** wsync_layout_get_tp: Returns: the tensor-parallel size (1 for the hf targets). */
guint wsync_layout_get_tp(WsyncLayout *layout);
/** wsync_layout_get_ep: Returns: the expert-parallel size (1 when experts are TP-sliced). */
guint wsync_layout_get_ep(WsyncLayout *layout);
/** wsync_layout_get_rank: Returns: the rank being built, 0 <= rank < world size. */
guint wsync_layout_get_rank(WsyncLayout *layout);
/** wsync_layout_get_config: Returns: (transfer none): config.json's root object. */
JsonObject *wsync_layout_get_config(WsyncLayout *layout);
/** wsync_layout_get_model_dtype: Returns: the model's dtype (`dtype` / `torch_dtype`). */
WsyncDtype wsync_layout_get_model_dtype(WsyncLayout *layout);

/** wsync_layout_n_vtensors: Returns: the number of logical tensors of the model. */
guint wsync_layout_n_vtensors(WsyncLayout *layout);
/** wsync_layout_vtensor: Returns: (transfer none): logical tensor @index, in declaration order. */
WsyncVTensor *wsync_layout_vtensor(WsyncLayout *layout, guint index);
/** wsync_layout_lookup_vtensor: Returns: (transfer none) (nullable): the logical tensor @name. */
WsyncVTensor *wsync_layout_lookup_vtensor(WsyncLayout *layout, const char *name);

/** wsync_layout_n_params: Returns: the number of params of the model. */
guint wsync_layout_n_params(WsyncLayout *layout);
/** wsync_layout_param: Returns: (transfer none): param @index, in declaration order. */
const WsyncParam *wsync_layout_param(WsyncLayout *layout, guint index);

/**
 * wsync_layout_input_has:
 * @layout: a layout being built to read an input
 * @name: a tensor name
 *
 * Returns: %TRUE when the input has a tensor called @name; always %FALSE when the layout
 *   is built for writing.
 */
gboolean wsync_layout_input_has(WsyncLayout *layout, const char *name);

/** A real tensor of a layout. */
typedef struct _WsyncLayoutTensor WsyncLayoutTensor;

/**
 * wsync_layout_add_tensor:
 * @layout: the layout
 * @name: the tensor's name in the files
 * @dtype: its dtype
 * @ndim: axes
 * @shape: shape
 * @error: return location for a #WSYNC_ERROR_USAGE error (a duplicate name)
 *
 * Returns: (transfer none) (nullable): the tensor, or %NULL with @error set.
 */
WsyncLayoutTensor *wsync_layout_add_tensor(WsyncLayout *layout, const char *name,
                                           WsyncDtype dtype, guint ndim, const guint64 *shape,
                                           GError **error);

/**
 * wsync_layout_place:
 * @layout: the layout
 * @tensor: a tensor of it
 * @vt: a logical tensor
 * @box: the box of @vt (axes of @vt)
 * @region: where that box lies inside @tensor (axes of the box)
 *
 * Says that @tensor holds @box of @vt at @region.
 */
void wsync_layout_place(WsyncLayout *layout, WsyncLayoutTensor *tensor, WsyncVTensor *vt,
                        const WsyncBox *box, const WsyncRegion *region);

/**
 * wsync_layout_fill:
 * @layout: the layout
 * @tensor: a tensor of it
 * @box: a box of the tensor (its own axes)
 * @value: (array length=value_len): the bytes of one element, repeated over the box
 * @value_len: the element size of @tensor's dtype
 * @reason: shown in the plan, e.g. "vocabulary padding"
 *
 * Says that @box of @tensor holds a constant (zero padding, a scale of 1.0).  Reading
 * such a layout back ignores fills.
 */
void wsync_layout_fill(WsyncLayout *layout, WsyncLayoutTensor *tensor, const WsyncBox *box,
                       const guint8 *value, gsize value_len, const char *reason);

/**
 * wsync_layout_drop_param:
 * @layout: the layout
 * @param: a param this target does not hold
 * @rule: the named rule that drops it, shown in the plan (e.g. "vllm-skips-mtp")
 */
void wsync_layout_drop_param(WsyncLayout *layout, const WsyncParam *param, const char *rule);

/** wsync_layout_n_tensors: Returns: the tensors built so far. */
guint wsync_layout_n_tensors(WsyncLayout *layout);
/** wsync_layout_tensor: Returns: (transfer none): tensor @index, in the order added. */
WsyncLayoutTensor *wsync_layout_tensor(WsyncLayout *layout, guint index);
/** wsync_layout_tensor_get_name: Returns: (transfer none): the tensor's name. */
const char *wsync_layout_tensor_get_name(const WsyncLayoutTensor *tensor);

/**
 * wsync_layout_tensor_set_param:
 * @tensor: a tensor of a layout
 * @param: (nullable): the param it holds (part of)
 *
 * Records which param a backend built @tensor for, so that hooks find tensors by what
 * they are (wsync_layout_tensor_get_param()) rather than by their names.
 */
void wsync_layout_tensor_set_param(WsyncLayoutTensor *tensor, const WsyncParam *param);

/** wsync_layout_tensor_get_param: Returns: (transfer none) (nullable): the param @tensor holds. */
const WsyncParam *wsync_layout_tensor_get_param(const WsyncLayoutTensor *tensor);

/* ------------------------------------------------------------------ Hugging Face layout helpers */

/**
 * wsync_layout_add_whole:
 * @layout: the layout
 * @vt: a logical tensor
 * @dtype: the tensor's dtype
 * @error: return location for an error
 *
 * Adds a tensor of the same name and shape as @vt that holds all of it.
 *
 * Returns: %TRUE on success.
 */
gboolean wsync_layout_add_whole(WsyncLayout *layout, WsyncVTensor *vt, WsyncDtype dtype,
                                GError **error);

/**
 * wsync_layout_add_hf_experts:
 * @layout: the layout
 * @gate: stacked gate projections [E, I, H]
 * @up: stacked up projections [E, I, H]
 * @down: stacked down projections [E, H, I]
 * @prefix: the experts' module prefix with its dot, e.g. `model.layers.3.mlp.experts.`
 * @fused: the Transformers 5 fused form instead of per-expert tensors
 * @dtype: the tensors' dtype
 * @error: return location for an error
 *
 * Adds one layer's routed experts in a Transformers form: per expert,
 * `PREFIX{e}.{gate,up,down}_proj.weight` ([I, H], [I, H], [H, I]); fused,
 * `PREFIXgate_up_proj` [E, 2I, H] (gate rows first, up rows second, as Transformers'
 * Concatenate(dim=1) builds it) and `PREFIXdown_proj` [E, H, I], with no `.weight`.
 *
 * Returns: %TRUE on success.
 */
gboolean wsync_layout_add_hf_experts(WsyncLayout *layout, WsyncVTensor *gate, WsyncVTensor *up,
                                     WsyncVTensor *down, const char *prefix, gboolean fused,
                                     WsyncDtype dtype, GError **error);

/**
 * wsync_layout_tensor_set_state:
 * @layout: the layout
 * @tensor: a tensor of it
 * @state: a word for the layout the tensor's bytes are in (e.g. "processed")
 *
 * Records the tensor's layout state in the plan (`state` in the text, `layout_state`
 * in --json) and credits the running entry with the tensor.  The plugin also writes it
 * into the files' metadata if it travels with the data.
 */
void wsync_layout_tensor_set_state(WsyncLayout *layout, WsyncLayoutTensor *tensor,
                                   const char *state);

/**
 * wsync_layout_tensor_permute_last2:
 * @tensor: a 3-D or more tensor
 *
 * Swaps the tensor's last two axes, and rewrites every placement and fill into it, so
 * that it holds the same elements transposed (vLLM-Ascend's processed experts).
 */
void wsync_layout_tensor_permute_last2(WsyncLayoutTensor *tensor);

/**
 * wsync_layout_set_metadata:
 * @layout: the layout
 * @key: a `__metadata__` key of every file of this rank
 * @value: its value
 *
 * Metadata written into the rank's files (layout state travels with the data).
 */
void wsync_layout_set_metadata(WsyncLayout *layout, const char *key, const char *value);

/**
 * wsync_layout_get_input_metadata:
 * @layout: a layout being built to read an input
 * @key: a `__metadata__` key
 *
 * Returns: (transfer none) (nullable): the value the input's first file of this rank
 *   carries, or %NULL.
 */
const char *wsync_layout_get_input_metadata(WsyncLayout *layout, const char *key);

/**
 * wsync_layout_add_note:
 * @layout: a layout being built
 * @note: one sentence for the plan (e.g. which naming rules of the engine apply)
 *
 * Adds a note that `wsync plan` prints (text and --json) once, however many ranks say it.
 */
void wsync_layout_add_note(WsyncLayout *layout, const char *note);

/**
 * wsync_layout_require_hook:
 * @layout: a layout a converter is building
 * @reason: why the layout is not complete without one, e.g. "its routed experts must be
 *   transposed by a post-load hook (plugin npu-ascend)"
 *
 * Says that this target's layout is finished only by a post-load hook (a converter that
 * serves a family of targets and leaves the last step of one of them to another
 * plugin).  When no loaded hook serves the target, the plan is refused with @reason
 * instead of writing (or reading) files under the target's name in the wrong layout.
 */
void wsync_layout_require_hook(WsyncLayout *layout, const char *reason);

/**
 * wsync_layout_get_option:
 * @layout: the layout
 * @plugin_name: a plugin
 *
 * Returns: (transfer none) (nullable): the merged options of an active plugin.
 */
cfg_t *wsync_layout_get_option(WsyncLayout *layout, const char *plugin_name);

G_END_DECLS

#endif /* WSYNC_ENGINE_H */
