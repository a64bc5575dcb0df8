"""CPU dropout kernels (numba): masks drawn from a counter-based hash of ``(seed, element index)``.

Element ``i`` of a ``NativeDropout`` call with seed ``s`` is kept when the top 24 bits of
``splitmix64(s + (i + 1) * 0x9E3779B97F4A7C15)`` are at least ``ceil(p * 2**24)``: the mask
depends on the seed and the element's index only (like torch's philox seed + offset), so a
graph that takes the seed as an input draws a fresh mask at every run, any thread split gives
the same mask, and the numpy reference (:func:`keep_mask`) reproduces it exactly. Kept
elements are scaled by ``1 / (1 - p)`` in the data's dtype, dropped ones multiplied by 0
(NaN stays NaN, as ``x * mask * scale`` gives). The backward applies the saved mask the same way.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba as nb
import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
#: elements one parallel task handles
BLOCK = 1 << 14
#: below this many elements the serial kernel runs: elementwise maps' threshold
#: (:data:`.elementwise.PARALLEL_MIN`); on a loaded machine a parallel region costs milliseconds
PARALLEL_MIN = 1 << 20


class DropoutPlan(NamedTuple):
    threshold: int  # keep an element when its 24-bit draw is >= this
    parallel: bool

    def describe(self) -> str:
        return f"keep when a 24-bit hash draw >= {self.threshold}; {'parallel' if self.parallel else 'serial'}"


def threshold(p: float) -> int:
    """The 24-bit draw below which an element is dropped for drop probability ``p``."""
    return math.ceil(float(p) * (1 << 24))


def dropout_plan(numel: int, p: float) -> DropoutPlan:
    return DropoutPlan(threshold(p), numel >= PARALLEL_MIN)


def seed_bits(seed) -> np.uint64:
    """The 64 bits of an int64 seed as the hash's unsigned key (negative seeds wrap)."""
    return np.asarray(seed).reshape(-1)[:1].astype(np.int64).view(np.uint64)[0]


def keep_mask(seed, n: int, thr: int) -> np.ndarray:
    """The keep mask of ``n`` elements in numpy (the reference the kernels must reproduce)."""
    z = seed_bits(seed) + (np.arange(n, dtype=np.uint64) + np.uint64(1)) * _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(40)) >= np.uint64(thr)


@nb.njit(inline="always")
def _draw(s, i):
    z = s + (i + np.uint64(1)) * _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    z = z ^ (z >> np.uint64(31))
    return z >> np.uint64(40)


@nb.njit(nogil=True, cache=True)
def _forward_range(x, s, thr, scales, out, mask, lo, hi):
    for i in range(lo, hi):
        k = _draw(s, np.uint64(i)) >= thr
        mask[i] = k
        out[i] = x[i] * scales[0 if k else 1]


@nb.njit(nogil=True, cache=True)
def _forward_serial(x, s, thr, scales, out, mask):
    _forward_range(x, s, thr, scales, out, mask, 0, x.shape[0])


@nb.njit(parallel=True, nogil=True, cache=True)
def _forward_parallel(x, s, thr, scales, out, mask):
    n = x.shape[0]
    for b in nb.prange((n + BLOCK - 1) // BLOCK):
        _forward_range(x, s, thr, scales, out, mask, b * BLOCK, min(n, (b + 1) * BLOCK))


@nb.njit(nogil=True, cache=True)
def _backward_range(g, mask, scales, out, lo, hi):
    for i in range(lo, hi):
        out[i] = g[i] * scales[0 if mask[i] else 1]


@nb.njit(nogil=True, cache=True)
def _backward_serial(g, mask, scales, out):
    _backward_range(g, mask, scales, out, 0, g.shape[0])


@nb.njit(parallel=True, nogil=True, cache=True)
def _backward_parallel(g, mask, scales, out):
    n = g.shape[0]
    for b in nb.prange((n + BLOCK - 1) // BLOCK):
        _backward_range(g, mask, scales, out, b * BLOCK, min(n, (b + 1) * BLOCK))


def scales(p: float, dtype) -> np.ndarray:
    """``[1 / (1 - p), 0]`` in ``dtype``: what kept and dropped elements are multiplied by."""
    return np.array([1.0 / (1.0 - float(p)), 0.0], dtype)


def forward(x: np.ndarray, seed, p: float, plan: DropoutPlan, out: np.ndarray, mask: np.ndarray) -> None:
    """``out = x * keep / (1 - p)``, ``mask = keep`` (contiguous arrays of one shape)."""
    if x.size == 0:
        return
    fn = _forward_parallel if plan.parallel else _forward_serial
    fn(
        x.reshape(-1),
        seed_bits(seed),
        np.uint64(plan.threshold),
        scales(p, x.dtype),
        out.reshape(-1),
        mask.reshape(-1),
    )


def backward(g: np.ndarray, mask: np.ndarray, p: float, parallel: bool, out: np.ndarray) -> None:
    """``out = g * mask / (1 - p)`` (contiguous arrays of one shape)."""
    if g.size == 0:
        return
    fn = _backward_parallel if parallel else _backward_serial
    fn(g.reshape(-1), mask.reshape(-1), scales(p, g.dtype), out.reshape(-1))
