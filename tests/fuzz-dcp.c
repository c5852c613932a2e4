/* Fuzzing the DCP readers: the restricted pickle reader, the .metadata interpreter, the
 * torch.save archive reader (libzip + data.pkl) and the format A shard reader.
 *
 * Targets, chosen by a seed's file name prefix (or, under libFuzzer, by
 * WSYNC_FUZZ_TARGET or the input's first byte):
 *   pickle-*    wsync_pickle_load(), then wsync_dcp_read_blob() of an archive built
 *               around the input as its data.pkl (a blob-* seed's mutated data.pkl fails
 *               the zip's CRC check before it is read, so the blob target alone never
 *               fuzzes the reading of data.pkl)
 *   metadata-*  wsync_dcp_parse_metadata()
 *   blob-*      wsync_dcp_read_blob()
 *   shard-*     wsync_dcp_parse_shard() and wsync_dcp_check_coverage()
 *
 * As a `make check` program (the default build) it needs no clang: it runs every seed of
 * tests/data/dcp-fuzz-seeds, then mutates them deterministically (xorshift64*: bit
 * flips, interesting bytes and integers, truncation, insertion, deletion, duplication,
 * splicing with another seed of the same target) for WSYNC_FUZZ_ITERATIONS inputs
 * (default 30000), stopping early after WSYNC_FUZZ_SECONDS (default 3).  WSYNC_FUZZ_SEED
 * changes the sequence.  A crash aborts the test; leaks show under `make check-valgrind`
 * or an ASan build (./configure CFLAGS='-g -O1 -fsanitize=address,undefined').
 *
 * Longer runs with libFuzzer (clang):
 *   ./configure CC=clang CFLAGS='-g -O1 -fsanitize=address,fuzzer-no-link' && make -j
 *   for t in pickle metadata blob shard; do
 *     clang -g -O1 -fsanitize=address,fuzzer -DWSYNC_LIBFUZZER -DWSYNC_FUZZ_TARGET=\"$t\" \
 *       -Iinclude -I. $(pkg-config --cflags glib-2.0 json-glib-1.0) tests/fuzz-dcp.c \
 *       -o fuzz-dcp-$t .libs/libwsync.so $(pkg-config --libs glib-2.0) -Wl,-rpath,$PWD/.libs
 *     mkdir -p corpus/$t && cp tests/data/dcp-fuzz-seeds/$t-* corpus/$t/
 *   done
 *   ./fuzz-dcp-blob -max_total_time=600 corpus/blob
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include <glib.h>
#include <zip.h>

#include <wsync/error.h>

#include "../core/dcp.h"
#include "../core/pickle.h"

enum { T_PICKLE, T_METADATA, T_BLOB, T_SHARD, N_TARGETS };
static const char *const target_names[N_TARGETS] = {"pickle", "metadata", "blob", "shard"};


/* Every refusal is one clean line: no newline, and no other control character either
 * (a GLOBAL's module with a raw 0x0e in it once reached every later message, found by
 * fuzz-dcp-dir; a newline-only check here had let it pass). */
static void
check_clean_line(const GError *error, const char *target)
{
  for (const guchar *c = (const guchar *)error->message; *c; c++)
    if (*c < 0x20 || *c == 0x7f)
      g_error("a refusal that is not one clean line (target %s): %s", target,
              g_strescape(error->message, NULL));
}

/* Fails unless a refusal is one line with an error, and an accepted blob's data lies
 * inside it. */
static void
check_blob_result(gboolean ok, const WsyncDcpBlob *blob, gsize len, const GError *error,
                  const char *target)
{
  if (!ok && error == NULL)
    g_error("a refusal without an error (target %s)", target);
  if (!ok)
    check_clean_line(error, target);
  if (ok && blob->data_len > 0 &&
      (blob->data_offset > len || blob->data_len > len - blob->data_offset))
    g_error("wsync_dcp_read_blob accepted data [%" G_GUINT64_FORMAT ", +%" G_GUINT64_FORMAT
            ") outside %" G_GSIZE_FORMAT " bytes",
            blob->data_offset, blob->data_len, len);
}

static void
add_stored(zip_t *za, const char *name, const void *data, gsize len)
{
  zip_source_t *s = zip_source_buffer(za, data, len, 0);
  zip_int64_t i = s ? zip_file_add(za, name, s, ZIP_FL_ENC_UTF_8) : -1;
  if (i < 0 || zip_set_file_compression(za, (zip_uint64_t)i, ZIP_CM_STORE, 0) != 0)
    g_error("libzip cannot add %s: %s", name, zip_strerror(za));
}

/* A torch.save archive as DCP writes one chunk: archive/data.pkl (@pkl), byteorder and
 * archive/data/0 of @data_len bytes, all stored, so that the zip's checksums are right
 * whatever the pickle holds. */
