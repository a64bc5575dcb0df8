"""Gradient rules of the vision / linear-algebra ops: Det (cofactors through Det of the minors) and
GridSample (the dedicated opsnn::GridSampleGrad record: dX scatter-added through the taps, dGrid from
the weights' slopes).

Oracles: float64 central finite differences of the forward ops (eps 1e-6; rtol 1e-5, atol 1e-7: the
difference quotient's truncation and rounding error), numpy.linalg (det * inv^T) for Det, and
torch.autograd where torch is importable (float64, to 1e-10). Grid points are drawn away from pixel
centres so no finite difference straddles a kink of the piecewise polynomial weights.
"""

from __future__ import annotations

import numpy as np
import pytest

import opsnn
from opsnn import autograd, ops
from opsnn.errors import InferShapeError, OpsnnError

RNG = np.random.default_rng(3131)


def _grads(fn, arrays, wrt, weight):
    ts = [opsnn.tensor(a) for a in arrays]
    for i in wrt:
        ts[i].requires_grad_()
    loss = ops.sum(ops.mul(fn(*ts), opsnn.tensor(weight)))
    return [g.numpy().copy() for g in autograd.grad(loss, [ts[i] for i in wrt])]


def _numeric(fn, arrays, i, weight, eps=1e-6):
    base = [a.copy() for a in arrays]
    out = np.zeros_like(base[i])
    flat = base[i].reshape(-1)
    with opsnn.no_grad():
        for k in range(flat.size):
            old = flat[k]
            vals = []
            for v in (old + eps, old - eps):
                flat[k] = v
                vals.append(np.sum(fn(*[opsnn.tensor(a) for a in base]).numpy() * weight))
            flat[k] = old
            out.reshape(-1)[k] = (vals[0] - vals[1]) / (2 * eps)
    return out


def _out_shape(fn, arrays):
    with opsnn.no_grad():
        return tuple(fn(*[opsnn.tensor(a) for a in arrays]).shape)


# == Det ===============================================================================================
@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (1, 1), (2, 1, 1), (3, 2, 5, 5)])
def test_det_gradient_matches_cofactors_and_finite_differences(shape):
    x = RNG.standard_normal(shape)
    w = RNG.uniform(0.5, 1.5, shape[:-2])
    (g,) = _grads(ops.det, [x], [0], w)
    want = (np.linalg.det(x) * w)[..., None, None] * np.linalg.inv(x).swapaxes(-1, -2)
    np.testing.assert_allclose(g, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g, _numeric(ops.det, [x], 0, w), rtol=1e-5, atol=1e-7)


def test_det_gradient_of_singular_matrix_is_the_adjugate():
    x = np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.5, -1.0, 2.0]])  # rank 2: no inverse
    (g,) = _grads(ops.det, [x], [0], np.array(1.0))
    np.testing.assert_allclose(g, _numeric(ops.det, [x], 0, np.array(1.0)), rtol=1e-6, atol=1e-7)
    assert np.abs(g).max() > 1  # the adjugate of a rank-2 3x3 matrix is not zero


def test_det_gradient_matches_torch():
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal((2, 3, 4, 4))
    w = RNG.uniform(0.5, 1.5, (2, 3))
    (g,) = _grads(ops.det, [x], [0], w)
    tx = torch.tensor(x, requires_grad=True)
    (tg,) = torch.autograd.grad((torch.linalg.det(tx) * torch.tensor(w)).sum(), [tx])
    np.testing.assert_allclose(g, tg.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.filterwarnings("ignore:invalid value encountered in det")
def test_det_gradient_float32_and_nan():
    x = RNG.standard_normal((2, 3, 3)).astype(np.float32)
    (g,) = _grads(ops.det, [x], [0], np.ones(2, np.float32))
    assert g.dtype == np.float32
    want = np.linalg.det(x.astype(np.float64))[..., None, None] * np.linalg.inv(x.astype(np.float64)).swapaxes(-1, -2)
    np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-5)
    x = RNG.standard_normal((3, 3))
    x[0, 0] = np.nan
    (g,) = _grads(ops.det, [x], [0], np.array(1.0))
    assert np.isfinite(g[0, 0])  # the (0, 0) cofactor does not read x[0, 0]
    assert np.isnan(g[1:, 1:]).all()


