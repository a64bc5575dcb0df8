"""The onnx.backend interface: prepare / run_model / run_node / supports_device, and ONNX's
own backend test runner driving opsnn on a few node tests (oracle: the stored expected
outputs of those tests, compared by ONNX's runner with each test's rtol/atol)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import opsnn
from opsnn.onnx import backend
from opsnn.onnx.backend import OpsnnBackend, OpsnnRep

F = TensorProto.FLOAT


def _model():
    b = numpy_helper.from_array(np.array([1.0, -1.0, 0.5], np.float32), "b")
    g = helper.make_graph(
        [
            helper.make_node("Add", ["x", "b"], ["s"]),
            helper.make_node("Relu", ["s"], ["y"]),
            helper.make_node("Neg", ["s"], ["z"]),
        ],
        "m",
        [helper.make_tensor_value_info("x", F, [2, 3])],
        [helper.make_tensor_value_info("y", F, [2, 3]), helper.make_tensor_value_info("z", F, [2, 3])],
        initializer=[b],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def test_prepare_and_run_forms(rng):
    rep = backend.prepare(_model())
    assert isinstance(rep, OpsnnRep)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    s = x + np.array([1.0, -1.0, 0.5], np.float32)
    for inputs in ([x], (x,), x, {"x": x}):
        out = rep.run(inputs)
        assert len(out) == 2
        np.testing.assert_allclose(out[0], np.maximum(s, 0), rtol=1e-6, atol=0)
        np.testing.assert_allclose(out["z"], -s, rtol=1e-6, atol=0)  # indexable by output name
    # initializers are overridable by name
    out = rep.run({"x": x, "b": np.zeros(3, np.float32)})
    np.testing.assert_allclose(out[1], -x, rtol=1e-6, atol=0)
    with pytest.raises(opsnn.errors.ParamInvalidError, match="takes 1"):
        rep.run([x, x])


def test_run_model(rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    out = backend.run_model(_model(), [x])
    np.testing.assert_allclose(out[1], -(x + np.array([1.0, -1.0, 0.5], np.float32)), rtol=1e-6, atol=0)


def test_run_node(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((4,)).astype(np.float32)
    out = backend.run_node(helper.make_node("Add", ["a", "b"], ["c"]), [a, b])
    np.testing.assert_allclose(out[0], a + b, rtol=1e-6, atol=0)
    # an old-opset node form is upgraded (Squeeze with axes attribute at opset 11)
    x = rng.standard_normal((1, 3, 1)).astype(np.float32)
    out = backend.run_node(helper.make_node("Squeeze", ["x"], ["y"], axes=[0, 2]), [x], opset_version=11)
    np.testing.assert_array_equal(out[0], x.reshape(3))
    out = backend.run_node(helper.make_node("Relu", ["x"], ["y"]), {"x": x})
    np.testing.assert_array_equal(out["y"], np.maximum(x, 0))


def test_supports_device_and_compatibility():
    assert backend.supports_device("CPU")
    assert not backend.supports_device("CUDA")
    assert not backend.supports_device("TPU")
    with pytest.raises(opsnn.errors.ParamInvalidError, match="CUDA"):
        backend.prepare(_model(), "CUDA")
    assert OpsnnBackend.is_compatible(_model())
    bad = _model()
    bad.graph.node[1].op_type = "NoSuchOp"
    assert not OpsnnBackend.is_compatible(bad)


def test_onnx_backend_test_runner_drives_opsnn():
    """ONNX's own runner (the way other runtimes are certified) on a handful of node tests."""
    import unittest
    import warnings

    import onnx.backend.test

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # ONNX's case generators warn on purpose (overflow, log(0))
        bt = onnx.backend.test.BackendTest(OpsnnBackend, __name__)
    for name in (
        "test_relu",
        "test_add_bcast",
        "test_matmul_2d",
        "test_transpose_default",
        "test_if",
        "test_loop11",
        "test_sequence_insert_at_back",
    ):
        bt.include(f"^{name}_cpu$")
    suite = unittest.TestSuite()
    for case in bt.test_cases.values():
        suite.addTests(unittest.defaultTestLoader.loadTestsFromTestCase(case))
    result = unittest.TextTestRunner(verbosity=0, stream=open("/dev/null", "w")).run(suite)
    problems = [(str(t), tb[-400:]) for t, tb in result.failures + result.errors]
    assert result.testsRun >= 7
    assert not problems, problems
