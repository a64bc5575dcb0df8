"""Debug views of graphs: per-node shapes, dtype flow.

>>> import opsnn  # doctest: +SKIP
>>> print(opsnn.debug.shape_inference(graph))  # doctest: +SKIP
"""

from .graph.shape_inference import format_dtype_flow, format_shapes


def shape_inference(graph, input_shapes: dict | None = None) -> str:
    """Each node's input and output shapes (symbolic dims kept symbolic)."""
    return format_shapes(graph, input_shapes)


def dtype_flow(graph) -> str:
    """Where dtypes change along the graph, and where precision is lost."""
    return format_dtype_flow(graph)


__all__ = ["dtype_flow", "shape_inference"]
