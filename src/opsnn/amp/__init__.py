"""``opsnn.amp``: mixed-precision training: ``autocast`` (per-op compute dtypes for eager
calls, float32 master weights) and the loss scaler ``GradScaler``."""

from .autocast import (
    FLOAT32_OPS,
    LOWER_PRECISION_OPS,
    MIXED_INPUT_OPS,
    autocast,
    autocast_policy,
    get_autocast_dtype,
    is_autocast_enabled,
)
from .grad_scaler import GradScaler, GradScalerStateError

__all__ = [
    "FLOAT32_OPS",
    "LOWER_PRECISION_OPS",
    "MIXED_INPUT_OPS",
    "GradScaler",
    "GradScalerStateError",
    "autocast",
    "autocast_policy",
    "get_autocast_dtype",
    "is_autocast_enabled",
]
