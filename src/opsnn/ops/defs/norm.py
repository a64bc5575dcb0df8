"""Normalization ops (LayerNormalization, RMSNormalization, BatchNormalization,
GroupNormalization, InstanceNormalization, LpNormalization, MeanVarianceNormalization,
LRN): records, kernel registration and functional entry points.

Statistics are always computed in at least float32 (float64 accumulation in the kernels),
which satisfies every ``stash_type``; ``stash_type`` only picks the dtype of
LayerNormalization's Mean/InvStdDev outputs (1: float32, as ONNX infers).

>>> import opsnn, numpy as np
>>> x = opsnn.tensor(np.random.rand(2, 8).astype(np.float32))
>>> opsnn.ops.layer_norm(x, (8,)).shape
(2, 8)
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from ... import dtypes as _dt
from ...errors import ParamInvalidError
from ...kernels.cpu import norm as K
from ...kernels.cpu import norm_backward as KB
from ...tensor import as_tensor
from ..api import api
from ..registry import Attr, Input, Output, TensorMeta, register_op

FLOAT = _dt.FLOATS
_F32_64 = (_dt.float32, _dt.float64)
_F32_64_BF16 = (*_F32_64, _dt.bfloat16)  # bf16 storage read and written natively, float32 math


def _bad(op: str, message: str):
    return ParamInvalidError(f"{op}: {message}", op=op)


def _norm_axis(op: str, axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < rank:
        raise _bad(op, f"attribute '{what}' is {axis}; expected {-rank}..{rank - 1} for a rank-{rank} input")
    return axis + rank if axis < 0 else axis


def _unidirectional(op: str, name: str, shape: tuple, target: tuple) -> None:
    """``shape`` must broadcast to ``target`` without changing ``target`` (ONNX unidirectional)."""
    if len(shape) > len(target) or any(s != 1 and s != t for s, t in zip(reversed(shape), reversed(target))):
        raise _bad(op, f"input '{name}' of shape {tuple(shape)} does not broadcast to X's shape {tuple(target)}")


def _stash_dtype(ctx) -> np.dtype:
    return _dt.float32 if int(ctx.attrs["stash_type"]) == 1 else ctx.dtype(0)


def _rows_plan(ctx):
    """(rows, N, parallel) of the normalized trailing block starting at ``axis``."""
    shape = tuple(ctx.shape(0))
    axis = _norm_axis(ctx.op.name, int(ctx.attrs["axis"]), len(shape))
    rows, N = math.prod(shape[:axis]), math.prod(shape[axis:])
    return rows, N, rows * N >= K.PARALLEL_MIN


def _params_in_block(ctx):
    """Fast kernels take scale/bias as vectors over the normalized block only."""
    shape = tuple(ctx.shape(0))
    axis = _norm_axis(ctx.op.name, int(ctx.attrs["axis"]), len(shape))
    for i in range(1, len(ctx.inputs)):
        if ctx.has(i):
            s = list(ctx.shape(i))
            while s and s[0] == 1:
                s.pop(0)
            if len(s) > len(shape) - axis:
                return f"input {i} varies over the non-normalized dims (shape {ctx.shape(i)})"
    return True


def _block_vector(p: np.ndarray, shape: tuple, axis: int) -> np.ndarray:
    block = shape[axis:]
    if p.flags.c_contiguous and p.size == math.prod(block):  # already the block (the usual case): no copy
        return p.reshape(-1)
    s = p.shape
    while len(s) > len(block):  # leading 1s (checked by applies)
        p = p.reshape(s[1:])
        s = p.shape
    return np.ascontiguousarray(np.broadcast_to(p, block)).reshape(-1)


# -- LayerNormalization ----------------------------------------------------------------------------
def _ln_infer(ctx):
    op = ctx.op.name
    shape = tuple(ctx.shape(0))
    axis = _norm_axis(op, int(ctx.attrs["axis"]), len(shape))
    _unidirectional(op, "Scale", ctx.shape(1), shape)
    if ctx.has(2):
        _unidirectional(op, "B", ctx.shape(2), shape)
    stat = shape[:axis] + (1,) * (len(shape) - axis)
    u = _stash_dtype(ctx)
    return [TensorMeta(shape, ctx.dtype(0)), TensorMeta(stat, u), TensorMeta(stat, u)]


def _ln_ref(ins, attrs):
    x, scale = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    axis = int(attrs["axis"]) % x.ndim
    axes = tuple(range(axis, x.ndim))
    w = x.astype(np.float64)
    mean = w.mean(axis=axes, keepdims=True)
    var = ((w - mean) ** 2).mean(axis=axes, keepdims=True)
    inv = 1.0 / np.sqrt(var + float(attrs["epsilon"]))
    y = (w - mean) * inv * scale.astype(np.float64)
    if bias is not None:
        y = y + bias.astype(np.float64)
    u = np.float32 if int(attrs["stash_type"]) == 1 else x.dtype
    return y.astype(x.dtype), mean.astype(u), inv.astype(u)


def _ln_workspace(ctx, plan):
    return 16 * plan[0]


def _ln_kernel(rms: bool, numpy: bool = False):
    def run(ins, outs, attrs, plan, ws):
        rows, N, par = plan
        x = ins[0]
        axis = int(attrs["axis"]) % x.ndim
        scale = _block_vector(ins[1], x.shape, axis)
        bias = _block_vector(ins[2], x.shape, axis) if not rms and len(ins) > 2 and ins[2] is not None else None
        y = outs[0]
        tmp = y if y.dtype == x.dtype else np.empty(y.shape, x.dtype)
        # the numba kernel writes 2*rows statistics unchecked: never hand it a short buffer
        stats = ws[: 16 * rows].view(np.float64) if ws is not None else np.empty(2 * rows)
        if numpy:
            K.layer_norm_numpy(x, scale, bias, tmp, stats, rows, N, float(attrs["epsilon"]), rms)
        else:
            K.layer_norm(x, scale, bias, tmp, stats, rows, N, float(attrs["epsilon"]), rms, par)
        if tmp is not y:
            np.copyto(y, tmp, casting="unsafe")
        for k, o in enumerate(outs[1:3]):
            np.copyto(o.reshape(-1), stats[k * rows : (k + 1) * rows], casting="unsafe")

    return run


LayerNormalization = register_op(
    "LayerNormalization",
    category="norm",
    inputs=[Input("X", FLOAT), Input("Scale", FLOAT), Input("B", FLOAT, optional=True)],
    outputs=["Y", Output("Mean", optional=True), Output("InvStdDev", optional=True)],
    attrs=[Attr("axis", "int", -1), Attr("epsilon", "float", 1e-5), Attr("stash_type", "int", 1)],
    infer=_ln_infer,
    reference=_ln_ref,
    doc="(x - mean) / sqrt(var + eps) * Scale + B over dims axis..rank-1",
)
LayerNormalization.kernel(
    "layer_norm_numba",
    dtypes=_F32_64,
    priority=10,
    plan=_rows_plan,
    workspace=_ln_workspace,
    applies=_params_in_block,
    cold_alternative="layer_norm_numpy",
    doc="one stats pass per row (float64 sums), one write pass",
)(_ln_kernel(False))
LayerNormalization.kernel(
    "layer_norm_numpy",
    dtypes=_F32_64,
    priority=5,
    plan=_rows_plan,
    workspace=_ln_workspace,
    applies=_params_in_block,
    doc="numpy in float64: nothing to compile, the first run's kernel while layer_norm_numba compiles in "
    "the background (ops/tiering.py)",
)(_ln_kernel(False, numpy=True))


# -- RMSNormalization --------------------------------------------------------------------------------
def _rms_infer(ctx):
    op = ctx.op.name
    shape = tuple(ctx.shape(0))
    _norm_axis(op, int(ctx.attrs["axis"]), len(shape))
    _unidirectional(op, "scale", ctx.shape(1), shape)
    return [TensorMeta(shape, ctx.dtype(1))]


def _rms_ref(ins, attrs):
    x, scale = ins
    axis = int(attrs["axis"]) % x.ndim
    w = x.astype(np.float64)
    ms = (w * w).mean(axis=tuple(range(axis, x.ndim)), keepdims=True)
    return (w / np.sqrt(ms + float(attrs["epsilon"])) * scale.astype(np.float64)).astype(scale.dtype)


RMSNormalization = register_op(
    "RMSNormalization",
    category="norm",
    inputs=[Input("X", FLOAT), Input("scale", FLOAT)],
    outputs=["Y"],
    attrs=[Attr("axis", "int", -1), Attr("epsilon", "float", 1e-5), Attr("stash_type", "int", 1)],
    infer=_rms_infer,
    reference=_rms_ref,
    doc="x / sqrt(mean(x^2) + eps) * scale over dims axis..rank-1",
)
RMSNormalization.kernel(
    "rms_norm_numba",
    dtypes=_F32_64,
    priority=10,
    plan=_rows_plan,
    workspace=_ln_workspace,
    applies=_params_in_block,
    cold_alternative="rms_norm_numpy",
    doc="one sum-of-squares pass per row (float64), one write pass",
)(_ln_kernel(True))
RMSNormalization.kernel(
    "rms_norm_numpy",
    dtypes=_F32_64,
    priority=5,
    plan=_rows_plan,
    workspace=_ln_workspace,
    applies=_params_in_block,
    doc="numpy in float64: nothing to compile, the first run's kernel while rms_norm_numba compiles in "
    "the background (ops/tiering.py)",
)(_ln_kernel(True, numpy=True))


# -- BatchNormalization ------------------------------------------------------------------------------
def _channel_params(ctx, names, first: int) -> int:
    op = ctx.op.name
    shape = tuple(ctx.shape(0))
    if len(shape) < 2:
        raise _bad(op, f"input X must have rank >= 2 (N, C, ...), got shape {shape}")
    C = shape[1]
    for i, name in enumerate(names, start=first):
        if tuple(ctx.shape(i)) != (C,):
            raise _bad(op, f"input '{name}' must have shape ({C},) (one value per channel), got {ctx.shape(i)}")
    return C


def _bn_infer(ctx):
    op = ctx.op.name
    C = _channel_params(ctx, ("scale", "B", "input_mean", "input_var"), 1)
    if not int(ctx.attrs["training_mode"]) and ctx.num_outputs > 1:
        raise _bad(
            op,
            f"running_mean/running_var outputs exist only with training_mode=1; "
            f"got {ctx.num_outputs} outputs with training_mode=0",
        )
    return [
        TensorMeta(tuple(ctx.shape(0)), ctx.dtype(0)),
        TensorMeta((C,), ctx.dtype(3)),
        TensorMeta((C,), ctx.dtype(4)),
    ]


def _bn_ref(ins, attrs):
    x, scale, b, mean, var = ins
    w = x.astype(np.float64)
    eps = float(attrs["epsilon"])
    bshape = (1, -1) + (1,) * (x.ndim - 2)
    training = bool(attrs["training_mode"])
    if training:
        axes = (0,) + tuple(range(2, x.ndim))
        m = w.mean(axis=axes)
        v = ((w - m.reshape(bshape)) ** 2).mean(axis=axes)
    else:
        m, v = mean.astype(np.float64), var.astype(np.float64)
    y = (w - m.reshape(bshape)) / np.sqrt(v.reshape(bshape) + eps) * scale.astype(np.float64).reshape(
        bshape
    ) + b.astype(np.float64).reshape(bshape)
    if int(attrs.get("relu", 0)):
        y = np.where(y < 0, 0.0, y)  # NaN stays NaN, as Relu
    if not training:
        return y.astype(x.dtype)
    mom = float(attrs["momentum"])
    n = x.shape[0] * math.prod(x.shape[2:])
    if int(attrs.get("unbiased_running_var", 0)):
        v = v * (n / max(n - 1, 1))
    return (
        y.astype(x.dtype),
        (mean * mom + m * (1 - mom)).astype(mean.dtype),
        (var * mom + v * (1 - mom)).astype(var.dtype),
    )


def _nc_plan(ctx):
    shape = tuple(ctx.shape(0))
    N, C, S = shape[0], shape[1], math.prod(shape[2:])
    return N, C, S, N * C * S >= K.BN_PARALLEL_MIN


def _bn_kernel(ins, outs, attrs, plan, ws):
    N, C, S, par = plan
    x, scale, b, mean, var = ins
    with np.errstate(all="ignore"):
        res = K.batch_norm(
            x,
            scale,
            b,
            mean,
            var,
            outs[0],
            N,
            C,
            S,
            float(attrs["epsilon"]),
            par,
            bool(attrs["training_mode"]),
            float(attrs["momentum"]),
            bool(int(attrs["unbiased_running_var"])),
            bool(int(attrs["relu"])),
        )
    if res is not None:
        for o, r in zip(outs[1:], res):
            np.copyto(o, r, casting="unsafe")


BatchNormalization = register_op(
    "BatchNormalization",
    category="norm",
    inputs=[
        Input("X", FLOAT),
        Input("scale", FLOAT),
        Input("B", FLOAT),
        Input("input_mean", FLOAT),
        Input("input_var", FLOAT),
    ],
    outputs=["Y", Output("running_mean", optional=True), Output("running_var", optional=True)],
    attrs=[
        Attr("epsilon", "float", 1e-5),
        Attr("momentum", "float", 0.9),
        Attr("training_mode", "int", 0),
        # not ONNX's: its running update takes the population variance
        Attr(
            "unbiased_running_var",
            "int",
            0,
            doc="opsnn: 1 = running_var takes the unbiased batch variance n/(n-1) (torch), 0 = population (ONNX)",
        ),
        Attr("relu", "int", 0, doc="opsnn: 1 = Y = max(normalised, 0), a ReLU in the same pass (0: none, ONNX)"),
    ],
    infer=_bn_infer,
    reference=_bn_ref,
    doc="per-channel (axis 1) normalisation; training_mode=1 uses batch statistics and also returns "
    "running = input * momentum + batch * (1 - momentum) (population variance; unbiased_running_var=1: "
    "the unbiased one, as torch); relu=1 (opsnn) applies a ReLU to Y in the same pass",
)
BatchNormalization.kernel(
    "batch_norm_numba",
    dtypes=_F32_64_BF16,
    priority=10,
    plan=_nc_plan,
    doc="per (n, c) plane: (x - mean) * a[c] + B[c]; training stats per channel",
)(_bn_kernel)


# -- GroupNormalization / InstanceNormalization ----------------------------------------------------
def _gn_infer(ctx):
    op = ctx.op.name
    shape = tuple(ctx.shape(0))
    if len(shape) < 2:
        raise _bad(op, f"input X must have rank >= 2 (N, C, ...), got shape {shape}")
    C = shape[1]
    G = int(ctx.attrs["num_groups"])
    if G <= 0 or C % G:
        raise _bad(op, f"num_groups={G} must be positive and divide the channel count C={C}")
    for i, name in ((1, "scale"), (2, "bias")):
        if tuple(ctx.shape(i)) != (C,):
            raise _bad(op, f"input '{name}' must have shape ({C},) (per channel, opset 21), got {ctx.shape(i)}")
    return [TensorMeta(shape, ctx.dtype(0))]


def _group_ref(x, scale, bias, G, eps):
    N, C = x.shape[:2]
    w = x.astype(np.float64).reshape(N, G, -1)
    m = w.mean(axis=2, keepdims=True)
    v = ((w - m) ** 2).mean(axis=2, keepdims=True)
    y = ((w - m) / np.sqrt(v + eps)).reshape(x.shape)
    bshape = (1, C) + (1,) * (x.ndim - 2)
    y = y * scale.astype(np.float64).reshape(bshape) + bias.astype(np.float64).reshape(bshape)
    return y.astype(x.dtype)


def _gn_plan(ctx):
    shape = tuple(ctx.shape(0))
    N, C = shape[0], shape[1]
    G = int(ctx.attrs["num_groups"]) if "num_groups" in ctx.attrs else C
    return N, G, C // G if G else 0, math.prod(shape[2:]), math.prod(shape) >= K.PARALLEL_MIN


def _gn_kernel(ins, outs, attrs, plan, ws):
    N, G, Cg, S, par = plan
    K.group_norm(ins[0], ins[1], ins[2], outs[0], N, G, Cg, S, float(attrs["epsilon"]), par)


GroupNormalization = register_op(
    "GroupNormalization",
    category="norm",
    inputs=[Input("X", FLOAT), Input("scale", FLOAT), Input("bias", FLOAT)],
    outputs=["Y"],
    attrs=[Attr("epsilon", "float", 1e-5), Attr("num_groups", "int"), Attr("stash_type", "int", 1)],
    infer=_gn_infer,
    reference=lambda ins, attrs: _group_ref(ins[0], ins[1], ins[2], int(attrs["num_groups"]), float(attrs["epsilon"])),
    doc="statistics per (sample, group of C/num_groups channels); scale/bias per channel (opset 21)",
)
GroupNormalization.kernel(
    "group_norm_numba",
    dtypes=_F32_64,
    priority=10,
    plan=_gn_plan,
    doc="one stats pass per (n, g) row, per-channel affine write pass",
)(_gn_kernel)


def _in_infer(ctx):
    _channel_params(ctx, ("scale", "B"), 1)
    return [TensorMeta(tuple(ctx.shape(0)), ctx.dtype(0))]


InstanceNormalization = register_op(
    "InstanceNormalization",
    category="norm",
    inputs=[Input("input", FLOAT), Input("scale", FLOAT), Input("B", FLOAT)],
    outputs=["output"],
    attrs=[Attr("epsilon", "float", 1e-5)],
    infer=_in_infer,
    reference=lambda ins, attrs: _group_ref(ins[0], ins[1], ins[2], ins[0].shape[1], float(attrs["epsilon"])),
    doc="statistics per (sample, channel) over the spatial dims; scale/B per channel",
)
InstanceNormalization.kernel(
    "instance_norm_numba", dtypes=_F32_64, priority=10, plan=_gn_plan, doc="group norm with one channel per group"
)(_gn_kernel)


# -- LpNormalization / MeanVarianceNormalization / LRN (rarely hot: numpy kernels) -----------------
def _lp_infer(ctx):
    op = ctx.op.name
    shape = tuple(ctx.shape(0))
    _norm_axis(op, int(ctx.attrs["axis"]), len(shape))
    if int(ctx.attrs["p"]) not in (1, 2):
        raise _bad(op, f"attribute 'p' must be 1 or 2, got {ctx.attrs['p']}")
    return [TensorMeta(shape, ctx.dtype(0))]


def _lp_ref(ins, attrs):
    x = ins[0]
    axis = int(attrs["axis"]) % x.ndim
    p = int(attrs["p"])
    w = x.astype(np.float64)
    norm = (np.abs(w) ** p).sum(axis=axis, keepdims=True) ** (1.0 / p)
    safe = np.where(norm == 0, 1.0, norm)
    return np.where(norm == 0, 0.0, w / safe).astype(x.dtype)


LpNormalization = register_op(
    "LpNormalization",
    category="norm",
    inputs=[Input("input", FLOAT)],
    outputs=["output"],
    attrs=[Attr("axis", "int", -1), Attr("p", "int", 2)],
    infer=_lp_infer,
    reference=_lp_ref,
    doc="x / ||x||_p along axis (p in {1, 2}); 0 where the norm is 0",
)
LpNormalization.kernel(
    "lp_norm_numpy",
    dtypes=_F32_64,
    priority=5,
    plan=lambda ctx: (int(ctx.attrs["axis"]) % len(ctx.shape(0)), int(ctx.attrs["p"])),
)(lambda ins, outs, attrs, plan, ws: K.lp_normalize(ins[0], outs[0], plan[0], plan[1]))


def _mvn_axes(ctx) -> tuple:
    op = ctx.op.name
    rank = len(ctx.shape(0))
    axes = [_norm_axis(op, int(a), rank, "axes") for a in ctx.attrs["axes"]]
    if len(set(axes)) != len(axes):
        raise _bad(op, f"attribute 'axes' has duplicates: {list(ctx.attrs['axes'])}")
    return tuple(sorted(axes))


def _mvn_ref(ins, attrs):
    x = ins[0]
    axes = tuple(int(a) % x.ndim for a in attrs["axes"])
    w = x.astype(np.float64)
    m = w.mean(axis=axes, keepdims=True)
    var = (w * w).mean(axis=axes, keepdims=True) - m * m
    return ((w - m) / (np.sqrt(np.maximum(var, 0.0)) + 1e-9)).astype(x.dtype)


MeanVarianceNormalization = register_op(
    "MeanVarianceNormalization",
    category="norm",
    inputs=[Input("X", FLOAT)],
    outputs=["Y"],
    attrs=[Attr("axes", "ints", (0, 2, 3))],
    infer=lambda ctx: (_mvn_axes(ctx), [TensorMeta(tuple(ctx.shape(0)), ctx.dtype(0))])[1],
    reference=_mvn_ref,
    doc="(x - mean) / (sqrt(var) + 1e-9) over axes",
)
MeanVarianceNormalization.kernel("mvn_numpy", dtypes=_F32_64, priority=5, plan=_mvn_axes)(
    lambda ins, outs, attrs, plan, ws: K.mean_variance_normalize(ins[0], outs[0], plan)
)


def _lrn_infer(ctx):
    op = ctx.op.name
    shape = tuple(ctx.shape(0))
    if len(shape) < 2:
        raise _bad(op, f"input X must have rank >= 2 (N, C, ...), got shape {shape}")
    if int(ctx.attrs["size"]) < 1:
        raise _bad(op, f"attribute 'size' must be >= 1, got {ctx.attrs['size']}")
    return [TensorMeta(shape, ctx.dtype(0))]


def _lrn_ref(ins, attrs):
    x = ins[0]
    size = int(attrs["size"])
    w = x.astype(np.float64)
    C = x.shape[1]
    sq = np.zeros_like(w)
    for c in range(C):
        lo = max(0, c - (size - 1) // 2)
        hi = min(C - 1, c + math.ceil((size - 1) / 2))
        sq[:, c] = (w[:, lo : hi + 1] ** 2).sum(axis=1)
    y = w / (float(attrs["bias"]) + float(attrs["alpha"]) / size * sq) ** float(attrs["beta"])
    return y.astype(x.dtype)


LRN = register_op(
    "LRN",
    category="norm",
    inputs=[Input("X", FLOAT)],
    outputs=["Y"],
    attrs=[Attr("alpha", "float", 1e-4), Attr("beta", "float", 0.75), Attr("bias", "float", 1.0), Attr("size", "int")],
    infer=_lrn_infer,
    reference=_lrn_ref,
    doc="x / (bias + alpha/size * sum of x^2 over a window of `size` channels)^beta",
)
LRN.kernel("lrn_numpy", dtypes=_F32_64, priority=5)(
    lambda ins, outs, attrs, plan, ws: K.lrn(
        ins[0], outs[0], int(attrs["size"]), float(attrs["alpha"]), float(attrs["beta"]), float(attrs["bias"])
    )
)


# -- functional entry points (torch-style) ----------------------------------------------------------
def _ones(shape, dtype):
    return np.ones(shape, dtype=dtype)


def _zeros(shape, dtype):
    return np.zeros(shape, dtype=dtype)


def _normalized_axis(name: str, t, normalized_shape) -> int:
    if (
        type(normalized_shape) not in (tuple, list, int)
        and hasattr(normalized_shape, "shape")
        and hasattr(normalized_shape, "dtype")
    ):  # a tensor where dims belong
        raise ParamInvalidError(
            f"{name}: normalized_shape must be an int or a tuple of ints (the trailing dims, "
            f"e.g. {tuple(t.shape[-1:])}), got a {type(normalized_shape).__name__} of shape "
            f"{tuple(normalized_shape.shape)}; pass weight= and bias= by keyword"
        )
    ns = (normalized_shape,) if isinstance(normalized_shape, (int, np.integer)) else tuple(normalized_shape)
    k = len(ns)
    if k == 0 or k > t.ndim or tuple(t.shape[t.ndim - k :]) != tuple(int(n) for n in ns):
        raise ParamInvalidError(
            f"{name}: normalized_shape {ns} must equal the trailing dims of the input shape {t.shape}"
        )
    return t.ndim - k


@api("layer_norm", "LayerNormalization")
def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Layer normalization over the trailing ``normalized_shape`` dims (like
    ``torch.nn.functional.layer_norm``). ``opsnn.ops.layer_norm(x, (768,), w, b)``"""
    t = as_tensor(x)
    axis = _normalized_axis("layer_norm", t, normalized_shape)
    if weight is None:
        weight = _ones(t.shape[axis:], t.dtype)
    return [t, weight, bias], {"axis": axis, "epsilon": float(eps)}


