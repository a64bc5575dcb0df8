"""Vision-family ops (GridSample, DeformConv, NonMaxSuppression, CumProd, Det, BitCast,
TensorScatter) against independent oracles: onnx.reference.ReferenceEvaluator (run per
node), hand-written numpy formulas, and numpy.linalg.

Tolerances: float32 results rtol/atol 1e-4 against ReferenceEvaluator (which computes grid
coordinates in float32) and 1e-5 against float64 formulas; float64 1e-10; 16-bit results
against the float32 computation on the same 16-bit inputs, rtol/atol 2e-2. Integer and
index outputs compare exactly.
"""

import importlib
import warnings

import ml_dtypes
import numpy as np
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import opsnn
from opsnn import aclnn
from opsnn.errors import DTypeError, InferShapeError, ParamInvalidError

V = importlib.import_module("opsnn.ops.defs.vision")
BF16 = np.dtype(ml_dtypes.bfloat16)


def onnx_ref(op_type, inputs, opset=22, n_out=1, **attrs):
    """One node through onnx.reference.ReferenceEvaluator; ``inputs`` may hold None (omitted)."""
    names = [f"x{i}" if a is not None else "" for i, a in enumerate(inputs)]
    vis = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in zip(names, inputs)
        if a is not None
    ]
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op_type, names, outs, **attrs)
    graph = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info(o, 0, None) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        res = ReferenceEvaluator(model).run(None, {n: a for n, a in zip(names, inputs) if a is not None})
    return res[0] if n_out == 1 else res


# == GridSample ======================================================================================
GS_MODES = ["linear", "nearest", "cubic"]
GS_PADS = ["zeros", "border", "reflection"]


def _grid(rng, shape, spread=1.3):
    return rng.uniform(-spread, spread, size=shape).astype(np.float32)


@pytest.mark.parametrize("mode", GS_MODES)
@pytest.mark.parametrize("padding", GS_PADS)
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_2d_matches_onnx_reference(rng, no_leak, mode, padding, align):
    x = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    g = _grid(rng, (2, 3, 4, 2))
    want = onnx_ref("GridSample", [x, g], mode=mode, padding_mode=padding, align_corners=align)
    ex = aclnn.grid_sample.prepare(
        opsnn.tensor(x), opsnn.tensor(g), mode=mode, padding_mode=padding, align_corners=bool(align)
    )
    assert ex.kernel_name == "grid_sample_numba"
    np.testing.assert_allclose(ex.run().numpy(), want, rtol=1e-4, atol=1e-4)
    ref = V.grid_sample(
        opsnn.tensor(x), opsnn.tensor(g), mode=mode, padding_mode=padding, align_corners=bool(align), algo="reference"
    ).numpy()
    np.testing.assert_allclose(ref, want, rtol=1e-4, atol=1e-4)
    numpy_k = V.grid_sample(
        opsnn.tensor(x),
        opsnn.tensor(g),
        mode=mode,
        padding_mode=padding,
        align_corners=bool(align),
        algo="grid_sample_numpy",
    ).numpy()
    np.testing.assert_allclose(numpy_k, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", GS_MODES)
@pytest.mark.parametrize("padding", GS_PADS)
def test_grid_sample_3d_and_1d_match_onnx_reference(rng, no_leak, mode, padding):
    x = rng.standard_normal((1, 2, 3, 4, 3)).astype(np.float32)
    g = _grid(rng, (1, 2, 2, 3, 3))
    for align in (0, 1):
        want = onnx_ref("GridSample", [x, g], mode=mode, padding_mode=padding, align_corners=align)
        got = V.grid_sample(
            opsnn.tensor(x), opsnn.tensor(g), mode=mode, padding_mode=padding, align_corners=bool(align)
        ).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    x1 = rng.standard_normal((2, 2, 6)).astype(np.float32)
    g1 = _grid(rng, (2, 5, 1))
    want = onnx_ref("GridSample", [x1, g1], mode=mode, padding_mode=padding, align_corners=0)
    got = V.grid_sample(opsnn.tensor(x1), opsnn.tensor(g1), mode=mode, padding_mode=padding).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_grid_sample_hand_values(no_leak):
    x = np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)  # [[0, 1], [2, 3]]
    # align_corners: -1/+1 are the corner pixel centres; the centre averages all four
    g = np.array([[[[-1, -1], [1, -1], [-1, 1], [1, 1], [0, 0]]]], np.float32)
    got = V.grid_sample(opsnn.tensor(x), opsnn.tensor(g), align_corners=True).numpy()
    np.testing.assert_allclose(got.reshape(-1), [0, 1, 2, 3, 1.5], atol=1e-6)
    # without align_corners, -1 is the outer edge: half a pixel of zero padding on each side
    got = V.grid_sample(opsnn.tensor(x), opsnn.tensor(g[:, :, :1]), align_corners=False).numpy()
    np.testing.assert_allclose(got.reshape(-1), [0.0 * 0.25], atol=1e-6)
    got = V.grid_sample(opsnn.tensor(x), opsnn.tensor(g[:, :, 3:4]), align_corners=False).numpy()
    np.testing.assert_allclose(got.reshape(-1), [3 * 0.25], atol=1e-6)


