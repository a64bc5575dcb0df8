"""Recurrent ops RNN, GRU and LSTM (ONNX opset 22): records, kernels and entry points.

All three share one schema shape: ``X`` (``(T, B, I)``, or ``(B, T, I)`` with
``layout=1``), weights ``W (D, G*H, I)``, ``R (D, G*H, H)``, bias ``B (D, 2*G*H)``,
optional ``sequence_lens (B,)``, ``initial_h`` (and for LSTM ``initial_c``, peepholes
``P (D, 3*H)``); outputs ``Y (T, D, B, H)``, ``Y_h (D, B, H)`` (LSTM: ``Y_c``), batch-first
with ``layout=1``. The gate order and the mapping onto cuDNN's weight layout are
documented in :mod:`opsnn.kernels.cpu.rnn`.

>>> import opsnn, numpy as np
>>> x = opsnn.tensor(np.ones((5, 2, 3), np.float32))                   # T=5, B=2, I=3
>>> w = opsnn.tensor(np.full((1, 4 * 8, 3), 0.1, np.float32))          # LSTM, H=8
>>> r = opsnn.tensor(np.full((1, 4 * 8, 8), 0.1, np.float32))
>>> y, y_h, y_c = opsnn.ops.lstm(x, w, r)
>>> y.shape, y_h.shape
((5, 1, 2, 8), (1, 2, 8))
"""

from __future__ import annotations

import numpy as np

from ... import dtypes as _dt
from ...errors import ParamInvalidError
from ...kernels.cpu import rnn as K
from ...kernels.cpu import rnn_backward as KB
from ..api import api
from ..registry import Attr, Input, Output, TensorMeta, register_op

FLOAT = _dt.FLOATS
_SEQ = (_dt.int32, _dt.int64)
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_N_ACT = {"RNN": 1, "GRU": 2, "LSTM": 3}
_DEFAULT_ACT = {"RNN": ("tanh",), "GRU": ("sigmoid", "tanh"), "LSTM": ("sigmoid", "tanh", "tanh")}


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _direction(op: str, attrs) -> str:
    d = _s(attrs["direction"]).lower()
    if d not in ("forward", "reverse", "bidirectional"):
        raise ParamInvalidError(
            f"{op}: attribute 'direction' must be forward, reverse or bidirectional, got {d!r}", op=op
        )
    return d


def _num_directions(op: str, attrs) -> int:
    return 2 if _direction(op, attrs) == "bidirectional" else 1


def resolve_activations(op: str, attrs, D: int) -> list[list[tuple[str, float, float]]]:
    """Per direction, the ``(name, alpha, beta)`` of each activation slot (f[, g[, h]]).

    ``activation_alpha``/``activation_beta`` are consumed in order by the activations that
    take them (onnxruntime's rule); missing values take the activation's default."""
    n = _N_ACT[op]
    names = attrs.get("activations")
    if names is None:
        names = list(_DEFAULT_ACT[op]) * D
    else:
        names = [_s(x).lower() for x in names]
        if op == "RNN" and len(names) == 2 and D == 1 and attrs.get("activation_alpha") is None:
            names = names[:1]  # the schema default lists one per direction of a bidirectional RNN
        if len(names) == n and D == 2:
            names = names * 2
        if len(names) != n * D:
            raise ParamInvalidError(
                f"{op}: attribute 'activations' needs {n} name(s) per direction "
                f"({n * D} for {D} direction(s)), got {len(names)}: {names}",
                op=op,
            )
    alphas = list(attrs.get("activation_alpha") or [])
    betas = list(attrs.get("activation_beta") or [])
    out, k_a, k_b = [], 0, 0
    for name in names:
        if name not in K.ACT_PARAMS:
            raise ParamInvalidError(
                f"{op}: unknown activation {name!r}; expected one of {[a for a in K.ACTIVATIONS]}", op=op
            )
        need_a, need_b, da, db = K.ACT_PARAMS[name]
        a = b = 0.0
        if need_a:
            a = float(alphas[k_a]) if k_a < len(alphas) else da
            k_a += 1
        if need_b:
            b = float(betas[k_b]) if k_b < len(betas) else db
            k_b += 1
        out.append((name, a, b))
    return [out[d * n : (d + 1) * n] for d in range(D)]


