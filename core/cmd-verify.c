/* wsync verify A B: are two checkpoints the same tensors, bit for bit?
 *
 * A and B are each a safetensors file or a checkpoint directory.  They are equal when
 * they hold the same tensor names and, name by name, the same dtype, the same shape
 * and the same bytes; how the tensors are split into files does not matter.  The files
 * that hold a tensor on each side must also carry the same published-dtype records
 * (WSYNC_PUBLISHED_DTYPE_KEY): they change the dtype the tensors read back in.  No other
 * metadata is compared (version stamps and the like differ between runs that wrote
 * the same tensors).  The first difference is reported on one line and the exit status
 * is 1: names missing on either side come first (the first such name in name order),
 * then the records (of the files of the tensors in name order, each pair of files once,
 * the keys in key order), then the tensors in name order, each checked for dtype, then
 * shape, then data.
 *
 * "tensors" and "bytes" (in the text when equal, always in --json) count what was
 * compared and found equal: everything when the checkpoints are equal, the tensors
 * before the difference otherwise.
 */
#include "config.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "files.h"
#include "progress.h"

/* Data is compared with memcmp in chunks this large; only the first chunk that differs
 * is searched byte by byte. */
#define VERIFY_CHUNK ((guint64)1 << 20)

typedef enum {
  DIFF_NONE,
  DIFF_MISSING_IN_A,
  DIFF_MISSING_IN_B,
  DIFF_DTYPE,
  DIFF_SHAPE,
  DIFF_DATA,
  DIFF_RECORD,
  DIFF_FILE_COUNT, /* a name both sides hold, in more files on one side (rank files) */
} DiffKind;

static const char *const diff_kind_names[] = {
    [DIFF_NONE] = "none",
    [DIFF_MISSING_IN_A] = "missing-in-a",
    [DIFF_MISSING_IN_B] = "missing-in-b",
    [DIFF_DTYPE] = "dtype",
    [DIFF_SHAPE] = "shape",
    [DIFF_DATA] = "data",
    [DIFF_RECORD] = "metadata",
    [DIFF_FILE_COUNT] = "file-count",
};

typedef struct {
  DiffKind kind;
  const char *name;               /* the tensor (NULL for DIFF_RECORD) */
  const WsyncTensor *a, *b;       /* NULL on the side it is missing from */
  gboolean whole_bytes;           /* DIFF_DATA: elements of 1 byte or more */
  guint64 byte;                   /* DIFF_DATA: first differing byte in the tensor */
  guint64 element;                /* DIFF_DATA, whole_bytes: the element holding it */
  guint64 index[WSYNC_MAX_DIMS];  /* ... and its index, one entry per dimension */
  guint element_size;             /* ... in bytes */
  const char *key;                /* DIFF_RECORD: the metadata key */
  const char *file_a, *file_b;    /* ... the two files that disagree on it */
  const char *value_a, *value_b;  /* ... its values, NULL where it is absent */
} Difference;

typedef struct {
  guint n_tensors; /* compared and equal */
  guint64 n_bytes;
  Difference diff;
} Verdict;

/* The one-line output stays one line (control characters escaped). */
#define printable wsync_printable

/* How many of @ck's files hold a tensor called @name (rank files: one per rank). */
static guint
copies(WsyncCheckpoint *ck, const char *name)
{
  guint n = 0;

  for (guint i = 0; i < wsync_checkpoint_n_tensors(ck); i++)
    n += strcmp(wsync_checkpoint_tensor(ck, i)->name, name) == 0;
  return n;
}

/* The first name (in name order) that only one side has, or that one side holds in more
 * files than the other (a directory of rank files holds lm_head.weight once per rank:
 * "missing" was false).  Both sides list their tensors sorted by name, so one merge
 * finds it. */
