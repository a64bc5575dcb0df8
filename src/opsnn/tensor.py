"""``opsnn.Tensor``: a strided view (shape, strides, offset, dtype, format) of pool memory.

Views (reshape, transpose, slicing, expand, ...) never copy; ``contiguous()`` copies only
when the layout needs it. Tensors written by a kernel on a worker stream remember it, and
reading them from the host (``numpy()``) waits for that kernel::

    >>> import opsnn, numpy as np
    >>> t = opsnn.tensor(np.arange(6, dtype=np.float32)).reshape(2, 3)
    >>> t.transpose(0, 1).shape
    (3, 2)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import math
import weakref

import numpy as np

from . import dtypes as _dt
from .errors import KernelError, ParamInvalidError, TensorIndexError
from .runtime.context import context
from .runtime.memory import check_request, physical_memory

FORMATS = ("ND", "NCHW", "NHWC")


class Storage:
    """Owns one pool block; numpy arrays over it keep it alive, and it returns the block
    to the pool when the last of them dies (so a user's ``numpy()`` view is never recycled
    under them). ``np.asarray(storage)`` is the array itself: the interface names its shape
    and type (builtin numpy types), or the block's bytes (types such as ml_dtypes' bfloat16,
    which the array interface cannot name: viewed afterwards)."""

    __slots__ = ("block", "pool", "iface", "serial", "__weakref__")

    #: allocation order: a storage whose serial is at least a mark taken earlier was made after it
    _serials = itertools.count()

    def __init__(self, pool, nbytes: int, tag: str | None = None, iface: dict | None = None):
        self.pool = None  # set only once the block exists, so __del__ never frees a failed allocation
        self.serial = next(Storage._serials)
        self.block = block = pool.allocate(nbytes, tag)
        self.pool = pool
        if iface is not None:
            iface["data"] = (block.ptr, False)
        self.iface = iface

    @property
    def __array_interface__(self) -> dict:
        return self.iface or self.block.interface

    def __del__(self):
        pool = self.pool
        if pool is not None:
            pool.free(self.block)


#: the most dimensions a tensor may have (numpy's limit)
MAX_DIMS = 64


def _alloc_array(shape: tuple, dtype: np.dtype, tag: str | None = None) -> np.ndarray:
    if len(shape) > MAX_DIMS:
        raise ParamInvalidError(
            f"{tag or 'tensor'}: an output of {len(shape)} dimensions; at most {MAX_DIMS} are supported"
        )
    nbytes = math.prod(shape) * dtype.itemsize
    if dtype.hasobject or (nbytes >= 1 << 30 and nbytes > physical_memory()):
        # refused with the shape named (the pool would refuse it too, naming bytes only); string
        # tensors are checked against the cap here: they hold Python object pointers, which raw
        # pool bytes cannot own
        check_request(nbytes, f"{tag or 'tensor'} of shape {tuple(shape)} {_dt.name(dtype)}")
    if dtype.hasobject:
        return np.empty(shape, dtype)
    if dtype.isbuiltin == 1 and dtype.kind in "biufc":
        # one step: the interface gives numpy the final array (cheaper than a byte view, then a view)
        return np.asarray(
            Storage(context().pool, nbytes, tag, {"shape": tuple(shape), "typestr": dtype.str, "version": 3})
        )
    buf = np.asarray(Storage(context().pool, nbytes, tag))  # base is the Storage: keeps the block alive
    return buf[:nbytes].view(dtype).reshape(shape)


#: id(memory owner) -> how many times a Tensor method wrote into that memory in place; only memory
#: written in place appears (an entry goes with its owner). Autograd compares a saved tensor's count at
#: record time with the count at backward, as torch's version counters do.
VERSIONS: dict[int, int] = {}


def _owner(arr: np.ndarray):
    top = arr
    while isinstance(top.base, np.ndarray):
        top = top.base
    return top.base if top.base is not None else top


def bump_version(t: Tensor) -> None:
    """Count one in-place write into ``t``'s memory (every view of it sees the new count)."""
    owner = _owner(t._array)
    key = id(owner)
    if key not in VERSIONS:
        try:
            weakref.finalize(owner, VERSIONS.pop, key, None)
        except TypeError:  # memory owned by an object without weak references (a bytearray): the entry stays
            pass
    VERSIONS[key] = VERSIONS.get(key, 0) + 1


