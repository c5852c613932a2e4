/* The qwen3_5_moe plugin, end to end through the CLI: `wsync synth --pattern index`
 * writes tiny Qwen3.5 checkpoints whose every element encodes where it came from,
 * `wsync convert` writes the Hugging Face layouts and vLLM's rank files, and oracles
 * written here from docs/hf-checkpoints.md and docs/vllm.md (not from the plugins or the
 * engine) check the names, dtypes and shapes of every tensor and EVERY element against
 * the input element the docs say goes there:
 *
 *   - the published Hugging Face form (docs/hf-checkpoints.md §3, §4): main-layer experts
 *     fused (gate_up_proj [E, 2I, H], gate rows first; down_proj [E, H, I]), MTP experts
 *     per expert, A_log and linear_attn.norm.weight in F32, no lm_head when tied; the
 *     other expert forms (hf-experts, hf-fused);
 *   - vLLM (docs/vllm.md §9.1-§9.5, §2-§4): qkv_proj with gated q heads and KV
 *     replication, in_proj_qkvz = [q_t; k_t; v_t; z_t], in_proj_ba = [b_t; a_t],
 *     the conv1d q/k/v channel blocks, A_log widened to F32, the RMSNormGated weight
 *     rounded to BF16 (nearest even), the shared expert, routed experts under TP and EP,
 *     the vision tower, MTP skipped, language-model-only;
 *   - reading rank files back to "hf": bit-exact where no cast changed bytes; the
 *     norm's F32 -> BF16 rounding cannot come back, so there the test checks that
 *     reading back widens the rounded value exactly;
 *   - the bundled real configs (Qwen3.5-35B-A3B, Qwen3.6-27B) against the published
 *     tensor counts, through a sparse (header-only) checkpoint.
 */
#include <fcntl.h>
#include <json-glib/json-glib.h>
#include <stdio.h>
#include <unistd.h>

#include <wsync/wsync.h>

#include "oracle.h"

/* ------------------------------------------------------------------ running wsync */

typedef TestRun Run;
/* the shared helpers of testutil.h under this file's short names */
#define run_argv test_run_args
#define run_wsync test_run
#define assert_has test_assert_has
#define run_ok test_run_ok
#define edit_file_metadata test_set_rank_file_metadata

/* ------------------------------------------------------------------ fixtures */

static char *work_dir;
static GHashTable *made; /* key -> directory or file, made once */
static guint n_made;

static char *
new_path(const char *what)
{
  return g_strdup_printf("%s/%s-%u", work_dir, what, n_made++);
}

static const char *
plugin_dir(void)
{
  return test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR");
}

/* A conf.d selecting qwen3_5_moe (with @language_model_only), npu-ascend (the hook of
 * vllm-ascend's kernel format) and vllm with the settings
 * @vllm ("" for the defaults: vllm-version latest, attn-scales true, all2all-backend
 * allgather_reducescatter, prefill-context-parallel-size 1). */
static const char *
conf_dir_with(gboolean language_model_only, const char *vllm)
{
  g_autofree char *key = g_strdup_printf("conf|%d|%s", language_model_only, vllm);
  char *dir = g_hash_table_lookup(made, key);

  if (dir == NULL) {
    g_autofree char *text = g_strdup_printf("plugin \"hf\" {}\nplugin \"qwen3_5_moe\" {\n"
                                            "  language-model-only = %s\n"
                                            "}\n"
                                            "plugin \"vllm\" {\n%s}\n"
                                            "plugin \"npu-ascend\" {}\n",
                                            language_model_only ? "true" : "false", vllm);
    dir = new_path("conf");
    g_assert_cmpint(g_mkdir(dir, 0755), ==, 0);
    g_free(test_write(dir, "10-test.conf", text));
    g_hash_table_insert(made, g_strdup(key), dir);
  }
  return dir;
}

static const char *
conf_dir(gboolean language_model_only)
{
  return conf_dir_with(language_model_only, "");
}

#define CONF conf_dir(FALSE)

/* configs/NAME, or @name itself when it is a path (a variant written by the test). */
static char *
config_path(const char *name)
{
  char *path = name[0] == '/' ? g_strdup(name)
                              : g_test_build_filename(G_TEST_DIST, "..", "configs", name, NULL);

  g_assert_true(g_file_test(path, G_FILE_TEST_IS_REGULAR));
  return path;
}

static JsonNode *
load_json(const char *path)
{
  g_autoptr(JsonParser) parser = json_parser_new();
  GError *error = NULL;

  json_parser_load_from_file(parser, path, &error);
  g_assert_no_error(error);
  return json_node_copy(json_parser_get_root(parser));
}

static void
save_json(JsonNode *root, const char *path)
{
  g_autoptr(JsonGenerator) gen = json_generator_new();
  GError *error = NULL;

  json_generator_set_root(gen, root);
  json_generator_set_pretty(gen, TRUE);
  json_generator_to_file(gen, path, &error);
  g_assert_no_error(error);
}

/* A variant of a bundled config: "nomtp" (mtp_num_hidden_layers 0), "interval" (no
 * layer_types; full_attention_interval 2), "fullfirst" (layer 0 full attention),
 * "legacy" (the layer types of tiny-qwen3.5-moe as "mamba" / "attention"),
 * "vheads2" (a vision tower of 2 heads), "flat" (text fields at the root, as a
 * text-only config would hold them; no vision tower, no MTP). */
static const char *
variant(const char *base, const char *what)
{
  g_autofree char *key = g_strdup_printf("variant|%s|%s", base, what);
  char *path = g_hash_table_lookup(made, key);

  if (path == NULL) {
    g_autofree char *from = config_path(base);
    g_autoptr(JsonNode) root = load_json(from);
    JsonObject *o = json_node_get_object(root);
    JsonObject *text = json_object_get_object_member(o, "text_config");

    if (strcmp(what, "nomtp") == 0) {
      json_object_set_int_member(text, "mtp_num_hidden_layers", 0);
    } else if (strcmp(what, "fullfirst") == 0) {
      JsonArray *types = json_array_new();
      json_array_add_string_element(types, "full_attention");
      json_array_add_string_element(types, "linear_attention");
      json_array_add_string_element(types, "linear_attention");
      json_array_add_string_element(types, "full_attention");
      json_object_set_array_member(text, "layer_types", types);
    } else if (strcmp(what, "legacy") == 0) {
      JsonArray *types = json_array_new();
      json_array_add_string_element(types, "mamba");
      json_array_add_string_element(types, "mamba");
      json_array_add_string_element(types, "mamba");
      json_array_add_string_element(types, "attention");
      json_object_set_array_member(text, "layer_types", types);
    } else if (strcmp(what, "vheads2") == 0) {
      json_object_set_int_member(json_object_get_object_member(o, "vision_config"), "num_heads", 2);
    } else if (strcmp(what, "interval") == 0) {
      json_object_remove_member(text, "layer_types");
      json_object_set_int_member(text, "full_attention_interval", 2);
    } else if (strcmp(what, "flat") == 0) {
      g_autoptr(JsonNode) flat = json_node_copy(json_object_get_member(o, "text_config"));
      JsonObject *f = json_node_get_object(flat);
      json_object_set_string_member(f, "model_type",
                                    json_object_get_string_member(o, "model_type"));
      json_object_set_int_member(f, "mtp_num_hidden_layers", 0);
      path = new_path("config");
      save_json(flat, path);
      g_hash_table_insert(made, g_strdup(key), path);
      return path;
    } else
      g_assert_not_reached();
    path = new_path("config");
    save_json(root, path);
    g_hash_table_insert(made, g_strdup(key), path);
  }
  return path;
}

/* The synth checkpoint of a config (index pattern), made once. */
static const char *
synth(const char *config, gboolean fused)
{
  g_autofree char *key = g_strdup_printf("synth|%s|%d", config, fused);
  char *dir = g_hash_table_lookup(made, key);

  if (dir == NULL) {
    g_autofree char *path = config_path(config);
    g_autoptr(GPtrArray) args = g_ptr_array_new();
    dir = new_path("synth");
    g_ptr_array_add(args, "synth");
    g_ptr_array_add(args, "--conf-dir");
    g_ptr_array_add(args, (gpointer)CONF);
    g_ptr_array_add(args, "--plugin-dir");
    g_ptr_array_add(args, (gpointer)plugin_dir());
    g_ptr_array_add(args, "--config");
    g_ptr_array_add(args, path);
    g_ptr_array_add(args, dir);
    g_ptr_array_add(args, "--pattern");
    g_ptr_array_add(args, "index");
    if (fused)
      g_ptr_array_add(args, "--fused-experts");
    run_ok(args);
    g_hash_table_insert(made, g_strdup(key), dir);
  }
  return dir;
}

/* `wsync convert SRC DST --target TARGET [--tp TP] [--ep EP] [--part-size SIZE]`;
 * returns DST. */
static char *
convert_parts(const char *src, const char *conf, const char *target, guint tp, guint ep,
              const char *part_size)
{
  g_autoptr(GPtrArray) args = g_ptr_array_new_with_free_func(g_free);
  char *dst = new_path(target);

  g_ptr_array_add(args, g_strdup("convert"));
  g_ptr_array_add(args, g_strdup(src));
  g_ptr_array_add(args, g_strdup(dst));
  g_ptr_array_add(args, g_strdup("--conf-dir"));
  g_ptr_array_add(args, g_strdup(conf));
  g_ptr_array_add(args, g_strdup("--plugin-dir"));
  g_ptr_array_add(args, g_strdup(plugin_dir()));
  g_ptr_array_add(args, g_strdup("--target"));
  g_ptr_array_add(args, g_strdup(target));
  if (tp > 0) {
    g_ptr_array_add(args, g_strdup("--tp"));
    g_ptr_array_add(args, g_strdup_printf("%u", tp));
  }
  if (ep > 0) {
    g_ptr_array_add(args, g_strdup("--ep"));
    g_ptr_array_add(args, g_strdup_printf("%u", ep));
  }
  /* more EP ranks than TP ranks: only the kernel format holds them */
  if (ep > tp) {
    g_ptr_array_add(args, g_strdup("--format"));
    g_ptr_array_add(args, g_strdup("kernel"));
  }
  if (part_size != NULL) {
    g_ptr_array_add(args, g_strdup("--part-size"));
    g_ptr_array_add(args, g_strdup(part_size));
  }
  run_ok(args);
  return dst;
}

static char *
convert(const char *src, const char *conf, const char *target, guint tp, guint ep)
{
  return convert_parts(src, conf, target, tp, ep, NULL);
}

/* ------------------------------------------------------------------ the model, from config.json */

typedef struct {
  gboolean moe, tied, gate, vision;
  guint64 H, nh, nkv, hd, V, L, nk, nv, dk, dv, K, E, I, Is, Id, mtp;
  gboolean linear[128];
  WsyncDtype alog_norm; /* of A_log and linear_attn.norm: F32, or BF16 as in Qwen3.6-27B */
  /* vision */
  guint64 depth, D, heads, Iv, patch, temporal, merge, in_ch, pos, out;
} Model;

static guint64
member_uint(JsonObject *o, const char *name)
{
  if (!json_object_has_member(o, name))
    g_error("config lacks %s", name);
  return (guint64)json_object_get_int_member(o, name);
}

static Model
read_model(const char *config)
{
  g_autofree char *path = config_path(config);
  g_autoptr(JsonNode) root = load_json(path);
  JsonObject *o = json_node_get_object(root);
  JsonObject *t = json_object_has_member(o, "text_config")
                      ? json_object_get_object_member(o, "text_config")
                      : o;
  Model m = {0};

  m.moe = strcmp(json_object_get_string_member(o, "model_type"), "qwen3_5_moe") == 0;
  /* what synth publishes: no config field tells a BF16 checkpoint (Qwen3.6-27B) from an
   * F32 one (docs/hf-checkpoints.md §3) */
  m.alog_norm = WSYNC_DTYPE_F32;
  m.tied = json_object_get_boolean_member_with_default(t, "tie_word_embeddings", FALSE);
  m.gate = json_object_get_boolean_member_with_default(t, "attn_output_gate", TRUE);
  m.H = member_uint(t, "hidden_size");
  m.nh = member_uint(t, "num_attention_heads");
  m.nkv = member_uint(t, "num_key_value_heads");
  m.hd = member_uint(t, "head_dim");
  m.V = member_uint(t, "vocab_size");
  m.L = member_uint(t, "num_hidden_layers");
  m.nk = member_uint(t, "linear_num_key_heads");
  m.nv = member_uint(t, "linear_num_value_heads");
  m.dk = member_uint(t, "linear_key_head_dim");
  m.dv = member_uint(t, "linear_value_head_dim");
  m.K = member_uint(t, "linear_conv_kernel_dim");
  m.mtp = json_object_has_member(t, "mtp_num_hidden_layers")
              ? member_uint(t, "mtp_num_hidden_layers")
              : 1;
  if (m.moe) {
    m.E = member_uint(t, "num_experts");
    m.I = member_uint(t, "moe_intermediate_size");
    m.Is = member_uint(t, "shared_expert_intermediate_size");
  } else
    m.Id = member_uint(t, "intermediate_size");
  g_assert_cmpuint(m.L, <=, G_N_ELEMENTS(m.linear));
  /* docs/hf-checkpoints.md §3: layer_types, else linear unless (i+1) % interval == 0
   * (default 4). */
  if (json_object_has_member(t, "layer_types")) {
    JsonArray *a = json_object_get_array_member(t, "layer_types");
    g_assert_cmpuint(json_array_get_length(a), ==, m.L);
    for (guint i = 0; i < m.L; i++)
      m.linear[i] = strcmp(json_array_get_string_element(a, i), "linear_attention") == 0;
  } else {
    guint64 interval = json_object_get_int_member_with_default(t, "full_attention_interval", 4);
    for (guint64 i = 0; i < m.L; i++)
      m.linear[i] = (i + 1) % interval != 0;
  }
  m.vision = json_object_has_member(o, "vision_config");
  if (m.vision) {
    JsonObject *v = json_object_get_object_member(o, "vision_config");
    m.depth = member_uint(v, "depth");
    m.D = member_uint(v, "hidden_size");
    m.heads = member_uint(v, "num_heads");
    m.Iv = member_uint(v, "intermediate_size");
    m.patch = member_uint(v, "patch_size");
    m.temporal = member_uint(v, "temporal_patch_size");
    m.merge = member_uint(v, "spatial_merge_size");
    m.in_ch = json_object_get_int_member_with_default(v, "in_channels", 3);
    m.pos = member_uint(v, "num_position_embeddings");
    m.out = member_uint(v, "out_hidden_size");
  }
  return m;
}

/* ------------------------------------------------------------------ the published tensor list */

/* One tensor of a Hugging Face layout, as docs/hf-checkpoints.md §3 lists them. */
typedef struct {
  char *name;
  WsyncDtype dtype;
  guint ndim;
  guint64 shape[5];
} Spec;

static void
spec_free(gpointer data)
{
  Spec *s = data;
  g_free(s->name);
  g_free(s);
}

static void
spec(GPtrArray *a, WsyncDtype dtype, guint ndim, guint64 d0, guint64 d1, guint64 d2,
     const char *prefix, const char *suffix)
{
  Spec *s = g_new0(Spec, 1);

  s->name = g_strconcat(prefix, suffix, NULL);
  s->dtype = dtype;
  s->ndim = ndim;
  s->shape[0] = d0;
  s->shape[1] = d1;
  s->shape[2] = d2;
  g_ptr_array_add(a, s);
}

#define BF WSYNC_DTYPE_BF16
#define F32 WSYNC_DTYPE_F32

static void
spec_layer(GPtrArray *a, const Model *m, const char *p, gboolean linear, gboolean fused)
{
  guint64 g = m->gate ? 2 : 1, kd = m->nk * m->dk, vd = m->nv * m->dv;

  spec(a, BF, 1, m->H, 0, 0, p, "input_layernorm.weight");
  spec(a, BF, 1, m->H, 0, 0, p, "post_attention_layernorm.weight");
  if (linear) {
    spec(a, BF, 2, 2 * kd + vd, m->H, 0, p, "linear_attn.in_proj_qkv.weight");
    spec(a, BF, 2, vd, m->H, 0, p, "linear_attn.in_proj_z.weight");
    spec(a, BF, 2, m->nv, m->H, 0, p, "linear_attn.in_proj_b.weight");
    spec(a, BF, 2, m->nv, m->H, 0, p, "linear_attn.in_proj_a.weight");
    spec(a, BF, 3, 2 * kd + vd, 1, m->K, p, "linear_attn.conv1d.weight");
    spec(a, m->alog_norm, 1, m->nv, 0, 0, p, "linear_attn.A_log");
    spec(a, BF, 1, m->nv, 0, 0, p, "linear_attn.dt_bias");
    spec(a, m->alog_norm, 1, m->dv, 0, 0, p, "linear_attn.norm.weight");
    spec(a, BF, 2, m->H, vd, 0, p, "linear_attn.out_proj.weight");
  } else {
    spec(a, BF, 2, g * m->nh * m->hd, m->H, 0, p, "self_attn.q_proj.weight");
    spec(a, BF, 2, m->nkv * m->hd, m->H, 0, p, "self_attn.k_proj.weight");
    spec(a, BF, 2, m->nkv * m->hd, m->H, 0, p, "self_attn.v_proj.weight");
    spec(a, BF, 2, m->H, m->nh * m->hd, 0, p, "self_attn.o_proj.weight");
    spec(a, BF, 1, m->hd, 0, 0, p, "self_attn.q_norm.weight");
    spec(a, BF, 1, m->hd, 0, 0, p, "self_attn.k_norm.weight");
  }
  if (!m->moe) {
    spec(a, BF, 2, m->Id, m->H, 0, p, "mlp.gate_proj.weight");
    spec(a, BF, 2, m->Id, m->H, 0, p, "mlp.up_proj.weight");
    spec(a, BF, 2, m->H, m->Id, 0, p, "mlp.down_proj.weight");
    return;
  }
  spec(a, BF, 2, m->E, m->H, 0, p, "mlp.gate.weight");
  spec(a, BF, 2, m->Is, m->H, 0, p, "mlp.shared_expert.gate_proj.weight");
  spec(a, BF, 2, m->Is, m->H, 0, p, "mlp.shared_expert.up_proj.weight");
  spec(a, BF, 2, m->H, m->Is, 0, p, "mlp.shared_expert.down_proj.weight");
  spec(a, BF, 2, 1, m->H, 0, p, "mlp.shared_expert_gate.weight");
  if (fused) {
    spec(a, BF, 3, m->E, 2 * m->I, m->H, p, "mlp.experts.gate_up_proj");
    spec(a, BF, 3, m->E, m->H, m->I, p, "mlp.experts.down_proj");
    return;
  }
  for (guint64 e = 0; e < m->E; e++) {
    g_autofree char *ep = g_strdup_printf("%smlp.experts.%" G_GUINT64_FORMAT ".", p, e);
    spec(a, BF, 2, m->I, m->H, 0, ep, "gate_proj.weight");
    spec(a, BF, 2, m->I, m->H, 0, ep, "up_proj.weight");
    spec(a, BF, 2, m->H, m->I, 0, ep, "down_proj.weight");
  }
}

/* Every tensor of a Hugging Face layout of @m: main-layer experts fused or not, MTP
 * experts fused or not (published: TRUE, FALSE). */
static GPtrArray *
published(const Model *m, gboolean main_fused, gboolean mtp_fused)
{
  GPtrArray *a = g_ptr_array_new_with_free_func(spec_free);
  guint64 M = m->D * m->merge * m->merge;

  spec(a, BF, 2, m->V, m->H, 0, "model.language_model.", "embed_tokens.weight");
  spec(a, BF, 1, m->H, 0, 0, "model.language_model.", "norm.weight");
  if (!m->tied)
    spec(a, BF, 2, m->V, m->H, 0, "", "lm_head.weight");
  for (guint64 l = 0; l < m->L; l++) {
    g_autofree char *p = g_strdup_printf("model.language_model.layers.%" G_GUINT64_FORMAT ".", l);
    spec_layer(a, m, p, m->linear[l], main_fused);
  }
  if (m->vision) {
    Spec *s;
    spec(a, BF, 5, m->D, m->in_ch, m->temporal, "model.visual.", "patch_embed.proj.weight");
    s = a->pdata[a->len - 1];
    s->shape[3] = s->shape[4] = m->patch;
    spec(a, BF, 1, m->D, 0, 0, "model.visual.", "patch_embed.proj.bias");
    spec(a, BF, 2, m->pos, m->D, 0, "model.visual.", "pos_embed.weight");
    for (guint64 b = 0; b < m->depth; b++) {
      g_autofree char *p = g_strdup_printf("model.visual.blocks.%" G_GUINT64_FORMAT ".", b);
      spec(a, BF, 1, m->D, 0, 0, p, "norm1.weight");
      spec(a, BF, 1, m->D, 0, 0, p, "norm1.bias");
      spec(a, BF, 1, m->D, 0, 0, p, "norm2.weight");
      spec(a, BF, 1, m->D, 0, 0, p, "norm2.bias");
      spec(a, BF, 2, 3 * m->D, m->D, 0, p, "attn.qkv.weight");
      spec(a, BF, 1, 3 * m->D, 0, 0, p, "attn.qkv.bias");
      spec(a, BF, 2, m->D, m->D, 0, p, "attn.proj.weight");
      spec(a, BF, 1, m->D, 0, 0, p, "attn.proj.bias");
      spec(a, BF, 2, m->Iv, m->D, 0, p, "mlp.linear_fc1.weight");
      spec(a, BF, 1, m->Iv, 0, 0, p, "mlp.linear_fc1.bias");
      spec(a, BF, 2, m->D, m->Iv, 0, p, "mlp.linear_fc2.weight");
      spec(a, BF, 1, m->D, 0, 0, p, "mlp.linear_fc2.bias");
    }
    spec(a, BF, 1, m->D, 0, 0, "model.visual.", "merger.norm.weight");
    spec(a, BF, 1, m->D, 0, 0, "model.visual.", "merger.norm.bias");
    spec(a, BF, 2, M, M, 0, "model.visual.", "merger.linear_fc1.weight");
    spec(a, BF, 1, M, 0, 0, "model.visual.", "merger.linear_fc1.bias");
    spec(a, BF, 2, m->out, M, 0, "model.visual.", "merger.linear_fc2.weight");
    spec(a, BF, 1, m->out, 0, 0, "model.visual.", "merger.linear_fc2.bias");
  }
  if (m->mtp > 0) {
    spec(a, BF, 2, m->H, 2 * m->H, 0, "mtp.", "fc.weight");
    spec(a, BF, 1, m->H, 0, 0, "mtp.", "pre_fc_norm_embedding.weight");
    spec(a, BF, 1, m->H, 0, 0, "mtp.", "pre_fc_norm_hidden.weight");
    spec(a, BF, 1, m->H, 0, 0, "mtp.", "norm.weight");
    for (guint64 l = 0; l < m->mtp; l++) {
      g_autofree char *p = g_strdup_printf("mtp.layers.%" G_GUINT64_FORMAT ".", l);
      spec_layer(a, m, p, FALSE, mtp_fused);
    }
  }
  return a;
}

