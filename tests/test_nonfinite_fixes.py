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
