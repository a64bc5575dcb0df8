"""CPU pooling backward kernels (numba): max pooling's gradient scattered through the forward's
indices, average pooling's gradient spread back over each window, and RoiAlign's spread back
through its samples' bilinear taps (work items are channels there: rois of one image overlap).

Work items are whole (n, c) planes: a window never leaves its plane, so the scatter-adds of one
item never touch another's memory (no races, no atomics), and a plane's output positions are
visited in order, so overlapping windows add in the same order on every run.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .pool import PARALLEL_MIN, dim_plan, roi_align_geometry

_OPTS = dict(nogil=True, cache=True, error_model="numpy")


# -- max pooling: scatter dy to the flat indices of the maxima --------------------------------------
@nb.njit(inline="always", **_OPTS)
def scatter_add_plane(g, ix, base, HW, out):
    """out[ix - base] += g in order; returns how many indices lay outside [base, base + HW)
    (skipped); -1 (a window with no input tap) is skipped silently."""
    bad = 0
    for t in range(g.shape[0]):
        i = ix[t]
        if i == -1:
            continue
        k = i - base
        if k < 0 or k >= HW:
            bad += 1
            continue
        out[k] += g[t]
    return bad


@nb.njit(**_OPTS)
def _max_bw_plane(dy, idx, dx, p, HW):
    """Plane p: dx[p] = 0, then dx[p, idx - p*HW] += dy. Returns how many indices lay outside the
    plane (they are skipped); -1 (a window with no input tap) is skipped silently."""
    base = p * HW
    g = dy[p]
    ix = idx[p]
    out = dx[p]
    for k in range(HW):
        out[k] = 0
    return scatter_add_plane(g, ix, base, HW, out)


@nb.njit(parallel=True, **_OPTS)
def _max_bw_parallel(dy, idx, dx, HW, bad):
    for p in nb.prange(dy.shape[0]):
        bad[p] = _max_bw_plane(dy, idx, dx, p, HW)


@nb.njit(**_OPTS)
def _max_bw_serial(dy, idx, dx, HW, bad):
    for p in range(dy.shape[0]):
        bad[p] = _max_bw_plane(dy, idx, dx, p, HW)


def max_pool_backward(dy: np.ndarray, idx: np.ndarray, dx: np.ndarray, planes: int) -> int:
    """``dx`` (N, C, spatial...) = the scatter-add of ``dy`` at ``idx`` (ONNX row-major flat
    indices over the whole input, as MaxPool's Indices output). Returns the number of indices
    outside their own (n, c) plane (skipped; the caller reports them)."""
    if dx.size == 0:
        return 0
    HW = dx.size // planes if planes else 0
    if dy.size == 0:
        dx[...] = 0
        return 0
    g = dy.reshape(planes, -1)
    ix = idx.reshape(planes, -1)
    out = dx.reshape(planes, HW)
    bad = np.zeros(planes, np.int64)
    (_max_bw_parallel if dy.size >= PARALLEL_MIN else _max_bw_serial)(g, ix, out, HW, bad)
    return int(bad.sum())


# -- average pooling: each window's dy / count added to its taps ---------------------------------------
@nb.njit(**_OPTS)
def _avg_bw_plane(g, out, ds, dlo, dhi, ddiv, dd, hs, hlo, hhi, hdiv, dh, ws, wlo, whi, wdiv, dw):
    """One plane: ``out`` (D, H, W) = 0, then every output position's g / count added to the
    input taps of its window (float64 products, one rounding per add)."""
    OD, OH, OW = g.shape
    D, H, W = out.shape
    for d in range(D):
        for h in range(H):
            for w in range(W):
                out[d, h, w] = 0
    for od in range(OD):
        for oh in range(OH):
            dv = ddiv[od] * hdiv[oh]
            for ow in range(OW):
                v = g[od, oh, ow] / (dv * wdiv[ow])
                w0 = ws[ow]
                j0 = wlo[ow]
                j1 = whi[ow]
                for a in range(dlo[od], dhi[od]):
                    d = ds[od] + a * dd
                    for i in range(hlo[oh], hhi[oh]):
                        row = out[d, hs[oh] + i * dh]
                        for j in range(j0, j1):
                            row[w0 + j * dw] += v


@nb.njit(parallel=True, **_OPTS)
def _avg_bw_parallel(g, out, ds, dlo, dhi, ddiv, dd, hs, hlo, hhi, hdiv, dh, ws, wlo, whi, wdiv, dw):
    for p in nb.prange(g.shape[0]):
        _avg_bw_plane(g[p], out[p], ds, dlo, dhi, ddiv, dd, hs, hlo, hhi, hdiv, dh, ws, wlo, whi, wdiv, dw)


@nb.njit(**_OPTS)
def _avg_bw_serial(g, out, ds, dlo, dhi, ddiv, dd, hs, hlo, hhi, hdiv, dh, ws, wlo, whi, wdiv, dw):
    for p in range(g.shape[0]):
        _avg_bw_plane(g[p], out[p], ds, dlo, dhi, ddiv, dd, hs, hlo, hhi, hdiv, dh, ws, wlo, whi, wdiv, dw)


def avg_pool_plan(x_shape: tuple, geometry, count_include_pad: bool) -> tuple:
    """(planes, per-dim (start, lo, hi, divisor, dilation) for three dims, parallel): 1-D and 2-D
    windows are 3-D ones with leading dims of size 1."""
    in_sp = tuple(int(v) for v in x_shape[2:])
    dims = [
        dim_plan(
            in_sp[i],
            geometry.out[i],
            geometry.kernel[i],
            geometry.strides[i],
            geometry.dilations[i],
            geometry.pads_begin[i],
            geometry.pads_end[i],
        )
        for i in range(len(in_sp))
    ]
    while len(dims) < 3:
        dims.insert(0, dim_plan(1, 1, 1, 1, 1, 0, 0))
    per = tuple(
        (d.start, d.lo, d.hi, (d.count_pad if count_include_pad else d.hi - d.lo).astype(np.float64), d.dilation)
        for d in dims
    )
    planes = int(x_shape[0]) * int(x_shape[1])
    n_out = planes * int(np.prod(geometry.out))
    return planes, per, n_out >= PARALLEL_MIN


def avg_pool_backward(dy: np.ndarray, dx: np.ndarray, plan: tuple) -> None:
    """``dx`` = the adjoint of average pooling applied to ``dy`` (see :func:`avg_pool_plan`)."""
    planes, per, parallel = plan
    if dx.size == 0:
        return
    out_sp = tuple(int(v) for v in dy.shape[2:])
    in_sp = tuple(int(v) for v in dx.shape[2:])
    pad = (1,) * (3 - len(out_sp))
    g = dy.reshape((planes,) + pad + out_sp)
    out = dx.reshape((planes,) + pad + in_sp)
    (d, h, w) = per
    (_avg_bw_parallel if parallel else _avg_bw_serial)(g, out, *d, *h, *w)


# -- RoiAlign: each tap's weighted dy added back to its pixel -------------------------------------------
@nb.njit(parallel=True, **_OPTS)
def _roi_align_bw(dy, x, dx, bidx, grid_h, grid_w, offs, is_max, pos, wts):
    """Work items are channels: every roi reads its image's plane of channel c, so item c writes
    only dx[:, c] (no races) and adds the rois in order (deterministic)."""
    R, C, PH, PW = dy.shape
    NC = dx.shape[0]
    for c in nb.prange(C):
        for t in range(c, NC, C):
            dx[t, :] = 0
        for r in range(R):
            row = bidx[r] * C + c
            n = grid_h[r] * grid_w[r]
            k = offs[r]
            for ph in range(PH):
                for pw in range(PW):
                    g = dy[r, c, ph, pw]
                    if n == 0:
                        continue
                    if not is_max:
                        g = g / n
                        for s in range(n):
                            for q in range(4):
                                dx[row, pos[k + s, q]] += wts[k + s, q] * g
                    else:
                        # the forward's max: corners (0 v 1) v (2 v 3), then over samples; first one wins ties
                        best_k, best_q = k, 0
                        best = wts[k, 0] * x[row, pos[k, 0]]
                        for s in range(n):
                            for q in range(4):
                                v = wts[k + s, q] * x[row, pos[k + s, q]]
                                if v > best:
                                    best, best_k, best_q = v, k + s, q
                        dx[row, pos[best_k, best_q]] += wts[best_k, best_q] * g
                    k += n


def roi_align_backward(dy, x, rois, batch_indices, dx, spatial_scale, sampling_ratio, half_pixel, is_max) -> None:
    """dX of RoiAlign for the output gradient ``dy`` (R, C, PH, PW), written into ``dx`` (x's shape):
    avg mode spreads each bin's gradient over its samples' bilinear taps, max mode sends it to the
    weighted corner the forward's maximum came from."""
    R, C, PH, PW = dy.shape
    N = x.shape[0]
    if R == 0 or dx.size == 0:
        dx[...] = 0
        return
    b, gh, gw, offs, pos, wts = roi_align_geometry(
        x, rois, batch_indices, PH, PW, spatial_scale, sampling_ratio, half_pixel
    )
    flat = dx.reshape(N * C, -1)
    _roi_align_bw(dy, x.reshape(N * C, -1), flat, b, gh, gw, offs, is_max, pos, wts)
    if not np.shares_memory(flat, dx):
        dx[...] = flat.reshape(dx.shape)
