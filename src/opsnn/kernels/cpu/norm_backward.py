"""CPU normalization backward kernels (numba): the gradients of LayerNorm/RMSNorm, BatchNorm and
GroupNorm with respect to X, scale and bias.

With ``xhat = (x - mean) * rstd`` over a row and ``gh = dy * scale``, the input gradient of a
normalization by batch statistics is ``dx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat))``
(RMSNorm: no mean term; mean = 0). The statistics are recomputed from X by the forward's own
rule, so the backward needs nothing saved but X. Sums accumulate in float64, but for float32
LayerNorm/RMSNorm rows, which run float32 vector loops as the forward does: short float32 partial
sums (a block of a row, or a few rows' dScale / dBias) joined in float64.

Parallel work never shares an output element: rows (LayerNorm/RMSNorm, GroupNorm) or channels
(BatchNorm's statistics) are split between threads, and the scale/bias gradients, which sum over
rows, are written as per-chunk (LayerNorm) or per-(sample, channel) (GroupNorm) partial sums that
the host adds afterwards.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .gemm import KIND_BF16, _narrow, _widen
from .norm import (
    _BLK,
    _Z32,
    BF16,
    SMALL_PLANE,
    _expand,
    _stats,
    _stats_row32,
    _sumsq_row32,
    channel_shifts,
    small_plane_tasks,
    widen_channel_bf16,
    widen_range_bf16,
)

_OPTS = dict(nogil=True, cache=True, error_model="numpy", fastmath={"reassoc", "contract"})


# -- LayerNorm / RMSNorm ------------------------------------------------------------------------
@nb.njit(**_OPTS)
def _ln_bw_rows(dy, x, scale, dx, dsc, dbi, r0, r1, N, eps, rms):
    """float64 rows ``r0..r1`` of N elements: ``dx``, and their sums of ``dy * xhat`` (into ``dsc``) and
    ``dy`` (into ``dbi``), float64 N-vectors this chunk owns."""
    gsc = np.empty(N)  # dy * scale as rounded into the row sum (see _ln_bw_rows32)
    for row in range(r0, r1):
        xs = x[row * N : row * N + N]
        gs = dy[row * N : row * N + N]
        ds = dx[row * N : row * N + N]
        if rms:
            q = 0.0
            for i in range(N):
                v = float(xs[i])
                q += v * v
            mean = 0.0
            rstd = 1.0 / np.sqrt(q / N + eps)
        else:
            mean, var = _stats(xs, True)
            rstd = 1.0 / np.sqrt(var + eps)
        a = 0.0
        b = 0.0
        for i in range(N):
            xh = (xs[i] - mean) * rstd
            gi = float(gs[i])
            gh = gi * scale[i]
            gsc[i] = gh
            a += gh
            b += gh * xh
            dsc[i] += gi * xh
            dbi[i] += gi
        a = 0.0 if rms else a / N
        b = b / N
        for i in range(N):
            xh = (xs[i] - mean) * rstd
            ds[i] = rstd * (gsc[i] - a - xh * b)


#: rows whose float32 dScale / dBias partial sums accumulate before they join the float64 ones
_FLUSH_ROWS = 32


@nb.njit(**_OPTS)
def _ln_bw_rows32(dy, x, scale, dx, dsc, dbi, r0, r1, N, eps, rms):
    """:func:`_ln_bw_rows` for float32 rows in float32 vector loops (``scale`` float32): the
    statistics as the forward's ``_stats_row32``; the row sums in float32 blocks of ``_BLK`` joined
    in float64; the dScale / dBias partials in float32 over ``_FLUSH_ROWS`` rows, then float64."""
    acc_s = np.zeros(N, np.float32)
    acc_b = np.zeros(N, np.float32)
    # dy * scale as rounded into the row sum: recomputed in the dx pass, 'contract' would fuse it into an FMA
    # with the subtraction of its own mean, and a row whose products are all equal (N = 1) would not give 0
    # (the float64 rows too)
    gsc = np.empty(N, np.float32)
    for row in range(r0, r1):
        xs = x[row * N : row * N + N]
        gs = dy[row * N : row * N + N]
        ds = dx[row * N : row * N + N]
        if rms:
            mean, var = 0.0, _sumsq_row32(xs) / N
        else:
            mean, var = _stats_row32(xs)
        inv = 1.0 / np.sqrt(var + eps)
        # the mean split as m + its float32 rounding error (as the forward): x - m is exact near the mean,
        # so a row offset far from 0 costs xhat nothing, which dX's cancellation (g - a - xhat b) would magnify
        m = np.float32(mean)
        r = np.float32(inv)
        c1 = np.float32((mean - float(m)) * inv)
        a = 0.0
        b = 0.0
        for b0 in range(0, N, _BLK):
            b1 = min(b0 + _BLK, N)
            xb, gb, sb, ab, bb, hb = xs[b0:b1], gs[b0:b1], scale[b0:b1], acc_s[b0:b1], acc_b[b0:b1], gsc[b0:b1]
            ta = np.float32(0.0)
            tb = np.float32(0.0)
            for i in range(xb.size):
                xh = (xb[i] - m) * r - c1
                gi = gb[i]
                gh = gi * sb[i]
                hb[i] = gh
                ta += gh
                tb += gh * xh
                ab[i] += gi * xh
                bb[i] += gi
            a += ta
            b += tb
        a32 = np.float32(0.0) if rms else np.float32(a / N)
        b32 = np.float32(b / N)
        for i in range(N):
            xh = (xs[i] - m) * r - c1
            ds[i] = r * (gsc[i] - a32 - xh * b32)
        if (row - r0) % _FLUSH_ROWS == _FLUSH_ROWS - 1 or row == r1 - 1:
            for i in range(N):
                dsc[i] += acc_s[i]
                dbi[i] += acc_b[i]
                acc_s[i] = 0.0
                acc_b[i] = 0.0


@nb.njit(parallel=True, **_OPTS)
def _ln_bw_parallel(dy, x, scale, dx, part, rows, N, eps, rms, chunks):
    for c in nb.prange(chunks):
        _ln_bw_rows(dy, x, scale, dx, part[c, 0], part[c, 1], rows * c // chunks, rows * (c + 1) // chunks, N, eps, rms)


@nb.njit(parallel=True, **_OPTS)
def _ln_bw_parallel32(dy, x, scale, dx, part, rows, N, eps, rms, chunks):
    for c in nb.prange(chunks):
        _ln_bw_rows32(
            dy, x, scale, dx, part[c, 0], part[c, 1], rows * c // chunks, rows * (c + 1) // chunks, N, eps, rms
        )


def row_chunks(rows: int) -> int:
    """Chunks of rows for the parallel LayerNorm/RMSNorm backward: a few per thread (balance),
    each with its own partial dScale/dBias sums."""
    return max(1, min(rows, 4 * nb.get_num_threads()))


def layer_norm_backward(
    dy: np.ndarray,
    x: np.ndarray,
    scale: np.ndarray,
    dx: np.ndarray,
    part: np.ndarray,
    rows: int,
    N: int,
    eps: float,
    rms: bool,
    parallel: bool,
) -> tuple:
    """Gradients of LayerNorm (RMSNorm with ``rms``) over ``rows`` contiguous float32 or float64 rows of N
    elements; ``scale`` is the N-vector in their dtype. ``part`` (float64, (chunks, 2, N)) receives each
    chunk's partial sums; returns (dScale, dBias) as float64 N-vectors."""
    part[:] = 0.0
    if rows * N:
        chunks = part.shape[0]
        args = (dy.reshape(-1), x.reshape(-1), scale, dx.reshape(-1))
        one, many = (_ln_bw_rows32, _ln_bw_parallel32) if x.dtype == np.float32 else (_ln_bw_rows, _ln_bw_parallel)
        if parallel and chunks > 1:
            many(*args, part, rows, N, float(eps), rms, chunks)
        else:
            one(*args, part[0, 0], part[0, 1], 0, rows, N, float(eps), rms)
    return part[:, 0].sum(axis=0), part[:, 1].sum(axis=0)


