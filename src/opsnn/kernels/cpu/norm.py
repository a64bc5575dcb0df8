"""CPU normalization kernels (numba): per-row statistics in one pass, a second pass writes.

LayerNorm/RMSNorm rows are the normalized trailing block; GroupNorm/InstanceNorm rows are
one (sample, group); BatchNorm rows are one (sample, channel) plane with per-channel
affine terms. Rows run in parallel (serial below ``PARALLEL_MIN`` elements).

Statistics accumulate in float64 (GroupNorm, BatchNorm, float64 rows). For float32 rows,
mean and variance come from ONE pass of *shifted* sums ``sum(d)``, ``sum(d*d)`` with
``d = x - x[0]`` in float64: the pass vectorises (a Welford update divides per element and
is a serial chain), and the cancellation in ``E[d²] - E[d]²`` costs about
``eps64 · ((x0 - mean)² + var) / var`` relative error — with the shift, ``|x0 - mean|`` is
of the order of the spread, so that is ~1e-15, far below float32 resolution. Float64 rows
have no wider type to absorb cancellation, so they take the exact two-pass route (mean,
then centred squares); the row is still hot in cache for the second read.

LayerNorm/RMSNorm float32 rows (a few KiB, cache-resident) instead run every loop in float32
8 lanes wide — blocks of ``_BLK`` float32 partial sums joined in float64, a corrected
two-pass variance — and normalise in float32 (``_stats_row32``): faster than float64 sums,
within float32 rounding of the float64 reference.
"""

from __future__ import annotations

import math

import ml_dtypes
import numba as nb
import numpy as np

from ...runtime import kernel_cache
from ...runtime.memory import check_request
from .gemm import KIND_BF16, _narrow, _widen

BF16 = np.dtype(ml_dtypes.bfloat16)

#: below this many elements the serial variant runs: waking a parallel region's second thread
#: costs more than it saves (figures: docs/performance.md, "Parallel thresholds")
PARALLEL_MIN = 1 << 17
#: BatchNorm reads its input two or three times: two threads pay from a few tens of thousands of values
BN_PARALLEL_MIN = 1 << 15

_OPTS = dict(nogil=True, cache=True, error_model="numpy", fastmath={"reassoc", "contract"})


# Loops index slices from 0 (``xs = x[lo:hi]; xs[i]``): indexing ``x[lo + i]`` makes numba
# emit a negative-index wraparound check that stops LLVM from vectorising the loop.
@nb.njit(**_OPTS)
def _stats(xs, exact):
    """(mean, population variance) of the 1-D slice xs in float64."""
    n = xs.size
    if n == 0:
        return np.nan, np.nan
    if exact:
        s = 0.0
        for i in range(n):
            s += xs[i]
        mean = s / n
        q = 0.0
        for i in range(n):
            d = xs[i] - mean
            q += d * d
        return mean, q / n
    shift = float(xs[0])
    s = 0.0
    q = 0.0
    for i in range(n):
        d = xs[i] - shift
        s += d
        q += d * d
    m = s / n
    var = q / n - m * m
    if var < 0.0:
        var = 0.0
    return shift + m, var


# -- LayerNorm / RMSNorm ------------------------------------------------------------------------
#: float32 partial sums run over blocks of this many elements, then join float64 totals:
#: the vector loop stays 8 lanes wide and the float32 error stays that of a short sum
_BLK = 512


@nb.njit(**_OPTS)
def _shifted_sums32(xs, c):
    """(sum(x - c), sum((x - c)²)) of a float32 row: float32 vector loops per block of
    ``_BLK``, float64 totals."""
    n = xs.size
    s = 0.0
    q = 0.0
    for b0 in range(0, n, _BLK):
        blk = xs[b0 : min(b0 + _BLK, n)]
        ts = np.float32(0.0)
        tq = np.float32(0.0)
        for i in range(blk.size):
            d = blk[i] - c
            ts += d
            tq += d * d
        s += ts
        q += tq
    return s, q


