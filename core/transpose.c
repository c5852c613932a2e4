/* wsync: fast 2-D transposes (see transpose.h).
 *
 * Every path walks the block in cache tiles (a tile of the source and its image in the
 * destination stay in the cache together), and each tile in micro-tiles: M x M
 * elements held in registers and shuffled there (the vector paths), or moved one
 * element at a time (the portable path, and the edges of the vector paths where fewer
 * than M rows or columns are left).  Loads and stores go straight to the
 * input and output maps; nothing is buffered in between.
 *
 * The vector kernels are the classic unpack networks: an 8x8 block of 16-bit elements
 * is transposed in three rounds of interleaves (16-, 32-, then 64-bit units), a 4x4
 * block of 32-bit elements in two.  The AVX2 kernels run the same network in each
 * 128-bit lane of 256-bit registers on two halves of the block, then swap lanes
 * (_mm256_permute2x128_si256) to put the four sub-blocks in place.  The AVX-512 kernels
 * take whole 64-byte cache lines of the source: 16 rows of 32 16-bit elements (three
 * rounds of interleaves in each 128-bit lane, then a permutation of 64-bit pairs joins
 * the two halves of each column, stored as 32-byte halves of 32 destination rows; or,
 * where destination rows are a multiple of 4 KiB apart, 32 rows through that network in
 * two halves, joined so that each of the 32 destination rows takes one 64-byte store), or
 * 16 rows of 16 32-bit elements (two rounds, then a 4x4 transpose of 128-bit lanes).
 * The vector code is compiled with __attribute__((target(...))) and only called when
 * __builtin_cpu_supports() says so; the rest of the program is built for the baseline
 * CPU.
 */
#include "config.h"

#include <string.h>

#include "transpose.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define HAVE_X86_KERNELS 1
#include <immintrin.h>
#endif

/* The portable loop's cache tile: 64 x 64 elements, 8 KiB (2-byte) or 16 KiB (4-byte)
 * of source and as much of destination. */
#define TILE 64

/* The vector paths' cache tile, in source rows and columns: multiples of every
 * micro-tile size (4, 8, 16). */
#define TILE_ROWS 128
#define TILE_COLS 16

/* ------------------------------------------------------------------ portable */

/* Element by element; the fixed-size memcpy calls compile to plain moves. */
static inline void
scalar_block(const guint8 *src, gsize ss, guint8 *dst, gsize ds, guint64 rows, guint64 cols,
             gsize esize)
{
  switch (esize) {
  case 2:
    for (guint64 i = 0; i < rows; i++)
      for (guint64 j = 0; j < cols; j++) {
        guint16 v;
        memcpy(&v, src + i * ss + j * 2, 2);
        memcpy(dst + j * ds + i * 2, &v, 2);
      }
    break;
  case 4:
    for (guint64 i = 0; i < rows; i++)
      for (guint64 j = 0; j < cols; j++) {
        guint32 v;
        memcpy(&v, src + i * ss + j * 4, 4);
        memcpy(dst + j * ds + i * 4, &v, 4);
      }
    break;
  case 1:
    for (guint64 i = 0; i < rows; i++)
      for (guint64 j = 0; j < cols; j++)
        dst[j * ds + i] = src[i * ss + j];
    break;
  case 8:
    for (guint64 i = 0; i < rows; i++)
      for (guint64 j = 0; j < cols; j++) {
        guint64 v;
        memcpy(&v, src + i * ss + j * 8, 8);
        memcpy(dst + j * ds + i * 8, &v, 8);
      }
    break;
  default:
    for (guint64 i = 0; i < rows; i++)
      for (guint64 j = 0; j < cols; j++)
        memcpy(dst + j * ds + i * esize, src + i * ss + j * esize, esize);
    break;
  }
}

static void
transpose_portable(const guint8 *src, gsize ss, guint8 *dst, gsize ds, guint64 rows,
                   guint64 cols, gsize esize)
{
  for (guint64 i0 = 0; i0 < rows; i0 += TILE) {
    guint64 ni = MIN(TILE, rows - i0);
    for (guint64 j0 = 0; j0 < cols; j0 += TILE)
      scalar_block(src + i0 * ss + j0 * esize, ss, dst + j0 * ds + i0 * esize, ds, ni,
                   MIN(TILE, cols - j0), esize);
  }
}

