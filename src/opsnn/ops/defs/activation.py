"""Activation ops: records, their CPU kernels and functional entry points.

Pointwise activations (Relu, LeakyRelu, Gelu, Swish, Sigmoid, Tanh, Softplus, HardSwish,
Elu, Selu, Celu, Mish, HardSigmoid, ThresholdedRelu, Softsign, Shrink), the two-input
PRelu and SwiGLU, and the row ops Softmax, LogSoftmax and Hardmax (ONNX opset-13
``axis`` semantics). Records follow the latest ONNX schema of each op::

    >>> import opsnn, numpy as np
    >>> x = opsnn.tensor(np.array([[1.0, 2.0, 3.0]], np.float32))
    >>> opsnn.ops.softmax(x, dim=-1).numpy().round(3)
    array([[0.09 , 0.245, 0.665]], dtype=float32)
"""

from __future__ import annotations

import math

import numpy as np

from ... import dtypes as _dt
from ...errors import DTypeError, ParamInvalidError
from ...kernels.cpu import activation as K
from ...kernels.cpu import activation_backward as KB
from ...kernels.cpu import xent as KX
from ...tensor import as_tensor
from ..api import api
from ..registry import Attr, Input, TensorMeta, register_op

FLOAT = _dt.FLOATS
_F32_64 = (_dt.float32, _dt.float64)

#: ONNX's Selu defaults (float32 values of the SELU constants, as the schema stores them)
SELU_ALPHA = 1.67326319217681884765625
SELU_GAMMA = 1.05070102214813232421875
#: the exact constants (Klambauer et al.), the functional entry point's defaults
SELU_ALPHA_EXACT = 1.6732632423543772
SELU_GAMMA_EXACT = 1.0507009873554805


def same_as_input(ctx):
    return [TensorMeta(ctx.shape(0), ctx.dtype(0))]


def _float64_ref(formula):
    """A reference over float64 (16-bit inputs included), cast back to the input dtype."""

    def reference(ins, attrs):
        x = ins[0]
        with np.errstate(all="ignore"):
            return np.asarray(formula(x.astype(np.float64), attrs)).astype(x.dtype)

    return reference


_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _softplus(x):
    return np.logaddexp(0.0, x)


# -- pointwise activations -----------------------------------------------------------------------------
def _pointwise(
    name, code, formula, *, attrs=(), params=lambda a: (), doc="", infer=same_as_input, io=("X", "Y"), ufunc=None
):
    """Register a float pointwise activation whose fast kernel is the shared numba map (and, given
    a numpy ``ufunc`` of the same function, a kernel calling it: tiered compilation's first run)."""
    rec = register_op(
        name,
        category="activation",
        inputs=[Input(io[0], FLOAT)],
        outputs=[io[1]],
        attrs=attrs,
        infer=infer,
        reference=_float64_ref(formula),
        doc=doc,
    )
    rec.kernel(
        f"{_snake(name)}_numba",
        dtypes=_F32_64,
        priority=10,
        plan=lambda ctx: K.pointwise_plan(ctx, code, *params(ctx.attrs)),
        cold_alternative=f"{_snake(name)}_numpy" if ufunc is not None else "",
        doc="numba map, parallel in chunks above a size threshold",
    )(K.pointwise)
    if ufunc is not None:
        rec.kernel(
            f"{_snake(name)}_numpy",
            dtypes=_F32_64,
            priority=5,
            plan=lambda ctx: ufunc,
            doc=f"numpy's {ufunc.__name__}: nothing to compile, the first run's kernel while "
            f"{_snake(name)}_numba compiles in the background (ops/tiering.py)",
        )(K.ufunc_map)
    return rec


def _snake(name: str) -> str:
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i and not name[i - 1].isupper():
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


Relu = register_op(
    "Relu",
    category="activation",
    inputs=[Input("X", _dt.FLOATS + (_dt.int8, _dt.int16, _dt.int32, _dt.int64))],
    outputs=["Y"],
    infer=same_as_input,
    reference=lambda ins, attrs: np.where(ins[0] < 0, np.zeros((), ins[0].dtype), ins[0]),
    doc="max(x, 0); NaN stays NaN",
)
Relu.kernel("relu_numba", dtypes=_F32_64 + (_dt.int32, _dt.int64), priority=10, plan=K.relu_plan)(K.relu)
Relu.kernel("relu_numpy", dtypes=(_dt.int8, _dt.int16), priority=5)(K.relu_numpy)
Relu.kernel(
    "relu_numba_bf16",
    dtypes=(_dt.bfloat16,),
    priority=11,  # before relu_numba, which takes bfloat16 through the fp32 adapter
    plan=K.relu_plan,
    doc="on the bfloat16 bit patterns: negative non-NaN values become +0 (no widening)",
)(K.relu_bf16)

