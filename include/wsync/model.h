/* wsync: describing a model, for model plugins (remappers).
 *
 * A model plugin reads config.json and describes the model in the names of its
 * published (Hugging Face) checkpoints, as the building blocks decoder models are made
 * of: embeddings (with tying), attention (q/k/v/o, optional q/k norms and output gate),
 * gated MLPs, mixture-of-experts blocks (router, routed experts in per-expert or fused
 * form, shared expert), Gated DeltaNet linear attention, norms, and any other tensor a
 * model has.  It says nothing about any engine: targets (backends) decide how their
 * engine packs, names, slices and types each part (see <wsync/layout.h>).
 *
 * Every block declares
 *  - *logical tensors* (#WsyncLogicalTensor): tensors of the model in global
 *    coordinates, named and typed as published (the routed experts of a layer as three
 *    stacked tensors gate [E, I, H], up [E, I, H], down [E, H, I]);
 *  - *params* (#WsyncParam): how the running model holds each of them: which kind of
 *    parallel layer (replicated, column, row, vocabulary, experts), in which units (a
 *    head), and what the param is inside its block (#WsyncRole).
 *
 * Config readers (wsync_config_get_uint() and friends) give every plugin the same
 * checks and the same one-line errors: `field "text_config.hidden_size" is missing`.
 * Counts that the description iterates over are bounded by the readers, and every
 * tensor's size is checked when it is declared, so no config can make a plugin loop for
 * hours or a shape overflow.
 */
#ifndef WSYNC_MODEL_H
#define WSYNC_MODEL_H

#include <glib.h>
#include <json-glib/json-glib.h>
#include <wsync/api.h>
#include <wsync/dtype.h>
#include <wsync/plugin.h>
#include <wsync/safetensors.h>

G_BEGIN_DECLS

/* ------------------------------------------------------------------ config.json */

/** The largest size field (hidden size, heads, vocabulary) a config may give. */
#define WSYNC_CONFIG_SIZE_MAX G_GUINT64_CONSTANT(0x7fffffff)

/** The largest count a description iterates over (layers, experts, vision blocks). */
#define WSYNC_CONFIG_COUNT_MAX 65536

/**
 * WsyncConfigSection:
 * @object: the JSON object fields are read from
 * @where: what messages put before a field's name, e.g. `text_config.` or ``
 *
 * Where a config reader looks.  wsync_model_config_section() makes one.
 */
typedef struct {
  JsonObject *object;
  const char *where;
} WsyncConfigSection;

/**
 * wsync_config_get_uint:
 * @section: where to read
 * @key: the field
 * @min: the smallest value accepted
 * @max: the largest value accepted (%WSYNC_CONFIG_SIZE_MAX for sizes,
 *   %WSYNC_CONFIG_COUNT_MAX for counts)
 * @out: (out): the value
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT error
 *
 * Reads a required integer.  A field that is absent or null is missing.  @key may name
 * an alternative spelling after a bar, "num_experts|num_local_experts".  A value above
 * a count's @max is refused as `field "KEY" is N, more than MAX`, any other value outside
 * [@min, @max] as `field "KEY" must be an integer from MIN to MAX, not N` (with a size's
 * @max: `a positive integer below 2^31`, or `an integer of at least MIN below 2^31`).
 *
 * Returns: %TRUE when the field is there and an integer in [@min, @max].
 */
WSYNC_API gboolean wsync_config_get_uint(const WsyncConfigSection *section, const char *key,
                                         guint64 min, guint64 max, guint64 *out, GError **error);

/**
 * wsync_config_get_uint_or:
 * @section: where to read
 * @key: the field
 * @min: the smallest value accepted
 * @max: the largest value accepted
 * @out: (inout): the value; keeps what it holds (the default) when the field is absent
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT error
 *
 * Reads an optional integer.  @key may name an alternative spelling after a bar, as
 * for wsync_config_get_uint(); a refusal names the spelling that is there.
 *
 * Returns: %TRUE unless the field is there and not an integer in [@min, @max].
 */
WSYNC_API gboolean wsync_config_get_uint_or(const WsyncConfigSection *section, const char *key,
                                            guint64 min, guint64 max, guint64 *out,
                                            GError **error);

/**
 * wsync_config_get_head_dim:
 * @section: where to read
 * @hidden: the model's hidden size (read before)
 * @heads: its attention heads (read before)
 * @fallback: the configuration class's default, 0 for none
 * @out: (out): the per-head size
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT error
 *
 * `head_dim` as the Transformers configurations of decoder models read it: the field
 * (absent or null counts as missing), else @fallback when it is not 0, else
 * @hidden / @heads, refused when @heads does not divide @hidden (`field "head_dim" is
 * missing and hidden_size H is not a multiple of num_attention_heads N`).
 *
 * Returns: %TRUE on success.
 */
WSYNC_API gboolean wsync_config_get_head_dim(const WsyncConfigSection *section, guint64 hidden,
                                             guint64 heads, guint64 fallback, guint64 *out,
                                             GError **error);

/**
 * wsync_config_check_divides:
 * @section: where @key and @multiple_key were read
 * @key: the field that gave @value, e.g. "num_key_value_heads"
 * @value: its value (not 0)
 * @multiple_key: the field that gave @multiple, e.g. "num_attention_heads"
 * @multiple: its value
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT error
 *
 * Checks that @value divides @multiple, as when each of @value groups (key/value heads)
 * serves a whole number of @multiple members (query heads).  A refusal names both
 * fields: `field "KEY" is V, which does not divide MULTIPLE_KEY M`.
 *
 * Returns: %TRUE when @multiple is a multiple of @value.
 */
WSYNC_API gboolean wsync_config_check_divides(const WsyncConfigSection *section, const char *key,
                                              guint64 value, const char *multiple_key,
                                              guint64 multiple, GError **error);

