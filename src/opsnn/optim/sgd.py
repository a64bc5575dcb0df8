"""``opsnn.optim.SGD``: torch's SGD (momentum, dampening, Nesterov, weight decay, maximize) as one
fused multi-tensor kernel per step.

>>> import opsnn, numpy as np
>>> p = opsnn.nn.Parameter(np.array([1.0, 2.0], np.float32))
>>> opt = opsnn.optim.SGD([p], lr=0.1, momentum=0.9)
>>> p.grad = opsnn.tensor(np.array([1.0, 1.0], np.float32))
>>> opt.step()
>>> p.numpy()
array([0.9, 1.9], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ..errors import ParamInvalidError, real_number
from ..kernels.cpu import optimizer as K
from .optimizer import Optimizer


class SGD(Optimizer):
    def __init__(
        self,
        params,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        foreach=None,
        differentiable: bool = False,
        fused=None,
    ):
        if differentiable:
            raise ParamInvalidError("SGD: differentiable=True is not supported")
        self._refuse(foreach=foreach, fused=fused)
        super().__init__(
            params,
            {
                "lr": lr,
                "momentum": momentum,
                "dampening": dampening,
                "weight_decay": weight_decay,
                "nesterov": nesterov,
                "maximize": maximize,
            },
        )

    _state_keys = frozenset({"momentum_buffer"})

    def _check_options(self, g: dict) -> None:
        for k in ("lr", "momentum", "dampening", "weight_decay"):
            g[k] = real_number("SGD", k, g[k])
        if not float(g["lr"]) >= 0.0:
            raise ParamInvalidError(f"SGD: lr must be >= 0, got {g['lr']}")
        if not float(g["momentum"]) >= 0.0:
            raise ParamInvalidError(f"SGD: momentum must be >= 0, got {g['momentum']}")
        if not float(g["weight_decay"]) >= 0.0:
            raise ParamInvalidError(f"SGD: weight_decay must be >= 0, got {g['weight_decay']}")
        if g["nesterov"] and (float(g["momentum"]) <= 0 or float(g["dampening"]) != 0):
            raise ParamInvalidError(
                "SGD: nesterov=True needs momentum > 0 and dampening = 0, got momentum="
                f"{g['momentum']}, dampening={g['dampening']}"
            )

    def step(self, closure=None):
        """One update of every parameter that has a gradient (one kernel launch per dtype)."""
        from ..graph.tracing import active_tracer

        tracer = active_tracer()
        if tracer is not None:
            return self._traced_step(tracer, closure)
        loss = self._closure(closure)
        for items in self._with_grads_by_dtype():
            hyper = np.zeros((len(items), 4), np.float64)
            flags = np.zeros((len(items), 3), np.int64)
            bufs = []
            for t, (g, p, pa, _ga) in enumerate(items):
                hyper[t] = (g["lr"], g["momentum"], g["dampening"], g["weight_decay"])
                mom = float(g["momentum"]) != 0.0
                first = mom and "momentum_buffer" not in self.state.get(p, {})
                flags[t] = (bool(g["nesterov"]), bool(g["maximize"]), first)
                bufs.append(self._state_buffer(p, "momentum_buffer") if mom else pa)
            args = (
                K.typed_list([i[2] for i in items]),
                K.typed_list([i[3] for i in items]),
                K.typed_list(bufs),
                K.chunk_table([i[2].size for i in items]),
                hyper,
                flags,
            )
            self._launch("ApplySGD", K.sgd_step, args)
        return loss

    def _traced_step(self, tracer, closure):
        """The step as ``ApplySGD`` nodes of a traced training step (one per dtype and momentum use)."""
        groups = self._traced_items(tracer, closure, lambda g, p: float(g["momentum"]) != 0.0)
        for (_dt, mom), items in groups.items():

            def host(items=items, mom=mom):
                hyper = np.zeros((len(items), 4), np.float64)
                flags = np.zeros((len(items), 3), np.int64)
                for t, (g, p) in enumerate(items):
                    hyper[t] = (g["lr"], g["momentum"], g["dampening"], g["weight_decay"])
                    first = mom and "momentum_buffer" not in self.state.get(p, {})
                    flags[t] = (bool(g["nesterov"]), bool(g["maximize"]), first)
                return hyper, flags

            self._traced_apply(
                tracer, "ApplySGD", host, items, ["momentum_buffer"] if mom else [], {"momentum_buffers": int(mom)}
            )
        return None


__all__ = ["SGD"]
