"""Graph plots through Graphviz: PDF, SVG or PNG, fused nodes highlighted and labelled with
the nodes they replaced, shapes and dtypes on the edges.

>>> import opsnn
>>> opsnn.plot_graph(graph, "g.pdf")  # doctest: +SKIP
"""

from __future__ import annotations

import os
import shutil

from ..errors import OpsnnRuntimeError, ParamInvalidError

FORMATS = ("pdf", "svg", "png", "dot")
_FILL = {
    "conv": "#cfe2ff",
    "matmul": "#d1e7dd",
    "norm": "#fff3cd",
    "activation": "#f8d7da",
    "attention": "#e2d9f3",
    "pool": "#d3f4ff",
    "shape": "#eeeeee",
    "elementwise": "#ffe5d0",
}


class GraphvizMissingError(OpsnnRuntimeError):
    """Graphviz (the ``dot`` program or the ``graphviz`` Python package) is not installed."""


def _fmt_dim(d) -> str:
    return "?" if d is None else str(d)


def to_dot(graph, input_shapes: dict | None = None):
    """The graph as a ``graphviz.Digraph`` (needs only the Python package)."""
    try:
        import graphviz
    except ImportError:
        raise GraphvizMissingError(
            "plot_graph: the Python package 'graphviz' is missing; pip install graphviz "
            "(and the Debian package graphviz for the 'dot' program)"
        ) from None
    from ..graph.shape_inference import infer_types
    from ..ops.registry import get_op, has_op

    metas = infer_types(graph, input_shapes)
    dot = graphviz.Digraph(
        graph.name,
        graph_attr={"rankdir": "TB", "fontname": "Helvetica"},
        node_attr={"shape": "box", "style": "rounded,filled", "fontname": "Helvetica", "fontsize": "10"},
        edge_attr={"fontname": "Helvetica", "fontsize": "8"},
    )
    producers = {}
    for k, v in enumerate(graph.inputs):  # ids avoid ':' (Graphviz reads it as a port)
        if v.name in graph.initializers:
            continue
        dot.node(f"in{k}", f"input\n{v.name}", shape="ellipse", fillcolor="#ffffff")
        producers[v.name] = f"in{k}"
    for i, n in enumerate(graph.nodes):
        nid = f"n{i}"
        cat = get_op(n.op_type, n.domain).category if has_op(n.op_type, n.domain) else "misc"
        label = f"{n.qualified_type}\n{n.name}"
        origin = getattr(n, "attrs_origin", None)
        attrs = {"fillcolor": _FILL.get(cat, "#ffffff")}
        if origin:
            label += "\nfused: " + ", ".join(origin[:6]) + (" ..." if len(origin) > 6 else "")
            attrs.update(fillcolor="#ffd966", penwidth="2.5", color="#b45f06")
        dot.node(nid, label, **attrs)
        for o in n.outputs:
            if o:
                producers[o] = nid
    for i, n in enumerate(graph.nodes):
        for v in n.inputs:
            if not v or v in graph.initializers:
                continue
            src = producers.get(v)
            if src is None:
                continue
            m = metas.get(v)
            label = "" if m is None else f"{m.dtype}[{','.join(_fmt_dim(d) for d in m.shape)}]"
            dot.edge(src, f"n{i}", label=label)
    for k, v in enumerate(graph.outputs):
        dot.node(f"out{k}", f"output\n{v.name}", shape="ellipse", fillcolor="#ffffff")
        if v.name in producers:
            m = metas.get(v.name)
            label = "" if m is None else f"{m.dtype}[{','.join(_fmt_dim(d) for d in m.shape)}]"
            dot.edge(producers[v.name], f"out{k}", label=label)
    return dot


def plot_graph(graph, path: str, input_shapes: dict | None = None) -> str:
    """Render ``graph`` (a Graph, CompiledGraph, ONNX path or ModelProto) to ``path``; the
    format comes from the extension (.pdf, .svg, .png, .dot)."""
    from ..graph.compiler import CompiledGraph
    from ..graph.ir import Graph

    if isinstance(graph, CompiledGraph):
        graph = graph.graph
    elif not isinstance(graph, Graph):
        from .. import onnx as _onnx

        graph = _onnx.load(graph)
    fmt = os.path.splitext(path)[1].lstrip(".").lower()
    if fmt not in FORMATS:
        raise ParamInvalidError(f"plot_graph: unsupported file type {fmt!r} for {path!r}; use one of {FORMATS}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):  # graphviz would create it: a typo in the path should not make folders
        raise ParamInvalidError(f"plot_graph: the folder {folder!r} of {path!r} does not exist; create it first")
    dot = to_dot(graph, input_shapes)
    if fmt == "dot":
        with open(path, "w") as f:
            f.write(dot.source)
        return path
    if shutil.which("dot") is None:
        raise GraphvizMissingError(
            "plot_graph: Graphviz's 'dot' program is not installed; install the Debian "
            "package graphviz (apt-get install graphviz), or write a .dot file instead"
        )
    base, _ = os.path.splitext(path)
    out = dot.render(filename=os.path.basename(base), directory=folder, format=fmt, cleanup=True)
    return out
