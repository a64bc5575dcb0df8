"""Graphs: the IR (Graph, Node, Value) and the interpreter that runs it op by op.

>>> import numpy as np
>>> from opsnn import graph
>>> g = graph.Graph("g", inputs=[graph.Value("x", np.float32)], outputs=["y"],
...                 nodes=[graph.Node("Relu", ["x"], ["y"])])
>>> graph.run(g, {"x": np.array([-1.0, 3.0], np.float32)})["y"]
array([0., 3.], dtype=float32)
"""

from .interpreter import BUILTINS, Interpreter, builtin, is_supported, run, supported_ops
from .ir import (
    DanglingValueError,
    DuplicateValueError,
    Graph,
    GraphCycleError,
    GraphError,
    Node,
    Value,
    free_names,
    toposort,
)

__all__ = [
    "BUILTINS",
    "DanglingValueError",
    "DuplicateValueError",
    "Graph",
    "GraphCycleError",
    "GraphError",
    "Interpreter",
    "Node",
    "Value",
    "builtin",
    "free_names",
    "is_supported",
    "run",
    "supported_ops",
    "toposort",
]