static GBytes *
wrap_pickle(const guint8 *pkl, gsize len, gsize data_len)
{
  static const guint8 none[1];
  zip_error_t ze;
  zip_error_init(&ze);
  zip_source_t *buf = zip_source_buffer_create(NULL, 0, 0, &ze);
  zip_t *za = buf ? zip_open_from_source(buf, ZIP_TRUNCATE, &ze) : NULL;
  if (za == NULL)
    g_error("libzip: %s", zip_error_strerror(&ze));
  zip_source_keep(buf); /* read back after zip_close() */
  g_autofree guint8 *zeros = g_malloc0(data_len ? data_len : 1);
  add_stored(za, "archive/data.pkl", len ? pkl : none, len);
  add_stored(za, "archive/byteorder", "little", 6);
  add_stored(za, "archive/data/0", zeros, data_len);
  if (zip_close(za) != 0)
    g_error("libzip: %s", zip_strerror(za));
  zip_stat_t st;
  if (zip_source_stat(buf, &st) != 0 || zip_source_open(buf) != 0)
    g_error("libzip cannot read its own archive back");
  guint8 *out = g_malloc(st.size ? st.size : 1);
  if (zip_source_read(buf, out, st.size) != (zip_int64_t)st.size)
    g_error("libzip cannot read its own archive back");
  zip_source_close(buf);
  zip_source_free(buf);
  zip_error_fini(&ze);
  return g_bytes_new_take(out, st.size);
}

/* The pickle as a chunk's data.pkl, so that what the blob target cannot reach (a mutated
 * data.pkl inside a zip fails its CRC check) is fuzzed: read_data_pkl, the persistent id,
 * the view checks.  The storage entry is first empty, then (when the pickle asked for a
 * storage of some other small size) of that size. */
static void
run_archive(const guint8 *pkl, gsize len)
{
  gsize data_len = 0;
  for (int pass = 0; pass < 2; pass++) {
    g_autoptr(GBytes) zip = wrap_pickle(pkl, len, data_len);
    gsize zlen;
    const guint8 *zdata = g_bytes_get_data(zip, &zlen);
    WsyncDcpBlob blob;
    GError *error = NULL;
    gboolean ok = wsync_dcp_read_blob(zdata, zlen, "fuzz.distcp", &blob, &error);
    check_blob_result(ok, &blob, zlen, error, "pickle as data.pkl");
    g_clear_error(&error);
    if (ok || blob.data_len == 0 || blob.data_len == data_len || blob.data_len > 1u << 16)
      return;
    data_len = blob.data_len;
  }
}

/* Runs one input through one target.  Returns TRUE when the reader accepted it. */
static gboolean
run_target(int target, const guint8 *data, gsize len)
{
  GError *error = NULL;
  gboolean ok = FALSE;
  switch (target) {
  case T_PICKLE: {
    WsyncPickle *pk = wsync_pickle_load(data, len, "fuzz.pkl", &error);
    if (pk) {
      g_free(wsync_pickle_describe(wsync_pickle_root(pk)));
      ok = TRUE;
    }
    wsync_pickle_free(pk);
    run_archive(data, len);
    break;
  }
  case T_METADATA: {
    WsyncDcp *dcp = wsync_dcp_parse_metadata(data, len, "fuzz/.metadata", &error);
    ok = dcp != NULL;
    wsync_dcp_free(dcp); /* no data behind its chunks: no coverage check */
    break;
  }
  case T_BLOB: {
    WsyncDcpBlob blob;
    ok = wsync_dcp_read_blob(data, len, "fuzz.blob", &blob, &error);
    check_blob_result(ok, &blob, len, error, "blob");
    break;
  }
  case T_SHARD: {
    WsyncDcp *dcp =
        wsync_dcp_parse_shard(data, len, "shard-00001-model-00001-of-00001.safetensors", &error);
    if (dcp) {
      ok = TRUE;
      GError *cov = NULL;
      wsync_dcp_check_coverage(dcp, &cov); /* reads the chunks where they overlap */
      g_clear_error(&cov);
    }
    wsync_dcp_free(dcp);
    break;
  }
  default:
    break;
  }
  if (!ok && error == NULL)
    g_error("a refusal without an error (target %s)", target_names[target]);
  if (!ok)
    check_clean_line(error, target_names[target]);
  g_clear_error(&error);
  return ok;
}

#ifdef WSYNC_LIBFUZZER
/* ================================================================ libFuzzer entry point */

int LLVMFuzzerTestOneInput(const guint8 *data, size_t len);

/* SIGTRAP (g_error) as SIGABRT, which libFuzzer reports and saves the input of: a broken
 * rule otherwise left no crash file (fuzz/crash-TARGET-*) to replay. */
