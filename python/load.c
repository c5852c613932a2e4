/* The rollout side's C half (wsync.load_rank is the Python half): one rank's files,
 * checked against the session's commit record, mapped, and copied into live buffers.
 *
 * A directory a session writes holds, after each commit, the rank files and the commit
 * record `wsync-commit.json` (docs/session.md): the step's version, the plan digest, and
 * per file its rank, size and checksum (wsync_session_checksum()).  The session removes the record before it touches
 * the files of the next step, so a reader that finds the record before reading and the
 * same record after reading has read one whole step.  Rank files without a record (what
 * `wsync convert` writes) load when asked (require_commit=False); their rank is what the
 * targets of the configuration recognise in them, as when convert reads them back.
 *
 * The files are mapped private.  Another process may truncate a file under the map (a
 * session's next step, a careless cp): reading a page past the new end raises SIGBUS.
 * So the header is read into anonymous pages before it is parsed (pin_header), and the
 * tensors' bytes are only read behind wsync_run_guarded() (the checksum, copy, readinto),
 * which makes that an exception naming the file and the tensor.  torch copies from a
 * staging buffer readinto() filled, a piece at a time, never from the map.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wsync-python.h"

#include "../core/filekind.h"
#include "record.h"

#include <wsync/session.h>

#define COMMIT_RECORD WSYNC_SESSION_COMMIT_RECORD
#define MAX_RECORD_BYTES (64u << 20) /* far above any world's record; bounds the read */

/* ------------------------------------------------------------------ one mapped file */

/* A rank file mapped private (its bytes are read only behind wsync_run_guarded()). */
typedef struct {
  PyObject_HEAD
  char *path;
  guint8 *data;
  gsize len;
  WsyncSafetensors *st; /* parsed from @data */
} MapObject;

static void
map_dealloc(MapObject *m)
{
  wsync_safetensors_free(m->st);
  if (m->data != NULL)
    munmap(m->data, m->len);
  g_free(m->path);
  Py_TYPE(m)->tp_free((PyObject *)m);
}

static PyTypeObject MapType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_wsync._Map",
    .tp_basicsize = sizeof(MapObject),
    .tp_dealloc = (destructor)map_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A rank file mapped copy-on-write (internal).",
};

/* What a read of a rank file whose end went missing says (as `wsync convert` and
 * `wsync verify` say it, core/rankfile.c rank_item_run): exit status 4. */
static void
set_shrunk_error(GError **error, const char *path, const char *tensor)
{
  g_autofree char *file = wsync_printable(path);

  if (tensor == NULL) {
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_IO,
                "cannot read %s: the file shrank while wsync was reading it", file);
    return;
  }
  g_autofree char *name = wsync_printable(tensor);
  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_IO,
              "cannot read %s: the file shrank while wsync was reading it (tensor \"%s\")", file,
              name);
}

/* Puts the pages of the header (its length, its JSON) in anonymous memory over the
 * map, read with pread(2): the parser, which allocates and so cannot run behind
 * wsync_run_guarded(), then never touches the file's pages, and a file truncated
 * meanwhile (the mapped pages past its end would raise SIGBUS) is an error here. */
static gboolean
pin_header(MapObject *m, int fd, GError **error)
{
  gsize page = (gsize)sysconf(_SC_PAGESIZE), want, done = 0;
  guint8 prefix[8];
  guint64 n;

  ssize_t got;

  do
    got = pread(fd, prefix, sizeof prefix, 0);
  while (got < 0 && errno == EINTR);
  if (got < 0) { /* a failed read is not a shorter file */
    wsync_set_io_error(error, errno, m->path, "read");
    return FALSE;
  }
  if (got != (ssize_t)sizeof prefix) { /* map_file saw at least 8 bytes */
    set_shrunk_error(error, m->path, NULL);
    return FALSE;
  }
  memcpy(&n, prefix, sizeof n);
  n = GUINT64_FROM_LE(n);
  want = n >= m->len - 8 ? m->len : (gsize)(8 + n); /* too long: the parser says so */
  want = MIN((want + page - 1) / page * page, m->len);
  if (mmap(m->data, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
           0) == MAP_FAILED) {
    wsync_set_io_error(error, errno, m->path, "map");
    return FALSE;
  }
  while (done < want) {
    ssize_t k = pread(fd, m->data + done, want - done, (off_t)done);
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0) {
      wsync_set_io_error(error, errno, m->path, "read");
      return FALSE;
    }
    if (k == 0) {
      set_shrunk_error(error, m->path, NULL);
      return FALSE;
    }
    done += (gsize)k;
  }
  return TRUE;
}

