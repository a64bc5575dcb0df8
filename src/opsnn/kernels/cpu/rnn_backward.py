"""CPU backward-through-time kernels for RNN, LSTM and GRU (ONNX gate orders; RNN with Tanh,
Sigmoid or Relu, LSTM and GRU with their default activations).

Per direction the forward is recomputed as :mod:`opsnn.kernels.cpu.rnn` runs it (the input
projection of all steps as one GEMM, one GEMM per step for the recurrent term) while a numba
cell saves, indexed by time step ``t``, the gate activations, the previous hidden state (and
the cell state, or GRU's ``r*h`` / ``h Rh^T + Rb_h``). The reverse sweep then walks the steps
backwards with one or two ``(B, G*H) @ (G*H, H)`` GEMMs per step for the state gradient and a
numba cell for the gate derivatives, writing the pre-activation gradients ``dA (T, B, G*H)``.
The weight gradients are ONE GEMM each after the sweep: ``dW = dA^T X``, ``dR = dA^T H_prev``
(both over all ``T*B`` rows), ``dX = dA W``, and the bias gradients are column sums of ``dA``.

Positions past a row's ``sequence_lens`` keep ``dA = 0`` and ``H_prev = 0``, so they add
nothing to any GEMM; a row's state gradient enters at its own last valid step. The cells are
serial for the reason the forward's are: ``B*H`` work per step against ``B*G*H*H`` for the
step's GEMM, which BLAS already spreads over the threads.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from ...errors import ParamInvalidError
from .mkl import matmul as _blas_matmul

_OPTS = dict(nogil=True, cache=True)
ALIGN = 64


@nb.njit(**_OPTS)
def _sig(x):
    if x >= 0:
        return 1.0 / (1.0 + np.exp(-x))
    e = np.exp(x)
    return e / (1.0 + e)


@nb.njit(**_OPTS)
def _t_of(s, n, reverse):
    return n - 1 - s if reverse else s


# -- simple RNN (activation codes of opsnn.kernels.cpu.rnn: 0 relu, 1 tanh, 2 sigmoid) ----------
@nb.njit(**_OPTS)
def rnn_fwd_save(xw, hr, s, reverse, lens, h, hs, hp, act):
    """One forward step ``h = f(xw[t] + h R^T)``; saves H_{t-1} and H_t at time t."""
    B, H = h.shape
    for b in range(B):
        n = lens[b]
        if s >= n:
            continue
        t = _t_of(s, n, reverse)
        for j in range(H):
            a = xw[t, b, j] + hr[b, j]
            if act == 1:
                v = np.tanh(a)
            elif act == 2:
                v = _sig(a)
            else:
                v = a if a > 0 else 0.0 * a
            hp[t, b, j] = h[b, j]
            hs[t, b, j] = v
            h[b, j] = v


@nb.njit(**_OPTS)
def rnn_bwd_step(s, reverse, lens, hs, dy, d, bt, dh, da, da_s, act):
    """One reverse step: ``dA[t] = (dh + dY[t]) * f'`` with f' read from H_t."""
    B, H = dh.shape
    for b in range(B):
        n = lens[b]
        if s >= n:
            for j in range(H):
                da_s[b, j] = 0.0
            continue
        t = _t_of(s, n, reverse)
        for j in range(H):
            g_h = dh[b, j]
            if dy.shape[0] > 0:
                g_h += dy[b, t, d, j] if bt else dy[t, d, b, j]
            y = hs[t, b, j]
            if act == 1:
                v = g_h * (1.0 - y * y)
            elif act == 2:
                v = g_h * y * (1.0 - y)
            else:
                v = g_h if y > 0 else 0.0 * g_h
            da[t, b, j] = v
            da_s[b, j] = v


# -- LSTM (gates i, o, f, c) ---------------------------------------------------------------------
@nb.njit(**_OPTS)
def lstm_fwd_save(xw, hr, s, reverse, lens, h, c, gates, hp, cp, cs):
    """One forward step; saves the activated gates, H_{t-1}, C_{t-1} and C_t at time t."""
    B, H = h.shape
    for b in range(B):
        n = lens[b]
        if s >= n:
            continue
        t = _t_of(s, n, reverse)
        for j in range(H):
            i = _sig(xw[t, b, j] + hr[b, j])
            o = _sig(xw[t, b, H + j] + hr[b, H + j])
            f = _sig(xw[t, b, 2 * H + j] + hr[b, 2 * H + j])
            g = np.tanh(xw[t, b, 3 * H + j] + hr[b, 3 * H + j])
            cprev = c[b, j]
            cn = f * cprev + i * g
            hp[t, b, j] = h[b, j]
            cp[t, b, j] = cprev
            cs[t, b, j] = cn
            gates[t, b, j] = i
            gates[t, b, H + j] = o
            gates[t, b, 2 * H + j] = f
            gates[t, b, 3 * H + j] = g
            c[b, j] = cn
            h[b, j] = o * np.tanh(cn)


@nb.njit(**_OPTS)
def lstm_bwd_step(s, reverse, lens, gates, cp, cs, dy, d, bt, dh, dc, da, da_s):
    """One reverse step: adds dY[t] into dh, writes dA[t] (and this step's copy da_s), moves dc
    to C_{t-1}; the caller's GEMM ``da_s @ R`` then gives the valid rows' dH_{t-1}."""
    B, H = dh.shape
    for b in range(B):
        n = lens[b]
        if s >= n:
            for k in range(4 * H):
                da_s[b, k] = 0.0
            continue
        t = _t_of(s, n, reverse)
        for j in range(H):
            g_h = dh[b, j]
            if dy.shape[0] > 0:
                g_h += dy[b, t, d, j] if bt else dy[t, d, b, j]
            i = gates[t, b, j]
            o = gates[t, b, H + j]
            f = gates[t, b, 2 * H + j]
            g = gates[t, b, 3 * H + j]
            tc = np.tanh(cs[t, b, j])
            dcv = dc[b, j] + g_h * o * (1.0 - tc * tc)
            ai = dcv * g * i * (1.0 - i)
            ao = g_h * tc * o * (1.0 - o)
            af = dcv * cp[t, b, j] * f * (1.0 - f)
            ag = dcv * i * (1.0 - g * g)
            da[t, b, j] = ai
            da[t, b, H + j] = ao
            da[t, b, 2 * H + j] = af
            da[t, b, 3 * H + j] = ag
            da_s[b, j] = ai
            da_s[b, H + j] = ao
            da_s[b, 2 * H + j] = af
            da_s[b, 3 * H + j] = ag
            dc[b, j] = dcv * f


# -- GRU (gates z, r, h) -------------------------------------------------------------------------
@nb.njit(**_OPTS)
def gru_fwd_zr(xw, hr, s, reverse, lens, h, gates, hp, rh, rh_s):
    """GRU forward, part 1: z and r at time t, H_{t-1} saved, ``rh = r * H_{t-1}`` (at t and
    in this step's ``rh_s``, zero for rows past their length)."""
    B, H = h.shape
    for b in range(B):
        n = lens[b]
        if s >= n:
            for j in range(H):
                rh_s[b, j] = 0.0
            continue
        t = _t_of(s, n, reverse)
        for j in range(H):
            z = _sig(xw[t, b, j] + hr[b, j])
            r = _sig(xw[t, b, H + j] + hr[b, H + j])
            gates[t, b, j] = z
            gates[t, b, H + j] = r
            hp[t, b, j] = h[b, j]
            rh[t, b, j] = r * h[b, j]
            rh_s[b, j] = r * h[b, j]


@nb.njit(**_OPTS)
def gru_fwd_h(xw, hh, s, reverse, lens, h, gates):
    """GRU forward (linear_before_reset=0), part 2: ``hh = tanh(xw_h + (r*h) Rh^T)``, new h."""
    B, H = h.shape
    for b in range(B):
        n = lens[b]
        if s >= n:
            continue
        t = _t_of(s, n, reverse)
        for j in range(H):
            c = np.tanh(xw[t, b, 2 * H + j] + hh[b, j])
            gates[t, b, 2 * H + j] = c
            z = gates[t, b, j]
            h[b, j] = (1.0 - z) * c + z * h[b, j]


@nb.njit(**_OPTS)
def gru_fwd_lbr(xw, hr, rbh, s, reverse, lens, h, gates, hp, hrh):
    """GRU forward with linear_before_reset=1; saves gates, H_{t-1} and ``h Rh^T + Rb_h``."""
    B, H = h.shape
    for b in range(B):
        n = lens[b]
        if s >= n:
            continue
        t = _t_of(s, n, reverse)
        for j in range(H):
            z = _sig(xw[t, b, j] + hr[b, j])
            r = _sig(xw[t, b, H + j] + hr[b, H + j])
            q = hr[b, 2 * H + j] + rbh[j]
            c = np.tanh(xw[t, b, 2 * H + j] + r * q)
            gates[t, b, j] = z
            gates[t, b, H + j] = r
            gates[t, b, 2 * H + j] = c
            hp[t, b, j] = h[b, j]
            hrh[t, b, j] = q
            h[b, j] = (1.0 - z) * c + z * h[b, j]


@nb.njit(**_OPTS)
def gru_bwd_a(s, reverse, lens, gates, hp, hrh, dy, d, bt, dh, dhp, da, dar, da_s, lbr):
    """GRU reverse step, part 1: dY[t] into dh; dz, dA_h and ``dh * z`` (into dhp); with
    linear_before_reset also dr and the gradient of ``h Rh^T + Rb_h`` (into dar and da_s)."""
    B, H = dh.shape
    for b in range(B):
        n = lens[b]
        if s >= n:
            for k in range(3 * H):
                da_s[b, k] = 0.0
            continue
        t = _t_of(s, n, reverse)
        for j in range(H):
            g_h = dh[b, j]
            if dy.shape[0] > 0:
                g_h += dy[b, t, d, j] if bt else dy[t, d, b, j]
            dh[b, j] = g_h
            z = gates[t, b, j]
            r = gates[t, b, H + j]
            c = gates[t, b, 2 * H + j]
            hprev = hp[t, b, j]
            az = g_h * (hprev - c) * z * (1.0 - z)
            ah = g_h * (1.0 - z) * (1.0 - c * c)
            dhp[b, j] = g_h * z
            da[t, b, j] = az
            da[t, b, 2 * H + j] = ah
            da_s[b, j] = az
            if lbr:
                ar = ah * hrh[t, b, j] * r * (1.0 - r)
                da[t, b, H + j] = ar
                da_s[b, H + j] = ar
                da_s[b, 2 * H + j] = ah * r
                dar[t, b, j] = az
                dar[t, b, H + j] = ar
                dar[t, b, 2 * H + j] = ah * r
            else:
                da_s[b, 2 * H + j] = ah


@nb.njit(**_OPTS)
def gru_bwd_r(s, reverse, lens, gates, hp, drh, dhp, da, da_s):
    """GRU reverse step (linear_before_reset=0), part 2: from ``drh = dA_h Rh`` the reset
    gate's dA and the ``drh * r`` term of dH_{t-1}."""
    B, H = dhp.shape
    for b in range(B):
        n = lens[b]
        if s >= n:
            continue
        t = _t_of(s, n, reverse)
        for j in range(H):
            r = gates[t, b, H + j]
            ar = drh[b, j] * hp[t, b, j] * r * (1.0 - r)
            da[t, b, H + j] = ar
            da_s[b, H + j] = ar
            dhp[b, j] += drh[b, j] * r


@nb.njit(**_OPTS)
def carry(s, lens, dh, part, tmp):
    """dh of the rows valid at step s becomes ``part + tmp`` (part may be dh-shaped zeros)."""
    B, H = dh.shape
    for b in range(B):
        if s < lens[b]:
            for j in range(H):
                dh[b, j] = part[b, j] + tmp[b, j]


# -- host side -------------------------------------------------------------------------------------
class RNNGradPlan:
    """Sizes and flags decided at prepare time for one LSTMGrad/GRUGrad call."""

    __slots__ = (
        "op",
        "cell",
        "T",
        "B",
        "I",
        "H",
        "D",
        "G",
        "layout",
        "dtype",
        "reverse",
        "lbr",
        "act",
        "ws_layout",
        "ws_bytes",
    )

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)
        T, B, I, H, GH = self.T, self.B, self.I, self.H, self.G * self.H
        parts = [("gates", (T, B, GH)), ("hp", (T, B, H)), ("aux", (T, B, H)), ("xw", (T, B, GH))]
        parts += [("da", (T, B, GH)), ("dx_d", (T * B, I)), ("acc", (T * B, I)), ("hr", (B, GH)), ("da_s", (B, GH))]
        parts += [(k, (B, H)) for k in ("h", "c", "dh", "dc", "dhp", "tmp")]
        if self.layout == 1:
            parts.append(("xt", (T, B, I)))
        if self.cell == "lstm":
            parts.append(("cs", (T, B, H)))
        elif self.cell == "gru":
            parts += [("dar", (T, B, GH))] if self.lbr else [("hr2", (B, 2 * H)), ("hh", (B, H))]
        self.ws_layout, off = [], 0
        for name, shape in parts:
            self.ws_layout.append((name, off, shape))
            off += -(-max(1, math.prod(shape)) * self.dtype.itemsize // ALIGN) * ALIGN
        self.ws_bytes = off


def _carve(ws, plan):
    """The plan's scratch arrays as views of the workspace (64-byte aligned offsets)."""
    base = ws.reshape(-1).view(np.uint8)
    pad = (-base.ctypes.data) % ALIGN
    n_item = plan.dtype.itemsize
    return {
        name: base[pad + off : pad + off + math.prod(shape) * n_item].view(plan.dtype).reshape(shape)
        for name, off, shape in plan.ws_layout
    }


def _mm(a, b, out):
    """``out = a @ b`` for 2-D operands (empty inner dimension: zeros)."""
    if a.shape[1] == 0:
        out.fill(0)
    elif out.size:
        _blas_matmul(a, b, out)


def run(plan: RNNGradPlan, X, W, R, Bias, seq_lens, h0, c0, dY, dYh, dYc, outs, ws) -> None:
    """Backward through time. ``outs = [dX, dW, dR, dB, dinitial_h(, dinitial_c)]`` in the
    forward's layouts; absent optional inputs are None; ``ws``: ``plan.ws_bytes`` of scratch."""
    T, B, I, H, D, G = plan.T, plan.B, plan.I, plan.H, plan.D, plan.G
    dt = plan.dtype
    bt = plan.layout == 1
    lstm = plan.cell == "lstm"
    dX, dW, dR, dB, dh0 = outs[:5]
    dc0 = outs[5] if lstm else None
    if seq_lens is not None:
        lens = seq_lens.reshape(-1).astype(np.int64)
        if B and (lens.min() < 0 or lens.max() > T):
            raise ParamInvalidError(
                f"{plan.op}: sequence_lens values must lie in [0, {T}] (the seq_length of X), got {seq_lens.tolist()}",
                op=plan.op,
            )
    else:
        lens = np.full(B, T, np.int64)
    buf = _carve(ws, plan)
    if bt:
        xt = buf["xt"]
        xt[...] = X.transpose(1, 0, 2)
    else:
        xt = np.ascontiguousarray(X)
    x2 = xt.reshape(T * B, I)
    dy = np.zeros((0, 0, 0, 0), dt) if dY is None else np.ascontiguousarray(dY, dt)
    gates, hp, aux, xw, hr, h, c = (buf[k] for k in ("gates", "hp", "aux", "xw", "hr", "h", "c"))
    cs = buf["cs"] if lstm else None  # aux: RNN H_t; LSTM C_{t-1}; GRU r*h, or h Rh^T + Rb_h
    da, da_s, dh, dc, dhp, tmp, dx_d, acc = (buf[k] for k in ("da", "da_s", "dh", "dc", "dhp", "tmp", "dx_d", "acc"))
    dar = buf["dar"] if (plan.cell == "gru" and plan.lbr) else None
    acc.fill(0)
    empty = lens == 0

    def state(v, d):
        return v[:, d] if bt else v[d]

    for d in range(D):
        reverse = plan.reverse[d]
        Wd, Rd = W[d], R[d]
        for v in (gates, hp, aux, da) if dar is None else (gates, hp, aux, da, dar):
            v.fill(0)  # positions past a row's length stay zero: they add nothing to the GEMMs
        _mm(x2, Wd.T, xw.reshape(T * B, G * H))
        if Bias is not None:
            xw += Bias[d, : G * H]
            if not lstm and plan.lbr:
                xw[:, :, : 2 * H] += Bias[d, G * H : G * H + 2 * H]
            else:
                xw += Bias[d, G * H :]
        h[:] = 0 if h0 is None else state(h0, d)
        if plan.cell == "rnn":
            for s in range(T):
                _mm(h, Rd.T, hr)
                rnn_fwd_save(xw, hr, s, reverse, lens, h, aux, hp, plan.act[d])
        elif lstm:
            c[:] = 0 if c0 is None else state(c0, d)
            for s in range(T):
                _mm(h, Rd.T, hr)
                lstm_fwd_save(xw, hr, s, reverse, lens, h, c, gates, hp, aux, cs)
        elif plan.lbr:
            rbh = Bias[d, G * H + 2 * H :] if Bias is not None else np.zeros(H, dt)
            for s in range(T):
                _mm(h, Rd.T, hr)
                gru_fwd_lbr(xw, hr, rbh, s, reverse, lens, h, gates, hp, aux)
        else:
            hr2, hh = buf["hr2"], buf["hh"]
            for s in range(T):
                _mm(h, Rd[: 2 * H].T, hr2)
                gru_fwd_zr(xw, hr2, s, reverse, lens, h, gates, hp, aux, dhp)
                _mm(dhp, Rd[2 * H :].T, hh)
                gru_fwd_h(xw, hh, s, reverse, lens, h, gates)

        # reverse sweep
        dh[:] = 0 if dYh is None else state(dYh, d)
        dh[empty] = 0
        if lstm:
            dc[:] = 0 if dYc is None else state(dYc, d)
            dc[empty] = 0
        for s in range(T - 1, -1, -1):
            if plan.cell == "rnn":
                rnn_bwd_step(s, reverse, lens, aux, dy, d, bt, dh, da, da_s, plan.act[d])
                _mm(da_s, Rd, tmp)
                dhp.fill(0)
            elif lstm:
                lstm_bwd_step(s, reverse, lens, gates, aux, cs, dy, d, bt, dh, dc, da, da_s)
                _mm(da_s, Rd, tmp)
                dhp.fill(0)
            elif plan.lbr:
                gru_bwd_a(s, reverse, lens, gates, hp, aux, dy, d, bt, dh, dhp, da, dar, da_s, 1)
                _mm(da_s, Rd, tmp)
            else:
                gru_bwd_a(s, reverse, lens, gates, hp, aux, dy, d, bt, dh, dhp, da, da, da_s, 0)
                _mm(da_s[:, 2 * H :], Rd[2 * H :], tmp)
                gru_bwd_r(s, reverse, lens, gates, hp, tmp, dhp, da, da_s)
                _mm(da_s[:, : 2 * H], Rd[: 2 * H], tmp)
            carry(s, lens, dh, dhp, tmp)
        state(dh0, d)[:] = dh
        if lstm:
            state(dc0, d)[:] = dc

        # weight, bias and input gradients over all steps at once
        da2 = da.reshape(T * B, G * H)
        _mm(da2.T, x2, dW[d])
        _mm(da2, Wd, dx_d)
        acc += dx_d
        dwb = da2.sum(axis=0)
        dB[d, : G * H] = dwb
        if lstm or plan.cell == "rnn":
            _mm(da2.T, hp.reshape(T * B, H), dR[d])
            dB[d, G * H :] = dwb
        elif plan.lbr:
            dar2 = dar.reshape(T * B, G * H)
            _mm(dar2.T, hp.reshape(T * B, H), dR[d])
            dB[d, G * H :] = dar2.sum(axis=0)
        else:
            _mm(da2[:, : 2 * H].T, hp.reshape(T * B, H), dR[d, : 2 * H])
            _mm(da2[:, 2 * H :].T, aux.reshape(T * B, H), dR[d, 2 * H :])
            dB[d, G * H :] = dwb
    dx3 = acc.reshape(T, B, I)
    dX[...] = dx3.transpose(1, 0, 2) if bt else dx3
