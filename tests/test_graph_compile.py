"""Graph engine: passes, rewrite rules, compiled plans (dynamic shapes, LRU, memory plan),
tracing, symbolic shape inference, bad input."""

import contextlib
import sys
import threading

import numpy as np
import pytest

import opsnn
from opsnn.errors import InferShapeError, KernelError, ParamInvalidError
from opsnn.graph import Graph, GraphCycleError, Node, Value
from opsnn.graph.pattern import RewriteError
from opsnn.ops import Input, TensorMeta


def _conv_graph(rng):
    init = {
        "w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "s": rng.uniform(0.5, 1.5, 4).astype(np.float32),
        "b": rng.standard_normal(4).astype(np.float32),
        "m": rng.standard_normal(4).astype(np.float32),
        "v": rng.uniform(0.5, 1.5, 4).astype(np.float32),
        "shape": np.array([0, -1], np.int64),
    }
    nodes = [
        Node("Conv", ["x", "w"], ["c"], {"pads": [1, 1, 1, 1]}, name="conv"),
        Node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"], name="bn"),
        Node("Identity", ["bn"], ["i"], name="ident"),
        Node("Relu", ["i"], ["r"], name="relu_a"),
        Node("Relu", ["i"], ["r2"], name="relu_b"),
        Node("Add", ["r", "r2"], ["a"], name="add"),
        Node("Transpose", ["a"], ["t1"], {"perm": [0, 2, 3, 1]}, name="t1"),
        Node("Transpose", ["t1"], ["t2"], {"perm": [0, 3, 1, 2]}, name="t2"),
        Node("Reshape", ["t2", "shape"], ["out"], name="reshape"),
    ]
    return Graph(
        "convnet", inputs=[Value("x", np.float32, ("N", 3, 8, 8))], outputs=["out"], nodes=nodes, initializers=init
    )


def _np(v):
    return v.numpy() if hasattr(v, "numpy") else np.asarray(v)


def test_passes_shrink_the_graph_and_keep_results(rng):
    g = _conv_graph(rng)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    ref = _np(opsnn.graph.run(g, {"x": x})["out"])
    cg = opsnn.compile(g)
    rep = cg.pass_report
    assert rep.nodes_before == 9 and rep.nodes_after == 3
    for name in ("eliminate_noops", "common_subexpression_elimination", "transpose_cancellation", "conv_bn_folding"):
        assert rep.by_name(name).changes >= 1, name
    assert [n.qualified_type for n in cg.graph.nodes] == ["opsnn::FusedConv", "Add", "Reshape"]
    assert rep.by_name("epilogue_fusion").changes == 1
    assert len(g.nodes) == 9, "compile must not modify the caller's graph"
    np.testing.assert_allclose(cg.run({"x": x})["out"].numpy(), ref, rtol=1e-4, atol=1e-5)
    assert "conv_epilogue (inner kernel conv2d_" in cg.explain()


def test_disable_passes_by_name(rng):
    g = _conv_graph(rng)
    try:
        opsnn.config.disable_passes(["conv_bn_folding"])
        cg = opsnn.compile(g)
        assert "BatchNormalization" in [n.op_type for n in cg.graph.nodes]
        assert "conv_bn_folding" not in [r.name for r in cg.pass_report.results]
    finally:
        opsnn.config.disable_passes([])
    with pytest.raises(ParamInvalidError, match="unknown pass"):
        opsnn.config.disable_passes(["conv_bn_fold"])


def test_constant_folding_and_dce():
    g = Graph(
        "fold",
        inputs=[Value("x", np.float32, (3,))],
        outputs=["y"],
        initializers={
            "a": np.array([1.0, 2.0, 3.0], np.float32),
            "b": np.array([1.0, 1.0, 1.0], np.float32),
            "unused": np.zeros(3, np.float32),
        },
        nodes=[Node("Add", ["a", "b"], ["ab"]), Node("Mul", ["x", "ab"], ["y"]), Node("Neg", ["x"], ["dead"])],
    )
    cg = opsnn.compile(g)
    assert [n.op_type for n in cg.graph.nodes] == ["Mul"]
    assert "unused" not in cg.graph.initializers
    np.testing.assert_allclose(cg.run({"x": np.ones(3, np.float32)})["y"].numpy(), [2, 3, 4])


# -- user rewrite rules -------------------------------------------------------------------------------
if not opsnn.ops.has_op("ReluNeg", "opsnn_test"):
    _rn = opsnn.register_op(
        "ReluNeg",
        domain="opsnn_test",
        inputs=[Input("X")],
        outputs=["Y"],
        attrs=[("Relu.dummy", "any", None)],
        infer=lambda ctx: [TensorMeta(ctx.shape(0), ctx.dtype(0))],
        reference=lambda ins, attrs: -np.maximum(ins[0], 0),
    )
    _rn.kernel("relu_neg", priority=1)(lambda ins, outs, a, p, ws: np.negative(np.maximum(ins[0], 0), out=outs[0]))


def _relu_neg_graph():
    return Graph(
        "rn",
        inputs=[Value("x", np.float32, (4,))],
        outputs=["z"],
        nodes=[Node("Relu", ["x"], ["y"]), Node("Neg", ["y"], ["z"])],
    )


def test_user_rule_with_graph_pattern_and_template():
    rule = opsnn.optimize.register_rewrite_rule(
        opsnn.GraphPattern("Relu -> Neg"),
        opsnn.GraphTemplate("ReluNeg", domain="opsnn_test", attrs={}),
        name="relu_neg_fusion",
    )
    try:
        cg = opsnn.compile(_relu_neg_graph())
        assert [n.qualified_type for n in cg.graph.nodes] == ["opsnn_test::ReluNeg"]
        assert cg.pass_report.by_name("user_rewrites").changes == 1
        x = np.array([-1, 2, -3, 4], np.float32)
        np.testing.assert_array_equal(cg.run({"x": x})["z"].numpy(), [0, -2, 0, -4])
        assert "fused from" in cg.explain()
    finally:
        opsnn.optimize.unregister_rewrite_rule(rule.name)


