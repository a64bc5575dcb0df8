"""Loss modules with torch's names and arguments (``nn.CrossEntropyLoss``, ``nn.NLLLoss``,
``nn.MSELoss``, ``nn.BCEWithLogitsLoss``, ``nn.L1Loss``, ``nn.SmoothL1Loss``, ``nn.HuberLoss``,
``nn.BCELoss``, ``nn.KLDivLoss``) over the functional losses, whose ops carry gradient rules.

>>> import opsnn, numpy as np
>>> loss = opsnn.nn.MSELoss()(opsnn.tensor(np.array([1.0, 3.0], np.float32)), np.array([0.0, 1.0], np.float32))
>>> float(loss.item())
2.5
"""

from __future__ import annotations

from . import functional as F
from .module import Module


class CrossEntropyLoss(Module):
    def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0):
        super().__init__()
        F._check_reduction("CrossEntropyLoss", reduction)
        self.weight, self.ignore_index = weight, int(ignore_index)
        self.reduction, self.label_smoothing = reduction, float(label_smoothing)

    def forward(self, input, target):
        return F.cross_entropy(input, target, self.weight, self.ignore_index, self.reduction, self.label_smoothing)


class NLLLoss(Module):
    def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean"):
        super().__init__()
        F._check_reduction("NLLLoss", reduction)
        self.weight, self.ignore_index, self.reduction = weight, int(ignore_index), reduction

    def forward(self, input, target):
        return F.nll_loss(input, target, self.weight, self.ignore_index, self.reduction)


class MSELoss(Module):
    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = F._check_reduction("MSELoss", reduction)

    def forward(self, input, target):
        return F.mse_loss(input, target, self.reduction)


class BCEWithLogitsLoss(Module):
    def __init__(self, weight=None, reduction: str = "mean", pos_weight=None):
        super().__init__()
        self.reduction = F._check_reduction("BCEWithLogitsLoss", reduction)
        self.weight, self.pos_weight = weight, pos_weight

    def forward(self, input, target):
        return F.binary_cross_entropy_with_logits(input, target, self.weight, self.reduction, self.pos_weight)


class L1Loss(Module):
    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = F._check_reduction("L1Loss", reduction)

    def forward(self, input, target):
        return F.l1_loss(input, target, self.reduction)


class SmoothL1Loss(Module):
    def __init__(self, reduction: str = "mean", beta: float = 1.0):
        super().__init__()
        self.reduction, self.beta = F._check_reduction("SmoothL1Loss", reduction), beta

    def forward(self, input, target):
        return F.smooth_l1_loss(input, target, self.reduction, self.beta)


class HuberLoss(Module):
    def __init__(self, reduction: str = "mean", delta: float = 1.0):
        super().__init__()
        self.reduction, self.delta = F._check_reduction("HuberLoss", reduction), delta

    def forward(self, input, target):
        return F.huber_loss(input, target, self.reduction, self.delta)


class BCELoss(Module):
    def __init__(self, weight=None, reduction: str = "mean"):
        super().__init__()
        self.weight, self.reduction = weight, F._check_reduction("BCELoss", reduction)

    def forward(self, input, target):
        return F.binary_cross_entropy(input, target, self.weight, self.reduction)


class KLDivLoss(Module):
    def __init__(self, reduction: str = "mean", log_target: bool = False):
        super().__init__()
        self.reduction, self.log_target = reduction, bool(log_target)

    def forward(self, input, target):
        return F.kl_div(input, target, self.reduction, self.log_target)


__all__ = [
    "BCELoss",
    "BCEWithLogitsLoss",
    "CrossEntropyLoss",
    "HuberLoss",
    "KLDivLoss",
    "L1Loss",
    "MSELoss",
    "NLLLoss",
    "SmoothL1Loss",
]
