"""Tensor methods generated from the functional API (opsnn/ops/tensor_methods.py), each
compared with numpy in float64 (and with torch where it is importable) on odd shapes,
negative dims, keepdim and NaN; the keyword aliases and the error for an unknown keyword;
the table's coverage of the functional ops torch has as Tensor methods; repr alignment."""

import math

import numpy as np
import pytest

import opsnn
from opsnn.errors import ParamInvalidError
from opsnn.ops import FUNCTIONS
from opsnn.ops.tensor_methods import METHODS, NOT_METHODS, MinMax

RTOL, ATOL = 1e-5, 1e-6  # float32 results against float64 numpy


def close(got, want, rtol=RTOL, atol=ATOL):
    g = got.numpy() if isinstance(got, opsnn.Tensor) else np.asarray(got)
    w = np.asarray(want)
    assert g.shape == w.shape, (g.shape, w.shape)
    np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True)


@pytest.fixture
def x(rng):
    a = rng.standard_normal((3, 5, 7)).astype(np.float32)
    a[1, 2, 3] = np.nan
    return a


UNARY = {
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "abs": np.abs,
    "neg": np.negative,
    "sign": lambda a: np.where(np.isnan(a), 0.0, np.sign(a)),  # torch's: 0 at NaN
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.round,
    "reciprocal": np.reciprocal,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "asin": np.arcsin,
    "acos": np.arccos,
    "atan": np.arctan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "asinh": np.arcsinh,
    "acosh": np.arccosh,
    "atanh": np.arctanh,
    "tanh": np.tanh,
    "sigmoid": lambda a: 1 / (1 + np.exp(-a)),
    "relu": lambda a: np.where(np.isnan(a), a, np.maximum(a, 0)),
    "rsqrt": lambda a: 1 / np.sqrt(a),
    "erf": np.vectorize(lambda v: v if math.isnan(v) else math.erf(v)),
    "isnan": np.isnan,
    "isinf": np.isinf,
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_methods(name, x):
    a = np.abs(x) + 1.5 if name == "acosh" else (np.clip(x, -0.9, 0.9) if name in ("asin", "acos", "atanh") else x)
    with np.errstate(all="ignore"):
        want = UNARY[name](a.astype(np.float64))
    got = getattr(opsnn.tensor(a), name)()
    if want.dtype == bool:
        assert got.dtype == np.bool_ and np.array_equal(got.numpy(), want)
    else:
        close(got, want, rtol=2e-5, atol=2e-6)


REDUCE = {
    "sum": np.sum,
    "mean": np.mean,
    "prod": np.prod,
    "amax": np.max,
    "amin": np.min,
    "logsumexp": lambda a, axis=None, keepdims=False: np.log(np.sum(np.exp(a), axis=axis, keepdims=keepdims)),
}


@pytest.mark.parametrize("name", sorted(REDUCE))
@pytest.mark.parametrize("dim", [None, 0, -1, 1, (0, 2)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_reductions_dim_axis_keepdim(name, dim, keepdim, x):
    a = x * 0.5 if name == "prod" else x
    want = REDUCE[name](a.astype(np.float64), axis=dim, keepdims=keepdim)
    t = opsnn.tensor(a)
    close(getattr(t, name)(dim, keepdim), want, rtol=1e-4)
    close(getattr(t, name)(dim=dim, keepdim=keepdim), want, rtol=1e-4)
    close(getattr(t, name)(axis=dim, keepdims=keepdim), want, rtol=1e-4)  # numpy's spellings, as torch accepts


def test_no_dim_reduces_to_a_0d_tensor(x):
    t = opsnn.tensor(np.nan_to_num(x))
    for name in ("sum", "mean", "max", "min", "prod"):
        assert getattr(t, name)().shape == ()
    close(t.sum(), np.nan_to_num(x).astype(np.float64).sum(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("dim", [0, 1, -1, -3])
@pytest.mark.parametrize("keepdim", [False, True])
def test_max_min_with_dim_give_values_and_indices(op, dim, keepdim, x):
    """torch semantics, NaN included: NaN wins and its index is returned."""
    t = opsnn.tensor(x)
    res = getattr(t, op)(dim, keepdim=keepdim)
    assert isinstance(res, MinMax)
    values, indices = res
    ref = np.max if op == "max" else np.min
    arg = np.argmax if op == "max" else np.argmin
    close(values, ref(x.astype(np.float64), axis=dim, keepdims=keepdim))
    want_idx = arg(x, axis=dim, keepdims=keepdim)
    assert indices.dtype == np.int64 and np.array_equal(indices.numpy(), want_idx)
    assert res.values is values and res.indices is indices
    # the whole tensor: one value, NaN propagates
    assert np.isnan(getattr(t, op)().item())
    # another tensor: elementwise
    y = np.flip(x, 0).copy()
    close(getattr(t, op)(opsnn.tensor(y)), (np.maximum if op == "max" else np.minimum)(x, y))


@pytest.mark.parametrize("dim", [None, 0, 2, -1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_argmax_argmin(dim, keepdim, rng):
    a = rng.standard_normal((4, 3, 5)).astype(np.float32)
    t = opsnn.tensor(a)
    if dim is None:
        assert t.argmax().item() == np.argmax(a) and t.argmin().item() == np.argmin(a)
        return
    assert np.array_equal(t.argmax(dim, keepdim).numpy(), np.argmax(a, axis=dim, keepdims=keepdim))
    assert np.array_equal(t.argmin(axis=dim, keepdims=keepdim).numpy(), np.argmin(a, axis=dim, keepdims=keepdim))


def test_var_cumsum_cumprod(rng):
    a = rng.standard_normal((4, 6)).astype(np.float32)
    t = opsnn.tensor(a)
    close(t.var(1), np.var(a.astype(np.float64), axis=1, ddof=1), rtol=1e-4)
    close(
        t.var(dim=0, unbiased=False, keepdim=True),
        np.var(a.astype(np.float64), axis=0, ddof=0, keepdims=True),
        rtol=1e-4,
    )
    close(t.cumsum(-1), np.cumsum(a.astype(np.float64), axis=-1), rtol=1e-5)
    close(t.cumprod(dim=0), np.cumprod(a.astype(np.float64), axis=0), rtol=1e-5)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_log_softmax(dim, rng):
    a = rng.standard_normal((3, 4, 5)).astype(np.float32) * 3
    w = a.astype(np.float64)
    e = np.exp(w - w.max(axis=dim, keepdims=True))
    sm = e / e.sum(axis=dim, keepdims=True)
    t = opsnn.tensor(a)
    close(t.softmax(dim), sm)
    close(t.softmax(axis=dim), sm)
    close(t.log_softmax(dim=dim), np.log(sm), atol=1e-5)


def test_binary_methods_and_operators_broadcast(rng):
    a = rng.standard_normal((3, 1, 5)).astype(np.float32)
    b = rng.standard_normal((4, 5)).astype(np.float32) + 3.0
    ta, tb = opsnn.tensor(a), opsnn.tensor(b)
    A, B = a.astype(np.float64), b.astype(np.float64)
    close(ta.add(tb), A + B)
    close(ta + tb, A + B)
    close(ta.sub(tb), A - B)
    close(ta - 2.0, A - 2)
    close(2.0 - ta, 2 - A)
    close(ta * tb, A * B)
    close(3 * ta, 3 * A)
    close(ta.div(tb), A / B)
    close(1.0 / tb, 1 / B)
    close(tb.pow(2), B**2)
    close(tb**0.5, B**0.5)
    close(2.0**ta, 2.0**A)
    close(ta.remainder(tb), np.mod(A, B), atol=1e-5)  # torch.remainder: the sign of the divisor
    close(ta % 1.5, np.mod(A, 1.5), atol=1e-5)
    close(ta.fmod(tb), np.fmod(A, B), atol=1e-5)
    close(ta.maximum(tb), np.maximum(A, B))
    close(ta.minimum(tb), np.minimum(A, B))
    for name, ref in (
        ("eq", np.equal),
        ("lt", np.less),
        ("le", np.less_equal),
        ("gt", np.greater),
        ("ge", np.greater_equal),
    ):
        assert np.array_equal(getattr(ta, name)(tb).numpy(), ref(a, b)), name
    assert np.array_equal((ta < tb).numpy(), a < b) and np.array_equal((ta >= 0.0).numpy(), a >= 0)
    p, q = ta > 0.0, tb > 3.0
    assert np.array_equal((p & q).numpy(), (a > 0) & (b > 3))
    assert np.array_equal((p | q).numpy(), (a > 0) | (b > 3))
    assert np.array_equal((p ^ q).numpy(), (a > 0) ^ (b > 3))
    assert np.array_equal(p.logical_not().numpy(), ~(a > 0))
    close(-ta, -A)
    close(abs(ta), np.abs(A))


def test_matmul_family(rng):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    b = rng.standard_normal((2, 4, 5)).astype(np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)
    ta, tb = opsnn.tensor(a), opsnn.tensor(b)
    close(ta.matmul(tb), want, rtol=1e-5, atol=1e-5)
    close(ta @ tb, want, rtol=1e-5, atol=1e-5)
    close(ta.bmm(tb), want, rtol=1e-5, atol=1e-5)
    close(ta[0].mm(tb[0]), want[0], rtol=1e-5, atol=1e-5)
    close(a[0] @ tb[0], want[0], rtol=1e-5, atol=1e-5)  # numpy on the left: Tensor.__rmatmul__


def test_clamp_clip_where(x):
    t = opsnn.tensor(x)
    close(t.clamp(-0.5, 0.5), np.clip(x, -0.5, 0.5))
    close(t.clamp(min=0.0), np.where(np.isnan(x), x, np.maximum(x, 0)))
    close(t.clip(max=0.25), np.where(np.isnan(x), x, np.minimum(x, 0.25)))
    cond = x > 0
    close(t.where(opsnn.tensor(cond), 0.0), np.where(cond, x, 0.0))


def test_dtype_conversions(rng):
    import ml_dtypes

    a = (rng.standard_normal((3, 5)) * 10).astype(np.float32)
    t = opsnn.tensor(a)
    for name, dt in (
        ("float", np.float32),
        ("double", np.float64),
        ("half", np.float16),
        ("bfloat16", ml_dtypes.bfloat16),
        ("int", np.int32),
        ("long", np.int64),
        ("short", np.int16),
        ("char", np.int8),
        ("bool", np.bool_),
    ):
        got = getattr(t, name)()
        assert got.dtype == np.dtype(dt), name
        if name in ("half", "bfloat16"):
            close(got.numpy().astype(np.float32), a.astype(dt).astype(np.float32))
        elif name != "char":
            assert np.array_equal(got.numpy(), a.astype(dt)), name
    assert t.byte().dtype == np.uint8
    assert t.to("float64").dtype == np.float64 and t.to(np.int64).dtype == np.int64 and t.to("cpu") is t
    assert t.type_as(opsnn.tensor(np.zeros(1, np.float16))).dtype == np.float16


def test_metadata_methods():
    t = opsnn.tensor(np.zeros((2, 3, 4), np.float32))
    assert t.numel() == 24 and t.numel == 24 and t.nelement() == 24
    assert t.ndim == 3 and t.dim() == 3 and t.ndimension() == 3
    assert t.size() == (2, 3, 4) and t.size(1) == 3 and t.size(-1) == 4
    assert t.element_size() == 4
    assert float(t.sum()) == 0.0 and int(opsnn.tensor(np.array([7], np.int64))) == 7
    with pytest.raises(ParamInvalidError, match="only a one-element tensor has a Python value"):
        float(t)
    with pytest.raises(ParamInvalidError, match="size: dim 3 out of range for a 3-D tensor"):
        t.size(3)


def test_views_flatten_and_layout_methods(rng):
    a = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    t = opsnn.tensor(a)
    assert t.flatten().shape == (120,)
    assert np.array_equal(t.flatten(1).numpy(), a.reshape(2, 60))
    assert np.array_equal(t.flatten(1, -2).numpy(), a.reshape(2, 12, 5))
    assert np.array_equal(t.flatten(start_dim=-2).numpy(), a.reshape(2, 3, 20))
    assert np.array_equal(t.permute(3, 0, 2, 1).flatten(1, 2).numpy(), a.transpose(3, 0, 2, 1).reshape(5, 8, 3))
    assert np.array_equal(t.transpose(-1, 0).numpy(), a.swapaxes(-1, 0))
    assert np.array_equal(t.view(6, 20).numpy(), a.reshape(6, 20))
    assert t.unsqueeze(-1).squeeze(-1).shape == a.shape
    assert opsnn.tensor(np.float32(3)).flatten().shape == (1,)


def test_indexing_methods(rng):
    a = rng.standard_normal((4, 6)).astype(np.float32)
    t = opsnn.tensor(a)
    idx = rng.integers(0, 6, (4, 3))
    assert np.array_equal(t.gather(1, idx).numpy(), np.take_along_axis(a, idx, axis=1))
    assert np.array_equal(t.gather(dim=-1, index=idx).numpy(), np.take_along_axis(a, idx, axis=1))
    assert np.array_equal(t.index_select(0, np.array([3, 0])).numpy(), a[[3, 0]])
    src = np.ones((4, 3), np.float32)
    want = a.copy()
    np.put_along_axis(want, idx[:, :1], src[:, :1], axis=1)
    assert np.array_equal(t.scatter(1, idx[:, :1], opsnn.tensor(src[:, :1])).numpy(), want)
    assert np.array_equal(t.tril().numpy(), np.tril(a)) and np.array_equal(t.triu(1).numpy(), np.triu(a, 1))
    assert np.array_equal(t.tile((2, 1)).numpy(), np.tile(a, (2, 1)))
    vals, inds = t.topk(2, dim=1)
    want_i = np.argsort(-a, axis=1, kind="stable")[:, :2]
    assert np.array_equal(inds.numpy(), want_i) and np.array_equal(vals.numpy(), np.take_along_axis(a, want_i, 1))
    mask = a > 0
    assert np.array_equal(opsnn.tensor(mask).nonzero().numpy(), np.argwhere(mask))  # torch's (count, rank)
    parts = t.split(4, dim=1)
    assert [p.shape for p in parts] == [(4, 4), (4, 2)]
    ints = opsnn.tensor(np.array([3, 1, 3, 2, 1], np.int64))
    assert ints.unique().numpy().tolist() == [1, 2, 3]


def test_methods_are_recorded_when_traced(rng):
    """Generated methods go through the functional API, so opsnn.compile traces them."""
    a = rng.standard_normal((3, 8)).astype(np.float32)

    def f(x):
        return (x.softmax(dim=-1) * 2.0).sum(axis=1, keepdims=True).sqrt()

    cg = opsnn.compile(f, [a])
    w = a.astype(np.float64)
    e = np.exp(w - w.max(1, keepdims=True))
    close(cg.run([a])[0], np.sqrt((2 * e / e.sum(1, keepdims=True)).sum(1, keepdims=True)))
    assert {n.op_type for n in cg.graph.nodes} >= {"Softmax"}


# -- keywords and errors --------------------------------------------------------------------------------------
def test_unknown_keyword_names_the_nearest_parameter():
    t = opsnn.tensor(np.ones((2, 3), np.float32))
    with pytest.raises(
        ParamInvalidError,
        match=r"softmax\(\) got an unexpected keyword 'axs'; did you mean "
        r"'axis' / 'dim'\?$",
    ):
        t.softmax(axs=0)
    with pytest.raises(
        ParamInvalidError,
        match=r"sum\(\) got an unexpected keyword 'keep'; did you mean "
        r"'keepdim' / 'keepdims'\?",
    ):
        t.sum(keep=True)
    with pytest.raises(
        ParamInvalidError,
        match=r"clamp\(\) got an unexpected keyword 'low'; its parameters are "
        r"'min', 'max'",
    ):
        t.clamp(low=0)
    with pytest.raises(ParamInvalidError, match=r"sum\(\) got two values for 'dim' / 'axis'"):
        t.sum(0, axis=1)
    with pytest.raises(ParamInvalidError, match=r"exp\(\) takes at most 0 argument\(s\) \(none\), got 1"):
        t.exp(2)
    with pytest.raises(ParamInvalidError, match=r"float\(\) got an unexpected keyword 'dtype'"):
        t.float(dtype="float16")


# -- the table ---------------------------------------------------------------------------------------------------
#: torch.Tensor methods that share a name with an opsnn functional op (torch 2.x; torch is not a test dependency)
TORCH_TENSOR_METHODS_WITH_FUNCTIONAL = {
    "relu",
    "sigmoid",
    "tanh",
    "softmax",
    "log_softmax",
    "hardshrink",
    "prelu",
    "add",
    "sub",
    "mul",
    "div",
    "pow",
    "remainder",
    "fmod",
    "maximum",
    "minimum",
    "eq",
    "lt",
    "le",
    "gt",
    "ge",
    "logical_and",
    "logical_or",
    "logical_xor",
    "logical_not",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "bitwise_not",
    "bitwise_left_shift",
    "bitwise_right_shift",
    "neg",
    "abs",
    "sign",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "floor",
    "ceil",
    "round",
    "reciprocal",
    "erf",
    "sin",
    "cos",
    "tan",
    "asin",
    "acos",
    "atan",
    "sinh",
    "cosh",
    "asinh",
    "acosh",
    "atanh",
    "isnan",
    "isinf",
    "clip",
    "clamp",
    "where",
    "matmul",
    "sum",
    "mean",
    "max",
    "min",
    "prod",
    "logsumexp",
    "var",
    "argmax",
    "argmin",
    "cumsum",
    "cumprod",
    "reshape",
    "transpose",
    "permute",
    "split",
    "index_select",
    "flatten",
    "squeeze",
    "unsqueeze",
    "expand",
    "tile",
    "triu",
    "tril",
    "nonzero",
    "topk",
    "unique",
    "det",
    "bernoulli",
    "multinomial",
    "stft",
    "gather",
}


def test_every_functional_op_with_a_torch_method_has_it():
    missing = [
        n
        for n in sorted(TORCH_TENSOR_METHODS_WITH_FUNCTIONAL)
        if n in FUNCTIONS and n not in NOT_METHODS and not callable(getattr(opsnn.Tensor, n, None))
    ]
    assert not missing, missing
    for name, spec in METHODS.items():
        assert spec.fn in FUNCTIONS, name
        assert callable(getattr(opsnn.Tensor, name)), name


def test_repr_aligns_rows_like_numpy():
    t = opsnn.tensor(np.array([[1.0, -2.5], [3.0, 40.0]], np.float32))
    assert repr(t) == "tensor([[ 1.0000, -2.5000],\n        [ 3.0000, 40.0000]], dtype=float32)"
    assert repr(opsnn.tensor(np.array([1.0, 2.0], np.float32))) == "tensor([1., 2.], dtype=float32)"
    assert (
        repr(opsnn.tensor(np.array([[1, -20], [300, 4]], np.int64)))
        == "tensor([[  1, -20],\n        [300,   4]], dtype=int64)"
    )
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 3 - 2
    lines = [line for line in repr(opsnn.tensor(a)).split("\n") if line]
    assert all(line.startswith(" " * len("tensor([")) for line in lines[1:])
    # every row's numbers sit in the same columns (the commas between them line up)
    cols = {tuple(i for i, c in enumerate(line.split("]")[0]) if c == ",") for line in lines}
    assert len(cols) == 1 and len(next(iter(cols))) == 3, lines
    assert "nan" in repr(opsnn.tensor(np.array([np.nan, 1.5], np.float32)))
    assert repr(opsnn.tensor(np.float32(2.5))) == "tensor(2.5000, dtype=float32)"
    assert repr(opsnn.tensor(np.zeros((0, 3), np.float32))) == "tensor([], shape=(0, 3), dtype=float32)"
    import ml_dtypes

    assert repr(opsnn.tensor(np.array([1, -2], ml_dtypes.int4))) == "tensor([ 1, -2], dtype=int4)"
    assert repr(opsnn.tensor(np.array([1.5, -2], ml_dtypes.bfloat16))) == "tensor([ 1.5000, -2.0000], dtype=bfloat16)"


def test_against_torch_where_importable(rng):
    torch = pytest.importorskip("torch")
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    t, tt = opsnn.tensor(a), torch.from_numpy(a)
    close(t.softmax(-1), tt.softmax(-1).numpy())
    v, i = t.max(1, keepdim=True)
    tv, ti = tt.max(1, keepdim=True)
    close(v, tv.numpy())
    assert np.array_equal(i.numpy(), ti.numpy())
    close(t.mean(axis=(0, 2)), tt.mean(dim=(0, 2)).numpy())
    # torch leaves float32's dtype out of its repr; the rows are written the same way
    assert repr(opsnn.tensor(np.array([[1.0, -2.5]], np.float32))).split(", dtype")[0] + ")" == repr(
        torch.tensor([[1.0, -2.5]])
    )


def test_integer_bitwise_and_the_remaining_methods(rng):
    i = rng.integers(-50, 50, (3, 5)).astype(np.int32)
    j = rng.integers(0, 4, (3, 5)).astype(np.int32)
    ti, tj = opsnn.tensor(i), opsnn.tensor(j)
    for name, ref in (
        ("bitwise_and", np.bitwise_and),
        ("bitwise_or", np.bitwise_or),
        ("bitwise_xor", np.bitwise_xor),
        ("bitwise_left_shift", np.left_shift),
        ("bitwise_right_shift", np.right_shift),
    ):
        assert np.array_equal(getattr(ti, name)(tj).numpy(), ref(i, j)), name
    assert np.array_equal(ti.bitwise_not().numpy(), ~i)
    p, q = i > 0, j > 1
    assert np.array_equal(opsnn.tensor(p).logical_xor(opsnn.tensor(q)).numpy(), p ^ q)
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    t = opsnn.tensor(a)
    close(t.hardshrink(0.5), np.where(np.abs(a) > 0.5, a, 0))
    w = np.array([0.1, 0.2, 0.3], np.float32)
    close(t.prelu(opsnn.tensor(w.reshape(3, 1))), np.where(a >= 0, a, a * w.reshape(3, 1)))
    close(t[:, :3, :3].contiguous().det(), np.linalg.det(a[:, :3, :3].astype(np.float64)), rtol=1e-4, atol=1e-5)
    idx = np.array([[0, 1, 0, 1]], np.int64)
    want = a[0].copy()
    np.add.at(want, (idx[0], np.arange(4)), np.ones(4, np.float32))
    close(opsnn.tensor(a[0]).scatter_add(0, idx, opsnn.tensor(np.ones((1, 4), np.float32))), want)
    draws = opsnn.tensor(np.array([0.0, 1.0, 0.0, 1.0], np.float32)).bernoulli(seed=3)
    assert draws.numpy().tolist() == [0.0, 1.0, 0.0, 1.0]


def test_alias_rows_match_their_originals(rng):
    """Rows that are torch's second spellings (absolute, subtract, less, arcsin, ...) give what the
    row they alias gives."""
    a = rng.uniform(0.1, 0.9, (2, 3)).astype(np.float32)
    b = rng.uniform(0.1, 0.9, (2, 3)).astype(np.float32)
    ta, tb = opsnn.tensor(a), opsnn.tensor(b)
    pairs = {
        "absolute": "abs",
        "negative": "neg",
        "subtract": "sub",
        "multiply": "mul",
        "divide": "div",
        "true_divide": "div",
        "less": "lt",
        "less_equal": "le",
        "greater": "gt",
        "greater_equal": "ge",
        "arcsin": "asin",
        "arccos": "acos",
        "arctan": "atan",
        "clip": "clamp",
        "amax": "max",
        "amin": "min",
    }
    for alias, base in pairs.items():
        assert METHODS[alias].fn == METHODS[base].fn or {alias, base} == {"clip", "clamp"}, alias
        args = (tb,) if METHODS[alias].fn in ("sub", "mul", "div", "lt", "le", "gt", "ge") else ()
        if alias == "clip":
            args = (0.2, 0.6)
        got, want = getattr(ta, alias)(*args), getattr(ta, base)(*args)
        assert np.array_equal(got.numpy(), want.numpy()), alias


def test_functional_api_takes_the_same_spellings():
    """opsnn.ops functions read ``axis`` / ``keepdims`` as torch does, and name the nearest keyword."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = opsnn.tensor(a)
    close(opsnn.ops.sum(t, axis=1, keepdims=True), a.sum(1, keepdims=True))
    close(opsnn.ops.softmax(t, axis=0), opsnn.ops.softmax(t, dim=0).numpy())
    with pytest.raises(
        ParamInvalidError,
        match=r"softmax\(\) got an unexpected keyword 'axs'; did you mean "
        r"'axis' / 'dim'\?",
    ):
        opsnn.ops.softmax(t, axs=1)
    with pytest.raises(ParamInvalidError, match=r"sum\(\) got two values for 'dim' / 'axis'"):
        opsnn.ops.sum(t, dim=0, axis=1)


def test_masked_fill_repeat_chunk_and_fills(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    t, m = opsnn.tensor(a), a > 0.3
    np.testing.assert_array_equal(t.masked_fill(m, -1.0).numpy(), np.where(m, np.float32(-1), a))
    np.testing.assert_array_equal(t.masked_fill(opsnn.tensor(m[0]), 2).numpy(), np.where(m[0], np.float32(2), a))
    np.testing.assert_array_equal(t.repeat(2, 1).numpy(), np.tile(a, (2, 1)))
    np.testing.assert_array_equal(t.repeat((1, 2, 3)).numpy(), np.tile(a, (1, 2, 3)))
    for chunks, dim, sizes in ((2, 0, [2, 1]), (3, 1, [2, 2]), (5, 1, [1, 1, 1, 1]), (1, 0, [3])):
        parts = t.chunk(chunks, dim)
        assert isinstance(parts, tuple) and [p.shape[dim] for p in parts] == sizes
        np.testing.assert_array_equal(np.concatenate([p.numpy() for p in parts], dim), a)
    assert isinstance(opsnn.ops.split(t, 3), tuple) and len(t.split(3)) == 1  # one piece: still a tuple
    u = t.clone()
    assert u.fill_(2.5) is u and (u.numpy() == 2.5).all()
    assert (u.zero_().numpy() == 0).all() and (t.numpy() == a).all()
    z = t.new_zeros((2, 2))
    assert z.dtype == np.float32 and z.shape == (2, 2) and not z.numpy().any()
    assert t.new_ones(3).numpy().tolist() == [1.0] * 3 and t.new_full((1,), 7).numpy().tolist() == [7.0]
    assert t.new_tensor([1, 2]).dtype == np.float32 and t.new_zeros(2, dtype="int64").dtype == np.int64
    assert t.new_empty((2,), requires_grad=True).requires_grad
    for bad, match in (
        (lambda: t.repeat(2), r"repeat: expected one non-negative int per dim of the 2-D tensor"),
        (lambda: t.repeat(-1, 1), r"repeat: expected one non-negative int"),
        (lambda: t.chunk(0), r"chunk: chunks must be a positive int, got 0"),
        (lambda: t.chunk(2, 2), r"chunk: dim 2 out of range for a 2-D tensor"),
        (lambda: t.clone().fill_("x"), r"fill_: value must be a number"),
        (lambda: t.clone().fill_(np.ones(2)), r"fill_: value must be a number"),
    ):
        with pytest.raises(ParamInvalidError, match=match):
            bad()


def test_masked_fill_repeat_chunk_gradients_match_torch(rng):
    torch = pytest.importorskip("torch")
    a = rng.standard_normal((3, 4)).astype(np.float32)
    m = a > 0
    x = opsnn.tensor(a, requires_grad=True)
    xt = torch.tensor(a, requires_grad=True)
    (x.masked_fill(m, 0.0) * 2).repeat(2, 1).chunk(3, 1)[0].sum().backward()
    (xt.masked_fill(torch.from_numpy(m), 0.0) * 2).repeat(2, 1).chunk(3, 1)[0].sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), xt.grad.numpy())
    for chunks, dim in ((2, 0), (3, 1), (5, 1), (2, -1)):
        got = [p.numpy() for p in opsnn.tensor(a).chunk(chunks, dim)]
        want = [p.numpy() for p in torch.from_numpy(a).chunk(chunks, dim)]
        assert len(got) == len(want) and all(np.array_equal(g, w) for g, w in zip(got, want))


def test_torch_shaped_views_selections_and_nan_reductions(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    a[1, 2] = np.nan
    a[0, 1] = 0.0
    t = opsnn.tensor(a)
    np.testing.assert_array_equal(t.t().numpy(), a.T)
    np.testing.assert_array_equal(t.mT.numpy(), a.T)
    np.testing.assert_array_equal(t.square().numpy(), a * a)
    np.testing.assert_array_equal(t.narrow(1, -3, 2).numpy(), a[:, 1:3])
    np.testing.assert_array_equal(t.select(0, -1).numpy(), a[-1])
    m = a > 0.2
    np.testing.assert_array_equal(t.masked_select(m).numpy(), a[m])
    np.testing.assert_array_equal(t.masked_select(m[0]).numpy(), a[np.broadcast_to(m[0], a.shape)])
    np.testing.assert_array_equal(t.clamp_min(0.1).numpy(), np.where(np.isnan(a), a, np.maximum(a, 0.1)))
    np.testing.assert_array_equal(t.clamp_max(0.1).numpy(), np.where(np.isnan(a), a, np.minimum(a, 0.1)))
    np.testing.assert_allclose(t.nansum(1).numpy(), np.nansum(a.astype(np.float64), 1), rtol=1e-6)
    np.testing.assert_allclose(t.nanmean().numpy(), np.nanmean(a.astype(np.float64)), rtol=1e-6)
    np.testing.assert_allclose(
        t.nanmean(0, keepdim=True).numpy(), np.nanmean(a.astype(np.float64), 0, keepdims=True), rtol=1e-6
    )
    assert int(t.count_nonzero()) == 11 and t.count_nonzero(1).numpy().tolist() == [3, 4, 4]
    assert t.view_as(np.zeros((4, 3))).shape == (4, 3) and t.reshape_as(np.zeros(12)).shape == (12,)
    assert t[0:1].expand_as(t).shape == (3, 4) and t.is_floating_point() and not opsnn.tensor([1]).is_floating_point()
    w = opsnn.tensor(a, requires_grad=True)
    assert not w.data.requires_grad and w.data.numpy() is not None and w.cpu() is w
    for call, match in (
        (lambda: opsnn.tensor(np.zeros((2, 2, 2))).t(), "t: expects a tensor of <= 2 dims"),
        (lambda: t.narrow(1, 3, 2), r"narrow: \[3, 5\) is outside dim 1 of size 4"),
        (lambda: t.select(0, 3), "select: index 3 out of range for dim 0 of size 3"),
    ):
        with pytest.raises(ParamInvalidError, match=match):
            call()
    if (torch := pytest.importorskip("torch")) is not None:
        tt = torch.from_numpy(a)
        np.testing.assert_allclose(t.nanmean(1).numpy(), tt.nanmean(1).numpy(), rtol=1e-6)
        np.testing.assert_array_equal(t.count_nonzero(0).numpy(), tt.count_nonzero(0).numpy())
