/* wsync: a restricted pickle reader for DCP metadata and torch.save records.
 *
 * A small stack machine that follows CPython's Unpickler (Lib/pickle.py, `load_*`) for
 * the opcodes DCP's files contain, and nothing else.  Values are inert records in an
 * arena; no global is ever resolved to code.  See core/pickle.h for the contract.
 */
#include <stdarg.h>
#include <string.h>

#include <wsync/error.h>

#include "json-check.h"
#include "pickle.h"

/* ================================================================ values */

struct _WsyncPickle {
  GPtrArray *values; /* owns every WsyncPickleValue */
  WsyncPickleValue *root;
  guint protocol;
};

static void
value_free(gpointer p)
{
  WsyncPickleValue *v = p;
  if (v->items)
    g_ptr_array_unref(v->items);
  g_free((char *)v->str);
  g_free((char *)v->module);
  g_free((char *)v->name);
  g_free(v);
}

void
wsync_pickle_free(WsyncPickle *pickle)
{
  if (pickle == NULL)
    return;
  g_ptr_array_unref(pickle->values);
  g_free(pickle);
}

const WsyncPickleValue *
wsync_pickle_root(const WsyncPickle *pickle)
{
  g_return_val_if_fail(pickle != NULL, NULL);
  return pickle->root;
}

guint
wsync_pickle_protocol(const WsyncPickle *pickle)
{
  g_return_val_if_fail(pickle != NULL, 0);
  return pickle->protocol;
}

guint
wsync_pickle_n_items(const WsyncPickleValue *v)
{
  if (v == NULL || v->items == NULL)
    return 0;
  if (v->kind == WSYNC_PICKLE_DICT)
    return v->items->len / 2;
  return v->items->len;
}

const WsyncPickleValue *
wsync_pickle_item(const WsyncPickleValue *v, guint i)
{
  g_return_val_if_fail(v != NULL && (v->kind == WSYNC_PICKLE_TUPLE || v->kind == WSYNC_PICKLE_LIST),
                       NULL);
  g_return_val_if_fail(i < v->items->len, NULL);
  return g_ptr_array_index(v->items, i);
}

const WsyncPickleValue *
wsync_pickle_dict_key(const WsyncPickleValue *v, guint i)
{
  g_return_val_if_fail(v != NULL && v->kind == WSYNC_PICKLE_DICT, NULL);
  g_return_val_if_fail(i < v->items->len / 2, NULL);
  return g_ptr_array_index(v->items, 2 * i);
}

const WsyncPickleValue *
wsync_pickle_dict_value(const WsyncPickleValue *v, guint i)
{
  g_return_val_if_fail(v != NULL && v->kind == WSYNC_PICKLE_DICT, NULL);
  g_return_val_if_fail(i < v->items->len / 2, NULL);
  return g_ptr_array_index(v->items, 2 * i + 1);
}

const WsyncPickleValue *
wsync_pickle_dict_lookup(const WsyncPickleValue *v, const char *key)
{
  g_return_val_if_fail(key != NULL, NULL);
  if (v == NULL || v->kind != WSYNC_PICKLE_DICT)
    return NULL;
  const WsyncPickleValue *found = NULL;
  for (guint i = 0; i + 1 < v->items->len; i += 2) {
    const WsyncPickleValue *k = g_ptr_array_index(v->items, i);
    if (k->kind == WSYNC_PICKLE_STR && strcmp(k->str, key) == 0)
      found = g_ptr_array_index(v->items, i + 1);
  }
  return found;
}

gboolean
wsync_pickle_is_instance(const WsyncPickleValue *v, WsyncPickleGlobal global)
{
  return v != NULL && v->kind == WSYNC_PICKLE_OBJECT && v->cls != NULL &&
         v->cls->kind == WSYNC_PICKLE_GLOBAL && v->cls->global == global;
}

char *
wsync_pickle_describe(const WsyncPickleValue *v)
{
  if (v == NULL)
    return g_strdup("nothing");
  switch (v->kind) {
  case WSYNC_PICKLE_NONE:
    return g_strdup("None");
  case WSYNC_PICKLE_BOOL:
    return g_strdup(v->integer ? "True" : "False");
  case WSYNC_PICKLE_INT:
    return g_strdup_printf("the int %" G_GINT64_FORMAT, v->integer);
  case WSYNC_PICKLE_STR: {
    if (v->len > 64)
      return g_strdup_printf("a str of %" G_GSIZE_FORMAT " bytes", v->len);
    g_autofree char *p = wsync_json_printable(v->str);
    return g_strdup_printf("the str \"%s\"", p);
  }
  case WSYNC_PICKLE_TUPLE:
    return g_strdup_printf("a tuple of %u", v->items->len);
  case WSYNC_PICKLE_LIST:
    return g_strdup_printf("a list of %u", v->items->len);
  case WSYNC_PICKLE_DICT:
    return g_strdup_printf("a dict of %u", v->items->len / 2);
  case WSYNC_PICKLE_GLOBAL:
    return g_strdup_printf("the global %s.%s", v->module, v->name);
  case WSYNC_PICKLE_OBJECT:
    return g_strdup_printf("a %s.%s object", v->cls->module, v->cls->name);
  case WSYNC_PICKLE_PERSID:
    return g_strdup("a persistent id");
  case WSYNC_PICKLE_LAYOUT:
    return g_strdup_printf("the layout %s", v->name);
  case WSYNC_PICKLE_ENUM:
    return g_strdup_printf("the member %s.%s", v->cls->name, v->name);
  }
  return g_strdup("a value");
}

/* ================================================================ the allowed globals */

typedef struct {
  const char *name;
  gboolean has_dtype;
  WsyncDtype dtype;
} NamedDtype;

/* torch dtype names (THPDtype_reduce writes the primary name; aliases are accepted
 * too).  The ones without a safetensors spelling are known but carry no dtype. */
