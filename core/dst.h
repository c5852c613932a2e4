/* wsync: the output directory DST (core/dst.c): checks that it may be written and
 * replaced, the temporary sibling the output is written into, the marker, and the swap
 * into place.  Moved out of the executor (core/exec.c) unchanged, so that the
 * distributed sync writes and installs a directory exactly as convert does. */
#ifndef WSYNC_DST_H
#define WSYNC_DST_H

#include <glib.h>

/* DST as given, cleaned: "out/" and "out" are one directory. */
typedef struct {
  char *path;   /* without trailing slashes */
  char *parent; /* its directory */
  char *base;   /* its last component */
} Dst;

/* Frees what @d holds. */
void dst_clear(Dst *d);

/* Cleans @arg into @d ("out/" and "out" are one directory); refuses /, . and ..
 * (#WSYNC_ERROR_USAGE). */
gboolean dst_parse(const char *arg, Dst *d, GError **error);

/* Refuses a DST that is @src, contains it or lies inside it (by device and inode); @src
 * may be NULL (nothing to check). */
gboolean check_not_source(const char *src, const Dst *d, GError **error);

/* Refuses to replace an existing DST that is a symlink, not a directory, or a directory
 * that is neither empty nor wsync's output (unless @force). */
gboolean check_replaceable(const Dst *d, gboolean force, GError **error);

/* Creates and locks (flock, held through *@lock_fd) a fresh ".BASE.wsync-XXXXXX" beside
 * DST, after removing the temporaries of dead runs; returns its path. */
char *make_temp(const Dst *d, int *lock_fd, GError **error);

/* Writes the marker WSYNC_OUTPUT_MARKER into @dir, last, and syncs @dir. */
gboolean write_marker(const char *dir, GError **error);

/* Puts the finished @tmp at DST (renamed, or swapped with the previous DST, which is
 * then removed), checking again that DST may be replaced; syncs the parent.  *@swapped
 * (may be NULL): whether DST is now the new output, TRUE also when only the sync of the
 * parent failed (FALSE returned: "is in place, but its durability is not confirmed"); the
 * previous DST is then kept as "BASE.wsync-previous" beside DST (or "-2", ...; at @tmp
 * when it could not be renamed), and the error says where. */
gboolean install_dir(const char *tmp, const Dst *d, gboolean force, gboolean *swapped,
                     GError **error);

#endif /* WSYNC_DST_H */
