/* wsync plugin "dtype-key", an example of a plugin built outside wsync's tree against
 * the installed headers and library (see Makefile and README in this directory).
 *
 * The key that names a model's dtype in config.json changed: Transformers 4 writes
 * `torch_dtype`, Transformers 5 writes `dtype` and still reads `torch_dtype` (wsync's
 * docs/hf-checkpoints.md, "dtype / torch_dtype").  A reader that knows only one of them
 * takes the model's dtype from its own default when the config says it under the
 * other.  This config patcher writes the key the reader expects, wherever a config
 * holds one: at the top, and in the nested model configs (`text_config` of multimodal
 * models, and every other `*_config` object).  A renamed key keeps its place among the
 * others.  When both keys are present and agree, the other one is dropped; when they
 * disagree, the config is refused rather than one value chosen.
 *
 * Option `key`: "torch_dtype" (the default: read by Transformers 4 and 5 alike) or
 * "dtype".
 */
#include <string.h>

#include <wsync/plugin.h>

#define DTYPE "dtype"
#define TORCH_DTYPE "torch_dtype"

/* The patcher's user data: the key to write. */
typedef struct {
  char *key;
} DtypeKey;

static void
dtype_key_free(gpointer data)
{
  DtypeKey *dk = data;

  g_free(dk->key);
  g_free(dk);
}

/* Renames the member @from of @object to @to, keeping the order of the members. */
static void
rename_member(JsonObject *object, const char *from, const char *to)
{
  g_autoptr(GList) names = json_object_get_members(object); /* in order */
  g_autoptr(GPtrArray) keys = g_ptr_array_new_with_free_func(g_free);
  g_autoptr(GPtrArray) values = g_ptr_array_new_with_free_func((GDestroyNotify)json_node_unref);

  for (GList *l = names; l != NULL; l = l->next) {
    const char *name = l->data;
    g_ptr_array_add(keys, g_strdup(strcmp(name, from) == 0 ? to : name));
    g_ptr_array_add(values, json_node_ref(json_object_get_member(object, name)));
  }
  for (GList *l = names; l != NULL; l = l->next)
    json_object_remove_member(object, l->data);
  for (guint i = 0; i < keys->len; i++)
    json_object_set_member(object, keys->pdata[i], json_node_ref(values->pdata[i]));
}

/* One config object: @where names it in errors ("" or "text_config."). */
static gboolean
patch_object(JsonObject *object, const char *where, const char *key, GError **error)
{
  const char *other = strcmp(key, DTYPE) == 0 ? TORCH_DTYPE : DTYPE;
  JsonNode *mine = json_object_get_member(object, key);
  JsonNode *theirs = json_object_get_member(object, other);

  if (theirs == NULL)
    return TRUE;
  if (mine == NULL) {
    rename_member(object, other, key);
    return TRUE;
  }
  if (!json_node_equal(mine, theirs)) {
    g_autofree char *a = json_to_string(mine, FALSE);
    g_autofree char *b = json_to_string(theirs, FALSE);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%s%s is %s but %s%s is %s: which one is the model's dtype?", where, key, a,
                where, other, b);
    return FALSE;
  }
  json_object_remove_member(object, other);
  return TRUE;
}

static gboolean
dtype_key_patch(JsonNode *config, gpointer user_data, GError **error)
{
  const DtypeKey *dk = user_data;
  JsonObject *root = json_node_get_object(config);

  if (!patch_object(root, "", dk->key, error))
    return FALSE;
  /* (the names once the top is patched: a rename re-adds the members) */
  g_autoptr(GList) names = json_object_get_members(root);
  for (GList *l = names; l != NULL; l = l->next) {
    JsonNode *node = json_object_get_member(root, l->data);
    g_autofree char *where = g_strconcat(l->data, ".", NULL);
    if (node != NULL && g_str_has_suffix(l->data, "_config") && JSON_NODE_HOLDS_OBJECT(node) &&
        !patch_object(json_node_get_object(node), where, dk->key, error))
      return FALSE;
  }
  return TRUE;
}

/* libconfuse calls this for each value a conf.d file sets; the message reads
 * FILE:LINE: ... */
static int
validate_key(cfg_t *cfg, cfg_opt_t *opt)
{
  const char *value;

  if (cfg_opt_size(opt) == 0)
    return 0;
  value = cfg_opt_getnstr(opt, cfg_opt_size(opt) - 1);
  if (value != NULL && (strcmp(value, DTYPE) == 0 || strcmp(value, TORCH_DTYPE) == 0))
    return 0;
  cfg_error(cfg, "key must be \"torch_dtype\" or \"dtype\", not \"%s\"", value ? value : "");
  return -1;
}

/* Designated initialisers: CFG_STR() has no slot for a validating callback or a comment. */
static cfg_opt_t options[] = {
    {.name = "key",
     .type = CFGT_STR,
     .def.string = TORCH_DTYPE,
     .validcb = validate_key,
     .comment = WSYNC_OPTION_DOC(
         "The key config.json names the model's dtype with: torch_dtype is read by "
         "Transformers 4 and 5, dtype only by Transformers 5.",
         "\"torch_dtype\" or \"dtype\"")},
    CFG_END()};

static gboolean
dtype_key_register(WsyncPlugin *plugin, GError **error)
{
  DtypeKey *dk = g_new0(DtypeKey, 1);

  dk->key = g_strdup(cfg_getstr(wsync_plugin_get_options(plugin), "key"));
  return wsync_plugin_add_config_patcher(plugin, "dtype-key", WSYNC_PRIORITY_DEFAULT, NULL,
                                         dtype_key_patch, dk, dtype_key_free, error);
}

WSYNC_PLUGIN_DEFINE("dtype-key", "config.json names the dtype as torch_dtype or dtype", options,
                    dtype_key_register)
