"""Runtime layer: device, streams, events, memory pool and the hooks tools observe."""
from . import kernel_cache

kernel_cache.install()  # before any module with a numba kernel: its locator keys the cache by content
from . import hooks, memory
from .context import Context, context, finalize, init, is_initialized
from .device import Device
from .stream import Event, Stream, current_stream

__all__ = ["Context", "Device", "Event", "Stream", "context", "current_stream", "finalize", "hooks",
           "init", "is_initialized", "memory"]
