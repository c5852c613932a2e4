/* wsync: the error domain and its exit codes. */
#define _GNU_SOURCE /* O_NOFOLLOW, O_CLOEXEC, lstat() in core/filekind.h */
#include <string.h>

#include <wsync/error.h>

#include "filekind.h"

G_DEFINE_QUARK(wsync-error-quark, wsync_error)

int
wsync_error_exit_code(const GError *error)
{
  if (error == NULL)
    return WSYNC_EXIT_OK;
  if (error->domain != WSYNC_ERROR)
    return WSYNC_EXIT_IO;
  switch ((WsyncError)error->code) {
  case WSYNC_ERROR_DIFFERENT:
    return WSYNC_EXIT_DIFFERENT;
  case WSYNC_ERROR_USAGE:
  case WSYNC_ERROR_CONFIG:
  case WSYNC_ERROR_PLUGIN:
    return WSYNC_EXIT_USAGE;
  case WSYNC_ERROR_BAD_INPUT:
    return WSYNC_EXIT_BAD_INPUT;
  case WSYNC_ERROR_IO:
  case WSYNC_ERROR_FAILED:
  default:
    return WSYNC_EXIT_IO;
  }
}

void
wsync_set_io_error(GError **error, int errsv, const char *path, const char *what)
{
  /* paths can come from files (shard names in an index): keep the message one line */
  g_autofree char *ppath = wsync_printable(path);
  /* an empty argument ('' from an unset shell variable) would vanish from the line */
  const char *named = ppath[0] != '\0' ? ppath : "an empty path (\"\")";
  /* not a failure of the system: the file was swapped while it was judged and opened
   * (core/filekind.h); g_strerror() would say "Unknown error 4096" */
  if (errsv == WSYNC_FILE_REPLACED_ERRNO)
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_IO, "%s: " WSYNC_FILE_REPLACED_WORDS, named);
  else
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_IO, "cannot %s %s: %s", what, named,
                g_strerror(errsv));
}

gboolean
wsync_fail(GError **error, WsyncError code, const char *format, ...)
{
  va_list ap;

  va_start(ap, format);
  g_propagate_error(error, g_error_new_valist(WSYNC_ERROR, code, format, ap));
  va_end(ap);
  return FALSE;
}

gboolean
wsync_fail_at(GError **error, WsyncError code, const char *path, const char *format, ...)
{
  va_list ap;
  g_autofree char *ppath = wsync_printable(path);
  g_autofree char *message = NULL;

  va_start(ap, format);
  message = g_strdup_vprintf(format, ap);
  va_end(ap);
  g_set_error(error, WSYNC_ERROR, code, "%s: %s", ppath, message);
  return FALSE;
}

char *
wsync_printable(const char *s)
{
  GString *out = g_string_sized_new(strlen(s));
  const char *p = s;

  while (*p != '\0') {
    guchar c = (guchar)*p;
    if (c < 0x20 || c == 0x7f) {
      g_string_append_printf(out, "\\x%02x", c);
      p++;
      continue;
    }
    if (c < 0x80) {
      g_string_append_c(out, (char)c);
      p++;
      continue;
    }
    gunichar u = g_utf8_get_char_validated(p, -1);
    if (u == (gunichar)-1 || u == (gunichar)-2) {
      g_string_append_printf(out, "\\x%02x", c); /* not UTF-8: one byte at a time */
      p++;
      continue;
    }
    const char *next = g_utf8_next_char(p);
    if ((u >= 0x80 && u <= 0x9f) || u == 0x2028 || u == 0x2029)
      g_string_append_printf(out, "\\u{%04x}", (guint)u);
    else
      g_string_append_len(out, p, next - p);
    p = next;
  }
  return g_string_free(out, FALSE);
}

void
wsync_error_make_printable(GError *error)
{
  if (error == NULL)
    return;
  char *safe = wsync_printable(error->message);
  g_free(error->message);
  error->message = safe;
}
