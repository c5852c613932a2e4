/* The vllm plugin, end to end: `wsync synth` writes a tiny Qwen3-MoE checkpoint whose
 * every element is distinct (--pattern index), `wsync convert --target vllm` writes the
 * rank files in either format, and an oracle written here from docs/vllm.md (not from
 * the plugin or the engine) checks EVERY element of EVERY tensor of every rank against
 * the input element vLLM's loader would have put there, plus the names (by naming era,
 * §5), shapes, dtypes, metadata, and the tensors that must not be there. */
#include <json-glib/json-glib.h>
#include <stdio.h>
#include <stdlib.h>

#include <wsync/wsync.h>

#include "oracle.h"
#include "testutil.h"

/* ------------------------------------------------------------------ running wsync */

/* test_run_wsync_argv() (testutil.h) runs wsync under memcheck too in make check-valgrind. */
typedef TestRun Run;
/* the shared helpers of testutil.h under this file's short names */
#define run_argv test_run_args
#define run_wsync test_run
#define assert_has test_assert_has
#define run_ok test_run_ok

static void
run_clear(Run *r)
{
  test_run_clear(r);
}

/* ------------------------------------------------------------------ fixtures */

/* Everything made for the whole program, removed at the end. */
static char *work_dir;
static GHashTable *conf_dirs;  /* "version|scales" -> conf dir */
static GHashTable *synth_dirs; /* "config|fused" -> checkpoint dir */
static guint n_made;

static char *
new_dir(const char *what)
{
  char *dir = g_strdup_printf("%s/%s-%u", work_dir, what, n_made++);
  g_assert_cmpint(g_mkdir(dir, 0755), ==, 0);
  return dir;
}

/* A conf.d selecting qwen3_moe and vllm with these options (@dtype NULL: not set, so
 * vLLM's default auto). */
static const char *
conf_dir_dtype(const char *version, gboolean scales, const char *dtype)
{
  g_autofree char *key = g_strdup_printf("%s|%d|%s", version, scales, dtype ? dtype : "");
  char *dir = g_hash_table_lookup(conf_dirs, key);

  if (dir == NULL) {
    g_autofree char *line = dtype != NULL ? g_strdup_printf("  dtype = \"%s\"\n", dtype)
                                          : g_strdup("");
    g_autofree char *text = g_strdup_printf("plugin \"hf\" {}\nplugin \"qwen3_moe\" {}\n"
                                            "plugin \"vllm\" {\n"
                                            "  vllm-version = \"%s\"\n"
                                            "  attn-scales = %s\n"
                                            "%s"
                                            "}\n",
                                            version, scales ? "true" : "false", line);
    dir = new_dir("conf");
    g_free(test_write(dir, "10-test.conf", text));
    g_hash_table_insert(conf_dirs, g_strdup(key), dir);
  }
  return dir;
}

static const char *
conf_dir(const char *version, gboolean scales)
{
  return conf_dir_dtype(version, scales, NULL);
}

#define DEFAULT_CONF conf_dir("latest", TRUE)

/* configs/NAME (the project's), else tests/data/configs/NAME (this test's own). */
static char *
config_path(const char *name)
{
  char *path = g_test_build_filename(G_TEST_DIST, "..", "configs", name, NULL);

  if (!g_file_test(path, G_FILE_TEST_IS_REGULAR)) {
    g_free(path);
    path = g_test_build_filename(G_TEST_DIST, "data", "configs", name, NULL);
  }
  g_assert_true(g_file_test(path, G_FILE_TEST_IS_REGULAR));
  return path;
}

