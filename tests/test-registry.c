/* The dispatch table: ordering, filtering, ownership, removal by plugin. */
#include <string.h>

#include <wsync/wsync.h>

#include "testutil.h"

static int destroyed;

static void
count_destroy(gpointer data)
{
  destroyed++;
  g_free(data);
}

static gboolean
dummy(WsyncLayout *layout, gpointer user_data, GError **error)
{
  (void)layout;
  (void)user_data;
  (void)error;
  return TRUE;
}

static void
add_ok(WsyncRegistry *r, const char *plugin, const char *name, int priority, const char *serves)
{
  GError *error = NULL;
  gboolean ok = wsync_registry_add(r, plugin, WSYNC_ENTRY_CONVERTER, name, priority, serves,
                                   (GCallback)dummy, g_strdup(name), count_destroy, &error);
  g_assert_no_error(error);
  g_assert_true(ok);
}

static char *
names_of(GPtrArray *entries)
{
  GString *s = g_string_new(NULL);
  for (guint i = 0; i < entries->len; i++)
    g_string_append_printf(s, "%s%s", i ? " " : "", wsync_entry_get_name(entries->pdata[i]));
  return g_string_free(s, FALSE);
}

static void
test_order_priority_then_name(void)
{
  g_autoptr(WsyncRegistry) r = wsync_registry_new();
  add_ok(r, "p1", "zeta", 0, NULL);
  add_ok(r, "p2", "alpha", 0, NULL);
  add_ok(r, "p1", "low", -10, NULL);
  add_ok(r, "p2", "high", 100, NULL);
  add_ok(r, "p1", "beta", 0, NULL);

  g_autoptr(GPtrArray) all = wsync_registry_lookup(r, WSYNC_ENTRY_CONVERTER, NULL);
  g_autofree char *names = names_of(all);
  g_assert_cmpstr(names, ==, "high alpha beta zeta low");
}

static void
test_serves_filter(void)
{
  g_autoptr(WsyncRegistry) r = wsync_registry_new();
  add_ok(r, "p", "for-vllm", 0, "vllm, vllm-ascend");
  add_ok(r, "p", "for-hf", 0, "hf");
  add_ok(r, "p", "for-all", 0, NULL);

  g_autoptr(GPtrArray) ascend = wsync_registry_lookup(r, WSYNC_ENTRY_CONVERTER, "vllm-ascend");
  g_autofree char *a = names_of(ascend);
  g_assert_cmpstr(a, ==, "for-all for-vllm");
  g_autoptr(GPtrArray) hf = wsync_registry_lookup(r, WSYNC_ENTRY_CONVERTER, "hf");
  g_autofree char *h = names_of(hf);
  g_assert_cmpstr(h, ==, "for-all for-hf");
  /* "vllm" must not match "vllm-ascend" as a prefix the other way round */
  g_autoptr(GPtrArray) other = wsync_registry_lookup(r, WSYNC_ENTRY_CONVERTER, "vll");
  g_autofree char *o = names_of(other);
  g_assert_cmpstr(o, ==, "for-all");
  g_assert_cmpstr(wsync_entry_get_serves(hf->pdata[1]), ==, "hf");
  g_assert_null(wsync_entry_get_serves(hf->pdata[0]));
}

static void
test_duplicate_refused_and_data_destroyed(void)
{
  g_autoptr(WsyncRegistry) r = wsync_registry_new();
  GError *error = NULL;

  destroyed = 0;
  add_ok(r, "first", "same", 0, NULL);
  gboolean ok = wsync_registry_add(r, "second", WSYNC_ENTRY_CONVERTER, "same", 5, NULL,
                                   (GCallback)dummy, g_strdup("x"), count_destroy, &error);
  g_assert_false(ok);
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_PLUGIN);
  assert_message_has(error, "plugin \"second\": converter \"same\" is already registered by "
                            "plugin \"first\"");
  /* ownership passed at the call: the refused data is already freed */
  g_assert_cmpint(destroyed, ==, 1);
  g_clear_error(&error);

  /* the same name in another kind is fine */
  ok = wsync_registry_add(r, "second", WSYNC_ENTRY_HOOK, "same", 0, NULL, (GCallback)dummy,
                          NULL, NULL, &error);
  g_assert_no_error(error);
  g_assert_true(ok);
  g_assert_cmpuint(wsync_registry_size(r), ==, 2);
}

