"""bfloat16 kernels on MKL's bf16 GEMM (conv_mkl_bf16, conv_epilogue_mkl_bf16, matmul/gemm/linear
_mkl_bf16, matmul_epilogue_mkl_bf16) and the fp32 <-> bf16 Cast, against float64 oracles on the
same bf16-rounded inputs."""

import ml_dtypes
import numpy as np
import pytest

import opsnn
from opsnn.errors import KernelNotFoundError
from opsnn.kernels.cpu import libraries as KL
from opsnn.kernels.cpu import mkl as KM
from opsnn.kernels.cpu import onednn as KD
from opsnn.ops.executor import plan_op
from opsnn.ops.registry import TensorMeta, get_op

BF16 = np.dtype(ml_dtypes.bfloat16)
needs_bf16 = pytest.mark.skipif(KM.bf16_unavailable() is not None, reason=f"MKL bf16: {KM.bf16_unavailable()}")


def _bf(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(BF16)


def _run(op, arrays, constant, attrs, want_kernel, domain="", force=False):
    """Plan ``op`` on bf16 ``arrays`` (``constant``: indices known at prepare), check the chosen
    kernel (``force``: run ``want_kernel`` whichever is chosen) and run it; returns the bf16
    output and the float64 oracle on the same inputs."""
    rec = get_op(op, domain)
    metas = [None if a is None else TensorMeta(a.shape, a.dtype) for a in arrays]
    values = [a if i in constant else None for i, a in enumerate(arrays)]
    planned = plan_op(rec, metas, values, attrs)
    k, plan, ws_size = planned.selection.kernel, planned.plan, planned.workspace_size
    if force:
        k = next(k for k in rec.kernels if k.name == want_kernel)
        assert k.check(planned.ctx) is None
        plan = k.plan(planned.ctx) if k.plan else None
        ws_size = k.workspace(planned.ctx, plan) if k.workspace else 0
    assert k.name == want_kernel, planned.selection.reason
    out = np.full(planned.ctx.outputs[0].shape, np.nan, np.float32).astype(BF16)
    ws = np.empty(max(ws_size, 1), np.uint8)
    k.fn(arrays, [out], planned.ctx.attrs, plan, ws)
    wide = [None if a is None else a.astype(np.float64) for a in arrays]
    want = rec.reference([None if a is None else a.astype(np.float32) for a in arrays], planned.ctx.attrs)
    return out, np.asarray(want, np.float64), wide


def _close_bf16(y, want):
    # one rounding of the fp32-accumulated result to bfloat16: 2**-8 relative, plus the fp32
    # accumulation order against the float64 oracle
    assert y.shape == want.shape
    scale = max(np.abs(want).max(initial=0.0), 1e-6)
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=2**-8, atol=2e-3 * scale)