def _infer(ctx):
    op = ctx.op.name
    a = ctx.attrs
    G = _GATES[op]
    D = _num_directions(op, a)
    layout = int(a["layout"])
    if layout not in (0, 1):
        raise ParamInvalidError(f"{op}: attribute 'layout' must be 0 or 1, got {layout}", op=op)
    x, w, r = ctx.inputs[0], ctx.inputs[1], ctx.inputs[2]
    for name, m, rank in (("X", x, 3), ("W", w, 3), ("R", r, 3)):
        if len(m.shape) != rank:
            ctx.fail(f"input {name!r} must be {rank}-D, got shape {m.shape}")
    if w.dtype != x.dtype or r.dtype != x.dtype:
        ctx.fail(f"W and R must have X's dtype {_dt.name(x.dtype)}, got {_dt.name(w.dtype)}, {_dt.name(r.dtype)}")
    T, B, I = (x.shape[1], x.shape[0], x.shape[2]) if layout else x.shape
    H = r.shape[2]
    hs = a.get("hidden_size")
    if hs is not None and int(hs) != H:
        ctx.fail(f"attribute hidden_size={hs} does not match R's last dim {H}")
    if tuple(w.shape) != (D, G * H, I):
        ctx.fail(
            f"input 'W' must have shape (num_directions={D}, {G}*hidden_size={G * H}, input_size={I}), got {w.shape}"
        )
    if tuple(r.shape) != (D, G * H, H):
        ctx.fail(f"input 'R' must have shape ({D}, {G * H}, {H}), got {r.shape}")
    state = (B, D, H) if layout else (D, B, H)
    checks = [(3, "B", (D, 2 * G * H)), (4, "sequence_lens", (B,)), (5, "initial_h", state)]
    if op == "LSTM":
        checks += [(6, "initial_c", state), (7, "P", (D, 3 * H))]
    for i, name, shape in checks:
        if ctx.has(i):
            m = ctx.inputs[i]
            if tuple(m.shape) != shape:
                ctx.fail(f"input {name!r} must have shape {shape}, got {m.shape}")
            if i != 4 and m.dtype != x.dtype:
                ctx.fail(f"input {name!r} must have X's dtype {_dt.name(x.dtype)}, got {_dt.name(m.dtype)}")
    clip = a.get("clip")
    if clip is not None and not float(clip) > 0:
        raise ParamInvalidError(f"{op}: attribute 'clip' must be positive, got {clip}", op=op)
    if op == "GRU" and int(a["linear_before_reset"]) not in (0, 1):
        raise ParamInvalidError(f"{op}: linear_before_reset must be 0 or 1, got {a['linear_before_reset']}", op=op)
    if op == "LSTM" and int(a["input_forget"]) not in (0, 1):
        raise ParamInvalidError(f"{op}: input_forget must be 0 or 1, got {a['input_forget']}", op=op)
    resolve_activations(op, a, D)  # validates names and counts
    y = (B, T, D, H) if layout else (T, D, B, H)
    n_out = 3 if op == "LSTM" else 2
    return [TensorMeta(y, x.dtype)] + [TensorMeta(state, x.dtype)] * (n_out - 1)


# -- reference (plain numpy, one batch row and one step at a time) -----------------------------------
def _np_act(name, x, a, b):
    if name == "relu":
        return np.maximum(x, 0)
    if name == "tanh":
        return np.tanh(x)
    if name == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    if name == "affine":
        return a * x + b
    if name == "leakyrelu":
        return np.where(x >= 0, x, a * x)
    if name == "thresholdedrelu":
        return np.where(x >= a, x, 0)
    if name == "scaledtanh":
        return a * np.tanh(b * x)
    if name == "hardsigmoid":
        return np.clip(a * x + b, 0, 1)
    if name == "elu":
        return np.where(x >= 0, x, a * (np.exp(np.minimum(x, 0)) - 1))
    if name == "softsign":
        return x / (1 + np.abs(x))
    return np.logaddexp(0, x)  # softplus


