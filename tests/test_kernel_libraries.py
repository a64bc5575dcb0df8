"""The kernel-library strategy (opsnn.kernels.cpu.libraries): its decisions pinned for a table of
representative workloads per ISA level and CPU vendor, and this machine's facts checked against the
model the table assumes (oneDNN's brgemm matmul from AVX-512 on, native bf16 from AVX512-BF16 on)."""

import numpy as np
import pytest

import opsnn
from opsnn import dtypes as _dt
from opsnn.errors import OpsnnError
from opsnn.kernels.cpu import libraries as KL
from opsnn.kernels.cpu import mkl as KM
from opsnn.kernels.cpu import onednn as KD
from opsnn.runtime import cpu

F32, BF16 = np.float32, opsnn.dtypes.bfloat16
AMD, INTEL = "AuthenticAMD", "GenuineIntel"
ROWS = (1, 8, 16, 48, 128, 512)


def _kernels(p, dtype, k=768, n=3072):
    return tuple(KL.projection(r, k, n, dtype, p).kernel.removeprefix("llm_linear_") for r in ROWS)


#: (level, vendor) -> decoder projection kernels for ROWS rows of a 768 -> 3072 weight, float32 and bf16
TABLE = {
    ("avx2", AMD): (
        ("rows", "rows", "rows", "packed", "packed", "packed"),
        ("bf16_gemv", "mkl_bf16", "mkl_bf16", "mkl_bf16", "mkl_bf16", "mkl_bf16"),
    ),
    ("avx512", AMD): (
        ("rows", "rows", "onednn", "onednn", "onednn", "onednn"),
        ("bf16_gemv", "mkl_bf16", "mkl_bf16", "mkl_bf16", "mkl_bf16", "mkl_bf16"),
    ),
    ("avx512_bf16", AMD): (
        ("rows", "rows", "onednn", "onednn", "onednn", "onednn"),
        ("bf16_gemv", "onednn_bf16", "onednn_bf16", "onednn_bf16", "onednn_bf16", "onednn_bf16"),
    ),
    ("avx2", INTEL): (("mkl_gemv",) + ("mkl_packed",) * 5, ("mkl_bf16",) * 6),
    ("avx512_bf16", INTEL): (("mkl_gemv",) + ("mkl_packed",) * 5, ("mkl_bf16",) * 6),
    ("amx", INTEL): (("mkl_gemv",) + ("mkl_packed",) * 5, ("mkl_bf16",) * 6),
}


@pytest.mark.parametrize("level, vendor", sorted(TABLE))
def test_projection_decisions_per_isa_and_vendor(level, vendor):
    p = KL.Platform.for_isa(level, vendor)
    f32, bf16 = TABLE[level, vendor]
    assert _kernels(p, F32) == f32
    assert _kernels(p, BF16) == bf16
    # operands oneDNN cannot read in place: the next rule in order (opsnn's kernel or OpenBLAS)
    c = KL.projection(128, 768, 3072, F32, p, contiguous=False)
    assert c.library in ("openblas", "mkl") and c.kernel != "llm_linear_onednn" and c.reason
    assert KL.mkl_gemv_in_tasks(p) == (vendor == INTEL)


@pytest.mark.parametrize("level", cpu.LEVELS[1:])
def test_other_strategies_per_isa(level):
    for vendor in (AMD, INTEL):
        p = KL.Platform.for_isa(level, vendor)
        rank = cpu.LEVELS.index(level)
        assert KL.winograd_gemms(16, p).library == ("onednn" if rank >= cpu.LEVELS.index("avx512") else "mkl")
        assert KL.winograd_gemms(KL.WINOGRAD_ONEDNN_MAX_TILES + 1, p).library == "mkl"
        assert KL.attention_gemms(p).library == "mkl" and KL.conv_gemms(p).library == "mkl"
    none = KL.Platform.for_isa(level, AMD, mkl=False, onednn=False)
    assert none.gemm_library == "openblas" and KL.projection(8, 768, 3072, F32, none).kernel == "Linear"
    assert KL.winograd_gemms(16, none).library == "openblas" and KL.attention_gemms(none).library == "openblas"
    assert KL.conv_gemms(none).library == "openblas" and "not installed" in KL.conv_gemms(none).reason


