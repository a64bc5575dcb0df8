"""The library's fusions: decomposed Gelu/LayerNorm/RMSNorm/SiLU recognized, attention fused,
bias/activation/residual folded into Conv and MatMul epilogues — each checked against the
unfused graph run op by op, and refusals explained."""

import math

import numpy as np
import pytest

import opsnn
from opsnn.graph import Graph, Node, Value


def _check(g: Graph, feeds: dict, expect_ops: list, rtol=1e-4, atol=1e-5):
    ref = {k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in opsnn.graph.run(g, feeds).items()}
    cg = opsnn.compile(g)
    got = [n.qualified_type for n in cg.graph.nodes]
    assert got == expect_ops, [r for x in cg.pass_report.results for r in x.refused]
    out = cg.run(feeds)
    for k in ref:
        np.testing.assert_allclose(out[k].numpy(), ref[k], rtol=rtol, atol=atol)
    return cg


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_gelu_erf_form_is_recognized(rng):
    init = {
        "c": np.array(math.sqrt(2), np.float32),
        "one": np.array(1.0, np.float32),
        "half": np.array(0.5, np.float32),
    }
    g = Graph(
        "gelu",
        inputs=[Value("x", np.float32, (4, 16))],
        outputs=["y"],
        initializers=init,
        nodes=[
            Node("Div", ["x", "c"], ["d"]),
            Node("Erf", ["d"], ["e"]),
            Node("Add", ["e", "one"], ["a"]),
            Node("Mul", ["x", "a"], ["m"]),
            Node("Mul", ["m", "half"], ["y"]),
        ],
    )
    _check(g, {"x": _f32(rng, 4, 16)}, ["Gelu"])


