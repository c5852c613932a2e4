/* The npu-ascend plugin, end to end: `wsync synth --pattern index` writes tiny Qwen3-MoE
 * checkpoints whose every element encodes where it came from (the project's tiny
 * config, and configs of our own with odd sizes, hidden 40 and moe_intermediate 20, in
 * BF16 and in F32, and a dense layer), `wsync convert --target vllm-ascend` writes the
 * rank files in either format, and:
 *
 *  - every routed-expert element of every rank is checked against the element of the
 *    source expert it must hold (row and column), from the layouts in docs/vllm.md §4,
 *    docs/vllm-ascend.md §3 (not from the plugins): at tp 1, 2, 4, with ep, in two naming
 *    eras, in both states: processed (the kernel format) and preprocessed, the loader
 *    layout (the sharded-state format);
 *  - every other tensor is byte for byte what the `vllm` target writes in the same
 *    format for the same rank (test-vllm checks that one element by element), under the
 *    same name but the router's (vLLM-Ascend's alias in era D), and nothing else is there;
 *  - the state recorded in `__metadata__` (wsync.moe-layout, wsync.layout.<tensor>);
 *  - round trips to hf are bit-exact; processed -> preprocessed -> processed; files
 *    already processed are not transposed again; files recording no state read as the
 *    loader layout; bad recorded states are refused; the deprecated moe-layout option
 *    warns and changes nothing;
 *  - the vectorised and portable transposes write identical files;
 *  - `wsync env --backend npu-ascend` output, line by line, and its --json form. */
#include <json-glib/json-glib.h>
#include <stdio.h>

#include <wsync/wsync.h>

#include "testutil.h"

typedef TestRun Run;
/* the shared helpers of testutil.h under this file's short names */
#define run_wsync test_run
#define assert_has test_assert_has
#define set_file_metadata test_set_rank_file_metadata

/* ------------------------------------------------------------------ running wsync */

/* Variables the env patches read: removed from every environment a test builds. */
static const char *const env_vars[] = {"CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES",
                                       "ASCEND_TOOLKIT_HOME", "PYTHONPATH",
                                       "PYTORCH_NPU_ALLOC_CONF", "VLLM_ASCEND_ENABLE_NZ",
                                       "WSYNC_TRANSPOSE"};

/* Runs wsync with @args (NULL-terminated).  With @set (NAME, VALUE, ... NULL) the
 * program gets the test's environment without any of env_vars, plus those settings;
 * under `make check-valgrind` it runs under memcheck as testutil.h does. */
static Run
run_wsync_env(const char *const *args, const char *const *set)
{
  g_autoptr(GPtrArray) argv = g_ptr_array_new_with_free_func(g_free);
  g_auto(GStrv) envp = g_get_environ();
  const char *wrapper = g_getenv("WSYNC_TEST_WRAPPER");
  GError *error = NULL;
  Run r = {0};
  int wait_status = 0;

  if (set == NULL) {
    return test_run_wsync_argv(args);
  }
  for (guint i = 0; i < G_N_ELEMENTS(env_vars); i++)
    envp = g_environ_unsetenv(envp, env_vars[i]);
  for (guint i = 0; set[i] != NULL; i += 2)
    envp = g_environ_setenv(envp, set[i], set[i + 1], TRUE);
  if (wrapper != NULL && wrapper[0] != '\0') {
    g_auto(GStrv) words = g_strsplit(wrapper, " ", -1);
    for (guint i = 0; words[i] != NULL; i++)
      if (words[i][0] != '\0')
        g_ptr_array_add(argv, g_strdup(words[i]));
  }
  g_ptr_array_add(argv, g_strdup(test_env_dir("WSYNC_TEST_BINARY")));
  for (guint i = 0; args[i] != NULL; i++)
    g_ptr_array_add(argv, g_strdup(args[i]));
  g_ptr_array_add(argv, NULL);
  g_spawn_sync(NULL, (char **)argv->pdata, envp, G_SPAWN_DEFAULT, NULL, NULL, &r.out, &r.err,
               &wait_status, &error);
  g_assert_no_error(error);
  g_assert_true(WIFEXITED(wait_status));
  r.status = WEXITSTATUS(wait_status);
  if (r.status == 99)
    g_error("wsync failed under valgrind: %s", r.err);
  return r;
}

/* Runs and insists on exit 0. */
static void
run_ok_env(const char *const *args, const char *const *set)
{
  Run r = run_wsync_env(args, set);

  if (r.status != 0) {
    g_autofree char *cmd = g_strjoinv(" ", (char **)args);
    g_error("wsync %s: exit %d\n%s", cmd, r.status, r.err);
  }
  test_run_clear(&r);
}

/* ------------------------------------------------------------------ fixtures */

static char *work_dir;
static GHashTable *conf_dirs;  /* "version|layout" -> conf dir */
static GHashTable *synth_dirs; /* "config|fused" -> checkpoint */
static GHashTable *ref_dirs;   /* "config|fused|version|tp|ep" -> vllm rank files */
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

/* A conf.d selecting qwen3_moe, vllm (vllm-version @version, dtype @dtype or vLLM's
 * default auto) and, with @ascend, npu-ascend. */
static const char *
conf_dir_dtype(const char *version, gboolean ascend_plugin, const char *dtype)
{
  g_autofree char *key = g_strdup_printf("%s|%d|%s", version, ascend_plugin,
                                         dtype != NULL ? dtype : "auto");
  char *dir = g_hash_table_lookup(conf_dirs, key);

  if (dir == NULL) {
    g_autofree char *ascend = g_strdup(ascend_plugin ? "plugin \"npu-ascend\" {}\n" : "");
    g_autofree char *text = g_strdup_printf("plugin \"hf\" {}\nplugin \"qwen3_moe\" {}\n"
                                            "plugin \"vllm\" {\n"
                                            "  vllm-version = \"%s\"\n"
                                            "  dtype = \"%s\"\n"
                                            "}\n%s",
                                            version, dtype != NULL ? dtype : "auto", ascend);
    dir = new_path("conf");
    g_assert_cmpint(g_mkdir(dir, 0755), ==, 0);
    g_free(test_write(dir, "10-test.conf", text));
    g_hash_table_insert(conf_dirs, g_strdup(key), dir);
  }
  return dir;
}

static const char *
conf_dir(const char *version, gboolean ascend_plugin)
{
  return conf_dir_dtype(version, ascend_plugin, NULL);
}

/* The conf a case of @config writes with: the F32 configs keep F32 (dtype "float32"), for
 * the 4-byte paths, where vLLM's default auto builds a float32 model in bfloat16. */
static const char *
conf_for(const char *config, const char *version, gboolean ascend_plugin)
{
  return conf_dir_dtype(version, ascend_plugin,
                        g_str_has_suffix(config, "-f32.json") ? "float32" : NULL);
}

/* The expert states, and the formats that hold them (docs/vllm-ascend.md §3, §5). */
#define PROCESSED "processed"
#define PREPROCESSED "preprocessed"
#define CONF conf_dir("latest", TRUE)

static const char *
format_of(const char *state)
{
  return strcmp(state, PROCESSED) == 0 ? "kernel" : "sharded-state";
}

/* The vllm format that holds @ep EP ranks over @tp: sharded_state reads by TP rank. */
static const char *
format_for(guint tp, guint ep)
{
  return ep > tp ? "kernel" : "sharded-state";
}

/* configs/NAME (the project's), else tests/data/configs/NAME (ours). */
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

/* The index-pattern synth checkpoint of a config, made once. */
static const char *
synth(const char *config, gboolean fused)
{
  g_autofree char *key = g_strdup_printf("%s|%d", config, fused);
  char *dir = g_hash_table_lookup(synth_dirs, key);

  if (dir == NULL) {
    g_autofree char *path = config_path(config);
    const char *args[] = {"synth",   "--conf-dir", CONF, "--plugin-dir",
                          plugin_dir(), "--config", path,         NULL,
                          "--pattern", "index",    fused ? "--fused-experts" : NULL, NULL};
    dir = new_path("synth");
    args[7] = dir;
    run_ok_env(args, NULL);
    g_hash_table_insert(synth_dirs, g_strdup(key), dir);
  }
  return dir;
}

/* `wsync convert SRC DST --target T [--format F] --tp TP --ep EP`, with
 * WSYNC_TRANSPOSE=@path when @path is given; returns DST. */
static char *
convert_path(const char *src, const char *conf, const char *target, const char *format,
             guint tp, guint ep, const char *path)
{
  char *dst = new_path(target);
  g_autofree char *tps = g_strdup_printf("%u", tp);
  g_autofree char *eps = g_strdup_printf("%u", MAX(ep, 1));
  const char *args[] = {"convert",  src, dst, "--conf-dir", conf,     "--plugin-dir",
                        plugin_dir(), "--target", target, "--tp", tps, "--ep", eps,
                        format ? "--format" : NULL, format, NULL};
  const char *set[] = {"WSYNC_TRANSPOSE", path, NULL};

  run_ok_env(args, path ? set : NULL);
  return dst;
}

static char *
convert(const char *src, const char *conf, const char *target, const char *format, guint tp,
        guint ep)
{
  return convert_path(src, conf, target, format, tp, ep, NULL);
}

/* The vllm-ascend files of expert state @state. */
static char *
convert_ascend(const char *src, const char *conf, const char *state, guint tp, guint ep)
{
  return convert(src, conf, "vllm-ascend", format_of(state), tp, ep);
}

/* ------------------------------------------------------------------ the model */

typedef struct {
  guint64 H, I, E, L;
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
  Model m;

  json_parser_load_from_file(parser, path, &error);
  g_assert_no_error(error);
  o = json_node_get_object(json_parser_get_root(parser));
  m.H = member_uint(o, "hidden_size");
  m.I = member_uint(o, "moe_intermediate_size");
  m.E = member_uint(o, "num_experts");
  m.L = member_uint(o, "num_hidden_layers");
  return m;
}

/* ------------------------------------------------------------------ rank files */

#define MAX_RANKS 16

typedef struct {
  GPtrArray *files; /* WsyncCheckpoint*, one per part */
} RankFiles;

