"""Fused multi-tensor optimizer steps (SGD, Adam/AdamW, NAdam, RAdam, Adamax, RMSprop, Adagrad, Adadelta):
one parallel numba kernel
per step over every parameter, like torch's foreach path or ops-nn's aclnnApplyAdamW.

The tensors arrive as typed lists of flat arrays (parameters, gradients, state buffers); the
work is cut into chunks of at most ``CHUNK`` elements, ``chunks[c] = (tensor, start, end)``, and
the chunks run in parallel, so one large and many small parameters balance across threads.
Per-tensor hyper-parameters (parameter groups may differ) come as float64 rows. Arithmetic is
in float64, rounded once when stored.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np
from numba import prange
from numba.typed import List

#: elements per parallel work item
CHUNK = 1 << 15

# hyper-parameter columns
SGD_LR, SGD_MOMENTUM, SGD_DAMPENING, SGD_WD = range(4)
SGD_NESTEROV, SGD_MAXIMIZE, SGD_FIRST = range(3)
ADAM_LR, ADAM_B1, ADAM_B2, ADAM_EPS, ADAM_WD, ADAM_BC1, ADAM_BC2 = range(7)
ADAM_AMSGRAD, ADAM_DECOUPLED, ADAM_MAXIMIZE = range(3)


def chunk_table(sizes) -> np.ndarray:
    """(tensor index, start, end) rows covering every tensor in pieces of at most CHUNK elements."""
    rows = []
    for t, n in enumerate(sizes):
        for s in range(0, int(n), CHUNK):
            rows.append((t, s, min(s + CHUNK, int(n))))
    return np.asarray(rows, np.int64).reshape(-1, 3)


def typed_list(arrays) -> List:
    out = List()
    for a in arrays:
        out.append(a)
    return out


@nb.njit(inline="always")
def _sgd_chunk(p, g, b, lr, mom, damp, wd, nesterov, maximize, first):
    """SGD on one chunk; slices, so the indices start at 0 (no wraparound checks)."""
    for i in range(p.shape[0]):
        gi = np.float64(g[i])
        if maximize:
            gi = -gi
        pi = np.float64(p[i])
        if wd != 0.0:
            gi = gi + wd * pi
        if mom != 0.0:
            if first:
                bi = gi
            else:
                bi = mom * np.float64(b[i]) + (1.0 - damp) * gi
            b[i] = bi
            bi = np.float64(b[i])  # the stored (rounded) buffer, as torch uses it
            if nesterov:
                gi = gi + mom * bi
            else:
                gi = bi
        p[i] = pi - lr * gi


@nb.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def sgd_step(params, grads, bufs, chunks, hyper, flags):
    """torch.optim.SGD's update for every chunk: weight decay, momentum (the buffer starts as
    the gradient on its first step), dampening, Nesterov, maximize."""
    for c in prange(chunks.shape[0]):
        t, s, e = chunks[c, 0], chunks[c, 1], chunks[c, 2]
        _sgd_chunk(
            params[t][s:e],
            grads[t][s:e],
            bufs[t][s:e],
            hyper[t, SGD_LR],
            hyper[t, SGD_MOMENTUM],
            hyper[t, SGD_DAMPENING],
            hyper[t, SGD_WD],
            flags[t, SGD_NESTEROV] != 0,
            flags[t, SGD_MAXIMIZE] != 0,
            flags[t, SGD_FIRST] != 0,
        )


@nb.njit(inline="always")
def _decay_terms(lr, wd, decoupled, maximize):
    """(gradient sign, parameter decay factor, L2 coefficient) of one tensor: -g and 1.0 * p are exact,
    so maximize and decoupled weight decay need no per-element branch."""
    sign = -1.0 if maximize else 1.0
    decay = 1.0 - lr * wd if (decoupled and wd != 0.0) else 1.0
    l2 = 0.0 if decoupled else wd
    return sign, decay, l2


@nb.njit(inline="always")
def _decayed(p, g, i, sign, decay, l2):
    """Element ``i``'s (parameter, gradient) in float64 after maximize and L2 or decoupled weight decay."""
    gi = sign * np.float64(g[i])
    pi = np.float64(p[i])
    if l2 != 0.0:
        gi = gi + l2 * pi
    return pi * decay, gi