static const NamedDtype torch_dtypes[] = {
    {"float32", TRUE, WSYNC_DTYPE_F32},
    {"float", TRUE, WSYNC_DTYPE_F32},
    {"float64", TRUE, WSYNC_DTYPE_F64},
    {"double", TRUE, WSYNC_DTYPE_F64},
    {"float16", TRUE, WSYNC_DTYPE_F16},
    {"half", TRUE, WSYNC_DTYPE_F16},
    {"bfloat16", TRUE, WSYNC_DTYPE_BF16},
    {"complex64", TRUE, WSYNC_DTYPE_C64},
    {"cfloat", TRUE, WSYNC_DTYPE_C64},
    {"uint8", TRUE, WSYNC_DTYPE_U8},
    {"int8", TRUE, WSYNC_DTYPE_I8},
    {"int16", TRUE, WSYNC_DTYPE_I16},
    {"short", TRUE, WSYNC_DTYPE_I16},
    {"int32", TRUE, WSYNC_DTYPE_I32},
    {"int", TRUE, WSYNC_DTYPE_I32},
    {"int64", TRUE, WSYNC_DTYPE_I64},
    {"long", TRUE, WSYNC_DTYPE_I64},
    {"bool", TRUE, WSYNC_DTYPE_BOOL},
    {"uint16", TRUE, WSYNC_DTYPE_U16},
    {"uint32", TRUE, WSYNC_DTYPE_U32},
    {"uint64", TRUE, WSYNC_DTYPE_U64},
    {"float8_e4m3fn", TRUE, WSYNC_DTYPE_F8_E4M3},
    {"float8_e5m2", TRUE, WSYNC_DTYPE_F8_E5M2},
    {"float8_e4m3fnuz", TRUE, WSYNC_DTYPE_F8_E4M3FNUZ},
    {"float8_e5m2fnuz", TRUE, WSYNC_DTYPE_F8_E5M2FNUZ},
    {"float8_e8m0fnu", TRUE, WSYNC_DTYPE_F8_E8M0},
    {"complex128", FALSE, 0},
    {"cdouble", FALSE, 0},
    {"complex32", FALSE, 0},
    {"chalf", FALSE, 0},
    {"float4_e2m1fn_x2", FALSE, 0},
    {"qint8", FALSE, 0},
    {"quint8", FALSE, 0},
    {"qint32", FALSE, 0},
    {"quint4x2", FALSE, 0},
    {"quint2x4", FALSE, 0},
    {"bits8", FALSE, 0},
    {"bits16", FALSE, 0},
    {"bits1x8", FALSE, 0},
    {"bits2x4", FALSE, 0},
    {"bits4x2", FALSE, 0},
};

/* The legacy typed storage classes torch.save names in a persistent id
 * (torch/storage.py, _dtype_to_storage_type_map).  Newer dtypes (float8, uint16+) are
 * saved as an UntypedStorage with _rebuild_tensor_v3 instead (_new_dtypes). */
static const NamedDtype torch_storages[] = {
    {"DoubleStorage", TRUE, WSYNC_DTYPE_F64},
    {"FloatStorage", TRUE, WSYNC_DTYPE_F32},
    {"HalfStorage", TRUE, WSYNC_DTYPE_F16},
    {"LongStorage", TRUE, WSYNC_DTYPE_I64},
    {"IntStorage", TRUE, WSYNC_DTYPE_I32},
    {"ShortStorage", TRUE, WSYNC_DTYPE_I16},
    {"CharStorage", TRUE, WSYNC_DTYPE_I8},
    {"ByteStorage", TRUE, WSYNC_DTYPE_U8},
    {"BoolStorage", TRUE, WSYNC_DTYPE_BOOL},
    {"BFloat16Storage", TRUE, WSYNC_DTYPE_BF16},
    {"ComplexFloatStorage", TRUE, WSYNC_DTYPE_C64},
    {"ComplexDoubleStorage", FALSE, 0},
    {"QInt8Storage", FALSE, 0},
    {"QInt32Storage", FALSE, 0},
    {"QUInt8Storage", FALSE, 0},
    {"QUInt4x2Storage", FALSE, 0},
    {"QUInt2x4Storage", FALSE, 0},
};

static const struct {
  const char *name;
  WsyncPickleGlobal global;
} dcp_classes[] = {
    {"Metadata", WSYNC_PG_METADATA},
    {"TensorStorageMetadata", WSYNC_PG_TENSOR_STORAGE_METADATA},
    {"BytesStorageMetadata", WSYNC_PG_BYTES_STORAGE_METADATA},
    {"ChunkStorageMetadata", WSYNC_PG_CHUNK_STORAGE_METADATA},
    {"TensorProperties", WSYNC_PG_TENSOR_PROPERTIES},
    {"_MEM_FORMAT_ENCODING", WSYNC_PG_MEM_FORMAT_ENCODING},
    {"MEM_FORMAT_ENCODING", WSYNC_PG_MEM_FORMAT_ENCODING}, /* torch.distributed._shard */
    {"MetadataIndex", WSYNC_PG_METADATA_INDEX},
    {"StorageMeta", WSYNC_PG_STORAGE_META},
    {"_StorageInfo", WSYNC_PG_STORAGE_INFO},
};

/* The members of DCP's enum classes (torch/distributed/checkpoint/metadata.py). */
typedef struct {
  const char *name;
  gint64 value;
} EnumMember;

static const EnumMember mem_format_members[] = {
    {"TORCH_CONTIGUOUS_FORMAT", 0},
    {"TORCH_CHANNELS_LAST", 1},
    {"TORCH_PRESERVE_FORMAT", 2},
};

static const struct {
  WsyncPickleGlobal cls;
  const EnumMember *members;
  guint n_members;
} dcp_enums[] = {
    {WSYNC_PG_MEM_FORMAT_ENCODING, mem_format_members, G_N_ELEMENTS(mem_format_members)},
};

/* torch's layouts, as str() prints them: what _get_layout's argument may be
 * (c10/core/Layout.h, torch/csrc/utils/tensor_layouts.cpp). */
