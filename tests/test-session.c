/* The session (<wsync/session.h>) from C: a `wsync synth --pattern index` checkpoint
 * (every element encodes where it came from) is read with the public checkpoint API and
 * pushed through a session, in a shuffled order and from several threads; the rank files
 * must equal `wsync convert`'s output of the same checkpoint byte for byte, tensor for
 * tensor (names, dtypes, shapes, bytes, metadata), for Qwen3-MoE and Qwen3.5-MoE, both
 * formats, several tp and ep, vLLM-Ascend's transposed experts included.  A second step
 * with other values (a random synth) rewrites the same files in place.  Then the caller
 * sink, shards, fused experts, the digest, and every refusal. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <json-glib/json-glib.h>
#include <xxhash.h>

#include <wsync/wsync.h>

#include "testutil.h"

/* ------------------------------------------------------------------ fixtures */

static char *work_dir;
static WsyncContext *ctx;
static GHashTable *made; /* "what|args" -> directory, made once */
static guint n_made;

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

static char *
new_path(const char *what)
{
  return g_strdup_printf("%s/%s-%u", work_dir, what, n_made++);
}

/* configs/NAME of the project, else tests/data/configs/NAME (the tests' own). */
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

static void
run_ok(const char *const *args)
{
  g_autoptr(GPtrArray) a = g_ptr_array_new();

  for (guint i = 0; args[i] != NULL; i++)
    g_ptr_array_add(a, (gpointer)args[i]);
  test_run_ok(a);
}

/* `wsync synth --config CONFIG DST --pattern PATTERN --seed SEED [--fused-experts]`,
 * made once. */
static const char *
synth(const char *config, const char *pattern, const char *seed, gboolean fused)
{
  g_autofree char *key = g_strdup_printf("synth|%s|%s|%s|%d", config, pattern, seed, fused);
  char *dir = g_hash_table_lookup(made, key);

  if (dir == NULL) {
    g_autofree char *path = config_path(config);
    dir = new_path("synth");
    const char *args[] = {"synth",   "--conf-dir", conf_dir(), "--plugin-dir", plugin_dir(),
                          "--config", path,        dir,        "--pattern",    pattern,
                          "--seed",   seed,        fused ? "--fused-experts" : NULL, NULL};
    run_ok(args);
    g_hash_table_insert(made, g_strdup(key), dir);
  }
  return dir;
}

#define INDEXED(config) synth((config), "index", "0", FALSE)
#define RANDOM(config) synth((config), "random", "3", FALSE)

/* One way of writing rank files. */
typedef struct {
  const char *config; /* configs/NAME or tests/data/configs/NAME */
  const char *target;
  const char *format; /* NULL: the target's default */
  guint tp, ep;
} Case;

/* `wsync convert SRC DST --target T [--format F] --tp N --ep N`, made once. */
static const char *
convert(const char *src, const Case *c)
{
  g_autofree char *key = g_strdup_printf("convert|%s|%s|%s|%u|%u", src, c->target,
                                         c->format ? c->format : "", c->tp, c->ep);
  char *dir = g_hash_table_lookup(made, key);

  if (dir == NULL) {
    g_autofree char *tp = g_strdup_printf("%u", c->tp);
    g_autofree char *ep = g_strdup_printf("%u", c->ep);
    dir = new_path("convert");
    const char *args[] = {"convert", src,  dir,      "--conf-dir", conf_dir(), "--plugin-dir",
                          plugin_dir(), "--target", c->target, "--tp", tp, "--ep", ep,
                          c->format ? "--format" : NULL, c->format, NULL};
    run_ok(args);
    g_hash_table_insert(made, g_strdup(key), dir);
  }
  return dir;
}

static WsyncCheckpoint *
open_checkpoint(const char *dir)
{
  GError *error = NULL;
  WsyncCheckpoint *ck = wsync_checkpoint_open(dir, &error);

  g_assert_no_error(error);
  return ck;
}

/* ------------------------------------------------------------------ sessions */

typedef struct {
  const char *out_dir;
  WsyncBucketFunc on_bucket;
  gpointer user_data;
  guint64 bucket_bytes;
  guint max_open_buckets;
  guint threads;
} Sink;

static WsyncSession *
new_session(const char *config_json, const Case *c, const Sink *sink, GError **error)
{
  WsyncSessionOptions o = {.target = c->target, .format = c->format, .tp = c->tp, .ep = c->ep};

  if (sink != NULL) {
    o.out_dir = sink->out_dir;
    o.on_bucket = sink->on_bucket;
    o.user_data = sink->user_data;
    o.bucket_bytes = sink->bucket_bytes;
    o.max_open_buckets = sink->max_open_buckets;
    o.threads = sink->threads;
  }
  return wsync_session_new(ctx, config_json, &o, error);
}

/* Describes every tensor of @ck whole, except @skip. */
static void
describe_all(WsyncSession *s, WsyncCheckpoint *ck, const char *skip)
{
  for (guint i = 0; i < wsync_checkpoint_n_tensors(ck); i++) {
    const WsyncTensor *t = wsync_checkpoint_tensor(ck, i);
    GError *error = NULL;
    if (skip != NULL && strcmp(t->name, skip) == 0)
      continue;
    g_assert_true(wsync_session_describe(s, t->name, t->dtype, t->ndim, t->shape, &error));
    g_assert_no_error(error);
  }
}

/* A session for @c, described from the checkpoint @src (whose config.json it uses) and
 * planned. */
static WsyncSession *
planned_session(const char *src, const Case *c, const Sink *sink)
{
  g_autofree char *config = g_build_filename(src, "config.json", NULL);
  g_autoptr(WsyncCheckpoint) ck = open_checkpoint(src);
  GError *error = NULL;
  WsyncSession *s = new_session(config, c, sink, &error);

  g_assert_no_error(error);
  describe_all(s, ck, NULL);
  g_assert_true(wsync_session_plan(s, &error));
  g_assert_no_error(error);
  return s;
}

typedef struct {
  WsyncSession *s;
  GPtrArray *order; /* const WsyncTensor* */
  gint next;
  GMutex lock;
  GError *error; /* the first failure */
} Pushers;

static gpointer
pusher(gpointer data)
{
  Pushers *p = data;

  for (;;) {
    guint i = (guint)g_atomic_int_add(&p->next, 1);
    if (i >= p->order->len)
      return NULL;
    const WsyncTensor *t = p->order->pdata[i];
    GError *error = NULL;
    if (!wsync_session_push(p->s, t->name, t->data, t->nbytes, &error)) {
      g_mutex_lock(&p->lock);
      if (p->error == NULL)
        p->error = g_steal_pointer(&error);
      g_mutex_unlock(&p->lock);
      g_clear_error(&error);
    }
  }
}

/* Pushes every tensor of @ck in an order shuffled by @seed, from @n_threads threads. */
static void
push_all(WsyncSession *s, WsyncCheckpoint *ck, guint32 seed, guint n_threads)
{
  g_autoptr(GRand) rand = g_rand_new_with_seed(seed);
  Pushers p = {.s = s, .order = g_ptr_array_new()};
  GThread *threads[8];

  for (guint i = 0; i < wsync_checkpoint_n_tensors(ck); i++)
    g_ptr_array_add(p.order, (gpointer)wsync_checkpoint_tensor(ck, i));
  for (guint i = p.order->len; i > 1; i--) {
    guint j = (guint)g_rand_int_range(rand, 0, (gint32)i);
    gpointer tmp = p.order->pdata[i - 1];
    p.order->pdata[i - 1] = p.order->pdata[j];
    p.order->pdata[j] = tmp;
  }
  g_mutex_init(&p.lock);
  g_assert_cmpuint(n_threads, <=, G_N_ELEMENTS(threads));
  for (guint t = 0; t < n_threads; t++)
    threads[t] = g_thread_new("pusher", pusher, &p);
  for (guint t = 0; t < n_threads; t++)
    g_thread_join(threads[t]);
  g_mutex_clear(&p.lock);
  g_ptr_array_unref(p.order);
  g_assert_no_error(p.error);
}

/* One step: begin, push all of @src shuffled from 3 threads, commit. */
static void
step(WsyncSession *s, guint64 version, const char *src, guint32 seed)
{
  g_autoptr(WsyncCheckpoint) ck = open_checkpoint(src);
  GError *error = NULL;

  g_assert_true(wsync_session_begin(s, version, &error));
  g_assert_no_error(error);
  push_all(s, ck, seed, 3);
  g_assert_true(wsync_session_commit(s, &error));
  g_assert_no_error(error);
}

/* ------------------------------------------------------------------ comparing */