@nb.njit(inline="always")
def _adam_moments(p, g, m, v, i, sign, decay, l2, b1, b2):
    """Element ``i`` of the Adam family: exp_avg and exp_avg_sq updated and stored; returns the decayed
    parameter, the gradient and the stored (rounded) moments, as torch uses them."""
    pi, gi = _decayed(p, g, i, sign, decay, l2)
    mi = np.float64(m[i])
    m[i] = mi + (1.0 - b1) * (gi - mi)
    v[i] = b2 * np.float64(v[i]) + (1.0 - b2) * gi * gi
    return pi, gi, np.float64(m[i]), np.float64(v[i])


@nb.njit(inline="always")
def _adam_chunk(p, g, m, v, vmax, sign, decay, l2, b1, b2, step_size, bc2_sqrt, eps, amsgrad):
    """Adam on one chunk; the arrays are slices, so their indices start at 0 (no wraparound
    checks) and the loop vectorizes; the branches are the same for every element."""
    for i in range(p.shape[0]):
        pi, _gi, mi, vi = _adam_moments(p, g, m, v, i, sign, decay, l2, b1, b2)
        if amsgrad:
            vm = np.float64(vmax[i])
            # NaN from either side wins, as torch.maximum
            vmax[i] = vm if (vm >= vi or vm != vm) else vi
            vi = np.float64(vmax[i])
        denom = math.sqrt(vi) / bc2_sqrt + eps
        p[i] = pi - step_size * mi / denom


@nb.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def adam_step(params, grads, exp_avgs, exp_avg_sqs, max_sqs, chunks, hyper, flags):
    """torch.optim.Adam / AdamW's update for every chunk (L2 or decoupled weight decay, bias
    correction from the per-tensor step, amsgrad, maximize)."""
    for c in prange(chunks.shape[0]):
        t, s, e = chunks[c, 0], chunks[c, 1], chunks[c, 2]
        lr, b1, b2 = hyper[t, ADAM_LR], hyper[t, ADAM_B1], hyper[t, ADAM_B2]
        eps, wd = hyper[t, ADAM_EPS], hyper[t, ADAM_WD]
        step_size = lr / hyper[t, ADAM_BC1]
        bc2_sqrt = math.sqrt(hyper[t, ADAM_BC2])
        sign, decay, l2 = _decay_terms(lr, wd, flags[t, ADAM_DECOUPLED] != 0, flags[t, ADAM_MAXIMIZE] != 0)
        _adam_chunk(
            params[t][s:e],
            grads[t][s:e],
            exp_avgs[t][s:e],
            exp_avg_sqs[t][s:e],
            max_sqs[t][s:e],
            sign,
            decay,
            l2,
            b1,
            b2,
            step_size,
            bc2_sqrt,
            eps,
            flags[t, ADAM_AMSGRAD] != 0,
        )


RMS_LR, RMS_ALPHA, RMS_EPS, RMS_WD, RMS_MOMENTUM = range(5)
RMS_CENTERED, RMS_MAXIMIZE, RMS_MOMENTUM_BUFFER = range(3)
ADAGRAD_LR, ADAGRAD_LR_DECAY, ADAGRAD_WD, ADAGRAD_EPS, ADAGRAD_STEP = range(5)
(ADAGRAD_MAXIMIZE,) = range(1)


@nb.njit(inline="always")
def _rmsprop_chunk(p, g, sq, buf, gavg, sign, lr, alpha, eps, wd, mom, centered, use_buf):
    """RMSprop on one chunk (slices, indices from 0); states are read back rounded, as torch uses them."""
    for i in range(p.shape[0]):
        pi, gi = _decayed(p, g, i, sign, 1.0, wd)
        sq[i] = alpha * np.float64(sq[i]) + (1.0 - alpha) * gi * gi
        var = np.float64(sq[i])
        if centered:
            ga = np.float64(gavg[i])
            gavg[i] = ga + (1.0 - alpha) * (gi - ga)
            ga = np.float64(gavg[i])
            var = var - ga * ga
        avg = math.sqrt(var) + eps  # a negative centered variance gives NaN, as torch's sqrt
        if use_buf:
            buf[i] = mom * np.float64(buf[i]) + gi / avg
            p[i] = pi - lr * np.float64(buf[i])
        else:
            p[i] = pi - lr * gi / avg