@api("rms_norm", "RMSNormalization")
def rms_norm(x, normalized_shape, weight=None, eps=None):
    """RMS normalization over the trailing ``normalized_shape`` dims (like
    ``torch.nn.functional.rms_norm``; ``eps=None`` means the dtype's machine epsilon)."""
    t = as_tensor(x)
    axis = _normalized_axis("rms_norm", t, normalized_shape)
    if weight is None:
        weight = _ones(t.shape[axis:], t.dtype)
    if eps is None:
        eps = float(ml_dtypes.finfo(t.dtype).eps)  # numpy's finfo does not know bfloat16
    return [t, weight], {"axis": axis, "epsilon": float(eps)}


@api("batch_norm", "BatchNormalization")
def batch_norm(
    x,
    running_mean,
    running_var,
    weight=None,
    bias=None,
    training=False,
    momentum=0.1,
    eps=1e-5,
    unbiased_running_var=False,
    relu=False,
):
    """Batch normalization over channel dim 1 (like ``torch.nn.functional.batch_norm``).
    Inference returns y. ``training=True`` normalises with the batch statistics and returns
    ``(y, new_running_mean, new_running_var)`` (nothing is modified in place); ``momentum`` is
    torch's (weight of the batch statistic). The running variance takes the population batch
    variance (ONNX), or the unbiased one with ``unbiased_running_var=True`` (torch's buffers).
    ``relu=True``: ``max(y, 0)`` in the same pass (and one backward op through both)."""
    t = as_tensor(x)
    if t.ndim < 2:
        raise ParamInvalidError(f"batch_norm: input must have rank >= 2 (N, C, ...), got shape {t.shape}")
    C = t.shape[1]
    weight = _ones((C,), t.dtype) if weight is None else weight
    bias = _zeros((C,), t.dtype) if bias is None else bias
    attrs = {"epsilon": float(eps), "momentum": 1.0 - float(momentum), "training_mode": int(bool(training))}
    if training and unbiased_running_var:
        attrs["unbiased_running_var"] = 1
    if relu:
        attrs["relu"] = 1
    return [t, weight, bias, running_mean, running_var], attrs, (3 if training else 1)


