"""torch's Tensor methods that are several differentiable ops composed (``diff``, ``rot90``, ``median``,
``addmv``, ``diagonal``, ``trace`` ...): one implementation each, which :mod:`opsnn.ops.tensor_methods`
installs as the method and ``opsnn.<name>`` (opsnn/torch_api.py) calls with the input first. Gradients
flow through the ops' own rules; traced functions record them. Where an index is decided on the host
(median's, cummax's), reading a traced value raises the tracer's typed error.

>>> import opsnn, numpy as np
>>> x = opsnn.tensor(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
>>> x.trace().item(), x.diff(dim=1).numpy().ravel().tolist(), x.median().item()
(5.0, [1.0, 1.0], 2.0)
"""

from __future__ import annotations

import math
import numbers
from collections import namedtuple

import numpy as np

from .. import dtypes as _dt
from ..errors import DTypeError, ParamInvalidError
from ..tensor import Tensor, as_tensor, full, tensor
from .api import FUNCTIONS

#: torch's ``(values, indices)`` results (median / kthvalue / cummax / cummin with a dim) and aminmax's
ValuesIndices = namedtuple("ValuesIndices", ["values", "indices"])
MinMaxResult = namedtuple("MinMaxResult", ["min", "max"])


def _f(name):
    return FUNCTIONS[name]


def _dim(dim, ndim: int, what: str) -> int:
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or not -max(ndim, 1) <= dim < max(ndim, 1):
        raise ParamInvalidError(f"{what}: dim {dim!r} out of range for a {ndim}-D tensor")
    return int(dim) % max(ndim, 1)


