"""``opsnn.optim.Adam`` and ``AdamW``: torch's Adam (L2 weight decay) and AdamW (decoupled weight
decay), both with amsgrad and maximize, as one fused multi-tensor kernel per step.

>>> import opsnn, numpy as np
>>> p = opsnn.nn.Parameter(np.array([1.0, -1.0], np.float32))
>>> opt = opsnn.optim.AdamW([p], lr=0.1, weight_decay=0.0)
>>> p.grad = opsnn.tensor(np.array([0.5, -2.0], np.float32))
>>> opt.step()
>>> np.round(p.numpy(), 4)
array([ 0.9, -0.9], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ..errors import ParamInvalidError
from ..kernels.cpu import optimizer as K
from .optimizer import Optimizer


class Adam(Optimizer):
    _decoupled = False

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        foreach=None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused=None,
        decoupled_weight_decay: bool = False,
    ):
        if differentiable or capturable:
            raise ParamInvalidError(f"{type(self).__name__}: differentiable/capturable are not supported")
        self._refuse(foreach=foreach, fused=fused)
        self._decoupled = self._decoupled or bool(decoupled_weight_decay)
        super().__init__(
            params,
            {
                "lr": lr,
                "betas": betas,
                "eps": eps,
                "weight_decay": weight_decay,
                "amsgrad": amsgrad,
                "maximize": maximize,
            },
        )

    _state_keys = frozenset({"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"})

    def _check_options(self, g: dict) -> None:
        self._check_betas(g)
        self._check_nonnegative(g, ("lr", "eps", "weight_decay"))

    def step(self, closure=None):
        """One update of every parameter that has a gradient (one kernel launch per dtype)."""
        from ..graph.tracing import active_tracer

        tracer = active_tracer()
        if tracer is not None:
            return self._traced_step(tracer, closure)
        loss = self._closure(closure)
        for items in self._with_grads_by_dtype():
            hyper = np.zeros((len(items), 7), np.float64)
            flags = np.zeros((len(items), 3), np.int64)
            ms, vs, vmaxs = [], [], []
            for t, (g, p, _pa, _ga) in enumerate(items):
                st = self.state.setdefault(p, {})
                st["step"] = step = float(st.get("step", 0.0)) + 1.0
                b1, b2 = g["betas"]
                hyper[t] = (g["lr"], b1, b2, g["eps"], g["weight_decay"], 1.0 - b1**step, 1.0 - b2**step)
                flags[t] = (bool(g["amsgrad"]), self._decoupled, bool(g["maximize"]))
                ms.append(self._state_buffer(p, "exp_avg"))
                vs.append(self._state_buffer(p, "exp_avg_sq"))
                vmaxs.append(self._state_buffer(p, "max_exp_avg_sq") if g["amsgrad"] else vs[-1])
            args = (
                K.typed_list([i[2] for i in items]),
                K.typed_list([i[3] for i in items]),
                K.typed_list(ms),
                K.typed_list(vs),
                K.typed_list(vmaxs),
                K.chunk_table([i[2].size for i in items]),
                hyper,
                flags,
            )
            self._launch("ApplyAdamW", K.adam_step, args)
        return loss

    def _traced_step(self, tracer, closure):
        """The step as ``ApplyAdamW`` nodes of a traced training step (one per dtype and amsgrad use);
        the step counts and bias corrections are computed on the host before every call."""
        groups = self._traced_items(tracer, closure, lambda g, p: bool(g["amsgrad"]))
        for (_dt, ams), items in groups.items():

            def host(items=items):
                hyper = np.zeros((len(items), 7), np.float64)
                flags = np.zeros((len(items), 3), np.int64)
                for t, (g, p) in enumerate(items):
                    st = self.state.setdefault(p, {})
                    st["step"] = step = float(st.get("step", 0.0)) + 1.0
                    b1, b2 = g["betas"]
                    hyper[t] = (g["lr"], b1, b2, g["eps"], g["weight_decay"], 1.0 - b1**step, 1.0 - b2**step)
                    flags[t] = (bool(g["amsgrad"]), self._decoupled, bool(g["maximize"]))
                return hyper, flags

            keys = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if ams else [])
            self._traced_apply(tracer, "ApplyAdamW", host, items, keys, {"amsgrad": int(ams)})
        return None


class AdamW(Adam):
    """Adam with decoupled weight decay (default ``weight_decay=1e-2``, as torch)."""

    _decoupled = True

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach=None,
        capturable: bool = False,
        differentiable: bool = False,
        fused=None,
    ):
        super().__init__(
            params,
            lr,
            betas,
            eps,
            weight_decay,
            amsgrad,
            foreach=foreach,
            maximize=maximize,
            capturable=capturable,
            differentiable=differentiable,
            fused=fused,
        )


__all__ = ["Adam", "AdamW"]
