"""Normalization ops against hand-written float64 numpy formulas (and onnx.reference for
LRN / LpNormalization / MeanVarianceNormalization).

Tolerances: float32 kernels compute statistics in float64 (LayerNorm/RMSNorm: float32 vector
sums per block joined in float64), so outputs match the float64 oracle to a few float32 ulps
(rtol/atol 1e-5); 16-bit inputs are compared with the
float64 oracle of the rounded input at 2e-2 (bfloat16: 8 mantissa bits, |y| up to ~4).
"""

import ml_dtypes
import numpy as np
import pytest

import opsnn
from opsnn.errors import DTypeError, ParamInvalidError
from opsnn.ops import get_op, run_op


def ln_oracle(x, w, b, axis, eps):
    x = x.astype(np.float64)
    axes = tuple(range(axis, x.ndim))
    m = x.mean(axis=axes, keepdims=True)
    v = ((x - m) ** 2).mean(axis=axes, keepdims=True)
    inv = 1 / np.sqrt(v + eps)
    y = (x - m) * inv * w
    return (y if b is None else y + b), m, inv


def rms_oracle(x, w, axis, eps):
    x = x.astype(np.float64)
    ms = (x * x).mean(axis=tuple(range(axis, x.ndim)), keepdims=True)
    return x / np.sqrt(ms + eps) * w


def group_oracle(x, w, b, G, eps):
    N, C = x.shape[:2]
    g = x.astype(np.float64).reshape(N, G, -1)
    m = g.mean(-1, keepdims=True)
    v = g.var(-1, keepdims=True)
    y = ((g - m) / np.sqrt(v + eps)).reshape(x.shape)
    sh = (1, C) + (1,) * (x.ndim - 2)
    return y * w.reshape(sh) + b.reshape(sh)