@nb.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def rmsprop_step(params, grads, square_avgs, momentum_bufs, grad_avgs, chunks, hyper, flags):
    """torch.optim.RMSprop's update for every chunk (weight decay, centered, momentum, maximize); a
    tensor's momentum buffer and grad_avg are read and written only when its flags ask for them."""
    for c in prange(chunks.shape[0]):
        t, s, e = chunks[c, 0], chunks[c, 1], chunks[c, 2]
        _rmsprop_chunk(
            params[t][s:e],
            grads[t][s:e],
            square_avgs[t][s:e],
            momentum_bufs[t][s:e],
            grad_avgs[t][s:e],
            -1.0 if flags[t, RMS_MAXIMIZE] != 0 else 1.0,
            hyper[t, RMS_LR],
            hyper[t, RMS_ALPHA],
            hyper[t, RMS_EPS],
            hyper[t, RMS_WD],
            hyper[t, RMS_MOMENTUM],
            flags[t, RMS_CENTERED] != 0,
            flags[t, RMS_MOMENTUM_BUFFER] != 0,
        )


@nb.njit(inline="always")
def _adagrad_chunk(p, g, acc, sign, clr, eps, wd):
    """Adagrad on one chunk (slices, indices from 0); the sum is read back rounded, as torch uses it."""
    for i in range(p.shape[0]):
        pi, gi = _decayed(p, g, i, sign, 1.0, wd)
        acc[i] = np.float64(acc[i]) + gi * gi
        p[i] = pi - clr * gi / (math.sqrt(np.float64(acc[i])) + eps)


@nb.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def adagrad_step(params, grads, sums, chunks, hyper, flags):
    """torch.optim.Adagrad's update for every chunk: weight decay, the decayed rate
    ``lr / (1 + (step - 1) lr_decay)`` from the per-tensor step, maximize."""
    for c in prange(chunks.shape[0]):
        t, s, e = chunks[c, 0], chunks[c, 1], chunks[c, 2]
        clr = hyper[t, ADAGRAD_LR] / (1.0 + (hyper[t, ADAGRAD_STEP] - 1.0) * hyper[t, ADAGRAD_LR_DECAY])
        _adagrad_chunk(
            params[t][s:e],
            grads[t][s:e],
            sums[t][s:e],
            -1.0 if flags[t, ADAGRAD_MAXIMIZE] != 0 else 1.0,
            clr,
            hyper[t, ADAGRAD_EPS],
            hyper[t, ADAGRAD_WD],
        )


NADAM_BC2, NADAM_GRAD_COEF, NADAM_AVG_COEF = range(5, 8)  # after ADAM_LR .. ADAM_WD
RADAM_STEP_SIZE, RADAM_BC2_SQRT = range(5, 7)
ADAMAX_CLR = 5
FAMILY_DECOUPLED, FAMILY_MAXIMIZE, RADAM_RECTIFIED = range(3)  # NAdam's and RAdam's flag columns
(ADAMAX_MAXIMIZE,) = range(1)
ADADELTA_LR, ADADELTA_RHO, ADADELTA_EPS, ADADELTA_WD = range(4)
(ADADELTA_MAXIMIZE,) = range(1)


@nb.njit(inline="always")
def _family_terms(h, f):
    """(sign, decay, l2, beta1, beta2, eps) of one NAdam / RAdam tensor from its hyper and flag rows."""
    sign, decay, l2 = _decay_terms(h[ADAM_LR], h[ADAM_WD], f[FAMILY_DECOUPLED] != 0, f[FAMILY_MAXIMIZE] != 0)
    return sign, decay, l2, h[ADAM_B1], h[ADAM_B2], h[ADAM_EPS]


@nb.njit(inline="always")
def _nadam_chunk(p, g, m, v, h, f):
    """NAdam on one chunk (slices, indices from 0): the gradient and exp_avg terms over one denominator."""
    sign, decay, l2, b1, b2, eps = _family_terms(h, f)
    bc2, grad_coef, avg_coef = h[NADAM_BC2], h[NADAM_GRAD_COEF], h[NADAM_AVG_COEF]
    for i in range(p.shape[0]):
        pi, gi, mi, vi = _adam_moments(p, g, m, v, i, sign, decay, l2, b1, b2)
        denom = math.sqrt(vi / bc2) + eps
        p[i] = pi - grad_coef * gi / denom - avg_coef * mi / denom


@nb.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def nadam_step(params, grads, exp_avgs, exp_avg_sqs, chunks, hyper, flags):
    """torch.optim.NAdam's update for every chunk (L2 or decoupled weight decay, maximize); the momentum
    schedule's coefficients ``lr (1 - mu_t) / (1 - prod mu)`` and ``lr mu_{t+1} / (1 - prod mu')`` come
    per tensor from the host, which keeps mu_product."""
    for c in prange(chunks.shape[0]):
        t, s, e = chunks[c, 0], chunks[c, 1], chunks[c, 2]
        _nadam_chunk(params[t][s:e], grads[t][s:e], exp_avgs[t][s:e], exp_avg_sqs[t][s:e], hyper[t], flags[t])