def test_combinator_pattern_with_check_callback():
    from opsnn.optimize import is_const, is_op, wildcard

    g = Graph(
        "mm",
        inputs=[Value("x", np.float32, (2, 3))],
        outputs=["y"],
        initializers={"w": np.ones((3, 4), np.float32), "b": np.arange(4, dtype=np.float32)},
        nodes=[Node("MatMul", ["x", "w"], ["xw"]), Node("Add", ["b", "xw"], ["y"])],
    )  # b + xw: commuted
    seen = []

    def to_gemm(match):
        return [Node("Gemm", [match.bindings["x"], match.bindings["w"], match.bindings["b"]], list(match.root.outputs))]

    pattern = is_op("Add")(is_op("MatMul")(wildcard("x"), is_const("w")), is_const("b"))
    rule = opsnn.optimize.register_rewrite_rule(
        pattern, to_gemm, name="matmul_add_to_gemm", check=lambda m: seen.append(m) or True
    )
    try:
        cg = opsnn.compile(g)
        assert [n.op_type for n in cg.graph.nodes] == ["Gemm"] and seen
        x = np.ones((2, 3), np.float32)
        np.testing.assert_allclose(cg.run({"x": x})["y"].numpy(), 3 + np.arange(4)[None].repeat(2, 0))
    finally:
        opsnn.optimize.unregister_rewrite_rule(rule.name)
    refused = opsnn.optimize.register_rewrite_rule(
        pattern, to_gemm, name="refusing", check=lambda m: "weights too small"
    )
    try:
        cg = opsnn.compile(g, disabled_passes=["epilogue_fusion"])
        assert [n.op_type for n in cg.graph.nodes] == ["MatMul", "Add"]
        assert any("weights too small" in r for r in cg.pass_report.by_name("user_rewrites").refused)
    finally:
        opsnn.optimize.unregister_rewrite_rule(refused.name)


def test_invalid_rewrite_is_rejected_with_rule_name_and_graph_unchanged():
    def broken(match):
        return [Node("Neg", ["no_such_value"], list(match.root.outputs))]

    rule = opsnn.optimize.register_rewrite_rule(opsnn.GraphPattern("Relu -> Neg"), broken, name="broken_rule")
    g = _relu_neg_graph()
    try:
        with pytest.raises(RewriteError, match="broken_rule"):
            opsnn.optimize.rewrite(g, [rule])
        assert [n.op_type for n in g.nodes] == ["Relu", "Neg"]
    finally:
        opsnn.optimize.unregister_rewrite_rule("broken_rule")


def test_multiple_consumers_block_fusion_and_say_why():
    g = Graph(
        "mc",
        inputs=[Value("x", np.float32, (4,))],
        outputs=["z", "y"],
        nodes=[Node("Relu", ["x"], ["y"]), Node("Neg", ["y"], ["z"])],
    )
    rule = opsnn.optimize.RewriteRule(opsnn.GraphPattern("Relu -> Neg"), opsnn.GraphTemplate("ReluNeg"))
    rep = opsnn.optimize.rewrite(g, [rule])
    assert rep.applied == [] and "graph output" in rep.refused[0][2]


# -- compiled plans ---------------------------------------------------------------------------------------
def test_dynamic_batch_one_plan_per_shape_and_lru_cap(rng):
    g = _conv_graph(rng)
    cg = opsnn.compile(g, max_plans=2)
    for n in (1, 2, 3, 1):
        x = rng.standard_normal((n, 3, 8, 8)).astype(np.float32)
        ref = _np(opsnn.graph.run(g, {"x": x})["out"])
        np.testing.assert_allclose(cg.run({"x": x})["out"].numpy(), ref, rtol=1e-4, atol=1e-5)
    assert cg.plans_built == 3 + 1 and cg.num_plans == 2  # batch 1 (least recent) was evicted by 3, then rebuilt


def test_static_shapes_precompile(rng):
    cg = opsnn.compile(_conv_graph(rng), static_shapes=[{"x": (1, 3, 8, 8)}, {"x": (4, 3, 8, 8)}])
    assert cg.num_plans == 2
    cg.run({"x": np.zeros((4, 3, 8, 8), np.float32)})
    assert cg.plans_built == 2


def test_wrong_inputs_get_clear_errors(rng):
    cg = opsnn.compile(_conv_graph(rng))
    with pytest.raises(ParamInvalidError, match="dtype float64"):
        cg.run({"x": np.zeros((1, 3, 8, 8))})
    with pytest.raises(ParamInvalidError, match="dim 1 must be 3"):
        cg.run({"x": np.zeros((1, 4, 8, 8), np.float32)})
    with pytest.raises(ParamInvalidError, match="missing input"):
        cg.run({})
    with pytest.raises(ParamInvalidError, match="unknown input"):
        cg.run({"x": np.zeros((1, 3, 8, 8), np.float32), "y": 1})


def test_runtime_shape_contradiction_names_node_and_shapes():
    g = Graph(
        "bad",
        inputs=[Value("a", np.float32, ("N", 4)), Value("b", np.float32, ("M", 4))],
        outputs=["c"],
        nodes=[Node("Add", ["a", "b"], ["c"], name="the_add")],
    )
    cg = opsnn.compile(g)
    cg.run({"a": np.ones((2, 4), np.float32), "b": np.ones((1, 4), np.float32)})  # broadcasts: fine
    with pytest.raises(InferShapeError, match=r"the_add.*\(2, 4\).*\(3, 4\)"):
        cg.run({"a": np.ones((2, 4), np.float32), "b": np.ones((3, 4), np.float32)})


