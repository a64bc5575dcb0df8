"""``opsnn.optim.RAdam``: torch's RAdam (variance rectification once rho_t > 5, L2 or decoupled weight
decay, maximize) as one fused multi-tensor kernel per step (the ``ApplyRAdam`` op).

>>> import opsnn, numpy as np
>>> p = opsnn.nn.Parameter(np.array([1.0, -1.0], np.float32))
>>> opt = opsnn.optim.RAdam([p], lr=0.1)
>>> p.grad = opsnn.tensor(np.array([0.5, -2.0], np.float32))
>>> opt.step()  # not rectified yet: a plain momentum step of lr * bias-corrected exp_avg
>>> p.numpy()
array([ 0.95, -0.8 ], dtype=float32)
"""

from __future__ import annotations

import math

import numpy as np

from ..kernels.cpu import optimizer as K
from .optimizer import Optimizer


class RAdam(Optimizer):
    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        decoupled_weight_decay: bool = False,
        *,
        foreach=None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
    ):
        self._refuse(foreach=foreach, capturable=capturable, differentiable=differentiable)
        super().__init__(
            params,
            {
                "lr": lr,
                "betas": betas,
                "eps": eps,
                "weight_decay": weight_decay,
                "decoupled_weight_decay": decoupled_weight_decay,
                "maximize": maximize,
            },
        )

    _state_keys = frozenset({"step", "exp_avg", "exp_avg_sq"})

    def _check_options(self, g: dict) -> None:
        self._check_betas(g)
        self._check_nonnegative(g, ("lr", "eps", "weight_decay"))

    def _rows(self, items):
        hyper = np.zeros((len(items), 7), np.float64)
        flags = np.zeros((len(items), 3), np.int64)
        for t, (g, p) in enumerate(items):
            _st, step = self._advance(p)
            lr, (b1, b2) = g["lr"], g["betas"]
            bc1, bc2 = 1.0 - b1**step, 1.0 - b2**step
            rho_inf = 2.0 / (1.0 - b2) - 1.0
            rho_t = rho_inf - 2.0 * step * b2**step / bc2
            rectified = rho_t > 5.0  # torch's threshold: below it the variance estimate is not trusted
            rect = (
                math.sqrt((rho_t - 4.0) * (rho_t - 2.0) * rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t))
                if rectified
                else 1.0
            )
            hyper[t] = (lr, b1, b2, g["eps"], g["weight_decay"], lr * rect / bc1, math.sqrt(bc2))
            flags[t] = (bool(g["decoupled_weight_decay"]), bool(g["maximize"]), rectified)
        return hyper, flags

    def step(self, closure=None):
        """One update of every parameter that has a gradient (one kernel launch per dtype; traced, one
        ``ApplyRAdam`` node per dtype)."""
        return self._fused_fixed_step(closure, "ApplyRAdam", K.radam_step, ("exp_avg", "exp_avg_sq"), self._rows)


__all__ = ["RAdam"]
