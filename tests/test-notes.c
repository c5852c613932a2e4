/* Tests of the plan's notes made from the core's internals (linked with the core itself):
 * texts a plan prints that no public call can make for every case. */
#include "config.h"

#include <glib.h>

#include "core/plan-private.h"

/* The note for a runtime switch the source's rank files decided against conf.d names the
 * plugin whose conf.d section sets it, and, for a remapper without a plugin (no conf.d
 * section), says the remapper set it.  (Before: `as conf.d sets it (plugin "none")`.) */
static void
test_switch_note(void)
{
  RuntimeSwitch sw = {.option = (char *)"language-model-only", .on = TRUE, .conf_on = FALSE,
                      .from_files = TRUE};
  g_autofree char *with_plugin = plan_switch_note(&sw, "qwen3_5_moe");
  g_autofree char *without = plan_switch_note(&sw, NULL);

  g_assert_cmpstr(with_plugin, ==,
                  "language-model-only = true, as the source's rank files record (metadata "
                  "wsync.runtime-drop.language-model-only), not false as conf.d sets it "
                  "(plugin \"qwen3_5_moe\"): the plan reads and writes the blocks it switches "
                  "off as the source was written");
  g_assert_cmpstr(without, ==,
                  "language-model-only = true, as the source's rank files record (metadata "
                  "wsync.runtime-drop.language-model-only), not false as the remapper sets "
                  "it: the plan reads and writes the blocks it switches off as the source was "
                  "written");
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/notes/switch-decided-by-files", test_switch_note);
  return g_test_run();
}