/* The checkpoint holds exactly the tensors of @specs: names, dtypes, shapes. */
static void
assert_tensors(WsyncCheckpoint *ck, GPtrArray *specs)
{
  for (guint i = 0; i < specs->len; i++) {
    const Spec *s = specs->pdata[i];
    const WsyncTensor *t = wsync_checkpoint_lookup(ck, s->name);
    if (t == NULL)
      g_error("%s lacks %s", wsync_checkpoint_path(ck), s->name);
    if (t->dtype != s->dtype)
      g_error("%s is %s, want %s", s->name, wsync_dtype_name(t->dtype), wsync_dtype_name(s->dtype));
    g_assert_cmpuint(t->ndim, ==, s->ndim);
    for (guint d = 0; d < s->ndim; d++)
      if (t->shape[d] != s->shape[d])
        g_error("%s axis %u is %" G_GUINT64_FORMAT ", want %" G_GUINT64_FORMAT, s->name, d,
                t->shape[d], s->shape[d]);
  }
  g_assert_cmpuint(wsync_checkpoint_n_tensors(ck), ==, specs->len);
}

/* ------------------------------------------------------------------ the vLLM oracle
 *
 * tests/oracle.h's RankCheck, its model the Model above; this file adds what only
 * Qwen3.5 has: gated query heads, linear attention, routed experts, the vision tower. */

typedef RankCheck Oracle;

static const Model *
model_of(const Oracle *o)
{
  return o->model;
}

/* "PREFIX" + @suffix for layer @l of the checkpoint ("model.language_model.layers.L.")
 * and of the runtime ("language_model.model.layers.L."). */
static char *
ck_name(guint64 l, const char *suffix)
{
  return g_strdup_printf("model.language_model.layers.%" G_GUINT64_FORMAT ".%s", l, suffix);
}

static char *
rt_name(guint64 l, const char *suffix)
{
  return g_strdup_printf("language_model.model.layers.%" G_GUINT64_FORMAT ".%s", l, suffix);
}

/* A run of rows of an input tensor. */
typedef struct {
  const WsyncTensor *in;
  guint64 first, rows;
} Seg;

/* A column-parallel output: the segments' rows one after the other, every trailing
 * axis whole (1-D tensors: rows of one element). */
static void
check_segments(Oracle *o, const char *out_name, WsyncDtype dtype, const Seg *segs, guint n)
{
  const WsyncTensor *in0 = segs[0].in;
  guint64 shape[WSYNC_MAX_DIMS], row = 1, r = 0;
  const WsyncTensor *out;

  memcpy(shape, in0->shape, sizeof(guint64) * in0->ndim);
  shape[0] = 0;
  for (guint s = 0; s < n; s++)
    shape[0] += segs[s].rows;
  for (guint d = 1; d < in0->ndim; d++)
    row *= in0->shape[d];
  out = output(o, out_name, dtype, in0->ndim, shape);
  for (guint s = 0; s < n; s++)
    for (guint64 i = 0; i < segs[s].rows; i++, r++)
      for (guint64 e = 0; e < row; e++)
        same_elem(o, out, r * row + e, segs[s].in, (segs[s].first + i) * row + e);
}

/* Full attention (docs/vllm.md §9.2): qkv_proj [(2nh/tp + 2kvl)*hd, H].  q_proj is per
 * head [q_h; gate_h] (docs/hf-checkpoints.md §3): local head j of rank t is global head
 * t*nh/tp + j, its query rows then its gate rows; k/v follow the KV rules
 * (docs/vllm.md §2). */
static void
check_gated_qkv(Oracle *o, guint64 l)
{
  const Model *m = model_of(o);
  g_autofree char *qn = ck_name(l, "self_attn.q_proj.weight");
  g_autofree char *kn = ck_name(l, "self_attn.k_proj.weight");
  g_autofree char *vn = ck_name(l, "self_attn.v_proj.weight");
  g_autofree char *name = rt_name(l, "self_attn.qkv_proj.weight");
  const WsyncTensor *q = input(o, qn), *k = input(o, kn), *v = input(o, vn);
  guint64 g = m->gate ? 2 : 1, heads = m->nh / o->tp, qrows = heads * g * m->hd;
  guint64 kvl = o->tp >= m->nkv ? 1 : m->nkv / o->tp;
  guint64 replicas = o->tp >= m->nkv ? o->tp / m->nkv : 1;
  guint64 shard = o->t / replicas, kvrows = kvl * m->hd;
  guint64 shape[2] = {qrows + 2 * kvrows, m->H};
  const WsyncTensor *out = output(o, name, q->dtype, 2, shape);

  g_assert_cmpuint(m->nh % o->tp, ==, 0);
  for (guint64 r = 0; r < shape[0]; r++) {
    const WsyncTensor *src;
    guint64 row;
    if (r < qrows) {
      guint64 j = r / (g * m->hd), w = r % (g * m->hd), head = o->t * heads + j;
      gboolean is_gate = w >= m->hd;
      src = q;
      row = head * g * m->hd + (is_gate ? m->hd : 0) + w % m->hd;
    } else if (r < qrows + kvrows) {
      src = k;
      row = shard * kvrows + (r - qrows);
    } else {
      src = v;
      row = shard * kvrows + (r - qrows - kvrows);
    }
    for (guint64 h = 0; h < m->H; h++)
      same_elem(o, out, r * m->H + h, src, row * m->H + h);
  }
}

/* The F32 scale buffers of an attention layer (docs/vllm.md §6); a buffer is never in
 * the kernel format (§7). */
static void
check_scales(Oracle *o, guint64 l)
{
  static const char *const scales[] = {"_k_scale", "_v_scale", "_q_scale", "_prob_scale"};
  static const guint8 one[4] = {0x00, 0x00, 0x80, 0x3f};

  for (guint i = 0; i < G_N_ELEMENTS(scales); i++) {
    g_autofree char *suffix = g_strconcat("self_attn.attn.", scales[i], NULL);
    g_autofree char *name = rt_name(l, suffix);
    if (o->kernel) {
      g_assert_null(rank_lookup(o->rf, name));
      continue;
    }
    const WsyncTensor *out = output(o, name, WSYNC_DTYPE_F32, 0, NULL);
    g_assert_cmpint(memcmp(out->data, one, 4), ==, 0);
  }
}

static void
check_full_attention(Oracle *o, guint64 l)
{
  static const char *const norms[] = {"self_attn.q_norm.weight", "self_attn.k_norm.weight"};
  g_autofree char *oo = rt_name(l, "self_attn.o_proj.weight");
  g_autofree char *oi = ck_name(l, "self_attn.o_proj.weight");

  check_gated_qkv(o, l);
  check_row_as(o, oi, oo);
  for (guint i = 0; i < G_N_ELEMENTS(norms); i++) {
    g_autofree char *on = rt_name(l, norms[i]);
    g_autofree char *in = ck_name(l, norms[i]);
    /* copied verbatim: the 1 + w is the engine's business (docs/vllm.md §9.1) */
    check_replicated_cast(o, in, on, WSYNC_DTYPE_BF16);
  }
  check_scales(o, l);
}

/* Gated DeltaNet (docs/vllm.md §9.3), kd = nk*dk, vd = nv*dv, rank t:
 *   in_proj_qkvz = [qkv[t*kd/tp ...] ; qkv[kd + t*kd/tp ...] ; qkv[2kd + t*vd/tp ...] ;
 *                   z[t*vd/tp ...]]
 *   in_proj_ba   = [b[t*nv/tp ...] ; a[t*nv/tp ...]]
 *   conv1d       = the q, k, v channel blocks, each sliced the same way
 *   A_log, dt_bias = [t*nv/tp ...], A_log in F32; norm whole, in BF16; out_proj row. */
static void
check_linear_attention(Oracle *o, guint64 l)
{
  const Model *m = model_of(o);
  guint64 kd = m->nk * m->dk, vd = m->nv * m->dv, kt = kd / o->tp, vt = vd / o->tp;
  guint64 nvt = m->nv / o->tp, t = o->t;
  g_autofree char *qkv_n = ck_name(l, "linear_attn.in_proj_qkv.weight");
  g_autofree char *z_n = ck_name(l, "linear_attn.in_proj_z.weight");
  g_autofree char *b_n = ck_name(l, "linear_attn.in_proj_b.weight");
  g_autofree char *a_n = ck_name(l, "linear_attn.in_proj_a.weight");
  g_autofree char *conv_n = ck_name(l, "linear_attn.conv1d.weight");
  g_autofree char *alog_n = ck_name(l, "linear_attn.A_log");
  g_autofree char *dt_n = ck_name(l, "linear_attn.dt_bias");
  g_autofree char *norm_n = ck_name(l, "linear_attn.norm.weight");
  g_autofree char *out_n = ck_name(l, "linear_attn.out_proj.weight");
  g_autofree char *qkvz_o = rt_name(l, "linear_attn.in_proj_qkvz.weight");
  g_autofree char *ba_o = rt_name(l, "linear_attn.in_proj_ba.weight");
  g_autofree char *conv_o = rt_name(l, "linear_attn.conv1d.weight");
  g_autofree char *alog_o = rt_name(l, "linear_attn.A_log");
  g_autofree char *dt_o = rt_name(l, "linear_attn.dt_bias");
  g_autofree char *norm_o = rt_name(l, "linear_attn.norm.weight");
  g_autofree char *out_o = rt_name(l, "linear_attn.out_proj.weight");
  const WsyncTensor *qkv = input(o, qkv_n), *z = input(o, z_n), *conv = input(o, conv_n);

  g_assert_cmpuint(m->nk % o->tp, ==, 0);
  g_assert_cmpuint(m->nv % o->tp, ==, 0);
  check_segments(o, qkvz_o, WSYNC_DTYPE_BF16,
                 (Seg[]){{qkv, t * kt, kt}, {qkv, kd + t * kt, kt}, {qkv, 2 * kd + t * vt, vt},
                         {z, t * vt, vt}},
                 4);
  check_segments(o, ba_o, WSYNC_DTYPE_BF16,
                 (Seg[]){{input(o, b_n), t * nvt, nvt}, {input(o, a_n), t * nvt, nvt}}, 2);
  check_segments(o, conv_o, WSYNC_DTYPE_BF16,
                 (Seg[]){{conv, t * kt, kt}, {conv, kd + t * kt, kt}, {conv, 2 * kd + t * vt, vt}},
                 3);
  check_segments(o, alog_o, WSYNC_DTYPE_F32, (Seg[]){{input(o, alog_n), t * nvt, nvt}}, 1);
  check_segments(o, dt_o, WSYNC_DTYPE_BF16, (Seg[]){{input(o, dt_n), t * nvt, nvt}}, 1);
  check_replicated_cast(o, norm_n, norm_o, WSYNC_DTYPE_BF16);
  check_row_as(o, out_n, out_o);
}

/* Where expert @e's gate (0), up (1) or down (2) matrix lies in the input: the fused
 * form (gate_up [E, 2I, H] gate rows first, down [E, H, I]) or per-expert tensors. */
typedef struct {
  const WsyncTensor *t;
  guint64 base, row_stride;
} ExpertSrc;

static ExpertSrc
expert_src(Oracle *o, guint64 l, guint which, guint64 e)
{
  static const char *const projs[3] = {"gate_proj", "up_proj", "down_proj"};
  const Model *m = model_of(o);
  g_autofree char *fused =
      ck_name(l, which < 2 ? "mlp.experts.gate_up_proj" : "mlp.experts.down_proj");
  g_autofree char *suffix =
      g_strdup_printf("mlp.experts.%" G_GUINT64_FORMAT ".%s.weight", e, projs[which]);
  g_autofree char *single = ck_name(l, suffix);
  ExpertSrc s;

  s.t = wsync_checkpoint_lookup(o->in, fused);
  if (s.t != NULL) {
    if (which < 2) {
      s.base = (e * 2 * m->I + which * m->I) * m->H;
      s.row_stride = m->H;
    } else {
      s.base = e * m->H * m->I;
      s.row_stride = m->I;
    }
    return s;
  }
  s.t = input(o, single);
  s.base = 0;
  s.row_stride = which < 2 ? m->H : m->I;
  return s;
}

/* determine_expert_map, linear (docs/vllm.md §4): contiguous blocks, remainder to the
 * lowest ranks, whole experts; without EP every expert TP-sliced (§4). */
static void
expert_share(Oracle *o, guint64 *first, guint64 *count, guint64 *ip, guint64 *off)
{
  const Model *m = model_of(o);

  if (o->ep > 1) {
    guint64 base = m->E / o->ep, rem = m->E % o->ep;
    *count = base + (o->rank < rem);
    *first = o->rank * base + MIN(o->rank, rem);
    *ip = m->I;
    *off = 0;
  } else {
    *first = 0;
    *count = m->E;
    *ip = m->I / o->tp;
    *off = o->t * *ip;
  }
}

/* Whether the rank being checked is a vllm-ascend rank: its router's name, and in the
 * kernel format its experts in vLLM-Ascend's processed layout.  Set by check_rank() from
 * its case (the Oracle is oracle.h's RankCheck, which has no room for it). */
static gboolean ascend_rank;

/* vLLM-Ascend's processed layout (docs/vllm-ascend.md §3): w13_weight [E_loc, H, 2Ip],
 * columns [gate | up], and w2_weight [E_loc, Ip, H], the loader layout transposed. */
static void
check_experts_processed(Oracle *o, const char *w13, const char *w2, guint64 first,
                        guint64 count, guint64 ip, guint64 off, guint64 l)
{
  const Model *m = model_of(o);
  const WsyncTensor *out = output(o, w13, WSYNC_DTYPE_BF16, 3, (guint64[]){count, m->H, 2 * ip});

  for (guint64 j = 0; j < count; j++)
    for (guint half = 0; half < 2; half++) {
      ExpertSrc s = expert_src(o, l, half, first + j);
      for (guint64 r = 0; r < ip; r++)
        for (guint64 h = 0; h < m->H; h++)
          same_elem(o, out, (j * m->H + h) * 2 * ip + half * ip + r, s.t,
                    s.base + (off + r) * s.row_stride + h);
    }
  out = output(o, w2, WSYNC_DTYPE_BF16, 3, (guint64[]){count, ip, m->H});
  for (guint64 j = 0; j < count; j++) {
    ExpertSrc s = expert_src(o, l, 2, first + j);
    for (guint64 h = 0; h < m->H; h++)
      for (guint64 c = 0; c < ip; c++)
        same_elem(o, out, (j * ip + c) * m->H + h, s.t, s.base + h * s.row_stride + off + c);
  }
}

/* w13_weight [E_loc, 2Ip, H] (gate rows then up rows) and w2_weight [E_loc, H, Ip]
 * under language_model.model.layers.L.mlp.experts.routed_experts (vLLM >= 0.24.0, naming
 * era D, the default; docs/vllm.md §5). */
static void
check_experts(Oracle *o, guint64 l, guint64 expect_count)
{
  const Model *m = model_of(o);
  g_autofree char *w13 = rt_name(l, "mlp.experts.routed_experts.w13_weight");
  g_autofree char *w2 = rt_name(l, "mlp.experts.routed_experts.w2_weight");
  guint64 first, count, ip, off;
  const WsyncTensor *out;

  expert_share(o, &first, &count, &ip, &off);
  g_assert_cmpuint(count, ==, expect_count);
  if (ascend_rank && o->kernel) {
    check_experts_processed(o, w13, w2, first, count, ip, off, l);
    return;
  }
  out = output(o, w13, WSYNC_DTYPE_BF16, 3, (guint64[]){count, 2 * ip, m->H});
  for (guint64 j = 0; j < count; j++)
    for (guint half = 0; half < 2; half++) {
      ExpertSrc s = expert_src(o, l, half, first + j);
      for (guint64 r = 0; r < ip; r++)
        for (guint64 h = 0; h < m->H; h++)
          same_elem(o, out, (j * 2 * ip + half * ip + r) * m->H + h, s.t,
                    s.base + (off + r) * s.row_stride + h);
    }
  out = output(o, w2, WSYNC_DTYPE_BF16, 3, (guint64[]){count, m->H, ip});
  for (guint64 j = 0; j < count; j++) {
    ExpertSrc s = expert_src(o, l, 2, first + j);
    for (guint64 h = 0; h < m->H; h++)
      for (guint64 c = 0; c < ip; c++)
        same_elem(o, out, (j * m->H + h) * ip + c, s.t, s.base + h * s.row_stride + off + c);
  }
}

/* MergedColumnParallelLinear [gate_t ; up_t] (gate first) and its RowParallel down. */
static void
check_gate_up_down(Oracle *o, guint64 l, const char *mlp, const char *rt_mlp, guint64 inter)
{
  guint64 it = inter / o->tp;
  g_autofree char *gs = g_strconcat(mlp, ".gate_proj.weight", NULL);
  g_autofree char *us = g_strconcat(mlp, ".up_proj.weight", NULL);
  g_autofree char *ds = g_strconcat(mlp, ".down_proj.weight", NULL);
  g_autofree char *gus = g_strconcat(rt_mlp, ".gate_up_proj.weight", NULL);
  g_autofree char *rds = g_strconcat(rt_mlp, ".down_proj.weight", NULL);
  g_autofree char *gn = ck_name(l, gs);
  g_autofree char *un = ck_name(l, us);
  g_autofree char *dn = ck_name(l, ds);
  g_autofree char *gu_o = rt_name(l, gus);
  g_autofree char *d_o = rt_name(l, rds);

  g_assert_cmpuint(inter % o->tp, ==, 0);
  check_segments(o, gu_o, WSYNC_DTYPE_BF16,
                 (Seg[]){{input(o, gn), o->t * it, it}, {input(o, un), o->t * it, it}}, 2);
  check_row_as(o, dn, d_o);
}

/* Whether the rank being checked holds the shared expert whole: set by check_rank() from
 * its case (the Oracle is oracle.h's RankCheck, which has no room for it). */
static gboolean shared_expert_whole;

/* vLLM-Ascend's rule (docs/vllm-ascend.md §2): get_parallel_op replicates a
 * shared-expert linear only when shared_expert_dp_enabled(), additional_config
 * enable_shared_expert_dp with expert parallelism and tp > 1; vLLM's
 * use_sequence_parallel_moe does not decide it. */
static gboolean
ascend_shared_expert_dp(guint tp, guint ep, gboolean enable_shared_expert_dp)
{
  return enable_shared_expert_dp && ep > 1 && tp > 1;
}

/* vLLM's ParallelConfig.use_sequence_parallel_moe at v0.27.1 (docs/vllm.md §9.4): the
 * backend, after __post_init__ renames "naive" and "pplx" to allgather_reducescatter, in
 * the list, expert parallelism, tp > 1 and dp > 1, where with EP ep = dp * pcp * tp. */
static gboolean
sequence_parallel_moe(guint tp, guint ep, guint pcp, const char *backend)
{
  static const char *const listed[] = {"allgather_reducescatter", "naive", "pplx",
                                       "deepep_high_throughput", "deepep_low_latency",
                                       "mori_high_throughput", "mori_low_latency", "nixl_ep",
                                       NULL};

  if (ep <= 1 || tp <= 1)
    return FALSE;
  g_assert_cmpuint(ep % (pcp * tp), ==, 0);
  return ep / (pcp * tp) > 1 && g_strv_contains(listed, backend);
}

/* The sparse block (docs/vllm.md §9), under the alias winners of naming era D (§5):
 * the MoERunner mlp.experts holds the router as `gate` and the shared expert MLP (with
 * its gate) as `_shared_experts._layer`. */
static void
check_moe(Oracle *o, guint64 l, const guint64 *expert_counts)
{
  /* vLLM-Ascend's MoE runner also holds the router as _gate, the smaller name
   * (docs/vllm-ascend.md §2) */
  g_autofree char *router_o =
      rt_name(l, ascend_rank ? "mlp.experts._gate.weight" : "mlp.experts.gate.weight");
  g_autofree char *router_i = ck_name(l, "mlp.gate.weight");
  g_autofree char *sg_o = rt_name(l, "mlp.experts._shared_experts._layer.expert_gate.weight");
  g_autofree char *sg_i = ck_name(l, "mlp.shared_expert_gate.weight");

  check_replicated_cast(o, router_i, router_o, WSYNC_DTYPE_BF16);
  check_replicated_cast(o, sg_i, sg_o, WSYNC_DTYPE_BF16);
  /* the shared expert stays TP-sliced by rank % tp, also with EP (§4); with
   * sequence-parallel MoE it is built with disable_tp and every rank holds it whole
   * (§9.4) */
  if (shared_expert_whole) {
    Oracle whole = *o;
    whole.tp = 1;
    whole.t = 0;
    check_gate_up_down(&whole, l, "mlp.shared_expert", "mlp.experts._shared_experts._layer",
                       model_of(o)->Is);
    o->checked = whole.checked;
  } else
    check_gate_up_down(o, l, "mlp.shared_expert", "mlp.experts._shared_experts._layer",
                       model_of(o)->Is);
  check_experts(o, l, expert_counts != NULL ? expert_counts[o->rank] : model_of(o)->E);
}

static void
check_layer(Oracle *o, guint64 l, const guint64 *expert_counts)
{
  static const char *const norms[] = {"input_layernorm.weight", "post_attention_layernorm.weight"};

  for (guint i = 0; i < G_N_ELEMENTS(norms); i++) {
    g_autofree char *on = rt_name(l, norms[i]);
    g_autofree char *in = ck_name(l, norms[i]);
    check_replicated_cast(o, in, on, WSYNC_DTYPE_BF16);
  }
  if (model_of(o)->linear[l])
    check_linear_attention(o, l);
  else
    check_full_attention(o, l);
  if (model_of(o)->moe)
    check_moe(o, l, expert_counts);
  else
    check_gate_up_down(o, l, "mlp", "mlp", model_of(o)->Id);
}

/* "model.visual." + @suffix and "visual." + @suffix */
static void
check_visual_replicated(Oracle *o, const char *suffix)
{
  g_autofree char *on = g_strconcat("visual.", suffix, NULL);
  g_autofree char *in = g_strconcat("model.visual.", suffix, NULL);

  check_replicated_cast(o, in, on, WSYNC_DTYPE_BF16);
}

static void
check_visual_row(Oracle *o, const char *suffix)
{
  g_autofree char *on = g_strconcat("visual.", suffix, NULL);
  g_autofree char *in = g_strconcat("model.visual.", suffix, NULL);

  check_row_as(o, in, on);
}

/* ColumnParallelLinear weight or bias: rows [t*R/tp, (t+1)*R/tp). */
static void
check_visual_column(Oracle *o, const char *suffix)
{
  g_autofree char *on = g_strconcat("visual.", suffix, NULL);
  g_autofree char *in = g_strconcat("model.visual.", suffix, NULL);
  const WsyncTensor *t = input(o, in);
  guint64 r = t->shape[0] / o->tp;

  g_assert_cmpuint(t->shape[0] % o->tp, ==, 0);
  check_segments(o, on, WSYNC_DTYPE_BF16, (Seg[]){{t, o->t * r, r}}, 1);
}

/* The vision tower, mm_encoder_tp_mode "weights" (docs/vllm.md §9.5): attn.qkv weight
 * and bias are [q_t; k_t; v_t] with q, k, v the thirds of the fused tensor, each sliced
 * by heads (docs/vllm.md §2 "fused", §9.5), not a contiguous third of the rows. */
