"""Large inputs: convolution and pooling on 4096x4096 images run with bounded workspace.

The conv kernels build their column / phase-split / Winograd transform buffers a band of
output rows at a time (``kernels.cpu.conv.BAND_BYTES``, ``winograd.CHUNK_BYTES``) and the
pooling kernels cap each work item's scratch rows (``pool.SCRATCH_BYTES``), so the memory
pool's peak stays within 2x (input + output) however large the image is. The banded paths
are checked against the unbanded ones (and an independent float64 oracle) on small shapes
with tiny band caps: bands that do not divide the height, stride 2, dilation, padding
larger than half the kernel, 1x1 images, groups, 1-D and 3-D.

Oracles: float64 convolution as a sum of strided-window einsums (one per kernel offset),
and pooling through numpy's ``sliding_window_view`` on the padded input; written here,
independent of the kernels. Tolerances: fp32 kernels 1e-4 relative to the output's largest
magnitude (Winograd 2e-4: its transform constants amplify rounding); pooling max exact,
average 1e-6.
"""

import gc
import itertools

import numpy as np
import pytest

import opsnn
from opsnn.kernels.cpu import conv as KC
from opsnn.kernels.cpu import pool as KP
from opsnn.kernels.cpu import winograd as WG
from opsnn.ops import autotune
from opsnn.ops.executor import plan_op
from opsnn.ops.registry import TensorMeta, get_op

FP32_TOL = 1e-4
WINO_TOL = 2e-4
BIG = 4096