static const char *const torch_layouts[] = {
    "torch.strided",    "torch.sparse_coo", "torch.sparse_csr", "torch.sparse_csc",
    "torch.sparse_bsr", "torch.sparse_bsc", "torch._mkldnn",    "torch.jagged",
};

static gboolean
is_torch_module(const char *module)
{
  return strcmp(module, "torch") == 0 || g_str_has_prefix(module, "torch.");
}

/* Fills @v (a GLOBAL with module and name set) when the global is allowed. */
static gboolean
classify_global(WsyncPickleValue *v)
{
  const char *module = v->module, *name = v->name;

  if (g_str_has_prefix(module, "torch.distributed.")) {
    for (guint i = 0; i < G_N_ELEMENTS(dcp_classes); i++)
      if (strcmp(name, dcp_classes[i].name) == 0) {
        v->global = dcp_classes[i].global;
        return TRUE;
      }
    return FALSE;
  }
  if (strcmp(module, "collections") == 0)
    return strcmp(name, "OrderedDict") == 0 ? (v->global = WSYNC_PG_ORDERED_DICT, TRUE) : FALSE;
  if (strcmp(module, "pathlib") == 0 || strcmp(module, "pathlib._local") == 0)
    return strcmp(name, "PosixPath") == 0 ? (v->global = WSYNC_PG_POSIX_PATH, TRUE) : FALSE;
  /* Protocol 2 writes builtins as Python 2's __builtin__ (CPython's fix_imports). */
  if (strcmp(module, "builtins") == 0 || strcmp(module, "__builtin__") == 0)
    return strcmp(name, "getattr") == 0 ? (v->global = WSYNC_PG_GETATTR, TRUE) : FALSE;
  if (!is_torch_module(module))
    return FALSE;

  if (strcmp(name, "_rebuild_tensor_v2") == 0 && strcmp(module, "torch._utils") == 0) {
    v->global = WSYNC_PG_REBUILD_TENSOR_V2;
    return TRUE;
  }
  if (strcmp(name, "_rebuild_tensor_v3") == 0 && strcmp(module, "torch._utils") == 0) {
    v->global = WSYNC_PG_REBUILD_TENSOR_V3;
    return TRUE;
  }
  if (strcmp(name, "_get_layout") == 0 && strcmp(module, "torch.serialization") == 0) {
    v->global = WSYNC_PG_GET_LAYOUT;
    return TRUE;
  }
  if (strcmp(name, "Size") == 0) {
    v->global = WSYNC_PG_SIZE;
    return TRUE;
  }
  if (strcmp(name, "UntypedStorage") == 0) {
    v->global = WSYNC_PG_UNTYPED_STORAGE;
    return TRUE;
  }
  for (guint i = 0; i < G_N_ELEMENTS(torch_dtypes); i++)
    if (strcmp(name, torch_dtypes[i].name) == 0) {
      v->global = WSYNC_PG_DTYPE;
      v->has_dtype = torch_dtypes[i].has_dtype;
      v->dtype = torch_dtypes[i].dtype;
      return TRUE;
    }
  for (guint i = 0; i < G_N_ELEMENTS(torch_storages); i++)
    if (strcmp(name, torch_storages[i].name) == 0) {
      v->global = WSYNC_PG_TYPED_STORAGE;
      v->has_dtype = torch_storages[i].has_dtype;
      v->dtype = torch_storages[i].dtype;
      return TRUE;
    }
  return FALSE;
}

/* ================================================================ the machine */

typedef struct {
  const guint8 *data;
  gsize len;
  gsize pos;    /* next byte to read */
  gsize op_pos; /* where the current opcode starts */
  const char *file;
  WsyncPickle *pk;
  GPtrArray *stack;  /* WsyncPickleValue*, not owned */
  GArray *marks;     /* guint: stack length at each MARK */
  GHashTable *memo;  /* index -> WsyncPickleValue* */
  guint max_values;  /* values (and memo entries) this pickle may create */
  WsyncPickleValue *none, *true_, *false_, *empty_tuple;
  WsyncPickleValue *small_ints[256]; /* 0..255, made on first use: ints are not memoized */
  GError **error;
} Reader;

static gboolean fail(Reader *r, const char *fmt, ...) G_GNUC_PRINTF(2, 3);

static gboolean
fail(Reader *r, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  g_autofree char *msg = g_strdup_vprintf(fmt, ap);
  va_end(ap);
  g_autofree char *pfile = wsync_json_printable(r->file);
  g_set_error(r->error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT,
              "%s: pickle byte %" G_GSIZE_FORMAT ": %s", pfile, r->op_pos, msg);
  return FALSE;
}

static const char *
opcode_name(guint8 op)
{
  switch (op) {
  case '(': return "MARK";
  case '.': return "STOP";
  case '0': return "POP";
  case '1': return "POP_MARK";
  case '2': return "DUP";
  case 'F': return "FLOAT";
  case 'I': return "INT";
  case 'J': return "BININT";
  case 'K': return "BININT1";
  case 'L': return "LONG";
  case 'M': return "BININT2";
  case 'N': return "NONE";
  case 'P': return "PERSID";
  case 'Q': return "BINPERSID";
  case 'R': return "REDUCE";
  case 'S': return "STRING";
  case 'T': return "BINSTRING";
  case 'U': return "SHORT_BINSTRING";
  case 'V': return "UNICODE";
  case 'X': return "BINUNICODE";
  case 'a': return "APPEND";
  case 'b': return "BUILD";
  case 'c': return "GLOBAL";
  case 'd': return "DICT";
  case '}': return "EMPTY_DICT";
  case 'e': return "APPENDS";
  case 'g': return "GET";
  case 'h': return "BINGET";
  case 'i': return "INST";
  case 'j': return "LONG_BINGET";
  case 'l': return "LIST";
  case ']': return "EMPTY_LIST";
  case 'o': return "OBJ";
  case 'p': return "PUT";
  case 'q': return "BINPUT";
  case 'r': return "LONG_BINPUT";
  case 's': return "SETITEM";
  case 't': return "TUPLE";
  case ')': return "EMPTY_TUPLE";
  case 'u': return "SETITEMS";
  case 'G': return "BINFLOAT";
  case 'B': return "BINBYTES";
  case 'C': return "SHORT_BINBYTES";
  case 0x80: return "PROTO";
  case 0x81: return "NEWOBJ";
  case 0x82: return "EXT1";
  case 0x83: return "EXT2";
  case 0x84: return "EXT4";
  case 0x85: return "TUPLE1";
  case 0x86: return "TUPLE2";
  case 0x87: return "TUPLE3";
  case 0x88: return "NEWTRUE";
  case 0x89: return "NEWFALSE";
  case 0x8a: return "LONG1";
  case 0x8b: return "LONG4";
  case 0x8c: return "SHORT_BINUNICODE";
  case 0x8d: return "BINUNICODE8";
  case 0x8e: return "BINBYTES8";
  case 0x8f: return "EMPTY_SET";
  case 0x90: return "ADDITEMS";
  case 0x91: return "FROZENSET";
  case 0x92: return "NEWOBJ_EX";
  case 0x93: return "STACK_GLOBAL";
  case 0x94: return "MEMOIZE";
  case 0x95: return "FRAME";
  case 0x96: return "BYTEARRAY8";
  case 0x97: return "NEXT_BUFFER";
  case 0x98: return "READONLY_BUFFER";
  default: return NULL;
  }
}

