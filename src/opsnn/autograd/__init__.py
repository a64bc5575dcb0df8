"""``opsnn.autograd``: reverse-mode gradients over the op registry (the training layer).

Eager op calls whose inputs require grad record a tape; ``loss.backward()`` runs each op's
gradient rule (``opsnn.ops.gradients``) in reverse through the same executor::

    >>> import opsnn, numpy as np
    >>> w = opsnn.tensor(np.array([[1.0, 2.0]], np.float32)).requires_grad_()
    >>> x = opsnn.tensor(np.array([[3.0], [4.0]], np.float32))
    >>> loss = opsnn.ops.sum(opsnn.ops.matmul(w, x))
    >>> loss.backward()
    >>> w.grad.numpy()
    array([[3., 4.]], dtype=float32)
    >>> opsnn.autograd.grad(opsnn.ops.sum(opsnn.ops.matmul(w, x)), [w])[0].numpy()
    array([[3., 4.]], dtype=float32)
"""

from .engine import backward, grad, queue_callback
from .errors import (
    GradientShapeError,
    GraphFreedError,
    InplaceModifiedError,
    NoGradFnError,
    NoGradientError,
    NonScalarBackwardError,
)
from .graph import install as _install
from .mode import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled

_install()

__all__ = [
    "InplaceModifiedError",
    "GradientShapeError",
    "GraphFreedError",
    "NoGradFnError",
    "NoGradientError",
    "NonScalarBackwardError",
    "backward",
    "enable_grad",
    "grad",
    "is_grad_enabled",
    "no_grad",
    "inference_mode",
    "queue_callback",
    "set_grad_enabled",
]