/* The synth checkpoint of a config, made once. */
static const char *
synth(const char *config, gboolean fused)
{
  g_autofree char *key = g_strdup_printf("%s|%d", config, fused);
  char *dir = g_hash_table_lookup(synth_dirs, key);

  if (dir == NULL) {
    g_autofree char *path = config_path(config);
    g_autoptr(GPtrArray) args = g_ptr_array_new();
    dir = g_strdup_printf("%s/synth-%u", work_dir, n_made++);
    g_ptr_array_add(args, "synth");
    g_ptr_array_add(args, "--conf-dir");
    g_ptr_array_add(args, (gpointer)DEFAULT_CONF);
    g_ptr_array_add(args, "--plugin-dir");
    g_ptr_array_add(args, (gpointer)test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR"));
    g_ptr_array_add(args, "--config");
    g_ptr_array_add(args, path);
    g_ptr_array_add(args, dir);
    g_ptr_array_add(args, "--seed");
    g_ptr_array_add(args, "7");
    g_ptr_array_add(args, "--pattern");
    g_ptr_array_add(args, "index");
    if (fused)
      g_ptr_array_add(args, "--fused-experts");
    run_ok(args);
    g_hash_table_insert(synth_dirs, g_strdup(key), dir);
  }
  return dir;
}

/* `wsync convert SRC DST --target vllm --format FORMAT --tp TP [--ep EP] [--rank RANK]`;
 * returns DST. */
static char *
convert_format(const char *src, const char *conf, const char *format, guint tp, guint ep,
               int rank)
{
  g_autoptr(GPtrArray) args = g_ptr_array_new_with_free_func(g_free);
  char *dst = g_strdup_printf("%s/vllm-%u", work_dir, n_made++);

  g_ptr_array_add(args, g_strdup("convert"));
  g_ptr_array_add(args, g_strdup(src));
  g_ptr_array_add(args, g_strdup(dst));
  g_ptr_array_add(args, g_strdup("--conf-dir"));
  g_ptr_array_add(args, g_strdup(conf));
  g_ptr_array_add(args, g_strdup("--plugin-dir"));
  g_ptr_array_add(args, g_strdup(test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR")));
  g_ptr_array_add(args, g_strdup("--target"));
  g_ptr_array_add(args, g_strdup("vllm"));
  g_ptr_array_add(args, g_strdup("--format"));
  g_ptr_array_add(args, g_strdup(format));
  g_ptr_array_add(args, g_strdup("--tp"));
  g_ptr_array_add(args, g_strdup_printf("%u", tp));
  if (ep > 0) {
    g_ptr_array_add(args, g_strdup("--ep"));
    g_ptr_array_add(args, g_strdup_printf("%u", ep));
  }
  if (rank >= 0) {
    g_ptr_array_add(args, g_strdup("--rank"));
    g_ptr_array_add(args, g_strdup_printf("%d", rank));
  }
  run_ok(args);
  return dst;
}

/* Experts beyond the TP ranks need the kernel format (sharded_state reads by TP rank). */
static const char *
format_for(guint tp, guint ep)
{
  return ep > tp ? "kernel" : "sharded-state";
}

static char *
convert(const char *src, const char *conf, guint tp, guint ep, int rank)
{
  return convert_format(src, conf, format_for(tp, ep), tp, ep, rank);
}

/* ------------------------------------------------------------------ the model, from config.json */

typedef struct {
  guint64 H, nh, nkv, hd, I, Id, E, L, V;
  gboolean tied;
  gboolean dense[64]; /* per layer: a dense MLP instead of experts */
} Model;

static guint64
member_uint(JsonObject *o, const char *name)
{
  g_assert_true(json_object_has_member(o, name));
  return (guint64)json_object_get_int_member(o, name);
}

static Model
read_model(const char *config)
{
  g_autofree char *path = config_path(config);
  g_autoptr(JsonParser) parser = json_parser_new();
  GError *error = NULL;
  JsonObject *o;
  Model m = {0};
  guint64 step = 1;

  json_parser_load_from_file(parser, path, &error);
  g_assert_no_error(error);
  o = json_node_get_object(json_parser_get_root(parser));
  m.H = member_uint(o, "hidden_size");
  m.nh = member_uint(o, "num_attention_heads");
  m.nkv = member_uint(o, "num_key_value_heads");
  m.hd = member_uint(o, "head_dim");
  m.I = member_uint(o, "moe_intermediate_size");
  m.Id = member_uint(o, "intermediate_size");
  m.E = member_uint(o, "num_experts");
  m.L = member_uint(o, "num_hidden_layers");
  m.V = member_uint(o, "vocab_size");
  m.tied = json_object_get_boolean_member_with_default(o, "tie_word_embeddings", FALSE);
  g_assert_cmpuint(m.L, <=, G_N_ELEMENTS(m.dense));
  if (json_object_has_member(o, "decoder_sparse_step"))
    step = member_uint(o, "decoder_sparse_step");
  /* docs/vllm.md §8: dense when in mlp_only_layers or (i+1) % decoder_sparse_step. */
  for (guint64 l = 0; l < m.L; l++)
    m.dense[l] = step == 0 || (l + 1) % step != 0;
  if (json_object_has_member(o, "mlp_only_layers")) {
    JsonArray *a = json_object_get_array_member(o, "mlp_only_layers");
    for (guint i = 0; i < json_array_get_length(a); i++)
      m.dense[json_array_get_int_element(a, i)] = TRUE;
  }
  return m;
}

/* ------------------------------------------------------------------ rank files */

/* (RankFiles, open_ranks_of() and the element checks are in oracle.h.) */
static guint
open_ranks(const char *dir, RankFiles *ranks, guint max_ranks)
{
  return open_ranks_of(dir, "sharded-state", ranks, max_ranks);
}

/* ------------------------------------------------------------------ the oracle */

/* How a vLLM release names a MoE block (docs/vllm.md §5): the alias winner of the
 * router, the module of the routed experts, and whether the EP expert map is a
 * persistent buffer. */
typedef struct {
  const char *version;
  char era;
  const char *router;     /* after "model.layers.L." */
  const char *routed;     /* the routed experts' module, after "model.layers.L." */
  gboolean map_persistent;
} Naming;

static const Naming namings[] = {
    {"0.18.1", 'A', "mlp.experts._gate.weight", "mlp.experts.", TRUE},
    {"0.20.0", 'B', "mlp.gate.weight", "mlp.experts.", TRUE},
    {"0.22.0", 'C', "mlp.experts.runner.gate.weight", "mlp.experts.", TRUE},
    {"0.24.0", 'D', "mlp.experts.gate.weight", "mlp.experts.routed_experts.", TRUE},
    /* its expert map is not known: sharded-state with EP is refused (test_refuse_sharded_state) */
    {"0.25.0", 'D', "mlp.experts.gate.weight", "mlp.experts.routed_experts.", FALSE},
    {"0.27.1", 'D', "mlp.experts.gate.weight", "mlp.experts.routed_experts.", FALSE},
    {"latest", 'D', "mlp.experts.gate.weight", "mlp.experts.routed_experts.", FALSE},
};

static const Naming *
naming_of(const char *version)
{
  for (guint i = 0; i < G_N_ELEMENTS(namings); i++)
    if (strcmp(namings[i].version, version) == 0)
      return &namings[i];
  g_error("no naming for vllm-version %s in this test", version);
  return NULL;
}

typedef struct {
  RankCheck c; /* the rank, its files and the input (oracle.h) */
  const Model *m;
  const Naming *naming;
  gboolean kernel; /* the kernel format: parameters only */
  gboolean scales;
} Oracle;

static void
check_replicated(Oracle *o, const char *name)
{
  check_replicated_as(&o->c, name, name);
}

static void
check_vocab(Oracle *o, const char *name)
{
  check_vocab_as(&o->c, name, name, o->m->V);
}

/* Where the (a, b) elements of expert @e's gate (0), up (1) or down (2) matrix are in
 * the input: per-expert tensors, or the fused Transformers 5 form. */
typedef struct {
  const WsyncTensor *t;
  guint64 base, row_stride;
} ExpertSrc;

static ExpertSrc
expert_src(Oracle *o, guint64 layer, guint which, guint64 e)
{
  static const char *const projs[3] = {"gate_proj", "up_proj", "down_proj"};
  const Model *m = o->m;
  g_autofree char *fused = g_strdup_printf("model.layers.%" G_GUINT64_FORMAT ".mlp.experts.%s",
                                           layer, which < 2 ? "gate_up_proj" : "down_proj");
  g_autofree char *single = g_strdup_printf("model.layers.%" G_GUINT64_FORMAT
                                            ".mlp.experts.%" G_GUINT64_FORMAT ".%s.weight",
                                            layer, e, projs[which]);
  ExpertSrc s;

  s.t = wsync_checkpoint_lookup(o->c.in, fused);
  if (s.t != NULL) { /* gate_up [E, 2I, H] (gate rows first), down [E, H, I] */
    if (which < 2) {
      s.base = (e * 2 * m->I + which * m->I) * m->H;
      s.row_stride = m->H;
    } else {
      s.base = e * m->H * m->I;
      s.row_stride = m->I;
    }
    return s;
  }
  s.t = input(&o->c, single);
  s.base = 0;
  s.row_stride = which < 2 ? m->H : m->I;
  return s;
}

/* determine_expert_map, linear (§4): contiguous blocks, remainder to the lowest ranks;
 * with EP the experts are whole, without it every expert is TP-sliced (§4). */
static void
expert_share(Oracle *o, guint64 *first, guint64 *count, guint64 *ip, guint64 *off)
{
  const Model *m = o->m;

  if (o->c.ep > 1) {
    guint64 base = m->E / o->c.ep, rem = m->E % o->c.ep;
    *count = base + (o->c.rank < rem);
    *first = o->c.rank * base + MIN(o->c.rank, rem);
    *ip = m->I;
    *off = 0;
  } else {
    *first = 0;
    *count = m->E;
    *ip = m->I / o->c.tp;
    *off = o->c.t * *ip;
  }
}

static char *
experts_name(Oracle *o, guint64 layer, const char *leaf)
{
  return g_strdup_printf("model.layers.%" G_GUINT64_FORMAT ".%s%s", layer, o->naming->routed,
                         leaf);
}

/* w13_weight [E_loc, 2Ip, H]: gate rows then up rows of each local expert (§4). */
static void
check_w13(Oracle *o, guint64 layer, guint64 expect_count)
{
  const Model *m = o->m;
  g_autofree char *name = experts_name(o, layer, "w13_weight");
  guint64 first, count, ip, off;
  const WsyncTensor *out;

  expert_share(o, &first, &count, &ip, &off);
  g_assert_cmpuint(count, ==, expect_count);
  guint64 shape[3] = {count, 2 * ip, m->H};
  out = output(&o->c, name, expert_src(o, layer, 0, 0).t->dtype, 3, shape);
  for (guint64 j = 0; j < count; j++)
    for (guint half = 0; half < 2; half++) {
      ExpertSrc s = expert_src(o, layer, half, first + j);
      for (guint64 r = 0; r < ip; r++)
        for (guint64 h = 0; h < m->H; h++)
          same_elem(&o->c, out, (j * 2 * ip + half * ip + r) * m->H + h, s.t,
                    s.base + (off + r) * s.row_stride + h);
    }
}

/* w2_weight [E_loc, H, Ip]: down narrowed along its input axis (§4). */
static void
check_w2(Oracle *o, guint64 layer)
{
  const Model *m = o->m;
  g_autofree char *name = experts_name(o, layer, "w2_weight");
  guint64 first, count, ip, off;
  const WsyncTensor *out;

  expert_share(o, &first, &count, &ip, &off);
  guint64 shape[3] = {count, m->H, ip};
  out = output(&o->c, name, expert_src(o, layer, 2, 0).t->dtype, 3, shape);
  for (guint64 j = 0; j < count; j++) {
    ExpertSrc s = expert_src(o, layer, 2, first + j);
    for (guint64 h = 0; h < m->H; h++)
      for (guint64 c = 0; c < ip; c++)
        same_elem(&o->c, out, (j * m->H + h) * ip + c, s.t, s.base + h * s.row_stride + off + c);
  }
}

/* The attention scale buffers: F32 scalars of 1.0 (§6), never in the kernel format
 * (buffers, not parameters, §7). */
static void
check_scales(Oracle *o, guint64 layer)
{
  static const char *const scales[] = {"_k_scale", "_v_scale", "_q_scale", "_prob_scale"};
  static const guint8 one[4] = {0x00, 0x00, 0x80, 0x3f}; /* 1.0f, little-endian */

  for (guint i = 0; i < G_N_ELEMENTS(scales); i++) {
    g_autofree char *name = g_strdup_printf("model.layers.%" G_GUINT64_FORMAT ".self_attn.attn.%s",
                                            layer, scales[i]);
    if (!o->scales || o->kernel) {
      g_assert_null(rank_lookup(o->c.rf, name));
      continue;
    }
    const WsyncTensor *out = output(&o->c, name, WSYNC_DTYPE_F32, 0, NULL);
    g_assert_cmpuint(out->nbytes, ==, 4);
    g_assert_cmpint(memcmp(out->data, one, 4), ==, 0);
  }
}

/* With EP in the releases that keep it persistent (§5), in the sharded-state format
 * (§6): `_expert_map` int32 [E], global expert -> local index or -1
 * (determine_expert_map, §4); otherwise absent. */
static void
check_expert_map(Oracle *o, guint64 layer)
{
  g_autofree char *name = experts_name(o, layer, "_expert_map");
  g_autofree char *other = g_strdup_printf("model.layers.%" G_GUINT64_FORMAT
                                           ".mlp.experts._expert_map", layer);
  guint64 first, count, ip, off, shape[1] = {o->m->E};
  const WsyncTensor *out;

  if (strcmp(name, other) != 0)
    g_assert_null(rank_lookup(o->c.rf, other));
  if (o->c.ep == 1 || o->kernel || !o->naming->map_persistent) {
    g_assert_null(rank_lookup(o->c.rf, name));
    return;
  }
  expert_share(o, &first, &count, &ip, &off);
  out = output(&o->c, name, WSYNC_DTYPE_I32, 1, shape);
  for (guint64 e = 0; e < o->m->E; e++) {
    gint32 want = e >= first && e < first + count ? (gint32)(e - first) : -1;
    guint32 le = GUINT32_TO_LE((guint32)want);
    if (memcmp(out->data + 4 * e, &le, 4) != 0)
      g_error("rank %u: %s[%" G_GUINT64_FORMAT "] is not %d", o->c.rank, name, e, want);
  }
}

static void
check_layer(Oracle *o, guint64 layer, const guint64 *expert_counts)
{
  g_autofree char *pre = g_strdup_printf("model.layers.%" G_GUINT64_FORMAT ".", layer);
  g_autofree char *in_norm = g_strconcat(pre, "input_layernorm.weight", NULL);
  g_autofree char *post_norm = g_strconcat(pre, "post_attention_layernorm.weight", NULL);
  g_autofree char *q_norm = g_strconcat(pre, "self_attn.q_norm.weight", NULL);
  g_autofree char *k_norm = g_strconcat(pre, "self_attn.k_norm.weight", NULL);
  g_autofree char *o_proj = g_strconcat(pre, "self_attn.o_proj.weight", NULL);
  g_autofree char *router = g_strconcat(pre, "mlp.gate.weight", NULL);
  g_autofree char *router_out = g_strconcat(pre, o->naming->router, NULL);
  g_autofree char *down = g_strconcat(pre, "mlp.down_proj.weight", NULL);
  g_autofree char *attn = g_strconcat(pre, "self_attn", NULL);
  g_autofree char *mlp = g_strconcat(pre, "mlp", NULL);

  check_replicated(o, in_norm);
  check_replicated(o, post_norm);
  check_qkv(&o->c, attn, "weight", o->m->nh, o->m->nkv, o->m->hd);
  check_row(&o->c, o_proj);
  check_replicated(o, q_norm);
  check_replicated(o, k_norm);
  check_scales(o, layer);
  if (o->m->dense[layer]) {
    check_gate_up(&o->c, mlp, "weight", o->m->Id);
    check_row(&o->c, down);
    return;
  }
  check_replicated_as(&o->c, router, router_out);
  check_w13(o, layer, expert_counts != NULL ? expert_counts[o->c.rank] : o->m->E);
  check_w2(o, layer);
  check_expert_map(o, layer);
}

typedef struct {
  const char *config;
  gboolean fused;
  const char *version; /* conf vllm-version */
  gboolean scales;
  guint tp, ep; /* ep 0: not given */
  const guint64 *expert_counts; /* expected E_loc per rank, or NULL for all */
  const char *format;           /* NULL: sharded-state, or kernel when ep > tp */
  const char *dtype;            /* the option dtype, or NULL for its default (auto) */
} Case;

static const char *
case_format(const Case *c)
{
  return c->format != NULL ? c->format : format_for(c->tp, c->ep);
}

/* Every tensor of one rank, and nothing else. */
static void
check_rank(const Case *c, const Model *m, WsyncCheckpoint *in, const RankFiles *rf, guint rank,
           const char *file_version, gboolean file_scales)
{
  Oracle o = {.c = {.in = in, .rf = rf, .tp = c->tp, .ep = c->ep > 0 ? c->ep : 1,
                    .rank = rank, .t = rank % c->tp},
              .m = m, .scales = file_scales,
              .naming = naming_of(file_version),
              .kernel = strcmp(case_format(c), "kernel") == 0};
  g_autofree char *world = g_strdup_printf("%u", o.c.ep > 1 ? o.c.ep : o.c.tp);
  g_autofree char *tp = g_strdup_printf("%u", o.c.tp);
  g_autofree char *ep = g_strdup_printf("%u", o.c.ep);
  g_autofree char *rk = g_strdup_printf("%u", rank);
  char era[2] = {o.naming->era, 0};

  g_assert_cmpuint(rf->files->len, >, 0);
  assert_metadata(rf, "wsync.target", "vllm");
  assert_metadata(rf, "wsync.format", case_format(c));
  assert_metadata(rf, "wsync.tp", tp);
  assert_metadata(rf, "wsync.ep", ep);
  assert_metadata(rf, "wsync.rank", rk);
  assert_metadata(rf, "wsync.world", world);
  assert_metadata(rf, "wsync.vllm-version", file_version);
  assert_metadata(rf, "wsync.vllm-era", era);

  /* A tied LM head is the embedding registered twice; the kept name is the smaller,
   * lm_head.weight (§3), and the other is not there. */
  if (m->tied) {
    check_vocab_as(&o.c, "model.embed_tokens.weight", "lm_head.weight", m->V);
    g_assert_null(rank_lookup(rf, "model.embed_tokens.weight"));
  } else {
    check_vocab(&o, "model.embed_tokens.weight");
    check_vocab(&o, "lm_head.weight");
  }
  check_replicated(&o, "model.norm.weight");
  for (guint64 l = 0; l < m->L; l++)
    check_layer(&o, l, c->expert_counts);
  /* Nothing else: every tensor of the rank was one of the above. */
  g_assert_cmpuint(rank_n_tensors(rf), ==, o.c.checked);
}

/* Synth, convert, check every rank; returns the rank directory (caller frees). */
static char *
run_case(const Case *c)
{
  const char *src = synth(c->config, c->fused);
  const char *conf = conf_dir_dtype(c->version, c->scales, c->dtype);
  g_autofree char *dst = convert_format(src, conf, case_format(c), c->tp, c->ep, -1);
  guint world = c->ep > 1 ? c->ep : c->tp;
  RankFiles ranks[64];
  Model m = read_model(c->config);
  GError *error = NULL;
  g_autoptr(WsyncCheckpoint) in = wsync_checkpoint_open(src, &error);

  g_assert_no_error(error);
  g_assert_cmpuint(open_ranks_of(dst, case_format(c), ranks, G_N_ELEMENTS(ranks)), ==, world);
  for (guint r = 0; r < world; r++)
    check_rank(c, &m, in, &ranks[r], r, c->version, c->scales);
  for (guint r = 0; r < G_N_ELEMENTS(ranks); r++)
    rank_files_clear(&ranks[r]);
  return g_steal_pointer(&dst);
}

static void
check_case(const Case *c)
{
  g_free(run_case(c));
}

/* ------------------------------------------------------------------ tests: layouts */

static void
test_tp1(void)
{
  check_case(&(Case){"tiny-qwen3-moe.json", FALSE, "latest", TRUE, 1, 0, NULL, NULL, NULL});
}

static void
test_tp2(void)
{
  check_case(&(Case){"tiny-qwen3-moe.json", FALSE, "latest", TRUE, 2, 0, NULL, NULL, NULL});
}

/* tp 4 > 2 KV heads: each KV head on two ranks; vocab 320 rows -> 80 per rank. */
static void
test_tp4_kv_replicated(void)
{
  check_case(&(Case){"tiny-qwen3-moe.json", FALSE, "latest", TRUE, 4, 0, NULL, NULL, NULL});
}

/* 8 q heads, 2 KV heads, tp 8: one q head per rank, each KV head on four ranks;
 * vocab rows 280..319 of rank 7 are 20 real rows then 20 zero rows. */
static void
test_tp8_kv_replicated(void)
{
  check_case(&(Case){"tiny-qwen3-moe-8heads.json", FALSE, "latest", TRUE, 8, 0, NULL, NULL, NULL});
}

/* 6 q heads, 2 KV heads, tp 6: replicas of 3 (not a power of two). */
static void
test_tp6_kv_replicated(void)
{
  check_case(&(Case){"tiny-qwen3-moe-6heads.json", FALSE, "latest", TRUE, 6, 0, NULL, NULL, NULL});
}

/* Tied embeddings (no lm_head anywhere) and a dense layer (gate_up_proj, down_proj). */
static void
test_tied_and_dense(void)
{
  check_case(&(Case){"tiny-qwen3-moe-tied.json", FALSE, "latest", TRUE, 2, 0, NULL, NULL, NULL});
  check_case(&(Case){"tiny-qwen3-moe-tied.json", FALSE, "latest", TRUE, 4, 0, NULL, NULL, NULL});
}

/* Transformers 5 fused experts in the input: same rank files. */
static void
test_fused_input(void)
{
  check_case(&(Case){"tiny-qwen3-moe.json", TRUE, "latest", TRUE, 2, 0, NULL, NULL, NULL});
}

/* ep 3, 8 experts: 3, 3, 2 (remainder to the lowest ranks), whole experts. */
static void
test_ep3_tp1(void)
{
  static const guint64 counts[] = {3, 3, 2};
  check_case(&(Case){"tiny-qwen3-moe.json", FALSE, "latest", TRUE, 1, 3, counts, NULL, NULL});
}

/* ep 4 over tp 2: two whole experts per rank; attention sliced by rank % 2. */
static void
test_ep4_tp2(void)
{
  static const guint64 counts[] = {2, 2, 2, 2};
  check_case(&(Case){"tiny-qwen3-moe.json", FALSE, "latest", TRUE, 2, 4, counts, NULL, NULL});
}

/* ep 6 over tp 2, 8 experts: 2, 2, 1, 1, 1, 1. */
static void
test_ep6_tp2(void)
{
  static const guint64 counts[] = {2, 2, 1, 1, 1, 1};
  check_case(&(Case){"tiny-qwen3-moe.json", FALSE, "latest", TRUE, 2, 6, counts, NULL, NULL});
}

/* Every naming era (§5): the router's alias winner and the experts' module. */
static void
test_versions(void)
{
  for (guint i = 0; i < G_N_ELEMENTS(namings); i++)
    check_case(&(Case){"tiny-qwen3-moe.json", FALSE, namings[i].version, TRUE, 2, 0, NULL, NULL, NULL});
  check_case(&(Case){"tiny-qwen3-moe.json", FALSE, "0.22.0", TRUE, 1, 0, NULL, NULL, NULL});
}

/* With ep == tp in the sharded-state format, the releases that keep the expert map
 * persistent hold it (under the era's experts module); 0.27.1 does not. */
static void
test_ep_expert_map(void)
{
  static const guint64 counts[] = {4, 4};
  check_case(&(Case){"tiny-qwen3-moe.json", FALSE, "0.18.1", TRUE, 2, 2, counts, NULL, NULL});
  check_case(&(Case){"tiny-qwen3-moe.json", FALSE, "0.24.0", TRUE, 2, 2, counts, NULL, NULL});
  check_case(&(Case){"tiny-qwen3-moe.json", FALSE, "latest", TRUE, 2, 2, counts, NULL, NULL});
}

/* The kernel format: parameters only (no scale buffers, no expert map), one file set per
 * worker named kernel-rank-{r}, the same layout as sharded-state on CUDA. */
static void
test_kernel_format(void)
{
  static const guint64 counts[] = {4, 4};
  check_case(&(Case){"tiny-qwen3-moe.json", FALSE, "latest", TRUE, 2, 0, NULL, "kernel", NULL});
  check_case(&(Case){"tiny-qwen3-moe-tied.json", FALSE, "0.18.1", TRUE, 4, 0, NULL, "kernel", NULL});
  check_case(&(Case){"tiny-qwen3-moe.json", FALSE, "0.24.0", TRUE, 2, 2, counts, "kernel", NULL});
  check_case(&(Case){"tiny-qwen3-moe.json", FALSE, "0.25.0", TRUE, 2, 2, counts, "kernel", NULL});
}

/* attn-scales = false: no scale buffers (check_scales insists they are absent). */
static void
test_attn_scales_off(void)
{
  check_case(&(Case){"tiny-qwen3-moe.json", FALSE, "latest", FALSE, 2, 0, NULL, NULL, NULL});
}

/* --rank 1 writes rank 1 only, and rank 1 is what a full run writes. */
static void
test_single_rank(void)
{
  const char *src = synth("tiny-qwen3-moe.json", FALSE);
  g_autofree char *dst = convert(src, DEFAULT_CONF, 2, 0, 1);
  Case c = {"tiny-qwen3-moe.json", FALSE, "latest", TRUE, 2, 0, NULL, NULL, NULL};
  Model m = read_model(c.config);
  GError *error = NULL;
  g_autoptr(WsyncCheckpoint) in = wsync_checkpoint_open(src, &error);
  RankFiles ranks[8];

  g_assert_no_error(error);
  g_assert_cmpuint(open_ranks(dst, ranks, G_N_ELEMENTS(ranks)), ==, 1);
  g_assert_cmpuint(ranks[0].files->len, ==, 0);
  check_rank(&c, &m, in, &ranks[1], 1, "latest", TRUE);
  for (guint r = 0; r < G_N_ELEMENTS(ranks); r++)
    rank_files_clear(&ranks[r]);
}

/* ------------------------------------------------------------------ tests: round trips */

/* vllm rank files -> hf with @conf, equal to the original checkpoint. */
static void
round_trip(const char *src, const char *rank_dir, const char *conf)
{
  g_autofree char *hf = g_strdup_printf("%s/hf-%u", work_dir, n_made++);
  const char *pdir = test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR");
  Run r = run_wsync("convert", rank_dir, hf, "--conf-dir", conf, "--plugin-dir", pdir,
                    "--target", "hf", NULL);

  if (r.status != 0)
    g_error("convert %s -> hf: exit %d\n%s", rank_dir, r.status, r.err);
  run_clear(&r);
  r = run_wsync("verify", src, hf, "--conf-dir", conf, "--plugin-dir", pdir, NULL);
  if (r.status != 0)
    g_error("verify %s %s: exit %d\n%s%s", src, hf, r.status, r.out, r.err);
  run_clear(&r);
}

static void
test_round_trip_tp2(void)
{
  Case c = {"tiny-qwen3-moe.json", FALSE, "latest", TRUE, 2, 0, NULL, NULL, NULL};
  g_autofree char *dst = run_case(&c);

  round_trip(synth(c.config, FALSE), dst, DEFAULT_CONF);
}

static void
test_round_trip_ep(void)
{
  static const guint64 counts[] = {3, 3, 2};
  Case c = {"tiny-qwen3-moe.json", FALSE, "latest", TRUE, 1, 3, counts, NULL, NULL};
  g_autofree char *dst = run_case(&c);
  Case c2 = {"tiny-qwen3-moe.json", FALSE, "latest", TRUE, 2, 4, NULL, NULL, NULL};
  g_autofree char *dst2 = NULL;

  round_trip(synth(c.config, FALSE), dst, DEFAULT_CONF);
  dst2 = convert(synth(c2.config, FALSE), DEFAULT_CONF, 2, 4, -1);
  round_trip(synth(c2.config, FALSE), dst2, DEFAULT_CONF);
}

/* Tied embeddings and a dense layer come back too; tp 8 with KV replication (each KV
 * head read from one of its copies). */
static void
test_round_trip_tied_and_replicated(void)
{
  g_autofree char *tied = convert(synth("tiny-qwen3-moe-tied.json", FALSE), DEFAULT_CONF, 4, 0, -1);
  g_autofree char *kv = convert(synth("tiny-qwen3-moe-8heads.json", FALSE), DEFAULT_CONF, 8, 0, -1);

  round_trip(synth("tiny-qwen3-moe-tied.json", FALSE), tied, DEFAULT_CONF);
  round_trip(synth("tiny-qwen3-moe-8heads.json", FALSE), kv, DEFAULT_CONF);
}

/* Files written for vLLM 0.18.1 without scales read back under the default options:
 * the convention recorded in the files wins. */
static void
test_round_trip_other_convention(void)
{
  const char *src = synth("tiny-qwen3-moe.json", FALSE);
  g_autofree char *dst = convert(src, conf_dir("0.18.1", FALSE), 2, 0, -1);
  RankFiles ranks[4];

  open_ranks(dst, ranks, G_N_ELEMENTS(ranks));
  assert_metadata(&ranks[0], "wsync.vllm-version", "0.18.1");
  assert_metadata(&ranks[0], "wsync.attn-scales", "false");
  for (guint r = 0; r < G_N_ELEMENTS(ranks); r++)
    rank_files_clear(&ranks[r]);
  round_trip(src, dst, DEFAULT_CONF);
  /* with EP, whose _expert_map buffers are fills and read back as nothing */
  g_free(dst);
  dst = convert(src, conf_dir("0.18.1", TRUE), 2, 2, -1);
  round_trip(src, dst, DEFAULT_CONF);
  /* the kernel format with more EP ranks than TP ranks */
  g_free(dst);
  dst = convert(src, conf_dir("0.24.0", TRUE), 1, 3, -1);
  round_trip(src, dst, DEFAULT_CONF);
}

/* ------------------------------------------------------------------ tests: plan, refusals */

/* A sharded-state plan without the attention scales says what its files lack and that
 * vLLM's sharded_state loader refuses them (vllm-layouts.md §5); with them, nothing. */
static void
test_plan_attn_scales_off(void)
{
  const char *src = synth("tiny-qwen3-moe.json", FALSE);
  const char *pdir = test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR");
  Run r = run_wsync("plan", src, "--conf-dir", conf_dir("0.18.1", FALSE), "--plugin-dir", pdir,
                    "--target", "vllm", "--tp", "2", NULL);

  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, "note: attn-scales = false: these files lack each attention layer's "
                    "_k_scale, _v_scale, _q_scale and _prob_scale, which vLLM's sharded_state "
                    "loader requires (it refuses the files with \"Missing keys\"); they serve "
                    "only a loader that does not expect them\n");
  run_clear(&r);
  r = run_wsync("plan", src, "--conf-dir", conf_dir("0.18.1", TRUE), "--plugin-dir", pdir,
                "--target", "vllm", "--tp", "2", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_null(strstr(r.out, "attn-scales = false"));
  run_clear(&r);
}

static void
test_plan_json(void)
{
  const char *src = synth("tiny-qwen3-moe.json", FALSE);
  const char *pdir = test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR");
  Run r = run_wsync("plan", src, "--conf-dir", DEFAULT_CONF, "--plugin-dir", pdir, "--target",
                    "vllm", "--tp", "2", "--json", NULL);
  g_autoptr(JsonParser) parser = json_parser_new();
  GError *error = NULL;

  if (r.status != 0)
    g_error("plan: exit %d\n%s", r.status, r.err);
  json_parser_load_from_data(parser, r.out, -1, &error);
  g_assert_no_error(error);
  assert_has(r.out, "\"model.layers.0.self_attn.qkv_proj.weight\"");
  assert_has(r.out, "\"model.layers.1.mlp.experts.routed_experts.w13_weight\"");
  assert_has(r.out, "\"model.layers.1.self_attn.attn._prob_scale\"");
  assert_has(r.out, "vocabulary padding to a multiple of 64");
  assert_has(r.out, "vLLM attention scale buffer, 1.0");
  run_clear(&r);
}

/* A refused conversion: exit 2, the one line, and no DST. */
static void
assert_refused(const char *config, const char *tp, const char *ep, const char *message)
{
  const char *src = synth(config, FALSE);
  const char *pdir = test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR");
  g_autofree char *dst = g_strdup_printf("%s/refused-%u", work_dir, n_made++);
  /* more EP ranks than TP ranks: the kernel format, the only one that holds them */
  const char *format = ep != NULL && atoi(ep) > atoi(tp) ? "kernel" : "sharded-state";
  Run r = ep == NULL ? run_wsync("convert", src, dst, "--conf-dir", DEFAULT_CONF, "--plugin-dir",
                                 pdir, "--target", "vllm", "--tp", tp, NULL)
                     : run_wsync("convert", src, dst, "--conf-dir", DEFAULT_CONF, "--plugin-dir",
                                 pdir, "--target", "vllm", "--format", format, "--tp", tp,
                                 "--ep", ep, NULL);

  g_assert_cmpint(r.status, ==, 2);
  assert_has(r.err, message);
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
  run_clear(&r);
  /* plan refuses the same way */
  r = ep == NULL ? run_wsync("plan", src, "--conf-dir", DEFAULT_CONF, "--plugin-dir", pdir,
                             "--target", "vllm", "--tp", tp, NULL)
                 : run_wsync("plan", src, "--conf-dir", DEFAULT_CONF, "--plugin-dir", pdir,
                             "--target", "vllm", "--format", format, "--tp", tp, "--ep", ep,
                             NULL);
  g_assert_cmpint(r.status, ==, 2);
  assert_has(r.err, message);
  run_clear(&r);
}

/* 6 q heads and 384 padded vocabulary rows divide by 3; 2 KV heads do not. */
static void
test_refuse_kv_heads(void)
{
  assert_refused("tiny-qwen3-moe-6heads.json", "3", NULL,
                 "tp 3 does not divide the 2 units of 16 rows (32 rows in all) of "
                 "model.layers.0.self_attn.k_proj.weight (replicating needs tp to be a "
                 "multiple of 2)");
}

static void
test_refuse_vocab(void)
{
  assert_refused("tiny-qwen3-moe.json", "3", NULL,
                 "tp 3 does not divide the padded vocabulary of 320 rows of "
                 "model.embed_tokens.weight");
  /* tp 6 divides everything of this model but its 320 padded vocabulary rows */
  assert_refused("tiny-qwen3-moe-6heads-v300.json", "6", NULL,
                 "tp 6 does not divide the padded vocabulary of 320 rows of "
                 "model.embed_tokens.weight");
}

static void
test_refuse_ep(void)
{
  assert_refused("tiny-qwen3-moe.json", "2", "3", "ep 3 is not a multiple of tp 2");
}

/* ep 16 > 8 experts: some rank would hold none. */
static void
test_refuse_ep_beyond_experts(void)
{
  assert_refused("tiny-qwen3-moe.json", "1", "16",
                 "ep 16 is more than the 8 experts of model.layers.0.mlp.experts: rank 8 "
                 "would hold none");
}

/* Two conversions of one checkpoint in the same layout, @narrow's in @dtype (F16 or BF16)
 * and @wide's in F32: every tensor but the F32 attention scales must be the F32 one
 * rounded to nearest even, and the files of @narrow record the dtype. */
static void
assert_rounded(const char *narrow, const char *wide, const char *format, guint world,
               WsyncDtype dtype)
{
  RankFiles a[16], b[16];

  g_assert_cmpuint(open_ranks_of(narrow, format, a, G_N_ELEMENTS(a)), ==, world);
  g_assert_cmpuint(open_ranks_of(wide, format, b, G_N_ELEMENTS(b)), ==, world);
  for (guint r = 0; r < world; r++) {
    g_assert_cmpuint(rank_n_tensors(&a[r]), ==, rank_n_tensors(&b[r]));
    assert_metadata(&a[r], "wsync.dtype", wsync_dtype_name(dtype));
    for (guint f = 0; f < b[r].files->len; f++) {
      WsyncCheckpoint *ck = b[r].files->pdata[f];
      for (guint i = 0; i < wsync_checkpoint_n_tensors(ck); i++) {
        const WsyncTensor *w = wsync_checkpoint_tensor(ck, i);
        const WsyncTensor *n = rank_lookup(&a[r], w->name);
        g_assert_nonnull(n);
        g_assert_cmpuint(n->numel, ==, w->numel);
        if (g_str_has_suffix(w->name, "_scale")) { /* F32 buffers in every dtype (§6) */
          g_assert_cmpint(n->dtype, ==, WSYNC_DTYPE_F32);
          g_assert_cmpmem(n->data, n->nbytes, w->data, w->nbytes);
          continue;
        }
        g_assert_cmpint(w->dtype, ==, WSYNC_DTYPE_F32);
        if (n->dtype != dtype)
          g_error("rank %u: %s is %s, want %s", r, n->name, wsync_dtype_name(n->dtype),
                  wsync_dtype_name(dtype));
        for (guint64 e = 0; e < w->numel && dtype == WSYNC_DTYPE_BF16; e++)
          if (!elem_ok(n, e, w, e))
            g_error("rank %u: %s element %" G_GUINT64_FORMAT " is not the F32 one rounded",
                    r, n->name, e);
      }
    }
  }
  for (guint r = 0; r < G_N_ELEMENTS(a); r++) {
    rank_files_clear(&a[r]);
    rank_files_clear(&b[r]);
  }
}

/* `wsync verify A B` exits @status. */
static void
assert_verify(const char *a, const char *b, int status)
{
  Run r = run_wsync("verify", a, b, "--conf-dir", DEFAULT_CONF, "--plugin-dir",
                    test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR"), NULL);

  if (r.status != status)
    g_error("verify %s %s: exit %d, want %d\n%s%s", a, b, r.status, status, r.out, r.err);
  run_clear(&r);
}

/* A float32 model (config torch_dtype float32): vLLM's default --dtype auto builds it in
 * bfloat16 (docs/vllm.md §2 "Dtype on load"), so by default the files hold BF16, each
 * element the F32 one rounded to nearest even, in both formats, and say so; dtype
 * "float32" (a deployment started with --dtype float32) keeps F32, checked element by
 * element by the oracle.  Read back to hf, the F32 files are bit-exact, the BF16 ones
 * are the rounded values widened. */
static void
test_dtype_auto_float32_model(void)
{
  static const char *const config = "tiny-qwen3-moe-odd-f32.json";
  const char *src = synth(config, FALSE);
  const char *f32_conf = conf_dir_dtype("latest", TRUE, "float32");
  static const guint tps[] = {2, 2}, eps[] = {0, 4};
  static const guint64 counts[] = {2, 2, 2, 2};

  check_case(&(Case){config, FALSE, "latest", TRUE, 2, 0, NULL, NULL, "float32"});
  check_case(&(Case){config, FALSE, "latest", TRUE, 2, 4, counts, NULL, "float32"});
  for (guint i = 0; i < G_N_ELEMENTS(tps); i++) {
    const char *format = format_for(tps[i], eps[i]);
    g_autofree char *bf16 = convert_format(src, DEFAULT_CONF, format, tps[i], eps[i], -1);
    g_autofree char *f32 = convert_format(src, f32_conf, format, tps[i], eps[i], -1);
    assert_rounded(bf16, f32, format, eps[i] > 1 ? eps[i] : tps[i], WSYNC_DTYPE_BF16);
    if (strcmp(format, "sharded-state") == 0) {
      g_autofree char *back16 = g_strdup_printf("%s/back-%u", work_dir, n_made++);
      g_autofree char *back32 = g_strdup_printf("%s/back-%u", work_dir, n_made++);
      Run r = run_wsync("convert", bf16, back16, "--conf-dir", DEFAULT_CONF, "--plugin-dir",
                        test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR"), "--target", "hf", NULL);
      g_assert_cmpint(r.status, ==, 0);
      run_clear(&r);
      r = run_wsync("convert", f32, back32, "--conf-dir", DEFAULT_CONF, "--plugin-dir",
                    test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR"), "--target", "hf", NULL);
      g_assert_cmpint(r.status, ==, 0);
      run_clear(&r);
      assert_verify(src, back32, 0);
      assert_verify(src, back16, 1);
      /* the BF16 files read back widened: converting them again gives the same files */
      g_autofree char *again = convert_format(back16, DEFAULT_CONF, format, tps[i], eps[i], -1);
      assert_rounded(again, f32, format, tps[i], WSYNC_DTYPE_BF16);
    }
  }
  /* the plan says why */
  Run r = run_wsync("plan", src, "--conf-dir", DEFAULT_CONF, "--plugin-dir",
                    test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR"), "--target", "vllm", "--tp", "2",
                    NULL);
  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, "dtype auto: vLLM's --dtype auto builds a float32 model in bfloat16 (on a "
                    "GPU with BF16 and on vLLM-Ascend, docs/vllm.md §2), so the files hold its "
                    "parameters in BF16; for a deployment started with --dtype float32 set "
                    "dtype = \"float32\" (plugin \"vllm\"), on a GPU without BF16 dtype = "
                    "\"float16\"");
  run_clear(&r);
}

/* An explicit dtype other than the model's: a BF16 model for --dtype float32 is widened
 * exactly (and reads back bit-exact), for --dtype half rounded to F16; the files record
 * it.  A value vLLM's --dtype does not take is refused with the file and line. */
static void
test_dtype_explicit(void)
{
  static const char *const config = "tiny-qwen3-moe.json";
  const char *src = synth(config, FALSE);
  g_autofree char *bf16 = convert(src, DEFAULT_CONF, 2, 0, -1);
  g_autofree char *f32 = convert(src, conf_dir_dtype("latest", TRUE, "float32"), 2, 0, -1);
  g_autofree char *f16 = convert(src, conf_dir_dtype("latest", TRUE, "half"), 2, 0, -1);
  g_autofree char *back = g_strdup_printf("%s/back-%u", work_dir, n_made++);
  g_autofree char *bad = new_dir("conf");
  g_autofree char *bad_out = g_strdup_printf("%s/refused-%u", work_dir, n_made++);
  RankFiles a[2], b[2];
  Run r;

  /* BF16 widened to F32: exact, every element; the model's own dtype is not recorded */
  g_assert_cmpuint(open_ranks(f32, a, 2), ==, 2);
  g_assert_cmpuint(open_ranks(bf16, b, 2), ==, 2);
  for (guint k = 0; k < 2; k++) {
    assert_metadata(&a[k], "wsync.dtype", "F32");
    assert_metadata(&b[k], "wsync.dtype", NULL);
    for (guint f = 0; f < b[k].files->len; f++) {
      WsyncCheckpoint *ck = b[k].files->pdata[f];
      for (guint i = 0; i < wsync_checkpoint_n_tensors(ck); i++) {
        const WsyncTensor *narrow = wsync_checkpoint_tensor(ck, i);
        const WsyncTensor *wide = rank_lookup(&a[k], narrow->name);
        g_assert_nonnull(wide);
        g_assert_cmpint(wide->dtype, ==, WSYNC_DTYPE_F32);
        for (guint64 e = 0; e < wide->numel; e++)
          g_assert_true(elem_ok(wide, e, narrow, e));
      }
    }
  }
  for (guint k = 0; k < 2; k++) {
    rank_files_clear(&a[k]);
    rank_files_clear(&b[k]);
  }
  r = run_wsync("convert", f32, back, "--conf-dir", DEFAULT_CONF, "--plugin-dir",
                test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR"), "--target", "hf", NULL);
  g_assert_cmpint(r.status, ==, 0);
  run_clear(&r);
  assert_verify(src, back, 0);
  /* half: F16 files that say so */
  g_assert_cmpuint(open_ranks(f16, a, 2), ==, 2);
  for (guint k = 0; k < 2; k++) {
    assert_metadata(&a[k], "wsync.dtype", "F16");
    g_assert_cmpint(rank_lookup(&a[k], "model.embed_tokens.weight")->dtype, ==,
                    WSYNC_DTYPE_F16);
    g_assert_cmpint(rank_lookup(&a[k], "model.layers.0.self_attn.attn._k_scale")->dtype, ==,
                    WSYNC_DTYPE_F32);
    rank_files_clear(&a[k]);
  }
  /* not a --dtype value */
  g_free(test_write(bad, "10-test.conf", "plugin \"qwen3_moe\" {}\nplugin \"vllm\" {\n"
                                         "  dtype = \"int8\"\n}\n"));
  r = run_wsync("convert", src, bad_out, "--conf-dir", bad, "--plugin-dir",
                test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR"), "--target", "vllm", NULL);
  g_assert_cmpint(r.status, ==, 2);
  assert_has(r.err, "10-test.conf:3: dtype must be auto, bfloat16, float16, half, float32 or "
                    "float (the deployment's vLLM --dtype), not \"int8\"\n");
  g_assert_false(g_file_test(bad_out, G_FILE_TEST_EXISTS));
  run_clear(&r);
}

/* tp 8 > 6 experts: vLLM's Qwen3-MoE block refuses it at init, EP or not (docs/vllm.md
 * §4), although tp divides everything else of this model. */
static void
test_refuse_tp_beyond_experts(void)
{
  static const char *const eps[] = {NULL, "8", "16"};

  for (guint i = 0; i < G_N_ELEMENTS(eps); i++)
    assert_refused("tiny-qwen3-moe-e6.json", "8", eps[i],
                   "tp 8 is more than the 6 experts of model.layers.1.mlp.experts: vLLM "
                   "refuses a tensor-parallel size greater than the number of experts");
}

static void
test_bad_version(void)
{
  static const struct {
    const char *value, *why;
  } bad[] = {
      {"0.22.1rc1", "vllm-version must be \"latest\" or a vLLM release number like \"0.24.0\" "
                    "(no rc/post suffix), from 0.17.0 on"},
      {"0.22.1.post1", "vllm-version must be \"latest\" or a vLLM release number"},
      {"", "vllm-version must be \"latest\" or a vLLM release number"},
      {"0", "vllm-version must be \"latest\" or a vLLM release number"},
      {"newest", "vllm-version must be \"latest\" or a vLLM release number"},
      {"0.16.9", "vLLM before 0.17.0 is not in the naming table (docs/vllm.md §5)"},
  };
  const char *pdir = test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR");

  for (guint i = 0; i < G_N_ELEMENTS(bad); i++) {
    g_autofree char *conf = new_dir("badconf");
    g_autofree char *text = g_strdup_printf("plugin \"vllm\" {\n  vllm-version = \"%s\"\n}\n",
                                            bad[i].value);
    g_autofree char *path = test_write(conf, "20-vllm.conf", text);
    g_autofree char *want = g_strdup_printf("%s:2: %s", path, bad[i].why);
    g_autofree char *tail = g_strdup_printf(", not \"%s\"\n", bad[i].value);
    Run r = run_wsync("plugins", "--conf-dir", conf, "--plugin-dir", pdir, NULL);
    g_assert_cmpint(r.status, ==, 2);
    assert_has(r.err, want);
    g_assert_true(g_str_has_suffix(r.err, tail));
    run_clear(&r);
  }
}

/* Accepted spellings of a release: with a "v", two to four parts. */
static void
test_version_spellings(void)
{
  static const char *const good[] = {"v0.24.0", "0.18", "0.18.1", "0.10.1.1", "0.27.1", "latest",
                                     "1.0.0"};
  const char *src = synth("tiny-qwen3-moe.json", FALSE);
  const char *pdir = test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR");

  for (guint i = 0; i < G_N_ELEMENTS(good); i++) {
    Run r = run_wsync("plan", src, "--conf-dir", conf_dir(good[i], TRUE), "--plugin-dir", pdir,
                      "--target", "vllm", NULL);
    /* 0.10.1.1 is before the table */
    if (strcmp(good[i], "0.10.1.1") == 0) {
      g_assert_cmpint(r.status, ==, 2);
      assert_has(r.err, "vLLM before 0.17.0 is not in the naming table");
    } else {
      if (r.status != 0)
        g_error("vllm-version %s: exit %d: %s", good[i], r.status, r.err);
    }
    run_clear(&r);
  }
}

/* The plan says which format and naming era it uses, in text and --json; a release the
 * table marks as unverified is used with a note saying so. */
static void
test_plan_format_and_era(void)
{
  const char *src = synth("tiny-qwen3-moe.json", FALSE);
  const char *pdir = test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR");
  Run r = run_wsync("plan", src, "--conf-dir", DEFAULT_CONF, "--plugin-dir", pdir, "--target",
                    "vllm", "--tp", "2", NULL);

  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, "target vllm, format sharded-state, tp 2, ep 1, 2 ranks\n");
  assert_has(r.out, " metadata wsync.attn-scales=true wsync.ep=1 wsync.format=sharded-state "
                    "wsync.rank=0 wsync.target=vllm wsync.tp=2 wsync.vllm-era=D "
                    "wsync.vllm-version=latest wsync.world=2\n");
  assert_has(r.out, "note: format sharded-state: load with `vllm serve DIR --load-format "
                    "sharded_state --tensor-parallel-size 2`\n");
  assert_has(r.out, "note: vllm-version latest: naming era D of releases 0.27.1 to 0.27.x");
  run_clear(&r);
  r = run_wsync("plan", src, "--conf-dir", conf_dir("0.20.0", TRUE), "--plugin-dir", pdir,
                "--target", "vllm", "--format", "kernel", "--json", NULL);
  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, "\"format\" : \"kernel\"");
  assert_has(r.out, "\"wsync.vllm-era\" : \"B\"");
  assert_has(r.out, "format kernel: each rank's files are a live weight update in kernel "
                    "format, every tensor a parameter in the layout the kernels run on, "
                    "copied by model.get_parameter(name).copy_ as reload_weights with "
                    "is_checkpoint_format=False (vLLM #32133 on, through collective_rpc) and "
                    "wsync_load (wsync.vllm_worker) do; start_weight_update takes "
                    "is_checkpoint_format=false only in vLLM #39212 to #44353 and "
                    "vLLM-Ascend #9152 to #12876 (docs/vllm.md §7)\"");
  assert_has(r.out, "vllm-version 0.20.0: naming era B of releases 0.20.x (");
  assert_has(r.out, "; not verified: the era B release range is low confidence");
  run_clear(&r);
  /* era C: the reference note rates its release range medium-high, not verified */
  r = run_wsync("plan", src, "--conf-dir", conf_dir("0.22.0", TRUE), "--plugin-dir", pdir,
                "--target", "vllm", "--tp", "2", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.err, ==, "");
  assert_has(r.out, "note: vllm-version 0.22.0: naming era C of releases 0.21.0 to 0.23.x "
                    "(FusedMoE.runner is a module holding the router); not verified: the era C "
                    "release range is medium-high confidence: vllm-ascend #11081 keeps v0.23.0 "
                    "on that path, and the releases before 0.24.0 map to their eras with "
                    "medium or low confidence (docs/vllm.md §5)\n");
  run_clear(&r);
  /* 0.25.0 without EP: era D names, with the note that the release was not checked */
  r = run_wsync("plan", src, "--conf-dir", conf_dir("0.25.0", TRUE), "--plugin-dir", pdir,
                "--target", "vllm", "--tp", "2", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.err, ==, "");
  assert_has(r.out, "wsync.vllm-era=D wsync.vllm-version=0.25.0 ");
  assert_has(r.out, "note: vllm-version 0.25.0: naming era D of releases 0.25.0 to 0.26.x (");
  assert_has(r.out, "; not verified: 0.25.0 to 0.27.0 were not checked; whether they keep "
                    "the expert map persistent is not known (docs/vllm.md §5)\n");
  run_clear(&r);
  /* a row of one release ("of releases 0.27.0" was the note) */
  r = run_wsync("plan", src, "--conf-dir", conf_dir("0.27.0", TRUE), "--plugin-dir", pdir,
                "--target", "vllm", "--tp", "2", NULL);
  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, "note: vllm-version 0.27.0: naming era D of release 0.27.0 (");
  run_clear(&r);
  /* the verified releases carry no such note */
  r = run_wsync("plan", src, "--conf-dir", conf_dir("0.24.0", TRUE), "--plugin-dir", pdir,
                "--target", "vllm", "--tp", "2", NULL);
  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, "note: vllm-version 0.24.0: naming era D of releases 0.24.x (");
  g_assert_null(strstr(r.out, "not verified"));
  run_clear(&r);
}

/* convert --help names each format's consumer and shows the release table of the
 * loaded vllm plugin. */
static void
test_help(void)
{
  const char *pdir = test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR");
  Run r = run_wsync("convert", "--help", "--conf-dir", DEFAULT_CONF, "--plugin-dir", pdir, NULL);

  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.err, ==, "");
  assert_has(r.out, "  -f, --format=F ");
  assert_has(r.out, "\nTargets (of the plugins the configuration selects):\n"
                    "  hf: the layout the model's checkpoints are published in\n");
  assert_has(r.out, "  vllm (formats sharded-state, kernel): each vLLM TP/EP rank's tensors "
                    "under vLLM's names\n"
                    "    --format sharded-state (the default): for `vllm serve DIR "
                    "--load-format\n      sharded_state --tensor-parallel-size N`;");
  assert_has(r.out, "    --format kernel: for a live weight update in kernel format, "
                    "copied by\n      get_parameter(name).copy_ (reload_weights with "
                    "is_checkpoint_format=False,\n      or wsync_load; start_weight_update "
                    "takes is_checkpoint_format=false only\n      in vLLM #39212 to #44353 "
                    "and vLLM-Ascend #9152 to #12876);\n");
  assert_has(r.out, "    vllm-version (conf.d, plugin \"vllm\") chooses the naming era:\n"
                    "      0.17 to 0.19.x     era A  router mlp.experts._gate.weight  "
                    "(not verified)\n"
                    "      0.20.x             era B  router mlp.gate.weight  (not verified)\n"
                    "      0.21.0 to 0.23.x   era C  router mlp.experts.runner.gate.weight  "
                    "(not verified)\n"
                    "      0.24.x             era D  router mlp.experts.gate.weight\n"
                    "      0.25.0 to 0.26.x   era D  router mlp.experts.gate.weight  "
                    "(not verified)\n"
                    "      0.27.0             era D  router mlp.experts.gate.weight  "
                    "(not verified)\n"
                    "      0.27.1 to 0.27.x   era D  router mlp.experts.gate.weight\n"
                    "      0.28.0 and later   era D  router mlp.experts.gate.weight  "
                    "(not verified)\n"
                    "      latest (default)   as 0.27.1\n");
  /* vLLM-Ascend's own MoE classes name the router and the shared expert
   * (docs/vllm-ascend.md §2 "Names by release") */
  assert_has(r.out, "      0.21.0 to 0.23.x   era A  (not verified)\n"
                    "        router mlp.experts._gate.weight, shared expert "
                    "mlp.experts._shared_experts.*\n"
                    "      0.24.x             era D-unwrapped\n"
                    "        router mlp.experts._gate.weight, shared expert "
                    "mlp.experts._shared_experts.*\n");
  assert_has(r.out, "      0.27.0             no vLLM-Ascend release targets it: refused\n"
                    "      0.27.1 to 0.27.x   era D\n"
                    "        router mlp.experts._gate.weight, shared expert "
                    "mlp.experts._shared_experts._layer.*\n");
  run_clear(&r);
}

/* sharded_state reads files by TP rank only: ep > tp cannot be expressed; a release
 * whose expert map is unknown cannot be given the exact key set with EP. */
static void
test_refuse_sharded_state(void)
{
  const char *src = synth("tiny-qwen3-moe.json", FALSE);
  const char *pdir = test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR");
  g_autofree char *dst = g_strdup_printf("%s/refused-%u", work_dir, n_made++);
  Run r = run_wsync("convert", src, dst, "--conf-dir", DEFAULT_CONF, "--plugin-dir", pdir,
                    "--target", "vllm", "--tp", "2", "--ep", "4", NULL);

  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==,
                  "wsync: --format sharded-state cannot hold ep 4 > tp 2: vLLM's sharded_state "
                  "loader reads files by TP rank only, so the experts of EP ranks 2 to 3 would "
                  "never load (use --format kernel, for a live weight update)\n");
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
  run_clear(&r);
  r = run_wsync("convert", src, dst, "--conf-dir", conf_dir("0.26.0", TRUE), "--plugin-dir",
                pdir, "--target", "vllm", "--tp", "2", "--ep", "2", NULL);
  g_assert_cmpint(r.status, ==, 2);
  assert_has(r.err, "vllm-version 0.26.0: whether its sharded_state files hold the expert map "
                    "is not known");
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
  run_clear(&r);
  /* 0.25 too: the reference note leaves its expert map unverified */
  r = run_wsync("convert", src, dst, "--conf-dir", conf_dir("0.25.0", TRUE), "--plugin-dir",
                pdir, "--target", "vllm", "--tp", "2", "--ep", "2", NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==,
                  "wsync: vllm-version 0.25.0: whether its sharded_state files hold the expert "
                  "map is not known (releases 0.25.0 to 0.26.x were not checked, docs/vllm.md "
                  "§5); with --ep use a verified release or --format kernel\n");
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
  run_clear(&r);
  /* a row of one release says so ("releases 0.27.0 were" was the message) */
  r = run_wsync("convert", src, dst, "--conf-dir", conf_dir("0.27.0", TRUE), "--plugin-dir",
                pdir, "--target", "vllm", "--tp", "2", "--ep", "2", NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==,
                  "wsync: vllm-version 0.27.0: whether its sharded_state files hold the expert "
                  "map is not known (release 0.27.0 was not checked, docs/vllm.md §5); with "
                  "--ep use a verified release or --format kernel\n");
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
  run_clear(&r);
  /* without EP the same releases are fine, and so is their kernel format with EP */
  g_free(convert_format(src, conf_dir("0.26.0", TRUE), "sharded-state", 2, 0, -1));
  g_free(convert_format(src, conf_dir("0.26.0", TRUE), "kernel", 2, 2, -1));
  g_free(convert_format(src, conf_dir("0.25.0", TRUE), "sharded-state", 2, 0, -1));
  g_free(convert_format(src, conf_dir("0.25.0", TRUE), "kernel", 2, 2, -1));
}

/* --format names one of the target's formats; the Hugging Face targets have none. */
static void
test_refuse_format(void)
{
  const char *src = synth("tiny-qwen3-moe.json", FALSE);
  const char *pdir = test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR");
  Run r = run_wsync("plan", src, "--conf-dir", DEFAULT_CONF, "--plugin-dir", pdir, "--target",
                    "vllm", "--format", "gguf", NULL);

  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==,
                  "wsync: --format \"gguf\" is not one of target vllm's formats "
                  "(sharded-state, kernel)\n");
  run_clear(&r);
  r = run_wsync("plan", src, "--conf-dir", DEFAULT_CONF, "--plugin-dir", pdir, "--target", "hf",
                "--format", "kernel", NULL);
  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==, "wsync: --format kernel: target hf has no formats to choose from\n");
  run_clear(&r);
}