@nb.njit(**_OPTS)
def _stats_row32(xs):
    """(mean, population variance) of a float32 row in float32 vector loops (float64 sums of
    float32 data cost a widening convert and half-width vectors per element), with float64
    totals per block of ``_BLK``.

    One pass of sums shifted by ``c``, the mean of the first 8 elements (``d = x - c``,
    ``sum(d)``, ``sum(d*d)``), whose float32 cancellation in ``E[d²] - E[d]²`` costs about
    ``eps32 · (E[d]² + var) / var``: when ``c`` lies within 2 standard deviations of the mean
    (``E[d]² <= 4 var``; typically ``E[d]² ~ var / 8``) that is a few float32 ulps.
    Otherwise (outliers among the first elements, rare) a second pass computes
    the *corrected* two-pass variance ``E[(x-m)²] - E[x-m]²`` around the mean, accurate
    whatever the row's offset."""
    n = xs.size
    k = min(n, 8)
    shift = np.float32(0.0)
    for i in range(k):
        shift += xs[i]
    shift = np.float32(shift / np.float32(k))
    s, q = _shifted_sums32(xs, shift)
    md = s / n
    var = q / n - md * md
    if md * md <= 4.0 * var:
        return float(shift) + md, var
    m = np.float32(float(shift) + md)
    c, q = _shifted_sums32(xs, m)
    cm = c / n
    var = q / n - cm * cm
    if var < 0.0:
        var = 0.0
    return float(m) + cm, var


@nb.njit(**_OPTS)
def _sumsq_row32(xs):
    """sum(x*x) of a float32 row: float32 vector loops per block, float64 total."""
    n = xs.size
    q = 0.0
    for b0 in range(0, n, _BLK):
        blk = xs[b0 : min(b0 + _BLK, n)]
        t = np.float32(0.0)
        for i in range(blk.size):
            t += blk[i] * blk[i]
        q += t
    return q


@nb.njit(**_OPTS)
def _ln_task(x, scale, bias, has_bias, y, mean_o, inv_o, row, N, eps, rms):
    """Row ``row`` of a float64 LayerNorm/RMSNorm: float64 statistics (exact two-pass)."""
    xs = x[row * N : row * N + N]
    ys = y[row * N : row * N + N]
    if rms:
        q = 0.0
        for i in range(N):
            v = float(xs[i])
            q += v * v
        mean = 0.0
        inv = 1.0 / np.sqrt(q / N + eps)
        for j in range(N):
            ys[j] = xs[j] * inv * scale[j]
    else:
        mean, var = _stats(xs, True)
        inv = 1.0 / np.sqrt(var + eps)
        if has_bias:
            for j in range(N):
                ys[j] = (xs[j] - mean) * inv * scale[j] + bias[j]
        else:
            for j in range(N):
                ys[j] = (xs[j] - mean) * inv * scale[j]
    mean_o[row] = mean
    inv_o[row] = inv


@nb.njit(**_OPTS)
def norm_rows32(x, scale, bias, has_bias, y, mean_o, inv_o, r0, r1, N, eps, rms):
    """Rows ``r0..r1`` of a float32 LayerNorm/RMSNorm, every loop in float32 (8 lanes): the
    statistics of ``_stats_row32`` / ``_sumsq_row32``, then ``y = ((x - mh)*a - ml*a) * scale + bias``
    with the mean split as ``mh + ml``.
    A loop over rows in one function (not a call per row): per-row calls cost a sizeable share
    of a short row's time."""
    for row in range(r0, r1):
        xs = x[row * N : row * N + N]
        ys = y[row * N : row * N + N]
        if rms:
            mean = 0.0
            inv = 1.0 / np.sqrt(_sumsq_row32(xs) / N + eps)
            a = np.float32(inv)
            for j in range(N):
                ys[j] = xs[j] * a * scale[j]
        else:
            mean, var = _stats_row32(xs)
            inv = 1.0 / np.sqrt(var + eps)
            # the mean split as mh + ml: x - mh is exact where it matters (x near the mean),
            # so a large offset (|mean| >> std) loses nothing to float32 rounding of the mean
            a = np.float32(inv)
            mh = np.float32(mean)
            c1 = np.float32((mean - float(mh)) * inv)
            if has_bias:
                for j in range(N):
                    ys[j] = ((xs[j] - mh) * a - c1) * scale[j] + bias[j]
            else:
                for j in range(N):
                    ys[j] = ((xs[j] - mh) * a - c1) * scale[j]
        mean_o[row] = mean
        inv_o[row] = inv