/* A rank file that is not a regular file (of mode @mode), in the C reader's words
 * (core/safetensors.c, open). */
static gboolean
refuse_not_regular(const char *path, mode_t mode, GError **error)
{
  g_autofree char *file = wsync_printable(path);

  g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT, "%s: %s", file,
              S_ISDIR(mode) ? "is a directory, not a safetensors file" : "not a regular file");
  return FALSE;
}

/* Maps and parses @path (without the GIL); NULL with @error set. */
static gboolean
map_file(MapObject *m, GError **error)
{
  struct stat sb;
  const char *special;
  /* a FIFO in a rank file's place must not hang the load, and a socket, which open(2)
   * refuses, is refused as a FIFO is, not "No such device or address", status 4: the
   * path is stat()ed and judged first, then opened and fstat()ed, and a file swapped in
   * between is not read (core/filekind.h) */
  int fd = wsync_file_open_input(m->path, &sb, &special);
  gboolean ok;

  if (fd < 0 && special != NULL)
    return refuse_not_regular(m->path, sb.st_mode, error);
  if (fd < 0) {
    wsync_set_io_error(error, errno, m->path, "open");
    return FALSE;
  }
  if (!S_ISREG(sb.st_mode)) {
    close(fd);
    return refuse_not_regular(m->path, sb.st_mode, error);
  }
  if (sb.st_size < 8) {
    /* a file that was always too short is bad input, not one that shrank: the C reader
     * says so in its own words (core/safetensors.c check_header_length), from the length
     * alone, before it reads a byte */
    static const guint8 none[8];
    close(fd);
    wsync_safetensors_free(wsync_safetensors_parse(none, (gsize)sb.st_size, m->path, error));
    return FALSE;
  }
  m->data = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  if (m->data == MAP_FAILED) {
    m->data = NULL;
    wsync_set_io_error(error, errno, m->path, "map");
    close(fd);
    return FALSE;
  }
  m->len = (gsize)sb.st_size;
  ok = pin_header(m, fd, error);
  close(fd);
  if (!ok)
    return FALSE;
  m->st = wsync_safetensors_parse(m->data, m->len, m->path, error);
  return m->st != NULL;
}

/* The tensor of @st whose bytes hold @address, or NULL (the header). */
static const WsyncTensor *
tensor_at(const WsyncSafetensors *st, const void *address)
{
  for (guint i = 0; st != NULL && i < wsync_safetensors_n_tensors(st); i++) {
    const WsyncTensor *t = wsync_safetensors_tensor(st, i);
    if ((const guint8 *)address >= t->data && (const guint8 *)address < t->data + t->nbytes)
      return t;
  }
  return NULL;
}

/* ------------------------------------------------------------------ the record */

/* (parsed by record.c) */

/* Reads all of @fd, the record @path, of @size bytes when it was opened. */
static gboolean
record_read_fd(int fd, const char *path, off_t size, char **text, gsize *len, GError **error)
{
  GString *buf = g_string_new(NULL);
  char chunk[65536];

  for (;;) {
    if (size > MAX_RECORD_BYTES || buf->len > MAX_RECORD_BYTES) { /* (or grew past it) */
      wsync_fail_at(error, WSYNC_ERROR_BAD_INPUT, path,
                    "%lld bytes, more than a commit record can be",
                    (long long)MAX(size, (off_t)buf->len));
      g_string_free(buf, TRUE);
      return FALSE;
    }
    ssize_t k = read(fd, chunk, sizeof chunk);
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0) {
      wsync_set_io_error(error, errno, path, "read");
      g_string_free(buf, TRUE);
      return FALSE;
    }
    if (k == 0)
      break;
    g_string_append_len(buf, chunk, (gsize)k);
  }
  *len = buf->len;
  *text = g_string_free(buf, FALSE);
  return TRUE;
}

