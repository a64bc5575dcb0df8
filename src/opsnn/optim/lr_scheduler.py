"""Learning-rate schedulers with torch's names and semantics (``StepLR``, ``MultiStepLR``,
``ExponentialLR``, ``ConstantLR``, ``PolynomialLR``, ``CosineAnnealingLR``,
``CosineAnnealingWarmRestarts``, ``LinearLR`` for warmup, ``LambdaLR``, ``MultiplicativeLR``,
``OneCycleLR``, ``CyclicLR``, ``SequentialLR``); each sets ``group["lr"]`` of its optimizer's parameter groups on
every ``step()``.
``ReduceLROnPlateau`` lowers them when ``step(metric)`` stops improving.

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

import bisect
import math

import numpy as np

from ..errors import ParamInvalidError, real_number


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

    def group_lr(self, i: int, group: dict, base_lr: float, epoch: int) -> float:
        """Parameter group ``i``'s learning rate at ``epoch`` (schedulers that need the group or its
        index override this; the others give ``lr_at``)."""
        return self.lr_at(base_lr, epoch)

    def get_last_lr(self) -> list:
        return list(self._last_lr)

    def step(self) -> None:
        self.last_epoch += 1
        for i, (g, base) in enumerate(zip(self.optimizer.param_groups, self.base_lrs)):
            g["lr"] = self.group_lr(i, g, base, self.last_epoch)
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


def _lambdas(name: str, optimizer, lr_lambda) -> list:
    """One function per parameter group (one for all, or a list with one per group)."""
    n = len(optimizer.param_groups)
    fns = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * n
    if len(fns) != n or not all(callable(f) for f in fns):
        raise ParamInvalidError(f"{name}: lr_lambda must be a function or {n} functions (one per group), got {fns}")
    return fns


class LambdaLR(LRScheduler):
    """``lr = base_lr * lr_lambda(epoch)`` (one function, or one per parameter group)."""

    def __init__(self, optimizer, lr_lambda, last_epoch: int = -1):
        self._fns = _lambdas(type(self).__name__, optimizer, lr_lambda)
        super().__init__(optimizer, last_epoch)

    def group_lr(self, i, group, base_lr, epoch):
        return base_lr * self._fns[i](epoch)

    def state_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_fns")}


class MultiplicativeLR(LambdaLR):
    """``lr = previous lr * lr_lambda(epoch)`` from the second step on (one function, or one per group)."""

    def group_lr(self, i, group, base_lr, epoch):
        return group["lr"] * self._fns[i](epoch) if epoch > 0 else group["lr"]


class MultiStepLR(LRScheduler):
    """``lr = base_lr * gamma ** (number of milestones <= epoch)``."""

    def __init__(self, optimizer, milestones, gamma: float = 0.1, last_epoch: int = -1):
        ms = sorted(int(m) for m in milestones)
        if any(m < 0 for m in ms):
            raise ParamInvalidError(f"MultiStepLR: milestones must be ints >= 0, got {list(milestones)}")
        self.milestones, self.gamma = ms, float(gamma)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch):
        return base_lr * self.gamma ** bisect.bisect_right(self.milestones, epoch)


class ExponentialLR(LRScheduler):
    """``lr = base_lr * gamma ** epoch``."""

    def __init__(self, optimizer, gamma: float, last_epoch: int = -1):
        self.gamma = float(gamma)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch):
        return base_lr * self.gamma**epoch


class ConstantLR(LRScheduler):
    """``lr = base_lr * factor`` for the first ``total_iters`` steps, then ``base_lr``."""

    def __init__(self, optimizer, factor: float = 1.0 / 3, total_iters: int = 5, last_epoch: int = -1):
        if not 0.0 <= float(factor) <= 1.0:
            raise ParamInvalidError(f"ConstantLR: factor must be in [0, 1], got {factor}")
        self.factor, self.total_iters = float(factor), int(total_iters)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch):
        return base_lr * (self.factor if epoch < self.total_iters else 1.0)


class PolynomialLR(LRScheduler):
    """``lr = base_lr * (1 - min(epoch, total_iters) / total_iters) ** power``."""

    def __init__(self, optimizer, total_iters: int = 5, power: float = 1.0, last_epoch: int = -1):
        if int(total_iters) <= 0:
            raise ParamInvalidError(f"PolynomialLR: total_iters must be a positive int, got {total_iters}")
        self.total_iters, self.power = int(total_iters), float(power)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch):
        return base_lr * (1.0 - min(epoch, self.total_iters) / self.total_iters) ** self.power


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine annealing restarted every ``T_i`` steps, ``T_0`` first and ``T_mult`` times longer each
    restart: ``lr = eta_min + (base_lr - eta_min) (1 + cos(pi T_cur / T_i)) / 2``."""

    def __init__(self, optimizer, T_0: int, T_mult: int = 1, eta_min: float = 0.0, last_epoch: int = -1):
        if int(T_0) <= 0 or int(T_mult) < 1:
            raise ParamInvalidError(
                f"CosineAnnealingWarmRestarts: T_0 must be a positive int and T_mult an int >= 1, got {T_0}, {T_mult}"
            )
        self.T_0, self.T_mult, self.eta_min = int(T_0), int(T_mult), float(eta_min)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch):
        if self.T_mult == 1:
            t_cur, t_i = epoch % self.T_0, self.T_0
        else:
            n = int(math.log(epoch / self.T_0 * (self.T_mult - 1) + 1, self.T_mult)) if epoch >= self.T_0 else 0
            t_cur = epoch - self.T_0 * (self.T_mult**n - 1) // (self.T_mult - 1)
            t_i = self.T_0 * self.T_mult**n
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * t_cur / t_i)) / 2


