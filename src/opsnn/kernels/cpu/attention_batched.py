"""Attention's training forward and backward as whole-matrix batched products, for short sequences:
the (batch, KV head) score matrices fit in memory, so the products run as oneDNN batched matmuls
(brgemm, bfloat16 natively) instead of per-tile products, with one pass over each score row between
them (the forward's softmax and logsumexp; the backward's P and dS from the recomputed scores and dP).

With Q's heads grouped under their KV head (``(B, Hkv, G * Sq, D)``, a reshape of contiguous Q),
grouped-query attention needs no repeat: dK and dV sum over the group inside their products.
The arithmetic is the definition's (``_reference_attention_grad``): P = exp(scale * QK^T + mask - lse)
on the pairs a row attends and exp(-inf - lse) elsewhere (0, or NaN for a NaN or -inf logsumexp; a row
the mask leaves no key 0),
dS = P (dP - rowsum(dY Y)) on attended pairs and 0 elsewhere, dQ = scale dS K, dK = scale dS^T Q,
dV = P^T dY; NaN and Inf flow through the products as they do there. The forward's softmax,
masks and logsumexp are the other forward kernels' (``attention.masked_softmax``), so are its
answers on NaN and Inf."""

from __future__ import annotations

import numba as nb
import numpy as np

from . import attention as KA
from . import onednn as KD
from .attention import _exp_ieee
from .gemm import KIND_BF16, _narrow, _widen, f32_to_bf16

F32 = np.float32
#: the most score elements (batch x KV heads x group x Sq x T) the kernel holds: two float32
#: matrices (scores, dP) of this many, plus two bfloat16 copies for bf16 operands
MAX_SCORES = 1 << 23
#: score rows per parallel task of the backward's row pass
ROWS = 16
_NO_MASK = np.zeros((1, 1, 1, 1), np.float32)


@nb.njit(nogil=True, cache=True, inline="always")
def _probs_row(s, dp, lse, di, scale, lim):
    # s: the row's scores -> P; dp: the row's dP -> scale * dS; keys from lim on are not attended
    for j in range(lim):
        p = _exp_ieee(s[j] * scale - lse)
        s[j] = p
        dp[j] = p * (dp[j] - di) * scale
    masked = _exp_ieee(F32(-np.inf) - lse)
    for j in range(lim, s.shape[0]):
        s[j] = masked
        dp[j] = F32(0.0)


@nb.njit(nogil=True, cache=True, inline="always")
def _probs_row_masked(s, dp, lse, di, scale, lim, m):
    # _probs_row under an additive mask row ``m`` (its -inf masks; keys from its length on are masked):
    # a row the mask leaves no key has P = 0, as the definition's
    masked = _exp_ieee(F32(-np.inf) - lse)
    top = min(lim, m.shape[0])
    live = False
    for j in range(top):
        mv = m[j]
        if mv == F32(-np.inf):
            s[j] = masked
            dp[j] = F32(0.0)
        else:
            live = True
            p = _exp_ieee(s[j] * scale + mv - lse)
            s[j] = p
            dp[j] = p * (dp[j] - di) * scale
    for j in range(top, s.shape[0]):
        s[j] = masked
        dp[j] = F32(0.0)
    if not live:
        s[:] = F32(0.0)
        dp[:] = F32(0.0)