static void
check_vision(Oracle *o)
{
  const Model *m = model_of(o);
  guint64 d = m->D, dt = d / o->tp;

  g_assert_cmpuint(m->heads % o->tp, ==, 0);
  check_visual_replicated(o, "patch_embed.proj.weight");
  check_visual_replicated(o, "patch_embed.proj.bias");
  check_visual_replicated(o, "pos_embed.weight");
  for (guint64 b = 0; b < m->depth; b++) {
    static const char *const whole[] = {"norm1.weight", "norm1.bias", "norm2.weight",
                                        "norm2.bias", "attn.proj.bias", "mlp.linear_fc2.bias"};
    g_autofree char *p = g_strdup_printf("blocks.%" G_GUINT64_FORMAT ".", b);
    for (guint i = 0; i < G_N_ELEMENTS(whole); i++) {
      g_autofree char *s = g_strconcat(p, whole[i], NULL);
      check_visual_replicated(o, s);
    }
    for (guint wb = 0; wb < 2; wb++) {
      g_autofree char *s = g_strconcat(p, wb ? "attn.qkv.bias" : "attn.qkv.weight", NULL);
      g_autofree char *on = g_strconcat("visual.", s, NULL);
      g_autofree char *in = g_strconcat("model.visual.", s, NULL);
      const WsyncTensor *qkv = input(o, in);
      check_segments(o, on, WSYNC_DTYPE_BF16,
                     (Seg[]){{qkv, o->t * dt, dt}, {qkv, d + o->t * dt, dt},
                             {qkv, 2 * d + o->t * dt, dt}},
                     3);
    }
    g_autofree char *proj = g_strconcat(p, "attn.proj.weight", NULL);
    g_autofree char *fc1w = g_strconcat(p, "mlp.linear_fc1.weight", NULL);
    g_autofree char *fc1b = g_strconcat(p, "mlp.linear_fc1.bias", NULL);
    g_autofree char *fc2w = g_strconcat(p, "mlp.linear_fc2.weight", NULL);
    check_visual_row(o, proj);
    check_visual_column(o, fc1w);
    check_visual_column(o, fc1b);
    check_visual_row(o, fc2w);
  }
  check_visual_replicated(o, "merger.norm.weight");
  check_visual_replicated(o, "merger.norm.bias");
  check_visual_column(o, "merger.linear_fc1.weight");
  check_visual_column(o, "merger.linear_fc1.bias");
  check_visual_row(o, "merger.linear_fc2.weight");
  check_visual_replicated(o, "merger.linear_fc2.bias");
}

typedef struct {
  const char *config;           /* a bundled config or a variant's path */
  const char *src;              /* NULL: synth(config, fused) */
  gboolean fused;               /* synth --fused-experts */
  guint tp, ep;                 /* ep 0: not given */
  gboolean lm_only;             /* language-model-only = true */
  const guint64 *expert_counts; /* E_loc per rank, or NULL for all */
  const char *backend;          /* all2all-backend, or NULL for the default */
  guint pcp;                    /* prefill-context-parallel-size, or 0 for the default */
  const char *version;          /* vllm-version, or NULL for the default */
  const char *target;           /* "vllm-ascend", or NULL for "vllm" */
  gboolean shared_expert_dp;    /* enable-shared-expert-dp = true */
} Case;

static const char *
case_target(const Case *c)
{
  return c->target != NULL ? c->target : "vllm";
}

/* The plugin "vllm" settings of a case (caller frees). */
static char *
case_settings(const Case *c)
{
  GString *s = g_string_new(NULL);

  if (c->backend != NULL)
    g_string_append_printf(s, "  all2all-backend = \"%s\"\n", c->backend);
  if (c->pcp > 0)
    g_string_append_printf(s, "  prefill-context-parallel-size = %u\n", c->pcp);
  if (c->version != NULL)
    g_string_append_printf(s, "  vllm-version = \"%s\"\n", c->version);
  if (c->shared_expert_dp)
    g_string_append(s, "  enable-shared-expert-dp = true\n");
  return g_string_free(s, FALSE);
}

/* Every tensor of one rank, and nothing else. */
static void
check_rank(const Case *c, const Model *m, WsyncCheckpoint *in, const RankFiles *rf, guint rank)
{
  Oracle o = {.model = m, .in = in, .rf = rf, .tp = c->tp, .ep = c->ep > 0 ? c->ep : 1,
              .rank = rank, .t = rank % c->tp, .kernel = c->ep > c->tp};
  g_autofree char *tp = g_strdup_printf("%u", o.tp);
  g_autofree char *rk = g_strdup_printf("%u", rank);
  guint n = 0;

  ascend_rank = strcmp(case_target(c), "vllm-ascend") == 0;
  shared_expert_whole =
      ascend_rank ? ascend_shared_expert_dp(o.tp, o.ep, c->shared_expert_dp)
                  : sequence_parallel_moe(o.tp, o.ep, c->pcp > 0 ? c->pcp : 1,
                                          c->backend != NULL ? c->backend
                                                             : "allgather_reducescatter");
  g_assert_cmpuint(rf->files->len, >, 0);
  assert_metadata(rf, "wsync.target", case_target(c));
  assert_metadata(rf, "wsync.tp", tp);
  assert_metadata(rf, "wsync.rank", rk);
  /* A tied LM head is the embedding module registered twice; the kept name is the
   * smaller, language_model.lm_head.weight (docs/vllm.md §3). */
  if (m->tied) {
    check_vocab_as(&o, "model.language_model.embed_tokens.weight",
                   "language_model.lm_head.weight", m->V);
    g_assert_null(rank_lookup(rf, "language_model.model.embed_tokens.weight"));
  } else {
    check_vocab_as(&o, "model.language_model.embed_tokens.weight",
                   "language_model.model.embed_tokens.weight", m->V);
    check_vocab_as(&o, "lm_head.weight", "language_model.lm_head.weight", m->V);
  }
  check_replicated_cast(&o, "model.language_model.norm.weight", "language_model.model.norm.weight",
                   WSYNC_DTYPE_BF16);
  for (guint64 l = 0; l < m->L; l++)
    check_layer(&o, l, c->expert_counts);
  if (m->vision && !c->lm_only)
    check_vision(&o);
  /* Nothing else: no mtp.* (vllm-skips-mtp), no visual.* with language-model-only. */
  for (guint f = 0; f < rf->files->len; f++)
    for (guint i = 0; i < wsync_checkpoint_n_tensors(rf->files->pdata[f]); i++) {
      const WsyncTensor *t = wsync_checkpoint_tensor(rf->files->pdata[f], i);
      g_assert_false(g_str_has_prefix(t->name, "mtp."));
      if (c->lm_only)
        g_assert_false(g_str_has_prefix(t->name, "visual."));
      n++;
    }
  g_assert_cmpuint(n, ==, o.checked);
}

/* Convert, check every rank; returns the rank directory (caller frees). */
static char *
run_case(const Case *c)
{
  const char *src = c->src != NULL ? c->src : synth(c->config, c->fused);
  g_autofree char *settings = case_settings(c);
  g_autofree char *dst =
      convert(src, conf_dir_with(c->lm_only, settings), case_target(c), c->tp, c->ep);
  guint world = c->ep > 1 ? c->ep : c->tp;
  RankFiles ranks[16];
  Model m = read_model(c->config);
  g_autoptr(WsyncCheckpoint) in = open_ck(src);

  g_assert_cmpuint(
      open_ranks_of(dst, c->ep > c->tp ? "kernel" : "sharded-state", ranks, G_N_ELEMENTS(ranks)),
      ==, world);
  for (guint r = 0; r < world; r++)
    check_rank(c, &m, in, &ranks[r], r);
  for (guint r = 0; r < G_N_ELEMENTS(ranks); r++)
    rank_files_clear(&ranks[r]);
  return g_steal_pointer(&dst);
}

static void
check_case(const Case *c)
{
  g_free(run_case(c));
}

/* ------------------------------------------------------------------ tests: Hugging Face layouts */

#define MOE "tiny-qwen3.5-moe.json"
#define DENSE "tiny-qwen3.5.json"

/* synth writes the published form: main experts fused, MTP experts per expert, A_log and
 * the linear-attention norm in F32 (the dtype of Qwen3.5's checkpoints: the config cannot
 * tell Qwen3.6-27B's BF16 from it), no lm_head when tied (docs/hf-checkpoints.md §3). */
static void
test_hf_published(void)
{
  static const char *const configs[] = {MOE, DENSE};

  for (guint i = 0; i < G_N_ELEMENTS(configs); i++) {
    Model m = read_model(configs[i]);
    g_autoptr(GPtrArray) specs = published(&m, TRUE, FALSE);
    g_autoptr(WsyncCheckpoint) ck = open_ck(synth(configs[i], FALSE));
    assert_tensors(ck, specs);
  }
}

/* --fused-experts (Transformers 5 in memory): the MTP experts fused too. */
static void
test_hf_fused_synth(void)
{
  Model m = read_model(MOE);
  g_autoptr(GPtrArray) specs = published(&m, TRUE, TRUE);
  g_autoptr(WsyncCheckpoint) ck = open_ck(synth(MOE, TRUE));

  assert_tensors(ck, specs);
}

/* Expert @e's rows of a per-expert tensor equal those of the fused source. */
static void
check_expert_split(WsyncCheckpoint *fused_ck, WsyncCheckpoint *split_ck, const Model *m,
                   const char *prefix)
{
  g_autofree char *gu_n = g_strconcat(prefix, "mlp.experts.gate_up_proj", NULL);
  g_autofree char *dn_n = g_strconcat(prefix, "mlp.experts.down_proj", NULL);
  const WsyncTensor *gu = wsync_checkpoint_lookup(fused_ck, gu_n);
  const WsyncTensor *dn = wsync_checkpoint_lookup(fused_ck, dn_n);

  g_assert_nonnull(gu);
  g_assert_nonnull(dn);
  for (guint64 e = 0; e < m->E; e++) {
    static const char *const projs[3] = {"gate_proj", "up_proj", "down_proj"};
    for (guint p = 0; p < 3; p++) {
      g_autofree char *n = g_strdup_printf("%smlp.experts.%" G_GUINT64_FORMAT ".%s.weight", prefix,
                                           e, projs[p]);
      const WsyncTensor *t = wsync_checkpoint_lookup(split_ck, n);
      g_assert_nonnull(t);
      for (guint64 i = 0; i < t->numel; i++) {
        /* gate: gate_up[e, r, :] r < I; up: gate_up[e, I + r, :]; down: down[e] */
        guint64 src = p < 2 ? (e * 2 * m->I + p * m->I) * m->H + i : e * m->H * m->I + i;
        if (!elem_ok(t, i, p < 2 ? gu : dn, src))
          g_error("%s element %" G_GUINT64_FORMAT " is not %s element %" G_GUINT64_FORMAT, n, i,
                  (p < 2 ? gu : dn)->name, src);
      }
    }
  }
}

/* hf-experts: every expert per expert, element by element from the fused source; and
 * back to "hf" (the form read per layer from the input), bit-exact. */
static void
test_hf_experts(void)
{
  const char *src = synth(MOE, FALSE);
  g_autofree char *split = convert(src, CONF, "hf-experts", 0, 0);
  g_autofree char *back = NULL;
  Model m = read_model(MOE);
  g_autoptr(GPtrArray) specs = published(&m, FALSE, FALSE);
  g_autoptr(WsyncCheckpoint) fused_ck = open_ck(synth(MOE, TRUE));
  g_autoptr(WsyncCheckpoint) split_ck = open_ck(split);
  Run r;

  assert_tensors(split_ck, specs);
  for (guint64 l = 0; l < m.L; l++) {
    g_autofree char *p = g_strdup_printf("model.language_model.layers.%" G_GUINT64_FORMAT ".", l);
    check_expert_split(fused_ck, split_ck, &m, p);
  }
  check_expert_split(fused_ck, split_ck, &m, "mtp.layers.0.");
  back = convert(split, CONF, "hf", 0, 0);
  r = run_wsync("verify", src, back, "--conf-dir", CONF, "--plugin-dir", plugin_dir(), NULL);
  if (r.status != 0)
    g_error("verify: exit %d\n%s%s", r.status, r.out, r.err);
  test_run_clear(&r);
}

/* The fused synth (every expert fused) read as "hf" and written as published: the same
 * bytes as the published synth (index patterns depend on the logical tensor only). */
static void
test_hf_fused_to_published(void)
{
  g_autofree char *back = convert(synth(MOE, TRUE), CONF, "hf", 0, 0);
  Run r = run_wsync("verify", synth(MOE, FALSE), back, "--conf-dir", CONF, "--plugin-dir",
                    plugin_dir(), NULL);

  if (r.status != 0)
    g_error("verify: exit %d\n%s%s", r.status, r.out, r.err);
  test_run_clear(&r);
}

/* ------------------------------------------------------------------ tests: vLLM layouts */

static void
test_vllm_tp1(void)
{
  check_case(&(Case){MOE, NULL, FALSE, 1, 0, FALSE, NULL, NULL, 0, NULL, NULL, FALSE});
}

/* tp 2: the vision tower at tp 2 too (qkv thirds sliced by heads). */
static void
test_vllm_tp2(void)
{
  check_case(&(Case){MOE, NULL, FALSE, 2, 0, FALSE, NULL, NULL, 0, NULL, NULL, FALSE});
}

/* tp 4 > 2 KV heads: each KV head on two ranks; one gated q head per rank; nk 4 and
 * nv 8 give each rank one key head and two value heads. */
static void
test_vllm_tp4_kv_replicated(void)
{
  check_case(&(Case){MOE, NULL, FALSE, 4, 0, FALSE, NULL, NULL, 0, NULL, NULL, FALSE});
}

/* Every expert fused in the input (MTP too), or every expert per expert: same files. */
static void
test_vllm_expert_forms(void)
{
  g_autofree char *split = convert(synth(MOE, FALSE), CONF, "hf-experts", 0, 0);

  check_case(&(Case){MOE, NULL, TRUE, 2, 0, FALSE, NULL, NULL, 0, NULL, NULL, FALSE});
  check_case(&(Case){MOE, split, FALSE, 2, 0, FALSE, NULL, NULL, 0, NULL, NULL, FALSE});
}

/* ep 3 over tp 1 (8 experts: 3, 3, 2) and ep 4 over tp 2 (2 each): whole routed
 * experts; the shared expert, attention and GDN stay TP-sliced by rank % tp. */
static void
test_vllm_ep(void)
{
  static const guint64 counts3[] = {3, 3, 2};
  static const guint64 counts4[] = {2, 2, 2, 2};

  check_case(&(Case){MOE, NULL, FALSE, 1, 3, FALSE, counts3, NULL, 0, NULL, NULL, FALSE});
  check_case(&(Case){MOE, NULL, FALSE, 2, 4, FALSE, counts4, NULL, 0, NULL, NULL, FALSE});
}

static guint
count_lines(const char *text)
{
  guint n = 0;

  for (const char *p = strchr(text, '\n'); p != NULL; p = strchr(p + 1, '\n'))
    n++;
  return n;
}

/* The shared expert of layer 0 on every rank of @dst (@world ranks, format @format):
 * gate_up_proj [2*Is/split, H] and down_proj [H, Is/split], split 1 (whole) or tp; the
 * files record the deployment they are for (@sedp: wsync.enable-shared-expert-dp, NULL
 * for none). */
static void
assert_shared_shapes(const char *dst, const char *format, guint world, guint split,
                     const char *backend, const char *pcp, const char *sedp)
{
  Model m = read_model(MOE);
  g_autofree char *gate_up = rt_name(0, "mlp.experts._shared_experts._layer.gate_up_proj.weight");
  g_autofree char *down = rt_name(0, "mlp.experts._shared_experts._layer.down_proj.weight");
  RankFiles ranks[8];

  g_assert_cmpuint(open_ranks_of(dst, format, ranks, G_N_ELEMENTS(ranks)), ==, world);
  for (guint r = 0; r < world; r++) {
    const WsyncTensor *gu = rank_lookup(&ranks[r], gate_up);
    const WsyncTensor *dn = rank_lookup(&ranks[r], down);

    g_assert_nonnull(gu);
    g_assert_nonnull(dn);
    g_assert_cmpuint(gu->ndim, ==, 2);
    g_assert_cmpuint(gu->shape[0], ==, 2 * m.Is / split);
    g_assert_cmpuint(gu->shape[1], ==, m.H);
    g_assert_cmpuint(dn->ndim, ==, 2);
    g_assert_cmpuint(dn->shape[0], ==, m.H);
    g_assert_cmpuint(dn->shape[1], ==, m.Is / split);
    assert_metadata(&ranks[r], "wsync.all2all-backend", backend);
    assert_metadata(&ranks[r], "wsync.prefill-context-parallel-size", pcp);
    assert_metadata(&ranks[r], "wsync.enable-shared-expert-dp", sedp);
  }
  for (guint r = 0; r < G_N_ELEMENTS(ranks); r++)
    rank_files_clear(&ranks[r]);
}

/* tp 2, ep 4 (docs/vllm.md §9.4): with the defaults dp = 4 / (1 * 2) = 2 and
 * allgather_reducescatter is listed, so every rank holds the shared expert whole; with
 * prefill-context-parallel-size 2 there is one data-parallel replica, and with a backend
 * outside the list the rule does not hold either: TP-sliced by rank % tp.  "pplx" is
 * renamed to allgather_reducescatter by ParallelConfig.__post_init__: whole.  Every
 * element is checked by the oracle (check_moe). */
static void
test_vllm_shared_expert(void)
{
  static const guint64 counts4[] = {2, 2, 2, 2};
  static const struct {
    const char *backend, *recorded;
    guint pcp, split;
  } cases[] = {
      {NULL, "allgather_reducescatter", 0, 1},
      {NULL, "allgather_reducescatter", 2, 2},
      {"flashinfer_nvlink_two_sided", "flashinfer_nvlink_two_sided", 0, 2},
      {"pplx", "pplx", 0, 1},
  };

  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_autofree char *dst = run_case(&(Case){MOE, NULL, FALSE, 2, 4, FALSE, counts4,
                                            cases[i].backend, cases[i].pcp, NULL, NULL, FALSE});
    g_autofree char *pcp = g_strdup_printf("%u", MAX(cases[i].pcp, 1));

    assert_shared_shapes(dst, "kernel", 4, cases[i].split, cases[i].recorded, pcp, NULL);
  }
}

/* vllm-version 0.25.0 (docs/vllm.md §9.4): with dp 2 the release's rule holds whether or
 * not it requires dp > 1, so the shared expert is whole; with one replica (tp 2, ep 2)
 * it is not known, and the first shared-expert tensor is refused. */
static void
test_vllm_shared_expert_unpinned(void)
{
  static const guint64 counts4[] = {2, 2, 2, 2};
  g_autofree char *dst =
      run_case(&(Case){MOE, NULL, FALSE, 2, 4, FALSE, counts4, NULL, 0, "0.25.0", NULL, FALSE});
  g_autofree char *refused = new_path("refused");
  Run r;

  assert_shared_shapes(dst, "kernel", 4, 1, "allgather_reducescatter", "1", NULL);
  r = run_wsync("convert", synth(MOE, FALSE), refused, "--conf-dir",
                conf_dir_with(FALSE, "  vllm-version = \"0.25.0\"\n"), "--plugin-dir",
                plugin_dir(), "--target", "vllm", "--format", "kernel", "--tp", "2", "--ep", "2",
                NULL);
  g_assert_cmpint(r.status, ==, 2);
  assert_has(r.err, "vllm: language_model.model.layers.0.mlp.experts._shared_experts._layer."
                    "gate_up_proj.weight: vllm-version 0.25.0: whether vLLM builds the shared "
                    "expert whole (use_sequence_parallel_moe) with all2all-backend "
                    "\"allgather_reducescatter\" and ep 2 = dp 1 * pcp 1 * tp 2 is not known: "
                    "releases 0.25.0 to 0.27.0 were cut while vLLM main had dropped the rule's "
                    "dp > 1");
  g_assert_cmpuint(count_lines(r.err), ==, 1);
  g_assert_false(g_file_test(refused, G_FILE_TEST_EXISTS));
  test_run_clear(&r);
}

/* vLLM-Ascend holds the shared expert by its own rule (docs/vllm-ascend.md §2): tp 2,
 * ep 4 with the defaults (allgather_reducescatter, dp 2: vLLM's use_sequence_parallel_moe
 * holds) is TP-sliced by rank % tp; with enable-shared-expert-dp whole on every rank.  The
 * vllm target ignores the option (whole by vLLM's rule, nothing recorded).  With tp 2, ep 2
 * (dp 1, where vLLM's rule does not hold) in the sharded-state format the option still
 * makes it whole.  Every element is checked by the oracle (check_moe). */
static void
test_ascend_shared_expert(void)
{
  static const guint64 counts4[] = {2, 2, 2, 2};
  static const guint64 counts2[] = {4, 4};
  static const struct {
    const char *target;
    gboolean sedp;
    guint split;
    const char *recorded;
  } cases[] = {
      {"vllm-ascend", FALSE, 2, "false"},
      {"vllm-ascend", TRUE, 1, "true"},
      {"vllm", TRUE, 1, NULL},
  };

  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_autofree char *dst = run_case(&(Case){MOE, NULL, FALSE, 2, 4, FALSE, counts4, NULL, 0, NULL,
                                            cases[i].target, cases[i].sedp});

    assert_shared_shapes(dst, "kernel", 4, cases[i].split, "allgather_reducescatter", "1",
                         cases[i].recorded);
  }
  {
    g_autofree char *dst = run_case(
        &(Case){MOE, NULL, FALSE, 2, 2, FALSE, counts2, NULL, 0, NULL, "vllm-ascend", TRUE});

    assert_shared_shapes(dst, "sharded-state", 2, 1, "allgather_reducescatter", "1", "true");
  }
}

/* Where vLLM's own rule is not known (vllm-version 0.28.0 with
 * flashinfer_nvlink_one_sided, docs/vllm.md §9.4) the vllm target refuses, and
 * vllm-ascend, which does not follow vLLM's rule, writes the shared expert TP-sliced. */
static void
test_ascend_shared_expert_vllm_unknown(void)
{
  static const guint64 counts4[] = {2, 2, 2, 2};
  g_autofree char *dst = run_case(&(Case){MOE, NULL, FALSE, 2, 4, FALSE, counts4,
                                          "flashinfer_nvlink_one_sided", 0, "0.28.0",
                                          "vllm-ascend", FALSE});
  g_autofree char *refused = new_path("refused");
  Run r;

  assert_shared_shapes(dst, "kernel", 4, 2, "flashinfer_nvlink_one_sided", "1", "false");
  r = run_wsync("convert", synth(MOE, FALSE), refused, "--conf-dir",
                conf_dir_with(FALSE, "  all2all-backend = \"flashinfer_nvlink_one_sided\"\n"
                                     "  vllm-version = \"0.28.0\"\n"),
                "--plugin-dir", plugin_dir(), "--target", "vllm", "--format", "kernel", "--tp",
                "2", "--ep", "4", NULL);
  g_assert_cmpint(r.status, ==, 2);
  assert_has(r.err, "vllm: language_model.model.layers.0.mlp.experts._shared_experts._layer."
                    "gate_up_proj.weight: vllm-version 0.28.0: whether vLLM builds the shared "
                    "expert whole (use_sequence_parallel_moe) with all2all-backend "
                    "\"flashinfer_nvlink_one_sided\" and ep 4 = dp 2 * pcp 1 * tp 2 is not "
                    "known: whether releases after 0.27.x list flashinfer_nvlink_one_sided");
  g_assert_cmpuint(count_lines(r.err), ==, 1);
  g_assert_false(g_file_test(refused, G_FILE_TEST_EXISTS));
  test_run_clear(&r);
}

/* Settings vLLM would not start with, or that no deployment has, are refused with exit
 * status 2, one line, and no output directory. */
static void
assert_settings_refused(const char *settings, const char *ep, const char *want)
{
  g_autofree char *dst = new_path("refused");
  Run r = run_wsync("convert", synth(MOE, FALSE), dst, "--conf-dir", conf_dir_with(FALSE, settings),
                    "--plugin-dir", plugin_dir(), "--target", "vllm", "--format", "kernel",
                    "--tp", "2", "--ep", ep, NULL);

  g_assert_cmpint(r.status, ==, 2);
  assert_has(r.err, want);
  g_assert_cmpuint(count_lines(r.err), ==, 1);
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
  test_run_clear(&r);
}

