"""torch's names for tensor creation and manipulation, composed of the functional ops (so gradients
flow through their rules and traced functions record them): ``cat``, ``stack``, the ``*_like``
constructors, ``linspace``, ``eye``, ``std``, ``sort`` / ``argsort``, ``flip``, ``roll``,
``outer``, ``norm``, ``isclose`` / ``allclose`` / ``equal``, ``mm`` / ``bmm``, ``repeat_interleave``,
``meshgrid``. Each is checked against torch in tests/test_torch_names.py.

>>> import opsnn, numpy as np
>>> a = opsnn.tensor(np.array([1.0, 2.0], np.float32))
>>> opsnn.ops.stack([a, a], dim=1).shape
(2, 2)
"""

from __future__ import annotations

import math
import numbers
from collections import namedtuple

import numpy as np

from .. import dtypes as _dt
from ..errors import ParamInvalidError, real_number
from ..tensor import Tensor, as_tensor, empty, full, tensor
from .api import FUNCTIONS

SortResult = namedtuple("SortResult", ["values", "indices"])


def _f(name):
    return FUNCTIONS[name]


def _dim(dim, ndim: int, what: str) -> int:
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or not -ndim <= dim < ndim:
        raise ParamInvalidError(f"{what}: dim {dim!r} out of range for a {ndim}-D result")
    return int(dim) % ndim


def _tensors(tensors, what: str) -> list:
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)) or not tensors:
        raise ParamInvalidError(f"{what}: expected a non-empty list or tuple of tensors, got {type(tensors).__name__}")
    return [as_tensor(t) for t in tensors]


def cat(tensors, dim: int = 0) -> Tensor:
    """torch.cat: ``tensors`` joined along ``dim``."""
    ts = _tensors(tensors, "cat")
    return _f("concat")(ts, _dim(dim, ts[0].ndim, "cat"))


def stack(tensors, dim: int = 0) -> Tensor:
    """torch.stack: ``tensors`` of one shape joined along a new dim ``dim``."""
    ts = _tensors(tensors, "stack")
    shapes = {tuple(t.shape) for t in ts}
    if len(shapes) != 1:
        raise ParamInvalidError(f"stack: the tensors must have one shape, got {sorted(shapes)}")
    d = _dim(dim, ts[0].ndim + 1, "stack")
    return _f("concat")([_f("unsqueeze")(t, d) for t in ts], d)


def _like_dtype(input, dtype):
    return as_tensor(input).dtype if dtype is None else _dt.get(dtype)


def zeros_like(input, dtype=None, *, requires_grad: bool = False) -> Tensor:
    return full(tuple(as_tensor(input).shape), 0, _like_dtype(input, dtype), requires_grad=requires_grad)


def ones_like(input, dtype=None, *, requires_grad: bool = False) -> Tensor:
    return full(tuple(as_tensor(input).shape), 1, _like_dtype(input, dtype), requires_grad=requires_grad)


def full_like(input, fill_value, dtype=None, *, requires_grad: bool = False) -> Tensor:
    return full(tuple(as_tensor(input).shape), fill_value, _like_dtype(input, dtype), requires_grad=requires_grad)


def empty_like(input, dtype=None, *, requires_grad: bool = False) -> Tensor:
    return empty(tuple(as_tensor(input).shape), _like_dtype(input, dtype), requires_grad=requires_grad)


def linspace(start, end, steps: int, dtype="float32") -> Tensor:
    """``steps`` evenly spaced values from ``start`` to ``end`` inclusive."""
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 0:
        raise ParamInvalidError(f"linspace: steps must be an int >= 0, got {steps!r}")
    lo, hi = real_number("linspace", "start", start), real_number("linspace", "end", end)
    return tensor(np.linspace(lo, hi, int(steps)).astype(_dt.get(dtype)))


