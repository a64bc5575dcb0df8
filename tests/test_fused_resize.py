"""opsnn::FusedResize (Resize of a transposed / unsqueezed / widened source, read in place) against
its reference (numpy transpose + astype + Resize's float64 oracle), and the resize_prologue_fusion
pass: what it fuses, what it leaves alone and why, and that compiled graphs agree with the
interpreter."""

import numpy as np
import pytest

import opsnn
from opsnn.errors import OpsnnError
from opsnn.graph import Graph, Node, Value
from opsnn.ops import run_op
from opsnn.ops.registry import get_op

FUSED = get_op("FusedResize", "opsnn")
F32, F64 = 1, 11  # ONNX TensorProto enums


def _reference(ins, attrs):
    y = FUSED.reference(ins, FUSED.bind_attrs(attrs))
    return y[0] if isinstance(y, (list, tuple)) else y


def _source(rng, shape, dtype):
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -1000), min(info.max, 1000) + 1, shape).astype(dtype)
    return (rng.standard_normal(shape) * 50).astype(dtype)


VIEWS = [  # (source shape, view): the resized tensor's axis i is the source's axis view[i] (-1: a new unit axis)
    ((37, 53, 3), [-1, 2, 0, 1]),  # an HWC image -> NCHW
    ((2, 3, 29, 41), [0, 1, 2, 3]),  # already NCHW
    ((3, 33, 20), [-1, 0, 1, 2]),  # CHW -> NCHW
    ((2, 17, 19, 4), [0, 3, 1, 2]),  # NHWC -> NCHW
]
RESIZES = [  # (mode, coordinate_transformation_mode, antialias, output H, W)
    ("linear", "pytorch_half_pixel", 0, 12, 9),
    ("linear", "half_pixel", 1, 7, 11),  # antialiased downscale: wide taps
    ("linear", "align_corners", 0, 45, 70),  # upscale
    ("cubic", "half_pixel", 0, 16, 13),
    ("cubic", "asymmetric", 1, 5, 30),
    ("linear", "half_pixel_symmetric", 0, None, 25),  # only W resized
]


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int64, np.float32, np.float64])
@pytest.mark.parametrize("view_case", range(len(VIEWS)))
@pytest.mark.parametrize("resize_case", range(len(RESIZES)))
def test_fused_resize_matches_transpose_cast_resize(rng, dtype, view_case, resize_case):
    shape, view = VIEWS[view_case]
    mode, ctm, aa, oh, ow = RESIZES[resize_case]
    s = _source(rng, shape, dtype)
    xs = [1 if v < 0 else shape[v] for v in view]
    sizes = np.array([xs[2] if oh is None else oh, ow], np.int64)
    to = F64 if (view_case + resize_case) % 3 == 0 else F32
    attrs = dict(mode=mode, coordinate_transformation_mode=ctm, antialias=aa, axes=[2, 3], to=to, view=view)
    y = run_op("FusedResize", [s, None, None, sizes], attrs, domain="opsnn")[0].numpy()
    want = _reference([s, None, None, sizes], attrs)
    assert y.dtype == (np.float64 if to == F64 else np.float32) and y.shape == want.shape
    assert y.shape == (xs[0], xs[1], sizes[0], sizes[1])
    tol = 1e-12 if to == F64 else 2e-6
    np.testing.assert_allclose(y, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()))
    # the oracle itself: the plain ops on the materialized view
    x = np.transpose(s, [v for v in view if v >= 0]).reshape(xs).astype(y.dtype)
    plain = run_op("Resize", [x, None, None, sizes], {k: v for k, v in attrs.items() if k not in ("to", "view")})[0]
    np.testing.assert_allclose(y, plain.numpy(), rtol=1e-5, atol=1e-5 * max(1.0, np.abs(want).max()))


def test_fused_resize_bad_attributes_and_inputs(rng):
    s = _source(rng, (8, 8, 3), np.uint8)
    sizes = np.array([4, 4], np.int64)
    base = dict(mode="linear", axes=[2, 3], to=F32, view=[-1, 2, 0, 1])
    with pytest.raises(OpsnnError, match="view"):
        run_op("FusedResize", [s, None, None, sizes], dict(base, view=[-1, 2, 0, 0]), domain="opsnn")
    with pytest.raises(OpsnnError, match="float32 or float64"):
        run_op("FusedResize", [s, None, None, sizes], dict(base, to=7), domain="opsnn")
    with pytest.raises(OpsnnError, match="nearest"):
        run_op("FusedResize", [s, None, None, sizes], dict(base, mode="nearest"), domain="opsnn")
    with pytest.raises(OpsnnError, match="'X' has dtype bool"):
        run_op("FusedResize", [s.astype(bool), None, None, sizes], base, domain="opsnn")
    # resizing the channel axis is defined; the fused kernel declines it (the pass never creates it)
    sizes3 = np.array([2, 4, 4], np.int64)
    y = run_op("FusedResize", [s, None, None, sizes3], dict(base, axes=[1, 2, 3]), domain="opsnn")[0].numpy()
    np.testing.assert_allclose(y, _reference([s, None, None, sizes3], dict(base, axes=[1, 2, 3])), rtol=1e-6)
    assert y.shape == (1, 2, 4, 4)


