/* core/rankfile.c, the sender's half of the distributed sync without MPI: every rank
 * file of a plan is rebuilt in memory from its header (rank_files_new()) and its data
 * cut into ranges of whole rows (rank_file_cut()), each range filled on its own from the
 * plan's ops limited to its rows (rank_range_items(), rank_item_run()), and the bytes
 * must be those of the file `wsync convert` writes, for range sizes from "one row at a
 * time" to "the whole file".  Qwen3-MoE and Qwen3.5-MoE from `wsync synth --pattern
 * index` (every element encodes where it came from), vllm in both formats, with ep, and
 * vllm-ascend's transposed experts, whose ops walk the tensor's rows with a permuted
 * axis. */
#include <string.h>

#include <wsync/wsync.h>

#include "../core/rankfile.h"
#include "testutil.h"

static char *work_dir;
static WsyncContext *ctx;

static const char *
conf_dir(void)
{
  return test_env_dir("WSYNC_TEST_CONF_DIR");
}

static const char *
plugin_dir(void)
{
  return test_env_dir("WSYNC_TEST_BUILT_PLUGIN_DIR");
}

static void
run_ok(const char *const *args)
{
  g_autoptr(GPtrArray) a = g_ptr_array_new();

  for (guint i = 0; args[i] != NULL; i++)
    g_ptr_array_add(a, (gpointer)args[i]);
  test_run_ok(a);
}

typedef struct {
  const char *config; /* configs/NAME */
  const char *target;
  const char *format;
  const char *tp, *ep;
} Case;

/* `wsync synth --pattern index` of the case's config, then `wsync convert` of it; the
 * plan of the same conversion, made here. */
static WsyncPlan *
convert(const Case *c, char **src_out, char **dst_out)
{
  g_autofree char *config = g_test_build_filename(G_TEST_DIST, "..", "configs", c->config, NULL);
  char *src = g_strdup_printf("%s/src-%s", work_dir, c->config);
  char *dst = g_strdup_printf("%s/%s-%s-%s-tp%s-ep%s", work_dir, c->config, c->target,
                              c->format, c->tp, c->ep);
  GError *error = NULL;

  if (!g_file_test(src, G_FILE_TEST_IS_DIR)) {
    const char *synth[] = {"synth", "--conf-dir", conf_dir(), "--plugin-dir", plugin_dir(),
                           "--config", config, src, "--pattern", "index", NULL};
    run_ok(synth);
  }
  const char *args[] = {"convert", src,      dst,       "--conf-dir", conf_dir(),
                        "--plugin-dir", plugin_dir(), "--target", c->target, "--format",
                        c->format, "--tp",   c->tp,     "--ep",       c->ep, NULL};
  run_ok(args);
  WsyncPlanOptions o = {.target = c->target, .format = c->format, .format_explicit = TRUE,
                        .tp = (guint)atoi(c->tp), .ep = (guint)atoi(c->ep), .rank = -1,
                        .threads = 1};
  WsyncPlan *plan = wsync_plan_new(ctx, src, &o, &error);
  g_assert_no_error(error);
  *src_out = src;
  *dst_out = dst;
  return plan;
}

/* The ranges of @file in order, each made of whole rows and at most @max_bytes unless it
 * is a single row, together covering the data once. */
static void
assert_ranges_cover(const RankFile *file, GPtrArray *ranges, guint64 max_bytes)
{
  guint64 at = file->header_len;

  for (guint i = 0; i < ranges->len; i++) {
    const RankRange *r = ranges->pdata[i];
    g_assert_cmpuint(r->offset, ==, at);
    g_assert_cmpuint(r->pieces->len, >, 0);
    if (r->nbytes > max_bytes) {
      const RankPiece *only = &g_array_index(r->pieces, RankPiece, 0);
      g_assert_cmpuint(r->pieces->len, ==, 1);
      g_assert_cmpuint(only->to - only->from, ==, 1);
    }
    at += r->nbytes;
  }
  g_assert_cmpuint(at, ==, file->size);
}

