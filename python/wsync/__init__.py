"""wsync: LLM weights from a trainer's layout to an inference engine's, one rank at a time.

The commands as functions (what `wsync CMD --json` prints, as dicts):
    convert(src, dst, target=..., format=..., tp=..., ep=...), plan(src, ...),
    merge(src, dst), inspect(path)
The trainer side, every training step (see Session):
    s = Session("config.json", target="vllm", format="kernel", tp=4, out="/dev/shm/w")
The rollout side (see load_rank and wsync.vllm_worker):
    load_rank("/dev/shm/w", rank, model)

Errors raise wsync.Error with the one-line message the command line prints and
.exit_status, the status it exits with.  The bytes are moved by the C extension _wsync;
numpy and torch are used when the caller hands them over, never imported here.
"""

# private names: dir(wsync) and help(wsync) show the API (__all__), not these imports
import itertools as _itertools
import sys as _sys

from _wsync import (Bucket, Error, ManifestEntry, Session, __version__, convert,  # noqa: F401
                    inspect, merge, plan)
import _wsync

__all__ = ["Error", "Session", "Bucket", "ManifestEntry", "convert", "plan", "merge", "inspect",
           "load_rank"]

# The most bytes of a tensor load_rank holds in memory of its own while it copies into a
# torch parameter: one staging buffer, filled and copied a piece at a time.  A copy of the
# whole tensor would cost its size at every load (an 805 MB w13_weight per layer of
# Qwen3-30B-A3B), the memory growth users file against weight reloads (vLLM #48644, verl
# PR #7987; /work/shared/reference/anchors.md section 7).  The tests set it smaller.
_STAGING_BYTES = 64 << 20

# torch's dtypes by their str(), as safetensors names them.
_TORCH_DTYPES = {
    "torch.bool": "BOOL", "torch.uint8": "U8", "torch.int8": "I8",
    "torch.int16": "I16", "torch.uint16": "U16", "torch.float16": "F16",
    "torch.bfloat16": "BF16", "torch.int32": "I32", "torch.uint32": "U32",
    "torch.float32": "F32", "torch.complex64": "C64", "torch.float64": "F64",
    "torch.int64": "I64", "torch.uint64": "U64",
    "torch.float8_e5m2": "F8_E5M2", "torch.float8_e4m3fn": "F8_E4M3",
    "torch.float8_e8m0fnu": "F8_E8M0", "torch.float8_e4m3fnuz": "F8_E4M3FNUZ",
    "torch.float8_e5m2fnuz": "F8_E5M2FNUZ",
}


def _bad_input(message):
    """wsync.Error for input data that does not fit (exit status 3, as the command)."""
    error = Error(message)
    error.exit_status = 3
    return error


def _usage(message):
    """wsync.Error for a bad argument (exit status 2, as the command's usage errors)."""
    error = Error(message)
    error.exit_status = 2
    return error


def _flag(name, value):
    """A yes/no argument: a bool (or anything with a truth value), or its text
    "true"/"false" in any case, as vLLM's POST /collective_rpc passes every argument
    ("only serialized string args/kwargs are passed",
    vllm/entrypoints/serve/dev/rpc/api_router.py:38-41 @ df1376907b16); other text is
    refused rather than taken as true."""
    if isinstance(value, str):
        if value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise _usage(f"{name} must be true or false, not {value!r}")
    return bool(value)


def _shape_text(shape):
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _is_torch_tensor(obj):
    torch = _sys.modules.get("torch")  # a torch tensor means torch is imported already
    return torch is not None and isinstance(obj, torch.Tensor)


def _destination(params, name, where, buffers=True):
    """params[name], or the parameter (else, with buffers, the buffer) a torch module
    resolves name to."""
    what = f'{where}: tensor "{name}"'
    if hasattr(params, "get_parameter"):
        try:
            return params.get_parameter(name)
        except AttributeError:
            if not buffers:
                raise _bad_input(f"{what}: the model has no parameter of that name") from None
        try:  # sharded-state files also hold persistent buffers (attention scales)
            return params.get_buffer(name)
        except AttributeError:
            raise _bad_input(f"{what}: the model has no parameter or buffer of that name") from None
    try:
        return params[name]
    except KeyError:
        raise _bad_input(f"{what}: params has no entry of that name") from None


