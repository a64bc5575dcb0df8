"""CPU recurrent-network kernels (RNN, GRU, LSTM): BLAS GEMMs plus numba gate cells.

Per direction, the input projection of *all* time steps is one GEMM hoisted before the
time loop (``XW = X @ W^T + biases``, shape ``(T, B, gates*H)``); each step then runs
one GEMM for the recurrent term of the whole batch (``H_{t-1} @ R^T``; GRU without
``linear_before_reset`` needs a second, ``(r*H) @ Rh^T``) and one fused numba cell that
applies clip, peepholes and the gate nonlinearities and writes ``Y``. The cells are
serial on purpose: their work is ``B*H`` per step against ``B*H*H`` for the step's GEMM
(which BLAS already parallelises), so a thread fan-out would cost more than it saves.

Gate order and weight layout, ONNX vs cuDNN (what a GPU backend must repack)
----------------------------------------------------------------------------

=====  =========================  ====================  ==============================================
cell   ONNX gate order (W, R, B)  cuDNN gate order      repacking / notes
=====  =========================  ====================  ==============================================
RNN    one gate ``i``             one gate              identical; ONNX allows any activation, cuDNN
                                                        only tanh / relu
LSTM   ``i, o, f, c``             ``i, f, g(=c), o``    cuDNN gate k = ONNX block ``[0, 2, 3, 1][k]``;
                                                        peepholes ``P[iof]`` and ``input_forget`` have
                                                        no cuDNN equivalent
GRU    ``z, r, h``                ``r, z, h'``          cuDNN gate k = ONNX block ``[1, 0, 2][k]``;
                                                        cuDNN computes ``linear_before_reset=1``
                                                        (``r * (R_h h + Rb_h)``); ONNX's default 0 has
                                                        no cuDNN mode
=====  =========================  ====================  ==============================================

=================  =======================================  ============================================
tensor             ONNX                                     cuDNN (``cudnnRNNForward`` weight space)
=================  =======================================  ============================================
input weights      ``W[dir]``: ``(G*H, I)``, the G gate     one matrix per gate and pseudo-layer:
                   blocks stacked along rows                ``W_g``: ``(H, I)`` row-major
recurrent weights  ``R[dir]``: ``(G*H, H)``, same stacking  ``R_g``: ``(H, H)`` per gate
biases             ``B[dir] = [Wb (G*H), Rb (G*H)]``        separate ``bW_g``, ``bR_g`` (H) per gate;
                   concatenated                             double-bias mode matches ONNX exactly
directions         leading axis ``num_directions``          pseudo-layers ``layer * 2 + dir``
sequence lengths   ``sequence_lens (B,)`` int32             ``devSeqLengths`` + padded data layout
batch-major input  ``layout=1``: ``X (B, T, I)``            ``CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_*``
=================  =======================================  ============================================

Semantics shared by all cells: time steps ``t >= sequence_lens[b]`` leave ``Y`` zero;
``reverse`` walks each sequence from its own last valid step; ``Y_h``/``Y_c`` hold the
state after the last valid step, and are zero for ``sequence_lens[b] == 0`` (as
onnxruntime does). ``clip`` bounds every gate pre-activation (peephole terms included).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from ...errors import ParamInvalidError
from .mkl import matmul as _blas_matmul

# activation codes shared with the op record (index = code)
ACTIVATIONS = (
    "relu",
    "tanh",
    "sigmoid",
    "affine",
    "leakyrelu",
    "thresholdedrelu",
    "scaledtanh",
    "hardsigmoid",
    "elu",
    "softsign",
    "softplus",
)
#: (needs alpha, needs beta, default alpha, default beta) per activation
ACT_PARAMS = {
    "relu": (False, False, 0.0, 0.0),
    "tanh": (False, False, 0.0, 0.0),
    "sigmoid": (False, False, 0.0, 0.0),
    "affine": (True, True, 1.0, 0.0),
    "leakyrelu": (True, False, 0.01, 0.0),
    "thresholdedrelu": (True, False, 1.0, 0.0),
    "scaledtanh": (True, True, 1.0, 1.0),
    "hardsigmoid": (True, True, 0.2, 0.5),
    "elu": (True, False, 1.0, 0.0),
    "softsign": (False, False, 0.0, 0.0),
    "softplus": (False, False, 0.0, 0.0),
}

_ALIGN = 64


@nb.njit(nogil=True, cache=True)
def _act(code, x, a, b):
    if code == 1:
        return math.tanh(x)
    if code == 2:
        if x >= 0:
            return 1.0 / (1.0 + math.exp(-x))
        e = math.exp(x)
        return e / (1.0 + e)
    if code == 0:
        return x if x > 0 else 0.0 * x
    if code == 3:
        return a * x + b
    if code == 4:
        return x if x >= 0 else a * x
    if code == 5:
        return x if x >= a else 0.0 * x
    if code == 6:
        return a * math.tanh(b * x)
    if code == 7:
        v = a * x + b
        return 0.0 * x if v < 0 else (1.0 + 0.0 * x if v > 1 else v)
    if code == 8:
        return x if x >= 0 else a * (math.exp(x) - 1.0)
    if code == 9:
        return x / (1.0 + abs(x))
    # softplus, stable for large |x|
    if x > 0:
        return x + math.log1p(math.exp(-x))
    return math.log1p(math.exp(x))


@nb.njit(nogil=True, cache=True)
def _clip(v, clip):
    if clip > 0:
        if v > clip:
            return clip
        if v < -clip:
            return -clip
    return v


@nb.njit(nogil=True, cache=True)
def _time(s, n, reverse):
    return n - 1 - s if reverse else s


@nb.njit(nogil=True, cache=True)
def rnn_cell(xw, hr, s, reverse, lens, h, y, d, bt, act, alpha, beta, clip):
    """One step of a simple RNN for the batch: ``h = f(clip(xw[t] + hr))``."""
    B, H = h.shape
    for b in range(B):
        n = lens[b]
        if s >= n:
            continue
        t = _time(s, n, reverse)
        for j in range(H):
            v = _act(act[0], _clip(xw[t, b, j] + hr[b, j], clip), alpha[0], beta[0])
            h[b, j] = v
            if bt:
                y[b, t, d, j] = v
            else:
                y[t, d, b, j] = v


@nb.njit(nogil=True, cache=True)
def lstm_cell(xw, hr, s, reverse, lens, h, c, p, y, d, bt, act, alpha, beta, clip, input_forget):
    """One LSTM step (ONNX gate order i, o, f, c; peepholes p = [pi, po, pf])."""
    B, H = h.shape
    for b in range(B):
        n = lens[b]
        if s >= n:
            continue
        t = _time(s, n, reverse)
        for j in range(H):
            cp = c[b, j]
            gi = xw[t, b, j] + hr[b, j] + p[j] * cp
            i = _act(act[0], _clip(gi, clip), alpha[0], beta[0])
            if input_forget:
                f = 1.0 - i
            else:
                gf = xw[t, b, 2 * H + j] + hr[b, 2 * H + j] + p[2 * H + j] * cp
                f = _act(act[0], _clip(gf, clip), alpha[0], beta[0])
            g = _act(act[1], _clip(xw[t, b, 3 * H + j] + hr[b, 3 * H + j], clip), alpha[1], beta[1])
            cn = f * cp + i * g
            go = xw[t, b, H + j] + hr[b, H + j] + p[H + j] * cn
            o = _act(act[0], _clip(go, clip), alpha[0], beta[0])
            hn = o * _act(act[2], cn, alpha[2], beta[2])
            c[b, j] = cn
            h[b, j] = hn
            if bt:
                y[b, t, d, j] = hn
            else:
                y[t, d, b, j] = hn


@nb.njit(nogil=True, cache=True)
def gru_gates_zr(xw, hr, s, reverse, lens, h, z, rh, act, alpha, beta, clip):
    """GRU (linear_before_reset=0), part 1: update gate z and the reset hidden r*h."""
    B, H = h.shape
    for b in range(B):
        n = lens[b]
        if s >= n:
            continue
        t = _time(s, n, reverse)
        for j in range(H):
            z[b, j] = _act(act[0], _clip(xw[t, b, j] + hr[b, j], clip), alpha[0], beta[0])
            r = _act(act[0], _clip(xw[t, b, H + j] + hr[b, H + j], clip), alpha[0], beta[0])
            rh[b, j] = r * h[b, j]


@nb.njit(nogil=True, cache=True)
def gru_cell_h(xw, hh, s, reverse, lens, h, z, y, d, bt, act, alpha, beta, clip):
    """GRU (linear_before_reset=0), part 2: ``h = (1-z)*g(xw_h + (r*h) Rh^T) + z*h``."""
    B, H = h.shape
    for b in range(B):
        n = lens[b]
        if s >= n:
            continue
        t = _time(s, n, reverse)
        for j in range(H):
            g = _act(act[1], _clip(xw[t, b, 2 * H + j] + hh[b, j], clip), alpha[1], beta[1])
            zz = z[b, j]
            v = (1.0 - zz) * g + zz * h[b, j]
            h[b, j] = v
            if bt:
                y[b, t, d, j] = v
            else:
                y[t, d, b, j] = v


@nb.njit(nogil=True, cache=True)
def gru_cell_lbr(xw, hr, rbh, s, reverse, lens, h, y, d, bt, act, alpha, beta, clip):
    """GRU with linear_before_reset=1: ``g(xw_h + r * (h Rh^T + Rb_h))``, one GEMM per step."""
    B, H = h.shape
    for b in range(B):
        n = lens[b]
        if s >= n:
            continue
        t = _time(s, n, reverse)
        for j in range(H):
            zz = _act(act[0], _clip(xw[t, b, j] + hr[b, j], clip), alpha[0], beta[0])
            r = _act(act[0], _clip(xw[t, b, H + j] + hr[b, H + j], clip), alpha[0], beta[0])
            g = _act(act[1], _clip(xw[t, b, 2 * H + j] + r * (hr[b, 2 * H + j] + rbh[j]), clip), alpha[1], beta[1])
            v = (1.0 - zz) * g + zz * h[b, j]
            h[b, j] = v
            if bt:
                y[b, t, d, j] = v
            else:
                y[t, d, b, j] = v


# -- host side ---------------------------------------------------------------------------------
class RNNPlan:
    """Everything decided at prepare time for one RNN/GRU/LSTM call."""

    __slots__ = (
        "cell",
        "T",
        "B",
        "I",
        "H",
        "D",
        "G",
        "layout",
        "dtype",
        "act",
        "alpha",
        "beta",
        "clip",
        "linear_before_reset",
        "input_forget",
        "reverse",
        "ws_layout",
        "ws_bytes",
        "op",
    )

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)


def make_plan(
    op: str,
    cell: str,
    T: int,
    B: int,
    I: int,
    H: int,
    D: int,
    layout: int,
    dtype,
    act,
    alpha,
    beta,
    clip: float,
    linear_before_reset: int = 0,
    input_forget: int = 0,
) -> RNNPlan:
    G = {"rnn": 1, "gru": 3, "lstm": 4}[cell]
    dtype = np.dtype(dtype)
    # workspace: XW (T,B,G*H), hr (B,G*H), h (B,H), c (B,H), z (B,H), rh (B,H), hh (B,H), lens (B) int64
    parts = [
        ("xw", (T, B, G * H), dtype),
        ("hr", (B, G * H), dtype),
        ("h", (B, H), dtype),
        ("c", (B, H), dtype),
        ("z", (B, H), dtype),
        ("rh", (B, H), dtype),
        ("hh", (B, H), dtype),
        ("lens", (B,), np.dtype(np.int64)),
    ]
    ws_layout, off = [], 0
    for name, shape, dt in parts:
        ws_layout.append((name, off, shape, dt))
        off += -(-max(1, math.prod(shape)) * dt.itemsize // _ALIGN) * _ALIGN
    return RNNPlan(
        op=op,
        cell=cell,
        T=T,
        B=B,
        I=I,
        H=H,
        D=D,
        G=G,
        layout=layout,
        dtype=dtype,
        act=np.asarray(act, np.int64).reshape(D, -1),
        alpha=np.asarray(alpha, dtype).reshape(D, -1),
        beta=np.asarray(beta, dtype).reshape(D, -1),
        clip=float(clip),
        linear_before_reset=int(linear_before_reset),
        input_forget=int(input_forget),
        reverse=None,
        ws_layout=ws_layout,
        ws_bytes=off,
    )


def _carve(ws, plan):
    bufs = {}
    for name, off, shape, dt in plan.ws_layout:
        n = math.prod(shape)
        bufs[name] = ws[off : off + n * dt.itemsize].view(dt).reshape(shape)
    return bufs


def run(ins, outs, attrs, plan: RNNPlan, ws, directions) -> None:
    """Run the planned recurrence. ``ins = [X, W, R, B, sequence_lens, initial_h(, initial_c, P)]``;
    ``outs = [Y, Y_h(, Y_c)]`` (any trailing ones may be absent). ``directions``: per direction,
    True when it runs in reverse."""
    X, W, R, Bias, seq_lens, init_h = ins[:6]
    init_c = ins[6] if len(ins) > 6 else None
    P = ins[7] if len(ins) > 7 else None
    T, B, H, D, G = plan.T, plan.B, plan.H, plan.D, plan.G
    dt = plan.dtype
    bt = plan.layout == 1
    bufs = _carve(ws, plan)
    xw, hr, h, c, z, rh, hh, lens = (bufs[k] for k in ("xw", "hr", "h", "c", "z", "rh", "hh", "lens"))
    y = outs[0] if outs and outs[0] is not None else None
    ybuf = y if y is not None else np.empty((B, T, D, H) if bt else (T, D, B, H), dt)
    if seq_lens is not None:
        lens[:] = seq_lens.reshape(-1)
        if B and (lens.min() < 0 or lens.max() > T):
            raise ParamInvalidError(
                f"{plan.op}: sequence_lens values must lie in [0, {T}] (the seq_length of X), got {seq_lens.tolist()}",
                op=plan.op,
            )
        ybuf.fill(0)
    else:
        lens[:] = T
    xt = X.transpose(1, 0, 2) if bt else X  # (T, B, I) view, no copy
    xt2 = None if bt else X.reshape(T * B, X.shape[-1])  # one GEMM for all steps
    for d in range(D):
        reverse = directions[d]
        Wd, Rd = W[d], R[d]
        if xt2 is not None:
            _blas_matmul(xt2, Wd.T, xw.reshape(T * B, G * H))
        else:
            _blas_matmul(xt, Wd.T, xw)
        if Bias is not None:
            wb, rb = Bias[d, : G * H], Bias[d, G * H :]
            xw += wb
            if plan.cell == "gru" and plan.linear_before_reset:
                xw[:, :, : 2 * H] += rb[: 2 * H]  # Rb_h stays inside r * (...)
            else:
                xw += rb
        if init_h is not None:
            h[:] = init_h[:, d] if bt else init_h[d]
        else:
            h.fill(0)
        act, alpha, beta = plan.act[d], plan.alpha[d], plan.beta[d]
        if plan.cell == "rnn":
            for s in range(T):
                _blas_matmul(h, Rd.T, hr)
                rnn_cell(xw, hr, s, reverse, lens, h, ybuf, d, bt, act, alpha, beta, plan.clip)
        elif plan.cell == "lstm":
            if init_c is not None:
                c[:] = init_c[:, d] if bt else init_c[d]
            else:
                c.fill(0)
            p = P[d] if P is not None else np.zeros(3 * H, dt)
            for s in range(T):
                _blas_matmul(h, Rd.T, hr)
                lstm_cell(
                    xw, hr, s, reverse, lens, h, c, p, ybuf, d, bt, act, alpha, beta, plan.clip, plan.input_forget
                )
        elif plan.linear_before_reset:
            rbh = Bias[d, 5 * H :] if Bias is not None else np.zeros(H, dt)
            for s in range(T):
                _blas_matmul(h, Rd.T, hr)
                gru_cell_lbr(xw, hr, rbh, s, reverse, lens, h, ybuf, d, bt, act, alpha, beta, plan.clip)
        else:
            hr2 = hr.reshape(-1)[: B * 2 * H].reshape(B, 2 * H)  # contiguous (B, 2H)
            for s in range(T):
                _blas_matmul(h, Rd[: 2 * H].T, hr2)
                gru_gates_zr(xw, hr2, s, reverse, lens, h, z, rh, act, alpha, beta, plan.clip)
                _blas_matmul(rh, Rd[2 * H :].T, hh)
                gru_cell_h(xw, hh, s, reverse, lens, h, z, ybuf, d, bt, act, alpha, beta, plan.clip)
        empty = lens == 0
        if len(outs) > 1 and outs[1] is not None:
            yh = outs[1][:, d] if bt else outs[1][d]
            yh[:] = h
            yh[empty] = 0
        if len(outs) > 2 and outs[2] is not None:
            yc = outs[2][:, d] if bt else outs[2][d]
            yc[:] = c
            yc[empty] = 0
