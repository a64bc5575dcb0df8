"""Channel-blocked (nChw16c / nChw8c) convolution chains: the ToBlocked / FromBlocked kernels against
numpy transposes, BlockedConv / BlockedMaxPool on oneDNN against the plain ops' references (Conv's
and MaxPool's numpy oracles, unblocked), for both blocks (oneDNN runs nChw8c with its AVX2 code on
an AVX-512 CPU too), and the blocked_layout pass: which chains it rewrites, what it leaves alone
and why, that compiled graphs agree with the uncompiled interpreter, and that it picks nChw8c
when oneDNN is limited to AVX2."""

import numpy as np
import pytest

import opsnn
from opsnn.errors import OpsnnError
from opsnn.graph import Graph, Node, Value, passes
from opsnn.kernels.cpu import blocked as KB
from opsnn.kernels.cpu import libraries as KL
from opsnn.kernels.cpu import onednn as KD
from opsnn.ops import run_op
from opsnn.ops.executor import plan_op
from opsnn.ops.registry import TensorMeta, get_op

needs_onednn = pytest.mark.skipif(KD.unavailable() is not None, reason=f"oneDNN: {KD.unavailable()}")
needs_bf16 = pytest.mark.skipif(KD.bf16_unavailable() is not None, reason=f"oneDNN bf16: {KD.bf16_unavailable()}")
BF16 = opsnn.dtypes.bfloat16
#: the layout the pass uses on this machine (16, 8, or 0: nhwc; tests that do not depend on it use 16)
BLOCK = 16 if isinstance(KL.conv_chain_layout(), str) else KL.conv_chain_layout().block
#: bfloat16 chains keep the nChw<b>c layout
BF16_BLOCK = KD.block() or 16


def _f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("block", KB.LAYOUTS)
@pytest.mark.parametrize(
    "shape", [(2, 32, 5, 7), (1, 16, 1, 1), (3, 48, 4, 3), (2, 32, 20, 17), (3, 0, 4, 5), (0, 16, 2, 2), (2, 16, 0, 3)]
)  # (2, 32, 20, 17): nhwc tasks of NHWC_PIXELS pixels, two per image; empty: an empty result
def test_to_and_from_blocked_match_numpy_transposes(rng, shape, block, dtype):
    x = _f32(rng, *shape).astype(opsnn.dtypes.get(dtype))
    b = run_op("ToBlocked", [x], {"block": block}, domain="opsnn")[0].numpy()
    # element (n, c, h, w) sits at ((n, c // b, h, w, c % b)) of the (N, C/b, H, W, b) array
    n, c, h, w = shape
    if block == KB.NHWC:  # element (n, c, h, w) sits at (n, h, w, c)
        np.testing.assert_array_equal(b.reshape(n, h, w, c), x.transpose(0, 2, 3, 1))
    else:
        want = x.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2)
        np.testing.assert_array_equal(b.reshape(want.shape), want)
    np.testing.assert_array_equal(KB.blocked_reference(x, block), b)
    back = run_op("FromBlocked", [b], {"block": block}, domain="opsnn")[0].numpy()
    assert b.dtype == back.dtype == x.dtype
    np.testing.assert_array_equal(back, x)


def test_blocking_needs_a_multiple_of_the_block_and_a_known_block(rng):
    with pytest.raises(OpsnnError, match="multiple of 16"):
        run_op("ToBlocked", [_f32(rng, 1, 24, 3, 3)], domain="opsnn")
    run_op("ToBlocked", [_f32(rng, 1, 24, 3, 3)], {"block": 8}, domain="opsnn")
    with pytest.raises(OpsnnError, match=r"block=4 is not one of \(0, 8, 16\)"):
        run_op("ToBlocked", [_f32(rng, 1, 24, 3, 3)], {"block": 4}, domain="opsnn")
    with pytest.raises(ValueError, match="C-contiguous output"):
        KB.to_blocked(_f32(rng, 1, 16, 4, 4), np.empty((1, 16, 4, 8), np.float32)[..., ::2], 16)


def _run_kernel(op: str, name: str, ins: list, values: list, attrs: dict):
    rec = get_op(op, "opsnn")
    metas = [None if a is None else TensorMeta(a.shape, a.dtype) for a in ins]
    planned = plan_op(rec, metas, values, attrs)
    k = next(k for k in rec.kernels if k.name == name)
    assert k.check(planned.ctx) is None
    plan = k.plan(planned.ctx) if k.plan is not None else None
    out = np.full(planned.ctx.outputs[0].shape, np.nan, np.float32)
    k.fn([a for a in ins], [out], planned.ctx.attrs, plan, None)
    want = rec.reference(ins, planned.ctx.attrs)
    return out, want, plan, planned.selection.kernel.name