# -- GroupNorm / InstanceNorm -------------------------------------------------------------------
@nb.njit(**_OPTS)
def _gn_bw_task(dy, x, scale, dx, part, row, G, Cg, S, eps, exact):
    """Row ``row`` = (n, g) of Cg*S elements: dx, and per channel c of the group the sums of
    ``dy * xhat`` and ``dy`` into ``part[n, c]``."""
    M = Cg * S
    lo = row * M
    n = row // G
    g = row - n * G
    mean, var = _stats(x[lo : lo + M], exact)
    rstd = 1.0 / np.sqrt(var + eps)
    a = 0.0
    b = 0.0
    for k in range(Cg):
        c = g * Cg + k
        sc = scale[c]
        xs = x[lo + k * S : lo + k * S + S]
        gs = dy[lo + k * S : lo + k * S + S]
        sg = 0.0
        sgx = 0.0
        for s in range(S):
            gi = float(gs[s])
            xh = (xs[s] - mean) * rstd
            gh = gi * sc
            sg += gi
            sgx += gi * xh
            a += gh
            b += gh * xh
        part[n, c, 0] = sgx
        part[n, c, 1] = sg
    a /= M
    b /= M
    for k in range(Cg):
        c = g * Cg + k
        sc = scale[c]
        xs = x[lo + k * S : lo + k * S + S]
        gs = dy[lo + k * S : lo + k * S + S]
        ds = dx[lo + k * S : lo + k * S + S]
        for s in range(S):
            xh = (xs[s] - mean) * rstd
            ds[s] = rstd * (gs[s] * sc - a - xh * b)


