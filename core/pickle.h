/* wsync: a restricted reader for the pickles of PyTorch distributed checkpoints.
 *
 * Private to libwsync (not installed).  The functions are exported from the shared
 * library only so that the `wsync` command, the tests and the fuzz harness can call them.
 *
 * What it reads: the `.metadata` file of a DCP checkpoint (pickle protocol 2 to 5, a
 * `torch.distributed.checkpoint.metadata.Metadata` object) and the `data.pkl` record of a
 * `torch.save` archive (protocol 2, a `torch._utils._rebuild_tensor_v2` call).  See
 * `docs/dcp.md` §3.
 *
 * What it does NOT do: execute, import or call anything.  Every opcode and every global
 * outside the short lists below is refused, with the byte offset and the name.  An
 * instance (NEWOBJ or REDUCE of an allowed global) is kept as an inert record: its class,
 * its argument tuple and its BUILD state; interpreting those is dcp.c's job.  Three
 * REDUCEs are read as data here instead, because what they stand for depends only on
 * their arguments (none is ever called):
 *   torch.serialization._get_layout("torch.strided") -- how torch pickles every
 *     torch.layout (a copyreg entry); the name must be one of torch's layouts;
 *   _MEM_FORMAT_ENCODING(0) -- an Enum member pickled by value (e.g. Python 3.11.7);
 *   builtins.getattr(_MEM_FORMAT_ENCODING, "TORCH_CONTIGUOUS_FORMAT") -- the same member
 *     pickled by name (Debian 12's Python 3.11.2); `__builtin__.getattr` at protocol 2.
 *     getattr is accepted only on a known DCP enum class and one of its member names.
 * They become #WSYNC_PICKLE_LAYOUT and #WSYNC_PICKLE_ENUM values.
 *
 * Opcodes understood (what CPython's pickler emits for these objects, no more):
 *   PROTO FRAME STOP MARK NONE NEWTRUE NEWFALSE BININT BININT1 BININT2 LONG1
 *   BINUNICODE SHORT_BINUNICODE BINUNICODE8 EMPTY_TUPLE TUPLE TUPLE1 TUPLE2 TUPLE3
 *   EMPTY_LIST APPEND APPENDS EMPTY_DICT SETITEM SETITEMS GLOBAL STACK_GLOBAL
 *   REDUCE NEWOBJ BUILD BINPERSID MEMOIZE BINPUT LONG_BINPUT BINGET LONG_BINGET.
 *
 * Globals allowed (classes are matched by their final name; the module must be the one
 * torch uses, or for the checkpoint classes any module under `torch.distributed.`):
 *   the DCP classes Metadata, TensorStorageMetadata, TensorProperties,
 *   _MEM_FORMAT_ENCODING, ChunkStorageMetadata, BytesStorageMetadata, MetadataIndex,
 *   StorageMeta, _StorageInfo (and MEM_FORMAT_ENCODING, the enum's name in the older
 *   torch.distributed._shard modules); torch.Size, the torch dtypes (torch.bfloat16,
 *   ...), the storage classes (torch.BFloat16Storage, ..., torch.UntypedStorage),
 *   torch._utils._rebuild_tensor_v2 and _rebuild_tensor_v3,
 *   torch.serialization._get_layout, builtins.getattr (as above), collections.OrderedDict,
 *   and PosixPath from `pathlib` or `pathlib._local`.  The bare global torch.strided,
 *   which real torch does not write (its copyreg entry wins) but which names the same
 *   layout, is read as that layout.
 *
 * Bounds (a hostile file cannot make it allocate without bound): string lengths are
 * checked against the bytes left before anything is allocated; the value stack and the
 * mark stack are capped (constants below); the values created and the memo entries are
 * each capped at one per two input bytes plus 4096 (CPython's pickles of DCP metadata
 * hold about one per six: small ints and the empty tuple are shared, since the pickler
 * does not memoize them), and at #WSYNC_PICKLE_MAX_VALUES.  Memory therefore stays
 * within a small multiple of the file size (about 60 bytes per input byte at worst).
 * Self-referencing containers are possible (a list that holds itself); nothing here
 * walks values recursively, and callers walk only fixed paths.
 *
 * Errors: one #WSYNC_ERROR_BAD_INPUT line, "FILE: pickle byte N: PROBLEM".
 */
#ifndef WSYNC_PICKLE_H
#define WSYNC_PICKLE_H

#include <glib.h>
#include <wsync/dtype.h>

G_BEGIN_DECLS

/** The deepest MARK nesting accepted (DCP's metadata needs about 8). */
#define WSYNC_PICKLE_MAX_MARKS 64
/** The most values the stack may hold at once. */
#define WSYNC_PICKLE_MAX_STACK (1u << 20)
/** The most values (and memo entries) one pickle may create, whatever its size. */
#define WSYNC_PICKLE_MAX_VALUES (1u << 28)
/** The longest GLOBAL line (module or name) accepted. */
#define WSYNC_PICKLE_MAX_NAME 256