static WsyncPickleValue *
new_value(Reader *r, WsyncPickleKind kind)
{
  if (r->pk->values->len >= r->max_values) {
    fail(r, "more than %u values in %" G_GSIZE_FORMAT " bytes", r->max_values, r->len);
    return NULL;
  }
  WsyncPickleValue *v = g_new0(WsyncPickleValue, 1);
  v->kind = kind;
  g_ptr_array_add(r->pk->values, v);
  return v;
}

static WsyncPickleValue *
new_container(Reader *r, WsyncPickleKind kind)
{
  WsyncPickleValue *v = new_value(r, kind);
  if (v)
    v->items = g_ptr_array_new();
  return v;
}

static gboolean
push(Reader *r, WsyncPickleValue *v)
{
  if (v == NULL)
    return FALSE;
  if (r->stack->len >= WSYNC_PICKLE_MAX_STACK)
    return fail(r, "the stack holds more than %u values", WSYNC_PICKLE_MAX_STACK);
  g_ptr_array_add(r->stack, v);
  return TRUE;
}

/* The stack length below which the current MARK hides values. */
static guint
stack_base(Reader *r)
{
  return r->marks->len ? g_array_index(r->marks, guint, r->marks->len - 1) : 0;
}

static WsyncPickleValue *
pop(Reader *r)
{
  if (r->stack->len <= stack_base(r)) {
    fail(r, "%s needs a value but the stack is empty", opcode_name(r->data[r->op_pos]));
    return NULL;
  }
  return g_ptr_array_steal_index(r->stack, r->stack->len - 1);
}

static WsyncPickleValue *
top(Reader *r)
{
  if (r->stack->len <= stack_base(r)) {
    fail(r, "%s needs a value but the stack is empty", opcode_name(r->data[r->op_pos]));
    return NULL;
  }
  return g_ptr_array_index(r->stack, r->stack->len - 1);
}

/* Moves the values above the last MARK into @into (when not NULL) and drops the mark. */
static gboolean
pop_mark(Reader *r, GPtrArray *into)
{
  if (r->marks->len == 0)
    return fail(r, "%s without a MARK", opcode_name(r->data[r->op_pos]));
  guint start = g_array_index(r->marks, guint, r->marks->len - 1);
  g_array_set_size(r->marks, r->marks->len - 1);
  for (guint i = start; i < r->stack->len; i++)
    if (into)
      g_ptr_array_add(into, g_ptr_array_index(r->stack, i));
  g_ptr_array_set_size(r->stack, start);
  return TRUE;
}

static gboolean
need(Reader *r, gsize n)
{
  if (n > r->len - r->pos)
    return fail(r, "%s needs %" G_GSIZE_FORMAT " bytes but only %" G_GSIZE_FORMAT " are left",
                opcode_name(r->data[r->op_pos]), n, r->len - r->pos);
  return TRUE;
}

static guint64
read_le(Reader *r, guint n)
{
  guint64 v = 0;
  for (guint i = 0; i < n; i++)
    v |= (guint64)r->data[r->pos + i] << (8 * i);
  r->pos += n;
  return v;
}

static gboolean
push_int(Reader *r, gint64 value)
{
  gboolean small = value >= 0 && value < (gint64)G_N_ELEMENTS(r->small_ints);
  if (small && r->small_ints[value])
    return push(r, r->small_ints[value]);
  WsyncPickleValue *v = new_value(r, WSYNC_PICKLE_INT);
  if (v == NULL)
    return FALSE;
  v->integer = value;
  if (small)
    r->small_ints[value] = v;
  return push(r, v);
}

static gboolean
load_long1(Reader *r)
{
  if (!need(r, 1))
    return FALSE;
  guint n = r->data[r->pos++];
  if (!need(r, n))
    return FALSE;
  const guint8 *b = r->data + r->pos;
  r->pos += n;
  if (n == 0)
    return push_int(r, 0);
  /* Two's complement, little-endian.  Bytes past the eighth must only extend the sign. */
  gboolean negative = (b[n - 1] & 0x80) != 0;
  for (guint i = 8; i < n; i++)
    if (b[i] != (negative ? 0xff : 0x00))
      return fail(r, "LONG1 integer of %u bytes does not fit 64 bits", n);
  guint m = MIN(n, 8);
  guint64 u = negative ? G_MAXUINT64 : 0;
  for (guint i = 0; i < m; i++) {
    u &= ~((guint64)0xff << (8 * i));
    u |= (guint64)b[i] << (8 * i);
  }
  if (n > 8 && ((u >> 63) != 0) != negative)
    return fail(r, "LONG1 integer of %u bytes does not fit 64 bits", n);
  return push_int(r, (gint64)u);
}

