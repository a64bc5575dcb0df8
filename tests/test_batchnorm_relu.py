"""BatchNormalization with a fused ReLU (opsnn attribute relu=1) and its backward
(BatchNormalizationGrad relu=1, masked by the forward's output Y): against the float64
references, float64 central finite differences, torch.autograd of relu(batch_norm(x)) where torch
is importable, the unfused Relu(BatchNormalization) path of the nn layer, and typed errors."""

import numpy as np
import pytest

import opsnn
from opsnn import nn, ops
from opsnn.errors import InferShapeError, ParamInvalidError

RNG = np.random.default_rng(31)


def _t(a):
    return opsnn.tensor(np.asarray(a))


def _data(shape, dtype, offset=0.5):
    C = shape[1]
    x = (RNG.standard_normal(shape) * 2 + offset).astype(dtype)
    s = RNG.uniform(0.5, 1.5, C).astype(dtype)
    b = RNG.standard_normal(C).astype(dtype)
    m = RNG.standard_normal(C).astype(dtype)
    v = RNG.uniform(0.5, 2.0, C).astype(dtype)
    return x, s, b, m, v


SHAPES = [(3, 5, 4, 7), (2, 3, 11), (16, 12, 64, 48)]  # the last over the parallel threshold (1 << 19)


@pytest.mark.parametrize("shape", SHAPES, ids=["4d", "3d", "parallel"])
@pytest.mark.parametrize("training", [1, 0])
def test_fused_forward_is_relu_of_batch_norm(shape, training):
    x, s, b, m, v = _data(shape, np.float32)
    attrs = {"training_mode": training, "epsilon": 1e-5, "momentum": 0.9}
    n_out = 3 if training else 1
    rec = opsnn.ops.get_op("BatchNormalization")
    fused = ops.run_op("BatchNormalization", [_t(a) for a in (x, s, b, m, v)], dict(attrs, relu=1), num_outputs=n_out)
    plain = rec.reference([a.astype(np.float64) for a in (x, s, b, m, v)], rec.bind_attrs(attrs))
    plain = plain if isinstance(plain, tuple) else (plain,)
    want = np.maximum(plain[0], 0)
    # float32 output of a float64 normalisation: a few ulps of the output's scale
    np.testing.assert_allclose(fused[0].numpy(), want, rtol=1e-5, atol=1e-5)
    assert (fused[0].numpy() >= 0).all()
    for k in range(1, n_out):  # the running statistics do not see the ReLU
        np.testing.assert_allclose(fused[k].numpy(), plain[k], rtol=1e-5, atol=1e-6)


def test_fused_forward_keeps_nan_as_relu_does():
    x, s, b, m, v = _data((2, 3, 4), np.float32)
    x[1, 2, 3] = np.nan
    y = ops.run_op("BatchNormalization", [_t(a) for a in (x, s, b, m, v)], {"relu": 1})[0].numpy()
    ref = ops.relu(ops.batch_norm(_t(x), _t(m), _t(v), _t(s), _t(b))).numpy()
    assert np.array_equal(np.isnan(y), np.isnan(ref)) and np.isnan(y[1, 2, 3])
    np.testing.assert_allclose(y[~np.isnan(y)], ref[~np.isnan(ref)], rtol=1e-6, atol=1e-6)


def _fused_forward(arrays, training):
    with opsnn.no_grad():
        return ops.run_op(
            "BatchNormalization", [_t(a) for a in arrays], {"training_mode": training, "epsilon": 1e-4, "relu": 1}
        )[0].numpy()


@pytest.mark.parametrize("training", [1, 0])
def test_fused_backward_matches_float64_finite_differences(training):
    shape = (3, 2, 5)
    for _ in range(20):  # no output within reach of the ReLU's kink for the differences' step
        x, s, b, m, v = _data(shape, np.float64, offset=0.0)
        y = _fused_forward([x, s, b, m, v], training)
        pre = ops.get_op("BatchNormalization").reference(
            [x, s, b, m, v], ops.get_op("BatchNormalization").bind_attrs({"training_mode": training, "epsilon": 1e-4})
        )
        pre = pre[0] if isinstance(pre, tuple) else pre
        if np.abs(pre).min() > 1e-3 and (y == 0).any():
            break
    w = RNG.uniform(0.5, 1.5, shape)
    attrs = {"training_mode": training, "epsilon": 1e-4, "relu": 1}
    ins = [w, x, s] + ([None, None] if training else [m, v]) + [y]
    got = [
        r.numpy()
        for r in ops.run_op(
            "BatchNormalizationGrad",
            [None if a is None else _t(a) for a in ins],
            attrs,
            num_outputs=3,
            domain="opsnn",
        )
    ]
    arrays = [x, s, b, m, v]
    for k, i in enumerate((0, 1, 2)):
        base = [a.copy() for a in arrays]
        flat = base[i].reshape(-1)
        fd = np.zeros(flat.size)
        for j in range(flat.size):
            old = flat[j]
            flat[j] = old + 1e-6
            up = np.sum(_fused_forward(base, training) * w)
            flat[j] = old - 1e-6
            down = np.sum(_fused_forward(base, training) * w)
            flat[j] = old
            fd[j] = (up - down) / 2e-6
        np.testing.assert_allclose(got[k], fd.reshape(base[i].shape), rtol=1e-5, atol=1e-7, err_msg=f"input {i}")


