"""Random ops: RandomNormal, RandomUniform, their ``*Like`` forms, Bernoulli and Multinomial
(ONNX opset 22), drawn with numpy's ``Generator`` (PCG64).

With a ``seed`` attribute every run draws the same values (a fresh generator seeded from
the float's bits, so ``seed=1.0`` and ``seed=1.5`` differ); without one each run draws
fresh entropy. ``dtype`` attributes take ONNX ``TensorProto`` codes (1 float, 10 float16,
11 double, 16 bfloat16, 6 int32, 7 int64, ...); the entry points also accept dtype names.

>>> import opsnn
>>> x = opsnn.ops.random_normal((2, 3), seed=0)
>>> x.shape, str(x.dtype)
((2, 3), 'float32')
"""

from __future__ import annotations

import math

import numpy as np

from ... import dtypes as _dt
from ...errors import DTypeError, ParamInvalidError
from ...kernels.cpu import dropout as KD
from ...tensor import Tensor
from ..api import api
from ..registry import REQUIRED, Attr, Input, Output, TensorMeta, register_op
from .elementwise import ONNX_DTYPES
from .shape import _to_tensor

FLOAT = _dt.FLOATS
_CODES = {v: k for k, v in ONNX_DTYPES.items() if v is not None}


def _dtype(op: str, code, allowed, what="dtype") -> np.dtype:
    try:
        dt = ONNX_DTYPES[int(code)]
    except (KeyError, TypeError, ValueError):
        dt = None
    if dt is None:
        raise DTypeError(
            f"{op}: attribute {what!r} must be an ONNX TensorProto code among "
            f"{sorted(c for c, d in ONNX_DTYPES.items() if d is not None and d in allowed)}, got {code!r}",
            op=op,
        )
    if dt not in allowed:
        raise DTypeError(
            f"{op}: output dtype {_dt.name(dt)} is not supported; expected one of {[_dt.name(d) for d in allowed]}",
            op=op,
        )
    return dt


def _code(dtype) -> int | None:
    """An entry point's dtype argument (name, numpy dtype or TensorProto code) as a code."""
    if dtype is None:
        return None
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        return int(dtype)
    dt = _dt.get(dtype)
    if dt not in _CODES:
        raise DTypeError(f"random: unsupported dtype {_dt.name(dt)}")
    return _CODES[dt]