@nb.njit(inline="always")
def _radam_chunk(p, g, m, v, h, f):
    """RAdam on one chunk (slices, indices from 0); unrectified steps are plain momentum steps."""
    sign, decay, l2, b1, b2, eps = _family_terms(h, f)
    step_size, bc2_sqrt, rectified = h[RADAM_STEP_SIZE], h[RADAM_BC2_SQRT], f[RADAM_RECTIFIED] != 0
    for i in range(p.shape[0]):
        pi, _gi, mi, vi = _adam_moments(p, g, m, v, i, sign, decay, l2, b1, b2)
        if rectified:
            p[i] = pi - step_size * mi * (bc2_sqrt / (math.sqrt(vi) + eps))
        else:
            p[i] = pi - step_size * mi


@nb.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def radam_step(params, grads, exp_avgs, exp_avg_sqs, chunks, hyper, flags):
    """torch.optim.RAdam's update for every chunk (L2 or decoupled weight decay, maximize); the host
    decides per tensor whether the variance is rectified (rho_t > 5) and folds ``lr / (1 - beta1^t)``
    and the rectification term into the step size."""
    for c in prange(chunks.shape[0]):
        t, s, e = chunks[c, 0], chunks[c, 1], chunks[c, 2]
        _radam_chunk(params[t][s:e], grads[t][s:e], exp_avgs[t][s:e], exp_avg_sqs[t][s:e], hyper[t], flags[t])


@nb.njit(inline="always")
def _adamax_chunk(p, g, m, u, h, f):
    """Adamax on one chunk (slices, indices from 0); states are read back rounded, as torch uses them."""
    sign = -1.0 if f[ADAMAX_MAXIMIZE] != 0 else 1.0
    wd, b1, b2, eps, clr = h[ADAM_WD], h[ADAM_B1], h[ADAM_B2], h[ADAM_EPS], h[ADAMAX_CLR]
    for i in range(p.shape[0]):
        pi, gi = _decayed(p, g, i, sign, 1.0, wd)
        mi = np.float64(m[i])
        m[i] = mi + (1.0 - b1) * (gi - mi)
        ui, ai = b2 * np.float64(u[i]), abs(gi) + eps
        # NaN from either side wins, as torch.maximum
        u[i] = ui if (ui >= ai or ui != ui) else ai
        p[i] = pi - clr * np.float64(m[i]) / np.float64(u[i])


@nb.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def adamax_step(params, grads, exp_avgs, exp_infs, chunks, hyper, flags):
    """torch.optim.Adamax's update for every chunk (weight decay, maximize); ``lr / (1 - beta1^t)``
    comes per tensor from the host."""
    for c in prange(chunks.shape[0]):
        t, s, e = chunks[c, 0], chunks[c, 1], chunks[c, 2]
        _adamax_chunk(params[t][s:e], grads[t][s:e], exp_avgs[t][s:e], exp_infs[t][s:e], hyper[t], flags[t])


@nb.njit(inline="always")
def _adadelta_chunk(p, g, sq, acc, h, f):
    """Adadelta on one chunk (slices, indices from 0); the delta uses acc_delta before its update, as torch."""
    sign = -1.0 if f[ADADELTA_MAXIMIZE] != 0 else 1.0
    lr, rho, eps, wd = h[ADADELTA_LR], h[ADADELTA_RHO], h[ADADELTA_EPS], h[ADADELTA_WD]
    for i in range(p.shape[0]):
        pi, gi = _decayed(p, g, i, sign, 1.0, wd)
        sq[i] = rho * np.float64(sq[i]) + (1.0 - rho) * gi * gi
        ai = np.float64(acc[i])
        delta = math.sqrt(ai + eps) / math.sqrt(np.float64(sq[i]) + eps) * gi
        acc[i] = rho * ai + (1.0 - rho) * delta * delta
        p[i] = pi - lr * delta


@nb.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def adadelta_step(params, grads, square_avgs, acc_deltas, chunks, hyper, flags):
    """torch.optim.Adadelta's update for every chunk (rho, eps, lr, weight decay, maximize)."""
    for c in prange(chunks.shape[0]):
        t, s, e = chunks[c, 0], chunks[c, 1], chunks[c, 2]
        _adadelta_chunk(params[t][s:e], grads[t][s:e], square_avgs[t][s:e], acc_deltas[t][s:e], hyper[t], flags[t])