# == GridSample ========================================================================================
def _grid(shape, size_of_dims, align):
    """Normalised coordinates in [-1.25, 1.25] whose pixel positions keep >= 0.02 from an integer
    or half-integer (no tap or rounding kink within a finite-difference step)."""
    g = RNG.uniform(-1.25, 1.25, shape)
    r = shape[-1]
    for k in range(r):
        size = size_of_dims[r - 1 - k]
        pix = (g[..., k] + 1) / 2 * (size - 1) if align else ((g[..., k] + 1) * size - 1) / 2
        frac = pix * 2 - np.floor(pix * 2)
        pix = np.floor(pix * 2) / 2 + 0.04 + 0.42 * frac
        g[..., k] = pix * 2 / (size - 1) - 1 if align else (2 * pix + 1) / size - 1
    return g


GS_CASES = [
    (mode, pad, align)
    for mode in ("bilinear", "nearest", "bicubic")
    for pad in ("zeros", "border", "reflection")
    for align in (False, True)
]


def _gs(mode, pad, align):
    return lambda x, g: ops.grid_sample(x, g, mode=mode, padding_mode=pad, align_corners=align)


@pytest.mark.parametrize("mode,pad,align", GS_CASES)
def test_grid_sample_gradients_match_finite_differences_2d(mode, pad, align):
    x = RNG.standard_normal((2, 3, 5, 4))
    grid = _grid((2, 3, 2, 2), (5, 4), align)
    fn = _gs(mode, pad, align)
    w = RNG.uniform(0.5, 1.5, _out_shape(fn, [x, grid]))
    dx, dg = _grads(fn, [x, grid], [0, 1], w)
    np.testing.assert_allclose(dx, _numeric(fn, [x, grid], 0, w), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dg, _numeric(fn, [x, grid], 1, w), rtol=1e-5, atol=1e-7)
    if mode == "nearest":
        assert not dg.any()


@pytest.mark.parametrize("mode,pad,align", [("bilinear", "zeros", False), ("bicubic", "reflection", True)])
@pytest.mark.parametrize("xs,gs", [((1, 2, 7), (1, 5, 1)), ((1, 2, 3, 4, 3), (1, 2, 2, 1, 3))])
def test_grid_sample_gradients_1d_and_3d(mode, pad, align, xs, gs):
    x = RNG.standard_normal(xs)
    grid = _grid(gs, xs[2:], align)
    fn = _gs(mode, pad, align)
    w = RNG.uniform(0.5, 1.5, _out_shape(fn, [x, grid]))
    dx, dg = _grads(fn, [x, grid], [0, 1], w)
    np.testing.assert_allclose(dx, _numeric(fn, [x, grid], 0, w), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dg, _numeric(fn, [x, grid], 1, w), rtol=1e-5, atol=1e-7)


# torch's bicubic 'border' clamps each tap's index, ONNX (and opsnn) clamp the coordinate: forwards differ
@pytest.mark.parametrize("mode,pad,align", [c for c in GS_CASES if c[:2] != ("bicubic", "border")])
def test_grid_sample_gradients_match_torch(mode, pad, align):
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal((2, 3, 6, 5))
    grid = RNG.uniform(-1.3, 1.3, (2, 4, 3, 2))
    fn = _gs(mode, pad, align)
    w = RNG.uniform(0.5, 1.5, _out_shape(fn, [x, grid]))
    dx, dg = _grads(fn, [x, grid], [0, 1], w)
    tx, tg = torch.tensor(x, requires_grad=True), torch.tensor(grid, requires_grad=True)
    ty = torch.nn.functional.grid_sample(tx, tg, mode=mode, padding_mode=pad, align_corners=align)
    tdx, tdg = torch.autograd.grad((ty * torch.tensor(w)).sum(), [tx, tg])
    np.testing.assert_allclose(dx, tdx.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dg, tdg.numpy(), rtol=1e-10, atol=1e-12)


def test_grid_sample_grad_record_float32_two_phase_and_nan():
    x = RNG.standard_normal((1, 2, 4, 5)).astype(np.float32)
    grid = RNG.uniform(-1, 1, (1, 3, 3, 2)).astype(np.float32)
    grid[0, 1, 1, 0] = np.nan
    dy = RNG.standard_normal((1, 2, 3, 3)).astype(np.float32)
    ex = opsnn.aclnn.grid_sample_grad.prepare(dy, x, grid, mode="bicubic", padding_mode="border")
    dx, dg = (t.numpy() for t in ex.run())
    assert dx.dtype == np.float32 and dg.dtype == np.float32
    # oracle: float64 finite differences with the NaN point's dY zeroed (it reaches neither gradient)
    dy0 = dy.astype(np.float64)
    dy0[0, :, 1, 1] = 0
    g64 = np.nan_to_num(grid.astype(np.float64))
    fn = _gs("bicubic", "border", False)
    np.testing.assert_allclose(dx, _numeric(fn, [x.astype(np.float64), g64], 0, dy0), rtol=1e-4, atol=1e-5)
    want = _numeric(fn, [x.astype(np.float64), g64], 1, dy0)
    assert np.isnan(dg[0, 1, 1]).all()
    ok = np.ones(dg.shape, bool)
    ok[0, 1, 1] = False
    np.testing.assert_allclose(dg[ok], want[ok], rtol=1e-4, atol=1e-5)


