/* The Python module `_wsync` (imported by the package `wsync`): wsync.Error and the
 * commands as functions.  Every function releases the GIL while the library works. */
#define _GNU_SOURCE 1 /* sigabbrev_np(); pyconfig.h defines it so too */
#include "config.h"

#include <signal.h>
#include <string.h>

#include "wsync-python.h"

PyObject *wsync_py_error;

/* ------------------------------------------------------------------ errors */

static PyObject *
raise_message(int exit_status, const char *message)
{
  PyObject *exc = PyObject_CallFunction(wsync_py_error, "s", message);
  PyObject *status = PyLong_FromLong(exit_status);

  if (exc != NULL && status != NULL && PyObject_SetAttrString(exc, "exit_status", status) == 0)
    PyErr_SetObject(wsync_py_error, exc);
  Py_XDECREF(status);
  Py_XDECREF(exc);
  return NULL;
}

PyObject *
wsync_py_raise(const GError *error)
{
  return raise_message(wsync_error_exit_code(error), error->message);
}

PyObject *
wsync_py_raise_layout_args(const GError *error)
{
  static const char *const words[][2] = {
      {"no --target given", "no target given"}, {"--tp ", "tp "},         {"--ep ", "ep "},
      {"--threads ", "threads "},              {"--part-size ", "part_size "},
      {"--rank ", "rank "},
  };
  g_autoptr(GString) text = g_string_new(error->message);
  GError python = *error;

  for (guint i = 0; i < G_N_ELEMENTS(words); i++)
    if (g_str_has_prefix(text->str, words[i][0])) {
      g_string_replace(text, words[i][0], words[i][1], 1);
      break;
    }
  python.message = text->str;
  return wsync_py_raise(&python);
}

PyObject *
wsync_py_raise_code(WsyncError code, const char *format, ...)
{
  va_list args;
  g_autofree char *message = NULL;
  GError e = {.domain = WSYNC_ERROR, .code = code};

  va_start(args, format);
  message = g_strdup_vprintf(format, args);
  va_end(args);
  e.message = message;
  return wsync_py_raise(&e);
}

/* ------------------------------------------------------------------ arguments */

/* None, a path, or a sequence of paths -> a NULL-terminated array (NULL for None). */
static gboolean
path_list(PyObject *obj, const char *what, GStrv *out)
{
  g_autoptr(GStrvBuilder) b = g_strv_builder_new();
  PyObject *seq, *bytes = NULL;

  *out = NULL;
  if (obj == NULL || obj == Py_None)
    return TRUE;
  if (PyUnicode_Check(obj) || PyBytes_Check(obj) || PyObject_HasAttrString(obj, "__fspath__")) {
    if (!PyUnicode_FSConverter(obj, &bytes))
      return FALSE;
    g_strv_builder_add(b, PyBytes_AS_STRING(bytes));
    Py_DECREF(bytes);
    *out = g_strv_builder_end(b);
    return TRUE;
  }
  seq = PySequence_Fast(obj, "");
  if (seq == NULL) {
    PyErr_Format(PyExc_TypeError, "%s must be a path or a list of paths, not %.100s", what,
                 Py_TYPE(obj)->tp_name);
    return FALSE;
  }
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
    if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(seq, i), &bytes)) {
      Py_DECREF(seq);
      return FALSE;
    }
    g_strv_builder_add(b, PyBytes_AS_STRING(bytes));
    Py_DECREF(bytes);
  }
  Py_DECREF(seq);
  *out = g_strv_builder_end(b);
  return TRUE;
}

static void
warn_refused(const char *name, WsyncPluginState state, const char *path, const char *description,
             const char *reason, gpointer user_data)
{
  (void)path;
  (void)description;
  if (state == WSYNC_PLUGIN_REFUSED && *(int *)user_data == 0)
    *(int *)user_data = PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "wsync: plugin \"%s\" refused: %s",
                                         name, reason);
}

static void
warn_plugin(const char *plugin_name, const char *message, gpointer user_data)
{
  if (*(int *)user_data == 0)
    *(int *)user_data =
        PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "wsync: plugin \"%s\": %s", plugin_name, message);
}

WsyncContext *
wsync_py_context(PyObject *conf_dir, PyObject *plugin_dir)
{
  g_auto(GStrv) conf_dirs = NULL;
  g_auto(GStrv) plugin_dirs = NULL;
  g_autoptr(GError) error = NULL;
  WsyncContext *ctx;
  int failed = 0;

  if (!path_list(conf_dir, "conf_dir", &conf_dirs) ||
      !path_list(plugin_dir, "plugin_dir", &plugin_dirs))
    return NULL;
  Py_BEGIN_ALLOW_THREADS
  ctx = wsync_context_new_default((const char *const *)conf_dirs,
                                  (const char *const *)plugin_dirs, NULL, &error);
  Py_END_ALLOW_THREADS
  if (ctx == NULL) {
    wsync_py_raise(error);
    return NULL;
  }
  /* what the command prints on stderr, as Python warnings */
  wsync_context_foreach_plugin(ctx, warn_refused, &failed);
  wsync_context_foreach_warning(ctx, warn_plugin, &failed);
  if (failed) {
    wsync_context_free(ctx);
    return NULL;
  }
  return ctx;
}

