"""Tiled inference (opsnn.pipeline.tiling) and the super-resolution model (opsnn.models.superres).

Oracles: the untiled run of the same model (tiling must not change the result), a numpy
convolution + pixel shuffle written here for the model itself, and hand-derived receptive fields.
"""

import gc

import numpy as np
import pytest

import opsnn
from opsnn import ops
from opsnn.errors import ParamInvalidError
from opsnn.models.superres import SuperResNet, superres
from opsnn.pipeline import TiledExecutor, receptive_field, tiled

RTOL = ATOL = 1e-4  # fp32: a tile may pick another kernel or GEMM blocking than the whole image


# -- numpy oracles -------------------------------------------------------------------------------------
def np_conv2d(x, w, b, pad):
    n, c, h, wd = x.shape
    k = w.shape[-1]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))  # n c h w k k
    y = np.einsum("nchwij,ocij->nohw", win, w.astype(np.float64))
    return y + b.reshape(1, -1, 1, 1)


def np_pixel_shuffle(x, r):
    n, c, h, w = x.shape
    return x.reshape(n, c // (r * r), r, r, h, w).transpose(0, 1, 4, 2, 5, 3).reshape(n, c // (r * r), h * r, w * r)


def np_superres(net: SuperResNet, x):
    convs = [m for m in net.body if isinstance(m, opsnn.nn.Conv2d)]
    y = x
    for i, conv in enumerate(convs):
        y = np_conv2d(y, conv.weight.numpy(), conv.bias.numpy(), conv.kernel_size[0] // 2)
        if i < len(convs) - 1:
            y = np.maximum(y, 0)
    return np_pixel_shuffle(y, net.scale) if net.scale > 1 else y


# -- the model ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale,cin,layers,k0", [(2, 1, 3, 5), (3, 3, 2, 3), (1, 2, 4, 3)])
def test_superres_matches_numpy(rng, no_leak, scale, cin, layers, k0):
    net = superres(scale=scale, in_channels=cin, channels=6, num_layers=layers, first_kernel=k0, seed=1)
    x = rng.standard_normal((2, cin, 13, 11)).astype(np.float32)
    y = net(opsnn.tensor(x)).numpy()
    assert y.shape == (2, cin, 13 * scale, 11 * scale)
    np.testing.assert_allclose(y, np_superres(net, x), rtol=1e-4, atol=1e-4)
    assert net.receptive_field() == (k0 - 1) // 2 + (layers - 1)
    assert sorted(net.state_dict())[:2] == ["body.0.bias", "body.0.weight"]


def test_superres_deterministic_and_bad_args():
    a, b = superres(seed=3, channels=4), superres(seed=3, channels=4)
    np.testing.assert_array_equal(a.body[0].weight.numpy(), b.body[0].weight.numpy())
    for kw in ({"scale": 0}, {"channels": -1}, {"num_layers": 1}, {"first_kernel": 4}, {"scale": 2.0}):
        with pytest.raises(ParamInvalidError):
            SuperResNet(**kw)


# -- receptive field ---------------------------------------------------------------------------------------------
def _w(rng, co, ci, k):
    return opsnn.tensor((rng.standard_normal((co, ci, k, k)) * 0.3).astype(np.float32))


def test_receptive_field_of_superres_and_compiled(rng):
    net = superres(scale=2, channels=4, num_layers=3, first_kernel=5)
    x = np.zeros((1, 1, 16, 16), np.float32)
    rf = receptive_field(net, x)
    assert (rf.halo, rf.scale, rf.align) == (net.receptive_field(), 2, 1)
    cg = opsnn.compile(net, [x])  # optimized graph: FusedConv nodes
    rf2 = receptive_field(cg)
    assert (rf2.halo, rf2.scale) == (4, 2)
    assert "Conv" in rf.explain()


def test_a_compiled_graph_with_blocked_convolutions_tiles(rng, no_leak):
    """32 channels: the blocked-layout pass (where oneDNN runs) turns the convs into BlockedConv chains with
    their ToBlocked / FromBlocked reorders; the receptive field reads through them and the tiled run of the
    compiled graph equals the untiled one."""
    net = superres(scale=2, channels=32, num_layers=3, first_kernel=5, seed=3)
    x = rng.standard_normal((1, 1, 37, 30)).astype(np.float32)
    cg = opsnn.compile(net, [x[:, :, :16, :16]], dynamic_dims={0: {2: "h", 3: "w"}})
    rf = receptive_field(cg)
    assert (rf.halo, rf.scale) == (net.receptive_field(), 2)
    ex = TiledExecutor(cg, tile=12)
    np.testing.assert_allclose(ex.run(x).numpy(), net(opsnn.tensor(x)).numpy(), rtol=RTOL, atol=ATOL)
    from opsnn.kernels.cpu import onednn

    if onednn.unavailable() is None:
        assert any(n.op_type == "BlockedConv" for n in cg.graph.nodes), [n.op_type for n in cg.graph.nodes]


def test_receptive_field_dilation_stride_pool_resize_residual(rng):
    w1, w2, w3 = _w(rng, 4, 2, 3), _w(rng, 8, 4, 3), _w(rng, 2, 2, 3)

    def f(x):
        a = ops.relu(ops.conv2d(x, w1, None, padding=2, dilation=2))  # reach 2
        b = ops.max_pool2d(a, 3, stride=1, padding=1)  # reach +1 = 3
        c = ops.conv2d(b, w2, None, stride=2, padding=1)  # reach +1 = 4, half res, align 2
        d = ops.pixel_shuffle(c, 2)  # back to full res (2 ch)
        e = ops.add(d, ops.conv2d(x, w3, None, padding=1))  # residual branch: reach 1
        return ops.interpolate(e, scale_factor=2, mode="nearest")  # reach +1, x2

    x = np.zeros((1, 2, 16, 16), np.float32)
    rf = receptive_field(f, x)
    assert rf.scale == 2 and rf.align == 2
    assert rf.reach == 5 and rf.halo == 6  # 5 rounded up to the alignment


@pytest.mark.parametrize(
    "bad,msg",
    [
        (lambda x, w: ops.conv2d(x, w, None, padding=0), "change the output size"),
        (lambda x, w: ops.adaptive_avg_pool2d(ops.conv2d(x, w, None, padding=1), 1), "not a convolution"),
        (
            lambda x, w: ops.add(ops.conv2d(x, w, None, padding=1), opsnn.tensor(np.ones((1, 1, 8, 8), np.float32))),
            "varies over the image",
        ),
        (lambda x, w: ops.interpolate(ops.conv2d(x, w, None, padding=1), size=(20, 20)), "fixed sizes"),
    ],
)
def test_receptive_field_refuses_non_local_graphs(rng, bad, msg):
    w = _w(rng, 1, 1, 3)
    with pytest.raises(ParamInvalidError, match=msg):
        receptive_field(lambda x: bad(x, w), np.zeros((1, 1, 8, 8), np.float32))


# -- tiled == untiled ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "shape,tile,scale,cin",
    [
        ((1, 1, 70, 53), 16, 2, 1),  # odd sizes, partial last tiles
        ((2, 3, 40, 37), 8, 3, 3),  # batch 2, RGB, tile smaller than 2 x halo
        ((1, 2, 25, 31), 64, 1, 2),  # one tile bigger than the image
        ((1, 1, 33, 96), 32, 2, 1),  # image exactly 3 tiles wide
    ],
)
def test_tiled_equals_untiled(rng, no_leak, shape, tile, scale, cin):
    net = superres(scale=scale, in_channels=cin, channels=6, num_layers=3, first_kernel=5, seed=2)
    x = rng.standard_normal(shape).astype(np.float32)
    want = net(opsnn.tensor(x)).numpy()
    ex = TiledExecutor(net, tile=tile)
    got = ex.run(x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got.numpy(), want, rtol=RTOL, atol=ATOL)
    assert ex.stats["halo"] == 4 and ex.stats["scale"] == str(scale)
    h, w = shape[2:]
    assert ex.stats["tiles"] == -(-h // tile) * -(-w // tile)
    # a too-small halo visibly breaks equality: the check above is not vacuous
    if min(h, w) > tile + 2:
        bad = TiledExecutor(net, tile=tile)
        bad._prepare(np.zeros((shape[0], cin, tile, tile), np.float32))
        bad.field.halo = 1
        assert not np.allclose(bad.run(x).numpy(), want, rtol=RTOL, atol=ATOL)


def test_tiled_strided_model_and_compiled_graph(rng, no_leak):
    w1, w2 = _w(rng, 8, 3, 3), _w(rng, 12, 8, 3)

    def f(x):
        y = ops.relu(ops.conv2d(x, w1, None, stride=2, padding=1))
        return ops.pixel_shuffle(ops.conv2d(y, w2, None, padding=1), 2)  # 3 channels, input size

    x = rng.standard_normal((1, 3, 46, 38)).astype(np.float32)
    want = f(opsnn.tensor(x)).numpy()
    got = tiled(f, x, tile=16)
    np.testing.assert_allclose(got.numpy(), want, rtol=RTOL, atol=ATOL)
    cg = opsnn.compile(f, [x[:, :, :20, :20]], dynamic_dims={0: {2: "h", 3: "w"}})
    ex = TiledExecutor(cg, tile=10)
    np.testing.assert_allclose(ex.run(x).numpy(), want, rtol=RTOL, atol=ATOL)
    assert ex.stats["align"] == 2 and ex.stats["halo"] == 4  # reach 1 + 1/(1/2) = 3 -> aligned to 4


def test_tiled_explicit_halo_for_unanalyzable_model(rng, no_leak):
    w = _w(rng, 2, 1, 3)

    def f(x):  # Pad + 'valid' conv: local, but the analysis does not model Pad
        return ops.conv2d(ops.pad(x, [1, 1, 1, 1]), w, None)

    x = rng.standard_normal((1, 1, 30, 27)).astype(np.float32)
    want = f(opsnn.tensor(x)).numpy()
    with pytest.raises(ParamInvalidError, match="pass halo"):
        tiled(f, x, tile=8)
    np.testing.assert_allclose(tiled(f, x, tile=8, halo=1).numpy(), want, rtol=RTOL, atol=ATOL)


def test_tiled_out_argument_and_tensor_input(rng, no_leak):
    net = superres(scale=2, channels=4, num_layers=2, first_kernel=3)
    x = opsnn.tensor(rng.standard_normal((1, 1, 20, 24)).astype(np.float32))
    out = np.full((1, 1, 40, 48), np.nan, np.float32)
    res = tiled(net, x, tile=8, out=out)
    assert res.numpy() is out or np.shares_memory(res.numpy(), out)
    np.testing.assert_allclose(out, net(x).numpy(), rtol=RTOL, atol=ATOL)
    with pytest.raises(ParamInvalidError, match="out has shape"):
        tiled(net, x, tile=8, out=np.zeros((1, 1, 40, 40), np.float32))


def test_max_working_bytes_shrinks_the_tile(rng, no_leak):
    net = superres(scale=2, channels=8, num_layers=3, first_kernel=3)
    x = rng.standard_normal((1, 1, 96, 80)).astype(np.float32)
    want = net(opsnn.tensor(x)).numpy()
    big = TiledExecutor(net, tile=64)
    np.testing.assert_allclose(big.run(x).numpy(), want, rtol=RTOL, atol=ATOL)
    budget = big.stats["working_bytes"] // 3
    small = TiledExecutor(net, tile=64, max_working_bytes=budget)
    np.testing.assert_allclose(small.run(x).numpy(), want, rtol=RTOL, atol=ATOL)
    assert small.stats["tile"] < 64 and small.stats["working_bytes"] <= budget
    assert small.compiled.num_plans == 1  # the rejected crop sizes' arenas were freed
    with pytest.raises(ParamInvalidError, match="max_working_bytes"):
        TiledExecutor(net, max_working_bytes=0)


def test_tiled_bad_input(rng):
    net = superres(scale=2, channels=4, num_layers=2, first_kernel=3)
    x = rng.standard_normal((1, 1, 16, 16)).astype(np.float32)
    with pytest.raises(ParamInvalidError, match="NCHW"):
        tiled(net, x[0], tile=8)
    with pytest.raises(ParamInvalidError, match="empty"):
        tiled(net, x[:, :, :0], tile=8)
    with pytest.raises(ParamInvalidError, match="tile"):
        tiled(net, x, tile=0)
    with pytest.raises(ParamInvalidError, match="halo"):
        tiled(net, x, tile=8, halo=-1)
    with pytest.raises(ParamInvalidError, match="smaller than the model's receptive field"):
        tiled(net, x, tile=8, halo=1)
    with pytest.raises(ParamInvalidError, match="numpy array or opsnn Tensor"):
        tiled(net, [[1.0]], tile=8)
    with pytest.raises(ParamInvalidError, match="model must be"):
        TiledExecutor(42)
    w = _w(rng, 1, 1, 3)
    strided = lambda x: ops.conv2d(x, w, None, stride=2, padding=1)  # noqa: E731
    with pytest.raises(ParamInvalidError, match="multiple of 2"):
        tiled(strided, rng.standard_normal((1, 1, 15, 16)).astype(np.float32), tile=8)
    with pytest.raises(ParamInvalidError, match="multiple of 2"):
        tiled(strided, rng.standard_normal((1, 1, 16, 16)).astype(np.float32), tile=7)


# -- the large image ----------------------------------------------------------------------------------------------
def test_tiled_4096_peak_memory(no_leak):
    """4096x4096 through a light x2 super-resolution stack in 512-px tiles: peak pool memory
    (reset before the run) stays within 2x the input plus the output."""
    net = superres(scale=2, in_channels=1, channels=8, num_layers=3, first_kernel=3, seed=0)
    gc.collect()
    base = opsnn.memory.current_bytes()
    img = opsnn.tensor(np.random.default_rng(0).random((1, 1, 4096, 4096), dtype=np.float32))
    # the working-set cap makes the bound hold whichever conv kernel is chosen (im2col's workspace
    # would shrink the tile); conv2d_direct is pinned because it is the fastest for these few channels
    ex = TiledExecutor(net, tile=512, max_working_bytes=64 << 20)
    with opsnn.kernel_selector(Conv="conv2d_direct"):
        out = ex.run(img)
    st = ex.stats
    in_b, out_b = img.nbytes, out.nbytes
    assert (in_b, out_b) == (64 << 20, 256 << 20)
    peak = st["peak_bytes"] - base  # the pool's peak during the run, less what was live before the input
    print(
        f"\n4096x4096 x2: {st['tiles']} tiles of {st['crop']} (halo {st['halo']}, working set "
        f"{st['working_bytes'] / 2**20:.1f} MiB), {st['wall_s']:.2f} s, "
        f"peak {peak / 2**20:.1f} MiB vs input {in_b / 2**20:.0f} MiB + output {out_b / 2**20:.0f} MiB "
        f"(bound 2x input + output = {(2 * in_b + out_b) / 2**20:.0f} MiB)"
    )
    assert peak <= 2 * in_b + out_b
    # spot checks against the untiled computation of windows around tile seams and corners
    y = out.numpy()
    x = img.numpy()
    h = net.receptive_field()
    for r, c in [(512, 512), (0, 4096 - 16), (2040, 1530), (4096 - 16, 0)]:
        r0, c0 = max(r - 8 - h, 0), max(c - 8 - h, 0)
        r1, c1 = min(r + 16 + 8 + h, 4096), min(c + 16 + 8 + h, 4096)
        win = net(opsnn.tensor(np.ascontiguousarray(x[:, :, r0:r1, c0:c1]))).numpy()
        # compare the window's pixels that are at least h away from its inner borders
        ir0 = r0 if r0 == 0 else r0 + h
        ic0 = c0 if c0 == 0 else c0 + h
        ir1 = r1 if r1 == 4096 else r1 - h
        ic1 = c1 if c1 == 4096 else c1 - h
        np.testing.assert_allclose(
            y[:, :, 2 * ir0 : 2 * ir1, 2 * ic0 : 2 * ic1],
            win[:, :, 2 * (ir0 - r0) : 2 * (ir1 - r0), 2 * (ic0 - c0) : 2 * (ic1 - c0)],
            rtol=RTOL,
            atol=ATOL,
        )
    del y, x, out, img
