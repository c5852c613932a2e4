/* Tests of checkpoints (core/checkpoint.c): a file, a directory with an index, a
 * directory without one, and the index writer. */
#define _GNU_SOURCE
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib.h>
#include <glib/gstdio.h>

#include <wsync/checkpoint.h>
#include <wsync/error.h>

/* ================================================================ helpers */

typedef struct {
  char *root;  /* the temporary directory */
  char *dir;   /* ROOT/ck, the checkpoint directory */
  char *index; /* DIR/model.safetensors.index.json */
} Fixture;

static void
rm_rf(const char *path)
{
  GStatBuf sb;
  if (g_lstat(path, &sb) != 0)
    return;
  if (S_ISDIR(sb.st_mode)) {
    GDir *d = g_dir_open(path, 0, NULL);
    const char *name;
    while ((name = g_dir_read_name(d)) != NULL) {
      g_autofree char *child = g_build_filename(path, name, NULL);
      rm_rf(child);
    }
    g_dir_close(d);
    g_assert_cmpint(g_rmdir(path), ==, 0);
  } else {
    g_assert_cmpint(g_unlink(path), ==, 0);
  }
}

static void
fixture_setup(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autoptr(GError) err = NULL;
  f->root = g_dir_make_tmp("wsync-ck-XXXXXX", &err);
  g_assert_no_error(err);
  f->dir = g_build_filename(f->root, "ck", NULL);
  g_assert_cmpint(g_mkdir(f->dir, 0755), ==, 0);
  f->index = g_build_filename(f->dir, WSYNC_INDEX_NAME, NULL);
}

static void
fixture_teardown(Fixture *f, gconstpointer data)
{
  (void)data;
  rm_rf(f->root);
  g_free(f->root);
  g_free(f->dir);
  g_free(f->index);
}

/* The byte @i of tensor @name: its position, offset by the name's first letter. */
static guint8
tensor_byte(const char *name, guint i)
{
  return (guint8)(name[0] * 3 + i);
}

/* Writes DIR/FILE with one U8 [4] tensor per name (NULL-terminated list). */
static void
write_shard(const char *dir, const char *file, const char *const *names)
{
  g_autofree char *path = g_build_filename(dir, file, NULL);
  g_autoptr(GError) err = NULL;
  g_autoptr(WsyncSafetensorsWriter) w = wsync_safetensors_writer_new();
  for (const char *const *n = names; *n; n++)
    g_assert_true(wsync_safetensors_writer_add(w, *n, WSYNC_DTYPE_U8, 1, (guint64[]){4}, &err));
  g_assert_true(wsync_safetensors_writer_begin(w, path, &err));
  for (const char *const *n = names; *n; n++) {
    guint8 bytes[4];
    for (guint i = 0; i < 4; i++)
      bytes[i] = tensor_byte(*n, i);
    g_assert_true(wsync_safetensors_writer_pwrite(w, *n, 0, bytes, 4, &err));
  }
  g_assert_true(wsync_safetensors_writer_finish(w, &err));
  g_assert_no_error(err);
}

#define SHARD(dir, file, ...) write_shard(dir, file, (const char *const[]){__VA_ARGS__, NULL})

static void
write_text(const char *path, const char *text)
{
  g_autoptr(GError) err = NULL;
  g_assert_true(g_file_set_contents(path, text, -1, &err));
  g_assert_no_error(err);
}

static void
check_error(const GError *err, WsyncError code, const char *fragment)
{
  g_assert_nonnull(err);
  if (strstr(err->message, fragment) == NULL)
    g_printerr("message \"%s\" lacks \"%s\"\n", err->message, fragment);
  g_assert_nonnull(strstr(err->message, fragment));
  /* one line, no control character: every refusal can be printed as it is */
  for (const guchar *c = (const guchar *)err->message; *c; c++)
    g_assert_true(*c >= 0x20 && *c != 0x7f);
  g_assert_cmpuint(err->domain, ==, WSYNC_ERROR);
  g_assert_cmpint(err->code, ==, code);
}

/* Opens @path, which must fail with @code and a message holding @fragment. */
static void
expect_open_error(const char *path, WsyncError code, const char *fragment)
{
  g_autoptr(GError) err = NULL;
  g_autoptr(WsyncCheckpoint) ck = wsync_checkpoint_open(path, &err);
  g_assert_null(ck);
  check_error(err, code, fragment);
}

