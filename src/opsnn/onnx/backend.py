"""The standard ONNX backend interface (``onnx.backend.base.Backend``) over opsnn.

>>> import numpy as np, onnx
>>> from onnx import helper, TensorProto
>>> from opsnn.onnx import backend
>>> m = helper.make_model(helper.make_graph(
...     [helper.make_node("Relu", ["x"], ["y"])], "g",
...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]))
>>> backend.prepare(m).run([np.array([-1.0, 2.0], np.float32)])[0]
array([0., 2.], dtype=float32)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from ..errors import ParamInvalidError
from ..graph.interpreter import Interpreter
from ..graph.ir import Graph
from . import opset as _opset
from .importer import load


class OpsnnRep(BackendRep):
    """A prepared model: the imported graph and its interpreter.

    ``run(inputs)`` takes a list (bound in order to the graph inputs that are not
    initializers), a dict by input name, or a single array; it returns the outputs as a
    tuple that can also be indexed by output name."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.interpreter = Interpreter(graph)
        self._outputs_type = namedtupledict("Outputs", graph.output_names)

    def run(self, inputs: Any, **kwargs: Any) -> tuple:
        g = self.graph
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray) or not isinstance(inputs, (list, tuple)):
                inputs = [inputs]
            if len(inputs) > len(g.inputs):
                raise ParamInvalidError(
                    f"graph {g.name!r}: got {len(inputs)} inputs, the model takes {len(g.inputs)} ({g.input_names})"
                )
            feeds = {v.name: x for v, x in zip(g.inputs, inputs)}
        res = self.interpreter.run(feeds)
        return self._outputs_type(*[res[n] for n in g.output_names])


class OpsnnBackend(Backend):
    """``onnx.backend`` entry points: ``prepare``, ``run_model``, ``run_node``, ``supports_device``."""

    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs: Any) -> bool:
        try:
            load(model, base_dir=kwargs.get("base_dir"))
        except Exception:  # noqa: BLE001 - any import failure means "not compatible"
            return False
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs: Any) -> OpsnnRep:
        """Import ``model`` (ModelProto, bytes or path) and return a runnable :class:`OpsnnRep`."""
        if not cls.supports_device(device):
            raise ParamInvalidError(f"opsnn onnx backend: device {device!r} is not supported; use 'CPU'")
        return OpsnnRep(load(model, base_dir=kwargs.get("base_dir")))

    @classmethod
    def run_model(cls, model, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU", outputs_info=None, **kwargs: Any
    ) -> tuple:
        """Run one node on ``inputs`` (list in the order of ``node.input``, or a dict)."""
        names = [n for n in node.input if n]
        if isinstance(inputs, dict):
            values = [inputs[n] for n in names]
        else:
            values = list(inputs)
            if len(values) != len(names):
                raise ParamInvalidError(f"run_node: node {node.op_type} has {len(names)} inputs, got {len(values)}")
        infos = [_value_info(n, v) for n, v in zip(names, values)]
        outs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
        version = int(kwargs.get("opset_version", _opset.MAX_OPSET))
        opsets = [helper.make_opsetid("", version)]
        if node.domain not in ("", "ai.onnx"):
            opsets.append(helper.make_opsetid(node.domain, 1))
        model = helper.make_model(helper.make_graph([node], "run_node", infos, outs), opset_imports=opsets)
        rep = cls.prepare(model, device)
        return rep.run(dict(zip(names, values)))

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            return Device(device).type == DeviceType.CPU
        except AttributeError:
            return False


def _value_info(name: str, value) -> onnx.ValueInfoProto:
    if isinstance(value, (list, tuple)):
        elem = np.asarray(value[0]) if value else np.zeros(0, np.float32)
        return helper.make_tensor_sequence_value_info(name, helper.np_dtype_to_tensor_dtype(elem.dtype), None)
    arr = np.asarray(value)
    dt = arr.dtype if arr.dtype.kind not in "U" else np.dtype(object)
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(dt), arr.shape)


prepare = OpsnnBackend.prepare
run_model = OpsnnBackend.run_model
run_node = OpsnnBackend.run_node
supports_device = OpsnnBackend.supports_device
is_compatible = OpsnnBackend.is_compatible

__all__ = ["OpsnnBackend", "OpsnnRep", "is_compatible", "prepare", "run_model", "run_node", "supports_device"]
