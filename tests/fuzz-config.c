/* Fuzzing config.json through the planner: the bytes go through the core's config.json
 * loader (wsync_config_json_parse: depth, duplicate keys, an object at the top), the
 * config patchers (rope-compat), and a plan of the model they describe (synth mode: no
 * weights needed) for a target chosen by the input's length: hf, vllm at tp 2,
 * hf-experts, or vllm-ascend.  The model plugins must refuse what they cannot describe
 * as bad input (or a usage error, such as a tp that does not divide), on one clean
 * line, and quickly: counts are checked before anything iterates.  See fuzz-driver.h.
 *
 * The plugins come from WSYNC_TEST_BUILT_PLUGIN_DIR (set by make check, and by
 * tests/fuzz.sh to its own instrumented build). */
#include <json-glib/json-glib.h>

#include <wsync/wsync.h>

#include "../core/files.h"

#define FUZZ_NAME "config"
#include "fuzz-driver.h"

static WsyncContext *ctx;
static char *conf_dir;

static void
fuzz_setup(void)
{
  const char *plugins = g_getenv("WSYNC_TEST_BUILT_PLUGIN_DIR");
  const char *names[] = {"hf",   "qwen3_moe",  "qwen3_5_moe", "llama",
                         "vllm", "npu-ascend", "rope-compat"};
  const char *options[] = {"", "", "", "", "", "", "\n  rope-format = \"transformers5\"\n"};
  GError *error = NULL;

  if (plugins == NULL)
    g_error("WSYNC_TEST_BUILT_PLUGIN_DIR is not set: run make check or make fuzz");
  conf_dir = g_dir_make_tmp("wsync-fuzz-config-XXXXXX", &error);
  g_assert_no_error(error);
  GString *conf = g_string_new(NULL);
  for (guint i = 0; i < G_N_ELEMENTS(names); i++) {
    g_autofree char *file = g_strconcat(names[i], ".so", NULL);
    g_autofree char *so = g_build_filename(plugins, file, NULL);
    if (g_file_test(so, G_FILE_TEST_EXISTS))
      g_string_append_printf(conf, "plugin \"%s\" {%s}\n", names[i], options[i]);
  }
  g_autofree char *path = g_build_filename(conf_dir, "10.conf", NULL);
  g_file_set_contents(path, conf->str, -1, &error);
  g_assert_no_error(error);
  g_string_free(conf, TRUE);
  const char *conf_dirs[] = {conf_dir, NULL};
  const char *plugin_dirs[] = {plugins, NULL};
  ctx = wsync_context_new(conf_dirs, plugin_dirs, NULL, &error);
  g_assert_no_error(error);
}

static void
fuzz_teardown(void)
{
  g_autofree char *path = g_build_filename(conf_dir, "10.conf", NULL);
  wsync_context_free(ctx);
  g_unlink(path);
  g_rmdir(conf_dir);
  g_free(conf_dir);
}

static G_GNUC_UNUSED void
add_file(GPtrArray *seeds, const char *dir, const char *name)
{
  g_autofree char *path = g_build_filename(dir, name, NULL);
  char *text;
  gsize len;
  if (!g_file_get_contents(path, &text, &len, NULL))
    g_error("cannot read the seed %s", path);
  g_ptr_array_add(seeds, g_bytes_new_take(text, len));
}

