"""The normalization and pooling backward ops (LayerNormalizationGrad, RMSNormalizationGrad,
BatchNormalizationGrad, GroupNormalizationGrad, MaxPoolGrad, AveragePoolGrad; domain opsnn):
against float64 central finite differences of their forward ops, against the registry-op
compositions the gradient rules used before (float32), against torch.autograd where importable,
and the rules' use of them (MaxPool's gradient reads the forward's Indices)."""

import numpy as np
import pytest

import opsnn
from opsnn import ops
from opsnn.errors import InferShapeError, ParamInvalidError
from opsnn.ops import gradients
from opsnn.runtime import hooks

RNG = np.random.default_rng(7)


def _t(a):
    return opsnn.tensor(np.asarray(a))


def _grad_op(name, ins, attrs, n_out):
    res = ops.run_op(name, [None if a is None else _t(a) for a in ins], attrs, num_outputs=n_out, domain="opsnn")
    return [r.numpy() for r in res]


def _fd(f, arrays, i, weight, eps=1e-6):
    """d sum(f(arrays) * weight) / d arrays[i] by central differences (float64)."""
    base = [None if a is None else a.copy() for a in arrays]
    flat = base[i].reshape(-1)
    g = np.zeros(flat.size)
    for k in range(flat.size):
        old = flat[k]
        flat[k] = old + eps
        up = np.sum(f(base) * weight)
        flat[k] = old - eps
        down = np.sum(f(base) * weight)
        flat[k] = old
        g[k] = (up - down) / (2 * eps)
    return g.reshape(base[i].shape)


def _fwd(name, attrs, n_out=None):
    def f(arrays):
        with opsnn.no_grad():
            return ops.run_op(name, [None if a is None else _t(a) for a in arrays], attrs, num_outputs=n_out)[0].numpy()

    return f


def _check_fd(grads, f, arrays, wrt, weight, rtol=1e-5, atol=1e-7):
    for k, i in enumerate(wrt):
        np.testing.assert_allclose(grads[k], _fd(f, arrays, i, weight), rtol=rtol, atol=atol, err_msg=f"input {i}")


# -- LayerNorm / RMSNorm -------------------------------------------------------------------------------
LN_CASES = [
    ((3, 5, 7), -1, (7,), 1e-5),
    ((3, 5, 7), 1, (5, 7), 1e-5),
    ((3, 5, 7), 1, (1, 7), 0.3),  # scale broadcast inside the block
    ((2, 9), 0, (2, 9), 1e-5),  # one row
    ((1, 3, 1), -1, (1,), 1e-2),  # one-element rows: dx is 0
    ((4, 5), -1, (1, 5), 1e-5),  # Scale with a leading 1 beyond the block (opsnn fuzz)
    ((1, 5, 5), -2, (1, 5, 5), 1e-3),
]


@pytest.mark.parametrize("shape, axis, sshape, eps", LN_CASES)
def test_layer_norm_grad_matches_finite_differences(shape, axis, sshape, eps):
    x = RNG.standard_normal(shape)
    s = RNG.uniform(0.5, 1.5, sshape)
    b = RNG.standard_normal(shape[axis % len(shape) :])
    w = RNG.uniform(0.5, 1.5, shape)
    attrs = {"axis": axis, "epsilon": eps}
    dx, ds, db = _grad_op("LayerNormalizationGrad", [w, x, s], attrs, 3)
    assert dx.shape == x.shape and ds.shape == s.shape and db.shape == b.shape
    _check_fd([dx, ds, db], _fwd("LayerNormalization", attrs), [x, s, b], [0, 1, 2], w)


@pytest.mark.parametrize("shape, axis, sshape, eps", LN_CASES[:4])
def test_rms_norm_grad_matches_finite_differences(shape, axis, sshape, eps):
    x = RNG.standard_normal(shape)
    s = RNG.uniform(0.5, 1.5, sshape)
    w = RNG.uniform(0.5, 1.5, shape)
    attrs = {"axis": axis, "epsilon": eps}
    dx, ds = _grad_op("RMSNormalizationGrad", [w, x, s], attrs, 2)
    _check_fd([dx, ds], _fwd("RMSNormalization", attrs), [x, s], [0, 1], w)


# -- BatchNorm / GroupNorm -----------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(4, 3, 5), (3, 2, 2, 3), (5, 4), (2, 3, 1, 2, 2)])
@pytest.mark.parametrize("training", [1, 0])
def test_batch_norm_grad_matches_finite_differences(shape, training):
    C = shape[1]
    x = RNG.standard_normal(shape) * 2 + 0.5
    s, b = RNG.uniform(0.5, 1.5, C), RNG.standard_normal(C)
    m, v = RNG.standard_normal(C), RNG.uniform(0.5, 2.0, C)
    w = RNG.uniform(0.5, 1.5, shape)
    attrs = {"epsilon": 1e-3, "training_mode": training}
    dx, ds, db = _grad_op("BatchNormalizationGrad", [w, x, s, m, v], attrs, 3)
    f = _fwd("BatchNormalization", attrs, 3 if training else 1)
    _check_fd([dx, ds, db], f, [x, s, b, m, v], [0, 1, 2], w)


