"""Winograd F(4x4, 3x3) on channel-blocked tensors (``conv_winograd_blocked``, a BlockedConv
kernel): against the plain Conv's numpy oracle (through BlockedConv's reference) over edge
tiles, padding, batches split into chunks, bias / residual / Relu epilogues and both blocks;
its oneDNN batched matmul against numpy; which shapes select it and why the others do not;
and a compiled ResNet-style chain using it agrees with the interpreter."""

import gc

import numpy as np
import pytest

import opsnn
from opsnn.graph import Graph, Node, Value
from opsnn.kernels.cpu import blocked as KB
from opsnn.kernels.cpu import libraries as KL
from opsnn.kernels.cpu import onednn as KD
from opsnn.kernels.cpu import winograd_blocked as KW
from opsnn.ops.autotune import NotPreferred
from opsnn.ops.executor import plan_op
from opsnn.ops.registry import TensorMeta, get_op

_GEMMS = KL.blocked_winograd_gemms()  # oneDNN's batched matmul: brgemm from AVX-512 on, gemm:jit under AVX2
pytestmark = pytest.mark.skipif(isinstance(_GEMMS, str), reason=f"blocked Winograd's GEMMs: {_GEMMS}")
NAME = "conv_winograd_blocked"


def _f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _plan(ins, values, attrs):
    rec = get_op("BlockedConv", "opsnn")
    metas = [None if a is None else TensorMeta(a.shape, a.dtype) for a in ins]
    return rec, plan_op(rec, metas, values, attrs)


def _run(ins, attrs):
    """Run the Winograd kernel on ``ins`` (its planned workspace) and BlockedConv's reference."""
    rec, planned = _plan(ins, [None, ins[1], None, None], attrs)
    k = next(k for k in rec.kernels if k.name == NAME)
    why = k.check(planned.ctx)
    assert why is None or isinstance(why, NotPreferred), why  # small images: correct, only not preferred
    plan = k.plan(planned.ctx)
    ws = np.full(k.workspace(planned.ctx, plan), 0xFF, np.uint8)  # NaN-filled scratch: every byte read is written
    out = np.full(planned.ctx.outputs[0].shape, np.nan, np.float32)
    k.fn(list(ins), [out], planned.ctx.attrs, plan, ws)
    return out, rec.reference(list(ins), planned.ctx.attrs), plan


CASES = [
    # (N, C, H, W), M, conv attrs
    ((1, 16, 9, 9), 32, {"pads": [1, 1, 1, 1]}),  # 9 = 2 tiles + 1: tiles overhang the edge
    ((2, 32, 16, 13), 16, {"pads": [1, 1, 1, 1]}),
    ((1, 16, 12, 10), 16, {"pads": [0, 1, 2, 1]}),  # asymmetric padding
    ((1, 16, 10, 10), 16, {"pads": [2, 2, 2, 2]}),  # padding > kernel / 2
    ((1, 16, 1, 1), 16, {"pads": [1, 1, 1, 1]}),  # a 1x1 image
    ((1, 16, 8, 8), 16, {}),  # no padding: 6x6 output
    ((3, 16, 7, 9), 32, {"auto_pad": "SAME_UPPER"}),
]


@pytest.mark.parametrize("block", KB.BLOCKS)
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize(
    "bias,residual,act", [(True, False, "Relu"), (False, True, ""), (True, True, "Relu"), (False, False, "")]
)
def test_matches_the_conv_reference(rng, case, bias, residual, act, block):
    xs, m, attrs = CASES[case]
    x = _f32(rng, *xs)
    w = _f32(rng, m, xs[1], 3, 3, scale=0.2)
    b = _f32(rng, m) if bias else None
    out_shape = opsnn.ops.run_op("Conv", [x, w], attrs)[0].shape
    z = KB.blocked_reference(_f32(rng, *out_shape), block) if residual else None
    attrs = dict(attrs, activation=act, src_blocked=1, block=block)
    out, want, plan = _run([KB.blocked_reference(x, block), w, b, z], attrs)
    assert plan.describe().startswith(f"Winograd F(4x4,3x3) on nChw{block}c")
    # F(4x4)'s transform constants amplify rounding: ~1e-5 of the output's scale
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-4 * np.abs(want).max())