/* ------------------------------------------------------------------ x86 kernels */

#ifdef HAVE_X86_KERNELS

/* One tile, rows [i0, i1) x columns [j0, j1): strips MC columns wide, each as MR x MC
 * micro-tiles from top to bottom, and element by element where fewer than MR rows or MC
 * columns are left at the tile's edges. */
#define ONE_TILE(MR, MC, ESIZE, MICRO)                                                     \
  do {                                                                                     \
    guint64 j = j0;                                                                        \
    for (; j + (MC) <= j1; j += (MC)) {                                                    \
      guint64 i = i0;                                                                      \
      for (; i + (MR) <= i1; i += (MR))                                                    \
        MICRO(src + i * ss + j * (ESIZE), ss, dst + j * ds + i * (ESIZE), ds);             \
      if (i < i1)                                                                          \
        scalar_block(src + i * ss + j * (ESIZE), ss, dst + j * ds + i * (ESIZE), ds,       \
                     i1 - i, (MC), (ESIZE));                                               \
    }                                                                                      \
    if (j < j1)                                                                            \
      scalar_block(src + i0 * ss + j * (ESIZE), ss, dst + j * ds + i0 * (ESIZE), ds,       \
                   i1 - i0, j1 - j, (ESIZE));                                              \
  } while (0)

/* The block in tiles of TILE_ROWS x TILE_COLS source elements, taken column strip by
 * column strip so that each destination row is written in order; inside a tile, strips
 * M columns wide from top to bottom, each as M x M micro-tiles (MICRO) and, where fewer
 * than M rows or columns are left at the block's edges, element by element.  (On
 * 768 x 2048 expert matrices, whose power-of-two source strides alias in the caches,
 * this destination-major order measured 10-25% faster than square row-major tiles.) */
#define DEFINE_TILED(name, attr, M, ESIZE, MICRO)                                          \
  attr static void name(const guint8 *src, gsize ss, guint8 *dst, gsize ds, guint64 rows,  \
                        guint64 cols)                                                      \
  {                                                                                        \
    for (guint64 j0 = 0; j0 < cols; j0 += TILE_COLS) {                                     \
      guint64 j1 = MIN(j0 + TILE_COLS, cols);                                              \
      for (guint64 i0 = 0; i0 < rows; i0 += TILE_ROWS) {                                   \
        guint64 i1 = MIN(i0 + TILE_ROWS, rows);                                            \
        ONE_TILE(M, M, ESIZE, MICRO);                                                      \
      }                                                                                    \
    }                                                                                      \
  }

#define SSE2 __attribute__((target("sse2")))
#define AVX2 __attribute__((target("avx2")))

#define LOAD128(p) _mm_loadu_si128((const __m128i *)(const void *)(p))
#define STORE128(p, v) _mm_storeu_si128((__m128i *)(void *)(p), (v))
#define LOAD256(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define STORE256(p, v) _mm256_storeu_si256((__m256i *)(void *)(p), (v))

/* --- SSE2 */

/* 8x8 16-bit: rows a0..a7 -> columns.  After round 1, b(2k), b(2k+1) hold the pairs
 * (a2k[c], a2k+1[c]) for c = 0..3 and 4..7; after round 2, c0..c3 hold columns
 * {0,1}, {2,3}, {4,5}, {6,7} of rows 0-3 and c4..c7 the same of rows 4-7; round 3
 * joins the halves. */
