"""PyTorch's OpInfo database through the opsnn torch backend (``opsnn conformance --suite
torch-opinfo``): a fixed sample of entries, every sample against torch eager (the oracle) with the
entry's tolerances. No entry may give a wrong result, and the count of entries that run fully on
opsnn may only go up (FLOOR)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")  # torch.testing._internal imports it

from opsnn.frontends.torch import opinfo  # noqa: E402

#: a fixed sample of op_db entries: elementwise math, reductions, matmuls, convolution, norms,
#: shape ops, sorts, rounding modes, dtype conversions, and a few with no exact mapping (data-dependent
#: shapes, unmapped ops, integer results)
SAMPLE = [
    "abs",
    "acos",
    "add",
    "addmm",
    "amax",
    "argmax",
    "bmm",
    "cat",
    "ceil",
    "clamp",
    "cos",
    "cumsum",
    "diagonal",
    "div.floor_rounding",
    "div.no_rounding_mode",
    "double",
    "erfinv",
    "exp",
    "expm1",
    "flip",
    "floor",
    "fmax",
    "fmod",
    "gather",
    "index_select",
    "log1p",
    "log_softmax",
    "logical_and",
    "max.reduction_with_dim",
    "maximum",
    "mean",
    "mm",
    "msort",
    "mul",
    "neg",
    "nn.functional.conv2d",
    "nn.functional.elu",
    "nn.functional.gelu",
    "nn.functional.hardswish",
    "nn.functional.layer_norm",
    "nn.functional.linear",
    "nn.functional.logsigmoid",
    "nn.functional.relu",
    "nonzero",
    "pow",
    "roll",
    "round.decimals_3",
    "sigmoid",
    "sin",
    "softmax",
    "sub",
    "sum",
    "trace",
    "tril",
    "where",
]

#: entries of SAMPLE that pass with every sample on opsnn; raise it as mappings land, never lower it
FLOOR = 52


#: entries whose bfloat16 samples run too (torch's bfloat16 tolerances): products, convolution, norms,
#: reductions, elementwise math, conversions; log_softmax, whose bfloat16 kernel rounds between steps,
#: stays in torch
BF16_SAMPLE = [
    "add",
    "addmm",
    "amax",
    "div.no_rounding_mode",
    "double",
    "log_softmax",
    "mean",
    "nn.functional.conv2d",
    "nn.functional.gelu",
    "nn.functional.layer_norm",
    "softmax",
    "sum",
    "where",
]

#: entries of BF16_SAMPLE that pass in bfloat16 with every sample on opsnn; only goes up
BF16_FLOOR = 12


@pytest.fixture(scope="module")
def report():
    return opsnn_run()


def opsnn_run():
    return opinfo.run(opinfo.entries(SAMPLE), timeout=120, progress=False)


def test_no_wrong_results_and_the_floor_holds(report):
    by = {r.name: r for r in report.results}
    wrong = {r.name: r.reason for r in report.results if r.status == opinfo.FAIL}
    assert not wrong, wrong
    assert report.totals()["wrong_samples"] == 0
    passed = sorted(r.name for r in report.results if r.status == opinfo.PASS)
    assert len(passed) >= FLOOR, (len(passed), passed)
    # a pass means every sample ran on opsnn: none of its samples left a node to torch
    for r in report.results:
        if r.status == opinfo.PASS:
            assert r.on_opsnn > 0 and r.on_torch == 0 and r.wrong == 0, r
    # what opsnn cannot run exactly falls back, with its reason
    assert by["nonzero"].status == opinfo.FALLBACK and "nonzero" in by["nonzero"].reason
    assert by["erfinv"].status == opinfo.FALLBACK and "aten.erfinv.default" in by["erfinv"].fallback_ops


def test_wrong_result_is_caught(monkeypatch):
    """The harness itself: an adapter that lowers to the wrong op is reported as a failure."""
    from opsnn.frontends.torch import aten

    table = aten.build_table()
    monkeypatch.setitem(table, torch.ops.aten.sin.default, aten._unary("Cos"))
    [r] = opinfo.run(opinfo.entries(["sin"]), progress=False).results
    assert r.status == opinfo.FAIL and r.wrong >= 1 and "values outside" in r.reason


def test_a_peer_backend_runs_the_same_samples_apart_from_opsnn():
    """``--peer``: the same samples through another torch.compile backend, against the same eager
    results; its results never change opsnn's (a peer that adds 1 fails every entry, opsnn still passes)."""

    def off_by_one(gm, example_inputs):
        return lambda *args: [o + 1 for o in gm(*args)]

    rep = opinfo.run(opinfo.entries(["add", "sin"]), progress=False, peer="eager")
    assert rep.peer == "eager" and [(r.status, r.peer_status) for r in rep.results] == [("pass", "pass")] * 2
    assert rep.totals()["peer"]["pass"] == 2 and rep.to_json()["entries"]["sin"]["peer"]["status"] == "pass"
    rep = opinfo.run(opinfo.entries(["sin"]), progress=False, peer=off_by_one)
    [r] = rep.results
    assert rep.peer == "off_by_one" and r.status == opinfo.PASS and r.wrong == 0
    assert r.peer_status == opinfo.FAIL and r.peer_wrong == r.samples and "values outside" in r.peer_reason
    assert "off_by_one" in opinfo.format_table(rep).splitlines()[0]


