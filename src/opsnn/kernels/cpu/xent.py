"""CPU kernels (numba) for the softmax family's training ops: SoftmaxCrossEntropyLoss forward, its
fused backward (SoftmaxCrossEntropyLossGrad), and the SoftmaxGrad / LogSoftmaxGrad rows.

Cross entropy views the scores as ``(N, C, D)`` with ``C`` the class axis; a row is one
position's ``C`` scores (contiguous when ``D == 1``, the language-model head's case, else read
with stride ``D``). Rows run in parallel (serial below ``PARALLEL_MIN_COSTLY`` elements).

Forward, per row, one pass over memory: per chunk of ``SOFTMAX_CHUNK`` scores the chunk max
updates the running max ``m`` (the running sum rescaled by ``exp(m_old - m)``), the chunk's
exps go to a chunk-sized scratch and their sum joins the row sum ``s``. The loss is
``-((x[label] - m) - log s) * w[label]``. Accumulation: exps and chunk sums (at most
``SOFTMAX_CHUNK`` terms, vectorized) in the data's dtype, the row sum ``s``, ``log s``, the loss
and the reduction in float64: ``log s`` is then within one rounding of the float32 exps it sums,
and a mean over thousands of rows adds no float32 error of its own. ``log_prob``, when asked
for, is written by a second pass over the row (still in cache): ``(x - m) - log s``.

Backward, per row: the statistics pass leaves ``exp(x - m_c)`` in the output row (``m_c`` the
running max after chunk ``c``, kept per chunk), the write pass scales each chunk by
``exp(m_c - m) / s * coef`` and subtracts ``coef`` at the label: ``(softmax - onehot) * coef``
with one exp per score and no (N, C) temporaries. ``coef`` is ``dLoss`` (per position for
reduction ``none``) times the label's weight, over the summed weights for ``mean``. Ignored
positions contribute nothing and get a zero row (their scores are not read), as in torch.

NaN and Inf follow ``exp(x - max) / sum``: a NaN score, a +inf score, or a row of -inf
scores makes that row's loss and gradient NaN.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba as nb
import numpy as np

from .activation import (
    PARALLEL_MIN_COSTLY,
    SOFTMAX_CHUNK,
    _chunk_max,
    _chunk_sum,
    _exp_shifted,
    _row_stats,
    fexp,
)

_NJIT = dict(nogil=True, cache=True, error_model="numpy", fastmath={"contract"})
#: reductions only add: "reassoc" lets them vectorize (the exps are computed in loops without it)
_REDUCE = dict(_NJIT, fastmath={"reassoc", "nsz"})
#: lanes of a strided (inner > 1) softmax-backward work item
GRAD_BLOCK = 64


# -- labels -> per-position class and weight ----------------------------------------------------------------
@nb.njit(**_NJIT)
def position_weights(labels, weights, has_weights, ignore, has_ignore, C, lab, wrow):
    """Fill ``lab`` (the class, -1 where ignored) and ``wrow`` (the class weight, 0 where ignored)
    per position; return the position of the first label outside [0, C) that is not ignored, or -1."""
    for r in range(labels.size):
        c = labels[r]
        if has_ignore and c == ignore:
            lab[r] = -1
            wrow[r] = 0.0
            continue
        if c < 0 or c >= C:
            return r
        lab[r] = c
        wrow[r] = weights[c] if has_weights else 1.0
    return -1


# -- forward ----------------------------------------------------------------------------------------------
@nb.njit(**_NJIT)
def _row_lse(xr, buf):
    """(max, sum of exp(x - max)) of the row ``xr`` in one pass; ``buf`` holds one chunk's exps."""
    n = xr.size
    m = xr.dtype.type(-np.inf)
    s = 0.0
    for c0 in range(0, n, SOFTMAX_CHUNK):
        c1 = min(c0 + SOFTMAX_CHUNK, n)
        xs = xr[c0:c1]
        cm = _chunk_max(xs)
        if cm > m:
            s *= math.exp(m - cm)
            m = cm
        es = buf[: c1 - c0]
        _exp_shifted(xs, m, es)
        s += _chunk_sum(es)
    if m == np.inf:
        s = np.nan
    return m, s


