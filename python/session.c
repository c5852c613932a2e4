/* wsync.Session: the C session (include/wsync/session.h) for a Python trainer.
 *
 * push() takes the bytes of the caller's object where they are (a numpy array, a
 * memoryview, bytes, a torch CPU tensor through DLPack), checks their element type and
 * size against the description, and hands them to wsync_session_push() without the
 * GIL, so that several Python threads push at once.  A read-write lock keeps describe,
 * begin, commit, abort and close (writers) apart from pushes and what reads the plan
 * (manifest, digest, world: readers), as the C session requires, and keeps close() from
 * freeing the session under any of them; it is taken without the GIL, since a push may
 * call the bucket callback, which takes the GIL.
 */
#include "config.h"

#include <string.h>

#include "wsync-python.h"

#include <wsync/session.h>

/* What describe() said of a tensor or of one of its shards, for push()'s checks. */
typedef struct {
  WsyncDtype dtype;
  guint ndim;
  guint64 shape[]; /* a shard's sizes, ndim of them (a whole model describes ~19k) */
} Described;

typedef struct {
  PyObject_HEAD
  WsyncContext *ctx;
  WsyncSession *session;
  GRWLock lock;
  PyObject *callback;   /* the caller sink, or NULL */
  GThread *in_callback; /* the thread running the callback (they never run at once), or NULL */
  GHashTable *described; /* "name", "name@o0,o1,..." or "name@*" (any shard) -> Described* */
  volatile sig_atomic_t stop; /* wsync_session_set_interrupt(): a push or commit heard Ctrl-C */
} SessionObject;

static PyTypeObject ManifestEntryType;
static PyTypeObject BucketType;

/* A push or commit of a callback sink, running on this thread: the exception its bucket
 * callback raised is kept here, for this call alone to raise.  A slot on the session
 * was shared by every call: a push on another thread that failed for its own reason (an
 * undescribed name), or because the step had failed meanwhile, took the exception, the
 * call whose callback raised it said only "bucket callback raised ...", and a second
 * callback's exception replaced the first's.  The callback runs on the thread of the
 * push or commit that filled its bucket (core/session.c deliver()), so the call is found
 * by thread; a stack, since a callback may push into another session. */
typedef struct StepCall {
  SessionObject *session;
  PyObject *raised; /* the callback's exception, or NULL */
  struct StepCall *outer;
} StepCall;

static _Thread_local StepCall *current_call;

static PyStructSequence_Field manifest_entry_fields[] = {
    {"name", "the tensor's name in the rank file (the target's name)"},
    {"dtype", "its safetensors dtype, e.g. \"BF16\""},
    {"shape", "its shape, a tuple"},
    {"file", "the rank file's base name"},
    {"offset", "the byte offset of its data in that file (header included)"},
    {"nbytes", "the size of its data"},
    {NULL, NULL}};

static PyStructSequence_Desc manifest_entry_desc = {
    "wsync.ManifestEntry", "One tensor of one destination rank and where it lives.",
    manifest_entry_fields, 6};

static PyStructSequence_Field bucket_fields[] = {
    {"version", "the step's version"},
    {"rank", "the destination rank"},
    {"file", "the rank file the bytes belong to"},
    {"file_offset", "where data[0] goes in that file"},
    {"data", "a read-only memoryview of the bytes, valid only during the callback"},
    {"entries", "the manifest slice it holds (ManifestEntry tuple), whole tensors"},
    {NULL, NULL}};

static PyStructSequence_Desc bucket_desc = {
    "wsync.Bucket",
    "A filled bucket of the caller sink: consecutive whole tensors of one rank file.",
    bucket_fields, 6};

static PyObject *
manifest_entry(const WsyncManifestEntry *e)
{
  PyObject *t = PyStructSequence_New(&ManifestEntryType);
  PyObject *items[6];

  if (t == NULL)
    return NULL;
  items[0] = PyUnicode_FromString(e->name);
  items[1] = PyUnicode_FromString(wsync_dtype_name(e->dtype));
  items[2] = wsync_py_shape(e->ndim, e->shape);
  items[3] = PyUnicode_FromString(e->file);
  items[4] = PyLong_FromUnsignedLongLong(e->offset);
  items[5] = PyLong_FromUnsignedLongLong(e->nbytes);
  for (int i = 0; i < 6; i++) {
    if (items[i] == NULL) {
      for (int j = i + 1; j < 6; j++)
        Py_XDECREF(items[j]);
      Py_DECREF(t);
      return NULL;
    }
    PyStructSequence_SET_ITEM(t, i, items[i]);
  }
  return t;
}

static PyObject *
manifest_entries(const WsyncManifestEntry *entries, guint n)
{
  PyObject *list = PyTuple_New(n);

  for (guint i = 0; list != NULL && i < n; i++) {
    PyObject *e = manifest_entry(&entries[i]);
    if (e == NULL)
      Py_CLEAR(list);
    else
      PyTuple_SET_ITEM(list, i, e);
  }
  return list;
}

/* ------------------------------------------------------------------ the caller sink */

/* The exporter of a bucket's bytes, counting the buffers it has handed out: every view
 * derived from bucket.data (a memoryview slice, numpy.frombuffer, torch.frombuffer)
 * holds one until it is gone, which tells whether any outlives the callback. */
typedef struct {
  PyObject_HEAD
  const guint8 *data;
  gsize nbytes;
  gboolean valid;
  Py_ssize_t exports;
} BucketDataObject;

