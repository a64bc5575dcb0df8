"""CPU kernels of the vision family: GridSample and DeformConv sampling (numba), the
NonMaxSuppression greedy loop (numba), and numpy kernels for the rarely-hot tensor ops
(CumProd, TensorScatter).

GridSample runs every input rank through one 3-D kernel: a 1-D or 2-D input is viewed with
leading unit spatial dims, whose single tap (index 0, weight 1) is exact for every mode.
Each output point computes its taps (index, weight) once and reuses them for all channels.
DeformConv gathers bilinear samples into a column buffer (numba, one row per input channel
and kernel tap) and multiplies it with the weights per group through BLAS (numpy matmul).
Their backward kernels (GridSampleGrad, DeformConvGrad) split the work so that each parallel
item writes only memory it owns: the input's gradient per (image, channel) plane, the grid's,
offsets' and mask's per point or tap.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba as nb
import numpy as np

from ...errors import ParamInvalidError
from .conv import ALIGN, workspace_view
from .mkl import matmul as _blas_matmul

#: below this many output elements the serial variants run (thread fan-out costs more than the work)
PARALLEL_MIN = 1 << 14
#: output points per GridSample work item
GS_BLOCK = 256

# GridSample modes and padding modes (plan-time codes)
NEAREST, LINEAR, CUBIC = 0, 1, 2
ZEROS, BORDER, REFLECTION = 0, 1, 2
CUBIC_ALPHA = -0.75  # Keys' cubic convolution coefficient (PyTorch / ONNX)


# -- GridSample ---------------------------------------------------------------------------------
class GridSamplePlan(NamedTuple):
    rank: int  # spatial rank r (1..3 for the numba kernel)
    mode: int
    padding: int
    align: bool
    parallel: bool


@nb.njit(nogil=True, cache=True)
def _reflect(v, lo, hi):
    """Reflect ``v`` by the borders [lo, hi] until it lies inside (ONNX / PyTorch rule)."""
    rng = hi - lo
    if not math.isfinite(v):
        return np.nan  # NaN stays NaN; an infinite coordinate has no reflection
    if rng <= 0.0:
        return lo
    # the distance past the border modulo two widths (exact: fmod is), then fold back once
    if v < lo:
        m = np.fmod(lo - v, 2.0 * rng)
        v = lo + m if m <= rng else hi - (m - rng)
    elif v > hi:
        m = np.fmod(v - hi, 2.0 * rng)
        v = hi - m if m <= rng else lo + (m - rng)
    return min(max(v, lo), hi)


@nb.njit(nogil=True, cache=True)
def _cubic_coeffs(t, c):
    a = CUBIC_ALPHA
    x = t + 1.0
    c[0] = ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    x = t
    c[1] = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    x = 1.0 - t
    c[2] = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    x = 2.0 - t
    c[3] = ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a


@nb.njit(nogil=True, cache=True)
def _tap_index(i, size, padding, lo, hi):
    """Input index of integer tap ``i`` under ``padding``; -1 means "reads zero"."""
    if padding == ZEROS:
        return i if 0 <= i < size else -1
    if padding == BORDER:
        return min(max(i, 0), size - 1)
    j = int(_reflect(float(i), lo, hi))
    return min(max(j, 0), size - 1)


@nb.njit(nogil=True, cache=True)
def _dim_taps(coord, size, mode, padding, align, idx, wts, cub):
    """Taps (input index, weight) of one spatial dim for a normalised grid coordinate.
    Returns the number of taps, or -1 when the coordinate is NaN (the output is NaN)."""
    if align:
        x = (coord + 1.0) * 0.5 * (size - 1)
        lo, hi = 0.0, size - 1.0
    else:
        x = ((coord + 1.0) * size - 1.0) * 0.5
        lo, hi = -0.5, size - 0.5
    if mode == NEAREST:
        x = np.rint(x)
    if x < lo or x > hi:
        if padding == BORDER:
            x = min(max(x, 0.0), size - 1.0)
        elif padding == REFLECTION:
            x = _reflect(x, lo, hi)
    if math.isnan(x):
        return -1
    if padding == ZEROS:
        # far outside: every tap reads zero; clamping keeps int() defined for huge/inf values
        x = min(max(x, -8.0), size + 8.0)
    if mode == NEAREST:
        idx[0] = _tap_index(int(x), size, padding, lo, hi)
        wts[0] = 1.0
        return 1
    x0 = math.floor(x)
    t = x - x0
    i0 = int(x0)
    if mode == LINEAR:
        idx[0] = _tap_index(i0, size, padding, lo, hi)
        idx[1] = _tap_index(i0 + 1, size, padding, lo, hi)
        wts[0] = 1.0 - t
        wts[1] = t
        return 2
    _cubic_coeffs(t, cub)
    for k in range(4):
        idx[k] = _tap_index(i0 - 1 + k, size, padding, lo, hi)
        wts[k] = cub[k]
    return 4


@nb.njit(nogil=True, cache=True)
def _grid_sample_block(x, g, out, r, mode, padding, align, start, stop):
    """Output points [start, stop) of the flattened (N, P) index space.
    x: (N, C, D, H, W); g: (N, P, r); out: (N, C, P)."""
    N, C, D, H, W = x.shape
    P = g.shape[1]
    sizes = np.array([D, H, W], np.int64)
    idx = np.zeros((3, 4), np.int64)
    wts = np.zeros((3, 4), np.float64)
    cub = np.zeros(4, np.float64)
    nt = np.zeros(3, np.int64)
    offs = np.zeros(64, np.int64)
    tw = np.zeros(64, np.float64)
    for q in range(start, stop):
        n = q // P
        p = q - n * P
        nan = False
        for j in range(3):
            k = j - (3 - r)
            if k < 0:  # a padded unit dim: one exact tap
                idx[j, 0] = 0
                wts[j, 0] = 1.0
                nt[j] = 1
                continue
            m = _dim_taps(float(g[n, p, r - 1 - k]), sizes[j], mode, padding, align, idx[j], wts[j], cub)
            if m < 0:
                nan = True
                break
            nt[j] = m
        if nan:
            for c in range(C):
                out[n, c, p] = np.nan
            continue
        # flatten the valid taps once, reuse for every channel
        cnt = 0
        for a in range(nt[0]):
            ia = idx[0, a]
            if ia < 0:
                continue
            for b in range(nt[1]):
                ib = idx[1, b]
                if ib < 0:
                    continue
                wab = wts[0, a] * wts[1, b]
                for e in range(nt[2]):
                    ie = idx[2, e]
                    if ie < 0:
                        continue
                    offs[cnt] = (ia * H + ib) * W + ie
                    tw[cnt] = wab * wts[2, e]
                    cnt += 1
        xn = x[n].reshape(C, D * H * W)
        for c in range(C):
            acc = 0.0
            for t in range(cnt):
                acc += tw[t] * xn[c, offs[t]]
            out[n, c, p] = acc


@nb.njit(parallel=True, nogil=True, cache=True)
def _grid_sample_parallel(x, g, out, r, mode, padding, align):
    total = g.shape[0] * g.shape[1]
    nblk = (total + GS_BLOCK - 1) // GS_BLOCK
    for blk in nb.prange(nblk):
        _grid_sample_block(x, g, out, r, mode, padding, align, blk * GS_BLOCK, min(total, (blk + 1) * GS_BLOCK))


@nb.njit(nogil=True, cache=True)
def _grid_sample_serial(x, g, out, r, mode, padding, align):
    _grid_sample_block(x, g, out, r, mode, padding, align, 0, g.shape[0] * g.shape[1])


def grid_sample_plan(x_shape: tuple, out_shape: tuple, mode: int, padding: int, align: bool) -> GridSamplePlan:
    return GridSamplePlan(len(x_shape) - 2, mode, padding, bool(align), math.prod(out_shape) >= PARALLEL_MIN)


def grid_sample(x: np.ndarray, grid: np.ndarray, out: np.ndarray, plan: GridSamplePlan) -> None:
    """GridSample over float32/float64 ``x`` of spatial rank 1..3 (grid cast to x's dtype)."""
    if out.size == 0:
        return
    r = plan.rank
    n, c = x.shape[:2]
    x5 = x.reshape((n, c) + (1,) * (3 - r) + x.shape[2:])
    g = np.ascontiguousarray(grid.reshape(n, -1, r), dtype=x.dtype)
    o = out.reshape(n, c, -1)
    fn = _grid_sample_parallel if plan.parallel else _grid_sample_serial
    fn(x5, g, o, r, plan.mode, plan.padding, plan.align)


# -- GridSampleGrad ----------------------------------------------------------------------------------
@nb.njit(nogil=True, cache=True)
def _reflect_slope(v, lo, hi):
    """d _reflect(v) / dv outside [lo, hi]: -1 after an odd number of folds, +1 after an even one."""
    rng = hi - lo
    if rng <= 0.0 or not math.isfinite(v):
        return 0.0
    m = np.fmod(lo - v, 2.0 * rng) if v < lo else np.fmod(v - hi, 2.0 * rng)
    return -1.0 if m <= rng else 1.0


@nb.njit(nogil=True, cache=True)
def _dim_taps_grad(coord, size, mode, padding, align, idx, wts, dws, cub):
    """``_dim_taps`` plus each weight's derivative by the normalised coordinate in ``dws``."""
    if align:
        x = (coord + 1.0) * 0.5 * (size - 1)
        slope = 0.5 * (size - 1)
        lo, hi = 0.0, size - 1.0
    else:
        x = ((coord + 1.0) * size - 1.0) * 0.5
        slope = 0.5 * size
        lo, hi = -0.5, size - 0.5
    if mode == NEAREST:
        x = np.rint(x)
    if x < lo or x > hi:
        if padding == BORDER:
            x = min(max(x, 0.0), size - 1.0)
            slope = 0.0
        elif padding == REFLECTION:
            slope *= _reflect_slope(x, lo, hi)
            x = _reflect(x, lo, hi)
    if math.isnan(x):
        return -1
    if padding == ZEROS and (x < -8.0 or x > size + 8.0):
        x = min(max(x, -8.0), size + 8.0)
        slope = 0.0
    if mode == NEAREST:
        idx[0] = _tap_index(int(x), size, padding, lo, hi)
        wts[0] = 1.0
        dws[0] = 0.0
        return 1
    x0 = math.floor(x)
    t = x - x0
    i0 = int(x0)
    if mode == LINEAR:
        idx[0] = _tap_index(i0, size, padding, lo, hi)
        idx[1] = _tap_index(i0 + 1, size, padding, lo, hi)
        wts[0] = 1.0 - t
        wts[1] = t
        dws[0] = -slope
        dws[1] = slope
        return 2
    _cubic_coeffs(t, cub)
    a = CUBIC_ALPHA
    s = t + 1.0
    dws[0] = ((3.0 * a * s - 10.0 * a) * s + 8.0 * a) * slope
    dws[1] = (3.0 * (a + 2.0) * t - 2.0 * (a + 3.0)) * t * slope
    s = 1.0 - t
    dws[2] = -(3.0 * (a + 2.0) * s - 2.0 * (a + 3.0)) * s * slope
    s = 2.0 - t
    dws[3] = -((3.0 * a * s - 10.0 * a) * s + 8.0 * a) * slope
    for k in range(4):
        idx[k] = _tap_index(i0 - 1 + k, size, padding, lo, hi)
        wts[k] = cub[k]
    return 4


@nb.njit(nogil=True, cache=True)
def _point_taps(g, n, p, r, sizes, mode, padding, align, idx, wts, dws, nt, cub, offs, tw, tdw):
    """The valid flattened taps of point (n, p): offsets, weights and, per spatial dim j, the weight's
    derivative by that dim's coordinate (tdw[:, j]). Returns the count, or -1 for a NaN coordinate."""
    for j in range(3):
        k = j - (3 - r)
        if k < 0:  # a padded unit dim: one exact tap
            idx[j, 0] = 0
            wts[j, 0] = 1.0
            dws[j, 0] = 0.0
            nt[j] = 1
            continue
        m = _dim_taps_grad(float(g[n, p, r - 1 - k]), sizes[j], mode, padding, align, idx[j], wts[j], dws[j], cub)
        if m < 0:
            return -1
        nt[j] = m
    H, W = sizes[1], sizes[2]
    cnt = 0
    for a in range(nt[0]):
        ia = idx[0, a]
        if ia < 0:
            continue
        for b in range(nt[1]):
            ib = idx[1, b]
            if ib < 0:
                continue
            for e in range(nt[2]):
                ie = idx[2, e]
                if ie < 0:
                    continue
                offs[cnt] = (ia * H + ib) * W + ie
                tw[cnt] = wts[0, a] * wts[1, b] * wts[2, e]
                tdw[cnt, 0] = dws[0, a] * wts[1, b] * wts[2, e]
                tdw[cnt, 1] = wts[0, a] * dws[1, b] * wts[2, e]
                tdw[cnt, 2] = wts[0, a] * wts[1, b] * dws[2, e]
                cnt += 1
    return cnt


@nb.njit(parallel=True, nogil=True, cache=True)
def _grid_sample_grad_points(dy, x, g, dgrid, r, mode, padding, align):
    """dGrid: work items are blocks of points; each owns its points' rows of dgrid (no races)."""
    N, C, D, H, W = x.shape
    P = g.shape[1]
    total = N * P
    nblk = (total + GS_BLOCK - 1) // GS_BLOCK
    sizes = np.array([D, H, W], np.int64)
    for blk in nb.prange(nblk):
        idx = np.zeros((3, 4), np.int64)
        wts = np.zeros((3, 4), np.float64)
        dws = np.zeros((3, 4), np.float64)
        cub = np.zeros(4, np.float64)
        nt = np.zeros(3, np.int64)
        offs = np.zeros(64, np.int64)
        tw = np.zeros(64, np.float64)
        tdw = np.zeros((64, 3), np.float64)
        for q in range(blk * GS_BLOCK, min(total, (blk + 1) * GS_BLOCK)):
            n = q // P
            p = q - n * P
            cnt = _point_taps(g, n, p, r, sizes, mode, padding, align, idx, wts, dws, nt, cub, offs, tw, tdw)
            if cnt < 0:
                for k in range(r):
                    dgrid[n, p, k] = np.nan
                continue
            if mode == NEAREST:  # piecewise constant: a zero gradient, as torch
                for k in range(r):
                    dgrid[n, p, k] = 0.0
                continue
            xn = x[n].reshape(C, D * H * W)
            acc = np.zeros(3)
            if cnt < nt[0] * nt[1] * nt[2]:
                # a tap outside reads 0 and its slope multiplies 0 * dY: NaN when a dY is not finite
                for c in range(C):
                    if not math.isfinite(dy[n, c, p]):
                        acc[:] = np.nan
                        break
            for t in range(cnt):
                s = 0.0
                for c in range(C):
                    s += float(dy[n, c, p]) * float(xn[c, offs[t]])
                for j in range(3):
                    acc[j] += s * tdw[t, j]
            for k in range(r):
                dgrid[n, p, r - 1 - k] = acc[3 - r + k]


@nb.njit(parallel=True, nogil=True, cache=True)
def _grid_sample_grad_input(dy, g, dx, r, mode, padding, align, cb):
    """dX: work items are (image, block of cb channels); each writes only its own dx planes (no races)
    and visits the points in order (deterministic sums)."""
    N, C, D, H, W = dx.shape
    P = g.shape[1]
    nb_c = (C + cb - 1) // cb
    sizes = np.array([D, H, W], np.int64)
    for item in nb.prange(N * nb_c):
        n = item // nb_c
        c0 = (item - n * nb_c) * cb
        c1 = min(C, c0 + cb)
        idx = np.zeros((3, 4), np.int64)
        wts = np.zeros((3, 4), np.float64)
        dws = np.zeros((3, 4), np.float64)
        cub = np.zeros(4, np.float64)
        nt = np.zeros(3, np.int64)
        offs = np.zeros(64, np.int64)
        tw = np.zeros(64, np.float64)
        tdw = np.zeros((64, 3), np.float64)
        xn = dx[n].reshape(C, D * H * W)
        for c in range(c0, c1):
            xn[c, :] = 0.0
        for p in range(P):
            cnt = _point_taps(g, n, p, r, sizes, mode, padding, align, idx, wts, dws, nt, cub, offs, tw, tdw)
            for c in range(c0, c1):
                v = dy[n, c, p]
                for t in range(cnt):
                    xn[c, offs[t]] += tw[t] * v


def grid_sample_backward(dy, x, grid, dx, dgrid, plan: GridSamplePlan) -> None:
    """dX and dGrid of GridSample (spatial rank 1..3, float32/float64): dGrid per point (sum over
    channels of dY times the taps' slopes), dX by per-plane scatter-adds; a NaN point adds nothing
    to dX and gets a NaN dGrid."""
    r = plan.rank
    n, c = x.shape[:2]
    if n == 0 or grid.size == 0 or x.size == 0:
        dx[...] = 0
        dgrid[...] = 0
        return
    shape5 = (n, c) + (1,) * (3 - r) + x.shape[2:]
    g = np.ascontiguousarray(grid.reshape(n, -1, r), dtype=np.float64)
    d3 = dy.reshape(n, c, -1)
    dg = np.empty(g.shape, np.float64)
    _grid_sample_grad_points(d3, x.reshape(shape5), g, dg, r, plan.mode, plan.padding, plan.align)
    dgrid[...] = dg.reshape(dgrid.shape)
    cb = max(1, -(-c * n // max(1, 4 * nb.get_num_threads())))
    dx5 = dx.reshape(shape5)
    _grid_sample_grad_input(d3, g, dx5, r, plan.mode, plan.padding, plan.align, min(cb, c))
    if not np.shares_memory(dx5, dx):
        dx[...] = dx5.reshape(dx.shape)


# -- DeformConv (2-D) -------------------------------------------------------------------------
class DeformPlan(NamedTuple):
    n: int
    c: int
    m: int  # output channels
    group: int
    offset_group: int
    in_hw: tuple
    out_hw: tuple
    kernel: tuple
    strides: tuple
    dilations: tuple
    pads: tuple  # (top, left)
    parallel: bool
    col_shape: tuple  # (C * kh * kw, oh * ow)
    workspace: int


@nb.njit(nogil=True, cache=True)
def _bilinear_zero(xc, y, x):
    """Bilinear sample of plane ``xc`` at (y, x) in pixel units, zero outside the plane."""
    if math.isnan(y) or math.isnan(x):
        return np.nan
    H, W = xc.shape
    if not (y > -1.0 and y < H and x > -1.0 and x < W):
        return 0.0
    y0 = math.floor(y)
    x0 = math.floor(x)
    ly = y - y0
    lx = x - x0
    iy, ix = int(y0), int(x0)
    v = 0.0
    if iy >= 0:
        if ix >= 0:
            v += (1.0 - ly) * (1.0 - lx) * xc[iy, ix]
        if ix + 1 < W:
            v += (1.0 - ly) * lx * xc[iy, ix + 1]
    if iy + 1 < H:
        if ix >= 0:
            v += ly * (1.0 - lx) * xc[iy + 1, ix]
        if ix + 1 < W:
            v += ly * lx * xc[iy + 1, ix + 1]
    return v


@nb.njit(nogil=True, cache=True)
def _deform_rows(x, off, mask, has_mask, cols, kh, kw, sh, sw, ph, pw, dh, dw, cpg, r0, r1):
    """Column rows [r0, r1) of one image: row = (channel, kernel tap), one column per output
    position. x: (C, H, W); off: (G, kh, kw, 2, OH, OW); mask: (G, kh, kw, OH, OW)."""
    OH, OW = off.shape[4], off.shape[5]
    kk = kh * kw
    for row in range(r0, r1):
        c = row // kk
        k = row - c * kk
        a = k // kw
        b = k - a * kw
        g = c // cpg
        xc = x[c]
        for oy in range(OH):
            base_y = oy * sh - ph + a * dh
            for ox in range(OW):
                y = base_y + off[g, a, b, 0, oy, ox]
                xx = ox * sw - pw + b * dw + off[g, a, b, 1, oy, ox]
                v = _bilinear_zero(xc, y, xx)
                if has_mask:
                    v *= mask[g, a, b, oy, ox]
                cols[row, oy * OW + ox] = v


@nb.njit(parallel=True, nogil=True, cache=True)
def _deform_im2col_parallel(x, off, mask, has_mask, cols, kh, kw, sh, sw, ph, pw, dh, dw, cpg):
    for row in nb.prange(cols.shape[0]):
        _deform_rows(x, off, mask, has_mask, cols, kh, kw, sh, sw, ph, pw, dh, dw, cpg, row, row + 1)


@nb.njit(nogil=True, cache=True)
def _deform_im2col_serial(x, off, mask, has_mask, cols, kh, kw, sh, sw, ph, pw, dh, dw, cpg):
    _deform_rows(x, off, mask, has_mask, cols, kh, kw, sh, sw, ph, pw, dh, dw, cpg, 0, cols.shape[0])


def deform_plan(
    x_shape, w_shape, out_hw, kernel, strides, dilations, pads, group, offset_group, itemsize: int
) -> DeformPlan:
    n, c, h, w = x_shape
    kk = kernel[0] * kernel[1]
    col_shape = (c * kk, out_hw[0] * out_hw[1])
    nbytes = math.prod(col_shape) * itemsize
    return DeformPlan(
        n,
        c,
        w_shape[0],
        group,
        offset_group,
        (h, w),
        tuple(out_hw),
        tuple(kernel),
        tuple(strides),
        tuple(dilations),
        (pads[0], pads[1]),
        math.prod(col_shape) >= PARALLEL_MIN,
        col_shape,
        nbytes + ALIGN if nbytes else 0,
    )


def deform_conv2d(x, w, offset, b, mask, y, plan: DeformPlan, ws) -> None:
    """Deformable 2-D convolution: bilinear im2col (numba) then one GEMM per group."""
    if y.size == 0:
        return
    n, c, m, g, og = plan.n, plan.c, plan.m, plan.group, plan.offset_group
    kh, kw = plan.kernel
    oh, ow = plan.out_hw
    sh, sw = plan.strides
    dh, dw = plan.dilations
    ph, pw = plan.pads
    p = oh * ow
    off = offset.reshape(n, og, kh, kw, 2, oh, ow)
    has_mask = mask is not None
    msk = mask.reshape(n, og, kh, kw, oh, ow) if has_mask else np.zeros((1, 1, 1, 1, 1, 1), x.dtype)
    im2col = _deform_im2col_parallel if plan.parallel else _deform_im2col_serial
    yv = y.reshape(n, m, p)
    wg = w.reshape(g, m // g, -1)
    rows_g = (c // g) * kh * kw
    if c == 0 or p == 0:
        yv[...] = 0
    else:
        cols = workspace_view(ws, x.dtype, plan.col_shape)
        for i in range(n):
            im2col(x[i], off[i], msk[i if has_mask else 0], has_mask, cols, kh, kw, sh, sw, ph, pw, dh, dw, c // og)
            for gi in range(g):
                _blas_matmul(wg[gi], cols[gi * rows_g : (gi + 1) * rows_g], yv[i, gi * (m // g) : (gi + 1) * (m // g)])
    if b is not None:
        yv += b.reshape(1, m, 1)


# -- DeformConvGrad (2-D) --------------------------------------------------------------------------
@nb.njit(parallel=True, nogil=True, cache=True)
def _deform_bw_input(off, msk, has_mask, dcols, dx, kh, kw, sh, sw, ph, pw, dh, dw, cpg):
    """dX: work items are (image, channel) planes, each adding only into its own plane (no races)
    through the bilinear corners of its kk taps at every output position, in a fixed order."""
    N, C, H, W = dx.shape
    OH, OW = off.shape[5], off.shape[6]
    kk = kh * kw
    for item in nb.prange(N * C):
        n = item // C
        c = item - n * C
        g = c // cpg
        plane = dx[n, c]
        plane[:, :] = 0.0
        for k in range(kk):
            a = k // kw
            b = k - a * kw
            row = dcols[n, c * kk + k]
            for oy in range(OH):
                for ox in range(OW):
                    y = oy * sh - ph + a * dh + off[n, g, a, b, 0, oy, ox]
                    xx = ox * sw - pw + b * dw + off[n, g, a, b, 1, oy, ox]
                    if math.isnan(y) or math.isnan(xx) or not (y > -1.0 and y < H and xx > -1.0 and xx < W):
                        continue
                    v = float(row[oy * OW + ox])
                    if has_mask:
                        v *= msk[n, g, a, b, oy, ox]
                    y0 = math.floor(y)
                    x0 = math.floor(xx)
                    ly = y - y0
                    lx = xx - x0
                    iy, ix = int(y0), int(x0)
                    if iy >= 0:
                        if ix >= 0:
                            plane[iy, ix] += (1.0 - ly) * (1.0 - lx) * v
                        if ix + 1 < W:
                            plane[iy, ix + 1] += (1.0 - ly) * lx * v
                    if iy + 1 < H:
                        if ix >= 0:
                            plane[iy + 1, ix] += ly * (1.0 - lx) * v
                        if ix + 1 < W:
                            plane[iy + 1, ix + 1] += ly * lx * v


@nb.njit(parallel=True, nogil=True, cache=True)
def _deform_bw_offset(x, off, msk, has_mask, dcols, doff, dmask, kh, kw, sh, sw, ph, pw, dh, dw, cpg):
    """dOffset and dMask: work items are (image, offset group, tap); each owns its rows of both."""
    N, C, H, W = x.shape
    OH, OW = off.shape[5], off.shape[6]
    G = off.shape[1]
    kk = kh * kw
    for item in nb.prange(N * G * kk):
        n = item // (G * kk)
        g = (item // kk) % G
        k = item % kk
        a = k // kw
        b = k - a * kw
        for oy in range(OH):
            for ox in range(OW):
                y = oy * sh - ph + a * dh + off[n, g, a, b, 0, oy, ox]
                xx = ox * sw - pw + b * dw + off[n, g, a, b, 1, oy, ox]
                if math.isnan(y) or math.isnan(xx):
                    doff[n, g, a, b, 0, oy, ox] = np.nan
                    doff[n, g, a, b, 1, oy, ox] = np.nan
                    dmask[n, g, a, b, oy, ox] = np.nan
                    continue
                if not (y > -1.0 and y < H and xx > -1.0 and xx < W):
                    doff[n, g, a, b, 0, oy, ox] = 0.0
                    doff[n, g, a, b, 1, oy, ox] = 0.0
                    dmask[n, g, a, b, oy, ox] = 0.0
                    continue
                y0 = math.floor(y)
                x0 = math.floor(xx)
                ly = y - y0
                lx = xx - x0
                iy, ix = int(y0), int(x0)
                m = msk[n, g, a, b, oy, ox] if has_mask else 1.0
                p = oy * OW + ox
                sy = 0.0
                sx = 0.0
                sm = 0.0
                for c in range(g * cpg, (g + 1) * cpg):
                    v00 = float(x[n, c, iy, ix]) if iy >= 0 and ix >= 0 else 0.0
                    v01 = float(x[n, c, iy, ix + 1]) if iy >= 0 and ix + 1 < W else 0.0
                    v10 = float(x[n, c, iy + 1, ix]) if iy + 1 < H and ix >= 0 else 0.0
                    v11 = float(x[n, c, iy + 1, ix + 1]) if iy + 1 < H and ix + 1 < W else 0.0
                    gc = float(dcols[n, c * kk + k, p])
                    val = (1.0 - ly) * ((1.0 - lx) * v00 + lx * v01) + ly * ((1.0 - lx) * v10 + lx * v11)
                    sm += gc * val
                    sy += gc * ((1.0 - lx) * (v10 - v00) + lx * (v11 - v01))
                    sx += gc * ((1.0 - ly) * (v01 - v00) + ly * (v11 - v10))
                doff[n, g, a, b, 0, oy, ox] = sy * m
                doff[n, g, a, b, 1, oy, ox] = sx * m
                dmask[n, g, a, b, oy, ox] = sm


def deform_conv2d_backward(dy, x, w, offset, mask, dx, dw_out, doff, dmask, plan: DeformPlan) -> None:
    """dX, dW, dOffset and dMask of the 2-D DeformConv: the forward's bilinear columns (numba im2col),
    dW and the columns' gradient through one BLAS GEMM per image and group, then dX scattered per
    (image, channel) plane and dOffset / dMask per (image, offset group, tap), in parallel without
    races. dMask is the gradient of an all-ones mask when ``mask`` is None."""
    n, c, m, g, og = plan.n, plan.c, plan.m, plan.group, plan.offset_group
    kh, kw = plan.kernel
    oh, ow = plan.out_hw
    sh, sw = plan.strides
    dh, dwl = plan.dilations
    ph, pw = plan.pads
    p, kk = oh * ow, kh * kw
    off = offset.reshape(n, og, kh, kw, 2, oh, ow)
    has_mask = mask is not None
    msk = mask.reshape(n, og, kh, kw, oh, ow) if has_mask else np.zeros((1, 1, 1, 1, 1, 1), x.dtype)
    rows_g, mg = (c // g) * kk, m // g
    wg = w.reshape(g, mg, rows_g)
    gy = dy.reshape(n, g, mg, p)
    dwg = dw_out.reshape(g, mg, rows_g)
    dwg[...] = 0
    dcols = np.empty((n, c * kk, p), x.dtype)
    cols = np.empty((c * kk, p), x.dtype)
    im2col = _deform_im2col_parallel if plan.parallel else _deform_im2col_serial
    for i in range(n):
        im2col(x[i], off[i], msk[i if has_mask else 0], has_mask, cols, kh, kw, sh, sw, ph, pw, dh, dwl, c // og)
        for gi in range(g):
            rows = slice(gi * rows_g, (gi + 1) * rows_g)
            dwg[gi] += gy[i, gi] @ cols[rows].T
            dcols[i, rows] = wg[gi].T @ gy[i, gi]
    _deform_bw_input(off, msk, has_mask, dcols, dx, kh, kw, sh, sw, ph, pw, dh, dwl, c // og)
    _deform_bw_offset(
        x,
        off,
        msk,
        has_mask,
        dcols,
        doff.reshape(off.shape),
        dmask.reshape(n, og, kh, kw, oh, ow),
        kh,
        kw,
        sh,
        sw,
        ph,
        pw,
        dh,
        dwl,
        c // og,
    )


# -- NonMaxSuppression ------------------------------------------------------------------------------
@nb.njit(nogil=True, cache=True)
def _nms_class(ymin, xmin, ymax, xmax, area, scores, max_out, iou_thr, score_thr, use_thr, sel):
    """Greedy NMS over one (batch, class): writes selected box indices to ``sel``; returns
    how many. Candidates go by descending score, ties by ascending index (stable sort)."""
    order = np.argsort(-scores, kind="mergesort")
    cnt = 0
    for t in range(order.shape[0]):
        if cnt >= max_out:
            break
        i = order[t]
        if use_thr and not (scores[i] > score_thr):
            continue
        keep = True
        for s in range(cnt):
            j = sel[s]
            ix0 = max(xmin[i], xmin[j])
            ix1 = min(xmax[i], xmax[j])
            if ix1 <= ix0:
                continue
            iy0 = max(ymin[i], ymin[j])
            iy1 = min(ymax[i], ymax[j])
            if iy1 <= iy0:
                continue
            inter = (ix1 - ix0) * (iy1 - iy0)
            if inter <= 0:
                continue
            union = area[i] + area[j] - inter
            if area[i] <= 0 or area[j] <= 0 or union <= 0:
                continue
            if inter / union > iou_thr:
                keep = False
                break
        if keep:
            sel[cnt] = i
            cnt += 1
    return cnt


@nb.njit(parallel=True, nogil=True, cache=True)
def _nms_parallel(ymin, xmin, ymax, xmax, area, scores, max_out, iou_thr, score_thr, use_thr, sel, counts):
    B, C = scores.shape[0], scores.shape[1]
    for q in nb.prange(B * C):
        b = q // C
        c = q - b * C
        counts[q] = _nms_class(
            ymin[b], xmin[b], ymax[b], xmax[b], area[b], scores[b, c], max_out, iou_thr, score_thr, use_thr, sel[q]
        )


@nb.njit(nogil=True, cache=True)
def _nms_serial(ymin, xmin, ymax, xmax, area, scores, max_out, iou_thr, score_thr, use_thr, sel, counts):
    B, C = scores.shape[0], scores.shape[1]
    for q in range(B * C):
        b = q // C
        c = q - b * C
        counts[q] = _nms_class(
            ymin[b], xmin[b], ymax[b], xmax[b], area[b], scores[b, c], max_out, iou_thr, score_thr, use_thr, sel[q]
        )


def nms_parallel(batches: int, classes: int) -> bool:
    """Plan-time choice: one thread per (batch, class) pays off only when there are several."""
    return batches * classes > 1


def box_corners(boxes: np.ndarray, center_point_box: int):
    """(ymin, xmin, ymax, xmax, area) per box, in the boxes' dtype (corners may come flipped)."""
    if center_point_box:
        xc, yc, w, h = boxes[..., 0], boxes[..., 1], boxes[..., 2], boxes[..., 3]
        xmin, xmax = xc - w / 2, xc + w / 2
        ymin, ymax = yc - h / 2, yc + h / 2
    else:
        ymin, ymax = np.minimum(boxes[..., 0], boxes[..., 2]), np.maximum(boxes[..., 0], boxes[..., 2])
        xmin, xmax = np.minimum(boxes[..., 1], boxes[..., 3]), np.maximum(boxes[..., 1], boxes[..., 3])
    area = (xmax - xmin) * (ymax - ymin)
    return [np.ascontiguousarray(a) for a in (ymin, xmin, ymax, xmax, area)]


def non_max_suppression(
    boxes, scores, max_out: int, iou_thr: float, score_thr: float | None, center_point_box: int, parallel: bool = True
) -> np.ndarray:
    """Selected (batch, class, box) triples, int64 of shape (k, 3)."""
    B, C, nb_ = scores.shape
    max_out = int(min(max(max_out, 0), nb_))
    if max_out == 0 or B * C == 0:
        return np.zeros((0, 3), np.int64)
    dt = np.result_type(boxes.dtype, np.float32)
    ymin, xmin, ymax, xmax, area = box_corners(boxes.astype(dt, copy=False), center_point_box)
    sel = np.zeros((B * C, max_out), np.int64)
    counts = np.zeros(B * C, np.int64)
    sc = np.ascontiguousarray(scores, dtype=dt)
    fn = _nms_parallel if parallel else _nms_serial
    fn(
        ymin,
        xmin,
        ymax,
        xmax,
        area,
        sc,
        max_out,
        float(iou_thr),
        float(score_thr) if score_thr is not None else 0.0,
        score_thr is not None,
        sel,
        counts,
    )
    q = np.repeat(np.arange(B * C), counts)
    k = np.arange(q.size) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.stack([q // C, q % C, sel[q, k]], axis=1).astype(np.int64)


# -- CumProd, TensorScatter (numpy; rarely hot) ------------------------------------------------------
def cumprod(x: np.ndarray, out: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> None:
    """Inclusive/exclusive, forward/reverse cumulative product along ``axis``; floats
    accumulate in float64, signed integers in int64 and unsigned in uint64 (wrapping as the
    narrow type would)."""
    if x.size == 0:
        return
    acc = np.float64 if x.dtype.kind == "f" or x.dtype.kind == "V" else (np.uint64 if x.dtype.kind == "u" else np.int64)
    v = np.flip(x, axis) if reverse else x
    with np.errstate(all="ignore"):
        c = np.cumprod(v, axis=axis, dtype=acc)
    if exclusive:  # shift by one along axis, ones first (not c / v: a zero would give NaN)
        e = np.ones_like(c)
        dst = [slice(None)] * c.ndim
        src = [slice(None)] * c.ndim
        dst[axis] = slice(1, None)
        src[axis] = slice(None, -1)
        e[tuple(dst)] = c[tuple(src)]
        c = e
    if reverse:
        c = np.flip(c, axis)
    with np.errstate(all="ignore"):
        np.copyto(out, c, casting="unsafe")


def tensor_scatter(
    past: np.ndarray,
    update: np.ndarray,
    write_indices: np.ndarray | None,
    out: np.ndarray,
    axis: int,
    circular: bool,
    op: str = "TensorScatter",
) -> None:
    """``out = past`` with ``update`` written along ``axis`` at each batch's write index."""
    np.copyto(out, past)
    b = past.shape[0]
    m = past.shape[axis]
    s = update.shape[axis]
    if s == 0 or update.size == 0:
        return
    wi = np.zeros(b, np.int64) if write_indices is None else write_indices.astype(np.int64).reshape(-1)
    if wi.shape[0] != b:
        raise ParamInvalidError(f"{op}: 'write_indices' must have one entry per batch ({b}), got {wi.shape[0]}", op=op)
    if (wi < 0).any():
        i = int(np.argmax(wi < 0))
        raise ParamInvalidError(f"{op}: write_indices[{i}] = {int(wi[i])} is negative", op=op)
    if not circular and (wi + s > m).any():
        i = int(np.argmax(wi + s > m))
        raise ParamInvalidError(
            f"{op}: write_indices[{i}] = {int(wi[i])} + sequence length {s} exceeds the "
            f"cache length {m} along axis {axis} (mode 'linear'; use mode 'circular' to wrap)",
            op=op,
        )
    seq = np.arange(s)
    for i in range(b):
        pos = wi[i] + seq
        if circular:
            pos %= m
        dst = np.moveaxis(out[i], axis - 1, 0)
        dst[pos] = np.moveaxis(update[i], axis - 1, 0)
