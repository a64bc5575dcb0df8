"""opsnn.nn.utils against torch.nn.utils: norms and clipping, BatchNorm fusion, weight_norm, spectral_norm,
skip_init (same weights copied from torch; values and gradients compared with stated tolerances)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import opsnn
from opsnn import nn, ops
from opsnn.errors import ParamInvalidError

torch = pytest.importorskip("torch")


def _copy(tm, om) -> None:
    om.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _sq_sum(y):
    return ops.sum(ops.mul(y, y))


# -- norms and clipping -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.5, float("inf"), float("-inf"), "inf"])
def test_get_total_norm_matches_torch(norm_type):
    arrays = [_rand(3, 4, seed=1), _rand(5, seed=2), _rand(2, 2, 2, seed=3)]
    want = torch.nn.utils.get_total_norm([torch.tensor(a) for a in arrays], norm_type=float(norm_type))
    got = nn.utils.get_total_norm([opsnn.tensor(a) for a in arrays], norm_type=norm_type)
    assert got.shape == () and got.dtype == np.float32
    np.testing.assert_allclose(float(got), float(want), rtol=1e-5)


def test_get_total_norm_single_tensor_empty_and_errors():
    a = _rand(6)
    np.testing.assert_allclose(float(nn.utils.get_total_norm(opsnn.tensor(a))), np.linalg.norm(a), rtol=1e-5)
    assert float(nn.utils.get_total_norm([])) == 0.0
    with pytest.raises(ParamInvalidError, match="norm_type"):
        nn.utils.get_total_norm([opsnn.tensor(a)], norm_type=-1.0)
    bad = opsnn.tensor(np.array([1.0, np.inf], np.float32))
    assert np.isinf(float(nn.utils.get_total_norm([bad])))
    with pytest.raises(ParamInvalidError, match="error_if_nonfinite"):
        nn.utils.get_total_norm([bad], error_if_nonfinite=True)


def test_get_total_norm_is_not_recorded():
    tx = torch.tensor(_rand(4, 3, seed=4), requires_grad=True)
    ox = opsnn.tensor(_rand(4, 3, seed=4)).requires_grad_()
    assert nn.utils.get_total_norm([ox]).requires_grad is torch.nn.utils.get_total_norm([tx]).requires_grad is False


@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clip_grads_with_norm_matches_torch(max_norm):
    grads = [_rand(3, 2, seed=5), _rand(4, seed=6)]
    tps = [torch.nn.Parameter(torch.zeros(g.shape)) for g in grads]
    ops_ps = [nn.Parameter(np.zeros(g.shape, np.float32)) for g in grads]
    for tp, op, g in zip(tps, ops_ps, grads):
        tp.grad = torch.tensor(g)
        op.grad = opsnn.tensor(g)
    tn = torch.nn.utils.get_total_norm([p.grad for p in tps])
    torch.nn.utils.clip_grads_with_norm_(tps, max_norm, tn)
    on = nn.utils.get_total_norm([p.grad for p in ops_ps])
    assert nn.utils.clip_grads_with_norm_(ops_ps, max_norm, on) is None
    for tp, op in zip(tps, ops_ps):
        np.testing.assert_allclose(op.grad.numpy(), tp.grad.numpy(), rtol=1e-5)
    # a float total norm works as well; parameters without a gradient are skipped
    nn.utils.clip_grads_with_norm_([nn.Parameter(np.zeros(2, np.float32))], 1.0, 3.0)


def test_clip_grad_norm_is_the_deprecated_alias():
    g = np.array([3.0, 4.0], np.float32)
    p = nn.Parameter(np.zeros(2, np.float32))
    p.grad = opsnn.tensor(g)
    with pytest.warns(FutureWarning, match="clip_grad_norm_"):
        total = nn.utils.clip_grad_norm(p, 1.0)
    assert float(total) == pytest.approx(5.0)
    np.testing.assert_allclose(p.grad.numpy(), g / (5.0 + 1e-6), rtol=1e-6)


# -- fusion ------------------------------------------------------------------------------------------------------------
def _trained_bn(tbn, seed):
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        tbn.running_mean.copy_(torch.tensor(rng.standard_normal(tbn.num_features).astype(np.float32)))
        tbn.running_var.copy_(torch.tensor(rng.uniform(0.5, 2.0, tbn.num_features).astype(np.float32)))
        if tbn.affine:
            tbn.weight.copy_(torch.tensor(rng.standard_normal(tbn.num_features).astype(np.float32)))
            tbn.bias.copy_(torch.tensor(rng.standard_normal(tbn.num_features).astype(np.float32)))
    return tbn.eval()


@pytest.mark.parametrize("bias,affine", [(True, True), (False, True), (True, False)])
def test_fuse_conv_bn_eval_matches_unfused_and_torch(bias, affine):
    tconv = torch.nn.Conv2d(3, 4, 3, padding=1, bias=bias).eval()
    tbn = _trained_bn(torch.nn.BatchNorm2d(4, affine=affine), 7)
    oconv, obn = nn.Conv2d(3, 4, 3, padding=1, bias=bias).eval(), nn.BatchNorm2d(4, affine=affine).eval()
    _copy(tconv, oconv)
    _copy(tbn, obn)
    fused = nn.utils.fuse_conv_bn_eval(oconv, obn)
    tfused = torch.nn.utils.fuse_conv_bn_eval(tconv, tbn)
    x = _rand(2, 3, 6, 5, seed=8)
    unfused = obn(oconv(opsnn.tensor(x))).numpy()
    np.testing.assert_allclose(fused(opsnn.tensor(x)).numpy(), unfused, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fused.weight.numpy(), tfused.weight.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fused.bias.numpy(), tfused.bias.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert fused is not oconv and oconv.weight is not fused.weight
    assert fused.weight.requires_grad and fused.bias.requires_grad == bias


def test_fuse_conv_transpose_bn_eval():
    tconv = torch.nn.ConvTranspose2d(3, 4, 3, stride=2).eval()
    tbn = _trained_bn(torch.nn.BatchNorm2d(4), 9)
    oconv, obn = nn.ConvTranspose2d(3, 4, 3, stride=2).eval(), nn.BatchNorm2d(4).eval()
    _copy(tconv, oconv)
    _copy(tbn, obn)
    fused = nn.utils.fuse_conv_bn_eval(oconv, obn, transpose=True)
    x = _rand(1, 3, 4, 4, seed=10)
    np.testing.assert_allclose(
        fused(opsnn.tensor(x)).numpy(), obn(oconv(opsnn.tensor(x))).numpy(), rtol=1e-4, atol=1e-5
    )
    tw = torch.nn.utils.fuse_conv_bn_eval(tconv, tbn, transpose=True).weight.detach().numpy()
    np.testing.assert_allclose(fused.weight.numpy(), tw, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("features", [5, 1])
def test_fuse_linear_bn_eval_matches_unfused_and_torch(features):
    tlin = torch.nn.Linear(3, 5).eval()
    tbn = _trained_bn(torch.nn.BatchNorm1d(features), 11)
    olin, obn = nn.Linear(3, 5).eval(), nn.BatchNorm1d(features).eval()
    _copy(tlin, olin)
    _copy(tbn, obn)
    fused = nn.utils.fuse_linear_bn_eval(olin, obn)
    tfused = torch.nn.utils.fuse_linear_bn_eval(tlin, tbn)
    x = _rand(4, 3, seed=12)
    want = tfused(torch.tensor(x)).detach().numpy()
    np.testing.assert_allclose(fused(opsnn.tensor(x)).numpy(), want, rtol=1e-4, atol=1e-5)
    if features == 5:
        np.testing.assert_allclose(
            fused(opsnn.tensor(x)).numpy(), obn(olin(opsnn.tensor(x))).numpy(), rtol=1e-4, atol=1e-5
        )


def test_fuse_weights_functions_and_errors():
    tw, tb = torch.nn.utils.fuse_linear_bn_weights(
        torch.ones(2, 3), None, torch.zeros(2), torch.ones(2) * 4, 0.0, torch.ones(2) * 2, torch.ones(2)
    )
    ow, ob = nn.utils.fuse_linear_bn_weights(
        opsnn.tensor(np.ones((2, 3), np.float32)),
        None,
        np.zeros(2, np.float32),
        np.full(2, 4.0, np.float32),
        0.0,
        np.full(2, 2.0, np.float32),
        np.ones(2, np.float32),
    )
    np.testing.assert_allclose(ow.numpy(), tw.detach().numpy())
    np.testing.assert_allclose(ob.numpy(), tb.detach().numpy())
    assert isinstance(ow, nn.Parameter) and not ob.requires_grad  # no linear bias: the fused bias needs no grad
    conv, bn = nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3)
    conv.train()
    with pytest.raises(ParamInvalidError, match="eval mode"):
        nn.utils.fuse_conv_bn_eval(conv, bn.eval())
    with pytest.raises(ParamInvalidError, match="channels"):
        nn.utils.fuse_conv_bn_eval(nn.Conv2d(2, 4, 1).eval(), bn.eval())
    with pytest.raises(ParamInvalidError, match="out_features"):
        nn.utils.fuse_linear_bn_eval(nn.Linear(2, 4).eval(), nn.BatchNorm1d(3).eval())
    with pytest.raises(ParamInvalidError, match="running statistics"):
        nn.utils.fuse_linear_bn_eval(nn.Linear(2, 3).eval(), nn.BatchNorm1d(3, track_running_stats=False).eval())


# -- weight_norm -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1, None, -1, 2])
def test_weight_norm_values_and_gradients_match_torch(dim):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch deprecates it for parametrizations
        tc = torch.nn.utils.weight_norm(torch.nn.Conv2d(2, 3, 3), dim=dim)
    oc = nn.utils.weight_norm(nn.Conv2d(2, 3, 3), dim=dim)
    assert list(oc.state_dict()) == list(tc.state_dict()) == ["bias", "weight_g", "weight_v"]
    assert oc.weight_g.shape == tuple(tc.weight_g.shape)
    _copy(tc, oc)
    x = _rand(2, 2, 5, 5, seed=13)
    ty = tc(torch.tensor(x))
    (ty * ty).sum().backward()
    oy = oc(opsnn.tensor(x))
    _sq_sum(oy).backward()
    np.testing.assert_allclose(oy.numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-5)
    for n in ("weight_g", "weight_v", "bias"):
        np.testing.assert_allclose(
            getattr(oc, n).grad.numpy(), getattr(tc, n).grad.numpy(), rtol=1e-4, atol=1e-4, err_msg=n
        )


def test_weight_norm_tracks_g_updates_and_removes():
    lin = nn.utils.weight_norm(nn.Linear(3, 2))
    np.testing.assert_allclose(lin.weight.numpy(), lin.weight_v.numpy(), rtol=1e-6)
    lin.weight_g.copy_(lin.weight_g.numpy() * 2)
    x = opsnn.tensor(_rand(4, 3, seed=14))
    y = lin(x)  # the pre-hook recomputes the weight from the new g
    np.testing.assert_allclose(lin.weight.numpy(), 2 * lin.weight_v.numpy(), rtol=1e-5)
    nn.utils.remove_weight_norm(lin)
    assert list(lin.state_dict()) == ["bias", "weight"] and isinstance(lin.weight, nn.Parameter)
    np.testing.assert_allclose(lin(x).numpy(), y.numpy(), rtol=1e-5)
    with pytest.raises(ParamInvalidError, match="no weight_norm"):
        nn.utils.remove_weight_norm(lin)
    with pytest.raises(ParamInvalidError, match="two weight_norm"):
        nn.utils.weight_norm(nn.utils.weight_norm(nn.Linear(2, 2)))
    with pytest.raises(ParamInvalidError, match="no parameter"):
        nn.utils.weight_norm(nn.Linear(2, 2), name="nope")
    with pytest.raises(ParamInvalidError, match="dim"):
        nn.utils.weight_norm(nn.Linear(2, 2), dim=5)


# -- spectral_norm -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make_t,make_o,shape,iters",
    [
        (lambda: torch.nn.Linear(4, 3), lambda: nn.Linear(4, 3), (5, 4), 1),
        (lambda: torch.nn.Conv2d(2, 3, 3), lambda: nn.Conv2d(2, 3, 3), (2, 2, 5, 5), 3),
        (lambda: torch.nn.ConvTranspose2d(2, 3, 3), lambda: nn.ConvTranspose2d(2, 3, 3), (1, 2, 4, 4), 2),
    ],
)
def test_spectral_norm_matches_torch_in_training_and_eval(make_t, make_o, shape, iters):
    tm = torch.nn.utils.spectral_norm(make_t(), n_power_iterations=iters)
    om = nn.utils.spectral_norm(make_o(), n_power_iterations=iters)
    assert list(om.state_dict()) == list(tm.state_dict()) == ["bias", "weight_orig", "weight_u", "weight_v"]
    assert om.weight_u.shape == tuple(tm.weight_u.shape) and om.weight_v.shape == tuple(tm.weight_v.shape)
    _copy(tm, om)
    tm.train()
    om.train()
    x = _rand(*shape, seed=15)
    for _ in range(2):  # two training steps: u and v advance each call
        ty = tm(torch.tensor(x))
        oy = om(opsnn.tensor(x))
        np.testing.assert_allclose(oy.numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(om.weight_u.numpy(), tm.weight_u.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(om.weight_v.numpy(), tm.weight_v.numpy(), rtol=1e-4, atol=1e-5)
    (ty * ty).sum().backward()
    _sq_sum(oy).backward()
    np.testing.assert_allclose(om.weight_orig.grad.numpy(), tm.weight_orig.grad.numpy(), rtol=1e-4, atol=1e-4)
    tm.eval()
    om.eval()
    u = om.weight_u.numpy().copy()
    np.testing.assert_allclose(om(opsnn.tensor(x)).numpy(), tm(torch.tensor(x)).detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(om.weight_u.numpy(), u)  # eval: no power iteration
    torch.nn.utils.remove_spectral_norm(tm)
    nn.utils.remove_spectral_norm(om)
    assert list(om.state_dict()) == list(tm.state_dict())
    np.testing.assert_allclose(om.weight.numpy(), tm.weight.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_spectral_norm_initial_u_comes_from_the_seeded_generator_and_errors():
    with nn.init.seeded(3):
        a = nn.utils.spectral_norm(nn.Linear(4, 3))
    with nn.init.seeded(3):
        b = nn.utils.spectral_norm(nn.Linear(4, 3))
    np.testing.assert_array_equal(a.weight_u.numpy(), b.weight_u.numpy())
    np.testing.assert_allclose(np.linalg.norm(a.weight_u.numpy()), 1.0, rtol=1e-5)
    with pytest.raises(ParamInvalidError, match="n_power_iterations"):
        nn.utils.spectral_norm(nn.Linear(2, 2), n_power_iterations=0)
    with pytest.raises(ParamInvalidError, match="two spectral_norm"):
        nn.utils.spectral_norm(a)
    with pytest.raises(ParamInvalidError, match="no spectral_norm"):
        nn.utils.remove_spectral_norm(nn.Linear(2, 2))
    with pytest.raises(ParamInvalidError, match="dim"):
        nn.utils.spectral_norm(nn.Linear(2, 2), dim=3)


# -- skip_init ---------------------------------------------------------------------------------------------------------
def test_skip_init_leaves_the_generator_alone():
    with nn.init.seeded(5):
        lin = nn.utils.skip_init(nn.Linear, 4, 3, bias=False)
        after = nn.init.generator().standard_normal(3)
    with nn.init.seeded(5):
        want = nn.init.generator().standard_normal(3)
    np.testing.assert_array_equal(after, want)
    assert lin.weight.shape == (3, 4) and lin.bias is None and lin.weight.requires_grad
    with pytest.raises(ParamInvalidError, match="Module class"):
        nn.utils.skip_init(lambda: None)
    with pytest.raises(ParamInvalidError, match="CPU"):
        nn.utils.skip_init(nn.Linear, 2, 2, device="cuda")