static void
fuzz_seeds(GPtrArray *seeds)
{
  const char *src = g_getenv("G_TEST_SRCDIR"); /* the tests directory */
  if (src == NULL)
    g_error("G_TEST_SRCDIR is not set: run make check or make fuzz");
  g_autofree char *configs = g_build_filename(src, "..", "configs", NULL);
  g_autofree char *rope = g_build_filename(src, "data", "rope", NULL);
  const char *names[] = {"tiny-qwen3-moe.json", "tiny-qwen3.json", "tiny-qwen3-moe-tied.json"};
  for (guint i = 0; i < G_N_ELEMENTS(names); i++)
    add_file(seeds, configs, names[i]);
  const char *plugins = g_getenv("WSYNC_TEST_BUILT_PLUGIN_DIR");
  g_autofree char *q35 = plugins ? g_build_filename(plugins, "qwen3_5_moe.so", NULL) : NULL;
  if (q35 != NULL && g_file_test(q35, G_FILE_TEST_EXISTS)) {
    add_file(seeds, configs, "tiny-qwen3.5-moe.json");
    add_file(seeds, configs, "tiny-qwen3.5.json");
  }
  /* the tiny model with the RoPE settings of a real one (the real one plans for seconds
   * under ASan) */
  g_autofree char *yarn = g_build_filename(rope, "qwen3-30b-a3b-yarn.json", NULL);
  g_autofree char *tiny = g_build_filename(configs, "tiny-qwen3-moe.json", NULL);
  g_autoptr(JsonParser) from = json_parser_new(), to = json_parser_new();
  GError *error = NULL;
  json_parser_load_from_file(from, yarn, &error);
  g_assert_no_error(error);
  json_parser_load_from_file(to, tiny, &error);
  g_assert_no_error(error);
  JsonObject *real = json_node_get_object(json_parser_get_root(from));
  JsonObject *small = json_node_get_object(json_parser_get_root(to));
  json_object_set_member(small, "rope_scaling",
                         json_node_copy(json_object_get_member(real, "rope_scaling")));
  char *text = json_to_string(json_parser_get_root(to), TRUE);
  g_ptr_array_add(seeds, g_bytes_new_take(text, strlen(text)));
}

static const char *const *
fuzz_dictionary(void)
{
  static const char *const tokens[] = {
    "\"num_hidden_layers\"", "\"num_experts\"", "\"mlp_only_layers\"", "\"layer_types\"",
    "\"text_config\"", "\"vision_config\"", "\"mtp_num_hidden_layers\"", "\"head_dim\"",
    "\"rope_scaling\"", "\"rope_parameters\"", "\"model_type\"", "\"qwen3_moe\"",
    "\"qwen3_5_moe\"", "\"qwen3\"", "\"linear_attention\"", "\"full_attention\"",
    "\"tie_word_embeddings\"", "\"torch_dtype\"", "\"float32\"", "0", "1", "-1", "3", "65536",
    "65537", "2147483647", "2147483648", "1e300", "0.5", "null", "true", "false", "[]",
    "[0,1,2,3]", "{}", "[", "]", "{", "}", ",", ":", "\"", NULL};
  return tokens;
}

static gboolean
fuzz_one(const guint8 *data, gsize len)
{
  static const WsyncError allowed[] = {WSYNC_ERROR_BAD_INPUT, WSYNC_ERROR_USAGE};
  static const char *const targets[] = {"hf", "vllm", "hf-experts", "vllm-ascend"};
  GError *error = NULL;

  /* (an empty input arrives as NULL, an empty file as "") */
  const char *text = data ? (const char *)data : "";
  JsonNode *root = wsync_config_json_parse(text, len, "fuzz/config.json", &error);
  if (root == NULL) {
    fuzz_check_refusal(error, allowed, 1);
    g_error_free(error);
    return FALSE;
  }
  JsonNode *patched = json_node_copy(root);
  if (!wsync_context_patch_config(ctx, patched, &error)) {
    fuzz_check_refusal(error, allowed, 1);
    g_clear_error(&error);
  }
  json_node_unref(patched);

  WsyncPlanOptions o = {0};
  o.target = targets[len % G_N_ELEMENTS(targets)];
  o.tp = len % 2 ? 2 : 1;
  o.ep = 1;
  o.rank = -1;
  o.threads = 1;
  o.part_size = G_MAXUINT64;
  WsyncPlan *plan = wsync_plan_new_synth(ctx, root, "fuzz/config.json", &o, 0, FALSE, &error);
  json_node_unref(root);
  if (plan == NULL) {
    fuzz_check_refusal(error, allowed, G_N_ELEMENTS(allowed));
    g_error_free(error);
    return FALSE;
  }
  JsonNode *shown = wsync_plan_to_json(plan);
  json_node_unref(shown);
  wsync_plan_free(plan);
  return TRUE;
}

