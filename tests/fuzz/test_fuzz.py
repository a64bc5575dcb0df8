"""Fuzzing in `make test`: fixed seeds, a small budget per kind (`opsnn fuzz` runs the same generators longer).

Every case runs in the session's worker process with a time limit (tests/fuzz/conftest.py): a crash or
a hang fails that case only. A case known to fail is listed below with the issue that fixes it, as a
strict xfail: it turns into a failure to remove once the fix is merged.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opsnn.tools import fuzz as F


def check(pool, spec: dict) -> dict:
    """Run ``spec`` in the worker; fail with its detail when it crashed, hung or was wrong."""
    res = pool.run(spec)
    assert res["status"] not in F.FAILED, f"{res['status']}: {spec}: {res['detail']}"
    return res


#: (kind, key) -> why it fails today (a strict xfail naming the issue that fixes it); none are known now
KNOWN: dict = {}


def _param(kind, key, *values):
    reason = KNOWN.get((kind, key))
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(*values, marks=marks, id=str(key))


# -- hostile ONNX files ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [_param("onnx_mutate", s, s) for s in [*range(48), 67]])
def test_mutated_onnx_file(fuzz_pool, seed):
    """Truncated, bit-flipped, byte-stomped and edited models: an opsnn error or onnx.reference's answer
    (with no pool cap, as a user runs: a huge request must still end in an opsnn error)."""
    check(fuzz_pool, {"kind": "onnx_mutate", "seed": seed, "cap": None})


@pytest.mark.parametrize("seed", [_param("graph", s, s) for s in range(10)])
def test_random_graph(fuzz_pool, seed):
    """Even seeds: random chains of ops, compiled and run at two batch sizes, equal onnx.reference; odd
    seeds: one registry op drawn from its schema, as a compiled one-node model, equals its reference."""
    check(fuzz_pool, {"kind": "graph", "seed": seed})


# -- ops from their own schemas ---------------------------------------------------------------------------------------
_OPS = F._ops()


@settings(max_examples=60, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_registry_op_from_schema(fuzz_pool, data):
    """One op with inputs and attributes drawn from its schema: its numpy reference, or an opsnn error."""
    rec = data.draw(st.sampled_from(_OPS), label="op")
    case = F.draw_op_case(rec, F.HypothesisDraw(data))
    check(fuzz_pool, {"kind": "op", "case": case})


# -- NaN and Inf through every kernel of every float op ------------------------------------------------------------------
@pytest.mark.parametrize(
    "op,kernel,domain", [_param("nan_inf", f"{r.name}/{k}", r.name, k, r.domain) for r, k in F.float_kernels()]
)
def test_nan_inf_every_kernel(fuzz_pool, op, kernel, domain):
    """NaN where the reference has NaN, +-Inf where it has +-Inf, the rest within tolerance."""
    check(fuzz_pool, {"kind": "nan_inf", "seed": 0, "op": op, "kernel": kernel, "domain": domain})


# -- out= views ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "op,view,domain",
    [
        _param("out_view", f"{r.name}/{F.VIEWS[i % len(F.VIEWS)]}", r.name, F.VIEWS[i % len(F.VIEWS)], r.domain)
        for i, r in enumerate(F.out_ops())
    ],
)
def test_out_view(fuzz_pool, op, view, domain):
    """Each op's out= as a transposed, strided, reversed, offset or expanded view (one per op here; `opsnn
    fuzz` runs them all): written correctly, or refused at prepare with an opsnn error."""
    check(fuzz_pool, {"kind": "out_view", "seed": 0, "op": op, "view": view, "domain": domain})


# -- cases two `opsnn fuzz --minutes 30 --seed 70000` runs (and earlier ones) found, fixed since ---------------------------------
@pytest.mark.parametrize(
    "kind,seed",
    [
        ("op_schema", 56708),  # FusedElementwise [Erf, Floor]: the reference skipped the unfused rounding
        ("nan_inf", 71592),  # GridSample's numpy kernel on C = 0: a reshape ValueError
        ("out_view", 71669),  # GlobalLpPool on C = 0: a reshape ValueError
        ("nan_inf", 72146),  # RMSNormalization, float32 X and float64 scale: judged at float32 (an oracle fix)
        ("nan_inf", 81873),  # MaxRoiPool on an Inf roi coordinate: an untyped OverflowError
        ("nan_inf", 82623),  # MaxRoiPool on a NaN roi coordinate: an untyped ValueError
        ("op_schema", 84930),  # Split with an empty 'split' and num_outputs: 0 outputs counted, IndexError
        ("op_schema", 93955),  # Col2Im with a 0 stride: an untyped ZeroDivisionError
        ("onnx_mutate", 82570),  # a 3.4e38 constant into Conv: Inf - Inf or -Inf by summation order (oracle)
        ("onnx_mutate", 151406),  # Gelu(-7.1): opsnn -4.4e-12, onnx.reference -0.0 even in float64 (oracle)
        ("graph", 915685),  # float64 HardSigmoid, alpha 0.2: the oracle used 0.2, the model holds float32(0.2)
        ("op_schema", 1212817),  # LayerNormalizationGrad, float32 rows of 2 near -2.2: xhat off by the mean's rounding
        ("onnx_mutate", 1308510),  # Tanh -> Pow(t, t): tanh(8.84) came out -1.0 exactly, Pow finite where NaN
        ("nan_inf", 1310674),  # AttentionTrain, V's last dim 0: the rows' logsumexp left at -inf
    ],
)
def test_found_by_long_runs(fuzz_pool, kind, seed):
    check(fuzz_pool, {"kind": kind, "seed": seed})


# -- resources -----------------------------------------------------------------------------------------------------------
def test_soak(fuzz_pool):
    """Mixed eager calls and compiled runs at varying shapes (scaled down; `opsnn fuzz` runs 10,000 +
    1,000): pool live bytes back to the baseline, threads and RSS flat."""
    check(fuzz_pool, {"kind": "soak", "seed": 0, "options": {"eager": 2000, "compiled": 200, "streams": False}})


def test_soak_runs_only_the_batches_its_model_takes(fuzz_pool):
    """Seed 150000's model multiplies by a (2, 1, 5) constant: batches 3 and 4 are its shape error, not a
    leak (the soak failed on them in a 30-minute run)."""
    check(fuzz_pool, {"kind": "soak", "seed": 150000, "options": {"eager": 200, "compiled": 40, "streams": False}})


def test_float64_reference_keeps_gelus_far_tail():
    """onnx.reference's Erf rounds to float32 whatever its input, so its Gelu is -0.0 at x = -7.1 even on a
    float64 model; the fuzzer's float64 variant computes Erf and Gelu in float64 (x * Phi(x) = -4.35e-12)."""
    from math import erfc, sqrt

    model = _chain("Gelu")
    model.opset_import[0].version = 20
    x = np.array([-7.1023927, -1.0, 0.0, 3.0], np.float32)
    exact = 0.5 * x.astype(np.float64) * np.array([erfc(-v / sqrt(2.0)) for v in x.astype(np.float64)])
    assert F._onnx_reference(model, {"x": x})[0][0] == 0.0  # the float32 reference: the tail cancelled
    (label, outs), *_ = F.reference_variants(model, {"x": x})
    assert label == "float64"
    np.testing.assert_allclose(np.asarray(outs[0], np.float64), exact, rtol=1e-6)


def test_soak_with_dropped_streams(fuzz_pool):
    """The same with every 50th eager call on a new Stream that is then dropped: no thread left behind."""
    check(fuzz_pool, {"kind": "soak", "seed": 1, "options": {"eager": 1000, "compiled": 20}})


def test_worker_reports_crash_and_hang(fuzz_pool):
    """The harness itself: a case that kills its worker or never returns is a reported failure, and the
    next case runs in a fresh worker. A worker serves at most ``max_cases`` cases (compiled kernels stay
    mapped for its life: one of ~150,000 graph cases ran out of vm.max_map_count), then a fresh one starts."""
    pool = F.WorkerPool(timeout=3, max_cases=2)
    try:
        crash = pool.run({"kind": "selftest", "seed": 0, "action": "crash"})
        hang = pool.run({"kind": "selftest", "seed": 0, "action": "hang"})
        fine, pids = [], []
        for _ in range(3):
            fine.append(pool.run({"kind": "selftest", "seed": 0, "action": "ok"}, timeout=60))
            pids.append(pool.proc.pid)
    finally:
        pool.close()
    assert crash["status"] == F.CRASH and "exit code" in crash["detail"]
    assert hang["status"] == F.HANG
    assert all(f["status"] == F.OK for f in fine) and pool.restarts == 2
    assert pids[0] == pids[1] != pids[2]


# -- the long-run tool ------------------------------------------------------------------------------------------------------
def test_opsnn_fuzz_cli_counts_cases(tmp_path, capsys):
    """`opsnn fuzz` runs the generators for the time given and prints the cases tried per kind."""
    from opsnn.cli import main

    rc = main(["fuzz", "--minutes", "0.03", "--kinds", "onnx_mutate", "--out", str(tmp_path / "f"), "--seed", "5"])
    out = capsys.readouterr().out
    assert "cases per kind:" in out and "onnx_mutate" in out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("onnx_mutate"))
    assert int(line.split()[1]) >= 1
    assert rc == (1 if "FAIL" in out or "CRASH" in out or "HANG" in out else 0)
    with pytest.raises(SystemExit) as exc:
        main(["fuzz", "--minutes", "1", "--kinds", "bogus"])
    assert exc.value.code == 2


def test_opsnn_fuzz_ctrl_c_prints_the_counts_so_far(tmp_path, capsys, monkeypatch):
    """Ctrl-C during `opsnn fuzz`: the counts per kind so far and exit code 130, not a traceback."""
    from opsnn.cli import main

    real, calls = F.WorkerPool.run, []

    def run(self, spec, *a, **kw):
        calls.append(spec)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, spec, *a, **kw)

    monkeypatch.setattr(F.WorkerPool, "run", run)
    rc = main(["fuzz", "--minutes", "5", "--kinds", "onnx_mutate", "--out", str(tmp_path / "f"), "--seed", "7"])
    out = capsys.readouterr().out
    assert rc == 130
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("onnx_mutate"))
    assert "interrupted" in out and int(line.split()[1]) == 2, out


def test_failing_case_files_reproduce(tmp_path):
    """A failing case's folder holds the model, its inputs and a script that reruns it."""
    import subprocess
    import sys

    import numpy as np
    import onnx

    spec = {"kind": "onnx_mutate", "seed": 9}
    d = F.write_artifacts(spec, {"status": F.FAIL, "detail": "example"}, tmp_path)
    data, feeds, _ = F.mutated_model(9)
    assert (d / "model.onnx").read_bytes() == data
    assert set(np.load(d / "inputs.npz").files) == set(feeds)
    res = subprocess.run(
        [sys.executable, str(d / "repro.py")], capture_output=True, text=True, timeout=300, check=False
    )
    assert res.returncode == 0 and "'status'" in res.stdout, res.stderr[-2000:]
    model, _ = F.random_model(3)
    onnx.checker.check_model(model)


# -- ill-conditioned models: a difference the reference itself does not survive -------------------------------------------
def _chain(*ops):
    """x -> ops... (``("Add", 1.0)``: a binary op with a float32 constant) as an ONNX model."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, cur = [], [], "x"
    for i, op in enumerate(ops):
        name, const = (op, None) if isinstance(op, str) else op
        ins = [cur]
        if const is not None:
            inits.append(numpy_helper.from_array(np.array(const, np.float32), f"c{i}"))
            ins.append(f"c{i}")
        nodes.append(helper.make_node(name, ins, [f"v{i}"]))
        cur = f"v{i}"
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info(cur, TensorProto.FLOAT, ["n"])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_ill_conditioned_is_its_own_count_and_wrong_results_still_fail():
    """Tanh -> Add 1 -> Reciprocal at x << 0 divides by 1 + tanh(x), a few float32 ulps of 1: the exact answer
    rounded to float32 differs from onnx.reference's float32 one by ~0.1%, past the tolerance, and so does the
    reference's own float64 run: ill_conditioned, not a pass or a failure. The same model at x near 0, a
    result off at one well-conditioned place, or far off where the problem is ill-conditioned: failures."""
    model = _chain("Tanh", ("Add", 1.0), "Reciprocal")
    x = np.concatenate([np.linspace(-6, -4.5, 64), [0.25, 0.5]]).astype(np.float32)
    want = F._onnx_reference(model, {"x": x})
    exact = (1.0 / (1.0 + np.tanh(x.astype(np.float64)))).astype(np.float32)  # float64 oracle, rounded once
    assert F.compare(exact, want[0]) is not None, "the case must differ past the float32 tolerance"
    status, detail = F.judge_outputs([exact], want, model, {"x": x})
    assert status == F.ILL and "float64" in detail, (status, detail)

    wrong = exact.copy()
    wrong[-1] += 10  # x = 0.5: 1 + tanh(x) is far from 0, the reference is stable there (atol: 2e-5 x max ~8e4)
    assert F.judge_outputs([wrong], want, model, {"x": x})[0] == F.FAIL
    wrong = exact.copy()
    wrong[3] *= 1.5  # ill-conditioned there, but 50% is far past the reference's own spread
    assert F.judge_outputs([wrong], want, model, {"x": x})[0] == F.FAIL

    calm = np.linspace(-1, 1, 33).astype(np.float32)
    want = F._onnx_reference(model, {"x": calm})
    assert F.judge_outputs([want[0] * np.float32(1.001)], want, model, {"x": calm})[0] == F.FAIL
    assert F.judge_outputs([want[0].copy()], want, model, {"x": calm}) == (F.OK, "")


def test_a_result_that_agrees_with_the_float64_run_where_the_reference_does_not_is_ill_conditioned():
    """Found by `opsnn fuzz` (onnx_mutate seed 7661, ... Tanh -> Add 1 -> Reciprocal): at one place the float32
    reference was off the float64 run by 80% of the tolerance and opsnn, closer to the float64 run, was past the
    tolerance on the other side. The reference did not "move" there, yet opsnn is the more accurate one."""
    want = np.array([22826.145, 1.0, 1.12e6], np.float32)  # the largest output sets the absolute tolerance
    f64 = np.array([22805.357, 1.0, 1.12e6], np.float32)
    lim = F._mismatch(want, want, False)[1][0]
    assert 0.5 * lim < want[0] - f64[0] < lim  # the reference is within its own tolerance of float64 ...
    got = np.array([22795.13, 1.0, 1.12e6], np.float32)
    assert F.compare(got, want) is not None  # ... opsnn is past it from the reference
    why = F.ill_conditioned(got, want, [("float64", f64)])
    assert why is not None and "float64 run" in why, why
    # off the float64 run past the tolerance too: a failure; and agreeing with a 1-ulp variant is not enough
    assert F.ill_conditioned(np.array([22700.0, 1.0, 1.12e6], np.float32), want, [("float64", f64)]) is None
    assert F.ill_conditioned(got, want, [("inputs 1 ulp up", f64)]) is None


def test_a_result_rounded_op_by_op_like_a_correct_float32_evaluation_is_ill_conditioned():
    """Found by `opsnn fuzz` (onnx_mutate seeds 30154, 111706: a mutated Pow exponent of 3.4e38 after a Tanh):
    tanh(9.085) is 0.99999998..., whose nearest float32 is 1.0 (opsnn's); onnx.reference's numpy tanh gives
    0.99999994 and its float64 run keeps 0.99999998, so both raise it to 3.4e38 as 0 where opsnn gives 1.
    The variant rounding each op's float64 result to float32 is the correctly rounded evaluation: opsnn agrees
    with it. A result off at a stable place, or far past the variants' spread, still fails."""
    model = _chain("Tanh", ("Pow", 3.3895314e38))
    x = np.array([9.084992, 0.5, 0.0, 2.0], np.float32)
    want = F._onnx_reference(model, {"x": x})
    got = np.array([1.0, 0.0, 0.0, 0.0], np.float32)
    assert np.tanh(np.float64(x[0])).astype(np.float32) == 1.0 and want[0][0] == 0.0
    labels = [label for label, _ in F.reference_variants(model, {"x": x})]
    assert labels[:2] == ["float64", F.ROUNDED], labels
    status, detail = F.judge_outputs([got], want, model, {"x": x})
    assert status == F.ILL and F.ROUNDED in detail, (status, detail)
    for k, v in ((3, 0.5), (0, 20.0)):  # tanh(2) ** 3.4e38 is 0 in every variant; 20 is past 8 x their spread
        wrong = got.copy()
        wrong[k] = v
        assert F.judge_outputs([wrong], want, model, {"x": x})[0] == F.FAIL, (k, v)


def test_ill_conditioned_singular_places_keep_a_kind_some_reference_has():
    """Where a reference is not finite (a division by a zero that rounding decides), the result must be of a
    kind (finite, NaN, +-Inf) that the reference or one of its variants has there."""
    want = np.array([1.0, -np.inf], np.float32)
    variants = [("float64", np.array([1.0, -3e30], np.float32))]
    assert F.ill_conditioned(np.array([1.0, -2e30], np.float32), want, variants) is not None
    assert F.ill_conditioned(np.array([1.0, np.nan], np.float32), want, variants) is None
    assert F.ill_conditioned(np.array([1.0, -2e30], np.float32), want, [("float64", want.copy())]) is None


def test_a_cancelling_sum_added_in_another_order_is_ill_conditioned():
    """Found by `opsnn fuzz` under the AVX2 cap (onnx_mutate seed 3502494: a Conv whose output cancels to 1e-4
    from terms of ~15, then a Reciprocal): oneDNN's blocked convolution adds the terms in its own order, one
    float32 ulp of the terms apart from the reference's, 1.4% after the Reciprocal. The variants that move each
    sum by what another order may change cover it; a result off where the sum does not cancel, or far past
    that reach where it does, still fails."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    c, n = 8, 24
    x = rng.uniform(10, 20, (1, c, 1, n)).astype(np.float32)
    x[0, 1::2, 0, :16] = x[0, 0::2, 0, :16] + rng.uniform(1e-5, 4e-5, (c // 2, 16)).astype(np.float32)  # cancels
    w = np.tile(np.array([1.0, -1.0], np.float32), c // 2).reshape(1, c, 1, 1)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["s"]), helper.make_node("Reciprocal", ["s"], ["y"])],
        "cancel",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 1, n])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    want = F._onnx_reference(model, {"x": x})
    terms = x[0, :, 0, :] * w.reshape(c, 1)
    s = np.zeros(n, np.float32)
    for k in (1, 3, 5, 7, 0, 2, 4, 6):  # the negative terms first: another float32 order
        s += terms[k]
    got = (np.float32(1) / s).reshape(want[0].shape)
    assert F.compare(got, want[0]) is not None, "the orders must differ past the float32 tolerance"
    status, detail = F.judge_outputs([got], want, model, {"x": x})
    assert status == F.ILL and "sums reordered" in detail, (status, detail)
    big = float(np.abs(want[0]).max())  # the absolute tolerance scales with it
    for k, wrong_value in ((20, got.reshape(-1)[20] + 1e-3 * big), (3, 10 * got.reshape(-1)[3])):
        wrong = got.copy()  # a sum that does not cancel (k=20); far past the reordered sums' reach (k=3)
        wrong.reshape(-1)[k] = wrong_value
        assert F.judge_outputs([wrong], want, model, {"x": x})[0] == F.FAIL, (k, wrong_value)


def test_the_soak_runs_the_batches_a_reshape_allows():
    """Found by `opsnn fuzz` (soak seed 27182): a model reshaping to (3, -1) takes only batches whose element
    count 3 divides; the soak probed batch sizes catching InferShapeError only, and Reshape's refusal is a
    ParamInvalidError, so the harness itself failed."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"])],
        "reshape3",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([3, -1], np.int64), "s")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    cg = F.compile_graph(F.load_onnx(model.SerializeToString()))
    assert F._batches_it_takes(cg, [1, 2, 8], F.RngDraw(0)) == [3]