static void
trap_to_abort(int sig)
{
  (void)sig;
  abort();
}

int
LLVMFuzzerTestOneInput(const guint8 *data, size_t len)
{
  signal(SIGTRAP, trap_to_abort);
#ifdef WSYNC_FUZZ_TARGET
  for (int t = 0; t < N_TARGETS; t++)
    if (strcmp(WSYNC_FUZZ_TARGET, target_names[t]) == 0) {
      /* An exact-size copy, so that reading past the end is caught. */
      guint8 *copy = len ? g_memdup2(data, len) : NULL;
      run_target(t, copy, len);
      g_free(copy);
      return 0;
    }
  abort();
#else
  if (len == 0)
    return 0;
  guint8 *copy = len > 1 ? g_memdup2(data + 1, len - 1) : NULL;
  run_target(data[0] % N_TARGETS, copy, len - 1);
  g_free(copy);
  return 0;
#endif
}

#else
/* ================================================================ the make check driver */

typedef struct {
  int target;
  char *name;
  GBytes *bytes;
} Seed;

static GPtrArray *seeds; /* Seed* */

static guint64 rng_state;

static guint64
rng(void)
{
  /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * G_GUINT64_CONSTANT(2685821657736338717);
}

static gsize
below(gsize n)
{
  return n ? (gsize)(rng() % n) : 0;
}

static void
seed_free(gpointer p)
{
  Seed *s = p;
  g_free(s->name);
  g_bytes_unref(s->bytes);
  g_free(s);
}

