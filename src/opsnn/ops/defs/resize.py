"""Resize ops: Resize (every ONNX mode and coordinate transformation) and FusedResize (the
graph engine's Resize(Cast(view(S))) in one pass) — records, kernels and functional entry
points (``resize``, and torch's ``interpolate`` translated to Resize).

Sampling tables are built at prepare time by :class:`ResizeSpec`; nearest runs as one
index-map gather, linear and cubic as one numba resampling pass per resized axis::

    >>> import opsnn, numpy as np
    >>> x = opsnn.tensor(np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2))
    >>> opsnn.ops.interpolate(x, scale_factor=2).shape
    (1, 1, 4, 4)
"""

from __future__ import annotations

import math

import numpy as np

from ... import dtypes as _dt
from ...errors import DTypeError, ParamInvalidError
from ...kernels.cpu import shape as K
from ...tensor import Tensor
from ..api import api
from ..registry import Attr, Input, TensorMeta, register_op
from .elementwise import onnx_dtype
from .shape import _axis, _host, _i64, _ints, _pod, _shape_of, _str

_F32_64 = (_dt.float32, _dt.float64)


# ---------------------------------------------------------------------------------------------
# Resize
# ---------------------------------------------------------------------------------------------
RESIZE_MODES = ("nearest", "linear", "cubic")
COORD_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
)
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


