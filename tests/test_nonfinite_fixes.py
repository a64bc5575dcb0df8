"""NaN/Inf cases `opsnn fuzz --kinds nan_inf` found (issue 29): each kernel gives NaN exactly where its
op's float64 definition does, and Inf where it has Inf. Oracles: a float64 loop written here and
onnx.reference."""

import numpy as np
import pytest

import opsnn


def _onnx_loss(op, x, t, w, attrs):
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    feeds = {"x": x, "t": t} | ({} if w is None else {"w": w})
    vi = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in feeds.items()]
    node = helper.make_node(op, list(feeds), ["y"], **attrs)
    out = helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(x.dtype), None)
    model = helper.make_model(helper.make_graph([node], "g", vi, [out]), opset_imports=[helper.make_opsetid("", 22)])
    return ReferenceEvaluator(model).run(None, feeds)[0]


def _loss_oracle(x, t, w, reduction, ignore, softmax):
    """float64, entry by entry: an ignored entry never enters the sum (nor the weight total)."""
    N, C = x.shape[:2]
    xs = x.astype(np.float64).reshape(N, C, -1)
    ts = t.reshape(N, -1)
    loss, den = np.zeros(ts.shape), 0.0
    for n in range(N):
        for d in range(ts.shape[1]):
            c = int(ts[n, d])
            if c == ignore:
                continue
            col = xs[n, :, d]
            lp = col[c] - col.max() - np.log(np.exp(col - col.max()).sum()) if softmax else col[c]
            wc = 1.0 if w is None else float(w[c])
            loss[n, d] = -lp * wc
            den += wc
    if reduction == "none":
        return loss.reshape(t.shape)
    return loss.sum() if reduction == "sum" else loss.sum() / den


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_ignored_row_with_minus_inf_stays_finite(reduction, weighted):
    # fuzz nan_inf seed 217407: a -inf in a row whose target is ignore_index gave NaN (0 x -inf)
    x = np.log(np.array([[0.2, 0.3, 0.5], [0.1, 0.6, 0.3], [0.7, 0.2, 0.1], [0.3, 0.3, 0.4]], np.float32))
    t = np.array([2, 1, 0, 1], np.int64)
    x[1, :] = [-np.inf, np.nan, np.inf]  # every entry of both ignored rows is non-finite
    x[3, 0] = -np.inf
    w = np.array([0.5, 2.0, 1.5], np.float32) if weighted else None
    ex = opsnn.aclnn.nll_loss.prepare(x, t, w, ignore_index=1, reduction=reduction, algo="nll_numpy")
    assert ex.kernel_name == "nll_numpy"
    got = ex.run().numpy()
    want = _loss_oracle(x, t, w, reduction, 1, softmax=False)
    assert np.isfinite(want).all()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    peer = _onnx_loss("NegativeLogLikelihoodLoss", x, t, w, {"reduction": reduction, "ignore_index": 1})
    np.testing.assert_allclose(got, peer, rtol=1e-6, atol=1e-6)


def test_nll_counted_row_with_minus_inf_is_inf():
    # the fix leaves counted entries alone: -(-inf) x w is +inf in the kernel as in the definition
    x = np.log(np.array([[0.2, 0.3, 0.5], [0.1, 0.6, 0.3]], np.float32))
    x[0, 2] = -np.inf
    t = np.array([2, 1], np.int64)
    got = opsnn.aclnn.nll_loss.prepare(x, t, ignore_index=1, reduction="none", algo="nll_numpy").run().numpy()
    want = _loss_oracle(x, t, None, "none", 1, softmax=False)
    np.testing.assert_array_equal(got, want.astype(np.float32))
    assert np.isposinf(got[0]) and got[1] == 0


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_softmax_xent_ignored_row_with_inf_stays_finite(reduction, weighted):
    # fuzz nan_inf seed 317429: +inf in an ignored row made its log_softmax NaN, and 0 x NaN reached the loss
    x = np.array([[-3.07, -1.74, 2.08], [2.92, -0.60, 0.73], [2.33, np.inf, 0.69]], np.float32)
    t = np.array([0, 1, 0], np.int64)
    w = np.array([0.5, 2.0, 1.5], np.float32) if weighted else None
    for algo in ("softmax_xent_numpy", "softmax_xent_numba"):
        ex = opsnn.aclnn.softmax_cross_entropy_loss.prepare(
            x, t, w, ignore_index=0, reduction=reduction, return_log_prob=True, algo=algo
        )
        assert ex.kernel_name == algo
        loss, logp = (r.numpy() for r in ex.run())
        want = _loss_oracle(x, t, w, reduction, 0, softmax=True)
        assert np.isfinite(want).all()
        np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6, err_msg=algo)
        # log_prob is the op's definition on every row, ignored ones included: NaN in the row holding +inf
        assert np.isnan(logp[2]).all() and np.isfinite(logp[:2]).all(), algo
        peer = _onnx_loss("SoftmaxCrossEntropyLoss", x, t, w, {"reduction": reduction, "ignore_index": 0})
        np.testing.assert_allclose(loss, peer, rtol=1e-5, atol=1e-6, err_msg=algo)