/* Reads the record's bytes; FALSE with @error unset when there is none. */
static gboolean
record_read(const char *path, char **text, gsize *len, GError **error)
{
  struct stat sb;
  const char *special;

  *text = NULL;
  /* stat()ed and judged, then opened and fstat()ed (core/filekind.h): a stat() before
   * g_file_get_contents(), whose open(2) blocks, hung load_rank for ever on a FIFO put
   * in place of the record between the two; a FIFO, a socket or a directory here is
   * refused as map_file() refuses a rank file */
  int fd = wsync_file_open_input(path, &sb, &special);
  if (fd < 0 && special == NULL) {
    if (errno != ENOENT)
      wsync_set_io_error(error, errno, path, "read");
    return FALSE;
  }
  if (fd < 0 || !S_ISREG(sb.st_mode)) {
    g_autofree char *file = wsync_printable(path);
    g_set_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT, "%s: not a regular file", file);
    if (fd >= 0)
      close(fd);
    return FALSE;
  }
  gboolean ok = record_read_fd(fd, path, sb.st_size, text, len, error);
  close(fd);
  return ok;
}

/* A mistyped or vanished directory is an error of its own, not "no step is complete",
 * which a reader would wait on for ever. */
static gboolean
directory_exists(const char *dir, GError **error)
{
  struct stat sb;
  int errsv = stat(dir, &sb) < 0 ? errno : S_ISDIR(sb.st_mode) ? 0 : ENOTDIR;

  if (errsv != 0)
    wsync_set_io_error(error, errsv, dir, "open");
  return errsv == 0;
}

/* ------------------------------------------------------------------ the rank's files */

typedef struct {
  PyObject_HEAD
  char *dir;
  guint64 rank; /* as given (any rank beyond a world's is refused by name, not wrapped) */
  char *record_text; /* NULL: no record (require_commit=False) */
  gsize record_len;
  Record record;
  GPtrArray *maps;      /* MapObject* (owned references) */
  GPtrArray *tensors;   /* const WsyncTensor*, file order then data order */
  GPtrArray *tensor_map; /* the MapObject* of each tensor */
} RankFilesObject;

