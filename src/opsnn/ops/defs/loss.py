"""Loss ops: ONNX ``SoftmaxCrossEntropyLoss`` (opset 13) and ``NegativeLogLikelihoodLoss``
(opset 22), with numba and numpy-vectorized kernels and torch-style entry points.

Shapes: scores/input ``(N, C, d1, ..., dk)``, labels/target ``(N, d1, ..., dk)``, optional
per-class ``weights (C,)``. ``reduction='mean'`` divides by the summed weights of the
non-ignored targets (the element count without weights).

>>> import opsnn, numpy as np
>>> x = opsnn.tensor(np.array([[2.0, 0.5, -1.0]], np.float32))
>>> t = opsnn.tensor(np.array([0], np.int64))
>>> round(float(opsnn.ops.cross_entropy(x, t).numpy()), 4)
0.2413
"""

from __future__ import annotations

import numpy as np

from ... import dtypes as _dt
from ...errors import ParamInvalidError
from ...kernels.cpu import xent as KX
from ..api import api
from ..registry import Attr, Input, Output, TensorMeta, register_op

FLOAT = _dt.FLOATS
_IND = (_dt.int32, _dt.int64)
_REDUCTIONS = ("none", "sum", "mean")


def _reduction(op, attrs) -> str:
    r = attrs["reduction"]
    r = r.decode() if isinstance(r, bytes) else str(r)
    if r not in _REDUCTIONS:
        raise ParamInvalidError(f"{op}: attribute 'reduction' must be one of {_REDUCTIONS}, got {r!r}", op=op)
    return r


def _check(ctx, first: int) -> tuple:
    """Check scores, labels and weights (inputs ``first``..``first + 2``); return the loss's shape."""
    x, t = ctx.inputs[first], ctx.inputs[first + 1]
    if len(x.shape) < 2:
        ctx.fail(f"input {first} must be (N, C, d1, ..., dk) with rank >= 2, got shape {x.shape}")
    want = (x.shape[0],) + tuple(x.shape[2:])
    if tuple(t.shape) != want:
        ctx.fail(f"labels/target must have shape (N, d1, ..., dk) = {want}, got {t.shape}")
    if ctx.has(first + 2):
        w = ctx.inputs[first + 2]
        if tuple(w.shape) != (x.shape[1],):
            ctx.fail(f"weights must have shape (C,) = ({x.shape[1]},), got {w.shape}")
        if w.dtype != x.dtype:
            ctx.fail(f"weights must have the input's dtype {_dt.name(x.dtype)}, got {_dt.name(w.dtype)}")
    return want if _reduction(ctx.op.name, ctx.attrs) == "none" else ()


def _infer(ctx):
    x = ctx.inputs[0]
    outs = [TensorMeta(_check(ctx, 0), x.dtype)]
    if ctx.op.name == "SoftmaxCrossEntropyLoss":
        outs.append(TensorMeta(tuple(x.shape), x.dtype))
    return outs


# -- reference: element by element ------------------------------------------------------------------------
def _reference(op):
    def ref(ins, attrs):
        x, t = ins[0], ins[1]
        w = ins[2] if len(ins) > 2 else None
        ignore = attrs.get("ignore_index")
        red = _reduction(op, attrs)
        N, C = x.shape[:2]
        Dn = int(np.prod(x.shape[2:], dtype=np.int64))
        xs = x.astype(np.float64).reshape(N, C, Dn)
        ts = t.reshape(N, Dn)
        if op == "SoftmaxCrossEntropyLoss":
            logp = np.empty_like(xs)
            for n in range(N):
                for d in range(xs.shape[2]):
                    col = xs[n, :, d]
                    m = col.max() if C else 0.0
                    logp[n, :, d] = col - m - np.log(np.sum(np.exp(col - m)))
        else:
            logp = xs
        loss = np.zeros(ts.shape)
        wsum = 0.0
        for n in range(N):
            for d in range(ts.shape[1]):
                c = int(ts[n, d])
                if ignore is not None and c == int(ignore):
                    continue
                if not 0 <= c < C:
                    raise ParamInvalidError(f"{op}: target {c} out of range [0, {C})", op=op)
                wc = 1.0 if w is None else float(w[c])
                loss[n, d] = -logp[n, c, d] * wc
                wsum += wc
        if red == "none":
            out = loss.reshape(t.shape)
        elif red == "sum":
            out = np.asarray(loss.sum())
        else:
            with np.errstate(invalid="ignore", divide="ignore"):
                out = np.asarray(loss.sum() / wsum)
        out = out.astype(x.dtype)
        if op == "SoftmaxCrossEntropyLoss":
            return out, logp.reshape(x.shape).astype(x.dtype)
        return out

    return ref