def test_blocked_winograd_gemms_per_isa():
    """Blocked Winograd's point GEMMs run on oneDNN's batched matmul from AVX2 on (gemm:jit there,
    brgemm from AVX-512 on); without oneDNN, or below AVX2, its convolutions stay direct."""
    for vendor in (AMD, INTEL):
        avx2 = KL.blocked_winograd_gemms(KL.Platform.for_isa("avx2", vendor))
        assert avx2.library == "onednn" and "gemm:jit" in avx2.reason
        for level in cpu.LEVELS[2:]:
            c = KL.blocked_winograd_gemms(KL.Platform.for_isa(level, vendor))
            assert c.library == "onednn" and "brgemm" in c.reason
        assert isinstance(KL.blocked_winograd_gemms(KL.Platform.for_isa("sse41", vendor)), str)
        for level in ("avx2", "avx512"):
            why = KL.blocked_winograd_gemms(KL.Platform.for_isa(level, vendor, onednn=False))
            assert isinstance(why, str) and "not installed" in why
    amd = KL.Platform.for_isa("avx2", AMD)
    assert "gemm:jit" in KL.kernel_choice("conv_winograd_blocked", 196, 64, 64, F32, p=amd).reason


def test_conv_chain_layout_per_isa(monkeypatch):
    """Convolution chains run nhwc on Intel from AVX-512 on (oneDNN's brgemm convolutions), nChw16c on other
    AVX-512 CPUs, nChw8c under AVX2, none without oneDNN or below AVX2; OPSNN_ONEDNN_LAYOUT overrides where
    the ISA runs the layout, a typo is one error line."""
    monkeypatch.delenv("OPSNN_ONEDNN_LAYOUT", raising=False)
    for vendor in (AMD, INTEL):
        assert KL.conv_chain_layout(KL.Platform.for_isa("avx2", vendor)).block == 8
        for level in cpu.LEVELS[2:]:
            c = KL.conv_chain_layout(KL.Platform.for_isa(level, vendor))
            assert (c.block, "brgemm" in c.reason) == ((0, True) if vendor == INTEL else (16, False))
        assert isinstance(KL.conv_chain_layout(KL.Platform.for_isa("sse41", vendor)), str)
        assert "not installed" in KL.conv_chain_layout(KL.Platform.for_isa("avx512", vendor, onednn=False))
    wide, avx2 = KL.Platform.for_isa("avx512", INTEL), KL.Platform.for_isa("avx2", AMD)
    for value, on_wide, on_avx2 in (("nChw16c", 16, 8), ("nchw8c", 8, 8), ("NHWC", 0, 0)):
        monkeypatch.setenv("OPSNN_ONEDNN_LAYOUT", value)
        assert (KL.conv_chain_layout(wide).block, KL.conv_chain_layout(avx2).block) == (on_wide, on_avx2)
    monkeypatch.setenv("OPSNN_ONEDNN_LAYOUT", "nchw")
    with pytest.raises(OpsnnError, match=r"OPSNN_ONEDNN_LAYOUT='nchw': expected nhwc, nChw16c or nChw8c"):
        KL.conv_chain_layout(wide)


@pytest.mark.isa_portable
def test_blocked_winograd_runs_where_the_isa_in_force_allows():
    """On this machine (or under the ISA cap): a 3x3 stride-1 conv of a blocked chain with enough
    tiles selects conv_winograd_blocked exactly where the strategy gives its GEMMs to oneDNN."""
    from opsnn.ops.executor import plan_op
    from opsnn.ops.registry import TensorMeta, get_op

    if KD.unavailable() is not None or not cpu.at_least("avx2"):
        pytest.skip(f"no blocked layout here: {KD.unavailable() or cpu.isa()}")
    rec = get_op("BlockedConv", "opsnn")
    w = np.ones((64, 64, 3, 3), np.float32)
    metas = [TensorMeta((1, 64, 56, 56), np.dtype(np.float32)), TensorMeta(w.shape, np.dtype(np.float32))]
    attrs = {"pads": [1, 1, 1, 1], "src_blocked": 1, "block": KD.block()}
    ctx = plan_op(rec, metas, [None, w], attrs, algo="reference").ctx
    why = next(k for k in rec.kernels if k.name == "conv_winograd_blocked").check(ctx)
    runs = isinstance(KL.blocked_winograd_gemms(), KL.Choice)
    assert (why is None) == runs, (cpu.isa(), why)
    assert runs == (KD.matmul_unavailable() is None or cpu.isa() == "avx2")