static guint
open_ranks(const char *dir, RankFiles *ranks)
{
  GError *error = NULL;
  g_autoptr(GDir) d = g_dir_open(dir, 0, &error);
  const char *name;
  guint n = 0;

  g_assert_no_error(error);
  for (guint r = 0; r < MAX_RANKS; r++)
    ranks[r].files = g_ptr_array_new_with_free_func((GDestroyNotify)wsync_checkpoint_free);
  while ((name = g_dir_read_name(d)) != NULL) {
    unsigned rank, part;
    char tail[32];
    g_autofree char *path = g_build_filename(dir, name, NULL);
    WsyncCheckpoint *ck;
    if ((sscanf(name, "model-rank-%u-part-%u%31s", &rank, &part, tail) != 3 &&
         sscanf(name, "kernel-rank-%u-part-%u%31s", &rank, &part, tail) != 3) ||
        strcmp(tail, ".safetensors") != 0)
      continue;
    g_assert_cmpuint(rank, <, MAX_RANKS);
    ck = wsync_checkpoint_open(path, &error);
    g_assert_no_error(error);
    g_ptr_array_add(ranks[rank].files, ck);
  }
  for (guint r = 0; r < MAX_RANKS; r++)
    if (ranks[r].files->len > 0)
      n++;
  return n;
}

static void
close_ranks(RankFiles *ranks)
{
  for (guint r = 0; r < MAX_RANKS; r++)
    g_ptr_array_unref(ranks[r].files);
}

static const WsyncTensor *
rank_lookup(const RankFiles *rf, const char *name)
{
  for (guint i = 0; i < rf->files->len; i++) {
    const WsyncTensor *t = wsync_checkpoint_lookup(rf->files->pdata[i], name);
    if (t != NULL)
      return t;
  }
  return NULL;
}

/* The metadata of every file of the rank must agree; returns the first file's. */
static GHashTable *
rank_metadata(const RankFiles *rf)
{
  GHashTable *first = wsync_safetensors_metadata(wsync_checkpoint_file(rf->files->pdata[0], 0));

  for (guint i = 1; i < rf->files->len; i++) {
    GHashTable *md = wsync_safetensors_metadata(wsync_checkpoint_file(rf->files->pdata[i], 0));
    GHashTableIter it;
    gpointer k, v;
    g_assert_cmpuint(g_hash_table_size(md), ==, g_hash_table_size(first));
    g_hash_table_iter_init(&it, first);
    while (g_hash_table_iter_next(&it, &k, &v))
      g_assert_cmpstr(g_hash_table_lookup(md, k), ==, v);
  }
  return first;
}

/* ------------------------------------------------------------------ the oracle */

/* A routed-experts tensor: `.mlp.experts.[routed_experts.]w13_weight` or `w2_weight`. */
static gboolean
is_expert(const char *name, guint64 *layer, gboolean *w13)
{
  unsigned l;
  const char *leaf;

  if (strstr(name, ".mlp.experts.") == NULL || sscanf(name, "model.layers.%u.", &l) != 1)
    return FALSE;
  leaf = strrchr(name, '.') + 1;
  if (strcmp(leaf, "w13_weight") != 0 && strcmp(leaf, "w2_weight") != 0)
    return FALSE;
  *layer = l;
  *w13 = strcmp(leaf, "w13_weight") == 0;
  return TRUE;
}

typedef struct {
  const Model *m;
  WsyncCheckpoint *in; /* the hf synth input */
  guint tp, ep, rank;
  gboolean processed;
} Oracle;

/* Where (row, col) of expert @e's gate (0), up (1) or down (2) matrix is in the input:
 * per-expert tensors, or the fused Transformers 5 form (gate_up [E, 2I, H], gate rows
 * first; down [E, H, I]). */
typedef struct {
  const WsyncTensor *t;
  guint64 base, row_stride;
} ExpertSrc;

static ExpertSrc
expert_src(const Oracle *o, guint64 layer, guint which, guint64 e)
{
  static const char *const projs[3] = {"gate_proj", "up_proj", "down_proj"};
  const Model *m = o->m;
  g_autofree char *fused = g_strdup_printf("model.layers.%" G_GUINT64_FORMAT ".mlp.experts.%s",
                                           layer, which < 2 ? "gate_up_proj" : "down_proj");
  g_autofree char *single = g_strdup_printf("model.layers.%" G_GUINT64_FORMAT
                                            ".mlp.experts.%" G_GUINT64_FORMAT ".%s.weight",
                                            layer, e, projs[which]);
  ExpertSrc s;

  s.t = wsync_checkpoint_lookup(o->in, fused);
  if (s.t != NULL) {
    s.base = which < 2 ? (e * 2 * m->I + which * m->I) * m->H : e * m->H * m->I;
    s.row_stride = which < 2 ? m->H : m->I;
    return s;
  }
  s.t = wsync_checkpoint_lookup(o->in, single);
  if (s.t == NULL)
    g_error("the synth input has no %s", single);
  s.base = 0;
  s.row_stride = which < 2 ? m->H : m->I;
  return s;
}

/* determine_expert_map, linear (docs/vllm.md §4): with EP, contiguous blocks of whole
 * experts, remainder to the lowest ranks; without, all experts, I split over tp (§4). */
static void
expert_share(const Oracle *o, guint64 *first, guint64 *count, guint64 *ip, guint64 *off)
{
  const Model *m = o->m;

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
    *off = (o->rank % o->tp) * *ip;
  }
}

static void
same_elem(const Oracle *o, const WsyncTensor *out, guint64 oi, const WsyncTensor *in, guint64 ii)
{
  gsize es = wsync_dtype_bits(out->dtype) / 8;

  g_assert_cmpuint(oi, <, out->numel);
  g_assert_cmpuint(ii, <, in->numel);
  if (memcmp(out->data + oi * es, in->data + ii * es, es) != 0)
    g_error("rank %u (tp %u ep %u, %s): %s element %" G_GUINT64_FORMAT
            " is not %s element %" G_GUINT64_FORMAT,
            o->rank, o->tp, o->ep, o->processed ? "processed" : "preprocessed", out->name, oi,
            in->name, ii);
}

static void
assert_shape(const WsyncTensor *t, guint64 a, guint64 b, guint64 c)
{
  if (t->ndim != 3 || t->shape[0] != a || t->shape[1] != b || t->shape[2] != c)
    g_error("%s has %u axes [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
            "], want [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT "]",
            t->name, t->ndim, t->shape[0], t->ndim > 1 ? t->shape[1] : 0,
            t->ndim > 2 ? t->shape[2] : 0, a, b, c);
}

/* w13: loader layout [E_loc, 2Ip, H] (gate rows then up rows, docs/vllm.md §4);
 * processed [E_loc, H, 2Ip] (columns [gate | up], docs/vllm-ascend.md §3).  Element
 * (j, c, h) of the loader layout is row off + c % Ip, column h of expert first + j's
 * gate (c < Ip) or up matrix. */
static void
check_w13(const Oracle *o, guint64 layer, const WsyncTensor *out)
{
  const Model *m = o->m;
  guint64 first, count, ip, off;

  expert_share(o, &first, &count, &ip, &off);
  if (o->processed)
    assert_shape(out, count, m->H, 2 * ip);
  else
    assert_shape(out, count, 2 * ip, m->H);
  g_assert_cmpint(out->dtype, ==, expert_src(o, layer, 0, 0).t->dtype);
  for (guint64 j = 0; j < count; j++)
    for (guint half = 0; half < 2; half++) {
      ExpertSrc s = expert_src(o, layer, half, first + j);
      for (guint64 r = 0; r < ip; r++)
        for (guint64 h = 0; h < m->H; h++) {
          guint64 c = half * ip + r;
          guint64 oi = o->processed ? (j * m->H + h) * 2 * ip + c : (j * 2 * ip + c) * m->H + h;
          same_elem(o, out, oi, s.t, s.base + (off + r) * s.row_stride + h);
        }
    }
}

/* w2: loader layout [E_loc, H, Ip] (down narrowed along its input axis, docs/vllm.md
 * §4); processed [E_loc, Ip, H] (docs/vllm-ascend.md §3).  Element (j, h, c) is
 * down[h][off + c] of expert first + j. */
static void
check_w2(const Oracle *o, guint64 layer, const WsyncTensor *out)
{
  const Model *m = o->m;
  guint64 first, count, ip, off;

  expert_share(o, &first, &count, &ip, &off);
  if (o->processed)
    assert_shape(out, count, ip, m->H);
  else
    assert_shape(out, count, m->H, ip);
  g_assert_cmpint(out->dtype, ==, expert_src(o, layer, 2, 0).t->dtype);
  for (guint64 j = 0; j < count; j++) {
    ExpertSrc s = expert_src(o, layer, 2, first + j);
    for (guint64 h = 0; h < m->H; h++)
      for (guint64 c = 0; c < ip; c++) {
        guint64 oi = o->processed ? (j * ip + c) * m->H + h : (j * m->H + h) * ip + c;
        same_elem(o, out, oi, s.t, s.base + h * s.row_stride + off + c);
      }
  }
}

/* @a holds the same bytes as @b, whatever its name. */
static void
same_tensor_as(const WsyncTensor *a, const WsyncTensor *b, guint rank)
{
  if (a->dtype != b->dtype || a->ndim != b->ndim ||
      memcmp(a->shape, b->shape, a->ndim * sizeof(guint64)) != 0 || a->nbytes != b->nbytes ||
      memcmp(a->data, b->data, a->nbytes) != 0)
    g_error("rank %u: %s differs from the vllm target's %s", rank, a->name, b->name);
}

static void
same_tensor(const WsyncTensor *a, const WsyncTensor *b, guint rank)
{
  g_assert_cmpstr(a->name, ==, b->name);
  same_tensor_as(a, b, rank);
}

/* The name vLLM-Ascend keeps for the vllm target's tensor @name: in every release its MoE
 * classes also hold the router as mlp.experts._gate, the smallest name
 * (docs/vllm-ascend.md §2 "Names by release"); vLLM's own era A names it so too.  Qwen3-MoE
 * has no shared expert, so nothing else differs. */
static char *
ascend_name(const char *version, const char *name)
{
  static const char *const routers[] = {".mlp.experts.gate.weight", ".mlp.gate.weight",
                                        ".mlp.experts.runner.gate.weight"};

  (void)version;
  for (guint i = 0; i < G_N_ELEMENTS(routers); i++)
    if (g_str_has_suffix(name, routers[i]))
      return g_strdup_printf("%.*s.mlp.experts._gate.weight",
                             (int)(strlen(name) - strlen(routers[i])), name);
  return g_strdup(name);
}

typedef struct {
  const char *config;
  gboolean fused;
  const char *version;
  guint tp, ep; /* ep 0 or 1: none */
} Case;

