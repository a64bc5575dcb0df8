"""Vision ops and ONNX-breadth tensor ops: records, kernels and functional entry points.

GridSample, DeformConv and NonMaxSuppression (numba kernels), ImageDecoder (through Pillow,
an optional dependency), plus CumProd, Det, BitCast and TensorScatter (numpy kernels:
rarely hot). Records follow the latest ONNX schema of each op::

    >>> import opsnn, numpy as np
    >>> x = opsnn.tensor(np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2))
    >>> grid = opsnn.tensor(np.zeros((1, 1, 1, 2), np.float32))   # the centre of the image
    >>> opsnn.ops.grid_sample(x, grid, align_corners=True).numpy()
    array([[[[1.5]]]], dtype=float32)
"""

from __future__ import annotations

import itertools
import math

import ml_dtypes
import numpy as np

from ... import dtypes as _dt
from ...errors import DTypeError, KernelNotFoundError, ParamInvalidError
from ...kernels.cpu import shape as KS
from ...kernels.cpu import vision as K
from ...runtime.memory import check_request
from ..api import api
from ..registry import Attr, Input, TensorMeta, register_op
from .elementwise import onnx_dtype, onnx_enum
from .shape import _host, _i64
from .shape import _ints as _int_list

FLOAT = _dt.FLOATS
_F32_64 = (_dt.float32, _dt.float64)
I64 = _dt.int64


def _text(op: str, name: str, v) -> str:
    """A string attribute (ONNX hands over bytes) as str."""
    if isinstance(v, bytes):
        v = v.decode("utf-8")
    if not isinstance(v, str):
        raise ParamInvalidError(f"{op}: attribute {name!r} must be a string, got {v!r}", op=op)
    return v