LeakyRelu = _pointwise(
    "LeakyRelu",
    K.LEAKY_RELU,
    lambda x, a: np.where(x < 0, a["alpha"] * x, x),
    attrs=[Attr("alpha", "float", 0.01)],
    params=lambda a: (a["alpha"],),
    doc="x if x >= 0 else alpha * x",
)


def _approximate(attrs) -> str:
    mode = attrs["approximate"]
    if isinstance(mode, bytes):
        mode = mode.decode()
    if mode not in ("none", "tanh"):
        raise ParamInvalidError(f"Gelu: attribute 'approximate' must be 'none' or 'tanh', got {mode!r}", op="Gelu")
    return mode


def _gelu_infer(ctx):
    _approximate(ctx.attrs)
    return same_as_input(ctx)


def _gelu_ref(x, attrs):
    # the forms without the cancellation of 1 + erf / 1 + tanh for x << 0:
    # (1 + erf(x / sqrt 2)) / 2 = erfc(-x / sqrt 2) / 2 and (1 + tanh z) / 2 = sigmoid(2z)
    if _approximate(attrs) == "tanh":
        return x * _sigmoid(2.0 * math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))
    return 0.5 * x * _erfc(-x / math.sqrt(2.0))


Gelu = register_op(
    "Gelu",
    category="activation",
    inputs=[Input("X", FLOAT)],
    outputs=["Y"],
    attrs=[Attr("approximate", "string", "none")],
    infer=_gelu_infer,
    reference=_float64_ref(_gelu_ref),
    doc="x * Phi(x) (erf form) or its tanh approximation",
)
Gelu.kernel(
    "gelu_numba",
    dtypes=_F32_64,
    priority=10,
    plan=lambda ctx: K.pointwise_plan(ctx, K.GELU_TANH if _approximate(ctx.attrs) == "tanh" else K.GELU_ERF),
    doc="numba map (erfc-based normal CDF, or the tanh form)",
)(K.pointwise)
Gelu.kernel(
    "gelu_numba_bf16",
    dtypes=(_dt.bfloat16,),
    priority=11,  # before gelu_numba, which takes bfloat16 through the fp32 adapter
    plan=lambda ctx: KB.gelu_backward_plan(math.prod(ctx.shape(0)), _approximate(ctx.attrs) == "tanh"),
    doc="the float32 map on blocks widened from bfloat16, rounded once (no Cast pair)",
)(lambda ins, outs, attrs, plan, ws: KB.gelu_bf16(ins[0], outs[0], plan))


def _gelu_backward_infer(ctx):
    _approximate(ctx.attrs)
    if ctx.dtype(0) != ctx.dtype(1):
        raise DTypeError(
            f"GeluBackward: grad and X must have the same dtype, got {_dt.name(ctx.dtype(0))} and "
            f"{_dt.name(ctx.dtype(1))}",
            op="GeluBackward",
        )
    if tuple(ctx.shape(0)) != tuple(ctx.shape(1)):
        ctx.fail(f"grad shape {tuple(ctx.shape(0))} differs from X's {tuple(ctx.shape(1))}")
    return [TensorMeta(ctx.shape(1), ctx.dtype(1))]


def _gelu_backward_ref(ins, attrs):
    g, x = (a.astype(np.float64) for a in ins[:2])
    with np.errstate(all="ignore"):
        if _approximate(attrs) == "tanh":
            k, c = math.sqrt(2.0 / math.pi), 0.044715
            s = _sigmoid(2.0 * k * (x + c * x**3))
            d = s + 2.0 * k * x * s * (1.0 - s) * (1.0 + 3.0 * c * x * x)
        else:
            d = 0.5 * _erfc(-x / math.sqrt(2.0)) + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        return (g * d).astype(ins[1].dtype)