static WsyncCheckpoint *
expect_open(const char *path)
{
  g_autoptr(GError) err = NULL;
  WsyncCheckpoint *ck = wsync_checkpoint_open(path, &err);
  g_assert_no_error(err);
  g_assert_nonnull(ck);
  return ck;
}

static void
check_tensor_data(const WsyncTensor *t)
{
  g_assert_nonnull(t);
  g_assert_cmpuint(t->nbytes, ==, 4);
  for (guint i = 0; i < 4; i++)
    g_assert_cmpuint(t->data[i], ==, tensor_byte(t->name, i));
}

/* The two-shard index of several tests: a, b in shard 1, c in shard 2. */
#define SHARD1 "model.safetensors-00001-of-00002.safetensors"
#define SHARD2 "model.safetensors-00002-of-00002.safetensors"

static void
write_two_shards(Fixture *f)
{
  SHARD(f->dir, SHARD1, "b", "a");
  SHARD(f->dir, SHARD2, "c");
}

static void
write_index(Fixture *f, const char *weight_map_body)
{
  g_autofree char *text = g_strdup_printf(
      "{\"metadata\": {\"total_size\": 12}, \"weight_map\": {%s}}", weight_map_body);
  write_text(f->index, text);
}

/* ================================================================ tests */

static void
test_single_file(Fixture *f, gconstpointer data)
{
  (void)data;
  SHARD(f->dir, "model.safetensors", "z", "b.x", "b");
  g_autofree char *path = g_build_filename(f->dir, "model.safetensors", NULL);
  g_autoptr(WsyncCheckpoint) ck = expect_open(path);
  g_assert_false(wsync_checkpoint_is_dir(ck));
  g_assert_cmpstr(wsync_checkpoint_path(ck), ==, path);
  g_assert_cmpuint(wsync_checkpoint_n_files(ck), ==, 1);
  g_assert_cmpstr(wsync_safetensors_path(wsync_checkpoint_file(ck, 0)), ==, path);
  g_assert_cmpuint(wsync_checkpoint_n_tensors(ck), ==, 3);
  g_assert_cmpstr(wsync_checkpoint_tensor(ck, 0)->name, ==, "b");
  g_assert_cmpstr(wsync_checkpoint_tensor(ck, 1)->name, ==, "b.x");
  g_assert_cmpstr(wsync_checkpoint_tensor(ck, 2)->name, ==, "z");
  g_assert_cmpuint(wsync_checkpoint_total_bytes(ck), ==, 12);
  check_tensor_data(wsync_checkpoint_lookup(ck, "b.x"));
  g_assert_null(wsync_checkpoint_lookup(ck, "nope"));
}

static void
test_index_two_shards(Fixture *f, gconstpointer data)
{
  (void)data;
  write_two_shards(f);
  SHARD(f->dir, "stray.safetensors", "stray"); /* not in the index: not part of it */
  write_index(f, "\"c\": \"" SHARD2 "\", \"a\": \"" SHARD1 "\", \"b\": \"./" SHARD1 "\"");

  g_autoptr(WsyncCheckpoint) ck = expect_open(f->dir);
  g_assert_true(wsync_checkpoint_is_dir(ck));
  g_assert_cmpuint(wsync_checkpoint_n_files(ck), ==, 2);
  g_autofree char *p1 = g_build_filename(f->dir, SHARD1, NULL);
  g_autofree char *p2 = g_build_filename(f->dir, SHARD2, NULL);
  /* "./SHARD1" names the same file as "SHARD1", so each file is opened once */
  g_assert_cmpstr(wsync_safetensors_path(wsync_checkpoint_file(ck, 0)), ==, p1);
  g_assert_cmpstr(wsync_safetensors_path(wsync_checkpoint_file(ck, 1)), ==, p2);
  g_assert_cmpuint(wsync_checkpoint_n_tensors(ck), ==, 3);
  const char *expect[] = {"a", "b", "c"};
  for (guint i = 0; i < 3; i++) {
    const WsyncTensor *t = wsync_checkpoint_tensor(ck, i);
    g_assert_cmpstr(t->name, ==, expect[i]);
    check_tensor_data(t);
  }
  g_assert_cmpstr(wsync_checkpoint_lookup(ck, "c")->file, ==, p2);
  g_assert_null(wsync_checkpoint_lookup(ck, "stray"));
  g_assert_cmpuint(wsync_checkpoint_total_bytes(ck), ==, 12);
}

