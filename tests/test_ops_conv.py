"""Conv, ConvTranspose, ConvInteger, QLinearConv: fast kernels against a direct-loop oracle
written here, the ops' numpy references, onnx.reference and onnxruntime."""

import itertools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import opsnn
from opsnn.errors import DTypeError, InferShapeError, ParamInvalidError
from opsnn.kernels.cpu import onednn as KD

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402


@pytest.fixture(autouse=True)
def _opsnn_conv_kernels(monkeypatch):
    """These tests pin opsnn's own convolution kernels: oneDNN's plain forward stays out of the
    default choice here (its rule is tested in tests/test_backward_convbw.py)."""
    monkeypatch.setenv("OPSNN_CONV_ONEDNN", "0")


ort = pytest.importorskip("onnxruntime")

RTOL, ATOL = 1e-4, 1e-4  # fp32 kernels vs fp64 oracles


# -- oracles ------------------------------------------------------------------------------------
def conv_direct(x, w, b=None, stride=1, pads=0, dilation=1, groups=1):
    """Direct-loop convolution in float64; ``pads`` is an int or (begin..., end...)."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    nd = x.ndim - 2
    s = (stride,) * nd if np.isscalar(stride) else tuple(stride)
    d = (dilation,) * nd if np.isscalar(dilation) else tuple(dilation)
    p = (pads,) * (2 * nd) if np.isscalar(pads) else tuple(pads)
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p[i], p[nd + i]) for i in range(nd)])
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    k = w.shape[2:]
    out = tuple((xp.shape[2 + i] - (k[i] - 1) * d[i] - 1) // s[i] + 1 for i in range(nd))
    y = np.zeros((n, m) + out)
    mg = m // groups
    for ni, mi in itertools.product(range(n), range(m)):
        g = mi // mg
        for o in itertools.product(*(range(v) for v in out)):
            win = xp[
                (ni, slice(g * cg, (g + 1) * cg))
                + tuple(slice(o[i] * s[i], o[i] * s[i] + (k[i] - 1) * d[i] + 1, d[i]) for i in range(nd))
            ]
            y[(ni, mi) + o] = np.sum(win * w[mi])
    if b is not None:
        y += b.astype(np.float64).reshape((1, -1) + (1,) * nd)
    return y


def conv_transpose_direct(x, w, b=None, stride=1, pads=0, dilation=1, groups=1, out_shape=None):
    """Direct scatter loop: y[n, m, i*s - p + k*d] += x[n, c, i] * w[c, m', k]."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    nd = x.ndim - 2
    s = (stride,) * nd if np.isscalar(stride) else tuple(stride)
    d = (dilation,) * nd if np.isscalar(dilation) else tuple(dilation)
    p = (pads,) * (2 * nd) if np.isscalar(pads) else tuple(pads)
    n, c = x.shape[:2]
    mg = w.shape[1]
    k = w.shape[2:]
    cg = c // groups
    if out_shape is None:
        out_shape = tuple(s[i] * (x.shape[2 + i] - 1) + (k[i] - 1) * d[i] + 1 - p[i] - p[nd + i] for i in range(nd))
    y = np.zeros((n, mg * groups) + tuple(out_shape))
    for ni, ci in itertools.product(range(n), range(c)):
        g = ci // cg
        for i in itertools.product(*(range(v) for v in x.shape[2:])):
            for kk in itertools.product(*(range(v) for v in k)):
                o = tuple(i[j] * s[j] - p[j] + kk[j] * d[j] for j in range(nd))
                if all(0 <= o[j] < out_shape[j] for j in range(nd)):
                    y[(ni, slice(g * mg, (g + 1) * mg)) + o] += x[(ni, ci) + i] * w[(ci, slice(None)) + kk]
    if b is not None:
        y += b.astype(np.float64).reshape((1, -1) + (1,) * nd)
    return y


_ONNX_TYPES = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float64): TensorProto.DOUBLE,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.int32): TensorProto.INT32,
}


def onnx_model(op, inputs, attrs, opset=22):
    out_dtype = {"ConvInteger": np.dtype(np.int32), "QLinearConv": inputs[7].dtype if len(inputs) > 7 else None}.get(
        op, inputs[0].dtype
    )
    names = [f"i{j}" if v is not None else "" for j, v in enumerate(inputs)]
    node = helper.make_node(op, names, ["y"], **attrs)
    g = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info(nm, _ONNX_TYPES[v.dtype], v.shape)
            for nm, v in zip(names, inputs)
            if v is not None
        ],
        [helper.make_tensor_value_info("y", _ONNX_TYPES[out_dtype], None)],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), {
        nm: v for nm, v in zip(names, inputs) if v is not None
    }


def run_ort(op, inputs, attrs, opset=22):
    model, feed = onnx_model(op, inputs, attrs, opset)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feed)[0]


def run_onnx_ref(op, inputs, attrs, opset=22):
    model, feed = onnx_model(op, inputs, attrs, opset)
    return ReferenceEvaluator(model).run(None, feed)[0]


