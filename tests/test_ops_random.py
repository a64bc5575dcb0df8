"""Random ops: shapes, dtypes, determinism for a seed, and distribution moments (loose
bounds, not exact values: the streams are numpy's PCG64, not any peer's)."""

import ml_dtypes
import numpy as np
import pytest

import opsnn
from opsnn.errors import DTypeError, InferShapeError, ParamInvalidError

N = 200_000  # moments below use ~5-sigma bounds for this many draws


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_random_normal_shape_dtype_moments(dtype):
    x = opsnn.ops.random_normal((N,), mean=2.0, scale=3.0, dtype=dtype, seed=7)
    assert x.shape == (N,) and x.dtype == opsnn.dtypes.get(dtype)
    a = x.numpy().astype(np.float64)
    assert abs(a.mean() - 2.0) < 5 * 3.0 / np.sqrt(N) + 0.02
    assert abs(a.std() - 3.0) < 0.05
    assert abs(((a - 2.0) ** 3).mean() / 27.0) < 0.05  # symmetric


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_random_uniform_range_moments(dtype):
    x = opsnn.ops.random_uniform((400, 500), low=-1.0, high=3.0, dtype=dtype, seed=3).numpy().astype(np.float64)
    assert x.shape == (400, 500)
    assert x.min() >= -1.0 and x.max() <= 3.0
    assert abs(x.mean() - 1.0) < 0.02
    assert abs(x.var() - 16 / 12) < 0.03
    hist = np.histogram(x, bins=8, range=(-1, 3))[0] / x.size
    np.testing.assert_allclose(hist, 1 / 8, atol=0.01)


@pytest.mark.parametrize("op", ["RandomNormal", "RandomUniform"])
def test_seed_determinism(op):
    attrs = {"shape": [3, 4, 5], "seed": 1.0}
    a = opsnn.ops.run_op(op, [], attrs)[0].numpy()
    b = opsnn.ops.run_op(op, [], dict(attrs))[0].numpy()
    np.testing.assert_array_equal(a, b)
    ex = opsnn.aclnn.prepare(op, [], attrs)
    np.testing.assert_array_equal(ex.run().numpy(), ex.run().numpy())  # every run, same draw
    c = opsnn.ops.run_op(op, [], {"shape": [3, 4, 5], "seed": 1.5})[0].numpy()
    assert not np.array_equal(a, c)
    # no seed: fresh entropy each call
    d1 = opsnn.ops.run_op(op, [], {"shape": [3, 4, 5]})[0].numpy()
    d2 = opsnn.ops.run_op(op, [], {"shape": [3, 4, 5]})[0].numpy()
    assert not np.array_equal(d1, d2)
    np.testing.assert_array_equal(opsnn.ops.run_op(op, [], attrs, algo="reference")[0].numpy(), a)


def test_like_ops_take_shape_and_dtype(rng):
    x = rng.standard_normal((30, 40)).astype(np.float16)
    y = opsnn.ops.random_normal_like(x, seed=0)
    assert y.shape == (30, 40) and y.dtype == np.float16
    xt = opsnn.from_numpy(np.zeros((40, 30), np.int32)).transpose(0, 1)
    y = opsnn.ops.random_uniform_like(xt, low=5, high=6, dtype="float64", seed=0)
    assert y.shape == (30, 40) and y.dtype == np.float64
    assert 5 <= y.numpy().min() and y.numpy().max() <= 6
    y = opsnn.ops.run_op("RandomUniformLike", [x], {"dtype": 16, "seed": 2.0})[0]
    assert y.dtype == ml_dtypes.bfloat16
    with pytest.raises(DTypeError, match="dtype"):
        opsnn.ops.random_normal_like(np.zeros(3, np.int64))  # int input needs an explicit float dtype
    s = np.array(["a", "b"])  # any input type is fine when dtype is given
    assert opsnn.ops.random_normal_like(s, dtype="float32", seed=1).shape == (2,)