@nb.njit(**_NJIT)
def _xent_row(xr, lr, label, w, write_logp, buf):
    """The loss of one row (float64; 0 where ignored) and, if asked, its log-probabilities in ``lr``."""
    if label < 0 and not write_logp:
        return 0.0
    m, s = _row_lse(xr, buf)
    lse = math.log(s)
    if write_logp:
        mm = xr.dtype.type(m)
        lse_t = xr.dtype.type(lse)
        for k in range(xr.size):
            lr[k] = (xr[k] - mm) - lse_t  # x - m is exact near the max, where m + log s would round
    if label < 0:
        return 0.0
    return -((float(xr[label]) - float(m)) - lse) * w


@nb.njit(**_NJIT)
def _xent_item(x3, l3, lab, wrow, loss, write_logp, r, buf):
    D = x3.shape[2]
    n = r // D
    d = r - n * D
    loss[r] = _xent_row(x3[n, :, d], l3[n, :, d], lab[r], wrow[r], write_logp, buf)


@nb.njit(**_NJIT)
def _xent_item2(x2, l2, lab, wrow, loss, write_logp, r, buf):
    loss[r] = _xent_row(x2[r], l2[r], lab[r], wrow[r], write_logp, buf)


@nb.njit(**_NJIT)
def xent_rows_serial(x2, l2, x3, l3, lab, wrow, loss, write_logp):
    """Per-position losses into ``loss``: rows of ``x2`` (N, C) when it is non-empty, else of ``x3`` (N, C, D)."""
    buf = np.empty(SOFTMAX_CHUNK, x3.dtype)
    for r in range(lab.size):
        if x2.shape[0]:
            _xent_item2(x2, l2, lab, wrow, loss, write_logp, r, buf)
        else:
            _xent_item(x3, l3, lab, wrow, loss, write_logp, r, buf)


@nb.njit(parallel=True, **_NJIT)
def xent_rows_parallel(x2, l2, x3, l3, lab, wrow, loss, write_logp):
    for r in nb.prange(lab.size):
        buf = np.empty(SOFTMAX_CHUNK, x3.dtype)
        if x2.shape[0]:
            _xent_item2(x2, l2, lab, wrow, loss, write_logp, r, buf)
        else:
            _xent_item(x3, l3, lab, wrow, loss, write_logp, r, buf)


# -- backward ---------------------------------------------------------------------------------------------
@nb.njit(**_NJIT)
def _xent_grad_row(xr, gr, label, coef, cms):
    """gr = (softmax(xr) - onehot(label)) * coef; a zero row where the position is ignored.
    Returns the row's (max, sum of exp(x - max)) as float64."""
    if label < 0:
        for k in range(gr.size):
            gr[k] = 0.0
        return 0.0, 1.0
    m, s = _row_stats(xr, gr, cms)
    n = gr.size
    c = label // SOFTMAX_CHUNK
    p_label = gr[label] * (math.exp(cms[c] - m) / s)
    for c in range(cms.size):
        ys = gr[c * SOFTMAX_CHUNK : min((c + 1) * SOFTMAX_CHUNK, n)]
        f = ys.dtype.type(math.exp(cms[c] - m) / s * coef)
        for k in range(ys.size):
            ys[k] *= f
    # (p - 1) * coef, not p * coef - coef: no cancellation near p = 1, and -inf (not NaN) for an infinite coef
    gr[label] = (p_label - 1.0) * coef
    return float(m), s


@nb.njit(**_NJIT)
def _grad_item(x2, g2, x3, g3, lab, coef, r, cms):
    if x2.shape[0]:
        _xent_grad_row(x2[r], g2[r], lab[r], coef[r], cms)
        return
    D = x3.shape[2]
    n = r // D
    d = r - n * D
    _xent_grad_row(x3[n, :, d], g3[n, :, d], lab[r], coef[r], cms)


