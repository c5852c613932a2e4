/* wsync: progress of a long run on stderr ("wsync: 12.3 GB of 60.1 GB written (20%)").
 *
 * On a terminal the line is redrawn in place at most twice a second; elsewhere (a log
 * file, the pipe mpirun forwards a process's stderr through) only when asked for, as a
 * line of its own at most every ten seconds, so that a log stays readable.  Private to
 * wsync (not installed, not exported): the library and the command each build it.
 */
#ifndef WSYNC_PROGRESS_H
#define WSYNC_PROGRESS_H

#include <glib.h>

G_BEGIN_DECLS

typedef enum {
  WSYNC_PROGRESS_OFF,
  WSYNC_PROGRESS_TERMINAL, /* one line redrawn with \r */
  WSYNC_PROGRESS_LINES,    /* a line each time, for a log */
} WsyncProgressMode;

typedef struct {
  WsyncProgressMode mode;
  const char *verb; /* "written", "compared", "sent" */
  guint64 total;
  gint64 last;        /* monotonic µs of the last line, or of the start */
  gboolean any;       /* a line was shown */
  guint64 shown_done; /* what it said */
  gboolean open;      /* a terminal line is open */
} WsyncProgress;

/* Where progress goes: off with -q (@quiet), redrawn when stderr is a terminal, lines
 * when @asked (--progress) and stderr is not a terminal, else off. */
WsyncProgressMode wsync_progress_mode(gboolean quiet, gboolean asked);

/* Starts @p: @total bytes to go through, each "VERB" (a static string). */
void wsync_progress_init(WsyncProgress *p, WsyncProgressMode mode, const char *verb,
                         guint64 total);

/* Shows that @done bytes went through, unless a line was shown too recently; @last
 * (the run is done) always shows, unless the line on show says the same already, and
 * ends the terminal line. */
void wsync_progress_show(WsyncProgress *p, guint64 done, gboolean last);

/* Ends an open terminal line (before an error message). */
void wsync_progress_end(WsyncProgress *p);

G_END_DECLS

#endif