@nb.njit(parallel=True, **_OPTS)
def _gn_bw_parallel(dy, x, scale, dx, part, rows, G, Cg, S, eps, exact):
    for r in nb.prange(rows):
        _gn_bw_task(dy, x, scale, dx, part, r, G, Cg, S, eps, exact)


@nb.njit(**_OPTS)
def _gn_bw_serial(dy, x, scale, dx, part, rows, G, Cg, S, eps, exact):
    for r in range(rows):
        _gn_bw_task(dy, x, scale, dx, part, r, G, Cg, S, eps, exact)


def group_norm_backward(
    dy: np.ndarray,
    x: np.ndarray,
    scale: np.ndarray,
    dx: np.ndarray,
    part: np.ndarray,
    N: int,
    G: int,
    Cg: int,
    S: int,
    eps: float,
    parallel: bool,
) -> tuple:
    """Gradients of GroupNorm over x viewed as (N, G, Cg, S); ``scale`` float64 (C,), ``part``
    float64 (N, C, 2) scratch. Returns (dScale, dBias) as float64 C-vectors."""
    part[:] = 0.0
    if x.size:
        run = _gn_bw_parallel if parallel else _gn_bw_serial
        run(
            dy.reshape(-1),
            x.reshape(-1),
            scale,
            dx.reshape(-1),
            part,
            N * G,
            G,
            Cg,
            S,
            float(eps),
            x.dtype == np.float64,
        )
    return part[:, :, 0].sum(axis=0), part[:, :, 1].sum(axis=0)


# -- BatchNorm ----------------------------------------------------------------------------------
@nb.njit(**_OPTS)
def _bn_bw_stats_task(dy, x, y, relu, scale, c, N, C, S, training, exact, mean_in, var_in, eps, st):
    """Channel c over (N, S): st[c] = (mean, rstd, sum dy, sum dy * xhat, sum gh * xhat)
    with gh = dy * scale[c]; ``relu``: dy taken as 0 where y <= 0 (the gradient through a fused ReLU)."""
    M = N * S
    sc = float(scale[c])
    exact = exact or not training or not np.isfinite(sc)
    m = 0.0
    var = 0.0
    sg = 0.0
    sgd = 0.0
    if not exact:
        # one pass of sums shifted by the channel's first value (as the forward's statistics)
        shift = float(x[c * S])
        s = 0.0
        q = 0.0
        for n in range(N):
            xs = x[(n * C + c) * S : (n * C + c) * S + S]
            gs = dy[(n * C + c) * S : (n * C + c) * S + S]
            ys = y[(n * C + c) * S : (n * C + c) * S + S]
            for i in range(S):
                d = xs[i] - shift
                gi = float(gs[i]) if not relu or ys[i] > 0 else 0.0
                s += d
                q += d * d
                sg += gi
                sgd += gi * d
        md = s / M
        var = max(q / M - md * md, 0.0)
        m = shift + md
        sgd -= md * sg
        # a NaN or Inf among the sums: the exact passes, so that Inf - Inf happens where the
        # definition has it (sum(dy * (x - mean)), not sum(dy * (x - shift)) - ...)
        exact = not (np.isfinite(sgd) and np.isfinite(sg) and np.isfinite(var))
    shd = sc * sgd
    if exact:
        if training:
            s = 0.0
            for n in range(N):
                xs = x[(n * C + c) * S : (n * C + c) * S + S]
                for i in range(S):
                    s += xs[i]
            m = s / M
        else:
            m = float(mean_in[c])
        q = 0.0
        sg = 0.0
        sgd = 0.0
        shd = 0.0
        for n in range(N):
            xs = x[(n * C + c) * S : (n * C + c) * S + S]
            gs = dy[(n * C + c) * S : (n * C + c) * S + S]
            ys = y[(n * C + c) * S : (n * C + c) * S + S]
            for i in range(S):
                d = xs[i] - m
                gi = float(gs[i]) if not relu or ys[i] > 0 else 0.0
                gh = gi * sc
                q += d * d
                sg += gi
                sgd += gi * d
                shd += gh * d
        var = q / M if training else float(var_in[c])
    rstd = 1.0 / np.sqrt(var + eps)
    st[c, 0] = m
    st[c, 1] = rstd
    st[c, 2] = sg
    st[c, 3] = sgd * rstd
    st[c, 4] = shd * rstd


@nb.njit(parallel=True, **_OPTS)
def _bn_bw_stats_parallel(dy, x, y, relu, scale, N, C, S, training, exact, mean_in, var_in, eps, st):
    for c in nb.prange(C):
        _bn_bw_stats_task(dy, x, y, relu, scale, c, N, C, S, training, exact, mean_in, var_in, eps, st)


