/* The driver the fuzz harnesses share (fuzz-safetensors, fuzz-index, fuzz-config,
 * fuzz-conf, fuzz-dcp-dir).  A harness defines FUZZ_NAME (e.g. "safetensors"), includes
 * this file, and then defines the functions declared below:
 *
 *   fuzz_setup()       once, before any input
 *   fuzz_teardown()    once, at the end (under libFuzzer: at exit(), see below)
 *   fuzz_seeds()       valid inputs, as GBytes*
 *   fuzz_dictionary()  tokens worth inserting (NULL-terminated)
 *   fuzz_one()         runs one input; TRUE when it was accepted.  A refusal is checked
 *                      with fuzz_check_refusal().
 *
 * As a `make check` program (the default build, no clang needed) it runs every seed
 * (each must be accepted), then mutates them deterministically (xorshift64*: bit flips,
 * interesting bytes and integers, truncation, insertion, deletion, duplication,
 * splicing, and tokens of the harness's dictionary) for WSYNC_FUZZ_ITERATIONS inputs
 * (default 100000), stopping after WSYNC_FUZZ_SECONDS (default 2).  WSYNC_FUZZ_SEED
 * changes the sequence.  A crash or a broken rule aborts the test; leaks show under
 * `make check-valgrind`.  `PROGRAM --write-seeds DIR` writes the seeds as files (the
 * initial corpus of `make fuzz`).
 *
 * A harness that defines FUZZ_CASES before including this file also defines
 * fuzz_cases(), the test /fuzz/NAME/cases of `make check` only: inputs fuzzing found,
 * each with what it must give (the exact message fragment of its refusal).
 *
 * Built with -DWSYNC_LIBFUZZER (tests/fuzz.sh, `make fuzz`), the same harness is a
 * libFuzzer target: LLVMFuzzerTestOneInput() runs fuzz_one() on an exact-size copy.
 */
#ifndef WSYNC_FUZZ_DRIVER_H
#define WSYNC_FUZZ_DRIVER_H

#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include <glib.h>
#include <glib/gstdio.h>

#include <wsync/error.h>

static void fuzz_setup(void);
static G_GNUC_UNUSED void fuzz_teardown(void);
static G_GNUC_UNUSED void fuzz_seeds(GPtrArray *seeds);
static G_GNUC_UNUSED const char *const *fuzz_dictionary(void);
static gboolean fuzz_one(const guint8 *data, gsize len);
#ifdef FUZZ_CASES
static G_GNUC_UNUSED void fuzz_cases(void);
#endif

/* Every refusal: a #WSYNC_ERROR error of one of the @n allowed codes, on one line
 * without control characters.  Aborts otherwise. */
static void
fuzz_check_refusal(const GError *error, const WsyncError *allowed, guint n)
{
  if (error == NULL)
    g_error(FUZZ_NAME ": a refusal without an error");
  for (const guchar *c = (const guchar *)error->message; *c; c++)
    if (*c < 0x20 || *c == 0x7f)
      g_error(FUZZ_NAME ": a refusal that is not one clean line: %s",
              g_strescape(error->message, NULL));
  if (error->domain != WSYNC_ERROR)
    g_error(FUZZ_NAME ": a refusal outside WSYNC_ERROR: %s", error->message);
  for (guint i = 0; i < n; i++)
    if ((WsyncError)error->code == allowed[i])
      return;
  g_error(FUZZ_NAME ": a refusal of the wrong class (code %d): %s", error->code, error->message);
}

#ifdef WSYNC_LIBFUZZER
/* ================================================================ libFuzzer */

int LLVMFuzzerTestOneInput(const guint8 *data, size_t len);

/* SIGTRAP (g_error) as SIGABRT, which libFuzzer reports and saves the input of. */
static void
fuzz_trap_to_abort(int sig)
{
  (void)sig;
  abort();
}

int
LLVMFuzzerTestOneInput(const guint8 *data, size_t len)
{
  static gboolean ready;
  if (!ready) {
    fuzz_setup();
    /* libFuzzer ends a run that found nothing with exit(): torn down then, the harness
     * leaves no work directory in $TMPDIR (a crash ends it with _Exit(), and tests/fuzz.sh
     * removes the TMPDIR it gave the target) */
    atexit(fuzz_teardown);
    /* g_error() stops the process with SIGTRAP, which libFuzzer does not catch: a
     * broken rule then left no crash file (fuzz/crash-TARGET-*) to replay */
    signal(SIGTRAP, fuzz_trap_to_abort);
    ready = TRUE;
  }
  /* an exact-size copy, so that a read past the end is caught */
  guint8 *copy = len ? g_memdup2(data, len) : NULL;
  fuzz_one(copy, len);
  g_free(copy);
  return 0;
}

#else
/* ================================================================ the make check driver */

static GPtrArray *fuzz_seed_list; /* GBytes* */
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