gboolean
wsync_py_is_int(PyObject *obj)
{
  const char *type = Py_TYPE(obj)->tp_name;

  /* numpy.bool_ ("numpy.bool" from numpy 2) has __index__ too, deprecated */
  return !PyBool_Check(obj) && strcmp(type, "numpy.bool_") != 0 &&
         strcmp(type, "numpy.bool") != 0 && PyIndex_Check(obj);
}

gboolean
wsync_py_rank(PyObject *obj, const char *what, guint64 *rank)
{
  PyObject *index = wsync_py_is_int(obj) ? PyNumber_Index(obj) : NULL;

  if (index == NULL) {
    if (!PyErr_Occurred())
      PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", what,
                   Py_TYPE(obj)->tp_name);
    return FALSE;
  }
  *rank = PyLong_AsUnsignedLongLong(index);
  if (PyErr_Occurred()) {
    /* PyArg's "I" would wrap -1 to 4294967295 and 2**32 to rank 0, another rank's files */
    PyErr_Clear();
    PyObject *text = PyObject_Str(index);
    wsync_py_raise_code(WSYNC_ERROR_USAGE, "%s %s is not a rank (ranks are numbered from 0)",
                        what, text != NULL ? PyUnicode_AsUTF8(text) : "?");
    Py_XDECREF(text);
    Py_DECREF(index);
    return FALSE;
  }
  Py_DECREF(index);
  return TRUE;
}

gboolean
wsync_py_option_text(PyObject *obj, const char *name, gboolean number, char **out)
{
  PyObject *text = NULL;

  *out = NULL;
  if (obj == NULL || obj == Py_None)
    return TRUE;
  if (PyUnicode_Check(obj))
    text = Py_NewRef(obj);
  else if (number && wsync_py_is_int(obj)) {
    /* numpy's integers too; any size: the command's range check names the number */
    PyObject *index = PyNumber_Index(obj);
    text = index != NULL ? PyObject_Str(index) : NULL;
    Py_XDECREF(index);
  }
  if (text == NULL) {
    if (!PyErr_Occurred())
      PyErr_Format(PyExc_TypeError, number ? "%s must be an int or its text, not %.100s"
                                           : "%s must be a str, not %.100s",
                   name, Py_TYPE(obj)->tp_name);
    return FALSE;
  }
  const char *utf8 = PyUnicode_AsUTF8(text);
  if (utf8 != NULL)
    *out = g_strdup(utf8);
  Py_DECREF(text);
  return utf8 != NULL;
}

gboolean
wsync_py_count(PyObject *obj, const char *name, guint64 *out)
{
  PyObject *index;

  *out = 0;
  if (obj == NULL || obj == Py_None)
    return TRUE;
  if (!wsync_py_is_int(obj)) {
    PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", name, Py_TYPE(obj)->tp_name);
    return FALSE;
  }
  if ((index = PyNumber_Index(obj)) == NULL)
    return FALSE;
  *out = PyLong_AsUnsignedLongLong(index);
  Py_DECREF(index);
  if (PyErr_Occurred() || *out == 0) {
    PyErr_Clear();
    *out = 0;
    wsync_py_raise_code(WSYNC_ERROR_USAGE, "%s must be a number of at least 1", name);
    return FALSE;
  }
  return TRUE;
}

gboolean
wsync_py_size(PyObject *obj, const char *name, guint64 *out)
{
  g_autofree char *text = NULL;
  g_autoptr(GError) error = NULL;

  *out = 0;
  /* the text, then the command's own parser: "4K" and 4096 alike, and its message */
  if (!wsync_py_option_text(obj, name, TRUE, &text))
    return FALSE;
  if (text != NULL && !wsync_parse_size(name, text, out, &error)) {
    wsync_py_raise(error);
    return FALSE;
  }
  return TRUE;
}

gboolean
wsync_py_step_number(PyObject *obj, guint64 *out)
{
  if (PyUnicode_Check(obj)) {
    const char *text = PyUnicode_AsUTF8(obj);
    /* ASCII digits only: no sign, no space, no other script's digits */
    if (text != NULL && text[0] != '\0' && text[strspn(text, "0123456789")] == '\0' &&
        g_ascii_string_to_unsigned(text, 10, 0, G_MAXUINT64, out, NULL))
      return TRUE;
  } else if (wsync_py_is_int(obj)) {
    PyObject *index = PyNumber_Index(obj);
    if (index != NULL) {
      *out = PyLong_AsUnsignedLongLong(index);
      Py_DECREF(index);
      if (!PyErr_Occurred())
        return TRUE;
    }
  }
  PyErr_Clear();
  PyObject *shown = PyObject_Repr(obj);
  const char *text = shown != NULL ? PyUnicode_AsUTF8(shown) : NULL;
  PyErr_Clear();
  wsync_py_raise_code(WSYNC_ERROR_USAGE,
                      "version must be a step number (an int or its decimal text), not %s",
                      text != NULL ? text : Py_TYPE(obj)->tp_name);
  Py_XDECREF(shown);
  return FALSE;
}

