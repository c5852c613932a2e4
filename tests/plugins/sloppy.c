/* Test plugin: makes, on cue, the mistakes a plugin author makes in callbacks, so that
 * the tests see that wsync reports each as one line naming the entry, and never crashes.
 *
 *   mistake = "duplicate-tensor"  its remapper (model_type "sloppy") declares a tensor
 *                                 twice (a per-layer tensor named without the layer)
 *   mistake = "too-many-axes"     its remapper declares a tensor of 17 axes
 *   mistake = "no-parts"          its remapper adds a param of 0 parts
 *   mistake = "silent-remapper"   its remapper returns FALSE and sets no error
 *   mistake = "silent"            every other callback (config patcher, env patch for
 *                                 backend "sloppy", hook on target hf-experts, the build
 *                                 function of target "sloppy") returns FALSE and sets no
 *                                 error
 *
 * Any other value: the remapper describes [model.x.weight] of [hidden_size], and every
 * callback succeeds.
 */
#include <string.h>

#include <wsync/wsync.h>

static gboolean
is(const char *mistake, const char *which)
{
  return strcmp(mistake, which) == 0;
}

static gboolean
sloppy_remap(WsyncModel *m, gpointer user_data, GError **error)
{
  const char *mistake = user_data;
  static const guint64 ones[WSYNC_MAX_DIMS + 1] = {1, 1, 1, 1, 1, 1, 1, 1, 1,
                                                    1, 1, 1, 1, 1, 1, 1, 1};
  WsyncConfigSection root;
  guint64 hidden;
  WsyncBlock *block;

  if (is(mistake, "silent-remapper"))
    return FALSE;
  wsync_model_config_section(m, NULL, FALSE, &root);
  if (!wsync_config_get_uint(&root, "hidden_size", 1, WSYNC_CONFIG_SIZE_MAX, &hidden, error))
    return FALSE;
  block = wsync_model_add_block(m, WSYNC_BLOCK_OTHER, "model");
  wsync_model_add_whole(m, block, "model.x.weight", WSYNC_PARAM_REPLICATED, WSYNC_ROLE_NONE, 1,
                        hidden, 0, 0);
  if (is(mistake, "duplicate-tensor"))
    wsync_model_add_whole(m, block, "model.x.weight", WSYNC_PARAM_REPLICATED, WSYNC_ROLE_NONE,
                          1, hidden, 0, 0);
  if (is(mistake, "too-many-axes")) {
    WsyncPart part = {wsync_model_add_tensor(m, "model.y", WSYNC_DTYPE_BF16,
                                             WSYNC_MAX_DIMS + 1, ones), 0, 0, 1,
                      FALSE};
    wsync_model_add_param(m, block, "model.y", WSYNC_PARAM_REPLICATED, WSYNC_ROLE_NONE, 1, &part);
  }
  if (is(mistake, "no-parts"))
    wsync_model_add_param(m, block, "model.z", WSYNC_PARAM_REPLICATED, WSYNC_ROLE_NONE, 0, NULL);
  return TRUE;
}

static gboolean
sloppy_patch(JsonNode *config, gpointer user_data, GError **error)
{
  (void)config;
  (void)error;
  return !is(user_data, "silent");
}

static gboolean
sloppy_env(WsyncEnv *env, gpointer user_data, GError **error)
{
  (void)env;
  (void)error;
  return !is(user_data, "silent");
}

static gboolean
sloppy_hook(WsyncLayout *layout, gpointer user_data, GError **error)
{
  (void)layout;
  (void)error;
  return !is(user_data, "silent");
}

static gboolean
sloppy_build(WsyncLayout *layout, gpointer user_data, GError **error)
{
  (void)layout;
  (void)error;
  return !is(user_data, "silent");
}

static char *
sloppy_file_name(WsyncLayout *layout, guint part, guint n_parts, gpointer user_data)
{
  (void)layout;
  (void)n_parts;
  (void)user_data;
  return g_strdup_printf("sloppy-%u.safetensors", part);
}

static const WsyncTargetInfo sloppy_target = {.name = "sloppy",
                                              .description = "a target that builds nothing",
                                              .build = sloppy_build,
                                              .file_name = sloppy_file_name};

static cfg_opt_t options[] = {
    {.name = "mistake",
     .type = CFGT_STR,
     .def.string = "none",
     .comment = WSYNC_OPTION_DOC("The mistake its callbacks make.",
                                 "\"duplicate-tensor\", \"too-many-axes\", \"no-parts\", "
                                 "\"silent-remapper\", \"silent\" or \"none\"")},
    CFG_END()};

static gboolean
sloppy_register(WsyncPlugin *plugin, GError **error)
{
  const char *mistake = cfg_getstr(wsync_plugin_get_options(plugin), "mistake");

  /* each entry owns its copy */
  return wsync_plugin_add_remapper(plugin, "sloppy", WSYNC_PRIORITY_DEFAULT, "sloppy",
                                   sloppy_remap, g_strdup(mistake), g_free, error) &&
         wsync_plugin_add_config_patcher(plugin, "sloppy-patch", WSYNC_PRIORITY_DEFAULT, NULL,
                                         sloppy_patch, g_strdup(mistake), g_free, error) &&
         wsync_plugin_add_env_patch(plugin, "sloppy-env", WSYNC_PRIORITY_DEFAULT, "sloppy",
                                    sloppy_env, g_strdup(mistake), g_free, error) &&
         wsync_plugin_add_hook(plugin, "sloppy-hook", WSYNC_PRIORITY_DEFAULT, "hf-experts",
                               sloppy_hook,
                               g_strdup(mistake), g_free, error) &&
         wsync_plugin_add_target(plugin, &sloppy_target, WSYNC_PRIORITY_DEFAULT,
                                 g_strdup(mistake), g_free, error);
}

WSYNC_PLUGIN_DEFINE("sloppy", "Test plugin: callbacks that make a plugin author's mistakes",
                    options, sloppy_register)
