"""Autotuning (opsnn.ops.autotune) and selection explanations (opsnn.tools.explain), tested by
calling their functions directly: candidates, keys, timing, the JSON file, reuse in another
process, the use-only mode, failures, progress bars, and ``explain_graph`` / ``opsnn explain``."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import opsnn
from opsnn.ops import autotune
from opsnn.ops.executor import plan_op
from opsnn.ops.registry import Selection, TensorMeta, get_op, register_op

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


@pytest.fixture(autouse=True)
def _opsnn_conv_kernels(monkeypatch):
    """These tests pin opsnn's own convolution kernels: oneDNN's plain forward stays out of the
    default choice here (its rule is tested in tests/test_backward_convbw.py)."""
    monkeypatch.setenv("OPSNN_CONV_ONEDNN", "0")


@pytest.fixture
def hooked():
    """Kernel selection; its autotuning hook is active while autotuning is enabled."""
    from opsnn.ops import registry

    yield registry.select_kernel


@pytest.fixture
def tuned(tmp_path):
    path = autotune.enable(str(tmp_path / "tune.json"), progress=False)
    yield path
    autotune.disable()


def untuned_plan(rec, metas, values, attrs):
    """plan_op with the autotuning hook paused: the tests call the tuner themselves."""
    with autotune.paused():
        return plan_op(rec, metas, values, attrs)


def conv_ctx(xs=(1, 16, 20, 20), ws=(16, 16, 3, 3), attrs=None, dtype=np.float32):
    rec = get_op("Conv")
    metas = [TensorMeta(xs, np.dtype(dtype)), TensorMeta(ws, np.dtype(dtype))]
    return rec, untuned_plan(rec, metas, [None, None], attrs or {"pads": [1, 1, 1, 1]}).ctx


# a probe op whose kernels' speeds we control
def _probe_infer(ctx):
    return [ctx.inputs[0]]


PROBE = register_op(
    "AutotuneProbe",
    domain="opsnn_test",
    inputs=["X"],
    outputs=["Y"],
    infer=_probe_infer,
    reference=lambda ins, attrs: ins[0] * 2,
    replace=True,
)


@PROBE.kernel("probe_slow", priority=20)
def _slow(ins, outs, attrs, plan, ws):
    time.sleep(0.004)
    np.multiply(ins[0], 2, out=outs[0])


@PROBE.kernel("probe_fast", priority=10)
def _fast(ins, outs, attrs, plan, ws):
    np.multiply(ins[0], 2, out=outs[0])


@PROBE.kernel("probe_broken", priority=5)
def _broken(ins, outs, attrs, plan, ws):
    raise RuntimeError("this kernel always fails")


@PROBE.kernel("probe_not_preferred", priority=30, applies=lambda ctx: autotune.NotPreferred("slower by default"))
def _np(ins, outs, attrs, plan, ws):
    time.sleep(0.008)
    np.multiply(ins[0], 2, out=outs[0])


def probe_ctx(shape=(8, 8)):
    return untuned_plan(PROBE, [TensorMeta(shape, np.dtype(np.float32))], [None], {}).ctx


# -- candidates and keys -----------------------------------------------------------------------------------------
def test_candidates_include_not_preferred_but_not_fallback():
    ctx = probe_ctx()
    names = [k.name for k in autotune.candidates(PROBE, ctx)]
    assert names == ["probe_not_preferred", "probe_slow", "probe_fast", "probe_broken"]
    sel = plan_op(PROBE, [TensorMeta((8, 8), np.dtype(np.float32))], [None], {}).selection
    assert sel.kernel.name == "probe_slow"  # NotPreferred is skipped by default selection
    assert dict(sel.rejected)["probe_not_preferred"] == "slower by default"
    rec, cctx = conv_ctx()
    assert "conv2d_winograd" in [k.name for k in autotune.candidates(rec, cctx)]
    rec, cctx = conv_ctx(attrs={"pads": [1, 1, 1, 1], "strides": [2, 2]})
    assert "conv2d_winograd" not in [k.name for k in autotune.candidates(rec, cctx)]  # wrong, not just slow


def test_workload_key_distinguishes_workloads():
    rec, a = conv_ctx()
    keys = {
        autotune.workload_key(rec, a),
        autotune.workload_key(*conv_ctx(xs=(2, 16, 20, 20))),
        autotune.workload_key(*conv_ctx(dtype=np.float64)),
        autotune.workload_key(*conv_ctx(attrs={"pads": [0, 0, 0, 0]})),
    }
    assert len(keys) == 4
    assert autotune.workload_key(rec, a) == autotune.workload_key(*conv_ctx())  # stable
    parsed = json.loads(autotune.workload_key(rec, a))
    assert parsed[0] == "Conv" and parsed[1] == [[1, 16, 20, 20], [16, 16, 3, 3]]
    assert parsed[-1] == autotune.cpu_model() and parsed[-1]


# -- choosing, persisting, reusing --------------------------------------------------------------------------------
def test_off_by_default_and_after_disable():
    autotune.disable()
    assert not autotune.active()
    assert autotune.choose(PROBE, probe_ctx()) is None


def test_choose_times_persists_and_reuses(tuned, monkeypatch):
    ctx = probe_ctx()
    k = autotune.choose(PROBE, ctx)
    assert k.name == "probe_fast"
    data = json.load(open(tuned))
    assert data["format"] == 1
    ((key, entry),) = data["entries"].items()
    assert key == autotune.workload_key(PROBE, ctx)
    assert entry["winner"] == "probe_fast" and entry["cpu"] == autotune.cpu_model()
    times = entry["times_ms"]
    assert times["probe_broken"] is None and "RuntimeError" in entry["errors"]["probe_broken"]
    assert times["probe_fast"] < times["probe_slow"] < times["probe_not_preferred"]
    # a second prepare of the same workload reads the winner: no timing
    monkeypatch.setattr(autotune, "tune", lambda *a, **k: pytest.fail("re-timed a known workload"))
    assert autotune.choose(PROBE, probe_ctx()).name == "probe_fast"
    sel = autotune.select(PROBE, probe_ctx())
    assert isinstance(sel, Selection) and sel.kernel.name == "probe_fast"
    assert sel.reason.startswith("autotuned") and "probe_fast" in sel.reason
    assert ("probe_slow", "slower in autotuning") in sel.rejected


def test_new_candidate_triggers_retune(tuned):
    ctx = probe_ctx((4, 4))
    assert autotune.choose(PROBE, ctx).name == "probe_fast"
    cands = autotune.candidates(PROBE, ctx)
    # a stored entry that lacks one of today's candidates is timed again
    entries = json.load(open(tuned))["entries"]
    key = autotune.workload_key(PROBE, ctx)
    del entries[key]["times_ms"]["probe_slow"]
    with open(tuned, "w") as f:
        json.dump({"format": 1, "entries": entries}, f)
    autotune.enable(tuned, progress=False)
    assert autotune.choose(PROBE, ctx, cands).name == "probe_fast"
    assert "probe_slow" in json.load(open(tuned))["entries"][key]["times_ms"]


def test_fewer_than_two_candidates_is_not_tuned(tuned):
    ctx = probe_ctx()
    assert autotune.choose(PROBE, ctx, autotune.candidates(PROBE, ctx)[:1]) is None
    assert not os.path.exists(tuned)


def test_use_mode_never_times(tmp_path, monkeypatch):
    path = autotune.enable(str(tmp_path / "t.json"), tune=False)
    try:
        monkeypatch.setattr(autotune, "tune", lambda *a, **k: pytest.fail("use mode timed a kernel"))
        assert autotune.choose(PROBE, probe_ctx()) is None
        assert not os.path.exists(path)
    finally:
        autotune.disable()


def test_other_process_uses_the_file(tuned):
    rec, ctx = conv_ctx()
    winner = autotune.choose(rec, ctx).name
    script = (
        "import numpy as np, opsnn\n"
        "from opsnn.ops import autotune\n"
        "from opsnn.ops.executor import plan_op\n"
        "from opsnn.ops.registry import TensorMeta, get_op\n"
        "autotune.tune = lambda *a, **k: (_ for _ in ()).throw(SystemExit('timed again'))\n"
        "rec = get_op('Conv')\n"
        "ctx = plan_op(rec, [TensorMeta((1, 16, 20, 20), np.dtype('float32')),"
        " TensorMeta((16, 16, 3, 3), np.dtype('float32'))], [None, None], {'pads': [1, 1, 1, 1]}).ctx\n"
        "print(autotune.settings()['mode'], autotune.choose(rec, ctx).name)\n"
    )
    env = dict(os.environ, OPSNN_AUTOTUNE="1", OPSNN_AUTOTUNE_FILE=tuned)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["tune", winner]
    env["OPSNN_AUTOTUNE"] = "use"
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["use", winner], out.stderr[-2000:]


def test_tuned_conv_winner_is_correct(tuned, rng):
    """Whatever wins, the kernel it names computes the conv (timing is noisy; correctness is not)."""
    rec, ctx = conv_ctx()
    k = autotune.choose(rec, ctx)
    entry = autotune.lookup(rec, ctx)
    assert set(entry["times_ms"]) == {c.name for c in autotune.candidates(rec, ctx)}
    assert entry["winner"] == k.name
    x, w = (
        rng.standard_normal((1, 16, 20, 20)).astype(np.float32),
        rng.standard_normal((16, 16, 3, 3)).astype(np.float32),
    )
    ref = opsnn.ops.conv2d(x, w, padding=1, algo="reference").numpy()
    y = opsnn.ops.conv2d(x, w, padding=1, algo=k.name).numpy() if k.check(ctx) is None else None
    if y is not None:
        np.testing.assert_allclose(y, ref, rtol=2e-4, atol=2e-4 * np.abs(ref).max())


def test_time_kernel_and_16bit_adapter(rng):
    rec, ctx = conv_ctx(dtype=np.float16)
    k = next(k for k in rec.kernels if k.name == "conv2d_im2col")
    assert k.needs_adapter(ctx)
    t = autotune.time_kernel(rec, ctx, k, min_repeats=2, max_repeats=3, budget_s=0.01)
    assert 0 < t < 10


def test_progress_bar_only_on_a_tty(monkeypatch):
    items = [1, 2, 3]
    autotune._S.progress = None
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert autotune._progress(items, "x") is items
    autotune._S.progress = True
    bar = autotune._progress(items, "x")
    assert bar is not items and list(bar) == items
    assert autotune._progress([1], "x") == [1]  # one candidate: nothing to show
    autotune._S.progress = None


def test_corrupt_file_is_ignored(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{not json")
    autotune.enable(str(p), progress=False)
    try:
        assert autotune.entries() == {}
        assert autotune.choose(PROBE, probe_ctx((3, 3))).name == "probe_fast"
        assert json.load(open(p))["format"] == 1  # rewritten whole
    finally:
        autotune.disable()


# -- explain -------------------------------------------------------------------------------------------------------------
def small_model(path):
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((16, 3, 7, 7)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((16, 16, 3, 3)) * 0.1).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "W1"], ["c1"], pads=[3, 3, 3, 3], strides=[2, 2], name="stem"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "W2"], ["c2"], pads=[1, 1, 1, 1], name="conv3x3"),
        helper.make_node("Softmax", ["c2"], ["y"], name="softmax"),
    ]
    g = helper.make_graph(
        nodes,
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), path)
    return path


@pytest.fixture
def plain_layout():
    """The small model's conv chain stays in NCHW (the blocked_layout pass would move it to oneDNN's
    convolutions, which have no alternatives to explain or tune)."""
    from opsnn.graph import passes

    passes.disable_passes(["blocked_layout"])
    yield
    passes.disable_passes([])


def test_explain_graph_lists_kernels_and_reasons(tmp_path, plain_layout):
    from opsnn.tools.explain import explain_graph

    path = small_model(str(tmp_path / "small.onnx"))
    text = explain_graph(path)  # the model's declared shapes
    assert text.startswith("graph small at x=(1, 3, 64, 64)")
    assert "-> Conv: conv2d_im2col" in text  # the stem, inside FusedConv
    assert "conv3x3 (Conv): conv2d_winograd" in text
    assert "weights pre-packed at prepare" in text
    assert "not chosen: conv2d_winograd: Winograd F(4x4,3x3) needs a 3x3 kernel" in text
    assert "autotune: off" in text
    brief = explain_graph(path, {"x": (1, 3, 64, 64)}, show_rejected=False)
    assert "conv2d_winograd" in brief and "not chosen" not in brief


def product_model():
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((16, 32)).astype(np.float32)
    w2 = rng.standard_normal((32, 32)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["a"], name="mm"),
        helper.make_node("Gemm", ["a", "W2"], ["b"], transB=1, name="g1"),
        helper.make_node("Gemm", ["b", "W2"], ["y"], transB=1, name="g2"),
    ]
    g = helper.make_graph(
        nodes,
        "products",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def _library_lines(text):
    """{(op, library, kernel): [shape lines]} of explain's kernel-library section."""
    import re

    section = text.split("kernel libraries: ")[1].split("autotune:")[0]
    groups, key = {}, None
    for line in section.splitlines()[2:]:
        m = re.match(r"\s*- (\S+) x(\d+) on (\w+) \((\w+)\): ", line)
        if m:
            key = (m[1], m[3], m[4])
            groups[key] = [int(m[2])]
        elif key is not None and line.startswith("      ") and not line.startswith("       "):
            groups[key].append(line.strip())
    return groups


