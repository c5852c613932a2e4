/* wsync sync --ranks MAP: which process writes which destination rank (core/ranks.c).
 * Private to the core. */
#ifndef WSYNC_RANKS_H
#define WSYNC_RANKS_H

#include <glib.h>

/* Parses @text, the argument of --ranks, for @n processes and @world ranks (at least 1):
 * entry m (entries separated by /) lists the ranks process m writes, as ranks and
 * ranges a-b separated by commas; an entry may be empty.  Every rank exactly once.
 * Fills @owner[rank] (@world entries) with its process; FALSE with a
 * #WSYNC_ERROR_USAGE @error otherwise. */
gboolean parse_ranks(const char *text, guint n, guint world, guint *owner, GError **error);

#endif /* WSYNC_RANKS_H */
