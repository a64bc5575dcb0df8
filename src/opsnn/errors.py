"""Typed exceptions carrying ops-nn status codes.

Every error names the op, the argument, what was expected and what was given, so a
user reads one line and knows the fix::

    >>> raise ParamInvalidError("Conv: attribute 'strides' must be positive, got (0, 1)")
"""
from __future__ import annotations

# ops-nn status codes (aclnnStatus values).
PARAM_NULLPTR = 161001
PARAM_INVALID = 161002
RUNTIME_ERROR = 361001
INNER = 561000
INFERSHAPE = 561001
TILING = 561002
KERNEL_NOT_FOUND = 561003


class OpsnnError(Exception):
    """Base class of every opsnn error; ``code`` is the ops-nn status code."""

    code = INNER

    def __init__(self, message: str, *, op: str | None = None):
        self.op = op
        super().__init__(f"{op}: {message}" if op and not message.startswith(op + ":") else message)

    def __str__(self) -> str:
        return f"[{self.code}] {super().__str__()}"


class ParamNullptrError(OpsnnError, ValueError):
    """A required input was None/missing."""

    code = PARAM_NULLPTR


class ParamInvalidError(OpsnnError, ValueError):
    """An argument has the wrong dtype, rank, shape or value."""

    code = PARAM_INVALID


class DTypeError(ParamInvalidError, TypeError):
    """An input's dtype is not one the op supports."""


class OpsnnRuntimeError(OpsnnError, RuntimeError):
    """The runtime is in the wrong state (e.g. used after ``finalize()``)."""

    code = RUNTIME_ERROR


class NotInitializedError(OpsnnRuntimeError):
    """An op ran while the runtime context was finalized."""


class KernelError(OpsnnRuntimeError):
    """A kernel raised while running on a stream; surfaces at the next synchronize."""


class OutOfMemoryError(OpsnnRuntimeError, MemoryError):
    """The memory pool's cap would be exceeded."""


class MemoryCorruptionError(OpsnnRuntimeError):
    """A kernel wrote outside its buffers (found by the pool's debug guard bytes)."""


class InnerError(OpsnnError):
    """An internal invariant failed (a bug in opsnn)."""

    code = INNER


class InferShapeError(OpsnnError, ValueError):
    """Shape or dtype inference failed: the inputs' shapes are inconsistent."""

    code = INFERSHAPE


class TilingError(OpsnnError):
    """A kernel could not compute a plan/tiling for the given shapes."""

    code = TILING


class KernelNotFoundError(OpsnnError, LookupError):
    """No registered kernel (or op) applies to the request."""

    code = KERNEL_NOT_FOUND


__all__ = [n for n in list(globals()) if n.endswith("Error") or n.isupper()]