static gint
compare_names(gconstpointer a, gconstpointer b)
{
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The regular files of @dir, sorted, without the commit record. */
static GPtrArray *
dir_files(const char *dir)
{
  g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
  GPtrArray *names = g_ptr_array_new_with_free_func(g_free);
  const char *name;

  g_assert_nonnull(d);
  while ((name = g_dir_read_name(d)) != NULL)
    /* what says a directory is complete: convert's marker, the session's record */
    if (strcmp(name, WSYNC_SESSION_COMMIT_RECORD) != 0 && strcmp(name, WSYNC_OUTPUT_MARKER) != 0)
      g_ptr_array_add(names, g_strdup(name));
  g_ptr_array_sort(names, compare_names);
  return names;
}

static GBytes *
file_bytes(const char *path)
{
  char *data = NULL;
  gsize len = 0;
  GError *error = NULL;

  g_file_get_contents(path, &data, &len, &error);
  g_assert_no_error(error);
  return g_bytes_new_take(data, len);
}

static void
assert_same_metadata(GHashTable *a, GHashTable *b, const char *file)
{
  GHashTableIter it;
  gpointer k, v;

  g_assert_cmpuint(g_hash_table_size(a), ==, g_hash_table_size(b));
  g_hash_table_iter_init(&it, a);
  while (g_hash_table_iter_next(&it, &k, &v))
    if (g_strcmp0(v, g_hash_table_lookup(b, k)) != 0)
      g_error("%s: metadata %s is \"%s\", convert wrote \"%s\"", file, (char *)k,
              (char *)g_hash_table_lookup(b, k), (char *)v);
}

/* Tensor for tensor: key sets, dtypes, shapes, bytes, metadata. */
static void
assert_same_rank_file(const char *expected, const char *got)
{
  GError *error = NULL;
  g_autoptr(WsyncSafetensors) a = wsync_safetensors_open(expected, &error);
  g_assert_no_error(error);
  g_autoptr(WsyncSafetensors) b = wsync_safetensors_open(got, &error);
  g_assert_no_error(error);

  g_assert_cmpuint(wsync_safetensors_n_tensors(a), ==, wsync_safetensors_n_tensors(b));
  for (guint i = 0; i < wsync_safetensors_n_tensors(a); i++) {
    const WsyncTensor *x = wsync_safetensors_tensor(a, i);
    const WsyncTensor *y = wsync_safetensors_lookup(b, x->name);
    if (y == NULL)
      g_error("%s lacks tensor \"%s\"", got, x->name);
    g_assert_cmpint(x->dtype, ==, y->dtype);
    g_assert_cmpuint(x->ndim, ==, y->ndim);
    g_assert_cmpmem(x->shape, x->ndim * sizeof(guint64), y->shape, y->ndim * sizeof(guint64));
    if (x->nbytes != y->nbytes || memcmp(x->data, y->data, x->nbytes) != 0)
      g_error("%s: tensor \"%s\" differs from convert's", got, x->name);
  }
  assert_same_metadata(wsync_safetensors_metadata(a), wsync_safetensors_metadata(b), got);
}

/* The session's directory holds exactly the files convert wrote, equal to them. */
static void
assert_same_dir(const char *expected, const char *got)
{
  g_autoptr(GPtrArray) a = dir_files(expected);
  g_autoptr(GPtrArray) b = dir_files(got);

  g_assert_cmpuint(a->len, ==, b->len);
  for (guint i = 0; i < a->len; i++) {
    g_assert_cmpstr(a->pdata[i], ==, b->pdata[i]);
    g_autofree char *x = g_build_filename(expected, a->pdata[i], NULL);
    g_autofree char *y = g_build_filename(got, b->pdata[i], NULL);
    if (g_str_has_suffix(x, ".safetensors"))
      assert_same_rank_file(x, y);
    g_autoptr(GBytes) bx = file_bytes(x);
    g_autoptr(GBytes) by = file_bytes(y);
    if (!g_bytes_equal(bx, by))
      g_error("%s differs from %s", y, x);
  }
}

static JsonObject *
read_record(const char *dir)
{
  g_autofree char *path = g_build_filename(dir, WSYNC_SESSION_COMMIT_RECORD, NULL);
  g_autoptr(JsonParser) parser = json_parser_new();
  GError *error = NULL;

  json_parser_load_from_file(parser, path, &error);
  g_assert_no_error(error);
  return json_object_ref(json_node_get_object(json_parser_get_root(parser)));
}

static gboolean
has_record(const char *dir)
{
  g_autofree char *path = g_build_filename(dir, WSYNC_SESSION_COMMIT_RECORD, NULL);
  return g_file_test(path, G_FILE_TEST_EXISTS);
}

/* The checksum of docs/session.md §4, written out here with libxxhash alone (the
 * oracle of wsync_session_checksum() and of the sums the pushes compute): XXH3-64 of
 * the blocks' XXH3-64, 64 KiB blocks, each hash 8 bytes little-endian. */
static guint64
oracle_checksum(const guint8 *data, gsize len)
{
  g_autoptr(GByteArray) sums = g_byte_array_new();

  for (gsize at = 0; at < len; at += 65536) {
    guint64 h = XXH3_64bits(data + at, MIN(65536, len - at));
    for (guint k = 0; k < 8; k++) {
      guint8 byte = (guint8)(h >> (8 * k));
      g_byte_array_append(sums, &byte, 1);
    }
  }
  return XXH3_64bits(sums->data, sums->len);
}

static char *
checksum_of(const char *path)
{
  g_autoptr(GBytes) bytes = file_bytes(path);
  gsize len;
  const guint8 *data = g_bytes_get_data(bytes, &len);

  g_assert_cmpuint(wsync_session_checksum(data, len), ==, oracle_checksum(data, len));
  return g_strdup_printf("%016" G_GINT64_MODIFIER "x", oracle_checksum(data, len));
}

/* The commit record names this step and every rank file with its size and checksum;
 * returns the checksums, by file name. */
static GHashTable *
assert_record(const char *dir, WsyncSession *s, const Case *c, guint64 version)
{
  g_autoptr(JsonObject) r = read_record(dir);
  g_autoptr(GPtrArray) names = dir_files(dir);
  GHashTable *sums = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
  JsonArray *files = json_object_get_array_member(r, "files");
  guint n_rank_files = 0;

  g_assert_cmpint(json_object_get_int_member(r, "version"), ==, (gint64)version);
  g_assert_cmpstr(json_object_get_string_member(r, "digest"), ==, wsync_session_get_digest(s));
  g_assert_cmpstr(json_object_get_string_member(r, "target"), ==, c->target);
  if (c->format != NULL)
    g_assert_cmpstr(json_object_get_string_member(r, "format"), ==, c->format);
  g_assert_cmpint(json_object_get_int_member(r, "world"), ==, wsync_session_get_world(s));
  for (guint i = 0; i < names->len; i++)
    n_rank_files += g_str_has_suffix(names->pdata[i], ".safetensors");
  g_assert_cmpuint(json_array_get_length(files), ==, n_rank_files);
  for (guint i = 0; i < json_array_get_length(files); i++) {
    JsonObject *f = json_array_get_object_element(files, i);
    g_autofree char *path =
        g_build_filename(dir, json_object_get_string_member(f, "file"), NULL);
    g_autofree char *sum = checksum_of(path);
    JsonObject *checksum = json_object_get_object_member(f, "checksum");
    struct stat st;
    g_assert_cmpint(stat(path, &st), ==, 0);
    g_assert_cmpint(json_object_get_int_member(f, "bytes"), ==, st.st_size);
    g_assert_cmpuint(json_object_get_size(f), ==, 4); /* file, rank, bytes, checksum */
    g_assert_cmpuint(json_object_get_size(checksum), ==, 3);
    g_assert_cmpstr(json_object_get_string_member(checksum, "algorithm"), ==, "xxh3-64-blocks");
    g_assert_cmpint(json_object_get_int_member(checksum, "block"), ==, 65536);
    g_assert_cmpstr(json_object_get_string_member(checksum, "value"), ==, sum);
    g_assert_cmpint(json_object_get_int_member(f, "rank"), <, wsync_session_get_world(s));
    g_hash_table_insert(sums, g_strdup(json_object_get_string_member(f, "file")),
                        g_steal_pointer(&sum));
  }
  return sums;
}

/* The inode and size of every rank file of @dir. */
static GHashTable *
file_identities(const char *dir)
{
  g_autoptr(GPtrArray) names = dir_files(dir);
  GHashTable *ids = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);

  for (guint i = 0; i < names->len; i++) {
    g_autofree char *path = g_build_filename(dir, names->pdata[i], NULL);
    struct stat st;
    if (!g_str_has_suffix(path, ".safetensors"))
      continue;
    g_assert_cmpint(stat(path, &st), ==, 0);
    g_hash_table_insert(ids, g_strdup(names->pdata[i]),
                        g_strdup_printf("%lu/%ld", (gulong)st.st_ino, (glong)st.st_size));
  }
  return ids;
}

/* ------------------------------------------------------------------ the directory sink */

/* Two steps into a directory: the indexed checkpoint, then a random one; each time the
 * files equal convert's of the same checkpoint; the second rewrites them in place. */
