"""The memory pool: 64-byte aligned blocks in size classes, reused after free.

Also the ``opsnn.memory`` module users see::

    >>> import opsnn
    >>> opsnn.memory.summary()["current_bytes"]  # doctest: +SKIP
    0
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from contextlib import contextmanager

import numpy as np

from ..errors import MemoryCorruptionError, OutOfMemoryError, ParamInvalidError
from . import hooks

ALIGNMENT = 64
_MIN_CLASS = 512


def size_class(nbytes: int) -> int:
    """Round a request up to its size class: 4 classes per power of two (<= 25% waste)."""
    if nbytes <= _MIN_CLASS:
        return _MIN_CLASS
    step = 1 << max(nbytes.bit_length() - 3, 0)
    return (nbytes + step - 1) // step * step


GUARD_PATTERN = 0xA5

_malloc_trim = None


def trim_heap() -> bool:
    """Hand the C heap's free pages back to the OS (glibc's ``malloc_trim``): blocks under glibc's
    mmap threshold (up to 32 MiB once large blocks were freed) come from the heap, and freeing
    them leaves the pages resident. False where the C library has no ``malloc_trim``."""
    global _malloc_trim
    if _malloc_trim is None:
        import ctypes

        try:
            fn = ctypes.CDLL(None).malloc_trim
            fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
        except (OSError, AttributeError):
            fn = False
        _malloc_trim = fn
    if not _malloc_trim:
        return False
    _malloc_trim(0)
    return True


class Block:
    """One aligned allocation; ``array`` is its uint8 view (exactly ``size`` bytes).

    With ``guard > 0`` (debug mode) the block is framed by ``guard`` bytes on each side,
    filled with a pattern that :meth:`MemoryPool.check_guards` verifies after kernels.
    """

    __slots__ = (
        "size",
        "requested",
        "array",
        "raw",
        "live",
        "tag",
        "ptr",
        "interface",
        "guard",
        "front",
        "back",
        "stack",
    )

    def __init__(self, size: int, guard: int = 0):
        raw = np.empty(size + 2 * guard + ALIGNMENT, dtype=np.uint8)
        shift = (-raw.ctypes.data) % ALIGNMENT
        self.raw = raw
        self.guard = guard
        self.front = raw[shift : shift + guard]
        self.array = raw[shift + guard : shift + guard + size]
        self.back = raw[shift + guard + size : shift + 2 * guard + size]
        self.stack = None
        self.size = size
        self.ptr = self.array.ctypes.data
        # numpy's array-interface dict for a uint8 view of the whole block (see tensor.Storage)
        self.interface = {"shape": (size,), "typestr": "|u1", "data": (self.ptr, False), "version": 3}
        self.requested = 0
        self.live = False
        self.tag = None


class MemoryPool:
    """A caching allocator for one device (cf. PyTorch's caching allocator, CANN's pool).

    ``allocate(n)`` returns a :class:`Block` of at least ``n`` bytes, reusing a cached
    block of the same size class when one is free; ``free(block)`` caches it again.
    ``cap`` (bytes, ``None`` = unlimited) bounds the bytes the pool holds.

    Re-entrancy: any allocation inside the pool's critical sections (numpy's, building a
    block) may start a garbage collection whose finalizers (``Storage.__del__``) free blocks
    on the same thread. The lock is re-entrant and such a nested :meth:`free` is queued and
    carried out when the outer section ends, so it neither deadlocks nor changes the pool's
    tables halfway through an update.
    """

    def __init__(self, cap: int | None = None):
        self._lock = threading.RLock()
        self._busy = False  # a critical section is running (on the thread holding the lock)
        self._deferred: list[Block] = []
        self._draining = threading.local()  # .on: this thread is in _drain's loop
        self._free: dict[int, list[Block]] = defaultdict(list)
        self.cap = cap
        self.reset_stats()
        self._reserved = 0
        self._current = 0
        self._live: dict[int, Block] = {}
        self._by_tag: dict = {}
        self.guard_bytes = 0

    @contextmanager
    def _section(self):
        """Hold the lock for one update of the pool's tables; yields False when this thread is
        already inside one (a finalizer run by the garbage collector there). Frees queued by such
        finalizers are carried out (and reported to the hooks) when the outermost section ends."""
        with self._lock:
            outer = not self._busy
            self._busy = True
            try:
                yield outer
            finally:
                if outer:
                    self._busy = False
        if outer and self._deferred:
            self._drain()

    def _drain(self) -> None:
        # one loop per thread, not one nested call per queued block: each free below ends by
        # draining again, and a collection can queue thousands of blocks (recursion limit)
        if getattr(self._draining, "on", False):
            return
        self._draining.on = True
        try:
            while self._deferred:
                try:
                    block = self._deferred.pop()
                except IndexError:  # another thread drained it
                    return
                self.free(block)
        finally:
            self._draining.on = False

    def set_debug_guards(self, nbytes: int = 64) -> None:
        """Frame every new block with ``nbytes`` guard bytes (0 turns it off); cached blocks
        are dropped so that every later allocation is guarded."""
        if nbytes < 0 or nbytes % ALIGNMENT:
            raise ParamInvalidError(
                f"memory.set_debug_guards: nbytes must be a multiple of {ALIGNMENT} >= 0, got {nbytes}"
            )
        self.guard_bytes = nbytes
        self.empty_cache()

    def check_guards(self, who: str) -> None:
        """Raise :class:`MemoryCorruptionError` naming ``who`` if any live block's guard
        bytes (or the slack past its requested size) were overwritten."""
        with self._section():
            blocks = [b for b in self._live.values() if b.guard]
        for b in blocks:
            tail = b.array[b.requested :]
            if (b.front != GUARD_PATTERN).any() or (b.back != GUARD_PATTERN).any() or (tail != GUARD_PATTERN).any():
                where = "before the start" if (b.front != GUARD_PATTERN).any() else "past the end"
                raise MemoryCorruptionError(
                    f"{who}: wrote out of bounds ({where}) of a {b.requested}-byte buffer allocated by "
                    f"{b.tag or 'the user'}"
                )

    def reset_stats(self) -> None:
        self._peak = getattr(self, "_current", 0)
        for t in getattr(self, "_by_tag", {}).values():
            t[1] = t[0]
        self._n_alloc = 0
        self._n_free = 0
        self._n_reuse = 0

    def set_cap(self, cap: int | None) -> None:
        if cap is not None and (not isinstance(cap, int) or cap < 0):
            raise ParamInvalidError(f"memory.set_cap: cap must be a non-negative int or None, got {cap!r}")
        self.cap = cap

    def allocate(self, nbytes: int, tag: str | None = None) -> Block:
        # the eager path allocates every output here: size_class inlined, one pass of bookkeeping
        if nbytes <= _MIN_CLASS:
            if nbytes < 0:
                raise ParamInvalidError(f"memory.allocate: size must be >= 0, got {nbytes}")
            size = _MIN_CLASS
        else:
            step = 1 << (nbytes.bit_length() - 3)
            size = -(-nbytes // step) * step
        # the lock by hand (what _section does, without a generator's cost)
        lock = self._lock
        lock.acquire()
        outer = not self._busy
        self._busy = True
        try:
            bucket = self._free.get(size)
            if bucket:
                block = bucket.pop()
                self._n_reuse += 1
            else:
                block = self._new_block(size, nbytes, tag)
            block.live = True
            block.requested = nbytes
            block.tag = tag
            if block.guard:
                block.front.fill(GUARD_PATTERN)
                block.back.fill(GUARD_PATTERN)
                block.array[nbytes:].fill(GUARD_PATTERN)
            cur = self._current = self._current + size
            if cur > self._peak:
                self._peak = cur
            t = self._by_tag.get(tag)
            if t is None:
                t = self._by_tag[tag] = [0, 0, 0]  # current, peak, allocations
            c = t[0] = t[0] + size
            t[2] += 1
            if c > t[1]:
                t[1] = c
            self._n_alloc += 1
            self._live[id(block)] = block
        finally:
            if outer:
                self._busy = False
            lock.release()
        if outer and self._deferred:
            self._drain()
        if hooks.active:
            hooks.emit("alloc", {"block": block, "bytes": size, "tag": tag})
        return block

    def _new_block(self, size: int, nbytes: int, tag: str | None = None) -> Block:
        who = f" for {tag}" if tag else ""
        if size > physical_memory():
            raise OutOfMemoryError(
                f"memory pool: cannot allocate {nbytes} bytes{who}: more than the machine's "
                f"{physical_memory()} bytes of physical memory"
            )
        if self.cap is not None and self._reserved + size > self.cap:
            self._release_cached_locked()
            if self._reserved + size > self.cap:
                raise OutOfMemoryError(
                    f"memory pool: cannot allocate {nbytes} bytes{who} (size class {size}): "
                    f"{self._current} bytes in use, {self._reserved} reserved, cap {self.cap} bytes; "
                    "free tensors or raise the cap with opsnn.memory.set_cap()"
                )
        try:
            block = Block(size, self.guard_bytes)
        except (MemoryError, ValueError) as exc:  # the OS refused (numpy's MemoryError), or numpy's size limit
            raise OutOfMemoryError(f"memory pool: cannot allocate {nbytes} bytes{who}: {exc}") from None
        self._reserved += size
        return block

    def free(self, block: Block) -> None:
        lock = self._lock  # by hand, as in allocate
        lock.acquire()
        if self._busy:  # a finalizer inside a critical section of this thread: done when it ends
            self._deferred.append(block)
            lock.release()
            return
        if not block.live:
            lock.release()
            return
        self._busy = True
        try:
            block.live = False
            size = block.size
            self._current -= size
            self._by_tag[block.tag][0] -= size
            self._n_free += 1
            del self._live[id(block)]
            self._free[size].append(block)
        finally:
            self._busy = False
            lock.release()
        if self._deferred:
            self._drain()
        if hooks.active:
            hooks.emit("free", {"block": block, "bytes": block.size})

    def _release_cached_locked(self) -> None:
        for bucket in self._free.values():
            for block in bucket:
                self._reserved -= block.size
        self._free.clear()

    def empty_cache(self) -> None:
        """Return every cached (free) block to the OS."""
        with self._section():
            self._release_cached_locked()
        trim_heap()

    def summary(self, top: int = 5) -> dict:
        """Current / peak / reserved bytes, allocation counts and the largest live blocks."""
        with self._section():
            largest = sorted(self._live.values(), key=lambda b: b.size, reverse=True)[:top]
            return {
                "current_bytes": self._current,
                "peak_bytes": self._peak,
                "reserved_bytes": self._reserved,
                "cached_bytes": self._reserved - self._current,
                "cap_bytes": self.cap,
                "live_blocks": len(self._live),
                "allocations": self._n_alloc,
                "frees": self._n_free,
                "reuses": self._n_reuse,
                "largest_blocks": [{"bytes": b.size, "requested": b.requested, "tag": b.tag} for b in largest],
                "per_op": sorted(
                    (
                        {"op": tag or "(user)", "current_bytes": c, "peak_bytes": p, "allocations": n}
                        for tag, (c, p, n) in self._by_tag.items()
                    ),
                    key=lambda r: -r["peak_bytes"],
                ),
            }

    def live_blocks(self) -> list:
        with self._section():
            return list(self._live.values())

    @property
    def current_bytes(self) -> int:
        return self._current


_physical: list = []


def physical_memory() -> int:
    """Bytes of RAM on this machine (no allocation larger than this can succeed)."""
    if not _physical:
        try:
            _physical.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        except (ValueError, OSError, AttributeError):  # not a POSIX system: no such bound known
            _physical.append(1 << 62)
    return _physical[0]


def check_request(nbytes: int, what: str) -> None:
    """Raise :class:`OutOfMemoryError` naming ``what`` before allocating ``nbytes`` of host memory
    that cannot be had: more than physical memory, or more than the pool's cap leaves beside the
    bytes in use. For memory a numpy call allocates outside the pool (a plan, an index map, a
    loaded initializer) and for requests checked before the pool sees them::

        >>> import opsnn
        >>> opsnn.memory.check_request(1 << 70, "Range: values")  # doctest: +SKIP
        Traceback (most recent call last):
        opsnn.errors.OutOfMemoryError: [361001] Range: values: cannot allocate 1180591620717411303424 bytes ...
    """
    if nbytes > physical_memory():
        raise OutOfMemoryError(
            f"{what}: cannot allocate {nbytes} bytes: more than the machine's "
            f"{physical_memory()} bytes of physical memory"
        )
    pool = _pool()
    cap = pool.cap
    if cap is not None and pool.current_bytes + nbytes > cap:
        raise OutOfMemoryError(
            f"{what}: cannot allocate {nbytes} bytes: {pool.current_bytes} bytes in use, "
            f"cap {cap} bytes; free tensors or raise the cap with opsnn.memory.set_cap()"
        )


#: memory maps a new compiled kernel may take (numba's code and data sections, LLVM's own allocations)
KERNEL_MAPS = 256
_map_limit: list = []


def _max_map_count() -> int | None:
    if not _map_limit:
        try:
            with open("/proc/sys/vm/max_map_count") as f:
                _map_limit.append(int(f.read()))
        except (OSError, ValueError):  # not Linux: no such limit known
            _map_limit.append(None)
    return _map_limit[0]


def memory_maps() -> int | None:
    """Memory maps this process holds (Linux; None elsewhere)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def check_kernel_maps(what: str, need: int = KERNEL_MAPS) -> None:
    """Raise :class:`OutOfMemoryError` naming ``what`` before compiling or loading a kernel when the
    process is within ``need`` memory maps of the system's ``vm.max_map_count``. Compiled code is never
    unloaded (numba keeps every JIT section mapped), so a process that generates kernels without end
    (a fuzzer, a server compiling ever-new models) reaches the limit, where LLVM aborts the process
    ("Unable to allocate section memory") or another allocator's failure crashes it."""
    limit = _max_map_count()
    if limit is None:
        return
    n = memory_maps()
    if n is not None and n + need > limit:
        raise OutOfMemoryError(
            f"{what}: cannot compile another kernel: the process holds {n} memory maps, within {need} of "
            f"the system's limit of {limit} (vm.max_map_count); compiled kernels stay mapped for the "
            "process's life: run fewer distinct fused chains per process, or raise vm.max_map_count"
        )


def _pool() -> MemoryPool:
    from .context import context

    return context().pool


def summary(top: int = 5) -> dict:
    """Memory use of the current device's pool (see :meth:`MemoryPool.summary`)."""
    return _pool().summary(top)


def empty_cache() -> None:
    """Release cached blocks of the current device's pool."""
    _pool().empty_cache()


def set_cap(cap: int | None) -> None:
    """Cap the bytes the pool may hold; allocations past it raise ``OutOfMemoryError``."""
    _pool().set_cap(cap)


def set_debug_guards(nbytes: int = 64) -> None:
    """Debug mode: guard bytes around every buffer, checked after each kernel (0 = off)."""
    _pool().set_debug_guards(nbytes)


def reset_peak() -> None:
    _pool().reset_stats()


def current_bytes() -> int:
    return _pool().current_bytes