def test_gelu_with_wrong_constant_is_refused_with_reason(rng):
    init = {"c": np.array(1.5, np.float32), "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)}
    g = Graph(
        "notgelu",
        inputs=[Value("x", np.float32, (4, 16))],
        outputs=["y"],
        initializers=init,
        nodes=[
            Node("Div", ["x", "c"], ["d"]),
            Node("Erf", ["d"], ["e"]),
            Node("Add", ["e", "one"], ["a"]),
            Node("Mul", ["x", "a"], ["m"]),
            Node("Mul", ["m", "half"], ["y"]),
        ],
    )
    cg = opsnn.compile(g)
    assert "Gelu" not in [n.op_type for n in cg.graph.nodes]
    assert any("1/sqrt(2)" in r for r in [r for x in cg.pass_report.results for r in x.refused])


def test_silu_is_recognized(rng):
    g = Graph(
        "silu",
        inputs=[Value("x", np.float32, (3, 5))],
        outputs=["y"],
        nodes=[Node("Sigmoid", ["x"], ["s"]), Node("Mul", ["x", "s"], ["y"])],
    )
    _check(g, {"x": _f32(rng, 3, 5)}, ["Swish"])


def _layer_norm_graph(rng, hidden=32):
    init = {
        "axes": np.array([-1], np.int64),
        "two": np.array(2.0, np.float32),
        "eps": np.array(1e-5, np.float32),
        "gamma": _f32(rng, hidden),
        "beta": _f32(rng, hidden),
    }
    nodes = [
        Node("ReduceMean", ["x", "axes"], ["mu"]),
        Node("Sub", ["x", "mu"], ["d"]),
        Node("Pow", ["d", "two"], ["sq"]),
        Node("ReduceMean", ["sq", "axes"], ["var"]),
        Node("Add", ["var", "eps"], ["ve"]),
        Node("Sqrt", ["ve"], ["std"]),
        Node("Div", ["d", "std"], ["n"]),
        Node("Mul", ["n", "gamma"], ["s"]),
        Node("Add", ["s", "beta"], ["y"]),
    ]
    return Graph("ln", inputs=[Value("x", np.float32, ("B", 7, hidden))], outputs=["y"], nodes=nodes, initializers=init)


def test_layer_norm_is_recognized(rng):
    cg = _check(_layer_norm_graph(rng), {"x": _f32(rng, 2, 7, 32)}, ["LayerNormalization"])
    assert cg.pass_report.nodes_before == 9 and cg.pass_report.nodes_after == 1


def test_rms_norm_is_recognized(rng):
    init = {
        "axes": np.array([-1], np.int64),
        "two": np.array(2.0, np.float32),
        "eps": np.array(1e-6, np.float32),
        "gamma": _f32(rng, 16),
    }
    g = Graph(
        "rms",
        inputs=[Value("x", np.float32, (3, 16))],
        outputs=["y"],
        initializers=init,
        nodes=[
            Node("Pow", ["x", "two"], ["sq"]),
            Node("ReduceMean", ["sq", "axes"], ["ms"]),
            Node("Add", ["ms", "eps"], ["me"]),
            Node("Sqrt", ["me"], ["r"]),
            Node("Div", ["x", "r"], ["n"]),
            Node("Mul", ["n", "gamma"], ["y"]),
        ],
    )
    _check(g, {"x": _f32(rng, 3, 16)}, ["RMSNormalization"])


def _attention_graph(masked: bool):
    nodes = [
        Node("Transpose", ["k"], ["kt"], {"perm": [0, 1, 3, 2]}),
        Node("MatMul", ["q", "kt"], ["s"]),
        Node("Div", ["s", "scale"], ["ss"]),
    ]
    last = "ss"
    if masked:
        nodes.append(Node("Add", ["ss", "mask"], ["sm"]))
        last = "sm"
    nodes += [Node("Softmax", [last], ["p"], {"axis": -1}), Node("MatMul", ["p", "v"], ["y"])]
    ins = [Value(n, np.float32, ("B", 4, 10, 8)) for n in ("q", "k", "v")]
    if masked:
        ins.append(Value("mask", np.float32, ("B", 1, 1, 10)))
    return Graph(
        "attn", inputs=ins, outputs=["y"], nodes=nodes, initializers={"scale": np.array(np.sqrt(8), np.float32)}
    )


@pytest.mark.parametrize("masked", [False, True])
def test_attention_is_fused(rng, masked):
    feeds = {n: _f32(rng, 2, 4, 10, 8) for n in ("q", "k", "v")}
    if masked:
        mask = np.zeros((2, 1, 1, 10), np.float32)
        mask[1, ..., 7:] = -1e9  # padding in the second sequence
        feeds["mask"] = mask
    _check(_attention_graph(masked), feeds, ["Attention"])


def _bert_attention_graph(k_perm: str, merge: str):
    """BERT's self-attention: projections (B, S, 32) reshaped to 4 heads of 8, head split
    Transposes (K directly to (B, H, D, S) with perm 0,2,3,1 or split then 0,1,3,2), scores,
    mask, softmax, probs @ V, then ``merge``: the head merge Transpose + Reshape, a Relu on
    the 4-D output, or the 4-D output as the graph output."""
    shp = {
        "s4": np.array([0, 0, 4, 8], np.int64),
        "s3": np.array([0, 0, 32], np.int64),
        "scale": np.array(np.sqrt(8), np.float32),
    }
    nodes = []
    for n in ("q", "k", "v"):
        nodes.append(Node("Reshape", [f"x{n}", "s4"], [f"{n}4"]))
    nodes += [
        Node("Transpose", ["q4"], ["q"], {"perm": [0, 2, 1, 3]}),
        Node("Transpose", ["v4"], ["v"], {"perm": [0, 2, 1, 3]}),
    ]
    if k_perm == "0231":
        nodes.append(Node("Transpose", ["k4"], ["kt"], {"perm": [0, 2, 3, 1]}))
    else:
        nodes += [
            Node("Transpose", ["k4"], ["k"], {"perm": [0, 2, 1, 3]}),
            Node("Transpose", ["k"], ["kt"], {"perm": [0, 1, 3, 2]}),
        ]
    nodes += [
        Node("MatMul", ["q", "kt"], ["s"]),
        Node("Div", ["s", "scale"], ["ss"]),
        Node("Add", ["ss", "mask"], ["sm"]),
        Node("Softmax", ["sm"], ["p"], {"axis": -1}),
        Node("MatMul", ["p", "v"], ["y4"]),
    ]
    out = "y"
    if merge == "transpose":
        nodes += [Node("Transpose", ["y4"], ["yt"], {"perm": [0, 2, 1, 3]}), Node("Reshape", ["yt", "s3"], ["y"])]
    elif merge == "relu":
        nodes.append(Node("Relu", ["y4"], ["y"]))
    else:
        out = "y4"
    ins = [Value(f"x{n}", np.float32, ("B", "S", 32)) for n in ("q", "k", "v")]
    ins.append(Value("mask", np.float32, ("B", 1, 1, "S")))
    return Graph("bert_attn", inputs=ins, outputs=[out], nodes=nodes, initializers=shp)


@pytest.mark.parametrize("k_perm", ["0231", "split"])
@pytest.mark.parametrize("merge", ["transpose", "relu", "output"])
def test_attention_reads_head_strided_layout(rng, k_perm, merge):
    """attention_head_layout: the Q/K/V head split Transposes disappear (Attention takes the
    (B, S, H*D) tensors with q_num_heads/kv_num_heads); the head merge Transpose becomes a
    Reshape; a 4-D output another node reads is rebuilt by Reshape + Transpose; a 4-D graph
    output keeps the 4-D Attention."""
    feeds = {n: _f32(rng, 2, 10, 32) for n in ("xq", "xk", "xv")}
    mask = np.zeros((2, 1, 1, 10), np.float32)
    mask[1, ..., 7:] = -1e9
    feeds["mask"] = mask
    g = _bert_attention_graph(k_perm, merge)
    ref = {k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in opsnn.graph.run(g, feeds).items()}
    cg = opsnn.compile(g)
    kinds = [n.op_type for n in cg.graph.nodes]
    att = next(n for n in cg.graph.nodes if n.op_type == "Attention")
    rep = cg.pass_report.by_name("attention_head_layout")
    if merge == "output":
        assert rep.changes == 0 and "graph output" in rep.refused[0]
        assert "q_num_heads" not in att.attrs
    else:
        assert rep.changes == 1 and att.attrs["q_num_heads"] == 4 and att.attrs["kv_num_heads"] == 4
        assert kinds.count("Transpose") == (1 if merge == "relu" else 0), kinds
    out = cg.run(feeds)
    for k in ref:
        np.testing.assert_allclose(out[k].numpy(), ref[k], rtol=1e-4, atol=1e-5)


def test_attention_head_layout_refuses_plain_4d_inputs(rng):
    g = _attention_graph(True)
    feeds = {n: _f32(rng, 2, 4, 10, 8) for n in ("q", "k", "v")}
    feeds["mask"] = np.zeros((2, 1, 1, 10), np.float32)
    cg = _check(g, feeds, ["Attention"])
    rep = cg.pass_report.by_name("attention_head_layout")
    assert rep.changes == 0


def test_conv_residual_relu_epilogue(rng):
    init = {"w": _f32(rng, 6, 6, 3, 3), "b": _f32(rng, 6)}
    g = Graph(
        "res",
        inputs=[Value("x", np.float32, ("N", 6, 9, 9))],
        outputs=["y"],
        initializers=init,
        nodes=[
            Node("Conv", ["x", "w", "b"], ["c"], {"pads": [1, 1, 1, 1]}),
            Node("Add", ["c", "x"], ["a"]),
            Node("Relu", ["a"], ["y"]),
        ],
    )
    cg = _check(g, {"x": _f32(rng, 2, 6, 9, 9)}, ["opsnn::FusedConv"])
    node = cg.graph.nodes[0]
    assert node.attrs["activation"] == "Relu" and node.inputs[3] == "x"


def test_matmul_bias_gelu_epilogue_and_refusal(rng):
    init = {"w": _f32(rng, 16, 24), "b": _f32(rng, 24)}
    g = Graph(
        "mlp",
        inputs=[Value("x", np.float32, ("B", 5, 16))],
        outputs=["y"],
        initializers=init,
        nodes=[Node("MatMul", ["x", "w"], ["m"]), Node("Add", ["m", "b"], ["a"]), Node("Gelu", ["a"], ["y"])],
    )
    cg = _check(g, {"x": _f32(rng, 2, 5, 16)}, ["opsnn::FusedMatMul"])
    assert cg.graph.nodes[0].attrs["activation"] == "Gelu"
    # a MatMul whose result is also a graph output cannot be fused away; the refusal says so
    g2 = Graph(
        "mlp2",
        inputs=[Value("x", np.float32, ("B", 16))],
        outputs=["y", "m"],
        initializers=init,
        nodes=[Node("MatMul", ["x", "w"], ["m"]), Node("Add", ["m", "b"], ["a"]), Node("Relu", ["a"], ["y"])],
    )
    cg2 = opsnn.compile(g2)
    assert "MatMul" in [n.op_type for n in cg2.graph.nodes]
    assert any("graph output" in r for r in [r for x in cg2.pass_report.results for r in x.refused])


def test_transformer_mlp_block_shrinks(rng):
    """LayerNorm (decomposed) -> MatMul+bias -> Gelu (erf form) -> MatMul+bias -> residual add."""
    h, f = 32, 64
    g = _layer_norm_graph(rng, h)
    init = g.initializers
    init.update(
        {
            "w1": _f32(rng, h, f) * 0.1,
            "b1": _f32(rng, f),
            "w2": _f32(rng, f, h) * 0.1,
            "b2": _f32(rng, h),
            "c": np.array(math.sqrt(2), np.float32),
            "one": np.array(1.0, np.float32),
            "half": np.array(0.5, np.float32),
        }
    )
    g.nodes += [
        Node("MatMul", ["y", "w1"], ["h1"]),
        Node("Add", ["h1", "b1"], ["h2"]),
        Node("Div", ["h2", "c"], ["gd"]),
        Node("Erf", ["gd"], ["ge"]),
        Node("Add", ["ge", "one"], ["ga"]),
        Node("Mul", ["h2", "ga"], ["gm"]),
        Node("Mul", ["gm", "half"], ["g"]),
        Node("MatMul", ["g", "w2"], ["o1"]),
        Node("Add", ["o1", "b2"], ["o2"]),
        Node("Add", ["o2", "x"], ["out"]),
    ]
    g.outputs = [Value("out")]
    cg = _check(
        g,
        {"x": _f32(rng, 2, 7, h)},
        ["LayerNormalization", "opsnn::FusedMatMul", "opsnn::FusedMatMul"],
        rtol=1e-4,
        atol=1e-4,
    )
    before, after = cg.pass_report.nodes_before, cg.pass_report.nodes_after
    assert (before, after) == (19, 3) and 1 - after / before > 0.8


def test_elementwise_chain_becomes_one_generated_kernel(rng):
    init = {"k": np.array(0.5, np.float32), "b": np.array(-0.25, np.float32)}
    g = Graph(
        "chain",
        inputs=[Value("x", np.float32, ("B", 64)), Value("y", np.float32, ("B", 64))],
        outputs=["out"],
        initializers=init,
        nodes=[
            Node("Mul", ["x", "y"], ["m"]),
            Node("Mul", ["m", "k"], ["mk"]),
            Node("Add", ["mk", "b"], ["a"]),
            Node("Tanh", ["a"], ["t"]),
            Node("Sub", ["t", "x"], ["s"]),
            Node("Relu", ["s"], ["out"]),
        ],
    )
    cg = _check(g, {"x": _f32(rng, 3, 64), "y": _f32(rng, 3, 64)}, ["opsnn::FusedElementwise"])
    node = cg.graph.nodes[0]
    assert node.inputs == ["x", "y"] and len(node.attrs_origin) == 6
    # a second graph with the same chain reuses the generated kernel (one per chain signature)
    from opsnn.kernels.cpu import codegen

    n_before = len(codegen._kernels)
    cg2 = opsnn.compile(g)
    cg2.run({"x": _f32(rng, 2, 64), "y": _f32(rng, 2, 64)})
    assert len(codegen._kernels) == n_before


def test_elementwise_chain_keeps_ieee_semantics():
    """1 / 0 is Inf (not a ZeroDivisionError), Floor of NaN / Inf stays NaN / Inf, Max keeps a NaN in its
    second operand: the generated kernel agrees with the ops run one by one (found by tests/fuzz)."""
    g = Graph(
        "ieee",
        inputs=[Value("x", np.float32, (2, 6)), Value("y", np.float32, (2, 6))],
        outputs=["out"],
        nodes=[
            Node("Div", ["x", "y"], ["d"]),
            Node("Floor", ["d"], ["f"]),
            Node("Max", ["x", "f"], ["m"]),
            Node("Reciprocal", ["y"], ["r"]),
            Node("Min", ["r", "m"], ["out"]),
        ],
    )
    x = np.array([[1, -1, 0, 2, 3.5, -2]] * 2, np.float32)
    y = np.array([[0, 0, 0, 1, 2, 4]] * 2, np.float32)
    cg = _check(g, {"x": x, "y": y}, ["opsnn::FusedElementwise"])
    with np.errstate(all="ignore"):
        d = x / y
        want = np.minimum(1 / y, np.maximum(x, np.floor(d)))
    np.testing.assert_array_equal(cg.run({"x": x, "y": y})["out"].numpy(), want)
    assert np.isnan(want[:, 2]).all() and np.isposinf(want[:, 0]).all()


def test_elementwise_chain_softplus_does_not_overflow():
    """Softplus(v) for v past float32's exp range is v, not Inf (found by opsnn fuzz, onnx_mutate 52317: the
    generated kernel computed log1p(exp(v)), Inf from v = 89); NaN and +-Inf as the Softplus op gives them."""
    g = Graph(
        "sp",
        inputs=[Value("x", np.float32, (2, 6))],
        outputs=["out"],
        nodes=[
            Node("Abs", ["x"], ["a"]),
            Node("Exp", ["a"], ["e"]),
            Node("Softplus", ["e"], ["s"]),
            Node("Neg", ["s"], ["n"]),
            Node("Softplus", ["n"], ["out"]),
        ],
    )
    x = np.array([[0.5, 4.6, 6.05, 80, np.nan, -np.inf], [-3, 5.9, -6.2, 1, np.inf, 0]], np.float32)
    cg = _check(g, {"x": x}, ["opsnn::FusedElementwise"])
    with np.errstate(all="ignore"):
        s = np.logaddexp(0, np.exp(np.abs(x.astype(np.float64))))
        want = np.logaddexp(0, -s).astype(np.float32)
    got = cg.run({"x": x})["out"].numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-30)
    g2 = Graph(
        "sp2",
        inputs=[Value("x", np.float32, (2, 6))],
        outputs=["out"],
        nodes=[Node("Abs", ["x"], ["a"]), Node("Exp", ["a"], ["e"]), Node("Softplus", ["e"], ["out"])],
    )
    with np.errstate(all="ignore"):
        want2 = np.logaddexp(0, np.exp(np.abs(x.astype(np.float64)))).astype(np.float32)
    got2 = _check(g2, {"x": x}, ["opsnn::FusedElementwise"]).run({"x": x})["out"].numpy()
    assert np.isfinite(want2[0, 1:4]).all() and np.isposinf(want2[0, 5])
    np.testing.assert_array_equal(np.isnan(got2), np.isnan(want2))
    np.testing.assert_allclose(got2, want2, rtol=1e-5)


