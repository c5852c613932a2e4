/* wsync-mpi: the distributed sync, `mpirun -np N wsync sync SRC DST --target T ...`
 * (`wsync sync` runs this program, which alone links MPI; see core/cmd-sync.c).
 *
 * Process 0 plans the whole conversion from SRC, exactly as `wsync convert` does, and
 * gives each destination rank of the target to a process (contiguous blocks, or
 * --ranks).  It sends each process only what that process writes: the names and headers
 * of its ranks' files and the companion files (config.json, tokenizer...) once per
 * output directory, then the data bytes of its files in buckets of at most --bucket-size
 * (default 256 MiB, at most 1 GiB: an MPI count is an int).  Each bucket is a range of
 * whole rows of one file (core/rankfile.c).  Process 0 sends the parts of a bucket that
 * the plan copies unchanged from an input (a slice of rows, an expert) straight from the
 * input's map, and fills the rest (transposes, casts, strided slices, fills) into one of
 * a small ring of buffers by running the plan's ops limited to those rows, while the
 * buckets before it are in flight; its own ranks it writes itself.  Messages are at most
 * MESSAGE_MAX bytes.  Receivers know the list of their messages from the manifest; each
 * lands in one of a few receive buffers and is written into place with pwrite(2) while
 * the next arrives: on a tmpfs that costs one copy and no page faults, where writing
 * through a map of a new file costs a fault and a page cleared per 4 KiB.
 *
 * Processes on one host that name the same DST share it: the one with the lowest number
 * (the group's leader) checks DST and makes the temporary sibling, the others write
 * their files into it.  The end has two phases: every process's outcome is gathered to
 * process 0 and the verdict broadcast, so that every process prints the same line
 * (naming the process that failed and why) and exits with the same status; only when
 * every process succeeded does each leader write the marker and swap its directory into
 * place, as convert does (core/dst.c); otherwise the leaders remove the temporaries and
 * every existing DST stays as it was.
 *
 * Open MPI has no progress thread, so a process that waits polls: MPI_Test, then a short
 * sleep (a spinning wait would take the CPU that the other processes on the host need
 * to fill and copy).  Process 0 tests its sends between pieces of work, and does its own
 * ranks' work while every ring buffer is in flight.
 */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <locale.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <glib/gstdio.h>
#include <mpi.h>

#include "cli.h"
#include "companion.h"
#include "dst.h"
#include "files.h"
#include "progress.h"
#include "rankfile.h"
#include "ranks.h"

#define MIB (G_GUINT64_CONSTANT(1) << 20)
#define DEFAULT_BUCKET_BYTES (256 * MIB)
#define MAX_BUCKET_BYTES (1024 * MIB) /* Open MPI's counts are int; bugs live above 2 GiB */
#define MIN_BUCKET_BYTES (G_GUINT64_CONSTANT(4) << 10)
#define RING 2          /* process 0's bucket buffers */
#define MESSAGE_MAX (16 * MIB) /* a message's bytes: a receiver's buffer */
#define POSTED 4        /* receives (and their buffers) a receiver keeps posted */
#define WAIT_US 100     /* the sleep between two tests of a request */
#define BLOB_PIECE (1u << 30) /* the largest message of a manifest or broadcast */
#define ERROR_TEXT_MAX 1024 /* of a process's error, in an outcome */
#define DST_KEY_MAX 4096
#define TAG_MANIFEST 1
#define TAG_DATA 2

static const WsyncCommand sync_command = {
    "sync", "SRC DST",
    "Under mpirun: write the target layout of SRC (read by process 0) into DST on every "
    "process's host, each process receiving only the bytes of the ranks it writes.",
    NULL, cli_help_targets};

/* ------------------------------------------------------------------ state */

/* One file this process writes. */
typedef struct {
  char *name;
  GBytes *header;
  guint64 size;
  char *path;
  int fd;
} OutFile;

/* One message to a process: a byte range of one of its files. */
typedef struct {
  guint file;
  guint64 offset;
  guint64 nbytes;
} Message;

/* Process 0: one range of a file of a process (a bucket), and its messages. */
typedef struct {
  const RankFile *file;
  const RankRange *range;
  guint first_part, n_parts; /* in the shipment's parts */
  gboolean staged;           /* some of its bytes are filled into a bucket buffer */
} ShipRange;

/* Process 0: one message, a byte range of a file of the receiver, sent from a run of an
 * input's map that the plan copies unchanged, or from the bucket buffer. */
typedef struct {
  guint file;     /* in the receiver's files */
  guint64 offset; /* in the file */
  guint64 nbytes;
  const guint8 *run; /* the input's bytes, or NULL: from the bucket buffer */
} Part;

/* Process 0: what one process gets: its ranks' files, their ranges (buckets) and the
 * messages of each, in the order they are sent. */
typedef struct {
  GPtrArray *files; /* RankFile*, not owned */
  GPtrArray *cuts;  /* per file, its RankRange* (owned) */
  GArray *ranges;   /* ShipRange */
  GArray *parts;    /* Part */
} Shipment;

typedef struct {
  gint32 status; /* the exit status: 0 when this process is fine */
  gint32 follows; /* the failure only follows from another process's */
  gint32 n_ranks;
  guint64 received; /* bytes received from process 0 */
  guint64 written;  /* tensor data bytes written into this process's files */
  char host[64];
  char dst[512];
  char message[ERROR_TEXT_MAX];
} Outcome;

typedef struct {
  int status;
  int process;  /* the first one that failed */
  int n_failed;
  char *message;
} Verdict;

/* What a process knows of its DST when a signal ends it (abandon_if_signalled()).  A
 * leader swaps only after every process has said it has the verdict (run()), so until
 * a process has said so no DST anywhere can have been swapped; after it, a process that
 * does not lead its DST knows only what its leader tells it. */
typedef enum {
  DST_AS_IT_WAS,   /* not swapped, and no leader will swap it now */
  DST_UNKNOWN,     /* this process said it has the verdict; its leader may have swapped */
  DST_SWAPPED,     /* the leader swapped it in (a non-leader: as its leader told it) */
} DstFate;

typedef struct {
  int me, n;
  /* the command line */
  WsyncCli cli;
  CliLayoutArgs layout;
  char *ranks_arg;
  char *bucket_arg;
  gboolean force;
  gboolean progress_asked; /* --progress */
  char *src_arg, *dst_arg;
  GError *error; /* this process's first failure */
  gboolean follows; /* it follows from another process's failure, which that one reports */
  const volatile sig_atomic_t *interrupted;
  /* the hosts */
  MPI_Comm host;
  gboolean host_has_0;
  MPI_Comm group; /* the processes of this host writing into the same DST */
  gboolean leader;
  Dst dst;
  gboolean dst_parsed;
  char *tmp; /* the temporary directory the group writes into */
  int leader_process; /* the group's leader, by its number in MPI_COMM_WORLD */
  gboolean swapped; /* the leader swapped its DST into place */
  DstFate fate; /* what this process knows of its DST, for abandon_if_signalled() */
  gboolean ended; /* past its last collective call: end_after_report() sees a signal */
  int lock_fd;
  /* the job, from process 0 */
  char *src; /* canonical */
  guint world;
  guint *owner; /* per rank, the process that writes it */
  guint n_mine;
  /* this process's files and messages */
  GPtrArray *files; /* OutFile* */
  GArray *messages; /* Message, in the order they come */
  GPtrArray *companions; /* GVariant "(say)" */
  gboolean files_ok;
  guint64 received, written;
  /* process 0 */
  WsyncPlan *plan;
  guint64 bucket_bytes;
  guint threads;
  gboolean funneled; /* the MPI library lets other threads run beside the MPI calls */
  GPtrArray *rank_files; /* per rank: GPtrArray of RankFile* */
  Shipment *shipments;   /* per process */
  GVariant *companions_v; /* "a(say)" */
  GThreadPool *pool;
  Outcome *outcomes; /* the last exchange's, per process */
} Sync;

static void
fail(Sync *s, GError *error)
{
  if (s->error == NULL)
    s->error = error;
  else
    g_error_free(error);
}

static void
fail_with(Sync *s, WsyncError code, const char *fmt, ...) G_GNUC_PRINTF(3, 4);

static void
fail_with(Sync *s, WsyncError code, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  g_autofree char *message = g_strdup_vprintf(fmt, ap);
  va_end(ap);
  fail(s, g_error_new_literal(WSYNC_ERROR, code, message));
}

static void abandon_if_signalled(void);

/* TRUE when a test hook's value @asked asks for a signal after @phase: "PHASE" (every
 * process) or "N:PHASE" (process N alone). */
static gboolean
signal_asked(Sync *s, const char *asked, const char *phase)
{
  g_autofree char *here = g_strdup_printf("%d:%s", s->me, phase);

  return asked != NULL && (strcmp(asked, phase) == 0 || strcmp(asked, here) == 0);
}

/* For tests: a signal at an exact point of the protocol, which no signal from outside
 * can hit reliably (the end's phases last microseconds).  WSYNC_TEST_SIGNAL_AFTER=PHASE
 * makes every process raise SIGTERM once it has ended PHASE (a phase of -v), N:PHASE
 * process N alone; the signal is caught as mpirun's would be, and the process ends as
 * it would at its next wait (which could otherwise find its request already done).
 * WSYNC_TEST_SIGNAL_UNSEEN_AFTER (same values) raises it and goes on: a signal that
 * landed during a wait after its request was done, which only a later check sees. */
static void
signal_if_asked(Sync *s, const char *phase)
{
  if (signal_asked(s, g_getenv("WSYNC_TEST_SIGNAL_AFTER"), phase)) {
    raise(SIGTERM);
    abandon_if_signalled();
  } else if (signal_asked(s, g_getenv("WSYNC_TEST_SIGNAL_UNSEEN_AFTER"), phase))
    raise(SIGTERM);
}

/* -v: when each phase of each process ended, on stderr. */
static void
say(Sync *s, const char *phase)
{
  static gint64 start;

  if (start == 0)
    start = g_get_monotonic_time();
  if (s->cli.verbose)
    cli_error_line("wsync: sync: process %d: %s after %.3f s", s->me, phase,
                   (double)(g_get_monotonic_time() - start) / 1e6);
  signal_if_asked(s, phase);
}

static gboolean
stopped(Sync *s)
{
  if (s->interrupted != NULL && *s->interrupted) {
    GError *error = NULL;
    companion_interrupted(&error, *s->interrupted);
    fail(s, error);
  }
  return s->error != NULL;
}

/* ------------------------------------------------------------------ waiting */

/* This process's state, for abandon_if_signalled(), which a wait calls. */
static Sync *this_sync;

/* What this process can say of its DST, and no more: every process says the same until
 * some process has the verdict of success, and after it each DST's leader, and the
 * processes it told, say whether it was swapped. */