@nb.njit(**_OPTS)
def _bn_bw_stats_serial(dy, x, y, relu, scale, N, C, S, training, exact, mean_in, var_in, eps, st):
    for c in range(C):
        _bn_bw_stats_task(dy, x, y, relu, scale, c, N, C, S, training, exact, mean_in, var_in, eps, st)


@nb.njit(**_OPTS)
def _bn_bw_dx_task(dy, x, y, relu, scale, dx, st, row, C, S, M, training):
    c = row % C
    m = st[c, 0]
    rstd = st[c, 1]
    sc = scale[c]
    xs = x[row * S : row * S + S]
    gs = dy[row * S : row * S + S]
    ys = y[row * S : row * S + S]
    ds = dx[row * S : row * S + S]
    if training:
        # dx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)), xhat = (x - m) * rstd, as
        # rstd * sc * (g - mean(g)) - ...: g * sc - mean(gh) would contract into an FMA and keep the
        # product's rounding error where the two cancel (one value per channel: dx must be 0)
        a = rstd * sc
        gbar = st[c, 2] / M
        k2 = rstd * st[c, 4] / M
        if relu:
            for s in range(S):
                g = gs[s] if ys[s] > 0 else 0.0
                ds[s] = a * (g - gbar) - (xs[s] - m) * rstd * k2
        else:
            for s in range(S):
                ds[s] = a * (gs[s] - gbar) - (xs[s] - m) * rstd * k2
    elif relu:
        for s in range(S):
            ds[s] = (gs[s] if ys[s] > 0 else 0.0) * sc * rstd
    else:
        for s in range(S):
            ds[s] = gs[s] * sc * rstd


@nb.njit(parallel=True, **_OPTS)
def _bn_bw_dx_parallel(dy, x, y, relu, scale, dx, st, rows, C, S, M, training):
    for r in nb.prange(rows):
        _bn_bw_dx_task(dy, x, y, relu, scale, dx, st, r, C, S, M, training)


@nb.njit(**_OPTS)
def _bn_bw_dx_serial(dy, x, y, relu, scale, dx, st, rows, C, S, M, training):
    for r in range(rows):
        _bn_bw_dx_task(dy, x, y, relu, scale, dx, st, r, C, S, M, training)


# channel-major path for short planes (see norm.SMALL_PLANE): one vector loop per sample over a
# range of channels, with per-element sums and coefficients
@nb.njit(**_OPTS)
def _bn_bw_stats_range_small(dy, x, y, relu, scale, lo, hi, N, C, S, training, mean_in, var_in, eps, st):
    L = C * S
    W = (hi - lo) * S
    sh = channel_shifts(x, lo, hi, S)
    a_s = np.zeros(W, np.float32)
    a_q = np.zeros(W, np.float32)
    a_g = np.zeros(W, np.float32)
    a_gd = np.zeros(W, np.float32)
    for n in range(N):
        xs = x[n * L + lo * S : n * L + hi * S]
        gs = dy[n * L + lo * S : n * L + hi * S]
        ys = y[n * L + lo * S : n * L + hi * S]
        if relu:
            for i in range(W):
                d = xs[i] - sh[i]
                gi = gs[i] if ys[i] > 0 else _Z32
                a_s[i] += d
                a_q[i] += d * d
                a_g[i] += gi
                a_gd[i] += gi * d
        else:
            for i in range(W):
                d = xs[i] - sh[i]
                gi = gs[i]
                a_s[i] += d
                a_q[i] += d * d
                a_g[i] += gi
                a_gd[i] += gi * d
    M = N * S
    for c in range(lo, hi):
        s1 = 0.0
        q = 0.0
        sg = 0.0
        sgd = 0.0
        for k in range((c - lo) * S, (c - lo + 1) * S):
            s1 += a_s[k]
            q += a_q[k]
            sg += a_g[k]
            sgd += a_gd[k]
        sc = float(scale[c])
        md = s1 / M
        var = max(q / M - md * md, 0.0)
        sgd -= md * sg
        if not (training and np.isfinite(sc) and np.isfinite(sgd) and np.isfinite(sg) and np.isfinite(var)):
            # NaN/Inf, or fixed statistics: the exact per-channel passes
            _bn_bw_stats_task(dy, x, y, relu, scale, c, N, C, S, training, True, mean_in, var_in, eps, st)
            continue
        rstd = 1.0 / np.sqrt(var + eps)
        st[c, 0] = sh[(c - lo) * S] + md
        st[c, 1] = rstd
        st[c, 2] = sg
        st[c, 3] = sgd * rstd
        st[c, 4] = sc * sgd * rstd