@pytest.mark.parametrize("dtype", [None, "float64", "int32", "bool", "uint8"])
def test_bernoulli(rng, dtype):
    p = np.tile(np.array([0.0, 0.1, 0.5, 0.9, 1.0], np.float32), (40_000, 1))
    y = opsnn.ops.bernoulli(p, dtype=dtype, seed=4)
    assert y.shape == p.shape and y.dtype == (np.float32 if dtype is None else opsnn.dtypes.get(dtype))
    a = y.numpy().astype(np.float64)
    assert set(np.unique(a)) <= {0.0, 1.0}
    np.testing.assert_allclose(a.mean(0), [0, 0.1, 0.5, 0.9, 1.0], atol=0.01)
    assert a[:, 0].max() == 0 and a[:, 4].min() == 1
    np.testing.assert_array_equal(opsnn.ops.bernoulli(p, dtype=dtype, seed=4).numpy(), y.numpy())


def test_bernoulli_16bit_and_reference():
    p = np.full((1000, 100), 0.3, np.float16)
    y = opsnn.ops.bernoulli(p, seed=1)
    assert y.dtype == np.float16 and abs(y.numpy().astype(np.float64).mean() - 0.3) < 0.01
    r = opsnn.ops.bernoulli(p.astype(np.float64), seed=1, algo="reference").numpy()
    assert abs(r.mean() - 0.3) < 0.01


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_multinomial_frequencies(dtype):
    probs = np.array([[0.1, 0.2, 0.3, 0.4], [0.0, 0.0, 1.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    with np.errstate(divide="ignore"):
        logits = (np.log(probs) + np.array([[3.0], [-2.0], [0.5]])).astype(np.float32)  # shift-invariant
    y = opsnn.ops.multinomial(logits, sample_size=50_000, dtype=dtype, seed=9)
    assert y.shape == (3, 50_000) and y.dtype == np.dtype(dtype)
    a = y.numpy()
    assert a.min() >= 0 and a.max() <= 3
    freq = np.stack([np.bincount(row, minlength=4) / row.size for row in a])
    np.testing.assert_allclose(freq, probs, atol=0.01)
    assert np.all(a[1] == 2)
    np.testing.assert_array_equal(opsnn.ops.multinomial(logits, 50_000, dtype, seed=9).numpy(), a)
    ref = opsnn.ops.multinomial(logits[:, :], 2000, dtype, seed=9, algo="reference").numpy()
    freq = np.stack([np.bincount(row, minlength=4) / row.size for row in ref])
    np.testing.assert_allclose(freq, probs, atol=0.05)


def test_multinomial_default_dtype_and_empty():
    y = opsnn.ops.run_op("Multinomial", [np.zeros((2, 3), np.float32)], {})[0]
    assert y.shape == (2, 1) and y.dtype == np.int32
    assert opsnn.ops.multinomial(np.zeros((0, 3), np.float32), 4).shape == (0, 4)
    assert opsnn.ops.multinomial(np.zeros((2, 3), np.float16), 4, seed=0).shape == (2, 4)


def test_bad_arguments():
    with pytest.raises(DTypeError, match="dtype"):
        opsnn.ops.run_op("RandomNormal", [], {"shape": [2], "dtype": 6})  # int32 is not a float
    with pytest.raises(DTypeError):
        opsnn.ops.run_op("RandomNormal", [], {"shape": [2], "dtype": 99})
    with pytest.raises(ParamInvalidError, match="shape"):
        opsnn.ops.random_uniform((2, -1))
    with pytest.raises(opsnn.errors.ParamNullptrError, match="shape"):
        opsnn.ops.run_op("RandomUniform", [], {})
    with pytest.raises(ParamInvalidError, match="high"):
        opsnn.ops.random_uniform((2,), low=1.0, high=0.0)
    with pytest.raises(InferShapeError, match="2-D"):
        opsnn.ops.multinomial(np.zeros(3, np.float32))
    with pytest.raises(DTypeError, match="dtype"):
        opsnn.ops.multinomial(np.zeros((2, 3), np.float32), dtype="float32")
    with pytest.raises(opsnn.errors.OpsnnError, match="finite"):
        opsnn.ops.multinomial(np.array([[np.nan, 0.0]], np.float32), seed=0).numpy()
        opsnn.current_stream().synchronize()
    with pytest.raises(ParamInvalidError, match="sample_size"):
        opsnn.ops.multinomial(np.zeros((2, 3), np.float32), sample_size=-2)
