/* Test plugin: registers one entry of every kind and has options of every type.  Its
 * config patcher writes what it saw into the config, so tests can see the options. */
#include <string.h>

#include <wsync/wsync.h>

typedef struct {
  long level;
  char *mode;
  gboolean flag;
  guint n_names;
} GoodSettings;

static void
settings_free(gpointer data)
{
  GoodSettings *s = data;
  g_free(s->mode);
  g_free(s);
}

static gboolean
good_remap(WsyncModel *model, gpointer user_data, GError **error)
{
  (void)model;
  (void)user_data;
  (void)error;
  return TRUE;
}

static gboolean
good_layout(WsyncLayout *layout, gpointer user_data, GError **error)
{
  (void)layout;
  (void)user_data;
  (void)error;
  return TRUE;
}

/* Appends "good" to config["order"] and records the options it was registered with. */
static gboolean
good_patch(JsonNode *config, gpointer user_data, GError **error)
{
  GoodSettings *s = user_data;
  JsonObject *root = json_node_get_object(config);
  g_autofree char *seen = g_strdup_printf("level=%ld mode=%s flag=%s names=%u", s->level,
                                          s->mode, s->flag ? "true" : "false", s->n_names);

  (void)error;
  if (!json_object_has_member(root, "order"))
    json_object_set_array_member(root, "order", json_array_new());
  json_array_add_string_element(json_object_get_array_member(root, "order"), "good");
  json_object_set_string_member(root, "patched_by_good", seen);
  return TRUE;
}

/* Sets GOOD_MODE from the deployment mode and a value that needs shell quoting (with
 * the reason GOOD_REASON when wsync's environment has it); with GOOD_SETTING in wsync's
 * environment, advises the engine setting good.setting to its value (twice: the second
 * advice replaces the first). */
static gboolean
good_env(WsyncEnv *env, gpointer user_data, GError **error)
{
  g_autofree char *mode = g_strdup_printf("%s-%s", wsync_env_get_mode(env),
                                          wsync_env_getenv(env, "GOOD_MODE") ?: "unset");
  const char *setting = wsync_env_getenv(env, "GOOD_SETTING");
  (void)user_data;
  (void)error;
  wsync_env_set(env, "GOOD_MODE", mode, "the mode, after what rival set");
  wsync_env_set(env, "GOOD_QUOTE", "it's here", g_getenv("GOOD_REASON") ?: "a value with a quote");
  if (setting != NULL) {
    wsync_env_advise(env, "good.setting", "replaced", "replaced");
    wsync_env_advise(env, "good.setting", setting, "a setting no variable makes");
  }
  return TRUE;
}

static char *
good_file_name(WsyncLayout *layout, guint part, guint n_parts, gpointer user_data)
{
  (void)n_parts;
  (void)user_data;
  return g_strdup_printf("good-%u-%u.safetensors", wsync_layout_get_rank(layout), part);
}

static const WsyncTargetInfo good_target = {.name = "good-target",
                                            .description = "a target that holds nothing",
                                            .build = good_layout,
                                            .file_name = good_file_name};

/* Documented in both forms WSYNC_OPTION_DOC() allows, for `wsync plugins` to show: with
 * the values (level), a bare comment that is all description (mode), the values left
 * for wsync to say from the type (flag, names). */
static cfg_opt_t options[] = {
    {.name = "level",
     .type = CFGT_INT,
     .def.number = 3,
     .comment = WSYNC_OPTION_DOC("How hard the \"good\" plugin tries.", "0 to 9")},
    {.name = "mode", .type = CFGT_STR, .def.string = "fast", .comment = "Fast or \"thorough\"."},
    {.name = "flag",
     .type = CFGT_BOOL,
     .def.boolean = cfg_false,
     .comment = WSYNC_OPTION_DOC("Whether the flag is up.", "")},
    {.name = "names",
     .type = CFGT_STR,
     .flags = CFGF_LIST,
     .def.parsed = "{a, \"b c\"}",
     .comment = "Names, as many as wanted."},
    CFG_END()};

static gboolean
good_register(WsyncPlugin *plugin, GError **error)
{
  cfg_t *opts = wsync_plugin_get_options(plugin);
  GoodSettings *s = g_new0(GoodSettings, 1);

  s->level = cfg_getint(opts, "level");
  s->mode = g_strdup(cfg_getstr(opts, "mode"));
  s->flag = cfg_getbool(opts, "flag");
  s->n_names = cfg_size(opts, "names");
  return wsync_plugin_add_remapper(plugin, "good-remap", 10, "qwen3_moe, qwen3", good_remap,
                                   NULL, NULL, error) &&
         wsync_plugin_add_target(plugin, &good_target, WSYNC_PRIORITY_DEFAULT, NULL, NULL,
                                 error) &&
         wsync_plugin_add_hook(plugin, "good-hook", -5, "vllm-ascend", good_layout, NULL, NULL,
                               error) &&
         wsync_plugin_add_env_patch(plugin, "good-env", WSYNC_PRIORITY_DEFAULT, "test-backend",
                                    good_env, NULL, NULL, error) &&
         wsync_plugin_add_config_patcher(plugin, "good-patch", WSYNC_PRIORITY_DEFAULT, NULL,
                                         good_patch, s, settings_free, error);
}

WSYNC_PLUGIN_DEFINE("good", "Test plugin with one entry of every kind", options, good_register)