static gboolean
path_arg(PyObject *obj, char **out)
{
  PyObject *bytes = NULL;

  if (!PyUnicode_FSConverter(obj, &bytes))
    return FALSE;
  *out = g_strdup(PyBytes_AS_STRING(bytes));
  Py_DECREF(bytes);
  return TRUE;
}

/* ------------------------------------------------------------------ JSON to Python */

static void
add_member(JsonObject *object, const char *name, JsonNode *node, gpointer user_data)
{
  PyObject *dict = user_data, *value;

  (void)object;
  if (PyErr_Occurred())
    return;
  value = wsync_py_from_json(node);
  if (value != NULL) {
    PyDict_SetItemString(dict, name, value);
    Py_DECREF(value);
  }
}

PyObject *
wsync_py_from_json(JsonNode *node)
{
  switch (json_node_get_node_type(node)) {
  case JSON_NODE_OBJECT: {
    PyObject *dict = PyDict_New();
    if (dict != NULL)
      json_object_foreach_member(json_node_get_object(node), add_member, dict);
    if (dict != NULL && PyErr_Occurred())
      Py_CLEAR(dict);
    return dict;
  }
  case JSON_NODE_ARRAY: {
    JsonArray *array = json_node_get_array(node);
    guint n = json_array_get_length(array);
    PyObject *list = PyList_New(n);
    for (guint i = 0; list != NULL && i < n; i++) {
      PyObject *item = wsync_py_from_json(json_array_get_element(array, i));
      if (item == NULL)
        Py_CLEAR(list);
      else
        PyList_SET_ITEM(list, i, item);
    }
    return list;
  }
  case JSON_NODE_NULL:
    Py_RETURN_NONE;
  case JSON_NODE_VALUE:
  default:
    break;
  }
  switch (json_node_get_value_type(node)) {
  case G_TYPE_INT64:
    return PyLong_FromLongLong(json_node_get_int(node));
  case G_TYPE_DOUBLE:
    return PyFloat_FromDouble(json_node_get_double(node));
  case G_TYPE_BOOLEAN:
    return PyBool_FromLong(json_node_get_boolean(node));
  case G_TYPE_STRING:
  default:
    {
    const char *text = json_node_get_string(node);
    return PyUnicode_FromString(text != NULL ? text : "");
  }
  }
}

PyObject *
wsync_py_shape(guint ndim, const guint64 *shape)
{
  PyObject *t = PyTuple_New(ndim);

  for (guint d = 0; t != NULL && d < ndim; d++) {
    PyObject *n = PyLong_FromUnsignedLongLong(shape[d]);
    if (n == NULL)
      Py_CLEAR(t);
    else
      PyTuple_SET_ITEM(t, d, n);
  }
  return t;
}

/* ------------------------------------------------------------------ the commands */

/* The layout options of plan and convert, as keyword arguments. */
typedef struct {
  PyObject *target, *format, *tp, *ep, *rank, *threads, *part_size, *conf_dir, *plugin_dir;
  PyObject *select; /* a DCP's --select KEY */
  PyObject *config; /* --config DIR: a path (str, bytes or os.PathLike) or None */
  int force; /* convert and merge: --force */
  char *text[9];
} LayoutKwargs;

static void
layout_kwargs_clear(LayoutKwargs *k)
{
  for (guint i = 0; i < G_N_ELEMENTS(k->text); i++)
    g_free(k->text[i]);
}

/* Resolves them as the command does (conf.d's sync { } fills what is not given). */
static gboolean
layout_options(WsyncContext *ctx, LayoutKwargs *k, WsyncPlanOptions *o)
{
  PyObject *given[] = {k->target, k->format, k->tp, k->ep, k->rank, k->threads, k->part_size};
  const char *names[] = {"target", "format", "tp", "ep", "rank", "threads", "part_size"};
  g_autoptr(GError) error = NULL;

  for (guint i = 0; i < G_N_ELEMENTS(given); i++)
    if (!wsync_py_option_text(given[i], names[i], i >= 2, &k->text[i]))
      return FALSE;
  WsyncPlanArgs args = {.target = k->text[0], .format = k->text[1], .tp = k->text[2],
                        .ep = k->text[3], .rank = k->text[4], .threads = k->text[5],
                        .part_size = k->text[6]};
  if (!wsync_plan_args_resolve(ctx, &args, o, &error)) {
    wsync_py_raise_layout_args(error);
    return FALSE;
  }
  if (!wsync_py_option_text(k->select, "select", FALSE, &k->text[7]))
    return FALSE;
  o->select = k->text[7];
  if (k->config != NULL && k->config != Py_None && !path_arg(k->config, &k->text[8]))
    return FALSE;
  o->config = k->text[8];
  return TRUE;
}