GeluBackward = register_op(
    "GeluBackward",
    domain="opsnn",
    category="activation",
    inputs=[Input("grad", FLOAT), Input("X", FLOAT)],
    outputs=["dX"],
    attrs=[Attr("approximate", "string", "none")],
    infer=_gelu_backward_infer,
    reference=_gelu_backward_ref,
    doc="Gelu's gradient grad * gelu'(X) in one pass (torch's gelu_backward)",
)
GeluBackward.kernel(
    "gelu_backward_numba",
    dtypes=(_dt.float32, _dt.float64, _dt.bfloat16),
    priority=10,
    plan=lambda ctx: KB.gelu_backward_plan(math.prod(ctx.shape(1)), _approximate(ctx.attrs) == "tanh"),
    doc="numba map: Phi(x) + x phi(x) (or the tanh form's derivative) times grad, one pass",
)(lambda ins, outs, attrs, plan, ws: KB.gelu_backward(ins[0], ins[1], outs[0], plan))


@api("gelu_backward", "GeluBackward", domain="opsnn")
def gelu_backward(grad, x, approximate="none"):
    """``grad * d gelu(x) / dx``: :func:`gelu`'s gradient in one pass."""
    return [grad, x], {"approximate": approximate}


Swish = _pointwise(
    "Swish",
    K.SWISH,
    lambda x, a: x * _sigmoid(a["alpha"] * x),
    attrs=[Attr("alpha", "float", 1.0)],
    params=lambda a: (a["alpha"],),
    doc="x * sigmoid(alpha * x) (SiLU at alpha = 1)",
)
Sigmoid = _pointwise("Sigmoid", K.SIGMOID, lambda x, a: _sigmoid(x), doc="1 / (1 + exp(-x))")
Tanh = _pointwise("Tanh", K.TANH, lambda x, a: np.tanh(x), doc="tanh(x)", io=("input", "output"), ufunc=np.tanh)
Softplus = _pointwise("Softplus", K.SOFTPLUS, lambda x, a: _softplus(x), doc="log(1 + exp(x)), overflow-free")
HardSwish = _pointwise(
    "HardSwish", K.HARD_SWISH, lambda x, a: x * np.clip(x / 6.0 + 0.5, 0.0, 1.0), doc="x * clip(x / 6 + 1/2, 0, 1)"
)
Elu = _pointwise(
    "Elu",
    K.ELU,
    lambda x, a: np.where(x < 0, a["alpha"] * np.expm1(x), x),
    attrs=[Attr("alpha", "float", 1.0)],
    params=lambda a: (a["alpha"],),
    doc="x if x >= 0 else alpha * (exp(x) - 1)",
)
Selu = _pointwise(
    "Selu",
    K.SELU,
    lambda x, a: a["gamma"] * np.where(x <= 0, a["alpha"] * np.expm1(x), x),
    attrs=[Attr("alpha", "float", SELU_ALPHA), Attr("gamma", "float", SELU_GAMMA)],
    params=lambda a: (a["alpha"], a["gamma"]),
    doc="gamma * (x if x > 0 else alpha * (exp(x) - 1))",
)


def _celu_infer(ctx):
    if ctx.attrs["alpha"] == 0:
        raise ParamInvalidError("Celu: attribute 'alpha' must be non-zero (it divides x), got 0", op="Celu")
    return same_as_input(ctx)


Celu = _pointwise(
    "Celu",
    K.CELU,
    lambda x, a: np.maximum(0.0, x) + np.minimum(0.0, a["alpha"] * np.expm1(x / a["alpha"])),
    attrs=[Attr("alpha", "float", 1.0)],
    params=lambda a: (a["alpha"],),
    doc="max(0, x) + min(0, alpha * (exp(x / alpha) - 1))",
    infer=_celu_infer,
)
Mish = _pointwise("Mish", K.MISH, lambda x, a: x * np.tanh(_softplus(x)), doc="x * tanh(softplus(x))")
HardSigmoid = _pointwise(
    "HardSigmoid",
    K.HARD_SIGMOID,
    lambda x, a: np.clip(a["alpha"] * x + a["beta"], 0.0, 1.0),
    attrs=[Attr("alpha", "float", 0.2), Attr("beta", "float", 0.5)],
    params=lambda a: (a["alpha"], a["beta"]),
    doc="clip(alpha * x + beta, 0, 1)",
)
ThresholdedRelu = _pointwise(
    "ThresholdedRelu",
    K.THRESHOLDED_RELU,
    lambda x, a: np.where(x > a["alpha"], x, 0.0),
    attrs=[Attr("alpha", "float", 1.0)],
    params=lambda a: (a["alpha"],),
    doc="x if x > alpha else 0",
)
Softsign = _pointwise(
    "Softsign", K.SOFTSIGN, lambda x, a: x / (1.0 + np.abs(x)), doc="x / (1 + |x|)", io=("input", "output")
)


