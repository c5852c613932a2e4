/* Progress for a log (core/progress.c in WSYNC_PROGRESS_LINES mode, what `convert`,
 * `verify` and `sync --progress` write when stderr is not a terminal): a line of its own
 * at most every ten seconds, none in a run shorter than that but its last, and the last
 * line not repeated.  Ten seconds cannot pass in a test, so the tests move the start of
 * the interval back instead (WsyncProgress.last is the monotonic time of the last line);
 * what stderr receives is read back from a temporary file. */
#include "config.h"

#include <glib.h>
#include <glib/gstdio.h>
#include <stdio.h>
#include <unistd.h>

#include "../core/progress.h"

#define SECONDS(n) ((gint64)(n) * G_USEC_PER_SEC)

/* Runs @body(@p) with stderr sent to a temporary file; returns what it received. */
static char *
capture_stderr(void (*body)(WsyncProgress *p), WsyncProgress *p)
{
  g_autofree char *path = NULL;
  int fd = g_file_open_tmp("wsync-progress-XXXXXX", &path, NULL);
  int saved = dup(STDERR_FILENO);
  char *text = NULL;

  g_assert_cmpint(fd, >=, 0);
  g_assert_cmpint(saved, >=, 0);
  fflush(stderr);
  g_assert_cmpint(dup2(fd, STDERR_FILENO), ==, STDERR_FILENO);
  body(p);
  fflush(stderr);
  g_assert_cmpint(dup2(saved, STDERR_FILENO), ==, STDERR_FILENO);
  close(saved);
  close(fd);
  g_assert_true(g_file_get_contents(path, &text, NULL, NULL));
  g_unlink(path);
  return text;
}

/* The line the log shows for @done of @total (sizes as GLib writes them). */
static char *
expected_line(guint64 done, guint64 total, const char *verb, guint percent)
{
  g_autofree char *d = g_format_size(done), *t = g_format_size(total);

  return g_strdup_printf("wsync: %s of %s %s (%u%%)\n", d, t, verb, percent);
}

static void
short_run(WsyncProgress *p)
{
  wsync_progress_show(p, 1000, FALSE);
  wsync_progress_show(p, 3000, FALSE);
  wsync_progress_show(p, 4000, TRUE);
}

/* A run shorter than the interval: its last line only. */
static void
test_short_run_shows_its_last_line(void)
{
  WsyncProgress p;
  g_autofree char *got = NULL, *want = expected_line(4000, 4000, "sent", 100);

  wsync_progress_init(&p, WSYNC_PROGRESS_LINES, "sent", 4000);
  got = capture_stderr(short_run, &p);
  g_assert_cmpstr(got, ==, want);
}

static void
long_run(WsyncProgress *p)
{
  wsync_progress_show(p, 1000, FALSE); /* starts the interval, shows nothing */
  p->last -= SECONDS(9);
  wsync_progress_show(p, 2000, FALSE); /* nine seconds in: nothing yet */
  p->last -= SECONDS(1);
  wsync_progress_show(p, 2500, FALSE); /* ten seconds: a line */
  wsync_progress_show(p, 3000, FALSE); /* just after it: nothing */
  p->last -= SECONDS(10);
  wsync_progress_show(p, 4000, FALSE); /* ten more: a line */
  wsync_progress_show(p, 4000, TRUE);  /* the end, which that line said already */
}

/* A run longer than the interval: a line every ten seconds, the last not repeated. */
static void
test_long_run_shows_a_line_every_ten_seconds(void)
{
  WsyncProgress p;
  g_autofree char *got = NULL, *first = expected_line(2500, 4000, "written", 62);
  g_autofree char *second = expected_line(4000, 4000, "written", 100);
  g_autofree char *want = g_strconcat(first, second, NULL);

  wsync_progress_init(&p, WSYNC_PROGRESS_LINES, "written", 4000);
  got = capture_stderr(long_run, &p);
  g_assert_cmpstr(got, ==, want);
}

static void
ends_short(WsyncProgress *p)
{
  wsync_progress_show(p, 1000, FALSE);
  p->last -= SECONDS(10);
  wsync_progress_show(p, 2000, FALSE);
  wsync_progress_show(p, 3000, TRUE); /* an end short of the total (an error): said */
}

/* A last line that differs from the one on show is written, with its own figures. */
static void
test_last_line_after_interval_line(void)
{
  WsyncProgress p;
  g_autofree char *got = NULL, *first = expected_line(2000, 4000, "compared", 50);
  g_autofree char *last = expected_line(3000, 4000, "compared", 75);
  g_autofree char *want = g_strconcat(first, last, NULL);

  wsync_progress_init(&p, WSYNC_PROGRESS_LINES, "compared", 4000);
  got = capture_stderr(ends_short, &p);
  g_assert_cmpstr(got, ==, want);
}

/* Off (-q, or no --progress on a log) and a run of nothing show no line at all. */
static void
test_off_and_empty_show_nothing(void)
{
  WsyncProgress p;
  g_autofree char *off = NULL, *empty = NULL;

  wsync_progress_init(&p, WSYNC_PROGRESS_OFF, "sent", 4000);
  off = capture_stderr(long_run, &p);
  g_assert_cmpstr(off, ==, "");
  wsync_progress_init(&p, WSYNC_PROGRESS_LINES, "sent", 0);
  empty = capture_stderr(long_run, &p);
  g_assert_cmpstr(empty, ==, "");
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/progress-lines/short-run", test_short_run_shows_its_last_line);
  g_test_add_func("/progress-lines/every-ten-seconds", test_long_run_shows_a_line_every_ten_seconds);
  g_test_add_func("/progress-lines/last-after-interval", test_last_line_after_interval_line);
  g_test_add_func("/progress-lines/off-and-empty", test_off_and_empty_show_nothing);
  return g_test_run();
}