# -- kernel: vectorized numpy -----------------------------------------------------------------------------
def _plan(ctx):
    return {
        "reduction": _reduction(ctx.op.name, ctx.attrs),
        "ignore": ctx.attrs.get("ignore_index"),
        "softmax": ctx.op.name == "SoftmaxCrossEntropyLoss",
        "op": ctx.op.name,
    }


def _loss_kernel(ins, outs, attrs, plan, ws):
    x, t = ins[0], ins[1]
    w = ins[2] if len(ins) > 2 else None
    op = plan["op"]
    N, C = x.shape[:2]
    Dn = int(np.prod(x.shape[2:], dtype=np.int64))
    xs = x.reshape(N, C, Dn)
    if plan["softmax"]:
        logp_out = outs[1].reshape(xs.shape) if len(outs) > 1 else np.empty(xs.shape, x.dtype)
        m = xs.max(axis=1, keepdims=True) if C else np.zeros((N, 1, xs.shape[2]), x.dtype)
        np.subtract(xs, m, out=logp_out)
        lse = np.log(np.exp(logp_out).sum(axis=1, keepdims=True))
        logp_out -= lse
        logp = logp_out
    else:
        logp = xs
    ts = t.reshape(N, Dn).astype(np.int64, copy=False)
    valid = np.ones(ts.shape, bool) if plan["ignore"] is None else ts != int(plan["ignore"])
    if valid.any() and (ts[valid].min() < 0 or ts[valid].max() >= C):
        raise ParamInvalidError(
            f"{op}: targets must lie in [0, {C}) (or equal ignore_index), got values in "
            f"[{ts[valid].min()}, {ts[valid].max()}]",
            op=op,
        )
    safe = np.where(valid, ts, 0)
    picked = np.take_along_axis(logp, safe[:, None, :], axis=1)[:, 0, :]
    wt = valid.astype(x.dtype) if w is None else np.where(valid, w[safe], 0).astype(x.dtype)
    # an ignored entry is left out, not multiplied by weight 0 (0 * Inf and 0 * NaN are NaN)
    loss = np.where(valid, -picked, 0).astype(x.dtype, copy=False) * wt
    red = plan["reduction"]
    if red == "none":
        outs[0][...] = loss.reshape(outs[0].shape)
    elif red == "sum":
        outs[0][...] = loss.sum()
    else:
        with np.errstate(invalid="ignore", divide="ignore"):
            outs[0][...] = loss.sum() / wt.sum()


_ATTRS = [Attr("ignore_index", "int", None), Attr("reduction", "string", "mean")]

SoftmaxCrossEntropyLoss = register_op(
    "SoftmaxCrossEntropyLoss",
    category="loss",
    inputs=[Input("scores", FLOAT), Input("labels", _IND), Input("weights", FLOAT, optional=True)],
    outputs=["output", Output("log_prob", True)],
    attrs=_ATTRS,
    infer=_infer,
    reference=_reference("SoftmaxCrossEntropyLoss"),
    doc="cross entropy of log_softmax(scores) and labels",
)
NegativeLogLikelihoodLoss = register_op(
    "NegativeLogLikelihoodLoss",
    category="loss",
    inputs=[Input("input", FLOAT), Input("target", _IND), Input("weight", FLOAT, optional=True)],
    outputs=["loss"],
    attrs=_ATTRS,
    infer=_infer,
    reference=_reference("NegativeLogLikelihoodLoss"),
    doc="negative log likelihood of log-probabilities",
)
for _rec, _name in ((SoftmaxCrossEntropyLoss, "softmax_xent_numpy"), (NegativeLogLikelihoodLoss, "nll_numpy")):
    _rec.kernel(
        _name,
        dtypes=(_dt.float32, _dt.float64),
        priority=10,
        plan=_plan,
        doc="vectorized numpy (gather by take_along_axis)",
    )(_loss_kernel)


