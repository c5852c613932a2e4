/* The Python module `_wsync`: what its files share.
 *
 * module.c    the module, wsync.Error, the commands as functions (convert, plan, merge,
 *             inspect), JSON to Python objects
 * buffer.c    the bytes of a Python object: the buffer protocol or DLPack, checked
 *             against a tensor's dtype and shape
 * load.c      the rollout side: a rank's files opened, checked against the commit
 *             record, copied into live buffers (load_rank's C half)
 * session.c   wsync.Session over the C session (include/wsync/session.h)
 */
#ifndef WSYNC_PYTHON_H
#define WSYNC_PYTHON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <wsync/wsync.h>

/* wsync.Error, created at import. */
extern PyObject *wsync_py_error;

/* Raises wsync.Error with @error's message (its exit_status attribute the exit status
 * the command would end with); returns NULL for `return wsync_py_raise(error);`. */
PyObject *wsync_py_raise(const GError *error);

/* wsync_py_raise() for a refusal of wsync_plan_args_resolve(), with the options it names
 * as the command spells them ("--tp", "--part-size") spoken as keyword arguments ("tp",
 * "part_size"). */
PyObject *wsync_py_raise_layout_args(const GError *error);

/* Raises wsync.Error with a formatted message and the exit status of @code. */
PyObject *wsync_py_raise_code(WsyncError code, const char *format, ...) G_GNUC_PRINTF(2, 3);

/* A context for a call: @conf_dir and @plugin_dir are None, a path, or a sequence of
 * paths (the --conf-dir / --plugin-dir of the command); NULL with an exception set. */
WsyncContext *wsync_py_context(PyObject *conf_dir, PyObject *plugin_dir);

/* Whether @obj is an integer argument: an int or anything with __index__ (numpy's
 * integers), but never a bool (Python's or numpy's): True is not rank 1, nor a size of 1.
 * The one test of every integer argument of the module. */
gboolean wsync_py_is_int(PyObject *obj);

/* A rank argument (load_rank, Session.manifest): wsync_py_is_int(), from 0.  FALSE with
 * TypeError (not an int) or wsync.Error (exit status 2: negative or too large) set,
 * naming @what. */
gboolean wsync_py_rank(PyObject *obj, const char *what, guint64 *rank);

/* An option of the commands and Session as the command line spells it, for
 * wsync_plan_args_resolve(): None (not given) -> NULL; a str as it is; with @number
 * (tp, ep, rank, threads, part_size) also any integer but a bool (numpy's: anything with
 * __index__), as its decimal text, whatever its size (the range check names it).  FALSE
 * with TypeError set naming @name. */
gboolean wsync_py_option_text(PyObject *obj, const char *name, gboolean number, char **out);

/* A count argument (max_open_buckets): any integer but a bool, at least 1; None (not
 * given) leaves @out 0.  FALSE with an exception set naming @name. */
gboolean wsync_py_count(PyObject *obj, const char *name, guint64 *out);

/* A size argument given directly (bucket_bytes): what the command line's sizes take
 * (wsync_parse_size(): "4K", "5G"), or any integer but a bool as its decimal text; None
 * (not given) leaves @out 0.  FALSE with an exception set naming @name: TypeError, or
 * the command's size error (exit status 2). */
gboolean wsync_py_size(PyObject *obj, const char *name, guint64 *out);

/* A step's version (Session.begin, load_rank, wsync_load): any integer but a bool
 * (numpy's too) or its decimal text (vLLM keeps weight versions as text), from 0 to
 * 2^64-1.  FALSE with wsync.Error (exit status 2) set naming the value. */
gboolean wsync_py_step_number(PyObject *obj, guint64 *out);

/* Runs @fn(@data) without the GIL, so that Ctrl-C is heard: on the main thread, @fn runs
 * on a thread of its own while this one runs Python's signal handlers every 50 ms; when one
 * raises (KeyboardInterrupt), *@stop is set to SIGINT, which @fn must poll, and once @fn
 * returned this returns FALSE with that exception set.  Elsewhere (no handler runs on
 * other threads) @fn runs here.  TRUE when no handler raised. */
gboolean wsync_py_run_interruptible(void (*fn)(gpointer data), gpointer data,
                                    volatile sig_atomic_t *stop);

/* A parsed JSON value as Python objects (dict, list, str, int, float, bool, None). */
PyObject *wsync_py_from_json(JsonNode *node);

/* A shape as a tuple of ints. */
PyObject *wsync_py_shape(guint ndim, const guint64 *shape);

/* ------------------------------------------------------------------ buffer.c */

/* The bytes of a Python object, held until wsync_py_bytes_release(). */
typedef struct {
  void *data;
  gsize nbytes;
  gboolean raw;         /* untyped bytes (bytes, bytearray, a flat uint8 buffer) */
  WsyncDtype dtype;     /* the element type, unless @raw */
  gsize itemsize;
  int ndim;             /* -1: flat (only the element count is known) */
  guint64 shape[WSYNC_MAX_DIMS];
  Py_buffer view;       /* when it came through the buffer protocol */
  gboolean has_view;
  PyObject *capsule;    /* when it came through DLPack */
} WsyncPyBytes;

/* Takes the bytes of @obj: a C-contiguous buffer (numpy array, memoryview, bytes), a
 * DLPack capsule or an object with __dlpack__ (a torch CPU tensor) in host memory.
 * @writable: the caller writes into it.  @what names it in errors ("tensor \"x\"").
 * Returns FALSE with wsync.Error set (device memory, not contiguous, read-only, an
 * element type the format cannot say). */
gboolean wsync_py_bytes_get(PyObject *obj, gboolean writable, const char *what,
                            WsyncPyBytes *out);

/* Checks that @b can hold a tensor of @dtype and @shape: the same element type (or, for
 * a type numpy lacks such as BF16, an integer type of the same size, or untyped bytes),
 * the same byte count, and the same shape unless @b is flat (1-D) and @exact_shape is
 * FALSE.  Returns FALSE with wsync.Error set. */
gboolean wsync_py_bytes_check(const WsyncPyBytes *b, WsyncDtype dtype, guint ndim,
                              const guint64 *shape, gboolean exact_shape, const char *what);

/* Releases what wsync_py_bytes_get() took (with the GIL held). */
void wsync_py_bytes_release(WsyncPyBytes *b);

/* Parses a safetensors dtype name ("BF16"); FALSE with wsync.Error set. */
gboolean wsync_py_dtype(PyObject *name, WsyncDtype *out);

/* Parses a shape (a sequence of ints, wsync_py_is_int(): no bools); FALSE with an
 * exception set. */
gboolean wsync_py_parse_shape(PyObject *seq, const char *what, guint *ndim, guint64 *shape);

/* ------------------------------------------------------------------ load.c */

extern PyTypeObject WsyncPyRankFilesType;
gboolean wsync_py_load_init_types(void);
/* _wsync._open_rank(dir, rank, *, require_commit, verify, version, digest, conf_dir,
 * plugin_dir) -> _RankFiles */
PyObject *wsync_py_open_rank(PyObject *self, PyObject *args, PyObject *kwargs);

/* ------------------------------------------------------------------ session.c */

extern PyTypeObject WsyncPySessionType;
/* Readies wsync.Session, wsync.ManifestEntry and wsync.Bucket and adds them to @module. */
gboolean wsync_py_session_init_types(PyObject *module);

#endif /* WSYNC_PYTHON_H */