def _reference(op):
    def ref(ins, attrs):
        ins = list(ins) + [None] * (8 - len(ins))
        X, W, R, Bias, lens, h0, c0, P = ins
        dt = X.dtype
        cd = np.float64
        layout = int(attrs["layout"])
        if layout:
            X = X.transpose(1, 0, 2)
            h0 = None if h0 is None else h0.transpose(1, 0, 2)
            c0 = None if c0 is None else c0.transpose(1, 0, 2)
        T, B, _ = X.shape
        D, H = W.shape[0], R.shape[2]
        G = _GATES[op]
        acts = resolve_activations(op, attrs, D)
        clip = attrs.get("clip")
        dirs = ["reverse"] if _direction(op, attrs) == "reverse" else ["forward", "reverse"][:D]
        lens = np.full(B, T) if lens is None else lens.astype(np.int64)
        Y = np.zeros((T, D, B, H), cd)
        Yh = np.zeros((D, B, H), cd)
        Yc = np.zeros((D, B, H), cd)

        def cl(v):
            return v if clip is None else np.clip(v, -clip, clip)

        for d, direction in enumerate(dirs):
            Wd, Rd = W[d].astype(cd), R[d].astype(cd)
            bias = np.zeros(2 * G * H) if Bias is None else Bias[d].astype(cd)
            wb, rb = bias[: G * H], bias[G * H :]
            (f, fa, fb), *rest = acts[d]
            for b in range(B):
                h = np.zeros(H) if h0 is None else h0[d, b].astype(cd)
                c = np.zeros(H) if c0 is None else c0[d, b].astype(cd)
                n = int(lens[b])
                steps = range(n) if direction == "forward" else range(n - 1, -1, -1)
                for t in steps:
                    gx = Wd @ X[t, b].astype(cd) + wb
                    gh = Rd @ h + rb
                    if op == "RNN":
                        h = _np_act(f, cl(gx + gh), fa, fb)
                    elif op == "LSTM":
                        (g, ga, gb), (hn, ha, hb) = rest
                        p = np.zeros(3 * H) if P is None else P[d].astype(cd)
                        s = gx + gh
                        i = _np_act(f, cl(s[:H] + p[:H] * c), fa, fb)
                        if int(attrs["input_forget"]):
                            fg = 1 - i
                        else:
                            fg = _np_act(f, cl(s[2 * H : 3 * H] + p[2 * H :] * c), fa, fb)
                        cc = _np_act(g, cl(s[3 * H :]), ga, gb)
                        c = fg * c + i * cc
                        o = _np_act(f, cl(s[H : 2 * H] + p[H : 2 * H] * c), fa, fb)
                        h = o * _np_act(hn, c, ha, hb)
                    else:
                        ((g, ga, gb),) = rest
                        z = _np_act(f, cl(gx[:H] + gh[:H]), fa, fb)
                        r = _np_act(f, cl(gx[H : 2 * H] + gh[H : 2 * H]), fa, fb)
                        if int(attrs["linear_before_reset"]):
                            hh = _np_act(g, cl(gx[2 * H :] + r * gh[2 * H :]), ga, gb)
                        else:
                            hh = _np_act(g, cl(gx[2 * H :] + Rd[2 * H :] @ (r * h) + rb[2 * H :]), ga, gb)
                        h = (1 - z) * hh + z * h
                    Y[t, d, b] = h
                if n > 0:
                    Yh[d, b] = h
                    Yc[d, b] = c
        if layout:
            Y, Yh, Yc = Y.transpose(2, 0, 1, 3), Yh.transpose(1, 0, 2), Yc.transpose(1, 0, 2)
        outs = (Y.astype(dt), Yh.astype(dt), Yc.astype(dt))
        return outs if op == "LSTM" else outs[:2]

    return ref


# -- kernel -------------------------------------------------------------------------------------------
def _plan(ctx):
    op = ctx.op.name
    a = ctx.attrs
    x, r = ctx.inputs[0], ctx.inputs[2]
    layout = int(a["layout"])
    T, B, I = (x.shape[1], x.shape[0], x.shape[2]) if layout else x.shape
    H = r.shape[2]
    D = _num_directions(op, a)
    acts = resolve_activations(op, a, D)
    codes = [[K.ACTIVATIONS.index(n) for n, _, _ in row] for row in acts]
    alpha = [[al for _, al, _ in row] for row in acts]
    beta = [[be for _, _, be in row] for row in acts]
    clip = a.get("clip")
    plan = K.make_plan(
        op,
        op.lower(),
        T,
        B,
        I,
        H,
        D,
        layout,
        _dt.compute_dtype(x.dtype),
        codes,
        alpha,
        beta,
        0.0 if clip is None else float(clip),
        int(a.get("linear_before_reset", 0)),
        int(a.get("input_forget", 0)),
    )
    direction = _direction(op, a)
    plan.reverse = [True] if direction == "reverse" else [False, True][:D]
    return plan


def _run_kernel(ins, outs, attrs, plan, ws):
    K.run(list(ins) + [None] * (8 - len(ins)), list(outs), attrs, plan, ws, plan.reverse)


_COMMON_ATTRS = [
    Attr("activation_alpha", "floats", None),
    Attr("activation_beta", "floats", None),
    Attr("activations", "strings", None),
    Attr("clip", "float", None),
    Attr("direction", "string", "forward"),
    Attr("hidden_size", "int", None),
    Attr("layout", "int", 0),
]
_COMMON_INPUTS = [
    Input("X", FLOAT),
    Input("W", FLOAT),
    Input("R", FLOAT),
    Input("B", FLOAT, optional=True),
    Input("sequence_lens", _SEQ, optional=True),
    Input("initial_h", FLOAT, optional=True),
]

