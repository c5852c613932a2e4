/* wsync plugin "rope-compat": the RoPE settings of a config.json, in the form the
 * reader's Transformers version expects.
 *
 * Transformers 4 reads a top-level `rope_theta` and `rope_scaling` (null or a dict with
 * `rope_type`, or the older `type`); Transformers 5 reads one `rope_parameters` dict
 * (docs/hf-checkpoints.md §6).  Option `rope-format`:
 *
 *   transformers5  rope_scaling + rope_theta + partial_rotary_factor -> rope_parameters
 *                  (a top-level partial_rotary_factor stays, as Transformers 5 saves it)
 *   transformers4  rope_parameters -> rope_theta, rope_scaling, partial_rotary_factor
 *   keep           neither
 *
 * transformers4 is also what vLLM needs when it runs on Transformers 4 (#30046 to
 * #45161): it keeps a rope_parameters dict but overwrites its rope_theta with the
 * Transformers 4 config class's default, 10000.0 for LlamaConfig (docs/vllm.md §10,
 * "RoPE config").
 *
 * Whatever the option, `ignore_keys_at_rope_validation` is removed
 * (docs/hf-checkpoints.md §6, "The vLLM 0.18 + Transformers 5 break").
 * The top-level object is converted when it carries RoPE keys, and `text_config` (the
 * nested text model of Qwen3.5 and other multimodal configs) is converted the same way.
 *
 * The Transformers 5 form is what Transformers 5 itself builds on load: the reference
 * note hf-qwen.md §4 ("RoPE configuration: Transformers 4 → 5", its conversion
 * algorithm), after `RotaryEmbeddingConfigMixin.convert_rope_params_to_dict()` and
 * `standardize_rope_params()` in transformers/modeling_rope_utils.py, which
 * `PreTrainedConfig.__post_init__` runs (docs/hf-checkpoints.md §6):
 *
 *   1. `rope_parameters = rope_scaling or rope_parameters or {}`: a non-empty
 *      `rope_scaling` is taken whole and `rope_parameters` is not read;
 *   2. `rope_theta` goes in with setdefault, defaulting to 10000.0 (`default_theta`);
 *   3. `partial_rotary_factor` goes in with setdefault.  It is read without popping, so
 *      a top-level one stays where it is as well.  Qwen3.5 and Qwen3-Next default it to
 *      0.25 (`kwargs.setdefault` in their configs' `__post_init__`);
 *   4. `rope_type` defaults to the legacy `type`, else "default";
 *   5. llama3, yarn and longrope get `original_max_position_embeddings`: the top-level
 *      attribute if there is one (Phi-3 keeps it there), else `max_position_embeddings`.
 *
 * Where a config gives one setting two different values (a top-level `rope_theta`,
 * `partial_rotary_factor` or `original_max_position_embeddings` and another one inside
 * the dict, `type` against `rope_type`), Transformers silently keeps one of them; this
 * plugin refuses the config instead.  Transformers 4 reads the top-level keys where 5
 * reads the dict, and a dict with two types contradicts itself: writing either value
 * could change the model for some reader.  A
 * `rope_parameters` beside a non-empty `rope_scaling` is no such case: Transformers 4
 * reads only `rope_scaling`, and Transformers 5 takes it whole (step 1).
 *
 * Transformers 4 output writes `rope_type` only, never the legacy `type`: Transformers
 * 4 reads `rope_scaling.get("rope_type", rope_scaling.get("type"))`, Qwen3's own configs
 * and README use `rope_type`, and a second copy could only disagree.  `rope_scaling` is
 * null when nothing but `"rope_type": "default"` is left, as Qwen3's configs have it.
 * A config already in the Transformers 4 form is checked but not rewritten.
 *
 * Key order.  Every other key keeps its place.  The keys written go where the first of
 * `rope_parameters`, `rope_scaling` and `rope_theta` was.  Inside the RoPE dict, keys
 * keep their order, and an added key goes to its sorted place when the dict's keys are
 * sorted (Transformers saves with `json.dumps(sort_keys=True)`), else to the end (the
 * order of Transformers' setdefault calls).  So a config Transformers saved, with
 * sorted keys, converts back and forth to exactly itself.
 *
 * RoPE types: the reader of the form written must know the type (known_types_*);
 * the legacy "mrope" and "su" are written as the types they are (legacy_types).
 *
 * Numbers are moved as they are, so an integer stays an integer and a float a float.
 * The only numbers made up are Transformers' defaults: `rope_theta` 10000.0
 * (`default_theta`) and, for Qwen3.5 and Qwen3-Next only, `partial_rotary_factor` 0.25.
 */
