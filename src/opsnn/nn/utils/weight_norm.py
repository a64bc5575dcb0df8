"""Weight normalization as torch.nn.utils' classic ``weight_norm`` / ``remove_weight_norm``: a weight
``w`` becomes parameters ``w_g`` (its norm over every dim but ``dim``) and ``w_v`` (its direction), and a
forward pre-hook recomputes ``w = w_v * (w_g / ||w_v||)`` before each call, so gradients reach g and v.

>>> import opsnn, numpy as np
>>> lin = opsnn.nn.utils.weight_norm(opsnn.nn.Linear(3, 2))
>>> sorted(lin.state_dict())
['bias', 'weight_g', 'weight_v']
>>> lin.weight_g.shape
(2, 1)
"""

from __future__ import annotations

import numpy as np

from ... import ops
from ...errors import ParamInvalidError
from ...tensor import Tensor
from ..module import Module, Parameter


def _check_dim(where: str, dim, ndim: int) -> int:
    if dim is None or dim == -1:  # torch's -1: one norm over the whole tensor
        return -1
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not -ndim <= dim < ndim:
        raise ParamInvalidError(f"{where}: dim must be None, -1 or an int in [{-ndim}, {ndim}), got {dim!r}")
    return int(dim) % ndim


def norm_except_dim(v: Tensor, dim: int) -> Tensor:
    """The 2-norm of ``v`` over every dim but ``dim`` (kept as size-1 dims); ``dim=-1``: over all (0-d)."""
    if dim == -1:
        return ops.sqrt(ops.sum(ops.mul(v, v)))
    axes = tuple(i for i in range(v.ndim) if i != dim)
    if not axes:  # a 1-d weight normalised along its only dim: each entry is its own norm
        return ops.abs(v)
    return ops.sqrt(ops.sum(ops.mul(v, v), dim=axes, keepdim=True))


def _norm_except_dim_array(a: np.ndarray, dim: int) -> np.ndarray:
    a64 = np.asarray(a, np.float64)
    if dim == -1:
        return np.asarray(np.sqrt(np.sum(a64 * a64)))
    axes = tuple(i for i in range(a.ndim) if i != dim)
    return np.abs(a64) if not axes else np.sqrt(np.sum(a64 * a64, axis=axes, keepdims=True))


class WeightNorm:
    """The forward pre-hook :func:`weight_norm` registers (torch's class of the same name)."""

    def __init__(self, name: str, dim: int):
        self.name, self.dim = name, dim

    def compute_weight(self, module: Module) -> Tensor:
        g, v = getattr(module, self.name + "_g"), getattr(module, self.name + "_v")
        return ops.mul(v, ops.div(g, norm_except_dim(v, self.dim)))

    @staticmethod
    def apply(module: Module, name: str, dim) -> WeightNorm:
        if not isinstance(module, Module):
            raise ParamInvalidError(f"weight_norm: expected an opsnn.nn.Module, got {type(module).__name__}")
        for hook in module.__dict__.get("_forward_pre_hooks", {}).values():
            if isinstance(hook, WeightNorm) and hook.name == name:
                raise ParamInvalidError(f"weight_norm: two weight_norm hooks on the same parameter {name!r}")
        weight = module._parameters.get(name)
        if weight is None:
            raise ParamInvalidError(f"weight_norm: {type(module).__name__} has no parameter {name!r}")
        fn = WeightNorm(name, _check_dim("weight_norm", dim, weight.ndim))
        arr = weight.numpy()
        del module._parameters[name]
        g = _norm_except_dim_array(arr, fn.dim).astype(arr.dtype)
        module.register_parameter(name + "_g", Parameter(g, requires_grad=weight.requires_grad))
        module.register_parameter(name + "_v", Parameter(arr, requires_grad=weight.requires_grad))
        setattr(module, name, fn.compute_weight(module))
        module.register_forward_pre_hook(fn)
        return fn

    def remove(self, module: Module) -> None:
        from ...autograd import no_grad

        with no_grad():
            weight = self.compute_weight(module)
        delattr(module, self.name)
        del module._parameters[self.name + "_g"]
        del module._parameters[self.name + "_v"]
        setattr(module, self.name, Parameter(weight.numpy()))

    def __call__(self, module: Module, inputs) -> None:
        setattr(module, self.name, self.compute_weight(module))


def weight_norm(module: Module, name: str = "weight", dim: int | None = 0) -> Module:
    """Reparametrize ``module.<name>`` as ``<name>_g`` (magnitude, norm over every dim but ``dim``;
    ``dim=None`` or -1: one norm for the whole tensor) and ``<name>_v`` (direction); returns ``module``."""
    WeightNorm.apply(module, name, dim)
    return module


def remove_weight_norm(module: Module, name: str = "weight") -> Module:
    """Fold ``<name>_g`` and ``<name>_v`` back into one parameter ``<name>`` and drop the hook; returns ``module``."""
    return remove_reparametrization(module, WeightNorm, name, "weight_norm")


def remove_reparametrization(module: Module, kind: type, name: str, what: str) -> Module:
    """Undo the ``kind`` forward pre-hook (weight_norm, spectral_norm) that recomputes ``module.<name>``."""
    hooks = module.__dict__.get("_forward_pre_hooks", {})
    for k, hook in list(hooks.items()):
        if isinstance(hook, kind) and hook.name == name:
            hook.remove(module)
            del hooks[k]
            return module
    raise ParamInvalidError(f"remove_{what}: no {what} of {name!r} on {type(module).__name__}")


__all__ = ["WeightNorm", "remove_weight_norm", "weight_norm"]
