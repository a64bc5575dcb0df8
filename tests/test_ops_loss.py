"""SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss against a hand-written numpy
oracle, onnx.reference and onnxruntime; reductions, weights, ignore_index, log_prob."""

import ml_dtypes
import numpy as np
import pytest

import opsnn
from opsnn.errors import DTypeError, InferShapeError, OpsnnError, ParamInvalidError


def oracle(x, t, w=None, reduction="mean", ignore=None, softmax=True):
    """Per-element loop over (n, d); returns (loss, log_prob)."""
    x = x.astype(np.float64)
    N, C = x.shape[:2]
    xs = x.reshape(N, C, -1)
    logp = (
        xs - np.log(np.exp(xs - xs.max(1, keepdims=True)).sum(1, keepdims=True)) - xs.max(1, keepdims=True)
        if softmax
        else xs
    )
    ts = t.reshape(N, -1)
    loss = np.zeros(ts.shape)
    den = 0.0
    for n in range(N):
        for d in range(ts.shape[1]):
            c = ts[n, d]
            if ignore is not None and c == ignore:
                continue
            wc = 1.0 if w is None else float(w[c])
            loss[n, d] = -logp[n, c, d] * wc
            den += wc
    if reduction == "none":
        out = loss.reshape(t.shape)
    elif reduction == "sum":
        out = loss.sum()
    else:
        out = loss.sum() / den
    return out, logp.reshape(x.shape)


