"""Pooling ops: MaxPool, AveragePool, LpPool, the global and adaptive pools, MaxUnpool,
RoiAlign and MaxRoiPool — records, CPU kernels and functional entry points.

Records follow the latest ONNX opset (``kernel_shape``, ``strides``, ``pads``, ``dilations``,
``auto_pad``, ``ceil_mode``, ``storage_order``...); the entry points take torch-style
arguments::

    >>> import opsnn, numpy as np
    >>> x = opsnn.tensor(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
    >>> opsnn.ops.max_pool2d(x, 2).numpy()[0, 0]
    array([[ 5.,  7.],
           [13., 15.]], dtype=float32)

MaxPool propagates NaN (as torch does): a window holding a NaN gives NaN, and its index
is that of the window's first NaN. Indices follow ONNX: flattened over the whole input
tensor (``n*C*H*W + c*H*W + h*W + w``; ``storage_order=1`` flattens the spatial dims
column-major); ``idx % (H*W)`` gives torch's per-plane index.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import numpy as np

from ... import dtypes as _dt
from ...errors import InferShapeError, ParamInvalidError
from ...kernels.cpu import bf16_pool as KBF
from ...kernels.cpu import pool as K
from ...kernels.cpu import pool_backward as KB
from ...runtime.memory import check_request
from ...tensor import Tensor, as_tensor
from ..api import api
from ..registry import Attr, Input, Output, TensorMeta, register_op

FLOAT = _dt.FLOATS
_F32_64 = (_dt.float32, _dt.float64)
_AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def _str(v) -> str:
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)


# -- geometry ------------------------------------------------------------------------------------


class PoolGeometry(NamedTuple):
    """Resolved window geometry of a pooling op over the spatial dims."""

    kernel: tuple
    strides: tuple
    dilations: tuple
    pads_begin: tuple
    pads_end: tuple
    out: tuple


def _attr_ints(op: str, attrs: dict, name: str, n: int, default: int, minimum: int) -> tuple:
    v = attrs.get(name)
    if v is None or len(v) == 0:
        return (default,) * n
    v = tuple(int(a) for a in v)
    if len(v) != n:
        raise ParamInvalidError(
            f"{op}: attribute {name!r} needs {n} values (one per spatial dim), got {list(v)}", op=op
        )
    if any(a < minimum for a in v):
        raise ParamInvalidError(f"{op}: attribute {name!r} must be >= {minimum}, got {list(v)}", op=op)
    return v


def pool_geometry(op: str, x_shape: tuple, attrs: dict, *, dilations: bool = True) -> PoolGeometry:
    """Validate the pooling attributes against ``x_shape`` (N, C, spatial...) and compute
    kernel, strides, dilations, begin/end pads and output spatial dims (ONNX rules; in
    ceil mode a window that would start in the end padding is dropped, as in torch)."""
    n = len(x_shape) - 2
    if n < 1:
        raise InferShapeError(
            f"{op}: input X must be (N, C, spatial...) with at least 3 dims, got shape {tuple(x_shape)}", op=op
        )
    kernel = attrs.get("kernel_shape")
    if kernel is None or len(kernel) != n:
        raise ParamInvalidError(
            f"{op}: attribute 'kernel_shape' needs {n} values for a {len(x_shape)}-D input, "
            f"got {None if kernel is None else list(kernel)}",
            op=op,
        )
    kernel = tuple(int(k) for k in kernel)
    if any(k < 1 for k in kernel):
        raise ParamInvalidError(f"{op}: attribute 'kernel_shape' must be positive, got {list(kernel)}", op=op)
    strides = _attr_ints(op, attrs, "strides", n, 1, 1)
    dil = _attr_ints(op, attrs, "dilations", n, 1, 1) if dilations else (1,) * n
    auto_pad = _str(attrs.get("auto_pad", "NOTSET") or "NOTSET").upper()
    if auto_pad not in _AUTO_PADS:
        raise ParamInvalidError(f"{op}: attribute 'auto_pad' must be one of {_AUTO_PADS}, got {auto_pad!r}", op=op)
    ceil_mode = int(attrs.get("ceil_mode", 0) or 0)
    if ceil_mode not in (0, 1):
        raise ParamInvalidError(f"{op}: attribute 'ceil_mode' must be 0 or 1, got {ceil_mode}", op=op)
    spatial = tuple(x_shape[2:])
    ek = tuple((k - 1) * d + 1 for k, d in zip(kernel, dil))
    if auto_pad == "NOTSET":
        pads = _attr_ints(op, attrs, "pads", 2 * n, 0, 0)
        pb, pe = pads[:n], pads[n:]
        out = []
        for i in range(n):
            num = spatial[i] + pb[i] + pe[i] - ek[i]
            if ceil_mode:
                o = -(-num // strides[i]) + 1
                if (o - 1) * strides[i] >= spatial[i] + pb[i]:
                    o -= 1  # the last window would start in the end padding
            else:
                o = num // strides[i] + 1
            out.append(o)
    elif auto_pad == "VALID":
        pb = pe = (0,) * n
        out = [(spatial[i] - ek[i]) // strides[i] + 1 for i in range(n)]
    else:
        out, pb, pe = [], [], []
        for i in range(n):
            o = -(-spatial[i] // strides[i])
            total = max((o - 1) * strides[i] + ek[i] - spatial[i], 0)
            small, big = total // 2, total - total // 2
            pb.append(small if auto_pad == "SAME_UPPER" else big)
            pe.append(big if auto_pad == "SAME_UPPER" else small)
            out.append(o)
        pb, pe = tuple(pb), tuple(pe)
    for i, o in enumerate(out):
        if isinstance(o, int) and o < 1:
            raise InferShapeError(
                f"{op}: the window (kernel {kernel[i]}, dilation {dil[i]}: effective size {ek[i]}) is larger than the "
                f"padded input along spatial dim {i} (size {spatial[i]} + pads {pb[i]}+{pe[i]}); output size would "
                f"be {o}",
                op=op,
            )
    return PoolGeometry(kernel, strides, dil, tuple(pb), tuple(pe), tuple(out))


def _check_rank(ctx, minimum: int = 3):
    shape = ctx.shape(0)
    if len(shape) < minimum:
        ctx.fail(f"input X must be (N, C, spatial...) with at least {minimum} dims, got shape {tuple(shape)}")
    return shape


# -- the numpy references: windows enumerated explicitly, one output position at a time -------------


def _windows(spatial: tuple, g: PoolGeometry):
    """Yield (output position, per-dim valid input coords, taps inside the padded extent)."""
    per_dim = []
    for i, n in enumerate(spatial):
        rows = []
        for o in range(g.out[i]):
            taps = o * g.strides[i] - g.pads_begin[i] + g.dilations[i] * np.arange(g.kernel[i])
            rows.append((taps[(taps >= 0) & (taps < n)], int(np.sum(taps < n + g.pads_end[i]))))
        per_dim.append(rows)
    for pos in itertools.product(*[range(o) for o in g.out]):
        picks = [per_dim[i][p] for i, p in enumerate(pos)]
        yield pos, [p[0] for p in picks], math.prod(p[1] for p in picks)


def _window_values(x: np.ndarray, valid: list) -> np.ndarray:
    return x[(slice(None), slice(None)) + np.ix_(*valid)].reshape(x.shape[0], x.shape[1], -1)


def _max_pool_reference(ins, attrs):
    x = ins[0]
    g = pool_geometry("MaxPool", x.shape, attrs)
    N, C, spatial = x.shape[0], x.shape[1], x.shape[2:]
    y = np.empty((N, C) + g.out, x.dtype)
    ind = np.empty((N, C) + g.out, np.int64)
    n = len(spatial)
    if int(attrs.get("storage_order", 0)) == 1:
        mult = [math.prod(spatial[:i]) for i in range(n)]
    else:
        mult = [math.prod(spatial[i + 1 :]) for i in range(n)]
    plane = np.arange(N * C, dtype=np.int64).reshape(N, C) * math.prod(spatial)
    lowest = -np.inf if x.dtype.kind == "f" or _dt.is_float(x.dtype) else np.iinfo(x.dtype).min
    for pos, valid, _ in _windows(spatial, g):
        at = (slice(None), slice(None)) + pos
        if any(len(v) == 0 for v in valid):
            y[at], ind[at] = lowest, -1
            continue
        vals = _window_values(x, valid)
        best = np.argmax(vals.astype(np.float64), axis=2)  # first maximum; NaN wins (first NaN)
        y[at] = np.take_along_axis(vals, best[..., None], 2)[..., 0]
        coords = np.unravel_index(best, [len(v) for v in valid])
        ind[at] = plane + sum(valid[i][coords[i]] * mult[i] for i in range(n))
    return y, ind


def _avg_pool_reference(ins, attrs):
    x = ins[0]
    g = pool_geometry("AveragePool", x.shape, attrs)
    include = int(attrs.get("count_include_pad", 0)) == 1
    y = np.empty(x.shape[:2] + g.out, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        for pos, valid, padded_count in _windows(x.shape[2:], g):
            vals = _window_values(x, valid).astype(np.float64)
            count = padded_count if include else math.prod(len(v) for v in valid)
            y[(slice(None), slice(None)) + pos] = vals.sum(axis=2) / np.float64(count)
    return y.astype(x.dtype)


def _lp_pool_reference(ins, attrs):
    x = ins[0]
    g = pool_geometry("LpPool", x.shape, attrs)
    p = float(attrs["p"])
    y = np.empty(x.shape[:2] + g.out, np.float64)
    for pos, valid, _ in _windows(x.shape[2:], g):
        vals = np.abs(_window_values(x, valid).astype(np.float64))
        y[(slice(None), slice(None)) + pos] = np.sum(vals**p, axis=2) ** (1.0 / p)
    return y.astype(x.dtype)


# -- MaxPool / AveragePool / LpPool records -------------------------------------------------------------


def _pool_attrs(extra=()):
    return [
        Attr("auto_pad", "string", "NOTSET"),
        Attr("ceil_mode", "int", 0),
        Attr("dilations", "ints", None),
        Attr("kernel_shape", "ints"),
        Attr("pads", "ints", None),
        Attr("strides", "ints", None),
        *extra,
    ]


def _infer_max_pool(ctx):
    shape = _check_rank(ctx)
    g = pool_geometry("MaxPool", shape, ctx.attrs)
    if int(ctx.attrs["storage_order"]) not in (0, 1):
        raise ParamInvalidError(
            f"MaxPool: attribute 'storage_order' must be 0 (row major) or 1 (column major), "
            f"got {ctx.attrs['storage_order']}",
            op="MaxPool",
        )
    out = tuple(shape[:2]) + g.out
    return [TensorMeta(out, ctx.dtype(0)), TensorMeta(out, _dt.int64)]


def _infer_avg_pool(ctx):
    shape = _check_rank(ctx)
    g = pool_geometry(ctx.op.name, shape, ctx.attrs)
    if ctx.op.name == "AveragePool" and int(ctx.attrs["count_include_pad"]) not in (0, 1):
        raise ParamInvalidError(
            f"AveragePool: attribute 'count_include_pad' must be 0 or 1, got {ctx.attrs['count_include_pad']}",
            op="AveragePool",
        )
    if ctx.op.name == "LpPool" and not float(ctx.attrs["p"]) > 0:
        raise ParamInvalidError(f"LpPool: attribute 'p' must be positive, got {ctx.attrs['p']}", op="LpPool")
    return [TensorMeta(tuple(shape[:2]) + g.out, ctx.dtype(0))]


MaxPool = register_op(
    "MaxPool",
    category="pool",
    inputs=[Input("X", FLOAT + (_dt.int8, _dt.uint8))],
    outputs=["Y", Output("Indices", optional=True)],
    attrs=_pool_attrs([Attr("storage_order", "int", 0)]),
    infer=_infer_max_pool,
    reference=_max_pool_reference,
    doc="Max over each window; optional ONNX flattened indices of the maxima (NaN propagates).",
)

AveragePool = register_op(
    "AveragePool",
    category="pool",
    inputs=[Input("X", FLOAT)],
    outputs=["Y"],
    attrs=_pool_attrs([Attr("count_include_pad", "int", 0)]),
    infer=_infer_avg_pool,
    reference=_avg_pool_reference,
    doc="Mean over each window (divisor: taps in the input, or in the padded extent with count_include_pad).",
)

LpPool = register_op(
    "LpPool",
    category="pool",
    inputs=[Input("X", FLOAT)],
    outputs=["Y"],
    attrs=_pool_attrs([Attr("p", "int", 2)]),
    infer=_infer_avg_pool,
    reference=_lp_pool_reference,
    doc="(sum |x|^p)^(1/p) over each window (padding contributes nothing).",
)


def _numba_ranks(ctx):
    n = len(ctx.shape(0)) - 2
    return True if 1 <= n <= 3 else f"numba pooling covers 1-D to 3-D windows, got {n}-D"


def _pool_plan(ctx) -> K.PoolPlan:
    g = pool_geometry(ctx.op.name, ctx.shape(0), ctx.attrs)
    return K.make_plan(ctx.shape(0), g.out, g.kernel, g.strides, g.dilations, g.pads_begin, g.pads_end)


@MaxPool.kernel(
    "max_pool_numba", dtypes=_F32_64 + (_dt.int8, _dt.uint8), priority=10, plan=_pool_plan, applies=_numba_ranks
)
def _max_pool_numba(ins, outs, attrs, plan, ws):
    K.max_pool(ins[0], outs[0], outs[1] if len(outs) > 1 else None, plan, int(attrs["storage_order"]) == 1)


#: the bfloat16 pooling kernels widen a plane into float32 scratch outside the pool: up to this many elements
BF16_PLANE_MAX = 1 << 22


def _max_pool_bf16_applies(ctx):
    n = len(ctx.shape(0)) - 2
    if n not in (1, 2):
        return f"the bfloat16 kernel covers 1-D and 2-D windows, got {n}-D"
    if math.prod(ctx.shape(0)[2:]) > BF16_PLANE_MAX:
        return f"planes of up to {BF16_PLANE_MAX} elements (float32 scratch per thread)"
    return True


def _max_pool_grad_bf16_applies(ctx):
    if max(math.prod(ctx.shape(2)[2:]), math.prod(ctx.shape(0)[2:])) > BF16_PLANE_MAX:
        return f"planes of up to {BF16_PLANE_MAX} elements (float32 scratch per thread)"
    return True


@MaxPool.kernel(
    "max_pool_numba_bf16",
    dtypes=(_dt.bfloat16,),
    priority=11,  # before max_pool_numba, which takes bfloat16 through the fp32 adapter
    plan=_pool_plan,
    applies=_max_pool_bf16_applies,
    doc="a plane widened to float32 scratch at a time; the window's value stored back (no float32 copies)",
)
def _max_pool_numba_bf16(ins, outs, attrs, plan, ws):
    KBF.max_pool_bf16(ins[0], outs[0], outs[1] if len(outs) > 1 else None, plan, int(attrs["storage_order"]) == 1)


@AveragePool.kernel("avg_pool_numba", dtypes=_F32_64, priority=10, plan=_pool_plan, applies=_numba_ranks)
def _avg_pool_numba(ins, outs, attrs, plan, ws):
    K.avg_pool(ins[0], outs[0], plan, int(attrs["count_include_pad"]) == 1)


@LpPool.kernel(
    "lp_pool_numpy", dtypes=_F32_64, priority=5, plan=lambda ctx: pool_geometry("LpPool", ctx.shape(0), ctx.attrs)
)
def _lp_pool_numpy(ins, outs, attrs, plan, ws):
    K.lp_pool(ins[0], outs[0], plan, float(attrs["p"]))


# -- global pools --------------------------------------------------------------------------------------


def _infer_global(ctx):
    shape = _check_rank(ctx)
    if any(isinstance(d, int) and d == 0 for d in shape[2:]):
        ctx.fail(f"spatial dims must be non-empty to pool over them, got shape {tuple(shape)}")
    if ctx.op.name == "GlobalLpPool" and not float(ctx.attrs["p"]) > 0:
        raise ParamInvalidError(
            f"GlobalLpPool: attribute 'p' must be positive, got {ctx.attrs['p']}", op="GlobalLpPool"
        )
    return [TensorMeta(tuple(shape[:2]) + (1,) * (len(shape) - 2), ctx.dtype(0))]


def _spatial_axes(x):
    return tuple(range(2, x.ndim))


def _global_max_reference(ins, attrs):
    x = ins[0]
    flat = x.reshape(x.shape[0], x.shape[1], math.prod(x.shape[2:]))  # -1 cannot size N * C = 0
    return np.max(flat, axis=2).reshape(x.shape[:2] + (1,) * (x.ndim - 2))  # np.max propagates NaN


GlobalAveragePool = register_op(
    "GlobalAveragePool",
    category="pool",
    inputs=[Input("X", FLOAT)],
    outputs=["Y"],
    infer=_infer_global,
    reference=lambda ins, attrs: (
        ins[0].astype(np.float64).mean(axis=_spatial_axes(ins[0]), keepdims=True).astype(ins[0].dtype)
    ),
    doc="Mean over all spatial positions.",
)

GlobalMaxPool = register_op(
    "GlobalMaxPool",
    category="pool",
    inputs=[Input("X", FLOAT)],
    outputs=["Y"],
    infer=_infer_global,
    reference=_global_max_reference,
    doc="Max over all spatial positions (NaN propagates).",
)

GlobalLpPool = register_op(
    "GlobalLpPool",
    category="pool",
    inputs=[Input("X", FLOAT)],
    outputs=["Y"],
    attrs=[Attr("p", "int", 2)],
    infer=_infer_global,
    reference=lambda ins, attrs: (
        np.sum(np.abs(ins[0].astype(np.float64)) ** float(attrs["p"]), axis=_spatial_axes(ins[0]), keepdims=True)
        ** (1.0 / float(attrs["p"]))
    ).astype(ins[0].dtype),
    doc="(sum |x|^p)^(1/p) over all spatial positions.",
)


def _global_plan(ctx) -> bool:
    return int(np.prod(ctx.shape(0))) >= K.PARALLEL_MIN


@GlobalAveragePool.kernel("global_avg_pool_numba", dtypes=_F32_64, priority=10, plan=_global_plan)
def _global_avg_numba(ins, outs, attrs, plan, ws):
    K.global_pool(ins[0], outs[0], "avg", plan)


@GlobalMaxPool.kernel("global_max_pool_numba", dtypes=_F32_64, priority=10, plan=_global_plan)
def _global_max_numba(ins, outs, attrs, plan, ws):
    K.global_pool(ins[0], outs[0], "max", plan)


@GlobalLpPool.kernel("global_lp_pool_numpy", dtypes=_F32_64, priority=5)
def _global_lp_numpy(ins, outs, attrs, plan, ws):
    if outs[0].size == 0:  # no planes (N or C is 0): reshape(0, -1) cannot size an empty input
        return
    x = ins[0].reshape(outs[0].size, -1)
    p = float(attrs["p"])
    if p != 2.0:  # |x| and |x| ** p: two temporaries of x's size outside the pool
        check_request(2 * x.nbytes, "GlobalLpPool: |X| ** p")
    if p == 2.0:
        r = np.sqrt(np.einsum("ij,ij->i", x, x))
    elif p == 1.0:
        r = np.abs(x).sum(axis=1)
    else:
        r = (np.abs(x) ** p).sum(axis=1) ** (1.0 / p)
    np.copyto(outs[0].reshape(-1), r, casting="unsafe")


# -- AdaptiveAvgPool (opsnn domain: ONNX has no adaptive pooling) ---------------------------------------


def _adaptive_sizes(ctx):
    shape = ctx.shape(0)
    size = ctx.attrs["output_size"]
    k = len(size)
    if k < 1:
        raise ParamInvalidError(
            "AdaptiveAvgPool: attribute 'output_size' needs at least one value", op="AdaptiveAvgPool"
        )
    if len(shape) < k + 1:
        ctx.fail(
            f"a {k}-D output_size pools the last {k} dims of a tensor with a leading channel dim; input X has "
            f"shape {tuple(shape)}"
        )
    if any(int(s) < 0 for s in size):
        raise ParamInvalidError(
            f"AdaptiveAvgPool: attribute 'output_size' must be >= 0, got {list(size)}", op="AdaptiveAvgPool"
        )
    if any(isinstance(d, int) and d == 0 for d in shape[-k:]):
        ctx.fail(f"pooled dims must be non-empty, got shape {tuple(shape)}")
    return shape, tuple(int(s) for s in size)


def _infer_adaptive(ctx):
    shape, size = _adaptive_sizes(ctx)
    return [TensorMeta(tuple(shape[: len(shape) - len(size)]) + size, ctx.dtype(0))]


def _adaptive_reference(ins, attrs):
    x = ins[0]
    size = tuple(int(s) for s in attrs["output_size"])
    k = len(size)
    lead = x.shape[: x.ndim - k]
    y = np.empty(lead + size, np.float64)
    for pos in itertools.product(*[range(s) for s in size]):
        win = []
        for n_in, n_out, i in zip(x.shape[-k:], size, pos):
            win.append(slice(math.floor(i * n_in / n_out), math.ceil((i + 1) * n_in / n_out)))
        y[(Ellipsis,) + pos] = x[(Ellipsis,) + tuple(win)].astype(np.float64).mean(axis=tuple(range(-k, 0)))
    return y.astype(x.dtype)


AdaptiveAvgPool = register_op(
    "AdaptiveAvgPool",
    domain="opsnn",
    category="pool",
    inputs=[Input("X", FLOAT)],
    outputs=["Y"],
    attrs=[Attr("output_size", "ints")],
    infer=_infer_adaptive,
    reference=_adaptive_reference,
    doc="torch's adaptive average pooling over the last len(output_size) dims: window i spans "
    "[floor(i*In/Out), ceil((i+1)*In/Out)).",
)


@AdaptiveAvgPool.kernel(
    "adaptive_avg_pool2d_numba",
    dtypes=_F32_64,
    priority=10,
    applies=lambda ctx: (
        True if len(ctx.attrs["output_size"]) == 2 else "the numba kernel pools exactly two trailing dims"
    ),
    plan=lambda ctx: tuple(
        K.adaptive_bounds(int(ctx.shape(0)[-2 + i]), int(ctx.attrs["output_size"][i])) for i in range(2)
    ),
)
def _adaptive_numba(ins, outs, attrs, plan, ws):
    K.adaptive_avg_pool(ins[0], outs[0], plan)


# -- MaxUnpool ------------------------------------------------------------------------------------------


def _unpool_default_shape(op, x_shape, attrs):
    n = len(x_shape) - 2
    kernel = attrs.get("kernel_shape")
    if kernel is None or len(kernel) != n or any(int(k) < 1 for k in kernel):
        raise ParamInvalidError(
            f"{op}: attribute 'kernel_shape' needs {n} positive values, got {None if kernel is None else list(kernel)}",
            op=op,
        )
    strides = _attr_ints(op, attrs, "strides", n, 1, 1)
    pads = _attr_ints(op, attrs, "pads", 2 * n, 0, 0)
    return tuple(x_shape[:2]) + tuple(
        (x_shape[2 + i] - 1) * strides[i] - pads[i] - pads[n + i] + int(kernel[i]) for i in range(n)
    )


def _unpool_shape(ctx):
    shape = _check_rank(ctx)
    if tuple(ctx.shape(1)) != tuple(shape):
        ctx.fail(f"indices I must have the shape of X {tuple(shape)}, got {tuple(ctx.shape(1))}")
    default = _unpool_default_shape("MaxUnpool", shape, ctx.attrs)
    if not ctx.has(2):
        if any(isinstance(d, int) and d < 0 for d in default):
            ctx.fail(f"kernel_shape/strides/pads give a negative output shape {default}")
        return default
    given = ctx.value(2)
    if given is None:
        ctx.fail("output_shape must be known at prepare time (a host input)")
    given = tuple(int(d) for d in np.asarray(given).reshape(-1))
    if len(given) != len(shape) or given[:2] != tuple(shape[:2]) or any(d < 0 for d in given):
        ctx.fail(
            f"output_shape must be (N, C, spatial...) = {tuple(shape[:2])} + {len(shape) - 2} dims >= 0, "
            f"got {list(given)}"
        )
    return given


def _unpool_reference(ins, attrs):
    x, ind = ins[0], ins[1]
    shape = (
        tuple(int(d) for d in ins[2])
        if len(ins) > 2 and ins[2] is not None
        else _unpool_default_shape("MaxUnpool", x.shape, attrs)
    )
    y = np.zeros(math.prod(shape), x.dtype)
    for v, i in zip(x.reshape(-1), ind.reshape(-1)):
        if not 0 <= i < y.size:
            raise ParamInvalidError(f"MaxUnpool: index {i} outside the output of {y.size} elements", op="MaxUnpool")
        y[i] = v
    return y.reshape(shape)


MaxUnpool = register_op(
    "MaxUnpool",
    category="pool",
    inputs=[Input("X", FLOAT), Input("I", (_dt.int64,)), Input("output_shape", (_dt.int64,), optional=True, host=True)],
    outputs=["output"],
    attrs=[Attr("kernel_shape", "ints"), Attr("pads", "ints", None), Attr("strides", "ints", None)],
    infer=lambda ctx: [TensorMeta(_unpool_shape(ctx), ctx.dtype(0))],
    reference=_unpool_reference,
    doc="Scatter X to the flat positions I (MaxPool's indices) of a zero tensor of output_shape "
    "(indices index the output tensor, as MaxPool's index its input).",
)


@MaxUnpool.kernel("max_unpool_numpy", priority=5)
def _max_unpool_numpy(ins, outs, attrs, plan, ws):
    K.max_unpool(ins[0], ins[1], outs[0])


# -- RoiAlign / MaxRoiPool ------------------------------------------------------------------------------


def _infer_roi_align(ctx):
    x, rois, b = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if len(x) != 4:
        ctx.fail(f"input X must be 4-D (N, C, H, W), got shape {tuple(x)}")
    if len(rois) != 2 or rois[1] != 4:
        ctx.fail(f"rois must be (num_rois, 4) boxes [x1, y1, x2, y2], got shape {tuple(rois)}")
    if tuple(b) != (rois[0],):
        ctx.fail(f"batch_indices must be ({rois[0]},) to match rois, got shape {tuple(b)}")
    if ctx.dtype(1) != ctx.dtype(0):
        ctx.fail(f"rois must have the dtype of X ({_dt.name(ctx.dtype(0))}), got {_dt.name(ctx.dtype(1))}")
    a = ctx.attrs
    mode, ctm = _str(a["mode"]).lower(), _str(a["coordinate_transformation_mode"]).lower()
    if mode not in ("avg", "max"):
        raise ParamInvalidError(f"RoiAlign: attribute 'mode' must be 'avg' or 'max', got {mode!r}", op="RoiAlign")
    if ctm not in ("half_pixel", "output_half_pixel"):
        raise ParamInvalidError(
            f"RoiAlign: attribute 'coordinate_transformation_mode' must be 'half_pixel' or "
            f"'output_half_pixel', got {ctm!r}",
            op="RoiAlign",
        )
    if int(a["output_height"]) < 1 or int(a["output_width"]) < 1 or int(a["sampling_ratio"]) < 0:
        raise ParamInvalidError(
            f"RoiAlign: output_height/output_width must be >= 1 and sampling_ratio >= 0, got "
            f"{a['output_height']}, {a['output_width']}, {a['sampling_ratio']}",
            op="RoiAlign",
        )
    return [TensorMeta((rois[0], x[1], int(a["output_height"]), int(a["output_width"])), ctx.dtype(0))]


def _bilinear(plane: np.ndarray, yy: float, xx: float) -> tuple:
    """The four weighted corner values of a sample point (all zero outside [-1, H] x [-1, W])."""
    H, W = plane.shape[-2:]
    if yy < -1.0 or yy > H or xx < -1.0 or xx > W:
        z = np.zeros(plane.shape[:-2])
        return z, z, z, z
    yy, xx = max(yy, 0.0), max(xx, 0.0)
    y0, x0 = min(int(yy), H - 1), min(int(xx), W - 1)
    y1, x1 = min(y0 + 1, H - 1), min(x0 + 1, W - 1)
    if y0 == H - 1:
        yy = float(y0)
    if x0 == W - 1:
        xx = float(x0)
    ly, lx = yy - y0, xx - x0
    return (
        (1 - ly) * (1 - lx) * plane[..., y0, x0],
        (1 - ly) * lx * plane[..., y0, x1],
        ly * (1 - lx) * plane[..., y1, x0],
        ly * lx * plane[..., y1, x1],
    )


def _roi_box(roi, ft, scale, half, PH, PW, ratio) -> tuple:
    """RoiAlign's box geometry for one roi in the input's float type ``ft``, as ONNX specifies (the
    adaptive grid size is a ceil, so float32 vs float64 rounding can change it): (x1, y1, bin height,
    bin width, samples per bin down, across)."""
    x1, y1, x2, y2 = (ft(v) * ft(scale) - ft(0.5 if half else 0.0) for v in roi)
    rw, rh = x2 - x1, y2 - y1
    if not half:
        rw, rh = max(rw, ft(1.0)), max(rh, ft(1.0))
    bh, bw = float(rh / ft(PH)), float(rw / ft(PW))
    gh = ratio if ratio > 0 else max(int(np.ceil(rh / ft(PH))), 0)
    gw = ratio if ratio > 0 else max(int(np.ceil(rw / ft(PW))), 0)
    return float(x1), float(y1), bh, bw, gh, gw


def _roi_align_reference(ins, attrs):
    x, rois, bidx = ins
    PH, PW = int(attrs["output_height"]), int(attrs["output_width"])
    scale, ratio = float(attrs["spatial_scale"]), int(attrs["sampling_ratio"])
    half = _str(attrs["coordinate_transformation_mode"]).lower() == "half_pixel"
    is_max = _str(attrs["mode"]).lower() == "max"
    xf = x.astype(np.float64)
    ft = x.dtype.type if x.dtype in (_dt.float32, _dt.float64) else np.float32
    y = np.zeros((rois.shape[0], x.shape[1], PH, PW), np.float64)
    for r in range(rois.shape[0]):
        b = int(bidx[r])
        if not 0 <= b < x.shape[0]:
            raise ParamInvalidError(f"RoiAlign: batch index {b} outside 0..{x.shape[0] - 1}", op="RoiAlign")
        x1, y1, bh, bw, gh, gw = _roi_box(rois[r], ft, scale, half, PH, PW, ratio)
        for ph in range(PH):
            for pw in range(PW):
                samples = []
                for iy in range(gh):
                    for ix in range(gw):
                        yy = y1 + ph * bh + (iy + 0.5) * bh / gh
                        xx = x1 + pw * bw + (ix + 0.5) * bw / gw
                        corners = _bilinear(xf[b], yy, xx)
                        samples.append(np.maximum.reduce(corners) if is_max else sum(corners))
                if samples:
                    y[r, :, ph, pw] = np.max(samples, axis=0) if is_max else np.sum(samples, axis=0) / len(samples)
    return y.astype(x.dtype)


RoiAlign = register_op(
    "RoiAlign",
    category="pool",
    inputs=[Input("X", FLOAT), Input("rois", FLOAT), Input("batch_indices", (_dt.int64, _dt.int32))],
    outputs=["Y"],
    attrs=[
        Attr("coordinate_transformation_mode", "string", "half_pixel"),
        Attr("mode", "string", "avg"),
        Attr("output_height", "int", 1),
        Attr("output_width", "int", 1),
        Attr("sampling_ratio", "int", 0),
        Attr("spatial_scale", "float", 1.0),
    ],
    infer=_infer_roi_align,
    reference=_roi_align_reference,
    doc="Mask R-CNN RoI align: bilinear samples averaged (or, ONNX's 'max' mode, max of weighted corners) per bin.",
)


@RoiAlign.kernel("roi_align_numba", dtypes=_F32_64, priority=10)
def _roi_align_numba(ins, outs, attrs, plan, ws):
    K.roi_align(
        ins[0],
        ins[1],
        ins[2],
        outs[0],
        float(attrs["spatial_scale"]),
        int(attrs["sampling_ratio"]),
        _str(attrs["coordinate_transformation_mode"]).lower() == "half_pixel",
        _str(attrs["mode"]).lower() == "max",
    )


def _infer_roi_align_grad(ctx):
    dy = tuple(ctx.shape(0))
    want = tuple(_infer_roi_align(_Shifted(ctx))[0].shape)
    if dy != want:
        ctx.fail(f"input 'dY' must have RoiAlign's output shape {want}, got {dy}")
    if ctx.dtype(0) != ctx.dtype(1):
        ctx.fail(f"input 'dY' must have X's dtype {_dt.name(ctx.dtype(1))}, got {_dt.name(ctx.dtype(0))}")
    return [TensorMeta(tuple(ctx.shape(1)), ctx.dtype(1))]


class _Shifted:
    """RoiAlign's inference context seen from RoiAlignGrad's (its inputs after dY)."""

    def __init__(self, ctx):
        self._ctx, self.attrs = ctx, ctx.attrs

    def shape(self, i):
        return self._ctx.shape(i + 1)

    def dtype(self, i):
        return self._ctx.dtype(i + 1)

    def fail(self, msg):
        self._ctx.fail(msg)


def _roi_align_grad_reference(ins, attrs):
    """float64, one sample point at a time: the forward's taps with their weights, dY / samples added
    at each (avg) or at the largest weighted corner of all the bin's samples (max, first on ties)."""
    dy, x, rois, bidx = ins
    PH, PW = int(attrs["output_height"]), int(attrs["output_width"])
    scale, ratio = float(attrs["spatial_scale"]), int(attrs["sampling_ratio"])
    half = _str(attrs["coordinate_transformation_mode"]).lower() == "half_pixel"
    is_max = _str(attrs["mode"]).lower() == "max"
    H, W = x.shape[2:]
    ft = x.dtype.type
    dx = np.zeros(x.shape, np.float64)
    for r in range(rois.shape[0]):
        b = int(bidx[r])
        if not 0 <= b < x.shape[0]:
            raise ParamInvalidError(f"RoiAlignGrad: batch index {b} outside 0..{x.shape[0] - 1}", op="RoiAlignGrad")
        x1, y1, bh, bw, gh, gw = _roi_box(rois[r], ft, scale, half, PH, PW, ratio)
        for ph in range(PH):
            for pw in range(PW):
                taps = []  # (y, x, weight) of every corner of every sample
                for iy in range(gh):
                    for ix in range(gw):
                        yy = y1 + ph * bh + (iy + 0.5) * bh / gh
                        xx = x1 + pw * bw + (ix + 0.5) * bw / gw
                        if yy < -1.0 or yy > H or xx < -1.0 or xx > W:
                            taps += [(0, 0, 0.0)] * 4
                            continue
                        yy, xx = max(yy, 0.0), max(xx, 0.0)
                        y0, x0 = min(int(yy), H - 1), min(int(xx), W - 1)
                        yb, xb = min(y0 + 1, H - 1), min(x0 + 1, W - 1)
                        ly = 0.0 if y0 == H - 1 else yy - y0
                        lx = 0.0 if x0 == W - 1 else xx - x0
                        taps += [
                            (y0, x0, (1 - ly) * (1 - lx)),
                            (y0, xb, (1 - ly) * lx),
                            (yb, x0, ly * (1 - lx)),
                            (yb, xb, ly * lx),
                        ]
                if not taps:
                    continue
                g = dy[r, :, ph, pw].astype(np.float64)
                if not is_max:
                    for ty, tx, w in taps:
                        dx[b, :, ty, tx] += w * g / (gh * gw)
                    continue
                for c in range(x.shape[1]):
                    vals = [w * float(x[b, c, ty, tx]) for ty, tx, w in taps]
                    j = int(np.argmax(vals))
                    dx[b, c, taps[j][0], taps[j][1]] += taps[j][2] * g[c]
    return dx.astype(x.dtype)


