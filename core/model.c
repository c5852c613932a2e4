/* wsync: the model a remapper describes (see <wsync/model.h>): config readers, logical
 * tensors, params, blocks, and the building blocks decoder models are made of. */
#include <stdarg.h>
#include <string.h>

#include "engine-private.h"

/* ------------------------------------------------------------------ config readers */

/* A member, NULL when absent or null (null means "not set" in Transformers configs,
 * e.g. "head_dim": null). */
static JsonNode *
field(const WsyncConfigSection *s, const char *key)
{
  JsonNode *node = json_object_get_member(s->object, key);

  return node != NULL && !JSON_NODE_HOLDS_NULL(node) ? node : NULL;
}

/* @text (JSON, valid UTF-8) of more than 64 bytes cut to at most its first 60, then
 * "...": a long value is named, not quoted whole.  The cut falls between two characters:
 * cut inside one, the message was no UTF-8 any more (the Python module's wsync.Error
 * became a UnicodeDecodeError). */
static void
clip_json_text(char *text)
{
  char *end = text + 60;

  if (strlen(text) <= 64)
    return;
  while (end > text && ((guchar)*end & 0xc0) == 0x80) /* a continuation byte */
    end--;
  strcpy(end, "...");
}

static gboolean
not_a(const WsyncConfigSection *s, const char *key, JsonNode *node, const char *want,
      GError **error)
{
  g_autofree char *text = json_to_string(node, FALSE);

  clip_json_text(text);
  return wsync_fail(error, WSYNC_ERROR_BAD_INPUT, "field \"%s%s\" must be %s, not %s", s->where,
                    key, want, text);
}

/* What an integer field must be, for [@min, @max]: "a positive integer" and the like
 * (a plugin may ask for more than 1, e.g. at least 2 experts). */
static char *
integer_wanted(guint64 min)
{
  if (min <= 1)
    return g_strdup(min == 1 ? "a positive integer" : "a non-negative integer");
  return g_strdup_printf("an integer of at least %" G_GUINT64_FORMAT, min);
}

static gboolean
node_uint(const WsyncConfigSection *s, const char *key, JsonNode *node, guint64 min, guint64 max,
          guint64 *out, GError **error)
{
  g_autofree char *want = integer_wanted(min);
  g_autofree char *bounded = NULL;
  gint64 v;

  if (!JSON_NODE_HOLDS_VALUE(node) || json_node_get_value_type(node) != G_TYPE_INT64)
    return not_a(s, key, node, want, error);
  v = json_node_get_int(node);
  if (v >= 0 && (guint64)v > max && max < WSYNC_CONFIG_SIZE_MAX)
    return wsync_fail(error, WSYNC_ERROR_BAD_INPUT,
                      "field \"%s%s\" is %" G_GINT64_FORMAT ", more than %" G_GUINT64_FORMAT,
                      s->where, key, v, max);
  if (v >= 0 && (guint64)v >= min && (guint64)v <= max) {
    *out = (guint64)v;
    return TRUE;
  }
  /* the range as the caller gave it: a count's own bound, else the size limit 2^31 - 1 */
  if (max < WSYNC_CONFIG_SIZE_MAX)
    bounded = g_strdup_printf("an integer from %" G_GUINT64_FORMAT " to %" G_GUINT64_FORMAT,
                              min, max);
  else if (max == WSYNC_CONFIG_SIZE_MAX)
    bounded = g_strdup_printf("%s below 2^31", want);
  else
    bounded = g_strdup(want);
  return not_a(s, key, node, bounded, error);
}

/* @key may name an alternative: "num_experts|num_local_experts". */
static JsonNode *
field_or_alternative(const WsyncConfigSection *s, const char *key, char **used)
{
  g_auto(GStrv) keys = g_strsplit(key, "|", 2);
  JsonNode *node = field(s, keys[0]);

  *used = g_strdup(keys[0]);
  if (node == NULL && keys[1] != NULL && (node = field(s, keys[1])) != NULL) {
    g_free(*used);
    *used = g_strdup(keys[1]);
  }
  return node;
}

gboolean
wsync_config_get_uint(const WsyncConfigSection *section, const char *key, guint64 min,
                      guint64 max, guint64 *out, GError **error)
{
  g_autofree char *used = NULL;
  JsonNode *node = field_or_alternative(section, key, &used);

  if (node == NULL) {
    g_auto(GStrv) keys = g_strsplit(key, "|", 2);
    if (keys[1] != NULL)
      return wsync_fail(error, WSYNC_ERROR_BAD_INPUT, "field \"%s%s\" (or %s) is missing",
                        section->where, keys[0], keys[1]);
    return wsync_fail(error, WSYNC_ERROR_BAD_INPUT, "field \"%s%s\" is missing", section->where,
                      key);
  }
  return node_uint(section, used, node, min, max, out, error);
}

gboolean
wsync_config_get_uint_or(const WsyncConfigSection *section, const char *key, guint64 min,
                         guint64 max, guint64 *out, GError **error)
{
  g_autofree char *used = NULL;
  JsonNode *node = field_or_alternative(section, key, &used);

  return node == NULL || node_uint(section, used, node, min, max, out, error);
}

gboolean
wsync_config_get_head_dim(const WsyncConfigSection *section, guint64 hidden, guint64 heads,
                          guint64 fallback, guint64 *out, GError **error)
{
  *out = fallback;
  if (!wsync_config_get_uint_or(section, "head_dim", 1, WSYNC_CONFIG_SIZE_MAX, out, error))
    return FALSE;
  if (*out != 0)
    return TRUE;
  if (heads == 0 || hidden % heads != 0)
    return wsync_fail(error, WSYNC_ERROR_BAD_INPUT,
                      "field \"%shead_dim\" is missing and %shidden_size %" G_GUINT64_FORMAT
                      " is not a multiple of num_attention_heads %" G_GUINT64_FORMAT,
                      section->where, section->where, hidden, heads);
  *out = hidden / heads;
  return TRUE;
}

gboolean
wsync_config_check_divides(const WsyncConfigSection *section, const char *key, guint64 value,
                           const char *multiple_key, guint64 multiple, GError **error)
{
  if (value != 0 && multiple % value == 0)
    return TRUE;
  return wsync_fail(error, WSYNC_ERROR_BAD_INPUT,
                    "field \"%s%s\" is %" G_GUINT64_FORMAT ", which does not divide %s%s %"
                    G_GUINT64_FORMAT,
                    section->where, key, value, section->where, multiple_key, multiple);
}

