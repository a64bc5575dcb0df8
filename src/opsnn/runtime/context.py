"""The process context: device, default stream and memory pool; ``init``/``finalize``.

>>> import opsnn
>>> with opsnn.init():            # init() twice is harmless; finalize() tears down
...     pass
"""

from __future__ import annotations

import threading
import weakref

from ..errors import NotInitializedError
from . import hooks
from .device import Device
from .memory import MemoryPool

_lock = threading.RLock()
_ctx: Context | None = None
_finalized = False


class Context:
    """What ``opsnn.init()`` creates: one device, its default stream and memory pool."""

    def __init__(self, device: Device, pool_cap: int | None = None):
        self.device = device
        self.pool = MemoryPool(cap=pool_cap)
        self._streams: weakref.WeakSet = weakref.WeakSet()
        self.default_stream = None  # set by init() once the context is current

    def _register_stream(self, stream) -> None:
        self._streams.add(stream)

    def streams(self) -> list:
        return list(self._streams)

    # context-manager form: ``with opsnn.init(): ...`` finalizes on exit
    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc) -> None:
        finalize()


def init(device: str | Device = "cpu", *, memory_cap: int | None = None) -> Context:
    """Create the process context (idempotent: a second call returns the live context)."""
    global _ctx, _finalized
    with _lock:
        if _ctx is not None:
            return _ctx
        ctx = Context(Device(device), pool_cap=memory_cap)
        _ctx = ctx
        _finalized = False
        from .stream import Stream

        ctx.default_stream = Stream(inline=True, name="default")
        return ctx


def finalize() -> None:
    """Finish all streams' work, stop their threads and release the pool's cache.

    Any op issued afterwards raises :class:`NotInitializedError` until ``init()`` again.
    """
    global _ctx, _finalized
    with _lock:
        ctx = _ctx
        if ctx is None:
            return
        for stream in ctx.streams():
            stream.close()
        from .stream import join_workers

        join_workers()  # dropped streams' workers too, so none outlives finalize()
        ctx.pool.empty_cache()
        _ctx = None
        _finalized = True
    hooks.emit("finalize", {"context": ctx})


def context() -> Context:
    """The live context; created on first use unless ``finalize()`` was called."""
    ctx = _ctx
    if ctx is not None:
        return ctx
    if _finalized:
        raise NotInitializedError("opsnn runtime was finalized; call opsnn.init() before using ops again")
    return init()


def is_initialized() -> bool:
    return _ctx is not None