class ResizeSpec:
    """Output shape and per-axis sampling tables of one Resize (pure function of shapes/attrs)."""

    def __init__(self, in_shape, attrs, roi, scales, sizes):
        op = "Resize"
        self.mode = _str(attrs["mode"])
        self.ctm = _str(attrs["coordinate_transformation_mode"])
        self.nearest_mode = _str(attrs["nearest_mode"])
        self.policy = _str(attrs["keep_aspect_ratio_policy"])
        for v, allowed, name in (
            (self.mode, RESIZE_MODES, "mode"),
            (self.ctm, COORD_MODES, "coordinate_transformation_mode"),
            (self.nearest_mode, NEAREST_MODES, "nearest_mode"),
            (self.policy, ("stretch", "not_larger", "not_smaller"), "keep_aspect_ratio_policy"),
        ):
            if v not in allowed:
                raise ParamInvalidError(f"{op}: {name} must be one of {allowed}, got {v!r}", op=op)
        self.a = float(attrs["cubic_coeff_a"])
        self.exclude = bool(attrs["exclude_outside"])
        self.antialias = bool(attrs["antialias"]) and self.mode != "nearest"
        self.extrap = float(attrs["extrapolation_value"])
        r = len(in_shape)
        axes = list(range(r)) if attrs["axes"] is None else [_axis(op, a, r, "axes entry") for a in attrs["axes"]]
        if len(set(axes)) != len(axes):
            raise ParamInvalidError(f"{op}: repeated axes {axes}", op=op)
        scales = (
            None
            if scales is None or np.asarray(scales).size == 0
            else [float(v) for v in np.asarray(scales).reshape(-1)]
        )
        sizes = None if sizes is None or np.asarray(sizes).size == 0 else _ints(sizes)
        if (scales is None) == (sizes is None):
            raise ParamInvalidError(f"{op}: exactly one of 'scales' and 'sizes' must be given", op=op)
        given = scales if scales is not None else sizes
        if len(given) != len(axes):
            raise ParamInvalidError(
                f"{op}: {'scales' if scales is not None else 'sizes'} has {len(given)} entries "
                f"for {len(axes)} axes (input rank {r})",
                op=op,
            )
        full_scale = [1.0] * r
        out = list(in_shape)
        if scales is not None:
            if any(not (s > 0) for s in scales):
                raise ParamInvalidError(f"{op}: scales must be > 0, got {scales}", op=op)
            for a, s in zip(axes, scales):
                full_scale[a] = s
                out[a] = int(math.floor(s * in_shape[a]))
        else:
            if any(s < 0 for s in sizes):
                raise ParamInvalidError(f"{op}: sizes must be >= 0, got {sizes}", op=op)
            if any(in_shape[a] == 0 for a in axes):
                raise ParamInvalidError(f"{op}: cannot resize an empty axis to a size", op=op)
            ratios = [sz / in_shape[a] for a, sz in zip(axes, sizes)]
            if self.policy == "stretch":
                for a, sz, q in zip(axes, sizes, ratios):
                    full_scale[a], out[a] = q, sz
            else:
                q = min(ratios) if self.policy == "not_larger" else max(ratios)
                for a in axes:
                    full_scale[a] = q
                    out[a] = int(q * in_shape[a] + 0.5)
        self.in_shape = tuple(in_shape)
        self.out_shape = tuple(out)
        self.scales = full_scale
        full_roi = [0.0] * r + [1.0] * r
        if self.ctm == "tf_crop_and_resize":
            if roi is None or np.asarray(roi).size == 0:
                raise ParamInvalidError(f"{op}: coordinate_transformation_mode tf_crop_and_resize needs 'roi'", op=op)
            rv = [float(v) for v in np.asarray(roi).reshape(-1)]
            if len(rv) != 2 * len(axes):
                raise ParamInvalidError(f"{op}: roi has {len(rv)} entries, expected {2 * len(axes)}", op=op)
            for i, a in enumerate(axes):
                full_roi[a], full_roi[r + a] = rv[i], rv[len(axes) + i]
        self.roi = full_roi
        self.axes = [
            a
            for a in sorted(axes)
            if not (
                math.isclose(full_scale[a], 1.0)
                and out[a] == in_shape[a]
                and math.isclose(full_roi[a], 0.0)
                and math.isclose(full_roi[r + a], 1.0)
            )
        ]

    # -- per-axis tables ------------------------------------------------------------------------
    def source_coords(self, a: int):
        n_in, n_out, s = self.in_shape[a], self.out_shape[a], self.scales[a]
        y = np.arange(n_out, dtype=np.float64)
        length = s * n_in  # the (fractional) resized length the coordinate formulas use
        extrap = None
        m = self.ctm
        if m == "align_corners":
            x = np.zeros(n_out) if length == 1 else y * (n_in - 1) / (length - 1)
        elif m == "asymmetric":
            x = y / s
        elif m == "pytorch_half_pixel":
            x = np.full(n_out, -0.5) if length == 1 else (y + 0.5) / s - 0.5
        elif m == "half_pixel":
            x = (y + 0.5) / s - 0.5
        elif m == "half_pixel_symmetric":
            adj = n_out / length
            x = (n_in / 2) * (1 - adj) + (y + 0.5) / s - 0.5
        else:
            r = len(self.in_shape)
            lo, hi = self.roi[a], self.roi[r + a]
            x = np.full(n_out, (hi - lo) * (n_in - 1) / 2) if length == 1 else y * (hi - lo) * (n_in - 1) / (length - 1)
            x = x + lo * (n_in - 1)
            extrap = (x < 0) | (x > n_in - 1)
        return x, extrap

    def _weights(self, ratio: np.ndarray, s: float) -> np.ndarray:
        """Filter taps for fractional offsets ``ratio`` in (0, 1] (one row per output position)."""
        r = ratio[:, None]
        if self.mode == "nearest":
            whole = ratio == 1.0
            nm = self.nearest_mode
            right = {
                "round_prefer_floor": ratio > 0.5,
                "round_prefer_ceil": ratio >= 0.5,
                "floor": np.zeros_like(whole),
                "ceil": np.ones_like(whole),
            }[nm] | whole
            return np.stack([~right, right], axis=1).astype(np.float64)
        if not self.antialias or s >= 1:
            if self.mode == "linear":
                return np.concatenate([1 - r, r], axis=1)
            A = self.a
            t = np.concatenate([r + 1, r, 1 - r, 2 - r], axis=1)
            return self._cubic(t, A)
        start = int(math.floor((-1 if self.mode == "linear" else -2) / s) + 1)
        taps = 2 - 2 * start
        d = (np.arange(start, start + taps)[None, :] - r) * s
        w = np.clip(1 - np.abs(d), 0, 1) if self.mode == "linear" else self._cubic(d, self.a)
        return w / w.sum(axis=1, keepdims=True)

    @staticmethod
    def _cubic(t, A):
        t = np.abs(t)
        t2, t3 = t * t, t * t * t
        near = (A + 2) * t3 - (A + 3) * t2 + 1
        far = A * t3 - 5 * A * t2 + 8 * A * t - 4 * A
        return np.where(t <= 1, near, np.where(t < 2, far, 0.0))

    def table(self, a: int):
        """(source indices [n_out, taps], weights [n_out, taps], extrapolated mask or None) for axis a."""
        n_in = self.in_shape[a]
        x, extrap = self.source_coords(a)
        base = np.floor(x)
        ratio = np.where(x == base, 1.0, x - base)
        w = self._weights(ratio, self.scales[a])
        taps = w.shape[1]
        # the taps window: the `taps` integer positions nearest x, ties to the lower position
        half = taps // 2
        if taps % 2 == 0:
            first = np.where(x == base, base - half, base - half + 1)
        else:
            frac = x - base
            first = np.where(frac <= 0.5, base - (taps - 1) // 2, base - (taps - 1) // 2 + 1)
        idx = first.astype(np.int64)[:, None] + np.arange(taps)[None, :]
        if self.exclude:
            w = np.where((idx < 0) | (idx >= n_in), 0.0, w)
            tot = w.sum(axis=1, keepdims=True)
            w = w / np.where(tot == 0, 1.0, tot)
        return np.clip(idx, 0, max(n_in - 1, 0)), w, extrap

    def nearest_maps(self):
        maps = [np.arange(d, dtype=np.int64) for d in self.in_shape]
        for a in self.axes:
            idx, w, extrap = self.table(a)
            m = idx[np.arange(idx.shape[0]), np.argmax(w, axis=1)]
            if extrap is not None:
                m = np.where(extrap, -1, m)
            maps[a] = m
        return maps


def _resize_spec(shape, attrs, roi, scales, sizes):
    return ResizeSpec(shape, attrs, roi, scales, sizes)


def _resize_ctx_spec(ctx):
    return _resize_spec(ctx.shape(0), ctx.attrs, _host(ctx, 1, "roi"), _host(ctx, 2, "scales"), _host(ctx, 3, "sizes"))


def _resize_infer(ctx):
    spec = _resize_ctx_spec(ctx)
    if spec.mode != "nearest" and ctx.dtype(0) == _dt.bool_:
        raise DTypeError(f"Resize: mode {spec.mode} needs numeric input, got bool", op="Resize")
    return [TensorMeta(spec.out_shape, ctx.dtype(0))]


def _resize_ref(ins, a):
    x = ins[0]
    get = lambda i: ins[i] if len(ins) > i else None
    spec = _resize_spec(x.shape, a, get(1), get(2), get(3))
    res = x.astype(np.float64)
    for ax in spec.axes:
        idx, w, extrap = spec.table(ax)
        taken = np.take(res, idx, axis=ax)  # [..., n_out, taps, ...]
        wshape = [1] * taken.ndim
        wshape[ax], wshape[ax + 1] = w.shape
        w = w.reshape(wshape)
        if spec.mode == "nearest":  # a copy of one tap: the others (weight 0) must not make 0 * Inf = NaN
            taken = np.where(w != 0, taken, 0.0)
        with np.errstate(invalid="ignore"):  # 0 * Inf = NaN is the answer (see the record's doc)
            res = (taken * w).sum(axis=ax + 1)
        if extrap is not None:
            mshape = [1] * res.ndim
            mshape[ax] = extrap.size
            res = np.where(extrap.reshape(mshape), spec.extrap, res)
    return _cast_like(res, x.dtype)


def _cast_like(res, dt):
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return np.clip(np.round(res), info.min, info.max).astype(dt)
    if dt == np.bool_:
        return res != 0
    return res.astype(dt)


Resize = register_op(
    "Resize",
    category="vision",
    inputs=[
        Input("X"),
        Input("roi", _dt.FLOATS, optional=True, host=True),
        Input("scales", (_dt.float32,), optional=True, host=True),
        Input("sizes", (_dt.int64,), optional=True, host=True),
    ],
    outputs=["Y"],
    attrs=[
        Attr("antialias", "int", 0),
        Attr("axes", "ints", None),
        Attr("coordinate_transformation_mode", "string", "half_pixel"),
        Attr("cubic_coeff_a", "float", -0.75),
        Attr("exclude_outside", "int", 0),
        Attr("extrapolation_value", "float", 0.0),
        Attr("keep_aspect_ratio_policy", "string", "stretch"),
        Attr("mode", "string", "nearest"),
        Attr("nearest_mode", "string", "round_prefer_floor"),
    ],
    infer=_resize_infer,
    reference=_resize_ref,
    doc="Resize by scales or to sizes: nearest, (bi/tri)linear or cubic, every ONNX coordinate mode, antialias. "
    "Linear and cubic sum every tap of their window, zero weights included, so an Inf beside a sample "
    "gives NaN (0 * Inf), as onnx.reference and onnxruntime do (onnxruntime's windows differ at integer "
    "coordinates and at the edges, so there its NaNs can fall "
    "elsewhere); nearest copies its one input.",
)


def _resize_nearest_plan(ctx):
    spec = _resize_ctx_spec(ctx)
    return K.plan_maps(ctx.shape(0), spec.nearest_maps(), ctx.dtype(0).itemsize), spec.extrap


@Resize.kernel(
    "resize_nearest",
    priority=10,
    plan=_resize_nearest_plan,
    applies=lambda ctx: _pod(ctx) if _str(ctx.attrs["mode"]) == "nearest" else "mode is not nearest",
    doc="one index-map gather over all resized axes",
)
def _resize_nearest(ins, outs, attrs, plan, ws):
    maps, extrap = plan
    K.run_maps(maps, ins[0], outs[0], np.asarray(extrap).astype(outs[0].dtype))


def _resize_sep_plan(ctx):
    spec = _resize_ctx_spec(ctx)
    dt = np.float64 if ctx.dtype(0) == _dt.float64 else np.float32
    steps, shape = [], list(spec.in_shape)
    for a in spec.axes:
        idx, w, extrap = spec.table(a)
        outer, inner = math.prod(shape[:a]), math.prod(shape[a + 1 :])
        n_in = shape[a]
        shape[a] = spec.out_shape[a]
        steps.append(
            (
                outer,
                n_in,
                inner,
                np.ascontiguousarray(idx),
                np.ascontiguousarray(w, dtype=dt),
                None if extrap is None or not extrap.any() else extrap,
                tuple(shape),
            )
        )
    return steps, spec.extrap


@Resize.kernel(
    "resize_separable",
    priority=10,
    dtypes=_F32_64,
    plan=_resize_sep_plan,
    applies=lambda ctx: None if _str(ctx.attrs["mode"]) != "nearest" else "mode is nearest",
    doc="one resampling pass per resized axis (numba, parallel over output rows)",
)
def _resize_separable(ins, outs, attrs, plan, ws):
    steps, extrap = plan
    cur = ins[0]
    if not steps:
        np.copyto(outs[0], cur)
        return
    for i, (outer, n_in, inner, idx, w, mask, shape) in enumerate(steps):
        dst = outs[0] if i == len(steps) - 1 else np.empty(shape, outs[0].dtype)
        if dst.size:
            K.resample_axis(cur.reshape(-1), dst.reshape(-1), outer, n_in, inner, idx, w)
            if mask is not None:
                dst.reshape(outer, -1, inner)[:, mask, :] = extrap
        cur = dst


# ---------------------------------------------------------------------------------------------
# FusedResize: Resize(Cast(view(S))) in one pass, from the graph engine's resize_prologue_fusion
# ---------------------------------------------------------------------------------------------
#: the source dtypes FusedResize reads (numba converts each element as it sums)
_FUSED_RESIZE_SRC = (
    np.dtype(np.uint8),
    np.dtype(np.int8),
    np.dtype(np.uint16),
    np.dtype(np.int16),
    np.dtype(np.int32),
    np.dtype(np.int64),
    np.dtype(np.float32),
    np.dtype(np.float64),
)
#: output rows x taps from which the fused resize runs parallel (decided at prepare)
FUSED_RESIZE_PARALLEL_MIN = 1 << 15


def _fused_view(ctx) -> list:
    """``view``: for each axis of the resized tensor X, the axis of S it reads, or -1 for an
    inserted unit axis (a permutation of S's axes plus -1s)."""
    view = _ints(ctx.attrs["view"])
    if sorted(v for v in view if v >= 0) != list(range(len(ctx.shape(0)))) or any(v < -1 for v in view):
        ctx.fail(
            f"attribute 'view' must list each of the source's {len(ctx.shape(0))} axes once (and -1 for "
            f"inserted unit axes), got {view}"
        )
    return view


def _fused_resize_spec(ctx):
    view = _fused_view(ctx)
    shape = tuple(1 if v < 0 else ctx.shape(0)[v] for v in view)
    return _resize_spec(shape, ctx.attrs, _host(ctx, 1, "roi"), _host(ctx, 2, "scales"), _host(ctx, 3, "sizes")), view


def _fused_resize_infer(ctx):
    to = np.dtype(onnx_dtype(ctx.attrs["to"]))
    if to not in (np.float32, np.float64):
        raise DTypeError(f"FusedResize: attribute 'to' must be float32 or float64, got {to}", op="FusedResize")
    spec, _ = _fused_resize_spec(ctx)
    if spec.mode == "nearest":
        ctx.fail("mode 'nearest' is not fused (Resize moves the source's values as they are)")
    return [TensorMeta(spec.out_shape, to)]


def _fused_resize_ref(ins, a):
    view = [int(v) for v in a["view"]]
    x = np.transpose(ins[0], [v for v in view if v >= 0]).reshape([1 if v < 0 else ins[0].shape[v] for v in view])
    to = np.dtype(onnx_dtype(a["to"]))
    attrs = {k: v for k, v in a.items() if k not in ("to", "view")}
    return _resize_ref([x.astype(to)] + list(ins[1:]), attrs)


FusedResize = register_op(
    "FusedResize",
    domain="opsnn",
    category="vision",
    inputs=[
        Input("X", tuple(_FUSED_RESIZE_SRC)),
        Input("roi", _dt.FLOATS, optional=True, host=True),
        Input("scales", (_dt.float32,), optional=True, host=True),
        Input("sizes", (_dt.int64,), optional=True, host=True),
    ],
    outputs=["Y"],
    attrs=list(Resize.attrs) + [Attr("to", "int"), Attr("view", "ints")],
    infer=_fused_resize_infer,
    reference=_fused_resize_ref,
    doc="Resize(Cast(X', to)) where X' is X transposed and unsqueezed by 'view' (the resized tensor's axis "
    "i is X's axis view[i], -1 a new unit axis): an image's uint8 HWC pixels resized straight to a "
    "float NCHW tensor, without the transposed and widened copies",
)


def _fused_resize_tables(spec, a: int):
    """(source indices, weights, extrapolated mask or None) of the resized tensor's axis ``a``
    (2 or 3; an axis left as it is reads each position with weight 1)."""
    if a in spec.axes:
        return spec.table(a)
    return np.arange(spec.in_shape[a])[:, None], np.ones((spec.in_shape[a], 1)), None


def _fused_resize_applies(ctx):
    spec, view = _fused_resize_spec(ctx)
    if len(view) != 4 or any(a not in (2, 3) for a in spec.axes):
        return "4-D, resizing only the last two axes"
    if any(m is not None and m.any() for m in (_fused_resize_tables(spec, a)[2] for a in spec.axes)):
        return "tf_crop_and_resize positions outside the input (extrapolated) are not fused"
    return None


def _fused_resize_plan(ctx):
    spec, view = _fused_resize_spec(ctx)
    src_strides = [int(math.prod(ctx.shape(0)[k + 1 :])) for k in range(len(ctx.shape(0)))]
    strides = tuple(0 if v < 0 else src_strides[v] for v in view)
    tables = []
    for a in (2, 3):
        idx, w, _ = _fused_resize_tables(spec, a)
        tables += [np.ascontiguousarray(idx, dtype=np.int64), np.ascontiguousarray(w, dtype=np.float64)]
    rows = int(math.prod(spec.out_shape[:3]))
    work = rows * spec.out_shape[3] * tables[1].shape[1] * tables[3].shape[1]
    return strides, int(spec.in_shape[1]), tables, work >= FUSED_RESIZE_PARALLEL_MIN


@FusedResize.kernel(
    "fused_resize_2d",
    priority=10,
    dtypes=_FUSED_RESIZE_SRC,
    plan=_fused_resize_plan,
    applies=_fused_resize_applies,
    doc="one numba pass over the output: each value sums its taps (2x2 linear, 4x4 cubic, wider "
    "with antialias) read through the view's strides and converted as read; float64 sums",
)
def _fused_resize(ins, outs, attrs, plan, ws):
    strides, n_c, (hi, hw_, wi, ww), parallel = plan
    K.resize2d_view(np.ascontiguousarray(ins[0]).reshape(-1), strides, n_c, hi, hw_, wi, ww, outs[0], parallel)


@api("resize", "Resize")
def resize(
    x,
    scales=None,
    sizes=None,
    mode="nearest",
    coordinate_transformation_mode="half_pixel",
    nearest_mode="round_prefer_floor",
    cubic_coeff_a=-0.75,
    antialias=False,
    axes=None,
    roi=None,
    exclude_outside=False,
    extrapolation_value=0.0,
    keep_aspect_ratio_policy="stretch",
):
    """ONNX Resize with keyword arguments (``scales`` or ``sizes``, per axis in ``axes`` or all dims)."""
    return [
        x,
        None if roi is None else Tensor(np.asarray(roi, np.float32)),
        None if scales is None else Tensor(np.asarray(scales, np.float32)),
        None if sizes is None else _i64(sizes),
    ], {
        "mode": mode,
        "coordinate_transformation_mode": coordinate_transformation_mode,
        "nearest_mode": nearest_mode,
        "cubic_coeff_a": float(cubic_coeff_a),
        "antialias": int(bool(antialias)),
        "axes": None if axes is None else [int(a) for a in axes],
        "exclude_outside": int(bool(exclude_outside)),
        "extrapolation_value": float(extrapolation_value),
        "keep_aspect_ratio_policy": keep_aspect_ratio_policy,
    }


_TORCH_INTERP = {
    "nearest": "nearest",
    "nearest-exact": "nearest",
    "linear": "linear",
    "bilinear": "linear",
    "trilinear": "linear",
    "bicubic": "cubic",
}


@api("interpolate", "Resize")
def interpolate(
    x, size=None, scale_factor=None, mode="nearest", align_corners=None, recompute_scale_factor=None, antialias=False
):
    """torch.nn.functional.interpolate over the spatial dims (all dims after N, C); ``recompute_scale_factor``
    maps through the output size floor(input size x scale) instead of the scale, as torch."""
    s = _shape_of(x)
    nsp = len(s) - 2
    if nsp < 1:
        raise ParamInvalidError(f"interpolate: input must be (N, C, ...spatial), got shape {s}", op="Resize")
    m = _TORCH_INTERP.get(mode)
    if m is None:
        raise ParamInvalidError(f"interpolate: mode must be one of {sorted(_TORCH_INTERP)}, got {mode!r}", op="Resize")
    if (size is None) == (scale_factor is None):
        raise ParamInvalidError("interpolate: give exactly one of size and scale_factor", op="Resize")
    axes = list(range(2, len(s)))
    sizes = scales = None
    if size is not None:
        sizes = [int(size)] * nsp if isinstance(size, (int, np.integer)) else [int(v) for v in size]
    else:
        scales = (
            [float(scale_factor)] * nsp if isinstance(scale_factor, (int, float)) else [float(v) for v in scale_factor]
        )
    if recompute_scale_factor:
        if size is not None:
            raise ParamInvalidError(
                "interpolate: recompute_scale_factor goes with scale_factor, not with an explicit size", op="Resize"
            )
        sizes, scales = [int(math.floor(d * f)) for d, f in zip(s[2:], scales)], None
    if m == "nearest":
        ctm, nm = ("asymmetric", "floor") if mode == "nearest" else ("half_pixel", "round_prefer_ceil")
    else:
        nm = "round_prefer_floor"
        ctm = "align_corners" if align_corners else "pytorch_half_pixel"
    return resize.translate(
        x,
        scales=scales,
        sizes=sizes,
        mode=m,
        coordinate_transformation_mode=ctm,
        nearest_mode=nm,
        antialias=antialias,
        axes=axes,
        cubic_coeff_a=-0.75,
    )


__all__ = ["resize", "interpolate"]
