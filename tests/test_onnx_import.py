"""ONNX import: the graph IR, the interpreter, opset adapters and every bad-input path.

Oracles: onnxruntime (round trips, opset adapters) and onnx.reference.ReferenceEvaluator
(control flow, sequences); tolerances stated per test (float32: rtol 1e-5, atol 1e-6).
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import opsnn
import opsnn.onnx
from opsnn.graph import (
    DanglingValueError,
    DuplicateValueError,
    Graph,
    GraphCycleError,
    GraphError,
    Interpreter,
    Node,
    Value,
    run,
)
from opsnn.onnx import (
    ExternalDataError,
    ModelFormatError,
    TensorTooLargeError,
    UnsupportedOpError,
    UnsupportedOpsetError,
)

F = TensorProto.FLOAT
RTOL, ATOL = 1e-5, 1e-6


def make_model(nodes, inputs, outputs, initializers=(), opset=18, **kw):
    g = helper.make_graph(nodes, "m", inputs, outputs, initializer=list(initializers))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], **kw)


def vi(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def ort_run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def opsnn_run(model, feeds):
    g = opsnn.onnx.load(model)
    res = run(g, feeds)
    return [res[n] for n in g.output_names]


def assert_matches_ort(model, feeds, rtol=RTOL, atol=ATOL):
    want = ort_run(model, feeds)
    got = opsnn_run(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


# -- graph IR ----------------------------------------------------------------------------------------
def test_graph_validate_and_repr():
    g = Graph(
        "g",
        inputs=[Value("x", np.float32, (2, "n"))],
        outputs=[Value("y")],
        nodes=[Node("Relu", ["x"], ["t"]), Node("Neg", ["t"], ["y"])],
    )
    g.validate()
    assert g.value("x").shape == (2, "n") and not g.value("x").is_static()
    assert "Relu" in g.summary() and "2xn" in repr(g.value("x"))
    assert set(g.producers()) == {"t", "y"} and [n.op_type for n in g.consumers()["t"]] == ["Neg"]


def test_graph_cycle_names_nodes():
    g = Graph(
        "c",
        inputs=["x"],
        outputs=["z"],
        nodes=[Node("Relu", ["y"], ["z"], name="a"), Node("Relu", ["z"], ["y"], name="b")],
    )
    with pytest.raises(GraphCycleError, match=r"a \(Relu\).*b \(Relu\)"):
        g.validate()
    with pytest.raises(GraphCycleError):
        g.sort()


def test_graph_dangling_and_duplicate():
    g = Graph("d", inputs=["x"], outputs=["z"], nodes=[Node("Relu", ["q"], ["z"], name="n1")])
    with pytest.raises(DanglingValueError, match="n1.*'q'"):
        g.validate()
    g = Graph("d", inputs=["x"], outputs=["nope"], nodes=[Node("Relu", ["x"], ["z"])])
    with pytest.raises(DanglingValueError, match="output 'nope'"):
        g.validate()
    g = Graph(
        "d",
        inputs=["x"],
        outputs=["z"],
        nodes=[Node("Relu", ["x"], ["z"], name="a"), Node("Neg", ["x"], ["z"], name="b")],
    )
    with pytest.raises(DuplicateValueError, match="'a'.*'b'"):
        g.validate()


def test_graph_unsorted_is_reported_then_sortable():
    g = Graph(
        "u",
        inputs=["x"],
        outputs=["z"],
        nodes=[Node("Neg", ["t"], ["z"], name="second"), Node("Relu", ["x"], ["t"], name="first")],
    )
    with pytest.raises(GraphError, match="topological"):
        g.validate()
    g.sort().validate()
    assert [n.name for n in g.nodes] == ["first", "second"]


def test_subgraph_outer_scope_validation():
    body = Graph("then", outputs=["o"], nodes=[Node("Relu", ["outer_missing"], ["o"], name="inner")])
    g = Graph(
        "p",
        inputs=[Value("c", np.bool_)],
        outputs=["y"],
        nodes=[Node("If", ["c"], ["y"], {"then_branch": body, "else_branch": body}, name="if")],
    )
    with pytest.raises(DanglingValueError, match="inner"):
        g.validate()


# -- interpreter -----------------------------------------------------------------------------------
def test_interpreter_runs_graph_and_checks_feeds():
    g = Graph("g", inputs=[Value("x", np.float32, (2, 3))], outputs=["y"], nodes=[Node("Relu", ["x"], ["y"])])
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    np.testing.assert_array_equal(run(g, {"x": x})["y"], np.maximum(x, 0))
    interp = Interpreter(g)
    np.testing.assert_array_equal(interp.run({"x": x.T.copy().T})["y"], np.maximum(x, 0))  # reuse
    with pytest.raises(opsnn.errors.ParamNullptrError, match="missing input 'x'"):
        run(g, {})
    with pytest.raises(opsnn.errors.DTypeError, match="float32"):
        run(g, {"x": x.astype(np.float64)})
    with pytest.raises(opsnn.errors.ParamInvalidError, match=r"shape \(2, 3\)"):
        run(g, {"x": np.zeros((3, 2), np.float32)})
    with pytest.raises(opsnn.errors.ParamInvalidError, match="unknown input"):
        run(g, {"x": x, "bogus": x})


def test_interpreter_error_names_node():
    g = Graph(
        "g",
        inputs=[Value("a", np.float32), Value("b", np.float32)],
        outputs=["y"],
        nodes=[Node("MatMul", ["a", "b"], ["y"], name="mm")],
    )
    with pytest.raises(opsnn.errors.OpsnnError) as info:
        run(g, {"a": np.zeros((2, 3), np.float32), "b": np.zeros((4, 5), np.float32)})
    assert any("mm" in n for n in getattr(info.value, "__notes__", [])) or "mm" in str(info.value)


def _loop_model():
    # sum_{i<M} (x * i) with an outer-scope scale, plus the per-iteration values as scan output
    body = helper.make_graph(
        [
            helper.make_node("Cast", ["i"], ["i_f"], to=F),
            helper.make_node("Mul", ["i_f", "scale"], ["t"]),
            helper.make_node("Add", ["acc", "t"], ["acc_out"]),
            helper.make_node("Identity", ["cond"], ["cond_out"]),
            helper.make_node("Identity", ["t"], ["scan_out"]),
        ],
        "body",
        [vi("i", [], TensorProto.INT64), vi("cond", [], TensorProto.BOOL), vi("acc", [2])],
        [vi("cond_out", [], TensorProto.BOOL), vi("acc_out", [2]), vi("scan_out", [2])],
    )
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["scale"]),
        helper.make_node("Loop", ["M", "", "acc0"], ["acc", "scans"], body=body),
    ]
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    return make_model(
        nodes,
        [vi("x", [2]), vi("M", [], TensorProto.INT64), vi("acc0", [2])],
        [vi("acc", [2]), vi("scans", [None, 2])],
        [two],
        opset=18,
    )


@pytest.mark.parametrize("trips", [0, 1, 4])
def test_loop_with_outer_scope_matches_onnxruntime(trips):
    m = _loop_model()
    feeds = {
        "x": np.array([1.0, -2.0], np.float32),
        "M": np.array(trips, np.int64),
        "acc0": np.array([0.5, 0.25], np.float32),
    }
    got = opsnn_run(m, feeds)
    assert got[1].shape == (trips, 2) and got[1].dtype == np.float32
    if trips == 0:  # onnxruntime cannot build zero scan outputs either; the answer is acc0
        np.testing.assert_array_equal(got[0], feeds["acc0"])
        return
    want = ort_run(m, feeds)  # (onnx.reference's Loop mishandles an absent cond input)
    np.testing.assert_allclose(got[0], want[0], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got[1], want[1], rtol=RTOL, atol=ATOL)


def test_if_branches_and_sequences_match_reference():
    then_g = helper.make_graph(
        [helper.make_node("SequenceConstruct", ["x", "x"], ["s"])],
        "then",
        [],
        [helper.make_tensor_sequence_value_info("s", F, None)],
    )
    else_g = helper.make_graph(
        [helper.make_node("SplitToSequence", ["x"], ["s"], axis=0)],
        "else",
        [],
        [helper.make_tensor_sequence_value_info("s", F, None)],
    )
    nodes = [
        helper.make_node("If", ["c"], ["seq"], then_branch=then_g, else_branch=else_g),
        helper.make_node("SequenceLength", ["seq"], ["n"]),
        helper.make_node("ConcatFromSequence", ["seq"], ["cat"], axis=0, new_axis=1),
        helper.make_node("SequenceAt", ["seq", "pos"], ["last"]),
    ]
    pos = numpy_helper.from_array(np.array(-1, np.int64), "pos")
    m = make_model(
        nodes,
        [vi("c", [], TensorProto.BOOL), vi("x", [3, 2])],
        [vi("n", [], TensorProto.INT64), vi("cat", None), vi("last", None)],
        [pos],
    )
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    for c in (True, False):
        feeds = {"c": np.array(c), "x": x}
        want = ReferenceEvaluator(m).run(None, feeds)
        got = opsnn_run(m, feeds)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_optional_ops():
    nodes = [
        helper.make_node("Optional", ["x"], ["o"]),
        helper.make_node("OptionalHasElement", ["o"], ["has"]),
        helper.make_node("OptionalGetElement", ["o"], ["y"]),
    ]
    m = make_model(nodes, [vi("x", [2])], [vi("has", [], TensorProto.BOOL), vi("y", [2])])
    got = opsnn_run(m, {"x": np.ones(2, np.float32)})
    assert bool(got[0]) is True
    np.testing.assert_array_equal(got[1], np.ones(2, np.float32))


# -- round trip vs onnxruntime -----------------------------------------------------------------------
def test_round_trip_mlp_vs_onnxruntime(rng, no_leak):
    w1 = numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b1")
    shape = numpy_helper.from_array(np.array([-1, 4, 4], np.int64), "shape")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("Reshape", ["r", "shape"], ["r3"]),
        helper.make_node("Transpose", ["r3"], ["t"], perm=[0, 2, 1]),
        helper.make_node("Constant", [], ["half"], value=numpy_helper.from_array(np.float32(0.5))),
        helper.make_node("Mul", ["t", "half"], ["tm"]),
        helper.make_node("Softmax", ["tm"], ["y"], axis=-1),
    ]
    m = make_model(nodes, [vi("x", ["batch", 8])], [vi("y", ["batch", 4, 4])], [w1, b1, shape])
    g = opsnn.onnx.load(m)
    assert "half" in g.initializers and not any(n.op_type == "Constant" for n in g.nodes)
    for batch in (1, 5):
        assert_matches_ort(m, {"x": rng.standard_normal((batch, 8)).astype(np.float32)})


def test_load_from_path_and_bytes(tmp_path):
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [3])], [vi("y", [3])])
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    x = np.array([-1, 0, 2], np.float32)
    for src in (str(path), path, path.read_bytes(), m, open(path, "rb")):
        g = opsnn.onnx.load(src)
        np.testing.assert_array_equal(run(g, {"x": x})["y"], np.maximum(x, 0))
    assert g.metadata["source_opsets"] == {"": 18}


def test_optional_inputs_and_outputs():
    mx = numpy_helper.from_array(np.array(1.0, np.float32), "mx")
    nodes = [
        helper.make_node("Clip", ["x", "", "mx"], ["c"]),  # absent min in the middle
        helper.make_node("Dropout", ["c"], ["y", ""]),
    ]  # unused optional output
    m = make_model(nodes, [vi("x", [4])], [vi("y", [4])], [mx], opset=18)
    x = np.array([-3, 0.5, 2, 7], np.float32)
    assert_matches_ort(m, {"x": x})


def test_unsorted_onnx_nodes_are_sorted():
    nodes = [helper.make_node("Neg", ["t"], ["y"]), helper.make_node("Relu", ["x"], ["t"])]
    m = make_model(nodes, [vi("x", [2])], [vi("y", [2])])
    np.testing.assert_array_equal(opsnn_run(m, {"x": np.array([-1, 2], np.float32)})[0], np.array([0, -2], np.float32))


def test_model_local_function_is_inlined():
    fn = helper.make_function(
        "custom",
        "ScaledRelu",
        ["X"],
        ["Y"],
        [
            helper.make_node("Relu", ["X"], ["r"]),
            helper.make_node("Constant", [], ["k"], value_float=3.0),
            helper.make_node("Mul", ["r", "k"], ["Y"]),
        ],
        [helper.make_opsetid("", 18)],
    )
    g = helper.make_graph(
        [helper.make_node("ScaledRelu", ["x"], ["y"], domain="custom")], "m", [vi("x", [3])], [vi("y", [3])]
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("custom", 1)], functions=[fn]
    )
    x = np.array([-1, 1, 2], np.float32)
    np.testing.assert_allclose(opsnn_run(m, {"x": x})[0], np.maximum(x, 0) * 3)


def _calls_model(n_calls):
    """``n_calls`` calls in a row of one two-node local function, F(a) = -|a| (so F(F(a)) = F(a))."""
    fn = helper.make_function(
        "local",
        "F",
        ["a"],
        ["b"],
        [helper.make_node("Abs", ["a"], ["t"]), helper.make_node("Neg", ["t"], ["b"])],
        [helper.make_opsetid("", 18)],
    )
    nodes = [helper.make_node("F", [f"v{i}"], [f"v{i + 1}"], domain="local") for i in range(n_calls)]
    g = helper.make_graph(nodes, "calls", [vi("v0", [3])], [vi(f"v{n_calls}", [3])])
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)], functions=[fn]
    )


def _nested_model(depth):
    """``depth`` local functions, each calling the next twice: 2**depth Relus from a 2 KB model."""
    fns = []
    for d in range(depth):
        body = (
            [helper.make_node("Relu", ["a"], ["b"])]
            if d == depth - 1
            else [
                helper.make_node(f"F{d + 1}", ["a"], ["t"], domain="local"),
                helper.make_node(f"F{d + 1}", ["t"], ["b"], domain="local"),
            ]
        )
        fns.append(
            helper.make_function(
                "local", f"F{d}", ["a"], ["b"], body, [helper.make_opsetid("", 18), helper.make_opsetid("local", 1)]
            )
        )
    g = helper.make_graph(
        [helper.make_node("F0", ["x"], ["y"], domain="local")], "nested", [vi("x", [3])], [vi("y", [3])]
    )
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)], functions=fns
    )


def test_function_inlining_names_in_linear_time(monkeypatch):
    """Each call's fresh names cost O(1) probes of the name set, not one per earlier call."""
    import opsnn.onnx.importer as imp

    probes = [0]

    class CountingNames(imp._opset.NameSet):
        def __contains__(self, name):
            probes[0] += 1
            return super().__contains__(name)

    monkeypatch.setattr(imp._opset, "NameSet", CountingNames)
    n = 1500
    g = opsnn.onnx.load(_calls_model(n))
    assert len(g.nodes) == 2 * n
    assert probes[0] < 10 * n, f"{probes[0]} name probes for {n} calls"
    x = np.array([-1, 0.5, 2], np.float32)
    np.testing.assert_allclose(run(g, {"v0": x})[f"v{n}"], -np.abs(x))


