"""``opsnn.amp``: mixed-precision training helpers; for now the loss scaler ``GradScaler``
(autocast is not there yet)."""

from .grad_scaler import GradScaler, GradScalerStateError

__all__ = ["GradScaler", "GradScalerStateError"]
