/* wsync: progress of a long run on stderr (progress.h). */
#include "config.h"

#include <stdio.h>
#include <unistd.h>

#include "progress.h"

#define TERMINAL_INTERVAL_US 500000
#define LINES_INTERVAL_US 10000000

WsyncProgressMode
wsync_progress_mode(gboolean quiet, gboolean asked)
{
  if (quiet)
    return WSYNC_PROGRESS_OFF;
  if (isatty(STDERR_FILENO))
    return WSYNC_PROGRESS_TERMINAL;
  return asked ? WSYNC_PROGRESS_LINES : WSYNC_PROGRESS_OFF;
}

void
wsync_progress_init(WsyncProgress *p, WsyncProgressMode mode, const char *verb, guint64 total)
{
  *p = (WsyncProgress){.mode = mode, .verb = verb, .total = total};
}

static void
print_line(WsyncProgress *p, guint64 done, gboolean last)
{
  g_autofree char *d = g_format_size(done), *t = g_format_size(p->total);
  guint percent = (guint)(100 * done / p->total);

  if (p->mode == WSYNC_PROGRESS_TERMINAL)
    fprintf(stderr, "\rwsync: %s of %s %s (%u%%)   %s", d, t, p->verb, percent, last ? "\n" : "");
  else
    fprintf(stderr, "wsync: %s of %s %s (%u%%)\n", d, t, p->verb, percent);
  fflush(stderr);
  p->any = TRUE;
  p->shown_done = done;
  p->open = p->mode == WSYNC_PROGRESS_TERMINAL && !last;
}

void
wsync_progress_show(WsyncProgress *p, guint64 done, gboolean last)
{
  gint64 now = g_get_monotonic_time();

  if (p->mode == WSYNC_PROGRESS_OFF || p->total == 0)
    return;
  if (last) {
    if (p->any && p->shown_done == done) /* the line on show says it already */
      wsync_progress_end(p);
    else
      print_line(p, done, TRUE);
    return;
  }
  if (p->last == 0 && p->mode == WSYNC_PROGRESS_LINES) {
    p->last = now; /* a log gets its first line after an interval: a short run, only its last */
    return;
  }
  if (p->last != 0 &&
      now - p->last < (p->mode == WSYNC_PROGRESS_LINES ? LINES_INTERVAL_US : TERMINAL_INTERVAL_US))
    return;
  p->last = now;
  print_line(p, done, FALSE);
}

void
wsync_progress_end(WsyncProgress *p)
{
  if (p->open)
    fputc('\n', stderr);
  p->open = FALSE;
}
