/* The library's surface: libwsync.so exports exactly the functions include/wsync/ declares
 * with WSYNC_API (nothing private becomes an ABI by accident), and every one of them is
 * documented by the comment right above its declaration; debian/libwsync0.symbols lists
 * exactly those symbols, for the library's SONAME (the package build checks it again
 * with dpkg-gensymbols -c4). */
#include <string.h>

#include <glib.h>

#include "testutil.h"

/* The headers of include/wsync/, in the source tree. */
static GPtrArray *
header_paths(void)
{
  g_autofree char *dir = g_test_build_filename(G_TEST_DIST, "..", "include", "wsync", NULL);
  g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
  GPtrArray *paths = g_ptr_array_new_with_free_func(g_free);
  const char *name;

  g_assert_nonnull(d);
  while ((name = g_dir_read_name(d)) != NULL)
    if (g_str_has_suffix(name, ".h"))
      g_ptr_array_add(paths, g_build_filename(dir, name, NULL));
  g_assert_cmpuint(paths->len, >, 5);
  return paths;
}

/* "WSYNC_API const char *wsync_x(..." -> "wsync_x" */
static char *
declared_name(const char *line)
{
  g_autoptr(GRegex) re = g_regex_new("\\b(wsync_[a-z0-9_]+)\\(", 0, 0, NULL);
  g_autoptr(GMatchInfo) match = NULL;

  if (!g_regex_match(re, line, 0, &match))
    return NULL;
  return g_match_info_fetch(match, 1);
}

/* Every WSYNC_API function of the headers; fails on one without a comment above it. */
static GHashTable *
declared_functions(void)
{
  g_autoptr(GPtrArray) paths = header_paths();
  GHashTable *names = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);

  for (guint f = 0; f < paths->len; f++) {
    g_autofree char *text = NULL;
    g_auto(GStrv) lines = NULL;
    const char *previous = "";
    g_assert_true(g_file_get_contents(paths->pdata[f], &text, NULL, NULL));
    lines = g_strsplit(text, "\n", -1);
    for (guint i = 0; lines[i] != NULL; i++) {
      if (g_str_has_prefix(lines[i], "WSYNC_API ")) {
        char *name = declared_name(lines[i]);
        g_assert_nonnull(name);
        if (!g_str_has_suffix(previous, "*/"))
          g_error("%s: %s has no documentation comment above it", (char *)paths->pdata[f],
                  name);
        g_hash_table_add(names, name);
      }
      if (lines[i][0] != '\0')
        previous = lines[i];
    }
  }
  return names;
}

/* The dynamic symbols libwsync.so defines. */
static GHashTable *
exported_functions(void)
{
  g_autofree char *lib = g_build_filename(test_env_dir("WSYNC_TEST_LIB_DIR"), "libwsync.so", NULL);
  const char *argv[] = {"nm", "-D", "--defined-only", lib, NULL};
  g_autofree char *out = NULL, *err = NULL;
  g_auto(GStrv) lines = NULL;
  GHashTable *names = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
  GError *error = NULL;
  int status = 0;

  g_spawn_sync(NULL, (char **)argv, NULL, G_SPAWN_SEARCH_PATH, NULL, NULL, &out, &err, &status,
               &error);
  g_assert_no_error(error);
  if (!g_spawn_check_wait_status(status, NULL))
    g_error("nm %s: %s", lib, err);
  lines = g_strsplit(out, "\n", -1);
  for (guint i = 0; lines[i] != NULL; i++) {
    g_auto(GStrv) fields = g_strsplit_set(lines[i], " \t", -1);
    guint n = g_strv_length(fields);
    if (n >= 3 && fields[n - 1][0] != '\0')
      g_hash_table_add(names, g_strdup(fields[n - 1]));
  }
  return names;
}

static void
assert_subset(GHashTable *a, GHashTable *b, const char *what)
{
  GHashTableIter it;
  gpointer key;

  g_hash_table_iter_init(&it, a);
  while (g_hash_table_iter_next(&it, &key, NULL))
    if (!g_hash_table_contains(b, key))
      g_error("%s: %s", what, (const char *)key);
}