def test_memory_plan_reuses_the_arena():
    nodes = [Node("Relu" if i % 2 else "Neg", [f"v{i}"], [f"v{i + 1}"]) for i in range(8)]
    g = Graph("chain", inputs=[Value("v0", np.float32, (256,))], outputs=["v8"], nodes=nodes)
    x = np.linspace(-1, 1, 256).astype(np.float32)
    cg = opsnn.compile(g, disabled_passes=["elementwise_fusion"])  # keep 8 nodes to plan
    out = cg.run({"v0": x})["v8"].numpy()
    np.testing.assert_allclose(out, np.maximum(-np.maximum(-x, 0), 0))
    rep = cg.memory_report()
    assert rep["in_place"] >= 5 and rep["arena_bytes"] <= 1024
    opsnn.config.enable_memory_optimization(False)
    try:
        cg2 = opsnn.compile(g, disabled_passes=["elementwise_fusion"])
        cg2.run({"v0": x})
        assert cg2.memory_report()["arena_bytes"] == 7 * 1024 and cg2.memory_report()["in_place"] == 0
    finally:
        opsnn.config.enable_memory_optimization(True)


def test_reshapes_are_views_in_the_plan(rng):
    # MatMul -> Reshape -> Relu -> Flatten -> Neg, and a second Reshape of the Relu output: a
    # reshape costs nothing when its input is not read after it (no step; the output is the
    # input's bytes); Flatten's input is read again later, so Flatten copies
    w = rng.standard_normal((4, 12)).astype(np.float32)
    g = Graph(
        "views",
        inputs=[Value("x", np.float32, (2, 4))],
        outputs=["y", "z"],
        nodes=[
            Node("MatMul", ["x", "w"], ["m"]),
            Node("Reshape", ["m", "shape"], ["r"]),
            Node("Relu", ["r"], ["a"]),
            Node("Flatten", ["a"], ["f"], {"axis": 1}),
            Node("Neg", ["f"], ["y"]),
            Node("Reshape", ["a", "shape2"], ["kept"]),  # the last read of "a"
            Node("Add", ["kept", "kept"], ["z"]),
        ],
        initializers={"w": w, "shape": np.array([2, 3, 2, 2], np.int64), "shape2": np.array([2, 12], np.int64)},
    )
    cg = opsnn.compile(g, disabled_passes=["elementwise_fusion", "epilogue_fusion"])
    x = rng.standard_normal((2, 4)).astype(np.float32)
    out = cg.run({"x": x})
    a = np.maximum(x @ w, 0).reshape(2, 3, 2, 2)
    # products of 4 terms may cancel: the GEMM library's summation order moves such a value by a few ulps of its terms
    np.testing.assert_allclose(out["y"].numpy(), -a.reshape(2, 12), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out["z"].numpy(), 2 * a.reshape(2, 12), rtol=1e-6, atol=2e-6)
    plan = cg.plans[0]
    ran = [st.node.op_type for st in plan.steps]
    assert "Reshape" not in ran and "Flatten" in ran
    assert plan.memory.aliases.get("r") == "m" and plan.memory.aliases.get("kept") == "m"
    assert "f" not in plan.memory.aliases
    again = cg.run({"x": 2 * x})  # replaying the plan: the views still see the new data
    np.testing.assert_allclose(again["y"].numpy(), -2 * a.reshape(2, 12), rtol=1e-6, atol=2e-6)


def test_compiled_run_is_async_on_a_stream(rng):
    g = _conv_graph(rng)
    cg = opsnn.compile(g)
    s = opsnn.Stream()
    x = rng.standard_normal((8, 3, 8, 8)).astype(np.float32)
    outs = [cg.run({"x": x}, stream=s)["out"] for _ in range(3)]
    s.synchronize()
    ref = _np(opsnn.graph.run(g, {"x": x})["out"])
    for o in outs:
        np.testing.assert_allclose(o.numpy(), ref, rtol=1e-4, atol=1e-5)