def _shrink_ref(ins, attrs):
    x = ins[0]
    lambd, bias = attrs["lambd"], attrs["bias"]
    xf = x.astype(np.float64)
    return np.select([xf < -lambd, xf > lambd], [xf + bias, xf - bias], 0.0).astype(x.dtype)


Shrink = register_op(
    "Shrink",
    category="activation",
    inputs=[Input("input", FLOAT + _dt.INTEGERS)],
    outputs=["output"],
    attrs=[Attr("bias", "float", 0.0), Attr("lambd", "float", 0.5)],
    infer=same_as_input,
    reference=_shrink_ref,
    doc="x + bias if x < -lambd, x - bias if x > lambd, else 0",
)
Shrink.kernel(
    "shrink_numba",
    dtypes=_F32_64,
    priority=10,
    plan=lambda ctx: K.pointwise_plan(ctx, K.SHRINK, ctx.attrs["lambd"], ctx.attrs["bias"]),
)(K.pointwise)
Shrink.kernel("shrink_numpy", dtypes=_dt.INTEGERS, priority=5, doc="integers, via float64")(K.shrink_numpy)


# -- PRelu -------------------------------------------------------------------------------------------
_PRELU_TYPES = FLOAT + (_dt.int32, _dt.int64, _dt.uint32, _dt.uint64)


def _prelu_infer(ctx):
    xs, ss = ctx.shape(0), ctx.shape(1)
    if ctx.dtype(1) != ctx.dtype(0):
        raise DTypeError(
            f"PRelu: input 'slope' has dtype {_dt.name(ctx.dtype(1))}; expected the dtype of 'X' "
            f"({_dt.name(ctx.dtype(0))})",
            op="PRelu",
        )
    if len(ss) > len(xs) or any(s not in (1, x) for s, x in zip(reversed(ss), reversed(xs))):
        ctx.fail(f"input 'slope' of shape {ss} must broadcast to 'X' of shape {xs} (unidirectional broadcasting)")
    return same_as_input(ctx)


def _prelu_ref(ins, attrs):
    x, slope = ins
    if _dt.is_float(x.dtype):
        xf, sf = x.astype(np.float64), slope.astype(np.float64)
        return np.where(xf < 0, xf * sf, xf).astype(x.dtype)
    return np.where(x < 0, x * slope, x).astype(x.dtype)


def _prelu_applies(ctx):
    if K.prelu_layout(ctx.shape(0), ctx.shape(1)) is None:
        return f"slope {ctx.shape(1)} broadcasts to {ctx.shape(0)} in interleaved dims"
    return None


PRelu = register_op(
    "PRelu",
    category="activation",
    inputs=[Input("X", _PRELU_TYPES), Input("slope", _PRELU_TYPES)],
    outputs=["Y"],
    infer=_prelu_infer,
    reference=_prelu_ref,
    doc="x if x >= 0 else slope * x (slope broadcasts to x)",
)
PRelu.kernel(
    "prelu_numba",
    dtypes=_F32_64,
    priority=10,
    plan=K.prelu_plan,
    applies=_prelu_applies,
    doc="numba map over x viewed as (outer, C, inner)",
)(K.prelu)
PRelu.kernel("prelu_numpy", priority=5, doc="any broadcast pattern or dtype")(K.prelu_numpy)


# -- SwiGLU -----------------------------------------------------------------------------------------------
def _swiglu_infer(ctx):
    if ctx.dtype(1) != ctx.dtype(0):
        raise DTypeError(
            f"SwiGLU: input 'B' has dtype {_dt.name(ctx.dtype(1))}; expected the dtype of 'A' "
            f"({_dt.name(ctx.dtype(0))})",
            op="SwiGLU",
        )
    if tuple(ctx.shape(1)) != tuple(ctx.shape(0)):
        ctx.fail(f"inputs 'A' {ctx.shape(0)} and 'B' {ctx.shape(1)} must have the same shape (no broadcasting)")
    return same_as_input(ctx)


def _swiglu_ref(ins, attrs):
    a, b = ins
    af, bf = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(all="ignore"):
        return (af * _sigmoid(attrs["alpha"] * af) * bf).astype(a.dtype)