gboolean
wsync_config_get_bool_or(const WsyncConfigSection *section, const char *key, gboolean *out,
                         GError **error)
{
  g_autofree char *used = NULL;
  JsonNode *node = field_or_alternative(section, key, &used);

  if (node == NULL)
    return TRUE;
  if (!JSON_NODE_HOLDS_VALUE(node) || json_node_get_value_type(node) != G_TYPE_BOOLEAN)
    return not_a(section, used, node, "true or false", error);
  *out = json_node_get_boolean(node);
  return TRUE;
}

gboolean
wsync_config_get_string_or(const WsyncConfigSection *section, const char *key, const char **out,
                           GError **error)
{
  g_autofree char *used = NULL;
  JsonNode *node = field_or_alternative(section, key, &used);

  if (node == NULL)
    return TRUE;
  if (!JSON_NODE_HOLDS_VALUE(node) || json_node_get_value_type(node) != G_TYPE_STRING)
    return not_a(section, used, node, "a string", error);
  *out = json_node_get_string(node);
  return TRUE;
}

/* "\"a\" or \"b\"", "\"a\", \"b\" or \"c\"" of the first @n. */
static char *
quoted_choices(const char *const *choices, guint n)
{
  GString *s = g_string_new(NULL);

  for (guint i = 0; i < n; i++)
    g_string_append_printf(s, "%s\"%s\"", i == 0 ? "" : i + 1 == n ? " or " : ", ", choices[i]);
  return g_string_free(s, FALSE);
}

gboolean
wsync_config_get_choices(const WsyncConfigSection *section, const char *key,
                         const char *const *choices, guint n_named, guint64 length,
                         const char *length_key, guint *out, gboolean *present, GError **error)
{
  JsonNode *node = field(section, key);
  g_autofree char *named = quoted_choices(choices, n_named);
  JsonArray *list;

  *present = node != NULL;
  if (node == NULL)
    return TRUE;
  if (!JSON_NODE_HOLDS_ARRAY(node)) {
    g_autofree char *want = g_strdup_printf("a list of %s", named);
    return not_a(section, key, node, want, error);
  }
  list = json_node_get_array(node);
  if (json_array_get_length(list) != length)
    return wsync_fail(error, WSYNC_ERROR_BAD_INPUT,
                      "field \"%s%s\" has %u entries but %s%s is %" G_GUINT64_FORMAT,
                      section->where, key, json_array_get_length(list), section->where, length_key,
                      length);
  for (guint i = 0; i < length; i++) {
    JsonNode *item = json_array_get_element(list, i);
    const char *value = JSON_NODE_HOLDS_VALUE(item) &&
                                json_node_get_value_type(item) == G_TYPE_STRING
                            ? json_node_get_string(item)
                            : NULL;
    guint c = 0;
    while (choices[c] != NULL && g_strcmp0(choices[c], value) != 0)
      c++;
    if (choices[c] == NULL) {
      g_autofree char *at = g_strdup_printf("%s[%u]", key, i);
      return not_a(section, at, item, named, error);
    }
    out[i] = c;
  }
  return TRUE;
}

gboolean
wsync_config_get_indices(const WsyncConfigSection *section, const char *key, guint64 bound,
                         gboolean *out, GError **error)
{
  JsonNode *node = field(section, key);
  g_autofree char *want = g_strdup_printf("a list of indices below %" G_GUINT64_FORMAT, bound);
  JsonArray *list;

  if (node == NULL)
    return TRUE;
  if (!JSON_NODE_HOLDS_ARRAY(node))
    return not_a(section, key, node, want, error);
  list = json_node_get_array(node);
  if (json_array_get_length(list) > WSYNC_CONFIG_COUNT_MAX)
    return wsync_fail(error, WSYNC_ERROR_BAD_INPUT, "field \"%s%s\" has %u entries, more than %u",
                      section->where, key, json_array_get_length(list), WSYNC_CONFIG_COUNT_MAX);
  for (guint i = 0; i < json_array_get_length(list); i++) {
    JsonNode *item = json_array_get_element(list, i);
    if (!JSON_NODE_HOLDS_VALUE(item) || json_node_get_value_type(item) != G_TYPE_INT64 ||
        json_node_get_int(item) < 0 || (guint64)json_node_get_int(item) >= bound)
      return not_a(section, key, node, want, error);
    out[json_node_get_int(item)] = TRUE;
  }
  return TRUE;
}

gboolean
wsync_config_get_dtype(const WsyncConfigSection *sections, guint n_sections, WsyncDtype *out,
                       GError **error)
{
  static const char *const keys[] = {"dtype", "torch_dtype"};
  static const char *const names[] = {"bfloat16", "float16", "float32", NULL};
  static const WsyncDtype dtypes[] = {WSYNC_DTYPE_BF16, WSYNC_DTYPE_F16, WSYNC_DTYPE_F32};

  *out = WSYNC_DTYPE_BF16;
  for (guint s = 0; s < n_sections; s++)
    for (guint k = 0; k < G_N_ELEMENTS(keys); k++) {
      JsonNode *node = field(&sections[s], keys[k]);
      const char *value;
      if (node == NULL)
        continue;
      value = JSON_NODE_HOLDS_VALUE(node) && json_node_get_value_type(node) == G_TYPE_STRING
                  ? json_node_get_string(node)
                  : NULL;
      for (guint i = 0; value != NULL && names[i] != NULL; i++)
        if (strcmp(value, names[i]) == 0) {
          *out = dtypes[i];
          return TRUE;
        }
      return not_a(&sections[s], keys[k], node, "\"bfloat16\", \"float16\" or \"float32\"",
                    error);
    }
  return TRUE;
}

/* ------------------------------------------------------------------ the model */

void
source_set_geometry(Source *src, const WsyncBox *box, const WsyncRegion *region)
{
  guint n = box->ndim;

  g_free(src->axes);
  src->ndim = n;
  src->origin = region->origin;
  src->axes = g_new(guint64, 3 * MAX(n, 1));
  memcpy(src->axes, box->offset, n * sizeof(guint64));
  memcpy(src->axes + n, box->extent, n * sizeof(guint64));
  memcpy(src->axes + 2 * n, region->stride, n * sizeof(guint64));
}