RoiAlignGrad = register_op(
    "RoiAlignGrad",
    domain="opsnn",
    category="pool",
    inputs=[
        Input("dY", FLOAT),
        Input("X", FLOAT),
        Input("rois", FLOAT),
        Input("batch_indices", (_dt.int64, _dt.int32)),
    ],
    outputs=["dX"],
    attrs=[
        Attr("coordinate_transformation_mode", "string", "half_pixel"),
        Attr("mode", "string", "avg"),
        Attr("output_height", "int", 1),
        Attr("output_width", "int", 1),
        Attr("sampling_ratio", "int", 0),
        Attr("spatial_scale", "float", 1.0),
    ],
    infer=_infer_roi_align_grad,
    reference=_roi_align_grad_reference,
    doc="gradient of RoiAlign w.r.t. X: each bin's dY added back through its samples' bilinear taps "
    "(avg) or to the corner its maximum came from (max)",
)


@RoiAlignGrad.kernel(
    "roi_align_grad_numba",
    dtypes=_F32_64,
    priority=10,
    doc="numba, parallel over channels (each writes its own dX planes: no races), the forward's taps reused",
)
def _roi_align_grad_numba(ins, outs, attrs, plan, ws):
    KB.roi_align_backward(
        ins[0],
        ins[1],
        ins[2],
        ins[3],
        outs[0],
        float(attrs["spatial_scale"]),
        int(attrs["sampling_ratio"]),
        _str(attrs["coordinate_transformation_mode"]).lower() == "half_pixel",
        _str(attrs["mode"]).lower() == "max",
    )


