"""Runtime layer: device, streams, events, memory pool and the hooks tools observe."""

from . import cpu

cpu.apply_environment()  # the ISA cap, before anything below imports numba or loads a library
from . import kernel_cache  # noqa: E402

kernel_cache.install()  # before any module with a numba kernel: its locator keys the cache by content
from . import hooks, memory  # noqa: E402
from .context import Context, context, finalize, init, is_initialized  # noqa: E402
from .device import Device  # noqa: E402
from .stream import Event, Stream, current_stream  # noqa: E402

__all__ = [
    "Context",
    "Device",
    "cpu",
    "Event",
    "Stream",
    "context",
    "current_stream",
    "finalize",
    "hooks",
    "init",
    "is_initialized",
    "memory",
]
