/* Helpers shared by the tests: temporary directories, conf files, environment. */
#ifndef WSYNC_TESTUTIL_H
#define WSYNC_TESTUTIL_H

#include <glib.h>
#include <glib/gstdio.h>
#include <string.h>

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

#define assert_message_has(error, fragment)                                                   \
  do {                                                                                        \
    g_assert_nonnull(error);                                                                  \
    if (strstr((error)->message, (fragment)) == NULL)                                        \
      g_error("message \"%s\" lacks \"%s\"", (error)->message, (fragment));                  \
  } while (0)

#endif /* WSYNC_TESTUTIL_H */