# -- Attention: a row every key of which is masked is zeros, whatever its scores ----------------------------------
ATTN_KERNELS = ("attention_flash", "attention_gemm", "attention_gemm_tiled", "attention_blas")


def _attention(q, k, v, mask, attrs, algo):
    from opsnn.ops.api import run_op

    with np.errstate(all="ignore"):
        return run_op("Attention", [opsnn.tensor(a) for a in (q, k, v, mask)], dict(attrs), algo=algo)[0].numpy()


def _attention_definition(q, k, v, mask, attrs):
    from opsnn.ops.registry import get_op

    rec = get_op("Attention")
    with np.errstate(all="ignore"):
        return rec.reference([q, k, v, mask], rec.bind_attrs(attrs))[0]


def _onnx_attention(q, k, v, mask, attrs):
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    feeds = {"q": q, "k": k, "v": v, "m": mask}
    vi = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()]
    node = helper.make_node("Attention", list(feeds), ["y"], **attrs)
    out = helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(q.dtype), None)
    model = helper.make_model(helper.make_graph([node], "g", vi, [out]), opset_imports=[helper.make_opsetid("", 23)])
    with np.errstate(all="ignore"):
        return ReferenceEvaluator(model).run(None, feeds)[0]


def _attention_cases():
    """(name, q, k, v, mask, attrs, onnx.reference applies, the fully masked (batch, head, row)s)."""
    rng = np.random.default_rng(29)
    q, k, v = (rng.standard_normal((2, 2, 4, 8)).astype(np.float32) for _ in range(3))
    # fuzz nan_inf seed 302548: scale 0 with an Inf in Q makes that row's scores NaN (0 x Inf), and the
    # additive mask rules out every key of the row
    q0 = q.copy()
    q0[1, 0, 2, 5] = np.inf
    m0 = np.zeros((4, 4), np.float32)
    m0[2, :] = -np.inf
    yield "scale0-inf-q-additive", q0, k, v, m0, {"scale": 0.0}, True, (slice(None), slice(None), 2)
    # +inf + -inf = NaN: an Inf query row whose every key the additive mask rules out
    q1 = q.copy()
    q1[0, 1, 1, 0] = np.inf
    m1 = np.zeros((4, 4), np.float32)
    m1[1, :] = -np.inf
    yield "inf-q-additive", q1, k, v, m1, {}, True, (slice(None), slice(None), 1)
    # a boolean mask ruling out every key of row 3, a NaN in that query row
    q2 = q.copy()
    q2[1, 1, 3, 3] = np.nan
    m2 = np.ones((2, 1, 4, 4), bool)
    m2[:, :, 3, :] = False
    yield "nan-q-bool", q2, k, v, m2, {}, True, (slice(None), slice(None), 3)
    # an Inf key under a one-wide -inf mask (keys past a mask's last dim count as masked: every row is),
    # seeds 854 / 903 / 2506 of case_nan_inf(op="Attention", kernel="attention_flash") on this main
    k3 = k.copy()
    k3[0, 0, 0, 3] = np.inf
    m3 = np.full((1,), -np.inf, np.float32)
    yield "inf-k-all-masked", q, k3, v, m3, {"right_window_size": 2}, False, (slice(None),)


@pytest.mark.parametrize("algo", ATTN_KERNELS)
@pytest.mark.parametrize("case", list(_attention_cases()), ids=lambda c: c[0])
def test_attention_fully_masked_row_with_nan_scores_is_zero(case, algo):
    _, q, k, v, mask, attrs, onnx_applies, dead = case
    got = _attention(q, k, v, mask, attrs, algo)
    want = _attention_definition(q, k, v, mask, attrs)
    assert (want[dead] == 0).all()
    # every row, NaN and all: the float64 definition (fully masked rows zeros, the others finite here)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, equal_nan=True, err_msg=algo)
    if onnx_applies:
        np.testing.assert_allclose(got, _onnx_attention(q, k, v, mask, attrs), rtol=2e-5, atol=2e-5, err_msg=algo)


