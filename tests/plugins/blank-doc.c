/* Test plugin: an option whose description is blanks only (WSYNC_OPTION_DOC("  \t", ...)).
 * `wsync plugins` would list it without a word of what it does, as an option with no
 * comment: the loader refuses the plugin when it reads the descriptor. */
#include <wsync/wsync.h>

static gboolean
blank_doc_patch(JsonNode *config, gpointer user_data, GError **error)
{
  (void)config;
  (void)user_data;
  (void)error;
  return TRUE;
}

static cfg_opt_t options[] = {
    {.name = "said", .type = CFGT_INT, .def.number = 1, .comment = "An option it documents."},
    {.name = "blank", .type = CFGT_BOOL, .def.boolean = cfg_false,
     .comment = WSYNC_OPTION_DOC("  \t ", "true or false")},
    CFG_END()};

static gboolean
blank_doc_register(WsyncPlugin *plugin, GError **error)
{
  return wsync_plugin_add_config_patcher(plugin, "blank-doc-patch", WSYNC_PRIORITY_DEFAULT, NULL,
                                         blank_doc_patch, NULL, NULL, error);
}

WSYNC_PLUGIN_DEFINE("blank-doc", "Test plugin with an option described by blanks only", options,
                    blank_doc_register)