static gboolean
load_string(Reader *r, guint len_bytes)
{
  if (!need(r, len_bytes))
    return FALSE;
  guint64 n = read_le(r, len_bytes);
  if (n > r->len - r->pos)
    return fail(r, "string of %" G_GUINT64_FORMAT " bytes goes past the end (%" G_GSIZE_FORMAT
                   " bytes left)",
                n, r->len - r->pos);
  const char *s = (const char *)r->data + r->pos;
  if (memchr(s, 0, n) != NULL)
    return fail(r, "string holds a NUL byte");
  if (!g_utf8_validate_len(s, n, NULL))
    return fail(r, "string is not valid UTF-8");
  WsyncPickleValue *v = new_value(r, WSYNC_PICKLE_STR);
  if (v == NULL)
    return FALSE;
  v->str = g_strndup(s, n);
  v->len = n;
  r->pos += n;
  return push(r, v);
}

static gboolean
push_layout(Reader *r, const char *name)
{
  WsyncPickleValue *v = new_value(r, WSYNC_PICKLE_LAYOUT);
  if (v == NULL)
    return FALSE;
  v->name = g_strdup(name);
  return push(r, v);
}

/* @s is ASCII Python identifiers joined by '.' (one only unless @dotted): what every
 * module and name on the list is. */
static gboolean
is_python_name(const char *s, gboolean dotted)
{
  gboolean start = TRUE;
  for (; *s; s++) {
    if (*s == '.' && dotted && !start) {
      start = TRUE;
      continue;
    }
    if (!(g_ascii_isalpha(*s) || *s == '_' || (!start && g_ascii_isdigit(*s))))
      return FALSE;
    start = FALSE;
  }
  return !start;
}

/* A GLOBAL value, refused unless it is on the list.  The list is matched by prefix
 * (torch.distributed.*, torch.*), so a module is first held to Python's spelling: one
 * with a control character in it ("torch.distributed.checkpoint\x0emetadata") was
 * accepted, and its raw bytes went into every later message that named the class. */
static gboolean
push_global(Reader *r, const char *module, gsize module_len, const char *name, gsize name_len)
{
  g_autofree char *m = g_strndup(module, module_len);
  g_autofree char *n = g_strndup(name, name_len);
  if (!is_python_name(m, TRUE) || !is_python_name(n, FALSE)) {
    g_autofree char *pm = wsync_json_printable(m);
    g_autofree char *pn = wsync_json_printable(n);
    return fail(r, "the global %s.%s is not one DCP writes (refused; nothing is imported)", pm, pn);
  }
  /* torch.strided as a bare global: not what torch writes, but it can only be that layout. */
  if (is_torch_module(m) && strcmp(n, "strided") == 0)
    return push_layout(r, "torch.strided");
  WsyncPickleValue probe = {.module = m, .name = n};
  if (!classify_global(&probe)) {
    g_autofree char *pm = wsync_json_printable(m);
    g_autofree char *pn = wsync_json_printable(n);
    return fail(r, "the global %s.%s is not one DCP writes (refused; nothing is imported)", pm, pn);
  }
  WsyncPickleValue *v = new_value(r, WSYNC_PICKLE_GLOBAL);
  if (v == NULL)
    return FALSE;
  v->global = probe.global;
  v->has_dtype = probe.has_dtype;
  v->dtype = probe.dtype;
  v->module = g_steal_pointer(&m);
  v->name = g_steal_pointer(&n);
  return push(r, v);
}

/* GLOBAL: "module\nname\n". */
static gboolean
load_global(Reader *r)
{
  const char *line[2];
  gsize line_len[2];
  for (int i = 0; i < 2; i++) {
    gsize left = r->len - r->pos;
    const guint8 *start = r->data + r->pos;
    const guint8 *nl = memchr(start, '\n', MIN(left, (gsize)WSYNC_PICKLE_MAX_NAME + 1));
    if (nl == NULL)
      return fail(r, "GLOBAL line is not terminated within %d bytes", WSYNC_PICKLE_MAX_NAME);
    line[i] = (const char *)start;
    line_len[i] = (gsize)(nl - start);
    if (memchr(line[i], 0, line_len[i]) || !g_utf8_validate_len(line[i], line_len[i], NULL))
      return fail(r, "GLOBAL line is not valid UTF-8 text");
    r->pos += line_len[i] + 1;
  }
  return push_global(r, line[0], line_len[0], line[1], line_len[1]);
}

static gboolean
load_stack_global(Reader *r)
{
  WsyncPickleValue *name = pop(r);
  if (name == NULL)
    return FALSE;
  WsyncPickleValue *module = pop(r);
  if (module == NULL)
    return FALSE;
  if (module->kind != WSYNC_PICKLE_STR || name->kind != WSYNC_PICKLE_STR)
    return fail(r, "STACK_GLOBAL needs two str values");
  if (module->len > WSYNC_PICKLE_MAX_NAME || name->len > WSYNC_PICKLE_MAX_NAME)
    return fail(r, "STACK_GLOBAL name longer than %d bytes", WSYNC_PICKLE_MAX_NAME);
  return push_global(r, module->str, module->len, name->str, name->len);
}

static gboolean
make_tuple(Reader *r, guint n)
{
  WsyncPickleValue *t = new_container(r, WSYNC_PICKLE_TUPLE);
  if (t == NULL)
    return FALSE;
  if (r->stack->len < stack_base(r) + n)
    return fail(r, "%s needs %u values but the stack holds fewer", opcode_name(r->data[r->op_pos]),
                n);
  guint start = r->stack->len - n;
  for (guint i = start; i < r->stack->len; i++)
    g_ptr_array_add(t->items, g_ptr_array_index(r->stack, i));
  g_ptr_array_set_size(r->stack, start);
  return push(r, t);
}

static gboolean
dict_add(Reader *r, WsyncPickleValue *dict, WsyncPickleValue *key, WsyncPickleValue *value)
{
  if (key->kind == WSYNC_PICKLE_LIST || key->kind == WSYNC_PICKLE_DICT)
    return fail(r, "dict key is unhashable (%s)",
                key->kind == WSYNC_PICKLE_LIST ? "a list" : "a dict");
  g_ptr_array_add(dict->items, key);
  g_ptr_array_add(dict->items, value);
  return TRUE;
}