@pytest.mark.parametrize("algo", ATTN_KERNELS)
def test_attention_nan_score_on_an_attended_key_still_makes_its_row_nan(algo):
    # the other side of the rule: a NaN score on a key the mask leaves open makes the row NaN, as softmax does
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 1, 3, 4)).astype(np.float32) for _ in range(3))
    q[0, 0, 1, 0] = np.nan
    mask = np.zeros((3, 3), np.float32)
    mask[1, :2] = -np.inf  # row 1 keeps key 2 only
    got = _attention(q, k, v, mask, {}, algo)
    assert np.isnan(got[0, 0, 1]).all() and np.isfinite(got[0, 0, [0, 2]]).all()
    np.testing.assert_allclose(got, _onnx_attention(q, k, v, mask, {}), rtol=2e-5, atol=2e-5, equal_nan=True)


# -- DeformConv / DeformConvGrad: a sampling position outside the input samples 0 and has zero gradients -------
def _deform_loops(dy, x, w, off, mask, pad):
    """float64 loops (2-D, stride 1, dilation 1, group 1), torchvision's semantics: a NaN position samples
    NaN (NaN dOffset / dMask, nothing to dX); one outside (-1, H) x (-1, W), an Inf one included, samples 0
    (zero dOffset / dMask); a corner outside the input takes no part. Returns (Y, dX, dW, dOffset, dMask)."""
    n, c, H, W = x.shape
    m, _, kh, kw = w.shape
    OH, OW = dy.shape[2:]
    og = off.shape[1] // (2 * kh * kw)
    cpg = c // og
    offv = off.astype(np.float64).reshape(n, og, kh, kw, 2, OH, OW)
    mk = (
        np.ones((n, og, kh, kw, OH, OW)) if mask is None else mask.astype(np.float64).reshape(offv.shape[:4] + (OH, OW))
    )
    x, w, dy = x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64)
    cols = np.zeros((n, c, kh, kw, OH, OW))
    sample = np.zeros_like(cols)  # unmasked
    dx, doff, dmask = np.zeros_like(x), np.zeros(offv.shape), np.zeros(mk.shape)
    dcols = np.einsum("mcab,nmyx->ncabyx", w, dy)
    for i, g, a, b, oy, ox in np.ndindex(n, og, kh, kw, OH, OW):
        y, xx = oy - pad + a + offv[i, g, a, b, 0, oy, ox], ox - pad + b + offv[i, g, a, b, 1, oy, ox]
        chans = range(g * cpg, (g + 1) * cpg)
        if np.isnan(y) or np.isnan(xx):
            sample[i, chans, a, b, oy, ox] = np.nan
            doff[i, g, a, b, :, oy, ox] = np.nan
            dmask[i, g, a, b, oy, ox] = np.nan
            continue
        if not (-1 < y < H and -1 < xx < W):
            continue
        y0, x0 = int(np.floor(y)), int(np.floor(xx))
        ly, lx = y - y0, xx - x0
        corners = [
            (y0 + cy, x0 + cx, (ly if cy else 1 - ly) * (lx if cx else 1 - lx), (1 if cy else -1) * (lx if cx else 1 - lx),
             (1 if cx else -1) * (ly if cy else 1 - ly))
            for cy in (0, 1) for cx in (0, 1)
            if 0 <= y0 + cy < H and 0 <= x0 + cx < W
        ]  # fmt: skip
        sy = sx = sm = 0.0
        for ch in chans:
            gc = dcols[i, ch, a, b, oy, ox]
            val = sum(wt * x[i, ch, iy, ix] for iy, ix, wt, _, _ in corners)
            sample[i, ch, a, b, oy, ox] = val
            sm += gc * val
            sy += gc * sum(dwy * x[i, ch, iy, ix] for iy, ix, _, dwy, _ in corners)
            sx += gc * sum(dwx * x[i, ch, iy, ix] for iy, ix, _, _, dwx in corners)
            for iy, ix, wt, _, _ in corners:
                dx[i, ch, iy, ix] += wt * (gc * mk[i, g, a, b, oy, ox])
        doff[i, g, a, b, 0, oy, ox] = sy * mk[i, g, a, b, oy, ox]
        doff[i, g, a, b, 1, oy, ox] = sx * mk[i, g, a, b, oy, ox]
        dmask[i, g, a, b, oy, ox] = sm
    cols = sample * np.repeat(mk, cpg, axis=1)
    y_fwd = np.einsum("mcab,ncabyx->nmyx", w, cols)
    dw = np.einsum("nmyx,ncabyx->mcab", dy, cols)
    return y_fwd, dx, dw, doff.reshape(off.shape), dmask.reshape(n, og * kh * kw, OH, OW)