@needs_bf16
@pytest.mark.parametrize(
    "xshape,wshape,attrs",
    [
        ((1, 16, 9, 9), (8, 16, 1, 1), {}),  # 1x1: the image is the column matrix
        ((2, 16, 9, 7), (12, 16, 3, 3), {"pads": [1, 1, 1, 1]}),  # im2col, batch 2
        ((1, 3, 23, 23), (8, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),  # stem-like
        ((1, 8, 5, 5), (4, 8, 3, 3), {"strides": [3, 3], "pads": [2, 2, 2, 2]}),  # stride > kernel, pad > k/2
        ((1, 8, 1, 1), (4, 8, 3, 3), {"pads": [1, 1, 1, 1]}),  # 1x1 image
        ((2, 6, 17), (5, 6, 3), {"pads": [1, 1], "dilations": [2]}),  # 1-D, dilated
        ((1, 16, 14, 14), (16, 16, 1, 1), {"strides": [2, 2]}),  # strided 1x1 goes through im2col
    ],
)
@pytest.mark.parametrize("bias", [False, True])
def test_bf16_conv_matches_oracle(rng, xshape, wshape, attrs, bias):
    x, w = _bf(rng, xshape), _bf(rng, wshape, 0.2)
    arrays = [x, w] + ([_bf(rng, wshape[:1])] if bias else [])
    y, want, _ = _run("Conv", arrays, {1, 2}, attrs, "conv_mkl_bf16")
    assert y.dtype == BF16
    _close_bf16(y, want)


@needs_bf16
def test_bf16_1x1_conv_bounds_its_accumulator(rng, monkeypatch):
    # a 1x1 conv multiplies the image's columns a block at a time so the float32 accumulator
    # stays within BAND_BYTES: here 3 blocks of 100 positions (the last one short)
    from opsnn.kernels.cpu import conv as KC

    monkeypatch.setattr(KC, "BAND_BYTES", 4 * 6 * 100)
    x, w, b = _bf(rng, (2, 5, 16, 16)), _bf(rng, (6, 5, 1, 1)), _bf(rng, (6,))
    z = _bf(rng, (2, 6, 16, 16))
    attrs = {"activation": "Relu", "activation_alpha": 0.0, "activation_beta": 0.0}
    y, want, _ = _run("FusedConv", [x, w, b, z], {1, 2}, attrs, "conv_epilogue_mkl_bf16", domain="opsnn")
    _close_bf16(y, want)
    plan = KC.conv_plan(x.shape, w.shape, 1, (1, 1), (1, 1), (1, 1), (0, 0), (0, 0), (16, 16), 2, "gemm1x1")
    assert KC.bf16_workspace_bytes(plan) < 4 * 6 * 256


@needs_bf16
def test_bf16_im2col_bands_bound_the_accumulator_too(rng, monkeypatch):
    # many output channels over few input channels: the float32 accumulator (M x band) would
    # outgrow the bf16 column buffer; the plan narrows the band for it
    from opsnn.kernels.cpu import conv as KC

    monkeypatch.setattr(KC, "BAND_BYTES", 4 * 32 * 12 * 3)  # 3 output rows of 12 for 32 channels
    x, w = _bf(rng, (1, 2, 12, 12)), _bf(rng, (32, 2, 3, 3), 0.2)
    y, want, _ = _run("Conv", [x, w], {1}, {"pads": [1, 1, 1, 1]}, "conv_mkl_bf16")
    _close_bf16(y, want)
    rec = get_op("Conv")
    planned = plan_op(
        rec, [TensorMeta(x.shape, x.dtype), TensorMeta(w.shape, w.dtype)], [None, w], {"pads": [1, 1, 1, 1]}
    )
    assert planned.plan.conv.band == 3 and planned.workspace_size <= KC.BAND_BYTES + 4096


@needs_bf16
@pytest.mark.parametrize("activation", ["Relu", "", "Sigmoid", "LeakyRelu"])
@pytest.mark.parametrize("residual", [False, True])
def test_bf16_fused_conv_epilogue(rng, activation, residual):
    # ReLU / none take the one-pass finish; other activations the three-pass one
    x, w, b = _bf(rng, (2, 16, 10, 10)), _bf(rng, (24, 16, 3, 3), 0.2), _bf(rng, (24,))
    z = _bf(rng, (2, 24, 10, 10)) if residual else None
    attrs = {"pads": [1, 1, 1, 1], "activation": activation, "activation_alpha": 0.1, "activation_beta": 0.0}
    y, want, _ = _run("FusedConv", [x, w, b, z], {1, 2}, attrs, "conv_epilogue_mkl_bf16", domain="opsnn")
    _close_bf16(y, want)


@needs_bf16
def test_bf16_conv_needs_a_constant_weight_and_group_1(rng):
    x, w = _bf(rng, (1, 8, 6, 6)), _bf(rng, (8, 8, 3, 3))
    rec = get_op("Conv")
    metas = [TensorMeta(x.shape, x.dtype), TensorMeta(w.shape, w.dtype)]
    # asked for by name: a higher-priority kernel (oneDNN's native bf16 conv_onednn_plain) may run these first
    with pytest.raises(KernelNotFoundError, match="conv_mkl_bf16' does not apply: the weight is not a constant"):
        plan_op(rec, metas, [None, None], {"pads": [1, 1, 1, 1]}, algo="conv_mkl_bf16")
    wg = _bf(rng, (8, 4, 3, 3))
    with pytest.raises(KernelNotFoundError, match="conv_mkl_bf16' does not apply: group 1 only"):
        attrs = {"pads": [1, 1, 1, 1], "group": 2}
        plan_op(rec, [metas[0], TensorMeta(wg.shape, wg.dtype)], [None, wg], attrs, algo="conv_mkl_bf16")
    # float32 keeps its kernels
    x32 = x.astype(np.float32)
    planned = plan_op(
        rec,
        [TensorMeta(x32.shape, x32.dtype), TensorMeta(w.shape, np.dtype(np.float32))],
        [None, w.astype(np.float32)],
        {"pads": [1, 1, 1, 1]},
    )
    assert "bf16" not in planned.selection.kernel.name


@needs_bf16
@pytest.mark.parametrize("ashape,n", [((5, 64), 32), ((1, 2048), 100), ((2, 3, 40), 7), ((0, 16), 4)])
def test_bf16_matmul_linear_gemm_match_oracle(rng, ashape, n):
    a = _bf(rng, ashape)
    k = ashape[-1]
    w, b = _bf(rng, (n, k), 0.2), _bf(rng, (n,))
    y, want, _ = _run("MatMul", [a, np.ascontiguousarray(w.T)], {1}, {}, "matmul_mkl_bf16")
    _close_bf16(y, want)
    y, want, _ = _run("Linear", [a, w, b], {1, 2}, {}, "linear_mkl_bf16", domain="opsnn")
    _close_bf16(y, want)
    if len(ashape) == 2:
        attrs = {"transB": 1, "alpha": 0.5, "beta": 2.0}
        y, want, _ = _run("Gemm", [a, w, b], {1, 2}, attrs, "gemm_mkl_bf16")
        _close_bf16(y, want)
        # C known only at run time (full shape, beta 1): added in the fp32 epilogue (oneDNN's
        # matmul takes this one where it has native bf16 code: tests/test_onednn_matmul.py)
        c = _bf(rng, (ashape[0], n))
        y, want, _ = _run("Gemm", [a, w, c], {1}, {"transB": 1}, "gemm_mkl_bf16", force=True)
        _close_bf16(y, want)


@needs_bf16
@pytest.mark.parametrize("activation", ["Relu", "Gelu"])
def test_bf16_fused_matmul_epilogue(rng, activation):
    a, w, b, z = _bf(rng, (6, 48)), _bf(rng, (48, 20), 0.2), _bf(rng, (20,)), _bf(rng, (6, 20))
    attrs = {"activation": activation, "activation_alpha": 0.0, "activation_beta": 0.0}
    # oneDNN's bf16 matmul where it has native bf16 kernels, else MKL's bf16 GEMM; both checked
    chosen = (
        "matmul_onednn"
        if KD.matmul_unavailable() is None and KD.bf16_unavailable() is None
        else "matmul_epilogue_mkl_bf16"
    )
    y, want, _ = _run("FusedMatMul", [a, w, b, z], {1, 2}, attrs, chosen, domain="opsnn")
    _close_bf16(y, want)
    y, want, _ = _run(
        "FusedMatMul", [a, w, b, z], {1, 2}, attrs, "matmul_epilogue_mkl_bf16", domain="opsnn", force=True
    )
    _close_bf16(y, want)


def test_cast_float32_bfloat16_is_bitwise_ml_dtypes(rng):
    x = (rng.standard_normal(70001) * 1e3).astype(np.float32)
    x[:9] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 3.4e38, 1e-40, -1e-45, 1.0 + 2**-8]  # overflow, subnormals, a tie
    y = opsnn.ops.cast(opsnn.tensor(x), "bfloat16").numpy()
    want = x.astype(BF16)
    assert y.dtype == BF16
    assert np.isnan(y[0].astype(np.float32))
    np.testing.assert_array_equal(y.view(np.uint16)[1:], want.view(np.uint16)[1:])
    back = opsnn.ops.cast(opsnn.tensor(want), "float32").numpy()
    np.testing.assert_array_equal(back.view(np.uint32)[1:], want.astype(np.float32).view(np.uint32)[1:])
    assert np.isnan(back[0])