def test_grid_sample_grad_bad_input_typed_errors():
    x = np.zeros((1, 2, 4, 4), np.float32)
    grid = np.zeros((1, 3, 3, 2), np.float32)
    with pytest.raises(InferShapeError, match="dY"):
        ops.grid_sample_grad(np.zeros((1, 2, 3, 4), np.float32), x, grid)
    with pytest.raises(InferShapeError, match="dtype"):
        ops.grid_sample_grad(np.zeros((1, 2, 3, 3), np.float64), x, grid)
    with pytest.raises(OpsnnError, match="padding_mode"):
        ops.grid_sample_grad(np.zeros((1, 2, 3, 3), np.float32), x, grid, padding_mode="wrap")


def test_grid_sample_integer_input_has_no_gradient():
    from opsnn.ops.gradients import GradContext, _grid_sample

    x = opsnn.tensor(np.arange(16, dtype=np.int64).reshape(1, 1, 4, 4))
    grid = opsnn.tensor(RNG.uniform(-1, 1, (1, 2, 2, 2)))
    attrs = {"mode": "nearest", "padding_mode": "zeros", "align_corners": 0}
    y = ops.grid_sample(x, grid, mode="nearest")
    ctx = GradContext("GridSample", [x, grid], [y], attrs, [False, True])
    assert _grid_sample(ctx, [opsnn.tensor(np.ones(y.shape))]) == [None, None]


# == RoiAlign ==========================================================================================
def _rois(k, h, w):
    """Boxes [x1, y1, x2, y2] inside and around an (h, w) map, some wider than a bin, one past the edge."""
    x1 = RNG.uniform(-1.5, w - 2, k)
    y1 = RNG.uniform(-1.5, h - 2, k)
    return np.stack([x1, y1, x1 + RNG.uniform(0.5, w, k), y1 + RNG.uniform(0.5, h, k)], axis=1)


def _ra(size, ratio, aligned, mode, scale=1.0):
    return lambda x, r, b: ops.roi_align(
        x, r, b, size, spatial_scale=scale, sampling_ratio=ratio, aligned=aligned, mode=mode
    )


RA_CASES = [
    ((2, 3), 2, False, "avg", 1.0),
    ((3, 2), 0, True, "avg", 0.5),
    ((1, 1), 3, True, "avg", 1.0),
    ((2, 2), 2, False, "max", 1.0),
    ((3, 3), 0, True, "max", 0.75),
]


@pytest.mark.parametrize("size,ratio,aligned,mode,scale", RA_CASES)
def test_roi_align_input_gradient_matches_finite_differences_and_reference(size, ratio, aligned, mode, scale):
    x = RNG.standard_normal((2, 3, 7, 6))
    rois = _rois(5, 7 / scale, 6 / scale)
    bidx = np.array([0, 1, 1, 0, 1], np.int64)
    fn = _ra(size, ratio, aligned, mode, scale)
    w = RNG.uniform(0.5, 1.5, _out_shape(fn, [x, rois, bidx]))
    (dx,) = _grads(fn, [x, rois, bidx], [0], w)
    np.testing.assert_allclose(dx, _numeric(fn, [x, rois, bidx], 0, w), rtol=1e-5, atol=1e-7)
    from opsnn.ops.registry import get_op

    ex = opsnn.aclnn.roi_align_backward.prepare(w, x, rois, bidx, size, scale, ratio, aligned, mode)
    ref = get_op("RoiAlignGrad", "opsnn").reference([w, x, rois, bidx], ex.attrs)
    np.testing.assert_allclose(ex.run().numpy(), ref, rtol=1e-12, atol=1e-13)