def _check_torch(tensor, dtype, shape, what):
    if getattr(tensor, "is_meta", False):  # copy_ into it does nothing, without an error
        raise _bad_input(f"{what}: the parameter is on the meta device, which holds no data "
                         "(a model being built, or reloaded)")
    have = _TORCH_DTYPES.get(str(tensor.dtype), str(tensor.dtype))
    if have != dtype:
        raise _bad_input(f"{what} is {dtype} {_shape_text(shape)}, but the parameter is {have}")
    if tuple(tensor.shape) != tuple(shape):
        raise _bad_input(f"{what} is {dtype} {_shape_text(shape)}, but the parameter has "
                         f"shape {_shape_text(tensor.shape)}")


def load_rank(dir, rank, params, *, verify=True, require_commit=True, version=None,
              digest=None, conf_dir=None, plugin_dir=None):
    """Copies the tensors of one rank's files in dir into live parameters.

    params: a mapping from tensor name to a writable, C-contiguous buffer (a numpy
    array; a BF16 tensor goes into any 2-byte integer array) or to a torch tensor, or a
    torch module whose get_parameter (for buffers, get_buffer) resolves the names.

    Nothing is copied until everything is checked:
      - the commit record wsync-commit.json a session writes last at each commit: it
        must exist (require_commit=False loads rank files without one, as `wsync
        convert` writes them; nothing then tells a complete step from one being
        written), be of `version` and of plan `digest` when given, and list files of
        `rank`; with verify=True (the default; it costs one read of the files) each
        file's checksum (wsync_session_checksum) must be the record's;
      - every tensor of the rank's files must have a destination of the same dtype and
        shape, not on torch's meta device (params may hold more).  The first difference
        is raised as wsync.Error naming the file and the tensor.
    Then numpy destinations are filled in C without the GIL, torch ones with
    param[rows].copy_() a piece at a time, from one staging buffer of at most 64 MiB
    (whatever the size of the tensors; strided parameters are written through their
    strides).  If a new step began meanwhile (the record changed), wsync.Error says so:
    load again.  If a file shrank under its memory map while it was copied (truncated
    or rewritten by another process), wsync.Error (exit_status 4) names the file and the
    tensor, and its attribute copied lists the tensors copied before it (that one may
    hold part of its bytes, the message says when; the others are as they were).

    The rank is the index of the rank files: with expert parallelism the EP rank,
    else the TP rank.  dir is a str, bytes or os.PathLike path; rank and version an int
    (numpy's too), version also its decimal text ("12", as vLLM keeps weight versions);
    digest a str; verify and require_commit a bool or the text "true"/"false".  Returns
    the commit record as a dict (None without one).

    conf_dir and plugin_dir (a path or a list of them, as `wsync --conf-dir` and
    `--plugin-dir`) serve rank files without a commit record (require_commit=False):
    the targets of the configuration tell which files are of which rank.  conf_dir
    replaces the installed configuration, plugin_dir is searched first for plugins;
    without them and without an installed configuration no target recognises a file,
    and the load fails with "no rank file of rank N".  A commit record lists the files
    itself: then they are not read.
    """
    verify, require_commit = _flag("verify", verify), _flag("require_commit", require_commit)
    files = _wsync._open_rank(dir, rank, require_commit=require_commit, verify=verify,
                              version=version, digest=digest, conf_dir=conf_dir,
                              plugin_dir=plugin_dir)
    return _load_opened(files, dir, rank, params)


def _load_opened(files, dir, rank, params, buffers=True, before_copy=None):
    """load_rank's checks and copies, once _wsync._open_rank has opened the rank's files
    (a caller may check files.files, their metadata, in between).  buffers=False
    resolves a torch module's names to parameters only.  before_copy, when given, is
    called once every check has passed and before the first byte is copied."""
    plain, tensors = [], []  # buffer-protocol destinations, torch tensors
    for index, (name, dtype, shape, path) in enumerate(files.entries):
        dest = _destination(params, name, path, buffers)
        if _is_torch_tensor(dest):
            _check_torch(dest, dtype, shape, f'{path}: tensor "{name}"')
            tensors.append((index, dest, shape))
        else:
            plain.append((index, dest))
    files.check(plain)
    if before_copy is not None:
        before_copy()
    names = [entry[0] for entry in files.entries]
    done = 0  # of plain, then of tensors
    try:
        files.copy(plain)
        done = len(plain)
        staging = _staging_buffer(tensors, _STAGING_BYTES)
        for index, param, shape in tensors:
            _copy_torch(files, index, param, shape, staging)
            done += 1
    except Error as e:
        copied = getattr(e, "copied", None)
        if copied is None:
            raise
        raise _shrunk(files, e, [names[i] for i, *_ in (plain + tensors)[:done + copied]],
                      len(plain) + len(tensors), getattr(e, "partial", True)) from None
    if not files.is_current():
        raise _bad_input(f"{dir}: a new step began while rank {rank} was loading (the "
                         "commit record changed): the parameters hold a mix of steps; load "
                         "again")
    return files.record