# -- oracles --------------------------------------------------------------------------------------------------
def conv_oracle(x, w, b=None, stride=(1, 1), pads=(0, 0, 0, 0), dil=(1, 1), groups=1):
    """float64 2-D convolution: pad, then one strided-window einsum per kernel offset and group."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    m, cg, kh, kw = w.shape
    oh = (xp.shape[2] - (kh - 1) * dil[0] - 1) // stride[0] + 1
    ow = (xp.shape[3] - (kw - 1) * dil[1] - 1) // stride[1] + 1
    y = np.zeros((x.shape[0], m, oh, ow))
    mg = m // groups
    for g in range(groups):
        for i, j in itertools.product(range(kh), range(kw)):
            win = xp[
                :,
                g * cg : (g + 1) * cg,
                i * dil[0] : i * dil[0] + (oh - 1) * stride[0] + 1 : stride[0],
                j * dil[1] : j * dil[1] + (ow - 1) * stride[1] + 1 : stride[1],
            ]
            y[:, g * mg : (g + 1) * mg] += np.einsum("nchw,mc->nmhw", win, w[g * mg : (g + 1) * mg, :, i, j])
    if b is not None:
        y += b.astype(np.float64).reshape(1, -1, 1, 1)
    return y


def conv3d_oracle(x, w, stride, pads, dil):
    x, w = x.astype(np.float64), w.astype(np.float64)
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pads])
    k = w.shape[2:]
    out = [(xp.shape[2 + i] - (k[i] - 1) * dil[i] - 1) // stride[i] + 1 for i in range(3)]
    y = np.zeros((x.shape[0], w.shape[0], *out))
    for off in itertools.product(*(range(v) for v in k)):
        sl = tuple(slice(off[i] * dil[i], off[i] * dil[i] + (out[i] - 1) * stride[i] + 1, stride[i]) for i in range(3))
        y += np.einsum("ncdhw,mc->nmdhw", xp[(slice(None), slice(None)) + sl], w[(slice(None), slice(None)) + off])
    return y


def pool_oracle(x, k, s, p, dil=1, mode="max", ceil_mode=False, count_include_pad=True):
    """2-D pooling via sliding_window_view on the padded input (float64; -inf / 0 padding)."""
    n, c, h, w = x.shape
    eff = (k - 1) * dil + 1
    out = []
    for size in (h, w):
        num = size + 2 * p - eff
        o = (-(-num // s) if ceil_mode else num // s) + 1
        if ceil_mode and (o - 1) * s >= size + p:
            o -= 1
        out.append(o)
    extra = [max((o - 1) * s + eff - (size + 2 * p), 0) for o, size in zip(out, (h, w))]
    xf = x.astype(np.float64)
    fill = -np.inf if mode == "max" else 0.0
    xp = np.pad(xf, ((0, 0), (0, 0), (p, p + extra[0]), (p, p + extra[1])), constant_values=fill)
    win = np.lib.stride_tricks.sliding_window_view(xp, (eff, eff), axis=(2, 3))
    win = win[:, :, : (out[0] - 1) * s + 1 : s, : (out[1] - 1) * s + 1 : s, ::dil, ::dil]
    if mode == "max":
        return win.max(axis=(-2, -1))
    inside = np.pad(np.ones((h, w)), ((p, p + extra[0]), (p, p + extra[1])))
    padded = np.pad(np.ones((h + 2 * p, w + 2 * p)), ((0, extra[0]), (0, extra[1])))
    cnt_src = padded if count_include_pad else inside
    cnt = np.lib.stride_tricks.sliding_window_view(cnt_src, (eff, eff))
    cnt = cnt[: (out[0] - 1) * s + 1 : s, : (out[1] - 1) * s + 1 : s, ::dil, ::dil].sum(axis=(-2, -1))
    return win.sum(axis=(-2, -1)) / cnt


def rel_err(y, want):
    return float(np.abs(y.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30))


# -- 4096x4096 through the eager API: bounded peak memory -----------------------------------------------------
def _peak_of(fn):
    """(result, pool bytes allocated at the peak of ``fn()`` above what was live before)."""
    gc.collect()
    opsnn.current_stream().synchronize()
    base = opsnn.memory.current_bytes()
    opsnn.memory.reset_peak()
    out = fn()
    opsnn.current_stream().synchronize()
    return out, opsnn.memory.summary()["peak_bytes"] - base


def _crops(out_h, out_w, size=48):
    """Regions of the output to check: the four corners (padding on two sides) and the middle."""
    rows = [(0, size), (out_h // 2 - size // 2, out_h // 2 + size // 2), (out_h - size, out_h)]
    cols = [(0, size), (out_w - size, out_w)]
    return [(r, c) for r in rows for c in cols] + [((out_h // 2, out_h // 2 + size), (out_w // 2, out_w // 2 + size))]


def _check_conv_crops(x, w, b, y, stride, pad):
    kh = w.shape[2]
    for (r0, r1), (c0, c1) in _crops(y.shape[2], y.shape[3]):
        # the input rows/columns these outputs read, with the image's own padding where it lies outside
        i0, i1 = r0 * stride - pad, (r1 - 1) * stride - pad + kh
        j0, j1 = c0 * stride - pad, (c1 - 1) * stride - pad + kh
        sub = x[:, :, max(i0, 0) : min(i1, x.shape[2]), max(j0, 0) : min(j1, x.shape[3])]
        pads = (max(-i0, 0), max(-j0, 0), max(i1 - x.shape[2], 0), max(j1 - x.shape[3], 0))
        want = conv_oracle(sub, w, b, (stride, stride), pads)
        assert want.shape[2:] == (r1 - r0, c1 - c0)
        assert rel_err(y[:, :, r0:r1, c0:c1], want) < FP32_TOL, f"crop rows {r0}:{r1} cols {c0}:{c1}"


@pytest.fixture(scope="module")
def big_image():
    rng = np.random.default_rng(7)
    return rng.standard_normal((1, 1, BIG, BIG), dtype=np.float32)


@pytest.mark.parametrize("algo,stride", [(None, 1), ("conv2d_im2col", 1), ("conv2d_im2col", 2), ("conv2d_direct", 2)])
def test_conv_4096_bounded_peak(big_image, algo, stride):
    """3x3 pad 1, 1 -> 4 channels on a 1x1x4096x4096 image: right on every crop, and the pool's
    peak (input + output + workspace) within 2x (input + output)."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    x = opsnn.tensor(big_image)
    kw = {} if algo is None else {"algo": algo}
    made = []

    def run():  # prepare binds the output, so it is inside the measured region
        made.append(opsnn.aclnn.conv2d.prepare(x, w, b, stride=stride, padding=1, **kw))
        return made[0].run().numpy()

    y, peak = _peak_of(run)
    ex = made[0]
    in_bytes = big_image.nbytes
    io = in_bytes + y.nbytes
    print(
        f"\nconv {ex.kernel_name} stride {stride}: workspace {ex.workspace_size / 2**20:.1f} MiB, peak "
        f"{(peak + in_bytes) / 2**20:.0f} MiB (input + output {io / 2**20:.0f} MiB, ratio "
        f"{(peak + in_bytes) / io:.3f})"
    )
    assert ex.workspace_size <= 2 * KC.BAND_BYTES
    assert peak + in_bytes <= 2 * io
    _check_conv_crops(big_image, w, b, y, stride, 1)