static gboolean
load_setitems(Reader *r, gboolean one)
{
  g_autoptr(GPtrArray) items = g_ptr_array_new();
  if (one) {
    WsyncPickleValue *value = pop(r);
    if (value == NULL)
      return FALSE;
    WsyncPickleValue *key = pop(r);
    if (key == NULL)
      return FALSE;
    g_ptr_array_add(items, key);
    g_ptr_array_add(items, value);
  } else if (!pop_mark(r, items)) {
    return FALSE;
  }
  if (items->len % 2)
    return fail(r, "SETITEMS with an odd number of values (%u)", items->len);
  WsyncPickleValue *dict = top(r);
  if (dict == NULL)
    return FALSE;
  if (dict->kind != WSYNC_PICKLE_DICT) {
    g_autofree char *d = wsync_pickle_describe(dict);
    return fail(r, "%s on %s, not a dict", one ? "SETITEM" : "SETITEMS", d);
  }
  for (guint i = 0; i < items->len; i += 2)
    if (!dict_add(r, dict, g_ptr_array_index(items, i), g_ptr_array_index(items, i + 1)))
      return FALSE;
  return TRUE;
}

static gboolean
load_appends(Reader *r, gboolean one)
{
  g_autoptr(GPtrArray) items = g_ptr_array_new();
  if (one) {
    WsyncPickleValue *value = pop(r);
    if (value == NULL)
      return FALSE;
    g_ptr_array_add(items, value);
  } else if (!pop_mark(r, items)) {
    return FALSE;
  }
  WsyncPickleValue *list = top(r);
  if (list == NULL)
    return FALSE;
  if (list->kind != WSYNC_PICKLE_LIST) {
    g_autofree char *d = wsync_pickle_describe(list);
    return fail(r, "%s on %s, not a list", one ? "APPEND" : "APPENDS", d);
  }
  for (guint i = 0; i < items->len; i++)
    g_ptr_array_add(list->items, g_ptr_array_index(items, i));
  return TRUE;
}

/* "\"NAME\"" for a short str, "a str of N bytes" for a long one. */
static char *
quote_str(const WsyncPickleValue *s)
{
  if (s->len > 64)
    return g_strdup_printf("a str of %" G_GSIZE_FORMAT " bytes", s->len);
  g_autofree char *p = wsync_json_printable(s->str);
  return g_strdup_printf("\"%s\"", p);
}

static gboolean
push_enum(Reader *r, WsyncPickleValue *cls, const EnumMember *member)
{
  WsyncPickleValue *v = new_value(r, WSYNC_PICKLE_ENUM);
  if (v == NULL)
    return FALSE;
  v->cls = cls;
  v->name = g_strdup(member->name);
  v->integer = member->value;
  return push(r, v);
}

static gboolean
find_enum(const WsyncPickleValue *cls, guint *which)
{
  if (cls->kind != WSYNC_PICKLE_GLOBAL)
    return FALSE;
  for (guint i = 0; i < G_N_ELEMENTS(dcp_enums); i++)
    if (dcp_enums[i].cls == cls->global) {
      *which = i;
      return TRUE;
    }
  return FALSE;
}

/* REDUCE(enum class, (value,)): an Enum member pickled by value. */
static gboolean
load_enum_by_value(Reader *r, WsyncPickleValue *cls, WsyncPickleValue *args)
{
  guint e = 0;
  find_enum(cls, &e);
  const WsyncPickleValue *value = args->items->len == 1 ? g_ptr_array_index(args->items, 0) : NULL;
  if (value == NULL || value->kind != WSYNC_PICKLE_INT)
    return fail(r, "REDUCE of %s.%s with %u arguments is not something DCP writes (one int is: "
                   "the member's value)",
                cls->module, cls->name, args->items->len);
  for (guint i = 0; i < dcp_enums[e].n_members; i++)
    if (dcp_enums[e].members[i].value == value->integer)
      return push_enum(r, cls, &dcp_enums[e].members[i]);
  return fail(r, "%s.%s has no member of value %" G_GINT64_FORMAT, cls->module, cls->name,
              value->integer);
}

/* REDUCE(builtins.getattr, (enum class, "NAME")): an Enum member pickled by name.  Read
 * as that member and nothing else: getattr on anything but a known DCP enum class, or of
 * a name that is not one of its members, is refused. */
static gboolean
load_enum_by_name(Reader *r, WsyncPickleValue *getattr_, WsyncPickleValue *args)
{
  if (args->items->len != 2)
    return fail(r, "REDUCE of %s.%s with %u arguments is not something DCP writes (a DCP enum "
                   "class and a member name are)",
                getattr_->module, getattr_->name, args->items->len);
  WsyncPickleValue *cls = g_ptr_array_index(args->items, 0);
  const WsyncPickleValue *name = g_ptr_array_index(args->items, 1);
  guint e = 0;
  if (!find_enum(cls, &e)) {
    g_autofree char *d = wsync_pickle_describe(cls);
    return fail(r, "%s.%s on %s: getattr is read only as a member of a DCP enum class "
                   "(refused; nothing is called)",
                getattr_->module, getattr_->name, d);
  }
  if (name->kind != WSYNC_PICKLE_STR) {
    g_autofree char *d = wsync_pickle_describe(name);
    return fail(r, "%s.%s on %s.%s with %s, not a member name", getattr_->module,
                getattr_->name, cls->module, cls->name, d);
  }
  for (guint i = 0; i < dcp_enums[e].n_members; i++)
    if (strcmp(dcp_enums[e].members[i].name, name->str) == 0)
      return push_enum(r, cls, &dcp_enums[e].members[i]);
  g_autofree char *q = quote_str(name);
  return fail(r, "%s.%s has no member %s (refused; nothing is called)", cls->module, cls->name,
              q);
}

