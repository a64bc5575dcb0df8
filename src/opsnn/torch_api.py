"""torch's top-level functions on opsnn tensors (``opsnn.exp(x)``, ``opsnn.sum(x, dim=1)``,
``opsnn.gather(x, 1, idx)`` ...), so torch code reads the same with ``import opsnn as torch``-style
renames. Most are the :class:`opsnn.Tensor` method of the same name called with the input first (torch's
arguments and semantics, one implementation); the rest are composed of the differentiable ops, so
gradients flow and traced functions record them. ``opsnn.ops`` keeps the functional ops' own signatures
(``opsnn.ops.gather`` is ONNX's Gather); the names here are torch's. Each is checked against torch in
tests/test_torch_api.py.

>>> import opsnn, numpy as np
>>> x = opsnn.tensor(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
>>> float(opsnn.sum(opsnn.exp(x * 0), dim=1)[0]), opsnn.trace(x).item()
(2.0, 5.0)
"""

from __future__ import annotations

import numbers
from builtins import abs as _abs  # this module defines torch's max, min, abs
from builtins import max as _max
from builtins import min as _min

import numpy as np

from .autograd.mode import is_grad_enabled
from .errors import ParamInvalidError
from .tensor import Tensor, as_tensor, full

#: torch functions that are the Tensor method of the same name with the input first
METHOD_FUNCTIONS = (
    "abs absolute acos acosh add addcdiv addcmul all amax amin any argmax argmin asin asinh atan atanh "
    "bitwise_and bitwise_not bitwise_or bitwise_xor ceil chunk clamp clamp_max clamp_min clip cos cosh "
    "count_nonzero cumprod cumsum det div divide eq erf exp flatten floor fmod gather ge greater "
    "greater_equal gt index_select is_floating_point isinf isnan le lerp less less_equal log log_softmax "
    "logical_and logical_not logical_or logical_xor logsumexp lt masked_fill masked_select matmul max "
    "maximum mean min minimum mul multiply nanmean nansum narrow ne neg negative nonzero not_equal "
    "permute pow prod reciprocal relu remainder reshape round rsqrt scatter scatter_add select sigmoid sign "
    "sin sinh softmax split sqrt square squeeze sub subtract sum t tan tanh tile topk transpose tril triu "
    "true_divide unique unsqueeze var"
).split()


def _input(x, name: str) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (np.ndarray, numbers.Number, list, tuple)):
        return as_tensor(x)
    raise ParamInvalidError(f"opsnn.{name}: expected a Tensor (or an array or number), got {type(x).__name__}")


def _method_function(name: str):
    def fn(input, *args, **kwargs):
        return getattr(Tensor, name)(_input(input, name), *args, **kwargs)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"torch.{name}: ``input.{name}(...)`` (the :class:`opsnn.Tensor` method)."
    return fn


globals().update({n: _method_function(n) for n in METHOD_FUNCTIONS})


def _dim(dim, ndim: int, what: str) -> int:
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or not -_max(ndim, 1) <= dim < _max(ndim, 1):
        raise ParamInvalidError(f"{what}: dim {dim!r} out of range for a {ndim}-D tensor")
    return int(dim) % _max(ndim, 1)


def numel(input) -> int:
    """torch.numel: the element count."""
    return int(_input(input, "numel").numel)


def isfinite(input) -> Tensor:
    """torch.isfinite: neither NaN nor infinite (every element of an integer tensor)."""
    x = _input(input, "isfinite")
    if not x.is_floating_point():
        return full(tuple(x.shape), True, "bool")
    return x.isnan().logical_or(x.isinf()).logical_not()


