"""CPU attention kernels: a tiled flash-style numba kernel, the masked softmax of the BLAS
("gemm") kernel and its one-region form on MKL (``gemm_tasks``), rotary embedding.

``flash_attention`` never materialises the ``Sq x T`` score matrix: each task owns one
``(batch, q_head, query block)`` and streams the keys in blocks of ``BK`` with an online
softmax (running max ``m``, running sum ``l``, rescaled fp32 accumulator), so memory is
``O(BQ * (BK + Dv))`` per thread. Key blocks that the causal frontier, the sliding window
or ``nonpad_kv_seqlen`` rule out entirely are skipped. GQA maps query head ``h`` to key
head ``h // (Hq // Hkv)`` without repeating K/V. A row that no key may attend (all
``-inf``) yields zeros, as ONNX specifies.

Masks reach the kernel as one fp32 additive bias of rank 4 in its *own* (unbroadcast)
shape: dims of size 1 broadcast through zero index multipliers, and keys at or past the
mask's last dim count as masked (ONNX pads a short mask with ``-inf``).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from . import mkl_nb as MN
from .activation import fexp

#: vectorise dot products (reassociation) but keep IEEE inf semantics for masking
_FM = {"reassoc", "contract", "arcp", "nsz"}


@nb.njit(nogil=True, cache=True, fastmath=_FM)
def _attend_task(
    task, q, k, v, y, y_bshd, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, group, nqb, BQ, BK
):
    B, Hq, Sq, D = q.shape
    T = k.shape[2]
    Dv = v.shape[3]
    qb = task % nqb
    bh = task // nqb
    h = bh % Hq
    b = bh // Hq
    hk = h // group
    i0 = qb * BQ
    i1 = min(i0 + BQ, Sq)
    nq = i1 - i0
    L = min(kvlen[b], T)
    off = offset[b]
    mB, mH, mS, mT = mask.shape
    mb = b if mB > 1 else 0
    mh = h if mH > 1 else 0
    ms_on = 1 if mS > 1 else 0

    kb = k[b, hk]  # (T, D) rows of this KV head
    vb = v[b, hk]
    qs = np.empty((nq, D), np.float32)
    for ii in range(nq):
        for dd in range(D):
            qs[ii, dd] = q[b, h, i0 + ii, dd] * scale
    s = np.empty((nq, BK), np.float32)
    m = np.full(nq, -np.inf, np.float32)
    l = np.zeros(nq, np.float32)
    acc = np.zeros((nq, Dv), np.float32)
    nan_row = np.zeros(nq, np.bool_)  # a NaN score makes its row NaN (softmax semantics)

    # key range any row of this block may see
    j_hi = L
    if causal:
        j_hi = min(j_hi, i1 - 1 + off + 1)
    if right >= 0:
        j_hi = min(j_hi, i1 - 1 + off + right + 1)
    if has_mask:
        j_hi = min(j_hi, mT)
    j_lo = 0
    if left >= 0:
        j_lo = max(0, i0 + off - left)

    for j0 in range(j_lo, j_hi, BK):
        j1 = min(j0 + BK, j_hi)
        nk = j1 - j0
        for jj in range(nk):
            j = j0 + jj
            for ii in range(nq):
                a = np.float32(0.0)
                for dd in range(D):
                    a += qs[ii, dd] * kb[j, dd]
                s[ii, jj] = a
        for ii in range(nq):
            i = i0 + ii
            p_abs = i + off
            rowmax = np.float32(-np.inf)
            for jj in range(nk):
                j = j0 + jj
                sc = s[ii, jj]
                if softcap > 0:
                    sc = np.float32(softcap * math.tanh(sc / softcap))
                if (causal and j > p_abs) or (left >= 0 and j < p_abs - left) or (right >= 0 and j > p_abs + right):
                    sc = np.float32(-np.inf)
                elif has_mask:
                    sc += mask[mb, mh, i * ms_on, j]
                if sc != sc:
                    nan_row[ii] = True
                s[ii, jj] = sc
                if sc > rowmax:
                    rowmax = sc
            m_old = m[ii]
            m_new = max(m_old, rowmax)
            if m_new == -np.inf:
                continue
            corr = np.float32(math.exp(m_old - m_new))
            lsum = l[ii] * corr
            for dd in range(Dv):
                acc[ii, dd] *= corr
            for jj in range(nk):
                p = np.float32(math.exp(s[ii, jj] - m_new))
                if p != 0:
                    lsum += p
                    j = j0 + jj
                    for dd in range(Dv):
                        acc[ii, dd] += p * vb[j, dd]
            l[ii] = lsum
            m[ii] = m_new
    for ii in range(nq):
        inv = np.float32(1.0) / l[ii] if l[ii] > 0 else np.float32(0.0)
        if nan_row[ii]:
            inv = np.float32(np.nan)
        i = i0 + ii
        for dd in range(Dv):
            if y_bshd:
                y[b, i, h, dd] = acc[ii, dd] * inv
            else:
                y[b, h, i, dd] = acc[ii, dd] * inv


@nb.njit(parallel=True, nogil=True, cache=True)
def flash_parallel(
    q, k, v, y, y_bshd, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, group, nqb, BQ, BK
):
    n = q.shape[0] * q.shape[1] * nqb
    for t in nb.prange(n):
        _attend_task(
            np.int64(t),
            q,
            k,
            v,
            y,
            y_bshd,
            mask,
            has_mask,
            kvlen,
            offset,
            causal,
            left,
            right,
            scale,
            softcap,
            group,
            nqb,
            BQ,
            BK,
        )


@nb.njit(nogil=True, cache=True)
def flash_serial(
    q, k, v, y, y_bshd, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, group, nqb, BQ, BK
):
    n = q.shape[0] * q.shape[1] * nqb
    for task in range(n):
        _attend_task(
            task,
            q,
            k,
            v,
            y,
            y_bshd,
            mask,
            has_mask,
            kvlen,
            offset,
            causal,
            left,
            right,
            scale,
            softcap,
            group,
            nqb,
            BQ,
            BK,
        )


@nb.njit(nogil=True, cache=True)
def row_max(seg):
    """max(seg) with eight independent running maxima (one chain is latency-bound at ~4 cycles
    a score: 1536 rows of 128, 97 -> 28 us). A NaN may or may not survive here; the caller's
    exp/sum turns its row into NaN either way."""
    n = seg.size
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = np.float32(-np.inf)
    j = 0
    while j + 8 <= n:
        m0 = max(m0, seg[j])
        m1 = max(m1, seg[j + 1])
        m2 = max(m2, seg[j + 2])
        m3 = max(m3, seg[j + 3])
        m4 = max(m4, seg[j + 4])
        m5 = max(m5, seg[j + 5])
        m6 = max(m6, seg[j + 6])
        m7 = max(m7, seg[j + 7])
        j += 8
    m = max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))
    while j < n:
        m = max(m, seg[j])
        j += 1
    return m


@nb.njit(nogil=True, cache=True, fastmath=_FM)
def _softmax_row(r, s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap):
    """Row ``r`` of the (B, Hq, Sq, T) scores in place (:func:`_softmax_vec`)."""
    B, Hq, Sq, T = s.shape
    i = r % Sq
    h = (r // Sq) % Hq
    b = r // (Sq * Hq)
    _softmax_vec(s[b, h, i], b, h, i, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap)


@nb.njit(nogil=True, cache=True, fastmath=_FM)
def _softmax_vec(row, b, h, i, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap):
    """The scores ``row`` of query ``i`` of head ``h``, batch ``b`` over keys ``0 .. row.size - 1``
    in place: scale, softcap, masks (-inf where a key may not be attended), then softmax, in
    one pass over a row that stays in L1 (the float32 exp is the activation kernels' vectorized
    ``fexp``). A row no key may attend becomes zeros; a NaN score makes its row NaN. The same
    rules as ``_attend_task``; keys past ``row.size`` must be ones the row may not attend."""
    T = row.size
    L = min(kvlen[b], T)
    p_abs = i + offset[b]
    mB, mH, mS, mT = mask.shape
    mb = b if mB > 1 else 0
    mh = h if mH > 1 else 0
    mi = i if mS > 1 else 0
    zero = np.float32(0.0)
    # the keys this row may attend form one range [lo, hi)
    hi = L
    if causal:
        hi = min(hi, p_abs + 1)
    if right >= 0:
        hi = min(hi, p_abs + right + 1)
    if has_mask:
        hi = min(hi, mT)
    lo = max(0, p_abs - left) if left >= 0 else 0
    if hi <= lo:
        row[:] = zero
        return
    row[:lo] = zero
    row[hi:] = zero
    seg = row[lo:hi]
    # branch-free loops (the conditions are hoisted) so that LLVM vectorizes them
    if softcap > 0:
        for j in range(seg.size):
            seg[j] = softcap * math.tanh(seg[j] * scale / softcap)
        if has_mask:
            mrow = mask[mb, mh, mi, lo:hi]
            for j in range(seg.size):
                seg[j] += mrow[j]
    elif has_mask:
        mrow = mask[mb, mh, mi, lo:hi]
        for j in range(seg.size):
            seg[j] = seg[j] * scale + mrow[j]
    else:
        for j in range(seg.size):
            seg[j] *= scale
    rowmax = row_max(seg)
    if rowmax == -np.inf:  # every allowed score is -inf (zeros) or NaN (the row is NaN)
        t = zero
        for j in range(seg.size):
            t += seg[j]
        seg[:] = np.float32(np.nan) if t != t else zero
        return
    tot = zero
    for j in range(seg.size):
        e = fexp(seg[j] - rowmax)
        seg[j] = e
        tot += e
    if tot > 0 or tot != tot:  # a NaN score makes the whole row NaN, as softmax does
        inv = np.float32(1.0) / tot
        for j in range(seg.size):
            seg[j] *= inv


@nb.njit(parallel=True, nogil=True, cache=True)
def _softmax_parallel(s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap):
    for r in nb.prange(s.shape[0] * s.shape[1] * s.shape[2]):
        _softmax_row(r, s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap)


@nb.njit(nogil=True, cache=True)
def _softmax_serial(s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap):
    for r in range(s.shape[0] * s.shape[1] * s.shape[2]):
        _softmax_row(r, s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap)


def masked_softmax(s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, parallel):
    """Softmax over the last dim of the (B, Hq, Sq, T) fp32 scores, in place, with the masking
    rules of the flash kernel; one numba pass per row (12x128x128: 240 -> ~60 us, measured
    against the earlier shift / numpy exp / normalize passes)."""
    (_softmax_parallel if parallel else _softmax_serial)(
        s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap
    )


# -- the "gemm" kernel as one task per (batch, KV head) on MKL --------------------------------------
@nb.njit(nogil=True, cache=True)
def _gemm_rows(q4, k4, s, b, hk, r, n, hb, fns):
    # score rows [r, r + n) of task (b, hk) (s: its (rows, T) scores) over keys [0, hb)
    T, D = k4.shape[2], q4.shape[3]
    MN.sgemm(
        fns[0],
        MN.NO_TRANS,
        MN.TRANS,
        n,
        hb,
        D,
        q4[b, hk, r:].ctypes.data,
        max(q4.strides[2] // 4, D),
        k4[b, hk].ctypes.data,
        max(k4.strides[2] // 4, D),
        0.0,
        s.ctypes.data + 4 * r * T,
        T,
    )


@nb.njit(nogil=True, cache=True)
def _gemm_out(v4, y4, s, b, hk, r, n, hb, fns):
    # y rows [r, r + n) of task (b, hk) = probabilities[:, :hb] @ V[:hb] (zeros when no key is read)
    T, Dv = s.shape[1], v4.shape[3]
    if hb <= 0:
        for rr in range(r, r + n):
            y4[b, hk, rr, :] = np.float32(0.0)
        return
    MN.sgemm(
        fns[0],
        MN.NO_TRANS,
        MN.NO_TRANS,
        n,
        Dv,
        hb,
        s.ctypes.data + 4 * r * T,
        T,
        v4[b, hk].ctypes.data,
        max(v4.strides[2] // 4, Dv),
        0.0,
        y4[b, hk, r:].ctypes.data,
        max(y4.strides[2] // 4, Dv),
    )


@nb.njit(nogil=True, cache=True)
def _gemm_task(t, q4, k4, v4, y4, s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, bq, fns):
    # task t = (b, KV head hk): its query rows (the GQA group's heads stacked) times its keys into the
    # group's score rows, the masked softmax of those rows, then probabilities @ V into its output rows;
    # single-threaded MKL, the scores still in this core's cache for the softmax and the second product.
    # Only keys some row may attend are multiplied: up to the row's length (kvlen), and with a causal
    # mask, per block of bq query rows, up to the block's last position (about half the work of a
    # whole prompt: the products and the softmax skip the masked triangle)
    B, Hkv, rows, D = q4.shape
    T = k4.shape[2]
    Hq, Sq = s.shape[1], s.shape[2]
    g = Hq // Hkv
    b = t // Hkv
    hk = t % Hkv
    sv = s[b, hk * g : (hk + 1) * g].reshape(rows, T)  # the group's score rows, stacked as q4's
    L = max(0, min(kvlen[b], T))
    r0 = (b * Hq + hk * g) * Sq
    if not causal or bq >= Sq:
        hb = L
        if causal:
            hb = max(0, min(hb, Sq + offset[b]))
        if hb > 0:
            _gemm_rows(q4, k4, sv, b, hk, 0, rows, hb, fns)
            for rr in range(rows):
                _softmax_row(r0 + rr, s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap)
        _gemm_out(v4, y4, sv, b, hk, 0, rows, hb, fns)  # (no key: zeros, the scores unread)
        return
    for gi in range(g):
        for i0 in range(0, Sq, bq):
            n = min(bq, Sq - i0)
            r = gi * Sq + i0
            hb = max(0, min(L, i0 + n + offset[b]))  # the block's last row attends up to position i0 + n - 1
            if hb > 0:
                _gemm_rows(q4, k4, sv, b, hk, r, n, hb, fns)
                for rr in range(r, r + n):
                    _softmax_row(r0 + rr, s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap)
            _gemm_out(v4, y4, sv, b, hk, r, n, hb, fns)


@nb.njit(parallel=True, nogil=True, cache=True)
def _gemm_tasks_parallel(
    q4, k4, v4, y4, s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, bq, fns, nt
):
    n = q4.shape[0] * q4.shape[1]
    for th in nb.prange(nt):  # thread th takes tasks th, th + nt, ...
        prev = MN.set_threads_local(fns[1], 1)
        for t in range(th, n, nt):
            _gemm_task(
                t, q4, k4, v4, y4, s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, bq, fns
            )
        MN.set_threads_local(fns[1], prev)


@nb.njit(nogil=True, cache=True)
def _gemm_tasks_serial(q4, k4, v4, y4, s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, bq, fns):
    prev = MN.set_threads_local(fns[1], 1)
    for t in range(q4.shape[0] * q4.shape[1]):
        _gemm_task(t, q4, k4, v4, y4, s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, bq, fns)
    MN.set_threads_local(fns[1], prev)


def gemm_tasks(
    q4, k4, v4, y4, s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, parallel, fns, bq: int = 0
) -> None:
    """The "gemm" attention kernel as one parallel region: a task per (batch, KV head) runs
    ``S = Q K^T`` into its rows of the (B, Hq, Sq, T) scores ``s``, the masked softmax of those
    rows (:func:`masked_softmax`'s rules) and ``Y = S V``, on single-threaded MKL
    (:mod:`.mkl_nb`; ``fns`` its :func:`~.mkl_nb.addresses`); tasks dealt to the threads in turn.
    ``q4`` (B, Hkv, rows, D) with a GQA group's query heads stacked as rows, ``k4`` (B, Hkv, T,
    D), ``v4`` (B, Hkv, T, Dv), ``y4`` (B, Hkv, rows, Dv): float32 views with unit-stride rows
    (BLAS operands as they stand: the head-strided views of (B, S, H*D) tensors qualify).
    Against the batched form (MKL's batch QK^T, a parallel softmax, MKL's batch S V: three
    regions, each splitting small products over the threads), BERT-base's 12 heads x 128 x 64
    on the 2-core AVX-512 VM: 1.03 -> 0.65 ms.

    With a causal mask and ``bq`` > 0 the query rows go in blocks of ``bq``, each multiplied by
    the keys up to its last position only (:data:`CAUSAL_BLOCK_ROWS`); keys past a row's length
    (``kvlen``) are never multiplied."""
    bq = np.int64(bq if bq > 0 else 1 << 62)
    if parallel:
        _gemm_tasks_parallel(
            q4,
            k4,
            v4,
            y4,
            s,
            mask,
            has_mask,
            kvlen,
            offset,
            causal,
            left,
            right,
            scale,
            softcap,
            bq,
            fns,
            nb.get_num_threads(),
        )
    else:
        _gemm_tasks_serial(
            q4, k4, v4, y4, s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, bq, fns
        )


# -- the "gemm_tiled" kernel: blocks of query rows on per-thread score tiles --------------------------
@nb.njit(nogil=True, cache=True)
def _tile_task(t, q4, k4, k_t, v4, y4, sc, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, bq, fns):
    # task t = (b, query head h, block of bq query rows): their scores over the keys some row of
    # the block may attend ([0, kvlen), and with a causal mask up to the block's last position)
    # into this thread's tile sc (bq, T), the masked softmax of each row, then tile @ V into
    # the block's output rows; single-threaded MKL
    B, Hq, Sq, D = q4.shape
    Hkv, T = v4.shape[1], v4.shape[2]
    Dv = v4.shape[3]
    nblk = (Sq + bq - 1) // bq
    blk = t % nblk
    h = (t // nblk) % Hq
    b = t // (nblk * Hq)
    hk = h // (Hq // Hkv)
    i0 = blk * bq
    n = min(bq, Sq - i0)
    hb = max(0, min(kvlen[b], T))
    if causal:
        hb = max(0, min(hb, i0 + n + offset[b]))  # the block's last row attends up to position i0 + n - 1
    if hb == 0:
        for rr in range(i0, i0 + n):
            y4[b, h, rr, :] = np.float32(0.0)
        return
    if k_t:  # keys stored transposed (k4 is (B, Hkv, D, T): a KV cache's layout)
        MN.sgemm(
            fns[0],
            MN.NO_TRANS,
            MN.NO_TRANS,
            n,
            hb,
            D,
            q4[b, h, i0:].ctypes.data,
            max(q4.strides[2] // 4, D),
            k4[b, hk].ctypes.data,
            max(k4.strides[2] // 4, hb),
            0.0,
            sc.ctypes.data,
            T,
        )
    else:
        MN.sgemm(
            fns[0],
            MN.NO_TRANS,
            MN.TRANS,
            n,
            hb,
            D,
            q4[b, h, i0:].ctypes.data,
            max(q4.strides[2] // 4, D),
            k4[b, hk].ctypes.data,
            max(k4.strides[2] // 4, D),
            0.0,
            sc.ctypes.data,
            T,
        )
    for rr in range(n):
        _softmax_vec(sc[rr, :hb], b, h, i0 + rr, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap)
    MN.sgemm(
        fns[0],
        MN.NO_TRANS,
        MN.NO_TRANS,
        n,
        Dv,
        hb,
        sc.ctypes.data,
        T,
        v4[b, hk].ctypes.data,
        max(v4.strides[2] // 4, Dv),
        0.0,
        y4[b, h, i0:].ctypes.data,
        max(y4.strides[2] // 4, Dv),
    )


@nb.njit(parallel=True, nogil=True, cache=True)
def _tiled_parallel(
    q4, k4, k_t, v4, y4, tiles, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, bq, fns, nt
):
    n = q4.shape[0] * q4.shape[1] * ((q4.shape[2] + bq - 1) // bq)
    for th in nb.prange(nt):  # thread th takes tasks th, th + nt, ... on its own tile
        prev = MN.set_threads_local(fns[1], 1)
        for t in range(th, n, nt):
            _tile_task(
                t,
                q4,
                k4,
                k_t,
                v4,
                y4,
                tiles[th],
                mask,
                has_mask,
                kvlen,
                offset,
                causal,
                left,
                right,
                scale,
                softcap,
                bq,
                fns,
            )
        MN.set_threads_local(fns[1], prev)


def gemm_tiled(
    q4, k4, k_t, v4, y4, tiles, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, bq, fns
) -> None:
    """Attention by GEMM without the whole score matrix: a task per (batch, query head, block of
    ``bq`` query rows) multiplies the block by the keys some of its rows may attend into the
    running thread's ``(bq, T)`` tile of ``tiles`` (``(threads, bq, T)`` float32), takes each row's
    masked softmax (:func:`masked_softmax`'s rules) and multiplies the tile by V into the
    block's rows of ``y4``; MKL single-threaded inside a task (``fns``: :func:`~.mkl_nb.addresses`).
    ``q4`` (B, Hq, Sq, D), ``k4`` (B, Hkv, T, D) or with ``k_t`` its transpose (B, Hkv, D, T) (a
    KV cache's keys, read in place), ``v4`` (B, Hkv, T, Dv), ``y4`` (B, Hq, Sq, Dv): float32 views
    with unit-stride rows (head-strided views of (B, S, H*D) tensors qualify). Its
    memory is the tiles, ``threads * bq * T`` floats: O(N d) with ``bq <= d``. Uses at most
    ``tiles.shape[0]`` threads."""
    nt = max(1, min(tiles.shape[0], nb.get_num_threads()))
    _tiled_parallel(
        q4,
        k4,
        bool(k_t),
        v4,
        y4,
        tiles,
        mask,
        has_mask,
        kvlen,
        offset,
        causal,
        left,
        right,
        scale,
        softcap,
        np.int64(bq),
        fns,
        nt,
    )


#: below this many multiply-adds (Sq*T*D summed over batch and heads) run the serial variant
PARALLEL_MIN = 1 << 18

#: query rows per block of :func:`gemm_tasks` under a causal mask (each block's products stop at
#: its last position)
CAUSAL_BLOCK_ROWS = 64


def num_threads() -> int:
    return nb.get_num_threads()


def flash_tiles(B: int, Hq: int, Sq: int, threads: int) -> tuple[int, int]:
    """Query/key block sizes: 64 x 64, with smaller query blocks when there are too few
    ``(batch, head)`` pairs to keep every thread busy."""
    BQ = 64
    while BQ > 8 and B * Hq * -(-Sq // BQ) < 2 * threads:
        BQ //= 2
    return max(1, min(BQ, Sq)), 64


# -- rotary embedding -----------------------------------------------------------------------------
@nb.njit(nogil=True, cache=True)
def _rotary_row(x, cos, sin, y, bnsd, interleaved, rot, b, s, n):
    half = rot // 2
    Dh = x.shape[3]
    cb = b if cos.shape[0] > 1 else 0
    for kk in range(half):
        c = cos[cb, s, kk]
        sn = sin[cb, s, kk]
        if interleaved:
            i1, i2 = 2 * kk, 2 * kk + 1
        else:
            i1, i2 = kk, kk + half
        if bnsd:
            x1, x2 = x[b, n, s, i1], x[b, n, s, i2]
            y[b, n, s, i1] = c * x1 - sn * x2
            y[b, n, s, i2] = sn * x1 + c * x2
        else:
            x1, x2 = x[b, s, n, i1], x[b, s, n, i2]
            y[b, s, n, i1] = c * x1 - sn * x2
            y[b, s, n, i2] = sn * x1 + c * x2
    for dd in range(rot, Dh):
        if bnsd:
            y[b, n, s, dd] = x[b, n, s, dd]
        else:
            y[b, s, n, dd] = x[b, s, n, dd]


@nb.njit(parallel=True, nogil=True, cache=True)
def rotary_parallel(x, cos, sin, y, bnsd, interleaved, rot):
    if bnsd:
        B, N, S = x.shape[0], x.shape[1], x.shape[2]
    else:
        B, S, N = x.shape[0], x.shape[1], x.shape[2]
    for t in nb.prange(B * S):
        r = np.int64(t)
        b = r // S
        s = r % S
        for n in range(N):
            _rotary_row(x, cos, sin, y, bnsd, interleaved, rot, b, s, n)


@nb.njit(nogil=True, cache=True)
def rotary_serial(x, cos, sin, y, bnsd, interleaved, rot):
    if bnsd:
        B, N, S = x.shape[0], x.shape[1], x.shape[2]
    else:
        B, S, N = x.shape[0], x.shape[1], x.shape[2]
    for r in range(B * S):
        b = r // S
        s = r % S
        for n in range(N):
            _rotary_row(x, cos, sin, y, bnsd, interleaved, rot, b, s, n)