/**
 * wsync_config_get_bool_or:
 * @section: where to read
 * @key: the field
 * @out: (inout): the value; keeps its default when the field is absent
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT error
 *
 * Reads an optional boolean; @key may name an alternative spelling after a bar.
 *
 * Returns: %TRUE unless the field is there and not true or false.
 */
WSYNC_API gboolean wsync_config_get_bool_or(const WsyncConfigSection *section, const char *key,
                                            gboolean *out, GError **error);

/**
 * wsync_config_get_string_or:
 * @section: where to read
 * @key: the field
 * @out: (inout) (transfer none): the value, owned by the config; keeps its default when
 *   the field is absent
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT error
 *
 * Reads an optional string; @key may name an alternative spelling after a bar.
 *
 * Returns: %TRUE unless the field is there and not a string.
 */
WSYNC_API gboolean wsync_config_get_string_or(const WsyncConfigSection *section,
                                              const char *key, const char **out,
                                              GError **error);

/**
 * wsync_config_get_choices:
 * @section: where to read
 * @key: a field holding a list of strings, e.g. `layer_types`
 * @choices: (array zero-terminated=1): the accepted strings
 * @n_named: how many of @choices (the first) a refusal names; the others are accepted
 *   spellings (legacy names)
 * @length: how many entries the list must have
 * @length_key: the field that gave @length, for the refusal of a list of another length
 * @out: (out caller-allocates) (array length=length): for each entry, the index of its
 *   string in @choices
 * @present: (out): whether the field is there (absent: @out is untouched)
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT error
 *
 * Reads a list of names, such as one attention kind per layer.
 *
 * Returns: %TRUE unless the field is there and wrong.
 */
WSYNC_API gboolean wsync_config_get_choices(const WsyncConfigSection *section, const char *key,
                                            const char *const *choices, guint n_named,
                                            guint64 length, const char *length_key, guint *out,
                                            gboolean *present, GError **error);

/**
 * wsync_config_get_indices:
 * @section: where to read
 * @key: a field holding a list of indices, e.g. `mlp_only_layers`
 * @bound: every index must be below this (and the list at most this long)
 * @out: (out caller-allocates) (array length=bound): set to %TRUE at each listed index;
 *   untouched elsewhere
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT error
 *
 * Returns: %TRUE unless the field is there and not a list of integers below @bound.
 */
WSYNC_API gboolean wsync_config_get_indices(const WsyncConfigSection *section, const char *key,
                                            guint64 bound, gboolean *out, GError **error);

/**
 * wsync_config_get_dtype:
 * @sections: (array length=n_sections): where to look, in order
 * @n_sections: how many
 * @out: (out): the dtype; bfloat16 when no section has one
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT error
 *
 * The dtype the model is published in: the first of `dtype` (Transformers 5) and
 * `torch_dtype` (Transformers 4) that a section holds, one of "bfloat16", "float16" and
 * "float32" (docs/hf-checkpoints.md §2).
 *
 * Returns: %TRUE unless the field found is none of those.
 */
WSYNC_API gboolean wsync_config_get_dtype(const WsyncConfigSection *sections, guint n_sections,
                                          WsyncDtype *out, GError **error);

/* ------------------------------------------------------------------ the model */

/** The model a remapper describes (the checkpoint's config and its building blocks). */
typedef struct _WsyncModel WsyncModel;

/** A logical tensor: a tensor of the model in global coordinates, named as published. */
typedef struct _WsyncLogicalTensor WsyncLogicalTensor;

/** A block of the model: the params of one attention, one MLP, one MoE block, ... */
typedef struct _WsyncBlock WsyncBlock;

/**
 * wsync_model_get_config:
 * @m: the model
 *
 * Returns: (transfer none): the root object of config.json.
 */
WSYNC_API JsonObject *wsync_model_get_config(WsyncModel *m);

/** wsync_model_get_model_type: Returns: (transfer none): `model_type` of config.json. */
WSYNC_API const char *wsync_model_get_model_type(WsyncModel *m);

/**
 * wsync_model_get_config_name:
 * @m: the model
 *
 * The name the core gives config.json in errors: its path, as the plan found it (e.g.
 * "/ckpt/config.json").  A remapper's errors need not name it (the core prefixes it);
 * a backend's errors about the config can.
 *
 * Returns: (transfer none) (nullable): the name, or %NULL when the model was not
 * described from a config file.
 */
WSYNC_API const char *wsync_model_get_config_name(WsyncModel *m);

/**
 * wsync_model_config_section:
 * @m: the model
 * @key: (nullable): a member of the root holding an object (e.g. "text_config"), or
 *   %NULL for the root
 * @fall_back: when the member is absent, read the root instead
 * @out: (out): the section
 *
 * Returns: %TRUE when @out is usable (the member is an object, or the root stands in).
 */
WSYNC_API gboolean wsync_model_config_section(WsyncModel *m, const char *key,
                                              gboolean fall_back, WsyncConfigSection *out);

/**
 * wsync_model_set_architecture:
 * @m: the model
 * @architecture: the Hugging Face class whose names the description follows (e.g.
 *   "Qwen3MoeForCausalLM")
 *
 * Engines key their loaders by this name (vLLM's model registry); a backend uses it to
 * find how its engine renames the checkpoint's modules.
 *
 * Legacy: config.json's `architectures[0]`, when it is a string, wins over @architecture
 * whatever class it names, so a config naming another class (e.g.
 * "LlamaForSequenceClassification") is described with this description's names and
 * reaches the backends under the other name.  New plugins use
 * wsync_model_accept_architecture(), which refuses such a config.
 */
WSYNC_API void wsync_model_set_architecture(WsyncModel *m, const char *architecture);