/* The `vllm` rank files of a case in @format, made once. */
static const char *
reference(const Case *c, const char *format)
{
  g_autofree char *key = g_strdup_printf("%s|%d|%s|%u|%u|%s", c->config, c->fused, c->version,
                                         c->tp, c->ep, format);
  char *dir = g_hash_table_lookup(ref_dirs, key);

  if (dir == NULL) {
    dir = convert(synth(c->config, c->fused), conf_for(c->config, c->version, FALSE), "vllm",
                  format, c->tp, c->ep);
    g_hash_table_insert(ref_dirs, g_strdup(key), dir);
  }
  return dir;
}

/* Checks every rank of the vllm-ascend files in @dir: experts in @state element by
 * element against the source, everything else byte for byte the vllm target's, nothing
 * else there, and the metadata. */
static void
check_ascend(const Case *c, const char *dir, const char *state)
{
  RankFiles asc[MAX_RANKS], ref[MAX_RANKS];
  Model m = read_model(c->config);
  GError *error = NULL;
  g_autoptr(WsyncCheckpoint) in = wsync_checkpoint_open(synth(c->config, c->fused), &error);
  guint ep = MAX(c->ep, 1), world = ep > 1 ? ep : c->tp;
  static const char *const same_keys[] = {"wsync.format", "wsync.tp",           "wsync.ep",
                                          "wsync.rank",   "wsync.world",        "wsync.vllm-version",
                                          "wsync.vllm-era", "wsync.attn-scales"};

  g_assert_no_error(error);
  g_assert_cmpuint(open_ranks(dir, asc), ==, world);
  g_assert_cmpuint(open_ranks(reference(c, format_of(state)), ref), ==, world);
  for (guint r = 0; r < world; r++) {
    Oracle o = {.m = &m, .in = in, .tp = c->tp, .ep = ep, .rank = r,
                .processed = strcmp(state, PROCESSED) == 0};
    GHashTable *md = rank_metadata(&asc[r]), *ref_md = rank_metadata(&ref[r]);
    guint n_ref = 0, n_asc = 0, n_experts = 0, n_state_keys = 0;
    GHashTableIter it;
    gpointer k, v;

    g_assert_cmpstr(g_hash_table_lookup(md, "wsync.target"), ==, "vllm-ascend");
    g_assert_cmpstr(g_hash_table_lookup(md, "wsync.moe-layout"), ==, state);
    for (guint i = 0; i < G_N_ELEMENTS(same_keys); i++)
      g_assert_cmpstr(g_hash_table_lookup(md, same_keys[i]), ==,
                      g_hash_table_lookup(ref_md, same_keys[i]));
    for (guint f = 0; f < ref[r].files->len; f++) {
      WsyncCheckpoint *ck = ref[r].files->pdata[f];
      for (guint i = 0; i < wsync_checkpoint_n_tensors(ck); i++) {
        const WsyncTensor *want = wsync_checkpoint_tensor(ck, i);
        g_autofree char *name = ascend_name(c->version, want->name);
        const WsyncTensor *got = rank_lookup(&asc[r], name);
        guint64 layer;
        gboolean w13;
        n_ref++;
        if (got == NULL)
          g_error("rank %u lacks %s", r, name);
        if (!is_expert(want->name, &layer, &w13)) {
          same_tensor_as(got, want, r);
          continue;
        }
        g_autofree char *key = g_strconcat("wsync.layout.", want->name, NULL);
        g_assert_cmpstr(g_hash_table_lookup(md, key), ==, state);
        n_experts++;
        if (w13)
          check_w13(&o, layer, got);
        else
          check_w2(&o, layer, got);
      }
    }
    for (guint f = 0; f < asc[r].files->len; f++)
      n_asc += wsync_checkpoint_n_tensors(asc[r].files->pdata[f]);
    g_assert_cmpuint(n_asc, ==, n_ref);
    g_assert_cmpuint(n_experts, >, 0);
    g_hash_table_iter_init(&it, md);
    while (g_hash_table_iter_next(&it, &k, &v))
      if (g_str_has_prefix(k, "wsync.layout."))
        n_state_keys++;
    g_assert_cmpuint(n_state_keys, ==, n_experts);
  }
  close_ranks(asc);
  close_ranks(ref);
}

/* Synth, convert to vllm-ascend in @state, check; returns the rank directory. */
static char *
run_case(const Case *c, const char *state)
{
  char *dst = convert_ascend(synth(c->config, c->fused), conf_for(c->config, c->version, TRUE),
                             state, c->tp, c->ep);

  check_ascend(c, dst, state);
  return dst;
}

static void
check_case(const Case *c, const char *state)
{
  g_free(run_case(c, state));
}

/* @a and @b hold the same tensors, byte for byte, rank by rank. */
static void
assert_same_tensors(const char *a, const char *b)
{
  RankFiles ra[MAX_RANKS], rb[MAX_RANKS];
  guint n = open_ranks(a, ra);

  g_assert_cmpuint(open_ranks(b, rb), ==, n);
  for (guint r = 0; r < n; r++) {
    guint na = 0, nb = 0;
    for (guint f = 0; f < ra[r].files->len; f++) {
      WsyncCheckpoint *ck = ra[r].files->pdata[f];
      na += wsync_checkpoint_n_tensors(ck);
      for (guint i = 0; i < wsync_checkpoint_n_tensors(ck); i++) {
        const WsyncTensor *t = wsync_checkpoint_tensor(ck, i);
        const WsyncTensor *u = rank_lookup(&rb[r], t->name);
        if (u == NULL)
          g_error("rank %u of %s lacks %s", r, b, t->name);
        same_tensor(u, t, r);
      }
    }
    for (guint f = 0; f < rb[r].files->len; f++)
      nb += wsync_checkpoint_n_tensors(rb[r].files->pdata[f]);
    g_assert_cmpuint(na, ==, nb);
  }
  close_ranks(ra);
  close_ranks(rb);
}

/* Every file of @a is in @b with the same bytes, and the other way round. */
static void
assert_same_files(const char *a, const char *b)
{
  g_autoptr(GDir) d = g_dir_open(a, 0, NULL);
  g_autoptr(GDir) e = g_dir_open(b, 0, NULL);
  const char *name;
  guint na = 0, nb = 0;

  g_assert_nonnull(d);
  g_assert_nonnull(e);
  while ((name = g_dir_read_name(d)) != NULL) {
    g_autofree char *pa = g_build_filename(a, name, NULL);
    g_autofree char *pb = g_build_filename(b, name, NULL);
    g_autofree char *da = NULL, *db = NULL;
    gsize la = 0, lb = 0;
    GError *error = NULL;
    g_file_get_contents(pa, &da, &la, &error);
    g_assert_no_error(error);
    g_file_get_contents(pb, &db, &lb, &error);
    g_assert_no_error(error);
    if (la != lb || memcmp(da, db, la) != 0)
      g_error("%s and %s differ", pa, pb);
    na++;
  }
  while (g_dir_read_name(e) != NULL)
    nb++;
  g_assert_cmpuint(na, ==, nb);
}

/* DST -> hf with @conf, then `wsync verify` against the synth input. */
static void
round_trip(const char *original, const char *rank_dir, const char *conf)
{
  g_autofree char *hf = convert(rank_dir, conf, "hf", NULL, 1, 1);
  Run r = run_wsync("verify", original, hf, "--conf-dir", conf, "--plugin-dir", plugin_dir(),
                    NULL);

  if (r.status != 0)
    g_error("verify %s %s: exit %d\n%s%s", original, hf, r.status, r.out, r.err);
  test_run_clear(&r);
}

/* ------------------------------------------------------------------ rewriting metadata */

/* A flat copy of a directory (rank files, config.json). */
static char *
copy_dir(const char *from)
{
  char *to = new_path("copy");
  g_autoptr(GDir) d = g_dir_open(from, 0, NULL);
  const char *name;

  g_assert_nonnull(d);
  g_assert_cmpint(g_mkdir(to, 0755), ==, 0);
  while ((name = g_dir_read_name(d)) != NULL) {
    g_autofree char *a = g_build_filename(from, name, NULL);
    g_autofree char *b = g_build_filename(to, name, NULL);
    test_copy(a, b);
  }
  return to;
}

/* ------------------------------------------------------------------ tests: layouts */

#define TINY "tiny-qwen3-moe.json"
#define ODD "tiny-qwen3-moe-odd.json"         /* H 40, I 20, a dense layer, BF16 */
#define ODD_F32 "tiny-qwen3-moe-odd-f32.json" /* the same in F32: 4-byte transposes */
#define NOW "latest" /* era D: mlp.experts.routed_experts.w13_weight, router _gate */
#define OLD "0.18.1" /* era A: mlp.experts.w13_weight, _expert_map with EP */

static void
test_tiny_tp(void)
{
  for (guint tp = 1; tp <= 4; tp *= 2) { /* tp 4: KV heads replicated */
    check_case(&(Case){TINY, FALSE, NOW, tp, 0}, PROCESSED);
    check_case(&(Case){TINY, FALSE, NOW, tp, 0}, PREPROCESSED);
  }
}

/* Odd sizes: H 40, I 20, so Ip is 20, 10, 5 and no axis is a multiple of the 16-wide
 * vector tiles; at tp 1 w13 is square (40 x 40), so only the recorded state tells. */
static void
test_odd_tp(void)
{
  for (guint tp = 1; tp <= 4; tp *= 2) {
    check_case(&(Case){ODD, FALSE, NOW, tp, 0}, PROCESSED);
    check_case(&(Case){ODD_F32, FALSE, NOW, tp, 0}, PROCESSED);
    check_case(&(Case){ODD_F32, FALSE, NOW, tp, 0}, PREPROCESSED);
  }
}

/* Experts spread over EP ranks (2 each of 8 over ep 4, 1 each over ep 8), whole: the
 * kernel format for more EP ranks than TP ranks, either format for as many.  vLLM-Ascend
 * runs no uneven split (test_refuse_uneven_ep). */
static void
test_ep(void)
{
  check_case(&(Case){TINY, FALSE, NOW, 1, 4}, PROCESSED);
  check_case(&(Case){TINY, FALSE, NOW, 2, 4}, PROCESSED);
  check_case(&(Case){TINY, FALSE, NOW, 2, 2}, PROCESSED);
  check_case(&(Case){TINY, FALSE, NOW, 2, 2}, PREPROCESSED);
  check_case(&(Case){ODD, FALSE, NOW, 1, 8}, PROCESSED);
  check_case(&(Case){ODD_F32, FALSE, NOW, 2, 8}, PROCESSED);
}