SSE2 static inline void
sse2_8x8_u16(const guint8 *src, gsize ss, guint8 *dst, gsize ds)
{
  __m128i a0 = LOAD128(src + 0 * ss), a1 = LOAD128(src + 1 * ss);
  __m128i a2 = LOAD128(src + 2 * ss), a3 = LOAD128(src + 3 * ss);
  __m128i a4 = LOAD128(src + 4 * ss), a5 = LOAD128(src + 5 * ss);
  __m128i a6 = LOAD128(src + 6 * ss), a7 = LOAD128(src + 7 * ss);
  __m128i b0 = _mm_unpacklo_epi16(a0, a1), b1 = _mm_unpackhi_epi16(a0, a1);
  __m128i b2 = _mm_unpacklo_epi16(a2, a3), b3 = _mm_unpackhi_epi16(a2, a3);
  __m128i b4 = _mm_unpacklo_epi16(a4, a5), b5 = _mm_unpackhi_epi16(a4, a5);
  __m128i b6 = _mm_unpacklo_epi16(a6, a7), b7 = _mm_unpackhi_epi16(a6, a7);
  __m128i c0 = _mm_unpacklo_epi32(b0, b2), c1 = _mm_unpackhi_epi32(b0, b2);
  __m128i c2 = _mm_unpacklo_epi32(b1, b3), c3 = _mm_unpackhi_epi32(b1, b3);
  __m128i c4 = _mm_unpacklo_epi32(b4, b6), c5 = _mm_unpackhi_epi32(b4, b6);
  __m128i c6 = _mm_unpacklo_epi32(b5, b7), c7 = _mm_unpackhi_epi32(b5, b7);
  STORE128(dst + 0 * ds, _mm_unpacklo_epi64(c0, c4));
  STORE128(dst + 1 * ds, _mm_unpackhi_epi64(c0, c4));
  STORE128(dst + 2 * ds, _mm_unpacklo_epi64(c1, c5));
  STORE128(dst + 3 * ds, _mm_unpackhi_epi64(c1, c5));
  STORE128(dst + 4 * ds, _mm_unpacklo_epi64(c2, c6));
  STORE128(dst + 5 * ds, _mm_unpackhi_epi64(c2, c6));
  STORE128(dst + 6 * ds, _mm_unpacklo_epi64(c3, c7));
  STORE128(dst + 7 * ds, _mm_unpackhi_epi64(c3, c7));
}

/* 4x4 32-bit. */
SSE2 static inline void
sse2_4x4_u32(const guint8 *src, gsize ss, guint8 *dst, gsize ds)
{
  __m128i a0 = LOAD128(src + 0 * ss), a1 = LOAD128(src + 1 * ss);
  __m128i a2 = LOAD128(src + 2 * ss), a3 = LOAD128(src + 3 * ss);
  __m128i b0 = _mm_unpacklo_epi32(a0, a1), b1 = _mm_unpackhi_epi32(a0, a1);
  __m128i b2 = _mm_unpacklo_epi32(a2, a3), b3 = _mm_unpackhi_epi32(a2, a3);
  STORE128(dst + 0 * ds, _mm_unpacklo_epi64(b0, b2));
  STORE128(dst + 1 * ds, _mm_unpackhi_epi64(b0, b2));
  STORE128(dst + 2 * ds, _mm_unpacklo_epi64(b1, b3));
  STORE128(dst + 3 * ds, _mm_unpackhi_epi64(b1, b3));
}

DEFINE_TILED(transpose_sse2_u16, SSE2, 8, 2, sse2_8x8_u16)
DEFINE_TILED(transpose_sse2_u32, SSE2, 4, 4, sse2_4x4_u32)

/* --- AVX2 */

/* The 8x8 16-bit network of sse2_8x8_u16 in each 128-bit lane of a0..a7: out[k] gets,
 * in its low lane, column k of the low lanes' 8x8 block and, in its high lane,
 * column k of the high lanes' block. */