/* REDUCE(torch.serialization._get_layout, ("torch.NAME",)): a torch.layout. */
static gboolean
load_layout(Reader *r, WsyncPickleValue *get_layout, WsyncPickleValue *args)
{
  const WsyncPickleValue *name = args->items->len == 1 ? g_ptr_array_index(args->items, 0) : NULL;
  if (name == NULL || name->kind != WSYNC_PICKLE_STR)
    return fail(r, "REDUCE of %s.%s with %u arguments is not something DCP writes (one str is: "
                   "the layout's name)",
                get_layout->module, get_layout->name, args->items->len);
  for (guint i = 0; i < G_N_ELEMENTS(torch_layouts); i++)
    if (strcmp(torch_layouts[i], name->str) == 0)
      return push_layout(r, torch_layouts[i]);
  g_autofree char *q = quote_str(name);
  return fail(r, "%s.%s of %s, which is not a torch layout", get_layout->module,
              get_layout->name, q);
}

/* REDUCE (call) and NEWOBJ (cls.__new__): only the calls DCP's objects reduce to. */
static gboolean
load_call(Reader *r, gboolean newobj)
{
  const char *op = newobj ? "NEWOBJ" : "REDUCE";
  WsyncPickleValue *args = pop(r);
  if (args == NULL)
    return FALSE;
  WsyncPickleValue *callable = pop(r);
  if (callable == NULL)
    return FALSE;
  if (callable->kind != WSYNC_PICKLE_GLOBAL) {
    g_autofree char *d = wsync_pickle_describe(callable);
    return fail(r, "%s of %s, not a class", op, d);
  }
  if (args->kind != WSYNC_PICKLE_TUPLE) {
    g_autofree char *d = wsync_pickle_describe(args);
    return fail(r, "%s arguments are %s, not a tuple", op, d);
  }
  gboolean ok = FALSE;
  switch (callable->global) {
  case WSYNC_PG_METADATA:
  case WSYNC_PG_TENSOR_STORAGE_METADATA:
  case WSYNC_PG_BYTES_STORAGE_METADATA:
  case WSYNC_PG_CHUNK_STORAGE_METADATA:
  case WSYNC_PG_TENSOR_PROPERTIES:
  case WSYNC_PG_METADATA_INDEX:
  case WSYNC_PG_STORAGE_META:
  case WSYNC_PG_STORAGE_INFO:
    /* Dataclasses: copyreg.__newobj__ with no arguments, then BUILD. */
    ok = newobj && args->items->len == 0;
    break;
  case WSYNC_PG_MEM_FORMAT_ENCODING:
    if (!newobj)
      return load_enum_by_value(r, callable, args);
    break;
  case WSYNC_PG_GETATTR:
    if (!newobj)
      return load_enum_by_name(r, callable, args);
    break;
  case WSYNC_PG_GET_LAYOUT:
    if (!newobj)
      return load_layout(r, callable, args);
    break;
  case WSYNC_PG_SIZE:
  case WSYNC_PG_POSIX_PATH:
  case WSYNC_PG_REBUILD_TENSOR_V2:
  case WSYNC_PG_REBUILD_TENSOR_V3:
    ok = !newobj;
    break;
  case WSYNC_PG_ORDERED_DICT:
    /* OrderedDict.__reduce__: (OrderedDict, ()), then SETITEMS. */
    if (newobj || args->items->len != 0)
      break;
    return push(r, new_container(r, WSYNC_PICKLE_DICT));
  default:
    break;
  }
  if (!ok)
    return fail(r, "%s of %s.%s with %u arguments is not something DCP writes", op,
                callable->module, callable->name, args->items->len);
  WsyncPickleValue *v = new_value(r, WSYNC_PICKLE_OBJECT);
  if (v == NULL)
    return FALSE;
  v->cls = callable;
  v->args = args;
  v->newobj = newobj;
  return push(r, v);
}

static gboolean
load_build(Reader *r)
{
  WsyncPickleValue *state = pop(r);
  if (state == NULL)
    return FALSE;
  WsyncPickleValue *obj = top(r);
  if (obj == NULL)
    return FALSE;
  if (obj->kind != WSYNC_PICKLE_OBJECT) {
    g_autofree char *d = wsync_pickle_describe(obj);
    return fail(r, "BUILD on %s, not an object", d);
  }
  if (obj->state != NULL)
    return fail(r, "BUILD twice on one %s.%s object", obj->cls->module, obj->cls->name);
  obj->state = state;
  return TRUE;
}

static gboolean
memo_put(Reader *r, guint64 index)
{
  WsyncPickleValue *v = top(r);
  if (v == NULL)
    return FALSE;
  if (!g_hash_table_contains(r->memo, GSIZE_TO_POINTER(index)) &&
      g_hash_table_size(r->memo) >= r->max_values)
    return fail(r, "the memo holds more than %u values", r->max_values);
  g_hash_table_insert(r->memo, GSIZE_TO_POINTER(index), v);
  return TRUE;
}

static gboolean
memo_get(Reader *r, guint64 index)
{
  WsyncPickleValue *v = g_hash_table_lookup(r->memo, GSIZE_TO_POINTER(index));
  if (v == NULL)
    return fail(r, "memo entry %" G_GUINT64_FORMAT " was never stored", index);
  return push(r, v);
}