# float32 planes of SMALL_PLANE values or more: float32 sums within a plane (vector lanes), float64
# across planes; dx in float32 from per-channel factors
@nb.njit(**_OPTS)
def _bn_bw_stats_plane_f32(dy, x, y, relu, scale, c, N, C, S, training, mean_in, var_in, eps, st):
    sc = float(scale[c])
    shift = x[c * S]
    s1 = 0.0
    q = 0.0
    sg = 0.0
    sgd = 0.0
    for n in range(N):
        xs = x[(n * C + c) * S : (n * C + c) * S + S]
        gs = dy[(n * C + c) * S : (n * C + c) * S + S]
        ys = y[(n * C + c) * S : (n * C + c) * S + S]
        ps = _Z32
        pq = _Z32
        pg = _Z32
        pgd = _Z32
        if relu:
            for i in range(S):
                d = xs[i] - shift
                gi = gs[i] if ys[i] > 0 else _Z32
                ps += d
                pq += d * d
                pg += gi
                pgd += gi * d
        else:
            for i in range(S):
                d = xs[i] - shift
                gi = gs[i]
                ps += d
                pq += d * d
                pg += gi
                pgd += gi * d
        s1 += ps
        q += pq
        sg += pg
        sgd += pgd
    M = N * S
    md = s1 / M
    var = max(q / M - md * md, 0.0)
    sgd -= md * sg
    if not (training and np.isfinite(sc) and np.isfinite(sgd) and np.isfinite(sg) and np.isfinite(var)):
        _bn_bw_stats_task(dy, x, y, relu, scale, c, N, C, S, training, True, mean_in, var_in, eps, st)
        return
    rstd = 1.0 / np.sqrt(var + eps)
    st[c, 0] = shift + md
    st[c, 1] = rstd
    st[c, 2] = sg
    st[c, 3] = sgd * rstd
    st[c, 4] = sc * sgd * rstd


@nb.njit(parallel=True, **_OPTS)
def _bn_bw_stats_plane_f32_parallel(dy, x, y, relu, scale, N, C, S, training, mean_in, var_in, eps, st):
    for c in nb.prange(C):
        _bn_bw_stats_plane_f32(dy, x, y, relu, scale, c, N, C, S, training, mean_in, var_in, eps, st)


@nb.njit(**_OPTS)
def _bn_bw_stats_plane_f32_serial(dy, x, y, relu, scale, N, C, S, training, mean_in, var_in, eps, st):
    for c in range(C):
        _bn_bw_stats_plane_f32(dy, x, y, relu, scale, c, N, C, S, training, mean_in, var_in, eps, st)


@nb.njit(**_OPTS)
def _bn_bw_dx_plane_f32(dy, x, y, relu, scale, dx, st, row, C, S, M, training):
    c = row % C
    rstd = st[c, 1]
    a = np.float32(rstd * scale[c])
    b = np.float32(-rstd * rstd * st[c, 4] / M)
    gbar = np.float32(st[c, 2] / M)
    m = np.float32(st[c, 0])
    xs = x[row * S : row * S + S]
    gs = dy[row * S : row * S + S]
    ys = y[row * S : row * S + S]
    ds = dx[row * S : row * S + S]
    if not training:  # x is not read: an Inf or NaN in it must not reach dx
        for i in range(S):
            ds[i] = a * (gs[i] if not relu or ys[i] > 0 else _Z32)
    elif relu:
        for i in range(S):
            g = gs[i] if ys[i] > 0 else _Z32
            ds[i] = a * (g - gbar) + b * (xs[i] - m)
    else:
        for i in range(S):
            ds[i] = a * (gs[i] - gbar) + b * (xs[i] - m)


@nb.njit(parallel=True, **_OPTS)
def _bn_bw_dx_plane_f32_parallel(dy, x, y, relu, scale, dx, st, rows, C, S, M, training):
    for r in nb.prange(rows):
        _bn_bw_dx_plane_f32(dy, x, y, relu, scale, dx, st, r, C, S, M, training)


@nb.njit(**_OPTS)
def _bn_bw_dx_plane_f32_serial(dy, x, y, relu, scale, dx, st, rows, C, S, M, training):
    for r in range(rows):
        _bn_bw_dx_plane_f32(dy, x, y, relu, scale, dx, st, r, C, S, M, training)


@nb.njit(parallel=True, **_OPTS)
def _bn_bw_stats_small_parallel(dy, x, y, relu, scale, N, C, S, training, mean_in, var_in, eps, st, tasks):
    for t in nb.prange(tasks):
        lo, hi = t * C // tasks, (t + 1) * C // tasks
        _bn_bw_stats_range_small(dy, x, y, relu, scale, lo, hi, N, C, S, training, mean_in, var_in, eps, st)


@nb.njit(**_OPTS)
def _bn_bw_stats_small_serial(dy, x, y, relu, scale, N, C, S, training, mean_in, var_in, eps, st, tasks):
    _bn_bw_stats_range_small(dy, x, y, relu, scale, 0, C, N, C, S, training, mean_in, var_in, eps, st)