static gboolean
find_missing(WsyncCheckpoint *a, WsyncCheckpoint *b, Difference *diff)
{
  guint na = wsync_checkpoint_n_tensors(a), nb = wsync_checkpoint_n_tensors(b);
  guint i = 0, j = 0;

  while (i < na || j < nb) {
    const WsyncTensor *ta = i < na ? wsync_checkpoint_tensor(a, i) : NULL;
    const WsyncTensor *tb = j < nb ? wsync_checkpoint_tensor(b, j) : NULL;
    int cmp = ta == NULL ? 1 : tb == NULL ? -1 : strcmp(ta->name, tb->name);
    if (cmp < 0) {
      *diff = (Difference){.kind = DIFF_MISSING_IN_B, .name = ta->name, .a = ta};
      if (copies(b, ta->name) > 0)
        diff->kind = DIFF_FILE_COUNT;
      return TRUE;
    }
    if (cmp > 0) {
      *diff = (Difference){.kind = DIFF_MISSING_IN_A, .name = tb->name, .b = tb};
      if (copies(a, tb->name) > 0)
        diff->kind = DIFF_FILE_COUNT;
      return TRUE;
    }
    i++;
    j++;
  }
  return FALSE;
}

/* @ck's files by path: index + 1 (a tensor names its file by path). */
static GHashTable *
file_numbers(WsyncCheckpoint *ck)
{
  GHashTable *numbers = g_hash_table_new(g_str_hash, g_str_equal);

  for (guint f = 0; f < wsync_checkpoint_n_files(ck); f++)
    g_hash_table_insert(numbers, (gpointer)wsync_safetensors_path(wsync_checkpoint_file(ck, f)),
                        GUINT_TO_POINTER(f + 1));
  return numbers;
}

/* The first published-dtype record on which a file of A and a file of B that hold the
 * same tensor disagree.  Files are paired through the tensors they hold (the names are
 * the same on both sides, both sorted), so how the tensors are split into files still
 * does not matter; each pair is compared once. */
static gboolean
find_record_difference(WsyncCheckpoint *a, WsyncCheckpoint *b, Difference *diff)
{
  g_autoptr(GHashTable) numbers_a = file_numbers(a);
  g_autoptr(GHashTable) numbers_b = file_numbers(b);
  g_autoptr(GHashTable) compared = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, NULL);
  gint64 n_b = wsync_checkpoint_n_files(b);

  for (guint i = 0; i < wsync_checkpoint_n_tensors(a); i++) {
    const WsyncTensor *ta = wsync_checkpoint_tensor(a, i);
    const WsyncTensor *tb = wsync_checkpoint_tensor(b, i);
    guint na = GPOINTER_TO_UINT(g_hash_table_lookup(numbers_a, ta->file));
    guint nb = GPOINTER_TO_UINT(g_hash_table_lookup(numbers_b, tb->file));
    if (na == 0 || nb == 0)
      continue; /* (every tensor is in one of its checkpoint's files) */
    guint fa = na - 1, fb = nb - 1;
    gint64 pair = (gint64)fa * n_b + fb;
    if (g_hash_table_contains(compared, &pair))
      continue;
    g_hash_table_add(compared, g_memdup2(&pair, sizeof pair));
    GHashTable *ma = wsync_safetensors_metadata(wsync_checkpoint_file(a, fa));
    GHashTable *mb = wsync_safetensors_metadata(wsync_checkpoint_file(b, fb));
    const char *key = wsync_published_dtype_first_difference(ma, mb);
    if (key != NULL) {
      *diff = (Difference){.kind = DIFF_RECORD, .key = key, .file_a = ta->file,
                           .file_b = tb->file, .value_a = g_hash_table_lookup(ma, key),
                           .value_b = g_hash_table_lookup(mb, key)};
      return TRUE;
    }
  }
  return FALSE;
}

/* Offset of the first byte where @x and @y differ, or FALSE when they are equal. */
static gboolean
first_different_byte(const guint8 *x, const guint8 *y, guint64 n, guint64 *at)
{
  for (guint64 off = 0; off < n; off += VERIFY_CHUNK) {
    gsize len = (gsize)MIN(VERIFY_CHUNK, n - off);
    if (memcmp(x + off, y + off, len) == 0)
      continue;
    for (gsize k = 0; k < len; k++) {
      if (x[off + k] != y[off + k]) {
        *at = off + k;
        return TRUE;
      }
    }
  }
  return FALSE;
}