static char *
fate_text(Sync *s)
{
  switch (s->fate) {
  case DST_AS_IT_WAS:
    return g_strdup("DST is as it was");
  case DST_SWAPPED:
    if (s->group == MPI_COMM_NULL) /* set at the end: every DST was swapped (run()) */
      return g_strdup("this process writes no DST; every DST was already swapped in");
    return g_strdup("DST was already swapped in");
  case DST_UNKNOWN:
  default:
    if (s->group == MPI_COMM_NULL)
      return g_strdup("this process writes no DST and cannot tell whether the others' were "
                      "swapped in");
    return g_strdup_printf("this process cannot tell whether process %d, which leads DST, "
                           "swapped it in",
                           s->leader_process);
  }
}

/* A process killed outright (kill -9, the OOM killer, a crash) never answers: what
 * waits for it waits for ever, until mpirun, seeing a process end before MPI_Finalize,
 * ends the others, SIGTERM first and SIGKILL a second later (Open MPI 4.1,
 * odls_base_sigkill_timeout).  A signal caught while waiting cannot be reported through
 * the end's exchange (the dead process would never join it): the process removes its
 * group's temporary directory when it leads it, says so in one line, and ends by the
 * signal.  Before every process has the verdict, every survivor prints the same line
 * ("DST is as it was"); after it, what it knows of its own DST (fate_text()).  Without
 * this, every survivor was killed silently and every temporary directory left behind. */
static void
abandon_if_signalled(void)
{
  Sync *s = this_sync;
  int sig = s != NULL && s->interrupted != NULL ? *s->interrupted : 0;

  if (sig == 0 || s->ended) /* past the last wait: end_after_report() reports it */
    return;
  if (s->leader && s->tmp != NULL && !s->swapped)
    wsync_remove_tree(s->tmp, NULL);
  const char *name = sigabbrev_np(sig);
  g_autofree char *fate = fate_text(s);
  cli_error_line("wsync: sync: interrupted by SIG%s before every process was done (mpirun "
                 "was interrupted, or a process ended or was killed): %s",
                 name ? name : "NAL", fate);
  cli_end_by_caught_signal();
  _exit(128 + sig);
}

/* Waits for @req: tests it, and sleeps between tests, so that a waiting process leaves
 * its core to those that work (Open MPI would spin). */
static void
wait_request(MPI_Request *req, MPI_Status *status)
{
  int done = 0;

  for (;;) {
    MPI_Test(req, &done, status != NULL ? status : MPI_STATUS_IGNORE);
    if (done)
      return;
    abandon_if_signalled();
    g_usleep(WAIT_US);
  }
}

/* Sends @bytes to @dest: the length, then pieces of at most BLOB_PIECE. */
static void
send_blob(GBytes *bytes, int dest, int tag)
{
  gsize len = 0;
  const guint8 *data = g_bytes_get_data(bytes, &len);
  guint64 length = len;
  MPI_Request req;

  MPI_Isend(&length, 1, MPI_UINT64_T, dest, tag, MPI_COMM_WORLD, &req);
  wait_request(&req, NULL);
  for (guint64 at = 0; at < length; at += BLOB_PIECE) {
    int count = (int)MIN(length - at, BLOB_PIECE);
    MPI_Isend((void *)(data + at), count, MPI_BYTE, dest, tag, MPI_COMM_WORLD, &req);
    wait_request(&req, NULL);
  }
}

static GBytes *
recv_blob(int source, int tag, guint64 *received)
{
  guint64 length = 0;
  MPI_Request req;

  MPI_Irecv(&length, 1, MPI_UINT64_T, source, tag, MPI_COMM_WORLD, &req);
  wait_request(&req, NULL);
  guint8 *data = g_malloc(MAX(length, 1));
  for (guint64 at = 0; at < length; at += BLOB_PIECE) {
    int count = (int)MIN(length - at, BLOB_PIECE);
    MPI_Irecv(data + at, count, MPI_BYTE, source, tag, MPI_COMM_WORLD, &req);
    wait_request(&req, NULL);
  }
  *received += length + sizeof length;
  return g_bytes_new_take(data, length);
}

/* The root's @bytes on every process of @comm. */
static GBytes *
bcast_blob(GBytes *bytes, int root, MPI_Comm comm)
{
  int me;
  guint64 length = 0;
  MPI_Request req;

  MPI_Comm_rank(comm, &me);
  if (me == root)
    length = g_bytes_get_size(bytes);
  MPI_Ibcast(&length, 1, MPI_UINT64_T, root, comm, &req);
  wait_request(&req, NULL);
  guint8 *data = me == root ? (guint8 *)g_bytes_get_data(bytes, NULL) : g_malloc(MAX(length, 1));
  for (guint64 at = 0; at < length; at += BLOB_PIECE) {
    int count = (int)MIN(length - at, BLOB_PIECE);
    MPI_Ibcast(data + at, count, MPI_BYTE, root, comm, &req);
    wait_request(&req, NULL);
  }
  return me == root ? g_bytes_ref(bytes) : g_bytes_new_take(data, length);
}

static GVariant *
variant_of(const char *type, GBytes *bytes)
{
  GVariant *v = g_variant_ref_sink(g_variant_new_from_bytes(G_VARIANT_TYPE(type), bytes, FALSE));

  /* process 0 sent it; a message mangled on the way would be a bug, not input */
  g_assert(g_variant_is_normal_form(v));
  return v;
}

/* ------------------------------------------------------------------ outcomes */

static void
outcome_of(Sync *s, Outcome *o)
{
  memset(o, 0, sizeof *o);
  o->status = s->error != NULL ? wsync_error_exit_code(s->error) : 0;
  o->follows = s->error != NULL && s->follows;
  o->n_ranks = (gint32)s->n_mine;
  o->received = s->received;
  o->written = s->written;
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  g_strlcpy(o->host, name, sizeof o->host);
  if (s->dst_parsed)
    g_strlcpy(o->dst, s->dst.path, sizeof o->dst);
  if (s->error != NULL)
    g_strlcpy(o->message, s->error->message, sizeof o->message);
}

/* Every process's outcome to process 0, which decides; every process learns the
 * verdict: the first process (by number) whose failure is a cause, not a consequence of
 * another's, its status and its message, and how many processes failed of their own. */
static Verdict
exchange(Sync *s)
{
  Outcome mine;
  MPI_Request req;
  g_autoptr(GBytes) sent = NULL;

  outcome_of(s, &mine);
  g_clear_pointer(&s->outcomes, g_free);
  if (s->me == 0)
    s->outcomes = g_new0(Outcome, s->n);
  MPI_Igather(&mine, sizeof mine, MPI_BYTE, s->outcomes, sizeof mine, MPI_BYTE, 0,
              MPI_COMM_WORLD, &req);
  wait_request(&req, NULL);
  if (s->me == 0) {
    int first = -1, n_failed = 0;
    for (int pass = 0; pass < 2 && first < 0; pass++) /* causes, else consequences */
      for (int p = 0; p < s->n; p++)
        if (s->outcomes[p].status != 0 && s->outcomes[p].follows == pass) {
          n_failed++;
          if (first < 0)
            first = p;
        }
    GVariant *v = g_variant_new("(iiis)", first < 0 ? 0 : s->outcomes[first].status, first,
                                n_failed, first < 0 ? "" : s->outcomes[first].message);
    sent = g_variant_get_data_as_bytes(g_variant_ref_sink(v));
    g_variant_unref(v);
  }
  g_autoptr(GBytes) got = bcast_blob(sent, 0, MPI_COMM_WORLD);
  g_autoptr(GVariant) v = variant_of("(iiis)", got);
  Verdict verdict = {0};
  g_variant_get(v, "(iiis)", &verdict.status, &verdict.process, &verdict.n_failed,
                &verdict.message);
  return verdict;
}

/* ------------------------------------------------------------------ the command line */

/* Parses this process's own command line (before MPI_Init, so that --help exits
 * cleanly); a usage error is kept for the first exchange, where every process sees it. */
static void
parse_args(Sync *s, int *argc, char ***argv)
{
  GOptionEntry entries[] = {
      {"target", 't', 0, G_OPTION_ARG_STRING, &s->layout.target,
       "Target layout (the targets of the selected plugins: see below)", "T"},
      {"format", 'f', 0, G_OPTION_ARG_STRING, &s->layout.format,
       "One of the target's file formats (default: its first; see below)", "F"},
      {"tp", 0, 0, G_OPTION_ARG_STRING, &s->layout.tp, "Tensor-parallel size (default 1)", "N"},
      {"ep", 0, 0, G_OPTION_ARG_STRING, &s->layout.ep,
       "Expert-parallel size: 1, or a multiple of --tp (default 1)", "N"},
      CLI_SELECT_ENTRY(s->layout.select),
      CLI_CONFIG_ENTRY(s->layout.config),
      {"ranks", 0, 0, G_OPTION_ARG_STRING, &s->ranks_arg,
       "Which process writes which ranks, one entry per process separated by /, each a "
       "comma list of ranks and ranges, e.g. 0-1/2,3 (default: contiguous blocks)",
       "MAP"},
      {"bucket-size", 0, 0, G_OPTION_ARG_STRING, &s->bucket_arg,
       "Process 0 fills and sends the data in buckets of at most SIZE, 4K to 1G (default "
       "256M), in messages of at most 16M",
       "SIZE"},
      {"threads", 0, 0, G_OPTION_ARG_STRING, &s->layout.threads,
       "Threads that fill buckets on process 0 (default: the number of cores)", "N"},
      {"part-size", 0, 0, G_OPTION_ARG_STRING, &s->layout.part_size,
       "Start a new file before a tensor that would pass SIZE (default 5G)", "SIZE"},
      {"force", 0, 0, G_OPTION_ARG_NONE, &s->force,
       "Replace DST even when it is not wsync's output (it and everything in it are removed)",
       NULL},
      {"progress", 0, 0, G_OPTION_ARG_NONE, &s->progress_asked,
       "Process 0 reports the bytes it has sent and written on stderr every ten seconds, "
       "also where stderr is not a terminal (under mpirun it never is)",
       NULL},
      {NULL}};
  GError *error = NULL;

  if (!cli_parse_checked(&s->cli, &sync_command, entries, argc, argv, &error)) {
    /* "wsync sync: MESSAGE": report() prefixes every line with "wsync: sync: process N" */
    if (g_str_has_prefix(error->message, "wsync sync: "))
      memmove(error->message, error->message + strlen("wsync sync: "),
              strlen(error->message) - strlen("wsync sync: ") + 1);
    fail(s, error);
    return;
  }
  if (*argc != 3) {
    fail_with(s, WSYNC_ERROR_USAGE, "expected SRC and DST (see wsync sync --help)");
    return;
  }
  s->src_arg = g_strdup((*argv)[1]);
  s->dst_arg = g_strdup((*argv)[2]);
  guint64 bucket = DEFAULT_BUCKET_BYTES;
  if (s->bucket_arg != NULL &&
      (!wsync_parse_size("--bucket-size", s->bucket_arg, &bucket, &error) ||
       bucket < MIN_BUCKET_BYTES || bucket > MAX_BUCKET_BYTES)) {
    g_clear_error(&error);
    fail_with(s, WSYNC_ERROR_USAGE,
              "--bucket-size must be from 4K to 1G (an MPI message's count is an int), not "
              "\"%s\"",
              s->bucket_arg);
    return;
  }
  s->bucket_bytes = bucket;
  if (!dst_parse(s->dst_arg, &s->dst, &error)) {
    fail(s, error);
    return;
  }
  s->dst_parsed = TRUE;
  g_autofree char *canonical = g_canonicalize_filename(s->dst.path, NULL);
  if (strlen(canonical) >= DST_KEY_MAX)
    fail_with(s, WSYNC_ERROR_USAGE, "DST is longer than %u bytes", DST_KEY_MAX - 1);
}