void
source_geometry(const Source *src, WsyncBox *box, WsyncRegion *region)
{
  guint n = src->ndim;

  memset(box, 0, sizeof *box);
  memset(region, 0, sizeof *region);
  box->ndim = n;
  memcpy(box->offset, src->axes, n * sizeof(guint64));
  memcpy(box->extent, src->axes + n, n * sizeof(guint64));
  region->origin = src->origin;
  memcpy(region->stride, src->axes + 2 * n, n * sizeof(guint64));
}

static void
source_clear(gpointer data)
{
  Source *src = data;

  g_free(src->axes);
}

static GArray *
sources_new(void)
{
  GArray *sources = g_array_new(FALSE, TRUE, sizeof(Source));

  g_array_set_clear_func(sources, source_clear);
  return sources;
}

static void
logical_free(gpointer data)
{
  WsyncLogicalTensor *lt = data;

  g_free(lt->name);
  g_array_unref(lt->sources);
  g_free(lt);
}

static void
param_free(gpointer data)
{
  WsyncParam *param = data;

  g_free(param->name);
  g_strfreev(param->aliases);
  g_free(param);
}

static void
block_free(gpointer data)
{
  WsyncBlock *block = data;

  g_free(block->module);
  g_free(block->runtime_drop);
  g_ptr_array_unref(block->params);
  g_free(block);
}

static void
drop_rule_clear(gpointer data)
{
  DropRule *rule = data;

  g_free(rule->rule);
  g_free(rule->glob);
}

static void
copy_rule_clear(gpointer data)
{
  CopyRule *rule = data;

  g_free(rule->rule);
  g_free(rule->name);
  g_free(rule->copy_of);
}

static void
layer_field_clear(gpointer data)
{
  LayerField *field = data;

  json_object_unref(field->object);
  g_free(field->key);
}

static void
runtime_switch_free(gpointer data)
{
  RuntimeSwitch *sw = data;

  g_free(sw->option);
  g_free(sw);
}

WsyncModel *
wsync_model_new(JsonObject *config, const char *model_type)
{
  WsyncModel *m = g_new0(WsyncModel, 1);

  m->config = json_object_ref(config);
  m->model_type = g_strdup(model_type);
  m->dtype = WSYNC_DTYPE_BF16;
  m->logical = g_ptr_array_new_with_free_func(logical_free);
  m->logical_by_name = g_hash_table_new(g_str_hash, g_str_equal);
  m->params = g_ptr_array_new_with_free_func(param_free);
  m->blocks = g_ptr_array_new_with_free_func(block_free);
  m->drop_rules = g_array_new(FALSE, TRUE, sizeof(DropRule));
  g_array_set_clear_func(m->drop_rules, drop_rule_clear);
  m->copy_rules = g_array_new(FALSE, TRUE, sizeof(CopyRule));
  g_array_set_clear_func(m->copy_rules, copy_rule_clear);
  m->layer_fields = g_array_new(FALSE, TRUE, sizeof(LayerField));
  g_array_set_clear_func(m->layer_fields, layer_field_clear);
  m->switches = g_ptr_array_new_with_free_func(runtime_switch_free);
  return m;
}

void
wsync_model_free(WsyncModel *m)
{
  if (m == NULL)
    return;
  json_object_unref(m->config);
  g_free(m->model_type);
  g_free(m->architecture);
  g_free(m->config_name);
  g_hash_table_unref(m->logical_by_name);
  g_ptr_array_unref(m->logical);
  g_ptr_array_unref(m->params);
  g_ptr_array_unref(m->blocks);
  g_array_unref(m->drop_rules);
  g_array_unref(m->copy_rules);
  g_array_unref(m->layer_fields);
  g_free(m->runtime_drop);
  g_ptr_array_unref(m->switches);
  g_clear_error(&m->error);
  g_free(m->remapper);
  g_free(m->remapper_plugin);
  if (m->spare_tensor)
    logical_free(m->spare_tensor);
  if (m->spare_param)
    param_free(m->spare_param);
  if (m->spare_block)
    block_free(m->spare_block);
  g_free(m);
}

JsonObject *
wsync_model_get_config(WsyncModel *m)
{
  return m->config;
}

const char *
wsync_model_get_model_type(WsyncModel *m)
{
  return m->model_type;
}

const char *
wsync_model_get_config_name(WsyncModel *m)
{
  return m->config_name;
}

gboolean
wsync_model_config_section(WsyncModel *m, const char *key, gboolean fall_back,
                           WsyncConfigSection *out)
{
  JsonNode *node = key != NULL ? json_object_get_member(m->config, key) : NULL;

  if (node != NULL && JSON_NODE_HOLDS_OBJECT(node)) {
    g_autofree char *where = g_strconcat(key, ".", NULL);
    out->object = json_node_get_object(node);
    out->where = g_intern_string(where); /* lives as long as the section */
    return TRUE;
  }
  out->object = m->config;
  out->where = "";
  return key == NULL || fall_back;
}

/* config.json's architectures[0] when it is a string, else NULL (absent, null, empty,
 * or not what Transformers writes: the legacy setter then takes the default). */
static const char *
config_architecture(WsyncModel *m)
{
  JsonNode *node = json_object_get_member(m->config, "architectures");

  if (node != NULL && JSON_NODE_HOLDS_ARRAY(node) &&
      json_array_get_length(json_node_get_array(node)) > 0) {
    JsonNode *first = json_array_get_element(json_node_get_array(node), 0);
    if (JSON_NODE_HOLDS_VALUE(first) && json_node_get_value_type(first) == G_TYPE_STRING)
      return json_node_get_string(first);
  }
  return NULL;
}

/* Legacy: config.json's own word on the architecture wins over the plugin's default,
 * whatever class it names (wsync_model_accept_architecture() checks it). */
void
wsync_model_set_architecture(WsyncModel *m, const char *architecture)
{
  const char *from_config = config_architecture(m);

  g_free(m->architecture);
  m->architecture = g_strdup(from_config != NULL ? from_config : architecture);
}

/* `architectures` that is there but holds no class name to compare: not a list, or a
 * list whose first element is not a string.  Transformers and vLLM both index it
 * (`architectures[0]`), so such a config names no class either of them builds. */
