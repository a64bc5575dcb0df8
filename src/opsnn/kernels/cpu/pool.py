"""CPU pooling kernels: numba over (N*C) planes for max/average pooling, plus numpy kernels
for the rarely-hot ONNX pools (Lp, unpool, RoI max pool).

A :class:`PoolPlan` (computed at prepare time) carries, per spatial dim, every output
position's window start and the range of kernel taps that fall inside the input, so the
inner loops never test bounds per element. 2-D max (without indices) and average pooling
are separable — kh + kw steps per output instead of kh * kw, with branch-free inner loops:
average pooling reduces each input row over the window's width, then those rows over its
height; max pooling reduces columns first, in long streams (see ``_max2d_block``). Work
items are (plane, block of output rows). 1-D pooling runs the 2-D kernels with H = 1.
"""

from __future__ import annotations

from typing import NamedTuple

import numba as nb
import numpy as np

from ...errors import ParamInvalidError

#: below this many output elements the serial variant runs (thread fan-out costs more than the work)
PARALLEL_MIN = 1 << 14
#: a work item's scratch (its input rows reduced over the window's width, float64 at most) is
#: kept under this many bytes by capping its output rows: bounded memory on any image size
#: (a 4096x4096 plane pools in blocks of ~30 rows), and the rows stay in L2 between the two
#: passes. Blocks re-reduce the (kernel - stride) input rows they share with the next block.
SCRATCH_BYTES = 1 << 20


class DimPlan(NamedTuple):
    """Per output position along one spatial dim: window start (input coords, may be < 0),
    first and one-past-last kernel tap inside the input, taps inside the padded extent; and
    the range [full_lo, full_hi) of outputs whose whole window lies inside the input."""

    start: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    count_pad: np.ndarray
    kernel: int
    stride: int
    dilation: int
    full_lo: int
    full_hi: int


class PoolPlan(NamedTuple):
    planes: int  # N*C
    in_spatial: tuple  # input spatial dims (1-D is stored as (1, W))
    out_spatial: tuple
    dims: tuple  # DimPlan per spatial dim (same rank as in_spatial)
    parallel: bool
    row_block: int  # output rows per work item (2-D)