@api("group_norm", "GroupNormalization")
def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    """Group normalization (like ``torch.nn.functional.group_norm``): statistics per sample
    and group of channels, per-channel ``weight``/``bias``."""
    t = as_tensor(x)
    if t.ndim < 2:
        raise ParamInvalidError(f"group_norm: input must have rank >= 2 (N, C, ...), got shape {t.shape}")
    C = t.shape[1]
    weight = _ones((C,), t.dtype) if weight is None else weight
    bias = _zeros((C,), t.dtype) if bias is None else bias
    return [t, weight, bias], {"num_groups": int(num_groups), "epsilon": float(eps)}


@api("instance_norm", "InstanceNormalization")
def instance_norm(x, weight=None, bias=None, eps=1e-5):
    """Instance normalization: statistics per (sample, channel) over the spatial dims."""
    t = as_tensor(x)
    if t.ndim < 2:
        raise ParamInvalidError(f"instance_norm: input must have rank >= 2 (N, C, ...), got shape {t.shape}")
    C = t.shape[1]
    weight = _ones((C,), t.dtype) if weight is None else weight
    bias = _zeros((C,), t.dtype) if bias is None else bias
    return [t, weight, bias], {"epsilon": float(eps)}


# -- backward ops (domain opsnn: the gradient rules' kernels) ---------------------------------------
def _bad_grad_input(op: str, ctx, what: str = "X") -> None:
    """dY must match X in shape and dtype."""
    if tuple(ctx.shape(0)) != tuple(ctx.shape(1)):
        raise _bad(op, f"input 'dY' has shape {tuple(ctx.shape(0))}; expected {what}'s shape {tuple(ctx.shape(1))}")
    if ctx.dtype(0) != ctx.dtype(1):
        raise _bad(op, f"input 'dY' has dtype {_dt.name(ctx.dtype(0))}; expected {what}'s {_dt.name(ctx.dtype(1))}")


