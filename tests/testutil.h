/* Helpers shared by the tests: temporary directories, conf files, environment. */
#ifndef WSYNC_TESTUTIL_H
#define WSYNC_TESTUTIL_H

#include <stdarg.h>

#include <glib.h>
#include <glib/gstdio.h>
#include <string.h>
#include <sys/wait.h>
#include <wsync/safetensors.h>

/* A directory named by the test environment (see AM_TESTS_ENVIRONMENT). */
static inline const char *
test_env_dir(const char *var)
{
  const char *dir = g_getenv(var);
  if (dir == NULL)
    g_error("%s is not set: run the tests with make check", var);
  return dir;
}

static inline char *
test_tmpdir(void)
{
  GError *error = NULL;
  char *dir = g_dir_make_tmp("wsync-test-XXXXXX", &error);
  g_assert_no_error(error);
  return dir;
}

/* Writes @text to DIR/NAME and returns the path. */
static inline char *
test_write(const char *dir, const char *name, const char *text)
{
  GError *error = NULL;
  char *path = g_build_filename(dir, name, NULL);
  g_file_set_contents(path, text, -1, &error);
  g_assert_no_error(error);
  return path;
}

/* A fresh conf.d selecting the "hf" plugin (what merge, synth and reading published
 * checkpoints need); run wsync with --plugin-dir $WSYNC_TEST_BUILT_PLUGIN_DIR. */
static inline char *
hf_conf_dir(void)
{
  char *dir = test_tmpdir();

  g_free(test_write(dir, "10-hf.conf", "plugin \"hf\" {}\n"));
  return dir;
}

/* Removes a directory tree made by a test. */
static inline void
test_rmtree(const char *path)
{
  GDir *dir = g_dir_open(path, 0, NULL);
  const char *name;

  if (dir == NULL) {
    g_unlink(path);
    return;
  }
  while ((name = g_dir_read_name(dir)) != NULL) {
    char *child = g_build_filename(path, name, NULL);
    if (g_file_test(child, G_FILE_TEST_IS_DIR) && !g_file_test(child, G_FILE_TEST_IS_SYMLINK))
      test_rmtree(child);
    else
      g_unlink(child);
    g_free(child);
  }
  g_dir_close(dir);
  g_rmdir(path);
}

/* Copies a file byte for byte (plugins into directories with particular modes). */
static inline void
test_copy(const char *from, const char *to)
{
  GError *error = NULL;
  char *data = NULL;
  gsize len = 0;
  g_file_get_contents(from, &data, &len, &error);
  g_assert_no_error(error);
  g_file_set_contents(to, data, (gssize)len, &error);
  g_assert_no_error(error);
  g_free(data);
}

/* What a run of the wsync command printed, and how it ended. */
typedef struct {
  char *out;
  char *err;
  int status; /* the exit status, or 128 + N when signal N ended it (as a shell says) */
  int signal; /* N when a signal ended it, else 0 */
} TestRun;

static inline void
test_run_clear(TestRun *r)
{
  g_free(r->out);
  g_free(r->err);
}

/* TRUE when @text holds a control character (other than the newlines of @allow_newlines)
 * or DEL: what a one-line, escaped message never holds. */
static inline gboolean
test_has_control(const char *text, gboolean allow_newlines)
{
  for (const guchar *p = (const guchar *)text; *p; p++)
    if ((*p < 0x20 && !(allow_newlines && *p == '\n')) || *p == 0x7f)
      return TRUE;
  return FALSE;
}

/* Every refusal is one line: whatever a run of wsync printed on stderr must be lines
 * that each begin with "wsync" (errors, refusals, warnings), with no control
 * character inside, ending with a newline.  The one exception is the usage text of a
 * bare `wsync`; valgrind's own lines ("==PID== ...") are skipped.  Checked for every
 * run the tests make, so every error path they exercise is held to it. */
static inline void
test_check_error_lines(const char *err)
{
  if (err[0] == '\0' || g_str_has_prefix(err, "Usage: wsync"))
    return;
  if (test_has_control(err, TRUE) || !g_str_has_suffix(err, "\n"))
    g_error("stderr is not made of clean lines: \"%s\"", g_strescape(err, NULL));
  char **lines = g_strsplit(err, "\n", -1);
  for (guint i = 0; lines[i] != NULL && lines[i + 1] != NULL; i++)
    if (!g_str_has_prefix(lines[i], "wsync") && !g_str_has_prefix(lines[i], "=="))
      g_error("stderr line %u does not begin with \"wsync\" (a refusal spread over more than "
              "one line?): \"%s\"",
              i + 1, lines[i]);
  g_strfreev(lines);
}