static void
test_index_escape_dotdot(Fixture *f, gconstpointer data)
{
  (void)data;
  SHARD(f->root, "x.safetensors", "a");
  write_text(f->index, "{\"weight_map\": {\"a\": \"../x.safetensors\"}}");
  g_autofree char *msg = g_strdup_printf(
      "%s: shard \"../x.safetensors\" of tensor \"a\" leaves the checkpoint directory", f->index);
  expect_open_error(f->dir, WSYNC_ERROR_BAD_INPUT, msg);

  /* Even one that comes back in */
  SHARD(f->dir, "y.safetensors", "a");
  write_text(f->index, "{\"weight_map\": {\"a\": \"sub/../y.safetensors\"}}");
  expect_open_error(f->dir, WSYNC_ERROR_BAD_INPUT, "leaves the checkpoint directory");
}

static void
test_index_escape_absolute(Fixture *f, gconstpointer data)
{
  (void)data;
  SHARD(f->root, "x.safetensors", "a");
  g_autofree char *outside = g_build_filename(f->root, "x.safetensors", NULL);
  g_autofree char *text = g_strdup_printf("{\"weight_map\": {\"a\": \"%s\"}}", outside);
  write_text(f->index, text);
  g_autofree char *msg = g_strdup_printf(
      "%s: shard \"%s\" of tensor \"a\" leaves the checkpoint directory", f->index, outside);
  expect_open_error(f->dir, WSYNC_ERROR_BAD_INPUT, msg);
}

static void
test_index_escape_symlink(Fixture *f, gconstpointer data)
{
  (void)data;
  SHARD(f->root, "x.safetensors", "a");
  g_autofree char *link = g_build_filename(f->dir, "link.safetensors", NULL);
  g_assert_cmpint(symlink("../x.safetensors", link), ==, 0);
  write_text(f->index, "{\"weight_map\": {\"a\": \"link.safetensors\"}}");
  g_autofree char *msg = g_strdup_printf(
      "%s: shard \"link.safetensors\" of tensor \"a\" leaves the checkpoint directory", f->index);
  expect_open_error(f->dir, WSYNC_ERROR_BAD_INPUT, msg);
}

/* A symlink that stays inside is fine, and two names of one file make one file. */
static void
test_index_symlink_inside(Fixture *f, gconstpointer data)
{
  (void)data;
  SHARD(f->dir, "real.safetensors", "a", "b");
  g_autofree char *link = g_build_filename(f->dir, "alias.safetensors", NULL);
  g_assert_cmpint(symlink("real.safetensors", link), ==, 0);
  write_text(f->index,
             "{\"weight_map\": {\"a\": \"real.safetensors\", \"b\": \"alias.safetensors\"}}");
  g_autoptr(WsyncCheckpoint) ck = expect_open(f->dir);
  g_assert_cmpuint(wsync_checkpoint_n_files(ck), ==, 1);
  g_assert_cmpuint(wsync_checkpoint_n_tensors(ck), ==, 2);
}

static void
test_index_missing_shard(Fixture *f, gconstpointer data)
{
  (void)data;
  SHARD(f->dir, SHARD1, "a", "b");
  write_index(f, "\"a\": \"" SHARD1 "\", \"b\": \"" SHARD1 "\", \"c\": \"" SHARD2 "\"");
  g_autofree char *msg =
      g_strdup_printf("%s: shard \"" SHARD2 "\" (named for tensor \"c\") is missing", f->index);
  expect_open_error(f->dir, WSYNC_ERROR_BAD_INPUT, msg);
}

static void
test_index_tensor_not_in_shard(Fixture *f, gconstpointer data)
{
  (void)data;
  write_two_shards(f);
  write_index(f, "\"a\": \"" SHARD1 "\", \"b\": \"" SHARD1 "\", \"c\": \"" SHARD1 "\"");
  g_autofree char *msg = g_strdup_printf(
      "%s: tensor \"c\" is not in its shard \"" SHARD1 "\" (%s/" SHARD1 ")", f->index, f->dir);
  expect_open_error(f->dir, WSYNC_ERROR_BAD_INPUT, msg);
}

static void
test_index_tensor_not_in_index(Fixture *f, gconstpointer data)
{
  (void)data;
  write_two_shards(f);
  write_index(f, "\"a\": \"" SHARD1 "\", \"c\": \"" SHARD2 "\"");
  g_autofree char *msg =
      g_strdup_printf("%s/" SHARD1 ": tensor \"b\" is not named in %s", f->dir, f->index);
  expect_open_error(f->dir, WSYNC_ERROR_BAD_INPUT, msg);
}