/* A plan made and run on a thread of its own, so that the calling thread hears Ctrl-C.
 * Python runs signal handlers in the main thread only, between bytecodes: a call that
 * held that thread in C for the minutes a whole model takes would hear Ctrl-C only once
 * DST was written.  `wsync convert` stops at the next piece of work and leaves DST as it
 * was (wsync_plan_set_interrupt(), README "SIGINT (Ctrl-C)..."); so does this. */
typedef struct {
  WsyncContext *ctx;
  const char *src, *dst;
  WsyncPlanOptions o;
  gboolean merge, force;
  volatile sig_atomic_t stop; /* set by the caller's thread when a handler raised */
  WsyncPlan *plan;
  GError *error;
  gboolean ok, done;
  GMutex lock;
  GCond finished;
} PlanJob;

static gpointer
plan_job_run(gpointer data)
{
  PlanJob *j = data;

  j->plan = j->merge ? wsync_plan_new_merge(j->ctx, j->src, &j->o, &j->error)
                     : wsync_plan_new(j->ctx, j->src, &j->o, &j->error);
  if (j->plan != NULL) {
    wsync_plan_set_interrupt(j->plan, &j->stop);
    j->ok = j->dst == NULL ||
            wsync_plan_execute(j->plan, j->dst, j->force ? WSYNC_EXECUTE_FORCE : WSYNC_EXECUTE_NONE,
                               &j->error);
  }
  g_mutex_lock(&j->lock);
  j->done = TRUE;
  g_cond_signal(&j->finished);
  g_mutex_unlock(&j->lock);
  return NULL;
}

#define SIGNAL_CHECK_US (50 * G_TIME_SPAN_MILLISECOND)

/* Which signal's handler raised the exception set by PyErr_CheckSignals(): Python does
 * not say, so it is found from the handlers (signal.getsignal()): the one whose code is
 * the frame the exception left (the first of its traceback), or, for a KeyboardInterrupt
 * without a traceback, the one whose handler is signal.default_int_handler (a C
 * function: no frame).  Any doubt (no match, several) gives the interrupt flag's -1:
 * the session's error then names no signal rather than a wrong one (SIGINT was recorded
 * whichever signal's handler raised). */
static const char raised_signal_source[] =
    "def raised_signal(kind, tb):\n"
    "    import signal\n"
    "    code = tb.tb_frame.f_code if tb is not None else None\n"
    "    if code is None and not issubclass(kind, KeyboardInterrupt):\n"
    "        return -1\n"
    "    found = set()\n"
    "    for number in signal.valid_signals():\n"
    "        try:\n"
    "            handler = signal.getsignal(number)\n"
    "        except (OSError, ValueError):\n"
    "            continue\n"
    "        if code is None:\n"
    "            if handler is signal.default_int_handler:\n"
    "                found.add(number)\n"
    "            continue\n"
    "        for f in (handler, getattr(handler, '__func__', None),\n"
    "                  getattr(getattr(handler, '__call__', None), '__func__', None)):\n"
    "            if getattr(f, '__code__', None) is code:\n"
    "                found.add(number)\n"
    "    return int(found.pop()) if len(found) == 1 else -1\n";

static int
raised_signal(void)
{
  static PyObject *finder;
  PyObject *type, *value, *tb, *found = NULL;
  int sig = -1;

  PyErr_Fetch(&type, &value, &tb);
  if (finder == NULL) {
    PyObject *globals = PyDict_New();
    PyObject *code = Py_CompileString(raised_signal_source, "<wsync>", Py_file_input);
    PyObject *done = globals && code ? PyEval_EvalCode(code, globals, globals) : NULL;
    if (done != NULL)
      finder = Py_XNewRef(PyDict_GetItemString(globals, "raised_signal"));
    Py_XDECREF(done);
    Py_XDECREF(code);
    Py_XDECREF(globals);
  }
  if (finder != NULL && type != NULL)
    found = PyObject_CallFunctionObjArgs(finder, type, tb != NULL ? tb : Py_None, NULL);
  if (found != NULL)
    sig = (int)PyLong_AsLong(found);
  if (sig == 0 || PyErr_Occurred())
    sig = -1;
  PyErr_Clear();
  Py_XDECREF(found);
  PyErr_Restore(type, value, tb);
  return sig;
}

/* Runs @j to its end, checking for signals every SIGNAL_CHECK_US, and once more when it
 * ended: a signal that came in its last moments (as DST was swapped in) is heard by this
 * call, which says what became of DST (explain_interruption()), rather than by the next
 * bytecode, which would say nothing.  Returns FALSE with the exception a signal handler
 * raised (KeyboardInterrupt) set: the run stopped, or, when the handler ran too late to
 * stop it, ended (j->ok says which). */
