/* wsync: how the core touches files it does not own: bounded reads of small files,
 * the trust check of plugins and configuration, and tree removal that never follows a
 * symlink.
 *
 * Private to wsync (not installed), but exported from libwsync like dcp.h, so that the
 * command and the test and fuzz programs use the same code.  Every error is one line
 * and names the file (made printable with wsync_printable()).
 */
#ifndef WSYNC_FILES_H
#define WSYNC_FILES_H

#include <sys/stat.h>

#include <json-glib/json-glib.h>

#include <wsync/checkpoint.h>
#include <wsync/error.h>
#include <wsync/plan.h>

G_BEGIN_DECLS

/* Size limits of the small files wsync reads whole.  Published configs are a few KB
 * and the indexes of the largest published checkpoints a few MB. */
#define WSYNC_CONFIG_JSON_MAX (16u << 20)
#define WSYNC_INDEX_JSON_MAX (64u << 20)
#define WSYNC_CONF_FILE_MAX (1u << 20)

/* Opens @path for reading and insists that it is a regular file, so that a FIFO, a
 * device (/dev/zero) or a directory is refused instead of blocking or reading without
 * end, and a socket, which open(2) fails on, in the same words ("PATH: is a socket, not
 * a regular file", not an I/O error).  @nofollow: refuse a symlink as the last component (trusted files).  @code is
 * the error code of a refusal (what it means depends on the file: bad input for a
 * checkpoint's files, a configuration error for conf.d); failures of the system are
 * #WSYNC_ERROR_IO.  Fills @st from fstat().  Returns the descriptor, or -1. */
int wsync_file_open_regular(const char *path, gboolean nofollow, WsyncError code,
                            struct stat *st, GError **error);

/* Reads all of @fd (opened on @path) into a NUL-terminated buffer, refusing with @code
 * a file of more than @max bytes ("FILE: more than N MiB; a WHAT is never that big").
 * Reads at most @max + 1 bytes whatever the file claims. */
gboolean wsync_file_read_bounded(int fd, const char *path, gsize max, const char *what,
                                 WsyncError code, char **text, gsize *len, GError **error);

/* wsync_file_open_regular() + wsync_file_read_bounded(), following symlinks. */
gboolean wsync_file_read_regular(const char *path, gsize max, const char *what, WsyncError code,
                                 char **text, gsize *len, GError **error);

/* Why @path (described by @st, from fstat() of the descriptor that will be used) cannot
 * be trusted, or NULL when it can: the file and every directory above it, up to /, must
 * be owned by root or by the user running wsync and writable by nobody else (no group
 * or world write bit), except that a directory with the sticky bit (/tmp) may be
 * writable by all: nobody else can then rename what root or this user owns in it.
 * The directories are those of realpath(dirname(@path)): the caller opens the file
 * through that resolved directory, so no symlink can swap anything between the check
 * and the open.  The reason is one line naming the path ("PATH: lies in a
 * world-writable directory (DIR, mode 0777)"). */
char *wsync_file_untrusted(const char *path, const struct stat *st);

/* Opens a file that must be trusted, as ld.so and collectd's loaders reason about it:
 * @path's directory is resolved (realpath), the file is lstat()ed in it and opened with
 * O_NOFOLLOW (core/filekind.h: a symlink, a FIFO, a socket or a device is refused
 * without being opened, and a file swapped in between is refused, "PATH: was replaced
 * while it was being opened; nothing was read"), refused unless it is a regular file
 * that passes wsync_file_untrusted().  @what names
 * the kind of file in the symlink refusal ("plugins", "configuration files").  Returns
 * the descriptor (to read or to load through /proc/self/fd), or -1 with *reason set
 * (one line, freed by the caller). */
int wsync_file_open_trusted(const char *path, const char *what, struct stat *st, char **reason);

/* Removes @path and everything below it without ever following a symlink (a symlink is
 * removed, never what it points to) and without crossing into another file system (a
 * mount point inside is left, and so is its parent).  Works on descriptors (openat,
 * unlinkat), so a directory swapped for a symlink during the walk is not followed.
 * Returns FALSE with an I/O error naming the first thing that could not be removed;
 * it removes what it can either way. */
gboolean wsync_remove_tree(const char *path, GError **error);

/* Takes the lock a run holds on its temporary directory @path while it uses it: an
 * exclusive flock(2) on a descriptor of it, which the kernel drops when the process
 * dies, even by kill -9.  Returns the descriptor (closing it releases the lock), or -1
 * when another process holds the lock or the directory is gone (another run's clean-up
 * may remove a directory between its mkdir and its lock). */
int wsync_dir_lock(const char *path);

/* Removes the directory @path when it is a temporary that a dead run left: this user
 * owns it and no process holds its lock (wsync_dir_lock()).  Holds the lock while it
 * removes, so that no new run can take the directory meanwhile.  Anything else
 * (another user's, a live run's, a symlink) is left. */
void wsync_remove_abandoned_temp(const char *path);

/* pwrite(2) until all @len bytes of @data are at @offset of @fd (a write of nothing
 * counts as a full disk).  Errors name @path. */
gboolean wsync_file_pwrite_all(int fd, const char *path, const void *data, gsize len,
                               guint64 offset, GError **error);

/* Creates @path with the @len bytes of @data, flushed to disk, mode 0666 under the
 * umask.  @replace says whether an existing file is replaced (O_TRUNC) or refused
 * (O_EXCL).  On failure a partial file may stay: the caller removes it or the
 * temporary directory it is in.  Errors name @path and what failed. */
gboolean wsync_file_write_synced(const char *path, gboolean replace, const void *data,
                                 gsize len, GError **error);

/* fsync of the directory @path, so that a rename or unlink in it is durable (a file
 * system that cannot sync directories, EINVAL, counts as done).  Errors name @path. */
gboolean wsync_dir_sync(const char *path, GError **error);

/* wsync_config_load() of a config.json the user named (wsync_session_new()'s
 * config_path): a missing one is the I/O error a missing path on the command line is
 * (#WSYNC_ERROR_IO, "cannot open PATH: No such file or directory", exit 4: README "Exit
 * status", core/cli.c cli_config_load()), not "PATH: no such file", the bad input a
 * checkpoint directory without its config.json is. */
JsonNode *wsync_config_load_named(const char *path, GError **error);

/* wsync_run_guarded() and wsync_config_load() are public: <wsync/checkpoint.h>, <wsync/plan.h>. */


/* The same checks on text in memory (@file names it in messages). */
JsonNode *wsync_config_json_parse(const char *text, gsize len, const char *file, GError **error);

G_END_DECLS

#endif /* WSYNC_FILES_H */
