"""Pooling ops against independent oracles: torch-semantics loops written here, onnxruntime,
onnx.reference, and each record's numpy reference (forced with ``algo="reference"``).

Tolerances: float32/float64 rtol 1e-5 (max pooling is exact); 16-bit vs a float32 oracle
1e-2. MaxPool propagates NaN (torch's choice): the window's first NaN wins, with its index.
"""

import math

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import opsnn
from opsnn.errors import DTypeError, InferShapeError, ParamInvalidError

ops = opsnn.ops
aclnn = opsnn.aclnn

_ONNX_TYPES = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float64): TensorProto.DOUBLE,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.float16): TensorProto.FLOAT16,
}


def ort_run(op, inputs, attrs, n_out=1, out_types=None, opset=None):
    """Run one node in onnxruntime (an independent implementation)."""
    ort = pytest.importorskip("onnxruntime")
    names = [f"i{k}" for k in range(len(inputs))]
    outs = [f"o{k}" for k in range(n_out)]
    node = helper.make_node(op, names, outs, **attrs)
    out_types = out_types or [_ONNX_TYPES[inputs[0].dtype]] * n_out
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, _ONNX_TYPES[a.dtype], a.shape) for n, a in zip(names, inputs)],
        [helper.make_tensor_value_info(n, t, None) for n, t in zip(outs, out_types)],
    )
    # onnxruntime lacks GlobalLpPool-22; the op is unchanged since opset 2 apart from types
    opset = opset or (21 if op == "GlobalLpPool" else 22)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, dict(zip(names, inputs)))


def onnx_ref(op, inputs, attrs, n_out=1):
    node = helper.make_node(op, [f"i{k}" for k in range(len(inputs))], [f"o{k}" for k in range(n_out)], **attrs)
    return ReferenceEvaluator(node).run(None, {f"i{k}": a for k, a in enumerate(inputs)})