/* --ep that does not divide the experts: vLLM places the remainder on the lowest EP
 * ranks, vLLM-Ascend sizes every rank for E // ep and does not run it
 * (docs/vllm-ascend.md §2 "Expert placement"), in any format or release; the vllm target
 * writes it. */
static void
test_refuse_uneven_ep(void)
{
  static const struct {
    const char *config, *version, *format;
    guint tp, ep;
    const char *message;
  } cases[] = {
      {TINY, NOW, "kernel", 1, 3,
       "wsync: ep 3 does not divide the 8 experts of model.layers.0.mlp.experts: vLLM-Ascend "
       "runs only an even split of the experts over the EP ranks\n"},
      {TINY, OLD, "kernel", 2, 6,
       "wsync: ep 6 does not divide the 8 experts of model.layers.0.mlp.experts: vLLM-Ascend "
       "runs only an even split of the experts over the EP ranks\n"},
      {"tiny-qwen3-moe-e6.json", NOW, "sharded-state", 4, 4,
       "wsync: ep 4 does not divide the 6 experts of model.layers.1.mlp.experts: vLLM-Ascend "
       "runs only an even split of the experts over the EP ranks\n"},
  };

  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_autofree char *dst = new_path("refused");
    g_autofree char *tp = g_strdup_printf("%u", cases[i].tp);
    g_autofree char *ep = g_strdup_printf("%u", cases[i].ep);
    Run r = run_wsync("convert", synth(cases[i].config, FALSE), dst, "--conf-dir",
                      conf_dir(cases[i].version, TRUE), "--plugin-dir", plugin_dir(),
                      "--target", "vllm-ascend", "--format", cases[i].format, "--tp", tp,
                      "--ep", ep, NULL);

    g_assert_cmpint(r.status, ==, 2);
    g_assert_cmpstr(r.err, ==, cases[i].message);
    g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
    test_run_clear(&r);
    /* the vllm target writes vLLM's uneven placement */
    g_free(convert(synth(cases[i].config, FALSE), conf_dir(cases[i].version, TRUE), "vllm",
                   cases[i].format, cases[i].tp, cases[i].ep));
  }
  /* convert --help says so of the target */
  Run r = run_wsync("convert", "--help", "--conf-dir", CONF, "--plugin-dir", plugin_dir(), NULL);
  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, "    --ep must divide the routed experts: vLLM-Ascend runs no uneven\n"
                    "      split (docs/vllm-ascend.md §2)\n");
  test_run_clear(&r);
}

/* Era A: mlp.experts.w13_weight, the router already mlp.experts._gate on both, and with
 * EP in the sharded-state format each layer's _expert_map (not an expert weight: left as
 * the vllm target has it). */
static void
test_old_version(void)
{
  check_case(&(Case){TINY, FALSE, OLD, 2, 0}, PROCESSED);
  check_case(&(Case){TINY, FALSE, OLD, 2, 4}, PROCESSED);
  check_case(&(Case){TINY, FALSE, OLD, 2, 2}, PREPROCESSED);
  check_case(&(Case){ODD, FALSE, OLD, 1, 0}, PREPROCESSED);
}

/* Transformers 5 fused experts in the input. */
static void
test_fused_input(void)
{
  check_case(&(Case){TINY, TRUE, NOW, 2, 0}, PROCESSED);
  check_case(&(Case){ODD, TRUE, NOW, 4, 0}, PROCESSED);
  check_case(&(Case){ODD, TRUE, NOW, 4, 0}, PREPROCESSED);
}

/* ------------------------------------------------------------------ tests: round trips */

static void
test_round_trip(void)
{
  static const Case cases[] = {
      {TINY, FALSE, NOW, 2, 0}, {ODD, FALSE, NOW, 1, 0}, {ODD, FALSE, NOW, 4, 0},
      {ODD_F32, FALSE, NOW, 2, 0}, {TINY, FALSE, NOW, 1, 4}, {TINY, FALSE, OLD, 2, 4},
      {TINY, FALSE, OLD, 2, 2},
  };

  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    const Case *c = &cases[i];
    g_autofree char *processed = run_case(c, PROCESSED);
    round_trip(synth(c->config, FALSE), processed, CONF);
    if (c->ep <= c->tp) { /* the sharded-state format holds ep <= tp only */
      g_autofree char *pre = run_case(c, PREPROCESSED);
      round_trip(synth(c->config, FALSE), pre, CONF);
    }
  }
}

/* processed -> preprocessed -> processed, through vllm-ascend files each time (kernel,
 * sharded-state, kernel): each step checked against the original source. */
static void
test_processed_preprocessed_processed(void)
{
  static const Case cases[] = {{TINY, FALSE, NOW, 2, 0}, {ODD, FALSE, NOW, 1, 0},
                               {ODD_F32, FALSE, NOW, 2, 2}};

  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    const Case *c = &cases[i];
    g_autofree char *p1 = run_case(c, PROCESSED);
    const char *conf = conf_for(c->config, c->version, TRUE);
    g_autofree char *pre = convert_ascend(p1, conf, PREPROCESSED, c->tp, c->ep);
    g_autofree char *p2 = NULL;
    check_ascend(c, pre, PREPROCESSED);
    p2 = convert_ascend(pre, conf, PROCESSED, c->tp, c->ep);
    check_ascend(c, p2, PROCESSED);
    assert_same_files(p1, p2);
  }
}

/* vllm (sharded-state) -> vllm-ascend (kernel) -> vllm (sharded-state). */
static void
test_vllm_and_back(void)
{
  const Case c = {TINY, FALSE, NOW, 2, 0};
  const char *ref = reference(&c, "sharded-state");
  g_autofree char *asc = convert_ascend(ref, CONF, PROCESSED, 2, 0);
  g_autofree char *back = NULL;

  check_ascend(&c, asc, PROCESSED);
  back = convert(asc, CONF, "vllm", "sharded-state", 2, 0);
  assert_same_tensors(ref, back);
}

/* ------------------------------------------------------------------ tests: state is data */

/* Every copy into an expert tensor of the plan of @src -> @target in @format is a
 * transpose when @want_experts_transposed, and no other copy is. */
static void
assert_plan_transposes(const char *src, const char *conf, const char *target,
                       const char *format, guint tp, guint ep, gboolean want_experts_transposed)
{
  g_autofree char *tps = g_strdup_printf("%u", tp);
  g_autofree char *eps = g_strdup_printf("%u", MAX(ep, 1));
  Run r = run_wsync("plan", src, "--conf-dir", conf, "--plugin-dir", plugin_dir(), "--target",
                    target, "--format", format, "--tp", tps, "--ep", eps, "--json", NULL);
  g_autoptr(JsonParser) parser = json_parser_new();
  GError *error = NULL;
  JsonArray *ranks;
  guint n_expert_copies = 0;

  if (r.status != 0)
    g_error("plan: exit %d\n%s", r.status, r.err);
  json_parser_load_from_data(parser, r.out, -1, &error);
  g_assert_no_error(error);
  ranks = json_object_get_array_member(json_node_get_object(json_parser_get_root(parser)),
                                       "ranks");
  for (guint k = 0; k < json_array_get_length(ranks); k++) {
    JsonArray *tensors =
        json_object_get_array_member(json_array_get_object_element(ranks, k), "tensors");
    for (guint i = 0; i < json_array_get_length(tensors); i++) {
      JsonObject *t = json_array_get_object_element(tensors, i);
      JsonArray *ops = json_object_get_array_member(t, "ops");
      guint64 layer;
      gboolean w13;
      gboolean expert = is_expert(json_object_get_string_member(t, "name"), &layer, &w13);
      for (guint j = 0; j < json_array_get_length(ops); j++) {
        JsonObject *op = json_array_get_object_element(ops, j);
        if (strcmp(json_object_get_string_member(op, "op"), "copy") != 0)
          continue;
        n_expert_copies += expert;
        if (json_object_get_boolean_member(op, "transposed") != (expert && want_experts_transposed))
          g_error("plan %s -> %s: a copy into %s is%s transposed", src, target,
                  json_object_get_string_member(t, "name"),
                  json_object_get_boolean_member(op, "transposed") ? "" : " not");
      }
    }
  }
  g_assert_cmpuint(n_expert_copies, >, 0);
  test_run_clear(&r);
}

/* Rank files already processed, fed back in: read as processed, written as processed
 * with plain copies (the plan transposes nothing), so a second conversion gives the
 * same files.  The square odd case (w13 40 x 40 at tp 1) has nothing but the recorded
 * state to go by. */
static void
test_already_processed(void)
{
  static const Case cases[] = {{TINY, FALSE, NOW, 2, 0}, {ODD, FALSE, NOW, 1, 0},
                               {TINY, FALSE, OLD, 1, 4}};

  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    const Case *c = &cases[i];
    const char *conf = conf_dir(c->version, TRUE);
    g_autofree char *once = run_case(c, PROCESSED);
    g_autofree char *twice = convert_ascend(once, conf, PROCESSED, c->tp, c->ep);
    check_ascend(c, twice, PROCESSED);
    assert_same_files(once, twice);
    assert_plan_transposes(once, conf, "vllm-ascend", "kernel", c->tp, c->ep, FALSE);
    assert_plan_transposes(synth(c->config, FALSE), conf, "vllm-ascend", "kernel", c->tp, c->ep,
                           TRUE);
    assert_plan_transposes(once, conf, "vllm", format_for(c->tp, c->ep), c->tp, c->ep, TRUE);
  }
}

/* Reading decides from the files, not from the format being written: processed files
 * written to the sharded-state format come out preprocessed, and the other way round;
 * both read back to hf exactly. */
static void
test_reading_follows_files(void)
{
  const Case c = {ODD, FALSE, NOW, 1, 0};
  g_autofree char *processed = run_case(&c, PROCESSED);
  g_autofree char *pre = run_case(&c, PREPROCESSED);
  g_autofree char *a = NULL, *b = NULL;

  round_trip(synth(ODD, FALSE), processed, CONF);
  round_trip(synth(ODD, FALSE), pre, CONF);
  a = convert_ascend(processed, CONF, PREPROCESSED, 1, 0);
  check_ascend(&c, a, PREPROCESSED);
  b = convert_ascend(pre, CONF, PROCESSED, 1, 0);
  check_ascend(&c, b, PROCESSED);
}