static void
test_refuse_deployment(void)
{
  /* dp = 4 / (4 * 2) is not whole */
  assert_settings_refused("  prefill-context-parallel-size = 4\n", "4",
                          "ep 4 is not a whole number of data-parallel replicas of "
                          "prefill-context-parallel-size 4 * tp 2 (vLLM's expert-parallel group "
                          "is dp*pcp*tp ranks): set prefill-context-parallel-size and --ep as "
                          "the deployment's --prefill-context-parallel-size and dp*pcp*tp");
  assert_settings_refused("  prefill-context-parallel-size = 0\n", "4",
                          "prefill-context-parallel-size must be a whole number from 1 to "
                          "65535, not 0");
  assert_settings_refused("  all2all-backend = \"nccl\"\n", "4",
                          "all2all-backend must be one of vLLM's --all2all-backend names "
                          "(allgather_reducescatter, naive, pplx, deepep_high_throughput, "
                          "deepep_low_latency, deepep_v2, mori, mori_high_throughput, "
                          "mori_low_latency, nixl_ep, flashinfer_all2allv, "
                          "flashinfer_nvlink_two_sided or flashinfer_nvlink_one_sided), not "
                          "\"nccl\"");
}

/* The plan says why the shared expert is whole or TP-sliced, with the numbers; without
 * EP there is nothing to say. */
static void
assert_plan_note(const char *settings, const char *target, const char *ep, const char *want,
                 const char *absent)
{
  Run r = run_wsync("plan", synth(MOE, FALSE), "--conf-dir", conf_dir_with(FALSE, settings),
                    "--plugin-dir", plugin_dir(), "--target", target, "--format", "kernel",
                    "--tp", "2", "--ep", ep, NULL);

  if (r.status != 0)
    g_error("plan --target %s --ep %s: exit %d: %s", target, ep, r.status, r.err);
  if (want != NULL)
    assert_has(r.out, want);
  g_assert_null(strstr(r.out, absent));
  test_run_clear(&r);
}

static void
test_plan_shared_expert(void)
{
  assert_plan_note("", "vllm", "4",
                   "note: sequence-parallel MoE (ep 4 = dp 2 * pcp 1 * tp 2, all2all-backend "
                   "\"allgather_reducescatter\"): vLLM's use_sequence_parallel_moe holds (the "
                   "backend is in vllm-version latest's list, tp > 1, dp > 1), so it builds the "
                   "shared expert with disable_tp, whole on every rank\n",
                   "vllm-ascend:");
  assert_plan_note("  prefill-context-parallel-size = 2\n", "vllm", "4",
                   "note: the shared expert stays TP-sliced (ep 4 = dp 1 * pcp 2 * tp 2): vLLM's "
                   "use_sequence_parallel_moe needs dp > 1, and one data-parallel replica "
                   "(prefill-context-parallel-size 2) keeps disable_tp off\n",
                   "sequence-parallel MoE (");
  assert_plan_note("  all2all-backend = \"flashinfer_nvlink_two_sided\"\n", "vllm", "4",
                   "note: the shared expert stays TP-sliced (ep 4 = dp 2 * pcp 1 * tp 2): "
                   "all2all-backend \"flashinfer_nvlink_two_sided\" is not in vllm-version "
                   "latest's use_sequence_parallel_moe list, so vLLM keeps disable_tp off\n",
                   "sequence-parallel MoE (");
  assert_plan_note("", "vllm", "1", NULL, "use_sequence_parallel_moe");
  /* vLLM-Ascend's own rule (docs/vllm-ascend.md §2), not vLLM's */
  assert_plan_note("", "vllm-ascend", "4",
                   "note: vllm-ascend: the shared expert stays TP-sliced (ep 4 = dp 2 * pcp 1 * "
                   "tp 2, enable-shared-expert-dp = false): vLLM-Ascend replicates a "
                   "shared-expert linear only with additional_config enable_shared_expert_dp, "
                   "EP and tp > 1, whatever vLLM's use_sequence_parallel_moe says (until #13946 "
                   "also with FlashComm1 or the SP compile pass on, which this assumes off) "
                   "(docs/vllm-ascend.md §2)\n",
                   "use_sequence_parallel_moe holds");
  assert_plan_note("  enable-shared-expert-dp = true\n", "vllm-ascend", "4",
                   "note: vllm-ascend: the shared expert is whole on every rank (ep 4 = dp 2 * "
                   "pcp 1 * tp 2, enable-shared-expert-dp = true): vLLM-Ascend replicates a "
                   "shared-expert linear only with additional_config enable_shared_expert_dp, "
                   "EP and tp > 1, whatever vLLM's use_sequence_parallel_moe says (until #13946 "
                   "also with FlashComm1 or the SP compile pass on, which this assumes off) "
                   "(docs/vllm-ascend.md §2)\n",
                   "stays TP-sliced");
  /* after the last vLLM-Ascend read, the rule is assumed */
  assert_plan_note("  vllm-version = \"0.28.0\"\n", "vllm-ascend", "4",
                   "(docs/vllm-ascend.md §2); not verified for vllm-version 0.28.0: "
                   "vLLM-Ascend was read up to the one for vLLM 0.27.1\n",
                   "use_sequence_parallel_moe holds");
  /* the vllm target ignores the option, and says nothing of vLLM-Ascend */
  assert_plan_note("  enable-shared-expert-dp = true\n", "vllm", "4",
                   "note: sequence-parallel MoE (ep 4 = dp 2 * pcp 1 * tp 2", "vllm-ascend:");
  assert_plan_note("  enable-shared-expert-dp = true\n", "vllm-ascend", "1", NULL,
                   "enable-shared-expert-dp =");
}

/* The dense model with tied embeddings: no lm_head anywhere; gate_up_proj/down_proj. */
static void
test_vllm_dense_tied(void)
{
  check_case(&(Case){DENSE, NULL, FALSE, 1, 0, FALSE, NULL, NULL, 0, NULL, NULL, FALSE});
  check_case(&(Case){DENSE, NULL, FALSE, 2, 0, FALSE, NULL, NULL, 0, NULL, NULL, FALSE});
  check_case(&(Case){DENSE, NULL, FALSE, 4, 0, FALSE, NULL, NULL, 0, NULL, NULL, FALSE});
}

/* Layer types from full_attention_interval (2) when layer_types is absent. */
static void
test_vllm_interval(void)
{
  const char *config = variant(MOE, "interval");
  Model m = read_model(config);

  g_assert_true(m.linear[0] && !m.linear[1] && m.linear[2] && !m.linear[3]);
  check_case(&(Case){config, NULL, FALSE, 2, 0, FALSE, NULL, NULL, 0, NULL, NULL, FALSE});
}

/* The legacy layer type names read as their new ones (docs/hf-checkpoints.md §3): the
 * same files as the config with "linear_attention" / "full_attention". */
static void
test_vllm_legacy_layer_types(void)
{
  g_autofree char *legacy = convert(synth(variant(MOE, "legacy"), FALSE), CONF, "vllm", 2, 0);
  g_autofree char *plain = convert(synth(MOE, FALSE), CONF, "vllm", 2, 0);
  Run r = run_wsync("verify", plain, legacy, "--conf-dir", CONF, "--plugin-dir", plugin_dir(),
                    NULL);

  if (r.status != 0)
    g_error("verify: exit %d\n%s%s", r.status, r.out, r.err);
  test_run_clear(&r);
}

/* synth --layers 3 cuts the config by the fields the plugin declares: text_config's
 * num_hidden_layers and the first three layer_types (a cut from the wrong end would
 * keep the full-attention layer 3); the MTP layer and the vision tower are counted
 * apart and stay. */
static void
test_synth_layers(void)
{
  g_autofree char *config = config_path(MOE);
  g_autofree char *dst = new_path("synth-layers");
  Run r = run_wsync("synth", "--config", config, dst, "--layers", "3", "-q", "--conf-dir", CONF,
                    "--plugin-dir", plugin_dir(), NULL);
  if (r.status != 0)
    g_error("synth: exit %d\n%s%s", r.status, r.out, r.err);
  test_run_clear(&r);

  g_autofree char *written = g_build_filename(dst, "config.json", NULL);
  g_autoptr(JsonNode) root = load_json(written);
  g_autoptr(JsonNode) before = load_json(config);
  JsonObject *text = json_object_get_object_member(json_node_get_object(root), "text_config");
  JsonArray *types = json_object_get_array_member(text, "layer_types");
  g_assert_cmpint(json_object_get_int_member(text, "num_hidden_layers"), ==, 3);
  g_assert_cmpuint(json_array_get_length(types), ==, 3);
  for (guint i = 0; i < 3; i++)
    g_assert_cmpstr(json_array_get_string_element(types, i), ==, "linear_attention");
  g_assert_cmpint(json_object_get_int_member(text, "mtp_num_hidden_layers"), ==, 1);
  g_assert_true(json_node_equal(
      json_object_get_member(json_node_get_object(root), "vision_config"),
      json_object_get_member(json_node_get_object(before), "vision_config")));

  r = run_wsync("inspect", dst, NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_nonnull(strstr(r.out, "model.language_model.layers.2.linear_attn."));
  g_assert_null(strstr(r.out, "model.language_model.layers.3."));
  g_assert_nonnull(strstr(r.out, "mtp.layers.0.self_attn.q_proj.weight"));
  g_assert_nonnull(strstr(r.out, "model.visual.blocks.0."));
  test_run_clear(&r);
}

/* A flat (text-only) config: text fields at the root, no vision tower, no MTP. */
static void
test_vllm_flat(void)
{
  const char *config = variant(MOE, "flat");
  Model m = read_model(config);

  g_assert_false(m.vision);
  check_case(&(Case){config, NULL, FALSE, 2, 0, FALSE, NULL, NULL, 0, NULL, NULL, FALSE});
}

/* language-model-only: no visual.* at all (check_rank insists), dropped by the rule. */
static void
test_vllm_language_model_only(void)
{
  check_case(&(Case){MOE, NULL, FALSE, 2, 0, TRUE, NULL, NULL, 0, NULL, NULL, FALSE});
}

/* ------------------------------------------------------------------ tests: casts */

/* F32 values of linear_attn.norm.weight and the BF16 vLLM must hold (round to nearest,
 * ties to even, as torch's copy_ does). */
static const struct {
  guint32 f32;
  guint16 bf16;
} norm_cases[] = {
    {0x3F800000u, 0x3F80u}, /* 1.0, exact */
    {0x3F808000u, 0x3F80u}, /* 1.00390625: exactly halfway, tie to even rounds DOWN */
    {0x3F808001u, 0x3F81u}, /* just above halfway: rounds UP */
    {0x3F818000u, 0x3F82u}, /* halfway above an odd value: tie to even rounds UP */
    {0x3F807FFFu, 0x3F80u}, /* just below halfway: rounds down */
    {0xBF818000u, 0xBF82u}, /* negative tie, up in magnitude to even */
    {0x3F81FFFFu, 0x3F82u}, /* carries into the next value */
    {0x3FFFFFFFu, 0x4000u}, /* carries into the exponent */
    {0x00018000u, 0x0002u}, /* subnormal tie to even, up */
    {0x00008000u, 0x0000u}, /* subnormal tie to even, down */
    {0x80000000u, 0x8000u}, /* -0 */
    {0x7F7FFFFFu, 0x7F80u}, /* the largest float rounds to infinity */
};

/* BF16 values of A_log that vLLM holds as F32: the BF16 bits become the high half. */
static const guint16 alog_cases[] = {0x3F80u, 0xC0A0u, 0x0001u, 0x8000u, 0x7F7Fu, 0x3E4Du, 0xBF81u};

typedef enum {
  CAST_INPUT,  /* norm F32 from norm_cases, A_log BF16 from alog_cases */
  EXACT_INPUT, /* norm F32 with values BF16 holds exactly, A_log F32 unchanged */
  BF16_INPUT,  /* A_log and norm BF16, as Qwen3.6-27B publishes them: the high half of
                * synth's F32 value (which encodes its origin) */
} HandMade;

static gboolean
is_alog_or_norm(const char *name)
{
  return g_str_has_suffix(name, ".linear_attn.A_log") ||
         g_str_has_suffix(name, ".linear_attn.norm.weight");
}

/* A checkpoint by hand: the tensors of @src, with linear_attn.norm.weight and A_log
 * replaced as @kind says, in one file model.safetensors, with src's config.json. */
static char *
hand_made(const char *src, HandMade kind)
{
  g_autoptr(WsyncCheckpoint) in = open_ck(src);
  g_autoptr(WsyncSafetensorsWriter) w = wsync_safetensors_writer_new();
  char *dst = new_path("handmade");
  g_autofree char *file = g_build_filename(dst, "model.safetensors", NULL);
  g_autofree char *config_from = g_build_filename(src, "config.json", NULL);
  g_autofree char *config_to = g_build_filename(dst, "config.json", NULL);
  GError *error = NULL;
  guint k = 0;

  g_assert_cmpint(g_mkdir(dst, 0755), ==, 0);
  test_copy(config_from, config_to);
  for (guint i = 0; i < wsync_checkpoint_n_tensors(in); i++) {
    const WsyncTensor *t = wsync_checkpoint_tensor(in, i);
    WsyncDtype dtype = t->dtype;
    if (kind == CAST_INPUT && g_str_has_suffix(t->name, ".linear_attn.A_log"))
      dtype = WSYNC_DTYPE_BF16;
    if (kind == BF16_INPUT && is_alog_or_norm(t->name))
      dtype = WSYNC_DTYPE_BF16;
    g_assert_true(wsync_safetensors_writer_add(w, t->name, dtype, t->ndim, t->shape, &error));
  }
  g_assert_true(wsync_safetensors_writer_begin(w, file, &error));
  g_assert_no_error(error);
  for (guint i = 0; i < wsync_checkpoint_n_tensors(in); i++) {
    const WsyncTensor *t = wsync_checkpoint_tensor(in, i);
    guint8 *data = wsync_safetensors_writer_data(w, t->name, &error);
    g_assert_no_error(error);
    if (kind == BF16_INPUT && is_alog_or_norm(t->name)) {
      g_assert_cmpint(t->dtype, ==, WSYNC_DTYPE_F32);
      for (guint64 e = 0; e < t->numel; e++) {
        guint16 v = GUINT16_TO_LE((guint16)(get32(t->data + 4 * e) >> 16));
        memcpy(data + 2 * e, &v, 2);
      }
    } else if (g_str_has_suffix(t->name, ".linear_attn.norm.weight")) {
      g_assert_cmpint(t->dtype, ==, WSYNC_DTYPE_F32);
      for (guint64 e = 0; e < t->numel; e++) {
        guint32 v = kind == CAST_INPUT ? norm_cases[k++ % G_N_ELEMENTS(norm_cases)].f32
                                       : get32(t->data + 4 * e) & 0xffff0000u;
        v = GUINT32_TO_LE(v);
        memcpy(data + 4 * e, &v, 4);
      }
    } else if (kind == CAST_INPUT && g_str_has_suffix(t->name, ".linear_attn.A_log")) {
      for (guint64 e = 0; e < t->numel; e++) {
        guint16 v = GUINT16_TO_LE(alog_cases[(e + i) % G_N_ELEMENTS(alog_cases)]);
        memcpy(data + 2 * e, &v, 2);
      }
    } else
      memcpy(data, t->data, t->nbytes);
  }
  g_assert_true(wsync_safetensors_writer_finish(w, &error));
  g_assert_no_error(error);
  return dst;
}

/* Every linear_attn.norm.weight element vLLM holds is norm_cases[...].bf16 of the F32
 * the input held, and every A_log element the input's BF16 in the high half (exact). */
static void
check_cast_values(const char *src, const char *rank_dir, guint tp, const Model *m)
{
  g_autoptr(WsyncCheckpoint) in = open_ck(src);
  RankFiles ranks[8];
  guint hits = 0;

  g_assert_cmpuint(open_ranks_of(rank_dir, "sharded-state", ranks, G_N_ELEMENTS(ranks)), ==, tp);
  for (guint r = 0; r < tp; r++)
    for (guint64 l = 0; l < m->L; l++) {
      g_autofree char *ni = ck_name(l, "linear_attn.norm.weight");
      g_autofree char *no = rt_name(l, "linear_attn.norm.weight");
      g_autofree char *ai = ck_name(l, "linear_attn.A_log");
      g_autofree char *ao = rt_name(l, "linear_attn.A_log");
      const WsyncTensor *nin, *nout, *ain, *aout;
      if (!m->linear[l])
        continue;
      nin = wsync_checkpoint_lookup(in, ni);
      nout = rank_lookup(&ranks[r], no);
      ain = wsync_checkpoint_lookup(in, ai);
      aout = rank_lookup(&ranks[r], ao);
      g_assert_cmpint(nout->dtype, ==, WSYNC_DTYPE_BF16);
      g_assert_cmpint(ain->dtype, ==, WSYNC_DTYPE_BF16);
      g_assert_cmpint(aout->dtype, ==, WSYNC_DTYPE_F32);
      for (guint64 e = 0; e < nin->numel; e++) {
        guint32 f = get32(nin->data + 4 * e);
        guint c = 0;
        while (c < G_N_ELEMENTS(norm_cases) && norm_cases[c].f32 != f)
          c++;
        g_assert_cmpuint(c, <, G_N_ELEMENTS(norm_cases));
        if (get16(nout->data + 2 * e) != norm_cases[c].bf16)
          g_error("%s of rank %u: F32 0x%08x became BF16 0x%04x, want 0x%04x", no, r, f,
                  get16(nout->data + 2 * e), norm_cases[c].bf16);
        hits++;
      }
      for (guint64 e = 0; e < aout->numel; e++) {
        guint64 global = (guint64)(r % tp) * aout->numel + e;
        g_assert_cmphex(get32(aout->data + 4 * e), ==,
                        (guint32)get16(ain->data + 2 * global) << 16);
      }
    }
  g_assert_cmpuint(hits, >=, G_N_ELEMENTS(norm_cases));
  for (guint r = 0; r < G_N_ELEMENTS(ranks); r++)
    rank_files_clear(&ranks[r]);
}

/* Reading rank files back to "hf": the checkpoint is @orig again, dtype for dtype (the
 * rank files record the published dtype of what vLLM holds in another), except that an
 * F32 norm vLLM rounded to BF16 comes back as its BF16 value in F32 (the F32 value it
 * was rounded from is lost); @widened counts those norms that changed. */
static void
assert_read_back(const char *orig_dir, const char *back_dir, guint *widened)
{
  g_autoptr(WsyncCheckpoint) orig = open_ck(orig_dir);
  g_autoptr(WsyncCheckpoint) back = open_ck(back_dir);

  *widened = 0;
  g_assert_cmpuint(wsync_checkpoint_n_tensors(orig), ==, wsync_checkpoint_n_tensors(back));
  for (guint i = 0; i < wsync_checkpoint_n_tensors(orig); i++) {
    const WsyncTensor *a = wsync_checkpoint_tensor(orig, i);
    const WsyncTensor *b = wsync_checkpoint_lookup(back, a->name);
    gboolean norm = g_str_has_suffix(a->name, ".linear_attn.norm.weight");
    if (b == NULL)
      g_error("read back lacks %s", a->name);
    g_assert_cmpuint(a->ndim, ==, b->ndim);
    g_assert_cmpmem(a->shape, sizeof(guint64) * a->ndim, b->shape, sizeof(guint64) * b->ndim);
    if (a->dtype != b->dtype)
      g_error("%s: read back as %s, published as %s", a->name, wsync_dtype_name(b->dtype),
              wsync_dtype_name(a->dtype));
    if (norm && a->dtype == WSYNC_DTYPE_F32) {
      for (guint64 e = 0; e < a->numel; e++) {
        guint32 want = (guint32)round_to_bf16(get32(a->data + 4 * e)) << 16;
        if (get32(b->data + 4 * e) != want)
          g_error("%s element %" G_GUINT64_FORMAT ": read back 0x%08x, want 0x%08x", a->name, e,
                  get32(b->data + 4 * e), want);
      }
      *widened += memcmp(a->data, b->data, a->nbytes) != 0;
    } else if (memcmp(a->data, b->data, a->nbytes) != 0)
      g_error("%s does not read back bit-exact", a->name);
  }
}

/* The casts, on a hand-made input: F32 norm values that round down, up, ties both ways,
 * and BF16 A_log values; every other tensor is still checked element by element by the
 * oracle (which knows the same casts).  Then read back: the norm widens exactly. */
static void
test_casts(void)
{
  const char *config = variant(MOE, "nomtp");
  Model m = read_model(config);
  g_autofree char *src = hand_made(synth(config, FALSE), CAST_INPUT);
  g_autofree char *dst = run_case(&(Case){config, src, FALSE, 2, 0, FALSE, NULL, NULL, 0, NULL, NULL, FALSE});
  g_autofree char *back = NULL;
  guint widened;

  check_cast_values(src, dst, 2, &m);
  back = convert(dst, CONF, "hf", 0, 0);
  assert_read_back(src, back, &widened);
  g_assert_cmpuint(widened, >, 0);
}

/* ------------------------------------------------------------------ tests: round trips */

/* vllm -> hf: bit-exact for every tensor but the rounded norm, which widens exactly.
 * (Inputs without MTP: vLLM skips mtp.*, so rank files cannot give it back.) */
static void
round_trip(const char *config, guint tp, guint ep, const guint64 *expert_counts)
{
  const char *src = synth(config, FALSE);
  g_autofree char *dst = run_case(&(Case){config, NULL, FALSE, tp, ep, FALSE, expert_counts, NULL, 0, NULL, NULL, FALSE});
  g_autofree char *back = convert(dst, CONF, "hf", 0, 0);
  guint widened;

  assert_read_back(src, back, &widened);
}

static void
test_round_trip(void)
{
  static const guint64 counts[] = {2, 2, 2, 2};

  round_trip(variant(MOE, "nomtp"), 2, 0, NULL);
  round_trip(variant(MOE, "nomtp"), 4, 0, NULL);
  round_trip(variant(MOE, "nomtp"), 2, 4, counts);
  round_trip(variant(DENSE, "nomtp"), 4, 0, NULL);
}

/* Rank files read back by what they record, whatever the options say: TP-sliced files
 * of prefill-context-parallel-size 2 read with the defaults give the checkpoint back. */
static void
test_round_trip_shared_expert(void)
{
  static const guint64 counts4[] = {2, 2, 2, 2};
  const char *config = variant(MOE, "nomtp");
  g_autofree char *dst =
      run_case(&(Case){config, NULL, FALSE, 2, 4, FALSE, counts4, NULL, 2, NULL, NULL, FALSE});
  g_autofree char *back = convert(dst, CONF, "hf", 0, 0);
  guint widened;

  assert_read_back(synth(config, FALSE), back, &widened);
}

/* Rank files of a language-model-only deployment hold no vision tower (dropped by the
 * rule language-model-only when written).  Reading them back to "hf" used to succeed,
 * exit 0, with model.visual.* listed as omitted: Transformers 5 then initialises the tower
 * at random (docs/hf-checkpoints.md §7).  Refused: exit 2, one line naming the source,
 * how many tensors the hf layout needs, the rule and the first of them; no output; the
 * plan refuses the same. */
static void
test_read_back_language_model_only(void)
{
  g_autofree char *dst =
      run_case(&(Case){MOE, NULL, FALSE, 2, 0, TRUE, NULL, NULL, 0, NULL, NULL, FALSE});
  g_autofree char *back = new_path("refused");
  g_autofree char *from = config_path(MOE);
  g_autoptr(JsonNode) root = load_json(from);
  JsonObject *vision = json_object_get_object_member(json_node_get_object(root), "vision_config");
  /* 3 tensors of the patch and position embeddings, 6 of the merger, 12 per block */
  guint64 depth = (guint64)json_object_get_int_member(vision, "depth");
  g_autofree char *want = g_strdup_printf(
      "wsync: %s: the hf layout needs %" G_GUINT64_FORMAT " tensors that the source does not "
      "hold (its files were written without them, by rule language-model-only): "
      "model.visual.patch_embed.proj.weight, model.visual.patch_embed.proj.bias, "
      "model.visual.pos_embed.weight, model.visual.blocks.0.norm1.weight, ",
      dst, 9 + 12 * depth);
  const char *commands[] = {"convert", "plan"};

  /* with conf.d's language-model-only either way: the files record it */
  for (guint k = 0; k < 2 * G_N_ELEMENTS(commands); k++) {
    guint i = k % G_N_ELEMENTS(commands);
    const char *conf = conf_dir(k < G_N_ELEMENTS(commands));
    Run r = i == 0 ? run_wsync("convert", dst, back, "--conf-dir", conf, "--plugin-dir",
                               plugin_dir(), "--target", "hf", NULL)
                   : run_wsync("plan", dst, "--conf-dir", conf, "--plugin-dir", plugin_dir(),
                               "--target", "hf", NULL);
    g_assert_cmpint(r.status, ==, 2);
    g_assert_true(g_str_has_prefix(r.err, want));
    assert_has(r.err, "; convert a checkpoint that holds them instead, or a target that does "
                      "not need them\n");
    g_assert_cmpuint(count_lines(r.err), ==, 1);
    g_assert_false(g_file_test(back, G_FILE_TEST_EXISTS));
    test_run_clear(&r);
  }
}

/* The number of tensors of MOE's vision tower in one vLLM rank: 3 of the patch and
 * position embeddings, 6 of the merger, 12 per block. */
static guint64
vision_tensors(void)
{
  g_autofree char *from = config_path(MOE);
  g_autoptr(JsonNode) root = load_json(from);
  JsonObject *vision = json_object_get_object_member(json_node_get_object(root), "vision_config");

  return 9 + 12 * (guint64)json_object_get_int_member(vision, "depth");
}

/* `wsync inspect DIR` lists @line among the files' metadata, once per rank file. */
static void
assert_recorded(const char *dir, const char *line, guint n_files)
{
  Run r = run_wsync("inspect", dir, "--conf-dir", CONF, "--plugin-dir", plugin_dir(), NULL);
  guint n = 0;

  g_assert_cmpint(r.status, ==, 0);
  for (const char *p = r.out; (p = strstr(p, line)) != NULL; p += strlen(line))
    n++;
  g_assert_cmpuint(n, ==, n_files);
  test_run_clear(&r);
}

/* Rank files record whether they were written without the vision tower, and read back
 * as they record it, whatever conf.d says.  Before, rank files of a language-model-only
 * deployment read with the default conf.d failed: exit 3, "66 tensors the vllm layout
 * needs are missing: visual.patch_embed.proj.weight, ..."; files with the tower read
 * with language-model-only = true: exit 3, "33 input tensors no rule of remapper
 * qwen3_5_moe (plugin qwen3_5_moe) maps: visual.blocks.0.attn.proj.bias, ...". */
static void
test_read_back_recorded_switch(void)
{
  const char *src = synth(MOE, FALSE);
  g_autofree char *lm_only =
      run_case(&(Case){MOE, NULL, FALSE, 2, 0, TRUE, NULL, NULL, 0, NULL, NULL, FALSE});
  g_autofree char *full = convert(src, CONF, "vllm", 2, 0);
  g_autofree char *direct = convert(src, conf_dir(TRUE), "vllm", 1, 0);
  g_autofree char *nomtp_ranks = NULL;
  g_autofree char *back = NULL;
  g_autofree char *retp = NULL;
  guint widened;

  assert_recorded(lm_only, "\n  wsync.runtime-drop.language-model-only=true\n", 2);
  assert_recorded(full, "\n  wsync.runtime-drop.language-model-only=false\n", 2);

  /* to another tp with the default conf.d: written without the tower, as the source was,
   * and the plan says why */
  Run r = run_wsync("plan", lm_only, "--conf-dir", CONF, "--plugin-dir", plugin_dir(),
                    "--target", "vllm", "--tp", "1", NULL);
  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, "\nnote: language-model-only = true, as the source's rank files record "
                    "(metadata wsync.runtime-drop.language-model-only), not false as conf.d "
                    "sets it (plugin \"qwen3_5_moe\"): the plan reads and writes the blocks "
                    "it switches off as the source was written\n");
  test_run_clear(&r);
  retp = convert(lm_only, CONF, "vllm", 1, 0);
  assert_recorded(retp, "\n  wsync.runtime-drop.language-model-only=true\n", 1);
  r = run_wsync("verify", retp, direct, "--conf-dir", CONF, "--plugin-dir", plugin_dir(), NULL);
  g_assert_cmpint(r.status, ==, 0);
  test_run_clear(&r);

  /* the reverse: files that hold the tower, read with language-model-only = true, give
   * the checkpoint back (one without a draft block, which vLLM does not hold) */
  const char *nomtp = synth(variant(MOE, "nomtp"), FALSE);
  nomtp_ranks = convert(nomtp, CONF, "vllm", 2, 0);
  back = convert(nomtp_ranks, conf_dir(TRUE), "hf", 0, 0);
  assert_read_back(nomtp, back, &widened);
}

