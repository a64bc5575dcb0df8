"""Tiered compilation (``opsnn.ops.tiering``): with an empty kernel cache a compiled conv chain runs
oneDNN's direct convolution while a background process compiles the blocked Winograd kernel;
a compile after that picks Winograd; both agree with the interpreter's numpy oracle, Inf and NaN
included; the background process ends with its parent and reports failures as log lines."""

import json
import logging
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import opsnn
from opsnn.graph import Graph, Node, Value
from opsnn.kernels.cpu import libraries as KL
from opsnn.kernels.cpu import onednn as KD
from opsnn.ops import tiering

pytestmark = pytest.mark.skipif(KD.matmul_unavailable() is not None, reason=f"oneDNN matmul: {KD.matmul_unavailable()}")

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
WINOGRAD, DIRECT = "conv_winograd_blocked", "conv_onednn"


def _chain(rng, c=16, hw=20):
    # 1x1 (reads NCHW: oneDNN) -> 3x3 on the blocked tensor (Winograd when compiled) -> relu
    init = {
        "w1": (rng.standard_normal((c, c, 1, 1)) * 0.2).astype(np.float32),
        "w2": (rng.standard_normal((c, c, 3, 3)) * 0.1).astype(np.float32),
    }
    nodes = [
        Node("Conv", ["x", "w1"], ["a"]),
        Node("Relu", ["a"], ["ar"]),
        Node("Conv", ["ar", "w2"], ["b"], {"pads": [1, 1, 1, 1]}),
        Node("Relu", ["b"], ["y"]),
    ]
    return Graph(
        "chain", inputs=[Value("x", np.float32, (1, c, hw, hw))], outputs=["y"], nodes=nodes, initializers=init
    )


def _kernel_of_3x3(cg) -> str:
    lines = [ln for ln in cg.explain().splitlines() if "(opsnn::BlockedConv)" in ln]
    assert len(lines) == 2, cg.explain()
    return lines[1].split("(opsnn::BlockedConv): ")[1].split()[0]


@pytest.fixture(autouse=True)
def blocked_chains(monkeypatch):
    """Chains on nChw<b>c, where the blocked Winograd kernel runs (on nhwc oneDNN takes every 3x3)."""
    if KD.block() is not None:
        monkeypatch.setenv("OPSNN_ONEDNN_LAYOUT", f"nChw{KD.block()}c")


@pytest.fixture
def cold_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSNN_KERNEL_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setenv("OPSNN_TIERED", "1")
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    tiering._background.failed.clear()  # another test's
    yield tmp_path / "kernels"
    tiering._background.stop()


def test_a_cold_compile_runs_the_library_kernel_then_the_numba_one(rng, cold_cache):
    g = _chain(rng)
    x = rng.standard_normal((1, 16, 20, 20)).astype(np.float32)
    x[0, 3, 5, 7], x[0, 9, 0, 0], x[0, 1, 19, 12] = np.nan, np.inf, -np.inf
    want = opsnn.graph.run(g, {"x": x})["y"]
    want = want.numpy() if hasattr(want, "numpy") else want
    assert np.isnan(want).any() and np.isfinite(want).any()

    cg = opsnn.compile(g)
    got = cg.run({"x": x})["y"].numpy()
    assert _kernel_of_3x3(cg) == DIRECT, cg.explain()
    assert f"tiered: {WINOGRAD} (priority 20) not compiled yet" in cg.explain()
    assert tiering.status()["pending"] + tiering.status()["done"] >= 1
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.nanmax(np.abs(want[np.isfinite(want)])))

    assert tiering.wait(600), tiering.status()
    assert not tiering.status()["failed"], tiering.status()
    assert os.listdir(os.path.join(opsnn.runtime.kernel_cache.target_dir(), "tiered"))
    # the same compiled graph plans again on its next run and picks the numba kernel; so does a new compile
    assert _kernel_of_3x3(cg) == DIRECT
    got1 = cg.run({"x": x})["y"].numpy()
    assert _kernel_of_3x3(cg) == WINOGRAD and cg.replans == 1 and cg.latest_plan.stand_ins == (), cg.explain()
    np.testing.assert_array_equal(np.isnan(got1), np.isnan(want))
    np.testing.assert_allclose(got1, want, rtol=0, atol=2e-4 * np.nanmax(np.abs(want[np.isfinite(want)])))
    cg.run({"x": x})
    assert cg.replans == 1
    cg2 = opsnn.compile(g)
    got2 = cg2.run({"x": x})["y"].numpy()
    assert _kernel_of_3x3(cg2) == WINOGRAD, cg2.explain()
    np.testing.assert_array_equal(np.isnan(got2), np.isnan(want))
    np.testing.assert_allclose(got2, want, rtol=0, atol=2e-4 * np.nanmax(np.abs(want[np.isfinite(want)])))
    # another size and other weights: the same kind of workload, compiled already (numba specializes on types)
    cg3 = opsnn.compile(_chain(rng, hw=24))
    cg3.run({"x": np.ones((1, 16, 24, 24), np.float32)})
    assert _kernel_of_3x3(cg3) == WINOGRAD, cg3.explain()
    assert tiering.status()["pending"] == 0