/* Without this plugin the vllm plugin refuses vllm-ascend's kernel format (it cannot
 * finish the layout) and writes its sharded-state format (the loader layout); files that
 * say vllm-ascend but record no state (rank files relabelled by hand, or from another
 * writer) hold the loader layout and read as such. */
static void
test_unrecorded_state(void)
{
  const Case c = {ODD, FALSE, OLD, 1, 0};
  g_autofree char *dst = new_path("refused-without-plugin");
  Run r = run_wsync("convert", synth(ODD, FALSE), dst, "--conf-dir", conf_dir(OLD, FALSE),
                    "--plugin-dir", plugin_dir(), "--target", "vllm-ascend", "--format", "kernel",
                    NULL);
  g_assert_cmpint(r.status, ==, 2);
  assert_has(r.err, "no loaded plugin has a hook for it");
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
  test_run_clear(&r);

  /* era A, where vllm and vllm-ascend name the router alike */
  g_autofree char *vllm = convert(synth(ODD, FALSE), conf_dir(OLD, FALSE), "vllm", NULL, 1, 0);
  g_autofree char *plain = copy_dir(vllm);
  g_autofree char *asc = NULL;
  RankFiles ranks[MAX_RANKS];

  set_file_metadata(plain, "wsync.target", "vllm-ascend");
  g_assert_cmpuint(open_ranks(plain, ranks), ==, 1);
  g_assert_null(g_hash_table_lookup(rank_metadata(&ranks[0]), "wsync.moe-layout"));
  close_ranks(ranks);
  round_trip(synth(ODD, FALSE), plain, conf_dir(OLD, TRUE));
  asc = convert_ascend(plain, conf_dir(OLD, TRUE), PROCESSED, 1, 0);
  check_ascend(&c, asc, PROCESSED);
}

/* vLLM-Ascend's AscendFusedMoE holds the router as _gate in the releases for vLLM 0.20 to
 * 0.23 too (docs/vllm-ascend.md §2 "Names by release"): vllm-ascend files of an earlier
 * wsync, which named them as vLLM does (era C: mlp.experts.runner.gate.weight), are
 * refused when read back, saying why; and the vllm-ascend files now hold the router as
 * _gate. */
static void
test_old_ascend_names(void)
{
  g_autofree char *vllm = convert(synth(TINY, FALSE), conf_dir("0.22.0", FALSE), "vllm", NULL, 2, 0);
  g_autofree char *old = copy_dir(vllm);
  g_autofree char *dst = new_path("refused");
  g_autofree char *now = NULL;
  RankFiles ranks[MAX_RANKS];
  Run r;

  set_file_metadata(old, "wsync.target", "vllm-ascend");
  r = run_wsync("convert", old, dst, "--conf-dir", conf_dir("0.22.0", TRUE), "--plugin-dir",
                plugin_dir(), "--target", "hf", NULL);
  g_assert_cmpint(r.status, ==, 3);
  assert_has(r.err, "metadata wsync.vllm-era is \"C\", not A: these vllm-ascend rank files "
                    "carry vLLM's names for vllm-version 0.22.0, which vLLM-Ascend does not "
                    "load (an earlier wsync); convert again from the Hugging Face checkpoint\n");
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
  test_run_clear(&r);

  now = convert(synth(TINY, FALSE), conf_dir("0.22.0", TRUE), "vllm-ascend", "sharded-state", 2, 0);
  g_assert_cmpuint(open_ranks(now, ranks), ==, 2);
  g_assert_cmpstr(g_hash_table_lookup(rank_metadata(&ranks[0]), "wsync.vllm-era"), ==, "A");
  close_ranks(ranks);
  round_trip(synth(TINY, FALSE), now, conf_dir("0.22.0", TRUE));
}

/* No vLLM-Ascend release targets vLLM 0.27.0 (docs/vllm-ascend.md §2): its names are not
 * known, so the vllm-ascend target refuses it (the vllm target takes it). */
static void
test_refuse_ascend_0_27_0(void)
{
  g_autofree char *dst = new_path("refused");
  Run r = run_wsync("convert", synth(TINY, FALSE), dst, "--conf-dir", conf_dir("0.27.0", TRUE),
                    "--plugin-dir", plugin_dir(), "--target", "vllm-ascend", NULL);

  g_assert_cmpint(r.status, ==, 2);
  g_assert_cmpstr(r.err, ==,
                  "wsync: vllm-version 0.27.0: no vLLM-Ascend release targets vLLM 0.27.0, so "
                  "its names are not known (docs/vllm-ascend.md §2); set the vLLM release the "
                  "deployment's vLLM-Ascend targets (0.26.x or 0.27.1)\n");
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
  test_run_clear(&r);
  g_free(convert(synth(TINY, FALSE), conf_dir("0.27.0", TRUE), "vllm", NULL, 2, 0));
}

/* A tensor's own record wins over the rank's: preprocessed files whose rank record says
 * "processed" but whose tensors say "preprocessed" still read right. */
static void
test_tensor_state_wins(void)
{
  const Case c = {TINY, FALSE, NOW, 2, 0};
  g_autofree char *pre = run_case(&c, PREPROCESSED);
  g_autofree char *relabelled = copy_dir(pre);

  set_file_metadata(relabelled, "wsync.moe-layout", PROCESSED);
  round_trip(synth(TINY, FALSE), relabelled, CONF);
}

/* A recorded state that is neither: refused, exit 3, naming the key. */
static void
test_bad_recorded_state(void)
{
  const Case c = {TINY, FALSE, NOW, 2, 0};
  g_autofree char *processed = run_case(&c, PROCESSED);
  g_autofree char *bad_rank = copy_dir(processed);
  g_autofree char *bad_tensor = copy_dir(processed);
  g_autofree char *dst = new_path("refused");
  const char *conf = CONF;
  Run r;

  set_file_metadata(bad_rank, "wsync.moe-layout", "nz");
  r = run_wsync("convert", bad_rank, dst, "--conf-dir", conf, "--plugin-dir", plugin_dir(),
                "--target", "hf", NULL);
  g_assert_cmpint(r.status, ==, 3);
  /* the target knows the record, the core names the file it read it from */
  g_autofree char *file = g_strdup_printf("wsync: %s/kernel-rank-0-part-0.safetensors: ", bad_rank);
  g_assert_true(g_str_has_prefix(r.err, file));
  assert_has(r.err, "metadata wsync.moe-layout is \"nz\", not \"processed\" or "
                    "\"preprocessed\"\n");
  g_assert_false(g_file_test(dst, G_FILE_TEST_EXISTS));
  test_run_clear(&r);

  set_file_metadata(bad_tensor, "wsync.layout.model.layers.1.mlp.experts.routed_experts.w2_weight",
                    "transposed");
  r = run_wsync("convert", bad_tensor, dst, "--conf-dir", conf, "--plugin-dir", plugin_dir(),
                "--target", "hf", NULL);
  g_assert_cmpint(r.status, ==, 3);
  assert_has(r.err, "metadata wsync.layout.model.layers.1.mlp.experts.routed_experts.w2_weight "
                    "is \"transposed\"");
  test_run_clear(&r);
}

/* ------------------------------------------------------------------ tests: kernels */

/* The vectorised transposes and the portable one write the same files, writing
 * processed experts (BF16 and F32) and reading them back. */
static void
test_transpose_paths_identical(void)
{
  static const Case cases[] = {{TINY, FALSE, NOW, 2, 0}, {ODD, FALSE, NOW, 1, 0},
                               {ODD_F32, FALSE, NOW, 4, 0}, {ODD_F32, FALSE, NOW, 1, 4}};

  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    const Case *c = &cases[i];
    const char *src = synth(c->config, FALSE);
    const char *conf = conf_for(c->config, c->version, TRUE);
    g_autofree char *portable =
        convert_path(src, conf, "vllm-ascend", "kernel", c->tp, c->ep, "portable");
    g_autofree char *sse2 = convert_path(src, conf, "vllm-ascend", "kernel", c->tp, c->ep, "sse2");
    g_autofree char *best = convert_ascend(src, conf, PROCESSED, c->tp, c->ep);
    g_autofree char *back_portable = convert_path(best, conf, "hf", NULL, 1, 1, "portable");
    g_autofree char *back_best = convert(best, conf, "hf", NULL, 1, 1);
    check_ascend(c, portable, PROCESSED);
    assert_same_files(portable, best);
    assert_same_files(sse2, best);
    assert_same_files(back_portable, back_best);
  }
}

/* ------------------------------------------------------------------ tests: plan, config */

static void
test_plan(void)
{
  const char *src = synth(TINY, FALSE);
  Run r = run_wsync("plan", src, "--conf-dir", CONF, "--plugin-dir", plugin_dir(), "--target",
                    "vllm-ascend", "--format", "kernel", "--tp", "2", NULL);

  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, "target vllm-ascend, format kernel, tp 2, ep 1, 2 ranks");
  assert_has(r.out, "model.layers.1.mlp.experts.routed_experts.w13_weight  BF16 [8, 64, 32]");
  assert_has(r.out, "model.layers.1.mlp.experts.routed_experts.w2_weight  BF16 [8, 16, 64]");
  assert_has(r.out, "model.layers.1.mlp.experts._gate.weight  BF16 [8, 64]");
  assert_has(r.out, "[0:1, 0:64, 0:16] <- model.layers.1.mlp.experts.0.gate_proj.weight[16:32, "
                    "0:64] transposed");
  test_run_clear(&r);
  assert_plan_transposes(src, CONF, "vllm-ascend", "kernel", 2, 0, TRUE);
  assert_plan_transposes(src, CONF, "vllm-ascend", "sharded-state", 2, 0, FALSE);
}

/* The plan's notes, as --json lists them, of SRC -> @target in @format at tp 2, with the
 * conf.d @conf. */
static GPtrArray *
plan_notes_with(const char *conf, const char *target, const char *format)
{
  Run r = run_wsync("plan", synth(TINY, FALSE), "--conf-dir", conf, "--plugin-dir",
                    plugin_dir(), "--target", target, "--format", format, "--tp", "2", "--json",
                    NULL);
  g_autoptr(JsonParser) parser = json_parser_new();
  GError *error = NULL;
  GPtrArray *notes = g_ptr_array_new_with_free_func(g_free);
  JsonArray *list;

  if (r.status != 0)
    g_error("plan -> %s %s: exit %d\n%s", target, format, r.status, r.err);
  json_parser_load_from_data(parser, r.out, -1, &error);
  g_assert_no_error(error);
  list = json_object_get_array_member(json_node_get_object(json_parser_get_root(parser)),
                                      "notes");
  for (guint i = 0; i < json_array_get_length(list); i++)
    g_ptr_array_add(notes, g_strdup(json_array_get_string_element(list, i)));
  test_run_clear(&r);
  return notes;
}