static gboolean
check_architectures_shape(WsyncModel *m, GError **error)
{
  JsonNode *node = json_object_get_member(m->config, "architectures");
  JsonNode *first = NULL;

  if (node == NULL || JSON_NODE_HOLDS_NULL(node))
    return TRUE;
  if (JSON_NODE_HOLDS_ARRAY(node)) {
    JsonArray *list = json_node_get_array(node);
    if (json_array_get_length(list) == 0)
      return TRUE;
    first = json_array_get_element(list, 0);
    if (JSON_NODE_HOLDS_VALUE(first) && json_node_get_value_type(first) == G_TYPE_STRING)
      return TRUE;
  }
  g_autofree char *value = json_to_string(first != NULL ? first : node, FALSE);
  clip_json_text(value);
  return wsync_fail(error, WSYNC_ERROR_BAD_INPUT,
                    first != NULL ? "field \"architectures\" begins with %s, not a class name"
                                  : "field \"architectures\" is %s, not a list of class names",
                    value);
}

/* "NAME", escaped; a name of more than 64 characters as its first 60, then `..." (N
 * characters)`: a config can hold a class name of any length, and the refusal is one
 * line for a terminal (the other fields' values are clipped the same way, not_a()). */
static char *
quoted_class(const char *name)
{
  glong length = g_utf8_strlen(name, -1); /* json-glib hands out valid UTF-8 */

  if (length <= 64) {
    g_autofree char *escaped = g_strescape(name, NULL);
    return g_strdup_printf("\"%s\"", escaped);
  }
  g_autofree char *head = g_utf8_substring(name, 0, 60);
  g_autofree char *escaped = g_strescape(head, NULL);
  return g_strdup_printf("\"%s...\" (%ld characters)", escaped, length);
}

/* `, or as its alias "A"` / `, or as its aliases "A", "B"`: nothing without aliases. */
static char *
aliases_text(const char *const *aliases)
{
  GString *text = g_string_new(NULL);
  guint n = 0;

  for (const char *const *a = aliases; a != NULL && *a != NULL; a++, n++)
    g_string_append_printf(text, "%s\"%s\"", n == 0 ? "" : ", ", *a);
  if (n > 0)
    g_string_prepend(text, n == 1 ? ", or as its alias " : ", or as its aliases ");
  return g_string_free(text, FALSE);
}

gboolean
wsync_model_accept_architecture(WsyncModel *m, const char *architecture,
                                const char *const *aliases, const char *note, GError **error)
{
  g_return_val_if_fail(m != NULL && architecture != NULL, FALSE);
  const char *given = config_architecture(m);

  if (!check_architectures_shape(m, error))
    return FALSE;
  gboolean described = given == NULL || strcmp(given, architecture) == 0;
  for (const char *const *a = aliases; !described && a != NULL && *a != NULL; a++)
    described = strcmp(given, *a) == 0;
  if (!described) {
    g_autofree char *printable = quoted_class(given);
    g_autofree char *type = g_strescape(m->model_type, NULL);
    g_autofree char *others = aliases_text(aliases);
    return wsync_fail(error, WSYNC_ERROR_BAD_INPUT,
                      "field \"architectures\" begins with %s, but model_type \"%s\" is "
                      "supported only as \"%s\"%s%s%s",
                      printable, type, architecture, others, note != NULL ? " " : "",
                      note != NULL ? note : "");
  }
  /* an alias is the same class to the engine: backends key their tables by one name */
  g_free(m->architecture);
  m->architecture = g_strdup(architecture);
  return TRUE;
}

const char *
wsync_model_get_architecture(WsyncModel *m)
{
  return m->architecture;
}

void
wsync_model_set_dtype(WsyncModel *m, WsyncDtype dtype)
{
  m->dtype = dtype;
}

WsyncDtype
wsync_model_get_dtype(WsyncModel *m)
{
  return m->dtype;
}

void
wsync_model_fail(WsyncModel *m, const char *format, ...)
{
  va_list ap;
  g_autofree char *message = NULL;

  if (m->error != NULL)
    return;
  va_start(ap, format);
  message = g_strdup_vprintf(format, ap);
  va_end(ap);
  m->error = g_error_new_literal(WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT, message);
}

void
wsync_model_add_drop_rule(WsyncModel *m, const char *rule, const char *glob)
{
  DropRule r = {g_strdup(rule), g_strdup(glob)};

  g_array_append_val(m->drop_rules, r);
}

void
wsync_model_add_copy_rule(WsyncModel *m, const char *rule, const char *name,
                          const char *copy_of)
{
  CopyRule r = {g_strdup(rule), g_strdup(name), g_strdup(copy_of)};

  g_array_append_val(m->copy_rules, r);
}

void
wsync_model_begin_group(WsyncModel *m, WsyncGroup group, const char *runtime_drop)
{
  m->group = group;
  g_free(m->runtime_drop);
  m->runtime_drop = g_strdup(runtime_drop);
  m->runtime_switch = NULL;
}

void
wsync_model_begin_switched_group(WsyncModel *m, WsyncGroup group, const char *option,
                                 gboolean on)
{
  RuntimeSwitch *sw = NULL;

  wsync_model_begin_group(m, group, NULL);
  for (guint i = 0; i < m->switches->len && sw == NULL; i++)
    if (strcmp(((RuntimeSwitch *)m->switches->pdata[i])->option, option) == 0)
      sw = m->switches->pdata[i];
  if (sw == NULL) {
    sw = g_new0(RuntimeSwitch, 1);
    sw->option = g_strdup(option);
    sw->on = sw->conf_on = on;
    g_ptr_array_add(m->switches, sw);
  }
  m->runtime_switch = sw;
}

/* ------------------------------------------------------------------ logical tensors */

/* A tensor's element count must stay below 2^57, so that no shape, byte count or
 * element offset overflows anywhere. */
#define NUMEL_MAX (G_GUINT64_CONSTANT(1) << 57)

/* The most tensors a model may publish, every expert's counted one by one (the largest
 * published model, Qwen3.5-397B-A17B, has about 92000).  A config that makes more is
 * refused when a building block passes the budget; from then on the builders hand out
 * spare objects that nothing keeps, so a plugin's loop over 65536 layers of 65536
 * experts ends at once instead of allocating for hours. */
#define PUBLISHED_MAX (G_GUINT64_CONSTANT(1) << 20)

/* Counts @n more published tensors of @what; FALSE once the model is over budget. */
static gboolean
within_budget(WsyncModel *m, guint64 n, const char *what)
{
  if (m->spares_only)
    return FALSE;
  if (n <= PUBLISHED_MAX - m->published) {
    m->published += n;
    return TRUE;
  }
  m->spares_only = TRUE;
  wsync_model_fail(m,
                   "the config makes more than %" G_GUINT64_FORMAT " tensors (%s adds %"
                   G_GUINT64_FORMAT " to %" G_GUINT64_FORMAT ")",
                   PUBLISHED_MAX, what, n, m->published);
  return FALSE;
}