AVX2 static inline void
avx2_lanes_8x8_u16(const __m256i a[8], __m256i out[8])
{
  __m256i b0 = _mm256_unpacklo_epi16(a[0], a[1]), b1 = _mm256_unpackhi_epi16(a[0], a[1]);
  __m256i b2 = _mm256_unpacklo_epi16(a[2], a[3]), b3 = _mm256_unpackhi_epi16(a[2], a[3]);
  __m256i b4 = _mm256_unpacklo_epi16(a[4], a[5]), b5 = _mm256_unpackhi_epi16(a[4], a[5]);
  __m256i b6 = _mm256_unpacklo_epi16(a[6], a[7]), b7 = _mm256_unpackhi_epi16(a[6], a[7]);
  __m256i c0 = _mm256_unpacklo_epi32(b0, b2), c1 = _mm256_unpackhi_epi32(b0, b2);
  __m256i c2 = _mm256_unpacklo_epi32(b1, b3), c3 = _mm256_unpackhi_epi32(b1, b3);
  __m256i c4 = _mm256_unpacklo_epi32(b4, b6), c5 = _mm256_unpackhi_epi32(b4, b6);
  __m256i c6 = _mm256_unpacklo_epi32(b5, b7), c7 = _mm256_unpackhi_epi32(b5, b7);
  out[0] = _mm256_unpacklo_epi64(c0, c4);
  out[1] = _mm256_unpackhi_epi64(c0, c4);
  out[2] = _mm256_unpacklo_epi64(c1, c5);
  out[3] = _mm256_unpackhi_epi64(c1, c5);
  out[4] = _mm256_unpacklo_epi64(c2, c6);
  out[5] = _mm256_unpackhi_epi64(c2, c6);
  out[6] = _mm256_unpacklo_epi64(c3, c7);
  out[7] = _mm256_unpackhi_epi64(c3, c7);
}

/* 16x16 16-bit: rows 0-7 and rows 8-15 each through the lane network (x, y); column k
 * of the block is then [x[k].low | y[k].low] and column 8+k is [x[k].high | y[k].high]. */
AVX2 static inline void
avx2_16x16_u16(const guint8 *src, gsize ss, guint8 *dst, gsize ds)
{
  __m256i a[8], x[8], y[8];

  for (int r = 0; r < 8; r++)
    a[r] = LOAD256(src + (gsize)r * ss);
  avx2_lanes_8x8_u16(a, x);
  for (int r = 0; r < 8; r++)
    a[r] = LOAD256(src + (gsize)(r + 8) * ss);
  avx2_lanes_8x8_u16(a, y);
  for (int k = 0; k < 8; k++) {
    STORE256(dst + (gsize)k * ds, _mm256_permute2x128_si256(x[k], y[k], 0x20));
    STORE256(dst + (gsize)(k + 8) * ds, _mm256_permute2x128_si256(x[k], y[k], 0x31));
  }
}

/* 8x8 32-bit: the 4x4 network in each lane of rows 0-3 (x) and rows 4-7 (y), then
 * column k = [x[k].low | y[k].low], column 4+k = [x[k].high | y[k].high]. */
AVX2 static inline void
avx2_8x8_u32(const guint8 *src, gsize ss, guint8 *dst, gsize ds)
{
  __m256i x[4], y[4];

  for (int h = 0; h < 2; h++) {
    const guint8 *s = src + (gsize)(4 * h) * ss;
    __m256i a0 = LOAD256(s), a1 = LOAD256(s + ss), a2 = LOAD256(s + 2 * ss),
            a3 = LOAD256(s + 3 * ss);
    __m256i b0 = _mm256_unpacklo_epi32(a0, a1), b1 = _mm256_unpackhi_epi32(a0, a1);
    __m256i b2 = _mm256_unpacklo_epi32(a2, a3), b3 = _mm256_unpackhi_epi32(a2, a3);
    __m256i *o = h == 0 ? x : y;
    o[0] = _mm256_unpacklo_epi64(b0, b2);
    o[1] = _mm256_unpackhi_epi64(b0, b2);
    o[2] = _mm256_unpacklo_epi64(b1, b3);
    o[3] = _mm256_unpackhi_epi64(b1, b3);
  }
  for (int k = 0; k < 4; k++) {
    STORE256(dst + (gsize)k * ds, _mm256_permute2x128_si256(x[k], y[k], 0x20));
    STORE256(dst + (gsize)(k + 4) * ds, _mm256_permute2x128_si256(x[k], y[k], 0x31));
  }
}

DEFINE_TILED(transpose_avx2_u16, AVX2, 16, 2, avx2_16x16_u16)
DEFINE_TILED(transpose_avx2_u32, AVX2, 8, 4, avx2_8x8_u32)

/* --- AVX-512 */

#define AVX512 __attribute__((target("avx512f,avx512bw")))
#define LOAD512(p) _mm512_loadu_si512((const void *)(p))
#define STORE512(p, v) _mm512_storeu_si512((void *)(p), (v))

