"""Convolution gradients as records: opsnn::ConvBackwardData, ConvBackwardWeight and ConvBackward
(oneDNN's backward primitives, GEMM fallbacks) against a float64 oracle written here (explicit loops
over output positions and kernel taps, independent of the records' slicing references), torch's
``torch.nn.grad`` where importable, and through Conv's gradient rule.

Tolerances: float32 kernels sum at most a few hundred products of O(1) values, so they agree with
the float64 oracle to rtol 1e-4 with atol 1e-4 times the largest |oracle| entry (float32 eps is
1.2e-7; the oneDNN and GEMM kernels differ only in summation order); float64 fallbacks to 1e-10.
bfloat16 (8 mantissa bits) results are rounded once from a float32 accumulator: rtol 2e-2 with
atol 2e-2 times the largest entry, against the oracle on the same bf16-rounded inputs.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import opsnn
from opsnn import dtypes as _dt
from opsnn.errors import DTypeError, InferShapeError, OpsnnError, ParamInvalidError
from opsnn.kernels.cpu import libraries as KL
from opsnn.kernels.cpu import onednn as KD
from opsnn.runtime import cpu

RNG = np.random.default_rng(2031)

# (X shape, W shape, strides, pads (begins + ends), dilations, group)
CASES = {
    "2d_strided_asym_pads": ((2, 5, 9, 11), (6, 5, 3, 3), (2, 2), (1, 0, 2, 1), (1, 1), 1),
    "2d_dilated": ((1, 4, 10, 9), (3, 4, 3, 2), (1, 1), (2, 1, 2, 0), (2, 3), 1),
    "2d_grouped": ((2, 6, 7, 8), (9, 2, 3, 3), (1, 2), (1, 1, 1, 1), (1, 1), 3),
    "2d_depthwise_x2": ((2, 16, 9, 9), (32, 1, 3, 3), (2, 1), (1, 1, 1, 1), (1, 1), 16),
    "2d_depthwise": ((2, 32, 10, 9), (32, 1, 3, 3), (1, 2), (1, 1, 0, 1), (1, 1), 32),
    "2d_grouped_blocked": ((2, 64, 6, 7), (64, 16, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 4),
    "2d_wide_blocked": ((2, 32, 8, 7), (48, 32, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "2d_1x1": ((3, 16, 5, 6), (8, 16, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "2d_stride_leftover": ((1, 3, 12, 13), (4, 3, 4, 4), (3, 4), (0, 0, 0, 0), (1, 1), 1),
    "1d": ((2, 6, 17), (4, 3, 5), (2,), (2, 1), (1,), 2),
    "3d": ((1, 4, 5, 6, 7), (5, 4, 3, 2, 3), (1, 2, 1), (1, 0, 1, 1, 1, 0), (1, 1, 2), 1),
}


def _out_shape(xs, ws, s, pads, d):
    nd = len(xs) - 2
    return (xs[0], ws[0]) + tuple(
        (xs[2 + i] + pads[i] + pads[nd + i] - (ws[2 + i] - 1) * d[i] - 1) // s[i] + 1 for i in range(nd)
    )


def _oracle(x, w, dy, s, pads, d, g):
    """(dX, dW) in float64 by the definition: every output position and kernel tap that reads an
    input position inside the (unpadded) input adds dY * W to dX and dY * X to dW there."""
    x, w, dy = (np.asarray(a, np.float64) for a in (x, w, dy))
    nd = x.ndim - 2
    cg, mg = x.shape[1] // g, w.shape[0] // g
    dx, dw = np.zeros_like(x), np.zeros_like(w)
    for o in np.ndindex(*dy.shape[2:]):
        for k in np.ndindex(*w.shape[2:]):
            i = tuple(o[j] * s[j] - pads[j] + k[j] * d[j] for j in range(nd))
            if any(v < 0 or v >= x.shape[2 + j] for j, v in enumerate(i)):
                continue
            for gi in range(g):
                cs, ms = slice(gi * cg, (gi + 1) * cg), slice(gi * mg, (gi + 1) * mg)
                gy = dy[(slice(None), ms) + o]  # (N, mg)
                wk = w[(ms, slice(None)) + k]  # (mg, cg)
                dx[(slice(None), cs) + i] += gy @ wk
                dw[(ms, slice(None)) + k] += gy.T @ x[(slice(None), cs) + i]
    return dx, dw


def _problem(name, dtype=np.float32):
    xs, ws, s, pads, d, g = CASES[name]
    x = RNG.standard_normal(xs).astype(dtype)
    w = RNG.standard_normal(ws).astype(dtype)
    dy = RNG.standard_normal(_out_shape(xs, ws, s, pads, d)).astype(dtype)
    return x, w, dy, s, pads, d, g


def _close(got, want, dtype):
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    tol = {np.float64: 1e-10, np.float32: 1e-4}.get(dtype, 2e-2)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol * scale)


def _ieee_close(got, want, dtype, signs=False, err_msg=""):
    """NaN and Inf exactly where ``want`` has them (``signs``: the Infs' signs too), the rest :func:`_close`."""
    got = np.asarray(got, np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=err_msg)
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want), err_msg=err_msg)
    if signs:
        np.testing.assert_array_equal(np.sign(got[np.isinf(got)]), np.sign(want[np.isinf(want)]))
    ok = np.isfinite(want)
    _close(got[ok], want[ok], dtype)


def _grads(x, w, dy, s, pads, d, g, algo=(None, None)):
    T = opsnn.tensor
    dx = opsnn.ops.conv_backward_data(
        T(dy), T(w), x.shape, stride=s, padding=pads, dilation=d, groups=g, algo=algo[0]
    ).numpy()
    dw = opsnn.ops.conv_backward_weight(
        T(x), T(dy), w.shape, stride=s, padding=pads, dilation=d, groups=g, algo=algo[1]
    ).numpy()
    return dx, dw


def _onednn_applies(name, kind, dtype=np.float32) -> bool:
    xs, ws, s, pads, d, g = CASES[name]
    c = KL.conv_backward(kind, xs, ws, _out_shape(xs, ws, s, pads, d), s, pads, d, g, dtype)
    return c.library == "onednn"