def torch_pool2d(x, k, s, p, d=(1, 1), ceil=False, mode="max", include_pad=True):
    """torch's max_pool2d / avg_pool2d, one output element at a time (d only for max)."""
    N, C, H, W = x.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = k, s, p, d

    def out_size(n, k, s, p, d):
        num = n + 2 * p - d * (k - 1) - 1
        o = (-(-num // s) if ceil else num // s) + 1
        if ceil and (o - 1) * s >= n + p:
            o -= 1
        return o

    OH, OW = out_size(H, kh, sh, ph, dh), out_size(W, kw, sw, pw, dw)
    y = np.zeros((N, C, OH, OW), np.float64)
    idx = np.zeros((N, C, OH, OW), np.int64)
    for n in range(N):
        for c in range(C):
            for oh in range(OH):
                for ow in range(OW):
                    hs, ws = oh * sh - ph, ow * sw - pw
                    if mode == "max":
                        best, at = -math.inf, -1
                        for i in range(kh):
                            for j in range(kw):
                                h, w = hs + i * dh, ws + j * dw
                                if 0 <= h < H and 0 <= w < W:
                                    v = float(x[n, c, h, w])
                                    if at < 0 or v > best or (math.isnan(v) and not math.isnan(best)):
                                        best, at = v, h * W + w
                        y[n, c, oh, ow], idx[n, c, oh, ow] = best, (n * C + c) * H * W + at
                    else:
                        he, we = min(hs + kh, H + ph), min(ws + kw, W + pw)
                        pool_size = (he - hs) * (we - ws)
                        h0, w0, h1, w1 = max(hs, 0), max(ws, 0), min(he, H), min(we, W)
                        total = float(x[n, c, h0:h1, w0:w1].astype(np.float64).sum())
                        y[n, c, oh, ow] = total / (pool_size if include_pad else (h1 - h0) * (w1 - w0))
    return y, idx


# -- max_pool2d / avg_pool2d against torch-semantics loops -------------------------------------------------

CASES = [  # shape, kernel, stride, padding, dilation, ceil_mode
    ((2, 3, 7, 9), (3, 2), (2, 3), (1, 1), (1, 1), False),
    ((2, 3, 7, 9), (3, 2), (2, 3), (1, 1), (1, 1), True),
    ((1, 2, 10, 11), (3, 3), (2, 2), (1, 0), (2, 1), True),
    ((1, 2, 8, 8), (2, 2), (3, 3), (0, 0), (1, 1), False),  # stride > kernel
    ((1, 2, 8, 8), (2, 2), (3, 3), (1, 1), (1, 1), True),
    ((3, 1, 1, 1), (1, 1), (1, 1), (0, 0), (1, 1), False),  # 1x1 spatial
    ((2, 2, 1, 1), (3, 3), (1, 1), (1, 1), (1, 1), False),  # 1x1 spatial, padded
    ((1, 1, 5, 13), (5, 4), (1, 2), (2, 2), (1, 3), True),
]


@pytest.mark.parametrize("shape,k,s,p,d,ceil", CASES)
def test_max_pool2d_matches_loops(rng, no_leak, shape, k, s, p, d, ceil):
    x = rng.standard_normal(shape).astype(np.float32)
    y, i = ops.max_pool2d(opsnn.tensor(x), k, s, p, d, ceil_mode=ceil, return_indices=True)
    want, want_i = torch_pool2d(x, k, s, p, d, ceil, "max")
    np.testing.assert_array_equal(y.numpy(), want.astype(np.float32))
    np.testing.assert_array_equal(i.numpy(), want_i)
    # indices point at the maxima
    np.testing.assert_array_equal(x.reshape(-1)[i.numpy()], y.numpy())


@pytest.mark.parametrize("include_pad", [True, False])
@pytest.mark.parametrize("shape,k,s,p,d,ceil", [c for c in CASES if c[4] == (1, 1)])
def test_avg_pool2d_matches_loops(rng, no_leak, shape, k, s, p, d, ceil, include_pad):
    x = rng.standard_normal(shape).astype(np.float32)
    y = ops.avg_pool2d(opsnn.tensor(x), k, s, p, ceil_mode=ceil, count_include_pad=include_pad)
    want, _ = torch_pool2d(x, k, s, p, ceil=ceil, mode="avg", include_pad=include_pad)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-6)


def test_stride_defaults_to_kernel_and_fast_kernel_chosen(rng):
    x = opsnn.tensor(rng.standard_normal((2, 3, 9, 8)).astype(np.float32))
    ex = aclnn.max_pool2d.prepare(x, 3)
    assert ex.kernel_name == "max_pool_numba" and ex.output_metas[0].shape == (2, 3, 3, 2)
    assert aclnn.avg_pool2d.prepare(x, 3).kernel_name == "avg_pool_numba"
    assert aclnn.global_avg_pool.prepare(x).kernel_name == "global_avg_pool_numba"
    assert aclnn.global_max_pool.prepare(x).kernel_name == "global_max_pool_numba"
    assert aclnn.adaptive_avg_pool2d.prepare(x, (2, 3)).kernel_name == "adaptive_avg_pool2d_numba"
    assert aclnn.lp_pool2d.prepare(x, 2, 3).kernel_name == "lp_pool_numpy"


def test_parallel_path_matches_reference(rng, no_leak):
    # 2*8*63*63 outputs: above the serial threshold, so the parallel variants run
    x = opsnn.tensor(rng.standard_normal((2, 8, 64, 64)).astype(np.float32))
    for fn, kw in ((ops.max_pool2d, {"return_indices": True}), (ops.avg_pool2d, {})):
        fast = fn(x, 2, 1, **kw)
        ref = fn(x, 2, 1, algo="reference", **kw)
        for a, b in zip(fast if isinstance(fast, tuple) else (fast,), ref if isinstance(ref, tuple) else (ref,)):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    ex = aclnn.max_pool2d.prepare(x, 2, 1)
    assert ex.plan.parallel


# -- ONNX records against onnxruntime / onnx.reference (1-D, 2-D, 3-D, auto_pad, storage_order) ------------

ONNX_CASES = [
    ("MaxPool", (1, 2, 11), dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
    ("MaxPool", (2, 3, 9, 7), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
    ("MaxPool", (2, 3, 9, 7), dict(kernel_shape=[2, 3], strides=[2, 1], auto_pad="SAME_LOWER")),
    ("MaxPool", (2, 3, 9, 7), dict(kernel_shape=[3, 2], strides=[2, 2], auto_pad="VALID")),
    (
        "MaxPool",
        (1, 2, 6, 7, 5),
        dict(kernel_shape=[2, 3, 2], strides=[2, 1, 2], pads=[1, 0, 1, 0, 1, 1], dilations=[1, 2, 1], ceil_mode=1),
    ),
    ("AveragePool", (1, 2, 11), dict(kernel_shape=[4], strides=[3], pads=[2, 1], count_include_pad=1, ceil_mode=1)),
    ("AveragePool", (2, 3, 9, 7), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
    (
        "AveragePool",
        (2, 3, 9, 7),
        dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_LOWER", count_include_pad=1),
    ),
    ("AveragePool", (2, 3, 9, 7), dict(kernel_shape=[3, 2], pads=[1, 1, 1, 0], dilations=[2, 2])),
    (
        "AveragePool",
        (1, 2, 6, 7, 5),
        dict(kernel_shape=[2, 3, 2], strides=[2, 2, 2], pads=[1, 1, 0, 1, 1, 1], count_include_pad=1),
    ),
    ("LpPool", (2, 3, 9, 7), dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], p=3)),
    ("LpPool", (1, 2, 10), dict(kernel_shape=[3], p=1)),
]


@pytest.mark.parametrize("op,shape,attrs", ONNX_CASES)
def test_onnx_pools_match_onnxruntime(rng, op, shape, attrs):
    x = rng.standard_normal(shape).astype(np.float32)
    want = ort_run(op, [x], attrs)[0]
    got = ops.run_op(op, [x], attrs)[0].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ops.run_op(op, [x], attrs, algo="reference")[0].numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize(
    "shape,attrs",
    [
        ((2, 3, 9, 8), dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 1, 0, 1])),
        ((1, 2, 5, 6, 4), dict(kernel_shape=[2, 2, 2], strides=[2, 1, 2])),
        ((2, 2, 9), dict(kernel_shape=[3], strides=[2])),
    ],
)
def test_maxpool_indices_match_onnxruntime(rng, shape, attrs, storage_order):
    x = rng.permutation(np.prod(shape)).astype(np.float32).reshape(shape)  # distinct values: unique argmax
    attrs = dict(attrs, storage_order=storage_order)
    want_y, want_i = ort_run("MaxPool", [x], attrs, 2, [TensorProto.FLOAT, TensorProto.INT64])
    for algo in (None, "reference"):
        y, i = ops.run_op("MaxPool", [x], attrs, num_outputs=2, algo=algo)
        np.testing.assert_array_equal(y.numpy(), want_y)
        np.testing.assert_array_equal(i.numpy(), want_i)


