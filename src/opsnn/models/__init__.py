"""Model builders (deterministic random weights; real weights from local files)."""
from .smallnet import SmallConvNet

__all__ = ["SmallConvNet"]