/* The remapper broke a rule of the model API (a name declared twice, a shape of too many
 * axes, a param without parts): a plugin's bug, not the config's.  Recorded as the model's
 * error naming the remapper (unless an error came first), and from then on the builders
 * hand out spares, so the plugin's own code runs to its end on objects nothing keeps and
 * the description is refused with that one line. */
static void G_GNUC_PRINTF(2, 3)
misuse(WsyncModel *m, const char *format, ...)
{
  va_list ap;
  g_autofree char *message = NULL;

  m->spares_only = TRUE;
  if (m->error != NULL)
    return;
  va_start(ap, format);
  message = g_strdup_vprintf(format, ap);
  va_end(ap);
  m->error = g_error_new(WSYNC_ERROR, WSYNC_ERROR_PLUGIN, "%s %s",
                         m->remapper != NULL ? m->remapper : "the model's description", message);
}

void
wsync_model_declare_layer_field(WsyncModel *m, const WsyncConfigSection *section,
                                const char *key, WsyncLayerField kind)
{
  if ((guint)kind > WSYNC_LAYER_FIELD_INDICES || key == NULL || section == NULL ||
      section->object == NULL) {
    misuse(m, "declares layer field \"%s\" without a section or of an unknown kind %d", key,
           (int)kind);
    return;
  }
  LayerField f = {json_object_ref(section->object), g_strdup(key), kind};

  g_array_append_val(m->layer_fields, f);
}

static WsyncLogicalTensor *
spare_tensor(WsyncModel *m)
{
  if (m->spare_tensor == NULL) {
    m->spare_tensor = g_new0(WsyncLogicalTensor, 1);
    m->spare_tensor->name = g_strdup("(spare)");
    m->spare_tensor->ndim = 1;
    m->spare_tensor->sources = sources_new();
  }
  return m->spare_tensor;
}

static gboolean
numel_fits(guint ndim, const guint64 *shape)
{
  guint64 numel;

  return wsync_shape_numel(ndim, shape, &numel) && numel <= NUMEL_MAX;
}

WsyncLogicalTensor *
wsync_model_add_tensor(WsyncModel *m, const char *name, WsyncDtype dtype, guint ndim,
                       const guint64 *shape)
{
  WsyncLogicalTensor *lt;
  static const guint64 none[1] = {0};

  if (ndim > WSYNC_MAX_DIMS)
    misuse(m, "declares tensor \"%s\" of %u axes, more than %d", name, ndim, WSYNC_MAX_DIMS);
  else if (!m->spares_only && g_hash_table_lookup(m->logical_by_name, name) != NULL)
    misuse(m, "declares tensor \"%s\" twice", name);
  if (!within_budget(m, 1, name))
    return spare_tensor(m);
  if (!numel_fits(ndim, shape)) {
    wsync_model_fail(m, "the sizes in the config make tensor \"%s\" of more than 2^57 elements",
                     name);
    shape = none; /* a placeholder of no elements keeps the description going */
    ndim = 1;
  }
  lt = g_new0(WsyncLogicalTensor, 1);
  lt->name = g_strdup(name);
  lt->dtype = lt->published_dtype = dtype;
  lt->ndim = ndim;
  memcpy(lt->shape, shape, ndim * sizeof(guint64));
  lt->ordinal = m->logical->len;
  lt->sources = sources_new();
  g_ptr_array_add(m->logical, lt);
  g_hash_table_insert(m->logical_by_name, lt->name, lt);
  return lt;
}

const char *
wsync_logical_get_name(const WsyncLogicalTensor *lt)
{
  return lt->name;
}

WsyncDtype
wsync_logical_get_dtype(const WsyncLogicalTensor *lt)
{
  return lt->dtype;
}

WsyncDtype
wsync_logical_get_published_dtype(const WsyncLogicalTensor *lt)
{
  return lt->published_dtype;
}

void
wsync_logical_set_dtype_follows_input(WsyncLogicalTensor *lt, WsyncDtype fallback)
{
  /* (declared before any input binds it: the builders run first) */
  lt->dtype = lt->published_dtype = fallback;
  lt->dtype_follows_input = TRUE;
}

/* Adds @table's published-dtype keys to @keys. */
static void
add_record_keys(GHashTable *table, GPtrArray *keys)
{
  GHashTableIter it;
  gpointer key;

  g_hash_table_iter_init(&it, table);
  while (g_hash_table_iter_next(&it, &key, NULL))
    if (g_str_has_prefix(key, WSYNC_PUBLISHED_DTYPE_KEY))
      g_ptr_array_add(keys, key);
}