def test_maxpool_int_dtypes(rng):
    for dt in (np.uint8, np.int8):
        x = rng.integers(np.iinfo(dt).min, np.iinfo(dt).max, (2, 3, 7, 6), endpoint=True).astype(dt)
        attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
        got = ops.run_op("MaxPool", [x], attrs)[0].numpy()
        assert got.dtype == dt
        np.testing.assert_array_equal(got, ort_run("MaxPool", [x], attrs)[0])
        np.testing.assert_array_equal(got, ops.run_op("MaxPool", [x], attrs, algo="reference")[0].numpy())


# -- edge cases ------------------------------------------------------------------------------------------


def test_non_contiguous_input(rng, no_leak):
    a = rng.standard_normal((2, 9, 7, 3)).astype(np.float32)  # NHWC storage
    view = opsnn.from_numpy(a).permute(0, 3, 1, 2)  # NCHW view, not contiguous
    assert not view.is_contiguous()
    x = np.ascontiguousarray(a.transpose(0, 3, 1, 2))
    np.testing.assert_array_equal(
        ops.max_pool2d(view, 3, 2, 1).numpy(), torch_pool2d(x, (3, 3), (2, 2), (1, 1))[0].astype(np.float32)
    )
    np.testing.assert_allclose(
        ops.avg_pool2d(view, 2).numpy(), torch_pool2d(x, (2, 2), (2, 2), (0, 0), mode="avg")[0], rtol=1e-5
    )
    np.testing.assert_allclose(ops.global_avg_pool(view).numpy(), x.mean(axis=(2, 3), keepdims=True), rtol=1e-5)


def test_empty_batch(no_leak):
    x = opsnn.tensor(np.zeros((0, 3, 8, 8), np.float32))
    y, i = ops.max_pool2d(x, 2, return_indices=True)
    assert y.shape == (0, 3, 4, 4) and i.shape == (0, 3, 4, 4)
    assert ops.avg_pool2d(x, 3, 1, 1).shape == (0, 3, 8, 8)
    assert ops.global_max_pool(x).shape == (0, 3, 1, 1)
    assert ops.adaptive_avg_pool2d(x, 2).shape == (0, 3, 2, 2)
    assert ops.run_op("LpPool", [x.numpy()], {"kernel_shape": [2, 2]})[0].shape == (0, 3, 7, 7)


def test_maxpool_nan_propagates():
    x = np.arange(32, dtype=np.float32).reshape(1, 2, 4, 4)
    x[0, 0, 1, 2] = np.nan
    x[0, 0, 1, 3] = np.nan
    x[0, 1, 3, 3] = -np.inf
    for algo in (None, "reference"):
        y, i = ops.max_pool2d(opsnn.tensor(x), 2, return_indices=True, algo=algo)
        y, i = y.numpy(), i.numpy()
        assert np.isnan(y[0, 0, 0, 1]) and i[0, 0, 0, 1] == 1 * 4 + 2  # the first NaN's index
        assert not np.isnan(y[0, 0, 1]).any() and not np.isnan(y[0, 1]).any()
        assert y[0, 0, 0, 0] == 5 and y[0, 1, 1, 1] == 30
    g = ops.global_max_pool(opsnn.tensor(x)).numpy()
    assert np.isnan(g[0, 0, 0, 0]) and g[0, 1, 0, 0] == 30
    # a window of only -inf still reports a real position
    y, i = ops.max_pool2d(opsnn.tensor(np.full((1, 1, 2, 2), -np.inf, np.float32)), 2, return_indices=True)
    assert y.numpy()[0, 0, 0, 0] == -np.inf and i.numpy()[0, 0, 0, 0] == 0


