"""Loss ops: ONNX ``SoftmaxCrossEntropyLoss`` (opset 13) and ``NegativeLogLikelihoodLoss``
(opset 22), with numpy-vectorized kernels and torch-style entry points.

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


def _infer(ctx):
    op = ctx.op.name
    x, t = ctx.inputs[0], ctx.inputs[1]
    if len(x.shape) < 2:
        ctx.fail(f"input 0 must be (N, C, d1, ..., dk) with rank >= 2, got shape {x.shape}")
    want = (x.shape[0],) + tuple(x.shape[2:])
    if tuple(t.shape) != want:
        ctx.fail(f"labels/target must have shape (N, d1, ..., dk) = {want}, got {t.shape}")
    if ctx.has(2):
        w = ctx.inputs[2]
        if tuple(w.shape) != (x.shape[1],):
            ctx.fail(f"weights must have shape (C,) = ({x.shape[1]},), got {w.shape}")
        if w.dtype != x.dtype:
            ctx.fail(f"weights must have the input's dtype {_dt.name(x.dtype)}, got {_dt.name(w.dtype)}")
    red = _reduction(op, ctx.attrs)
    outs = [TensorMeta(want if red == "none" else (), x.dtype)]
    if op == "SoftmaxCrossEntropyLoss":
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
    loss = -picked * wt
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


__all__ = ["softmax_cross_entropy_loss", "cross_entropy", "nll_loss"]