RNN = register_op(
    "RNN",
    category="rnn",
    inputs=_COMMON_INPUTS,
    outputs=[Output("Y", True), Output("Y_h", True)],
    attrs=_COMMON_ATTRS,
    infer=_infer,
    reference=_reference("RNN"),
    doc="one-layer simple RNN: H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)",
)
GRU = register_op(
    "GRU",
    category="rnn",
    inputs=_COMMON_INPUTS,
    outputs=[Output("Y", True), Output("Y_h", True)],
    attrs=_COMMON_ATTRS + [Attr("linear_before_reset", "int", 0)],
    infer=_infer,
    reference=_reference("GRU"),
    doc="one-layer GRU (gates z, r, h)",
)
LSTM = register_op(
    "LSTM",
    category="rnn",
    inputs=_COMMON_INPUTS + [Input("initial_c", FLOAT, optional=True), Input("P", FLOAT, optional=True)],
    outputs=[Output("Y", True), Output("Y_h", True), Output("Y_c", True)],
    attrs=_COMMON_ATTRS + [Attr("input_forget", "int", 0)],
    infer=_infer,
    reference=_reference("LSTM"),
    doc="one-layer LSTM (gates i, o, f, c; optional peepholes)",
)

for _rec, _name in ((RNN, "rnn_blas"), (GRU, "gru_blas"), (LSTM, "lstm_blas")):
    _rec.kernel(
        _name,
        dtypes=(_dt.float32, _dt.float64),
        priority=10,
        plan=_plan,
        workspace=lambda ctx, plan: plan.ws_bytes,
        doc="hoisted input GEMM, one BLAS GEMM per step, fused numba gate cell",
    )(_run_kernel)


def _attrs(hidden_size, direction, layout, activations, activation_alpha, activation_beta, clip):
    a = {"direction": direction, "layout": int(layout)}
    if hidden_size is not None:
        a["hidden_size"] = int(hidden_size)
    if activations is not None:
        a["activations"] = [str(x) for x in activations]
    if activation_alpha is not None:
        a["activation_alpha"] = [float(x) for x in activation_alpha]
    if activation_beta is not None:
        a["activation_beta"] = [float(x) for x in activation_beta]
    if clip is not None:
        a["clip"] = float(clip)
    return a


@api("rnn", "RNN")
def rnn(
    x,
    w,
    r,
    b=None,
    sequence_lens=None,
    initial_h=None,
    *,
    hidden_size=None,
    direction="forward",
    layout=0,
    activations=None,
    activation_alpha=None,
    activation_beta=None,
    clip=None,
):
    """Simple RNN over a sequence (ONNX ``RNN``); returns ``(Y, Y_h)``.

    >>> # y, y_h = opsnn.ops.rnn(x, w, r, b, direction="bidirectional")
    """
    return (
        [x, w, r, b, sequence_lens, initial_h],
        _attrs(hidden_size, direction, layout, activations, activation_alpha, activation_beta, clip),
        2,
    )


@api("gru", "GRU")
def gru(
    x,
    w,
    r,
    b=None,
    sequence_lens=None,
    initial_h=None,
    *,
    hidden_size=None,
    direction="forward",
    layout=0,
    linear_before_reset=0,
    activations=None,
    activation_alpha=None,
    activation_beta=None,
    clip=None,
):
    """GRU over a sequence (ONNX ``GRU``, gate order z, r, h); returns ``(Y, Y_h)``.
    ``linear_before_reset=1`` is the cuDNN / PyTorch formulation."""
    a = _attrs(hidden_size, direction, layout, activations, activation_alpha, activation_beta, clip)
    a["linear_before_reset"] = int(linear_before_reset)
    return [x, w, r, b, sequence_lens, initial_h], a, 2


@api("lstm", "LSTM")
def lstm(
    x,
    w,
    r,
    b=None,
    sequence_lens=None,
    initial_h=None,
    initial_c=None,
    p=None,
    *,
    hidden_size=None,
    direction="forward",
    layout=0,
    input_forget=0,
    activations=None,
    activation_alpha=None,
    activation_beta=None,
    clip=None,
):
    """LSTM over a sequence (ONNX ``LSTM``, gate order i, o, f, c; ``p`` = peepholes [i, o, f]);
    returns ``(Y, Y_h, Y_c)``."""
    a = _attrs(hidden_size, direction, layout, activations, activation_alpha, activation_beta, clip)
    a["input_forget"] = int(input_forget)
    return [x, w, r, b, sequence_lens, initial_h, initial_c, p], a, 3