def nan_to_num(input, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Tensor:
    """torch.nan_to_num: NaN, +Inf and -Inf replaced (by 0 and the dtype's largest and lowest finite values
    unless given); the gradient flows where the input is finite."""
    from . import ops

    x = _input(input, "nan_to_num")
    if not x.is_floating_point():
        return x
    info = np.finfo(np.float32 if x.dtype.name == "bfloat16" else x.dtype)
    hi = info.max if posinf is None else posinf
    lo = info.min if neginf is None else neginf

    def const(v):
        return as_tensor(np.asarray(v, x.dtype))

    y = ops.where(x.isnan(), const(nan), x)
    y = ops.where(ops.isinf(x, detect_negative=False), const(hi), y)
    return ops.where(ops.isinf(x, detect_positive=False), const(lo), y)


def trunc(input) -> Tensor:
    """torch.trunc (fix): rounded toward zero."""
    from . import ops

    x = _input(input, "trunc")
    return ops.where(x < 0, x.ceil(), x.floor())


fix = trunc


def frac(input) -> Tensor:
    """torch.frac: ``input - trunc(input)`` (the sign of the input)."""
    x = _input(input, "frac")
    return x - trunc(x)


def diagonal(input, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """torch.diagonal: the ``offset`` diagonal of the (dim1, dim2) matrices, as the last dim."""
    x = _input(input, "diagonal")
    if x.ndim < 2:
        raise ParamInvalidError(f"diagonal: expects a tensor of >= 2 dims, got shape {tuple(x.shape)}")
    a, b = _dim(dim1, x.ndim, "diagonal"), _dim(dim2, x.ndim, "diagonal")
    if a == b:
        raise ParamInvalidError(f"diagonal: dim1 and dim2 must differ, got {dim1} and {dim2}")
    rest = [d for d in range(x.ndim) if d not in (a, b)]
    m = x.permute(*rest, a, b)
    rows, cols = int(m.shape[-2]), int(m.shape[-1])
    r0, c0 = (0, int(offset)) if offset >= 0 else (-int(offset), 0)
    n = _max(0, _min(rows - r0, cols - c0))
    flat = m.reshape(*m.shape[:-2], rows * cols)
    index = as_tensor((np.arange(n) + r0) * cols + np.arange(n) + c0)
    return flat.index_select(-1, index)


def diag(input, diagonal: int = 0) -> Tensor:
    """torch.diag: a 1-D tensor as the ``diagonal`` diagonal of a square matrix, or a matrix's diagonal."""
    x = _input(input, "diag")
    k = int(diagonal)
    if x.ndim == 2:
        return globals()["diagonal"](x, k)
    if x.ndim != 1:
        raise ParamInvalidError(f"diag: expects a 1-D or 2-D tensor, got shape {tuple(x.shape)}")
    n = int(x.shape[0])
    size = n + _abs(k)
    padded = x if k == 0 else _pad_end(x, _abs(k))
    mask = as_tensor(np.eye(size, size, k, dtype=x.dtype))
    return mask * (padded.reshape(size, 1) if k >= 0 else padded.reshape(1, size))


def _pad_end(x: Tensor, n: int) -> Tensor:
    from .ops import torch_names

    return torch_names.cat([x, as_tensor(np.zeros((n,), x.dtype))], 0)


def trace(input) -> Tensor:
    """torch.trace: the sum of a matrix's main diagonal."""
    x = _input(input, "trace")
    if x.ndim != 2:
        raise ParamInvalidError(f"trace: expects a 2-D tensor, got shape {tuple(x.shape)}")
    return diagonal(x).sum()


def dot(input, other) -> Tensor:
    """torch.dot: the inner product of two 1-D tensors of one size."""
    x, y = _input(input, "dot"), _input(other, "dot")
    if x.ndim != 1 or y.ndim != 1 or x.shape != y.shape:
        raise ParamInvalidError(
            f"dot: expects two 1-D tensors of one size, got {tuple(x.shape)} and {tuple(y.shape)}; matmul "
            "multiplies matrices"
        )
    return (x * y).sum()


def inner(input, other) -> Tensor:
    """torch.inner: products summed over the last dim of both (the shape ``input.shape[:-1] + other.shape[:-1]``)."""
    x, y = _input(input, "inner"), _input(other, "inner")
    if x.ndim == 0 or y.ndim == 0:
        return x * y
    if x.shape[-1] != y.shape[-1]:
        raise ParamInvalidError(f"inner: the last dims differ: {tuple(x.shape)} and {tuple(y.shape)}")
    k = int(x.shape[-1])
    out = x.reshape(-1, k).matmul(y.reshape(-1, k).t())
    return out.reshape(*x.shape[:-1], *y.shape[:-1])


def addmm(input, mat1, mat2, *, beta=1, alpha=1) -> Tensor:
    """torch.addmm: ``beta * input + alpha * (mat1 @ mat2)`` of matrices."""
    return _scaled_sum(input, _matrices(mat1, mat2, 2, "addmm"), beta, alpha, "addmm")


def baddbmm(input, batch1, batch2, *, beta=1, alpha=1) -> Tensor:
    """torch.baddbmm: ``beta * input + alpha * (batch1 @ batch2)`` of (b, n, m) and (b, m, p) batches."""
    return _scaled_sum(input, _matrices(batch1, batch2, 3, "baddbmm"), beta, alpha, "baddbmm")


def _matrices(a, b, ndim: int, what: str) -> Tensor:
    a, b = _input(a, what), _input(b, what)
    if a.ndim != ndim or b.ndim != ndim or a.shape[-1] != b.shape[-2] or a.shape[:-2] != b.shape[:-2]:
        raise ParamInvalidError(
            f"{what}: expects {ndim}-D operands that multiply, got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    return a.matmul(b)


def _scaled_sum(input, product: Tensor, beta, alpha, what: str) -> Tensor:
    x = _input(input, what)
    term = product if alpha == 1 else product * alpha
    if beta == 0:  # torch ignores input then (a NaN in it too); the result keeps the broadcast shape
        return term.expand(*np.broadcast_shapes(tuple(x.shape), tuple(term.shape)))
    return (x if beta == 1 else x * beta) + term


def broadcast_to(input, size) -> Tensor:
    """torch.broadcast_to: ``input.expand(size)`` (-1 keeps a dim)."""
    return _input(input, "broadcast_to").expand(*size)


def broadcast_tensors(*tensors) -> tuple:
    """torch.broadcast_tensors: every tensor expanded to the broadcast of their shapes."""
    ts = [_input(t, "broadcast_tensors") for t in tensors]
    try:
        shape = np.broadcast_shapes(*(tuple(t.shape) for t in ts))
    except ValueError:
        raise ParamInvalidError(f"broadcast_tensors: shapes {[tuple(t.shape) for t in ts]} do not broadcast") from None
    return tuple(t.expand(*shape) for t in ts)


def swapaxes(input, axis0: int, axis1: int) -> Tensor:
    """torch.swapaxes / swapdims: ``input.transpose(axis0, axis1)``."""
    return _input(input, "swapaxes").transpose(axis0, axis1)


swapdims = swapaxes


def movedim(input, source, destination) -> Tensor:
    """torch.movedim / moveaxis: the dims ``source`` moved to ``destination`` (ints or sequences), the others
    kept in order."""
    x = _input(input, "movedim")
    src = [source] if isinstance(source, numbers.Integral) else list(source)
    dst = [destination] if isinstance(destination, numbers.Integral) else list(destination)
    src = [_dim(d, x.ndim, "movedim") for d in src]
    dst = [_dim(d, x.ndim, "movedim") for d in dst]
    if len(src) != len(dst) or len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ParamInvalidError(
            f"movedim: source {source} and destination {destination} must be distinct dims, as many"
        )
    order = [d for d in range(x.ndim) if d not in src]
    perm = [0] * x.ndim
    for s, d in zip(src, dst):
        perm[d] = s
    rest = iter(order)
    perm = [perm[i] if i in dst else next(rest) for i in range(x.ndim)]
    return x.permute(*perm)


moveaxis = movedim


def take_along_dim(input, indices, dim=None) -> Tensor:
    """torch.take_along_dim: ``gather`` along ``dim`` with input and indices broadcast over the other dims
    (flattened both when ``dim`` is None)."""
    x, idx = _input(input, "take_along_dim"), _input(indices, "take_along_dim")
    if dim is None:
        return x.reshape(-1).gather(0, idx.reshape(-1))
    if x.ndim != idx.ndim:
        raise ParamInvalidError(
            f"take_along_dim: input and indices must have as many dims, got {tuple(x.shape)} and {tuple(idx.shape)}"
        )
    d = _dim(dim, x.ndim, "take_along_dim")
    other = np.broadcast_shapes(
        tuple(s for i, s in enumerate(x.shape) if i != d), tuple(s for i, s in enumerate(idx.shape) if i != d)
    )
    full_x, full_i = list(other), list(other)
    full_x.insert(d, int(x.shape[d]))
    full_i.insert(d, int(idx.shape[d]))
    return x.expand(*full_x).gather(d, idx.expand(*full_i))


def tensor_split(input, indices_or_sections, dim: int = 0) -> tuple:
    """torch.tensor_split: ``n`` pieces as even as possible (the first ``size % n`` one longer), or the pieces
    between the given indices, along ``dim`` (views where not traced)."""
    x = _input(input, "tensor_split")
    d = _dim(dim, x.ndim, "tensor_split")
    size = int(x.shape[d])
    if isinstance(indices_or_sections, numbers.Integral) and not isinstance(indices_or_sections, bool):
        n = int(indices_or_sections)
        if n <= 0:
            raise ParamInvalidError(f"tensor_split: the number of sections must be positive, got {n}")
        q, r = divmod(size, n)
        bounds = np.cumsum([0] + [q + (i < r) for i in range(n)]).tolist()
    else:
        cuts = [int(i) for i in indices_or_sections]
        bounds = [0] + [_min(_max(c + size if c < 0 else c, 0), size) for c in cuts] + [size]
    return tuple(x.narrow(d, lo, _max(hi, lo) - lo) for lo, hi in zip(bounds[:-1], bounds[1:]))


def var_mean(input, dim=None, unbiased=None, keepdim: bool = False, *, correction=None) -> tuple:
    """torch.var_mean: ``(var, mean)`` (Bessel-corrected variance by default, as torch)."""
    x = _input(input, "var_mean")
    return x.var(dim, unbiased, keepdim, correction=correction), x.mean(dim, keepdim)


def std_mean(input, dim=None, unbiased=None, keepdim: bool = False, *, correction=None) -> tuple:
    """torch.std_mean: ``(std, mean)``."""
    x = _input(input, "std_mean")
    return x.std(dim, unbiased, keepdim, correction=correction), x.mean(dim, keepdim)


def get_default_dtype():
    """torch.get_default_dtype: float32, the dtype opsnn makes floats in."""
    from .dtypes import float32

    return float32


__all__ = [  # noqa: PLE0604 - the method functions are made from their names above
    *METHOD_FUNCTIONS,
    "addmm",
    "baddbmm",
    "broadcast_tensors",
    "broadcast_to",
    "diag",
    "diagonal",
    "dot",
    "fix",
    "frac",
    "get_default_dtype",
    "inner",
    "is_grad_enabled",
    "isfinite",
    "moveaxis",
    "movedim",
    "nan_to_num",
    "numel",
    "std_mean",
    "swapaxes",
    "swapdims",
    "take_along_dim",
    "tensor_split",
    "trace",
    "trunc",
    "var_mean",
]
