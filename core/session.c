/* wsync: a session (<wsync/session.h>): plan once, then run the plan tensor by tensor
 * as a trainer pushes them, every step.
 *
 * The trainer's tensors are described as global tensors made of chunks, exactly as a
 * sharded checkpoint's (a whole tensor is one chunk covering it), so the planner binds
 * them as it binds DCP chunks (plan_bind_chunked()), with no data yet.  Once planned,
 * each described chunk is an input of the plan; every copy op reading it is a target of
 * the push of that chunk: a push runs those ops (core/copy.c's kernels) with the pushed
 * pointer as the source and the destination rank file (directory sink) or bucket (caller
 * sink) as the destination, split into work items of at most 8 MiB shared by the
 * pushing thread and the session's helper threads.  Fills are written once per file (directory)
 * or once per bucket.
 *
 * The directory sink creates the rank files with the headers the safetensors writer
 * makes (so they are the files `wsync convert` writes) at the first begin and keeps them
 * mapped; later steps write into the same pages.  The commit record is the last thing
 * written at commit and the first thing removed at begin.
 *
 * The record's checksum of a file is made of the XXH3-64 of each 64 KiB block of it
 * (wsync_session_checksum()), computed while the block's bytes are still in cache: each
 * block counts the bytes pushes write into it (known from the plan); a work item copies
 * its rows in slices of at most SLICE_BYTES, then subtracts what each slice wrote from
 * the blocks it wrote into (copy_op_runs() says where), and the item that brings a
 * block's count to zero hashes the block.  Blocks no push writes (the header, fills)
 * never change: they are hashed once, when the file is made.  Commit only hashes the
 * list of block hashes.
 */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib/gstdio.h>
#include <xxhash.h>
#ifdef HAVE_XXH3_64BITS_DISPATCH
/* libxxhash's runtime choice of AVX2/AVX-512 code (the same hashes as XXH3_64bits) */
#include <xxh_x86dispatch.h>
#endif

#include <wsync/session.h>

#include "companion.h"
#include "copy.h"
#include "plan-private.h"
#include "files.h"
#include "rankfile.h"

/* The most bytes one work item copies: big tensors keep every thread busy. */
#define CHUNK_BYTES (8u << 20)

/* The most bytes a work item copies before it counts them into the checksum's blocks
 * and hashes the blocks it completed: source and destination stay in a core's L2. */
#define SLICE_BYTES (256u << 10)

#define BLOCK_BYTES WSYNC_SESSION_CHECKSUM_BLOCK
#define BLOCK_SHIFT 16
G_STATIC_ASSERT(BLOCK_BYTES == 1u << BLOCK_SHIFT);

/* `wsync convert --part-size`'s default. */
#define DEFAULT_PART_SIZE (G_GUINT64_CONSTANT(5) << 30)

/* The largest tp, ep and thread count, as `wsync convert` takes them. */
#define MAX_PARALLEL 4096u
#define MAX_THREADS 1024u

/* What error messages call the source of a session's tensors. */
#define SOURCE_NAME "session"

/* ------------------------------------------------------------------ structures */

/* A tensor the trainer described: whole (one chunk covering it) or as shards. */
typedef struct {
  WsyncDcpTensor g; /* the global tensor; its chunks hold no data */
  gboolean sharded;
  guint first_input; /* its first chunk's index among the plan's inputs */
} Described;

/* A block of the checksum that pushes write only part of (or none of: the header's, a
 * fill's), and how many of its bytes they write.  Every other block is written whole:
 * a whole model has about a million blocks and a few partial ones per file. */
typedef struct {
  guint64 block;
  gint32 writes;
} PartialBlock;

/* One rank file. */
typedef struct {
  guint rank;
  guint part;
  char *name; /* base name */
  guint8 *header;
  gsize header_len;
  guint64 size; /* header and data */
  GPtrArray *slots; /* Slot* of its tensors, in data order */
  /* directory sink, from the first begin */
  char *path;
  int fd;
  guint8 *map; /* the whole file */
  /* the checksum's blocks (directory sink), BLOCK_BYTES each, the last one short */
  guint64 n_blocks;
  GArray *partial_blocks; /* PartialBlock: the blocks pushes do not wholly write */
  gint32 *block_left;   /* bytes pushes write into each block, not yet written in the
                         * open step (atomic) */
  guint64 *block_sums;  /* each block's XXH3-64, little-endian */
  char checksum[17];    /* of the last commit, 16 hex digits */
} OutFile;

typedef struct _Bucket Bucket;

/* Where an output tensor's bytes go. */
typedef struct {
  WsyncLayoutTensor *lt;
  OutFile *file;
  guint64 offset; /* of its data in the file */
  Bucket *bucket; /* caller sink */
} Slot;

/* Consecutive whole tensors of one rank file, delivered together (caller sink). */
struct _Bucket {
  guint rank;
  OutFile *file;
  guint64 file_offset;
  guint64 nbytes;
  guint first_entry; /* in the rank's manifest */
  guint n_entries;
  GPtrArray *slots;   /* Slot* */
  guint64 copy_bytes; /* bytes pushes write; the rest are fills */
  /* the open step */
  guint8 *data;
  gint64 remaining; /* copy bytes not yet written (atomic) */
  gboolean open;
  gboolean delivered;
};

/* A copy op of the plan that reads an input, and where it writes: a reference to the op
 * (a whole model has tens of thousands per rank; a full Op is ~700 bytes), rebuilt on
 * the stack by target_op() once per work item. */
typedef struct {
  Slot *slot;       /* its output tensor's: the op is op @op of slot->lt */
  guint op;
  guint64 rows;      /* of its first axis once its leading axes of extent 1 are dropped */
  guint64 row_bytes; /* the bytes one of those rows writes */
} Target;

/* The ops of a work item rebuilt on the stack (more go on the heap, once per item). */
#define ITEM_OPS_ON_STACK 8

/* One work item of a push: the same rows of one or more copy ops that read the input's
 * rows alike (e.g. the TP ranks' column slices of a row-parallel weight): each slice of
 * source rows is read once, while in cache, for all of them. */
typedef struct {
  const Target *targets; /* n_targets consecutive targets of the input */
  guint n_targets;
  guint64 from, to; /* rows of the ops' first axis */
  guint64 slice;    /* rows copied before counting them into the checksum's blocks */
} Item;

/* One described chunk: an input of the plan.  Its targets and items are made once, in
 * one allocation of their exact size (a whole model has ~19k inputs: growing arrays of
 * their own cost more than what they held, issue 14). */
typedef struct {
  Described *d;
  guint chunk;
  guint64 nbytes;
  Target *targets;    /* n_targets, then the items, in one allocation (owned) */
  guint n_targets;
  guint n_items;
  Item *items;        /* its push's work, n_items, after the targets */
  GPtrArray *buckets; /* caller sink: the distinct Bucket* its targets write into; else
                       * NULL */
  guint64 pushed;     /* the serial of the step that pushed it */
} Input;

typedef enum {
  STEP_CLOSED,
  STEP_OPEN,
} StepState;

/* Work indexed 0..n-1, shared by the calling thread and the session's helpers. */
typedef struct {
  void (*work)(gpointer data, guint index);
  gpointer data;
  guint n;
  gint next; /* atomic */
} Team;

/* Where the helpers find a team (see team_run()). */
typedef struct {
  gboolean in_use; /* a push's team_run() holds it */
  Team *team;      /* the team helpers may join, or NULL */
  guint running;   /* helpers in it */
} TeamSlot;

/* Pushes that can use the helpers at once (a push beyond works alone). */
#define TEAM_SLOTS 16

struct _WsyncSession {
  WsyncContext *ctx;
  char *config_path;
  char *out_dir;
  WsyncBucketFunc on_bucket;
  gpointer user_data;
  guint64 bucket_bytes;
  guint max_open_buckets;
  char *target;
  char *format;
  WsyncPlanOptions plan_opts;
  WsyncPlan *plan;
  GPtrArray *described; /* Described*, in the order described */
  GHashTable *by_name;  /* name -> Described* */
  gboolean planned;
  gboolean plan_failed;
  /* once planned */
  GArray *inputs;     /* Input, in the plan's input order */
  GPtrArray *files;   /* OutFile*, by rank then part */
  GPtrArray *manifests; /* GArray of WsyncManifestEntry, per rank */
  GPtrArray *slots;   /* Slot*, owned */
  GPtrArray *buckets; /* Bucket*, owned, by rank, file and offset */
  char *digest;
  guint world;
  guint threads;
  /* threads - 1 helper threads of the session's own, or none: not a GThreadPool, whose
   * shared state (idle threads, the spawner thread) a forked child inherits without the
   * threads, so that a child's pool waited for ever for a thread of its parent's */
  GPtrArray *helpers;     /* GThread*, or NULL */
  GAsyncQueue *helper_tasks; /* TeamSlot*, or &helper_stop to end a helper */
  pid_t helpers_pid;      /* the process they run in: a forked child has none of them */
  GMutex team_lock;  /* guards team_slots */
  GCond team_done;   /* a helper left its team */
  TeamSlot team_slots[TEAM_SLOTS];
  /* steps */
  GMutex lock; /* guards what follows, and the inputs' pushed and buckets' open state */
  StepState state;
  guint64 version;
  guint64 serial;  /* of the open (or last) step, from 1 */
  char *failure;   /* why the open step cannot complete, or NULL */
  guint n_open;    /* open buckets */
  gboolean files_ready;
  gboolean companions_written;
  GMutex deliver_lock; /* one callback at a time */
  const volatile sig_atomic_t *interrupt; /* wsync_session_set_interrupt() */
};

/* ------------------------------------------------------------------ small helpers */

static gboolean
usage_error(GError **error, const char *format, ...) G_GNUC_PRINTF(2, 3);

static gboolean
usage_error(GError **error, const char *format, ...)
{
  g_autofree char *message = NULL;
  va_list ap;

  va_start(ap, format);
  message = g_strdup_vprintf(format, ap);
  va_end(ap);
  g_set_error_literal(error, WSYNC_ERROR, WSYNC_ERROR_USAGE, message);
  return FALSE;
}