class ReduceLROnPlateau:
    """torch's ReduceLROnPlateau: ``step(metric)`` after each evaluation; when the metric has not
    improved (``mode`` 'min' or 'max', by more than ``threshold``, relative or absolute) for more than
    ``patience`` evaluations, every group's lr is multiplied by ``factor`` (not below ``min_lr``, and
    only when the change exceeds ``eps``), then ``cooldown`` evaluations pass before counting again."""

    def __init__(
        self,
        optimizer,
        mode: str = "min",
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        threshold_mode: str = "rel",
        cooldown: int = 0,
        min_lr=0.0,
        eps: float = 1e-8,
    ):
        if mode not in ("min", "max") or threshold_mode not in ("rel", "abs"):
            raise ParamInvalidError(
                f"ReduceLROnPlateau: mode must be 'min' or 'max' and threshold_mode 'rel' or 'abs', "
                f"got {mode!r}, {threshold_mode!r}"
            )
        if not float(factor) < 1.0:
            raise ParamInvalidError(f"ReduceLROnPlateau: factor must be < 1, got {factor}")
        n = len(optimizer.param_groups)
        mins = list(min_lr) if isinstance(min_lr, (list, tuple)) else [min_lr] * n
        if len(mins) != n:
            raise ParamInvalidError(f"ReduceLROnPlateau: {len(mins)} min_lrs for {n} parameter groups")
        self.optimizer, self.mode, self.factor, self.patience = optimizer, mode, float(factor), int(patience)
        self.threshold, self.threshold_mode, self.cooldown = float(threshold), threshold_mode, int(cooldown)
        self.min_lrs, self.eps = [float(v) for v in mins], float(eps)
        self.best = math.inf if mode == "min" else -math.inf
        self.num_bad_epochs, self.cooldown_counter, self.last_epoch = 0, 0, 0
        self._last_lr = [g["lr"] for g in optimizer.param_groups]

    def _better(self, a: float, best: float) -> bool:
        if self.mode == "min":
            bound = best * (1.0 - self.threshold) if self.threshold_mode == "rel" else best - self.threshold
            return a < bound
        bound = best * (1.0 + self.threshold) if self.threshold_mode == "rel" else best + self.threshold
        return a > bound

    def step(self, metrics) -> None:
        current = float(metrics.item() if hasattr(metrics, "item") else metrics)
        self.last_epoch += 1
        if self._better(current, self.best):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            for g, low in zip(self.optimizer.param_groups, self.min_lrs):
                old = float(g["lr"])
                new = max(old * self.factor, low)
                if old - new > self.eps:
                    g["lr"] = new
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def get_last_lr(self) -> list:
        return list(self._last_lr)

    def state_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict: dict) -> None:
        self.__dict__.update(state_dict)


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
        for i, (g, base) in enumerate(zip(self.optimizer.param_groups, sched.base_lrs)):
            g["lr"] = sched.group_lr(i, g, base, epoch)
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


def _per_group(name: str, optimizer, what: str, value) -> list:
    n = len(optimizer.param_groups)
    vals = list(value) if isinstance(value, (list, tuple)) else [value] * n
    if len(vals) != n:
        raise ParamInvalidError(f"{name}: {len(vals)} values of {what} for {n} parameter groups")
    return [real_number(name, what, v) for v in vals]