def test_off_compiles_the_numba_kernel_in_the_foreground(rng, cold_cache, monkeypatch):
    monkeypatch.setenv("OPSNN_TIERED", "0")
    cg = opsnn.compile(_chain(rng))
    cg.run({"x": np.ones((1, 16, 20, 20), np.float32)})
    assert _kernel_of_3x3(cg) == WINOGRAD, cg.explain()
    assert tiering.status()["pending"] == 0


def test_a_failed_background_compile_is_logged_not_raised(cold_cache, caplog):
    job = {
        "marker": str(cold_cache / "bogus"),
        "op": "BlockedConv",
        "domain": "opsnn",
        "kernel": "no_such_kernel",
        "metas": [((1, 16, 4, 4), "<f4"), ((16, 16, 3, 3), "<f4")],
        "values": [None, None],
        "attrs": {},
        "num_outputs": 1,
    }
    with caplog.at_level(logging.WARNING, logger="opsnn.tiering"):
        tiering._background.submit(str(cold_cache / "bogus"), pickle.dumps(job))
        assert tiering.wait(300)
    assert any("no_such_kernel" in m for m in tiering.status()["failed"].values())
    assert any(
        "background compile failed" in r.getMessage() and "no_such_kernel" in r.getMessage() for r in caplog.records
    )
    assert not os.path.exists(cold_cache / "bogus")


def test_the_background_process_ends_with_its_parent(tmp_path):
    script = textwrap.dedent(
        """
        import numpy as np, opsnn
        from opsnn.ops import tiering
        g = __import__("test_tiering")._chain(np.random.default_rng(0))
        cg = opsnn.compile(g)
        cg.run({"x": np.ones((1, 16, 20, 20), np.float32)})
        import time
        for _ in range(600):
            if tiering.status()["pid"]:
                break
            time.sleep(0.05)
        print(tiering.status()["pid"], flush=True)
        """
    )
    env = dict(
        os.environ,
        OPSNN_KERNEL_CACHE_DIR=str(tmp_path / "kernels"),
        OPSNN_TIERED="1",
        PYTHONPATH=os.pathsep.join([SRC, os.path.dirname(os.path.abspath(__file__))]),
    )
    env.pop("NUMBA_CACHE_DIR", None)
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    pid = int(r.stdout.split()[-1])
    notices = [ln for ln in r.stderr.splitlines() if ln.startswith("opsnn: compiling numba kernels in the background")]
    assert len(notices) == 1, r.stderr
    with pytest.raises(ProcessLookupError):  # terminated at the parent's exit (and reaped by init)
        for _ in range(100):
            os.kill(pid, 0)
            subprocess.run(["sleep", "0.1"])


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [-1, 1])
def test_the_numpy_softmax_agrees_with_the_compiled_one_and_the_oracle(rng, op, axis):
    # rows with a NaN, a +Inf, a -Inf, all -Inf, and finite ones; float64 oracle, float32 tolerance
    x = (rng.standard_normal((5, 7, 3)) * 4).astype(np.float32)
    x[0, 2, 0], x[1, 3, 1], x[2, 1, 2] = np.nan, np.inf, -np.inf
    x[3, :, 0] = -np.inf
    want = opsnn.ops.registry.get_op(op).reference([x], {"axis": axis})
    fn = opsnn.ops.log_softmax if op == "LogSoftmax" else opsnn.ops.softmax
    prefix = "log_softmax" if op == "LogSoftmax" else "softmax"
    for name in (f"{prefix}_numpy", f"{prefix}_online"):
        with opsnn.kernel_selector({op: name}):
            y = fn(x, axis=axis).numpy()
        np.testing.assert_array_equal(np.isnan(y), np.isnan(want), err_msg=name)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6, err_msg=name)