/* Rank files of an older wsync (no wsync.format) carry names no vLLM loads: refused,
 * naming the file. */
static void
test_refuse_legacy_rank_files(void)
{
  const char *src = synth("tiny-qwen3-moe.json", FALSE);
  const char *pdir = test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR");
  g_autofree char *dir = new_dir("legacy");
  g_autofree char *file = g_build_filename(dir, "model-rank-0-part-0.safetensors", NULL);
  g_autofree char *config = g_build_filename(src, "config.json", NULL);
  g_autofree char *config_copy = g_build_filename(dir, "config.json", NULL);
  /* a header-only rank file: {"__metadata__": {...}} padded to 8 bytes */
  const char *header = "{\"__metadata__\":{\"wsync.target\":\"vllm\",\"wsync.tp\":\"1\","
                       "\"wsync.ep\":\"1\",\"wsync.rank\":\"0\",\"wsync.vllm-version\":"
                       "\"0.22.1\"}}";
  gsize len = strlen(header), padded = (len + 7) / 8 * 8;
  g_autofree guint8 *bytes = g_malloc(8 + padded);
  guint64 n = GUINT64_TO_LE(padded);
  Run r;

  memcpy(bytes, &n, 8);
  memset(bytes + 8, ' ', padded);
  memcpy(bytes + 8, header, len);
  g_assert_true(g_file_set_contents(file, (char *)bytes, (gssize)(8 + padded), NULL));
  test_copy(config, config_copy);
  r = run_wsync("plan", dir, "--conf-dir", DEFAULT_CONF, "--plugin-dir", pdir, "--target", "hf",
                NULL);
  g_assert_cmpint(r.status, ==, 3);
  g_autofree char *want = g_strdup_printf(
      "wsync: %s: a vllm rank file of an older wsync, without wsync.format: its names load in "
      "no vLLM release; convert again from the Hugging Face checkpoint\n",
      file);
  g_assert_cmpstr(r.err, ==, want);
  run_clear(&r);
}