# -- kernel: numba rows (one pass per row, float64 row sums and loss) ----------------------------------------
def _xent_plan(ctx):
    return {
        "reduction": _reduction(ctx.op.name, ctx.attrs),
        "ignore": ctx.attrs.get("ignore_index"),
        "rows": KX.xent_plan(tuple(ctx.shape(0 if ctx.op.name == "SoftmaxCrossEntropyLoss" else 1))),
        "op": ctx.op.name,
    }


def _xent_kernel(ins, outs, attrs, plan, ws):
    w = ins[2] if len(ins) > 2 else None
    logp = outs[1] if len(outs) > 1 else None
    KX.xent_forward(ins[0], ins[1], w, plan["ignore"], plan["reduction"], plan["rows"], outs[0], logp, plan["op"])


SoftmaxCrossEntropyLoss.kernel(
    "softmax_xent_numba",
    dtypes=(_dt.float32, _dt.float64),
    priority=20,
    plan=_xent_plan,
    doc="numba, parallel over rows: online max/sum per row in one pass, float64 row sums and loss; "
    "log_prob written only when asked for",
)(_xent_kernel)


def _nll_kernel(ins, outs, attrs, plan, ws):
    w = ins[2] if len(ins) > 2 else None
    KX.nll_forward(ins[0], ins[1], w, plan["ignore"], plan["reduction"], outs[0], "NegativeLogLikelihoodLoss")


NegativeLogLikelihoodLoss.kernel(
    "nll_numba",
    dtypes=(_dt.float32, _dt.float64),
    priority=20,
    plan=_plan,
    doc="numba, parallel over positions from kernels.cpu.xent.NLL_PARALLEL_MIN of them: -x[target] * weight "
    "per position, float64 losses and reduction",
)(_nll_kernel)


# -- SoftmaxCrossEntropyLossGrad (opsnn): dScores = (softmax(scores) - onehot(labels)) * coef ----------------
def _grad_infer(ctx):
    op = ctx.op.name
    g, x = ctx.inputs[0], ctx.inputs[1]
    want = _check(ctx, 1)
    if tuple(g.shape) != want:
        ctx.fail(
            f"dLoss must have the loss's shape {want} (reduction {_reduction(op, ctx.attrs)!r}), got {tuple(g.shape)}"
        )
    if g.dtype != x.dtype:
        ctx.fail(f"dLoss must have the scores' dtype {_dt.name(x.dtype)}, got {_dt.name(g.dtype)}")
    return [TensorMeta(tuple(x.shape), x.dtype)]


def _grad_reference(ins, attrs):
    """float64: (softmax(x) - onehot) * dLoss * w[label] (/ summed weights for mean); 0 where ignored."""
    g, x, t = ins[0], ins[1], ins[2]
    w = ins[3] if len(ins) > 3 else None
    op, ignore, red = (
        "SoftmaxCrossEntropyLossGrad",
        attrs.get("ignore_index"),
        _reduction("SoftmaxCrossEntropyLossGrad", attrs),
    )
    N, C = x.shape[:2]
    Dn = int(np.prod(x.shape[2:], dtype=np.int64))
    xs = x.astype(np.float64).reshape(N, C, Dn)
    ts = t.reshape(N, Dn)
    gs = g.astype(np.float64).reshape(N, Dn) if red == "none" else None
    coef = np.zeros((N, Dn))
    for n in range(N):
        for d in range(Dn):
            c = int(ts[n, d])
            if ignore is not None and c == int(ignore):
                continue
            if not 0 <= c < C:
                raise ParamInvalidError(f"{op}: label {c} out of range [0, {C})", op=op)
            coef[n, d] = 1.0 if w is None else float(w[c])
    total = coef.sum()
    out = np.zeros_like(xs)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for n in range(N):
            for d in range(Dn):
                c = int(ts[n, d])
                if ignore is not None and c == int(ignore):
                    continue
                k = coef[n, d] * (gs[n, d] if gs is not None else float(g))
                if red == "mean":
                    k /= total
                col = xs[n, :, d]
                e = np.exp(col - col.max())
                p = e / e.sum()
                p[c] -= 1.0
                out[n, :, d] = p * k
    return out.reshape(x.shape).astype(x.dtype)


_GRAD_INPUTS = [
    Input("dLoss", FLOAT),
    Input("scores", FLOAT),
    Input("labels", _IND),
    Input("weights", FLOAT, optional=True),
]


