/* Fuzzing the index reader: model.safetensors.index.json through
 * wsync_checkpoint_open() of a directory that holds real shards and traps (a
 * subdirectory's shard, a directory, a FIFO and a symlink leading out, all named
 * *.safetensors).  An accepted index must give a checkpoint whose tensors are all found
 * by name; a refusal must be one clean line of bad input: whatever the index names, it
 * is never an I/O failure.  See fuzz-driver.h. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <wsync/checkpoint.h>

#define FUZZ_NAME "index"
#include "fuzz-driver.h"

static char *work;  /* the checkpoint directory */
static char *index_path;
static char *outside; /* a safetensors file outside it */

static void
write_bytes(const char *path, const void *data, gsize len)
{
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || (len > 0 && write(fd, data, len) != (ssize_t)len) || close(fd) != 0)
    g_error("cannot write %s", path);
}

/* A shard holding one F32 tensor [2] per name. */
static void
write_shard(const char *path, const char *const *names)
{
  GString *header = g_string_new("{");
  guint n = 0;
  for (; names[n] != NULL; n++)
    g_string_append_printf(header, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[2],"
                                   "\"data_offsets\":[%u,%u]}",
                           n ? "," : "", names[n], 8 * n, 8 * n + 8);
  g_string_append_c(header, '}');
  GByteArray *b = g_byte_array_new();
  for (int i = 0; i < 8; i++) { /* the length, little-endian */
    guint8 c = (guint8)((guint64)header->len >> (8 * i));
    g_byte_array_append(b, &c, 1);
  }
  g_byte_array_append(b, (const guint8 *)header->str, (guint)header->len);
  for (guint k = 0; k < 8 * n; k++) {
    guint8 c = (guint8)k;
    g_byte_array_append(b, &c, 1);
  }
  write_bytes(path, b->data, b->len);
  g_byte_array_free(b, TRUE);
  g_string_free(header, TRUE);
}

static void
fuzz_setup(void)
{
  GError *error = NULL;
  work = g_dir_make_tmp("wsync-fuzz-index-XXXXXX", &error);
  g_assert_no_error(error);
  index_path = g_build_filename(work, "model.safetensors.index.json", NULL);
  const char *a[] = {"x", "y", NULL}, *b[] = {"z", NULL}, *c[] = {"w", NULL}, *o[] = {"o", NULL};
  g_autofree char *pa = g_build_filename(work, "a.safetensors", NULL);
  g_autofree char *pb = g_build_filename(work, "b.safetensors", NULL);
  g_autofree char *sub = g_build_filename(work, "sub", NULL);
  g_autofree char *pc = g_build_filename(sub, "c.safetensors", NULL);
  g_autofree char *dir = g_build_filename(work, "dir.safetensors", NULL);
  g_autofree char *pipe = g_build_filename(work, "pipe.safetensors", NULL);
  g_autofree char *link = g_build_filename(work, "out.safetensors", NULL);
  g_mkdir(sub, 0755);
  g_mkdir(dir, 0755);
  write_shard(pa, a);
  write_shard(pb, b);
  write_shard(pc, c);
  g_assert_cmpint(mkfifo(pipe, 0600), ==, 0);
  outside = g_strconcat(work, ".outside.safetensors", NULL);
  write_shard(outside, o);
  g_assert_cmpint(symlink(outside, link), ==, 0);
}

static void
remove_all(const char *path)
{
  GDir *d = g_dir_open(path, 0, NULL);
  const char *name;
  while (d != NULL && (name = g_dir_read_name(d)) != NULL) {
    g_autofree char *child = g_build_filename(path, name, NULL);
    if (g_file_test(child, G_FILE_TEST_IS_DIR) && !g_file_test(child, G_FILE_TEST_IS_SYMLINK))
      remove_all(child);
    else
      g_unlink(child);
  }
  if (d)
    g_dir_close(d);
  g_rmdir(path);
}

static void
fuzz_teardown(void)
{
  remove_all(work);
  g_unlink(outside);
  g_free(work);
  g_free(index_path);
  g_free(outside);
}

static void
fuzz_seeds(GPtrArray *seeds)
{
  static const char *const texts[] = {
      "{\"metadata\": {\"total_size\": 32}, \"weight_map\": {\"x\": \"a.safetensors\", "
      "\"y\": \"a.safetensors\", \"z\": \"b.safetensors\"}}",
      "{\"weight_map\": {\"x\": \"./a.safetensors\", \"y\": \"a.safetensors\", "
      "\"z\": \"b.safetensors\"}, \"metadata\": null}\n",
      "{\n  \"metadata\": {\"total_size\": 8.0},\n  \"weight_map\": {\"w\": \"sub/c.safetensors\"}\n}\n",
  };
  for (guint i = 0; i < G_N_ELEMENTS(texts); i++)
    g_ptr_array_add(seeds, g_bytes_new_static(texts[i], strlen(texts[i])));
}

static const char *const *
fuzz_dictionary(void)
{
  static const char *const tokens[] = {
    "\"a.safetensors\"", "\"b.safetensors\"", "\"sub/c.safetensors\"", "\"dir.safetensors\"",
    "\"pipe.safetensors\"", "\"out.safetensors\"", "\"../a.safetensors\"", "\"/etc/passwd\"",
    "\"sub/../a.safetensors\"", "\"\"", "\"x\"", "\"y\"", "\"z\"", "\"w\"", "\"o\"",
    "\"weight_map\"", "\"metadata\"", "\"total_size\"", "\\u0000", "\\n", "{", "}", "[", "]",
    ",", ":", "null", "-1", "1e400", "18446744073709551616", NULL};
  return tokens;
}

static gboolean
fuzz_one(const guint8 *data, gsize len)
{
  static const WsyncError allowed[] = {WSYNC_ERROR_BAD_INPUT};
  GError *error = NULL;

  write_bytes(index_path, data, len);
  WsyncCheckpoint *ck = wsync_checkpoint_open(work, &error);
  if (ck == NULL) {
    fuzz_check_refusal(error, allowed, G_N_ELEMENTS(allowed));
    g_error_free(error);
    return FALSE;
  }
  for (guint i = 0; i < wsync_checkpoint_n_tensors(ck); i++) {
    const WsyncTensor *t = wsync_checkpoint_tensor(ck, i);
    if (wsync_checkpoint_lookup(ck, t->name) == NULL)
      g_error("tensor %s is not found by its name", t->name);
    if (strcmp(t->name, "o") == 0)
      g_error("the shard outside the directory was read");
  }
  wsync_checkpoint_free(ck);
  return TRUE;
}