def _kernels(cg) -> dict:
    """op type -> the kernel its (single) node runs, from ``explain``."""
    out = {}
    for ln in cg.explain().splitlines():
        for op in ("Gemm", "Softmax"):
            if f"({op}): " in ln:
                out[op] = ln.split(f"({op}): ")[1].split()[0]
    return out


def test_a_cold_softmax_and_one_row_gemm_take_their_library_kernels(rng, cold_cache):
    x = rng.standard_normal((1, 64)).astype(np.float32)
    g = Graph(
        "head",
        inputs=[Value("x", np.float32, (1, 64))],
        outputs=["y"],
        nodes=[Node("Gemm", ["x", "w", "b"], ["z"], {"transB": 1}), Node("Softmax", ["z"], ["y"])],
        initializers={
            "w": rng.standard_normal((10, 64)).astype(np.float32),
            "b": rng.standard_normal(10).astype(np.float32),
        },
    )
    want = opsnn.graph.run(g, {"x": x})["y"]
    want = want.numpy() if hasattr(want, "numpy") else want
    # (the switch once compiled is the conv chain's test: this one does not wait for the compile)
    cg = opsnn.compile(g)
    got = cg.run({"x": x})["y"].numpy()
    assert _kernels(cg) == {"Gemm": "gemm_onednn", "Softmax": "softmax_numpy"}, cg.explain()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    with opsnn.kernel_selector(Gemm="gemm_vector", Softmax="softmax_online"):
        cg = opsnn.compile(g)
        np.testing.assert_allclose(cg.run({"x": x})["y"].numpy(), want, rtol=1e-5, atol=1e-7)