def _in_two_threads(work):
    """Run ``work(0)`` and ``work(1)`` at once with the GIL switching every microsecond, so that
    races between the two show up."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)


@pytest.mark.parametrize("own_streams", [True, False])
def test_one_compiled_graph_run_from_two_threads(rng, own_streams):
    """Each run waits for the plan's previous run on another stream (they share the arena). Two
    threads launching at once both saw the same earlier run and skipped the wait: with the GIL
    switching every microsecond, 5-15 of 6000 results came out wrong; on the shared default stream
    (each thread running its call itself) about half were."""
    from opsnn import nn

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(64, 256), nn.Linear(256, 64)

        def forward(self, x):
            return self.b(opsnn.ops.relu(self.a(x)))

    xs = [rng.standard_normal((8, 64)).astype(np.float32) for _ in range(2)]
    model = MLP()
    cg = opsnn.compile(model, example_inputs=(xs[0],))
    refs = [cg.run([x])[0].numpy().copy() for x in xs]  # one at a time: no race
    for x, ref in zip(xs, refs):
        np.testing.assert_allclose(ref, np.asarray(model(x).numpy()), rtol=1e-5, atol=1e-5)
    wrong = [0, 0]

    def work(i):
        with opsnn.Stream() if own_streams else contextlib.nullcontext():
            for _ in range(3000):
                y = cg.run([xs[i]])[0].numpy()
                wrong[i] += not np.allclose(y, refs[i], rtol=1e-5, atol=1e-5)

    _in_two_threads(work)
    assert cg.plans_built == 1 and wrong == [0, 0]


def test_threads_running_more_shapes_than_plans_kept(rng):
    """Two threads cycling through 5 batch sizes with max_plans=2: one thread's run evicts a plan
    the other just looked up. The lookup and its LRU bump were two steps, and the bump raised
    KeyError for a plan evicted in between; an evicted plan still runs."""
    w = rng.standard_normal((16, 16)).astype(np.float32)
    g = Graph(
        "m",
        inputs=[Value("x", np.float32, ("N", 16))],
        outputs=["y"],
        initializers={"w": w},
        nodes=[Node("MatMul", ["x", "w"], ["h"]), Node("Relu", ["h"], ["y"])],
    )
    cg = opsnn.compile(g)
    cg.max_plans = 2
    xs = [rng.standard_normal((n, 16)).astype(np.float32) for n in range(1, 6)]
    wrong, failures = [0, 0], []

    def work(i):
        try:
            for k in range(2500):
                x = xs[(k + i) % 5]
                wrong[i] += not np.allclose(cg.run({"x": x})["y"].numpy(), np.maximum(x @ w, 0), atol=1e-4)
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    _in_two_threads(work)
    assert not failures and wrong == [0, 0]
    assert cg.num_plans <= 2


def test_kernel_errors_name_the_graph_node():
    if not opsnn.ops.has_op("Boom", "opsnn_test"):
        rec = opsnn.register_op(
            "Boom",
            domain="opsnn_test",
            inputs=["X"],
            outputs=["Y"],
            infer=lambda ctx: [TensorMeta(ctx.shape(0), ctx.dtype(0))],
            reference=lambda ins, attrs: ins[0],
        )

        def boom(ins, outs, a, p, ws):
            raise RuntimeError("kaboom")

        rec.kernel("boom", priority=1)(boom)
    g = Graph(
        "b",
        inputs=[Value("x", np.float32, (2,))],
        outputs=["y"],
        nodes=[Node("Boom", ["x"], ["y"], domain="opsnn_test", name="exploding_node")],
    )
    with pytest.raises(KernelError, match="kaboom"):
        opsnn.compile(g).run({"x": np.ones(2, np.float32)})


#: calls of the Twice kernel's fn, of its bind and of the calls bind returned
_TWICE = {"fn": 0, "bind": 0, "call": 0}


def _twice_fn(ins, outs, a, p, ws):
    _TWICE["fn"] += 1
    np.multiply(ins[0], 2, out=outs[0])


def _twice_bind(ins, outs, a, p, ws):
    _TWICE["bind"] += 1
    x, y = ins[0], outs[0]

    def call():
        _TWICE["call"] += 1
        np.multiply(x, 2, out=y)

    return call


if not opsnn.ops.has_op("Twice", "opsnn_test"):
    opsnn.register_op(
        "Twice",
        domain="opsnn_test",
        inputs=["X"],
        outputs=["Y"],
        infer=lambda ctx: [TensorMeta(ctx.shape(0), ctx.dtype(0))],
        reference=lambda ins, attrs: 2 * ins[0],
    ).kernel("twice", priority=1, bind=_twice_bind)(_twice_fn)


def test_a_kernel_with_bind_is_bound_once_per_plan_and_its_call_runs_every_time():
    # between two Relus it reads and writes arena buffers (a graph input or output is another array each run)
    g = Graph(
        "tw",
        inputs=[Value("x", np.float32, (3,))],
        outputs=["z"],
        nodes=[
            Node("Relu", ["x"], ["a"]),
            Node("Twice", ["a"], ["b"], domain="opsnn_test"),
            Node("Relu", ["b"], ["z"]),
        ],
    )
    before = dict(_TWICE)
    cg = opsnn.compile(g)
    for i in range(3):
        x = np.array([1, -2, 3], np.float32) * (i + 1)
        np.testing.assert_array_equal(cg.run({"x": x})["z"].numpy(), 2 * np.maximum(x, 0))
    assert [_TWICE[k] - before[k] for k in ("bind", "call", "fn")] == [1, 3, 0]
    # eagerly, the kernel runs as itself
    np.testing.assert_array_equal(
        opsnn.ops.run_op("Twice", [np.ones(2, np.float32)], {}, domain="opsnn_test")[0], [2, 2]
    )


def test_cycles_are_rejected():
    g = Graph(
        "cyc",
        inputs=[Value("x", np.float32, (2,))],
        outputs=["b"],
        nodes=[Node("Add", ["x", "b"], ["a"]), Node("Relu", ["a"], ["b"])],
    )
    with pytest.raises((GraphCycleError, opsnn.graph.GraphError)):
        opsnn.compile(g)


# -- tracing --------------------------------------------------------------------------------------------------
def test_trace_a_function_with_dynamic_batch(rng):
    w = opsnn.tensor(rng.standard_normal((8, 4)).astype(np.float32))

    def mlp(x):
        return opsnn.ops.relu(opsnn.ops.matmul(x, w))

    cg = opsnn.compile(mlp, [rng.standard_normal((2, 8)).astype(np.float32)], dynamic_dims={"x": {0: "batch"}})
    assert cg.graph.inputs[0].shape == ("batch", 8)
    assert [n.qualified_type for n in cg.graph.nodes] == ["opsnn::FusedMatMul"]
    for b in (1, 5):
        x = rng.standard_normal((b, 8)).astype(np.float32)
        np.testing.assert_allclose(cg.run([x])[0].numpy(), np.maximum(x @ w.numpy(), 0), rtol=1e-5, atol=1e-6)


def test_compile_a_module_traces_it_as_to_graph_does(rng):
    # inputs named after forward's arguments, weights after their state_dict keys, and a nested
    # output (a decoder's logits and its per-layer key/value cache) flattened, as Module.to_graph
    m = opsnn.models.llama(layers=2, hidden=32, heads=2, kv_heads=1, vocab=50)
    ids = rng.integers(0, 50, (1, 6)).astype(np.int64)
    cg = opsnn.compile(m, [ids])
    assert cg.input_names == ["input_ids"]
    assert "model.embed_tokens.weight" in cg.graph.initializers
    logits, past = m(opsnn.tensor(ids))
    want = [logits] + [t for kv in past for t in kv]
    got = cg.run([ids])
    assert len(got) == len(want) == 5
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4, atol=1e-5)
    lin = opsnn.nn.Linear(8, 3)  # a dynamic dim may be named by the argument's name
    cg = opsnn.compile(lin, [np.zeros((2, 8), np.float32)], dynamic_dims={"x": {0: "batch"}})
    x = rng.standard_normal((5, 8)).astype(np.float32)
    np.testing.assert_allclose(cg.run([x])[0].numpy(), lin(opsnn.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)


def test_symbolic_shape_inference_view():
    g = Graph(
        "s",
        inputs=[Value("x", np.float32, ("N", 3, "H", "W"))],
        outputs=["y"],
        initializers={"w": np.ones((8, 3, 3, 3), np.float32)},
        nodes=[
            Node("Conv", ["x", "w"], ["c"], {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
            Node("Relu", ["c"], ["r"]),
            Node("Cast", ["r"], ["y"], {"to": 10}),
        ],
    )
    text = opsnn.debug.shape_inference(g)
    assert "c: float32[N, 8, floor((H + 1)/2), floor((W + 1)/2)]" in text
    flow = opsnn.debug.dtype_flow(g)
    assert "PRECISION LOSS (float32->float16)" in flow


def test_data_dependent_graphs_fall_back_to_the_interpreter():
    g = Graph("nz", inputs=[Value("x", np.float32, (4,))], outputs=["y"], nodes=[Node("NonZero", ["x"], ["y"])])
    cg = opsnn.compile(g)
    out = cg.run({"x": np.array([0, 1, 0, 2], np.float32)})["y"]
    np.testing.assert_array_equal(_np(out), [[1, 3]])
    assert cg.mode == "interpreted" and "data-dependent" in cg.mode_reason


def test_tensor_view_methods_are_recorded_while_tracing(rng):
    def f(x):
        y = x.reshape(2, -1).T.unsqueeze(0)  # views become Reshape / Transpose / Unsqueeze nodes
        return opsnn.ops.relu(y.squeeze(0).contiguous())

    x = rng.standard_normal((4, 6)).astype(np.float32)
    cg = opsnn.compile(f, [x])
    ops_seen = [n.op_type for n in opsnn.graph.tracing.trace(f, [x]).nodes]
    assert ops_seen[:3] == ["Reshape", "Transpose", "Unsqueeze"]
    assert all(a.dtype.kind == "i" for a in cg.graph.initializers.values())  # shapes/axes only, no baked data
    x2 = rng.standard_normal((4, 6)).astype(np.float32)  # new data must flow through, not a baked constant
    np.testing.assert_allclose(cg.run([x2])[0].numpy(), np.maximum(x2.reshape(2, -1).T, 0))

    def bad(x):
        return opsnn.ops.relu(x[0])

    with pytest.raises(ParamInvalidError, match="not recorded"):
        opsnn.compile(bad, [x])


def test_symbolic_dims_must_agree_across_inputs():
    g = Graph(
        "sym",
        inputs=[Value("a", np.float32, ("batch", 4)), Value("b", np.float32, ("batch", 4))],
        outputs=["c"],
        nodes=[Node("Add", ["a", "b"], ["c"])],
    )
    cg = opsnn.compile(g)
    cg.run({"a": np.ones((3, 4), np.float32), "b": np.ones((3, 4), np.float32)})
    with pytest.raises(ParamInvalidError, match="symbolic dim 'batch' is 3 in input 'a' but 1 in input 'b'"):
        cg.run({"a": np.ones((3, 4), np.float32), "b": np.ones((1, 4), np.float32)})


def test_an_output_the_model_leaves_out_still_gets_bytes(rng):
    """LSTM's Y omitted (''), only Y_h read: the kernel still sees Y in its place (it used to get
    Y_h there, a 3-D array where a 4-D one goes), and the compiled result is the interpreter's;
    then a Y_h-only read inside a larger graph, where the node's outputs are planned, not late."""
    T, B, I, H = 5, 2, 4, 3
    x = rng.standard_normal((T, B, I)).astype(np.float32)
    w = (rng.standard_normal((1, 4 * H, I)) * 0.5).astype(np.float32)
    r = (rng.standard_normal((1, 4 * H, H)) * 0.5).astype(np.float32)
    for tail in ([], [Node("Relu", ["yh"], ["out"])]):
        g = Graph(
            "lstm",
            inputs=[Value("x", np.float32, (T, B, I))],
            outputs=["out" if tail else "yh"],
            nodes=[Node("LSTM", ["x", "w", "r"], ["", "yh"], {"hidden_size": H}), *tail],
            initializers={"w": w, "r": r},
        )
        want = opsnn.graph.interpreter.run(g, {"x": x})
        cg = opsnn.compile(g)
        got = cg.run({"x": x})
        assert cg.mode == "compiled"
        name = g.output_names[0]
        np.testing.assert_allclose(_np(got[name]), want[name], rtol=1e-5, atol=1e-6)


