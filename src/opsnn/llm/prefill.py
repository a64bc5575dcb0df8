"""A whole prompt's decoder layers as one kernel call (the prefill of fresh prompts).

Op by op, a 128-token prefill of a 12-layer decoder is ~120 kernel launches, and after every
product has streamed megabytes of weights through the caches the interpreter's state is cold:
each launch then costs 200-400 us of dispatch (docs/performance.md, "LLM decoding"). Here one
numba function runs every layer, calling the same kernels the ops pick — MKL's packed panels
(``cblas_sgemm_compute`` by address), the RMSNorm rows, the RoPE + K/V store, the attention's
one-task-per-KV-head GEMM kernel, SwiGLU — so the arithmetic and its order are the op path's,
and the results equal it.

Per layer, for ``R = B * S`` rows ``h`` (R, H), updated in place:

1. ``x = rms_norm(h) * ln1``; ``qkv = x @ [Wq; Wk; Wv].T`` (one packed panel);
2. RoPE of q and k in place, K/V into the cache (:func:`~.attention.rope_store_rows`);
3. each KV head's query heads stacked as rows, causal attention over the prompt's own keys,
   the output back to (R, Hq * D);
4. ``h += y @ Wo.T`` (the GEMM adds into ``h``);
5. ``x = rms_norm(h) * ln2``; ``gu = x @ [Wg; Wu].T``; ``h += (silu(g) * u) @ Wd.T``.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from ..kernels.cpu import mkl_nb as MN
from ..kernels.cpu.activation import swiglu_chunk
from ..kernels.cpu.attention import gemm_tasks_parallel
from ..kernels.cpu.norm import norm_rows32
from .attention import rope_store_rows

#: panels' columns in :func:`prefill_layers`'s ``panels`` (addresses of MKL packed weights)
QKV, O, GATE_UP, DOWN = 0, 1, 2, 3


@nb.njit(parallel=True, nogil=True, cache=True)
def _rms_rows(h, w, eps, x, nt):
    # x = rms_norm(h) * w, each row as the RMSNormalization op's kernel computes it; rows dealt in runs
    R, H = h.shape
    hf, xf = h.reshape(-1), x.reshape(-1)
    stats = np.empty(2 * R)
    for t in nb.prange(nt):
        norm_rows32(hf, w, w, False, xf, stats[:R], stats[R:], t * R // nt, (t + 1) * R // nt, H, eps, True)


@nb.njit(parallel=True, nogil=True, cache=True)
def _group_heads(q, qg, S):
    # qg[b, hk, gi * S + s] = q[b * S + s, hk * g + gi]: a KV head's query heads stacked as rows
    g = q.shape[1] // qg.shape[1]
    for r in nb.prange(q.shape[0]):
        b, s = r // S, r % S
        for hh in range(q.shape[1]):
            qg[b, hh // g, (hh % g) * S + s] = q[r, hh]


@nb.njit(parallel=True, nogil=True, cache=True)
def _ungroup_heads(yg, y, S):
    # y[b * S + s, hh * D : (hh + 1) * D] = yg[b, hh // g, (hh % g) * S + s]: _group_heads undone
    B, Hkv, rows, D = yg.shape
    g = rows // S
    for r in nb.prange(y.shape[0]):
        b, s = r // S, r % S
        for hh in range(Hkv * g):
            y[r, hh * D : (hh + 1) * D] = yg[b, hh // g, (hh % g) * S + s]


@nb.njit(parallel=True, nogil=True, cache=True)
def _swiglu_rows(gu, out, ff):
    # out = silu(gu[:, :ff]) * gu[:, ff:] (the SwiGLU op's arithmetic), a row per task
    one = np.float32(1.0)
    for r in nb.prange(out.shape[0]):
        swiglu_chunk(gu[r, :ff], gu[r, ff:], out[r], 0, ff, one)


@nb.njit(nogil=True, cache=True)
def prefill_layers(
    h, ln, eps, panels, Hq, Hkv, D, ff, cos, sin, pos, kcs, vcs, slots, kvlen, scale, bq, fns, nt_mkl, nt, S, bufs
):
    """Every layer of B fresh prompts of S tokens (module docstring) on ``h`` (B * S, H) in place.

    ``ln`` (layers, 2, H): the two norms' weights; ``panels`` (layers, 4) int64: addresses of the
    MKL panels (:data:`QKV`, :data:`O`, :data:`GATE_UP`, :data:`DOWN`: the weights stacked along N
    and packed transposed, ``x @ W.T``); ``kcs``/``vcs``: the cache's per-layer key (transposed) and
    value arrays, row ``r`` stored at position ``pos[r]`` of slot ``slots[r]``; ``kvlen`` (B,): S;
    ``fns``: :func:`opsnn.kernels.cpu.mkl_nb.addresses`; ``nt_mkl``: MKL's thread count for the
    products, ``nt`` numba's; ``bufs``: scratch (x, qkv, qg, yg, y, gu, act, scores) as
    :func:`scratch` makes them."""
    x, qkv, qg, yg, y, gu, act, s = bufs
    R, H = h.shape
    B = R // S
    nh = Hq + 2 * Hkv
    off = np.zeros(B, np.int64)
    no_lse = np.empty(1, np.float32)  # the kernel's logsumexp output, not asked for
    zero = np.float32(0.0)
    prev = MN.set_threads_local(fns[1], nt_mkl)
    for i in range(panels.shape[0]):
        _rms_rows(h, ln[i, 0], eps, x, nt)
        MN.sgemm_packed(fns[3], R, nh * D, H, x.ctypes.data, H, panels[i, QKV], nh * D, 0.0, qkv.ctypes.data, nh * D)
        q3 = qkv.reshape(R, nh, D)
        q, k, v = q3[:, :Hq], q3[:, Hq : Hq + Hkv], q3[:, Hq + Hkv :]
        rope_store_rows(q, k, v, cos, sin, pos, kcs[i], vcs[i], slots)
        _group_heads(q, qg, S)
        q4 = qkv.reshape(B, S, nh, D)
        k4 = q4[:, :, Hq : Hq + Hkv].transpose((0, 2, 1, 3))
        v4 = q4[:, :, Hq + Hkv :].transpose((0, 2, 1, 3))
        gemm_tasks_parallel(
            qg,
            k4,
            v4,
            yg,
            s,
            s[:1, :1, :1, :1],
            False,
            kvlen,
            off,
            True,
            -1,
            -1,
            scale,
            zero,
            bq,
            fns,
            nt,
            no_lse,
            False,
        )
        _ungroup_heads(yg, y, S)
        MN.sgemm_packed(fns[3], R, H, Hq * D, y.ctypes.data, Hq * D, panels[i, O], H, 1.0, h.ctypes.data, H)
        _rms_rows(h, ln[i, 1], eps, x, nt)
        MN.sgemm_packed(fns[3], R, 2 * ff, H, x.ctypes.data, H, panels[i, GATE_UP], 2 * ff, 0.0, gu.ctypes.data, 2 * ff)
        _swiglu_rows(gu, act, ff)
        MN.sgemm_packed(fns[3], R, H, ff, act.ctypes.data, ff, panels[i, DOWN], H, 1.0, h.ctypes.data, H)
    MN.set_threads_local(fns[1], prev)


def scratch(B: int, S: int, H: int, Hq: int, Hkv: int, D: int, ff: int, alloc) -> tuple:
    """:func:`prefill_layers`'s scratch buffers, each ``alloc(shape, tag)`` (float32)."""
    R, g = B * S, Hq // Hkv
    return (
        alloc((R, H), "llm prefill norm"),
        alloc((R, (Hq + 2 * Hkv) * D), "llm prefill qkv"),
        alloc((B, Hkv, g * S, D), "llm prefill grouped queries"),
        alloc((B, Hkv, g * S, D), "llm prefill attention"),
        alloc((R, Hq * D), "llm prefill attention output"),
        alloc((R, 2 * ff), "llm prefill gate/up"),
        alloc((R, ff), "llm prefill swiglu"),
        alloc((B, Hq, S, S), "llm prefill scores"),
    )


__all__ = ["DOWN", "GATE_UP", "O", "QKV", "prefill_layers", "scratch"]
