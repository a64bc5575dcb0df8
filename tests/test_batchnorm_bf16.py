"""BatchNormalization / BatchNormalizationGrad on bfloat16 data read and written natively
(float32 math, float64 statistics, float32 scale and statistics inputs): bit-equal to the float32
kernel on the widened inputs with its outputs rounded to bfloat16 (what the fp32 adapter gave),
close to the float64 references, NaN and Inf kept, and no adapter selected."""

import numpy as np
import pytest

import opsnn
from opsnn import dtypes as _dt
from opsnn import ops
from opsnn.errors import ParamInvalidError

BF16 = _dt.bfloat16
RNG = np.random.default_rng(1631)
# the last two over the parallel threshold (BN_PARALLEL_MIN): short planes (channel ranges) and long ones
SHAPES = [(3, 5, 4, 7), (2, 3, 11), (32, 72, 3, 5), (16, 12, 64, 48)]


def _t(a):
    return opsnn.tensor(np.asarray(a))


def _params(C):
    s = RNG.uniform(0.5, 1.5, C).astype(np.float32)
    b = RNG.standard_normal(C).astype(np.float32)
    m = RNG.standard_normal(C).astype(np.float32)
    v = RNG.uniform(0.5, 2.0, C).astype(np.float32)
    return s, b, m, v


def _bf16(shape, offset=0.5):
    return (RNG.standard_normal(shape) * 2 + offset).astype(np.float32).astype(BF16)


def _run(name, arrays, attrs, n):
    domain = "opsnn" if name.endswith("Grad") else ""
    with opsnn.no_grad():
        out = ops.run_op(name, [None if a is None else _t(a) for a in arrays], attrs, num_outputs=n, domain=domain)
    return [o.numpy() for o in (out if isinstance(out, (list, tuple)) else [out])]


def _same(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert a.shape == b.shape
    assert np.array_equal(a, b, equal_nan=True), np.abs(a - b)[~np.isnan(a - b)].max()


@pytest.mark.parametrize("shape", SHAPES, ids=["4d", "3d", "parallel_short", "parallel"])
@pytest.mark.parametrize("training", [1, 0])
@pytest.mark.parametrize("relu", [0, 1])
def test_forward_bf16_is_float32_kernel_rounded(shape, training, relu):
    x = _bf16(shape)
    s, b, m, v = _params(shape[1])
    attrs = {"training_mode": training, "epsilon": 1e-5, "momentum": 0.9, "relu": relu}
    n = 3 if training else 1
    got = _run("BatchNormalization", (x, s, b, m, v), attrs, n)
    f32 = _run("BatchNormalization", (x.astype(np.float32), s, b, m, v), attrs, n)
    assert got[0].dtype == BF16 and all(g.dtype == np.float32 for g in got[1:])
    _same(got[0], f32[0].astype(BF16))
    for k in range(1, n):
        _same(got[k], f32[k])
    rec = ops.get_op("BatchNormalization")
    ref = rec.reference([a.astype(np.float64) for a in (x, s, b, m, v)], rec.bind_attrs(attrs))
    ref = ref if isinstance(ref, tuple) else (ref,)
    # bf16 output: 8 significant bits over a float64 normalisation
    np.testing.assert_allclose(got[0].astype(np.float64), ref[0], rtol=2**-8, atol=1e-2)


@pytest.mark.parametrize("shape", SHAPES, ids=["4d", "3d", "parallel_short", "parallel"])
@pytest.mark.parametrize("training", [1, 0])
@pytest.mark.parametrize("relu", [0, 1])
def test_backward_bf16_is_float32_kernel_rounded(shape, training, relu):
    x, g = _bf16(shape), _bf16(shape, 0.0)
    s, b, m, v = _params(shape[1])
    fwd = {"training_mode": training, "epsilon": 1e-5, "momentum": 0.9, "relu": relu}
    y = _run("BatchNormalization", (x, s, b, m, v), fwd, 1)[0] if relu else None
    attrs = {"training_mode": training, "epsilon": 1e-5, "relu": relu}
    ins = (g, x, s, None if training else m, None if training else v, y)
    got = _run("BatchNormalizationGrad", ins, attrs, 3)
    wide = [None if a is None else a.astype(np.float32) for a in ins]
    f32 = _run("BatchNormalizationGrad", wide, attrs, 3)
    assert got[0].dtype == BF16 and got[1].dtype == got[2].dtype == np.float32
    _same(got[0], f32[0].astype(BF16))
    _same(got[1], f32[1])
    _same(got[2], f32[2])
    rec = ops.get_op("BatchNormalizationGrad", "opsnn")
    ref = rec.reference([None if a is None else a.astype(np.float64) for a in ins], rec.bind_attrs(attrs))
    scale = np.abs(ref[0]).max()
    np.testing.assert_allclose(got[0].astype(np.float64), ref[0], rtol=2**-7, atol=2**-7 * scale)
    for k in (1, 2):  # float32 sums over N * S terms of bf16 data
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-4, atol=1e-3 * np.abs(ref[k]).max())