SwiGLU = register_op(
    "SwiGLU",
    category="activation",
    inputs=[Input("A", FLOAT), Input("B", FLOAT)],
    outputs=["Y"],
    attrs=[Attr("alpha", "float", 1.0)],
    infer=_swiglu_infer,
    reference=_swiglu_ref,
    doc="Swish_alpha(A) * B (gate A, value B)",
)
SwiGLU.kernel("swiglu_numba", dtypes=_F32_64, priority=10, plan=K.swiglu_plan, strided=True)(K.swiglu)
SwiGLU.kernel(
    "swiglu_numba_bf16",
    dtypes=(_dt.bfloat16,),
    priority=11,  # before swiglu_numba, which takes bfloat16 through the fp32 adapter
    plan=K.swiglu_plan,
    doc="bfloat16 blocks widened to float32, the float32 kernel's loop, rounded once (no float32 copies)",
)(KB.swiglu_bf16)


def _swiglu_backward_infer(ctx):
    dts = {ctx.dtype(i) for i in range(3)}
    if len(dts) != 1:
        raise DTypeError(
            f"SwiGLUBackward: grad, A and B must share one dtype, got {[_dt.name(ctx.dtype(i)) for i in range(3)]}",
            op="SwiGLUBackward",
        )
    shapes = {tuple(ctx.shape(i)) for i in range(3)}
    if len(shapes) != 1:
        ctx.fail(f"grad, A and B must have one shape, got {[tuple(ctx.shape(i)) for i in range(3)]}")
    return [TensorMeta(ctx.shape(1), ctx.dtype(1)), TensorMeta(ctx.shape(1), ctx.dtype(1))]


def _swiglu_backward_ref(ins, attrs):
    g, a, b = (x.astype(np.float64) for x in ins)
    alpha = float(attrs["alpha"])
    with np.errstate(all="ignore"):
        s = _sigmoid(alpha * a)
        da = g * b * (s + alpha * a * s * (1.0 - s))
        db = g * a * s
    return da.astype(ins[1].dtype), db.astype(ins[1].dtype)


SwiGLUBackward = register_op(
    "SwiGLUBackward",
    domain="opsnn",
    category="activation",
    inputs=[Input("grad", FLOAT), Input("A", FLOAT), Input("B", FLOAT)],
    outputs=["dA", "dB"],
    attrs=[Attr("alpha", "float", 1.0)],
    infer=_swiglu_backward_infer,
    reference=_swiglu_backward_ref,
    doc="SwiGLU's gradients: dA = grad * B * swish_alpha'(A), dB = grad * swish_alpha(A), one pass",
)
SwiGLUBackward.kernel(
    "swiglu_backward_numba",
    dtypes=(_dt.float32, _dt.float64, _dt.bfloat16),
    priority=10,
    plan=lambda ctx: KB.map_plan(math.prod(ctx.shape(1))),
    doc="numba map: one sigmoid per element gives both gradients",
)(lambda ins, outs, attrs, plan, ws: KB.swiglu_backward(*ins, attrs["alpha"], *outs, plan))


@api("swiglu_backward", "SwiGLUBackward", domain="opsnn")
def swiglu_backward(grad, a, b, alpha=1.0):
    """``(dA, dB)``: :func:`swiglu`'s gradients with respect to the gate ``a`` and the value ``b``."""
    return [grad, a, b], {"alpha": float(alpha)}, 2


# -- Softmax, LogSoftmax, Hardmax -------------------------------------------------------------------------
def _axis(ctx) -> int:
    """The ``axis`` attribute normalised to [0, rank)."""
    op, rank, axis = ctx.op.name, len(ctx.shape(0)), ctx.attrs["axis"]
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise ParamInvalidError(f"{op}: attribute 'axis' must be an int, got {axis!r}", op=op)
    if rank == 0:
        raise ParamInvalidError(f"{op}: input must have rank >= 1, got a 0-d tensor", op=op)
    if not -rank <= axis < rank:
        raise ParamInvalidError(
            f"{op}: attribute 'axis' must be in [{-rank}, {rank - 1}] for a {rank}-D input, got {axis}", op=op
        )
    return int(axis) % rank


def _axis_infer(ctx):
    _axis(ctx)
    return same_as_input(ctx)


def _softmax_ref(ins, attrs, log=False):
    x = ins[0]
    xf = x.astype(np.float64)
    axis = attrs["axis"]
    if xf.size == 0:
        return np.empty(x.shape, x.dtype)
    with np.errstate(all="ignore"):
        z = xf - xf.max(axis=axis, keepdims=True)
        e = np.exp(z)
        total = e.sum(axis=axis, keepdims=True)
        y = z - np.log(total) if log else e / total
        return y.astype(x.dtype)


