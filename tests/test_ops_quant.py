"""Quantization ops against independent oracles: onnx.reference, onnxruntime, hand-written
formulas, and each record's numpy reference (forced with ``algo="reference"``).

Integer codes must match exactly (rounding half to even, saturation); dequantized floats to
rtol 1e-6 (float32) or 1e-2 (16-bit outputs). Float8 codes must match bit for bit.
"""

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import opsnn
from opsnn.errors import DTypeError, InferShapeError, ParamInvalidError

ops = opsnn.ops
aclnn = opsnn.aclnn


def onnx_ref(op, inputs, attrs):
    node = helper.make_node(op, [f"i{k}" for k in range(len(inputs))], ["o"], **attrs)
    return ReferenceEvaluator(node).run(None, {f"i{k}": a for k, a in enumerate(inputs)})[0]


def run(op, inputs, attrs=None, algo=None):
    return ops.run_op(op, inputs, attrs or {}, algo=algo)[0].numpy()


def bits(a):
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a


# -- QuantizeLinear -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("zdt", [np.int8, np.uint8])
def test_quantize_per_tensor_rounding_and_saturation(zdt):
    x = np.array([-1000, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.49, 1000, np.inf, -np.inf, np.nan], np.float32)
    zp = np.array(3, zdt)
    got = run("QuantizeLinear", [x, np.float32(1.0), zp])
    info = np.iinfo(zdt)
    # half to even, + zero point, saturate; NaN -> lowest code (as onnxruntime)
    want = np.clip(
        np.array([-1000, -2, -2, 0, 0, 2, 2, 3, 1000, 10**9, -(10**9), info.min - 3]) + 3, info.min, info.max
    ).astype(zdt)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(run("QuantizeLinear", [x, np.float32(1.0), zp], algo="reference"), want)
    finite = x[np.isfinite(x)]
    np.testing.assert_array_equal(
        run("QuantizeLinear", [finite, np.float32(1.0), zp]),
        onnx_ref("QuantizeLinear", [finite, np.float32(1.0), zp], {}),
    )


def test_quantize_fast_kernel_and_onnx_reference(rng, no_leak):
    x = (rng.standard_normal((3, 5, 7)) * 50).astype(np.float32)
    for zdt, z in ((np.uint8, 128), (np.int8, -3)):
        s, zp = np.float32(0.37), np.array(z, zdt)
        ex = aclnn.quantize_linear.prepare(opsnn.tensor(x), opsnn.tensor(s), opsnn.tensor(zp))
        assert ex.kernel_name == "quantize_int8_numba"
        np.testing.assert_array_equal(ex.run().numpy(), onnx_ref("QuantizeLinear", [x, s, zp], {}))
    # the functional API: Python scale and zero point, dtype picks the code type
    y = ops.quantize_linear(opsnn.tensor(x), 0.37, 5, dtype="int8")
    assert y.dtype == np.int8
    np.testing.assert_array_equal(y.numpy(), onnx_ref("QuantizeLinear", [x, np.float32(0.37), np.int8(5)], {}))
    # no zero point -> uint8 with zero point 0
    np.testing.assert_array_equal(
        ops.quantize_linear(opsnn.tensor(x), 0.37).numpy(), onnx_ref("QuantizeLinear", [x, np.float32(0.37)], {})
    )


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_quantize_per_axis(rng, axis):
    x = (rng.standard_normal((4, 6, 5)) * 20).astype(np.float32)
    n = x.shape[axis]
    s = rng.uniform(0.05, 0.5, n).astype(np.float32)
    zp = rng.integers(-20, 20, n).astype(np.int8)
    want = onnx_ref("QuantizeLinear", [x, s, zp], {"axis": axis})
    for algo in (None, "reference"):
        np.testing.assert_array_equal(run("QuantizeLinear", [x, s, zp], {"axis": axis}, algo), want)
    dq = run("DequantizeLinear", [want, s, zp], {"axis": axis})
    np.testing.assert_allclose(dq, onnx_ref("DequantizeLinear", [want, s, zp], {"axis": axis}), rtol=1e-6)