@pytest.mark.parametrize("c", [np.nan, np.inf, -np.inf])
def test_elementwise_chain_with_a_non_finite_constant(c):
    """A NaN or Inf scalar constant in a fused chain (found by tests/fuzz: the generated source read
    'nan', an undefined name, and numba's typing failed at run)."""
    g = Graph(
        "k",
        inputs=[Value("x", np.float32, (2, 5))],
        outputs=["out"],
        initializers={"c": np.array(c, np.float32)},
        nodes=[Node("Relu", ["x"], ["r"]), Node("Max", ["r", "c"], ["out"])],
    )
    x = np.linspace(-2, 2, 10, dtype=np.float32).reshape(2, 5)
    cg = _check(g, {"x": x}, ["opsnn::FusedElementwise"])
    np.testing.assert_array_equal(cg.run({"x": x})["out"].numpy(), np.maximum(np.maximum(x, 0), c))


def test_elementwise_fusion_stops_at_broadcasts_and_shared_values(rng):
    g = Graph(
        "mixed",
        inputs=[Value("x", np.float32, (4, 8)), Value("v", np.float32, (8,))],
        outputs=["o", "e"],
        nodes=[
            Node("Exp", ["x"], ["e"]),
            Node("Neg", ["e"], ["n"]),
            Node("Add", ["n", "v"], ["a"]),
            Node("Relu", ["a"], ["o"]),
        ],
    )
    cg = _check(g, {"x": _f32(rng, 4, 8), "v": _f32(rng, 8)}, ["Exp", "Neg", "Add", "Relu"])
    assert cg.pass_report.by_name("elementwise_fusion").changes == 0