static int
bucket_data_getbuffer(BucketDataObject *self, Py_buffer *view, int flags)
{
  if (!self->valid) {
    PyErr_SetString(PyExc_ValueError, "the bucket's memory was freed when its callback returned");
    return -1;
  }
  if (PyBuffer_FillInfo(view, (PyObject *)self, (void *)(self->data ? self->data : (const guint8 *)""),
                        (Py_ssize_t)self->nbytes, 1, flags) < 0)
    return -1;
  self->exports++;
  return 0;
}

static void
bucket_data_releasebuffer(BucketDataObject *self, Py_buffer *view)
{
  (void)view;
  self->exports--;
}

static PyBufferProcs bucket_data_as_buffer = {
    .bf_getbuffer = (getbufferproc)bucket_data_getbuffer,
    .bf_releasebuffer = (releasebufferproc)bucket_data_releasebuffer,
};

static PyTypeObject BucketDataType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_wsync._BucketData",
    .tp_basicsize = sizeof(BucketDataObject),
    .tp_dealloc = (destructor)PyObject_Del,
    .tp_as_buffer = &bucket_data_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A bucket's bytes, valid during its callback (internal).",
};

/* Takes the exception the callback raised: kept by the call that delivered the bucket,
 * which re-raises it as it is (raise_step_error()); its type and text also go into
 * @error, which another thread's call reports once the step has failed ("step 3 failed
 * (bucket of rank 0, ...: bucket callback raised ValueError: ...)").  With the GIL. */
static void
keep_callback_error(SessionObject *self, GError **error)
{
  PyObject *type, *value, *tb;
  StepCall *call = current_call;

  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb != NULL)
    PyException_SetTraceback(value, tb);
  PyObject *text = value != NULL ? PyObject_Str(value) : NULL;
  const char *utf8 = text != NULL ? PyUnicode_AsUTF8(text) : NULL;
  PyErr_Clear();
  g_autofree char *said = utf8 != NULL && *utf8 != '\0' ? g_strdup_printf(": %s", utf8) : g_strdup("");
  g_autofree char *line = wsync_printable(said);
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE, "bucket callback raised %s%s",
              ((PyTypeObject *)type)->tp_name, line);
  Py_XDECREF(text);
  while (call != NULL && call->session != self)
    call = call->outer;
  if (call != NULL && call->raised == NULL)
    call->raised = Py_XNewRef(value); /* the first: the session delivers no more after it */
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
}

/* Runs the Python callback on a bucket, in the pushing thread (which has released the
 * GIL).  The memoryview is released after the call: a view kept beyond it would point
 * at freed memory, so a callback that kept one (numpy.frombuffer of it, say) fails the
 * step rather than leave a dangling array unnoticed. */
static gboolean
on_bucket(const WsyncBucket *bucket, gpointer user_data, GError **error)
{
  SessionObject *self = user_data;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject *b = NULL, *view = NULL, *result = NULL, *released = NULL;
  BucketDataObject *exporter = PyObject_New(BucketDataObject, &BucketDataType);
  gboolean ok = FALSE;

  if (exporter != NULL) {
    exporter->data = bucket->data;
    exporter->nbytes = bucket->nbytes;
    exporter->valid = TRUE;
    exporter->exports = 0;
    view = PyMemoryView_FromObject((PyObject *)exporter);
  }
  b = view ? PyStructSequence_New(&BucketType) : NULL;
  if (b != NULL) {
    PyStructSequence_SET_ITEM(b, 0, PyLong_FromUnsignedLongLong(bucket->version));
    PyStructSequence_SET_ITEM(b, 1, PyLong_FromUnsignedLong(bucket->rank));
    PyStructSequence_SET_ITEM(b, 2, PyUnicode_FromString(bucket->file));
    PyStructSequence_SET_ITEM(b, 3, PyLong_FromUnsignedLongLong(bucket->file_offset));
    Py_INCREF(view);
    PyStructSequence_SET_ITEM(b, 4, view);
    PyStructSequence_SET_ITEM(b, 5, manifest_entries(bucket->entries, bucket->n_entries));
    for (int i = 0; i < 6; i++)
      if (PyStructSequence_GET_ITEM(b, i) == NULL)
        Py_CLEAR(b);
  }
  if (b != NULL) {
    self->in_callback = g_thread_self();
    result = PyObject_CallOneArg(self->callback, b);
    self->in_callback = NULL;
  }
  if (result == NULL && PyErr_Occurred())
    keep_callback_error(self, error);
  /* Whatever happened, the bytes are freed when we return: the view is released (a kept
   * Bucket's data then raises ValueError), the exporter refuses new buffers, and a
   * buffer still exported (an array or view made from bucket.data, kept) is an error
   * rather than an array over freed memory left unnoticed. */
  if (view != NULL) {
    released = PyObject_CallMethod(view, "release", NULL);
    if (released == NULL)
      PyErr_Clear();
  }
  if (exporter != NULL) {
    exporter->valid = FALSE;
    if (result != NULL && exporter->exports > 0)
      g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                  "bucket callback: a view or array of the data of the bucket of rank %u, %s at "
                  "offset %" G_GUINT64_FORMAT " is still referenced after the callback returned, "
                  "and its memory is freed now: copy what you keep (bytes(bucket.data))",
                  bucket->rank, bucket->file, bucket->file_offset);
    else
      ok = result != NULL;
  }
  Py_XDECREF(released);
  Py_XDECREF(result);
  Py_XDECREF(b);
  Py_XDECREF(view);
  Py_XDECREF(exporter);
  PyGILState_Release(gil);
  return ok;
}