static void
rank_files_dealloc(RankFilesObject *self)
{
  if (self->maps != NULL)
    for (guint i = 0; i < self->maps->len; i++)
      Py_DECREF((PyObject *)self->maps->pdata[i]);
  g_clear_pointer(&self->maps, g_ptr_array_unref);
  g_clear_pointer(&self->tensors, g_ptr_array_unref);
  g_clear_pointer(&self->tensor_map, g_ptr_array_unref);
  record_clear(&self->record);
  g_free(self->record_text);
  g_free(self->dir);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The files of the rank the record lists, with their sizes checked. */
static gboolean
record_files_of_rank(RankFilesObject *self, GPtrArray *paths, GPtrArray *want, GError **error)
{
  g_autofree char *record_path = g_build_filename(self->dir, COMMIT_RECORD, NULL);

  if (self->rank >= self->record.world) {
    return wsync_fail_at(error, WSYNC_ERROR_USAGE, record_path,
                         "rank %" G_GUINT64_FORMAT " is outside the %" G_GUINT64_FORMAT
                         " ranks of the commit record",
                         self->rank, self->record.world);
  }
  for (guint i = 0; i < self->record.files->len; i++) {
    RecordFile *f = self->record.files->pdata[i];
    if (f->rank == self->rank) {
      g_ptr_array_add(paths, g_build_filename(self->dir, f->file, NULL));
      g_ptr_array_add(want, f);
    }
  }
  if (paths->len == 0)
    return wsync_fail_at(error, WSYNC_ERROR_BAD_INPUT, record_path,
                         "the commit record lists no file of rank %" G_GUINT64_FORMAT,
                         self->rank);
  return TRUE;
}

static gint
compare_names(gconstpointer a, gconstpointer b)
{
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Without a record: the *.safetensors files a target of @ctx recognises as the rank's. */
static gboolean
recognised_files_of_rank(RankFilesObject *self, WsyncContext *ctx, GPtrArray *paths,
                         GError **error)
{
  g_autoptr(GDir) d = NULL;
  g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
  const char *name;

  if ((d = g_dir_open(self->dir, 0, NULL)) == NULL) {
    wsync_set_io_error(error, errno, self->dir, "open");
    return FALSE;
  }
  while ((name = g_dir_read_name(d)) != NULL)
    if (g_str_has_suffix(name, ".safetensors"))
      g_ptr_array_add(names, g_strdup(name));
  g_ptr_array_sort(names, compare_names);
  for (guint i = 0; i < names->len; i++) {
    g_autofree char *path = g_build_filename(self->dir, names->pdata[i], NULL);
    g_autoptr(WsyncSafetensors) st = wsync_safetensors_open(path, error);
    WsyncRankFile rf = {0};
    if (st == NULL)
      return FALSE;
    if (wsync_context_recognise_file(ctx, names->pdata[i], wsync_safetensors_metadata(st), NULL,
                                     &rf, error)) {
      if (rf.rank == self->rank)
        g_ptr_array_add(paths, g_steal_pointer(&path));
    } else if (error != NULL && *error != NULL)
      return FALSE;
  }
  if (paths->len == 0)
    return wsync_fail_at(error, WSYNC_ERROR_BAD_INPUT, self->dir,
                         "no rank file of rank %" G_GUINT64_FORMAT " (no commit record; the "
                         "targets of the configuration recognise no file of that rank)",
                         self->rank);
  return TRUE;
}

typedef struct {
  const MapObject *m;
  guint64 sum;
} Checksum;

static void
checksum_run(gpointer data)
{
  Checksum *c = data;

  /* (its block sums, allocated before the first read, are lost if a read faults) */
  c->sum = wsync_session_checksum(c->m->data, c->m->len);
}

static gboolean
verify_file(MapObject *m, const RecordFile *f, GError **error)
{
  Checksum c = {m, 0};
  const void *address = NULL;

  if (!wsync_run_guarded(checksum_run, &c, &address)) {
    const WsyncTensor *t = tensor_at(m->st, address);
    set_shrunk_error(error, m->path, t != NULL ? t->name : NULL);
    return FALSE;
  }
  g_autofree char *hex = g_strdup_printf("%016" G_GINT64_MODIFIER "x", c.sum);

  if (g_ascii_strcasecmp(hex, f->checksum) != 0)
    return wsync_fail_at(error, WSYNC_ERROR_BAD_INPUT, m->path,
                         "checksum %s, but the commit record says %s (the file changed after "
                         "its commit)",
                         hex, f->checksum);
  return TRUE;
}

/* Maps @paths (checking size and, with @verify, the checksum against @want), lists the
 * tensors. */
static gboolean
map_rank_files(RankFilesObject *self, GPtrArray *paths, GPtrArray *want, gboolean verify,
               GError **error)
{
  g_autoptr(GHashTable) seen = g_hash_table_new(g_str_hash, g_str_equal);

  for (guint i = 0; i < paths->len; i++) {
    MapObject *m = (MapObject *)self->maps->pdata[i];
    const RecordFile *f = want != NULL ? want->pdata[i] : NULL;
    if (!map_file(m, error))
      return FALSE;
    if (f != NULL && m->len != f->bytes)
      return wsync_fail_at(error, WSYNC_ERROR_BAD_INPUT, m->path,
                           "%zu bytes, but the commit record says %" G_GUINT64_FORMAT, m->len,
                           f->bytes);
    if (f != NULL && verify && !verify_file(m, f, error))
      return FALSE;
    for (guint t = 0; t < wsync_safetensors_n_tensors(m->st); t++) {
      const WsyncTensor *tensor = wsync_safetensors_tensor(m->st, t);
      if (!g_hash_table_add(seen, (gpointer)tensor->name)) {
        g_autofree char *name = wsync_printable(tensor->name);
        return wsync_fail_at(error, WSYNC_ERROR_BAD_INPUT, m->path,
                             "tensor \"%s\" is also in another file of rank %" G_GUINT64_FORMAT,
                             name, self->rank);
      }
      g_ptr_array_add(self->tensors, (gpointer)tensor);
      g_ptr_array_add(self->tensor_map, m);
    }
  }
  return TRUE;
}

PyObject *
wsync_py_open_rank(PyObject *module, PyObject *args, PyObject *kwargs)
{
  static char *kwlist[] = {"dir", "rank", "require_commit", "verify", "version", "digest",
                           "conf_dir", "plugin_dir", NULL};
  PyObject *dir_obj, *dir_bytes = NULL, *rank_obj, *version_obj = Py_None, *conf_dir = Py_None,
                     *plugin_dir = Py_None, *digest_obj = Py_None;
  const char *digest = NULL;
  guint64 rank, version = 0;
  int require_commit = 1, verify = 1;
  g_autoptr(GError) error = NULL;
  g_autoptr(GPtrArray) paths = g_ptr_array_new_with_free_func(g_free);
  g_autoptr(GPtrArray) want = g_ptr_array_new();
  WsyncContext *ctx = NULL;
  gboolean ok;

  (void)module;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|$ppOOOO:_open_rank", kwlist, &dir_obj,
                                   &rank_obj, &require_commit, &verify, &version_obj, &digest_obj,
                                   &conf_dir, &plugin_dir) ||
      !wsync_py_rank(rank_obj, "rank", &rank) ||
      (version_obj != Py_None && !wsync_py_step_number(version_obj, &version)))
    return NULL;
  if (digest_obj != Py_None && (!PyUnicode_Check(digest_obj) ||
                                (digest = PyUnicode_AsUTF8(digest_obj)) == NULL)) {
    if (!PyErr_Occurred())
      PyErr_Format(PyExc_TypeError, "digest must be a str, not %.100s",
                   Py_TYPE(digest_obj)->tp_name);
    return NULL;
  }
  if (!PyUnicode_FSConverter(dir_obj, &dir_bytes))
    return NULL;
  RankFilesObject *self = PyObject_New(RankFilesObject, &WsyncPyRankFilesType);
  if (self == NULL) {
    Py_DECREF(dir_bytes);
    return NULL;
  }
  self->dir = g_strdup(PyBytes_AS_STRING(dir_bytes));
  Py_DECREF(dir_bytes);
  self->rank = rank;
  self->record_text = NULL;
  memset(&self->record, 0, sizeof self->record);
  self->maps = g_ptr_array_new();
  self->tensors = g_ptr_array_new();
  self->tensor_map = g_ptr_array_new();

  /* the record: its bytes now, compared again after the copy */
  g_autofree char *record_path = g_build_filename(self->dir, COMMIT_RECORD, NULL);
  Py_BEGIN_ALLOW_THREADS
  ok = directory_exists(self->dir, &error) &&
       record_read(record_path, &self->record_text, &self->record_len, &error);
  Py_END_ALLOW_THREADS
  if (!ok && error != NULL)
    goto fail;
  if (ok) {
    if (!record_parse(record_path, self->record_text, self->record_len, &self->record, &error))
      goto fail;
    if (version_obj != Py_None && version != self->record.version) {
      wsync_fail_at(&error, WSYNC_ERROR_BAD_INPUT, record_path,
                    "the commit record is of version %" G_GUINT64_FORMAT ", not %" G_GUINT64_FORMAT,
                    self->record.version, version);
      goto fail;
    }
    if (digest != NULL && g_ascii_strcasecmp(digest, self->record.digest) != 0) {
      /* (the digest asked for is the caller's str: made printable as the path is) */
      g_autofree char *asked = wsync_printable(digest);
      wsync_fail_at(&error, WSYNC_ERROR_BAD_INPUT, record_path,
                    "the commit record is of plan digest %s, not %s (another model, target, "
                    "format, tp or ep)",
                    self->record.digest, asked);
      goto fail;
    }
    if (!record_files_of_rank(self, paths, want, &error))
      goto fail;
  } else if (require_commit) {
    wsync_fail_at(&error, WSYNC_ERROR_BAD_INPUT, record_path,
                  "no commit record: no step is complete (one is being written, or no session "
                  "wrote this directory; rank files of wsync convert load with "
                  "require_commit=False)");
    goto fail;
  } else {
    if ((ctx = wsync_py_context(conf_dir, plugin_dir)) == NULL)
      goto fail_py;
    Py_BEGIN_ALLOW_THREADS
    ok = recognised_files_of_rank(self, ctx, paths, &error);
    Py_END_ALLOW_THREADS
    g_clear_pointer(&ctx, wsync_context_free);
    if (!ok)
      goto fail;
    g_clear_pointer(&want, g_ptr_array_unref);
  }

  for (guint i = 0; i < paths->len; i++) {
    MapObject *m = PyObject_New(MapObject, &MapType);
    if (m == NULL)
      goto fail_py;
    m->path = g_strdup(paths->pdata[i]);
    m->data = NULL;
    m->len = 0;
    m->st = NULL;
    g_ptr_array_add(self->maps, m);
  }
  Py_BEGIN_ALLOW_THREADS
  ok = map_rank_files(self, paths, want, verify, &error);
  Py_END_ALLOW_THREADS
  if (!ok)
    goto fail;
  return (PyObject *)self;

fail:
  wsync_py_raise(error);
fail_py:
  Py_DECREF(self);
  return NULL;
}