def _hardmax_ref(ins, attrs):
    x = ins[0]
    axis = attrs["axis"] % x.ndim
    if x.size == 0:
        return np.zeros(x.shape, x.dtype)
    first = np.expand_dims(np.argmax(x, axis=axis), axis)
    positions = np.arange(x.shape[axis]).reshape([-1 if d == axis else 1 for d in range(x.ndim)])
    return (positions == first).astype(x.dtype)


_AXIS = [Attr("axis", "int", -1)]

Softmax = register_op(
    "Softmax",
    category="activation",
    inputs=[Input("input", FLOAT)],
    outputs=["output"],
    attrs=_AXIS,
    infer=_axis_infer,
    reference=_softmax_ref,
    doc="exp(x - max) / sum(exp(x - max)) along axis",
)
Softmax.kernel(
    "softmax_online",
    dtypes=_F32_64,
    priority=10,
    plan=lambda ctx: K.softmax_plan(ctx, _axis(ctx), False),
    workspace=K.softmax_workspace,
    cold_alternative="softmax_numpy",
    doc="single-pass online max/sum per row, then one write pass",
)(K.softmax)
Softmax.kernel(
    "softmax_numpy",
    dtypes=_F32_64,
    priority=5,
    plan=lambda ctx: (_axis(ctx), False),
    doc="numpy along the axis (max, exp, sum, divide): nothing to compile, the first run's "
    "kernel while softmax_online compiles in the background (ops/tiering.py)",
)(K.softmax_numpy)
LogSoftmax = register_op(
    "LogSoftmax",
    category="activation",
    inputs=[Input("input", FLOAT)],
    outputs=["output"],
    attrs=_AXIS,
    infer=_axis_infer,
    reference=lambda ins, attrs: _softmax_ref(ins, attrs, True),
    doc="x - max - log(sum(exp(x - max))) along axis",
)
LogSoftmax.kernel(
    "log_softmax_online",
    dtypes=_F32_64,
    priority=10,
    plan=lambda ctx: K.softmax_plan(ctx, _axis(ctx), True),
    workspace=K.softmax_workspace,
    cold_alternative="log_softmax_numpy",
    doc="single-pass online max/sum per row, then one write pass",
)(K.softmax)
LogSoftmax.kernel(
    "log_softmax_numpy",
    dtypes=_F32_64,
    priority=5,
    plan=lambda ctx: (_axis(ctx), True),
    doc="numpy along the axis (max, exp, sum, log, subtract): nothing to compile, the first run's "
    "kernel while log_softmax_online compiles in the background (ops/tiering.py)",
)(K.softmax_numpy)


# -- SoftmaxGrad / LogSoftmaxGrad (opsnn domain; onnxruntime's training ops of these names) --------------
def _grad_infer(ctx):
    _axis(ctx)
    if tuple(ctx.shape(1)) != tuple(ctx.shape(0)):
        ctx.fail(f"Y must have dY's shape {tuple(ctx.shape(0))}, got {tuple(ctx.shape(1))}")
    if ctx.dtype(1) != ctx.dtype(0):
        ctx.fail(f"Y must have dY's dtype {_dt.name(ctx.dtype(0))}, got {_dt.name(ctx.dtype(1))}")
    return same_as_input(ctx)


def _softmax_grad_ref(ins, attrs, log=False):
    """float64: ``y (dy - sum(dy y))`` (softmax), ``dy - exp(y) sum(dy)`` (log-softmax) along axis."""
    dy, y = (a.astype(np.float64) for a in ins[:2])
    axis = attrs["axis"]
    with np.errstate(all="ignore"):
        if log:
            dx = dy - np.exp(y) * dy.sum(axis=axis, keepdims=True)
        else:
            dx = y * (dy - (dy * y).sum(axis=axis, keepdims=True))
    return dx.astype(ins[0].dtype)


def _softmax_grad_kernel(ins, outs, attrs, plan, ws):
    KX.softmax_grad(ins[0], ins[1], outs[0], plan)


