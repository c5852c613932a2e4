/* wsync: what the core's files share about calling a plugin's entries. */
#ifndef WSYNC_ENTRY_PRIVATE_H
#define WSYNC_ENTRY_PRIVATE_H

#include <glib.h>

/* A plugin's callback returned FALSE.  GLib's convention says it then set @error; one that
 * did not (a plugin's bug) would leave the caller nothing to print, or a NULL error to
 * read.  Sets "failed and gave no reason" (a plugin error, exit 2) in that case, for the
 * caller to prefix with the entry's name, and returns TRUE; FALSE when the callback gave
 * its reason (or the caller passed no @error). */
gboolean wsync_entry_explain_silence(GError **error);

#endif /* WSYNC_ENTRY_PRIVATE_H */