/* ------------------------------------------------------------------ methods */

static PyObject *
rank_files_entries(RankFilesObject *self, void *closure)
{
  PyObject *list = PyList_New(self->tensors->len);

  (void)closure;
  for (guint i = 0; list != NULL && i < self->tensors->len; i++) {
    const WsyncTensor *t = self->tensors->pdata[i];
    PyObject *shape = wsync_py_shape(t->ndim, t->shape);
    PyObject *entry = shape ? Py_BuildValue("(ssNs)", t->name, wsync_dtype_name(t->dtype), shape,
                                            t->file)
                            : NULL;
    if (entry == NULL) {
      Py_CLEAR(list);
      break;
    }
    PyList_SET_ITEM(list, i, entry);
  }
  return list;
}

/* One file's `__metadata__` as a dict of str to str. */
static PyObject *
metadata_dict(const WsyncSafetensors *st)
{
  PyObject *dict = PyDict_New();
  GHashTableIter it;
  gpointer key, value;

  if (dict == NULL)
    return NULL;
  g_hash_table_iter_init(&it, wsync_safetensors_metadata(st));
  while (g_hash_table_iter_next(&it, &key, &value)) {
    PyObject *v = PyUnicode_FromString(value);
    if (v == NULL || PyDict_SetItemString(dict, key, v) < 0) {
      Py_XDECREF(v);
      Py_DECREF(dict);
      return NULL;
    }
    Py_DECREF(v);
  }
  return dict;
}