CONV_CASES = [
    # (N, C, H, W), (M, kh, kw), attrs, src blocked
    ((1, 16, 9, 9), (32, 1, 1), {}, True),
    ((2, 32, 8, 7), (16, 3, 3), {"pads": [1, 1, 1, 1]}, True),
    ((1, 32, 9, 11), (32, 3, 3), {"pads": [0, 1, 2, 1], "strides": [2, 2]}, True),
    ((1, 16, 10, 10), (16, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}, True),
    ((1, 16, 5, 5), (16, 1, 1), {"strides": [3, 3]}, True),  # stride > kernel
    ((1, 16, 1, 1), (16, 3, 3), {"pads": [1, 1, 1, 1]}, True),  # a 1x1 image, padding > kernel/2
    ((1, 3, 23, 23), (16, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}, False),  # RGB stem, plain X
    ((1, 16, 7, 7), (32, 3, 3), {"auto_pad": "SAME_UPPER"}, True),
]
ACTS = [
    ("", 0.0, 0.0),
    ("Relu", 0.0, 0.0),
    ("LeakyRelu", 0.1, 0.0),
    ("Clip", -0.5, 0.7),
    ("Sigmoid", 0.0, 0.0),
    ("Tanh", 0.0, 0.0),
    ("Gelu", 0.0, 0.0),
    ("GeluTanh", 0.0, 0.0),
    ("Swish", 1.5, 0.0),
]


@needs_onednn
@pytest.mark.parametrize("block", KB.LAYOUTS)
@pytest.mark.parametrize("case", range(len(CONV_CASES)))
@pytest.mark.parametrize("bias,residual", [(True, False), (False, True), (True, True), (False, False)])
def test_blocked_conv_on_onednn_matches_the_conv_reference(rng, case, bias, residual, block):
    xs, (m, kh, kw), attrs, src_blocked = CONV_CASES[case]
    x = _f32(rng, *xs)
    w = _f32(rng, m, xs[1], kh, kw, scale=0.2)
    b = _f32(rng, m) if bias else None
    act, alpha, beta = ACTS[(case * 4 + 2 * bias + residual) % len(ACTS)]
    attrs = dict(
        attrs, activation=act, activation_alpha=alpha, activation_beta=beta, src_blocked=int(src_blocked), block=block
    )
    out_shape = run_op(
        "Conv", [x, w], {k: v for k, v in attrs.items() if k in ("pads", "strides", "dilations", "auto_pad")}
    )[0].shape
    z = KB.blocked_reference(_f32(rng, *out_shape), block) if residual else None
    xin = KB.blocked_reference(x, block) if src_blocked else x
    out, want, plan, chosen = _run_kernel("BlockedConv", "conv_onednn", [xin, w, b, z], [None, w, None, None], attrs)
    assert chosen == "conv_onednn"
    assert "oneDNN" in plan.describe() and f"-> {KB.layout_name(block)}" in plan.describe()
    tol = 2e-5 * (xs[1] * kh * kw) ** 0.5
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()))


@needs_onednn
@pytest.mark.parametrize("block", KB.LAYOUTS)
@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"kernel_shape": [2, 2], "strides": [2, 2]},
        {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    ],
)
def test_blocked_max_pool_matches_the_max_pool_reference(rng, attrs, block):
    x = KB.blocked_reference(_f32(rng, 2, 24 if block == 8 else 32, 9, 10), block)
    out, want, plan, chosen = _run_kernel("BlockedMaxPool", "max_pool_onednn", [x], [None], dict(attrs, block=block))
    assert chosen == "max_pool_onednn"
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("kernel", ["global_avg_pool_blocked_numba", "global_avg_pool_blocked_numpy"])
@pytest.mark.parametrize("block", KB.LAYOUTS)
@pytest.mark.parametrize("shape", [(2, 32, 7, 7), (1, 16, 1, 1), (1, 48, 5, 9), (3, 16, 64, 96)])  # last: parallel
def test_blocked_global_average_pool_matches_the_plain_reference(rng, shape, block, kernel):
    x = _f32(rng, *shape, scale=3.0) + 100.0  # a large common offset: float32 sums would drift
    if shape[0] > 1:
        x[1, 5, 0, 0] = np.nan  # NaN stays in its own channel
    xb = KB.blocked_reference(x, block)
    out, want, _, chosen = _run_kernel("BlockedGlobalAveragePool", kernel, [xb], [None], {"block": block})
    assert chosen == "global_avg_pool_blocked_numba" and out.shape == (shape[0], shape[1], 1, 1)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=0)
    np.testing.assert_allclose(out, x.astype(np.float64).mean(axis=(2, 3), keepdims=True), rtol=1e-6)
    if shape[0] > 1:
        assert np.isnan(out[1, 5, 0, 0]) and np.isfinite(np.delete(out.reshape(-1), shape[1] + 5)).all()
    if block == KB.NHWC:  # nhwc takes any channel count
        np.testing.assert_allclose(
            run_op(
                "BlockedGlobalAveragePool", [KB.blocked_reference(x[:1, :12], block)], {"block": block}, domain="opsnn"
            )[0].numpy(),
            x[:1, :12].astype(np.float64).mean(axis=(2, 3), keepdims=True),
            rtol=1e-6,
        )
    else:
        with pytest.raises(OpsnnError, match=f"multiple of {block}"):  # 12 channels: not blockable
            run_op("BlockedGlobalAveragePool", [_f32(rng, 1, 12, 3, 3)], {"block": block}, domain="opsnn")