def test_packed_panel_rejection_thresholds():
    amd, intel = KL.Platform.for_isa("avx2", AMD), KL.Platform.for_isa("avx2", INTEL)
    assert KL.packed_panel_rejection(512, 768, 4096, intel) is None
    why = KL.packed_panel_rejection(512, 768, 4096, amd)
    assert "512 x 768 x 4096" in why and "OPSNN_GEMM=mkl" in why
    # OpenBLAS' AVX-512 kernels: MKL's packed panel below 64 rows or 2^27 multiply-adds
    wide = KL.Platform.for_isa("avx512", AMD, onednn=False)
    assert KL.packed_limits(wide) == (KL.PACKED_MAX_ROWS_ELSEWHERE, KL.PACKED_MAX_MACS_ELSEWHERE) == (64, 1 << 27)
    assert KL.packed_panel_rejection(63, 4096, 4096, wide) is None
    assert KL.packed_panel_rejection(128, 768, 768, wide) is None  # 75M multiply-adds
    assert KL.packed_panel_rejection(128, 768, 3072, wide) is not None
    # its Haswell kernels (AVX2 in force): OpenBLAS from 32 rows whatever the size
    assert KL.packed_limits(amd) == (KL.PACKED_MAX_ROWS_AVX2, KL.PACKED_MAX_MACS_AVX2) == (32, 0)
    assert KL.packed_panel_rejection(31, 4096, 4096, amd) is None
    assert KL.packed_panel_rejection(32, 768, 768, amd) is not None
    assert KL.packed_panel_rejection(128, 768, 768, amd) is not None
    assert KL.kernel_choice("matmul_mkl_packed", 8, 768, 768, F32, p=amd).reason.endswith("fewer than 32 rows")


@pytest.mark.isa_portable
def test_packed_limits_follow_the_isa_in_force():
    """The limits this process uses are the ones for the level it detects (or is capped to)."""
    want = (32, 0) if cpu.isa() == "avx2" else (64, 1 << 27)
    assert KL.packed_limits() == KL.packed_limits(KL.platform()) == want


@pytest.mark.isa_portable
def test_this_machine_matches_the_model_of_its_isa():
    """The facts gathered here (oneDNN's own answers, under the ISA cap) are what the table assumes
    for the level in force, so the table's rows are the ones that run."""
    p = KL.platform()
    assert p.isa == cpu.isa()
    if KD.unavailable() is None and p.isa is not None and cpu.at_least("avx2"):
        model = KL.Platform.for_isa(p.isa, AMD)
        assert (p.onednn_matmul is None) == (model.onednn_matmul is None), (p, model)
        assert (p.onednn_bf16 is None) == (model.onednn_bf16 is None), (p, model)
        assert KD.block() == (16 if cpu.at_least("avx512") else 8)
        assert p.onednn_block == KL.Platform.for_isa(p.isa, AMD).onednn_block == KD.block()
    assert (p.mkl is None) == (KM.unavailable() is None)
    assert p.gemm_library in ("mkl", "openblas") and KL.gemm_library_why()
    line = KL.summary()
    assert line.startswith(f"ISA {cpu.isa()}") and "GEMM" in line and "\n" not in line


