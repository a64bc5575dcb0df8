"""The torch.nn.functional functions and torch.nn stateless modules opsnn writes as compositions of its ops
(activations, margin / ranking / Poisson / Gaussian / triplet losses, adaptive max pooling, unpooling, LP
pooling, LRN, fold / unfold, affine_grid, padding modes, the in-place variants): values and input gradients
against torch on the same float32 inputs, the reductions, the random ones' statistics and seeding, argument
errors, and a compiled training step that uses a few of them."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch")
TF = torch.nn.functional

import opsnn  # noqa: E402
from opsnn import nn  # noqa: E402
from opsnn.errors import DTypeError, ParamInvalidError  # noqa: E402
from opsnn.nn import functional as F  # noqa: E402
from opsnn.nn import loss as loss_mod  # noqa: E402
from opsnn.nn import stateless  # noqa: E402

RNG = np.random.default_rng(23)


def _r(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _signs(*shape):
    return np.where(RNG.standard_normal(shape) > 0, 1.0, -1.0).astype(np.float32)


def _pool_indices(dims, x, *args):
    y, i = getattr(TF, f"max_pool{dims}d")(torch.tensor(x), *args, return_indices=True)
    return y.numpy(), i.numpy()


_Y1, _I1 = _pool_indices(1, _r(2, 3, 9), 3, 2)
_Y2, _I2 = _pool_indices(2, _r(2, 3, 7, 6), 2)
_Y3, _I3 = _pool_indices(3, _r(1, 2, 5, 4, 6), 2)
_MLM_TARGET = np.array([[3, 0, -1, 1, 2], [1, 2, 3, 4, 0], [-1, 0, 1, 1, 1]])

# name -> (arrays, further positional arguments, keyword arguments, indices of arrays that take no gradient);
# float arrays (and array keywords) become tensors, the float ones not listed requiring grad
CASES = {
    "logsigmoid": ([_r(3, 5) * 8], (), {}, ()),
    "softmin": ([_r(3, 5)], (), {"dim": 0}, ()),
    "tanhshrink": ([_r(3, 5)], (), {}, ()),
    "threshold": ([_r(3, 5)], (0.1, -2.0), {}, ()),
    "glu": ([_r(3, 6, 5)], (), {"dim": 1}, ()),
    "rrelu": ([_r(3, 5)], (0.2, 0.4), {}, ()),
    "cosine_embedding_loss": ([_r(4, 5), _r(4, 5), _signs(4)], (), {"margin": 0.2}, (2,)),
    "hinge_embedding_loss": ([_r(4, 5), _signs(4, 5)], (), {"margin": 0.5}, (1,)),
    "margin_ranking_loss": ([_r(7), _r(7), _signs(7)], (), {"margin": 0.1}, (2,)),
    "soft_margin_loss": ([_r(3, 4), _signs(3, 4)], (), {}, (1,)),
    "multilabel_soft_margin_loss": ([_r(3, 4), (_r(3, 4) > 0).astype(np.float32)], (), {"weight": _r(4)}, (1,)),
    "multi_margin_loss": ([_r(5, 4), np.array([0, 3, 1, 2, 3])], (), {"p": 2, "margin": 0.7, "weight": _r(4)}, ()),
    "multilabel_margin_loss": ([_r(3, 5), _MLM_TARGET], (), {}, ()),
    "poisson_nll_loss": ([_r(3, 4), np.abs(_r(3, 4)) * 3], (), {"full": True}, (1,)),
    "gaussian_nll_loss": ([_r(3, 4), _r(3, 4), np.abs(_r(3, 1))], (), {"full": True}, ()),
    "triplet_margin_loss": ([_r(3, 4), _r(3, 4), _r(3, 4)], (), {"swap": True, "p": 3, "margin": 0.5}, ()),
    "triplet_margin_with_distance_loss": ([_r(3, 4), _r(3, 4), _r(3, 4)], (), {"swap": True}, ()),
    "pairwise_distance": ([_r(3, 4), _r(3, 4)], (), {"p": 1.5, "keepdim": True}, ()),
    "pdist": ([_r(5, 4)], (3,), {}, ()),
    "max_pool1d": ([_r(3, 9)], (3, 2, 1), {"return_indices": True}, ()),
    "max_pool2d": ([_r(2, 3, 7, 6)], (3, 2, 1), {"return_indices": True, "ceil_mode": True}, ()),
    "max_pool3d_with_indices": ([_r(1, 2, 5, 4, 6)], (2,), {}, ()),
    "max_unpool1d": ([_Y1, _I1], (3, 2), {}, ()),
    "max_unpool2d": ([_Y2, _I2], (2,), {"output_size": (7, 6)}, ()),
    "max_unpool3d": ([_Y3[0], _I3[0]], (2,), {"output_size": (1, 2, 5, 4, 6)}, ()),
    "adaptive_max_pool1d": ([_r(3, 10)], (4,), {"return_indices": True}, ()),
    "adaptive_max_pool2d": ([_r(2, 3, 7, 6)], ((3, 4),), {"return_indices": True}, ()),
    "adaptive_max_pool3d_with_indices": ([_r(1, 2, 5, 4, 6)], ((2, None, 4),), {}, ()),
    "adaptive_avg_pool3d": ([_r(1, 2, 5, 4, 6)], ((2, 3, 4),), {}, ()),
    "lp_pool1d": ([_r(2, 3, 9)], (2, 3, 2), {}, ()),
    "lp_pool2d": ([_r(1, 2, 5, 4)], (3, 2), {}, ()),  # negative window sums: NaN as in torch
    "lp_pool3d": ([np.abs(_r(1, 2, 5, 4, 6))], (1.5, 2), {"ceil_mode": True}, ()),
    "local_response_norm": ([_r(2, 6, 4, 3)], (4,), {"alpha": 0.1, "beta": 0.6, "k": 2.0}, ()),
    "channel_shuffle": ([_r(2, 6, 4, 3)], (3,), {}, ()),
    "unfold": ([_r(2, 3, 7, 6)], ((2, 3),), {"dilation": (1, 2), "padding": 1, "stride": (2, 1)}, ()),
    "fold": ([_r(3 * 6, 12)], ((5, 6), (2, 3)), {"stride": (2, 1), "padding": (0, 1)}, ()),
    "affine_grid": ([_r(2, 2, 3)], ((2, 3, 5, 4),), {"align_corners": False}, ()),
}
EXTRA = {  # more argument sets for the names above: "name/variant"
    "affine_grid/3d": ([_r(2, 3, 4)], ((2, 3, 5, 4, 3),), {"align_corners": True}, ()),
    "poisson_nll_loss/rate": ([np.abs(_r(3, 4)), np.abs(_r(3, 4)) * 3], (), {"log_input": False}, (1,)),
    "gaussian_nll_loss/var": ([_r(3, 4), _r(3, 4), np.abs(_r(3)) * 1e-7], (), {"reduction": "none"}, ()),
    "local_response_norm/3d": ([_r(2, 6, 5)], (3,), {}, ()),
    "multilabel_margin_loss/one": ([_r(5), _MLM_TARGET[0]], (), {"reduction": "none"}, ()),
    "multi_margin_loss/one": ([_r(4), np.array(2)], (), {"reduction": "none"}, ()),
    "pairwise_distance/inf": ([_r(3, 4), _r(3, 4)], (float("inf"),), {}, ()),
    "pdist/1": ([_r(5, 4)], (1,), {}, ()),
    "softmin/nan": ([np.array([[1.0, np.nan, 0.5], [0.2, 0.1, 0.3]], np.float32)], (1,), {}, ()),
    "threshold/nan": ([np.array([np.nan, -1.0, 2.0], np.float32)], (0.0, 5.0), {}, ()),
}


def _tensors(lib, arrays, skip):
    make = torch.tensor if lib == "torch" else opsnn.tensor
    return [make(a, requires_grad=a.dtype.kind == "f" and i not in skip) for i, a in enumerate(arrays)]


def _first(out):
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("case", sorted(CASES) + sorted(EXTRA))
def test_matches_torch_values_and_gradients(case):
    name = case.split("/")[0]
    arrays, args, kw, skip = {**CASES, **EXTRA}[case]
    xs, ts = _tensors("opsnn", arrays, skip), _tensors("torch", arrays, skip)
    okw = {k: opsnn.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    tkw = {k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    got, want = getattr(F, name)(*xs, *args, **okw), getattr(TF, name)(*ts, *args, **tkw)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert g.shape == tuple(w.shape)
        np.testing.assert_allclose(g.numpy(), w.detach().numpy(), rtol=1e-4, atol=1e-5, equal_nan=True)
    got, want = _first(got), _first(want)
    if not want.requires_grad:
        return
    seed = RNG.standard_normal(want.shape).astype(np.float32)
    opsnn.ops.sum(opsnn.ops.mul(got, opsnn.tensor(seed))).backward()
    (want * torch.from_numpy(seed)).sum().backward()
    for x, t in zip(xs, ts):
        if t.grad is not None:
            np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-4, equal_nan=True)


LOSSES = [n for n in CASES if n.endswith("_loss")]


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("name", LOSSES)
def test_loss_reductions_match_torch(name, reduction):
    arrays, args, kw, skip = CASES[name]
    xs, ts = _tensors("opsnn", arrays, skip), _tensors("torch", arrays, skip)
    okw = {k: opsnn.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    tkw = {k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    got = getattr(F, name)(*xs, *args, **okw, reduction=reduction)
    want = getattr(TF, name)(*ts, *args, **tkw, reduction=reduction)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_legacy_size_average_and_reduce_map_as_torchs():
    x, y = _r(3, 4), _signs(3, 4)
    for sa, red in ((False, None), (None, False), (True, True)):
        got = F.soft_margin_loss(opsnn.tensor(x), opsnn.tensor(y), sa, red)
        want = TF.soft_margin_loss(torch.tensor(x), torch.tensor(y), sa, red)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5)


# module name -> (constructor args, constructor kwargs, forward inputs)
MODULES = {
    "LogSigmoid": ((), {}, [_r(3, 4)]),
    "Softmin": ((1,), {}, [_r(3, 4)]),
    "Tanhshrink": ((), {}, [_r(3, 4)]),
    "Threshold": ((0.2, -1.0), {}, [_r(3, 4)]),
    "GLU": ((0,), {}, [_r(4, 3)]),
    "Softmax2d": ((), {}, [_r(2, 3, 4, 2)]),
    "RReLU": ((0.2, 0.2), {}, [_r(3, 4)]),  # lower == upper: training draws the one slope
    "AlphaDropout": ((0.0,), {}, [_r(3, 4)]),
    "FeatureAlphaDropout": ((0.0,), {}, [_r(3, 4, 2)]),
    "AdaptiveMaxPool1d": ((3,), {}, [_r(2, 3, 8)]),
    "AdaptiveMaxPool2d": (((None, 2),), {}, [_r(2, 3, 5, 7)]),
    "AdaptiveMaxPool3d": ((2,), {}, [_r(1, 2, 5, 3, 4)]),
    "AdaptiveAvgPool3d": (((3, 1, 2),), {}, [_r(1, 2, 5, 3, 4)]),
    "LPPool1d": ((2, 3), {"stride": 2}, [_r(2, 3, 8)]),
    "LPPool2d": ((2, (2, 3)), {"ceil_mode": True}, [_r(2, 3, 5, 7)]),
    "LPPool3d": ((2, 2), {}, [_r(1, 2, 4, 5, 4)]),
    "LocalResponseNorm": ((3,), {"k": 2.0}, [_r(2, 5, 3, 3)]),
    "ChannelShuffle": ((2,), {}, [_r(2, 4, 3, 3)]),
    "Unfold": ((2,), {"padding": 1}, [_r(2, 3, 4, 5)]),
    "Fold": (((4, 5), 2), {"padding": 1}, [_r(2, 12, 30)]),
    "ZeroPad3d": ((1,), {}, [_r(1, 2, 3, 2, 2)]),
    "ReflectionPad3d": (((1, 0, 1, 2, 0, 1),), {}, [_r(1, 2, 3, 4, 3)]),
    "ReplicationPad3d": ((2,), {}, [_r(1, 2, 3, 2, 2)]),
    "CircularPad1d": (((1, 2),), {}, [_r(2, 3, 5)]),
    "CircularPad2d": ((1,), {}, [_r(1, 2, 3, 4)]),
    "CircularPad3d": (((1, 0, 0, 1, 1, 1),), {}, [_r(1, 2, 3, 4, 3)]),
    "UpsamplingNearest2d": ((), {"scale_factor": 2}, [_r(1, 2, 3, 4)]),
    "UpsamplingBilinear2d": (((5, 7),), {}, [_r(1, 2, 3, 4)]),
    "PairwiseDistance": ((1.0,), {"keepdim": True}, [_r(3, 4), _r(3, 4)]),
    "CosineEmbeddingLoss": ((0.1,), {}, [_r(4, 5), _r(4, 5)]),
    "HingeEmbeddingLoss": ((), {"reduction": "sum"}, [_r(4, 5)]),
    "MarginRankingLoss": ((0.2,), {}, [_r(6), _r(6)]),
    "SoftMarginLoss": ((), {}, [_r(3, 4)]),
    "MultiLabelSoftMarginLoss": ((), {"reduction": "none"}, [_r(3, 4)]),
    "MultiMarginLoss": ((2, 0.5), {}, [_r(5, 4)]),
    "MultiLabelMarginLoss": ((), {}, [_r(3, 5)]),
    "PoissonNLLLoss": ((True, True), {}, [_r(3, 4)]),
    "GaussianNLLLoss": ((), {"eps": 1e-3}, [_r(3, 4), _r(3, 4)]),
    "TripletMarginLoss": ((0.5, 1.0), {}, [_r(3, 4), _r(3, 4), _r(3, 4)]),
    "TripletMarginWithDistanceLoss": ((), {"margin": 0.3, "swap": True}, [_r(3, 4), _r(3, 4), _r(3, 4)]),
}
TARGETS = {  # inputs that take no gradient, after the ones above
    "CosineEmbeddingLoss": [_signs(4)],
    "HingeEmbeddingLoss": [_signs(4, 5)],
    "MarginRankingLoss": [_signs(6)],
    "SoftMarginLoss": [_signs(3, 4)],
    "MultiLabelSoftMarginLoss": [(_r(3, 4) > 0).astype(np.float32)],
    "MultiMarginLoss": [np.array([0, 3, 1, 2, 3])],
    "MultiLabelMarginLoss": [_MLM_TARGET],
    "PoissonNLLLoss": [np.abs(_r(3, 4)) * 2],
    "GaussianNLLLoss": [np.abs(_r(3, 4))],
}


def test_every_new_module_has_a_case_and_is_exported():
    new = set(MODULES) | set(loss_mod.TABLE) | {"MaxUnpool1d", "MaxUnpool2d", "MaxUnpool3d"}
    assert set(loss_mod.TABLE) - {"CTCLoss"} <= set(MODULES)  # CTCLoss: tests/test_ctc_loss.py
    for name in new:
        assert getattr(nn, name).__name__ == name
        assert name in nn.__all__ and hasattr(torch.nn, name)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_match_torch(name):
    args, kw, arrays = MODULES[name]
    m, tm = getattr(nn, name)(*args, **kw), getattr(torch.nn, name)(*args, **kw)
    assert m.state_dict() == {} and tm.state_dict() == {}
    more = TARGETS.get(name, [])
    xs = [opsnn.tensor(a, requires_grad=True) for a in arrays] + [opsnn.tensor(a) for a in more]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays] + [torch.tensor(a) for a in more]
    got, want = m(*xs), tm(*ts)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-5)
    seed = RNG.standard_normal(want.shape).astype(np.float32)
    opsnn.ops.sum(opsnn.ops.mul(got, opsnn.tensor(seed))).backward()
    (want * torch.from_numpy(seed)).sum().backward()
    for x, t in zip(xs, ts[: len(arrays)]):
        np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(MODULES) + ["MaxUnpool2d"])
def test_constructor_parameters_are_torchs_in_torchs_order(name):
    row = {**stateless.TABLE, **loss_mod.TABLE}[name]
    params = [p for p in inspect.signature(getattr(torch.nn, name)).parameters if p not in ("args", "kwargs")]
    assert list(row.params) == params
    defaults = {p.name: p.default for p in inspect.signature(getattr(torch.nn, name)).parameters.values()}
    for k, d in row.params.items():
        if d is not stateless.REQUIRED:
            assert d == defaults[k], k


def test_module_repr_names_the_arguments_that_differ_from_the_default():
    assert repr(nn.LPPool2d(2, 3, ceil_mode=True)) == "LPPool2d(norm_type=2, kernel_size=3, ceil_mode=True)"
    assert repr(nn.Threshold(0.1, 20.0)) == "Threshold(threshold=0.1, value=20.0)"


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_max_unpool_modules_take_torchs_indices_and_output_size(dims):
    x = _r(*(2, 3) + (7, 6, 5)[:dims])
    pool, unpool = getattr(nn, f"MaxPool{dims}d") if dims != 2 else None, getattr(nn, f"MaxUnpool{dims}d")(2)
    ty, ti = getattr(TF, f"max_pool{dims}d")(torch.tensor(x), 2, return_indices=True)
    want = getattr(torch.nn, f"MaxUnpool{dims}d")(2)(ty, ti, output_size=x.shape[2:])
    y = opsnn.tensor(ty.numpy(), requires_grad=True)
    got = unpool(y, opsnn.tensor(ti.numpy()), output_size=x.shape[2:])
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    if pool is not None:  # opsnn's own pooling gives torch's indices
        oy, oi = pool(2, return_indices=True)(opsnn.tensor(x))
        np.testing.assert_array_equal(oi.numpy(), ti.numpy())
    opsnn.ops.sum(got).backward()
    np.testing.assert_array_equal(y.grad.numpy(), np.ones_like(ty.numpy()))


def test_random_functions_draw_from_opsnns_seeded_generator():
    x = _r(300, 40)
    opsnn.manual_seed(5)
    a = F.rrelu(opsnn.tensor(x), 0.1, 0.3, training=True).numpy()
    opsnn.manual_seed(5)
    b = nn.RReLU(0.1, 0.3).train()(opsnn.tensor(x)).numpy()
    np.testing.assert_array_equal(a, b)
    slopes = a[x < 0] / x[x < 0]
    assert slopes.min() >= 0.1 - 1e-6 and slopes.max() <= 0.3 + 1e-6 and slopes.std() > 0.04
    np.testing.assert_array_equal(a[x >= 0], x[x >= 0])
    np.testing.assert_allclose(nn.RReLU(0.1, 0.3).eval()(opsnn.tensor(x)).numpy(), TF.rrelu(torch.tensor(x), 0.1, 0.3))
    y = F.alpha_dropout(opsnn.tensor(_r(400, 100)), 0.3, training=True).numpy()
    assert abs(y.mean()) < 0.02 and abs(y.std() - 1.0) < 0.02  # SELU's self-normalising statistics kept
    f = F.feature_alpha_dropout(opsnn.tensor(np.ones((8, 6, 3, 3), np.float32)), 0.5, True).numpy()
    want = np.unique(TF.feature_alpha_dropout(torch.ones(8, 6, 3, 3), 0.5, True).numpy())
    np.testing.assert_allclose(np.unique(f), want, rtol=1e-6)
    assert (f == f[:, :, :1, :1]).all()  # whole channels


@pytest.mark.parametrize("hard", [False, True])
def test_gumbel_softmax_samples_and_gradients(hard):
    logits = opsnn.tensor(_r(5, 6), requires_grad=True)
    opsnn.manual_seed(1)
    y = F.gumbel_softmax(logits, tau=0.5, hard=hard, dim=0)
    np.testing.assert_allclose(y.numpy().sum(0), np.ones(6), rtol=1e-6)
    if hard:
        assert set(np.unique(y.numpy())) == {0.0, 1.0}
    opsnn.ops.sum(opsnn.ops.mul(y, opsnn.tensor(_r(5, 6)))).backward()
    assert logits.grad.shape == (5, 6) and np.abs(logits.grad.numpy()).sum() > 0
    opsnn.manual_seed(1)
    np.testing.assert_array_equal(F.gumbel_softmax(logits, tau=0.5, hard=hard, dim=0).numpy(), y.numpy())


@pytest.mark.parametrize(
    "name, args",
    [
        ("relu_", ()),
        ("elu_", (0.5,)),
        ("leaky_relu_", (0.2,)),
        ("hardtanh_", (-0.5, 0.5)),
        ("selu_", ()),
        ("celu_", (1.5,)),
        ("threshold_", (0.1, 3.0)),
        ("rrelu_", (0.2, 0.3)),
    ],
)
def test_in_place_variants_write_into_their_input(name, args):
    x = _r(3, 5)
    t = opsnn.tensor(x.copy())
    assert getattr(F, name)(t, *args) is t
    want = getattr(TF, name)(torch.tensor(x), *args)
    np.testing.assert_allclose(t.numpy(), want.numpy(), rtol=1e-6, atol=1e-7)
    with pytest.raises(ParamInvalidError, match=f"{name}: in place with grad mode on"):
        getattr(F, name)(opsnn.tensor(x, requires_grad=True), *args)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: F.soft_margin_loss(_r(3), _r(3), reduction="avg"), ParamInvalidError, "reduction must be one of"),
        (lambda: nn.MultiMarginLoss(reduction="total"), ParamInvalidError, "MultiMarginLoss: reduction must be"),
        (lambda: F.multi_margin_loss(_r(3, 4), np.array([0, 1, 2]), p=3), ParamInvalidError, "p must be 1 or 2"),
        (lambda: F.multi_margin_loss(_r(3, 4), _r(3)), DTypeError, "integer class indices"),
        (lambda: F.margin_ranking_loss(_r(3), _r(4), _r(3)), ParamInvalidError, r"shapes differ, \(3,\) and \(4,\)"),
        (lambda: F.cosine_embedding_loss(_r(3, 2), _r(3, 2), _r(2)), ParamInvalidError, r"target must have shape"),
        (
            lambda: F.triplet_margin_with_distance_loss(_r(2, 3), _r(2, 3), _r(2, 3), margin=-1.0),
            ParamInvalidError,
            "margin must be > 0",
        ),
        (lambda: F.gaussian_nll_loss(_r(3), _r(3), -np.ones(3, np.float32)), ParamInvalidError, "var has negative"),
        (lambda: F.gaussian_nll_loss(_r(3, 2), _r(3, 2), _r(2)), ParamInvalidError, "does not fit the input"),
        (lambda: F.glu(_r(3, 5)), ParamInvalidError, "glu: dim -1 must have an even size"),
        (lambda: F.glu(_r(3, 4), dim=2), ParamInvalidError, r"glu: dim 2 is out of range .* \(use -2..1\)"),
        (lambda: F.softmin(_r(3, 4)), ParamInvalidError, "softmin: pass dim"),
        (lambda: F.rrelu(_r(3), 0.5, 0.1), ParamInvalidError, r"lower \(0.5\) must not exceed upper"),
        (lambda: F.alpha_dropout(_r(3), 1.5, True), ParamInvalidError, r"probability must be in \[0, 1\]"),
        (lambda: F.adaptive_max_pool2d(_r(2, 3, 4), (2, 2, 2)), ParamInvalidError, "output_size must be an int or 2"),
        (lambda: F.adaptive_max_pool2d(_r(4, 4), 2), ParamInvalidError, "expected a 4-D"),
        (lambda: F.channel_shuffle(_r(2, 5, 3), 2), ParamInvalidError, "C divisible by groups=2"),
        (lambda: F.fold(_r(2, 12, 7), (4, 5), 2), ParamInvalidError, "fold: input of shape"),
        (
            lambda: F.unfold(_r(2, 3, 4, 4), (2, 2, 2)),
            ParamInvalidError,
            "kernel_size must be an int >= 1 or 2 of them",
        ),
        (lambda: F.lp_pool2d(_r(1, 2, 4, 4), 0, 2), ParamInvalidError, "norm_type must be > 0"),
        (lambda: F.local_response_norm(_r(2, 3), 2), ParamInvalidError, "3 or more dims"),
        (lambda: F.affine_grid(_r(2, 2, 3), (2, 3, 4)), ParamInvalidError, "affine_grid: size must be"),
        (lambda: F.pairwise_distance(_r(2, 3), _r(2, 3), p=-1), ParamInvalidError, "p must be >= 0"),
        (lambda: F.max_unpool2d(_r(1, 1, 2, 2), _r(1, 1, 2, 2), 2), ParamInvalidError, "indices must be integers"),
        (lambda: nn.Threshold(0.1), ParamInvalidError, r"Threshold: missing required argument\(s\) \['value'\]"),
        (lambda: nn.LPPool2d(2, 3, strid=1), ParamInvalidError, "did you mean 'stride'"),
    ],
)
def test_bad_arguments_are_typed_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_compiled_training_step_with_new_functions_matches_eager():
    batches = [(_r(6, 2, 5, 4), _signs(6), _r(6, 4)) for _ in range(4)]

    def run(compiled):
        with nn.init.seeded(3):
            conv = nn.Conv2d(2, 4, 3, padding=1)
            head = nn.Linear(4 * 2 * 3, 4)
        params = list(conv.parameters()) + list(head.parameters())
        opt = opsnn.optim.SGD(params, lr=0.05)
        margin = nn.HingeEmbeddingLoss(0.5)

        def step(x, s, t):
            opt.zero_grad()
            h = F.local_response_norm(F.logsigmoid(conv(x)), 3)
            h = F.adaptive_max_pool2d(F.glu(opsnn.ops.cat([h, h], 1), dim=1), (2, 3))
            out = head(opsnn.ops.reshape(h, (h.shape[0], -1)))
            loss = opsnn.ops.add(
                F.soft_margin_loss(opsnn.ops.sum(out, dim=1), s), margin(F.pairwise_distance(out, t), s)
            )
            loss.backward()
            opt.step()
            return loss

        fn = opsnn.compile(step) if compiled else step
        return [float(fn(*(opsnn.tensor(a) for a in b)).item()) for b in batches], fn

    eager, _ = run(False)
    compiled, fn = run(True)
    assert fn.num_compiles == 1
    np.testing.assert_allclose(compiled, eager, rtol=1e-5, atol=1e-6)


def test_the_rows_other_tests_leave_to_this_file_have_cases_here():
    from test_nn_torch_modules import ELSEWHERE

    assert ELSEWHERE <= set(MODULES) | {"MaxUnpool1d", "MaxUnpool2d", "MaxUnpool3d"}


@pytest.mark.parametrize(
    "call",
    [
        lambda m, x: m.upsample(x, scale_factor=2, mode="bilinear", align_corners=False),
        lambda m, x: m.upsample(x, size=(7, 5), mode="nearest"),
        lambda m, x: m.upsample_nearest(x, scale_factor=3),
        lambda m, x: m.upsample_bilinear(x, size=(6, 9)),
        lambda m, x: m.interpolate(x, None, 1.7, "bilinear", False, True),
        lambda m, x: m.interpolate(x, scale_factor=(1.5, 2.3), mode="nearest", recompute_scale_factor=True),
        lambda m, x: m.interpolate(x, scale_factor=1.7, mode="bilinear", recompute_scale_factor=False),
    ],
)
def test_upsample_names_and_recompute_scale_factor_match_torch(call):
    x = _r(2, 3, 4, 5)
    ours, theirs = opsnn.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    with np.errstate(all="ignore"):
        got, want = call(F, ours), call(TF, theirs)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    seed = _r(*want.shape)
    (got * opsnn.tensor(seed)).sum().backward()
    (want * torch.tensor(seed)).sum().backward()
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-4, atol=1e-5)
    with pytest.raises(ParamInvalidError, match="recompute_scale_factor goes with scale_factor"):
        F.interpolate(ours, size=(3, 3), recompute_scale_factor=True)