@pytest.mark.parametrize("shape,axis,block", [((3, 10), 1, 4), ((6, 5, 2), 0, 4), ((2, 7, 3), 1, 7), ((4, 9), -1, 2)])
def test_blocked(rng, shape, axis, block):
    x = (rng.standard_normal(shape) * 10).astype(np.float32)
    sshape = list(shape)
    sshape[axis] = -(-shape[axis] // block)
    s = rng.uniform(0.05, 0.5, sshape).astype(np.float32)
    zp = rng.integers(0, 255, sshape).astype(np.uint8)
    attrs = {"axis": axis, "block_size": block}
    want = onnx_ref("QuantizeLinear", [x, s, zp], attrs)
    for algo in (None, "reference"):
        np.testing.assert_array_equal(run("QuantizeLinear", [x, s, zp], attrs, algo), want)
        np.testing.assert_allclose(
            run("DequantizeLinear", [want, s, zp], attrs, algo),
            onnx_ref("DequantizeLinear", [want, s, zp], attrs),
            rtol=1e-6,
        )
    assert (
        aclnn.dequantize_linear.prepare(want, s, zp, axis=axis, block_size=block).kernel_name == "dequantize_int8_numba"
    )


def test_parallel_paths(rng):
    x = (rng.standard_normal((64, 33, 500)) * 30).astype(np.float32)  # > PARALLEL_MIN elements
    s = rng.uniform(0.1, 0.3, 33).astype(np.float32)
    zp = rng.integers(-10, 10, 33).astype(np.int8)
    ex = aclnn.quantize_linear.prepare(x, s, zp, axis=1)
    assert ex.kernel_name == "quantize_int8_numba" and ex.plan.parallel
    q = ex.run().numpy()
    np.testing.assert_array_equal(q, onnx_ref("QuantizeLinear", [x, s, zp], {"axis": 1}))
    ex = aclnn.dequantize_linear.prepare(q, s, zp, axis=1)
    assert ex.kernel_name == "dequantize_int8_numba" and ex.plan.parallel
    np.testing.assert_allclose(ex.run().numpy(), onnx_ref("DequantizeLinear", [q, s, zp], {"axis": 1}), rtol=1e-6)


INT_TYPES = [np.int16, np.uint16] + [
    getattr(ml_dtypes, n) for n in ("int4", "uint4", "int2", "uint2") if hasattr(ml_dtypes, n)
]


@pytest.mark.parametrize("zdt", INT_TYPES)
def test_other_integer_types(rng, zdt):
    x = (rng.standard_normal((3, 8)) * 300).astype(np.float32)
    s = np.array([2.0, 40.0, 0.5], np.float32)
    zp = np.array([0, 1, 1], dtype=zdt)
    want = onnx_ref("QuantizeLinear", [x, s, zp], {"axis": 0})
    ex = aclnn.quantize_linear.prepare(x, s, zp, axis=0)
    assert ex.kernel_name == "quantize_numpy"
    got = ex.run().numpy()
    assert got.dtype == np.dtype(zdt)
    np.testing.assert_array_equal(got.astype(np.int32), want.astype(np.int32))
    lo, hi = int(ml_dtypes.iinfo(zdt).min), int(ml_dtypes.iinfo(zdt).max)
    assert got.astype(np.int32).min() >= lo and got.astype(np.int32).max() <= hi
    np.testing.assert_array_equal(
        run("QuantizeLinear", [x, s, zp], {"axis": 0}, "reference").astype(np.int32), want.astype(np.int32)
    )
    dq = run("DequantizeLinear", [got, s, zp], {"axis": 0})
    np.testing.assert_allclose(dq, onnx_ref("DequantizeLinear", [got, s, zp], {"axis": 0}), rtol=1e-6)


F8 = [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2fnuz]


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("fdt", F8)
def test_float8(fdt, saturate):
    x = np.array([0, 0.3, -1.7, 100, 447, 449, 500, 1e5, -1e5, 57344, 70000, np.inf, -np.inf, np.nan], np.float32)
    s = np.float32(2.0)
    zp = np.zeros((), fdt)
    attrs = {"saturate": saturate}
    want = onnx_ref("QuantizeLinear", [x, s, zp], attrs)
    for algo in (None, "reference"):
        got = run("QuantizeLinear", [x, s, zp], attrs, algo)
        assert got.dtype == np.dtype(fdt)
        np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32)))
        np.testing.assert_array_equal(
            bits(got)[~np.isnan(want.astype(np.float32))], bits(want)[~np.isnan(want.astype(np.float32))]
        )
    if saturate:
        assert np.isfinite(got.astype(np.float32)[:-1]).all()  # everything but NaN clips to the largest code
    # output_dtype alone (no zero point) picks the type too
    code = {
        ml_dtypes.float8_e4m3fn: TensorProto.FLOAT8E4M3FN,
        ml_dtypes.float8_e5m2: TensorProto.FLOAT8E5M2,
        ml_dtypes.float8_e4m3fnuz: TensorProto.FLOAT8E4M3FNUZ,
        ml_dtypes.float8_e5m2fnuz: TensorProto.FLOAT8E5M2FNUZ,
    }[fdt]
    assert run("QuantizeLinear", [x, s], {"output_dtype": code, "saturate": saturate}).dtype == np.dtype(fdt)
    q = want[np.isfinite(want.astype(np.float32))]
    np.testing.assert_array_equal(run("DequantizeLinear", [q, s]), onnx_ref("DequantizeLinear", [q, s], {}))


