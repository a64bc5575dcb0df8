"""``opsnn.optim.RMSprop``: torch's RMSprop (weight decay, momentum, centered, maximize) as one fused
multi-tensor kernel per step (the ``ApplyRMSprop`` op).

>>> import opsnn, numpy as np
>>> p = opsnn.nn.Parameter(np.array([1.0, -1.0], np.float32))
>>> opt = opsnn.optim.RMSprop([p], lr=0.01, alpha=0.0, eps=0.0)
>>> p.grad = opsnn.tensor(np.array([0.5, -2.0], np.float32))
>>> opt.step()
>>> p.numpy()
array([ 0.99, -0.99], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ..errors import ParamInvalidError
from ..kernels.cpu import optimizer as K
from .optimizer import Optimizer


class RMSprop(Optimizer):
    def __init__(
        self,
        params,
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
        capturable: bool = False,
        foreach=None,
        maximize: bool = False,
        differentiable: bool = False,
    ):
        if differentiable or capturable:
            raise ParamInvalidError("RMSprop: differentiable/capturable are not supported")
        self._refuse(foreach=foreach)
        super().__init__(
            params,
            {
                "lr": lr,
                "alpha": alpha,
                "eps": eps,
                "weight_decay": weight_decay,
                "momentum": momentum,
                "centered": centered,
                "maximize": maximize,
            },
        )

    _state_keys = frozenset({"step", "square_avg", "momentum_buffer", "grad_avg"})
    _slots = ("square_avg", "momentum_buffer", "grad_avg")

    def _check_options(self, g: dict) -> None:
        self._check_nonnegative(g, ("lr", "alpha", "eps", "weight_decay", "momentum"))

    @staticmethod
    def _uses(g, p) -> tuple:
        return True, float(g["momentum"]) > 0.0, bool(g["centered"])

    def _rows(self, items):
        hyper = np.zeros((len(items), 5), np.float64)
        flags = np.zeros((len(items), 3), np.int64)
        for t, (g, p) in enumerate(items):
            st = self.state.setdefault(p, {})
            st["step"] = float(st.get("step", 0.0)) + 1.0
            hyper[t] = (g["lr"], g["alpha"], g["eps"], g["weight_decay"], g["momentum"])
            _sq, mom, centered = self._uses(g, p)
            flags[t] = (centered, bool(g["maximize"]), mom)
        return hyper, flags

    def step(self, closure=None):
        """One update of every parameter that has a gradient (one kernel launch per dtype; traced, one
        ``ApplyRMSprop`` node per dtype and momentum/centered use)."""
        return self._fused_step(
            closure,
            "ApplyRMSprop",
            K.rmsprop_step,
            self._slots,
            self._uses,
            self._rows,
            lambda used: {"momentum_buffers": int(used[1]), "centered": int(used[2])},
        )


__all__ = ["RMSprop"]