/* The signal that wsync_session_set_interrupt()'s flag holds, or 0. */
static int
interrupted(const WsyncSession *s)
{
  return s->interrupt != NULL ? *s->interrupt : 0;
}

/* "interrupted by SIGINT"; a flag value that is no signal (-1: the setter does not know
 * which, wsync_session_set_interrupt()) names none. */
static char *
interruption(int sig)
{
  const char *name = sig > 0 ? sigabbrev_np(sig) : NULL;

  return name != NULL ? g_strdup_printf("interrupted by SIG%s", name)
                      : g_strdup("interrupted by a signal");
}

/* "tensor "NAME"" or "shard [0:4, 0:8] of tensor "NAME"", for messages. */
static char *
input_label(const Input *in)
{
  if (!in->d->sharded)
    return g_strdup_printf("tensor \"%s\"", in->d->g.name);
  g_autofree char *box =
      wsync_box_format(&g_array_index(in->d->g.chunks, WsyncDcpChunk, in->chunk).box);
  return g_strdup_printf("shard %s of tensor \"%s\"", box, in->d->g.name);
}

/* ------------------------------------------------------------------ the checksum */

static inline guint64
xxh3(const void *data, gsize len)
{
#ifdef HAVE_XXH3_64BITS_DISPATCH
  return XXH3_64bits_dispatch(data, len);
#else
  return XXH3_64bits(data, len);
#endif
}

/* The hash of block @b of the @len bytes at @data, little-endian: the 8 bytes the
 * checksum hashes for it. */
static inline guint64
block_sum(const guint8 *data, guint64 len, guint64 b)
{
  guint64 at = b << BLOCK_SHIFT;

  return GUINT64_TO_LE(xxh3(data + at, MIN(BLOCK_BYTES, len - at)));
}

/* The checksum from the blocks' hashes. */
static inline guint64
combine_block_sums(const guint64 *sums, guint64 n_blocks)
{
  return xxh3(sums, n_blocks * sizeof *sums);
}

guint64
wsync_session_checksum(const void *data, gsize len)
{
  g_return_val_if_fail(data != NULL || len == 0, 0);
  guint64 n_blocks = len / BLOCK_BYTES + (len % BLOCK_BYTES != 0);
  g_autofree guint64 *sums = g_new(guint64, n_blocks);

  for (guint64 b = 0; b < n_blocks; b++)
    sums[b] = block_sum(data, len, b);
  return combine_block_sums(sums, n_blocks);
}

/* ------------------------------------------------------------------ threads */

static void
team_work(Team *t)
{
  for (;;) {
    guint i = (guint)g_atomic_int_add(&t->next, 1);
    if (i >= t->n)
      return;
    t->work(t->data, i);
  }
}

/* A helper's task: joins the team its slot holds, if the caller has not finished yet. */
static void
team_help(WsyncSession *s, TeamSlot *slot)
{
  Team *t;

  g_mutex_lock(&s->team_lock);
  t = slot->team;
  if (t != NULL)
    slot->running++;
  g_mutex_unlock(&s->team_lock);
  if (t == NULL)
    return; /* the caller did all the work without this helper */
  team_work(t);
  g_mutex_lock(&s->team_lock);
  if (--slot->running == 0)
    g_cond_broadcast(&s->team_done);
  g_mutex_unlock(&s->team_lock);
}

/* What a helper pops to end (wsync_session_free()). */
static TeamSlot helper_stop;

static gpointer
helper_main(gpointer data)
{
  WsyncSession *s = data;

  for (;;) {
    TeamSlot *slot = g_async_queue_pop(s->helper_tasks);
    if (slot == &helper_stop)
      return NULL;
    team_help(s, slot);
  }
}

/* Starts @n helpers; fewer when the system gives fewer threads (the caller of
 * team_run() then does more of the work itself). */
static void
start_helpers(WsyncSession *s, guint n)
{
  s->helper_tasks = g_async_queue_new();
  s->helpers = g_ptr_array_new();
  s->helpers_pid = getpid();
  for (guint i = 0; i < n; i++) {
    GThread *thread = g_thread_try_new("wsync-session", helper_main, s, NULL);
    if (thread == NULL)
      break;
    g_ptr_array_add(s->helpers, thread);
  }
}

/* What a forked child cannot free of its parent's helpers (stop_helpers()). */
static GPtrArray *orphans;
G_LOCK_DEFINE_STATIC(orphans);

/* The helpers of this process: none in a child forked after they started (fork(2)
 * copies only the calling thread), whose pushes then work alone. */
static guint
n_helpers(const WsyncSession *s)
{
  return s->helpers != NULL && s->helpers_pid == getpid() ? s->helpers->len : 0;
}

static void
stop_helpers(WsyncSession *s)
{
  if (s->helpers == NULL)
    return;
  if (s->helpers_pid != getpid()) {
    /* a forked child: the threads are its parent's, not to be joined (pthread_join
     * fails, ESRCH, and GLib aborts), and the queue's count of waiting threads is
     * theirs (g_async_queue_unref refuses it); both are kept until the child exits */
    G_LOCK(orphans);
    if (orphans == NULL)
      orphans = g_ptr_array_new();
    g_ptr_array_add(orphans, g_steal_pointer(&s->helpers));
    g_ptr_array_add(orphans, g_steal_pointer(&s->helper_tasks));
    G_UNLOCK(orphans);
    return;
  }
  for (guint i = 0; i < s->helpers->len; i++)
    g_async_queue_push(s->helper_tasks, &helper_stop);
  for (guint i = 0; i < s->helpers->len; i++)
    g_thread_join(s->helpers->pdata[i]);
  g_clear_pointer(&s->helpers, g_ptr_array_unref);
  g_clear_pointer(&s->helper_tasks, g_async_queue_unref);
}

/* Runs @work(@data, i) for every i < @n, and returns when all are done.  The caller
 * works too, and waits only for helpers that joined: on a machine whose other core is
 * busy a helper may start milliseconds later, by which time a push of a few MiB is
 * done (waiting for it took as long as the copy).  The helpers' tasks point at a slot of
 * the session, never at the caller's stack, so that a helper starting late finds the
 * slot empty (or another push's team, which it may help as well). */
static void
team_run(WsyncSession *s, void (*work)(gpointer, guint), gpointer data, guint n)
{
  Team t = {.work = work, .data = data, .n = n};
  guint helpers = n > 1 ? MIN(n_helpers(s), n - 1) : 0;
  TeamSlot *slot = NULL;

  if (helpers > 0) {
    g_mutex_lock(&s->team_lock);
    for (guint i = 0; slot == NULL && i < TEAM_SLOTS; i++)
      if (!s->team_slots[i].in_use)
        slot = &s->team_slots[i];
    if (slot != NULL) {
      slot->in_use = TRUE;
      slot->team = &t;
    }
    g_mutex_unlock(&s->team_lock);
  }
  for (guint h = 0; slot != NULL && h < helpers; h++)
    g_async_queue_push(s->helper_tasks, slot);
  team_work(&t);
  if (slot != NULL) {
    g_mutex_lock(&s->team_lock);
    slot->team = NULL; /* no helper joins any more */
    while (slot->running > 0)
      g_cond_wait(&s->team_done, &s->team_lock);
    slot->in_use = FALSE;
    g_mutex_unlock(&s->team_lock);
  }
}

/* ------------------------------------------------------------------ making a session */

static void
described_free(gpointer data)
{
  Described *d = data;

  g_free(d->g.name);
  if (d->g.chunks != NULL)
    g_array_unref(d->g.chunks);
  g_free(d);
}

static void
outfile_free(gpointer data)
{
  OutFile *f = data;

  if (f->map != NULL)
    munmap(f->map, f->size);
  if (f->fd >= 0)
    close(f->fd);
  g_free(f->name);
  g_free(f->header);
  g_free(f->path);
  if (f->partial_blocks)
    g_array_unref(f->partial_blocks);
  g_free(f->block_left);
  g_free(f->block_sums);
  g_ptr_array_unref(f->slots);
  g_free(f);
}

static void
bucket_free(gpointer data)
{
  Bucket *b = data;

  g_free(b->data);
  g_ptr_array_unref(b->slots);
  g_free(b);
}

static void
input_clear(gpointer data)
{
  Input *in = data;

  g_free(in->targets); /* and the items */
  if (in->buckets)
    g_ptr_array_unref(in->buckets);
}

WsyncSession *
wsync_session_new(WsyncContext *ctx, const char *config_path, const WsyncSessionOptions *opts,
                  GError **error)
{
  g_return_val_if_fail(ctx != NULL && config_path != NULL && opts != NULL, NULL);
  g_autoptr(WsyncSession) s = g_new0(WsyncSession, 1);

  s->ctx = ctx;
  g_mutex_init(&s->lock);
  g_mutex_init(&s->deliver_lock);
  g_mutex_init(&s->team_lock);
  g_cond_init(&s->team_done);
  s->config_path = g_strdup(config_path);
  s->described = g_ptr_array_new_with_free_func(described_free);
  s->by_name = g_hash_table_new(g_str_hash, g_str_equal);
  s->threads = opts->threads > 0 ? opts->threads : g_get_num_processors();
  if (opts->target == NULL) {
    usage_error(error, "session: no target given");
    return NULL;
  }
  if (opts->out_dir != NULL && opts->on_bucket != NULL) {
    usage_error(error, "session: out_dir and on_bucket both given: choose one sink");
    return NULL;
  }
  /* the command line's bounds (core/cmd-convert.c): no layout plans for hours */
  if (opts->tp > MAX_PARALLEL || opts->ep > MAX_PARALLEL || s->threads > MAX_THREADS) {
    usage_error(error, "session: tp %u, ep %u, threads %u: at most %u, %u and %u", opts->tp,
                opts->ep, s->threads, MAX_PARALLEL, MAX_PARALLEL, MAX_THREADS);
    return NULL;
  }
  s->target = g_strdup(opts->target);
  s->format = g_strdup(opts->format);
  s->out_dir = g_strdup(opts->out_dir);
  s->on_bucket = opts->on_bucket;
  s->user_data = opts->user_data;
  s->bucket_bytes = opts->bucket_bytes > 0 ? opts->bucket_bytes : WSYNC_SESSION_BUCKET_BYTES;
  s->max_open_buckets = opts->max_open_buckets;
  s->plan_opts.target = s->target;
  s->plan_opts.format = s->format;
  s->plan_opts.format_explicit = s->format != NULL;
  s->plan_opts.tp = MAX(opts->tp, 1);
  s->plan_opts.ep = MAX(opts->ep, 1);
  s->plan_opts.rank = -1;
  s->plan_opts.part_size = opts->part_size > 0 ? opts->part_size : DEFAULT_PART_SIZE;
  s->plan_opts.threads = s->threads;
  s->plan = plan_new_session(ctx, config_path, &s->plan_opts, error);
  if (s->plan == NULL)
    return NULL;
  if (s->threads > 1)
    start_helpers(s, s->threads - 1);
  return g_steal_pointer(&s);
}