def dim_plan(n_in: int, n_out: int, kernel: int, stride: int, dilation: int, pad_begin: int, pad_end: int) -> DimPlan:
    """Tap ranges for one spatial dim (ONNX/torch geometry, ceil-mode windows included)."""
    o = np.arange(n_out, dtype=np.int64)
    start = o * stride - pad_begin
    # taps i in [lo, hi) satisfy 0 <= start + i*d < n_in
    lo = np.where(start >= 0, 0, (-start + dilation - 1) // dilation)
    hi = np.minimum(kernel, np.maximum((n_in - start + dilation - 1) // dilation, 0))
    hi = np.maximum(hi, lo)
    # taps inside the padded extent [-pad_begin, n_in + pad_end): what count_include_pad divides by
    cnt = np.minimum(kernel, np.maximum((n_in + pad_end - start + dilation - 1) // dilation, 0))
    full = np.flatnonzero((lo == 0) & (hi == kernel))  # a contiguous run: windows move monotonically
    f_lo, f_hi = (int(full[0]), int(full[-1]) + 1) if full.size else (0, 0)
    return DimPlan(
        start,
        lo.astype(np.int64),
        hi.astype(np.int64),
        cnt.astype(np.int64),
        int(kernel),
        int(stride),
        int(dilation),
        f_lo,
        f_hi,
    )


def make_plan(x_shape: tuple, out_spatial: tuple, kernel, strides, dilations, pads_begin, pads_end) -> PoolPlan:
    in_sp = tuple(x_shape[2:])
    dims = tuple(
        dim_plan(in_sp[i], out_spatial[i], kernel[i], strides[i], dilations[i], pads_begin[i], pads_end[i])
        for i in range(len(in_sp))
    )
    out_sp = tuple(out_spatial)
    if len(in_sp) == 1:  # 1-D runs the 2-D kernel over a height-1 plane
        dims = (dim_plan(1, 1, 1, 1, 1, 0, 0),) + dims
        in_sp, out_sp = (1,) + in_sp, (1,) + out_sp
    planes = int(x_shape[0]) * int(x_shape[1])
    n_out = planes * int(np.prod(out_sp))
    parallel = n_out >= PARALLEL_MIN
    oh = max(int(out_sp[-2]), 1)
    # whole planes per work item when there are enough of them (no rows computed twice),
    # else blocks of rows so that every thread gets several items
    want_items = 8 * nb.config.NUMBA_NUM_THREADS
    block = oh if not parallel or planes >= want_items else max(1, (planes * oh) // want_items)
    if len(dims) == 2:
        dh = dims[0]
        rows_fit = SCRATCH_BYTES // (8 * max(int(out_sp[-1]), 1))
        block = min(block, max(1, (rows_fit - (dh.kernel - 1) * dh.dilation - 1) // dh.stride + 1))
    return PoolPlan(planes, in_sp, out_sp, dims, parallel, min(block, oh))


# -- separable 2-D max / average pooling -------------------------------------------------------------


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _nanmax(a, b):
    # NaN in either argument propagates. `|`, not `or`: a short-circuit is a branch, and
    # on random data a mispredicted one per element; this is a select (vcmpps + vblendvps)
    return b if (b > a) | (b != b) else a


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _row_reduce(xrow, out, tmp, ws, wlo, whi, dw, sw, f_lo, f_hi, kw, init, is_max):
    """out[ow] = max (or sum) of xrow over the taps of output column ow's window."""
    OW = out.shape[0]
    e0 = f_lo if f_hi > f_lo else OW
    for ow in range(e0):  # edge windows (clipped by the input's borders)
        m = init
        for j in range(wlo[ow], whi[ow]):
            v = xrow[ws[ow] + j * dw]
            m = _nanmax(m, v) if is_max else m + v
        out[ow] = m
    for ow in range(max(f_hi, e0), OW):
        m = init
        for j in range(wlo[ow], whi[ow]):
            v = xrow[ws[ow] + j * dw]
            m = _nanmax(m, v) if is_max else m + v
        out[ow] = m
    if f_hi > f_lo:
        # interior: reduce at every input column (contiguous, 0-based loops over slices, so
        # numba drops negative-index wraparound and vectorizes), then keep every sw-th
        m = f_hi - f_lo
        first = ws[f_lo]
        n = (m - 1) * sw + 1
        acc = out[f_lo:f_hi] if sw == 1 else tmp[:n]
        src = xrow[first : first + n]
        for t in range(n):
            acc[t] = src[t]
        for j in range(1, kw):
            a = first + j * dw
            src = xrow[a : a + n]
            if is_max:
                for t in range(n):
                    acc[t] = _nanmax(acc[t], src[t])
            else:
                for t in range(n):
                    acc[t] += src[t]
        if sw != 1:
            o = out[f_lo:f_hi]
            kept = acc[::sw]
            for t in range(m):
                o[t] = kept[t]


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _pool2d_block(
    x, y, t, nblk, rb, hs, hlo, hhi, kh, dh, ws, wlo, whi, dw, sw, f_lo, f_hi, kw, hdiv, wdiv, init, is_max, acc_t
):
    P, OH, OW = y.shape
    H = x.shape[1]
    p = t // nblk
    oh0 = (t - p * nblk) * rb
    oh1 = min(OH, oh0 + rb)
    # input rows any window of the block touches (starts grow with oh; with dilation a later
    # window may still reach a lower row than an earlier one's first valid tap)
    r0 = max(hs[oh0], 0)
    r1 = min(hs[oh1 - 1] + (kh - 1) * dh + 1, H)
    n = max(r1 - r0, 0)
    rows = np.empty((n, OW), acc_t)
    tmp = np.empty(x.shape[2], acc_t)
    for r in range(n):
        _row_reduce(x[p, r0 + r], rows[r], tmp, ws, wlo, whi, dw, sw, f_lo, f_hi, kw, acc_t(init), is_max)
    acc = np.empty(OW, acc_t)
    for oh in range(oh0, oh1):
        for ow in range(OW):
            acc[ow] = init
        for i in range(hlo[oh], hhi[oh]):
            src = rows[hs[oh] + i * dh - r0]
            if is_max:
                for ow in range(OW):
                    acc[ow] = _nanmax(acc[ow], src[ow])
            else:
                for ow in range(OW):
                    acc[ow] += src[ow]
        yrow = y[p, oh]
        if is_max:
            for ow in range(OW):
                yrow[ow] = acc[ow]
        else:
            hd = hdiv[oh]
            for ow in range(OW):
                yrow[ow] = acc[ow] / (hd * wdiv[ow])


@nb.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def pool2d_parallel(
    x, y, rb, hs, hlo, hhi, kh, dh, ws, wlo, whi, dw, sw, f_lo, f_hi, kw, hdiv, wdiv, init, is_max, acc_t
):
    nblk = (y.shape[1] + rb - 1) // rb
    for t in nb.prange(y.shape[0] * nblk):
        _pool2d_block(
            x,
            y,
            t,
            nblk,
            rb,
            hs,
            hlo,
            hhi,
            kh,
            dh,
            ws,
            wlo,
            whi,
            dw,
            sw,
            f_lo,
            f_hi,
            kw,
            hdiv,
            wdiv,
            init,
            is_max,
            acc_t,
        )


@nb.njit(nogil=True, cache=True, error_model="numpy")
def pool2d_serial(
    x, y, rb, hs, hlo, hhi, kh, dh, ws, wlo, whi, dw, sw, f_lo, f_hi, kw, hdiv, wdiv, init, is_max, acc_t
):
    nblk = (y.shape[1] + rb - 1) // rb
    for t in range(y.shape[0] * nblk):
        _pool2d_block(
            x,
            y,
            t,
            nblk,
            rb,
            hs,
            hlo,
            hhi,
            kh,
            dh,
            ws,
            wlo,
            whi,
            dw,
            sw,
            f_lo,
            f_hi,
            kw,
            hdiv,
            wdiv,
            init,
            is_max,
            acc_t,
        )


def _pool2d(x3, y3, plan: PoolPlan, hdiv, wdiv, init, is_max: bool, acc_t) -> None:
    dh, dw = plan.dims
    fn = pool2d_parallel if plan.parallel else pool2d_serial
    fn(
        x3,
        y3,
        plan.row_block,
        dh.start,
        dh.lo,
        dh.hi,
        dh.kernel,
        dh.dilation,
        dw.start,
        dw.lo,
        dw.hi,
        dw.dilation,
        dw.stride,
        dw.full_lo,
        dw.full_hi,
        dw.kernel,
        hdiv,
        wdiv,
        init,
        is_max,
        acc_t,
    )


# -- 2-D max pooling (no indices): columns first, in long branch-free streams --------------------
# A running ``acc[t] = max(acc[t], v[t])`` is a store of v only where v wins, which LLVM
# vectorizes as a masked store (vmaskmovps): microcoded on AMD Zen, far slower than a plain
# loop (figures: docs/performance.md, "Max pooling"). So every pass here writes a buffer it does not read, up to three taps per
# pass, and indexes flat arrays with unsigned offsets (no per-row slices, whose reference
# counting costs more than a 100-element row). Per work item (plane, block of output rows):
#   1. V[r, w]  = max over the window's valid rows of x[.., w]       (a W-long stream per row)
#   2. Hm[t]    = max over the window's columns of V, at every column (one stream for the block)
#   3. y[r, ow] = Hm[r*W + ws[ow]] for the interior columns (every sw-th), scalar edge windows
# Ties between -0.0 and +0.0 may resolve to the other zero than the reference's first in raster
# order (columns are reduced before rows); values and NaN propagation are the same.

_U = np.uint64


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _max3(src, b0, b1, b2, n, dst, d):
    """dst[d + t] = max(src[b0 + t], src[b1 + t], src[b2 + t]) (unsigned offsets: no wraparound)."""
    for t in range(n):
        dst[d + t] = _nanmax(_nanmax(src[b0 + t], src[b1 + t]), src[b2 + t])


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _max2(src, b0, b1, n, dst, d):
    for t in range(n):
        dst[d + t] = _nanmax(src[b0 + t], src[b1 + t])


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _max3b(acc, src, b1, b2, n, dst, d):
    """dst[d + t] = max(acc[t], src[b1 + t], src[b2 + t])."""
    for t in range(n):
        dst[d + t] = _nanmax(_nanmax(acc[t], src[b1 + t]), src[b2 + t])


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _max2b(acc, src, b1, n, dst, d):
    for t in range(n):
        dst[d + t] = _nanmax(acc[t], src[b1 + t])


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _taps_max_many(src, b0, st, k, n, dst, d, ta, tb):
    """_taps_max for k > 3 (its own function: the alternating buffer variables bring
    reference counting that would otherwise run on every call of the common k <= 3)."""
    _max3(src, b0, b0 + st, b0 + _U(2) * st, n, ta, _U(0))
    j = 3
    in_a = True
    while k - j > 2:
        bu = b0 + _U(j) * st
        if in_a:
            _max3b(ta, src, bu, bu + st, n, tb, _U(0))
        else:
            _max3b(tb, src, bu, bu + st, n, ta, _U(0))
        j += 2
        in_a = not in_a
    cur = ta if in_a else tb
    bu = b0 + _U(j) * st
    if k - j == 2:
        _max3b(cur, src, bu, bu + st, n, dst, d)
    else:
        _max2b(cur, src, bu, n, dst, d)


@nb.njit(nogil=True, cache=True, error_model="numpy", inline="always")
def _taps_max(src, base, step, k, n, dst, dbase, ta, tb, init):
    """dst[dbase + t] = max over j < k of src[base + j*step + t], for t < n (NaN propagates;
    all offsets >= 0). More than three taps alternate between the scratch buffers ta, tb."""
    n_ = _U(n)
    d = _U(dbase)
    b0 = _U(base)
    st = _U(step)
    if k <= 0:
        for t in range(n_):
            dst[d + t] = init
    elif k == 1:
        for t in range(n_):
            dst[d + t] = src[b0 + t]
    elif k == 2:
        _max2(src, b0, b0 + st, n_, dst, d)
    elif k == 3:
        _max3(src, b0, b0 + st, b0 + _U(2) * st, n_, dst, d)
    else:
        _taps_max_many(src, b0, st, k, n_, dst, d, ta, tb)


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _max2d_block(
    xf, yf, p, oh0, oh1, H, W, OH, OW, hs, hlo, hhi, dh, ws, wlo, whi, dw, sw, f_lo, f_hi, kw, init, V, Hm, ta, tb
):
    nr = oh1 - oh0
    xb = p * H * W
    yb = p * OH * OW
    for oh in range(oh0, oh1):  # 1. rows of each window (hs + i*dh >= 0 for valid taps i)
        i0 = hlo[oh]
        _taps_max(xf, xb + (hs[oh] + i0 * dh) * W, dh * W, hhi[oh] - i0, W, V, (oh - oh0) * W, ta, tb, init)
    m = f_hi - f_lo
    if m > 0:
        first = ws[f_lo]
        # 2. one stream over the whole block: positions past a row's end mix two rows, but
        # only the interior columns' starts are read back, and their windows stay in the row
        L = (nr - 1) * W + (m - 1) * sw + 1
        _taps_max(V, first, dw, kw, L, Hm, 0, ta, tb, init)
        for r in range(nr):  # 3. every sw-th (a literal stride 2 lets LLVM shuffle, not gather)
            hb = _U(r * W)
            ob = _U(yb + (oh0 + r) * OW + f_lo)
            if sw == 2:
                for q in range(_U(m)):
                    yf[ob + q] = Hm[hb + _U(2) * q]
            else:
                s_ = _U(sw)
                for q in range(_U(m)):
                    yf[ob + q] = Hm[hb + s_ * q]
    e0 = f_lo if m > 0 else OW
    e1 = max(f_hi, e0)
    for r in range(nr):  # edge windows, clipped by the input's left / right border
        vb = r * W
        ob = yb + (oh0 + r) * OW
        for ow in range(e0):
            acc = init
            for j in range(wlo[ow], whi[ow]):
                acc = _nanmax(acc, V[vb + ws[ow] + j * dw])
            yf[ob + ow] = acc
        for ow in range(e1, OW):
            acc = init
            for j in range(wlo[ow], whi[ow]):
                acc = _nanmax(acc, V[vb + ws[ow] + j * dw])
            yf[ob + ow] = acc


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _max2d_scratch(rb, W, kh, kw, dtype):
    big = max(kh, kw) > 3
    V = np.empty(rb * W, dtype)
    Hm = np.empty(rb * W, dtype)
    ta = np.empty(rb * W if big else 0, dtype)
    tb = np.empty(rb * W if big else 0, dtype)
    return V, Hm, ta, tb


@nb.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def max_pool2d_parallel(x, y, rb, hs, hlo, hhi, kh, dh, ws, wlo, whi, dw, sw, f_lo, f_hi, kw, init):
    P, OH, OW = y.shape
    H, W = x.shape[1], x.shape[2]
    xf = x.reshape(-1)
    yf = y.reshape(-1)
    nblk = (OH + rb - 1) // rb
    for t in nb.prange(P * nblk):
        p = t // nblk
        oh0 = (t - p * nblk) * rb
        V, Hm, ta, tb = _max2d_scratch(rb, W, kh, kw, x.dtype)
        _max2d_block(
            xf,
            yf,
            p,
            oh0,
            min(OH, oh0 + rb),
            H,
            W,
            OH,
            OW,
            hs,
            hlo,
            hhi,
            dh,
            ws,
            wlo,
            whi,
            dw,
            sw,
            f_lo,
            f_hi,
            kw,
            init,
            V,
            Hm,
            ta,
            tb,
        )


@nb.njit(nogil=True, cache=True, error_model="numpy")
def max_pool2d_serial(x, y, rb, hs, hlo, hhi, kh, dh, ws, wlo, whi, dw, sw, f_lo, f_hi, kw, init):
    P, OH, OW = y.shape
    H, W = x.shape[1], x.shape[2]
    xf = x.reshape(-1)
    yf = y.reshape(-1)
    nblk = (OH + rb - 1) // rb
    V, Hm, ta, tb = _max2d_scratch(rb, W, kh, kw, x.dtype)
    for t in range(P * nblk):
        p = t // nblk
        oh0 = (t - p * nblk) * rb
        _max2d_block(
            xf,
            yf,
            p,
            oh0,
            min(OH, oh0 + rb),
            H,
            W,
            OH,
            OW,
            hs,
            hlo,
            hhi,
            dh,
            ws,
            wlo,
            whi,
            dw,
            sw,
            f_lo,
            f_hi,
            kw,
            init,
            V,
            Hm,
            ta,
            tb,
        )


def _max_pool2d(x3, y3, plan: PoolPlan, init) -> None:
    dh, dw = plan.dims
    # output rows per work item: the plan's, capped so that the item's scratch (V and Hm, plus
    # two more for windows over 3 taps) stays within SCRATCH_BYTES
    W = int(plan.in_spatial[-1])
    per_row = (4 if max(dh.kernel, dw.kernel) > 3 else 2) * max(W, 1) * x3.dtype.itemsize
    rb = max(1, min(plan.row_block, SCRATCH_BYTES // per_row))
    fn = max_pool2d_parallel if plan.parallel else max_pool2d_serial
    fn(
        x3,
        y3,
        rb,
        dh.start,
        dh.lo,
        dh.hi,
        dh.kernel,
        dh.dilation,
        dw.start,
        dw.lo,
        dw.hi,
        dw.dilation,
        dw.stride,
        dw.full_lo,
        dw.full_hi,
        dw.kernel,
        init,
    )


# -- max pooling with indices, and 3-D ------------------------------------------------------------------
# NaN propagates (as in torch): a window holding a NaN gives that NaN, and the index of its
# first NaN. The running max uses selects: data-dependent branches cost more than the
# compares on random data.


@nb.njit(nogil=True, cache=True, error_model="numpy", inline="always")
def window_max(xp, h0, i0, i1, dh, w0, j0, j1, dw, W, init):
    """Max of one 2-D window of the flat plane ``xp`` and its flat index: the window's first NaN
    where it holds one, its first tap where every tap is -inf, index -1 for an empty window."""
    best = init
    nan_k = -1
    best_k = -1
    if i1 > i0 and j1 > j0:
        best_k = (h0 + i0 * dh) * W + w0 + j0 * dw
    for i in range(i0, i1):
        h = h0 + i * dh
        for j in range(j0, j1):
            k = h * W + w0 + j * dw
            v = xp[np.uint64(k)]  # taps are inside the plane: unsigned skips wraparound
            take = v > best
            best = v if take else best
            best_k = k if take else best_k
            if v != v and nan_k < 0:
                nan_k = k
    if nan_k >= 0:
        best_k = nan_k
        best = xp[nan_k]
    return best, best_k


@nb.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def max_pool2d_indices(x, y, idx, col_major, hs, hlo, hhi, dh, ws, wlo, whi, dw, init):
    P, OH, OW = y.shape
    H = x.shape[1]
    W = x.shape[2]
    for t in nb.prange(P * OH):
        p = t // OH
        oh = t - p * OH
        base = p * H * W
        xp = x[p].reshape(H * W)
        h0 = hs[oh]
        i0 = hlo[oh]
        i1 = hhi[oh]
        for ow in range(OW):
            w0 = ws[ow]
            j0 = wlo[ow]
            j1 = whi[ow]
            best, best_k = window_max(xp, h0, i0, i1, dh, w0, j0, j1, dw, W, init)
            y[p, oh, ow] = best
            if best_k < 0:
                idx[p, oh, ow] = -1
            elif col_major:
                idx[p, oh, ow] = base + best_k // W + (best_k % W) * H
            else:
                idx[p, oh, ow] = base + best_k


@nb.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def max_pool3d(x, y, idx, want_idx, col_major, ds, dlo, dhi, dd, hs, hlo, hhi, dh, ws, wlo, whi, dw, init):
    P, OD, OH, OW = y.shape
    D, H, W = x.shape[1], x.shape[2], x.shape[3]
    HW = H * W
    for t in nb.prange(P * OD * OH):
        p = t // (OD * OH)
        r = t - p * (OD * OH)
        od = r // OH
        oh = r - od * OH
        for ow in range(OW):
            best = init
            nan_k = -1
            best_k = -1
            if dhi[od] > dlo[od] and hhi[oh] > hlo[oh] and whi[ow] > wlo[ow]:
                best_k = ((ds[od] + dlo[od] * dd) * H + hs[oh] + hlo[oh] * dh) * W + ws[ow] + wlo[ow] * dw
            for a in range(dlo[od], dhi[od]):
                d = ds[od] + a * dd
                for i in range(hlo[oh], hhi[oh]):
                    h = hs[oh] + i * dh
                    for j in range(wlo[ow], whi[ow]):
                        w = ws[ow] + j * dw
                        v = x[p, d, h, w]
                        k = (d * H + h) * W + w
                        take = v > best
                        best = v if take else best
                        best_k = k if take else best_k
                        if v != v and nan_k < 0:
                            nan_k = k
            if nan_k >= 0:
                best_k = nan_k
                best = x[p, nan_k // HW, (nan_k % HW) // W, nan_k % W]
            y[p, od, oh, ow] = best
            if want_idx:
                if best_k < 0:
                    idx[p, od, oh, ow] = -1
                elif col_major:
                    d = best_k // HW
                    h = (best_k % HW) // W
                    w = best_k % W
                    idx[p, od, oh, ow] = p * D * HW + d + h * D + w * D * H
                else:
                    idx[p, od, oh, ow] = p * D * HW + best_k


def _lowest(dtype: np.dtype):
    return dtype.type(-np.inf) if dtype.kind == "f" else np.iinfo(dtype).min


def max_pool(x: np.ndarray, y: np.ndarray, idx: np.ndarray | None, plan: PoolPlan, col_major: bool) -> None:
    """Max pooling over contiguous NC... arrays; ``idx`` (int64, ONNX flattened indices) or None."""
    if plan.planes == 0 or y.size == 0:
        return
    xs = x.reshape((plan.planes,) + plan.in_spatial)
    ys = y.reshape((plan.planes,) + plan.out_spatial)
    init = _lowest(x.dtype)
    if len(plan.dims) == 2:
        if idx is None:
            _max_pool2d(xs, ys, plan, init)
        else:
            dh, dw = plan.dims
            max_pool2d_indices(
                xs,
                ys,
                idx.reshape(ys.shape),
                col_major,
                dh.start,
                dh.lo,
                dh.hi,
                dh.dilation,
                dw.start,
                dw.lo,
                dw.hi,
                dw.dilation,
                init,
            )
    else:
        dd, dh, dw = plan.dims
        ids = idx.reshape(ys.shape) if idx is not None else np.empty((1,) * ys.ndim, np.int64)
        max_pool3d(
            xs,
            ys,
            ids,
            idx is not None,
            col_major,
            dd.start,
            dd.lo,
            dd.hi,
            dd.dilation,
            dh.start,
            dh.lo,
            dh.hi,
            dh.dilation,
            dw.start,
            dw.lo,
            dw.hi,
            dw.dilation,
            init,
        )


_NO_DIV = np.ones(1, np.float64)


# -- average pooling --------------------------------------------------------------------------------


@nb.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def avg_pool3d(x, y, ds, dlo, dhi, ddiv, dd, hs, hlo, hhi, hdiv, dh, ws, wlo, whi, wdiv, dw):
    P, OD, OH, OW = y.shape
    for t in nb.prange(P * OD * OH):
        p = t // (OD * OH)
        r = t - p * (OD * OH)
        od = r // OH
        oh = r - od * OH
        for ow in range(OW):
            acc = 0.0
            for a in range(dlo[od], dhi[od]):
                d = ds[od] + a * dd
                for i in range(hlo[oh], hhi[oh]):
                    h = hs[oh] + i * dh
                    for j in range(wlo[ow], whi[ow]):
                        acc += x[p, d, h, ws[ow] + j * dw]
            y[p, od, oh, ow] = acc / (ddiv[od] * hdiv[oh] * wdiv[ow])


def avg_pool(x: np.ndarray, y: np.ndarray, plan: PoolPlan, count_include_pad: bool) -> None:
    """Average pooling (sums in float64); the divisor counts taps inside the input (or inside
    the padded extent with ``count_include_pad``). A window with nothing to count gives NaN."""
    if plan.planes == 0 or y.size == 0:
        return
    xs = x.reshape((plan.planes,) + plan.in_spatial)
    ys = y.reshape((plan.planes,) + plan.out_spatial)
    divs = [(d.count_pad if count_include_pad else d.hi - d.lo).astype(np.float64) for d in plan.dims]
    if len(plan.dims) == 2:
        _pool2d(xs, ys, plan, divs[0], divs[1], 0.0, False, np.float64)
    else:
        (dd, dh, dw), (vd, vh, vw) = plan.dims, divs
        avg_pool3d(
            xs,
            ys,
            dd.start,
            dd.lo,
            dd.hi,
            vd,
            dd.dilation,
            dh.start,
            dh.lo,
            dh.hi,
            vh,
            dh.dilation,
            dw.start,
            dw.lo,
            dw.hi,
            vw,
            dw.dilation,
        )


# -- global and adaptive pooling -------------------------------------------------------------------


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _plane_sum(row):
    # four float64 partial sums: breaks the add latency chain without reassociating freely
    n = row.shape[0]
    a0 = 0.0
    a1 = 0.0
    a2 = 0.0
    a3 = 0.0
    n4 = n - n % 4
    for i in range(0, n4, 4):
        a0 += row[i]
        a1 += row[i + 1]
        a2 += row[i + 2]
        a3 += row[i + 3]
    for i in range(n4, n):
        a0 += row[i]
    return (a0 + a1) + (a2 + a3)


@nb.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def global_avg_parallel(x, y):
    for p in nb.prange(x.shape[0]):
        y[p] = _plane_sum(x[p]) / x.shape[1]


@nb.njit(nogil=True, cache=True, error_model="numpy")
def global_avg_serial(x, y):
    for p in range(x.shape[0]):
        y[p] = _plane_sum(x[p]) / x.shape[1]


@nb.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def global_max(x, y):
    for p in nb.prange(x.shape[0]):
        row = x[p]
        best = row[0]
        for i in range(row.shape[0]):
            best = _nanmax(best, row[i])
        if best != best:  # report the plane's first NaN itself
            for i in range(row.shape[0]):
                if row[i] != row[i]:
                    best = row[i]
                    break
        y[p] = best


def global_pool(x: np.ndarray, y: np.ndarray, mode: str, parallel: bool) -> None:
    """Mean or max over all spatial positions of each (n, c) plane (NaN propagates)."""
    planes = y.size
    if planes == 0:
        return
    x2 = x.reshape(planes, -1)
    y1 = y.reshape(planes)
    if mode == "max":
        global_max(x2, y1)
    else:
        (global_avg_parallel if parallel else global_avg_serial)(x2, y1)


@nb.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def adaptive_avg2d(x, y, h0, h1, w0, w1):
    P, OH, OW = y.shape
    for t in nb.prange(P * OH):
        p = t // OH
        oh = t - p * OH
        for ow in range(OW):
            acc = 0.0
            for h in range(h0[oh], h1[oh]):
                for w in range(w0[ow], w1[ow]):
                    acc += x[p, h, w]
            y[p, oh, ow] = acc / ((h1[oh] - h0[oh]) * (w1[ow] - w0[ow]))


def adaptive_bounds(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """torch's adaptive windows: [floor(i*In/Out), ceil((i+1)*In/Out))."""
    i = np.arange(n_out, dtype=np.int64)
    return (i * n_in) // n_out, ((i + 1) * n_in + n_out - 1) // n_out


def adaptive_avg_pool(x: np.ndarray, y: np.ndarray, bounds: tuple) -> None:
    """``bounds`` = ((h0, h1), (w0, w1)) for the last two dims."""
    if y.size == 0:
        return
    (h0, h1), (w0, w1) = bounds
    xs = x.reshape((-1,) + x.shape[-2:])
    ys = y.reshape((-1,) + y.shape[-2:])
    adaptive_avg2d(xs, ys, h0, h1, w0, w1)


# -- numpy kernels for the rarely-hot ONNX pools -------------------------------------------------


def lp_pool(x: np.ndarray, y: np.ndarray, geom, p: float) -> None:
    """Lp pooling by shifted strided slices: one vectorized accumulate per kernel tap
    (zero padding contributes nothing to sum |x|^p)."""
    kernel, strides, dilations, pb, out = geom.kernel, geom.strides, geom.dilations, geom.pads_begin, geom.out
    a = np.abs(x.astype(np.float64) if x.dtype != np.float64 else x)
    a = a**p if p != 1 else a
    pad = [(0, 0), (0, 0)]
    for i, n in enumerate(x.shape[2:]):
        need = (out[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1
        pad.append((pb[i], max(need - pb[i] - n, 0)))
    a = np.pad(a, pad)
    acc = np.zeros(y.shape, np.float64)
    for taps in np.ndindex(*kernel):
        sl = tuple(slice(t * d, t * d + (o - 1) * s + 1, s) for t, d, o, s in zip(taps, dilations, out, strides))
        acc += a[(slice(None), slice(None)) + sl]
    np.copyto(y, acc ** (1.0 / p), casting="unsafe")


def max_unpool(x: np.ndarray, indices: np.ndarray, y: np.ndarray) -> None:
    """Scatter ``x`` to the flat positions ``indices`` of a zeroed ``y`` (later writes win)."""
    flat = indices.reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= y.size):
        bad = flat[(flat < 0) | (flat >= y.size)][0]
        raise ParamInvalidError(
            f"MaxUnpool: index {int(bad)} is outside the output of {y.size} elements {y.shape}", op="MaxUnpool"
        )
    y.fill(0)
    y.reshape(-1)[flat] = x.reshape(-1)


def _c_round(v: np.ndarray) -> np.ndarray:
    """C's round(): halves away from zero (Caffe's RoI pooling rounds box corners this way)."""
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def max_roi_pool_windows(x_shape: tuple, rois: np.ndarray, PH: int, PW: int, spatial_scale: float):
    """Yield (roi, batch index, ph, pw, h0, h1, w0, w1) of every bin of Fast R-CNN RoI max pooling (box
    corners C-rounded, bins floor/ceil-split, clipped to the map); checks each roi's batch index."""
    N, C, H, W = x_shape
    for r in range(rois.shape[0]):
        if not np.isfinite(rois[r, :5]).all():  # int() of NaN or Inf: an untyped ValueError / OverflowError
            raise ParamInvalidError(
                f"MaxRoiPool: roi {r} is {rois[r, :5].tolist()}, expected finite (batch index, x1, y1, x2, y2)",
                op="MaxRoiPool",
            )
        b = int(rois[r, 0])
        if not 0 <= b < N:
            raise ParamInvalidError(f"MaxRoiPool: roi {r} has batch index {b}, expected 0..{N - 1}", op="MaxRoiPool")
        x1, y1, x2, y2 = (int(v) for v in _c_round(rois[r, 1:5].astype(np.float64) * spatial_scale))
        rh = max(y2 - y1 + 1, 1)
        rw = max(x2 - x1 + 1, 1)
        bh, bw = rh / PH, rw / PW
        for ph in range(PH):
            hs = min(max(int(np.floor(ph * bh)) + y1, 0), H)
            he = min(max(int(np.ceil((ph + 1) * bh)) + y1, 0), H)
            for pw in range(PW):
                ws = min(max(int(np.floor(pw * bw)) + x1, 0), W)
                we = min(max(int(np.ceil((pw + 1) * bw)) + x1, 0), W)
                yield r, b, ph, pw, hs, he, ws, we


def max_roi_pool(x: np.ndarray, rois: np.ndarray, y: np.ndarray, spatial_scale: float) -> None:
    """Fast R-CNN RoI max pooling, vectorized over channels; an empty bin gives 0."""
    for r, b, ph, pw, hs, he, ws, we in max_roi_pool_windows(x.shape, rois, y.shape[2], y.shape[3], spatial_scale):
        if he <= hs or we <= ws:
            y[r, :, ph, pw] = 0
        else:
            y[r, :, ph, pw] = x[b, :, hs:he, ws:we].max(axis=(1, 2))


def max_roi_pool_backward(dy: np.ndarray, x: np.ndarray, rois: np.ndarray, dx: np.ndarray, spatial_scale: float):
    """dX of MaxRoiPool: each bin's gradient added at its maximum (the first one on ties, a NaN if any),
    per channel; empty bins send nothing. Bins run in order, so overlapping rois add deterministically."""
    C = x.shape[1]
    dx[...] = 0
    chans = np.arange(C)
    for r, b, ph, pw, hs, he, ws, we in max_roi_pool_windows(x.shape, rois, dy.shape[2], dy.shape[3], spatial_scale):
        if he <= hs or we <= ws:
            continue
        win = x[b, :, hs:he, ws:we].reshape(C, -1)
        k = np.argmax(win, axis=1)  # a NaN wins, as in the forward's max
        dx[b, chans, hs + k // (we - ws), ws + k % (we - ws)] += dy[r, :, ph, pw]


# -- RoiAlign ------------------------------------------------------------------------------------


@nb.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def roi_align_taps(H, W, PH, PW, start_h, start_w, bin_h, bin_w, grid_h, grid_w, offs, pos, wts):
    """The bilinear taps (flat pixel, weight) of every sample point, shared by all channels of a roi."""
    R = start_h.shape[0]
    for r in nb.prange(R):
        gh = grid_h[r]
        gw = grid_w[r]
        k = offs[r]
        for ph in range(PH):
            for pw in range(PW):
                for iy in range(gh):
                    yy = start_h[r] + ph * bin_h[r] + (iy + 0.5) * bin_h[r] / gh
                    for ix in range(gw):
                        xx = start_w[r] + pw * bin_w[r] + (ix + 0.5) * bin_w[r] / gw
                        if yy < -1.0 or yy > H or xx < -1.0 or xx > W:
                            for q in range(4):
                                pos[k, q] = 0
                                wts[k, q] = 0.0
                            k += 1
                            continue
                        yv = max(yy, 0.0)
                        xv = max(xx, 0.0)
                        y0 = int(yv)
                        x0 = int(xv)
                        if y0 >= H - 1:
                            y0 = H - 1
                            y1 = H - 1
                            yv = float(y0)
                        else:
                            y1 = y0 + 1
                        if x0 >= W - 1:
                            x0 = W - 1
                            x1 = W - 1
                            xv = float(x0)
                        else:
                            x1 = x0 + 1
                        ly = yv - y0
                        lx = xv - x0
                        hy = 1.0 - ly
                        hx = 1.0 - lx
                        pos[k, 0] = y0 * W + x0
                        pos[k, 1] = y0 * W + x1
                        pos[k, 2] = y1 * W + x0
                        pos[k, 3] = y1 * W + x1
                        wts[k, 0] = hy * hx
                        wts[k, 1] = hy * lx
                        wts[k, 2] = ly * hx
                        wts[k, 3] = ly * lx
                        k += 1


@nb.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def _roi_align(x, y, bidx, grid_h, grid_w, offs, is_max, pos, wts):
    R, C, PH, PW = y.shape
    # interpolate every (roi, channel) plane from the taps
    for t in nb.prange(R * C):
        r = t // C
        c = t - r * C
        row = bidx[r] * C + c
        n = grid_h[r] * grid_w[r]
        k = offs[r]
        for ph in range(PH):
            for pw in range(PW):
                acc = 0.0
                for s in range(n):
                    v0 = wts[k, 0] * x[row, pos[k, 0]]
                    v1 = wts[k, 1] * x[row, pos[k, 1]]
                    v2 = wts[k, 2] * x[row, pos[k, 2]]
                    v3 = wts[k, 3] * x[row, pos[k, 3]]
                    if is_max:
                        m = max(max(v0, v1), max(v2, v3))
                        acc = m if s == 0 else max(acc, m)
                    else:
                        acc += v0 + v1 + v2 + v3
                    k += 1
                if not is_max:
                    acc /= max(n, 1)
                y[r, c, ph, pw] = acc


def roi_align(
    x: np.ndarray,
    rois: np.ndarray,
    batch_indices: np.ndarray,
    y: np.ndarray,
    spatial_scale: float,
    sampling_ratio: int,
    half_pixel: bool,
    is_max: bool,
) -> None:
    """RoiAlign (ONNX semantics, incl. its ``max`` mode: max over samples of the largest
    weighted corner). Roi geometry is computed in the input's float type, as ONNX does."""
    R, C, PH, PW = y.shape
    if R == 0:
        return
    b, gh, gw, offs, pos, wts = roi_align_geometry(
        x, rois, batch_indices, PH, PW, spatial_scale, sampling_ratio, half_pixel
    )
    _roi_align(x.reshape(x.shape[0] * C, -1), y, b, gh, gw, offs, is_max, pos, wts)


def roi_align_geometry(x, rois, batch_indices, PH, PW, spatial_scale, sampling_ratio, half_pixel) -> tuple:
    """(batch indices, samples per bin in y and x, first sample of each roi, taps' flat pixels and
    weights) of RoiAlign over ``x``; checks the batch indices."""
    R, N = rois.shape[0], x.shape[0]
    b = batch_indices.reshape(-1).astype(np.int64)
    if b.min() < 0 or b.max() >= N:
        bad = b[(b < 0) | (b >= N)][0]
        raise ParamInvalidError(f"RoiAlign: batch index {int(bad)} outside 0..{N - 1}", op="RoiAlign")
    ft = x.dtype.type
    off = ft(0.5) if half_pixel else ft(0.0)
    r = rois.astype(x.dtype, copy=False)
    sw = r[:, 0] * ft(spatial_scale) - off
    sh = r[:, 1] * ft(spatial_scale) - off
    ew = r[:, 2] * ft(spatial_scale) - off
    eh = r[:, 3] * ft(spatial_scale) - off
    rw, rh = ew - sw, eh - sh
    if not half_pixel:
        rw, rh = np.maximum(rw, ft(1.0)), np.maximum(rh, ft(1.0))
    bh, bw = rh / ft(PH), rw / ft(PW)
    if sampling_ratio > 0:
        gh = np.full(R, sampling_ratio, np.int64)
        gw = gh
    else:
        gh = np.maximum(np.ceil(rh / ft(PH)), 0).astype(np.int64)
        gw = np.maximum(np.ceil(rw / ft(PW)), 0).astype(np.int64)
    counts = gh * gw * PH * PW
    offs = np.zeros(R, np.int64)
    np.cumsum(counts[:-1], out=offs[1:])
    total = int(counts.sum())
    pos = np.empty((max(total, 1), 4), np.int64)
    wts = np.empty((max(total, 1), 4), x.dtype)
    roi_align_taps(x.shape[2], x.shape[3], PH, PW, sh, sw, bh, bw, gh, gw, offs, pos, wts)
    return b, gh, gw, offs, pos, wts