@pytest.mark.parametrize("shape, groups", [((2, 6, 5), 3), ((2, 6, 5), 1), ((3, 4, 2, 3), 4), ((1, 2), 2)])
def test_group_norm_grad_matches_finite_differences(shape, groups):
    C = shape[1]
    x = RNG.standard_normal(shape)
    s, b = RNG.uniform(0.5, 1.5, C), RNG.standard_normal(C)
    w = RNG.uniform(0.5, 1.5, shape)
    attrs = {"epsilon": 1e-4, "num_groups": groups}
    dx, ds, db = _grad_op("GroupNormalizationGrad", [w, x, s], attrs, 3)
    _check_fd([dx, ds, db], _fwd("GroupNormalization", attrs), [x, s, b], [0, 1, 2], w)


# -- against the registry-op compositions (float32) and the float64 formula on the parallel paths ---------------
def _composed(rule, op, ins, attrs, g, n_in):
    rec = ops.get_op(op)
    ctx = gradients.GradContext(
        op, [None if a is None else _t(a) for a in ins], [], rec.bind_attrs(attrs), [True] * n_in
    )
    return [None if r is None else r.numpy() for r in rule(ctx, [_t(g)])]


NORM_COMPOSED = [
    ("LayerNormalization", "LayerNormalizationGrad", gradients._layer_norm_composed, {"axis": 1}, 3),
    ("RMSNormalization", "RMSNormalizationGrad", gradients._rms_norm_composed, {"axis": 2}, 2),
    ("BatchNormalization", "BatchNormalizationGrad", gradients._batch_norm_composed, {"training_mode": 1}, 3),
    ("GroupNormalization", "GroupNormalizationGrad", gradients._group_norm_composed, {"num_groups": 3}, 3),
]


@pytest.mark.parametrize("op, grad_op, rule, attrs, n", NORM_COMPOSED, ids=[c[0] for c in NORM_COMPOSED])
@pytest.mark.parametrize("big", [False, True], ids=["serial", "parallel"])
def test_norm_grad_matches_composition_and_float64_formula(op, grad_op, rule, attrs, n, big):
    shape = (16, 12, 64, 48) if big else (3, 6, 5, 7)  # 589,824 elements: over every parallel threshold
    x = (RNG.standard_normal(shape) * 3 + 10).astype(np.float32)  # an offset mean: cancellation-prone
    g = RNG.standard_normal(shape).astype(np.float32)
    C = shape[1]
    if op in ("LayerNormalization", "RMSNormalization"):
        s = RNG.uniform(0.5, 1.5, shape[attrs["axis"] :]).astype(np.float32)
        ins, fwd_ins = [g, x, s], [x, s] + ([np.zeros_like(s)] if n == 3 else [])
    else:
        s = RNG.uniform(0.5, 1.5, C).astype(np.float32)
        ins = [g, x, s] + ([None, None] if op == "BatchNormalization" else [])
        fwd_ins = [x, s, np.zeros(C, np.float32)] + (
            [np.zeros(C, np.float32), np.ones(C, np.float32)] if op == "BatchNormalization" else []
        )
    got = _grad_op(grad_op, ins, attrs, n)
    ref = ops.get_op(grad_op, "opsnn").reference(
        [None if a is None else a.astype(np.float64) for a in ins], ops.get_op(grad_op, "opsnn").bind_attrs(attrs)
    )
    for k, (a, r) in enumerate(zip(got, ref)):
        assert a.dtype == np.float32
        # float32 results of sums over up to 36,864 elements: relative to the output's scale
        np.testing.assert_allclose(a, r, rtol=2e-4, atol=2e-4 * np.abs(r).max(), err_msg=f"output {k} vs float64")
    if not big:
        comp = _composed(rule, op, fwd_ins, attrs, g, len(fwd_ins))
        for k in range(n):
            np.testing.assert_allclose(got[k], comp[k], rtol=1e-4, atol=1e-4, err_msg=f"output {k} vs composition")


@pytest.mark.parametrize("grad_op, attrs, ins_of", [
    ("LayerNormalizationGrad", {"axis": -1}, lambda g, x, C, W: [g, x, RNG.uniform(0.5, 1.5, W)]),
    ("RMSNormalizationGrad", {"axis": -1}, lambda g, x, C, W: [g, x, RNG.uniform(0.5, 1.5, W)]),
    ("BatchNormalizationGrad", {}, lambda g, x, C, W: [g, x, RNG.uniform(0.5, 1.5, C)]),
    ("GroupNormalizationGrad", {"num_groups": 2}, lambda g, x, C, W: [g, x, RNG.uniform(0.5, 1.5, C)]),
])  # fmt: skip
def test_norm_grad_nonfinite_values_stay_where_they_belong(grad_op, attrs, ins_of):
    x = RNG.standard_normal((3, 4, 5))
    g = RNG.standard_normal(x.shape)
    x[1, 2, 3] = np.nan
    g[2, 0, 1] = np.inf
    ins = ins_of(g, x, 4, 5)
    rec = ops.get_op(grad_op, "opsnn")
    n = len(rec.outputs)
    ref = rec.reference(ins, rec.bind_attrs(attrs))
    for dt in (np.float64, np.float32):
        got = _grad_op(grad_op, [a.astype(dt) for a in ins], attrs, n)
        for k in range(n):
            for what, fn in (("NaN", np.isnan), ("+Inf", np.isposinf), ("-Inf", np.isneginf)):
                assert np.array_equal(fn(got[k]), fn(ref[k])), f"{dt.__name__} output {k}: {what} positions"
            fin = np.isfinite(ref[k])
            np.testing.assert_allclose(got[k][fin], ref[k][fin], rtol=1e-4, atol=1e-5)
            if k == 0:  # rows / groups / channels without the NaN or the Inf stay finite
                assert 0 < fin.sum() < fin.size