/* Runs one opcode; sets *stop at STOP. */
static gboolean
step(Reader *r, gboolean *stop)
{
  r->op_pos = r->pos;
  guint8 op = r->data[r->pos++];

  if (op == 0x80 /* PROTO */) {
    if (r->op_pos != 0)
      return fail(r, "PROTO after the first byte");
    if (!need(r, 1))
      return FALSE;
    guint proto = r->data[r->pos++];
    if (proto < 2 || proto > 5)
      return fail(r, "pickle protocol %u is not supported (2 to 5 are)", proto);
    r->pk->protocol = proto;
    return TRUE;
  }
  if (r->op_pos == 0)
    return fail(r, "does not start with PROTO (protocol 2 or later); not a pickle DCP writes");

  switch (op) {
  case 0x95: /* FRAME */
    if (!need(r, 8))
      return FALSE;
    {
      guint64 n = read_le(r, 8);
      if (n > r->len - r->pos)
        return fail(r, "FRAME of %" G_GUINT64_FORMAT " bytes goes past the end", n);
    }
    return TRUE;
  case '.': /* STOP */ {
    WsyncPickleValue *v = pop(r);
    if (v == NULL)
      return FALSE;
    if (r->marks->len)
      return fail(r, "STOP inside a MARK");
    if (r->stack->len)
      return fail(r, "STOP leaves %u values on the stack", r->stack->len);
    if (r->pos != r->len)
      return fail(r, "%" G_GSIZE_FORMAT " bytes after STOP", r->len - r->pos);
    r->pk->root = v;
    *stop = TRUE;
    return TRUE;
  }
  case '(': /* MARK */
    if (r->marks->len >= WSYNC_PICKLE_MAX_MARKS)
      return fail(r, "MARKs nest deeper than %d", WSYNC_PICKLE_MAX_MARKS);
    g_array_append_val(r->marks, r->stack->len);
    return TRUE;
  case 'N':
    return push(r, r->none);
  case 0x88:
    return push(r, r->true_);
  case 0x89:
    return push(r, r->false_);
  case 'K': /* BININT1 */
    return need(r, 1) && push_int(r, (gint64)read_le(r, 1));
  case 'M': /* BININT2 */
    return need(r, 2) && push_int(r, (gint64)read_le(r, 2));
  case 'J': /* BININT: signed 32 bits */
    return need(r, 4) && push_int(r, (gint64)(gint32)(guint32)read_le(r, 4));
  case 0x8a:
    return load_long1(r);
  case 0x8c: /* SHORT_BINUNICODE */
    return load_string(r, 1);
  case 'X': /* BINUNICODE */
    return load_string(r, 4);
  case 0x8d: /* BINUNICODE8 */
    return load_string(r, 8);
  case ')': /* tuples are immutable: one empty tuple serves all */
    if (r->empty_tuple == NULL)
      r->empty_tuple = new_container(r, WSYNC_PICKLE_TUPLE);
    return push(r, r->empty_tuple);
  case 't': { /* TUPLE */
    WsyncPickleValue *t = new_container(r, WSYNC_PICKLE_TUPLE);
    return t && pop_mark(r, t->items) && push(r, t);
  }
  case 0x85:
    return make_tuple(r, 1);
  case 0x86:
    return make_tuple(r, 2);
  case 0x87:
    return make_tuple(r, 3);
  case ']':
    return push(r, new_container(r, WSYNC_PICKLE_LIST));
  case '}':
    return push(r, new_container(r, WSYNC_PICKLE_DICT));
  case 'a':
    return load_appends(r, TRUE);
  case 'e':
    return load_appends(r, FALSE);
  case 's':
    return load_setitems(r, TRUE);
  case 'u':
    return load_setitems(r, FALSE);
  case 'c':
    return load_global(r);
  case 0x93:
    return load_stack_global(r);
  case 'R':
    return load_call(r, FALSE);
  case 0x81:
    return load_call(r, TRUE);
  case 'b':
    return load_build(r);
  case 'Q': { /* BINPERSID */
    WsyncPickleValue *pid = pop(r);
    if (pid == NULL)
      return FALSE;
    WsyncPickleValue *v = new_value(r, WSYNC_PICKLE_PERSID);
    if (v == NULL)
      return FALSE;
    v->args = pid;
    return push(r, v);
  }
  case 0x94: /* MEMOIZE */
    return memo_put(r, g_hash_table_size(r->memo));
  case 'q': /* BINPUT */
    return need(r, 1) && memo_put(r, read_le(r, 1));
  case 'r': /* LONG_BINPUT */
    return need(r, 4) && memo_put(r, read_le(r, 4));
  case 'h': /* BINGET */
    return need(r, 1) && memo_get(r, read_le(r, 1));
  case 'j': /* LONG_BINGET */
    return need(r, 4) && memo_get(r, read_le(r, 4));
  default: {
    const char *name = opcode_name(op);
    if (name)
      return fail(r, "opcode %s (0x%02x) is not one DCP writes", name, op);
    return fail(r, "0x%02x is not a pickle opcode", op);
  }
  }
}

WsyncPickle *
wsync_pickle_load(const guint8 *data, gsize len, const char *file, GError **error)
{
  g_return_val_if_fail(data != NULL || len == 0, NULL);
  g_return_val_if_fail(file != NULL, NULL);
  g_return_val_if_fail(error == NULL || *error == NULL, NULL);

  WsyncPickle *pk = g_new0(WsyncPickle, 1);
  pk->values = g_ptr_array_new_with_free_func(value_free);
  Reader r = {
      .data = data,
      .len = len,
      .file = file,
      .pk = pk,
      .stack = g_ptr_array_new(),
      .marks = g_array_new(FALSE, FALSE, sizeof(guint)),
      .memo = g_hash_table_new(g_direct_hash, g_direct_equal),
      .max_values = (guint)MIN((gsize)WSYNC_PICKLE_MAX_VALUES, len / 2 + 4096),
      .error = error,
  };
  r.none = new_value(&r, WSYNC_PICKLE_NONE);
  r.true_ = new_value(&r, WSYNC_PICKLE_BOOL);
  r.true_->integer = 1;
  r.false_ = new_value(&r, WSYNC_PICKLE_BOOL);

  gboolean ok = TRUE, stop = FALSE;
  while (ok && !stop) {
    if (r.pos >= len) {
      r.op_pos = len;
      ok = fail(&r, len == 0 ? "empty file, not a pickle" : "ends without STOP");
      break;
    }
    ok = step(&r, &stop);
  }
  g_ptr_array_unref(r.stack);
  g_array_unref(r.marks);
  g_hash_table_unref(r.memo);
  if (!ok) {
    wsync_pickle_free(pk);
    return NULL;
  }
  return pk;
}
