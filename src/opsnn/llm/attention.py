"""Decode attention over the KV cache: one query token per row, each row reading the first
``lengths[b]`` positions of its cache slot (numba, GQA without repeating K/V).

A decode step's attention is a matrix-vector product per (row, KV head): for each key the
``group = Hq // Hkv`` query heads that share it take a dot product, then a softmax over the
row's filled length and a weighted sum of the values. The fused ``Attention`` op's flash
kernel serves it one (row, query head) task at a time with an online softmax over blocks
of 64 keys (a scalar ``exp`` and a rescale per block); here one task is a (row, KV head)
pair that reads each key and value row once for the whole group, writes the scores to a
scratch row, and takes the softmax in one vectorized pass. Same math (fp32 accumulation,
softmax over exactly the row's keys), different summation order: the cached decoder uses
it for every one-token step, eager or replayed, so batched and one-at-a-time decoding stay
identical.

    >>> import numpy as np
    >>> q = np.ones((1, 4, 1, 8), np.float32); k = np.ones((1, 2, 16, 8), np.float32)
    >>> y = np.empty((1, 4, 1, 8), np.float32)
    >>> decode_attention(q, k, k, np.array([0]), np.array([3]), y, scale=8 ** -0.5); float(y[0, 0, 0, 0])
    1.0
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ..kernels.cpu.activation import fexp

#: vectorise dot products (reassociation) but keep IEEE inf semantics
_FM = {"reassoc", "contract", "arcp", "nsz"}


@nb.njit(nogil=True, cache=True, fastmath=_FM)
def _decode_task(t, q, k, v, slots, lengths, y, scale):
    Hkv, T, D = k.shape[1], k.shape[2], k.shape[3]
    Dv = v.shape[3]
    group = q.shape[1] // Hkv
    b = t // Hkv
    hk = t % Hkv
    h0 = hk * group
    L = min(lengths[b], T)
    sl = slots[b]
    zero = np.float32(0.0)
    if L <= 0:  # an idle row: nothing to attend, zeros (as the flash kernel gives)
        for gi in range(group):
            for dd in range(Dv):
                y[b, h0 + gi, 0, dd] = zero
        return
    kb = k[sl, hk]
    vb = v[sl, hk]
    qs = np.empty((group, D), np.float32)
    for gi in range(group):
        for dd in range(D):
            qs[gi, dd] = q[b, h0 + gi, 0, dd] * scale
    s = np.empty((group, L), np.float32)
    for j in range(L):
        for gi in range(group):
            a = zero
            for dd in range(D):
                a += qs[gi, dd] * kb[j, dd]
            s[gi, j] = a
    inv = np.empty(group, np.float32)
    for gi in range(group):
        row = s[gi]
        m = np.float32(-np.inf)
        for j in range(L):
            m = max(m, row[j])
        tot = zero
        for j in range(L):
            e = fexp(row[j] - m)
            row[j] = e
            tot += e
        inv[gi] = np.float32(1.0) / tot
    acc = np.zeros((group, Dv), np.float32)
    for j in range(L):
        for gi in range(group):
            p = s[gi, j]
            for dd in range(Dv):
                acc[gi, dd] += p * vb[j, dd]
    for gi in range(group):
        for dd in range(Dv):
            y[b, h0 + gi, 0, dd] = acc[gi, dd] * inv[gi]


@nb.njit(parallel=True, nogil=True, cache=True)
def _decode_parallel(q, k, v, slots, lengths, y, scale):
    for t in nb.prange(q.shape[0] * k.shape[1]):
        _decode_task(np.int64(t), q, k, v, slots, lengths, y, scale)


@nb.njit(nogil=True, cache=True)
def _decode_serial(q, k, v, slots, lengths, y, scale):
    for t in range(q.shape[0] * k.shape[1]):
        _decode_task(np.int64(t), q, k, v, slots, lengths, y, scale)


#: below this many multiply-adds (keys read x query heads x head dim, over the rows) one thread
#: runs the step (waking the pool costs more than it saves)
PARALLEL_MIN = 1 << 17


def decode_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, slots: np.ndarray, lengths: np.ndarray,
                     y: np.ndarray, scale: float) -> None:
    """``y[b, h, 0] = softmax(scale * q[b, h, 0] . k[s, h // g, :L]) @ v[s, h // g, :L]`` with
    ``s = slots[b]``, ``L = lengths[b]`` (0: zeros) and ``g = Hq // Hkv``. q (B, Hq, 1, D) (any
    strides); k, v (slots, Hkv, T, D) with unit-stride rows (the KV cache buffers); y (B, Hq, 1,
    Dv) float32, written in place."""
    work = int(np.minimum(lengths, k.shape[2]).sum()) * q.shape[1] * q.shape[3]
    fn = _decode_parallel if work >= PARALLEL_MIN else _decode_serial
    fn(q, k, v, slots, lengths, y, np.float32(scale))


__all__ = ["decode_attention"]