/* Every seed is a valid input. */
static void
test_seeds(void)
{
  for (guint i = 0; i < fuzz_seed_list->len; i++) {
    gsize len;
    const guint8 *data = g_bytes_get_data(fuzz_seed_list->pdata[i], &len);
    guint8 *copy = len ? g_memdup2(data, len) : NULL;
    if (!fuzz_one(copy, len))
      g_error(FUZZ_NAME ": seed %u is refused", i);
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
mutate(GByteArray *buf, gsize cap)
{
  gsize len = buf->len;
  switch (below(10)) {
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
    guint8 bytes[8];
    if (len + n > cap)
      break;
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
  case 7: { /* splice: our head, another seed's tail */
    gsize olen;
    const guint8 *odata =
        g_bytes_get_data(fuzz_seed_list->pdata[below(fuzz_seed_list->len)], &olen);
    gsize at = below(len + 1), from = below(olen + 1);
    if (at + (olen - from) > cap)
      break;
    g_byte_array_set_size(buf, (guint)at);
    g_byte_array_append(buf, odata + from, (guint)(olen - from));
    break;
  }
  default: { /* a token of the dictionary, inserted or overwriting */
    const char *const *tokens = fuzz_dictionary();
    guint n_tokens = 0;
    while (tokens[n_tokens] != NULL)
      n_tokens++;
    if (n_tokens == 0)
      break;
    const char *token = tokens[below(n_tokens)];
    gsize n = strlen(token), at = below(len + 1);
    if (below(2) && at + n <= len)
      memcpy(buf->data + at, token, n);
    else if (len + n <= cap)
      insert_bytes(buf, at, (const guint8 *)token, n);
    break;
  }
  }
}

static void
test_mutations(void)
{
  const char *env = g_getenv("WSYNC_FUZZ_ITERATIONS");
  guint64 iterations = env ? g_ascii_strtoull(env, NULL, 10) : 100000;
  env = g_getenv("WSYNC_FUZZ_SECONDS");
  double seconds = env ? g_ascii_strtod(env, NULL) : 2.0;
  env = g_getenv("WSYNC_FUZZ_SEED");
  rng_state = env ? g_ascii_strtoull(env, NULL, 0) : G_GUINT64_CONSTANT(0x9E3779B97F4A7C15);
  if (rng_state == 0)
    rng_state = 1;

  gint64 start = g_get_monotonic_time();
  guint64 accepted = 0, i;
  g_autoptr(GByteArray) buf = g_byte_array_new();
  for (i = 0; i < iterations; i++) {
    /* a time budget, not a test of speed: slow machines and valgrind run fewer inputs */
    if ((i & 15) == 0 && (g_get_monotonic_time() - start) / 1e6 > seconds)
      break;
    gsize len;
    const guint8 *data = g_bytes_get_data(fuzz_seed_list->pdata[below(fuzz_seed_list->len)], &len);
    g_byte_array_set_size(buf, 0);
    g_byte_array_append(buf, data, (guint)len);
    for (gsize m = 1 + below(4); m > 0; m--)
      mutate(buf, 2 * len + 256);
    guint8 *copy = buf->len ? g_memdup2(buf->data, buf->len) : NULL;
    accepted += fuzz_one(copy, buf->len);
    g_free(copy);
  }
  g_test_message(FUZZ_NAME ": %" G_GUINT64_FORMAT " inputs in %.1f s, %" G_GUINT64_FORMAT
                 " accepted",
                 i, (g_get_monotonic_time() - start) / 1e6, accepted);
}

/* --write-seeds DIR: the seeds as files seed-N, for a libFuzzer corpus. */
static int
write_seeds(const char *dir)
{
  g_mkdir_with_parents(dir, 0755);
  for (guint i = 0; i < fuzz_seed_list->len; i++) {
    gsize len;
    const char *data = g_bytes_get_data(fuzz_seed_list->pdata[i], &len);
    g_autofree char *name = g_strdup_printf("seed-%u", i);
    g_autofree char *path = g_build_filename(dir, name, NULL);
    GError *error = NULL;
    if (!g_file_set_contents(path, data, (gssize)len, &error))
      g_error("%s", error->message);
  }
  return 0;
}

int
main(int argc, char **argv)
{
  fuzz_seed_list = g_ptr_array_new_with_free_func((GDestroyNotify)g_bytes_unref);
  if (argc == 3 && strcmp(argv[1], "--write-seeds") == 0) {
    fuzz_seeds(fuzz_seed_list);
    int rc = write_seeds(argv[2]);
    g_ptr_array_unref(fuzz_seed_list);
    return rc;
  }
  g_test_init(&argc, &argv, NULL);
  fuzz_setup();
  fuzz_seeds(fuzz_seed_list);
  g_test_add_func("/fuzz/" FUZZ_NAME "/seeds", test_seeds);
  g_test_add_func("/fuzz/" FUZZ_NAME "/mutations", test_mutations);
#ifdef FUZZ_CASES
  g_test_add_func("/fuzz/" FUZZ_NAME "/cases", fuzz_cases);
#endif
  int rc = g_test_run();
  fuzz_teardown();
  g_ptr_array_unref(fuzz_seed_list);
  return rc;
}
#endif /* WSYNC_LIBFUZZER */

#endif /* WSYNC_FUZZ_DRIVER_H */