def test_a_peer_out_of_time_is_no_verdict():
    """A peer that runs out of the entry's time limit gives no verdict (skip), not a failure, and opsnn's
    result stands."""
    import time

    def slow(gm, example_inputs):
        time.sleep(60)
        return gm

    [r] = opinfo.run(opinfo.entries(["neg"]), timeout=5, progress=False, peer=slow).results
    assert r.status == opinfo.PASS and r.peer_status == opinfo.SKIP and "timed out" in r.peer_reason


def test_cli_writes_the_json_report(tmp_path, capsys):
    from opsnn import cli

    out = tmp_path / "r.json"
    code = cli.main(
        ["conformance", "--suite", "torch-opinfo", "--ops", "nn.functional.relu,nonzero", "--out", str(out)]
    )
    assert code == 0
    data = json.loads(out.read_text())
    assert data["suite"] == "torch-opinfo" and data["totals"]["total"] == 2
    assert data["entries"]["nn.functional.relu"]["status"] == "pass"
    assert data["entries"]["nonzero"]["status"] == "fallback"
    assert "nn.functional.relu" in capsys.readouterr().out


def test_bfloat16_samples_match_with_no_wrong_result():
    """The entries' bfloat16 samples: computed in float32 and rounded once, as torch's CPU kernels do,
    within torch's bfloat16 tolerances; results keep torch's dtype (bfloat16 stays bfloat16)."""
    rep = opinfo.run(opinfo.entries(BF16_SAMPLE), timeout=120, progress=False, dtype="bfloat16")
    assert rep.to_json()["dtype"] == "bfloat16"
    wrong = {r.name: r.reason for r in rep.results if r.status == opinfo.FAIL}
    assert not wrong and rep.totals()["wrong_samples"] == 0, wrong
    passed = sorted(r.name for r in rep.results if r.status == opinfo.PASS)
    assert len(passed) >= BF16_FLOOR, (len(passed), passed)
    [ls] = [r for r in rep.results if r.name == "log_softmax"]
    assert ls.status == opinfo.FALLBACK and "bfloat16" in ls.reason


def test_bfloat16_tolerance_defaults():
    """torch's bfloat16 defaults where an entry declares no override; float32's stay float32's."""
    [add] = opinfo.entries(["add"])
    assert opinfo.tolerance(add, "bfloat16") == (1.6e-2, 1e-5)
    assert opinfo.tolerance(add) == (1.3e-6, 1e-5)