def test_function_expansion_budget(monkeypatch):
    import opsnn.onnx.importer as imp

    with pytest.raises(opsnn.onnx.ExpansionLimitError, match=r"more than 300 nodes.*max_function_nodes="):
        opsnn.onnx.load(_calls_model(200), max_function_nodes=300)
    assert len(opsnn.onnx.load(_calls_model(150), max_function_nodes=300).nodes) == 300
    # 30 nested doubling functions would expand to 2**30 nodes: refused once the default budget is spent
    monkeypatch.setattr(imp, "MAX_FUNCTION_NODES", 4000)
    with pytest.raises(opsnn.onnx.ExpansionLimitError, match="more than 4000 nodes"):
        opsnn.onnx.load(_nested_model(30))
    g = opsnn.onnx.load(_nested_model(8))
    assert [n.op_type for n in g.nodes] == ["Relu"] * 2**7


def test_onnx_function_body_fallback(monkeypatch):
    """An op without a record expands from its ONNX function body (here Celu, forced)."""
    import opsnn.onnx.importer as imp

    real = imp.is_supported
    monkeypatch.setattr(imp, "is_supported", lambda op, dom="": op != "Celu" and real(op, dom))
    m = make_model([helper.make_node("Celu", ["x"], ["y"], alpha=2.0)], [vi("x", [5])], [vi("y", [5])], opset=18)
    g = opsnn.onnx.load(m)
    assert "Celu" not in {n.op_type for n in g.nodes}
    x = np.array([-3, -1, 0, 1, 3], np.float32)
    np.testing.assert_allclose(
        run(g, {"x": x})["y"], ReferenceEvaluator(m).run(None, {"x": x})[0], rtol=RTOL, atol=ATOL
    )