@nb.njit(**_OPTS)
def _bn_bw_dx_coeffs(scale, st, lo, hi, S, M, training):
    """Channels lo..hi-1's dx = A * (g - mean(g)) + B * (x - mean) factors (_bn_bw_dx_task's
    expression), each expanded to its S elements as float32 lanes (as many as the data's): mean, A,
    B, mean(g)."""
    W = hi - lo
    A = np.empty(W)
    B = np.empty(W)
    G = np.empty(W)
    for c in range(lo, hi):
        rstd = st[c, 1]
        A[c - lo] = rstd * scale[c]
        B[c - lo] = -rstd * rstd * st[c, 4] / M if training else 0.0
        G[c - lo] = st[c, 2] / M if training else 0.0
    me = _expand(st[:, 0], lo, hi, S).astype(np.float32)
    return (
        me,
        _expand(A, 0, W, S).astype(np.float32),
        _expand(B, 0, W, S).astype(np.float32),
        _expand(G, 0, W, S).astype(np.float32),
    )


@nb.njit(**_OPTS)
def _bn_bw_dx_block(gs, xs, ys, ds, me, Ae, Be, Ge, relu, training):
    """One sample's channel range of dx from the expanded factors."""
    if not training:  # x is not read: an Inf or NaN in it must not reach dx
        for i in range(ds.shape[0]):
            ds[i] = Ae[i] * (gs[i] if not relu or ys[i] > 0 else _Z32)
    elif relu:
        for i in range(ds.shape[0]):
            g = gs[i] if ys[i] > 0 else _Z32
            ds[i] = Ae[i] * (g - Ge[i]) + Be[i] * (xs[i] - me[i])
    else:
        for i in range(ds.shape[0]):
            ds[i] = Ae[i] * (gs[i] - Ge[i]) + Be[i] * (xs[i] - me[i])


@nb.njit(**_OPTS)
def _bn_bw_dx_range_small(dy, x, y, relu, scale, dx, st, lo, hi, N, C, S, M, training):
    me, Ae, Be, Ge = _bn_bw_dx_coeffs(scale, st, lo, hi, S, M, training)
    L = C * S
    for n in range(N):
        a, b = n * L + lo * S, n * L + hi * S
        _bn_bw_dx_block(dy[a:b], x[a:b], y[a:b], dx[a:b], me, Ae, Be, Ge, relu, training)


@nb.njit(**_OPTS)
def _bn_bw_dx_range_small_bf16(dy, x, y, relu, scale, dx, st, lo, hi, N, C, S, M, training):
    # the float32 block on each sample's widened channel range, dx rounded once (bit-equal to float32's)
    me, Ae, Be, Ge = _bn_bw_dx_coeffs(scale, st, lo, hi, S, M, training)
    L = C * S
    W = (hi - lo) * S
    xu = np.empty(W, np.uint32)
    gu = np.empty(W, np.uint32)
    yu = np.empty(W if relu else 0, np.uint32)
    du = np.empty(W, np.uint32)
    xf, gf, yf, df = xu.view(np.float32), gu.view(np.float32), yu.view(np.float32), du.view(np.float32)
    for n in range(N):
        a = n * L + lo * S
        if training:
            _widen(x[a : a + W], xu, xf, KIND_BF16)
        _widen(dy[a : a + W], gu, gf, KIND_BF16)
        if relu:
            _widen(y[a : a + W], yu, yf, KIND_BF16)
        _bn_bw_dx_block(gf, xf, yf if relu else gf, df, me, Ae, Be, Ge, relu, training)
        _narrow(df, du, dx[a : a + W], KIND_BF16)


@nb.njit(parallel=True, **_OPTS)
def _bn_bw_dx_small_parallel_bf16(dy, x, y, relu, scale, dx, st, N, C, S, M, training, tasks):
    for t in nb.prange(tasks):
        lo, hi = t * C // tasks, (t + 1) * C // tasks
        _bn_bw_dx_range_small_bf16(dy, x, y, relu, scale, dx, st, lo, hi, N, C, S, M, training)


@nb.njit(**_OPTS)
def _bn_bw_dx_small_serial_bf16(dy, x, y, relu, scale, dx, st, N, C, S, M, training, tasks):
    _bn_bw_dx_range_small_bf16(dy, x, y, relu, scale, dx, st, 0, C, N, C, S, M, training)


@nb.njit(parallel=True, **_OPTS)
def _bn_bw_dx_small_parallel(dy, x, y, relu, scale, dx, st, N, C, S, M, training, tasks):
    for t in nb.prange(tasks):
        lo, hi = t * C // tasks, (t + 1) * C // tasks
        _bn_bw_dx_range_small(dy, x, y, relu, scale, dx, st, lo, hi, N, C, S, M, training)