def eye(n: int, m: int | None = None, dtype="float32") -> Tensor:
    """The identity: ones on the diagonal of an ``n`` x ``m`` (default ``n``) matrix."""
    for name, v in (("n", n), ("m", n if m is None else m)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
            raise ParamInvalidError(f"eye: {name} must be an int >= 0, got {v!r}")
    return tensor(np.eye(int(n), int(n if m is None else m), dtype=_dt.get(dtype)))


def std(input, dim=None, unbiased=None, keepdim: bool = False, *, correction=None) -> Tensor:
    """torch.std: the square root of :func:`opsnn.ops.var` (Bessel-corrected by default, as torch)."""
    return _f("sqrt")(_f("var")(input, dim, unbiased, keepdim, correction=correction))


def sort(input, dim: int = -1, descending: bool = False, stable: bool = False) -> SortResult:
    """torch.sort: ``(values, indices)`` along ``dim``, NaN ordered as the largest value."""
    x = as_tensor(input)
    if x.ndim == 0:
        return SortResult(x, tensor(np.zeros((), np.int64)))
    d = _dim(dim, x.ndim, "sort")
    values, indices = _f("topk")(x, x.shape[d], d, largest=bool(descending), sorted=True)
    return SortResult(values, indices)


def argsort(input, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    return sort(input, dim, descending, stable).indices


def flip(input, dims) -> Tensor:
    """torch.flip: ``input`` reversed along each of ``dims``."""
    x = as_tensor(input)
    dims = [dims] if isinstance(dims, numbers.Integral) else list(dims)
    axes = sorted({_dim(d, x.ndim, "flip") for d in dims})
    if not axes:
        return x
    n = len(axes)
    return _f("slice")(x, [-1] * n, [-(2**62)] * n, axes, [-1] * n)


def roll(input, shifts, dims=None) -> Tensor:
    """torch.roll: elements shifted along ``dims`` (flattened when None), wrapping around."""
    x = as_tensor(input)
    if dims is None:
        if not isinstance(shifts, numbers.Integral):
            raise ParamInvalidError("roll: without dims, shifts must be one int (the tensor is rolled flattened)")
        return _f("reshape")(roll(_f("reshape")(x, (-1,)), shifts, 0), tuple(x.shape))
    shifts = [shifts] if isinstance(shifts, numbers.Integral) else list(shifts)
    dims = [dims] if isinstance(dims, numbers.Integral) else list(dims)
    if len(shifts) != len(dims):
        raise ParamInvalidError(f"roll: one shift per dim, got shifts {shifts} and dims {dims}")
    for s, d in zip(shifts, dims):
        d = _dim(d, x.ndim, "roll")
        n = x.shape[d]
        k = int(s) % n if n else 0
        if k:
            tail = _f("slice")(x, [n - k], [n], [d])
            head = _f("slice")(x, [0], [n - k], [d])
            x = _f("concat")([tail, head], d)
    return x


def outer(input, vec2) -> Tensor:
    """torch.outer: ``input[i] * vec2[j]`` of two 1-D tensors."""
    a, b = as_tensor(input), as_tensor(vec2)
    if a.ndim != 1 or b.ndim != 1:
        raise ParamInvalidError(f"outer: expected two 1-D tensors, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    return _f("mul")(_f("unsqueeze")(a, 1), _f("unsqueeze")(b, 0))


def norm(input, p=2, dim=None, keepdim: bool = False) -> Tensor:
    """torch.norm / torch.linalg.vector_norm of the elements (all, or along ``dim``): ``p`` a number > 0,
    ``'fro'`` (2) or ``inf`` (the largest magnitude)."""
    x = as_tensor(input)
    p = 2.0 if p == "fro" else (math.inf if p in ("inf", math.inf) else real_number("norm", "p", p))
    if not p > 0:
        raise ParamInvalidError(f"norm: p must be > 0, 'fro' or inf, got {p}")
    a = _f("abs")(x)
    if math.isinf(p):
        return _f("max")(a, dim, keepdim) if dim is not None else _f("max")(_f("reshape")(a, (-1,)))
    if p == 2:
        return _f("sqrt")(_f("sum")(_f("mul")(x, x), dim, keepdim))
    if p == 1:
        return _f("sum")(a, dim, keepdim)
    pw = as_tensor(np.asarray(p, x.dtype))
    return _f("pow")(_f("sum")(_f("pow")(a, pw), dim, keepdim), as_tensor(np.asarray(1.0 / p, x.dtype)))


def isclose(input, other, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> Tensor:
    """torch.isclose: ``|input - other| <= atol + rtol * |other|`` elementwise (equal infinities close)."""
    a = as_tensor(input)
    b = as_tensor(other, like=a)
    tol = _f("add")(as_tensor(np.asarray(atol, a.dtype)), _f("mul")(as_tensor(np.asarray(rtol, a.dtype)), _f("abs")(b)))
    close = _f("logical_or")(_f("eq")(a, b), _f("le")(_f("abs")(_f("sub")(a, b)), tol))
    if equal_nan:
        close = _f("logical_or")(close, _f("logical_and")(_f("isnan")(a), _f("isnan")(b)))
    return close


def allclose(input, other, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> bool:
    return bool(np.all(isclose(input, other, rtol, atol, equal_nan).numpy()))


def equal(input, other) -> bool:
    """torch.equal: the same shape and the same elements (NaN is not equal to itself)."""
    a, b = as_tensor(input), as_tensor(other)
    return tuple(a.shape) == tuple(b.shape) and bool(np.all(_f("eq")(a, as_tensor(b, like=a)).numpy()))


def mm(input, mat2) -> Tensor:
    """torch.mm: the product of two matrices."""
    a, b = as_tensor(input), as_tensor(mat2)
    if a.ndim != 2 or b.ndim != 2:
        raise ParamInvalidError(f"mm: expected two 2-D tensors, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    return _f("matmul")(a, b)


def bmm(input, mat2) -> Tensor:
    """torch.bmm: batched products of (b, n, m) and (b, m, p) tensors."""
    a, b = as_tensor(input), as_tensor(mat2)
    if a.ndim != 3 or b.ndim != 3 or a.shape[0] != b.shape[0]:
        raise ParamInvalidError(
            f"bmm: expected two 3-D tensors of one batch, got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    return _f("matmul")(a, b)


def repeat_interleave(input, repeats, dim=None) -> Tensor:
    """torch.repeat_interleave: each element (along ``dim``; flattened when None) repeated ``repeats``
    times (an int, or one count per element)."""
    x = as_tensor(input)
    if dim is None:
        x, dim = _f("reshape")(x, (-1,)), 0
    d = _dim(dim, x.ndim, "repeat_interleave")
    n = x.shape[d]
    counts = np.full(n, repeats) if isinstance(repeats, numbers.Integral) else np.asarray(repeats).reshape(-1)
    if counts.shape != (n,) or (counts < 0).any():
        raise ParamInvalidError(
            f"repeat_interleave: repeats must be an int >= 0 or {n} counts >= 0 along dim {dim}, got {repeats!r}"
        )
    index = tensor(np.repeat(np.arange(n, dtype=np.int64), counts.astype(np.int64)))
    return _f("index_select")(x, d, index)


def meshgrid(*tensors, indexing: str = "ij") -> tuple:
    """torch.meshgrid: each 1-D tensor broadcast along its own dim of the grid (``indexing`` 'ij' or 'xy')."""
    ts = _tensors(
        list(tensors[0]) if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)) else list(tensors), "meshgrid"
    )
    if indexing not in ("ij", "xy"):
        raise ParamInvalidError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    if any(t.ndim != 1 for t in ts):
        raise ParamInvalidError(f"meshgrid: expected 1-D tensors, got shapes {[tuple(t.shape) for t in ts]}")
    sizes = [t.shape[0] for t in ts]
    order = list(range(len(ts)))
    if indexing == "xy" and len(ts) >= 2:
        order[0], order[1] = 1, 0
    shape = [sizes[i] for i in order]
    out = []
    for i, t in enumerate(ts):
        view = [1] * len(ts)
        view[order.index(i)] = sizes[i]
        out.append(_f("expand")(_f("reshape")(t, tuple(view)), *shape))
    return tuple(out)


__all__ = [
    "SortResult",
    "allclose",
    "argsort",
    "bmm",
    "cat",
    "empty_like",
    "equal",
    "eye",
    "flip",
    "full_like",
    "isclose",
    "linspace",
    "meshgrid",
    "mm",
    "norm",
    "ones_like",
    "outer",
    "repeat_interleave",
    "roll",
    "sort",
    "stack",
    "std",
    "zeros_like",
]