/* The shipped conf.d file parses and gives the defaults. */
static void
test_shipped_conf(void)
{
  const char *pdir = test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR");
  g_autofree char *conf = new_dir("shipped");
  g_autofree char *shipped = g_test_build_filename(G_TEST_DIST, "..", "conf.d", "20-vllm.conf",
                                                   NULL);
  g_autofree char *copy = g_build_filename(conf, "20-vllm.conf", NULL);
  Run r;

  test_copy(shipped, copy);
  r = run_wsync("plugins", "--conf-dir", conf, "--plugin-dir", pdir, NULL);
  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, "vllm  active");
  assert_has(r.out, "vLLM per-rank layouts: sharded_state checkpoints, live updates");
  assert_has(r.out, "    converter      vllm                     priority 0  serves vllm  "
                    "formats sharded-state, kernel\n");
  assert_has(r.out, "    converter      vllm-ascend              priority 0  serves "
                    "vllm-ascend  formats sharded-state, kernel\n");
  run_clear(&r);
}

int
main(int argc, char **argv)
{
  int status;

  g_test_init(&argc, &argv, NULL);
  work_dir = test_tmpdir();
  conf_dirs = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
  synth_dirs = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);

  g_test_add_func("/vllm/layout/tp1", test_tp1);
  g_test_add_func("/vllm/layout/tp2", test_tp2);
  g_test_add_func("/vllm/layout/tp4-kv-replicated", test_tp4_kv_replicated);
  g_test_add_func("/vllm/layout/tp8-kv-replicated", test_tp8_kv_replicated);
  g_test_add_func("/vllm/layout/tp6-kv-replicated", test_tp6_kv_replicated);
  g_test_add_func("/vllm/layout/tied-and-dense", test_tied_and_dense);
  g_test_add_func("/vllm/layout/fused-input", test_fused_input);
  g_test_add_func("/vllm/layout/ep3-tp1", test_ep3_tp1);
  g_test_add_func("/vllm/layout/ep4-tp2", test_ep4_tp2);
  g_test_add_func("/vllm/layout/ep6-tp2", test_ep6_tp2);
  g_test_add_func("/vllm/layout/versions", test_versions);
  g_test_add_func("/vllm/layout/ep-expert-map", test_ep_expert_map);
  g_test_add_func("/vllm/layout/kernel-format", test_kernel_format);
  g_test_add_func("/vllm/layout/attn-scales-off", test_attn_scales_off);
  g_test_add_func("/vllm/layout/single-rank", test_single_rank);
  g_test_add_func("/vllm/round-trip/tp2", test_round_trip_tp2);
  g_test_add_func("/vllm/round-trip/ep", test_round_trip_ep);
  g_test_add_func("/vllm/round-trip/tied-and-replicated", test_round_trip_tied_and_replicated);
  g_test_add_func("/vllm/round-trip/other-convention", test_round_trip_other_convention);
  g_test_add_func("/vllm/plan/json", test_plan_json);
  g_test_add_func("/vllm/refuse/kv-heads", test_refuse_kv_heads);
  g_test_add_func("/vllm/refuse/vocab", test_refuse_vocab);
  g_test_add_func("/vllm/refuse/ep", test_refuse_ep);
  g_test_add_func("/vllm/refuse/ep-beyond-experts", test_refuse_ep_beyond_experts);
  g_test_add_func("/vllm/refuse/tp-beyond-experts", test_refuse_tp_beyond_experts);
  g_test_add_func("/vllm/dtype/auto-float32-model", test_dtype_auto_float32_model);
  g_test_add_func("/vllm/dtype/explicit", test_dtype_explicit);
  g_test_add_func("/vllm/config/bad-version", test_bad_version);
  g_test_add_func("/vllm/config/version-spellings", test_version_spellings);
  g_test_add_func("/vllm/plan/format-and-era", test_plan_format_and_era);
  g_test_add_func("/vllm/help", test_help);
  g_test_add_func("/vllm/refuse/sharded-state", test_refuse_sharded_state);
  g_test_add_func("/vllm/plan/attn-scales-off", test_plan_attn_scales_off);
  g_test_add_func("/vllm/refuse/format", test_refuse_format);
  g_test_add_func("/vllm/refuse/legacy-rank-files", test_refuse_legacy_rank_files);
  g_test_add_func("/vllm/config/shipped", test_shipped_conf);

  status = g_test_run();
  test_rmtree(work_dir);
  g_free(work_dir);
  g_hash_table_unref(conf_dirs);
  g_hash_table_unref(synth_dirs);
  return status;
}
