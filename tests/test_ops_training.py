"""Optimizer ops of ai.onnx.preview.training (Adagrad, Adam, Momentum) against independent
oracles: the update rules written out here in float64 numpy, and
onnx.reference.ReferenceEvaluator.

Tolerances: float64 rtol/atol 1e-12; float32 results (computed in float64, rounded once)
rtol 1e-6 / atol 1e-7 against the float64 formulas and 1e-5 against ReferenceEvaluator
(which computes in float32).
"""

import importlib
import warnings

import numpy as np
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import opsnn
from opsnn import aclnn
from opsnn.errors import DTypeError, InferShapeError, ParamInvalidError, ParamNullptrError

T = importlib.import_module("opsnn.ops.defs.training")
DOMAIN = "ai.onnx.preview.training"


def onnx_ref(op_type, inputs, n_out, **attrs):
    names = [f"x{i}" for i in range(len(inputs))]
    vis = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in zip(names, inputs)
    ]
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op_type, names, outs, domain=DOMAIN, **attrs)
    graph = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info(o, 0, None) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22), helper.make_opsetid(DOMAIN, 1)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ReferenceEvaluator(model).run(None, dict(zip(names, inputs)))


def _adagrad(r, t, x, g, h, decay, eps, norm):
    lr = r / (1 + t * decay)
    gr = norm * x + g
    h2 = h + gr**2
    return x - lr * gr / (np.sqrt(h2) + eps), h2


def _adam(r, t, x, g, v, h, alpha, beta, eps, norm, post):
    gr = norm * x + g
    v2 = alpha * v + (1 - alpha) * gr
    h2 = beta * h + (1 - beta) * gr**2
    lr = r * np.sqrt(1 - beta**t) / (1 - alpha**t) if t > 0 else r
    return (1 - post) * (x - lr * v2 / (np.sqrt(h2) + eps)), v2, h2


def _momentum(r, t, x, g, v, alpha, beta, norm, nesterov):
    gr = norm * x + g
    v2 = alpha * v + (beta if t > 0 else 1.0) * gr
    return (x - r * (gr + alpha * v2) if nesterov else x - r * v2), v2


def _tensors(rng, shapes, dtype, positive=False):
    out = [np.asarray(rng.standard_normal(s), dtype) for s in shapes]
    return [np.asarray(np.abs(o)) for o in out] if positive else out  # (np.abs of a 0-d array is a scalar)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("step", [0, 3])
def test_adagrad(rng, no_leak, dtype, step):
    shapes = [(3, 4), (5,), ()]
    xs, gs, hs = _tensors(rng, shapes, dtype), _tensors(rng, shapes, dtype), _tensors(rng, shapes, dtype, True)
    attrs = dict(decay_factor=0.1, eps=1e-5, weight_decay=0.01)
    ex = aclnn.adagrad_step.prepare(0.5, step, xs, gs, hs, **attrs)
    assert ex.kernel_name == "adagrad_numpy"
    got = ex.run()
    assert len(got) == 6
    ref = T.adagrad_step(0.5, step, xs, gs, hs, algo="reference", **attrs)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-6, atol=1e-7)
    for k in range(3):
        x2, h2 = _adagrad(
            np.float64(np.asarray(0.5, dtype)), step, *(a[k].astype(np.float64) for a in (xs, gs, hs)), 0.1, 1e-5, 0.01
        )
        for i, w in ((k, x2), (3 + k, h2)):
            assert got[i].dtype == dtype and got[i].shape == shapes[k]
            np.testing.assert_allclose(got[i].numpy(), w, **tol)
            np.testing.assert_allclose(ref[i].numpy(), w, **tol)