def _infer_max_roi_pool(ctx):
    x, rois = ctx.shape(0), ctx.shape(1)
    if len(x) != 4:
        ctx.fail(f"input X must be 4-D (N, C, H, W), got shape {tuple(x)}")
    if len(rois) != 2 or rois[1] != 5:
        ctx.fail(f"rois must be (num_rois, 5) rows [batch_index, x1, y1, x2, y2], got shape {tuple(rois)}")
    shape = ctx.attrs["pooled_shape"]
    if len(shape) != 2 or any(int(s) < 1 for s in shape):
        raise ParamInvalidError(
            f"MaxRoiPool: attribute 'pooled_shape' must be two positive ints, got {list(shape)}", op="MaxRoiPool"
        )
    return [TensorMeta((rois[0], x[1], int(shape[0]), int(shape[1])), ctx.dtype(0))]


def _max_roi_pool_reference(ins, attrs):
    x, rois = ins
    PH, PW = (int(s) for s in attrs["pooled_shape"])
    scale = float(attrs["spatial_scale"])
    N, C, H, W = x.shape
    y = np.zeros((rois.shape[0], C, PH, PW), x.dtype)

    def c_round(v):  # C round(): halves away from zero
        return int(math.floor(abs(v) + 0.5)) * (1 if v >= 0 else -1)

    for r in range(rois.shape[0]):
        b = int(rois[r, 0])
        if not 0 <= b < N:
            raise ParamInvalidError(f"MaxRoiPool: batch index {b} outside 0..{N - 1}", op="MaxRoiPool")
        x1, y1, x2, y2 = (c_round(float(v) * scale) for v in rois[r, 1:])
        bh, bw = max(y2 - y1 + 1, 1) / PH, max(x2 - x1 + 1, 1) / PW
        for ph in range(PH):
            h_lo = min(max(math.floor(ph * bh) + y1, 0), H)
            h_hi = min(max(math.ceil((ph + 1) * bh) + y1, 0), H)
            for pw in range(PW):
                w_lo = min(max(math.floor(pw * bw) + x1, 0), W)
                w_hi = min(max(math.ceil((pw + 1) * bw) + x1, 0), W)
                for c in range(C):
                    cells = [x[b, c, h, w] for h in range(h_lo, h_hi) for w in range(w_lo, w_hi)]
                    y[r, c, ph, pw] = max(cells) if cells else 0
    return y