@nb.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def probs_grad(s, dp, lse, y, dy, scale, causal, sq, mask, has_mask, hkv):
    """float32: scores ``s`` (N, R, T) -> P and dP ``dp`` -> scale * dS in place, each row r with
    query index r % sq (causal: keys j <= that index), ``lse`` (N, R), ``y`` / ``dy`` (N, R, Dv).
    ``has_mask``: ``mask`` (rank 4, each dim 1 or the (B, Hq, Sq, <= T) extent) is added to the
    scaled scores, its -inf masking; row r of task b is batch b // hkv, query head
    (b % hkv) * (R // sq) + r // sq."""
    n, rows, t = s.shape
    per = -(-rows // ROWS)
    g = rows // sq
    for task in nb.prange(n * per):
        b = task // per
        r0 = (task - b * per) * ROWS
        for r in range(r0, min(rows, r0 + ROWS)):
            yr, gr = y[b, r], dy[b, r]
            di = 0.0
            for d in range(yr.shape[0]):
                di += np.float64(yr[d]) * np.float64(gr[d])
            lim = min(r % sq + 1, t) if causal else t
            if has_mask:
                mb = b // hkv if mask.shape[0] > 1 else 0
                mh = (b % hkv) * g + r // sq if mask.shape[1] > 1 else 0
                mq = r % sq if mask.shape[2] > 1 else 0
                _probs_row_masked(s[b, r], dp[b, r], lse[b, r], F32(di), F32(scale), lim, mask[mb, mh, mq])
            else:
                _probs_row(s[b, r], dp[b, r], lse[b, r], F32(di), F32(scale), lim)


@nb.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def probs_grad_bf16(s, s_u, dp, dp_u, lse, y, dy, scale, causal, sq, p16, ds16):
    """:func:`probs_grad` on bfloat16 ``y`` / ``dy`` (uint16 bits), P and scale * dS also rounded
    once into ``p16`` / ``ds16`` (uint16 bits, (N, R, T)), the products' operands."""
    n, rows, t = s.shape
    dv = y.shape[2]
    per = -(-rows // ROWS)
    for task in nb.prange(n * per):
        b = task // per
        r0 = (task - b * per) * ROWS
        yu = np.empty(dv, np.uint32)
        gu = np.empty(dv, np.uint32)
        yf, gf = yu.view(np.float32), gu.view(np.float32)
        for r in range(r0, min(rows, r0 + ROWS)):
            _widen(y[b, r], yu, yf, KIND_BF16)
            _widen(dy[b, r], gu, gf, KIND_BF16)
            di = 0.0
            for d in range(dv):
                di += np.float64(yf[d]) * np.float64(gf[d])
            lim = min(r % sq + 1, t) if causal else t
            _probs_row(s[b, r], dp[b, r], lse[b, r], F32(di), F32(scale), lim)
            _narrow(s[b, r], s_u[b, r], p16[b, r], KIND_BF16)
            _narrow(dp[b, r], dp_u[b, r], ds16[b, r], KIND_BF16)


def forward_workspace_bytes(n: int, rows: int, t: int, bf16: bool) -> int:
    """Bytes of :func:`forward`'s workspace: the float32 scores and their bf16 copy."""
    return n * rows * t * (6 if bf16 else 4)


def workspace_bytes(n: int, rows: int, t: int, bf16: bool) -> int:
    """Bytes of :func:`backward`'s workspace: the float32 scores and dP, and their bf16 copies."""
    return n * rows * t * (12 if bf16 else 8)


def _in_place(x: np.ndarray, dims: int) -> bool:
    """Whether oneDNN's strided matmul reads or writes ``x`` where it is: a unit stride along one of its
    last ``dims`` dims (2 for an operand read as stored or transposed, 1 for the result), the others
    non-negative whole elements."""
    return x.itemsize in x.strides[-dims:] and all(s >= 0 and s % x.itemsize == 0 for s in x.strides)


def _brgemm(a: np.ndarray, b: np.ndarray, y: np.ndarray):
    """oneDNN's matmul for these views, or None where oneDNN refuses them or would run its reference code."""
    try:
        mm = KD.strided_matmul(a, b, y)
    except KD.OneDnnError:
        return None
    return None if mm.impl.startswith("ref") else mm


def _product(a: np.ndarray, b: np.ndarray, y: np.ndarray) -> None:
    """``y[..] = a[..] @ b[..]`` by oneDNN on the views as they are, else on contiguous copies (and
    through a buffer for ``y``)."""
    a, b = (x if _in_place(x, 2) else np.ascontiguousarray(x) for x in (a, b))
    dst = y if _in_place(y, 1) else np.empty(y.shape, y.dtype)
    mm = _brgemm(a, b, dst)
    if mm is None:
        a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
        dst = y if y.flags.c_contiguous else np.empty(y.shape, y.dtype)
        mm = KD.strided_matmul(a, b, dst)
    mm.run(a, b, dst)
    if dst is not y:
        np.copyto(y, dst)


def _t(x: np.ndarray) -> np.ndarray:
    return np.swapaxes(x, -1, -2)


def _rows(x: np.ndarray, hkv: int) -> np.ndarray:
    """(B, Hq, S, D) as (B, Hkv, G * S, D), a group's heads' rows stacked under their KV head: ``x``
    itself without groups, else a contiguous copy (a strided view cannot stack them)."""
    B, hq, S, D = x.shape
    return x if hq == hkv else np.ascontiguousarray(x).reshape(B, hkv, hq // hkv * S, D)


def _rows_out(x: np.ndarray, hkv: int) -> np.ndarray:
    """Where a (B, Hkv, G * S, D) result for ``x`` (B, Hq, S, D) is written: ``x`` itself without groups,
    else a buffer that :func:`_rows_back` copies into ``x``."""
    B, hq, S, D = x.shape
    return x if hq == hkv else np.empty((B, hkv, hq // hkv * S, D), x.dtype)


def _rows_back(buf: np.ndarray, x: np.ndarray) -> None:
    if buf is not x:
        np.copyto(x, buf.reshape(x.shape))


def forward(q, k, v, rules: tuple, y, lse, ws: np.ndarray) -> None:
    """Softmax attention into ``y`` (B, Hq, Sq, Dv) (a view allowed) and, when ``lse`` is not None, its
    rows' logsumexp into ``lse`` (B, Hq, Sq) float32, from (B, H, S, D) arrays of one dtype (float32 or
    bfloat16; Hkv heads of ``k`` / ``v`` dividing Hq; views read in place), ``ws`` of
    :func:`forward_workspace_bytes`. ``rules``: ``attention.masked_softmax``'s masking arguments (mask,
    has_mask, kvlen, offset, causal, left, right, scale, softcap)."""
    B, hq, sq, d = q.shape
    hkv, t = k.shape[1], k.shape[2]
    rows = hq // hkv * sq
    size = B * hq * sq * t
    s = ws[: 4 * size].view(np.float32)
    _product(_rows(q, hkv), _t(k), s.reshape(B, hkv, rows, t))
    flat = None if lse is None else lse.reshape(-1) if lse.flags.c_contiguous else np.empty(lse.size, np.float32)
    KA.masked_softmax(s.reshape(B, hq, sq, t), *rules, size * d >= KA.PARALLEL_MIN, flat)
    if lse is not None and not lse.flags.c_contiguous:
        np.copyto(lse, flat.reshape(lse.shape))
    p_op = s
    if q.dtype != np.float32:
        p16 = ws[4 * size : 6 * size].view(np.uint16)
        f32_to_bf16(s, s.view(np.uint32), p16)
        p_op = p16.view(q.dtype)
    yr = _rows_out(y, hkv)
    _product(p_op.reshape(B, hkv, rows, t), v, yr)
    _rows_back(yr, y)


def backward(q, k, v, y, dy, lse, causal: bool, scale: float, dq, dk, dv, ws: np.ndarray, mask=None) -> None:
    """dQ, dK, dV of softmax attention into ``dq`` / ``dk`` / ``dv`` from (B, H, S, D) arrays of one
    dtype, float32 or bfloat16 (``q``, ``y``, ``dy``: Hq heads; ``k``, ``v``: Hkv heads dividing Hq;
    views read and written in place), the forward's logsumexp ``lse`` (B, Hq, Sq) and ``ws`` of
    :func:`workspace_bytes`. ``mask``: float32 operands only, an additive float32 mask of rank 4 in
    its own broadcast shape (-inf masks; keys past its last dim are masked), or None."""
    B, hq, sq, d = q.shape
    hkv, t, dv_n = k.shape[1], k.shape[2], v.shape[3]
    n, rows = B * hkv, hq // hkv * sq
    # the row pass reads Y and dY as contiguous rows
    yc, gc = (np.ascontiguousarray(x).reshape(n, rows, dv_n) for x in (y, dy))
    g4, qr = gc.reshape(B, hkv, rows, dv_n), _rows(q, hkv)
    lsec = np.ascontiguousarray(lse, dtype=np.float32).reshape(n, rows)
    size = n * rows * t
    s = ws[: 4 * size].view(np.float32).reshape(n, rows, t)
    dp = ws[4 * size : 8 * size].view(np.float32).reshape(n, rows, t)
    _product(qr, _t(k), s.reshape(B, hkv, rows, t))
    _product(g4, _t(v), dp.reshape(B, hkv, rows, t))
    if q.dtype != np.float32:
        if mask is not None:
            raise ValueError("attention_batched.backward: a mask with bfloat16 operands")
        p16 = ws[8 * size : 10 * size].view(np.uint16).reshape(n, rows, t)
        ds16 = ws[10 * size : 12 * size].view(np.uint16).reshape(n, rows, t)
        probs_grad_bf16(
            s, s.view(np.uint32), dp, dp.view(np.uint32), lsec, yc.view(np.uint16), gc.view(np.uint16),
            scale, causal, sq, p16, ds16,
        )  # fmt: skip
        p_op, ds_op = p16.view(q.dtype), ds16.view(q.dtype)
    else:
        has_mask = mask is not None
        m4 = mask if has_mask else _NO_MASK
        probs_grad(s, dp, lsec, yc, gc, scale, causal, sq, m4, has_mask, hkv)
        p_op, ds_op = s, dp
    p4, ds4 = p_op.reshape(B, hkv, rows, t), ds_op.reshape(B, hkv, rows, t)
    _product(_t(p4), g4, dv)
    dqr = _rows_out(dq, hkv)
    _product(ds4, k, dqr)
    _rows_back(dqr, dq)
    _product(_t(ds4), qr, dk)