def test_exported_bert_fuses_attention_layernorm_and_epilogues(rng):
    """A real export (Shape/Gather/Concat/Reshape chains, masks from the input) still fuses:
    rule checks see probe shapes propagated through the shape arithmetic."""
    from opsnn.models import bert, to_onnx

    g = opsnn.onnx.load(to_onnx(bert("tiny")))
    feeds = {
        "input_ids": rng.integers(0, 100, (2, 16)).astype(np.int64),
        "attention_mask": np.ones((2, 16), np.int64),
        "token_type_ids": np.zeros((2, 16), np.int64),
    }
    feeds["attention_mask"][1, 11:] = 0
    cg = opsnn.compile(g)
    kinds = [n.op_type for n in cg.graph.nodes]
    layers = 2
    assert kinds.count("Attention") == layers and kinds.count("LayerNormalization") == 2 * layers + 1
    # the head split/merge Transposes are gone: Attention reads and writes (B, S, H*D)
    assert "Transpose" not in kinds
    assert all(n.attrs.get("q_num_heads") for n in cg.graph.nodes if n.op_type == "Attention")
    assert cg.pass_report.nodes_after < 0.45 * cg.pass_report.nodes_before
    ref = opsnn.graph.run(g, feeds)
    out = cg.run(feeds)
    for k in out:
        r = ref[k].numpy() if hasattr(ref[k], "numpy") else ref[k]
        np.testing.assert_allclose(out[k].numpy(), r, rtol=1e-4, atol=1e-5)


