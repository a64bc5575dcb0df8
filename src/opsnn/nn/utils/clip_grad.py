"""Clip the gradients of parameters in place, as torch.nn.utils does (``clip_grad_norm_``, its
two halves ``get_total_norm`` and ``clip_grads_with_norm_``, ``clip_grad_value_``).

>>> import opsnn, numpy as np
>>> p = opsnn.nn.Parameter(np.zeros(2, np.float32))
>>> p.grad = opsnn.tensor(np.array([3.0, 4.0], np.float32))
>>> float(opsnn.nn.utils.clip_grad_norm_([p], 1.0).item())
5.0
>>> np.round(p.grad.numpy(), 4)
array([0.6, 0.8], dtype=float32)
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from ...errors import ParamInvalidError, real_number
from ...tensor import Tensor, tensor


def _grads(parameters) -> list:
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    return [p.grad for p in parameters if p.grad is not None]


def clip_grad_norm_(
    parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False, foreach=None
) -> Tensor:
    """Scale all gradients together so their joint ``norm_type`` norm is at most ``max_norm``;
    returns the norm before clipping (a 0-d tensor)."""
    parameters = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    grads = _grads(parameters)
    max_norm = real_number("clip_grad_norm_", "max_norm", max_norm)
    if not max_norm >= 0.0:
        raise ParamInvalidError(f"clip_grad_norm_: max_norm must be >= 0, got {max_norm}")
    if norm_type == "inf":
        norm_type = float("inf")
    if isinstance(norm_type, str) or not real_number("clip_grad_norm_", "norm_type", norm_type) > 0.0:
        raise ParamInvalidError(f"clip_grad_norm_: norm_type must be a number > 0 or 'inf', got {norm_type!r}")
    norm_type = float(norm_type)
    if not grads:
        return tensor(np.zeros((), np.float32))
    from ...graph.tracing import active_tracer

    if active_tracer() is not None and not error_if_nonfinite:
        return _traced_clip_norm(parameters, float(max_norm), norm_type)
    arrays = [g.numpy() for g in grads]
    if math.isinf(norm_type):
        total = max(float(np.max(np.abs(a))) if a.size else 0.0 for a in arrays)
    else:
        total = float(np.sum([np.sum(np.abs(a.astype(np.float64)) ** norm_type) for a in arrays])) ** (1.0 / norm_type)
    if error_if_nonfinite and not math.isfinite(total):
        raise ParamInvalidError(
            f"clip_grad_norm_: the total {norm_type}-norm of the gradients is {total}; "
            "pass error_if_nonfinite=False to clip anyway"
        )
    coef = float(max_norm) / (total + 1e-6)
    if coef < 1.0:
        for a in arrays:
            a *= np.asarray(coef, a.dtype)
    return tensor(np.asarray(total, grads[0].dtype))


def _params_with_grads(parameters) -> list:
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    return [p for p in parameters if p.grad is not None]


def _traced_clip_norm(parameters, max_norm: float, norm_type: float) -> Tensor:
    """clip_grad_norm_ inside a traced training step: the norm and the scale are graph ops (float32
    sums, where the eager path sums in float64), and each ``.grad`` becomes the scaled value."""
    from ... import ops

    params = _params_with_grads(parameters)
    dt = params[0].grad.dtype
    if math.isinf(norm_type):
        parts = [ops.max(ops.abs(p.grad)) for p in params]
        total = parts[0] if len(parts) == 1 else ops.maximum(*parts)
    else:
        power = tensor(np.asarray(norm_type, dt))
        total = None
        for p in params:
            s = ops.sum(ops.pow(ops.abs(p.grad), power))
            total = s if total is None else ops.add(total, s)
        total = ops.pow(total, tensor(np.asarray(1.0 / norm_type, dt)))
    coef = ops.div(tensor(np.asarray(max_norm, dt)), ops.add(total, tensor(np.asarray(1e-6, dt))))
    coef = ops.minimum(coef, tensor(np.asarray(1.0, dt)))
    for p in params:
        p.grad = ops.mul(p.grad, coef)
    return total


def clip_grad_value_(parameters, clip_value: float, foreach=None) -> None:
    """Clamp every gradient element into ``[-clip_value, clip_value]`` in place."""
    v = real_number("clip_grad_value_", "clip_value", clip_value)
    if not v >= 0.0:
        raise ParamInvalidError(f"clip_grad_value_: clip_value must be >= 0, got {v}")
    from ...graph.tracing import active_tracer

    if active_tracer() is not None:  # traced: each .grad becomes the clamped value
        from ... import ops

        for p in _params_with_grads(parameters):
            p.grad = ops.clip(p.grad, -v, v)
        return
    for g in _grads(parameters):
        a = g.numpy()
        np.clip(a, -v, v, out=a)


def _norm_type(where: str, norm_type) -> float:
    if norm_type in ("inf", "-inf"):
        return float(norm_type)
    if isinstance(norm_type, str):
        raise ParamInvalidError(f"{where}: norm_type must be a number > 0 or +-inf, got {norm_type!r}")
    p = real_number(where, "norm_type", norm_type)
    if not (p > 0.0 or p == -math.inf):
        raise ParamInvalidError(f"{where}: norm_type must be a number > 0 or +-inf, got {norm_type!r}")
    return p


def get_total_norm(tensors, norm_type: float = 2.0, error_if_nonfinite: bool = False, foreach=None) -> Tensor:
    """torch.nn.utils.get_total_norm: the ``norm_type`` norm of the norms of ``tensors`` (a 0-d tensor of
    the first one's dtype; 0 for none). Not recorded for autograd, as torch's.

    >>> import opsnn, numpy as np
    >>> float(opsnn.nn.utils.get_total_norm([opsnn.tensor(np.array([3.0, 4.0], np.float32))]))
    5.0
    """
    from ... import ops

    ts = [tensors] if isinstance(tensors, Tensor) else [t for t in tensors if t is not None]
    p = _norm_type("get_total_norm", norm_type)
    if not ts:
        return tensor(np.zeros((), np.float32))
    dt = ts[0].dtype
    from ...graph.tracing import active_tracer

    if active_tracer() is not None:  # a traced step: the norm is graph ops over the traced gradients
        if math.isinf(p):
            pick = ops.max if p > 0 else ops.min
            parts = [pick(ops.abs(t)) for t in ts]
            total = parts[0] if len(parts) == 1 else (ops.maximum if p > 0 else ops.minimum)(*parts)
        else:
            power = tensor(np.asarray(p, dt))
            total = None
            for t in ts:
                s = ops.sum(ops.pow(ops.abs(t), power))
                total = s if total is None else ops.add(total, s)
            total = ops.pow(total, tensor(np.asarray(1.0 / p, dt)))
        value = float(total.numpy()) if error_if_nonfinite else 0.0
    else:
        arrays = [np.abs(np.asarray(t.numpy(), np.float64)) for t in ts]
        if math.isinf(p):
            pick = np.max if p > 0 else np.min
            value = float(pick([pick(a) if a.size else (0.0 if p > 0 else math.inf) for a in arrays]))
        else:
            value = float(np.sum([np.sum(a**p) for a in arrays])) ** (1.0 / p)
        total = tensor(np.asarray(value, dt))
    if error_if_nonfinite and not math.isfinite(value):
        raise ParamInvalidError(
            f"get_total_norm: the total {p}-norm of the tensors is {value}; pass error_if_nonfinite=False to go on"
        )
    return total


def clip_grads_with_norm_(parameters, max_norm: float, total_norm, foreach=None) -> None:
    """torch.nn.utils.clip_grads_with_norm_: scale every gradient by ``min(1, max_norm / (total_norm + 1e-6))``
    in place, given the ``total_norm`` that :func:`get_total_norm` computed from them.

    >>> import opsnn, numpy as np
    >>> p = opsnn.nn.Parameter(np.zeros(2, np.float32))
    >>> p.grad = opsnn.tensor(np.array([3.0, 4.0], np.float32))
    >>> opsnn.nn.utils.clip_grads_with_norm_([p], 1.0, opsnn.nn.utils.get_total_norm([p.grad]))
    >>> np.round(p.grad.numpy(), 4)
    array([0.6, 0.8], dtype=float32)
    """
    max_norm = real_number("clip_grads_with_norm_", "max_norm", max_norm)
    params = _params_with_grads(parameters)
    if not params:
        return
    from ...graph.tracing import active_tracer

    if active_tracer() is not None:  # traced: the scale is a graph op and each .grad the scaled value
        from ... import ops

        dt = params[0].grad.dtype
        norm = total_norm if isinstance(total_norm, Tensor) else tensor(np.asarray(total_norm, dt))
        coef = ops.div(tensor(np.asarray(max_norm, dt)), ops.add(norm, tensor(np.asarray(1e-6, dt))))
        coef = ops.minimum(coef, tensor(np.asarray(1.0, dt)))
        for p in params:
            p.grad = ops.mul(p.grad, coef)
        return
    norm = (
        float(total_norm.numpy())
        if isinstance(total_norm, Tensor)
        else real_number("clip_grads_with_norm_", "total_norm", total_norm)
    )
    coef = min(max_norm / (norm + 1e-6), 1.0)
    for p in params:
        a = p.grad.numpy()
        a *= np.asarray(coef, a.dtype)


def clip_grad_norm(
    parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False, foreach=None
) -> Tensor:
    """torch's deprecated spelling of :func:`clip_grad_norm_` (warns with a FutureWarning, as torch's)."""
    warnings.warn(
        "opsnn.nn.utils.clip_grad_norm is deprecated in favor of opsnn.nn.utils.clip_grad_norm_",
        FutureWarning,
        stacklevel=2,
    )
    return clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite, foreach)


__all__ = ["clip_grad_norm", "clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_", "get_total_norm"]