/**
 * WsyncPickleKind:
 * @WSYNC_PICKLE_NONE: None
 * @WSYNC_PICKLE_BOOL: True or False (@integer is 1 or 0)
 * @WSYNC_PICKLE_INT: an integer that fits 64 signed bits (@integer)
 * @WSYNC_PICKLE_STR: a str (@str, @len): valid UTF-8 without NUL bytes
 * @WSYNC_PICKLE_TUPLE: a tuple (@items)
 * @WSYNC_PICKLE_LIST: a list (@items)
 * @WSYNC_PICKLE_DICT: a dict or an OrderedDict (@items: key, value, key, value, ...
 *   in insertion order; a key set twice appears twice)
 * @WSYNC_PICKLE_GLOBAL: an allowed global (@global, @dtype, @module, @name)
 * @WSYNC_PICKLE_OBJECT: an instance: @cls called with @args (REDUCE) or created from
 *   @cls with @args (NEWOBJ, @newobj set), plus the BUILD @state if any
 * @WSYNC_PICKLE_PERSID: a persistent id (BINPERSID); @args is the id
 * @WSYNC_PICKLE_LAYOUT: a torch.layout; @name is its name as torch prints it
 *   ("torch.strided", "torch.sparse_coo", ...)
 * @WSYNC_PICKLE_ENUM: a member of a known DCP enum class, pickled by value or by name:
 *   @cls is the class (a GLOBAL), @name the member's name, @integer its value
 */
typedef enum {
  WSYNC_PICKLE_NONE,
  WSYNC_PICKLE_BOOL,
  WSYNC_PICKLE_INT,
  WSYNC_PICKLE_STR,
  WSYNC_PICKLE_TUPLE,
  WSYNC_PICKLE_LIST,
  WSYNC_PICKLE_DICT,
  WSYNC_PICKLE_GLOBAL,
  WSYNC_PICKLE_OBJECT,
  WSYNC_PICKLE_PERSID,
  WSYNC_PICKLE_LAYOUT,
  WSYNC_PICKLE_ENUM,
} WsyncPickleKind;

/**
 * WsyncPickleGlobal:
 *
 * Which allowed global a #WSYNC_PICKLE_GLOBAL value is.
 */
typedef enum {
  WSYNC_PG_METADATA,               /* torch.distributed.checkpoint.metadata.Metadata */
  WSYNC_PG_TENSOR_STORAGE_METADATA,
  WSYNC_PG_BYTES_STORAGE_METADATA,
  WSYNC_PG_CHUNK_STORAGE_METADATA,
  WSYNC_PG_TENSOR_PROPERTIES,
  WSYNC_PG_MEM_FORMAT_ENCODING,    /* _MEM_FORMAT_ENCODING (an Enum), or MEM_FORMAT_ENCODING */
  WSYNC_PG_METADATA_INDEX,
  WSYNC_PG_STORAGE_META,
  WSYNC_PG_STORAGE_INFO,           /* torch.distributed.checkpoint.filesystem._StorageInfo */
  WSYNC_PG_SIZE,                   /* torch.Size */
  WSYNC_PG_DTYPE,                  /* torch.bfloat16, ...: see @dtype, @has_dtype */
  WSYNC_PG_TYPED_STORAGE,          /* torch.BFloat16Storage, ...: see @dtype, @has_dtype */
  WSYNC_PG_UNTYPED_STORAGE,        /* torch.UntypedStorage */
  WSYNC_PG_REBUILD_TENSOR_V2,      /* torch._utils._rebuild_tensor_v2 */
  WSYNC_PG_REBUILD_TENSOR_V3,      /* torch._utils._rebuild_tensor_v3 */
  WSYNC_PG_ORDERED_DICT,           /* collections.OrderedDict */
  WSYNC_PG_POSIX_PATH,             /* pathlib.PosixPath, pathlib._local.PosixPath */
  WSYNC_PG_GET_LAYOUT,             /* torch.serialization._get_layout */
  WSYNC_PG_GETATTR,                /* builtins.getattr (__builtin__.getattr at protocol 2) */
} WsyncPickleGlobal;

typedef struct _WsyncPickleValue WsyncPickleValue;

/**
 * WsyncPickleValue:
 *
 * One value of a loaded pickle.  Values live as long as their #WsyncPickle; one value
 * may be reachable several times (the memo), and containers may be cyclic.
 */
