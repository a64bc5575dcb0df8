"""Fast CPU kernels — Winograd F(4x4,3x3) and F(2x2,3x3), direct conv, im2col, tiled 16-bit GEMM and
pre-packed weights — against independent oracles (float64 direct-loop / einsum
convolution written here, numpy float64 matmul), across the shapes their predicates
accept, so kernel selection can never pick a kernel that is wrong for a shape.

Tolerances: fp32 direct/im2col kernels 1e-4 (vs float64); Winograd F(4x4,3x3) in fp32
2e-4 of the output's largest magnitude (its transform constants amplify rounding; the
measured error is ~1e-5 up to C = 512); F(2x2,3x3) 2e-5 (its transforms are exact in
binary: +-1, 1/2; measured ~1e-6); 16-bit outputs one rounding of the fp32 result
(fp16: 2**-10, bf16: 2**-7 relative, plus accumulation slack).
"""

import itertools
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import opsnn
from opsnn.kernels.cpu import fused as KF
from opsnn.kernels.cpu import gemm as KG
from opsnn.kernels.cpu import libraries as KL
from opsnn.kernels.cpu import mkl as KM
from opsnn.kernels.cpu import winograd as WG
from opsnn.ops import autotune
from opsnn.ops.executor import plan_op
from opsnn.ops.registry import TensorMeta, get_op

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


@pytest.fixture(autouse=True)
def _opsnn_conv_kernels(monkeypatch):
    """These tests pin opsnn's own convolution kernels: oneDNN's plain forward stays out of the
    default choice here (its rule is tested in tests/test_backward_convbw.py)."""
    monkeypatch.setenv("OPSNN_CONV_ONEDNN", "0")


WINO_TOL = 2e-4  # relative to max |y|
WINO_F2_TOL = 2e-5
FP32_TOL = 1e-4