# -- opset adapters (old attribute forms -> latest input forms), each vs onnxruntime ------------------
def _adapter_cases():
    x3 = vi("x", [2, 3, 4])
    yield (
        "squeeze_axes_attr",
        make_model(
            [
                helper.make_node("Unsqueeze", ["x"], ["u"], axes=[0, 3]),
                helper.make_node("Squeeze", ["u"], ["y"], axes=[0]),
            ],
            [x3],
            [vi("y", None)],
            opset=11,
        ),
    )
    yield (
        "reducesum_axes_attr",
        make_model(
            [helper.make_node("ReduceSum", ["x"], ["y"], axes=[1], keepdims=0)], [x3], [vi("y", None)], opset=11
        ),
    )
    yield (
        "reducemean_axes_attr",
        make_model([helper.make_node("ReduceMean", ["x"], ["y"], axes=[0, 2])], [x3], [vi("y", None)], opset=13),
    )
    yield (
        "clip_attrs",
        make_model([helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=0.25)], [x3], [vi("y", None)], opset=6),
    )
    yield (
        "pad_attrs",
        make_model(
            [helper.make_node("Pad", ["x"], ["y"], pads=[0, 1, 0, 0, 2, 1], value=1.5)], [x3], [vi("y", None)], opset=10
        ),
    )
    yield (
        "slice_attrs",
        make_model(
            [helper.make_node("Slice", ["x"], ["y"], starts=[1, 0], ends=[3, 2], axes=[1, 2])],
            [x3],
            [vi("y", None)],
            opset=9,
        ),
    )
    yield (
        "split_attr",
        make_model(
            [helper.make_node("Split", ["x"], ["a", "b"], axis=2, split=[1, 3])],
            [x3],
            [vi("a", None), vi("b", None)],
            opset=11,
        ),
    )
    yield (
        "split_equal",
        make_model(
            [helper.make_node("Split", ["x"], ["a", "b"], axis=2)], [x3], [vi("a", None), vi("b", None)], opset=11
        ),
    )
    yield (
        "topk_k_attr",
        make_model(
            [helper.make_node("TopK", ["x"], ["v", "i"], k=2)],
            [x3],
            [vi("v", None), vi("i", None, TensorProto.INT64)],
            opset=9,
        ),
    )
    yield (
        "softmax_2d_coercion",
        make_model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [x3], [vi("y", None)], opset=11),
    )
    yield (
        "logsoftmax_default_axis",
        make_model([helper.make_node("LogSoftmax", ["x"], ["y"])], [vi("x", None)], [vi("y", None)], opset=11),
    )
    yield (
        "dropout_ratio_attr",
        make_model([helper.make_node("Dropout", ["x"], ["y"], ratio=0.3)], [x3], [vi("y", None)], opset=10),
    )
    yield (
        "reshape_v1_unsqueeze",
        make_model([helper.make_node("Unsqueeze", ["x"], ["y"], axes=[1])], [x3], [vi("y", None)], opset=9),
    )


