"""``GradScaler``: dynamic loss scaling with torch's semantics (scale, ``unscale_``, ``step``,
``update``; ``growth_interval``, ``growth_factor``, ``backoff_factor``). A step whose gradients
hold inf or NaN is skipped, leaving the parameters untouched, and the scale is lowered.

>>> import opsnn, numpy as np
>>> p = opsnn.nn.Parameter(np.ones(2, np.float32))
>>> opt = opsnn.optim.SGD([p], lr=0.1)
>>> scaler = opsnn.amp.GradScaler(init_scale=1024.0)
>>> scaler.scale(opsnn.ops.sum(p * p)).backward()
>>> p.grad.numpy()
array([2048., 2048.], dtype=float32)
>>> scaler.step(opt); scaler.update()
>>> p.numpy(), scaler.get_scale()
(array([0.8, 0.8], dtype=float32), 1024.0)
"""

from __future__ import annotations

import numbers

import numpy as np

from .. import ops
from ..errors import OpsnnRuntimeError, ParamInvalidError, real_number
from ..runtime.stream import current_stream
from ..tensor import Tensor, as_tensor

_READY, _UNSCALED, _STEPPED = range(3)


class GradScalerStateError(OpsnnRuntimeError):
    """``unscale_`` twice before ``update``, or ``step`` twice, on one optimizer."""


class GradScaler:
    def __init__(
        self,
        device: str = "cpu",
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ):
        init_scale = real_number("GradScaler", "init_scale", init_scale)
        if not 0.0 < init_scale < float("inf"):
            raise ParamInvalidError(f"GradScaler: init_scale must be positive and finite, got {init_scale}")
        if not real_number("GradScaler", "growth_factor", growth_factor) > 1.0:
            raise ParamInvalidError(f"GradScaler: growth_factor must be > 1, got {growth_factor}")
        if not 0.0 < real_number("GradScaler", "backoff_factor", backoff_factor) < 1.0:
            raise ParamInvalidError(f"GradScaler: backoff_factor must be in (0, 1), got {backoff_factor}")
        if (
            isinstance(growth_interval, bool)
            or not isinstance(growth_interval, numbers.Integral)
            or growth_interval <= 0
        ):
            raise ParamInvalidError(f"GradScaler: growth_interval must be a positive int, got {growth_interval}")
        self._enabled = bool(enabled)
        self._scale = float(init_scale)
        self._growth_factor, self._backoff_factor = float(growth_factor), float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._growth_tracker = 0
        self._per_optimizer: dict = {}

    def is_enabled(self) -> bool:
        return self._enabled

    def get_scale(self) -> float:
        return self._scale if self._enabled else 1.0

    def scale(self, outputs):
        """``outputs`` (a tensor, or a list/tuple of them) times the current scale."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        t = as_tensor(outputs)
        return ops.mul(t, as_tensor(np.asarray(self._scale, t.dtype)))

    def _state(self, optimizer) -> dict:
        return self._per_optimizer.setdefault(id(optimizer), {"stage": _READY, "found_inf": False})

    def unscale_(self, optimizer) -> None:
        """Divide the optimizer's gradients by the scale in place (call before clipping) and note
        whether any of them is inf or NaN."""
        if not self._enabled:
            return
        st = self._state(optimizer)
        if st["stage"] == _UNSCALED:
            raise GradScalerStateError("GradScaler.unscale_: already called on this optimizer since the last update()")
        if st["stage"] == _STEPPED:
            raise GradScalerStateError("GradScaler.unscale_: called after step(); call update() first")
        current_stream().synchronize()
        inv = 1.0 / self._scale
        found = False
        for g in optimizer.param_groups:
            for p in g["params"]:
                gr = p.grad
                if gr is None:
                    continue
                a = gr.numpy()
                with np.errstate(over="ignore", invalid="ignore"):
                    a *= np.asarray(inv, a.dtype)
                found = found or not bool(np.isfinite(a).all())
        st["stage"], st["found_inf"] = _UNSCALED, found

    def step(self, optimizer, *args, **kwargs):
        """``optimizer.step()`` unless the (unscaled) gradients hold inf/NaN; returns its result or None."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        st = self._state(optimizer)
        if st["stage"] == _STEPPED:
            raise GradScalerStateError("GradScaler.step: already called on this optimizer since the last update()")
        if st["stage"] == _READY:
            self.unscale_(optimizer)
        res = None if st["found_inf"] else optimizer.step(*args, **kwargs)
        st["stage"] = _STEPPED
        return res

    def update(self, new_scale=None) -> None:
        """Lower the scale after a skipped step, raise it after ``growth_interval`` clean ones."""
        if not self._enabled:
            return
        if new_scale is not None:
            self._scale = float(new_scale.item() if isinstance(new_scale, Tensor) else new_scale)
        else:
            found = any(st["found_inf"] for st in self._per_optimizer.values())
            if found:
                self._scale *= self._backoff_factor
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
                if self._growth_tracker == self._growth_interval:
                    self._scale *= self._growth_factor
                    self._growth_tracker = 0
        self._per_optimizer = {}

    def state_dict(self) -> dict:
        return (
            {
                "scale": self._scale,
                "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval,
                "_growth_tracker": self._growth_tracker,
            }
            if self._enabled
            else {}
        )

    def load_state_dict(self, state_dict: dict) -> None:
        if not self._enabled:
            return
        missing = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"} - set(state_dict)
        if missing:
            raise ParamInvalidError(f"GradScaler.load_state_dict: missing {sorted(missing)}")
        self._scale = float(state_dict["scale"])
        self._growth_factor, self._backoff_factor = (
            float(state_dict["growth_factor"]),
            float(state_dict["backoff_factor"]),
        )
        self._growth_interval, self._growth_tracker = (
            int(state_dict["growth_interval"]),
            int(state_dict["_growth_tracker"]),
        )


__all__ = ["GradScaler", "GradScalerStateError"]