/* A command line refused on any process (-q with -v, a bad --bucket-size...) ends the
 * sync at the first exchange, where every process prints the refusal: no process prints
 * its -v lines before it, so that the refusal is all any process says, whichever
 * process was given -v (a process's own -v would otherwise print "started", and
 * process 0's "planned", first). */
static void
quiet_unless_every_command_line_accepted(Sync *s)
{
  int accepted = s->error == NULL, all_accepted = 0;
  MPI_Request req;

  MPI_Iallreduce(&accepted, &all_accepted, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD, &req);
  wait_request(&req, NULL);
  if (!all_accepted)
    s->cli.verbose = FALSE;
}

/* ------------------------------------------------------------------ the same arguments */

/* What only process 0 reads (SRC, the layout and the configuration) as this process was
 * given it: (option, value or nothing).  DST, --force, -q, -v, --json and --progress are
 * each process's own. */
static GVariant *
shared_args(Sync *s)
{
  g_autofree char *conf_dirs = s->cli.conf_dirs ? g_strjoinv(" ", s->cli.conf_dirs) : NULL;
  g_autofree char *plugin_dirs = s->cli.plugin_dirs ? g_strjoinv(" ", s->cli.plugin_dirs) : NULL;
  const struct {
    const char *name, *value;
  } args[] = {{"SRC", s->src_arg},           {"--target", s->layout.target},
              {"--format", s->layout.format}, {"--tp", s->layout.tp},
              {"--ep", s->layout.ep},         {"--select", s->layout.select},
              {"--config", s->layout.config}, {"--ranks", s->ranks_arg},
              {"--bucket-size", s->bucket_arg}, {"--threads", s->layout.threads},
              {"--part-size", s->layout.part_size}, {"--conf-dir", conf_dirs},
              {"--plugin-dir", plugin_dirs}};
  GVariantBuilder b;

  g_variant_builder_init(&b, G_VARIANT_TYPE("a(sms)"));
  for (guint i = 0; i < G_N_ELEMENTS(args); i++)
    g_variant_builder_add(&b, "(sms)", args[i].name, args[i].value);
  return g_variant_ref_sink(g_variant_builder_end(&b));
}

/* "--tp 4", "SRC /a/b", "no --tp" */
static char *
arg_text(const char *name, const char *value)
{
  return value != NULL ? g_strdup_printf("%s %s", name, value) : g_strdup_printf("no %s", name);
}

/* Every process must be given process 0's SRC and options (DST aside): the others never
 * read them, so an MPMD launch whose app contexts disagree (--tp 4 on one, --tp 2 on
 * another) would otherwise write, without a word, a layout one of the command lines did
 * not ask for.  Process 0 broadcasts its own (nothing when its command line is already
 * refused); a process that differs fails with a usage error naming the first option. */
static void
check_same_args(Sync *s)
{
  g_autoptr(GVariant) mine = shared_args(s);
  g_autoptr(GBytes) sent = NULL;

  if (s->me == 0) {
    GVariant *v = s->error == NULL ? g_variant_ref(mine)
                                   : g_variant_ref_sink(g_variant_new_array(
                                         G_VARIANT_TYPE("(sms)"), NULL, 0));
    sent = g_variant_get_data_as_bytes(v);
    g_variant_unref(v);
  }
  g_autoptr(GBytes) got = bcast_blob(sent, 0, MPI_COMM_WORLD);
  if (s->me == 0 || s->error != NULL)
    return;
  g_autoptr(GVariant) theirs = variant_of("a(sms)", got);
  for (gsize i = 0; i < g_variant_n_children(theirs); i++) {
    const char *name, *here, *there;
    g_variant_get_child(mine, i, "(&sm&s)", &name, &here);
    g_variant_get_child(theirs, i, "(&sm&s)", NULL, &there);
    if (g_strcmp0(here, there) != 0) {
      g_autofree char *a = arg_text(name, here), *b = arg_text(name, there);
      fail_with(s, WSYNC_ERROR_USAGE,
                "%s here, %s on process 0: give every process the same SRC and options (only "
                "DST, --force, -q, -v, --json and --progress may differ)",
                a, b);
      break;
    }
  }
}

/* check_same_args(), then whether every process agreed: process 0 plans only then, so
 * that the verdict names the difference, not what process 0's own options make of SRC. */
static gboolean
same_args_everywhere(Sync *s)
{
  int agrees, all_agree = 0;
  MPI_Request req;

  check_same_args(s);
  agrees = s->error == NULL || s->me == 0;
  MPI_Iallreduce(&agrees, &all_agree, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD, &req);
  wait_request(&req, NULL);
  return all_agree;
}

/* ------------------------------------------------------------------ process 0: the plan */

/* "vllm --format kernel --tp 2 --ep 4", for messages. */
static char *
layout_label(WsyncPlan *plan)
{
  return g_strdup_printf("%s%s%s --tp %u --ep %u", plan->target,
                         plan->out_format ? " --format " : "",
                         plan->out_format ? plan->out_format : "", plan->out_tp, plan->out_ep);
}

/* Which process writes which rank: --ranks, or process m ranks m*W/N to (m+1)*W/N - 1. */
static gboolean
map_ranks(Sync *s, GError **error)
{
  s->world = s->plan->outputs->len;
  s->owner = g_new0(guint, s->world);
  if (s->ranks_arg != NULL)
    return parse_ranks(s->ranks_arg, (guint)s->n, s->world, s->owner, error);
  if (s->world % (guint)s->n != 0) {
    g_autofree char *label = layout_label(s->plan);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                "%d processes cannot write the %u rank%s of %s in equal contiguous blocks: run "
                "a number of processes that divides %u, or map ranks to processes with --ranks",
                s->n, s->world, s->world == 1 ? "" : "s", label, s->world);
    return FALSE;
  }
  for (guint r = 0; r < s->world; r++)
    s->owner[r] = r / (s->world / (guint)s->n);
  return TRUE;
}

/* Runs of an input of at least 64 KiB (or 1/64 of a bucket, when buckets are smaller)
 * are sent from the input's map as they are; shorter ones are copied into the bucket
 * with the rest: a message costs more than a copy of a few KiB. */
#define RUN_MIN (G_GUINT64_CONSTANT(64) << 10)

/* The item is sent from the input's map, not filled: the sender and the plan of the
 * messages agree through this. */
static gboolean
item_is_sent_as_run(Sync *s, const RankItem *item, const guint8 **src, guint64 *at,
                    guint64 *nbytes)
{
  return rank_item_run_of_input(item, src, at, nbytes) &&
         *nbytes >= MIN(RUN_MIN, s->bucket_bytes / 64);
}

typedef struct {
  guint64 at, nbytes;
  const guint8 *src;
} Run;

static gint
compare_runs(gconstpointer a, gconstpointer b)
{
  const Run *x = a, *y = b;

  return x->at < y->at ? -1 : x->at > y->at;
}

/* Adds the messages of @nbytes bytes at @offset of a file, from the input's bytes @run or
 * (NULL) the bucket buffer: as many as MESSAGE_MAX takes. */
static void
add_parts(GArray *parts, guint file, guint64 offset, guint64 nbytes, const guint8 *run)
{
  for (guint64 at = 0; at < nbytes; at += MESSAGE_MAX) {
    Part part = {file, offset + at, MIN(nbytes - at, MESSAGE_MAX), run ? run + at : NULL};
    g_array_append_val(parts, part);
  }
}

/* The messages of one range: the runs of inputs it copies unchanged (next ones that
 * continue each other on both sides merged), and the bytes between them from the bucket
 * buffer. */
static void
plan_messages(Sync *s, Shipment *sh, guint file_index, ShipRange *sr)
{
  g_autoptr(GArray) items = g_array_new(FALSE, FALSE, sizeof(RankItem));
  g_autoptr(GArray) runs = g_array_new(FALSE, FALSE, sizeof(Run));
  guint64 at = 0;

  rank_range_items(s->plan, sr->file, sr->range, items);
  for (guint i = 0; i < items->len; i++) {
    Run run;
    if (item_is_sent_as_run(s, &g_array_index(items, RankItem, i), &run.src, &run.at,
                            &run.nbytes))
      g_array_append_val(runs, run);
  }
  g_array_sort(runs, compare_runs);
  sr->first_part = sh->parts->len;
  for (guint i = 0; i <= runs->len; i++) {
    const Run *run = i < runs->len ? &g_array_index(runs, Run, i) : NULL;
    guint64 until = run != NULL ? run->at : sr->range->nbytes;
    if (until > at) { /* bytes of the bucket buffer before the run */
      add_parts(sh->parts, file_index, sr->range->offset + at, until - at, NULL);
      sr->staged = TRUE;
    }
    if (run == NULL)
      break;
    Part *last = sh->parts->len > sr->first_part
                     ? &g_array_index(sh->parts, Part, sh->parts->len - 1)
                     : NULL;
    if (last != NULL && last->run != NULL && last->run + last->nbytes == run->src &&
        last->offset + last->nbytes == sr->range->offset + run->at &&
        last->nbytes + run->nbytes <= MESSAGE_MAX)
      last->nbytes += run->nbytes;
    else
      add_parts(sh->parts, file_index, sr->range->offset + run->at, run->nbytes, run->src);
    at = run->at + run->nbytes;
  }
  sr->n_parts = sh->parts->len - sr->first_part;
}

/* What every process gets: its ranks' files, in rank order, cut into buckets, and the
 * messages of each bucket (process 0 writes its own ranks' messages). */