def test_float4_and_float6(rng):
    x = (rng.standard_normal(20) * 10).astype(np.float32)
    for name in ("float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn"):
        if not hasattr(ml_dtypes, name):
            continue
        fdt = getattr(ml_dtypes, name)
        zp = np.zeros((), fdt)
        got = run("QuantizeLinear", [x, np.float32(0.5), zp])
        want = (x / np.float32(0.5)).astype(fdt)  # these types saturate by construction
        np.testing.assert_array_equal(bits(got), bits(want))
        np.testing.assert_array_equal(
            run("DequantizeLinear", [got, np.float32(0.5), zp]), got.astype(np.float32) * np.float32(0.5)
        )


@pytest.mark.parametrize("dt", [np.float16, ml_dtypes.bfloat16])
def test_16bit_inputs_and_outputs(rng, dt):
    x = (rng.standard_normal((4, 9)) * 8).astype(dt)
    s = np.asarray(0.25, dt)
    zp = np.int8(-4)
    got = run("QuantizeLinear", [x, s, zp])
    np.testing.assert_array_equal(got, onnx_ref("QuantizeLinear", [x, s, zp], {}))
    y = run("DequantizeLinear", [got, s, zp])
    assert y.dtype == np.dtype(dt)
    want = (got.astype(np.float32) + 4) * 0.25
    np.testing.assert_allclose(y.astype(np.float32), want, rtol=1e-2)
    # output_dtype overrides the scale's type
    y32 = run("DequantizeLinear", [got, s, zp], {"output_dtype": TensorProto.FLOAT})
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, want, rtol=1e-6)
    # precision: divide in float32 even with a 16-bit scale
    p = run("QuantizeLinear", [x, s, zp], {"precision": TensorProto.FLOAT})
    np.testing.assert_array_equal(p, np.clip(np.rint(x.astype(np.float32) / np.float32(0.25)) - 4, -128, 127))


def test_int32_dequantize(rng):
    x = rng.integers(-(2**31), 2**31 - 1, 50, dtype=np.int64).astype(np.int32)
    s = np.float32(1e-4)
    got = run("DequantizeLinear", [x, s])
    np.testing.assert_allclose(got, x.astype(np.float64) * np.float64(s), rtol=1e-7)


def test_non_contiguous_and_empty(no_leak, rng):
    a = (rng.standard_normal((6, 4)) * 9).astype(np.float32)
    view = opsnn.from_numpy(a).transpose(0, 1)
    assert not view.is_contiguous()
    s = rng.uniform(0.1, 0.5, 6).astype(np.float32)
    q = ops.quantize_linear(view, opsnn.tensor(s), opsnn.tensor(np.zeros(6, np.int8)), axis=1)
    np.testing.assert_array_equal(
        q.numpy(), onnx_ref("QuantizeLinear", [np.ascontiguousarray(a.T), s, np.zeros(6, np.int8)], {"axis": 1})
    )
    qv = opsnn.from_numpy(np.ascontiguousarray(q.numpy().T)).transpose(0, 1)
    np.testing.assert_allclose(
        ops.dequantize_linear(qv, opsnn.tensor(s), opsnn.tensor(np.zeros(6, np.int8)), axis=1).numpy(),
        q.numpy().astype(np.float32) * s,
        rtol=1e-6,
    )
    e = np.zeros((0, 3), np.float32)
    assert ops.quantize_linear(opsnn.tensor(e), 0.5).shape == (0, 3)
    assert ops.dequantize_linear(opsnn.tensor(np.zeros((0, 3), np.uint8)), 0.5).shape == (0, 3)
    y, sc, zp = ops.dynamic_quantize_linear(opsnn.tensor(e))
    assert y.shape == (0, 3) and float(sc.numpy()) == 1.0 and int(zp.numpy()) == 0