# -- backward through time (opsnn domain) ------------------------------------------------------------
# LSTMGrad inputs: X, W, R, B, sequence_lens, initial_h, initial_c, dY, dY_h, dY_c (GRUGrad and
# RNNGrad: no initial_c / dY_c); outputs the gradients of X, W, R, B, initial_h (LSTM: and initial_c).
# LSTM/GRU default activations only (RNN: Tanh, Sigmoid or Relu), no clip, peepholes or input_forget:
# the gradient rules check that before calling.
_GRAD_IN = {"LSTM": (7, 8, 9), "GRU": (6, 7, None), "RNN": (6, 7, None)}  # indices of dY, dY_h, dY_c
_RNN_GRAD_ACTS = ("tanh", "sigmoid", "relu")


def _rnn_grad_acts(op: str, attrs, D: int) -> list[int]:
    """RNNGrad's activation code per direction (opsnn.kernels.cpu.rnn.ACTIVATIONS): Tanh, Sigmoid or Relu."""
    names = attrs.get("activations")
    names = ["tanh"] * D if not names else [_s(v).lower() for v in names]
    if len(names) == 1 and D == 2:
        names = names * 2
    if len(names) != D or any(n not in _RNN_GRAD_ACTS for n in names):
        raise ParamInvalidError(
            f"{op}: attribute 'activations' must be one of {list(_RNN_GRAD_ACTS)} per direction ({D}), got {names}",
            op=op,
        )
    return [K.ACTIVATIONS.index(n) for n in names]


def _grad_infer(ctx):
    op = ctx.op.name
    fwd = op[: -len("Grad")]
    a = ctx.attrs
    G = _GATES[fwd]
    D = _num_directions(op, a)
    layout = int(a["layout"])
    if layout not in (0, 1):
        raise ParamInvalidError(f"{op}: attribute 'layout' must be 0 or 1, got {layout}", op=op)
    if fwd == "GRU" and int(a["linear_before_reset"]) not in (0, 1):
        raise ParamInvalidError(f"{op}: linear_before_reset must be 0 or 1, got {a['linear_before_reset']}", op=op)
    if fwd == "RNN":
        _rnn_grad_acts(op, a, D)
    x, w, r = ctx.inputs[0], ctx.inputs[1], ctx.inputs[2]
    for name, m in (("X", x), ("W", w), ("R", r)):
        if len(m.shape) != 3:
            ctx.fail(f"input {name!r} must be 3-D, got shape {m.shape}")
    if w.dtype != x.dtype or r.dtype != x.dtype:
        ctx.fail(f"W and R must have X's dtype {_dt.name(x.dtype)}, got {_dt.name(w.dtype)}, {_dt.name(r.dtype)}")
    T, B, I = (x.shape[1], x.shape[0], x.shape[2]) if layout else x.shape
    H = r.shape[2]
    if tuple(w.shape) != (D, G * H, I):
        ctx.fail(f"input 'W' must have shape ({D}, {G * H}, {I}), got {w.shape}")
    if tuple(r.shape) != (D, G * H, H):
        ctx.fail(f"input 'R' must have shape ({D}, {G * H}, {H}), got {r.shape}")
    state = (B, D, H) if layout else (D, B, H)
    y = (B, T, D, H) if layout else (T, D, B, H)
    i_dy, i_dyh, i_dyc = _GRAD_IN[fwd]
    checks = [(3, "B", (D, 2 * G * H)), (4, "sequence_lens", (B,)), (5, "initial_h", state)]
    checks += [(i_dy, "dY", y), (i_dyh, "dY_h", state)]
    if fwd == "LSTM":
        checks += [(6, "initial_c", state), (i_dyc, "dY_c", state)]
    for i, name, shape in checks:
        if ctx.has(i):
            m = ctx.inputs[i]
            if tuple(m.shape) != shape:
                ctx.fail(f"input {name!r} must have shape {shape}, got {m.shape}")
            if i != 4 and m.dtype != x.dtype:
                ctx.fail(f"input {name!r} must have X's dtype {_dt.name(x.dtype)}, got {_dt.name(m.dtype)}")
    outs = [TensorMeta(tuple(x.shape), x.dtype), TensorMeta(tuple(w.shape), x.dtype)]
    outs += [TensorMeta(tuple(r.shape), x.dtype), TensorMeta((D, 2 * G * H), x.dtype), TensorMeta(state, x.dtype)]
    if fwd == "LSTM":
        outs.append(TensorMeta(state, x.dtype))
    return outs