/* Compares one tensor present on both sides (same name). */
static gboolean
tensor_differs(const WsyncTensor *a, const WsyncTensor *b, Difference *diff)
{
  *diff = (Difference){.name = a->name, .a = a, .b = b};
  if (a->dtype != b->dtype) {
    diff->kind = DIFF_DTYPE;
    return TRUE;
  }
  if (a->ndim != b->ndim || memcmp(a->shape, b->shape, a->ndim * sizeof a->shape[0]) != 0) {
    diff->kind = DIFF_SHAPE;
    return TRUE;
  }
  /* Same dtype and shape: the same byte count. */
  if (!first_different_byte(a->data, b->data, a->nbytes, &diff->byte))
    return FALSE;
  diff->kind = DIFF_DATA;
  guint bits = wsync_dtype_bits(a->dtype);
  diff->whole_bytes = bits % 8 == 0;
  if (diff->whole_bytes) {
    diff->element_size = bits / 8;
    diff->element = diff->byte / diff->element_size;
    /* Row-major: the last dimension varies fastest.  No dimension is 0: the tensor
     * has bytes. */
    guint64 rest = diff->element;
    for (guint d = a->ndim; d-- > 0;) {
      diff->index[d] = rest % a->shape[d];
      rest /= a->shape[d];
    }
  }
  return TRUE;
}

/* Compares the tensors of @a and @b, which have the same names: it touches the
 * memory maps, so it runs guarded (and allocates only to show progress). */
static void
verify_tensors(WsyncCheckpoint *a, WsyncCheckpoint *b, Verdict *v, WsyncProgress *progress)
{
  /* The same names, both sorted: tensor i of A and tensor i of B share a name. */
  for (guint i = 0; i < wsync_checkpoint_n_tensors(a); i++) {
    const WsyncTensor *ta = wsync_checkpoint_tensor(a, i);
    const WsyncTensor *tb = wsync_checkpoint_tensor(b, i);
    if (tensor_differs(ta, tb, &v->diff)) {
      wsync_progress_end(progress); /* before the verdict */
      return;
    }
    v->n_tensors++;
    v->n_bytes += ta->nbytes;
    wsync_progress_show(progress, v->n_bytes, FALSE);
  }
  v->diff.kind = DIFF_NONE;
  wsync_progress_show(progress, v->n_bytes, TRUE);
}

/* A record's value in the one-line output: quoted, or "absent". */
static char *
record_text(const char *value)
{
  g_autofree char *p = value != NULL ? printable(value) : NULL;

  return p != NULL ? g_strdup_printf("\"%s\"", p) : g_strdup("absent");
}

/* The @size bytes of an element as one little-endian number: "0x3f80". */
static char *
element_hex(const guint8 *data, guint64 element, guint size)
{
  GString *out = g_string_new("0x");
  const guint8 *p = data + element * size;
  for (guint k = size; k-- > 0;)
    g_string_append_printf(out, "%02x", p[k]);
  return g_string_free(out, FALSE);
}

