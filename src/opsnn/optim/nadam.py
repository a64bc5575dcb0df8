"""``opsnn.optim.NAdam``: torch's NAdam (momentum decay, L2 or decoupled weight decay, maximize) as one
fused multi-tensor kernel per step (the ``ApplyNAdam`` op); the host keeps ``mu_product``.

>>> import opsnn, numpy as np
>>> p = opsnn.nn.Parameter(np.array([1.0, -1.0], np.float32))
>>> opt = opsnn.optim.NAdam([p], lr=0.1)
>>> p.grad = opsnn.tensor(np.array([0.5, -2.0], np.float32))
>>> opt.step()
>>> np.round(p.numpy(), 3)
array([ 0.894, -0.894], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ..kernels.cpu import optimizer as K
from .optimizer import Optimizer


class NAdam(Optimizer):
    def __init__(
        self,
        params,
        lr: float = 2e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum_decay: float = 4e-3,
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
                "momentum_decay": momentum_decay,
                "decoupled_weight_decay": decoupled_weight_decay,
                "maximize": maximize,
            },
        )

    _state_keys = frozenset({"step", "mu_product", "exp_avg", "exp_avg_sq"})
    _scalar_state_keys = frozenset({"step", "mu_product"})

    def _check_options(self, g: dict) -> None:
        self._check_betas(g)
        self._check_nonnegative(g, ("lr", "eps", "weight_decay", "momentum_decay"))

    def _rows(self, items):
        hyper = np.zeros((len(items), 8), np.float64)
        flags = np.zeros((len(items), 2), np.int64)
        for t, (g, p) in enumerate(items):
            st, step = self._advance(p)
            lr, (b1, b2), psi = g["lr"], g["betas"], g["momentum_decay"]
            mu = b1 * (1.0 - 0.5 * 0.96 ** (step * psi))
            mu_next = b1 * (1.0 - 0.5 * 0.96 ** ((step + 1.0) * psi))
            st["mu_product"] = prod = float(st.get("mu_product", 1.0)) * mu
            coefs = (lr * (1.0 - mu) / (1.0 - prod), lr * mu_next / (1.0 - prod * mu_next))
            hyper[t] = (lr, b1, b2, g["eps"], g["weight_decay"], 1.0 - b2**step, *coefs)
            flags[t] = (bool(g["decoupled_weight_decay"]), bool(g["maximize"]))
        return hyper, flags

    def step(self, closure=None):
        """One update of every parameter that has a gradient (one kernel launch per dtype; traced, one
        ``ApplyNAdam`` node per dtype)."""
        return self._fused_fixed_step(closure, "ApplyNAdam", K.nadam_step, ("exp_avg", "exp_avg_sq"), self._rows)


__all__ = ["NAdam"]