def test_roi_align_grad_float32_and_nan():
    x = RNG.standard_normal((1, 4, 5, 5)).astype(np.float32)
    rois = np.array([[0.3, 0.6, 3.7, 4.1], [1.2, 0.2, 2.9, 2.2]], np.float32)
    bidx = np.zeros(2, np.int64)
    dy = RNG.standard_normal((2, 4, 2, 2)).astype(np.float32)
    dy[1, 2, 0, 1] = np.nan
    dx = ops.roi_align_backward(dy, x, rois, bidx, 2, sampling_ratio=2).numpy()
    assert dx.dtype == np.float32
    fn = _ra(2, 2, False, "avg")
    clean = np.nan_to_num(dy.astype(np.float64))
    want = _numeric(fn, [x.astype(np.float64), rois.astype(np.float64), bidx], 0, clean)
    nan = np.isnan(dx)
    assert nan[0, 2].any() and not nan[:, [0, 1, 3]].any()  # the NaN reaches only its channel's taps
    dy[1, 2, 0, 1] = 0
    dx0 = ops.roi_align_backward(dy, x, rois, bidx, 2, sampling_ratio=2).numpy()
    np.testing.assert_allclose(dx0, want, rtol=1e-4, atol=1e-5)


def test_roi_align_grad_bad_input_typed_errors():
    x = np.zeros((1, 2, 4, 4), np.float32)
    rois = np.array([[0, 0, 2, 2]], np.float32)
    with pytest.raises(InferShapeError, match="dY"):
        ops.roi_align_backward(np.zeros((1, 2, 3, 3), np.float32), x, rois, np.zeros(1, np.int64), 2)
    with pytest.raises(OpsnnError, match="batch index"):
        ops.roi_align_backward(np.zeros((1, 2, 2, 2), np.float32), x, rois, np.array([3]), 2)


# == DeformConv ========================================================================================
def _offsets(shape):
    """Offsets whose sampling positions keep >= 0.05 from an integer (no corner switch within a step)."""
    o = RNG.uniform(-1.6, 1.6, shape)
    return np.floor(o) + 0.05 + 0.9 * (o - np.floor(o))


DC_CASES = [
    # x shape, w shape, stride, pad, dilation, offset groups, with mask, with bias
    ((1, 2, 5, 4), (3, 2, 2, 2), 1, 0, 1, 1, False, True),
    ((2, 4, 5, 5), (4, 2, 3, 3), 2, 1, 1, 2, True, True),
    ((1, 6, 4, 5), (3, 2, 2, 3), 1, 1, 2, 3, True, False),
]


@pytest.mark.parametrize("xs,ws,stride,pad,dil,og,with_mask,with_bias", DC_CASES)
def test_deform_conv_gradients_match_finite_differences(xs, ws, stride, pad, dil, og, with_mask, with_bias):
    x = RNG.standard_normal(xs)
    w = RNG.standard_normal(ws)
    kh, kw = ws[2:]
    oh = (xs[2] + 2 * pad - dil * (kh - 1) - 1) // stride + 1
    ow = (xs[3] + 2 * pad - dil * (kw - 1) - 1) // stride + 1
    off = _offsets((xs[0], og * kh * kw * 2, oh, ow))
    mask = RNG.uniform(0.2, 1.2, (xs[0], og * kh * kw, oh, ow)) if with_mask else None
    b = RNG.standard_normal(ws[0]) if with_bias else None
    arrays = [x, off, w] + ([b] if with_bias else []) + ([mask] if with_mask else [])

    def fn(*a):
        a = list(a)
        x_, o_, w_ = a[:3]
        b_ = a[3] if with_bias else None
        m_ = a[-1] if with_mask else None
        return ops.deform_conv2d(x_, o_, w_, b_, stride=stride, padding=pad, dilation=dil, mask=m_)

    wt = RNG.uniform(0.5, 1.5, _out_shape(fn, arrays))
    wrt = list(range(len(arrays)))
    grads = _grads(fn, arrays, wrt, wt)
    for i, g in zip(wrt, grads):
        np.testing.assert_allclose(g, _numeric(fn, arrays, i, wt), rtol=1e-5, atol=1e-7, err_msg=f"input {i}")


