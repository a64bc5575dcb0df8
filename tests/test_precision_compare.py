"""Precision compare: per-node error vs fp32, the first node over tolerance, the first NaN/Inf
and why, op types to keep in fp32; the CLI."""
import numpy as np
import pytest

import opsnn
from opsnn.graph import Graph, Node, Value
from opsnn.graph.serialize import save


def _graph(rng):
    return Graph("p", inputs=[Value("x", np.float32, (4, 16))], outputs=["y"],
                 initializers={"w": (rng.standard_normal((16, 16)) * 30).astype(np.float32),
                               "k": np.array(1e-12, np.float32)},
                 nodes=[Node("MatMul", ["x", "w"], ["h"], name="mm"), Node("Mul", ["h", "k"], ["small"], name="scale"),
                        Node("Div", ["h", "small"], ["d"], name="div"), Node("Relu", ["d"], ["y"], name="relu")])


def test_reports_errors_and_diagnoses_the_first_nan(rng):
    x = rng.standard_normal((4, 16)).astype(np.float32) * 10
    rep = opsnn.tools.precision_compare(_graph(rng), {"x": x}, dtype="float16")
    assert [r.node for r in rep.rows] == ["mm", "scale", "div", "relu"]
    mm = rep.rows[0]
    assert 0 < mm.max_rel < 1e-2 and mm.cosine > 0.9999  # an fp16 matmul is fine
    node, op, why = rep.first_nonfinite
    assert (node, op) == ("div", "Div") and "had zeros" in why  # 1e-6 * h underflows to 0 in fp16
    assert rep.suggest_fp32[0] in ("Div", "Mul")
    text = rep.format()
    assert "first NaN/Inf: Div at node div" in text and "keep in fp32" in text


def test_bfloat16_and_policy(rng):
    x = rng.standard_normal((4, 16)).astype(np.float32)
    g = Graph("ok", inputs=[Value("x", np.float32, (4, 16))], outputs=["y"],
              initializers={"w": rng.standard_normal((16, 16)).astype(np.float32)},
              nodes=[Node("MatMul", ["x", "w"], ["h"]), Node("Softmax", ["h"], ["y"], {"axis": -1})])
    rep = opsnn.tools.precision_compare(g, {"x": x}, dtype="bfloat16", tolerance=0.05)
    assert rep.first_nonfinite is None and rep.rows[0].max_rel < 0.05
    pol = opsnn.tools.precision_compare(g, {"x": x}, dtype={"MatMul": "float16", "Softmax": "float32"})
    assert pol.dtype.startswith("policy") and pol.rows[-1].max_rel < 1e-2
    with pytest.raises(opsnn.errors.ParamInvalidError, match="missing input"):
        opsnn.tools.precision_compare(g, {}, dtype="float16")


def test_compare_cli(rng, tmp_path, capsys):
    from opsnn.cli import main

    path = save(_graph(rng), str(tmp_path / "m.onnx"))
    assert main(["compare", path, "--dtype", "float16"]) == 0
    out = capsys.readouterr().out
    assert "precision compare: fp32 vs float16" in out and "first NaN/Inf" in out