static gboolean
plan_job_wait(PlanJob *j)
{
  g_autoptr(GError) error = NULL;
  gboolean done, raised = FALSE;
  GThread *thread = g_thread_try_new("wsync-plan", plan_job_run, j, &error);

  if (thread == NULL) {
    wsync_py_raise_code(WSYNC_ERROR_IO, "cannot start a thread: %s", error->message);
    return FALSE;
  }
  do {
    Py_BEGIN_ALLOW_THREADS
    g_mutex_lock(&j->lock);
    if (!j->done)
      g_cond_wait_until(&j->finished, &j->lock, g_get_monotonic_time() + SIGNAL_CHECK_US);
    done = j->done;
    g_mutex_unlock(&j->lock);
    Py_END_ALLOW_THREADS
    if (!done && !raised && PyErr_CheckSignals() < 0) {
      raised = TRUE;
      j->stop = raised_signal(); /* the run stops; Python's exception is what the caller sees */
    }
  } while (!done);
  g_thread_join(thread);
  if (!raised && PyErr_CheckSignals() < 0) {
    raised = TRUE;
    j->stop = raised_signal(); /* too late to stop anything: only the message uses it */
  }
  return !raised;
}

/* What became of DST when a signal handler raised during convert or merge (@command),
 * the run stopped or not: as it was (the run failed, the interruption or its own
 * failure), or the new output, complete (the signal came after the swap: nothing could
 * stop it any more, wsync_plan_execute()).  The default handler's KeyboardInterrupt,
 * which has no text, gets this text; another handler's exception (a user's SIGTERM
 * handler) keeps its own and gets it as a note (Python 3.11's add_note(), where there
 * is one). */
static void
explain_interruption(const PlanJob *j, const char *command)
{
  const char *name = j->stop > 0 ? sigabbrev_np(j->stop) : NULL;
  g_autofree char *sig = name != NULL ? g_strdup_printf("SIG%s", name) : g_strdup("a signal");
  g_autofree char *text = NULL;
  PyObject *type, *value, *tb;

  if (j->ok)
    text = g_strdup_printf("%s: interrupted by %s as DST was swapped in: DST is the new output, "
                           "complete",
                           command, sig);
  else if (j->error != NULL && g_str_has_prefix(j->error->message, "interrupted by "))
    text = g_strdup_printf("%s: %s", command, j->error->message); /* "...; DST is as it was" */
  else if (j->error != NULL && g_str_has_prefix(j->error->message, "planning was interrupted "))
    text = g_strdup_printf("%s: %s: nothing was written; DST is as it was", command,
                           j->error->message);
  else
    text = g_strdup_printf("%s: interrupted by %s; the run had failed: %s", command, sig,
                           j->error != NULL ? j->error->message : "no reason given");
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  PyObject *args = value != NULL ? PyObject_GetAttrString(value, "args") : NULL;
  if (args != NULL && PyTuple_Check(args) && PyTuple_GET_SIZE(args) == 0 &&
      PyErr_GivenExceptionMatches(type, PyExc_KeyboardInterrupt)) {
    PyObject *explained = PyObject_CallFunction(type, "s", text);
    if (explained != NULL) {
      if (tb != NULL)
        PyException_SetTraceback(explained, tb);
      Py_SETREF(value, explained);
    }
  } else if (value != NULL) {
    PyObject *noted = PyObject_CallMethod(value, "add_note", "s", text);
    Py_XDECREF(noted);
  }
  PyErr_Clear(); /* what failed here leaves the handler's exception as it was */
  Py_XDECREF(args);
  PyErr_Restore(type, value, tb);
}

/* ------------------------------------------------------------------ calls that hear Ctrl-C */

typedef struct {
  void (*fn)(gpointer data);
  gpointer data;
  gboolean done;
  GMutex lock;
  GCond finished;
} Task;

static gpointer
task_run(gpointer data)
{
  Task *t = data;

  t->fn(t->data);
  g_mutex_lock(&t->lock);
  t->done = TRUE;
  g_cond_signal(&t->finished);
  g_mutex_unlock(&t->lock);
  return NULL;
}

/* Python runs signal handlers in the main thread only (signal module documentation:
 * "Python signal handlers are always executed in the main Python thread").  Asked at
 * each call, not kept: in a child forked from another thread, that thread is the main
 * one (threading.main_thread(), PyOS_AfterFork_Child), not the parent's main thread. */
static gboolean
on_main_thread(void)
{
  PyObject *threading = PyImport_ImportModule("threading");
  PyObject *main = threading ? PyObject_CallMethod(threading, "main_thread", NULL) : NULL;
  PyObject *ident = main ? PyObject_GetAttrString(main, "ident") : NULL;
  unsigned long main_ident = ident ? PyLong_AsUnsignedLong(ident) : 0;

  Py_XDECREF(ident);
  Py_XDECREF(main);
  Py_XDECREF(threading);
  PyErr_Clear();
  return main_ident != 0 && main_ident != (unsigned long)-1 &&
         PyThread_get_thread_ident() == main_ident;
}

