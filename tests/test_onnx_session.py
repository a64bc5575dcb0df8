"""opsnn.InferenceSession against onnxruntime: one script written with onnxruntime's public
Python API runs with ``import onnxruntime as ort`` and with ``opsnn.onnx.ort_compat`` standing
in for it, on models built here and on ONNX's light model zoo; outputs (rtol 1e-5) and the
reported metadata must agree. Then opsnn's own promises: typed one-line errors, the options
mapped onto opsnn's passes, threads and profiler."""

import json
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import opsnn
from opsnn.errors import DTypeError, ParamInvalidError, ParamNullptrError
from opsnn.onnx import ort_compat

ort = pytest.importorskip("onnxruntime")

RTOL, ATOL = 1e-5, 1e-5


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def _model(nodes, inputs, outputs, inits=(), opset=17, check=True, **props):
    m = h.make_model(
        h.make_graph(nodes, props.pop("graph_name", "g"), inputs, outputs, list(inits)),
        opset_imports=[h.make_opsetid("", opset)],
        producer_name="opsnn-test",
        **props,
    )
    m.ir_version = 8
    if check:
        onnx.checker.check_model(m)
    return m


def mlp(rng):
    w1, b1 = rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal(32).astype(np.float32)
    w2, b2 = rng.standard_normal((32, 5)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    m = _model(
        [
            h.make_node("MatMul", ["x", "w1"], ["h0"]),
            h.make_node("Add", ["h0", "b1"], ["h1"]),
            h.make_node("Relu", ["h1"], ["h2"]),
            h.make_node("MatMul", ["h2", "w2"], ["h3"]),
            h.make_node("Add", ["h3", "b2"], ["y"]),
        ],
        [h.make_tensor_value_info("x", T.FLOAT, [3, 16])],
        [h.make_tensor_value_info("y", T.FLOAT, [3, 5])],
        [_init("w1", w1), _init("b1", b1), _init("w2", w2), _init("b2", b2)],
        graph_name="mlp",
        doc_string="a two-layer perceptron",
    )
    m.model_version = 7
    m.domain = "test.opsnn"
    h.set_model_props(m, {"author": "opsnn", "task": "session parity"})
    return m, {"x": rng.standard_normal((3, 16)).astype(np.float32)}


def conv_net(rng):
    w = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    fc = (rng.standard_normal((10, 8 * 5 * 5)) * 0.1).astype(np.float32)
    m = _model(
        [
            h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
            h.make_node("Relu", ["c"], ["r"]),
            h.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
            h.make_node("Flatten", ["p"], ["f"]),
            h.make_node("Gemm", ["f", "fc"], ["y"], transB=1),
        ],
        [h.make_tensor_value_info("x", T.FLOAT, [2, 3, 11, 11])],
        [h.make_tensor_value_info("y", T.FLOAT, [2, 10])],
        [_init("w", w), _init("b", b), _init("fc", fc)],
    )
    return m, {"x": rng.standard_normal((2, 3, 11, 11)).astype(np.float32)}


def symbolic_batch(rng):
    w = rng.standard_normal((6, 4)).astype(np.float32)
    m = _model(
        [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Softmax", ["m"], ["y"], axis=-1)],
        [h.make_tensor_value_info("x", T.FLOAT, ["batch", 6])],
        [h.make_tensor_value_info("y", T.FLOAT, ["batch", 4])],
        [_init("w", w)],
    )
    return m, {"x": rng.standard_normal((5, 6)).astype(np.float32)}


def multi_output(rng):
    m = _model(
        [
            h.make_node("Tanh", ["x"], ["t"]),
            h.make_node("ReduceMax", ["t"], ["mx"], axes=[1], keepdims=0),
            h.make_node("ArgMax", ["x"], ["idx"], axis=1, keepdims=0),
            h.make_node("Sigmoid", ["x"], ["s"]),
        ],
        [h.make_tensor_value_info("x", T.FLOAT, [None, 7])],
        [
            h.make_tensor_value_info("mx", T.FLOAT, [None]),
            h.make_tensor_value_info("idx", T.INT64, [None]),
            h.make_tensor_value_info("s", T.FLOAT, [None, 7]),
        ],
        opset=13,
    )
    return m, {"x": rng.standard_normal((4, 7)).astype(np.float32)}


def int64_input(rng):
    table = rng.standard_normal((20, 3)).astype(np.float32)
    m = _model(
        [
            h.make_node("Gather", ["table", "ids"], ["e"], axis=0),
            h.make_node("ReduceSum", ["e", "axes"], ["y"], keepdims=0),
            h.make_node("Cast", ["ids"], ["idsf"], to=T.FLOAT),
        ],
        [h.make_tensor_value_info("ids", T.INT64, ["n", "k"])],
        [h.make_tensor_value_info("y", T.FLOAT, ["n", 3]), h.make_tensor_value_info("idsf", T.FLOAT, ["n", "k"])],
        [_init("table", table), _init("axes", np.array([1], np.int64))],
    )
    return m, {"ids": rng.integers(0, 20, (4, 6)).astype(np.int64)}


MODELS = {
    "mlp": mlp,
    "conv_net": conv_net,
    "symbolic_batch": symbolic_batch,
    "multi_output": multi_output,
    "int64_input": int64_input,
}


def ort_script(ort, model_path, feeds, bindings=True):
    """What an onnxruntime user writes; nothing in it names opsnn."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
    mm = sess.get_modelmeta()
    report = {
        "inputs": [(a.name, a.shape, a.type) for a in sess.get_inputs()],
        "outputs": [(a.name, a.shape, a.type) for a in sess.get_outputs()],
        "overridable": [(a.name, a.shape, a.type) for a in sess.get_overridable_initializers()],
        "providers": sess.get_providers(),
        "available": "CPUExecutionProvider" in ort.get_available_providers(),
        "meta": (mm.producer_name, mm.graph_name, mm.domain, mm.description, mm.version, mm.custom_metadata_map),
        "level": int(sess.get_session_options().graph_optimization_level),
    }
    outs = sess.run(None, feeds)
    if not bindings:
        return {"report": report, "outs": outs}
    last = sess.get_outputs()[-1].name
    named = sess.run([last], feeds, ort.RunOptions())
    # IO binding: inputs bound from numpy, the first output preallocated, the others allocated by the run
    binding = sess.io_binding()
    for name, arr in feeds.items():
        binding.bind_cpu_input(name, arr)
    first = sess.get_outputs()[0].name
    pre = np.zeros_like(outs[0])
    binding.bind_output(first, "cpu", 0, pre.dtype, list(pre.shape), pre.ctypes.data)
    for o in sess.get_outputs()[1:]:
        binding.bind_output(o.name)
    sess.run_with_iobinding(binding)
    bound = binding.copy_outputs_to_cpu()
    bound_meta = [(v.shape(), v.data_type()) for v in binding.get_outputs()]
    # OrtValues in, an OrtValue out
    b2 = sess.io_binding()
    for name, arr in feeds.items():
        b2.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(arr))
    b2.bind_output(last)
    sess.run_with_iobinding(b2)
    via_ortvalue = b2.get_outputs()[0].numpy()
    return {
        "report": report,
        "outs": outs,
        "named": named,
        "pre": pre,
        "bound": bound,
        "bound_meta": bound_meta,
        "via_ortvalue": via_ortvalue,
    }


def _same(a, b, where, rtol=RTOL, atol=ATOL):
    assert len(a) == len(b), where
    for i, (x, y) in enumerate(zip(a, b)):
        assert np.asarray(x).dtype == np.asarray(y).dtype, (
            f"{where}[{i}]: {np.asarray(x).dtype} vs {np.asarray(y).dtype}"
        )
        np.testing.assert_allclose(
            np.asarray(y, np.float64), np.asarray(x, np.float64), rtol=rtol, atol=atol, err_msg=f"{where}[{i}]"
        )


def _compare(ref, got, rtol=RTOL, atol=ATOL):
    assert got["report"] == ref["report"]
    if "named" not in ref:
        _same(ref["outs"], got["outs"], "run(None)", rtol, atol)
        return
    assert got["bound_meta"] == ref["bound_meta"]
    _same(ref["outs"], got["outs"], "run(None)", rtol, atol)
    _same(ref["named"], got["named"], "run([last])", rtol, atol)
    _same([ref["pre"]], [got["pre"]], "preallocated output", rtol, atol)
    _same(ref["bound"], got["bound"], "copy_outputs_to_cpu", rtol, atol)
    _same([ref["via_ortvalue"]], [got["via_ortvalue"]], "OrtValue output", rtol, atol)


@pytest.mark.parametrize("name", list(MODELS))
def test_same_script_same_results(name, tmp_path, rng):
    model, feeds = MODELS[name](rng)
    path = str(tmp_path / f"{name}.onnx")
    onnx.save(model, path)
    ref = ort_script(ort, path, feeds)
    got = ort_script(ort_compat, path, feeds)
    _compare(ref, got)
    assert np.all(got["pre"] == got["outs"][0])  # the preallocated buffer was written in place


def test_bytes_and_overridable_initializers(rng):
    """A model given as bytes; an initializer listed among the graph inputs can be fed (both engines)."""
    w = rng.standard_normal((4,)).astype(np.float32)
    m = _model(
        [h.make_node("Mul", ["x", "w"], ["y"])],
        [h.make_tensor_value_info("x", T.FLOAT, [2, 4]), h.make_tensor_value_info("w", T.FLOAT, [4])],
        [h.make_tensor_value_info("y", T.FLOAT, [2, 4])],
        [_init("w", w)],
    )
    x = rng.standard_normal((2, 4)).astype(np.float32)
    w2 = np.full(4, 3.0, np.float32)
    for mod in (ort, ort_compat):
        s = mod.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        assert [(a.name, a.shape, a.type) for a in s.get_overridable_initializers()] == [("w", [4], "tensor(float)")]
        assert [a.name for a in s.get_inputs()] == ["x"]
        np.testing.assert_allclose(s.run(None, {"x": x})[0], x * w, rtol=RTOL)
        np.testing.assert_allclose(s.run(None, {"x": x, "w": w2})[0], x * w2, rtol=RTOL)


def test_unknown_dims_and_scalars_metadata(tmp_path):
    """Unknown dims are None, a missing shape is [], scalars are [] (as onnxruntime reports)."""
    z = onnx.ValueInfoProto()
    z.name, z.type.tensor_type.elem_type = "z", T.INT64
    m = _model(
        [h.make_node("Identity", ["z"], ["zo"]), h.make_node("Neg", ["s"], ["so"])],
        [z, h.make_tensor_value_info("s", T.DOUBLE, [])],
        [h.make_tensor_value_info("zo", T.INT64, None), h.make_tensor_value_info("so", T.DOUBLE, [])],
        check=False,
    )  # the checker wants a shape on graph inputs; onnxruntime does not
    path = str(tmp_path / "m.onnx")
    onnx.save(m, path)
    meta = []
    for mod in (ort, ort_compat):
        s = mod.InferenceSession(path, providers=["CPUExecutionProvider"])
        meta.append([(a.name, a.shape, a.type) for a in s.get_inputs() + s.get_outputs()])
        zo, so = s.run(None, {"z": np.arange(3), "s": np.array(2.5)})
        assert zo.tolist() == [0, 1, 2] and so == -2.5
    assert (
        meta[0]
        == meta[1]
        == [
            ("z", [], "tensor(int64)"),
            ("s", [], "tensor(double)"),
            ("zo", [], "tensor(int64)"),
            ("so", [], "tensor(double)"),
        ]
    )


def test_outputs_are_the_callers_memory(rng):
    """An output that is an input passed through, or a constant, is a copy: writing to it changes
    neither the next run nor the caller's input (onnxruntime returns new memory)."""
    m = _model(
        [h.make_node("Identity", ["x"], ["same"]), h.make_node("Identity", ["c"], ["const"])],
        [h.make_tensor_value_info("x", T.FLOAT, [3])],
        [h.make_tensor_value_info("same", T.FLOAT, [3]), h.make_tensor_value_info("const", T.FLOAT, [2])],
        [_init("c", np.array([1.0, 2.0], np.float32))],
    )
    s = opsnn.InferenceSession(m.SerializeToString())
    x = np.ones(3, np.float32)
    same, const = s.run(None, {"x": x})
    same[:] = 7
    const[:] = 7
    assert x.tolist() == [1, 1, 1]
    assert s.run(["const"], {"x": x})[0].tolist() == [1.0, 2.0]


# -- errors: the same mistakes fail on both; opsnn's say it in one typed line ----------------------------------
def test_input_errors_are_typed_one_liners(rng, tmp_path):
    model, feeds = mlp(rng)
    path = str(tmp_path / "mlp.onnx")
    onnx.save(model, path)
    x = feeds["x"]
    cases = [
        ({}, ParamNullptrError, r"missing input 'x' \(tensor\(float\), shape \[3, 16\]\)"),
        ({"x": x, "q": x}, ParamInvalidError, r"unknown input 'q'; the model's inputs are \['x'\]"),
        ({"x": x.astype(np.float64)}, DTypeError, r"input 'x' expects tensor\(float\), got tensor\(float64\)"),
        ({"x": x[None]}, ParamInvalidError, r"input 'x' expects rank 2 \[3, 16\], got rank 3 shape \(1, 3, 16\)"),
        ({"x": x[:, :5]}, ParamInvalidError, r"input 'x' expects shape \[3, 16\], got \(3, 5\) \(dim 1 must be 16"),
    ]
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    sess = opsnn.InferenceSession(path, providers=["CPUExecutionProvider"])
    for feed, err, msg in cases:
        with pytest.raises(Exception):  # noqa: B017 - onnxruntime refuses it too, with its own error types
            ref.run(None, feed)
        with pytest.raises(err, match=msg) as info:
            sess.run(None, feed)
        assert "\n" not in str(info.value)
    with pytest.raises(ParamInvalidError, match=r"unknown output name 'nope'; the model's outputs are \['y'\]"):
        sess.run(["nope"], feeds)
    with pytest.raises(
        ParamInvalidError,
        match=r"unknown execution provider 'CUDAExecutionProvider'; available: "
        r"\['CPUExecutionProvider'\]",
    ):
        opsnn.InferenceSession(path, providers=["CUDAExecutionProvider"])
    assert opsnn.InferenceSession(path, providers=[("CPUExecutionProvider", {"arena": 1})]).get_provider_options() == {
        "CPUExecutionProvider": {"arena": "1"}
    }
    with pytest.raises(ParamInvalidError, match="graph_optimization_level"):
        opsnn.SessionOptions().graph_optimization_level = 5


# -- options -----------------------------------------------------------------------------------------------------
def test_optimization_levels_map_onto_opsnn_passes(rng, tmp_path):
    """DISABLE_ALL runs no pass; ENABLE_ALL fuses (MatMul+Add+Relu epilogues); the optimized
    graph is saved by opsnn's serializer and runs to the same outputs when loaded again."""
    model, feeds = mlp(rng)
    expect = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    counts = {}
    for level in (opsnn.GraphOptimizationLevel.ORT_DISABLE_ALL, opsnn.GraphOptimizationLevel.ORT_ENABLE_ALL):
        so = opsnn.SessionOptions()
        so.graph_optimization_level = level
        so.optimized_model_filepath = str(tmp_path / f"opt{int(level)}.onnx")
        s = opsnn.InferenceSession(model.SerializeToString(), so)
        cg = s.compiled_graph
        counts[level] = len(cg.graph.nodes)
        ran = [r.name for r in cg.pass_report.results]
        assert (ran == []) if level == 0 else ("epilogue_fusion" in ran), ran
        _same(expect, s.run(None, feeds), f"level {level}")
        saved = opsnn.onnx.load(so.optimized_model_filepath)
        assert len(saved.nodes) == counts[level]
        _same(expect, [opsnn.compile(saved, level=0).run(feeds)["y"].numpy()], f"saved level {level}")
    assert counts[opsnn.GraphOptimizationLevel.ORT_DISABLE_ALL] == 5
    assert counts[opsnn.GraphOptimizationLevel.ORT_ENABLE_ALL] < 5


def test_profiling_writes_a_chrome_trace(rng, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, feeds = conv_net(rng)
    paths = {}
    for mod in (ort, ort_compat):
        so = mod.SessionOptions()
        so.enable_profiling = True
        so.profile_file_prefix = f"prof_{mod.__name__.split('.')[-1]}"
        s = mod.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        s.run(None, feeds)
        paths[mod] = s.end_profiling()
        assert os.path.isfile(paths[mod]) and os.path.basename(paths[mod]).startswith(so.profile_file_prefix)
        assert paths[mod].endswith(".json")
    with open(paths[ort_compat]) as f:
        trace = json.load(f)
    kernels = {e["name"] for e in trace["traceEvents"] if e.get("cat") == "kernel"}
    assert "Conv" in kernels or any("Conv" in k for k in kernels), kernels
    assert opsnn.InferenceSession(model.SerializeToString()).end_profiling() == ""


def test_intra_op_threads_apply_during_the_run_only(rng):
    from opsnn.runtime import hooks, threads

    model, feeds = mlp(rng)
    so = opsnn.SessionOptions()
    so.intra_op_num_threads = 1
    s = opsnn.InferenceSession(model.SerializeToString(), so)
    seen = []
    before = threads.policy.mode
    unsub = hooks.subscribe("kernel", lambda ev: seen.append(threads.policy.mode))
    try:
        s.run(None, feeds)
    finally:
        unsub()
    assert seen and set(seen) == {1}
    assert threads.policy.mode == before
    # runs on several threads at once: each result right, the setting put back after the last
    import concurrent.futures

    expect = s.run(None, feeds)[0]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda _: s.run(None, feeds)[0], range(9)))
    for r in results:
        np.testing.assert_allclose(r, expect, rtol=1e-6, atol=1e-6)
    assert threads.policy.mode == before


# -- ONNX's light model zoo --------------------------------------------------------------------------------------
def _light_dir():
    import onnx.backend.test

    return os.path.join(os.path.dirname(onnx.backend.test.__file__), "data", "light")


LIGHT = (
    sorted(f[len("light_") : -len(".onnx")] for f in os.listdir(_light_dir()) if f.endswith(".onnx"))
    if os.path.isdir(_light_dir())
    else []
)
#: the zoo's quicker models run by default; OPSNN_TEST_LIGHT_ALL=1 runs all nine (each passes)
LIGHT_DEFAULT = {"shufflenet", "resnet50", "inception_v1"}


@pytest.mark.parametrize("name", LIGHT or [pytest.param("none", marks=pytest.mark.skip("no light zoo in onnx"))])
def test_light_zoo_same_script(name):
    if name not in LIGHT_DEFAULT and os.environ.get("OPSNN_TEST_LIGHT_ALL") != "1":
        pytest.skip("large light-zoo model: set OPSNN_TEST_LIGHT_ALL=1")
    path = os.path.join(_light_dir(), f"light_{name}.onnx")
    model = onnx.load(path)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        shape = [d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim]
        n = int(np.prod(shape))
        feeds[vi.name] = (np.arange(n).reshape(shape) / n).astype(np.float32)
    ref = ort_script(ort, path, feeds, bindings=False)
    got = ort_script(ort_compat, path, feeds, bindings=False)
    # the zoo's outputs are softmax probabilities of ~1e-3 from logits of 1e9 and more: compared as
    # ONNX's own runner compares them (rtol 1e-3, atol 1e-7)
    _compare(ref, got, rtol=1e-3, atol=1e-7)


def test_log_severity_applies_while_the_session_builds(rng, caplog):
    """Severity 0 (verbose) lets opsnn's info records (each pass's changes) through while the session
    builds; the default leaves the ``opsnn`` logger as it was."""
    import logging

    model, _ = mlp(rng)
    logger = logging.getLogger("opsnn")
    before = logger.level
    opsnn.InferenceSession(model.SerializeToString())
    assert not [r for r in caplog.records if r.name.startswith("opsnn") and r.levelno == logging.INFO]
    so = opsnn.SessionOptions()
    so.log_severity_level = 0
    opsnn.InferenceSession(model.SerializeToString(), so)
    assert any(r.name.startswith("opsnn.graph") and "pass" in r.getMessage() for r in caplog.records)
    assert logger.level == before


def test_raw_pointer_inputs_ort_values_and_free_dims(rng):
    model, feeds = symbolic_batch(rng)
    x = feeds["x"]
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    s = opsnn.InferenceSession(model.SerializeToString())
    b = s.io_binding()
    b.bind_input("x", "cpu", 0, np.float32, list(x.shape), x.ctypes.data)
    b.bind_output("y")
    s.run_with_iobinding(b)
    _same([ref], b.copy_outputs_to_cpu(), "raw pointer input")
    (ov,) = s.run_with_ort_values(None, {"x": ort_compat.OrtValue.ortvalue_from_numpy(x)})
    assert ov.shape() == [5, 4] and ov.data_type() == "tensor(float)" and ov.element_type() == T.FLOAT
    _same([ref], [ov.numpy()], "run_with_ort_values")
    out = ort_compat.OrtValue.ortvalue_from_shape_and_type([5, 4], T.FLOAT)
    b.bind_ortvalue_output("y", out)
    s.run_with_iobinding(b)
    _same([ref], [out.numpy()], "bound OrtValue output")
    with pytest.raises(ParamInvalidError, match="output 'y' is bound to tensor\\(float32\\) of shape \\(2, 4\\)"):
        b.bind_ortvalue_output("y", ort_compat.OrtValue.ortvalue_from_shape_and_type([2, 4], np.float32))
        s.run_with_iobinding(b)
    so = opsnn.SessionOptions()
    so.add_free_dimension_override_by_name("batch", 5)
    fixed = opsnn.InferenceSession(model.SerializeToString(), so)
    assert fixed.get_inputs()[0].shape == [5, 6]
    with pytest.raises(ParamInvalidError, match="dim 0 must be 5, got 2"):
        fixed.run(None, {"x": x[:2]})