/* [(path, metadata)]: what a reader checks about the files before copying (a vLLM
 * worker: the format and the MoE backend they were written for). */
static PyObject *
rank_files_files(RankFilesObject *self, void *closure)
{
  PyObject *list = PyList_New(self->maps->len);

  (void)closure;
  for (guint i = 0; list != NULL && i < self->maps->len; i++) {
    MapObject *m = self->maps->pdata[i];
    PyObject *metadata = metadata_dict(m->st);
    PyObject *entry = metadata ? Py_BuildValue("(sN)", m->path, metadata) : NULL;
    if (entry == NULL) {
      Py_CLEAR(list);
      break;
    }
    PyList_SET_ITEM(list, i, entry);
  }
  return list;
}

static PyObject *
rank_files_record(RankFilesObject *self, void *closure)
{
  (void)closure;
  if (self->record.root == NULL)
    Py_RETURN_NONE;
  return wsync_py_from_json(self->record.root);
}

/* An entry index, offset or length of the calls below: an int (numpy's too) but not a
 * bool, as the public calls refuse one (PyArg's "n" takes True for 1). */
static gboolean
ssize_arg(PyObject *obj, const char *what, Py_ssize_t *out)
{
  if (!wsync_py_is_int(obj)) {
    PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", what, Py_TYPE(obj)->tp_name);
    return FALSE;
  }
  *out = PyNumber_AsSsize_t(obj, PyExc_OverflowError);
  return !(*out == -1 && PyErr_Occurred());
}

static gboolean
entry_index(RankFilesObject *self, Py_ssize_t index)
{
  if (index < 0 || (gsize)index >= self->tensors->len) {
    PyErr_SetString(PyExc_IndexError, "no such entry");
    return FALSE;
  }
  return TRUE;
}

/* The entries and destinations of a list of (index, buffer) pairs, buffers taken. */
typedef struct {
  guint n;
  const WsyncTensor **tensors;
  const MapObject **maps; /* each tensor's file */
  WsyncPyBytes *bytes;
} Pairs;

static void
pairs_release(Pairs *p)
{
  for (guint i = 0; i < p->n; i++)
    wsync_py_bytes_release(&p->bytes[i]);
  g_free(p->tensors);
  g_free(p->maps);
  g_free(p->bytes);
}