/**
 * wsync_model_accept_architecture:
 * @m: the model
 * @architecture: the Hugging Face class whose names and shapes the description follows
 *   (e.g. "LlamaForCausalLM"): the model's architecture when config.json has no
 *   `architectures` (absent, null or an empty list) or names this class or an alias
 * @aliases: (nullable) (array zero-terminated=1): other names config.json may give for
 *   the same class: names the engines build as @architecture, with the same parameter
 *   names and shapes (e.g. vLLM's registry maps "LLaMAForCausalLM" to its
 *   LlamaForCausalLM).  The model's architecture is then @architecture, so that backends,
 *   which key their tables by class name, treat an alias as the class it stands for
 * @note: (nullable): text appended to the refusal after a space (what the description
 *   follows, what is not supported)
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT error
 *
 * Sets the model's architecture, as wsync_model_set_architecture() does, but only to a
 * class the plugin describes.  When config.json's `architectures[0]` names another class
 * (or `architectures` is not a list, or does not begin with a string), it fails with one
 * line: `field "architectures" begins with "X", but model_type "T" is supported only as
 * "A"[, or as its alias(es) "B", ...][ NOTE]`, X escaped (a name of more than 64
 * characters as its first 60, `..." (N characters)`); the core prefixes config.json's path.  A
 * plugin that describes several classes for one model_type calls it with the class the
 * config's other fields select.
 *
 * Returns: %TRUE when the model's architecture is set.
 */
WSYNC_API gboolean wsync_model_accept_architecture(WsyncModel *m, const char *architecture,
                                                   const char *const *aliases,
                                                   const char *note, GError **error);

/** wsync_model_get_architecture: Returns: (transfer none) (nullable): the architecture. */
WSYNC_API const char *wsync_model_get_architecture(WsyncModel *m);

/**
 * wsync_model_set_dtype:
 * @m: the model
 * @dtype: the dtype the model is published in (wsync_config_get_dtype())
 *
 * Logical tensors take it unless declared otherwise.
 */
WSYNC_API void wsync_model_set_dtype(WsyncModel *m, WsyncDtype dtype);

/** wsync_model_get_dtype: Returns: the model's dtype. */
WSYNC_API WsyncDtype wsync_model_get_dtype(WsyncModel *m);

/**
 * wsync_model_fail:
 * @m: the model
 * @format: printf-style format of one line
 * @...: arguments
 *
 * Records a #WSYNC_ERROR_BAD_INPUT error about the config; the first one recorded is what
 * the description reports (builders return no errors of their own).
 */
WSYNC_API void wsync_model_fail(WsyncModel *m, const char *format, ...) G_GNUC_PRINTF(2, 3);

/**
 * wsync_model_add_drop_rule:
 * @m: the model
 * @rule: the rule's name, shown in the plan (e.g. "rotary-inv-freq")
 * @glob: a GLib pattern (g_pattern_match_simple()) on input tensor names
 *
 * Input tensors that match and that no layout tensor names are consumed by @rule
 * instead of being reported as unmapped.
 */
WSYNC_API void wsync_model_add_drop_rule(WsyncModel *m, const char *rule, const char *glob);

/**
 * wsync_model_add_copy_rule:
 * @m: the model
 * @rule: the rule's name, shown in the plan (e.g. "tied-lm-head")
 * @name: the exact name of an input tensor that is a second copy of another
 *   (e.g. "lm_head.weight" of a model whose LM head is its embedding)
 * @copy_of: the exact name of the input tensor it copies
 *   (e.g. "model.embed_tokens.weight")
 *
 * An input tensor named @name that no layout tensor names is consumed by @rule as a copy
 * of the input tensor @copy_of, instead of being reported as unmapped: the plan shows
 * `input NAME dropped by rule RULE (a copy of COPY_OF ...)` (and `"copy_of"` in
 * `--json`), and a session accepts a push of it and writes nothing from it.
 *
 * @copy_of must be in the same source with the same dtype and shape; otherwise the plan
 * is refused (#WSYNC_ERROR_BAD_INPUT) naming both tensors, their dtypes and shapes and
 * @rule, since an engine keeps only one of the two.  Values are not compared: a plan
 * reads headers only (and a session has no data when it plans), so a @name whose bytes
 * differ from @copy_of's is dropped all the same.  A copy rule is looked up before the
 * drop rules (wsync_model_add_drop_rule()).
 */
WSYNC_API void wsync_model_add_copy_rule(WsyncModel *m, const char *rule, const char *name,
                                         const char *copy_of);

/* ------------------------------------------------------------------ groups */

/**
 * WsyncGroup:
 * @WSYNC_GROUP_MAIN: the language model
 * @WSYNC_GROUP_VISION: a vision tower
 * @WSYNC_GROUP_DRAFT: a draft block for speculative decoding (multi-token prediction),
 *   which engines load as a model of its own, if at all, and which the model's own class
 *   does not load
 *
 * Which part of the model a block belongs to; engines hold the parts differently.  When an
 * input's layout dropped a param by a rule (its files never held it) and the output needs
 * it, a draft block's tensors are left out of the output (the plan lists them as omitted);
 * any other group's are part of the model itself and the plan is refused
 * (#WSYNC_ERROR_USAGE), naming the source, the rule and the tensors.
 */
typedef enum {
  WSYNC_GROUP_MAIN,
  WSYNC_GROUP_VISION,
  WSYNC_GROUP_DRAFT,
} WsyncGroup;

/**
 * wsync_model_begin_group:
 * @m: the model
 * @group: the group of the blocks declared from now on
 * @runtime_drop: (nullable): when set, the rule by which every runtime target drops
 *   those blocks (a tower the deployment switches off, e.g. "language-model-only");
 *   the Hugging Face layouts keep them
 */
WSYNC_API void wsync_model_begin_group(WsyncModel *m, WsyncGroup group, const char *runtime_drop);

/**
 * WSYNC_RUNTIME_DROP_KEY:
 *
 * The `__metadata__` key prefix (followed by an option's name) under which a runtime
 * target's rank files record whether they were written without the blocks that option
 * switches off (wsync_model_begin_switched_group()): `true` or `false`, e.g.
 * `wsync.runtime-drop.language-model-only` = `true`.
 */
#define WSYNC_RUNTIME_DROP_KEY "wsync.runtime-drop."

