"""Decode attention over the KV cache: one query token per row, each row reading the first
``lengths[b]`` positions of its cache slot (numba, GQA without repeating K/V).

A decode step's attention is a matrix-vector product per (row, KV head): the ``group =
Hq // Hkv`` query heads that share a KV head score every key of the row, take a softmax over
the row's filled length and a weighted sum of the values. The fused ``Attention`` op's flash
kernel serves it one (row, query head) task at a time, a dot product (a horizontal
reduction) per key and an online softmax over blocks of 64 keys with a scalar ``exp``. Here
one task is a (row, KV head) pair: the keys are stored transposed (:class:`~.cache.KVCache`),
so the scores are ``head_dim`` unit-stride multiply-add passes over the positions, each key
and value row is read once for the whole group, and the softmax is one vectorized pass over
the scores. Same math (fp32 accumulation, softmax over exactly the row's keys), another
summation order: the cached decoder runs it for every one-token step, eager or replayed, so
batched and one-at-a-time decoding agree.

    >>> import numpy as np
    >>> q = np.ones((1, 4, 1, 8), np.float32); kt = np.ones((1, 2, 8, 16), np.float32)
    >>> v = np.ones((1, 2, 16, 8), np.float32); y = np.empty((1, 4, 1, 8), np.float32)
    >>> decode_attention(q, kt, v, np.array([0]), np.array([3]), y, scale=8 ** -0.5); float(y[0, 0, 0, 0])
    1.0
"""

from __future__ import annotations

import numba as nb
import numpy as np

from ..kernels.cpu.activation import fexp
from ..kernels.cpu.attention import row_max
from ..runtime import kernel_cache

#: vectorise dot products (reassociation) but keep IEEE inf semantics
_FM = {"reassoc", "contract", "arcp", "nsz"}


@nb.njit(nogil=True, cache=True, fastmath=_FM)
def _decode_task(t, q, kt, v, slots, lengths, y, scale):
    Hkv, D, T = kt.shape[1], kt.shape[2], kt.shape[3]
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
    kb = kt[sl, hk]  # (D, T): position-contiguous rows
    vb = v[sl, hk]  # (T, Dv)
    # scores: unit-stride multiply-add passes over the row's positions (no reduction per key),
    # eight key dims a pass: eight streams of K at once keep the memory system busy (one dim a
    # pass restarted the prefetch for each short row; docs/performance.md, "LLM decoding")
    s = np.zeros((group, L), np.float32)
    dd = 0
    while dd + 8 <= D:
        k0, k1, k2, k3 = kb[dd], kb[dd + 1], kb[dd + 2], kb[dd + 3]
        k4, k5, k6, k7 = kb[dd + 4], kb[dd + 5], kb[dd + 6], kb[dd + 7]
        for gi in range(group):
            qq = q[b, h0 + gi, 0]
            q0, q1, q2, q3 = qq[dd] * scale, qq[dd + 1] * scale, qq[dd + 2] * scale, qq[dd + 3] * scale
            q4, q5, q6, q7 = qq[dd + 4] * scale, qq[dd + 5] * scale, qq[dd + 6] * scale, qq[dd + 7] * scale
            row = s[gi]
            for j in range(L):
                row[j] += (q0 * k0[j] + q1 * k1[j] + q2 * k2[j] + q3 * k3[j]) + (
                    q4 * k4[j] + q5 * k5[j] + q6 * k6[j] + q7 * k7[j]
                )
        dd += 8
    while dd < D:
        kr = kb[dd]
        for gi in range(group):
            qv = q[b, h0 + gi, 0, dd] * scale
            row = s[gi]
            for j in range(L):
                row[j] += qv * kr[j]
        dd += 1
    inv = np.empty(group, np.float32)
    for gi in range(group):
        row = s[gi]
        m = row_max(row)  # eight running maxima: one max chain is latency-bound
        for j in range(L):
            row[j] = fexp(row[j] - m)
        tot = zero
        for j in range(L):
            tot += row[j]
        inv[gi] = np.float32(1.0) / tot
    # weighted sum of the values, four positions per pass over the accumulator
    acc = np.zeros((group, Dv), np.float32)
    j = 0
    while j + 4 <= L:
        for gi in range(group):
            p0, p1, p2, p3 = s[gi, j], s[gi, j + 1], s[gi, j + 2], s[gi, j + 3]
            for dd in range(Dv):
                acc[gi, dd] += p0 * vb[j, dd] + p1 * vb[j + 1, dd] + p2 * vb[j + 2, dd] + p3 * vb[j + 3, dd]
        j += 4
    while j < L:
        for gi in range(group):
            p = s[gi, j]
            for dd in range(Dv):
                acc[gi, dd] += p * vb[j, dd]
        j += 1
    for gi in range(group):
        for dd in range(Dv):
            y[b, h0 + gi, 0, dd] = acc[gi, dd] * inv[gi]


