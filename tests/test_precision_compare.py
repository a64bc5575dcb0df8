"""Precision compare: per-node error vs fp32, the first node over tolerance, the first NaN/Inf
and why, op types to keep in fp32; the CLI."""

import numpy as np
import pytest

import opsnn
from opsnn.graph import Graph, Node, Value
from opsnn.graph.serialize import save


def _graph(rng):
    return Graph(
        "p",
        inputs=[Value("x", np.float32, (4, 16))],
        outputs=["y"],
        initializers={"w": (rng.standard_normal((16, 16)) * 30).astype(np.float32), "k": np.array(1e-12, np.float32)},
        nodes=[
            Node("MatMul", ["x", "w"], ["h"], name="mm"),
            Node("Mul", ["h", "k"], ["small"], name="scale"),
            Node("Div", ["h", "small"], ["d"], name="div"),
            Node("Relu", ["d"], ["y"], name="relu"),
        ],
    )


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
    g = Graph(
        "ok",
        inputs=[Value("x", np.float32, (4, 16))],
        outputs=["y"],
        initializers={"w": rng.standard_normal((16, 16)).astype(np.float32)},
        nodes=[Node("MatMul", ["x", "w"], ["h"]), Node("Softmax", ["h"], ["y"], {"axis": -1})],
    )
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


def test_a_nan_row_says_nan_has_no_cosine_and_only_causes_are_kept_in_fp32(rng):
    # exp overflows float16 (x ~ 20 -> e^20 > 65504): +Inf starts at Exp; Relu and Add only inherit it
    g = Graph(
        "ovf",
        inputs=[Value("x", np.float32, (2, 8))],
        outputs=["y"],
        nodes=[
            Node("Exp", ["x"], ["e"], name="exp"),
            Node("Relu", ["e"], ["r"], name="relu"),
            Node("Sub", ["r", "r"], ["y"], name="sub"),
        ],
    )
    x = np.full((2, 8), 1.0, np.float32)
    x[0, 3] = 20.0
    rep = opsnn.tools.precision_compare(g, {"x": x}, dtype="float16")
    exp, relu, sub = rep.rows
    assert exp.nonfinite and exp.nonfinite_kinds == ("+Inf",) and exp.cause
    assert relu.nonfinite and not relu.cause  # inherited
    assert sub.nonfinite_kinds == ("NaN",)  # inf - inf
    assert all(np.isnan(r.cosine) for r in rep.rows)
    assert rep.suggest_fp32 == ["Exp"]
    text = rep.format()
    lines = {ln.split()[0]: ln for ln in text.splitlines() if ln.split() and ln.split()[0] in ("exp", "relu", "sub")}
    assert "+Inf (starts here)" in lines["exp"] and "n/a" in lines["exp"] and "1.000000" not in lines["exp"]
    assert lines["sub"].rstrip().endswith("NaN")
    assert "keep in fp32: Exp (the ops where the error starts)" in text


def test_compare_cli_takes_shapes_for_symbolic_dims(tmp_path, capsys):
    from opsnn.cli import main

    g = Graph(
        "sym",
        inputs=[Value("x", np.float32, ("N", 3, "H", "W"))],
        outputs=["y"],
        nodes=[Node("Relu", ["x"], ["y"], name="relu")],
    )
    path = save(g, str(tmp_path / "sym.onnx"))
    assert main(["compare", path, "--shape", "x=2,3,8,8"]) == 0
    assert "relu" in capsys.readouterr().out
    assert main(["compare", path]) == 2
    err = capsys.readouterr().err
    assert "symbolic dims" in err and "--shape x=N,3,H,W (sizes in place of N, H, W)" in err
    assert main(["compare", path, "--shape", "y=1,3,8,8"]) == 2
    assert "not inputs of the model" in capsys.readouterr().err