MaxRoiPool = register_op(
    "MaxRoiPool",
    category="pool",
    inputs=[Input("X", FLOAT), Input("rois", FLOAT)],
    outputs=["Y"],
    attrs=[Attr("pooled_shape", "ints"), Attr("spatial_scale", "float", 1.0)],
    infer=_infer_max_roi_pool,
    reference=_max_roi_pool_reference,
    doc="Fast R-CNN RoI max pooling (box corners rounded; empty bins give 0).",
)


@MaxRoiPool.kernel("max_roi_pool_numpy", dtypes=_F32_64, priority=5)
def _max_roi_pool_numpy(ins, outs, attrs, plan, ws):
    K.max_roi_pool(ins[0], ins[1], outs[0], float(attrs["spatial_scale"]))


def _infer_max_roi_pool_grad(ctx):
    want = tuple(_infer_max_roi_pool(_Shifted(ctx))[0].shape)
    if tuple(ctx.shape(0)) != want:
        ctx.fail(f"input 'dY' must have MaxRoiPool's output shape {want}, got {tuple(ctx.shape(0))}")
    if ctx.dtype(0) != ctx.dtype(1):
        ctx.fail(f"input 'dY' must have X's dtype {_dt.name(ctx.dtype(1))}, got {_dt.name(ctx.dtype(0))}")
    return [TensorMeta(tuple(ctx.shape(1)), ctx.dtype(1))]