static void
test_index_tensor_other_shard(Fixture *f, gconstpointer data)
{
  (void)data;
  SHARD(f->dir, SHARD1, "a", "b");
  SHARD(f->dir, SHARD2, "b", "c");
  write_index(f, "\"a\": \"" SHARD1 "\", \"b\": \"" SHARD2 "\", \"c\": \"" SHARD2 "\"");
  g_autofree char *msg = g_strdup_printf(
      "%s/" SHARD1 ": tensor \"b\" is named for shard \"" SHARD2 "\" in %s", f->dir, f->index);
  expect_open_error(f->dir, WSYNC_ERROR_BAD_INPUT, msg);
}

/* metadata.total_size is not checked against the tensors: published checkpoints
 * sometimes carry a slightly different number, and Transformers loads them. */
static void
test_index_total_size(Fixture *f, gconstpointer data)
{
  (void)data;
  write_two_shards(f);
  write_text(f->index, "{\"metadata\": {\"total_size\": 13}, \"weight_map\": {\"a\": \"" SHARD1
                       "\", \"b\": \"" SHARD1 "\", \"c\": \"" SHARD2 "\"}}");
  g_autoptr(WsyncCheckpoint) ck = expect_open(f->dir);
  g_assert_cmpuint(wsync_checkpoint_n_tensors(ck), ==, 3);
  /* the real sum, not the index's number */
  g_assert_cmpuint(wsync_checkpoint_total_bytes(ck), ==, 12);
  g_clear_pointer(&ck, wsync_checkpoint_free);

  /* Without metadata at all it is fine too */
  write_text(f->index, "{\"weight_map\": {\"a\": \"" SHARD1 "\", \"b\": \"" SHARD1
                       "\", \"c\": \"" SHARD2 "\"}}");
  ck = expect_open(f->dir);
  g_assert_cmpuint(wsync_checkpoint_n_tensors(ck), ==, 3);
}

static void
test_index_malformed(Fixture *f, gconstpointer data)
{
  (void)data;
  write_two_shards(f);
  g_autofree char *prefix = g_strdup_printf("%s: ", f->index);
  struct {
    const char *text, *fragment;
  } cases[] = {
      {"{\"weight_map\": ", "not valid JSON at 1:15: "},
      {"[]", "the top level is an array, not an object"},
      {"{\"metadata\": {}}", "no \"weight_map\""},
      {"{\"weight_map\": []}", "\"weight_map\" is an array, not an object"},
      {"{\"weight_map\": {\"a\": 1}}", "the shard of tensor \"a\" is a number, not a string"},
      /* entries are checked in the index's order: a shard that is not a string after
       * good entries, and what is wrong with an entry before it first */
      {"{\"weight_map\": {\"a\": \"" SHARD1 "\", \"b\": [\"" SHARD1 "\"]}}",
       "the shard of tensor \"b\" is an array, not a string"},
      {"{\"weight_map\": {\"a\": \"gone.safetensors\", \"b\": null}}",
       "shard \"gone.safetensors\" (named for tensor \"a\") is missing"},
      {"{\"weight_map\": {\"z\": \"" SHARD1 "\", \"b\": true}}",
       "tensor \"z\" is not in its shard \"" SHARD1 "\""},
      {"{\"weight_map\": {\"a\": \"\"}}", "tensor \"a\" has an empty shard name"},
      {"{\"weight_map\": {\"a\": \"" SHARD1 "\", \"a\": \"" SHARD2 "\"}}",
       "the key \"a\" appears twice"},
      {"{\"metadata\": {\"total_size\": \"12\"}, \"weight_map\": {}}",
       "metadata.total_size is a string, not a non-negative integer"},
      {"{\"metadata\": 3, \"weight_map\": {}}", "\"metadata\" is a number, not an object"},
      {"{\"weight_map\": {}} {}", "not valid JSON: a second value begins at byte 19"},
      {"{\"weight_map\": /* c */ {}}", "not valid JSON: unexpected '/' at byte 15"},
      {"{\"weight_map\": {\"\xfe\": \"x\"}}", "not valid UTF-8 (bad byte 0xfe at byte 17)"},
  };
  for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
    write_text(f->index, cases[i].text);
    g_autofree char *msg = g_strconcat(prefix, cases[i].fragment, NULL);
    expect_open_error(f->dir, WSYNC_ERROR_BAD_INPUT, msg);
  }

  /* Deep enough to overflow json-glib's recursion if it got that far */
  GString *deep = g_string_new("{\"weight_map\": {}, \"x\": ");
  for (int i = 0; i < 200000; i++)
    g_string_append_c(deep, '[');
  write_text(f->index, deep->str);
  g_string_free(deep, TRUE);
  g_autofree char *msg = g_strconcat(prefix, "JSON nests deeper than 64 levels", NULL);
  expect_open_error(f->dir, WSYNC_ERROR_BAD_INPUT, msg);
}

