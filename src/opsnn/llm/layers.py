"""A decoder's layers as one kernel call: the prefill of fresh prompts, a batched decode step.

Op by op, a 128-token prefill of a 12-layer decoder is ~120 kernel launches, and after every
product has streamed megabytes of weights through the caches the interpreter's state is cold:
each launch then costs 200-400 us of dispatch (docs/performance.md, "LLM decoding"); a decode
step of a few rows replays ~13 prepared kernels a layer, each still a Python call. Here one
numba function runs every layer, calling the same kernels the ops pick — MKL's packed panels
(``cblas_sgemm_compute`` by address), the RMSNorm rows, RoPE + the K/V store, attention, SwiGLU
— so the arithmetic and its order are the op path's, and the results equal it.

Per layer, for ``R`` rows ``h`` (R, H), updated in place:

1. ``x = rms_norm(h) * ln1``; ``qkv = x @ [Wq; Wk; Wv].T`` (one packed panel);
2. RoPE of q and k, K/V into the cache; attention: :func:`prefill_layers` (B prompts of S
   tokens from position 0, R = B * S) stacks each KV head's query heads as rows and runs the
   causal attention over the prompt's own keys (:func:`~opsnn.kernels.cpu.attention.gemm_tasks`'
   kernel); :func:`decode_layers` (one token a row) reads each row's cache slot
   (:func:`~.attention.decode_attention`'s kernel);
3. ``h += y @ Wo.T`` (the GEMM adds into ``h``);
4. ``x = rms_norm(h) * ln2``; ``gu = x @ [Wg; Wu].T``; ``h += (silu(g) * u) @ Wd.T``.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from ..kernels.cpu import mkl_nb as MN
from ..kernels.cpu.activation import swiglu_chunk
from ..kernels.cpu.attention import gemm_tasks_parallel
from ..kernels.cpu.norm import norm_rows32
from .attention import decode_attention_parallel, rope_store, rope_store_rows

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


@nb.njit(parallel=True, nogil=True, cache=True)
def _cached_keys(kt, T, out):
    # out[hk, t] = kt[hk, :, t] for t < T: a slot's first T keys, stored transposed, as rows
    Hkv, D = kt.shape[0], kt.shape[1]
    for r in nb.prange(Hkv * T):
        hk, t = r // T, r % T
        for d in range(D):
            out[hk, t, d] = kt[hk, d, t]


@nb.njit(nogil=True, cache=True)
def _attend(qg, k4, v4, yg, s, kvlen, off, scale, bq, fns, nt):
    # causal attention of one prompt's grouped queries (gemm_tasks' kernel, no mask, no logsumexp)
    no_lse = np.empty(1, np.float32)
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
        np.float32(0.0),
        bq,
        fns,
        nt,
        no_lse,
        False,
    )


@nb.njit(nogil=True, cache=True)
def prefill_layers(
    h,
    ln,
    eps,
    panels,
    Hq,
    Hkv,
    D,
    ff,
    cos,
    sin,
    pos,
    kcs,
    vcs,
    slots,
    bounds,
    starts,
    cslots,
    scale,
    bq,
    blocks,
    fns,
    nt_mkl,
    nt,
    bufs,
):
    """Every layer of prompt chunks (module docstring) on ``h`` (R, H) in place: chunk ``c`` is
    rows ``bounds[c] .. bounds[c + 1] - 1`` at positions ``starts[c]`` on of cache slot
    ``cslots[c]``; a chunk from position 0 attends over its own keys, a continued one over its
    slot's cache up to its end (keys copied out as rows first). Attention runs a task per KV head
    and block of query rows: ``blocks`` blocks a chunk (1 where the KV heads alone keep the
    threads busy), each a batch entry of the kernel over the same keys (its own causal range).

    ``ln`` (layers, 2, H): the two norms' weights; ``panels`` (layers, 4) int64: addresses of the
    MKL panels (:data:`QKV`, :data:`O`, :data:`GATE_UP`, :data:`DOWN`: the weights stacked along N
    and packed transposed, ``x @ W.T``); ``kcs``/``vcs``: the cache's per-layer key (transposed) and
    value arrays, row ``r`` stored at position ``pos[r]`` of slot ``slots[r]``; ``fns``:
    :func:`opsnn.kernels.cpu.mkl_nb.addresses`; ``nt_mkl``: MKL's thread count for the products,
    ``nt`` numba's; ``bufs``: scratch (x, qkv, qg, yg, y, gu, act, scores, keys) as
    :func:`prefill_scratch` makes them."""
    x, qkv, qg, yg, y, gu, act, s, kb = bufs
    R = h.shape[0]
    nh, g = Hq + 2 * Hkv, Hq // Hkv
    prev = MN.set_threads_local(fns[1], nt_mkl)
    for i in range(panels.shape[0]):
        _normed_qkv(h, x, qkv, ln[i, 0], eps, panels[i, QKV], fns, nt)
        q3 = qkv.reshape(R, nh, D)
        rope_store_rows(q3[:, :Hq], q3[:, Hq : Hq + Hkv], q3[:, Hq + Hkv :], cos, sin, pos, kcs[i], vcs[i], slots)
        for c in range(bounds.size - 1):
            a, n, st = bounds[c], bounds[c + 1] - bounds[c], starts[c]
            T = st + n
            blk = -(-n // min(blocks, n))
            nbk = -(-n // blk)
            kvlen, off = np.empty(nbk, np.int64), np.empty(nbk, np.int64)
            for b in range(nbk):  # block b: rows b * blk .. at positions st + b * blk .., keys up to its end
                off[b] = st + b * blk
                kvlen[b] = st + min((b + 1) * blk, n)
            qgc = qg[: nbk * Hq * blk * D].reshape(nbk, Hkv, g * blk, D)
            ygc = yg[: nbk * Hq * blk * D].reshape(nbk, Hkv, g * blk, D)
            sc = s[: nbk * Hq * blk * T].reshape(nbk, Hq, blk, T)
            if nbk * blk > n:  # the last block's pad rows: zeros in, ignored out
                qgc[nbk - 1] = 0.0
            _group_heads(q3[a : a + n, :Hq], qgc, blk)
            if st == 0:  # a whole prompt: over its own keys and values, in the projection's output
                q4 = q3[a : a + n].reshape(1, n, nh, D)
                k4, v4 = q4[:, :, Hq : Hq + Hkv].transpose((0, 2, 1, 3)), q4[:, :, Hq + Hkv :].transpose((0, 2, 1, 3))
            else:  # a continued chunk: over its slot's first T positions (its own keys stored above)
                sl = cslots[c]
                k4 = kb[: Hkv * T * D].reshape(1, Hkv, T, D)
                _cached_keys(kcs[i][sl], T, k4[0])
                v4 = vcs[i][sl : sl + 1, :, :T]
            shape = (nbk, Hkv, T, D)
            _attend(
                qgc, np.broadcast_to(k4, shape), np.broadcast_to(v4, shape), ygc, sc, kvlen, off, scale, bq, fns, nt
            )
            _ungroup_heads(ygc, y[a : a + n], blk)
        _output_and_mlp(h, y, x, gu, act, ln[i, 1], eps, panels[i], ff, fns, nt)
    MN.set_threads_local(fns[1], prev)


@nb.njit(nogil=True, cache=True)
def _normed_qkv(h, x, qkv, w, eps, panel, fns, nt):
    # x = rms_norm(h) * w; qkv = x @ [Wq; Wk; Wv].T
    R, H = h.shape
    n = qkv.shape[1]
    _rms_rows(h, w, eps, x, nt)
    MN.sgemm_packed(fns[3], R, n, H, x.ctypes.data, H, panel, n, 0.0, qkv.ctypes.data, n)


@nb.njit(nogil=True, cache=True)
def _output_and_mlp(h, y, x, gu, act, w, eps, panels, ff, fns, nt):
    # h += y @ Wo.T; x = rms_norm(h) * w; h += (silu(g) * u) @ Wd.T with [g, u] = x @ [Wg; Wu].T
    R, H = h.shape
    K = y.shape[1]
    MN.sgemm_packed(fns[3], R, H, K, y.ctypes.data, K, panels[O], H, 1.0, h.ctypes.data, H)
    _rms_rows(h, w, eps, x, nt)
    MN.sgemm_packed(fns[3], R, 2 * ff, H, x.ctypes.data, H, panels[GATE_UP], 2 * ff, 0.0, gu.ctypes.data, 2 * ff)
    _swiglu_rows(gu, act, ff)
    MN.sgemm_packed(fns[3], R, H, ff, act.ctypes.data, ff, panels[DOWN], H, 1.0, h.ctypes.data, H)


@nb.njit(nogil=True, cache=True)
def decode_layers(
    h, ln, eps, panels, Hq, Hkv, D, ff, cos, sin, pos, kcs, vcs, slots, lengths, rows, scale, fns, nt_mkl, nt, bufs
):
    """One decode step of R rows (one token each) through every layer (module docstring) on
    ``h`` (R, H) in place: row ``r`` at position ``pos[r]`` of slot ``slots[r]``, attending its
    first ``lengths[r]`` cache positions (0: an idle pad row, zeros); the first ``rows`` rows
    store their K/V. Arguments as :func:`prefill_layers`'; ``bufs`` (x, qkv, y, gu, act) as
    :func:`decode_scratch` makes them."""
    x, qkv, y, gu, act = bufs
    R = h.shape[0]
    nh = Hq + 2 * Hkv
    prev = MN.set_threads_local(fns[1], nt_mkl)
    for i in range(panels.shape[0]):
        _normed_qkv(h, x, qkv, ln[i, 0], eps, panels[i, QKV], fns, nt)
        q3 = qkv.reshape(R, nh, D)
        rope_store(q3[:, :Hq], q3[:, Hq : Hq + Hkv], q3[:, Hq + Hkv :], cos, sin, pos, kcs[i], vcs[i], slots, rows)
        q4 = qkv.reshape(R, nh, 1, D)[:, :Hq]
        decode_attention_parallel(q4, kcs[i], vcs[i], slots, lengths, y.reshape(R, Hq, 1, D), scale, nt)
        _output_and_mlp(h, y, x, gu, act, ln[i, 1], eps, panels[i], ff, fns, nt)
    MN.set_threads_local(fns[1], prev)


def prefill_scratch(
    R: int, longest: int, scores: int, keys: int, H: int, Hq: int, Hkv: int, D: int, ff: int, alloc
) -> tuple:
    """:func:`prefill_layers`' scratch buffers for ``R`` rows whose longest chunk has ``longest``,
    ``scores`` elements for the largest chunk's scores and ``keys`` positions for the longest
    continued chunk's cache keys, each ``alloc(shape, tag)`` (float32). Query blocks pad a
    chunk's rows by less than one block: twice the rows is room enough."""
    return (
        alloc((R, H), "llm prefill norm"),
        alloc((R, (Hq + 2 * Hkv) * D), "llm prefill qkv"),
        alloc((2 * Hq * longest * D,), "llm prefill grouped queries"),
        alloc((2 * Hq * longest * D,), "llm prefill attention"),
        alloc((R, Hq * D), "llm prefill attention output"),
        alloc((R, 2 * ff), "llm prefill gate/up"),
        alloc((R, ff), "llm prefill swiglu"),
        alloc((max(2 * scores, 1),), "llm prefill scores"),
        alloc((max(Hkv * keys * D, 1),), "llm prefill cached keys"),
    )


def decode_scratch(R: int, H: int, Hq: int, Hkv: int, D: int, ff: int, alloc) -> tuple:
    """:func:`decode_layers`' scratch buffers, each ``alloc(shape, tag)`` (float32)."""
    return (
        alloc((R, H), "llm decode norm"),
        alloc((R, (Hq + 2 * Hkv) * D), "llm decode qkv"),
        alloc((R, Hq * D), "llm decode attention"),
        alloc((R, 2 * ff), "llm decode gate/up"),
        alloc((R, ff), "llm decode swiglu"),
    )


__all__ = ["DOWN", "GATE_UP", "O", "QKV", "decode_layers", "decode_scratch", "prefill_layers", "prefill_scratch"]