static gboolean
make_shipments(Sync *s, GError **error)
{
  s->rank_files = g_ptr_array_new_with_free_func((GDestroyNotify)g_ptr_array_unref);
  s->shipments = g_new0(Shipment, s->n);
  for (int p = 0; p < s->n; p++) {
    s->shipments[p].files = g_ptr_array_new();
    s->shipments[p].cuts = g_ptr_array_new_with_free_func((GDestroyNotify)g_ptr_array_unref);
    s->shipments[p].ranges = g_array_new(FALSE, FALSE, sizeof(ShipRange));
    s->shipments[p].parts = g_array_new(FALSE, FALSE, sizeof(Part));
  }
  for (guint r = 0; r < s->world; r++) {
    GPtrArray *files = rank_files_new(s->plan, s->plan->outputs->pdata[r]);
    Shipment *sh = &s->shipments[s->owner[r]];
    g_ptr_array_add(s->rank_files, files);
    for (guint f = 0; f < files->len; f++) {
      guint index = sh->files->len;
      /* process 0 writes its own ranks from one buffer of a message's size */
      guint64 cut_bytes =
          s->owner[r] == 0 ? MIN(s->bucket_bytes, MESSAGE_MAX) : s->bucket_bytes;
      GPtrArray *cut = rank_file_cut(files->pdata[f], cut_bytes);
      g_ptr_array_add(sh->files, files->pdata[f]);
      g_ptr_array_add(sh->cuts, cut);
      for (guint i = 0; i < cut->len; i++) {
        ShipRange sr = {files->pdata[f], cut->pdata[i], 0, 0, FALSE};
        if (sr.range->nbytes > MAX_BUCKET_BYTES) { /* one row of more than 1 GiB */
          const RankPiece *piece = &g_array_index(sr.range->pieces, RankPiece, 0);
          g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                      "tensor \"%s\" of rank %u has rows of %" G_GUINT64_FORMAT " bytes, more "
                      "than one MPI message carries (1 GiB)",
                      piece->tensor->lt->name, r, sr.range->nbytes);
          return FALSE;
        }
        plan_messages(s, sh, index, &sr);
        g_array_append_val(sh->ranges, sr);
      }
    }
  }
  return TRUE;
}

/* Reads every regular file of @dir into "(say)" entries. */
static gboolean
read_dir_files(const char *dir, GVariantBuilder *out, GError **error)
{
  g_autoptr(GDir) d = g_dir_open(dir, 0, error);
  g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
  const char *name;

  if (d == NULL)
    return FALSE;
  while ((name = g_dir_read_name(d)) != NULL)
    g_ptr_array_add(names, g_strdup(name));
  for (guint i = 0; i < names->len; i++) {
    g_autofree char *path = g_build_filename(dir, names->pdata[i], NULL);
    char *data = NULL;
    gsize len = 0;
    g_autoptr(GError) local = NULL;
    if (!g_file_get_contents(path, &data, &len, &local)) {
      /* GLib's own words, which name the file and say why ("Failed to open file “P”:
       * Permission denied"): g_file_get_contents() does not promise to leave errno
       * set, so errno here could be any later call's, or 0 ("Success") */
      g_autofree char *why = wsync_printable(local->message);
      g_set_error_literal(error, WSYNC_ERROR, WSYNC_ERROR_IO, why);
      return FALSE;
    }
    GBytes *bytes = g_bytes_new_take(data, len);
    g_variant_builder_add(out, "(s@ay)", (const char *)names->pdata[i],
                          g_variant_new_from_bytes(G_VARIANT_TYPE_BYTESTRING, bytes, TRUE));
    g_bytes_unref(bytes);
  }
  return TRUE;
}

/* config.json (through the config patchers), the companion files of SRC and, for a
 * target that writes one, the index, as convert writes them: written by the executor's
 * own functions into a scratch directory here, then sent to every output directory. */
static gboolean
make_companions(Sync *s, GError **error)
{
  g_autofree char *scratch = g_dir_make_tmp("wsync-sync-XXXXXX", error);
  GVariantBuilder b;
  gboolean ok;

  if (scratch == NULL)
    return FALSE;
  ok = companion_write_for_plan(s->plan, scratch, s->interrupted, error);
  if (ok && s->plan->out.info->writes_index) {
    g_autoptr(GHashTable) weight_map = g_hash_table_new(g_str_hash, g_str_equal);
    g_autofree char *index = g_build_filename(scratch, WSYNC_INDEX_NAME, NULL);
    for (guint r = 0; r < s->rank_files->len; r++) {
      GPtrArray *files = s->rank_files->pdata[r];
      for (guint f = 0; f < files->len; f++) {
        const RankFile *file = files->pdata[f];
        for (guint t = 0; t < file->tensors->len; t++)
          g_hash_table_insert(weight_map, g_array_index(file->tensors, RankTensor, t).lt->name,
                              file->name);
      }
    }
    ok = wsync_index_write(index, wsync_plan_total_bytes(s->plan), weight_map, error);
  }
  g_variant_builder_init(&b, G_VARIANT_TYPE("a(say)"));
  ok = ok && read_dir_files(scratch, &b, error);
  s->companions_v = g_variant_ref_sink(g_variant_builder_end(&b));
  wsync_remove_tree(scratch, NULL);
  return ok;
}

/* Process 0: the context, the plan, the ranks of each process, their files, buckets
 * and companion files. */
static void
plan_job(Sync *s)
{
  GError *error = NULL;
  WsyncPlanOptions o = {0};
  WsyncContext *ctx = cli_context(&s->cli, &error);

  if (ctx == NULL || !cli_resolve_layout_args(ctx, &s->layout, &o, &error)) {
    fail(s, error);
    return;
  }
  o.rank = -1; /* every rank: a `rank` in conf.d's sync section is convert's */
  /* a thread per core, as convert: the other processes of the host mostly wait */
  s->threads = s->funneled ? o.threads : 1;
  s->plan = wsync_plan_new(ctx, s->src_arg, &o, &error);
  if (s->plan == NULL || !map_ranks(s, &error) || !make_shipments(s, &error) ||
      !make_companions(s, &error)) {
    fail(s, error);
    return;
  }
  s->src = g_canonicalize_filename(s->src_arg, NULL);
}

/* After a successful first exchange: the source's path and the owner of every rank. */
static void
share_job(Sync *s)
{
  g_autoptr(GBytes) sent = NULL;

  if (s->me == 0) {
    GVariant *v = g_variant_new("(s@au)", s->src,
                                g_variant_new_fixed_array(G_VARIANT_TYPE_UINT32, s->owner,
                                                          s->world, sizeof(guint32)));
    g_variant_ref_sink(v);
    sent = g_variant_get_data_as_bytes(v);
    g_variant_unref(v);
  }
  g_autoptr(GBytes) got = bcast_blob(sent, 0, MPI_COMM_WORLD);
  if (s->me != 0) {
    g_autoptr(GVariant) v = variant_of("(sau)", got);
    g_autoptr(GVariant) owners = NULL;
    gsize n = 0;
    g_variant_get(v, "(s@au)", &s->src, &owners);
    const guint32 *o = g_variant_get_fixed_array(owners, &n, sizeof(guint32));
    s->world = (guint)n;
    s->owner = g_new0(guint, n);
    for (gsize r = 0; r < n; r++)
      s->owner[r] = o[r];
  }
  for (guint r = 0; r < s->world; r++)
    s->n_mine += s->owner[r] == (guint)s->me;
}

/* ------------------------------------------------------------------ DST per host */

/* The processes of this host that write into the same DST form a group; its leader (the
 * lowest process) checks DST and makes the temporary directory they all write into. */
static void
make_groups(Sync *s)
{
  int n_local, color = MPI_UNDEFINED, me_local;
  char key[DST_KEY_MAX] = {0};

  MPI_Comm_size(s->host, &n_local);
  MPI_Comm_rank(s->host, &me_local);
  if (s->n_mine > 0) {
    g_autofree char *canonical = g_canonicalize_filename(s->dst.path, NULL);
    g_strlcpy(key, canonical, sizeof key);
  }
  g_autofree char *keys = g_malloc0((gsize)n_local * DST_KEY_MAX);
  MPI_Request req;
  MPI_Iallgather(key, DST_KEY_MAX, MPI_CHAR, keys, DST_KEY_MAX, MPI_CHAR, s->host, &req);
  wait_request(&req, NULL);
  for (int i = 0; s->n_mine > 0 && i < n_local && color == MPI_UNDEFINED; i++)
    if (strcmp(keys + (gsize)i * DST_KEY_MAX, key) == 0)
      color = i;
  MPI_Comm_split(s->host, color, s->me, &s->group);
  if (s->group != MPI_COMM_NULL) {
    int g;
    MPI_Comm_rank(s->group, &g);
    s->leader = g == 0;
  }
}

/* The leader's checks and temporary directory, then its path to the group ("" when they
 * failed). */
static void
make_temp_dir(Sync *s)
{
  g_autoptr(GBytes) sent = NULL;
  GError *error = NULL;

  if (s->group == MPI_COMM_NULL)
    return;
  if (s->leader) {
    s->lock_fd = -1;
    s->leader_process = s->me;
    /* SRC is a path on process 0's host: only there can DST be (or hold) it */
    if (check_not_source(s->host_has_0 ? s->src : NULL, &s->dst, &error) &&
        check_replaceable(&s->dst, s->force, &error))
      s->tmp = make_temp(&s->dst, &s->lock_fd, &error);
    if (error != NULL)
      fail(s, error);
    GVariant *v = g_variant_ref_sink(g_variant_new("(si)", s->tmp ? s->tmp : "", s->me));
    sent = g_variant_get_data_as_bytes(v);
    g_variant_unref(v);
  }
  g_autoptr(GBytes) got = bcast_blob(sent, 0, s->group);
  if (!s->leader) {
    g_autoptr(GVariant) v = variant_of("(si)", got);
    const char *tmp;
    int leader;
    g_variant_get(v, "(&si)", &tmp, &leader);
    s->leader_process = leader;
    if (tmp[0] != '\0')
      s->tmp = g_strdup(tmp);
    else {
      fail_with(s, WSYNC_ERROR_IO, "%s: process %d, which shares this DST, could not prepare it",
                s->dst.path, leader);
      s->follows = TRUE;
    }
  }
}

/* ------------------------------------------------------------------ manifests */

/* Process 0: the manifest of process @p: its files (name, header, size), its messages
 * (file, offset, bytes) in the order they are sent, and the companion files when it
 * leads an output directory. */
static GBytes *
manifest_of(Sync *s, int p, gboolean leads)
{
  const Shipment *sh = &s->shipments[p];
  GVariantBuilder files, messages;

  g_variant_builder_init(&files, G_VARIANT_TYPE("a(sayt)"));
  for (guint f = 0; f < sh->files->len; f++) {
    const RankFile *file = sh->files->pdata[f];
    g_variant_builder_add(&files, "(s@ayt)", file->name,
                          g_variant_new_fixed_array(G_VARIANT_TYPE_BYTE, file->header,
                                                    file->header_len, 1),
                          file->size);
  }
  g_variant_builder_init(&messages, G_VARIANT_TYPE("a(utt)"));
  for (guint i = 0; i < sh->parts->len; i++) {
    const Part *part = &g_array_index(sh->parts, Part, i);
    g_variant_builder_add(&messages, "(utt)", part->file, part->offset, part->nbytes);
  }
  GVariant *v = g_variant_new("(a(sayt)a(utt)@a(say))", &files, &messages,
                              leads ? s->companions_v
                                    : g_variant_new_array(G_VARIANT_TYPE("(say)"), NULL, 0));
  g_variant_ref_sink(v);
  GBytes *bytes = g_variant_get_data_as_bytes(v);
  g_variant_unref(v);
  return bytes;
}