/* A broken shard is reported by its own path. */
static void
test_index_bad_shard(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *shard = g_build_filename(f->dir, SHARD1, NULL);
  write_text(shard, "short");
  write_index(f, "\"a\": \"" SHARD1 "\"");
  g_autofree char *msg = g_strdup_printf("%s: file is 5 bytes, too short", shard);
  expect_open_error(f->dir, WSYNC_ERROR_BAD_INPUT, msg);
}

static void
test_plain_two_files(Fixture *f, gconstpointer data)
{
  (void)data;
  SHARD(f->dir, "model-rank-1-part-0.safetensors", "b", "d");
  SHARD(f->dir, "model-rank-0-part-0.safetensors", "c", "a");
  g_autofree char *hidden = g_build_filename(f->dir, ".hidden.safetensors", NULL);
  g_autofree char *notes = g_build_filename(f->dir, "notes.txt", NULL);
  write_text(hidden, "not a safetensors file");
  write_text(notes, "not a safetensors file");

  g_autoptr(WsyncCheckpoint) ck = expect_open(f->dir);
  g_assert_true(wsync_checkpoint_is_dir(ck));
  g_assert_cmpuint(wsync_checkpoint_n_files(ck), ==, 2);
  g_assert_true(g_str_has_suffix(wsync_safetensors_path(wsync_checkpoint_file(ck, 0)),
                                 "/model-rank-0-part-0.safetensors"));
  g_assert_true(g_str_has_suffix(wsync_safetensors_path(wsync_checkpoint_file(ck, 1)),
                                 "/model-rank-1-part-0.safetensors"));
  g_assert_cmpuint(wsync_checkpoint_n_tensors(ck), ==, 4);
  const char *expect[] = {"a", "b", "c", "d"};
  for (guint i = 0; i < 4; i++) {
    g_assert_cmpstr(wsync_checkpoint_tensor(ck, i)->name, ==, expect[i]);
    check_tensor_data(wsync_checkpoint_tensor(ck, i));
  }
  g_assert_true(
      g_str_has_suffix(wsync_checkpoint_lookup(ck, "d")->file, "model-rank-1-part-0.safetensors"));
  g_assert_cmpuint(wsync_checkpoint_total_bytes(ck), ==, 16);
}

static void
test_plain_duplicate(Fixture *f, gconstpointer data)
{
  (void)data;
  SHARD(f->dir, "one.safetensors", "a", "x");
  SHARD(f->dir, "two.safetensors", "x", "y");
  g_autofree char *msg = g_strdup_printf(
      "%s/two.safetensors: tensor \"x\" is also in %s/one.safetensors", f->dir, f->dir);
  expect_open_error(f->dir, WSYNC_ERROR_BAD_INPUT, msg);
}

static void
test_plain_empty(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *notes = g_build_filename(f->dir, "README", NULL);
  write_text(notes, "nothing here");
  g_autofree char *msg = g_strdup_printf("no safetensors files in %s", f->dir);
  expect_open_error(f->dir, WSYNC_ERROR_BAD_INPUT, msg);
}

static void
test_open_missing(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autofree char *path = g_build_filename(f->root, "nope", NULL);
  g_autofree char *msg = g_strdup_printf("cannot open %s: ", path);
  expect_open_error(path, WSYNC_ERROR_IO, msg);
}

