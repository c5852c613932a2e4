/* Fuzzing the parsers of the command line's words that are not options of a fixed set:
 * `wsync sync --ranks MAP` (parse_ranks(), core/ranks.c) and the output directory DST of
 * convert and sync (dst_parse(), core/dst.c).  An input is two bytes, the number of
 * processes (1 + byte 0 % 16) and of destination ranks (1 + byte 1), then the argument,
 * up to its first NUL as a command line gives it, which goes to both parsers.  A refusal
 * must be one clean line of a usage error; an accepted MAP gives every rank a process
 * that runs, an accepted DST names a directory by a last component that is neither "",
 * "." nor "..".  See fuzz-driver.h. */
#include "../core/dst.h"
#include "../core/ranks.h"

#define FUZZ_NAME "sync-args"
#define FUZZ_CASES
#include "fuzz-driver.h"

static void
fuzz_setup(void)
{
}

static void
fuzz_teardown(void)
{
}

static void
add_seed(GPtrArray *seeds, guint n, guint world, const char *text)
{
  GByteArray *b = g_byte_array_new();
  guint8 head[2] = {(guint8)(n - 1), (guint8)(world - 1)};
  g_byte_array_append(b, head, 2);
  g_byte_array_append(b, (const guint8 *)text, (guint)strlen(text));
  g_ptr_array_add(seeds, g_byte_array_free_to_bytes(b));
}

static void
fuzz_seeds(GPtrArray *seeds)
{
  /* the maps of tests/test-sync.py, and DSTs as people write them */
  add_seed(seeds, 2, 4, "1,3/0,2");
  add_seed(seeds, 3, 4, "/0-1/2-3");
  add_seed(seeds, 2, 1, "/0");
  add_seed(seeds, 1, 8, "0-7");
  add_seed(seeds, 4, 16, "0-3/4,5,6-7/8-15/");
  add_seed(seeds, 1, 1, "0");
}

static const char *const *
fuzz_dictionary(void)
{
  static const char *const tokens[] = {"/", ",", "-", "0", "1", "7", "15", "255", "256",
                                       "4294967295", "4294967296", "18446744073709551616",
                                       "-1", "+1", " 1", "0x1", "..", ".", "//", "/.", "/..",
                                       "\n", "\x1b", "\x7f", "\xff", NULL};
  return tokens;
}

/* Runs both parsers on @text; the message of the first refusal (checked), or NULL. */
static char *
parse(guint n, guint world, const char *text)
{
  static const WsyncError allowed[] = {WSYNC_ERROR_USAGE};
  g_autofree guint *owner = g_new(guint, world);
  GError *error = NULL;
  char *message = NULL;

  if (parse_ranks(text, n, world, owner, &error)) {
    for (guint r = 0; r < world; r++)
      if (owner[r] >= n)
        g_error("--ranks \"%s\": rank %u given to process %u of %u", g_strescape(text, NULL), r,
                owner[r], n);
  } else {
    fuzz_check_refusal(error, allowed, G_N_ELEMENTS(allowed));
    message = g_strdup(error->message);
    g_clear_error(&error);
  }

  Dst d = {0};
  if (dst_parse(text, &d, &error)) {
    if (d.base[0] == '\0' || strchr(d.base, '/') != NULL || strcmp(d.base, ".") == 0 ||
        strcmp(d.base, "..") == 0 || (strlen(d.path) > 1 && g_str_has_suffix(d.path, "/")))
      g_error("DST \"%s\": accepted as path \"%s\", base \"%s\"", g_strescape(text, NULL),
              g_strescape(d.path, NULL), g_strescape(d.base, NULL));
  } else {
    fuzz_check_refusal(error, allowed, G_N_ELEMENTS(allowed));
    if (message == NULL)
      message = g_strdup(error->message);
    g_clear_error(&error);
  }
  dst_clear(&d);
  return message;
}

static gboolean
fuzz_one(const guint8 *data, gsize len)
{
  if (len < 2)
    return FALSE;
  g_autofree char *text = g_strndup((const char *)data + 2, len - 2); /* to the first NUL */
  g_autofree char *message = parse(1 + data[0] % 16, 1u + data[1], text);
  return message == NULL;
}

/* The refusal of @text (by either parser), which must hold @fragment. */
static void
assert_refused(guint n, guint world, const char *text, const char *fragment)
{
  g_autofree char *message = parse(n, world, text);
  if (message == NULL)
    g_error("accepted: %s", g_strescape(text, NULL));
  if (strstr(message, fragment) == NULL)
    g_error("refused with \"%s\", not with \"%s\"", message, fragment);
}

/* What fuzzing found: the old parse_ranks() put the argument raw into its messages. */
static void
fuzz_cases(void)
{
  assert_refused(2, 2, "0\n1", "--ranks \"0\\x0a1\" has 1 entry, but 2 processes run");
  assert_refused(1, 2, "0,\x1b[2J",
                 "--ranks: \"\\x1b[2J\" (process 0) is not a rank or a range a-b of ranks 0 to 1");
  assert_refused(1, 3, "0,,\x7f", "--ranks: \"0,,\\x7f\" (process 0) has an empty item");
  /* and what was right already */
  assert_refused(2, 2, "0/0-1", "--ranks gives rank 0 to processes 0 and 1");
  assert_refused(1, 2, "0", "--ranks gives rank 1 to no process");
  assert_refused(1, 1, "", "--ranks \"\" has 0 entries, but 1 process runs");
  assert_refused(1, 1, "0/", "has 2 entries, but 1 process runs");
}