/* ------------------------------------------------------------------ describing */

static gboolean
check_describing(WsyncSession *s, const char *name, GError **error)
{
  if (s->planned || s->plan_failed)
    return usage_error(error, "describe: tensor \"%s\": the session has %s", name,
                       s->planned ? "planned already" : "failed to plan (make a new one)");
  return TRUE;
}

/* A tensor's dtype and shape: a whole number of bytes that fits in memory. */
static gboolean
check_shape(const char *name, WsyncDtype dtype, guint ndim, const guint64 *shape,
            GError **error)
{
  guint64 numel = 1, nbytes;

  if ((guint)dtype >= WSYNC_DTYPE_COUNT || wsync_dtype_size(dtype) == 0) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "describe: tensor \"%s\": dtype %s is not one a session can cut (a sub-byte "
                "or unknown type)",
                name, (guint)dtype < WSYNC_DTYPE_COUNT ? wsync_dtype_name(dtype) : "?");
    return FALSE;
  }
  if (ndim > WSYNC_MAX_DIMS) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "describe: tensor \"%s\" has %u axes, more than %u", name, ndim,
                WSYNC_MAX_DIMS);
    return FALSE;
  }
  for (guint d = 0; d < ndim; d++)
    if (!g_uint64_checked_mul(&numel, numel, shape[d]))
      numel = G_MAXUINT64;
  if (numel == G_MAXUINT64 || !wsync_dtype_nbytes(dtype, numel, &nbytes) ||
      nbytes > G_MAXSIZE) {
    g_autofree char *text = wsync_shape_format(ndim, shape);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "describe: tensor \"%s\": shape %s overflows", name, text);
    return FALSE;
  }
  return TRUE;
}

static Described *
add_described(WsyncSession *s, const char *name, WsyncDtype dtype, guint ndim,
              const guint64 *shape, gboolean sharded)
{
  Described *d = g_new0(Described, 1);

  d->g.name = g_strdup(name);
  d->g.dtype = dtype;
  d->g.ndim = ndim;
  if (ndim > 0)
    memcpy(d->g.shape, shape, ndim * sizeof *shape);
  /* a whole tensor is one row-major chunk: no array for it */
  if (sharded)
    d->g.chunks = g_array_new(FALSE, TRUE, sizeof(WsyncDcpChunk));
  else
    d->g.whole_file = SOURCE_NAME;
  d->sharded = sharded;
  g_ptr_array_add(s->described, d);
  g_hash_table_insert(s->by_name, d->g.name, d);
  return d;
}

/* A shard of @d at @offsets of extent @sizes, its bytes pushed row-major (a whole
 * tensor's one chunk is implied: wsync_dcp_tensor_chunk()). */
static void
add_chunk(Described *d, const guint64 *offsets, const guint64 *sizes)
{
  WsyncDcpChunk c = {.box.ndim = d->g.ndim, .file = SOURCE_NAME};

  for (guint k = 0; k < d->g.ndim; k++) {
    c.box.offset[k] = offsets[k];
    c.box.extent[k] = sizes[k];
  }
  wsync_region_row_major(&c.region, d->g.ndim, sizes, NULL);
  g_array_append_val(d->g.chunks, c);
}

gboolean
wsync_session_describe(WsyncSession *s, const char *name, WsyncDtype dtype, guint ndim,
                       const guint64 *shape, GError **error)
{
  g_return_val_if_fail(s != NULL && name != NULL && (shape != NULL || ndim == 0), FALSE);

  if (!check_describing(s, name, error) || !check_shape(name, dtype, ndim, shape, error))
    return FALSE;
  if (g_hash_table_contains(s->by_name, name)) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "describe: tensor \"%s\" was described before", name);
    return FALSE;
  }
  add_described(s, name, dtype, ndim, shape, FALSE);
  return TRUE;
}

static gboolean
same_shape(guint ndim, const guint64 *a, const guint64 *b)
{
  return ndim == 0 || memcmp(a, b, ndim * sizeof *a) == 0;
}

gboolean
wsync_session_describe_shard(WsyncSession *s, const char *name, WsyncDtype dtype, guint ndim,
                             const guint64 *global_shape, const guint64 *offsets,
                             const guint64 *sizes, GError **error)
{
  g_return_val_if_fail(s != NULL && name != NULL, FALSE);
  g_return_val_if_fail(ndim == 0 || (global_shape != NULL && offsets != NULL && sizes != NULL),
                       FALSE);
  WsyncBox box = {.ndim = ndim};

  if (!check_describing(s, name, error) || !check_shape(name, dtype, ndim, global_shape, error))
    return FALSE;
  for (guint k = 0; k < ndim; k++) {
    box.offset[k] = offsets[k];
    box.extent[k] = sizes[k];
  }
  g_autofree char *where = wsync_box_format(&box);
  g_autofree char *shape = wsync_shape_format(ndim, global_shape);
  for (guint k = 0; k < ndim; k++)
    if (offsets[k] > global_shape[k] || sizes[k] > global_shape[k] - offsets[k]) {
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                  "describe: tensor \"%s\": shard %s lies outside the shape %s", name, where,
                  shape);
      return FALSE;
    }
  Described *d = g_hash_table_lookup(s->by_name, name);
  if (d != NULL && !d->sharded) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "describe: tensor \"%s\" was described whole before", name);
    return FALSE;
  }
  if (d != NULL && (d->g.dtype != dtype || d->g.ndim != ndim ||
                    !same_shape(ndim, d->g.shape, global_shape))) {
    g_autofree char *first = wsync_shape_format(d->g.ndim, d->g.shape);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "describe: tensor \"%s\": shard %s is %s %s, but its first shard said %s %s",
                name, where, wsync_dtype_name(dtype), shape, wsync_dtype_name(d->g.dtype),
                first);
    return FALSE;
  }
  for (guint c = 0; d != NULL && c < d->g.chunks->len; c++) {
    const WsyncBox *other = &g_array_index(d->g.chunks, WsyncDcpChunk, c).box;
    WsyncBox inter;
    gboolean same_place = memcmp(other->offset, box.offset, sizeof box.offset) == 0;
    if (same_place || (wsync_box_intersect(other, &box, &inter) && wsync_box_volume(&inter) > 0)) {
      g_autofree char *text = wsync_box_format(other);
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                  "describe: tensor \"%s\": shard %s overlaps shard %s (push every element "
                  "once)",
                  name, where, text);
      return FALSE;
    }
  }
  if (d == NULL)
    d = add_described(s, name, dtype, ndim, global_shape, TRUE);
  add_chunk(d, offsets, sizes);
  return TRUE;
}

/* ------------------------------------------------------------------ planning */

/* The shards of every sharded tensor cover it (they do not overlap: describe checked). */
static gboolean
check_shards_cover(WsyncSession *s, GError **error)
{
  for (guint i = 0; i < s->described->len; i++) {
    const Described *d = s->described->pdata[i];
    WsyncBox whole;
    guint64 covered = 0;
    if (!d->sharded)
      continue;
    wsync_box_whole(&whole, d->g.ndim, d->g.shape);
    for (guint c = 0; c < d->g.chunks->len; c++)
      covered += wsync_box_volume(&g_array_index(d->g.chunks, WsyncDcpChunk, c).box);
    if (covered == wsync_box_volume(&whole))
      continue;
    /* the first gap: the whole box minus every shard */
    g_autoptr(GArray) left = g_array_new(FALSE, FALSE, sizeof(WsyncBox));
    g_array_append_val(left, whole);
    for (guint c = 0; c < d->g.chunks->len && left->len > 0; c++) {
      const WsyncBox *cut = &g_array_index(d->g.chunks, WsyncDcpChunk, c).box;
      g_autoptr(GArray) next = g_array_new(FALSE, FALSE, sizeof(WsyncBox));
      for (guint u = 0; u < left->len; u++) {
        const WsyncBox *ub = &g_array_index(left, WsyncBox, u);
        WsyncBox inter;
        if (wsync_box_intersect(ub, cut, &inter))
          plan_box_subtract(ub, &inter, next);
        else
          g_array_append_val(next, *ub);
      }
      g_array_set_size(left, 0);
      g_array_append_vals(left, next->data, next->len);
    }
    g_autofree char *gap = wsync_box_format(&g_array_index(left, WsyncBox, 0));
    g_autofree char *shape = wsync_shape_format(d->g.ndim, d->g.shape);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "%s: tensor \"%s\": no described shard holds %s (shape %s, %u shards)",
                SOURCE_NAME, d->g.name, gap, shape, d->g.chunks->len);
    return FALSE;
  }
  return TRUE;
}

/* The files of one rank (core/rankfile.c: the headers `wsync convert` writes) and a
 * slot for each of their tensors. */
static void
lay_out_rank(WsyncSession *s, WsyncLayout *layout, GHashTable *slot_of)
{
  g_autoptr(GPtrArray) laid_out = rank_files_new(s->plan, layout);

  for (guint p = 0; p < laid_out->len; p++) {
    RankFile *rf = laid_out->pdata[p];
    OutFile *f = g_new0(OutFile, 1);

    f->rank = rf->rank;
    f->part = rf->part;
    f->fd = -1;
    f->name = g_steal_pointer(&rf->name);
    f->header = g_steal_pointer(&rf->header);
    f->header_len = rf->header_len;
    f->size = rf->size;
    f->slots = g_ptr_array_new();
    for (guint i = 0; i < rf->tensors->len; i++) {
      const RankTensor *t = &g_array_index(rf->tensors, RankTensor, i);
      Slot *slot = g_new0(Slot, 1);
      slot->lt = t->lt;
      slot->file = f;
      slot->offset = t->offset;
      g_ptr_array_add(s->slots, slot);
      g_ptr_array_add(f->slots, slot);
      g_hash_table_insert(slot_of, t->lt, slot);
    }
    g_ptr_array_add(s->files, f);
  }
}