def version(t: Tensor) -> int:
    """How many in-place writes ``t``'s memory has seen."""
    return VERSIONS.get(id(_owner(t._array)), 0) if VERSIONS else 0


def storage_mark() -> int:
    """A point in allocation order: storages made after it have ``serial >= storage_mark()``."""
    return next(Storage._serials)


def whole_storage(arr: np.ndarray):
    """The pool Storage ``arr`` spans entirely and contiguously (the array an op allocated for an
    output, or a reshape of it), else None (a slice, a broadcast or strided view, numpy memory)."""
    top = arr
    while isinstance(top.base, np.ndarray):
        top = top.base
    st = top.base
    if (
        not isinstance(st, Storage)
        or not arr.flags.c_contiguous
        or not arr.flags.writeable
        or arr.nbytes != top.nbytes
        or (arr.nbytes and arr.ctypes.data != top.ctypes.data)
    ):
        return None
    return st


def _check_format(fmt: str, ndim: int) -> str:
    if fmt not in FORMATS:
        raise ParamInvalidError(f"Tensor: unknown format {fmt!r}; expected one of {FORMATS}")
    if fmt != "ND" and ndim != 4:
        raise ParamInvalidError(f"Tensor: format {fmt} needs a 4-D tensor, got {ndim}-D")
    return fmt


#: set by graph.tracing while a training step is traced: reports host reads of computed values
_host_read_hook = None


def checked_value(t: Tensor) -> np.ndarray:
    """``t``'s value for a validity check that only raises (token ids in range): read without
    counting as a traced host read. A traced graph skips the check at later calls, so the code
    that checks must make the graph refuse the same inputs."""
    global _host_read_hook
    hook, _host_read_hook = _host_read_hook, None
    try:
        return t.numpy()
    finally:
        _host_read_hook = hook


def tracing_training_step() -> bool:
    """True while a training step is traced (graph.tracing.StateTracer): code whose host checks a
    compiled call skips adds graph ops that refuse the same inputs."""
    return _host_read_hook is not None


def _tracing() -> bool:
    """True while opsnn.compile traces a function: view methods then record graph ops."""
    from .ops import executor

    return executor._tracer is not None