def _unbroadcast_np(a: np.ndarray, shape: tuple) -> np.ndarray:
    """``a`` summed over the dims broadcasting added or stretched to reach ``a.shape`` from ``shape``
    (``shape`` may also have more leading 1s than ``a`` has dims)."""
    if a.ndim < len(shape):
        a = a.reshape((1,) * (len(shape) - a.ndim) + a.shape)
    lead = a.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape) if s == 1 and a.shape[lead + i] != 1)
    return a.sum(axis=axes, keepdims=True).reshape(shape) if axes else a.reshape(shape)


def _mean(a: np.ndarray, axes) -> np.ndarray:
    """The mean over ``axes`` (kept); NaN over an empty extent, without numpy's empty-slice warning."""
    axes = (axes,) if isinstance(axes, int) else tuple(axes)
    return a.sum(axis=axes, keepdims=True) / math.prod(a.shape[k] for k in axes)


def _ln_grad_infer(ctx):
    op = ctx.op.name
    _bad_grad_input(op, ctx)
    shape = tuple(ctx.shape(1))
    axis = _norm_axis(op, int(ctx.attrs["axis"]), len(shape))
    _unidirectional(op, "Scale", ctx.shape(2), shape)
    outs = [TensorMeta(shape, ctx.dtype(0)), TensorMeta(tuple(ctx.shape(2)), ctx.dtype(2))]
    if op == "LayerNormalizationGrad":
        outs.append(TensorMeta(shape[axis:], ctx.dtype(0)))
    return outs