@pytest.mark.parametrize("dt", [np.float16, ml_dtypes.bfloat16])
def test_16bit_against_fp32(rng, dt):
    x32 = rng.standard_normal((2, 3, 9, 10)).astype(np.float32)
    x = opsnn.tensor(x32.astype(dt))
    xr = x.numpy().astype(np.float32)  # the 16-bit values, widened
    ex = aclnn.max_pool2d.prepare(x, 3, 2, 1)
    if dt is ml_dtypes.bfloat16:  # a native kernel reads bfloat16 itself
        assert ex.kernel_name == "max_pool_numba_bf16" and not ex.adapter
    else:
        assert ex.kernel_name == "max_pool_numba" and ex.adapter
    pairs = [
        (ops.max_pool2d(x, 3, 2, 1), ops.max_pool2d(opsnn.tensor(xr), 3, 2, 1)),
        (ops.avg_pool2d(x, 3, 2, 1), ops.avg_pool2d(opsnn.tensor(xr), 3, 2, 1)),
        (ops.global_avg_pool(x), ops.global_avg_pool(opsnn.tensor(xr))),
        (ops.adaptive_avg_pool2d(x, 4), ops.adaptive_avg_pool2d(opsnn.tensor(xr), 4)),
        (ops.lp_pool2d(x, 2, 2), ops.lp_pool2d(opsnn.tensor(xr), 2, 2)),
    ]
    for got, want in pairs:
        assert got.dtype == np.dtype(dt)
        np.testing.assert_allclose(got.numpy().astype(np.float32), want.numpy(), rtol=1e-2, atol=1e-2)


def test_float64(rng):
    x = rng.standard_normal((1, 2, 7, 7))
    for fn in (
        lambda t, **k: ops.max_pool2d(t, 3, 2, 1, **k),
        lambda t, **k: ops.avg_pool2d(t, 3, 2, 1, **k),
        lambda t, **k: ops.global_avg_pool(t, **k),
    ):
        got = fn(opsnn.tensor(x))
        assert got.dtype == np.float64
        np.testing.assert_allclose(got.numpy(), fn(opsnn.tensor(x), algo="reference").numpy(), rtol=1e-12)


# -- adaptive / global / Lp ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,size", [((2, 3, 7, 9), (3, 4)), ((2, 3, 5, 5), (7, 8)), ((3, 10, 6), (4, None)), ((1, 1, 4, 4), 1)]
)
def test_adaptive_avg_pool2d_torch_windows(rng, shape, size):
    x = rng.standard_normal(shape).astype(np.float32)
    got = ops.adaptive_avg_pool2d(opsnn.tensor(x), size).numpy()
    H, W = shape[-2:]
    size = (size, size) if isinstance(size, int) else size
    OH, OW = (H if size[0] is None else size[0]), (W if size[1] is None else size[1])
    want = np.empty(shape[:-2] + (OH, OW), np.float64)
    for i in range(OH):
        for j in range(OW):
            h0, h1 = (i * H) // OH, -(-((i + 1) * H) // OH)
            w0, w1 = (j * W) // OW, -(-((j + 1) * W) // OW)
            want[..., i, j] = x[..., h0:h1, w0:w1].astype(np.float64).mean(axis=(-2, -1))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        ops.adaptive_avg_pool2d(opsnn.tensor(x), size, algo="reference").numpy(), want, rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 7), (1, 2, 3, 4, 5), (3, 2, 1, 1)])
