/* Fuzzing a whole DCP checkpoint directory through wsync_dcp_open() and
 * wsync_dcp_check_coverage(): what fuzz-dcp's targets cannot reach from one file alone
 * (format B's chunks bound to their `__R_K.distcp` data files through `storage_data`,
 * the archives read where the metadata says they are, per-rank `__R.metadata` merged,
 * the state dict's names chosen, format A's shard names and parts, the coverage check on
 * data behind real maps).
 *
 * An input is a directory in one byte string: files, each "@@ NAME\n" and its bytes, the
 * next one after a "\n" (so "\n@@ " ends a file).  NAME is a file name of
 * [A-Za-z0-9._-] (not "." or ".."), or "sharded/" and one: every input starts from an
 * empty directory.  The seeds are fixtures of tests/make-dcp-fixtures.py (it needs
 * python3), packed so.  An accepted checkpoint must hand out only chunks whose bytes the
 * coverage check can read (ASan and valgrind see a stray one); a refusal must be one
 * clean line of bad input: the directory holds regular files only, so it is never an
 * I/O failure.  See fuzz-driver.h. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/dcp.h"

#define FUZZ_NAME "dcp-dir"
#include "fuzz-driver.h"

#define SEPARATOR "\n@@ "
#define MAX_FILES 16

static char *work; /* the checkpoint directory */

static void
remove_all(const char *path, gboolean self)
{
  GDir *d = g_dir_open(path, 0, NULL);
  const char *name;
  while (d != NULL && (name = g_dir_read_name(d)) != NULL) {
    g_autofree char *child = g_build_filename(path, name, NULL);
    if (g_file_test(child, G_FILE_TEST_IS_DIR) && !g_file_test(child, G_FILE_TEST_IS_SYMLINK))
      remove_all(child, TRUE);
    else
      g_unlink(child);
  }
  if (d)
    g_dir_close(d);
  if (self)
    g_rmdir(path);
}

static void
fuzz_setup(void)
{
  GError *error = NULL;
  work = g_dir_make_tmp("wsync-fuzz-dcp-dir-XXXXXX", &error);
  g_assert_no_error(error);
}

static void
fuzz_teardown(void)
{
  remove_all(work, TRUE);
  g_free(work);
}

/* A file name of the input: a plain name, or one in sharded/. */
static gboolean
name_ok(const char *name)
{
  const char *base = name;
  if (g_str_has_prefix(name, WSYNC_DCP_SHARDED_DIR "/"))
    base = name + strlen(WSYNC_DCP_SHARDED_DIR "/");
  if (*base == '\0' || strcmp(base, ".") == 0 || strcmp(base, "..") == 0 || strlen(base) > 64)
    return FALSE;
  for (const char *c = base; *c; c++)
    if (!g_ascii_isalnum(*c) && *c != '.' && *c != '_' && *c != '-')
      return FALSE;
  return TRUE;
}

/* FALSE when @path cannot be a file: an input may name both "sharded" and
 * "sharded/NAME" (the second one is then left out). */
static gboolean
write_bytes(const char *path, const void *data, gsize len)
{
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return FALSE;
  if ((len > 0 && write(fd, data, len) != (ssize_t)len) || close(fd) != 0)
    g_error("cannot write %s", path);
  return TRUE;
}

/* Writes the files of @data into the empty work directory; FALSE when it holds none
 * (the input does not begin "@@ NAME\n" with a good name). */
static gboolean
unpack(const guint8 *data, gsize len)
{
  if (len == 0) /* data may be NULL then */
    return FALSE;
  const guint8 *p = data, *end = data + len;
  guint n = 0;
  while (n < MAX_FILES && end - p > 3 && memcmp(p, "@@ ", 3) == 0) {
    const guint8 *name_start = p + 3;
    const guint8 *nl = memchr(name_start, '\n', (gsize)(end - name_start));
    if (nl == NULL)
      break;
    g_autofree char *name = g_strndup((const char *)name_start, (gsize)(nl - name_start));
    if (strlen(name) != (gsize)(nl - name_start) || !name_ok(name))
      break;
    const guint8 *body = nl + 1;
    const guint8 *next = memmem(body, (gsize)(end - body), SEPARATOR, strlen(SEPARATOR));
    const guint8 *body_end = next ? next : end;
    if (g_str_has_prefix(name, WSYNC_DCP_SHARDED_DIR "/")) {
      g_autofree char *sub = g_build_filename(work, WSYNC_DCP_SHARDED_DIR, NULL);
      g_mkdir(sub, 0755);
    }
    g_autofree char *path = g_build_filename(work, name, NULL);
    if (!write_bytes(path, body, (gsize)(body_end - body)))
      break;
    n++;
    if (next == NULL)
      break;
    p = next + 1; /* the "\n" ends the file; "@@ " begins the next */
  }
  return n > 0;
}

/* ---------------------------------------------------------------- seeds */

static void
pack_file(GByteArray *out, const char *dir, const char *name)
{
  g_autofree char *path = g_build_filename(dir, name, NULL);
  g_autofree char *contents = NULL;
  gsize len = 0;
  GError *error = NULL;
  if (!g_file_get_contents(path, &contents, &len, &error))
    g_error("%s", error->message);
  if (out->len > 0)
    g_byte_array_append(out, (const guint8 *)"\n", 1);
  g_byte_array_append(out, (const guint8 *)"@@ ", 3);
  g_byte_array_append(out, (const guint8 *)name, (guint)strlen(name));
  g_byte_array_append(out, (const guint8 *)"\n", 1);
  g_byte_array_append(out, (const guint8 *)contents, (guint)len);
}

