"""Attention's training forward and backward on bfloat16 storage (``opsnn::AttentionTrain``,
``opsnn::AttentionGrad``): each task widens the bfloat16 rows it reads (a block of query rows,
its KV head's keys and values; for the gradient its group's Q, Y and dY rows) into float32
scratch, runs the float32 kernels' block math on them unchanged (:mod:`.attention`) and rounds
its outputs (Y, dQ, dK, dV) to bfloat16 once, to nearest even; the logsumexp stays float32.
What the fp32 adapter gives, without its whole-tensor float32 copies.

Arrays reach the kernels as uint16 views of the bfloat16 tensors, 4-D ``(B, H, S, D)`` (any
strides; rows are read element by element)."""

from __future__ import annotations

import numba as nb
import numpy as np

from . import mkl_nb as MN
from .attention import _INF_BITS32, _bits_max, _bw_block, _mm_nn_acc, _mm_nt, _softmax_vec, lse_arg
from .gemm import KIND_BF16, _narrow, _widen


# -- forward: attention_gemm_tiled's tasks, (batch, query head, block of bq query rows) ----------------
@nb.njit(nogil=True, cache=True)
def _fwd_task(
    t, q, k, v, y, y_bshd, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, bq, fns, lse, has_lse,
    qu, ku, vu, sc, yu, held,
):  # fmt: skip
    # task t: the block's scores over the keys some row of it may attend (up to the block's last position
    # when causal) by one product into the tile sc, each row's masked softmax (_softmax_vec, as the
    # float32 tiles), the tile times V into float32 rows, rounded into Y. held: (batch, KV head, rows)
    # whose keys and values ku, vu already hold from this thread's previous tasks
    B, Hq, Sq, D = q.shape
    Hkv, T, Dv = k.shape[1], k.shape[2], v.shape[3]
    nblk = (Sq + bq - 1) // bq
    blk = t % nblk
    h = (t // nblk) % Hq
    b = t // (nblk * Hq)
    hk = h // (Hq // Hkv)
    i0 = blk * bq
    n = min(bq, Sq - i0)
    hb = max(0, min(kvlen[b], T))
    if causal:
        hb = max(0, min(hb, i0 + n + offset[b]))
    if hb == 0:
        for ii in range(n):
            dst = y[b, i0 + ii, h] if y_bshd else y[b, h, i0 + ii]
            dst[:] = np.uint16(0)
            if has_lse:
                lse[(b * Hq + h) * Sq + i0 + ii] = np.float32(-np.inf)
        return
    qf, kf, vf, yf = qu.view(np.float32), ku.view(np.float32), vu.view(np.float32), yu.view(np.float32)
    for ii in range(n):
        _widen(q[b, h, i0 + ii], qu[ii * D : (ii + 1) * D], qf[ii * D : (ii + 1) * D], KIND_BF16)
    j0 = held[2] if held[0] == b and held[1] == hk else 0
    for j in range(j0, hb):
        _widen(k[b, hk, j], ku[j * D : (j + 1) * D], kf[j * D : (j + 1) * D], KIND_BF16)
        _widen(v[b, hk, j], vu[j * Dv : (j + 1) * Dv], vf[j * Dv : (j + 1) * Dv], KIND_BF16)
    held[0], held[1], held[2] = b, hk, max(j0, hb)
    _mm_nt(fns, n, hb, D, qf, D, kf, D, sc, T)
    for rr in range(n):
        m = _softmax_vec(
            sc[rr * T : rr * T + hb], b, h, i0 + rr, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap
        )
        if has_lse:
            lse[(b * Hq + h) * Sq + i0 + rr] = m
    yf[: n * Dv] = np.float32(0.0)
    _mm_nn_acc(fns, n, Dv, hb, sc, T, vf, Dv, yf, Dv)
    for ii in range(n):
        dst = y[b, i0 + ii, h] if y_bshd else y[b, h, i0 + ii]
        _narrow(yf[ii * Dv : (ii + 1) * Dv], yu[ii * Dv : (ii + 1) * Dv], dst, KIND_BF16)


@nb.njit(nogil=True, cache=True)
def _fwd_thread(
    th, nt, q, k, v, y, y_bshd, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, bq, fns, lse,
    has_lse,
):  # fmt: skip
    # thread th of nt takes the th-th of nt contiguous runs of tasks on its own scratch: a run holds a
    # KV head's query blocks and heads in a row, whose keys and values it widens once
    B, Hq, Sq, D = q.shape
    T, Dv = k.shape[2], v.shape[3]
    qu = np.empty(bq * D, np.uint32)
    ku = np.empty(T * D, np.uint32)
    vu = np.empty(T * Dv, np.uint32)
    sc = np.empty(bq * T, np.float32)
    yu = np.empty(bq * Dv, np.uint32)
    held = np.full(3, -1, np.int64)
    n = B * Hq * ((Sq + bq - 1) // bq)
    for t in range(th * n // nt, (th + 1) * n // nt):
        _fwd_task(
            t, q, k, v, y, y_bshd, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, bq, fns, lse,
            has_lse, qu, ku, vu, sc, yu, held,
        )  # fmt: skip


@nb.njit(parallel=True, nogil=True, cache=True)
def _fwd_parallel(
    q, k, v, y, y_bshd, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, bq, fns, nt, lse, has_lse
):
    for th in nb.prange(nt):
        prev = MN.set_threads_local(fns[1], 1) if fns[0] != 0 else 0
        _fwd_thread(
            th, nt, q, k, v, y, y_bshd, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, bq, fns,
            lse, has_lse,
        )  # fmt: skip
        if fns[0] != 0:
            MN.set_threads_local(fns[1], prev)


@nb.njit(nogil=True, cache=True)
def _fwd_serial(
    q, k, v, y, y_bshd, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, bq, fns, lse, has_lse
):
    prev = MN.set_threads_local(fns[1], 1) if fns[0] != 0 else 0
    _fwd_thread(
        0, 1, q, k, v, y, y_bshd, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, bq, fns, lse,
        has_lse,
    )  # fmt: skip
    if fns[0] != 0:
        MN.set_threads_local(fns[1], prev)


def attention_bf16(
    q, k, v, y, y_bshd, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, bq, fns, parallel, lse=None
) -> None:
    """Y (and the rows' logsumexp into the flat float32 ``lse`` when given) of attention on bfloat16
    bits: ``q`` (B, Hq, Sq, D), ``k`` (B, Hkv, T, D), ``v`` (B, Hkv, T, Dv) uint16, ``y`` uint16
    (B, Hq, Sq, Dv), or (B, Sq, Hq, Dv) with ``y_bshd``; ``mask``: the float32 kernels' rank-4
    additive bias. A task per (batch, query head, block of ``bq`` rows) widens its query rows and
    its KV head's keys and values up to the block's last attended key into float32 scratch (those
    the thread's previous task of that KV head has not), then
    runs attention_gemm_tiled's tile math (:func:`~.attention.gemm_tiled`: one product into a
    ``(bq, T)`` tile, :func:`~.attention._softmax_vec` per row, the tile times V) on single-threaded
    MKL where ``fns[0]`` names ``cblas_sgemm``, else the backward's vectorized product loops. D >= 1."""
    lse, has_lse = lse_arg(lse)
    args = (q, k, v, y, bool(y_bshd), mask, bool(has_mask), kvlen, offset, bool(causal), np.int64(left))
    args += (np.int64(right), np.float32(scale), np.float32(softcap), np.int64(bq), fns)
    if parallel:
        nt = np.int64(max(1, min(nb.get_num_threads(), q.shape[0] * q.shape[1] * -(-q.shape[2] // bq))))
        _fwd_parallel(*args, nt, lse, has_lse)
    else:
        _fwd_serial(*args, lse, has_lse)


# -- backward: attention_backward's tasks, (batch, KV head, split) -----------------------------------------
@nb.njit(nogil=True, cache=True)
def _widen_rows(src, b, h, hl, i0, i1, dst_u, dst_f):
    # rows src[b, h, i0:i1] -> rows i0:i1 of local head hl of dst ((heads, S, W) floats, row-major)
    S, W = src.shape[2], src.shape[3]
    for i in range(i0, i1):
        o = (hl * S + i) * W
        _widen(src[b, h, i], dst_u[o : o + W], dst_f[o : o + W], KIND_BF16)


@nb.njit(nogil=True, cache=True)
def _bits_max16(src, b, h0, nh):
    # the largest bfloat16 bits with the sign cleared over src[b, h0:h0 + nh]: 0x7F80 or more where an
    # Inf or a NaN is (so exactly where the widened float32 value is one)
    m = np.uint16(0)
    for h in range(h0, h0 + nh):
        for i in range(src.shape[2]):
            row = src[b, h, i]
            for dd in range(row.shape[0]):
                m = max(m, np.uint16(row[dd] & np.uint16(0x7FFF)))
    return m


@nb.njit(nogil=True, cache=True)
def _bw_thread(
    th, nt, q, k, v, y, dy, lse_in, has_lse, mask, has_mask, causal, left, right, scale, softcap,
    BQ, BK, nsplit, dq, dk, dv, part_k, part_v, fns, lbits, mbits,
):  # fmt: skip
    # thread th of nt takes tasks th, th + nt, ...: task (b, KV head hk, split sp) widens its KV head's K
    # and V into scratch, and for each of the float32 kernel's blocks u = sp, sp + nsplit, ... the block's
    # Q, Y, dY rows, runs the block on that scratch as a one-batch, one-KV-head problem (its mask and
    # logsumexp sliced alike), rounds the block's dQ rows into dq, and its dK/dV into dk/dv (nsplit 1)
    # or writes them to its float32 partial slot; exact tiles where the task's inputs are not all
    # finite, as the float32 task decides (every split alike)
    B, Hq, Sq, D = q.shape
    Hkv, T, Dv = k.shape[1], k.shape[2], v.shape[3]
    g = Hq // Hkv
    nqb = (Sq + BQ - 1) // BQ
    mB, mH, mS, mT = mask.shape
    qs = np.empty(BQ * D, np.float32)
    dos = np.empty(BQ * Dv, np.float32)
    s = np.empty(BQ * BK, np.float32)
    dp = np.empty(BQ * BK, np.float32)
    dc = np.empty(BQ * BK, np.float32)
    dqa = np.empty(BQ * D, np.float32)
    rows = np.empty(5 * BQ, np.float32)
    dk_u = np.empty(T * D, np.uint32)
    dv_u = np.empty(T * Dv, np.uint32)
    dk_acc, dv_acc = dk_u.view(np.float32), dv_u.view(np.float32)
    ku, vu = np.empty(T * D, np.uint32), np.empty(T * Dv, np.uint32)
    kw, vw = ku.view(np.float32), vu.view(np.float32)
    qu, dqu = np.empty(g * Sq * D, np.uint32), np.empty(g * Sq * D, np.uint32)
    yu, dyu = np.empty(g * Sq * Dv, np.uint32), np.empty(g * Sq * Dv, np.uint32)
    qf, dqf, yf, dyf = qu.view(np.float32), dqu.view(np.float32), yu.view(np.float32), dyu.view(np.float32)
    q1, dq1 = qf.reshape((1, g, Sq, D)), dqf.reshape((1, g, Sq, D))
    y1, dy1 = yf.reshape((1, g, Sq, Dv)), dyf.reshape((1, g, Sq, Dv))
    for t in range(th, B * Hkv * nsplit, nt):
        sp = t % nsplit
        hk = (t // nsplit) % Hkv
        b = t // (nsplit * Hkv)
        h0 = hk * g
        _widen_rows(k, b, hk, 0, 0, T, ku, kw)
        _widen_rows(v, b, hk, 0, 0, T, vu, vw)
        # the float32 task's scan (_task_finite): the bfloat16 inputs' own bits, the float32 ones' bits
        m16 = max(_bits_max16(q, b, h0, g), _bits_max16(k, b, hk, 1), _bits_max16(dy, b, h0, g))
        if softcap > 0:
            m16 = max(m16, max(_bits_max16(v, b, hk, 1), _bits_max16(y, b, h0, g)))
        m = np.uint32(0)
        if has_lse:
            m = _bits_max(lbits, (b * Hq + h0) * Sq, (b * Hq + h0 + g) * Sq, False)
        mb, mh0, mhn = (b if mB > 1 else 0), (h0 if mH > 1 else 0), (g if mH > 1 else 1)
        if has_mask:
            lo = (mb * mH + mh0) * mS * mT
            m = max(m, _bits_max(mbits, lo, lo + mhn * mS * mT, True))
        exact = not (m < _INF_BITS32 and m16 < np.uint16(0x7F80))
        lb = b if has_lse else 0
        lse1 = lse_in[lb : lb + 1, h0 : h0 + g] if has_lse else lse_in[0:1, 0:1]
        mask1 = mask[mb : mb + 1, mh0 : mh0 + mhn]
        dk_acc[:] = np.float32(0.0)
        dv_acc[:] = np.float32(0.0)
        for u in range(sp, g * nqb, nsplit):
            hl, qb = u // nqb, u % nqb
            i0, i1 = qb * BQ, min(qb * BQ + BQ, Sq)  # the block's rows, all _bw_block reads of Q, Y, dY
            _widen_rows(q, b, h0 + hl, hl, i0, i1, qu, qf)
            _widen_rows(y, b, h0 + hl, hl, i0, i1, yu, yf)
            _widen_rows(dy, b, h0 + hl, hl, i0, i1, dyu, dyf)
            _bw_block(
                0, hl, 0, 1, qb, q1, kw, vw, y1, dy1, lse1, has_lse, mask1, has_mask, causal, left, right, scale,
                softcap, BQ, BK, dq1, dk_acc, dv_acc, qs, dos, s, dp, dc, dqa, rows, fns, exact,
            )  # fmt: skip
            for i in range(i0, i1):
                o = (hl * Sq + i) * D
                _narrow(dqf[o : o + D], dqu[o : o + D], dq[b, h0 + hl, i], KIND_BF16)
        for j in range(T):
            if nsplit == 1:
                _narrow(dk_acc[j * D : (j + 1) * D], dk_u[j * D : (j + 1) * D], dk[b, hk, j], KIND_BF16)
                _narrow(dv_acc[j * Dv : (j + 1) * Dv], dv_u[j * Dv : (j + 1) * Dv], dv[b, hk, j], KIND_BF16)
            else:
                for dd in range(D):
                    part_k[sp, b, hk, j, dd] = dk_acc[j * D + dd]
                for dd in range(Dv):
                    part_v[sp, b, hk, j, dd] = dv_acc[j * Dv + dd]


@nb.njit(parallel=True, nogil=True, cache=True)
def _bw_parallel(
    q, k, v, y, dy, lse_in, has_lse, mask, has_mask, causal, left, right, scale, softcap,
    BQ, BK, nsplit, dq, dk, dv, part_k, part_v, fns, lbits, mbits, nt,
):  # fmt: skip
    for th in nb.prange(nt):
        prev = MN.set_threads_local(fns[1], 1) if fns[0] != 0 else 0
        _bw_thread(
            th, nt, q, k, v, y, dy, lse_in, has_lse, mask, has_mask, causal, left, right, scale, softcap,
            BQ, BK, nsplit, dq, dk, dv, part_k, part_v, fns, lbits, mbits,
        )  # fmt: skip
        if fns[0] != 0:
            MN.set_threads_local(fns[1], prev)


@nb.njit(nogil=True, cache=True)
def _bw_serial(
    q, k, v, y, dy, lse_in, has_lse, mask, has_mask, causal, left, right, scale, softcap,
    BQ, BK, nsplit, dq, dk, dv, part_k, part_v, fns, lbits, mbits,
):  # fmt: skip
    prev = MN.set_threads_local(fns[1], 1) if fns[0] != 0 else 0
    _bw_thread(
        0, 1, q, k, v, y, dy, lse_in, has_lse, mask, has_mask, causal, left, right, scale, softcap,
        BQ, BK, nsplit, dq, dk, dv, part_k, part_v, fns, lbits, mbits,
    )  # fmt: skip
    if fns[0] != 0:
        MN.set_threads_local(fns[1], prev)


@nb.njit(parallel=True, nogil=True, cache=True)
def _bw_reduce(part_k, part_v, dk, dv):
    # dK, dV = the splits' float32 partials summed in split order (the float32 kernel's order), rounded once
    nsplit, B, Hkv, T, D = part_k.shape
    Dv = part_v.shape[4]
    for r in nb.prange(B * Hkv):
        hk = r % Hkv
        b = r // Hkv
        ku, vu = np.empty(D, np.uint32), np.empty(Dv, np.uint32)
        kf, vf = ku.view(np.float32), vu.view(np.float32)
        for j in range(T):
            for dd in range(D):
                acc = np.float32(0.0)
                for sp in range(nsplit):
                    acc += part_k[sp, b, hk, j, dd]
                kf[dd] = acc
            for dd in range(Dv):
                acc = np.float32(0.0)
                for sp in range(nsplit):
                    acc += part_v[sp, b, hk, j, dd]
                vf[dd] = acc
            _narrow(kf, ku, dk[b, hk, j], KIND_BF16)
            _narrow(vf, vu, dv[b, hk, j], KIND_BF16)


def attention_backward_bf16(
    q, k, v, y, dy, lse, mask, has_mask, causal, left, right, scale, softcap, BQ, BK, nsplit, dq, dk, dv,
    part_k, part_v, fns, parallel,
):  # fmt: skip
    """dQ, dK, dV of attention on bfloat16 bits: :func:`~.attention.attention_backward`'s tasks and
    tiles (its arguments, in its order), with ``q``, ``k``, ``v``, ``y``, ``dy`` and the results
    ``dq``, ``dk``, ``dv`` uint16 views (B, H, S, D|Dv) of bfloat16 tensors; ``lse`` (B, Hq, Sq)
    and ``mask`` float32, ``part_k`` / ``part_v`` float32 partials. A task widens only its KV
    head's K and V and its query blocks' Q, Y and dY rows (its NaN/Inf scan reads the bfloat16
    bits); dQ rows are rounded per query block, dK/dV once per task (nsplit 1) or after the
    partials' float32 sum."""
    has_lse = lse is not None
    if not has_lse:
        lse = np.zeros((1, 1, 1), np.float32)
    lbits = np.ascontiguousarray(lse, dtype=np.float32).reshape(-1).view(np.uint32)
    mbits = np.ascontiguousarray(mask, dtype=np.float32).reshape(-1).view(np.uint32)
    args = (q, k, v, y, dy, lse, has_lse, mask, bool(has_mask), bool(causal), np.int64(left), np.int64(right))
    args += (np.float32(scale), np.float32(softcap), np.int64(BQ), np.int64(BK), np.int64(nsplit))
    args += (dq, dk, dv, part_k, part_v, fns, lbits, mbits)
    if parallel:
        _bw_parallel(*args, np.int64(max(1, min(nb.get_num_threads(), dk.shape[0] * dk.shape[1] * nsplit))))
    else:
        _bw_serial(*args)
    if nsplit > 1:
        _bw_reduce(part_k, part_v, dk, dv)