/* 16 rows x 32 columns of 16-bit elements through the network of avx512_16x32_u16()
 * below (which keeps its own copy: built on this helper it measured 8-10% slower on the
 * w13 shapes), for the 32x32 kernel.  Three rounds of
 * interleaves (16-, 32-, then 64-bit units) leave, in 128-bit lane L of x[k] (k < 8),
 * column 8L + k of rows 0-7, and in the same lane of x[8 + k] that column of rows 8-15;
 * a permutation of 64-bit pairs puts the two halves of each column side by side: z[2k]
 * holds columns k (low 256 bits) and 8 + k (high), z[2k + 1] columns 16 + k and 24 + k,
 * each as 16 elements (one per row). */
AVX512 static inline void
avx512_columns_16x32_u16(const guint8 *src, gsize ss, __m512i z[16])
{
  __m512i a[16], b[16];

  for (int r = 0; r < 16; r++)
    a[r] = LOAD512(src + (gsize)r * ss);
  for (int r = 0; r < 16; r += 2) {
    b[r] = _mm512_unpacklo_epi16(a[r], a[r + 1]);
    b[r + 1] = _mm512_unpackhi_epi16(a[r], a[r + 1]);
  }
  for (int g = 0; g < 16; g += 4) {
    a[g] = _mm512_unpacklo_epi32(b[g], b[g + 2]);
    a[g + 1] = _mm512_unpackhi_epi32(b[g], b[g + 2]);
    a[g + 2] = _mm512_unpacklo_epi32(b[g + 1], b[g + 3]);
    a[g + 3] = _mm512_unpackhi_epi32(b[g + 1], b[g + 3]);
  }
  for (int g = 0; g < 16; g += 8)
    for (int k = 0; k < 4; k++) {
      b[g + 2 * k] = _mm512_unpacklo_epi64(a[g + k], a[g + k + 4]);
      b[g + 2 * k + 1] = _mm512_unpackhi_epi64(a[g + k], a[g + k + 4]);
    }
  const __m512i lanes01 = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
  const __m512i lanes23 = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
  for (int k = 0; k < 8; k++) {
    z[2 * k] = _mm512_permutex2var_epi64(b[k], lanes01, b[8 + k]);
    z[2 * k + 1] = _mm512_permutex2var_epi64(b[k], lanes23, b[8 + k]);
  }
}

/* 16 rows x 32 columns of 16-bit elements.  Three rounds of interleaves (16-, 32-, then
 * 64-bit units) leave, in 128-bit lane L of x[k] (k < 8), column 8L + k of rows 0-7,
 * and in the same lane of x[8 + k] that column of rows 8-15; a permutation of 64-bit
 * pairs puts the two halves of each column side by side. */
AVX512 static inline void
avx512_16x32_u16(const guint8 *src, gsize ss, guint8 *dst, gsize ds)
{
  __m512i a[16], b[16];

  for (int r = 0; r < 16; r++)
    a[r] = LOAD512(src + (gsize)r * ss);
  for (int r = 0; r < 16; r += 2) {
    b[r] = _mm512_unpacklo_epi16(a[r], a[r + 1]);
    b[r + 1] = _mm512_unpackhi_epi16(a[r], a[r + 1]);
  }
  for (int g = 0; g < 16; g += 4) {
    a[g] = _mm512_unpacklo_epi32(b[g], b[g + 2]);
    a[g + 1] = _mm512_unpackhi_epi32(b[g], b[g + 2]);
    a[g + 2] = _mm512_unpacklo_epi32(b[g + 1], b[g + 3]);
    a[g + 3] = _mm512_unpackhi_epi32(b[g + 1], b[g + 3]);
  }
  for (int g = 0; g < 16; g += 8)
    for (int k = 0; k < 4; k++) {
      b[g + 2 * k] = _mm512_unpacklo_epi64(a[g + k], a[g + k + 4]);
      b[g + 2 * k + 1] = _mm512_unpackhi_epi64(a[g + k], a[g + k + 4]);
    }
  const __m512i lanes01 = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
  const __m512i lanes23 = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
  for (int k = 0; k < 8; k++) {
    __m512i z0 = _mm512_permutex2var_epi64(b[k], lanes01, b[8 + k]);
    __m512i z1 = _mm512_permutex2var_epi64(b[k], lanes23, b[8 + k]);
    STORE256(dst + (gsize)k * ds, _mm512_castsi512_si256(z0));
    STORE256(dst + (gsize)(8 + k) * ds, _mm512_extracti64x4_epi64(z0, 1));
    STORE256(dst + (gsize)(16 + k) * ds, _mm512_castsi512_si256(z1));
    STORE256(dst + (gsize)(24 + k) * ds, _mm512_extracti64x4_epi64(z1, 1));
  }
}