@nb.njit(parallel=True, **_OPTS)
def _ln_parallel(x, scale, bias, has_bias, y, mean_o, inv_o, rows, N, eps, rms):
    for r in nb.prange(rows):
        _ln_task(x, scale, bias, has_bias, y, mean_o, inv_o, r, N, eps, rms)


@nb.njit(**_OPTS)
def _ln_serial(x, scale, bias, has_bias, y, mean_o, inv_o, rows, N, eps, rms):
    for r in range(rows):
        _ln_task(x, scale, bias, has_bias, y, mean_o, inv_o, r, N, eps, rms)


@nb.njit(parallel=True, **_OPTS)
def _ln_parallel32(x, scale, bias, has_bias, y, mean_o, inv_o, rows, N, eps, rms, chunks):
    for c in nb.prange(chunks):
        norm_rows32(
            x, scale, bias, has_bias, y, mean_o, inv_o, rows * c // chunks, rows * (c + 1) // chunks, N, eps, rms
        )


def layer_norm(
    x: np.ndarray,
    scale: np.ndarray,
    bias,
    y: np.ndarray,
    stats: np.ndarray,
    rows: int,
    N: int,
    eps: float,
    rms: bool,
    parallel: bool,
) -> None:
    """Normalize each of ``rows`` contiguous rows of ``N`` elements; ``scale``/``bias`` are
    N-vectors (bias may be None). ``stats`` (float64, 2*rows) receives mean and 1/std."""
    if rows * N == 0:
        stats[: 2 * rows] = np.nan if N == 0 else 0.0
        return
    cd = x.dtype
    s = scale.astype(cd, copy=False)
    b = bias.astype(cd, copy=False) if bias is not None else s
    xf, yf, mo, io = x.reshape(-1), y.reshape(-1), stats[:rows], stats[rows : 2 * rows]
    if cd == np.float32:
        if parallel:
            _ln_parallel32(
                xf, s, b, bias is not None, yf, mo, io, rows, N, float(eps), rms, min(rows, 4 * nb.get_num_threads())
            )
        else:
            norm_rows32(xf, s, b, bias is not None, yf, mo, io, 0, rows, N, float(eps), rms)
        return
    run = _ln_parallel if parallel else _ln_serial
    run(xf, s, b, bias is not None, yf, mo, io, rows, N, float(eps), rms)


def layer_norm_numpy(x, scale, bias, y, stats, rows: int, N: int, eps: float, rms: bool) -> None:
    """:func:`layer_norm` in numpy with float64 statistics and arithmetic: nothing to compile, a cold
    plan's kernel while the numba one compiles in the background (``opsnn.ops.tiering``)."""
    if rows * N == 0:
        stats[: 2 * rows] = np.nan if N == 0 else 0.0
        return
    with np.errstate(all="ignore"):
        w = x.reshape(rows, N).astype(np.float64)
        if rms:
            mean = np.zeros(rows)
            inv = 1.0 / np.sqrt(np.einsum("ij,ij->i", w, w) / N + eps)
        else:
            mean = w.mean(axis=1)
            w -= mean[:, None]
            inv = 1.0 / np.sqrt(np.einsum("ij,ij->i", w, w) / N + eps)
        w *= inv[:, None]
        w *= scale.reshape(1, N)
        if bias is not None:
            w += bias.reshape(1, N)
        np.copyto(y.reshape(rows, N), w, casting="unsafe")
    stats[:rows] = mean
    stats[rows : 2 * rows] = inv


# -- GroupNorm / InstanceNorm -------------------------------------------------------------------
@nb.njit(**_OPTS)
def _gn_task(x, scale, bias, y, row, G, Cg, S, eps, exact):
    lo = row * Cg * S
    mean, var = _stats(x[lo : lo + Cg * S], exact)
    inv = 1.0 / np.sqrt(var + eps)
    g = row % G
    for k in range(Cg):
        c = g * Cg + k
        a = inv * scale[c]
        bb = bias[c]
        xs = x[lo + k * S : lo + k * S + S]
        ys = y[lo + k * S : lo + k * S + S]
        for s in range(S):
            ys[s] = (xs[s] - mean) * a + bb


