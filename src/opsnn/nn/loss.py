"""Loss modules with torch's names and arguments (``nn.CrossEntropyLoss``, ``nn.NLLLoss``,
``nn.MSELoss``, ``nn.BCEWithLogitsLoss``, ``nn.L1Loss``, ``nn.SmoothL1Loss``, ``nn.HuberLoss``,
``nn.BCELoss``, ``nn.KLDivLoss``, ``nn.CTCLoss``, and the margin, ranking, Poisson, Gaussian and triplet losses of
:data:`TABLE`) over the functional losses, whose ops carry gradient rules.

>>> import opsnn, numpy as np
>>> loss = opsnn.nn.MSELoss()(opsnn.tensor(np.array([1.0, 3.0], np.float32)), np.array([0.0, 1.0], np.float32))
>>> float(loss.item())
2.5
"""

from __future__ import annotations

from . import functional as F
from .module import Module
from .stateless import Row, make_module


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


def _checked(name: str):
    """Check the reduction (torch's legacy size_average / reduce included) when the module is built."""

    def prepare(kw: dict) -> dict:
        F._legacy_reduction(name, kw.get("size_average"), kw.get("reduce"), kw["reduction"])
        return kw

    return prepare


_LEGACY = {"size_average": None, "reduce": None, "reduction": "mean"}

#: the losses that hold only hyper-parameters: (the function, torch's constructor parameters in torch's order)
_ROWS = {
    "CosineEmbeddingLoss": (F.cosine_embedding_loss, {"margin": 0.0, **_LEGACY}),
    "HingeEmbeddingLoss": (F.hinge_embedding_loss, {"margin": 1.0, **_LEGACY}),
    "MarginRankingLoss": (F.margin_ranking_loss, {"margin": 0.0, **_LEGACY}),
    "SoftMarginLoss": (F.soft_margin_loss, dict(_LEGACY)),
    "MultiLabelSoftMarginLoss": (F.multilabel_soft_margin_loss, {"weight": None, **_LEGACY}),
    "MultiMarginLoss": (F.multi_margin_loss, {"p": 1, "margin": 1.0, "weight": None, **_LEGACY}),
    "MultiLabelMarginLoss": (F.multilabel_margin_loss, dict(_LEGACY)),
    "PoissonNLLLoss": (
        F.poisson_nll_loss,
        {"log_input": True, "full": False, "size_average": None, "eps": 1e-8, "reduce": None, "reduction": "mean"},
    ),
    "GaussianNLLLoss": (F.gaussian_nll_loss, {"full": False, "eps": 1e-6, "reduction": "mean"}),
    "CTCLoss": (F.ctc_loss, {"blank": 0, "reduction": "mean", "zero_infinity": False}),
    "TripletMarginLoss": (F.triplet_margin_loss, {"margin": 1.0, "p": 2.0, "eps": 1e-6, "swap": False, **_LEGACY}),
    "TripletMarginWithDistanceLoss": (
        F.triplet_margin_with_distance_loss,
        {"distance_function": None, "margin": 1.0, "swap": False, "reduction": "mean"},
    ),
}
TABLE: dict[str, Row] = {k: Row(fn, params, prepare=_checked(k)) for k, (fn, params) in _ROWS.items()}

# one line per module, so tools (and readers) see each name
CosineEmbeddingLoss = make_module("CosineEmbeddingLoss", TABLE["CosineEmbeddingLoss"])
CTCLoss = make_module("CTCLoss", TABLE["CTCLoss"])
GaussianNLLLoss = make_module("GaussianNLLLoss", TABLE["GaussianNLLLoss"])
HingeEmbeddingLoss = make_module("HingeEmbeddingLoss", TABLE["HingeEmbeddingLoss"])
MarginRankingLoss = make_module("MarginRankingLoss", TABLE["MarginRankingLoss"])
MultiLabelMarginLoss = make_module("MultiLabelMarginLoss", TABLE["MultiLabelMarginLoss"])
MultiLabelSoftMarginLoss = make_module("MultiLabelSoftMarginLoss", TABLE["MultiLabelSoftMarginLoss"])
MultiMarginLoss = make_module("MultiMarginLoss", TABLE["MultiMarginLoss"])
PoissonNLLLoss = make_module("PoissonNLLLoss", TABLE["PoissonNLLLoss"])
SoftMarginLoss = make_module("SoftMarginLoss", TABLE["SoftMarginLoss"])
TripletMarginLoss = make_module("TripletMarginLoss", TABLE["TripletMarginLoss"])
TripletMarginWithDistanceLoss = make_module("TripletMarginWithDistanceLoss", TABLE["TripletMarginWithDistanceLoss"])


__all__ = [
    "CTCLoss",
    "BCELoss",
    "BCEWithLogitsLoss",
    "CosineEmbeddingLoss",
    "CrossEntropyLoss",
    "GaussianNLLLoss",
    "HingeEmbeddingLoss",
    "HuberLoss",
    "KLDivLoss",
    "L1Loss",
    "MSELoss",
    "MarginRankingLoss",
    "MultiLabelMarginLoss",
    "MultiLabelSoftMarginLoss",
    "MultiMarginLoss",
    "NLLLoss",
    "PoissonNLLLoss",
    "SmoothL1Loss",
    "SoftMarginLoss",
    "TripletMarginLoss",
    "TripletMarginWithDistanceLoss",
]
