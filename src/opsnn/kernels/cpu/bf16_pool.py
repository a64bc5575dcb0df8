"""Max pooling and its gradient on bfloat16 storage, a (n, c) plane per work item: the plane is
widened into float32 scratch, the float32 kernels' loops run on it, and results are rounded to
bfloat16 once (what the fp32 adapter gives, without its whole-tensor float32 copies; MaxPoolGrad's
X, read for its shape only, is not widened at all).

The forward picks exactly one input value per window, so its bfloat16 output is that value; NaN
propagates with the index of the window's first NaN, as in :func:`.pool.max_pool2d_indices`. The
gradient adds dY at the indices in float32 in the same order as :func:`.pool_backward` does.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .gemm import KIND_BF16, _narrow, _widen
from .pool import PARALLEL_MIN, PoolPlan, window_max
from .pool_backward import scatter_add_plane

_OPTS = dict(nogil=True, cache=True, error_model="numpy")
_NEG_INF = np.float32(-np.inf)


@nb.njit(**_OPTS)
def _max_plane(x, y, idx, want_idx, col_major, p, H, W, hs, hlo, hhi, dh, ws, wlo, whi, dw):
    xu = np.empty(H * W, np.uint32)
    xp = xu.view(np.float32)
    _widen(x[p], xu, xp, KIND_BF16)
    OH = hs.shape[0]
    OW = ws.shape[0]
    row = np.empty(OW, np.float32)
    ru = row.view(np.uint32)
    base = p * H * W
    for oh in range(OH):
        h0 = hs[oh]
        i0 = hlo[oh]
        i1 = hhi[oh]
        for ow in range(OW):
            w0 = ws[ow]
            j0 = wlo[ow]
            j1 = whi[ow]
            best, best_k = window_max(xp, h0, i0, i1, dh, w0, j0, j1, dw, W, _NEG_INF)
            row[ow] = best
            if want_idx:
                if best_k < 0:
                    idx[p, oh * OW + ow] = -1
                elif col_major:
                    idx[p, oh * OW + ow] = base + best_k // W + (best_k % W) * H
                else:
                    idx[p, oh * OW + ow] = base + best_k
        _narrow(row, ru, y[p, oh * OW : (oh + 1) * OW], KIND_BF16)


@nb.njit(parallel=True, **_OPTS)
def _max_parallel(x, y, idx, want_idx, col_major, H, W, hs, hlo, hhi, dh, ws, wlo, whi, dw):
    for p in nb.prange(x.shape[0]):
        _max_plane(x, y, idx, want_idx, col_major, p, H, W, hs, hlo, hhi, dh, ws, wlo, whi, dw)


@nb.njit(**_OPTS)
def _max_serial(x, y, idx, want_idx, col_major, H, W, hs, hlo, hhi, dh, ws, wlo, whi, dw):
    for p in range(x.shape[0]):
        _max_plane(x, y, idx, want_idx, col_major, p, H, W, hs, hlo, hhi, dh, ws, wlo, whi, dw)


def max_pool_bf16(x: np.ndarray, y: np.ndarray, idx: np.ndarray | None, plan: PoolPlan, col_major: bool) -> None:
    """1-D / 2-D max pooling of contiguous bfloat16 NC... ``x`` into ``y``; ``idx`` (int64, ONNX
    flattened indices) or None."""
    if plan.planes == 0 or y.size == 0:
        return
    H, W = plan.in_spatial
    xs = x.reshape(plan.planes, H * W).view(np.uint16)
    ys = y.reshape(plan.planes, -1).view(np.uint16)
    ids = idx.reshape(plan.planes, -1) if idx is not None else np.empty((1, 1), np.int64)
    dh, dw = plan.dims
    run = _max_parallel if plan.parallel else _max_serial
    run(
        xs,
        ys,
        ids,
        idx is not None,
        col_major,
        H,
        W,
        dh.start,
        dh.lo,
        dh.hi,
        dh.dilation,
        dw.start,
        dw.lo,
        dw.hi,
        dw.dilation,
    )


@nb.njit(**_OPTS)
def _max_bw_plane(dy, idx, dx, p, HW):
    """Plane p: dx[p] = bf16(the float32 sum of dy at idx - p*HW). Returns how many indices lay
    outside the plane (skipped); -1 (a window with no input tap) is skipped silently."""
    T = dy.shape[1]
    gu = np.empty(T, np.uint32)
    g = gu.view(np.float32)
    _widen(dy[p], gu, g, KIND_BF16)
    acc = np.zeros(HW, np.float32)
    bad = scatter_add_plane(g, idx[p], p * HW, HW, acc)
    _narrow(acc, acc.view(np.uint32), dx[p], KIND_BF16)
    return bad


@nb.njit(parallel=True, **_OPTS)
def _max_bw_parallel(dy, idx, dx, HW, bad):
    for p in nb.prange(dy.shape[0]):
        bad[p] = _max_bw_plane(dy, idx, dx, p, HW)


@nb.njit(**_OPTS)
def _max_bw_serial(dy, idx, dx, HW, bad):
    for p in range(dy.shape[0]):
        bad[p] = _max_bw_plane(dy, idx, dx, p, HW)


def max_pool_backward_bf16(dy: np.ndarray, idx: np.ndarray, dx: np.ndarray, planes: int) -> int:
    """:func:`.pool_backward.max_pool_backward` on bfloat16 ``dy`` and ``dx``. Returns the number of
    indices outside their own (n, c) plane (skipped; the caller reports them)."""
    if dx.size == 0:
        return 0
    du = dx.reshape(planes, -1).view(np.uint16)
    if dy.size == 0:
        du[...] = 0
        return 0
    g = dy.reshape(planes, -1).view(np.uint16)
    bad = np.zeros(planes, np.int64)
    (_max_bw_parallel if dy.size >= PARALLEL_MIN else _max_bw_serial)(g, idx.reshape(planes, -1), du, du.shape[1], bad)
    return int(bad.sum())