static void
test_index_write(Fixture *f, gconstpointer data)
{
  (void)data;
  write_two_shards(f);
  g_autoptr(GHashTable) map = g_hash_table_new(g_str_hash, g_str_equal);
  g_hash_table_insert(map, "c", SHARD2);
  g_hash_table_insert(map, "b", SHARD1);
  g_hash_table_insert(map, "a", SHARD1);
  g_autoptr(GError) err = NULL;
  g_assert_true(wsync_index_write(f->index, 12, map, &err));
  g_assert_no_error(err);

  static const char expected[] = "{\n"
                                 "  \"metadata\": {\n"
                                 "    \"total_size\": 12\n"
                                 "  },\n"
                                 "  \"weight_map\": {\n"
                                 "    \"a\": \"" SHARD1 "\",\n"
                                 "    \"b\": \"" SHARD1 "\",\n"
                                 "    \"c\": \"" SHARD2 "\"\n"
                                 "  }\n"
                                 "}\n";
  g_autofree char *text = NULL;
  gsize len;
  g_assert_true(g_file_get_contents(f->index, &text, &len, NULL));
  g_assert_cmpstr(text, ==, expected);

  /* and it reads back */
  g_autoptr(WsyncCheckpoint) ck = expect_open(f->dir);
  g_assert_cmpuint(wsync_checkpoint_n_tensors(ck), ==, 3);
  g_assert_cmpuint(wsync_checkpoint_total_bytes(ck), ==, 12);
}

/* Python's json.dumps: empty maps as {}, non-ASCII as \u escapes */
static void
test_index_write_escapes(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autoptr(GError) err = NULL;
  g_autoptr(GHashTable) map = g_hash_table_new(g_str_hash, g_str_equal);
  g_assert_true(wsync_index_write(f->index, 0, map, &err));
  g_autofree char *text = NULL;
  g_assert_true(g_file_get_contents(f->index, &text, NULL, NULL));
  g_assert_cmpstr(text, ==,
                  "{\n  \"metadata\": {\n    \"total_size\": 0\n  },\n  \"weight_map\": {}\n}\n");

  g_hash_table_insert(map, "caf\xc3\xa9 \"q\"\\\n\x01\x7f", "\xf0\x9f\x98\x80.safetensors");
  g_assert_true(wsync_index_write(f->index, 18446744073709551615u, map, &err));
  g_assert_no_error(err);
  g_autofree char *text2 = NULL;
  g_assert_true(g_file_get_contents(f->index, &text2, NULL, NULL));
  g_assert_cmpstr(text2, ==,
                  "{\n  \"metadata\": {\n    \"total_size\": 18446744073709551615\n  },\n"
                  "  \"weight_map\": {\n"
                  "    \"caf\\u00e9 \\\"q\\\"\\\\\\n\\u0001\\u007f\": "
                  "\"\\ud83d\\ude00.safetensors\"\n  }\n}\n");
}

static void
test_index_write_error(Fixture *f, gconstpointer data)
{
  (void)data;
  g_autoptr(GError) err = NULL;
  g_autoptr(GHashTable) map = g_hash_table_new(g_str_hash, g_str_equal);
  g_autofree char *path = g_build_filename(f->root, "missing-dir", WSYNC_INDEX_NAME, NULL);
  g_assert_false(wsync_index_write(path, 0, map, &err));
  g_autofree char *msg = g_strdup_printf("cannot create %s: ", path);
  check_error(err, WSYNC_ERROR_IO, msg);
}

static void
add(const char *name, void (*fn)(Fixture *, gconstpointer))
{
  g_test_add(name, Fixture, NULL, fixture_setup, fn, fixture_teardown);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);

  add("/checkpoint/file", test_single_file);
  add("/checkpoint/open-missing", test_open_missing);
  add("/checkpoint/index/two-shards", test_index_two_shards);
  add("/checkpoint/index/escape-dotdot", test_index_escape_dotdot);
  add("/checkpoint/index/escape-absolute", test_index_escape_absolute);
  add("/checkpoint/index/escape-symlink", test_index_escape_symlink);
  add("/checkpoint/index/symlink-inside", test_index_symlink_inside);
  add("/checkpoint/index/missing-shard", test_index_missing_shard);
  add("/checkpoint/index/tensor-not-in-shard", test_index_tensor_not_in_shard);
  add("/checkpoint/index/tensor-not-in-index", test_index_tensor_not_in_index);
  add("/checkpoint/index/tensor-other-shard", test_index_tensor_other_shard);
  add("/checkpoint/index/total-size", test_index_total_size);
  add("/checkpoint/index/malformed", test_index_malformed);
  add("/checkpoint/index/bad-shard", test_index_bad_shard);
  add("/checkpoint/plain/two-files", test_plain_two_files);
  add("/checkpoint/plain/duplicate", test_plain_duplicate);
  add("/checkpoint/plain/empty", test_plain_empty);
  add("/checkpoint/index-write/exact", test_index_write);
  add("/checkpoint/index-write/escapes", test_index_write_escapes);
  add("/checkpoint/index-write/error", test_index_write_error);

  return g_test_run();
}