def _bf16(a):
    return None if a is None else a.astype(BF16)


@needs_bf16
@pytest.mark.parametrize("case", range(len(CONV_CASES)))
@pytest.mark.parametrize("bias,residual", [(True, False), (False, True), (True, True)])
def test_bfloat16_blocked_conv_matches_the_float32_reference_on_the_same_values(rng, case, bias, residual):
    """bf16 X, W, B, Z: oneDNN accumulates in float32 and rounds Y to bf16
    once, so Y is within bf16's rounding (2**-8 relative) of the float32 oracle computed from the
    same (bf16-representable) values."""
    xs, (m, kh, kw), attrs, src_blocked = CONV_CASES[case]
    x = _bf16(_f32(rng, *xs))
    w = _bf16(_f32(rng, m, xs[1], kh, kw, scale=0.2))
    b = _bf16(_f32(rng, m)) if bias else None
    act, alpha, beta = ACTS[(case * 4 + 2 * bias + residual) % len(ACTS)]
    attrs = dict(
        attrs,
        activation=act,
        activation_alpha=alpha,
        activation_beta=beta,
        src_blocked=int(src_blocked),
        block=BF16_BLOCK,
    )
    out_shape = run_op(
        "Conv",
        [x.astype(np.float32), w.astype(np.float32)],
        {k: v for k, v in attrs.items() if k in ("pads", "strides", "dilations", "auto_pad")},
    )[0].shape
    z = _bf16(KB.blocked_reference(_f32(rng, *out_shape), BF16_BLOCK)) if residual else None
    xin = KB.blocked_reference(x, BF16_BLOCK) if src_blocked else x
    ins = [xin, w, b, z]
    rec = get_op("BlockedConv", "opsnn")
    planned = plan_op(
        rec, [None if a is None else TensorMeta(a.shape, a.dtype) for a in ins], [None, w, None, None], attrs
    )
    k = planned.selection.kernel
    assert k.name == "conv_onednn" and not k.needs_adapter(planned.ctx)
    plan = k.plan(planned.ctx)
    assert plan.prim.impl.endswith("avx512_core_bf16") and plan.describe().startswith("oneDNN jit_bf16")
    assert "bfloat16 conv" in plan.describe()
    out = np.zeros(out_shape, BF16)
    k.fn(ins, [out], planned.ctx.attrs, plan, None)
    want = rec.reference([None if a is None else a.astype(np.float32) for a in ins], planned.ctx.attrs)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(out.astype(np.float32), want, rtol=2**-7, atol=1e-4 * (xs[1] * kh * kw) ** 0.5 * scale)


@needs_bf16
def test_bfloat16_blocked_max_pool_is_exact_and_dtypes_must_agree(rng):
    x = KB.blocked_reference(_bf16(_f32(rng, 1, 32, 9, 10)), BF16_BLOCK)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "block": BF16_BLOCK}
    got = run_op("BlockedMaxPool", [x], attrs, domain="opsnn")[0].numpy()
    want = get_op("BlockedMaxPool", "opsnn").reference(
        [x.astype(np.float32)], get_op("BlockedMaxPool", "opsnn").bind_attrs(attrs)
    )
    assert got.dtype == BF16
    np.testing.assert_array_equal(got.astype(np.float32), want)  # max commutes with rounding
    with pytest.raises(OpsnnError, match="W is float32 but X is bfloat16; W must be bfloat16 too"):
        run_op("BlockedConv", [x, _f32(rng, 16, 32, 1, 1)], {"block": BF16_BLOCK}, domain="opsnn")