def test_long_elementwise_chain_is_split_into_bounded_kernels(rng):
    """Generated kernels compute at most MAX_FUSED_OPS ops each (numba's compile time grows faster
    than a kernel's length); every op of the chain is still fused, and the result is unchanged."""
    from opsnn.graph.elementwise_fusion import MAX_FUSED_OPS

    n = 3 * MAX_FUSED_OPS + 6
    ops = ["Neg", "Tanh"] * (n // 2)
    g = Graph(
        "long",
        inputs=[Value("v0", np.float32, (4, 8))],
        outputs=[f"v{n}"],
        nodes=[Node(op, [f"v{i}"], [f"v{i + 1}"], name=f"n{i}") for i, op in enumerate(ops)],
    )
    cg = opsnn.compile(g)
    fused = [nd for nd in cg.graph.nodes if nd.op_type == "FusedElementwise"]
    sizes = [len(nd.attrs_origin) for nd in fused]
    assert [nd.op_type for nd in cg.graph.nodes] == ["FusedElementwise"] * len(fused)
    assert max(sizes) <= MAX_FUSED_OPS and sum(sizes) == n and len(fused) == -(-n // MAX_FUSED_OPS), sizes
    x = _f32(rng, 4, 8)
    want = x.astype(np.float64)
    for op in ops:
        want = -want if op == "Neg" else np.tanh(want)
    np.testing.assert_allclose(cg.run({"v0": x})[f"v{n}"].numpy(), want, rtol=1e-5, atol=1e-6)


def test_distinct_fused_kernels_per_graph_are_bounded(rng, monkeypatch):
    """Each distinct program costs a numba compile: past MAX_FUSED_KERNELS, groups that need a new
    one stay unfused (with the reason), groups that reuse one are still fused."""
    from opsnn.graph import elementwise_fusion as ef

    monkeypatch.setattr(ef, "MAX_FUSED_OPS", 3)
    monkeypatch.setattr(ef, "MAX_FUSED_KERNELS", 2)
    ops = ["Neg", "Abs", "Neg"] + ["Tanh", "Neg", "Neg"] + ["Neg", "Abs", "Neg"] + ["Abs", "Abs", "Tanh"]
    g = Graph(
        "mix",
        inputs=[Value("v0", np.float32, (4, 8))],
        outputs=[f"v{len(ops)}"],
        nodes=[Node(op, [f"v{i}"], [f"v{i + 1}"], name=f"n{i}") for i, op in enumerate(ops)],
    )
    cg = opsnn.compile(g)
    programs = {nd.attrs["program"] for nd in cg.graph.nodes if nd.op_type == "FusedElementwise"}
    assert len(programs) == 2
    assert sum(len(nd.attrs_origin) for nd in cg.graph.nodes if nd.op_type == "FusedElementwise") == 9
    assert any("distinct fused kernels" in r for r in cg.pass_report.by_name("elementwise_fusion").refused)
    x = _f32(rng, 4, 8)
    want = x.astype(np.float64)
    for op in ops:
        want = {"Neg": np.negative, "Abs": np.abs, "Tanh": np.tanh}[op](want)
    np.testing.assert_allclose(cg.run({"v0": x})[f"v{len(ops)}"].numpy(), want, rtol=1e-5, atol=1e-6)


#: a discontinuous step (Floor/Ceil/Round, a comparison) right after a transcendental one, at inputs
#: whose float64 value lies within half an ulp below an integer: float32 1.0, float64 0.99999999...
_ROUNDING_X = np.array(
    [[4.195, -4.195, 17.5, -17.5, 10.0, 3.9, -3.9, 0.25], [9.3, -9.3, 4.5, 0.0, 88.0, -0.5, 2.5, 1.5]], np.float32
)


@pytest.mark.parametrize(
    "chain",
    [
        [("Erf", []), ("Floor", [])],
        [("Erf", []), ("Ceil", [])],
        [("Sigmoid", []), ("Floor", [])],
        [("Tanh", []), ("Floor", [])],
        [("Erf", []), ("Sub", ["one"]), ("Relu", [])],
        [("Sigmoid", []), ("Sub", ["one"]), ("Ceil", [])],
        [("Exp", []), ("Mul", ["k"]), ("Round", [])],
        [("Sigmoid", []), ("Min", ["one"]), ("Max", ["half"]), ("Sub", ["one"]), ("LeakyRelu", [])],
    ],
    ids=lambda c: "-".join(op for op, _ in c),
)
def test_elementwise_chain_rounds_every_step_like_the_unfused_graph(chain):
    """Each step of a fused chain is rounded to the chain's dtype, in the kernel and in the op's reference,
    as the unfused graph stores it: Floor(Erf(4.195)) is Floor(float32 1.0) = 1 (found by opsnn fuzz,
    op_schema 56708: the reference computed the chain in float64 and took Floor of 0.99999999)."""
    init = {"one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32), "k": np.array(1.5, np.float32)}
    nodes, prev = [], "x"
    for k, (op, consts) in enumerate(chain):
        out = "out" if k == len(chain) - 1 else f"t{k}"
        nodes.append(Node(op, [prev, *consts], [out]))
        prev = out
    g = Graph("round", inputs=[Value("x", np.float32, (2, 8))], outputs=["out"], initializers=init, nodes=nodes)
    x = _ROUNDING_X
    unfused = opsnn.graph.run(g, {"x": x})["out"]
    unfused = unfused.numpy() if hasattr(unfused, "numpy") else unfused
    cg = opsnn.compile(g)
    assert [n.qualified_type for n in cg.graph.nodes] == ["opsnn::FusedElementwise"]
    from opsnn.ops.registry import get_op

    rec = get_op("FusedElementwise", "opsnn")
    # the op's reference (the oracle of op tests and the fuzzer) is the unfused semantics too
    want = rec.reference([x], rec.bind_attrs(dict(cg.graph.nodes[0].attrs)))
    got = cg.run({"x": x})["out"].numpy()
    if chain[-1][0] in ("Floor", "Ceil", "Round"):
        np.testing.assert_array_equal(got, unfused)
        np.testing.assert_array_equal(want, unfused)
    else:  # Sigmoid's unfused kernel and libm may differ in the last bit (an ulp of 1.0 after Sub)
        np.testing.assert_allclose(got, unfused, rtol=0, atol=2.0**-23)
        np.testing.assert_allclose(want, unfused, rtol=0, atol=2.0**-23)


def test_fused_elementwise_reference_matches_its_kernel_after_erf():
    """opsnn fuzz op_schema 56708 in small: FusedElementwise [Erf, Floor] on 4.195, kernel and reference."""
    import json

    from opsnn.ops.registry import get_op

    prog = json.dumps([["Erf", [["in", 0]], {}], ["Floor", [["step", 0]], {}]])
    x = np.array([[4.195, -4.195, 0.3]], np.float32)
    got = opsnn.ops.run_op("FusedElementwise", [opsnn.tensor(x)], {"program": prog}, domain="opsnn")[0].numpy()
    rec = get_op("FusedElementwise", "opsnn")
    want = rec.reference([x], rec.bind_attrs({"program": prog}))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(want, np.array([[1.0, -1.0, 0.0]], np.float32))


def _i64(*v):
    return np.array(v, np.int64)


def test_flattened_linear_is_one_nd_matmul_with_its_epilogue(rng):
    """torch's addmm on (B*S, K) rows between two Reshapes: an N-D MatMul, its bias and residual fused."""
    x, z, w, b = _f32(rng, 2, 5, 8), _f32(rng, 2, 5, 6), _f32(rng, 8, 6), _f32(rng, 6)
    g = Graph(
        "linear3d",
        inputs=[Value("x", np.float32, (2, 5, 8)), Value("z", np.float32, (2, 5, 6))],
        outputs=["y"],
        initializers={"w": w, "b": b, "flat": _i64(10, 8), "back": _i64(2, 5, 6)},
        nodes=[
            Node("Reshape", ["x", "flat"], ["x2"]),
            Node("MatMul", ["x2", "w"], ["m"]),
            Node("Add", ["m", "b"], ["mb"]),
            Node("Reshape", ["mb", "back"], ["m3"]),
            Node("Add", ["z", "m3"], ["y"]),
        ],
    )
    cg = opsnn.compile(g)
    assert [n.qualified_type for n in cg.graph.nodes] == ["opsnn::FusedMatMul"]
    want = (x.astype(np.float64).reshape(10, 8) @ w + b).reshape(2, 5, 6) + z
    np.testing.assert_allclose(cg.run({"x": x, "z": z})["y"].numpy(), want, rtol=1e-5, atol=1e-5)


def test_bias_free_matmul_takes_its_residual_add(rng):
    x, z, w = _f32(rng, 4, 8), _f32(rng, 4, 6), _f32(rng, 8, 6)
    g = Graph(
        "residual",
        inputs=[Value("x", np.float32, (4, 8)), Value("z", np.float32, (4, 6))],
        outputs=["y"],
        initializers={"w": w},
        nodes=[Node("MatMul", ["x", "w"], ["m"]), Node("Add", ["z", "m"], ["y"])],
    )
    cg = opsnn.compile(g)
    assert [n.qualified_type for n in cg.graph.nodes] == ["opsnn::FusedMatMul"]
    want = x.astype(np.float64) @ w + z
    np.testing.assert_allclose(cg.run({"x": x, "z": z})["y"].numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "shape, back, ops",
    [
        ((2, 4, 6), (2, 4, 6), ["Relu"]),
        ((2, 4, 6), (8, 6), ["Reshape", "Relu"]),
        ((4, 0, 6), (0, 4, 6), ["Reshape", "Relu"]),  # an empty dim stays 0 (allowzero), not the input's
    ],
)
def test_reshape_of_a_reshape_is_one_or_none(rng, shape, back, ops):
    x = _f32(rng, *shape)
    g = Graph(
        "chain",
        inputs=[Value("x", np.float32, shape)],
        outputs=["y"],
        initializers={"heads": _i64(*shape[:2], 2, 3), "back": _i64(*back)},
        nodes=[
            Node("Reshape", ["x", "heads"], ["h"], {"allowzero": 1}),
            Node("Reshape", ["h", "back"], ["r"], {"allowzero": 1}),
            Node("Relu", ["r"], ["y"]),
        ],
    )
    cg = opsnn.compile(g)
    assert [n.qualified_type for n in cg.graph.nodes] == ops
    np.testing.assert_array_equal(cg.run({"x": x})["y"].numpy(), np.maximum(x, 0).reshape(back))