static gboolean
pairs_take(RankFilesObject *self, PyObject *list, Pairs *p)
{
  PyObject *seq = PySequence_Fast(list, "a list of (index, destination) pairs");
  Py_ssize_t n;

  memset(p, 0, sizeof *p);
  if (seq == NULL)
    return FALSE;
  n = PySequence_Fast_GET_SIZE(seq);
  p->tensors = g_new0(const WsyncTensor *, n);
  p->maps = g_new0(const MapObject *, n);
  p->bytes = g_new0(WsyncPyBytes, n);
  for (Py_ssize_t i = 0; i < n; i++) {
    Py_ssize_t index;
    PyObject *index_obj, *dest;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "OO", &index_obj, &dest) ||
        !ssize_arg(index_obj, "index", &index) || !entry_index(self, index))
      goto fail;
    const WsyncTensor *t = self->tensors->pdata[index];
    g_autofree char *file = wsync_printable(t->file), *name = wsync_printable(t->name);
    g_autofree char *what = g_strdup_printf("%s: tensor \"%s\"", file, name);
    if (!wsync_py_bytes_get(dest, TRUE, what, &p->bytes[i]))
      goto fail_release_last;
    p->n = (guint)i + 1;
    p->tensors[i] = t;
    p->maps[i] = self->tensor_map->pdata[index];
    if (!wsync_py_bytes_check(&p->bytes[i], t->dtype, t->ndim, t->shape, TRUE, what))
      goto fail;
    continue;
  fail_release_last:
    wsync_py_bytes_release(&p->bytes[i]);
    goto fail;
  }
  Py_DECREF(seq);
  return TRUE;
fail:
  Py_DECREF(seq);
  pairs_release(p);
  return FALSE;
}

static PyObject *
rank_files_check(RankFilesObject *self, PyObject *list)
{
  Pairs p;

  if (!pairs_take(self, list, &p))
    return NULL;
  pairs_release(&p);
  Py_RETURN_NONE;
}

/* Copies of entries into buffers, behind wsync_run_guarded(): @done counts the copies
 * finished when a read of the map faults (a file truncated under the map). */
typedef struct {
  guint n;
  const WsyncTensor *const *tensors;
  const MapObject *const *maps;
  const WsyncPyBytes *bytes;
  volatile guint done;
} CopyJob;

static void
copy_job_run(gpointer data)
{
  CopyJob *j = data;

  for (guint i = j->done; i < j->n; i++) {
    memcpy(j->bytes[i].data, j->tensors[i]->data, j->tensors[i]->nbytes);
    j->done = i + 1;
  }
}

/* Raises wsync.Error (exit status 4) for a read of @m's bytes of @t that faulted (the
 * file shrank under its map), its attribute copied @copied (what the caller had copied
 * before). */
static void
raise_shrunk(const MapObject *m, const WsyncTensor *t, guint copied)
{
  g_autoptr(GError) error = NULL;
  set_shrunk_error(&error, m->path, t->name);
  wsync_py_raise(error);
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  PyObject *n = PyLong_FromUnsignedLong(copied);
  if (n == NULL || PyObject_SetAttrString(value, "copied", n) < 0)
    PyErr_Clear();
  Py_XDECREF(n);
  PyErr_Restore(type, value, tb);
}

/* Runs @j without the GIL; FALSE with wsync.Error (exit status 4) naming the file and
 * the tensor whose read faulted, its attribute copied the number of entries copied. */
static gboolean
copy_job_guarded(CopyJob *j)
{
  const void *address = NULL;
  gboolean ok;

  Py_BEGIN_ALLOW_THREADS
  ok = wsync_run_guarded(copy_job_run, j, &address);
  Py_END_ALLOW_THREADS
  if (!ok)
    raise_shrunk(j->maps[j->done], j->tensors[j->done], j->done);
  return ok;
}

static PyObject *
rank_files_copy(RankFilesObject *self, PyObject *list)
{
  Pairs p;
  gboolean ok;

  if (!pairs_take(self, list, &p))
    return NULL;
  CopyJob j = {p.n, p.tensors, p.maps, p.bytes, 0};
  ok = copy_job_guarded(&j);
  pairs_release(&p);
  if (!ok)
    return NULL;
  Py_RETURN_NONE;
}

/* One run of bytes out of a map, behind wsync_run_guarded(). */
typedef struct {
  guint8 *dest;
  const guint8 *src;
  gsize len;
} ReadJob;

static void
read_job_run(gpointer data)
{
  ReadJob *r = data;

  memcpy(r->dest, r->src, r->len);
}

/* readinto(i, offset, length, buffer): bytes offset to offset + length of entry i into
 * the start of buffer (writable), copied without the GIL and behind the guard.  What
 * torch copies from, piece by piece through one staging buffer (wsync/__init__.py
 * _copy_torch): a view of the map would let torch's own copy read a truncated file and
 * SIGBUS end the process, and a copy of the whole tensor costs its size in memory. */