def _ln_grad_ref(ins, attrs, rms: bool):
    with np.errstate(all="ignore"):  # NaN/Inf inputs give NaN/Inf, as the kernels do
        g, x, scale = (a.astype(np.float64) for a in ins[:3])
        axis = int(attrs["axis"]) % x.ndim
        axes = tuple(range(axis, x.ndim))
        if rms:
            mean = 0.0
            var = _mean(x * x, axes)
        else:
            mean = _mean(x, axes)
            var = _mean((x - mean) ** 2, axes)
        rstd = 1.0 / np.sqrt(var + float(attrs["epsilon"]))
        xhat = (x - mean) * rstd
        gh = g * scale
        a = 0.0 if rms else _mean(gh, axes)
        dx = rstd * (gh - a - xhat * _mean(gh * xhat, axes))
        res = [dx.astype(ins[0].dtype), _unbroadcast_np(g * xhat, ins[2].shape).astype(ins[2].dtype)]
        if not rms:
            res.append(g.sum(axis=tuple(range(axis))).astype(ins[0].dtype))  # (reshape(-1, ...) fails on empty x)
        return tuple(res)


def _ln_grad_plan(ctx):
    """(rows, N, parallel, chunks): rows split into ``chunks`` that each own partial dScale/dBias sums."""
    shape = tuple(ctx.shape(1))
    axis = _norm_axis(ctx.op.name, int(ctx.attrs["axis"]), len(shape))
    rows, N = math.prod(shape[:axis]), math.prod(shape[axis:])
    par = rows * N >= K.PARALLEL_MIN
    chunks = KB.row_chunks(rows) if par else 1
    return rows, N, par, chunks