/* wsync.Error from the C session's message, with the C functions and options it names
 * spoken as this module's methods and arguments. */
static PyObject *
session_raise(const GError *error)
{
  static const char *const words[][2] = {
      {"(call wsync_session_begin first)", "(call begin() first)"},
      {"(call wsync_session_plan first)", "(call describe() first)"},
      {"push each with wsync_session_push_shard", "push each with push(name, shard, offsets=...)"},
      {"push it with wsync_session_push", "push it without offsets"},
      {"(out_dir or on_bucket)", "(it was made with out=None: plan, digest and manifests only)"},
  };
  g_autoptr(GString) text = g_string_new(error->message);
  GError python = *error;

  for (guint i = 0; i < G_N_ELEMENTS(words); i++)
    g_string_replace(text, words[i][0], words[i][1], 0);
  python.message = text->str;
  return wsync_py_raise(&python);
}

/* Raises the exception a failed push or commit brought: the one its own bucket callback
 * raised (@raised, taken), else wsync.Error. */
static PyObject *
raise_step_error(PyObject *raised, const GError *error)
{
  if (raised != NULL) {
    PyErr_SetObject((PyObject *)Py_TYPE(raised), raised);
    Py_DECREF(raised);
    return NULL;
  }
  return session_raise(error);
}

/* ------------------------------------------------------------------ the object */

static gboolean
check_open(SessionObject *self)
{
  if (self->session == NULL) {
    wsync_py_raise_code(WSYNC_ERROR_USAGE, "the session is closed");
    return FALSE;
  }
  /* the push or commit that runs the callback holds the session's lock */
  if (self->in_callback == g_thread_self()) {
    wsync_py_raise_code(WSYNC_ERROR_USAGE, "the bucket callback cannot call the session");
    return FALSE;
  }
  return TRUE;
}

/* The session, locked for reading (unlock with g_rw_lock_reader_unlock()), or NULL with
 * wsync.Error "the session is closed" set.  The lock is waited for without the GIL (a
 * push holding it may be waiting for the GIL in its bucket callback).  The bucket
 * callback's thread holds it already (the push or commit that runs the callback): a
 * second read lock there could wait for ever behind a waiting writer, so it takes none
 * and *@locked says so. */
static WsyncSession *
lock_reading(SessionObject *self, gboolean *locked)
{
  *locked = self->in_callback != g_thread_self();
  if (*locked) {
    Py_BEGIN_ALLOW_THREADS
    g_rw_lock_reader_lock(&self->lock);
    Py_END_ALLOW_THREADS
  }
  if (self->session == NULL) {
    if (*locked)
      g_rw_lock_reader_unlock(&self->lock);
    *locked = FALSE;
    wsync_py_raise_code(WSYNC_ERROR_USAGE, "the session is closed");
    return NULL;
  }
  return self->session;
}

static void
unlock_reading(SessionObject *self, gboolean locked)
{
  if (locked)
    g_rw_lock_reader_unlock(&self->lock);
}

static void
close_session(SessionObject *self)
{
  WsyncSession *s = self->session;

  if (s == NULL)
    return;
  Py_BEGIN_ALLOW_THREADS
  g_rw_lock_writer_lock(&self->lock);
  self->session = NULL;
  wsync_session_free(s);
  g_rw_lock_writer_unlock(&self->lock);
  Py_END_ALLOW_THREADS
}

static int
session_traverse(SessionObject *self, visitproc visit, void *arg)
{
  Py_VISIT(self->callback);
  return 0;
}

static int
session_clear(SessionObject *self)
{
  close_session(self); /* no callback can run after this */
  Py_CLEAR(self->callback);
  return 0;
}

static void
session_dealloc(SessionObject *self)
{
  PyObject_GC_UnTrack(self);
  session_clear(self);
  g_clear_pointer(&self->ctx, wsync_context_free);
  g_clear_pointer(&self->described, g_hash_table_unref);
  g_rw_lock_clear(&self->lock);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
session_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
  SessionObject *self = (SessionObject *)type->tp_alloc(type, 0);

  (void)args;
  (void)kwargs;
  if (self != NULL) {
    g_rw_lock_init(&self->lock);
    self->described = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
  }
  return (PyObject *)self;
}