#include <string.h>

#include <wsync/plugin.h>

typedef enum {
  ROPE_KEEP,
  ROPE_TRANSFORMERS5,
  ROPE_TRANSFORMERS4,
} RopeFormat;

/* The patcher's user data. */
typedef struct {
  RopeFormat format;
} RopeCompat;

/* The RoPE types the reader of each form knows: "default" plus ROPE_INIT_FUNCTIONS
 * (docs/hf-checkpoints.md §6, "RoPE types").  Anything else would fail when the model is
 * built.  Transformers 5 adds "proportional" (Gemma 4's p-RoPE, ROPE5), which vLLM's
 * get_rope() builds as well (vllm/model_executor/layers/rotary_embedding/__init__.py:144-153
 * @ df1376907b16); Transformers 4 has no such type (ROPE4b). */
static const char *const known_types_transformers4[] = {"default", "linear", "dynamic", "yarn",
                                                        "longrope", "llama3", NULL};
static const char *const known_types_transformers5[] = {
    "default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional", NULL};

/* Legacy names and the type each one is: Qwen2-VL's Transformers 4 configs say "mrope",
 * which their config classes rewrite to "default" (M-RoPE is default RoPE split by
 * mrope_section); Phi-3's first configs said "su", the old name of "longrope", which
 * vLLM rewrites for every model (patch_legacy_rope_type(), also accepting "type": "su"
 * beside "rope_type": "longrope", vllm/transformers_utils/config.py:496-497, 514-516 @
 * df1376907b16) and which no ROPE_INIT_FUNCTIONS of Transformers 4 or 5 has: written as
 * "longrope", it builds the same RoPE in vLLM and builds at all in Transformers. */
static const struct {
  const char *legacy, *name;
} legacy_types[] = {{"mrope", "default"}, {"su", "longrope"}};

/* The config classes whose __post_init__ does kwargs.setdefault("partial_rotary_factor",
 * 0.25) (hf-qwen.md §4 step 3; configuration_qwen3_next.py, configuration_qwen3_5.py,
 * configuration_qwen3_5_moe.py; docs/hf-checkpoints.md §3): Qwen3-Next, and the text
 * configs of Qwen3.5 and Qwen3.5-MoE, which hold their RoPE settings. */
static const char *const quarter_rotary_types[] = {"qwen3_next", "qwen3_5_text",
                                                   "qwen3_5_moe_text", NULL};

/* The types for which standardize_rope_params() fills original_max_position_embeddings. */
static const char *const types_with_original_max[] = {"llama3", "yarn", "longrope", NULL};

#define IGNORE_KEYS "ignore_keys_at_rope_validation"

static gboolean
parse_format(const char *value, RopeFormat *format)
{
  static const char *const names[] = {"keep", "transformers5", "transformers4"};

  for (guint i = 0; value != NULL && i < G_N_ELEMENTS(names); i++)
    if (strcmp(value, names[i]) == 0) {
      *format = (RopeFormat)i;
      return TRUE;
    }
  return FALSE;
}

/* ------------------------------------------------------------------ key order */

static int
member_index(JsonObject *obj, const char *name)
{
  g_autoptr(GList) names = json_object_get_members(obj);
  int i = 0;

  for (GList *l = names; l != NULL; l = l->next, i++)
    if (strcmp(l->data, name) == 0)
      return i;
  return -1;
}

/* Takes @name out of @obj and returns its value (a new reference), or NULL. */
static JsonNode *
take_member(JsonObject *obj, const char *name)
{
  JsonNode *node = json_object_get_member(obj, name);

  if (node == NULL)
    return NULL;
  json_node_ref(node);
  json_object_remove_member(obj, name);
  return node;
}

static void
drop_member(JsonObject *obj, const char *name)
{
  if (json_object_has_member(obj, name))
    json_object_remove_member(obj, name);
}