def test_sequence_and_optional_inputs_run_interpreted_and_stay_sequences():
    g = Graph(
        "seq",
        inputs=[
            Value("s", kind="sequence", elem=Value("", np.float32)),
            Value("o", kind="optional", elem=Value("", np.float32)),
        ],
        outputs=["n", "s2", "has"],
        nodes=[
            Node("SequenceLength", ["s"], ["n"]),
            Node("Identity", ["s"], ["s2"]),
            Node("OptionalHasElement", ["o"], ["has"]),
        ],
    )
    cg = opsnn.compile(g)
    a, b = np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32)
    got = cg.run({"s": [a, b], "o": None})
    assert cg.mode == "interpreted" and "'s' is a sequence" in cg.mode_reason
    assert int(_np(got["n"])) == 2 and not bool(_np(got["has"]))
    assert isinstance(got["s2"], list) and len(got["s2"]) == 2  # not stacked into one (2, 2, 3) tensor
    np.testing.assert_array_equal(_np(got["s2"][1]), b)
    got = cg.run({"s": [a]})  # an optional input may be left out
    assert int(_np(got["n"])) == 1 and not bool(_np(got["has"]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_bn_folding_scales_each_output_channel_in_float64(rng, dtype):
    """The folded weight is numpy's float64 product rounded once, bit for bit (the numba pass
    for float32/float64, numpy's own for other dtypes), for conv and 1-D weights."""
    from opsnn.kernels.cpu.norm import scale_rows

    for shape in [(64, 3, 7, 7), (5, 2, 1), (7,)]:
        w = (rng.standard_normal(shape) * 3).astype(dtype)
        factor = rng.standard_normal(shape[0]) * 1e-2 + 1.0
        want = (w.astype(np.float64) * factor.reshape((-1,) + (1,) * (w.ndim - 1))).astype(dtype)
        got = scale_rows(w, factor)
        assert got.dtype == w.dtype and got.shape == w.shape
        np.testing.assert_array_equal(got, want)
    strided = np.asarray(rng.standard_normal((8, 4, 3, 3)), dtype)[:, ::2]  # a non-contiguous weight view
    f = rng.standard_normal(8)
    np.testing.assert_array_equal(
        scale_rows(strided, f), (strided.astype(np.float64) * f.reshape(-1, 1, 1, 1)).astype(dtype)
    )


def test_resident_bytes_counts_each_buffer_once_and_not_the_initializers():
    """A plan holding an aligned buffer and its view counts the buffer once; a plan holding a view
    of an initializer adds nothing (that memory is the graph's weights)."""
    from types import SimpleNamespace as NS

    from opsnn.graph.compiler import resident_bytes

    w = np.ones((8, 4), np.float32)
    raw = np.empty(40, np.float32)
    packed = NS(weight=raw[4:36], _raw=raw)
    steps = [
        NS(executor=NS(plan=packed)),
        NS(executor=NS(plan={"w": w.reshape(4, 8)[:2]})),
        NS(executor=NS(plan=[np.zeros(3, np.uint16), raw[:8]])),
    ]
    assert resident_bytes({"w": w}, [NS(steps=steps)]) == {"float32": raw.nbytes, "uint16": 6}


def test_inspection_api_plans_input_specs_and_dropping_plans(rng):
    """plans (least recently used first), latest_plan, input_specs and drop_plans: the public view
    of what a compiled graph keeps, as explain, the tiler and the benchmarks read it."""
    g = Graph("insp", inputs=[Value("x", np.float32, ("N", 4))], outputs=["y"], nodes=[Node("Relu", ["x"], ["y"])])
    cg = opsnn.compile(g)
    assert list(cg.input_specs) == ["x"] and cg.input_specs["x"].shape == ("N", 4)
    assert cg.plans == [] and cg.latest_plan is None and cg.resident_bytes() == {}
    x2, x3 = rng.standard_normal((2, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    cg.run({"x": x2})
    cg.run({"x": x3})
    assert len(cg.plans) == 2 and cg.latest_plan is cg.plans[-1]
    assert [st.node.op_type for st in cg.latest_plan.steps] == ["Relu"]
    first = cg.plans[0]
    cg.run({"x": x2})  # x2's plan becomes the most recent
    assert cg.latest_plan is first and cg.plans[0] is not first
    assert cg.drop_plans({"x": (3, 4)}) == 1 and cg.plans == [first]
    assert cg.drop_plans({"x": (7, 4)}) == 0
    np.testing.assert_array_equal(cg.run({"x": x3})["y"].numpy(), np.maximum(x3, 0))  # planned again
    assert cg.num_plans == 2


def _long_chains_graph(k, rng):
    """k of each shape a pass might handle one at a time: MatMul -> Relu pairs (epilogue fusion),
    Identities (no-op elimination), Transposes (cancellation), duplicated Negs (CSE), a dead chain."""
    nodes, t = [], "x"
    for i in range(k):
        nodes += [Node("MatMul", [t, "w"], [f"mm{i}"]), Node("Relu", [f"mm{i}"], [f"r{i}"])]
        t = f"r{i}"
    for i in range(k):
        nodes.append(Node("Identity", [t], [f"id{i}"]))
        t = f"id{i}"
    for i in range(2 * k):
        nodes.append(Node("Transpose", [t], [f"tr{i}"], {"perm": [1, 0]}))
        t = f"tr{i}"
    for i in range(k):
        nodes += [
            Node("Neg", [t], [f"na{i}"]),
            Node("Neg", [t], [f"nb{i}"]),
            Node("Add", [f"na{i}", f"nb{i}"], [f"s{i}"]),
        ]
        t = f"s{i}"
    d = "x"
    for i in range(k):
        nodes.append(Node("Exp", [d], [f"dead{i}"]))
        d = f"dead{i}"
    w = (rng.standard_normal((8, 8)) * 0.3).astype(np.float32)
    return (
        Graph(f"chains{k}", inputs=[Value("x", np.float32, (8, 8))], outputs=[t], nodes=nodes, initializers={"w": w}),
        w,
        t,
    )


def test_pass_cost_does_not_grow_with_the_number_of_rewrites(rng, monkeypatch):
    """Each whole-graph scan (producers/consumers maps, name collection, validation, walks, matcher
    builds) happens a fixed number of times per compile, however many rewrites the passes make:
    K rewrites of an N-node graph cost O(N + K), not O(N * K) (1,000 MatMul -> Relu pairs took
    minutes in epilogue fusion alone when each rewrite rebuilt them)."""
    from opsnn.graph import ir, pattern

    def count_calls(k):
        calls: dict = {}

        def counting(fn, key):
            def counted(*a, **kw):
                calls[key] = calls.get(key, 0) + 1
                return fn(*a, **kw)

            return counted

        for cls, name in (
            (ir.Graph, "walk"),
            (ir.Graph, "producers"),
            (ir.Graph, "consumers"),
            (ir.Graph, "_names"),
            (ir.Graph, "validate"),
            (pattern.Matcher, "__init__"),
        ):
            monkeypatch.setattr(cls, name, counting(getattr(cls, name), f"{cls.__name__}.{name}"))
        g, w, out = _long_chains_graph(k, rng)
        cg = opsnn.compile(g)
        monkeypatch.undo()
        x = rng.standard_normal((8, 8)).astype(np.float32)
        want = x.astype(np.float64)
        for _ in range(k):
            want = np.maximum(want @ w, 0)
        want = want * (-2.0) ** k
        np.testing.assert_allclose(cg.run({"x": x})[out].numpy(), want, rtol=1e-4, atol=1e-5)
        kinds = [n.op_type for n in cg.graph.nodes]
        assert kinds.count("FusedMatMul") == k and not {"Identity", "Transpose", "Exp", "Neg"} & set(kinds)
        return calls

    small, large = count_calls(8), count_calls(24)
    assert small == large, (small, large)


def test_long_relu_chain_compiles_and_runs_in_a_subprocess():
    """A hard bound on the whole path (passes, fused kernels, memory plan): 5,000 Relus in a row
    compile and run well inside a generous limit (a killed process fails the test, not the run)."""
    import os
    import subprocess

    script = (
        "import numpy as np, opsnn\n"
        "from opsnn.graph import Graph, Node, Value\n"
        "n = 5000\n"
        "g = Graph('relus', inputs=[Value('v0', np.float32, (4, 8))], outputs=[f'v{n}'],\n"
        "          nodes=[Node('Relu', [f'v{i}'], [f'v{i + 1}']) for i in range(n)])\n"
        "cg = opsnn.compile(g)\n"
        "x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)\n"
        "np.testing.assert_array_equal(cg.run({'v0': x})[f'v{n}'].numpy(), np.maximum(x, 0))\n"
        "print(len(cg.graph.nodes))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240, env=dict(os.environ), check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    from opsnn.graph.elementwise_fusion import MAX_FUSED_OPS

    assert int(proc.stdout.split()[-1]) == -(-5000 // MAX_FUSED_OPS)


def _one_node(op, inputs, attrs, inits, x_shape=(2, 3), name="user_node", then_relu=False):
    nodes = [Node(op, ["x"] + inputs, ["y" if not then_relu else "c"], attrs, name=name)]
    if then_relu:
        nodes.append(Node("Relu", ["c"], ["y"], name="act"))
    return Graph("g", inputs=[Value("x", np.float32, x_shape)], outputs=["y"], initializers=inits, nodes=nodes)


def test_compile_checks_attributes_against_the_users_node(rng):
    """Attribute mistakes surface at compile, as typed errors naming the user's node, not at the
    first run as a KernelError wrapping a ValueError, nor against the fused op the node became."""
    w = rng.standard_normal((3, 4)).astype(np.float32)
    with pytest.raises(ParamInvalidError, match=r"node 'user_node' \(Gemm\): attribute 'alpha' must be a float.*'big'"):
        opsnn.compile(_one_node("Gemm", ["w"], {"alpha": "big"}, {"w": w}))
    cw = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    with pytest.raises(ParamInvalidError, match=r"node 'user_node' \(Conv\): unknown attribute 'kerlel_shape'") as exc:
        opsnn.compile(_one_node("Conv", ["w"], {"kerlel_shape": [3, 3]}, {"w": cw}, (1, 3, 8, 8), then_relu=True))
    assert "Fused" not in str(exc.value)
    with pytest.raises(ParamInvalidError, match=r"\(Conv\): attribute 'group' must be an int, got 2.5"):
        opsnn.compile(_one_node("Conv", ["w"], {"group": 2.5}, {"w": cw}, (1, 3, 8, 8)))
    with pytest.raises(ParamInvalidError, match=r"\(Conv\): attribute 'strides' must be a list of ints"):
        opsnn.compile(_one_node("Conv", ["w"], {"strides": "a"}, {"w": cw}, (1, 3, 8, 8)))
    # a node inside a control-flow body is checked too (its attributes; its shapes vary per iteration)
    then = Graph("then", outputs=["a"], nodes=[Node("LeakyRelu", ["x"], ["a"], {"alpha": "big"}, name="inner")])
    other = Graph("else", outputs=["b"], nodes=[Node("Neg", ["x"], ["b"])])
    g = Graph(
        "g",
        inputs=[Value("x", np.float32, (2,)), Value("c", np.bool_, ())],
        outputs=["y"],
        nodes=[Node("If", ["c"], ["y"], {"then_branch": then, "else_branch": other})],
    )
    with pytest.raises(ParamInvalidError, match=r"node 'inner' \(LeakyRelu\): attribute 'alpha'"):
        opsnn.compile(g)
    # numpy scalars, tuples, arrays and integral floats are what builders pass: accepted
    g = _one_node(
        "Conv",
        ["w"],
        {"group": np.int64(1), "strides": (1, 1), "pads": np.array([1, 1, 1, 1]), "dilations": [1.0, 1.0]},
        {"w": cw},
        (1, 3, 8, 8),
    )
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    want = opsnn.ops.conv2d(x, cw, padding=1, algo="reference").numpy()
    np.testing.assert_allclose(opsnn.compile(g).run({"x": x})["y"].numpy(), want, rtol=1e-4, atol=1e-4)


def test_compile_checks_shapes_where_they_are_known(rng):
    w = rng.standard_normal((3, 4)).astype(np.float32)
    g = _one_node("Gemm", ["w", "c"], {}, {"w": w, "c": np.zeros((0,), np.float32)})
    with pytest.raises(InferShapeError, match=r"node 'user_node' \(Gemm\): C of shape \(0,\) is not .*broadcastable"):
        opsnn.compile(g)
    g = _one_node("Gemm", ["w"], {"alpha": 2}, {"w": w})
    x = rng.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(
        opsnn.compile(g).run({"x": x})["y"].numpy(), 2 * x.astype(np.float64) @ w, rtol=1e-5, atol=1e-5
    )
    # a symbolic batch leaves the shape check to plan time, which still names the node
    g = Graph(
        "g",
        inputs=[Value("x", np.float32, ("N", 3))],
        outputs=["y"],
        initializers={"w": w, "c": np.zeros((0,), np.float32)},
        nodes=[Node("Gemm", ["x", "w", "c"], ["y"], name="gm")],
    )
    cg = opsnn.compile(g)
    with pytest.raises(InferShapeError, match=r"node gm \(Gemm\)"):
        cg.run({"x": x})


@pytest.mark.parametrize("bad", [[-2147483648, 1, 0], [0, 1], [0, 1, 2, 3], [0, 0, 1]])
def test_transpose_cancellation_refuses_a_perm_that_is_not_a_permutation(rng, bad):
    # an edited perm behind a symbolic batch (fuzz onnx_mutate 30235): the pass indexed p with q (an
    # IndexError); it must leave the pair alone, so the node's own check names it at plan time
    g = Graph(
        "g",
        inputs=[Value("x", np.float32, ("N", 4, 2))],
        outputs=["y"],
        nodes=[
            Node("Transpose", ["x"], ["t"], {"perm": [2, 1, 0]}, name="tr_a"),
            Node("Transpose", ["t"], ["u"], {"perm": bad}, name="tr_b"),
            Node("Relu", ["u"], ["y"], name="relu"),
        ],
    )
    cg = opsnn.compile(g)
    assert any("tr_b: perms" in r for p in cg.pass_report.results for r in p.refused), cg.pass_report
    with pytest.raises(ParamInvalidError, match=r"node tr_b \(Transpose\).*not a permutation"):
        cg.run({"x": rng.standard_normal((2, 4, 2)).astype(np.float32)})


def test_deep_symbolic_dims_stay_small(tmp_path):
    """Symbolic inference through 40 strided pools, and an expression nesting 40 opaque terms:
    nested floors fold into one term, and a dim's symbols are found visiting each term once (it
    took 2**depth steps: 20 strided pools ran for 12 s, 30 for hours). Run in a subprocess with a
    time limit so that a regression fails instead of hanging the test run."""
    import subprocess

    script = (
        "import numpy as np\n"
        "from opsnn.graph import Graph, Node, Value\n"
        "from opsnn.graph.shape_inference import infer_types\n"
        "from opsnn.graph.symbolic import Sym, sym_max\n"
        "for pads in (0, 1):\n"
        "    n = 40\n"
        "    attrs = {'kernel_shape': [3, 3], 'strides': [2, 2], 'pads': [pads] * 4}\n"
        "    g = Graph('pools', inputs=[Value('v0', np.float32, (1, 1, 'H', 'W'))], outputs=[f'v{n}'],\n"
        "              nodes=[Node('MaxPool', [f'v{i}'], [f'v{i + 1}'], attrs) for i in range(n)])\n"
        "    dim = infer_types(g)[f'v{n}'].shape[2]\n"
        "    assert len(str(dim)) < 120, str(dim)[:200]\n"
        "    for h in (3, 7, 1000, 10 ** 13, 3 * 10 ** 12 + 17):\n"
        "        want = h\n"
        "        for _ in range(n):\n"
        "            want = (want + 2 * pads - 3) // 2 + 1\n"
        "        assert dim.evaluate({'H': h}) == want, (pads, h)\n"
        "e = Sym('A')\n"
        "for i in range(40):\n"
        "    e = sym_max(e, Sym(f'B{i}')) + 1\n"
        "assert e.atoms() == {'A'} | {f'B{i}' for i in range(40)}\n"
        "assert e.evaluate({'A': 5, **{f'B{i}': i for i in range(40)}}) == 45\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_absent_variadic_input_is_refused_not_run():
    """Max(x, "") in a graph (and Max(x, None) eagerly): an absent input of a variadic op is a typed
    error naming the node, not a KernelError wrapping the kernel's IndexError (found by tests/fuzz)."""
    from opsnn.errors import ParamNullptrError

    g = Graph(
        "g",
        inputs=[Value("x", np.float32, (2, 3))],
        outputs=["y"],
        nodes=[Node("Max", ["x", ""], ["m"]), Node("Relu", ["m"], ["y"])],
    )
    with pytest.raises(ParamNullptrError, match=r"node Max_\d+ \(Max\)"):
        opsnn.compile(g).run({"x": np.ones((2, 3), np.float32)})
    with pytest.raises(ParamNullptrError, match="Max"):
        opsnn.ops.run_op("Max", [np.ones(3, np.float32), None])
    # absent optional inputs are still dropped
    np.testing.assert_array_equal(
        opsnn.ops.run_op("Clip", [np.full(3, 2, np.float32), None, None])[0].numpy(), np.full(3, 2, np.float32)
    )


def test_a_static_shape_value_gives_its_readers_static_shapes():
    """Shape of a static value is known at inference: a Slice reading it as its ends (a traced
    model's ``position_ids[:, :seq]``) gets a static shape, and so does everything downstream (the
    passes that need shapes then apply to a compiled training step). A symbolic shape stays unknown."""
    from opsnn.graph.shape_inference import infer_types

    consts = {
        "table": np.arange(64, dtype=np.int64).reshape(1, 64),
        "zero": np.array([0], np.int64),
        "one": np.array([1], np.int64),
    }
    for dims, want in (((4, 16), (1, 16)), (("batch", "seq"), None)):
        g = Graph(
            "pos",
            inputs=[Value("ids", np.int64, dims)],
            outputs=["pos"],
            nodes=[
                Node("Shape", ["ids"], ["s"], {"start": 1, "end": 2}),
                Node("Slice", ["table", "zero", "s", "one"], ["pos"]),
            ],
            initializers=consts,
        )
        metas = infer_types(g)
        if want is None:
            assert "pos" not in metas or None in metas["pos"].shape
        else:
            assert tuple(metas["pos"].shape) == want
