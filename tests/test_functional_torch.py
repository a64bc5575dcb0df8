"""opsnn.nn.functional under torch.nn.functional's names: every name of TORCH_FUNCTIONAL (an opsnn.ops
function taking torch's arguments) and the losses and helpers written here, against torch on the same
inputs (values and input gradients, float32 tolerances), the new losses also against a float64 numpy
oracle written here; torch's ``input=`` keyword, ``inplace`` and ``nn.ReLU(inplace=True)``."""

from __future__ import annotations

import numpy as np
import pytest

import opsnn
from opsnn.errors import ParamInvalidError
from opsnn.nn import functional as F

RNG = np.random.default_rng(41)


def _r(*shape, positive=False):
    a = RNG.standard_normal(shape).astype(np.float32)
    return np.abs(a) + 0.1 if positive else a


X4 = _r(2, 3, 8, 7)
X2 = _r(4, 5)

# name -> (arrays, further positional arguments, keyword arguments); the arrays, and the keyword arguments
# that are arrays, become tensors requiring grad
CASES = {
    "relu": ([X2], (), {}),
    "leaky_relu": ([X2], (0.2,), {}),
    "elu": ([X2], (0.7,), {}),
    "celu": ([X2], (1.3,), {}),
    "gelu": ([X2], (), {"approximate": "tanh"}),
    "silu": ([X2], (), {}),
    "mish": ([X2], (), {}),
    "softsign": ([X2], (), {}),
    "tanh": ([X2], (), {}),
    "sigmoid": ([X2], (), {}),
    "hardshrink": ([X2], (0.4,), {}),
    "softshrink": ([X2], (0.4,), {}),
    "softmax": ([X2], (), {"dim": 1}),
    "log_softmax": ([X2], (), {"dim": 0}),
    "layer_norm": ([X2], ((5,),), {"weight": _r(5), "bias": _r(5), "eps": 1e-4}),
    "group_norm": ([X4], (3,), {"weight": _r(3), "bias": _r(3)}),
    "rms_norm": ([X2], ((5,),), {"weight": _r(5), "eps": 1e-5}),
    "linear": ([X2, _r(3, 5), _r(3)], (), {}),
    "conv1d": ([_r(2, 3, 9), _r(4, 3, 3)], (), {"stride": 2, "padding": 1}),
    "conv2d": ([X4, _r(4, 3, 3, 2)], (), {"padding": "same", "dilation": 2}),
    "conv3d": ([_r(1, 2, 4, 5, 4), _r(3, 2, 2, 2, 2)], (), {"stride": (1, 2, 1)}),
    "conv_transpose1d": ([_r(2, 3, 5), _r(3, 2, 3)], (), {"stride": 2, "output_padding": 1}),
    "conv_transpose2d": ([_r(1, 3, 4, 3), _r(3, 2, 3, 3)], (), {"stride": 2, "padding": 1}),
    "conv_transpose3d": ([_r(1, 2, 3, 3, 2), _r(2, 2, 2, 2, 2)], (), {"stride": 2}),
    "max_pool1d": ([_r(2, 3, 9)], (3, 2), {"padding": 1}),
    "max_pool2d": ([X4], (3, 2, 1), {"ceil_mode": True}),
    "max_pool3d": ([_r(1, 2, 5, 4, 6)], (2,), {}),
    "avg_pool1d": ([_r(2, 3, 9)], (3, 2), {"ceil_mode": True}),
    "avg_pool2d": ([X4], (3, 2, 1), {"ceil_mode": True, "count_include_pad": False}),
    "avg_pool3d": ([_r(1, 2, 5, 4, 6)], (2,), {}),
    "adaptive_avg_pool2d": ([X4], ((3, 2),), {}),
    "interpolate": ([X4], (), {"scale_factor": 2, "mode": "bilinear", "align_corners": False}),
    "pad": ([X4], ((1, 2, 2, 1),), {"mode": "reflect"}),
    "scaled_dot_product_attention": ([_r(1, 2, 3, 4), _r(1, 2, 5, 4), _r(1, 2, 5, 4)], (), {"is_causal": True}),
    "prelu": ([X4, _r(3)], (), {}),
    "pixel_shuffle": ([_r(1, 8, 3, 2)], (2,), {}),
    "pixel_unshuffle": ([_r(1, 2, 4, 6)], (2,), {}),
    "grid_sample": ([_r(1, 2, 5, 4), np.clip(_r(1, 3, 3, 2), -1, 1)], (), {"align_corners": False}),
    "relu6": ([X2 * 5], (), {}),
    "hardtanh": ([X2], (-0.5, 0.7), {}),
    "hardsigmoid": ([X2 * 4], (), {}),
    "hardswish": ([X2 * 4], (), {}),
    "selu": ([X2], (), {}),
    "softplus": ([X2 * 10], (), {}),
    "l1_loss": ([X2, _r(4, 5)], (), {}),
    "smooth_l1_loss": ([X2, _r(4, 5)], (), {"beta": 0.5}),
    "huber_loss": ([X2, _r(4, 5)], (), {"delta": 0.5, "reduction": "sum"}),
    "binary_cross_entropy": ([1 / (1 + np.exp(-X2)), (X2 > 0).astype(np.float32)], (), {}),
    "kl_div": ([np.log(_r(4, 5, positive=True)), _r(4, 5, positive=True)], (), {"reduction": "batchmean"}),
    "normalize": ([X2], (), {"p": 3.0, "dim": 0}),
    "cosine_similarity": ([X2, _r(4, 5)], (), {"dim": 1}),
}