/* Adds @name (taking @node) at position @index, or at the end when @index is negative.
 * JsonObject only appends, so the members from @index on are taken out and put back. */
static void
insert_member(JsonObject *obj, const char *name, JsonNode *node, int index)
{
  g_autoptr(GList) names = json_object_get_members(obj);
  g_autoptr(GPtrArray) tail = g_ptr_array_new_with_free_func(g_free);
  int i = 0;

  for (GList *l = names; l != NULL; l = l->next, i++)
    if (index >= 0 && i >= index)
      g_ptr_array_add(tail, g_strdup(l->data));
  json_object_set_member(obj, name, node);
  for (guint t = 0; t < tail->len; t++) {
    const char *moved = tail->pdata[t];
    json_object_set_member(obj, moved, take_member(obj, moved));
  }
}

/* Where @name belongs in @obj if @obj's keys are sorted, as Transformers writes them;
 * -1 when they are not sorted. */
static int
sorted_index(JsonObject *obj, const char *name)
{
  g_autoptr(GList) names = json_object_get_members(obj);
  const char *previous = NULL;
  int index = -1, i = 0;

  for (GList *l = names; l != NULL; l = l->next, i++) {
    if (previous != NULL && strcmp(previous, l->data) > 0)
      return -1;
    if (index < 0 && strcmp(l->data, name) > 0)
      index = i;
    previous = l->data;
  }
  return index < 0 ? i : index;
}

/* Adds a key to a RoPE dict: at its sorted place if the dict is sorted, else last. */
static void
dict_add(JsonObject *dict, const char *name, JsonNode *node)
{
  insert_member(dict, name, node, sorted_index(dict, name));
}

/* ------------------------------------------------------------------ errors */

static gboolean
conflict(GError **error, const char *where, const char *key_a, JsonNode *a, const char *key_b,
         JsonNode *b)
{
  g_autofree char *text_a = json_to_string(a, FALSE);
  g_autofree char *text_b = json_to_string(b, FALSE);

  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
              "conflicting RoPE settings: %s%s is %s but %s%s is %s", where, key_a, text_a,
              where, key_b, text_b);
  return FALSE;
}

static gboolean
bad_value(GError **error, const char *where, const char *key, JsonNode *node, const char *want)
{
  g_autofree char *text = json_to_string(node, FALSE);

  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT, "%s%s must be %s, not %s", where, key,
              want, text);
  return FALSE;
}

static gboolean
is_number(JsonNode *node)
{
  GType type;

  if (!JSON_NODE_HOLDS_VALUE(node))
    return FALSE;
  type = json_node_get_value_type(node);
  return type == G_TYPE_INT64 || type == G_TYPE_DOUBLE;
}

/* ------------------------------------------------------------------ gathering */

/* One object being converted: the top level or text_config. */
typedef struct {
  JsonObject *obj;
  const char *where;  /* "" or "text_config.", prefixed to key names in messages */
  RopeFormat format;  /* the form written: whose reader must know the type */
  JsonObject *params; /* the Transformers 5 dict being built */
  const char *source; /* the key params came from, for messages */
  const char *model_type; /* the config class's model_type, or NULL */
} Rope;

/* Checks a `type` or `rope_type` value and returns its canonical name. */
static gboolean
type_name(JsonNode *node, const Rope *rope, const char *key, const char **name,
          GError **error)
{
  const char *const *known = rope->format == ROPE_TRANSFORMERS4 ? known_types_transformers4
                                                                 : known_types_transformers5;
  const char *value;
  g_autofree char *list = NULL;

  if (!JSON_NODE_HOLDS_VALUE(node) || json_node_get_value_type(node) != G_TYPE_STRING)
    return bad_value(error, rope->where, key, node, "a string");
  value = json_node_get_string(node);
  *name = value;
  for (guint i = 0; i < G_N_ELEMENTS(legacy_types); i++)
    if (strcmp(value, legacy_types[i].legacy) == 0)
      *name = legacy_types[i].name;
  if (g_strv_contains(known, *name))
    return TRUE;
  if (g_strv_contains(known_types_transformers5, *name)) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%s%s: RoPE type \"%s\" is Transformers 5's (and vLLM's); Transformers 4 "
                "has none, so rope-format transformers4 cannot write it",
                rope->where, key, value);
    return FALSE;
  }
  list = g_strjoinv(", ", (char **)known);
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
              "%s%s: unknown RoPE type \"%s\" (known: %s; legacy: mrope, su)", rope->where, key,
              value, list);
  return FALSE;
}