@pytest.mark.parametrize("name,model", list(_adapter_cases()), ids=[c[0] for c in _adapter_cases()])
def test_opset_adapter_matches_onnxruntime(name, model, rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    assert_matches_ort(model, {"x": x})
    g = opsnn.onnx.load(model)
    assert g.opset_imports[""] == opsnn.onnx.opset.MAX_OPSET
    assert g.metadata["source_opsets"][""] == model.opset_import[0].version


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize10_matches_onnxruntime(mode, rng):
    sc = numpy_helper.from_array(np.array([1, 1, 2, 1.5], np.float32), "sc")
    m = make_model(
        [helper.make_node("Resize", ["x", "sc"], ["y"], mode=mode)],
        [vi("x", [1, 2, 3, 4])],
        [vi("y", None)],
        [sc],
        opset=10,
    )
    assert_matches_ort(m, {"x": rng.standard_normal((1, 2, 3, 4)).astype(np.float32)})


def test_scatter_becomes_scatter_elements(rng):
    m = make_model(
        [helper.make_node("Scatter", ["d", "i", "u"], ["y"], axis=1)],
        [vi("d", [3, 3]), vi("i", [2, 3], TensorProto.INT64), vi("u", [2, 3])],
        [vi("y", None)],
        opset=9,
    )
    assert [n.op_type for n in opsnn.onnx.load(m).nodes] == ["ScatterElements"]
    assert_matches_ort(
        m,
        {
            "d": np.zeros((3, 3), np.float32),
            "i": np.array([[1, 0, 2], [0, 2, 1]], np.int64),
            "u": rng.standard_normal((2, 3)).astype(np.float32),
        },
    )


def test_group_norm18_per_group_scale_matches_onnxruntime(rng):
    s = numpy_helper.from_array(rng.standard_normal(2).astype(np.float32), "s")
    b = numpy_helper.from_array(rng.standard_normal(2).astype(np.float32), "b")
    m = make_model(
        [helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2)],
        [vi("x", [2, 4, 3, 3])],
        [vi("y", None)],
        [s, b],
        opset=18,
    )
    assert_matches_ort(m, {"x": rng.standard_normal((2, 4, 3, 3)).astype(np.float32)}, rtol=1e-4, atol=1e-4)