def _sigm(v):
    return 1.0 / (1.0 + np.exp(-v))


def _grad_reference(fwd):
    """Float64 BPTT one batch row at a time: the forward recomputed with its gates kept, then
    walked backwards with the textbook per-gate derivatives."""

    def ref(ins, attrs):
        ins = list(ins) + [None] * (10 - len(ins))
        X, W, R, Bias, lens, h0 = ins[:6]
        c0 = ins[6] if fwd == "LSTM" else None
        i_dy, i_dyh, i_dyc = _GRAD_IN[fwd]
        dY, dYh = ins[i_dy], ins[i_dyh]
        dYc = ins[i_dyc] if i_dyc is not None else None
        dt, f8 = X.dtype, np.float64
        layout = int(attrs["layout"])

        def tb(v, perm):
            return None if v is None else np.transpose(v, perm).astype(f8)

        if layout:
            X, h0, c0, dYh, dYc, dY = (
                tb(X, (1, 0, 2)),
                tb(h0, (1, 0, 2)),
                tb(c0, (1, 0, 2)),
                tb(dYh, (1, 0, 2)),
                tb(dYc, (1, 0, 2)),
                tb(dY, (1, 2, 0, 3)),
            )
        T, B, _ = X.shape
        D, H = W.shape[0], R.shape[2]
        G = _GATES[fwd]
        lbr = int(attrs.get("linear_before_reset", 0))
        acts = [K.ACTIVATIONS[k] for k in _rnn_grad_acts(fwd + "Grad", attrs, D)] if fwd == "RNN" else None
        dirs = ["reverse"] if _direction(fwd, attrs) == "reverse" else ["forward", "reverse"][:D]
        lens = np.full(B, T) if lens is None else lens.astype(np.int64)
        if B and (lens.min() < 0 or lens.max() > T):
            raise ParamInvalidError(
                f"{fwd}Grad: sequence_lens values must lie in [0, {T}], got {lens.tolist()}", op=fwd + "Grad"
            )
        dX = np.zeros(X.shape, f8)
        dW, dR = np.zeros(W.shape, f8), np.zeros(R.shape, f8)
        dB = np.zeros((D, 2 * G * H), f8)
        dH0, dC0 = np.zeros((D, B, H), f8), np.zeros((D, B, H), f8)
        for d, direction in enumerate(dirs):
            Wd, Rd = W[d].astype(f8), R[d].astype(f8)
            bias = np.zeros(2 * G * H) if Bias is None else Bias[d].astype(f8)
            wb, rb = bias[: G * H], bias[G * H :]
            for b in range(B):
                n = int(lens[b])
                steps = list(range(n)) if direction == "forward" else list(range(n - 1, -1, -1))
                h = np.zeros(H) if h0 is None else h0[d, b].astype(f8)
                c = np.zeros(H) if c0 is None else c0[d, b].astype(f8)
                saved = []
                for t in steps:
                    x = X[t, b].astype(f8)
                    if fwd == "RNN":
                        hn = _np_act(acts[d], Wd @ x + wb + Rd @ h + rb, 0.0, 0.0)
                        saved.append((t, x, h, hn))
                        h = hn
                    elif fwd == "LSTM":
                        s = Wd @ x + wb + Rd @ h + rb
                        i, o, fg, g = _sigm(s[:H]), _sigm(s[H : 2 * H]), _sigm(s[2 * H : 3 * H]), np.tanh(s[3 * H :])
                        cn = fg * c + i * g
                        saved.append((t, x, h, c, i, o, fg, g, cn))
                        h, c = o * np.tanh(cn), cn
                    else:
                        gx, gh = Wd @ x + wb, Rd @ h + rb
                        z, r = _sigm(gx[:H] + gh[:H]), _sigm(gx[H : 2 * H] + gh[H : 2 * H])
                        q = gh[2 * H :] if lbr else Rd[2 * H :] @ (r * h) + rb[2 * H :]
                        hh = np.tanh(gx[2 * H :] + (r * q if lbr else q))
                        saved.append((t, x, h, z, r, hh, q))
                        h = (1 - z) * hh + z * h
                dh = np.zeros(H) if (dYh is None or n == 0) else dYh[d, b].astype(f8)
                dc = np.zeros(H) if (dYc is None or n == 0) else dYc[d, b].astype(f8)
                for item in reversed(saved):
                    t, x, hp = item[:3]
                    if dY is not None:
                        dh = dh + dY[t, d, b].astype(f8)
                    if fwd == "RNN":
                        hn = item[3]
                        deriv = {"tanh": 1 - hn * hn, "sigmoid": hn * (1 - hn), "relu": (hn > 0) * 1.0}[acts[d]]
                        da = dar = dh * deriv
                        dh = Rd.T @ da
                    elif fwd == "LSTM":
                        cp, i, o, fg, g, cn = item[3:]
                        tc = np.tanh(cn)
                        dc = dc + dh * o * (1 - tc * tc)
                        da = np.concatenate(
                            [dc * g * i * (1 - i), dh * tc * o * (1 - o), dc * cp * fg * (1 - fg), dc * i * (1 - g * g)]
                        )
                        dar = da
                        dh, dc = Rd.T @ da, dc * fg
                    else:
                        z, r, hh, q = item[3:]
                        az = dh * (hp - hh) * z * (1 - z)
                        ah = dh * (1 - z) * (1 - hh * hh)
                        if lbr:
                            ar = ah * q * r * (1 - r)
                            dar = np.concatenate([az, ar, ah * r])
                            dhn = dh * z + Rd.T @ dar
                        else:
                            drh = Rd[2 * H :].T @ ah
                            ar = drh * hp * r * (1 - r)
                            dar = np.concatenate([az, ar, ah])
                            dhn = dh * z + drh * r + Rd[: 2 * H].T @ dar[: 2 * H]
                            dR[d, 2 * H :] += np.outer(ah, r * hp)
                        da = np.concatenate([az, ar, ah])
                        dh = dhn
                    dX[t, b] += Wd.T @ da
                    dW[d] += np.outer(da, x)
                    if fwd != "GRU" or lbr:
                        dR[d] += np.outer(dar, hp)
                    else:
                        dR[d, : 2 * H] += np.outer(dar[: 2 * H], hp)
                    dB[d, : G * H] += da
                    dB[d, G * H :] += dar
                dH0[d, b], dC0[d, b] = dh, dc
        if layout:
            dX, dH0, dC0 = dX.transpose(1, 0, 2), dH0.transpose(1, 0, 2), dC0.transpose(1, 0, 2)
        outs = [dX, dW, dR, dB, dH0] + ([dC0] if fwd == "LSTM" else [])
        return tuple(v.astype(dt) for v in outs)

    return ref


