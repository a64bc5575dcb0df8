"""Gradient rules as data: one rule per op name, attached to the op records at import.

A rule is ``rule(ctx, grads) -> [gradient or None per input]``: ``ctx`` holds the forward
inputs, outputs and bound attributes and which inputs need a gradient (``ctx.needs``),
``grads`` the incoming gradient of each output (None where none flowed). Rules are written
with registry ops (the functional API), so a backward pass runs through the same executor,
kernels and observers as the forward. Like PyTorch's ``derivatives.yaml`` (one entry per op)
and tinygrad's ``gradient.py``, the table is kept in one place rather than beside each record,
so the op definitions stay about running the op; ``attach()`` writes each rule onto its
record's ``gradient`` field, and ``opsnn info --ops`` reads that field.

Outputs other than the first (LayerNormalization's Mean/InvStdDev, MaxPool's Indices,
BatchNormalization's running statistics, SoftmaxCrossEntropyLoss' log_prob) are treated as
not differentiable; integer and host inputs (indices, labels, shapes, axes) get no gradient.

>>> import opsnn
>>> opsnn.ops.get_op("Mul").gradient is not None
True
"""

from __future__ import annotations

import math
import weakref

import numpy as np

from .. import dtypes as _dt
from ..errors import ParamInvalidError
from ..tensor import Tensor, ones, tensor, tracing_training_step, zeros
from .registry import get_op, has_op


class GradContext:
    """What a gradient rule sees: the forward call's inputs, outputs and attributes."""

    __slots__ = ("attrs", "inputs", "needs", "op", "outputs")

    def __init__(self, op: str, inputs: list, outputs: list, attrs: dict, needs: list):
        self.op = op
        self.inputs = inputs
        self.outputs = outputs
        self.attrs = attrs
        self.needs = needs

    def value(self, i: int):
        """Host value (numpy) of input ``i``, or None when it was omitted."""
        t = self.inputs[i] if i < len(self.inputs) else None
        return None if t is None else t.numpy()


def _ops():
    from .. import ops

    return ops


_SOLE: dict = {}  # id -> weakref of the gradients sole_gradient marked, until taken


def sole_gradient(t: Tensor) -> Tensor:
    """Mark ``t``, a fresh op output a rule returns for one input only, as the sole handle on its
    memory: the autograd engine may make it a leaf's ``.grad`` as it is (torch's AccumulateGrad
    steals such a gradient too) instead of copying it."""
    k = id(t)
    _SOLE[k] = weakref.ref(t, lambda _r, k=k: _SOLE.pop(k, None))
    return t


def take_sole(t: Tensor) -> bool:
    """True (once) when ``t`` was marked by :func:`sole_gradient`."""
    r = _SOLE.pop(id(t), None)
    return r is not None and r() is t


def _const(arr, like: Tensor) -> Tensor:
    return tensor(np.asarray(arr, dtype=like.dtype))


def unbroadcast(g: Tensor, shape: tuple) -> Tensor:
    """``g`` summed over the dims that broadcasting added or stretched, reshaped to ``shape``."""
    shape = tuple(shape)
    if tuple(g.shape) == shape:
        return g
    ops = _ops()
    lead = g.ndim - len(shape)
    axes = list(range(lead)) + [lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1]
    if axes:
        g = ops.sum(g, dim=axes, keepdim=True)
    return g.reshape(shape)  # a view of the fresh sum (a traced Reshape node aliases it)


def _perm_last2(nd: int) -> list:
    return list(range(nd - 2)) + [nd - 1, nd - 2]


# -- elementwise -----------------------------------------------------------------------------------
def _add(ctx, grads):
    g = grads[0]
    a, b = ctx.inputs
    return [unbroadcast(g, a.shape) if ctx.needs[0] else None, unbroadcast(g, b.shape) if ctx.needs[1] else None]


def _sub(ctx, grads):
    g = grads[0]
    a, b = ctx.inputs
    return [
        unbroadcast(g, a.shape) if ctx.needs[0] else None,
        unbroadcast(_ops().neg(g), b.shape) if ctx.needs[1] else None,
    ]


def _mul(ctx, grads):
    ops, g = _ops(), grads[0]
    a, b = ctx.inputs
    return [
        unbroadcast(ops.mul(g, b), a.shape) if ctx.needs[0] else None,
        unbroadcast(ops.mul(g, a), b.shape) if ctx.needs[1] else None,
    ]


def _div(ctx, grads):
    ops, g = _ops(), grads[0]
    a, b = ctx.inputs
    y = ctx.outputs[0]
    return [
        unbroadcast(ops.div(g, b), a.shape) if ctx.needs[0] else None,
        unbroadcast(ops.neg(ops.div(ops.mul(g, y), b)), b.shape) if ctx.needs[1] else None,
    ]


def _neg(ctx, grads):
    return [_ops().neg(grads[0])]


def _pow(ctx, grads):
    ops, g = _ops(), grads[0]
    x, e = ctx.inputs
    z = ctx.outputs[0]
    gx = ge = None
    if ctx.needs[0]:
        e_f = e if e.dtype == x.dtype else ops.cast(e, x.dtype)
        gx = unbroadcast(ops.mul(g, ops.mul(e_f, ops.pow(x, ops.sub(e_f, _const(1, x))))), x.shape)
    if ctx.needs[1]:
        ge = unbroadcast(ops.mul(g, ops.mul(z, ops.log(x))), e.shape)
    return [gx, ge]


def _exp(ctx, grads):
    return [_ops().mul(grads[0], ctx.outputs[0])]


def _log(ctx, grads):
    return [_ops().div(grads[0], ctx.inputs[0])]


def _sqrt(ctx, grads):
    ops = _ops()
    y = ctx.outputs[0]
    return [ops.div(ops.mul(grads[0], _const(0.5, y)), y)]


def _relu(ctx, grads):
    ops = _ops()
    # from the output, as torch's threshold_backward (y > 0 exactly where x > 0): the input then has
    # one consumer in a traced step, so a residual Add -> Relu fuses into one elementwise kernel
    y = ctx.outputs[0]
    return [ops.where(ops.gt(y, _const(0, y)), grads[0], _const(0, y))]


def _sigmoid(ctx, grads):
    ops = _ops()
    y = ctx.outputs[0]
    return [ops.mul(grads[0], ops.mul(y, ops.sub(_const(1, y), y)))]


def _tanh(ctx, grads):
    ops = _ops()
    y = ctx.outputs[0]
    return [ops.mul(grads[0], ops.sub(_const(1, y), ops.mul(y, y)))]


def _gelu(ctx, grads):
    ops = _ops()
    x = ctx.inputs[0]
    approx = ctx.attrs.get("approximate", "none")
    approx = approx.decode() if isinstance(approx, bytes) else approx
    if grads[0].dtype == x.dtype:  # one fused pass (the composition below for mixed dtypes)
        return [ops.gelu_backward(grads[0], x, approximate=approx)]
    if approx == "tanh":
        k = math.sqrt(2.0 / math.pi)
        x2 = ops.mul(x, x)
        u = ops.mul(_const(k, x), ops.add(x, ops.mul(_const(0.044715, x), ops.mul(x2, x))))
        t = ops.tanh(u)
        du = ops.mul(_const(k, x), ops.add(_const(1, x), ops.mul(_const(3 * 0.044715, x), x2)))
        d = ops.add(
            ops.mul(_const(0.5, x), ops.add(_const(1, x), t)),
            ops.mul(ops.mul(_const(0.5, x), x), ops.mul(ops.sub(_const(1, x), ops.mul(t, t)), du)),
        )
    else:
        cdf = ops.mul(_const(0.5, x), ops.add(_const(1, x), ops.erf(ops.mul(x, _const(1 / math.sqrt(2), x)))))
        pdf = ops.mul(_const(1 / math.sqrt(2 * math.pi), x), ops.exp(ops.mul(ops.mul(x, x), _const(-0.5, x))))
        d = ops.add(cdf, ops.mul(x, pdf))
    return [ops.mul(grads[0], d)]


def _softmax(ctx, grads):
    y, g = ctx.outputs[0], grads[0]
    return [_ops().softmax_grad(_like(g, y), y, dim=int(ctx.attrs.get("axis", -1)))]


def _log_softmax(ctx, grads):
    y, g = ctx.outputs[0], grads[0]
    return [_ops().log_softmax_grad(_like(g, y), y, dim=int(ctx.attrs.get("axis", -1)))]


def _like(g: Tensor, y: Tensor) -> Tensor:
    """``g`` in ``y``'s dtype (the backward ops take one dtype)."""
    return g if g.dtype == y.dtype else _ops().cast(g, y.dtype)


def _identity(ctx, grads):
    return [grads[0]]


def _cast(ctx, grads):
    x = ctx.inputs[0]
    if x.dtype.kind != "f" and str(x.dtype) != "bfloat16":
        return [None]
    g = grads[0]
    return [g if g.dtype == x.dtype else _ops().cast(g, x.dtype)]


def _swish(ctx, grads):
    ops = _ops()
    x = ctx.inputs[0]
    alpha = float(ctx.attrs.get("alpha", 1.0))
    s = ops.sigmoid(ops.mul(x, _const(alpha, x)) if alpha != 1.0 else x)
    d = ops.add(s, ops.mul(ops.mul(x, _const(alpha, x)), ops.mul(s, ops.sub(_const(1, x), s))))
    return [ops.mul(grads[0], d)]


def _leaky_relu(ctx, grads):
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    return [ops.where(ops.gt(x, _const(0, x)), g, ops.mul(g, _const(float(ctx.attrs.get("alpha", 0.01)), g)))]


def _abs(ctx, grads):
    ops = _ops()
    return [ops.mul(grads[0], ops.sign(ctx.inputs[0]))]


def _softplus(ctx, grads):
    ops = _ops()
    return [ops.mul(grads[0], ops.sigmoid(ctx.inputs[0]))]


def _erf(ctx, grads):
    ops = _ops()
    x = ctx.inputs[0]
    return [ops.mul(grads[0], ops.mul(_const(2 / math.sqrt(math.pi), x), ops.exp(ops.neg(ops.mul(x, x)))))]


def _reciprocal(ctx, grads):
    ops = _ops()
    y = ctx.outputs[0]
    return [ops.neg(ops.mul(grads[0], ops.mul(y, y)))]


def _rsqrt(ctx, grads):
    ops = _ops()
    y = ctx.outputs[0]
    return [ops.mul(grads[0], ops.mul(_const(-0.5, y), ops.mul(y, ops.mul(y, y))))]


def _where(ctx, grads):
    ops, g = _ops(), grads[0]
    c, a, b = ctx.inputs
    zero = _const(0, g)
    return [
        None,
        unbroadcast(ops.where(c, g, zero), a.shape) if ctx.needs[1] else None,
        unbroadcast(ops.where(c, zero, g), b.shape) if ctx.needs[2] else None,
    ]


def _clip(ctx, grads):
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    keep = None
    for i, cmp in ((1, ops.ge), (2, ops.le)):
        bound = ctx.inputs[i] if i < len(ctx.inputs) else None
        if bound is not None:
            m = cmp(x, bound)
            keep = m if keep is None else ops.logical_and(keep, m)
    gx = g if keep is None else ops.where(keep, g, _const(0, g))
    return [gx] + [None] * (len(ctx.inputs) - 1)


def _sum_n(ctx, grads):
    return [unbroadcast(grads[0], t.shape) if need else None for t, need in zip(ctx.inputs, ctx.needs)]


def _split(ctx, grads):
    ops = _ops()
    full = [g if g is not None else zeros(o.shape, o.dtype) for g, o in zip(grads, ctx.outputs)]
    axis = int(ctx.attrs.get("axis", 0)) % ctx.inputs[0].ndim
    return [ops.concat(full, dim=axis)] + [None] * (len(ctx.inputs) - 1)


_split.outputs = 1 << 30  # every output of Split is differentiable