def test_legacy_broadcast_with_axis(rng):
    """Opset-6 Add(broadcast=1, axis=1) aligns B at axis 1 (oracle: numpy)."""
    m = make_model(
        [helper.make_node("Add", ["a", "b"], ["y"], broadcast=1, axis=1)],
        [vi("a", [2, 3, 4, 5]), vi("b", [3])],
        [vi("y", None)],
        opset=6,
    )
    a = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    np.testing.assert_allclose(opsnn_run(m, {"a": a, "b": b})[0], a + b[None, :, None, None], rtol=RTOL, atol=ATOL)
    unknown = make_model(
        [helper.make_node("Add", ["a", "b"], ["y"], broadcast=1, axis=1)],
        [vi("a", None), vi("b", None)],
        [vi("y", None)],
        opset=6,
    )
    with pytest.raises(UnsupportedOpError, match="ranks"):
        opsnn.onnx.load(unknown)


def test_upsample_becomes_resize_and_matches_onnxruntime():
    scales = numpy_helper.from_array(np.array([1, 1, 2, 3], np.float32), "scales")
    m = make_model(
        [helper.make_node("Upsample", ["x", "scales"], ["y"], mode="nearest")],
        [vi("x", [1, 1, 2, 2])],
        [vi("y", None)],
        [scales],
        opset=9,
    )
    g = opsnn.onnx.load(m)
    assert [n.op_type for n in g.nodes] == ["Resize"]
    assert_matches_ort(m, {"x": np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)})