static void
print_text(WsyncCheckpoint *a, WsyncCheckpoint *b, const Verdict *v)
{
  const Difference *d = &v->diff;
  g_autofree char *name = d->name ? printable(d->name) : NULL;

  switch (d->kind) {
  case DIFF_NONE:
    printf("equal: %u tensor%s, %" G_GUINT64_FORMAT " bytes\n", v->n_tensors,
           v->n_tensors == 1 ? "" : "s", v->n_bytes);
    return;
  case DIFF_MISSING_IN_A:
  case DIFF_MISSING_IN_B: {
    gboolean in_a = d->kind == DIFF_MISSING_IN_B;
    g_autofree char *path = printable(wsync_checkpoint_path(in_a ? a : b));
    printf("differ: tensor \"%s\" only in %s (%s)\n", name, in_a ? "A" : "B", path);
    return;
  }
  case DIFF_FILE_COUNT: {
    guint copies_a = copies(a, d->name), copies_b = copies(b, d->name);
    g_autofree char *path_a = printable(wsync_checkpoint_path(a));
    g_autofree char *path_b = printable(wsync_checkpoint_path(b));
    printf("differ: tensor \"%s\" is in %u file%s of A (%s), in %u of B (%s)\n", name,
           copies_a, copies_a == 1 ? "" : "s", path_a, copies_b, path_b);
    return;
  }
  case DIFF_DTYPE:
    printf("differ: tensor \"%s\": dtype %s in A, %s in B\n", name, wsync_dtype_name(d->a->dtype),
           wsync_dtype_name(d->b->dtype));
    return;
  case DIFF_SHAPE: {
    g_autofree char *sa = wsync_shape_format(d->a->ndim, d->a->shape);
    g_autofree char *sb = wsync_shape_format(d->b->ndim, d->b->shape);
    printf("differ: tensor \"%s\": shape %s in A, %s in B\n", name, sa, sb);
    return;
  }
  case DIFF_DATA:
    if (d->whole_bytes) {
      g_autofree char *index = wsync_shape_format(d->a->ndim, d->index);
      g_autofree char *xa = element_hex(d->a->data, d->element, d->element_size);
      g_autofree char *xb = element_hex(d->b->data, d->element, d->element_size);
      printf("differ: tensor \"%s\": first difference at element %" G_GUINT64_FORMAT
             " (index %s): bytes %s in A, %s in B\n",
             name, d->element, index, xa, xb);
    } else {
      /* Sub-byte elements (F4, F6) share bytes: say which byte. */
      printf("differ: tensor \"%s\": first difference at byte %" G_GUINT64_FORMAT
             ": 0x%02x in A, 0x%02x in B\n",
             name, d->byte, d->a->data[d->byte], d->b->data[d->byte]);
    }
    return;
  case DIFF_RECORD: {
    g_autofree char *key = printable(d->key);
    g_autofree char *fa = printable(d->file_a);
    g_autofree char *fb = printable(d->file_b);
    g_autofree char *va = record_text(d->value_a);
    g_autofree char *vb = record_text(d->value_b);
    printf("differ: metadata \"%s\": %s in A (%s), %s in B (%s)\n", key, va, fa, vb, fb);
    return;
  }
  }
}

/* JSON member @name: @value, or null. */
static void
add_string_or_null(JsonBuilder *jb, const char *name, const char *value)
{
  json_builder_set_member_name(jb, name);
  if (value != NULL)
    json_builder_add_string_value(jb, value);
  else
    json_builder_add_null_value(jb);
}

/* JSON member @member: the files of @ck that hold a tensor called @name, in @ck's order. */
static void
add_files_holding(JsonBuilder *jb, const char *member, WsyncCheckpoint *ck, const char *name)
{
  json_builder_set_member_name(jb, member);
  json_builder_begin_array(jb);
  for (guint i = 0; i < wsync_checkpoint_n_tensors(ck); i++) {
    const WsyncTensor *t = wsync_checkpoint_tensor(ck, i);
    if (strcmp(t->name, name) == 0)
      json_builder_add_string_value(jb, t->file);
  }
  json_builder_end_array(jb);
}

static void
print_json(WsyncCheckpoint *a, WsyncCheckpoint *b, const Verdict *v)
{
  g_autoptr(JsonBuilder) jb = json_builder_new();
  const Difference *d = &v->diff;

  json_builder_begin_object(jb);
  json_builder_set_member_name(jb, "equal");
  json_builder_add_boolean_value(jb, d->kind == DIFF_NONE);
  json_builder_set_member_name(jb, "tensors");
  json_builder_add_int_value(jb, v->n_tensors);
  json_builder_set_member_name(jb, "bytes");
  json_builder_add_int_value(jb, (gint64)v->n_bytes);
  json_builder_set_member_name(jb, "difference");
  if (d->kind == DIFF_NONE) {
    json_builder_add_null_value(jb);
  } else {
    gboolean located = d->kind == DIFF_DATA && d->whole_bytes;
    json_builder_begin_object(jb);
    add_string_or_null(jb, "tensor", d->name);
    json_builder_set_member_name(jb, "kind");
    json_builder_add_string_value(jb, diff_kind_names[d->kind]);
    json_builder_set_member_name(jb, "element");
    if (located)
      json_builder_add_int_value(jb, (gint64)d->element);
    else
      json_builder_add_null_value(jb);
    json_builder_set_member_name(jb, "index");
    if (located) {
      json_builder_begin_array(jb);
      for (guint k = 0; k < d->a->ndim; k++)
        json_builder_add_int_value(jb, (gint64)d->index[k]);
      json_builder_end_array(jb);
    } else {
      json_builder_add_null_value(jb);
    }
    if (d->kind == DIFF_DATA && !d->whole_bytes) {
      json_builder_set_member_name(jb, "byte");
      json_builder_add_int_value(jb, (gint64)d->byte);
    }
    if (d->kind == DIFF_RECORD) {
      add_string_or_null(jb, "key", d->key);
      add_string_or_null(jb, "file_a", d->file_a);
      add_string_or_null(jb, "value_a", d->value_a);
      add_string_or_null(jb, "file_b", d->file_b);
      add_string_or_null(jb, "value_b", d->value_b);
    }
    if (d->kind == DIFF_FILE_COUNT) {
      add_files_holding(jb, "files_a", a, d->name);
      add_files_holding(jb, "files_b", b, d->name);
    }
    json_builder_end_object(jb);
  }
  json_builder_end_object(jb);
  g_autoptr(JsonNode) root = json_builder_get_root(jb);
  cli_print_json(root);
}