@pytest.mark.parametrize("mode,k,s,p", [("max", 3, 1, 1), ("max", 2, 2, 0), ("avg", 3, 1, 1), ("avg", 3, 2, 1)])
def test_pool_4096_bounded_peak(big_image, mode, k, s, p):
    x = opsnn.tensor(big_image)
    fn = opsnn.ops.max_pool2d if mode == "max" else opsnn.ops.avg_pool2d
    y, peak = _peak_of(lambda: fn(x, k, s, p).numpy())
    io = big_image.nbytes + y.nbytes
    print(
        f"\n{mode} pool k{k} s{s} p{p}: peak {(peak + big_image.nbytes) / 2**20:.0f} MiB (input + output "
        f"{io / 2**20:.0f} MiB)"
    )
    assert peak + big_image.nbytes <= 2 * io
    for (r0, r1), (c0, c1) in _crops(y.shape[2], y.shape[3]):
        i0, i1 = r0 * s - p, (r1 - 1) * s - p + k
        j0, j1 = c0 * s - p, (c1 - 1) * s - p + k
        sub = big_image[:, :, max(i0, 0) : min(i1, BIG), max(j0, 0) : min(j1, BIG)]
        # an interior crop needs no padding; a border crop gets the image's own padding on that side
        pt, pl = max(-i0, 0), max(-j0, 0)
        pb_, pr = max(i1 - BIG, 0), max(j1 - BIG, 0)
        fill = -np.inf if mode == "max" else 0.0
        xp = np.pad(sub.astype(np.float64), ((0, 0), (0, 0), (pt, pb_), (pl, pr)), constant_values=fill)
        win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))[:, :, ::s, ::s]
        want = win.max(axis=(-2, -1)) if mode == "max" else win.sum(axis=(-2, -1)) / (k * k)  # torch: pad counts
        got = y[:, :, r0:r1, c0:c1]
        assert want.shape == got.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _kernel(op, name, arrays, attrs, constant=()):
    """(kernel ``name`` of ``op``, the planned context, whether it accepts the shapes: correct
    when its predicate says yes or only NotPreferred)."""
    rec = get_op(op)
    metas = [TensorMeta(a.shape, a.dtype) for a in arrays]
    ctx = plan_op(rec, metas, [a if i in constant else None for i, a in enumerate(arrays)], attrs).ctx
    k = next(k for k in rec.kernels if k.name == name)
    why = k.check(ctx)
    return k, ctx, why is None or isinstance(why, autotune.NotPreferred), why


def _workspace(op, name, arrays, attrs, constant=()):
    k, ctx, ok, _ = _kernel(op, name, arrays, attrs, constant)
    if not ok:
        return None
    plan = k.plan(ctx) if k.plan else None
    return int(k.workspace(ctx, plan)) if k.workspace else 0