gboolean
wsync_py_run_interruptible(void (*fn)(gpointer data), gpointer data,
                           volatile sig_atomic_t *stop)
{
  Task t = {.fn = fn, .data = data, .done = FALSE};
  gboolean raised = FALSE, done;
  GThread *thread = NULL;

  g_mutex_init(&t.lock);
  g_cond_init(&t.finished);
  /* A thread of its own, as plan_job_wait(), not one of a GThreadPool: a process forked
   * after a pool's thread went idle inherits the pool's count of idle threads but not the
   * threads, and its first call waited forever (a DataLoader or multiprocessing worker). */
  if (on_main_thread())
    thread = g_thread_try_new("wsync-call", task_run, &t, NULL);
  if (thread == NULL) { /* no signal handler runs on this thread, or none could start */
    Py_BEGIN_ALLOW_THREADS
    fn(data);
    Py_END_ALLOW_THREADS
    g_cond_clear(&t.finished);
    g_mutex_clear(&t.lock);
    return TRUE;
  }
  do {
    Py_BEGIN_ALLOW_THREADS
    g_mutex_lock(&t.lock);
    if (!t.done)
      g_cond_wait_until(&t.finished, &t.lock, g_get_monotonic_time() + SIGNAL_CHECK_US);
    done = t.done;
    g_mutex_unlock(&t.lock);
    Py_END_ALLOW_THREADS
    if (!done && !raised && PyErr_CheckSignals() < 0) {
      raised = TRUE;
      *stop = raised_signal(); /* the call stops; the handler's exception is what the caller
                                  sees, and a session's later error names the signal */
    }
  } while (!done);
  g_thread_join(thread);
  g_cond_clear(&t.finished);
  g_mutex_clear(&t.lock);
  return !raised;
}

/* Plans @src (and writes @dst when not NULL); returns the plan as `--json` prints it. */
static PyObject *
run_plan(PyObject *src_obj, PyObject *dst_obj, LayoutKwargs *k, gboolean merge)
{
  g_autofree char *src = NULL;
  g_autofree char *dst = NULL;
  PlanJob j = {0};
  PyObject *result = NULL;

  if (!path_arg(src_obj, &src) || (dst_obj != NULL && !path_arg(dst_obj, &dst)))
    return NULL;
  if ((j.ctx = wsync_py_context(k->conf_dir, k->plugin_dir)) == NULL)
    return NULL;
  if (layout_options(j.ctx, k, &j.o)) {
    j.o.interrupt = &j.stop; /* planning a whole model takes seconds: Ctrl-C stops it too */
    j.src = src;
    j.dst = dst;
    j.merge = merge;
    j.force = k->force;
    g_mutex_init(&j.lock);
    g_cond_init(&j.finished);
    if (plan_job_wait(&j)) {
      if (j.ok) {
        g_autoptr(JsonNode) root = wsync_plan_to_json(j.plan);
        result = wsync_py_from_json(root);
      } else
        wsync_py_raise(j.error);
    } else if (dst != NULL)
      explain_interruption(&j, merge ? "merge" : "convert");
    g_clear_error(&j.error);
    g_cond_clear(&j.finished);
    g_mutex_clear(&j.lock);
  }
  wsync_plan_free(j.plan);
  wsync_context_free(j.ctx);
  return result;
}

#define LAYOUT_KWLIST "target", "format", "tp", "ep", "rank", "threads", "part_size", \
                      "conf_dir", "plugin_dir", "select", "config"
#define LAYOUT_ADDRESSES(k) &(k).target, &(k).format, &(k).tp, &(k).ep, &(k).rank, &(k).threads, \
                            &(k).part_size, &(k).conf_dir, &(k).plugin_dir, &(k).select, \
                            &(k).config

/* The keywords convert(), plan() and merge() share, for their docstrings: every keyword a
 * function takes is named in its help() (tests/test-python.py checks it). */
#define PATHS_DOC \
"Paths are str, bytes or os.PathLike.\n"
#define SIZE_OPTIONS_DOC \
"  threads     worker threads, an int or its text, as --threads (default: the cores)\n" \
"  part_size   start a new file before a tensor that would pass it: an int or the\n" \
"              command's size text (\"5G\", the default; K, M, G, T), as --part-size\n"
#define CONFIG_OPTIONS_DOC \
"  conf_dir    a directory of *.conf (or a list of them) read in place of the installed\n" \
"              configuration, as --conf-dir: without it and without an installed one,\n" \
"              no plugin is selected\n" \
"  plugin_dir  a directory (or a list) searched first for plugins, as --plugin-dir\n" \
"              (one that is not a directory is refused, status 2)\n" \
"  select      of a sharded checkpoint (DCP): take the tensors directly under this\n" \
"              dotted key of the saved state dict, as --select\n" \
"  config      the directory of the model's config.json and tokenizer (or that\n" \
"              config.json), read in place of the source's own, as --config\n"
#define LAYOUT_OPTIONS_DOC \
"  target      the target layout, a str, as --target (\"vllm\")\n" \
"  format      one of the target's file formats, a str, as --format (\"kernel\")\n" \
"  tp, ep      tensor- and expert-parallel sizes, an int or its text, as --tp / --ep\n" \
"  rank        only this rank, an int or its text, as --rank (default: every rank)\n" \
SIZE_OPTIONS_DOC CONFIG_OPTIONS_DOC \
"Options left None come from the sync { } section of conf.d, then the command's\n" \
"defaults; a bool is refused where a number is expected.\n"