@nb.njit(**_OPTS)
def _bn_bw_dx_small_serial(dy, x, y, relu, scale, dx, st, N, C, S, M, training, tasks):
    _bn_bw_dx_range_small(dy, x, y, relu, scale, dx, st, 0, C, N, C, S, M, training)


# bfloat16 dy / x / y (uint16 bit views): each channel (stats) or plane (dx) is widened to
# float32 buffers and run through the float32 task; dx is the float32 kernel's rounded to bf16
@nb.njit(**_OPTS)
def _bn_bw_stats_range_bf16(dy, x, y, relu, scale, lo, hi, N, C, S, training, mean_in, var_in, eps, st):
    # channel-sized buffers once per task, reused over its channels
    M = N * S
    xu = np.empty(M, np.uint32)
    gu = np.empty(M, np.uint32)
    yu = np.empty(M if relu else 0, np.uint32)
    xf, gf, yf = xu.view(np.float32), gu.view(np.float32), yu.view(np.float32)
    for c in range(lo, hi):
        widen_channel_bf16(x, c, N, C, S, xu, xf)
        widen_channel_bf16(dy, c, N, C, S, gu, gf)
        if relu:
            widen_channel_bf16(y, c, N, C, S, yu, yf)
        k = c if not training else 0  # mean_in / var_in are read only outside training
        _bn_bw_stats_plane_f32(
            gf,
            xf,
            yf if relu else gf,
            relu,
            scale[c : c + 1],
            0,
            N,
            1,
            S,
            training,
            mean_in[k : k + 1],
            var_in[k : k + 1],
            eps,
            st[c : c + 1],
        )


@nb.njit(**_OPTS)
def _bn_bw_stats_any_bf16(dy, x, y, relu, scale, lo, hi, N, C, S, training, mean_in, var_in, eps, st):
    # the float32 kernel's path for this plane size, on widened buffers (bit-equal sums)
    if S < SMALL_PLANE:
        xf = widen_range_bf16(x, lo, hi, N, C, S)
        gf = widen_range_bf16(dy, lo, hi, N, C, S)
        yf = widen_range_bf16(y, lo, hi, N, C, S) if relu else gf
        ml, vl = (mean_in, var_in) if training else (mean_in[lo:hi], var_in[lo:hi])
        W = hi - lo
        _bn_bw_stats_range_small(gf, xf, yf, relu, scale[lo:hi], 0, W, N, W, S, training, ml, vl, eps, st[lo:hi])
    else:
        _bn_bw_stats_range_bf16(dy, x, y, relu, scale, lo, hi, N, C, S, training, mean_in, var_in, eps, st)


@nb.njit(parallel=True, **_OPTS)
def _bn_bw_stats_parallel_bf16(dy, x, y, relu, scale, N, C, S, training, mean_in, var_in, eps, st, tasks):
    for t in nb.prange(tasks):
        lo, hi = t * C // tasks, (t + 1) * C // tasks
        _bn_bw_stats_any_bf16(dy, x, y, relu, scale, lo, hi, N, C, S, training, mean_in, var_in, eps, st)


@nb.njit(**_OPTS)
def _bn_bw_stats_serial_bf16(dy, x, y, relu, scale, N, C, S, training, mean_in, var_in, eps, st, tasks):
    _bn_bw_stats_any_bf16(dy, x, y, relu, scale, 0, C, N, C, S, training, mean_in, var_in, eps, st)


@nb.njit(**_OPTS)
def _bn_bw_dx_rows_bf16(dy, x, y, relu, scale, dx, st, lo, hi, C, S, M, training):
    xu = np.empty(S, np.uint32)
    gu = np.empty(S, np.uint32)
    yu = np.empty(S if relu else 0, np.uint32)
    xf, gf, yf = xu.view(np.float32), gu.view(np.float32), yu.view(np.float32)
    du = np.empty(S, np.uint32)  # a separate output: in place, the aliasing defeats vectorisation
    df = du.view(np.float32)
    for row in range(lo, hi):
        c = row % C
        a = row * S
        _widen(x[a : a + S], xu, xf, KIND_BF16)
        _widen(dy[a : a + S], gu, gf, KIND_BF16)
        if relu:
            _widen(y[a : a + S], yu, yf, KIND_BF16)
        _bn_bw_dx_plane_f32(gf, xf, yf if relu else gf, relu, scale[c : c + 1], df, st[c : c + 1], 0, 1, S, M, training)
        _narrow(df, du, dx[a : a + S], KIND_BF16)


@nb.njit(parallel=True, **_OPTS)
def _bn_bw_dx_parallel_bf16(dy, x, y, relu, scale, dx, st, rows, C, S, M, training, tasks):
    for t in nb.prange(tasks):
        lo, hi = t * rows // tasks, (t + 1) * rows // tasks
        _bn_bw_dx_rows_bf16(dy, x, y, relu, scale, dx, st, lo, hi, C, S, M, training)