@nb.njit(nogil=True, cache=True)
def _decode_all(q, kt, v, slots, lengths, y, scale):
    for t in range(q.shape[0] * kt.shape[1]):
        _decode_task(np.int64(t), q, kt, v, slots, lengths, y, scale)


@nb.njit(nogil=True, parallel=True, cache=True)
def decode_attention_parallel(q, kt, v, slots, lengths, y, scale, nt):
    """:func:`decode_attention` over ``nt`` threads, for numba callers (``scale`` float32)."""
    # thread th of nt takes tasks th, th + nt, ...: rows of different lengths spread over the
    # threads (a contiguous split gave one thread the long rows of a batch often enough to matter)
    n = q.shape[0] * kt.shape[1]
    for th in nb.prange(nt):
        for t in range(th, n, nt):
            _decode_task(np.int64(t), q, kt, v, slots, lengths, y, scale)


@nb.njit(nogil=True, cache=True)
def rope_query(qh, c, s):
    """Non-interleaved ("rotate half") RoPE of one head ``qh`` (D,) in place; ``c``/``s`` the
    position's (D/2,) rows of the cos/sin tables."""
    half = c.size
    for i in range(half):
        x1, x2 = qh[i], qh[i + half]
        qh[i] = c[i] * x1 - s[i] * x2
        qh[i + half] = s[i] * x1 + c[i] * x2


@nb.njit(nogil=True, cache=True)
def store_key_value(kh, vh, kt, vc, sl, hk, p, c, s):
    """One KV head's new key ``kh`` (rotated as :func:`rope_query`, written transposed into
    ``kt[sl, hk, :, p]``) and value ``vh`` (into ``vc[sl, hk, p]``) at position ``p``."""
    half = c.size
    kd = kt[sl, hk]
    for i in range(half):
        x1, x2 = kh[i], kh[i + half]
        kd[i, p] = c[i] * x1 - s[i] * x2
        kd[i + half, p] = s[i] * x1 + c[i] * x2
    vc[sl, hk, p, :] = vh


@nb.njit(nogil=True, cache=True)
def rope_store(q, k, v, cos, sin, pos, kt, vc, slots, rows):
    """A decode step's rotary embedding and K/V store in one pass: rotate every row of ``q``
    (R, Hq, D) in place and the first ``rows`` rows of ``k`` (R, Hkv, D) into the cache, row
    ``b`` at position ``pos[b]`` of slot ``slots[b]`` (keys transposed: ``kt`` (slots, Hkv, D,
    T); values ``vc`` (slots, Hkv, T, D) copied from ``v``). ``cos``/``sin`` are the
    (max_position, D/2) tables of the model's non-interleaved ("rotate half") RoPE; positions
    must lie in the table and the cache (the caller checks)."""
    for b in range(q.shape[0]):
        c, s = cos[pos[b]], sin[pos[b]]
        for n in range(q.shape[1]):
            rope_query(q[b, n], c, s)
        if b < rows:
            for n in range(k.shape[1]):
                store_key_value(k[b, n], v[b, n], kt, vc, slots[b], n, pos[b], c, s)


@nb.njit(parallel=True, nogil=True, cache=True)
def rope_store_rows(q, k, v, cos, sin, pos, kt, vc, slots):
    """A forward's rotary embedding and K/V store in one parallel pass over its rows (a prompt's
    tokens): rotate ``q`` (R, Hq, D) and ``k`` (R, Hkv, D) in place (attention reads both from
    the projection's output), row ``r`` at position ``pos[r]``, and store its key (transposed,
    as :func:`store_key_value`) and ``v[r]`` at that position of slot ``slots[r]``. Rows go to
    the threads in contiguous runs, so each writes adjacent positions of the cache. Positions
    must lie in the tables and the cache, and no two rows may share a slot and a position (the
    caller checks)."""
    for b in nb.prange(q.shape[0]):
        p = pos[b]
        c, s = cos[p], sin[p]
        for n in range(q.shape[1]):
            rope_query(q[b, n], c, s)
        for n in range(k.shape[1]):
            rope_query(k[b, n], c, s)
            kt[slots[b], n, :, p] = k[b, n]
            vc[slots[b], n, p, :] = v[b, n]