/* Rank files of an earlier wsync record no switch: they are read as conf.d says, and
 * when they hold the tower as the other setting has them, refused (exit 2) with the
 * setting to make, which then reads them. */
static void
test_read_back_unrecorded_switch(void)
{
  const char *src = synth(MOE, FALSE);
  g_autofree char *lm_only =
      run_case(&(Case){MOE, NULL, FALSE, 2, 0, TRUE, NULL, NULL, 0, NULL, NULL, FALSE});
  g_autofree char *full = convert(src, CONF, "vllm", 2, 0);
  g_autofree char *one_line = new_path("conf");
  const char *targets[][2] = {{"hf", NULL}, {"vllm", "1"}};

  edit_file_metadata(lm_only, "wsync.runtime-drop.language-model-only", NULL);
  edit_file_metadata(full, "wsync.runtime-drop.language-model-only", NULL);
  for (guint i = 0; i < G_N_ELEMENTS(targets); i++) {
    g_autofree char *none = g_strdup_printf(
        "wsync: %s: rank 0's files hold none of the %" G_GUINT64_FORMAT " tensors of the "
        "blocks that language-model-only switches off (visual.patch_embed.proj.weight, ",
        lm_only, vision_tensors());
    g_autofree char *all = g_strdup_printf(
        "wsync: %s: rank 0's files hold all of the %" G_GUINT64_FORMAT " tensors of the "
        "blocks that language-model-only switches off (visual.patch_embed.proj.weight, ",
        full, vision_tensors());
    Run r = run_wsync("plan", lm_only, "--conf-dir", CONF, "--plugin-dir", plugin_dir(),
                      "--target", targets[i][0], targets[i][1] ? "--tp" : NULL, targets[i][1],
                      NULL);
    g_assert_cmpint(r.status, ==, 2);
    g_assert_true(g_str_has_prefix(r.err, none));
    assert_has(r.err, ") and do not record wsync.runtime-drop.language-model-only (an earlier "
                      "wsync wrote them): they were written with language-model-only = true, "
                      "and conf.d sets false; to read them, set in conf.d: plugin "
                      "\"qwen3_5_moe\" { language-model-only = true }\n");
    g_assert_cmpuint(count_lines(r.err), ==, 1);
    test_run_clear(&r);

    r = run_wsync("plan", full, "--conf-dir", conf_dir(TRUE), "--plugin-dir", plugin_dir(),
                  "--target", targets[i][0], targets[i][1] ? "--tp" : NULL, targets[i][1], NULL);
    g_assert_cmpint(r.status, ==, 2);
    g_assert_true(g_str_has_prefix(r.err, all));
    assert_has(r.err, "they were written with language-model-only = false, and conf.d sets "
                      "true; to read them, set in conf.d: plugin \"qwen3_5_moe\" { "
                      "language-model-only = false }\n");
    test_run_clear(&r);
  }

  /* the setting, as the message spells it, reads them */
  g_assert_cmpint(g_mkdir(one_line, 0755), ==, 0);
  g_free(test_write(one_line, "10-test.conf",
                    "plugin \"hf\" {}\nplugin \"vllm\" {}\nplugin \"npu-ascend\" {}\n"
                    "plugin \"qwen3_5_moe\" { language-model-only = true }\n"));
  Run r = run_wsync("plan", lm_only, "--conf-dir", one_line, "--plugin-dir", plugin_dir(),
                    "--target", "vllm", "--tp", "1", NULL);
  g_assert_cmpint(r.status, ==, 0);
  test_run_clear(&r);

  /* a record that is neither */
  edit_file_metadata(lm_only, "wsync.runtime-drop.language-model-only", "yes");
  r = run_wsync("plan", lm_only, "--conf-dir", CONF, "--plugin-dir", plugin_dir(), "--target",
                "hf", NULL);
  g_assert_cmpint(r.status, ==, 3);
  assert_has(r.err, "metadata wsync.runtime-drop.language-model-only is \"yes\", not \"true\" "
                    "or \"false\"\n");
  test_run_clear(&r);
}

/* Reading @dst back to "hf" with the default options fails: exit 3, one line holding
 * @want, no output. */
static void
assert_read_back_refused(const char *dst, const char *want)
{
  g_autofree char *back = new_path("refused");
  Run r = run_wsync("convert", dst, back, "--conf-dir", CONF, "--plugin-dir", plugin_dir(),
                    "--target", "hf", NULL);

  g_autofree char *file = g_strdup_printf("wsync: %s/", dst);

  g_assert_cmpint(r.status, ==, 3);
  assert_has(r.err, want);
  g_assert_cmpuint(count_lines(r.err), ==, 1);
  g_assert_true(g_str_has_prefix(r.err, file)); /* it names the file */
  g_assert_false(g_file_test(back, G_FILE_TEST_EXISTS));
  test_run_clear(&r);
}

/* vllm-ascend rank files read back by what they record, with the default options
 * (enable-shared-expert-dp false): the TP-sliced and the whole shared expert both give
 * the checkpoint back.  Files of the wsync before the option record all2all-backend but
 * not enable-shared-expert-dp, and were written by vLLM's rule (here: whole); without the
 * record the whole files read back so, and TP-sliced ones are refused.  A record other
 * than true or false is refused. */
static void
test_round_trip_ascend_shared_expert(void)
{
  static const guint64 counts4[] = {2, 2, 2, 2};
  const char *config = variant(MOE, "nomtp");
  g_autofree char *sliced = run_case(&(Case){config, NULL, FALSE, 2, 4, FALSE, counts4, NULL, 0,
                                             NULL, "vllm-ascend", FALSE});
  g_autofree char *whole = run_case(&(Case){config, NULL, FALSE, 2, 4, FALSE, counts4, NULL, 0,
                                            NULL, "vllm-ascend", TRUE});
  const char *dirs[] = {sliced, whole};
  guint widened;

  for (guint i = 0; i < G_N_ELEMENTS(dirs); i++) {
    g_autofree char *back = convert(dirs[i], CONF, "hf", 0, 0);
    assert_read_back(synth(config, FALSE), back, &widened);
  }
  edit_file_metadata(whole, "wsync.enable-shared-expert-dp", NULL);
  {
    g_autofree char *back = convert(whole, CONF, "hf", 0, 0);
    assert_read_back(synth(config, FALSE), back, &widened);
  }
  edit_file_metadata(sliced, "wsync.enable-shared-expert-dp", "yes");
  assert_read_back_refused(sliced, "metadata wsync.enable-shared-expert-dp is \"yes\", not "
                                   "\"true\" or \"false\"");
  edit_file_metadata(sliced, "wsync.enable-shared-expert-dp", NULL);
  assert_read_back_refused(sliced, "-part-0.safetensors: tensor \"language_model.model.layers.0."
                                   "mlp.experts._shared_experts._layer.gate_up_proj.weight\" has "
                                   "shape [32, 64] but the config says [64, 64]");
}

/* mm-encoder-tp-mode = "data" (vLLM's --mm-encoder-tp-mode data builds the vision tower
 * with disable_tp, docs/vllm.md §9.5): every rank holds the tower whole, qkv in the
 * checkpoint's [q; k; v] order, while the text model stays TP-sliced; the files record
 * it and read back by the record with the default options.  Without the record they
 * read as TP-sliced files, whose tower has the wrong shape; a record other than weights
 * or data is refused. */
static void
test_round_trip_encoder_data(void)
{
  const char *config = variant(MOE, "nomtp");
  const char *src = synth(config, FALSE);
  g_autofree char *dst =
      convert(src, conf_dir_with(FALSE, "  mm-encoder-tp-mode = \"data\"\n"), "vllm", 2, 0);
  g_autoptr(WsyncCheckpoint) in = open_ck(src);
  const WsyncTensor *hf_qkv = wsync_checkpoint_lookup(in, "model.visual.blocks.0.attn.qkv.weight");
  RankFiles ranks[2];
  guint widened;

  g_assert_nonnull(hf_qkv);
  g_assert_cmpuint(open_ranks_of(dst, "sharded-state", ranks, 2), ==, 2);
  for (guint r = 0; r < 2; r++) {
    const WsyncTensor *qkv = rank_lookup(&ranks[r], "visual.blocks.0.attn.qkv.weight");
    const WsyncTensor *fc2 = rank_lookup(&ranks[r], "visual.merger.linear_fc2.weight");
    const WsyncTensor *o_proj =
        rank_lookup(&ranks[r], "language_model.model.layers.3.self_attn.o_proj.weight");
    assert_metadata(&ranks[r], "wsync.mm-encoder-tp-mode", "data");
    g_assert_nonnull(qkv);
    g_assert_nonnull(fc2);
    g_assert_nonnull(o_proj);
    /* the whole fused tensor, byte for byte */
    g_assert_cmpuint(qkv->shape[0], ==, hf_qkv->shape[0]);
    g_assert_cmpuint(qkv->shape[1], ==, hf_qkv->shape[1]);
    g_assert_cmpmem(qkv->data, qkv->nbytes, hf_qkv->data, hf_qkv->nbytes);
    g_assert_cmpuint(fc2->shape[1], ==, 128); /* M = 32 * 2 * 2, not M / 2 */
    g_assert_cmpuint(o_proj->shape[1], ==, 4 * 16 / 2); /* the text model: TP-sliced */
  }
  for (guint r = 0; r < 2; r++)
    rank_files_clear(&ranks[r]);
  {
    g_autofree char *back = convert(dst, CONF, "hf", 0, 0);
    assert_read_back(src, back, &widened);
  }
  edit_file_metadata(dst, "wsync.mm-encoder-tp-mode", "yes");
  assert_read_back_refused(dst, "metadata wsync.mm-encoder-tp-mode is \"yes\", not \"weights\" "
                                "or \"data\"");
  edit_file_metadata(dst, "wsync.mm-encoder-tp-mode", NULL);
  assert_read_back_refused(dst, "but the config says");
}

/* Rank files of a wsync before the deployment options record neither all2all-backend,
 * prefill-context-parallel-size nor enable-shared-expert-dp, and hold the shared expert as
 * its rule had it: whole when ep > tp > 1 (tp 2, ep 4 here, both targets).  They read back
 * by that rule whatever the options say, prefill-context-parallel-size = 4 (which ep 4
 * over tp 2 cannot have) included. */
static void
test_round_trip_legacy_shared_expert(void)
{
  static const guint64 counts4[] = {2, 2, 2, 2};
  static const char *const targets[] = {NULL, "vllm-ascend"};
  const char *config = variant(MOE, "nomtp");
  const char *confs[] = {CONF, conf_dir_with(FALSE, "  prefill-context-parallel-size = 4\n")};
  guint widened;

  for (guint t = 0; t < G_N_ELEMENTS(targets); t++) {
    g_autofree char *dst = run_case(&(Case){config, NULL, FALSE, 2, 4, FALSE, counts4, NULL, 0,
                                            NULL, targets[t], targets[t] != NULL});

    edit_file_metadata(dst, "wsync.all2all-backend", NULL);
    edit_file_metadata(dst, "wsync.prefill-context-parallel-size", NULL);
    edit_file_metadata(dst, "wsync.enable-shared-expert-dp", NULL);
    for (guint c = 0; c < G_N_ELEMENTS(confs); c++) {
      g_autofree char *back = convert(dst, confs[c], "hf", 0, 0);
      assert_read_back(synth(config, FALSE), back, &widened);
    }
  }
}

/* A recorded prefill-context-parallel-size no deployment of the files' ep and tp has
 * (4 with ep 4 over tp 2) is bad input naming the record, not a configuration error. */
static void
test_read_back_pcp_record_refused(void)
{
  static const guint64 counts4[] = {2, 2, 2, 2};
  const char *config = variant(MOE, "nomtp");
  g_autofree char *dst =
      run_case(&(Case){config, NULL, FALSE, 2, 4, FALSE, counts4, NULL, 0, NULL, NULL, FALSE});

  edit_file_metadata(dst, "wsync.prefill-context-parallel-size", "4");
  assert_read_back_refused(dst, "metadata wsync.prefill-context-parallel-size is \"4\", not a "
                                "size that divides ep 4 / tp 2");
}

/* With norm values BF16 holds exactly no cast changes a byte: `wsync verify` agrees
 * the round trip is bit-exact. */
static void
test_round_trip_exact(void)
{
  const char *config = variant(MOE, "nomtp");
  g_autofree char *src = hand_made(synth(config, FALSE), EXACT_INPUT);
  g_autofree char *dst = run_case(&(Case){config, src, FALSE, 2, 0, FALSE, NULL, NULL, 0, NULL, NULL, FALSE});
  g_autofree char *back = convert(dst, CONF, "hf", 0, 0);
  Run r = run_wsync("verify", src, back, "--conf-dir", CONF, "--plugin-dir", plugin_dir(), NULL);

  if (r.status != 0)
    g_error("verify %s %s: exit %d\n%s%s", src, back, r.status, r.out, r.err);
  test_run_clear(&r);
}

/* Rank files have no mtp.* (vLLM skips the block): reading them back to "hf" leaves the
 * MTP tensors out, by the rule that dropped them, and everything else comes back. */
static void
test_round_trip_mtp_omitted(void)
{
  g_autofree char *src = g_strdup(synth(MOE, FALSE));
  g_autofree char *dst = convert(src, CONF, "vllm", 2, 0);
  g_autofree char *back = convert(dst, CONF, "hf", 0, 0);
  GError *error = NULL;
  g_autoptr(WsyncCheckpoint) in = wsync_checkpoint_open(src, &error);
  g_assert_no_error(error);
  g_autoptr(WsyncCheckpoint) out = wsync_checkpoint_open(back, &error);
  g_assert_no_error(error);
  guint mtp = 0;

  for (guint i = 0; i < wsync_checkpoint_n_tensors(in); i++) {
    const WsyncTensor *t = wsync_checkpoint_tensor(in, i);
    const WsyncTensor *o = wsync_checkpoint_lookup(out, t->name);
    if (g_str_has_prefix(t->name, "mtp.")) {
      g_assert_null(o);
      mtp++;
      continue;
    }
    g_assert_nonnull(o);
  }
  g_assert_cmpuint(mtp, >, 0);
  g_assert_cmpuint(wsync_checkpoint_n_tensors(out), ==, wsync_checkpoint_n_tensors(in) - mtp);

  Run r = run_wsync("plan", dst, "--conf-dir", CONF, "--plugin-dir", plugin_dir(), "--target",
                    "hf", NULL);
  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, " omitted mtp.fc.weight (not in the source: vllm-skips-mtp)\n");
  test_run_clear(&r);

  /* convert lists no omitted line: a note says what it left out, once */
  g_autofree char *again = g_strconcat(back, "-again", NULL);
  g_autofree char *note = g_strdup_printf(
      "note: %u tensors of a draft block left out (the first: mtp.fc.weight): the source's "
      "files were written without them, by rule vllm-skips-mtp\n", mtp);
  r = run_wsync("convert", dst, again, "--conf-dir", CONF, "--plugin-dir", plugin_dir(),
                "--target", "hf", NULL);
  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, note);
  g_assert_null(strstr(strstr(r.out, note) + 1, note));
  test_run_clear(&r);
}

/* ------------------------------------------------------------------ tests: published dtypes */

/* The key under which a rank file records the published dtype of layer @l's @suffix. */
static char *
record_key(guint64 l, const char *suffix)
{
  return g_strdup_printf(WSYNC_PUBLISHED_DTYPE_KEY "model.language_model.layers.%" G_GUINT64_FORMAT
                         ".%s", l, suffix);
}

/* @dir's files (a checkpoint) are bit for bit, dtype for dtype, @src's: a BF16 or
 * F32 A_log / norm stays as published. */
static void
assert_same_checkpoint(const char *src, const char *dir)
{
  g_autoptr(WsyncCheckpoint) a_ck = open_ck(src);
  g_autoptr(WsyncCheckpoint) b_ck = open_ck(dir);

  g_assert_cmpuint(wsync_checkpoint_n_tensors(a_ck), ==, wsync_checkpoint_n_tensors(b_ck));
  for (guint i = 0; i < wsync_checkpoint_n_tensors(a_ck); i++) {
    const WsyncTensor *a = wsync_checkpoint_tensor(a_ck, i);
    const WsyncTensor *b = wsync_checkpoint_lookup(b_ck, a->name);
    if (b == NULL)
      g_error("%s lacks %s", dir, a->name);
    if (a->dtype != b->dtype)
      g_error("%s: %s in %s, %s in %s", a->name, wsync_dtype_name(a->dtype), src,
              wsync_dtype_name(b->dtype), dir);
    g_assert_cmpuint(a->ndim, ==, b->ndim);
    g_assert_cmpmem(a->shape, sizeof(guint64) * a->ndim, b->shape, sizeof(guint64) * b->ndim);
    if (memcmp(a->data, b->data, a->nbytes) != 0)
      g_error("%s differs between %s and %s", a->name, src, dir);
  }
}

/* A Qwen3.6-27B-shaped checkpoint (the dense qwen3_5 config) with A_log and
 * linear_attn.norm in BF16: "hf" keeps them BF16, byte for byte; vLLM holds A_log in F32
 * (the BF16 value widened exactly) and the norm in BF16 as read, and every rank file
 * records A_log's published dtype, so reading the ranks back to "hf" gives the
 * checkpoint again, bit-exact; the same through vllm-ascend. */
static void
test_dtype_bf16_kept(void)
{
  const char *config = variant(DENSE, "nomtp");
  Model m = read_model(config);
  g_autofree char *src = hand_made(synth(config, FALSE), BF16_INPUT);
  g_autofree char *hf = convert(src, CONF, "hf", 0, 0);
  static const char *const targets[] = {"vllm", "vllm-ascend"};

  assert_same_checkpoint(src, hf);
  for (guint i = 0; i < G_N_ELEMENTS(targets); i++) {
    g_autofree char *dst = convert(src, CONF, targets[i], 2, 0);
    g_autofree char *back = convert(dst, CONF, "hf", 0, 0);
    RankFiles ranks[2];
    g_assert_cmpuint(open_ranks_of(dst, "sharded-state", ranks, 2), ==, 2);
    for (guint r = 0; r < 2; r++) {
      for (guint64 l = 0; l < m.L; l++) {
        g_autofree char *key = record_key(l, "linear_attn.A_log");
        g_autofree char *norm_key =
            record_key(l, "linear_attn.norm.weight");
        g_autofree char *an = rt_name(l, "linear_attn.A_log");
        g_autofree char *nn = rt_name(l, "linear_attn.norm.weight");
        if (!m.linear[l])
          continue;
        g_assert_cmpint(rank_lookup(&ranks[r], an)->dtype, ==, WSYNC_DTYPE_F32);
        g_assert_cmpint(rank_lookup(&ranks[r], nn)->dtype, ==, WSYNC_DTYPE_BF16);
        assert_metadata(&ranks[r], key, "BF16");
        assert_metadata(&ranks[r], norm_key, NULL);
      }
      rank_files_clear(&ranks[r]);
    }
    assert_same_checkpoint(src, back);
  }
}

