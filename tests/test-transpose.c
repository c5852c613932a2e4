/* The transpose kernels (core/transpose.c): every path against a naive reference, on
 * shapes that are and are not multiples of the tile and vector widths (1xN, Nx1,
 * 33x65, random), with padded row strides and unaligned addresses, for 1-, 2-, 4- and
 * 8-byte elements; the vector paths give the same bytes as the portable one; nothing
 * outside the destination block is touched; WSYNC_TRANSPOSE selects the path. */
#include <glib.h>
#include <string.h>

#include "core/transpose.h"

/* A source block, its destination, with room around both. */
typedef struct {
  guint64 rows, cols;
  gsize esize;
  gsize ss, ds;         /* row strides, bytes */
  gsize src_off, dst_off; /* bytes before the block (misalignment) */
  guint8 *src, *dst;
  gsize src_len, dst_len;
} Block;

#define GUARD 0xA5

static void
block_init(Block *b, guint64 rows, guint64 cols, gsize esize, gsize src_pad, gsize dst_pad,
           gsize src_off, gsize dst_off, guint32 seed)
{
  GRand *rand = g_rand_new_with_seed(seed);

  b->rows = rows;
  b->cols = cols;
  b->esize = esize;
  b->ss = cols * esize + src_pad;
  b->ds = rows * esize + dst_pad;
  b->src_off = src_off;
  b->dst_off = dst_off;
  b->src_len = src_off + rows * b->ss + 64;
  b->dst_len = dst_off + cols * b->ds + 64;
  b->src = g_malloc(b->src_len);
  b->dst = g_malloc(b->dst_len);
  for (gsize i = 0; i < b->src_len; i++)
    b->src[i] = (guint8)g_rand_int(rand);
  memset(b->dst, GUARD, b->dst_len);
  g_rand_free(rand);
}

static void
block_clear(Block *b)
{
  g_free(b->src);
  g_free(b->dst);
}

static void
run(Block *b, WsyncTransposePath path)
{
  memset(b->dst, GUARD, b->dst_len);
  wsync_transpose_with(path, b->src + b->src_off, b->ss, b->dst + b->dst_off, b->ds, b->rows,
                       b->cols, b->esize);
}

/* Every element where it belongs, every other byte of the destination untouched. */
static void
check_against_reference(const Block *b, const char *what)
{
  guint8 *want = g_malloc(b->dst_len);

  memset(want, GUARD, b->dst_len);
  for (guint64 i = 0; i < b->rows; i++)
    for (guint64 j = 0; j < b->cols; j++)
      memcpy(want + b->dst_off + j * b->ds + i * b->esize,
             b->src + b->src_off + i * b->ss + j * b->esize, b->esize);
  for (gsize k = 0; k < b->dst_len; k++)
    if (b->dst[k] != want[k]) {
      gsize rel = k - b->dst_off;
      g_error("%s: %" G_GUINT64_FORMAT "x%" G_GUINT64_FORMAT " esize %zu: byte %zu (dst row %zu, "
              "byte %zu of it) is %02x, want %02x",
              what, b->rows, b->cols, b->esize, k, k >= b->dst_off ? rel / b->ds : 0,
              k >= b->dst_off ? rel % b->ds : 0, b->dst[k], want[k]);
    }
  g_free(want);
}

/* Runs every supported path on one block shape: each against the reference, and the
 * vector paths byte for byte against the portable one. */
static void
check_shape(guint64 rows, guint64 cols, gsize esize, gsize src_pad, gsize dst_pad, gsize src_off,
            gsize dst_off, guint32 seed)
{
  Block b;
  guint8 *portable;

  block_init(&b, rows, cols, esize, src_pad, dst_pad, src_off, dst_off, seed);
  run(&b, WSYNC_TRANSPOSE_PORTABLE);
  check_against_reference(&b, "portable");
  portable = g_memdup2(b.dst, b.dst_len);
  for (int p = WSYNC_TRANSPOSE_PORTABLE + 1; p < WSYNC_TRANSPOSE_N_PATHS; p++) {
    if (!wsync_transpose_path_supported((WsyncTransposePath)p))
      continue;
    run(&b, (WsyncTransposePath)p);
    check_against_reference(&b, wsync_transpose_path_name((WsyncTransposePath)p));
    g_assert_cmpmem(b.dst, b.dst_len, portable, b.dst_len);
  }
  /* and the active path, as copy_inner calls it */
  memset(b.dst, GUARD, b.dst_len);
  wsync_transpose(b.src + b.src_off, b.ss, b.dst + b.dst_off, b.ds, rows, cols, esize);
  g_assert_cmpmem(b.dst, b.dst_len, portable, b.dst_len);
  g_free(portable);
  block_clear(&b);
}

static const gsize esizes[] = {2, 4, 1, 8};