def _image_graph(h=30, w=44, size=(12, 10), mode="linear", extra_output=False, axes=(2, 3)):
    """uint8 HWC frame -> NCHW -> float32 -> resize -> normalize (the video pipeline's preprocess)."""
    init = {
        "ax0": np.array([0], np.int64),
        "sizes": np.array(size, np.int64),
        "mean": np.array([120.0, 110.0, 100.0], np.float32).reshape(1, 3, 1, 1),
    }
    nodes = [
        Node("Transpose", ["frame"], ["chw"], {"perm": [2, 0, 1]}),
        Node("Unsqueeze", ["chw", "ax0"], ["nchw"]),
        Node("Cast", ["nchw"], ["xf"], {"to": F32}),
        Node(
            "Resize",
            ["xf", "", "", "sizes"],
            ["r"],
            {"mode": mode, "axes": list(axes), "coordinate_transformation_mode": "half_pixel"},
        ),
        Node("Sub", ["r", "mean"], ["y"]),
    ]
    outs = ["y", "xf"] if extra_output else ["y"]
    return Graph("pre", inputs=[Value("frame", np.uint8, (h, w, 3))], outputs=outs, nodes=nodes, initializers=init)


def _compile_and_check(g, feeds):
    want = {k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in opsnn.graph.run(g, feeds).items()}
    cg = opsnn.compile(g)
    out = cg.run(feeds)
    for k, v in want.items():
        np.testing.assert_allclose(out[k].numpy(), v, rtol=2e-6, atol=2e-6 * max(1.0, np.abs(v).max()))
    return cg


def _report(cg):
    return next(r for r in cg.pass_report.results if r.name == "resize_prologue_fusion")


def test_pass_fuses_an_image_preprocess_and_agrees_with_the_interpreter(rng):
    frame = rng.integers(0, 256, (30, 44, 3), dtype=np.uint8)
    cg = _compile_and_check(_image_graph(), {"frame": frame})
    types = [n.qualified_type for n in cg.graph.nodes]
    assert "opsnn::FusedResize" in types
    assert not {"Transpose", "Unsqueeze", "Cast", "Resize"} & set(types)
    assert "fused_resize_2d" in cg.explain() and "Transpose_0" not in [n.name for n in cg.graph.nodes]
    assert any("FusedResize" in line for line in _report(cg).log)
    cg2 = _compile_and_check(_image_graph(size=(61, 90), mode="cubic"), {"frame": frame})  # upscale, cubic
    assert "opsnn::FusedResize" in [n.qualified_type for n in cg2.graph.nodes]


def test_pass_leaves_other_resizes_alone_and_says_why(rng):
    frame = rng.integers(0, 256, (30, 44, 3), dtype=np.uint8)
    # the widened copy is a graph output too: it is computed anyway, so nothing is fused
    cg = _compile_and_check(_image_graph(extra_output=True), {"frame": frame})
    assert "opsnn::FusedResize" not in [n.qualified_type for n in cg.graph.nodes]
    assert any("read elsewhere" in r for r in _report(cg).refused)
    # nearest moves values as they are: not this pass's business
    cg = _compile_and_check(_image_graph(mode="nearest"), {"frame": frame})
    assert "opsnn::FusedResize" not in [n.qualified_type for n in cg.graph.nodes]
    # resizing the channel axis: no fused kernel, the reason is reported
    cg = _compile_and_check(_image_graph(size=(1, 12, 10), axes=(1, 2, 3)), {"frame": frame})
    assert "opsnn::FusedResize" not in [n.qualified_type for n in cg.graph.nodes]
    assert any("last two axes" in r for r in _report(cg).refused)


def test_crop_and_resize_outside_the_input_is_declined_not_failed(rng):
    """tf_crop_and_resize with an roi reaching past the input writes extrapolation_value there:
    the fused kernel declines it at selection (so the pass would not create it) and the op
    still answers, through its reference."""
    from opsnn.ops.executor import plan_op
    from opsnn.ops.registry import TensorMeta

    s = _source(rng, (9, 11, 3), np.uint8)
    roi = np.array([-0.2, 0.1, 0.9, 1.3], np.float32)  # starts and ends of axes 2, 3
    sizes = np.array([5, 6], np.int64)
    attrs = dict(
        mode="linear",
        coordinate_transformation_mode="tf_crop_and_resize",
        extrapolation_value=-7.0,
        axes=[2, 3],
        to=F32,
        view=[-1, 2, 0, 1],
    )
    planned = plan_op(
        FUSED,
        [TensorMeta(s.shape, s.dtype), TensorMeta(roi.shape, roi.dtype), None, TensorMeta(sizes.shape, sizes.dtype)],
        [None, roi, None, sizes],
        attrs,
    )
    assert any(name == "fused_resize_2d" and "extrapolated" in why for name, why in planned.selection.rejected)
    y = run_op("FusedResize", [s, roi, None, sizes], attrs, domain="opsnn")[0].numpy()
    want = _reference([s, roi, None, sizes], attrs)
    np.testing.assert_allclose(y, want, rtol=1e-6)
    assert (y == -7.0).any()