def test_adapter_table_is_data():
    table = opsnn.onnx.opset.describe()
    assert {"op": "Squeeze", "domain": "", "since": 13} in [{k: r[k] for k in ("op", "domain", "since")} for r in table]
    assert all(r["doc"] for r in table)


# -- bad input: each raises a typed error ------------------------------------------------------------------
def test_unknown_op_names_op_domain_opset_node_and_nearest():
    m = make_model([helper.make_node("Rellu", ["x"], ["y"], name="my_node")], [vi("x", [2])], [vi("y", [2])], opset=17)
    with pytest.raises(UnsupportedOpError) as info:
        opsnn.onnx.load(m)
    msg = str(info.value)
    for part in ("Rellu", "ai.onnx", "opset 17", "my_node", "Relu"):
        assert part in msg
    assert info.value.code == opsnn.errors.KERNEL_NOT_FOUND


def test_unknown_domain_op():
    g = helper.make_graph(
        [helper.make_node("Foo", ["x"], ["y"], domain="com.example")], "m", [vi("x", [2])], [vi("y", [2])]
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.example", 3)])
    with pytest.raises(UnsupportedOpError, match="com.example.*opset 3"):
        opsnn.onnx.load(m)


def test_opset_newer_than_supported():
    m = make_model(
        [helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2])], [vi("y", [2])], opset=opsnn.onnx.opset.MAX_OPSET + 1
    )
    with pytest.raises(UnsupportedOpsetError, match=str(opsnn.onnx.opset.MAX_OPSET + 1)):
        opsnn.onnx.load(m)