def test_grid_sample_large_parallel_float64_noncontiguous(rng, no_leak):
    x = rng.standard_normal((2, 4, 20, 24))
    g = rng.uniform(-1.1, 1.1, size=(2, 64, 40, 2))  # 2 * 4 * 2560 outputs: the parallel path
    xt = np.ascontiguousarray(x.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)  # non-contiguous view
    for mode in GS_MODES:
        got = V.grid_sample(opsnn.from_numpy(xt), opsnn.tensor(g), mode=mode, padding_mode="reflection").numpy()
        want = V.grid_sample_numpy(x, g, {"mode": mode, "padding_mode": "reflection", "align_corners": 0})
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    ex = aclnn.grid_sample.prepare(opsnn.tensor(x), opsnn.tensor(g))
    assert ex.plan.parallel


def test_grid_sample_nan_inf_and_empty(no_leak):
    x = np.arange(12, dtype=np.float32).reshape(1, 1, 3, 4)
    g = np.array([[[[np.nan, 0.0], [0.0, np.inf], [-np.inf, 0.2], [1e30, -1e30]]]], np.float32)
    for mode in GS_MODES:
        for pad in GS_PADS:
            got = V.grid_sample(opsnn.tensor(x), opsnn.tensor(g), mode=mode, padding_mode=pad).numpy()
            ref = V.grid_sample(opsnn.tensor(x), opsnn.tensor(g), mode=mode, padding_mode=pad, algo="reference").numpy()
            assert np.isnan(got[0, 0, 0, 0])  # a NaN coordinate gives NaN
            np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6, equal_nan=True)
            if pad == "zeros":
                np.testing.assert_array_equal(got[0, 0, 0, 1:], 0)  # far outside reads zero padding
            if pad == "border":
                assert np.isfinite(got[0, 0, 0, 1:]).all()
    empty = V.grid_sample(opsnn.tensor(x), opsnn.tensor(np.zeros((1, 0, 3, 2), np.float32))).numpy()
    assert empty.shape == (1, 1, 0, 3)
    none = V.grid_sample(
        opsnn.tensor(np.zeros((0, 2, 3, 3), np.float32)), opsnn.tensor(np.zeros((0, 2, 2, 2), np.float32))
    ).numpy()
    assert none.shape == (0, 2, 2, 2)
    # no channels, through the numpy kernel (any rank, integer X): an empty result, not a reshape
    # ValueError (found by opsnn fuzz, nan_inf 71592)
    for algo in ("grid_sample_numpy", None):
        x0 = np.zeros((4, 0, 1), np.int64)
        got = V.grid_sample(opsnn.tensor(x0), opsnn.tensor(np.zeros((4, 3, 1), np.float32)), algo=algo).numpy()
        assert got.shape == (4, 0, 3) and got.dtype == np.int64


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_grid_sample_16bit(rng, no_leak, dtype):
    x = rng.standard_normal((1, 2, 6, 5)).astype(dtype)
    g = _grid(rng, (1, 4, 4, 2), 1.0).astype(dtype)
    ex = aclnn.grid_sample.prepare(opsnn.tensor(x), opsnn.tensor(g), mode="bicubic")
    assert ex.kernel_name == "grid_sample_numba" and ex.adapter
    got = ex.run().numpy()
    assert got.dtype == dtype
    want = V.grid_sample_numpy(
        x.astype(np.float32), g.astype(np.float32), {"mode": "cubic", "padding_mode": "zeros", "align_corners": 0}
    )
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-2, atol=2e-2)


