/* wsync: the JSON checks shared by safetensors.c and checkpoint.c (see json-check.h). */
#include <stdarg.h>
#include <string.h>

#include <wsync/error.h>

#include "json-check.h"

char *
wsync_json_printable(const char *s)
{
  return wsync_printable(s);
}

gboolean
wsync_json_bad_input(GError **error, const char *file, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  g_autofree char *msg = g_strdup_vprintf(fmt, ap);
  va_end(ap);
  return wsync_fail_at(error, WSYNC_ERROR_BAD_INPUT, file, "%s", msg);
}

/* "FILE: [WHAT is ]not valid JSON DETAIL" and FALSE; @detail begins with ':' or ' '. */
static gboolean not_json(GError **error, const char *file, const char *what, const char *fmt, ...)
    G_GNUC_PRINTF(4, 5);

static gboolean
not_json(GError **error, const char *file, const char *what, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  g_autofree char *detail = g_strdup_vprintf(fmt, ap);
  va_end(ap);
  if (what)
    return wsync_json_bad_input(error, file, "%s is not valid JSON%s", what, detail);
  return wsync_json_bad_input(error, file, "not valid JSON%s", detail);
}

/* A string that holds the escape \u0000 (U+0000): json-glib keeps its strings
 * NUL-terminated and cuts the string there ("llama\u0000x" reads as "llama"), while
 * the consumers of the file read the whole string: Python's json.loads() decodes it to
 * 'llama\x00x' (CPython Lib/json/decoder.py, py_scanstring: chr() of any \uXXXX), and
 * so does serde_json, which the safetensors crate parses its header with (serde-rs/json
 * src/read.rs parse_escape at 01158f1: "Every u16 outside of the surrogate ranges
 * above is guaranteed to be a legal char").  wsync would act on a model type, an
 * architecture or a tensor name that is not the one the engine sees: refused. */
static gboolean
nul_escape(GError **error, const char *file, const char *what, gsize at)
{
  if (what)
    return wsync_json_bad_input(error, file,
                                "%s has a NUL character (\\u0000) in a string at byte %" G_GSIZE_FORMAT
                                " of the %s",
                                what, at, what);
  return wsync_json_bad_input(error, file,
                              "a NUL character (\\u0000) in a string at byte %" G_GSIZE_FORMAT, at);
}

gboolean
wsync_json_check_text(const char *text, gsize len, const char *file, const char *what,
                      GError **error)
{
  g_return_val_if_fail(text != NULL, FALSE);
  g_return_val_if_fail(file != NULL, FALSE);

  const char *nul = memchr(text, '\0', len);
  if (nul)
    return not_json(error, file, what, ": a NUL byte at byte %td", nul - text);
  const char *bad_utf8;
  if (!g_utf8_validate_len(text, len, &bad_utf8)) {
    if (what)
      return wsync_json_bad_input(error, file, "%s is not valid UTF-8 (bad byte 0x%02x at byte %td of the %s)",
                       what, (guint)(guchar)*bad_utf8, bad_utf8 - text, what);
    return wsync_json_bad_input(error, file, "not valid UTF-8 (bad byte 0x%02x at byte %td)",
                     (guint)(guchar)*bad_utf8, bad_utf8 - text);
  }

  /* seen_value: a whole top-level value lies behind (a container, a string, or a
   * number or literal, whose token ends at whitespace); json-glib 1.6 leaks the first
   * value when a second one follows, so that is refused here whatever the values are */
  guint depth = 0;
  gboolean in_string = FALSE, seen_value = FALSE, in_token = FALSE;
  for (gsize i = 0; i < len; i++) {
    char c = text[i];
    if (in_string) {
      if (c == '\\' && len - i >= 6 && memcmp(text + i + 1, "u0000", 5) == 0)
        return nul_escape(error, file, what, i);
      if (c == '\\')
        i++;
      else if (c == '"') {
        in_string = FALSE;
        seen_value |= depth == 0;
      }
      continue;
    }
    if (depth == 0) {
      gboolean space = c == ' ' || c == '\t' || c == '\n' || c == '\r';
      gboolean structural = strchr("\"{}[],:", c) != NULL;
      if (in_token && (space || structural)) {
        in_token = FALSE;
        seen_value = TRUE;
      }
      if (!space && !in_token && seen_value && strchr("}],:", c) != NULL)
        return not_json(error, file, what,
                        ": unexpected '%c' after the top-level value at byte %" G_GSIZE_FORMAT, c,
                        i);
      if (!space && !in_token && seen_value && c != '/' && c != '\'') /* those: below */
        return not_json(error, file, what, ": a second value begins at byte %" G_GSIZE_FORMAT, i);
      if (!space && !structural && c != '/' && c != '\'')
        in_token = TRUE;
    }
    switch (c) {
    case '"':
      in_string = TRUE;
      break;
    case '{':
    case '[':
      if (++depth > WSYNC_JSON_MAX_DEPTH) {
        if (what)
          return wsync_json_bad_input(error, file,
                           "%s nests JSON deeper than %d levels (at byte %" G_GSIZE_FORMAT ")",
                           what, WSYNC_JSON_MAX_DEPTH, i);
        return wsync_json_bad_input(error, file,
                         "JSON nests deeper than %d levels (at byte %" G_GSIZE_FORMAT ")",
                         WSYNC_JSON_MAX_DEPTH, i);
      }
      break;
    case '}':
    case ']':
      if (depth > 0 && --depth == 0)
        seen_value = TRUE;
      break;
    case '/':
    case '\'':
      return not_json(error, file, what, ": unexpected '%c' at byte %" G_GSIZE_FORMAT, c, i);
    default:
      break;
    }
  }
  return TRUE;
}

