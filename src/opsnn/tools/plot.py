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


# -- line charts (a training run's loss curve) -------------------------------------------------------------
#: 3x5 glyphs for the tick labels of the built-in renderer (rows top to bottom, 3 bits each)
_GLYPHS = {
    "0": ("111", "101", "101", "101", "111"),
    "1": ("010", "110", "010", "010", "111"),
    "2": ("111", "001", "111", "100", "111"),
    "3": ("111", "001", "111", "001", "111"),
    "4": ("101", "101", "111", "001", "001"),
    "5": ("111", "100", "111", "001", "111"),
    "6": ("111", "100", "111", "101", "111"),
    "7": ("111", "001", "001", "001", "001"),
    "8": ("111", "101", "111", "101", "111"),
    "9": ("111", "101", "111", "001", "111"),
    ".": ("000", "000", "000", "000", "010"),
    "-": ("000", "000", "111", "000", "000"),
    "+": ("000", "010", "111", "010", "000"),
    "e": ("000", "111", "111", "100", "111"),
}


def plot_curve(values, path: str, *, title: str = "", xlabel: str = "step", ylabel: str = "loss", x0: int = 1) -> str:
    """Draw ``values`` (one per step, the first at ``x0``) as a line chart PNG at ``path``; returns
    the renderer used: ``"matplotlib"`` when it is installed, else ``"builtin"`` (numpy + zlib:
    axes, grid and numeric tick labels; the title and axis names go into the PNG's text chunks)."""
    import numpy as np

    y = np.asarray(values, dtype=np.float64).ravel()
    if y.size == 0:
        raise ParamInvalidError(f"plot_curve: no values to draw into {path!r}")
    if not path.lower().endswith(".png"):
        raise ParamInvalidError(f"plot_curve: {path!r}: the curve is written as PNG; name the file *.png")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ParamInvalidError(f"plot_curve: the folder {folder!r} of {path!r} does not exist; create it first")
    x = np.arange(x0, x0 + y.size)
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        _write_png(path, _raster_curve(x, y), {"Title": title, "Comment": f"x: {xlabel}, y: {ylabel}"})
        return "builtin"
    fig = Figure(figsize=(6.4, 4.0))  # no pyplot: no global backend or figure state
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(x, y, lw=1.5)
    ax.xaxis.get_major_locator().set_params(integer=True)  # steps are whole numbers
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return "matplotlib"


def _raster_curve(x, y, width: int = 640, height: int = 400):
    import numpy as np

    img = np.full((height, width, 3), 255, np.uint8)
    left, right, top, bottom = 70, width - 20, 20, height - 40
    finite = y[np.isfinite(y)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    if hi - lo < 1e-12 * max(1.0, abs(hi)):
        lo, hi = lo - 0.5, hi + 0.5
    xs = left + (x - x[0]) * (right - left) / max(1, x[-1] - x[0])
    ys = bottom - (np.where(np.isfinite(y), y, hi) - lo) * (bottom - top) / (hi - lo)
    for k in range(5):  # grid and y tick labels
        v = lo + (hi - lo) * k / 4
        r = int(round(bottom - (bottom - top) * k / 4))
        img[r, left:right] = 225
        _text(img, f"{v:.3g}", left - 6, r - 5, align="right")
    img[top:bottom, left] = img[bottom, left:right] = 0
    _text(img, str(int(x[0])), left, bottom + 8, align="left")
    _text(img, str(int(x[-1])), right, bottom + 8, align="right")
    pts = np.stack([xs, ys], 1)
    if len(pts) == 1:
        pts = np.concatenate([pts, pts])
    for (ax_, ay), (bx, by) in zip(pts[:-1], pts[1:]):
        n = int(max(abs(bx - ax_), abs(by - ay))) + 2
        cx = np.rint(np.linspace(ax_, bx, n)).astype(int)
        cy = np.rint(np.linspace(ay, by, n)).astype(int)
        for dy in (0, 1):
            img[np.clip(cy + dy, 0, height - 1), np.clip(cx, 0, width - 1)] = (31, 119, 180)
    return img


def _text(img, s: str, x: int, y: int, align: str = "left", scale: int = 2) -> None:
    w = len(s) * 4 * scale
    x0 = x - w if align == "right" else x
    for i, ch in enumerate(s):
        glyph = _GLYPHS.get(ch)
        if glyph is None:
            continue
        for r, row in enumerate(glyph):
            for c, bit in enumerate(row):
                if bit == "1":
                    yy, xx = y + r * scale, x0 + (i * 4 + c) * scale
                    if 0 <= yy and yy + scale <= img.shape[0] and 0 <= xx and xx + scale <= img.shape[1]:
                        img[yy : yy + scale, xx : xx + scale] = 0


def _write_png(path: str, img, text: dict) -> None:
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    h, w, _ = img.shape
    raw = b"".join(b"\x00" + img[r].tobytes() for r in range(h))  # filter type 0 on every row
    parts = [b"\x89PNG\r\n\x1a\n", chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))]
    for k, v in text.items():
        if v:
            parts.append(chunk(b"tEXt", k.encode("latin-1") + b"\x00" + str(v).encode("latin-1", "replace")))
    parts += [chunk(b"IDAT", zlib.compress(raw, 6)), chunk(b"IEND", b"")]
    with open(path, "wb") as f:
        f.write(b"".join(parts))