static void
outfile_free(gpointer data)
{
  OutFile *f = data;

  if (f->fd >= 0)
    close(f->fd);
  g_free(f->name);
  g_bytes_unref(f->header);
  g_free(f->path);
  g_free(f);
}

/* A plain file name: nothing process 0 sends may leave the directory. */
static gboolean
plain_name(const char *name)
{
  return name[0] != '\0' && name[0] != '.' && strchr(name, '/') == NULL;
}

/* Reads this process's manifest (checking that every message lies inside its file). */
static void
take_manifest(Sync *s, GBytes *bytes)
{
  g_autoptr(GVariant) v = variant_of("(a(sayt)a(utt)a(say))", bytes);
  g_autoptr(GVariant) files = g_variant_get_child_value(v, 0);
  g_autoptr(GVariant) messages = g_variant_get_child_value(v, 1);

  s->files = g_ptr_array_new_with_free_func(outfile_free);
  s->messages = g_array_new(FALSE, FALSE, sizeof(Message));
  for (gsize i = 0; i < g_variant_n_children(files); i++) {
    OutFile *f = g_new0(OutFile, 1);
    g_autoptr(GVariant) header = NULL;
    g_variant_get_child(files, i, "(s@ayt)", &f->name, &header, &f->size);
    f->header = g_variant_get_data_as_bytes(header);
    f->fd = -1;
    g_ptr_array_add(s->files, f);
    g_assert(plain_name(f->name) && g_bytes_get_size(f->header) <= f->size);
  }
  for (gsize i = 0; i < g_variant_n_children(messages); i++) {
    Message m;
    g_variant_get_child(messages, i, "(utt)", &m.file, &m.offset, &m.nbytes);
    g_assert(m.file < s->files->len && m.nbytes <= MESSAGE_MAX);
    const OutFile *f = s->files->pdata[m.file];
    g_assert(m.offset >= g_bytes_get_size(f->header) && m.offset <= f->size &&
             m.nbytes <= f->size - m.offset);
    g_array_append_val(s->messages, m);
  }
  s->companions = g_ptr_array_new_with_free_func((GDestroyNotify)g_variant_unref);
  g_autoptr(GVariant) companions = g_variant_get_child_value(v, 2);
  for (gsize i = 0; i < g_variant_n_children(companions); i++) {
    GVariant *c = g_variant_get_child_value(companions, i);
    const char *name;
    g_variant_get_child(c, 0, "&s", &name);
    g_assert(plain_name(name));
    g_ptr_array_add(s->companions, c);
  }
}

/* Process 0 sends every other process its manifest; each process reads its own.  The
 * leaders of the output directories get the companion files. */
static void
share_manifests(Sync *s)
{
  int leads = s->leader;
  g_autofree int *leaders = s->me == 0 ? g_new0(int, s->n) : NULL;
  MPI_Request req;

  MPI_Igather(&leads, 1, MPI_INT, leaders, 1, MPI_INT, 0, MPI_COMM_WORLD, &req);
  wait_request(&req, NULL);
  if (s->me == 0) {
    for (int p = 1; p < s->n; p++)
      if (s->shipments[p].files->len > 0) {
        g_autoptr(GBytes) m = manifest_of(s, p, leaders[p]);
        send_blob(m, p, TAG_MANIFEST);
      }
    g_autoptr(GBytes) mine = manifest_of(s, 0, leaders[0]);
    take_manifest(s, mine);
  } else if (s->n_mine > 0) {
    g_autoptr(GBytes) mine = recv_blob(0, TAG_MANIFEST, &s->received);
    take_manifest(s, mine);
  } else {
    s->files = g_ptr_array_new_with_free_func(outfile_free);
    s->messages = g_array_new(FALSE, FALSE, sizeof(Message));
    s->companions = g_ptr_array_new_with_free_func((GDestroyNotify)g_variant_unref);
  }
}

/* ------------------------------------------------------------------ files */

/* What a leader needs on the file system of its temporary directory (st_dev), for the
 * other leaders of its host: two DSTs on one file system share its free space.
 *
 * Why st_dev and not statvfs's f_fsid: st_dev is the mounted file system's own number
 * (its superblock's), unique among the file systems mounted on the host and the same
 * through every mount of it (a bind mount shows the st_dev of what it binds: one tmpfs
 * through two mounts is counted once, tests/test-sync.py check_full_disk_two_dsts).
 * f_fsid groups no better and sometimes worse: btrfs masks the subvolume's id into it
 * (fs/btrfs/super.c, btrfs_statfs(): "to disambiguate subvols"), so subvolumes differ
 * there as in st_dev; ext2/ext4 derive it from the UUID (ext4_statfs(): uuid_to_fsid(
 * es->s_uuid)), which a cloned file system (an LVM snapshot, a copied image) mounted
 * beside its original shares, though each has its own free space; and a file system
 * that sets none reports 0.  (Linux 6.18 here: an overlay mount has an f_fsid and st_dev
 * of its own, not its upper file system's.) */
typedef struct {
  guint64 dev;
  guint64 total;
  guint64 counted; /* 0: not a leader with a temporary directory */
} RoomNeed;

/* The bytes the groups of this host need on the file system @mine names: its own total
 * and that of every other group whose temporary directory is on the same one.  Every
 * process of the host calls it (a collective on s->host). */
static guint64
room_needed_on_host(Sync *s, const RoomNeed *mine)
{
  int n_local;
  MPI_Request req;
  guint64 needed = 0;

  MPI_Comm_size(s->host, &n_local);
  g_autofree RoomNeed *all = g_new0(RoomNeed, n_local);
  MPI_Iallgather(mine, sizeof *mine, MPI_BYTE, all, sizeof *mine, MPI_BYTE, s->host, &req);
  wait_request(&req, NULL);
  for (int i = 0; mine->counted && i < n_local; i++)
    if (all[i].counted && all[i].dev == mine->dev)
      needed += all[i].total;
  return needed;
}

/* Before any data, the leader refuses a file system without room for the files of
 * every process of its group (their sizes, from the manifests), and of the other groups
 * of its host writing on the same file system, as convert refuses one without room for
 * its output (core/exec.c, check_space()): else each process writes until the disk is
 * full, gigabytes in vain.  A file system that does not count its blocks (f_blocks 0)
 * is not checked.  The others of the group learn it and drop their messages. */
static void
check_room(Sync *s)
{
  guint64 mine = 0, total = 0;
  int refused = 0;
  MPI_Request req;
  RoomNeed need = {0, 0, 0};
  struct stat st;

  if (s->group != MPI_COMM_NULL) {
    for (guint i = 0; i < s->files->len; i++)
      mine += ((const OutFile *)s->files->pdata[i])->size;
    MPI_Iallreduce(&mine, &total, 1, MPI_UINT64_T, MPI_SUM, s->group, &req);
    wait_request(&req, NULL);
  }
  if (s->leader && s->tmp != NULL && s->error == NULL && stat(s->tmp, &st) == 0)
    need = (RoomNeed){(guint64)st.st_dev, total, 1};
  guint64 needed = room_needed_on_host(s, &need);
  if (s->group == MPI_COMM_NULL)
    return;
  struct statvfs sv;
  if (need.counted && statvfs(s->tmp, &sv) == 0 && sv.f_blocks != 0 &&
      (guint64)sv.f_bavail * sv.f_frsize < needed) {
    g_autofree char *dst = wsync_printable(s->dst.path);
    g_autofree char *out = g_format_size(total), *all = g_format_size(needed);
    g_autofree char *have = g_format_size((guint64)sv.f_bavail * sv.f_frsize);
    if (needed > total)
      fail_with(s, WSYNC_ERROR_IO,
                "cannot write %s: %s (the output needs %s, %s with the other DSTs this host "
                "writes on the same file system, which has %s free)",
                dst, g_strerror(ENOSPC), out, all, have);
    else
      fail_with(s, WSYNC_ERROR_IO,
                "cannot write %s: %s (the output needs %s, the file system has %s free)", dst,
                g_strerror(ENOSPC), out, have);
    refused = 1;
  }
  MPI_Ibcast(&refused, 1, MPI_INT, 0, s->group, &req); /* the group's 0 is its leader */
  wait_request(&req, NULL);
  if (refused && !s->leader && s->error == NULL) {
    fail_with(s, WSYNC_ERROR_IO, "%s: the process that shares this DST found no room for it",
              s->dst.path);
    s->follows = TRUE;
  }
}

/* Creates this process's files in the group's temporary directory, each with its header
 * and sized; the data is written with pwrite(2).  FALSE (with the error recorded) when
 * one cannot be made: the process then receives its messages and drops them. */