def test_product_kernels_name_their_library_per_vendor():
    """What ``opsnn explain`` prints per product shape: the library each registered product kernel
    runs on, with the strategy's reason, on a modelled AMD (OpenBLAS the GEMM library) and Intel CPU."""
    amd, intel = KL.Platform.for_isa("avx2", AMD), KL.Platform.for_isa("avx512", INTEL)
    none = KL.Platform.for_isa("avx2", AMD, mkl=False, onednn=False)
    lib = lambda kernel, p, rows=128, dtype=F32, batch=1, **kw: (
        KL.kernel_choice(  # noqa: E731
            kernel, rows, 768, 768, dtype, batch=batch, p=p, **kw
        ).library
    )
    for kernel in ("matmul_blas", "gemm_blas", "linear_blas", "conv2d_im2col", "conv_1x1_gemm"):
        assert (lib(kernel, amd), lib(kernel, intel), lib(kernel, none)) == ("openblas", "mkl", "openblas")
        assert lib(kernel, amd, dtype=np.float64) == lib(kernel, intel, dtype=np.float64) == "openblas"
    # a batch of mid-sized products goes to MKL's batched GEMM even where OpenBLAS is the GEMM library
    assert lib("matmul_blas", amd, rows=16, batch=12) == "mkl"  # 16 x 768 x 768 in MKL_BATCH_MACS
    assert lib("matmul_blas", amd, rows=4096, batch=12) == "openblas"  # 4096 x 768 x 768 > MKL_BATCH_MACS
    for kernel in ("matmul_mkl_packed", "linear_mkl_packed", "conv2d_im2col_mkl_packed", "matmul_mkl_bf16"):
        assert lib(kernel, amd) == lib(kernel, intel) == "mkl"
    assert "fewer than" in KL.kernel_choice("matmul_mkl_packed", 8, 768, 768, F32, p=amd).reason
    assert "MKL is the GEMM library" in KL.kernel_choice("matmul_mkl_packed", 8, 768, 768, F32, p=intel).reason
    for kernel in ("matmul_onednn", "gemm_onednn", "conv_onednn", "conv_winograd_blocked"):
        assert lib(kernel, amd) == "onednn"
    assert lib("conv2d_winograd", intel, tiles=16) == "onednn" and lib("conv2d_winograd", amd, tiles=16) == "mkl"
    assert lib("conv2d_winograd", none, tiles=16) == "openblas"
    assert lib("gemm_vector", amd) == lib("conv2d_depthwise", amd) == "opsnn"
    assert lib("matmul_numpy_int", amd) == "numpy"
    assert KL.kernel_choice("relu_numba", 1, 1, 1, F32, p=amd) is None
    assert all(KL.kernel_choice(k, 1, 8, 8, F32, p=amd).reason for k in ("matmul_blas", "conv_onednn"))


#: (m, k, n) of BERT-base s128's products and the decoder prefill's stacked projections (128 rows)
BERT_PREFILL = {
    "bert proj": (128, 768, 768),
    "bert ffn1": (128, 768, 3072),
    "bert ffn2": (128, 3072, 768),
    "prefill qkv": (128, 768, 1280),
    "prefill gate+up": (128, 768, 4096),
    "prefill down": (128, 2048, 768),
}
#: vendor -> the products that leave MKL's packed panel for OpenBLAS on an AVX2-only CPU
ON_OPENBLAS_UNDER_AVX2 = {
    AMD: set(BERT_PREFILL),
    INTEL: set(),
}


@pytest.mark.parametrize("vendor", [AMD, INTEL])
def test_bert_and_prefill_products_on_an_avx2_cpu(vendor):
    """What BERT's and the prefill's constant-weight products run on where the CPU (or the
    ``OPSNN_CPU_ISA=avx2`` cap) offers AVX2 only: no oneDNN matmul (its AVX2 code is gemm:jit, not
    brgemm), so MKL's packed panel or, on AMD above the packed thresholds, OpenBLAS for graphs' plain
    products and opsnn's packed GEMM for the decoder's (OpenBLAS where its operands are views)."""
    p = KL.Platform.for_isa("avx2", vendor)
    assert p.onednn_matmul is not None and p.onednn_bf16 is not None
    for name, (m, k, n) in BERT_PREFILL.items():
        on_openblas = name in ON_OPENBLAS_UNDER_AVX2[vendor]
        assert (KL.packed_panel_rejection(m, k, n, p) is not None) == on_openblas, name
        graph = "matmul_blas" if on_openblas else "matmul_mkl_packed"
        assert KL.kernel_choice(graph, m, k, n, F32, p=p).library == ("openblas" if on_openblas else "mkl"), name
        assert KL.projection(m, k, n, F32, p).kernel == (
            "llm_linear_packed" if on_openblas else "llm_linear_mkl_packed"  # opsnn's panel, packed once
        ), name
        assert KL.projection(m, k, n, F32, p, contiguous=False).kernel == (
            "llm_linear_openblas" if on_openblas else "llm_linear_mkl_packed"
        ), name
        assert KL.weight_stays_unpacked(m, k, n, p) == on_openblas, name  # not packed for MKL
    # the same products on an AVX-512 CPU of either vendor: oneDNN's brgemm where MKL is not the library
    wide = KL.Platform.for_isa("avx512", vendor)
    assert {KL.projection(m, k, n, F32, wide).kernel for m, k, n in BERT_PREFILL.values()} == (
        {"llm_linear_onednn"} if vendor == AMD else {"llm_linear_mkl_packed"}
    )