def _pad(ctx, grads):
    x = ctx.inputs[0]
    mode = ctx.attrs.get("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    pads = [int(v) for v in np.asarray(ctx.value(1)).reshape(-1)]
    axes = ctx.value(3) if len(ctx.inputs) > 3 else None
    axes = list(range(x.ndim)) if axes is None else [int(a) % x.ndim for a in np.asarray(axes).reshape(-1)]
    if mode != "constant" or any(p < 0 for p in pads):
        return _moved(ctx, grads)  # reflect, edge, wrap, crops: each output element is a copy of one input
    n = len(axes)
    starts = [pads[i] for i in range(n)]
    ends = [pads[i] + x.shape[a] for i, a in enumerate(axes)]
    return [_ops().slice(grads[0], starts, ends, axes=axes)] + [None] * (len(ctx.inputs) - 1)


def _dropout(ctx, grads):
    ops, g = _ops(), grads[0]
    training = ctx.value(2) if len(ctx.inputs) > 2 else None
    if training is None or not bool(np.asarray(training).reshape(-1)[0]):
        return [g, None, None][: len(ctx.inputs)]
    ratio = float(np.asarray(ctx.value(1)).reshape(-1)[0]) if len(ctx.inputs) > 1 else 0.5
    if len(ctx.outputs) > 1:
        mask = ctx.outputs[1]
    elif ctx.attrs.get("seed") is not None:  # the same seed draws the same mask again
        mask = ops.run_op("Dropout", ctx.inputs, ctx.attrs, num_outputs=2)[1]
    else:
        return [None] * len(ctx.inputs)  # an unseeded mask that was not kept: a typed error
    scale = ops.cast(mask, g.dtype)
    return [ops.mul(g, ops.mul(scale, _const(1.0 / (1.0 - ratio), g)))] + [None] * (len(ctx.inputs) - 1)


def _native_dropout(ctx, grads):
    return [_ops().native_dropout_backward(grads[0], ctx.outputs[1], float(ctx.attrs["ratio"])), None]


def _swiglu(ctx, grads):
    ops, g = _ops(), grads[0]
    a, b = ctx.inputs
    alpha = float(ctx.attrs.get("alpha", 1.0))
    if g.dtype == a.dtype and tuple(g.shape) == tuple(a.shape):  # both gradients in one fused pass
        da, db = ops.swiglu_backward(g, a, b, alpha=alpha)
        return [da if ctx.needs[0] else None, db if ctx.needs[1] else None]
    s = ops.sigmoid(ops.mul(a, _const(alpha, a)) if alpha != 1.0 else a)
    silu = ops.mul(a, s)
    ds = ops.add(s, ops.mul(ops.mul(a, _const(alpha, a)), ops.mul(s, ops.sub(_const(1, a), s))))
    return [
        unbroadcast(ops.mul(ops.mul(g, b), ds), a.shape) if ctx.needs[0] else None,
        unbroadcast(ops.mul(g, silu), b.shape) if ctx.needs[1] else None,
    ]


def _rotary(ctx, grads):
    """A rotation is orthogonal: its gradient is the rotation by the opposite angles (sin negated)."""
    ops = _ops()
    ins = list(ctx.inputs)
    back = [grads[0], ins[1], ops.neg(ins[2])] + ins[3:]
    return [ops.run_op("RotaryEmbedding", back, ctx.attrs)[0]] + [None] * (len(ins) - 1)


# -- products ----------------------------------------------------------------------------------------
def _view(t: Tensor, shape: tuple) -> Tensor:
    """``t`` under ``shape`` (a 1-D operand as one row or column): eagerly a view, no op launched
    (the Reshape op always copies); traced, a Reshape node."""
    return t.reshape(shape)


def _matmul(ctx, grads):
    """dA = dY @ B^T and dB = A^T @ dY as BatchGemm products that read the transposes in place, each
    summed over the batch dims its operand was broadcast along (a 2-D B's gradient over A's batch is
    one GEMM); 1-D operands enter as a row / a column (views)."""
    ops, g = _ops(), grads[0]
    a, b = ctx.inputs
    a2 = a if a.ndim > 1 else _view(a, (1, a.shape[0]))
    b2 = b if b.ndim > 1 else _view(b, (b.shape[0], 1))
    if a.ndim == 1 or b.ndim == 1:
        g = _view(g, tuple(g.shape[: g.ndim - (a.ndim > 1) - (b.ndim > 1)]) + (a2.shape[-2], b2.shape[-1]))
    ga = gb = None
    if ctx.needs[0]:
        ga = ops.batch_gemm(g, b2, trans_b=True, batch=a2.shape[:-2])
        ga = ga if a.ndim > 1 else _view(ga, a.shape)
    if ctx.needs[1]:
        gb = ops.batch_gemm(a2, g, trans_a=True, batch=b2.shape[:-2])
        gb = gb if b.ndim > 1 else _view(gb, b.shape)
    return [ga, gb]


def _gemm(ctx, grads):
    """Y = alpha op(A) op(B) + beta C: each operand's gradient is one Gemm of dY with the other
    operand, transposes as Gemm's flags (read in place)."""
    ops, g = _ops(), grads[0]
    a, b = ctx.inputs[0], ctx.inputs[1]
    c = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    alpha, beta = float(ctx.attrs.get("alpha", 1.0)), float(ctx.attrs.get("beta", 1.0))
    ta, tb = bool(int(ctx.attrs.get("transA", 0))), bool(int(ctx.attrs.get("transB", 0)))
    out = [None, None, None]
    if ctx.needs[0]:  # dop(A) = alpha dY op(B)^T; transA: dA = alpha op(B) dY^T
        out[0] = (
            ops.gemm(b, g, alpha=alpha, trans_a=tb, trans_b=True) if ta else ops.gemm(g, b, alpha=alpha, trans_b=not tb)
        )
    if ctx.needs[1]:  # dop(B) = alpha op(A)^T dY; transB: dB = alpha dY^T op(A)
        out[1] = (
            ops.gemm(g, a, alpha=alpha, trans_a=True, trans_b=ta) if tb else ops.gemm(a, g, alpha=alpha, trans_a=not ta)
        )
    if c is not None and len(ctx.needs) > 2 and ctx.needs[2]:
        out[2] = unbroadcast(ops.mul(g, _const(beta, g)) if beta != 1.0 else g, c.shape)
    return out[: len(ctx.inputs)]


def _linear(ctx, grads):
    """dX = dY @ W (MatMul folds the leading dims into one GEMM), dW = dY^T X as one GEMM over all
    rows (dY read transposed in place), dB = dY summed over the leading dims: no reshape or
    transpose of an operand."""
    ops, g = _ops(), grads[0]
    x, w = ctx.inputs[0], ctx.inputs[1]
    b = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    out = [None, None, None]
    if ctx.needs[0]:
        out[0] = ops.matmul(g, w)
    if ctx.needs[1]:
        if x.ndim == 1:
            out[1] = ops.batch_gemm(_view(g, (1, g.shape[0])), _view(x, (1, x.shape[0])), trans_a=True)
        elif x.ndim == 2:
            out[1] = ops.gemm(g, x, trans_a=True)
        else:
            out[1] = ops.batch_gemm(g, x, trans_a=True, batch=())
    if b is not None and len(ctx.needs) > 2 and ctx.needs[2]:
        out[2] = ops.sum(g, dim=list(range(g.ndim - 1))) if g.ndim > 1 else g
    return out[: len(ctx.inputs)]


# -- reductions --------------------------------------------------------------------------------------
def _reduce_axes(ctx, ndim: int):
    axes = ctx.value(1) if len(ctx.inputs) > 1 else None
    if axes is None or np.size(axes) == 0:
        if int(ctx.attrs.get("noop_with_empty_axes", 0)):
            return None
        return list(range(ndim))
    return sorted({int(a) % max(ndim, 1) for a in np.asarray(axes).reshape(-1)})


def _reduce(mean: bool):
    def rule(ctx, grads):
        ops, g = _ops(), grads[0]
        x = ctx.inputs[0]
        axes = _reduce_axes(ctx, x.ndim)
        if axes is None:
            return [g]
        kshape = tuple(1 if i in axes else s for i, s in enumerate(x.shape))
        g = ops.reshape(g, kshape)
        if mean:
            n = int(np.prod([x.shape[a] for a in axes])) if axes else 1
            g = ops.div(g, _const(max(n, 1), g))
        return [ops.expand(g, *x.shape)]

    return rule


# -- shape and index ----------------------------------------------------------------------------------
def _reshape_back(ctx, grads):
    """The gradient under the input's shape: eagerly a view where its layout allows (the Reshape op
    always copies), traced a Reshape node (which a compiled plan aliases where it can)."""
    return [grads[0].reshape(ctx.inputs[0].shape)]


def _transpose(ctx, grads):
    perm = ctx.attrs.get("perm")
    nd = ctx.inputs[0].ndim
    perm = list(range(nd))[::-1] if perm is None else [int(p) % nd for p in perm]
    inv = [0] * nd
    for i, p in enumerate(perm):
        inv[p] = i
    return [_ops().transpose(grads[0], inv)]


def _expand(ctx, grads):
    return [unbroadcast(grads[0], ctx.inputs[0].shape)]


def _concat(ctx, grads):
    ops, g = _ops(), grads[0]
    axis = int(ctx.attrs["axis"]) % g.ndim
    out, start = [], 0
    for i, t in enumerate(ctx.inputs):
        n = t.shape[axis]
        out.append(ops.slice(g, [start], [start + n], axes=[axis]) if ctx.needs[i] else None)
        start += n
    return out


def _scatter_into(index_map, g: Tensor, shape: tuple, add: bool) -> Tensor:
    """A zero tensor of ``shape`` with ``g`` written (or added, for repeated positions) at the
    flat positions ``index_map`` (same shape as ``g``; an int64 Tensor stays on the device, so a
    traced step computes the positions from each call's data)."""
    ops = _ops()
    n = int(np.prod(shape))
    base = zeros((n,), g.dtype)
    if isinstance(index_map, Tensor):
        idx = ops.reshape(index_map if index_map.dtype == np.int64 else ops.cast(index_map, np.int64), (-1,))
    else:
        idx = tensor(np.ascontiguousarray(index_map.reshape(-1), dtype=np.int64))
    out = ops.scatter_elements(base, idx, ops.reshape(g, (-1,)), axis=0, reduction="add" if add else "none")
    return ops.reshape(out, shape)


def _slice(ctx, grads):
    x = ctx.inputs[0]
    pos = np.arange(x.numel, dtype=np.int64).reshape(x.shape)
    host = [None if t is None else t for t in ctx.inputs[1:]]
    sel = _ops().run_op("Slice", [tensor(pos)] + host)[0].numpy()
    return [_scatter_into(sel, grads[0], x.shape, add=False)] + [None] * (len(ctx.inputs) - 1)


def _gather(ctx, grads):
    x, idx = ctx.inputs
    axis = int(ctx.attrs.get("axis", 0)) % x.ndim
    if axis == 0 and x.ndim == 2:  # an embedding lookup: the scatter-add kernel (ids stay on the device)
        return [_ops().embedding_grad(_like(grads[0], x), idx, x.shape[0]), None]
    if axis == 0:  # add each gradient row into its slice (repeats accumulate)
        ops = _ops()  # the indices stay on the device: a traced step reads each call's token ids
        i64 = idx if idx.dtype == np.int64 else ops.cast(idx, np.int64)
        n = tensor(np.asarray(x.shape[0], np.int64))
        ind = ops.where(ops.lt(i64, tensor(np.zeros((), np.int64))), ops.add(i64, n), i64)
        base = zeros(tuple(x.shape), grads[0].dtype)
        return [ops.scatter_nd(base, ops.unsqueeze(ind, -1), grads[0], reduction="add"), None]
    ind = idx.numpy().astype(np.int64)
    ind = np.where(ind < 0, ind + x.shape[axis], ind)
    pos = np.take(np.arange(x.numel, dtype=np.int64).reshape(x.shape), ind, axis=axis)
    return [_scatter_into(pos, grads[0], x.shape, add=True), None]


def _embedding(ctx, grads):
    w, ids = ctx.inputs
    g = _ops().embedding_grad(_like(grads[0], w), ids, w.shape[0], padding_idx=ctx.attrs.get("padding_idx"))
    return [g, None]


# -- convolution and pooling ---------------------------------------------------------------------------
def _ints_attr(attrs, name, n, default):
    v = attrs.get(name)
    if v is None or len(v) == 0:
        return [default] * n
    return [int(a) for a in v]


def _pads(attrs, in_sp, k, s, d) -> tuple[list, list]:
    """Begin and end pads per spatial dim, resolving auto_pad as ONNX does."""
    nd = len(in_sp)
    auto = attrs.get("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(nd):
            out = -(-in_sp[i] // s[i])
            total = max((out - 1) * s[i] + (k[i] - 1) * d[i] + 1 - in_sp[i], 0)
            lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
            begin.append(lo)
            end.append(total - lo)
        return begin, end
    if auto == "VALID":
        return [0] * nd, [0] * nd
    p = attrs.get("pads")
    if p is None or len(p) == 0:
        return [0] * nd, [0] * nd
    p = [int(v) for v in p]
    return p[:nd], p[nd:]


def _conv(ctx, grads):
    """dX and dW by the backward records (opsnn::ConvBackwardData / ConvBackwardWeight: oneDNN's
    backward primitives, or GEMM + col2im / im2col + GEMM), dB as a sum of g."""
    ops, g = _ops(), grads[0]
    x, w = ctx.inputs[0], ctx.inputs[1]
    b = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    nd = x.ndim - 2
    k = list(w.shape[2:])
    s = _ints_attr(ctx.attrs, "strides", nd, 1)
    d = _ints_attr(ctx.attrs, "dilations", nd, 1)
    pb, pe = _pads(ctx.attrs, list(x.shape[2:]), k, s, d)
    attrs = {"strides": s, "dilations": d, "group": int(ctx.attrs.get("group", 1)), "pads": pb + pe}
    res = [None, None, None]
    if ctx.needs[0]:
        shape = {"input_shape": list(x.shape)}
        res[0] = ops.run_op("ConvBackwardData", [g, w], dict(attrs, **shape), domain="opsnn")[0]
    if ctx.needs[1]:
        shape = {"weight_shape": list(w.shape)}
        res[1] = sole_gradient(ops.run_op("ConvBackwardWeight", [x, g], dict(attrs, **shape), domain="opsnn")[0])
    if b is not None and len(ctx.needs) > 2 and ctx.needs[2]:
        res[2] = ops.sum(g, dim=[0] + list(range(2, nd + 2)))
    return res[: len(ctx.inputs)]


def _max_pool(ctx, grads):
    """dY added at the forward's Indices (the executor makes them when a call records a gradient)."""
    ops, x = _ops(), ctx.inputs[0]
    if len(ctx.outputs) > 1 and int(ctx.attrs.get("storage_order", 0)) == 0:
        idx = ctx.outputs[1]
    else:  # column-major indices, or a call made without them: the row-major ones again
        _, idx = ops.run_op("MaxPool", [x], dict(ctx.attrs, storage_order=0), num_outputs=2)
    return [ops.run_op("MaxPoolGrad", [grads[0], idx, x], {}, domain="opsnn")[0]]


_max_pool.saved_outputs = 2  # Y and Indices


def _average_pool(ctx, grads):
    x = ctx.inputs[0]
    keys = ("auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads", "strides")
    attrs = {k: ctx.attrs[k] for k in keys if ctx.attrs.get(k) is not None}
    return [_ops().run_op("AveragePoolGrad", [grads[0], x], attrs, domain="opsnn")[0]]


def _average_pool_composed(ctx, grads):
    """AveragePool's gradient from registry ops (a Conv of ones for the counts, a ConvTranspose for
    the window adjoint): the oracle the AveragePoolGrad record is tested against."""
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    nd = x.ndim - 2
    k, s, d, pb, pe, extra = _pool_geometry(ctx, x, g)
    out_sp = list(g.shape[2:])
    in_sp = list(x.shape[2:])
    if int(ctx.attrs.get("count_include_pad", 0)):
        ones_shape = [in_sp[i] + pb[i] + pe[i] for i in range(nd)]
        cpads = [0] * nd + extra
    else:
        ones_shape = in_sp
        cpads = pb + [pe[i] + extra[i] for i in range(nd)]
    ones_in = ones((1, 1, *ones_shape), x.dtype)
    kernel = ones((1, 1, *k), x.dtype)
    counts = ops.run_op("Conv", [ones_in, kernel], {"strides": s, "dilations": d, "pads": cpads})[0]
    counts = ops.slice(counts, [0] * nd, out_sp, axes=list(range(2, nd + 2)))
    return [_window_adjoint(x, ops.div(g, counts), k, s, d, pb, pe, extra)]


def _pool_geometry(ctx, x, g):
    """(kernel, strides, dilations, begin pads, end pads, extra end pads ceil_mode's last window
    reaches into) of a pooling op."""
    nd = x.ndim - 2
    k = [int(v) for v in ctx.attrs["kernel_shape"]]
    s = _ints_attr(ctx.attrs, "strides", nd, 1)
    d = _ints_attr(ctx.attrs, "dilations", nd, 1)
    pb, pe = _pads(ctx.attrs, list(x.shape[2:]), k, s, d)
    need = [(g.shape[2 + i] - 1) * s[i] + (k[i] - 1) * d[i] + 1 - x.shape[2 + i] - pb[i] for i in range(nd)]
    return k, s, d, pb, pe, [max(need[i] - pe[i], 0) for i in range(nd)]


def _window_adjoint(x, gw, k, s, d, pb, pe, extra):
    """Each window's value ``gw`` (N, C, out...) added back onto the input positions it covers:
    the adjoint of a window sum, a ConvTranspose by a ones kernel per channel."""
    ops = _ops()
    nd = x.ndim - 2
    in_sp, out_sp = list(x.shape[2:]), list(gw.shape[2:])
    n, c = x.shape[:2]
    opad = [in_sp[i] - ((out_sp[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1 - pb[i] - pe[i] - extra[i]) for i in range(nd)]
    gx = ops.run_op(
        "ConvTranspose",
        [ops.reshape(gw, (n * c, 1, *out_sp)), ones((1, 1, *k), x.dtype)],
        {
            "strides": s,
            "dilations": d,
            "pads": pb + [pe[i] + extra[i] for i in range(nd)],
            "output_padding": opad,
            "kernel_shape": k,
        },
    )[0]
    return ops.reshape(gx, x.shape)


def _lp_pool(ctx, grads):
    """y = (sum over the window of |x|^p)^(1/p): dx = sign(x) |x|^(p-1) * (window adjoint of g y^(1-p))."""
    ops, g = _ops(), grads[0]
    x, y = ctx.inputs[0], ctx.outputs[0]
    p = float(ctx.attrs.get("p", 2))
    geo = _pool_geometry(ctx, x, g)
    back = _window_adjoint(x, ops.mul(g, ops.pow(y, _const(1 - p, y))), *geo)
    return [ops.mul(back, ops.mul(ops.sign(x), ops.pow(ops.abs(x), _const(p - 1, x))))]


def _global_average_pool(ctx, grads):
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    n = int(np.prod(x.shape[2:]))
    return [ops.expand(ops.div(g, _const(n, g)), *x.shape)]


# -- normalization --------------------------------------------------------------------------------------
def _normalize_backward(
    x: Tensor,
    g: Tensor,
    scale_b: Tensor | None,
    axes: list,
    eps: float,
    mean: Tensor | None = None,
    var: Tensor | None = None,
):
    """dx, xhat of ``y = (x - mean) / sqrt(var + eps) * scale`` over ``axes``; batch statistics
    (whose gradient flows back into x) when ``mean`` is None, fixed ones otherwise."""
    ops = _ops()
    batch = mean is None
    if batch:
        mean = ops.mean(x, dim=axes, keepdim=True)
        xc = ops.sub(x, mean)
        var = ops.mean(ops.mul(xc, xc), dim=axes, keepdim=True)
    else:
        xc = ops.sub(x, mean)
    rstd = ops.div(_const(1, x), ops.sqrt(ops.add(var, _const(eps, x))))
    xhat = ops.mul(xc, rstd)
    dxhat = g if scale_b is None else ops.mul(g, scale_b)
    if batch:
        m1 = ops.mean(dxhat, dim=axes, keepdim=True)
        m2 = ops.mean(ops.mul(dxhat, xhat), dim=axes, keepdim=True)
        dx = ops.mul(rstd, ops.sub(ops.sub(dxhat, m1), ops.mul(xhat, m2)))
    else:
        dx = ops.mul(dxhat, rstd)
    return dx, xhat


def _norm_grad(op: str, g, x, params: list, attrs: dict, n_out: int) -> tuple:
    """The outputs of a normalization's backward op (domain opsnn); g is cast to X's dtype first
    (RMSNormalization's output takes the scale's)."""
    ops = _ops()
    if g.dtype != x.dtype:
        g = ops.cast(g, x.dtype)
    return ops.run_op(op, [g, x, *params], attrs, num_outputs=n_out, domain="opsnn")


def _layer_norm(ctx, grads):
    x, scale = ctx.inputs[0], ctx.inputs[1]
    b = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    attrs = {"axis": int(ctx.attrs.get("axis", -1)) % x.ndim, "epsilon": float(ctx.attrs.get("epsilon", 1e-5))}
    dx, dscale, dbias = _norm_grad("LayerNormalizationGrad", grads[0], x, [scale], attrs, 3)
    res = [dx if ctx.needs[0] else None, dscale if ctx.needs[1] else None, None]
    if b is not None and ctx.needs[2]:
        res[2] = unbroadcast(dbias, b.shape)
    return res[: len(ctx.inputs)]


def _rms_norm(ctx, grads):
    x, scale = ctx.inputs[0], ctx.inputs[1]
    attrs = {"axis": int(ctx.attrs.get("axis", -1)) % x.ndim, "epsilon": float(ctx.attrs.get("epsilon", 1e-5))}
    dx, dscale = _norm_grad("RMSNormalizationGrad", grads[0], x, [scale], attrs, 2)
    return [dx if ctx.needs[0] else None, dscale if ctx.needs[1] else None]


def _layer_norm_composed(ctx, grads):
    """LayerNormalization's gradient from registry ops: the oracle its backward op is tested against."""
    ops, g = _ops(), grads[0]
    x, scale = ctx.inputs[0], ctx.inputs[1]
    b = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    axis = int(ctx.attrs.get("axis", -1)) % x.ndim
    axes = list(range(axis, x.ndim))
    dx, xhat = _normalize_backward(x, g, scale, axes, float(ctx.attrs.get("epsilon", 1e-5)))
    res = [dx if ctx.needs[0] else None, None, None]
    if ctx.needs[1]:
        res[1] = unbroadcast(ops.mul(g, xhat), scale.shape)
    if b is not None and ctx.needs[2]:
        res[2] = unbroadcast(g, b.shape)
    return res[: len(ctx.inputs)]


def _rms_norm_composed(ctx, grads):
    """RMSNormalization's gradient from registry ops (test oracle)."""
    ops, g = _ops(), grads[0]
    x, scale = ctx.inputs[0], ctx.inputs[1]
    axis = int(ctx.attrs.get("axis", -1)) % x.ndim
    axes = list(range(axis, x.ndim))
    eps = float(ctx.attrs.get("epsilon", 1e-5))
    rstd = ops.div(_const(1, x), ops.sqrt(ops.add(ops.mean(ops.mul(x, x), dim=axes, keepdim=True), _const(eps, x))))
    xhat = ops.mul(x, rstd)
    dxhat = ops.mul(g, scale)
    res = [None, None]
    if ctx.needs[0]:
        m = ops.mean(ops.mul(dxhat, xhat), dim=axes, keepdim=True)
        res[0] = ops.mul(rstd, ops.sub(dxhat, ops.mul(xhat, m)))
    if ctx.needs[1]:
        res[1] = unbroadcast(ops.mul(g, xhat), scale.shape)
    return res


def _group_norm(ctx, grads):
    x, scale = ctx.inputs[:2]
    attrs = {"num_groups": int(ctx.attrs["num_groups"]), "epsilon": float(ctx.attrs.get("epsilon", 1e-5))}
    dx, dscale, dbias = _norm_grad("GroupNormalizationGrad", grads[0], x, [scale], attrs, 3)
    return [dx if ctx.needs[0] else None, dscale if ctx.needs[1] else None, dbias if ctx.needs[2] else None]


def _batch_norm(ctx, grads):
    x, scale = ctx.inputs[:2]
    attrs = {"epsilon": float(ctx.attrs.get("epsilon", 1e-5)), "training_mode": int(ctx.attrs.get("training_mode", 0))}
    # with batch statistics the running ones are not read (the layer updates them in place right after)
    params = [scale, None, None] if attrs["training_mode"] else [scale, ctx.inputs[3], ctx.inputs[4]]
    if int(ctx.attrs.get("relu", 0)):  # the fused ReLU's mask comes from the output, as _relu's
        attrs["relu"] = 1
        params.append(ctx.outputs[0])
    dx, dscale, dbias = _norm_grad("BatchNormalizationGrad", grads[0], x, params, attrs, 3)
    dscale, dbias = sole_gradient(dscale), sole_gradient(dbias)
    res = [dx if ctx.needs[0] else None, dscale if ctx.needs[1] else None, dbias if ctx.needs[2] else None, None, None]
    return res[: len(ctx.inputs)]


def _group_norm_composed(ctx, grads):
    """GroupNormalization's gradient from registry ops (test oracle)."""
    ops, g = _ops(), grads[0]
    x, scale = ctx.inputs[:2]
    n, c = x.shape[:2]
    groups = int(ctx.attrs["num_groups"])
    shape_c = (1, c) + (1,) * (x.ndim - 2)
    sc = ops.reshape(scale, shape_c)
    xg = ops.reshape(x, (n, groups, -1))
    dxhat = ops.reshape(ops.mul(g, sc), (n, groups, -1))
    dx, xhat = _normalize_backward(xg, dxhat, None, [2], float(ctx.attrs.get("epsilon", 1e-5)))
    xhat = ops.reshape(xhat, x.shape)
    axes = [0] + list(range(2, x.ndim))
    return [
        ops.reshape(dx, x.shape) if ctx.needs[0] else None,
        ops.sum(ops.mul(g, xhat), dim=axes) if ctx.needs[1] else None,
        ops.sum(g, dim=axes) if ctx.needs[2] else None,
    ]


def _batch_norm_composed(ctx, grads):
    """BatchNormalization's gradient from registry ops (test oracle)."""
    ops, g = _ops(), grads[0]
    x, scale, _, rmean, rvar = ctx.inputs[:5]
    shape_c = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    axes = [0] + list(range(2, x.ndim))
    eps = float(ctx.attrs.get("epsilon", 1e-5))
    sc = ops.reshape(scale, shape_c)
    if int(ctx.attrs.get("relu", 0)):
        y = ctx.outputs[0]
        g = ops.where(ops.gt(y, _const(0, y)), g, _const(0, y))
    if int(ctx.attrs.get("training_mode", 0)):
        dx, xhat = _normalize_backward(x, g, sc, axes, eps)
    else:
        dx, xhat = _normalize_backward(x, g, sc, axes, eps, ops.reshape(rmean, shape_c), ops.reshape(rvar, shape_c))
    res = [dx if ctx.needs[0] else None, None, None, None, None]
    if ctx.needs[1]:
        res[1] = ops.sum(ops.mul(g, xhat), dim=axes)
    if ctx.needs[2]:
        res[2] = ops.sum(g, dim=axes)
    return res[: len(ctx.inputs)]


# -- losses -------------------------------------------------------------------------------------------
def _class_coefficients(ctx, g: Tensor):
    """(one-hot of the labels moved to dim 1, per-position coefficient (N, 1, d...)) for the
    index losses: weight of the label (0 where ignored) over the mean's denominator, times g.
    Computed with registry ops from the labels (never read on the host), so a traced training step
    computes them from each call's labels."""
    ops = _ops()
    x, t = ctx.inputs[0], ctx.inputs[1]
    w = ctx.inputs[2] if len(ctx.inputs) > 2 and ctx.inputs[2] is not None else None
    C = x.shape[1]
    labels = t if t.dtype == np.int64 else ops.cast(t, np.int64)
    ignore = ctx.attrs.get("ignore_index")
    zero = tensor(np.zeros((), np.int64))
    if ignore is None:
        valid, safe = None, labels
    else:
        valid = ops.logical_not(ops.eq(labels, tensor(np.asarray(int(ignore), np.int64))))
        safe = ops.where(valid, labels, zero)
    if w is None:
        wt = ops.cast(valid if valid is not None else ops.eq(safe, safe), x.dtype)
    else:
        wt = ops.gather(w, safe, axis=0)
        if valid is not None:
            wt = ops.where(valid, wt, _const(0, x))
    red = ctx.attrs.get("reduction", "mean")
    red = red.decode() if isinstance(red, bytes) else red
    if red == "mean":
        wt = ops.div(wt, ops.sum(wt))
    classes = tensor(np.arange(C, dtype=np.int64).reshape((1, C) + (1,) * (t.ndim - 1)))
    onehot = ops.cast(ops.eq(ops.unsqueeze(safe, 1), classes), x.dtype)
    coef = ops.mul(wt, g)  # g is 0-d for sum/mean, the labels' shape for none
    return onehot, ops.unsqueeze(coef, 1)


def _softmax_cross_entropy(ctx, grads):
    x, t = ctx.inputs[0], ctx.inputs[1]
    w = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    red = ctx.attrs.get("reduction", "mean")
    dx = _ops().softmax_cross_entropy_loss_grad(
        _like(grads[0], x),
        x,
        t,
        w,
        reduction=red.decode() if isinstance(red, bytes) else red,
        ignore_index=ctx.attrs.get("ignore_index"),
    )
    return [dx] + [None] * (len(ctx.inputs) - 1)


def _nll(ctx, grads):
    """-dLoss * weight written at each target by the NLLLossGrad record (no one-hot temporaries)."""
    x, t = ctx.inputs[0], ctx.inputs[1]
    w = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    red = ctx.attrs.get("reduction", "mean")
    dx = _ops().nll_loss_grad(
        _like(grads[0], x),
        x,
        t,
        w,
        reduction=red.decode() if isinstance(red, bytes) else red,
        ignore_index=ctx.attrs.get("ignore_index"),
    )
    return [dx] + [None] * (len(ctx.inputs) - 1)


def _ctc(ctx, grads):
    """CTCLossGrad from the forward's inputs and per-sample losses (the recursions run again there)."""
    lp, tg, il, tl = ctx.inputs[:4]
    d = _ops().ctc_nll_grad(
        lp,
        tg,
        il,
        tl,
        ctx.outputs[0],
        _like(grads[0], lp),
        blank=int(ctx.attrs["blank"]),
        zero_infinity=bool(ctx.attrs["zero_infinity"]),
    )
    return [d, None, None, None]


# -- attention -------------------------------------------------------------------------------------------
def _attention_bias(mask, B, Hq, Sq, T, causal, left, right):
    """Additive bias (B|1, Hq|1, Sq, T) of a mask, the causal triangle and sliding windows (no
    cache: query i sits at key position i), and which rows keep at least one key."""
    bias = np.zeros((1, 1, Sq, T))
    i = np.arange(Sq)[:, None]
    j = np.arange(T)[None, :]
    off = (j > i) if causal else np.zeros((Sq, T), bool)
    if left >= 0:
        off |= j < i - left
    if right >= 0:
        off |= j > i + right
    bias = np.where(off, -np.inf, 0.0)[None, None]
    if mask is not None:
        m = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
        if m.shape[3] < T:  # a short mask: the missing keys are masked out
            pad = (
                np.zeros(m.shape[:3] + (T - m.shape[3],), m.dtype)
                if m.dtype == np.bool_
                else np.full(m.shape[:3] + (T - m.shape[3],), -np.inf)
            )
            m = np.concatenate([m, pad], axis=3)
        bias = bias + (np.where(m, 0.0, -np.inf) if m.dtype == np.bool_ else m.astype(np.float64))
    rows = ~np.all(np.isneginf(bias), axis=-1, keepdims=True)
    return bias, rows


def _window(attrs) -> tuple:
    return (
        bool(attrs.get("is_causal", 0)),
        int(attrs.get("left_window_size", -1)),
        int(attrs.get("right_window_size", -1)),
    )


def _host_masked_probs(q4, kr, mask, scale, B, Hq, Sq, T, attrs):
    """The attention probabilities with the mask's bias built on the host (float64, then cast)."""
    ops = _ops()
    bias, rows = _attention_bias(None if mask is None else mask.numpy(), B, Hq, Sq, T, *_window(attrs))
    sc = ops.add(ops.mul(ops.matmul(q4, ops.transpose(kr, [0, 1, 3, 2])), _const(scale, q4)), _const(bias, q4))
    p = ops.softmax(sc, dim=-1)
    if not rows.all():  # fully masked rows give 0 (not NaN), as the forward does
        p = ops.where(tensor(np.broadcast_to(rows, p.shape).copy()), p, _const(0, p))
    return p


def _traced_masked_probs(q4, kr, mask, scale, Sq, T, attrs):
    """The same with the mask's bias made by ops, so a traced training step follows each call's mask
    (a key-padding mask is data); the causal and window parts stay constants."""
    ops = _ops()
    static, _ = _attention_bias(None, 1, 1, Sq, T, *_window(attrs))
    m4 = ops.reshape(mask, (1,) * (4 - mask.ndim) + tuple(mask.shape))
    if mask.dtype == np.bool_:
        mb = ops.where(m4, _const(0, q4), _const(-np.inf, q4))
    else:
        mb = m4 if mask.dtype == q4.dtype else ops.cast(m4, q4.dtype)
    bias = ops.add(_const(static, q4), mb)
    sc = ops.add(ops.mul(ops.matmul(q4, ops.transpose(kr, [0, 1, 3, 2])), _const(scale, q4)), bias)
    p = ops.softmax(sc, dim=-1)
    rows = ops.gt(ops.max(bias, dim=-1, keepdim=True), _const(-np.inf, q4))  # rows keeping a key
    return ops.where(rows, p, _const(0, p))


def _attention_fused(ctx, g, n_in, lse=None):
    """dQ, dK, dV by the flash-style backward op (opsnn::AttentionGrad): the probabilities are
    recomputed per tile, never materialised, and 3-D inputs need no head reshapes; ``lse``, the
    forward's rows' logsumexp where it kept them (opsnn::AttentionTrain), spares their recomputation."""
    a, ops = ctx.attrs, _ops()
    q, k, v = ctx.inputs[:3]
    mask = ctx.inputs[3] if n_in > 3 else None
    if g.dtype != q.dtype:  # the op takes dY in Y's dtype
        g = ops.cast(g, q.dtype)
    grads = ops.attention_backward(
        g,
        q,
        k,
        v,
        ctx.outputs[0],
        mask,
        lse,
        is_causal=bool(a.get("is_causal", 0)),
        scale=a.get("scale"),
        q_num_heads=a.get("q_num_heads"),
        kv_num_heads=a.get("kv_num_heads"),
        softcap=float(a.get("softcap") or 0.0),
        left_window_size=int(a.get("left_window_size", -1)),
        right_window_size=int(a.get("right_window_size", -1)),
    )
    return [t if ctx.needs[i] else None for i, t in enumerate(grads)] + [None] * (n_in - 3)


def _attention(ctx, grads):
    ops, g = _ops(), grads[0]
    ins = list(ctx.inputs) + [None] * (7 - len(ctx.inputs))
    q, k, v, mask = ins[:4]
    n_in = len(ctx.inputs)
    if any(t is not None for t in ins[4:7]) or (mask is not None and len(ctx.needs) > 3 and ctx.needs[3]):
        return [None] * n_in  # with a KV cache or a trainable mask: no rule yet (a typed error)
    if q.dtype != np.float64:  # float32 and 16-bit: the backward op (its kernels compute in fp32)
        return _attention_fused(ctx, g, n_in)
    if float(ctx.attrs.get("softcap") or 0.0) != 0.0:
        return [None] * n_in  # softcap in float64: no rule yet (a typed error)
    rank = q.ndim
    if rank == 3:
        hq, hkv = int(ctx.attrs["q_num_heads"]), int(ctx.attrs["kv_num_heads"])

        def to4(t, h):
            return ops.transpose(ops.reshape(t, (t.shape[0], t.shape[1], h, t.shape[2] // h)), [0, 2, 1, 3])

        q4, k4, v4 = to4(q, hq), to4(k, hkv), to4(v, hkv)
        g4 = to4(g, hq)
    else:
        q4, k4, v4, g4 = q, k, v, g
    B, Hq, Sq, D = q4.shape
    Hkv, T = k4.shape[1], k4.shape[2]
    rep = Hq // Hkv
    scale = ctx.attrs.get("scale")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)

    def repeat(t):  # (B, Hkv, T, d) -> (B, Hq, T, d)
        if rep == 1:
            return t
        e = ops.expand(ops.unsqueeze(t, 2), B, Hkv, rep, t.shape[2], t.shape[3])
        return ops.reshape(e, (B, Hq, t.shape[2], t.shape[3]))

    def fold(t):  # (B, Hq, T, d) -> (B, Hkv, T, d), summing each group's heads
        if rep == 1:
            return t
        return ops.sum(ops.reshape(t, (B, Hkv, rep, t.shape[2], t.shape[3])), dim=2)

    kr, vr = repeat(k4), repeat(v4)
    if mask is not None and tracing_training_step() and mask.shape[-1] >= T:
        p = _traced_masked_probs(q4, kr, mask, scale, Sq, T, ctx.attrs)
    else:
        p = _host_masked_probs(q4, kr, mask, scale, B, Hq, Sq, T, ctx.attrs)
    dp = ops.matmul(g4, ops.transpose(vr, [0, 1, 3, 2]))

    ds = ops.mul(p, ops.sub(dp, ops.sum(ops.mul(dp, p), dim=-1, keepdim=True)))
    ds = ops.mul(ds, _const(scale, ds))
    res = [None] * n_in
    if ctx.needs[0]:
        res[0] = ops.matmul(ds, kr)
    if ctx.needs[1]:
        res[1] = fold(ops.matmul(ops.transpose(ds, [0, 1, 3, 2]), q4))
    if ctx.needs[2]:
        res[2] = fold(ops.matmul(ops.transpose(p, [0, 1, 3, 2]), g4))
    if rank == 3:
        for i in range(3):
            if res[i] is not None:
                t = res[i]
                res[i] = ops.reshape(ops.transpose(t, [0, 2, 1, 3]), (t.shape[0], t.shape[2], t.shape[1] * t.shape[3]))
    return res


def _attention_train(ctx, grads):
    """AttentionTrain's gradient: Attention's fused rule given the forward's logsumexp (output 1)."""
    n_in = len(ctx.inputs)
    if n_in > 3 and ctx.inputs[3] is not None and len(ctx.needs) > 3 and ctx.needs[3]:
        return [None] * n_in  # a trainable mask: no rule (a typed error), as for Attention
    return _attention_fused(ctx, grads[0], n_in, ctx.outputs[1] if len(ctx.outputs) > 1 else None)


def _attention_training_forward(tensors: list, attrs: dict, num_outputs: int):
    """The op a recorded Attention call runs instead: opsnn::AttentionTrain, whose logsumexp output
    AttentionGrad reads (float32 or bfloat16 calls without a KV cache, whose rule is the fused one,
    asking for Y or for Y and the present key/value), with the indices of the caller's outputs; else
    None."""
    q, k, v = tensors[:3]
    if any(t is not None for t in tensors[4:]) or any(t is None for t in (q, k, v)):
        return None
    if q.dtype not in (np.float32, _dt.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return None
    sp = attrs.get("softmax_precision")
    if sp is not None and int(sp) != 1:  # a softmax wider or narrower than the fp32 kernels'
        return None
    pick = {1: (0,), 3: (0, 2, 3)}.get(num_outputs)
    return None if pick is None else (get_op("AttentionTrain", "opsnn"), list(tensors[:4]), attrs, pick)


_attention.training_forward = _attention_training_forward


# -- recurrent --------------------------------------------------------------------------------------------
def _rnn_total(res: dict, k: str):
    """One input's gradient of an RNN/GRU/LSTM from its per-direction parts: the two directions' X
    gradients add, the weights' stack along the direction axis."""
    ops, v = _ops(), res[k]
    return v[0] if len(v) == 1 else (ops.add(v[0], v[1]) if k == "x" else ops.concat(v, dim=0))


def _rnn_input_grads(res: dict, b, h0) -> list:
    """Gradients of X, W, R, B, sequence_lens (none) and initial_h, in the ONNX input order."""
    return [
        _rnn_total(res, "x"),
        _rnn_total(res, "w"),
        _rnn_total(res, "r"),
        _rnn_total(res, "b") if b is not None else None,
        None,
        _rnn_total(res, "h0") if h0 is not None else None,
    ]


def _rnn_fused_ok(ctx, n_act: int) -> bool:
    """Whether opsnn::LSTMGrad / GRUGrad cover this call: default activations, no clip."""
    acts = ctx.attrs.get("activations")
    default = ["sigmoid", "tanh", "tanh"][:n_act]
    return ctx.attrs.get("clip") is None and (not acts or [_s(a).lower() for a in acts] in (default, default * 2))


def _rnn_composed(ctx, x, seq) -> bool:
    """float64 without sequence_lens or batch-first layout keeps the registry-op composition
    (the attention rule's choice); everything else the records support runs them."""
    return x.dtype == np.float64 and seq is None and not int(ctx.attrs.get("layout", 0))


def _lstm(ctx, grads):
    """LSTM's gradient: opsnn::LSTMGrad (backward through time in one kernel), or for float64 inputs
    without sequence_lens in the time-major layout the registry-op composition below. Default
    activations, no peepholes, clip or input_forget (those: no rule yet, a typed error)."""
    ins = list(ctx.inputs) + [None] * (8 - len(ctx.inputs))
    x, w, r, b, seq, h0, c0, peep = ins
    n_in = len(ctx.inputs)
    if peep is not None or int(ctx.attrs.get("input_forget", 0)) or not _rnn_fused_ok(ctx, 3):
        return [None] * n_in
    if _rnn_composed(ctx, x, seq):
        return _lstm_composed(ctx, grads)
    gy, gyh, gyc = (None if g is None else _like(g, x) for g in (list(grads) + [None, None, None])[:3])
    out = _ops().lstm_backward(
        x,
        w,
        r,
        b,
        seq,
        h0,
        c0,
        gy,
        gyh,
        gyc,
        direction=_s(ctx.attrs.get("direction", "forward")).lower(),
        layout=int(ctx.attrs.get("layout", 0)),
    )
    dx, dw, dr, db, dh0, dc0 = out
    res = [dx, dw, dr, db if b is not None else None, None, dh0 if h0 is not None else None]
    res += [dc0 if c0 is not None else None, None]
    return [g if need else None for g, need in zip(res[:n_in], ctx.needs)]


_lstm.outputs = 3  # Y, Y_h and Y_c are all differentiable


def _lstm_composed(ctx, grads):
    """Backpropagation through time with registry ops: each direction's forward is recomputed
    step by step (keeping the gates), then walked backwards."""
    ops = _ops()
    ins = list(ctx.inputs) + [None] * (8 - len(ctx.inputs))
    x, w, r, b, seq, h0, c0, peep = ins
    n_in = len(ctx.inputs)
    direction = _s(ctx.attrs.get("direction", "forward")).lower()
    dirs = ["forward", "reverse"] if direction == "bidirectional" else [direction]
    L, N, _ = x.shape
    H = r.shape[2]
    gy, gyh, gyc = (list(grads) + [None, None, None])[:3]
    one = _const(1, x)
    res = {k: [] for k in ("x", "w", "r", "b", "h0", "c0")}
    for d, name in enumerate(dirs):
        wd, rd = (
            ops.squeeze(ops.slice(w, [d], [d + 1], axes=[0]), 0),
            ops.squeeze(ops.slice(r, [d], [d + 1], axes=[0]), 0),
        )
        bias = None
        if b is not None:
            bd = ops.squeeze(ops.slice(b, [d], [d + 1], axes=[0]), 0)
            bias = ops.add(ops.slice(bd, [0], [4 * H]), ops.slice(bd, [4 * H], [8 * H]))
        h = zeros((N, H), x.dtype) if h0 is None else ops.squeeze(ops.slice(h0, [d], [d + 1], axes=[0]), 0)
        c = zeros((N, H), x.dtype) if c0 is None else ops.squeeze(ops.slice(c0, [d], [d + 1], axes=[0]), 0)
        steps = range(L) if name == "forward" else range(L - 1, -1, -1)
        saved = []
        for t in steps:
            xt = ops.squeeze(ops.slice(x, [t], [t + 1], axes=[0]), 0)
            a = ops.add(ops.matmul(xt, ops.transpose(wd)), ops.matmul(h, ops.transpose(rd)))
            if bias is not None:
                a = ops.add(a, bias)
            gi, go, gf, gc = ops.split(a, [H, H, H, H], dim=1)
            i, o, f, cc = ops.sigmoid(gi), ops.sigmoid(go), ops.sigmoid(gf), ops.tanh(gc)
            c_new = ops.add(ops.mul(f, c), ops.mul(i, cc))
            tc = ops.tanh(c_new)
            saved.append((t, xt, h, c, i, o, f, cc, tc))
            h = ops.mul(o, tc)
            c = c_new
        dh = zeros((N, H), x.dtype)
        dc = zeros((N, H), x.dtype)
        if gyh is not None:
            dh = ops.add(dh, ops.squeeze(ops.slice(gyh, [d], [d + 1], axes=[0]), 0))
        if gyc is not None:
            dc = ops.add(dc, ops.squeeze(ops.slice(gyc, [d], [d + 1], axes=[0]), 0))
        dx = [None] * L
        dw = dr = db = None
        for t, xt, h_prev, c_prev, i, o, f, cc, tc in reversed(saved):
            if gy is not None:
                dh = ops.add(dh, ops.reshape(ops.slice(gy, [t, d], [t + 1, d + 1], axes=[0, 1]), (N, H)))
            dc = ops.add(dc, ops.mul(ops.mul(dh, o), ops.sub(one, ops.mul(tc, tc))))
            da = ops.concat(
                [
                    ops.mul(ops.mul(dc, cc), ops.mul(i, ops.sub(one, i))),
                    ops.mul(ops.mul(dh, tc), ops.mul(o, ops.sub(one, o))),
                    ops.mul(ops.mul(dc, c_prev), ops.mul(f, ops.sub(one, f))),
                    ops.mul(ops.mul(dc, i), ops.sub(one, ops.mul(cc, cc))),
                ],
                dim=1,
            )
            dx[t] = ops.matmul(da, wd)
            daT = ops.transpose(da)
            dw = _acc(dw, ops.matmul(daT, xt))
            dr = _acc(dr, ops.matmul(daT, h_prev))
            db = _acc(db, ops.sum(da, dim=0))
            dh = ops.matmul(da, rd)
            dc = ops.mul(dc, f)
        res["x"].append(ops.concat([ops.unsqueeze(v, 0) for v in dx], dim=0))
        res["w"].append(ops.unsqueeze(dw, 0))
        res["r"].append(ops.unsqueeze(dr, 0))
        res["b"].append(ops.unsqueeze(ops.concat([db, db], dim=0), 0))
        res["h0"].append(ops.unsqueeze(dh, 0))
        res["c0"].append(ops.unsqueeze(dc, 0))

    out = _rnn_input_grads(res, b, h0) + [_rnn_total(res, "c0") if c0 is not None else None, None]
    return [g if need else None for g, need in zip(out[:n_in], ctx.needs)]


def _gru(ctx, grads):
    """GRU's gradient (gate order z, r, h, either ``linear_before_reset``): opsnn::GRUGrad, or the
    registry-op composition below where the LSTM rule keeps it; default activations, no clip."""
    ins = list(ctx.inputs) + [None] * (6 - len(ctx.inputs))
    x, w, r, b, seq, h0 = ins
    n_in = len(ctx.inputs)
    if not _rnn_fused_ok(ctx, 2):
        return [None] * n_in
    if _rnn_composed(ctx, x, seq):
        return _gru_composed(ctx, grads)
    gy, gyh = (None if g is None else _like(g, x) for g in (list(grads) + [None, None])[:2])
    dx, dw, dr, db, dh0 = _ops().gru_backward(
        x,
        w,
        r,
        b,
        seq,
        h0,
        gy,
        gyh,
        direction=_s(ctx.attrs.get("direction", "forward")).lower(),
        layout=int(ctx.attrs.get("layout", 0)),
        linear_before_reset=int(ctx.attrs.get("linear_before_reset", 0)),
    )
    res = [dx, dw, dr, db if b is not None else None, None, dh0 if h0 is not None else None]
    return [g if need else None for g, need in zip(res[:n_in], ctx.needs)]


_gru.outputs = 2  # Y and Y_h


def _gru_composed(ctx, grads):
    """Backpropagation through time for ONNX GRU with registry ops (float64, time-major, no
    sequence_lens: see ``_rnn_composed``)."""
    ops = _ops()
    ins = list(ctx.inputs) + [None] * (6 - len(ctx.inputs))
    x, w, r, b, seq, h0 = ins
    n_in = len(ctx.inputs)
    lbr = int(ctx.attrs.get("linear_before_reset", 0))
    direction = _s(ctx.attrs.get("direction", "forward")).lower()
    dirs = ["forward", "reverse"] if direction == "bidirectional" else [direction]
    L, N, _ = x.shape
    H = r.shape[2]
    gy, gyh = (list(grads) + [None, None])[:2]
    one = _const(1, x)
    res = {k: [] for k in ("x", "w", "r", "b", "h0")}
    for d, name in enumerate(dirs):

        def sel(t, d=d):
            return ops.squeeze(ops.slice(t, [d], [d + 1], axes=[0]), 0)

        wd, rd = sel(w), sel(r)
        r_zr, r_h = ops.slice(rd, [0], [2 * H]), ops.slice(rd, [2 * H], [3 * H])
        if b is not None:
            bd = sel(b)
            wb, rb = ops.slice(bd, [0], [3 * H]), ops.slice(bd, [3 * H], [6 * H])
        else:
            wb = rb = zeros((3 * H,), x.dtype)
        rb_zr, rb_h = ops.slice(rb, [0], [2 * H]), ops.slice(rb, [2 * H], [3 * H])
        h = zeros((N, H), x.dtype) if h0 is None else sel(h0)
        steps = range(L) if name == "forward" else range(L - 1, -1, -1)
        saved = []
        for t in steps:
            xt = ops.squeeze(ops.slice(x, [t], [t + 1], axes=[0]), 0)
            ax = ops.add(ops.matmul(xt, ops.transpose(wd)), wb)
            ax_zr, ax_h = ops.split(ax, [2 * H, H], dim=1)
            zr = ops.sigmoid(ops.add(ax_zr, ops.add(ops.matmul(h, ops.transpose(r_zr)), rb_zr)))
            z, rr = ops.split(zr, [H, H], dim=1)
            if lbr:
                hr = ops.add(ops.matmul(h, ops.transpose(r_h)), rb_h)
                hh = ops.tanh(ops.add(ax_h, ops.mul(rr, hr)))
            else:
                hr = ops.mul(rr, h)
                hh = ops.tanh(ops.add(ax_h, ops.add(ops.matmul(hr, ops.transpose(r_h)), rb_h)))
            saved.append((t, xt, h, z, rr, hh, hr))
            h = ops.add(ops.mul(ops.sub(one, z), hh), ops.mul(z, h))
        dh = zeros((N, H), x.dtype) if gyh is None else sel(gyh)
        dx = [None] * L
        dw = dr_zr = dr_h = dwb = drb_zr = drb_h = None
        for t, xt, h_prev, z, rr, hh, hr in reversed(saved):
            if gy is not None:
                dh = ops.add(dh, ops.reshape(ops.slice(gy, [t, d], [t + 1, d + 1], axes=[0, 1]), (N, H)))
            dz = ops.mul(dh, ops.sub(h_prev, hh))
            dah = ops.mul(ops.mul(dh, ops.sub(one, z)), ops.sub(one, ops.mul(hh, hh)))
            dh_prev = ops.mul(dh, z)
            if lbr:
                drr = ops.mul(dah, hr)
                dhr = ops.mul(dah, rr)
                dh_prev = ops.add(dh_prev, ops.matmul(dhr, r_h))
                dr_h = _acc(dr_h, ops.matmul(ops.transpose(dhr), h_prev))
                drb_h = _acc(drb_h, ops.sum(dhr, dim=0))
            else:
                drh = ops.matmul(dah, r_h)
                drr = ops.mul(drh, h_prev)
                dh_prev = ops.add(dh_prev, ops.mul(drh, rr))
                dr_h = _acc(dr_h, ops.matmul(ops.transpose(dah), hr))
                drb_h = _acc(drb_h, ops.sum(dah, dim=0))
            dazr = ops.concat(
                [ops.mul(dz, ops.mul(z, ops.sub(one, z))), ops.mul(drr, ops.mul(rr, ops.sub(one, rr)))], dim=1
            )
            da = ops.concat([dazr, dah], dim=1)
            dx[t] = ops.matmul(da, wd)
            dw = _acc(dw, ops.matmul(ops.transpose(da), xt))
            dwb = _acc(dwb, ops.sum(da, dim=0))
            dr_zr = _acc(dr_zr, ops.matmul(ops.transpose(dazr), h_prev))
            drb_zr = _acc(drb_zr, ops.sum(dazr, dim=0))
            dh = ops.add(dh_prev, ops.matmul(dazr, r_zr))
        res["x"].append(ops.concat([ops.unsqueeze(v, 0) for v in dx], dim=0))
        res["w"].append(ops.unsqueeze(dw, 0))
        res["r"].append(ops.unsqueeze(ops.concat([dr_zr, dr_h], dim=0), 0))
        res["b"].append(ops.unsqueeze(ops.concat([dwb, drb_zr, drb_h], dim=0), 0))
        res["h0"].append(ops.unsqueeze(dh, 0))

    out = _rnn_input_grads(res, b, h0)
    return [g if need else None for g, need in zip(out[:n_in], ctx.needs)]


def _acc(a, b):
    return b if a is None else _ops().add(a, b)


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


# -- more elementwise -----------------------------------------------------------------------------------
def _unary(derivative):
    """A rule ``g * derivative(ops, x, y)`` for a one-input elementwise op."""

    def rule(ctx, grads):
        ops = _ops()
        return [ops.mul(grads[0], derivative(ops, ctx.inputs[0], ctx.outputs[0]))]

    return rule


def _inv_sqrt(ops, v):
    return ops.reciprocal(ops.sqrt(v))


_sin = _unary(lambda ops, x, y: ops.cos(x))
_cos = _unary(lambda ops, x, y: ops.neg(ops.sin(x)))
_tan = _unary(lambda ops, x, y: ops.add(_const(1, y), ops.mul(y, y)))
_asin = _unary(lambda ops, x, y: _inv_sqrt(ops, ops.sub(_const(1, x), ops.mul(x, x))))
_acos = _unary(lambda ops, x, y: ops.neg(_inv_sqrt(ops, ops.sub(_const(1, x), ops.mul(x, x)))))
_atan = _unary(lambda ops, x, y: ops.reciprocal(ops.add(_const(1, x), ops.mul(x, x))))
_sinh = _unary(lambda ops, x, y: ops.cosh(x))
_cosh = _unary(lambda ops, x, y: ops.sinh(x))
_asinh = _unary(lambda ops, x, y: _inv_sqrt(ops, ops.add(ops.mul(x, x), _const(1, x))))
_acosh = _unary(lambda ops, x, y: _inv_sqrt(ops, ops.sub(ops.mul(x, x), _const(1, x))))
_atanh = _unary(lambda ops, x, y: ops.reciprocal(ops.sub(_const(1, x), ops.mul(x, x))))
_softsign = _unary(
    lambda ops, x, y: ops.reciprocal(ops.mul(ops.add(_const(1, x), ops.abs(x)), ops.add(_const(1, x), ops.abs(x))))
)


def _zero(ctx, grads):
    """Piecewise-constant ops (Sign, Floor, Ceil, Round, Hardmax): a zero gradient, as torch gives."""
    x = ctx.inputs[0]
    return [zeros(tuple(x.shape), grads[0].dtype)] + [None] * (len(ctx.inputs) - 1)


def _extremum(ctx, grads):
    """Max / Min of n inputs: the gradient goes to the inputs equal to the result, split evenly
    between ties (torch's maximum / minimum)."""
    ops, g = _ops(), grads[0]
    y = ctx.outputs[0]
    hits = [ops.cast(ops.eq(x, y), g.dtype) for x in ctx.inputs]
    count = hits[0]
    for h in hits[1:]:
        count = ops.add(count, h)
    share = ops.div(g, count)
    return [
        unbroadcast(ops.mul(share, h), x.shape) if need else None for h, x, need in zip(hits, ctx.inputs, ctx.needs)
    ]


def _mean_n(ctx, grads):
    ops = _ops()
    g = ops.div(grads[0], _const(len(ctx.inputs), grads[0]))
    return [unbroadcast(g, t.shape) if need else None for t, need in zip(ctx.inputs, ctx.needs)]


def _mod(ctx, grads):
    """A - q * B with q the integer quotient (floored, or truncated for fmod=1), read back from the
    output: dA = g, dB = -q * g."""
    ops, g = _ops(), grads[0]
    a, b = ctx.inputs
    if a.dtype.kind != "f" and str(a.dtype) != "bfloat16":
        return [None, None]
    q = ops.round(ops.div(ops.sub(a, ctx.outputs[0]), b))
    return [
        unbroadcast(g, a.shape) if ctx.needs[0] else None,
        unbroadcast(ops.neg(ops.mul(g, q)), b.shape) if ctx.needs[1] else None,
    ]


def _cast_like(ctx, grads):
    return _cast(ctx, grads)[:1] + [None]


# -- more activations ------------------------------------------------------------------------------------
def _attr(ctx, name: str, default: float) -> float:
    v = ctx.attrs.get(name)
    return default if v is None else float(v)


def _positive_part(ctx, g, negative):
    """``g`` where x > 0, ``negative`` (a tensor) elsewhere."""
    ops = _ops()
    x = ctx.inputs[0]
    return ops.where(ops.gt(x, _const(0, x)), g, negative)


def _elu(ctx, grads):
    ops, g = _ops(), grads[0]
    alpha = _attr(ctx, "alpha", 1.0)
    y = ctx.outputs[0]
    return [_positive_part(ctx, g, ops.mul(g, ops.add(y, _const(alpha, y))))]


def _celu(ctx, grads):
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    alpha = _attr(ctx, "alpha", 1.0)
    return [_positive_part(ctx, g, ops.mul(g, ops.exp(ops.div(x, _const(alpha, x)))))]


def _selu(ctx, grads):
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    alpha, gamma = _attr(ctx, "alpha", 1.6732631921768188), _attr(ctx, "gamma", 1.0507010221481323)
    gg = ops.mul(g, _const(gamma, g))
    return [_positive_part(ctx, gg, ops.mul(gg, ops.mul(_const(alpha, x), ops.exp(x))))]


def _band(x, lo: float, hi: float):
    """lo < x < hi as a mask."""
    ops = _ops()
    return ops.logical_and(ops.gt(x, _const(lo, x)), ops.lt(x, _const(hi, x)))


def _hard_sigmoid(ctx, grads):
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    alpha, beta = _attr(ctx, "alpha", 0.2), _attr(ctx, "beta", 0.5)
    z = ops.add(ops.mul(x, _const(alpha, x)), _const(beta, x))
    return [ops.where(_band(z, 0.0, 1.0), ops.mul(g, _const(alpha, g)), _const(0, g))]


def _hard_swish(ctx, grads):
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    d = ops.add(ops.mul(x, _const(1 / 3, x)), _const(0.5, x))  # (2x + 3) / 6 inside (-3, 3)
    d = ops.where(_band(x, -3.0, 3.0), d, ops.cast(ops.ge(x, _const(3, x)), x.dtype))
    return [ops.mul(g, d)]


def _mish(ctx, grads):
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    t = ops.tanh(ops.softplus(x))
    d = ops.add(t, ops.mul(ops.mul(x, ops.sigmoid(x)), ops.sub(_const(1, x), ops.mul(t, t))))
    return [ops.mul(g, d)]


def _thresholded_relu(ctx, grads):
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    return [ops.where(ops.gt(x, _const(_attr(ctx, "alpha", 1.0), x)), g, _const(0, g))]


def _shrink(ctx, grads):
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    if x.dtype.kind != "f" and str(x.dtype) != "bfloat16":
        return [None]
    lambd = _attr(ctx, "lambd", 0.5)
    return [ops.where(_band(x, -lambd, lambd), _const(0, g), g)]


def _prelu(ctx, grads):
    ops, g = _ops(), grads[0]
    x, slope = ctx.inputs
    neg = ops.le(x, _const(0, x))
    return [
        ops.where(neg, ops.mul(g, slope), g) if ctx.needs[0] else None,
        unbroadcast(ops.where(neg, ops.mul(g, x), _const(0, g)), slope.shape) if ctx.needs[1] else None,
    ]


# -- more reductions -------------------------------------------------------------------------------------
def _reduce_rule(derivative):
    """A Reduce* rule ``expand(g) * derivative(ops, x, y)`` (g and y with the reduced dims kept as
    1); with no axes and noop_with_empty_axes the op is elementwise and ``y`` is its output."""

    def rule(ctx, grads):
        ops, g = _ops(), grads[0]
        x = ctx.inputs[0]
        y = ctx.outputs[0]
        axes = _reduce_axes(ctx, x.ndim)
        if axes is not None:
            kshape = tuple(1 if i in axes else s for i, s in enumerate(x.shape))
            g, y = ops.reshape(g, kshape), ops.reshape(y, kshape)
        d = ops.mul(g, derivative(ops, x, y))
        return [d if tuple(d.shape) == tuple(x.shape) else ops.expand(d, *x.shape)] + [None] * (len(ctx.inputs) - 1)

    return rule


def _reduce_extremum(ctx, grads):
    """ReduceMax / ReduceMin: split evenly between the elements equal to the result (torch's amax)."""
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    axes = _reduce_axes(ctx, x.ndim)
    if axes is None:
        return [g] + [None] * (len(ctx.inputs) - 1)
    kshape = tuple(1 if i in axes else s for i, s in enumerate(x.shape))
    hit = ops.cast(ops.eq(x, ops.reshape(ctx.outputs[0], kshape)), g.dtype)
    share = ops.div(ops.reshape(g, kshape), ops.sum(hit, dim=axes, keepdim=True))
    return [ops.mul(hit, share)] + [None] * (len(ctx.inputs) - 1)


def _reduce_prod(ctx, grads):
    """The product of the other elements of each reduced group, from exclusive cumulative products
    from both ends (exact with zeros, unlike y / x)."""
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    axes = _reduce_axes(ctx, x.ndim)
    if axes is None:
        return [g] + [None] * (len(ctx.inputs) - 1)
    kept = [i for i in range(x.ndim) if i not in axes]
    perm = kept + list(axes)
    inv = [perm.index(i) for i in range(x.ndim)]
    xt = ops.transpose(x, perm) if perm != list(range(x.ndim)) else x
    rows = int(np.prod([x.shape[i] for i in kept])) if kept else 1
    n = int(np.prod([x.shape[i] for i in axes])) if axes else 1
    x2 = ops.reshape(xt, (rows, n))
    others = ops.mul(ops.cumprod(x2, 1, exclusive=True), ops.cumprod(x2, 1, exclusive=True, reverse=True))
    d = ops.reshape(ops.mul(others, ops.reshape(g, (rows, 1))), tuple(xt.shape))
    return [ops.transpose(d, inv) if perm != list(range(x.ndim)) else d] + [None] * (len(ctx.inputs) - 1)


def _cumsum(ctx, grads):
    """The adjoint of a cumulative sum: the same sum run the other way (exclusive stays exclusive)."""
    ops = _ops()
    axis = int(np.asarray(ctx.value(1)).reshape(-1)[0])
    rev = not int(ctx.attrs.get("reverse", 0))
    return [ops.cumsum(grads[0], axis, exclusive=bool(int(ctx.attrs.get("exclusive", 0))), reverse=rev), None]


# -- more shape and index --------------------------------------------------------------------------------
def _moved(ctx, grads):
    """Pure data movement (Tile, DepthToSpace, SpaceToDepth, GatherElements, GatherND, reflect and
    edge Pad, ...): the op run on the input's flat positions (+1, so a filled 0 reads as "no
    source") says where each output element came from; the gradient is added back there."""
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    pos = tensor(np.arange(1, x.numel + 1, dtype=np.int64).reshape(x.shape))
    rest = list(ctx.inputs[1:])
    if ctx.op == "Pad" and len(rest) > 1:
        rest[1] = None  # the constant value (float) pads positions with 0 = "no source" anyway
    src = ops.run_op(ctx.op, [pos] + rest, ctx.attrs)[0].numpy() - 1
    g = ops.where(tensor(src >= 0), g, _const(0, g)) if (src < 0).any() else g
    return [_scatter_into(np.maximum(src, 0), g, tuple(x.shape), add=True)] + [None] * len(rest)


def _self_adjoint(ctx, grads):
    """A linear op that is its own adjoint (Trilu's mask, ReverseSequence's flip): itself on g."""
    return [_ops().run_op(ctx.op, [grads[0]] + list(ctx.inputs[1:]), ctx.attrs)[0]] + [None] * (len(ctx.inputs) - 1)


# -- more convolution and pooling ------------------------------------------------------------------------
def _conv_transpose(ctx, grads):
    """ConvTranspose is the adjoint of Conv: dX is a Conv of g by W, dW correlates g with X (Conv's
    weight gradient with the roles swapped: opsnn::ConvBackwardWeight of g by X), dB sums g. Explicit
    pads only (auto_pad, output_shape: no rule yet, a typed error)."""
    ops, g = _ops(), grads[0]
    x, w = ctx.inputs[0], ctx.inputs[1]
    b = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    n_in = len(ctx.inputs)
    if _s(ctx.attrs.get("auto_pad", "NOTSET")) != "NOTSET" or ctx.attrs.get("output_shape"):
        return [None] * n_in
    nd = x.ndim - 2
    k = list(w.shape[2:])
    s = _ints_attr(ctx.attrs, "strides", nd, 1)
    d = _ints_attr(ctx.attrs, "dilations", nd, 1)
    groups = int(ctx.attrs.get("group", 1))
    pads = _ints_attr(ctx.attrs, "pads", 2 * nd, 0)
    res = [None] * 3
    if ctx.needs[0]:
        res[0] = ops.run_op("Conv", [g, w], {"strides": s, "dilations": d, "pads": pads, "group": groups})[0]
    opad = _ints_attr(ctx.attrs, "output_padding", nd, 0)
    if ctx.needs[1] and all(opad[i] < s[i] for i in range(nd)):
        # the Conv that ConvTranspose is the adjoint of maps g back to x's shape: its weight gradient
        attrs = {"strides": s, "dilations": d, "group": groups, "pads": pads, "weight_shape": list(w.shape)}
        res[1] = ops.run_op("ConvBackwardWeight", [g, x], attrs, domain="opsnn")[0]
    elif ctx.needs[1]:
        cg, og = x.shape[1] // groups, w.shape[1]
        swap = [1, 0] + list(range(2, nd + 2))
        parts = []
        for gi in range(groups):
            xg = x if groups == 1 else ops.slice(x, [gi * cg], [(gi + 1) * cg], axes=[1])
            gg = g if groups == 1 else ops.slice(g, [gi * og], [(gi + 1) * og], axes=[1])
            r = ops.run_op(
                "Conv", [ops.transpose(gg, swap), ops.transpose(xg, swap)], {"strides": d, "dilations": s, "pads": pads}
            )[0]
            if list(r.shape[2:]) != k:
                r = ops.slice(r, [0] * nd, k, axes=list(range(2, nd + 2)))
            parts.append(ops.transpose(r, swap))
        res[1] = parts[0] if groups == 1 else ops.concat(parts, dim=0)
    if b is not None and ctx.needs[2]:
        res[2] = ops.sum(g, dim=[0] + list(range(2, nd + 2)))
    return res[:n_in]


def _global_max_pool(ctx, grads):
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    axes = list(range(2, x.ndim))
    hit = ops.cast(ops.eq(x, ctx.outputs[0]), g.dtype)
    return [ops.mul(hit, ops.div(g, ops.sum(hit, dim=axes, keepdim=True)))]


def _adaptive_avg_pool(ctx, grads):
    """Each output averages its window [floor(i*In/Out), ceil((i+1)*In/Out)): per pooled axis, g
    times the (Out, In) averaging matrix, transposed."""
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    sizes = [int(v) for v in ctx.attrs["output_size"]]
    for a in range(x.ndim - len(sizes), x.ndim):
        n_in, n_out = x.shape[a], g.shape[a]
        m = np.zeros((n_out, n_in))
        for i in range(n_out):
            lo, hi = math.floor(i * n_in / n_out), math.ceil((i + 1) * n_in / n_out)
            m[i, lo:hi] = 1.0 / (hi - lo)
        perm = list(range(g.ndim))
        perm[a], perm[-1] = perm[-1], perm[a]
        gt = ops.transpose(g, perm) if a != g.ndim - 1 else g
        gt = ops.matmul(gt, _const(m, g))
        g = ops.transpose(gt, perm) if a != g.ndim - 1 else gt
    return [g]


def _instance_norm(ctx, grads):
    """GroupNormalization's backward op with one channel per group."""
    x, scale = ctx.inputs[:2]
    attrs = {"num_groups": int(x.shape[1]), "epsilon": _attr(ctx, "epsilon", 1e-5)}
    dx, dscale, dbias = _norm_grad("GroupNormalizationGrad", grads[0], x, [scale], attrs, 3)
    return [dx if ctx.needs[0] else None, dscale if ctx.needs[1] else None, dbias if ctx.needs[2] else None]


# -- plain RNN ---------------------------------------------------------------------------------------------
_RNN_ACTS = {
    "tanh": lambda ops, h: ops.sub(_const(1, h), ops.mul(h, h)),
    "sigmoid": lambda ops, h: ops.mul(h, ops.sub(_const(1, h), h)),
    "relu": lambda ops, h: ops.cast(ops.gt(h, _const(0, h)), h.dtype),
}


def _rnn(ctx, grads):
    """Gradient of ONNX RNN, H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb) with f Tanh (the default),
    Sigmoid or Relu: opsnn::RNNGrad, or the registry-op composition where the LSTM rule keeps it;
    no clip."""
    ins = list(ctx.inputs) + [None] * (6 - len(ctx.inputs))
    x, w, r, b, seq, h0 = ins
    n_in = len(ctx.inputs)
    direction = _s(ctx.attrs.get("direction", "forward")).lower()
    dirs = ["forward", "reverse"] if direction == "bidirectional" else [direction]
    acts = [_s(a).lower() for a in (ctx.attrs.get("activations") or ["tanh"] * len(dirs))]
    if len(acts) == 1 and len(dirs) == 2:
        acts = acts * 2
    if (
        ctx.attrs.get("clip") is not None
        or len(acts) != len(dirs)
        or any(a not in _RNN_ACTS for a in acts)
        or ctx.attrs.get("activation_alpha") is not None
        or ctx.attrs.get("activation_beta") is not None
    ):
        return [None] * n_in
    if _rnn_composed(ctx, x, seq):
        return _rnn_composed_grads(ctx, grads, dirs, acts)
    gy, gyh = (None if g is None else _like(g, x) for g in (list(grads) + [None, None])[:2])
    dx, dw, dr, db, dh0 = _ops().rnn_backward(
        x, w, r, b, seq, h0, gy, gyh, direction=direction, layout=int(ctx.attrs.get("layout", 0)), activations=acts
    )
    res = [dx, dw, dr, db if b is not None else None, None, dh0 if h0 is not None else None]
    return [g if need else None for g, need in zip(res[:n_in], ctx.needs)]


_rnn.outputs = 2  # Y and Y_h


def _rnn_composed_grads(ctx, grads, dirs, acts):
    """Backpropagation through time for ONNX RNN with registry ops (float64, time-major, no
    sequence_lens: see ``_rnn_composed``)."""
    ops = _ops()
    x, w, r, b, seq, h0 = list(ctx.inputs) + [None] * (6 - len(ctx.inputs))
    n_in = len(ctx.inputs)
    L, N, _ = x.shape
    H = r.shape[2]
    gy, gyh = (list(grads) + [None, None])[:2]
    res = {k: [] for k in ("x", "w", "r", "b", "h0")}
    for d, name in enumerate(dirs):

        def sel(t, d=d):
            return ops.squeeze(ops.slice(t, [d], [d + 1], axes=[0]), 0)

        wd, rd = sel(w), sel(r)
        bias = None
        if b is not None:
            bd = sel(b)
            bias = ops.add(ops.slice(bd, [0], [H]), ops.slice(bd, [H], [2 * H]))
        f = getattr(ops, acts[d])
        h = zeros((N, H), x.dtype) if h0 is None else sel(h0)
        steps = range(L) if name == "forward" else range(L - 1, -1, -1)
        saved = []
        for t in steps:
            xt = ops.squeeze(ops.slice(x, [t], [t + 1], axes=[0]), 0)
            a = ops.add(ops.matmul(xt, ops.transpose(wd)), ops.matmul(h, ops.transpose(rd)))
            h_new = f(a if bias is None else ops.add(a, bias))
            saved.append((t, xt, h, h_new))
            h = h_new
        dh = zeros((N, H), x.dtype) if gyh is None else sel(gyh)
        dx = [None] * L
        dw = dr = db = None
        for t, xt, h_prev, h_t in reversed(saved):
            if gy is not None:
                dh = ops.add(dh, ops.reshape(ops.slice(gy, [t, d], [t + 1, d + 1], axes=[0, 1]), (N, H)))
            da = ops.mul(dh, _RNN_ACTS[acts[d]](ops, h_t))
            dx[t] = ops.matmul(da, wd)
            daT = ops.transpose(da)
            dw = _acc(dw, ops.matmul(daT, xt))
            dr = _acc(dr, ops.matmul(daT, h_prev))
            db = _acc(db, ops.sum(da, dim=0))
            dh = ops.matmul(da, rd)
        res["x"].append(ops.concat([ops.unsqueeze(v, 0) for v in dx], dim=0))
        res["w"].append(ops.unsqueeze(dw, 0))
        res["r"].append(ops.unsqueeze(dr, 0))
        res["b"].append(ops.unsqueeze(ops.concat([db, db], dim=0), 0))
        res["h0"].append(ops.unsqueeze(dh, 0))

    out = _rnn_input_grads(res, b, h0)
    return [g if need else None for g, need in zip(out[:n_in], ctx.needs)]


# -- statistics and normalizations --------------------------------------------------------------------------
def _var(ctx, grads):
    """d var / dx = 2 (x - mean) / (N - correction)."""
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    axes = _reduce_axes(ctx, x.ndim)
    if axes is None:  # nothing reduced: the variance of one value is constant
        return [zeros(tuple(x.shape), g.dtype)] + [None] * (len(ctx.inputs) - 1)
    n = int(np.prod([x.shape[a] for a in axes])) if axes else 1
    denom = max(n - float(ctx.attrs.get("correction", 1.0)), 0.0)
    kshape = tuple(1 if i in axes else s for i, s in enumerate(x.shape))
    xc = ops.sub(x, ops.mean(x, dim=axes, keepdim=True))
    return [ops.mul(ops.mul(xc, _const(2.0 / denom, x)), ops.reshape(g, kshape))] + [None] * (len(ctx.inputs) - 1)


def _mvn(ctx, grads):
    """y = (x - mean) / (std + 1e-9) over ``axes`` (the op's epsilon is added to the std)."""
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    axes = sorted({int(a) % x.ndim for a in ctx.attrs["axes"]})
    n = float(np.prod([x.shape[a] for a in axes]))
    xc = ops.sub(x, ops.mean(x, dim=axes, keepdim=True))
    std = ops.sqrt(ops.mean(ops.mul(xc, xc), dim=axes, keepdim=True))
    sigma = ops.add(std, _const(1e-9, x))
    gc = ops.sub(g, ops.mean(g, dim=axes, keepdim=True))
    dstd = ops.div(ops.sum(ops.mul(g, xc), dim=axes, keepdim=True), ops.mul(sigma, sigma))
    return [ops.sub(ops.div(gc, sigma), ops.div(ops.mul(xc, dstd), ops.mul(std, _const(n, x))))]


def _lp_normalization(ctx, grads):
    """y = x / ||x||_p along axis (p 1 or 2): dx = g / n - sum(g x) / n^2 * dn/dx, dn/dx = sign(x)
    for p = 1 and x / n for p = 2; 0 where the norm is 0, as the forward gives."""
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    axis = int(ctx.attrs.get("axis", -1)) % x.ndim
    p = int(ctx.attrs.get("p", 2))
    if p == 1:
        n = ops.sum(ops.abs(x), dim=axis, keepdim=True)
        dn = ops.sign(x)
    else:
        n = ops.sqrt(ops.sum(ops.mul(x, x), dim=axis, keepdim=True))
        dn = ops.div(x, n)
    dot = ops.sum(ops.mul(g, x), dim=axis, keepdim=True)
    dx = ops.sub(ops.div(g, n), ops.mul(ops.div(dot, ops.mul(n, n)), dn))
    return [ops.where(ops.gt(n, _const(0, n)), dx, _const(0, dx))]


def _lrn(ctx, grads):
    """y_c = x_c D_c^-beta, D_c = bias + alpha / size * (sum of x^2 over the channel window of c):
    dx_k = g_k D_k^-beta - 2 beta alpha / size x_k * sum over the windows holding k of g_c x_c D_c^(-beta-1).
    The window sums are a (C, C) band matrix on the channel axis."""
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    size, alpha = int(ctx.attrs["size"]), _attr(ctx, "alpha", 1e-4)
    beta, bias = _attr(ctx, "beta", 0.75), _attr(ctx, "bias", 1.0)
    C = x.shape[1]
    band = np.zeros((C, C))
    for c in range(C):
        band[c, max(0, c - (size - 1) // 2) : min(C - 1, c + math.ceil((size - 1) / 2)) + 1] = 1.0
    perm = [0] + list(range(2, x.ndim)) + [1]
    inv = [perm.index(i) for i in range(x.ndim)]

    def channels(t, m):  # t's channel axis multiplied by m: sum_k m[c, k] t_k
        return ops.transpose(ops.matmul(ops.transpose(t, perm), _const(m.T, t)), inv)

    d = ops.add(_const(bias, x), ops.mul(_const(alpha / size, x), channels(ops.mul(x, x), band)))
    d_beta = ops.pow(d, _const(-beta, x))
    inner = ops.div(ops.mul(ops.mul(g, x), d_beta), d)
    back = channels(inner, band.T)
    return [ops.sub(ops.mul(g, d_beta), ops.mul(ops.mul(x, back), _const(2 * beta * alpha / size, x)))]


def _global_lp_pool(ctx, grads):
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    p = float(ctx.attrs.get("p", 2))
    y = ctx.outputs[0]
    ax = ops.abs(x)
    d = ops.mul(ops.sign(x), ops.pow(ops.div(ax, y), _const(p - 1, x)))
    return [ops.mul(g, d)]


# -- einsum, scatter, resize ------------------------------------------------------------------------------
def _einsum(ctx, grads):
    """The gradient of operand i is an einsum of the output gradient with the other operands onto
    i's subscripts; letters only operand i sums over come back by broadcasting. No ellipsis or
    repeated letters within one operand (diagonals): no rule yet, a typed error."""
    ops, g = _ops(), grads[0]
    eq = _s(ctx.attrs["equation"]).replace(" ", "")
    n_in = len(ctx.inputs)
    lhs, arrow, out = eq.partition("->")
    subs = lhs.split(",")
    if not arrow:
        letters = "".join(subs)
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    if "." in eq or any(len(set(s)) != len(s) for s in subs) or len(subs) != n_in:
        return [None] * n_in
    res = []
    for i, (s, t) in enumerate(zip(subs, ctx.inputs)):
        if not ctx.needs[i]:
            res.append(None)
            continue
        others = [j for j in range(n_in) if j != i]
        elsewhere = set(out).union(*(subs[j] for j in others))
        target = "".join(c for c in s if c in elsewhere)
        spec = ",".join([out] + [subs[j] for j in others]) + "->" + target
        r = ops.einsum(spec, g, *[ctx.inputs[j] for j in others])
        if target != s:
            r = r.reshape(tuple(t.shape[k] if c in elsewhere else 1 for k, c in enumerate(s)))  # a view
            r = ops.expand(r, *t.shape)
        res.append(r)
    return res


def _scatter(gather_name: str):
    """ScatterElements / ScatterND without a reduction: dData is g with the written places zeroed,
    dUpdates gathers g there; with reduction 'add' (torch's scatter_add) dData is g itself. The other
    reductions have no rule (a NoGradientError names the op)."""

    def rule(ctx, grads):
        ops, g = _ops(), grads[0]
        x, idx, upd = ctx.inputs
        reduction = _s(ctx.attrs.get("reduction", "none"))
        if reduction not in ("none", "add"):
            return [None, None, None]
        attrs = {k: v for k, v in ctx.attrs.items() if k == "axis"}
        res = [None, None, None]
        if ctx.needs[0]:
            res[0] = (
                g
                if reduction == "add"
                else ops.run_op(ctx.op, [g, idx, zeros(tuple(upd.shape), g.dtype)], ctx.attrs)[0]
            )
        if ctx.needs[2]:
            res[2] = ops.run_op(gather_name, [g, idx], attrs)[0]
        return res

    return rule


def _resize(ctx, grads):
    """Resize is linear in X, separably per axis (each output position a weighted sum of input
    taps, or the extrapolation constant): g times each resized axis' (out, in) weight matrix."""
    from .defs.resize import ResizeSpec

    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    spec = ResizeSpec(x.shape, ctx.attrs, *(ctx.value(i) for i in (1, 2, 3)))
    for a in spec.axes:
        idx, w, extrap = spec.table(a)
        m = np.zeros((spec.out_shape[a], spec.in_shape[a]))
        np.add.at(m, (np.repeat(np.arange(idx.shape[0]), idx.shape[1]), idx.reshape(-1)), w.reshape(-1))
        if extrap is not None:
            m[extrap] = 0.0
        perm = list(range(g.ndim))
        perm[a], perm[-1] = perm[-1], perm[a]
        gt = ops.matmul(ops.transpose(g, perm) if a != g.ndim - 1 else g, _const(m, g))
        g = ops.transpose(gt, perm) if a != g.ndim - 1 else gt
    return [g] + [None] * (len(ctx.inputs) - 1)


def _topk(ctx, grads):
    """The values' gradient goes back to the places the indices output names."""
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    axis = int(ctx.attrs.get("axis", -1)) % x.ndim
    base = zeros(tuple(x.shape), g.dtype)
    return [ops.scatter_elements(base, ctx.outputs[1], g, axis=axis, reduction="add"), None]


def _max_unpool(ctx, grads):
    """MaxUnpool writes X at flat positions I of the output: dX reads g there."""
    ops = _ops()
    idx = ctx.inputs[1]
    flat = ops.reshape(grads[0], (-1,))
    return [ops.reshape(ops.gather(flat, ops.reshape(idx, (-1,)), axis=0), tuple(idx.shape))] + [None] * (
        len(ctx.inputs) - 1
    )


def _col2im(ctx, grads):
    """Col2Im adds each column entry into one image pixel (or none, in the padding): its gradient
    reads g at that pixel (Im2Col of g)."""
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    img = [int(v) for v in np.asarray(ctx.value(1)).reshape(-1)]
    blk = [int(v) for v in np.asarray(ctx.value(2)).reshape(-1)]
    nd = len(img)
    dil = _ints_attr(ctx.attrs, "dilations", nd, 1)
    pads = _ints_attr(ctx.attrs, "pads", 2 * nd, 0)
    st = _ints_attr(ctx.attrs, "strides", nd, 1)
    counts = [(img[i] + pads[i] + pads[i + nd] - (dil[i] * (blk[i] - 1) + 1)) // st[i] + 1 for i in range(nd)]
    k_idx = np.stack(np.unravel_index(np.arange(int(np.prod(blk))), blk))[:, :, None]  # (nd, kk, 1)
    l_idx = np.stack(np.unravel_index(np.arange(int(np.prod(counts))), counts))[:, None, :]  # (nd, 1, L)
    pos = [l_idx[i] * st[i] + k_idx[i] * dil[i] - pads[i] for i in range(nd)]
    inside = np.all([(p >= 0) & (p < img[i]) for i, p in enumerate(pos)], axis=0)  # (kk, L)
    flat = np.ravel_multi_index([np.clip(p, 0, img[i] - 1) for i, p in enumerate(pos)], img)
    n, c = g.shape[:2]
    taken = ops.gather(ops.reshape(g, (n, c, -1)), tensor(flat.astype(np.int64)), axis=2)  # (N, C, kk, L)
    taken = ops.where(tensor(inside), taken, _const(0, taken))
    return [ops.reshape(taken, tuple(x.shape)), None, None]


def _dft(ctx, grads):
    """A DFT is linear, y = W x with W[k, t] = exp(-+2 pi i k t / n) (/ n when inverse): dx is
    W^H g, the opposite-direction DFT of g (zero-filled to n bins) kept to the input's first
    min(len, n) samples, scaled by n (forward) or 1/n (inverse); its real part for a real input.
    The onesided inverse (IRFFT, a Hermitian extension): no rule yet, a typed error."""
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    n_in = len(ctx.inputs)
    inverse, onesided = bool(int(ctx.attrs.get("inverse", 0))), bool(int(ctx.attrs.get("onesided", 0)))
    if inverse and onesided:
        return [None] * n_in
    axis = ctx.value(2) if n_in > 2 else None
    axis = (-2 if axis is None else int(np.asarray(axis).reshape(-1)[0])) % x.ndim
    length = ctx.value(1) if n_in > 1 else None
    n = x.shape[axis] if length is None else int(np.asarray(length).reshape(-1)[0])
    if g.shape[axis] < n:  # onesided bins: the others carry no gradient
        fill = list(g.shape)
        fill[axis] = n - g.shape[axis]
        g = ops.concat([g, zeros(tuple(fill), g.dtype)], dim=axis)
    back = ops.dft(g, dim=axis, inverse=not inverse)
    back = ops.mul(back, _const(1.0 / n if inverse else float(n), back))
    m = min(x.shape[axis], n)
    if m < n:
        back = ops.slice(back, [0], [m], axes=[axis])
    if m < x.shape[axis]:  # samples past dft_length were not read
        fill = list(back.shape)
        fill[axis] = x.shape[axis] - m
        back = ops.concat([back, zeros(tuple(fill), back.dtype)], dim=axis)
    if x.shape[-1] == 1:
        back = ops.slice(back, [0], [1], axes=[x.ndim - 1])
    return [back] + [None] * (n_in - 1)


def _cumprod(ctx, grads):
    """dx_j = prod_{k<j} x_k * sum_{i>=j} g_i prod_{j<k<=i} x_k (g shifted by one for exclusive,
    both flipped for reverse): the inner products from a cumulative product of x with the entries
    up to j set to 1, an (L, L) table per row, so zeros in x are exact (no y / x)."""
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    axis = int(np.asarray(ctx.value(1)).reshape(-1)[0]) % x.ndim
    L = x.shape[axis]
    perm = list(range(x.ndim))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    xt, gt = (ops.transpose(x, perm), ops.transpose(g, perm)) if axis != x.ndim - 1 else (x, g)
    flip = tensor(np.arange(L - 1, -1, -1, dtype=np.int64))
    reverse = bool(int(ctx.attrs.get("reverse", 0)))
    if reverse:
        xt, gt = ops.gather(xt, flip, axis=-1), ops.gather(gt, flip, axis=-1)
    if int(ctx.attrs.get("exclusive", 0)) and L:
        lead = tuple(gt.shape[:-1])
        gt = ops.concat([ops.slice(gt, [1], [L], axes=[-1]), zeros(lead + (1,), g.dtype)], dim=-1)
    j, k = np.arange(L)[:, None], np.arange(L)[None, :]
    rows = ops.expand(ops.unsqueeze(xt, -2), *(tuple(xt.shape[:-1]) + (L, L)))
    inner = ops.cumprod(ops.where(tensor(k > j), rows, _const(1, xt)), -1)
    s = ops.sum(ops.mul(ops.where(tensor(k >= j), inner, _const(0, xt)), ops.unsqueeze(gt, -2)), dim=-1)
    dx = ops.mul(ops.cumprod(xt, -1, exclusive=True), s)
    if reverse:
        dx = ops.gather(dx, flip, axis=-1)
    return [ops.transpose(dx, perm) if axis != x.ndim - 1 else dx, None]


def _det(ctx, grads):
    """d det(X) / dX_ij is the cofactor C_ij = (-1)^(i+j) det(minor_ij): the minors gathered from X and
    their Det, so singular matrices (no inverse) get their exact gradient too."""
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    m = x.shape[-1]
    if m == 1:
        return [ops.unsqueeze(ops.unsqueeze(g, -1), -1)]
    keep = tensor(np.array([[j for j in range(m) if j != i] for i in range(m)], dtype=np.int64))  # (M, M-1)
    rows = ops.gather(x, keep, axis=x.ndim - 2)  # (*, M_i, M-1, M)
    minors = ops.gather(rows, keep, axis=rows.ndim - 1)  # (*, M_i, M-1, M_j, M-1)
    nd = minors.ndim
    minors = ops.transpose(minors, list(range(nd - 4)) + [nd - 4, nd - 2, nd - 3, nd - 1])
    sign = _const(1.0 - 2.0 * ((np.arange(m)[:, None] + np.arange(m)[None, :]) % 2), x)
    cof = ops.mul(ops.det(minors), sign)
    return [ops.mul(cof, ops.unsqueeze(ops.unsqueeze(g, -1), -1))]


def _grid_sample(ctx, grads):
    """Both gradients from the dedicated GridSampleGrad record (dX a scatter-add through the taps); an
    integer X (nearest sampling of labels) carries none."""
    x, grid = ctx.inputs[0], ctx.inputs[1]
    if x.dtype.kind != "f" and x.dtype.name != "bfloat16":
        return [None, None]
    a = ctx.attrs
    dx, dgrid = _ops().grid_sample_grad(
        grads[0], x, grid, mode=a["mode"], padding_mode=a["padding_mode"], align_corners=a["align_corners"]
    )
    return [dx if ctx.needs[0] else None, dgrid if ctx.needs[1] else None]


def _roi_align(ctx, grads):
    """dX from the dedicated RoiAlignGrad record (a scatter of each bin's gradient through its taps);
    the boxes get none (as torchvision's roi_align), the batch indices are integers."""
    if not ctx.needs[0]:
        return [None] * len(ctx.inputs)
    x, rois, bidx = ctx.inputs[:3]
    dx = _ops().run_op("RoiAlignGrad", [grads[0], x, rois, bidx], dict(ctx.attrs), domain="opsnn")[0]
    return [dx, None, None]


def _deform_conv(ctx, grads):
    """X, W, offset and mask gradients from the dedicated DeformConvGrad record; B's is dY summed over N
    and space."""
    ins, g = ctx.inputs, grads[0]
    mask = ins[4] if len(ins) > 4 else None
    outs = _ops().run_op("DeformConvGrad", [g, ins[0], ins[1], ins[2], mask], dict(ctx.attrs), domain="opsnn")
    res = [outs[0], outs[1], outs[2], None, outs[3] if mask is not None else None]
    if len(ins) > 3 and ins[3] is not None and ctx.needs[3]:
        res[3] = _ops().sum(g, dim=[0] + list(range(2, g.ndim)))
    return [v if i < len(ctx.needs) and ctx.needs[i] else None for i, v in enumerate(res)][: len(ins)]


def _tensor_scatter(ctx, grads):
    """The cache's gradient is g with the written positions zeroed (TensorScatter of zeros); the
    update's is g read back at those positions (GatherElements at write_indices[b] + j, mod the cache
    length in circular mode), computed from the indices with registry ops, so traced steps follow them."""
    ops, g = _ops(), grads[0]
    past, update = ctx.inputs[0], ctx.inputs[1]
    wi = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    axis = int(ctx.attrs.get("axis", -2)) % past.ndim
    mode = ctx.attrs.get("mode", "linear")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    res = [None] * len(ctx.inputs)
    if ctx.needs[0]:
        zero = zeros(tuple(update.shape), g.dtype)
        res[0] = ops.tensor_scatter(g, zero, wi, mode=mode, axis=axis)
    if ctx.needs[1]:
        nd, s = past.ndim, update.shape[axis]
        start = zeros((past.shape[0],), np.int64) if wi is None else wi
        pos = ops.add(
            ops.reshape(start, (past.shape[0],) + (1,) * (nd - 1)),
            tensor(np.arange(s, dtype=np.int64).reshape([s if i == axis else 1 for i in range(nd)])),
        )
        if mode == "circular":
            pos = ops.remainder(pos, tensor(np.asarray(past.shape[axis], np.int64)))
        res[1] = ops.gather_elements(g, ops.expand(pos, *tuple(update.shape)), axis=axis)
    return res


def _max_roi_pool(ctx, grads):
    """dX from the MaxRoiPoolGrad record (each bin's gradient at its maximum); the boxes get none."""
    if not ctx.needs[0]:
        return [None, None]
    x, rois = ctx.inputs
    return [_ops().run_op("MaxRoiPoolGrad", [grads[0], x, rois], dict(ctx.attrs), domain="opsnn")[0], None]


def _stft(ctx, grads):
    """STFT is the DFT of windowed frames z[b, f, t] = signal[b, f * step + t] * window[t]: dz from the
    DFT rule, the window's gradient sums dz * frames over batch, frames and real/imaginary, the signal's
    adds dz * window back to each frame's samples (overlap-add through ScatterElements)."""
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    win = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    step = int(np.asarray(ctx.value(1)).reshape(-1)[0])
    fl = ctx.value(3) if len(ctx.inputs) > 3 else None
    fl = int(np.asarray(fl).reshape(-1)[0]) if fl is not None else (win.shape[0] if win is not None else x.shape[1])
    B, L, C = x.shape
    F = g.shape[1]
    take = (np.arange(F)[:, None] * step + np.arange(fl)[None, :]).astype(np.int64)  # (F, fl)
    frames = ops.gather(x, tensor(take), axis=1)  # (B, F, fl, C)
    w4 = None if win is None else ops.reshape(win, (1, 1, fl, 1))
    z = frames if w4 is None else ops.mul(frames, w4)
    dft_ctx = GradContext(
        "DFT", [z, None, tensor(np.asarray(2, np.int64))], [], {"inverse": 0, "onesided": ctx.attrs["onesided"]}, []
    )
    dz = _dft(dft_ctx, [g])[0]
    res = [None] * len(ctx.inputs)
    if win is not None and ctx.needs[2]:
        res[2] = ops.sum(ops.mul(dz, frames), dim=[0, 1, 3])
    if ctx.needs[0]:
        df = dz if w4 is None else ops.mul(dz, w4)
        flat = (
            np.arange(B)[:, None, None, None] * (L * C) + take[None, :, :, None] * C + np.arange(C)[None, None, None, :]
        )
        res[0] = _scatter_into(flat, df, (B, L, C), add=True)
    return res


def _one_hot(ctx, grads):
    """Only ``values`` [off, on] is differentiable: each gets g summed over the positions that hold it
    (a 0/1 OneHot of the same indices, run as the op, says which)."""
    ops, g = _ops(), grads[0]
    vals = ctx.inputs[2]
    if not ctx.needs[2] or vals.dtype.kind != "f":
        return [None, None, None]
    on = ops.run_op("OneHot", [ctx.inputs[0], ctx.inputs[1], _const([0, 1], g)], ctx.attrs)[0]
    hot = ops.sum(ops.mul(g, on))
    return [None, None, ops.concat([ops.reshape(ops.sub(ops.sum(g), hot), (1,)), ops.reshape(hot, (1,))], dim=0)]


# -- special functions and binary math (ops/defs/special.py; torch's derivatives.yaml formulas) --------------
def _log1p(ctx, grads):
    x = ctx.inputs[0]
    return [_ops().div(grads[0], _ops().add(x, _const(1, x)))]


def _expm1(ctx, grads):
    y = ctx.outputs[0]
    return [_ops().mul(grads[0], _ops().add(y, _const(1, y)))]


def _erfc(ctx, grads):
    ops = _ops()
    x = ctx.inputs[0]
    return [ops.mul(grads[0], ops.mul(_const(-2 / math.sqrt(math.pi), x), ops.exp(ops.neg(ops.mul(x, x)))))]


def _erfinv(ctx, grads):
    ops = _ops()
    y = ctx.outputs[0]
    return [ops.mul(grads[0], ops.mul(_const(math.sqrt(math.pi) / 2, y), ops.exp(ops.mul(y, y))))]


def _lgamma(ctx, grads):
    return [_ops().mul(grads[0], _ops().digamma(ctx.inputs[0]))]


def _digamma(ctx, grads):
    return [_ops().mul(grads[0], _ops().trigamma(ctx.inputs[0]))]


def _logit(ctx, grads):
    """g / (x (1 - x)); with eps >= 0, 0 where x was clamped (outside [eps, 1 - eps], as torch)."""
    ops, g = _ops(), grads[0]
    x = ctx.inputs[0]
    d = ops.div(g, ops.mul(x, ops.sub(_const(1, x), x)))
    eps = float(ctx.attrs.get("eps", -1.0))
    if eps < 0:
        return [d]
    lo = np.asarray(eps, dtype=x.dtype)
    hi = np.asarray(1, dtype=x.dtype) - lo  # the bounds the forward clamped to, in x's dtype
    out = ops.logical_or(ops.lt(x, _const(lo, x)), ops.gt(x, _const(hi, x)))
    return [ops.where(out, _const(0, d), d)]


def _xlogy(ctx, grads):
    """dA = xlogy(g, B), 0 where A == 0 and B <= 0; dB = g A / B."""
    ops, g = _ops(), grads[0]
    a, b = ctx.inputs
    ga = gb = None
    if ctx.needs[0]:
        at_pole = ops.logical_and(ops.eq(a, _const(0, a)), ops.le(b, _const(0, b)))
        ga = unbroadcast(ops.where(at_pole, _const(0, g), ops.xlogy(g, b)), a.shape)
    if ctx.needs[1]:
        gb = unbroadcast(ops.div(ops.mul(g, a), b), b.shape)
    return [ga, gb]


def _hypot(ctx, grads):
    ops, g = _ops(), grads[0]
    a, b = ctx.inputs
    y = ctx.outputs[0]
    return [
        unbroadcast(ops.div(ops.mul(g, a), y), a.shape) if ctx.needs[0] else None,
        unbroadcast(ops.div(ops.mul(g, b), y), b.shape) if ctx.needs[1] else None,
    ]


def _atan2(ctx, grads):
    """atan2(a, b): dA = g b / (a^2 + b^2), dB = -g a / (a^2 + b^2)."""
    ops, g = _ops(), grads[0]
    a, b = ctx.inputs
    r2 = ops.add(ops.mul(a, a), ops.mul(b, b))
    return [
        unbroadcast(ops.div(ops.mul(g, b), r2), a.shape) if ctx.needs[0] else None,
        unbroadcast(ops.neg(ops.div(ops.mul(g, a), r2)), b.shape) if ctx.needs[1] else None,
    ]


def _copysign(ctx, grads):
    """dA = g * (result / A), 0 where A == 0; the sign source B gets a zero gradient (torch)."""
    ops, g = _ops(), grads[0]
    a, b = ctx.inputs
    ga = gb = None
    if ctx.needs[0]:
        ratio = ops.div(ctx.outputs[0], a)
        ratio = ops.where(ops.eq(a, _const(0, a)), _const(0, ratio), ratio)
        ga = unbroadcast(ops.mul(g, ratio), a.shape)
    if ctx.needs[1]:
        gb = zeros(tuple(b.shape), g.dtype)
    return [ga, gb]


def _logaddexp(ctx, grads):
    ops, g = _ops(), grads[0]
    a, b = ctx.inputs
    one = _const(1, g)
    return [
        unbroadcast(ops.div(g, ops.add(one, ops.exp(ops.sub(b, a)))), a.shape) if ctx.needs[0] else None,
        unbroadcast(ops.div(g, ops.add(one, ops.exp(ops.sub(a, b)))), b.shape) if ctx.needs[1] else None,
    ]


def _fextremum(cmp_name: str):
    """Fmax / Fmin: the whole gradient to A where A wins (ties included) or B is NaN, else to B (torch)."""

    def rule(ctx, grads):
        ops, g = _ops(), grads[0]
        a, b = ctx.inputs
        pick_a = ops.logical_or(getattr(ops, cmp_name)(a, b), ops.isnan(b))
        zero = _const(0, g)
        return [
            unbroadcast(ops.where(pick_a, g, zero), a.shape) if ctx.needs[0] else None,
            unbroadcast(ops.where(pick_a, zero, g), b.shape) if ctx.needs[1] else None,
        ]

    return rule


#: op name -> gradient rule (the table ``attach`` writes onto the records; names are looked up in the
#: default domain, then in opsnn's own, where the fused ops such as Linear live)
RULES = {
    "Add": _add,
    "Sub": _sub,
    "Mul": _mul,
    "Div": _div,
    "Neg": _neg,
    "Pow": _pow,
    "Exp": _exp,
    "Log": _log,
    "Sqrt": _sqrt,
    "Relu": _relu,
    "Sigmoid": _sigmoid,
    "Tanh": _tanh,
    "Gelu": _gelu,
    "Softmax": _softmax,
    "LogSoftmax": _log_softmax,
    "Identity": _identity,
    "Cast": _cast,
    "Swish": _swish,
    "LeakyRelu": _leaky_relu,
    "Abs": _abs,
    "Softplus": _softplus,
    "Erf": _erf,
    "Reciprocal": _reciprocal,
    "Rsqrt": _rsqrt,
    "Where": _where,
    "Clip": _clip,
    "Sum": _sum_n,
    "Split": _split,
    "Pad": _pad,
    "Dropout": _dropout,
    "NativeDropout": _native_dropout,
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Linear": _linear,
    "ReduceSum": _reduce(False),
    "ReduceMean": _reduce(True),
    "Reshape": _reshape_back,
    "Flatten": _reshape_back,
    "Squeeze": _reshape_back,
    "Unsqueeze": _reshape_back,
    "Transpose": _transpose,
    "Expand": _expand,
    "Concat": _concat,
    "Slice": _slice,
    "Gather": _gather,
    "Embedding": _embedding,
    "Conv": _conv,
    "MaxPool": _max_pool,
    "AveragePool": _average_pool,
    "GlobalAveragePool": _global_average_pool,
    "BatchNormalization": _batch_norm,
    "LayerNormalization": _layer_norm,
    "RMSNormalization": _rms_norm,
    "GroupNormalization": _group_norm,
    "Attention": _attention,
    "AttentionTrain": _attention_train,
    "LSTM": _lstm,
    "GRU": _gru,
    "SwiGLU": _swiglu,
    "RotaryEmbedding": _rotary,
    "SoftmaxCrossEntropyLoss": _softmax_cross_entropy,
    "NegativeLogLikelihoodLoss": _nll,
    "CTCLoss": _ctc,
    "Sin": _sin,
    "Cos": _cos,
    "Tan": _tan,
    "Asin": _asin,
    "Acos": _acos,
    "Atan": _atan,
    "Sinh": _sinh,
    "Cosh": _cosh,
    "Asinh": _asinh,
    "Acosh": _acosh,
    "Atanh": _atanh,
    "Sign": _zero,
    "Floor": _zero,
    "Ceil": _zero,
    "Round": _zero,
    "Hardmax": _zero,
    "Max": _extremum,
    "Min": _extremum,
    "Mean": _mean_n,
    "Mod": _mod,
    "CastLike": _cast_like,
    "Elu": _elu,
    "Celu": _celu,
    "Selu": _selu,
    "HardSigmoid": _hard_sigmoid,
    "HardSwish": _hard_swish,
    "Mish": _mish,
    "Softsign": _softsign,
    "ThresholdedRelu": _thresholded_relu,
    "Shrink": _shrink,
    "PRelu": _prelu,
    "ReduceSumSquare": _reduce_rule(lambda ops, x, y: ops.mul(x, _const(2, x))),
    "ReduceL1": _reduce_rule(lambda ops, x, y: ops.sign(x)),
    "ReduceL2": _reduce_rule(lambda ops, x, y: ops.div(x, y)),
    "ReduceLogSum": _reduce_rule(lambda ops, x, y: ops.exp(ops.neg(y))),
    "ReduceLogSumExp": _reduce_rule(lambda ops, x, y: ops.exp(ops.sub(x, y))),
    "ReduceMax": _reduce_extremum,
    "ReduceMin": _reduce_extremum,
    "ReduceProd": _reduce_prod,
    "CumSum": _cumsum,
    "Tile": _moved,
    "DepthToSpace": _moved,
    "SpaceToDepth": _moved,
    "GatherElements": _moved,
    "GatherND": _moved,
    "Trilu": _self_adjoint,
    "ReverseSequence": _self_adjoint,
    "ConvTranspose": _conv_transpose,
    "GlobalMaxPool": _global_max_pool,
    "AdaptiveAvgPool": _adaptive_avg_pool,
    "InstanceNormalization": _instance_norm,
    "RNN": _rnn,
    "Var": _var,
    "MeanVarianceNormalization": _mvn,
    "LpNormalization": _lp_normalization,
    "LRN": _lrn,
    "GlobalLpPool": _global_lp_pool,
    "Einsum": _einsum,
    "Compress": _moved,
    "CenterCropPad": _moved,
    "ScatterElements": _scatter("GatherElements"),
    "ScatterND": _scatter("GatherND"),
    "Scatter": _scatter("GatherElements"),
    "Resize": _resize,
    "TopK": _topk,
    "MaxUnpool": _max_unpool,
    "LpPool": _lp_pool,
    "Col2Im": _col2im,
    "DFT": _dft,
    "CumProd": _cumprod,
    "Det": _det,
    "GridSample": _grid_sample,
    "RoiAlign": _roi_align,
    "DeformConv": _deform_conv,
    "TensorScatter": _tensor_scatter,
    "MaxRoiPool": _max_roi_pool,
    "STFT": _stft,
    "OneHot": _one_hot,
    "Log1p": _log1p,
    "Expm1": _expm1,
    "Erfc": _erfc,
    "Erfinv": _erfinv,
    "Lgamma": _lgamma,
    "Digamma": _digamma,
    "Logit": _logit,
    "Xlogy": _xlogy,
    "Hypot": _hypot,
    "Atan2": _atan2,
    "Copysign": _copysign,
    "Logaddexp": _logaddexp,
    "Fmax": _fextremum("ge"),
    "Fmin": _fextremum("le"),
}


def attach() -> None:
    """Write every rule onto its op record (called once when ``opsnn.ops`` is imported)."""
    for name, rule in RULES.items():
        rec = get_op(name, "opsnn") if has_op(name, "opsnn") and not has_op(name) else get_op(name)
        if rec.gradient is not None and rec.gradient is not rule:
            raise ParamInvalidError(f"gradients: op {name!r} already has a gradient rule")
        rec.gradient = rule


__all__ = ["RULES", "GradContext", "attach", "unbroadcast"]
