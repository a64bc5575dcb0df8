"""Gradient rules and the autograd API: every rule against central finite differences in float64
(odd shapes, broadcasting) and, where torch is importable, against torch.autograd."""
import numpy as np
import pytest

import opsnn
from opsnn import autograd, ops

RNG = np.random.default_rng(0)


def _rand(shape, lo=-1.0, hi=1.0):
    return RNG.uniform(lo, hi, size=shape)


def _positive(shape):
    return RNG.uniform(0.5, 2.0, size=shape)


def _away_from_zero(shape):
    a = RNG.uniform(0.2, 1.0, size=shape)
    return a * RNG.choice([-1.0, 1.0], size=shape)


F = ops
# (id, opsnn fn, torch fn, inputs (float64 arrays), indices of inputs to differentiate)
CASES = [
    ("add_bcast", lambda a, b: a + b, lambda a, b: a + b, [_rand((3, 1, 5)), _rand((4, 5))], [0, 1]),
    ("sub_bcast", lambda a, b: a - b, lambda a, b: a - b, [_rand((2, 3)), _rand((3,))], [0, 1]),
    ("mul_bcast", lambda a, b: a * b, lambda a, b: a * b, [_rand((2, 1, 3)), _rand((1, 4, 1))], [0, 1]),
    ("div_bcast", lambda a, b: a / b, lambda a, b: a / b, [_rand((3, 4)), _positive((4,))], [0, 1]),
    ("neg", lambda a: -a, lambda a: -a, [_rand((5, 3))], [0]),
    ("pow_scalar", lambda a: a ** 2.5, lambda a: a ** 2.5, [_positive((3, 4))], [0]),
    ("pow_tensor", lambda a, b: F.pow(a, b), lambda a, b: a ** b, [_positive((3, 4)), _rand((4,))], [0, 1]),
    ("exp", F.exp, lambda a: a.exp(), [_rand((3, 5))], [0]),
    ("log", F.log, lambda a: a.log(), [_positive((3, 5))], [0]),
    ("sqrt", F.sqrt, lambda a: a.sqrt(), [_positive((7,))], [0]),
    ("relu", F.relu, lambda a: a.relu(), [_away_from_zero((4, 5))], [0]),
    ("sigmoid", F.sigmoid, lambda a: a.sigmoid(), [_rand((4, 5))], [0]),
    ("tanh", F.tanh, lambda a: a.tanh(), [_rand((4, 5))], [0]),
    ("gelu", F.gelu, lambda a: __import__("torch").nn.functional.gelu(a), [_rand((3, 7), -3, 3)], [0]),
    ("gelu_tanh", lambda a: F.gelu(a, approximate="tanh"),
     lambda a: __import__("torch").nn.functional.gelu(a, approximate="tanh"), [_rand((3, 7), -3, 3)], [0]),
    ("softmax", lambda a: F.softmax(a, dim=1), lambda a: a.softmax(1), [_rand((2, 5, 3))], [0]),
    ("log_softmax", lambda a: F.log_softmax(a, dim=-1), lambda a: a.log_softmax(-1), [_rand((3, 6))], [0]),
    ("matmul_batched", F.matmul, lambda a, b: a @ b, [_rand((2, 3, 4)), _rand((4, 5))], [0, 1]),
    ("matmul_bcast", F.matmul, lambda a, b: a @ b, [_rand((2, 1, 3, 4)), _rand((3, 4, 2))], [0, 1]),
    ("matmul_vec", F.matmul, lambda a, b: a @ b, [_rand((5,)), _rand((5, 3))], [0, 1]),
    ("matmul_matvec", F.matmul, lambda a, b: a @ b, [_rand((2, 3, 5)), _rand((5,))], [0, 1]),
    ("gemm", lambda a, b, c: F.gemm(a, b, c, alpha=0.7, beta=1.3, trans_a=True, trans_b=True),
     lambda a, b, c: 0.7 * a.T @ b.T + 1.3 * c, [_rand((4, 3)), _rand((5, 4)), _rand((5,))], [0, 1, 2]),
    ("linear", F.linear, lambda x, w, b: x @ w.T + b, [_rand((2, 3, 4)), _rand((5, 4)), _rand((5,))], [0, 1, 2]),
    ("sum_dims", lambda a: F.sum(a, dim=(0, 2)), lambda a: a.sum((0, 2)), [_rand((3, 4, 5))], [0]),
    ("sum_all", lambda a: F.sum(a), lambda a: a.sum(), [_rand((3, 4))], [0]),
    ("mean_keep", lambda a: F.mean(a, dim=1, keepdim=True), lambda a: a.mean(1, keepdim=True),
     [_rand((3, 4, 2))], [0]),
    ("reshape", lambda a: F.reshape(a, (4, -1)), lambda a: a.reshape(4, -1), [_rand((2, 3, 4))], [0]),
    ("flatten", lambda a: F.flatten(a, 1), lambda a: a.flatten(1), [_rand((2, 3, 4))], [0]),
    ("transpose", lambda a: F.transpose(a, [2, 0, 1]), lambda a: a.permute(2, 0, 1), [_rand((2, 3, 4))], [0]),
    ("squeeze", lambda a: F.squeeze(a, 1), lambda a: a.squeeze(1), [_rand((3, 1, 4))], [0]),
    ("unsqueeze", lambda a: F.unsqueeze(a, 0), lambda a: a.unsqueeze(0), [_rand((3, 4))], [0]),
    ("expand", lambda a: F.expand(a, 3, 2, 4), lambda a: a.expand(3, 2, 4), [_rand((2, 1))], [0]),
    ("concat", lambda a, b: F.concat([a, b], dim=1), lambda a, b: __import__("torch").cat([a, b], 1),
     [_rand((2, 3)), _rand((2, 4))], [0, 1]),
    ("slice_steps", lambda a: F.slice(a, [1, 0], [5, 7], axes=[0, 1], steps=[2, 3]),
     lambda a: a[1:5:2, 0:7:3], [_rand((6, 7))], [0]),
    ("gather_dup", lambda a: F.gather(a, np.array([[0, 2], [2, -1]]), axis=1),
     lambda a: a[:, [[0, 2], [2, -1]]], [_rand((3, 4))], [0]),
    ("embedding", lambda w: F.embedding(np.array([[1, 3, 1], [0, 3, 3]]), w),
     lambda w: w[__import__("torch").tensor([[1, 3, 1], [0, 3, 3]])], [_rand((5, 4))], [0]),
    ("conv2d", lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, dilation=2, groups=2),
     lambda x, w, b: __import__("torch").nn.functional.conv2d(x, w, b, stride=2, padding=1, dilation=2, groups=2),
     [_rand((2, 4, 7, 6)), _rand((6, 2, 3, 3)), _rand((6,))], [0, 1, 2]),
    ("conv2d_plain", lambda x, w: F.conv2d(x, w, None, stride=(1, 2), padding=(2, 0)),
     lambda x, w: __import__("torch").nn.functional.conv2d(x, w, None, stride=(1, 2), padding=(2, 0)),
     [_rand((1, 3, 5, 8)), _rand((4, 3, 2, 3))], [0, 1]),
    ("max_pool2d", lambda x: F.max_pool2d(x, 3, 2, 1),
     lambda x: __import__("torch").nn.functional.max_pool2d(x, 3, 2, 1), [_rand((2, 3, 7, 6))], [0]),
    ("avg_pool2d", lambda x: F.avg_pool2d(x, 3, 2, 1),
     lambda x: __import__("torch").nn.functional.avg_pool2d(x, 3, 2, 1), [_rand((2, 3, 7, 6))], [0]),
    ("avg_pool2d_excl_ceil", lambda x: F.avg_pool2d(x, 2, 2, 1, ceil_mode=True, count_include_pad=False),
     lambda x: __import__("torch").nn.functional.avg_pool2d(x, 2, 2, 1, ceil_mode=True, count_include_pad=False),
     [_rand((1, 2, 7, 5))], [0]),
    ("global_avg_pool", F.global_avg_pool, lambda x: x.mean((2, 3), keepdim=True), [_rand((2, 3, 4, 5))], [0]),
    ("batch_norm_train", lambda x, w, b: F.batch_norm(x, np.zeros(3), np.ones(3), w, b, training=True)[0],
     lambda x, w, b: __import__("torch").nn.functional.batch_norm(x, None, None, w, b, training=True),
     [_rand((4, 3, 3, 2)), _rand((3,)), _rand((3,))], [0, 1, 2]),
    ("batch_norm_eval", lambda x, w, b, m, v: F.batch_norm(x, m, v, w, b),
     lambda x, w, b, m, v: __import__("torch").nn.functional.batch_norm(x, m, v, w, b),
     [_rand((2, 3, 4)), _rand((3,)), _rand((3,)), _rand((3,)), _positive((3,))], [0, 1, 2]),
    ("layer_norm", lambda x, w, b: F.layer_norm(x, (4, 5), w, b),
     lambda x, w, b: __import__("torch").nn.functional.layer_norm(x, (4, 5), w, b),
     [_rand((3, 4, 5)), _rand((4, 5)), _rand((4, 5))], [0, 1, 2]),
    ("cross_entropy", lambda x: F.cross_entropy(x, np.array([1, 0, 3, 2, 1])),
     lambda x: __import__("torch").nn.functional.cross_entropy(x, __import__("torch").tensor([1, 0, 3, 2, 1])),
     [_rand((5, 4))], [0]),
    ("cross_entropy_w_ignore_sum", lambda x, w: F.cross_entropy(x, np.array([[1, 0], [3, 2], [1, 1]]), w,
                                                                 ignore_index=2, reduction="sum"),
     lambda x, w: __import__("torch").nn.functional.cross_entropy(
         x, __import__("torch").tensor([[1, 0], [3, 2], [1, 1]]), w, ignore_index=2, reduction="sum"),
     [_rand((3, 4, 2)), _positive((4,))], [0]),
    ("nll_none", lambda x: F.nll_loss(x, np.array([2, 0, 1]), reduction="none"),
     lambda x: __import__("torch").nn.functional.nll_loss(x, __import__("torch").tensor([2, 0, 1]),
                                                          reduction="none"), [_rand((3, 3))], [0]),
    ("tensor_views", lambda a: a.reshape(4, 6).transpose(0, 1)[1:5, ::2].T.unsqueeze(0).expand(2, 2, 4),
     lambda a: a.reshape(4, 6).transpose(0, 1)[1:5, ::2].T.unsqueeze(0).expand(2, 2, 4), [_rand((2, 3, 4))], [0]),
]