def generator(seed) -> np.random.Generator:
    """The generator a run draws from: deterministic for a seed, fresh entropy without one."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng(int(np.array(float(seed), np.float64).view(np.uint64)))


def _out_dtype(ctx, allowed, default_from_input=False) -> np.dtype:
    code = ctx.attrs.get("dtype")
    if code is None and default_from_input:
        dt = ctx.dtype(0)
        if dt not in allowed:
            raise DTypeError(
                f"{ctx.op.name}: input dtype {_dt.name(dt)} is not a valid output dtype and no "
                f"'dtype' attribute was given; expected one of {[_dt.name(d) for d in allowed]}",
                op=ctx.op.name,
            )
        return dt
    return _dtype(ctx.op.name, code, allowed)


def _shape_attr(op, shape) -> tuple:
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ParamInvalidError(f"{op}: attribute 'shape' must be non-negative, got {shape}", op=op)
    return shape


def _check_range(ctx):
    a = ctx.attrs
    if "high" in a and not float(a["high"]) >= float(a["low"]):
        raise ParamInvalidError(
            f"{ctx.op.name}: attribute 'high' ({a['high']}) must be >= 'low' ({a['low']})", op=ctx.op.name
        )


def _infer_fixed(ctx):
    _check_range(ctx)
    return [TensorMeta(_shape_attr(ctx.op.name, ctx.attrs["shape"]), _out_dtype(ctx, FLOAT))]


def _infer_like(ctx):
    _check_range(ctx)
    return [TensorMeta(tuple(ctx.shape(0)), _out_dtype(ctx, FLOAT, default_from_input=True))]


def _draw(op, attrs, shape, dtype, rng):
    gdt = np.float64 if dtype == _dt.float64 else np.float32
    if op.startswith("RandomNormal"):
        v = rng.standard_normal(shape, dtype=gdt)
        return v * gdt(attrs["scale"]) + gdt(attrs["mean"])
    lo, hi = float(attrs["low"]), float(attrs["high"])
    return rng.random(shape, dtype=gdt) * gdt(hi - lo) + gdt(lo)


def _reference_dist(op):
    def ref(ins, attrs):
        shape = tuple(ins[0].shape) if ins else tuple(int(s) for s in attrs["shape"])
        code = attrs.get("dtype")
        dt = ins[0].dtype if code is None else ONNX_DTYPES[int(code)]
        return _draw(op, attrs, shape, dt, generator(attrs.get("seed"))).astype(dt)

    return ref


def _dist_kernel(ins, outs, attrs, plan, ws):
    out = outs[0]
    out[...] = _draw(plan, attrs, out.shape, out.dtype, generator(attrs.get("seed")))


def _op_name_plan(ctx):
    return ctx.op.name


_NORMAL = [
    Attr("dtype", "int", 1),
    Attr("mean", "float", 0.0),
    Attr("scale", "float", 1.0),
    Attr("seed", "float", None),
    Attr("shape", "ints", REQUIRED),
]
_UNIFORM = [
    Attr("dtype", "int", 1),
    Attr("high", "float", 1.0),
    Attr("low", "float", 0.0),
    Attr("seed", "float", None),
    Attr("shape", "ints", REQUIRED),
]


def _like(attrs):
    return [a if a.name != "dtype" else Attr("dtype", "int", None) for a in attrs if a.name != "shape"]


RandomNormal = register_op(
    "RandomNormal",
    category="random",
    inputs=[],
    outputs=["output"],
    attrs=_NORMAL,
    infer=_infer_fixed,
    reference=_reference_dist("RandomNormal"),
    doc="samples of N(mean, scale^2)",
)
RandomUniform = register_op(
    "RandomUniform",
    category="random",
    inputs=[],
    outputs=["output"],
    attrs=_UNIFORM,
    infer=_infer_fixed,
    reference=_reference_dist("RandomUniform"),
    doc="samples of U[low, high)",
)
RandomNormalLike = register_op(
    "RandomNormalLike",
    category="random",
    inputs=[Input("input")],
    outputs=["output"],
    attrs=_like(_NORMAL),
    infer=_infer_like,
    reference=_reference_dist("RandomNormalLike"),
    doc="RandomNormal with the input's shape (and dtype unless given)",
)
RandomUniformLike = register_op(
    "RandomUniformLike",
    category="random",
    inputs=[Input("input")],
    outputs=["output"],
    attrs=_like(_UNIFORM),
    infer=_infer_like,
    reference=_reference_dist("RandomUniformLike"),
    doc="RandomUniform with the input's shape (and dtype unless given)",
)
for _rec in (RandomNormal, RandomUniform, RandomNormalLike, RandomUniformLike):
    # dtypes=None: the generator writes every float dtype itself (no fp32 adapter needed)
    _rec.kernel("random_numpy", priority=10, plan=_op_name_plan, doc="numpy Generator (PCG64)")(_dist_kernel)


# -- Bernoulli ------------------------------------------------------------------------------------------
_BERNOULLI_OUT = FLOAT + _dt.INTEGERS + (_dt.bool_,)


def _infer_bernoulli(ctx):
    return [TensorMeta(tuple(ctx.shape(0)), _out_dtype(ctx, _BERNOULLI_OUT, default_from_input=True))]


def _bernoulli_ref(ins, attrs):
    p = ins[0].astype(np.float64)
    code = attrs.get("dtype")
    dt = ins[0].dtype if code is None else ONNX_DTYPES[int(code)]
    u = generator(attrs.get("seed")).random(p.shape)
    return (u < p).astype(dt)


def _bernoulli(ins, outs, attrs, plan, ws):
    p = ins[0]
    gdt = np.float64 if p.dtype == _dt.float64 else np.float32
    u = generator(attrs.get("seed")).random(p.shape, dtype=gdt)
    np.copyto(outs[0], np.less(u, p.astype(gdt, copy=False)), casting="unsafe")


Bernoulli = register_op(
    "Bernoulli",
    category="random",
    inputs=[Input("input", FLOAT)],
    outputs=["output"],
    attrs=[Attr("dtype", "int", None), Attr("seed", "float", None)],
    infer=_infer_bernoulli,
    reference=_bernoulli_ref,
    doc="draws 1 with probability input, else 0",
)
Bernoulli.kernel("bernoulli_numpy", priority=10, doc="uniform draw compared with p")(_bernoulli)


# -- Multinomial ----------------------------------------------------------------------------------------
def _infer_multinomial(ctx):
    x = ctx.inputs[0]
    if len(x.shape) != 2:
        ctx.fail(f"input must be 2-D (batch_size, class_size) of unnormalised log-probabilities, got {x.shape}")
    n = int(ctx.attrs["sample_size"])
    if n < 0:
        raise ParamInvalidError(f"Multinomial: sample_size must be >= 0, got {n}", op="Multinomial")
    if x.shape[1] == 0 and x.shape[0] and n:
        ctx.fail("input has no classes to sample from")
    return [TensorMeta((x.shape[0], n), _dtype("Multinomial", ctx.attrs["dtype"], (_dt.int32, _dt.int64)))]


def _class_cdf(x):
    z = x.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z)
    cdf = np.cumsum(p, axis=1)
    return cdf / cdf[:, -1:]


def _multinomial_ref(ins, attrs):
    x = ins[0]
    n = int(attrs["sample_size"])
    dt = ONNX_DTYPES[int(attrs["dtype"])]
    out = np.zeros((x.shape[0], n), dt)
    if x.size == 0 or n == 0:
        return out
    cdf = _class_cdf(x)
    u = generator(attrs.get("seed")).random((x.shape[0], n))
    for b in range(x.shape[0]):
        for s in range(n):
            out[b, s] = min(int(np.searchsorted(cdf[b], u[b, s], side="right")), x.shape[1] - 1)
    return out


def _multinomial(ins, outs, attrs, plan, ws):
    x = ins[0]
    out = outs[0]
    if out.size == 0:
        return
    B, C = x.shape
    if not np.isfinite(x.max(axis=1)).all():
        raise ParamInvalidError(
            "Multinomial: every row needs a finite maximum logit (no NaN, no +inf, not all -inf)", op="Multinomial"
        )
    cdf = _class_cdf(x)
    u = generator(attrs.get("seed")).random((B, out.shape[1]))
    # rows offset by their index make one increasing array: one searchsorted for the batch
    flat = (cdf + np.arange(B)[:, None]).ravel()
    idx = np.searchsorted(flat, (u + np.arange(B)[:, None]).ravel(), side="right").reshape(B, -1)
    idx -= (np.arange(B) * C)[:, None]
    np.copyto(out, np.clip(idx, 0, C - 1), casting="unsafe")


Multinomial = register_op(
    "Multinomial",
    category="random",
    inputs=[Input("input", FLOAT)],
    outputs=["output"],
    attrs=[Attr("dtype", "int", 6), Attr("sample_size", "int", 1), Attr("seed", "float", None)],
    infer=_infer_multinomial,
    reference=_multinomial_ref,
    doc="class indices sampled from softmax(input) per row",
)
Multinomial.kernel(
    "multinomial_numpy",
    dtypes=(_dt.float32, _dt.float64),
    priority=10,
    doc="inverse-CDF sampling, one searchsorted for the whole batch",
)(_multinomial)


def _dropout_infer(ctx):
    if ctx.has(1) and math.prod(ctx.shape(1)) != 1:
        ctx.fail(f"ratio must be a scalar, got shape {tuple(ctx.shape(1))}")
    if ctx.has(2) and math.prod(ctx.shape(2)) != 1:
        ctx.fail(f"training_mode must be a scalar, got shape {tuple(ctx.shape(2))}")
    return [TensorMeta(tuple(ctx.shape(0)), ctx.dtype(0)), TensorMeta(tuple(ctx.shape(0)), _dt.bool_)]


def _dropout(ins, attrs):
    x = ins[0]
    ratio = float(ins[1].reshape(-1)[0]) if len(ins) > 1 and ins[1] is not None else 0.5
    training = bool(ins[2].reshape(-1)[0]) if len(ins) > 2 and ins[2] is not None else False
    if not training or ratio == 0:
        return x.copy(), np.ones(x.shape, bool)
    if not 0 <= ratio < 1:
        raise ParamInvalidError(f"Dropout: ratio must be in [0, 1) in training mode, got {ratio}", op="Dropout")
    # numpy's legacy RandomState(seed).uniform: the generator onnx.reference and ONNX's own test
    # data use, so seeded runs reproduce them exactly
    seed = attrs["seed"]
    mask = np.random.RandomState(None if seed is None else int(seed) & 0xFFFFFFFF).uniform(0, 1.0, x.shape) >= ratio
    return (mask * x * (1.0 / (1.0 - ratio))).astype(x.dtype), mask


Dropout = register_op(
    "Dropout",
    category="random",
    inputs=[
        Input("data", _dt.FLOATS),
        Input("ratio", _dt.FLOATS, optional=True),
        Input("training_mode", (_dt.bool_,), optional=True),
    ],
    outputs=["output", Output("mask", optional=True)],
    attrs=[Attr("seed", "int", None)],
    infer=_dropout_infer,
    reference=_dropout,
    doc="Inference: identity (mask all true). training_mode=True: zero elements with probability ratio and scale "
    "by 1/(1-ratio); mask drawn from numpy.random.RandomState(seed).uniform (matches onnx.reference).",
)


@Dropout.kernel("dropout_numpy", priority=5)
def _dropout_kernel(ins, outs, attrs, plan, ws):
    res = _dropout(ins, attrs)
    for o, r in zip(outs, res):
        np.copyto(o, r, casting="unsafe")


def _ratio(ctx_or_attrs) -> float:
    return float((ctx_or_attrs.attrs if hasattr(ctx_or_attrs, "attrs") else ctx_or_attrs)["ratio"])


def _native_dropout_infer(ctx):
    p = _ratio(ctx)
    if not 0.0 <= p < 1.0:
        ctx.fail(f"ratio must be in [0, 1), got {p}")
    if math.prod(ctx.shape(1)) != 1:
        ctx.fail(f"seed must be a scalar, got shape {tuple(ctx.shape(1))}")
    return [TensorMeta(tuple(ctx.shape(0)), ctx.dtype(0)), TensorMeta(tuple(ctx.shape(0)), _dt.bool_)]


def _native_dropout_ref(ins, attrs):
    x, p = ins[0], _ratio(attrs)
    keep = KD.keep_mask(ins[1], x.size, KD.threshold(p)).reshape(x.shape)
    scale = np.asarray(1.0 / (1.0 - p), np.float32 if _dt.is_low_precision(x.dtype) else x.dtype)
    y = x.astype(scale.dtype) * np.where(keep, scale, scale.dtype.type(0))
    return y.astype(x.dtype), keep


NativeDropout = register_op(
    "NativeDropout",
    domain="opsnn",
    category="random",
    inputs=[Input("data", _dt.FLOATS), Input("seed", (_dt.int64,))],
    outputs=["output", "mask"],
    attrs=[Attr("ratio", "float", 0.5)],
    infer=_native_dropout_infer,
    reference=_native_dropout_ref,
    doc="Training-mode dropout whose mask is a counter-based hash of (seed, element index): the seed is a "
    "runtime input, so a compiled training step draws a fresh mask at every run; the mask output feeds "
    "the backward (torch's native_dropout).",
)
NativeDropout.kernel(
    "dropout_hash",
    dtypes=(_dt.float32, _dt.float64),
    priority=10,
    plan=lambda ctx: KD.dropout_plan(math.prod(ctx.shape(0)), _ratio(ctx)),
    doc="numba: one pass drawing each element's keep bit from splitmix64(seed, index) and scaling",
)(lambda ins, outs, attrs, plan, ws: KD.forward(ins[0], ins[1], _ratio(attrs), plan, outs[0], outs[1]))


def _native_dropout_backward_infer(ctx):
    p = _ratio(ctx)
    if not 0.0 <= p < 1.0:
        ctx.fail(f"ratio must be in [0, 1), got {p}")
    if tuple(ctx.shape(0)) != tuple(ctx.shape(1)):
        ctx.fail(f"mask shape {tuple(ctx.shape(1))} differs from the gradient's {tuple(ctx.shape(0))}")
    return [TensorMeta(tuple(ctx.shape(0)), ctx.dtype(0))]


def _native_dropout_backward_ref(ins, attrs):
    g, keep, p = ins[0], ins[1], _ratio(attrs)
    scale = np.asarray(1.0 / (1.0 - p), np.float32 if _dt.is_low_precision(g.dtype) else g.dtype)
    return (g.astype(scale.dtype) * np.where(keep, scale, scale.dtype.type(0))).astype(g.dtype)


NativeDropoutBackward = register_op(
    "NativeDropoutBackward",
    domain="opsnn",
    category="random",
    inputs=[Input("grad", _dt.FLOATS), Input("mask", (_dt.bool_,))],
    outputs=["grad_input"],
    attrs=[Attr("ratio", "float", 0.5)],
    infer=_native_dropout_backward_infer,
    reference=_native_dropout_backward_ref,
    doc="NativeDropout's gradient: grad * mask / (1 - ratio) in one pass over the saved mask.",
)
NativeDropoutBackward.kernel(
    "dropout_backward_numba",
    dtypes=(_dt.float32, _dt.float64),
    priority=10,
    plan=lambda ctx: math.prod(ctx.shape(0)) >= KD.PARALLEL_MIN,
    doc="numba: grad * (mask ? 1/(1-ratio) : 0), one pass",
)(lambda ins, outs, attrs, plan, ws: KD.backward(ins[0], ins[1], _ratio(attrs), plan, outs[0]))


# -- entry points -----------------------------------------------------------------------------------------
def _dist_attrs(dtype, seed, **kw):
    a = {k: float(v) for k, v in kw.items()}
    c = _code(dtype)
    if c is not None:
        a["dtype"] = c
    if seed is not None:
        a["seed"] = float(seed)
    return a


@api("random_normal", "RandomNormal")
def random_normal(shape, mean=0.0, scale=1.0, dtype="float32", seed=None):
    """Samples of ``N(mean, scale^2)`` of the given shape."""
    a = _dist_attrs(dtype, seed, mean=mean, scale=scale)
    a["shape"] = [int(s) for s in ((shape,) if isinstance(shape, (int, np.integer)) else shape)]
    return [], a


@api("random_uniform", "RandomUniform")
def random_uniform(shape, low=0.0, high=1.0, dtype="float32", seed=None):
    """Samples of ``U[low, high)`` of the given shape."""
    a = _dist_attrs(dtype, seed, low=low, high=high)
    a["shape"] = [int(s) for s in ((shape,) if isinstance(shape, (int, np.integer)) else shape)]
    return [], a


@api("random_normal_like", "RandomNormalLike")
def random_normal_like(x, mean=0.0, scale=1.0, dtype=None, seed=None):
    """``random_normal`` with ``x``'s shape (and dtype unless given)."""
    return [x], _dist_attrs(dtype, seed, mean=mean, scale=scale)