def rand(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# -- Conv: kernels vs the direct-loop oracle --------------------------------------------------------
#: few input channels and enough output positions: the one-region task form on MKL, else im2col
TASKS = "conv2d_im2col" if opsnn.kernels.cpu.mkl.unavailable() else "conv2d_im2col_tasks"
CONV_CASES = [
    # (x shape, w shape, conv2d kwargs, expected kernel)
    ((2, 3, 8, 7), (4, 3, 3, 3), dict(stride=1, padding=1), "conv2d_im2col"),
    ((1, 5, 1, 1), (3, 5, 1, 1), dict(), "conv_1x1_gemm"),  # 1x1 image
    ((1, 5, 1, 1), (3, 5, 3, 3), dict(padding=1), "conv2d_im2col"),  # 1x1 image, 3x3 kernel
    ((2, 7, 9, 11), (5, 7, 2, 3), dict(stride=(4, 5)), "conv2d_im2col"),  # stride > kernel
    ((1, 3, 6, 5), (2, 3, 3, 3), dict(padding=(3, 2)), "conv2d_im2col"),  # padding > kernel/2
    ((2, 4, 10, 9), (6, 4, 3, 2), dict(dilation=(2, 3), padding=2), "conv2d_im2col"),
    ((2, 6, 7, 7), (9, 2, 3, 3), dict(groups=3, padding=1, stride=2), "conv2d_im2col"),
    ((2, 6, 7, 8), (6, 1, 3, 3), dict(groups=6, padding=1), "conv2d_depthwise"),
    ((1, 4, 9, 6), (8, 1, 5, 3), dict(groups=4, stride=(2, 1), dilation=(1, 2), padding=(2, 2)), "conv2d_depthwise"),
    ((2, 6, 5, 5), (4, 3, 1, 1), dict(groups=2), "conv_1x1_gemm"),
    ((1, 3, 6, 6), (4, 3, 1, 1), dict(stride=2), "conv2d_im2col"),  # 1x1 but strided
    ((2, 3, 5, 6), (4, 3, 3, 3), dict(padding="same"), "conv2d_im2col"),
    ((2, 3, 5, 6), (4, 3, 2, 4), dict(padding="same", dilation=2), "conv2d_im2col"),
    ((2, 3, 5, 6), (4, 3, 3, 3), dict(padding="valid", stride=2), "conv2d_im2col"),
    ((1, 3, 40, 40), (16, 3, 3, 3), dict(padding=1), TASKS),  # parallel im2col / tasks
    ((1, 32, 40, 40), (32, 1, 3, 3), dict(groups=32, padding=1), "conv2d_depthwise"),  # parallel depthwise
]


@pytest.mark.parametrize("xs,ws,kw,kernel", CONV_CASES)
def test_conv2d_matches_direct_loop(rng, xs, ws, kw, kernel):
    x, w, b = rand(rng, xs), rand(rng, ws), rand(rng, (ws[0],))
    ex = opsnn.aclnn.conv2d.prepare(x, w, b, **kw)
    assert ex.kernel_name == kernel
    y = ex.run().numpy()
    pads = kw.get("padding", 0)
    if pads == "same":
        # torch/ONNX SAME_UPPER at stride 1: total = dilation*(k-1), extra at the end
        d = kw.get("dilation", 1)
        tot = [d * (k - 1) for k in ws[2:]]
        pads = tuple(t // 2 for t in tot) + tuple(t - t // 2 for t in tot)
    elif pads == "valid":
        pads = 0
    elif not np.isscalar(pads):
        pads = tuple(pads) * 2
    want = conv_direct(x, w, b, kw.get("stride", 1), pads, kw.get("dilation", 1), kw.get("groups", 1))
    assert y.shape == want.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, want, rtol=RTOL, atol=ATOL)
    ref = opsnn.ops.conv2d(x, w, b, algo="reference", **kw).numpy()
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize(
    "xs,ws,kw",
    [
        ((1, 3, 37, 35), (8, 3, 7, 7), dict(stride=2, padding=3)),  # ResNet stem-like, odd sizes
        ((1, 3, 64, 64), (16, 3, 7, 7), dict(stride=2, padding=3)),  # parallel im2col
        ((2, 5, 9, 12), (7, 5, 3, 3), dict(stride=2, padding=(0, 2), dilation=2)),  # dilated, asymmetric pads
        ((1, 4, 1, 1), (3, 4, 3, 3), dict(stride=2, padding=1)),  # 1x1 image
        ((1, 6, 8, 9), (6, 2, 4, 5), dict(stride=(1, 2), padding=(1, 4), groups=3)),  # pad > kernel/2, groups
        ((1, 3, 5, 20), (2, 3, 1, 3), dict(stride=(3, 2))),  # no padding, wide
    ],
)
def test_conv2d_im2col_stride2_columns(rng, xs, ws, kw, dt):
    """im2col's stride-2 column copy (a literal stride, vectorized with shuffles)."""
    x, w, b = rand(rng, xs, dt), rand(rng, ws, dt), rand(rng, (ws[0],), dt)
    y = opsnn.ops.conv2d(x, w, b, algo="conv2d_im2col", **kw).numpy()
    pads = kw.get("padding", 0)
    pads = pads if np.isscalar(pads) else tuple(pads) * 2
    want = conv_direct(x, w, b, kw.get("stride", 1), pads, kw.get("dilation", 1), kw.get("groups", 1))
    assert y.dtype == dt
    np.testing.assert_allclose(y, want, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(y, opsnn.ops.conv2d(x, w, b, algo="reference", **kw).numpy(), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "xs,ws,kw",
    [
        ((2, 3, 11), (4, 3, 3), dict(stride=2, padding=1, dilation=2)),
        ((1, 4, 5), (4, 1, 3), dict(groups=4, padding=2)),
        ((3, 2, 7), (5, 2, 1), dict()),
    ],
)
def test_conv1d(rng, xs, ws, kw):
    x, w = rand(rng, xs), rand(rng, ws)
    y = opsnn.ops.conv1d(x, w, None, **kw).numpy()
    want = conv_direct(
        x, w, None, kw.get("stride", 1), kw.get("padding", 0), kw.get("dilation", 1), kw.get("groups", 1)
    )
    np.testing.assert_allclose(y, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "xs,ws,kw,kernel",
    [
        ((2, 4, 5, 6, 7), (4, 2, 2, 3, 2), dict(groups=2, padding=1, stride=(1, 2, 1)), "conv_nd_im2col"),
        ((1, 3, 4, 4, 4), (2, 3, 3, 3, 3), dict(dilation=(1, 1, 2), padding=(1, 0, 2)), "conv_nd_im2col"),
        ((1, 3, 4, 3, 5), (2, 3, 2, 2, 2), dict(), "conv_nd_im2col"),  # no padding: no zero fill
        ((2, 3, 3, 4, 5), (5, 3, 1, 1, 1), dict(), "conv_1x1_gemm"),
    ],
)
def test_conv3d(rng, xs, ws, kw, kernel):
    x, w, b = rand(rng, xs), rand(rng, ws), rand(rng, (ws[0],))
    ex = opsnn.aclnn.conv3d.prepare(x, w, b, **kw)
    assert ex.kernel_name == kernel
    p = kw.get("padding", 0)
    want = conv_direct(
        x, w, b, kw.get("stride", 1), p if np.isscalar(p) else tuple(p) * 2, kw.get("dilation", 1), kw.get("groups", 1)
    )
    np.testing.assert_allclose(ex.run().numpy(), want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "attrs",
    [
        {"pads": [1, 0, 2, 3], "strides": [2, 1]},  # asymmetric pads
        {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
        {"auto_pad": b"SAME_LOWER", "strides": [2, 3], "dilations": [1, 2]},
        {"auto_pad": "VALID", "strides": [3, 1], "kernel_shape": [3, 2]},
        {"group": 2, "pads": [2, 2, 2, 2], "dilations": [2, 2]},
    ],
)
def test_conv_record_matches_onnxruntime(rng, attrs):
    x = rand(rng, (2, 4, 9, 8))
    w = rand(rng, (6, 4 // attrs.get("group", 1), 3, 2))
    b = rand(rng, (6,))
    got = opsnn.ops.run_op("Conv", [x, w, b], attrs)[0].numpy()
    if not (attrs.get("auto_pad", "NOTSET") != "NOTSET" and "dilations" in attrs):  # ort: unsupported combination
        np.testing.assert_allclose(got, run_ort("Conv", [x, w, b], attrs), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got, run_onnx_ref("Conv", [x, w, b], attrs), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "xs,ws,kw",
    [(xs, ws, kw) for xs, ws, kw, _ in CONV_CASES if kw.get("groups", 1) == 1]
    + [
        ((2, 3, 23, 19), (5, 3, 7, 7), dict(stride=2, padding=3)),  # a stem, odd sizes
        ((1, 2, 1, 50), (4, 2, 1, 5), dict(padding=(0, 2))),  # one output row
        ((3, 4, 17, 13), (6, 4, 3, 3), dict(dilation=2, padding=(3, 1), stride=(1, 2))),
    ],
)
@pytest.mark.parametrize("band_bytes", [64, 1 << 19])  # a task per output row (many bands) / a few bands
def test_im2col_tasks_matches_direct_loop(rng, monkeypatch, xs, ws, kw, band_bytes):
    """conv2d_im2col_tasks (a task per band of output rows: its columns in its thread's buffer,
    then single-threaded MKL), forced on every group-1 case, with tasks of one output row and
    with the default bands (uneven last band, fewer bands than threads)."""
    from opsnn.kernels.cpu import conv as KC
    from opsnn.kernels.cpu import mkl as KM
    from opsnn.ops.executor import plan_op
    from opsnn.ops.registry import TensorMeta, get_op

    if KM.unavailable():
        pytest.skip(f"MKL: {KM.unavailable()}")
    monkeypatch.setattr(KC, "TASK_BAND_BYTES", band_bytes)
    monkeypatch.setattr(KC, "TASK_MIN_COLS", 1)
    x, w, b = rand(rng, xs), rand(rng, ws), rand(rng, (ws[0],))
    ref = opsnn.ops.conv2d(x, w, b, algo="reference", **kw).numpy()  # the attrs ONNX-style, via the op
    rec = get_op("Conv")
    ex = opsnn.aclnn.conv2d.prepare(x, w, b, **kw)
    planned = plan_op(rec, [TensorMeta(a.shape, a.dtype) for a in (x, w, b)], [None, w, b], ex.attrs)
    kern = next(k for k in rec.kernels if k.name == "conv2d_im2col_tasks")
    plan = kern.plan(planned.ctx)
    assert plan.kind == "im2col_tasks" and (band_bytes > 64 or plan.band == 1)
    ws_ = np.zeros(int(kern.workspace(planned.ctx, plan)), np.uint8)
    y = np.full(ref.shape, np.nan, np.float32)
    kern.fn([x, w, b], [y], planned.ctx.attrs, plan, ws_)
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(
        y, conv_direct(x, w, b, kw.get("stride", 1), _pads(kw, ws), kw.get("dilation", 1)), rtol=RTOL, atol=ATOL
    )


def _pads(kw, ws):
    """conv2d's padding argument as conv_direct's pads (begin..., end...)."""
    pads = kw.get("padding", 0)
    if pads == "same":
        d = kw.get("dilation", 1)
        tot = [d * (k - 1) for k in ws[2:]]
        return tuple(t // 2 for t in tot) + tuple(t - t // 2 for t in tot)
    if pads == "valid":
        return 0
    return pads if np.isscalar(pads) else tuple(pads) * 2


@pytest.mark.parametrize("algo", ["conv2d_im2col", "conv_nd_im2col", "reference"])
def test_forced_algorithms_agree(rng, algo):
    x, w, b = rand(rng, (2, 4, 9, 7)), rand(rng, (6, 2, 3, 3)), rand(rng, (6,))
    kw = dict(stride=2, padding=(1, 2), dilation=(2, 1), groups=2)
    fast = opsnn.ops.conv2d(x, w, b, **kw).numpy()
    forced = opsnn.ops.conv2d(x, w, b, algo=algo, **kw).numpy()
    np.testing.assert_allclose(forced, fast, rtol=RTOL, atol=ATOL)
    with opsnn.kernel_selector(Conv=algo):
        np.testing.assert_allclose(opsnn.ops.conv2d(x, w, b, **kw).numpy(), fast, rtol=RTOL, atol=ATOL)


def test_forced_kernel_that_does_not_apply_raises(rng):
    x, w = rand(rng, (1, 3, 5, 5)), rand(rng, (2, 3, 3, 3))
    with pytest.raises(opsnn.errors.KernelNotFoundError, match="1x1"):
        opsnn.ops.conv2d(x, w, algo="conv_1x1_gemm")


def test_float64(rng):
    x, w = rand(rng, (2, 3, 6, 6), np.float64), rand(rng, (4, 3, 3, 3), np.float64)
    y = opsnn.ops.conv2d(x, w, stride=2, padding=1)
    assert y.dtype == np.float64
    np.testing.assert_allclose(y.numpy(), conv_direct(x, w, None, 2, 1), rtol=1e-12, atol=1e-12)


# -- layouts, empties, special values, 16-bit ---------------------------------------------------------
def test_non_contiguous_inputs(rng, no_leak):
    xt = rand(rng, (2, 8, 9, 3)).transpose(0, 3, 1, 2)  # NHWC storage viewed as NCHW
    assert not xt.flags.c_contiguous
    w = rand(rng, (3, 3, 3, 5))[..., ::2]  # strided weight view (3, 3, 3, 3)
    assert not w.flags.c_contiguous
    want = conv_direct(xt, w, None, 1, 1)
    got = opsnn.ops.conv2d(opsnn.from_numpy(xt), opsnn.from_numpy(w), padding=1).numpy()
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    t = opsnn.tensor(rand(rng, (3, 2, 8, 9))).transpose(0, 1)  # opsnn view
    got = opsnn.ops.conv2d(t, opsnn.tensor(w), stride=2).numpy()
    np.testing.assert_allclose(got, conv_direct(t.numpy(), w, None, 2, 0), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "fn,ws",
    [
        ("conv2d", (4, 3, 3, 3)),
        ("conv2d", (4, 3, 1, 1)),
        ("conv2d", (3, 1, 3, 3)),
        ("conv3d", (4, 3, 2, 2, 2)),
        ("conv_transpose2d", (3, 4, 3, 3)),
    ],
)
def test_empty_batch(rng, fn, ws):
    x = np.zeros((0, 3) + (5,) * (len(ws) - 2), np.float32)
    w = rand(rng, ws)
    groups = 3 if ws[:2] == (3, 1) else 1
    y = getattr(opsnn.ops, fn)(x, w, None, groups=groups)
    ref = getattr(opsnn.ops, fn)(x, w, None, groups=groups, algo="reference")
    assert y.shape == ref.shape and y.shape[0] == 0 and y.shape[1] == (4 if fn != "conv2d" or groups == 1 else 3)


@pytest.mark.parametrize(
    "fn,xs,ws,pads",
    [
        ("conv2d", (2, 0, 5, 5), (4, 0, 3, 3), 1),
        ("conv2d", (2, 0, 5, 5), (4, 0, 1, 1), 0),
        ("conv2d", (1, 0, 6, 5), (3, 0, 3, 2), 0),
        ("conv1d", (2, 0, 7), (4, 0, 3), 0),
        ("conv3d", (1, 0, 3, 4, 4), (2, 0, 2, 2, 2), 1),
    ],
)
def test_zero_input_channels_give_the_bias(rng, fn, xs, ws, pads):
    """No input channels: every output is an empty sum plus the bias (the direct loop's answer)."""
    x, w = np.zeros(xs, np.float32), np.zeros(ws, np.float32)
    b = rand(rng, (ws[0],))
    got = getattr(opsnn.ops, fn)(x, w, b, padding=pads).numpy()
    np.testing.assert_allclose(got, conv_direct(x, w, b, 1, pads), rtol=0, atol=0)
    np.testing.assert_array_equal(getattr(opsnn.ops, fn)(x, w, None, padding=pads).numpy(), 0)


def test_nan_and_inf_propagate(rng):
    x = rand(rng, (1, 2, 6, 6))
    x[0, 1, 2, 3] = np.nan
    x[0, 0, 5, 5] = np.inf
    w = np.abs(rand(rng, (3, 2, 3, 3))) + 0.1
    for kw in (dict(padding=1), dict(padding=1, algo="conv_nd_im2col")):
        y = opsnn.ops.conv2d(x, w, **kw).numpy()
        ref = opsnn.ops.conv2d(x, w, padding=1, algo="reference").numpy()
        np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
        assert np.isnan(y[0, :, 1:4, 2:5]).all() and np.isinf(y[0, :, 5, 5]).all()
        finite = np.isfinite(ref)
        np.testing.assert_allclose(y[finite], ref[finite], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("op", ["conv2d", "conv2d_dw", "conv_transpose2d"])
def test_16bit(rng, dtype, op):
    x = rand(rng, (2, 4, 7, 6)).astype(dtype)
    if op == "conv2d_dw":
        w, kw, fn = rand(rng, (4, 1, 3, 3)).astype(dtype), dict(groups=4, padding=1), "conv2d"
    elif op == "conv2d":
        w, kw, fn = rand(rng, (5, 4, 3, 3)).astype(dtype), dict(stride=2, padding=1), "conv2d"
    else:
        w, kw, fn = (
            rand(rng, (4, 3, 3, 3)).astype(dtype),
            dict(stride=2, padding=1, output_padding=1),
            "conv_transpose2d",
        )
    ex = getattr(opsnn.aclnn, fn).prepare(x, w, None, **kw)
    # bf16 conv2d runs natively on oneDNN where it has AVX512-BF16; the rest widens to float32
    native = dtype == ml_dtypes.bfloat16 and op == "conv2d" and KD.bf16_unavailable() is None
    assert ex.adapter != native and ex.kernel_name != "reference"
    assert (ex.kernel_name == "conv_onednn_plain") == native, ex.reason
    y = ex.run().numpy()
    assert y.dtype == np.dtype(dtype)
    want = getattr(opsnn.ops, fn)(x.astype(np.float32), w.astype(np.float32), None, **kw).numpy()
    scale = np.abs(want).max()
    np.testing.assert_allclose(y.astype(np.float32), want, rtol=1e-2, atol=1e-2 * scale)


# -- workspace and the two-phase API --------------------------------------------------------------------
def test_workspace_sizes(rng):
    x = rand(rng, (2, 6, 10, 9))
    ex = opsnn.aclnn.conv2d.prepare(x, rand(rng, (4, 6, 3, 3)), padding=1)
    assert ex.kernel_name == "conv2d_im2col"
    # one image's column buffer: C*kh*kw rows x OH*OW columns of float32
    assert ex.workspace_size >= 6 * 9 * 10 * 9 * 4
    ex1 = opsnn.aclnn.conv2d.prepare(x, rand(rng, (4, 6, 1, 1)))
    assert ex1.kernel_name == "conv_1x1_gemm" and ex1.workspace_size == 0
    exd = opsnn.aclnn.conv2d.prepare(x, rand(rng, (6, 1, 3, 3)), groups=6)
    assert exd.workspace_size == 0
    # 16-bit inputs still compute (and need their column buffer) in float32
    ex16 = opsnn.aclnn.conv2d.prepare(x.astype(np.float16), rand(rng, (4, 6, 3, 3)).astype(np.float16), padding=1)
    assert ex16.workspace_size == ex.workspace_size
    ext = opsnn.aclnn.conv_transpose2d.prepare(x, rand(rng, (6, 2, 3, 3)), stride=2)
    assert ext.workspace_size >= 2 * 9 * 10 * 9 * 4


def test_two_phase_with_user_workspace(rng, no_leak):
    x = opsnn.tensor(rand(rng, (2, 3, 8, 8)))
    w = opsnn.tensor(rand(rng, (5, 3, 3, 3)))
    b = opsnn.tensor(rand(rng, (5,)))
    ex = opsnn.aclnn.conv2d.prepare(x, w, b, stride=1, padding=1)
    ws = opsnn.empty((ex.workspace_size,), "uint8")
    y = ex.run(ws)
    np.testing.assert_allclose(y.numpy(), conv_direct(x.numpy(), w.numpy(), b.numpy(), 1, 1), rtol=RTOL, atol=ATOL)
    # rerun after writing new data into the bound input: same executor, same workspace
    x.copy_(rand(rng, (2, 3, 8, 8)))
    y = ex.run(ws)
    np.testing.assert_allclose(y.numpy(), conv_direct(x.numpy(), w.numpy(), b.numpy(), 1, 1), rtol=RTOL, atol=ATOL)
    # a workspace that is not 64-byte aligned still works (the size includes alignment slack)
    raw = np.zeros(ex.workspace_size + 3, np.uint8)[3:]
    y2 = ex.run(raw)
    np.testing.assert_allclose(y2.numpy(), y.numpy(), rtol=0, atol=0)
    with pytest.raises(ParamInvalidError, match="workspace"):
        ex.run(opsnn.empty((ex.workspace_size // 2,), "uint8"))
    del y, y2, ws, ex


def test_out_tensor_and_repeatable_transpose(rng):
    x, w = rand(rng, (1, 4, 5, 5)), rand(rng, (4, 2, 3, 3))
    out = opsnn.empty((1, 2, 11, 11), "float32")
    ex = opsnn.aclnn.conv_transpose2d.prepare(x, w, None, stride=2, out=out)
    assert ex.run() is out
    first = out.numpy().copy()
    ex.run()
    np.testing.assert_array_equal(out.numpy(), first)  # col2im re-initialises the output every run
    np.testing.assert_allclose(first, conv_transpose_direct(x, w, None, 2), rtol=RTOL, atol=ATOL)


# -- typed errors ---------------------------------------------------------------------------------------------
def test_errors(rng):
    x = rand(rng, (1, 4, 6, 6))
    with pytest.raises(InferShapeError, match=r"C=4.*3 \* 1 = 3"):
        opsnn.ops.conv2d(x, rand(rng, (2, 3, 3, 3)))
    with pytest.raises(ParamInvalidError, match="strides.*positive.*0"):
        opsnn.ops.conv2d(x, rand(rng, (2, 4, 3, 3)), stride=0)
    with pytest.raises(ParamInvalidError, match="strides.*positive"):
        opsnn.ops.conv2d(x, rand(rng, (2, 4, 3, 3)), stride=(1, -2))
    with pytest.raises(ParamInvalidError, match="dilations"):
        opsnn.ops.conv2d(x, rand(rng, (2, 4, 3, 3)), dilation=0)
    with pytest.raises(InferShapeError, match="larger than the padded input"):
        opsnn.ops.conv2d(x, rand(rng, (2, 4, 7, 3)))
    with pytest.raises(InferShapeError, match="larger than the padded input"):
        opsnn.ops.conv2d(x, rand(rng, (2, 4, 3, 3)), dilation=4)
    with pytest.raises(InferShapeError, match="not divisible by group"):
        opsnn.ops.conv2d(x, rand(rng, (3, 2, 3, 3)), groups=2)
    with pytest.raises(InferShapeError, match="bias"):
        opsnn.ops.conv2d(x, rand(rng, (2, 4, 3, 3)), rand(rng, (3,)))
    with pytest.raises(DTypeError, match="same dtype"):
        opsnn.ops.conv2d(x, rand(rng, (2, 4, 3, 3), np.float64))
    with pytest.raises(DTypeError):
        opsnn.ops.conv2d(x.astype(np.int32), rand(rng, (2, 4, 3, 3)).astype(np.int32))
    with pytest.raises(ParamInvalidError, match="4-D"):
        opsnn.ops.conv2d(x[0], rand(rng, (2, 4, 3, 3)))
    with pytest.raises(ParamInvalidError, match="padding"):
        opsnn.ops.conv2d(x, rand(rng, (2, 4, 3, 3)), padding="full")
    with pytest.raises(ParamInvalidError, match="stride"):
        opsnn.ops.conv2d(x, rand(rng, (2, 4, 3, 3)), stride=(1, 2, 3))
    with pytest.raises(ParamInvalidError, match="pads.*>= 0"):
        opsnn.ops.run_op("Conv", [x, rand(rng, (2, 4, 3, 3))], {"pads": [-1, 0, 0, 0]})
    with pytest.raises(ParamInvalidError, match="auto_pad"):
        opsnn.ops.run_op("Conv", [x, rand(rng, (2, 4, 3, 3))], {"auto_pad": "SAME"})
    with pytest.raises(InferShapeError, match="kernel_shape"):
        opsnn.ops.run_op("Conv", [x, rand(rng, (2, 4, 3, 3))], {"kernel_shape": [2, 2]})
    with pytest.raises(InferShapeError, match="rank"):
        opsnn.ops.run_op("Conv", [x, rand(rng, (2, 4, 3))], {})
    with pytest.raises(InferShapeError, match="W.shape\\[0\\]=3"):
        opsnn.ops.conv_transpose2d(x, rand(rng, (3, 2, 3, 3)))
    with pytest.raises(InferShapeError, match="not positive"):
        opsnn.ops.conv_transpose2d(x, rand(rng, (4, 2, 1, 1)), padding=3)
    with pytest.raises(ParamInvalidError, match="output_padding"):
        opsnn.ops.conv_transpose2d(x, rand(rng, (4, 2, 3, 3)), output_padding=-1)


# -- ConvTranspose --------------------------------------------------------------------------------------------
CT_CASES = [
    ((1, 2, 3, 3), (2, 3, 3, 3), dict()),
    ((2, 4, 4, 5), (4, 3, 3, 2), dict(stride=2, padding=1, output_padding=1)),
    ((1, 4, 3, 4), (4, 1, 3, 3), dict(stride=(3, 2), groups=2, dilation=(2, 1))),
    ((2, 6, 5, 4), (6, 1, 3, 3), dict(groups=6, padding=1)),  # depthwise transpose
    ((1, 3, 1, 1), (3, 2, 4, 4), dict(stride=2)),  # 1x1 input
    ((1, 2, 4, 4), (2, 2, 2, 2), dict(stride=4)),  # stride > kernel: gaps
    ((1, 2, 5, 5), (2, 2, 3, 3), dict(padding=2, stride=1)),  # padding crops
    ((1, 3, 30, 30), (3, 8, 3, 3), dict(stride=2, padding=1, output_padding=1)),  # parallel col2im
]


@pytest.mark.parametrize("xs,ws,kw", CT_CASES)
def test_conv_transpose2d_matches_direct_loop(rng, xs, ws, kw):
    x, w, b = rand(rng, xs), rand(rng, ws), rand(rng, (ws[1] * kw.get("groups", 1),))
    ex = opsnn.aclnn.conv_transpose2d.prepare(x, w, b, **kw)
    assert ex.kernel_name == "conv_transpose_col2im"
    y = ex.run().numpy()
    p = kw.get("padding", 0)
    nd = 2
    s = kw.get("stride", 1)
    s = (s,) * nd if np.isscalar(s) else s
    d = kw.get("dilation", 1)
    d = (d,) * nd if np.isscalar(d) else d
    op = kw.get("output_padding", 0)
    out = tuple(s[i] * (xs[2 + i] - 1) + (ws[2 + i] - 1) * d[i] + 1 - 2 * p + op for i in range(nd))
    want = conv_transpose_direct(x, w, b, s, p, d, kw.get("groups", 1), out)
    np.testing.assert_allclose(y, want, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(
        opsnn.ops.conv_transpose2d(x, w, b, algo="reference", **kw).numpy(), want, rtol=RTOL, atol=ATOL
    )


def spec_transpose_pads(xs, ws, attrs):
    """ConvTranspose pads and output size, transcribed from the ONNX operator spec."""
    nd = len(xs) - 2
    s = attrs.get("strides", [1] * nd)
    d = attrs.get("dilations", [1] * nd)
    op = attrs.get("output_padding", [0] * nd)
    full = [s[i] * (xs[2 + i] - 1) + op[i] + (ws[2 + i] - 1) * d[i] + 1 for i in range(nd)]
    out = attrs.get("output_shape")
    if out is None and attrs.get("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER"):
        out = [xs[2 + i] * s[i] for i in range(nd)]
    if out is not None:
        tot = [full[i] - out[i] for i in range(nd)]
        if attrs.get("auto_pad") == "SAME_UPPER":
            head = [t // 2 for t in tot]
        else:
            head = [t - t // 2 for t in tot]
        head = [0 if t < 0 else h for t, h in zip(tot, head)]  # opsnn: extra output goes at the end
        pads = head + [t - h for t, h in zip(tot, head)]
    else:
        pads = attrs.get("pads", [0] * 2 * nd)
    return s, d, pads, [full[i] - pads[i] - pads[nd + i] for i in range(nd)]


# ONNX's reference ConvTranspose mishandles groups with a bias and negative pads;
# onnxruntime rejects output_shape past -stride total padding and output_padding >= stride,
# and clamps SAME's total padding at 0 (the spec makes the output input*stride). Each case
# says which peers it is also compared with; the direct-loop oracle checks them all.
@pytest.mark.parametrize(
    "xs,ws,attrs,peers",
    [
        ((1, 2, 3, 3), (2, 2, 3, 3), {"output_shape": [10, 8], "strides": [3, 2]}, "ort,ref"),
        ((1, 2, 3, 3), (2, 2, 3, 3), {"output_shape": [11, 8], "strides": [3, 2]}, "ort"),  # negative pads
        ((1, 2, 3, 3), (2, 2, 3, 3), {"output_shape": [12, 9], "strides": [3, 2]}, ""),
        ((1, 2, 4, 3), (2, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, "ort,ref"),
        ((1, 2, 4, 3), (2, 3, 3, 2), {"auto_pad": "SAME_LOWER", "strides": [2, 1]}, "ort,ref"),
        ((1, 2, 4, 3), (2, 3, 3, 2), {"auto_pad": "SAME_LOWER", "strides": [2, 3]}, "ref"),
        ((2, 4, 3, 3), (4, 1, 2, 2), {"group": 2, "pads": [1, 0, 0, 1], "strides": [2, 2], "dilations": [2, 1]}, "ort"),
        ((1, 2, 5), (2, 3, 3), {"strides": [2], "output_padding": [1], "pads": [1, 0]}, "ort,ref"),  # 1-D
        ((1, 2, 3, 4, 2), (2, 2, 2, 3, 2), {"strides": [2, 1, 2], "pads": [1, 0, 0, 0, 1, 1]}, "ort,ref"),  # 3-D
        (
            (2, 4, 2, 3, 2),
            (4, 1, 3, 2, 2),
            {"group": 4, "strides": [1, 2, 3], "dilations": [2, 1, 1], "output_padding": [0, 1, 2]},
            "ort",
        ),
    ],
)
def test_conv_transpose_record(rng, xs, ws, attrs, peers):
    x, w = rand(rng, xs), rand(rng, ws)
    g = attrs.get("group", 1)
    b = rand(rng, (ws[1] * g,))
    got = opsnn.ops.run_op("ConvTranspose", [x, w, b], attrs)[0].numpy()
    s, d, pads, out = spec_transpose_pads(xs, ws, attrs)
    want = conv_transpose_direct(x, w, b, s, pads, d, g, out)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    ref = opsnn.ops.run_op("ConvTranspose", [x, w, b], attrs, algo="reference")[0].numpy()
    np.testing.assert_allclose(ref, want, rtol=RTOL, atol=ATOL)
    if "ort" in peers:
        np.testing.assert_allclose(got, run_ort("ConvTranspose", [x, w, b], attrs), rtol=RTOL, atol=ATOL)
    if "ref" in peers:
        np.testing.assert_allclose(got, run_onnx_ref("ConvTranspose", [x, w, b], attrs), rtol=RTOL, atol=ATOL)


# -- quantized convolutions -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_conv_integer(rng, dtype):
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max + 1, (2, 4, 6, 5)).astype(dtype)
    w = rng.integers(info.min, info.max + 1, (6, 2, 3, 3)).astype(dtype)
    x_zp = np.array(7, dtype)
    w_zp = rng.integers(info.min, info.max + 1, (6,)).astype(dtype)
    attrs = {"group": 2, "pads": [1, 1, 0, 2], "strides": [2, 1]}
    ex = opsnn.aclnn.prepare("ConvInteger", [x, w, x_zp, w_zp], attrs)
    assert ex.kernel_name == "conv_integer_im2col"
    got = ex.run().numpy()
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, run_onnx_ref("ConvInteger", [x, w, x_zp, w_zp], attrs, opset=10))
    np.testing.assert_array_equal(
        got, opsnn.ops.run_op("ConvInteger", [x, w, x_zp, w_zp], attrs, algo="reference")[0].numpy()
    )
    # padding is zero *after* the zero-point shift; without zero points it is plain zero
    got0 = opsnn.ops.conv_integer(x, w, groups=2).numpy()
    want0 = conv_direct(x.astype(np.int64), w.astype(np.int64), None, 1, 0, 1, 2)
    np.testing.assert_array_equal(got0, want0.astype(np.int32))


@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv(rng, per_channel):
    x = rng.integers(0, 256, (1, 3, 7, 6)).astype(np.uint8)
    # 7-bit weights: onnxruntime's AVX2 u8s8 kernel (no VNNI) sums pairs of u8 x s8 products in
    # saturating int16 and differs from the exact result by up to ~30 for full-range weights
    # (seen on the AVX2 dev VM); with |w| <= 64 the pair sums fit and it is exact on every CPU
    w = rng.integers(-64, 64, (4, 3, 3, 3)).astype(np.int8)
    x_s, x_zp = np.array(0.02, np.float32), np.array(128, np.uint8)
    w_s = (rng.uniform(0.005, 0.02, (4,)) if per_channel else np.array(0.01)).astype(np.float32)
    w_zp = np.zeros((4,) if per_channel else (), np.int8)
    y_s, y_zp = np.array(0.15, np.float32), np.array(120, np.uint8)
    b = rng.integers(-2000, 2000, (4,)).astype(np.int32)
    ins = [x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp, b]
    attrs = {"pads": [1, 1, 1, 1], "strides": [1, 2]}
    got = opsnn.ops.run_op("QLinearConv", ins, attrs)[0].numpy()
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, run_onnx_ref("QLinearConv", ins, attrs, opset=10))
    want_ort = run_ort("QLinearConv", ins, attrs, opset=10)
    assert np.abs(got.astype(int) - want_ort.astype(int)).max() <= 1  # ort requantizes in float32
    # full-range weights: exact against the ONNX reference (no int16 saturation here)
    ins[3] = rng.integers(-128, 128, (4, 3, 3, 3)).astype(np.int8)
    got = opsnn.ops.run_op("QLinearConv", ins, attrs)[0].numpy()
    np.testing.assert_array_equal(got, run_onnx_ref("QLinearConv", ins, attrs, opset=10))


# -- property test: inferred shape == direct formula == the kernel's output --------------------------------
@settings(max_examples=30, deadline=None)
@given(
    h=st.integers(1, 9),
    w_=st.integers(1, 9),
    k=st.integers(1, 4),
    s=st.integers(1, 4),
    p=st.integers(0, 3),
    d=st.integers(1, 3),
    g=st.sampled_from([1, 2]),
)
def test_conv_shape_property(h, w_, k, s, p, d, g):
    rng = np.random.default_rng(h * 100 + w_)
    eff = (k - 1) * d + 1
    x = rand(rng, (1, 2 * g, h, w_))
    wt = rand(rng, (2 * g, 2, k, k))
    if h + 2 * p < eff or w_ + 2 * p < eff:
        with pytest.raises(InferShapeError):
            opsnn.aclnn.conv2d.prepare(x, wt, stride=s, padding=p, dilation=d, groups=g)
        return
    y = opsnn.ops.conv2d(x, wt, stride=s, padding=p, dilation=d, groups=g).numpy()
    assert y.shape == (1, 2 * g, (h + 2 * p - eff) // s + 1, (w_ + 2 * p - eff) // s + 1)
    ref = opsnn.ops.conv2d(x, wt, stride=s, padding=p, dilation=d, groups=g, algo="reference").numpy()
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "xs,ws,stride,pad,groups",
    [
        ((1, 3, 45, 50), (8, 3, 7, 7), 2, 3, 1),  # stem-like: 147 column rows > 8 channels
        ((2, 4, 23, 17), (6, 2, 5, 5), 1, 2, 2),  # groups: 50 column rows per group > 3 channels
        ((1, 2, 9, 9), (3, 2, 3, 3), 1, 1, 1),  # fewer output columns than one band's minimum
    ],
)
def test_im2col_cache_bands(monkeypatch, rng, xs, ws, stride, pad, groups):
    """Few-column-row im2col convs run in cache-sized bands: same result as one band."""
    from opsnn.kernels.cpu import conv as KC

    x, w, b = rand(rng, xs), rand(rng, ws), rand(rng, (ws[0],))
    k = ws[2]
    out = tuple((n + 2 * pad - k) // stride + 1 for n in xs[2:])

    def run():
        plan = KC.conv_plan(xs, ws, groups, (k, k), (stride, stride), (1, 1), (pad, pad), (pad, pad), out, 4)
        y = np.empty((xs[0], ws[0]) + out, np.float32)
        KC.conv_forward(x, w, b, y, plan, np.empty(plan.workspace_bytes, np.uint8))
        return y, plan

    whole, plan = run()
    assert plan.band == out[0]
    monkeypatch.setattr(KC, "CACHE_BAND_MIN_WHOLE", 0)
    for cap, min_cols in ((1, 1), (2000, 1), (4000, 40)):
        monkeypatch.setattr(KC, "CACHE_BAND_BYTES", cap)
        monkeypatch.setattr(KC, "CACHE_BAND_MIN_COLS", min_cols)
        y, plan = run()
        assert plan.band < out[0] or out[0] * out[1] <= min_cols
        np.testing.assert_allclose(y, whole, rtol=1e-5, atol=1e-5, err_msg=f"band {plan.band}")
    want = conv_direct(x, w, b, stride, pad, 1, groups)
    np.testing.assert_allclose(whole, want, rtol=RTOL, atol=ATOL)