@pytest.mark.parametrize("training", [1, 0])
@pytest.mark.parametrize("mixed", [False, True])
def test_batch_norm_grad_infinite_scale_and_dy_give_the_definitions_nan_and_inf(training, mixed):
    # scale Inf: gh = dy * Inf holds +-Inf (a NaN sum), not Inf times a finite sum of dy (opsnn fuzz);
    # mixed: dY of both signs and an Inf beside a -Inf scale (fuzz nan_inf seed 2600942: dX was Inf, not NaN)
    x = RNG.standard_normal((5, 2)).astype(np.float32)
    g = RNG.standard_normal((5, 2)).astype(np.float32)
    g[4, 0] = -np.inf
    s = np.array([np.inf, 0.5], np.float32)
    if mixed:  # the fuzz case's channel
        g, x = np.array([[np.inf, -0.422, 2.209]], np.float32).T, np.array([[0.966, -1.751, 0.467]], np.float32).T
        g, x = np.concatenate([g, g[::-1]], 1), np.concatenate([x, x], 1)
        s = np.array([-np.inf, 1.5], np.float32)
    m, v = np.array([0.1, -0.2], np.float32), np.array([1.5, np.inf], np.float32)
    attrs = {"training_mode": training}
    rec = ops.get_op("BatchNormalizationGrad", "opsnn")
    ref = rec.reference([g, x, s, m, v], rec.bind_attrs(attrs))
    got = _grad_op("BatchNormalizationGrad", [g, x, s, m, v], attrs, 3)
    for k in range(3):
        for what, fn in (("NaN", np.isnan), ("+Inf", np.isposinf), ("-Inf", np.isneginf)):
            assert np.array_equal(fn(got[k]), fn(ref[k])), f"output {k}: {what} positions"
        fin = np.isfinite(ref[k])
        np.testing.assert_allclose(got[k][fin], ref[k][fin], rtol=1e-5, atol=1e-6)


def test_norm_grad_empty_inputs():
    x = np.zeros((0, 4, 3), np.float32)
    dx, ds, db = _grad_op("LayerNormalizationGrad", [x, x, np.ones(3, np.float32)], {}, 3)
    assert dx.shape == x.shape and np.array_equal(ds, np.zeros(3)) and np.array_equal(db, np.zeros(3))
    dx, ds, db = _grad_op("BatchNormalizationGrad", [x, x, np.ones(4, np.float32)], {}, 3)
    assert dx.shape == x.shape and np.array_equal(ds, np.zeros(4)) and np.array_equal(db, np.zeros(4))
    dx, ds, db = _grad_op("GroupNormalizationGrad", [x, x, np.ones(4, np.float32)], {"num_groups": 2}, 3)
    assert dx.shape == x.shape and np.array_equal(ds, np.zeros(4)) and np.array_equal(db, np.zeros(4))