/**
 * wsync_model_begin_switched_group:
 * @m: the model
 * @group: the group of the blocks declared from now on
 * @option: the name of a boolean option of the remapper's plugin that, true, says the
 *   deployment builds none of those blocks (e.g. "language-model-only"); it is also the
 *   rule by which runtime targets then drop them
 * @on: the option's value in conf.d
 *
 * Like wsync_model_begin_group(), for blocks a deployment may switch off.  A runtime
 * target asks with wsync_layout_get_runtime_drop(), and its rank files record the
 * answer under %WSYNC_RUNTIME_DROP_KEY.  Rank files read back that record it decide for
 * the whole plan (the outputs are written as the source was, whatever @on says; the
 * plan notes it where @on differs).  Rank files that record nothing (an earlier wsync)
 * are read by @on; when they hold those blocks as the other value has them, they are
 * refused (#WSYNC_ERROR_USAGE) with the setting to put in conf.d.
 */
WSYNC_API void wsync_model_begin_switched_group(WsyncModel *m, WsyncGroup group,
                                                const char *option, gboolean on);

/* ------------------------------------------------------------------ logical tensors */

/**
 * wsync_model_add_tensor:
 * @m: the model
 * @name: the published name (unique)
 * @dtype: the published dtype
 * @ndim: axes (at most %WSYNC_MAX_DIMS)
 * @shape: (array length=ndim): the shape
 *
 * Declares a logical tensor.  A shape of more than 2^57 elements is recorded as the
 * model's error (wsync_model_fail()) and a placeholder is returned.  A name declared
 * before, or more than %WSYNC_MAX_DIMS axes, is the remapper's mistake: recorded as a
 * #WSYNC_ERROR_PLUGIN error naming the remapper, after which every builder returns
 * placeholders and the description is refused with that error.
 *
 * Returns: (transfer none): the logical tensor, owned by the model.
 */
WSYNC_API WsyncLogicalTensor *wsync_model_add_tensor(WsyncModel *m, const char *name,
                                                     WsyncDtype dtype, guint ndim,
                                                     const guint64 *shape);

/** wsync_logical_get_name: Returns: (transfer none): the logical tensor's name. */
WSYNC_API const char *wsync_logical_get_name(const WsyncLogicalTensor *lt);
/** wsync_logical_get_dtype: Returns: its dtype: the input's once bound, else as published. */
WSYNC_API WsyncDtype wsync_logical_get_dtype(const WsyncLogicalTensor *lt);
/**
 * wsync_logical_get_published_dtype:
 *
 * Returns: the dtype the model is published in: as declared, or, for a tensor whose dtype
 * follows its input (wsync_logical_set_dtype_follows_input()), the input's once bound.
 */
WSYNC_API WsyncDtype wsync_logical_get_published_dtype(const WsyncLogicalTensor *lt);

/**
 * WSYNC_PUBLISHED_DTYPE_KEY:
 *
 * The `__metadata__` key prefix (followed by the logical tensor's name) under which an
 * output file records the published dtype of a tensor whose dtype follows its input,
 * where the file holds it in another dtype (an engine's runtime dtype), e.g.
 * `wsync.published-dtype.model.layers.0.linear_attn.A_log` = `BF16`.
 */
#define WSYNC_PUBLISHED_DTYPE_KEY "wsync.published-dtype."

/**
 * wsync_published_dtype_first_difference:
 * @a: (element-type utf8 utf8): one file's `__metadata__`
 * @b: (element-type utf8 utf8): another file's
 *
 * Compares the records of two files under %WSYNC_PUBLISHED_DTYPE_KEY, the only metadata
 * that changes what a file's tensors mean when read back (other keys, such as version
 * stamps, are not looked at).
 *
 * Returns: (transfer none) (nullable): the first such key, in strcmp() order, that one
 *   file has and the other lacks or holds with another value (owned by @a or @b); %NULL
 *   when the records are the same.
 */
WSYNC_API const char *wsync_published_dtype_first_difference(GHashTable *a, GHashTable *b);

/**
 * wsync_logical_set_dtype_follows_input:
 * @lt: a logical tensor
 * @fallback: its published dtype where no input tells (synth)
 *
 * Declares that checkpoints of one config publish @lt in different dtypes, so the config
 * cannot say which: its published dtype becomes the dtype its input holds it in, or the
 * dtype the input file records under %WSYNC_PUBLISHED_DTYPE_KEY (a rank file that held it
 * in an engine's dtype), and @fallback where there is no input.  Every output that holds
 * it in another dtype than published records the published one the same way, so reading
 * the output back restores it.
 */
WSYNC_API void wsync_logical_set_dtype_follows_input(WsyncLogicalTensor *lt, WsyncDtype fallback);
/** wsync_logical_get_ndim: Returns: its number of axes. */
WSYNC_API guint wsync_logical_get_ndim(const WsyncLogicalTensor *lt);
/** wsync_logical_get_shape: Returns: (transfer none) (array length=ndim): its shape. */
WSYNC_API const guint64 *wsync_logical_get_shape(const WsyncLogicalTensor *lt);

/* ------------------------------------------------------------------ params */

/**
 * WsyncParamKind:
 * @WSYNC_PARAM_REPLICATED: every rank holds all of it (norms, routers)
 * @WSYNC_PARAM_COLUMN: its parts are concatenated along axis 0; each part is split
 *   along axis 0 across the tensor-parallel ranks in whole units (column-parallel
 *   linears: q/k/v by heads, gate/up)
 * @WSYNC_PARAM_ROW: one part, split along its last axis (row-parallel linears: o_proj,
 *   down_proj)
 * @WSYNC_PARAM_VOCAB: one part, the vocabulary axis 0, which engines pad and split
 * @WSYNC_PARAM_EXPERTS_COLUMN: routed experts stacked [E, I, H] (gate, up): spread over
 *   expert-parallel ranks along axis 0, or split along axis 1 across tensor-parallel ranks
 * @WSYNC_PARAM_EXPERTS_ROW: routed experts stacked [E, H, I] (down): spread along axis 0,
 *   or split along axis 2
 *
 * How a param is split over ranks, in the terms of tensor and expert parallelism.  A
 * backend decides how its engine packs and names it.
 */