def _ln_grad_applies(ctx):
    shape = tuple(ctx.shape(1))
    axis = _norm_axis(ctx.op.name, int(ctx.attrs["axis"]), len(shape))
    s = list(ctx.shape(2))
    while s and s[0] == 1:
        s.pop(0)
    if len(s) > len(shape) - axis:
        return f"Scale varies over the non-normalized dims (shape {ctx.shape(2)})"
    return True


def _ln_grad_kernel(rms: bool):
    def run(ins, outs, attrs, plan, ws):
        rows, N, par, chunks = plan
        g, x, scale = ins[0], ins[1], ins[2]
        axis = int(attrs["axis"]) % x.ndim
        sv = _block_vector(scale, x.shape, axis).astype(x.dtype, copy=False)  # a 16-bit scale beside widened data
        n = 2 * chunks * N
        part = (ws[: 8 * n].view(np.float64) if ws is not None else np.empty(n)).reshape(chunks, 2, N)
        dsc, dbi = KB.layer_norm_backward(g, x, sv, outs[0], part, rows, N, float(attrs["epsilon"]), rms, par)
        block = x.shape[axis:]
        np.copyto(outs[1], _unbroadcast_np(dsc.reshape(block), outs[1].shape), casting="unsafe")
        if not rms:
            np.copyto(outs[2], dbi.reshape(block), casting="unsafe")

    return run


def _grad_doc(what: str) -> str:
    return f"{what}; statistics recomputed from X in float64"


LayerNormalizationGrad = register_op(
    "LayerNormalizationGrad",
    domain="opsnn",
    category="norm",
    inputs=[Input("dY", FLOAT), Input("X", FLOAT), Input("Scale", FLOAT)],
    outputs=["dX", "dScale", "dBias"],
    attrs=[Attr("axis", "int", -1), Attr("epsilon", "float", 1e-5)],
    infer=_ln_grad_infer,
    reference=lambda ins, attrs: _ln_grad_ref(ins, attrs, False),
    doc=_grad_doc("gradients of LayerNormalization (dX; dScale of Scale's shape; dBias over dims axis..)"),
)
LayerNormalizationGrad.kernel(
    "layer_norm_grad_numba",
    dtypes=_F32_64,
    priority=10,
    plan=_ln_grad_plan,
    workspace=lambda ctx, plan: 16 * plan[3] * plan[1],
    applies=_ln_grad_applies,
    doc="per row: statistics, then the two row sums, then dX; dScale/dBias summed per chunk of rows",
)(_ln_grad_kernel(False))

RMSNormalizationGrad = register_op(
    "RMSNormalizationGrad",
    domain="opsnn",
    category="norm",
    inputs=[Input("dY", FLOAT), Input("X", FLOAT), Input("scale", FLOAT)],
    outputs=["dX", "dScale"],
    attrs=[Attr("axis", "int", -1), Attr("epsilon", "float", 1e-5)],
    infer=_ln_grad_infer,
    reference=lambda ins, attrs: _ln_grad_ref(ins, attrs, True),
    doc=_grad_doc("gradients of RMSNormalization (dX; dScale of scale's shape)"),
)
RMSNormalizationGrad.kernel(
    "rms_norm_grad_numba",
    dtypes=_F32_64,
    priority=10,
    plan=_ln_grad_plan,
    workspace=lambda ctx, plan: 16 * plan[3] * plan[1],
    applies=_ln_grad_applies,
    doc="per row: sum of squares, the row sum, then dX; dScale summed per chunk of rows",
)(_ln_grad_kernel(True))


def _bn_grad_infer(ctx):
    op = ctx.op.name
    _bad_grad_input(op, ctx)
    shape = tuple(ctx.shape(1))
    if len(shape) < 2:
        raise _bad(op, f"input X must have rank >= 2 (N, C, ...), got shape {shape}")
    C = shape[1]
    names = ("scale", "input_mean", "input_var")
    for i, name in enumerate(names, start=2):
        if ctx.has(i) and tuple(ctx.shape(i)) != (C,):
            raise _bad(op, f"input '{name}' must have shape ({C},) (one value per channel), got {ctx.shape(i)}")
    if not int(ctx.attrs["training_mode"]) and not (ctx.has(3) and ctx.has(4)):
        raise _bad(op, "inputs 'input_mean' and 'input_var' are required with training_mode=0; got None")
    if int(ctx.attrs["relu"]):
        if not ctx.has(5):
            raise _bad(op, "input 'Y' (the forward's output) is required with relu=1; got None")
        if tuple(ctx.shape(5)) != shape or ctx.dtype(5) != ctx.dtype(1):
            raise _bad(
                op,
                f"input 'Y' must have X's shape {shape} and dtype {ctx.dtype(1)}, got {tuple(ctx.shape(5))} "
                f"{ctx.dtype(5)}",
            )
    return [TensorMeta(shape, ctx.dtype(0)), TensorMeta((C,), ctx.dtype(2)), TensorMeta((C,), ctx.dtype(2))]