# -- DynamicQuantizeLinear -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x",
    [
        np.array([0, 2, -3, -2.5, 1.34, 0.5], np.float32),
        np.array([-1.0, -2.1, -1.3, -2.5, -3.34, -4.0], np.float32),
        np.array([1, 2.1, 1.3, 2.5, 3.34, 4.0, 1.5, 2.6, 3.9, 4.0, 3.0, 2.345], np.float32),
    ],
)
def test_dynamic_quantize_matches_onnx_reference(x):
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
    want = ReferenceEvaluator(node).run(None, {"x": x})
    for algo in (None, "reference"):
        got = ops.dynamic_quantize_linear(opsnn.tensor(x), algo=algo)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_allclose(g.numpy(), w, rtol=1e-6)


def test_dynamic_quantize_edge_cases_match_onnxruntime(rng):
    ort = pytest.importorskip("onnxruntime")
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [
            helper.make_tensor_value_info(n, t, None)
            for n, t in (("y", TensorProto.UINT8), ("s", TensorProto.FLOAT), ("z", TensorProto.UINT8))
        ],
    )
    sess = ort.InferenceSession(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]).SerializeToString(),
        providers=["CPUExecutionProvider"],
    )
    big = (rng.standard_normal(1_100_000) * 3).astype(np.float32)  # the parallel path
    for x in (np.zeros(4, np.float32), np.array([np.nan, 1, 2, -1], np.float32), big):
        got = ops.dynamic_quantize_linear(opsnn.tensor(x))
        for g, w in zip(got, sess.run(None, {"x": x})):
            np.testing.assert_allclose(g.numpy(), w, rtol=1e-6)


# -- typed errors ---------------------------------------------------------------------------------------------


def test_errors():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(DTypeError, match="disagrees"):
        run("QuantizeLinear", [x, np.float32(1), np.int8(0)], {"output_dtype": TensorProto.UINT8})
    with pytest.raises(DTypeError, match="quantized type"):
        run("QuantizeLinear", [x, np.float32(1)], {"output_dtype": TensorProto.FLOAT})
    with pytest.raises(DTypeError, match="input x"):
        run("QuantizeLinear", [x.astype(np.int8), np.float32(1)])
    with pytest.raises(InferShapeError, match="per axis"):
        run("QuantizeLinear", [x, np.ones(2, np.float32)])  # axis 1 has 3 elements
    with pytest.raises(InferShapeError, match="zero point shape"):
        run("QuantizeLinear", [x, np.ones(3, np.float32), np.zeros(2, np.uint8)])
    with pytest.raises(ParamInvalidError, match="axis"):
        run("QuantizeLinear", [x, np.ones(3, np.float32)], {"axis": 2})
    with pytest.raises(InferShapeError, match="blocked"):
        run("QuantizeLinear", [x, np.ones((2, 1), np.float32)], {"axis": 1, "block_size": 2})
    with pytest.raises(ParamInvalidError, match="block_size"):
        run("QuantizeLinear", [x, np.ones((2, 1), np.float32)], {"axis": 1, "block_size": -1})
    with pytest.raises(DTypeError, match="x_zero_point"):
        run("DequantizeLinear", [x.astype(np.uint8), np.float32(1), np.int8(0)])
    with pytest.raises(DTypeError, match="input x"):
        run("DequantizeLinear", [x, np.float32(1)])
    with pytest.raises(DTypeError, match="output type"):
        run("DequantizeLinear", [x.astype(np.uint8), np.float32(1)], {"output_dtype": TensorProto.INT8})
    # (api wraps a TypeError raised by a translate function, DTypeError included, as ParamInvalidError)
    with pytest.raises(ParamInvalidError, match="dtype"):
        ops.quantize_linear(opsnn.tensor(x), 1.0, dtype="no_such_type")
    with pytest.raises(DTypeError):
        ops.dynamic_quantize_linear(opsnn.tensor(x.astype(np.int32)))