/* 32 rows x 32 columns: the two 16x32 halves' columns joined, each destination row
 * written as one whole 64-byte store. */
AVX512 static inline void
avx512_32x32_u16(const guint8 *src, gsize ss, guint8 *dst, gsize ds)
{
  __m512i top[16], bottom[16];

  avx512_columns_16x32_u16(src, ss, top);
  avx512_columns_16x32_u16(src + 16 * ss, ss, bottom);
  for (int k = 0; k < 8; k++) {
    /* 0x44: the low 256 bits of each; 0xee: the high 256 bits of each */
    STORE512(dst + (gsize)k * ds, _mm512_shuffle_i64x2(top[2 * k], bottom[2 * k], 0x44));
    STORE512(dst + (gsize)(8 + k) * ds, _mm512_shuffle_i64x2(top[2 * k], bottom[2 * k], 0xee));
    STORE512(dst + (gsize)(16 + k) * ds,
             _mm512_shuffle_i64x2(top[2 * k + 1], bottom[2 * k + 1], 0x44));
    STORE512(dst + (gsize)(24 + k) * ds,
             _mm512_shuffle_i64x2(top[2 * k + 1], bottom[2 * k + 1], 0xee));
  }
}

/* 16x16 32-bit: two rounds of interleaves leave, in lane L of x[4g + k], column 4L + k
 * of rows 4g..4g+3; a 4x4 transpose of lanes across the four row groups joins them. */
AVX512 static inline void
avx512_16x16_u32(const guint8 *src, gsize ss, guint8 *dst, gsize ds)
{
  __m512i a[16], b[16];

  for (int r = 0; r < 16; r++)
    a[r] = LOAD512(src + (gsize)r * ss);
  for (int g = 0; g < 16; g += 4) {
    b[g] = _mm512_unpacklo_epi32(a[g], a[g + 1]);
    b[g + 1] = _mm512_unpackhi_epi32(a[g], a[g + 1]);
    b[g + 2] = _mm512_unpacklo_epi32(a[g + 2], a[g + 3]);
    b[g + 3] = _mm512_unpackhi_epi32(a[g + 2], a[g + 3]);
    a[g] = _mm512_unpacklo_epi64(b[g], b[g + 2]);
    a[g + 1] = _mm512_unpackhi_epi64(b[g], b[g + 2]);
    a[g + 2] = _mm512_unpacklo_epi64(b[g + 1], b[g + 3]);
    a[g + 3] = _mm512_unpackhi_epi64(b[g + 1], b[g + 3]);
  }
  for (int k = 0; k < 4; k++) {
    __m512i y0 = _mm512_shuffle_i64x2(a[k], a[4 + k], 0x88); /* lanes 0, 2 of each */
    __m512i y1 = _mm512_shuffle_i64x2(a[k], a[4 + k], 0xdd); /* lanes 1, 3 */
    __m512i y2 = _mm512_shuffle_i64x2(a[8 + k], a[12 + k], 0x88);
    __m512i y3 = _mm512_shuffle_i64x2(a[8 + k], a[12 + k], 0xdd);
    STORE512(dst + (gsize)k * ds, _mm512_shuffle_i64x2(y0, y2, 0x88));       /* lane 0 */
    STORE512(dst + (gsize)(4 + k) * ds, _mm512_shuffle_i64x2(y1, y3, 0x88)); /* lane 1 */
    STORE512(dst + (gsize)(8 + k) * ds, _mm512_shuffle_i64x2(y0, y2, 0xdd)); /* lane 2 */
    STORE512(dst + (gsize)(12 + k) * ds, _mm512_shuffle_i64x2(y1, y3, 0xdd)); /* lane 3 */
  }
}