def _bn_grad_ref(ins, attrs):
    with np.errstate(all="ignore"):  # NaN/Inf inputs give NaN/Inf, as the kernels do
        g, x, scale = (a.astype(np.float64) for a in ins[:3])
        if int(attrs.get("relu", 0)):
            g = np.where(ins[5] > 0, g, 0.0)
        axes = (0,) + tuple(range(2, x.ndim))
        bshape = (1, -1) + (1,) * (x.ndim - 2)
        eps = float(attrs["epsilon"])
        training = bool(int(attrs["training_mode"]))
        if training:
            m = _mean(x, axes)
            v = _mean((x - m) ** 2, axes)
        else:
            m = ins[3].astype(np.float64).reshape(bshape)
            v = ins[4].astype(np.float64).reshape(bshape)
        rstd = 1.0 / np.sqrt(v + eps)
        xhat = (x - m) * rstd
        gh = g * scale.reshape(bshape)
        if training:
            dx = rstd * (gh - _mean(gh, axes) - xhat * _mean(gh * xhat, axes))
        else:
            dx = gh * rstd
        return (
            dx.astype(ins[0].dtype),
            (g * xhat).sum(axis=axes).astype(ins[2].dtype),
            g.sum(axis=axes).astype(ins[2].dtype),
        )


def _bn_grad_kernel(ins, outs, attrs, plan, ws):
    N, C, S, par = plan
    g, x, scale = ins[0], ins[1], ins[2]
    training = bool(int(attrs["training_mode"]))
    mean = var = None
    if not training:
        mean, var = ins[3].astype(np.float64), ins[4].astype(np.float64)
    st = ws[: 40 * C].view(np.float64).reshape(C, 5) if ws is not None else np.empty((C, 5))
    y = ins[5] if int(attrs["relu"]) else None
    with np.errstate(all="ignore"):
        dsc, dbi = KB.batch_norm_backward(
            g, x, scale.astype(np.float64), mean, var, outs[0], st, N, C, S, float(attrs["epsilon"]), par, training, y
        )
    np.copyto(outs[1], dsc, casting="unsafe")
    np.copyto(outs[2], dbi, casting="unsafe")
    inf = np.isinf(scale)
    if inf.any():
        # the kernel applies scale after its sums; an infinite scale must multiply dY first, as the
        # definition does (inf * dY of mixed signs sums to NaN where scale * sum(dY) is +-inf)
        full = list(ins[:5]) + [None] * (5 - len(ins)) + [y]  # dY, X, scale, mean, var, Y
        part = [None if a is None else a[inf] if a.ndim == 1 else a[:, inf] for a in full]
        outs[0][:, inf] = _bn_grad_ref(part, attrs)[0]


def _bn_grad_plan(ctx):
    shape = tuple(ctx.shape(1))
    N, C, S = shape[0], shape[1], math.prod(shape[2:])
    return N, C, S, N * C * S >= K.BN_PARALLEL_MIN


BatchNormalizationGrad = register_op(
    "BatchNormalizationGrad",
    domain="opsnn",
    category="norm",
    inputs=[
        Input("dY", FLOAT),
        Input("X", FLOAT),
        Input("scale", FLOAT),
        Input("input_mean", FLOAT, optional=True),
        Input("input_var", FLOAT, optional=True),
        Input("Y", FLOAT, optional=True),
    ],
    outputs=["dX", "dScale", "dBias"],
    attrs=[
        Attr("epsilon", "float", 1e-5),
        Attr("training_mode", "int", 1),
        Attr("relu", "int", 0, doc="1: the forward had relu=1; dY counts only where its output Y > 0"),
    ],
    infer=_bn_grad_infer,
    reference=_bn_grad_ref,
    doc="gradients of BatchNormalization (channel axis 1): training_mode=1 through the batch statistics "
    "(recomputed from X in float64), 0 with input_mean/input_var fixed; relu=1: through the fused ReLU "
    "too (dY masked where Y <= 0)",
)
BatchNormalizationGrad.kernel(
    "batch_norm_grad_numba",
    dtypes=_F32_64_BF16,
    priority=10,
    plan=_bn_grad_plan,
    workspace=lambda ctx, plan: 40 * plan[1],
    doc="two passes: per-channel statistics and sums of dY, dY*xhat (parallel over channels), then dX "
    "(parallel over (n, c) planes)",
)(_bn_grad_kernel)


def _gn_grad_infer(ctx):
    op = ctx.op.name
    _bad_grad_input(op, ctx)
    shape = tuple(ctx.shape(1))
    if len(shape) < 2:
        raise _bad(op, f"input X must have rank >= 2 (N, C, ...), got shape {shape}")
    C = shape[1]
    G = int(ctx.attrs["num_groups"])
    if G <= 0 or C % G:
        raise _bad(op, f"num_groups={G} must be positive and divide the channel count C={C}")
    if tuple(ctx.shape(2)) != (C,):
        raise _bad(op, f"input 'scale' must have shape ({C},) (per channel), got {ctx.shape(2)}")
    return [TensorMeta(shape, ctx.dtype(0)), TensorMeta((C,), ctx.dtype(2)), TensorMeta((C,), ctx.dtype(2))]