/* Every rank file of @plan rebuilt range by range equals convert's file in @dst. */
static void
assert_ranges_make_files(WsyncPlan *plan, const char *dst, guint64 max_bytes)
{
  guint n_files = 0, n_runs = 0;

  for (guint l = 0; l < plan->outputs->len; l++) {
    g_autoptr(GPtrArray) files = rank_files_new(plan, plan->outputs->pdata[l]);
    for (guint f = 0; f < files->len; f++, n_files++) {
      const RankFile *file = files->pdata[f];
      g_autofree char *path = g_build_filename(dst, file->name, NULL);
      g_autofree char *expected = NULL;
      gsize len = 0;
      GError *error = NULL;
      g_file_get_contents(path, &expected, &len, &error);
      g_assert_no_error(error);
      g_assert_cmpuint(len, ==, file->size);

      /* poisoned, so that a byte no item writes shows */
      g_autofree guint8 *built = g_malloc(file->size);
      memset(built, 0xa5, file->size);
      memcpy(built, file->header, file->header_len);
      g_autoptr(GPtrArray) ranges = rank_file_cut(file, max_bytes);
      assert_ranges_cover(file, ranges, max_bytes);
      for (guint r = 0; r < ranges->len; r++) {
        const RankRange *range = ranges->pdata[r];
        g_autoptr(GArray) items = g_array_new(FALSE, FALSE, sizeof(RankItem));
        guint64 written = 0;
        /* a bucket of its own, as the sender fills one */
        g_autofree guint8 *bucket = g_malloc(range->nbytes);
        memset(bucket, 0x5a, range->nbytes);
        rank_range_items(plan, file, range, items);
        for (guint i = 0; i < items->len; i++) {
          const RankItem *item = &g_array_index(items, RankItem, i);
          const guint8 *run = NULL;
          guint64 at = 0, run_bytes = 0;
          g_assert_true(rank_item_run(item, bucket, &error));
          g_assert_no_error(error);
          written += item->bytes;
          /* a run of the input, as the sender would send it from the input's map */
          if (rank_item_run_of_input(item, &run, &at, &run_bytes)) {
            g_assert_cmpuint(run_bytes, ==, item->bytes);
            g_assert_cmpuint(at + run_bytes, <=, range->nbytes);
            g_assert_cmpmem(bucket + at, run_bytes, run, run_bytes);
            n_runs++;
          }
        }
        g_assert_cmpuint(written, ==, range->nbytes); /* each byte once */
        memcpy(built + range->offset, bucket, range->nbytes);
      }
      if (memcmp(built, expected, file->size) != 0) {
        guint64 i = 0;
        while (built[i] == (guint8)expected[i])
          i++;
        g_error("%s rebuilt in ranges of %" G_GUINT64_FORMAT " bytes differs from convert's "
                "at byte %" G_GUINT64_FORMAT,
                file->name, max_bytes, i);
      }
    }
  }
  g_assert_cmpuint(n_files, >, 0);
  g_assert_cmpuint(n_runs, >, 0);
}

static void
test_ranges(gconstpointer data)
{
  const Case *c = data;
  g_autofree char *src = NULL, *dst = NULL;
  g_autoptr(WsyncPlan) plan = convert(c, &src, &dst);

  /* 1: one row per range; 4096: many rows, tensors cut across ranges; the whole file */
  const guint64 sizes[] = {1, 4096, 100000, G_MAXUINT64};
  for (guint i = 0; i < G_N_ELEMENTS(sizes); i++)
    assert_ranges_make_files(plan, dst, sizes[i]);
}

static const Case cases[] = {
    {"tiny-qwen3-moe.json", "vllm", "sharded-state", "2", "1"},
    {"tiny-qwen3-moe.json", "vllm", "kernel", "2", "4"},
    {"tiny-qwen3-moe.json", "vllm-ascend", "kernel", "2", "4"},
    {"tiny-qwen3.5-moe.json", "vllm", "sharded-state", "4", "4"},
    {"tiny-qwen3.5-moe.json", "vllm-ascend", "kernel", "2", "1"},
};

int
main(int argc, char **argv)
{
  GError *error = NULL;

  g_test_init(&argc, &argv, NULL);
  work_dir = test_tmpdir();
  const char *conf_dirs[] = {conf_dir(), NULL};
  const char *plugin_dirs[] = {plugin_dir(), NULL};
  ctx = wsync_context_new(conf_dirs, plugin_dirs, NULL, &error);
  g_assert_no_error(error);
  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    const Case *c = &cases[i];
    g_autofree char *name = g_strdup_printf("/rankfile/ranges/%s/%s/%s/tp%s-ep%s", c->config,
                                            c->target, c->format, c->tp, c->ep);
    g_test_add_data_func(name, c, test_ranges);
  }
  int status = g_test_run();
  wsync_context_free(ctx);
  test_rmtree(work_dir);
  g_free(work_dir);
  return status;
}