def _chosen_kernels(explain: str) -> set:
    """The kernels an explain text says run (``  node (Op): kernel — why; skipped ...``), not the
    ones it lists as skipped."""
    return {
        line.split("): ", 1)[1].split(" ", 1)[0]
        for line in explain.splitlines()
        if line.startswith("  ") and "): " in line
    }


@needs_bf16
@pytest.mark.isa_portable
def test_mixed_precision_resnet_block_runs_on_bf16_kernels(rng, monkeypatch):
    # a bottleneck block with 16-bit Conv/Gemm weights: every conv on MKL's bf16 GEMM, none
    # through the fp32 adapter (which widened the weights on every call), logits close to fp32
    from opsnn.graph import mixed_precision
    from opsnn.models import resnet50, to_onnx

    proto = to_onnx(resnet50(num_classes=10, seed=0)).SerializeToString()
    x = rng.standard_normal((1, 3, 64, 64)).astype(np.float32)
    y32 = opsnn.compile(opsnn.onnx.load(proto)).run({"input": x})["logits"].numpy()
    saved = mixed_precision.policy()
    try:
        opsnn.config.allow_mix_precision({"Conv": "bfloat16", "Gemm": "bfloat16", "MatMul": "bfloat16"})
        cg_onednn = opsnn.compile(opsnn.onnx.load(proto))
        # what runs where oneDNN has no native bf16 kernels: the convs stay on MKL's bf16 GEMM
        with monkeypatch.context() as mp:
            mp.setattr(KD, "bf16_unavailable", lambda: "no AVX512-BF16 (test)")
            cg = opsnn.compile(opsnn.onnx.load(proto))
            y16 = cg.run({"input": x})["logits"].numpy()  # plans (kernel choices) are made here
    finally:
        mixed_precision.set_policy(saved)
    text = cg.explain()
    chosen = _chosen_kernels(text)
    assert "conv_epilogue_mkl_bf16" in chosen and "gemm_mkl_bf16" in chosen
    assert "fp32 adapter" not in text
    assert np.abs(y16.astype(np.float64) - y32).max() / np.abs(y32).max() < 2e-2
    # with AVX512-BF16 the blocked-layout pass moves the bf16 convs to oneDNN's bf16 kernels
    y16o = cg_onednn.run({"input": x})["logits"].numpy()
    text = cg_onednn.explain()
    chosen = _chosen_kernels(text)
    assert ("conv_onednn" in chosen) == (KD.bf16_unavailable() is None) and "fp32 adapter" not in text
    assert ("gemm_onednn" in chosen) == (KD.product_unavailable(BF16) is None)
    assert np.abs(y16o.astype(np.float64) - y32).max() / np.abs(y32).max() < 2e-2