# -- pooling ------------------------------------------------------------------------------------------
AVG_CASES = [
    ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}, (2, 3, 7, 8)),
    ({"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1], "ceil_mode": 1}, (1, 2, 8, 7)),
    ({"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1], "ceil_mode": 1, "count_include_pad": 1}, (1, 2, 8, 7)),
    ({"kernel_shape": [2, 2], "dilations": [2, 1], "strides": [1, 2]}, (1, 2, 6, 5)),
    ({"kernel_shape": [4], "strides": [3], "pads": [2, 1], "ceil_mode": 1, "count_include_pad": 1}, (2, 3, 11)),
    ({"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [1, 1, 0, 0, 1, 1]}, (1, 2, 4, 5, 3)),
    ({"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]}, (1, 1, 5, 6)),
]  # fmt: skip


@pytest.mark.parametrize("attrs, shape", AVG_CASES)
def test_average_pool_grad_matches_finite_differences_and_composition(attrs, shape):
    x = RNG.standard_normal(shape)
    f = _fwd("AveragePool", attrs)
    w = RNG.uniform(0.5, 1.5, f([x]).shape)
    (dx,) = _grad_op("AveragePoolGrad", [w, x], attrs, 1)
    _check_fd([dx], f, [x], [0], w)
    comp = _composed(gradients._average_pool_composed, "AveragePool", [x], attrs, w, 1)
    np.testing.assert_allclose(dx, comp[0], rtol=1e-12, atol=1e-14)


MAX_CASES = [
    ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, (2, 3, 7, 8)),
    ({"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1], "ceil_mode": 1}, (1, 2, 8, 7)),
    ({"kernel_shape": [2, 2], "dilations": [2, 1], "strides": [1, 1]}, (1, 2, 6, 5)),
    ({"kernel_shape": [4], "strides": [3], "pads": [2, 1], "ceil_mode": 1}, (2, 3, 11)),
    ({"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [1, 1, 0, 0, 1, 1]}, (1, 2, 4, 5, 3)),
]


@pytest.mark.parametrize("attrs, shape", MAX_CASES)
def test_max_pool_grad_matches_finite_differences(attrs, shape):
    x = RNG.permutation(np.prod(shape)).reshape(shape) / 7.0  # distinct values: a unique maximum per window
    _, idx = ops.run_op("MaxPool", [_t(x)], attrs, num_outputs=2)
    f = _fwd("MaxPool", attrs)
    w = RNG.uniform(0.5, 1.5, idx.shape)
    (dx,) = _grad_op("MaxPoolGrad", [w, idx.numpy(), x], {}, 1)
    _check_fd([dx], f, [x], [0], w)


def test_max_pool_grad_ties_and_nan_follow_the_indices():
    # ties: every window of a constant plane; the first maximum in raster order gets the gradient
    x = np.zeros((1, 1, 4, 4), np.float32)
    x[0, 0, 3, 3] = np.nan  # its window reports the NaN's position
    y, idx = ops.max_pool2d(_t(x), 2, 2, return_indices=True)
    g = np.arange(1, 5, dtype=np.float32).reshape(y.shape)
    dx = ops.max_pool_backward(_t(g), _t(x), idx).numpy()[0, 0]
    want = np.zeros((4, 4), np.float32)
    want[0, 0], want[0, 2], want[2, 0], want[3, 3] = 1, 2, 3, 4
    np.testing.assert_array_equal(dx, want)
    # the NaN of dY itself is carried to its maximum
    g[0, 0, 0, 0] = np.nan
    dx = ops.max_pool_backward(_t(g), _t(x), idx).numpy()[0, 0]
    assert np.isnan(dx[0, 0]) and np.isfinite(np.delete(dx.reshape(-1), 0)).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pool_grads_parallel_paths_match_the_reference(dtype):
    x = RNG.standard_normal((4, 16, 33, 31)).astype(dtype)  # 4,096+ outputs per plane set: parallel
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}
    y, idx = ops.run_op("MaxPool", [_t(x)], attrs, num_outputs=2)
    g = RNG.standard_normal(y.shape).astype(dtype)
    (dx,) = _grad_op("MaxPoolGrad", [g, idx.numpy(), x], {}, 1)
    ref = ops.get_op("MaxPoolGrad", "opsnn").reference([g, idx.numpy(), x], {})
    np.testing.assert_allclose(dx, ref, rtol=1e-6, atol=1e-6)
    attrs["count_include_pad"] = 1
    (dx,) = _grad_op("AveragePoolGrad", [g, x], attrs, 1)
    rec = ops.get_op("AveragePoolGrad", "opsnn")
    ref = rec.reference([g.astype(np.float64), x], rec.bind_attrs(attrs))
    np.testing.assert_allclose(dx, ref, rtol=1e-5, atol=1e-6)


# -- typed errors ---------------------------------------------------------------------------------------
def test_bad_inputs_are_typed_errors():
    x = RNG.standard_normal((2, 4, 3)).astype(np.float32)
    s = np.ones(3, np.float32)
    with pytest.raises(ParamInvalidError, match="LayerNormalizationGrad: input 'dY' has shape"):
        _grad_op("LayerNormalizationGrad", [x[:1], x, s], {}, 3)
    with pytest.raises(ParamInvalidError, match="LayerNormalizationGrad: input 'dY' has dtype float64"):
        _grad_op("LayerNormalizationGrad", [x.astype(np.float64), x, s], {}, 3)
    with pytest.raises(ParamInvalidError, match="attribute 'axis' is 3"):
        _grad_op("RMSNormalizationGrad", [x, x, s], {"axis": 3}, 2)
    with pytest.raises(ParamInvalidError, match="num_groups=3 must be positive and divide"):
        _grad_op("GroupNormalizationGrad", [x, x, np.ones(4, np.float32)], {"num_groups": 3}, 3)
    with pytest.raises(ParamInvalidError, match="'input_mean' and 'input_var' are required with training_mode=0"):
        _grad_op("BatchNormalizationGrad", [x, x, np.ones(4, np.float32)], {"training_mode": 0}, 3)
    with pytest.raises(ParamInvalidError, match="input 'scale' must have shape \\(4,\\)"):
        _grad_op("BatchNormalizationGrad", [x, x, s], {}, 3)
    x4 = RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)
    _, idx = ops.max_pool2d(_t(x4), 2, return_indices=True)
    g = np.ones(idx.shape, np.float32)
    bad = idx.numpy().copy()
    bad[0, 1, 0, 0] = 3  # plane 0's element, given to plane 1
    with pytest.raises(ParamInvalidError, match="MaxPoolGrad: input 'Indices' holds 1 value"):
        ops.max_pool_backward(_t(g), _t(x4), _t(bad))
    with pytest.raises(InferShapeError, match="MaxPoolGrad: input 'Indices' has shape"):
        ops.max_pool_backward(_t(g), _t(x4), _t(bad[:, :1]))
    with pytest.raises(InferShapeError, match="AveragePoolGrad: input 'dY' has shape"):
        ops.avg_pool_backward(_t(np.ones((1, 2, 3, 3), np.float32)), _t(x4), 2)
    with pytest.raises(ParamInvalidError, match="AveragePoolGrad: attribute 'count_include_pad' must be 0 or 1, got 2"):
        ops.run_op("AveragePoolGrad", [_t(g), _t(x4)], {"kernel_shape": [2, 2], "count_include_pad": 2}, domain="opsnn")
    with pytest.raises(InferShapeError, match="expected \\(N, C, spatial...\\) of rank 4"):
        ops.avg_pool_backward(_t(np.ones((1, 2, 2), np.float32)), _t(x4), 2)


# -- the two-phase API ---------------------------------------------------------------------------------
def test_two_phase_api_runs_the_numba_kernels():
    x = _t(RNG.standard_normal((4, 6, 5, 5)).astype(np.float32))
    g = _t(RNG.standard_normal((4, 6, 5, 5)).astype(np.float32))
    w = _t(RNG.uniform(0.5, 1.5, 6).astype(np.float32))
    cases = [
        (opsnn.aclnn.layer_norm_backward, (g, x, (5, 5)), "layer_norm_grad_numba"),
        (opsnn.aclnn.rms_norm_backward, (g, x, 5), "rms_norm_grad_numba"),
        (opsnn.aclnn.batch_norm_backward, (g, x, w), "batch_norm_grad_numba"),
        (opsnn.aclnn.group_norm_backward, (g, x, 3, w), "group_norm_grad_numba"),
        (opsnn.aclnn.avg_pool_backward, (_t(np.ones((4, 6, 3, 3), np.float32)), x, 3, 2, 1), "avg_pool_grad_numba"),
    ]
    for fn, args, kernel in cases:
        ex = fn.prepare(*args)
        assert ex.kernel_name == kernel
        first = [r.numpy().copy() for r in _as_tuple(ex.run())]
        eager = _as_tuple(getattr(ops, fn.name)(*args))
        for a, b in zip(first, eager):
            np.testing.assert_array_equal(a, b.numpy())
    _, idx = ops.max_pool2d(x, 2, return_indices=True)
    ex = opsnn.aclnn.max_pool_backward.prepare(_t(np.ones(idx.shape, np.float32)), x, idx)
    assert ex.kernel_name == "max_pool_grad_numba"
    assert ex.run().numpy().sum() == idx.numel


def _as_tuple(r):
    return r if isinstance(r, tuple) else (r,)


# -- the gradient rules use the backward ops -----------------------------------------------------------
def _ops_run(fn):
    seen = []
    off = hooks.subscribe("kernel", lambda ev: seen.append(ev["op"]))
    try:
        fn()
        opsnn.current_stream().synchronize()
    finally:
        off()
    return seen


def test_rules_run_one_backward_op_and_max_pool_keeps_its_indices():
    x = _t(RNG.standard_normal((2, 4, 9, 9)).astype(np.float32)).requires_grad_()
    w = _t(RNG.uniform(0.5, 1.5, 4).astype(np.float32)).requires_grad_()
    b = _t(np.zeros(4, np.float32)).requires_grad_()
    rm, rv = np.zeros(4, np.float32), np.ones(4, np.float32)
    y, _, _ = ops.batch_norm(x, rm, rv, w, b, training=True)
    p = ops.max_pool2d(y, 3, 2, 1)
    assert isinstance(p, opsnn.Tensor)  # the caller gets what it asked for; the tape keeps the Indices
    q = ops.avg_pool2d(p, 2, 2, ceil_mode=True)
    loss = ops.sum(ops.layer_norm(q, (3,)) * _t(RNG.uniform(0.5, 1.5, q.shape).astype(np.float32)))
    ran = _ops_run(loss.backward)
    for op in ("LayerNormalizationGrad", "AveragePoolGrad", "MaxPoolGrad", "BatchNormalizationGrad"):
        assert ran.count(op) == 1, (op, ran)
    for op in ("MaxPool", "ReduceMean", "Conv", "ConvTranspose", "ScatterElements"):
        assert op not in ran, (op, ran)


def test_max_pool_rule_recomputes_column_major_indices():
    x = _t(RNG.standard_normal((1, 2, 5, 6))).requires_grad_()
    y, idx = ops.run_op("MaxPool", [x], {"kernel_shape": [2, 3], "storage_order": 1}, num_outputs=2)
    g = RNG.uniform(0.5, 1.5, y.shape)
    (dx,) = opsnn.autograd.grad(ops.sum(y * _t(g)), [x])
    f = _fwd("MaxPool", {"kernel_shape": [2, 3]})
    np.testing.assert_allclose(dx.numpy(), _fd(f, [x.numpy()], 0, g), rtol=1e-6, atol=1e-8)


# -- torch.autograd ------------------------------------------------------------------------------------
TORCH_CASES = [
    ("layer_norm", lambda F, x, w, b: F.layer_norm(x, (6, 5), w, b, 1e-5), (3, 4, 6, 5), (6, 5)),
    ("rms_norm", lambda F, x, w, b: F.rms_norm(x, (5,), w, 1e-6), (3, 4, 6, 5), (5,)),
    ("batch_norm", lambda F, x, w, b: F.batch_norm(x, None, None, w, b, True, 0.1, 1e-5), (3, 4, 6, 5), (4,)),
    ("group_norm", lambda F, x, w, b: F.group_norm(x, 2, w, b, 1e-5), (3, 4, 6, 5), (4,)),
    ("instance_norm", lambda F, x, w, b: F.instance_norm(x, None, None, w, b, True, 0.1, 1e-4), (2, 3, 5, 4), (3,)),
    ("max_pool2d_ceil", lambda F, x, w, b: F.max_pool2d(x, 3, 2, 1, ceil_mode=True), (2, 3, 8, 9), None),
    ("max_pool1d", lambda F, x, w, b: F.max_pool1d(x, 3, 2, 1, dilation=2), (2, 3, 13), None),
    ("max_pool3d", lambda F, x, w, b: F.max_pool3d(x, 2, (1, 2, 2)), (1, 2, 4, 5, 6), None),
    ("avg_pool2d_ceil_pad", lambda F, x, w, b: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True), (2, 3, 8, 9), None),
    ("avg_pool2d_no_pad_count", lambda F, x, w, b: F.avg_pool2d(x, 3, 2, 1, True, False), (2, 3, 8, 9), None),
    ("avg_pool1d", lambda F, x, w, b: F.avg_pool1d(x, 4, 3, 2, ceil_mode=True), (2, 3, 13), None),
    ("avg_pool3d", lambda F, x, w, b: F.avg_pool3d(x, 3, 2, 1, count_include_pad=False), (1, 2, 5, 6, 7), None),
]


class _OpsnnF:
    """torch.nn.functional's spellings over opsnn.ops, for the shared case lambdas."""

    layer_norm = staticmethod(lambda x, ns, w, b, eps: ops.layer_norm(x, ns, w, b, eps))
    rms_norm = staticmethod(lambda x, ns, w, eps: ops.rms_norm(x, ns, w, eps))
    group_norm = staticmethod(ops.group_norm)
    instance_norm = staticmethod(
        lambda x, rm, rv, w, b, use_input_stats, momentum, eps: ops.instance_norm(x, w, b, eps)
    )
    max_pool1d = staticmethod(ops.max_pool1d)
    max_pool2d = staticmethod(ops.max_pool2d)
    max_pool3d = staticmethod(ops.max_pool3d)
    avg_pool1d = staticmethod(ops.avg_pool1d)
    avg_pool2d = staticmethod(ops.avg_pool2d)
    avg_pool3d = staticmethod(ops.avg_pool3d)

    @staticmethod
    def batch_norm(x, rm, rv, w, b, training, momentum, eps):
        C = x.shape[1]
        return ops.batch_norm(x, np.zeros(C, x.dtype), np.ones(C, x.dtype), w, b, training, momentum, eps)[0]


@pytest.mark.parametrize("name, fn, shape, pshape", TORCH_CASES, ids=[c[0] for c in TORCH_CASES])
def test_matches_torch_autograd(name, fn, shape, pshape):
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal(shape)
    if "max_pool" in name:
        x = np.round(x * 2) / 2  # ties inside windows: torch gives the first maximum the gradient
    params = [RNG.uniform(0.5, 1.5, pshape), RNG.standard_normal(pshape)] if pshape else [None, None]
    if name == "rms_norm":
        params[1] = None
    ts = [None if a is None else _t(a).requires_grad_() for a in [x, *params]]
    y = fn(_OpsnnF, *ts)
    wgt = RNG.uniform(0.5, 1.5, y.shape)
    wrt = [t for t in ts if t is not None]
    grads = opsnn.autograd.grad(ops.sum(y * _t(wgt)), wrt)
    tt = [None if a is None else torch.tensor(a, requires_grad=True) for a in [x, *params]]
    ty = fn(torch.nn.functional, *tt)
    tg = torch.autograd.grad((ty * torch.tensor(wgt)).sum(), [t for t in tt if t is not None])
    for k, (a, b) in enumerate(zip(grads, tg)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-9, atol=1e-11, err_msg=f"input {k}")


class _AvgPool(opsnn.nn.Module):
    def forward(self, x):
        return ops.avg_pool2d(x, 2, ceil_mode=True)


def test_compiled_training_step_holds_the_backward_ops():
    n = opsnn.nn
    with n.init.seeded(5):
        model = n.Sequential(
            n.Conv2d(3, 4, 3, padding=1, bias=False),
            n.BatchNorm2d(4),
            n.ReLU(),
            n.MaxPool2d(2),
            _AvgPool(),
            n.Flatten(),
            n.Linear(4 * 2 * 2, 3),
        ).train()
    opt = opsnn.optim.SGD(list(model.parameters()), lr=0.1)
    loss_fn = n.CrossEntropyLoss()

    def train_step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    step = opsnn.compile(train_step)
    x = RNG.standard_normal((2, 3, 9, 9)).astype(np.float32)
    y = RNG.integers(0, 3, size=2)
    for _ in range(2):  # traced, then compiled
        step(opsnn.tensor(x), opsnn.tensor(y))
    nodes = step.graph().nodes
    kinds = [nd.op_type for nd in nodes]
    for op in ("BatchNormalizationGrad", "MaxPoolGrad", "AveragePoolGrad"):
        assert kinds.count(op) == 1, kinds
    pool = [nd for nd in nodes if nd.op_type == "MaxPool"]
    assert len(pool) == 1 and len(pool[0].outputs) == 2  # the forward made the Indices the backward reads


@pytest.mark.parametrize(
    "grad_op, attrs, n, sshape",
    [
        ("LayerNormalizationGrad", {"axis": 2}, 3, (5, 5)),
        ("RMSNormalizationGrad", {"axis": -1}, 2, (5,)),
        ("BatchNormalizationGrad", {}, 3, (6,)),
        ("GroupNormalizationGrad", {"num_groups": 3}, 3, (6,)),
    ],
)
def test_norm_grads_in_bfloat16_run_the_numba_kernels_through_the_float32_adapter(grad_op, attrs, n, sshape):
    import ml_dtypes

    bf = ml_dtypes.bfloat16
    x = RNG.standard_normal((4, 6, 5, 5)).astype(bf)
    g = RNG.standard_normal(x.shape).astype(bf)
    s = RNG.uniform(0.5, 1.5, sshape).astype(bf)
    rec = ops.get_op(grad_op, "opsnn")
    ins = [g, x, s]
    ex = ops.prepare(rec, [_t(a) for a in ins], attrs, num_outputs=n)
    native = grad_op == "BatchNormalizationGrad"  # reads and writes bfloat16 itself (float32 math)
    assert ex.kernel_name.endswith("_grad_numba") and ex.adapter != native
    got = _grad_op(grad_op, ins, attrs, n)
    ref = rec.reference([a.astype(np.float64) for a in ins], rec.bind_attrs(attrs))
    for k in range(n):
        assert got[k].dtype == bf
        # bfloat16 inputs and outputs (8 significant bits): against the float64 formula on the same inputs
        r = np.asarray(ref[k], np.float64)
        np.testing.assert_allclose(got[k].astype(np.float64), r, rtol=2e-2, atol=2e-2 * np.abs(r).max())


@pytest.mark.parametrize("grad_op, n", [("LayerNormalizationGrad", 3), ("RMSNormalizationGrad", 2)])
@pytest.mark.parametrize("rows", [5, 4096], ids=["serial", "parallel"])
def test_float32_norm_grad_rows_far_from_zero_match_float64(grad_op, n, rows):
    """float32 rows run float32 vector loops: a mean 1000 standard deviations from zero (the shifted
    statistics' worst case), rows of 300 (a partial block) and 4,096 rows (several float32 dScale /
    dBias partials per chunk) stay within float32 rounding of the float64 formula."""
    x = (RNG.standard_normal((rows, 300)) + 1000).astype(np.float32)
    g = RNG.standard_normal((rows, 300)).astype(np.float32)
    s = RNG.uniform(0.5, 1.5, 300).astype(np.float32)
    attrs = {"axis": -1, "epsilon": 1e-5}
    got = _grad_op(grad_op, [g, x, s], attrs, n)
    rec = ops.get_op(grad_op, "opsnn")
    ref = rec.reference([a.astype(np.float64) for a in (g, x, s)], rec.bind_attrs(attrs))
    for k, (a, r) in enumerate(zip(got, ref)):
        np.testing.assert_allclose(a, r, rtol=2e-4, atol=2e-4 * np.abs(r).max(), err_msg=f"output {k}")


@pytest.mark.parametrize("N", [2, 3, 8])
def test_float32_layer_norm_grad_of_short_tight_rows_keeps_the_mean_exact(N):
    """Found by `opsnn fuzz` (op_schema seed 1212817): rows of a few values around -2 that differ by ~0.1.
    dX = r (g - mean(g) - xhat mean(g xhat)) cancels to ~1e-3 of its terms there, so xhat's float32 error
    is magnified ~1000x, and rounding the row's mean to float32 put an error of |mean| / std ulps into
    xhat (0.3% in dX). The mean is split as the forward splits it (float32 part + rounding error)."""
    rows = 64
    center = RNG.uniform(-50, 50, (rows, 1))
    x = (center + RNG.uniform(0.02, 0.2, (rows, 1)) * RNG.standard_normal((rows, N))).astype(np.float32)
    g = RNG.standard_normal((rows, N)).astype(np.float32)
    s = np.float32(1.77)
    attrs = {"axis": -1, "epsilon": 1e-5}
    got = _grad_op("LayerNormalizationGrad", [g, x, s], attrs, 3)
    rec = ops.get_op("LayerNormalizationGrad", "opsnn")
    ref = rec.reference([a.astype(np.float64) for a in (g, x, np.asarray(s))], rec.bind_attrs(attrs))
    np.testing.assert_allclose(got[0], ref[0], rtol=2e-4, atol=2e-5, err_msg="dX")


@pytest.mark.parametrize("grad_op, n", [("LayerNormalizationGrad", 3), ("RMSNormalizationGrad", 2)])
@pytest.mark.parametrize("x_dtype", [np.float32, np.float64])
def test_norm_grad_with_a_bfloat16_scale_beside_wider_data(grad_op, n, x_dtype):
    """Found by `opsnn fuzz` (nan_inf seeds 14323, 14334): float32 dY and X with a bfloat16 Scale reached the
    kernel with the scale still bfloat16 (numba cannot type it: an untyped KernelError). The scale is taken in
    the data's dtype; NaN and Inf in X stay in their rows."""
    x = RNG.standard_normal((6, 8)).astype(x_dtype)
    x[1, 3], x[4, 0] = np.nan, np.inf
    g = RNG.standard_normal((6, 8)).astype(x_dtype)
    s = RNG.uniform(0.5, 1.5, 8).astype(opsnn.dtypes.bfloat16)
    attrs = {"axis": -1, "epsilon": 1e-5}
    got = _grad_op(grad_op, [g, x, s], attrs, n)
    rec = ops.get_op(grad_op, "opsnn")
    ref = rec.reference([a.astype(np.float64) for a in (g, x, s)], rec.bind_attrs(attrs))
    for k, (a, r) in enumerate(zip(got, ref)):
        a = np.asarray(a, np.float64)
        np.testing.assert_array_equal(np.isnan(a), np.isnan(r), err_msg=f"output {k}")
        fin = np.isfinite(r)
        np.testing.assert_allclose(a[fin], r[fin], rtol=2e-4, atol=2e-5, err_msg=f"output {k}")


@pytest.mark.parametrize("rows", [5, 1 << 20], ids=["serial", "parallel"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_grad_of_one_element_rows_is_exactly_zero(rows, dtype):
    """Found by `opsnn fuzz` (nan_inf seed 17583): a LayerNorm over one element is constant (its input minus its
    own mean), so dX is 0. The float32 rows recomputed dY * Scale in the dX pass, where 'contract' fused it into
    an FMA with the subtraction of its rounded mean: the product's rounding error times 1/sqrt(eps) (-3.2e-5;
    float64 rows 2.8e-13)."""
    x = RNG.standard_normal((rows, 1)).astype(dtype)
    g = RNG.standard_normal((rows, 1)).astype(dtype)
    s = np.array([-4.3211236], dtype)
    dx, dscale, dbias = _grad_op("LayerNormalizationGrad", [g, x, s], {"axis": -1, "epsilon": 1e-5}, 3)
    assert not np.asarray(dx).any(), np.abs(np.asarray(dx)).max()
    np.testing.assert_array_equal(np.asarray(dscale), 0.0)  # X-hat is 0 in every row
    np.testing.assert_allclose(np.asarray(dbias), g.astype(np.float64).sum(0), rtol=1e-5)


@pytest.mark.parametrize("shape", [(1, 5), (1, 1 << 15, 1)], ids=["serial", "parallel"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, opsnn.dtypes.bfloat16], ids=["f32", "f64", "bf16"])
@pytest.mark.parametrize("relu", [0, 1])
def test_batch_norm_grad_of_one_value_per_channel_is_exactly_zero(shape, dtype, relu):
    """Found by `opsnn fuzz` (nan_inf seed 63711): training-mode BatchNorm over one value per channel is
    constant, so dX is 0. The kernels wrote dX = A * dY + B * (X - mean) + K with K = -A * mean(dY) rounded on
    its own: 'contract' fused A * dY into an FMA with K and kept the product's rounding error (2.8e-5 with
    eps 1e-5). dX is now A * (dY - mean(dY)) + B * (X - mean): the difference is exact where they cancel."""
    x = RNG.standard_normal(shape).astype(dtype)
    g = RNG.standard_normal(shape).astype(dtype)
    s = RNG.uniform(-2.0, 2.0, shape[1]).astype(dtype)
    y = np.abs(RNG.standard_normal(shape)).astype(dtype)  # the fused ReLU's output: every dY counts
    ins = [g, x, s, None, None, y] if relu else [g, x, s]
    dx, dscale, dbias = _grad_op("BatchNormalizationGrad", ins, {"epsilon": 1e-5, "training_mode": 1, "relu": relu}, 3)
    assert not np.asarray(dx, np.float64).any(), np.abs(np.asarray(dx, np.float64)).max()
    np.testing.assert_array_equal(np.asarray(dscale, np.float64), 0.0)  # X-hat is 0 in every channel
    np.testing.assert_array_equal(np.asarray(dbias, np.float64), g.astype(np.float64).reshape(shape[1]))


@pytest.mark.parametrize(
    "shape, sshape", [((2, 3, 0, 5), (3, 0, 1)), ((0, 3, 4, 5), (3, 1, 1)), ((2, 3, 4, 5), (3, 1, 1))]
)
def test_layer_norm_grad_with_a_scale_over_the_leading_dims_and_empty_data(shape, sshape):
    """Found by `opsnn fuzz` (op_schema seed 73537): a Scale that varies over the non-normalized dims runs the
    reference as the kernel, whose dBias reshaped dY to (-1, *block): numpy cannot infer -1 beside a 0 in the
    block (an untyped KernelError). Against the float64 definition, empty shapes included."""
    x, g, s = RNG.standard_normal(shape), RNG.standard_normal(shape), RNG.uniform(0.5, 1.5, sshape)
    dx, ds, db = _grad_op("LayerNormalizationGrad", [g, x, s], {"axis": 2, "epsilon": 1e-5}, 3)
    assert dx.shape == shape and ds.shape == sshape and db.shape == shape[2:]
    np.testing.assert_allclose(db, g.sum(axis=(0, 1)), rtol=1e-12, atol=1e-12)
    if x.size:
        _check_fd(
            [dx, ds, db],
            _fwd("LayerNormalization", {"axis": 2, "epsilon": 1e-5}),
            [x, s, RNG.standard_normal(shape[2:])],
            [0, 1, 2],
            g,
        )