static GPtrArray *
plan_notes(const char *target, const char *format)
{
  return plan_notes_with(CONF, target, format);
}

/* The kernel format writes ND weights, which not every vLLM-Ascend deployment runs: the
 * plan of that format (and of no other) says which ones it serves, once, in text and
 * --json, and so does the target's help. */
static void
test_plan_nd_note(void)
{
  static const char note[] =
      "format kernel on vllm-ascend: every weight is written in ND format, which serves "
      "A2/A3 with weight_nz_mode 0 or 1 (the default) and enable_fused_mc2 off (the "
      "default); it does not serve 310P (which casts weights to FRACTAL_NZ), fused MC2 "
      "(enable_fused_mc2: the MoE kernel runs the experts in FRACTAL_NZ or from per-expert "
      "copies) or weight_nz_mode=2 (BF16/FP16 in FRACTAL_NZ); vLLM-Ascend's own sleep-mode "
      "wake-up and start_weight_update refuse to run unless VLLM_ASCEND_ENABLE_NZ is 0 (the "
      "releases for vLLM 0.22 to 0.26 read it in start_weight_update whatever "
      "additional_config says) and so is an additional_config weight_nz_mode if given; "
      "`wsync env --backend npu-ascend --mode colocate|server` sets the variable and "
      "advises additional_config weight_nz_mode = 0, the one setting left once main drops "
      "the variable "
      "(docs/vllm-ascend.md §3, §4, §6)";
  static const struct {
    const char *target, *format;
    gboolean noted;
  } cases[] = {{"vllm-ascend", "kernel", TRUE},
               {"vllm-ascend", "sharded-state", FALSE},
               {"vllm", "kernel", FALSE}};
  g_autofree char *line = g_strdup_printf("\nnote: %s\n", note);
  Run r = run_wsync("plan", synth(TINY, FALSE), "--conf-dir", CONF, "--plugin-dir",
                    plugin_dir(), "--target", "vllm-ascend", "--format", "kernel", "--tp", "2",
                    NULL);

  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, line);
  /* two ranks say it, the plan prints it once */
  g_assert_null(strstr(strstr(r.out, line) + 1, line));
  test_run_clear(&r);
  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_autoptr(GPtrArray) notes = plan_notes(cases[i].target, cases[i].format);
    guint found = 0;

    g_assert_cmpuint(notes->len, >, 0); /* the vllm plugin's notes are there */
    for (guint k = 0; k < notes->len; k++) {
      const char *text = notes->pdata[k];
      found += strcmp(text, note) == 0;
      if (!cases[i].noted && strstr(text, "FRACTAL_NZ") != NULL)
        g_error("plan -> %s %s notes NZ: %s", cases[i].target, cases[i].format, text);
    }
    g_assert_cmpuint(found, ==, cases[i].noted ? 1 : 0);
  }
  /* convert --help says the same of the target's kernel format */
  r = run_wsync("convert", "--help", "--conf-dir", CONF, "--plugin-dir", plugin_dir(), NULL);
  g_assert_cmpint(r.status, ==, 0);
  assert_has(r.out, "      --ep); parameters only;\n"
                    "      experts transposed as vLLM-Ascend runs them; every weight in ND "
                    "format,\n      which serves A2/A3 with weight_nz_mode 0 or 1 and "
                    "enable_fused_mc2 off,\n      not 310P, fused MC2 or weight_nz_mode=2 "
                    "(docs/vllm-ascend.md §4)\n");
  test_run_clear(&r);
}

/* vLLM-Ascend for vLLM 0.17 to 0.26.x transposes the routed experts back in
 * NPUWorker.wake_up (docs/vllm-ascend.md §5): the plan of a kernel-format output for one
 * of those releases says that its files match an engine whose weights did not sleep, and
 * only that plan; from 0.27.1 on (vllm-ascend #13012) nothing is said. */
static void
test_plan_wake_up_note(void)
{
  static const char note[] =
      "format kernel on vllm-ascend for vLLM 0.17 to 0.26.x: vLLM-Ascend's releases for "
      "them transpose the routed experts back to the loader shape when the weights wake up "
      "(NPUWorker.wake_up with tags None or \"weights\"; removed by vllm-ascend #13012 "
      "for 0.27.1), so these files match the experts of an engine whose weights did not "
      "sleep; after such a wake_up w13_weight and w2_weight are views [E_loc, 2I/tp, H] and "
      "[E_loc, H, I/tp] of the restored storage until the processed parameters are put "
      "back, which wsync.vllm_worker.wsync_load does before it copies; vLLM-Ascend's own "
      "kernel-format update does not (docs/vllm-ascend.md §5)";
  static const struct {
    const char *version, *target, *format;
    gboolean noted;
  } cases[] = {{"0.18", "vllm-ascend", "kernel", TRUE},
               {"0.22.1", "vllm-ascend", "kernel", TRUE},
               {"v0.24.0", "vllm-ascend", "kernel", TRUE},
               {"0.26.1", "vllm-ascend", "kernel", TRUE},
               {"0.26.1", "vllm-ascend", "sharded-state", FALSE},
               {"0.26.1", "vllm", "kernel", FALSE},
               {"0.27.1", "vllm-ascend", "kernel", FALSE},
               {"latest", "vllm-ascend", "kernel", FALSE},
               {"0.28.0", "vllm-ascend", "kernel", FALSE}};

  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_autoptr(GPtrArray) notes =
        plan_notes_with(conf_dir(cases[i].version, TRUE), cases[i].target, cases[i].format);
    guint found = 0;

    for (guint k = 0; k < notes->len; k++) {
      const char *text = notes->pdata[k];
      found += strcmp(text, note) == 0;
      if (!cases[i].noted && strstr(text, "wake_up") != NULL)
        g_error("vllm-version %s, plan -> %s %s notes wake_up: %s", cases[i].version,
                cases[i].target, cases[i].format, text);
    }
    if (found != (cases[i].noted ? 1u : 0u))
      g_error("vllm-version %s, plan -> %s %s: the wake_up note %u times, want %u",
              cases[i].version, cases[i].target, cases[i].format, found,
              cases[i].noted ? 1u : 0u);
  }
}

/* The deprecated option still only takes its two old values. */
static void
test_bad_option(void)
{
  static const char *const bad[] = {"nz", "Processed", "", "transposed"};

  for (guint i = 0; i < G_N_ELEMENTS(bad); i++) {
    g_autofree char *conf = new_path("badconf");
    g_autofree char *text =
        g_strdup_printf("plugin \"npu-ascend\" {\n  moe-layout = \"%s\"\n}\n", bad[i]);
    g_autofree char *path = NULL;
    g_autofree char *want = NULL;
    Run r;

    g_assert_cmpint(g_mkdir(conf, 0755), ==, 0);
    path = test_write(conf, "40-npu-ascend.conf", text);
    want = g_strdup_printf("%s:2: moe-layout must be \"processed\" or \"preprocessed\", not "
                           "\"%s\"",
                           path, bad[i]);
    r = run_wsync("plugins", "--conf-dir", conf, "--plugin-dir", plugin_dir(), NULL);
    g_assert_cmpint(r.status, ==, 2);
    assert_has(r.err, want);
    test_run_clear(&r);
  }
}

/* moe-layout is deprecated: a warning, and the format alone decides the layout. */
static void
test_deprecated_option(void)
{
  const Case c = {TINY, FALSE, NOW, 2, 0};
  g_autofree char *conf = new_path("deprecated");
  g_autofree char *dst = new_path("deprecated-out");
  Run r;

  g_assert_cmpint(g_mkdir(conf, 0755), ==, 0);
  g_free(test_write(conf, "10-test.conf",
                    "plugin \"hf\" {}\nplugin \"qwen3_moe\" {}\nplugin \"vllm\" {}\n"
                    "plugin \"npu-ascend\" {\n  moe-layout = \"processed\"\n}\n"));
  r = run_wsync("convert", synth(TINY, FALSE), dst, "--conf-dir", conf, "--plugin-dir",
                plugin_dir(), "--target", "vllm-ascend", "--tp", "2", NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.err, ==,
                  "wsync: plugin \"npu-ascend\": option moe-layout = \"processed\" is deprecated "
                  "and ignored: vllm-ascend writes the processed expert layout with --format "
                  "kernel and the loader layout with --format sharded-state\n");
  test_run_clear(&r);
  check_ascend(&c, dst, PREPROCESSED);
  /* -q: no warning */
  r = run_wsync("-q", "plugins", "--conf-dir", conf, "--plugin-dir", plugin_dir(), NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.err, ==, "");
  test_run_clear(&r);
}

/* The shipped conf.d files parse, select the plugin with its defaults, and convert. */
static void
test_shipped_conf(void)
{
  static const char *const files[] = {"10-hf.conf", "20-vllm.conf", "30-qwen3_moe.conf",
                                      "40-npu-ascend.conf"};
  g_autofree char *conf = new_path("shipped");
  g_autofree char *dst = NULL, *kernel = NULL;
  Run r;

  g_assert_cmpint(g_mkdir(conf, 0755), ==, 0);
  for (guint i = 0; i < G_N_ELEMENTS(files); i++) {
    g_autofree char *from = g_test_build_filename(G_TEST_DIST, "..", "conf.d", files[i], NULL);
    g_autofree char *to = g_build_filename(conf, files[i], NULL);
    test_copy(from, to);
  }
  r = run_wsync("plugins", "--conf-dir", conf, "--plugin-dir", plugin_dir(), NULL);
  g_assert_cmpint(r.status, ==, 0);
  g_assert_cmpstr(r.err, ==, "");
  assert_has(r.out, "npu-ascend  active");
  assert_has(r.out, "vLLM-Ascend: MoE experts in the npu_grouped_matmul layout, NPU environment");
  assert_has(r.out, "ascend-processed-experts priority 0  serves vllm-ascend");
  assert_has(r.out, "ascend-visible-devices   priority 0  serves npu-ascend");
  assert_has(r.out, "cann-pythonpath          priority 0  serves npu-ascend");
  assert_has(r.out, "npu-alloc-conf           priority 0  serves npu-ascend");
  assert_has(r.out, "npu-nz-off               priority 0  serves npu-ascend");
  test_run_clear(&r);
  dst = convert(synth(TINY, FALSE), conf, "vllm-ascend", NULL, 2, 0);
  check_ascend(&(Case){TINY, FALSE, NOW, 2, 0}, dst, PREPROCESSED);
  kernel = convert(synth(TINY, FALSE), conf, "vllm-ascend", "kernel", 2, 0);
  check_ascend(&(Case){TINY, FALSE, NOW, 2, 0}, kernel, PROCESSED);
}

