"""Graph plots: fused nodes highlighted with their origins, shapes on edges, formats, and a
clear error when Graphviz is missing."""

import shutil

import numpy as np
import pytest

import opsnn
from opsnn.graph import Graph, Node, Value
from opsnn.tools import plot


def _graph(rng):
    init = {"w": rng.standard_normal((6, 6, 3, 3)).astype(np.float32), "b": rng.standard_normal(6).astype(np.float32)}
    return Graph(
        "res",
        inputs=[Value("x", np.float32, ("N", 6, 9, 9))],
        outputs=["y"],
        initializers=init,
        nodes=[
            Node("Conv", ["x", "w", "b"], ["c"], {"pads": [1, 1, 1, 1]}),
            Node("Add", ["c", "x"], ["a"]),
            Node("Relu", ["a"], ["y"]),
        ],
    )


def test_dot_source_marks_fusions_and_shapes(rng):
    cg = opsnn.compile(_graph(rng))
    src = plot.to_dot(cg.graph).source
    assert "opsnn::FusedConv" in src and "fused: Conv_" in src and "penwidth=2.5" in src
    assert "float32[N,6,9,9]" in src


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz 'dot' not installed (make test installs it)")
@pytest.mark.parametrize("ext", ["pdf", "svg", "png"])
def test_render_formats(rng, tmp_path, ext):
    out = opsnn.plot_graph(opsnn.compile(_graph(rng)), str(tmp_path / f"g.{ext}"))
    data = open(out, "rb").read()
    assert data[:4] in (b"%PDF", b"<?xm", b"<svg", b"\x89PNG")


def test_plot_cli_on_an_onnx_file(rng, tmp_path, capsys):
    from opsnn.cli import main
    from opsnn.graph.serialize import save

    path = save(_graph(rng), str(tmp_path / "m.onnx"))
    assert main(["plot", path, "-o", str(tmp_path / "m.dot"), "--optimized"]) == 0
    assert "FusedConv" in open(tmp_path / "m.dot").read()


def test_missing_graphviz_is_a_clear_error(rng, tmp_path, monkeypatch):
    monkeypatch.setattr(plot.shutil, "which", lambda name: None)
    with pytest.raises(plot.GraphvizMissingError, match="apt-get install graphviz"):
        opsnn.plot_graph(_graph(rng), str(tmp_path / "g.pdf"))
    with pytest.raises(opsnn.errors.ParamInvalidError, match="unsupported file type"):
        opsnn.plot_graph(_graph(rng), str(tmp_path / "g.jpeg"))