/* Folds the legacy `type` into `rope_type`, in its place (standardize_rope_params()
 * does setdefault("rope_type", get("type", ...))); the two must agree. */
static gboolean
fold_type(JsonObject *dict, const Rope *rope, const char *dict_key, GError **error)
{
  const char *where = rope->where;
  JsonNode *legacy = json_object_get_member(dict, "type");
  JsonNode *current = json_object_get_member(dict, "rope_type");
  g_autofree char *legacy_key = g_strconcat(dict_key, ".type", NULL);
  g_autofree char *current_key = g_strconcat(dict_key, ".rope_type", NULL);
  const char *legacy_name = NULL, *name = NULL;
  JsonNode *folded;

  if (legacy != NULL && !type_name(legacy, rope, legacy_key, &legacy_name, error))
    return FALSE;
  if (current != NULL && !type_name(current, rope, current_key, &name, error))
    return FALSE;
  if (legacy_name != NULL && name != NULL && strcmp(legacy_name, name) != 0)
    return conflict(error, where, legacy_key, legacy, current_key, current);
  if (legacy == NULL && current == NULL)
    return TRUE;
  /* A new node first: the names may point into the nodes replaced below. */
  folded = json_node_init_string(json_node_alloc(), name != NULL ? name : legacy_name);
  if (current != NULL)
    json_object_set_member(dict, "rope_type", folded);
  else
    insert_member(dict, "rope_type", folded, member_index(dict, "type"));
  drop_member(dict, "type");
  return TRUE;
}

/* A copy of @key's dict (rope_parameters or rope_scaling) with its type folded; an
 * empty dict when the key is absent or null; NULL on error. */
static JsonObject *
rope_dict_copy(Rope *rope, const char *key, GError **error)
{
  JsonNode *node = json_object_get_member(rope->obj, key);
  JsonObject *copy = json_object_new(), *dict;
  g_autoptr(GList) names = NULL;

  if (node == NULL || JSON_NODE_HOLDS_NULL(node))
    return copy;
  if (!JSON_NODE_HOLDS_OBJECT(node)) {
    bad_value(error, rope->where, key, node, "an object or null");
    json_object_unref(copy);
    return NULL;
  }
  dict = json_node_get_object(node);
  names = json_object_get_members(dict);
  for (GList *l = names; l != NULL; l = l->next)
    json_object_set_member(copy, l->data, json_node_copy(json_object_get_member(dict, l->data)));
  if (!fold_type(copy, rope, key, error)) {
    json_object_unref(copy);
    return NULL;
  }
  return copy;
}

/* TRUE when @obj's rope_scaling is absent, null or {}: the cases in which
 * `rope_scaling or rope_parameters` falls through to rope_parameters. */
static gboolean
scaling_is_empty(JsonObject *obj)
{
  JsonNode *node = json_object_get_member(obj, "rope_scaling");

  return node == NULL || JSON_NODE_HOLDS_NULL(node) ||
         (JSON_NODE_HOLDS_OBJECT(node) && json_object_get_size(json_node_get_object(node)) == 0);
}

/* Step 1, `rope_parameters = rope_scaling or rope_parameters or {}`
 * (hf-qwen.md §4; convert_rope_params_to_dict()): a non-empty rope_scaling is taken
 * whole and rope_parameters is not read, so none of its keys survive. */
static gboolean
gather_dicts(Rope *rope, GError **error)
{
  rope->source = scaling_is_empty(rope->obj) ? "rope_parameters" : "rope_scaling";
  rope->params = rope_dict_copy(rope, rope->source, error);
  return rope->params != NULL;
}

/* Steps 2, 3 and 5: a top-level number goes into the dict (setdefault in Transformers,
 * but here a different value already there is an error). */
