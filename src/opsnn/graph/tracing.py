"""Tracing: record eager op calls into a :class:`Graph` (``opsnn.compile(fn, example_inputs)``).

Tensors created outside the traced function (weights) become initializers; the function's
arguments become graph inputs, with ``dynamic_dims`` naming the dims that may change::

    g = trace(lambda x: opsnn.ops.relu(x), [x], dynamic_dims={0: {0: "batch"}})
"""

from __future__ import annotations

import inspect

import numpy as np

from ..errors import ParamInvalidError
from ..ops import executor as _ex
from ..tensor import Tensor, as_tensor
from .ir import Graph, Node, Value


class Tracer:
    def __init__(self):
        self.names: dict = {}
        self.keep: list = []  # tensors seen, kept alive so their ids stay unique while tracing
        self.nodes: list[Node] = []
        self.initializers: dict = {}
        self._n = 0

    def name_of(self, t: Tensor) -> str:
        name = self.names.get(id(t))
        if name is None:  # a tensor from outside the function: a constant of the graph
            name = f"const_{len(self.initializers)}"
            self.initializers[name] = np.array(t.numpy())
            self.names[id(t)] = name
            self.keep.append(t)
        return name

    def record(self, rec, tensors, attrs, num_outputs, result) -> None:
        ins = [self.name_of(t) if t is not None else "" for t in tensors]
        outs = result if isinstance(result, tuple) else (result,)
        names = []
        for t in outs:
            self._n += 1
            name = f"{rec.name.lower()}_{self._n}"
            self.names[id(t)] = name
            self.keep.append(t)
            names.append(name)
        self.nodes.append(Node(rec.name, ins, names, dict(attrs), domain=rec.domain))


def trace(fn, example_inputs, dynamic_dims=None, name: str | None = None) -> Graph:
    """Run ``fn(*example_inputs)`` eagerly, recording every op call into a graph."""
    if _ex._tracer is not None:
        raise ParamInvalidError("trace: tracing is already active (nested compile of a traced function)")
    inputs = [as_tensor(x) for x in example_inputs]
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    in_names = [params[i] if i < len(params) else f"input_{i}" for i in range(len(inputs))]
    dyn = dynamic_dims or {}
    tracer = Tracer()
    graph_inputs = []
    for i, (n, t) in enumerate(zip(in_names, inputs)):
        dims = dyn.get(n, dyn.get(i, {}))
        if isinstance(dims, (list, tuple)):
            dims = {d: f"{n}_dim{d}" for d in dims}
        shape = tuple(dims.get(d, s) for d, s in enumerate(t.shape))
        tracer.names[id(t)] = n
        tracer.keep.append(t)
        graph_inputs.append(Value(n, t.dtype, shape))
    _ex._tracer = tracer
    try:
        result = fn(*inputs)
    finally:
        _ex._tracer = None
    if isinstance(result, dict):
        out_items = list(result.items())
    elif isinstance(result, (tuple, list)):
        out_items = [(None, r) for r in result]
    else:
        out_items = [(None, result)]
    outputs = []
    for key, t in out_items:
        if not isinstance(t, Tensor):
            raise ParamInvalidError(f"trace: the function must return Tensors, got {type(t).__name__}")
        src = tracer.name_of(t)
        if key is not None and key != src:  # name the output as the user did
            tracer.nodes.append(Node("Identity", [src], [key]))
            src = key
        outputs.append(Value(src, t.dtype))
    return Graph(
        name or getattr(fn, "__name__", "traced"),
        inputs=graph_inputs,
        outputs=outputs,
        nodes=tracer.nodes,
        initializers=tracer.initializers,
    )