def test_blocked_conv_without_a_constant_weight_is_not_run_on_onednn(rng):
    rec = get_op("BlockedConv", "opsnn")
    x, w = _f32(rng, 1, 16, 4, 4), _f32(rng, 16, 16, 1, 1)
    planned = plan_op(rec, [TensorMeta(x.shape, x.dtype), TensorMeta(w.shape, w.dtype)], [None, None], {})
    k = next(k for k in rec.kernels if k.name == "conv_onednn")
    why = k.check(planned.ctx)
    assert why is not None and ("constant" in str(why) or "oneDNN" in str(why))


# -- the pass -------------------------------------------------------------------------------------------
def _block_graph(rng, c=16, mid=16, out_c=32, stem=False, extra_output=False):
    """A ResNet-style bottleneck: [stem conv + maxpool] -> 1x1 -> 3x3 -> 1x1, projection shortcut,
    residual add, relu."""
    init = {}
    nodes = []
    x = "x"
    cin = 3 if stem else c
    if stem:
        init["ws"] = _f32(rng, c, 3, 3, 3, scale=0.3)
        nodes += [
            Node("Conv", ["x", "ws"], ["s"], {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
            Node("Relu", ["s"], ["sr"]),
            Node("MaxPool", ["sr"], ["p"], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        ]
        x = "p"
    init.update(
        {
            "w1": _f32(rng, mid, c, 1, 1, scale=0.3),
            "b1": _f32(rng, mid),
            "w2": _f32(rng, mid, mid, 3, 3, scale=0.1),
            "w3": _f32(rng, out_c, mid, 1, 1, scale=0.3),
            "wd": _f32(rng, out_c, c, 1, 1, scale=0.3),
        }
    )
    nodes += [
        Node("Conv", [x, "w1", "b1"], ["a"]),
        Node("Relu", ["a"], ["ar"]),
        Node("Conv", ["ar", "w2"], ["b"], {"pads": [1, 1, 1, 1]}),
        Node("Relu", ["b"], ["br"]),
        Node("Conv", ["br", "w3"], ["c"]),
        Node("Conv", [x, "wd"], ["d"]),
        Node("Add", ["c", "d"], ["e"]),
        Node("Relu", ["e"], ["y"]),
    ]
    outs = ["y", "br"] if extra_output else ["y"]
    g = Graph(
        "block", inputs=[Value("x", np.float32, ("N", cin, "H", "W"))], outputs=outs, nodes=nodes, initializers=init
    )
    return g


def _compile_and_check(g, feeds):
    want = {k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in opsnn.graph.run(g, feeds).items()}
    cg = opsnn.compile(g)
    out = cg.run(feeds)
    for k, v in want.items():
        np.testing.assert_allclose(out[k].numpy(), v, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(v).max()))
    return cg


def _types(cg) -> list:
    return [n.qualified_type for n in cg.graph.nodes]


@needs_onednn
@pytest.mark.isa_portable
def test_pass_rewrites_a_bottleneck_chain_and_agrees_with_the_interpreter(rng):
    g = _block_graph(rng, stem=True)
    cg = _compile_and_check(g, {"x": _f32(rng, 2, 3, 18, 17)})
    types = _types(cg)
    assert types.count("opsnn::BlockedConv") == 5 and "opsnn::BlockedMaxPool" in types
    assert types.count("opsnn::FromBlocked") == 1 and types[-1] == "opsnn::FromBlocked"
    assert "opsnn::ToBlocked" not in types  # the stem conv reads the 3-channel input plain
    stem = next(n for n in cg.graph.nodes if n.op_type == "BlockedConv")
    assert stem.attrs["src_blocked"] == 0
    assert "conv_onednn" in cg.explain() and "max_pool_onednn" in cg.explain()
    # a second batch size: the primitives are built for that plan's shapes
    _compile_and_check(g, {"x": _f32(rng, 1, 3, 12, 12)})


@needs_onednn
def test_pass_pools_a_classifier_head_on_the_blocked_features(rng):
    """GlobalAveragePool fed by a chain reads the blocked feature map: no FromBlocked of it; a
    second plain reader of the same value keeps its FromBlocked."""

    def head(outputs):
        g = _block_graph(rng)
        init = dict(g.initializers, wf=_f32(np.random.default_rng(1), 10, 32, scale=0.2))
        nodes = list(g.nodes) + [
            Node("GlobalAveragePool", ["y"], ["gp"]),
            Node("Flatten", ["gp"], ["f"]),
            Node("Gemm", ["f", "wf"], ["logits"], {"transB": 1}),
        ]
        return Graph("head", inputs=list(g.inputs), outputs=outputs, nodes=nodes, initializers=init)

    cg = _compile_and_check(head(["logits"]), {"x": _f32(rng, 2, 16, 9, 7)})
    types = _types(cg)
    assert "opsnn::BlockedGlobalAveragePool" in types and "opsnn::FromBlocked" not in types
    assert "global_avg_pool_blocked_numba" in cg.explain()
    types = _types(_compile_and_check(head(["logits", "y"]), {"x": _f32(rng, 1, 16, 6, 6)}))
    assert "opsnn::BlockedGlobalAveragePool" in types and types.count("opsnn::FromBlocked") == 1


@needs_onednn
def test_pass_blocks_outside_inputs_once_and_unblocks_values_read_outside(rng):
    g = _block_graph(rng, extra_output=True)
    cg = _compile_and_check(g, {"x": _f32(rng, 1, 16, 7, 9)})
    types = _types(cg)
    # x feeds two convs through one ToBlocked; y and the extra output br are unblocked
    assert types.count("opsnn::ToBlocked") == 1 and types.count("opsnn::FromBlocked") == 2
    names = {o for n in cg.graph.nodes for o in n.outputs}
    assert "br" in names and "y" in names and any(o.endswith(f"_{KB.layout_name(BLOCK)}") for o in names)
    assert {n.attrs["block"] for n in cg.graph.nodes if n.domain == "opsnn" and "Blocked" in n.op_type} == {BLOCK}


@needs_onednn
@pytest.mark.isa_portable
def test_pass_leaves_single_convs_and_odd_channel_counts_alone(rng):
    init = {"w": _f32(rng, 16, 16, 3, 3, scale=0.2)}
    g = Graph(
        "one",
        inputs=[Value("x", np.float32, ("N", 16, 8, 8))],
        outputs=["y"],
        nodes=[Node("Conv", ["x", "w"], ["c"], {"pads": [1, 1, 1, 1]}), Node("Relu", ["c"], ["y"])],
        initializers=init,
    )
    assert "opsnn::BlockedConv" not in _types(_compile_and_check(g, {"x": _f32(rng, 1, 16, 8, 8)}))
    g2 = _block_graph(rng, mid=20)  # 20 channels, a multiple of neither block: the middle convs are
    cg2 = _compile_and_check(g2, {"x": _f32(rng, 1, 16, 6, 6)})  # refused, the chain broken
    res = next(r for r in cg2.pass_report.results if r.name == "blocked_layout")
    assert any("20 output channels" in r for r in res.refused), res.refused


@needs_onednn
@pytest.mark.isa_portable
def test_pass_leaves_a_padded_conv_with_a_nan_weight_to_the_definitions_kernels(rng):
    """oneDNN skips the taps that read padding; the definition multiplies the padding's zeros, so a NaN
    weight tap makes its whole output channel NaN (opsnn fuzz onnx_mutate seed 2809226, capped at avx2)."""
    g = _block_graph(rng, extra_output=True)
    g.initializers["w2"][3, 5, 2, 0] = np.nan  # a corner tap: it reads padding along the plane's edges
    cg = opsnn.compile(g)
    out = cg.run({"x": _f32(rng, 2, 16, 6, 7)})
    res = next(r for r in cg.pass_report.results if r.name == "blocked_layout")
    assert any("Inf or NaN" in r for r in res.refused), res.refused
    br = out["br"].numpy()
    assert np.isnan(br[:, 3]).all() and np.isfinite(np.delete(br, 3, axis=1)).all()
    assert np.isnan(out["y"].numpy()).all()  # the 1x1 after it mixes every channel


def test_pass_says_why_when_onednn_is_unavailable(rng, monkeypatch):
    monkeypatch.setattr(KD, "_looked", True)
    monkeypatch.setattr(KD, "_why", "disabled by OPSNN_ONEDNN=0")
    cg = _compile_and_check(_block_graph(rng), {"x": _f32(rng, 1, 16, 6, 6)})
    assert "opsnn::BlockedConv" not in _types(cg)
    res = next(r for r in cg.pass_report.results if r.name == "blocked_layout")
    assert res.refused == ["oneDNN: disabled by OPSNN_ONEDNN=0"]
    assert "blocked_layout" in passes.pass_names()


@needs_bf16
def test_pass_runs_a_bfloat16_chain_on_onednn_with_the_pool_between_casts_in_bf16(rng):
    """Mixed precision makes the convs bf16 and leaves MaxPool float32 between two Casts; the
    pass blocks the whole chain in bf16 (pool included, its Casts dropped) and agrees with the
    same bf16 graph run without it and with the float32 interpreter."""
    from opsnn.graph import mixed_precision

    feeds = {"x": _f32(rng, 2, 3, 18, 17)}
    want = opsnn.graph.run(_block_graph(np.random.default_rng(1), stem=True, extra_output=True), feeds)
    saved = mixed_precision.policy()
    try:
        opsnn.config.allow_mix_precision({"Conv": "bfloat16"})
        cg = opsnn.compile(_block_graph(np.random.default_rng(1), stem=True, extra_output=True))
        passes.disable_passes(["blocked_layout"])
        try:
            plain = opsnn.compile(_block_graph(np.random.default_rng(1), stem=True, extra_output=True))
        finally:
            passes.disable_passes([])
    finally:
        mixed_precision.set_policy(saved)
    types = _types(cg)
    assert types.count("opsnn::BlockedConv") == 5 and "opsnn::BlockedMaxPool" in types, types
    assert "MaxPool" not in types and "opsnn::BlockedConv" not in _types(plain)
    assert {n.attrs["block"] for n in cg.graph.nodes if "Blocked" in n.op_type} == {BF16_BLOCK}  # not nhwc
    pool = next(n for n in cg.graph.nodes if n.op_type == "BlockedMaxPool")
    assert cg.graph.value(pool.inputs[0]).dtype == BF16 and cg.graph.value(pool.outputs[0]).dtype == BF16
    res = next(r for r in cg.pass_report.results if r.name == "blocked_layout")
    assert any("runs on bfloat16 data (the Casts around it dropped)" in m for m in res.log)
    out, ref = cg.run(feeds), plain.run(feeds)
    assert "conv_onednn" in cg.explain() and "max_pool_onednn" in cg.explain()
    for k, v in want.items():
        o = out[k].numpy()
        assert o.dtype == np.float32
        # the same bf16 arithmetic up to float32 summation order and one bf16 rounding
        np.testing.assert_allclose(o, ref[k].numpy(), rtol=2**-7, atol=2**-7 * np.abs(v).max())
        np.testing.assert_allclose(o, v, rtol=3e-2, atol=3e-2 * np.abs(v).max())


@needs_onednn
def test_an_nhwc_chain_stem_reorders_its_plain_input_in_the_workspace(rng):
    """A plain 3-channel X starting an nhwc chain: oneDNN's direct kernel on a source layout it chose (its
    code for an NCHW source with an nhwc destination is ref:any), X reordered into the caller's workspace
    (a temporary buffer without one); NaN and Inf in X come out as a direct convolution's, through the
    post-op-free primitive, which reorders X too."""
    w, b = _f32(rng, 32, 3, 7, 7, scale=0.2), _f32(rng, 32)
    prim = KD.ConvPrimitive(
        (2, 3, 23, 23), w, (2, 32, 12, 12), (2, 2), (3, 3, 3, 3), (1, 1),
        block=KB.NHWC, src_blocked=False, has_bias=True, residual=False, act=1,
    )  # fmt: skip
    assert not prim.impl.startswith("ref") and prim.workspace_bytes >= 2 * 3 * 23 * 23 * 4
    rec = get_op("BlockedConv", "opsnn")
    attrs = rec.bind_attrs(
        {"pads": [3, 3, 3, 3], "strides": [2, 2], "activation": "Relu", "src_blocked": 0, "block": KB.NHWC}
    )
    x = _f32(rng, 2, 3, 23, 23)
    for bad in (False, True):
        if bad:
            x[0, 1, 4, 5], x[1, 2, 20, 20], x[1, 0, 0, 0] = np.nan, np.inf, -np.inf
        want = rec.reference([x, w, b], attrs)
        eager = np.full((2, 32, 12, 12), 7.0, np.float32)
        prim(x, b, None, eager)
        bound = np.full((2, 32, 12, 12), 7.0, np.float32)
        prim.bind(x, b, None, bound, ws=np.empty(prim.workspace_bytes, np.uint8))()
        for got in (eager, bound):
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.nanmax(np.abs(want)))
    assert np.isnan(want).any() and np.isinf(want).any()


@needs_onednn
def test_one_primitive_called_from_two_threads_at_once(rng):
    """Each thread binds its own memory objects: concurrent calls on different arrays do not mix."""
    import threading

    w = _f32(rng, 32, 16, 3, 3, scale=0.2)
    prim = KD.ConvPrimitive(
        (1, 16, 12, 12),
        w,
        (1, 32, 12, 12),
        (1, 1),
        (1, 1, 1, 1),
        (1, 1),
        block=BLOCK,
        src_blocked=True,
        has_bias=False,
        residual=False,
        act=0,
    )
    xs = [KB.blocked_reference(_f32(rng, 1, 16, 12, 12), BLOCK) for _ in range(2)]
    rec = get_op("BlockedConv", "opsnn")
    attrs = rec.bind_attrs({"pads": [1, 1, 1, 1], "block": BLOCK})
    want = [rec.reference([x, w], attrs) for x in xs]
    bad = []

    def work(i):
        y = np.empty((1, 32, 12, 12), np.float32)
        for _ in range(200):
            prim(xs[i], None, None, y)
            if not np.allclose(y, want[i], rtol=1e-4, atol=1e-4):
                bad.append(i)
                return

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


@needs_onednn
def test_pass_refuses_convs_onednn_would_run_with_its_reference_code(rng, monkeypatch):
    real = KD.conv_impl
    calls = []

    def impl(*args, **kw):
        calls.append(args[1])
        return "ref:any" if args[1][2] == 3 else real(*args, **kw)  # pretend the 3x3 has no JIT kernel

    monkeypatch.setattr(KD, "conv_impl", impl)
    cg = _compile_and_check(_block_graph(rng), {"x": _f32(rng, 1, 16, 6, 6)})
    assert calls and "opsnn::BlockedConv" in _types(cg)
    res = next(r for r in cg.pass_report.results if r.name == "blocked_layout")
    assert any("reference implementation (ref:any)" in r for r in res.refused)
    assert not any(
        n.op_type == "BlockedConv" and cg.graph.initializers[n.inputs[1]].shape[2] == 3 for n in cg.graph.nodes
    )


@needs_onednn
@pytest.mark.isa_portable
def test_resnet_shapes_all_have_jit_kernels():
    """The probe the pass uses: ResNet-50's stem (plain X) and a blocked 3x3 with residual + ReLU."""
    # nChw8c runs on oneDNN's AVX2 code, also on an AVX-512 CPU; nChw16c and nhwc need AVX-512
    for block in [8] + ([16, KB.NHWC] if KD.block() == 16 else []):
        assert KD.conv_impl(
            (1, 3, 224, 224),
            (64, 3, 7, 7),
            (1, 64, 112, 112),
            (2, 2),
            (3, 3, 3, 3),
            (1, 1),
            block=block,
            src_blocked=False,
            has_bias=True,
            act=1,
        ).startswith("jit")
        impl = KD.conv_impl(
            (1, 64, 56, 56),
            (64, 64, 3, 3),
            (1, 64, 56, 56),
            (1, 1),
            (1, 1, 1, 1),
            (1, 1),
            block=block,
            src_blocked=True,
            residual=True,
            act=1,
        )
        assert not impl.startswith("ref")
        if block == KB.NHWC:  # why chains run nhwc on AVX-512: oneDNN's brgemm convolutions take it
            assert impl.startswith("brgconv"), impl


_AVX2_SCRIPT = """
import numpy as np, opsnn
from opsnn.kernels.cpu import onednn as KD
from test_blocked_layout import _block_graph, _compile_and_check, _f32, _types
rng = np.random.default_rng(0)
cg = _compile_and_check(_block_graph(rng, stem=True, extra_output=True), {"x": _f32(rng, 2, 3, 18, 17)})
types = _types(cg)
assert types.count("opsnn::BlockedConv") == 5, types
print(KD.block(), sorted({n.attrs["block"] for n in cg.graph.nodes if "Blocked" in n.op_type}),
      any(o.endswith("_nChw8c") for n in cg.graph.nodes for o in n.outputs), "|", KD.matmul_unavailable(),
      "|", KD.bf16_unavailable())
"""


@needs_onednn
def test_pass_uses_nchw8c_when_onednn_runs_avx2_code():
    """oneDNN limited to AVX2 (as on an AVX2-only CPU): the pass blocks by 8 (oneDNN has no AVX2
    kernels for nChw16c), the results agree with the interpreter, and constant-weight products
    stay off oneDNN's matmul (its AVX2 gemm:jit is slower than OpenBLAS). In a fresh process:
    oneDNN reads ONEDNN_MAX_CPU_ISA once, when it loads."""
    import os
    import subprocess
    import sys

    env = dict(
        os.environ,
        ONEDNN_MAX_CPU_ISA="AVX2",
        PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]),
    )
    r = subprocess.run([sys.executable, "-c", _AVX2_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    line = r.stdout.strip().splitlines()[-1]
    assert line.startswith("8 [8] True |") and "gemm:jit" in line, line
    assert line.split("|")[-1].strip().startswith("oneDNN runs without AVX512-BF16 here"), line


@needs_onednn
def test_primitives_share_one_reordered_copy_of_a_weight(rng):
    """Plans for other input shapes (and other primitives) on the same weight array in the same
    layout share one reordered copy; another array, even with equal values, gets its own; a
    copy goes when its last primitive does, and a new array at a freed one's address is not
    mistaken for it."""
    import gc

    w = _f32(rng, 32, 16, 3, 3, scale=0.2)
    geo = dict(
        strides=(1, 1),
        pads=(1, 1, 1, 1),
        dilations=(1, 1),
        block=BLOCK,
        src_blocked=True,
        has_bias=False,
        residual=False,
        act=0,
    )
    p1 = KD.ConvPrimitive((1, 16, 12, 12), w, (1, 32, 12, 12), **geo)
    p2 = KD.ConvPrimitive((3, 16, 12, 12), w, (3, 32, 12, 12), **geo)
    assert p1._w is p2._w and p1.weight.ctypes.data == p2.weight.ctypes.data
    p3 = KD.ConvPrimitive((1, 16, 12, 12), w.copy(), (1, 32, 12, 12), **geo)
    assert p3._w is not p1._w
    np.testing.assert_array_equal(p3.weight, p1.weight)
    w2 = w.copy()  # the same array changed in place between two builds: not stale
    p4 = KD.ConvPrimitive((1, 16, 12, 12), w2, (1, 32, 12, 12), **geo)
    w2 *= 2
    p5 = KD.ConvPrimitive((1, 16, 12, 12), w2, (1, 32, 12, 12), **geo)
    assert p5._w is not p4._w
    np.testing.assert_array_equal(p5.weight, 2 * p4.weight)
    key = next(k for k, refs in KD._reordered.items() if any(r() is p1._w for r in refs))
    del p1, p2
    gc.collect()
    assert all(r() is None for r in KD._reordered.get(key, []))
    rec = get_op("BlockedConv", "opsnn")
    attrs = rec.bind_attrs({"pads": [1, 1, 1, 1], "block": BLOCK})
    for _ in range(3):  # fresh weights, often at the address the last one had
        w = _f32(rng, 32, 16, 3, 3, scale=0.2)
        p = KD.ConvPrimitive((1, 16, 12, 12), w, (1, 32, 12, 12), **geo)
        x = KB.blocked_reference(_f32(rng, 1, 16, 12, 12), BLOCK)
        y = np.empty((1, 32, 12, 12), np.float32)
        p(x, None, None, y)
        np.testing.assert_allclose(y, rec.reference([x, w], attrs), rtol=1e-4, atol=1e-4)
        del w, p
        gc.collect()


@needs_onednn
def test_plans_for_several_batch_sizes_hold_one_copy_of_the_weights(rng):
    cg = opsnn.compile(_block_graph(rng, stem=True))
    cg.run({"x": _f32(rng, 1, 3, 18, 17)})
    one = cg.resident_bytes()
    for n in (2, 3):
        cg.run({"x": _f32(rng, n, 3, 18, 17)})
    assert cg.num_plans == 3 and cg.resident_bytes() == one and one["float32"] > 0


@needs_onednn
def test_sizes_past_onednn_32_bit_range_are_refused_before_the_call():
    """Found by `opsnn fuzz` under the AVX2 cap (onnx_mutate seed 3911099: a mutated Conv pad of 2**40): the
    layout pass asked oneDNN for a descriptor and its 32-bit arithmetic inside died of SIGFPE, killing the
    process. Sizes past 2**31 - 1 are a OneDnnError before any oneDNN call (the pass leaves the conv alone)."""
    big = 1 << 40
    with pytest.raises(KD.OneDnnError, match="beyond oneDNN's 32-bit range"):
        KD.conv_impl(
            (1, 8, 8, 3), (8, 8, 3, 3), (1, 8, 8, big + 3), (1, 1), (1, 1, 1, big), (1, 1), block=8, src_blocked=True
        )
    assert KD.conv_impl(
        (1, 8, 8, 3), (8, 8, 3, 3), (1, 8, 8, 3), (1, 1), (1, 1, 1, 1), (1, 1), block=8, src_blocked=True
    )