static void
test_invalid_name_refused(void)
{
  g_autoptr(WsyncRegistry) r = wsync_registry_new();
  GError *error = NULL;

  destroyed = 0;
  g_assert_false(wsync_registry_add(r, "p", WSYNC_ENTRY_HOOK, "has space", 0, NULL,
                                    (GCallback)dummy, g_strdup("x"), count_destroy, &error));
  assert_message_has(error, "invalid hook registration \"has space\"");
  g_assert_cmpint(destroyed, ==, 1);
  g_clear_error(&error);
  g_assert_false(wsync_registry_add(r, "p", WSYNC_ENTRY_HOOK, "ok", 0, NULL, NULL,
                                    g_strdup("x"), count_destroy, &error));
  g_assert_cmpint(destroyed, ==, 2);
  g_clear_error(&error);
  g_assert_cmpuint(wsync_registry_size(r), ==, 0);
}

/* "" or an empty item in @serves is refused, not taken for NULL (everything). */
static void
test_empty_serves_refused(void)
{
  static const char *const lists[] = {"", " ", "vllm,,hf", "vllm,", ",vllm"};
  g_autoptr(WsyncRegistry) r = wsync_registry_new();

  destroyed = 0;
  for (guint i = 0; i < G_N_ELEMENTS(lists); i++) {
    GError *error = NULL;
    g_autofree char *want = g_strdup_printf(
        "plugin \"p\": hook \"h\" serves \"%s\", a list with an empty item (NULL serves "
        "everything)", lists[i]);
    g_assert_false(wsync_registry_add(r, "p", WSYNC_ENTRY_HOOK, "h", 0, lists[i],
                                      (GCallback)dummy, g_strdup("x"), count_destroy, &error));
    g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_PLUGIN);
    g_assert_cmpstr(error->message, ==, want);
    g_clear_error(&error);
  }
  g_assert_cmpint(destroyed, ==, (int)G_N_ELEMENTS(lists));
  g_assert_cmpuint(wsync_registry_size(r), ==, 0);
  add_ok(r, "p", "h", 0, " vllm , hf ");
  g_autoptr(GPtrArray) hf = wsync_registry_lookup(r, WSYNC_ENTRY_CONVERTER, "hf");
  g_assert_cmpuint(hf->len, ==, 1);
}

static void
test_remove_plugin_removes_exactly_its_entries(void)
{
  g_autoptr(WsyncRegistry) r = wsync_registry_new();
  GError *error = NULL;

  destroyed = 0;
  add_ok(r, "keep", "k1", 0, NULL);
  add_ok(r, "drop", "d1", 0, NULL);
  add_ok(r, "keep", "k2", 0, NULL);
  add_ok(r, "drop", "d2", 0, NULL);
  g_assert_true(wsync_registry_add(r, "drop", WSYNC_ENTRY_CONFIG_PATCHER, "d3", 0, NULL,
                                   (GCallback)dummy, g_strdup("x"), count_destroy, &error));
  g_assert_cmpuint(wsync_registry_remove_plugin(r, "drop"), ==, 3);
  g_assert_cmpint(destroyed, ==, 3);
  g_autoptr(GPtrArray) left = wsync_registry_lookup(r, WSYNC_ENTRY_CONVERTER, NULL);
  g_autofree char *names = names_of(left);
  g_assert_cmpstr(names, ==, "k1 k2");
  g_assert_cmpuint(wsync_registry_remove_plugin(r, "drop"), ==, 0);
  g_assert_cmpstr(wsync_entry_get_plugin(left->pdata[0]), ==, "keep");
  g_assert_cmpstr(wsync_entry_kind_name(WSYNC_ENTRY_CONFIG_PATCHER), ==, "config-patcher");
}

static void
test_free_destroys_user_data(void)
{
  WsyncRegistry *r = wsync_registry_new();

  destroyed = 0;
  add_ok(r, "p", "a", 0, NULL);
  add_ok(r, "p", "b", 0, NULL);
  wsync_registry_free(r);
  g_assert_cmpint(destroyed, ==, 2);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/registry/order-priority-then-name", test_order_priority_then_name);
  g_test_add_func("/registry/serves-filter", test_serves_filter);
  g_test_add_func("/registry/duplicate-refused", test_duplicate_refused_and_data_destroyed);
  g_test_add_func("/registry/invalid-name-refused", test_invalid_name_refused);
  g_test_add_func("/registry/empty-serves-refused", test_empty_serves_refused);
  g_test_add_func("/registry/remove-plugin", test_remove_plugin_removes_exactly_its_entries);
  g_test_add_func("/registry/free-destroys-user-data", test_free_destroys_user_data);
  return g_test_run();
}