@api("random_uniform_like", "RandomUniformLike")
def random_uniform_like(x, low=0.0, high=1.0, dtype=None, seed=None):
    """``random_uniform`` with ``x``'s shape (and dtype unless given)."""
    return [x], _dist_attrs(dtype, seed, low=low, high=high)


@api("bernoulli", "Bernoulli")
def bernoulli(p, dtype=None, seed=None):
    """1 with probability ``p`` elementwise, else 0 (in ``p``'s dtype unless given)."""
    return [p], _dist_attrs(dtype, seed)


@api("multinomial", "Multinomial")
def multinomial(logits, sample_size=1, dtype="int32", seed=None):
    """``sample_size`` class indices per row of ``logits (batch, classes)``, drawn with
    replacement from ``softmax(logits)`` (ONNX semantics: unnormalised *log*-probabilities)."""
    a = _dist_attrs(dtype, seed)
    a["sample_size"] = int(sample_size)
    return [logits], a


@api("dropout", "Dropout")
def dropout(x, p=0.5, training=False, seed=None):
    """Dropout: identity unless ``training``; then zero with probability ``p`` and scale by 1/(1-p).
    With ``seed`` the mask is numpy.random.RandomState(seed).uniform(size) >= p (onnx.reference's)."""
    xt = _to_tensor(x)
    return [xt, Tensor(np.asarray(p, xt.dtype)), Tensor(np.asarray(bool(training)))], {"seed": seed}