@pytest.mark.parametrize(
    "c,m,stride,dil", [(8, 8, 1, 1), (3, 8, 2, 1), (16, 16, 1, 2), (64, 64, 2, 1), (128, 128, 1, 2)]
)
def test_every_conv_kernel_workspace_is_bounded_on_4096(c, m, stride, dil):
    """Planned (not run): every Conv kernel that accepts a 4096x4096 problem asks for a workspace
    that does not grow with the image's height (bands of rows), stays under the band / chunk cap
    unless a single row of columns or Winograd tiles needs more, and is far below input + output."""
    x = np.broadcast_to(np.float32(0), (1, c, BIG, BIG))
    taller = np.broadcast_to(np.float32(0), (1, c, 2 * BIG, BIG))
    w = np.zeros((m, c, 3, 3), np.float32)
    attrs = {"strides": [stride] * 2, "pads": [dil] * 4, "dilations": [dil] * 2, "group": 1}
    io = x.nbytes + m * (BIG // stride) ** 2 * 4
    one_row = max(c * 9 * (BIG // stride) * 4, 36 * (c + m) * (BIG // 4) * 4)  # im2col row / Winograd tile row
    seen = []
    for k in get_op("Conv").kernels:
        nbytes = _workspace("Conv", k.name, [x, w], attrs)
        if nbytes is None:
            continue
        seen.append(k.name)
        assert nbytes == _workspace("Conv", k.name, [taller, w], attrs), f"{k.name} grows with the height"
        limit = 2 * max(KC.BAND_BYTES, WG.CHUNK_BYTES, one_row) + 36 * c * m * 4
        assert nbytes <= limit, f"{k.name}: {nbytes} bytes"
        assert nbytes <= io // 8, f"{k.name}: {nbytes} bytes"
    assert "conv2d_im2col" in seen and "conv2d_direct" in seen


# -- banded == unbanded on small shapes -----------------------------------------------------------------------
def _run(op, name, arrays, attrs, constant=()):
    k, ctx, ok, why = _kernel(op, name, arrays, attrs, constant)
    assert ok, f"{name}: {why}"
    plan = k.plan(ctx) if k.plan else None
    ws = np.zeros(int(k.workspace(ctx, plan)) if k.workspace else 0, np.uint8)
    outs = [np.full(m.shape, np.nan, m.dtype) for m in ctx.outputs]
    k.fn(arrays, outs, ctx.attrs, plan, ws)
    return outs[0], plan, ws.nbytes


BANDED_CASES = [
    # (x shape, w shape, stride, pads (t, l, b, r), dilation, groups)
    ((1, 3, 13, 11), (4, 3, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),  # 13 rows: bands of 2/3/5 leave a rest
    ((2, 4, 17, 9), (5, 4, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),  # stride 2, batch 2
    ((1, 3, 15, 16), (4, 3, 3, 3), (2, 3), (0, 2, 1, 0), (1, 1), 1),  # unequal strides, asymmetric pads
    ((1, 4, 14, 12), (6, 4, 3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 1),  # dilation
    ((1, 2, 12, 13), (3, 2, 3, 3), (2, 2), (3, 1, 2, 4), (3, 2), 1),  # dilation + stride + big pads
    ((1, 3, 6, 7), (2, 3, 3, 3), (1, 1), (3, 3, 3, 3), (1, 1), 1),  # padding > kernel/2: bands of padding
    ((1, 5, 1, 1), (3, 5, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),  # 1x1 image
    ((1, 5, 1, 1), (3, 5, 3, 3), (2, 2), (2, 2, 2, 2), (1, 1), 1),  # 1x1 image, stride 2, all padding
    ((2, 6, 11, 10), (4, 3, 5, 3), (2, 1), (2, 1, 2, 1), (1, 1), 2),  # groups, 5x3 kernel
    ((1, 2, 9, 8), (3, 2, 2, 2), (3, 2), (0, 0, 0, 0), (1, 1), 1),  # stride > kernel: rows never read
]


@pytest.mark.parametrize("xs,ws,stride,pads,dil,groups", BANDED_CASES)
@pytest.mark.parametrize("kernel", ["conv2d_im2col", "conv2d_direct", "conv_nd_im2col"])
def test_banded_conv_equals_unbanded(monkeypatch, xs, ws, stride, pads, dil, groups, kernel):
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    attrs = {"strides": list(stride), "pads": list(pads), "dilations": list(dil), "group": groups}
    whole, plan, _ = _run("Conv", kernel, [x, w, b], attrs)
    assert plan.band == plan.out_sp[0]  # small problems run as one band
    want = conv_oracle(x, w, b, stride, pads, dil, groups)
    assert rel_err(whole, want) < FP32_TOL
    for cap in (1, 300, 700, 2000):  # 1 byte: one output row per band
        monkeypatch.setattr(KC, "BAND_BYTES", cap)
        y, plan, nbytes = _run("Conv", kernel, [x, w, b], attrs)
        if cap == 1 and (kernel != "conv2d_direct" or stride[1] > 1):
            assert plan.band == 1
        np.testing.assert_allclose(
            y, whole, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=f"{kernel} band {plan.band}"
        )


def test_banded_conv_1d_and_3d(monkeypatch):
    rng = np.random.default_rng(3)
    x1, w1 = rng.standard_normal((2, 3, 29)).astype(np.float32), rng.standard_normal((4, 3, 5)).astype(np.float32)
    a1 = {"strides": [2], "pads": [3, 1], "dilations": [2], "group": 1}
    want1 = conv_oracle(x1[:, :, None], w1[:, :, None], None, (1, 2), (0, 3, 0, 1), (1, 2))[:, :, 0]
    x3, w3 = (
        rng.standard_normal((1, 2, 7, 6, 5)).astype(np.float32),
        rng.standard_normal((3, 2, 3, 3, 2)).astype(np.float32),
    )
    a3 = {"strides": [2, 1, 1], "pads": [2, 1, 0, 2, 1, 1], "dilations": [1, 2, 1], "group": 1}
    # pads: begin (2, 1, 0), end (2, 1, 1), applied here so the oracle runs unpadded
    want3 = conv3d_oracle(np.pad(x3, ((0, 0), (0, 0), (2, 2), (1, 1), (0, 1))), w3, (2, 1, 1), (0, 0, 0), (1, 2, 1))
    for cap, band in ((1, 1), (6000, 2), (1 << 30, 5)):  # 3-D: one output depth's columns take 2880 bytes
        monkeypatch.setattr(KC, "BAND_BYTES", cap)
        for kernel in ("conv2d_im2col", "conv2d_direct", "conv_nd_im2col"):
            y, _, _ = _run("Conv", kernel, [x1, w1], a1)
            assert rel_err(y, want1) < FP32_TOL, (kernel, cap)
        y, plan, _ = _run("Conv", "conv_nd_im2col", [x3, w3], a3)
        assert rel_err(y, want3) < FP32_TOL, cap
        assert plan.band == band


@pytest.mark.parametrize(
    "xs,m,pads,dil",
    [
        ((1, 9, 14, 11), 8, (1, 1, 1, 1), (1, 1)),
        ((2, 8, 13, 10), 9, (3, 0, 1, 2), (1, 1)),
        ((1, 8, 1, 1), 8, (1, 1, 1, 1), (1, 1)),
        ((1, 8, 17, 15), 8, (2, 2, 2, 2), (2, 2)),
        ((2, 8, 11, 14), 8, (3, 1, 0, 4), (3, 2)),
    ],
)
def test_winograd_chunked_equals_whole(monkeypatch, xs, m, pads, dil):
    """Winograd (dense and dilated, whose phases are read and written as strided views) with one
    tile row per chunk vs all at once."""
    rng = np.random.default_rng(xs[2])
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal((m, xs[1], 3, 3)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    attrs = {"strides": [1, 1], "pads": list(pads), "dilations": list(dil), "group": 1}
    kernel = "conv2d_winograd" if dil == (1, 1) else "conv2d_winograd_dilated"
    want = conv_oracle(x, w, b, (1, 1), pads, dil)
    whole, _, big_ws = _run("Conv", kernel, [x, w, b], attrs, constant={1, 2})
    assert rel_err(whole, want) < WINO_TOL
    monkeypatch.setattr(WG, "CHUNK_BYTES", 1)
    y, _, small_ws = _run("Conv", kernel, [x, w, b], attrs)
    assert small_ws <= big_ws + 36 * m * xs[1] * 4 + 64
    np.testing.assert_allclose(y, whole, rtol=1e-5, atol=1e-5 * np.abs(want).max())


POOL_CASES = [
    # (shape, kernel, stride, pad, dilation, ceil_mode)
    ((1, 2, 13, 11), 3, 1, 1, 1, False),
    ((2, 1, 17, 9), 3, 2, 1, 1, True),
    ((1, 1, 12, 12), 2, 2, 0, 1, False),
    ((1, 3, 15, 10), 3, 1, 2, 2, False),  # dilation
    ((1, 1, 1, 1), 3, 1, 1, 1, False),  # 1x1 image
    ((1, 1, 19, 7), 3, 3, 1, 2, True),  # stride = kernel, dilation, ceil mode
]


@pytest.mark.parametrize(
    "mode,shape,k,s,p,d,ceil",
    [(mode,) + c for mode in ("max", "avg") for c in POOL_CASES if mode == "max" or c[4] == 1],
)  # AveragePool: no dilation
def test_pool_scratch_cap_equals_uncapped(monkeypatch, mode, shape, k, s, p, d, ceil):
    rng = np.random.default_rng(shape[2])
    x = rng.standard_normal(shape).astype(np.float32)
    fn = opsnn.ops.max_pool2d if mode == "max" else opsnn.ops.avg_pool2d
    kw = {"dilation": d} if mode == "max" else {}
    want = pool_oracle(x, k, s, p, d, mode, ceil)
    op = "MaxPool" if mode == "max" else "AveragePool"
    attrs = {"kernel_shape": [k, k], "strides": [s, s], "pads": [p] * 4, "ceil_mode": int(ceil)}
    if mode == "max":
        attrs.update(dilations=[d, d], storage_order=0)
    else:
        attrs["count_include_pad"] = 1
    name = "max_pool_numba" if mode == "max" else "avg_pool_numba"
    results = []
    for cap in (1, 200, 1 << 30):
        monkeypatch.setattr(KP, "SCRATCH_BYTES", cap)
        monkeypatch.setattr(KP, "PARALLEL_MIN", 0)  # row blocks apply to the parallel path
        y, plan, _ = _run(op, name, [x], attrs)
        if cap == 1:
            assert plan.row_block == 1
        results.append(y)
        np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6, err_msg=f"cap {cap}")
    np.testing.assert_array_equal(results[0], results[-1])
    if p <= k // 2:  # the eager (torch-style) entry point agrees too; it refuses larger padding
        np.testing.assert_allclose(fn(x, k, s, p, ceil_mode=ceil, **kw).numpy(), want, rtol=1e-6, atol=1e-6)


def conv_transpose_oracle(x, w, stride, pads, dil, groups, out_pad=(0, 0)):
    """float64 2-D transposed conv: scatter x * w[kernel offset] into a full buffer, then crop."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    mg, kh, kw = w.shape[1:]
    cg = c // groups
    full = (
        (h - 1) * stride[0] + (kh - 1) * dil[0] + 1 + out_pad[0],
        (wd - 1) * stride[1] + (kw - 1) * dil[1] + 1 + out_pad[1],
    )
    buf = np.zeros((n, mg * groups) + full)
    for g in range(groups):
        for i, j in itertools.product(range(kh), range(kw)):
            contrib = np.einsum("nchw,cm->nmhw", x[:, g * cg : (g + 1) * cg], w[g * cg : (g + 1) * cg, :, i, j])
            buf[
                :,
                g * mg : (g + 1) * mg,
                i * dil[0] : i * dil[0] + (h - 1) * stride[0] + 1 : stride[0],
                j * dil[1] : j * dil[1] + (wd - 1) * stride[1] + 1 : stride[1],
            ] += contrib
    return buf[:, :, pads[0] : full[0] - pads[2], pads[1] : full[1] - pads[3]]


@pytest.mark.parametrize(
    "xs,ws,stride,pads,dil,groups",
    [
        ((1, 3, 9, 7), (3, 4, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
        ((2, 4, 7, 8), (4, 3, 3, 2), (1, 2), (0, 1, 2, 0), (2, 1), 2),
        ((1, 2, 1, 1), (2, 5, 3, 3), (3, 3), (0, 0, 0, 0), (1, 1), 1),  # 1x1 image
        ((1, 3, 11, 5), (3, 2, 4, 4), (3, 2), (2, 2, 1, 1), (1, 2), 1),  # stride < kernel, bands overlap outputs
    ],
)
def test_banded_conv_transpose_equals_unbanded(monkeypatch, xs, ws, stride, pads, dil, groups):
    rng = np.random.default_rng(xs[2] * 7 + ws[1])
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    attrs = {"strides": list(stride), "pads": list(pads), "dilations": list(dil), "group": groups}
    want = conv_transpose_oracle(x, w, stride, pads, dil, groups)
    results = []
    for cap, one_band in ((1 << 30, True), (1, False), (ws[1] * groups * ws[2] * ws[3] * xs[3] * 4 * 2, False)):
        monkeypatch.setattr(KC, "BAND_BYTES", cap)
        y, plan, _ = _run("ConvTranspose", "conv_transpose_col2im", [x, w], attrs)
        assert (plan.band == plan.in_sp[0]) == (one_band or xs[2] <= 2)
        assert y.shape == want.shape
        assert rel_err(y, want) < FP32_TOL, f"cap {cap}"
        results.append(y)
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_banded_conv_transpose_3d(monkeypatch):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 2, 5, 4, 3)).astype(np.float32)
    w = rng.standard_normal((2, 3, 3, 2, 2)).astype(np.float32)
    attrs = {"strides": [2, 1, 2], "pads": [1, 0, 1, 1, 0, 0], "dilations": [1, 1, 1], "group": 1}
    monkeypatch.setattr(KC, "BAND_BYTES", 1 << 30)
    whole, plan, _ = _run("ConvTranspose", "conv_transpose_col2im", [x, w], attrs)
    assert plan.band == 5
    want = get_op("ConvTranspose").reference([x, w], get_op("ConvTranspose").bind_attrs(attrs))
    assert rel_err(whole, want.astype(np.float64)) < FP32_TOL
    for cap in (1, 600):
        monkeypatch.setattr(KC, "BAND_BYTES", cap)
        y, plan, _ = _run("ConvTranspose", "conv_transpose_col2im", [x, w], attrs)
        assert plan.band < 5
        np.testing.assert_allclose(y, whole, rtol=1e-5, atol=1e-5 * np.abs(whole).max())


def test_conv_transpose_workspace_is_bounded_on_4096():
    w = np.zeros((8, 4, 3, 3), np.float32)
    attrs = {"strides": [2, 2], "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": 1}
    sizes = [
        _workspace("ConvTranspose", "conv_transpose_col2im", [np.broadcast_to(np.float32(0), (1, 8, h, BIG)), w], attrs)
        for h in (BIG, 2 * BIG)
    ]
    assert sizes[0] == sizes[1] <= 2 * KC.BAND_BYTES


def test_thin_banded_im2col_hands_over_to_direct(monkeypatch):
    """A 4096x4096 conv with few output channels runs the direct kernel (banded thin GEMMs are
    not preferred); with more output channels, or columns that fit one band, im2col stays
    (oneDNN's plain forward, preferred to both on small images, left out)."""
    monkeypatch.setenv("OPSNN_CONV_ONEDNN", "0")

    def chosen(c, m, size):
        x = np.broadcast_to(np.float32(0), (1, c, size, size))
        return opsnn.aclnn.conv2d.prepare(x, np.zeros((m, c, 3, 3), np.float32), padding=1)

    ex = chosen(1, 4, BIG)
    assert ex.kernel_name == "conv2d_direct"
    assert "thin GEMMs" in dict(ex.rejected)["conv2d_im2col"]
    # (with Intel MKL a weight this small runs the one-region task form of im2col)
    im2col = "conv2d_im2col" if opsnn.kernels.cpu.mkl.unavailable() else "conv2d_im2col_tasks"
    assert chosen(3, 16, BIG).kernel_name == im2col
    assert chosen(1, 4, 64).kernel_name == im2col