typedef enum {
  WSYNC_PARAM_REPLICATED,
  WSYNC_PARAM_COLUMN,
  WSYNC_PARAM_ROW,
  WSYNC_PARAM_VOCAB,
  WSYNC_PARAM_EXPERTS_COLUMN,
  WSYNC_PARAM_EXPERTS_ROW,
} WsyncParamKind;

/**
 * WsyncRole:
 * @WSYNC_ROLE_NONE: held under its own name
 * @WSYNC_ROLE_EMBEDDING: the token embedding
 * @WSYNC_ROLE_LM_HEAD: the output projection (absent when tied to the embedding)
 * @WSYNC_ROLE_Q: attention query projection (with the output gate, per head)
 * @WSYNC_ROLE_K: attention key projection
 * @WSYNC_ROLE_V: attention value projection
 * @WSYNC_ROLE_O: attention output projection
 * @WSYNC_ROLE_Q_NORM: per-head query norm
 * @WSYNC_ROLE_K_NORM: per-head key norm
 * @WSYNC_ROLE_GATE: gated MLP gate projection
 * @WSYNC_ROLE_UP: gated MLP up projection
 * @WSYNC_ROLE_DOWN: gated MLP down projection
 * @WSYNC_ROLE_ROUTER: a MoE block's router
 * @WSYNC_ROLE_EXPERTS_GATE: the routed experts' gate projections, stacked
 * @WSYNC_ROLE_EXPERTS_UP: the routed experts' up projections, stacked
 * @WSYNC_ROLE_EXPERTS_DOWN: the routed experts' down projections, stacked
 * @WSYNC_ROLE_SHARED_GATE: the shared expert's gate projection
 * @WSYNC_ROLE_SHARED_UP: the shared expert's up projection
 * @WSYNC_ROLE_SHARED_DOWN: the shared expert's down projection
 * @WSYNC_ROLE_SHARED_EXPERT_GATE: the sigmoid gate that scales the shared expert
 * @WSYNC_ROLE_LINEAR_QKV: Gated DeltaNet q, k, v projection (three parts)
 * @WSYNC_ROLE_LINEAR_Z: Gated DeltaNet output-gate projection
 * @WSYNC_ROLE_LINEAR_B: Gated DeltaNet beta projection
 * @WSYNC_ROLE_LINEAR_A: Gated DeltaNet alpha projection
 * @WSYNC_ROLE_LINEAR_CONV: Gated DeltaNet short convolution (q, k, v channel blocks)
 * @WSYNC_ROLE_LINEAR_A_LOG: Gated DeltaNet decay, log form
 * @WSYNC_ROLE_LINEAR_DT_BIAS: Gated DeltaNet time-step bias
 * @WSYNC_ROLE_LINEAR_NORM: Gated DeltaNet gated output norm
 * @WSYNC_ROLE_LINEAR_OUT: Gated DeltaNet output projection
 *
 * What a param is inside its block.  Engines pack some params of a block into one
 * tensor (q, k and v; gate and up; the experts' gate and up) and name tensors by their
 * own module structure; the role is what lets a backend do that without reading names.
 * New roles are added at the end.
 */
typedef enum {
  WSYNC_ROLE_NONE,
  WSYNC_ROLE_EMBEDDING,
  WSYNC_ROLE_LM_HEAD,
  WSYNC_ROLE_Q,
  WSYNC_ROLE_K,
  WSYNC_ROLE_V,
  WSYNC_ROLE_O,
  WSYNC_ROLE_Q_NORM,
  WSYNC_ROLE_K_NORM,
  WSYNC_ROLE_GATE,
  WSYNC_ROLE_UP,
  WSYNC_ROLE_DOWN,
  WSYNC_ROLE_ROUTER,
  WSYNC_ROLE_EXPERTS_GATE,
  WSYNC_ROLE_EXPERTS_UP,
  WSYNC_ROLE_EXPERTS_DOWN,
  WSYNC_ROLE_SHARED_GATE,
  WSYNC_ROLE_SHARED_UP,
  WSYNC_ROLE_SHARED_DOWN,
  WSYNC_ROLE_SHARED_EXPERT_GATE,
  WSYNC_ROLE_LINEAR_QKV,
  WSYNC_ROLE_LINEAR_Z,
  WSYNC_ROLE_LINEAR_B,
  WSYNC_ROLE_LINEAR_A,
  WSYNC_ROLE_LINEAR_CONV,
  WSYNC_ROLE_LINEAR_A_LOG,
  WSYNC_ROLE_LINEAR_DT_BIAS,
  WSYNC_ROLE_LINEAR_NORM,
  WSYNC_ROLE_LINEAR_OUT,
  WSYNC_ROLE_COUNT /*< skip >*/
} WsyncRole;

/**
 * WsyncPart:
 * @lt: the logical tensor
 * @start: first index along axis 0 of @lt that belongs to the part
 * @length: how many indices along axis 0 (0 means: to the end)
 * @unit: indices per head; a rank's share is a whole number of units (0 means 1)
 * @replicate: when there are fewer units than ranks, ranks share units (KV heads)
 *
 * One part of a param: a range of rows of a logical tensor.  A column-parallel part's
 * n units are divided among the tp ranks: rank t holds units [t*n/tp, (t+1)*n/tp); with
 * @replicate and tp > n (tp a multiple of n), rank t holds unit t / (tp/n).
 */
typedef struct {
  WsyncLogicalTensor *lt;
  guint64 start;
  guint64 length;
  guint64 unit;
  gboolean replicate;
} WsyncPart;

#define WSYNC_PARAM_MAX_PARTS 8