static gboolean
gather_top_level(Rope *rope, const char *key, GError **error)
{
  JsonNode *top = json_object_get_member(rope->obj, key);
  JsonNode *inner = json_object_get_member(rope->params, key);
  g_autofree char *inner_key = g_strconcat(rope->source, ".", key, NULL);

  if (top == NULL || JSON_NODE_HOLDS_NULL(top))
    return TRUE;
  if (!is_number(top))
    return bad_value(error, rope->where, key, top, "a number");
  if (inner == NULL)
    dict_add(rope->params, key, json_node_copy(top));
  else if (!json_node_equal(top, inner))
    return conflict(error, rope->where, key, top, inner_key, inner);
  return TRUE;
}

/* Step 5: original_max_position_embeddings for llama3, yarn and longrope. */
static gboolean
gather_original_max(Rope *rope, GError **error)
{
  static const char key[] = "original_max_position_embeddings";
  const char *type = json_object_get_string_member(rope->params, "rope_type");
  JsonNode *max;

  if (!g_strv_contains(types_with_original_max, type))
    return TRUE;
  /* A top-level one (Phi-3) takes priority in Transformers; here it must agree. */
  if (!gather_top_level(rope, key, error))
    return FALSE;
  if (json_object_has_member(rope->params, key))
    return TRUE;
  max = json_object_get_member(rope->obj, "max_position_embeddings");
  if (max == NULL || !is_number(max)) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%s%s: rope_type \"%s\" needs %s, and %smax_position_embeddings to fill it from "
                "is missing",
                rope->where, rope->source, type, key, rope->where);
    return FALSE;
  }
  dict_add(rope->params, key, json_node_copy(max));
  return TRUE;
}

/* The whole Transformers 5 algorithm, in Transformers' order (which decides where the
 * keys it adds go in an unsorted dict). */
static gboolean
gather(Rope *rope, GError **error)
{
  JsonNode *theta;

  if (!gather_dicts(rope, error) || !gather_top_level(rope, "rope_theta", error))
    return FALSE;
  theta = json_object_get_member(rope->params, "rope_theta");
  if (theta == NULL)
    dict_add(rope->params, "rope_theta", json_node_init_double(json_node_alloc(), 10000.0));
  else if (!is_number(theta)) {
    g_autofree char *key = g_strconcat(rope->source, ".rope_theta", NULL);
    return bad_value(error, rope->where, key, theta, "a number");
  }
  if (!gather_top_level(rope, "partial_rotary_factor", error))
    return FALSE;
  /* Only in the dict: no top-level key is made up. */
  if (!json_object_has_member(rope->params, "partial_rotary_factor") &&
      rope->model_type != NULL && g_strv_contains(quarter_rotary_types, rope->model_type))
    dict_add(rope->params, "partial_rotary_factor", json_node_init_double(json_node_alloc(), 0.25));
  if (!json_object_has_member(rope->params, "rope_type"))
    dict_add(rope->params, "rope_type", json_node_init_string(json_node_alloc(), "default"));
  return gather_original_max(rope, error);
}

/* ------------------------------------------------------------------ writing */

/* Removes the RoPE keys and returns where the first of rope_parameters, rope_scaling
 * and rope_theta was: the keys written go there.  A top-level partial_rotary_factor
 * stays: Transformers 5 reads it without popping it (hf-qwen.md §4 step 3), so it keeps
 * it beside the dict's copy, and Transformers 4 reads it there. */
static int
remove_rope_keys(JsonObject *obj)
{
  static const char *const anchors[] = {"rope_parameters", "rope_scaling", "rope_theta"};
  int at = -1;

  for (guint i = 0; i < G_N_ELEMENTS(anchors); i++) {
    int k = member_index(obj, anchors[i]);
    if (k >= 0 && (at < 0 || k < at))
      at = k;
  }
  for (guint i = 0; i < G_N_ELEMENTS(anchors); i++)
    drop_member(obj, anchors[i]);
  return at;
}

static void
write_transformers5(JsonObject *obj, JsonObject *params)
{
  int at = remove_rope_keys(obj);

  insert_member(obj, "rope_parameters", json_node_init_object(json_node_alloc(), params), at);
}

/* TRUE when @params says nothing beyond `"rope_type": "default"`. */
static gboolean
is_plain_default(JsonObject *params)
{
  return json_object_get_size(params) == 1 &&
         g_strcmp0(json_object_get_string_member(params, "rope_type"), "default") == 0;
}