class Tensor:
    """A tensor in opsnn memory. Build one with :func:`tensor`, :func:`empty`,
    :func:`from_numpy` or :func:`from_dlpack`; ops return them."""

    __slots__ = ("_array", "format", "_producer", "_pinned", "__weakref__")
    __array_priority__ = 1000  # numpy defers binary operators to Tensor

    def __init__(self, array: np.ndarray, format: str = "ND", producer=None):
        self._array = array
        self.format = format
        self._producer = producer
        self._pinned = False

    # -- metadata --------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        return self._array.shape

    @property
    def dtype(self) -> np.dtype:
        return self._array.dtype

    @property
    def ndim(self) -> int:
        return self._array.ndim

    @property
    def strides(self) -> tuple:
        """Strides in elements (not bytes)."""
        isz = self._array.dtype.itemsize
        return tuple(s // isz for s in self._array.strides)

    @property
    def offset(self) -> int:
        """Offset in elements from the start of the underlying storage."""
        root = self._array
        while isinstance(root.base, np.ndarray):
            root = root.base
        return (self._array.ctypes.data - root.ctypes.data) // self._array.dtype.itemsize

    @property
    def numel(self) -> _Count:
        """The element count; an int that can also be called, as torch's ``t.numel()``."""
        return _Count(self._array.size)

    def nelement(self) -> int:
        return self._array.size

    def dim(self) -> int:
        """The number of dimensions (torch's name for ``ndim``)."""
        return self._array.ndim

    ndimension = dim

    def element_size(self) -> int:
        return self._array.dtype.itemsize

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[_norm_dim(dim, self.ndim, "size")]

    @property
    def nbytes(self) -> int:
        return self._array.nbytes

    @property
    def device(self):
        return context().device

    def is_contiguous(self) -> bool:
        return self._array.flags.c_contiguous

    # -- host access -------------------------------------------------------------
    def _wait(self, check: bool = True) -> None:
        """Wait for the kernel that writes this tensor; with ``check``, raise if it failed. The
        failure mark stays (synchronize() reporting the error does not make the data valid) until
        a new write replaces the producer: an op's output, ``copy_`` or a whole ``t[...] = v``."""
        p = self._producer
        if p is not None:
            stream, seq = p[0], p[1]
            if not check:
                stream._wait_quiet(seq)
                return
            stream.wait_seq(seq)
            if len(p) > 2 and p[2]:
                raise KernelError(
                    f"{p[2][0]}: the kernel that produced this tensor failed on stream "
                    f"{stream.name}; its output holds no valid data until it is written again",
                    op=p[2][0],
                )
            self._producer = None

    def numpy(self) -> np.ndarray:
        """A numpy view of the data (no copy); waits for the kernel that writes it."""
        if _host_read_hook is not None:
            _host_read_hook(self)
        self._wait()
        return self._array

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype)

    def item(self):
        """The value of a one-element tensor as a Python number."""
        if self.numel != 1:
            raise ParamInvalidError(
                f"item: only a one-element tensor has a Python value; this one has shape {self.shape} "
                f"({self.numel} elements): use .tolist() or .numpy()"
            )
        return self.numpy().item()

    def tolist(self):
        return self.numpy().tolist()

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __bool__(self) -> bool:
        if self.numel != 1:
            raise ParamInvalidError(
                f"the truth value of a tensor of shape {self.shape} ({self.numel} elements) is ambiguous: "
                "reduce it first (t.any(), t.all()) or index one element"
            )
        return bool(self.numpy().item())

    def __format__(self, spec: str) -> str:
        if spec and self.numel == 1 and self.ndim == 0:
            return format(self.item(), spec)  # f"{loss:.4f}", as torch formats a 0-d tensor
        return super().__format__(spec)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    def __repr__(self) -> str:
        fmt = "" if self.format == "ND" else f", format={self.format}"
        shape = f", shape={self.shape}" if self.numel == 0 and self.ndim > 1 else ""  # as numpy: [] hides it
        return f"{_array_text(self.numpy(), 'tensor(')}{shape}, dtype={_dt.name(self.dtype)}{fmt})"

    # -- views (zero-copy) ---------------------------------------------------------
    def _view(self, array: np.ndarray, keep_format: bool = False) -> Tensor:
        return Tensor(array, self.format if keep_format else "ND", self._producer)

    def view(self, *shape) -> Tensor:
        """Same data, new shape; raises if the layout makes that impossible without a copy."""
        shape = _shape_arg(shape)
        if _tracing():
            from .ops import reshape

            return reshape(self, _resolve_shape(shape, self.numel, "view"))
        arr = self._array.view()
        try:
            arr.shape = _resolve_shape(shape, self.numel, "view")
        except AttributeError:
            raise ParamInvalidError(
                f"view: a tensor with shape {self.shape} and strides {self.strides} cannot be viewed as "
                f"{tuple(shape)} without a copy; use reshape() or contiguous() first"
            ) from None
        return self._view(arr)

    def reshape(self, *shape) -> Tensor:
        """A view when the layout allows, else a contiguous copy (like torch.reshape)."""
        shape = _resolve_shape(_shape_arg(shape), self.numel, "reshape")
        if _tracing():
            from .ops import reshape

            return reshape(self, shape)
        arr = self._array.view()
        try:
            arr.shape = shape
            return self._view(arr)
        except AttributeError:
            return self.contiguous().view(*shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        """Merge dims ``start_dim..end_dim`` into one (a view when the layout allows, as torch)."""
        if self.ndim == 0:
            return self.reshape(1)
        a, b = _norm_dim(start_dim, self.ndim, "flatten"), _norm_dim(end_dim, self.ndim, "flatten")
        if a > b:
            raise ParamInvalidError(
                f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for a {self.ndim}-D tensor"
            )
        s = self.shape
        return self.reshape(*s[:a], math.prod(s[a : b + 1]), *s[b + 1 :])

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        axes = list(range(self.ndim))
        d0, d1 = _norm_dim(dim0, self.ndim, "transpose"), _norm_dim(dim1, self.ndim, "transpose")
        axes[d0], axes[d1] = axes[d1], axes[d0]
        if _tracing():
            from .ops import permute

            return permute(self, *axes)
        return self._view(self._array.transpose(axes))

    def permute(self, *dims) -> Tensor:
        dims = tuple(_norm_dim(d, self.ndim, "permute") for d in _shape_arg(dims))
        if sorted(dims) != list(range(self.ndim)):
            raise ParamInvalidError(f"permute: dims must be a permutation of 0..{self.ndim - 1}, got {dims}")
        if _tracing():
            from .ops import permute

            return permute(self, *dims)
        return self._view(self._array.transpose(dims))

    @property
    def T(self) -> Tensor:
        if _tracing():
            return self.permute(*reversed(range(self.ndim)))
        return self._view(self._array.T)

    def expand(self, *shape) -> Tensor:
        """Broadcast to ``shape`` with zero strides (-1 keeps a dim)."""
        shape = _shape_arg(shape)
        lead = len(shape) - self.ndim
        if lead < 0:
            raise ParamInvalidError(f"expand: target {tuple(shape)} has fewer dims than the tensor {self.shape}")
        full = tuple(self.shape[i - lead] if (s == -1 and i >= lead) else s for i, s in enumerate(shape))
        try:
            arr = np.broadcast_to(self._array, full)
        except ValueError:
            raise ParamInvalidError(f"expand: cannot expand shape {self.shape} to {tuple(shape)}") from None
        if _tracing():
            from .ops import expand

            return expand(self, *full)
        return self._view(arr)

    def squeeze(self, dim: int | None = None) -> Tensor:
        if _tracing():
            from .ops import squeeze

            return squeeze(self, dim)
        if dim is None:
            return self._view(self._array.squeeze())
        d = _norm_dim(dim, self.ndim, "squeeze")
        if self.shape[d] != 1:
            return self
        return self._view(self._array.squeeze(d))

    def unsqueeze(self, dim: int) -> Tensor:
        d = _norm_dim(dim, self.ndim + 1, "unsqueeze")
        if _tracing():
            from .ops import unsqueeze

            return unsqueeze(self, d)
        return self._view(np.expand_dims(self._array, d))

    def __getitem__(self, index) -> Tensor:
        if _tracing():
            raise ParamInvalidError(
                "indexing a tensor inside a traced function is not recorded in the graph; "
                "use opsnn.ops.slice, opsnn.ops.gather or opsnn.ops.squeeze instead"
            )
        if isinstance(index, Tensor):
            index = index.numpy()
        try:
            arr = self._array[index]
        except IndexError as e:
            raise TensorIndexError(f"tensor of shape {self.shape}[{_index_text(index)}]: {e}") from None
        if isinstance(index, np.ndarray) or (
            isinstance(index, (list, tuple))
            and any(isinstance(i, (list, np.ndarray)) for i in (index if isinstance(index, tuple) else [index]))
        ):
            # advanced indexing copies in numpy: move the copy into pool memory
            self._wait()
            return tensor(self._array[index])
        if not isinstance(arr, np.ndarray):  # a scalar element: keep it a 0-d view
            arr = self._array[index, ...] if not isinstance(index, tuple) else self._array[index + (Ellipsis,)]
        return self._view(arr)

    def __setitem__(self, index, value) -> None:
        self._wait(check=False)
        try:
            self._array[index] = value.numpy() if isinstance(value, Tensor) else value
        except IndexError as e:
            raise TensorIndexError(f"tensor of shape {self.shape}[{_index_text(index)}] = ...: {e}") from None
        except ValueError as e:
            raise ParamInvalidError(f"tensor of shape {self.shape}[{_index_text(index)}] = value: {e}") from None
        bump_version(self)
        if all(
            i is Ellipsis or (isinstance(i, slice) and i == slice(None))
            for i in (index if isinstance(index, tuple) else (index,))
        ):
            self._producer = None  # overwritten whole: a failed producer's mark no longer applies

    # -- copies --------------------------------------------------------------------
    def contiguous(self) -> Tensor:
        """Self if already C-contiguous, else a contiguous copy in pool memory."""
        if self._array.flags.c_contiguous:
            return self
        return self.clone()

    def clone(self) -> Tensor:
        from .runtime.stream import current_stream

        if _tracing():
            from .ops import identity

            return identity(self)
        src = self._array
        out = Tensor(_alloc_array(src.shape, src.dtype), self.format)
        dst = out._array
        stream = current_stream()
        p = self._producer
        deps = None
        if p is not None:
            if len(p) > 2:
                if p[2]:
                    self._wait()  # raises: the source's producer failed
                deps = [p[2]]
            stream.wait_stream_seq(*p)
        mark: list = []
        out._producer = (stream, stream.launch(lambda: np.copyto(dst, src), name="Copy", mark=mark, deps=deps), mark)
        return out

    def copy_(self, src) -> Tensor:
        """Copy ``src`` (Tensor or array-like, broadcastable) into this tensor in place."""
        self._wait(check=False)
        value = src.numpy() if isinstance(src, Tensor) else np.asarray(src)
        try:
            np.copyto(self._array, value, casting="unsafe")
        except ValueError:
            raise ParamInvalidError(
                f"copy_: a source of shape {value.shape} does not broadcast to the tensor's shape {self.shape}"
            ) from None
        bump_version(self)
        self._producer = None  # written whole: clears a failed producer's mark
        return self

    def fill_(self, value) -> Tensor:
        """Set every element to the number ``value`` in place (cast to the tensor's dtype)."""
        if value is None or isinstance(value, (str, bytes)) or np.ndim(value) != 0:
            raise ParamInvalidError(f"fill_: value must be a number (or a one-element tensor), got {value!r}")
        return self.copy_(value.reshape(()) if isinstance(value, Tensor) else value)

    def zero_(self) -> Tensor:
        """Set every element to zero in place."""
        return self.copy_(0)

    def new_empty(self, shape, dtype=None, *, requires_grad: bool = False) -> Tensor:
        """A new uninitialised tensor of ``shape`` with this tensor's dtype (or ``dtype``), as torch's."""
        return empty(shape, self.dtype if dtype is None else dtype, requires_grad=requires_grad)

    def new_full(self, shape, fill_value, dtype=None, *, requires_grad: bool = False) -> Tensor:
        return full(shape, fill_value, self.dtype if dtype is None else dtype, requires_grad=requires_grad)

    def new_zeros(self, shape, dtype=None, *, requires_grad: bool = False) -> Tensor:
        return self.new_full(shape, 0, dtype, requires_grad=requires_grad)

    def new_ones(self, shape, dtype=None, *, requires_grad: bool = False) -> Tensor:
        return self.new_full(shape, 1, dtype, requires_grad=requires_grad)

    def new_tensor(self, data, dtype=None, *, requires_grad: bool = False) -> Tensor:
        """``data`` copied into a new tensor with this tensor's dtype (or ``dtype``)."""
        return tensor(data, self.dtype if dtype is None else dtype, requires_grad=requires_grad)

    def to(self, dtype) -> Tensor:
        """A copy in ``dtype`` (self when it already is); a device (``"cpu"``) leaves the tensor as is."""
        from .runtime.device import Device

        if isinstance(dtype, Device) or isinstance(dtype, str) and dtype.split(":")[0] == "cpu":
            return self
        from .ops import cast

        return cast(self, _dt.get(dtype))

    astype = to

    def pin_memory(self) -> Tensor:
        """Page-lock this tensor's memory where the OS allows (``is_pinned`` says if it worked)."""
        if not self._pinned:
            self._pinned = _mlock(self._array)
        return self

    @property
    def is_pinned(self) -> bool:
        return bool(self._pinned)

    # -- DLPack ----------------------------------------------------------------------
    def __dlpack__(self, *args, **kwargs):
        self._wait()
        if self.dtype.kind not in "biufc":
            from .errors import DTypeError

            raise DTypeError(
                f"__dlpack__: numpy's DLPack cannot carry {_dt.name(self.dtype)}; export the raw "
                f"bits instead: opsnn.from_numpy(t.numpy().view(np.uint{8 * self.dtype.itemsize}))"
            )
        return self._array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()

    # Math methods and operators (``t.sum()``, ``t + u``, ...) are not written here: the ops
    # layer generates them from one table (opsnn/ops/tensor_methods.py) when it is imported.

    __hash__ = object.__hash__  # comparisons return tensors; identity hashing stays


def _index_text(index) -> str:
    """``index`` as written between brackets (slices as a:b:c), for error messages."""
    parts = index if isinstance(index, tuple) else (index,)

    def one(i):
        if isinstance(i, slice):
            return ":".join("" if v is None else str(v) for v in (i.start, i.stop)) + (
                f":{i.step}" if i.step is not None else ""
            )
        if i is Ellipsis:
            return "..."
        if isinstance(i, np.ndarray):
            return f"<{i.dtype} array of shape {i.shape}>"
        return repr(i)

    return ", ".join(one(i) for i in parts)


class _Count(int):
    """An int that is also callable (``t.numel`` and torch's ``t.numel()`` both work)."""

    __slots__ = ()

    def __call__(self) -> int:
        return int(self)


def _array_text(arr: np.ndarray, prefix: str) -> str:
    """numpy's text of ``arr`` after ``prefix``, rows aligned under the first (as numpy's repr).
    Floats read as torch prints them: ``1.``, ``2.`` when all are whole, else 4 decimals."""
    if arr.dtype.kind == "V" or arr.dtype.kind == "f" and arr.dtype.itemsize < 4:
        # bfloat16 / float8 / float16 print through float32, int4 / uint4 through int64
        arr = arr.astype(np.float32 if _dt.is_float(arr.dtype) else np.int64)
    opts = {}
    if arr.dtype.kind in "fc":
        finite = arr[np.isfinite(arr)] if arr.size else arr
        whole = finite.size == 0 or bool(np.all(finite == np.round(finite)))
        opts = {"precision": 4, "floatmode": "maxprec" if whole else "fixed"}
    with np.printoptions(**opts):
        return prefix + np.array2string(arr, separator=", ", threshold=64, edgeitems=3, prefix=prefix)


def _mlock(arr: np.ndarray) -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        return libc.mlock(ctypes.c_void_p(arr.ctypes.data), ctypes.c_size_t(max(arr.nbytes, 1))) == 0
    except (OSError, AttributeError):
        return False


def _shape_arg(shape) -> tuple:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    for s in shape:
        if not isinstance(s, (int, np.integer)) or isinstance(s, bool):
            raise ParamInvalidError(f"shape entries must be ints, got {s!r} in {tuple(shape)}")
    return tuple(int(s) for s in shape)


def _resolve_shape(shape: tuple, numel: int, what: str) -> tuple:
    if shape.count(-1) > 1:
        raise ParamInvalidError(f"{what}: only one dim may be -1, got {shape}")
    if any(s < -1 for s in shape):
        raise ParamInvalidError(f"{what}: dims must be >= 0 (or one -1), got {shape}")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or numel % known:
            raise ParamInvalidError(f"{what}: cannot infer -1 in {shape} for {numel} elements")
        shape = tuple(numel // known if s == -1 else s for s in shape)
    if math.prod(shape) != numel:
        raise ParamInvalidError(f"{what}: shape {shape} has {math.prod(shape)} elements, the tensor has {numel}")
    return shape


def _norm_dim(dim: int, ndim: int, what: str) -> int:
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise ParamInvalidError(f"{what}: dim {dim} out of range for a {ndim}-D tensor")
    return dim % max(ndim, 1)


# -- factories -------------------------------------------------------------------------------
def _leaf(t: Tensor, requires_grad) -> Tensor:
    """``t`` as a new leaf that requires grad where asked (torch's ``requires_grad=`` keyword)."""
    if requires_grad:
        t.requires_grad_(True)  # installed by opsnn.autograd; a non-float dtype is a DTypeError there
    return t


def empty(shape, dtype="float32", format: str = "ND", *, requires_grad: bool = False) -> Tensor:
    """An uninitialised tensor in pool memory."""
    shape = _shape_arg(shape if isinstance(shape, (tuple, list)) else (shape,))
    if any(s < 0 for s in shape):
        raise ParamInvalidError(f"empty: dims must be >= 0, got {shape}")
    return _leaf(Tensor(_alloc_array(shape, _dt.get(dtype)), _check_format(format, len(shape))), requires_grad)


def full(shape, value, dtype="float32", format: str = "ND", *, requires_grad: bool = False) -> Tensor:
    t = empty(shape, dtype, format)
    t._array.fill(value)
    return _leaf(t, requires_grad)


def zeros(shape, dtype="float32", format: str = "ND", *, requires_grad: bool = False) -> Tensor:
    return full(shape, 0, dtype, format, requires_grad=requires_grad)


def ones(shape, dtype="float32", format: str = "ND", *, requires_grad: bool = False) -> Tensor:
    return full(shape, 1, dtype, format, requires_grad=requires_grad)


def tensor(data, dtype=None, format: str = "ND", *, requires_grad: bool = False) -> Tensor:
    """Copy ``data`` (array-like, Tensor, scalar) into a new tensor in pool memory; ``requires_grad``
    makes it a leaf that gradients flow into (float dtypes), as ``torch.tensor(..., requires_grad=True)``."""
    if isinstance(data, Tensor):
        data = data.numpy()
    try:
        arr = np.asarray(data) if dtype is None else np.asarray(data, dtype=_dt.get(dtype))
    except ValueError as e:  # ragged nested lists, strings that are not numbers for a numeric dtype
        raise ParamInvalidError(f"tensor: cannot build a tensor from this {type(data).__name__}: {e}") from None
    if arr.dtype == np.float64 and dtype is None and not isinstance(data, (np.ndarray, np.generic)):
        arr = arr.astype(np.float32)  # Python floats default to float32, as in torch
    if arr.dtype.kind == "O" and not all(isinstance(v, (str, bytes)) for v in arr.reshape(-1)):
        raise ParamInvalidError(
            f"tensor: cannot build a tensor from {type(data).__name__} (object dtype that is not strings)"
        )
    t = Tensor(_alloc_array(arr.shape, arr.dtype), _check_format(format, arr.ndim))
    np.copyto(t._array, arr)
    return _leaf(t, requires_grad)


def is_tensor(obj) -> bool:
    """Whether ``obj`` is an opsnn Tensor (torch.is_tensor)."""
    return isinstance(obj, Tensor)


def from_numpy(arr: np.ndarray, format: str = "ND") -> Tensor:
    """Wrap a numpy array without copying (it stays numpy-owned memory)."""
    if not isinstance(arr, np.ndarray):
        raise ParamInvalidError(f"from_numpy: expected a numpy.ndarray, got {type(arr).__name__}")
    return Tensor(arr, _check_format(format, arr.ndim))


def from_dlpack(obj) -> Tensor:
    """Import any DLPack producer (numpy, torch, ...) without copying."""
    if isinstance(obj, Tensor):
        return obj
    return Tensor(np.from_dlpack(obj))


def as_tensor(x, like: Tensor | None = None) -> Tensor:
    """``x`` as a Tensor: Tensors pass through, arrays wrap without copy, scalars take the
    dtype of ``like`` (a Python float with an integer tensor becomes float32)."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, np.ndarray):
        return Tensor(x)
    if isinstance(x, (bool, int, float, np.generic)) and like is not None:
        dt = like.dtype
        if isinstance(x, float) and not _dt.is_float(dt):
            dt = _dt.float32
        return Tensor(np.asarray(x, dtype=dt))
    return tensor(x)