/**
 * WsyncParam:
 * @name: its published name (for several parts of one tensor, that tensor's name)
 * @kind: how it is split over ranks
 * @role: what it is inside its block
 * @block: (transfer none): the block it belongs to
 * @n_parts: number of parts
 * @parts: the parts, in order
 * @aliases: (nullable) (array zero-terminated=1): other published names of the same
 *   tensor (a tied LM head is the embedding: `lm_head.weight`)
 * @reserved: room for growth
 *
 * A param of the model: one published tensor (or rows of one), as the running model
 * holds it.  Read-only for plugins.
 */
typedef struct {
  char *name;
  WsyncParamKind kind;
  WsyncRole role;
  WsyncBlock *block;
  guint n_parts;
  WsyncPart parts[WSYNC_PARAM_MAX_PARTS];
  char **aliases;
  gpointer reserved[4];
} WsyncParam;

/**
 * wsync_model_add_param:
 * @m: the model
 * @block: the block it belongs to (wsync_model_add_block())
 * @name: its published name
 * @kind: how it is split over ranks
 * @role: what it is inside @block
 * @n_parts: 1 to %WSYNC_PARAM_MAX_PARTS
 * @parts: (array length=n_parts): its parts (copied)
 *
 * Another count of parts, or a part without its logical tensor, is the remapper's
 * mistake, recorded as wsync_model_add_tensor() records one.
 *
 * Returns: (transfer none): the param (a placeholder after a mistake).
 */
WSYNC_API WsyncParam *wsync_model_add_param(WsyncModel *m, WsyncBlock *block, const char *name,
                                            WsyncParamKind kind, WsyncRole role, guint n_parts,
                                            const WsyncPart *parts);

/**
 * wsync_model_add_whole:
 * @m: the model
 * @block: its block
 * @name: the published name of a new logical tensor, which the param holds whole
 * @kind: how it is split over ranks
 * @role: what it is inside @block
 * @ndim: axes (1 to 3)
 * @d0: the first axis
 * @d1: the second, or 0
 * @d2: the third, or 0
 *
 * The common case: a logical tensor in the model's dtype and a param of all of it, one
 * unit per row.
 *
 * Returns: (transfer none): the param.
 */
WSYNC_API WsyncParam *wsync_model_add_whole(WsyncModel *m, WsyncBlock *block, const char *name,
                                            WsyncParamKind kind, WsyncRole role, guint ndim,
                                            guint64 d0, guint64 d1, guint64 d2);

/** wsync_param_get_leaf: Returns: (transfer none): the last component of its name ("weight"). */
WSYNC_API const char *wsync_param_get_leaf(const WsyncParam *param);

/* ------------------------------------------------------------------ blocks */

/**
 * WsyncBlockKind:
 * @WSYNC_BLOCK_OTHER: tensors held under their own names (norms, a vision tower)
 * @WSYNC_BLOCK_VOCAB: the embedding and the LM head
 * @WSYNC_BLOCK_ATTENTION: full attention
 * @WSYNC_BLOCK_MLP: a gated MLP
 * @WSYNC_BLOCK_MOE: a mixture-of-experts block
 * @WSYNC_BLOCK_LINEAR_ATTENTION: Gated DeltaNet linear attention
 */
typedef enum {
  WSYNC_BLOCK_OTHER,
  WSYNC_BLOCK_VOCAB,
  WSYNC_BLOCK_ATTENTION,
  WSYNC_BLOCK_MLP,
  WSYNC_BLOCK_MOE,
  WSYNC_BLOCK_LINEAR_ATTENTION,
} WsyncBlockKind;

/**
 * wsync_model_add_block:
 * @m: the model
 * @kind: what the block is
 * @module: its module path as published, e.g. `model.layers.3.self_attn` (empty for
 *   tensors at the top)
 *
 * Starts a block of the current group (wsync_model_begin_group()).  The building
 * blocks below make and fill blocks; plugins add their own for anything else.
 *
 * Returns: (transfer none): the block.
 */
WSYNC_API WsyncBlock *wsync_model_add_block(WsyncModel *m, WsyncBlockKind kind,
                                            const char *module);

/** wsync_block_get_kind: Returns: what the block is. */
WSYNC_API WsyncBlockKind wsync_block_get_kind(const WsyncBlock *block);
/** wsync_block_get_module: Returns: (transfer none): its published module path. */
WSYNC_API const char *wsync_block_get_module(const WsyncBlock *block);
/** wsync_block_get_group: Returns: the group it belongs to. */
WSYNC_API WsyncGroup wsync_block_get_group(const WsyncBlock *block);
/**
 * wsync_block_get_runtime_drop:
 * @block: a block
 *
 * Returns: (nullable): the rule by which runtime targets drop it, or %NULL (a switched
 *   group's: as the option stands now, wsync_model_begin_switched_group()).
 */
WSYNC_API const char *wsync_block_get_runtime_drop(const WsyncBlock *block);
/**
 * wsync_block_get_param:
 * @block: a block
 * @role: a role
 *
 * Returns: (transfer none) (nullable): the block's first param of @role, or %NULL.
 */
WSYNC_API const WsyncParam *wsync_block_get_param(const WsyncBlock *block, WsyncRole role);

/**
 * wsync_block_find_param:
 * @block: a block
 * @role: a role
 * @leaf: the last component of the param's name ("weight", "bias")
 *
 * Returns: (transfer none) (nullable): the block's param of @role whose name ends in
 *   @leaf (a bias has the role of its weight), or %NULL.
 */
WSYNC_API const WsyncParam *wsync_block_find_param(const WsyncBlock *block, WsyncRole role,
                                                   const char *leaf);

/**
 * WsyncExpertsForm:
 * @WSYNC_EXPERTS_PER_EXPERT: one tensor per expert and projection,
 *   `experts.{e}.{gate,up,down}_proj.weight`
 * @WSYNC_EXPERTS_FUSED: Transformers 5's fused tensors, `experts.gate_up_proj`
 *   [E, 2I, H] (gate rows first) and `experts.down_proj` [E, H, I]
 *
 * How a checkpoint holds a MoE block's routed experts.
 */