for _log, _name in ((False, "SoftmaxGrad"), (True, "LogSoftmaxGrad")):
    register_op(
        _name,
        domain="opsnn",
        category="activation",
        inputs=[Input("dY", FLOAT), Input("Y", FLOAT)],
        outputs=["dX"],
        attrs=_AXIS,
        infer=_grad_infer,
        reference=lambda ins, attrs, log=_log: _softmax_grad_ref(ins, attrs, log),
        doc=(
            "dY - exp(Y) * sum(dY) along axis: the gradient of LogSoftmax given its output Y"
            if _log
            else "Y * (dY - sum(dY * Y)) along axis: the gradient of Softmax given its output Y"
        ),
    ).kernel(
        "log_softmax_grad_numba" if _log else "softmax_grad_numba",
        dtypes=_F32_64,
        priority=10,
        plan=lambda ctx, log=_log: KX.softmax_grad_plan(tuple(ctx.shape(0)), _axis(ctx), log),
        doc="numba rows (lanes across the inner dim when the axis is not last): float64 row sums, one write pass",
    )(_softmax_grad_kernel)

Hardmax = register_op(
    "Hardmax",
    category="activation",
    inputs=[Input("input", FLOAT)],
    outputs=["output"],
    attrs=_AXIS,
    infer=_axis_infer,
    reference=_hardmax_ref,
    doc="1 at the first maximum along axis, 0 elsewhere",
)
Hardmax.kernel(
    "hardmax_numpy", priority=5, plan=lambda ctx: K.hardmax_plan(ctx, _axis(ctx)), doc="argmax + one-hot scatter"
)(K.hardmax_numpy)


