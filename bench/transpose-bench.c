/* bench/transpose-bench: the transpose kernels (core/transpose.c) on the shapes of
 * `wsync convert --target vllm-ascend --format kernel` on Qwen3-30B-A3B (issue 14), each
 * path against memcpy of the same bytes.
 *
 * The calls are the ones core/exec.c makes through copy_inner() (core/copy.c): a tensor
 * is cut into slabs of at most SLAB_MAX = 2 MiB of output rows (cut_tensor()), and each
 * slab is assembled in a staging buffer by wsync_transpose() of the source columns it
 * covers:
 *   w13: output [E, H, 2I] = [E, 2048, 1536] bf16, 3072-byte rows, 682 rows a slab; each
 *        slab is gate_proj [768, 2048] (4096-byte source rows) transposed into the left
 *        half of those rows and up_proj into the right half (staging + 1536);
 *   w2:  output [E, I, H] = [E, 768, 2048], 4096-byte rows, 512 a slab, from down_proj
 *        [2048, 768] (1536-byte source rows).
 * "hot" repeats one expert (its source stays in the caches); "cold" walks a fresh
 * mapping of a 1 GiB memfd, as a real run walks its input's map (each page faulted in
 * once, none in the caches).  Each figure is the median of REPS repetitions; the machine
 * is shared, so the rate is given per second of user CPU time (getrusage) as well as
 * per second of wall time.  Not run by `make check`: run it by hand,
 *   bench/transpose-bench [REPS [PATH]]
 * (PATH: portable, sse2, avx2, avx512 or memcpy: that one alone).
 */
#define _GNU_SOURCE
#include "config.h"

#include <glib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/transpose.h"

#define SLAB_MAX (2u << 20) /* core/exec.c */
#define COLD_BYTES (1u << 30)
#define HOT_BYTES (256u << 20) /* transposed per hot repetition */

typedef struct {
  const char *name;
  guint64 rows, cols; /* one source matrix, elements */
  guint n_parts;      /* source matrices side by side in each output row */
} Shape;

static const Shape shapes[] = {
  {"w13 gate|up [768,2048] -> [2048,1536]", 768, 2048, 2},
  {"w2 down [2048,768] -> [768,2048]", 2048, 768, 1},
};

enum { KIND_MEMCPY = WSYNC_TRANSPOSE_N_PATHS };

/* One expert of @s from @src (its parts one after the other) through the staging
 * buffer, slab by slab, with path @kind (or memcpy of the same bytes). */
static void
one_expert(const Shape *s, int kind, const guint8 *src, guint8 *staging)
{
  const gsize esize = 2, ss = s->cols * esize, part_bytes = s->rows * s->cols * esize;
  const gsize ds = s->n_parts * s->rows * esize; /* an output row */
  const guint64 slab_rows = SLAB_MAX / ds;

  for (guint64 c0 = 0; c0 < s->cols; c0 += slab_rows) {
    guint64 n = MIN(slab_rows, s->cols - c0);
    for (guint p = 0; p < s->n_parts; p++) {
      const guint8 *from = src + p * part_bytes + c0 * esize;
      guint8 *to = staging + p * s->rows * esize;
      if (kind == KIND_MEMCPY)
        memcpy(staging + p * n * s->rows * esize, src + p * part_bytes + c0 * s->rows * esize,
               n * s->rows * esize);
      else
        wsync_transpose_with((WsyncTransposePath)kind, from, ss, to, ds, s->rows, n, esize);
    }
  }
}

static double
seconds(struct timeval tv)
{
  return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
}

typedef struct {
  double wall, user, sys;
} Times;

static void
now(Times *t)
{
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  t->wall = (double)g_get_monotonic_time() * 1e-6;
  t->user = seconds(ru.ru_utime);
  t->sys = seconds(ru.ru_stime);
}

static int
cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double
median(double *v, int n)
{
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int
main(int argc, char **argv)
{
  int reps = argc > 1 ? atoi(argv[1]) : 5;
  guint8 *staging = g_malloc(SLAB_MAX);
  int fd = memfd_create("transpose-bench", 0);

  if (reps < 1 || reps > 100 || fd < 0 || ftruncate(fd, COLD_BYTES) != 0) {
    fprintf(stderr, "usage: %s [REPS 1-100 [PATH]] (and a 1 GiB memfd)\n", argv[0]);
    return 2;
  }
  {
    guint8 *m = mmap(NULL, COLD_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
      return 2;
    for (gsize i = 0; i < COLD_BYTES; i += 8) {
      guint64 v = i * 0x9E3779B97F4A7C15u;
      memcpy(m + i, &v, 8);
    }
    munmap(m, COLD_BYTES);
  }
  printf("median of %d; GB/s per second of user CPU (wall), user+sys s of the median\n", reps);
  for (guint si = 0; si < G_N_ELEMENTS(shapes); si++) {
    const Shape *s = &shapes[si];
    const gsize expert = s->n_parts * s->rows * s->cols * 2;
    printf("%s, %zu bytes an expert\n", s->name, expert);
    for (int kind = 0; kind <= KIND_MEMCPY; kind++) {
      if (kind != KIND_MEMCPY && !wsync_transpose_path_supported((WsyncTransposePath)kind))
        continue;
      const char *name =
          kind == KIND_MEMCPY ? "memcpy" : wsync_transpose_path_name((WsyncTransposePath)kind);
      if (argc > 2 && strcmp(argv[2], name) != 0)
        continue;
      for (int cold = 0; cold <= 1; cold++) {
        double user[100], wall[100], sys[100], bytes = 0;
        for (int r = 0; r < reps; r++) {
          Times t0, t1;
          const guint8 *map = NULL;
          if (cold) {
            map = mmap(NULL, COLD_BYTES, PROT_READ, MAP_SHARED, fd, 0);
            if (map == MAP_FAILED)
              return 2;
          } else {
            map = g_malloc(expert);
            memset((void *)map, 0x5a, expert);
            one_expert(s, kind, map, staging); /* warm */
          }
          gsize n_experts = (cold ? COLD_BYTES : HOT_BYTES) / expert;
          now(&t0);
          for (gsize e = 0; e < n_experts; e++)
            one_expert(s, kind, cold ? map + e * expert : map, staging);
          now(&t1);
          bytes = (double)(n_experts * expert);
          user[r] = t1.user - t0.user;
          sys[r] = t1.sys - t0.sys;
          wall[r] = t1.wall - t0.wall;
          if (cold)
            munmap((void *)map, COLD_BYTES);
          else
            g_free((void *)map);
        }
        double u = median(user, reps), w = median(wall, reps), y = median(sys, reps);
        printf("  %-8s %-4s %6.2f GB/s (%6.2f wall)  user %.3f s sys %.3f s  %.0f MB\n", name,
               cold ? "cold" : "hot", bytes / u / 1e9, bytes / w / 1e9, u, y, bytes / 1e6);
        fflush(stdout);
      }
    }
  }
  close(fd);
  g_free(staging);
  return 0;
}