# -- oracles ----------------------------------------------------------------------------------------------
def conv_oracle(x, w, b=None, stride=(1, 1), pads=(0, 0, 0, 0), dil=(1, 1), groups=1):
    """float64 convolution as a sum over kernel offsets of strided-window einsums (2-D)."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    ph0, pw0, ph1, pw1 = pads
    xp = np.pad(x, ((0, 0), (0, 0), (ph0, ph1), (pw0, pw1)))
    n, c = x.shape[:2]
    m, cg, kh, kw = w.shape
    oh = (xp.shape[2] - (kh - 1) * dil[0] - 1) // stride[0] + 1
    ow = (xp.shape[3] - (kw - 1) * dil[1] - 1) // stride[1] + 1
    y = np.zeros((n, m, oh, ow))
    mg = m // groups
    for g in range(groups):
        xg = xp[:, g * cg : (g + 1) * cg]
        for i, j in itertools.product(range(kh), range(kw)):
            win = xg[
                :,
                :,
                i * dil[0] : i * dil[0] + (oh - 1) * stride[0] + 1 : stride[0],
                j * dil[1] : j * dil[1] + (ow - 1) * stride[1] + 1 : stride[1],
            ]
            y[:, g * mg : (g + 1) * mg] += np.einsum("nchw,mc->nmhw", win, w[g * mg : (g + 1) * mg, :, i, j])
    if b is not None:
        y += b.astype(np.float64).reshape(1, -1, 1, 1)
    return y


def rand(rng, shape, dtype=np.float32, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def run_kernel(op, name, arrays, attrs, constant=(), domain=""):
    """Run one kernel of ``op`` directly (plan made with the ``constant`` inputs' values
    known, as the graph engine does), including kernels whose predicate only says
    NotPreferred. Returns (output, plan)."""
    rec = get_op(op, domain)
    metas = [None if a is None else TensorMeta(a.shape, a.dtype) for a in arrays]
    values = [a if i in constant else None for i, a in enumerate(arrays)]
    ctx = plan_op(rec, metas, values, attrs).ctx
    k = next(k for k in rec.kernels if k.name == name)
    why = k.check(ctx)
    assert why is None or isinstance(why, autotune.NotPreferred), f"{name} cannot run this: {why}"
    plan = k.plan(ctx) if k.plan else None
    ws = np.zeros(int(k.workspace(ctx, plan)) if k.workspace else 0, np.uint8)
    adapter = k.needs_adapter(ctx)
    outs = [np.full(m.shape, np.nan, np.float32 if adapter else m.dtype) for m in ctx.outputs]
    ins = [
        a.astype(np.float32) if adapter and a is not None and a.dtype in (np.float16, ml_dtypes.bfloat16) else a
        for a in arrays
    ]
    k.fn(ins, outs, ctx.attrs, plan, ws)
    return outs[0], plan


def conv_attrs(stride=(1, 1), pads=(0, 0, 0, 0), dil=(1, 1), groups=1):
    return {"strides": list(stride), "pads": list(pads), "dilations": list(dil), "group": groups}


def rel_err(y, want):
    return float(np.abs(y.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30))


# -- Winograd ---------------------------------------------------------------------------------------------
WINO_CASES = [
    # (x shape, M, pads (top, left, bottom, right))
    ((1, 16, 56, 56), 16, (1, 1, 1, 1)),  # tiles divide the output exactly
    ((2, 17, 13, 11), 19, (1, 1, 1, 1)),  # odd sizes: the last tile row/column is cut
    ((1, 33, 7, 9), 18, (0, 0, 0, 0)),  # no padding: output 5x7
    ((1, 20, 1, 1), 24, (1, 1, 1, 1)),  # 1x1 image: one tile, all padding around it
    ((1, 16, 2, 3), 16, (2, 2, 2, 2)),  # padding > kernel/2: output larger than input
    ((1, 16, 9, 6), 17, (3, 0, 1, 2)),  # asymmetric, > kernel/2 on one side
    ((3, 24, 5, 4), 16, (1, 2, 1, 0)),  # batch > 1, tiles cross image rows
    ((1, 64, 28, 28), 64, (1, 1, 1, 1)),  # a ResNet-sized layer (parallel transforms)
]


WINO_KERNELS = [("conv2d_winograd", 4, WINO_TOL), ("conv2d_winograd_f2", 2, WINO_F2_TOL)]


@pytest.mark.parametrize(
    "xs,m,pads",
    WINO_CASES
    + [
        ((1, 256, 14, 14), 256, (1, 1, 1, 1)),  # ResNet-50 stage 3 (F(2x2)'s shape)
        ((2, 40, 7, 7), 24, (1, 1, 1, 1)),  # stage-4-like 7x7, batch > 1
    ],
)
@pytest.mark.parametrize("prepacked", [False, True])
@pytest.mark.parametrize("kernel,tile,tol", WINO_KERNELS)
def test_winograd_matches_oracle(rng, xs, m, pads, prepacked, kernel, tile, tol):
    x, w, b = rand(rng, xs), rand(rng, (m, xs[1], 3, 3)), rand(rng, (m,))
    attrs = conv_attrs(pads=pads)
    y, plan = run_kernel("Conv", kernel, [x, w, b], attrs, constant={1, 2} if prepacked else ())
    assert (plan.u is not None or bool(plan.gemms)) == prepacked and plan.tile == tile
    if plan.u is not None:
        assert plan.u.shape == ((tile + 2) ** 2, m, xs[1])
    want = conv_oracle(x, w, b, pads=pads)
    assert y.shape == want.shape
    assert rel_err(y, want) < tol


@pytest.mark.parametrize("kernel,tile,tol", WINO_KERNELS)
def test_winograd_no_bias_float64_strided(rng, kernel, tile, tol):
    """No bias, float64 (same algorithm, float64 GEMMs), and non-contiguous x / y views."""
    x, w = rand(rng, (2, 12, 11, 10), np.float64), rand(rng, (9, 12, 3, 3), np.float64)
    y, plan = run_kernel("Conv", kernel, [x, w], conv_attrs(pads=(2, 1, 0, 1)), constant={1})
    assert y.dtype == np.float64 and plan.u.dtype == np.float64
    assert rel_err(y, conv_oracle(x, w, pads=(2, 1, 0, 1))) < 1e-12
    # the kernel function on strided views (every other channel of a wider batch)
    xw = rand(rng, (2, 24, 11, 10))
    xv = xw[:, ::2]
    plan = WG.winograd_plan(xv.shape, 9, (1, 1), (11, 10), 4, w.astype(np.float32), tile=tile)
    yw = np.full((2, 18, 11, 10), np.nan, np.float32)
    ws = np.zeros(plan.workspace_bytes, np.uint8)
    WG.conv_winograd(xv, w.astype(np.float32), None, yw[:, 1::2], plan, ws)
    assert np.isnan(yw[:, ::2]).all()
    assert rel_err(yw[:, 1::2], conv_oracle(xv, w, pads=(1, 1, 1, 1))) < (WINO_TOL if tile == 4 else WINO_F2_TOL)


DILATED_CASES = [
    # (x shape, M, pads, dilation)
    ((1, 5, 9, 11), 4, (2, 2, 2, 2), (2, 2)),  # "same" padding
    ((2, 3, 10, 9), 6, (1, 3, 0, 2), (2, 3)),  # asymmetric pads, unequal dilations
    ((1, 4, 13, 12), 3, (0, 0, 0, 0), (3, 2)),  # no padding: phases start inside the image
    ((1, 6, 1, 1), 5, (2, 2, 2, 2), (2, 2)),  # 1x1 image: only one phase has outputs
    ((1, 4, 7, 6), 4, (5, 1, 5, 4), (2, 1)),  # padding > dilated kernel / 2; dilation on rows only
    ((1, 128, 26, 26), 128, (2, 2, 2, 2), (2, 2)),  # a size where it is selected
]


@pytest.mark.parametrize("xs,m,pads,dil", DILATED_CASES)
@pytest.mark.parametrize("prepacked", [False, True])
def test_dilated_winograd_matches_oracle(rng, xs, m, pads, dil, prepacked):
    x, w, b = rand(rng, xs), rand(rng, (m, xs[1], 3, 3)), rand(rng, (m,))
    y, plan = run_kernel(
        "Conv",
        "conv2d_winograd_dilated",
        [x, w, b],
        conv_attrs(pads=pads, dil=dil),
        constant={1, 2} if prepacked else (),
    )
    assert (plan.u is not None) == prepacked
    assert len(plan.phases) <= dil[0] * dil[1]
    want = conv_oracle(x, w, b, pads=pads, dil=dil)
    assert y.shape == want.shape
    assert rel_err(y, want) < WINO_TOL


def test_dilated_winograd_selection(rng):
    x, w = rand(rng, (1, 128, 46, 46)), rand(rng, (128, 128, 3, 3))
    ex = opsnn.aclnn.conv2d.prepare(x, w, padding=2, dilation=2)
    assert ex.kernel_name == "conv2d_winograd_dilated"
    assert "dilation 1" in dict(ex.rejected)["conv2d_winograd"]
    small = opsnn.aclnn.conv2d.prepare(x[:, :64], w[:64, :64], padding=2, dilation=2)
    assert small.kernel_name == _IM2COL
    assert "channels" in dict(small.rejected)["conv2d_winograd_dilated"]


@pytest.mark.parametrize("kernel,tile,tol", WINO_KERNELS)
def test_winograd_chunks_across_images(rng, monkeypatch, kernel, tile, tol):
    """Tiny chunk budget: every chunk is one tile row, chunks straddle image boundaries; serial
    and parallel transforms."""
    x, w, b = rand(rng, (3, 5, 9, 7)), rand(rng, (4, 5, 3, 3)), rand(rng, (4,))
    want = conv_oracle(x, w, b, pads=(1, 1, 1, 1))
    monkeypatch.setattr(WG, "CHUNK_U_FACTOR", 0)
    for budget, par in ((1, 1 << 40), (2000, 0), (1 << 30, 1 << 40), (1 << 30, 0)):
        monkeypatch.setattr(WG, "CHUNK_BYTES", budget)
        monkeypatch.setattr(WG, "PARALLEL_MIN", par)
        y, plan = run_kernel("Conv", kernel, [x, w, b], conv_attrs(pads=(1, 1, 1, 1)))
        assert plan.parallel == (par == 0)
        assert rel_err(y, want) < tol
    th = -(-9 // tile)
    assert plan.rows == 3 * th  # the whole batch (3 images x th tile rows) in one chunk


@pytest.mark.parametrize("kernel,tile,tol", WINO_KERNELS)
def test_winograd_point_gemms_on_onednn_match_mkl_and_the_oracle(rng, monkeypatch, kernel, tile, tol):
    """Pre-packed float32 weights and chunks of at most ONEDNN_MAX_TILES tiles: the point GEMMs
    run as oneDNN batched matmuls (tile-major copies in and out), one primitive per chunk size
    (a last, shorter chunk gets its own). Same result as the MKL path and the oracle, with
    chunks of one tile row, chunks straddling images, a short last chunk, serial and parallel."""
    from opsnn.kernels.cpu import onednn as D

    if D.product_unavailable(np.float32) is not None:
        pytest.skip(D.product_unavailable(np.float32))
    x, w, b = rand(rng, (3, 20, 9, 7)), rand(rng, (24, 20, 3, 3)), rand(rng, (24,))
    want = conv_oracle(x, w, b, pads=(1, 1, 1, 1))
    th, tw = -(-9 // tile), -(-7 // tile)
    monkeypatch.setattr(WG, "CHUNK_U_FACTOR", 0)
    for rows, par in ((1, 1 << 40), (2, 0), (3 * th - 1, 1 << 40), (3 * th, 0)):
        per_row = (tile + 2) ** 2 * (20 + 24) * tw * 4
        monkeypatch.setattr(WG, "CHUNK_BYTES", rows * per_row)
        monkeypatch.setattr(WG, "PARALLEL_MIN", par)
        y, plan = run_kernel("Conv", kernel, [x, w, b], conv_attrs(pads=(1, 1, 1, 1)), constant={1, 2})
        assert plan.rows == rows and plan.u is None
        chunks = {min(rows, 3 * th) * tw} | ({(3 * th) % rows * tw} if (3 * th) % rows else set())
        assert set(plan.gemms) == chunks
        assert rel_err(y, want) < tol
        with monkeypatch.context() as m:
            m.setattr(WG, "_onednn_gemms", lambda *a: None)
            y_mkl, plan_mkl = run_kernel("Conv", kernel, [x, w, b], conv_attrs(pads=(1, 1, 1, 1)), constant={1, 2})
        assert plan_mkl.gemms is None and plan_mkl.u is not None
        assert rel_err(y, y_mkl) < tol
    monkeypatch.setattr(KL, "WINOGRAD_ONEDNN_MAX_TILES", 0)  # longer chunks: MKL
    _, plan = run_kernel("Conv", kernel, [x, w, b], conv_attrs(pads=(1, 1, 1, 1)), constant={1, 2})
    assert plan.gemms is None and plan.u is not None


def test_winograd_chunks_grow_with_the_weights(monkeypatch):
    """Each chunk streams all of U: with large U the chunk may grow to CHUNK_U_FACTOR x U,
    capped at CHUNK_MAX_BYTES; small U keeps CHUNK_BYTES."""
    big = WG.winograd_plan((8, 512, 7, 7), 512, (1, 1), (7, 7), 4)  # U 36 MiB
    assert big.rows == 8 * 2  # the whole batch
    assert big.workspace_bytes <= WG.CHUNK_MAX_BYTES + 36 * 512 * 512 * 4 + 3 * WG.ALIGN
    small = WG.winograd_plan((8, 64, 56, 56), 64, (1, 1), (56, 56), 4)  # U 0.6 MiB
    assert 36 * 128 * 14 * 4 * small.rows <= WG.CHUNK_BYTES < 36 * 128 * 14 * 4 * (small.rows + 1)
    monkeypatch.setattr(WG, "CHUNK_MAX_BYTES", 0)
    assert WG.winograd_plan((8, 512, 7, 7), 512, (1, 1), (7, 7), 4).rows == WG.CHUNK_BYTES // (36 * 1024 * 2 * 4)


def test_winograd_transform_blocks(rng):
    """The transforms' per-channel tile blocks (BLOCK_TILES // tile columns tile rows each):
    an image whose tile rows do not divide into blocks, for both tile sizes, both F(4x4)
    input transforms (row tasks for wide images, channel blocks for narrow ones)."""
    x, w, b = rand(rng, (2, 3, 70, 150)), rand(rng, (5, 3, 3, 3)), rand(rng, (5,))
    want = conv_oracle(x, w, b, pads=(1, 1, 1, 1))
    for tile in (4, 2):
        plan = WG.winograd_plan(x.shape, 5, (1, 1), (70, 150), 4, w, tile=tile)
        assert plan.tw_n * plan.rows > WG.BLOCK_TILES  # several blocks per chunk
        y = np.full(want.shape, np.nan, np.float32)
        WG.conv_winograd(x, w, b, y, plan, np.zeros(plan.workspace_bytes, np.uint8))
        assert rel_err(y, want) < (WINO_TOL if tile == 4 else WINO_F2_TOL)
    x = rand(rng, (2, 3, 230, 20))  # 5 tiles of 4 per row: F(4x4)'s channel-block input form
    want = conv_oracle(x, w, b, pads=(1, 1, 1, 1))
    plan = WG.winograd_plan(x.shape, 5, (1, 1), (230, 20), 4, w)
    assert plan.tw_n < WG.ROWS_MIN_TW and plan.tw_n * plan.rows > WG.BLOCK_TILES
    y = np.full(want.shape, np.nan, np.float32)
    WG.conv_winograd(x, w, b, y, plan, np.zeros(plan.workspace_bytes, np.uint8))
    assert rel_err(y, want) < WINO_TOL


def test_winograd_selected_and_explains_itself(rng):
    x, w = rand(rng, (1, 64, 56, 56)), rand(rng, (64, 64, 3, 3))
    ex = opsnn.aclnn.conv2d.prepare(x, w, padding=1)
    assert ex.kernel_name == "conv2d_winograd"
    np.testing.assert_allclose(
        ex.run().numpy(),
        conv_oracle(x, w, pads=(1,) * 4),
        rtol=0,
        atol=WINO_TOL * np.abs(conv_oracle(x, w, pads=(1,) * 4)).max(),
    )
    # outside its predicate: the reasons name what was wrong
    for xs, ws, kw, words in [
        ((1, 64, 28, 28), (64, 64, 3, 3), dict(stride=2, padding=1), "stride"),
        ((1, 64, 28, 28), (64, 64, 5, 5), dict(padding=2), "3x3"),
        ((1, 64, 28, 28), (64, 32, 3, 3), dict(padding=1, groups=2), "group"),
        ((1, 64, 28, 28), (64, 64, 3, 3), dict(padding=2, dilation=2), "dilation"),
        ((1, 4, 28, 28), (4, 4, 3, 3), dict(padding=1), "channels"),
        ((1, 64, 7, 7), (64, 64, 3, 3), dict(padding=1), "tiles"),
    ]:
        ex = opsnn.aclnn.conv2d.prepare(rand(rng, xs), rand(rng, ws), **kw)
        assert ex.kernel_name != "conv2d_winograd"
        why = dict(ex.rejected)["conv2d_winograd"]
        assert words in why, why


def test_winograd_per_call_weight_transform_needs_tiles(rng):
    """A weight unknown at prepare is transformed every call: Winograd then needs enough tiles
    to amortize it (NotPreferred below), while a constant (pre-packed) weight keeps it."""
    from opsnn.ops.defs import conv as defs

    rec = get_op("Conv")
    x, w = rand(rng, (1, 192, 20, 28)), rand(rng, (192, 192, 3, 3))  # 5 x 7 tiles of 4x4, 10 x 14 of 2x2
    ex = opsnn.aclnn.conv2d.prepare(x, w, padding=1)
    assert "transformed on every call" in dict(ex.rejected)["conv2d_winograd"]
    assert ex.kernel_name == "conv2d_winograd_f2"  # 140 tiles of 2x2 amortize its smaller transform
    metas = [TensorMeta(a.shape, a.dtype) for a in (x, w)]
    packed = plan_op(rec, metas, [None, w], conv_attrs(pads=(1,) * 4))
    assert packed.selection.kernel.name == "conv2d_winograd"
    assert defs.WINOGRAD_MIN_TILES <= 35 < defs.WINOGRAD_MIN_TILES_UNPACKED
    assert 192 * 35 >= defs.WINOGRAD_F4_MIN_WORK and 140 >= defs.WINOGRAD_F2_MIN_TILES_UNPACKED
    # 14x14: 49 tiles of 2x2 do not amortize the per-call F(2x2) transform either -> im2col
    x, w = rand(rng, (1, 256, 14, 14)), rand(rng, (256, 256, 3, 3))
    ex = opsnn.aclnn.conv2d.prepare(x, w, padding=1)
    assert ex.kernel_name == "conv2d_im2col"
    assert "transformed on every call" in dict(ex.rejected)["conv2d_winograd_f2"]
    packed = plan_op(rec, [TensorMeta(a.shape, a.dtype) for a in (x, w)], [None, w], conv_attrs(pads=(1,) * 4))
    assert packed.selection.kernel.name == "conv2d_winograd_f2"
    # the per-call transform itself: U = kron(G, G) @ g for every channel pair, in float64
    u = WG.transform_weights(w)
    want = np.einsum("xi,mcij,yj->xymc", WG.G, w.astype(np.float64), WG.G).reshape(36, 256, 256)
    np.testing.assert_allclose(u, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kernel", ["conv2d_winograd", "conv2d_winograd_f2"])
def test_winograd_float64_and_16bit(rng, kernel):
    x, w = rand(rng, (1, 16, 12, 12), np.float64), rand(rng, (16, 16, 3, 3), np.float64)
    y, _ = run_kernel("Conv", kernel, [x, w], conv_attrs(pads=(1,) * 4), constant={1})
    assert y.dtype == np.float64
    assert rel_err(y, conv_oracle(x, w, pads=(1,) * 4)) < 1e-12
    # 16-bit runs through the fp32 adapter; 16 ch 112x112 -> F(4x4), 16 ch 28x28 -> F(2x2)
    hw = 112 if kernel == "conv2d_winograd" else 28
    for dt in (np.float16, ml_dtypes.bfloat16):
        xh, wh = rand(rng, (1, 16, hw, hw)).astype(dt), rand(rng, (16, 16, 3, 3), scale=0.2).astype(dt)
        # bf16 asked for by name: where oneDNN has AVX512-BF16 its native conv_onednn_plain is preferred
        algo = kernel if dt == ml_dtypes.bfloat16 else None
        ex = opsnn.aclnn.conv2d.prepare(xh, wh, padding=1, algo=algo)
        assert ex.kernel_name == kernel and ex.adapter
        y = ex.run().numpy()
        assert y.dtype == np.dtype(dt)
        want = conv_oracle(xh.astype(np.float32), wh.astype(np.float32), pads=(1,) * 4)
        assert rel_err(y.astype(np.float32), want) < (2e-3 if dt == np.float16 else 1.6e-2)


@pytest.mark.parametrize("kernel,tile,tol", WINO_KERNELS)
def test_winograd_nan_inf_propagate(rng, kernel, tile, tol):
    x, w = rand(rng, (1, 16, 12, 12)), np.abs(rand(rng, (16, 16, 3, 3))) + 0.1
    x[0, 3, 5, 6] = np.nan
    y, _ = run_kernel("Conv", kernel, [x, w], conv_attrs(pads=(1,) * 4))
    want = conv_oracle(x, w, pads=(1,) * 4)
    assert np.isnan(y[0, :, 4:7, 5:8]).all()  # every output whose window reads the NaN
    # Winograd spreads a NaN over the whole output tile of every tile that reads it (the
    # transforms mix the tile's inputs); outputs of tiles that never read it stay finite and exact
    clean = np.ones(want.shape[2:], bool)
    for r0 in range(0, 12, tile):
        for c0 in range(0, 12, tile):
            if r0 <= 6 < r0 + tile + 2 and c0 <= 7 < c0 + tile + 2:  # its input tile holds x[5, 6] (padded: 6, 7)
                clean[r0 : r0 + tile, c0 : c0 + tile] = False
    assert np.isfinite(y[0][:, clean]).all()
    assert rel_err(y[0][:, clean], want[0][:, clean]) < tol


def test_weight_transform_matches_matrix_form(rng):
    w = rand(rng, (5, 7, 3, 3))
    u = WG.transform_weights(w, np.float64)
    want = np.einsum("xi,mcij,yj->xymc", WG.G, w.astype(np.float64), WG.G).reshape(36, 5, 7)
    np.testing.assert_allclose(u, want, rtol=1e-12, atol=1e-12)
    # the F(4,3) identity itself: A^T [(G g) * (B^T d)] == the 1-D correlation of d by g
    g, d = rng.standard_normal(3), rng.standard_normal(6)
    y = WG.AT @ ((WG.G @ g) * (WG.BT @ d))
    np.testing.assert_allclose(y, [d[i : i + 3] @ g for i in range(4)], rtol=1e-12, atol=1e-12)
    # F(2x2): U = G2 g G2^T, (16, M, C); and the F(2,3) identity
    u = WG.transform_weights(w, np.float64, tile=2)
    want = np.einsum("xi,mcij,yj->xymc", WG.G2, w.astype(np.float64), WG.G2).reshape(16, 5, 7)
    np.testing.assert_allclose(u, want, rtol=1e-12, atol=1e-12)
    y = WG.AT2 @ ((WG.G2 @ g) * (WG.BT2 @ d[:4]))
    np.testing.assert_allclose(y, [d[i : i + 3] @ g for i in range(2)], rtol=1e-12, atol=1e-12)


# (x shape, expected kernel, a word of the reason the other Winograd kernel gives)
WINO_SELECTION = [
    ((1, 64, 56, 56), "conv2d_winograd", None),  # ResNet-50 stage 1
    ((1, 128, 28, 28), "conv2d_winograd", None),  # stage 2
    ((1, 256, 14, 14), "conv2d_winograd_f2", "tiles"),  # stage 3: 16 tiles of 4x4
    ((1, 512, 7, 7), "conv2d_winograd_f2", "tiles"),  # stage 4: F(4x4) has only 4 tiles
    ((2, 256, 14, 14), "conv2d_winograd_f2", "wide"),
    ((4, 512, 7, 7), "conv2d_winograd_f2", "tiles"),
    ((8, 256, 14, 14), "conv2d_winograd", None),  # batch 8: F(4x4)'s GEMMs are fat enough
    ((8, 512, 7, 7), "conv2d_winograd", None),
    ((1, 32, 56, 56), "conv2d_winograd_f2", "channels"),  # few channels, 196 tiles of 4x4
    ((1, 64, 28, 28), "conv2d_winograd_f2", "min(C, M)"),
    ((8, 64, 56, 56), "conv2d_winograd", None),
    ((8, 128, 28, 28), "conv2d_winograd", None),
    ((1, 8, 28, 28), "conv2d_im2col", None),  # too little work for either
]
# with Intel MKL a small weight's im2col runs as tasks on single-threaded MKL (conv2d_im2col_tasks)
_IM2COL = "conv2d_im2col" if KM.unavailable() else "conv2d_im2col_tasks"


@pytest.mark.parametrize("xs,kernel,why", WINO_SELECTION)
def test_winograd_f4_or_f2_selection(rng, xs, kernel, why):
    rec = get_op("Conv")
    x, w = rand(rng, xs), rand(rng, (xs[1], xs[1], 3, 3))
    sel = plan_op(rec, [TensorMeta(a.shape, a.dtype) for a in (x, w)], [None, w], conv_attrs(pads=(1,) * 4)).selection
    assert sel.kernel.name == (_IM2COL if kernel == "conv2d_im2col" else kernel)
    rejected = dict(sel.rejected)
    if kernel == "conv2d_winograd_f2":
        reason = rejected["conv2d_winograd"]
        assert isinstance(reason, autotune.NotPreferred) and why in reason, reason
    if kernel == "conv2d_im2col":
        assert isinstance(rejected["conv2d_winograd_f2"], autotune.NotPreferred)
        assert "too little work" in rejected["conv2d_winograd_f2"]
    # forcing either Winograd kernel still works, NotPreferred or not
    for name in ("conv2d_winograd", "conv2d_winograd_f2"):
        forced = opsnn.ops.conv2d(x, w, padding=1, algo=name).numpy()
        tol = WINO_TOL if name == "conv2d_winograd" else WINO_F2_TOL
        assert rel_err(forced, conv_oracle(x, w, pads=(1,) * 4)) < tol


def test_winograd_f2_rejects_what_it_cannot_run(rng):
    from opsnn.ops.defs import conv as defs

    for ws, attrs, word in [
        ((8, 8, 3, 3), conv_attrs(stride=(2, 2), pads=(1,) * 4), "stride"),
        ((8, 8, 5, 5), conv_attrs(pads=(2,) * 4), "3x3"),
        ((8, 4, 3, 3), conv_attrs(pads=(1,) * 4, groups=2), "group"),
        ((8, 8, 3, 3), conv_attrs(pads=(2,) * 4, dil=(2, 2)), "dilation"),
    ]:
        why = defs.winograd_f2_rejection((1, 8, 20, 20), ws, attrs)
        assert word in why and not isinstance(why, autotune.NotPreferred), why
    assert "2-D" in defs.winograd_f2_rejection((1, 8, 20), (8, 8, 3), {})
    assert isinstance(
        defs.winograd_f2_rejection((1, 4, 64, 64), (4, 4, 3, 3), conv_attrs(pads=(1,) * 4)), autotune.NotPreferred
    )  # 4 channels: correct but slower


def test_winograd_f2_leaves_few_tiles_of_a_wide_layer_to_im2col(rng):
    # ResNet-18 at 112x112, stage 4: 512 ch at 4x4 is 4 tiles of 2x2; the transformed weight (16 MiB)
    # would be streamed for 4 columns a product
    from opsnn.ops.defs import conv as defs

    attrs = conv_attrs(pads=(1,) * 4)
    why = defs.winograd_f2_rejection((1, 512, 4, 4), (512, 512, 3, 3), attrs)
    assert isinstance(why, autotune.NotPreferred) and "transformed weight" in why, why
    assert defs.winograd_f2_rejection((1, 512, 7, 7), (512, 512, 3, 3), attrs) is None  # 16 tiles
    assert defs.winograd_f2_rejection((4, 512, 4, 4), (512, 512, 3, 3), attrs) is None  # batch 4: 16 tiles
    assert defs.winograd_f2_rejection((1, 128, 4, 4), (128, 128, 3, 3), attrs) is None  # 1 MiB: stays in L2
    x, w = rand(rng, (1, 512, 4, 4)), rand(rng, (512, 512, 3, 3))
    sel = plan_op(get_op("Conv"), [TensorMeta(a.shape, a.dtype) for a in (x, w)], [None, w], attrs).selection
    assert sel.kernel.name.startswith("conv2d_im2col"), sel.kernel.name
    want = conv_oracle(x, w, pads=(1,) * 4)
    for name in (None, "conv2d_winograd_f2"):  # forcing F2 still works
        assert rel_err(opsnn.ops.conv2d(x, w, padding=1, algo=name).numpy(), want) < WINO_F2_TOL


# -- direct and im2col kernels ------------------------------------------------------------------------------
DIRECT_CASES = [
    # (x shape, w shape, stride, pads, dilation, groups)
    ((1, 3, 23, 21), (8, 3, 7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1),  # ResNet-stem-like, odd sizes
    ((2, 4, 9, 10), (6, 4, 3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 1),  # dilated
    ((1, 5, 12, 13), (5, 5, 3, 3), (1, 1), (4, 4, 4, 4), (4, 3), 1),  # dilation > pad structure
    ((2, 7, 9, 11), (5, 7, 2, 3), (4, 5), (0, 0, 0, 0), (1, 1), 1),  # stride > kernel
    ((1, 6, 1, 1), (9, 6, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),  # 1x1 image
    ((1, 3, 6, 5), (2, 3, 3, 3), (1, 1), (3, 2, 3, 2), (1, 1), 1),  # padding > kernel/2
    ((2, 8, 13, 11), (6, 4, 5, 3), (3, 2), (2, 1, 0, 2), (2, 2), 2),  # groups, asymmetric
    ((1, 4, 9, 10), (7, 4, 3, 3), (2, 3), (1, 1, 1, 1), (1, 1), 1),  # M not a multiple of 4
]


@pytest.mark.parametrize("xs,ws,stride,pads,dil,groups", DIRECT_CASES)
@pytest.mark.parametrize("kernel", ["conv2d_direct", "conv2d_im2col", "conv_nd_im2col"])
def test_direct_and_im2col_match_oracle(rng, xs, ws, stride, pads, dil, groups, kernel):
    x, w, b = rand(rng, xs), rand(rng, ws), rand(rng, (ws[0],))
    y, _ = run_kernel("Conv", kernel, [x, w, b], conv_attrs(stride, pads, dil, groups))
    want = conv_oracle(x, w, b, stride, pads, dil, groups)
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=FP32_TOL, atol=FP32_TOL)


def test_direct_1d_and_float64(rng):
    x, w = rand(rng, (2, 3, 17), np.float64), rand(rng, (4, 3, 5), np.float64)
    y = opsnn.ops.conv1d(x, w, stride=3, padding=2, dilation=2, algo="conv2d_direct").numpy()
    want = conv_oracle(x[:, :, None], w[:, :, None], stride=(1, 3), pads=(0, 2, 0, 2), dil=(1, 2))[:, :, 0]
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)


def test_direct_chosen_when_im2col_buffer_too_large(rng, monkeypatch):
    from opsnn.ops.defs import conv as defs

    x, w = rand(rng, (1, 4, 20, 20)), rand(rng, (4, 4, 3, 3))
    monkeypatch.setattr(defs, "IM2COL_MAX_BYTES", 1024)
    ex = opsnn.aclnn.conv2d.prepare(x, w, padding=2, dilation=2, stride=2)
    assert ex.kernel_name == "conv2d_direct"
    assert "column buffer" in dict(ex.rejected)["conv2d_im2col"]
    np.testing.assert_allclose(
        ex.run().numpy(), conv_oracle(x, w, None, (2, 2), (2,) * 4, (2, 2)), rtol=FP32_TOL, atol=FP32_TOL
    )


# -- property: every kernel a selection could pick is right for the shape ------------------------------------
@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 2),
    c=st.integers(1, 20),
    m=st.integers(1, 20),
    h=st.integers(1, 13),
    w_=st.integers(1, 13),
    k=st.sampled_from([1, 2, 3, 5]),
    s=st.integers(1, 3),
    d=st.integers(1, 3),
    p=st.integers(0, 4),
    g=st.sampled_from([1, 2]),
)
def test_every_applicable_conv_kernel_is_correct(n, c, m, h, w_, k, s, d, p, g):
    rng = np.random.default_rng(n * 1000 + c * 37 + h)
    c, m = c * g, m * g
    x, w, b = rand(rng, (n, c, h, w_)), rand(rng, (m, c // g, k, k)), rand(rng, (m,))
    if h + 2 * p < (k - 1) * d + 1 or w_ + 2 * p < (k - 1) * d + 1:
        return
    attrs = conv_attrs((s, s), (p,) * 4, (d, d), g)
    rec = get_op("Conv")
    ctx = plan_op(rec, [TensorMeta(a.shape, a.dtype) for a in (x, w, b)], [None, w, b], attrs).ctx
    want = conv_oracle(x, w, b, (s, s), (p,) * 4, (d, d), g)
    for kern in autotune.candidates(rec, ctx):
        y, _ = run_kernel("Conv", kern.name, [x, w, b], attrs, constant={1, 2})
        tol = WINO_TOL if kern.name.startswith("conv2d_winograd") else FP32_TOL
        np.testing.assert_allclose(
            y, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()), err_msg=f"kernel {kern.name}"
        )


# -- every Conv kernel runs inside FusedConv (the graph engine's epilogue fusion) ------------------------------
def _conv_relu_residual_model(x, w, b, attrs):
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["c"], **attrs),
        helper.make_node("Add", ["c", "z"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    ys = conv_oracle(
        x, w, b, tuple(attrs["strides"]), tuple(attrs["pads"]), tuple(attrs["dilations"]), attrs["group"]
    ).shape
    g = helper.make_graph(
        nodes,
        "conv_res",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, ys),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), ys


@pytest.mark.parametrize(
    "kernel,xs,ws,attrs",
    [
        ("conv2d_winograd", (1, 16, 18, 17), (16, 16, 3, 3), conv_attrs(pads=(1,) * 4)),
        ("conv2d_winograd_f2", (2, 16, 13, 10), (24, 16, 3, 3), conv_attrs(pads=(1,) * 4)),
        ("conv2d_winograd_dilated", (1, 128, 26, 26), (128, 128, 3, 3), conv_attrs(pads=(2,) * 4, dil=(2, 2))),
        ("conv2d_im2col", (1, 16, 10, 9), (16, 16, 3, 3), conv_attrs(pads=(1,) * 4)),
        ("conv2d_direct", (1, 3, 15, 14), (8, 3, 7, 7), conv_attrs((2, 2), (3,) * 4)),
        ("conv_1x1_gemm", (1, 8, 6, 5), (4, 8, 1, 1), conv_attrs()),
        ("conv2d_depthwise", (1, 6, 8, 7), (6, 1, 3, 3), conv_attrs(pads=(1,) * 4, groups=6)),
        ("conv_nd_im2col", (1, 4, 8, 7), (5, 4, 3, 3), conv_attrs(dil=(2, 2), pads=(2,) * 4)),
    ],
)
def test_fused_conv_runs_every_kernel(rng, kernel, xs, ws, attrs):
    x, w, b = rand(rng, xs), rand(rng, ws), rand(rng, (ws[0],))
    model, ys = _conv_relu_residual_model(x, w, b, attrs)
    z = rand(rng, ys)
    with opsnn.kernel_selector(Conv=kernel):
        cg = opsnn.compile(opsnn.onnx.load(model))
        y = cg.run({"x": x, "z": z})["y"].numpy()
    text = cg.explain()
    assert "FusedConv" in text and kernel in text, text
    want = np.maximum(
        conv_oracle(x, w, b, tuple(attrs["strides"]), tuple(attrs["pads"]), tuple(attrs["dilations"]), attrs["group"])
        + z,
        0,
    )
    tol = WINO_TOL if kernel.startswith("conv2d_winograd") else FP32_TOL
    np.testing.assert_allclose(y, want, rtol=tol, atol=tol * np.abs(want).max())


def test_graph_prepacks_winograd_weights(rng):
    x, w, b = rand(rng, (1, 16, 28, 28)), rand(rng, (16, 16, 3, 3)), rand(rng, (16,))
    model, ys = _conv_relu_residual_model(x, w, b, conv_attrs(pads=(1,) * 4))
    cg = opsnn.compile(opsnn.onnx.load(model))
    cg.run({"x": x, "z": np.zeros(ys, np.float32)})
    from opsnn.tools.explain import explain_graph

    text = explain_graph(cg, {"x": x.shape, "z": ys})
    assert "conv2d_winograd" in text and "weights pre-packed at prepare" in text, text


def test_explain_reports_the_fused_conv_kernel_chosen_with_the_constant_weight(rng):
    """256 ch 14x14: F(2x2) only with the weight pre-packed (per call: im2col); explain must
    report the kernel the compiled graph runs, not a re-selection without the weight."""
    from opsnn.tools.explain import explain_graph

    x, w, b = rand(rng, (1, 256, 14, 14)), rand(rng, (256, 256, 3, 3), scale=0.05), rand(rng, (256,))
    model, ys = _conv_relu_residual_model(x, w, b, conv_attrs(pads=(1,) * 4))
    cg = opsnn.compile(opsnn.onnx.load(model))
    z = rand(rng, ys)
    y = cg.run({"x": x, "z": z})["y"].numpy()
    want = np.maximum(conv_oracle(x, w, b, pads=(1,) * 4) + z, 0)
    np.testing.assert_allclose(y, want, rtol=WINO_F2_TOL, atol=WINO_F2_TOL * np.abs(want).max())
    text = explain_graph(cg, {"x": x.shape, "z": ys})
    assert "-> Conv: conv2d_winograd_f2" in text and "Winograd F(2x2,3x3)" in text, text


# -- 16-bit GEMM ---------------------------------------------------------------------------------------------------
LOWP_SHAPES = [
    ((1, 1), (1, 1)),
    ((3, 5), (5, 7)),
    ((37, 64), (64, 129)),
    ((4, 33), (33, 16)),
    ((2, 3, 9), (9, 20)),
    ((2, 5, 8), (2, 8, 3)),
    ((0, 4), (4, 3)),
    ((3, 0), (0, 5)),
]


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("sa,sb", LOWP_SHAPES)
@pytest.mark.parametrize("tile", [None, 16, 48])
def test_tiled_lowp_matmul(rng, dtype, sa, sb, tile):
    a, b = rand(rng, sa).astype(dtype), rand(rng, sb).astype(dtype)
    plan = KG.lowp_plan(a.shape, b.shape, dtype, tile)
    assert plan.tile_size % 16 == 0
    out = np.full(np.broadcast_shapes(sa[:-2], sb[:-2]) + (sa[-2], sb[-1]), np.nan, dtype)
    KG.matmul_lowp([a, b], [out], {}, plan, None)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    # bit-exact against rounding the float32 result once (fp32 accumulation, RNE store)
    exact = np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(dtype)
    ulp = 2.0**-10 if dtype == np.float16 else 2.0**-7
    scale = max(np.abs(want).max(), 1.0) if want.size else 1.0
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=ulp, atol=ulp * scale)
    diff = np.abs(out.astype(np.float64) - exact.astype(np.float64))
    assert (diff <= 2 * ulp * np.abs(exact.astype(np.float64)) + 1e-6 * scale).all()


def test_lowp_conversions_exact():
    """fp16/bf16 -> fp32 for all 65536 patterns; fp32 -> fp16/bf16 (round to nearest even,
    overflow, subnormals, NaN, signed zero) against numpy / ml_dtypes casts."""
    import numba as nb

    @nb.njit
    def widen(src, kind):
        out = np.empty(src.shape[0], np.uint32)
        KG._widen(src, out, out.view(np.float32), kind)
        return out.view(np.float32)

    @nb.njit
    def narrow(v, kind):
        out = np.empty(v.shape[0], np.uint16)
        KG._narrow(v, v.view(np.uint32), out, kind)
        return out

    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    rng = np.random.default_rng(1)
    vals = np.concatenate(
        [rng.standard_normal(20000).astype(np.float32) * s for s in (1e-8, 1e-5, 1, 6e4, 1e5)]
        + [
            np.array(
                [
                    0,
                    -0.0,
                    np.inf,
                    -np.inf,
                    65504,
                    65519.99,
                    65520,
                    6.1035156e-05,
                    5.9604645e-08,
                    2.9802322e-08,
                    2.9802326e-08,
                    -3e-38,
                    3.4e38,
                ],
                np.float32,
            )
        ]
    )
    for dt, kind in ((np.float16, KG.KIND_F16), (ml_dtypes.bfloat16, KG.KIND_BF16)):
        got = widen(bits, kind)
        want = bits.view(dt).astype(np.float32)
        same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
        assert same.all()
        with np.errstate(over="ignore"):
            want16 = vals.astype(dt).view(np.uint16)
        np.testing.assert_array_equal(narrow(vals, kind), want16)
        nan16 = narrow(np.array([np.nan, -np.nan], np.float32), kind).view(dt)
        assert np.isnan(nan16.astype(np.float32)).all()


def test_lowp_nan_inf_and_selection(rng):
    a = rand(rng, (3, 8)).astype(np.float16)
    b = rand(rng, (8, 5)).astype(np.float16)
    a[1, 2] = np.nan
    b[0, 4] = np.inf
    ex = opsnn.aclnn.matmul.prepare(a, b)
    assert ex.kernel_name == "matmul_tiled_lowp" and not ex.adapter
    y = ex.run().numpy()
    want = np.matmul(a.astype(np.float32), b.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(y), np.isinf(want))
    big = np.full((2, 4), 200, np.float16)
    assert np.isinf(opsnn.ops.matmul(big, big.T.copy()).numpy()).all()  # 160000 overflows fp16
    # forcing the reference agrees; non-contiguous inputs are made contiguous first
    ref = opsnn.ops.matmul(a, b, algo="reference").numpy()
    np.testing.assert_array_equal(np.isnan(ref), np.isnan(y))
    at = rand(rng, (8, 3)).astype(np.float16).T
    b = rand(rng, (8, 5)).astype(np.float16)
    got = opsnn.ops.matmul(opsnn.from_numpy(at), b).numpy()
    np.testing.assert_allclose(
        got.astype(np.float32), at.astype(np.float32) @ b.astype(np.float32), rtol=2e-3, atol=2e-3 * 8
    )
    # bf16 and many fp16 rows prefer BLAS on fp32 copies; the reason says so
    ex = opsnn.aclnn.matmul.prepare(rand(rng, (64, 8)).astype(np.float16), b)
    assert ex.kernel_name == "matmul_blas" and "rows" in dict(ex.rejected)["matmul_tiled_lowp"]


def test_lowp_kernel_inside_fused_matmul(rng):
    """FusedMatMul plans its inner MatMul kernel for the 16-bit inputs, then runs it inside its
    own fp32 adapter: the tiled kernel must cope with the widened operands."""
    x = rand(rng, (4, 16)).astype(np.float16)
    w = rand(rng, (16, 8)).astype(np.float16)
    bias = rand(rng, (8,)).astype(np.float16)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "mm_fused",
        [
            helper.make_tensor_value_info(n_, TensorProto.FLOAT16, v.shape)
            for n_, v in (("x", x), ("w", w), ("b", bias))
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
    )
    cg = opsnn.compile(opsnn.onnx.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])))
    y = cg.run({"x": x, "w": w, "b": bias})["y"].numpy()
    want = np.maximum(x.astype(np.float64) @ w.astype(np.float64) + bias.astype(np.float64), 0)
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=4e-3, atol=4e-3 * np.abs(want).max())
    out = np.empty((4, 8), np.float32)
    plan = KG.lowp_plan(x.shape, w.shape, np.float16)
    KG.matmul_lowp([x.astype(np.float32), w.astype(np.float32)], [out], {}, plan, None)
    np.testing.assert_allclose(out, x.astype(np.float32) @ w.astype(np.float32), rtol=1e-5, atol=1e-5)


# -- pre-packed constant weights -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_prepacked_matmul_and_linear(rng, dtype):
    x = rand(rng, (2, 3, 24)).astype(dtype)
    wm = rand(rng, (24, 10)).astype(dtype)  # MatMul B (K, N)
    wl = rand(rng, (10, 24)).astype(dtype)  # Linear W (N, K)
    bl = rand(rng, (10,)).astype(dtype)
    y, plan = run_kernel("MatMul", "matmul_prepacked", [x, wm], {}, constant={1})
    assert plan.w.dtype == np.float32 and plan.w.shape == (24, 10) and not plan.w.flags.writeable
    want = x.astype(np.float64) @ wm.astype(np.float64)
    ulp = 2.0**-10 if dtype == np.float16 else 2.0**-7
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=2 * ulp, atol=2 * ulp * np.abs(want).max())
    y, plan = run_kernel("Linear", "linear_prepacked", [x, wl, bl], {}, constant={1, 2}, domain="opsnn")
    want = x.astype(np.float64) @ wl.astype(np.float64).T + bl.astype(np.float64)
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=2 * ulp, atol=2 * ulp * np.abs(want).max())
    # eager calls have no constant weight: the kernel says why it does not apply
    ex = opsnn.aclnn.linear.prepare(x, wl, bl)
    assert ex.kernel_name != "linear_prepacked"
    if ex.kernel_name != "linear_onednn_runtime":  # (native bf16: chosen before prepacked is considered)
        assert "constant" in dict(ex.rejected)["linear_prepacked"]
    # with a constant weight it is chosen for float16 only (bf16 widening is as cheap as packing)
    rec = get_op("Linear", "opsnn")
    op = plan_op(rec, [TensorMeta(a.shape, a.dtype) for a in (x, wl, bl)], [None, wl, bl], {})
    assert (op.selection.kernel.name == "linear_prepacked") == (dtype == np.float16)


def test_prepacked_in_graph(rng):
    x = rand(rng, (4, 16)).astype(np.float16)
    w = rand(rng, (16, 8)).astype(np.float16)
    node = helper.make_node("MatMul", ["x", "W"], ["y"])
    g = helper.make_graph(
        [node],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
        [numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    cg = opsnn.compile(opsnn.onnx.load(model))
    y = cg.run({"x": x})["y"].numpy()
    assert "matmul_prepacked" in cg.explain()
    want = x.astype(np.float64) @ w.astype(np.float64)
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=2e-3, atol=2e-3 * np.abs(want).max())


def test_fp32_prepack_is_not_preferred(rng):
    x, w = rand(rng, (4, 16)), rand(rng, (16, 8))
    rec = get_op("MatMul")
    op = plan_op(rec, [TensorMeta(x.shape, x.dtype), TensorMeta(w.shape, w.dtype)], [None, w], {})
    # with Intel MKL installed its packed kernel takes fp32 constant weights (tests/test_mkl.py)
    assert op.selection.kernel.name == ("matmul_blas" if KM.unavailable() else "matmul_mkl_packed")
    why = next(k for k in rec.kernels if k.name == "matmul_prepacked").check(op.ctx)
    assert isinstance(why, autotune.NotPreferred)
    y, _ = run_kernel("MatMul", "matmul_prepacked", [x, w], {}, constant={1})
    np.testing.assert_allclose(y, x.astype(np.float64) @ w, rtol=1e-5, atol=1e-5)


def test_threading_default_is_set():
    import os

    import opsnn.kernels.cpu  # noqa: F401

    assert os.environ.get("OMP_WAIT_POLICY")  # set by opsnn unless the user chose a value
    assert math.isfinite(1.0)


# -- fused epilogue -------------------------------------------------------------------------------------------------
def _act_oracle(v, name, alpha, beta):
    from math import erf

    return {
        "": v,
        "Relu": np.maximum(v, 0),
        "Sigmoid": 1 / (1 + np.exp(-v)),
        "Tanh": np.tanh(v),
        "Gelu": 0.5 * v * (1 + np.vectorize(erf)(v / np.sqrt(2))),
        "GeluTanh": 0.5 * v * (1 + np.tanh(0.7978845608028654 * (v + 0.044715 * v**3))),
        "Swish": v / (1 + np.exp(-alpha * v)),
        "LeakyRelu": np.where(v >= 0, v, alpha * v),
        "Clip": np.clip(v, alpha, beta),
    }[name]


@pytest.mark.parametrize("act", ["Relu", "", "Gelu", "Sigmoid"])
def test_epilogue_parallel_and_serial_paths_agree(rng, act):
    # small epilogues run on the calling thread, large ones (or costly activations) in parallel
    code = KF.ACTIVATIONS[act]
    big = KF.PARALLEL_MIN_COSTLY if code in KF._COSTLY else KF.PARALLEL_MIN
    for rows, cols in ((big // 1000 + 1, 1000), (3, 50)):
        y = rand(rng, (rows, cols)).astype(np.float32)
        b = rand(rng, (cols,)).astype(np.float32)
        z = rand(rng, (rows, cols)).astype(np.float32)
        want = _act_oracle(y.astype(np.float64) + b + z, act, 0.0, 0.0)
        got = y.copy()
        KF.epilogue(got, b, z, code, 0.0, 0.0)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        other = y.copy()  # the other driver on the same data: identical results
        parallel, serial = KF.rows_kernels(code)
        (serial if rows * cols >= big else parallel)(other, b, np.empty(0, np.float32), z, 0.0, 0.0)
        np.testing.assert_array_equal(other, got)


@pytest.mark.parametrize("act", ["Relu", "", "Sigmoid"])
@pytest.mark.parametrize("resid", [False, True])
@pytest.mark.parametrize("rows", [6, KF.PARALLEL_MIN // 64 + 6])
def test_epilogue_row_bias(rng, act, resid, rows):
    # a conv's per-channel bias over (image, channel) rows: row r gets rb[r % len(rb)]
    y = rand(rng, (rows, 64)).astype(np.float32)
    rb = rand(rng, (3,)).astype(np.float32)
    cb = rand(rng, (64,)).astype(np.float32)
    z = rand(rng, (rows, 64)).astype(np.float32) if resid else None
    for col_bias in (None, cb):
        v = (
            y.astype(np.float64)
            + np.resize(rb, rows)[:, None]
            + (0 if z is None else z)
            + (0 if col_bias is None else col_bias)
        )
        got = y.copy()
        KF.epilogue(got, col_bias, z, KF.ACTIVATIONS[act], 0.0, 0.0, row_bias=rb)
        np.testing.assert_allclose(got, _act_oracle(v, act, 0.0, 0.0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("act", ["Gelu", "Swish", "LeakyRelu"])
@pytest.mark.parametrize("resid", [False, True])
def test_epilogue_rows_longer_than_the_scratch_block(rng, act, resid):
    # a row of a vectorized activation goes through the scratch in blocks: every block gets its
    # own columns' bias and residual, the last (short) one included
    from opsnn.kernels.cpu import activation as KA

    rows, cols = 5, 2 * KA.SCRATCH + 37
    y = rand(rng, (rows, cols)).astype(np.float32)
    y[1, KA.SCRATCH + 3] = np.nan
    b = rand(rng, (cols,)).astype(np.float32)
    rb = rand(rng, (2,)).astype(np.float32)
    z = rand(rng, (rows, cols)).astype(np.float32) if resid else None
    v = y.astype(np.float64) + b + np.resize(rb, rows)[:, None] + (0 if z is None else z)
    parallel, serial = KF.rows_kernels(KF.ACTIVATIONS[act])
    zz = np.empty((0, 0), np.float32) if z is None else z
    for run in (parallel, serial):
        got = y.copy()
        run(got, b, rb, zz, 0.3, 0.0)
        np.testing.assert_allclose(got, _act_oracle(v, act, 0.3, 0.0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("act", sorted(KF.ACTIVATIONS))
@pytest.mark.parametrize("bias,resid", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_epilogue_matches_oracle(rng, act, bias, resid, dtype):
    y = rand(rng, (7, 37)).astype(dtype)
    y[0, 0] = np.nan  # NaN stays NaN through every activation
    b = rand(rng, (37,)).astype(dtype) if bias else None
    z = rand(rng, (7, 37)).astype(dtype) if resid else None
    alpha, beta = (0.3, 0.0) if act != "Clip" else (-0.5, 0.5)
    v = y.astype(np.float64) + (0 if b is None else b) + (0 if z is None else z)
    want = _act_oracle(v, act, alpha, beta)
    got = y.copy()
    KF.epilogue(got, b, z, KF.ACTIVATIONS[act], alpha, beta)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # NaN == NaN: it must propagate


@pytest.mark.parametrize("pts,m,c,n", [(16, 24, 40, 49), (36, 8, 3, 5), (5, 1, 1, 1)])
@pytest.mark.parametrize("parallel", [False, True])
def test_winograd_point_gemms_on_mkl_tasks(rng, pts, m, c, n, parallel):
    """Winograd's per-point GEMMs as tasks on single-threaded MKL equal the batched product;
    operands they cannot take as they stand (a strided view, float64) are declined, not
    misread, and leave the output alone."""
    u, v = rng.standard_normal((pts, m, c)).astype(np.float32), rng.standard_normal((pts, c, n)).astype(np.float32)
    mm = np.full((pts, m, n), np.nan, np.float32)
    if KM.unavailable():
        assert not WG.point_gemms(u, v, mm, parallel)
        return
    assert WG.point_gemms(u, v, mm, parallel)
    np.testing.assert_allclose(mm, np.matmul(u.astype(np.float64), v), rtol=1e-5, atol=1e-5 * c)
    strided = np.full((pts, m, 2 * n), np.nan, np.float32)[:, :, ::2]
    assert not WG.point_gemms(u, v, strided, parallel) and np.isnan(strided).all()
    assert not WG.point_gemms(u.astype(np.float64), v.astype(np.float64), mm.astype(np.float64), parallel)


@pytest.mark.parametrize("bias_shape", [(), (5,)])
def test_fused_matmul_scalar_bias_broadcasts(rng, bias_shape):
    """FusedMatMul's bias may be a scalar (shape ()): every column gets it (the epilogue
    indexed it per column and read past its one value)."""
    a, w = rand(rng, (4, 8)), rand(rng, (8, 5))
    b = rand(rng, bias_shape)
    for act in ("", "Relu"):
        y = opsnn.ops.run_op("FusedMatMul", [a, w, b], {"activation": act}, domain="opsnn")[0].numpy()
        want = a.astype(np.float64) @ w + b
        np.testing.assert_allclose(y, np.maximum(want, 0) if act else want, rtol=1e-5, atol=1e-5)