static void
test_directory(gconstpointer data)
{
  const Case *c = data;
  const char *indexed = INDEXED(c->config), *random = RANDOM(c->config);
  g_autofree char *out = new_path("session");
  Sink sink = {.out_dir = out, .threads = 2};
  g_autoptr(WsyncSession) s = planned_session(indexed, c, &sink);

  step(s, 1, indexed, 11);
  assert_same_dir(convert(indexed, c), out);
  g_autoptr(GHashTable) sums1 = assert_record(out, s, c, 1);
  g_autoptr(GHashTable) ids1 = file_identities(out);

  step(s, 2, random, 12);
  assert_same_dir(convert(random, c), out);
  g_autoptr(GHashTable) sums2 = assert_record(out, s, c, 2);
  g_autoptr(GHashTable) ids2 = file_identities(out);

  GHashTableIter it;
  gpointer k, v;
  g_assert_cmpuint(g_hash_table_size(ids1), ==, g_hash_table_size(ids2));
  g_hash_table_iter_init(&it, ids1);
  while (g_hash_table_iter_next(&it, &k, &v)) {
    g_assert_cmpstr(v, ==, g_hash_table_lookup(ids2, k)); /* written in place */
    g_assert_cmpstr(g_hash_table_lookup(sums1, k), !=, g_hash_table_lookup(sums2, k));
  }
}

/* wsync_session_set_interrupt(): a push that finds the flag set fails naming the signal
 * and fails the step; a commit that finds it set writes no record (the previous step's
 * was removed at begin, so a reader still waits); cleared and aborted, the next step
 * commits the files `wsync convert` writes. */
