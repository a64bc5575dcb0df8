"""CPU attention kernels: a tiled flash-style numba kernel, the masked softmax of the BLAS
("gemm") kernel and its one-region form on MKL (``gemm_tasks``), rotary embedding.

``flash_attention`` never materialises the ``Sq x T`` score matrix: each task owns one
``(batch, q_head, query block)`` and streams the keys in blocks of ``BK`` with an online
softmax (running max ``m``, running sum ``l``, rescaled fp32 accumulator), so memory is
``O(BQ * (BK + Dv))`` per thread. Key blocks that the causal frontier, the sliding window
or ``nonpad_kv_seqlen`` rule out entirely are skipped. GQA maps query head ``h`` to key
head ``h // (Hq // Hkv)`` without repeating K/V. A row that no key may attend (its mask
all ``-inf``) yields zeros, as ONNX specifies: decided on the masks, not the scores, so a NaN
score (an Inf query times a zero scale, +inf + -inf) in such a row still gives zeros.

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
#: float32 bits: |x| (the sign cleared), the smallest |x| of an Inf or a NaN, -inf
_ABS_BITS32, _INF_BITS32, _NEG_INF_BITS32 = np.uint32(0x7FFFFFFF), 0x7F800000, np.uint32(0xFF800000)


@nb.njit(nogil=True, cache=True, fastmath=_FM)
def _attend_task(
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
    lse,
    has_lse,
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
    live = np.zeros(nq, np.bool_)  # some key's bias is not -inf (else the row is zeros, NaN scores or not)

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
                    mv = mask[mb, mh, i * ms_on, j]
                    sc += mv
                    if mv != -np.inf:
                        live[ii] = True
                else:
                    live[ii] = True
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
        if nan_row[ii] and live[ii]:
            inv = np.float32(np.nan)
        i = i0 + ii
        if has_lse:  # the row's logsumexp of its masked scores, as AttentionGrad reads it
            lse[(b * Hq + h) * Sq + i] = (
                np.float32(np.nan)
                if nan_row[ii] or l[ii] != l[ii]  # a NaN score, or an +inf one (inf - inf)
                else m[ii] + np.float32(math.log(l[ii]))
                if l[ii] > 0
                else m[ii]
            )
        for dd in range(Dv):
            if y_bshd:
                y[b, i, h, dd] = acc[ii, dd] * inv
            else:
                y[b, h, i, dd] = acc[ii, dd] * inv


@nb.njit(parallel=True, nogil=True, cache=True)
def flash_parallel(
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
    lse,
    has_lse,
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
            lse,
            has_lse,
        )


@nb.njit(nogil=True, cache=True)
def flash_serial(
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
    lse,
    has_lse,
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
            lse,
            has_lse,
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


@nb.njit(nogil=True, cache=True)
def _softmax_rows(s, b, h, i, n, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, lse, has_lse):
    """``n`` consecutive rows of the (B, Hq, Sq, T) scores in place (:func:`_softmax_vec`), from
    query ``i`` of head ``h``, batch ``b`` on (past a head's last query, to the next head's
    first); each row's logsumexp into the flat ``lse`` when ``has_lse``. The position is kept as
    counters: three divisions a row cost a third of a 128-key row's softmax."""
    Hq, Sq = s.shape[1], s.shape[2]
    for _ in range(n):
        m = _softmax_vec(s[b, h, i], b, h, i, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap)
        if has_lse:
            lse[(b * Hq + h) * Sq + i] = m
        i += 1
        if i == Sq:
            i = 0
            h += 1
            if h == Hq:
                h = 0
                b += 1


@nb.njit(nogil=True, cache=True, fastmath=_FM)
def _softmax_vec(row, b, h, i, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap):
    """The scores ``row`` of query ``i`` of head ``h``, batch ``b`` over keys ``0 .. row.size - 1``
    in place: scale, softcap, masks (-inf where a key may not be attended), then softmax, in
    one pass over a row that stays in L1 (the float32 exp is the activation kernels' vectorized
    ``fexp``). A row no key may attend becomes zeros; a NaN score makes its row NaN. The same
    rules as ``_attend_task``; keys past ``row.size`` must be ones the row may not attend.
    Returns the row's logsumexp of its masked scores (-inf with no key, NaN for a NaN row)."""
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
        return np.float32(-np.inf)
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
        if t != t and has_mask:  # unless every key's bias is -inf: ONNX zeros such a row, NaN scores or not
            mrow = mask[mb, mh, mi, lo:hi]
            dead = True
            for j in range(seg.size):
                if mrow[j] != -np.inf:
                    dead = False
                    break
            if dead:
                t = zero
        seg[:] = np.float32(np.nan) if t != t else zero
        return np.float32(np.nan) if t != t else np.float32(-np.inf)
    tot = zero
    for j in range(seg.size):
        e = fexp(seg[j] - rowmax)
        seg[j] = e
        tot += e
    if tot > 0 or tot != tot:  # a NaN score makes the whole row NaN, as softmax does
        inv = np.float32(1.0) / tot
        for j in range(seg.size):
            seg[j] *= inv
    return rowmax + np.float32(math.log(tot)) if tot > 0 else np.float32(np.nan) if tot != tot else rowmax