/* Each rank's manifest: its files by part, each file's tensors by offset. */
static void
make_manifests(WsyncSession *s)
{
  s->manifests = g_ptr_array_new_with_free_func((GDestroyNotify)g_array_unref);
  for (guint r = 0; r < s->world; r++)
    g_ptr_array_add(s->manifests, g_array_new(FALSE, TRUE, sizeof(WsyncManifestEntry)));
  for (guint f = 0; f < s->files->len; f++) {
    OutFile *file = s->files->pdata[f];
    GArray *m = s->manifests->pdata[file->rank];
    for (guint i = 0; i < file->slots->len; i++) {
      const Slot *slot = file->slots->pdata[i];
      WsyncManifestEntry e = {.name = slot->lt->name,
                              .dtype = slot->lt->dtype,
                              .ndim = slot->lt->ndim,
                              .file = file->name,
                              .offset = slot->offset,
                              .nbytes = slot->lt->nbytes};
      memcpy(e.shape, slot->lt->shape, slot->lt->ndim * sizeof e.shape[0]);
      g_array_append_val(m, e);
    }
  }
}

/* SHA-256 of the canonical manifest (docs/session.md). */
static void
make_digest(WsyncSession *s)
{
  g_autoptr(GString) text = g_string_new(NULL);
  g_autoptr(GChecksum) sum = g_checksum_new(G_CHECKSUM_SHA256);
  WsyncPlan *plan = s->plan;

  g_string_append_printf(text, "wsync-manifest\t1\ntarget\t%s\nformat\t%s\ntp\t%u\nep\t%u\n"
                               "world\t%u\n",
                         plan->target, plan->out_format ? plan->out_format : "", plan->out_tp,
                         plan->out_ep, s->world);
  for (guint r = 0; r < s->world; r++) {
    GArray *m = s->manifests->pdata[r];
    for (guint i = 0; i < m->len; i++) {
      const WsyncManifestEntry *e = &g_array_index(m, WsyncManifestEntry, i);
      g_string_append_printf(text, "%u\t%s\t%" G_GUINT64_FORMAT "\t%s\t%s\t", r, e->file,
                             e->offset, e->name, wsync_dtype_name(e->dtype));
      for (guint d = 0; d < e->ndim; d++)
        g_string_append_printf(text, "%s%" G_GUINT64_FORMAT, d ? "," : "", e->shape[d]);
      g_string_append_c(text, '\n');
    }
  }
  g_checksum_update(sum, (const guchar *)text->str, (gssize)text->len);
  s->digest = g_strdup(g_checksum_get_string(sum));
}

static guint64
slot_copy_bytes(const Slot *slot)
{
  guint64 bytes = 0;

  for (guint i = 0; i < slot->lt->n_ops; i++) {
    Op op_buf;
    const Op *op = &op_buf;
    layout_tensor_op(slot->lt, i, &op_buf);
    if (op->kind == OP_COPY)
      bytes += copy_op_bytes(op, slot->lt->dtype);
  }
  return bytes;
}

/* Caller sink: consecutive whole tensors of each rank file, a new bucket before a
 * tensor that would pass the bucket size. */
static void
make_buckets(WsyncSession *s)
{
  s->buckets = g_ptr_array_new_with_free_func(bucket_free);
  for (guint r = 0; r < s->world; r++) {
    guint entry = 0; /* in the rank's manifest, which runs over its files in order */
    for (guint f = 0; f < s->files->len; f++) {
      OutFile *file = s->files->pdata[f];
      Bucket *b = NULL;
      if (file->rank != r)
        continue;
      for (guint i = 0; i < file->slots->len; i++, entry++) {
        Slot *slot = file->slots->pdata[i];
        if (b == NULL || (b->n_entries > 0 && b->nbytes + slot->lt->nbytes > s->bucket_bytes)) {
          b = g_new0(Bucket, 1);
          b->rank = r;
          b->file = file;
          b->file_offset = slot->offset;
          b->first_entry = entry;
          b->slots = g_ptr_array_new();
          g_ptr_array_add(s->buckets, b);
        }
        g_assert(b->file_offset + b->nbytes == slot->offset); /* the writer leaves no gaps */
        b->nbytes += slot->lt->nbytes;
        b->n_entries++;
        b->copy_bytes += slot_copy_bytes(slot);
        g_ptr_array_add(b->slots, slot);
        slot->bucket = b;
      }
    }
  }
}

/* Drops an op's leading axes of extent 1 (the expert axis of one expert's copy), so
 * that its first axis, the one work items and slices cut, has rows to cut.  Keeps one
 * axis. */
static void
op_drop_leading_units(Op *op)
{
  guint k = 0;

  while (k + 1 < op->ndim && op->extent[k] == 1)
    k++;
  if (k == 0)
    return;
  op->ndim -= k;
  memmove(op->extent, op->extent + k, op->ndim * sizeof op->extent[0]);
  memmove(op->src_stride, op->src_stride + k, op->ndim * sizeof op->src_stride[0]);
  memmove(op->dst_stride, op->dst_stride + k, op->ndim * sizeof op->dst_stride[0]);
}

/* Sets @op to @target's op, without its leading axes of extent 1 (cut into rows). */
static void
target_op(const Target *target, Op *op)
{
  layout_tensor_op(target->slot->lt, target->op, op);
  op_drop_leading_units(op);
}

/* A target of the copy op @op (op @index of @slot's tensor, leading units dropped). */
static Target
target_new(Slot *slot, guint index, const Op *op)
{
  Target target = {slot, index, op->ndim ? op->extent[0] : 1, 0};

  target.row_bytes = MAX(copy_op_bytes(op, slot->lt->dtype) / target.rows, 1);
  return target;
}

/* Whether @a and @b read the input's rows alike: as many rows, the same source stride
 * along them. */
static gboolean
same_rows(const Op *a, const Op *b)
{
  return a->ndim > 0 && b->ndim > 0 && a->extent[0] == b->extent[0] &&
         a->src_stride[0] == b->src_stride[0];
}

/* The work of @in's push: consecutive copy ops that read the rows alike form a group,
 * cut along the rows into items of at most CHUNK_BYTES (and, with @threads > 1, into at
 * least @threads items where there are as many rows), each copied in slices of at most
 * SLICE_BYTES. */
static void
make_items(const Input *in, guint threads, GArray *items)
{
  for (guint t = 0, u; t < in->n_targets; t = u) {
    const Target *first = &in->targets[t];
    guint64 rows = first->rows, row_bytes = first->row_bytes;
    Op first_op, op;
    target_op(first, &first_op);
    for (u = t + 1; u < in->n_targets; u++) {
      const Target *next = &in->targets[u];
      target_op(next, &op);
      if (!same_rows(&first_op, &op))
        break;
      row_bytes += next->row_bytes;
    }
    guint64 step = MAX(CHUNK_BYTES / row_bytes, 1);
    if (threads > 1)
      step = MIN(step, MAX((rows + threads - 1) / threads, 1));
    for (guint64 from = 0; from < rows; from += step) {
      Item it = {.targets = first,
                 .n_targets = u - t,
                 .from = from,
                 .to = MIN(from + step, rows),
                 .slice = MAX(SLICE_BYTES / row_bytes, 1)};
      g_array_append_val(items, it);
    }
  }
}

/* Gives @in its items, made in @items (then emptied), in one allocation with its
 * targets: the items point into the new copy of the targets. */
static void
seal_input(Input *in, GArray *items)
{
  gsize targets_bytes = (gsize)in->n_targets * sizeof(Target);
  gsize items_bytes = (gsize)items->len * sizeof(Item);
  Target *block;

  G_STATIC_ASSERT(sizeof(Target) % G_ALIGNOF(Item) == 0);
  if (targets_bytes + items_bytes == 0) {
    g_clear_pointer(&in->targets, g_free);
    return;
  }
  block = g_malloc(targets_bytes + items_bytes);
  if (targets_bytes > 0)
    memcpy(block, in->targets, targets_bytes);
  in->items = (Item *)(void *)((guint8 *)block + targets_bytes);
  in->n_items = items->len;
  for (guint i = 0; i < items->len; i++) {
    Item it = g_array_index(items, Item, i);
    it.targets = block + (it.targets - in->targets);
    in->items[i] = it;
  }
  g_free(in->targets);
  in->targets = block;
  g_array_set_size(items, 0);
}

/* Counts, in block_left, the bytes a target's runs write into each block. */
static void
count_block_writes(gpointer data, guint64 offset, guint64 length)
{
  OutFile *f = ((const Slot *)data)->file;
  guint64 pos = ((const Slot *)data)->offset + offset;

  while (length > 0) {
    guint64 block = pos >> BLOCK_SHIFT, n = MIN(length, ((block + 1) << BLOCK_SHIFT) - pos);
    f->block_left[block] += (gint32)n;
    pos += n;
    length -= n;
  }
}

/* The bytes of block @b of @f (the last one is short). */
static gint32
block_bytes(const OutFile *f, guint64 b)
{
  return (gint32)MIN((guint64)BLOCK_BYTES, f->size - (b << BLOCK_SHIFT));
}

/* Sets every block's count of bytes the step's pushes write. */
static void
reset_block_left(OutFile *f)
{
  for (guint64 b = 0; b < f->n_blocks; b++)
    f->block_left[b] = block_bytes(f, b);
  for (guint i = 0; i < f->partial_blocks->len; i++) {
    const PartialBlock *p = &g_array_index(f->partial_blocks, PartialBlock, i);
    f->block_left[p->block] = p->writes;
  }
}