static int
session_init(SessionObject *self, PyObject *args, PyObject *kwargs)
{
  static char *kwlist[] = {"config_path", "target", "format", "tp", "ep", "out", "conf_dir",
                           "plugin_dir", "threads", "part_size", "bucket_bytes",
                           "max_open_buckets", NULL};
  PyObject *config_obj, *config_bytes = NULL, *out_bytes = NULL;
  PyObject *target = NULL, *format = NULL, *tp = NULL, *ep = NULL, *out = Py_None,
           *conf_dir = NULL, *plugin_dir = NULL, *threads = NULL, *part_size = NULL,
           *bucket_bytes = NULL, *max_open = NULL;
  char *text[6] = {NULL};
  g_autoptr(GError) error = NULL;
  WsyncPlanOptions o;
  WsyncSessionOptions so = {0};
  guint64 open_cap = 0;
  int status = -1;

  if (self->ctx != NULL) {
    PyErr_SetString(PyExc_RuntimeError, "a Session is initialised once");
    return -1;
  }
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$OOOOOOOOOOO:Session", kwlist, &config_obj,
                                   &target, &format, &tp, &ep, &out, &conf_dir, &plugin_dir,
                                   &threads, &part_size, &bucket_bytes, &max_open) ||
      !PyUnicode_FSConverter(config_obj, &config_bytes))
    return -1;
  if (!wsync_py_option_text(tp, "tp", TRUE, &text[0]) ||
      !wsync_py_option_text(ep, "ep", TRUE, &text[1]) ||
      !wsync_py_option_text(threads, "threads", TRUE, &text[2]) ||
      !wsync_py_option_text(part_size, "part_size", TRUE, &text[3]) ||
      !wsync_py_option_text(target, "target", FALSE, &text[4]) ||
      !wsync_py_option_text(format, "format", FALSE, &text[5]) ||
      !wsync_py_size(bucket_bytes, "bucket_bytes", &so.bucket_bytes) ||
      !wsync_py_count(max_open, "max_open_buckets", &open_cap))
    goto out;
  if (out != Py_None && PyCallable_Check(out)) {
    /* an __init__ called again after one that failed may have stored one already */
    Py_XSETREF(self->callback, Py_NewRef(out));
    so.on_bucket = on_bucket;
    so.user_data = self;
  } else if (out != Py_None && !PyUnicode_FSConverter(out, &out_bytes)) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "out is a directory or a callable taking a wsync.Bucket, not %.100s",
                 Py_TYPE(out)->tp_name);
    goto out;
  }
  if ((self->ctx = wsync_py_context(conf_dir, plugin_dir)) == NULL)
    goto out;
  /* the sync { } section of conf.d fills what is not given, as for the commands */
  WsyncPlanArgs given = {.target = text[4], .format = text[5], .tp = text[0], .ep = text[1],
                         .threads = text[2], .part_size = text[3]};
  if (!wsync_plan_args_resolve(self->ctx, &given, &o, &error)) {
    wsync_py_raise_layout_args(error);
    goto out;
  }
  so.target = o.target;
  so.format = o.format;
  so.tp = o.tp;
  so.ep = o.ep;
  so.threads = o.threads;
  so.part_size = o.part_size;
  so.max_open_buckets = (guint)MIN(open_cap, G_MAXUINT);
  so.out_dir = out_bytes != NULL ? PyBytes_AS_STRING(out_bytes) : NULL;
  const char *config_path = PyBytes_AS_STRING(config_bytes);
  Py_BEGIN_ALLOW_THREADS
  /* a config_path that is not there: "cannot open PATH: REASON", status 4, said by
   * wsync_session_new() itself, as the commands say it (README "Exit status") */
  self->session = wsync_session_new(self->ctx, config_path, &so, &error);
  Py_END_ALLOW_THREADS
  if (self->session == NULL)
    wsync_py_raise(error);
  else {
    self->stop = 0;
    wsync_session_set_interrupt(self->session, &self->stop);
    status = 0;
  }
out:
  if (status != 0)
    Py_CLEAR(self->callback); /* no session holds it: a failed __init__ keeps nothing */
  for (guint i = 0; i < G_N_ELEMENTS(text); i++)
    g_free(text[i]);
  Py_XDECREF(config_bytes);
  Py_XDECREF(out_bytes);
  return status;
}

/* "name" for a whole tensor, "name@o0,o1,..." for a shard.  A copy of its exact length:
 * a GString's buffer is rounded up (a whole model's keys would cost MiBs more). */
static char *
described_key(const char *name, guint ndim, const guint64 *offsets)
{
  g_autoptr(GString) key = g_string_new(name);

  if (offsets != NULL) {
    g_string_append_c(key, '@');
    for (guint d = 0; d < ndim; d++)
      g_string_append_printf(key, d ? ",%" G_GUINT64_FORMAT : "%" G_GUINT64_FORMAT, offsets[d]);
  }
  return g_strndup(key->str, key->len);
}

/* One item of describe(): (name, dtype, shape) or (name, dtype, shape, offsets,
 * global_shape). */
static gboolean describe_parsed(SessionObject *self, PyObject *name_obj, PyObject *dtype_obj,
                                PyObject *shape_obj, PyObject *offsets_obj, PyObject *global_obj);

static gboolean
describe_one(SessionObject *self, PyObject *item)
{
  PyObject *name_obj, *dtype_obj, *shape_obj, *offsets_obj = NULL, *global_obj = NULL;
  gboolean ok;

  if (!PyTuple_Check(item) && !PyList_Check(item)) {
    PyErr_SetString(PyExc_TypeError,
                    "describe() takes (name, dtype, shape) or (name, dtype, shape, offsets, "
                    "global_shape) items");
    return FALSE;
  }
  PyObject *tuple = PySequence_Tuple(item); /* owns what the borrowed references point to */
  ok = tuple != NULL && PyArg_ParseTuple(tuple, "UOO|OO:describe", &name_obj, &dtype_obj,
                                         &shape_obj, &offsets_obj, &global_obj);
  if (ok)
    ok = describe_parsed(self, name_obj, dtype_obj, shape_obj, offsets_obj, global_obj);
  Py_XDECREF(tuple);
  return ok;
}