def test_a_batch_runs_in_chunks_with_a_smaller_last_one(rng, monkeypatch):
    xs = (5, 16, 12, 12)
    per_image = KW.POINTS * 3 * 3 * (16 + 32) * 4
    monkeypatch.setattr(KW, "CHUNK_BYTES", 2 * per_image)
    x, w, b = _f32(rng, *xs), _f32(rng, 32, 16, 3, 3, scale=0.2), _f32(rng, 32)
    z = KB.blocked_reference(_f32(rng, 5, 32, 12, 12), 16)
    out, want, plan = _run([KB.blocked_reference(x, 16), w, b, z], {"pads": [1, 1, 1, 1], "activation": "Relu"})
    assert plan.per_chunk == 2 and sorted(plan.gemms) == [1, 2]
    # the two primitives share one reordered copy of the transformed weight
    assert plan.gemms[1].weight.ctypes.data == plan.gemms[2].weight.ctypes.data
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-4 * np.abs(want).max())


def test_a_bound_call_holds_its_arrays_and_reads_their_current_values(rng):
    # Kernel.bind: a compiled graph binds each step once to its arena buffers, then writes new
    # values into them before every run
    xs, w, b = (2, 16, 9, 9), _f32(rng, 32, 16, 3, 3, scale=0.2), _f32(rng, 32)
    attrs = {"pads": [1, 1, 1, 1], "activation": "Relu"}
    x = KB.blocked_reference(_f32(rng, *xs), 16)
    rec, planned = _plan([x, w, b, None], [None, w, None, None], attrs)
    k = next(k for k in rec.kernels if k.name == NAME)
    plan = k.plan(planned.ctx)
    out = np.full(planned.ctx.outputs[0].shape, np.nan, np.float32)
    call = k.bind(
        [x, w, b.copy(), None], [out], planned.ctx.attrs, plan, np.empty(k.workspace(planned.ctx, plan), np.uint8)
    )
    gc.collect()  # the bias copy and the workspace live on in the call (it holds the views it took)
    for _ in range(2):
        call()
        want = rec.reference([x, w, b, None], planned.ctx.attrs)
        np.testing.assert_allclose(out, want, rtol=0, atol=2e-4 * np.abs(want).max())
        x[...] = KB.blocked_reference(_f32(rng, *xs), 16)  # new values, same buffer


@pytest.mark.parametrize("transposed", [False, True])
def test_batched_matmul_matches_numpy(rng, transposed):
    a, w = _f32(rng, 5, 7, 24), _f32(rng, 5, 24, 40)
    prim = KD.BatchMatMulPrimitive(
        7, np.ascontiguousarray(w.transpose(0, 2, 1)) if transposed else w, transposed=transposed
    )
    y = np.full((5, 7, 40), np.nan, np.float32)
    prim(a, y)
    want = np.einsum("bmk,bkn->bmn", a.astype(np.float64), w.astype(np.float64))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    with pytest.raises(KD.OneDnnError, match=r"W must be 3-D \(batch, K, N\)"):
        KD.BatchMatMulPrimitive(7, w[0])


def _selection(xs, m, attrs, dtype=np.float32):
    x = np.zeros(xs, dtype)
    w = np.zeros((m, xs[1]) + tuple(attrs.pop("kernel", (3, 3))), dtype)
    _, planned = _plan([x, w, None, None], [None, w, None, None], dict(attrs, src_blocked=attrs.get("src_blocked", 1)))
    return planned.selection.kernel.name, dict(planned.selection.rejected)


def test_resnet_stage_shapes_select_it_and_the_others_say_why():
    # ResNet-50's stride-1 3x3 convs of stages 1-3 (56, 28, 14 pixels) run on it
    for c, hw in ((64, 56), (128, 28), (256, 14)):
        chosen, _ = _selection((1, c, hw, hw), c, {"pads": [1, 1, 1, 1], "activation": "Relu"})
        assert chosen == NAME, (c, hw)
    chosen, why = _selection((1, 512, 7, 7), 512, {"pads": [1, 1, 1, 1]})
    assert chosen == "conv_onednn" and "4 4x4 output tiles per image" in why[NAME]
    _, why = _selection((1, 64, 56, 56), 64, {"pads": [1, 1, 1, 1], "strides": [2, 2]})
    assert "stride 1 and dilation 1 only" in why[NAME]
    _, why = _selection((1, 64, 56, 56), 64, {"pads": [0, 0, 0, 0], "kernel": (1, 1)})
    assert "3x3 kernels only" in why[NAME]
    _, why = _selection((1, 64, 56, 56), 64, {"pads": [1, 1, 1, 1], "activation": "Sigmoid"})
    assert "Relu only" in why[NAME]
    _, why = _selection((1, 64, 56, 56), 64, {"pads": [1, 1, 1, 1], "src_blocked": 0})
    assert "a blocked X only" in why[NAME]
    if KD.bf16_unavailable() is None:  # a bfloat16 BlockedConv needs oneDNN's native bf16 (not under AVX2)
        _, why = _selection((1, 64, 56, 56), 64, {"pads": [1, 1, 1, 1]}, opsnn.dtypes.bfloat16)
        assert "float32 only" in why[NAME]