@pytest.mark.parametrize("name", list(CASES))
def test_selected_kernels_match_the_oracle(name):
    x, w, dy, s, pads, d, g = _problem(name)
    want_dx, want_dw = _oracle(x, w, dy, s, pads, d, g)
    dx, dw = _grads(x, w, dy, s, pads, d, g)
    assert dx.dtype == np.float32 and dw.dtype == np.float32
    _close(dx, want_dx, np.float32)
    _close(dw, want_dw, np.float32)


@pytest.mark.parametrize("name", list(CASES))
def test_each_kernel_matches_the_oracle(name):
    """The GEMM fallbacks in float32 and float64 (what gradient checks run), oneDNN's primitives where
    they apply here, and the records' numpy references."""
    x, w, dy, s, pads, d, g = _problem(name, np.float64)
    want_dx, want_dw = _oracle(x, w, dy, s, pads, d, g)
    gemm = ("conv_backward_data_col2im", "conv_backward_weight_im2col")
    for dt in (np.float32, np.float64):
        got = _grads(x.astype(dt), w.astype(dt), dy.astype(dt), s, pads, d, g, gemm)
        for a, b in zip(got, (want_dx, want_dw)):
            assert a.dtype == dt
            _close(a, b, dt)
    got = _grads(x, w, dy, s, pads, d, g, ("reference", "reference"))
    _close(got[0], want_dx, np.float64)
    _close(got[1], want_dw, np.float64)
    for i, kind in enumerate(("data", "weights")):
        if not _onednn_applies(name, kind):
            continue
        algo = [None, None]
        algo[i] = "conv_backward_data_onednn" if kind == "data" else "conv_backward_weight_onednn"
        got = _grads(x.astype(np.float32), w.astype(np.float32), dy.astype(np.float32), s, pads, d, g, algo)
        _close(got[i], (want_dx, want_dw)[i], np.float32)


def test_float64_never_goes_to_onednn():
    x, w, dy, s, pads, d, g = _problem("2d_wide_blocked", np.float64)
    ex = opsnn.aclnn.conv_backward_data.prepare(
        opsnn.tensor(dy), opsnn.tensor(w), x.shape, stride=s, padding=pads, dilation=d, groups=g
    )
    assert ex.kernel_name == "conv_backward_data_col2im"
    ex = opsnn.aclnn.conv_backward_weight.prepare(
        opsnn.tensor(x), opsnn.tensor(dy), w.shape, stride=s, padding=pads, dilation=d, groups=g
    )
    assert ex.kernel_name == "conv_backward_weight_im2col"


def test_choice_follows_onednn_availability(monkeypatch):
    """Where oneDNN runs, float32 goes to its primitives on a JIT implementation (never its ``ref``
    code); with oneDNN unavailable (``OPSNN_ONEDNN=0`` is read once per process: the availability
    function is patched) the GEMM kernels run and agree with the oracle."""
    name = "2d_wide_blocked"
    x, w, dy, s, pads, d, g = _problem(name)
    args = (x.shape, w.shape, dy.shape, s, pads, d, g, np.float32)
    if KD.unavailable() is None:
        for kind in ("data", "weights"):
            c = KL.conv_backward(kind, *args)
            assert c.library == "onednn" and "ref" not in c.reason.split("backward")[0], c
            prim = KD.conv_backward(kind, *args[:-1], np.float32, c.formats)
            assert not prim.impl.startswith("ref") and prim.impl in c.reason
    monkeypatch.setattr(KD, "unavailable", lambda: "disabled for this test")
    for kind in ("data", "weights"):
        c = KL.conv_backward(kind, *args)
        assert c.library == "opsnn" and c.reason == "disabled for this test"
    T = opsnn.tensor
    ex = opsnn.aclnn.conv_backward_data.prepare(T(dy), T(w), x.shape, stride=s, padding=pads, dilation=d, groups=g)
    assert ex.kernel_name == "conv_backward_data_col2im"
    want_dx, want_dw = _oracle(x, w, dy, s, pads, d, g)
    _close(ex.run().numpy(), want_dx, np.float32)
    ex = opsnn.aclnn.conv_backward_weight.prepare(T(x), T(dy), w.shape, stride=s, padding=pads, dilation=d, groups=g)
    assert ex.kernel_name == "conv_backward_weight_im2col"
    _close(ex.run().numpy(), want_dw, np.float32)


# (X shape, W shape, pads) of stride-1 convolutions the nhwc primitives run: channels off the 16 / 8 blocks,
# asymmetric pads, a plane wider than tall
NHWC_CASES = {
    "3x3_24_to_40": ((2, 24, 9, 8), (40, 24, 3, 3), (1, 1, 1, 1)),
    "5x3_asym_pads": ((3, 16, 7, 11), (32, 16, 5, 3), (2, 0, 1, 2)),
}


