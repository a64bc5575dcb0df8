"""Fused multi-tensor optimizer steps (SGD, Adam/AdamW): one parallel numba kernel per step over
every parameter, like torch's foreach path or ops-nn's aclnnApplyAdamW.

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


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _sgd_range(p, g, b, lr, mom, damp, wd, sign, nesterov, first):
    """SGD's update of one chunk with momentum, one loop per (first step, Nesterov) so that LLVM
    vectorizes each (``sign`` -1 maximizes; ``wd`` 0 for none)."""
    if first:
        for i in range(p.size):
            gi = sign * np.float64(g[i])
            pi = np.float64(p[i])
            if wd != 0.0:
                gi = gi + wd * pi
            b[i] = gi
            bi = np.float64(b[i])  # the stored (rounded) buffer, as torch uses it
            p[i] = pi - lr * (gi + mom * bi if nesterov else bi)
        return
    for i in range(p.size):
        gi = sign * np.float64(g[i])
        pi = np.float64(p[i])
        if wd != 0.0:
            gi = gi + wd * pi
        b[i] = mom * np.float64(b[i]) + (1.0 - damp) * gi
        bi = np.float64(b[i])
        p[i] = pi - lr * (gi + mom * bi if nesterov else bi)


@nb.njit(parallel=True, nogil=True, cache=True)
def sgd_step(params, grads, bufs, chunks, hyper, flags):
    """torch.optim.SGD's update for every chunk: weight decay, momentum (the buffer starts as
    the gradient on its first step), dampening, Nesterov, maximize."""
    for c in prange(chunks.shape[0]):
        t, s, e = chunks[c, 0], chunks[c, 1], chunks[c, 2]
        p, g, b = params[t], grads[t], bufs[t]
        lr, mom = hyper[t, SGD_LR], hyper[t, SGD_MOMENTUM]
        damp, wd = hyper[t, SGD_DAMPENING], hyper[t, SGD_WD]
        nesterov, maximize, first = flags[t, SGD_NESTEROV], flags[t, SGD_MAXIMIZE], flags[t, SGD_FIRST]
        if mom != 0.0:
            sign = -1.0 if maximize else 1.0
            _sgd_range(p[s:e], g[s:e], b[s:e], lr, mom, damp, wd, sign, bool(nesterov), bool(first))
            continue
        for i in range(s, e):
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


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _adam_range(p, g, m, v, b1, b2, eps, l2, decay, sign, step_size, bc2_sqrt):
    """Adam's update of one chunk without amsgrad, branch-free but for ``l2`` (so LLVM vectorizes
    it; numba's Python error model would test every division for zero): ``sign`` -1 maximizes,
    ``decay`` is AdamW's 1 - lr * wd (1 for none), ``l2`` Adam's weight decay (0 for none)."""
    for i in range(p.size):
        gi = sign * np.float64(g[i])
        pi = np.float64(p[i]) * decay
        if l2 != 0.0:
            gi = gi + l2 * pi
        mi = np.float64(m[i])
        mi = mi + (1.0 - b1) * (gi - mi)
        vi = b2 * np.float64(v[i]) + (1.0 - b2) * gi * gi
        m[i] = mi
        v[i] = vi
        denom = math.sqrt(np.float64(v[i])) / bc2_sqrt + eps  # the stored (rounded) moments, as torch
        p[i] = pi - step_size * np.float64(m[i]) / denom


@nb.njit(parallel=True, nogil=True, cache=True)
def adam_step(params, grads, exp_avgs, exp_avg_sqs, max_sqs, chunks, hyper, flags):
    """torch.optim.Adam / AdamW's update for every chunk (L2 or decoupled weight decay, bias
    correction from the per-tensor step, amsgrad, maximize)."""
    for c in prange(chunks.shape[0]):
        t, s, e = chunks[c, 0], chunks[c, 1], chunks[c, 2]
        p, g, m, v, vmax = params[t], grads[t], exp_avgs[t], exp_avg_sqs[t], max_sqs[t]
        lr, b1, b2 = hyper[t, ADAM_LR], hyper[t, ADAM_B1], hyper[t, ADAM_B2]
        eps, wd = hyper[t, ADAM_EPS], hyper[t, ADAM_WD]
        step_size = lr / hyper[t, ADAM_BC1]
        bc2_sqrt = math.sqrt(hyper[t, ADAM_BC2])
        amsgrad, decoupled, maximize = flags[t, ADAM_AMSGRAD], flags[t, ADAM_DECOUPLED], flags[t, ADAM_MAXIMIZE]
        if not amsgrad:
            decay = 1.0 - lr * wd if decoupled and wd != 0.0 else 1.0
            l2 = 0.0 if decoupled else wd
            sign = -1.0 if maximize else 1.0
            _adam_range(p[s:e], g[s:e], m[s:e], v[s:e], b1, b2, eps, l2, decay, sign, step_size, bc2_sqrt)
            continue
        for i in range(s, e):
            gi = np.float64(g[i])
            if maximize:
                gi = -gi
            pi = np.float64(p[i])
            if wd != 0.0:
                if decoupled:
                    pi = pi * (1.0 - lr * wd)
                else:
                    gi = gi + wd * pi
            mi = np.float64(m[i])
            mi = mi + (1.0 - b1) * (gi - mi)
            vi = b2 * np.float64(v[i]) + (1.0 - b2) * gi * gi
            m[i] = mi
            v[i] = vi
            vi = np.float64(v[i])
            if amsgrad:
                vm = np.float64(vmax[i])
                vmax[i] = vi if vi > vm or vi != vi else vm  # NaN from either side, as torch.maximum
                vi = np.float64(vmax[i])
            denom = math.sqrt(vi) / bc2_sqrt + eps
            p[i] = pi - step_size * np.float64(m[i]) / denom