def _max_roi_pool_grad_reference(ins, attrs):
    """float64, cell by cell: each bin's dY added at the first cell holding its maximum (NaN wins)."""
    dy, x, rois = ins
    PH, PW = (int(s) for s in attrs["pooled_shape"])
    scale = float(attrs["spatial_scale"])
    N, C, H, W = x.shape
    dx = np.zeros(x.shape, np.float64)
    for r in range(rois.shape[0]):
        b = int(rois[r, 0])
        if not 0 <= b < N:
            raise ParamInvalidError(f"MaxRoiPoolGrad: batch index {b} outside 0..{N - 1}", op="MaxRoiPoolGrad")
        x1, y1, x2, y2 = (int(math.floor(abs(v) + 0.5)) * (1 if v >= 0 else -1) for v in rois[r, 1:] * scale)
        bh, bw = max(y2 - y1 + 1, 1) / PH, max(x2 - x1 + 1, 1) / PW
        for ph in range(PH):
            hs, he = (min(max(f(v) + y1, 0), H) for f, v in ((math.floor, ph * bh), (math.ceil, (ph + 1) * bh)))
            for pw in range(PW):
                ws, we = (min(max(f(v) + x1, 0), W) for f, v in ((math.floor, pw * bw), (math.ceil, (pw + 1) * bw)))
                for c in range(C):
                    best = None
                    for h in range(hs, he):
                        for w in range(ws, we):
                            v = float(x[b, c, h, w])
                            if best is None or (not math.isnan(best[0]) and (math.isnan(v) or v > best[0])):
                                best = (v, h, w)
                    if best is not None:
                        dx[b, c, best[1], best[2]] += float(dy[r, c, ph, pw])
    return dx.astype(x.dtype)