@pytest.mark.skipif(KD.unavailable() is not None, reason="oneDNN is unavailable")
@pytest.mark.parametrize("where", [None, "x", "w", "dy"])
@pytest.mark.parametrize("name", list(NHWC_CASES))
def test_nhwc_primitives_match_the_oracle(name, where):
    """oneDNN asked for nhwc activations (``formats='nhwc'``, what ``libraries.plain_conv_formats`` picks on
    Intel AVX-512): the forward, data and weight gradients on plain tensors, reordered at the edges,
    against the float64 definition; a NaN or Inf in an input reaches the outputs the definition takes it
    to (oneDNN's JIT code skips padding taps, as the oracle does)."""
    xs, ws, pads = NHWC_CASES[name]
    s, d = (1, 1), (1, 1)
    ys = _out_shape(xs, ws, s, pads, d)
    x, w, dy = (RNG.standard_normal(shape).astype(np.float32) for shape in (xs, ws, ys))
    if where is not None:
        flat = {"x": x, "w": w, "dy": dy}[where].reshape(-1)
        flat[flat.size // 3], flat[(2 * flat.size) // 3] = np.nan, -np.inf
    b = RNG.standard_normal(ws[0]).astype(np.float32)
    attrs = {"strides": list(s), "pads": list(pads), "dilations": list(d), "group": 1}
    with np.errstate(invalid="ignore"):
        want_y = _conv64(x, w, b, attrs)
        want_dx, want_dw = _oracle(x, w, dy, s, pads, d, 1)
    fwd = KD.plain_conv(xs, ws, ys, s, pads, d, 1, True, np.float32, formats="nhwc")
    y = np.empty(ys, np.float32)
    fwd.run(x, w, b, y, np.empty(fwd.workspace_bytes + 64, np.uint8))
    got = {"y": (y, want_y)}
    for kind, a, bb, out, want in (
        ("data", dy, w, np.empty(xs, np.float32), want_dx),
        ("weights", x, dy, np.empty(ws, np.float32), want_dw),
    ):
        prim = KD.conv_backward(kind, xs, ws, ys, s, pads, d, 1, np.float32, "nhwc")
        assert not prim.impl.startswith("ref"), prim.impl
        prim.run(a, bb, out, np.empty(prim.workspace_bytes + 64, np.uint8))
        got[kind] = (out, want)
    assert "nhwc" in fwd.describe()
    for key, (have, want) in got.items():
        _ieee_close(have, want, np.float32, err_msg=key)


@pytest.mark.parametrize("name", ["2d_strided_asym_pads", "2d_depthwise_x2", "3d"])
def test_bfloat16(name):
    """bfloat16: oneDNN's native bf16 primitives where the CPU has AVX512-BF16, else the GEMM
    kernels through the float32 adapter; either way within bf16 rounding of the oracle."""
    x, w, dy, s, pads, d, g = _problem(name)
    xb, wb, dyb = (a.astype(_dt.bfloat16) for a in (x, w, dy))
    want_dx, want_dw = _oracle(xb, wb, dyb, s, pads, d, g)
    dx, dw = _grads(xb, wb, dyb, s, pads, d, g)
    assert dx.dtype == _dt.bfloat16 and dw.dtype == _dt.bfloat16
    _close(dx.astype(np.float32), want_dx, _dt.bfloat16)
    _close(dw.astype(np.float32), want_dw, _dt.bfloat16)
    T = opsnn.tensor
    ex = opsnn.aclnn.conv_backward_data.prepare(T(dyb), T(wb), x.shape, stride=s, padding=pads, dilation=d, groups=g)
    native = KD.bf16_unavailable() is None and _onednn_applies(name, "data", _dt.bfloat16)
    assert (ex.kernel_name == "conv_backward_data_onednn") == native, ex.reason


def _oracle_padded(x, w, dy, s, pads, d, g):
    """The oracle with the padding as explicit zeros that the taps multiply (what an im2col column
    buffer holds): differs from :func:`_oracle` only where a NaN or Inf in dY meets a padding tap."""
    nd = x.ndim - 2
    xp = np.pad(np.asarray(x, np.float64), [(0, 0), (0, 0)] + [(pads[i], pads[nd + i]) for i in range(nd)])
    with np.errstate(invalid="ignore"):
        _, dw = _oracle(xp, w, dy, s, (0,) * (2 * nd), d, g)
    return dw


@pytest.mark.parametrize("where", ["dy", "w", "x"])
@pytest.mark.parametrize("kernels", ["selected", "selected_3d", "selected_dw", "gemm"])
def test_nan_and_inf_propagate_as_in_the_definition(where, kernels):
    """A NaN or Inf in dY, W or X reaches exactly the gradient entries the definition's sums take it
    into: oneDNN's primitives skip the padding (and the zero channels of their blocked layouts) as
    the direct sum does; an im2col weight gradient (opsnn's, or oneDNN's ``gemm`` code) multiplies dY
    by the padding's zeros, so a non-finite dY also reaches the taps that read padding (NaN, as
    0 * Inf is)."""
    name = {"selected": "2d_wide_blocked", "selected_3d": "3d", "selected_dw": "2d_depthwise"}.get(
        kernels, "2d_strided_asym_pads"
    )
    x, w, dy, s, pads, d, g = _problem(name)
    arr = {"dy": dy, "w": w, "x": x}[where]
    flat = arr.reshape(-1)
    flat[flat.size // 3] = np.nan
    flat[(2 * flat.size) // 3] = np.inf
    with np.errstate(invalid="ignore"):
        want_dx, want_dw = _oracle(x, w, dy, s, pads, d, g)
    gemm = ("conv_backward_data_col2im", "conv_backward_weight_im2col")
    algo = gemm if kernels == "gemm" else (None, None)
    T = opsnn.tensor
    ex = opsnn.aclnn.conv_backward_weight.prepare(
        T(x), T(dy), w.shape, stride=s, padding=pads, dilation=d, groups=g, algo=algo[1]
    )
    if ex.kernel_name == gemm[1] or "gemm" in getattr(ex.plan, "impl", ""):  # oneDNN's own im2col code too
        want_dw = _oracle_padded(x, w, dy, s, pads, d, g)
    with np.errstate(invalid="ignore"):
        got = _grads(x, w, dy, s, pads, d, g, algo)
    for a, b in zip(got, (want_dx, want_dw)):
        _ieee_close(a, b, np.float32, signs=True)


def test_empty_batch_gives_zero_weight_gradient():
    x = np.zeros((0, 4, 6, 6), np.float32)
    w = RNG.standard_normal((5, 4, 3, 3)).astype(np.float32)
    dy = np.zeros((0, 5, 4, 4), np.float32)
    dx, dw = _grads(x, w, dy, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    assert dx.shape == x.shape and dw.shape == w.shape
    np.testing.assert_array_equal(dw, 0)


def test_two_phase_conv2d_backward_gives_all_three():
    """``opsnn.aclnn.conv2d_backward.prepare`` (aclnnConvolutionBackward): dX, dW and dB, repeatable
    on new data."""
    x, w, dy, s, pads, d, g = _problem("2d_grouped")
    T = opsnn.tensor
    ex = opsnn.aclnn.conv2d_backward.prepare(T(dy), T(x), T(w), stride=s, padding=pads, dilation=d, groups=g)
    ws = opsnn.empty((ex.workspace_size,), "uint8")
    stream = opsnn.Stream()
    for _ in range(2):
        dx, dw, db = ex.run(ws, stream)
        stream.synchronize()
        want_dx, want_dw = _oracle(x, w, dy, s, pads, d, g)
        _close(dx.numpy(), want_dx, np.float32)
        _close(dw.numpy(), want_dw, np.float32)
        _close(db.numpy(), dy.astype(np.float64).sum(axis=(0, 2, 3)), np.float32)
        x[...] = RNG.standard_normal(x.shape)
        dy[...] = RNG.standard_normal(dy.shape)
        dx, dw, db = ex.run(ws, stream, inputs=[T(dy), T(x), T(w)])
        stream.synchronize()
        _close(dw.numpy(), _oracle(x, w, dy, s, pads, d, g)[1], np.float32)


@pytest.mark.parametrize("name", ["2d_strided_asym_pads", "2d_grouped", "1d", "3d"])
def test_conv_gradient_rule_uses_the_records(name, monkeypatch):
    """``loss.backward()`` through conv{1,2,3}d: the data and weight gradients come from the backward
    records (counted at prepare), and dX, dW, dB match the oracle."""
    from opsnn.ops import executor

    x, w, dy, s, pads, d, g = _problem(name)
    nd = x.ndim - 2
    b = RNG.standard_normal(w.shape[0]).astype(np.float32)
    seen = []
    real = executor.call

    def spy(rec, *a, **k):
        seen.append((rec.domain, rec.name))
        return real(rec, *a, **k)

    monkeypatch.setattr(executor, "call", spy)
    tx, tw, tb = (opsnn.tensor(a).requires_grad_() for a in (x, w, b))
    fn = getattr(opsnn.ops, f"conv{nd}d")
    pad = {"padding": list(pads[:nd])} if pads[:nd] == pads[nd:] else None
    if pad is None:  # asymmetric pads: the ONNX record directly
        y = opsnn.ops.run_op("Conv", [tx, tw, tb], {"strides": s, "pads": list(pads), "dilations": d, "group": g})[0]
    else:
        y = fn(tx, tw, tb, stride=s, dilation=d, groups=g, **pad)
    opsnn.ops.sum(opsnn.ops.mul(y, opsnn.tensor(dy))).backward()
    assert ("opsnn", "ConvBackwardData") in seen and ("opsnn", "ConvBackwardWeight") in seen
    assert ("", "ConvTranspose") not in seen
    want_dx, want_dw = _oracle(x, w, dy, s, pads, d, g)
    _close(tx.grad.numpy(), want_dx, np.float32)
    _close(tw.grad.numpy(), want_dw, np.float32)
    _close(tb.grad.numpy(), dy.astype(np.float64).sum(axis=(0,) + tuple(range(2, nd + 2))), np.float32)


@pytest.mark.parametrize("name", ["2d_strided_asym_pads", "2d_dilated", "2d_depthwise_x2", "1d", "3d"])
def test_against_torch_nn_grad(name):
    torch = pytest.importorskip("torch")
    x, w, dy, s, pads, d, g = _problem(name)
    nd = x.ndim - 2
    if pads[:nd] != pads[nd:]:  # torch pads symmetrically
        pads = tuple(pads[:nd]) * 2
        dy = RNG.standard_normal(_out_shape(x.shape, w.shape, s, pads, d)).astype(np.float32)
    p = tuple(pads[:nd])
    tg = getattr(torch.nn.grad, f"conv{nd}d_input"), getattr(torch.nn.grad, f"conv{nd}d_weight")
    want_dx = tg[0](x.shape, torch.tensor(w), torch.tensor(dy), s, p, d, g).numpy()
    want_dw = tg[1](torch.tensor(x), w.shape, torch.tensor(dy), s, p, d, g).numpy()
    dx, dw = _grads(x, w, dy, s, pads, d, g)
    _close(dx, want_dx.astype(np.float64), np.float32)
    _close(dw, want_dw.astype(np.float64), np.float32)


def test_bad_inputs_are_typed_errors():
    x, w, dy, s, pads, d, g = _problem("2d_strided_asym_pads")
    T = opsnn.tensor
    kw = {"stride": s, "padding": pads, "dilation": d, "groups": g}
    with pytest.raises(InferShapeError, match=r"ConvBackwardData: output gradient dY must have the forward's output"):
        opsnn.ops.conv_backward_data(T(dy[:, :, :-1]), T(w), x.shape, **kw)
    with pytest.raises(InferShapeError, match=r"ConvBackwardWeight: output gradient dY must have"):
        opsnn.ops.conv_backward_weight(T(x), T(dy[:, :-1]), w.shape, **kw)
    with pytest.raises(InferShapeError, match=r"ConvBackwardData: input channels mismatch"):
        opsnn.ops.conv_backward_data(T(dy), T(w), (2, 4) + x.shape[2:], **kw)
    with pytest.raises(
        ParamInvalidError, match=r"ConvBackwardWeight: attribute 'weight_shape' must be the forward's 4"
    ):
        opsnn.ops.conv_backward_weight(T(x), T(dy), w.shape[:3], **kw)
    with pytest.raises(DTypeError, match=r"ConvBackwardData: inputs 'dY' \(float32\) and 'W' \(float64\)"):
        opsnn.ops.conv_backward_data(T(dy), T(w.astype(np.float64)), x.shape, **kw)
    with pytest.raises(ParamInvalidError, match=r"conv2d_backward: stride must be an int or 2 ints"):
        opsnn.ops.conv2d_backward(T(dy), T(x), T(w), stride=(1, 2, 3))
    with pytest.raises(ParamInvalidError, match=r"conv_backward_data: tensors must be 3-D, 4-D or 5-D"):
        opsnn.ops.conv_backward_data(T(dy[0, 0]), T(w), x.shape)
    with pytest.raises(OpsnnError, match=r"ConvBackwardWeight: attribute 'strides' must be positive"):
        opsnn.ops.conv_backward_weight(T(x), T(dy), w.shape, stride=0)


def test_every_case_is_a_real_convolution():
    """The cases' shapes are what Conv itself infers (guards the table above)."""
    for name, (xs, ws, s, pads, d, g) in CASES.items():
        y = opsnn.ops.run_op(
            "Conv",
            [opsnn.tensor(np.zeros(xs, np.float32)), opsnn.tensor(np.zeros(ws, np.float32))],
            {"strides": s, "pads": list(pads), "dilations": d, "group": g},
        )[0]
        assert tuple(y.shape) == _out_shape(xs, ws, s, pads, d), name


@pytest.mark.parametrize("name", ["2d_strided_asym_pads", "2d_grouped", "1d", "3d"])
def test_conv_transpose_weight_gradient_uses_the_weight_record(name, monkeypatch):
    """ConvTranspose(x, W) is the adjoint of Conv(., W): its weight gradient is ConvBackwardWeight of
    the output gradient by x (the oracle with the roles swapped); the data gradient is Conv's forward."""
    from opsnn.ops import executor

    z, w, x, s, pads, d, g = _problem(name)  # the Conv this ConvTranspose is the adjoint of: z -> x
    seen = []
    real = executor.call

    def spy(rec, *a, **k):
        seen.append(rec.name)
        return real(rec, *a, **k)

    monkeypatch.setattr(executor, "call", spy)
    tx, tw = opsnn.tensor(x).requires_grad_(), opsnn.tensor(w).requires_grad_()
    attrs = {"strides": s, "pads": list(pads), "dilations": d, "group": g}
    nd = x.ndim - 2
    natural = [
        s[i] * (x.shape[2 + i] - 1) + (w.shape[2 + i] - 1) * d[i] + 1 - pads[i] - pads[nd + i] for i in range(nd)
    ]
    opad = [z.shape[2 + i] - natural[i] for i in range(nd)]
    y = opsnn.ops.run_op("ConvTranspose", [tx, tw], dict(attrs, output_padding=opad))[0]
    assert tuple(y.shape) == z.shape
    gy = RNG.standard_normal(z.shape).astype(np.float32)
    opsnn.ops.sum(opsnn.ops.mul(y, opsnn.tensor(gy))).backward()
    assert "ConvBackwardWeight" in seen and "Transpose" not in seen
    _close(tw.grad.numpy(), _oracle(gy, w, x, s, pads, d, g)[1], np.float32)
    want_dx = opsnn.ops.run_op("Conv", [opsnn.tensor(gy.astype(np.float64)), opsnn.tensor(w.astype(np.float64))], attrs)
    _close(tx.grad.numpy(), want_dx[0].numpy(), np.float32)


# -- the forward on plain tensors through oneDNN (conv_onednn_plain) ---------------------------------------
def _conv_case(name, rng=RNG):
    x, w, _, s, pads, d, g = _problem(name)
    b = rng.standard_normal(w.shape[0]).astype(np.float32)
    return x, w, b, {"strides": list(s), "pads": list(pads), "dilations": list(d), "group": g}


def _conv64(x, w, b, attrs):
    """The direct sum over valid taps in float64 (the oracle's dX loop, read forwards)."""
    s, pads, d, g = attrs["strides"], attrs["pads"], attrs["dilations"], attrs["group"]
    nd = x.ndim - 2
    x, w = x.astype(np.float64), w.astype(np.float64)
    y = np.zeros(_out_shape(x.shape, w.shape, s, pads, d)) + b.astype(np.float64).reshape((1, -1) + (1,) * nd)
    cg, mg = x.shape[1] // g, w.shape[0] // g
    for o in np.ndindex(*y.shape[2:]):
        for k in np.ndindex(*w.shape[2:]):
            i = tuple(o[j] * s[j] - pads[j] + k[j] * d[j] for j in range(nd))
            if any(v < 0 or v >= x.shape[2 + j] for j, v in enumerate(i)):
                continue
            for gi in range(g):
                cs, ms = slice(gi * cg, (gi + 1) * cg), slice(gi * mg, (gi + 1) * mg)
                y[(slice(None), ms) + o] += x[(slice(None), cs) + i] @ w[(ms, slice(None)) + k].T
    return y


def _plain_runnable(x, w, attrs) -> KL.PlainConvChoice:
    ys = _out_shape(x.shape, w.shape, attrs["strides"], attrs["pads"], attrs["dilations"])
    return KL.conv_forward_plain(
        x.shape, w.shape, ys, attrs["strides"], attrs["pads"], attrs["dilations"], attrs["group"], np.float32
    )


@pytest.mark.parametrize("name", ["2d_strided_asym_pads", "2d_dilated", "2d_wide_blocked", "2d_1x1", "3d"])
def test_conv_onednn_plain_matches_the_direct_sum(name, monkeypatch):
    """Not chosen under OPSNN_CONV_ONEDNN=0, chosen under OPSNN_CONV_ONEDNN=1."""
    x, w, b, attrs = _conv_case(name)
    c = _plain_runnable(x, w, attrs)
    if not c.runnable:
        pytest.skip(f"conv_onednn_plain does not run here: {c.reason}")
    T = opsnn.tensor
    rec = opsnn.ops.get_op("Conv")
    monkeypatch.setenv(KL.CONV_ONEDNN_ENV, "0")
    ex = opsnn.ops.prepare(rec, [T(x), T(w), T(b)], attrs)
    assert ex.kernel_name != "conv_onednn_plain"
    assert "OPSNN_CONV_ONEDNN=0" in dict(ex.rejected)["conv_onednn_plain"]
    monkeypatch.setenv(KL.CONV_ONEDNN_ENV, "1")
    for bias in (b, None):
        ins = [T(x), T(w)] + ([T(bias)] if bias is not None else [])
        ex = opsnn.ops.prepare(rec, ins, attrs)
        assert ex.kernel_name == "conv_onednn_plain", ex.reason
        want = _conv64(x, w, b if bias is not None else np.zeros_like(b), attrs)
        _close(ex.run().numpy(), want, np.float32)
        x2 = RNG.standard_normal(x.shape).astype(np.float32)  # the same executor on new data
        _close(
            ex.run(inputs=[T(x2)] + ins[1:]).numpy(),
            _conv64(x2, w, b if bias is not None else 0 * b, attrs),
            np.float32,
        )


# (X shape, W shape, strides, pads, dilations) of convolutions onto small planes (conv2d_rows)
CONV_ROWS_CASES = {
    "plane_2x2": ((4, 24, 2, 2), (256, 24, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    "strided_dilated": ((2, 16, 7, 5), (256, 16, 2, 3), (3, 2), (0, 1, 1, 0), (2, 1)),
    "plane_4x4_512": ((2, 16, 4, 4), (512, 16, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
}


@pytest.mark.parametrize("product", ["gemm", "onednn"])
@pytest.mark.parametrize("where", [None, "x", "w"])
@pytest.mark.parametrize("name", list(CONV_ROWS_CASES))
def test_conv_rows_matches_the_definition(name, where, product):
    """A 2-D one-group float32 convolution as one product (``conv2d_rows``: the windows of all images times
    W^T, into NCHW with the bias), its product on the GEMM library or on oneDNN's matmul, against the float64
    sum with the padding as zeros that the taps multiply (ONNX's definition: an Inf weight on a padding tap
    gives NaN, as opsnn's im2col kernels do); with and without a bias."""
    from opsnn.kernels.cpu import conv as KC

    if product == "onednn" and KD.unavailable() is not None:
        pytest.skip("oneDNN is unavailable")
    xs, ws, s, pads, d = CONV_ROWS_CASES[name]
    ys = _out_shape(xs, ws, s, pads, d)
    x = RNG.standard_normal(xs).astype(np.float32)
    w = RNG.standard_normal(ws).astype(np.float32)
    b = RNG.standard_normal(ws[0]).astype(np.float32)
    if where is not None:
        flat = {"x": x, "w": w}[where].reshape(-1)
        flat[flat.size // 3], flat[(2 * flat.size) // 3] = np.nan, np.inf
    plan = KC.rows_plan("forward", xs, ys, ws[2:], s, d, pads[:2])
    if product == "onednn":
        mm = KD.runtime_matmul(1, plan.positions, plan.row_len, ws[0], trans_b=True, dtype=np.float32)
        plan = dataclasses.replace(plan, matmul=mm)
    else:
        plan = dataclasses.replace(plan, matmul=None)
    xp = np.pad(x, [(0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])])
    attrs = {"strides": list(s), "pads": [0, 0, 0, 0], "dilations": list(d), "group": 1}
    for bias in (b, None):
        y = np.full(ys, 7.0, np.float32)
        KC.conv_rows(x, w, bias, y, plan, np.empty(plan.workspace_bytes, np.uint8))
        with np.errstate(invalid="ignore"):
            want = _conv64(xp, w, b if bias is not None else 0 * b, attrs)
        _ieee_close(y, want, np.float32)


@pytest.mark.parametrize("name", list(CONV_ROWS_CASES))
def test_conv_rows_is_chosen_where_the_rule_says(name):
    """Conv selects ``conv2d_rows`` exactly where ``libraries.conv_forward_by_rows`` says (AVX2, the weight at
    run time): under the ISA cap it is chosen for these planes, and it agrees with the definition."""
    xs, ws, s, pads, d = CONV_ROWS_CASES[name]
    x = RNG.standard_normal(xs).astype(np.float32)
    w = RNG.standard_normal(ws).astype(np.float32)
    attrs = {"strides": list(s), "pads": list(pads), "dilations": list(d), "group": 1}
    ys = _out_shape(xs, ws, s, pads, d)
    T = opsnn.tensor
    ex = opsnn.ops.prepare(opsnn.ops.get_op("Conv"), [T(x), T(w)], attrs)
    rows = KL.conv_forward_by_rows(xs, ws, ys, 1, np.float32, False)
    assert rows == (KL.platform().isa == "avx2")
    assert (ex.kernel_name == "conv2d_rows") == rows, ex.reason
    _close(ex.run().numpy(), _conv64(x, w, np.zeros(ws[0], np.float32), attrs), np.float32)


@pytest.mark.parametrize("fused", [False, True])
def test_conv_onednn_plain_keeps_nan_and_inf(fused, monkeypatch):
    """No post-op activation: a NaN or Inf in X reaches Y as in the direct sum, and a fused Relu (run
    by opsnn's epilogue after the primitive) keeps the NaN."""
    x, w, b, attrs = _conv_case("2d_wide_blocked")
    c = _plain_runnable(x, w, attrs)
    if not c.runnable:
        pytest.skip(f"conv_onednn_plain does not run here: {c.reason}")
    monkeypatch.setenv(KL.CONV_ONEDNN_ENV, "1")
    flat = x.reshape(-1)
    flat[flat.size // 3], flat[flat.size // 2], flat[(2 * flat.size) // 3] = np.nan, np.inf, -np.inf
    with np.errstate(invalid="ignore"):
        want = _conv64(x, w, b, attrs)
    T = opsnn.tensor
    if fused:
        ex = opsnn.ops.prepare(
            opsnn.ops.get_op("FusedConv", "opsnn"), [T(x), T(w), T(b)], dict(attrs, activation="Relu")
        )
        assert ex.plan["selection"].kernel.name == "conv_onednn_plain"
        with np.errstate(invalid="ignore"):
            want = np.where(np.isnan(want), np.nan, np.maximum(want, 0))
    else:
        ex = opsnn.ops.prepare(opsnn.ops.get_op("Conv"), [T(x), T(w), T(b)], attrs)
        assert ex.kernel_name == "conv_onednn_plain"
    got = ex.run().numpy()
    assert np.isnan(want).any() and np.isinf(want).any()
    for fn in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(fn(got), fn(want))
    ok = np.isfinite(want)
    _close(got[ok], want[ok], np.float32)


def test_explain_names_the_library_of_each_gradient():
    """``opsnn explain``'s kernel-library section: a gradient node's library is libraries.conv_backward's."""
    from opsnn.tools import explain

    x, w, dy, s, pads, d, g = _problem("2d_wide_blocked")
    T = opsnn.tensor
    kw = {"stride": s, "padding": pads, "dilation": d, "groups": g}
    for op, ex in (
        ("ConvBackwardData", opsnn.aclnn.conv_backward_data.prepare(T(dy), T(w), x.shape, **kw)),
        ("ConvBackwardWeight", opsnn.aclnn.conv_backward_weight.prepare(T(x), T(dy), w.shape, **kw)),
    ):
        label, choice = explain._product(op, ex, ex.plan, ex.kernel_name)
        kind = "data" if op == "ConvBackwardData" else "weights"
        want = KL.conv_backward(kind, x.shape, w.shape, dy.shape, s, pads, d, g, np.float32)
        assert choice.library == want.library and choice.reason == want.reason and choice.kernel == ex.kernel_name
        assert ex.kernel_name.endswith("_onednn") == (want.library == "onednn")
        assert label.startswith("2x48x8x7 -> d")


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_gradient_rule_resolves_auto_pad(auto_pad):
    """The rule hands the records explicit pads: auto_pad's, as the forward resolved them."""
    from opsnn.ops.defs.conv import conv_geometry

    x = RNG.standard_normal((2, 8, 9, 8)).astype(np.float32)
    w = RNG.standard_normal((16, 8, 4, 3)).astype(np.float32)
    attrs = {"auto_pad": auto_pad, "strides": [2, 1]}
    tx, tw = opsnn.tensor(x).requires_grad_(), opsnn.tensor(w).requires_grad_()
    y = opsnn.ops.run_op("Conv", [tx, tw], attrs)[0]
    dy = RNG.standard_normal(tuple(y.shape)).astype(np.float32)
    opsnn.ops.sum(opsnn.ops.mul(y, opsnn.tensor(dy))).backward()
    geo = conv_geometry("Conv", x.shape, w.shape, attrs)
    want_dx, want_dw = _oracle(x, w, dy, (2, 1), geo.pb + geo.pe, (1, 1), 1)
    _close(tx.grad.numpy(), want_dx, np.float32)
    _close(tw.grad.numpy(), want_dw, np.float32)


def test_torch_compile_backward_of_a_grouped_dilated_conv_runs_on_the_records():
    """torch.compile(backend=opsnn) lowers aten.convolution_backward to the gradient records: a
    grouped, dilated, strided convolution's three gradients run in the opsnn backward graph (the
    grouped weight gradient used to stay in torch) and match torch eager."""
    torch = pytest.importorskip("torch")
    import copy

    from opsnn.frontends import torch as fe

    reports = []

    def backend(gm, example_inputs):
        fn, report = fe.compile_graph(gm, example_inputs)
        reports.append(report)
        return fn

    torch.manual_seed(0)
    model = torch.nn.Conv2d(4, 6, 3, stride=2, padding=2, dilation=2, groups=2)
    ref = copy.deepcopy(model)
    x = torch.randn(2, 4, 11, 10, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    compiled = torch.compile(model, backend=backend, dynamic=False)
    compiled(x).square().sum().backward()
    ref(xr).square().sum().backward()
    for got, want in ((x.grad, xr.grad), (model.weight.grad, ref.weight.grad), (model.bias.grad, ref.bias.grad)):
        want = want.numpy().astype(np.float64)
        _close(got.numpy(), want, np.float32)
    bw = [r for r in reports if any(name.startswith("backward") for name in r.runs)]
    assert bw and not any("convolution_backward" in t for r in bw for _, t, _ in r.fallbacks)
    ops_run = {op for r in bw for name, ops, _ in r.partitions if name.startswith("backward.") for op in ops}
    assert "aten.convolution_backward.default" in ops_run, ops_run


@pytest.mark.parametrize("case", ["1x1 strided", "7x7 stride 2", "3x3 stride 1, 64 channels"])
def test_plain_onednn_is_the_default_for_runtime_weights(case, monkeypatch):
    """Unset OPSNN_CONV_ONEDNN: oneDNN's plain forward is preferred wherever it has JIT code and the
    weight arrives at run time (Winograd's 3x3 shapes included); a constant weight stays on opsnn's
    packed kernels."""
    monkeypatch.delenv(KL.CONV_ONEDNN_ENV, raising=False)
    shapes = {
        "1x1 strided": ((8, 64, 16, 16), (128, 64, 1, 1), 2, 0),
        "7x7 stride 2": ((4, 3, 32, 32), (64, 3, 7, 7), 2, 3),
        "3x3 stride 1, 64 channels": ((8, 64, 16, 16), (64, 64, 3, 3), 1, 1),
    }
    xs, ws, s, p = shapes[case]
    x = RNG.standard_normal(xs).astype(np.float32)
    w = RNG.standard_normal(ws).astype(np.float32)
    attrs = {"strides": [s, s], "pads": [p] * 4, "dilations": [1, 1], "group": 1}
    c = _plain_runnable(x, w, attrs)
    if not c.runnable:
        pytest.skip(f"conv_onednn_plain does not run here: {c.reason}")
    ex = opsnn.ops.prepare(opsnn.ops.get_op("Conv"), [opsnn.tensor(x), opsnn.tensor(w)], attrs)
    assert ex.kernel_name == "conv_onednn_plain", ex.reason
    _close(ex.run().numpy(), _conv64(x, w, np.zeros(ws[0], np.float32), attrs), np.float32)
    ys = _out_shape(x.shape, w.shape, attrs["strides"], attrs["pads"], attrs["dilations"])
    const = KL.conv_forward_plain(
        x.shape, w.shape, ys, attrs["strides"], attrs["pads"], attrs["dilations"], 1, np.float32, constant_weight=True
    )
    assert const.runnable and not const.preferred and "constant weight" in const.reason


# (X shape, W shape, strides, pads, dilations): weight gradients of small or strided output planes
ROWS_CASES = {
    "plane_2x2": ((4, 32, 2, 2), (256, 32, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    "strided_16ch": ((2, 16, 9, 9), (256, 16, 3, 3), (2, 2), (1, 0, 2, 1), (1, 1)),
    "strided_dilated": ((3, 20, 11, 10), (256, 20, 2, 3), (3, 2), (0, 2, 1, 0), (2, 1)),
    "plane_4x4": ((2, 24, 4, 4), (256, 24, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
}


@pytest.mark.parametrize("name", list(ROWS_CASES))
@pytest.mark.parametrize("where", [None, "x", "dy"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_weight_gradient_of_small_planes_as_one_matmul(name, where, dtype):
    """A 2-D one-group weight gradient of a small or strided output plane with 256+ output channels is dY^T
    times the windows of all images in one product where the strategy says so (``weight_gradient_by_rows``:
    bfloat16 natively on oneDNN, float32 on oneDNN's brgemm matmul or the GEMM library,
    ``conv_rows_product``), else oneDNN's backward-weights primitive; either way against the oracle on the
    same values. A
    NaN or Inf in X or dY reaches the entries the definition takes it to (the windows hold the padding as
    zeros, which a non-finite dY multiplies, as opsnn's im2col kernel does)."""
    dt = _dt.bfloat16 if dtype == "bfloat16" else np.float32
    xs, ws, s, pads, d = ROWS_CASES[name]
    x = RNG.standard_normal(xs).astype(dt)
    dy = RNG.standard_normal(_out_shape(xs, ws, s, pads, d)).astype(dt)
    if where is not None:
        flat = {"x": x, "dy": dy}[where].reshape(-1)
        flat[flat.size // 3] = np.nan
        flat[(2 * flat.size) // 3] = np.inf
    T = opsnn.tensor
    ex = opsnn.aclnn.conv_backward_weight.prepare(T(x), T(dy), ws, stride=s, padding=pads, dilation=d, groups=1)
    rows = KL.weight_gradient_by_rows(xs, ws, dy.shape, s, 1, dt)
    assert (ex.kernel_name == "conv_backward_weight_matmul") == rows, ex.reason
    if dt == np.float32:  # planes of <= 16 positions on every level, the strided ones from AVX-512 on
        wide = cpu.LEVELS.index(KL.platform().isa) >= cpu.LEVELS.index("avx512")
        nhwc = KL.plain_conv_formats("weights", xs, ws, dy.shape, s, d, 1, dt) == "nhwc"  # that primitive there
        assert rows == ((name.startswith("plane") or wide) and not nhwc), ex.reason
    elif name != "plane_4x4" and KL.runtime_bf16_product() is None:
        assert rows  # native bfloat16: always this kernel for the <= 4-position or strided planes
    got = ex.run().numpy()
    assert got.dtype == dt and got.shape == ws
    w = np.zeros(ws, np.float32)
    # the windows, opsnn's im2col kernel and oneDNN's own im2col (gemm) code multiply the padding's zeros
    padded = rows or ex.kernel_name == "conv_backward_weight_im2col" or "gemm" in getattr(ex.plan, "impl", "")
    with np.errstate(invalid="ignore"):
        want = _oracle_padded(x, w, dy, s, pads, d, 1) if padded else _oracle(x, w, dy, s, pads, d, 1)[1]
    _ieee_close(got, want, dt, signs=True)
    if rows:
        positions, row = math.prod(dy.shape[:1] + dy.shape[2:]), math.prod(ws[1:])
        c = KL.kernel_choice("conv_backward_weight_matmul", ws[0], positions, row, dt)
        assert c == KL.conv_rows_product("weights", ws[0], positions, row, dt)
        assert (c.library == "onednn") == (ex.plan.matmul is not None), (c, ex.plan.describe())


# (X shape, W shape, strides, pads, dilations): data gradients onto small output planes
DATA_ROWS_CASES = {
    "plane_2x2": ((4, 24, 2, 2), (256, 24, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    "strided_to_2x2": ((3, 20, 4, 4), (256, 20, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    "strided_dilated": ((2, 16, 7, 5), (256, 16, 2, 3), (3, 2), (0, 1, 1, 0), (2, 1)),
    "plane_4x4_512": ((2, 16, 4, 4), (512, 16, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
}


@pytest.mark.parametrize("name", list(DATA_ROWS_CASES))
@pytest.mark.parametrize("where", [None, "w", "dy"])
def test_data_gradient_of_small_planes_as_one_matmul(name, where):
    """A 2-D one-group float32 data gradient onto a plane of <= 4 positions (under AVX2 <= 16 from 512 output
    channels) with 256+ output channels is dY as rows times W in one product, each row added back at its
    window (``data_gradient_by_rows``, ``conv_rows_product``); against the definition on the same values, a
    NaN or Inf in W or dY reaching the input positions the definition takes it to (taps that read padding
    add nothing, as in oneDNN's and the oracle's sums)."""
    xs, ws, s, pads, d = DATA_ROWS_CASES[name]
    ys = _out_shape(xs, ws, s, pads, d)
    x = np.zeros(xs, np.float32)
    w = RNG.standard_normal(ws).astype(np.float32)
    dy = RNG.standard_normal(ys).astype(np.float32)
    if where is not None:
        flat = {"w": w, "dy": dy}[where].reshape(-1)
        flat[flat.size // 3] = np.nan
        flat[(2 * flat.size) // 3] = np.inf
    T = opsnn.tensor
    ex = opsnn.aclnn.conv_backward_data.prepare(T(dy), T(w), xs, stride=s, padding=pads, dilation=d, groups=1)
    rows = KL.data_gradient_by_rows(xs, ws, ys, 1, np.float32)
    assert (ex.kernel_name == "conv_backward_data_matmul") == rows, ex.reason
    if name != "plane_4x4_512" or KL.platform().isa == "avx2":
        assert rows
    got = ex.run().numpy()
    with np.errstate(invalid="ignore"):
        want = _oracle(x, w, dy, s, pads, d, 1)[0]
    _ieee_close(got, want, np.float32, signs=True)
    if rows:
        positions = math.prod(ys[:1] + ys[2:])
        c = KL.kernel_choice("conv_backward_data_matmul", positions, ws[0], math.prod(ws[1:]), np.float32)
        assert c == KL.conv_rows_product("data", positions, ws[0], math.prod(ws[1:]), np.float32)
        assert (c.library == "onednn") == (ex.plan.matmul is not None), (c, ex.plan.describe())


def test_narrow_or_grouped_small_planes_keep_the_primitive():
    # fewer than 256 output channels, or two groups: oneDNN's backward-weights primitive (widened for bf16)
    xs, s, pads, d = (4, 32, 2, 2), (1, 1), (1, 1, 1, 1), (1, 1)
    for ws, g in (((128, 32, 3, 3), 1), ((256, 16, 3, 3), 2)):
        ys = _out_shape(xs, ws, s, pads, d)
        for dt in (np.float32, _dt.bfloat16):
            assert not KL.weight_gradient_by_rows(xs, ws, ys, s, g, dt)
            assert KL.conv_backward("weights", xs, ws, ys, s, pads, d, g, dt).kernel != "conv_backward_weight_matmul"
            assert not KL.data_gradient_by_rows(xs, ws, ys, g, dt)
            assert KL.conv_backward("data", xs, ws, ys, s, pads, d, g, dt).kernel != "conv_backward_data_matmul"