/* A Qwen3.5-35B-A3B-shaped checkpoint (synth of the MoE config: A_log and norm F32):
 * "hf" keeps them F32; the rank files record the norm's F32 (vLLM rounds it to BF16) and
 * nothing for A_log (vLLM holds the F32 as read). */
static void
test_dtype_f32_kept(void)
{
  const char *config = variant(MOE, "nomtp");
  const char *src = synth(config, FALSE);
  g_autofree char *hf = convert(src, CONF, "hf", 0, 0);
  g_autofree char *dst = convert(src, CONF, "vllm", 2, 0);
  g_autofree char *key = record_key(0, "linear_attn.A_log");
  g_autofree char *norm_key =
      record_key(0, "linear_attn.norm.weight");
  g_autoptr(WsyncCheckpoint) in = open_ck(src);
  RankFiles ranks[2];
  g_autofree char *a_log = ck_name(0, "linear_attn.A_log");

  g_assert_cmpint(wsync_checkpoint_lookup(in, a_log)->dtype, ==, WSYNC_DTYPE_F32);
  assert_same_checkpoint(src, hf);
  g_assert_cmpuint(open_ranks_of(dst, "sharded-state", ranks, 2), ==, 2);
  for (guint r = 0; r < 2; r++) {
    assert_metadata(&ranks[r], key, NULL);
    assert_metadata(&ranks[r], norm_key, "F32");
    rank_files_clear(&ranks[r]);
  }
}

/* A tp @tp vllm conversion of a BF16 A_log checkpoint (Qwen3.6-27B-shaped: every rank
 * file records A_log's BF16), in files of at most @part_size (NULL: the default, one file
 * per rank).  Returns the conversion's directory. */
static char *
bf16_ranks(guint tp, const char *part_size)
{
  g_autofree char *src = hand_made(synth(variant(DENSE, "nomtp"), FALSE), BF16_INPUT);

  return convert_parts(src, CONF, "vllm", tp, 0, part_size);
}

/* The path of part @part of rank @rank in @dir. */
static char *
rank_file(const char *dir, guint rank, guint part)
{
  g_autofree char *name = g_strdup_printf("model-rank-%u-part-%u.safetensors", rank, part);

  return g_build_filename(dir, name, NULL);
}

/* Replaces, in @file's header, the first @from at or after @anchor (NULL: the header's
 * start) by @to, of the same length, so that the header stays valid JSON of the same
 * size. */
static void
patch_header_after(const char *file, const char *anchor, const char *from, const char *to)
{
  g_autofree char *data = NULL;
  gsize len;
  char *at;

  g_assert_cmpuint(strlen(from), ==, strlen(to));
  g_assert_true(g_file_get_contents(file, &data, &len, NULL));
  /* past the header's 8-byte length, which holds NUL bytes */
  at = g_strstr_len(data + 8, (gssize)len - 8, anchor != NULL ? anchor : from);
  g_assert_nonnull(at);
  at = strstr(at, from);
  g_assert_nonnull(at);
  memcpy(at, to, strlen(to));
  g_assert_true(g_file_set_contents(file, data, (gssize)len, NULL));
}

/* patch_header_after() from layer 0's A_log record key (in the key or in its value, or
 * in a key after it). */
static void
patch_record(const char *file, const char *from, const char *to)
{
  g_autofree char *key = record_key(0, "linear_attn.A_log");

  patch_header_after(file, key, from, to);
}

/* bf16_ranks(@tp) whose rank @rank file has patch_record(@from, @to) applied. */
static char *
patched_record(guint tp, guint rank, const char *from, const char *to)
{
  char *dst = bf16_ranks(tp, NULL);
  g_autofree char *file = rank_file(dst, rank, 0);

  patch_record(file, from, to);
  return dst;
}

/* Converting @dst to @target is refused: exit 3, @fragment on stderr, nothing written. */
static void
assert_convert_refused(const char *dst, const char *target, const char *fragment)
{
  g_autofree char *back = new_path("refused");
  Run r = run_wsync("convert", dst, back, "--conf-dir", CONF, "--plugin-dir", plugin_dir(),
                    "--target", target, NULL);

  g_assert_cmpint(r.status, ==, 3);
  assert_has(r.err, fragment);
  g_assert_false(g_file_test(back, G_FILE_TEST_EXISTS));
  test_run_clear(&r);
}

/* A rank file that records a published dtype that is no dtype is refused: exit 3, one
 * line naming the file, the tensor and the value. */
static void
test_dtype_record_refused(void)
{
  g_autofree char *dst = patched_record(1, 0, "BF16", "BX16");

  assert_convert_refused(dst, "hf",
                         "model-rank-0-part-0.safetensors: tensor "
                         "\"language_model.model.layers.0.linear_attn.A_log\": metadata "
                         "wsync.published-dtype.model.language_model.layers.0.linear_attn.A_log "
                         "is \"BX16\", not a dtype");
}

/* Ranks that disagree on a published dtype are refused where the second is read: here
 * rank 1's files lose their record (its key renamed), so its F32 A_log says F32 while
 * rank 0 records BF16. */
static void
test_dtype_records_disagree(void)
{
  g_autofree char *dst = patched_record(2, 1, "published-dtype.", "published-dtypX.");

  assert_convert_refused(dst, "hf",
                         "model-rank-1-part-0.safetensors: tensor "
                         "\"language_model.model.layers.0.linear_attn.A_log\" holds F32 and "
                         "records no published dtype of "
                         "model.language_model.layers.0.linear_attn.A_log, but other parts make "
                         "it BF16\n");
}

/* A rank file that records a published dtype no float it holds converts to (BOOL) is
 * refused where it is read, whatever the target: exit 3, one line naming the file and the
 * record; nothing is written, and the record is not carried into new rank files (it was
 * written again by vllm -> vllm, and vllm -> hf failed at resolve with a line that named
 * neither the file nor the record). */
static void
test_dtype_record_not_float(void)
{
  g_autofree char *dst = patched_record(1, 0, "BF16", "BOOL");
  static const char *const targets[] = {"hf", "vllm"};

  for (guint i = 0; i < G_N_ELEMENTS(targets); i++)
    assert_convert_refused(dst, targets[i],
                           "model-rank-0-part-0.safetensors: tensor "
                           "\"language_model.model.layers.0.linear_attn.A_log\": metadata "
                           "wsync.published-dtype.model.language_model.layers.0.linear_attn."
                           "A_log is \"BOOL\"");
}

/* ------------------------------------------------------------------ tests: records seen and compared */

static gint
compare_lines(gconstpointer a, gconstpointer b)
{
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* What `wsync inspect` prints of bf16_ranks(2)'s rank @rank file in @dir: the vllm
 * stamps and one A_log record per linear-attention layer of @m, in key order.  @n_keys:
 * how many keys. */
static char *
metadata_block(const char *dir, guint rank, const Model *m, guint *n_keys)
{
  g_autoptr(GPtrArray) lines = g_ptr_array_new_with_free_func(g_free);
  g_autofree char *file = rank_file(dir, rank, 0);
  GString *block = g_string_new(NULL);
  static const char *const stamps[] = {
      "format=pt", "wsync.attn-scales=true", "wsync.ep=1", "wsync.format=sharded-state",
      "wsync.target=vllm", "wsync.tp=2", "wsync.vllm-era=D", "wsync.vllm-version=latest",
      "wsync.world=2"};

  for (guint i = 0; i < G_N_ELEMENTS(stamps); i++)
    g_ptr_array_add(lines, g_strdup_printf("  %s\n", stamps[i]));
  g_ptr_array_add(lines, g_strdup_printf("  wsync.rank=%u\n", rank));
  /* a model with a vision tower: whether the files hold it (they do, by conf.d's default) */
  if (m->vision)
    g_ptr_array_add(lines, g_strdup("  wsync.runtime-drop.language-model-only=false\n"));
  for (guint64 l = 0; l < m->L; l++) {
    if (!m->linear[l])
      continue;
    g_autofree char *key = record_key(l, "linear_attn.A_log");
    g_ptr_array_add(lines, g_strdup_printf("  %s=BF16\n", key));
  }
  g_ptr_array_sort(lines, compare_lines);
  g_string_append_printf(block, "metadata of %s:\n", file);
  for (guint i = 0; i < lines->len; i++)
    g_string_append(block, lines->pdata[i]);
  *n_keys = lines->len;
  return g_string_free(block, FALSE);
}

/* `wsync inspect` shows a rank file's records: the text lists every file's metadata
 * after the totals, key by key in key order; --json has it under "metadata", by file. */
static void
test_records_inspect(void)
{
  Model m = read_model(variant(DENSE, "nomtp"));
  g_autofree char *dst = bf16_ranks(2, NULL);
  g_autofree char *key0 = record_key(0, "linear_attn.A_log");
  guint n_keys;
  g_autofree char *block0 = metadata_block(dst, 0, &m, &n_keys);
  g_autofree char *block1 = metadata_block(dst, 1, &m, &n_keys);
  g_autofree char *tail = g_strconcat(" bytes in 2 files\n", block0, block1, NULL);
  GError *error = NULL;

  g_assert_cmpuint(n_keys, >, 11); /* the stamps and two records at least */
  Run r = run_wsync("inspect", dst, "--conf-dir", CONF, "--plugin-dir", plugin_dir(), NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.err, ==, "");
  if (!g_str_has_suffix(r.out, tail))
    g_error("inspect %s ends:\n%s\nnot:\n%s", dst, r.out + MAX(0, (gssize)strlen(r.out) - (gssize)strlen(tail)), tail);
  g_assert_true(g_str_has_prefix(r.out, "NAME "));
  test_run_clear(&r);

  r = run_wsync("--json", "inspect", dst, "--conf-dir", CONF, "--plugin-dir", plugin_dir(), NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_autoptr(JsonParser) parser = json_parser_new();
  json_parser_load_from_data(parser, r.out, -1, &error);
  g_assert_no_error(error);
  JsonObject *metadata =
      json_object_get_object_member(json_node_get_object(json_parser_get_root(parser)), "metadata");
  g_assert_cmpuint(json_object_get_size(metadata), ==, 2);
  for (guint rank = 0; rank < 2; rank++) {
    g_autofree char *file = rank_file(dst, rank, 0);
    g_autofree char *rank_text = g_strdup_printf("%u", rank);
    JsonObject *md = json_object_get_object_member(metadata, file);
    g_assert_nonnull(md);
    g_assert_cmpuint(json_object_get_size(md), ==, n_keys);
    g_assert_cmpstr(json_object_get_string_member(md, key0), ==, "BF16");
    g_assert_cmpstr(json_object_get_string_member(md, "wsync.rank"), ==, rank_text);
    g_assert_cmpstr(json_object_get_string_member(md, "format"), ==, "pt");
  }
  test_run_clear(&r);
}

/* `wsync verify A B` on rank files, with its whole output and exit status. */
static void
expect_verify(const char *a, const char *b, int status, const char *out)
{
  Run r = run_wsync("verify", a, b, "--conf-dir", CONF, "--plugin-dir", plugin_dir(), NULL);

  g_assert_cmpstr(r.out, ==, out);
  g_assert_cmpstr(r.err, ==, "");
  g_assert_cmpint(r.status, ==, status);
  test_run_clear(&r);
}

/* Two sets of rank files with the same tensors, byte for byte, that read back to
 * different dtypes (one records A_log as BF16, the other as F32) differ: exit 1, one
 * line naming the key, both values and both files; in --json a "metadata" difference. */
static void
test_records_verify_differ(void)
{
  g_autofree char *a = bf16_ranks(2, NULL);
  g_autofree char *b = patched_record(2, 0, "BF16\"", "F32\" ");
  g_autofree char *key = record_key(0, "linear_attn.A_log");
  g_autofree char *fa = rank_file(a, 0, 0);
  g_autofree char *fb = rank_file(b, 0, 0);
  g_autofree char *line = g_strdup_printf("differ: metadata \"%s\": \"BF16\" in A (%s), \"F32\" in B (%s)\n",
                                          key, fa, fb);
  GError *error = NULL;

  expect_verify(a, b, 1, line);

  Run r = run_wsync("--json", "verify", a, b, "--conf-dir", CONF, "--plugin-dir", plugin_dir(),
                    NULL);
  g_assert_cmpint(r.status, ==, 1);
  g_assert_cmpstr(r.err, ==, "");
  g_autoptr(JsonParser) parser = json_parser_new();
  json_parser_load_from_data(parser, r.out, -1, &error);
  g_assert_no_error(error);
  JsonObject *root = json_node_get_object(json_parser_get_root(parser));
  g_assert_false(json_object_get_boolean_member(root, "equal"));
  g_assert_cmpint(json_object_get_int_member(root, "tensors"), ==, 0);
  JsonObject *diff = json_object_get_object_member(root, "difference");
  g_assert_cmpstr(json_object_get_string_member(diff, "kind"), ==, "metadata");
  g_assert_true(json_object_get_null_member(diff, "tensor"));
  g_assert_true(json_object_get_null_member(diff, "element"));
  g_assert_cmpstr(json_object_get_string_member(diff, "key"), ==, key);
  g_assert_cmpstr(json_object_get_string_member(diff, "file_a"), ==, fa);
  g_assert_cmpstr(json_object_get_string_member(diff, "value_a"), ==, "BF16");
  g_assert_cmpstr(json_object_get_string_member(diff, "file_b"), ==, fb);
  g_assert_cmpstr(json_object_get_string_member(diff, "value_b"), ==, "F32");
  test_run_clear(&r);
}

/* A record one side has and the other lacks (rank 1's key renamed) differs, either way
 * round; in --json the absent value is null. */
static void
test_records_verify_one_side(void)
{
  g_autofree char *a = bf16_ranks(2, NULL);
  g_autofree char *b = patched_record(2, 1, "published-dtype.", "published-dtypX.");
  g_autofree char *key = record_key(0, "linear_attn.A_log");
  g_autofree char *fa = rank_file(a, 1, 0);
  g_autofree char *fb = rank_file(b, 1, 0);
  g_autofree char *ab = g_strdup_printf("differ: metadata \"%s\": \"BF16\" in A (%s), absent in B (%s)\n",
                                        key, fa, fb);
  g_autofree char *ba = g_strdup_printf("differ: metadata \"%s\": absent in A (%s), \"BF16\" in B (%s)\n",
                                        key, fb, fa);
  GError *error = NULL;

  expect_verify(a, b, 1, ab);
  expect_verify(b, a, 1, ba);

  Run r = run_wsync("--json", "verify", b, a, "--conf-dir", CONF, "--plugin-dir", plugin_dir(),
                    NULL);
  g_assert_cmpint(r.status, ==, 1);
  g_autoptr(JsonParser) parser = json_parser_new();
  json_parser_load_from_data(parser, r.out, -1, &error);
  g_assert_no_error(error);
  JsonObject *diff = json_object_get_object_member(
      json_node_get_object(json_parser_get_root(parser)), "difference");
  g_assert_cmpstr(json_object_get_string_member(diff, "kind"), ==, "metadata");
  g_assert_true(json_object_get_null_member(diff, "value_a"));
  g_assert_cmpstr(json_object_get_string_member(diff, "value_b"), ==, "BF16");
  test_run_clear(&r);
}

/* Equal records are equal, split into other parts or not; other metadata (a version
 * stamp) is not compared. */
static void
test_records_verify_equal(void)
{
  g_autofree char *a = bf16_ranks(2, NULL);
  g_autofree char *b = bf16_ranks(2, "64K");
  g_autofree char *c = patched_record(2, 0, "latest", "lateXt");
  g_autofree char *last_part = rank_file(b, 1, 2);
  /* every tensor of both ranks, compared and equal */
  Run r = run_wsync("--json", "inspect", a, "--conf-dir", CONF, "--plugin-dir", plugin_dir(),
                    NULL);
  g_autoptr(JsonParser) parser = json_parser_new();
  GError *error = NULL;
  g_assert_cmpint(r.status, ==, 0);
  json_parser_load_from_data(parser, r.out, -1, &error);
  g_assert_no_error(error);
  JsonObject *root = json_node_get_object(json_parser_get_root(parser));
  g_autofree char *equal = g_strdup_printf(
      "equal: %" G_GINT64_FORMAT " tensors, %" G_GINT64_FORMAT " bytes\n",
      json_object_get_int_member(root, "total_tensors"),
      json_object_get_int_member(root, "total_bytes"));
  test_run_clear(&r);

  g_assert_true(g_file_test(last_part, G_FILE_TEST_EXISTS));
  expect_verify(a, a, 0, equal);
  expect_verify(a, b, 0, equal);
  expect_verify(b, a, 0, equal);
  expect_verify(a, c, 0, equal);
}

/* A rank whose files disagree on a record is refused on read-back (it was read with its
 * first file's): exit 3, one line naming both files, the key and both values. */
static void
test_records_rank_files_disagree(void)
{
  g_autofree char *key = record_key(0, "linear_attn.A_log");
  g_autofree char *dst = bf16_ranks(2, "64K");
  g_autofree char *part0 = rank_file(dst, 0, 0);
  g_autofree char *part1 = rank_file(dst, 0, 1);

  patch_record(part1, "BF16\"", "F32\" ");
  g_autofree char *expect = g_strdup_printf(
      "wsync: %s: metadata %s is \"F32\", but \"BF16\" in %s, another file of rank 0: they "
      "must record the same published dtypes\n",
      part1, key, part0);
  assert_convert_refused(dst, "hf", expect);

  /* a record that a later file of rank 1 lacks */
  g_autofree char *dst2 = bf16_ranks(2, "64K");
  g_autofree char *r1p0 = rank_file(dst2, 1, 0);
  g_autofree char *r1p2 = rank_file(dst2, 1, 2);
  patch_record(r1p2, "published-dtype.", "published-dtypX.");
  g_autofree char *expect2 = g_strdup_printf(
      "wsync: %s: metadata %s is absent, but \"BF16\" in %s, another file of rank 1: they "
      "must record the same published dtypes\n",
      r1p2, key, r1p0);
  assert_convert_refused(dst2, "hf", expect2);
}

/* Rank files of tp 2 whose part @part of rank @rank has patch_header_after(NULL, @from, @to) applied
 * are refused on read-back: "FILE: metadata @key @values in FIRST, another file of rank
 * @rank: they must record the same value, which the vllm target reads". */
static void
assert_part_disagrees(guint rank, guint part, const char *from, const char *to,
                      const char *key, const char *values)
{
  g_autofree char *dst = bf16_ranks(2, "64K");
  g_autofree char *first = rank_file(dst, rank, 0);
  g_autofree char *patched = rank_file(dst, rank, part);
  patch_header_after(patched, NULL, from, to);
  g_autofree char *expect = g_strdup_printf(
      "wsync: %s: metadata %s %s in %s, another file of rank %u: they must record the same "
      "value, which the vllm target reads\n",
      patched, key, values, first, rank);
  assert_convert_refused(dst, "hf", expect);
}

/* The vllm target reads a rank's deployment records (naming era, release, ...) from its
 * first file: a later file of the rank that records another value, or none, is refused
 * (exit 3, both files, the key and both values), not read as the first file says.  A key
 * the target does not read may differ. */
static void
test_records_deployment_disagrees(void)
{
  assert_part_disagrees(0, 2, "\"wsync.vllm-era\":\"D\"", "\"wsync.vllm-era\":\"C\"",
                        "wsync.vllm-era", "is \"C\", but \"D\"");
  assert_part_disagrees(1, 1, "\"wsync.vllm-version\"", "\"wsync.vllm-versioX\"",
                        "wsync.vllm-version", "is absent, but \"latest\"");

  /* "format" is the safetensors writer's, which no target reads */
  g_autofree char *dst = bf16_ranks(2, "64K");
  g_autofree char *part1 = rank_file(dst, 0, 1);
  patch_header_after(part1, NULL, "\"format\":\"pt\"", "\"format\":\"px\"");
  g_autofree char *back = convert(dst, CONF, "hf", 0, 0);
  g_assert_true(g_file_test(back, G_FILE_TEST_IS_DIR));
}

/* A recorded attn-scales that is neither "true" nor "false" is refused (exit 3, the file
 * and the value), not read as false. */
static void
test_records_attn_scales_refused(void)
{
  g_autofree char *dst = bf16_ranks(1, NULL);
  g_autofree char *file = rank_file(dst, 0, 0);

  patch_header_after(file, NULL, "\"wsync.attn-scales\":\"true\"",
                     "\"wsync.attn-scales\":\"yes!\"");
  g_autofree char *expect = g_strdup_printf(
      "wsync: %s: metadata wsync.attn-scales is \"yes!\", not \"true\" or \"false\"\n", file);
  assert_convert_refused(dst, "hf", expect);
}

/* ------------------------------------------------------------------ tests: the plan */

static void
test_plan_text(void)
{
  Run r = run_wsync("plan", synth(MOE, FALSE), "--conf-dir", CONF, "--plugin-dir", plugin_dir(),
                    "--target", "vllm", "--tp", "2", NULL);

  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, "note: linear_attn.A_log of every linear-attention layer: vLLM holds A_log "
                    "in float32 (vLLM #37810), as read\n");
  assert_has(r.out, "note: linear_attn.norm.weight of every linear-attention layer: vLLM's "
                    "RMSNormGated is created in the model dtype: the F32 value is rounded to "
                    "BF16 to nearest-even, as torch's copy_ does\n");
  /* said once, not per layer */
  g_assert_null(strstr(r.out, "note: model.language_model.layers."));
  assert_has(r.out, "note: 3 tensors cast F32->BF16, rounded to nearest even (the first: "
                    "model.language_model.layers.0.linear_attn.norm.weight): the vllm layout "
                    "holds them in BF16\n");
  assert_has(r.out, "dropped mtp.fc.weight by rule vllm-skips-mtp");
  assert_has(r.out, "dropped mtp.layers.0.mlp.experts.gate by rule vllm-skips-mtp");
  assert_has(r.out, "dropped mtp.layers.0.mlp.experts.down by rule vllm-skips-mtp");
  assert_has(r.out, "<- model.language_model.layers.0.linear_attn.norm.weight[0:16] cast "
                    "F32->BF16");
  assert_has(r.out, "<- model.language_model.layers.3.self_attn.q_proj.weight[64:128, 0:64]");
  /* nothing dropped by the switch, and the rank files record it off */
  g_assert_null(strstr(r.out, "by rule language-model-only"));
  assert_has(r.out, " wsync.runtime-drop.language-model-only=false ");
  test_run_clear(&r);

  r = run_wsync("plan", synth(MOE, FALSE), "--conf-dir", conf_dir(TRUE), "--plugin-dir",
                plugin_dir(), "--target", "vllm", "--tp", "2", NULL);
  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, "dropped model.visual.blocks.0.attn.qkv.weight by rule language-model-only");
  assert_has(r.out, "dropped model.visual.patch_embed.proj.weight by rule language-model-only");
  assert_has(r.out, " wsync.runtime-drop.language-model-only=true ");
  g_assert_null(strstr(r.out, "  visual."));
  test_run_clear(&r);
}