typedef struct {
  WsyncCheckpoint *a, *b;
  Verdict *v;
  WsyncProgress progress;
} Comparison;

static void
compare_cb(gpointer data)
{
  Comparison *c = data;
  verify_tensors(c->a, c->b, c->v, &c->progress);
}

/* The tensor of @ck whose bytes hold @address, or NULL. */
static const WsyncTensor *
tensor_at(WsyncCheckpoint *ck, const void *address)
{
  for (guint i = 0; i < wsync_checkpoint_n_tensors(ck); i++) {
    const WsyncTensor *t = wsync_checkpoint_tensor(ck, i);
    if ((const guint8 *)address >= t->data && (const guint8 *)address < t->data + t->nbytes)
      return t;
  }
  return NULL;
}

int
cmd_verify(WsyncCli *cli, const WsyncCommand *cmd, int argc, char **argv)
{
  g_autoptr(GError) error = NULL;
  WsyncContext *ctx;
  g_autoptr(WsyncCheckpoint) a = NULL;
  g_autoptr(WsyncCheckpoint) b = NULL;
  Verdict v;

  if (!cli_parse(cli, cmd, NULL, &argc, &argv))
    return WSYNC_EXIT_USAGE;
  if (argc != 3)
    return cli_usage_error(cmd, argc == 1   ? "missing A and B"
                                : argc == 2 ? "missing B"
                                            : "expected two paths, A and B");
  /* verify needs no plugin, but a broken configuration is still an error. */
  if ((ctx = cli_context(cli, &error)) == NULL)
    return cli_fail(error);
  a = wsync_context_open_checkpoint(ctx, argv[1], &error);
  if (a == NULL)
    return cli_fail(error);
  b = wsync_context_open_checkpoint(ctx, argv[2], &error);
  if (b == NULL)
    return cli_fail(error);

  /* names and records come from the headers; then the tensors are read through memory
   * maps: a file truncated meanwhile is an I/O error naming it, not SIGBUS */
  v = (Verdict){0};
  Comparison c = {.a = a, .b = b, .v = &v};
  guint64 total = 0;
  for (guint i = 0; i < wsync_checkpoint_n_tensors(a); i++)
    total += wsync_checkpoint_tensor(a, i)->nbytes;
  wsync_progress_init(&c.progress, wsync_progress_mode(cli->quiet, FALSE), "compared", total);
  const void *address = NULL;
  gboolean headers_differ = find_missing(a, b, &v.diff) || find_record_difference(a, b, &v.diff);
  if (!headers_differ && !wsync_run_guarded(compare_cb, &c, &address)) {
    const WsyncTensor *t = tensor_at(a, address);
    t = t ? t : tensor_at(b, address);
    wsync_progress_end(&c.progress);
    g_set_error(&error, WSYNC_ERROR, WSYNC_ERROR_IO,
                "cannot read %s: the file shrank while wsync was reading it (tensor \"%s\")",
                t ? t->file : "a file of A or B", t ? t->name : "?");
    return cli_fail(error);
  }
  if (cli->json)
    print_json(a, b, &v);
  else if (!cli->quiet || v.diff.kind != DIFF_NONE)
    print_text(a, b, &v); /* -q: only a difference is news (the status says equal) */
  return v.diff.kind == DIFF_NONE ? WSYNC_EXIT_OK : WSYNC_EXIT_DIFFERENT;
}