def test_every_torch_functional_name_has_a_case():
    assert set(F.TORCH_FUNCTIONAL) - {"embedding", "one_hot"} <= set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_torch_values_and_gradients(name):
    torch = pytest.importorskip("torch")
    arrays, args, kw = CASES[name]
    arrays = arrays + [v for v in kw.values() if isinstance(v, np.ndarray)]
    keys = [k for k, v in kw.items() if isinstance(v, np.ndarray)]
    xs = [opsnn.tensor(a, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    n = len(arrays) - len(keys)
    got = getattr(F, name)(*xs[:n], *args, **{**kw, **dict(zip(keys, xs[n:]))})
    want = getattr(torch.nn.functional, name)(*ts[:n], *args, **{**kw, **dict(zip(keys, ts[n:]))})
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-5)
    seed = RNG.standard_normal(want.shape).astype(np.float32)
    opsnn.ops.sum(opsnn.ops.mul(got, opsnn.tensor(seed))).backward()
    (want * torch.from_numpy(seed)).sum().backward()
    for x, t in zip(xs, ts):
        np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-4, err_msg=name)


def test_embedding_and_one_hot_match_torch():
    torch = pytest.importorskip("torch")
    w, ids = _r(6, 3), np.array([[2, 0, 5], [2, 2, 1]])
    tw = opsnn.tensor(w, requires_grad=True)
    ttw = torch.tensor(w, requires_grad=True)
    F.embedding(ids, tw, padding_idx=2).sum().backward()
    torch.nn.functional.embedding(torch.from_numpy(ids), ttw, padding_idx=2).sum().backward()
    np.testing.assert_array_equal(tw.grad.numpy(), ttw.grad.numpy())
    np.testing.assert_array_equal(F.one_hot(np.array([1, 3]), 5).numpy(), np.eye(5, dtype=np.int64)[[1, 3]])


def _np_oracle(name, a, b, kw):
    a, b = a.astype(np.float64), b.astype(np.float64)
    d = np.abs(a - b)
    if name == "l1_loss":
        return d.mean()
    if name == "smooth_l1_loss":
        beta = kw["beta"]
        return np.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta).mean()
    if name == "huber_loss":
        delta = kw["delta"]
        return np.where(d <= delta, 0.5 * d * d, delta * (d - 0.5 * delta)).sum()
    if name == "binary_cross_entropy":
        return -(b * np.maximum(np.log(a), -100) + (1 - b) * np.maximum(np.log1p(-a), -100)).mean()
    if name == "kl_div":
        return (b * (np.log(b) - a)).sum() / a.shape[0]
    if name == "cosine_similarity":
        return (a * b).sum(1) / np.maximum(np.sqrt((a * a).sum(1) * (b * b).sum(1)), 1e-8)
    raise AssertionError(name)


@pytest.mark.parametrize(
    "name", ["l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy", "kl_div", "cosine_similarity"]
)
def test_losses_against_a_float64_oracle(name):
    arrays, args, kw = CASES[name]
    got = getattr(F, name)(*[opsnn.tensor(a) for a in arrays], *args, **kw)
    np.testing.assert_allclose(got.numpy(), _np_oracle(name, *arrays, kw), rtol=1e-5, atol=1e-6)


