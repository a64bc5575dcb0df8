"""The conformance harness, and ONNX's whole node suite + light model zoo through opsnn.

Oracle: each ONNX case's stored expected outputs, compared with the case's rtol/atol
(float64, NaN == NaN, exact shapes and dtypes). The pass count may only go up: raise
NODE_PASS_FLOOR when more cases pass, never lower it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper

from opsnn.onnx import conformance as C

#: measured pass count minus a small margin; raise it as ops improve, never lower it
NODE_PASS_FLOOR = 1860
LIGHT_PASS_FLOOR = 9


# -- comparing -------------------------------------------------------------------------------------------
def test_compare_tolerances_nan_inf_shapes_dtypes():
    e = np.array([1.0, np.nan, np.inf, -np.inf, 0.0], np.float32)
    assert C.compare(e, e.copy(), 1e-3, 1e-7) is None
    near, far = e.copy(), e.copy()
    near[0], far[0] = 1.0 + 1e-5, 1.0 + 1e-2
    assert C.compare(e, near, 1e-3, 1e-7) is None  # within rtol (1e-3 at 1.0)
    assert "outside" in C.compare(e, far, 1e-3, 1e-7)
    assert "outside" in C.compare(e, np.array([1, 0, np.inf, -np.inf, 0], np.float32), 1e-3, 1e-7)  # NaN lost
    assert "outside" in C.compare(e, np.array([1, np.nan, -np.inf, -np.inf, 0], np.float32), 1e-3, 1e-7)
    assert "shape" in C.compare(e, e.reshape(5, 1), 1e-3, 1e-7)
    assert "dtype" in C.compare(e, e.astype(np.float64), 1e-3, 1e-7)
    assert C.compare(np.array(["a", "b"], object), np.array(["a", "b"], object), 0, 0) is None
    assert "differ" in C.compare(np.array(["a", "b"], object), np.array(["a", "c"], object), 0, 0)


def test_compare_sequences_and_optionals():
    a = [np.ones(2, np.float32), np.zeros(3, np.int64)]
    assert C.compare(a, [x.copy() for x in a], 1e-3, 0) is None
    assert "sequence of 2" in C.compare(a, a[:1], 1e-3, 0)
    assert "[1]" in C.compare(a, [a[0], np.ones(3, np.int64)], 1e-3, 0)
    assert C.compare(None, None, 0, 0) is None
    assert "empty optional" in C.compare(None, a[0], 0, 0)
    assert "2 outputs" in C.compare_outputs([a[0]], [a[0], a[0]], 0, 0)


# -- isolation: one bad case never stops the run ------------------------------------------------------
def _case(name, nodes, inputs, outputs, feeds, expected, op="X"):
    g = helper.make_graph(nodes, name, inputs, outputs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    return C.Case(name, m, feeds, expected, 1e-5, 1e-6, "node", op)


def test_run_isolates_timeouts_errors_and_unsupported():
    vi = helper.make_tensor_value_info
    x = np.array([-1.0, 2.0], np.float32)
    ok = _case(
        "ok",
        [helper.make_node("Relu", ["x"], ["y"])],
        [vi("x", TensorProto.FLOAT, [2])],
        [vi("y", TensorProto.FLOAT, [2])],
        [x],
        [np.maximum(x, 0)],
        "Relu",
    )
    wrong = _case(
        "wrong",
        [helper.make_node("Relu", ["x"], ["y"])],
        [vi("x", TensorProto.FLOAT, [2])],
        [vi("y", TensorProto.FLOAT, [2])],
        [x],
        [x],
        "Relu",
    )
    unsup = _case(
        "unsup",
        [helper.make_node("NoSuchOp", ["x"], ["y"])],
        [vi("x", TensorProto.FLOAT, [2])],
        [vi("y", TensorProto.FLOAT, [2])],
        [x],
        [x],
        "NoSuchOp",
    )
    raises = _case(
        "raises",
        [helper.make_node("MatMul", ["x", "x2"], ["y"])],
        [vi("x", TensorProto.FLOAT, [2]), vi("x2", TensorProto.FLOAT, [3])],
        [vi("y", TensorProto.FLOAT, None)],
        [x, np.ones(3, np.float32)],
        [x],
        "MatMul",
    )
    # a Loop with neither trip count nor a false condition: runs until the time limit
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]), helper.make_node("Identity", ["i"], ["i_out"])],
        "body",
        [vi("i", TensorProto.INT64, []), vi("c", TensorProto.BOOL, [])],
        [vi("c_out", TensorProto.BOOL, []), vi("i_out", TensorProto.INT64, [])],
    )

    def loop(name, trips):
        return _case(
            name,
            [helper.make_node("Loop", [trips, "cond"], ["iters"], body=body), helper.make_node("Relu", ["x"], ["y"])],
            [vi("M", TensorProto.INT64, []), vi("cond", TensorProto.BOOL, []), vi("x", TensorProto.FLOAT, [2])],
            [vi("y", TensorProto.FLOAT, [2])],
            [np.array(3), np.array(True), x],
            [np.maximum(x, 0)],
            "Loop",
        )

    warm = C.run([ok, loop("warm", "M")], timeout=120.0, progress=False)  # kernels compiled before timing
    assert [r.status for r in warm.results] == ["pass", "pass"], warm.results
    forever = loop("forever", "")  # no trip count, condition never false: runs until the time limit
    report = C.run([ok, forever, wrong, unsup, raises, ok], timeout=1.0, progress=False)
    status = {r.name: (r.status, r.reason) for r in report.results}
    assert [r.status for r in report.results] == ["pass", "fail", "fail", "unsupported", "fail", "pass"]
    assert "timed out" in status["forever"][1]
    assert "outside" in status["wrong"][1]
    assert "NoSuchOp" in status["unsup"][1]
    assert status["raises"][1]
    assert report.totals() == {"pass": 2, "fail": 3, "unsupported": 1, "total": 6}
    data = report.to_json()
    assert {f["case"] for f in data["failures"]} == {"forever", "wrong", "unsup", "raises"}
    assert all(f["reason"] for f in data["failures"])
    assert data["by_op"]["Relu"] == {"pass": 2, "fail": 1, "unsupported": 0, "total": 3}


def test_main_cli_filter_report_peer_and_min_pass(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = C.main(
        [
            "--suite",
            "node",
            "--filter",
            "^test_(relu|abs)$",
            "--report",
            str(out),
            "--no-progress",
            "--peer",
            "onnxruntime",
            "--baseline",
            str(tmp_path),
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0
    assert "TOTAL" in text and "peer pass" in text and "node cases:  2 pass" in text
    data = json.loads(out.read_text())
    assert data["totals"] == {"pass": 2, "fail": 0, "unsupported": 0, "total": 2}
    assert data["peer_cases"] == {"test_abs": "pass", "test_relu": "pass"}
    assert C.main(["--suite", "node", "--filter", "^test_relu$", "--report", "-", "--min-pass", "5"]) == 1
    assert C.main(["--suite", "node", "--filter", "^no_such_case$", "--report", "-"]) == 2


def test_baseline_comparison_lists_cases_ahead(tmp_path):
    (tmp_path / "onnxruntime-node-cases.json").write_text(json.dumps({"cases": {"a": "fail", "b": "pass"}}))
    base = C.load_baseline(tmp_path)
    report = C.Report([C.Result("a", "X", "pass"), C.Result("b", "X", "fail")], baseline=base)
    assert report.ahead() == ["a"] and report.behind() == ["b"]
    assert C.load_baseline(tmp_path / "nowhere") == {}


# -- the suites -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def node_report():
    return C.run(C.node_cases(), timeout=60.0, progress=False)


def test_node_suite_pass_floor(node_report):
    t = node_report.totals()
    assert t["total"] == 1884
    failing = [f"{r.name}: {r.reason[:120]}" for r in node_report.results if r.status != "pass"]
    assert t["pass"] >= NODE_PASS_FLOOR, (
        f"{t['pass']} of {t['total']} node cases pass, floor is "
        f"{NODE_PASS_FLOOR}; failures:\n" + "\n".join(failing[:50])
    )


def blas_rows_uniform() -> bool:
    """Does numpy's sgemm give bit-identical rows for identical rows of A? OpenBLAS's Haswell
    kernels (e.g. forced with OPENBLAS_CORETYPE=Haswell on an AVX-512 CPU) do not: rows differ
    by a few ulps depending on their position in the micro-tile."""
    rng = np.random.default_rng(0)
    a = np.full((256, 576), 0.02, np.float32)
    b = (rng.standard_normal((576, 169)) * 1e7).astype(np.float32)
    return float(np.ptp(a @ b, axis=0).max()) == 0.0


def test_light_model_zoo():
    cases = C.light_cases()
    assert len(cases) == 9
    report = C.run(cases, timeout=300.0, progress=False)
    failing = {r.name: r.reason for r in report.results if r.status != "pass"}
    floor = LIGHT_PASS_FLOOR
    if not blas_rows_uniform():
        # squeezenet's weights are constants, so its 1000 logits are equal, ~9.5e9; its expected
        # output is softmax = 0.001 everywhere, which holds only if every logit is bit-identical.
        # With a BLAS whose rows round differently, logits differ by a few ulps (1024 each at
        # 9.5e9) and softmax puts all the mass on the largest ones. Allowed only for that reason.
        floor -= 1
        if "test_squeezenet" in failing:
            assert "values outside" in failing["test_squeezenet"], failing["test_squeezenet"]
    assert report.totals()["pass"] >= floor, [f"{n}: {w[:200]}" for n, w in failing.items()]


def test_node_suite_compiled_passes_what_the_interpreter_passes(node_report):
    """The graph engine (passes, kernel plans, one memory arena) on every node case: each case
    the node-by-node interpreter passes passes compiled too (omitted outputs such as LSTM's Y
    with only Y_h read, sequence and optional inputs, multi-output attention)."""
    passed = {r.name for r in node_report.results if r.status == "pass"}
    compiled = C.run(C.node_cases(), timeout=60.0, progress=False, engine="compiled")
    broken = [f"{r.name}: {r.reason[:160]}" for r in compiled.results if r.name in passed and r.status != "pass"]
    assert not broken, f"{len(broken)} cases fail compiled:\n" + "\n".join(broken[:40])
    with pytest.raises(ValueError, match="engine"):
        C.run_opsnn(C.node_cases("test_abs$")[0], engine="jit")