@needs_bf16
def test_bf16_epilogue_kernels_decline_a_float32_residual(rng):
    # the fusion pass only fuses same-dtype adds, but a hand-built FusedConv / FusedMatMul with a
    # float32 Z must not have its bytes read as bfloat16: the fp32 adapter kernels run it instead
    x, w = _bf(rng, (1, 8, 6, 6)), _bf(rng, (8, 8, 1, 1))
    z = rng.standard_normal((1, 8, 6, 6)).astype(np.float32)
    rec = get_op("FusedConv", "opsnn")
    metas = [TensorMeta(a.shape, a.dtype) for a in (x, w)] + [None, TensorMeta(z.shape, z.dtype)]
    planned = plan_op(rec, metas, [None, w, None, None], {"activation": "Relu"})
    assert (
        dict(planned.selection.rejected)["conv_epilogue_mkl_bf16"] == "the residual Z must be bfloat16 too, got float32"
    )


def _decoders(bf16_fast: bool):
    from opsnn.llm import CachedDecoder, KVCache

    cfg = dict(layers=2, hidden=64, heads=4, kv_heads=2, vocab=97, max_position=64)
    lm32, lm16 = opsnn.models.llama(**cfg), opsnn.models.llama(**cfg).to("bfloat16")  # same seed: same weights
    out = []
    for lm in (lm32, lm16):
        cache = KVCache.for_model(lm, max_batch_slots=4, max_seq=32)
        dec = CachedDecoder(lm, cache)
        if lm is lm16 and not bf16_fast:
            dec._bf16 = False  # as without MKL's bf16 GEMM: the Linear op on widened weights
        out.append((lm, cache, dec))
    return out


@pytest.mark.parametrize(
    "bf16_fast,library",
    [pytest.param(True, "mkl", marks=needs_bf16), pytest.param(True, "openblas", marks=needs_bf16), (False, "mkl")],
)
def test_llama_cast_to_bfloat16_decodes_close_to_float32(rng, monkeypatch, bf16_fast, library):
    # Module.to("bfloat16") keeps the weights in bf16; the decoder keeps float32 activations and
    # KV cache, widens the norms / RoPE tables once and runs the projections on MKL's bf16 GEMM
    # (where OpenBLAS is the GEMM library: one-row steps on opsnn's bf16 matrix-vector kernel,
    # more rows on oneDNN's bf16 matmul where it has native bf16 code)
    monkeypatch.setattr(KL, "_library", library)
    (lm32, c32, d32), (lm16, c16, d16) = _decoders(bf16_fast)
    assert lm16.model.layers[0].self_attn.q_proj.weight.dtype == BF16
    prompt = rng.integers(0, 97, (2, 9))
    want, got = [], []
    for cache, dec, res in ((c32, d32, want), (c16, d16, got)):
        slots = [cache.allocate(), cache.allocate()]
        res.append(dec.forward(prompt, slots, [0, 0]))  # prefill (eager)
        res.append(dec.forward(np.array([[3], [5]]), slots, [9, 9]))  # decode (prepared step)
        res.append(dec.prefill([(np.array([7, 8]), slots[0], 10), (np.array([1]), slots[1], 10)]))
        assert cache.keys[0].dtype == np.float32
    for w, g in zip(want, got):
        assert g.dtype == np.float32
        assert np.abs(g - w).max() / np.abs(w).max() < 3e-2