@nb.njit(**_NJIT)
def xent_grad_serial(x2, g2, x3, g3, lab, coef, nch):
    """dScores rows: of ``x2`` / ``g2`` (N, C) when non-empty, else of ``x3`` / ``g3`` (N, C, D)."""
    cms = np.empty(nch, np.float64)
    for r in range(lab.size):
        _grad_item(x2, g2, x3, g3, lab, coef, r, cms)


@nb.njit(parallel=True, **_NJIT)
def xent_grad_parallel(x2, g2, x3, g3, lab, coef, nch):
    for r in nb.prange(lab.size):
        cms = np.empty(nch, np.float64)
        _grad_item(x2, g2, x3, g3, lab, coef, r, cms)


# -- forward and backward in one pass (a compiled training step: loss, then its gradient) ------------------
@nb.njit(**_NJIT)
def _xent_loss_grad_row(xr, gr, label, w, coef, cms):
    """The row's loss as ``_xent_row`` gives it (float64; 0 where ignored) and ``gr`` as
    ``_xent_grad_row`` writes it, from one statistics pass (the exps summed where ``gr`` lies, so
    the row sum may differ from the forward's by the order of a vectorized sum: an ulp or so)."""
    if label < 0:
        for k in range(gr.size):
            gr[k] = 0.0
        return 0.0
    x_label = float(xr[label])
    m, s = _xent_grad_row(xr, gr, label, coef, cms)
    return -((x_label - m) - math.log(s)) * w


@nb.njit(**_NJIT)
def _loss_grad_item(x2, g2, x3, g3, lab, wrow, coef, loss, r, cms):
    if x2.shape[0]:
        loss[r] = _xent_loss_grad_row(x2[r], g2[r], lab[r], wrow[r], coef[r], cms)
        return
    D = x3.shape[2]
    n = r // D
    d = r - n * D
    loss[r] = _xent_loss_grad_row(x3[n, :, d], g3[n, :, d], lab[r], wrow[r], coef[r], cms)


@nb.njit(**_NJIT)
def xent_loss_grad_serial(x2, g2, x3, g3, lab, wrow, coef, loss, nch):
    """Per-position losses into ``loss`` and dScores rows, as xent_rows_* and xent_grad_* give them."""
    cms = np.empty(nch, np.float64)
    for r in range(lab.size):
        _loss_grad_item(x2, g2, x3, g3, lab, wrow, coef, loss, r, cms)


@nb.njit(parallel=True, **_NJIT)
def xent_loss_grad_parallel(x2, g2, x3, g3, lab, wrow, coef, loss, nch):
    for r in nb.prange(lab.size):
        cms = np.empty(nch, np.float64)
        _loss_grad_item(x2, g2, x3, g3, lab, wrow, coef, loss, r, cms)


class XentPlan(NamedTuple):
    """One cross-entropy launch: ``rows`` positions of ``C`` classes (``D`` positions per sample),
    ``parallel`` over rows, ``nch`` chunk maxima per row in the backward."""

    rows: int
    C: int
    D: int
    parallel: bool
    nch: int