/* The AVX-512 kernels walk the block in cache tiles of 64 source rows and 1 KiB of
 * source columns (with 3 KiB and 4 KiB destination and source strides, the expert
 * matrices' power-of-two strides, this measured 1.4x as fast as the destination-major
 * strips of the other paths: each source line is read whole and once), and each tile
 * in strips MC columns wide, MR x MC micro-tiles from top to bottom, the edges element
 * by element. */
#define BIG_TILE_ROWS 64
#define BIG_TILE_BYTES 1024
#define DEFINE_TILED2(name, attr, MR, MC, ESIZE, MICRO)                                    \
  attr static void name(const guint8 *src, gsize ss, guint8 *dst, gsize ds, guint64 rows,  \
                        guint64 cols)                                                      \
  {                                                                                        \
    const guint64 tc = BIG_TILE_BYTES / (ESIZE);                                           \
    for (guint64 i0 = 0; i0 < rows; i0 += BIG_TILE_ROWS) {                                 \
      guint64 i1 = MIN(i0 + BIG_TILE_ROWS, rows);                                          \
      for (guint64 j0 = 0; j0 < cols; j0 += tc) {                                          \
        guint64 j1 = MIN(j0 + tc, cols);                                                   \
        ONE_TILE(MR, MC, ESIZE, MICRO);                                                    \
      }                                                                                    \
    }                                                                                      \
  }

DEFINE_TILED2(transpose_avx512_u16_halves, AVX512, 16, 32, 2, avx512_16x32_u16)

/* Destination rows a multiple of 4 KiB apart (w2 of vLLM-Ascend's experts: [I, H] bf16
 * rows of 4096 bytes) all fall in the same sets of the L1 cache, and the 16x32 kernel
 * writes each of their lines in two halves, from two micro-tiles: there the 32x32 kernel,
 * which writes each line whole, in tiles of 32 source rows, took 15% less user CPU in
 * bench/transpose-bench on a cold source (median of 6 runs: 0.42 s for 1.07 GB against
 * 0.50 s; the same within 5% on a hot one), while on the other strides (w13: 3072-byte
 * rows) it took 25% more on a hot source: so only there.  Rows
 * past the last 32 take the 16x32 kernel, then the element loop. */
#define ALIASING_STRIDE 4096
#define WIDE_TILE_ROWS 32
AVX512 static void
transpose_avx512_u16_whole_lines(const guint8 *src, gsize ss, guint8 *dst, gsize ds,
                                 guint64 rows, guint64 cols)
{
  const guint64 tc = BIG_TILE_BYTES / 2;

  for (guint64 i0 = 0; i0 < rows; i0 += WIDE_TILE_ROWS) {
    guint64 i1 = MIN(i0 + WIDE_TILE_ROWS, rows);
    for (guint64 j0 = 0; j0 < cols; j0 += tc) {
      guint64 j1 = MIN(j0 + tc, cols), j = j0;
      for (; j + 32 <= j1; j += 32) {
        guint64 i = i0;
        for (; i + 32 <= i1; i += 32)
          avx512_32x32_u16(src + i * ss + j * 2, ss, dst + j * ds + i * 2, ds);
        for (; i + 16 <= i1; i += 16)
          avx512_16x32_u16(src + i * ss + j * 2, ss, dst + j * ds + i * 2, ds);
        if (i < i1)
          scalar_block(src + i * ss + j * 2, ss, dst + j * ds + i * 2, ds, i1 - i, 32, 2);
      }
      if (j < j1)
        scalar_block(src + i0 * ss + j * 2, ss, dst + j * ds + i0 * 2, ds, i1 - i0, j1 - j, 2);
    }
  }
}

AVX512 static void
transpose_avx512_u16(const guint8 *src, gsize ss, guint8 *dst, gsize ds, guint64 rows,
                     guint64 cols)
{
  if (ds % ALIASING_STRIDE == 0)
    transpose_avx512_u16_whole_lines(src, ss, dst, ds, rows, cols);
  else
    transpose_avx512_u16_halves(src, ss, dst, ds, rows, cols);
}
DEFINE_TILED2(transpose_avx512_u32, AVX512, 16, 16, 4, avx512_16x16_u32)