PyDoc_STRVAR(convert_doc,
"convert($module, src, dst, *, target=None, format=None, tp=None, ep=None, rank=None,\n"
"        threads=None, part_size=None, conf_dir=None, plugin_dir=None, select=None,\n"
"        config=None, force=False)\n"
"--\n\n"
"`wsync convert SRC DST`: writes the target layout of the checkpoint src into the\n"
"directory dst, atomically.  " PATHS_DOC "The keywords are the command's options:\n"
LAYOUT_OPTIONS_DOC
"  force       True: replace dst even when it is not wsync's output, as --force\n"
"Returns the plan as a dict, as `wsync convert --json` prints it.  Raises wsync.Error\n"
"with the command's message and exit_status.  Ctrl-C stops it at the next piece of work\n"
"with KeyboardInterrupt, whose text says what became of dst: as it was (while planning,\n"
"nothing written; later, the temporary directory removed), or, when the signal came as\n"
"the output was swapped in, the new output, complete.");

static PyObject *
py_convert(PyObject *self, PyObject *args, PyObject *kwargs)
{
  static char *kwlist[] = {"src", "dst", LAYOUT_KWLIST, "force", NULL};
  LayoutKwargs k = {0};
  PyObject *src, *dst, *result;

  (void)self;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|$OOOOOOOOOOOp:convert", kwlist, &src, &dst,
                                   LAYOUT_ADDRESSES(k), &k.force))
    return NULL;
  result = run_plan(src, dst, &k, FALSE);
  layout_kwargs_clear(&k);
  return result;
}

PyDoc_STRVAR(plan_doc,
"plan($module, src, *, target=None, format=None, tp=None, ep=None, rank=None, threads=None,\n"
"     part_size=None, conf_dir=None, plugin_dir=None, select=None, config=None)\n"
"--\n\n"
"`wsync plan SRC --json`: the plan of converting the checkpoint src, as a dict, without\n"
"writing.  " PATHS_DOC "The keywords are the command's options, as convert()'s:\n"
LAYOUT_OPTIONS_DOC
"Raises wsync.Error with the command's message and exit_status.");

static PyObject *
py_plan(PyObject *self, PyObject *args, PyObject *kwargs)
{
  static char *kwlist[] = {"src", LAYOUT_KWLIST, NULL};
  LayoutKwargs k = {0};
  PyObject *src, *result;

  (void)self;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$OOOOOOOOOOO:plan", kwlist, &src,
                                   LAYOUT_ADDRESSES(k)))
    return NULL;
  result = run_plan(src, NULL, &k, FALSE);
  layout_kwargs_clear(&k);
  return result;
}

PyDoc_STRVAR(merge_doc,
"merge($module, src, dst, *, part_size=None, threads=None, conf_dir=None, plugin_dir=None,\n"
"      select=None, config=None, force=False)\n"
"--\n\n"
"`wsync merge SRC DST`: consolidates the sharded training checkpoint (PyTorch DCP) src\n"
"into a plain Hugging Face checkpoint in the directory dst.\n" PATHS_DOC
"The keywords are the command's options:\n"
SIZE_OPTIONS_DOC CONFIG_OPTIONS_DOC
"  force       True: replace dst even when it is not wsync's output, as --force\n"
"Returns the plan as a dict, as `wsync merge --json` prints it.  Ctrl-C stops it as it\n"
"stops convert().");

static PyObject *
py_merge(PyObject *self, PyObject *args, PyObject *kwargs)
{
  static char *kwlist[] = {"src", "dst", "part_size", "threads", "conf_dir", "plugin_dir", "select",
                           "config", "force", NULL};
  LayoutKwargs k = {0};
  PyObject *src, *dst, *result, *hf, *one;

  (void)self;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|$OOOOOOp:merge", kwlist, &src, &dst,
                                   &k.part_size, &k.threads, &k.conf_dir, &k.plugin_dir, &k.select,
                                   &k.config, &k.force))
    return NULL;
  /* merge writes the layout the shards name: only part_size and threads apply (resolved
   * as convert resolves them); the target and sizes are placeholders it ignores. */
  hf = PyUnicode_FromString("hf");
  one = PyLong_FromLong(1);
  k.target = hf;
  k.tp = k.ep = one;
  result = hf && one ? run_plan(src, dst, &k, TRUE) : NULL;
  Py_XDECREF(hf);
  Py_XDECREF(one);
  layout_kwargs_clear(&k);
  return result;
}