static gint
compare_key_pointers(gconstpointer a, gconstpointer b)
{
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

const char *
wsync_published_dtype_first_difference(GHashTable *a, GHashTable *b)
{
  g_autoptr(GPtrArray) keys = g_ptr_array_new();

  add_record_keys(a, keys);
  add_record_keys(b, keys);
  g_ptr_array_sort(keys, compare_key_pointers);
  for (guint i = 0; i < keys->len; i++)
    if (g_strcmp0(g_hash_table_lookup(a, keys->pdata[i]), g_hash_table_lookup(b, keys->pdata[i])) != 0)
      return keys->pdata[i];
  return NULL;
}

guint
wsync_logical_get_ndim(const WsyncLogicalTensor *lt)
{
  return lt->ndim;
}

const guint64 *
wsync_logical_get_shape(const WsyncLogicalTensor *lt)
{
  return lt->shape;
}

const WsyncParam *
wsync_logical_get_param(const WsyncLogicalTensor *lt)
{
  return lt->param;
}

/* ------------------------------------------------------------------ params and blocks */

WsyncBlock *
wsync_model_add_block(WsyncModel *m, WsyncBlockKind kind, const char *module)
{
  WsyncBlock *block = g_new0(WsyncBlock, 1);

  if (m->spares_only && m->spare_block != NULL) {
    g_free(block);
    return m->spare_block;
  }
  block->kind = kind;
  block->module = g_strdup(module);
  block->group = m->group;
  block->runtime_drop = g_strdup(m->runtime_drop);
  block->runtime_switch = m->runtime_switch;
  block->params = g_ptr_array_new();
  if (m->spares_only)
    return m->spare_block = block; /* kept by nothing but the model's spare */
  g_ptr_array_add(m->blocks, block);
  return block;
}

WsyncBlockKind
wsync_block_get_kind(const WsyncBlock *block)
{
  return block->kind;
}

const char *
wsync_block_get_module(const WsyncBlock *block)
{
  return block->module;
}

WsyncGroup
wsync_block_get_group(const WsyncBlock *block)
{
  return block->group;
}

const char *
wsync_block_get_runtime_drop(const WsyncBlock *block)
{
  if (block->runtime_switch != NULL)
    return block->runtime_switch->on ? block->runtime_switch->option : NULL;
  return block->runtime_drop;
}

const WsyncParam *
wsync_block_get_param(const WsyncBlock *block, WsyncRole role)
{
  return role < WSYNC_ROLE_COUNT ? block->by_role[role] : NULL;
}

const WsyncParam *
wsync_block_find_param(const WsyncBlock *block, WsyncRole role, const char *leaf)
{
  for (guint i = 0; i < block->params->len; i++) {
    const WsyncParam *param = block->params->pdata[i];
    if (param->role == role && strcmp(wsync_param_get_leaf(param), leaf) == 0)
      return param;
  }
  return NULL;
}

WsyncExpertsForm
wsync_block_get_experts_form(const WsyncBlock *block)
{
  return block->experts_form;
}

WsyncParam *
wsync_model_add_param(WsyncModel *m, WsyncBlock *block, const char *name, WsyncParamKind kind,
                      WsyncRole role, guint n_parts, const WsyncPart *parts)
{
  WsyncParam *param;

  if (n_parts < 1 || n_parts > WSYNC_PARAM_MAX_PARTS)
    misuse(m, "declares param \"%s\" of %u parts (1 to %d)", name, n_parts,
           WSYNC_PARAM_MAX_PARTS);
  for (guint i = 0; i < n_parts && !m->spares_only; i++)
    if (parts[i].lt == NULL)
      misuse(m, "declares param \"%s\" with no logical tensor in part %u", name, i);
  if (m->spares_only) {
    if (m->spare_param == NULL) {
      m->spare_param = g_new0(WsyncParam, 1);
      m->spare_param->name = g_strdup("(spare)");
      m->spare_param->n_parts = 1;
      m->spare_param->parts[0] = (WsyncPart){spare_tensor(m), 0, 0, 1, FALSE};
    }
    return m->spare_param;
  }
  param = g_new0(WsyncParam, 1);
  param->name = g_strdup(name);
  param->kind = kind;
  param->role = role;
  param->block = block;
  param->n_parts = n_parts;
  for (guint i = 0; i < n_parts; i++) {
    param->parts[i] = parts[i];
    if (param->parts[i].unit == 0)
      param->parts[i].unit = 1;
    /* length 0 means: to the end of axis 0 */
    if (param->parts[i].length == 0 && parts[i].lt->ndim > 0)
      param->parts[i].length = parts[i].lt->shape[0] - parts[i].start;
    if (parts[i].lt->param == NULL)
      parts[i].lt->param = param;
  }
  if (role != WSYNC_ROLE_NONE && role < WSYNC_ROLE_COUNT && block->by_role[role] == NULL)
    block->by_role[role] = param;
  g_ptr_array_add(block->params, param);
  g_ptr_array_add(m->params, param);
  return param;
}

WsyncParam *
wsync_model_add_whole(WsyncModel *m, WsyncBlock *block, const char *name, WsyncParamKind kind,
                      WsyncRole role, guint ndim, guint64 d0, guint64 d1, guint64 d2)
{
  const guint64 shape[3] = {d0, d1, d2};
  WsyncPart part = {wsync_model_add_tensor(m, name, m->dtype, MIN(ndim, 3), shape), 0, 0, 1,
                    FALSE};

  return wsync_model_add_param(m, block, name, kind, role, 1, &part);
}

const char *
wsync_param_get_leaf(const WsyncParam *param)
{
  const char *dot = strrchr(param->name, '.');

  return dot != NULL ? dot + 1 : param->name;
}

static void
add_alias(WsyncParam *param, const char *name)
{
  guint n = param->aliases != NULL ? g_strv_length(param->aliases) : 0;

  param->aliases = g_renew(char *, param->aliases, n + 2);
  param->aliases[n] = g_strdup(name);
  param->aliases[n + 1] = NULL;
}

/* ------------------------------------------------------------------ building blocks */

/* MODULE.LEAF, or LEAF for a module at the top. */
static char *
child(const char *module, const char *leaf)
{
  return module[0] != '\0' ? g_strconcat(module, ".", leaf, NULL) : g_strdup(leaf);
}

/* A param of all of a new logical tensor MODULE.LEAF, in units of @unit rows. */
static WsyncParam *
whole_in(WsyncModel *m, WsyncBlock *block, const char *leaf, WsyncDtype dtype,
         WsyncParamKind kind, WsyncRole role, guint64 unit, gboolean replicate, guint ndim,
         const guint64 *shape)
{
  g_autofree char *name = child(block->module, leaf);
  WsyncPart part = {wsync_model_add_tensor(m, name, dtype, ndim, shape), 0, 0, unit, replicate};

  return wsync_model_add_param(m, block, name, kind, role, 1, &part);
}

static WsyncParam *
matrix(WsyncModel *m, WsyncBlock *block, const char *leaf, WsyncParamKind kind, WsyncRole role,
       guint64 rows, guint64 cols, guint64 unit, gboolean replicate)
{
  const guint64 shape[2] = {rows, cols};

  return whole_in(m, block, leaf, m->dtype, kind, role, unit, replicate, 2, shape);
}

static WsyncParam *
vector(WsyncModel *m, WsyncBlock *block, const char *leaf, WsyncParamKind kind, WsyncRole role,
       guint64 n, guint64 unit)
{
  return whole_in(m, block, leaf, m->dtype, kind, role, unit, FALSE, 1, &n);
}

void
wsync_model_add_vocab(WsyncModel *m, const char *embedding, const char *lm_head, guint64 vocab,
                      guint64 hidden, gboolean tied)
{
  WsyncBlock *block = wsync_model_add_block(m, WSYNC_BLOCK_VOCAB, "");
  WsyncParam *embed =
      matrix(m, block, embedding, WSYNC_PARAM_VOCAB, WSYNC_ROLE_EMBEDDING, vocab, hidden, 1, FALSE);

  /* a tied LM head is the embedding itself, registered under a second name */
  if (tied)
    add_alias(embed, lm_head);
  else
    matrix(m, block, lm_head, WSYNC_PARAM_VOCAB, WSYNC_ROLE_LM_HEAD, vocab, hidden, 1, FALSE);
}

WsyncParam *
wsync_model_add_norm(WsyncModel *m, const char *name, guint64 size)
{
  WsyncBlock *block = wsync_model_add_block(m, WSYNC_BLOCK_OTHER, "");

  return vector(m, block, name, WSYNC_PARAM_REPLICATED, WSYNC_ROLE_NONE, size, 1);
}

/* q rows are per head [q_h; gate_h] with the output gate (2D rows), k and v are
 * replicated over ranks when there are fewer KV heads than ranks. */
WsyncBlock *
wsync_model_add_attention(WsyncModel *m, const char *module, const WsyncAttention *a)
{
  WsyncBlock *block = wsync_model_add_block(m, WSYNC_BLOCK_ATTENTION, module);
  guint64 g = a->output_gate ? 2 : 1, q_rows = g * a->heads * a->head_dim;
  guint64 kv_rows = a->kv_heads * a->head_dim;

  matrix(m, block, "q_proj.weight", WSYNC_PARAM_COLUMN, WSYNC_ROLE_Q, q_rows, a->hidden,
         g * a->head_dim, FALSE);
  matrix(m, block, "k_proj.weight", WSYNC_PARAM_COLUMN, WSYNC_ROLE_K, kv_rows, a->hidden,
         a->head_dim, TRUE);
  matrix(m, block, "v_proj.weight", WSYNC_PARAM_COLUMN, WSYNC_ROLE_V, kv_rows, a->hidden,
         a->head_dim, TRUE);
  if (a->qkv_bias) {
    vector(m, block, "q_proj.bias", WSYNC_PARAM_COLUMN, WSYNC_ROLE_Q, q_rows, g * a->head_dim);
    whole_in(m, block, "k_proj.bias", m->dtype, WSYNC_PARAM_COLUMN, WSYNC_ROLE_K, a->head_dim,
             TRUE, 1, &kv_rows);
    whole_in(m, block, "v_proj.bias", m->dtype, WSYNC_PARAM_COLUMN, WSYNC_ROLE_V, a->head_dim,
             TRUE, 1, &kv_rows);
  }
  matrix(m, block, "o_proj.weight", WSYNC_PARAM_ROW, WSYNC_ROLE_O, a->hidden,
         a->heads * a->head_dim, 1, FALSE);
  if (a->o_bias)
    vector(m, block, "o_proj.bias", WSYNC_PARAM_REPLICATED, WSYNC_ROLE_O, a->hidden, 1);
  if (a->qk_norm) {
    vector(m, block, "q_norm.weight", WSYNC_PARAM_REPLICATED, WSYNC_ROLE_Q_NORM, a->head_dim, 1);
    vector(m, block, "k_norm.weight", WSYNC_PARAM_REPLICATED, WSYNC_ROLE_K_NORM, a->head_dim, 1);
  }
  return block;
}

/* gate_proj, up_proj, down_proj of @kind's roles (a MLP, or a MoE block's shared expert
 * under MODULE.shared_expert), with their biases when @bias: gate and up biases are
 * split like their weights' rows, the row-parallel down_proj's bias is held whole. */
static void
gated_mlp(WsyncModel *m, WsyncBlock *block, const char *prefix, guint64 hidden, guint64 inter,
          WsyncRole gate_role, gboolean bias)
{
  g_autofree char *gate = g_strconcat(prefix, "gate_proj.weight", NULL);
  g_autofree char *up = g_strconcat(prefix, "up_proj.weight", NULL);
  g_autofree char *down = g_strconcat(prefix, "down_proj.weight", NULL);

  /* the three roles follow each other in both families */
  matrix(m, block, gate, WSYNC_PARAM_COLUMN, gate_role, inter, hidden, 1, FALSE);
  matrix(m, block, up, WSYNC_PARAM_COLUMN, gate_role + 1, inter, hidden, 1, FALSE);
  matrix(m, block, down, WSYNC_PARAM_ROW, gate_role + 2, hidden, inter, 1, FALSE);
  if (bias) {
    g_autofree char *gate_bias = g_strconcat(prefix, "gate_proj.bias", NULL);
    g_autofree char *up_bias = g_strconcat(prefix, "up_proj.bias", NULL);
    g_autofree char *down_bias = g_strconcat(prefix, "down_proj.bias", NULL);

    vector(m, block, gate_bias, WSYNC_PARAM_COLUMN, gate_role, inter, 1);
    vector(m, block, up_bias, WSYNC_PARAM_COLUMN, gate_role + 1, inter, 1);
    vector(m, block, down_bias, WSYNC_PARAM_REPLICATED, gate_role + 2, hidden, 1);
  }
}

WsyncBlock *
wsync_model_add_mlp(WsyncModel *m, const char *module, const WsyncMlp *spec)
{
  WsyncBlock *block = wsync_model_add_block(m, WSYNC_BLOCK_MLP, module);

  gated_mlp(m, block, "", spec->hidden, spec->intermediate, WSYNC_ROLE_GATE, spec->bias);
  return block;
}

WsyncBlock *
wsync_model_add_moe(WsyncModel *m, const char *module, const WsyncMoe *spec)
{
  WsyncBlock *block = wsync_model_add_block(m, WSYNC_BLOCK_MOE, module);
  const guint64 gate_up[3] = {spec->experts, spec->intermediate, spec->hidden};
  const guint64 down[3] = {spec->experts, spec->hidden, spec->intermediate};

  block->experts_form = spec->published;
  /* checkpoints may publish every expert's three projections one by one */
  if (!within_budget(m, 3 * spec->experts, module))
    return block;
  matrix(m, block, "gate.weight", WSYNC_PARAM_REPLICATED, WSYNC_ROLE_ROUTER, spec->experts,
         spec->hidden, 1, FALSE);
  whole_in(m, block, "experts.gate", m->dtype, WSYNC_PARAM_EXPERTS_COLUMN,
           WSYNC_ROLE_EXPERTS_GATE, 1, FALSE, 3, gate_up);
  whole_in(m, block, "experts.up", m->dtype, WSYNC_PARAM_EXPERTS_COLUMN, WSYNC_ROLE_EXPERTS_UP,
           1, FALSE, 3, gate_up);
  whole_in(m, block, "experts.down", m->dtype, WSYNC_PARAM_EXPERTS_ROW, WSYNC_ROLE_EXPERTS_DOWN,
           1, FALSE, 3, down);
  if (spec->shared_intermediate > 0) {
    gated_mlp(m, block, "shared_expert.", spec->hidden, spec->shared_intermediate,
              WSYNC_ROLE_SHARED_GATE, FALSE);
    matrix(m, block, "shared_expert_gate.weight", WSYNC_PARAM_REPLICATED,
           WSYNC_ROLE_SHARED_EXPERT_GATE, 1, spec->hidden, 1, FALSE);
  }
  return block;
}

/* Rows [start, start + length) of @lt in units of @unit. */
static WsyncPart
rows(WsyncLogicalTensor *lt, guint64 start, guint64 length, guint64 unit)
{
  WsyncPart p = {lt, start, length, unit, FALSE};

  return p;
}

WsyncBlock *
wsync_model_add_linear_attention(WsyncModel *m, const char *module,
                                 const WsyncLinearAttention *a)
{
  WsyncBlock *block = wsync_model_add_block(m, WSYNC_BLOCK_LINEAR_ATTENTION, module);
  guint64 kd = a->key_heads * a->key_dim, vd = a->value_heads * a->value_dim;
  g_autofree char *qkv_name = child(module, "in_proj_qkv.weight");
  g_autofree char *conv_name = child(module, "conv1d.weight");
  const guint64 qkv_shape[2] = {2 * kd + vd, a->hidden};
  const guint64 conv_shape[3] = {2 * kd + vd, 1, a->conv_kernel};
  WsyncLogicalTensor *qkv = wsync_model_add_tensor(m, qkv_name, m->dtype, 2, qkv_shape);
  WsyncLogicalTensor *conv = wsync_model_add_tensor(m, conv_name, m->dtype, 3, conv_shape);
  WsyncPart parts[3];
  WsyncParam *a_log, *norm;

  /* q, k, v rows of in_proj_qkv and channels of conv1d, split by key and value heads */
  parts[0] = rows(qkv, 0, kd, a->key_dim);
  parts[1] = rows(qkv, kd, kd, a->key_dim);
  parts[2] = rows(qkv, 2 * kd, vd, a->value_dim);
  wsync_model_add_param(m, block, qkv_name, WSYNC_PARAM_COLUMN, WSYNC_ROLE_LINEAR_QKV, 3, parts);
  matrix(m, block, "in_proj_z.weight", WSYNC_PARAM_COLUMN, WSYNC_ROLE_LINEAR_Z, vd, a->hidden,
         a->value_dim, FALSE);
  matrix(m, block, "in_proj_b.weight", WSYNC_PARAM_COLUMN, WSYNC_ROLE_LINEAR_B, a->value_heads,
         a->hidden, 1, FALSE);
  matrix(m, block, "in_proj_a.weight", WSYNC_PARAM_COLUMN, WSYNC_ROLE_LINEAR_A, a->value_heads,
         a->hidden, 1, FALSE);
  parts[0] = rows(conv, 0, kd, a->key_dim);
  parts[1] = rows(conv, kd, kd, a->key_dim);
  parts[2] = rows(conv, 2 * kd, vd, a->value_dim);
  wsync_model_add_param(m, block, conv_name, WSYNC_PARAM_COLUMN, WSYNC_ROLE_LINEAR_CONV, 3, parts);
  /* A_log and the gated norm: in the dtype the caller says (zero, the reserved field of
   * a caller built against an older header: F32, as they were then), or their input's */
  WsyncDtype a_log_norm_dtype =
      a->a_log_norm_dtype == WSYNC_DTYPE_BOOL ? WSYNC_DTYPE_F32 : a->a_log_norm_dtype;
  a_log = whole_in(m, block, "A_log", a_log_norm_dtype, WSYNC_PARAM_COLUMN,
                   WSYNC_ROLE_LINEAR_A_LOG, 1, FALSE, 1, &a->value_heads);
  vector(m, block, "dt_bias", WSYNC_PARAM_COLUMN, WSYNC_ROLE_LINEAR_DT_BIAS, a->value_heads, 1);
  norm = whole_in(m, block, "norm.weight", a_log_norm_dtype, WSYNC_PARAM_REPLICATED,
                  WSYNC_ROLE_LINEAR_NORM, 1, FALSE, 1, &a->value_dim);
  if (a->a_log_norm_dtype_varies) {
    wsync_logical_set_dtype_follows_input(a_log->parts[0].lt, a_log_norm_dtype);
    wsync_logical_set_dtype_follows_input(norm->parts[0].lt, a_log_norm_dtype);
  }
  matrix(m, block, "out_proj.weight", WSYNC_PARAM_ROW, WSYNC_ROLE_LINEAR_OUT, a->hidden, vd, 1,
         FALSE);
  return block;
}

void
wsync_model_add_decoder_layer(WsyncModel *m, const char *layers, guint64 index,
                              const WsyncDecoderLayer *layer)
{
  g_autofree char *prefix = g_strdup_printf("%s.%" G_GUINT64_FORMAT, layers, index);
  g_autofree char *in_norm = g_strconcat(prefix, ".input_layernorm.weight", NULL);
  g_autofree char *post_norm = g_strconcat(prefix, ".post_attention_layernorm.weight", NULL);
  g_autofree char *mlp = g_strconcat(prefix, ".mlp", NULL);

  if ((layer->attention == NULL) == (layer->linear_attention == NULL) ||
      (layer->mlp == NULL) == (layer->moe == NULL)) {
    misuse(m, "declares decoder layer %s without exactly one attention (attention, "
              "linear_attention) and one MLP (mlp, moe)", prefix);
    return;
  }
  wsync_model_add_norm(m, in_norm, layer->hidden);
  if (layer->attention != NULL) {
    g_autofree char *attn = g_strconcat(prefix, ".self_attn", NULL);
    wsync_model_add_attention(m, attn, layer->attention);
  } else {
    g_autofree char *attn = g_strconcat(prefix, ".linear_attn", NULL);
    wsync_model_add_linear_attention(m, attn, layer->linear_attention);
  }
  wsync_model_add_norm(m, post_norm, layer->hidden);
  if (layer->mlp != NULL)
    wsync_model_add_mlp(m, mlp, layer->mlp);
  else
    wsync_model_add_moe(m, mlp, layer->moe);
}