static gint
compare_names(gconstpointer a, gconstpointer b)
{
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A fixture directory as one input: its files, and those of its sharded/, sorted. */
static GBytes *
pack_dir(const char *fixtures, const char *fixture)
{
  g_autofree char *dir = g_build_filename(fixtures, fixture, NULL);
  g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
  const char *subs[] = {"", WSYNC_DCP_SHARDED_DIR "/"};
  for (guint s = 0; s < G_N_ELEMENTS(subs); s++) {
    g_autofree char *path = g_build_filename(dir, subs[s], NULL);
    GDir *d = g_dir_open(path, 0, NULL);
    const char *name;
    while (d != NULL && (name = g_dir_read_name(d)) != NULL) {
      g_autofree char *child = g_build_filename(path, name, NULL);
      if (g_file_test(child, G_FILE_TEST_IS_REGULAR))
        g_ptr_array_add(names, g_strconcat(subs[s], name, NULL));
    }
    if (d)
      g_dir_close(d);
  }
  g_ptr_array_sort(names, compare_names);
  GByteArray *out = g_byte_array_new();
  for (guint i = 0; i < names->len; i++) {
    if (!name_ok(names->pdata[i]))
      g_error("fixture %s: %s cannot be packed", fixture, (const char *)names->pdata[i]);
    pack_file(out, dir, names->pdata[i]);
  }
  return g_byte_array_free_to_bytes(out);
}

static void
fuzz_seeds(GPtrArray *seeds)
{
  /* small fixtures of every kind: format B (protocols 2 and 4), per-rank metadata, a
   * wrapped state dict, format A in sharded/ and flat */
  static const char *const fixtures[] = {"flat-b", "ranks-b-per-rank", "flat-a", "ranks-b",
                                         "wrapped-b-per-rank"};
  const char *srcdir = g_getenv("G_TEST_SRCDIR");
  g_autofree char *script =
      g_build_filename(srcdir ? srcdir : "tests", "make-dcp-fixtures.py", NULL);
  GError *error = NULL;
  g_autofree char *tmp = g_dir_make_tmp("wsync-fuzz-dcp-seeds-XXXXXX", &error);
  g_assert_no_error(error);
  const char *argv[] = {"python3", script, tmp, NULL};
  g_autofree char *err = NULL;
  int status = 0;
  if (!g_spawn_sync(NULL, (char **)argv, NULL, G_SPAWN_SEARCH_PATH | G_SPAWN_STDOUT_TO_DEV_NULL,
                    NULL, NULL, NULL, &err, &status, &error) ||
      !g_spawn_check_wait_status(status, &error))
    g_error("%s (needs python3): %s\n%s", script, error->message, err ? err : "");
  for (guint i = 0; i < G_N_ELEMENTS(fixtures); i++)
    g_ptr_array_add(seeds, pack_dir(tmp, fixtures[i]));
  remove_all(tmp, TRUE);
}

static const char *const *
fuzz_dictionary(void)
{
  static const char *const tokens[] = {
    SEPARATOR ".metadata\n", SEPARATOR "__0.metadata\n", SEPARATOR "__1.metadata\n",
    SEPARATOR "__2.metadata\n", SEPARATOR "__0_0.distcp\n", SEPARATOR "__1_0.distcp\n",
    SEPARATOR "__1_1.distcp\n", SEPARATOR "sharded/shard-00001-model-00001-of-00001.safetensors\n",
    "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "data.pkl", "data/0", "PK\x03\x04", "PK\x01\x02",
    "PK\x05\x06", "storage_data", "state_dict_metadata", "planner_data", "offset", "length",
    "relative_path", "DCP_SHARDING_INFO", "saved_offsets", "logical_fqn", "\"", "[", "]", ",",
    NULL};
  return tokens;
}

/* Reads a chunk's first and last element: a chunk pointing outside its map faults here. */
static guint
touch_chunk(const WsyncDcpTensor *t, const WsyncDcpChunk *c)
{
  if (wsync_box_volume(&c->box) == 0)
    return 0;
  gsize size = wsync_dtype_size(t->dtype);
  guint64 last = c->region.origin;
  for (guint k = 0; k < c->box.ndim; k++)
    last += (c->box.extent[k] - 1) * c->region.stride[k];
  volatile const guint8 *first_byte = c->data;
  volatile const guint8 *last_byte = c->data + size * (last + 1) - 1;
  return *first_byte + *last_byte;
}

static gboolean
fuzz_one(const guint8 *data, gsize len)
{
  static const WsyncError allowed[] = {WSYNC_ERROR_BAD_INPUT};
  GError *error = NULL;

  remove_all(work, FALSE);
  if (!unpack(data, len))
    return FALSE;
  WsyncDcp *dcp = wsync_dcp_open(work, &error);
  if (dcp == NULL) {
    fuzz_check_refusal(error, allowed, G_N_ELEMENTS(allowed));
    g_error_free(error);
    return FALSE;
  }
  for (guint i = 0; i < wsync_dcp_n_tensors(dcp); i++) {
    const WsyncDcpTensor *t = wsync_dcp_tensor(dcp, i);
    if (wsync_dcp_lookup(dcp, t->name) != t)
      g_error("tensor %s is not found by its name", t->name);
    for (guint k = 0; k < t->chunks->len; k++)
      touch_chunk(t, &g_array_index(t->chunks, WsyncDcpChunk, k));
  }
  /* reads every chunk where chunks overlap, and checks that they tile each tensor */
  gboolean covered = wsync_dcp_check_coverage(dcp, &error);
  wsync_dcp_free(dcp);
  if (!covered) {
    fuzz_check_refusal(error, allowed, G_N_ELEMENTS(allowed));
    g_error_free(error);
    return FALSE;
  }
  return TRUE;
}
