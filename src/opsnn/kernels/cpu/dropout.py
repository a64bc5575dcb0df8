"""CPU dropout kernels (numba): masks drawn from a counter-based hash of ``(seed, element index)``.

Element ``i`` of a ``NativeDropout`` call with seed ``s`` is kept when the top 24 bits of
``splitmix64(s + (i + 1) * 0x9E3779B97F4A7C15)`` are at least ``ceil(p * 2**24)``: the mask
depends on the seed and the element's index only (like torch's philox seed + offset), so a
graph that takes the seed as an input draws a fresh mask at every run, any thread split gives
the same mask, and the numpy reference (:func:`keep_mask`) reproduces it exactly. Kept
elements are scaled by ``1 / (1 - p)`` in the data's dtype, dropped ones multiplied by 0
(NaN stays NaN, as ``x * mask * scale`` gives). The backward applies the saved mask the same way.
bfloat16 data is widened a block at a time into float32 scratch, scaled and rounded once (to
nearest even) inside the kernel: one pass over memory, no float32 copies of the tensors.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import ml_dtypes
import numba as nb
import numpy as np

from .activation import PARALLEL_MIN_COSTLY
from .gemm import KIND_BF16, _narrow, _widen

_BF16 = np.dtype(ml_dtypes.bfloat16)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
#: elements one parallel task handles
BLOCK = 1 << 14
#: below this many elements the backward runs serially: the binary elementwise threshold
#: (:data:`.elementwise.PARALLEL_MIN`), a pass as cheap as an add
PARALLEL_MIN = 1 << 18
#: the forward's threshold: a 64-bit hash per element costs like an exp map
FORWARD_PARALLEL_MIN = PARALLEL_MIN_COSTLY


class DropoutPlan(NamedTuple):
    threshold: int  # keep an element when its 24-bit draw is >= this
    parallel: bool

    def describe(self) -> str:
        return f"keep when a 24-bit hash draw >= {self.threshold}; {'parallel' if self.parallel else 'serial'}"


def threshold(p: float) -> int:
    """The 24-bit draw below which an element is dropped for drop probability ``p``."""
    return math.ceil(float(p) * (1 << 24))


def dropout_plan(numel: int, p: float) -> DropoutPlan:
    return DropoutPlan(threshold(p), numel >= FORWARD_PARALLEL_MIN)


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
    # slices (indices from 0, no wraparound checks) and the two scales as scalars (a select, not a
    # gather): the loop vectorizes
    xs, os, ms = x[lo:hi], out[lo:hi], mask[lo:hi]
    keep, drop = scales[0], scales[1]
    for j in range(xs.shape[0]):
        k = _draw(s, np.uint64(lo + j)) >= thr
        ms[j] = k
        os[j] = xs[j] * (keep if k else drop)


@nb.njit(nogil=True, cache=True)
def _forward_serial(x, s, thr, scales, out, mask):
    _forward_range(x, s, thr, scales, out, mask, 0, x.shape[0])


@nb.njit(parallel=True, nogil=True, cache=True)
def _forward_parallel(x, s, thr, scales, out, mask):
    n = x.shape[0]
    for b in nb.prange((n + BLOCK - 1) // BLOCK):
        _forward_range(x, s, thr, scales, out, mask, b * BLOCK, min(n, (b + 1) * BLOCK))


@nb.njit(nogil=True, cache=True)
def _forward_range_bf16(x, s, thr, scales, out, mask, lo, hi):
    tmp = np.empty(min(max(hi - lo, 0), BLOCK), np.uint32)
    f = tmp.view(np.float32)
    keep, drop = scales[0], scales[1]
    for b0 in range(lo, hi, BLOCK):
        n = min(hi, b0 + BLOCK) - b0
        _widen(x[b0 : b0 + n], tmp[:n], f[:n], KIND_BF16)
        ms = mask[b0 : b0 + n]
        for i in range(n):
            k = _draw(s, np.uint64(b0 + i)) >= thr
            ms[i] = k
            f[i] = f[i] * (keep if k else drop)
        _narrow(f[:n], tmp[:n], out[b0 : b0 + n], KIND_BF16)


@nb.njit(nogil=True, cache=True)
def _forward_serial_bf16(x, s, thr, scales, out, mask):
    _forward_range_bf16(x, s, thr, scales, out, mask, 0, x.shape[0])


@nb.njit(parallel=True, nogil=True, cache=True)
def _forward_parallel_bf16(x, s, thr, scales, out, mask):
    n = x.shape[0]
    for b in nb.prange((n + BLOCK - 1) // BLOCK):
        _forward_range_bf16(x, s, thr, scales, out, mask, b * BLOCK, min(n, (b + 1) * BLOCK))


@nb.njit(nogil=True, cache=True)
def _backward_range_bf16(g, mask, scales, out, lo, hi):
    tmp = np.empty(min(max(hi - lo, 0), BLOCK), np.uint32)
    f = tmp.view(np.float32)
    keep, drop = scales[0], scales[1]
    for b0 in range(lo, hi, BLOCK):
        n = min(hi, b0 + BLOCK) - b0
        _widen(g[b0 : b0 + n], tmp[:n], f[:n], KIND_BF16)
        ms = mask[b0 : b0 + n]
        for i in range(n):
            f[i] = f[i] * (keep if ms[i] else drop)
        _narrow(f[:n], tmp[:n], out[b0 : b0 + n], KIND_BF16)


@nb.njit(nogil=True, cache=True)
def _backward_serial_bf16(g, mask, scales, out):
    _backward_range_bf16(g, mask, scales, out, 0, g.shape[0])


@nb.njit(parallel=True, nogil=True, cache=True)
def _backward_parallel_bf16(g, mask, scales, out):
    n = g.shape[0]
    for b in nb.prange((n + BLOCK - 1) // BLOCK):
        _backward_range_bf16(g, mask, scales, out, b * BLOCK, min(n, (b + 1) * BLOCK))


@nb.njit(nogil=True, cache=True)
def _backward_range(g, mask, scales, out, lo, hi):
    gs, ms, os = g[lo:hi], mask[lo:hi], out[lo:hi]
    keep, drop = scales[0], scales[1]
    for j in range(gs.shape[0]):
        os[j] = gs[j] * (keep if ms[j] else drop)


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
    x, out = x.reshape(-1), out.reshape(-1)
    if x.dtype == _BF16:
        fn = _forward_parallel_bf16 if plan.parallel else _forward_serial_bf16
        x, out, sc = x.view(np.uint16), out.view(np.uint16), scales(p, np.float32)
    else:
        fn = _forward_parallel if plan.parallel else _forward_serial
        sc = scales(p, x.dtype)
    fn(x, seed_bits(seed), np.uint64(plan.threshold), sc, out, mask.reshape(-1))


def backward(g: np.ndarray, mask: np.ndarray, p: float, parallel: bool, out: np.ndarray) -> None:
    """``out = g * mask / (1 - p)`` (contiguous arrays of one shape)."""
    if g.size == 0:
        return
    g, out = g.reshape(-1), out.reshape(-1)
    if g.dtype == _BF16:
        fn = _backward_parallel_bf16 if parallel else _backward_serial_bf16
        g, out, sc = g.view(np.uint16), out.view(np.uint16), scales(p, np.float32)
    else:
        fn = _backward_parallel if parallel else _backward_serial
        sc = scales(p, g.dtype)
    fn(g, mask.reshape(-1), sc, out)