static gboolean
describe_parsed(SessionObject *self, PyObject *name_obj, PyObject *dtype_obj, PyObject *shape_obj,
                PyObject *offsets_obj, PyObject *global_obj)
{
  guint64 shape[WSYNC_MAX_DIMS], offsets[WSYNC_MAX_DIMS], global[WSYNC_MAX_DIMS];
  guint ndim = 0, n_off = 0, n_global = 0;
  WsyncDtype dtype;
  g_autoptr(GError) error = NULL;
  const char *name;
  gboolean ok;

  if ((name = PyUnicode_AsUTF8(name_obj)) == NULL || !wsync_py_dtype(dtype_obj, &dtype) ||
      !wsync_py_parse_shape(shape_obj, name, &ndim, shape))
    return FALSE;
  if (offsets_obj != NULL) {
    if (global_obj == NULL) {
      PyErr_Format(PyExc_TypeError, "describe(): shard \"%s\" needs offsets and global_shape", name);
      return FALSE;
    }
    if (!wsync_py_parse_shape(offsets_obj, name, &n_off, offsets) ||
        !wsync_py_parse_shape(global_obj, name, &n_global, global))
      return FALSE;
    if (n_off != ndim || n_global != ndim) {
      wsync_py_raise_code(WSYNC_ERROR_BAD_INPUT,
                          "describe: shard of tensor \"%s\": shape, offsets and global_shape "
                          "have %u, %u and %u axes",
                          name, ndim, n_off, n_global);
      return FALSE;
    }
  }
  /* under the lock, as every call that changes the session: close() from another thread
   * would free it under the call */
  Py_BEGIN_ALLOW_THREADS
  g_rw_lock_writer_lock(&self->lock);
  if (self->session == NULL)
    ok = FALSE;
  else if (offsets_obj != NULL)
    ok = wsync_session_describe_shard(self->session, name, dtype, ndim, global, offsets, shape,
                                      &error);
  else
    ok = wsync_session_describe(self->session, name, dtype, ndim, shape, &error);
  g_rw_lock_writer_unlock(&self->lock);
  Py_END_ALLOW_THREADS
  if (!ok) {
    if (error != NULL)
      session_raise(error);
    else
      check_open(self);
    return FALSE;
  }
  Described *d = g_malloc0(sizeof *d + ndim * sizeof d->shape[0]);
  d->dtype = dtype;
  d->ndim = ndim;
  memcpy(d->shape, shape, ndim * sizeof shape[0]);
  g_hash_table_replace(self->described, described_key(name, ndim, offsets_obj ? offsets : NULL), d);
  if (offsets_obj != NULL) /* "name@*": its shards' axes, for push()'s offsets */
    g_hash_table_replace(self->described, g_strconcat(name, "@*", NULL),
                         g_memdup2(d, sizeof *d + ndim * sizeof d->shape[0]));
  return TRUE;
}

PyDoc_STRVAR(describe_doc,
"describe($self, tensors, /)\n--\n\n"
"Describes every tensor the trainer will push, then plans (once: as `wsync convert`\n"
"would from a checkpoint of these tensors).  Each item is (name, dtype, shape) with\n"
"Hugging Face names and safetensors dtypes (\"BF16\"), or, for one shard of a global\n"
"tensor (as DCP describes chunks), (name, dtype, shape, offsets, global_shape).  A\n"
"tensor the target needs and that is not described is refused, by name.  Ctrl-C (main\n"
"thread) stops it within a fraction of a second with KeyboardInterrupt; the session,\n"
"failed to plan, is then only good for close().");

/* describe()'s plan, run by wsync_py_run_interruptible(). */
typedef struct {
  SessionObject *self;
  gboolean ok;
  GError *error;
} PlanCall;

static void
plan_call_run(gpointer data)
{
  PlanCall *c = data;

  g_rw_lock_writer_lock(&c->self->lock);
  c->ok = c->self->session != NULL && wsync_session_plan(c->self->session, &c->error);
  g_rw_lock_writer_unlock(&c->self->lock);
}

/* Items between two checks for Ctrl-C while describe() reads them: a list's iterator
 * runs no bytecode, so Python's own checks would not come until the plan. */
#define ITEMS_PER_SIGNAL_CHECK 4096

static PyObject *
session_describe(SessionObject *self, PyObject *tensors)
{
  PyObject *it, *item;
  gboolean ok;
  guint64 n = 0;

  if (!check_open(self))
    return NULL;
  if ((it = PyObject_GetIter(tensors)) == NULL)
    return NULL;
  while ((item = PyIter_Next(it)) != NULL) {
    ok = describe_one(self, item) && (++n % ITEMS_PER_SIGNAL_CHECK != 0 || PyErr_CheckSignals() == 0);
    Py_DECREF(item);
    if (!ok) {
      Py_DECREF(it);
      return NULL;
    }
  }
  Py_DECREF(it);
  if (PyErr_Occurred())
    return NULL;
  /* planning a whole model takes seconds: Ctrl-C stops it (the core hears the session's
   * interrupt flag between the plan's phases), and the session has failed to plan */
  PlanCall call = {self, FALSE, NULL};
  gboolean heard = wsync_py_run_interruptible(plan_call_run, &call, &self->stop);
  g_autoptr(GError) error = call.error;
  if (!heard)
    return NULL; /* KeyboardInterrupt: the session failed to plan (make a new one) */
  if (!call.ok)
    return error ? session_raise(error) : (check_open(self), NULL);
  Py_RETURN_NONE;
}

