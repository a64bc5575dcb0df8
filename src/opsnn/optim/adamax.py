"""``opsnn.optim.Adamax``: torch's Adamax (Adam with the infinity norm; weight decay, maximize) as one
fused multi-tensor kernel per step (the ``ApplyAdamax`` op).

>>> import opsnn, numpy as np
>>> p = opsnn.nn.Parameter(np.array([1.0, -1.0], np.float32))
>>> opt = opsnn.optim.Adamax([p], lr=0.1, eps=0.0)
>>> p.grad = opsnn.tensor(np.array([0.5, -2.0], np.float32))
>>> opt.step()
>>> p.numpy()
array([ 0.9, -0.9], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ..kernels.cpu import optimizer as K
from .optimizer import Optimizer


class Adamax(Optimizer):
    def __init__(
        self,
        params,
        lr: float = 2e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        foreach=None,
        *,
        maximize: bool = False,
        differentiable: bool = False,
        capturable: bool = False,
    ):
        self._refuse(foreach=foreach, capturable=capturable, differentiable=differentiable)
        super().__init__(
            params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "maximize": maximize}
        )

    _state_keys = frozenset({"step", "exp_avg", "exp_inf"})

    def _check_options(self, g: dict) -> None:
        self._check_betas(g)
        self._check_nonnegative(g, ("lr", "eps", "weight_decay"))

    def _rows(self, items):
        hyper = np.zeros((len(items), 6), np.float64)
        flags = np.zeros((len(items), 1), np.int64)
        for t, (g, p) in enumerate(items):
            _st, step = self._advance(p)
            lr, (b1, b2) = g["lr"], g["betas"]
            hyper[t] = (lr, b1, b2, g["eps"], g["weight_decay"], lr / (1.0 - b1**step))
            flags[t] = (bool(g["maximize"]),)
        return hyper, flags

    def step(self, closure=None):
        """One update of every parameter that has a gradient (one kernel launch per dtype; traced, one
        ``ApplyAdamax`` node per dtype)."""
        return self._fused_fixed_step(closure, "ApplyAdamax", K.adamax_step, ("exp_avg", "exp_inf"), self._rows)


__all__ = ["Adamax"]