def _grad_plan(ctx):
    op = ctx.op.name
    fwd = op[: -len("Grad")]
    a = ctx.attrs
    x, r = ctx.inputs[0], ctx.inputs[2]
    layout = int(a["layout"])
    T, B, I = (x.shape[1], x.shape[0], x.shape[2]) if layout else x.shape
    direction = _direction(op, a)
    D = 2 if direction == "bidirectional" else 1
    return KB.RNNGradPlan(
        op=op,
        cell=fwd.lower(),
        T=T,
        B=B,
        I=I,
        H=r.shape[2],
        D=D,
        G=_GATES[fwd],
        layout=layout,
        dtype=np.dtype(_dt.compute_dtype(x.dtype)),
        reverse=[True] if direction == "reverse" else [False, True][:D],
        lbr=int(a.get("linear_before_reset", 0)),
        act=_rnn_grad_acts(op, a, D) if fwd == "RNN" else None,
    )


def _grad_kernel(fwd):
    i_dy, i_dyh, i_dyc = _GRAD_IN[fwd]

    def run(ins, outs, attrs, plan, ws):
        ins = list(ins) + [None] * (10 - len(ins))
        c0 = ins[6] if fwd == "LSTM" else None
        dyc = ins[i_dyc] if i_dyc is not None else None
        KB.run(plan, *ins[:6], c0, ins[i_dy], ins[i_dyh], dyc, list(outs), ws)

    return run