def test_explain_prints_the_kernel_library_of_each_product_shape(tmp_path, plain_layout):
    """Which library each MatMul / Gemm / Conv shape runs on and the strategy's reason, equal
    decisions grouped (the two Gemms of one shape on one line), in the summary and per node."""
    from opsnn.kernels.cpu import libraries as KL
    from opsnn.tools.explain import explain_graph

    text = explain_graph(product_model(), summary=True)
    flowed = " ".join(text.split())  # the summary wraps at 110 columns where it is long
    assert f"kernel libraries: {' '.join(KL.summary().split())}" in flowed and "threaded GEMM: " in text
    groups = _library_lines(text)
    assert sorted(op for op, _, _ in groups) == ["Gemm", "MatMul"], text
    dims = {"MatMul": (8, 16, 32, "8x16 @ 16x32"), "Gemm": (8, 32, 32, "8x32 @ 32x32^T x2")}
    for (op, lib, kernel), (count, *shapes) in groups.items():
        rows, k, n, label = dims[op]
        assert count == (2 if op == "Gemm" else 1) and shapes == [label], text
        assert lib == KL.kernel_choice(kernel, rows, k, n, np.float32).library, text
    detail = explain_graph(product_model(), show_rejected=False)
    assert detail.count("      library: ") == 3 and "kernel libraries: " in detail

    convs = _library_lines(explain_graph(small_model(str(tmp_path / "small.onnx")), summary=True))
    shapes = sorted(s for (op, lib, _), (_, *s) in convs.items() if lib in ("mkl", "openblas", "onednn", "opsnn"))
    assert shapes == [["1x16x32x32 * 16x16x3x3"], ["1x3x64x64 * 16x3x7x7"]], convs