MaxRoiPoolGrad = register_op(
    "MaxRoiPoolGrad",
    domain="opsnn",
    category="pool",
    inputs=[Input("dY", FLOAT), Input("X", FLOAT), Input("rois", FLOAT)],
    outputs=["dX"],
    attrs=[Attr("pooled_shape", "ints"), Attr("spatial_scale", "float", 1.0)],
    infer=_infer_max_roi_pool_grad,
    reference=_max_roi_pool_grad_reference,
    doc="gradient of MaxRoiPool w.r.t. X: each bin's dY added at its maximum",
)


@MaxRoiPoolGrad.kernel(
    "max_roi_pool_grad_numpy",
    dtypes=_F32_64,
    priority=5,
    doc="numpy, vectorized over channels: one argmax per bin, bins added in order",
)
def _max_roi_pool_grad_numpy(ins, outs, attrs, plan, ws):
    K.max_roi_pool_backward(ins[0], ins[1], ins[2], outs[0], float(attrs["spatial_scale"]))


# -- backward ops (domain opsnn: the gradient rules' kernels) ---------------------------------------------


def _grad_shapes(ctx, op: str, xi: int):
    """dY (input 0, (N, C, out...)) against X (input ``xi``, (N, C, in...)): one rank, batch and channels."""
    gy, x = tuple(ctx.shape(0)), tuple(ctx.shape(xi))
    if len(x) < 3 or len(gy) != len(x) or gy[:2] != x[:2]:
        raise InferShapeError(
            f"{op}: input 'dY' has shape {gy}; expected (N, C, spatial...) of rank {len(x)} with X's N, C {x[:2]}",
            op=op,
        )
    return gy, x


def _infer_max_pool_grad(ctx):
    gy, x = _grad_shapes(ctx, "MaxPoolGrad", 2)
    if tuple(ctx.shape(1)) != gy:
        raise InferShapeError(
            f"MaxPoolGrad: input 'Indices' has shape {tuple(ctx.shape(1))}; expected dY's shape {gy}", op="MaxPoolGrad"
        )
    return [TensorMeta(x, ctx.dtype(0))]


def _bad_indices(count: int) -> ParamInvalidError:
    return ParamInvalidError(
        f"MaxPoolGrad: input 'Indices' holds {count} value(s) outside their own (n, c) plane; expected MaxPool's "
        "row-major flat indices (storage_order=0) of this X",
        op="MaxPoolGrad",
    )


def _max_pool_grad_reference(ins, attrs):
    g, idx, x = ins[0], ins[1], ins[2]
    planes = x.shape[0] * x.shape[1]
    hw = math.prod(x.shape[2:])
    dx = np.zeros((planes, hw), np.float64)
    gp = g.astype(np.float64).reshape(planes, -1)
    ip = idx.reshape(planes, -1)
    for p in range(planes):
        keep = ip[p] != -1
        k = ip[p][keep] - p * hw
        if np.any((k < 0) | (k >= hw)):
            raise _bad_indices(int(np.sum((k < 0) | (k >= hw))))
        np.add.at(dx[p], k, gp[p][keep])
    return dx.reshape(x.shape).astype(g.dtype)


MaxPoolGrad = register_op(
    "MaxPoolGrad",
    domain="opsnn",
    category="pool",
    inputs=[Input("dY", FLOAT), Input("Indices", (_dt.int64,)), Input("X", FLOAT + (_dt.int8, _dt.uint8))],
    outputs=["dX"],
    infer=_infer_max_pool_grad,
    reference=_max_pool_grad_reference,
    doc="gradient of MaxPool: dY added at the forward's Indices (row-major flat over X; -1 skipped); "
    "X gives the shape only",
)


