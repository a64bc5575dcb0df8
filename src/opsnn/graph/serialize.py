"""Graph -> ONNX ModelProto (opsnn's fused ops in the ``opsnn`` domain); ``opsnn.onnx.load`` reads it back.

A compiled graph can be saved, sent to another process, reloaded with
``opsnn.onnx.load`` and opened in any ONNX viewer::

    proto = to_onnx(cg.graph); onnx.save(proto, "optimized.onnx")
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import ParamInvalidError
from .ir import Graph

OPSNN_DOMAIN_VERSION = 1


def _elem_type(dtype) -> int:
    if dtype is None:
        return onnx.TensorProto.UNDEFINED
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _value_info(v) -> onnx.ValueInfoProto:
    if v.kind != "tensor":
        return helper.make_value_info(v.name, onnx.TypeProto())
    shape = (
        None
        if v.shape is None
        else [d if isinstance(d, (int, np.integer)) else (str(d) if d is not None else None) for d in v.shape]
    )
    return helper.make_tensor_value_info(v.name, _elem_type(v.dtype), shape)


def _tensor(name: str, arr: np.ndarray) -> onnx.TensorProto:
    arr = np.asarray(arr)
    if arr.dtype == object:
        return helper.make_tensor(
            name, onnx.TensorProto.STRING, arr.shape, [s.encode() if isinstance(s, str) else s for s in arr.reshape(-1)]
        )
    return numpy_helper.from_array(arr, name)


def _attribute(key: str, value, opsets: dict):
    if value is None:
        return None
    if isinstance(value, Graph):
        return helper.make_attribute(key, _graph_proto(value, opsets))
    if isinstance(value, np.ndarray):
        return helper.make_attribute(key, _tensor("", value))
    if isinstance(value, np.dtype):
        return helper.make_attribute(key, _elem_type(value))
    if isinstance(value, (list, tuple)):
        if not value:  # no element to tell the type by: an empty ints attribute (BatchGemm's batch=())
            return helper.make_attribute(key, [], attr_type=onnx.AttributeProto.INTS)
        if isinstance(value[0], Graph):
            return helper.make_attribute(key, [_graph_proto(g, opsets) for g in value])
        if value and isinstance(value[0], np.ndarray):
            return helper.make_attribute(key, [_tensor("", a) for a in value])
        items = [x.item() if isinstance(x, np.generic) else x for x in value]
        if items and all(isinstance(x, (bool, int)) for x in items):
            return helper.make_attribute(key, [int(x) for x in items])
        if items and all(isinstance(x, (int, float)) for x in items):
            return helper.make_attribute(key, [float(x) for x in items])
        return helper.make_attribute(key, items)
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        value = int(value)
    return helper.make_attribute(key, value)


def _graph_proto(graph: Graph, opsets: dict) -> onnx.GraphProto:
    nodes = []
    for n in graph.nodes:
        if n.domain:
            opsets.setdefault(n.domain, OPSNN_DOMAIN_VERSION)
        attrs = [a for a in (_attribute(k, v, opsets) for k, v in n.attrs.items()) if a is not None]
        node = helper.make_node(n.op_type, list(n.inputs), list(n.outputs), name=n.name, domain=n.domain)
        node.attribute.extend(attrs)
        origin = getattr(n, "attrs_origin", None)
        if origin:
            node.doc_string = "fused from: " + ", ".join(origin)
        nodes.append(node)
    inits = [_tensor(k, a) for k, a in graph.initializers.items()]
    inputs = [_value_info(v) for v in graph.inputs]
    outputs = [_value_info(v) for v in graph.outputs]
    value_info = [
        _value_info(v)
        for k, v in graph.value_info.items()
        if v.dtype is not None and k not in graph.output_names and k not in graph.input_names
    ]
    return helper.make_graph(nodes, graph.name, inputs, outputs, inits, value_info=value_info)


def to_onnx(graph: Graph, opset: int | None = None) -> onnx.ModelProto:
    """Serialize ``graph`` as an ONNX model (latest ai.onnx opset unless ``opset`` is given)."""
    from .ir import Value
    from .shape_inference import infer_types

    metas = infer_types(graph)
    for i, v in enumerate(graph.outputs):  # give outputs the inferred types viewers expect
        m = metas.get(v.name)
        if v.dtype is None and m is not None:
            graph.outputs[i] = Value(
                v.name, m.dtype, tuple(None if d is None else (d if isinstance(d, int) else str(d)) for d in m.shape)
            )
    opsets = {k: v for k, v in graph.opset_imports.items()}
    opsets[""] = max(opsets.get("", 0), opset or onnx.defs.onnx_opset_version())
    gp = _graph_proto(graph, opsets)
    model = helper.make_model(
        gp, producer_name="opsnn", opset_imports=[helper.make_opsetid(d, v) for d, v in sorted(opsets.items())]
    )
    model.ir_version = min(model.ir_version, onnx.IR_VERSION)
    return model


def save(graph: Graph, path: str) -> str:
    proto = to_onnx(graph)
    try:
        onnx.save(proto, path)
    except ValueError as exc:  # > 2 GB needs external data
        raise ParamInvalidError(f"save: {exc}") from None
    return path