def _int_attr(op: str, name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise ParamInvalidError(f"{op}: attribute {name!r} must be an int, got {v!r}", op=op)
    return int(v)


# == GridSample ======================================================================================
_GS_MODES = {"linear": K.LINEAR, "bilinear": K.LINEAR, "nearest": K.NEAREST, "cubic": K.CUBIC, "bicubic": K.CUBIC}
_GS_PADDING = {"zeros": K.ZEROS, "border": K.BORDER, "reflection": K.REFLECTION}
_GS_X_TYPES = FLOAT + _dt.INTEGERS + (_dt.bool_,)


def _gs_attrs(attrs) -> tuple[int, int, bool]:
    mode = _text("GridSample", "mode", attrs["mode"])
    pad = _text("GridSample", "padding_mode", attrs["padding_mode"])
    if mode not in _GS_MODES:
        raise ParamInvalidError(
            f"GridSample: attribute 'mode' must be one of 'linear', 'nearest', 'cubic', got {mode!r}", op="GridSample"
        )
    if pad not in _GS_PADDING:
        raise ParamInvalidError(
            f"GridSample: attribute 'padding_mode' must be one of 'zeros', 'border', 'reflection', got {pad!r}",
            op="GridSample",
        )
    align = _int_attr("GridSample", "align_corners", attrs["align_corners"])
    if align not in (0, 1):
        raise ParamInvalidError(f"GridSample: attribute 'align_corners' must be 0 or 1, got {align}", op="GridSample")
    return _GS_MODES[mode], _GS_PADDING[pad], bool(align)


def _gs_infer(ctx):
    _gs_attrs(ctx.attrs)
    xs, gs = tuple(ctx.shape(0)), tuple(ctx.shape(1))
    if len(xs) < 3:
        ctx.fail(f"input 'X' must have rank >= 3 (N, C, spatial...), got shape {xs}")
    r = len(xs) - 2
    if len(gs) != r + 2:
        ctx.fail(f"input 'grid' must have rank {r + 2} for a rank-{len(xs)} 'X', got shape {gs}")
    if gs[-1] != r:
        ctx.fail(f"input 'grid' must have last dim {r} (one coordinate per spatial dim), got shape {gs}")
    if gs[0] != xs[0]:
        ctx.fail(f"input 'grid' batch {gs[0]} must equal the batch of 'X' ({xs[0]})")
    return [TensorMeta((xs[0], xs[1]) + gs[1:-1], ctx.dtype(0))]


# -- the reference: scalar Python, one output point and tap at a time --------------------------------
def _py_reflect(v: float, lo: float, hi: float) -> float:
    rng = hi - lo
    if not math.isfinite(v):
        return math.nan
    if rng <= 0:
        return lo
    if v < lo:
        m = math.fmod(lo - v, 2 * rng)
        v = lo + m if m <= rng else hi - (m - rng)
    elif v > hi:
        m = math.fmod(v - hi, 2 * rng)
        v = hi - m if m <= rng else lo + (m - rng)
    return min(max(v, lo), hi)


def _py_pixel_index(i: int, size: int, pad: int, lo: float, hi: float) -> int | None:
    if pad == K.ZEROS:
        return i if 0 <= i < size else None
    if pad == K.BORDER:
        return min(max(i, 0), size - 1)
    return min(max(int(_py_reflect(float(i), lo, hi)), 0), size - 1)


def _py_cubic(t: float) -> list:
    a = K.CUBIC_ALPHA

    def far(x):  # 1 <= |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _py_taps(coord: float, size: int, mode: int, pad: int, align: bool):
    """[(index or None, weight)] of one dim, or None for a NaN coordinate."""
    if align:
        x, lo, hi = (coord + 1) / 2 * (size - 1), 0.0, size - 1.0
    else:
        x, lo, hi = ((coord + 1) * size - 1) / 2, -0.5, size - 0.5
    if mode == K.NEAREST:
        x = float(np.rint(x))
    if x < lo or x > hi:
        if pad == K.BORDER:
            x = min(max(x, 0.0), size - 1.0)
        elif pad == K.REFLECTION:
            x = _py_reflect(x, lo, hi)
    if math.isnan(x):
        return None
    if math.isinf(x):  # only with zeros padding: every tap is outside
        return [(None, 0.0)]
    if mode == K.NEAREST:
        return [(_py_pixel_index(int(x), size, pad, lo, hi), 1.0)]
    x0 = math.floor(x)
    t = x - x0
    if mode == K.LINEAR:
        return [(_py_pixel_index(x0, size, pad, lo, hi), 1 - t), (_py_pixel_index(x0 + 1, size, pad, lo, hi), t)]
    return [(_py_pixel_index(x0 - 1 + k, size, pad, lo, hi), w) for k, w in enumerate(_py_cubic(t))]


def _gs_reference(ins, attrs):
    x, grid = ins
    mode, pad, align = _gs_attrs(attrs)
    n, c = x.shape[:2]
    sp = x.shape[2:]
    r = len(sp)
    out_sp = grid.shape[1:-1]
    xf = x.astype(np.float64)
    out = np.zeros((n, c) + tuple(out_sp), np.float64)
    for b in range(n):
        for pos in np.ndindex(*out_sp):
            coords = grid[(b,) + pos].astype(np.float64)
            per_dim = [_py_taps(float(coords[r - 1 - k]), sp[k], mode, pad, align) for k in range(r)]
            if any(t is None for t in per_dim):
                out[(b, slice(None)) + pos] = np.nan
                continue
            acc = np.zeros(c)
            for combo in itertools.product(*per_dim):
                if any(i is None for i, _ in combo):
                    continue
                w = math.prod(wt for _, wt in combo)
                acc += w * xf[(b, slice(None)) + tuple(i for i, _ in combo)]
            out[(b, slice(None)) + pos] = acc
    return _cast_result(out, x.dtype, mode)


def _cast_result(out: np.ndarray, dtype: np.dtype, mode: int) -> np.ndarray:
    if dtype.kind in "iub" and mode != K.NEAREST:
        out = np.rint(out)  # integer images: interpolated values round to nearest
    with np.errstate(invalid="ignore", over="ignore"):
        return out.astype(dtype)


# -- the numpy kernel (any rank and dtype) -------------------------------------------------------------
def _np_reflect(v, lo, hi):
    rng = hi - lo
    out = v.copy()
    if rng <= 0:
        out[np.isfinite(v)] = lo
        out[~np.isfinite(v)] = np.nan
        return out
    with np.errstate(invalid="ignore"):
        below, above = v < lo, v > hi
        m = np.fmod(np.where(below, lo - v, v - hi), 2 * rng)
        fold = m > rng
        out = np.where(
            below, np.where(fold, hi - (m - rng), lo + m), np.where(above, np.where(fold, lo + (m - rng), hi - m), v)
        )
        out = np.clip(out, lo, hi)
    out[~np.isfinite(v)] = np.nan
    return out


def _np_index(i, size, pad, lo, hi):
    """Integer taps -> (index array, valid mask)."""
    if pad == K.ZEROS:
        ok = (i >= 0) & (i < size)
        return np.where(ok, i, 0), ok
    if pad == K.BORDER:
        return np.clip(i, 0, size - 1), np.ones(i.shape, bool)
    j = _np_reflect(i.astype(np.float64), lo, hi)
    return np.clip(np.trunc(j), 0, size - 1).astype(np.int64), np.ones(i.shape, bool)


def _np_taps(coord, size, mode, pad, align):
    """Per dim: list of (index, valid, weight) arrays and a NaN mask."""
    if align:
        x, lo, hi = (coord + 1) / 2 * (size - 1), 0.0, size - 1.0
    else:
        x, lo, hi = ((coord + 1) * size - 1) / 2, -0.5, size - 0.5
    if mode == K.NEAREST:
        x = np.rint(x)
    with np.errstate(invalid="ignore"):
        out = (x < lo) | (x > hi)
    if pad == K.BORDER:
        x = np.where(out, np.clip(x, 0.0, size - 1.0), x)
    elif pad == K.REFLECTION:
        x = np.where(out, _np_reflect(x, lo, hi), x)
    nan = np.isnan(x)
    x = np.clip(np.nan_to_num(x, nan=0.0), -8.0, size + 8.0)
    if mode == K.NEAREST:
        i, ok = _np_index(np.trunc(x).astype(np.int64), size, pad, lo, hi)
        return [(i, ok, np.ones_like(x))], nan
    x0 = np.floor(x)
    t = x - x0
    i0 = x0.astype(np.int64)
    if mode == K.LINEAR:
        ws = [1 - t, t]
        first = i0
    else:
        a = K.CUBIC_ALPHA
        ws = [
            ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
            ((a + 2) * t - (a + 3)) * t * t + 1,
            ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
            ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a,
        ]
        first = i0 - 1
    return [(*_np_index(first + k, size, pad, lo, hi), w) for k, w in enumerate(ws)], nan


def grid_sample_numpy(x, grid, attrs) -> np.ndarray:
    mode, pad, align = _gs_attrs(attrs)
    n, c = x.shape[:2]
    sp = x.shape[2:]
    r = len(sp)
    out_sp = grid.shape[1:-1]
    if n * c * math.prod(out_sp) == 0:  # an empty output: nothing to sample (reshape(n, c, -1) cannot size 0)
        return _cast_result(np.zeros((n, c) + tuple(out_sp)), x.dtype, mode)
    # X, the grid and ~4 (N, points, C) arrays in float64 outside the pool: checked first
    check_request(8 * (x.size + grid.size + 4 * n * c * math.prod(out_sp)), "GridSample (numpy): float64 samples")
    g = grid.astype(np.float64).reshape(n, -1, r)
    p = g.shape[1]
    xr = x.astype(np.float64).reshape(n, c, -1)
    dims, nan = [], np.zeros((n, p), bool)
    for k in range(r):
        taps, bad = _np_taps(g[..., r - 1 - k], sp[k], mode, pad, align)
        dims.append(taps)
        nan |= bad
    strides = [math.prod(sp[k + 1 :]) for k in range(r)]
    out = np.zeros((n, p, c))
    rows = np.arange(n)[:, None]
    for combo in itertools.product(*dims):
        flat = sum(i * s for (i, _, _), s in zip(combo, strides))
        ok = np.logical_and.reduce([v for _, v, _ in combo])
        w = np.prod([wt for _, _, wt in combo], axis=0) * ok
        vals = xr[rows, :, flat]  # (n, p, c)
        vals = np.where(ok[..., None], vals, 0.0)
        out += w[..., None] * vals
    out[nan] = np.nan
    out = np.moveaxis(out, 2, 1).reshape((n, c) + tuple(out_sp))
    return _cast_result(out, x.dtype, mode)


GridSample = register_op(
    "GridSample",
    category="vision",
    inputs=[Input("X", _GS_X_TYPES), Input("grid", FLOAT)],
    outputs=["Y"],
    attrs=[Attr("align_corners", "int", 0), Attr("mode", "string", "linear"), Attr("padding_mode", "string", "zeros")],
    infer=_gs_infer,
    reference=_gs_reference,
    doc="sample X at the normalised grid positions (nearest / N-linear / N-cubic; zeros, border or reflection padding)",
)


def _gs_applies(ctx):
    if not 1 <= len(ctx.shape(0)) - 2 <= 3:
        return f"spatial rank {len(ctx.shape(0)) - 2} (the numba kernel handles 1..3)"
    return None


def _gs_plan(ctx):
    mode, pad, align = _gs_attrs(ctx.attrs)
    return K.grid_sample_plan(tuple(ctx.shape(0)), tuple(ctx.outputs[0].shape), mode, pad, align)


GridSample.kernel(
    "grid_sample_numba",
    dtypes=_F32_64,
    priority=10,
    plan=_gs_plan,
    applies=_gs_applies,
    doc="numba: taps per output point computed once, reused across channels; parallel over blocks of points",
)(lambda ins, outs, attrs, plan, ws: K.grid_sample(ins[0], ins[1], outs[0], plan))
GridSample.kernel(
    "grid_sample_numpy", priority=5, doc="numpy, vectorised over output points (any rank, any numeric dtype)"
)(lambda ins, outs, attrs, plan, ws: np.copyto(outs[0], grid_sample_numpy(ins[0], ins[1], attrs)))


# -- GridSampleGrad (opsnn): dX by scatter-add of each tap's weighted dY, dGrid by the weights' slopes --------
def _gsg_infer(ctx):
    _gs_attrs(ctx.attrs)
    dy, xs, gs = tuple(ctx.shape(0)), tuple(ctx.shape(1)), tuple(ctx.shape(2))
    if len(xs) < 3 or len(gs) != len(xs) or gs[-1] != len(xs) - 2 or gs[0] != xs[0]:
        ctx.fail(f"'X' {xs} and 'grid' {gs} are not a GridSample pair ((N, C, *in), (N, *out, rank))")
    want = (xs[0], xs[1]) + gs[1:-1]
    if dy != want:
        ctx.fail(f"input 'dY' must have GridSample's output shape {want}, got {dy}")
    if ctx.dtype(0) != ctx.dtype(1):
        ctx.fail(f"input 'dY' must have X's dtype {_dt.name(ctx.dtype(1))}, got {_dt.name(ctx.dtype(0))}")
    return [TensorMeta(xs, ctx.dtype(1)), TensorMeta(gs, ctx.dtype(2))]


def _np_reflect_slope(v, lo, hi):
    """d reflect(v) / dv: +1 inside, -1 or +1 outside by the parity of the fold, 0 for a 1-wide range."""
    rng = hi - lo
    if rng <= 0:
        return np.zeros_like(v)
    with np.errstate(invalid="ignore"):
        below, above = v < lo, v > hi
        m = np.fmod(np.where(below, lo - v, v - hi), 2 * rng)
        return np.where(below | above, np.where(m > rng, 1.0, -1.0), 1.0)


def _np_taps_grad(coord, size, mode, pad, align):
    """Per dim: [(index, valid, weight, d weight / d coord)] and the NaN mask (as ``_np_taps``)."""
    if align:
        x, lo, hi, slope = (coord + 1) / 2 * (size - 1), 0.0, size - 1.0, (size - 1) / 2
    else:
        x, lo, hi, slope = ((coord + 1) * size - 1) / 2, -0.5, size - 0.5, size / 2
    slope = np.full(x.shape, float(slope))
    if mode == K.NEAREST:
        x = np.rint(x)
    with np.errstate(invalid="ignore"):
        out = (x < lo) | (x > hi)
    if pad == K.BORDER:
        slope = np.where(out, 0.0, slope)
        x = np.where(out, np.clip(x, 0.0, size - 1.0), x)
    elif pad == K.REFLECTION:
        slope = np.where(out, slope * _np_reflect_slope(x, lo, hi), slope)
        x = np.where(out, _np_reflect(x, lo, hi), x)
    nan = np.isnan(x)
    x = np.nan_to_num(x, nan=0.0)
    slope = np.where((x < -8.0) | (x > size + 8.0), 0.0, slope)
    x = np.clip(x, -8.0, size + 8.0)
    if mode == K.NEAREST:
        i, ok = _np_index(np.trunc(x).astype(np.int64), size, pad, lo, hi)
        return [(i, ok, np.ones_like(x), np.zeros_like(x))], nan
    x0 = np.floor(x)
    t = x - x0
    i0 = x0.astype(np.int64)
    if mode == K.LINEAR:
        ws, ds, first = [1 - t, t], [-np.ones_like(t), np.ones_like(t)], i0
    else:
        a = K.CUBIC_ALPHA

        def far(s):
            return ((a * s - 5 * a) * s + 8 * a) * s - 4 * a

        def dfar(s):
            return (3 * a * s - 10 * a) * s + 8 * a

        def near(s):
            return ((a + 2) * s - (a + 3)) * s * s + 1

        def dnear(s):
            return (3 * (a + 2) * s - 2 * (a + 3)) * s

        ws = [far(t + 1), near(t), near(1 - t), far(2 - t)]
        ds = [dfar(t + 1), dnear(t), -dnear(1 - t), -dfar(2 - t)]
        first = i0 - 1
    return [(*_np_index(first + k, size, pad, lo, hi), w, d * slope) for k, (w, d) in enumerate(zip(ws, ds))], nan


def grid_sample_backward_numpy(dy, x, grid, attrs) -> tuple[np.ndarray, np.ndarray]:
    """(dX, dGrid) of GridSample in float64. A point with a NaN coordinate sends nothing to dX and gets a
    NaN dGrid; nearest sampling has a zero dGrid (piecewise constant), like torch."""
    mode, pad, align = _gs_attrs(attrs)
    n, c = x.shape[:2]
    sp = x.shape[2:]
    r = len(sp)
    p = math.prod(grid.shape[1:-1])
    if n * p == 0 or x.size == 0:
        return np.zeros(x.shape), np.zeros(grid.shape)
    dx = np.zeros((n, math.prod(sp), c))
    dgrid = np.zeros((n, p, r))
    check_request(8 * (2 * x.size + grid.size + 4 * n * c * p), "GridSampleGrad (numpy): float64 samples")
    g = grid.astype(np.float64).reshape(n, p, r)
    gy = np.moveaxis(dy.astype(np.float64).reshape(n, c, p), 1, 2)  # (n, p, c)
    xr = np.moveaxis(x.astype(np.float64).reshape(n, c, -1), 1, 2)  # (n, S, c)
    dims, nan = [], np.zeros((n, p), bool)
    for k in range(r):
        taps, bad = _np_taps_grad(g[..., r - 1 - k], sp[k], mode, pad, align)
        dims.append(taps)
        nan |= bad
    strides = [math.prod(sp[k + 1 :]) for k in range(r)]
    rows = np.arange(n)[:, None]
    for combo in itertools.product(*dims):
        flat = sum(i * s for (i, _, _, _), s in zip(combo, strides))
        ok = np.logical_and.reduce([v for _, v, _, _ in combo]) & ~nan
        w = np.prod([wt for _, _, wt, _ in combo], axis=0) * ok
        # a tap outside the input sends nothing back (not 0 * dY: an Inf dY would leave NaN), as torch
        np.add.at(dx, (rows, flat), np.where(ok[..., None], w[..., None] * gy, 0.0))
        if mode == K.NEAREST:
            continue
        gv = np.einsum("npc,npc->np", np.where(ok[..., None], xr[rows, flat], 0.0), gy)
        for k in range(r):
            dk = combo[k][3] * ok
            for j in range(r):
                if j != k:
                    dk = dk * combo[j][2]
            dgrid[..., r - 1 - k] += dk * gv
    dgrid[nan] = np.nan
    return np.moveaxis(dx, 2, 1).reshape(x.shape), dgrid.reshape(grid.shape)


def _gsg_reference(ins, attrs):
    dx, dgrid = grid_sample_backward_numpy(ins[0], ins[1], ins[2], attrs)
    with np.errstate(invalid="ignore", over="ignore"):
        return [dx.astype(ins[1].dtype), dgrid.astype(ins[2].dtype)]


GridSampleGrad = register_op(
    "GridSampleGrad",
    domain="opsnn",
    category="vision",
    inputs=[Input("dY", FLOAT), Input("X", FLOAT), Input("grid", FLOAT)],
    outputs=["dX", "dGrid"],
    attrs=[Attr("align_corners", "int", 0), Attr("mode", "string", "linear"), Attr("padding_mode", "string", "zeros")],
    infer=_gsg_infer,
    reference=_gsg_reference,
    doc="gradient of GridSample w.r.t. X (scatter-add of dY through the taps) and the grid",
)


@GridSampleGrad.kernel(
    "grid_sample_grad_numba",
    dtypes=_F32_64,
    priority=10,
    plan=lambda ctx: K.grid_sample_plan(tuple(ctx.shape(1)), tuple(ctx.shape(0)), *_gs_attrs(ctx.attrs)),
    applies=lambda ctx: _gs_applies(_After1(ctx)),
    doc="numba: dGrid parallel over blocks of points, dX parallel over (image, channel block) planes, "
    "each writing only its own rows (no races, fixed order)",
)
def _gsg_numba(ins, outs, attrs, plan, ws):
    K.grid_sample_backward(ins[0], ins[1], ins[2], outs[0], outs[1], plan)


class _After1:
    """GridSample's ``applies`` context seen from GridSampleGrad's (X is input 1)."""

    def __init__(self, ctx):
        self._ctx = ctx

    def shape(self, i):
        return self._ctx.shape(i + 1)


@GridSampleGrad.kernel(
    "grid_sample_grad_numpy",
    dtypes=_F32_64,
    priority=5,
    doc="numpy in float64: one vectorised pass per tap combination, np.add.at for the scatter (no races)",
)
def _gsg_kernel(ins, outs, attrs, plan, ws):
    dx, dgrid = grid_sample_backward_numpy(ins[0], ins[1], ins[2], attrs)
    with np.errstate(invalid="ignore", over="ignore"):
        np.copyto(outs[0], dx, casting="unsafe")
        np.copyto(outs[1], dgrid, casting="unsafe")


# == DeformConv ========================================================================================
def _ints(op, name, v, n, default):
    if v is None:
        return [default] * n
    v = [int(i) for i in v]
    if len(v) != n:
        raise ParamInvalidError(f"{op}: attribute {name!r} must have {n} values, got {v}", op=op)
    return v


def _deform_geometry(ctx_shapes, attrs):
    """(kernel, strides, dilations, pads, out spatial) from X and W shapes and the attributes."""
    op = "DeformConv"
    xs, ws = ctx_shapes
    r = len(xs) - 2
    kernel = (
        _ints(op, "kernel_shape", attrs["kernel_shape"], r, 1) if attrs["kernel_shape"] is not None else list(ws[2:])
    )
    strides = _ints(op, "strides", attrs["strides"], r, 1)
    dil = _ints(op, "dilations", attrs["dilations"], r, 1)
    pads = _ints(op, "pads", attrs["pads"], 2 * r, 0)
    if any(s < 1 for s in strides) or any(d < 1 for d in dil) or any(p < 0 for p in pads) or any(k < 1 for k in kernel):
        raise ParamInvalidError(
            f"{op}: strides/dilations must be >= 1, pads >= 0 and kernel_shape >= 1; got "
            f"strides={strides}, dilations={dil}, pads={pads}, kernel_shape={kernel}",
            op=op,
        )
    out = [(xs[2 + i] + pads[i] + pads[r + i] - ((kernel[i] - 1) * dil[i] + 1)) // strides[i] + 1 for i in range(r)]
    return kernel, strides, dil, pads, out


def _deform_infer(ctx):
    xs, ws, os_ = tuple(ctx.shape(0)), tuple(ctx.shape(1)), tuple(ctx.shape(2))
    if len(xs) < 3:
        ctx.fail(f"input 'X' must have rank >= 3 (N, C, spatial...), got shape {xs}")
    r = len(xs) - 2
    if len(ws) != r + 2:
        ctx.fail(f"input 'W' must have rank {r + 2}, got shape {ws}")
    for i in range(1, len(ctx.inputs)):
        if ctx.has(i) and ctx.dtype(i) != ctx.dtype(0):
            raise DTypeError(
                f"DeformConv: input {i} has dtype {_dt.name(ctx.dtype(i))}; expected the dtype of "
                f"'X' ({_dt.name(ctx.dtype(0))})",
                op="DeformConv",
            )
    group = _int_attr("DeformConv", "group", ctx.attrs["group"])
    og = _int_attr("DeformConv", "offset_group", ctx.attrs["offset_group"])
    if group < 1 or og < 1:
        raise ParamInvalidError(
            f"DeformConv: 'group' and 'offset_group' must be >= 1, got {group}, {og}", op="DeformConv"
        )
    n, c = xs[:2]
    m = ws[0]
    if c != ws[1] * group or m % group:
        ctx.fail(
            f"'X' has {c} channels and 'W' has shape {ws} with group={group}: need C == W.shape[1] * group "
            "and W.shape[0] divisible by group"
        )
    if c % og:
        ctx.fail(f"'X' channels ({c}) must be divisible by offset_group ({og})")
    kernel, strides, dil, pads, out = _deform_geometry((xs, ws), ctx.attrs)
    if list(ws[2:]) != list(kernel):
        ctx.fail(f"attribute kernel_shape {kernel} does not match 'W' spatial dims {list(ws[2:])}")
    if any(o < 1 for o in out):
        ctx.fail(f"output spatial dims {out} are not positive (input {list(xs[2:])}, kernel {kernel}, pads {pads})")
    kk = math.prod(kernel)
    want = (n, og * kk * r) + tuple(out)
    if os_ != want:
        ctx.fail(f"input 'offset' must have shape {want} (N, offset_group * prod(kernel) * {r}, *output), got {os_}")
    if ctx.has(3) and tuple(ctx.shape(3)) != (m,):
        ctx.fail(f"input 'B' must have shape ({m},), got {tuple(ctx.shape(3))}")
    if ctx.has(4):
        want_m = (n, og * kk) + tuple(out)
        if tuple(ctx.shape(4)) != want_m:
            ctx.fail(f"input 'mask' must have shape {want_m}, got {tuple(ctx.shape(4))}")
    return [TensorMeta((n, m) + tuple(out), ctx.dtype(0))]


def _deform_reference(ins, attrs):
    """Any spatial rank: N-linear sampling (zero outside) per kernel tap, then a contraction."""
    x, w, offset = ins[0], ins[1], ins[2]
    b = ins[3] if len(ins) > 3 else None
    mask = ins[4] if len(ins) > 4 else None
    kernel, strides, dil, pads, out = _deform_geometry((x.shape, w.shape), attrs)
    r = len(kernel)
    n, c = x.shape[:2]
    m = w.shape[0]
    group, og = int(attrs["group"]), int(attrs["offset_group"])
    kk = math.prod(kernel)
    xf = x.astype(np.float64)
    off = offset.astype(np.float64).reshape((n, og, kk, r) + tuple(out))
    msk = None if mask is None else mask.astype(np.float64).reshape((n, og, kk) + tuple(out))
    cols = np.zeros((n, c, kk) + tuple(out))
    cpg = c // og
    for t, tap in enumerate(itertools.product(*[range(k) for k in kernel])):
        for g in range(og):
            # sampling position per spatial dim, shape (n, *out)
            pos = []
            for d in range(r):
                grid = np.arange(out[d]) * strides[d] - pads[d] + tap[d] * dil[d]
                shape = [1] * (1 + r)
                shape[1 + d] = out[d]
                pos.append(grid.reshape(shape) + off[:, g, t, d])
            val = np.zeros((n, cpg) + tuple(out))
            with np.errstate(invalid="ignore"):
                floors = [np.nan_to_num(np.floor(p_), nan=0.0, posinf=0.0, neginf=0.0) for p_ in pos]
            for corner in itertools.product((0, 1), repeat=r):
                wt = np.ones((n,) + tuple(out))
                idx = []
                ok = np.ones((n,) + tuple(out), bool)
                for d in range(r):
                    f = floors[d]
                    frac = pos[d] - f
                    i = f.astype(np.int64) + corner[d]
                    wt = wt * (frac if corner[d] else 1 - frac)
                    ok &= (i >= 0) & (i < x.shape[2 + d]) & np.isfinite(pos[d])
                    idx.append(np.clip(i, 0, x.shape[2 + d] - 1))
                bidx = np.arange(n).reshape((n,) + (1,) * r)
                for ci in range(cpg):
                    sample = xf[(bidx, g * cpg + ci) + tuple(idx)]
                    val[:, ci] += np.where(ok, wt * sample, 0.0)
            nan = np.zeros((n,) + tuple(out), bool)
            for d in range(r):
                nan |= np.isnan(pos[d])
            val[np.broadcast_to(nan[:, None], val.shape)] = np.nan
            if msk is not None:
                val *= msk[:, g, t][:, None]
            cols[:, g * cpg : (g + 1) * cpg, t] = val
    cols = cols.reshape((n, group, (c // group) * kk, -1))
    wg = w.astype(np.float64).reshape(group, m // group, -1)
    y = np.einsum("gmk,ngkp->ngmp", wg, cols).reshape((n, m) + tuple(out))
    if b is not None:
        y += b.astype(np.float64).reshape((1, m) + (1,) * r)
    return y.astype(x.dtype)


DeformConv = register_op(
    "DeformConv",
    category="conv",
    inputs=[
        Input("X", FLOAT),
        Input("W", FLOAT),
        Input("offset", FLOAT),
        Input("B", FLOAT, optional=True),
        Input("mask", FLOAT, optional=True),
    ],
    outputs=["Y"],
    attrs=[
        Attr("dilations", "ints", None),
        Attr("group", "int", 1),
        Attr("kernel_shape", "ints", None),
        Attr("offset_group", "int", 1),
        Attr("pads", "ints", None),
        Attr("strides", "ints", None),
    ],
    infer=_deform_infer,
    reference=_deform_reference,
    flops=lambda ctx: 2 * math.prod(ctx.outputs[0].shape) * math.prod(ctx.shape(1)[1:]),
    doc="deformable convolution: each kernel tap samples X (bilinearly) at a learned offset, optionally "
    "scaled by a mask",
)


def _deform_plan_of(ctx, xi: int, itemsize: int):
    """DeformConv's plan for X at input ``xi`` and W after it, computing in ``itemsize``-byte floats."""
    xs, ws = tuple(ctx.shape(xi)), tuple(ctx.shape(xi + 1))
    kernel, strides, dil, pads, out = _deform_geometry((xs, ws), ctx.attrs)
    return K.deform_plan(
        xs, ws, out, kernel, strides, dil, pads, int(ctx.attrs["group"]), int(ctx.attrs["offset_group"]), itemsize
    )


def _deform_plan(ctx):
    # 16-bit runs in fp32
    return _deform_plan_of(ctx, 0, 4 if _dt.is_low_precision(ctx.dtype(0)) else ctx.dtype(0).itemsize)


def _deform_kernel(ins, outs, attrs, plan, ws):
    b = ins[3] if len(ins) > 3 else None
    mask = ins[4] if len(ins) > 4 else None
    K.deform_conv2d(ins[0], ins[1], ins[2], b, mask, outs[0], plan, ws)


DeformConv.kernel(
    "deform_conv2d_im2col",
    dtypes=_F32_64,
    priority=10,
    plan=_deform_plan,
    workspace=lambda ctx, plan: plan.workspace,
    applies=lambda ctx: (
        None if len(ctx.shape(0)) == 4 else f"{len(ctx.shape(0)) - 2}-D input (the numba kernel is 2-D)"
    ),
    doc="bilinear im2col (numba) + one BLAS GEMM per group",
)(_deform_kernel)


# -- DeformConvGrad (opsnn): dX, dW, dOffset and dMask of DeformConv ------------------------------------
def _deform_grad_infer(ctx):
    xs, ws, os_ = tuple(ctx.shape(1)), tuple(ctx.shape(2)), tuple(ctx.shape(3))
    fwd = _deform_infer(_After(ctx, 1))
    want = tuple(fwd[0].shape)
    if tuple(ctx.shape(0)) != want:
        ctx.fail(f"input 'dY' must have DeformConv's output shape {want}, got {tuple(ctx.shape(0))}")
    if ctx.dtype(0) != ctx.dtype(1):
        ctx.fail(f"input 'dY' must have X's dtype {_dt.name(ctx.dtype(1))}, got {_dt.name(ctx.dtype(0))}")
    r = len(xs) - 2
    mask_shape = (os_[0], os_[1] // r) + os_[2:]
    dt = ctx.dtype(1)
    return [TensorMeta(xs, dt), TensorMeta(ws, dt), TensorMeta(os_, dt), TensorMeta(mask_shape, dt)]


class _After:
    """A forward op's inference context seen from its backward record's (inputs after the first ``k``;
    DeformConv's B is absent, its mask is the backward's last input)."""

    def __init__(self, ctx, k):
        self._ctx, self._k, self.attrs = ctx, k, ctx.attrs
        self.inputs = [None] * 5

    def _map(self, i):
        return {0: 1, 1: 2, 2: 3, 4: 4}.get(i)

    def has(self, i):
        j = self._map(i)
        return j is not None and self._ctx.has(j)

    def shape(self, i):
        return self._ctx.shape(self._map(i))

    def dtype(self, i):
        return self._ctx.dtype(self._map(i))

    def fail(self, msg):
        self._ctx.fail(msg)


def deform_conv_backward_numpy(dy, x, w, offset, mask, attrs) -> tuple:
    """(dX, dW, dOffset, dMask) of DeformConv in float64, any spatial rank (dMask as if the mask were all
    ones when it is absent). A sampling position with a NaN offset sends nothing to dX and gets NaN
    dOffset / dMask; one outside the input (an Inf offset included) samples 0, sends nothing to dX and
    gets dOffset = dMask = 0, as in torchvision. A corner outside the input takes no part in any
    product, and dOffset = mask * sum over channels of dCols * d(sample)/d(position)."""
    kernel, strides, dil, pads, out = _deform_geometry((x.shape, w.shape), attrs)
    r = len(kernel)
    n, c = x.shape[:2]
    sp = x.shape[2:]
    m = w.shape[0]
    group, og = int(attrs["group"]), int(attrs["offset_group"])
    kk = math.prod(kernel)
    p = math.prod(out)
    check_request(8 * (3 * x.size + 4 * n * c * kk * p), "DeformConvGrad (numpy): float64 columns")
    xr = np.moveaxis(x.astype(np.float64), 1, -1)  # (n, *sp, c): all channels of one pixel together
    off = offset.astype(np.float64).reshape((n, og, kk, r) + tuple(out))
    msk = (
        np.ones((n, og, kk) + tuple(out)) if mask is None else mask.astype(np.float64).reshape((n, og, kk) + tuple(out))
    )
    cpg = c // og
    val = np.zeros((n, kk) + tuple(out) + (c,))  # the sampled (unmasked) columns
    nan = np.zeros((n, og, kk) + tuple(out), bool)
    outside = np.zeros((n, og, kk) + tuple(out), bool)
    taps = []  # per (t, g): [(index tuple, ok, weight, d weight / d pos per dim)]
    bidx = np.arange(n).reshape((n,) + (1,) * r)
    for t, tap in enumerate(itertools.product(*[range(k) for k in kernel])):
        for g in range(og):
            pos = []
            for d in range(r):
                grid = np.arange(out[d]) * strides[d] - pads[d] + tap[d] * dil[d]
                shape = [1] * (1 + r)
                shape[1 + d] = out[d]
                pos.append(grid.reshape(shape) + off[:, g, t, d])
            bad = np.zeros((n,) + tuple(out), bool)  # NaN, or outside (-1, size) in some dim
            for d in range(r):
                nan[:, g, t] |= np.isnan(pos[d])
                bad |= ~((pos[d] > -1) & (pos[d] < sp[d]))
            outside[:, g, t] = bad & ~nan[:, g, t]
            pos = [np.where(bad, 0.0, q) for q in pos]
            floors = [np.floor(q) for q in pos]
            fracs = [q - f for q, f in zip(pos, floors)]
            corners = []
            chans = slice(g * cpg, (g + 1) * cpg)
            for corner in itertools.product((0, 1), repeat=r):
                ok = ~bad
                idx, wt, dwt = [], np.ones((n,) + tuple(out)), []
                for d in range(r):
                    i = floors[d].astype(np.int64) + corner[d]
                    ok = ok & (i >= 0) & (i < sp[d])
                    idx.append(np.clip(i, 0, sp[d] - 1))
                    wt = wt * (fracs[d] if corner[d] else 1 - fracs[d])
                for d in range(r):
                    dd = np.ones((n,) + tuple(out)) * (1.0 if corner[d] else -1.0)
                    for e in range(r):
                        if e != d:
                            dd = dd * (fracs[e] if corner[e] else 1 - fracs[e])
                    dwt.append(dd)
                ok = ok[..., None]
                key = (bidx,) + tuple(idx)
                val[:, t, ..., chans] += np.where(ok, wt[..., None] * xr[key][..., chans], 0.0)
                corners.append((key, ok, wt, dwt))
            taps.append((t, g, chans, corners))
    # columns are (n, group, (c/group) * kk, p) in the forward's (channel, tap) order
    vt = np.moveaxis(val.reshape(n, kk, p, c), 3, 1)  # (n, c, kk, p)
    mk = np.repeat(msk.reshape(n, og, kk, p), cpg, axis=1)  # (n, c, kk, p)
    cols = (vt * mk).reshape(n, group, (c // group) * kk, p)
    for g in range(og):  # a NaN position's column is NaN, as in the forward
        cols.reshape(n, c, kk, p)[:, g * cpg : (g + 1) * cpg][
            np.broadcast_to(nan[:, g].reshape(n, 1, kk, p), (n, cpg, kk, p))
        ] = np.nan
    gy = dy.astype(np.float64).reshape(n, group, m // group, p)
    wg = w.astype(np.float64).reshape(group, m // group, -1)
    dw = np.einsum("ngmp,ngkp->gmk", gy, cols).reshape(w.shape)
    dcols = np.einsum("gmk,ngmp->ngkp", wg, gy).reshape(n, c, kk, p)
    dmask = np.einsum("ngckp,ngckp->ngkp", dcols.reshape(n, og, cpg, kk, p), vt.reshape(n, og, cpg, kk, p))
    dval = np.moveaxis(dcols * mk, 1, -1).reshape((n, kk) + tuple(out) + (c,))  # (n, kk, *out, c)
    dxr = np.zeros(xr.shape)
    doff = np.zeros((n, og, kk, r) + tuple(out))
    dc = np.moveaxis(dcols.reshape(n, c, kk, *out), 1, -1)  # (n, kk, *out, c)
    for t, g, chans, corners in taps:
        gv = dval[:, t, ..., chans]  # (n, *out, cpg)
        slope = np.zeros((r,) + gv.shape)  # d(sample)/d(position) per channel
        for key, ok, wt, dwt in corners:
            np.add.at(dxr, key + (chans,), np.where(ok, wt[..., None] * gv, 0.0))
            for d in range(r):
                slope[d] += np.where(ok, dwt[d][..., None] * xr[key][..., chans], 0.0)
        for d in range(r):
            doff[:, g, t, d] = np.einsum("...c,...c->...", dc[:, t, ..., chans], slope[d]) * msk[:, g, t]
    dmask = dmask.reshape((n, og, kk) + tuple(out))
    for d in range(r):  # a position outside the input has a zero gradient, whatever dY and the mask hold
        doff[:, :, :, d][outside] = 0.0
        doff[:, :, :, d][nan] = np.nan
    dmask[outside] = 0.0
    dmask[nan] = np.nan
    return (
        np.moveaxis(dxr, -1, 1),
        dw,
        doff.reshape(offset.shape),
        dmask.reshape((n, og * kk) + tuple(out)),
    )


def _deform_grad_reference(ins, attrs):
    mask = ins[4] if len(ins) > 4 else None
    res = deform_conv_backward_numpy(ins[0], ins[1], ins[2], ins[3], mask, attrs)
    with np.errstate(invalid="ignore", over="ignore"):
        return [a.astype(ins[1].dtype) for a in res]


DeformConvGrad = register_op(
    "DeformConvGrad",
    domain="opsnn",
    category="conv",
    inputs=[
        Input("dY", FLOAT),
        Input("X", FLOAT),
        Input("W", FLOAT),
        Input("offset", FLOAT),
        Input("mask", FLOAT, optional=True),
    ],
    outputs=["dX", "dW", "dOffset", "dMask"],
    attrs=[
        Attr("dilations", "ints", None),
        Attr("group", "int", 1),
        Attr("kernel_shape", "ints", None),
        Attr("offset_group", "int", 1),
        Attr("pads", "ints", None),
        Attr("strides", "ints", None),
    ],
    infer=_deform_grad_infer,
    reference=_deform_grad_reference,
    doc="gradients of DeformConv w.r.t. X (scatter through the bilinear taps), W, the offsets and the mask",
)


def _deform_grad_plan(ctx):
    return _deform_plan_of(ctx, 1, ctx.dtype(1).itemsize)


@DeformConvGrad.kernel(
    "deform_conv_grad_numba",
    dtypes=_F32_64,
    priority=10,
    plan=_deform_grad_plan,
    applies=lambda ctx: (
        None if len(ctx.shape(1)) == 4 else f"{len(ctx.shape(1)) - 2}-D input (the numba kernel is 2-D)"
    ),
    doc="numba im2col + BLAS GEMMs per image and group for dW and the columns' gradient; dX parallel over "
    "(image, channel) planes, dOffset / dMask over (image, offset group, tap): no races",
)
def _deform_grad_numba(ins, outs, attrs, plan, ws):
    mask = ins[4] if len(ins) > 4 else None
    K.deform_conv2d_backward(ins[0], ins[1], ins[2], ins[3], mask, outs[0], outs[1], outs[2], outs[3], plan)


@DeformConvGrad.kernel(
    "deform_conv_grad_numpy",
    dtypes=_F32_64,
    priority=5,
    doc="numpy in float64, any spatial rank: one vectorised pass per tap and corner, np.add.at scatter",
)
def _deform_grad_kernel(ins, outs, attrs, plan, ws):
    mask = ins[4] if len(ins) > 4 else None
    res = deform_conv_backward_numpy(ins[0], ins[1], ins[2], ins[3], mask, attrs)
    with np.errstate(invalid="ignore", over="ignore"):
        for o, a in zip(outs, res):
            np.copyto(o, a, casting="unsafe")


# == NonMaxSuppression =================================================================================
def _nms_infer(ctx):
    bs, ss = tuple(ctx.shape(0)), tuple(ctx.shape(1))
    if len(bs) != 3 or bs[2] != 4:
        ctx.fail(f"input 'boxes' must have shape (batch, boxes, 4), got {bs}")
    if len(ss) != 3 or ss[0] != bs[0] or ss[2] != bs[1]:
        ctx.fail(f"input 'scores' must have shape (batch={bs[0]}, classes, boxes={bs[1]}), got {ss}")
    for i, name in ((2, "max_output_boxes_per_class"), (3, "iou_threshold"), (4, "score_threshold")):
        if ctx.has(i) and math.prod(ctx.shape(i)) > 1:
            ctx.fail(f"input {name!r} must be a scalar (or 1-element tensor), got shape {tuple(ctx.shape(i))}")
    cpb = _int_attr("NonMaxSuppression", "center_point_box", ctx.attrs["center_point_box"])
    if cpb not in (0, 1):
        raise ParamInvalidError(
            f"NonMaxSuppression: attribute 'center_point_box' must be 0 or 1, got {cpb}", op="NonMaxSuppression"
        )
    return [TensorMeta((None, 3), I64)]


def _nms_args(ins):
    def one(i, default):
        if len(ins) <= i or ins[i] is None or ins[i].size == 0:
            return default
        return ins[i].reshape(-1)[0]

    return int(one(2, 0)), float(one(3, 0.0)), (None if one(4, None) is None else float(one(4, None)))


def _nms_reference(ins, attrs):
    boxes, scores = ins[0], ins[1]
    max_out, iou_thr, score_thr = _nms_args(ins)
    cpb = int(attrs["center_point_box"])
    dt = np.result_type(boxes.dtype, np.float32)
    out = []
    for b in range(boxes.shape[0]):
        bx = boxes[b].astype(dt)
        for c in range(scores.shape[1]):
            sc = scores[b, c].astype(dt)
            cand = [i for i in range(bx.shape[0]) if score_thr is None or sc[i] > dt.type(score_thr)]
            cand.sort(key=lambda i: (-float(sc[i]), i))
            kept = []
            for i in cand:
                if len(kept) >= max(max_out, 0):
                    break
                if all(not _iou_exceeds(bx[i], bx[j], cpb, iou_thr) for j in kept):
                    kept.append(i)
            out += [(b, c, i) for i in kept]
    return np.array(out, np.int64).reshape(-1, 3)


def _iou_exceeds(p, q, cpb, thr) -> bool:
    def corners(v):
        if cpb:
            return v[1] - v[3] / 2, v[0] - v[2] / 2, v[1] + v[3] / 2, v[0] + v[2] / 2
        return min(v[0], v[2]), min(v[1], v[3]), max(v[0], v[2]), max(v[1], v[3])

    y0a, x0a, y1a, x1a = corners(p)
    y0b, x0b, y1b, x1b = corners(q)
    iw = min(x1a, x1b) - max(x0a, x0b)
    ih = min(y1a, y1b) - max(y0a, y0b)
    if iw <= 0 or ih <= 0:
        return False
    inter = iw * ih
    area_a, area_b = (x1a - x0a) * (y1a - y0a), (x1b - x0b) * (y1b - y0b)
    union = area_a + area_b - inter
    if area_a <= 0 or area_b <= 0 or union <= 0:
        return False
    return inter / union > thr


NonMaxSuppression = register_op(
    "NonMaxSuppression",
    category="vision",
    inputs=[
        Input("boxes", FLOAT),
        Input("scores", FLOAT),
        Input("max_output_boxes_per_class", (I64,), optional=True),
        Input("iou_threshold", FLOAT, optional=True),
        Input("score_threshold", FLOAT, optional=True),
    ],
    outputs=["selected_indices"],
    attrs=[Attr("center_point_box", "int", 0)],
    dynamic_shape=True,
    infer=_nms_infer,
    reference=_nms_reference,
    doc="greedy per-class non-max suppression; (batch, class, box) rows of the kept boxes",
)


def _nms_kernel(ins, outs, attrs, plan, ws):
    max_out, iou_thr, score_thr = _nms_args(ins)
    return [
        K.non_max_suppression(
            ins[0], ins[1], max_out, iou_thr, score_thr, int(attrs["center_point_box"]), parallel=plan
        )
    ]


NonMaxSuppression.kernel(
    "nms_numba",
    dtypes=_F32_64,
    priority=10,
    plan=lambda ctx: K.nms_parallel(ctx.shape(1)[0], ctx.shape(1)[1]),
    doc="numba greedy loop per (batch, class), parallel across them",
)(_nms_kernel)


# == CumProd ===========================================================================================
_CUMPROD_TYPES = FLOAT + (_dt.int32, _dt.int64, _dt.uint32, _dt.uint64)


def _axis_value(ctx, op: str) -> int:
    value = ctx.value(1)
    if value is None:
        ctx.fail("input 'axis' must be known at prepare time (a constant or host tensor)")
    a = np.asarray(value)
    if a.size != 1 or a.ndim > 1:
        raise ParamInvalidError(f"{op}: 'axis' must be a scalar or a 1-element 1-D tensor, got shape {a.shape}", op=op)
    r = len(ctx.shape(0))
    ax = int(a.reshape(-1)[0])
    if not -r <= ax < r:
        raise ParamInvalidError(f"{op}: axis {ax} is out of range for a rank-{r} input; expected {-r}..{r - 1}", op=op)
    return ax % r


def _cumprod_ref(ins, attrs):
    x = ins[0]
    axis = int(np.asarray(ins[1]).reshape(-1)[0]) % x.ndim
    acc = object if x.dtype.kind in "iu" else np.float64  # exact integers, wrapped at the end
    xs = np.moveaxis(x, axis, 0).astype(acc)
    out = np.empty(xs.shape, acc)
    order = range(xs.shape[0] - 1, -1, -1) if attrs["reverse"] else range(xs.shape[0])
    run = np.ones(xs.shape[1:], acc)
    for i in order:
        if attrs["exclusive"]:
            out[i] = run
            run = run * xs[i]
        else:
            run = run * xs[i]
            out[i] = run
    out = np.moveaxis(out, 0, axis)
    if x.dtype.kind in "iu":
        bits = 8 * x.dtype.itemsize
        wrapped = np.vectorize(lambda v: int(v) % (1 << bits), otypes=[object])(out) if out.size else out
        return wrapped.astype(np.uint64).astype(x.dtype) if out.size else out.astype(x.dtype)
    with np.errstate(over="ignore"):
        return out.astype(x.dtype)


CumProd = register_op(
    "CumProd",
    category="reduction",
    inputs=[Input("x", _CUMPROD_TYPES), Input("axis", (_dt.int32, I64), host=True)],
    outputs=["y"],
    attrs=[Attr("exclusive", "int", 0), Attr("reverse", "int", 0)],
    infer=lambda ctx: (_axis_value(ctx, "CumProd"), [TensorMeta(tuple(ctx.shape(0)), ctx.dtype(0))])[1],
    reference=_cumprod_ref,
    doc="cumulative product along axis (exclusive / reverse variants)",
)
CumProd.kernel(
    "cumprod_numpy",
    dtypes=_F32_64 + (_dt.int32, I64, _dt.uint32, _dt.uint64),
    priority=5,
    plan=lambda ctx: _axis_value(ctx, "CumProd"),
    doc="numpy cumprod, float64/int64 accumulation",
)(lambda ins, outs, attrs, plan, ws: K.cumprod(ins[0], outs[0], plan, bool(attrs["exclusive"]), bool(attrs["reverse"])))


# == Det ===============================================================================================
def _det_infer(ctx):
    s = tuple(ctx.shape(0))
    if len(s) < 2 or s[-1] != s[-2]:
        ctx.fail(f"input 'X' must have shape (*, M, M) (square matrices), got {s}")
    return [TensorMeta(s[:-2], ctx.dtype(0))]


def _det_ref(ins, attrs):
    """Laplace-free: Gaussian elimination with partial pivoting in float64, per matrix."""
    x = ins[0]
    m = x.shape[-1]
    mats = x.astype(np.float64).reshape(-1, m, m)
    out = np.empty(mats.shape[0])
    for k, a in enumerate(mats):
        a = a.copy()
        det = 1.0
        for col in range(m):
            piv = col + int(np.argmax(np.abs(a[col:, col])))
            if a[piv, col] == 0:
                det = 0.0 if not np.isnan(a[col:, col]).any() else np.nan
                break
            if piv != col:
                a[[col, piv]] = a[[piv, col]]
                det = -det
            det *= a[col, col]
            a[col + 1 :] -= np.outer(a[col + 1 :, col] / a[col, col], a[col])
        out[k] = det
    return out.reshape(x.shape[:-2]).astype(x.dtype)


Det = register_op(
    "Det",
    category="matmul",
    inputs=[Input("X", FLOAT)],
    outputs=["Y"],
    infer=_det_infer,
    reference=_det_ref,
    doc="determinant of each square matrix in the last two dims",
)


def _det_kernel(ins, outs, attrs, plan, ws):
    x = ins[0]
    if outs[0].size == 0:
        return
    if x.shape[-1] == 0:
        outs[0][...] = 1
        return
    np.copyto(outs[0], np.linalg.det(x.astype(np.float64)), casting="unsafe")


Det.kernel("det_lapack", dtypes=_F32_64, priority=5, doc="LAPACK LU (numpy.linalg.det) in float64")(_det_kernel)


# == BitCast ===========================================================================================
#: element widths in bits where numpy's itemsize is not the ONNX width (sub-byte types)
_SUB_BYTE = {
    name: bits
    for name, bits in (("int4", 4), ("uint4", 4), ("float4_e2m1fn", 4), ("int2", 2), ("uint2", 2))
    if hasattr(ml_dtypes, name)
}


def _bits(dt: np.dtype) -> int:
    return _SUB_BYTE.get(dt.name, dt.itemsize * 8)


def _bitcast_target(ctx_attrs) -> np.dtype:
    to = ctx_attrs["to"]
    try:
        dt = onnx_dtype(to)
    except DTypeError as exc:
        raise DTypeError(f"BitCast: attribute 'to': {exc}", op="BitCast") from None
    if dt.hasobject or dt.kind in "OUS":
        raise DTypeError("BitCast: cannot bitcast to strings", op="BitCast")
    return dt


def _bitcast_infer(ctx):
    src, dst = ctx.dtype(0), _bitcast_target(ctx.attrs)
    if src.hasobject or src.kind in "OUS":
        raise DTypeError("BitCast: cannot bitcast a string tensor", op="BitCast")
    if _bits(src) != _bits(dst):
        raise DTypeError(
            f"BitCast: input dtype {_dt.name(src)} ({_bits(src)} bits) and 'to' dtype {_dt.name(dst)} "
            f"({_bits(dst)} bits) must have the same bit width",
            op="BitCast",
        )
    return [TensorMeta(tuple(ctx.shape(0)), dst)]


def _bitcast(x: np.ndarray, dst: np.dtype) -> np.ndarray:
    x = np.require(x, requirements="C")  # ascontiguousarray would make a 0-d input 1-d
    if dst == _dt.bool_:
        return x.view(np.uint8) != 0  # any non-zero byte is true (a bool byte must hold 0 or 1)
    if x.dtype.itemsize == 1 and dst.name in _SUB_BYTE:
        mask = (1 << _SUB_BYTE[dst.name]) - 1
        return (x.view(np.uint8) & mask).view(dst)
    return x.view(dst)


BitCast = register_op(
    "BitCast",
    category="elementwise",
    inputs=["input"],
    outputs=["output"],
    attrs=[Attr("to", "int")],
    infer=_bitcast_infer,
    reference=lambda ins, attrs: _bitcast(ins[0], _bitcast_target(attrs)),
    doc="reinterpret the bits of each element as another dtype of the same width",
)
BitCast.kernel("bitcast_view", priority=5, doc="numpy view + copy")(
    lambda ins, outs, attrs, plan, ws: np.copyto(outs[0], _bitcast(ins[0], outs[0].dtype))
)


# == TensorScatter =====================================================================================
def _ts_attrs(attrs, rank: int) -> tuple[int, bool]:
    mode = _text("TensorScatter", "mode", attrs["mode"])
    if mode not in ("linear", "circular"):
        raise ParamInvalidError(
            f"TensorScatter: attribute 'mode' must be 'linear' or 'circular', got {mode!r}", op="TensorScatter"
        )
    axis = _int_attr("TensorScatter", "axis", attrs["axis"])
    if not -rank <= axis < rank or axis % rank == 0:
        raise ParamInvalidError(
            f"TensorScatter: attribute 'axis' must be in [{-rank}, {rank - 1}] and not the batch "
            f"dim 0, got {axis} for a rank-{rank} cache",
            op="TensorScatter",
        )
    return axis % rank, mode == "circular"


def _ts_infer(ctx):
    ps, us = tuple(ctx.shape(0)), tuple(ctx.shape(1))
    if len(ps) < 2:
        ctx.fail(f"input 'past_cache' must have rank >= 2, got shape {ps}")
    axis, _ = _ts_attrs(ctx.attrs, len(ps))
    if ctx.dtype(1) != ctx.dtype(0):
        raise DTypeError(
            f"TensorScatter: 'update' has dtype {_dt.name(ctx.dtype(1))}; expected the dtype of "
            f"'past_cache' ({_dt.name(ctx.dtype(0))})",
            op="TensorScatter",
        )
    if len(us) != len(ps) or any(u != p for i, (u, p) in enumerate(zip(us, ps)) if i != axis) or us[axis] > ps[axis]:
        ctx.fail(
            f"input 'update' {us} must match 'past_cache' {ps} except along axis {axis}, where it may be "
            "at most as long"
        )
    if ctx.has(2) and tuple(ctx.shape(2)) != (ps[0],):
        ctx.fail(f"input 'write_indices' must have shape ({ps[0]},), got {tuple(ctx.shape(2))}")
    return [TensorMeta(ps, ctx.dtype(0))]


def _ts_reference(ins, attrs):
    past, update = ins[0], ins[1]
    wi = ins[2] if len(ins) > 2 and ins[2] is not None else np.zeros(past.shape[0], np.int64)
    axis, circular = _ts_attrs(attrs, past.ndim)
    out = past.copy()
    m, s = past.shape[axis], update.shape[axis]
    for prefix in np.ndindex(*past.shape[:axis]):
        for j in range(s):
            pos = int(wi[prefix[0]]) + j
            if circular:
                pos %= m
            elif not 0 <= pos < m:
                raise ParamInvalidError(
                    f"TensorScatter: write position {pos} is outside the cache (length {m})", op="TensorScatter"
                )
            out[prefix + (pos,)] = update[prefix + (j,)]
    return out


TensorScatter = register_op(
    "TensorScatter",
    category="shape",
    inputs=[Input("past_cache"), Input("update"), Input("write_indices", (I64,), optional=True)],
    outputs=["present_cache"],
    attrs=[Attr("axis", "int", -2), Attr("mode", "string", "linear")],
    infer=_ts_infer,
    reference=_ts_reference,
    doc="write 'update' into a copy of the cache along axis at per-batch write indices (KV-cache update)",
)


def _ts_kernel(ins, outs, attrs, plan, ws):
    axis, circular = plan
    K.tensor_scatter(ins[0], ins[1], ins[2] if len(ins) > 2 else None, outs[0], axis, circular)


TensorScatter.kernel(
    "tensor_scatter_numpy",
    priority=5,
    plan=lambda ctx: _ts_attrs(ctx.attrs, len(ctx.shape(0))),
    doc="copy + one fancy-index write per batch",
)(_ts_kernel)


# == ImageDecoder ======================================================================================
_PIXEL_FORMATS = ("RGB", "BGR", "Grayscale")


def _pillow():
    """PIL.Image, or a typed error: decoding JPEG/PNG/WebP... needs an image codec library."""
    try:
        import PIL.Image
    except ImportError:
        raise KernelNotFoundError(
            "ImageDecoder: decoding images needs the Pillow package (pip install pillow), which is not installed",
            op="ImageDecoder",
        ) from None
    return PIL.Image


def _pixel_format(attrs) -> str:
    fmt = _text("ImageDecoder", "pixel_format", attrs["pixel_format"])
    if fmt not in _PIXEL_FORMATS:
        raise ParamInvalidError(
            f"ImageDecoder: attribute 'pixel_format' must be one of {list(_PIXEL_FORMATS)}, got {fmt!r}",
            op="ImageDecoder",
        )
    return fmt


def _decode_infer(ctx):
    if len(ctx.shape(0)) != 1:
        ctx.fail(f"input 'encoded_stream' must be 1-D bytes, got shape {tuple(ctx.shape(0))}")
    fmt = _pixel_format(ctx.attrs)
    _pillow()
    return [TensorMeta((None, None, 1 if fmt == "Grayscale" else 3), _dt.uint8)]


def _decode_pixels(data: np.ndarray, fmt: str) -> np.ndarray:
    """(H, W, C) uint8 pixels of an encoded image (any format Pillow reads)."""
    import io

    image = _pillow()
    try:
        with image.open(io.BytesIO(np.ascontiguousarray(data).tobytes())) as img:
            img = img.convert("L" if fmt == "Grayscale" else "RGB")
            out = np.asarray(img, dtype=np.uint8)
    except (OSError, ValueError, image.DecompressionBombError) as exc:
        raise ParamInvalidError(
            f"ImageDecoder: cannot decode the {data.size}-byte stream: {exc}", op="ImageDecoder"
        ) from None
    if fmt == "Grayscale":
        return out[:, :, None].copy()
    return np.ascontiguousarray(out[:, :, ::-1]) if fmt == "BGR" else out.copy()


ImageDecoder = register_op(
    "ImageDecoder",
    category="vision",
    inputs=[Input("encoded_stream", (_dt.uint8,))],
    outputs=["image"],
    attrs=[Attr("pixel_format", "string", "RGB")],
    infer=_decode_infer,
    dynamic_shape=True,
    reference=lambda ins, attrs: _decode_pixels(ins[0], _pixel_format(attrs)),
    doc="decode an encoded image (JPEG, PNG, BMP, TIFF, WebP, PNM, JPEG 2000 ... through Pillow) to (H, W, C) uint8",
)
ImageDecoder.kernel("image_decoder_pillow", priority=5, doc="Pillow decode + colour conversion")(
    lambda ins, outs, attrs, plan, ws: [_decode_pixels(ins[0], _pixel_format(attrs))]
)


# == functional entry points =============================================================================
def _pair(fn, name, v, n=2):
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return [int(v)] * n
    try:
        v = [int(i) for i in v]
    except TypeError:
        raise ParamInvalidError(
            f"{fn}: argument {name!r} must be an int or a sequence of {n} ints, got {v!r}"
        ) from None
    if len(v) != n:
        raise ParamInvalidError(f"{fn}: argument {name!r} must have {n} values, got {v}")
    return v


def _col2im_params(op, x_shape, image_shape, block_shape, attrs):
    img, blk = _int_list(image_shape), _int_list(block_shape)
    nd = len(img)
    if len(blk) != nd:
        raise ParamInvalidError(f"{op}: image_shape {img} and block_shape {blk} differ in length", op=op)
    dil = list(attrs["dilations"] or [1] * nd)
    pads = list(attrs["pads"] or [0] * (2 * nd))
    strides = list(attrs["strides"] or [1] * nd)
    if len(dil) != nd or len(strides) != nd or len(pads) != 2 * nd:
        raise ParamInvalidError(f"{op}: dilations/strides need {nd} entries and pads {2 * nd}", op=op)
    if min(strides + dil + blk, default=1) < 1 or min(pads + img, default=0) < 0:  # a 0 stride: ZeroDivisionError
        raise ParamInvalidError(
            f"{op}: strides, dilations and block_shape must be >= 1 and pads, image_shape >= 0, got strides "
            f"{strides}, dilations {dil}, block_shape {blk}, pads {pads}, image_shape {img}",
            op=op,
        )
    if len(x_shape) != 3:
        raise ParamInvalidError(f"{op}: input must be (N, C*prod(block), L), got {tuple(x_shape)}", op=op)
    kk = math.prod(blk)
    if kk == 0 or x_shape[1] % kk:
        raise ParamInvalidError(
            f"{op}: input dim 1 ({x_shape[1]}) is not a multiple of prod(block_shape) = {kk}", op=op
        )
    counts = [(img[i] + pads[i] + pads[i + nd] - (dil[i] * (blk[i] - 1) + 1)) // strides[i] + 1 for i in range(nd)]
    if any(c <= 0 for c in counts) or math.prod(counts) != x_shape[2]:
        raise ParamInvalidError(
            f"{op}: input has L = {x_shape[2]} blocks, the geometry gives {counts} (= {math.prod(counts)})", op=op
        )
    return img, blk, dil, pads, strides, counts


def _col2im_infer(ctx):
    img, blk, *_ = _col2im_params(
        "Col2Im", ctx.shape(0), _host(ctx, 1, "image_shape"), _host(ctx, 2, "block_shape"), ctx.attrs
    )
    s = ctx.shape(0)
    return [TensorMeta((s[0], s[1] // math.prod(blk)) + tuple(img), ctx.dtype(0))]


def _col2im_ref(ins, a):
    x = ins[0]
    img, blk, dil, pads, strides, counts = _col2im_params("Col2Im", x.shape, ins[1], ins[2], a)
    nd = len(img)
    n, ckk, _ = x.shape
    c = ckk // math.prod(blk)
    out = np.zeros((n, c) + tuple(img), np.float64)
    cols = x.reshape((n, c, math.prod(blk), math.prod(counts)))
    for bi, kidx in enumerate(np.ndindex(*blk)):
        for li, lidx in enumerate(np.ndindex(*counts)):
            pos = [lidx[i] * strides[i] + kidx[i] * dil[i] - pads[i] for i in range(nd)]
            if all(0 <= pos[i] < img[i] for i in range(nd)):
                out[(slice(None), slice(None)) + tuple(pos)] += cols[:, :, bi, li]
    return out.astype(x.dtype)


Col2Im = register_op(
    "Col2Im",
    category="vision",
    inputs=[
        Input("input", _dt.NUMERIC),
        Input("image_shape", (_dt.int64,), host=True),
        Input("block_shape", (_dt.int64,), host=True),
    ],
    outputs=["output"],
    attrs=[Attr("dilations", "ints", None), Attr("pads", "ints", None), Attr("strides", "ints", None)],
    infer=_col2im_infer,
    reference=_col2im_ref,
    doc="Rearrange column blocks back into an image (fold).",
)


@Col2Im.kernel("col2im_numpy", priority=5, dtypes=_F32_64)
def _col2im_kernel(ins, outs, attrs, plan, ws):
    img, blk, dil, pads, strides, _ = _col2im_params("Col2Im", ins[0].shape, ins[1], ins[2], attrs)
    KS.col2im(ins[0], img, blk, dil, pads, strides, outs[0])


@api("grid_sample", "GridSample")
def grid_sample(input, grid, mode="bilinear", padding_mode="zeros", align_corners=False):
    """Sample ``input`` (N, C, *spatial) at ``grid`` (N, *out, r) normalised positions, as
    ``torch.nn.functional.grid_sample``: mode "bilinear"/"nearest"/"bicubic" (or the ONNX names)."""
    return [input, grid], {"mode": mode, "padding_mode": padding_mode, "align_corners": int(bool(align_corners))}


@api("grid_sample_grad", "GridSampleGrad", domain="opsnn")
def grid_sample_grad(grad_output, input, grid, mode="bilinear", padding_mode="zeros", align_corners=False):
    """Gradients ``(d input, d grid)`` of :func:`grid_sample` for the output gradient ``grad_output``."""
    attrs = {"mode": mode, "padding_mode": padding_mode, "align_corners": int(bool(align_corners))}
    return [grad_output, input, grid], attrs, 2


@api("deform_conv2d", "DeformConv")
def deform_conv2d(input, offset, weight, bias=None, stride=1, padding=0, dilation=1, mask=None):
    """Deformable 2-D convolution (``torchvision.ops.deform_conv2d``): the groups follow from the
    shapes (group = C / weight.shape[1], offset groups = offset.shape[1] / (2 kh kw))."""
    shape_w, shape_x, shape_o = tuple(weight.shape), tuple(input.shape), tuple(offset.shape)
    if len(shape_w) != 4 or len(shape_x) != 4 or len(shape_o) != 4:
        raise ParamInvalidError(
            f"deform_conv2d: input, offset and weight must be 4-D, got {shape_x}, {shape_o}, {shape_w}"
        )
    kk = shape_w[2] * shape_w[3]
    if shape_w[1] == 0 or shape_x[1] % shape_w[1] or kk == 0 or shape_o[1] % (2 * kk):
        raise ParamInvalidError(
            f"deform_conv2d: cannot derive the groups from input {shape_x}, offset {shape_o} and weight {shape_w}"
        )
    ph, pw = _pair("deform_conv2d", "padding", padding)
    attrs = {
        "strides": _pair("deform_conv2d", "stride", stride),
        "pads": [ph, pw, ph, pw],
        "dilations": _pair("deform_conv2d", "dilation", dilation),
        "group": shape_x[1] // shape_w[1],
        "offset_group": shape_o[1] // (2 * kk),
        "kernel_shape": [shape_w[2], shape_w[3]],
    }
    return [input, weight, offset, bias, mask], attrs


@api("deform_conv2d_backward", "DeformConvGrad", domain="opsnn")
def deform_conv2d_backward(grad_output, input, offset, weight, stride=1, padding=0, dilation=1, mask=None):
    """Gradients ``(d input, d weight, d offset, d mask)`` of :func:`deform_conv2d` (same arguments;
    the bias' gradient is ``grad_output`` summed over N and space). ``d mask`` is the gradient of an
    all-ones mask when ``mask`` is None."""
    ins, attrs = deform_conv2d.translate(input, offset, weight, None, stride, padding, dilation, mask)
    return [grad_output, ins[0], ins[1], ins[2], ins[4]], attrs, 4


@api("non_max_suppression", "NonMaxSuppression")
def non_max_suppression(
    boxes, scores, max_output_boxes_per_class=0, iou_threshold=0.0, score_threshold=None, center_point_box=0
):
    """ONNX NonMaxSuppression: boxes (B, N, 4), scores (B, C, N) -> (k, 3) int64 rows of
    (batch, class, box)."""
    ins = [
        boxes,
        scores,
        np.array([int(max_output_boxes_per_class)], np.int64),
        np.array([float(iou_threshold)], np.float32),
    ]
    if score_threshold is not None:
        ins.append(np.array([float(score_threshold)], np.float32))
    return ins, {"center_point_box": int(center_point_box)}


@api("cumprod", "CumProd")
def cumprod(x, dim, exclusive=False, reverse=False):
    """Cumulative product along ``dim``; ``exclusive`` starts from 1, ``reverse`` runs backwards."""
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
        raise ParamInvalidError(f"cumprod: dim must be an int, got {dim!r}")
    return [x, np.asarray(dim, dtype=np.int64)], {"exclusive": int(bool(exclusive)), "reverse": int(bool(reverse))}


@api("det", "Det")
def det(x):
    """Determinant of each (M, M) matrix in the last two dims."""
    return [x], {}


@api("bitcast", "BitCast")
def bitcast(x, dtype):
    """Reinterpret the bits of ``x`` as ``dtype`` (same bit width), like ``torch.Tensor.view(dtype)``."""
    return [x], {"to": onnx_enum(dtype)}


@api("decode_image", "ImageDecoder")
def decode_image(data, pixel_format="RGB"):
    """Decode the encoded image bytes ``data`` (1-D uint8) to (H, W, C) uint8 pixels."""
    return [data], {"pixel_format": pixel_format}


@api("tensor_scatter", "TensorScatter")
def tensor_scatter(past_cache, update, write_indices=None, mode="linear", axis=-2):
    """A copy of ``past_cache`` with ``update`` written at ``write_indices`` along ``axis``."""
    return [past_cache, update, write_indices], {"mode": mode, "axis": int(axis)}


@api("col2im", "Col2Im")
def col2im(x, image_shape, block_shape, dilations=None, pads=None, strides=None):
    """ONNX Col2Im (torch.nn.functional.fold with ONNX-style pads [begins..., ends...])."""
    return [x, _i64(image_shape), _i64(block_shape)], {"dilations": dilations, "pads": pads, "strides": strides}


__all__ = [
    "grid_sample",
    "grid_sample_grad",
    "deform_conv2d",
    "deform_conv2d_backward",
    "non_max_suppression",
    "cumprod",
    "det",
    "bitcast",
    "tensor_scatter",
    "decode_image",
    "col2im",
]