struct _WsyncPickleValue {
  WsyncPickleKind kind;
  gint64 integer;            /* BOOL, INT, ENUM (the member's value) */
  const char *str;           /* STR (NUL-terminated copy) */
  gsize len;                 /* STR: length in bytes */
  GPtrArray *items;          /* TUPLE, LIST, DICT: WsyncPickleValue* */
  WsyncPickleGlobal global;  /* GLOBAL */
  gboolean has_dtype;        /* GLOBAL DTYPE/TYPED_STORAGE: the dtype has a safetensors name */
  WsyncDtype dtype;          /* GLOBAL DTYPE/TYPED_STORAGE when @has_dtype */
  const char *module;        /* GLOBAL: as written */
  const char *name;          /* GLOBAL: as written; LAYOUT, ENUM: see #WsyncPickleKind */
  WsyncPickleValue *cls;     /* OBJECT, ENUM */
  WsyncPickleValue *args;    /* OBJECT (a TUPLE), PERSID (the id) */
  WsyncPickleValue *state;   /* OBJECT: BUILD state, or NULL */
  gboolean newobj;           /* OBJECT: made by NEWOBJ rather than REDUCE */
};

/** A loaded pickle: an arena that owns every value. */
typedef struct _WsyncPickle WsyncPickle;

/**
 * wsync_pickle_load:
 * @data: the pickle bytes; need not outlive the result
 * @len: their number
 * @file: the file (or `FILE:entry`) for messages
 * @error: return location for a #WSYNC_ERROR_BAD_INPUT error
 *
 * Reads one pickle of protocol 2 to 5 that starts with PROTO and ends with STOP at the
 * last byte, within the limits above.
 *
 * Returns: (transfer full) (nullable): the pickle, or %NULL with @error set.
 */
WsyncPickle *wsync_pickle_load(const guint8 *data, gsize len, const char *file, GError **error);

/**
 * wsync_pickle_root:
 * @pickle: a loaded pickle
 *
 * Returns: (transfer none): the value STOP returned.
 */
const WsyncPickleValue *wsync_pickle_root(const WsyncPickle *pickle);

/**
 * wsync_pickle_protocol:
 * @pickle: a loaded pickle
 *
 * Returns: the protocol of its PROTO opcode (2 to 5).
 */
guint wsync_pickle_protocol(const WsyncPickle *pickle);

/**
 * wsync_pickle_free:
 * @pickle: (nullable): a pickle
 *
 * Frees it and every value in it.
 */
void wsync_pickle_free(WsyncPickle *pickle);

/**
 * wsync_pickle_n_items:
 * @v: a value
 *
 * Returns: the number of items of a TUPLE or LIST, the number of key/value pairs of a
 *   DICT, 0 for anything else.
 */
guint wsync_pickle_n_items(const WsyncPickleValue *v);

/**
 * wsync_pickle_item:
 * @v: a TUPLE or LIST
 * @i: an index below wsync_pickle_n_items()
 *
 * Returns: (transfer none): item @i.
 */
const WsyncPickleValue *wsync_pickle_item(const WsyncPickleValue *v, guint i);

/**
 * wsync_pickle_dict_key:
 * @v: a DICT
 * @i: a pair index below wsync_pickle_n_items()
 *
 * Returns: (transfer none): the key of pair @i.
 */
const WsyncPickleValue *wsync_pickle_dict_key(const WsyncPickleValue *v, guint i);

/**
 * wsync_pickle_dict_value:
 * @v: a DICT
 * @i: a pair index below wsync_pickle_n_items()
 *
 * Returns: (transfer none): the value of pair @i.
 */
const WsyncPickleValue *wsync_pickle_dict_value(const WsyncPickleValue *v, guint i);

/**
 * wsync_pickle_dict_lookup:
 * @v: a DICT
 * @key: a string key
 *
 * Finds the pair whose key is the str @key (the last one, as Python would).
 *
 * Returns: (transfer none) (nullable): its value, or %NULL.
 */
const WsyncPickleValue *wsync_pickle_dict_lookup(const WsyncPickleValue *v, const char *key);

/**
 * wsync_pickle_is_instance:
 * @v: (nullable): a value
 * @global: an allowed global
 *
 * Returns: %TRUE when @v is an OBJECT whose class is @global.
 */
gboolean wsync_pickle_is_instance(const WsyncPickleValue *v, WsyncPickleGlobal global);

/**
 * wsync_pickle_describe:
 * @v: (nullable): a value
 *
 * A short, non-recursive description for messages: "None", "the int 3", "a str",
 * "a tuple of 2", "a torch.Size", "the global torch.bfloat16", "the layout
 * torch.strided", "the member _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT", ...
 *
 * Returns: (transfer full): the description; free it with g_free().
 */
char *wsync_pickle_describe(const WsyncPickleValue *v);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(WsyncPickle, wsync_pickle_free)

G_END_DECLS

#endif /* WSYNC_PICKLE_H */
