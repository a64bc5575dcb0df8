"""CTC loss (opsnn domain): ``CTCLoss``, each sample's negative log-likelihood of its target under the
per-frame log probabilities summed over every alignment (Graves et al. 2006; torch's ctc_loss before its
reduction), and ``CTCLossGrad``, its gradient w.r.t. the log probabilities. torch's entry point with its
reductions is ``opsnn.nn.functional.ctc_loss``.

Shapes: log_probs ``(T, N, C)``, targets padded ``(N, S)`` or concatenated ``(sum(target_lengths),)``,
input_lengths and target_lengths ``(N,)``; the loss ``(N,)``.

>>> import opsnn, numpy as np
>>> lp = opsnn.tensor(np.log(np.full((2, 1, 2), 0.5, np.float32)))
>>> float(opsnn.ops.ctc_nll(lp, np.array([[1]]), np.array([2]), np.array([1]))[0])  # 3 of 4 paths
0.2876...
"""

from __future__ import annotations

import numpy as np

from ... import dtypes as _dt
from ...errors import ParamInvalidError
from ...kernels.cpu import ctc as KC
from ..api import api
from ..registry import Attr, Input, TensorMeta, register_op

_INT = (_dt.int32, _dt.int64)
_FLOAT = (_dt.float32, _dt.float64)
_ATTRS = [Attr("blank", "int", 0), Attr("zero_infinity", "int", 0)]


def _infer_common(ctx) -> tuple:
    lp, tg, il, tl = (ctx.inputs[i] for i in range(4))
    if len(lp.shape) != 3:
        ctx.fail(f"log_probs must be (T, N, C), got shape {lp.shape}")
    T, N, C = lp.shape
    if len(tg.shape) not in (1, 2) or (len(tg.shape) == 2 and tg.shape[0] != N):
        ctx.fail(f"targets must be (N, S) = ({N}, S) or concatenated 1-D, got shape {tg.shape}")
    for name, v in (("input_lengths", il), ("target_lengths", tl)):
        if tuple(v.shape) != (N,):
            ctx.fail(f"{name} must have shape (N,) = ({N},), got {v.shape}")
    blank = int(ctx.attrs["blank"])
    if not 0 <= blank < C:
        ctx.fail(f"blank {blank} is not a class of the {C} in log_probs")
    return T, N, C


def _infer(ctx):
    _, N, _ = _infer_common(ctx)
    return [TensorMeta((N,), ctx.inputs[0].dtype)]


def _infer_grad(ctx):
    T, N, C = _infer_common(ctx)
    for i, name in ((4, "loss"), (5, "dLoss")):
        if tuple(ctx.inputs[i].shape) != (N,):
            ctx.fail(f"{name} must have shape (N,) = ({N},), got {ctx.inputs[i].shape}")
    return [TensorMeta((T, N, C), ctx.inputs[0].dtype)]


def _rows(ins):
    """(log_probs as float64, each sample's target labels, input lengths, attrs-free) of a call."""
    lp, tg, il, tl = (np.asarray(v) for v in ins[:4])
    tl = tl.astype(np.int64)
    if tg.ndim == 1:
        ends = np.cumsum(tl)
        labels = [tg[e - n : e].astype(np.int64) for e, n in zip(ends, tl)]
    else:
        labels = [tg[i, :n].astype(np.int64) for i, n in enumerate(tl)]
    return lp.astype(np.float64), labels, il.astype(np.int64)


def _extended(labels, blank: int) -> np.ndarray:
    ext = np.full(2 * len(labels) + 1, blank, np.int64)
    ext[1::2] = labels
    return ext


def _skips(ext, blank: int) -> np.ndarray:
    """Where the recursion may skip a blank: a label differing from the one two entries back."""
    ok = np.zeros(len(ext), bool)
    ok[2:] = (ext[2:] != blank) & (ext[2:] != ext[:-2])
    return ok


def _recursions(lp_n, ext, blank):
    """float64 forward and backward log-probability tables (T, S) of one sample (numpy, vectorized over s)."""
    T, S = lp_n.shape[0], len(ext)
    emit = lp_n[:, ext]
    skip = _skips(ext, blank)
    a = np.full((T, S), -np.inf)
    b = np.full((T, S), -np.inf)
    a[0, : min(2, S)] = emit[0, : min(2, S)]
    b[T - 1, max(S - 2, 0) :] = emit[T - 1, max(S - 2, 0) :]
    with np.errstate(invalid="ignore"):
        for t in range(1, T):
            prev = a[t - 1].copy()
            prev[1:] = np.logaddexp(prev[1:], a[t - 1, :-1])
            prev[2:] = np.where(skip[2:], np.logaddexp(prev[2:], a[t - 1, :-2]), prev[2:])
            a[t] = prev + emit[t]
        skip_back = np.zeros(S, bool)
        skip_back[:-2] = skip[2:]
        for t in range(T - 2, -1, -1):
            nxt = b[t + 1].copy()
            nxt[:-1] = np.logaddexp(nxt[:-1], b[t + 1, 1:])
            nxt[:-2] = np.where(skip_back[:-2], np.logaddexp(nxt[:-2], b[t + 1, 2:]), nxt[:-2])
            b[t] = nxt + emit[t]
    return a, b