@pytest.mark.parametrize("step", [0, 1, 7])
def test_adam_against_formula_and_onnx_reference(rng, no_leak, step):
    shapes = [(2, 3), (4,)]
    xs, gs, vs = (_tensors(rng, shapes, np.float32) for _ in range(3))
    hs = _tensors(rng, shapes, np.float32, True)
    attrs = dict(beta1=0.85, beta2=0.95, eps=1e-3, weight_decay=0.02, weight_decay_post=0.1)
    got = T.adam_step(np.float32(0.01), step, xs, gs, vs, hs, **attrs)
    assert len(got) == 6
    r = np.array(0.01, np.float32)
    want_ref = onnx_ref(
        "Adam",
        [r, np.array(step, np.int64)] + xs + gs + vs + hs,
        6,
        alpha=0.85,
        beta=0.95,
        epsilon=1e-3,
        norm_coefficient=0.02,
        norm_coefficient_post=0.1,
    )
    for k in range(2):
        want = _adam(float(r), step, *(a[k].astype(np.float64) for a in (xs, gs, vs, hs)), 0.85, 0.95, 1e-3, 0.02, 0.1)
        for gi in range(3):
            np.testing.assert_allclose(got[gi * 2 + k].numpy(), want[gi], rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(got[gi * 2 + k].numpy(), want_ref[gi * 2 + k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum(rng, no_leak, nesterov):
    shapes = [(3,), (2, 2)]
    xs, gs, vs = (_tensors(rng, shapes, np.float64) for _ in range(3))
    for step in (0, 2):
        got = T.momentum_step(0.1, step, xs, gs, vs, alpha=0.9, beta=0.5, nesterov=nesterov, weight_decay=0.01)
        ref = T.momentum_step(
            0.1, step, xs, gs, vs, alpha=0.9, beta=0.5, nesterov=nesterov, weight_decay=0.01, algo="reference"
        )
        want_onnx = onnx_ref(
            "Momentum",
            [np.array(0.1), np.array(step, np.int64)] + xs + gs + vs,
            4,
            alpha=0.9,
            beta=0.5,
            mode="nesterov" if nesterov else "standard",
            norm_coefficient=0.01,
        )
        for k in range(2):
            want = _momentum(0.1, step, xs[k], gs[k], vs[k], 0.9, 0.5, 0.01, nesterov)
            for gi in range(2):
                np.testing.assert_allclose(got[gi * 2 + k].numpy(), want[gi], rtol=1e-12, atol=1e-12)
                np.testing.assert_allclose(ref[gi * 2 + k].numpy(), want[gi], rtol=1e-12, atol=1e-12)
                # the ONNX model stores alpha/beta as float32 attributes: 1e-6
                np.testing.assert_allclose(want_onnx[gi * 2 + k], want[gi], rtol=1e-6, atol=1e-7)


def test_training_noncontiguous_empty_nan_and_run_op(rng, no_leak):
    x = rng.standard_normal((4, 3)).astype(np.float32)
    g = rng.standard_normal((3, 4)).astype(np.float32).T
    v = np.zeros((4, 3), np.float32)
    got = T.momentum_step(0.1, 1, [opsnn.from_numpy(x)], [opsnn.from_numpy(g)], [v], alpha=0.5, beta=1.0)
    np.testing.assert_allclose(got[0].numpy(), x - 0.1 * g, rtol=1e-6, atol=1e-7)
    e = np.zeros((0, 3), np.float32)
    got = T.adagrad_step(0.1, 1, [e], [e], [e])
    assert got[0].shape == (0, 3) and got[1].shape == (0, 3)
    gn = g.copy()
    gn[0, 0] = np.nan
    got = T.adam_step(0.1, 1, [x], [gn], [v], [v])
    assert np.isnan(got[0].numpy()[0, 0]) and np.isfinite(np.delete(got[0].numpy().reshape(-1), 0)).all()
    # run_op by graph op type, in its domain, with the node's output count
    res = opsnn.ops.run_op(
        "Adagrad", [np.array(0.1, np.float32), np.array(0, np.int64), x, g.copy(), v], domain=DOMAIN, num_outputs=2
    )
    assert len(res) == 2


@pytest.mark.parametrize("algo", [None, "reference"])
def test_zero_learning_rate_denominators_follow_ieee_like_onnx_reference(no_leak, algo):
    # Adagrad with 1 + T * decay_factor = 0 and Adam with alpha = 1 divided by zero in Python floats: a
    # ZeroDivisionError (fuzz nan_inf 51977); onnx.reference's numpy gives +-inf / NaN, and so must opsnn
    x, g, h = np.array([1.0, -2.0], np.float32), np.array([0.5, 0.5], np.float32), np.array([1.0, 0.0], np.float32)
    r = np.array(0.1, np.float32)
    cases = [
        ("Adagrad", [r, np.array(-2, np.int64), x, g, h], {"decay_factor": 0.5}, 2),
        ("Adam", [r, np.array(2, np.int64), x, g, h, h], {"alpha": 1.0, "beta": 0.5}, 3),
    ]
    for op, ins, attrs, n_out in cases:
        want = onnx_ref(op, ins, n_out, **attrs)
        assert not np.isfinite(want[0]).all()
        got = opsnn.ops.run_op(op, ins, attrs, domain=DOMAIN, num_outputs=n_out, algo=algo)
        for w, o in zip(want, got):
            np.testing.assert_array_equal(o.numpy(), w.astype(o.numpy().dtype), err_msg=op)


def test_training_errors(no_leak):
    x = np.zeros(3, np.float32)
    r, t = np.array(0.1, np.float32), np.array(1, np.int64)
    with pytest.raises(ParamInvalidError, match="per optimized tensor"):
        opsnn.ops.run_op("Adagrad", [r, t, x, x], domain=DOMAIN, num_outputs=2)
    with pytest.raises(InferShapeError, match="shape"):
        opsnn.ops.run_op("Adagrad", [r, t, x, np.zeros(4, np.float32), x], domain=DOMAIN, num_outputs=2)
    with pytest.raises(DTypeError, match="dtype"):
        opsnn.ops.run_op("Adagrad", [r, t, x, x.astype(np.float64), x], domain=DOMAIN, num_outputs=2)
    with pytest.raises(InferShapeError, match="scalar"):
        opsnn.ops.run_op("Adagrad", [np.zeros(2, np.float32), t, x, x, x], domain=DOMAIN, num_outputs=2)
    with pytest.raises(InferShapeError, match="outputs"):
        opsnn.ops.run_op("Adagrad", [r, t, x, x, x], domain=DOMAIN, num_outputs=3)
    with pytest.raises(ParamInvalidError, match="mode"):
        opsnn.ops.run_op(
            "Momentum",
            [r, t, x, x, x],
            {"alpha": 0.9, "beta": 1.0, "mode": "heavy", "norm_coefficient": 0.0},
            domain=DOMAIN,
            num_outputs=2,
        )
    with pytest.raises(ParamNullptrError, match="alpha"):
        opsnn.ops.run_op(
            "Momentum",
            [r, t, x, x, x],
            {"beta": 1.0, "mode": "standard", "norm_coefficient": 0.0},
            domain=DOMAIN,
            num_outputs=2,
        )
    with pytest.raises(DTypeError):
        opsnn.ops.run_op("Adagrad", [r, t.astype(np.int32), x, x, x], domain=DOMAIN, num_outputs=2)
    with pytest.raises(ParamInvalidError, match="equal length"):
        T.adam_step(0.1, 1, [x], [x, x], [x], [x])