def test_deform_conv_grad_record_two_phase_float32_nan_and_unmasked():
    x = RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)
    w = RNG.standard_normal((2, 2, 2, 2)).astype(np.float32)
    off = _offsets((1, 8, 3, 3)).astype(np.float32)
    dy = RNG.standard_normal((1, 2, 3, 3)).astype(np.float32)
    ex = opsnn.aclnn.deform_conv2d_backward.prepare(dy, x, off, w)
    dx, dw, doff, dmask = (t.numpy() for t in ex.run())
    assert dx.dtype == np.float32 and dmask.shape == (1, 4, 3, 3)
    args64 = [x.astype(np.float64), off.astype(np.float64), w.astype(np.float64)]
    fn = lambda x_, o_, w_: ops.deform_conv2d(x_, o_, w_)  # noqa: E731
    for got, i in ((dx, 0), (doff, 1), (dw, 2)):
        np.testing.assert_allclose(got, _numeric(fn, args64, i, dy.astype(np.float64)), rtol=1e-4, atol=1e-4)
    # dMask without a mask is the gradient of an all-ones mask
    ones = np.ones((1, 4, 3, 3))
    fm = lambda x_, o_, w_, m_: ops.deform_conv2d(x_, o_, w_, mask=m_)  # noqa: E731
    np.testing.assert_allclose(dmask, _numeric(fm, args64 + [ones], 3, dy.astype(np.float64)), rtol=1e-4, atol=1e-4)
    off[0, 3, 1, 2] = np.nan  # tap 1's x offset of output (1, 2)
    dx, dw, doff, dmask = (t.numpy() for t in opsnn.aclnn.deform_conv2d_backward.prepare(dy, x, off, w).run())
    assert np.isfinite(dx).all() and np.isnan(dw).any()
    assert np.isnan(doff[0, 2:4, 1, 2]).all() and np.isnan(dmask[0, 1, 1, 2])
    assert np.isfinite(np.delete(doff.reshape(8, -1), 5, axis=1)).all()


def test_deform_conv_grad_bad_input_typed_errors():
    x = np.zeros((1, 2, 4, 4), np.float32)
    w = np.zeros((2, 2, 2, 2), np.float32)
    off = np.zeros((1, 8, 3, 3), np.float32)
    with pytest.raises(InferShapeError, match="dY"):
        ops.deform_conv2d_backward(np.zeros((1, 2, 4, 4), np.float32), x, off, w)
    with pytest.raises(InferShapeError, match="offset"):
        ops.deform_conv2d_backward(np.zeros((1, 2, 3, 3), np.float32), x, off[:, :, :2], w)


# == NegativeLogLikelihoodLoss: the NLLLossGrad record ==============================================
def _nll_composition(x, t, w, reduction, ignore, g):
    """The rule before NLLLossGrad: -onehot * coefficients, as separate registry ops."""
    from opsnn.ops.gradients import GradContext, _class_coefficients

    attrs = {"reduction": reduction} if ignore is None else {"reduction": reduction, "ignore_index": ignore}
    ins = [opsnn.tensor(x), opsnn.tensor(t)] + ([opsnn.tensor(w)] if w is not None else [])
    onehot, coef = _class_coefficients(GradContext("NegativeLogLikelihoodLoss", ins, [], attrs, []), opsnn.tensor(g))
    return ops.neg(ops.mul(onehot, coef)).numpy()


def _nll_oracle(x, t, w, reduction, ignore, g):
    """float64, one position at a time."""
    N, C = x.shape[:2]
    ts = t.reshape(N, -1)
    gs = np.broadcast_to(np.asarray(g, np.float64).reshape(-1) if reduction == "none" else np.float64(g), ts.size)
    out = np.zeros((N, C, ts.shape[1]))
    wt = np.zeros(ts.shape)
    for n in range(N):
        for d in range(ts.shape[1]):
            c = int(ts[n, d])
            if ignore is not None and c == ignore:
                continue
            wt[n, d] = 1.0 if w is None else float(w[c])
            out[n, c, d] = -wt[n, d] * gs[n * ts.shape[1] + d]
    if reduction == "mean":
        out /= wt.sum()
    return out.reshape(x.shape)