static gboolean
create_files(Sync *s)
{
  GError *error = NULL;

  if (s->tmp == NULL || s->error != NULL)
    return FALSE;
  for (guint i = 0; i < s->files->len; i++) {
    OutFile *f = s->files->pdata[i];
    gsize header_len;
    const guint8 *header = g_bytes_get_data(f->header, &header_len);
    f->path = g_build_filename(s->tmp, f->name, NULL);
    f->fd = open(f->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (f->fd < 0) {
      wsync_set_io_error(&error, errno, f->path, "create");
      fail(s, error);
      return FALSE;
    }
    if (!rank_file_begin(f->fd, f->path, header, header_len, f->size, &error)) {
      fail(s, error);
      return FALSE;
    }
  }
  return TRUE;
}

/* The leader writes the companion files process 0 sent into the directory. */
static void
write_companions(Sync *s)
{
  GError *error = NULL;

  for (guint i = 0; s->tmp != NULL && s->error == NULL && i < s->companions->len; i++) {
    const char *name;
    g_autoptr(GVariant) data = NULL;
    gsize len = 0;
    g_variant_get(s->companions->pdata[i], "(&s@ay)", &name, &data);
    g_autofree char *path = g_build_filename(s->tmp, name, NULL);
    const guint8 *bytes = g_variant_get_fixed_array(data, &len, 1);
    if (!wsync_file_write_synced(path, FALSE, bytes, len, &error)) {
      fail(s, error);
      s->files_ok = FALSE; /* a receiver then drops its messages */
    }
  }
}

/* The tensor whose data holds byte @offset of @f, from the file's header (wsync's own,
 * from process 0), for messages; NULL outside every tensor. */
static char *
tensor_at(const OutFile *f, guint64 offset)
{
  gsize len = 0;
  const guint8 *header = g_bytes_get_data(f->header, &len);
  guint64 json_len = 0;

  if (len < sizeof json_len)
    return NULL;
  memcpy(&json_len, header, sizeof json_len);
  json_len = GUINT64_FROM_LE(json_len);
  if (json_len > len - sizeof json_len)
    return NULL;
  g_autoptr(JsonParser) parser = json_parser_new();
  if (!json_parser_load_from_data(parser, (const char *)header + sizeof json_len,
                                  (gssize)json_len, NULL) ||
      !JSON_NODE_HOLDS_OBJECT(json_parser_get_root(parser)))
    return NULL;
  JsonObject *tensors = json_node_get_object(json_parser_get_root(parser));
  guint64 base = sizeof json_len + json_len;
  g_autoptr(GList) names = json_object_get_members(tensors);
  for (GList *l = names; l != NULL; l = l->next) {
    JsonNode *node = json_object_get_member(tensors, l->data);
    JsonObject *entry = JSON_NODE_HOLDS_OBJECT(node) ? json_node_get_object(node) : NULL;
    JsonArray *range = entry != NULL && json_object_has_member(entry, "data_offsets")
                           ? json_object_get_array_member(entry, "data_offsets")
                           : NULL;
    if (range != NULL && json_array_get_length(range) == 2 &&
        offset >= base + (guint64)json_array_get_int_element(range, 0) &&
        offset < base + (guint64)json_array_get_int_element(range, 1))
      return g_strdup(l->data);
  }
  return NULL;
}

/* The input tensor of the plan whose bytes hold @address, or NULL. */
static const WsyncTensor *
input_at(WsyncPlan *plan, const void *address)
{
  const guint8 *a = address;

  for (guint i = 0; plan->inputs != NULL && i < plan->inputs->len; i++) {
    const WsyncTensor *t = g_array_index(plan->inputs, InputState, i).tensor;
    if (t != NULL && t->data != NULL && a >= t->data && a < t->data + t->nbytes)
      return t;
  }
  for (guint i = 0; plan->chunk_tensors != NULL && i < plan->chunk_tensors->len; i++) {
    const WsyncTensor *t = plan->chunk_tensors->pdata[i];
    if (t->data != NULL && a >= t->data && a < t->data + t->nbytes)
      return t;
  }
  return NULL;
}

/* pwrite(2) of @nbytes at @offset of @f; a failure names the file and the tensor it was
 * writing, as convert's does (core/exec.c), e.g. a full disk: "cannot write
 * .../kernel-rank-1-part-0.safetensors: No space left on device (tensor "...")".  With
 * @plan, @data may be a run of one of its inputs' maps (process 0's own ranks): pwrite(2)
 * from a page the input's file no longer has (it shrank) fails with EFAULT, which names
 * the input, as convert does. */
static gboolean
write_data(const OutFile *f, const guint8 *data, guint64 nbytes, guint64 offset,
           WsyncPlan *plan, GError **error)
{
  while (nbytes > 0) {
    ssize_t k = pwrite(f->fd, data, MIN(nbytes, G_GUINT64_CONSTANT(1) << 30), (off_t)offset);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0) {
      int errsv = k < 0 ? errno : ENOSPC;
      const WsyncTensor *in = errsv == EFAULT && plan != NULL ? input_at(plan, data) : NULL;
      if (in != NULL) {
        g_autofree char *file = wsync_printable(in->file), *name = wsync_printable(in->name);
        g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_IO,
                    "cannot read %s: the file shrank while wsync was reading it (tensor \"%s\")",
                    file, name);
        return FALSE;
      }
      g_autofree char *tensor = tensor_at(f, offset);
      g_autofree char *path = wsync_printable(f->path);
      g_autofree char *name = tensor != NULL ? wsync_printable(tensor) : NULL;
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_IO, "cannot write %s: %s%s%s%s", path,
                  g_strerror(errsv), name ? " (tensor \"" : "", name ? name : "",
                  name ? "\")" : "");
      return FALSE;
    }
    data += k;
    nbytes -= (guint64)k;
    offset += (guint64)k;
  }
  return TRUE;
}

/* Syncs and closes this process's files. */
static void
close_files(Sync *s)
{
  GError *error = NULL;

  for (guint i = 0; i < s->files->len; i++) {
    OutFile *f = s->files->pdata[i];
    if (f->fd >= 0 && s->files_ok && error == NULL && fsync(f->fd) != 0)
      wsync_set_io_error(&error, errno, f->path, "sync");
    if (f->fd >= 0 && close(f->fd) != 0 && s->files_ok && error == NULL)
      wsync_set_io_error(&error, errno, f->path, "close");
    f->fd = -1;
    if (s->files_ok)
      s->written += f->size - g_bytes_get_size(f->header);
  }
  if (error != NULL)
    fail(s, error);
}

/* ------------------------------------------------------------------ process 0: sending */

/* One of process 0's buckets in flight: its buffer (when some of its bytes are filled)
 * and the sends of its messages. */
typedef struct {
  guint8 *data;
  gsize size;
  GArray *reqs; /* MPI_Request */
  gboolean busy;
} Slot;

/* The items that write one bucket, run by the calling thread and the pool's helpers. */
typedef struct {
  GArray *items; /* RankItem */
  Sync *sync;
  guint8 *base;  /* where the range's bytes go */
  gboolean skip_runs; /* the runs sent from the inputs' maps are not copied */
  gint next;     /* atomic */
  gint helpers;  /* helpers not done (atomic) */
  gint failed;   /* atomic */
  GMutex lock;
  GError *error;
} BucketFill;

/* Tests process 0's sends in flight: a bucket whose messages all left frees its buffer. */
static void
progress(Slot *ring)
{
  for (guint i = 0; i < RING; i++)
    if (ring[i].busy) {
      int done = 0;
      MPI_Testall((int)ring[i].reqs->len, (MPI_Request *)(gpointer)ring[i].reqs->data, &done,
                  MPI_STATUSES_IGNORE);
      ring[i].busy = !done;
    }
}

/* Runs the job's items until none is left; the main thread (@ring set) tests the sends
 * in flight between items. */
static void
fill_work(BucketFill *job, Slot *ring)
{
  for (;;) {
    guint i = (guint)g_atomic_int_add(&job->next, 1);
    const RankItem *item;
    const guint8 *src;
    guint64 at, nbytes;
    GError *error = NULL;
    if (i >= job->items->len || g_atomic_int_get(&job->failed))
      return;
    item = &g_array_index(job->items, RankItem, i);
    if (job->skip_runs && item_is_sent_as_run(job->sync, item, &src, &at, &nbytes))
      continue;
    if (!rank_item_run(item, job->base, &error)) {
      g_mutex_lock(&job->lock);
      if (job->error == NULL)
        job->error = error;
      else
        g_error_free(error);
      g_mutex_unlock(&job->lock);
      g_atomic_int_set(&job->failed, 1);
    }
    if (ring != NULL)
      progress(ring);
  }
}

static void
fill_helper(gpointer data, gpointer user_data)
{
  BucketFill *job = data;

  (void)user_data;
  fill_work(job, NULL);
  g_atomic_int_dec_and_test(&job->helpers);
}

/* Fills the bytes of @range of @file at @base with the plan's ops (but the runs that are
 * sent from the inputs' maps, when @skip_runs), on the pool's threads and this one,
 * testing the sends of @ring between items. */
static gboolean
fill_range(Sync *s, const RankFile *file, const RankRange *range, guint8 *base,
           gboolean skip_runs, Slot *ring)
{
  BucketFill job = {.items = g_array_new(FALSE, FALSE, sizeof(RankItem)),
                    .sync = s,
                    .base = base,
                    .skip_runs = skip_runs};
  guint helpers = s->pool != NULL ? s->threads - 1 : 0;

  rank_range_items(s->plan, file, range, job.items);
  helpers = MIN(helpers, job.items->len > 0 ? job.items->len - 1 : 0);
  g_mutex_init(&job.lock);
  job.helpers = (gint)helpers;
  for (guint h = 0; h < helpers; h++)
    g_thread_pool_push(s->pool, &job, NULL);
  fill_work(&job, ring);
  while (g_atomic_int_get(&job.helpers) > 0) {
    progress(ring);
    g_usleep(20);
  }
  if (job.error != NULL)
    fail(s, job.error);
  g_mutex_clear(&job.lock);
  g_array_unref(job.items);
  return !stopped(s);
}

static Slot *
free_slot(Slot *ring)
{
  for (guint i = 0; i < RING; i++)
    if (!ring[i].busy)
      return &ring[i];
  return NULL;
}

/* Sends bucket @sr of process @p from @slot: its bytes that are not runs of an input are
 * filled into the slot's buffer first.  After a failure its messages go empty. */
static void
send_range(Sync *s, int p, const ShipRange *sr, Slot *slot, Slot *ring)
{
  const Shipment *sh = &s->shipments[p];
  gboolean ok = !stopped(s);

  if (ok && sr->staged) {
    if (slot->data == NULL || slot->size < sr->range->nbytes) {
      g_free(slot->data);
      slot->size = MAX(sr->range->nbytes, s->bucket_bytes);
      slot->data = g_malloc(slot->size);
    }
    ok = fill_range(s, sr->file, sr->range, slot->data, TRUE, ring);
  }
  g_array_set_size(slot->reqs, sr->n_parts);
  for (guint i = 0; i < sr->n_parts; i++) {
    const Part *part = &g_array_index(sh->parts, Part, sr->first_part + i);
    const guint8 *from = part->run != NULL ? part->run
                                           : slot->data + (part->offset - sr->range->offset);
    MPI_Isend((void *)from, ok ? (int)part->nbytes : 0, MPI_BYTE, p, TAG_DATA, MPI_COMM_WORLD,
              &g_array_index(slot->reqs, MPI_Request, i));
  }
  slot->busy = TRUE;
}

/* Writes bucket @sr of process 0's own files: the parts that are not runs of an input
 * filled into *@buffer (of *@size bytes, grown to the bucket's: a message's size, or a
 * single row when one is larger), then every part written in place. */
static gboolean
write_own_range(Sync *s, const ShipRange *sr, guint8 **buffer, gsize *size, Slot *ring)
{
  const Shipment *sh = &s->shipments[0];
  GError *error = NULL;

  if (sr->staged) {
    if (*size < sr->range->nbytes) {
      g_free(*buffer);
      *size = sr->range->nbytes;
      *buffer = g_malloc(*size);
    }
    if (!fill_range(s, sr->file, sr->range, *buffer, TRUE, ring))
      return FALSE;
  }
  for (guint i = 0; i < sr->n_parts; i++) {
    const Part *part = &g_array_index(sh->parts, Part, sr->first_part + i);
    const OutFile *out = s->files->pdata[part->file];
    const guint8 *from = part->run != NULL ? part->run
                                           : *buffer + (part->offset - sr->range->offset);
    /* a run is read from the input's map here: a file that shrank is EFAULT */
    if (!write_data(out, from, part->nbytes, part->offset, part->run ? s->plan : NULL,
                    &error)) {
      fail(s, error);
      return FALSE;
    }
  }
  return !stopped(s);
}