/* Runs the wsync binary with @args (a NULL-terminated vector without the program name).
 * Under `make check-valgrind` WSYNC_TEST_WRAPPER holds the valgrind command line, so
 * every wsync the tests start runs under memcheck too (an error exits 99). */
static inline TestRun
test_run_wsync_argv(const char *const *args)
{
  GPtrArray *argv = g_ptr_array_new_with_free_func(g_free);
  const char *wrapper = g_getenv("WSYNC_TEST_WRAPPER");
  GError *error = NULL;
  TestRun r = {0};
  int wait_status = 0;

  if (wrapper != NULL && wrapper[0] != '\0') {
    char **words = g_strsplit(wrapper, " ", -1);
    for (guint i = 0; words[i] != NULL; i++)
      if (words[i][0] != '\0')
        g_ptr_array_add(argv, g_strdup(words[i]));
    g_strfreev(words);
  }
  g_ptr_array_add(argv, g_strdup(test_env_dir("WSYNC_TEST_BINARY")));
  for (guint i = 0; args[i] != NULL; i++)
    g_ptr_array_add(argv, g_strdup(args[i]));
  g_ptr_array_add(argv, NULL);
  g_spawn_sync(NULL, (char **)argv->pdata, NULL, G_SPAWN_DEFAULT, NULL, NULL, &r.out, &r.err,
               &wait_status, &error);
  g_assert_no_error(error);
  if (WIFSIGNALED(wait_status)) {
    r.signal = WTERMSIG(wait_status);
    r.status = 128 + r.signal;
  } else {
    g_assert_true(WIFEXITED(wait_status));
    r.status = WEXITSTATUS(wait_status);
  }
  if (r.status == 99)
    g_error("wsync failed under valgrind: %s", r.err);
  test_check_error_lines(r.err);
  g_ptr_array_unref(argv);
  return r;
}

/* Runs wsync with the arguments in @args (not NULL-terminated). */
static inline TestRun
test_run_args(GPtrArray *args)
{
  GPtrArray *argv = g_ptr_array_new();
  TestRun r;

  for (guint i = 0; i < args->len; i++)
    g_ptr_array_add(argv, args->pdata[i]);
  g_ptr_array_add(argv, NULL);
  r = test_run_wsync_argv((const char *const *)argv->pdata);
  g_ptr_array_unref(argv);
  return r;
}

/* Runs wsync with @first and the arguments after it, up to a NULL. */
static inline TestRun
test_run(const char *first, ...)
{
  GPtrArray *args = g_ptr_array_new();
  va_list ap;
  TestRun r;

  va_start(ap, first);
  for (const char *a = first; a != NULL; a = va_arg(ap, const char *))
    g_ptr_array_add(args, (gpointer)a);
  va_end(ap);
  r = test_run_args(args);
  g_ptr_array_unref(args);
  return r;
}

/* Runs wsync --conf-dir @conf --plugin-dir @plugins and the arguments in @ap, up to a
 * NULL: a test's own configuration and the built plugins. */
static inline TestRun
test_run_in_va(const char *conf, const char *plugins, const char *first, va_list ap)
{
  GPtrArray *args = g_ptr_array_new();
  TestRun r;

  g_ptr_array_add(args, "--conf-dir");
  g_ptr_array_add(args, (gpointer)conf);
  g_ptr_array_add(args, "--plugin-dir");
  g_ptr_array_add(args, (gpointer)plugins);
  for (const char *a = first; a != NULL; a = va_arg(ap, const char *))
    g_ptr_array_add(args, (gpointer)a);
  r = test_run_args(args);
  g_ptr_array_unref(args);
  return r;
}

/* test_run_in_va() with @first and the arguments after it, up to a NULL. */
static inline TestRun
test_run_in(const char *conf, const char *plugins, const char *first, ...)
{
  va_list ap;
  TestRun r;

  va_start(ap, first);
  r = test_run_in_va(conf, plugins, first, ap);
  va_end(ap);
  return r;
}