@nb.njit(parallel=True, **_OPTS)
def _gn_parallel(x, scale, bias, y, rows, G, Cg, S, eps, exact):
    for r in nb.prange(rows):
        _gn_task(x, scale, bias, y, r, G, Cg, S, eps, exact)


@nb.njit(**_OPTS)
def _gn_serial(x, scale, bias, y, rows, G, Cg, S, eps, exact):
    for r in range(rows):
        _gn_task(x, scale, bias, y, r, G, Cg, S, eps, exact)


def group_norm(
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    y: np.ndarray,
    N: int,
    G: int,
    Cg: int,
    S: int,
    eps: float,
    parallel: bool,
) -> None:
    """x viewed as (N, G, Cg, S): statistics per (n, g), affine per channel g*Cg + k."""
    if x.size == 0:
        return
    cd = x.dtype
    run = _gn_parallel if parallel else _gn_serial
    run(
        x.reshape(-1),
        scale.astype(cd, copy=False),
        bias.astype(cd, copy=False),
        y.reshape(-1),
        N * G,
        G,
        Cg,
        S,
        float(eps),
        cd == np.float64,
    )


# -- BatchNorm ----------------------------------------------------------------------------------
@nb.njit(**_OPTS)
def _bn_task(x, mean, a, b, y, row, C, S, relu):
    c = row % C
    m = mean[c]
    ac = a[c]
    bc = b[c]
    xs = x[row * S : row * S + S]
    ys = y[row * S : row * S + S]
    if relu:
        for s in range(S):
            v = (xs[s] - m) * ac + bc
            ys[s] = 0.0 if v < 0.0 else v  # NaN stays NaN, as Relu
    else:
        for s in range(S):
            ys[s] = (xs[s] - m) * ac + bc


@nb.njit(parallel=True, **_OPTS)
def _bn_parallel(x, mean, a, b, y, rows, C, S, relu):
    for r in nb.prange(rows):
        _bn_task(x, mean, a, b, y, r, C, S, relu)


@nb.njit(**_OPTS)
def _bn_serial(x, mean, a, b, y, rows, C, S, relu):
    for r in range(rows):
        _bn_task(x, mean, a, b, y, r, C, S, relu)


@nb.njit(**_OPTS)
def _bn_stats_task(x, c, N, C, S, exact, mean_o, var_o):
    """Mean and population variance of channel c over (N, S) of an (N, C, S) array."""
    cnt = N * S
    if cnt == 0:
        mean_o[c] = np.nan
        var_o[c] = np.nan
        return
    if exact:
        s = 0.0
        for n in range(N):
            xs = x[(n * C + c) * S : (n * C + c) * S + S]
            for i in range(S):
                s += xs[i]
        m = s / cnt
        q = 0.0
        for n in range(N):
            xs = x[(n * C + c) * S : (n * C + c) * S + S]
            for i in range(S):
                d = xs[i] - m
                q += d * d
        mean_o[c] = m
        var_o[c] = q / cnt
        return
    shift = float(x[c * S])
    s = 0.0
    q = 0.0
    for n in range(N):
        xs = x[(n * C + c) * S : (n * C + c) * S + S]
        for i in range(S):
            d = xs[i] - shift
            s += d
            q += d * d
    m = s / cnt
    v = q / cnt - m * m
    mean_o[c] = shift + m
    var_o[c] = 0.0 if v < 0.0 else v  # rounding below zero clamped; NaN kept


_Z32 = np.float32(0.0)  # a float32 zero: a float64 literal would widen the float32 loops

#: planes of fewer elements than this run channel-major: a plane of 4-64 values is too short a
#: loop (the deep layers of a CNN on small images), so whole channel ranges are one vector loop per sample
SMALL_PLANE = 128


@nb.njit(**_OPTS)
def _expand(v, lo, hi, S):
    """v's channels lo..hi-1, each repeated S times (the per-element coefficients of a channel range)."""
    out = np.empty((hi - lo) * S)
    for c in range(lo, hi):
        vc = v[c]
        for s in range(S):
            out[(c - lo) * S + s] = vc
    return out


@nb.njit(**_OPTS)
def channel_shifts(x, lo, hi, S):
    """Per element of channels lo..hi-1, the channel's first value (in sample 0): the shift of
    one-pass shifted sums (as _bn_stats_task's), as float32 lanes."""
    sh = np.empty((hi - lo) * S, np.float32)
    for c in range(lo, hi):
        for s in range(S):
            sh[(c - lo) * S + s] = x[c * S]
    return sh