/* Keeps the blocks whose count, in block_left, is not the whole block. */
static void
find_partial_blocks(OutFile *f)
{
  f->partial_blocks = g_array_new(FALSE, FALSE, sizeof(PartialBlock));
  for (guint64 b = 0; b < f->n_blocks; b++)
    if (f->block_left[b] != block_bytes(f, b)) {
      PartialBlock p = {b, f->block_left[b]};
      g_array_append_val(f->partial_blocks, p);
    }
}

/* Directory sink: the checksum's blocks of every file, and how many bytes pushes write
 * into each (every copy op's destination runs: the plan writes each byte once). */
static void
make_blocks(WsyncSession *s)
{
  for (guint i = 0; i < s->files->len; i++) {
    OutFile *f = s->files->pdata[i];
    f->n_blocks = (f->size + BLOCK_BYTES - 1) >> BLOCK_SHIFT;
    f->block_left = g_new0(gint32, f->n_blocks);
    f->block_sums = g_new0(guint64, f->n_blocks);
  }
  for (guint i = 0; i < s->inputs->len; i++) {
    const Input *in = &g_array_index(s->inputs, Input, i);
    for (guint t = 0; t < in->n_targets; t++) {
      const Target *target = &in->targets[t];
      Op op;
      target_op(target, &op);
      copy_op_runs(&op, 0, target->rows, target->slot->lt->dtype, count_block_writes,
                   target->slot);
    }
  }
  for (guint i = 0; i < s->files->len; i++)
    find_partial_blocks(s->files->pdata[i]);
}

/* Every copy op of every output reads one input: it becomes a target of that input's
 * push.  Without @fill, only counts them into each input's n_targets; with it, stores
 * them into targets of that size (n_targets counted again from 0). */
static void
add_targets(WsyncSession *s, GHashTable *slot_of, gboolean fill)
{
  WsyncPlan *plan = s->plan;

  for (guint l = 0; l < plan->outputs->len; l++) {
    WsyncLayout *layout = plan->outputs->pdata[l];
    for (guint t = 0; t < layout->tensors->len; t++) {
      WsyncLayoutTensor *lt = layout->tensors->pdata[t];
      Slot *slot = g_hash_table_lookup(slot_of, lt);
      for (guint o = 0; o < lt->n_ops; o++) {
        Op op_buf;
        const Op *op = &op_buf;
        layout_tensor_op(lt, o, &op_buf);
        if (op->kind != OP_COPY || copy_op_bytes(op, lt->dtype) == 0)
          continue;
        Input *in = &g_array_index(s->inputs, Input, op->source->input_index);
        if (!fill) {
          in->n_targets++;
          continue;
        }
        op_drop_leading_units(&op_buf);
        in->targets[in->n_targets++] = target_new(slot, o, op);
        if (slot->bucket != NULL && !g_ptr_array_find(in->buckets, slot->bucket, NULL))
          g_ptr_array_add(in->buckets, slot->bucket);
      }
    }
  }
}

static gboolean
make_inputs(WsyncSession *s, GHashTable *slot_of, GError **error)
{
  WsyncPlan *plan = s->plan;
  guint at = 0;

  s->inputs = g_array_new(FALSE, TRUE, sizeof(Input));
  g_array_set_clear_func(s->inputs, input_clear);
  g_array_set_size(s->inputs, plan->inputs->len);
  for (guint i = 0; i < s->described->len; i++) {
    Described *d = s->described->pdata[i];
    d->first_input = at;
    for (guint c = 0; c < wsync_dcp_tensor_n_chunks(&d->g); c++, at++) {
      Input *in = &g_array_index(s->inputs, Input, at);
      in->d = d;
      in->chunk = c;
      in->nbytes = ((const WsyncTensor *)plan->chunk_tensors->pdata[at])->nbytes;
      if (s->on_bucket != NULL)
        in->buckets = g_ptr_array_new();
    }
  }
  g_assert(at == plan->inputs->len);
  add_targets(s, slot_of, FALSE);
  for (guint i = 0; i < s->inputs->len; i++) {
    Input *in = &g_array_index(s->inputs, Input, i);
    in->targets = g_new(Target, in->n_targets);
    in->n_targets = 0;
  }
  add_targets(s, slot_of, TRUE);
  g_autoptr(GArray) items = g_array_new(FALSE, FALSE, sizeof(Item));
  for (guint i = 0; i < s->inputs->len; i++) {
    Input *in = &g_array_index(s->inputs, Input, i);
    make_items(in, s->threads, items); /* targets final: items point in */
    seal_input(in, items);
  }
  for (guint i = 0; s->max_open_buckets > 0 && i < s->inputs->len; i++) {
    Input *in = &g_array_index(s->inputs, Input, i);
    if (in->buckets != NULL && in->buckets->len > s->max_open_buckets) {
      g_autofree char *what = input_label(in);
      return usage_error(error,
                         "%s: %s alone fills %u buckets, more than max_open_buckets (%u)",
                         SOURCE_NAME, what, in->buckets->len, s->max_open_buckets);
    }
  }
  return TRUE;
}

gboolean
wsync_session_plan(WsyncSession *s, GError **error)
{
  g_return_val_if_fail(s != NULL, FALSE);
  g_autoptr(GPtrArray) globals = g_ptr_array_new();
  g_autoptr(GHashTable) slot_of = g_hash_table_new(g_direct_hash, g_direct_equal);

  if (s->planned || s->plan_failed)
    return usage_error(error, "plan: the session has %s",
                       s->planned ? "planned already" : "failed to plan (make a new one)");
  for (guint i = 0; i < s->described->len; i++)
    g_ptr_array_add(globals, &((Described *)s->described->pdata[i])->g);
  s->plan_failed = TRUE; /* until it succeeds */
  /* the phases take about equal parts of the seconds a whole model takes: the interrupt
   * flag is heard between them (plan_interrupted()) */
  if (!check_shards_cover(s, error) || plan_interrupted(s->plan, error) ||
      !plan_session_bind(s->plan, &s->plan_opts, globals, error))
    return FALSE;
  s->world = s->plan->out_world;
  s->files = g_ptr_array_new_with_free_func(outfile_free);
  s->slots = g_ptr_array_new_with_free_func(g_free);
  for (guint l = 0; l < s->plan->outputs->len; l++) {
    if (plan_interrupted(s->plan, error))
      return FALSE;
    lay_out_rank(s, s->plan->outputs->pdata[l], slot_of);
  }
  make_manifests(s);
  make_digest(s);
  if (plan_interrupted(s->plan, error))
    return FALSE;
  if (s->on_bucket != NULL)
    make_buckets(s);
  if (plan_interrupted(s->plan, error) || !make_inputs(s, slot_of, error) ||
      plan_interrupted(s->plan, error))
    return FALSE;
  if (s->out_dir != NULL)
    make_blocks(s);
  s->plan_failed = FALSE;
  s->planned = TRUE;
  return TRUE;
}

const char *
wsync_session_get_digest(WsyncSession *s)
{
  g_return_val_if_fail(s != NULL, NULL);
  return s->digest;
}

guint
wsync_session_get_world(WsyncSession *s)
{
  g_return_val_if_fail(s != NULL, 0);
  return s->planned ? s->world : 0;
}

const WsyncManifestEntry *
wsync_session_get_manifest(WsyncSession *s, guint rank, guint *n_entries)
{
  g_return_val_if_fail(s != NULL && n_entries != NULL, NULL);
  *n_entries = 0;
  if (!s->planned || rank >= s->world)
    return NULL;
  GArray *m = s->manifests->pdata[rank];
  *n_entries = m->len;
  return (const WsyncManifestEntry *)(gconstpointer)m->data;
}

/* ------------------------------------------------------------------ the directory sink */

/* The fill ops of the tensors in @slots, into memory whose first byte is file offset
 * @base_offset. */
static void
apply_fills(GPtrArray *slots, guint8 *base, guint64 base_offset)
{
  for (guint i = 0; i < slots->len; i++) {
    const Slot *slot = slots->pdata[i];
    const WsyncLayoutTensor *lt = slot->lt;
    for (guint o = 0; o < lt->n_ops; o++) {
      Op op_buf;
      const Op *op = &op_buf;
      layout_tensor_op(lt, o, &op_buf);
      if (op->kind == OP_FILL)
        copy_fill(base + (slot->offset - base_offset), op->fill, wsync_dtype_size(lt->dtype),
                  lt->ndim, lt->shape);
    }
  }
}

/* The directory may hold our files (an earlier session's) but no other rank files: a
 * reader would take them for part of the output. */
static gboolean
check_foreign_files(WsyncSession *s, GError **error)
{
  g_autoptr(GHashTable) ours = g_hash_table_new(g_str_hash, g_str_equal);
  g_autoptr(GDir) d = g_dir_open(s->out_dir, 0, NULL);
  const char *name;

  for (guint f = 0; f < s->files->len; f++)
    g_hash_table_add(ours, ((OutFile *)s->files->pdata[f])->name);
  while (d != NULL && (name = g_dir_read_name(d)) != NULL)
    if (g_str_has_suffix(name, ".safetensors") && !g_hash_table_contains(ours, name))
      return usage_error(error,
                         "begin: %s holds %s, which this session does not write (rank files of "
                         "another layout?): remove it or use another directory",
                         s->out_dir, name);
  return TRUE;
}

/* Creates one rank file beside its final name, sized, with its header and fills, maps
 * it, and renames it into place (a reader that has the old file open keeps it). */
static gboolean
create_file(WsyncSession *s, OutFile *f, GError **error)
{
  g_autofree char *tmp = g_strdup_printf("%s/.%s.wsync-tmp", s->out_dir, f->name);

  f->path = g_build_filename(s->out_dir, f->name, NULL);
  f->fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f->fd < 0) {
    wsync_set_io_error(error, errno, tmp, "create");
    return FALSE;
  }
  f->map = rank_file_map_new(f->fd, tmp, f->header, f->header_len, f->size, error);
  if (f->map == NULL)
    goto fail;
  apply_fills(f->slots, f->map, 0);
  /* what no push writes (the header, fills) is the same at every step */
  for (guint i = 0; i < f->partial_blocks->len; i++) {
    const PartialBlock *p = &g_array_index(f->partial_blocks, PartialBlock, i);
    if (p->writes == 0)
      f->block_sums[p->block] = block_sum(f->map, f->size, p->block);
  }
  if (rename(tmp, f->path) != 0) {
    wsync_set_io_error(error, errno, f->path, "rename into place");
    goto fail;
  }
  return TRUE;