/* Shapes around the micro-tile (4, 8, 16, 32) and cache-tile (64, 1 KiB) sizes. */
static void
test_fixed_shapes(void)
{
  static const guint64 shapes[][2] = {
      {1, 1},   {1, 7},    {7, 1},   {1, 300}, {300, 1}, {2, 3},   {4, 4},   {8, 8},
      {16, 16}, {15, 17},  {17, 15}, {33, 65}, {65, 33}, {64, 64}, {63, 65}, {64, 128},
      {128, 64}, {100, 3}, {3, 100}, {129, 257}, {40, 48}, {48, 40}, {5, 40}, {40, 5},
      /* across the AVX-512 cache tiles (64 rows, 1 KiB of source row) and its micro-tiles
       * (16 rows, 64 bytes) */
      {65, 513}, {80, 1030}, {17, 600}, {160, 272}, {31, 33},
  };

  for (guint e = 0; e < G_N_ELEMENTS(esizes); e++)
    for (guint s = 0; s < G_N_ELEMENTS(shapes); s++)
      check_shape(shapes[s][0], shapes[s][1], esizes[e], 0, 0, 0, 0, s * 31 + e);
}

/* Padded strides (a slice of a wider tensor, as a TP shard is) and blocks that start
 * at odd byte addresses (unaligned vector loads and stores). */
static void
test_strides_and_alignment(void)
{
  for (guint e = 0; e < G_N_ELEMENTS(esizes); e++) {
    gsize es = esizes[e];
    check_shape(33, 65, es, 6 * es, 10 * es, 0, 0, 1);
    check_shape(33, 65, es, 3, 5, 1, 3, 2);
    check_shape(64, 64, es, es, 0, es, 1, 3);
    check_shape(17, 130, es, 0, 7 * es, 7, 0, 4);
  }
}

/* Random shapes, strides and offsets. */
static void
test_random_shapes(void)
{
  GRand *rand = g_rand_new_with_seed(20240611);
  guint n = g_test_thorough() ? 400 : 120;

  for (guint k = 0; k < n; k++) {
    gsize es = esizes[g_rand_int_range(rand, 0, G_N_ELEMENTS(esizes))];
    guint64 rows = (guint64)g_rand_int_range(rand, 1, 150);
    guint64 cols = (guint64)g_rand_int_range(rand, 1, 150);
    gsize src_pad = g_rand_boolean(rand) ? (gsize)g_rand_int_range(rand, 0, 40) : 0;
    gsize dst_pad = g_rand_boolean(rand) ? (gsize)g_rand_int_range(rand, 0, 40) : 0;
    gsize src_off = (gsize)g_rand_int_range(rand, 0, 8);
    gsize dst_off = (gsize)g_rand_int_range(rand, 0, 8);
    check_shape(rows, cols, es, src_pad, dst_pad, src_off, dst_off, k);
  }
  g_rand_free(rand);
}

/* Shapes of real expert matrices (Qwen3-30B-A3B: H 2048, I 768 at tp 1, 192 at tp 4),
 * with the power-of-two row strides that make caches alias. */
static void
test_expert_shapes(void)
{
  check_shape(768, 2048, 2, 0, 0, 0, 0, 11);
  check_shape(2048, 192, 2, 0, 0, 0, 0, 12);
  check_shape(192, 2048, 4, 0, 0, 0, 0, 13);
}

/* Destination rows a multiple of 4 KiB apart take the AVX-512 32x32 kernel (whole-line
 * stores) in tiles of 32 source rows: rows past the last 32 (16x32, then element by
 * element), columns past the last 32 and past a 1 KiB tile, odd addresses, and the w2
 * slab of a vLLM-Ascend expert as core/exec.c cuts it (2048 x 512 of a [2048, 768]
 * down_proj, 1536-byte source rows, into 4096-byte staging rows). */
static void
test_aliasing_destination(void)
{
  static const guint64 shapes[][2] = {
      {32, 32}, {53, 70}, {48, 32}, {31, 64}, {85, 600}, {100, 545}, {16, 33}, {1, 40},
  };
  for (guint s = 0; s < G_N_ELEMENTS(shapes); s++) {
    guint64 rows = shapes[s][0], cols = shapes[s][1];
    gsize dst_pad = 4096 - (gsize)rows * 2;
    check_shape(rows, cols, 2, 0, dst_pad, 0, 0, 40 + s);
    check_shape(rows, cols, 2, 6, dst_pad + 4096, 3, 1, 60 + s);
  }
  check_shape(2048, 512, 2, 512, 0, 0, 0, 80);
}

/* Empty blocks touch nothing. */
static void
test_empty(void)
{
  guint8 buf[16];

  memset(buf, GUARD, sizeof buf);
  for (int p = 0; p < WSYNC_TRANSPOSE_N_PATHS; p++) {
    wsync_transpose_with((WsyncTransposePath)p, buf, 8, buf + 8, 8, 0, 4, 2);
    wsync_transpose_with((WsyncTransposePath)p, buf, 8, buf + 8, 8, 4, 0, 2);
  }
  for (guint i = 0; i < sizeof buf; i++)
    g_assert_cmpuint(buf[i], ==, GUARD);
}