static PyObject *
session_manifest(SessionObject *self, PyObject *arg)
{
  guint n = 0;
  guint64 rank;

  gboolean locked;
  WsyncSession *s;
  PyObject *list = NULL;

  if (!wsync_py_rank(arg, "manifest: rank", &rank) || !check_open(self) ||
      (s = lock_reading(self, &locked)) == NULL)
    return NULL;
  guint world = wsync_session_get_world(s);
  if (rank >= world) {
    if (world == 0)
      wsync_py_raise_code(WSYNC_ERROR_USAGE, "manifest: the session has not planned "
                                             "(describe() first)");
    else
      wsync_py_raise_code(WSYNC_ERROR_USAGE,
                          "manifest: rank %" G_GUINT64_FORMAT " is outside the %u ranks", rank,
                          world);
  } else {
    const WsyncManifestEntry *entries = wsync_session_get_manifest(s, (guint)rank, &n);
    PyObject *tuple = manifest_entries(entries, n);
    list = tuple ? PySequence_List(tuple) : NULL;
    Py_XDECREF(tuple);
  }
  unlock_reading(self, locked);
  return list;
}

static PyObject *
session_begin(SessionObject *self, PyObject *arg)
{
  g_autoptr(GError) error = NULL;
  guint64 version;
  gboolean ok;

  if (!wsync_py_step_number(arg, &version) || !check_open(self))
    return NULL;
  Py_BEGIN_ALLOW_THREADS
  g_rw_lock_writer_lock(&self->lock);
  self->stop = 0; /* a step interrupted before was aborted: begin refuses one still open */
  ok = self->session != NULL && wsync_session_begin(self->session, version, &error);
  g_rw_lock_writer_unlock(&self->lock);
  Py_END_ALLOW_THREADS
  if (!ok)
    return error ? session_raise(error) : (check_open(self), NULL);
  Py_RETURN_NONE;
}

/* A push or a commit, run without the GIL by run_step_call(). */
typedef struct {
  SessionObject *self;
  const char *name;
  const guint64 *offsets; /* NULL: a whole tensor */
  const WsyncPyBytes *b;
  gboolean ok;
  GError *error;
} PushCall;

static void
push_call_run(gpointer data)
{
  PushCall *c = data;
  WsyncSession *s;

  g_rw_lock_reader_lock(&c->self->lock);
  s = c->self->session;
  if (s == NULL)
    c->ok = FALSE;
  else if (c->offsets != NULL)
    c->ok = wsync_session_push_shard(s, c->name, c->offsets, c->b->data, c->b->nbytes,
                                     &c->error);
  else
    c->ok = wsync_session_push(s, c->name, c->b->data, c->b->nbytes, &c->error);
  g_rw_lock_reader_unlock(&c->self->lock);
}

typedef struct {
  SessionObject *self;
  gboolean ok;
  GError *error;
} CommitCall;

static void
commit_call_run(gpointer data)
{
  CommitCall *c = data;

  g_rw_lock_writer_lock(&c->self->lock);
  c->ok = c->self->session != NULL && wsync_session_commit(c->self->session, &c->error);
  g_rw_lock_writer_unlock(&c->self->lock);
}

/* A push of fewer bytes runs on the caller's thread: it is over in a few milliseconds,
 * and Ctrl-C is heard when it returns, while a thread of its own costs about 50 us a
 * call (10x a small push's own time: a second per step for the 19k tensors of a
 * 48-layer Qwen3-30B-A3B pushed one by one). */
#define INTERRUPTIBLE_BYTES (16u << 20)

/* Runs a push or commit without the GIL.  The directory sink's, on the main thread,
 * hear Ctrl-C (wsync_py_run_interruptible(), as convert and merge do) when they are
 * long (a commit, a push of @nbytes >= INTERRUPTIBLE_BYTES): a handler that raises
 * stops the call at its next piece of work and fails the step; FALSE then, with the
 * handler's exception set.  Short pushes and the caller sink's calls run here: its
 * callback runs Python on this thread, where the handlers run too (and torch's
 * per-thread state, the current device and stream, is the caller's). */
static gboolean
run_step_call(SessionObject *self, void (*fn)(gpointer data), gpointer data, gsize nbytes,
              PyObject **raised)
{
  StepCall call = {.session = self, .raised = NULL, .outer = current_call};

  *raised = NULL;
  if (self->callback == NULL && nbytes >= INTERRUPTIBLE_BYTES)
    return wsync_py_run_interruptible(fn, data, &self->stop);
  current_call = &call; /* the callback's exception is this call's (keep_callback_error()) */
  Py_BEGIN_ALLOW_THREADS
  fn(data);
  Py_END_ALLOW_THREADS
  current_call = call.outer;
  *raised = call.raised;
  return TRUE;
}

PyDoc_STRVAR(push_doc,
"push($self, name, tensor, offsets=None)\n--\n\n"
"Pushes the described tensor called name (or, with offsets, its shard described at them)\n"
"into the open step; returns when every destination byte that comes from it is written.\n"
"tensor is a C-contiguous buffer in host memory (numpy array, memoryview, bytes; a BF16\n"
"tensor as any 2-byte integer array) or a DLPack tensor (a torch CPU tensor, bfloat16\n"
"included), read where it is, without a copy and without the GIL.  Its element type,\n"
"byte count and (unless it is flat) shape must be the described ones.  Any order, any\n"
"thread.  A refused push writes nothing.  Ctrl-C (directory sink, main thread, a push\n"
"of 16 MiB or more) stops it with KeyboardInterrupt and fails the step: abort() it.");