fail:
  g_unlink(tmp);
  return FALSE;
}

static void
close_files(WsyncSession *s)
{
  for (guint i = 0; i < s->files->len; i++) {
    OutFile *f = s->files->pdata[i];
    if (f->map != NULL)
      munmap(f->map, f->size);
    if (f->fd >= 0)
      close(f->fd);
    f->map = NULL;
    f->fd = -1;
  }
}

/* out_dir is not the directory of the session's config.json: its companion files
 * (config.json through the config patchers, the tokenizer...) would replace the very
 * files they are copied from, as convert refuses DST = SRC. */
static gboolean
check_not_config_dir(WsyncSession *s, GError **error)
{
  g_autofree char *base = g_path_get_basename(s->config_path);
  g_autofree char *config_dir = g_path_get_dirname(s->config_path);
  struct stat a, b;

  if (strcmp(base, "config.json") == 0 && stat(config_dir, &a) == 0 &&
      stat(s->out_dir, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
    return usage_error(error,
                       "begin: %s is the directory of the session's %s: the output's "
                       "config.json and companion files would replace it and its neighbours; "
                       "write the output elsewhere",
                       s->out_dir, s->config_path);
  return TRUE;
}

static gboolean
create_files(WsyncSession *s, GError **error)
{
  if (!check_not_config_dir(s, error) || !check_foreign_files(s, error))
    return FALSE;
  for (guint i = 0; i < s->files->len; i++)
    if (!create_file(s, s->files->pdata[i], error)) {
      close_files(s);
      return FALSE;
    }
  s->files_ready = TRUE;
  return TRUE;
}

static gboolean
remove_record(WsyncSession *s, GError **error)
{
  g_autofree char *path = g_build_filename(s->out_dir, WSYNC_SESSION_COMMIT_RECORD, NULL);

  if (g_mkdir_with_parents(s->out_dir, 0755) != 0) {
    wsync_set_io_error(error, errno, s->out_dir, "create");
    return FALSE;
  }
  if (unlink(path) != 0 && errno != ENOENT) {
    wsync_set_io_error(error, errno, path, "remove");
    return FALSE;
  }
  return wsync_dir_sync(s->out_dir, error);
}

/* The step's pushes wrote every block (the plan covers every byte; commit checked that
 * every input was pushed), so each block was hashed by the push that completed it. */
static gboolean
checksum_files(WsyncSession *s, GError **error)
{
  for (guint i = 0; i < s->files->len; i++) {
    OutFile *f = s->files->pdata[i];
    for (guint64 b = 0; b < f->n_blocks; b++)
      if (f->block_left[b] != 0) { /* a bug if it happens */
        g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_FAILED,
                    "commit: step %" G_GUINT64_FORMAT ": %s: %d bytes of block %" G_GUINT64_FORMAT
                    " were not written",
                    s->version, f->path, f->block_left[b], b);
        return FALSE;
      }
    g_snprintf(f->checksum, sizeof f->checksum, "%016" G_GINT64_MODIFIER "x",
               combine_block_sums(f->block_sums, f->n_blocks));
  }
  return TRUE;
}

static char *
record_text(WsyncSession *s)
{
  g_autoptr(JsonBuilder) b = json_builder_new();
  g_autoptr(JsonGenerator) gen = json_generator_new();
  WsyncPlan *plan = s->plan;

  json_builder_begin_object(b);
  json_builder_set_member_name(b, "version");
  json_builder_add_int_value(b, (gint64)s->version);
  json_builder_set_member_name(b, "digest");
  json_builder_add_string_value(b, s->digest);
  plan_json_add_layout(b, plan);
  json_builder_set_member_name(b, "world");
  json_builder_add_int_value(b, s->world);
  json_builder_set_member_name(b, "files");
  json_builder_begin_array(b);
  for (guint i = 0; i < s->files->len; i++) {
    const OutFile *f = s->files->pdata[i];
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "file");
    json_builder_add_string_value(b, f->name);
    json_builder_set_member_name(b, "rank");
    json_builder_add_int_value(b, f->rank);
    json_builder_set_member_name(b, "bytes");
    json_builder_add_int_value(b, (gint64)f->size);
    json_builder_set_member_name(b, "checksum");
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "algorithm");
    json_builder_add_string_value(b, WSYNC_SESSION_CHECKSUM_ALGORITHM);
    json_builder_set_member_name(b, "block");
    json_builder_add_int_value(b, WSYNC_SESSION_CHECKSUM_BLOCK);
    json_builder_set_member_name(b, "value");
    json_builder_add_string_value(b, f->checksum);
    json_builder_end_object(b);
    json_builder_end_object(b);
  }
  json_builder_end_array(b);
  json_builder_end_object(b);
  g_autoptr(JsonNode) root = json_builder_get_root(b);
  json_generator_set_pretty(gen, TRUE);
  json_generator_set_indent(gen, 2);
  json_generator_set_root(gen, root);
  g_autofree char *text = json_generator_to_data(gen, NULL);
  return g_strconcat(text, "\n", NULL);
}

/* The commit record: a temporary file, fsync, rename, fsync of the directory. */
static gboolean
write_record(WsyncSession *s, GError **error)
{
  g_autofree char *path = g_build_filename(s->out_dir, WSYNC_SESSION_COMMIT_RECORD, NULL);
  g_autofree char *tmp = g_strdup_printf("%s/.%s.tmp", s->out_dir, WSYNC_SESSION_COMMIT_RECORD);
  g_autofree char *text = record_text(s);

  if (!wsync_file_write_synced(tmp, TRUE, text, strlen(text), error)) {
    g_unlink(tmp);
    return FALSE;
  }
  if (rename(tmp, path) != 0) {
    wsync_set_io_error(error, errno, path, "rename into place");
    g_unlink(tmp);
    return FALSE;
  }
  return wsync_dir_sync(s->out_dir, error);
}

/* config.json as `wsync convert` writes it (and, for a checkpoint directory's
 * config.json, the directory's other non-weight files), and the index for a target
 * that writes one, into @dir. */
static gboolean
write_companions_into(WsyncSession *s, const char *dir, GError **error)
{
  WsyncPlan *plan = s->plan;
  g_autofree char *base = g_path_get_basename(s->config_path);

  if (strcmp(base, "config.json") == 0) {
    g_autofree char *config_dir = g_path_get_dirname(s->config_path);
    if (!companion_copy_dir(s->ctx, plan->config, config_dir, dir, TRUE, NULL, error))
      return FALSE;
  } else if (!companion_write_config(s->ctx, plan->config, NULL, dir, NULL, error))
    return FALSE;
  if (plan->out.info->writes_index) {
    g_autoptr(GHashTable) weight_map = g_hash_table_new(g_str_hash, g_str_equal);
    g_autofree char *index = g_build_filename(dir, WSYNC_INDEX_NAME, NULL);
    for (guint i = 0; i < s->slots->len; i++) {
      const Slot *slot = s->slots->pdata[i];
      g_hash_table_insert(weight_map, slot->lt->name, slot->file->name);
    }
    if (!wsync_index_write(index, wsync_plan_total_bytes(plan), weight_map, error))
      return FALSE;
  }
  return TRUE;
}

#define COMPANIONS_TEMP ".wsync-companions."

/* Removes the companions' temporaries of out_dir that a session killed while writing
 * them left (no live session holds their lock: wsync_remove_abandoned_temp()). */
static void
remove_abandoned_companions(WsyncSession *s)
{
  g_autoptr(GDir) d = g_dir_open(s->out_dir, 0, NULL);
  const char *name;

  while (d != NULL && (name = g_dir_read_name(d)) != NULL)
    if (g_str_has_prefix(name, COMPANIONS_TEMP) && strlen(name) == strlen(COMPANIONS_TEMP) + 6) {
      g_autofree char *path = g_build_filename(s->out_dir, name, NULL);
      wsync_remove_abandoned_temp(path);
    }
}

/* Creates and locks a fresh companions' temporary in out_dir (into *@lock_fd). */
static char *
make_companions_temp(WsyncSession *s, int *lock_fd, GError **error)
{
  for (int attempt = 0; attempt < 100; attempt++) {
    g_autofree char *tmp = g_build_filename(s->out_dir, COMPANIONS_TEMP "XXXXXX", NULL);
    if (g_mkdtemp(tmp) == NULL) {
      wsync_set_io_error(error, errno, tmp, "create");
      return NULL;
    }
    /* another session's clean-up may have taken it between mkdtemp and the lock */
    if ((*lock_fd = wsync_dir_lock(tmp)) >= 0)
      return g_steal_pointer(&tmp);
  }
  wsync_set_io_error(error, EEXIST, s->out_dir, "create a temporary directory in");
  return NULL;
}

/* The companion files, written into a temporary directory inside out_dir and renamed
 * over their names: the copies refuse to overwrite (convert writes into a new
 * directory), while out_dir may hold an earlier session's (a restarted trainer's).  The
 * temporary is locked while in use, so that a session killed meanwhile leaves one that
 * the next session removes. */
static gboolean
write_companions(WsyncSession *s, GError **error)
{
  int lock_fd = -1;
  gboolean ok;
  const char *name;

  remove_abandoned_companions(s);
  g_autofree char *tmp = make_companions_temp(s, &lock_fd, error);
  if (tmp == NULL)
    return FALSE;
  ok = write_companions_into(s, tmp, error);
  g_autoptr(GDir) d = g_dir_open(tmp, 0, NULL);
  while (d != NULL && (name = g_dir_read_name(d)) != NULL) {
    g_autofree char *from = g_build_filename(tmp, name, NULL);
    g_autofree char *to = g_build_filename(s->out_dir, name, NULL);
    if (ok && rename(from, to) != 0) {
      wsync_set_io_error(error, errno, to, "rename into place");
      ok = FALSE;
    }
    g_unlink(from); /* what a failure left */
  }
  g_rmdir(tmp);
  close(lock_fd);
  return ok && wsync_dir_sync(s->out_dir, error);
}