/* The JSON plan carries the same: notes, dropped params with their rules, casts. */
static void
test_plan_json(void)
{
  g_autofree char *src = hand_made(synth(variant(MOE, "nomtp"), FALSE), CAST_INPUT);
  Run r = run_wsync("plan", synth(MOE, FALSE), "--conf-dir", conf_dir(TRUE), "--plugin-dir",
                    plugin_dir(), "--target", "vllm", "--tp", "2", "--json", NULL);
  g_autoptr(JsonParser) parser = json_parser_new();
  GError *error = NULL;

  g_assert_cmpint(r.status, ==, 0);
  json_parser_load_from_data(parser, r.out, -1, &error);
  g_assert_no_error(error);
  assert_has(r.out, "\"rule\" : \"vllm-skips-mtp\"");
  assert_has(r.out, "\"rule\" : \"language-model-only\"");
  assert_has(r.out, "\"cast\" : \"F32->BF16\"");
  assert_has(r.out, "vLLM holds A_log in float32 (vLLM #37810)");
  test_run_clear(&r);
  /* a BF16 A_log is widened */
  r = run_wsync("plan", src, "--conf-dir", CONF, "--plugin-dir", plugin_dir(), "--target", "vllm",
                "--tp", "2", NULL);
  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, "<- model.language_model.layers.0.linear_attn.A_log[4:8] cast BF16->F32");
  assert_has(r.out, "note: linear_attn.A_log of every linear-attention layer: vLLM holds A_log "
                    "in float32 (vLLM #37810): the BF16 value is widened exactly");
  test_run_clear(&r);
}

/* convert says what the plan's notes say, after the bytes it wrote: how to load the
 * files, the naming era, the rounded tensors; -q says nothing.  The JSON report of both
 * carries them already (test_plan_json). */
static void
test_convert_notes(void)
{
  const char *src = synth(MOE, FALSE);
  g_autofree char *dst = new_path("noted");
  Run plan = run_wsync("plan", src, "--conf-dir", CONF, "--plugin-dir", plugin_dir(),
                       "--target", "vllm", "--tp", "2", NULL);
  g_autoptr(GString) notes = g_string_new(NULL);
  g_auto(GStrv) lines = NULL;

  g_assert_cmpint(plan.status, ==, 0);
  lines = g_strsplit(plan.out, "\n", -1);
  for (guint i = 0; lines[i] != NULL; i++)
    if (g_str_has_prefix(lines[i], "note: "))
      g_string_append_printf(notes, "%s\n", lines[i]);
  test_run_clear(&plan);
  g_assert_cmpstr(notes->str, !=, "");

  Run r = run_wsync("convert", src, dst, "--conf-dir", CONF, "--plugin-dir", plugin_dir(),
                    "--target", "vllm", "--tp", "2", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_autofree char *wrote = g_strdup_printf("wrote %s: 868080 bytes\n", dst);
  g_autofree char *want = g_strconcat(wrote, notes->str, NULL);
  g_assert_cmpstr(r.out, ==, want);
  assert_has(r.out, "note: format sharded-state: load with `vllm serve DIR --load-format "
                    "sharded_state --tensor-parallel-size 2`\n");
  assert_has(r.out, "note: 3 tensors cast F32->BF16, rounded to nearest even");
  test_run_clear(&r);

  r = run_wsync("convert", src, dst, "--conf-dir", CONF, "--plugin-dir", plugin_dir(),
                "--target", "vllm", "--tp", "2", "-q", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.out, ==, "");
  test_run_clear(&r);

  /* back to "hf": A_log and the norms return to F32 exactly, nothing is rounded */
  g_autofree char *back = new_path("noted-back");
  r = run_wsync("convert", dst, back, "--conf-dir", CONF, "--plugin-dir", plugin_dir(),
                "--target", "hf", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_null(strstr(r.out, "rounded"));
  test_run_clear(&r);
}

/* ------------------------------------------------------------------ tests: refusals */

/* nk 2 key heads cannot be split over tp 4: exit 2, one line naming the tensor and the
 * numbers, no DST; plan refuses the same way. */
static void
test_refuse_key_heads(void)
{
  const char *src = synth("tiny-qwen3.5-moe-nk2.json", FALSE);
  g_autofree char *dst = new_path("refused");
  const char *want = "tp 4 does not divide the 2 units of 16 rows (32 rows in all) of "
                     "model.language_model.layers.0.linear_attn.in_proj_qkv.weight";
  Run r = run_wsync("convert", src, dst, "--conf-dir", CONF, "--plugin-dir", plugin_dir(),
                    "--target", "vllm", "--tp", "4", NULL);

  g_assert_cmpint(r.status, ==, 2);
  assert_has(r.err, want);
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
  test_run_clear(&r);
  r = run_wsync("plan", src, "--conf-dir", CONF, "--plugin-dir", plugin_dir(), "--target", "vllm",
                "--tp", "4", NULL);
  g_assert_cmpint(r.status, ==, 2);
  assert_has(r.err, want);
  test_run_clear(&r);
  /* tp 2 divides it */
  check_case(&(Case){"tiny-qwen3.5-moe-nk2.json", NULL, FALSE, 2, 0, FALSE, NULL, NULL, 0, NULL, NULL, FALSE});
}

/* A split that would cut a head is refused, naming the tensor: a gated q head is 2*hd
 * rows (4 heads cannot go to 8 ranks, though 8 query halves could), and a vision head
 * is D/heads rows of each third of attn.qkv (docs/vllm.md §9.5: tp must divide the
 * heads). */
static void
assert_refused(const char *src, const char *tp, const char *want)
{
  g_autofree char *dst = new_path("refused");
  Run r = run_wsync("convert", src, dst, "--conf-dir", CONF, "--plugin-dir", plugin_dir(),
                    "--target", "vllm", "--tp", tp, NULL);

  g_assert_cmpint(r.status, ==, 2);
  assert_has(r.err, want);
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
  test_run_clear(&r);
}

static void
test_refuse_heads(void)
{
  assert_refused(synth(variant(MOE, "fullfirst"), FALSE), "8",
                 "tp 8 does not divide the 4 units of 32 rows (128 rows in all) of "
                 "model.language_model.layers.0.self_attn.q_proj.weight");
  assert_refused(synth(variant(MOE, "vheads2"), FALSE), "4",
                 "tp 4 does not divide the 2 units of 16 rows (32 rows in all) of "
                 "model.visual.blocks.0.attn.qkv.weight");
  /* the text model alone divides by 4 */
  check_case(&(Case){variant(MOE, "vheads2"), NULL, FALSE, 4, 0, TRUE, NULL, NULL, 0, NULL, NULL, FALSE});
}

/* A config that contradicts itself: exit 3, the config's path and the field. */
static void
assert_config_refused(const char *edit_key, const char *json_value, const char *message)
{
  g_autofree char *base = config_path(MOE);
  g_autoptr(JsonNode) root = load_json(base);
  JsonObject *o = json_node_get_object(root);
  g_autofree char *path = new_path("badconfig");
  g_autofree char *dst = new_path("refused");
  g_auto(GStrv) keys = g_strsplit(edit_key, ".", 2);
  JsonObject *target = keys[1] != NULL ? json_object_get_object_member(o, keys[0]) : o;
  const char *key = keys[1] != NULL ? keys[1] : keys[0];
  Run r;

  if (json_value == NULL)
    json_object_remove_member(target, key);
  else {
    g_autoptr(JsonParser) p = json_parser_new();
    g_assert_true(json_parser_load_from_data(p, json_value, -1, NULL));
    json_object_set_member(target, key, json_node_copy(json_parser_get_root(p)));
  }
  save_json(root, path);
  r = run_wsync("synth", "--conf-dir", CONF, "--plugin-dir", plugin_dir(), "--config", path, dst,
                NULL);
  g_assert_cmpint(r.status, ==, 3);
  assert_has(r.err, path);
  assert_has(r.err, message);
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
  test_run_clear(&r);
}

/* text_config.hidden_act other than "silu": Transformers runs it (ACT2FN), so synth
 * writes the checkpoint; vLLM's Qwen3.5 shared expert (dense: its MLP), Qwen2MoeMLP,
 * raises "Unsupported activation" (qwen2_moe.py:103-106 @ df1376907b16, docs/vllm.md §2
 * "Activation"), so plan --target vllm refuses it: exit 3, config.json, the field, the
 * value and "silu".  The old tree planned (and wrote) rank files vLLM would not start
 * from. */
static void
test_refuse_hidden_act(void)
{
  static const char *const bases[] = {MOE, DENSE};

  for (guint i = 0; i < G_N_ELEMENTS(bases); i++) {
    g_autofree char *base = config_path(bases[i]);
    g_autoptr(JsonNode) root = load_json(base);
    JsonObject *text = json_object_get_object_member(json_node_get_object(root), "text_config");
    g_autofree char *dir = new_path("gelu");
    g_autofree char *config = new_path("gelu-config.json");
    g_autofree char *arch = g_strdup_printf(
        "but vLLM's %s accepts only \"silu\"",
        i == 0 ? "Qwen3_5MoeForConditionalGeneration" : "Qwen3_5ForConditionalGeneration");
    Run r;

    json_object_set_string_member(text, "hidden_act", "gelu_pytorch_tanh");
    save_json(root, config);
    r = run_wsync("synth", "--conf-dir", CONF, "--plugin-dir", plugin_dir(), "--config", config,
                  dir, NULL);
    g_assert_cmpint(r.status, ==, 0);
    test_run_clear(&r);
    r = run_wsync("plan", "--conf-dir", CONF, "--plugin-dir", plugin_dir(), dir, "--target",
                  "vllm", "--tp", "2", NULL);
    g_assert_cmpint(r.status, ==, 3);
    assert_has(r.err,
               "config.json: field \"text_config.hidden_act\" is \"gelu_pytorch_tanh\", ");
    assert_has(r.err, arch);
    test_run_clear(&r);
  }
}

/* q/k/v/o biases.  Transformers' Qwen3.5 attention gives all four projections a bias by
 * attention_bias and does not read qkv_bias; vLLM's gives qkv_proj one by qkv_bias and
 * o_proj none (qwen3_next.py:252, 260 @ df1376907b16, docs/vllm.md §9.2).  synth and the
 * hf target follow Transformers: with attention_bias the four biases are written and read
 * back; the vllm target refuses either field true in both formats (exit 3, the field and
 * what vLLM does), writing nothing.  The old tree ignored both: it wrote no biases for
 * attention_bias (Transformers then initialises them at random) and rank files without
 * the qkv_proj.bias vLLM builds for qkv_bias. */
static void
test_biases(void)
{
  static const struct {
    const char *field, *message;
    gboolean biases; /* Transformers' model has them */
  } cases[] = {
      {"attention_bias",
       "config.json: field \"text_config.attention_bias\" is true: vLLM's "
       "Qwen3_5MoeForConditionalGeneration builds none of the q/k/v_proj and o_proj biases "
       "Transformers' model then has (it reads qkv_bias, and its o_proj has no bias: "
       "vllm/model_executor/models/qwen3_next.py:252, 260), so it would run without the "
       "checkpoint's trained biases; --format ",
       TRUE},
      {"qkv_bias",
       "config.json: field \"text_config.qkv_bias\" is true: vLLM's "
       "Qwen3_5MoeForConditionalGeneration then builds a qkv_proj.bias in every "
       "full-attention layer (vllm/model_executor/models/qwen3_next.py:252), which "
       "Transformers' model does not have and no checkpoint of it holds; --format ",
       FALSE},
  };
  static const char *const biases[] = {"q_proj.bias", "k_proj.bias", "v_proj.bias",
                                       "o_proj.bias"};

  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_autofree char *base = config_path(MOE);
    g_autoptr(JsonNode) root = load_json(base);
    JsonObject *text = json_object_get_object_member(json_node_get_object(root), "text_config");
    g_autofree char *dir = new_path("biases");
    g_autofree char *config = new_path("biases-config.json");
    g_autofree char *back = new_path("biases-hf");
    g_autofree char *ranks = new_path("biases-vllm");
    g_autofree char *index = g_build_filename(dir, "model.safetensors.index.json", NULL);
    g_autofree char *listing = NULL;
    Run r;

    json_object_set_boolean_member(text, cases[i].field, TRUE);
    save_json(root, config);
    r = run_wsync("synth", "--conf-dir", CONF, "--plugin-dir", plugin_dir(), "--config", config,
                  dir, "--pattern", "index", NULL);
    g_assert_cmpint(r.status, ==, 0);
    test_run_clear(&r);
    /* the full-attention layer 3 has the biases exactly when Transformers builds them */
    g_assert_true(g_file_get_contents(index, &listing, NULL, NULL));
    for (guint b = 0; b < G_N_ELEMENTS(biases); b++) {
      g_autofree char *name =
          g_strdup_printf("\"model.language_model.layers.3.self_attn.%s\"", biases[b]);
      g_assert_cmpint(strstr(listing, name) != NULL, ==, cases[i].biases);
    }
    r = run_wsync("convert", "--conf-dir", CONF, "--plugin-dir", plugin_dir(), dir, back,
                  "--target", "hf", NULL);
    g_assert_cmpint(r.status, ==, 0);
    test_run_clear(&r);
    r = run_wsync("verify", "--conf-dir", CONF, "--plugin-dir", plugin_dir(), dir, back, NULL);
    g_assert_cmpint(r.status, ==, 0);
    test_run_clear(&r);
    for (guint kernel = 0; kernel < 2; kernel++) {
      r = run_wsync("convert", "--conf-dir", CONF, "--plugin-dir", plugin_dir(), dir, ranks,
                    "--target", "vllm", "--tp", "2", "--format",
                    kernel ? "kernel" : "sharded-state", NULL);
      g_assert_cmpint(r.status, ==, 3);
      assert_has(r.err, cases[i].message);
      g_assert_false(g_file_test(ranks, G_FILE_TEST_EXISTS));
      test_run_clear(&r);
    }
  }
}

/* text_config.layer_scale true: vLLM's Qwen3.5 layers then build attn_layer_scale and
 * ffn_layer_scale (qwen3_5.py:189-204 @ df1376907b16), which Transformers' model does
 * not have.  sharded_state would refuse rank files without them: plan --format
 * sharded-state refuses the config (exit 3, the field and what vLLM builds).  vLLM
 * initialises them to zeros and applies x * (1 + scale), the identity, so a live update
 * (--format kernel) without them computes what the checkpoint means: accepted.  The old
 * tree planned both without a word. */
static void
test_refuse_layer_scale(void)
{
  g_autofree char *base = config_path(MOE);
  g_autoptr(JsonNode) root = load_json(base);
  JsonObject *text = json_object_get_object_member(json_node_get_object(root), "text_config");
  g_autofree char *dir = new_path("layer-scale");
  g_autofree char *config = new_path("layer-scale-config.json");
  Run r;

  json_object_set_boolean_member(text, "layer_scale", TRUE);
  save_json(root, config);
  r = run_wsync("synth", "--conf-dir", CONF, "--plugin-dir", plugin_dir(), "--config", config,
                dir, NULL);
  g_assert_cmpint(r.status, ==, 0);
  test_run_clear(&r);
  r = run_wsync("plan", "--conf-dir", CONF, "--plugin-dir", plugin_dir(), dir, "--target",
                "vllm", "--tp", "2", NULL);
  g_assert_cmpint(r.status, ==, 3);
  assert_has(r.err, "config.json: field \"text_config.layer_scale\" is true: vLLM's "
                    "Qwen3_5MoeForConditionalGeneration then builds attn_layer_scale and "
                    "ffn_layer_scale in every layer");
  assert_has(r.err, "--format sharded-state accepts only 0, false or absent\n");
  test_run_clear(&r);
  r = run_wsync("plan", "--conf-dir", CONF, "--plugin-dir", plugin_dir(), dir, "--target",
                "vllm", "--tp", "2", "--format", "kernel", NULL);
  g_assert_cmpint(r.status, ==, 0);
  test_run_clear(&r);

  /* vLLM tests `if self.layer_scale:`, Python's truth: -1 builds the scales (the old
   * tree, which asked `> 0`, planned it: exit 0), an empty list does not (the old tree
   * refused it: exit 3) */
  g_autofree char *in_dir = g_build_filename(dir, "config.json", NULL);
  json_object_set_int_member(text, "layer_scale", -1);
  save_json(root, in_dir);
  r = run_wsync("plan", "--conf-dir", CONF, "--plugin-dir", plugin_dir(), dir, "--target",
                "vllm", "--tp", "2", NULL);
  g_assert_cmpint(r.status, ==, 3);
  assert_has(r.err, "config.json: field \"text_config.layer_scale\" is -1: vLLM's ");
  test_run_clear(&r);
  json_object_set_array_member(text, "layer_scale", json_array_new());
  save_json(root, in_dir);
  r = run_wsync("plan", "--conf-dir", CONF, "--plugin-dir", plugin_dir(), dir, "--target",
                "vllm", "--tp", "2", NULL);
  g_assert_cmpint(r.status, ==, 0);
  test_run_clear(&r);
}

/* num_local_experts in place of num_experts: Transformers' and vLLM's Qwen3.5-MoE text
 * configs have no attribute_map for it and build num_experts (default 256) experts
 * (docs/hf-checkpoints.md §3).  The old tree took num_local_experts for num_experts and
 * converted (exit 0) a layout neither reader builds; refused: exit 3, both names. */
static void
test_refuse_num_local_experts(void)
{
  g_autofree char *base = config_path(MOE);
  g_autoptr(JsonNode) root = load_json(base);
  JsonObject *text = json_object_get_object_member(json_node_get_object(root), "text_config");
  guint64 experts = (guint64)json_object_get_int_member(text, "num_experts");
  g_autofree char *path = new_path("local-experts.json");
  g_autofree char *dst = new_path("refused");
  Run r;

  json_object_remove_member(text, "num_experts");
  json_object_set_int_member(text, "num_local_experts", (gint64)experts);
  save_json(root, path);
  r = run_wsync("synth", "--conf-dir", CONF, "--plugin-dir", plugin_dir(), "--config", path, dst,
                NULL);
  g_assert_cmpint(r.status, ==, 3);
  assert_has(r.err, path);
  assert_has(r.err, "field \"text_config.num_experts\" is missing: Transformers' and vLLM's "
                    "Qwen3.5 configs read num_experts (default 256) and ignore "
                    "\"text_config.num_local_experts\"\n");
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
  test_run_clear(&r);
}

static void
test_refuse_configs(void)
{
  assert_config_refused("text_config.linear_num_key_heads", NULL,
                        "field \"text_config.linear_num_key_heads\" is missing");
  assert_config_refused("text_config.layer_types", "[\"linear_attention\"]",
                        "field \"text_config.layer_types\" has 1 entries but "
                        "text_config.num_hidden_layers is 4");
  assert_config_refused("text_config.layer_types",
                        "[\"linear_attention\", \"sliding_attention\", \"linear_attention\", "
                        "\"full_attention\"]",
                        "field \"text_config.layer_types[1]\" must be \"linear_attention\" or "
                        "\"full_attention\", not \"sliding_attention\"");
  assert_config_refused("text_config.linear_num_value_heads", "6",
                        "field \"text_config.linear_num_key_heads\" is 4, which does not divide "
                        "text_config.linear_num_value_heads 6\n");
  /* the full-attention layers: vLLM's Attention asserts num_heads % num_kv_heads == 0
   * (docs/vllm.md §9.2) */
  assert_config_refused("text_config.num_key_value_heads", "3",
                        "field \"text_config.num_key_value_heads\" is 3, which does not divide "
                        "text_config.num_attention_heads 4\n");
  assert_config_refused("text_config.num_key_value_heads", "8",
                        "field \"text_config.num_key_value_heads\" is 8, which does not divide "
                        "text_config.num_attention_heads 4\n");
  assert_config_refused("text_config.model_type", "\"qwen3_5_text\"",
                        "field \"text_config.model_type\" is \"qwen3_5_text\", but model_type "
                        "\"qwen3_5_moe\" has the text model \"qwen3_5_moe_text\"");
  assert_config_refused("text_config.shared_expert_intermediate_size", NULL,
                        "field \"text_config.shared_expert_intermediate_size\" is missing");
  assert_config_refused("vision_config.num_heads", "5",
                        "field \"vision_config.num_heads\" is 5, which does not divide "
                        "vision_config.hidden_size 32\n");
  assert_config_refused("vision_config.depth", "\"2\"",
                        "field \"vision_config.depth\" must be a positive integer, not \"2\"");
  assert_config_refused("text_config.mtp_use_dedicated_embeddings", "true",
                        "field \"text_config.mtp_use_dedicated_embeddings\" is true: an MTP "
                        "block with its own embedding is not a layout qwen3_5_moe knows");
  assert_config_refused("text_config.dtype", "\"int8\"",
                        "field \"text_config.dtype\" must be \"bfloat16\", \"float16\" or "
                        "\"float32\", not \"int8\"");
}

/* architectures[0] other than the multimodal class of the model_type: Transformers'
 * Qwen3_5(Moe)ForCausalLM is a text-only model of other names (model.layers.*, no tower)
 * and vLLM's class of that name holds `model.*` and `lm_head.*`, not the
 * `language_model.model.*` the multimodal mapper gives (docs/hf-checkpoints.md §3
 * "Text-only Qwen3.5", docs/vllm.md §9.6).  synth refuses the config, and plan and
 * convert --target vllm or hf refuse a checkpoint whose config.json says so: exit 3, the
 * config's path, the field, the value and what is supported; nothing written.  The old
 * tree described the multimodal checkpoint under the text-only class and convert
 * --target vllm wrote language_model.model.* names, exit 0. */
static void
test_refuse_architecture(void)
{
  static const struct {
    const char *base, *architecture, *model_type, *supported;
  } cases[] = {
      {MOE, "Qwen3_5MoeForCausalLM", "qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration"},
      {MOE, "Qwen3_5ForConditionalGeneration", "qwen3_5_moe",
       "Qwen3_5MoeForConditionalGeneration"},
      {DENSE, "Qwen3_5ForCausalLM", "qwen3_5", "Qwen3_5ForConditionalGeneration"},
      {DENSE, "Qwen3_5MoeForConditionalGeneration", "qwen3_5", "Qwen3_5ForConditionalGeneration"},
  };

  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_autofree char *base = config_path(cases[i].base);
    g_autoptr(JsonNode) root = load_json(base);
    JsonArray *list = json_array_new();
    g_autofree char *config = new_path("arch-config.json");
    g_autofree char *refused = new_path("arch-refused");
    g_autofree char *ck = g_strdup(synth(cases[i].base, FALSE));
    g_autofree char *copy = new_path("arch-ck");
    g_autofree char *ck_config = g_build_filename(copy, "config.json", NULL);
    g_autofree char *want = g_strdup_printf(
        "field \"architectures\" begins with \"%s\", but model_type \"%s\" is "
        "supported only as \"%s\" (the published multimodal checkpoint: "
        "model.language_model.*, model.visual.*, lm_head.weight); a text-only checkpoint "
        "(Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM) is not supported\n",
        cases[i].architecture, cases[i].model_type, cases[i].supported);
    g_autofree char *line = NULL;
    Run r;

    g_test_message("%s as %s", cases[i].base, cases[i].architecture);
    json_array_add_string_element(list, cases[i].architecture);
    json_object_set_array_member(json_node_get_object(root), "architectures", list);
    save_json(root, config);
    r = run_wsync("synth", "--conf-dir", CONF, "--plugin-dir", plugin_dir(), "--config", config,
                  refused, NULL);
    g_assert_cmpint(r.status, ==, 3);
    g_free(line);
    line = g_strdup_printf("wsync: %s: %s", config, want);
    g_assert_cmpstr(r.err, ==, line);
    g_assert_false(g_file_test(refused, G_FILE_TEST_EXISTS));
    test_run_clear(&r);

    /* a checkpoint of the published class whose config.json is given the other class */
    g_assert_cmpint(g_mkdir(copy, 0755), ==, 0);
    {
      g_autoptr(GDir) dir = g_dir_open(ck, 0, NULL);
      const char *name;
      while ((name = g_dir_read_name(dir)) != NULL) {
        g_autofree char *from = g_build_filename(ck, name, NULL);
        g_autofree char *to = g_build_filename(copy, name, NULL);
        test_copy(from, to);
      }
    }
    test_copy(config, ck_config);
    for (guint w = 0; w < 3; w++) {
      r = w == 0   ? run_wsync("plan", "--conf-dir", CONF, "--plugin-dir", plugin_dir(), copy,
                               "--target", "vllm", "--tp", "2", NULL)
          : w == 1 ? run_wsync("convert", "--conf-dir", CONF, "--plugin-dir", plugin_dir(),
                               copy, refused, "--target", "vllm", "--tp", "1", NULL)
                   : run_wsync("convert", "--conf-dir", CONF, "--plugin-dir", plugin_dir(),
                               copy, refused, "--target", "hf", NULL);
      g_assert_cmpint(r.status, ==, 3);
      g_free(line);
      line = g_strdup_printf("wsync: %s: %s", ck_config, want);
      g_assert_cmpstr(r.err, ==, line);
      g_assert_false(g_file_test(refused, G_FILE_TEST_EXISTS));
      test_run_clear(&r);
    }
  }
}

