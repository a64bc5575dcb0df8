"""The KV cache: one preallocated key and one value buffer per layer, that live as long as
the cache: values (max_batch_slots, kv_heads, max_seq, head_dim), keys stored transposed,
(max_batch_slots, kv_heads, head_dim, max_seq), so that a decode step's scores (one query
against a row's keys) are unit-stride multiply-adds over positions instead of a reduction per
key (:mod:`opsnn.llm.attention`); :meth:`KVCache.view` gives both as (slots, kv_heads,
max_seq, head_dim) views, the Attention op's layout.

A request owns one *slot* (a row of every buffer) from admission to retirement; its
tokens occupy positions ``0 .. length-1`` of that row. Prefill and decode write the
new keys/values in place at the request's offset, so a decode step allocates no cache
memory, and attention reads views of the buffers (no copy)::

    >>> import opsnn
    >>> c = KVCache(layers=2, kv_heads=2, head_dim=8, max_batch_slots=4, max_seq=16)
    >>> c.keys[0].shape, c.values[0].shape, c.nbytes
    ((4, 2, 8, 16), (4, 2, 16, 8), 16384)
    >>> s = c.allocate(); s, c.free_slots
    (0, 3)
    >>> c.release(s); c.free_slots
    4
"""

from __future__ import annotations

import heapq
import threading

import numpy as np

from .. import dtypes as _dt
from ..errors import ParamInvalidError
from ..tensor import Tensor, _alloc_array
from .errors import CacheFullError


class KVCache:
    """Preallocated K/V buffers plus a slot allocator (lowest free slot first, so the
    slots of a running batch stay packed at the front and attention views stay short)."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, max_batch_slots: int, max_seq: int, dtype="float32"):
        for name, v in (
            ("layers", layers),
            ("kv_heads", kv_heads),
            ("head_dim", head_dim),
            ("max_batch_slots", max_batch_slots),
            ("max_seq", max_seq),
        ):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ParamInvalidError(f"KVCache: {name} must be a positive int, got {v!r}")
        self.dtype = _dt.get(dtype)
        if self.dtype != np.float32:
            raise ParamInvalidError(
                f"KVCache: dtype must be float32 (the fused attention kernel's dtype), got {_dt.name(self.dtype)}"
            )
        self.layers, self.kv_heads, self.head_dim = int(layers), int(kv_heads), int(head_dim)
        self.max_batch_slots, self.max_seq = int(max_batch_slots), int(max_seq)
        shape = (self.max_batch_slots, self.kv_heads, self.max_seq, self.head_dim)
        kshape = (self.max_batch_slots, self.kv_heads, self.head_dim, self.max_seq)  # transposed
        self.keys = [Tensor(_alloc_array(kshape, self.dtype, "KVCache")) for _ in range(self.layers)]
        self.values = [Tensor(_alloc_array(shape, self.dtype, "KVCache")) for _ in range(self.layers)]
        self._k = [t.numpy() for t in self.keys]
        self._v = [t.numpy() for t in self.values]
        #: tokens held by each slot (0 for a free slot)
        self.lengths = np.zeros(self.max_batch_slots, np.int64)
        self._free = list(range(self.max_batch_slots))
        self._used: set[int] = set()
        self._lock = threading.Lock()

    @classmethod
    def for_model(cls, model, max_batch_slots: int, max_seq: int) -> KVCache:
        cfg = model.config
        return cls(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, max_batch_slots, max_seq)

    # -- slots -------------------------------------------------------------------------------
    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def used_slots(self) -> list[int]:
        with self._lock:
            return sorted(self._used)

    def allocate(self) -> int:
        """Take the lowest free slot; :class:`CacheFullError` when none is free."""
        with self._lock:
            if self.closed:
                raise CacheFullError("KVCache: the cache was closed")
            if not self._free:
                raise CacheFullError(f"KVCache: all {self.max_batch_slots} slots are in use; release one first")
            slot = heapq.heappop(self._free)
            self._used.add(slot)
            self.lengths[slot] = 0
            return slot

    def release(self, slot: int) -> None:
        with self._lock:
            if slot not in self._used:
                raise ParamInvalidError(f"KVCache: slot {slot} is not in use (double release?)")
            self._used.discard(slot)
            self.lengths[slot] = 0
            heapq.heappush(self._free, slot)

    @property
    def nbytes(self) -> int:
        shape = (self.max_batch_slots, self.kv_heads, self.max_seq, self.head_dim)
        return 2 * self.layers * int(np.prod(shape)) * self.dtype.itemsize

    @property
    def closed(self) -> bool:
        return not self.keys

    def close(self) -> None:
        """Return the buffers to the memory pool now (the cache is unusable afterwards)."""
        with self._lock:
            self.keys, self.values, self._k, self._v = [], [], [], []

    # -- data -----------------------------------------------------------------------------------
    def write(self, layer: int, slots: np.ndarray, starts: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """Store new keys/values ``k``, ``v`` of shape (B, S, kv_heads, head_dim) at positions
        ``starts[b] .. starts[b]+S-1`` of slot ``slots[b]`` (in place)."""
        kc, vc = self._k[layer], self._v[layer]
        S = k.shape[1]
        if S == 1:  # decode: one scattered row per request, a single fancy-index write
            kc[slots, :, :, starts] = k[:, 0]
            vc[slots, :, starts, :] = v[:, 0]
        else:
            for b in range(k.shape[0]):
                s0 = int(starts[b])
                kc[slots[b], :, :, s0 : s0 + S] = k[b].transpose(1, 2, 0)
                vc[slots[b], :, s0 : s0 + S, :] = v[b].transpose(1, 0, 2)

    def view(self, layer: int, lo: int, hi: int) -> tuple[Tensor, Tensor]:
        """Zero-copy (hi-lo, kv_heads, max_seq, head_dim) views of slots ``lo .. hi-1`` (the keys'
        a transposed view of their buffer)."""
        return self.keys[layer][lo:hi].transpose(2, 3), self.values[layer][lo:hi]

    def __repr__(self) -> str:
        return (
            f"KVCache(layers={self.layers}, slots={self.max_batch_slots}, max_seq={self.max_seq}, "
            f"kv_heads={self.kv_heads}, head_dim={self.head_dim}, {self.nbytes / 2**20:.1f} MiB, "
            f"{len(self._used)} in use)"
        )


__all__ = ["KVCache"]