#: rows of the scores per task of the parallel masked softmax
SOFTMAX_TASK_ROWS = 16


@nb.njit(nogil=True, cache=True)
def _softmax_block(t, s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, lse, has_lse):
    # task t: rows [t, t + 1) * SOFTMAX_TASK_ROWS of the B * Hq * Sq rows, across heads and batches
    B, Hq, Sq = s.shape[0], s.shape[1], s.shape[2]
    r = t * SOFTMAX_TASK_ROWS
    n = min(SOFTMAX_TASK_ROWS, B * Hq * Sq - r)
    i, bh = r % Sq, r // Sq
    _softmax_rows(
        s, bh // Hq, bh % Hq, i, n, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, lse, has_lse
    )


@nb.njit(parallel=True, nogil=True, cache=True)
def _softmax_parallel(s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, lse, has_lse):
    rows = s.shape[0] * s.shape[1] * s.shape[2]
    for t in nb.prange((rows + SOFTMAX_TASK_ROWS - 1) // SOFTMAX_TASK_ROWS):
        _softmax_block(t, s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, lse, has_lse)


@nb.njit(nogil=True, cache=True)
def _softmax_serial(s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, lse, has_lse):
    rows = s.shape[0] * s.shape[1] * s.shape[2]
    for t in range((rows + SOFTMAX_TASK_ROWS - 1) // SOFTMAX_TASK_ROWS):
        _softmax_block(t, s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, lse, has_lse)


def masked_softmax(s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, parallel, lse=None):
    """Softmax over the last dim of the (B, Hq, Sq, T) fp32 scores, in place, with the masking
    rules of the flash kernel; one numba pass per row (12x128x128: 240 -> ~60 us, measured
    against the earlier shift / numpy exp / normalize passes). ``lse``, a flat (B*Hq*Sq,) fp32
    array, receives the rows' logsumexp when given."""
    (_softmax_parallel if parallel else _softmax_serial)(
        s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, *lse_arg(lse)
    )


_NO_LSE = np.zeros(1, np.float32)


def lse_arg(lse) -> tuple:
    """(array, wanted) for the kernels' optional flat logsumexp output."""
    return (_NO_LSE, False) if lse is None else (lse, True)


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
def _gemm_task(
    t, q4, k4, v4, y4, s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, bq, fns, lse, has_lse
):
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
    # one loop for both forms, so that each helper (the softmax above all) is inlined once
    blocked = causal and bq < Sq
    G, S, step = (g, Sq, bq) if blocked else (1, rows, max(rows, 1))  # unblocked: the whole group at once
    for gi in range(G):
        for i0 in range(0, S, step):
            n = min(step, S - i0)
            r = gi * S + i0
            hb = L
            if causal:  # a block's last row attends up to position i0 + n - 1 (unblocked: Sq - 1)
                hb = max(0, min(hb, (i0 + n if blocked else Sq) + offset[b]))
            if hb > 0:
                _gemm_rows(q4, k4, sv, b, hk, r, n, hb, fns)
                _softmax_rows(
                    s,
                    b,
                    hk * g + r // Sq,
                    r % Sq,
                    n,
                    mask,
                    has_mask,
                    kvlen,
                    offset,
                    causal,
                    left,
                    right,
                    scale,
                    softcap,
                    lse,
                    has_lse,
                )
            elif has_lse:  # no key: the rows' logsumexp is -inf
                for rr in range(r, r + n):
                    lse[r0 + rr] = np.float32(-np.inf)
            _gemm_out(v4, y4, sv, b, hk, r, n, hb, fns)  # (no key: zeros, the scores unread)


@nb.njit(parallel=True, nogil=True, cache=True)
def gemm_tasks_parallel(
    q4, k4, v4, y4, s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, bq, fns, nt, lse, has_lse
):
    """:func:`gemm_tasks`' parallel form, for numba callers (the LLM decoder's fused prefill): ``bq``
    an int64 (no blocking: a huge one), ``nt`` the thread count, ``lse`` / ``has_lse`` as
    :func:`lse_arg` returns them."""
    n = q4.shape[0] * q4.shape[1]
    for th in nb.prange(nt):  # thread th takes tasks th, th + nt, ...
        prev = MN.set_threads_local(fns[1], 1)
        for t in range(th, n, nt):
            _gemm_task(
                t,
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
                lse,
                has_lse,
            )
        MN.set_threads_local(fns[1], prev)


@nb.njit(nogil=True, cache=True)
def _gemm_tasks_serial(
    q4, k4, v4, y4, s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, bq, fns, lse, has_lse
):
    prev = MN.set_threads_local(fns[1], 1)
    for t in range(q4.shape[0] * q4.shape[1]):
        _gemm_task(
            t,
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
            lse,
            has_lse,
        )
    MN.set_threads_local(fns[1], prev)


def gemm_tasks(
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
    parallel,
    fns,
    bq: int = 0,
    lse=None,
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
    (``kvlen``) are never multiplied. ``lse``, a flat (B*Hq*Sq,) fp32 array, receives the rows'
    logsumexp when given."""
    bq = np.int64(bq if bq > 0 else 1 << 62)
    lse, has_lse = lse_arg(lse)
    if parallel:
        gemm_tasks_parallel(
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
            lse,
            has_lse,
        )
    else:
        _gemm_tasks_serial(
            q4, k4, v4, y4, s, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, bq, fns, lse, has_lse
        )


# -- the "gemm_tiled" kernel: blocks of query rows on per-thread score tiles --------------------------
@nb.njit(nogil=True, cache=True)
def _tile_task(
    t,
    q4,
    k4,
    k_t,
    v4,
    y4,
    sc,
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
    lse,
    has_lse,
):
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
            if has_lse:
                lse[(b * Hq + h) * Sq + rr] = np.float32(-np.inf)
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
        m = _softmax_vec(sc[rr, :hb], b, h, i0 + rr, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap)
        if has_lse:
            lse[(b * Hq + h) * Sq + i0 + rr] = m
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
    q4,
    k4,
    k_t,
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
    bq,
    fns,
    nt,
    lse,
    has_lse,
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
                lse,
                has_lse,
            )
        MN.set_threads_local(fns[1], prev)


def gemm_tiled(
    q4, k4, k_t, v4, y4, tiles, mask, has_mask, kvlen, offset, causal, left, right, scale, softcap, bq, fns, lse=None
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
    ``tiles.shape[0]`` threads. ``lse``, a flat (B*Hq*Sq,) fp32 array, receives the rows'
    logsumexp when given."""
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
        *lse_arg(lse),
    )


#: below this many multiply-adds (Sq*T*D summed over batch and heads) run the serial variant
PARALLEL_MIN = 1 << 18

#: query rows per block of :func:`gemm_tasks` under a causal mask (each block's products stop at
#: its last position)
CAUSAL_BLOCK_ROWS = 64


def num_threads() -> int:
    return nb.get_num_threads()


def tasks_balance(tasks: int) -> bool:
    """Whether ``tasks`` (batch x KV heads) one-thread tasks of :func:`gemm_tasks` keep the threads
    evenly busy: a whole number of rounds, or enough rounds that the last one's gap is small (one
    batch of one KV head would run on a single thread; the batched products split it instead)."""
    nt = num_threads()
    return tasks >= nt and (tasks % nt == 0 or tasks >= 3 * nt)


def flash_tiles(B: int, Hq: int, Sq: int, threads: int) -> tuple[int, int]:
    """Query/key block sizes: 64 x 64, with smaller query blocks when there are too few
    ``(batch, head)`` pairs to keep every thread busy."""
    BQ = 64
    while BQ > 8 and B * Hq * -(-Sq // BQ) < 2 * threads:
        BQ //= 2
    return max(1, min(BQ, Sq)), 64


# -- rotary embedding -----------------------------------------------------------------------------
@nb.njit(nogil=True, cache=True)
def _rotary_position(x2, cr, sr, y2, interleaved, rot):
    # the (N, Dh) heads of one position, its first rot dims rotated in pairs (interleaved or
    # halves), the rest copied; views made once per position, not per head (a view costs its
    # reference count), the inner loops on unit strides where x is contiguous
    half = rot // 2
    N, Dh = x2.shape
    for n in range(N):
        if interleaved:
            for kk in range(half):
                c, sn = cr[kk], sr[kk]
                x1, xx = x2[n, 2 * kk], x2[n, 2 * kk + 1]
                y2[n, 2 * kk] = c * x1 - sn * xx
                y2[n, 2 * kk + 1] = sn * x1 + c * xx
        else:
            for kk in range(half):
                c, sn = cr[kk], sr[kk]
                x1, xx = x2[n, kk], x2[n, kk + half]
                y2[n, kk] = c * x1 - sn * xx
                y2[n, kk + half] = sn * x1 + c * xx
        for dd in range(rot, Dh):
            y2[n, dd] = x2[n, dd]


@nb.njit(nogil=True, cache=True)
def _rotary_at(x, cos, sin, y, bnsd, interleaved, rot, b, s):
    cb = b if cos.shape[0] > 1 else 0
    if bnsd:
        _rotary_position(x[b, :, s], cos[cb, s], sin[cb, s], y[b, :, s], interleaved, rot)
    else:
        _rotary_position(x[b, s], cos[cb, s], sin[cb, s], y[b, s], interleaved, rot)


@nb.njit(parallel=True, nogil=True, cache=True)
def rotary_parallel(x, cos, sin, y, bnsd, interleaved, rot):
    S = x.shape[2] if bnsd else x.shape[1]
    for t in nb.prange(x.shape[0] * S):
        _rotary_at(x, cos, sin, y, bnsd, interleaved, rot, t // S, t % S)


@nb.njit(nogil=True, cache=True)
def rotary_serial(x, cos, sin, y, bnsd, interleaved, rot):
    S = x.shape[2] if bnsd else x.shape[1]
    for t in range(x.shape[0] * S):
        _rotary_at(x, cos, sin, y, bnsd, interleaved, rot, t // S, t % S)


def rotary_numpy(x, cos, sin, y, bnsd, interleaved, rot):
    """:func:`rotary_serial` in numpy, the same float32 arithmetic: nothing to compile, a cold
    plan's kernel while the numba one compiles in the background (``opsnn.ops.tiering``)."""
    half = rot // 2
    # cos/sin (1 or B, S, >= half) against x's (B, S, N, D) or (B, N, S, D)
    c, s = cos[:, :, :half], sin[:, :, :half]
    c, s = (c[:, None], s[:, None]) if bnsd else (c[:, :, None], s[:, :, None])
    if interleaved:
        i1, i2 = slice(0, rot, 2), slice(1, rot, 2)
    else:
        i1, i2 = slice(0, half), slice(half, rot)
    x1, x2 = x[..., i1], x[..., i2]
    r1, r2 = c * x1 - s * x2, s * x1 + c * x2
    y[..., rot:] = x[..., rot:]
    y[..., i1] = r1
    y[..., i2] = r2


# -- attention backward: flash-style recomputation ---------------------------------------------------
# Tiles are flat float32 arrays with explicit row strides. Their products run on single-threaded MKL
# when fns[0] holds cblas_sgemm's address, else as loops LLVM vectorizes (inner loop along a row).
@nb.njit(nogil=True, cache=True, fastmath=_FM)
def _mm_nt(fns, m, n, k, a, lda, b, ldb, c, ldc):
    # c[:m, :n] = a[:m, :k] @ b[:n, :k].T
    if fns[0] != 0:
        MN.sgemm(
            fns[0], MN.NO_TRANS, MN.TRANS, m, n, k, a.ctypes.data, lda, b.ctypes.data, ldb, 0.0, c.ctypes.data, ldc
        )
        return
    for i in range(m):
        for j in range(n):
            acc = np.float32(0.0)
            for kk in range(k):
                acc += a[i * lda + kk] * b[j * ldb + kk]
            c[i * ldc + j] = acc


@nb.njit(nogil=True, cache=True, fastmath=_FM)
def _mm_nn_acc(fns, m, n, k, a, lda, b, ldb, c, ldc):
    # c[:m, :n] += a[:m, :k] @ b[:k, :n]
    if fns[0] != 0:
        MN.sgemm(
            fns[0], MN.NO_TRANS, MN.NO_TRANS, m, n, k, a.ctypes.data, lda, b.ctypes.data, ldb, 1.0, c.ctypes.data, ldc
        )
        return
    for i in range(m):
        for kk in range(k):
            av = a[i * lda + kk]
            for j in range(n):
                c[i * ldc + j] += av * b[kk * ldb + j]


@nb.njit(nogil=True, cache=True, fastmath=_FM)
def _mm_tn_acc(fns, m, n, k, a, lda, b, ldb, c, ldc):
    # c[:m, :n] += a[:k, :m].T @ b[:k, :n]
    if fns[0] != 0:
        MN.sgemm(
            fns[0], MN.TRANS, MN.NO_TRANS, m, n, k, a.ctypes.data, lda, b.ctypes.data, ldb, 1.0, c.ctypes.data, ldc
        )
        return
    for kk in range(k):
        for i in range(m):
            av = a[kk * lda + i]
            for j in range(n):
                c[i * ldc + j] += av * b[kk * ldb + j]


@nb.njit(nogil=True, cache=True, fastmath=_FM)
def _bw_scores(s, dc, nq, nk, BK, i0, j0, b, h, mask, has_mask, causal, left, right, softcap, exact):
    # a tile's raw scores in place: softcap (dc: its derivative), then the masks; a masked pair
    # (causal, window, a key past the mask, an additive -inf) becomes -inf with dc = -1, which tells it
    # from an attended pair whose score is -inf. exact: the softcap in float64, whose derivative stays
    # above 0 up to a score of ~19 (float32's is 0 from ~9, where 0 x Inf would make a NaN)
    mB, mH, mS, mT = mask.shape
    mb = b if mB > 1 else 0
    mh = h if mH > 1 else 0
    for ii in range(nq):
        i = i0 + ii
        mi = i if mS > 1 else 0
        for jj in range(nk):
            j = j0 + jj
            x = s[ii * BK + jj]
            d = np.float32(1.0)
            if softcap > 0:
                if exact:
                    t64 = math.tanh(np.float64(x) / np.float64(softcap))
                    x = np.float32(np.float64(softcap) * t64)
                    d = np.float32(1.0 - t64 * t64)
                else:
                    t = np.float32(math.tanh(x / softcap))
                    x = softcap * t
                    d = np.float32(1.0) - t * t
            if (causal and j > i) or (left >= 0 and j < i - left) or (right >= 0 and j > i + right):
                x = np.float32(-np.inf)
                d = np.float32(-1.0)
            elif has_mask:
                if j >= mT:
                    x = np.float32(-np.inf)
                    d = np.float32(-1.0)
                else:
                    mv = mask[mb, mh, mi, j]
                    if mv == -np.inf:
                        x = np.float32(-np.inf)
                        d = np.float32(-1.0)
                    else:
                        x = x + mv
            s[ii * BK + jj] = x
            dc[ii * BK + jj] = d


@nb.njit(nogil=True, cache=True)
def _exp_ieee(x):
    # exp(x) with IEEE's answers at the edges: NaN for NaN, +inf for +inf (or an overflow), 0 for -inf
    if x != x or x == np.inf:
        return x
    if x == -np.inf:
        return np.float32(0.0)
    return fexp(x)


@nb.njit(nogil=True, cache=True, fastmath=_FM)
def _bw_probs_exact(s, dp, dc, nq, nk, BK, lse, delta, alive):
    # a tile's P and dS in place as the definition computes them over the whole row: P = exp(x - lse)
    # with x = -inf on masked pairs (NaN there too where the row's logsumexp is NaN or -inf: a NaN
    # softmax row is NaN everywhere, and spreads through dV = P^T dY); P = 0 on a row no key may attend;
    # dS = P (dP - delta) softcap' on attended pairs, exactly 0 on masked ones
    for ii in range(nq):
        m = lse[ii]
        dl = delta[ii]
        live = alive[ii] != 0
        for jj in range(nk):
            k = ii * BK + jj
            p = _exp_ieee(s[k] - m) if live else np.float32(0.0)
            s[k] = p
            if dc[k] < 0:
                dp[k] = np.float32(0.0)
            else:
                dp[k] = p * (dp[k] - dl) * dc[k]


@nb.njit(nogil=True, cache=True, fastmath=_FM)
def _bw_plain_ds(s, dp, lse, delta, nq, nk, BK):
    # P and dS of a tile without masks or softcap (dc 1): the same values as the general loop of
    # _bw_block, with the row's cases outside the element loop so that it vectorizes
    for ii in range(nq):
        m = lse[ii]
        dl = delta[ii]
        srow = s[ii * BK : ii * BK + nk]
        drow = dp[ii * BK : ii * BK + nk]
        if m != m or m == -np.inf:  # NaN logsumexp, or every score -inf: NaN probabilities
            for jj in range(nk):
                srow[jj] = np.float32(np.nan)
                drow[jj] = np.float32(np.nan)
            continue
        for jj in range(nk):
            x = srow[jj]
            p = np.float32(0.0) if x == -np.inf else fexp(x - m)
            srow[jj] = p
            drow[jj] = p * (drow[jj] - dl)


@nb.njit(nogil=True, cache=True, fastmath=_FM)
def _bw_block(
    b, h, hk, Hkv, qb, q, kf, vf, y, dy, lse_in, has_lse, mask, has_mask, causal, left, right, scale, softcap,
    BQ, BK, dq, dk_acc, dv_acc, qs, dos, s, dp, dc, dqa, rows, fns, exact,
):  # fmt: skip
    # block qb of BQ query rows of head h: their dQ rows, and their share of dK, dV added to the
    # task's accumulators dk_acc (T * D), dv_acc (T * Dv). rows: 5 * BQ floats (logsumexp,
    # delta = rowsum(dY * Y), running sum, NaN flag, attended-key flag). exact (an input holds a
    # NaN or an Inf): every key block, masked pairs included, goes through the products as the
    # definition's whole-matrix ones do (0 x Inf = NaN), see _bw_probs_exact
    Sq, D = q.shape[2], q.shape[3]
    Dv = dy.shape[3]
    T = dk_acc.size // D
    i0 = qb * BQ
    i1 = min(i0 + BQ, Sq)
    nq = i1 - i0
    lse, delta, lsum, nanf = rows[:BQ], rows[BQ : 2 * BQ], rows[2 * BQ : 3 * BQ], rows[3 * BQ : 4 * BQ]
    alive = rows[4 * BQ :]
    for ii in range(nq):
        dl = np.float32(0.0)
        for dd in range(D):
            qs[ii * D + dd] = q[b, h, i0 + ii, dd] * scale
            dqa[ii * D + dd] = np.float32(0.0)
        for dd in range(Dv):
            g = dy[b, h, i0 + ii, dd]
            dos[ii * Dv + dd] = g
            dl += g * y[b, h, i0 + ii, dd]
        delta[ii] = dl
    # the keys some row of the block may attend
    j_hi = T
    if causal:
        j_hi = min(j_hi, i1)
    if right >= 0:
        j_hi = min(j_hi, i1 + right)
    if has_mask:
        j_hi = min(j_hi, mask.shape[3])
    j_lo = max(0, i0 - left) if left >= 0 else 0
    if exact:
        j_lo, j_hi = 0, T
    kbase = (b * Hkv + hk) * T  # kf, vf: the (B, Hkv, T, D|Dv) keys and values, flat; this pair's first row
    # no softcap, no masks and finite inputs: the scores are the products themselves and every pair is attended
    plain = softcap <= 0 and not causal and left < 0 and right < 0 and not has_mask and not exact
    if has_lse and not exact:
        for ii in range(nq):
            lse[ii] = lse_in[b, h, i0 + ii]
    else:  # the rows' logsumexp, by streaming the keys once more (running max and sum)
        for ii in range(nq):
            lse[ii] = np.float32(-np.inf)
            lsum[ii] = np.float32(0.0)
            nanf[ii] = np.float32(0.0)
            alive[ii] = np.float32(0.0)
        for j0 in range(j_lo, j_hi, BK):
            nk = min(BK, j_hi - j0)
            _mm_nt(fns, nq, nk, D, qs, D, kf[(kbase + j0) * D :], D, s, BK)
            if not plain:
                _bw_scores(s, dc, nq, nk, BK, i0, j0, b, h, mask, has_mask, causal, left, right, softcap, exact)
            if exact:
                for ii in range(nq):
                    for jj in range(nk):
                        if not dc[ii * BK + jj] < 0:  # attended (dc is NaN where a softcapped score is)
                            alive[ii] = np.float32(1.0)
            for ii in range(nq):
                m_old = lse[ii]
                mx = m_old
                for jj in range(nk):
                    x = s[ii * BK + jj]
                    if x > mx:
                        mx = x
                    elif x != x:
                        nanf[ii] = np.float32(1.0)
                if mx == np.inf:  # exp(inf - inf): the definition's probabilities are NaN
                    nanf[ii] = np.float32(1.0)
                if mx == -np.inf:
                    continue
                tot = lsum[ii] * fexp(m_old - mx) if m_old != -np.inf else np.float32(0.0)
                for jj in range(nk):
                    tot += fexp(s[ii * BK + jj] - mx)
                lsum[ii] = tot
                lse[ii] = mx
        for ii in range(nq):
            if nanf[ii] != 0:
                lse[ii] = np.float32(np.nan)
            elif lse[ii] != -np.inf:
                lse[ii] += np.float32(math.log(lsum[ii]))
        if has_lse:  # exact: the given logsumexp, the stream kept only which rows attend a key
            for ii in range(nq):
                lse[ii] = lse_in[b, h, i0 + ii]
    for j0 in range(j_lo, j_hi, BK):
        nk = min(BK, j_hi - j0)
        kr = kf[(kbase + j0) * D :]
        vr = vf[(kbase + j0) * Dv :]
        _mm_nt(fns, nq, nk, D, qs, D, kr, D, s, BK)  # the scores again
        if not plain:
            _bw_scores(s, dc, nq, nk, BK, i0, j0, b, h, mask, has_mask, causal, left, right, softcap, exact)
        _mm_nt(fns, nq, nk, Dv, dos, Dv, vr, Dv, dp, BK)  # dP = dY V^T
        if exact:
            _bw_probs_exact(s, dp, dc, nq, nk, BK, lse, delta, alive)
        elif plain:
            _bw_plain_ds(s, dp, lse, delta, nq, nk, BK)
        else:
            for ii in range(nq):
                m = lse[ii]
                dl = delta[ii]
                for jj in range(nk):
                    x = s[ii * BK + jj]
                    if dc[ii * BK + jj] < 0:  # a masked pair: no probability and no gradient, whatever dP holds
                        s[ii * BK + jj] = np.float32(0.0)
                        dp[ii * BK + jj] = np.float32(0.0)
                    else:
                        # the definition's exp(x - max): NaN where x or the logsumexp is NaN, or every attended
                        # score of the row is -inf (exp(-inf + inf)); 0 for a -inf score beside finite ones
                        if x != x or m != m or m == -np.inf:
                            p = np.float32(np.nan)
                        elif x == -np.inf:
                            p = np.float32(0.0)
                        else:
                            p = fexp(x - m)
                        s[ii * BK + jj] = p
                        dp[ii * BK + jj] = p * (dp[ii * BK + jj] - dl) * dc[ii * BK + jj]
        _mm_nn_acc(fns, nq, D, nk, dp, BK, kr, D, dqa, D)  # dQ += dS K
        _mm_tn_acc(fns, nk, D, nq, dp, BK, qs, D, dk_acc[j0 * D :], D)  # dK += dS^T (scale Q)
        _mm_tn_acc(fns, nk, Dv, nq, s, BK, dos, Dv, dv_acc[j0 * Dv :], Dv)  # dV += P^T dY
    for ii in range(nq):
        for dd in range(D):
            dq[b, h, i0 + ii, dd] = dqa[ii * D + dd] * scale


@nb.njit(nogil=True, cache=True)
def _bits_max(u, lo, hi, masks):
    # the largest float32 bits with the sign cleared over u[lo:hi]: 0x7F800000 or more where an Inf or
    # a NaN is; masks: -inf (an additive mask's masked pair) reads as 0. An unsigned max LLVM vectorizes
    m = np.uint32(0)
    w = u[lo:hi]  # indexed from 0: numba's wraparound on a range(lo, hi) index blocks vectorizing
    for i in range(w.size):
        v = w[i]
        a = np.uint32(0) if masks and v == _NEG_INF_BITS32 else np.uint32(v & _ABS_BITS32)
        m = np.uint32(max(m, a))
    return m


@nb.njit(nogil=True, cache=True)
def _task_finite(bits, b, hk, Hq, Hkv, Sq, T, D, Dv, has_lse, mshape, has_mask, softcap):
    # whether task (b, KV head hk) may take the fast tiles: no NaN or Inf in its heads' Q and dY, its K,
    # their logsumexp rows, no NaN or +inf in their mask planes (these meet the zeros of masked pairs
    # and skipped blocks, or make a softmax row NaN), nor in V and Y when softcapped (float32's
    # derivative of the softcap is 0 where float64's is not). bits: the inputs' flat float32 bits
    qb, kb, vb, yb, dyb, lb, mb = bits
    g = Hq // Hkv
    h0, kv = b * Hq + hk * g, b * Hkv + hk  # the first query head and the KV head, flat over batches
    m = max(_bits_max(qb, h0 * Sq * D, (h0 + g) * Sq * D, False), _bits_max(kb, kv * T * D, (kv + 1) * T * D, False))
    m = max(m, _bits_max(dyb, h0 * Sq * Dv, (h0 + g) * Sq * Dv, False))
    if softcap > 0:
        m = max(m, _bits_max(vb, kv * T * Dv, (kv + 1) * T * Dv, False))
        m = max(m, _bits_max(yb, h0 * Sq * Dv, (h0 + g) * Sq * Dv, False))
    if has_lse:
        m = max(m, _bits_max(lb, h0 * Sq, (h0 + g) * Sq, False))
    if has_mask:
        mB, mH, mS, mT = mshape
        lo = ((b if mB > 1 else 0) * mH + (hk * g if mH > 1 else 0)) * mS * mT
        m = max(m, _bits_max(mb, lo, lo + (g if mH > 1 else 1) * mS * mT, True))
    return m < _INF_BITS32


@nb.njit(nogil=True, cache=True)
def _bw_thread(
    th, nt, q, kf, vf, y, dy, lse_in, has_lse, mask, has_mask, causal, left, right, scale, softcap,
    BQ, BK, nsplit, dq, dk, dv, part_k, part_v, fns, bits,
):  # fmt: skip
    # thread th of nt takes tasks th, th + nt, ...: task (b, KV head hk, split sp) runs the query
    # blocks u = sp, sp + nsplit, ... of the group's heads (u -> head u // nqb, block u % nqb) into
    # this thread's dK/dV accumulators, then writes them to dK/dV (nsplit 1) or its partial slot;
    # exact tiles where the task's inputs are not all finite (each split decides alike)
    B, Hq, Sq, D = q.shape
    Hkv, T, Dv = dk.shape[1], dk.shape[2], dv.shape[3]
    g = Hq // Hkv
    nqb = (Sq + BQ - 1) // BQ
    qs = np.empty(BQ * D, np.float32)
    dos = np.empty(BQ * Dv, np.float32)
    s = np.empty(BQ * BK, np.float32)
    dp = np.empty(BQ * BK, np.float32)
    dc = np.empty(BQ * BK, np.float32)
    dqa = np.empty(BQ * D, np.float32)
    rows = np.empty(5 * BQ, np.float32)
    dk_acc = np.empty(T * D, np.float32)
    dv_acc = np.empty(T * Dv, np.float32)
    for t in range(th, B * Hkv * nsplit, nt):
        sp = t % nsplit
        hk = (t // nsplit) % Hkv
        b = t // (nsplit * Hkv)
        dk_acc[:] = np.float32(0.0)
        dv_acc[:] = np.float32(0.0)
        exact = not _task_finite(bits, b, hk, Hq, Hkv, Sq, T, D, Dv, has_lse, mask.shape, has_mask, softcap)
        for u in range(sp, g * nqb, nsplit):
            _bw_block(
                b, hk * g + u // nqb, hk, Hkv, u % nqb, q, kf, vf, y, dy, lse_in, has_lse, mask, has_mask,
                causal, left, right, scale, softcap, BQ, BK, dq, dk_acc, dv_acc, qs, dos, s, dp, dc, dqa, rows, fns,
                exact,
            )  # fmt: skip
        for j in range(T):
            for dd in range(D):
                if nsplit == 1:
                    dk[b, hk, j, dd] = dk_acc[j * D + dd]
                else:
                    part_k[sp, b, hk, j, dd] = dk_acc[j * D + dd]
            for dd in range(Dv):
                if nsplit == 1:
                    dv[b, hk, j, dd] = dv_acc[j * Dv + dd]
                else:
                    part_v[sp, b, hk, j, dd] = dv_acc[j * Dv + dd]


@nb.njit(parallel=True, nogil=True, cache=True)
def _bw_parallel(
    q, kf, vf, y, dy, lse_in, has_lse, mask, has_mask, causal, left, right, scale, softcap,
    BQ, BK, nsplit, dq, dk, dv, part_k, part_v, fns, bits, nt,
):  # fmt: skip
    for th in nb.prange(nt):
        prev = MN.set_threads_local(fns[1], 1) if fns[0] != 0 else 0
        _bw_thread(
            th, nt, q, kf, vf, y, dy, lse_in, has_lse, mask, has_mask, causal, left, right, scale, softcap,
            BQ, BK, nsplit, dq, dk, dv, part_k, part_v, fns, bits,
        )  # fmt: skip
        if fns[0] != 0:
            MN.set_threads_local(fns[1], prev)


@nb.njit(nogil=True, cache=True)
def _bw_serial(
    q, kf, vf, y, dy, lse_in, has_lse, mask, has_mask, causal, left, right, scale, softcap,
    BQ, BK, nsplit, dq, dk, dv, part_k, part_v, fns, bits,
):  # fmt: skip
    prev = MN.set_threads_local(fns[1], 1) if fns[0] != 0 else 0
    _bw_thread(
        0, 1, q, kf, vf, y, dy, lse_in, has_lse, mask, has_mask, causal, left, right, scale, softcap,
        BQ, BK, nsplit, dq, dk, dv, part_k, part_v, fns, bits,
    )  # fmt: skip
    if fns[0] != 0:
        MN.set_threads_local(fns[1], prev)


@nb.njit(parallel=True, nogil=True, cache=True)
def _bw_reduce(part_k, part_v, dk, dv):
    # dK, dV = the sums of the splits' partials
    nsplit, B, Hkv, T, D = part_k.shape
    Dv = part_v.shape[4]
    for r in nb.prange(B * Hkv * T):
        j = r % T
        hk = (r // T) % Hkv
        b = r // (T * Hkv)
        for dd in range(D):
            acc = np.float32(0.0)
            for sp in range(nsplit):
                acc += part_k[sp, b, hk, j, dd]
            dk[b, hk, j, dd] = acc
        for dd in range(Dv):
            acc = np.float32(0.0)
            for sp in range(nsplit):
                acc += part_v[sp, b, hk, j, dd]
            dv[b, hk, j, dd] = acc


def scan_bits(*arrays) -> tuple:
    """The float32 ``arrays`` as flat uint32 views (copies where not contiguous), for the tasks' scan
    of :func:`attention_backward` (q, k, v, y, dy, lse, mask)."""
    return tuple(np.ascontiguousarray(a, dtype=np.float32).reshape(-1).view(np.uint32) for a in arrays)


def attention_backward(
    q, k, v, y, dy, lse, mask, has_mask, causal, left, right, scale, softcap, BQ, BK, nsplit, dq, dk, dv,
    part_k, part_v, fns, parallel,
):  # fmt: skip
    """dQ, dK, dV of attention without the score matrix (FlashAttention-2's backward, on the CPU).

    A task per (batch, KV head, split): for each block of ``BQ`` query rows of its GQA group's heads
    (every ``nsplit``-th block), the rows' logsumexp (``lse`` (B, Hq, Sq) when given, else
    recomputed by one streaming pass over the keys), then per block of ``BK`` keys: ``S = (scale Q)
    K^T`` again, ``P = exp(S - lse)``, ``dP = dY V^T``, ``dS = P (dP - rowsum(dY * Y))`` (times
    the softcap's derivative), ``dQ += dS K``, ``dK += dS^T (scale Q)``, ``dV += P^T dY``: five
    products per tile (six without ``lse``), on single-threaded MKL when ``fns`` (:func:`~.mkl_nb.addresses`)
    names it (``fns[0]`` 0: vectorized loops). Key blocks no row of a query block may attend
    (causal frontier, window, a short mask) are skipped. dK/dV go to a per-thread ``(T, D)``
    accumulator, so there are no races: with ``nsplit`` 1 each task owns its (batch, KV head) and
    writes dK/dV directly; else each split writes its partial into ``part_k`` (nsplit, B, Hkv, T,
    D) / ``part_v`` and one parallel pass sums them. Memory: the tiles and accumulators, O(BQ * BK +
    T * d) per thread, plus the partials.

    ``q``, ``y``, ``dy``, ``dq`` (B, Hq, Sq, D|Dv), ``k``, ``v``, ``dk``, ``dv`` (B, Hkv, T, D|Dv): float32
    (``k`` and ``v`` C-contiguous); ``mask``: :func:`masked_softmax`'s rank-4 additive fp32 bias.
    A masked pair's probability and dS are exactly 0 (a NaN or Inf in V never crosses one); a row
    no key may attend gets dQ 0 and gives nothing.

    A task whose inputs hold a NaN or an Inf (its heads' Q, K, dY, logsumexp rows, NaN or +Inf in
    their mask planes, V and Y when softcapped: one read of each, as float32 bits, in the task) takes
    the exact path: every key block of every row (none skipped), the masked pairs' zeros multiplied
    in (``0 x Inf = NaN``, as the definition's whole-matrix products do), a NaN softmax row's
    probabilities NaN on its masked pairs too, the logsumexp recomputed to know which rows attend a
    key, the softcap in float64; so NaN and Inf land where the float64 definition puts them."""
    kf, vf = k.reshape(-1), v.reshape(-1)
    has_lse = lse is not None
    if not has_lse:
        lse = np.zeros((1, 1, 1), np.float32)
    bits = scan_bits(q, k, v, y, dy, lse, mask)
    args = (q, kf, vf, y, dy, lse, has_lse, mask, has_mask, causal, left, right)
    args += (np.float32(scale), np.float32(softcap), np.int64(BQ), np.int64(BK), np.int64(nsplit))
    args += (dq, dk, dv, part_k, part_v, fns, bits)
    if parallel:
        _bw_parallel(*args, np.int64(max(1, min(nb.get_num_threads(), dk.shape[0] * dk.shape[1] * nsplit))))
    else:
        _bw_serial(*args)
    if nsplit > 1:
        _bw_reduce(part_k, part_v, dk, dv)


#: query rows and keys per tile of :func:`attention_backward`
BW_BLOCK_Q = 64
BW_BLOCK_K = 64


def backward_splits(B: int, Hkv: int, units: int, threads: int) -> int:
    """How many ways each (batch, KV head)'s query blocks (``units``) split: 1 when there are
    at least twice as many (batch, KV head) tasks as threads (no partials), else enough
    splits for about two tasks per thread."""
    tasks = B * Hkv
    if threads <= 1 or tasks >= 2 * threads or units <= 1:
        return 1
    return max(1, min(units, -(-2 * threads // max(1, tasks))))