/* ------------------------------------------------------------------ tests: wsync env */

/* `wsync env --backend @backend --mode @mode [--json]` in an environment of @set only
 * (of the variables the patches read); returns stdout. */
static char *
env_output(const char *backend, const char *mode, gboolean json, const char *const *set)
{
  const char *args[] = {"env", "--conf-dir", CONF, "--plugin-dir", plugin_dir(),
                        "--backend", backend, "--mode", mode, json ? "--json" : NULL, NULL};
  static const char *const none[] = {NULL};
  Run r = run_wsync_env(args, set != NULL ? set : none);
  char *out;

  if (r.status != 0)
    g_error("wsync env: exit %d\n%s", r.status, r.err);
  if (strcmp(backend, "npu-ascend") == 0) {
    g_assert_cmpstr(r.err, ==, "");
  } else { /* a backend this plugin does not patch: the note that says so */
    g_autofree char *note = g_strdup_printf(
        "wsync env: note: no plugin patches the environment of backend \"%s\", so there is "
        "nothing to set (backends with patches: npu-ascend)\n",
        backend);
    g_assert_cmpstr(r.err, ==, note);
  }
  out = g_steal_pointer(&r.out);
  test_run_clear(&r);
  return out;
}

#define WHY_DEVICES                                                                           \
  "# torch_npu selects NPUs by ASCEND_RT_VISIBLE_DEVICES and does not translate "             \
  "CUDA_VISIBLE_DEVICES, which is the only one set: copied"
#define WHY_PYTHONPATH                                                                        \
  "# Ray workers do not inherit the toolkit's shell set-up (set_env.sh): the CANN Python "    \
  "packages in $ASCEND_TOOLKIT_HOME/python/site-packages go first on PYTHONPATH"
#define WHY_ALLOC                                                                             \
  "# colocated memory saving (sleep/wake-up) breaks with the expandable_segments:True that "  \
  "NPU images set; an empty value is not enough, it must be set to False explicitly"
#define WHY_NZ                                                                                \
  "# vLLM-Ascend refuses weight updates with FRACTAL_NZ on (its default, mode 1): wake_up "   \
  "and start_weight_update raise \"FRACTAL_NZ mode is enabled\" unless it is 0; an "          \
  "additional_config weight_nz_mode, which takes precedence, must be 0 as well"
#define EXPORT_NZ "export VLLM_ASCEND_ENABLE_NZ='0'"
/* The variable goes (vllm_ascend/ascend_config.py:361-372 @ 182b75ea84ff): the
 * additional_config key that replaces it, advised whatever the variable says. */
#define WHY_NZ_CONFIG                                                                         \
  "# vLLM-Ascend main warns that VLLM_ASCEND_ENABLE_NZ will be removed in the next release: " \
  "from then on only additional_config weight_nz_mode turns FRACTAL_NZ off (read from the "   \
  "releases for vLLM 0.20 on, where it overrides the variable; ignored before), so give "     \
  "both: vllm serve --additional-config '{\"weight_nz_mode\": 0}', or "                       \
  "LLM(..., additional_config={\"weight_nz_mode\": 0}), merged into any additional_config "   \
  "already given"
#define SETTING_NZ "# engine setting (no export makes it): additional_config.weight_nz_mode = 0"

/* The output, line by line. */
static void
assert_lines(const char *out, const char *const *want)
{
  g_auto(GStrv) lines = g_strsplit(out, "\n", -1);
  guint n = g_strv_length(lines), k = 0;

  /* the output ends with a newline, or is empty */
  g_assert_true(n >= 1);
  g_assert_cmpstr(lines[n - 1], ==, "");
  for (; want[k] != NULL; k++) {
    if (k >= n - 1)
      g_error("line %u missing: want \"%s\"", k + 1, want[k]);
    g_assert_cmpstr(lines[k], ==, want[k]);
  }
  g_assert_cmpuint(k, ==, n - 1);
}

static void
test_env_colocate(void)
{
  static const char *const set[] = {"CUDA_VISIBLE_DEVICES", "0,1,2,3", "ASCEND_TOOLKIT_HOME",
                                    "/usr/local/Ascend/ascend-toolkit/latest", "PYTHONPATH",
                                    "/opt/rl:/opt/x", NULL};
  static const char *const want[] = {
      WHY_DEVICES,
      "export ASCEND_RT_VISIBLE_DEVICES='0,1,2,3'",
      WHY_PYTHONPATH,
      "export PYTHONPATH='/usr/local/Ascend/ascend-toolkit/latest/python/site-packages:/opt/rl:"
      "/opt/x'",
      WHY_ALLOC,
      "export PYTORCH_NPU_ALLOC_CONF='expandable_segments:False'",
      WHY_NZ,
      EXPORT_NZ,
      WHY_NZ_CONFIG,
      SETTING_NZ,
      NULL};
  g_autofree char *out = env_output("npu-ascend", "colocate", FALSE, set);

  assert_lines(out, want);
}

/* Server mode: no allocator setting; NZ off all the same (start_weight_update). */
static void
test_env_server(void)
{
  static const char *const set[] = {"CUDA_VISIBLE_DEVICES", "3", "ASCEND_TOOLKIT_HOME",
                                    "/usr/local/Ascend/ascend-toolkit/latest/", NULL};
  static const char *const want[] = {
      WHY_DEVICES, "export ASCEND_RT_VISIBLE_DEVICES='3'", WHY_PYTHONPATH,
      "export PYTHONPATH='/usr/local/Ascend/ascend-toolkit/latest/python/site-packages'", WHY_NZ,
      EXPORT_NZ, WHY_NZ_CONFIG, SETTING_NZ, NULL};
  g_autofree char *out = env_output("npu-ascend", "server", FALSE, set);

  assert_lines(out, want);
}

/* ASCEND_RT_VISIBLE_DEVICES already set: left alone; the toolkit already on PYTHONPATH:
 * moved to the front, not repeated; other allocator options kept, expandable_segments
 * set to False in place. */
static void
test_env_existing(void)
{
  static const char *const set[] = {
      "CUDA_VISIBLE_DEVICES", "0,1", "ASCEND_RT_VISIBLE_DEVICES", "4,5",
      "ASCEND_TOOLKIT_HOME", "/opt/cann",
      "PYTHONPATH", "/a:/opt/cann/python/site-packages:/b",
      "PYTORCH_NPU_ALLOC_CONF", "garbage_collection_threshold:0.6, expandable_segments:True,"
                                "max_split_size_mb:128",
      "VLLM_ASCEND_ENABLE_NZ", "0",
      NULL};
  static const char *const want[] = {
      WHY_PYTHONPATH,
      "export PYTHONPATH='/opt/cann/python/site-packages:/a:/b'",
      WHY_ALLOC,
      "export PYTORCH_NPU_ALLOC_CONF='garbage_collection_threshold:0.6,expandable_segments:False,"
      "max_split_size_mb:128'",
      WHY_NZ_CONFIG,
      SETTING_NZ,
      NULL};
  g_autofree char *out = env_output("npu-ascend", "colocate", FALSE, set);

  assert_lines(out, want);
}

/* An empty PYTORCH_NPU_ALLOC_CONF is not enough: set explicitly; other options without
 * expandable_segments get it appended. */
static void
test_env_alloc_conf(void)
{
  static const char *const empty[] = {"PYTORCH_NPU_ALLOC_CONF", "", "VLLM_ASCEND_ENABLE_NZ", "0",
                                      NULL};
  static const char *const other[] = {"PYTORCH_NPU_ALLOC_CONF", "max_split_size_mb:64",
                                      "VLLM_ASCEND_ENABLE_NZ", "0", NULL};
  static const char *const want_empty[] = {
      WHY_ALLOC, "export PYTORCH_NPU_ALLOC_CONF='expandable_segments:False'", WHY_NZ_CONFIG,
      SETTING_NZ, NULL};
  static const char *const want_other[] = {
      WHY_ALLOC, "export PYTORCH_NPU_ALLOC_CONF='max_split_size_mb:64,expandable_segments:False'",
      WHY_NZ_CONFIG, SETTING_NZ, NULL};
  g_autofree char *a = env_output("npu-ascend", "colocate", FALSE, empty);
  g_autofree char *b = env_output("npu-ascend", "colocate", FALSE, other);

  assert_lines(a, want_empty);
  assert_lines(b, want_other);
}

/* No variable to set: only the additional_config advice, which wsync cannot check; a
 * backend without patches: nothing printed. */
static void
test_env_nothing(void)
{
  static const char *const cuda[] = {"CUDA_VISIBLE_DEVICES", "0", NULL};
  static const char *const nz_off[] = {"VLLM_ASCEND_ENABLE_NZ", "0", NULL};
  static const char *const want_a[] = {WHY_NZ_CONFIG, SETTING_NZ, NULL};
  g_autofree char *a = env_output("npu-ascend", "server", FALSE, nz_off);
  g_autofree char *b = env_output("vllm", "colocate", FALSE, cuda);
  g_autofree char *c = env_output("cuda", "server", FALSE, cuda);

  assert_lines(a, want_a);
  g_assert_cmpstr(b, ==, "");
  g_assert_cmpstr(c, ==, "");
}

/* VLLM_ASCEND_ENABLE_NZ: set to 0 in both modes when unset, empty or not what Python's
 * int() reads as 0 (vLLM-Ascend's default is 1, and its wake_up and start_weight_update
 * refuse every mode but 0: docs/vllm-ascend.md §4); left alone when it is 0 already.
 * additional_config weight_nz_mode = 0 advised in every case: the variable goes, and
 * wsync cannot see the engine's additional_config (§6). */
