/* wsync: the JSON checks the core's readers share (safetensors headers, checkpoint
 * indexes).
 *
 * Private to libwsync: this header is not installed and the functions are hidden from
 * the library's exported symbols.  json-glib is lenient where the formats are not: it
 * keeps the last of two equal keys without a word, accepts comments and single-quoted
 * strings, ignores whatever follows the first top-level value, and recurses once per
 * nesting level (a 100 MB header can hold enough brackets to overflow the stack).
 * These functions refuse all of that before and while json-glib parses.
 *
 * Messages: every error is a #WSYNC_ERROR_BAD_INPUT error on one line, "FILE: ...",
 * with FILE made printable by wsync_json_printable().  @what names the JSON text
 * inside FILE:
 *
 * - @what = "header" (part of a file): "FILE: header is not valid JSON at 1:5: ...",
 *   "FILE: header nests JSON deeper than 64 levels (at byte N)",
 *   "FILE: header has the key "k" twice",
 *   "FILE: header has a NUL character (\u0000) in a string at byte N of the header";
 * - @what = %NULL (the whole file is JSON): "FILE: not valid JSON at 1:5: ...",
 *   "FILE: JSON nests deeper than 64 levels (at byte N)",
 *   "FILE: the key "k" appears twice",
 *   "FILE: a NUL character (\u0000) in a string at byte N".
 */
#ifndef WSYNC_JSON_CHECK_H
#define WSYNC_JSON_CHECK_H

#include <json-glib/json-glib.h>

G_BEGIN_DECLS

/* The deepest nesting accepted.  The formats need three levels (root, entry, array);
 * json-glib overflows its stack somewhere near 100000. */
#define WSYNC_JSON_MAX_DEPTH 64

/* How wsync_json_append_string() writes what is not plain ASCII. */
typedef enum {
  /* serde_json's escaping, what safetensors' writer does: the two mandatory escapes,
   * the five short control escapes, \u00xx (lowercase) for the other control
   * characters, every other byte as is.  (json-glib's generator differs: it escapes
   * DEL and, in 1.6, leaves 0x1f raw.) */
  WSYNC_JSON_UTF8,
  /* Python's json.dumps with its default ensure_ascii=True, what Transformers writes:
   * the same short escapes, and everything outside printable ASCII as \uXXXX
   * (lowercase; surrogate pairs above U+FFFF).  @s must be valid UTF-8. */
  WSYNC_JSON_ASCII,
} WsyncJsonEscape;

/* Appends @s to @out as a JSON string, quoted and escaped as @escape says, byte for
 * byte what the writer it imitates writes. */
G_GNUC_INTERNAL void wsync_json_append_string(GString *out, WsyncJsonEscape escape,
                                              const char *s);

/**
 * wsync_json_printable:
 * @s: a NUL-terminated string (a name, a path, a key) about to go into a message
 *
 * wsync_printable() (include/wsync/error.h) under the name the readers use: control
 * characters and invalid UTF-8 written as `\xNN`, so that a hostile tensor name or key
 * cannot break a one-line error message.
 *
 * Returns: (transfer full): the copy; free it with g_free().
 */
G_GNUC_INTERNAL char *wsync_json_printable(const char *s);

/* Sets a WSYNC_ERROR_BAD_INPUT error "FILE: tensor "NAME": MESSAGE" (without the tensor
 * part when @tensor is NULL; names made printable) and returns FALSE. */
G_GNUC_INTERNAL gboolean wsync_json_bad_tensor(GError **error, const char *file,
                                               const char *tensor, const char *fmt, ...)
    G_GNUC_PRINTF(4, 5);

/* Sets a WSYNC_ERROR_BAD_INPUT error "FILE: MESSAGE" (the file name made printable)
 * and returns FALSE. */
G_GNUC_INTERNAL gboolean wsync_json_bad_input(GError **error, const char *file, const char *fmt,
                                              ...) G_GNUC_PRINTF(3, 4);

/**
 * wsync_json_check_text:
 * @text: JSON text, not necessarily NUL-terminated
 * @len: its length in bytes
 * @file: the file it comes from, for messages
 * @what: (nullable): what part of @file the text is, e.g. "header"; %NULL when it is
 *   the whole file
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT error
 *
 * The checks to run before json-glib sees @text: no NUL byte (valid UTF-8, but GLib's
 * validators refuse it without saying where), valid UTF-8, no nesting deeper than
 * #WSYNC_JSON_MAX_DEPTH, no `/` or `'` outside strings (json-glib's comments and
 * single-quoted strings, which would also hide brackets from this scan), and no second
 * top-level value, and no escape \u0000 in a string (json-glib would cut the string
 * there, where Python and the safetensors crate keep the whole of it).  It tracks only
 * strings and brackets; parsing is json-glib's job.
 *
 * Returns: %TRUE when @text may be handed to json-glib.
 */
G_GNUC_INTERNAL gboolean wsync_json_check_text(const char *text, gsize len, const char *file,
                                               const char *what, GError **error);

/**
 * wsync_json_parse:
 * @parser: a parser; it holds the result and must outlive its use
 * @text: JSON text, not necessarily NUL-terminated
 * @len: its length in bytes
 * @file: the file it comes from, for messages
 * @what: (nullable): as for wsync_json_check_text()
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT error
 *
 * Runs wsync_json_check_text(), then parses @text with @parser, refusing any object
 * that has the same key twice (found through json-glib's "object-member" signal; only
 * the first duplicate is reported).  The root is json_parser_get_root(@parser): it is
 * %NULL when @text holds only whitespace, and may be of any type; checking that it is
 * an object is the caller's job, in the caller's words.
 *
 * Returns: %TRUE when @text parsed.
 */
G_GNUC_INTERNAL gboolean wsync_json_parse(JsonParser *parser, const char *text, gsize len,
                                          const char *file, const char *what, GError **error);

G_END_DECLS

#endif /* WSYNC_JSON_CHECK_H */