static PyObject *
session_push(SessionObject *self, PyObject *args, PyObject *kwargs)
{
  static char *kwlist[] = {"name", "tensor", "offsets", NULL};
  const char *name;
  PyObject *obj, *offsets_obj = Py_None;
  guint64 offsets[WSYNC_MAX_DIMS];
  guint n_off = 0;
  WsyncPyBytes b;

  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sO|O:push", kwlist, &name, &obj, &offsets_obj) ||
      !check_open(self))
    return NULL;
  if (offsets_obj != Py_None && !wsync_py_parse_shape(offsets_obj, name, &n_off, offsets))
    return NULL;
  if (offsets_obj != Py_None) {
    /* the session reads as many offsets as the tensor has axes */
    g_autofree char *any_shard = g_strconcat(name, "@*", NULL);
    const Described *shard = g_hash_table_lookup(self->described, any_shard);
    if (shard != NULL && shard->ndim != n_off) {
      g_autofree char *given = wsync_shape_format(n_off, offsets);
      return wsync_py_raise_code(WSYNC_ERROR_BAD_INPUT,
                                 "push: tensor \"%s\": offsets %s have %u ax%s, but its shards "
                                 "have %u",
                                 name, given, n_off, n_off == 1 ? "is" : "es", shard->ndim);
    }
  }
  g_autofree char *what = g_strdup_printf("push: tensor \"%s\"", name);
  if (!wsync_py_bytes_get(obj, FALSE, what, &b)) {
    wsync_py_bytes_release(&b);
    return NULL;
  }
  /* an unknown name or shard is the session's to refuse, in its words */
  g_autofree char *key = described_key(name, n_off, offsets_obj != Py_None ? offsets : NULL);
  const Described *d = g_hash_table_lookup(self->described, key);
  if (d != NULL && !wsync_py_bytes_check(&b, d->dtype, d->ndim, d->shape, FALSE, what)) {
    wsync_py_bytes_release(&b);
    return NULL;
  }
  PushCall call = {self, name, offsets_obj != Py_None ? offsets : NULL, &b, FALSE, NULL};
  PyObject *raised;
  gboolean heard = run_step_call(self, push_call_run, &call, b.nbytes, &raised);
  wsync_py_bytes_release(&b);
  g_autoptr(GError) error_owned = call.error;
  if (!heard)
    return NULL; /* KeyboardInterrupt: the step failed (abort it) */
  if (!call.ok)
    return error_owned ? raise_step_error(raised, error_owned) : (check_open(self), NULL);
  Py_XDECREF(raised); /* none: a callback that raised fails the push */
  Py_RETURN_NONE;
}

static PyObject *
session_commit(SessionObject *self, PyObject *unused)
{
  (void)unused;
  if (!check_open(self))
    return NULL;
  CommitCall call = {self, FALSE, NULL};
  PyObject *raised;
  gboolean heard = run_step_call(self, commit_call_run, &call, G_MAXSIZE, &raised);
  g_autoptr(GError) error = call.error;
  if (!heard)
    return NULL; /* KeyboardInterrupt: no commit record was written (abort the step) */
  if (!call.ok)
    return error ? raise_step_error(raised, error) : (check_open(self), NULL);
  Py_XDECREF(raised); /* none: a callback that raised fails the commit */
  Py_RETURN_NONE;
}