def test_grid_sample_integers_and_torch_names(rng, no_leak):
    x = rng.integers(0, 100, size=(1, 2, 4, 4)).astype(np.int32)
    g = _grid(rng, (1, 3, 3, 2), 1.0)
    ex = aclnn.grid_sample.prepare(opsnn.tensor(x), opsnn.tensor(g), mode="nearest")
    assert ex.kernel_name == "grid_sample_numpy"
    want = onnx_ref("GridSample", [x, g], mode="nearest")
    np.testing.assert_array_equal(ex.run().numpy(), want)
    # "bilinear" (torch / GridSample-16 name) is "linear"
    xf = x.astype(np.float32)
    a = V.grid_sample(opsnn.tensor(xf), opsnn.tensor(g), mode="bilinear").numpy()
    b = V.grid_sample(opsnn.tensor(xf), opsnn.tensor(g), mode="linear").numpy()
    np.testing.assert_array_equal(a, b)


def test_grid_sample_errors(no_leak):
    x = opsnn.tensor(np.zeros((1, 1, 3, 3), np.float32))
    g = opsnn.tensor(np.zeros((1, 2, 2, 2), np.float32))
    with pytest.raises(ParamInvalidError, match="mode"):
        V.grid_sample(x, g, mode="area")
    with pytest.raises(ParamInvalidError, match="padding_mode"):
        V.grid_sample(x, g, padding_mode="wrap")
    with pytest.raises(InferShapeError, match="last dim"):
        V.grid_sample(x, opsnn.tensor(np.zeros((1, 2, 2, 3), np.float32)))
    with pytest.raises(InferShapeError, match="batch"):
        V.grid_sample(x, opsnn.tensor(np.zeros((2, 2, 2, 2), np.float32)))
    with pytest.raises(InferShapeError, match="rank"):
        V.grid_sample(opsnn.tensor(np.zeros((3, 3), np.float32)), g)
    with pytest.raises(DTypeError):
        V.grid_sample(x, opsnn.tensor(np.zeros((1, 2, 2, 2), np.int32)))