static void
write_transformers4(JsonObject *obj, JsonObject *params)
{
  JsonNode *theta = take_member(params, "rope_theta");
  JsonNode *factor = take_member(params, "partial_rotary_factor");
  int at = remove_rope_keys(obj);
  JsonNode *scaling = is_plain_default(params)
                          ? json_node_init_null(json_node_alloc())
                          : json_node_init_object(json_node_alloc(), params);

  insert_member(obj, "rope_scaling", scaling, at);
  insert_member(obj, "rope_theta", theta, at < 0 ? -1 : at + 1);
  if (factor == NULL)
    return;
  if (json_object_has_member(obj, "partial_rotary_factor")) {
    /* Already at the top level, with the same value (gather() checked). */
    json_node_unref(factor);
  } else {
    /* Its sorted place in a Transformers-saved config, else next to the others. */
    int k = sorted_index(obj, "partial_rotary_factor");
    insert_member(obj, "partial_rotary_factor", factor, k >= 0 ? k : at);
  }
}

/* ------------------------------------------------------------------ the patcher */

/* TRUE when rope_parameters is a dict of dicts keyed by layer type (Gemma3,
 * ModernBERT), which has no Transformers 4 form and which this plugin leaves alone. */
static gboolean
is_per_layer_type(JsonObject *obj)
{
  JsonNode *node = json_object_get_member(obj, "rope_parameters");
  g_autoptr(GList) values = NULL;

  if (node == NULL || !JSON_NODE_HOLDS_OBJECT(node))
    return FALSE;
  values = json_object_get_values(json_node_get_object(node));
  for (GList *l = values; l != NULL; l = l->next)
    if (!JSON_NODE_HOLDS_OBJECT(l->data))
      return FALSE;
  return values != NULL;
}

static gboolean
has_rope_keys(JsonObject *obj)
{
  return json_object_has_member(obj, "rope_parameters") ||
         json_object_has_member(obj, "rope_scaling") || json_object_has_member(obj, "rope_theta");
}

/* Works out the new RoPE dict for one object, whose config class is @model_type,
 * without touching it.  *params is left NULL when there is nothing to write: no RoPE
 * keys, a per-layer-type dict for transformers5, or a config already in the
 * Transformers 4 form for transformers4 (still checked, so a bad one is refused in
 * either direction). */
static gboolean
plan(JsonObject *obj, const char *where, const char *model_type, RopeFormat format,
     JsonObject **params, GError **error)
{
  Rope rope = {obj, where, format, NULL, NULL, model_type};

  *params = NULL;
  if (format == ROPE_KEEP || !has_rope_keys(obj))
    return TRUE;
  /* A non-empty rope_scaling replaces a per-layer-type dict like any other (step 1). */
  if (scaling_is_empty(obj) && is_per_layer_type(obj)) {
    if (format == ROPE_TRANSFORMERS5)
      return TRUE;
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%srope_parameters is keyed by layer type, which Transformers 4 configs "
                "cannot express",
                where);
    return FALSE;
  }
  if (!gather(&rope, error)) {
    g_clear_pointer(&rope.params, json_object_unref);
    return FALSE;
  }
  if (format == ROPE_TRANSFORMERS4 && !json_object_has_member(obj, "rope_parameters"))
    g_clear_pointer(&rope.params, json_object_unref);
  *params = rope.params;
  return TRUE;
}

static void
apply(JsonObject *obj, RopeFormat format, JsonObject *params)
{
  /* A class attribute, not configuration.  Written out it reloads as a list, which
   * Transformers 5 then combines with a set: TypeError (docs/hf-checkpoints.md §6). */
  drop_member(obj, IGNORE_KEYS);
  if (params == NULL)
    return;
  if (format == ROPE_TRANSFORMERS5)
    write_transformers5(obj, params);
  else
    write_transformers4(obj, params);
  json_object_unref(params);
}

static JsonObject *
text_config(JsonObject *root)
{
  JsonNode *node = json_object_get_member(root, "text_config");

  return node != NULL && JSON_NODE_HOLDS_OBJECT(node) ? json_node_get_object(node) : NULL;
}