/* Fails the commit when the interrupt flag is set: before the record, which is the
 * step's completion (docs/session.md section 4), nothing says the step is whole. */
static gboolean
commit_interrupted(WsyncSession *s, GError **error)
{
  if (!interrupted(s))
    return FALSE;
  g_autofree char *why = interruption(interrupted(s));
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_IO,
              "commit: step %" G_GUINT64_FORMAT ": %s: no commit record was written (abort "
              "the step)",
              s->version, why);
  return TRUE;
}

static gboolean
commit_directory(WsyncSession *s, GError **error)
{
  for (guint i = 0; i < s->files->len; i++) {
    OutFile *f = s->files->pdata[i];
    if (commit_interrupted(s, error)) /* a file's flush can take seconds */
      return FALSE;
    if (msync(f->map, f->size, MS_SYNC) != 0) {
      wsync_set_io_error(error, errno, f->path, "sync");
      return FALSE;
    }
  }
  if (!checksum_files(s, error) || commit_interrupted(s, error))
    return FALSE;
  if (!s->companions_written) {
    if (!write_companions(s, error))
      return FALSE;
    s->companions_written = TRUE;
  }
  return !commit_interrupted(s, error) && write_record(s, error);
}

/* ------------------------------------------------------------------ the caller sink */

/* Allocates a bucket's memory and writes its fills (under the session's lock). */
static void
open_bucket(WsyncSession *s, Bucket *b)
{
  b->data = b->nbytes > 0 ? g_malloc(b->nbytes) : NULL;
  b->remaining = (gint64)b->copy_bytes;
  b->open = TRUE;
  s->n_open++;
  if (b->data != NULL)
    apply_fills(b->slots, b->data, b->file_offset);
}

/* Frees a bucket's memory (under the session's lock). */
static void
close_bucket(WsyncSession *s, Bucket *b)
{
  g_clear_pointer(&b->data, g_free);
  if (b->open)
    s->n_open--;
  b->open = FALSE;
}

static void
set_failure(WsyncSession *s, const GError *error)
{
  g_mutex_lock(&s->lock);
  if (s->failure == NULL)
    s->failure = g_strdup(error->message);
  g_mutex_unlock(&s->lock);
}

/* set_failure() with @local, then hands it to @error (which may be NULL); FALSE. */
static gboolean
fail_step(WsyncSession *s, GError *local, GError **error)
{
  set_failure(s, local);
  g_propagate_error(error, local);
  return FALSE;
}

/* Hands filled buckets to the caller, one callback at a time, and frees them. */
static gboolean
deliver(WsyncSession *s, GPtrArray *filled, GError **error)
{
  gboolean ok = TRUE;

  for (guint i = 0; i < filled->len; i++) {
    Bucket *b = filled->pdata[i];
    if (ok) {
      const GArray *m = s->manifests->pdata[b->rank];
      WsyncBucket bucket = {.version = s->version,
                            .rank = b->rank,
                            .file = b->file->name,
                            .file_offset = b->file_offset,
                            .data = b->data,
                            .nbytes = b->nbytes,
                            .entries = &g_array_index(m, WsyncManifestEntry, b->first_entry),
                            .n_entries = b->n_entries};
      g_autoptr(GError) local = NULL;
      g_mutex_lock(&s->deliver_lock);
      ok = s->on_bucket(&bucket, s->user_data, &local);
      g_mutex_unlock(&s->deliver_lock);
      if (!ok) {
        if (local == NULL)
          g_set_error(&local, WSYNC_ERROR, WSYNC_ERROR_FAILED, "the bucket callback failed");
        g_prefix_error(&local, "bucket of rank %u, %s at %" G_GUINT64_FORMAT ": ", b->rank,
                       b->file->name, b->file_offset);
        set_failure(s, local);
        g_propagate_error(error, g_steal_pointer(&local));
      }
    }
    g_mutex_lock(&s->lock);
    close_bucket(s, b);
    b->delivered = TRUE;
    g_mutex_unlock(&s->lock);
  }
  return ok;
}

/* ------------------------------------------------------------------ steps */

/* A step is open and can go on; messages start with @what ("push: tensor "X""). */
static gboolean
check_step_open(WsyncSession *s, const char *what, GError **error)
{
  if (s->state != STEP_OPEN)
    return usage_error(error, "%s: no step is open (call wsync_session_begin first)", what);
  if (s->failure != NULL)
    return usage_error(error, "%s: step %" G_GUINT64_FORMAT " failed (%s): abort it", what,
                       s->version, s->failure);
  return TRUE;
}

gboolean
wsync_session_begin(WsyncSession *s, guint64 version, GError **error)
{
  g_return_val_if_fail(s != NULL, FALSE);

  if (!s->planned)
    return usage_error(error, "begin: the session has not planned (call wsync_session_plan "
                              "first)");
  if (s->out_dir == NULL && s->on_bucket == NULL)
    return usage_error(error, "begin: the session has no sink (out_dir or on_bucket)");
  if (version > (guint64)G_MAXINT64)
    return usage_error(error, "begin: version %" G_GUINT64_FORMAT " is above 2^63 - 1",
                       version);
  if (s->state == STEP_OPEN)
    return usage_error(error, "begin: step %" G_GUINT64_FORMAT " is open: commit or abort it "
                              "first",
                       s->version);
  if (s->out_dir != NULL &&
      (!remove_record(s, error) || (!s->files_ready && !create_files(s, error))))
    return FALSE;
  g_mutex_lock(&s->lock);
  for (guint i = 0; s->buckets != NULL && i < s->buckets->len; i++)
    ((Bucket *)s->buckets->pdata[i])->delivered = FALSE;
  for (guint i = 0; s->out_dir != NULL && i < s->files->len; i++) {
    OutFile *f = s->files->pdata[i];
    reset_block_left(f);
  }
  s->serial++;
  s->version = version;
  g_clear_pointer(&s->failure, g_free);
  s->state = STEP_OPEN;
  g_mutex_unlock(&s->lock);
  return TRUE;
}

typedef struct {
  WsyncSession *s;
  const guint8 *src;
  const Item *items;
  GMutex lock;
  GPtrArray *filled; /* Bucket* whose last byte this push wrote (caller sink) */
} Push;

/* The bytes a work item wrote, counted into the blocks of the checksum. */
typedef struct {
  OutFile *file;
  guint64 base;    /* the output tensor's offset in the file */
  guint64 block;   /* the block being counted */
  gint32 pending;  /* bytes written into it, not yet counted */
} Tally;

/* Counts the pending bytes; the item that completes a block hashes it, while the bytes
 * it wrote are still in its cache. */
static void
tally_flush(Tally *t)
{
  OutFile *f = t->file;

  /* the release orders this thread's writes before the count; the acquire of the thread
   * that reaches zero sees every thread's */
  if (t->pending > 0 &&
      __atomic_sub_fetch(&f->block_left[t->block], t->pending, __ATOMIC_ACQ_REL) == 0)
    f->block_sums[t->block] = block_sum(f->map, f->size, t->block);
  t->pending = 0;
}

static void
tally_run(gpointer data, guint64 offset, guint64 length)
{
  Tally *t = data;
  guint64 pos = t->base + offset;

  while (length > 0) {
    guint64 block = pos >> BLOCK_SHIFT, n = MIN(length, ((block + 1) << BLOCK_SHIFT) - pos);
    if (block != t->block) {
      tally_flush(t);
      t->block = block;
    }
    t->pending += (gint32)n;
    pos += n;
    length -= n;
  }
}

static void
run_item(gpointer data, guint index)
{
  Push *push = data;
  const Item *it = &push->items[index];
  const WsyncPlan *plan = push->s->plan;
  Op stack_ops[ITEM_OPS_ON_STACK];
  g_autofree Op *heap_ops = NULL;
  Op *ops = stack_ops;

  if (interrupted(push->s))
    return; /* push_input fails the step */
  /* the item's ops, whole, once: the slices below run each of them many times */
  if (it->n_targets > ITEM_OPS_ON_STACK)
    ops = heap_ops = g_new(Op, it->n_targets);
  for (guint k = 0; k < it->n_targets; k++)
    target_op(&it->targets[k], &ops[k]);
  /* caller sink: the item's rows of each op, then what they fill of its bucket */
  for (guint k = 0; k < it->n_targets; k++) {
    const Slot *slot = it->targets[k].slot;
    Bucket *bucket = slot->bucket;
    if (bucket == NULL)
      continue;
    copy_op(plan, &ops[k], it->from, it->to, push->src,
            bucket->data + (slot->offset - bucket->file_offset), slot->lt->dtype);
    gint64 bytes = (gint64)((it->to - it->from) * it->targets[k].row_bytes);
    if (__atomic_sub_fetch(&bucket->remaining, bytes, __ATOMIC_ACQ_REL) == 0) {
      g_mutex_lock(&push->lock);
      g_ptr_array_add(push->filled, bucket);
      g_mutex_unlock(&push->lock);
    }
  }
  /* directory sink: slice by slice, every op, then count each op's slice into the
   * checksum's blocks */
  for (guint64 from = it->from; from < it->to && !interrupted(push->s); from += it->slice) {
    guint64 to = MIN(from + it->slice, it->to);
    for (guint k = 0; k < it->n_targets; k++) {
      const Op *op = &ops[k];
      const Slot *slot = it->targets[k].slot;
      if (slot->bucket != NULL)
        continue;
      Tally t = {.file = slot->file, .base = slot->offset, .block = G_MAXUINT64};
      copy_op(plan, op, from, to, push->src, slot->file->map + slot->offset, slot->lt->dtype);
      copy_op_runs(op, from, to, slot->lt->dtype, tally_run, &t);
      tally_flush(&t);
    }
  }
}

/* Claims @in for the open step: checks, marks it pushed, opens the buckets it writes
 * into. */