def test_missing_opset_import():
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "m", [vi("x", [2])], [vi("y", [2])])
    m = helper.make_model(g)
    del m.opset_import[:]
    with pytest.raises(ModelFormatError, match="opset"):
        opsnn.onnx.load(m)


def test_malformed_and_truncated_protobuf(rng):
    with pytest.raises(ModelFormatError, match="not a valid ONNX model"):
        opsnn.onnx.load(b"\xff\xff\xff\xff garbage")
    w = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w")
    m = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", [1, 64])], [vi("y", [1, 64])], [w])
    data = m.SerializeToString()
    with pytest.raises(ModelFormatError):
        opsnn.onnx.load(data[: len(data) // 2])
    with pytest.raises(ModelFormatError, match="not an ONNX model"):
        opsnn.onnx.load(b"")
    with pytest.raises(ModelFormatError, match="cannot read"):
        opsnn.onnx.load("/nonexistent/model.onnx")
    with pytest.raises(ModelFormatError, match="expected a path"):
        opsnn.onnx.load(12345)


def test_tensor_data_shorter_than_declared_shape():
    t = TensorProto(name="w", data_type=F, dims=[1000])
    t.raw_data = np.zeros(10, np.float32).tobytes()
    m = make_model([helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", [1000])], [vi("y", [1000])], [t])
    with pytest.raises(ModelFormatError, match=r"\[1000\].*40 bytes"):
        opsnn.onnx.load(m)
    t2 = TensorProto(name="w", data_type=F, dims=[3])
    t2.float_data.extend([1.0, 2.0])
    m2 = make_model([helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", [3])], [vi("y", [3])], [t2])
    with pytest.raises(ModelFormatError, match="float_data"):
        opsnn.onnx.load(m2)


def test_tensor_larger_than_pool_cap_refused_before_allocation():
    t = TensorProto(name="w", data_type=F, dims=[1 << 20, 1 << 20])  # 4 TiB declared, no data
    m = make_model([helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", [1])], [vi("y", None)], [t])
    pool = opsnn.context().pool
    old = pool.cap
    pool.set_cap(1 << 30)
    try:
        with pytest.raises(TensorTooLargeError, match="cap") as info:
            opsnn.onnx.load(m)
        assert isinstance(info.value, opsnn.errors.OutOfMemoryError)
    finally:
        pool.set_cap(old)


def _external_model(tmp_path, rng):
    w = rng.standard_normal((16, 16)).astype(np.float32)
    m = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [vi("x", [2, 16])],
        [vi("y", [2, 16])],
        [numpy_helper.from_array(w, "w")],
    )
    path = tmp_path / "model.onnx"
    onnx.save_model(
        m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin", size_threshold=0
    )
    return path, w


def _set_location(path, location):
    m = onnx.load(str(path), load_external_data=False)
    for e in m.graph.initializer[0].external_data:
        if e.key == "location":
            e.value = location
    onnx.save(m, str(path))


def test_external_data_loads(tmp_path, rng):
    path, w = _external_model(tmp_path, rng)
    assert (tmp_path / "weights.bin").exists()
    g = opsnn.onnx.load(str(path))
    np.testing.assert_array_equal(g.initializers["w"], w)
    x = rng.standard_normal((2, 16)).astype(np.float32)
    np.testing.assert_allclose(run(g, {"x": x})["y"], x @ w, rtol=RTOL, atol=1e-5)
    # bytes need base_dir to find the weights
    with pytest.raises(ExternalDataError, match="base_dir"):
        opsnn.onnx.load(path.read_bytes())
    g2 = opsnn.onnx.load(path.read_bytes(), base_dir=str(tmp_path))
    np.testing.assert_array_equal(g2.initializers["w"], w)


@pytest.mark.parametrize(
    "location,match",
    [
        ("../weights.bin", "escapes"),
        ("sub/../../x.bin", "escapes"),
        ("/etc/passwd", "absolute"),
        ("missing.bin", "cannot read"),
        ("weights.bin\x00.txt", "NUL byte"),
    ],
)
def test_external_data_bad_locations(tmp_path, rng, location, match):
    inner = tmp_path / "inner"
    inner.mkdir()
    path, _ = _external_model(inner, rng)
    (tmp_path / "weights.bin").write_bytes(b"\0" * 4096)  # a real file outside the model folder
    _set_location(path, location)
    with pytest.raises(ExternalDataError, match=match):
        opsnn.onnx.load(str(path))


def test_external_data_symlink_escape(tmp_path, rng):
    inner = tmp_path / "inner"
    inner.mkdir()
    path, _ = _external_model(inner, rng)
    outside = tmp_path / "outside.bin"
    outside.write_bytes((inner / "weights.bin").read_bytes())
    os.symlink(outside, inner / "link.bin")
    _set_location(path, "link.bin")
    with pytest.raises(ExternalDataError, match="escapes"):
        opsnn.onnx.load(str(path))


def test_external_data_too_short(tmp_path, rng):
    path, _ = _external_model(tmp_path, rng)
    (tmp_path / "weights.bin").write_bytes(b"\0" * 10)
    with pytest.raises(ExternalDataError, match="10 bytes"):
        opsnn.onnx.load(str(path))


def test_cycle_and_dangling_in_onnx_model():
    cyc = make_model(
        [helper.make_node("Relu", ["b"], ["a"], name="n1"), helper.make_node("Relu", ["a"], ["b"], name="n2")],
        [vi("x", [2])],
        [vi("b", [2])],
    )
    with pytest.raises(GraphCycleError, match="n1"):
        opsnn.onnx.load(cyc)
    dang = make_model([helper.make_node("Relu", ["nowhere"], ["y"], name="lonely")], [vi("x", [2])], [vi("y", [2])])
    with pytest.raises(DanglingValueError, match="lonely.*nowhere"):
        opsnn.onnx.load(dang)


def test_mutated_models_raise_only_typed_errors():
    """Random byte flips and truncations of a valid model: every failure is a typed opsnn
    error (import or run), never a crash, a hang or an untyped exception."""
    rng = np.random.default_rng(3)
    body = helper.make_graph(
        [helper.make_node("Add", ["acc", "x"], ["acc_out"]), helper.make_node("Identity", ["cond"], ["cond_out"])],
        "body",
        [vi("i", [], TensorProto.INT64), vi("cond", [], TensorProto.BOOL), vi("acc", [2])],
        [vi("cond_out", [], TensorProto.BOOL), vi("acc_out", [2])],
    )
    w = numpy_helper.from_array(rng.standard_normal((4, 2)).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["a", "w"], ["x"]),
        helper.make_node("Squeeze", ["x"], ["xs"], axes=[0]),
        helper.make_node("Loop", ["M", "", "xs"], ["y"], body=body),
        helper.make_node("Clip", ["y"], ["z"], min=0.0),
    ]
    m = make_model(nodes, [vi("a", [1, 4]), vi("M", [], TensorProto.INT64)], [vi("z", [2])], [w], opset=10)
    data = m.SerializeToString()
    feeds = {"a": np.ones((1, 4), np.float32), "M": np.array(3, np.int64)}
    kinds = set()
    for _ in range(400):
        d = bytearray(data)
        for _ in range(int(rng.integers(1, 4))):
            d[int(rng.integers(0, len(d)))] = int(rng.integers(0, 256))
        if rng.random() < 0.2:
            d = d[: int(rng.integers(0, len(d)))]
        try:
            g = opsnn.onnx.load(bytes(d))
            run(g, feeds)
        except opsnn.errors.OpsnnError as exc:
            kinds.add(type(exc).__name__)
    assert "ModelFormatError" in kinds