static void
test_env_nz(void)
{
  static const char *const want[] = {WHY_NZ, EXPORT_NZ, WHY_NZ_CONFIG, SETTING_NZ, NULL};
  static const char *const want_off[] = {WHY_NZ_CONFIG, SETTING_NZ, NULL};
  static const char *const want_colocate[] = {
      WHY_ALLOC, "export PYTORCH_NPU_ALLOC_CONF='expandable_segments:False'", WHY_NZ, EXPORT_NZ,
      WHY_NZ_CONFIG, SETTING_NZ, NULL};
  static const char *const want_colocate_off[] = {
      WHY_ALLOC, "export PYTORCH_NPU_ALLOC_CONF='expandable_segments:False'", WHY_NZ_CONFIG,
      SETTING_NZ, NULL};
  static const char *const off[] = {"0", "00", " 0 ", "+0", "-0", NULL};
  /* "++0" and "+-0" are no number to int(), which raises on them as on "" */
  static const char *const on[] = {"1", "2", "", "zero", "++0", "+-0", "-+0", "0x0", NULL};
  static const char *const off_set[] = {"VLLM_ASCEND_ENABLE_NZ", "0", NULL};
  g_autofree char *server = env_output("npu-ascend", "server", FALSE, NULL);
  g_autofree char *colocate = env_output("npu-ascend", "colocate", FALSE, NULL);
  g_autofree char *colocate_off = env_output("npu-ascend", "colocate", FALSE, off_set);

  assert_lines(server, want);
  assert_lines(colocate, want_colocate);
  assert_lines(colocate_off, want_colocate_off);
  for (guint i = 0; off[i] != NULL; i++) {
    const char *set[] = {"VLLM_ASCEND_ENABLE_NZ", off[i], NULL};
    g_autofree char *out = env_output("npu-ascend", "server", FALSE, set);

    assert_lines(out, want_off);
  }
  for (guint i = 0; on[i] != NULL; i++) {
    const char *set[] = {"VLLM_ASCEND_ENABLE_NZ", on[i], NULL};
    g_autofree char *out = env_output("npu-ascend", "server", FALSE, set);

    assert_lines(out, want);
  }
}

/* --json gives the same as data. */
static void
test_env_json(void)
{
  static const char *const set[] = {"CUDA_VISIBLE_DEVICES", "0,1", "ASCEND_TOOLKIT_HOME",
                                    "/opt/cann", NULL};
  g_autofree char *text = env_output("npu-ascend", "colocate", FALSE, set);
  g_autofree char *json = env_output("npu-ascend", "colocate", TRUE, set);
  g_autofree char *none = env_output("vllm", "server", TRUE, set);
  g_autoptr(JsonParser) parser = json_parser_new();
  g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
  GError *error = NULL;
  JsonObject *root, *setting;
  JsonArray *vars, *settings;

  json_parser_load_from_data(parser, json, -1, &error);
  g_assert_no_error(error);
  root = json_node_get_object(json_parser_get_root(parser));
  g_assert_cmpstr(json_object_get_string_member(root, "backend"), ==, "npu-ascend");
  g_assert_cmpstr(json_object_get_string_member(root, "mode"), ==, "colocate");
  {
    /* exactly these members */
    g_autoptr(GList) members = json_object_get_members(root);
    g_autoptr(GString) keys = g_string_new(NULL);
    members = g_list_sort(members, (GCompareFunc)strcmp);
    for (GList *m = members; m != NULL; m = m->next)
      g_string_append_printf(keys, "%s%s", keys->len > 0 ? "," : "", (const char *)m->data);
    g_assert_cmpstr(keys->str, ==, "backend,mode,settings,variables");
  }
  vars = json_object_get_array_member(root, "variables");
  settings = json_object_get_array_member(root, "settings");
  g_assert_cmpuint(json_array_get_length(vars), ==, 4);
  g_assert_cmpuint(json_array_get_length(settings), ==, 1);
  g_assert_cmpuint(g_strv_length(lines), ==, 2 * 4 + 2 + 1);
  for (guint i = 0; i < json_array_get_length(vars); i++) {
    JsonObject *v = json_array_get_object_element(vars, i);
    g_autofree char *comment =
        g_strdup_printf("# %s", json_object_get_string_member(v, "reason"));
    g_autofree char *export_line =
        g_strdup_printf("export %s='%s'", json_object_get_string_member(v, "name"),
                        json_object_get_string_member(v, "value"));
    g_assert_cmpstr(lines[2 * i], ==, comment);
    g_assert_cmpstr(lines[2 * i + 1], ==, export_line);
  }
  g_assert_cmpstr(json_object_get_string_member(
                      json_array_get_object_element(vars, 0), "name"), ==,
                  "ASCEND_RT_VISIBLE_DEVICES");
  g_assert_cmpstr(json_object_get_string_member(json_array_get_object_element(vars, 1), "value"),
                  ==, "/opt/cann/python/site-packages");
  /* the setting: the same name, value and reason as the text's two comment lines */
  setting = json_array_get_object_element(settings, 0);
  g_assert_cmpuint(json_object_get_size(setting), ==, 3);
  g_assert_cmpstr(json_object_get_string_member(setting, "name"), ==,
                  "additional_config.weight_nz_mode");
  g_assert_cmpstr(json_object_get_string_member(setting, "value"), ==, "0");
  {
    g_autofree char *comment =
        g_strdup_printf("# %s", json_object_get_string_member(setting, "reason"));
    g_assert_cmpstr(comment, ==, WHY_NZ_CONFIG);
    g_assert_cmpstr(lines[2 * 4], ==, WHY_NZ_CONFIG);
    g_assert_cmpstr(lines[2 * 4 + 1], ==, SETTING_NZ);
  }

  json_parser_load_from_data(parser, none, -1, &error);
  g_assert_no_error(error);
  root = json_node_get_object(json_parser_get_root(parser));
  g_assert_cmpstr(json_object_get_string_member(root, "backend"), ==, "vllm");
  g_assert_cmpuint(json_array_get_length(json_object_get_array_member(root, "variables")), ==, 0);
  g_assert_cmpuint(json_array_get_length(json_object_get_array_member(root, "settings")), ==, 0);
}

/* The plan records each expert tensor's layout state and credits the hook. */
static void
test_plan_records_state(void)
{
  for (int i = 0; i < 2; i++) {
    const char *layout = i ? PREPROCESSED : PROCESSED;
    g_autofree char *line = g_strdup_printf(
        "  model.layers.0.mlp.experts.routed_experts.w2_weight  BF16 %s  16384 bytes  by "
        "converter vllm-ascend (plugin vllm), then hook ascend-processed-experts (plugin "
        "npu-ascend)  state %s\n",
        i ? "[8, 64, 16]" : "[8, 16, 64]", layout);
    Run r = run_wsync("plan", synth(TINY, FALSE), "--conf-dir", CONF, "--plugin-dir",
                      plugin_dir(), "--target", "vllm-ascend", "--format", format_of(layout),
                      "--tp", "2", NULL);
    g_assert_cmpint(r.status, ==, 0);
    assert_has(r.out, line);
    test_run_clear(&r);
    r = run_wsync("plan", synth(TINY, FALSE), "--conf-dir", CONF, "--plugin-dir", plugin_dir(),
                  "--target", "vllm-ascend", "--format", format_of(layout), "--tp", "2", "--json",
                  NULL);
    g_autofree char *json = g_strdup_printf("\"layout_state\" : \"%s\"", layout);
    assert_has(r.out, json);
    test_run_clear(&r);
  }
}

int
main(int argc, char **argv)
{
  int status;

  g_test_init(&argc, &argv, NULL);
  work_dir = test_tmpdir();
  conf_dirs = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
  synth_dirs = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
  ref_dirs = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);

  g_test_add_func("/npu-ascend/layout/tiny-tp1-2-4", test_tiny_tp);
  g_test_add_func("/npu-ascend/plan-records-state", test_plan_records_state);
  g_test_add_func("/npu-ascend/layout/odd-tp1-2-4", test_odd_tp);
  g_test_add_func("/npu-ascend/layout/ep", test_ep);
  g_test_add_func("/npu-ascend/refuse/uneven-ep", test_refuse_uneven_ep);
  g_test_add_func("/npu-ascend/layout/old-version", test_old_version);
  g_test_add_func("/npu-ascend/layout/fused-input", test_fused_input);
  g_test_add_func("/npu-ascend/round-trip/hf", test_round_trip);
  g_test_add_func("/npu-ascend/round-trip/processed-preprocessed-processed",
                  test_processed_preprocessed_processed);
  g_test_add_func("/npu-ascend/round-trip/vllm", test_vllm_and_back);
  g_test_add_func("/npu-ascend/state/already-processed", test_already_processed);
  g_test_add_func("/npu-ascend/state/reading-follows-files", test_reading_follows_files);
  g_test_add_func("/npu-ascend/state/unrecorded", test_unrecorded_state);
  g_test_add_func("/npu-ascend/state/tensor-record-wins", test_tensor_state_wins);
  g_test_add_func("/npu-ascend/state/bad-record", test_bad_recorded_state);
  g_test_add_func("/npu-ascend/transpose/paths-identical", test_transpose_paths_identical);
  g_test_add_func("/npu-ascend/plan", test_plan);
  g_test_add_func("/npu-ascend/plan/nd-note", test_plan_nd_note);
  g_test_add_func("/npu-ascend/plan/wake-up-note", test_plan_wake_up_note);
  g_test_add_func("/npu-ascend/config/bad-option", test_bad_option);
  g_test_add_func("/npu-ascend/config/deprecated-option", test_deprecated_option);
  g_test_add_func("/npu-ascend/config/shipped", test_shipped_conf);
  g_test_add_func("/npu-ascend/env/colocate", test_env_colocate);
  g_test_add_func("/npu-ascend/names/old-wsync", test_old_ascend_names);
  g_test_add_func("/npu-ascend/names/refuse-0.27.0", test_refuse_ascend_0_27_0);
  g_test_add_func("/npu-ascend/env/server", test_env_server);
  g_test_add_func("/npu-ascend/env/existing", test_env_existing);
  g_test_add_func("/npu-ascend/env/alloc-conf", test_env_alloc_conf);
  g_test_add_func("/npu-ascend/env/nothing", test_env_nothing);
  g_test_add_func("/npu-ascend/env/json", test_env_json);
  g_test_add_func("/npu-ascend/env/nz", test_env_nz);

  status = g_test_run();
  test_rmtree(work_dir);
  g_free(work_dir);
  g_hash_table_unref(conf_dirs);
  g_hash_table_unref(synth_dirs);
  g_hash_table_unref(ref_dirs);
  return status;
}