PyDoc_STRVAR(inspect_doc,
"inspect($module, path, *, conf_dir=None, plugin_dir=None, select=None)\n"
"--\n\n"
"`wsync inspect PATH --json` as a dict: the tensors (name, dtype, shape, bytes, file) of\n"
"path, a safetensors file or a checkpoint directory (str, bytes or os.PathLike), with\n"
"totals, and each file's metadata; of a sharded training checkpoint (PyTorch DCP), its\n"
"logical tensors (global shapes), what merge skips and drops, and why it would refuse.\n"
"  conf_dir, plugin_dir  as convert()'s (--conf-dir, --plugin-dir)\n"
"  select      of a sharded checkpoint: as --select\n"
"Raises wsync.Error with the command's message and exit_status.");

static PyObject *
py_inspect(PyObject *self, PyObject *args, PyObject *kwargs)
{
  static char *kwlist[] = {"path", "conf_dir", "plugin_dir", "select", NULL};
  PyObject *path_obj, *conf_dir = NULL, *plugin_dir = NULL, *select_obj = NULL;
  PyObject *result = NULL;
  g_autofree char *path = NULL, *select = NULL;
  g_autoptr(GError) error = NULL;
  g_autoptr(JsonNode) root = NULL;
  WsyncCheckpoint *ck = NULL;
  WsyncContext *ctx;

  (void)self;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$OOO:inspect", kwlist, &path_obj, &conf_dir,
                                   &plugin_dir, &select_obj) ||
      !path_arg(path_obj, &path) || !wsync_py_option_text(select_obj, "select", FALSE, &select))
    return NULL;
  /* inspect needs no plugin, but a broken configuration is still an error, and rank
   * files are told apart by the targets of the configuration */
  if ((ctx = wsync_py_context(conf_dir, plugin_dir)) == NULL)
    return NULL;
  /* as `wsync inspect` (core/cmd-inspect.c): a sharded checkpoint through merge's reader */
  Py_BEGIN_ALLOW_THREADS
  if (wsync_sharded_checkpoint_detect(path))
    root = wsync_sharded_checkpoint_to_json(path, select, &error);
  else if (select != NULL)
    g_set_error(&error, WSYNC_ERROR, WSYNC_ERROR_USAGE,
                "--select applies to a sharded training checkpoint (PyTorch DCP), and %s is "
                "none", path);
  else if ((ck = wsync_context_open_checkpoint(ctx, path, &error)) != NULL)
    root = wsync_checkpoint_to_json(ck);
  Py_END_ALLOW_THREADS
  if (root != NULL)
    result = wsync_py_from_json(root);
  else
    wsync_py_raise(error);
  wsync_checkpoint_free(ck);
  wsync_context_free(ctx);
  return result;
}

/* ------------------------------------------------------------------ the module */

static PyMethodDef methods[] = {
    {"convert", (PyCFunction)(void (*)(void))py_convert, METH_VARARGS | METH_KEYWORDS, convert_doc},
    {"plan", (PyCFunction)(void (*)(void))py_plan, METH_VARARGS | METH_KEYWORDS, plan_doc},
    {"merge", (PyCFunction)(void (*)(void))py_merge, METH_VARARGS | METH_KEYWORDS, merge_doc},
    {"inspect", (PyCFunction)(void (*)(void))py_inspect, METH_VARARGS | METH_KEYWORDS, inspect_doc},
    {"_open_rank", (PyCFunction)(void (*)(void))wsync_py_open_rank, METH_VARARGS | METH_KEYWORDS,
     "_open_rank($module, dir, rank, *, require_commit=True, verify=True, version=None,\n"
     "           digest=None, conf_dir=None, plugin_dir=None)\n--\n\n"
     "The files of one rank, checked against the commit record (for wsync.load_rank)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_wsync",
    .m_doc = "The C half of the Python module wsync (import wsync instead).",
    .m_size = -1,
    .m_methods = methods,
};

PyDoc_STRVAR(error_doc,
"An error of wsync: the one-line message the command line would print, and\n"
"exit_status, the status the command would exit with (2 usage, configuration or\n"
"plugin; 3 bad input data; 4 I/O).");

PyMODINIT_FUNC
PyInit__wsync(void)
{
  PyObject *m = PyModule_Create(&module_def);

  if (m == NULL)
    return NULL;
  wsync_py_error = PyErr_NewExceptionWithDoc("wsync.Error", error_doc, NULL, NULL);
  if (wsync_py_error == NULL || PyModule_AddObjectRef(m, "Error", wsync_py_error) < 0 ||
      !wsync_py_load_init_types() ||
      PyModule_AddObjectRef(m, "_RankFiles", (PyObject *)&WsyncPyRankFilesType) < 0 ||
      !wsync_py_session_init_types(m) ||
      PyModule_AddStringConstant(m, "__version__", PACKAGE_VERSION) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