def _positive_int(name: str, what: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ParamInvalidError(f"{name}: {what} must be a positive int, got {value!r}")
    return int(value)


def _set_momentum(group: dict, value: float, use_beta1: bool) -> None:
    if use_beta1:
        group["betas"] = (value, *group["betas"][1:])
    else:
        group["momentum"] = value


def _cycle_momentum(name: str, optimizer, base_momentum, max_momentum, last_epoch: int) -> bool:
    """Check that ``optimizer`` has a momentum to cycle (SGD's ``momentum`` or Adam's ``betas[0]``), and on a
    fresh start record each group's ``max_momentum`` / ``base_momentum`` and set it to the maximum; returns
    whether it is ``betas[0]``."""
    if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
        raise ParamInvalidError(
            f"{name}: cycle_momentum=True needs an optimizer with momentum or betas "
            f"({type(optimizer).__name__} has neither); pass cycle_momentum=False"
        )
    use_beta1 = "betas" in optimizer.defaults
    tops = _per_group(name, optimizer, "max_momentum", max_momentum)
    bases = _per_group(name, optimizer, "base_momentum", base_momentum)
    if last_epoch == -1:
        for g, top, base in zip(optimizer.param_groups, tops, bases):
            _set_momentum(g, top, use_beta1)
            g["max_momentum"], g["base_momentum"] = top, base
    return use_beta1


class CyclicLR(LRScheduler):
    """torch's cyclical learning rate: each group's lr goes from ``base_lr`` up to ``max_lr`` over
    ``step_size_up`` steps and back over ``step_size_down`` (default the same), the cycle's height scaled by
    ``mode`` ('triangular': constant, 'triangular2': halved every cycle, 'exp_range': ``gamma ** step``) or a
    ``scale_fn`` of the cycle or step count (``scale_mode``). With ``cycle_momentum`` the momentum (SGD's
    ``momentum``, Adam's ``betas[0]``) moves the other way, between ``max_momentum`` and ``base_momentum``.
    Called once per batch."""

    def __init__(
        self,
        optimizer,
        base_lr,
        max_lr,
        step_size_up: int = 2000,
        step_size_down: int | None = None,
        mode: str = "triangular",
        gamma: float = 1.0,
        scale_fn=None,
        scale_mode: str = "cycle",
        cycle_momentum: bool = True,
        base_momentum=0.8,
        max_momentum=0.9,
        last_epoch: int = -1,
    ):
        name = "CyclicLR"
        base_lrs = _per_group(name, optimizer, "base_lr", base_lr)
        if last_epoch == -1:
            for g, lr in zip(optimizer.param_groups, base_lrs):
                g["lr"] = lr
        self.max_lrs = _per_group(name, optimizer, "max_lr", max_lr)
        up = float(_positive_int(name, "step_size_up", step_size_up))
        down = up if step_size_down is None else float(_positive_int(name, "step_size_down", step_size_down))
        self.total_size = up + down
        self.step_ratio = up / self.total_size
        if scale_fn is None:
            if mode not in ("triangular", "triangular2", "exp_range"):
                raise ParamInvalidError(
                    f"{name}: mode must be 'triangular', 'triangular2' or 'exp_range' (or give scale_fn), got {mode!r}"
                )
            scale_mode = "iterations" if mode == "exp_range" else "cycle"
        elif not callable(scale_fn):
            raise ParamInvalidError(f"{name}: scale_fn must be callable, got {type(scale_fn).__name__}")
        if scale_mode not in ("cycle", "iterations"):
            raise ParamInvalidError(f"{name}: scale_mode must be 'cycle' or 'iterations', got {scale_mode!r}")
        self.mode, self.scale_mode = mode, scale_mode
        self.gamma = real_number(name, "gamma", gamma)
        self._scale_fn_custom = scale_fn
        self.cycle_momentum = bool(cycle_momentum)
        if self.cycle_momentum:
            self.use_beta1 = _cycle_momentum(name, optimizer, base_momentum, max_momentum, last_epoch)
        super().__init__(optimizer, last_epoch)
        self.base_lrs = base_lrs

    def scale_fn(self, x: float) -> float:
        """The cycle's height factor at cycle (or step) ``x``."""
        if self._scale_fn_custom is not None:
            return self._scale_fn_custom(x)
        if self.mode == "triangular":
            return 1.0
        if self.mode == "triangular2":
            return 1 / (2.0 ** (x - 1))
        return self.gamma**x

    def group_lr(self, i, group, base_lr, epoch):
        """The lr at batch ``epoch`` (and, with ``cycle_momentum``, the group's momentum set on the way)."""
        cycle = math.floor(1 + epoch / self.total_size)
        x = 1.0 + epoch / self.total_size - cycle
        factor = x / self.step_ratio if x <= self.step_ratio else (x - 1) / (self.step_ratio - 1)
        scale = self.scale_fn(cycle if self.scale_mode == "cycle" else epoch)
        if self.cycle_momentum:
            height = (group["max_momentum"] - group["base_momentum"]) * factor
            _set_momentum(group, group["max_momentum"] - height * scale, self.use_beta1)
        return base_lr + (self.max_lrs[i] - base_lr) * factor * scale


class OneCycleLR(LRScheduler):
    """torch's 1cycle policy: the lr rises from ``max_lr / div_factor`` to ``max_lr`` over the first
    ``pct_start`` of ``total_steps`` (or ``epochs * steps_per_epoch``), then anneals (``'cos'`` or
    ``'linear'``) to ``initial_lr / final_div_factor``; ``three_phase`` comes back to the initial lr
    before the final anneal. With ``cycle_momentum`` the momentum (SGD's ``momentum``, Adam's
    ``betas[0]``) moves the other way, between ``max_momentum`` and ``base_momentum``."""

    def __init__(
        self,
        optimizer,
        max_lr,
        total_steps: int | None = None,
        epochs: int | None = None,
        steps_per_epoch: int | None = None,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        cycle_momentum: bool = True,
        base_momentum=0.85,
        max_momentum=0.95,
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        three_phase: bool = False,
        last_epoch: int = -1,
    ):
        name = "OneCycleLR"
        if total_steps is not None:
            self.total_steps = _positive_int(name, "total_steps", total_steps)
        elif epochs is not None and steps_per_epoch is not None:
            self.total_steps = _positive_int(name, "epochs", epochs) * _positive_int(
                name, "steps_per_epoch", steps_per_epoch
            )
        else:
            raise ParamInvalidError(f"{name}: give total_steps, or epochs and steps_per_epoch")
        pct = real_number(name, "pct_start", pct_start)
        if not 0.0 <= pct <= 1.0:
            raise ParamInvalidError(f"{name}: pct_start must be in [0, 1], got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ParamInvalidError(f"{name}: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        self.anneal_strategy = anneal_strategy
        up = float(pct * self.total_steps) - 1
        if three_phase:
            self._phases = [
                (up, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                (float(2 * pct * self.total_steps) - 2, "max_lr", "initial_lr", "base_momentum", "max_momentum"),
                (self.total_steps - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum"),
            ]
        else:
            self._phases = [
                (up, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                (self.total_steps - 1, "max_lr", "min_lr", "base_momentum", "max_momentum"),
            ]
        max_lrs = _per_group(name, optimizer, "max_lr", max_lr)
        if last_epoch == -1:
            for g, top in zip(optimizer.param_groups, max_lrs):
                g["initial_lr"] = top / div_factor
                g["max_lr"] = top
                g["min_lr"] = g["initial_lr"] / final_div_factor
        self.cycle_momentum = bool(cycle_momentum)
        if self.cycle_momentum:
            self.use_beta1 = _cycle_momentum(name, optimizer, base_momentum, max_momentum, last_epoch)
        super().__init__(optimizer, last_epoch)

    def _set_momentum(self, group: dict, value: float) -> None:
        _set_momentum(group, value, self.use_beta1)

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def group_lr(self, i, group, base_lr, epoch):
        """The lr at ``epoch`` (and, with ``cycle_momentum``, the group's momentum set on the way)."""
        if epoch > self.total_steps:
            raise ParamInvalidError(
                f"OneCycleLR: step {epoch} is past total_steps={self.total_steps}; build the scheduler "
                "with the number of steps the training takes"
            )
        start, phase = 0.0, self._phases[-1]
        for ph in self._phases[:-1]:
            if epoch <= ph[0]:
                phase = ph
                break
            start = ph[0]
        end, lr0, lr1, m0, m1 = phase
        if end == start:
            raise ParamInvalidError(
                f"OneCycleLR: a phase of total_steps={self.total_steps} with this pct_start has no steps; "
                "raise total_steps or change pct_start"
            )
        pct = (epoch - start) / (end - start)
        if self.cycle_momentum:
            self._set_momentum(group, self._anneal(group[m0], group[m1], pct))
        return self._anneal(group[lr0], group[lr1], pct)


__all__ = [
    "ConstantLR",
    "CosineAnnealingLR",
    "CosineAnnealingWarmRestarts",
    "CyclicLR",
    "ExponentialLR",
    "LRScheduler",
    "LambdaLR",
    "LinearLR",
    "MultiStepLR",
    "MultiplicativeLR",
    "OneCycleLR",
    "PolynomialLR",
    "ReduceLROnPlateau",
    "SequentialLR",
    "StepLR",
]