#endif /* HAVE_X86_KERNELS */

/* ------------------------------------------------------------------ dispatch */

static const char *const path_names[WSYNC_TRANSPOSE_N_PATHS] = {"portable", "sse2", "avx2",
                                                                   "avx512"};

const char *
wsync_transpose_path_name(WsyncTransposePath path)
{
  return (guint)path < WSYNC_TRANSPOSE_N_PATHS ? path_names[path] : "unknown";
}

gboolean
wsync_transpose_path_supported(WsyncTransposePath path)
{
  switch (path) {
  case WSYNC_TRANSPOSE_PORTABLE:
    return TRUE;
#ifdef HAVE_X86_KERNELS
  case WSYNC_TRANSPOSE_SSE2:
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse2");
  case WSYNC_TRANSPOSE_AVX2:
    /* (libgcc also checks that the OS saves the YMM registers) */
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
  case WSYNC_TRANSPOSE_AVX512:
    /* (and the ZMM and mask registers; valgrind's CPU has no AVX-512: AVX2 runs there) */
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#endif
  default:
    return FALSE;
  }
}

/* The best supported path no better than @want. */
static WsyncTransposePath
best_up_to(WsyncTransposePath want)
{
  for (int p = (int)want; p > WSYNC_TRANSPOSE_PORTABLE; p--)
    if (wsync_transpose_path_supported((WsyncTransposePath)p))
      return (WsyncTransposePath)p;
  return WSYNC_TRANSPOSE_PORTABLE;
}

WsyncTransposePath
wsync_transpose_active_path(void)
{
  static gsize chosen = 0; /* path + 1 */

  if (g_once_init_enter(&chosen)) {
    const char *env = g_getenv("WSYNC_TRANSPOSE");
    WsyncTransposePath want = WSYNC_TRANSPOSE_N_PATHS - 1;
    for (guint p = 0; env != NULL && p < WSYNC_TRANSPOSE_N_PATHS; p++)
      if (g_ascii_strcasecmp(env, path_names[p]) == 0)
        want = (WsyncTransposePath)p;
    g_once_init_leave(&chosen, (gsize)best_up_to(want) + 1);
  }
  return (WsyncTransposePath)(chosen - 1);
}

void
wsync_transpose_with(WsyncTransposePath path, const guint8 *src, gsize src_row_stride,
                     guint8 *dst, gsize dst_row_stride, guint64 rows, guint64 cols, gsize esize)
{
  if (rows == 0 || cols == 0)
    return;
#ifdef HAVE_X86_KERNELS
  if ((esize == 2 || esize == 4) && path != WSYNC_TRANSPOSE_PORTABLE &&
      wsync_transpose_path_supported(path)) {
    if (path == WSYNC_TRANSPOSE_AVX512) {
      if (esize == 2)
        transpose_avx512_u16(src, src_row_stride, dst, dst_row_stride, rows, cols);
      else
        transpose_avx512_u32(src, src_row_stride, dst, dst_row_stride, rows, cols);
    } else if (path == WSYNC_TRANSPOSE_AVX2) {
      if (esize == 2)
        transpose_avx2_u16(src, src_row_stride, dst, dst_row_stride, rows, cols);
      else
        transpose_avx2_u32(src, src_row_stride, dst, dst_row_stride, rows, cols);
    } else {
      if (esize == 2)
        transpose_sse2_u16(src, src_row_stride, dst, dst_row_stride, rows, cols);
      else
        transpose_sse2_u32(src, src_row_stride, dst, dst_row_stride, rows, cols);
    }
    return;
  }
#else
  (void)path;
#endif
  transpose_portable(src, src_row_stride, dst, dst_row_stride, rows, cols, esize);
}

void
wsync_transpose(const guint8 *src, gsize src_row_stride, guint8 *dst, gsize dst_row_stride,
                guint64 rows, guint64 cols, gsize esize)
{
  wsync_transpose_with(wsync_transpose_active_path(), src, src_row_stride, dst, dst_row_stride,
                       rows, cols, esize);
}