@MaxPoolGrad.kernel(
    "max_pool_grad_numba",
    dtypes=_F32_64,
    priority=10,
    plan=lambda ctx: int(ctx.shape(2)[0]) * int(ctx.shape(2)[1]),
    doc="scatter-add per (n, c) plane (planes in parallel: a plane's indices stay in it)",
)
def _max_pool_grad_numba(ins, outs, attrs, plan, ws):
    bad = KB.max_pool_backward(ins[0], ins[1], outs[0], plan)
    if bad:
        raise _bad_indices(bad)


@MaxPoolGrad.kernel(
    "max_pool_grad_numba_bf16",
    dtypes=(_dt.bfloat16,),
    priority=11,  # before max_pool_grad_numba, which widens dY and X (read for its shape only)
    applies=_max_pool_grad_bf16_applies,
    plan=lambda ctx: int(ctx.shape(2)[0]) * int(ctx.shape(2)[1]),
    doc="per plane: dY widened, scatter-added in float32, rounded once (X is not read)",
)
def _max_pool_grad_numba_bf16(ins, outs, attrs, plan, ws):
    bad = KBF.max_pool_backward_bf16(ins[0], ins[1], outs[0], plan)
    if bad:
        raise _bad_indices(bad)


def _infer_avg_pool_grad(ctx):
    gy, x = _grad_shapes(ctx, "AveragePoolGrad", 1)
    if int(ctx.attrs["count_include_pad"]) not in (0, 1):
        raise ParamInvalidError(
            f"AveragePoolGrad: attribute 'count_include_pad' must be 0 or 1, got {ctx.attrs['count_include_pad']}",
            op="AveragePoolGrad",
        )
    out = x[:2] + pool_geometry("AveragePoolGrad", x, ctx.attrs).out
    if out != gy:
        raise InferShapeError(
            f"AveragePoolGrad: input 'dY' has shape {gy}; AveragePool of X {x} with these attributes gives {out}",
            op="AveragePoolGrad",
        )
    return [TensorMeta(x, ctx.dtype(0))]


def _avg_pool_grad_reference(ins, attrs):
    g, x = ins[0], ins[1]
    geo = pool_geometry("AveragePoolGrad", x.shape, attrs)
    include = int(attrs.get("count_include_pad", 0)) == 1
    dx = np.zeros(x.shape, np.float64)
    gw = g.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        for pos, valid, padded_count in _windows(x.shape[2:], geo):
            count = padded_count if include else math.prod(len(v) for v in valid)
            if any(len(v) == 0 for v in valid):
                continue
            at = (slice(None), slice(None)) + np.ix_(*valid)
            v = gw[(slice(None), slice(None)) + pos] / np.float64(count)
            dx[at] += v.reshape(v.shape + (1,) * len(valid))
    return dx.astype(g.dtype)


AveragePoolGrad = register_op(
    "AveragePoolGrad",
    domain="opsnn",
    category="pool",
    inputs=[Input("dY", FLOAT), Input("X", FLOAT)],
    outputs=["dX"],
    attrs=_pool_attrs([Attr("count_include_pad", "int", 0)]),
    infer=_infer_avg_pool_grad,
    reference=_avg_pool_grad_reference,
    doc="gradient of AveragePool (the same attributes): each window's dY / count added to its input taps; "
    "X gives the shape only",
)


@AveragePoolGrad.kernel(
    "avg_pool_grad_numba",
    dtypes=_F32_64,
    priority=10,
    applies=lambda ctx: True if 1 <= len(ctx.shape(1)) - 2 <= 3 else "numba pooling covers 1-D to 3-D windows",
    plan=lambda ctx: KB.avg_pool_plan(
        ctx.shape(1),
        pool_geometry("AveragePoolGrad", ctx.shape(1), ctx.attrs),
        int(ctx.attrs["count_include_pad"]) == 1,
    ),
    doc="per (n, c) plane (planes in parallel): every window's dY / count added to its taps in order",
)
def _avg_pool_grad_numba(ins, outs, attrs, plan, ws):
    KB.avg_pool_backward(ins[0], outs[0], plan)


# -- functional entry points (torch-style arguments) ----------------------------------------------------------


def _ints_arg(fn: str, name: str, v, n: int, minimum: int) -> tuple:
    if type(v) is int and v >= minimum:  # the common call (max_pool2d(x, 2)): no generic checks
        return (v,) * n
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        v = (int(v),) * n
    elif isinstance(v, (tuple, list)) and len(v) == 1 and n > 1:
        v = (int(v[0]),) * n
    if not isinstance(v, (tuple, list)) or len(v) != n or not all(isinstance(a, (int, np.integer)) for a in v):
        raise ParamInvalidError(f"{fn}: {name} must be an int or {n} ints, got {v!r}")
    v = tuple(int(a) for a in v)
    if any(a < minimum for a in v):
        raise ParamInvalidError(f"{fn}: {name} must be >= {minimum}, got {v}")
    return v


def _torch_window(fn: str, x, n: int, kernel_size, stride, padding, dilation=1):
    x = as_tensor(x)
    if x.ndim != n + 2:
        raise ParamInvalidError(
            f"{fn}: expected a {n + 2}-D (N, C, {'D, ' if n == 3 else ''}"
            f"{'H, ' if n >= 2 else ''}W) input, got shape {x.shape}"
        )
    k = _ints_arg(fn, "kernel_size", kernel_size, n, 1)
    s = (
        k
        if stride is None or (isinstance(stride, (list, tuple)) and len(stride) == 0)
        else _ints_arg(fn, "stride", stride, n, 1)
    )
    p = _ints_arg(fn, "padding", padding, n, 0)
    d = _ints_arg(fn, "dilation", dilation, n, 1)
    for ki, pi in zip(k, p):
        if pi > ki // 2:  # torch's rule
            raise ParamInvalidError(
                f"{fn}: padding should be at most half of kernel_size, got padding {p} for kernel_size {k}"
            )
    return x, {"kernel_shape": list(k), "strides": list(s), "pads": list(p) * 2, "dilations": list(d)}


def _max_pool(fn, n, x, kernel_size, stride, padding, dilation, ceil_mode, return_indices):
    x, attrs = _torch_window(fn, x, n, kernel_size, stride, padding, dilation)
    attrs["ceil_mode"] = int(bool(ceil_mode))
    return [x], attrs, (2 if return_indices else 1)


