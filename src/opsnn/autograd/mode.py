"""Grad mode: ``opsnn.no_grad()``, ``enable_grad()``, ``set_grad_enabled(flag)`` (per thread, like torch).

>>> import opsnn
>>> with opsnn.no_grad():
...     opsnn.autograd.is_grad_enabled()
False
"""

from __future__ import annotations

import functools
import threading

_tls = threading.local()


def is_grad_enabled() -> bool:
    return getattr(_tls, "enabled", True)


def _set(flag: bool) -> None:
    _tls.enabled = bool(flag)


class set_grad_enabled:
    """Context manager (and decorator) setting grad mode to ``mode`` inside it."""

    def __init__(self, mode: bool = True):
        self.mode = bool(mode)
        self.prev: list = []

    def __enter__(self):
        self.prev.append(is_grad_enabled())
        _set(self.mode)
        return self

    def __exit__(self, *exc):
        _set(self.prev.pop())

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with set_grad_enabled(self.mode):  # a fresh one per call: the decorated function may recurse
                return fn(*args, **kwargs)

        return wrapped


class no_grad(set_grad_enabled):
    """Ops inside record no tape (inference, optimizer updates): ``with opsnn.no_grad(): ...``
    or ``@opsnn.no_grad()``."""

    def __init__(self):
        super().__init__(False)


class enable_grad(set_grad_enabled):
    """Turn recording back on inside a ``no_grad`` block."""

    def __init__(self):
        super().__init__(True)


class inference_mode(set_grad_enabled):
    """torch's ``inference_mode``: no tape inside (``mode=False``: recording as outside it); opsnn's
    tensors carry no version counters, so it is ``no_grad`` by another name."""

    def __init__(self, mode: bool = True):
        super().__init__(not mode)


__all__ = ["enable_grad", "inference_mode", "is_grad_enabled", "no_grad", "set_grad_enabled"]