def _grad_kernel(ins, outs, attrs, plan, ws):
    w = ins[3] if len(ins) > 3 else None
    KX.xent_backward(ins[0], ins[1], ins[2], w, plan["ignore"], plan["reduction"], plan["rows"], outs[0], plan["op"])


SoftmaxCrossEntropyLossGrad = register_op(
    "SoftmaxCrossEntropyLossGrad",
    domain="opsnn",
    category="loss",
    inputs=_GRAD_INPUTS,
    outputs=["dScores"],
    attrs=_ATTRS,
    infer=_grad_infer,
    reference=_grad_reference,
    doc="gradient of SoftmaxCrossEntropyLoss' loss w.r.t. the scores: (softmax - onehot) * dLoss * weight",
)
SoftmaxCrossEntropyLossGrad.kernel(
    "softmax_xent_grad_numba",
    dtypes=(_dt.float32, _dt.float64),
    priority=20,
    plan=_xent_plan,
    doc="numba, parallel over rows: one statistics pass leaves the exps in dScores, one pass scales them "
    "and subtracts at the label; ignored positions get zero rows",
)(_grad_kernel)


# -- SoftmaxCrossEntropyLossWithGrad (opsnn): the loss and its gradient, for a compiled training step -------
def _with_grad_infer(ctx):
    x = ctx.inputs[1]
    return [TensorMeta(_check(ctx, 1), x.dtype)] + _grad_infer(ctx)


def _with_grad_reference(ins, attrs):
    """SoftmaxCrossEntropyLoss' loss and SoftmaxCrossEntropyLossGrad's dScores, each its own reference."""
    loss = _reference("SoftmaxCrossEntropyLoss")(ins[1:], attrs)[0]
    return loss, _grad_reference(ins, attrs)


def _with_grad_kernel(ins, outs, attrs, plan, ws):
    w = ins[3] if len(ins) > 3 else None
    KX.xent_loss_and_backward(
        ins[0], ins[1], ins[2], w, plan["ignore"], plan["reduction"], plan["rows"], outs[0], outs[1], plan["op"]
    )


SoftmaxCrossEntropyLossWithGrad = register_op(
    "SoftmaxCrossEntropyLossWithGrad",
    domain="opsnn",
    category="loss",
    inputs=_GRAD_INPUTS,
    outputs=["output", "dScores"],
    attrs=_ATTRS,
    infer=_with_grad_infer,
    reference=_with_grad_reference,
    doc="SoftmaxCrossEntropyLoss' loss and, for the loss gradient dLoss, its gradient w.r.t. the scores "
    "(SoftmaxCrossEntropyLossGrad) from one pass over the scores: a compiled training step's loss head",
)
SoftmaxCrossEntropyLossWithGrad.kernel(
    "softmax_xent_with_grad_numba",
    dtypes=(_dt.float32, _dt.float64),
    priority=20,
    plan=_xent_plan,
    in_place=((1, 1),),  # dScores over the scores: a row's label score is read before the row is written
    doc="numba, parallel over rows: softmax_xent_grad_numba's two passes per row (its dScores), the "
    "loss from the statistics pass (softmax_xent_numba's within the order of a row sum)",
)(_with_grad_kernel)


# -- NLLLossGrad (opsnn): dInput = -onehot(target) * dLoss * weight ------------------------------------------
def _nll_grad_reference(ins, attrs):
    """float64, one position at a time: -dLoss * w[target] (/ summed weights for mean) at the target."""
    g, x, t = ins[0], ins[1], ins[2]
    w = ins[3] if len(ins) > 3 else None
    op, ignore, red = "NLLLossGrad", attrs.get("ignore_index"), _reduction("NLLLossGrad", attrs)
    N, C = x.shape[:2]
    Dn = int(np.prod(x.shape[2:], dtype=np.int64))
    ts = t.reshape(N, Dn)
    gs = g.astype(np.float64).reshape(N, Dn) if red == "none" else None
    coef, hit = np.zeros((N, Dn)), np.zeros((N, Dn), bool)
    for n in range(N):
        for d in range(Dn):
            c = int(ts[n, d])
            if ignore is not None and c == int(ignore):
                continue
            if not 0 <= c < C:
                raise ParamInvalidError(f"{op}: target {c} out of range [0, {C})", op=op)
            coef[n, d], hit[n, d] = (1.0 if w is None else float(w[c])), True
    total = coef.sum()
    out = np.zeros((N, C, Dn))
    with np.errstate(invalid="ignore", divide="ignore"):
        for n in range(N):
            for d in range(Dn):
                if hit[n, d]:
                    k = coef[n, d] * (gs[n, d] if gs is not None else float(g))
                    out[n, int(ts[n, d]), d] = -(k / total if red == "mean" else k)
    return out.reshape(x.shape).astype(x.dtype)