typedef enum {
  WSYNC_EXPERTS_PER_EXPERT,
  WSYNC_EXPERTS_FUSED,
} WsyncExpertsForm;

/**
 * wsync_block_get_experts_form:
 * @block: a MoE block
 *
 * Returns: the form the model's checkpoints publish its experts in.
 */
WSYNC_API WsyncExpertsForm wsync_block_get_experts_form(const WsyncBlock *block);

/* ------------------------------------------------------------------ building blocks */

/**
 * wsync_model_add_vocab:
 * @m: the model
 * @embedding: the embedding's published name, e.g. `model.embed_tokens.weight`
 * @lm_head: the LM head's published name, e.g. `lm_head.weight`
 * @vocab: vocabulary size
 * @hidden: hidden size
 * @tied: the LM head is the embedding (no tensor of its own; @lm_head becomes an alias
 *   of the embedding)
 *
 * The embedding [vocab, hidden] and the LM head [vocab, hidden], both vocabulary-split.
 */
WSYNC_API void wsync_model_add_vocab(WsyncModel *m, const char *embedding, const char *lm_head,
                                     guint64 vocab, guint64 hidden, gboolean tied);

/**
 * wsync_model_add_norm:
 * @m: the model
 * @name: its published name
 * @size: its length
 *
 * A replicated 1-D tensor (an RMSNorm or LayerNorm weight or bias) of its own block kind
 * %WSYNC_BLOCK_OTHER; engines hold it whole, under its name.
 *
 * Returns: (transfer none): the param.
 */
WSYNC_API WsyncParam *wsync_model_add_norm(WsyncModel *m, const char *name, guint64 size);

/**
 * WsyncAttention:
 * @hidden: hidden size H
 * @heads: query heads
 * @kv_heads: key/value heads
 * @head_dim: per-head size D
 * @output_gate: q_proj holds each head's query and then its output gate ([q_h; gate_h],
 *   2D rows per head)
 * @qk_norm: per-head q_norm / k_norm [D]
 * @qkv_bias: q/k/v projections have biases
 * @o_bias: the output projection has a bias
 * @reserved: room for growth; zero
 *
 * The shape of a full-attention block.
 */
typedef struct {
  guint64 hidden, heads, kv_heads, head_dim;
  gboolean output_gate, qk_norm, qkv_bias, o_bias;
  gpointer reserved[2];
} WsyncAttention;

/**
 * wsync_model_add_attention:
 * @m: the model
 * @module: e.g. `model.layers.3.self_attn`
 * @spec: its shape
 *
 * `q_proj`, `k_proj`, `v_proj` (column-parallel by heads, KV heads replicated when there
 * are fewer than ranks), `o_proj` (row-parallel), and `q_norm`, `k_norm` (replicated).
 *
 * Returns: (transfer none): the block.
 */
WSYNC_API WsyncBlock *wsync_model_add_attention(WsyncModel *m, const char *module,
                                                const WsyncAttention *spec);

/**
 * WsyncMlp:
 * @hidden: hidden size H
 * @intermediate: intermediate size I
 * @bias: the three projections have biases
 * @reserved: room for growth; zero
 *
 * The shape of a gated MLP.
 */
typedef struct {
  guint64 hidden, intermediate;
  gboolean bias;
  gpointer reserved[2];
} WsyncMlp;

/**
 * wsync_model_add_mlp:
 * @m: the model
 * @module: e.g. `model.layers.3.mlp`
 * @spec: its shape
 *
 * A gated MLP: `gate_proj`, `up_proj` [I, H] (column-parallel) and `down_proj` [H, I]
 * (row-parallel).  With @spec->bias, `gate_proj.bias` and `up_proj.bias` [I] are
 * column-parallel like their weights, and `down_proj.bias` [H] is replicated: every rank
 * holds it whole (a row-parallel layer adds its bias once, after the reduction).
 *
 * Returns: (transfer none): the block.
 */
WSYNC_API WsyncBlock *wsync_model_add_mlp(WsyncModel *m, const char *module,
                                          const WsyncMlp *spec);

/**
 * WsyncMoe:
 * @hidden: hidden size H
 * @experts: routed experts E
 * @intermediate: each routed expert's intermediate size I
 * @shared_intermediate: the shared expert's intermediate size, 0 for none
 * @published: the form checkpoints hold the routed experts in
 * @reserved: room for growth; zero
 *
 * The shape of a mixture-of-experts block.
 */
typedef struct {
  guint64 hidden, experts, intermediate, shared_intermediate;
  WsyncExpertsForm published;
  gpointer reserved[2];
} WsyncMoe;

/**
 * wsync_model_add_moe:
 * @m: the model
 * @module: e.g. `model.layers.3.mlp`
 * @spec: its shape
 *
 * The router `gate` [E, H] (replicated), the routed experts as the stacked logical
 * tensors `experts.gate` / `experts.up` [E, I, H] and `experts.down` [E, H, I], and with a
 * shared expert `shared_expert.{gate,up,down}_proj` and `shared_expert_gate` [1, H].
 *
 * Returns: (transfer none): the block.
 */
WSYNC_API WsyncBlock *wsync_model_add_moe(WsyncModel *m, const char *module,
                                          const WsyncMoe *spec);

/**
 * WsyncLinearAttention:
 * @hidden: hidden size H
 * @key_heads: nk
 * @value_heads: nv (a multiple of nk)
 * @key_dim: dk, per key head
 * @value_dim: dv, per value head
 * @conv_kernel: the short convolution's kernel size K
 * @a_log_norm_dtype: the dtype `A_log` and `norm.weight` are published in (where no input
 *   tells, if @a_log_norm_dtype_varies); zero (%WSYNC_DTYPE_BOOL, what a caller built when
 *   this was reserved space leaves) means F32
 * @a_log_norm_dtype_varies: checkpoints of one config differ in that dtype: `A_log` and
 *   `norm.weight` follow their input (wsync_logical_set_dtype_follows_input())
 * @reserved: room for growth; zero
 *
 * The shape of a Gated DeltaNet block, as Qwen3.5 publishes it.
 */
