/* wsync sync --ranks MAP (ranks.h): moved out of core/sync-mpi.c, which links MPI, so
 * that tests/fuzz-sync-args.c reaches the parser. */
#include "config.h"

#include <wsync/error.h>

#include "ranks.h"

/* --ranks MAP: entry m (entries separated by /) lists the ranks process m writes, as
 * ranks and ranges a-b separated by commas; an entry may be empty (the process writes
 * nothing).  Every rank exactly once. */
gboolean
parse_ranks(const char *text, guint n, guint world, guint *owner, GError **error)
{
  g_auto(GStrv) entries = g_strsplit(text, "/", -1);

  /* the argument and its pieces are quoted printable (include/wsync/error.h): the
   * refusal is one line whoever prints it */
  if (g_strv_length(entries) != n) {
    g_autofree char *shown = wsync_printable(text);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                "--ranks \"%s\" has %u entr%s, but %u process%s run%s (one entry per process, "
                "separated by /)",
                shown, g_strv_length(entries), g_strv_length(entries) == 1 ? "y" : "ies", n,
                n == 1 ? "" : "es", n == 1 ? "s" : "");
    return FALSE;
  }
  for (guint r = 0; r < world; r++)
    owner[r] = G_MAXUINT;
  for (guint m = 0; m < n; m++) {
    g_auto(GStrv) items = g_strsplit(entries[m], ",", -1);
    for (guint i = 0; entries[m][0] != '\0' && items[i] != NULL; i++) {
      g_auto(GStrv) ends = g_strsplit(items[i], "-", 3);
      guint64 a, b;
      if (items[i][0] == '\0') { /* "0-1," or "0,,2": g_strsplit gives "" no parts */
        g_autofree char *shown = wsync_printable(entries[m]);
        g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                    "--ranks: \"%s\" (process %u) has an empty item (a comma too many?)",
                    shown, m);
        return FALSE;
      }
      if (g_strv_length(ends) > 2 || !g_ascii_string_to_unsigned(ends[0], 10, 0, world - 1, &a,
                                                                 NULL) ||
          !g_ascii_string_to_unsigned(ends[1] ? ends[1] : ends[0], 10, a, world - 1, &b, NULL)) {
        g_autofree char *shown = wsync_printable(items[i]);
        g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                    "--ranks: \"%s\" (process %u) is not a rank or a range a-b of ranks 0 to %u",
                    shown, m, world - 1);
        return FALSE;
      }
      for (guint64 r = a; r <= b; r++) {
        if (owner[r] == m) {
          g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                      "--ranks gives rank %" G_GUINT64_FORMAT " twice to process %u", r, m);
          return FALSE;
        }
        if (owner[r] != G_MAXUINT) {
          g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                      "--ranks gives rank %" G_GUINT64_FORMAT " to processes %u and %u",
                      r, owner[r], m);
          return FALSE;
        }
        owner[r] = m;
      }
    }
  }
  for (guint r = 0; r < world; r++)
    if (owner[r] == G_MAXUINT) {
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                  "--ranks gives rank %u to no process (name every rank from 0 to %u once)", r,
                  world - 1);
      return FALSE;
    }
  return TRUE;
}