/* json-glib keeps the last of two equal keys without a word; its "object-member"
 * signal is the only place that still sees both. */
typedef struct {
  GHashTable *seen; /* "OBJECT-ADDRESS:KEY" */
  char *duplicate;  /* the first repeated key */
} DupCheck;

static void
on_object_member(JsonParser *parser, JsonObject *object, const char *name, gpointer data)
{
  (void)parser;
  DupCheck *dc = data;
  /* json-glib frees the value a duplicate replaces, so an address may come back for a
   * new object: only the first duplicate is trustworthy, and it is enough. */
  if (dc->duplicate)
    return;
  if (!g_hash_table_add(dc->seen, g_strdup_printf("%p:%s", (void *)object, name)))
    dc->duplicate = g_strdup(name);
}

gboolean
wsync_json_parse(JsonParser *parser, const char *text, gsize len, const char *file,
                 const char *what, GError **error)
{
  g_return_val_if_fail(JSON_IS_PARSER(parser), FALSE);
  g_return_val_if_fail(len <= G_MAXSSIZE, FALSE);

  if (!wsync_json_check_text(text, len, file, what, error))
    return FALSE;

  DupCheck dc = {g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL), NULL};
  gulong handler = g_signal_connect(parser, "object-member", G_CALLBACK(on_object_member), &dc);
  g_autoptr(GError) json_error = NULL;
  gboolean ok = json_parser_load_from_data(parser, text, (gssize)len, &json_error);
  g_signal_handler_disconnect(parser, handler);
  g_hash_table_destroy(dc.seen);
  g_autofree char *duplicate = dc.duplicate;

  if (!ok) {
    /* json-glib says "<data>:LINE:COL: Parse error: ..." and may quote the offending
     * text, raw newlines included: keep the message on one line */
    g_autofree char *msg = wsync_json_printable(json_error->message);
    if (g_str_has_prefix(msg, "<data>:"))
      return not_json(error, file, what, " at %s", msg + 7);
    return not_json(error, file, what, ": %s", msg);
  }
  if (duplicate) {
    g_autofree char *key = wsync_json_printable(duplicate);
    if (what)
      return wsync_json_bad_input(error, file, "%s has the key \"%s\" twice", what, key);
    return wsync_json_bad_input(error, file, "the key \"%s\" appears twice", key);
  }
  return TRUE;
}

gboolean
wsync_json_bad_tensor(GError **error, const char *file, const char *tensor, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  g_autofree char *msg = g_strdup_vprintf(fmt, ap);
  va_end(ap);
  g_autofree char *pfile = wsync_json_printable(file);
  if (tensor) {
    g_autofree char *ptensor = wsync_json_printable(tensor);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT, "%s: tensor \"%s\": %s", pfile, ptensor,
                msg);
  } else {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT, "%s: %s", pfile, msg);
  }
  return FALSE;
}

/* The escape both writers share, or NULL. */
static const char *
short_escape(gunichar c)
{
  switch (c) {
  case '"':
    return "\\\"";
  case '\\':
    return "\\\\";
  case '\b':
    return "\\b";
  case '\f':
    return "\\f";
  case '\n':
    return "\\n";
  case '\r':
    return "\\r";
  case '\t':
    return "\\t";
  default:
    return NULL;
  }
}

void
wsync_json_append_string(GString *out, WsyncJsonEscape escape, const char *s)
{
  gboolean ascii = escape == WSYNC_JSON_ASCII;

  g_string_append_c(out, '"');
  for (const char *p = s; *p; p = ascii ? g_utf8_next_char(p) : p + 1) {
    gunichar c = ascii ? g_utf8_get_char(p) : (guchar)*p;
    const char *short_form = short_escape(c);

    if (short_form != NULL)
      g_string_append(out, short_form);
    else if (c < 0x20 || (ascii && c >= 0x7f && c <= 0xffff))
      g_string_append_printf(out, "\\u%04x", c);
    else if (!ascii || c < 0x7f)
      g_string_append_c(out, (char)c);
    else
      g_string_append_printf(out, "\\u%04x\\u%04x", 0xd800 + ((c - 0x10000) >> 10),
                             0xdc00 + ((c - 0x10000) & 0x3ff));
  }
  g_string_append_c(out, '"');
}
