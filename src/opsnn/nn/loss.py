"""Loss modules with torch's names and arguments (``nn.CrossEntropyLoss``, ``nn.NLLLoss``,
``nn.MSELoss``, ``nn.BCEWithLogitsLoss``) over the functional losses, whose ops carry gradient rules.

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


__all__ = ["BCEWithLogitsLoss", "CrossEntropyLoss", "MSELoss", "NLLLoss"]
