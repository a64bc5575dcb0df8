"""Spectral normalization as torch.nn.utils' ``spectral_norm`` / ``remove_spectral_norm``: the weight is
kept as ``<name>_orig``; a forward pre-hook divides it by its largest singular value, estimated by power
iteration on the buffers ``<name>_u`` and ``<name>_v`` (updated in training mode only).

>>> import opsnn, numpy as np
>>> lin = opsnn.nn.utils.spectral_norm(opsnn.nn.Linear(3, 2))
>>> sorted(lin.state_dict())
['bias', 'weight_orig', 'weight_u', 'weight_v']
"""

from __future__ import annotations

import numpy as np

from ... import ops
from ...errors import ParamInvalidError, real_number
from ...tensor import Tensor, tensor
from .. import init
from ..module import Module, Parameter


def _normalize(a: np.ndarray, eps: float) -> np.ndarray:
    return a / max(float(np.linalg.norm(a)), eps)


class SpectralNorm:
    """The forward pre-hook :func:`spectral_norm` registers (torch's class of the same name)."""

    def __init__(self, name: str = "weight", n_power_iterations: int = 1, dim: int = 0, eps: float = 1e-12):
        if isinstance(n_power_iterations, bool) or not isinstance(n_power_iterations, (int, np.integer)):
            raise ParamInvalidError(f"spectral_norm: n_power_iterations must be an int, got {n_power_iterations!r}")
        if n_power_iterations <= 0:
            raise ParamInvalidError(f"spectral_norm: n_power_iterations must be positive, got {n_power_iterations}")
        self.name, self.dim = name, dim
        self.n_power_iterations = int(n_power_iterations)
        self.eps = real_number("spectral_norm", "eps", eps)

    def _matrix_array(self, w: np.ndarray) -> np.ndarray:
        if self.dim != 0:
            w = np.moveaxis(w, self.dim, 0)
        return w.reshape(w.shape[0], -1)

    def reshape_weight_to_matrix(self, weight: Tensor) -> Tensor:
        """``weight`` as (size of ``dim``, everything else), differentiably."""
        if self.dim != 0:
            weight = ops.permute(weight, self.dim, *[d for d in range(weight.ndim) if d != self.dim])
        return ops.reshape(weight, (weight.shape[0], -1))

    def compute_weight(self, module: Module, do_power_iteration: bool) -> Tensor:
        weight = getattr(module, self.name + "_orig")
        u, v = getattr(module, self.name + "_u"), getattr(module, self.name + "_v")
        if do_power_iteration:  # torch: in place on the buffers, outside autograd
            mat = self._matrix_array(np.asarray(weight.numpy(), np.float64))
            ua, va = np.asarray(u.numpy(), np.float64), np.asarray(v.numpy(), np.float64)
            for _ in range(self.n_power_iterations):
                va = _normalize(mat.T @ ua, self.eps)
                ua = _normalize(mat @ va, self.eps)
            u.copy_(ua.astype(u.dtype))
            v.copy_(va.astype(v.dtype))
        mat = self.reshape_weight_to_matrix(weight)
        u_row = tensor(np.array(u.numpy()).reshape(1, -1))  # copies: the gradient treats u and v as constants
        v_col = tensor(np.array(v.numpy()).reshape(-1, 1))
        sigma = ops.reshape(ops.matmul(ops.matmul(u_row, mat), v_col), ())
        return ops.div(weight, sigma)

    def remove(self, module: Module) -> None:
        from ...autograd import no_grad

        with no_grad():
            weight = self.compute_weight(module, do_power_iteration=False)
        for suffix in ("", "_u", "_v", "_orig"):
            delattr(module, self.name + suffix)
        module.register_parameter(self.name, Parameter(weight.numpy()))

    def __call__(self, module: Module, inputs) -> None:
        if module.training:
            from ...graph.tracing import TraceError, active_tracer

            if active_tracer() is not None:
                raise TraceError(
                    f"spectral_norm of {self.name!r}: the power iteration updates its buffers on the host, which a "
                    "compiled training step would not replay; run the step eagerly"
                )
        setattr(module, self.name, self.compute_weight(module, do_power_iteration=module.training))

    @staticmethod
    def apply(module: Module, name: str, n_power_iterations: int, dim: int, eps: float) -> SpectralNorm:
        if not isinstance(module, Module):
            raise ParamInvalidError(f"spectral_norm: expected an opsnn.nn.Module, got {type(module).__name__}")
        for hook in module.__dict__.get("_forward_pre_hooks", {}).values():
            if isinstance(hook, SpectralNorm) and hook.name == name:
                raise ParamInvalidError(f"spectral_norm: two spectral_norm hooks on the same parameter {name!r}")
        weight = module._parameters.get(name)
        if weight is None:
            raise ParamInvalidError(f"spectral_norm: {type(module).__name__} has no parameter {name!r} (or it is None)")
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not -weight.ndim <= dim < weight.ndim:
            raise ParamInvalidError(
                f"spectral_norm: dim must be an int in [{-weight.ndim}, {weight.ndim}), got {dim!r}"
            )
        fn = SpectralNorm(name, n_power_iterations, int(dim) % weight.ndim, eps)
        h, w = fn._matrix_array(weight.numpy()).shape
        rng = init.generator()  # opsnn's seeded generator, as torch draws u and v from its own
        u = _normalize(rng.standard_normal(h), fn.eps).astype(weight.dtype)
        v = _normalize(rng.standard_normal(w), fn.eps).astype(weight.dtype)
        delattr(module, name)
        module.register_parameter(name + "_orig", weight)
        setattr(module, name, weight.detach())
        module.register_buffer(name + "_u", u)
        module.register_buffer(name + "_v", v)
        module.register_forward_pre_hook(fn)
        return fn


def _default_dim(module: Module) -> int:
    from ..layers import ConvTranspose1d, ConvTranspose2d, ConvTranspose3d

    return 1 if isinstance(module, (ConvTranspose1d, ConvTranspose2d, ConvTranspose3d)) else 0


def spectral_norm(
    module: Module, name: str = "weight", n_power_iterations: int = 1, eps: float = 1e-12, dim: int | None = None
) -> Module:
    """Divide ``module.<name>`` by its spectral norm before each forward (``dim``: the output dim, 0, or 1
    for transposed convolutions); returns ``module``."""
    SpectralNorm.apply(module, name, n_power_iterations, _default_dim(module) if dim is None else dim, eps)
    return module


def remove_spectral_norm(module: Module, name: str = "weight") -> Module:
    """Fold the normalised weight back into one parameter ``<name>`` and drop the hook and buffers."""
    from .weight_norm import remove_reparametrization

    return remove_reparametrization(module, SpectralNorm, name, "spectral_norm")


__all__ = ["SpectralNorm", "remove_spectral_norm", "spectral_norm"]