@pytest.mark.parametrize("training", [1, 0])
def test_bf16_nan_and_inf_stay_where_float32_has_them(training):
    shape = (2, 3, 4, 5)
    x, g = _bf16(shape), _bf16(shape, 0.0)
    x[1, 2, 3, 1] = np.nan
    x[0, 1, 0, 0] = np.inf
    g[1, 0, 2, 2] = -np.inf
    s, b, m, v = _params(3)
    fwd = {"training_mode": training, "epsilon": 1e-5, "relu": 0}
    got = _run("BatchNormalization", (x, s, b, m, v), fwd, 1)[0]
    _same(got, _run("BatchNormalization", (x.astype(np.float32), s, b, m, v), fwd, 1)[0].astype(BF16))
    assert np.isnan(got[1, 2, 3, 1].astype(np.float32))
    attrs = {"training_mode": training, "epsilon": 1e-5}
    ins = (g, x, s, m, v)
    got = _run("BatchNormalizationGrad", ins, attrs, 3)
    f32 = _run("BatchNormalizationGrad", [a.astype(np.float32) for a in ins], attrs, 3)
    _same(got[0], f32[0].astype(BF16))
    _same(got[1], f32[1])
    _same(got[2], f32[2])
    assert not np.isfinite(got[0].astype(np.float32)).all()  # NaN (training) or -inf (eval) from x and dY


def test_bf16_grad_refuses_a_float32_gradient():
    x, g = _bf16((2, 3, 4, 5)), _bf16((2, 3, 4, 5), 0.0).astype(np.float32)
    with pytest.raises(ParamInvalidError, match="BatchNormalizationGrad.*dY.*dtype"):
        _run("BatchNormalizationGrad", (g, x, _params(3)[0]), {"training_mode": 1}, 3)


def test_bf16_kernels_run_without_the_fp32_adapter(monkeypatch):
    from opsnn.ops import executor

    tags = []
    orig = executor._pool_copy

    def spy(a, dt, tag, *rest, **kw):
        tags.append(str(tag))
        return orig(a, dt, tag, *rest, **kw)

    monkeypatch.setattr(executor, "_pool_copy", spy)
    shape = (2, 3, 4, 5)
    x, g = _bf16(shape), _bf16(shape, 0.0)
    s, b, m, v = _params(3)
    y = _run("BatchNormalization", (x, s, b, m, v), {"training_mode": 1, "relu": 1}, 3)[0]
    _run("BatchNormalizationGrad", (g, x, s, None, None, y), {"training_mode": 1, "relu": 1}, 3)
    assert not [t for t in tags if "adapter" in t], tags
    # float16 keeps the adapter (no native kernel): the spy sees it
    _run("BatchNormalization", (x.astype(np.float16), s, b, m, v), {"training_mode": 1}, 3)
    assert [t for t in tags if "BatchNormalization:fp32 adapter" in t]