# == DeformConv ===================================================================================
def _conv2d_numpy(x, w, b, stride, pad, dil, group):
    """Plain grouped 2-D convolution in float64 (the zero-offset oracle)."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad[0], pad[2]), (pad[1], pad[3])))
    oh = (h + pad[0] + pad[2] - (kh - 1) * dil[0] - 1) // stride[0] + 1
    ow = (wd + pad[1] + pad[3] - (kw - 1) * dil[1] - 1) // stride[1] + 1
    y = np.zeros((n, m, oh, ow))
    mg = m // group
    for o in range(m):
        gi = o // mg
        for i in range(kh):
            for j in range(kw):
                patch = xp[
                    :,
                    gi * cg : (gi + 1) * cg,
                    i * dil[0] : i * dil[0] + stride[0] * (oh - 1) + 1 : stride[0],
                    j * dil[1] : j * dil[1] + stride[1] * (ow - 1) + 1 : stride[1],
                ]
                y[:, o] += np.einsum("nchw,c->nhw", patch, w[o, :, i, j])
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return y


def test_deform_conv_zero_offsets_is_conv(rng, no_leak):
    x = rng.standard_normal((2, 4, 7, 6)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 2)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    attrs = dict(strides=[2, 1], pads=[1, 0, 2, 1], dilations=[1, 2], group=2, offset_group=2)
    oh, ow = (7 + 3 - 3) // 2 + 1, (6 + 1 - 3) // 1 + 1
    off = np.zeros((2, 2 * 3 * 2 * 2, oh, ow), np.float32)
    ex = aclnn.prepare("DeformConv", [x, w, off, b], attrs)
    assert ex.kernel_name == "deform_conv2d_im2col" and ex.workspace_size > 0
    got = ex.run(opsnn.empty((ex.workspace_size,), "uint8")).numpy()
    want = _conv2d_numpy(x, w, b, [2, 1], [1, 0, 2, 1], [1, 2], 2)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_deform_conv_matches_onnx_reference(rng, no_leak):
    x = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
    w = rng.standard_normal((2, 2, 2, 2)).astype(np.float32)
    b = rng.standard_normal(2).astype(np.float32)
    off = (rng.standard_normal((1, 2 * 4 * 2, 4, 4)) * 1.5).astype(np.float32)
    mask = rng.uniform(0, 1, size=(1, 2 * 4, 4, 4)).astype(np.float32)
    want = onnx_ref("DeformConv", [x, w, off, b, mask], kernel_shape=[2, 2], pads=[0, 0, 0, 0], group=2, offset_group=2)
    got = opsnn.ops.run_op("DeformConv", [x, w, off, b, mask], {"group": 2, "offset_group": 2})[0].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    ref = opsnn.ops.run_op("DeformConv", [x, w, off, b, mask], {"group": 2, "offset_group": 2}, algo="reference")[
        0
    ].numpy()
    np.testing.assert_allclose(ref, want, rtol=1e-4, atol=1e-4)


def test_deform_conv_large_parallel_float64_and_functional(rng, no_leak):
    x = rng.standard_normal((2, 8, 20, 20))
    w = rng.standard_normal((4, 8, 3, 3))
    off = rng.standard_normal((2, 18, 18, 18)) * 2.0
    mask = rng.uniform(size=(2, 9, 18, 18))
    ex = aclnn.deform_conv2d.prepare(opsnn.tensor(x), opsnn.tensor(off), opsnn.tensor(w), mask=opsnn.tensor(mask))
    assert ex.plan.parallel
    got = ex.run().numpy()
    want = opsnn.ops.run_op("DeformConv", [x, w, off, None, mask], {}, algo="reference")[0].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    # non-contiguous input
    xt = np.ascontiguousarray(x.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    got_nc = V.deform_conv2d(opsnn.from_numpy(xt), opsnn.tensor(off), opsnn.tensor(w), mask=opsnn.tensor(mask)).numpy()
    np.testing.assert_allclose(got_nc, want, rtol=1e-10, atol=1e-10)


def test_deform_conv_1d_reference_16bit_and_errors(rng, no_leak):
    # 1-D: the reference runs (the numba kernel is 2-D); zero offsets give a plain conv
    x = rng.standard_normal((1, 2, 9)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3)).astype(np.float32)
    off = np.zeros((1, 3, 7), np.float32)
    ex = aclnn.prepare("DeformConv", [x, w, off])
    assert ex.kernel_name == "reference"
    want = _conv2d_numpy(x[:, :, None], w[:, :, None], None, [1, 1], [0, 0, 0, 0], [1, 1], 1)[:, :, 0]
    np.testing.assert_allclose(ex.run().numpy(), want, rtol=1e-5, atol=1e-5)
    # 16-bit through the fp32 adapter
    xh = rng.standard_normal((1, 2, 6, 6)).astype(np.float16)
    wh = rng.standard_normal((2, 2, 3, 3)).astype(np.float16)
    oh = rng.standard_normal((1, 18, 4, 4)).astype(np.float16)
    got = opsnn.ops.run_op("DeformConv", [xh, wh, oh])[0].numpy()
    want = opsnn.ops.run_op("DeformConv", [xh.astype(np.float32), wh.astype(np.float32), oh.astype(np.float32)])[0]
    np.testing.assert_allclose(got.astype(np.float32), want.numpy(), rtol=2e-2, atol=5e-2)
    # NaN offsets give NaN where they are used
    on = np.zeros((1, 18, 4, 4), np.float32)
    on[0, 0, 1, 2] = np.nan
    y = opsnn.ops.run_op("DeformConv", [xh.astype(np.float32), wh.astype(np.float32), on])[0].numpy()
    assert np.isnan(y[0, :, 1, 2]).all() and np.isfinite(np.delete(y.reshape(2, -1), 6, axis=1)).all()
    xf, wf = x[:, :, None], w[:, :, None]
    with pytest.raises(InferShapeError, match="offset"):
        opsnn.ops.run_op("DeformConv", [xf, wf, np.zeros((1, 5, 1, 7), np.float32)])
    with pytest.raises(InferShapeError, match="group"):
        opsnn.ops.run_op("DeformConv", [xf, wf, np.zeros((1, 6, 1, 7), np.float32)], {"group": 2})
    with pytest.raises(ParamInvalidError, match="strides"):
        opsnn.ops.run_op("DeformConv", [xf, wf, np.zeros((1, 6, 1, 7), np.float32)], {"strides": [0, 1]})
    with pytest.raises(DTypeError):
        opsnn.ops.run_op("DeformConv", [xf, wf.astype(np.float64), np.zeros((1, 6, 1, 7), np.float32)])


# == NonMaxSuppression ================================================================================
def _boxes(rng, b, n, center=False):
    xy = rng.uniform(0, 10, size=(b, n, 2))
    wh = rng.uniform(0.5, 4, size=(b, n, 2))
    if center:
        return np.concatenate([xy, wh], -1).astype(np.float32)
    corners = np.concatenate([xy, xy + wh], -1)
    flip = rng.random((b, n)) < 0.3  # some boxes with swapped corners
    corners[flip] = corners[flip][:, [2, 3, 0, 1]]
    return corners.astype(np.float32)


@pytest.mark.parametrize("center", [0, 1])
def test_nms_matches_onnx_reference(rng, no_leak, center):
    boxes = _boxes(rng, 2, 40, bool(center))
    scores = rng.random((2, 3, 40)).astype(np.float32)
    scores[0, 0, :5] = 0.5  # ties: lower index first
    for max_out, iou, thr in ((10, 0.3, 0.2), (100, 0.6, None), (3, 0.0, 0.9), (0, 0.5, None)):
        ins = [boxes, scores, np.array([max_out], np.int64), np.array([iou], np.float32)]
        if thr is not None:
            ins.append(np.array([thr], np.float32))
        want = onnx_ref("NonMaxSuppression", ins, opset=11, center_point_box=center)
        got = opsnn.ops.run_op("NonMaxSuppression", ins, {"center_point_box": center})[0].numpy()
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got.reshape(-1, 3), want.reshape(-1, 3))
        ref = opsnn.ops.run_op("NonMaxSuppression", ins, {"center_point_box": center}, algo="reference")[0].numpy()
        np.testing.assert_array_equal(ref, got)


def test_nms_hand_case_functional_and_errors(no_leak):
    boxes = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, 10, 1, 11], [0, 100, 1, 101]]], np.float32)
    scores = np.array([[[0.9, 0.95, 0.3, 0.5]]], np.float32)
    ex = aclnn.non_max_suppression.prepare(opsnn.tensor(boxes), opsnn.tensor(scores), 3, 0.5)
    assert ex.kernel_name == "nms_numba"
    np.testing.assert_array_equal(ex.run().numpy(), [[0, 0, 1], [0, 0, 3], [0, 0, 2]])
    got = V.non_max_suppression(opsnn.tensor(boxes), opsnn.tensor(scores), 10, 0.5, score_threshold=0.4).numpy()
    np.testing.assert_array_equal(got, [[0, 0, 1], [0, 0, 3]])
    # max_output_boxes_per_class absent: nothing is selected
    got = opsnn.ops.run_op("NonMaxSuppression", [boxes, scores])[0].numpy()
    assert got.shape == (0, 3)
    # no boxes at all
    got = opsnn.ops.run_op(
        "NonMaxSuppression", [np.zeros((1, 0, 4), np.float32), np.zeros((1, 2, 0), np.float32), np.array([5], np.int64)]
    )[0].numpy()
    assert got.shape == (0, 3)
    with pytest.raises(InferShapeError, match="boxes"):
        opsnn.ops.run_op("NonMaxSuppression", [boxes[..., :3], scores])
    with pytest.raises(InferShapeError, match="scores"):
        opsnn.ops.run_op("NonMaxSuppression", [boxes, scores[..., :3]])
    with pytest.raises(ParamInvalidError, match="center_point_box"):
        opsnn.ops.run_op("NonMaxSuppression", [boxes, scores], {"center_point_box": 2})


# == CumProd =========================================================================================
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumprod_matches_onnx_reference(rng, no_leak, exclusive, reverse):
    x = rng.uniform(0.5, 1.5, size=(3, 4, 5)).astype(np.float32)
    for axis in (0, 1, -1):
        want = onnx_ref("CumProd", [x, np.array(axis, np.int64)], opset=26, exclusive=exclusive, reverse=reverse)
        ex = aclnn.cumprod.prepare(opsnn.tensor(x), axis, exclusive=bool(exclusive), reverse=bool(reverse))
        assert ex.kernel_name == "cumprod_numpy"
        np.testing.assert_allclose(ex.run().numpy(), want, rtol=1e-5, atol=1e-6)
        ref = V.cumprod(
            opsnn.tensor(x), axis, exclusive=bool(exclusive), reverse=bool(reverse), algo="reference"
        ).numpy()
        np.testing.assert_allclose(ref, want, rtol=1e-5, atol=1e-6)


def test_cumprod_integers_wrap_nan_empty_noncontiguous_16bit(rng, no_leak):
    x = rng.integers(-1000, 1000, size=(2, 9)).astype(np.int32)
    got = V.cumprod(opsnn.tensor(x), 1).numpy()
    # exact products wrapped to int32 (two's complement), computed with Python integers
    exact = np.array(
        [[int(np.prod([int(v) for v in row[: j + 1]], dtype=object)) for j in range(9)] for row in x], dtype=object
    )
    want = np.array([[(v + 2**31) % 2**32 - 2**31 for v in row] for row in exact], np.int64).astype(np.int32)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(V.cumprod(opsnn.tensor(x), 1, algo="reference").numpy(), want)
    u = np.array([2**31, 3, 5], np.uint32)
    np.testing.assert_array_equal(V.cumprod(opsnn.tensor(u), 0).numpy(), np.array([2**31, 2**31, 2**31], np.uint32))
    f = np.array([2.0, np.nan, 3.0, 0.0, np.inf], np.float64)
    np.testing.assert_array_equal(
        V.cumprod(opsnn.tensor(f), 0, exclusive=True).numpy(), [1.0, 2.0, np.nan, np.nan, np.nan]
    )
    np.testing.assert_array_equal(V.cumprod(opsnn.tensor(f[3:]), 0).numpy(), [0.0, np.nan])
    assert V.cumprod(opsnn.tensor(np.zeros((0, 3), np.float32)), 0).numpy().shape == (0, 3)
    a = rng.uniform(0.5, 1.5, size=(5, 4)).astype(np.float32)
    np.testing.assert_allclose(
        V.cumprod(opsnn.from_numpy(a.T), 1).numpy(), np.cumprod(a.T.astype(np.float64), 1), rtol=1e-5
    )
    h = a.astype(np.float16)
    got = V.cumprod(opsnn.tensor(h), 0).numpy()
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), np.cumprod(h.astype(np.float32), 0), rtol=2e-2)
    with pytest.raises(ParamInvalidError, match="axis"):
        V.cumprod(opsnn.tensor(a), 2)
    with pytest.raises(ParamInvalidError, match="dim"):
        V.cumprod(opsnn.tensor(a), 1.0)


# == Det ============================================================================================
def test_det_matches_numpy_linalg(rng, no_leak):
    for shape in ((3, 3), (4, 2, 5, 5), (1, 1), (2, 0, 4, 4)):
        x = rng.standard_normal(shape)
        want = np.linalg.det(x) if x.size else np.zeros(shape[:-2])
        ex = aclnn.det.prepare(opsnn.tensor(x))
        assert ex.kernel_name == "det_lapack"
        np.testing.assert_allclose(ex.run().numpy(), want, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(V.det(opsnn.tensor(x), algo="reference").numpy(), want, rtol=1e-9, atol=1e-12)
    x32 = rng.standard_normal((6, 3, 3)).astype(np.float32)
    np.testing.assert_allclose(
        V.det(opsnn.tensor(x32)).numpy(), np.linalg.det(x32.astype(np.float64)), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        V.det(opsnn.from_numpy(x32.transpose(0, 2, 1))).numpy(),
        np.linalg.det(x32.astype(np.float64)),
        rtol=1e-5,
        atol=1e-6,
    )
    sing = np.array([[1.0, 2.0], [2.0, 4.0]], np.float32)
    assert V.det(opsnn.tensor(sing)).numpy() == 0
    assert V.det(opsnn.tensor(sing), algo="reference").numpy() == 0
    h = x32.astype(BF16)
    got = V.det(opsnn.tensor(h)).numpy()
    assert got.dtype == BF16
    np.testing.assert_allclose(got.astype(np.float32), np.linalg.det(h.astype(np.float64)), rtol=2e-2, atol=2e-2)
    assert V.det(opsnn.tensor(np.zeros((2, 0, 0), np.float32))).numpy().tolist() == [1.0, 1.0]
    with pytest.raises(InferShapeError, match="square"):
        V.det(opsnn.tensor(np.zeros((2, 3), np.float32)))


# == BitCast ========================================================================================
def test_bitcast_same_width_pairs(rng, no_leak):
    groups = [
        [np.int8, np.uint8, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2],
        [np.int16, np.uint16, np.float16, ml_dtypes.bfloat16],
        [np.int32, np.uint32, np.float32],
        [np.int64, np.uint64, np.float64, np.complex64],
    ]
    for group in groups:
        raw = rng.integers(0, 255, size=(3, 8 * np.dtype(group[0]).itemsize), dtype=np.uint8)
        for src in group:
            x = raw.view(src)
            for dst in group:
                got = V.bitcast(opsnn.tensor(x), dst).numpy()
                assert got.dtype == np.dtype(dst) and got.shape == x.shape
                np.testing.assert_array_equal(got.view(np.uint8), x.view(np.uint8))
    x = np.array([1.5, -0.0, np.inf], np.float32)
    np.testing.assert_array_equal(
        V.bitcast(opsnn.from_numpy(np.stack([x, x])[:, ::2]), "int32").numpy(), np.stack([x, x])[:, ::2].view(np.int32)
    )
    want = onnx_ref("BitCast", [x], opset=26, to=6)
    np.testing.assert_array_equal(V.bitcast(opsnn.tensor(x), "int32").numpy(), want)
    assert V.bitcast(opsnn.tensor(np.zeros((0, 2), np.float32)), "uint32").numpy().shape == (0, 2)
    # a 0-d input stays 0-d in the kernel and in the reference (found by tests/fuzz: the reference made it 1-d)
    s = np.array(-0.75, np.float32)
    for algo in ("bitcast_view", "reference"):
        got = opsnn.ops.run_op("BitCast", [s], {"to": 6}, algo=algo)[0].numpy()
        assert got.shape == () and got == s.view(np.int32)


def test_bitcast_bool_subbyte_and_errors(no_leak):
    b = np.array([True, False, True])
    np.testing.assert_array_equal(V.bitcast(opsnn.tensor(b), "uint8").numpy(), [1, 0, 1])
    np.testing.assert_array_equal(
        V.bitcast(opsnn.tensor(np.array([0, 1, 7], np.uint8)), "bool").numpy(), [False, True, True]
    )
    i4 = np.array([-1, 7, -8, 0], ml_dtypes.int4)
    u4 = V.bitcast(opsnn.tensor(i4), ml_dtypes.uint4).numpy()
    np.testing.assert_array_equal(u4.astype(np.int64), [15, 7, 8, 0])
    np.testing.assert_array_equal(V.bitcast(opsnn.tensor(u4), ml_dtypes.int4).numpy().astype(np.int64), [-1, 7, -8, 0])
    with pytest.raises(DTypeError, match="bit width"):
        V.bitcast(opsnn.tensor(np.zeros(3, np.float32)), "int64")
    with pytest.raises(DTypeError, match="bit width"):
        V.bitcast(opsnn.tensor(i4), "uint8")
    with pytest.raises(DTypeError):
        opsnn.ops.run_op("BitCast", [np.zeros(3, np.float32)], {"to": 8})  # STRING
    with pytest.raises(DTypeError):
        opsnn.ops.run_op("BitCast", [np.zeros(3, np.float32)], {"to": 999})


# == TensorScatter ====================================================================================
@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter_matches_onnx_reference(rng, no_leak, mode):
    past = rng.standard_normal((3, 2, 6, 4)).astype(np.float32)
    upd = rng.standard_normal((3, 2, 3, 4)).astype(np.float32)
    wi = np.array([0, 3, 5 if mode == "circular" else 2], np.int64)
    want = onnx_ref("TensorScatter", [past, upd, wi], opset=24, mode=mode)
    ex = aclnn.tensor_scatter.prepare(opsnn.tensor(past), opsnn.tensor(upd), opsnn.tensor(wi), mode=mode)
    assert ex.kernel_name == "tensor_scatter_numpy"
    np.testing.assert_array_equal(ex.run().numpy(), want)
    np.testing.assert_array_equal(
        V.tensor_scatter(opsnn.tensor(past), opsnn.tensor(upd), opsnn.tensor(wi), mode=mode, algo="reference").numpy(),
        want,
    )
    # another axis, no write_indices, non-contiguous update
    past2 = rng.standard_normal((2, 5, 3)).astype(np.float32)
    upd2 = rng.standard_normal((2, 3, 2)).astype(np.float32).transpose(0, 2, 1)
    want2 = onnx_ref("TensorScatter", [past2, np.ascontiguousarray(upd2)], opset=24, mode=mode, axis=1)
    got2 = V.tensor_scatter(opsnn.tensor(past2), opsnn.from_numpy(upd2), mode=mode, axis=1).numpy()
    np.testing.assert_array_equal(got2, want2)


def test_tensor_scatter_strings_empty_and_errors(no_leak):
    past = np.array([["a", "b", "c"], ["d", "e", "f"]], dtype=object)
    upd = np.array([["x"], ["y"]], dtype=object)
    got = V.tensor_scatter(opsnn.tensor(past), opsnn.tensor(upd), np.array([2, 1], np.int64), axis=1).numpy()
    assert got.tolist() == [["a", "b", "x"], ["d", "y", "f"]]
    empty = np.zeros((2, 4, 0), np.float32)
    assert V.tensor_scatter(opsnn.tensor(empty), opsnn.tensor(np.zeros((2, 1, 0), np.float32))).numpy().shape == (
        2,
        4,
        0,
    )
    p = opsnn.tensor(np.zeros((2, 4, 3), np.float32))
    u = opsnn.tensor(np.ones((2, 2, 3), np.float32))
    with pytest.raises(ParamInvalidError, match="exceeds"):
        V.tensor_scatter(p, u, np.array([0, 3], np.int64))
    with pytest.raises(ParamInvalidError, match="negative"):
        V.tensor_scatter(p, u, np.array([0, -1], np.int64), mode="circular")
    with pytest.raises(ParamInvalidError, match="axis"):
        V.tensor_scatter(p, u, axis=0)
    with pytest.raises(ParamInvalidError, match="mode"):
        V.tensor_scatter(p, u, mode="ring")
    with pytest.raises(InferShapeError, match="update"):
        V.tensor_scatter(p, opsnn.tensor(np.ones((2, 5, 3), np.float32)))
    with pytest.raises(DTypeError):
        V.tensor_scatter(p, opsnn.tensor(np.ones((2, 2, 3), np.float64)))


# == ImageDecoder ======================================================================================
def _ppm(pixels: np.ndarray) -> np.ndarray:
    """A binary PPM (P6) / PGM (P5) file written by hand: the independent encoder."""
    h, w, c = pixels.shape
    header = f"{'P6' if c == 3 else 'P5'}\n{w} {h}\n255\n".encode()
    return np.frombuffer(header + pixels.astype(np.uint8).tobytes(), np.uint8).copy()


def test_image_decoder_round_trips(rng, no_leak):
    pytest.importorskip("PIL")
    import io

    from PIL import Image

    rgb = rng.integers(0, 256, size=(7, 11, 3)).astype(np.uint8)
    ex = aclnn.decode_image.prepare(opsnn.tensor(_ppm(rgb)))
    assert ex.kernel_name == "image_decoder_pillow"
    np.testing.assert_array_equal(ex.run().numpy(), rgb)
    np.testing.assert_array_equal(V.decode_image(opsnn.tensor(_ppm(rgb)), "BGR").numpy(), rgb[:, :, ::-1])
    np.testing.assert_array_equal(V.decode_image(opsnn.tensor(_ppm(rgb)), algo="reference").numpy(), rgb)
    gray = rng.integers(0, 256, size=(5, 4, 1)).astype(np.uint8)
    np.testing.assert_array_equal(V.decode_image(opsnn.tensor(_ppm(gray)), "Grayscale").numpy(), gray)
    # a grayscale file asked for as RGB repeats the channel
    np.testing.assert_array_equal(V.decode_image(opsnn.tensor(_ppm(gray))).numpy(), np.repeat(gray, 3, axis=2))
    for fmt in ("PNG", "BMP", "TIFF"):  # lossless formats round-trip exactly
        buf = io.BytesIO()
        Image.fromarray(rgb).save(buf, format=fmt)
        data = np.frombuffer(buf.getvalue(), np.uint8).copy()
        np.testing.assert_array_equal(V.decode_image(opsnn.tensor(data)).numpy(), rgb)
        want = onnx_ref("ImageDecoder", [data], opset=20)
        np.testing.assert_array_equal(V.decode_image(opsnn.tensor(data)).numpy(), want)


def test_image_decoder_errors(no_leak):
    pytest.importorskip("PIL")
    with pytest.raises(ParamInvalidError, match="cannot decode"):
        V.decode_image(opsnn.tensor(np.arange(20, dtype=np.uint8)))
    with pytest.raises(ParamInvalidError, match="pixel_format"):
        V.decode_image(opsnn.tensor(_ppm(np.zeros((2, 2, 3)))), "CMYK")
    with pytest.raises(InferShapeError, match="1-D"):
        V.decode_image(opsnn.tensor(np.zeros((2, 2), np.uint8)))
    with pytest.raises(DTypeError):
        V.decode_image(opsnn.tensor(np.zeros(4, np.int8)))