def test_a_compiled_chain_runs_it_and_agrees_with_the_interpreter(rng, monkeypatch):
    # 1x1 -> 3x3 (Winograd) -> 1x1 + residual, relu: a ResNet bottleneck, at 28x28, on nChw<b>c (on nhwc,
    # the default from AVX-512 on, oneDNN runs every 3x3)
    monkeypatch.setenv("OPSNN_ONEDNN_LAYOUT", f"nChw{KD.block()}c")
    c = 32
    init = {
        "w1": _f32(rng, c, c, 1, 1, scale=0.2),
        "b1": _f32(rng, c),
        "w2": _f32(rng, c, c, 3, 3, scale=0.1),
        "w3": _f32(rng, c, c, 1, 1, scale=0.2),
    }
    nodes = [
        Node("Conv", ["x", "w1", "b1"], ["a"]),
        Node("Relu", ["a"], ["ar"]),
        Node("Conv", ["ar", "w2"], ["b"], {"pads": [1, 1, 1, 1]}),
        Node("Relu", ["b"], ["br"]),
        Node("Conv", ["br", "w3"], ["c"]),
        Node("Add", ["c", "x"], ["d"]),
        Node("Relu", ["d"], ["y"]),
    ]
    g = Graph(
        "bottleneck", inputs=[Value("x", np.float32, ("N", c, "H", "W"))], outputs=["y"], nodes=nodes, initializers=init
    )
    for n in (1, 3):
        feeds = {"x": _f32(rng, n, c, 28, 28)}
        want = opsnn.graph.run(g, feeds)["y"]
        want = want.numpy() if hasattr(want, "numpy") else want
        cg = opsnn.compile(g)
        got = cg.run(feeds)["y"].numpy()
        assert sum(f"(opsnn::BlockedConv): {NAME}" in ln for ln in cg.explain().splitlines()) == 1, cg.explain()
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())


def test_plans_share_one_transformed_weight_and_a_changed_weight_is_transformed_again(rng):
    x1, x4 = _f32(rng, 1, 16, 16, 16), _f32(rng, 4, 16, 16, 16)
    w, b = _f32(rng, 32, 16, 3, 3, scale=0.2), _f32(rng, 32)
    attrs = {"pads": [1, 1, 1, 1], "activation": "Relu"}
    _, _, p1 = _run([KB.blocked_reference(x1, 16), w, b, None], attrs)
    out, want, p4 = _run([KB.blocked_reference(x4, 16), w, b, None], attrs)
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-4 * np.abs(want).max())
    assert p1.gemms[1].weight.ctypes.data == p4.gemms[4].weight.ctypes.data
    assert p1.gemms[1].weight.nbytes >= KW.weight_bytes(16, 32)
    w[:] = _f32(rng, 32, 16, 3, 3, scale=0.2)  # changed in place: a new plan must not reuse the old U
    out, want, p = _run([KB.blocked_reference(x1, 16), w, b, None], attrs)
    assert p.gemms[1].weight.ctypes.data != p1.gemms[1].weight.ctypes.data
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-4 * np.abs(want).max())


def test_each_block_size_runs_its_own_pair_of_transforms(rng):
    # the lane count is built into the transforms' code: one pair per block size, made once
    pairs = {}
    for block in KB.BLOCKS:
        before = {k: len(f.signatures) for k, f in zip("io", KW.transforms(block))}
        x = _f32(rng, 1, 16, 9, 9)
        w = _f32(rng, 16, 16, 3, 3, scale=0.2)
        out, want, _ = _run([KB.blocked_reference(x, block), w, None, None], {"pads": [1, 1, 1, 1], "block": block})
        np.testing.assert_allclose(out, want, rtol=0, atol=2e-4 * np.abs(want).max())
        pairs[block] = KW.transforms(block)
        assert KW.transforms(block) is pairs[block]
        # the conv ran this pair's kernels: each holds one compiled (or cached) specialization
        assert [len(f.signatures) for f in pairs[block]] == [max(1, before["i"]), max(1, before["o"])]
    kernels = [f for pair in pairs.values() for f in pair]
    assert len(set(map(id, kernels))) == 2 * len(KB.BLOCKS)