typedef struct {
  guint64 hidden, key_heads, value_heads, key_dim, value_dim, conv_kernel;
  WsyncDtype a_log_norm_dtype;
  gboolean a_log_norm_dtype_varies;
  gpointer reserved[1];
} WsyncLinearAttention;

/**
 * wsync_model_add_linear_attention:
 * @m: the model
 * @module: e.g. `model.language_model.layers.0.linear_attn`
 * @spec: its shape
 *
 * `in_proj_qkv` [2kd+vd, H] (parts q, k, v), `in_proj_z` [vd, H], `in_proj_b`,
 * `in_proj_a` [nv, H], `conv1d` [2kd+vd, 1, K] (q, k, v channel blocks), `A_log` [nv] and
 * `norm` [dv] in @spec's a_log_norm_dtype, `dt_bias` [nv], `out_proj` [H, vd]; kd = nk*dk,
 * vd = nv*dv; q/k split by key heads, v/z/b/a by value heads.
 *
 * Returns: (transfer none): the block.
 */
WSYNC_API WsyncBlock *wsync_model_add_linear_attention(WsyncModel *m, const char *module,
                                                       const WsyncLinearAttention *spec);

/**
 * WsyncDecoderLayer:
 * @hidden: hidden size H (the two norms' length)
 * @attention: (nullable): a full-attention block, under `PREFIX.self_attn`
 * @linear_attention: (nullable): or a linear-attention block, under `PREFIX.linear_attn`
 * @mlp: (nullable): a gated MLP under `PREFIX.mlp`
 * @moe: (nullable): or a mixture-of-experts block under `PREFIX.mlp`
 * @reserved: room for growth; zero
 *
 * The pre-norm decoder layer of Llama, Qwen3 and their descendants.  Exactly one of
 * @attention and @linear_attention, exactly one of @mlp and @moe (else the remapper's
 * mistake, recorded as wsync_model_add_tensor() records one).
 */
typedef struct {
  guint64 hidden;
  const WsyncAttention *attention;
  const WsyncLinearAttention *linear_attention;
  const WsyncMlp *mlp;
  const WsyncMoe *moe;
  gpointer reserved[4];
} WsyncDecoderLayer;

/**
 * wsync_model_add_decoder_layer:
 * @m: the model
 * @layers: the module of the model's layers, e.g. `model.layers`
 * @index: the layer's index: its module PREFIX is `LAYERS.INDEX`
 * @layer: what it holds
 *
 * `PREFIX.input_layernorm.weight` [H], the attention of its kind,
 * `PREFIX.post_attention_layernorm.weight` [H], and the MLP or MoE block under
 * `PREFIX.mlp` (see wsync_model_add_attention(), wsync_model_add_linear_attention(),
 * wsync_model_add_mlp(), wsync_model_add_moe()).
 */
WSYNC_API void wsync_model_add_decoder_layer(WsyncModel *m, const char *layers, guint64 index,
                                             const WsyncDecoderLayer *layer);

/**
 * WsyncLayerField:
 * @WSYNC_LAYER_FIELD_COUNT: the number of decoder layers (`num_hidden_layers`)
 * @WSYNC_LAYER_FIELD_PER_LAYER: a list with one element per decoder layer, in order
 *   (`layer_types`)
 * @WSYNC_LAYER_FIELD_INDICES: a list of decoder-layer indices (`mlp_only_layers`)
 *
 * What a config field says about the decoder layers (wsync_model_declare_layer_field()).
 */
typedef enum {
  WSYNC_LAYER_FIELD_COUNT,
  WSYNC_LAYER_FIELD_PER_LAYER,
  WSYNC_LAYER_FIELD_INDICES,
} WsyncLayerField;

/**
 * wsync_model_declare_layer_field:
 * @m: the model being described
 * @section: where the field is
 * @key: the field
 * @kind: what it says about the decoder layers
 *
 * Declares a field of config.json that describes the decoder layers, so that wsync can
 * write the config of the model's first N layers (wsync_config_trim_layers(), `wsync
 * synth --layers N`) without knowing the model: the count becomes N, a per-layer list
 * keeps its first N elements, an index list the indices below N.  A field the config
 * does not have is skipped.  A model that declares no count cannot be trimmed.
 */
WSYNC_API void wsync_model_declare_layer_field(WsyncModel *m, const WsyncConfigSection *section,
                                               const char *key, WsyncLayerField kind);

/**
 * WsyncRemapFunc:
 * @model: the model to describe
 * @user_data: the data given at registration
 * @error: return location for an error (config errors: #WSYNC_ERROR_BAD_INPUT)
 *
 * A remapper: describes the model from its config.json.
 *
 * Returns: %TRUE on success.
 */
typedef gboolean (*WsyncRemapFunc)(WsyncModel *model, gpointer user_data, GError **error);

/**
 * wsync_plugin_add_remapper:
 * @plugin: the plugin being registered
 * @name: the entry's name
 * @priority: higher first
 * @serves: comma-separated `model_type`s
 * @func: the remapper
 * @user_data: (transfer full) (nullable): passed to @func
 * @destroy: (nullable): frees @user_data
 * @error: return location for a #WSYNC_ERROR_PLUGIN error
 *
 * wsync_plugin_add_entry() for a #WsyncRemapFunc.
 *
 * Returns: %TRUE when added.
 */
WSYNC_API gboolean wsync_plugin_add_remapper(WsyncPlugin *plugin, const char *name, int priority,
                                             const char *serves, WsyncRemapFunc func,
                                             gpointer user_data, GDestroyNotify destroy,
                                             GError **error);

G_END_DECLS

#endif /* WSYNC_MODEL_H */