# -- functional entry points -----------------------------------------------------------------------------
def _float(fn: str, name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise ParamInvalidError(f"{fn}: argument {name!r} must be a number, got {v!r}")
    return float(v)


def _dim(fn: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise ParamInvalidError(f"{fn}: argument 'dim' must be an int, got {v!r}")
    return int(v)


@api("relu", "Relu")
def relu(x):
    """``max(x, 0)`` elementwise."""
    return [x], {}


@api("leaky_relu", "LeakyRelu")
def leaky_relu(x, negative_slope=0.01):
    """``x if x >= 0 else negative_slope * x``."""
    return [x], {"alpha": _float("leaky_relu", "negative_slope", negative_slope)}


@api("gelu", "Gelu")
def gelu(x, approximate="none"):
    """``x * Phi(x)``; ``approximate="tanh"`` uses the tanh approximation."""
    return [x], {"approximate": approximate}


@api("silu", "Swish")
def silu(x):
    """``x * sigmoid(x)`` (SiLU, Swish with alpha 1)."""
    return [x], {"alpha": 1.0}


@api("swish", "Swish")
def swish(x, alpha=1.0):
    """``x * sigmoid(alpha * x)``."""
    return [x], {"alpha": _float("swish", "alpha", alpha)}


@api("sigmoid", "Sigmoid")
def sigmoid(x):
    """``1 / (1 + exp(-x))``."""
    return [x], {}


@api("tanh", "Tanh")
def tanh(x):
    """Hyperbolic tangent."""
    return [x], {}


@api("softplus", "Softplus")
def softplus(x):
    """``log(1 + exp(x))`` without overflow."""
    return [x], {}


@api("hard_swish", "HardSwish")
def hard_swish(x):
    """``x * relu6(x + 3) / 6``."""
    return [x], {}


@api("softmax", "Softmax")
def softmax(x, dim=-1):
    """Softmax along ``dim`` (numerically stable, single pass per row).

    >>> import opsnn, numpy as np
    >>> opsnn.ops.softmax(opsnn.tensor(np.zeros((1, 4), np.float32))).numpy()
    array([[0.25, 0.25, 0.25, 0.25]], dtype=float32)
    """
    return [x], {"axis": _dim("softmax", dim)}


@api("log_softmax", "LogSoftmax")
def log_softmax(x, dim=-1):
    """``log(softmax(x))`` along ``dim``, computed without forming the softmax."""
    return [x], {"axis": _dim("log_softmax", dim)}


@api("softmax_grad", "SoftmaxGrad", domain="opsnn")
def softmax_grad(grad_output, output, dim=-1):
    """Gradient of ``softmax(x, dim)`` given its ``output`` and the gradient ``grad_output`` of it
    (torch's ``_softmax_backward_data``).

    >>> import opsnn, numpy as np
    >>> y = opsnn.tensor(np.array([[0.25, 0.75]], np.float32))
    >>> opsnn.ops.softmax_grad(opsnn.tensor(np.array([[1.0, 0.0]], np.float32)), y).numpy()
    array([[ 0.1875, -0.1875]], dtype=float32)
    """
    return [grad_output, output], {"axis": _dim("softmax_grad", dim)}


@api("log_softmax_grad", "LogSoftmaxGrad", domain="opsnn")
def log_softmax_grad(grad_output, output, dim=-1):
    """Gradient of ``log_softmax(x, dim)`` given its ``output`` and the gradient ``grad_output`` of it."""
    return [grad_output, output], {"axis": _dim("log_softmax_grad", dim)}


@api("hardmax", "Hardmax")
def hardmax(x, dim=-1):
    """One-hot of the first maximum along ``dim``."""
    return [x], {"axis": _dim("hardmax", dim)}


@api("elu", "Elu")
def elu(x, alpha=1.0):
    """``x if x >= 0 else alpha * (exp(x) - 1)``."""
    return [x], {"alpha": _float("elu", "alpha", alpha)}


@api("selu", "Selu")
def selu(x, alpha=SELU_ALPHA_EXACT, gamma=SELU_GAMMA_EXACT):
    """``gamma * (x if x > 0 else alpha * (exp(x) - 1))`` with the self-normalising constants."""
    return [x], {"alpha": _float("selu", "alpha", alpha), "gamma": _float("selu", "gamma", gamma)}


@api("celu", "Celu")
def celu(x, alpha=1.0):
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``."""
    return [x], {"alpha": _float("celu", "alpha", alpha)}


@api("mish", "Mish")
def mish(x):
    """``x * tanh(softplus(x))``."""
    return [x], {}


@api("hard_sigmoid", "HardSigmoid")
def hard_sigmoid(x, alpha=0.2, beta=0.5):
    """``clip(alpha * x + beta, 0, 1)`` (ONNX defaults; torch's hardsigmoid is alpha=1/6)."""
    return [x], {"alpha": _float("hard_sigmoid", "alpha", alpha), "beta": _float("hard_sigmoid", "beta", beta)}


@api("thresholded_relu", "ThresholdedRelu")
def thresholded_relu(x, alpha=1.0):
    """``x if x > alpha else 0``."""
    return [x], {"alpha": _float("thresholded_relu", "alpha", alpha)}


@api("softsign", "Softsign")
def softsign(x):
    """``x / (1 + |x|)``."""
    return [x], {}


@api("shrink", "Shrink")
def shrink(x, lambd=0.5, bias=0.0):
    """``x + bias if x < -lambd, x - bias if x > lambd, else 0``."""
    return [x], {"lambd": _float("shrink", "lambd", lambd), "bias": _float("shrink", "bias", bias)}


@api("hardshrink", "Shrink")
def hardshrink(x, lambd=0.5):
    """``x if |x| > lambd else 0``."""
    return [x], {"lambd": _float("hardshrink", "lambd", lambd), "bias": 0.0}


@api("softshrink", "Shrink")
def softshrink(x, lambd=0.5):
    """``x -+ lambd`` outside ``[-lambd, lambd]``, 0 inside."""
    lambd = _float("softshrink", "lambd", lambd)
    return [x], {"lambd": lambd, "bias": lambd}


@api("prelu", "PRelu")
def prelu(x, weight):
    """``x if x >= 0 else weight * x``. As in torch, a 1-D ``weight`` of ``C`` values applies
    along dim 1 (channels); other shapes broadcast to ``x`` as in ONNX."""
    x = as_tensor(x)
    weight = as_tensor(weight, like=x)
    if x.ndim >= 2 and weight.ndim == 1 and weight.shape[0] == x.shape[1] and weight.shape[0] != 1:
        weight = weight.reshape((weight.shape[0],) + (1,) * (x.ndim - 2))
    return [x, weight], {}


@api("swiglu", "SwiGLU")
def swiglu(gate, value, alpha=1.0):
    """``gate * sigmoid(alpha * gate) * value`` (same shapes)."""
    return [gate, value], {"alpha": _float("swiglu", "alpha", alpha)}


__all__ = [
    "relu",
    "leaky_relu",
    "gelu",
    "gelu_backward",
    "swiglu_backward",
    "silu",
    "swish",
    "sigmoid",
    "tanh",
    "softplus",
    "hard_swish",
    "softmax",
    "log_softmax",
    "softmax_grad",
    "log_softmax_grad",
    "hardmax",
    "elu",
    "selu",
    "celu",
    "mish",
    "hard_sigmoid",
    "thresholded_relu",
    "softsign",
    "shrink",
    "hardshrink",
    "softshrink",
    "prelu",
    "swiglu",
]