def _int(v, what: str, low: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or (low is not None and v < low):
        raise ParamInvalidError(f"{what} must be an int" + (f" >= {low}" if low is not None else "") + f", got {v!r}")
    return int(v)


def _const(v, dtype) -> Tensor:
    return as_tensor(np.asarray(v, dtype))


def _float_result(x: Tensor) -> Tensor:
    """``x`` as torch computes a float function of it: integer and bool tensors as float32."""
    return x if _dt.is_float(x.dtype) else _f("cast")(x, "float32")


# -- moved from torch_api: elementwise ---------------------------------------------------------------------------
def isfinite(self) -> Tensor:
    """torch's ``isfinite``: neither NaN nor infinite (every element of an integer tensor)."""
    if not self.is_floating_point():
        return full(tuple(self.shape), True, "bool")
    return self.isnan().logical_or(self.isinf()).logical_not()


def nan_to_num(self, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Tensor:
    """torch's ``nan_to_num``: NaN, +Inf and -Inf replaced (by 0 and the dtype's largest and lowest finite
    values unless given); the gradient flows where the input is finite."""
    if not self.is_floating_point():
        return self
    info = np.finfo(np.float32 if self.dtype.name == "bfloat16" else self.dtype)
    hi = info.max if posinf is None else posinf
    lo = info.min if neginf is None else neginf
    y = _f("where")(self.isnan(), _const(nan, self.dtype), self)
    y = _f("where")(_f("isinf")(self, detect_negative=False), _const(hi, self.dtype), y)
    return _f("where")(_f("isinf")(self, detect_positive=False), _const(lo, self.dtype), y)


def trunc(self) -> Tensor:
    """torch's ``trunc`` (``fix``): rounded toward zero."""
    if not self.is_floating_point():
        return self
    return _f("where")(self < 0, self.ceil(), self.floor())


def frac(self) -> Tensor:
    """torch's ``frac``: ``self - trunc(self)`` (the sign of the input)."""
    return self - trunc(self)


def sgn(self) -> Tensor:
    """torch's ``sign`` / ``sgn`` of a real tensor: -1, 0 or 1, and 0 at NaN and at -0.0 (ONNX Sign, the
    functional ``opsnn.ops.sign``, keeps NaN)."""
    if not _dt.is_float(self.dtype):
        return _f("sign")(self)
    zero = _const(0.0, self.dtype)
    return _f("where")(self.isnan(), zero, _f("sign")(self)) + zero


def positive(self) -> Tensor:
    """torch's ``positive``: the tensor itself."""
    if self.dtype == np.bool_:
        raise DTypeError("positive: not defined for a bool tensor (as torch)")
    return self


def signbit(self) -> Tensor:
    """torch's ``signbit``: whether the sign bit is set (-0.0 and NaNs with the bit set included)."""
    if self.dtype == np.bool_ or self.dtype.kind == "u":
        return full(tuple(self.shape), False, "bool")
    if not _dt.is_float(self.dtype):
        return self < 0
    # the sign bit, read through an integer view of the float bits (-0.0 is not < 0)
    wide = self if self.dtype in (np.float32, np.float64) else _f("cast")(self, "float32")
    bits = _f("bitcast")(wide, "int64" if wide.dtype == np.float64 else "int32")
    return bits < 0


def float_power(self, exponent) -> Tensor:
    """torch's ``float_power``: ``pow`` computed in float64."""
    e = _f("cast")(exponent, "float64") if isinstance(exponent, Tensor) else float(exponent)
    return _f("pow")(_f("cast")(self, "float64"), e)


def _scaled_fn(fn: str, scale: float, name: str, inner: bool):
    def method(self) -> Tensor:
        x = _float_result(self)
        if inner:
            return _f(fn)(x * _const(scale, x.dtype))
        return _f(fn)(x) * _const(scale, x.dtype)

    method.__name__ = method.__qualname__ = name
    return method


log2 = _scaled_fn("log", 1 / math.log(2), "log2", False)
log10 = _scaled_fn("log", 1 / math.log(10), "log10", False)
exp2 = _scaled_fn("exp", math.log(2), "exp2", True)


def deg2rad(self) -> Tensor:
    """torch's ``deg2rad``: degrees as radians (float32 for integer tensors)."""
    x = _float_result(self)
    return x * _const(math.pi / 180, x.dtype)


def rad2deg(self) -> Tensor:
    """torch's ``rad2deg``: radians as degrees (float32 for integer tensors)."""
    x = _float_result(self)
    return x * _const(180 / math.pi, x.dtype)


# -- moved from torch_api: products and diagonals -----------------------------------------------------------------
def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """torch's ``diagonal``: the ``offset`` diagonal of the (dim1, dim2) matrices, as the last dim."""
    if self.ndim < 2:
        raise ParamInvalidError(f"diagonal: expects a tensor of >= 2 dims, got shape {tuple(self.shape)}")
    a, b = _dim(dim1, self.ndim, "diagonal"), _dim(dim2, self.ndim, "diagonal")
    if a == b:
        raise ParamInvalidError(f"diagonal: dim1 and dim2 must differ, got {dim1} and {dim2}")
    rest = [d for d in range(self.ndim) if d not in (a, b)]
    m = self.permute(*rest, a, b)
    rows, cols = int(m.shape[-2]), int(m.shape[-1])
    r0, c0 = (0, int(offset)) if offset >= 0 else (-int(offset), 0)
    n = max(0, min(rows - r0, cols - c0))
    flat = m.reshape(*m.shape[:-2], rows * cols)
    index = as_tensor((np.arange(n) + r0) * cols + np.arange(n) + c0)
    return flat.index_select(-1, index)


def diag(self, diagonal: int = 0) -> Tensor:
    """torch's ``diag``: a 1-D tensor as the ``diagonal`` diagonal of a square matrix, or a matrix's diagonal."""
    k = int(diagonal)
    if self.ndim == 2:
        return globals()["diagonal"](self, k)
    if self.ndim != 1:
        raise ParamInvalidError(f"diag: expects a 1-D or 2-D tensor, got shape {tuple(self.shape)}")
    n = int(self.shape[0])
    size = n + abs(k)
    padded = self if k == 0 else _f("concat")([self, _const(np.zeros((abs(k),)), self.dtype)], 0)
    mask = as_tensor(np.eye(size, size, k, dtype=self.dtype))
    return mask * (padded.reshape(size, 1) if k >= 0 else padded.reshape(1, size))


def trace(self) -> Tensor:
    """torch's ``trace``: the sum of a matrix's main diagonal."""
    if self.ndim != 2:
        raise ParamInvalidError(f"trace: expects a 2-D tensor, got shape {tuple(self.shape)}")
    return diagonal(self).sum()


def dot(self, other) -> Tensor:
    """torch's ``dot``: the inner product of two 1-D tensors of one size."""
    y = as_tensor(other)
    if self.ndim != 1 or y.ndim != 1 or self.shape != y.shape:
        raise ParamInvalidError(
            f"dot: expects two 1-D tensors of one size, got {tuple(self.shape)} and {tuple(y.shape)}; matmul "
            "multiplies matrices"
        )
    return (self * y).sum()


def inner(self, other) -> Tensor:
    """torch's ``inner``: products summed over the last dim of both (shape ``self.shape[:-1] + other.shape[:-1]``)."""
    y = as_tensor(other)
    if self.ndim == 0 or y.ndim == 0:
        return self * y
    if self.shape[-1] != y.shape[-1]:
        raise ParamInvalidError(f"inner: the last dims differ: {tuple(self.shape)} and {tuple(y.shape)}")
    k = int(self.shape[-1])
    out = self.reshape(-1, k).matmul(y.reshape(-1, k).t())
    return out.reshape(*self.shape[:-1], *y.shape[:-1])


def _product(a, b, ndims: tuple, what: str) -> Tensor:
    a, b = as_tensor(a), as_tensor(b)
    if (a.ndim, b.ndim) != ndims or a.shape[-1] != b.shape[-1 if b.ndim == 1 else -2] or a.shape[:-2] != b.shape[:-2]:
        raise ParamInvalidError(
            f"{what}: expects {'-D and '.join(map(str, dict.fromkeys(ndims)))}-D operands that multiply, got "
            f"{tuple(a.shape)} and "
            f"{tuple(b.shape)}"
        )
    return a.matmul(b)


def _scaled_sum(self, product: Tensor, beta, alpha) -> Tensor:
    term = product if alpha == 1 else product * alpha
    if beta == 0:  # torch ignores self then (a NaN in it too); the result keeps the broadcast shape
        return term.expand(*np.broadcast_shapes(tuple(self.shape), tuple(term.shape)))
    return (self if beta == 1 else self * beta) + term


def addmm(self, mat1, mat2, *, beta=1, alpha=1) -> Tensor:
    """torch's ``addmm``: ``beta * self + alpha * (mat1 @ mat2)`` of matrices."""
    return _scaled_sum(self, _product(mat1, mat2, (2, 2), "addmm"), beta, alpha)


def baddbmm(self, batch1, batch2, *, beta=1, alpha=1) -> Tensor:
    """torch's ``baddbmm``: ``beta * self + alpha * (batch1 @ batch2)`` of (b, n, m) and (b, m, p) batches."""
    return _scaled_sum(self, _product(batch1, batch2, (3, 3), "baddbmm"), beta, alpha)


def addmv(self, mat, vec, *, beta=1, alpha=1) -> Tensor:
    """torch's ``addmv``: ``beta * self + alpha * (mat @ vec)``."""
    return _scaled_sum(self, _product(mat, vec, (2, 1), "addmv"), beta, alpha)


def addr(self, vec1, vec2, *, beta=1, alpha=1) -> Tensor:
    """torch's ``addr``: ``beta * self + alpha * outer(vec1, vec2)``."""
    return _scaled_sum(self, ger(as_tensor(vec1), vec2), beta, alpha)


def mv(self, vec) -> Tensor:
    """torch's ``mv``: a matrix times a vector."""
    return _product(self, vec, (2, 1), "mv")


def ger(self, vec2) -> Tensor:
    """torch's ``ger`` (``outer``): ``self[i] * vec2[j]`` of two 1-D tensors."""
    return self.outer(vec2)


# -- moved from torch_api: layout --------------------------------------------------------------------------------
def broadcast_to(self, size) -> Tensor:
    """torch's ``broadcast_to``: ``self.expand(size)`` (-1 keeps a dim)."""
    return self.expand(*size)


def swapaxes(self, axis0: int, axis1: int) -> Tensor:
    """torch's ``swapaxes`` / ``swapdims``: ``self.transpose(axis0, axis1)``."""
    return self.transpose(axis0, axis1)


def movedim(self, source, destination) -> Tensor:
    """torch's ``movedim`` / ``moveaxis``: the dims ``source`` moved to ``destination`` (ints or sequences),
    the others kept in order."""
    src = [source] if isinstance(source, numbers.Integral) else list(source)
    dst = [destination] if isinstance(destination, numbers.Integral) else list(destination)
    src = [_dim(d, self.ndim, "movedim") for d in src]
    dst = [_dim(d, self.ndim, "movedim") for d in dst]
    if len(src) != len(dst) or len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ParamInvalidError(
            f"movedim: source {source} and destination {destination} must be distinct dims, as many"
        )
    rest = iter(d for d in range(self.ndim) if d not in src)
    placed = dict(zip(dst, src))
    return self.permute(*[placed[i] if i in placed else next(rest) for i in range(self.ndim)])


def take_along_dim(self, indices, dim=None) -> Tensor:
    """torch's ``take_along_dim``: ``gather`` along ``dim`` with self and indices broadcast over the other dims
    (flattened both when ``dim`` is None)."""
    idx = as_tensor(indices)
    if dim is None:
        return self.reshape(-1).gather(0, idx.reshape(-1))
    if self.ndim != idx.ndim:
        raise ParamInvalidError(
            f"take_along_dim: input and indices must have as many dims, got {tuple(self.shape)} and {tuple(idx.shape)}"
        )
    d = _dim(dim, self.ndim, "take_along_dim")
    other = np.broadcast_shapes(
        tuple(s for i, s in enumerate(self.shape) if i != d), tuple(s for i, s in enumerate(idx.shape) if i != d)
    )
    full_x, full_i = list(other), list(other)
    full_x.insert(d, int(self.shape[d]))
    full_i.insert(d, int(idx.shape[d]))
    return self.expand(*full_x).gather(d, idx.expand(*full_i))


def tensor_split(self, indices_or_sections, dim: int = 0) -> tuple:
    """torch's ``tensor_split``: ``n`` pieces as even as possible (the first ``size % n`` one longer), or the
    pieces between the given indices, along ``dim`` (views where not traced)."""
    d = _dim(dim, self.ndim, "tensor_split")
    size = int(self.shape[d])
    if isinstance(indices_or_sections, numbers.Integral) and not isinstance(indices_or_sections, bool):
        n = int(indices_or_sections)
        if n <= 0:
            raise ParamInvalidError(f"tensor_split: the number of sections must be positive, got {n}")
        q, r = divmod(size, n)
        bounds = np.cumsum([0] + [q + (i < r) for i in range(n)]).tolist()
    else:
        cuts = [int(i) for i in indices_or_sections]
        bounds = [0] + [min(max(c + size if c < 0 else c, 0), size) for c in cuts] + [size]
    return tuple(self.narrow(d, lo, max(hi, lo) - lo) for lo, hi in zip(bounds[:-1], bounds[1:]))


def _even_split(name: str, dim: int, min_ndim: int):
    def method(self, indices_or_sections) -> tuple:
        if self.ndim < min_ndim:
            raise ParamInvalidError(f"{name}: expects a tensor of >= {min_ndim} dims, got shape {tuple(self.shape)}")
        d = 0 if name == "hsplit" and self.ndim == 1 else dim
        if isinstance(indices_or_sections, numbers.Integral) and not isinstance(indices_or_sections, bool):
            n = int(indices_or_sections)
            if n <= 0 or self.shape[d] % n:
                raise ParamInvalidError(
                    f"{name}: {n} sections do not divide dim {d} of size {self.shape[d]} evenly; pass split indices"
                )
        return tensor_split(self, indices_or_sections, d)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"torch's ``{name}``: ``tensor_split`` along dim {dim}, equal sections or at the given indices."
    return method


hsplit = _even_split("hsplit", 1, 1)
vsplit = _even_split("vsplit", 0, 2)
dsplit = _even_split("dsplit", 2, 3)


def split_with_sizes(self, split_sizes, dim: int = 0) -> tuple:
    """torch's ``split_with_sizes``: pieces of the given sizes (summing to the dim's size) along ``dim``."""
    d = _dim(dim, self.ndim, "split_with_sizes")
    sizes = [_int(s, "split_with_sizes: each size", 0) for s in split_sizes]
    if sum(sizes) != self.shape[d]:
        raise ParamInvalidError(
            f"split_with_sizes: sizes {sizes} sum to {sum(sizes)}, dim {d} has size {self.shape[d]}"
        )
    starts = np.cumsum([0] + sizes[:-1]).tolist()
    return tuple(self.narrow(d, s, n) for s, n in zip(starts, sizes))


def unbind(self, dim: int = 0) -> tuple:
    """torch's ``unbind``: the slices along ``dim``, that dim removed."""
    d = _dim(dim, self.ndim, "unbind")
    return tuple(self.select(d, i) for i in range(self.shape[d]))


def unflatten(self, dim: int, sizes) -> Tensor:
    """torch's ``unflatten``: dim ``dim`` split into ``sizes`` (one may be -1)."""
    d = _dim(dim, self.ndim, "unflatten")
    sizes = [_int(s, "unflatten: each size", -1) for s in sizes]
    if not sizes:
        raise ParamInvalidError("unflatten: sizes must name at least one dim")
    known = math.prod(s for s in sizes if s != -1)
    if sizes.count(-1) > 1 or (-1 not in sizes and known != self.shape[d]) or (known and self.shape[d] % known):
        raise ParamInvalidError(f"unflatten: sizes {sizes} do not multiply to dim {d}'s size {self.shape[d]}")
    return self.reshape(*self.shape[:d], *sizes, *self.shape[d + 1 :])


def ravel(self) -> Tensor:
    """torch's ``ravel``: the elements as 1-D (a view where the layout allows)."""
    return self.reshape(-1)


def argwhere(self) -> Tensor:
    """torch's ``argwhere``: the (count, ndim) indices of the nonzero elements."""
    return self.nonzero()


def fliplr(self) -> Tensor:
    """torch's ``fliplr``: dim 1 reversed."""
    if self.ndim < 2:
        raise ParamInvalidError(f"fliplr: expects a tensor of >= 2 dims, got shape {tuple(self.shape)}")
    return self.flip(1)


def flipud(self) -> Tensor:
    """torch's ``flipud``: dim 0 reversed."""
    if self.ndim < 1:
        raise ParamInvalidError("flipud: expects a tensor of >= 1 dim, got a 0-d tensor")
    return self.flip(0)


def rot90(self, k: int = 1, dims=(0, 1)) -> Tensor:
    """torch's ``rot90``: rotated by 90 degrees ``k`` times from the first of ``dims`` toward the second."""
    k = _int(k, "rot90: k")
    dims = list(dims)
    if len(dims) != 2 or self.ndim < 2:
        raise ParamInvalidError(f"rot90: expects two dims of a tensor of >= 2 dims, got {dims} for {self.ndim}-D")
    a, b = _dim(dims[0], self.ndim, "rot90"), _dim(dims[1], self.ndim, "rot90")
    if a == b:
        raise ParamInvalidError(f"rot90: the two dims must differ, got {dims}")
    k %= 4
    if k == 1:
        return self.flip(b).transpose(a, b)
    if k == 2:
        return self.flip([a, b])
    if k == 3:
        return self.flip(a).transpose(a, b)
    return self.clone()


def diff(self, n: int = 1, dim: int = -1, prepend=None, append=None) -> Tensor:
    """torch's ``diff``: the ``n``-th forward difference along ``dim`` (after joining ``prepend`` / ``append``);
    a bool tensor's is ``!=``."""
    n = _int(n, "diff: n", 0)
    if self.ndim == 0:
        raise ParamInvalidError("diff: expects a tensor of >= 1 dim, got a 0-d tensor")
    d = _dim(dim, self.ndim, "diff")
    parts = [as_tensor(p, like=self) for p in (prepend, self, append) if p is not None]
    x = _f("concat")(parts, d) if len(parts) > 1 else self
    for _ in range(n):
        size = int(x.shape[d])
        if size == 0:
            break
        hi, lo = x.narrow(d, 1, size - 1), x.narrow(d, 0, size - 1)
        x = hi.logical_xor(lo) if x.dtype == np.bool_ else hi - lo
    return x


def sum_to_size(self, *size) -> Tensor:
    """torch's ``sum_to_size``: summed down to ``size``, which must expand to the tensor's shape."""
    from .gradients import unbroadcast

    size = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)
    try:
        ok = np.broadcast_shapes(size, tuple(self.shape)) == tuple(self.shape)
    except ValueError:
        ok = False
    if not ok:
        raise ParamInvalidError(f"sum_to_size: size {size} does not expand to the tensor's shape {tuple(self.shape)}")
    return unbroadcast(self, size)


def adjoint(self) -> Tensor:
    """torch's ``adjoint`` / ``mH``: the conjugate transpose of the last two dims (the transpose, for reals)."""
    if self.ndim < 2:
        raise ParamInvalidError(f"adjoint: expects a tensor of >= 2 dims, got shape {tuple(self.shape)}")
    return self.transpose(-2, -1)


# -- order statistics --------------------------------------------------------------------------------------------
def aminmax(self, *, dim=None, keepdim: bool = False) -> MinMaxResult:
    """torch's ``aminmax``: ``(min, max)`` over all elements or along ``dim``."""
    if self.numel == 0:
        raise ParamInvalidError(f"aminmax: a tensor of shape {tuple(self.shape)} has no elements")
    return MinMaxResult(self.amin(dim, keepdim), self.amax(dim, keepdim))


def _host_order(self, what: str) -> np.ndarray:
    if self.numel == 0:
        raise ParamInvalidError(f"{what}: a tensor of shape {tuple(self.shape)} has no elements")
    a = self.numpy()
    return a.astype(np.float32) if a.dtype.kind == "V" else a


def _pick(self, what: str, dim, keepdim: bool, position) -> ValuesIndices:
    """The element at sorted ``position(sorted values, nan count, size)`` along ``dim`` (NaN sorted last),
    as (values, indices); with ``dim`` None, the value over all elements."""
    x = self if dim is not None else self.reshape(-1)
    d = 0 if dim is None else _dim(dim, self.ndim, what)
    if x.ndim == 0:
        x, d = x.reshape(1), 0
    a = _host_order(x, what)
    order = np.argsort(a, axis=d, kind="stable")
    nans = np.isnan(a).sum(axis=d, keepdims=True) if a.dtype.kind == "f" else np.zeros_like(order[:1])
    pos = position(nans, a.shape[d])
    idx = np.take_along_axis(order, np.broadcast_to(pos, nans.shape).astype(np.int64), d)
    if dim is None:
        return x.gather(0, tensor(idx)).reshape(())
    values = x.gather(d, tensor(idx))
    indices = tensor(idx)
    if not keepdim and self.ndim > 0:
        values, indices = values.squeeze(d), indices.squeeze(d)
    elif self.ndim == 0:
        values, indices = values.reshape(()), indices.reshape(())
    return ValuesIndices(values, indices)


def median(self, dim=None, keepdim: bool = False):
    """torch's ``median``: the lower median (NaN where a NaN is present), over all elements or along ``dim``
    as (values, indices)."""
    return _pick(self, "median", dim, keepdim, lambda nans, n: np.where(nans > 0, n - nans, (n - 1) // 2))


def nanmedian(self, dim=None, keepdim: bool = False):
    """torch's ``nanmedian``: the lower median of the elements that are not NaN (NaN where all are)."""
    return _pick(self, "nanmedian", dim, keepdim, lambda nans, n: np.maximum((n - nans - 1) // 2, 0))


def kthvalue(self, k: int, dim: int = -1, keepdim: bool = False) -> ValuesIndices:
    """torch's ``kthvalue``: the ``k``-th smallest element (1-based) along ``dim``, as (values, indices)."""
    k = _int(k, "kthvalue: k", 1)
    d = _dim(dim, self.ndim, "kthvalue")
    size = 1 if self.ndim == 0 else self.shape[d]
    if k > size:
        raise ParamInvalidError(f"kthvalue: k {k} is beyond dim {d}'s size {size}")
    return _pick(self, "kthvalue", d, keepdim, lambda nans, n: np.full_like(nans, k - 1))


def _cumulative(name: str, better):
    def method(self, dim: int) -> ValuesIndices:
        d = _dim(dim, self.ndim, name)
        x = self.reshape(1) if self.ndim == 0 else self
        a = np.moveaxis(_host_order(x, name), d, -1) if x.numel else np.moveaxis(x.numpy(), d, -1)
        idx = np.zeros(a.shape, np.int64)
        if a.size:
            best, at = a[..., 0].copy(), np.zeros(a.shape[:-1], np.int64)
            floats = a.dtype.kind == "f"
            for j in range(a.shape[-1]):
                v = a[..., j]
                # as torch: a NaN takes over (and each later NaN), else ties go to the later index
                take = (np.isnan(v) | (~np.isnan(best) & better(v, best))) if floats else better(v, best)
                best, at = np.where(take, v, best), np.where(take, j, at)
                idx[..., j] = at
        idx = tensor(np.ascontiguousarray(np.moveaxis(idx, -1, d)))
        values = x.gather(d, idx)
        if self.ndim == 0:
            values, idx = values.reshape(()), idx.reshape(())
        return ValuesIndices(values, idx)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"torch's ``{name}``: the running {name[3:]} along ``dim`` and where it was found."
    return method


cummax = _cumulative("cummax", np.greater_equal)
cummin = _cumulative("cummin", np.less_equal)


def logcumsumexp(self, dim: int) -> Tensor:
    """torch's ``logcumsumexp``: ``log(cumsum(exp(self)))`` along ``dim``, computed in float64 shifted by the
    dim's largest finite value (exact while a prefix's terms lie within ~700 of it)."""
    d = _dim(dim, self.ndim, "logcumsumexp")
    if not _dt.is_float(self.dtype):
        raise DTypeError(f"logcumsumexp: expects a floating tensor, got {_dt.name(self.dtype)}")
    x = _f("cast")(self, "float64")
    if self.ndim == 0 or self.numel == 0:
        return self.clone()
    top = x.amax(d, True)  # its gradient through the formula cancels: the shift is a free choice
    shift = _f("where")(isfinite(top), top, _const(0.0, np.float64))
    out = _f("log")(_f("cumsum")(_f("exp")(x - shift), d)) + shift
    return _f("cast")(out, self.dtype)