static PyObject *
rank_files_readinto(RankFilesObject *self, PyObject *args)
{
  Py_ssize_t index, offset, length;
  PyObject *index_obj, *offset_obj, *length_obj;
  Py_buffer into;

  if (!PyArg_ParseTuple(args, "OOOw*:readinto", &index_obj, &offset_obj, &length_obj, &into))
    return NULL;
  if (!ssize_arg(index_obj, "readinto: index", &index) ||
      !ssize_arg(offset_obj, "readinto: offset", &offset) ||
      !ssize_arg(length_obj, "readinto: length", &length) || !entry_index(self, index)) {
    PyBuffer_Release(&into);
    return NULL;
  }
  const WsyncTensor *t = self->tensors->pdata[index];
  const MapObject *m = self->tensor_map->pdata[index];
  if (offset < 0 || length < 0 || (guint64)offset > t->nbytes ||
      (guint64)length > t->nbytes - (guint64)offset || length > into.len) {
    /* (offset + length would overflow for the ranges refused here: both are named) */
    PyErr_Format(PyExc_ValueError,
                 "readinto: %zd bytes from byte %zd of a tensor of %" G_GUINT64_FORMAT
                 " bytes into a buffer of %zd",
                 length, offset, (guint64)t->nbytes, into.len);
    PyBuffer_Release(&into);
    return NULL;
  }
  ReadJob r = {into.buf, t->data + offset, (gsize)length};
  const void *address = NULL;
  gboolean ok;
  Py_BEGIN_ALLOW_THREADS
  ok = wsync_run_guarded(read_job_run, &r, &address);
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&into);
  if (!ok) {
    raise_shrunk(m, t, 0);
    return NULL;
  }
  Py_RETURN_NONE;
}

/* Is the record still the one read at opening?  (No record at opening: always.) */
static PyObject *
rank_files_is_current(RankFilesObject *self, PyObject *unused)
{
  g_autofree char *path = g_build_filename(self->dir, COMMIT_RECORD, NULL);
  g_autofree char *text = NULL;
  g_autoptr(GError) error = NULL;
  gsize len = 0;
  gboolean ok;

  (void)unused;
  if (self->record_text == NULL)
    Py_RETURN_TRUE;
  Py_BEGIN_ALLOW_THREADS
  ok = record_read(path, &text, &len, &error);
  Py_END_ALLOW_THREADS
  if (!ok && error != NULL)
    return wsync_py_raise(error);
  return PyBool_FromLong(ok && len == self->record_len && memcmp(text, self->record_text, len) == 0);
}

static PyMethodDef rank_files_methods[] = {
    {"readinto", (PyCFunction)rank_files_readinto, METH_VARARGS,
     "readinto(i, offset, length, buffer): copies bytes offset to offset + length of entry "
     "i into the start of buffer (writable, at least length bytes); raises wsync.Error "
     "naming the file and the tensor when the file shrank under its map (copied 0)."},
    {"check", (PyCFunction)rank_files_check, METH_O,
     "check([(i, buffer), ...]): raises wsync.Error when a buffer cannot take entry i "
     "(writable, C-contiguous, same dtype and shape)."},
    {"copy", (PyCFunction)rank_files_copy, METH_O,
     "copy([(i, buffer), ...]): checks, then copies each entry into its buffer without the "
     "GIL; when a file shrank under its map, raises wsync.Error naming the file and the "
     "tensor, its attribute copied the number of pairs copied (in order) before."},
    {"is_current", (PyCFunction)rank_files_is_current, METH_NOARGS,
     "is_current(): the commit record is still the one read at opening."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef rank_files_getset[] = {
    {"entries", (getter)rank_files_entries, NULL,
     "[(name, dtype, shape, file)]: the rank's tensors, file by file in data order.", NULL},
    {"record", (getter)rank_files_record, NULL, "The commit record as a dict, or None.", NULL},
    {"files", (getter)rank_files_files, NULL,
     "[(path, metadata)]: the rank's files in order, each with its __metadata__ as a dict.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject WsyncPyRankFilesType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_wsync._RankFiles",
    .tp_basicsize = sizeof(RankFilesObject),
    .tp_dealloc = (destructor)rank_files_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One rank's files, checked against the commit record (see wsync.load_rank).",
    .tp_methods = rank_files_methods,
    .tp_getset = rank_files_getset,
};

gboolean
wsync_py_load_init_types(void)
{
  return PyType_Ready(&MapType) == 0 && PyType_Ready(&WsyncPyRankFilesType) == 0;
}
