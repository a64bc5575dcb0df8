"""``opsnn.optim.Adadelta``: torch's Adadelta (rho, eps, learning rate, weight decay, maximize) as one
fused multi-tensor kernel per step (the ``ApplyAdadelta`` op).

>>> import opsnn, numpy as np
>>> p = opsnn.nn.Parameter(np.array([1.0, -1.0], np.float32))
>>> opt = opsnn.optim.Adadelta([p], rho=0.0, eps=1.0)
>>> p.grad = opsnn.tensor(np.array([0.0, 3.0], np.float32))
>>> opt.step()  # delta = sqrt(0 + eps) / sqrt(g^2 + eps) * g
>>> p.numpy()
array([ 1.       , -1.9486833], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ..errors import ParamInvalidError
from ..kernels.cpu import optimizer as K
from .optimizer import Optimizer


class Adadelta(Optimizer):
    def __init__(
        self,
        params,
        lr: float = 1.0,
        rho: float = 0.9,
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        foreach=None,
        *,
        capturable: bool = False,
        maximize: bool = False,
        differentiable: bool = False,
    ):
        self._refuse(foreach=foreach, capturable=capturable, differentiable=differentiable)
        super().__init__(params, {"lr": lr, "rho": rho, "eps": eps, "weight_decay": weight_decay, "maximize": maximize})

    _state_keys = frozenset({"step", "square_avg", "acc_delta"})

    def _check_options(self, g: dict) -> None:
        self._check_nonnegative(g, ("lr", "rho", "eps", "weight_decay"))
        if g["rho"] > 1.0:
            raise ParamInvalidError(f"Adadelta: rho must be in [0, 1], got {g['rho']}")

    def _rows(self, items):
        hyper = np.zeros((len(items), 4), np.float64)
        flags = np.zeros((len(items), 1), np.int64)
        for t, (g, p) in enumerate(items):
            self._advance(p)
            hyper[t] = (g["lr"], g["rho"], g["eps"], g["weight_decay"])
            flags[t] = (bool(g["maximize"]),)
        return hyper, flags

    def step(self, closure=None):
        """One update of every parameter that has a gradient (one kernel launch per dtype; traced, one
        ``ApplyAdadelta`` node per dtype)."""
        return self._fused_fixed_step(
            closure, "ApplyAdadelta", K.adadelta_step, ("square_avg", "acc_delta"), self._rows
        )


__all__ = ["Adadelta"]