def xent_plan(shape: tuple) -> XentPlan:
    N, C = int(shape[0]), int(shape[1])
    D = math.prod(shape[2:])
    rows = N * D
    parallel = rows * C >= PARALLEL_MIN_COSTLY and rows > 1 and nb.get_num_threads() > 1
    return XentPlan(rows, C, D, parallel, -(-C // SOFTMAX_CHUNK))


_EMPTY2 = {np.dtype(np.float32): np.empty((0, 0), np.float32), np.dtype(np.float64): np.empty((0, 0), np.float64)}


def _views(x: np.ndarray, plan: XentPlan, y: np.ndarray | None):
    """(x2, y2, x3, y3): the (N, C) views when D == 1 (else empty), the (N, C, D) views always."""
    x3 = x.reshape(x.shape[0], plan.C, plan.D)
    y3 = x3 if y is None else y.reshape(x3.shape)
    if plan.D == 1:
        return x3.reshape(x3.shape[:2]), y3.reshape(x3.shape[:2]), x3, y3
    e = _EMPTY2[x.dtype]
    return e, e, x3, y3


def xent_positions(op: str, labels: np.ndarray, weights, ignore, C: int) -> tuple:
    """(class per position, -1 where ignored; weight per position, float64); a label outside
    [0, C) that is not ``ignore`` raises ParamInvalidError naming it and its position."""
    from ...errors import ParamInvalidError

    flat = labels.reshape(-1).astype(np.int64, copy=False)
    lab = np.empty(flat.size, np.int64)
    wrow = np.empty(flat.size, np.float64)
    has_w = weights is not None
    w = weights.astype(np.float64, copy=False) if has_w else np.empty(0, np.float64)
    bad = position_weights(flat, w, has_w, 0 if ignore is None else int(ignore), ignore is not None, C, lab, wrow)
    if bad >= 0:
        pos = tuple(int(p) for p in np.unravel_index(bad, labels.shape))
        also = "" if ignore is None else f" (or equal ignore_index {int(ignore)})"
        raise ParamInvalidError(
            f"{op}: targets must lie in [0, {C}){also}, got {int(flat[bad])} at position {pos}", op=op
        )
    return lab, wrow


def _reduce_loss(loss: np.ndarray, wrow: np.ndarray, reduction: str, out_loss: np.ndarray) -> None:
    """The per-position losses into ``out_loss`` as ``reduction`` says (mean: over the summed weights)."""
    if reduction == "none":
        out_loss[...] = loss.reshape(out_loss.shape)
    elif reduction == "sum":
        out_loss[...] = loss.sum()
    else:
        with np.errstate(invalid="ignore", divide="ignore"):
            out_loss[...] = loss.sum() / wrow.sum()


def xent_forward(x, labels, weights, ignore, reduction: str, plan: XentPlan, out_loss, out_logp, op: str) -> None:
    lab, wrow = xent_positions(op, labels, weights, ignore, plan.C)
    loss = np.zeros(plan.rows, np.float64)
    write = out_logp is not None
    if x.size and plan.rows:
        x2, l2, x3, l3 = _views(x, plan, out_logp)
        (xent_rows_parallel if plan.parallel else xent_rows_serial)(x2, l2, x3, l3, lab, wrow, loss, write)
    _reduce_loss(loss, wrow, reduction, out_loss)


def _coefficients(dloss, lab, wrow, reduction: str) -> np.ndarray:
    """Per position: dLoss (per position for ``none``) times the label's weight, over the summed
    weights for ``mean``."""
    g = dloss.astype(np.float64).reshape(-1)
    if reduction == "none":
        return g * wrow
    coef = wrow * g[0]
    if reduction == "mean" and (lab >= 0).any():  # with none, every row is ignored and zero
        with np.errstate(invalid="ignore", divide="ignore"):
            coef /= wrow.sum()  # valid positions of zero weight only: 0 / 0, NaN as torch's
    return coef


def xent_loss_and_backward(
    dloss, x, labels, weights, ignore, reduction: str, plan: XentPlan, out_loss, out, op: str
) -> None:
    """xent_forward's loss (no log_prob) and xent_backward's dScores from one pass over the scores."""
    lab, wrow = xent_positions(op, labels, weights, ignore, plan.C)
    loss = np.zeros(plan.rows, np.float64)
    if out.size and plan.rows:
        coef = _coefficients(dloss, lab, wrow, reduction)
        x2, g2, x3, g3 = _views(x, plan, out)
        run = xent_loss_grad_parallel if plan.parallel else xent_loss_grad_serial
        run(x2, g2, x3, g3, lab, wrow, coef, loss, plan.nch)
    _reduce_loss(loss, wrow, reduction, out_loss)


def xent_backward(dloss, x, labels, weights, ignore, reduction: str, plan: XentPlan, out, op: str) -> None:
    lab, wrow = xent_positions(op, labels, weights, ignore, plan.C)
    if out.size == 0:
        return
    coef = _coefficients(dloss, lab, wrow, reduction)
    x2, g2, x3, g3 = _views(x, plan, out)
    (xent_grad_parallel if plan.parallel else xent_grad_serial)(x2, g2, x3, g3, lab, coef, plan.nch)


# -- SoftmaxGrad / LogSoftmaxGrad ---------------------------------------------------------------------------
@nb.njit(**_REDUCE)
def _dot(a, b):
    s = 0.0
    for k0 in range(0, a.size, SOFTMAX_CHUNK):
        k1 = min(k0 + SOFTMAX_CHUNK, a.size)
        part = a.dtype.type(0.0)
        for k in range(k0, k1):
            part += a[k] * b[k]
        s += part
    return s


@nb.njit(**_NJIT)
def _softmax_grad_row(dy, y, dx, log):
    """softmax: dx = y (dy - sum(dy y)); log-softmax: dx = dy - exp(y) sum(dy)."""
    if log:
        t = dy.dtype.type(_chunk_sums(dy))
        for k in range(dx.size):
            dx[k] = dy[k] - fexp(y[k]) * t
    else:
        t = dy.dtype.type(_dot(dy, y))
        for k in range(dx.size):
            dx[k] = y[k] * (dy[k] - t)


@nb.njit(**_REDUCE)
def _chunk_sums(a):
    s = 0.0
    for k0 in range(0, a.size, SOFTMAX_CHUNK):
        s += _chunk_sum(a[k0 : min(k0 + SOFTMAX_CHUNK, a.size)])
    return s


@nb.njit(**_NJIT)
def _softmax_grad_block(dy, y, dx, base, n, inner, w, log):
    """Rows base..base+w of the inner dim, read along the axis with stride ``inner`` (lanes
    contiguous): the sums across lanes first, then the write."""
    t = np.zeros(w, np.float64)
    for k in range(n):
        o = base + k * inner
        if log:
            for j in range(w):
                t[j] += dy[o + j]
        else:
            for j in range(w):
                t[j] += dy[o + j] * y[o + j]
    tt = np.empty(w, dy.dtype)
    for j in range(w):
        tt[j] = t[j]
    for k in range(n):
        o = base + k * inner
        if log:
            for j in range(w):
                dx[o + j] = dy[o + j] - fexp(y[o + j]) * tt[j]
        else:
            for j in range(w):
                dx[o + j] = y[o + j] * (dy[o + j] - tt[j])


@nb.njit(**_NJIT)
def _softmax_grad_item(dy, y, dx, it, n, inner, nblocks, log):
    if inner == 1:
        lo = it * n
        _softmax_grad_row(dy[lo : lo + n], y[lo : lo + n], dx[lo : lo + n], log)
        return
    o = it // nblocks
    j0 = (it % nblocks) * GRAD_BLOCK
    _softmax_grad_block(dy, y, dx, o * n * inner + j0, n, inner, min(GRAD_BLOCK, inner - j0), log)


@nb.njit(**_NJIT)
def softmax_grad_serial(dy, y, dx, items, n, inner, nblocks, log):
    for it in range(items):
        _softmax_grad_item(dy, y, dx, it, n, inner, nblocks, log)


@nb.njit(parallel=True, **_NJIT)
def softmax_grad_parallel(dy, y, dx, items, n, inner, nblocks, log):
    for it in nb.prange(items):
        _softmax_grad_item(dy, y, dx, it, n, inner, nblocks, log)


class SoftmaxGradPlan(NamedTuple):
    """``items`` work items (rows when ``inner == 1``, else blocks of ``GRAD_BLOCK`` lanes, ``nblocks``
    per outer index) of ``n`` steps along the axis; ``parallel`` or serial."""

    items: int
    n: int
    inner: int
    nblocks: int
    log: bool
    parallel: bool


def softmax_grad_plan(shape: tuple, axis: int, log: bool) -> SoftmaxGradPlan:
    outer, n, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])
    nblocks = 1 if inner == 1 else -(-inner // GRAD_BLOCK)
    items = outer * nblocks if n else 0
    parallel = outer * n * inner >= PARALLEL_MIN_COSTLY and items > 1 and nb.get_num_threads() > 1
    return SoftmaxGradPlan(items, n, inner, nblocks, log, parallel)


def softmax_grad(dy: np.ndarray, y: np.ndarray, dx: np.ndarray, plan: SoftmaxGradPlan) -> None:
    if plan.items == 0:
        return
    fn = softmax_grad_parallel if plan.parallel else softmax_grad_serial
    fn(dy.reshape(-1), y.reshape(-1), dx.reshape(-1), plan.items, plan.n, plan.inner, plan.nblocks, plan.log)


# -- NegativeLogLikelihoodLoss: -x[label] * w per position ----------------------------------------------------
#: positions from which the NLL loss gathers in parallel (one load per position: threads pay off late)
NLL_PARALLEL_MIN = 1 << 15


@nb.njit(**_NJIT)
def _nll_item(x3, lab, wrow, loss, r):
    D = x3.shape[2]
    c = lab[r]
    if c >= 0:  # an ignored position is left out, not multiplied by weight 0 (0 * Inf is NaN)
        n = r // D
        loss[r] = -float(x3[n, c, r - n * D]) * wrow[r]


@nb.njit(**_NJIT)
def nll_rows_serial(x3, lab, wrow, loss):
    for r in range(lab.size):
        _nll_item(x3, lab, wrow, loss, r)


@nb.njit(parallel=True, **_NJIT)
def nll_rows_parallel(x3, lab, wrow, loss):
    for r in nb.prange(lab.size):
        _nll_item(x3, lab, wrow, loss, r)


def nll_forward(x, labels, weights, ignore, reduction: str, out_loss, op: str) -> None:
    """NegativeLogLikelihoodLoss of the log-probabilities ``x`` (N, C, d...): -x[label] * w[label] per
    position in float64 (the product of two floats of ``x``'s dtype, exact), reduced as
    :func:`_reduce_loss` says."""
    N, C = int(x.shape[0]), int(x.shape[1])
    lab, wrow = xent_positions(op, labels, weights, ignore, C)
    loss = np.zeros(lab.size, np.float64)
    if x.size and lab.size:
        x3 = x.reshape(N, C, math.prod(x.shape[2:]))
        parallel = lab.size >= NLL_PARALLEL_MIN and nb.get_num_threads() > 1
        (nll_rows_parallel if parallel else nll_rows_serial)(x3, lab, wrow, loss)
    _reduce_loss(loss, wrow, reduction, out_loss)


# -- NLLLossGrad: dInput = -onehot(labels) * coef ------------------------------------------------------------
@nb.njit(parallel=True, **_NJIT)
def _nll_grad(out3, lab, coef, D):
    """Row r = (n, d) owns out3[n, :, d]: zeros, then -coef at the label (nothing where ignored)."""
    C = out3.shape[1]
    for r in nb.prange(lab.size):
        n = r // D
        d = r - n * D
        for c in range(C):
            out3[n, c, d] = 0.0
        if lab[r] >= 0:
            out3[n, lab[r], d] = -coef[r]


def nll_backward(dloss, labels, weights, ignore, reduction: str, out, op: str) -> None:
    """Gradient of NegativeLogLikelihoodLoss w.r.t. its log-probabilities, written into ``out``
    (N, C, d...): -dLoss * w[label] (/ summed weights for mean) at each label, 0 elsewhere."""
    N, C = out.shape[0], out.shape[1]
    lab, wrow = xent_positions(op, labels, weights, ignore, C)
    if out.size == 0:
        return
    g = dloss.astype(np.float64).reshape(-1)
    if reduction == "none":
        coef = g * wrow
    else:
        coef = wrow * g[0]
        if reduction == "mean" and (lab >= 0).any():
            with np.errstate(invalid="ignore", divide="ignore"):
                coef /= wrow.sum()
    _nll_grad(out.reshape(N, C, -1), lab, coef, math.prod(out.shape[2:]))