@api("native_dropout", "NativeDropout", domain="opsnn")
def native_dropout(x, p, seed):
    """Training-mode dropout: ``(x * keep / (1 - p), keep)``, the mask drawn from ``seed`` (an int64
    scalar: a tensor, so a traced graph can take it as a runtime input) by a counter-based hash.
    ``nn.Dropout`` draws the seed from ``opsnn.manual_seed``'s generator.

    >>> import opsnn, numpy as np
    >>> y, keep = opsnn.ops.native_dropout(np.ones((2, 3), np.float32), 0.5, np.int64(7))
    >>> bool(((y.numpy() == 2) == keep.numpy()).all())
    True
    """
    seed = seed if isinstance(seed, Tensor) else Tensor(np.asarray(seed, np.int64))
    return [_to_tensor(x), seed], {"ratio": float(p)}, 2


@api("native_dropout_backward", "NativeDropoutBackward", domain="opsnn")
def native_dropout_backward(grad, mask, p):
    """``grad * mask / (1 - p)``: the gradient of :func:`native_dropout` through its saved mask."""
    return [_to_tensor(grad), _to_tensor(mask)], {"ratio": float(p)}


__all__ = [
    "native_dropout",
    "native_dropout_backward",
    "random_normal",
    "random_uniform",
    "random_normal_like",
    "random_uniform_like",
    "bernoulli",
    "multinomial",
    "dropout",
]