@pytest.mark.parametrize("xs,ts", [((7, 5), (7,)), ((3, 4, 6), (3, 6)), ((2, 3, 4, 5), (2, 4, 5))])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted,ignore", [(False, None), (True, None), (False, 1), (True, -100)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nll_loss_grad_matches_composition_and_oracle(xs, ts, reduction, weighted, ignore, dtype):
    x = RNG.standard_normal(xs).astype(dtype)
    t = RNG.integers(0, xs[1], ts).astype(np.int64)
    if ignore is not None:
        t.reshape(-1)[::3] = ignore
    w = RNG.random(xs[1]).astype(dtype) if weighted else None
    g = (RNG.standard_normal(ts) if reduction == "none" else np.asarray(RNG.uniform(0.5, 2))).astype(dtype)
    got = opsnn.aclnn.nll_loss_grad.prepare(g, x, t, w, reduction=reduction, ignore_index=ignore).run().numpy()
    assert got.dtype == dtype
    tol = dict(rtol=1e-6, atol=1e-7) if dtype == np.float32 else dict(rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(got, _nll_oracle(x, t, w, reduction, ignore, g), **tol)
    np.testing.assert_allclose(got, _nll_composition(x, t, w, reduction, ignore, g), **tol)


def test_nll_loss_rule_matches_torch_and_finite_differences():
    x = RNG.standard_normal((4, 3, 5))
    t = RNG.integers(0, 3, (4, 5))
    t[0, 1] = -100
    w = RNG.uniform(0.5, 1.5, 3)
    fn = lambda x_: ops.nll_loss(x_, t, opsnn.tensor(w))  # noqa: E731
    (g,) = _grads(fn, [x], [0], np.array(1.0))
    np.testing.assert_allclose(g, _numeric(fn, [x], 0, np.array(1.0)), rtol=1e-6, atol=1e-9)
    torch = pytest.importorskip("torch")
    tx = torch.tensor(x, requires_grad=True)
    (tg,) = torch.autograd.grad(torch.nn.functional.nll_loss(tx, torch.tensor(t), torch.tensor(w)), [tx])
    np.testing.assert_allclose(g, tg.numpy(), rtol=1e-12, atol=1e-14)


def test_nll_loss_grad_nan_and_bad_input():
    x = np.zeros((2, 3), np.float32)
    g = np.array([np.nan, 1.0], np.float32)
    got = ops.nll_loss_grad(g, x, np.array([2, 0]), reduction="none").numpy()
    assert np.isnan(got[0, 2]) and not np.isnan(np.delete(got.reshape(-1), 2)).any()
    with pytest.raises(OpsnnError, match="target"):
        ops.nll_loss_grad(np.float32(1), x, np.array([3, 0]))
    with pytest.raises(InferShapeError, match="dLoss"):
        ops.nll_loss_grad(np.zeros(3, np.float32), x, np.array([1, 0]), reduction="none")


# == TensorScatter =====================================================================================
@pytest.mark.parametrize(
    "ps,us,axis,mode,wi",
    [
        ((2, 3, 6, 4), (2, 3, 2, 4), -2, "linear", [1, 4]),
        ((2, 5, 3), (2, 4, 3), 1, "circular", [3, 0]),
        ((3, 4), (3, 4), 1, "circular", [2, 0, 1]),
        ((2, 2, 5), (2, 2, 3), 2, "linear", None),
    ],
)
def test_tensor_scatter_gradients_match_finite_differences(ps, us, axis, mode, wi):
    past, upd = RNG.standard_normal(ps), RNG.standard_normal(us)
    idx = None if wi is None else np.array(wi, np.int64)
    fn = lambda p_, u_: ops.tensor_scatter(p_, u_, idx, mode=mode, axis=axis)  # noqa: E731
    w = RNG.uniform(0.5, 1.5, ps)
    dp, du = _grads(fn, [past, upd], [0, 1], w)
    np.testing.assert_allclose(dp, _numeric(fn, [past, upd], 0, w), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(du, _numeric(fn, [past, upd], 1, w), rtol=1e-6, atol=1e-9)


# == MaxRoiPool ========================================================================================
@pytest.mark.parametrize("size,scale", [((2, 2), 1.0), ((3, 2), 0.5), ((1, 1), 1.0)])
def test_max_roi_pool_input_gradient_matches_finite_differences_and_reference(size, scale):
    x = RNG.standard_normal((2, 3, 7, 6))  # distinct values: no tie within a step
    rois = np.array([[0, 0.4, 1.2, 4.6, 5.1], [1, 2, 1, 5, 6], [1, -2, -1, 3, 2], [0, 0, 0, 12, 14]], np.float64)
    fn = lambda x_: ops.roi_pool(x_, rois, size, spatial_scale=scale)  # noqa: E731
    w = RNG.uniform(0.5, 1.5, _out_shape(fn, [x]))
    (dx,) = _grads(fn, [x], [0], w)
    np.testing.assert_allclose(dx, _numeric(fn, [x], 0, w), rtol=1e-6, atol=1e-9)
    from opsnn.ops.registry import get_op

    ex = opsnn.aclnn.roi_pool_backward.prepare(w, x, rois, size, scale)
    np.testing.assert_allclose(ex.run().numpy(), get_op("MaxRoiPoolGrad", "opsnn").reference([w, x, rois], ex.attrs))


def test_max_roi_pool_grad_ties_nan_and_bad_input():
    x = np.ones((1, 2, 4, 4), np.float32)
    x[0, 1, 2, 3] = np.nan
    rois = np.array([[0, 0, 0, 3, 3]], np.float32)
    dy = np.full((1, 2, 1, 1), 2.0, np.float32)
    dx = ops.roi_pool_backward(dy, x, rois, 1).numpy()
    assert dx[0, 0, 0, 0] == 2 and dx[0, 0].sum() == 2  # a tie: the first maximum takes it
    assert dx[0, 1, 2, 3] == 2 and dx[0, 1].sum() == 2  # a NaN is the forward's maximum
    with pytest.raises(OpsnnError, match="batch index"):
        ops.roi_pool_backward(dy, x, np.array([[4, 0, 0, 3, 3]], np.float32), 1)
    with pytest.raises(InferShapeError, match="dY"):
        ops.roi_pool_backward(np.zeros((1, 2, 2, 2), np.float32), x, rois, 1)


@pytest.mark.parametrize("mode,pad,align", GS_CASES)
@pytest.mark.parametrize(
    "xs,gs", [((2, 5, 9, 7), (2, 40, 33, 2)), ((1, 3, 4, 5, 6), (1, 3, 4, 5, 3)), ((3, 2, 11), (3, 7, 1))]
)
def test_grid_sample_grad_numba_matches_numpy_kernel(mode, pad, align, xs, gs):
    x = RNG.standard_normal(xs)
    grid = RNG.uniform(-1.3, 1.3, gs)
    grid.reshape(-1)[5] = np.nan
    grid.reshape(-1)[8] = 40.0  # far outside
    dy = RNG.standard_normal(xs[:2] + gs[1:-1])
    kw = dict(mode=mode, padding_mode=pad, align_corners=align)
    got = [
        t.numpy() for t in opsnn.aclnn.grid_sample_grad.prepare(dy, x, grid, algo="grid_sample_grad_numba", **kw).run()
    ]
    want = [
        t.numpy() for t in opsnn.aclnn.grid_sample_grad.prepare(dy, x, grid, algo="grid_sample_grad_numpy", **kw).run()
    ]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-11, atol=1e-12)
    g32 = [
        t.numpy()
        for t in opsnn.aclnn.grid_sample_grad.prepare(
            dy.astype(np.float32), x.astype(np.float32), grid.astype(np.float32), **kw
        ).run()
    ]
    np.testing.assert_allclose(g32[0], want[0], rtol=1e-4, atol=1e-4)


# == STFT ==============================================================================================
@pytest.mark.parametrize(
    "shape,step,fl,windowed,onesided",
    [
        ((2, 11, 1), 3, 4, True, True),
        ((1, 10, 1), 2, 5, False, True),
        ((2, 9, 2), 2, 4, True, False),
        ((1, 7, 1), 7, 7, True, False),
    ],
)
def test_stft_gradients_match_finite_differences(shape, step, fl, windowed, onesided):
    sig = RNG.standard_normal(shape)
    win = RNG.uniform(0.2, 1.0, fl)
    if windowed:
        fn = lambda s_, w_: ops.stft(s_, step, w_, onesided=onesided)  # noqa: E731
        arrays, wrt = [sig, win], [0, 1]
    else:
        fn = lambda s_: ops.stft(s_, step, frame_length=fl, onesided=onesided)  # noqa: E731
        arrays, wrt = [sig], [0]
    w = RNG.uniform(0.5, 1.5, _out_shape(fn, arrays))
    for i, g in zip(wrt, _grads(fn, arrays, wrt, w)):
        np.testing.assert_allclose(g, _numeric(fn, arrays, i, w), rtol=1e-6, atol=1e-8, err_msg=f"input {i}")


def test_stft_gradient_matches_torch():
    torch = pytest.importorskip("torch")
    sig = RNG.standard_normal((2, 16, 1))
    win = RNG.uniform(0.2, 1.0, 6)
    fn = lambda s_, w_: ops.stft(s_, 2, w_)  # noqa: E731
    w = RNG.uniform(0.5, 1.5, _out_shape(fn, [sig, win]))
    gs, gw = _grads(fn, [sig, win], [0, 1], w)
    ts, tw = torch.tensor(sig[..., 0], requires_grad=True), torch.tensor(win, requires_grad=True)
    ty = torch.stft(ts, 6, hop_length=2, win_length=6, window=tw, center=False, onesided=True, return_complex=True)
    ty = torch.view_as_real(ty).transpose(1, 2)  # (B, frames, bins, 2)
    dts, dtw = torch.autograd.grad((ty * torch.tensor(w)).sum(), [ts, tw])
    np.testing.assert_allclose(gs[..., 0], dts.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gw, dtw.numpy(), rtol=1e-10, atol=1e-12)


# == compiled training: the new backward records inside a traced step ==================================
def test_compiled_step_through_the_new_rules_matches_eager():
    from opsnn import nn, optim

    x0 = RNG.standard_normal((2, 3, 6, 5)).astype(np.float32)
    g0 = RNG.uniform(-1, 1, (2, 4, 3, 2)).astype(np.float32)
    m0 = (np.eye(3) + 0.1 * RNG.standard_normal((2, 3, 3))).astype(np.float32)
    rois = np.array([[0.5, 0.5, 3.5, 4.0], [1.0, 0.0, 4.0, 2.5]], np.float32)
    bidx = np.array([1, 0], np.int64)
    labels = [RNG.integers(0, 3, (2, 4)) for _ in range(3)]

    def run(compiled):
        img, grid, mats = nn.Parameter(x0.copy()), nn.Parameter(g0.copy()), nn.Parameter(m0.copy())
        opt = optim.SGD([img, grid, mats], lr=0.05, momentum=0.9)

        def train_step(y):
            opt.zero_grad()
            s = ops.grid_sample(img, grid, mode="bilinear", padding_mode="border")  # (2, 3, 4, 3)
            r = ops.roi_align(img, rois, bidx, (2, 2), sampling_ratio=2)  # (2, 3, 2, 2)
            logp = ops.log_softmax(ops.mean(s, dim=3), dim=1)  # (2, 3, 4)
            loss = ops.add(ops.nll_loss(logp, y), ops.add(ops.mean(r), ops.mean(ops.det(mats))))
            loss.backward()
            opt.step()
            return loss

        step = opsnn.compile(train_step) if compiled else train_step
        losses = [float(step(opsnn.tensor(y)).item()) for y in labels]
        return losses, [p.numpy().copy() for p in (img, grid, mats)], step

    el, ep, _ = run(False)
    cl, cp, step = run(True)
    assert step.num_compiles == 1
    np.testing.assert_allclose(cl, el, rtol=1e-5, atol=1e-6)
    for c, e in zip(cp, ep):
        np.testing.assert_allclose(c, e, rtol=1e-5, atol=1e-6)
    assert not np.allclose(ep[1], g0)  # the grid moved: its gradient reached the optimizer


@pytest.mark.parametrize(
    "xs,ws,stride,pad,dil,og,with_mask", [c[:7] for c in DC_CASES] + [((2, 4, 9, 8), (6, 2, 3, 3), 1, 1, 1, 2, True)]
)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_deform_conv_grad_numba_matches_numpy_kernel(xs, ws, stride, pad, dil, og, with_mask, dtype):
    x = RNG.standard_normal(xs).astype(dtype)
    w = RNG.standard_normal(ws).astype(dtype)
    kh, kw = ws[2:]
    oh = (xs[2] + 2 * pad - dil * (kh - 1) - 1) // stride + 1
    ow = (xs[3] + 2 * pad - dil * (kw - 1) - 1) // stride + 1
    off = RNG.uniform(-2.5, 2.5, (xs[0], og * kh * kw * 2, oh, ow)).astype(dtype)
    off.reshape(-1)[3] = np.nan
    mask = RNG.uniform(0.2, 1.2, (xs[0], og * kh * kw, oh, ow)).astype(dtype) if with_mask else None
    dy = RNG.standard_normal((xs[0], ws[0], oh, ow)).astype(dtype)
    kw_ = dict(stride=stride, padding=pad, dilation=dil, mask=mask)
    got = [
        t.numpy()
        for t in opsnn.aclnn.deform_conv2d_backward.prepare(dy, x, off, w, algo="deform_conv_grad_numba", **kw_).run()
    ]
    want = [
        t.numpy()
        for t in opsnn.aclnn.deform_conv2d_backward.prepare(dy, x, off, w, algo="deform_conv_grad_numpy", **kw_).run()
    ]
    tol = dict(rtol=1e-10, atol=1e-11) if dtype == np.float64 else dict(rtol=2e-4, atol=2e-4)
    for name, a, b in zip(("dX", "dW", "dOffset", "dMask"), got, want):
        assert a.dtype == dtype
        np.testing.assert_allclose(a, b, err_msg=name, **tol)


# == OneHot (the values input) =========================================================================
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot_values_gradient_matches_finite_differences(axis):
    idx = np.array([[0, 3, -1], [2, 1, 5]], np.int64)  # -1 counts from the end, 5 is out of range (all off)
    depth = np.asarray(4, np.int64)
    vals = np.array([-0.5, 2.0])
    fn = lambda v_: ops.run_op("OneHot", [idx, depth, v_], {"axis": axis})[0]  # noqa: E731
    w = RNG.uniform(0.5, 1.5, _out_shape(fn, [vals]))
    (g,) = _grads(fn, [vals], [0], w)
    np.testing.assert_allclose(g, _numeric(fn, [vals], 0, w), rtol=1e-7, atol=1e-9)