NLLLossGrad = register_op(
    "NLLLossGrad",
    domain="opsnn",
    category="loss",
    inputs=[
        Input("dLoss", FLOAT),
        Input("input", FLOAT),
        Input("target", _IND),
        Input("weight", FLOAT, optional=True),
    ],
    outputs=["dInput"],
    attrs=_ATTRS,
    infer=_grad_infer,
    reference=_nll_grad_reference,
    doc="gradient of NegativeLogLikelihoodLoss w.r.t. its input: -dLoss * weight at each target, 0 elsewhere",
)


@NLLLossGrad.kernel(
    "nll_grad_numba",
    dtypes=(_dt.float32, _dt.float64),
    priority=20,
    doc="numba, parallel over positions: each writes its own class column (zeros, then the target's value)",
)
def _nll_grad_kernel(ins, outs, attrs, plan, ws):
    w = ins[3] if len(ins) > 3 else None
    red = _reduction("NLLLossGrad", attrs)
    KX.nll_backward(ins[0], ins[2], w, attrs.get("ignore_index"), red, outs[0], "NLLLossGrad")


def _attrs(reduction, ignore_index):
    a = {"reduction": str(reduction)}
    if ignore_index is not None:
        a["ignore_index"] = int(ignore_index)
    return a


@api("softmax_cross_entropy_loss", "SoftmaxCrossEntropyLoss")
def softmax_cross_entropy_loss(
    scores, labels, weights=None, *, reduction="mean", ignore_index=None, return_log_prob=False
):
    """ONNX ``SoftmaxCrossEntropyLoss``; returns ``loss`` or ``(loss, log_prob)``."""
    return [scores, labels, weights], _attrs(reduction, ignore_index), 2 if return_log_prob else 1


@api("cross_entropy", "SoftmaxCrossEntropyLoss")
def cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean"):
    """torch-style cross entropy over class indices: ``input (N, C, ...)``, ``target (N, ...)``."""
    return [input, target, weight], _attrs(reduction, ignore_index)


@api("nll_loss", "NegativeLogLikelihoodLoss")
def nll_loss(input, target, weight=None, ignore_index=-100, reduction="mean"):
    """torch-style negative log likelihood of log-probabilities ``input (N, C, ...)``."""
    return [input, target, weight], _attrs(reduction, ignore_index)


@api("softmax_cross_entropy_loss_grad", "SoftmaxCrossEntropyLossGrad", domain="opsnn")
def softmax_cross_entropy_loss_grad(dloss, scores, labels, weights=None, *, reduction="mean", ignore_index=None):
    """Gradient of ``softmax_cross_entropy_loss(scores, labels, weights)`` w.r.t. ``scores`` for the loss
    gradient ``dloss`` (a scalar for ``sum`` / ``mean``, the labels' shape for ``none``), in one fused pass.

    >>> import opsnn, numpy as np
    >>> x = opsnn.tensor(np.array([[0.0, 0.0]], np.float32))
    >>> g = opsnn.tensor(np.array(1.0, np.float32))
    >>> opsnn.ops.softmax_cross_entropy_loss_grad(g, x, np.array([1])).numpy()
    array([[ 0.5, -0.5]], dtype=float32)
    """
    return [dloss, scores, labels, weights], _attrs(reduction, ignore_index)


@api("nll_loss_grad", "NLLLossGrad", domain="opsnn")
def nll_loss_grad(dloss, input, target, weight=None, *, reduction="mean", ignore_index=None):
    """Gradient of ``nll_loss(input, target, weight)`` w.r.t. ``input`` for the loss gradient ``dloss``
    (a scalar for ``sum`` / ``mean``, the target's shape for ``none``), written directly at the targets."""
    return [dloss, input, target, weight], _attrs(reduction, ignore_index)


__all__ = [
    "softmax_cross_entropy_loss",
    "cross_entropy",
    "nll_loss",
    "softmax_cross_entropy_loss_grad",
    "nll_loss_grad",
]