@nb.njit(**_OPTS)
def _bn_bw_dx_serial_bf16(dy, x, y, relu, scale, dx, st, rows, C, S, M, training, tasks):
    _bn_bw_dx_rows_bf16(dy, x, y, relu, scale, dx, st, 0, rows, C, S, M, training)


_UNUSED = np.zeros(1)  # the statistics inputs of training mode (never read)


def batch_norm_backward(
    dy: np.ndarray,
    x: np.ndarray,
    scale: np.ndarray,
    mean,
    var,
    dx: np.ndarray,
    st: np.ndarray,
    N: int,
    C: int,
    S: int,
    eps: float,
    parallel: bool,
    training: bool,
    y: np.ndarray | None = None,
) -> tuple:
    """Gradients of BatchNorm over x viewed as (N, C, S), in two passes: per-channel statistics
    and sums (parallel over channels), then dx (parallel over (n, c) planes). Training uses the
    batch statistics (their gradient flows into dx); otherwise ``mean``/``var`` (float64 (C,)).
    ``y``: the output of a BatchNorm with a fused ReLU; ``dy`` counts only where ``y > 0``.
    ``scale`` float64 (C,), ``st`` float64 (C, 5) scratch. Returns (dScale, dBias) float64.
    bfloat16 dy, x, dx (and y): float32 math per channel / plane, dx rounded to bfloat16."""
    M = N * S
    if M == 0 or C == 0:
        return np.zeros(C), np.zeros(C)
    relu = y is not None
    m_in = mean if mean is not None else _UNUSED
    v_in = var if var is not None else _UNUSED
    if x.dtype == BF16 and dy.dtype == BF16 and dx.dtype == BF16:
        xf, gf = x.reshape(-1).view(np.uint16), dy.reshape(-1).view(np.uint16)
        yf = y.reshape(-1).view(np.uint16) if relu else gf
        tasks = 4 * nb.get_num_threads()
        (_bn_bw_stats_parallel_bf16 if parallel else _bn_bw_stats_serial_bf16)(
            gf, xf, yf, relu, scale, N, C, S, training, m_in, v_in, float(eps), st, max(1, min(C, tasks))
        )
        small = small_plane_tasks(C, S, parallel)
        if small:
            (_bn_bw_dx_small_parallel_bf16 if parallel else _bn_bw_dx_small_serial_bf16)(
                gf, xf, yf, relu, scale, dx.reshape(-1).view(np.uint16), st, N, C, S, M, training, small
            )
        else:
            (_bn_bw_dx_parallel_bf16 if parallel else _bn_bw_dx_serial_bf16)(
                gf, xf, yf, relu, scale, dx.reshape(-1).view(np.uint16), st, N * C, C, S, M, training, min(N * C, tasks)
            )
        return st[:, 3].copy(), st[:, 2].copy()
    xf, gf = x.reshape(-1), dy.reshape(-1)
    yf = y.reshape(-1) if relu else gf  # never read without relu
    small = small_plane_tasks(C, S, parallel)
    if small and x.dtype == np.float32 and dy.dtype == np.float32 and dx.dtype == np.float32:
        (_bn_bw_stats_small_parallel if parallel else _bn_bw_stats_small_serial)(
            gf, xf, yf, relu, scale, N, C, S, training, m_in, v_in, float(eps), st, small
        )
        (_bn_bw_dx_small_parallel if parallel else _bn_bw_dx_small_serial)(
            gf, xf, yf, relu, scale, dx.reshape(-1), st, N, C, S, M, training, small
        )
        return st[:, 3].copy(), st[:, 2].copy()
    if x.dtype == np.float32 and dy.dtype == np.float32 and dx.dtype == np.float32:
        (_bn_bw_stats_plane_f32_parallel if parallel else _bn_bw_stats_plane_f32_serial)(
            gf, xf, yf, relu, scale, N, C, S, training, m_in, v_in, float(eps), st
        )
        (_bn_bw_dx_plane_f32_parallel if parallel else _bn_bw_dx_plane_f32_serial)(
            gf, xf, yf, relu, scale, dx.reshape(-1), st, N * C, C, S, M, training
        )
        return st[:, 3].copy(), st[:, 2].copy()
    exact = x.dtype == np.float64
    (_bn_bw_stats_parallel if parallel else _bn_bw_stats_serial)(
        gf, xf, yf, relu, scale, N, C, S, training, exact, m_in, v_in, float(eps), st
    )
    (_bn_bw_dx_parallel if parallel else _bn_bw_dx_serial)(
        gf, xf, yf, relu, scale, dx.reshape(-1), st, N * C, C, S, M, training
    )
    return st[:, 3].copy(), st[:, 2].copy()