def test_serial_epilogue_after_openblas_under_avx2():
    """The epilogue pass after a product stays on the calling thread only where OpenBLAS ran the
    product (its own threads: numba's are asleep), AVX2 is in force, the activation is cheap and
    the pass small; everywhere else fused.PARALLEL_MIN decides (AVX-512 choices unchanged)."""
    most = KL.SERIAL_EPILOGUE_AFTER_OPENBLAS
    for vendor in (AMD, INTEL):
        avx2 = KL.Platform.for_isa("avx2", vendor)
        assert KL.serial_epilogue("openblas", 128 * 768, False, avx2)
        assert KL.serial_epilogue("openblas", most, False, avx2)
        assert not KL.serial_epilogue("openblas", most + 1, False, avx2)
        assert not KL.serial_epilogue("openblas", 128 * 3072, True, avx2)  # a GELU pass: threads pay
        assert not KL.serial_epilogue("mkl", 128 * 768, False, avx2)  # numba's pool is awake after MKL
        assert not KL.serial_epilogue("onednn", 128 * 768, False, avx2)
        for level in cpu.LEVELS[cpu.LEVELS.index("avx512") :]:
            assert not KL.serial_epilogue("openblas", 128 * 768, False, KL.Platform.for_isa(level, vendor))


def _expected_under_avx2(gemm: str, act: str) -> tuple:
    """(the inner product's kernel, the epilogue's forced ``parallel`` or None) of a BERT FusedMatMul
    planned under AVX2 (forced onto matmul_epilogue) where ``gemm`` is the GEMM library: OpenBLAS' place
    taken by opsnn's packed GEMM, else MKL's packed panel; the epilogue's threads by size after either."""
    if gemm != "openblas":
        return "matmul_mkl_packed", None
    return "matmul_packed", None  # opsnn's packed GEMM on numba's threads: the epilogue's by size


def _gelu64(y):
    import math

    return y * 0.5 * (1.0 + np.vectorize(math.erf)(y / math.sqrt(2.0)))


#: BERT-base s128's fused products: (k, n, activation, residual)
BERT_FUSED = [(768, 768, "", True), (768, 3072, "Gelu", False), (3072, 768, "", True)]