# -- LayerNormalization ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "shape,axis",
    [((7,), 0), ((3, 5), -1), ((3, 5), 0), ((2, 3, 5), 1), ((2, 3, 4, 5), -2), ((64, 1031), -1), ((5, 3, 4000), 2)],
)
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_matches_oracle(shape, axis, with_bias, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    a = axis % len(shape)
    w = rng.standard_normal(shape[a:]).astype(np.float32)
    b = rng.standard_normal(shape[a:]).astype(np.float32) if with_bias else None
    ins = [x, w] + ([b] if with_bias else [])
    ex = opsnn.ops.prepare(get_op("LayerNormalization"), ins, {"axis": axis, "epsilon": 1e-5}, num_outputs=3)
    assert ex.kernel_name == "layer_norm_numba"
    y, m, inv = ex.run()
    wy, wm, winv = ln_oracle(x, w, b, a, 1e-5)
    np.testing.assert_allclose(y.numpy(), wy, rtol=1e-5, atol=1e-5)
    assert m.shape == wm.shape and m.dtype == np.float32 and inv.dtype == np.float32
    np.testing.assert_allclose(m.numpy(), wm, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(inv.numpy(), winv, rtol=1e-5)
    (yr,) = run_op("LayerNormalization", ins, {"axis": axis}, algo="reference")
    np.testing.assert_allclose(yr.numpy(), y.numpy(), rtol=1e-5, atol=1e-5)


def test_layer_norm_functional(rng):
    x = rng.standard_normal((4, 6, 8)).astype(np.float32)
    w = rng.standard_normal((6, 8)).astype(np.float32)
    b = rng.standard_normal((6, 8)).astype(np.float32)
    y = opsnn.ops.layer_norm(opsnn.tensor(x), (6, 8), w, b, eps=1e-3)
    np.testing.assert_allclose(y.numpy(), ln_oracle(x, w, b, 1, 1e-3)[0], rtol=1e-5, atol=1e-5)
    y1 = opsnn.ops.layer_norm(x, 8)
    np.testing.assert_allclose(y1.numpy(), ln_oracle(x, 1.0, None, 2, 1e-5)[0], rtol=1e-5, atol=1e-5)
    assert opsnn.aclnn.layer_norm.prepare(x, (8,)).kernel_name == "layer_norm_numba"
    with pytest.raises(ParamInvalidError, match="normalized_shape"):
        opsnn.ops.layer_norm(x, (6,))
    # the weight passed where the dims go: one short line naming the fix, not the tensor's values
    with pytest.raises(ParamInvalidError, match="pass weight= and bias= by keyword") as ei:
        opsnn.ops.layer_norm(x, w, b)
    assert len(str(ei.value)) < 300


def test_layer_norm_large_offset_is_accurate(rng):
    """Shifted float64 sums: no cancellation when |mean| >> std (a naive float32 E[x²]-E[x]²
    would lose every digit here)."""
    x = (1e4 + rng.standard_normal((16, 777)) * 1e-2).astype(np.float32)
    y = opsnn.ops.layer_norm(x, (777,), eps=0.0)
    np.testing.assert_allclose(y.numpy(), ln_oracle(x, 1.0, None, 1, 0.0)[0], rtol=1e-4, atol=1e-4)
    x64 = 1e8 + rng.standard_normal((4, 300))
    y64 = opsnn.ops.layer_norm(x64, (300,), eps=0.0)
    np.testing.assert_allclose(y64.numpy(), ln_oracle(x64, 1.0, None, 1, 0.0)[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("N", [1, 2, 3, 7, 8, 9, 64, 513, 768, 1500])
def test_layer_norm_float32_rows_edge_cases(N, rng):
    """The float32 row kernel: one pass shifted by the mean of the first 8 elements, a second
    (corrected two-pass) pass when they are outliers, blocks of 512 float32 partial sums, the
    mean split in the normalize pass; constant rows; the parallel variant (rows * N large)."""
    from opsnn.kernels.cpu import norm as K

    x = rng.standard_normal((6, N)).astype(np.float32) * 3 + 5
    x[1, :8] += 1e3  # outliers first: the second-pass route
    x[2] = 7.25  # constant row: var 0
    x[3] = (1e4 + rng.standard_normal(N) * 1e-2).astype(np.float32)  # |mean| >> std
    x[4, :4] = -50
    w = rng.standard_normal(N).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    for par in (False, True):
        for bias in (b, None):
            y = np.empty_like(x)
            st = np.empty(12)
            K.layer_norm(x, w, bias, y, st, 6, N, 1e-5, False, par)
            wy, wm, winv = ln_oracle(x, w, bias, 1, 1e-5)
            np.testing.assert_allclose(y, wy, rtol=1e-5, atol=1e-4 if N > 1 else 1e-5)
            np.testing.assert_allclose(st[:6], wm[:, 0], rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(st[6:], winv[:, 0], rtol=1e-5)
        y = np.empty_like(x)
        K.layer_norm(x, w, None, y, np.empty(12), 6, N, 1e-5, True, par)
        np.testing.assert_allclose(y, rms_oracle(x, w, 1, 1e-5), rtol=1e-5, atol=1e-5)
    if N != 768:
        return
    big = rng.standard_normal(((1 << 19) // 768 + 3, 768)).astype(np.float32)  # the graph's parallel plan
    np.testing.assert_allclose(
        opsnn.ops.layer_norm(big, (768,)).numpy(), ln_oracle(big, 1.0, None, 1, 1e-5)[0], rtol=1e-5, atol=1e-5
    )


def test_layer_norm_broadcast_params_and_fallback(rng):
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    w = rng.standard_normal((1, 5)).astype(np.float32)  # broadcasts over the block: fast kernel
    ex = opsnn.ops.prepare(get_op("LayerNormalization"), [x, w], {"axis": 1})
    assert ex.kernel_name == "layer_norm_numba"
    np.testing.assert_allclose(ex.run().numpy(), ln_oracle(x, w, None, 1, 1e-5)[0], rtol=1e-5, atol=1e-5)
    w2 = rng.standard_normal((3, 1, 5)).astype(np.float32)  # varies over a non-normalized dim
    ex2 = opsnn.ops.prepare(get_op("LayerNormalization"), [x, w2], {"axis": 2})
    assert ex2.kernel_name == "reference" and "layer_norm_numba" in ex2.reason
    np.testing.assert_allclose(ex2.run().numpy(), ln_oracle(x, w2, None, 2, 1e-5)[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(ParamInvalidError, match="broadcast"):
        run_op("LayerNormalization", [x, np.ones((4, 4), np.float32)], {"axis": 1})


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_layer_norm_16bit(dtype, rng):
    x = rng.standard_normal((6, 40)).astype(dtype)
    w = rng.standard_normal(40).astype(dtype)
    b = rng.standard_normal(40).astype(dtype)
    ex = opsnn.ops.prepare(get_op("LayerNormalization"), [x, w, b], {}, num_outputs=3)
    assert ex.kernel_name == "layer_norm_numba" and ex.adapter
    y, m, inv = ex.run()
    assert y.dtype == np.dtype(dtype) and m.dtype == np.float32  # stash_type=1: float32 statistics
    want = ln_oracle(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), 1, 1e-5)
    np.testing.assert_allclose(y.numpy().astype(np.float64), want[0], rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(m.numpy(), want[1], rtol=1e-5, atol=1e-6)
    (_, m0, _) = run_op("LayerNormalization", [x, w], {"stash_type": 0}, num_outputs=3)
    assert m0.dtype == np.dtype(dtype)


def test_layer_norm_non_contiguous_nan_and_empty(rng, no_leak):
    a = rng.standard_normal((9, 6)).astype(np.float32)
    t = opsnn.from_numpy(a.T)
    y = opsnn.ops.layer_norm(t, (9,))
    np.testing.assert_allclose(y.numpy(), ln_oracle(a.T, 1.0, None, 1, 1e-5)[0], rtol=1e-5, atol=1e-5)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    x[1, 4] = np.nan
    yn = opsnn.ops.layer_norm(x, (8,)).numpy()
    assert np.all(np.isnan(yn[1])) and np.all(np.isfinite(yn[[0, 2]]))
    e = opsnn.ops.layer_norm(np.zeros((0, 8), np.float32), (8,))
    assert e.shape == (0, 8)
    del t, y, e


def test_layer_norm_bad_inputs(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    with pytest.raises(ParamInvalidError, match="axis"):
        run_op("LayerNormalization", [x, np.ones(4, np.float32)], {"axis": 2})
    with pytest.raises(DTypeError):
        run_op("LayerNormalization", [x.astype(np.int32), np.ones(4, np.int32)], {})
    with pytest.raises(opsnn.errors.ParamNullptrError):
        run_op("LayerNormalization", [x, None], {})


# -- RMSNormalization -----------------------------------------------------------------------------
@pytest.mark.parametrize("shape,axis", [((5,), 0), ((3, 5), -1), ((2, 3, 5), 1), ((64, 1031), 1)])
def test_rms_norm_matches_oracle(shape, axis, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(shape[axis % len(shape) :]).astype(np.float32)
    ex = opsnn.ops.prepare(get_op("RMSNormalization"), [x, w], {"axis": axis, "epsilon": 1e-6})
    assert ex.kernel_name == "rms_norm_numba"
    np.testing.assert_allclose(ex.run().numpy(), rms_oracle(x, w, axis % len(shape), 1e-6), rtol=1e-5, atol=1e-5)
    (r,) = run_op("RMSNormalization", [x, w], {"axis": axis, "epsilon": 1e-6}, algo="reference")
    np.testing.assert_allclose(r.numpy(), rms_oracle(x, w, axis % len(shape), 1e-6), rtol=1e-5, atol=1e-5)


def test_rms_norm_functional_and_dtypes(rng):
    x = rng.standard_normal((4, 16)).astype(np.float32)
    y = opsnn.ops.rms_norm(x, (16,))  # eps=None: float32 machine epsilon, like torch
    np.testing.assert_allclose(y.numpy(), rms_oracle(x, 1.0, 1, np.finfo(np.float32).eps), rtol=1e-5)
    w64 = rng.standard_normal(16)
    (y64,) = run_op("RMSNormalization", [x, w64], {})
    assert y64.dtype == np.float64  # Y takes the scale's dtype (ONNX V)
    np.testing.assert_allclose(y64.numpy(), rms_oracle(x, w64, 1, 1e-5), rtol=1e-5)
    h = x.astype(ml_dtypes.bfloat16)
    yh = opsnn.ops.rms_norm(h, 16, eps=1e-5)
    assert yh.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(
        yh.numpy().astype(np.float64), rms_oracle(h.astype(np.float64), 1.0, 1, 1e-5), rtol=2e-2, atol=2e-2
    )
    with pytest.raises(ParamInvalidError):
        opsnn.ops.rms_norm(x, (4,))


# -- BatchNormalization -----------------------------------------------------------------------------
def bn_oracle(x, s, b, m, v, eps):
    sh = (1, -1) + (1,) * (x.ndim - 2)
    return (x.astype(np.float64) - m.reshape(sh)) / np.sqrt(v.reshape(sh) + eps) * s.reshape(sh) + b.reshape(sh)


def _bn_params(C, rng):
    return (
        rng.standard_normal(C).astype(np.float32),
        rng.standard_normal(C).astype(np.float32),
        rng.standard_normal(C).astype(np.float32),
        rng.uniform(0.5, 2, C).astype(np.float32),
    )


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (3, 4, 5, 7), (8, 16, 33, 9)])
def test_batch_norm_inference(shape, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    s, b, m, v = _bn_params(shape[1], rng)
    ex = opsnn.ops.prepare(get_op("BatchNormalization"), [x, s, b, m, v], {"epsilon": 1e-3})
    assert ex.kernel_name == "batch_norm_numba"
    np.testing.assert_allclose(ex.run().numpy(), bn_oracle(x, s, b, m, v, 1e-3), rtol=1e-5, atol=1e-5)
    y = opsnn.ops.batch_norm(x, m, v, s, b, eps=1e-3)
    np.testing.assert_allclose(y.numpy(), bn_oracle(x, s, b, m, v, 1e-3), rtol=1e-5, atol=1e-5)
    y0 = opsnn.ops.batch_norm(opsnn.tensor(x), m, v)
    np.testing.assert_allclose(y0.numpy(), bn_oracle(x, np.ones(1), np.zeros(1), m, v, 1e-5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(6, 3), (2, 3, 4, 5), (4, 8, 40, 30)])
def test_batch_norm_training(shape, rng):
    x = (rng.standard_normal(shape) * 2 + 3).astype(np.float32)
    s, b, m, v = _bn_params(shape[1], rng)
    ex = opsnn.ops.prepare(
        get_op("BatchNormalization"), [x, s, b, m, v], {"training_mode": 1, "momentum": 0.8}, num_outputs=3
    )
    assert ex.kernel_name == "batch_norm_numba"
    y, rm, rv = ex.run()
    axes = (0,) + tuple(range(2, x.ndim))
    bm, bv = x.astype(np.float64).mean(axes), x.astype(np.float64).var(axes)
    np.testing.assert_allclose(y.numpy(), bn_oracle(x, s, b, bm, bv, 1e-5), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rm.numpy(), m * 0.8 + bm * 0.2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rv.numpy(), v * 0.8 + bv * 0.2, rtol=1e-5, atol=1e-6)
    ty, tm, tv = opsnn.ops.batch_norm(x, m, v, s, b, training=True, momentum=0.2)  # torch momentum
    np.testing.assert_allclose(tm.numpy(), rm.numpy(), rtol=1e-6)
    r = run_op(
        "BatchNormalization", [x, s, b, m, v], {"training_mode": 1, "momentum": 0.8}, num_outputs=3, algo="reference"
    )
    for got, want in zip((y, rm, rv), r):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def test_batch_norm_16bit_empty_and_errors(rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float16)
    s, b, m, v = (p.astype(np.float16) for p in _bn_params(3, rng))
    y = opsnn.ops.batch_norm(x, m, v, s, b)
    assert y.dtype == np.float16
    want = bn_oracle(x, *(p.astype(np.float64) for p in (s, b, m, v)), 1e-5)
    np.testing.assert_allclose(y.numpy().astype(np.float64), want, rtol=2e-2, atol=2e-2)
    assert opsnn.ops.batch_norm(np.zeros((0, 3, 4), np.float32), m, v).shape == (0, 3, 4)
    x32 = x.astype(np.float32)
    with pytest.raises(ParamInvalidError, match="training_mode"):
        run_op("BatchNormalization", [x32, s, b, m, v], {}, num_outputs=3)
    with pytest.raises(ParamInvalidError, match="shape"):
        run_op("BatchNormalization", [x32, np.ones(4, np.float32), b, m, v], {})
    with pytest.raises(ParamInvalidError, match="rank"):
        opsnn.ops.batch_norm(np.ones(3, np.float32), m, v)


# -- GroupNormalization / InstanceNormalization ----------------------------------------------------
@pytest.mark.parametrize(
    "shape,G", [((2, 4, 5), 2), ((3, 6, 4, 5), 3), ((2, 8, 7, 7), 8), ((2, 6), 1), ((4, 32, 33, 17), 8)]
)
def test_group_norm_matches_oracle(shape, G, rng):
    x = (rng.standard_normal(shape) + 1.5).astype(np.float32)
    C = shape[1]
    w, b = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    ex = opsnn.aclnn.group_norm.prepare(x, G, w, b, eps=1e-4)
    assert ex.kernel_name == "group_norm_numba"
    np.testing.assert_allclose(ex.run().numpy(), group_oracle(x, w, b, G, 1e-4), rtol=1e-5, atol=1e-5)
    (r,) = run_op("GroupNormalization", [x, w, b], {"num_groups": G, "epsilon": 1e-4}, algo="reference")
    np.testing.assert_allclose(r.numpy(), group_oracle(x, w, b, G, 1e-4), rtol=1e-5, atol=1e-5)


def test_group_norm_errors_and_defaults(rng):
    x = rng.standard_normal((2, 6, 5)).astype(np.float32)
    np.testing.assert_allclose(
        opsnn.ops.group_norm(x, 2).numpy(), group_oracle(x, np.ones(6), np.zeros(6), 2, 1e-5), rtol=1e-5, atol=1e-5
    )
    with pytest.raises(ParamInvalidError, match="divide"):
        opsnn.ops.group_norm(x, 4)
    with pytest.raises(ParamInvalidError, match="per channel"):
        run_op("GroupNormalization", [x, np.ones(2, np.float32), np.zeros(2, np.float32)], {"num_groups": 2})
    with pytest.raises(opsnn.errors.ParamNullptrError):
        run_op("GroupNormalization", [x, np.ones(6, np.float32), np.zeros(6, np.float32)], {})


@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 2, 1, 3), (2, 3, 4, 5), (3, 16, 40, 41)])
def test_instance_norm_matches_oracle(shape, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    C = shape[1]
    w, b = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    ex = opsnn.aclnn.instance_norm.prepare(opsnn.tensor(x), w, b)
    assert ex.kernel_name == "instance_norm_numba"
    np.testing.assert_allclose(ex.run().numpy(), group_oracle(x, w, b, C, 1e-5), rtol=1e-5, atol=1e-5)
    with pytest.raises(ParamInvalidError):
        run_op("InstanceNormalization", [x, w[:1], b], {})


def test_group_and_instance_norm_16bit_and_non_contiguous(rng):
    x = rng.standard_normal((2, 4, 6)).astype(ml_dtypes.bfloat16)
    w, b = np.ones(4, ml_dtypes.bfloat16), np.zeros(4, ml_dtypes.bfloat16)
    y = opsnn.ops.group_norm(x, 2, w, b)
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(
        y.numpy().astype(np.float64), group_oracle(x, np.ones(4), np.zeros(4), 2, 1e-5), rtol=3e-2, atol=3e-2
    )
    a = rng.standard_normal((6, 4, 2)).astype(np.float32)
    t = opsnn.tensor(a).transpose(0, 2)  # (2, 4, 6) view
    np.testing.assert_allclose(
        opsnn.ops.instance_norm(t).numpy(),
        group_oracle(t.numpy(), np.ones(4), np.zeros(4), 4, 1e-5),
        rtol=1e-5,
        atol=1e-5,
    )


# -- LpNormalization / MeanVarianceNormalization / LRN (onnx.reference as the oracle) ----------------
def _onnx_ref(op, x, **attrs):
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    node = helper.make_node(op, ["x"], ["y"], **attrs)
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return ReferenceEvaluator(helper.make_model(g, opset_imports=[helper.make_opsetid("", 22)])).run(None, {"x": x})[0]


@pytest.mark.filterwarnings("ignore:invalid value encountered")
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_lp_normalization(p, axis, rng):
    x = rng.uniform(0.1, 2, (3, 4, 5)).astype(np.float32)  # positive: onnx.reference's p=1 omits abs()
    x[1, 2] = 0.0
    ex = opsnn.ops.prepare(get_op("LpNormalization"), [x], {"axis": axis, "p": p})
    assert ex.kernel_name == "lp_norm_numpy"
    np.testing.assert_allclose(ex.run().numpy(), _onnx_ref("LpNormalization", x, axis=axis, p=p), rtol=1e-5, atol=1e-6)
    xn = -x  # the norm uses |x|: the sign carries through
    (yn,) = run_op("LpNormalization", [xn], {"axis": axis, "p": p})
    np.testing.assert_allclose(yn.numpy(), -ex.run().numpy(), rtol=1e-6)
    z = np.zeros((2, 3), np.float32)
    assert np.array_equal(run_op("LpNormalization", [z], {"p": p})[0].numpy(), z)
    with pytest.raises(ParamInvalidError, match="'p'"):
        run_op("LpNormalization", [x], {"p": 3})


@pytest.mark.parametrize("axes", [(0, 2, 3), (2, 3), (1,)])
def test_mean_variance_normalization(axes, rng):
    x = (rng.standard_normal((3, 4, 5, 6)) * 2 + 1).astype(np.float32)
    ex = opsnn.ops.prepare(get_op("MeanVarianceNormalization"), [x], {"axes": list(axes)})
    assert ex.kernel_name == "mvn_numpy"
    np.testing.assert_allclose(
        ex.run().numpy(), _onnx_ref("MeanVarianceNormalization", x, axes=list(axes)), rtol=1e-4, atol=1e-5
    )
    with pytest.raises(ParamInvalidError):
        run_op("MeanVarianceNormalization", [x], {"axes": [0, 4]})
    with pytest.raises(ParamInvalidError, match="duplicates"):
        run_op("MeanVarianceNormalization", [x], {"axes": [1, -3]})


def lrn_oracle(x, size, alpha, beta, bias):
    w = x.astype(np.float64)
    C = x.shape[1]
    y = np.empty_like(w)
    for c in range(C):  # the ONNX spec's window, written out
        lo, hi = max(0, c - (size - 1) // 2), min(C - 1, c + size // 2)
        y[:, c] = w[:, c] / (bias + alpha / size * (w[:, lo : hi + 1] ** 2).sum(1)) ** beta
    return y


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
def test_lrn(size, rng):
    x = rng.standard_normal((2, 7, 4, 3)).astype(np.float32)
    attrs = {"size": size, "alpha": 1e-2, "beta": 0.75, "bias": 1.5}
    ex = opsnn.ops.prepare(get_op("LRN"), [x], attrs)
    assert ex.kernel_name == "lrn_numpy"
    np.testing.assert_allclose(ex.run().numpy(), lrn_oracle(x, size, 1e-2, 0.75, 1.5), rtol=1e-5, atol=1e-6)
    # onnx.reference's LRN loops over x.shape[0] for the channel: only valid when N == C
    xs = rng.standard_normal((5, 5, 3, 2)).astype(np.float32)
    (ys,) = run_op("LRN", [xs], attrs)
    np.testing.assert_allclose(ys.numpy(), _onnx_ref("LRN", xs, **attrs), rtol=1e-5, atol=1e-6)
    (r,) = run_op("LRN", [x], attrs, algo="reference")
    np.testing.assert_allclose(r.numpy(), ex.run().numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ParamInvalidError):
        run_op("LRN", [x], {"size": 0})


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_lrn_nan_inf_stay_in_their_window(bad, rng):
    """A NaN or Inf in channel 1 reaches only the channels whose window holds channel 1 (found by
    tests/fuzz: a prefix sum over channels carried it into every later channel)."""
    x = rng.standard_normal((2, 9, 3, 2)).astype(np.float32)
    x[0, 1, 2, 1] = bad
    attrs = {"size": 3, "alpha": 1e-2, "beta": 0.75, "bias": 1.5}
    (y,) = run_op("LRN", [x], attrs)
    want = lrn_oracle(x, 3, 1e-2, 0.75, 1.5)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-6)  # NaN where the oracle has NaN
    assert np.isfinite(y.numpy()[:, 3:]).all() and np.isfinite(y.numpy()[1]).all()
    with pytest.raises(opsnn.errors.ParamNullptrError):
        run_op("LRN", [x], {})