def _reference(ins, attrs):
    lp, labels, il = _rows(ins)
    blank, zero_inf = int(attrs["blank"]), bool(attrs["zero_infinity"])
    out = np.zeros(lp.shape[1])
    for n, lab in enumerate(labels):
        if il[n] == 0:
            out[n] = 0.0 if len(lab) == 0 else np.inf
            continue
        a, _ = _recursions(lp[: il[n], n], _extended(lab, blank), blank)
        out[n] = -np.logaddexp.reduce(a[-1, -2:]) if len(lab) else -a[-1, -1]
        if zero_inf and out[n] == np.inf:
            out[n] = 0.0
    return [out.astype(ins[0].dtype)]


def _grad_reference(ins, attrs):
    lp, labels, il = _rows(ins)
    g = np.asarray(ins[5], np.float64)
    blank, zero_inf = int(attrs["blank"]), bool(attrs["zero_infinity"])
    out = np.zeros(lp.shape)
    for n, lab in enumerate(labels):
        if il[n] == 0:
            continue
        ext = _extended(lab, blank)
        a, b = _recursions(lp[: il[n], n], ext, blank)
        ll = np.logaddexp.reduce(a[-1, -2:]) if len(lab) else a[-1, -1]
        if ll == -np.inf:
            out[: il[n], n] = 0.0 if zero_inf else np.nan
            continue
        for c in np.unique(ext):
            both = np.logaddexp.reduce(a[:, ext == c] + b[:, ext == c], axis=1)
            out[: il[n], n, c] = -g[n] * np.exp(both - lp[: il[n], n, c] - ll)
    return [out.astype(ins[0].dtype)]


def _checked(ins, attrs, op: str):
    lp, tg, il, tl = ins[:4]
    il, tl = np.ascontiguousarray(il, np.int64), np.ascontiguousarray(tl, np.int64)
    tg = np.ascontiguousarray(tg, np.int64)
    bad = KC.check(lp, tg, il, tl, int(attrs["blank"]))
    if bad >= 0:
        raise ParamInvalidError(
            f"{op}: sample {bad} does not fit: input length {int(il[bad])} (of {lp.shape[0]} frames), "
            f"target length {int(tl[bad])} (targets {tuple(tg.shape)}), labels in [0, {lp.shape[2]}) other than "
            f"blank {int(attrs['blank'])}",
            op=op,
        )
    return tg, il, tl


def _kernel(ins, outs, attrs, plan, ws):
    tg, il, tl = _checked(ins, attrs, "CTCLoss")
    KC.ctc_forward(ins[0], tg, il, tl, int(attrs["blank"]), bool(attrs["zero_infinity"]), outs[0])


def _grad_kernel(ins, outs, attrs, plan, ws):
    tg, il, tl = _checked(ins, attrs, "CTCLossGrad")
    g = np.ascontiguousarray(ins[5], np.float64)
    KC.ctc_backward(ins[0], tg, il, tl, ins[4], g, int(attrs["blank"]), bool(attrs["zero_infinity"]), outs[0])


_INPUTS = [
    Input("log_probs", _FLOAT),
    Input("targets", _INT),
    Input("input_lengths", _INT),
    Input("target_lengths", _INT),
]

CTCLoss = register_op(
    "CTCLoss",
    domain="opsnn",
    category="loss",
    inputs=_INPUTS,
    outputs=["loss"],
    attrs=_ATTRS,
    infer=_infer,
    reference=_reference,
    doc="each sample's CTC negative log-likelihood -log sum over alignments of prod_t p_t(label); inf where no "
    "alignment fits (0 with zero_infinity); NaN in log_probs propagates",
)
CTCLoss.kernel(
    "ctc_numba",
    dtypes=_FLOAT,
    priority=20,
    doc="numba, one sample per task: the forward recursion in log space, float64 inside",
)(_kernel)

CTCLossGrad = register_op(
    "CTCLossGrad",
    domain="opsnn",
    category="loss",
    inputs=_INPUTS + [Input("loss", _FLOAT), Input("dLoss", _FLOAT)],
    outputs=["dlog_probs"],
    attrs=_ATTRS,
    infer=_infer_grad,
    reference=_grad_reference,
    doc="gradient of CTCLoss w.r.t. log_probs: -dLoss * sum over the extended label entries of class c of "
    "alpha_t * beta_t / p_t(c) / likelihood; 0 past each input length (and for a zeroed infinite loss)",
)
CTCLossGrad.kernel(
    "ctc_grad_numba",
    dtypes=_FLOAT,
    priority=20,
    doc="numba, one sample per task: forward and backward recursions in log space, float64 inside",
)(_grad_kernel)


@api("ctc_nll", "CTCLoss", domain="opsnn")
def ctc_nll(log_probs, targets, input_lengths, target_lengths, *, blank=0, zero_infinity=False):
    """Each sample's CTC negative log-likelihood (N,) (torch's ctc_loss with reduction='none')."""
    return [log_probs, targets, input_lengths, target_lengths], {
        "blank": int(blank),
        "zero_infinity": int(bool(zero_infinity)),
    }


@api("ctc_nll_grad", "CTCLossGrad", domain="opsnn")
def ctc_nll_grad(log_probs, targets, input_lengths, target_lengths, loss, dloss, *, blank=0, zero_infinity=False):
    """Gradient of :func:`ctc_nll` w.r.t. ``log_probs`` for the loss gradient ``dloss`` (N,)."""
    return [log_probs, targets, input_lengths, target_lengths, loss, dloss], {
        "blank": int(blank),
        "zero_infinity": int(bool(zero_infinity)),
    }


__all__ = ["ctc_nll", "ctc_nll_grad"]
