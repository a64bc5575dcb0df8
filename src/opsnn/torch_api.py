"""torch's top-level functions on opsnn tensors (``opsnn.exp(x)``, ``opsnn.sum(x, dim=1)``,
``opsnn.gather(x, 1, idx)`` ...), so torch code reads the same with ``import opsnn as torch``-style
renames. Most are the :class:`opsnn.Tensor` method of the same name called with the input first (torch's
arguments and semantics, one implementation: the composed ones, such as ``trace`` or ``median``, live in
opsnn/ops/tensor_composed.py, so gradients flow and traced functions record them). ``opsnn.ops`` keeps the functional ops' own signatures
(``opsnn.ops.gather`` is ONNX's Gather); the names here are torch's. Each is checked against torch in
tests/test_torch_api.py.

>>> import opsnn, numpy as np
>>> x = opsnn.tensor(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
>>> float(opsnn.sum(opsnn.exp(x * 0), dim=1)[0]), opsnn.trace(x).item()
(2.0, 5.0)
"""

from __future__ import annotations

import numbers

import numpy as np

from .autograd.mode import is_grad_enabled
from .errors import ParamInvalidError
from .tensor import Tensor, as_tensor

#: torch functions that are the Tensor method of the same name with the input first
METHOD_FUNCTIONS = (
    "abs absolute acos acosh add addcdiv addcmul all amax amin any arctan2 argmax argmin asin asinh atan atan2 atanh "
    "bitwise_and bitwise_not bitwise_or bitwise_xor ceil chunk clamp clamp_max clamp_min clip copysign cos cosh "
    "count_nonzero cumprod cumsum det digamma div divide eq erf erfc erfinv exp expm1 flatten floor fmax fmin fmod "
    "gather ge greater "
    "greater_equal gt heaviside hypot index_select is_floating_point isinf isnan le lerp less less_equal lgamma log "
    "log1p log_softmax logaddexp "
    "logical_and logical_not logical_or logical_xor logit logsumexp lt masked_fill masked_select matmul max "
    "maximum mean min minimum mul multiply nanmean nansum narrow ne neg negative nonzero not_equal "
    "permute pow prod reciprocal relu remainder reshape round rsqrt scatter scatter_add select sigmoid sign "
    "sin sinh softmax split sqrt square squeeze sub subtract sum t tan tanh tile topk transpose tril triu "
    "true_divide unique unsqueeze var xlogy "
    # composed ones (opsnn/ops/tensor_composed.py): the method is the one implementation
    "addmm addmv addr adjoint aminmax argwhere baddbmm broadcast_to cummax cummin deg2rad diag diagonal diff "
    "dot dsplit exp2 fix fliplr flipud float_power frac ger hsplit inner isfinite kthvalue log10 log2 "
    "logcumsumexp median moveaxis movedim mv nan_to_num nanmedian positive rad2deg ravel rot90 sgn signbit "
    "split_with_sizes swapaxes swapdims take_along_dim tensor_split trace trunc unbind unflatten vsplit "
    "index_add index_copy index_fill masked_scatter is_complex is_signed"
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


def numel(input) -> int:
    """torch.numel: the element count."""
    return int(_input(input, "numel").numel)


def broadcast_tensors(*tensors) -> tuple:
    """torch.broadcast_tensors: every tensor expanded to the broadcast of their shapes."""
    ts = [_input(t, "broadcast_tensors") for t in tensors]
    try:
        shape = np.broadcast_shapes(*(tuple(t.shape) for t in ts))
    except ValueError:
        raise ParamInvalidError(f"broadcast_tensors: shapes {[tuple(t.shape) for t in ts]} do not broadcast") from None
    return tuple(t.expand(*shape) for t in ts)


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
    "broadcast_tensors",
    "get_default_dtype",
    "is_grad_enabled",
    "numel",
    "std_mean",
    "var_mean",
]