@pytest.mark.parametrize("shape", SHAPES, ids=["4d", "3d", "parallel"])
@pytest.mark.parametrize("training", [True, False])
def test_fused_autograd_matches_torch(shape, training):
    torch = pytest.importorskip("torch")
    x, s, b, m, v = _data(shape, np.float32)
    g = RNG.standard_normal(shape).astype(np.float32)
    xo, so, bo = (_t(a).requires_grad_() for a in (x, s, b))
    y = ops.batch_norm(xo, _t(m), _t(v), so, bo, training=training, relu=True)
    y = y[0] if training else y
    y.backward(_t(g))
    xt, st, bt = (torch.tensor(a, requires_grad=True) for a in (x, s, b))
    yt = torch.relu(
        torch.nn.functional.batch_norm(xt, torch.tensor(m), torch.tensor(v), st, bt, training=training, eps=1e-5)
    )
    yt.backward(torch.tensor(g))
    for name, a, t in (
        ("y", y, yt),
        ("dx", xo.grad, xt.grad),
        ("dscale", so.grad, st.grad),
        ("dbias", bo.grad, bt.grad),
    ):
        a, t = a.numpy(), t.detach().numpy()
        # float32 both; sums over up to 36,864 elements in different orders: relative to the largest
        np.testing.assert_allclose(a, t, rtol=1e-4, atol=2e-5 * max(np.abs(t).max(), 1.0), err_msg=name)


def test_fused_backward_reference_masks_like_relu_then_batch_norm_grad():
    x, s, b, m, v = _data((4, 3, 6), np.float32)
    g = RNG.standard_normal(x.shape).astype(np.float32)
    y = _fused_forward([x, s, b, m, v], 1)
    rec = ops.get_op("BatchNormalizationGrad", "opsnn")
    fused = rec.reference([g, x, s, None, None, y], rec.bind_attrs({"relu": 1}))
    plain = rec.reference([np.where(y > 0, g, 0).astype(np.float32), x, s, None, None], rec.bind_attrs({}))
    got = ops.batch_norm_backward(_t(g), _t(x), _t(s), y=_t(y))
    for k in range(3):
        np.testing.assert_allclose(fused[k], plain[k], rtol=1e-12, atol=0)
        np.testing.assert_allclose(got[k].numpy(), fused[k], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cls, shape", [(nn.BatchNorm2d, (4, 3, 5, 6)), (nn.BatchNorm1d, (6, 4))])
def test_layer_relu_true_trains_like_relu_of_the_layer(cls, shape):
    """The nn layer's relu=True (one fused op in training) against ops.relu(layer(x)) (two ops):
    output, gradients and running statistics over two steps."""
    x = RNG.standard_normal(shape).astype(np.float32)
    g = RNG.standard_normal(shape).astype(np.float32)
    fused, plain = cls(shape[1]).train(), cls(shape[1]).train()
    for layer in (fused, plain):
        layer.weight.copy_(np.linspace(0.5, 1.5, shape[1], dtype=np.float32))
        layer.bias.copy_(np.linspace(-0.5, 0.5, shape[1], dtype=np.float32))
    for _ in range(2):
        xf, xp = _t(x).requires_grad_(), _t(x).requires_grad_()
        yf = fused(xf, relu=True)
        yp = ops.relu(plain(xp))
        yf.backward(_t(g))
        yp.backward(_t(g))
        np.testing.assert_allclose(yf.numpy(), yp.numpy(), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(xf.grad.numpy(), xp.grad.numpy(), rtol=1e-5, atol=1e-6)
    for name in ("weight", "bias"):
        np.testing.assert_allclose(
            getattr(fused, name).grad.numpy(), getattr(plain, name).grad.numpy(), rtol=1e-5, atol=1e-6
        )
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        np.testing.assert_array_equal(getattr(fused, name).numpy(), getattr(plain, name).numpy())
    fused.eval(), plain.eval()
    with opsnn.no_grad():
        np.testing.assert_allclose(fused(_t(x), relu=True).numpy(), ops.relu(plain(_t(x))).numpy(), rtol=1e-6)


def test_eval_mode_keeps_a_separate_relu_node():
    """Inference graphs keep BatchNormalization -> Relu (what conv_bn_folding and ONNX export know)."""
    bn = nn.BatchNorm2d(3).eval()

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = bn

        def forward(self, x):
            return self.bn(x, relu=True)

    g = M().to_graph([np.ones((1, 3, 4, 4), np.float32)])
    kinds = [n.op_type for n in g.nodes]
    assert kinds == ["BatchNormalization", "Relu"]
    assert not g.nodes[0].attrs.get("relu", 0)


def test_fused_backward_without_y_is_a_typed_error():
    x, s, b, m, v = _data((2, 3, 4), np.float32)
    with pytest.raises((InferShapeError, ParamInvalidError), match=r"BatchNormalizationGrad.*'Y'.*relu=1"):
        ops.run_op("BatchNormalizationGrad", [_t(x), _t(x), _t(s)], {"relu": 1}, num_outputs=3, domain="opsnn")
    with pytest.raises((InferShapeError, ParamInvalidError), match=r"BatchNormalizationGrad.*'Y'.*shape"):
        ops.run_op(
            "BatchNormalizationGrad",
            [_t(x), _t(x), _t(s), None, None, _t(x[:1])],
            {"relu": 1},
            num_outputs=3,
            domain="opsnn",
        )
