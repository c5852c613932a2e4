/* wsync: error domain and exit codes.
 *
 * Every fallible function in libwsync follows GLib's GError rules: the error is the
 * last argument, may be NULL, and is set exactly when the function returns FALSE or
 * NULL.  The error code says which kind of failure it was; the command-line tool turns
 * it into its exit status with wsync_error_exit_code().
 */
#ifndef WSYNC_ERROR_H
#define WSYNC_ERROR_H

#include <glib.h>
#include <wsync/api.h>

G_BEGIN_DECLS

/**
 * WSYNC_ERROR:
 *
 * The error domain of libwsync and of its plugins.
 */
#define WSYNC_ERROR (wsync_error_quark())

/**
 * WsyncError:
 * @WSYNC_ERROR_FAILED: anything else (exit 4).
 * @WSYNC_ERROR_USAGE: a bad command line or an impossible request, e.g. a parallel
 *   layout that does not divide (exit 2).
 * @WSYNC_ERROR_CONFIG: a configuration file that does not parse or validate (exit 2).
 * @WSYNC_ERROR_PLUGIN: a plugin that cannot be loaded or registered (exit 2).
 * @WSYNC_ERROR_BAD_INPUT: input data that breaks a rule of its format or contradicts
 *   its configuration (exit 3).
 * @WSYNC_ERROR_IO: the operating system refused a read or a write (exit 4).
 * @WSYNC_ERROR_DIFFERENT: a comparison found a difference (exit 1).
 *
 * Error codes of #WSYNC_ERROR.  New codes may be added at the end.
 */
typedef enum {
  WSYNC_ERROR_FAILED,
  WSYNC_ERROR_USAGE,
  WSYNC_ERROR_CONFIG,
  WSYNC_ERROR_PLUGIN,
  WSYNC_ERROR_BAD_INPUT,
  WSYNC_ERROR_IO,
  WSYNC_ERROR_DIFFERENT,
} WsyncError;

/** Exit statuses of the `wsync` command, documented in `wsync --help` and the README. */
enum {
  WSYNC_EXIT_OK = 0,        /**< success */
  WSYNC_EXIT_DIFFERENT = 1, /**< a check found a difference (verify) */
  WSYNC_EXIT_USAGE = 2,     /**< usage, configuration or plugin error */
  WSYNC_EXIT_BAD_INPUT = 3, /**< malformed or inconsistent input data */
  WSYNC_EXIT_IO = 4,        /**< I/O failure or anything unexpected */
};

/**
 * wsync_error_quark:
 *
 * Returns: the #GQuark of #WSYNC_ERROR.
 */
WSYNC_API GQuark wsync_error_quark(void);

/**
 * wsync_error_exit_code:
 * @error: (nullable): an error, or %NULL for success
 *
 * Maps an error to the exit status of the `wsync` command.  Errors of other domains
 * (GIO, GLib file errors) count as I/O failures.
 *
 * Returns: one of the WSYNC_EXIT_* values.
 */
WSYNC_API int wsync_error_exit_code(const GError *error);

/**
 * wsync_set_io_error:
 * @error: (nullable): return location
 * @errsv: the saved `errno`
 * @path: the file the operation was about
 * @what: what was attempted, e.g. "read" or "create"
 *
 * Sets a #WSYNC_ERROR_IO error "cannot WHAT PATH: strerror(errsv)"; for the @errsv
 * wsync's own readers set when @path was replaced by another file while they opened it
 * (no system call sets it), "PATH: was replaced while it was being opened; nothing was
 * read".
 */
WSYNC_API void wsync_set_io_error(GError **error, int errsv, const char *path, const char *what);

/**
 * wsync_fail:
 * @error: (nullable): return location
 * @code: the #WsyncError class (its exit status)
 * @format: printf() format of the one-line message
 * @...: its arguments
 *
 * Sets a #WSYNC_ERROR error of class @code, so that a function that fails can end with
 * `return wsync_fail(error, WSYNC_ERROR_USAGE, "...", ...);`.
 *
 * Returns: %FALSE, always.
 */
WSYNC_API gboolean wsync_fail(GError **error, WsyncError code, const char *format, ...)
    G_GNUC_PRINTF(3, 4);

/**
 * wsync_fail_at:
 * @error: (nullable): return location
 * @code: the #WsyncError class (its exit status)
 * @path: the file (or tensor, or directory) the message is about
 * @format: printf() format of what is wrong with it
 * @...: its arguments
 *
 * Sets a #WSYNC_ERROR error "PATH: MESSAGE" of class @code, @path made printable
 * (wsync_printable()).
 *
 * Returns: %FALSE, always.
 */
WSYNC_API gboolean wsync_fail_at(GError **error, WsyncError code, const char *path,
                                 const char *format, ...) G_GNUC_PRINTF(4, 5);

/**
 * wsync_printable:
 * @s: a NUL-terminated string about to go into a message (a name, a path, a value
 *   read from a file, a whole message)
 *
 * Copies @s so that it prints as one line and cannot drive a terminal: every C0 control
 * character (below 0x20, newlines included), DEL and every byte that is not part of
 * valid UTF-8 is written as `\xNN`; the C1 controls and the Unicode line and paragraph
 * separators (U+0080 to U+009F, U+2028, U+2029) as `\u{NNNN}`.  Everything else,
 * including other non-ASCII UTF-8, is copied as it is.  The command passes every
 * message it prints through this function; libwsync uses it for names it quotes.
 *
 * Returns: (transfer full): the copy; free it with g_free().
 */
WSYNC_API char *wsync_printable(const char *s);

/**
 * wsync_error_make_printable:
 * @error: (nullable): an error whose message may quote text from a file or a plugin
 *
 * Replaces @error's message by its wsync_printable() copy, so that it is one line
 * without control characters.  libwsync applies it where errors leave its planner,
 * executor and plugin calls (whatever a plugin or a config value put into them).
 */
WSYNC_API void wsync_error_make_printable(GError *error);

G_END_DECLS

#endif /* WSYNC_ERROR_H */