def rope_store_rows_numpy(q, k, v, cos, sin, pos, kt, vc, slots) -> None:
    """:func:`rope_store_rows` in numpy (the same float32 arithmetic)."""
    c, s = cos[pos], sin[pos]
    _rope_numpy(q, c, s)
    _rope_numpy(k, c, s)
    kt[slots, :, :, pos] = k
    vc[slots, :, pos, :] = v


def decode_attention(
    q: np.ndarray,
    kt: np.ndarray,
    v: np.ndarray,
    slots: np.ndarray,
    lengths: np.ndarray,
    y: np.ndarray,
    scale: float,
    parallel: bool = False,
) -> None:
    """``y[b, h, 0] = softmax(scale * q[b, h, 0] . K[s, h // g, :L]) @ v[s, h // g, :L]`` with
    ``s = slots[b]``, ``L = lengths[b]`` (0: zeros), ``g = Hq // Hkv`` and ``K[s, hk] = kt[s, hk].T``.
    q (B, Hq, 1, D) (any strides); kt (slots, Hkv, D, T) and v (slots, Hkv, T, Dv), both with
    unit-stride rows (the KV cache's buffers); y (B, Hq, 1, Dv) float32, written in place.

    It runs on the calling thread unless ``parallel`` (tasks spread over numba's threads). A
    decode step whose GEMMs run on OpenBLAS should keep it on one thread: OpenBLAS's workers
    keep spinning between calls, and a parallel region fighting them loses. Next to MKL's GEMMs,
    which share numba's OpenMP pool, two threads halve it (docs/performance.md, "LLM decoding")."""
    if parallel:
        fn, args = decode_attention_parallel, (q, kt, v, slots, lengths, y, np.float32(scale), nb.get_num_threads())
    else:
        fn, args = _decode_all, (q, kt, v, slots, lengths, y, np.float32(scale))
    if kernel_cache.cold(fn, args):  # compiling in the background (opsnn.ops.tiering): numpy meanwhile
        decode_attention_numpy(q, kt, v, slots, lengths, y, scale)
    else:
        fn(*args)


def decode_attention_numpy(q, kt, v, slots, lengths, y, scale) -> None:
    """:func:`decode_attention` in numpy (scores and the weighted sum by BLAS per row and KV head,
    the same softmax over exactly the row's keys: NaN and Inf as the numba kernel gives them)."""
    B, Hq, Hkv, T = q.shape[0], q.shape[1], kt.shape[1], kt.shape[3]
    g = Hq // Hkv
    sc = np.float32(scale)
    with np.errstate(all="ignore"):
        for b in range(B):
            L = min(int(lengths[b]), T)
            if L <= 0:  # an idle row: zeros, as _decode_task
                y[b] = 0
                continue
            sl = slots[b]
            qs = q[b, :, 0, :].reshape(Hkv, g, -1) * sc
            s = qs @ kt[sl, :, :, :L]  # (Hkv, g, L)
            p = np.exp(s - s.max(axis=2, keepdims=True))
            inv = np.float32(1.0) / p.sum(axis=2, dtype=np.float32)
            y[b, :, 0, :] = ((p @ v[sl, :, :L, :]) * inv[:, :, None]).reshape(Hq, -1)


def rope_store_numpy(q, k, v, cos, sin, pos, kt, vc, slots, rows) -> None:
    """:func:`rope_store` in numpy (the same float32 arithmetic)."""
    c, s = cos[pos], sin[pos]
    _rope_numpy(q, c, s)
    kr = k[:rows].copy()
    _rope_numpy(kr, c[:rows], s[:rows])
    for b in range(rows):
        kt[slots[b], :, :, pos[b]] = kr[b]
        vc[slots[b], :, pos[b], :] = v[b]


def _rope_numpy(x, c, s) -> None:
    # rope_query on x (R, heads, D) in place, row b at the table rows c[b], s[b] (R, half)
    half = c.shape[1]
    x1, x2 = x[..., :half].copy(), x[..., half : 2 * half].copy()
    c, s = c[:, None, :], s[:, None, :]
    x[..., :half] = c * x1 - s * x2
    x[..., half : 2 * half] = s * x1 + c * x2


__all__ = [
    "decode_attention",
    "decode_attention_numpy",
    "decode_attention_parallel",
    "rope_query",
    "rope_store",
    "rope_store_numpy",
    "rope_store_rows",
    "rope_store_rows_numpy",
    "store_key_value",
]