static void
test_interrupt(void)
{
  const Case c = {"tiny-qwen3-moe.json", "vllm", "kernel", 2, 1};
  const char *indexed = INDEXED(c.config);
  g_autofree char *out = new_path("session-interrupt");
  Sink sink = {.out_dir = out, .threads = 2};
  g_autoptr(WsyncSession) s = planned_session(indexed, &c, &sink);
  g_autoptr(WsyncCheckpoint) ck = open_checkpoint(indexed);
  const WsyncTensor *norm = wsync_checkpoint_lookup(ck, "model.norm.weight");
  volatile sig_atomic_t stop = 0;
  GError *error = NULL;

  wsync_session_set_interrupt(s, &stop);
  step(s, 1, indexed, 3);
  g_assert_true(has_record(out));

  g_assert_true(wsync_session_begin(s, 2, &error));
  stop = SIGINT;
  g_assert_false(wsync_session_push(s, norm->name, norm->data, norm->nbytes, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_IO);
  g_assert_cmpstr(error->message, ==,
                  "push: tensor \"model.norm.weight\": interrupted by SIGINT (abort the step)");
  g_clear_error(&error);
  stop = 0;
  g_assert_false(wsync_session_commit(s, &error));
  assert_message_has(error, "commit: step 2 failed (push: tensor \"model.norm.weight\": "
                            "interrupted by SIGINT (abort the step)): abort it");
  g_clear_error(&error);
  wsync_session_abort(s);

  g_assert_true(wsync_session_begin(s, 3, &error));
  push_all(s, ck, 4, 2);
  stop = SIGTERM;
  g_assert_false(wsync_session_commit(s, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_IO);
  g_assert_cmpstr(error->message, ==,
                  "commit: step 3: interrupted by SIGTERM: no commit record was written (abort "
                  "the step)");
  g_clear_error(&error);
  g_assert_false(has_record(out));
  stop = 0;
  wsync_session_abort(s);

  step(s, 4, indexed, 5);
  assert_same_dir(convert(indexed, &c), out);
  g_hash_table_unref(assert_record(out, s, &c, 4));
}

/* An interrupted push or commit called without a GError (GLib's "error may be NULL")
 * fails the step all the same, and does not crash: the next commit names why. */
static void
test_interrupt_without_error(void)
{
  const Case c = {"tiny-qwen3-moe.json", "vllm", "kernel", 2, 1};
  const char *indexed = INDEXED(c.config);
  g_autofree char *out = new_path("session-interrupt-null");
  Sink sink = {.out_dir = out, .threads = 2};
  g_autoptr(WsyncSession) s = planned_session(indexed, &c, &sink);
  g_autoptr(WsyncCheckpoint) ck = open_checkpoint(indexed);
  const WsyncTensor *norm = wsync_checkpoint_lookup(ck, "model.norm.weight");
  volatile sig_atomic_t stop = 0;
  GError *error = NULL;

  wsync_session_set_interrupt(s, &stop);
  g_assert_true(wsync_session_begin(s, 1, &error));
  stop = SIGINT;
  g_assert_false(wsync_session_push(s, norm->name, norm->data, norm->nbytes, NULL));
  stop = 0;
  g_assert_false(wsync_session_commit(s, &error));
  assert_message_has(error, "commit: step 1 failed (push: tensor \"model.norm.weight\": "
                            "interrupted by SIGINT (abort the step)): abort it");
  g_clear_error(&error);
  wsync_session_abort(s);

  g_assert_true(wsync_session_begin(s, 2, &error));
  push_all(s, ck, 4, 2);
  stop = SIGINT;
  g_assert_false(wsync_session_commit(s, NULL));
  stop = 0;
  g_assert_false(wsync_session_commit(s, &error));
  assert_message_has(error, "commit: step 2 failed (commit: step 2: interrupted by SIGINT: "
                            "no commit record was written (abort the step)): abort it");
  g_clear_error(&error);
  g_assert_false(has_record(out));
  wsync_session_abort(s);
}

/* A session made with helper threads, then inherited by a forked child (a DataLoader or
 * multiprocessing worker forked after the trainer made it, or os.fork()): the child has
 * none of the parent's threads.  Its pushes work alone, and freeing the session neither
 * joins threads of the parent's nor frees a queue whose waiters are the parent's (GLib:
 * "g_async_queue_unref: assertion 'queue->waiting_threads == 0' failed", fatal here);
 * the parent's session is untouched and commits the next step. */
static void
test_forked_child(void)
{
  const Case c = {"tiny-qwen3-moe.json", "vllm", "kernel", 2, 1};
  const char *indexed = INDEXED(c.config);
  g_autofree char *out = new_path("session-fork");
  Sink sink = {.out_dir = out, .threads = 3};
  WsyncSession *s = planned_session(indexed, &c, &sink);
  int status = 0;

  step(s, 1, indexed, 21); /* the helpers ran, and wait for more */
  pid_t pid = fork();
  g_assert_cmpint(pid, >=, 0);
  if (pid == 0) {
    alarm(60); /* a child that hangs fails the test rather than the suite's time limit */
    step(s, 2, indexed, 22);
    wsync_session_free(s);
    _exit(0);
  }
  g_assert_cmpint(waitpid(pid, &status, 0), ==, pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    g_error("the forked child's step or wsync_session_free() failed: %s %d",
            WIFSIGNALED(status) ? "signal" : "exit status",
            WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
  g_hash_table_unref(assert_record(out, s, &c, 2));
  step(s, 3, indexed, 23);
  assert_same_dir(convert(indexed, &c), out);
  g_hash_table_unref(assert_record(out, s, &c, 3));
  wsync_session_free(s);
}

/* A trainer restarted: a new session into the directory an earlier one wrote (its
 * config.json, tokenizer and rank files there) commits, replacing them (the copies
 * refused "File exists" at the first commit, after the whole step was pushed); and an
 * out_dir that is the directory of the session's config.json is refused at begin. */
static void
test_restart(void)
{
  const Case c = {"tiny-qwen3-moe.json", "vllm", "kernel", 2, 1};
  const char *indexed = INDEXED(c.config);
  const char *expected = convert(indexed, &c);
  g_autoptr(WsyncCheckpoint) ck = open_checkpoint(indexed);
  g_autofree char *trainer = new_path("trainer");
  g_autofree char *out = new_path("session");
  g_autofree char *from = g_build_filename(indexed, "config.json", NULL);
  g_autofree char *config = g_build_filename(trainer, "config.json", NULL);
  Sink sink = {.out_dir = out, .threads = 2};
  GError *error = NULL;

  g_assert_cmpint(g_mkdir_with_parents(trainer, 0755), ==, 0);
  test_copy(from, config);
  /* A session killed while writing its companions left its temporary (removed by the
   * next session); another, live, holds the lock of its own (left alone). */
  g_autofree char *abandoned = g_build_filename(out, ".wsync-companions.Ab12Cd", NULL);
  g_autofree char *held = g_build_filename(out, ".wsync-companions.Live01", NULL);
  g_assert_cmpint(g_mkdir_with_parents(abandoned, 0700), ==, 0);
  g_assert_cmpint(g_mkdir_with_parents(held, 0700), ==, 0);
  g_free(test_write(abandoned, "config.json", "{}"));
  int held_fd = open(held, O_RDONLY);
  g_assert_cmpint(flock(held_fd, LOCK_EX | LOCK_NB), ==, 0);
  for (guint64 run = 1; run <= 2; run++) {
    g_autofree char *text = g_strdup_printf("{\"run\": %" G_GUINT64_FORMAT "}\n", run);
    g_free(test_write(trainer, "tokenizer.json", text));
    g_autoptr(WsyncSession) s = new_session(config, &c, &sink, &error);
    g_assert_no_error(error);
    describe_all(s, ck, NULL);
    g_assert_true(wsync_session_plan(s, &error));
    g_assert_no_error(error);
    step(s, run, indexed, (guint32)run);
    g_autoptr(GHashTable) sums = assert_record(out, s, &c, run);
    g_autofree char *tokenizer = g_build_filename(out, "tokenizer.json", NULL);
    g_autoptr(GBytes) got = file_bytes(tokenizer);
    g_assert_cmpmem(g_bytes_get_data(got, NULL), g_bytes_get_size(got), text, strlen(text));
  }
  g_assert_false(g_file_test(abandoned, G_FILE_TEST_EXISTS));
  g_assert_true(g_file_test(held, G_FILE_TEST_IS_DIR));
  close(held_fd);
  g_assert_cmpint(g_rmdir(held), ==, 0);
  /* convert's files and the tokenizer, nothing else (no temporary left) */
  g_autoptr(GPtrArray) want = dir_files(expected);
  g_autoptr(GPtrArray) have = dir_files(out);
  g_ptr_array_add(want, g_strdup("tokenizer.json"));
  g_ptr_array_sort(want, compare_names);
  g_assert_cmpuint(have->len, ==, want->len);
  for (guint i = 0; i < want->len; i++) {
    g_assert_cmpstr(have->pdata[i], ==, want->pdata[i]);
    g_autofree char *x = g_build_filename(expected, want->pdata[i], NULL);
    g_autofree char *y = g_build_filename(out, have->pdata[i], NULL);
    if (g_str_has_suffix(x, ".safetensors"))
      assert_same_rank_file(x, y);
    else if (strcmp(want->pdata[i], "config.json") == 0) {
      g_autoptr(GBytes) bx = file_bytes(x);
      g_autoptr(GBytes) by = file_bytes(y);
      g_assert_true(g_bytes_equal(bx, by));
    }
  }

  Sink into_config_dir = {.out_dir = trainer};
  g_autoptr(WsyncSession) s = new_session(config, &c, &into_config_dir, &error);
  g_assert_no_error(error);
  describe_all(s, ck, NULL);
  g_assert_true(wsync_session_plan(s, &error));
  g_assert_false(wsync_session_begin(s, 1, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE);
  g_autofree char *message = g_strdup_printf(
      "begin: %s is the directory of the session's %s: the output's config.json and companion "
      "files would replace it and its neighbours; write the output elsewhere",
      trainer, config);
  g_assert_cmpstr(error->message, ==, message);
  g_clear_error(&error);
  g_autoptr(GPtrArray) untouched = dir_files(trainer);
  g_assert_cmpuint(untouched->len, ==, 2); /* config.json, tokenizer.json */
}

/* The number of 64 KiB blocks of the rank files of @dir that hold only zeros. */
static guint
zero_blocks(const char *dir)
{
  g_autoptr(GPtrArray) names = dir_files(dir);
  static const guint8 zeros[65536];
  guint n = 0;

  for (guint i = 0; i < names->len; i++) {
    g_autofree char *path = g_build_filename(dir, names->pdata[i], NULL);
    g_autofree gchar *data = NULL;
    gsize len;
    if (!g_str_has_suffix(path, ".safetensors"))
      continue;
    g_assert_true(g_file_get_contents(path, &data, &len, NULL));
    for (gsize at = 0; at + sizeof zeros <= len; at += sizeof zeros)
      n += memcmp(data + at, zeros, sizeof zeros) == 0;
  }
  return n;
}

/* Blocks of the checksum that no push writes: a vocabulary of 65 rows padded to 128
 * (docs/vllm.md §3) of 1536 BF16 columns leaves 189 KiB of fill in each of
 * the embedding and lm_head, whole blocks of zeros whose hashes the session takes when
 * it makes the file, not at a push; the record's checksums must still be the files'. */
static void
test_unpushed_blocks(void)
{
  static const Case c = {"tiny-llama3-wide-vocab.json", "vllm", "sharded-state", 1, 1};

  test_directory(&c); /* the files are convert's, the record's checksums the files' */
  g_assert_cmpuint(zero_blocks(convert(INDEXED(c.config), &c)), >=, 2);
}

static glong
minor_faults(void)
{
  struct rusage ru;

  g_assert_cmpint(getrusage(RUSAGE_SELF, &ru), ==, 0);
  return ru.ru_minflt;
}

/* On a tmpfs, the steady state writes into pages that are already mapped: a step after
 * the first takes (almost) no page faults, however many pages the rank files have. */
static void
test_steady_state(void)
{
  const Case c = {"tiny-qwen3.5-moe.json", "vllm", "kernel", 2, 1};
  const char *indexed = INDEXED(c.config);
  g_autoptr(WsyncCheckpoint) ck = open_checkpoint(indexed);
  g_autofree char *shm = g_strdup("/dev/shm/wsync-test-XXXXXX");
  GError *error = NULL;
  guint64 total = 0, sum = 0;

  if (g_strcmp0(g_getenv("WSYNC_VALGRIND"), "1") == 0) {
    g_test_skip("under memcheck the page faults are valgrind's");
    return;
  }
  if (TEST_UNDER_ASAN) {
    g_test_skip("under ASan the page faults are partly its shadow memory's");
    return;
  }
  if (g_mkdtemp(shm) == NULL) {
    g_test_skip("no /dev/shm");
    return;
  }
  g_autofree char *out = g_build_filename(shm, "out", NULL);
  Sink sink = {.out_dir = out, .threads = 1};
  g_autoptr(WsyncSession) s = planned_session(indexed, &c, &sink);
  step(s, 1, indexed, 1);
  for (guint i = 0; i < wsync_checkpoint_n_tensors(ck); i++) { /* map the source first */
    const WsyncTensor *t = wsync_checkpoint_tensor(ck, i);
    for (guint64 b = 0; b < t->nbytes; b++)
      sum += t->data[b];
  }
  for (guint r = 0; r < wsync_session_get_world(s); r++) {
    guint n;
    const WsyncManifestEntry *m = wsync_session_get_manifest(s, r, &n);
    for (guint i = 0; i < n; i++)
      total += m[i].nbytes;
  }
  g_assert_true(wsync_session_begin(s, 2, &error));
  glong before = minor_faults();
  for (guint i = 0; i < wsync_checkpoint_n_tensors(ck); i++) {
    const WsyncTensor *t = wsync_checkpoint_tensor(ck, i);
    g_assert_true(wsync_session_push(s, t->name, t->data, t->nbytes, &error));
  }
  glong faults = minor_faults() - before;
  g_assert_true(wsync_session_commit(s, &error));
  g_assert_no_error(error);
  g_test_message("step 2: %ld page faults writing %" G_GUINT64_FORMAT " pages (checksum %"
                 G_GUINT64_FORMAT ")",
                 faults, total / 4096, sum);
  g_assert_cmpuint(total / 4096, >, 200);
  g_assert_cmpint(faults, <, 20);
  g_clear_pointer(&s, wsync_session_free);
  test_rmtree(shm);
}

/* Transformers 5's fused experts describe the same tensors: the same files, the same
 * digest. */
static void
test_fused_description(void)
{
  const Case c = {"tiny-qwen3-moe.json", "vllm", "kernel", 2, 4};
  const char *per_expert = INDEXED(c.config);
  const char *fused = synth(c.config, "index", "0", TRUE);
  g_autofree char *out = new_path("session");
  Sink sink = {.out_dir = out};
  g_autoptr(WsyncSession) a = planned_session(per_expert, &c, NULL);
  g_autoptr(WsyncSession) s = planned_session(fused, &c, &sink);
  g_autoptr(WsyncCheckpoint) ck = open_checkpoint(fused);

  g_assert_nonnull(wsync_checkpoint_lookup(ck, "model.layers.0.mlp.experts.gate_up_proj"));
  g_assert_cmpstr(wsync_session_get_digest(s), ==, wsync_session_get_digest(a));
  step(s, 1, fused, 5);
  assert_same_dir(convert(per_expert, &c), out);
}

/* A tensor described as two shards of rows (and an expert stack as two shards of
 * experts), each pushed on its own, gives convert's files. */
static void
test_shards(void)
{
  const Case c = {"tiny-qwen3-moe.json", "vllm", "sharded-state", 2, 1};
  const char *src = synth(c.config, "index", "0", TRUE);
  g_autofree char *config = g_build_filename(src, "config.json", NULL);
  g_autofree char *out = new_path("session");
  g_autoptr(WsyncCheckpoint) ck = open_checkpoint(src);
  const char *sharded[] = {"model.embed_tokens.weight", "model.layers.1.mlp.experts.down_proj",
                           NULL};
  Sink sink = {.out_dir = out};
  GError *error = NULL;
  g_autoptr(WsyncSession) s = new_session(config, &c, &sink, &error);

  g_assert_no_error(error);
  for (guint i = 0; i < wsync_checkpoint_n_tensors(ck); i++) {
    const WsyncTensor *t = wsync_checkpoint_tensor(ck, i);
    if (g_strv_contains(sharded, t->name)) {
      guint64 offsets[WSYNC_MAX_DIMS] = {0}, sizes[WSYNC_MAX_DIMS];
      memcpy(sizes, t->shape, sizeof sizes);
      sizes[0] = t->shape[0] / 3; /* an uneven split */
      g_assert_true(wsync_session_describe_shard(s, t->name, t->dtype, t->ndim, t->shape,
                                                 offsets, sizes, &error));
      offsets[0] = sizes[0];
      sizes[0] = t->shape[0] - sizes[0];
      g_assert_true(wsync_session_describe_shard(s, t->name, t->dtype, t->ndim, t->shape,
                                                 offsets, sizes, &error));
      g_assert_no_error(error);
    } else
      g_assert_true(wsync_session_describe(s, t->name, t->dtype, t->ndim, t->shape, &error));
  }
  g_assert_true(wsync_session_plan(s, &error));
  g_assert_no_error(error);
  g_assert_true(wsync_session_begin(s, 7, &error));
  for (guint i = 0; i < wsync_checkpoint_n_tensors(ck); i++) {
    const WsyncTensor *t = wsync_checkpoint_tensor(ck, i);
    if (!g_strv_contains(sharded, t->name)) {
      g_assert_true(wsync_session_push(s, t->name, t->data, t->nbytes, &error));
      continue;
    }
    gsize row = t->nbytes / t->shape[0], first = t->shape[0] / 3;
    const guint64 at0[WSYNC_MAX_DIMS] = {0}, at1[WSYNC_MAX_DIMS] = {first};
    /* the second shard first */
    g_assert_true(wsync_session_push_shard(s, t->name, at1, t->data + first * row,
                                           t->nbytes - first * row, &error));
    g_assert_no_error(error);
    g_assert_false(wsync_session_push(s, t->name, t->data, t->nbytes, &error));
    assert_message_has(error, "push: tensor \"");
    assert_message_has(error, "\" was described as 2 shards: push each with "
                              "wsync_session_push_shard");
    g_clear_error(&error);
    g_assert_true(wsync_session_push_shard(s, t->name, at0, t->data, first * row, &error));
    g_assert_no_error(error);
  }
  g_assert_true(wsync_session_commit(s, &error));
  g_assert_no_error(error);
  assert_same_dir(convert(INDEXED(c.config), &c), out);
}

/* ------------------------------------------------------------------ the caller sink */

/* Rebuilds each rank file's data from the buckets and checks every bucket. */
typedef struct {
  WsyncSession *s;
  guint64 bucket_bytes;
  guint64 version;
  GHashTable *data;    /* file name -> GByteArray of the file's size */
  GHashTable *written; /* file name -> GByteArray: 1 where a byte was delivered */
  guint n_buckets;
  guint n_multi; /* buckets of more than one tensor */
  guint n_oversized; /* buckets of one tensor larger than the bucket size */
} Collector;

static gboolean
collect_bucket(const WsyncBucket *b, gpointer user_data, GError **error)
{
  Collector *c = user_data;
  guint n;
  const WsyncManifestEntry *m = wsync_session_get_manifest(c->s, b->rank, &n);
  guint64 at = b->file_offset;

  (void)error;
  g_assert_cmpuint(b->version, ==, c->version);
  g_assert_cmpuint(b->n_entries, >, 0);
  /* bounded: only a lone tensor bigger than a bucket may pass the size */
  if (b->n_entries > 1) {
    g_assert_cmpuint(b->nbytes, <=, c->bucket_bytes);
    c->n_multi++;
  } else if (b->nbytes > c->bucket_bytes)
    c->n_oversized++;
  /* the slice covers the bucket exactly, in the rank's manifest */
  g_assert_true(b->entries >= m && b->entries + b->n_entries <= m + n);
  for (guint i = 0; i < b->n_entries; i++) {
    g_assert_cmpstr(b->entries[i].file, ==, b->file);
    g_assert_cmpuint(b->entries[i].offset, ==, at);
    at += b->entries[i].nbytes;
  }
  g_assert_cmpuint(at, ==, b->file_offset + b->nbytes);
  GByteArray *data = g_hash_table_lookup(c->data, b->file);
  GByteArray *written = g_hash_table_lookup(c->written, b->file);
  if (data == NULL) {
    data = g_byte_array_new();
    written = g_byte_array_new();
    g_hash_table_insert(c->data, g_strdup(b->file), data);
    g_hash_table_insert(c->written, g_strdup(b->file), written);
  }
  if (data->len < b->file_offset + b->nbytes) {
    guint old = written->len;
    g_byte_array_set_size(data, (guint)(b->file_offset + b->nbytes));
    g_byte_array_set_size(written, (guint)(b->file_offset + b->nbytes));
    memset(written->data + old, 0, written->len - old);
  }
  for (gsize i = 0; i < b->nbytes; i++) {
    g_assert_cmpuint(written->data[b->file_offset + i], ==, 0); /* delivered once */
    written->data[b->file_offset + i] = 1;
  }
  if (b->nbytes > 0)
    memcpy(data->data + b->file_offset, b->data, b->nbytes);
  c->n_buckets++;
  return TRUE;
}

static void
collector_init(Collector *c, guint64 bucket_bytes)
{
  memset(c, 0, sizeof *c);
  c->bucket_bytes = bucket_bytes;
  c->data = g_hash_table_new_full(g_str_hash, g_str_equal, g_free,
                                  (GDestroyNotify)g_byte_array_unref);
  c->written = g_hash_table_new_full(g_str_hash, g_str_equal, g_free,
                                     (GDestroyNotify)g_byte_array_unref);
}

static void
collector_clear(Collector *c)
{
  g_hash_table_unref(c->data);
  g_hash_table_unref(c->written);
}

/* The buckets, concatenated per (rank, file), are exactly the data of convert's files. */
static void
assert_buckets_are_files(Collector *c, const char *expected)
{
  g_autoptr(GPtrArray) names = dir_files(expected);
  guint n_rank_files = 0;

  for (guint i = 0; i < names->len; i++) {
    const char *name = names->pdata[i];
    if (!g_str_has_suffix(name, ".safetensors"))
      continue;
    n_rank_files++;
    g_autofree char *path = g_build_filename(expected, name, NULL);
    g_autoptr(GBytes) file = file_bytes(path);
    GError *error = NULL;
    g_autoptr(WsyncSafetensors) st = wsync_safetensors_open(path, &error);
    g_assert_no_error(error);
    guint64 header = wsync_safetensors_header_size(st);
    GByteArray *data = g_hash_table_lookup(c->data, name);
    GByteArray *written = g_hash_table_lookup(c->written, name);
    g_assert_nonnull(data);
    g_assert_cmpuint(data->len, ==, g_bytes_get_size(file));
    for (guint64 i = 0; i < data->len; i++)
      g_assert_cmpuint(written->data[i], ==, i >= header); /* every data byte, once */
    g_assert_cmpmem(data->data + header, data->len - header,
                    (const guint8 *)g_bytes_get_data(file, NULL) + header, data->len - header);
  }
  g_assert_cmpuint(g_hash_table_size(c->data), ==, n_rank_files);
}

static void
test_caller_sink(void)
{
  const Case c = {"tiny-qwen3.5-moe.json", "vllm-ascend", "kernel", 2, 2};
  const char *indexed = INDEXED(c.config), *random = RANDOM(c.config);
  Collector col;
  collector_init(&col, 8192);
  Sink sink = {.on_bucket = collect_bucket, .user_data = &col, .bucket_bytes = 8192};
  g_autoptr(WsyncSession) s = planned_session(indexed, &c, &sink);

  col.s = s;
  col.version = 3;
  step(s, 3, indexed, 21);
  assert_buckets_are_files(&col, convert(indexed, &c));
  g_assert_cmpuint(col.n_multi, >, 0);
  g_assert_cmpuint(col.n_oversized, >, 0); /* the expert stacks: 16 KiB each */
  collector_clear(&col);

  collector_init(&col, 8192);
  col.s = s;
  col.version = 4;
  step(s, 4, random, 22);
  assert_buckets_are_files(&col, convert(random, &c));
  collector_clear(&col);
}

/* With the default bucket size a tiny model is one bucket per rank file. */
static void
test_caller_sink_default_size(void)
{
  const Case c = {"tiny-qwen3-moe.json", "vllm", NULL, 2, 1};
  const char *indexed = INDEXED(c.config);
  Collector col;
  collector_init(&col, WSYNC_SESSION_BUCKET_BYTES);
  Sink sink = {.on_bucket = collect_bucket, .user_data = &col, .threads = 1};
  g_autoptr(WsyncSession) s = planned_session(indexed, &c, &sink);

  col.s = s;
  col.version = 1;
  step(s, 1, indexed, 3);
  g_assert_cmpuint(col.n_buckets, ==, 2);
  assert_buckets_are_files(&col, convert(indexed, &c));
  collector_clear(&col);
}

static gboolean
failing_bucket(const WsyncBucket *b, gpointer user_data, GError **error)
{
  (void)b;
  (void)user_data;
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_IO, "the group is gone");
  return FALSE;
}

/* A callback's failure fails the push and the step; abort, then the next step works. */
static void
test_caller_sink_failure(void)
{
  const Case c = {"tiny-qwen3-moe.json", "vllm", NULL, 1, 1};
  const char *indexed = INDEXED(c.config);
  g_autoptr(WsyncCheckpoint) ck = open_checkpoint(indexed);
  const WsyncTensor *norm = wsync_checkpoint_lookup(ck, "model.norm.weight");
  Sink sink = {.on_bucket = failing_bucket, .bucket_bytes = 1};
  g_autoptr(WsyncSession) s = planned_session(indexed, &c, &sink);
  GError *error = NULL;

  g_assert_true(wsync_session_begin(s, 1, &error));
  g_assert_false(wsync_session_push(s, norm->name, norm->data, norm->nbytes, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_IO);
  assert_message_has(error, "bucket of rank 0, model-rank-0-part-0.safetensors at ");
  assert_message_has(error, ": the group is gone");
  g_clear_error(&error);
  g_assert_false(wsync_session_commit(s, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE);
  assert_message_has(error, "commit: step 1 failed (bucket of rank 0");
  assert_message_has(error, "): abort it");
  g_clear_error(&error);
  g_assert_false(wsync_session_begin(s, 2, &error));
  assert_message_has(error, "begin: step 1 is open: commit or abort it first");
  g_clear_error(&error);
  wsync_session_abort(s);
  g_assert_true(wsync_session_begin(s, 2, &error));
  g_assert_no_error(error);
  wsync_session_abort(s);
}

/* max_open_buckets: a push that would open one bucket too many is refused before it
 * writes, and succeeds once the open bucket is filled. */
static void
test_caller_sink_cap(void)
{
  const Case c = {"tiny-qwen3-moe.json", "vllm", NULL, 1, 1};
  const char *indexed = INDEXED(c.config);
  g_autoptr(WsyncCheckpoint) ck = open_checkpoint(indexed);
  const WsyncTensor *norm = wsync_checkpoint_lookup(ck, "model.norm.weight");
  Collector col;
  collector_init(&col, 1);
  Sink sink = {.on_bucket = collect_bucket, .user_data = &col, .bucket_bytes = 1,
               .max_open_buckets = 1};
  g_autoptr(WsyncSession) s = planned_session(indexed, &c, &sink);
  GError *error = NULL;

  col.s = s;
  col.version = 1;
  g_assert_true(wsync_session_begin(s, 1, &error));
  /* expert 0's gate opens layer 0's w13_weight, which needs all 8 experts' gate and up */
  const WsyncTensor *gate0 =
      wsync_checkpoint_lookup(ck, "model.layers.0.mlp.experts.0.gate_proj.weight");
  g_assert_true(wsync_session_push(s, gate0->name, gate0->data, gate0->nbytes, &error));
  g_assert_no_error(error);
  g_assert_false(wsync_session_push(s, norm->name, norm->data, norm->nbytes, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE);
  assert_message_has(error, "push: tensor \"model.norm.weight\" would open 1 more buckets "
                            "while 1 are open (max_open_buckets 1)");
  g_clear_error(&error);
  g_assert_cmpuint(col.n_buckets, ==, 0);
  for (guint e = 0; e < 8; e++)
    for (guint p = 0; p < 2; p++) {
      g_autofree char *name = g_strdup_printf("model.layers.0.mlp.experts.%u.%s_proj.weight", e,
                                              p ? "up" : "gate");
      const WsyncTensor *t = wsync_checkpoint_lookup(ck, name);
      if (t == gate0)
        continue;
      g_assert_true(wsync_session_push(s, t->name, t->data, t->nbytes, &error));
      g_assert_no_error(error);
    }
  g_assert_cmpuint(col.n_buckets, ==, 1); /* w13_weight, delivered */
  g_assert_true(wsync_session_push(s, norm->name, norm->data, norm->nbytes, &error));
  g_assert_no_error(error);
  g_assert_cmpuint(col.n_buckets, ==, 2);
  wsync_session_abort(s);
  collector_clear(&col);

  /* a tensor that alone fills more buckets than the cap (one per rank) */
  const Case tp2 = {"tiny-qwen3-moe.json", "vllm", NULL, 2, 1};
  g_autofree char *config = g_build_filename(indexed, "config.json", NULL);
  g_autoptr(WsyncSession) t = new_session(config, &tp2, &sink, &error);
  g_assert_no_error(error);
  describe_all(t, ck, NULL);
  g_assert_false(wsync_session_plan(t, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE);
  assert_message_has(error, "session: tensor \"");
  assert_message_has(error, "\" alone fills 2 buckets, more than max_open_buckets (1)");
  g_clear_error(&error);
}

/* ------------------------------------------------------------------ digest and manifest */

/* The canonical manifest of docs/session.md, rebuilt from the manifests. */
static char *
canonical_digest(WsyncSession *s, const Case *c, const char *format)
{
  g_autoptr(GString) text = g_string_new(NULL);
  g_autoptr(GChecksum) sum = g_checksum_new(G_CHECKSUM_SHA256);
  guint world = wsync_session_get_world(s);

  g_string_append_printf(text, "wsync-manifest\t1\ntarget\t%s\nformat\t%s\ntp\t%u\nep\t%u\n"
                               "world\t%u\n",
                         c->target, format, c->tp, c->ep, world);
  for (guint r = 0; r < world; r++) {
    guint n;
    const WsyncManifestEntry *m = wsync_session_get_manifest(s, r, &n);
    for (guint i = 0; i < n; i++) {
      g_string_append_printf(text, "%u\t%s\t%" G_GUINT64_FORMAT "\t%s\t%s\t", r, m[i].file,
                             m[i].offset, m[i].name, wsync_dtype_name(m[i].dtype));
      for (guint d = 0; d < m[i].ndim; d++)
        g_string_append_printf(text, "%s%" G_GUINT64_FORMAT, d ? "," : "", m[i].shape[d]);
      g_string_append_c(text, '\n');
    }
  }
  g_checksum_update(sum, (const guchar *)text->str, (gssize)text->len);
  return g_strdup(g_checksum_get_string(sum));
}

static void
test_digest(void)
{
  const Case tp2 = {"tiny-qwen3-moe.json", "vllm", NULL, 2, 1};
  const Case tp1 = {"tiny-qwen3-moe.json", "vllm", NULL, 1, 1};
  const Case kernel = {"tiny-qwen3-moe.json", "vllm", "kernel", 2, 1};
  const char *indexed = INDEXED(tp2.config);
  g_autoptr(WsyncSession) a = planned_session(indexed, &tp2, NULL);
  g_autoptr(WsyncSession) b = planned_session(indexed, &tp2, NULL);
  g_autoptr(WsyncSession) c = planned_session(indexed, &tp1, NULL);
  g_autoptr(WsyncSession) d = planned_session(indexed, &kernel, NULL);
  g_autofree char *canonical = canonical_digest(a, &tp2, "sharded-state");

  g_assert_cmpuint(strlen(wsync_session_get_digest(a)), ==, 64);
  g_assert_cmpstr(wsync_session_get_digest(a), ==, canonical);
  g_assert_cmpstr(wsync_session_get_digest(a), ==, wsync_session_get_digest(b));
  g_assert_cmpstr(wsync_session_get_digest(a), !=, wsync_session_get_digest(c));
  g_assert_cmpstr(wsync_session_get_digest(a), !=, wsync_session_get_digest(d));
  g_assert_cmpuint(wsync_session_get_world(a), ==, 2);
  g_assert_cmpuint(wsync_session_get_world(c), ==, 1);
}

/* Each rank's manifest is what convert's rank files hold, where they hold it. */
static void
test_manifest(void)
{
  const Case c = {"tiny-qwen3.5-moe.json", "vllm", "sharded-state", 2, 1};
  const char *indexed = INDEXED(c.config);
  const char *expected = convert(indexed, &c);
  g_autoptr(WsyncSession) s = planned_session(indexed, &c, NULL);
  g_autoptr(GHashTable) per_file = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);

  for (guint r = 0; r < wsync_session_get_world(s); r++) {
    guint n;
    const WsyncManifestEntry *m = wsync_session_get_manifest(s, r, &n);
    g_assert_cmpuint(n, >, 0);
    for (guint i = 0; i < n; i++) {
      guint seen = GPOINTER_TO_UINT(g_hash_table_lookup(per_file, m[i].file));
      g_autofree char *path = g_build_filename(expected, m[i].file, NULL);
      GError *error = NULL;
      g_autoptr(WsyncSafetensors) st = wsync_safetensors_open(path, &error);
      g_assert_no_error(error);
      const WsyncTensor *t = wsync_safetensors_lookup(st, m[i].name);
      g_assert_nonnull(t);
      const guint8 *data0 = wsync_safetensors_tensor(st, 0)->data;
      g_assert_cmpuint(m[i].offset, ==, wsync_safetensors_header_size(st) + (t->data - data0));
      g_assert_cmpint(m[i].dtype, ==, t->dtype);
      g_assert_cmpmem(m[i].shape, m[i].ndim * sizeof(guint64), t->shape,
                      t->ndim * sizeof(guint64));
      g_assert_cmpuint(m[i].nbytes, ==, t->nbytes);
      if (seen == 0) /* the first of its file starts the data */
        g_assert_cmpuint(m[i].offset, ==, wsync_safetensors_header_size(st));
      else
        g_assert_cmpuint(m[i].offset, ==, m[i - 1].offset + m[i - 1].nbytes);
      g_hash_table_insert(per_file, g_strdup(m[i].file), GUINT_TO_POINTER(seen + 1));
      /* the whole file, once its last entry is seen */
      if (i + 1 == n || strcmp(m[i + 1].file, m[i].file) != 0)
        g_assert_cmpuint(wsync_safetensors_n_tensors(st), ==, seen + 1);
    }
  }
  guint n;
  g_assert_null(wsync_session_get_manifest(s, 2, &n));
  g_assert_cmpuint(n, ==, 0);
  g_assert_cmpuint(g_hash_table_size(per_file), ==, 2);
  /* the MTP block is dropped for vLLM: it need not even be described */
  g_autofree char *config = g_build_filename(indexed, "config.json", NULL);
  g_autoptr(WsyncCheckpoint) ck = open_checkpoint(indexed);
  GError *error = NULL;
  g_autoptr(WsyncSession) t = new_session(config, &c, NULL, &error);
  for (guint i = 0; i < wsync_checkpoint_n_tensors(ck); i++) {
    const WsyncTensor *x = wsync_checkpoint_tensor(ck, i);
    if (!g_str_has_prefix(x->name, "mtp."))
      g_assert_true(wsync_session_describe(t, x->name, x->dtype, x->ndim, x->shape, &error));
  }
  g_assert_true(wsync_session_plan(t, &error));
  g_assert_no_error(error);
  g_assert_cmpstr(wsync_session_get_digest(t), ==, wsync_session_get_digest(s));
}

/* ------------------------------------------------------------------ refusals */

static void
test_push_refusals(void)
{
  const Case c = {"tiny-qwen3-moe.json", "vllm", NULL, 2, 1};
  const char *indexed = INDEXED(c.config);
  g_autoptr(WsyncCheckpoint) ck = open_checkpoint(indexed);
  const WsyncTensor *norm = wsync_checkpoint_lookup(ck, "model.norm.weight");
  g_autofree char *out = new_path("session");
  Sink sink = {.out_dir = out};
  g_autoptr(WsyncSession) s = planned_session(indexed, &c, &sink);
  GError *error = NULL;

  g_assert_false(wsync_session_push(s, norm->name, norm->data, norm->nbytes, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE);
  g_assert_cmpstr(error->message, ==, "push: tensor \"model.norm.weight\": no step is open "
                                      "(call wsync_session_begin first)");
  g_clear_error(&error);
  g_assert_false(wsync_session_commit(s, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE);
  g_clear_error(&error);

  g_assert_true(wsync_session_begin(s, 1, &error));
  g_assert_false(wsync_session_push(s, norm->name, norm->data, norm->nbytes - 2, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT);
  g_assert_cmpstr(error->message, ==, "push: tensor \"model.norm.weight\": 126 bytes, but it "
                                      "was described as BF16 [64] (128 bytes)");
  g_clear_error(&error);
  g_assert_false(wsync_session_push(s, "model.norm.bias", norm->data, norm->nbytes, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT);
  g_assert_cmpstr(error->message, ==, "push: tensor \"model.norm.bias\" was not described");
  g_clear_error(&error);
  g_assert_false(wsync_session_push_shard(s, norm->name, (const guint64[]){0}, norm->data,
                                          norm->nbytes, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT);
  g_assert_cmpstr(error->message, ==, "push: tensor \"model.norm.weight\" was described "
                                      "whole: push it with wsync_session_push");
  g_clear_error(&error);
  /* the refused pushes wrote nothing: the tensor is still to push, once */
  g_assert_true(wsync_session_push(s, norm->name, norm->data, norm->nbytes, &error));
  g_assert_no_error(error);
  g_assert_false(wsync_session_push(s, norm->name, norm->data, norm->nbytes, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT);
  g_assert_cmpstr(error->message, ==,
                  "push: tensor \"model.norm.weight\" was already pushed in step 1");
  g_clear_error(&error);
  g_assert_false(wsync_session_begin(s, 2, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE);
  g_assert_cmpstr(error->message, ==, "begin: step 1 is open: commit or abort it first");
  g_clear_error(&error);
  wsync_session_abort(s);
}

/* commit with a tensor missing: refused by name, the step stays open, and a reader of the
 * directory sees no commit record (the previous one went at begin, and the files are
 * partly rewritten) until the missing tensor is pushed and the commit succeeds. */
static void
test_commit_missing(void)
{
  const Case c = {"tiny-qwen3-moe.json", "vllm", "kernel", 2, 2};
  const char *indexed = INDEXED(c.config), *random = RANDOM(c.config);
  g_autoptr(WsyncCheckpoint) ck = open_checkpoint(random);
  const char *missing = "model.layers.1.mlp.experts.5.down_proj.weight";
  const WsyncTensor *late = wsync_checkpoint_lookup(ck, missing);
  g_autofree char *out = new_path("session");
  Sink sink = {.out_dir = out};
  g_autoptr(WsyncSession) s = planned_session(indexed, &c, &sink);
  GError *error = NULL;

  step(s, 1, indexed, 1);
  g_assert_true(has_record(out));
  g_assert_true(wsync_session_begin(s, 2, &error));
  g_assert_false(has_record(out)); /* removed first */
  for (guint i = 0; i < wsync_checkpoint_n_tensors(ck); i++) {
    const WsyncTensor *t = wsync_checkpoint_tensor(ck, i);
    if (t != late)
      g_assert_true(wsync_session_push(s, t->name, t->data, t->nbytes, &error));
  }
  g_assert_false(wsync_session_commit(s, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT);
  g_assert_cmpstr(error->message, ==, "commit: step 2: tensor "
                                      "\"model.layers.1.mlp.experts.5.down_proj.weight\" was "
                                      "not pushed");
  g_clear_error(&error);
  g_assert_false(has_record(out));
  g_assert_true(wsync_session_push(s, late->name, late->data, late->nbytes, &error));
  g_assert_true(wsync_session_commit(s, &error));
  g_assert_no_error(error);
  g_autoptr(GHashTable) sums = assert_record(out, s, &c, 2);
  assert_same_dir(convert(random, &c), out);

  /* several missing: the first is named, and how many more */
  g_assert_true(wsync_session_begin(s, 3, &error));
  g_assert_false(wsync_session_commit(s, &error));
  assert_message_has(error, "commit: step 3: tensor \"");
  assert_message_has(error, "\" was not pushed (and ");
  g_clear_error(&error);
  wsync_session_abort(s);
}

static void
test_plan_refusals(void)
{
  const Case c = {"tiny-qwen3-moe.json", "vllm", NULL, 2, 1};
  const char *indexed = INDEXED(c.config);
  g_autofree char *config = g_build_filename(indexed, "config.json", NULL);
  g_autoptr(WsyncCheckpoint) ck = open_checkpoint(indexed);
  const WsyncTensor *norm = wsync_checkpoint_lookup(ck, "model.norm.weight");
  GError *error = NULL;

  /* a tensor the target needs, not described: refused at plan, by name */
  g_autoptr(WsyncSession) a = new_session(config, &c, NULL, &error);
  describe_all(a, ck, "model.layers.0.mlp.experts.3.up_proj.weight");
  g_assert_false(wsync_session_plan(a, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT);
  g_assert_cmpstr(error->message, ==,
                  "session: tensor \"model.layers.0.mlp.experts.3.up_proj.weight\" was not "
                  "described, and the vllm layout needs it (for tensor "
                  "\"model.layers.0.mlp.experts.routed_experts.w13_weight\" of rank 0)");
  g_clear_error(&error);
  g_assert_null(wsync_session_get_digest(a));
  g_assert_cmpuint(wsync_session_get_world(a), ==, 0);
  g_assert_false(wsync_session_begin(a, 1, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE);
  g_clear_error(&error);
  g_assert_false(wsync_session_plan(a, &error));
  assert_message_has(error, "plan: the session has failed to plan (make a new one)");
  g_clear_error(&error);

  /* a name no rule maps; a wrong shape */
  g_autoptr(WsyncSession) b = new_session(config, &c, NULL, &error);
  describe_all(b, ck, NULL);
  g_assert_true(wsync_session_describe(b, "model.layers.0.junk", WSYNC_DTYPE_BF16, 1,
                                       (const guint64[]){4}, &error));
  g_assert_false(wsync_session_plan(b, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT);
  assert_message_has(error, "session: 1 input tensor no rule of ");
  assert_message_has(error, " maps: model.layers.0.junk");
  g_clear_error(&error);
  g_autoptr(WsyncSession) d = new_session(config, &c, NULL, &error);
  describe_all(d, ck, "model.norm.weight");
  g_assert_true(wsync_session_describe(d, "model.norm.weight", WSYNC_DTYPE_BF16, 1,
                                       (const guint64[]){65}, &error));
  g_assert_false(wsync_session_plan(d, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT);
  assert_message_has(error, "session: tensor \"model.norm.weight\" has shape [65] but the "
                            "config says [64]");
  g_clear_error(&error);

  /* describing: twice, after planning, bad shards, a gap */
  g_autoptr(WsyncSession) e = new_session(config, &c, NULL, &error);
  g_assert_true(wsync_session_describe(e, norm->name, norm->dtype, 1, norm->shape, &error));
  g_assert_false(wsync_session_describe(e, norm->name, norm->dtype, 1, norm->shape, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT);
  g_assert_cmpstr(error->message, ==, "describe: tensor \"model.norm.weight\" was described "
                                      "before");
  g_clear_error(&error);
  g_assert_false(wsync_session_describe_shard(e, norm->name, norm->dtype, 1, norm->shape,
                                              (const guint64[]){0}, (const guint64[]){8},
                                              &error));
  g_assert_cmpstr(error->message, ==, "describe: tensor \"model.norm.weight\" was described "
                                      "whole before");
  g_clear_error(&error);
  const guint64 rows[2] = {300, 64};
  const char *embed = "model.embed_tokens.weight";
  g_assert_true(wsync_session_describe_shard(e, embed, WSYNC_DTYPE_BF16, 2, rows,
                                             (const guint64[]){0, 0},
                                             (const guint64[]){100, 64}, &error));
  g_assert_false(wsync_session_describe_shard(e, embed, WSYNC_DTYPE_BF16, 2, rows,
                                              (const guint64[]){50, 0},
                                              (const guint64[]){100, 64}, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT);
  g_assert_cmpstr(error->message, ==, "describe: tensor \"model.embed_tokens.weight\": shard "
                                      "[50:150, 0:64] overlaps shard [0:100, 0:64] (push every "
                                      "element once)");
  g_clear_error(&error);
  g_assert_false(wsync_session_describe_shard(e, embed, WSYNC_DTYPE_BF16, 2, rows,
                                              (const guint64[]){250, 0},
                                              (const guint64[]){100, 64}, &error));
  g_assert_cmpstr(error->message, ==, "describe: tensor \"model.embed_tokens.weight\": shard "
                                      "[250:350, 0:64] lies outside the shape [300, 64]");
  g_clear_error(&error);
  g_assert_false(wsync_session_describe_shard(e, embed, WSYNC_DTYPE_F32, 2, rows,
                                              (const guint64[]){100, 0},
                                              (const guint64[]){100, 64}, &error));
  assert_message_has(error, "shard [100:200, 0:64] is F32 [300, 64], but its first shard said "
                            "BF16 [300, 64]");
  g_clear_error(&error);
  g_assert_true(wsync_session_describe_shard(e, embed, WSYNC_DTYPE_BF16, 2, rows,
                                             (const guint64[]){200, 0},
                                             (const guint64[]){100, 64}, &error));
  g_assert_false(wsync_session_plan(e, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT);
  g_assert_cmpstr(error->message, ==, "session: tensor \"model.embed_tokens.weight\": no "
                                      "described shard holds [100:200, 0:64] (shape [300, 64], "
                                      "2 shards)");
  g_clear_error(&error);

  g_autoptr(WsyncSession) f = planned_session(indexed, &c, NULL);
  g_assert_false(wsync_session_describe(f, "x", WSYNC_DTYPE_BF16, 0, NULL, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE);
  g_assert_cmpstr(error->message, ==, "describe: tensor \"x\": the session has planned already");
  g_clear_error(&error);
  /* no sink: it plans (the receiving side's digest) but does not begin */
  g_assert_false(wsync_session_begin(f, 1, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE);
  g_assert_cmpstr(error->message, ==, "begin: the session has no sink (out_dir or on_bucket)");
  g_clear_error(&error);
}

static void
test_new_refusals(void)
{
  const Case c = {"tiny-qwen3-moe.json", "vllm", NULL, 2, 1};
  const char *indexed = INDEXED(c.config);
  g_autofree char *config = g_build_filename(indexed, "config.json", NULL);
  g_autofree char *out = new_path("session");
  Collector col;
  Sink both = {.out_dir = out, .on_bucket = collect_bucket, .user_data = &col};
  GError *error = NULL;

  g_assert_null(new_session(config, &c, &both, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE);
  g_assert_cmpstr(error->message, ==, "session: out_dir and on_bucket both given: choose one "
                                      "sink");
  g_clear_error(&error);
  const Case huge = {"tiny-qwen3-moe.json", "vllm", NULL, 5000, 1};
  g_assert_null(new_session(config, &huge, NULL, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE);
  assert_message_has(error, "session: tp 5000, ep 1, threads ");
  assert_message_has(error, ": at most 4096, 4096 and 1024");
  g_clear_error(&error);
  const Case nowhere = {"tiny-qwen3-moe.json", "nowhere", NULL, 1, 1};
  g_assert_null(new_session(config, &nowhere, NULL, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE);
  assert_message_has(error, "no loaded plugin provides the target \"nowhere\"");
  g_clear_error(&error);
  /* a config_path that is not there is the I/O error (exit 4) a missing path named on
   * the command line is, in the same words, as wsync.Session says it (before: bad input,
   * "PATH: no such file", the words for a checkpoint directory's missing config.json) */
  g_autofree char *missing = g_build_filename(work_dir, "no-such", "config.json", NULL);
  g_autofree char *cannot = g_strdup_printf("cannot open %s: %s", missing, g_strerror(ENOENT));
  g_assert_null(new_session(missing, &c, NULL, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_IO);
  g_assert_cmpstr(error->message, ==, cannot);
  g_assert_cmpint(wsync_error_exit_code(error), ==, 4);
  g_clear_error(&error);
  g_autofree char *under_file = g_build_filename(config, "config.json", NULL); /* ENOTDIR */
  g_autofree char *not_dir = g_strdup_printf("cannot open %s: %s", under_file, g_strerror(ENOTDIR));
  g_assert_null(new_session(under_file, &c, NULL, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_IO);
  g_assert_cmpstr(error->message, ==, not_dir);
  g_clear_error(&error);

  /* another layout's rank files in the directory: refused at the first begin */
  g_assert_cmpint(g_mkdir_with_parents(out, 0755), ==, 0);
  g_free(test_write(out, "model-rank-7-part-0.safetensors", "x"));
  Sink dir = {.out_dir = out};
  g_autoptr(WsyncSession) s = planned_session(indexed, &c, &dir);
  g_assert_false(wsync_session_begin(s, 1, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE);
  assert_message_has(error, "holds model-rank-7-part-0.safetensors, which this session does "
                            "not write");
  g_clear_error(&error);
}

/* ------------------------------------------------------------------ main */

static const Case cases[] = {
    {"tiny-qwen3-moe.json", "vllm", "sharded-state", 1, 1},
    {"tiny-qwen3-moe.json", "vllm", "sharded-state", 2, 2},
    {"tiny-qwen3-moe.json", "vllm", "kernel", 2, 4},
    {"tiny-qwen3-moe.json", "vllm-ascend", "kernel", 2, 2},
    {"tiny-qwen3-moe.json", "hf-fused", NULL, 1, 1},
    {"tiny-qwen3.5-moe.json", "vllm", "sharded-state", 2, 1},
    {"tiny-qwen3.5-moe.json", "vllm", "kernel", 4, 1},
    {"tiny-qwen3.5-moe.json", "vllm-ascend", "kernel", 2, 4},
};

int
main(int argc, char **argv)
{
  const char *conf[2] = {NULL, NULL}, *plugins[2] = {NULL, NULL};
  GError *error = NULL;
  int status;

  g_test_init(&argc, &argv, NULL);
  work_dir = test_tmpdir();
  made = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
  conf[0] = conf_dir();
  plugins[0] = plugin_dir();
  ctx = wsync_context_new(conf, plugins, NULL, &error);
  g_assert_no_error(error);

  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    const Case *c = &cases[i];
    g_autofree char *path =
        g_strdup_printf("/session/directory/%s/%s-%s-tp%u-ep%u", c->config, c->target,
                        c->format ? c->format : "default", c->tp, c->ep);
    g_test_add_data_func(path, c, test_directory);
  }
  g_test_add_func("/session/unpushed-blocks", test_unpushed_blocks);
  g_test_add_func("/session/steady-state", test_steady_state);
  g_test_add_func("/session/restart", test_restart);
  g_test_add_func("/session/interrupt", test_interrupt);
  g_test_add_func("/session/interrupt-without-error", test_interrupt_without_error);
  g_test_add_func("/session/forked-child", test_forked_child);
  g_test_add_func("/session/fused-description", test_fused_description);
  g_test_add_func("/session/shards", test_shards);
  g_test_add_func("/session/caller-sink/buckets", test_caller_sink);
  g_test_add_func("/session/caller-sink/default-size", test_caller_sink_default_size);
  g_test_add_func("/session/caller-sink/failure", test_caller_sink_failure);
  g_test_add_func("/session/caller-sink/max-open-buckets", test_caller_sink_cap);
  g_test_add_func("/session/digest", test_digest);
  g_test_add_func("/session/manifest", test_manifest);
  g_test_add_func("/session/refusals/push", test_push_refusals);
  g_test_add_func("/session/refusals/commit-missing", test_commit_missing);
  g_test_add_func("/session/refusals/plan", test_plan_refusals);
  g_test_add_func("/session/refusals/new", test_new_refusals);
  status = g_test_run();
  wsync_context_free(ctx);
  g_hash_table_unref(made);
  test_rmtree(work_dir);
  g_free(work_dir);
  return status;
}