def _deform_case(seed):
    rng = np.random.default_rng(seed)
    n, c, m, k, og, pad, hw = 1, 2, 2, 2, 1 + seed % 2, 1, 4
    out = hw + 2 * pad - k + 1
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    w = rng.standard_normal((m, c, k, k)).astype(np.float32)
    off = (rng.standard_normal((n, og * 2 * k * k, out, out)) * 1.5).astype(np.float32)
    if seed % 3 == 0:
        off = np.round(off * 2).astype(np.float32)  # integer positions: in-range corners of weight 0
    dy = rng.standard_normal((n, m, out, out)).astype(np.float32)
    mask = rng.random((n, og * k * k, out, out)).astype(np.float32) if seed % 4 < 2 else None
    ins = [dy, x, w, off] + ([mask] if mask is not None else [])
    poisoned = ins[seed % len(ins)]
    for _ in range(1 + seed % 3):
        poisoned.reshape(-1)[rng.integers(0, poisoned.size)] = rng.choice([np.nan, np.inf, -np.inf])
    return dy, x, w, off, mask, {"kernel_shape": [k, k], "pads": [pad] * 4, "offset_group": og}


@pytest.mark.parametrize("seed", range(16))
def test_deform_conv_grad_nonfinite_matches_loops(seed):
    # fuzz nan_inf seed 308075: deform_conv_grad_numba gave 0 where the reference had NaN. The reference
    # departed from the op's definition (torchvision's): an Inf offset was NaN rather than a position
    # outside the input, and a corner outside the input multiplied 0 by the clipped pixel it stood for
    from opsnn.ops.api import run_op

    dy, x, w, off, mask, attrs = _deform_case(seed)
    y_want, *want = _deform_loops(dy, x, w, off, mask, attrs["pads"][0])
    ins = [dy, x, w, off] + ([mask] if mask is not None else [])
    for algo in ("deform_conv_grad_numba", "deform_conv_grad_numpy"):
        with np.errstate(all="ignore"):
            got = run_op("DeformConvGrad", [opsnn.tensor(a) for a in ins], dict(attrs), domain="opsnn", algo=algo)
            got = [g.numpy() for g in got]
        for name, g, ww in zip(("dX", "dW", "dOffset", "dMask"), got, want):
            np.testing.assert_allclose(g, ww.astype(np.float32), rtol=1e-4, atol=1e-4, err_msg=f"{algo} {name}")


@pytest.mark.parametrize("seed", [3, 7, 8, 13])  # with and without a mask
def test_deform_conv_inf_offset_samples_zero(seed):
    # the forward's reference read an Inf position as an in-range corner weighted by Inf; it samples 0
    from opsnn.ops.api import run_op

    dy, x, w, off, mask, attrs = _deform_case(seed)
    off.reshape(-1)[[1, 6, 11]] = [np.inf, -np.inf, np.nan]
    want = _deform_loops(dy, x, w, off, mask, attrs["pads"][0])[0]
    ins = [x, w, off, None, mask]
    for algo in ("deform_conv2d_im2col", "reference"):
        with np.errstate(all="ignore"):
            got = run_op("DeformConv", [None if a is None else opsnn.tensor(a) for a in ins], dict(attrs), algo=algo)
        np.testing.assert_allclose(got[0].numpy(), want.astype(np.float32), rtol=1e-4, atol=1e-4, err_msg=algo)


@pytest.mark.parametrize("algo", ["attention_blas", "attention_flash", "attention_gemm"])
def test_attention_over_no_keys_is_zeros_even_with_nan_queries(algo):
    """Skv = 0 (a 30-minute fuzz run, seed 163643): every row attends no key, so Y is zeros as ONNX's
    reference gives; attention_blas's row max over the empty key axis raised an untyped ValueError."""
    from opsnn.ops.api import run_op

    q = np.full((1, 2, 3, 4), np.nan, np.float32)
    k = np.zeros((1, 2, 0, 4), np.float32)
    v = np.zeros((1, 2, 0, 5), np.float32)
    try:
        got = run_op("Attention", [opsnn.tensor(a) for a in (q, k, v)], {}, algo=algo)[0].numpy()
    except opsnn.errors.OpsnnError as exc:  # a kernel that does not take empty keys must say so, typed
        assert algo != "attention_blas", exc
        return
    np.testing.assert_array_equal(got, np.zeros((1, 2, 3, 5), np.float32))


def test_attention_train_refuses_zero_kv_heads_typed():
    """4-D inputs with 0 KV heads (seed 164695): q heads % 0 raised ZeroDivisionError in shape inference."""
    from opsnn.ops.api import run_op

    q, k, v = np.zeros((1, 0, 2, 4), np.float32), np.zeros((1, 0, 2, 4), np.float32), np.zeros((1, 0, 2, 4), np.float32)
    with pytest.raises(opsnn.errors.InferShapeError, match="kv heads"):
        run_op("AttentionTrain", [opsnn.tensor(a) for a in (q, k, v)], {}, domain="opsnn")