/* @obj's model_type, or NULL when it has no string one. */
static const char *
model_type_of(JsonObject *obj)
{
  JsonNode *node = json_object_get_member(obj, "model_type");

  if (node == NULL || !JSON_NODE_HOLDS_VALUE(node) ||
      json_node_get_value_type(node) != G_TYPE_STRING)
    return NULL;
  return json_node_get_string(node);
}

/* The class text_config is built as: a Qwen3.5 root builds its own family's text config
 * class from the dict (its sub_configs), whatever the dict's model_type; any other root
 * is taken at text_config's own model_type. */
static const char *
text_model_type(JsonObject *root, JsonObject *text)
{
  const char *outer = model_type_of(root);

  if (g_strcmp0(outer, "qwen3_5") == 0)
    return "qwen3_5_text";
  if (g_strcmp0(outer, "qwen3_5_moe") == 0)
    return "qwen3_5_moe_text";
  return model_type_of(text);
}

/* Both objects are planned before either is changed, so a config that is refused is
 * left as it was. */
static gboolean
rope_patch(JsonNode *config, gpointer user_data, GError **error)
{
  const RopeCompat *compat = user_data;
  JsonObject *root, *text, *root_params = NULL, *text_params = NULL;

  if (config == NULL || !JSON_NODE_HOLDS_OBJECT(config)) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT, "config.json is not a JSON object");
    return FALSE;
  }
  root = json_node_get_object(config);
  text = text_config(root);
  if (!plan(root, "", model_type_of(root), compat->format, &root_params, error))
    return FALSE;
  if (text != NULL && !plan(text, "text_config.", text_model_type(root, text), compat->format,
                            &text_params, error)) {
    g_clear_pointer(&root_params, json_object_unref);
    return FALSE;
  }
  apply(root, compat->format, root_params);
  if (text != NULL)
    apply(text, compat->format, text_params);
  return TRUE;
}

/* ------------------------------------------------------------------ registration */

/* libconfuse calls this for each value a file sets; the core calls it with the file's
 * position, so the message reads FILE:LINE: ... */
static int
validate_rope_format(cfg_t *cfg, cfg_opt_t *opt)
{
  const char *value;
  RopeFormat format;

  if (cfg_opt_size(opt) == 0)
    return 0;
  value = cfg_opt_getnstr(opt, cfg_opt_size(opt) - 1);
  if (parse_format(value, &format))
    return 0;
  cfg_error(cfg, "rope-format must be transformers5, transformers4 or keep, not \"%s\"",
            value != NULL ? value : "");
  return -1;
}

/* Designated initialisers: CFG_STR() has no slot for a validating callback or a comment. */
static cfg_opt_t options[] = {
    {.name = "rope-format",
     .type = CFGT_STR,
     .flags = CFGF_NONE,
     .def.string = "keep",
     .validcb = validate_rope_format,
     .comment = WSYNC_OPTION_DOC(
         "The RoPE keys of every config.json wsync writes: transformers5 turns rope_scaling "
         "and rope_theta into rope_parameters, transformers4 turns rope_parameters back into "
         "rope_scaling and rope_theta (for Transformers 4, and for vLLM before 0.24 run on "
         "it, which replaces a rope_parameters dict's rope_theta with 10000.0), keep "
         "leaves them; ignore_keys_at_rope_validation, "
         "which breaks vLLM 0.18 with Transformers 5, is dropped in every case.",
         "\"keep\", \"transformers5\" or \"transformers4\"")},
    CFG_END()};

static gboolean
rope_register(WsyncPlugin *plugin, GError **error)
{
  const char *value = cfg_getstr(wsync_plugin_get_options(plugin), "rope-format");
  RopeCompat *compat = g_new0(RopeCompat, 1);

  /* The validator has seen every value a file set; this catches anything else. */
  if (!parse_format(value, &compat->format)) {
    g_free(compat);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_CONFIG,
                "rope-format must be transformers5, transformers4 or keep, not \"%s\"",
                value != NULL ? value : "");
    return FALSE;
  }
  return wsync_plugin_add_config_patcher(plugin, "rope-compat", WSYNC_PRIORITY_DEFAULT, NULL,
                                         rope_patch, compat, g_free, error);
}

WSYNC_PLUGIN_DEFINE("rope-compat",
                    "RoPE config keys for Transformers 4 or 5; drops ignore_keys_at_rope_validation",
                    options, rope_register)