def _shrunk(files, error, copied, total, partial):
    """wsync.Error for a rank file that shrank under its map while load_rank copied from
    it (the C side's error names the file and the tensor): it adds which parameters hold
    the new bytes (.copied, their names in copy order) and, when partial, that the
    tensor named may hold some (a numpy destination is copied in one memcpy that the
    fault stopped; a torch one holds the pieces copied before the fault, partial only if
    there were any); the others are as they were."""
    step = "" if files.is_current() else " (a new step began: the commit record changed)"
    part = "this one in part, " if partial else ""
    shrunk = Error(f"{error}: {len(copied)} of the {total} tensors were copied before it "
                   f"(Error.copied names them), {part}the others are as they "
                   f"were{step}; load again")
    shrunk.exit_status = getattr(error, "exit_status", 4)
    shrunk.copied = copied
    return shrunk


def _staging_buffer(tensors, budget):
    """The buffer _copy_torch copies every torch destination through: budget bytes, or
    the largest destination's size where smaller, or one element where budget is less
    (the tests' budgets); None without a torch destination with bytes."""
    sizes = [param.element_size() * _count(shape) for _, param, shape in tensors]
    if not any(sizes):
        return None
    largest_item = max(param.element_size() for _, param, _ in tensors)
    return bytearray(max(min(budget, max(sizes)), largest_item))


def _count(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _pieces(shape, itemsize, limit):
    """The pieces _copy_torch copies a tensor of shape in, at most limit bytes each (limit
    at least itemsize): (index, piece shape, byte offset in the tensor, bytes), in the
    tensor's order.  A piece is a run of rows along one dimension: of dimension 0 where a
    row (the elements after it) fits in limit, else of the first dimension whose rows do,
    at each position of the dimensions before it.  Indexing a parameter with it gives a
    view of the parameter (torch's basic indexing): copy_ writes through its strides, so a
    strided parameter (a transposed view) is filled as it is, never through a reshape,
    which would copy it.  A 0-dim tensor is one piece, index None: the parameter itself."""
    if not shape:
        yield None, (), 0, itemsize
        return
    row = itemsize * _count(shape[1:])
    split = 0
    while row > limit:  # then split is not the last dimension: the last's row is itemsize
        split += 1
        row //= shape[split]
    rows = limit // row
    outer = shape[:split]
    for position, prefix in enumerate(_itertools.product(*(range(d) for d in outer))):
        first = position * shape[split]  # the row of dimension split where prefix starts
        for start in range(0, shape[split], rows):
            stop = min(start + rows, shape[split])
            yield (prefix + (slice(start, stop),), (stop - start,) + tuple(shape[split + 1:]),
                   (first + start) * row, (stop - start) * row)


def _copy_torch(files, index, param, shape, staging):
    """param.copy_() of entry index, a piece at a time (_pieces): files.readinto() fills
    staging behind the guard against a file truncated under its map (torch reading the
    map itself would end the process with SIGBUS), then the piece of param takes it.
    Memory of load_rank's own stays staging, whatever the tensor.  On wsync.Error, its
    attribute partial says whether pieces were copied before the one that faulted."""
    import torch

    itemsize = param.element_size()
    if _count(shape) == 0:
        return
    copied = False
    with torch.no_grad():
        for where, piece, offset, nbytes in _pieces(tuple(shape), itemsize, len(staging)):
            try:
                files.readinto(index, offset, nbytes, staging)
            except Error as e:
                e.partial = copied
                raise
            source = torch.frombuffer(staging, dtype=param.dtype, count=nbytes // itemsize)
            # a blocking copy_ (to a device too) has read source when it returns: the next
            # piece may overwrite staging
            (param if where is None else param[where]).copy_(source.reshape(piece))
            copied = True