static gboolean
claim_input(WsyncSession *s, Input *in, gsize nbytes, GError **error)
{
  g_autofree char *what = input_label(in);
  guint opening = 0;

  if (nbytes != in->nbytes) {
    WsyncDcpChunk buf;
    const WsyncDcpChunk *c = wsync_dcp_tensor_chunk(&in->d->g, in->chunk, &buf);
    g_autofree char *shape = wsync_shape_format(c->box.ndim, c->box.extent);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "push: %s: %" G_GSIZE_FORMAT " bytes, but it was described as %s %s (%"
                G_GUINT64_FORMAT " bytes)",
                what, nbytes, wsync_dtype_name(in->d->g.dtype), shape, in->nbytes);
    return FALSE;
  }
  g_autofree char *prefix = g_strconcat("push: ", what, NULL);
  g_mutex_lock(&s->lock);
  if (!check_step_open(s, prefix, error)) {
    g_mutex_unlock(&s->lock);
    return FALSE;
  }
  if (in->pushed == s->serial) {
    g_mutex_unlock(&s->lock);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "push: %s was already pushed in step %" G_GUINT64_FORMAT, what, s->version);
    return FALSE;
  }
  for (guint i = 0; in->buckets != NULL && i < in->buckets->len; i++)
    opening += !((Bucket *)in->buckets->pdata[i])->open;
  if (s->max_open_buckets > 0 && s->n_open + opening > s->max_open_buckets) {
    guint open = s->n_open;
    g_mutex_unlock(&s->lock);
    return usage_error(error,
                       "push: %s would open %u more buckets while %u are open "
                       "(max_open_buckets %u): push tensors that fill the open buckets first "
                       "(the manifest's order keeps one open per rank file)",
                       what, opening, open, s->max_open_buckets);
  }
  for (guint i = 0; in->buckets != NULL && i < in->buckets->len; i++) {
    Bucket *b = in->buckets->pdata[i];
    if (!b->open)
      open_bucket(s, b);
  }
  in->pushed = s->serial;
  g_mutex_unlock(&s->lock);
  return TRUE;
}

static gboolean
push_input(WsyncSession *s, Input *in, const void *data, gsize nbytes, GError **error)
{
  Push push = {.s = s, .src = data, .items = in->items};
  gboolean ok = TRUE;

  if (data == NULL && nbytes > 0)
    return usage_error(error, "push: tensor \"%s\": no data", in->d->g.name);
  if (!claim_input(s, in, nbytes, error))
    return FALSE;
  if (s->on_bucket != NULL) {
    push.filled = g_ptr_array_new();
    g_mutex_init(&push.lock);
  }
  team_run(s, run_item, &push, in->n_items);
  if (interrupted(s)) { /* its bytes are written in part: the step cannot complete */
    g_autofree char *what = input_label(in);
    g_autofree char *why = interruption(interrupted(s));
    GError *local = NULL; /* @error may be NULL: the step fails all the same */
    g_set_error(&local, WSYNC_ERROR, WSYNC_ERROR_IO, "push: %s: %s (abort the step)", what, why);
    set_failure(s, local);
    g_propagate_error(error, local);
    ok = FALSE;
  } else if (s->on_bucket != NULL)
    ok = deliver(s, push.filled, error);
  if (s->on_bucket != NULL) {
    g_mutex_clear(&push.lock);
    g_ptr_array_unref(push.filled);
  }
  return ok;
}

static gboolean
unknown_tensor(const char *name, GError **error)
{
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT, "push: tensor \"%s\" was not described",
              name);
  return FALSE;
}

gboolean
wsync_session_push(WsyncSession *s, const char *name, const void *data, gsize nbytes,
                   GError **error)
{
  g_return_val_if_fail(s != NULL && name != NULL, FALSE);
  Described *d = g_hash_table_lookup(s->by_name, name);

  if (!s->planned)
    return usage_error(error, "push: tensor \"%s\": the session has not planned (call "
                              "wsync_session_plan first)",
                       name);
  if (d == NULL)
    return unknown_tensor(name, error);
  if (d->sharded) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "push: tensor \"%s\" was described as %u shards: push each with "
                "wsync_session_push_shard",
                name, d->g.chunks->len);
    return FALSE;
  }
  return push_input(s, &g_array_index(s->inputs, Input, d->first_input), data, nbytes, error);
}

gboolean
wsync_session_push_shard(WsyncSession *s, const char *name, const guint64 *offsets,
                         const void *data, gsize nbytes, GError **error)
{
  g_return_val_if_fail(s != NULL && name != NULL, FALSE);
  Described *d = g_hash_table_lookup(s->by_name, name);

  if (!s->planned)
    return usage_error(error, "push: tensor \"%s\": the session has not planned (call "
                              "wsync_session_plan first)",
                       name);
  if (d == NULL)
    return unknown_tensor(name, error);
  if (!d->sharded) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "push: tensor \"%s\" was described whole: push it with wsync_session_push",
                name);
    return FALSE;
  }
  g_return_val_if_fail(offsets != NULL || d->g.ndim == 0, FALSE);
  for (guint c = 0; c < d->g.chunks->len; c++) {
    const WsyncBox *box = &g_array_index(d->g.chunks, WsyncDcpChunk, c).box;
    if (d->g.ndim == 0 || memcmp(box->offset, offsets, d->g.ndim * sizeof *offsets) == 0)
      return push_input(s, &g_array_index(s->inputs, Input, d->first_input + c), data, nbytes,
                        error);
  }
  GString *at = g_string_new("[");
  for (guint k = 0; k < d->g.ndim; k++)
    g_string_append_printf(at, "%s%" G_GUINT64_FORMAT, k ? ", " : "", offsets[k]);
  g_string_append_c(at, ']');
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
              "push: tensor \"%s\" has no shard described at offsets %s", name, at->str);
  g_string_free(at, TRUE);
  return FALSE;
}

/* The first input not pushed in the open step, and how many are missing. */
static const Input *
first_missing(WsyncSession *s, guint *n_missing)
{
  const Input *first = NULL;

  *n_missing = 0;
  for (guint i = 0; i < s->inputs->len; i++) {
    const Input *in = &g_array_index(s->inputs, Input, i);
    if (in->pushed == s->serial)
      continue;
    if (first == NULL)
      first = in;
    (*n_missing)++;
  }
  return first;
}

/* Caller sink: the buckets no push writes into (fills only, or empty tensors). */
static gboolean
deliver_unpushed(WsyncSession *s, GError **error)
{
  g_autoptr(GPtrArray) filled = g_ptr_array_new();

  g_mutex_lock(&s->lock);
  for (guint i = 0; i < s->buckets->len; i++) {
    Bucket *b = s->buckets->pdata[i];
    if (!b->delivered && !b->open && b->copy_bytes == 0) {
      open_bucket(s, b);
      g_ptr_array_add(filled, b);
    }
  }
  g_mutex_unlock(&s->lock);
  return deliver(s, filled, error);
}

gboolean
wsync_session_commit(WsyncSession *s, GError **error)
{
  g_return_val_if_fail(s != NULL, FALSE);
  guint n_missing;

  if (!s->planned)
    return usage_error(error, "commit: the session has not planned (call wsync_session_plan "
                              "first)");
  g_mutex_lock(&s->lock);
  gboolean open = check_step_open(s, "commit", error);
  g_mutex_unlock(&s->lock);
  if (!open)
    return FALSE;
  const Input *missing = first_missing(s, &n_missing);
  if (missing != NULL) {
    g_autofree char *what = input_label(missing);
    g_autofree char *more =
        n_missing > 1 ? g_strdup_printf(" (and %u more)", n_missing - 1) : g_strdup("");
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
                "commit: step %" G_GUINT64_FORMAT ": %s was not pushed%s", s->version, what,
                more);
    return FALSE;
  }
  /* a failure from here on fails the step, also when @error is NULL */
  GError *local = NULL;
  if (commit_interrupted(s, &local) || (s->on_bucket != NULL && !deliver_unpushed(s, &local)))
    return fail_step(s, local, error);
  for (guint i = 0; s->buckets != NULL && i < s->buckets->len; i++) {
    const Bucket *b = s->buckets->pdata[i];
    if (!b->delivered) { /* the plan proved every byte written: a bug if it happens */
      g_set_error(&local, WSYNC_ERROR, WSYNC_ERROR_FAILED,
                  "commit: step %" G_GUINT64_FORMAT ": the bucket of rank %u, %s at %"
                  G_GUINT64_FORMAT " is not filled",
                  s->version, b->rank, b->file->name, b->file_offset);
      return fail_step(s, local, error);
    }
  }
  if (s->out_dir != NULL && !commit_directory(s, &local))
    return fail_step(s, local, error);
  g_mutex_lock(&s->lock);
  s->state = STEP_CLOSED;
  g_mutex_unlock(&s->lock);
  return TRUE;
}

void
wsync_session_set_interrupt(WsyncSession *s, const volatile sig_atomic_t *flag)
{
  g_return_if_fail(s != NULL);
  s->interrupt = flag;
  wsync_plan_set_interrupt(s->plan, flag); /* wsync_session_plan() hears it too */
}

void
wsync_session_abort(WsyncSession *s)
{
  g_return_if_fail(s != NULL);

  g_mutex_lock(&s->lock);
  for (guint i = 0; s->buckets != NULL && i < s->buckets->len; i++)
    close_bucket(s, s->buckets->pdata[i]);
  g_clear_pointer(&s->failure, g_free);
  s->state = STEP_CLOSED;
  g_mutex_unlock(&s->lock);
}

void
wsync_session_free(WsyncSession *s)
{
  if (s == NULL)
    return;
  wsync_session_abort(s);
  stop_helpers(s);
  if (s->inputs)
    g_array_unref(s->inputs);
  if (s->buckets)
    g_ptr_array_unref(s->buckets);
  if (s->files)
    g_ptr_array_unref(s->files);
  if (s->slots)
    g_ptr_array_unref(s->slots);
  if (s->manifests)
    g_ptr_array_unref(s->manifests);
  wsync_plan_free(s->plan); /* before the described tensors its inputs point into */
  g_ptr_array_unref(s->described);
  g_hash_table_unref(s->by_name);
  g_free(s->digest);
  g_free(s->failure);
  g_free(s->config_path);
  g_free(s->out_dir);
  g_free(s->target);
  g_free(s->format);
  g_mutex_clear(&s->lock);
  g_mutex_clear(&s->deliver_lock);
  g_mutex_clear(&s->team_lock);
  g_cond_clear(&s->team_done);
  g_free(s);
}