@api("max_pool2d", "MaxPool")
def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """2-D max pooling of an (N, C, H, W) tensor; ``stride`` defaults to ``kernel_size``.
    With ``return_indices`` also returns ONNX flattened int64 indices (``idx % (H*W)`` is
    torch's per-plane index). NaN propagates."""
    return _max_pool("max_pool2d", 2, x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


@api("max_pool1d", "MaxPool")
def max_pool1d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """1-D max pooling of an (N, C, W) tensor (see :func:`max_pool2d`)."""
    return _max_pool("max_pool1d", 1, x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


@api("max_pool3d", "MaxPool")
def max_pool3d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """3-D max pooling of an (N, C, D, H, W) tensor (see :func:`max_pool2d`)."""
    return _max_pool("max_pool3d", 3, x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def _avg_pool(fn, n, x, kernel_size, stride, padding, ceil_mode, count_include_pad):
    x, attrs = _torch_window(fn, x, n, kernel_size, stride, padding)
    del attrs["dilations"]
    attrs["ceil_mode"] = int(bool(ceil_mode))
    attrs["count_include_pad"] = int(bool(count_include_pad))
    return [x], attrs


@api("avg_pool2d", "AveragePool")
def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """2-D average pooling of an (N, C, H, W) tensor (torch defaults: padding counts)."""
    return _avg_pool("avg_pool2d", 2, x, kernel_size, stride, padding, ceil_mode, count_include_pad)


@api("avg_pool1d", "AveragePool")
def avg_pool1d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """1-D average pooling of an (N, C, W) tensor."""
    return _avg_pool("avg_pool1d", 1, x, kernel_size, stride, padding, ceil_mode, count_include_pad)


@api("avg_pool3d", "AveragePool")
def avg_pool3d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """3-D average pooling of an (N, C, D, H, W) tensor."""
    return _avg_pool("avg_pool3d", 3, x, kernel_size, stride, padding, ceil_mode, count_include_pad)


@api("lp_pool2d", "LpPool")
def lp_pool2d(x, norm_type, kernel_size, stride=None, ceil_mode=False):
    """2-D power-average pooling ``(sum |x|^p)^(1/p)`` (ONNX LpPool: ``p`` is an integer)."""
    if int(norm_type) != norm_type or norm_type <= 0:
        raise ParamInvalidError(f"lp_pool2d: norm_type must be a positive integer (ONNX LpPool's p), got {norm_type}")
    x, attrs = _torch_window("lp_pool2d", x, 2, kernel_size, stride, 0)
    attrs.update(p=int(norm_type), ceil_mode=int(bool(ceil_mode)))
    return [x], attrs


@api("adaptive_avg_pool2d", "AdaptiveAvgPool", domain="opsnn")
def adaptive_avg_pool2d(x, output_size):
    """Average pooling of the last two dims to ``output_size`` (int or (h, w); None keeps
    that input dim), torch's window formula. Accepts (N, C, H, W) or (C, H, W)."""
    x = as_tensor(x)
    if x.ndim not in (3, 4):
        raise ParamInvalidError(f"adaptive_avg_pool2d: expected a 3-D or 4-D input, got shape {x.shape}")
    if output_size is None or isinstance(output_size, (int, np.integer)):
        output_size = (output_size, output_size)
    if len(output_size) != 2:
        raise ParamInvalidError(f"adaptive_avg_pool2d: output_size must be an int or 2 values, got {output_size!r}")
    size = [x.shape[-2 + i] if s is None else int(s) for i, s in enumerate(output_size)]
    return [x], {"output_size": size}


@api("global_avg_pool", "GlobalAveragePool")
def global_avg_pool(x):
    """Mean over all spatial dims of an (N, C, spatial...) tensor -> (N, C, 1, ...)."""
    return [x], {}


@api("global_max_pool", "GlobalMaxPool")
def global_max_pool(x):
    """Max over all spatial dims of an (N, C, spatial...) tensor -> (N, C, 1, ...)."""
    return [x], {}


@api("global_lp_pool", "GlobalLpPool")
def global_lp_pool(x, p=2):
    """``(sum |x|^p)^(1/p)`` over all spatial dims -> (N, C, 1, ...)."""
    return [x], {"p": int(p)}


@api("max_unpool2d", "MaxUnpool")
def max_unpool2d(x, indices, kernel_size, stride=None, padding=0, output_size=None):
    """Inverse of :func:`max_pool2d` with ``return_indices=True``: scatter ``x`` to
    ``indices`` (ONNX flattened indices) of a zero (N, C, H, W) tensor; ``output_size``
    (H, W) or (N, C, H, W) picks the size when several inputs pool to the same shape."""
    x = as_tensor(x)
    if x.ndim != 4:
        raise ParamInvalidError(f"max_unpool2d: expected a 4-D (N, C, H, W) input, got shape {x.shape}")
    k = _ints_arg("max_unpool2d", "kernel_size", kernel_size, 2, 1)
    s = k if stride is None else _ints_arg("max_unpool2d", "stride", stride, 2, 1)
    p = _ints_arg("max_unpool2d", "padding", padding, 2, 0)
    inputs = [x, indices]
    if output_size is not None:
        size = [int(v) for v in output_size]
        if len(size) == 2:
            size = list(x.shape[:2]) + size
        inputs.append(Tensor(np.asarray(size, np.int64)))
    return inputs, {"kernel_shape": list(k), "strides": list(s), "pads": list(p) * 2}


@api("roi_align", "RoiAlign")
def roi_align(x, rois, batch_indices, output_size, spatial_scale=1.0, sampling_ratio=0, aligned=False, mode="avg"):
    """RoI align of (N, C, H, W) features over ``rois`` (K, 4) boxes [x1, y1, x2, y2] of
    images ``batch_indices`` (K,). ``aligned`` shifts by half a pixel (ONNX half_pixel);
    ``sampling_ratio`` <= 0 samples adaptively."""
    oh, ow = _ints_arg("roi_align", "output_size", output_size, 2, 1)
    return [x, rois, batch_indices], {
        "output_height": oh,
        "output_width": ow,
        "spatial_scale": float(spatial_scale),
        "sampling_ratio": max(int(sampling_ratio), 0),
        "mode": str(mode),
        "coordinate_transformation_mode": "half_pixel" if aligned else "output_half_pixel",
    }


@api("roi_align_backward", "RoiAlignGrad", domain="opsnn")
def roi_align_backward(
    grad_output, x, rois, batch_indices, output_size, spatial_scale=1.0, sampling_ratio=0, aligned=False, mode="avg"
):
    """Gradient of :func:`roi_align` w.r.t. ``x`` for the output gradient ``grad_output`` (same arguments)."""
    ins, attrs = roi_align.translate(x, rois, batch_indices, output_size, spatial_scale, sampling_ratio, aligned, mode)
    return [grad_output] + ins, attrs


@api("roi_pool", "MaxRoiPool")
def roi_pool(x, rois, output_size, spatial_scale=1.0):
    """Fast R-CNN RoI max pooling; ``rois`` is (K, 5) rows [batch_index, x1, y1, x2, y2]."""
    oh, ow = _ints_arg("roi_pool", "output_size", output_size, 2, 1)
    return [x, rois], {"pooled_shape": [oh, ow], "spatial_scale": float(spatial_scale)}


@api("roi_pool_backward", "MaxRoiPoolGrad", domain="opsnn")
def roi_pool_backward(grad_output, x, rois, output_size, spatial_scale=1.0):
    """Gradient of :func:`roi_pool` w.r.t. ``x`` for the output gradient ``grad_output`` (same arguments)."""
    ins, attrs = roi_pool.translate(x, rois, output_size, spatial_scale)
    return [grad_output] + ins, attrs


@api("max_pool_backward", "MaxPoolGrad", domain="opsnn")
def max_pool_backward(grad_output, x, indices):
    """Gradient of max pooling (1-D to 3-D): ``grad_output`` added at ``indices``, the ONNX flat
    indices ``max_pool2d(..., return_indices=True)`` returns. ``dx = opsnn.ops.max_pool_backward(dy, x, idx)``"""
    return [grad_output, indices, x], {}


@api("avg_pool_backward", "AveragePoolGrad", domain="opsnn")
def avg_pool_backward(grad_output, x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """Gradient of :func:`avg_pool2d` (and of the 1-D / 3-D forms: the rank of ``x`` decides), with the
    forward's arguments. ``dx = opsnn.ops.avg_pool_backward(dy, x, 3, 2, 1)``"""
    x = as_tensor(x)
    n = x.ndim - 2
    if not 1 <= n <= 3:
        raise ParamInvalidError(
            f"avg_pool_backward: expected a 3-D to 5-D (N, C, spatial...) input, got shape {x.shape}"
        )
    _, attrs = _avg_pool("avg_pool_backward", n, x, kernel_size, stride, padding, ceil_mode, count_include_pad)
    return [grad_output, x], attrs


__all__ = [
    "roi_align_backward",
    "roi_pool_backward",
    "max_pool1d",
    "max_pool2d",
    "max_pool3d",
    "avg_pool1d",
    "avg_pool2d",
    "avg_pool3d",
    "lp_pool2d",
    "adaptive_avg_pool2d",
    "global_avg_pool",
    "global_max_pool",
    "global_lp_pool",
    "max_unpool2d",
    "roi_align",
    "roi_pool",
    "max_pool_backward",
    "avg_pool_backward",
]