def test_global_pools(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    axes = tuple(range(2, len(shape)))
    np.testing.assert_allclose(
        ops.global_avg_pool(opsnn.tensor(x)).numpy(), x.mean(axis=axes, keepdims=True), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_array_equal(ops.global_max_pool(opsnn.tensor(x)).numpy(), x.max(axis=axes, keepdims=True))
    for p in (1, 2, 3):
        want = (np.abs(x.astype(np.float64)) ** p).sum(axis=axes, keepdims=True) ** (1 / p)
        np.testing.assert_allclose(ops.global_lp_pool(opsnn.tensor(x), p).numpy(), want, rtol=1e-5)
    for op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"):
        np.testing.assert_allclose(ops.run_op(op, [x])[0].numpy(), ort_run(op, [x], {})[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(3, 0, 3), (0, 2, 4, 4)])
def test_global_pools_of_no_planes(shape):
    """N or C is 0: an empty result, as onnx.reference gives (GlobalLpPool raised a reshape ValueError: found by
    opsnn fuzz, out_view 71669); empty planes are refused at prepare, typed."""
    x = np.zeros(shape, np.float32)
    want_shape = shape[:2] + (1,) * (len(shape) - 2)
    for op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"):
        rec = opsnn.ops.registry.get_op(op)
        assert np.asarray(rec.reference([x], rec.bind_attrs({}))).shape == want_shape
        got = ops.run_op(op, [x])[0].numpy()
        assert got.shape == want_shape and got.dtype == np.float32
        with pytest.raises(opsnn.errors.InferShapeError):
            ops.run_op(op, [np.zeros((2, 3, 0), np.float32)])


def test_lp_pool_formula(rng):
    x = rng.standard_normal((2, 2, 6, 7)).astype(np.float32)
    got = ops.lp_pool2d(opsnn.tensor(x), 3, (2, 3), (2, 2), ceil_mode=True).numpy()
    want = np.zeros((2, 2, 3, 3))
    for i in range(3):
        for j in range(3):
            win = x[:, :, 2 * i : 2 * i + 2, 2 * j : 2 * j + 3].astype(np.float64)
            want[:, :, i, j] = (np.abs(win) ** 3).sum(axis=(2, 3)) ** (1 / 3)
    np.testing.assert_allclose(got, want, rtol=1e-5)


# -- MaxUnpool ----------------------------------------------------------------------------------------------


def test_max_unpool_inverts_max_pool(rng, no_leak):
    x = rng.permutation(2 * 3 * 9 * 8).astype(np.float32).reshape(2, 3, 9, 8)
    y, i = ops.max_pool2d(opsnn.tensor(x), 2, return_indices=True)
    u = ops.max_unpool2d(y, i, 2, output_size=(9, 8))
    assert u.shape == x.shape
    want = np.zeros_like(x)
    want.reshape(-1)[i.numpy().reshape(-1)] = y.numpy().reshape(-1)
    np.testing.assert_array_equal(u.numpy(), want)
    np.testing.assert_array_equal(ops.max_pool2d(u, 2).numpy(), y.numpy())  # pooling the unpooled gives y back
    # without output_size the default shape is (in-1)*stride + kernel - pads
    y8, i8 = ops.max_pool2d(opsnn.tensor(x[:, :, :8]), 2, return_indices=True)
    assert ops.max_unpool2d(y8, i8, 2).shape == (2, 3, 8, 8)
    ref = ops.run_op(
        "MaxUnpool",
        [y.numpy(), i.numpy(), np.array(x.shape, np.int64)],
        {"kernel_shape": [2, 2], "strides": [2, 2]},
        algo="reference",
    )[0]
    np.testing.assert_array_equal(ref.numpy(), want)


def test_max_unpool_matches_onnx_reference_default_shape(rng):
    x = rng.standard_normal((1, 2, 3, 3)).astype(np.float32)
    y, i = ops.max_pool2d(opsnn.tensor(x), 2, 1, return_indices=True)
    attrs = {"kernel_shape": [2, 2], "strides": [1, 1]}
    want = onnx_ref("MaxUnpool", [y.numpy(), i.numpy()], attrs)[0]
    np.testing.assert_array_equal(ops.run_op("MaxUnpool", [y.numpy(), i.numpy()], attrs)[0].numpy(), want)


def test_max_unpool_bad_index_raises():
    x = np.ones((1, 1, 2, 2), np.float32)
    bad = np.array([0, 1, 2, 99], np.int64).reshape(1, 1, 2, 2)
    with pytest.raises(ParamInvalidError, match="outside the output"):
        ops.max_unpool2d(opsnn.tensor(x), opsnn.tensor(bad), 2).numpy()


# -- RoiAlign / MaxRoiPool ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("ratio", [0, 2])
def test_roi_align_matches_onnx_reference(rng, mode, ctm, ratio):
    x = rng.standard_normal((2, 3, 10, 12)).astype(np.float32)
    rois = np.array([[0, 0, 9, 9], [0, 5, 4, 9], [5, 5, 9, 9], [-3, -2, 14, 13], [2.5, 1.2, 3.1, 1.9]], np.float32)
    b = np.array([0, 1, 1, 0, 1], np.int64)
    attrs = dict(
        mode=mode,
        coordinate_transformation_mode=ctm,
        output_height=3,
        output_width=4,
        sampling_ratio=ratio,
        spatial_scale=0.8,
    )
    want = onnx_ref("RoiAlign", [x, rois, b], attrs)[0]
    for algo in (None, "reference"):
        got = ops.run_op("RoiAlign", [x, rois, b], attrs, algo=algo)[0].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert aclnn.roi_align.prepare(x, rois, b, (3, 4)).kernel_name == "roi_align_numba"


def test_roi_align_16bit_and_bad_batch_index(rng):
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    rois = np.array([[0, 0, 5, 5], [1, 1, 3, 4]], np.float32)
    b = np.zeros(2, np.int64)
    want = ops.roi_align(x, rois, b, 2, aligned=True).numpy()
    got = ops.roi_align(x.astype(np.float16), rois.astype(np.float16), b, 2, aligned=True)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.numpy().astype(np.float32), want, rtol=1e-2, atol=1e-2)
    with pytest.raises(ParamInvalidError, match="batch index"):
        ops.roi_align(x, rois, np.array([0, 3], np.int64), 2).numpy()
    with pytest.raises(InferShapeError):
        ops.roi_align(x, rois[:, :3], b, 2)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("col", [0, 3])
def test_max_roi_pool_refuses_a_non_finite_roi(bad, col):
    """A NaN or Inf batch index or coordinate: a typed error naming the roi (int() of it raised an untyped
    ValueError / OverflowError: found by opsnn fuzz, nan_inf 81873 and 82623)."""
    x = np.ones((1, 2, 5, 5), np.float32)
    rois = np.array([[0, 0, 0, 3, 3], [0, 1, 1, 2, 2]], np.float32)
    rois[1, col] = bad
    with pytest.raises(ParamInvalidError, match=r"MaxRoiPool: roi 1 is .* expected finite"):
        ops.roi_pool(opsnn.tensor(x), opsnn.tensor(rois), (2, 2)).numpy()


def test_max_roi_pool(rng):
    x = rng.standard_normal((2, 3, 8, 9)).astype(np.float32)
    rois = np.array([[0, 0, 0, 7, 7], [1, 2.4, 1.5, 6.6, 3.5], [1, 8, 7, 20, 20], [0, 3, 3, 3, 3]], np.float32)
    got = ops.roi_pool(x, rois, (2, 3), spatial_scale=1.0).numpy()
    np.testing.assert_array_equal(got, ops.roi_pool(x, rois, (2, 3), algo="reference").numpy())
    # roi 0 covers rows/cols 0..7 -> bins of 4 rows x 8/3 cols
    assert got[0, 1, 0, 0] == x[0, 1, 0:4, 0:3].max() and got[0, 1, 1, 2] == x[0, 1, 4:8, 5:8].max()
    assert got[3, 0, 0, 0] == x[0, 0, 3, 3]  # a 1x1 box
    # a box partly outside the map: bins past the edge are empty and give 0
    assert got[2, 2, 1, 2] == 0 and got[2, 2, 0, 0] == x[1, 2, 7:8, 8:9].max()


# -- typed errors ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", [None, "reference"])
def test_bad_indices_in_the_data_are_typed_errors(algo):
    """An index held in the data (MaxUnpool's indices, RoiAlign's and MaxRoiPool's batch indices) out of
    range is a ParamInvalidError naming the op (it was a KernelError wrapping an IndexError: found by
    tests/fuzz, nan_inf and out_view)."""
    x = np.ones((2, 3, 4, 4), np.float32)
    cases = [
        (
            "MaxUnpool",
            [np.ones((1, 1, 2, 2), np.float32), np.array([0, 1, 2, 99]).reshape(1, 1, 2, 2)],
            {"kernel_shape": [2, 2]},
            "outside the output",
        ),
        ("RoiAlign", [x, np.array([[0, 0, 2, 2]], np.float32), np.array([3])], {}, "batch index 3"),
        ("MaxRoiPool", [x, np.array([[2, 0, 0, 2, 2]], np.float32)], {"pooled_shape": [2, 2]}, "batch index 2"),
    ]
    for op, ins, attrs, msg in cases:
        with pytest.raises(ParamInvalidError, match=msg) as exc:
            ops.run_op(op, ins, attrs, algo=algo)[0].numpy()
            opsnn.current_stream().synchronize()
        assert exc.value.op == op


def test_errors():
    x = opsnn.tensor(np.zeros((1, 2, 4, 4), np.float32))
    with pytest.raises(InferShapeError, match="larger than the padded input"):
        ops.max_pool2d(x, 5)
    with pytest.raises(InferShapeError, match="larger than the padded input"):
        ops.run_op("AveragePool", [x], {"kernel_shape": [6, 1], "pads": [0, 0, 1, 0]})
    with pytest.raises(ParamInvalidError, match="at most half"):
        ops.max_pool2d(x, 2, padding=2)
    with pytest.raises(ParamInvalidError, match="at most half"):
        ops.avg_pool2d(x, 3, padding=(0, 2))
    with pytest.raises(ParamInvalidError, match="stride"):
        ops.max_pool2d(x, 2, stride=0)
    with pytest.raises(ParamInvalidError, match="strides"):
        ops.run_op("MaxPool", [x], {"kernel_shape": [2, 2], "strides": [0, 1]})
    with pytest.raises(ParamInvalidError, match="kernel_shape"):
        ops.run_op("MaxPool", [x], {"kernel_shape": [2]})
    with pytest.raises(ParamInvalidError, match="auto_pad"):
        ops.run_op("MaxPool", [x], {"kernel_shape": [2, 2], "auto_pad": b"SAME"})
    with pytest.raises(ParamInvalidError, match="storage_order"):
        ops.run_op("MaxPool", [x], {"kernel_shape": [2, 2], "storage_order": 2})
    with pytest.raises(ParamInvalidError, match="pads"):
        ops.run_op("MaxPool", [x], {"kernel_shape": [2, 2], "pads": [1, -1, 0, 0]})
    with pytest.raises(ParamInvalidError, match="4-D"):
        ops.max_pool2d(opsnn.tensor(np.zeros((2, 4, 4), np.float32)), 2)
    with pytest.raises(InferShapeError, match="at least 3 dims"):
        ops.global_avg_pool(opsnn.tensor(np.zeros((4, 4), np.float32)))
    with pytest.raises(DTypeError):
        ops.avg_pool2d(opsnn.tensor(np.zeros((1, 1, 4, 4), np.int32)), 2)
    with pytest.raises(ParamInvalidError, match="norm_type"):
        ops.lp_pool2d(x, 1.5, 2)
    with pytest.raises(InferShapeError, match="output_shape"):
        ops.max_unpool2d(
            ops.max_pool2d(x, 2), opsnn.tensor(np.zeros((1, 2, 2, 2), np.int64)), 2, output_size=(1, 3, 4, 4)
        )


# -- randomized geometry sweep: fast kernels vs the references, including row-blocked work items ------------


def test_random_geometry_sweep():
    from opsnn.kernels.cpu import pool as K

    rng = np.random.default_rng(7)
    for _trial in range(40):
        n = int(rng.integers(1, 3))  # spatial rank 1 or 2
        spatial = tuple(int(v) for v in rng.integers(1, 12, n))
        k = [int(v) for v in rng.integers(1, 5, n)]
        d = [int(v) for v in rng.integers(1, 3, n)]
        s = [int(v) for v in rng.integers(1, 4, n)]
        p = [int(rng.integers(0, k[i] // 2 + 1)) for i in range(n)] + [
            int(rng.integers(0, k[i] // 2 + 1)) for i in range(n)
        ]
        attrs = dict(kernel_shape=k, strides=s, pads=p, dilations=d, ceil_mode=int(rng.integers(0, 2)))
        shape = (int(rng.integers(1, 3)), int(rng.integers(1, 4))) + spatial
        x = rng.standard_normal(shape).astype(np.float32)
        try:
            want_y, want_i = ops.run_op("MaxPool", [x], attrs, num_outputs=2, algo="reference")
        except InferShapeError:
            continue
        y, i = ops.run_op("MaxPool", [x], attrs, num_outputs=2)
        np.testing.assert_array_equal(y.numpy(), want_y.numpy(), err_msg=str(attrs))
        np.testing.assert_array_equal(i.numpy(), want_i.numpy(), err_msg=str(attrs))
        np.testing.assert_array_equal(ops.run_op("MaxPool", [x], attrs)[0].numpy(), want_y.numpy(), err_msg=str(attrs))
        for cip in (0, 1):
            a = dict(attrs, count_include_pad=cip)
            np.testing.assert_allclose(
                ops.run_op("AveragePool", [x], a)[0].numpy(),
                ops.run_op("AveragePool", [x], a, algo="reference")[0].numpy(),
                rtol=1e-5,
                atol=1e-6,
                err_msg=str(a),
            )
        # the same geometry cut into row blocks of every size, on the parallel path
        mex = opsnn.ops.prepare(opsnn.ops.get_op("MaxPool"), [x], attrs)
        aex = opsnn.ops.prepare(opsnn.ops.get_op("AveragePool"), [x], dict(attrs, count_include_pad=1))
        oh = mex.plan.out_spatial[0]
        for rb in sorted({1, 2, max(oh - 1, 1), oh}):
            out = np.empty_like(want_y.numpy())
            K.max_pool(x, out, None, mex.plan._replace(parallel=True, row_block=rb), False)
            np.testing.assert_array_equal(out, want_y.numpy(), err_msg=f"{attrs} row_block={rb}")
            K.avg_pool(x, out, aex.plan._replace(parallel=bool(rb % 2), row_block=rb), True)
            np.testing.assert_allclose(
                out,
                ops.run_op("AveragePool", [x], dict(attrs, count_include_pad=1), algo="reference")[0].numpy(),
                rtol=1e-5,
                atol=1e-6,
            )


def test_few_planes_large_output_uses_row_blocks(rng):
    x = rng.standard_normal((1, 1, 200, 190)).astype(np.float32)
    ex = aclnn.max_pool2d.prepare(x, (3, 3), 1, 1)
    assert ex.plan.parallel and ex.plan.row_block < ex.plan.out_spatial[0]
    np.testing.assert_array_equal(ex.run().numpy(), ops.max_pool2d(x, 3, 1, 1, algo="reference").numpy())
    np.testing.assert_allclose(
        ops.avg_pool2d(x, 3, 1, 1).numpy(), ops.avg_pool2d(x, 3, 1, 1, algo="reference").numpy(), rtol=1e-5, atol=1e-6
    )


# -- 2-D max pooling without indices: the column-first streaming kernel ---------------------------------------

STREAM_CASES = [  # shape, kernel, stride, pads (t, l, b, r), dilation, ceil_mode
    ((1, 64, 112, 112), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 0),  # ResNet-50's stem pool
    ((2, 3, 13, 17), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),  # odd sizes, ceil_mode
    ((1, 2, 1, 1), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 0),  # 1x1 image
    ((2, 2, 1, 1), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 0),  # 1x1 image, padded: no interior
    ((1, 3, 9, 40), (2, 2), (3, 3), (0, 0, 0, 0), (1, 1), 1),  # stride > kernel
    ((1, 2, 37, 45), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 0),  # stride 1, rows longer than a vector loop
    ((1, 2, 23, 50), (5, 7), (2, 3), (2, 3, 1, 0), (1, 1), 1),  # more than 3 taps, asymmetric pads
    ((1, 2, 30, 41), (4, 6), (1, 2), (1, 2, 2, 1), (2, 3), 0),  # dilation, even tap counts
    ((1, 1, 8, 70), (8, 9), (3, 1), (0, 4, 0, 4), (1, 1), 0),  # 8 / 9 taps
    ((1, 1, 3, 200), (1, 5), (1, 4), (0, 2, 0, 2), (1, 1), 1),  # 1-row kernel, long rows
]


@pytest.mark.parametrize("dt", [np.float32, np.float64, np.int8, np.uint8])
@pytest.mark.parametrize("shape,k,s,p,d,ceil", STREAM_CASES)
def test_max_pool2d_stream_kernel_matches_reference(rng, shape, k, s, p, d, ceil, dt):
    from opsnn.kernels.cpu import pool as K

    if np.dtype(dt).kind == "f":
        x = rng.standard_normal(shape).astype(dt)
    else:
        x = rng.integers(np.iinfo(dt).min, np.iinfo(dt).max, shape, endpoint=True).astype(dt)
    attrs = dict(kernel_shape=list(k), strides=list(s), pads=list(p), dilations=list(d), ceil_mode=ceil)
    want = ops.run_op("MaxPool", [x], attrs, algo="reference")[0].numpy()
    np.testing.assert_array_equal(ops.run_op("MaxPool", [x], attrs)[0].numpy(), want)
    ex = opsnn.ops.prepare(opsnn.ops.get_op("MaxPool"), [x], attrs)
    oh = ex.plan.out_spatial[0]
    for parallel in (False, True):
        for rb in sorted({1, 2, max(oh - 1, 1), oh}):
            out = np.full_like(want, 7)
            K.max_pool(x, out, None, ex.plan._replace(parallel=parallel, row_block=rb), False)
            np.testing.assert_array_equal(out, want, err_msg=f"parallel={parallel} row_block={rb}")


@pytest.mark.parametrize("k,s,p", [(3, 2, 1), (3, 1, 1), (5, 2, 2), (2, 2, 0), (7, 3, 3)])
def test_max_pool2d_stream_kernel_nan(rng, k, s, p):
    """NaN anywhere in a window (interior or border, any tap) gives NaN, as in the reference."""
    x = rng.standard_normal((2, 3, 21, 67)).astype(np.float32)
    x[rng.random(x.shape) < 0.01] = np.nan
    x[0, 0, 0, :] = np.nan  # a NaN row on the border
    x[1, 2, :, 66] = np.nan  # a NaN column on the border
    x[0, 1, 10, 33] = -np.inf
    attrs = dict(kernel_shape=[k, k], strides=[s, s], pads=[p] * 4)
    want = ops.run_op("MaxPool", [x], attrs, algo="reference")[0].numpy()
    got = ops.run_op("MaxPool", [x], attrs)[0].numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got, want)
