"""A one-row decode step of a LLaMA layer as four parallel regions on single-threaded MKL.

One token's step is matrix-vector products (memory-bound: every weight byte is read once)
with little work between them: norms, RoPE, the K/V store, attention, SiLU. Run op by op that
is ~15 kernel calls a layer, each its own dispatch and (for the products) its own fork/join of
MKL's threads, with the interpreter's state cold after each product streamed megabytes of
weights. Here each thread computes its share of a projection's output rows (``cblas_sgemv``
over its rows of the weight) and carries on with what needs only those rows:

1. ``attention_block``: the RMSNorm of ``h`` (every thread for itself: 768 values), the q/k/v
   rows of its KV heads, RoPE, the K/V store into the cache, the attention of those heads;
2. ``residual_gemv``: ``h += W_o @ y`` over its rows of W_o;
3. ``mlp_block``: the norm again, its rows of the gate and up projections, SiLU(gate) * up;
4. ``residual_gemv``: ``h += W_down @ gu``.

The same arithmetic as the op-by-op step (float32, MKL's products, the decoder's own RoPE,
attention and norm kernels), so the two agree to rounding.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ..kernels.cpu import mkl_nb as MN
from ..kernels.cpu.activation import swiglu_chunk
from ..kernels.cpu.norm import _ln_rows32
from .attention import _decode_task


@nb.njit(nogil=True, cache=True)
def _rms(h, w, eps, x):
    stats = np.empty(2)
    _ln_rows32(h, w, w, False, x, stats[:1], stats[1:], 0, 1, h.size, eps, True)


@nb.njit(nogil=True, cache=True)
def _rotate(src, dst, cos, sin, half):
    # non-interleaved ("rotate half") RoPE of one head: dst may be src
    for i in range(half):
        x1, x2 = src[i], src[i + half]
        dst[i] = cos[i] * x1 - sin[i] * x2
        dst[i + half] = sin[i] * x1 + cos[i] * x2


@nb.njit(parallel=True, nogil=True, cache=True)
def attention_block(h, ln_w, eps, wq, wk, wv, cos, sin, pos, kt, vc, slots, lengths, q, y, scale, fns, nt):
    """One row: ``x = rms_norm(h) * ln_w``; per KV head ``hk`` (dealt to the threads in turn) its
    group's query rows ``wq[hk*g*D:(hk+1)*g*D] @ x`` into ``q`` (1, Hq, 1, D), its key and value
    rows, RoPE at position ``pos[0]``, the key (transposed) and value into cache slot
    ``slots[0]`` (``kt`` (slots, Hkv, D, T), ``vc`` (slots, Hkv, T, D)), then the attention of
    its query heads over the first ``lengths[0]`` positions into ``y`` (1, Hq, 1, D)."""
    Hkv, D = kt.shape[1], kt.shape[2]
    g = q.shape[1] // Hkv
    H = h.size
    half = D // 2
    p = pos[0]
    sl = slots[0]
    c, s = cos[p], sin[p]
    for th in nb.prange(nt):
        prev = MN.set_threads_local(fns[1], 1)
        x = np.empty(H, np.float32)
        _rms(h, ln_w, eps, x)
        kv = np.empty(2 * D, np.float32)
        for hk in range(th, Hkv, nt):
            MN.sgemv(fns[2], g * D, H, wq[hk * g * D:].ctypes.data, H, x.ctypes.data, 0.0, q[0, hk * g].ctypes.data)
            MN.sgemv(fns[2], D, H, wk[hk * D:].ctypes.data, H, x.ctypes.data, 0.0, kv.ctypes.data)
            MN.sgemv(fns[2], D, H, wv[hk * D:].ctypes.data, H, x.ctypes.data, 0.0, kv[D:].ctypes.data)
            for gi in range(g):
                qh = q[0, hk * g + gi, 0]
                _rotate(qh, qh, c, s, half)
            kd = kt[sl, hk]
            for i in range(half):
                x1, x2 = kv[i], kv[i + half]
                kd[i, p] = c[i] * x1 - s[i] * x2
                kd[i + half, p] = s[i] * x1 + c[i] * x2
            vc[sl, hk, p, :] = kv[D:]
            _decode_task(np.int64(hk), q, kt, vc, slots, lengths, y, scale)
        MN.set_threads_local(fns[1], prev)


@nb.njit(nogil=True, cache=True)
def _rows(n, th, nt):
    per = -(-n // nt)
    per = -(-per // 16) * 16  # whole cache lines of output per thread
    lo = min(n, th * per)
    return lo, min(n, lo + per)


@nb.njit(parallel=True, nogil=True, cache=True)
def residual_gemv(w, x, h, fns, nt):
    """``h += w @ x`` (w (N, K) row-major, x (K,), h (N,)), each thread its block of rows."""
    n, k = w.shape
    for th in nb.prange(nt):
        prev = MN.set_threads_local(fns[1], 1)
        lo, hi = _rows(n, th, nt)
        if hi > lo:
            MN.sgemv(fns[2], hi - lo, k, w[lo:].ctypes.data, k, x.ctypes.data, 1.0, h[lo:].ctypes.data)
        MN.set_threads_local(fns[1], prev)


@nb.njit(parallel=True, nogil=True, cache=True)
def mlp_block(h, ln_w, eps, wg, wu, gu, alpha, fns, nt):
    """``x = rms_norm(h) * ln_w``; ``gu = silu_alpha(wg @ x) * (wu @ x)``, each thread its block of
    rows of both projections."""
    n, k = wg.shape
    for th in nb.prange(nt):
        prev = MN.set_threads_local(fns[1], 1)
        x = np.empty(k, np.float32)
        _rms(h, ln_w, eps, x)
        lo, hi = _rows(n, th, nt)
        if hi > lo:
            gate = np.empty(hi - lo, np.float32)
            up = np.empty(hi - lo, np.float32)
            MN.sgemv(fns[2], hi - lo, k, wg[lo:].ctypes.data, k, x.ctypes.data, 0.0, gate.ctypes.data)
            MN.sgemv(fns[2], hi - lo, k, wu[lo:].ctypes.data, k, x.ctypes.data, 0.0, up.ctypes.data)
            swiglu_chunk(gate, up, gu[lo:hi], 0, hi - lo, alpha)
        MN.set_threads_local(fns[1], prev)


@nb.njit(parallel=True, nogil=True, cache=True)
def head_block(h, ln_w, eps, w, logits, fns, nt):
    """``logits = w @ (rms_norm(h) * ln_w)``, each thread its block of the vocabulary's rows."""
    n, k = w.shape
    for th in nb.prange(nt):
        prev = MN.set_threads_local(fns[1], 1)
        x = np.empty(k, np.float32)
        _rms(h, ln_w, eps, x)
        lo, hi = _rows(n, th, nt)
        if hi > lo:
            MN.sgemv(fns[2], hi - lo, k, w[lo:].ctypes.data, k, x.ctypes.data, 0.0, logits[lo:].ctypes.data)
        MN.set_threads_local(fns[1], prev)


__all__ = ["attention_block", "head_block", "mlp_block", "residual_gemv"]