static void
test_exports_are_the_api(void)
{
  g_autoptr(GHashTable) declared = declared_functions();
  g_autoptr(GHashTable) exported = exported_functions();

  assert_subset(exported, declared, "exported by libwsync.so but in no public header");
  assert_subset(declared, exported, "declared WSYNC_API but not exported");
  g_assert_cmpuint(g_hash_table_size(exported), ==, g_hash_table_size(declared));
}

/* The symbol names of debian/libwsync0.symbols (" NAME@Base VERSION" lines), and the
 * SONAME of its header line in @soname. */
static GHashTable *
debian_symbols(char **soname)
{
  g_autofree char *path =
      g_test_build_filename(G_TEST_DIST, "..", "debian", "libwsync0.symbols", NULL);
  g_autofree char *text = NULL;
  g_auto(GStrv) lines = NULL;
  GHashTable *names = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);

  g_assert_true(g_file_get_contents(path, &text, NULL, NULL));
  lines = g_strsplit(text, "\n", -1);
  g_assert_true(g_str_has_suffix(lines[0], " libwsync0 #MINVER#"));
  *soname = g_strndup(lines[0], strcspn(lines[0], " "));
  for (guint i = 1; lines[i] != NULL; i++) {
    if (lines[i][0] != ' ')
      continue; /* "* Build-Depends-Package: ...", the end */
    const char *at = strstr(lines[i], "@Base ");
    if (at == NULL)
      g_error("%s:%u: not \" NAME@Base VERSION\": %s", path, i + 1, lines[i]);
    if (!g_hash_table_add(names, g_strndup(lines[i] + 1, (gsize)(at - lines[i] - 1))))
      g_error("%s:%u: listed twice: %s", path, i + 1, lines[i]);
  }
  return names;
}

/* The SONAME objdump -p reads in libwsync.so. */
static char *
library_soname(void)
{
  g_autofree char *lib = g_build_filename(test_env_dir("WSYNC_TEST_LIB_DIR"), "libwsync.so", NULL);
  const char *argv[] = {"objdump", "-p", lib, NULL};
  g_autofree char *out = NULL;
  g_autoptr(GError) error = NULL;
  g_autoptr(GRegex) re = g_regex_new("^\\s+SONAME\\s+(\\S+)$", G_REGEX_MULTILINE, 0, NULL);
  g_autoptr(GMatchInfo) match = NULL;
  int status = 0;

  g_spawn_sync(NULL, (char **)argv, NULL, G_SPAWN_SEARCH_PATH | G_SPAWN_STDERR_TO_DEV_NULL, NULL,
               NULL, &out, NULL, &status, &error);
  g_assert_no_error(error);
  g_assert_true(g_spawn_check_wait_status(status, NULL));
  if (!g_regex_match(re, out, 0, &match))
    g_error("objdump -p %s shows no SONAME", lib);
  return g_match_info_fetch(match, 1);
}

static void
test_debian_symbols_are_the_exports(void)
{
  g_autofree char *soname = NULL;
  g_autoptr(GHashTable) listed = debian_symbols(&soname);
  g_autoptr(GHashTable) exported = exported_functions();
  g_autofree char *real_soname = library_soname();

  g_assert_cmpstr(soname, ==, real_soname);
  assert_subset(exported, listed,
                "exported by libwsync.so but not in debian/libwsync0.symbols (add it with the "
                "version that first has it)");
  assert_subset(listed, exported, "in debian/libwsync0.symbols but not exported by libwsync.so");
  g_assert_cmpuint(g_hash_table_size(listed), ==, g_hash_table_size(exported));
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/exports/exactly-the-public-api", test_exports_are_the_api);
  g_test_add_func("/exports/debian-symbols", test_debian_symbols_are_the_exports);
  return g_test_run();
}