@pytest.mark.isa_portable
@pytest.mark.parametrize("k, n, act, residual", BERT_FUSED)
def test_bert_fused_products_under_the_isa_in_force(k, n, act, residual):
    """BERT-base's FusedMatMul nodes as this process plans them (under OPSNN_CPU_ISA=avx2 too):
    where AVX2 is in force and OpenBLAS is the GEMM library, the product runs on opsnn's packed GEMM
    (the weight packed once; OpenBLAS would pack it every call, docs/performance.md "AVX2"), with MKL
    on MKL's packed panel and the cheap epilogues on the calling thread; the result matches a float64
    product at 2 threads."""
    import numba

    from opsnn.ops.executor import plan_op
    from opsnn.ops.registry import TensorMeta, get_op

    rng = np.random.default_rng(0)
    a = rng.standard_normal((1, 128, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    z = rng.standard_normal((1, 128, n)).astype(np.float32) if residual else None
    rec = get_op("FusedMatMul", "opsnn")
    f32 = np.dtype(np.float32)
    metas = [TensorMeta(a.shape, f32), TensorMeta(w.shape, f32), TensorMeta(b.shape, f32)]
    metas += [TensorMeta(z.shape, f32)] if residual else []
    values = [None, w, b] + ([None] if residual else [])
    attrs = {"activation": act}
    ctx = plan_op(rec, metas, values, attrs, algo="reference").ctx
    chosen = next(kk for kk in rec.kernels if kk.check(ctx) is None)  # by priority, tiering aside
    op = plan_op(rec, metas, values, attrs, algo=chosen.name)
    if cpu.isa() == "avx2" and KD.matmul_unavailable() is not None and KL.gemm_library() == "openblas":
        assert chosen.name == "matmul_packed", chosen.name  # OpenBLAS would pack the weight every call
    elif cpu.isa() == "avx2" and KD.matmul_unavailable() is not None:  # oneDNN 3.2: gemm:jit, not brgemm
        assert chosen.name == "matmul_epilogue", chosen.name
        got = (op.plan["kernel"].name, op.plan["parallel"])
        assert got == _expected_under_avx2(KL.gemm_library(), act), got
    elif chosen.name == "matmul_epilogue":  # AVX-512 and up: the epilogue's threads by size, as before
        assert op.plan["parallel"] is None
    ins = [a, w, b] + ([z] if residual else [])
    y = np.empty((1, 128, n), np.float32)
    before = numba.get_num_threads()
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    try:
        op.selection.kernel.fn(ins, [y], op.ctx.attrs, op.plan, None)
    finally:
        numba.set_num_threads(before)
    ref = a.astype(np.float64) @ w.astype(np.float64) + b
    ref = ref + z if residual else _gelu64(ref)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


_CAPPED_CHILD = """
import opsnn  # before numpy, as a user's program: OpenBLAS then gets opsnn's thread timeout
import json
import numpy as np
from opsnn.kernels.cpu import libraries as KL
from opsnn.ops.executor import plan_op
from opsnn.ops.registry import TensorMeta, get_op
from opsnn.runtime import cpu
from opsnn.kernels.cpu import onednn as KD
f32, out = np.dtype(np.float32), {"isa": cpu.isa(), "gemm": KL.gemm_library(), "plans": []}
out["brgemm"] = KD.matmul_unavailable() is None
for k, n, act, residual in %r:
    w, b = np.ones((k, n), np.float32), np.ones(n, np.float32)
    metas = [TensorMeta((1, 128, k), f32), TensorMeta((k, n), f32), TensorMeta((n,), f32)]
    metas += [TensorMeta((1, 128, n), f32)] if residual else []
    op = plan_op(get_op("FusedMatMul", "opsnn"), metas, [None, w, b, None][: len(metas)], {"activation": act},
                 algo="matmul_epilogue")
    out["plans"].append([op.plan["kernel"].name, op.plan["parallel"]])
print(json.dumps(out))
"""


@pytest.mark.skipif(not cpu.at_least("avx2"), reason="needs an AVX2 CPU to cap to AVX2")
def test_bert_fused_products_in_a_capped_process():
    """A program that imports opsnn first, under OPSNN_CPU_ISA=avx2: BERT-base's fused products run on
    OpenBLAS where it is the GEMM library (AMD), their bias + residual passes on the calling thread
    and the GELU pass on the threads; on MKL's packed panel with the size rule elsewhere (Intel)."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, OPSNN_CPU_ISA="avx2")
    r = subprocess.run(
        [sys.executable, "-c", _CAPPED_CHILD % (BERT_FUSED,)], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["isa"] == "avx2"
    if got["brgemm"]:
        pytest.skip("this oneDNN has brgemm matmul code under AVX2: FusedMatMul runs it, no epilogue pass")
    assert len(got["plans"]) == len(BERT_FUSED)
    for (k, n, act, _), plan in zip(BERT_FUSED, got["plans"]):
        assert tuple(plan) == _expected_under_avx2(got["gemm"], act), (k, n, act, got)


# (X, W, dY shapes, strides) of float32 weight gradients, and whether they run as one product (AVX2, AVX-512
# AMD, AVX-512 Intel: there the nhwc primitive takes stride-1 planes of 16+ positions)
DW_ROWS = {
    "2x2_planes": (((32, 512, 2, 2), (512, 512, 3, 3), (32, 512, 2, 2), (1, 1)), (True, True, True)),
    "4x4_planes": (((32, 256, 4, 4), (256, 256, 3, 3), (32, 256, 4, 4), (1, 1)), (True, True, False)),
    "strided_14x14": (((32, 256, 28, 28), (256, 256, 3, 3), (32, 256, 14, 14), (2, 2)), (False, True, True)),
    "8x8_planes": (((32, 256, 8, 8), (256, 256, 3, 3), (32, 256, 8, 8), (1, 1)), (False, False, False)),
    "1x1": (((32, 512, 2, 2), (512, 512, 1, 1), (32, 512, 2, 2), (1, 1)), (False, False, False)),
    "narrow": (((32, 128, 2, 2), (128, 128, 3, 3), (32, 128, 2, 2), (1, 1)), (False, False, False)),
}


def test_weight_gradient_by_rows_per_isa(monkeypatch):
    """A float32 weight gradient of 256+ output channels runs as one product over the windows of all images
    onto planes of <= 16 positions on every level (on Intel AVX-512 the nhwc primitive takes the stride-1
    ones of 16), onto larger strided planes from AVX-512 on; never for 1x1 kernels, narrow or grouped
    ones. The product runs on oneDNN's brgemm matmul where it takes runtime float32 products (AVX-512
    with OpenBLAS), else on the GEMM library (MKL on Intel, OpenBLAS under AVX2 on AMD); bfloat16's on
    oneDNN."""
    monkeypatch.delenv("OPSNN_ONEDNN_LAYOUT", raising=False)
    for vendor in (AMD, INTEL):
        for level in cpu.LEVELS[1:]:
            p, wide = KL.Platform.for_isa(level, vendor), level != "avx2"
            col = 0 if not wide else 2 if vendor == INTEL else 1
            for name, ((xs, ws, ys, s), want) in DW_ROWS.items():
                assert KL.weight_gradient_by_rows(xs, ws, ys, s, 1, np.float32, p=p) == want[col], (name, level)
                assert not KL.weight_gradient_by_rows(xs, ws, ys, s, 2, np.float32, p=p), (name, level)
            lib = KL.conv_rows_product("weights", 512, 128, 4608, np.float32, p).library
            assert lib == ("onednn" if wide and p.gemm_library == "openblas" else p.gemm_library), (vendor, level)
            assert KL.conv_rows_product("weights", 512, 128, 4608, _dt.bfloat16, p).library == "onednn"


# (X, W, dY shapes) of float32 data gradients, and whether they run as one product (AVX2, AVX-512)
DX_ROWS = {
    "2x2_planes": (((32, 512, 2, 2), (512, 512, 3, 3), (32, 512, 2, 2)), (True, True)),
    "strided_to_2x2": (((32, 256, 4, 4), (512, 256, 3, 3), (32, 512, 2, 2)), (True, True)),
    "4x4_planes_512": (((32, 512, 4, 4), (512, 512, 3, 3), (32, 512, 4, 4)), (True, False)),
    "4x4_planes_256": (((32, 256, 4, 4), (256, 256, 3, 3), (32, 256, 4, 4)), (False, False)),
    "1x1": (((32, 256, 4, 4), (512, 256, 1, 1), (32, 512, 2, 2)), (False, False)),
    "narrow": (((32, 128, 4, 4), (128, 128, 3, 3), (32, 128, 2, 2)), (False, False)),
}


def test_data_gradient_by_rows_per_isa():
    """A float32 data gradient of 256+ output channels, wider than 1x1, one group, runs as one product onto
    planes of <= 4 positions on every level, under AVX2 onto <= 16 from 512 output channels; bfloat16 never."""
    for vendor in (AMD, INTEL):
        for level in cpu.LEVELS[1:]:
            p = KL.Platform.for_isa(level, vendor)
            for name, ((xs, ws, ys), want) in DX_ROWS.items():
                assert KL.data_gradient_by_rows(xs, ws, ys, 1, np.float32, p) == want[level != "avx2"], (name, level)
                assert not KL.data_gradient_by_rows(xs, ws, ys, 2, np.float32, p)
                assert not KL.data_gradient_by_rows(xs, ws, ys, 1, _dt.bfloat16, p)
            lib = KL.conv_rows_product("data", 128, 512, 4608, np.float32, p).library
            assert lib == ("onednn" if level != "avx2" and p.gemm_library == "openblas" else p.gemm_library)


def test_conv_forward_by_rows_per_isa():
    """Plain float32 convolutions run as one product only under AVX2 (oneDNN's jit:avx2 forward is the slower
    on small planes), on the data gradient's planes, never for a constant weight."""
    for vendor in (AMD, INTEL):
        for level in cpu.LEVELS[1:]:
            p = KL.Platform.for_isa(level, vendor)
            for name, ((xs, ws, ys), want) in DX_ROWS.items():
                got = KL.conv_forward_by_rows(xs, ws, ys, 1, np.float32, False, p)
                assert got == (want[0] and level == "avx2"), (name, level)
                assert not KL.conv_forward_by_rows(xs, ws, ys, 1, np.float32, True, p)


def test_plain_conv_formats_per_isa(monkeypatch):
    """Convolutions on plain float32 tensors ask oneDNN for nhwc activations where chains run nhwc (Intel
    from AVX-512 on, or OPSNN_ONEDNN_LAYOUT=nhwc): 2-D, one group, wider than 1x1, stride 1, no dilation,
    planes of 16+ positions (64+ for the data gradient); under AVX2 the forward onto planes of 16-64
    positions, strided too; elsewhere layouts of oneDNN's choosing."""
    monkeypatch.delenv("OPSNN_ONEDNN_LAYOUT", raising=False)
    f32 = np.float32
    x, w, y = (32, 64, 16, 16), (64, 64, 3, 3), (32, 64, 16, 16)
    small = (32, 256, 4, 4)
    for vendor in (AMD, INTEL):
        for level in cpu.LEVELS[1:]:
            p = KL.Platform.for_isa(level, vendor)
            want = "nhwc" if vendor == INTEL and level != "avx2" else "any"
            for pass_ in ("forward", "data", "weights"):
                assert KL.plain_conv_formats(pass_, x, w, y, (1, 1), (1, 1), 1, f32, p) == want, (pass_, level)
                assert KL.plain_conv_formats(pass_, x, w, y, (1, 1), (1, 1), 1, _dt.bfloat16, p) == "any"
                strided = KL.plain_conv_formats(pass_, x, w, (32, 64, 8, 8), (2, 2), (1, 1), 1, f32, p)
                assert strided == ("nhwc" if (level, pass_) == ("avx2", "forward") else "any")
                assert KL.plain_conv_formats(pass_, x, w, (32, 64, 12, 12), (1, 1), (2, 2), 1, f32, p) == "any"
                assert KL.plain_conv_formats(pass_, x, (64, 64, 1, 1), y, (1, 1), (1, 1), 1, f32, p) == "any"
                assert KL.plain_conv_formats(pass_, x, (64, 16, 3, 3), y, (1, 1), (1, 1), 4, f32, p) == "any"
            small_ws = (256, 256, 3, 3)
            on_small = "nhwc" if level == "avx2" else want
            assert KL.plain_conv_formats("forward", small, small_ws, small, (1, 1), (1, 1), 1, f32, p) == on_small
            assert KL.plain_conv_formats("data", small, small_ws, small, (1, 1), (1, 1), 1, f32, p) == "any"
            tiny = KL.plain_conv_formats("forward", small, small_ws, (32, 256, 2, 2), (1, 1), (1, 1), 1, f32, p)
            assert tiny == "any"
    no_dnn = KL.Platform.for_isa("avx2", AMD, onednn=False)
    assert KL.plain_conv_formats("forward", small, (256, 256, 3, 3), small, (1, 1), (1, 1), 1, f32, no_dnn) == "any"
    intel, amd = KL.Platform.for_isa("avx512", INTEL), KL.Platform.for_isa("avx2", AMD)
    monkeypatch.setenv("OPSNN_ONEDNN_LAYOUT", "nChw16c")
    assert KL.plain_conv_formats("forward", x, w, y, (1, 1), (1, 1), 1, f32, intel) == "any"
    monkeypatch.setenv("OPSNN_ONEDNN_LAYOUT", "nhwc")
    assert KL.plain_conv_formats("forward", x, w, y, (1, 1), (1, 1), 1, f32, amd) == "nhwc"