static gint
compare_names(gconstpointer a, gconstpointer b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void
load_seeds(void)
{
  const char *dir_env = g_getenv("WSYNC_FUZZ_SEEDS");
  g_autofree char *dir = NULL;
  if (dir_env)
    dir = g_strdup(dir_env);
  else
    dir = g_test_build_filename(G_TEST_DIST, "data", "dcp-fuzz-seeds", NULL);
  GError *error = NULL;
  GDir *d = g_dir_open(dir, 0, &error);
  g_assert_no_error(error);
  seeds = g_ptr_array_new_with_free_func(seed_free);
  g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
  const char *name;
  while ((name = g_dir_read_name(d)) != NULL)
    g_ptr_array_add(names, g_strdup(name));
  g_dir_close(d);
  g_ptr_array_sort(names, compare_names); /* a stable order */
  for (guint i = 0; i < names->len; i++) {
    const char *n = g_ptr_array_index(names, i);
    int target = -1;
    for (int t = 0; t < N_TARGETS; t++) {
      g_autofree char *prefix = g_strconcat(target_names[t], "-", NULL);
      if (g_str_has_prefix(n, prefix))
        target = t;
    }
    if (target < 0)
      continue;
    g_autofree char *path = g_build_filename(dir, n, NULL);
    char *contents;
    gsize len;
    g_file_get_contents(path, &contents, &len, &error);
    g_assert_no_error(error);
    Seed *s = g_new0(Seed, 1);
    s->target = target;
    s->name = g_strdup(n);
    s->bytes = g_bytes_new_take(contents, len);
    g_ptr_array_add(seeds, s);
  }
  g_assert_cmpuint(seeds->len, >, 0);
}

/* Every seed is a valid input of its target. */
static void
test_seeds(void)
{
  for (guint i = 0; i < seeds->len; i++) {
    const Seed *s = g_ptr_array_index(seeds, i);
    gsize len;
    const guint8 *data = g_bytes_get_data(s->bytes, &len);
    guint8 *copy = len ? g_memdup2(data, len) : NULL;
    if (!run_target(s->target, copy, len))
      g_error("seed %s is refused by its own target", s->name);
    g_free(copy);
  }
}

static const guint64 interesting[] = {0, 1, 2, 0x7f, 0x80, 0xff, 0x100, 0x7fff, 0x8000, 0xffff,
                                      0x7fffffff, 0x80000000u, 0xffffffffu,
                                      G_GUINT64_CONSTANT(0x7fffffffffffffff),
                                      G_GUINT64_CONSTANT(0x8000000000000000), G_MAXUINT64};

static void
insert_bytes(GByteArray *buf, gsize at, const guint8 *bytes, gsize n)
{
  gsize len = buf->len;
  g_byte_array_set_size(buf, (guint)(len + n));
  memmove(buf->data + at + n, buf->data + at, len - at);
  memcpy(buf->data + at, bytes, n);
}

/* Applies one random mutation to @buf (which may grow to at most @cap bytes). */
static void
mutate(GByteArray *buf, const Seed *seed, gsize cap)
{
  gsize len = buf->len;
  switch (below(8)) {
  case 0: /* flip a bit */
    if (len)
      buf->data[below(len)] ^= (guint8)(1u << below(8));
    break;
  case 1: /* an interesting byte */
    if (len)
      buf->data[below(len)] = (guint8)interesting[below(G_N_ELEMENTS(interesting))];
    break;
  case 2: { /* an interesting integer, 2, 4 or 8 bytes little-endian */
    gsize w = (gsize)1 << (1 + below(3));
    if (len >= w) {
      gsize at = below(len - w + 1);
      guint64 v = interesting[below(G_N_ELEMENTS(interesting))];
      if (below(2))
        v = (guint64)len + below(3) - 1;
      for (gsize k = 0; k < w; k++)
        buf->data[at + k] = (guint8)(v >> (8 * k));
    }
    break;
  }
  case 3: /* truncate */
    g_byte_array_set_size(buf, (guint)below(len + 1));
    break;
  case 4: { /* insert random bytes */
    gsize n = 1 + below(8), at = below(len + 1);
    if (len + n > cap)
      break;
    guint8 bytes[8];
    for (gsize k = 0; k < n; k++)
      bytes[k] = (guint8)rng();
    insert_bytes(buf, at, bytes, n);
    break;
  }
  case 5: /* delete a range */
    if (len) {
      gsize at = below(len), n = 1 + below(MIN(len - at, (gsize)64));
      g_byte_array_remove_range(buf, (guint)at, (guint)n);
    }
    break;
  case 6: { /* duplicate a range */
    if (len == 0)
      break;
    gsize at = below(len), n = 1 + below(MIN(len - at, (gsize)64)), to = below(len + 1);
    if (len + n > cap)
      break;
    g_autofree guint8 *piece = g_memdup2(buf->data + at, n);
    insert_bytes(buf, to, piece, n);
    break;
  }
  case 7: { /* splice: our head, another seed's tail (same target) */
    const Seed *other = g_ptr_array_index(seeds, below(seeds->len));
    if (other->target != seed->target)
      break;
    gsize olen;
    const guint8 *odata = g_bytes_get_data(other->bytes, &olen);
    gsize at = below(len + 1), from = below(olen + 1);
    if (at + (olen - from) > cap)
      break;
    g_byte_array_set_size(buf, (guint)at);
    g_byte_array_append(buf, odata + from, (guint)(olen - from));
    break;
  }
  }
}

static void
test_mutations(void)
{
  const char *env = g_getenv("WSYNC_FUZZ_ITERATIONS");
  guint64 iterations = env ? g_ascii_strtoull(env, NULL, 10) : 30000;
  env = g_getenv("WSYNC_FUZZ_SECONDS");
  double seconds = env ? g_ascii_strtod(env, NULL) : 3.0;
  env = g_getenv("WSYNC_FUZZ_SEED");
  rng_state = env ? g_ascii_strtoull(env, NULL, 0) : G_GUINT64_CONSTANT(0x9E3779B97F4A7C15);
  if (rng_state == 0)
    rng_state = 1;

  gint64 start = g_get_monotonic_time();
  guint64 accepted[N_TARGETS] = {0}, tried[N_TARGETS] = {0}, i;
  g_autoptr(GByteArray) buf = g_byte_array_new();
  for (i = 0; i < iterations; i++) {
    if ((i & 63) == 0 && (g_get_monotonic_time() - start) / 1e6 > seconds)
      break;
    const Seed *s = g_ptr_array_index(seeds, below(seeds->len));
    gsize len;
    const guint8 *data = g_bytes_get_data(s->bytes, &len);
    g_byte_array_set_size(buf, 0);
    g_byte_array_append(buf, data, (guint)len);
    for (gsize m = 1 + below(4); m > 0; m--)
      mutate(buf, s, 2 * len + 64);
    /* An exact-size copy, so that a read past the end is caught by ASan and valgrind. */
    guint8 *copy = buf->len ? g_memdup2(buf->data, buf->len) : NULL;
    tried[s->target]++;
    accepted[s->target] += run_target(s->target, copy, buf->len);
    g_free(copy);
  }
  for (int t = 0; t < N_TARGETS; t++)
    g_test_message("%s: %" G_GUINT64_FORMAT " inputs, %" G_GUINT64_FORMAT " accepted",
                   target_names[t], tried[t], accepted[t]);
  g_test_message("%" G_GUINT64_FORMAT " of %" G_GUINT64_FORMAT " iterations in %.1f s", i,
                 iterations, (g_get_monotonic_time() - start) / 1e6);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  load_seeds();
  g_test_add_func("/dcp/fuzz/seeds", test_seeds);
  g_test_add_func("/dcp/fuzz/mutations", test_mutations);
  int rc = g_test_run();
  g_ptr_array_unref(seeds);
  return rc;
}
#endif