@nb.njit(**_OPTS)
def _bn_stats_range_small(x, lo, hi, N, C, S, mean_o, var_o):
    L = C * S
    W = (hi - lo) * S
    sh = channel_shifts(x, lo, hi, S)
    acc = np.zeros(W, np.float32)
    acq = np.zeros(W, np.float32)
    for n in range(N):
        xs = x[n * L + lo * S : n * L + hi * S]
        for i in range(W):
            d = xs[i] - sh[i]
            acc[i] += d
            acq[i] += d * d
    cnt = N * S
    for c in range(lo, hi):
        s1 = 0.0
        q1 = 0.0
        for s in range((c - lo) * S, (c - lo + 1) * S):
            s1 += acc[s]
            q1 += acq[s]
        m = s1 / cnt
        v = q1 / cnt - m * m
        mean_o[c] = sh[(c - lo) * S] + m
        var_o[c] = 0.0 if v < 0.0 else v  # rounding below zero clamped; NaN kept


@nb.njit(parallel=True, **_OPTS)
def _bn_stats_small_parallel(x, N, C, S, mean_o, var_o, tasks):
    for t in nb.prange(tasks):
        _bn_stats_range_small(x, t * C // tasks, (t + 1) * C // tasks, N, C, S, mean_o, var_o)


@nb.njit(**_OPTS)
def _bn_stats_small_serial(x, N, C, S, mean_o, var_o, tasks):
    _bn_stats_range_small(x, 0, C, N, C, S, mean_o, var_o)


@nb.njit(**_OPTS)
def _bn_apply_block(xs, me, ae, be, ys, relu):
    """One sample's channel range: y = (x - mean) * a + b per element (expanded coefficients)."""
    if relu:
        for i in range(xs.shape[0]):
            v = (xs[i] - me[i]) * ae[i] + be[i]
            ys[i] = _Z32 if v < _Z32 else v
    else:
        for i in range(xs.shape[0]):
            ys[i] = (xs[i] - me[i]) * ae[i] + be[i]


@nb.njit(**_OPTS)
def _bn_apply_coeffs(mean, a, b, lo, hi, S):
    # float32 lanes: as many as the data's
    return (
        _expand(mean, lo, hi, S).astype(np.float32),
        _expand(a, lo, hi, S).astype(np.float32),
        _expand(b, lo, hi, S).astype(np.float32),
    )


@nb.njit(**_OPTS)
def _bn_apply_range_small(x, mean, a, b, y, lo, hi, N, C, S, relu):
    L = C * S
    me, ae, be = _bn_apply_coeffs(mean, a, b, lo, hi, S)
    for n in range(N):
        _bn_apply_block(x[n * L + lo * S : n * L + hi * S], me, ae, be, y[n * L + lo * S : n * L + hi * S], relu)


@nb.njit(**_OPTS)
def _bn_apply_range_small_bf16(x, mean, a, b, y, lo, hi, N, C, S, relu):
    # the float32 block on each sample's widened channel range, rounded once (bit-equal to float32's)
    L = C * S
    W = (hi - lo) * S
    me, ae, be = _bn_apply_coeffs(mean, a, b, lo, hi, S)
    tu = np.empty(W, np.uint32)
    tf = tu.view(np.float32)
    ou = np.empty(W, np.uint32)
    of = ou.view(np.float32)
    for n in range(N):
        a0 = n * L + lo * S
        _widen(x[a0 : a0 + W], tu, tf, KIND_BF16)
        _bn_apply_block(tf, me, ae, be, of, relu)
        _narrow(of, ou, y[a0 : a0 + W], KIND_BF16)


@nb.njit(parallel=True, **_OPTS)
def _bn_apply_small_parallel_bf16(x, mean, a, b, y, N, C, S, relu, tasks):
    for t in nb.prange(tasks):
        _bn_apply_range_small_bf16(x, mean, a, b, y, t * C // tasks, (t + 1) * C // tasks, N, C, S, relu)


@nb.njit(**_OPTS)
def _bn_apply_small_serial_bf16(x, mean, a, b, y, N, C, S, relu, tasks):
    _bn_apply_range_small_bf16(x, mean, a, b, y, 0, C, N, C, S, relu)


@nb.njit(parallel=True, **_OPTS)
def _bn_apply_small_parallel(x, mean, a, b, y, N, C, S, relu, tasks):
    for t in nb.prange(tasks):
        _bn_apply_range_small(x, mean, a, b, y, t * C // tasks, (t + 1) * C // tasks, N, C, S, relu)


@nb.njit(**_OPTS)
def _bn_apply_small_serial(x, mean, a, b, y, N, C, S, relu, tasks):
    _bn_apply_range_small(x, mean, a, b, y, 0, C, N, C, S, relu)


def small_plane_tasks(C: int, S: int, parallel: bool) -> int:
    """Channel ranges for the channel-major path (0: planes long enough for the per-plane one)."""
    if S >= SMALL_PLANE:
        return 0
    return max(1, min(C, 4 * nb.get_num_threads())) if parallel else 1


# bfloat16 storage (uint16 bit views): each (n, c) plane or channel is widened to a float32
# buffer and run through the float32 task, so results equal the float32 kernel's rounded to bf16
@nb.njit(**_OPTS)
def _bn_rows_bf16(x, mean, a, b, y, lo, hi, C, S, relu):
    tu = np.empty(S, np.uint32)
    tf = tu.view(np.float32)
    ou = np.empty(S, np.uint32)  # a separate output: in place, the aliasing defeats vectorisation
    of = ou.view(np.float32)
    for row in range(lo, hi):
        c = row % C
        _widen(x[row * S : row * S + S], tu, tf, KIND_BF16)
        _bn_task(tf, mean[c : c + 1], a[c : c + 1], b[c : c + 1], of, 0, 1, S, relu)
        _narrow(of, ou, y[row * S : row * S + S], KIND_BF16)


@nb.njit(parallel=True, **_OPTS)
def _bn_parallel_bf16(x, mean, a, b, y, rows, C, S, relu, tasks):
    for t in nb.prange(tasks):
        _bn_rows_bf16(x, mean, a, b, y, t * rows // tasks, (t + 1) * rows // tasks, C, S, relu)


@nb.njit(**_OPTS)
def _bn_serial_bf16(x, mean, a, b, y, rows, C, S, relu, tasks):
    _bn_rows_bf16(x, mean, a, b, y, 0, rows, C, S, relu)


@nb.njit(**_OPTS)
def widen_channel_bf16(x, c, N, C, S, tu, tf):
    """Channel c's N planes of a bf16 (N, C, S) bit array into the float32 (N * S) buffer tf."""
    for n in range(N):
        _widen(x[(n * C + c) * S : (n * C + c) * S + S], tu[n * S : n * S + S], tf[n * S : n * S + S], KIND_BF16)


@nb.njit(**_OPTS)
def _bn_stats_range_bf16(x, lo, hi, N, C, S, mean_o, var_o):
    # one channel-sized buffer per task, reused over its channels (no allocation per channel)
    tu = np.empty(N * S, np.uint32)
    tf = tu.view(np.float32)
    for c in range(lo, hi):
        widen_channel_bf16(x, c, N, C, S, tu, tf)
        _bn_stats_task(tf, 0, N, 1, S, False, mean_o[c : c + 1], var_o[c : c + 1])


@nb.njit(**_OPTS)
def widen_range_bf16(x, lo, hi, N, C, S):
    """Channels lo..hi-1 of a bf16 (N, C, S) bit array as a float32 (N, hi - lo, S) buffer (flat)."""
    W = (hi - lo) * S
    tu = np.empty(N * W, np.uint32)
    tf = tu.view(np.float32)
    for n in range(N):
        a = (n * C + lo) * S
        _widen(x[a : a + W], tu[n * W : n * W + W], tf[n * W : n * W + W], KIND_BF16)
    return tf


@nb.njit(**_OPTS)
def _bn_stats_any_bf16(x, lo, hi, N, C, S, mean_o, var_o):
    # the float32 kernel's path for this plane size, on widened buffers (bit-equal statistics)
    if S < SMALL_PLANE:
        tf = widen_range_bf16(x, lo, hi, N, C, S)
        _bn_stats_range_small(tf, 0, hi - lo, N, hi - lo, S, mean_o[lo:hi], var_o[lo:hi])
    else:
        _bn_stats_range_bf16(x, lo, hi, N, C, S, mean_o, var_o)


@nb.njit(parallel=True, **_OPTS)
def _bn_stats_parallel_bf16(x, N, C, S, mean_o, var_o, tasks):
    for t in nb.prange(tasks):
        _bn_stats_any_bf16(x, t * C // tasks, (t + 1) * C // tasks, N, C, S, mean_o, var_o)


@nb.njit(**_OPTS)
def _bn_stats_serial_bf16(x, N, C, S, mean_o, var_o, tasks):
    _bn_stats_any_bf16(x, 0, C, N, C, S, mean_o, var_o)


@nb.njit(parallel=True, **_OPTS)
def _bn_stats_parallel(x, N, C, S, exact, mean_o, var_o):
    for c in nb.prange(C):
        _bn_stats_task(x, c, N, C, S, exact, mean_o, var_o)


@nb.njit(**_OPTS)
def _bn_stats_serial(x, N, C, S, exact, mean_o, var_o):
    for c in range(C):
        _bn_stats_task(x, c, N, C, S, exact, mean_o, var_o)


def batch_norm(
    x: np.ndarray,
    scale,
    bias,
    mean,
    var,
    y: np.ndarray,
    N: int,
    C: int,
    S: int,
    eps: float,
    parallel: bool,
    training: bool,
    momentum: float,
    unbiased: bool = False,
    relu: bool = False,
):
    """Inference: normalise with the given statistics. Training: per-channel batch statistics
    (population variance), and return the updated running (mean, var) in float64:
    ``running * momentum + batch * (1 - momentum)``, the batch variance unbiased
    (``n / (n - 1)``, torch's running update) when ``unbiased``, else the population one (ONNX).
    ``relu``: y = max(normalised, 0) in the same pass. bfloat16 x and y: float32 math per plane
    (float64 statistics), the float32 kernel's results rounded to bfloat16."""
    bf16 = x.dtype == BF16
    flat = x.reshape(-1).view(np.uint16) if bf16 else x.reshape(-1)
    small = small_plane_tasks(C, S, parallel)
    if training:
        bm = np.empty(C)
        bv = np.empty(C)
        if x.size and bf16:
            (_bn_stats_parallel_bf16 if parallel else _bn_stats_serial_bf16)(
                flat, N, C, S, bm, bv, max(1, min(C, 4 * nb.get_num_threads()))
            )
        elif x.size and x.dtype == np.float32 and small:
            (_bn_stats_small_parallel if parallel else _bn_stats_small_serial)(flat, N, C, S, bm, bv, small)
        elif x.size:
            (_bn_stats_parallel if parallel else _bn_stats_serial)(flat, N, C, S, x.dtype == np.float64, bm, bv)
        else:
            bm[:] = np.nan
            bv[:] = np.nan
        use_m, use_v = bm, bv
    else:
        use_m, use_v = mean.astype(np.float64), var.astype(np.float64)
    with np.errstate(all="ignore"):
        a = scale.astype(np.float64) / np.sqrt(use_v + eps)
    if x.size:
        bias64 = bias.astype(np.float64)
        if x.dtype != np.float64:  # float32 math per element, the same for float32 and bfloat16 data
            use_m, a, bias64 = use_m.astype(np.float32), a.astype(np.float32), bias64.astype(np.float32)
        if bf16 and small:
            (_bn_apply_small_parallel_bf16 if parallel else _bn_apply_small_serial_bf16)(
                flat, use_m, a, bias64, y.reshape(-1).view(np.uint16), N, C, S, bool(relu), small
            )
        elif bf16:
            tasks = max(1, min(N * C, 4 * nb.get_num_threads()))
            (_bn_parallel_bf16 if parallel else _bn_serial_bf16)(
                flat, use_m, a, bias64, y.reshape(-1).view(np.uint16), N * C, C, S, bool(relu), tasks
            )
        elif small and x.dtype == np.float32:
            (_bn_apply_small_parallel if parallel else _bn_apply_small_serial)(
                flat, use_m, a, bias64, y.reshape(-1), N, C, S, bool(relu), small
            )
        else:
            (_bn_parallel if parallel else _bn_serial)(flat, use_m, a, bias64, y.reshape(-1), N * C, C, S, bool(relu))
    if training:
        rv = bv * (N * S / max(N * S - 1, 1)) if unbiased else bv
        return (
            mean.astype(np.float64) * momentum + bm * (1.0 - momentum),
            var.astype(np.float64) * momentum + rv * (1.0 - momentum),
        )
    return None


# -- rarely-hot ONNX breadth ops (numpy-vectorised) ------------------------------------------------
def lp_normalize(x: np.ndarray, out: np.ndarray, axis: int, p: int) -> None:
    """x / ||x||_p along axis; 0 where the norm is 0 (ONNX)."""
    w = x.astype(np.float64)
    if p == 1:
        norm = np.sum(np.abs(w), axis=axis, keepdims=True)
    else:
        norm = np.sqrt(np.sum(w * w, axis=axis, keepdims=True))
    with np.errstate(all="ignore"):
        r = np.where(norm == 0, 0.0, w / norm)
    np.copyto(out, r, casting="unsafe")


def mean_variance_normalize(x: np.ndarray, out: np.ndarray, axes: tuple) -> None:
    """(x - mean) / (sqrt(var) + 1e-9) over axes (ONNX's function body, float64 math)."""
    w = x.astype(np.float64)
    n = math.prod(x.shape[a] for a in axes)
    with np.errstate(all="ignore"):
        m = np.sum(w, axis=axes, keepdims=True) / n
        d = w - m
        v = np.sum(d * d, axis=axes, keepdims=True) / n
        r = d / (np.sqrt(v) + 1e-9)
    np.copyto(out, r, casting="unsafe")


def lrn(x: np.ndarray, out: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> None:
    """Local response normalisation across channels (axis 1), the window
    channels ``[c - floor((size-1)/2), c + ceil((size-1)/2)]`` clipped to the range, summed one
    shifted slice per offset (a prefix sum would carry a NaN or Inf into every later channel)."""
    # three float64 arrays of x's size, outside the pool: checked first, then updated in place
    check_request(24 * x.size, "LRN: float64 window sums")
    w = x.astype(np.float64)
    C = x.shape[1]
    before = (size - 1) // 2
    after = math.ceil((size - 1) / 2)
    sq = w * w
    win = np.zeros_like(sq)
    for d in range(-before, after + 1):
        lo, hi = max(0, -d), min(C, C - d)  # channels c whose neighbour c + d exists
        if lo < hi:
            win[:, lo:hi] += sq[:, lo + d : hi + d]
    del sq
    with np.errstate(all="ignore"):
        win *= alpha / size
        win += bias
        win **= beta
        np.divide(w, win, out=win)
    np.copyto(out, win, casting="unsafe")


@nb.njit(parallel=True, nogil=True, cache=True)
def _scale_rows(w, factor, out):
    for o in nb.prange(w.shape[0]):
        f = factor[o]
        wo, oo = w[o], out[o]
        for j in range(wo.shape[0]):
            oo[j] = np.float64(wo[j]) * f


def scale_rows(w: np.ndarray, factor: np.ndarray) -> np.ndarray:
    """``w * factor`` per output channel (axis 0), each product in float64 and rounded once to
    ``w``'s dtype: the weight of a BatchNorm folded into its Conv. One pass, no float64 copy of
    the weight (numpy's ``(w.astype(float64) * f).astype(w.dtype)`` allocates three arrays per
    weight and is much slower on ResNet-50's folding; the same bits)."""
    factor = np.ascontiguousarray(factor, np.float64).reshape(-1)
    if w.dtype not in (np.float32, np.float64) or w.ndim == 0 or w.shape[0] != factor.size:
        return (w.astype(np.float64) * factor.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
    w2 = np.ascontiguousarray(w).reshape(w.shape[0], -1)
    out = np.empty(w2.shape, w.dtype)
    if kernel_cache.cold(_scale_rows, (w2, factor, out)):  # compiling in the background: numpy, the same bits
        np.multiply(w2, factor[:, None], out=out, dtype=np.float64, casting="unsafe")  # buffered: no float64 copy
    else:
        _scale_rows(w2, factor, out)
    return out.reshape(w.shape)