static void
test_path_names(void)
{
  g_assert_cmpstr(wsync_transpose_path_name(WSYNC_TRANSPOSE_PORTABLE), ==, "portable");
  g_assert_cmpstr(wsync_transpose_path_name(WSYNC_TRANSPOSE_SSE2), ==, "sse2");
  g_assert_cmpstr(wsync_transpose_path_name(WSYNC_TRANSPOSE_AVX2), ==, "avx2");
  g_assert_cmpstr(wsync_transpose_path_name(WSYNC_TRANSPOSE_AVX512), ==, "avx512");
  g_assert_true(wsync_transpose_path_supported(WSYNC_TRANSPOSE_PORTABLE));
  /* an AVX-512 CPU has AVX2, and an AVX2 CPU has SSE2 */
  if (wsync_transpose_path_supported(WSYNC_TRANSPOSE_AVX512))
    g_assert_true(wsync_transpose_path_supported(WSYNC_TRANSPOSE_AVX2));
  if (wsync_transpose_path_supported(WSYNC_TRANSPOSE_AVX2))
    g_assert_true(wsync_transpose_path_supported(WSYNC_TRANSPOSE_SSE2));
  for (int p = 0; p < WSYNC_TRANSPOSE_N_PATHS; p++)
    g_test_message("path %s: %s", wsync_transpose_path_name((WsyncTransposePath)p),
                   wsync_transpose_path_supported((WsyncTransposePath)p) ? "supported"
                                                                          : "not supported");
}

/* The best path the CPU has that is no better than @want. */
static WsyncTransposePath
expected_path(WsyncTransposePath want)
{
  for (int p = want; p > 0; p--)
    if (wsync_transpose_path_supported((WsyncTransposePath)p))
      return (WsyncTransposePath)p;
  return WSYNC_TRANSPOSE_PORTABLE;
}

/* WSYNC_TRANSPOSE is read once per process: each value in a fresh subprocess. */
static void
check_env_child(const char *value, WsyncTransposePath want)
{
  if (value != NULL)
    g_setenv("WSYNC_TRANSPOSE", value, TRUE);
  else
    g_unsetenv("WSYNC_TRANSPOSE");
  g_assert_cmpstr(wsync_transpose_path_name(wsync_transpose_active_path()), ==,
                  wsync_transpose_path_name(want));
  /* read once: a later change does not switch paths */
  g_setenv("WSYNC_TRANSPOSE", value != NULL && strcmp(value, "portable") == 0 ? "avx2" : "portable",
           TRUE);
  g_assert_cmpstr(wsync_transpose_path_name(wsync_transpose_active_path()), ==,
                  wsync_transpose_path_name(want));
}

static void
test_env_unset(void)
{
  if (g_test_subprocess()) {
    check_env_child(NULL, expected_path(WSYNC_TRANSPOSE_N_PATHS - 1));
    return;
  }
  g_test_trap_subprocess(NULL, 0, G_TEST_SUBPROCESS_INHERIT_STDERR);
  g_test_trap_assert_passed();
}

static void
test_env_portable(void)
{
  if (g_test_subprocess()) {
    check_env_child("portable", WSYNC_TRANSPOSE_PORTABLE);
    return;
  }
  g_test_trap_subprocess(NULL, 0, G_TEST_SUBPROCESS_INHERIT_STDERR);
  g_test_trap_assert_passed();
}

static void
test_env_sse2(void)
{
  if (g_test_subprocess()) {
    check_env_child("SSE2", expected_path(WSYNC_TRANSPOSE_SSE2));
    return;
  }
  g_test_trap_subprocess(NULL, 0, G_TEST_SUBPROCESS_INHERIT_STDERR);
  g_test_trap_assert_passed();
}

/* An unknown value is ignored: the best path. */
static void
test_env_unknown(void)
{
  if (g_test_subprocess()) {
    check_env_child("neon", expected_path(WSYNC_TRANSPOSE_N_PATHS - 1));
    return;
  }
  g_test_trap_subprocess(NULL, 0, G_TEST_SUBPROCESS_INHERIT_STDERR);
  g_test_trap_assert_passed();
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/transpose/path-names", test_path_names);
  g_test_add_func("/transpose/empty", test_empty);
  g_test_add_func("/transpose/fixed-shapes", test_fixed_shapes);
  g_test_add_func("/transpose/strides-and-alignment", test_strides_and_alignment);
  g_test_add_func("/transpose/random-shapes", test_random_shapes);
  g_test_add_func("/transpose/expert-shapes", test_expert_shapes);
  g_test_add_func("/transpose/aliasing-destination", test_aliasing_destination);
  g_test_add_func("/transpose/env/unset", test_env_unset);
  g_test_add_func("/transpose/env/portable", test_env_portable);
  g_test_add_func("/transpose/env/sse2", test_env_sse2);
  g_test_add_func("/transpose/env/unknown", test_env_unknown);
  return g_test_run();
}