/* A text-only config, model_type "qwen3_5_moe_text" / "qwen3_5_text" at the top level (the
 * text fields at the root, as Qwen3_5(Moe)TextConfig saves them): refused with exit 3, the
 * config's path, the field, the value and what is supported; nothing written.  The old
 * tree left them unclaimed: "claimed by no loaded plugin (select a model plugin in
 * conf.d...)", exit 2, though the plugin was selected. */
static void
test_refuse_text_model_type(void)
{
  static const char *const bases[] = {MOE, DENSE};

  for (guint i = 0; i < G_N_ELEMENTS(bases); i++) {
    g_autofree char *base = config_path(bases[i]);
    g_autoptr(JsonNode) root = load_json(base);
    g_autoptr(JsonNode) text =
        json_node_copy(json_object_get_member(json_node_get_object(root), "text_config"));
    const char *model_type = json_object_get_string_member(json_node_get_object(text),
                                                           "model_type");
    g_autofree char *config = new_path("text-config.json");
    g_autofree char *refused = new_path("text-refused");
    g_autofree char *want = NULL;
    Run r;

    g_assert_true(g_str_has_suffix(model_type, "_text"));
    want = g_strdup_printf(
        "wsync: %s: field \"model_type\" is \"%s\": a text-only Qwen3.5 checkpoint "
        "(Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM) is not supported; qwen3_5_moe supports "
        "model_type \"qwen3_5_moe\" and \"qwen3_5\" (the published multimodal checkpoint: "
        "model.language_model.*, model.visual.*, lm_head.weight)\n",
        config, model_type);
    save_json(text, config);
    r = run_wsync("synth", "--conf-dir", CONF, "--plugin-dir", plugin_dir(), "--config", config,
                  refused, NULL);
    g_assert_cmpint(r.status, ==, 3);
    g_assert_cmpstr(r.err, ==, want);
    g_assert_false(g_file_test(refused, G_FILE_TEST_EXISTS));
    test_run_clear(&r);
  }
}

/* ------------------------------------------------------------------ tests: configuration */

/* tie_word_embeddings: -1 absent, 0 false, 1 true. */
static const char *
tie_word(int v)
{
  return v < 0 ? "absent" : v ? "true" : "false";
}

/* @base with the top-level and text_config tie_word_embeddings set to @root and @text. */
static char *
tie_config(const char *base, int root, int text)
{
  g_autofree char *from = config_path(base);
  g_autoptr(JsonNode) node = load_json(from);
  JsonObject *o = json_node_get_object(node);
  JsonObject *t = json_object_get_object_member(o, "text_config");
  char *path = new_path("tie");

  json_object_remove_member(o, "tie_word_embeddings");
  json_object_remove_member(t, "tie_word_embeddings");
  if (root >= 0)
    json_object_set_boolean_member(o, "tie_word_embeddings", root);
  if (text >= 0)
    json_object_set_boolean_member(t, "tie_word_embeddings", text);
  save_json(node, path);
  return path;
}

/* Every combination of the two tie_word_embeddings, present or not, for both models.
 * Transformers ties Qwen3_5(Moe)ForConditionalGeneration by the top-level field, vLLM by
 * text_config's; each defaults to false on its own, nothing copies one into the other
 * (docs/hf-checkpoints.md §3).  Where the two words agree (an absent one is false) the
 * checkpoint is written with exactly the published tensors, lm_head.weight only when
 * untied; where they differ it is refused (exit 3) naming the file and both words, and
 * nothing is written.  The old tree took the top level's word when text_config had none,
 * so "true at the top, absent in text_config" wrote no lm_head.weight for a vLLM that
 * builds an untied head. */
static void
test_tie_combinations(void)
{
  static const char *const configs[] = {MOE, DENSE};

  for (guint i = 0; i < G_N_ELEMENTS(configs); i++)
    for (int root = -1; root <= 1; root++)
      for (int text = -1; text <= 1; text++) {
        g_autofree char *path = tie_config(configs[i], root, text);
        g_autofree char *dst = new_path("tie-out");
        const gboolean tied_root = root == 1, tied_text = text == 1;
        Run r;

        g_test_message("%s: top level %s, text_config %s", configs[i], tie_word(root),
                       tie_word(text));
        r = run_wsync("synth", "--conf-dir", CONF, "--plugin-dir", plugin_dir(), "--config",
                      path, dst, "--pattern", "index", "-q", NULL);
        if (tied_root == tied_text) {
          Model m = read_model(path);
          g_autoptr(GPtrArray) specs = NULL;
          g_autoptr(WsyncCheckpoint) ck = NULL;

          g_assert_cmpint(r.status, ==, 0);
          g_assert_cmpint(m.tied, ==, tied_text);
          specs = published(&m, TRUE, FALSE);
          ck = open_ck(dst);
          assert_tensors(ck, specs);
          g_assert_true((wsync_checkpoint_lookup(ck, "lm_head.weight") == NULL) == tied_text);
        } else {
          g_autofree char *want = g_strdup_printf(
              "%s: field \"text_config.tie_word_embeddings\" is %s%s but the top-level "
              "\"tie_word_embeddings\" is %s%s: Transformers ties the LM head by the "
              "top-level field, vLLM by text_config's, so one of them would load a random or "
              "drop a trained lm_head.weight; set both to the same value",
              path, tied_text ? "true" : "false", text < 0 ? " (absent: vLLM's default)" : "",
              tied_root ? "true" : "false", root < 0 ? " (absent: Transformers' default)" : "");
          g_assert_cmpint(r.status, ==, 3);
          assert_has(r.err, want);
          g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
        }
        test_run_clear(&r);
      }
}


/* The shipped conf.d file parses, loads the plugin and serves both model types; the
 * option is checked. */
static void
test_shipped_conf(void)
{
  g_autofree char *conf = new_path("shipped");
  g_autofree char *shipped =
      g_test_build_filename(G_TEST_DIST, "..", "conf.d", "31-qwen3_5_moe.conf", NULL);
  g_autofree char *copy = NULL;
  g_autofree char *bad = NULL;
  Run r;

  g_assert_cmpint(g_mkdir(conf, 0755), ==, 0);
  copy = g_build_filename(conf, "31-qwen3_5_moe.conf", NULL);
  test_copy(shipped, copy);
  r = run_wsync("plugins", "--conf-dir", conf, "--plugin-dir", plugin_dir(), NULL);
  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, "qwen3_5_moe  active");
  assert_has(r.out, "serves qwen3_5_moe,qwen3_5,qwen3_5_moe_text,qwen3_5_text");
  test_run_clear(&r);
  /* a value that is not a boolean, in a later file */
  bad = test_write(conf, "90-bad.conf",
                   "plugin \"qwen3_5_moe\" {\n  language-model-only = maybe\n}\n");
  r = run_wsync("plugins", "--conf-dir", conf, "--plugin-dir", plugin_dir(), NULL);
  g_assert_cmpint(r.status, ==, 2);
  assert_has(r.err, bad);
  test_run_clear(&r);
}

/* ------------------------------------------------------------------ tests: the bundled configs */

/* One sparse shard: the tensors specs[first, last) in @file, every data byte a hole. */
static void
sparse_shard(GPtrArray *specs, guint first, guint last, const char *file, GHashTable *weight_map,
             const char *file_name, guint64 *total)
{
  g_autoptr(WsyncSafetensorsWriter) w = wsync_safetensors_writer_new();
  g_autofree guint8 *header = NULL;
  GError *error = NULL;
  gsize len;
  int fd;

  for (guint i = first; i < last; i++) {
    const Spec *s = specs->pdata[i];
    g_assert_true(wsync_safetensors_writer_add(w, s->name, s->dtype, s->ndim, s->shape, &error));
    g_hash_table_insert(weight_map, g_strdup(s->name), g_strdup(file_name));
  }
  header = wsync_safetensors_writer_header(w, &len);
  *total += wsync_safetensors_writer_data_size(w);
  fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  g_assert_cmpint(fd, >=, 0);
  g_assert_cmpint(write(fd, header, len), ==, (gssize)len);
  g_assert_cmpint(ftruncate(fd, (off_t)(len + wsync_safetensors_writer_data_size(w))), ==, 0);
  close(fd);
}

/* A header-only checkpoint: the tensors of @specs in sparse shards of at most 8 GiB
 * (every data byte a hole: nothing is written, and valgrind, which cannot map 64 GiB at
 * once, maps them one by one), named as the Qwen3.5 Hub repositories name them
 * (`model.safetensors-000NN-of-000MM.safetensors`, docs/hf-checkpoints.md §3, found only
 * through the index), plus @config as config.json.  Planning reads headers only. */
static char *
sparse_checkpoint(GPtrArray *specs, const char *config)
{
  const guint64 shard_max = G_GUINT64_CONSTANT(8) << 30;
  char *dir = new_path("sparse");
  g_autofree char *config_to = g_build_filename(dir, "config.json", NULL);
  g_autofree char *index = g_build_filename(dir, WSYNC_INDEX_NAME, NULL);
  g_autoptr(GHashTable) weight_map = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
  g_autoptr(GArray) starts = g_array_new(FALSE, FALSE, sizeof(guint));
  guint64 in_shard = 0, total = 0;
  GError *error = NULL;

  g_assert_cmpint(g_mkdir(dir, 0755), ==, 0);
  test_copy(config, config_to);
  for (guint i = 0; i < specs->len; i++) {
    const Spec *s = specs->pdata[i];
    guint64 bytes = wsync_dtype_bits(s->dtype) / 8;
    for (guint d = 0; d < s->ndim; d++)
      bytes *= s->shape[d];
    if (i == 0 || in_shard + bytes > shard_max) {
      g_array_append_val(starts, i);
      in_shard = 0;
    }
    in_shard += bytes;
  }
  for (guint k = 0; k < starts->len; k++) {
    guint first = g_array_index(starts, guint, k);
    guint last = k + 1 < starts->len ? g_array_index(starts, guint, k + 1) : specs->len;
    g_autofree char *name =
        g_strdup_printf("model.safetensors-%05u-of-%05u.safetensors", k + 1, starts->len);
    g_autofree char *file = g_build_filename(dir, name, NULL);
    sparse_shard(specs, first, last, file, weight_map, name, &total);
  }
  g_assert_true(wsync_index_write(index, total, weight_map, &error));
  g_assert_no_error(error);
  return dir;
}

/* The plan's output tensors of rank @rank, by name. */
static JsonObject *
plan_rank_tensor(JsonNode *plan, guint rank, const char *name)
{
  JsonArray *ranks = json_object_get_array_member(json_node_get_object(plan), "ranks");
  JsonArray *tensors = json_object_get_array_member(json_array_get_object_element(ranks, rank),
                                                    "tensors");

  for (guint i = 0; i < json_array_get_length(tensors); i++) {
    JsonObject *t = json_array_get_object_element(tensors, i);
    if (strcmp(json_object_get_string_member(t, "name"), name) == 0)
      return t;
  }
  g_error("the plan of rank %u has no %s", rank, name);
  return NULL;
}

static void
assert_plan_shape(JsonNode *plan, guint rank, const char *name, const char *dtype, guint ndim,
                  const guint64 *shape)
{
  JsonObject *t = plan_rank_tensor(plan, rank, name);
  JsonArray *s = json_object_get_array_member(t, "shape");

  g_assert_cmpstr(json_object_get_string_member(t, "dtype"), ==, dtype);
  g_assert_cmpuint(json_array_get_length(s), ==, ndim);
  for (guint d = 0; d < ndim; d++)
    g_assert_cmpuint((guint64)json_array_get_int_element(s, d), ==, shape[d]);
}

static JsonNode *
plan_json(const char *src, const char *target, const char *tp)
{
  Run r = tp != NULL ? run_wsync("plan", src, "--conf-dir", CONF, "--plugin-dir", plugin_dir(),
                                 "--target", target, "--tp", tp, "--json", NULL)
                     : run_wsync("plan", src, "--conf-dir", CONF, "--plugin-dir", plugin_dir(),
                                 "--target", target, "--json", NULL);
  g_autoptr(JsonParser) parser = json_parser_new();
  GError *error = NULL;

  if (r.status != 0)
    g_error("plan %s --target %s: exit %d\n%s", src, target, r.status, r.err);
  json_parser_load_from_data(parser, r.out, -1, &error);
  g_assert_no_error(error);
  test_run_clear(&r);
  return json_node_copy(json_parser_get_root(parser));
}

/* The published tensor list of the real config (docs/hf-checkpoints.md §3:
 * Qwen3.5-35B-A3B has 1 811 tensors, Qwen3.6-27B 1 199), as a sparse checkpoint: the
 * plugin maps every tensor of it, "hf" writes it back tensor for tensor, and vllm at @tp
 * has the shapes of docs/vllm.md §9.3, §9.4. */
static void
check_real_config(const char *name, guint expect_tensors, const char *tp, WsyncDtype alog_norm)
{
  g_autofree char *config = config_path(name);
  Model m = read_model(name);
  g_autoptr(GPtrArray) specs = NULL;
  g_autofree char *src = NULL;
  g_autoptr(JsonNode) hf = NULL;
  g_autoptr(JsonNode) vllm = NULL;
  guint t = (guint)g_ascii_strtoull(tp, NULL, 10);
  guint64 kd = m.nk * m.dk, vd = m.nv * m.dv;
  JsonArray *ranks;

  m.alog_norm = alog_norm; /* as the checkpoint publishes them (docs/hf-checkpoints.md §3) */
  specs = published(&m, TRUE, FALSE);
  g_assert_cmpuint(specs->len, ==, expect_tensors);
  src = sparse_checkpoint(specs, config);
  hf = plan_json(src, "hf", NULL);
  ranks = json_object_get_array_member(json_node_get_object(hf), "ranks");
  g_assert_cmpuint(json_array_get_length(json_object_get_array_member(
                       json_array_get_object_element(ranks, 0), "tensors")),
                   ==, expect_tensors);
  assert_plan_shape(hf, 0, "model.language_model.layers.0.linear_attn.A_log",
                    wsync_dtype_name(alog_norm), 1, (guint64[]){m.nv});
  assert_plan_shape(hf, 0, "model.language_model.layers.0.linear_attn.norm.weight",
                    wsync_dtype_name(alog_norm), 1, (guint64[]){m.dv});
  vllm = plan_json(src, "vllm", tp);
  assert_plan_shape(vllm, 0, "language_model.model.layers.0.linear_attn.in_proj_qkvz.weight",
                    "BF16", 2, (guint64[]){(2 * kd + 2 * vd) / t, m.H});
  assert_plan_shape(vllm, 0, "language_model.model.layers.0.linear_attn.A_log", "F32", 1,
                    (guint64[]){m.nv / t});
  assert_plan_shape(vllm, 0, "language_model.model.layers.0.linear_attn.norm.weight", "BF16", 1,
                    (guint64[]){m.dv});
  assert_plan_shape(vllm, 0, "language_model.model.layers.3.self_attn.qkv_proj.weight", "BF16", 2,
                    (guint64[]){(2 * m.nh / t + 2 * MAX(m.nkv / t, 1)) * m.hd, m.H});
  assert_plan_shape(vllm, 0, "visual.blocks.0.attn.qkv.weight", "BF16", 2,
                    (guint64[]){3 * m.D / t, m.D});
  assert_plan_shape(vllm, 0, "language_model.lm_head.weight", "BF16", 2,
                    (guint64[]){(m.V + 63) / 64 * 64 / t, m.H});
}

static void
test_real_qwen3_5_35b_a3b(void)
{
  check_real_config("qwen3.5-35b-a3b.json", 1811, "4", WSYNC_DTYPE_F32);
}

static void
test_real_qwen3_6_27b(void)
{
  check_real_config("qwen3.6-27b.json", 1199, "8", WSYNC_DTYPE_BF16);
}

int
main(int argc, char **argv)
{
  int status;

  g_test_init(&argc, &argv, NULL);
  work_dir = test_tmpdir();
  made = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);

  g_test_add_func("/qwen3_5_moe/hf/published", test_hf_published);
  g_test_add_func("/qwen3_5_moe/hf/fused-synth", test_hf_fused_synth);
  g_test_add_func("/qwen3_5_moe/hf/experts", test_hf_experts);
  g_test_add_func("/qwen3_5_moe/hf/fused-to-published", test_hf_fused_to_published);
  g_test_add_func("/qwen3_5_moe/vllm/tp1", test_vllm_tp1);
  g_test_add_func("/qwen3_5_moe/vllm/tp2", test_vllm_tp2);
  g_test_add_func("/qwen3_5_moe/vllm/tp4-kv-replicated", test_vllm_tp4_kv_replicated);
  g_test_add_func("/qwen3_5_moe/vllm/expert-forms", test_vllm_expert_forms);
  g_test_add_func("/qwen3_5_moe/vllm/ep", test_vllm_ep);
  g_test_add_func("/qwen3_5_moe/vllm/shared-expert", test_vllm_shared_expert);
  g_test_add_func("/qwen3_5_moe/vllm/shared-expert-unpinned", test_vllm_shared_expert_unpinned);
  g_test_add_func("/qwen3_5_moe/vllm-ascend/shared-expert", test_ascend_shared_expert);
  g_test_add_func("/qwen3_5_moe/vllm-ascend/shared-expert-vllm-unknown",
                  test_ascend_shared_expert_vllm_unknown);
  g_test_add_func("/qwen3_5_moe/refuse/deployment", test_refuse_deployment);
  g_test_add_func("/qwen3_5_moe/plan/shared-expert", test_plan_shared_expert);
  g_test_add_func("/qwen3_5_moe/round-trip/shared-expert", test_round_trip_shared_expert);
  g_test_add_func("/qwen3_5_moe/round-trip/ascend-shared-expert",
                  test_round_trip_ascend_shared_expert);
  g_test_add_func("/qwen3_5_moe/round-trip/encoder-data", test_round_trip_encoder_data);
  g_test_add_func("/qwen3_5_moe/round-trip/legacy-shared-expert",
                  test_round_trip_legacy_shared_expert);
  g_test_add_func("/qwen3_5_moe/round-trip/pcp-record-refused", test_read_back_pcp_record_refused);
  g_test_add_func("/qwen3_5_moe/vllm/dense-tied", test_vllm_dense_tied);
  g_test_add_func("/qwen3_5_moe/vllm/interval", test_vllm_interval);
  g_test_add_func("/qwen3_5_moe/vllm/legacy-layer-types", test_vllm_legacy_layer_types);
  g_test_add_func("/qwen3_5_moe/vllm/flat", test_vllm_flat);
  g_test_add_func("/qwen3_5_moe/synth/layers", test_synth_layers);
  g_test_add_func("/qwen3_5_moe/vllm/language-model-only", test_vllm_language_model_only);
  g_test_add_func("/qwen3_5_moe/casts", test_casts);
  g_test_add_func("/qwen3_5_moe/round-trip/widened", test_round_trip);
  g_test_add_func("/qwen3_5_moe/dtype/bf16-kept", test_dtype_bf16_kept);
  g_test_add_func("/qwen3_5_moe/dtype/f32-kept", test_dtype_f32_kept);
  g_test_add_func("/qwen3_5_moe/dtype/record-refused", test_dtype_record_refused);
  g_test_add_func("/qwen3_5_moe/dtype/record-not-float", test_dtype_record_not_float);
  g_test_add_func("/qwen3_5_moe/dtype/records-disagree", test_dtype_records_disagree);
  g_test_add_func("/qwen3_5_moe/records/inspect", test_records_inspect);
  g_test_add_func("/qwen3_5_moe/records/verify-differ", test_records_verify_differ);
  g_test_add_func("/qwen3_5_moe/records/verify-one-side", test_records_verify_one_side);
  g_test_add_func("/qwen3_5_moe/records/verify-equal", test_records_verify_equal);
  g_test_add_func("/qwen3_5_moe/records/rank-files-disagree", test_records_rank_files_disagree);
  g_test_add_func("/qwen3_5_moe/records/deployment-disagrees", test_records_deployment_disagrees);
  g_test_add_func("/qwen3_5_moe/records/attn-scales-refused", test_records_attn_scales_refused);
  g_test_add_func("/qwen3_5_moe/round-trip/exact", test_round_trip_exact);
  g_test_add_func("/qwen3_5_moe/round-trip/mtp-omitted", test_round_trip_mtp_omitted);
  g_test_add_func("/qwen3_5_moe/round-trip/language-model-only-refused",
                  test_read_back_language_model_only);
  g_test_add_func("/qwen3_5_moe/round-trip/language-model-only-recorded",
                  test_read_back_recorded_switch);
  g_test_add_func("/qwen3_5_moe/round-trip/language-model-only-unrecorded",
                  test_read_back_unrecorded_switch);
  g_test_add_func("/qwen3_5_moe/plan/text", test_plan_text);
  g_test_add_func("/qwen3_5_moe/plan/json", test_plan_json);
  g_test_add_func("/qwen3_5_moe/convert/notes", test_convert_notes);
  g_test_add_func("/qwen3_5_moe/refuse/key-heads", test_refuse_key_heads);
  g_test_add_func("/qwen3_5_moe/refuse/heads", test_refuse_heads);
  g_test_add_func("/qwen3_5_moe/refuse/configs", test_refuse_configs);
  g_test_add_func("/qwen3_5_moe/refuse/architecture", test_refuse_architecture);
  g_test_add_func("/qwen3_5_moe/refuse/text-model-type", test_refuse_text_model_type);
  g_test_add_func("/qwen3_5_moe/refuse/hidden-act", test_refuse_hidden_act);
  g_test_add_func("/qwen3_5_moe/refuse/num-local-experts", test_refuse_num_local_experts);
  g_test_add_func("/qwen3_5_moe/refuse/layer-scale", test_refuse_layer_scale);
  g_test_add_func("/qwen3_5_moe/config/biases", test_biases);
  g_test_add_func("/qwen3_5_moe/config/tie-combinations", test_tie_combinations);
  g_test_add_func("/qwen3_5_moe/config/shipped", test_shipped_conf);
  g_test_add_func("/qwen3_5_moe/real/qwen3.5-35b-a3b", test_real_qwen3_5_35b_a3b);
  g_test_add_func("/qwen3_5_moe/real/qwen3.6-27b", test_real_qwen3_6_27b);

  status = g_test_run();
  test_rmtree(work_dir);
  g_free(work_dir);
  g_hash_table_unref(made);
  return status;
}