_GRAD_ATTRS = [Attr("direction", "string", "forward"), Attr("layout", "int", 0)]
LSTMGrad = register_op(
    "LSTMGrad",
    domain="opsnn",
    category="rnn",
    inputs=_COMMON_INPUTS
    + [
        Input("initial_c", FLOAT, optional=True),
        Input("dY", FLOAT, optional=True),
        Input("dY_h", FLOAT, optional=True),
        Input("dY_c", FLOAT, optional=True),
    ],
    outputs=["dX", "dW", "dR", "dB", "dinitial_h", "dinitial_c"],
    attrs=_GRAD_ATTRS,
    infer=_grad_infer,
    reference=_grad_reference("LSTM"),
    doc="LSTM backward through time (default activations, no peepholes / clip / input_forget): "
    "gradients of X, W, R, B, initial_h and initial_c from dY, dY_h, dY_c",
)
GRUGrad = register_op(
    "GRUGrad",
    domain="opsnn",
    category="rnn",
    inputs=_COMMON_INPUTS + [Input("dY", FLOAT, optional=True), Input("dY_h", FLOAT, optional=True)],
    outputs=["dX", "dW", "dR", "dB", "dinitial_h"],
    attrs=_GRAD_ATTRS + [Attr("linear_before_reset", "int", 0)],
    infer=_grad_infer,
    reference=_grad_reference("GRU"),
    doc="GRU backward through time (default activations, no clip), either linear_before_reset: "
    "gradients of X, W, R, B and initial_h from dY, dY_h",
)
RNNGrad = register_op(
    "RNNGrad",
    domain="opsnn",
    category="rnn",
    inputs=_COMMON_INPUTS + [Input("dY", FLOAT, optional=True), Input("dY_h", FLOAT, optional=True)],
    outputs=["dX", "dW", "dR", "dB", "dinitial_h"],
    attrs=_GRAD_ATTRS + [Attr("activations", "strings", None)],
    infer=_grad_infer,
    reference=_grad_reference("RNN"),
    doc="simple RNN backward through time (Tanh, Sigmoid or Relu per direction, no clip): gradients "
    "of X, W, R, B and initial_h from dY, dY_h",
)
for _rec, _name in ((LSTMGrad, "lstm_bptt_blas"), (GRUGrad, "gru_bptt_blas"), (RNNGrad, "rnn_bptt_blas")):
    _rec.kernel(
        _name,
        dtypes=(_dt.float32, _dt.float64),
        priority=10,
        plan=_grad_plan,
        workspace=lambda ctx, plan: plan.ws_bytes + KB.ALIGN,
        doc="forward recomputed saving the gates, reverse sweep with one or two BLAS GEMMs per step and "
        "numba gate cells, dW / dR / dX as one GEMM each over all steps",
    )(_grad_kernel(_rec.name[: -len("Grad")]))


@api("lstm_backward", "LSTMGrad", domain="opsnn")
def lstm_backward(
    x,
    w,
    r,
    b=None,
    sequence_lens=None,
    initial_h=None,
    initial_c=None,
    grad_y=None,
    grad_y_h=None,
    grad_y_c=None,
    *,
    direction="forward",
    layout=0,
):
    """Gradients of :func:`lstm` (default activations, no peepholes, clip or input_forget) with
    respect to ``x, w, r, b, initial_h, initial_c`` given those of ``Y, Y_h, Y_c`` (any may be
    None: zero); returns the six arrays (``dB``, ``dinitial_h/c`` whether or not given)."""
    return (
        [x, w, r, b, sequence_lens, initial_h, initial_c, grad_y, grad_y_h, grad_y_c],
        {"direction": direction, "layout": int(layout)},
        6,
    )


@api("gru_backward", "GRUGrad", domain="opsnn")
def gru_backward(
    x,
    w,
    r,
    b=None,
    sequence_lens=None,
    initial_h=None,
    grad_y=None,
    grad_y_h=None,
    *,
    direction="forward",
    layout=0,
    linear_before_reset=0,
):
    """Gradients of :func:`gru` (default activations, no clip) with respect to ``x, w, r, b,
    initial_h`` given those of ``Y, Y_h`` (either may be None: zero); returns the five arrays."""
    return (
        [x, w, r, b, sequence_lens, initial_h, grad_y, grad_y_h],
        {"direction": direction, "layout": int(layout), "linear_before_reset": int(linear_before_reset)},
        5,
    )


@api("rnn_backward", "RNNGrad", domain="opsnn")
def rnn_backward(
    x,
    w,
    r,
    b=None,
    sequence_lens=None,
    initial_h=None,
    grad_y=None,
    grad_y_h=None,
    *,
    direction="forward",
    layout=0,
    activations=None,
):
    """Gradients of :func:`rnn` (activations Tanh, Sigmoid or Relu, no clip) with respect to ``x, w,
    r, b, initial_h`` given those of ``Y, Y_h`` (either may be None: zero); returns the five arrays."""
    a = {"direction": direction, "layout": int(layout)}
    if activations is not None:
        a["activations"] = [str(v) for v in activations]
    return [x, w, r, b, sequence_lens, initial_h, grad_y, grad_y_h], a, 5


__all__ = ["rnn", "gru", "lstm", "rnn_backward", "lstm_backward", "gru_backward"]