def test_loss_edges_as_torch_defines_them():
    # probabilities of exactly 0 and 1: logs clamped at -100, a finite loss
    p, t = np.array([0.0, 1.0, 0.5], np.float32), np.array([1.0, 0.0, 1.0], np.float32)
    np.testing.assert_allclose(F.binary_cross_entropy(p, t).numpy(), (100 + 100 + np.log(2)) / 3, rtol=1e-6)
    # kl_div: a zero target contributes 0, not 0 * log 0 = NaN; log_target takes log-probabilities
    logq = np.log(np.array([[0.5, 0.5]], np.float32))
    assert float(F.kl_div(logq, np.array([[1.0, 0.0]], np.float32), reduction="sum").item()) == pytest.approx(np.log(2))
    assert float(
        F.kl_div(logq, np.log(np.array([[0.25, 0.75]], np.float32)), reduction="sum", log_target=True).item()
    ) == pytest.approx(0.25 * np.log(0.5) + 0.75 * np.log(1.5), rel=1e-5)
    # normalize of a zero row stays zero (eps), smooth_l1 with beta 0 is l1
    np.testing.assert_array_equal(F.normalize(np.zeros((1, 3), np.float32)).numpy(), np.zeros((1, 3)))
    a, b = _r(3, 4), _r(3, 4)
    np.testing.assert_allclose(F.smooth_l1_loss(a, b, beta=0.0).numpy(), F.l1_loss(a, b).numpy())
    # unbatched cross_entropy, as torch takes a (C,) input with a 0-d target
    x = _r(5)
    full = F.cross_entropy(opsnn.tensor(x[None]), np.array([3]))
    np.testing.assert_allclose(F.cross_entropy(opsnn.tensor(x), np.array(3)).numpy(), full.numpy(), rtol=1e-6)
    assert F.cross_entropy(opsnn.tensor(x), np.array(3), reduction="none").shape == ()


def test_batch_norm_updates_the_running_statistics_given_as_torch_does():
    x = _r(6, 3, 2, 2)
    rm, rv = opsnn.tensor(np.zeros(3, np.float32)), opsnn.tensor(np.ones(3, np.float32))
    y = F.batch_norm(x, rm, rv, training=True, momentum=0.25)
    mean = x.astype(np.float64).mean((0, 2, 3))
    var_b = x.astype(np.float64).var((0, 2, 3))
    want = (x - mean[None, :, None, None]) / np.sqrt(var_b[None, :, None, None] + 1e-5)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(rm.numpy(), 0.25 * mean, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(rv.numpy(), 0.75 + 0.25 * x.astype(np.float64).var((0, 2, 3), ddof=1), rtol=1e-5)
    # no running statistics: batch statistics, nothing to update; eval uses the running ones
    np.testing.assert_allclose(F.batch_norm(x, None, None, training=True).numpy(), want, rtol=1e-4, atol=1e-5)
    ev = F.batch_norm(x, rm, rv).numpy()
    np.testing.assert_allclose(
        ev,
        (x - rm.numpy()[None, :, None, None]) / np.sqrt(rv.numpy()[None, :, None, None] + 1e-5),
        rtol=1e-5,
        atol=1e-6,
    )
    for call, match in (
        (lambda: F.batch_norm(x, None, None), "required when training=False"),
        (lambda: F.batch_norm(x, rm, None, training=True), "both running_mean and running_var"),
        (lambda: F.batch_norm(_r(1, 3, 1, 1), None, None, training=True), "more than one value per channel"),
    ):
        with pytest.raises(ParamInvalidError, match=match):
            call()


def test_batch_norm_updates_running_statistics_inside_a_compiled_step():
    x = _r(4, 2, 3, 3)
    w = opsnn.nn.Parameter(np.ones(2, np.float32))
    rm, rv = opsnn.tensor(np.zeros(2, np.float32)), opsnn.tensor(np.ones(2, np.float32))

    def step(xb):
        loss = opsnn.ops.sum(F.batch_norm(xb, rm, rv, weight=w, training=True))
        loss.backward()
        return loss

    compiled = opsnn.compile(step)
    for _ in range(3):
        compiled(x)
    mean = x.astype(np.float64).mean((0, 2, 3))
    np.testing.assert_allclose(rm.numpy(), (1 - 0.9**3) * mean, rtol=1e-5, atol=1e-7)
    assert compiled.num_compiles == 1


def test_torch_keywords_input_and_inplace():
    x = opsnn.tensor(X2)
    np.testing.assert_array_equal(F.relu(input=x).numpy(), np.maximum(X2, 0))
    np.testing.assert_array_equal(F.relu(x, inplace=False).numpy(), np.maximum(X2, 0))
    np.testing.assert_array_equal(F.pad(input=x, pad=(1, 0)).numpy(), np.pad(X2, ((0, 0), (1, 0))))
    with pytest.raises(ParamInvalidError, match=r"relu: inplace=True is not supported .* write x = F.relu\(x"):
        F.relu(x, inplace=True)
    with pytest.raises(ParamInvalidError, match="unexpected keyword 'dimm'"):
        F.softmax(x, dimm=1)
    relu = opsnn.nn.ReLU(inplace=True)  # torch model code builds unchanged; the output is a new tensor
    np.testing.assert_array_equal(relu(x).numpy(), np.maximum(X2, 0))
    np.testing.assert_array_equal(x.numpy(), X2)
    assert "inplace=True" in repr(relu) and opsnn.nn.Dropout(0.1, inplace=True).inplace