def onnx_model(op, inputs, attrs, nout, opset):
    from onnx import helper

    names = [f"i{k}" if v is not None else "" for k, v in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    vi = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for n, v in zip(names, inputs)
        if n
    ]
    et = helper.np_dtype_to_tensor_dtype(inputs[0].dtype)
    outs = [f"o{k}" for k in range(nout)]
    node = helper.make_node(op, names, outs, **attrs)
    graph = helper.make_graph([node], "g", vi, [helper.make_tensor_value_info(o, et, None) for o in outs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), {
        n: v for n, v in zip(names, inputs) if n
    }


def peers(op, inputs, attrs, nout):
    from onnx.reference import ReferenceEvaluator

    model, feed = onnx_model(op, inputs, attrs, nout, 22)
    res = [ReferenceEvaluator(model).run(None, feed)]
    try:
        import onnxruntime as ort

        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        res.append(sess.run(None, feed))
    except ImportError:
        pass
    return res


SHAPES = [((7, 5), (7,)), ((3, 4, 6), (3, 6)), ((2, 3, 4, 5), (2, 4, 5))]


@pytest.mark.parametrize("xs,ts", SHAPES)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted,ignore", [(False, None), (True, None), (False, 1), (True, 2)])
def test_softmax_cross_entropy(rng, xs, ts, reduction, weighted, ignore):
    x = rng.standard_normal(xs).astype(np.float32)
    t = rng.integers(0, xs[1], ts).astype(np.int64)
    w = rng.random(xs[1]).astype(np.float32) if weighted else None
    want, want_logp = oracle(x, t, w, reduction, ignore)
    ex = opsnn.aclnn.softmax_cross_entropy_loss.prepare(
        x, t, w, reduction=reduction, ignore_index=ignore, return_log_prob=True
    )
    assert ex.kernel_name == "softmax_xent_numba"
    for algo in ("softmax_xent_numba", "softmax_xent_numpy"):
        ex = opsnn.aclnn.softmax_cross_entropy_loss.prepare(
            x, t, w, reduction=reduction, ignore_index=ignore, return_log_prob=True, algo=algo
        )
        assert ex.kernel_name == algo
        loss, logp = (r.numpy() for r in ex.run())
        np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(logp, want_logp, rtol=1e-5, atol=1e-6)
    attrs = {"reduction": reduction} if ignore is None else {"reduction": reduction, "ignore_index": ignore}
    for peer in peers("SoftmaxCrossEntropyLoss", [x, t, w], attrs, 2):
        np.testing.assert_allclose(loss, peer[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(logp, peer[1], rtol=1e-5, atol=1e-6)
    ref = opsnn.ops.softmax_cross_entropy_loss(x, t, w, reduction=reduction, ignore_index=ignore, algo="reference")
    np.testing.assert_allclose(ref.numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("xs,ts", SHAPES)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted,ignore", [(False, None), (True, 0), (True, -1)])
def test_nll_loss(rng, xs, ts, reduction, weighted, ignore):
    x = np.log(rng.dirichlet(np.ones(xs[1]), size=int(np.prod(ts)))).astype(np.float32)
    x = np.moveaxis(x.reshape(ts + (xs[1],)), -1, 1).copy()
    t = rng.integers(0, xs[1], ts).astype(np.int32)
    if ignore == -1:
        t.reshape(-1)[::3] = -1  # an out-of-range ignore_index is fine where it is ignored
    w = rng.random(xs[1]).astype(np.float32) if weighted else None
    got = opsnn.ops.nll_loss(x, t, w, ignore_index=ignore, reduction=reduction).numpy()
    want, _ = oracle(x, t, w, reduction, ignore, softmax=False)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    attrs = {"reduction": reduction} if ignore is None else {"reduction": reduction, "ignore_index": ignore}
    for peer in peers("NegativeLogLikelihoodLoss", [x, t, w], attrs, 1):
        np.testing.assert_allclose(got, peer[0], rtol=1e-5, atol=1e-6)


def test_torch_style_defaults_and_non_contiguous(rng, no_leak):
    x = rng.standard_normal((5, 4)).astype(np.float32)
    t = np.array([0, 3, -100, 2, 1], np.int64)  # torch's default ignore_index
    xt = opsnn.from_numpy(np.ascontiguousarray(x.T)).transpose(0, 1)
    assert not xt.is_contiguous()
    got = opsnn.ops.cross_entropy(xt, t).numpy()
    np.testing.assert_allclose(got, oracle(x, t, ignore=-100)[0], rtol=1e-6)
    # extreme logits stay finite (log-sum-exp)
    big = np.array([[1000.0, -1000.0, 0.0]], np.float32)
    np.testing.assert_allclose(opsnn.ops.cross_entropy(big, np.array([1])).numpy(), 2000.0, rtol=1e-6)
    del got, xt


@pytest.mark.parametrize("dtype,tol", [(np.float16, 1e-2), (ml_dtypes.bfloat16, 3e-2), (np.float64, 1e-12)])
def test_dtypes(rng, dtype, tol):
    x = rng.standard_normal((4, 6, 3)).astype(dtype)
    t = rng.integers(0, 6, (4, 3))
    w = rng.random(6).astype(dtype)
    loss, logp = opsnn.ops.softmax_cross_entropy_loss(x, t, w, reduction="none", return_log_prob=True)
    assert loss.dtype == np.dtype(dtype) and logp.dtype == np.dtype(dtype)
    want, want_logp = oracle(x.astype(np.float64), t, w.astype(np.float64), "none")
    np.testing.assert_allclose(loss.numpy().astype(np.float64), want, rtol=tol, atol=tol)
    np.testing.assert_allclose(logp.numpy().astype(np.float64), want_logp, rtol=tol, atol=tol)


def test_all_ignored_mean_is_nan_and_empty(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    t = np.full(3, 2)
    assert np.isnan(opsnn.ops.cross_entropy(x, t, ignore_index=2).numpy())
    e = opsnn.ops.nll_loss(np.zeros((0, 4), np.float32), np.zeros(0, np.int64), reduction="none")
    assert e.shape == (0,)


def test_bad_inputs(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    with pytest.raises(InferShapeError, match="labels"):
        opsnn.ops.cross_entropy(x, np.zeros(4, np.int64))
    with pytest.raises(InferShapeError, match="rank"):
        opsnn.ops.cross_entropy(x[0], np.zeros((), np.int64))
    with pytest.raises(InferShapeError, match="weights"):
        opsnn.ops.cross_entropy(x, np.zeros(3, np.int64), np.ones(3, np.float32))
    with pytest.raises(ParamInvalidError, match="reduction"):
        opsnn.ops.cross_entropy(x, np.zeros(3, np.int64), reduction="avg")
    with pytest.raises(DTypeError):
        opsnn.ops.cross_entropy(x, np.zeros(3, np.float32))
    with pytest.raises(OpsnnError, match="targets"):
        opsnn.ops.cross_entropy(x, np.array([0, 4, 1])).numpy()
        opsnn.current_stream().synchronize()