static PyObject *
session_abort(SessionObject *self, PyObject *unused)
{
  (void)unused;
  if (!check_open(self))
    return NULL;
  Py_BEGIN_ALLOW_THREADS
  g_rw_lock_writer_lock(&self->lock);
  if (self->session != NULL)
    wsync_session_abort(self->session);
  g_rw_lock_writer_unlock(&self->lock);
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

static PyObject *
session_close(SessionObject *self, PyObject *unused)
{
  (void)unused;
  if (self->session != NULL && !check_open(self))
    return NULL;
  close_session(self);
  Py_RETURN_NONE;
}

static PyObject *
session_enter(SessionObject *self, PyObject *unused)
{
  (void)unused;
  Py_INCREF(self);
  return (PyObject *)self;
}

static PyObject *
session_exit(SessionObject *self, PyObject *args)
{
  (void)args;
  /* as close(): from the bucket callback, closing would wait for ever on the push
   * that runs it (it holds the session's lock) */
  if (self->session != NULL && !check_open(self))
    return NULL;
  close_session(self);
  Py_RETURN_FALSE;
}

static PyObject *
session_get_digest(SessionObject *self, void *closure)
{
  gboolean locked;
  WsyncSession *s;
  PyObject *result;

  (void)closure;
  if ((s = lock_reading(self, &locked)) == NULL)
    return NULL;
  const char *digest = wsync_session_get_digest(s);
  result = digest != NULL ? PyUnicode_FromString(digest) : Py_NewRef(Py_None);
  unlock_reading(self, locked);
  return result;
}

static PyObject *
session_get_world(SessionObject *self, void *closure)
{
  gboolean locked;
  WsyncSession *s;

  (void)closure;
  if ((s = lock_reading(self, &locked)) == NULL)
    return NULL;
  guint world = wsync_session_get_world(s);
  unlock_reading(self, locked);
  return PyLong_FromUnsignedLong(world);
}

static PyMethodDef session_methods[] = {
    {"describe", (PyCFunction)session_describe, METH_O, describe_doc},
    {"manifest", (PyCFunction)session_manifest, METH_O,
     "manifest($self, rank, /)\n--\n\n"
     "The rank's tensors in file order: a list of ManifestEntry (name, dtype, shape, file,\n"
     "offset, nbytes)."},
    {"begin", (PyCFunction)session_begin, METH_O,
     "begin($self, version, /)\n--\n\n"
     "Opens the step version (an int, numpy's too, or its decimal text).  The directory sink first removes the commit record, so\n"
     "that until commit() no reader takes the files for a complete step."},
    {"push", (PyCFunction)(void (*)(void))session_push, METH_VARARGS | METH_KEYWORDS, push_doc},
    {"commit", (PyCFunction)session_commit, METH_NOARGS,
     "commit($self, /)\n--\n\n"
     "Closes the step.  Refused, naming it, while a described tensor was not pushed\n"
     "(the step stays open: push it and commit again, or abort()).  The directory sink then\n"
     "writes the commit record, last; Ctrl-C (main thread) stops it before the record,\n"
     "with KeyboardInterrupt, and fails the step: abort() it."},
    {"abort", (PyCFunction)session_abort, METH_NOARGS,
     "abort($self, /)\n--\n\n"
     "Abandons the open step (needed after a failed push or commit of a sink)."},
    {"close", (PyCFunction)session_close, METH_NOARGS,
     "close($self, /)\n--\n\n"
     "Frees the session; the files stay, with the last commit record.  Closing again does\n"
     "nothing; any other call on a closed session raises wsync.Error."},
    {"__enter__", (PyCFunction)session_enter, METH_NOARGS,
     "__enter__($self, /)\n--\n\nReturns the session: `with wsync.Session(...) as s:` closes it at the end."},
    {"__exit__", (PyCFunction)session_exit, METH_VARARGS,
     "__exit__($self, exc_type, exc_value, traceback, /)\n--\n\nCloses the session (close())."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef session_getset[] = {
    {"digest", (getter)session_get_digest, NULL,
     "The plan digest (64 hex digits, docs/session.md), None before describe().", NULL},
    {"world", (getter)session_get_world, NULL, "The number of destination ranks.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyDoc_STRVAR(session_doc,
"Session(config_path, *, target=None, format=None, tp=None, ep=None, out=None,\n"
"        conf_dir=None, plugin_dir=None, threads=None, part_size=None,\n"
"        bucket_bytes=None, max_open_buckets=None)\n"
"--\n\n"
"A sync from a running trainer to the ranks of an engine: planned once from the\n"
"model's config.json, then fed the trainer's tensors every step:\n\n"
"    s = wsync.Session(\"config.json\", target=\"vllm\", format=\"kernel\", tp=4,\n"
"                      out=\"/dev/shm/weights\")\n"
"    s.describe((name, \"BF16\", t.shape) for name, t in weights.items())\n"
"    s.begin(step); [s.push(name, t) for name, t in weights.items()]; s.commit()\n\n"
"config_path: the model's config.json (str, bytes or os.PathLike).  The keywords are\n"
"`wsync convert`'s options, and the sink:\n"
"  target, format    the target layout and its file format, str (--target, --format)\n"
"  tp, ep            tensor- and expert-parallel sizes, an int or its text (--tp, --ep)\n"
"  out               the sink: a directory (the rank files `wsync convert` writes,\n"
"                    rewritten in place every step, and the commit record\n"
"                    wsync-commit.json written last at each commit), or a callable\n"
"                    receiving each filled wsync.Bucket (version, rank, file,\n"
"                    file_offset, data, entries) in the pushing thread, its data valid\n"
"                    only during the call; None: plan, digest and manifests only\n"
"  conf_dir          a directory of *.conf (or a list) read in place of the installed\n"
"                    configuration (--conf-dir); without it and without an installed\n"
"                    one, no plugin is selected\n"
"  plugin_dir        a directory (or a list) searched first for plugins (--plugin-dir)\n"
"  threads           threads that copy a pushed tensor, the pushing one among them: an\n"
"                    int or its text (--threads; default: one per core)\n"
"  part_size         start a new rank file before a tensor that would pass it: an int\n"
"                    or the command's size text (--part-size; default \"5G\")\n"
"  bucket_bytes      callable sink: a bucket holds whole tensors of one rank file, at\n"
"                    most this many bytes unless one tensor is larger: an int or a size\n"
"                    text as part_size's (default \"512M\")\n"
"  max_open_buckets  callable sink: refuse a push that would make more buckets open\n"
"                    (started, not yet filled) than this, an int (default: no cap)\n"
"Options left None come from conf.d's sync { } section, as for the commands; a bool\n"
"is refused where a number is expected.  Errors raise wsync.Error (an exception the\n"
"callback raised propagates as it is from the push or commit that ran it); after a\n"
"failed sink, abort() the step.");

PyTypeObject WsyncPySessionType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "wsync.Session",
    .tp_basicsize = sizeof(SessionObject),
    .tp_dealloc = (destructor)session_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = session_doc,
    .tp_traverse = (traverseproc)session_traverse,
    .tp_clear = (inquiry)session_clear,
    .tp_methods = session_methods,
    .tp_getset = session_getset,
    .tp_init = (initproc)session_init,
    .tp_new = session_new,
};

gboolean
wsync_py_session_init_types(PyObject *module)
{
  return PyType_Ready(&BucketDataType) == 0 &&
         PyStructSequence_InitType2(&ManifestEntryType, &manifest_entry_desc) == 0 &&
         PyStructSequence_InitType2(&BucketType, &bucket_desc) == 0 &&
         PyType_Ready(&WsyncPySessionType) == 0 &&
         PyModule_AddObjectRef(module, "Session", (PyObject *)&WsyncPySessionType) == 0 &&
         PyModule_AddObjectRef(module, "ManifestEntry", (PyObject *)&ManifestEntryType) == 0 &&
         PyModule_AddObjectRef(module, "Bucket", (PyObject *)&BucketType) == 0;
}