def test_explain_never_splits_a_hyphenated_word_where_it_wraps(monkeypatch):
    """The library summary wraps at 110 columns: wherever the wrap falls, 'gnu-openmp' stays whole (textwrap's
    default breaks after a hyphen: a 145-character ISA phrase made it "gnu-" / "openmp")."""
    from opsnn.kernels.cpu import libraries as KL
    from opsnn.tools import explain

    tail = "; GEMM OpenBLAS; OpenBLAS Haswell; MKL gnu-openmp; oneDNN 3.2.0 (nChw8c, no matmul, no bf16)"
    for n in range(20, 200):  # the ISA phrase: words of 4 letters, n characters
        line = f"ISA {('abcd ' * 40)[:n].strip()}{tail}"
        monkeypatch.setattr(KL, "summary", lambda line=line: line)
        flowed = " ".join(" ".join(explain._libraries_section([])).split())
        assert f"kernel libraries: {' '.join(line.split())}" in flowed, n


def test_explain_needs_static_shapes(tmp_path):
    from opsnn.errors import ParamInvalidError
    from opsnn.tools.explain import explain_graph

    node = helper.make_node("Relu", ["x"], ["y"])
    g = helper.make_graph(
        [node],
        "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(ParamInvalidError, match="input_shapes"):
        explain_graph(model)
    assert "relu" in explain_graph(model, {"x": (3, 4)}).lower()


def test_hooked_selection_uses_autotune(hooked, tuned):
    ex = opsnn.ops.prepare(PROBE, [np.ones((5, 5), np.float32)])
    assert ex.kernel_name == "probe_fast" and ex.reason.startswith("autotuned")
    forced = opsnn.ops.prepare(PROBE, [np.ones((5, 5), np.float32)], algo="probe_slow")
    assert forced.kernel_name == "probe_slow"  # a forced kernel is never overridden
    entry = autotune.lookup(PROBE, plan_op(PROBE, [TensorMeta((5, 5), np.dtype(np.float32))], [None], {}).ctx)
    assert entry["winner"] == "probe_fast"


def test_explain_cli(hooked, tmp_path, capsys, plain_layout):
    from opsnn.tools import explain

    path = small_model(str(tmp_path / "small.onnx"))
    tune_file = str(tmp_path / "cli-tune.json")
    try:
        assert explain.main([path, "--shape", "x=1,3,64,64", "--autotune", tune_file, "--brief"]) == 0
    finally:
        autotune.disable()
    out = capsys.readouterr().out
    assert "graph small at x=(1, 3, 64, 64)" in out and f"autotune: tune ({tune_file})" in out
    assert os.path.exists(tune_file)
    assert explain.main([str(tmp_path / "missing.onnx")]) == 2


def test_explain_cli_prints_a_summary_by_default_and_detail_with_verbose(tmp_path, capsys, plain_layout):
    from opsnn.tools import explain

    path = small_model(str(tmp_path / "small.onnx"))
    assert explain.main([path]) == 0
    out = capsys.readouterr().out
    assert out.startswith("graph small at x=(1, 3, 64, 64)")
    assert "kernels by op type:" in out and "reference fallbacks: none" in out and "fusions refused:" in out
    assert "passes: " in out and "--verbose" in out and "why:" not in out
    rows = out.split("kernels by op type:")[1].split("reference fallbacks")[0]
    assert "conv2d_winograd" in rows
    assert explain.main([path, "--verbose"]) == 0
    detail = capsys.readouterr().out
    assert "why:" in detail and "not chosen:" in detail
    assert max(len(line) for line in detail.splitlines()) <= 130  # long reasons wrap
