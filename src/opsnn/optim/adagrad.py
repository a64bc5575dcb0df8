"""``opsnn.optim.Adagrad``: torch's Adagrad (learning-rate decay, weight decay, initial accumulator
value, maximize) as one fused multi-tensor kernel per step (the ``ApplyAdagrad`` op).

>>> import opsnn, numpy as np
>>> p = opsnn.nn.Parameter(np.array([1.0, -1.0], np.float32))
>>> opt = opsnn.optim.Adagrad([p], lr=0.1, eps=0.0)
>>> p.grad = opsnn.tensor(np.array([0.5, -2.0], np.float32))
>>> opt.step()
>>> p.numpy()
array([ 0.9, -0.9], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ..errors import ParamInvalidError
from ..kernels.cpu import optimizer as K
from ..tensor import full
from .optimizer import Optimizer


class Adagrad(Optimizer):
    def __init__(
        self,
        params,
        lr: float = 1e-2,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
        foreach=None,
        *,
        maximize: bool = False,
        differentiable: bool = False,
        fused=None,
    ):
        if differentiable:
            raise ParamInvalidError("Adagrad: differentiable=True is not supported")
        self._refuse(foreach=foreach, fused=fused)
        super().__init__(
            params,
            {
                "lr": lr,
                "lr_decay": lr_decay,
                "weight_decay": weight_decay,
                "initial_accumulator_value": initial_accumulator_value,
                "eps": eps,
                "maximize": maximize,
            },
        )

    _state_keys = frozenset({"step", "sum"})

    def _check_options(self, g: dict) -> None:
        self._check_nonnegative(g, ("lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps"))

    def add_param_group(self, group: dict) -> None:
        """As torch, the state (step 0, ``sum`` filled with ``initial_accumulator_value``) exists from
        the start, so a state dict taken before the first step lists every parameter."""
        super().add_param_group(group)
        for p in self.param_groups[-1]["params"]:
            self._init_state(self.param_groups[-1], p)

    def _init_state(self, g: dict, p) -> dict:
        st = self.state.setdefault(p, {})
        if "sum" not in st:
            st["step"] = float(st.get("step", 0.0))
            st["sum"] = full(p.shape, float(g["initial_accumulator_value"]), p.dtype)
        return st

    def _rows(self, items):
        hyper = np.zeros((len(items), 5), np.float64)
        flags = np.zeros((len(items), 1), np.int64)
        for t, (g, p) in enumerate(items):
            st = self._init_state(g, p)
            st["step"] = step = st["step"] + 1.0
            hyper[t] = (g["lr"], g["lr_decay"], g["weight_decay"], g["eps"], step)
            flags[t] = (bool(g["maximize"]),)
        return hyper, flags

    def step(self, closure=None):
        """One update of every parameter that has a gradient (one kernel launch per dtype; traced, one
        ``ApplyAdagrad`` node per dtype)."""
        return self._fused_fixed_step(closure, "ApplyAdagrad", K.adagrad_step, ("sum",), self._rows)


__all__ = ["Adagrad"]