/* Process 0's progress: every bucket of every process, its own included. */
static void
start_progress(Sync *s, WsyncProgress *p)
{
  guint64 total = 0;

  for (int q = 0; q < s->n; q++)
    for (guint i = 0; i < s->shipments[q].ranges->len; i++)
      total += g_array_index(s->shipments[q].ranges, ShipRange, i).range->nbytes;
  wsync_progress_init(p, wsync_progress_mode(s->cli.quiet, s->progress_asked), "sent and written",
                      total);
}

/* Process 0's data phase.  Remote buckets go round the processes (bucket k of each,
 * then bucket k + 1), each sent from the inputs' maps and a free ring buffer, filled
 * while the buckets before it are in flight; while every buffer is in flight, process 0
 * writes a bucket of its own ranks into its files.  Once anything failed (here, or a
 * process that could not prepare its DST), every remaining message is sent empty: the
 * receivers complete the protocol at once and the final exchange fails everyone. */
static void
ship(Sync *s, gboolean abort_all)
{
  Slot ring[RING] = {0};
  WsyncProgress shown;
  guint64 done = 0;
  guint max_ranges = 0, round = 0, local = 0;
  int next_p = 1;
  gboolean local_ok = s->files_ok;
  g_autofree guint8 *own_buffer = NULL;
  gsize own_size = 0;

  if (abort_all && s->error == NULL) {
    fail_with(s, WSYNC_ERROR_IO, "a process could not prepare its DST (it says why)");
    s->follows = TRUE;
  }
  for (guint i = 0; i < RING; i++)
    ring[i].reqs = g_array_new(FALSE, FALSE, sizeof(MPI_Request));
  for (int p = 1; p < s->n; p++)
    max_ranges = MAX(max_ranges, s->shipments[p].ranges->len);
  if (s->threads > 1)
    s->pool = g_thread_pool_new(fill_helper, NULL, (gint)(s->threads - 1), FALSE, NULL);
  start_progress(s, &shown);
  for (;;) {
    /* the next remote bucket, if any */
    while (next_p < s->n && round >= s->shipments[next_p].ranges->len)
      next_p++;
    if (next_p >= s->n && round + 1 < max_ranges) {
      round++;
      next_p = 1;
      continue;
    }
    gboolean remote = next_p < s->n;
    gboolean own = !stopped(s) && local_ok && local < s->shipments[0].ranges->len;
    if (!remote && !own)
      break;
    progress(ring);
    Slot *slot = remote ? free_slot(ring) : NULL;
    if (slot != NULL) {
      const ShipRange *sr = &g_array_index(s->shipments[next_p].ranges, ShipRange, round);
      send_range(s, next_p, sr, slot, ring);
      next_p++;
      done += sr->range->nbytes;
      wsync_progress_show(&shown, done, FALSE);
    } else if (own) {
      const ShipRange *sr = &g_array_index(s->shipments[0].ranges, ShipRange, local);
      local_ok = write_own_range(s, sr, &own_buffer, &own_size, ring);
      local++;
      done += sr->range->nbytes;
      wsync_progress_show(&shown, done, FALSE);
    } else {
      abandon_if_signalled(); /* both buffers in flight to a process that may be dead */
      g_usleep(WAIT_US);
    }
  }
  for (guint i = 0; i < RING; i++) {
    for (guint r = 0; ring[i].busy && r < ring[i].reqs->len; r++)
      wait_request(&g_array_index(ring[i].reqs, MPI_Request, r), NULL);
    g_free(ring[i].data);
    g_array_unref(ring[i].reqs);
  }
  if (s->pool != NULL)
    g_thread_pool_free(g_steal_pointer(&s->pool), FALSE, TRUE);
  if (!stopped(s))
    wsync_progress_show(&shown, done, TRUE);
  wsync_progress_end(&shown); /* before an error too */
}

typedef struct {
  Sync *sync;
  gboolean abort_all;
} ShipCall;

static void
ship_call(gpointer data)
{
  ShipCall *call = data;

  ship(call->sync, call->abort_all);
}

/* Process 0's data phase, guarded: Open MPI copies the runs sent straight from the
 * inputs' maps inside its own calls (MPI_Isend, MPI_Test), where a source file that
 * shrank meanwhile (a trainer rewriting its checkpoint in place) faults.  That used to
 * kill process 0 with SIGBUS, Open MPI's backtrace on stderr and the temporary
 * directory left behind.  Now process 0 says which file and tensor, as convert does
 * (core/exec.c), removes the temporary directory it leads and exits 4 without going
 * back into MPI, whose state the fault left unknown; mpirun then ends the others
 * (abandon_if_signalled()).  wsync_run_guarded() wants a function that only reads and
 * writes memory; ship() allocates and calls MPI, but the fault can only come from a
 * read of an input's map, a memcpy (Open MPI's, or the plan's own copies, which guard
 * themselves), never from inside malloc, and nothing after it calls MPI again. */
static void
ship_guarded(Sync *s, gboolean abort_all)
{
  ShipCall call = {s, abort_all};
  const void *address = NULL;

  if (wsync_run_guarded(ship_call, &call, &address))
    return;
  const WsyncTensor *in = input_at(s->plan, address);
  if (s->leader && s->tmp != NULL)
    wsync_remove_tree(s->tmp, NULL);
  if (in != NULL)
    cli_error_line("wsync: sync: process 0: cannot read %s: the file shrank while wsync was "
                   "reading it (tensor \"%s\")",
                   in->file, in->name);
  else
    cli_error_line("wsync: sync: process 0: a memory map failed (SIGBUS at %p): a file "
                   "shrank while wsync was reading it",
                   address);
  _exit(WSYNC_EXIT_IO);
}

/* ------------------------------------------------------------------ receiving */

/* A receiver's data phase: its messages arrive in manifest order, each into one of
 * POSTED buffers, and are written into place while the next ones arrive; once its files
 * cannot take them (they could not be made, or a write failed) they are dropped.  An
 * empty message means process 0 stopped. */
static void
receive(Sync *s)
{
  guint n = s->messages->len, posted = 0, done = 0;
  MPI_Request reqs[POSTED];
  guint8 *buffers[POSTED] = {NULL};
  gsize size = 1;
  gboolean short_message = FALSE;

  for (guint i = 0; i < n; i++)
    size = MAX(size, g_array_index(s->messages, Message, i).nbytes);
  while (done < n) {
    for (; posted < n && posted - done < POSTED; posted++) {
      const Message *m = &g_array_index(s->messages, Message, posted);
      guint8 **into = &buffers[posted % POSTED];
      if (*into == NULL)
        *into = g_malloc(size);
      MPI_Irecv(*into, (int)m->nbytes, MPI_BYTE, 0, TAG_DATA, MPI_COMM_WORLD,
                &reqs[posted % POSTED]);
    }
    const Message *m = &g_array_index(s->messages, Message, done);
    const OutFile *f = s->files->pdata[m->file];
    MPI_Status status;
    int count = 0;
    GError *error = NULL;
    wait_request(&reqs[done % POSTED], &status);
    MPI_Get_count(&status, MPI_BYTE, &count);
    s->received += (guint64)count;
    if ((guint64)count != m->nbytes)
      short_message = TRUE;
    else if (s->files_ok &&
             !write_data(f, buffers[done % POSTED], m->nbytes, m->offset, NULL, &error)) {
      fail(s, error);
      s->files_ok = FALSE;
    }
    done++;
  }
  for (guint i = 0; i < POSTED; i++)
    g_free(buffers[i]);
  stopped(s);
  /* process 0 sends empty messages after a failure that it, or the process that could
   * not prepare its DST, reports: here it is a consequence */
  if (short_message && s->error == NULL) {
    fail_with(s, WSYNC_ERROR_IO, "process 0 stopped sending before the last bucket");
    s->follows = TRUE;
  }
}

/* ------------------------------------------------------------------ the end */

/* After a verdict of success, before any leader swaps: every process says it has the
 * verdict.  Until this process says so, no leader can swap (so "DST is as it was" is
 * true of every DST); after it, a process that does not lead its DST cannot tell until
 * its leader says (tell_group()).  Without this, a process waiting for the verdict, or
 * told it, could say "DST is as it was" after its leader had swapped. */
static void
have_the_verdict(Sync *s)
{
  MPI_Request req;

  if (!s->leader)
    s->fate = DST_UNKNOWN; /* before the barrier: from here on its leader may swap */
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  wait_request(&req, NULL);
}

/* The leader tells the processes of its group whether it swapped their DST in. */
static void
tell_group(Sync *s)
{
  int swapped = s->swapped;
  MPI_Request req;

  if (s->group == MPI_COMM_NULL)
    return;
  MPI_Ibcast(&swapped, 1, MPI_INT, 0, s->group, &req); /* the group's 0 is its leader */
  wait_request(&req, NULL);
  s->fate = swapped ? DST_SWAPPED : DST_AS_IT_WAS;
}

/* After the verdict: the leaders write the marker and swap their directory into place
 * when every process succeeded, and remove it otherwise.  A leader that caught a signal
 * (in the barrier of have_the_verdict(), whose last test found it done, or since, the
 * marker's fsyncs included) does not swap: it abandons as at any wait (its DST as it
 * was, the temporary removed, the same line and exit), since a signalled process must
 * not replace the output.  The check comes after the marker is written, right before
 * the swap: the last moment a signal can stop it, as in convert (core/exec.c,
 * wsync_plan_execute()). */
static void
finish_dst(Sync *s, gboolean success)
{
  GError *error = NULL;

  if (!s->leader || s->tmp == NULL)
    return;
  gboolean installed = success && write_marker(s->tmp, &error);
  if (installed) {
    say(s, "marker written");
    abandon_if_signalled();
    installed = install_dir(s->tmp, &s->dst, s->force, &s->swapped, &error);
  }
  if (s->swapped) /* also when only the parent's sync failed: DST is the new output */
    s->fate = DST_SWAPPED;
  else
    wsync_remove_tree(s->tmp, NULL);
  if (!installed && error != NULL)
    fail(s, error);
  if (s->lock_fd >= 0)
    close(s->lock_fd);
  s->lock_fd = -1;
}

/* "0-1,4" */
static char *
ranks_text(Sync *s, int p)
{
  GString *out = g_string_new(NULL);

  for (guint r = 0; r < s->world; r++) {
    if (s->owner[r] != (guint)p || (r > 0 && s->owner[r - 1] == (guint)p))
      continue;
    guint end = r;
    while (end + 1 < s->world && s->owner[end + 1] == (guint)p)
      end++;
    g_string_append_printf(out, "%s%u", out->len ? "," : "", r);
    if (end > r)
      g_string_append_printf(out, "-%u", end);
  }
  return g_string_free(out, FALSE);
}

