"""CTC (connectionist temporal classification) loss kernels: the forward (alpha) recursion over each sample's
extended label sequence (blank, l1, blank, l2, ..., blank) in log space, and its gradient from the forward
and backward (beta) recursions, as Graves et al. (2006) define them. One sample per task, float64 inside.

Targets are either padded rows (N, S) or one concatenated 1-D sequence (each sample's labels follow the
previous one's, ``target_lengths`` long), as torch takes them.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

_NEG = -np.inf


@nb.njit(nogil=True, cache=True, inline="always")
def _lse(a, b):
    if a != a or b != b:  # NaN propagates (max() would drop it)
        return a + b
    if a == _NEG:
        return b
    if b == _NEG:
        return a
    m = max(a, b)
    return m + math.log(math.exp(a - m) + math.exp(b - m))


@nb.njit(nogil=True, cache=True, inline="always")
def _label(targets, start, n, s, blank):
    """The extended sequence's entry ``s`` of sample ``n`` (even: blank)."""
    if s % 2 == 0:
        return blank
    if targets.ndim == 1:
        return targets.reshape(-1)[start + s // 2]
    return targets.reshape(targets.shape[0], -1)[n, s // 2]


@nb.njit(nogil=True, cache=True)
def _starts(targets, target_lengths):
    n = target_lengths.shape[0]
    out = np.zeros(n, np.int64)
    if targets.ndim == 1:
        for i in range(1, n):
            out[i] = out[i - 1] + target_lengths[i - 1]
    return out


@nb.njit(nogil=True, cache=True)
def _width(target_lengths) -> int:
    """The longest extended label sequence (2L + 1) of the batch: the recursion tables' row width."""
    width = 1
    for n in range(target_lengths.shape[0]):
        width = max(width, 2 * target_lengths[n] + 1)
    return width


@nb.njit(nogil=True, cache=True)
def _alpha(lp, targets, start, n, T, L, blank, la):
    """Fill ``la`` (T, 2L+1) with the forward log probabilities; returns the sample's log-likelihood."""
    S = 2 * L + 1
    la[:T, :S] = _NEG
    la[0, 0] = lp[0, n, blank]
    if L > 0:
        la[0, 1] = lp[0, n, _label(targets, start, n, 1, blank)]
    for t in range(1, T):
        for s in range(S):
            c = _label(targets, start, n, s, blank)
            v = la[t - 1, s]
            if s > 0:
                v = _lse(v, la[t - 1, s - 1])
            if s > 1 and c != blank and c != _label(targets, start, n, s - 2, blank):
                v = _lse(v, la[t - 1, s - 2])
            la[t, s] = v + lp[t, n, c] if v != _NEG else _NEG
    end = la[T - 1, S - 1]
    return _lse(end, la[T - 1, S - 2]) if L > 0 else end


@nb.njit(nogil=True, cache=True)
def _check(lp, targets, input_lengths, target_lengths, blank, starts):
    """-1 when every length and label is in range, else the offending sample."""
    T, N, C = lp.shape
    for n in range(N):
        L = target_lengths[n]
        if input_lengths[n] < 0 or input_lengths[n] > T or L < 0:
            return n
        if targets.ndim == 2 and L > targets.shape[1]:
            return n
        if targets.ndim == 1 and starts[n] + L > targets.shape[0]:
            return n
        for s in range(L):
            c = _label(targets, starts[n], n, 2 * s + 1, blank)
            if c < 0 or c >= C or c == blank:
                return n
    return -1


@nb.njit(parallel=True, nogil=True, cache=True)
def ctc_forward(lp, targets, input_lengths, target_lengths, blank, zero_infinity, out):
    """out[n] = -log p(targets[n] | lp[:input_lengths[n], n]) (0 where infinite under ``zero_infinity``)."""
    T, N, C = lp.shape
    starts = _starts(targets, target_lengths)
    width = _width(target_lengths)
    for n in nb.prange(N):
        Tn, L = input_lengths[n], target_lengths[n]
        if Tn == 0:
            nll = 0.0 if L == 0 else np.inf
        else:
            la = np.empty((Tn, width))
            nll = -_alpha(lp, targets, starts[n], n, Tn, L, blank, la)
        out[n] = 0.0 if zero_infinity and nll == np.inf else nll


@nb.njit(parallel=True, nogil=True, cache=True)
def ctc_backward(lp, targets, input_lengths, target_lengths, nll, grad_loss, blank, zero_infinity, out):
    """out = d(grad_loss . nll) / d lp: -grad_loss[n] * sum over the extended entries s carrying class c of
    exp(alpha_t(s) + beta_t(s) - lp[t, n, c] + nll[n]); 0 past each input length and for a sample whose
    loss is infinite under ``zero_infinity`` (NaN without it, as the likelihood is 0)."""
    T, N, C = lp.shape
    starts = _starts(targets, target_lengths)
    width = _width(target_lengths)
    for n in nb.prange(N):
        out[:, n, :] = 0
        Tn, L = input_lengths[n], target_lengths[n]
        if Tn == 0:
            continue
        S = 2 * L + 1
        g = grad_loss[n]
        la = np.empty((Tn, width))
        ll = _alpha(lp, targets, starts[n], n, Tn, L, blank, la)
        if ll == _NEG:
            if not zero_infinity:
                out[:Tn, n, :] = np.nan
            continue
        lb = np.empty((Tn, width))
        lb[:Tn, :S] = _NEG
        lb[Tn - 1, S - 1] = lp[Tn - 1, n, blank]
        if L > 0:
            lb[Tn - 1, S - 2] = lp[Tn - 1, n, _label(targets, starts[n], n, S - 2, blank)]
        for t in range(Tn - 2, -1, -1):
            for s in range(S):
                c = _label(targets, starts[n], n, s, blank)
                v = lb[t + 1, s]
                if s < S - 1:
                    v = _lse(v, lb[t + 1, s + 1])
                if s < S - 2 and c != blank and c != _label(targets, starts[n], n, s + 2, blank):
                    v = _lse(v, lb[t + 1, s + 2])
                lb[t, s] = v + lp[t, n, c] if v != _NEG else _NEG
        acc = np.empty(C)
        for t in range(Tn):
            acc[:] = _NEG
            for s in range(S):
                c = _label(targets, starts[n], n, s, blank)
                acc[c] = _lse(acc[c], la[t, s] + lb[t, s])
            for c in range(C):
                if acc[c] != _NEG:
                    out[t, n, c] = -g * math.exp(acc[c] - lp[t, n, c] - ll)


def check(lp, targets, input_lengths, target_lengths, blank) -> int:
    """-1 when the lengths and labels fit ``lp``, else the first sample that does not."""
    return int(_check(lp, targets, input_lengths, target_lengths, blank, _starts(targets, target_lengths)))