def test_after_opsnn_warmup_a_tiered_compile_picks_the_numba_kernel_at_once(tmp_path, cold_cache):
    from opsnn.graph.serialize import save

    g = Graph("sm", inputs=[Value("x", np.float32, (2, 50))], outputs=["y"], nodes=[Node("Softmax", ["x"], ["y"])])
    model = save(g, str(tmp_path / "sm.onnx"))
    env = dict(os.environ, PYTHONPATH=SRC)  # the cold cache dir, tiering on: warmup turns it off itself
    r = subprocess.run(
        [sys.executable, "-m", "opsnn.cli", "warmup", model], env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr
    assert "in the background" not in r.stderr
    assert os.listdir(os.path.join(opsnn.runtime.kernel_cache.target_dir(), "tiered"))
    cg = opsnn.compile(opsnn.onnx.load(model))
    x = np.random.default_rng(0).standard_normal((2, 50)).astype(np.float32)
    np.testing.assert_allclose(cg.run({"x": x})["y"].numpy(), _softmax64(x), rtol=1e-5, atol=1e-7)
    assert _kernels(cg) == {"Softmax": "softmax_online"}, cg.explain()
    assert tiering.status()["pending"] == 0


def _softmax64(x):
    e = np.exp(x.astype(np.float64) - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_cold_eager_add_and_attention_run_their_numpy_and_blas_kernels(rng, cold_cache):
    a = rng.standard_normal((4, 1, 6)).astype(np.float32)
    b = rng.standard_normal((3, 6)).astype(np.float32)
    a[0, 0, 1], a[1, 0, 2], b[2, 3] = np.nan, np.inf, -np.inf
    ex = opsnn.aclnn.add.prepare(a, b)
    assert ex.kernel_name == "binary_numpy" and "tiered: binary_numba (priority 10) not compiled yet" in ex.reason, (
        ex.reason
    )
    np.testing.assert_array_equal(ex.run().numpy(), a + b)  # IEEE sums: the same bits either way
    with opsnn.kernel_selector(Add="binary_numba"):
        np.testing.assert_array_equal(opsnn.ops.add(a, b).numpy(), a + b)

    q, k, v = (rng.standard_normal((1, 4, 9, 8)).astype(np.float32) for _ in range(3))
    mask = np.zeros((9, 9), np.float32)
    mask[:, 7:] = -np.inf  # masked keys
    q[0, 1, 2, 3] = np.nan
    rec = opsnn.ops.registry.get_op("Attention")
    want = rec.reference([q, k, v, mask], rec.bind_attrs({"is_causal": 1}))
    ex = opsnn.aclnn.attention.prepare(q, k, v, mask, is_causal=True)
    assert (
        ex.kernel_name == "attention_blas" and "tiered: attention_gemm (priority 25) not compiled yet" in ex.reason
    ), ex.reason
    got = ex.run()
    got = (got[0] if isinstance(got, tuple) else got).numpy()
    with opsnn.kernel_selector(Attention="attention_gemm"):
        compiled = opsnn.ops.attention(q, k, v, mask, is_causal=True)
    compiled = (compiled[0] if isinstance(compiled, tuple) else compiled).numpy()
    want = want[0] if isinstance(want, (list, tuple)) else want
    for y in (got, compiled):
        np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_a_kernel_run_through_the_adapter_is_not_tiered(rng, cold_cache):
    """A broadcast bfloat16 Add runs binary_numba through the fp32 adapter: its background compile would
    plan binary_numba on bf16 itself (a DTypeError), so the stand-in would stay for the whole process."""
    import ml_dtypes

    a = rng.standard_normal((4, 1, 6)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((3, 6)).astype(ml_dtypes.bfloat16)
    ex = opsnn.aclnn.add.prepare(a, b)
    assert ex.kernel_name == "binary_numba" and "tiered" not in ex.reason, ex.reason
    want = (a.astype(np.float32) + b.astype(np.float32)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(np.asarray(ex.run().numpy()).view(np.uint16), want.view(np.uint16))
    assert not tiering._background.failed


def test_a_persisted_plan_keeps_the_numba_kernel_not_its_stand_in(rng, cold_cache, tmp_path):
    g = _chain(rng)
    cg = opsnn.compile(g, cache_dir=str(tmp_path / "graphs"))
    cg.run({"x": np.ones((1, 16, 20, 20), np.float32)})
    assert _kernel_of_3x3(cg) == DIRECT
    with open(os.path.join(cg.persist(), "plans.json")) as f:
        kernels = json.load(f)["kernels"]
    assert list(kernels.values()).count(WINOGRAD) == 1, kernels  # the 3x3 conv's (the 1x1 one's is DIRECT)
    # reloaded while still cold: tiering decides again (the persisted choice is not forced)
    cg2 = opsnn.compile(g, cache_dir=str(tmp_path / "graphs"))
    assert cg2.loaded_from_cache
    cg2.run({"x": np.ones((1, 16, 20, 20), np.float32)})
    assert _kernel_of_3x3(cg2) == DIRECT, cg2.explain()


def test_the_numpy_tanh_agrees_with_the_numba_one_and_the_oracle(rng, cold_cache):
    x = (rng.standard_normal((3, 70)) * 5).astype(np.float32)
    x[0, :3] = np.nan, np.inf, -np.inf
    want = np.tanh(x.astype(np.float64))
    ex = opsnn.aclnn.tanh.prepare(x)
    assert ex.kernel_name == "tanh_numpy" and "tiered: tanh_numba (priority 10) not compiled yet" in ex.reason
    got = {"tanh_numpy": ex.run().numpy()}
    with opsnn.kernel_selector(Tanh="tanh_numba"):
        got["tanh_numba"] = opsnn.ops.tanh(x).numpy()
    for name, y in got.items():
        np.testing.assert_array_equal(np.isnan(y), np.isnan(want), err_msg=name)
        np.testing.assert_allclose(y, want, rtol=2e-6, atol=1e-7, err_msg=name)


def _bert_ffn_in(rng, vocab=12, d=16, f=24, seq=6):
    # BERT's cold trio: embedding Gather -> LayerNorm -> the FFN product + bias + exact-erf Gelu
    init = {
        "table": rng.standard_normal((vocab, d)).astype(np.float32),
        "gamma": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
        "beta": (0.1 * rng.standard_normal(d)).astype(np.float32),
        "w": (rng.standard_normal((d, f)) * 0.3).astype(np.float32),
        "b": rng.standard_normal(f).astype(np.float32),
    }
    init["table"][3, 5] = np.nan  # a NaN row after the norm
    init["b"][:3] = np.inf, -np.inf, -7.0  # Gelu(+inf) = inf, Gelu(-inf) = NaN, a far tail
    nodes = [
        Node("Gather", ["table", "ids"], ["e"]),
        Node("LayerNormalization", ["e", "gamma", "beta"], ["h"], {"epsilon": 1e-5}),
        Node("FusedMatMul", ["h", "w", "b"], ["y"], {"activation": "Gelu"}, domain="opsnn"),
    ]
    g = Graph("ffn", inputs=[Value("ids", np.int64, (1, seq))], outputs=["y"], nodes=nodes, initializers=init)
    return g, init


def _bert_ffn_want(init, ids):
    import math

    e = init["table"].astype(np.float64)[ids]
    with np.errstate(invalid="ignore"):
        mu = e.mean(-1, keepdims=True)
        h = (e - mu) / np.sqrt(((e - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * init["gamma"] + init["beta"]
        z = h.astype(np.float32).astype(np.float64) @ init["w"].astype(np.float64) + init["b"]
        erfc = np.vectorize(math.erfc, otypes=[np.float64])
        return z * 0.5 * erfc(-z / math.sqrt(2.0))


def _ffn_kernels(cg) -> dict:
    out = {}
    for ln in cg.explain().splitlines():
        for op in ("Gather", "LayerNormalization", "opsnn::FusedMatMul"):
            if f"({op}): " in ln:
                out[op] = ln.split(f"({op}): ")[1].split()[0]
    return out


def test_a_cold_bert_ffn_runs_numpy_gather_norm_and_gelu_then_the_numba_kernels(rng, cold_cache):
    g, init = _bert_ffn_in(rng)
    ids = np.array([[1, 3, 0, 11, 7, 3]])
    want = _bert_ffn_want(init, ids)
    assert np.isnan(want).any() and np.isposinf(want).any() and np.isfinite(want).any()

    cg = opsnn.compile(g)
    got = cg.run({"ids": ids})["y"].numpy()
    # oneDNN's matmul with the Gelu in numpy, or where MKL is the GEMM library its panel and the numpy epilogue
    mm = "matmul_onednn" if KL.epilogue_product_rejection(np.float32) is None else "matmul_epilogue"
    assert _ffn_kernels(cg) == {
        "Gather": "gather_numpy",
        "LayerNormalization": "layer_norm_numpy",
        "opsnn::FusedMatMul": mm + "_numpy",
    }, cg.explain()
    for numba_kernel in ("gather_rows", "layer_norm_numba", mm):
        assert f"tiered: {numba_kernel} (priority" in cg.explain(), cg.explain()
    assert tiering.wait(600), tiering.status()
    assert not tiering.status()["failed"], tiering.status()
    cg2 = opsnn.compile(g)
    compiled = cg2.run({"ids": ids})["y"].numpy()
    assert _ffn_kernels(cg2) == {
        "Gather": "gather_rows",
        "LayerNormalization": "layer_norm_numba",
        "opsnn::FusedMatMul": mm,
    }, cg2.explain()
    for name, y in (("cold", got), ("compiled", compiled)):
        np.testing.assert_array_equal(np.isnan(y), np.isnan(want), err_msg=name)
        np.testing.assert_array_equal(np.isposinf(y), np.isposinf(want), err_msg=name)
        np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-5, err_msg=name)
    with pytest.raises(opsnn.errors.KernelError, match=r"Gather: index 12 at position \(0, 1\) is out of range"):
        cg.run({"ids": np.array([[1, 12, 0, 0, 0, 0]])})


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", ["Gelu", "Relu", ""])
def test_the_numpy_epilogue_and_norms_agree_with_the_numba_kernels_and_the_oracle(rng, dtype, act):
    # the stand-ins forced through kernel_selector, each against the op's float64 reference and the
    # numba kernel it stands in for: NaN, +-Inf and a far tail in the pre-activations
    a = rng.standard_normal((5, 8)).astype(dtype)
    w = (rng.standard_normal((8, 12)) * 0.5).astype(dtype)
    b = rng.standard_normal(12).astype(dtype)
    a[1, 2] = np.nan
    b[:3] = np.inf, -np.inf, -9.0
    rec = opsnn.ops.registry.get_op("FusedMatMul", "opsnn")
    attrs = rec.bind_attrs({"activation": act})
    with np.errstate(invalid="ignore"):
        want = rec.reference([a, w, b], attrs)
    kernels = ["matmul_epilogue_numpy", "matmul_epilogue"]
    if dtype == np.float32 and act:
        kernels += ["matmul_onednn_numpy", "matmul_onednn"]
    if dtype == np.float32:
        kernels.append("matmul_packed")  # AVX2 without MKL; its stand-in is matmul_epilogue_numpy
    for name in kernels:
        y = _run_kernel(rec, [a, w, b], {"activation": act}, name)
        np.testing.assert_array_equal(np.isnan(y), np.isnan(want), err_msg=name)
        np.testing.assert_allclose(y, want, rtol=3e-6 if dtype == np.float32 else 1e-12, atol=1e-6, err_msg=name)

    x = (rng.standard_normal((4, 3, 10)) * 3 + 5).astype(dtype)
    x[0, 1, 4], x[2, 0, 0] = np.nan, np.inf
    scale, bias = rng.standard_normal(10).astype(dtype), rng.standard_normal(10).astype(dtype)
    for op, ins, names in (
        ("LayerNormalization", [x, scale, bias], ("layer_norm_numpy", "layer_norm_numba")),
        ("RMSNormalization", [x, scale], ("rms_norm_numpy", "rms_norm_numba")),
    ):
        ref = opsnn.ops.registry.get_op(op)
        with np.errstate(invalid="ignore"):
            want = ref.reference(ins, ref.bind_attrs({}))
        want = want[0] if isinstance(want, (list, tuple)) else want
        for name in names:
            with opsnn.kernel_selector({op: name}):
                if op == "LayerNormalization":
                    y = opsnn.ops.layer_norm(x, (10,), scale, bias, eps=1e-5)
                else:
                    y = opsnn.ops.rms_norm(x, (10,), scale, eps=1e-5)
            y = (y[0] if isinstance(y, (list, tuple)) else y).numpy()
            np.testing.assert_array_equal(np.isnan(y), np.isnan(want), err_msg=name)
            np.testing.assert_allclose(y, want, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-5, err_msg=name)


def _run_kernel(rec, arrays, attrs, name):
    """``rec`` run once by kernel ``name`` (forced), the inputs after the first known at prepare time."""
    from opsnn.ops.executor import Executor, plan_op
    from opsnn.ops.registry import TensorMeta
    from opsnn.tensor import as_tensor

    metas = [TensorMeta(x.shape, x.dtype) for x in arrays]
    op = plan_op(rec, metas, [None, *arrays[1:]], attrs, algo=name)
    assert op.selection.kernel.name == name
    outs = [as_tensor(np.empty(tuple(m.shape), m.dtype)) for m in op.ctx.outputs]
    Executor(rec, op.ctx, op.selection, op.plan, op.workspace_size, [as_tensor(x) for x in arrays], outs, ()).run()
    return outs[0].numpy()