def _gn_grad_ref(ins, attrs):
    with np.errstate(all="ignore"):  # NaN/Inf inputs give NaN/Inf, as the kernels do
        g, x, scale = (a.astype(np.float64) for a in ins[:3])
        N, C = x.shape[:2]
        G = int(attrs["num_groups"])
        bshape = (1, C) + (1,) * (x.ndim - 2)
        xg = x.reshape(N, G, -1)
        m = _mean(xg, 2)
        v = _mean((xg - m) ** 2, 2)
        rstd = 1.0 / np.sqrt(v + float(attrs["epsilon"]))
        xhat = ((xg - m) * rstd).reshape(x.shape)
        gh = (g * scale.reshape(bshape)).reshape(N, G, -1)
        xh = xhat.reshape(N, G, -1)
        dx = rstd * (gh - _mean(gh, 2) - xh * _mean(gh * xh, 2))
        axes = (0,) + tuple(range(2, x.ndim))
        return (
            dx.reshape(x.shape).astype(ins[0].dtype),
            (g * xhat).sum(axis=axes).astype(ins[2].dtype),
            g.sum(axis=axes).astype(ins[2].dtype),
        )


def _gn_grad_plan(ctx):
    shape = tuple(ctx.shape(1))
    N, C = shape[0], shape[1]
    G = int(ctx.attrs["num_groups"])
    return N, G, C // G, math.prod(shape[2:]), math.prod(shape) >= K.PARALLEL_MIN


def _gn_grad_kernel(ins, outs, attrs, plan, ws):
    N, G, Cg, S, par = plan
    g, x, scale = ins[0], ins[1], ins[2]
    C = G * Cg
    part = ws[: 16 * N * C].view(np.float64).reshape(N, C, 2) if ws is not None else np.empty((N, C, 2))
    dsc, dbi = KB.group_norm_backward(
        g, x, scale.astype(np.float64), outs[0], part, N, G, Cg, S, float(attrs["epsilon"]), par
    )
    np.copyto(outs[1], dsc, casting="unsafe")
    np.copyto(outs[2], dbi, casting="unsafe")


GroupNormalizationGrad = register_op(
    "GroupNormalizationGrad",
    domain="opsnn",
    category="norm",
    inputs=[Input("dY", FLOAT), Input("X", FLOAT), Input("scale", FLOAT)],
    outputs=["dX", "dScale", "dBias"],
    attrs=[Attr("epsilon", "float", 1e-5), Attr("num_groups", "int")],
    infer=_gn_grad_infer,
    reference=_gn_grad_ref,
    doc=_grad_doc("gradients of GroupNormalization (and of InstanceNormalization: num_groups = C)"),
)
GroupNormalizationGrad.kernel(
    "group_norm_grad_numba",
    dtypes=_F32_64,
    priority=10,
    plan=_gn_grad_plan,
    workspace=lambda ctx, plan: 16 * plan[0] * plan[1] * plan[2],
    doc="per (n, group) row: statistics, per-channel sums of dY and dY*xhat, then dX",
)(_gn_grad_kernel)


@api("layer_norm_backward", "LayerNormalizationGrad", domain="opsnn")
def layer_norm_backward(grad_output, x, normalized_shape, weight=None, eps=1e-5):
    """Gradients ``(dx, dweight, dbias)`` of :func:`layer_norm` for the output gradient
    ``grad_output`` (statistics recomputed from ``x``).
    ``dx, dw, db = opsnn.ops.layer_norm_backward(dy, x, (768,), w)``"""
    t = as_tensor(x)
    axis = _normalized_axis("layer_norm_backward", t, normalized_shape)
    if weight is None:
        weight = _ones(t.shape[axis:], t.dtype)
    return [grad_output, t, weight], {"axis": axis, "epsilon": float(eps)}, 3


@api("rms_norm_backward", "RMSNormalizationGrad", domain="opsnn")
def rms_norm_backward(grad_output, x, normalized_shape, weight=None, eps=None):
    """Gradients ``(dx, dweight)`` of :func:`rms_norm` (``eps=None``: the dtype's machine epsilon)."""
    t = as_tensor(x)
    axis = _normalized_axis("rms_norm_backward", t, normalized_shape)
    if weight is None:
        weight = _ones(t.shape[axis:], t.dtype)
    if eps is None:
        eps = float(ml_dtypes.finfo(t.dtype).eps)
    return [grad_output, t, weight], {"axis": axis, "epsilon": float(eps)}, 2


@api("batch_norm_backward", "BatchNormalizationGrad", domain="opsnn")
def batch_norm_backward(
    grad_output, x, weight=None, running_mean=None, running_var=None, training=True, eps=1e-5, y=None
):
    """Gradients ``(dx, dweight, dbias)`` of :func:`batch_norm`: ``training=True`` through the
    batch statistics, else with ``running_mean``/``running_var`` fixed; ``y``: the output of a
    ``relu=True`` batch norm (the gradient then goes through its ReLU too)."""
    t = as_tensor(x)
    if t.ndim < 2:
        raise ParamInvalidError(f"batch_norm_backward: input must have rank >= 2 (N, C, ...), got shape {t.shape}")
    weight = _ones((t.shape[1],), t.dtype) if weight is None else weight
    attrs = {"epsilon": float(eps), "training_mode": int(bool(training))}
    if y is None:
        return [grad_output, t, weight, running_mean, running_var], attrs, 3
    attrs["relu"] = 1
    return [grad_output, t, weight, running_mean, running_var, y], attrs, 3


@api("group_norm_backward", "GroupNormalizationGrad", domain="opsnn")
def group_norm_backward(grad_output, x, num_groups, weight=None, eps=1e-5):
    """Gradients ``(dx, dweight, dbias)`` of :func:`group_norm`."""
    t = as_tensor(x)
    if t.ndim < 2:
        raise ParamInvalidError(f"group_norm_backward: input must have rank >= 2 (N, C, ...), got shape {t.shape}")
    weight = _ones((t.shape[1],), t.dtype) if weight is None else weight
    return [grad_output, t, weight], {"num_groups": int(num_groups), "epsilon": float(eps)}, 3


__all__ = [
    "layer_norm",
    "rms_norm",
    "batch_norm",
    "group_norm",
    "instance_norm",
    "layer_norm_backward",
    "rms_norm_backward",
    "batch_norm_backward",
    "group_norm_backward",
]
