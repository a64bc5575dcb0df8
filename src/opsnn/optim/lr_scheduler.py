"""Learning-rate schedulers with torch's names and semantics (``StepLR``, ``CosineAnnealingLR``,
``LinearLR`` for warmup, ``LambdaLR``, ``SequentialLR``); each sets ``group["lr"]`` of its
optimizer's parameter groups, in closed form, on every ``step()``.

>>> import opsnn, numpy as np
>>> opt = opsnn.optim.SGD([opsnn.nn.Parameter(np.zeros(2, np.float32))], lr=0.1)
>>> sched = opsnn.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
>>> lrs = []
>>> for _ in range(5):
...     lrs.append(sched.get_last_lr()[0]); opt.step(); sched.step()
>>> lrs
[0.1, 0.1, 0.05, 0.05, 0.025]
"""

from __future__ import annotations

import math

from ..errors import ParamInvalidError


class LRScheduler:
    """Base class: ``lr_at(base_lr, epoch)`` gives a group's learning rate at ``epoch``."""

    def __init__(self, optimizer, last_epoch: int = -1):
        self.optimizer = optimizer
        if last_epoch == -1:
            for g in optimizer.param_groups:
                g.setdefault("initial_lr", g["lr"])
        else:
            for i, g in enumerate(optimizer.param_groups):
                if "initial_lr" not in g:
                    raise ParamInvalidError(
                        f"{type(self).__name__}: resuming at last_epoch={last_epoch} needs "
                        f"'initial_lr' in parameter group {i}"
                    )
        self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.step()

    def lr_at(self, base_lr: float, epoch: int) -> float:
        raise NotImplementedError

    def get_last_lr(self) -> list:
        return list(self._last_lr)

    def step(self) -> None:
        self.last_epoch += 1
        for g, base in zip(self.optimizer.param_groups, self.base_lrs):
            g["lr"] = self.lr_at(base, self.last_epoch)
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "optimizer" and not callable(v)}

    def load_state_dict(self, state_dict: dict) -> None:
        self.__dict__.update(state_dict)


class StepLR(LRScheduler):
    """``lr = base_lr * gamma ** (epoch // step_size)``."""

    def __init__(self, optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
        if int(step_size) <= 0:
            raise ParamInvalidError(f"StepLR: step_size must be a positive int, got {step_size}")
        self.step_size, self.gamma = int(step_size), float(gamma)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch):
        return base_lr * self.gamma ** (epoch // self.step_size)


class CosineAnnealingLR(LRScheduler):
    """``lr = eta_min + (base_lr - eta_min) (1 + cos(pi epoch / T_max)) / 2``."""

    def __init__(self, optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1):
        if int(T_max) <= 0:
            raise ParamInvalidError(f"CosineAnnealingLR: T_max must be a positive int, got {T_max}")
        self.T_max, self.eta_min = int(T_max), float(eta_min)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch):
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * epoch / self.T_max)) / 2


class LinearLR(LRScheduler):
    """Linear warmup (or decay): the factor goes from ``start_factor`` to ``end_factor`` over
    ``total_iters`` steps, then stays."""

    def __init__(
        self,
        optimizer,
        start_factor: float = 1.0 / 3,
        end_factor: float = 1.0,
        total_iters: int = 5,
        last_epoch: int = -1,
    ):
        if not 0.0 < float(start_factor) <= 1.0 or not 0.0 <= float(end_factor) <= 1.0:
            raise ParamInvalidError(
                f"LinearLR: start_factor must be in (0, 1] and end_factor in [0, 1], got {start_factor}, {end_factor}"
            )
        self.start_factor, self.end_factor, self.total_iters = float(start_factor), float(end_factor), int(total_iters)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch):
        frac = min(self.total_iters, epoch) / self.total_iters if self.total_iters else 1.0
        return base_lr * (self.start_factor + (self.end_factor - self.start_factor) * frac)


class LambdaLR(LRScheduler):
    """``lr = base_lr * lr_lambda(epoch)`` (one function, or one per parameter group)."""

    def __init__(self, optimizer, lr_lambda, last_epoch: int = -1):
        n = len(optimizer.param_groups)
        fns = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * n
        if len(fns) != n:
            raise ParamInvalidError(f"LambdaLR: {len(fns)} lr_lambdas for {n} parameter groups")
        self._fns = fns
        self._group = 0
        super().__init__(optimizer, last_epoch)

    def step(self) -> None:
        self.last_epoch += 1
        for g, base, fn in zip(self.optimizer.param_groups, self.base_lrs, self._fns):
            g["lr"] = base * fn(self.last_epoch)
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_fns")}


class SequentialLR(LRScheduler):
    """Run ``schedulers`` one after another, switching at the ``milestones`` (e.g. warmup then
    cosine); each scheduler counts its own steps from 0, as in torch."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch: int = -1):
        if len(milestones) != len(schedulers) - 1:
            raise ParamInvalidError(
                f"SequentialLR: {len(schedulers)} schedulers need {len(schedulers) - 1} "
                f"milestones, got {len(milestones)}"
            )
        self.optimizer = optimizer
        self._schedulers, self._milestones = list(schedulers), [int(m) for m in milestones]
        self.last_epoch = last_epoch + 1
        for g in optimizer.param_groups:  # undo the steps the schedulers took when they were built
            g["lr"] = g["initial_lr"]
        self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
        self._apply(self._schedulers[0], 0)

    def _apply(self, sched, epoch) -> None:
        for g, base in zip(self.optimizer.param_groups, sched.base_lrs):
            g["lr"] = sched.lr_at(base, epoch)
        sched.last_epoch = epoch
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def step(self) -> None:
        self.last_epoch += 1
        idx = sum(1 for m in self._milestones if self.last_epoch >= m)
        start = self._milestones[idx - 1] if idx else 0
        self._apply(self._schedulers[idx], self.last_epoch - start)

    def state_dict(self) -> dict:
        return {
            "last_epoch": self.last_epoch,
            "_milestones": self._milestones,
            "_last_lr": self._last_lr,
            "_schedulers": [s.state_dict() for s in self._schedulers],
        }

    def load_state_dict(self, state_dict: dict) -> None:
        for s, sd in zip(self._schedulers, state_dict["_schedulers"]):
            s.load_state_dict(sd)
        self.last_epoch, self._milestones = state_dict["last_epoch"], state_dict["_milestones"]
        self._last_lr = state_dict["_last_lr"]


__all__ = ["CosineAnnealingLR", "LRScheduler", "LambdaLR", "LinearLR", "SequentialLR", "StepLR"]