/* Process 0 on success: what each process wrote and received. */
static void
print_summary(Sync *s)
{
  guint64 sent = 0;

  if (s->cli.json) {
    g_autoptr(JsonBuilder) b = json_builder_new();
    json_builder_begin_object(b);
    plan_json_add_layout(b, s->plan);
    json_builder_set_member_name(b, "world");
    json_builder_add_int_value(b, s->world);
    json_builder_set_member_name(b, "processes");
    json_builder_begin_array(b);
    for (int p = 0; p < s->n; p++) {
      const Outcome *o = &s->outcomes[p];
      json_builder_begin_object(b);
      json_builder_set_member_name(b, "process");
      json_builder_add_int_value(b, p);
      json_builder_set_member_name(b, "host");
      json_builder_add_string_value(b, o->host);
      json_builder_set_member_name(b, "ranks");
      json_builder_begin_array(b);
      for (guint r = 0; r < s->world; r++)
        if (s->owner[r] == (guint)p)
          json_builder_add_int_value(b, r);
      json_builder_end_array(b);
      json_builder_set_member_name(b, "dst");
      if (o->n_ranks > 0)
        json_builder_add_string_value(b, o->dst);
      else
        json_builder_add_null_value(b);
      json_builder_set_member_name(b, "written");
      json_builder_add_int_value(b, (gint64)o->written);
      json_builder_set_member_name(b, "received");
      json_builder_add_int_value(b, (gint64)o->received);
      json_builder_end_object(b);
    }
    json_builder_end_array(b);
    json_builder_end_object(b);
    g_autoptr(JsonNode) root = json_builder_get_root(b);
    cli_print_json(root);
    return;
  }
  for (int p = 0; p < s->n; p++) {
    const Outcome *o = &s->outcomes[p];
    g_autofree char *ranks = ranks_text(s, p);
    sent += o->received;
    if (o->n_ranks > 0)
      printf("process %d on %s: rank%s %s into %s: %" G_GUINT64_FORMAT " bytes written, %"
             G_GUINT64_FORMAT " received\n",
             p, o->host, o->n_ranks == 1 ? "" : "s", ranks, o->dst, o->written, o->received);
    else
      printf("process %d on %s: no ranks, %" G_GUINT64_FORMAT " received\n", p, o->host,
             o->received);
  }
  g_autofree char *label = layout_label(s->plan);
  printf("synced %u rank%s of %s on %d process%s: %" G_GUINT64_FORMAT " bytes sent\n",
         s->world, s->world == 1 ? "" : "s", label, s->n, s->n == 1 ? "" : "es", sent);
}

/* Every process prints the same line on failure. */
static int
report(Sync *s, const Verdict *v)
{
  if (v->status == 0) {
    if (s->me == 0 && (s->cli.json || !s->cli.quiet)) /* -q --json: the JSON, as convert */
      print_summary(s);
    return 0;
  }
  if (v->n_failed > 1)
    cli_error_line("wsync: sync: process %d: %s (%d of %d processes failed)", v->process,
                   v->message, v->n_failed, s->n);
  else
    cli_error_line("wsync: sync: process %d: %s", v->process, v->message);
  /* The verdict names the first failure only.  A leader whose DST was swapped in but
   * whose parent could not be synced (core/dst.c, install_dir()) says so itself when
   * the verdict is another's: its DST is in place and its previous output kept under a
   * name that only its own error gives, which no line said, so that the user never
   * learned of either (a whole model's copy left, on a RAM disk as often as not). */
  if (s->leader && s->swapped && s->error != NULL && v->process != s->me)
    cli_error_line("wsync: sync: process %d: %s", s->me, s->error->message);
  return v->status;
}

static void
sync_clear(Sync *s)
{
  if (s->files)
    g_ptr_array_unref(s->files);
  if (s->messages)
    g_array_unref(s->messages);
  if (s->companions)
    g_ptr_array_unref(s->companions);
  if (s->shipments != NULL)
    for (int p = 0; p < s->n; p++) {
      g_ptr_array_unref(s->shipments[p].files);
      g_ptr_array_unref(s->shipments[p].cuts);
      g_array_unref(s->shipments[p].ranges);
      g_array_unref(s->shipments[p].parts);
    }
  g_free(s->shipments);
  if (s->rank_files)
    g_ptr_array_unref(s->rank_files);
  if (s->companions_v)
    g_variant_unref(s->companions_v);
  wsync_plan_free(s->plan);
  wsync_context_free(s->cli.ctx);
  g_strfreev(s->cli.conf_dirs);
  g_strfreev(s->cli.plugin_dirs);
  cli_layout_args_clear(&s->layout);
  if (s->dst_parsed)
    dst_clear(&s->dst);
  g_free(s->ranks_arg);
  g_free(s->bucket_arg);
  g_free(s->src_arg);
  g_free(s->dst_arg);
  g_free(s->src);
  g_free(s->tmp);
  g_free(s->owner);
  g_free(s->outcomes);
  g_clear_error(&s->error);
  if (s->group != MPI_COMM_NULL)
    MPI_Comm_free(&s->group);
  MPI_Comm_free(&s->host);
}

/* The phases after a successful start: the output directories, the manifests, the
 * data, the verdict and the swap. */
static Verdict
run(Sync *s)
{
  make_groups(s);
  make_temp_dir(s);
  say(s, "DST prepared");
  share_manifests(s);
  say(s, "manifest shared");
  check_room(s);
  /* process 0 learns whether every process could prepare its DST, with room for its
   * files, before it sends data */
  int ready = s->error == NULL, all_ready = 0;
  MPI_Request req;
  MPI_Iallreduce(&ready, &all_ready, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD, &req);
  wait_request(&req, NULL);
  s->files_ok = s->n_mine > 0 && create_files(s);
  if (s->leader)
    write_companions(s);
  say(s, "files created");
  if (s->me == 0)
    ship_guarded(s, !all_ready);
  else if (s->n_mine > 0)
    receive(s);
  say(s, "data sent and written");
  close_files(s);
  say(s, "files closed");
  Verdict v = exchange(s);
  say(s, "verdict known");
  if (v.status == 0) {
    have_the_verdict(s);
    say(s, "verdict shared");
  }
  finish_dst(s, v.status == 0);
  if (v.status != 0)
    return v;
  tell_group(s);
  say(s, "swap ended");
  /* a swap that failed on one host after others swapped: everyone says so */
  g_free(v.message);
  v = exchange(s);
  if (s->group == MPI_COMM_NULL && v.status == 0) /* every leader swapped, or it failed */
    s->fate = DST_SWAPPED;
  return v;
}

/* TRUE when the verdict @v, which every process printed, is this process's interruption
 * by a signal it saw at a check between its waits (stopped(), the companions' copy):
 * "process N: interrupted by SIGTERM: the temporary directory is removed; DST is as it
 * was" already says what happened. */
static gboolean
verdict_is_my_interruption(Sync *s, const Verdict *v)
{
  GError *interruption = NULL;
  gboolean mine;

  if (v->status == 0 || v->process != s->me || s->interrupted == NULL || !*s->interrupted)
    return FALSE;
  companion_interrupted(&interruption, *s->interrupted);
  mine = strcmp(v->message, interruption->message) == 0;
  g_error_free(interruption);
  return mine;
}

/* How a process ends once it has reported @v (its status: @status) and left MPI, when it
 * has caught a signal that no wait saw (it came after its last collective call, or
 * during one once its request was done; or, on a process that leads no DST, after its
 * last wait).  It used to end by it silently, so that the user saw a process killed by
 * SIGTERM and nothing of its output:
 * - after a verdict of success, it says so in one line, as abandon_if_signalled() does,
 *   with what it knows of its DST (@fate, fate_text() at the end), and ends by the
 *   signal.  Process 0 has gathered every process's last outcome by then, so the line
 *   says "after every process was done".
 * - after its own interruption, which the verdict says, it ends by the signal, as a run
 *   stopped by a signal does.
 * - after any other failure, which every process has reported, it ends with that
 *   failure's status, as it would have: the signal changes nothing.  This is also where
 *   mpirun's SIGTERM lands on the processes still finishing once the first has exited
 *   with that status (Open MPI ends the others of a job whose process failed); a line
 *   from each of them would be noise after the one every process printed.
 * Every value is read once, here, last: cli_end_by_caught_signal() would read the flag
 * again, and a signal landing between the two reads would end the process without its
 * line; a signal after this read is recorded and changes nothing. */
static int
end_after_report(Sync *s, int status, gboolean my_interruption, const char *fate)
{
  int sig = s->interrupted != NULL ? *s->interrupted : 0;

  if (sig == 0 || (status != 0 && !my_interruption))
    return status;
  if (status == 0) {
    const char *name = sigabbrev_np(sig);
    cli_error_line("wsync: sync: interrupted by SIG%s after every process was done: %s",
                   name ? name : "NAL", fate);
  }
  signal(sig, SIG_DFL);
  raise(sig);
  return status;
}

int
main(int argc, char **argv)
{
  Sync s = {.lock_fd = -1, .group = MPI_COMM_NULL};
  int provided, status, is_0, any_0 = 0;

  setlocale(LC_ALL, "");
  argv[0] = "wsync sync";
  parse_args(&s, &argc, &argv);
  /* helper threads fill buckets; only the main thread calls MPI */
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  s.funneled = provided >= MPI_THREAD_FUNNELED;
  MPI_Comm_rank(MPI_COMM_WORLD, &s.me);
  MPI_Comm_size(MPI_COMM_WORLD, &s.n);
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, s.me, MPI_INFO_NULL, &s.host);
  is_0 = s.me == 0;
  MPI_Allreduce(&is_0, &any_0, 1, MPI_INT, MPI_LOR, s.host);
  s.host_has_0 = any_0;
  s.interrupted = cli_catch_signals();
  this_sync = &s;
  quiet_unless_every_command_line_accepted(&s);
  say(&s, "started");
  gboolean agreed = same_args_everywhere(&s);
  if (s.me == 0 && s.error == NULL && agreed)
    plan_job(&s);
  if (s.me == 0)
    say(&s, "planned");
  Verdict v = exchange(&s);
  if (v.status == 0) {
    share_job(&s);
    g_free(v.message);
    v = run(&s);
  }
  s.ended = TRUE;
  say(&s, "done");
  status = report(&s, &v);
  gboolean my_interruption = verdict_is_my_interruption(&s, &v);
  g_autofree char *fate = fate_text(&s);
  g_free(v.message);
  sync_clear(&s);
  MPI_Finalize();
  /* last, after MPI_Finalize: a signal caught there is seen too */
  return end_after_report(&s, status, my_interruption, fate);
}