def _opsnn_grads(fn, arrays, wrt, weight):
    ts = [opsnn.tensor(a) for a in arrays]
    for i in wrt:
        ts[i].requires_grad_()
    out = fn(*ts)
    loss = ops.sum(out * opsnn.tensor(weight))
    return loss.numpy().item(), [g.numpy().copy() for g in autograd.grad(loss, [ts[i] for i in wrt])]


def _numeric_grad(fn, arrays, i, weight, eps=1e-6):
    base = [a.copy() for a in arrays]
    g = np.zeros_like(base[i])
    flat = base[i].reshape(-1)
    with opsnn.no_grad():
        for k in range(flat.size):
            old = flat[k]
            flat[k] = old + eps
            up = np.sum(np.asarray(fn(*[opsnn.tensor(a) for a in base]).numpy(), np.float64) * weight)
            flat[k] = old - eps
            down = np.sum(np.asarray(fn(*[opsnn.tensor(a) for a in base]).numpy(), np.float64) * weight)
            flat[k] = old
            g.reshape(-1)[k] = (up - down) / (2 * eps)
    return g


def _out_shape(fn, arrays):
    with opsnn.no_grad():
        return fn(*[opsnn.tensor(a) for a in arrays]).shape


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_rule_matches_finite_differences(case):
    _, fn, _, arrays, wrt = case
    weight = RNG.uniform(0.5, 1.5, size=_out_shape(fn, arrays))
    _, grads = _opsnn_grads(fn, arrays, wrt, weight)
    for i, g in zip(wrt, grads):
        assert g.shape == arrays[i].shape
        np.testing.assert_allclose(g, _numeric_grad(fn, arrays, i, weight), rtol=1e-5, atol=1e-7,
                                   err_msg=f"input {i}")


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_rule_matches_torch(case):
    torch = pytest.importorskip("torch")
    _, fn, tfn, arrays, wrt = case
    weight = RNG.uniform(0.5, 1.5, size=_out_shape(fn, arrays))
    loss, grads = _opsnn_grads(fn, arrays, wrt, weight)
    tt = [torch.tensor(a, requires_grad=i in wrt) for i, a in enumerate(arrays)]
    tloss = (tfn(*tt) * torch.tensor(weight)).sum()
    tgrads = torch.autograd.grad(tloss, [tt[i] for i in wrt])
    np.testing.assert_allclose(loss, tloss.item(), rtol=1e-10, atol=1e-12)
    for i, g, tg in zip(wrt, grads, tgrads):
        np.testing.assert_allclose(g, tg.numpy(), rtol=1e-9, atol=1e-11, err_msg=f"input {i}")
