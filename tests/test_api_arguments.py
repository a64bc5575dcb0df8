"""Mistyped arguments of the engine and the tools are typed errors that say what was expected:
CompiledGraph.run's inputs, allow_mix_precision's policy, precision_compare's inputs and tolerance,
a checkpoint file that is missing or not one, a tensor from ragged lists."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import opsnn
from opsnn.checkpoint import CheckpointError
from opsnn.errors import ParamInvalidError
from opsnn.tools.precision import precision_compare


def _relu_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_compiled_graph_run_takes_a_dict_or_a_sequence_in_input_order():
    cg = opsnn.compile(_relu_model())
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    for feeds in ({"x": x}, [x], (x,), {"x": x}.values()):
        out = cg.run(feeds)
        got = out["y"] if isinstance(out, dict) else out[0]
        np.testing.assert_array_equal(np.asarray(got), np.maximum(x, 0))
    for bad in (None, x, "x", 5):
        with pytest.raises(
            ParamInvalidError, match=r"graph g: inputs must be a dict \{name: array\} or a list in input order \['x'\]"
        ):
            cg.run(bad)


def test_mix_precision_policy_must_be_a_dict():
    with pytest.raises(ParamInvalidError, match=r"allow_mix_precision: expected a dict \{op type: dtype\}.* got 'yes'"):
        opsnn.config.allow_mix_precision("yes")
    opsnn.config.allow_mix_precision(None)


def test_precision_compare_arguments():
    m, x = _relu_model(), np.ones((2, 3), np.float32)
    with pytest.raises(
        ParamInvalidError, match=r"precision_compare: inputs must be a dict \{input name: array\}, got list"
    ):
        precision_compare(m, [x])
    with pytest.raises(ParamInvalidError, match="precision_compare: tolerance must be >= 0, got -1"):
        precision_compare(m, {"x": x}, tolerance=-1)


def test_checkpoint_files_that_are_missing_or_not_checkpoints(tmp_path):
    lin = opsnn.nn.Linear(2, 2)
    with pytest.raises(FileNotFoundError, match="save_checkpoint: no folder"):
        opsnn.save_checkpoint(tmp_path / "nope" / "c.safetensors", lin)
    with pytest.raises(FileNotFoundError):
        opsnn.load_checkpoint(tmp_path / "missing.safetensors", lin)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a checkpoint")
    before = lin.weight.numpy().copy()
    with pytest.raises(CheckpointError, match="load_checkpoint: .*junk.safetensors is not a safetensors checkpoint"):
        opsnn.load_checkpoint(junk, lin)
    np.testing.assert_array_equal(lin.weight.numpy(), before)
    path = opsnn.save_checkpoint(tmp_path / "ok.safetensors", lin, step=3)
    assert opsnn.load_checkpoint(path, lin)["step"] == 3


def test_a_tensor_from_ragged_lists_is_a_typed_error():
    with pytest.raises(ParamInvalidError, match="tensor: cannot build a tensor from this list: .*inhomogeneous"):
        opsnn.tensor([[1, 2], [3]])