@needs_bf16
@pytest.mark.parametrize("library,one_row", [("mkl", "llm_linear_mkl_bf16"), ("openblas", "llm_linear_bf16_gemv")])
def test_bfloat16_decoder_projections_run_on_the_bf16_gemm(rng, monkeypatch, library, one_row):
    from opsnn.tools.profiler import profile

    monkeypatch.setattr(KL, "_library", library)
    (_, _, _), (_, cache, dec) = _decoders(True)
    slots = [cache.allocate(), cache.allocate()]
    dec.forward(rng.integers(0, 97, (1, 5)), slots[:1], [0])
    dec.forward(rng.integers(0, 97, (1, 5)), slots[1:], [0])
    with profile() as p:
        dec.forward(np.array([[4]]), slots[:1], [5])
    assert {k.kernel for k in p.kernels if k.op == "Linear"} == {one_row}
    with profile() as p:
        dec.forward(np.array([[4], [6]]), slots, [6, 5])
    # two rows and more: oneDNN's bf16 matmul where OpenBLAS is the library and oneDNN has native
    # bf16 code (MKL's bf16 GEMM is 2.5-4.5x slower there), else MKL's
    few = (
        "llm_linear_onednn_bf16"
        if library == "openblas" and KD.matmul_unavailable() is None and KD.bf16_unavailable() is None
        else "llm_linear_mkl_bf16"
    )
    assert {k.kernel for k in p.kernels if k.op == "Linear"} == {few}


@pytest.mark.parametrize("n,k", [(1, 1), (7, 33), (130, 64), (65, 0)])
def test_gemv_bf16_matches_a_float64_oracle(rng, n, k):
    """opsnn.kernels.cpu.gemm.gemv_bf16: out = W @ x (beta 0: NaN in out is not read) and
    out = W @ x + 0.5 * out, W's bfloat16 bits widened exactly, x kept in float32."""
    from opsnn.kernels.cpu.gemm import gemv_bf16

    w = _bf(rng, (n, k))
    x = rng.standard_normal(k).astype(np.float32)
    want = w.astype(np.float64) @ x.astype(np.float64)
    tol = 1e-6 * max(k, 1) ** 0.5 * max(np.abs(want).max(initial=0.0), 1.0)
    out = np.full(n, np.nan, np.float32)
    gemv_bf16(w.view(np.uint16), x, out, 0.0)
    np.testing.assert_allclose(out, want, rtol=0, atol=tol)
    prev = rng.standard_normal(n).astype(np.float32)
    out = prev.copy()
    gemv_bf16(w.view(np.uint16), x, out, 0.5)
    np.testing.assert_allclose(out, want + 0.5 * prev, rtol=0, atol=tol)


@needs_bf16
def test_mkl_products_called_first_thing_in_a_process_load_mkl():
    # gemm2d_bf16 and gemv read the loaded library: called before anything else had loaded it
    # they failed with "'NoneType' object has no attribute 'set_threads_local'"
    import subprocess
    import sys

    code = (
        "import numpy as np, ml_dtypes\n"
        "from opsnn.kernels.cpu import mkl\n"
        "a = np.ones((3, 4), ml_dtypes.bfloat16).view(np.uint16); b = np.ones((4, 5), ml_dtypes.bfloat16)\n"
        "out = np.empty((3, 5), np.float32); mkl.gemm2d_bf16(a, b.view(np.uint16), out); assert (out == 4).all()\n"
        "w = np.ones((6, 4), np.float32); y = np.empty(6, np.float32)\n"
        "mkl.gemv(w, np.ones(4, np.float32), y); assert (y == 4).all(); print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


@needs_bf16
@pytest.mark.parametrize("m,k,n", [(1, 64, 48), (5, 33, 7), (4, 0, 3)])
def test_gemm2d_bf16_alpha_beta(rng, m, k, n):
    """``out = alpha * a @ b + beta * out`` (the decoder's residual projections use beta = 1);
    beta 0 never reads ``out`` (NaN there does not survive), also with an empty K."""
    a, b = _bf(rng, (m, k)), _bf(rng, (k, n))
    ab = a.astype(np.float64) @ b.astype(np.float64)
    out = np.full((m, n), np.nan, np.float32)
    KM.gemm2d_bf16(a.view(np.uint16), b.view(np.uint16), out)
    np.testing.assert_allclose(out, ab, rtol=1e-5, atol=1e-5)
    z = rng.standard_normal((m, n)).astype(np.float32)
    out[...] = z
    KM.gemm2d_bf16(a.view(np.uint16), b.view(np.uint16), out, alpha=0.5, beta=1.0)
    np.testing.assert_allclose(out, 0.5 * ab + z, rtol=1e-5, atol=1e-5)