/* Runs wsync with @args and insists on exit 0, showing the command and stderr if not. */
static inline void
test_run_ok(GPtrArray *args)
{
  TestRun r = test_run_args(args);

  if (r.status != 0) {
    GString *cmd = g_string_new("wsync");
    for (guint i = 0; i < args->len; i++)
      g_string_append_printf(cmd, " %s", (const char *)args->pdata[i]);
    g_error("%s: exit %d\n%s", cmd->str, r.status, r.err);
  }
  test_run_clear(&r);
}

static inline void
test_assert_has(const char *text, const char *fragment)
{
  if (strstr(text, fragment) == NULL)
    g_error("\"%s\" lacks \"%s\"", text, fragment);
}

/* TRUE in an AddressSanitizer build (the README's sanitizer run: wsync is built with the
 * same flags), which reserves more address space than a data size limit allows and
 * takes page faults of its own. */
#if defined(__SANITIZE_ADDRESS__)
#define TEST_UNDER_ASAN TRUE
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_UNDER_ASAN TRUE
#endif
#endif
#ifndef TEST_UNDER_ASAN
#define TEST_UNDER_ASAN FALSE
#endif

/* ... and the message is one line without control characters, as every refusal is. */
#define assert_message_has(error, fragment)                                                   \
  do {                                                                                        \
    g_assert_nonnull(error);                                                                  \
    if (strstr((error)->message, (fragment)) == NULL)                                        \
      g_error("message \"%s\" lacks \"%s\"", (error)->message, (fragment));                  \
    if (test_has_control((error)->message, FALSE))                                           \
      g_error("message \"%s\" is not one clean line", g_strescape((error)->message, NULL));   \
  } while (0)

/* Rewrites every rank file (model-rank-*, kernel-rank-*) of @dir with metadata @key set
 * to @value, or without @key when @value is NULL (files as another wsync wrote them, or
 * as a hand edit broke them); the tensors are copied as they are. */
static inline void
test_set_rank_file_metadata(const char *dir, const char *key, const char *value)
{
  g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
  GDir *d = g_dir_open(dir, 0, NULL);
  const char *name;

  g_assert_nonnull(d);
  while ((name = g_dir_read_name(d)) != NULL)
    if ((g_str_has_prefix(name, "model-rank-") || g_str_has_prefix(name, "kernel-rank-")) &&
        g_str_has_suffix(name, ".safetensors"))
      g_ptr_array_add(names, g_build_filename(dir, name, NULL));
  g_dir_close(d);
  g_assert_cmpuint(names->len, >, 0);
  for (guint f = 0; f < names->len; f++) {
    const char *path = names->pdata[f];
    g_autofree char *tmp = g_strconcat(path, ".new", NULL);
    g_autoptr(WsyncSafetensors) st = NULL;
    g_autoptr(WsyncSafetensorsWriter) w = NULL;
    GError *error = NULL;
    GHashTableIter it;
    gpointer k, v;

    st = wsync_safetensors_open(path, &error);
    g_assert_no_error(error);
    w = wsync_safetensors_writer_new();
    g_hash_table_iter_init(&it, wsync_safetensors_metadata(st));
    while (g_hash_table_iter_next(&it, &k, &v))
      if (strcmp(k, key) != 0)
        wsync_safetensors_writer_set_metadata(w, k, v);
    if (value != NULL)
      wsync_safetensors_writer_set_metadata(w, key, value);
    for (guint i = 0; i < wsync_safetensors_n_tensors(st); i++) {
      const WsyncTensor *t = wsync_safetensors_tensor(st, i);
      wsync_safetensors_writer_add(w, t->name, t->dtype, t->ndim, t->shape, &error);
      g_assert_no_error(error);
    }
    wsync_safetensors_writer_begin(w, tmp, &error);
    g_assert_no_error(error);
    for (guint i = 0; i < wsync_safetensors_n_tensors(st); i++) {
      const WsyncTensor *t = wsync_safetensors_tensor(st, i);
      if (t->nbytes > 0)
        wsync_safetensors_writer_pwrite(w, t->name, 0, t->data, t->nbytes, &error);
      g_assert_no_error(error);
    }
    wsync_safetensors_writer_finish(w, &error);
    g_assert_no_error(error);
    g_assert_cmpint(g_rename(tmp, path), ==, 0);
  }
}

#endif /* WSYNC_TESTUTIL_H */
