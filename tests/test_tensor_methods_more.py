"""torch's Tensor methods added over the table (opsnn/ops/tensor_methods.py, tensor_composed.py) against torch
on the same inputs: composed methods (values, dtypes, gradients; NaN / Inf where they matter), the in-place
forms (same object, memory written, version check, refusal under grad mode), the in-place random fills
(seeded, in range, refused where torch refuses), in-place shape changes and torch's metadata methods."""

from __future__ import annotations

import numpy as np
import pytest

import opsnn
from opsnn.errors import DTypeError, ParamInvalidError

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(5)
A = RNG.standard_normal((3, 5)).astype(np.float32)
S = RNG.standard_normal((4, 4)).astype(np.float32)
X3 = RNG.standard_normal((2, 4, 6)).astype(np.float32)
V = RNG.standard_normal(5).astype(np.float32)
W = RNG.standard_normal(3).astype(np.float32)
NANS = np.array([[1.0, np.nan, 3.0, -2.0], [0.5, 2.0, -1.0, 4.0], [np.nan, np.nan, 1.0, 0.0]], np.float32)
SPECIAL = np.array([1.5, -2.5, np.nan, np.inf, -np.inf, 0.0, -0.0, 100.0], np.float32)
INTS = np.array([[3, -1, 0], [7, 2, -5]], np.int64)
IDX1 = np.array([2, 0, 4], np.int64)

# name -> (call on a tensor of module m, input arrays, differentiable)
CASES = {
    "unbind": (lambda m, a: m.stack([p * (i + 1) for i, p in enumerate(a.unbind(1))]), [A], True),
    "unflatten": (lambda m, a: a.unflatten(2, (2, -1)), [X3], True),
    "diff": (lambda m, a: a.diff(), [A], True),
    "diff_n2_dim0": (lambda m, a: a.diff(2, 0), [A], True),
    "diff_pre_append": (lambda m, a, b: a.diff(dim=1, prepend=b[:, :2], append=b[:, :1]), [A, A], True),
    "diff_bool": (lambda m, a: (a > 0).diff(), [A], False),
    "rot90": (lambda m, a: a.rot90(), [A], True),
    "rot90_k2": (lambda m, a: a.rot90(2, (1, 2)), [X3], True),
    "rot90_k3": (lambda m, a: a.rot90(-1, [0, 1]), [A], True),
    "fliplr": (lambda m, a: a.fliplr(), [A], True),
    "flipud": (lambda m, a: a.flipud(), [A], True),
    "hsplit": (lambda m, a: a.hsplit(2)[1], [X3], True),
    "hsplit_1d": (lambda m, a: a.hsplit([2])[1], [V], True),
    "vsplit": (lambda m, a: a.vsplit([1])[1], [A], True),
    "dsplit": (lambda m, a: a.dsplit(2)[0], [X3], True),
    "split_with_sizes": (lambda m, a: a.split_with_sizes([1, 3, 1], 1)[1], [A], True),
    "ravel": (lambda m, a: a.transpose(0, 1).ravel(), [A], True),
    "argwhere": (lambda m, a: a.argwhere(), [INTS], False),
    "mv": (lambda m, a, v: a.mv(v), [A, V], True),
    "ger": (lambda m, v, w: v.ger(w), [V, W], True),
    "addmv": (lambda m, w, a, v: w.addmv(a, v, beta=0.5, alpha=2.0), [W, A, V], True),
    "addr": (lambda m, a, w, v: a.addr(w, v, alpha=-1.0), [A, W, V], True),
    "aminmax": (lambda m, a: m.stack(list(a.aminmax(dim=1))), [A], True),
    "aminmax_all": (lambda m, a: m.stack(list(a.aminmax())), [A], True),
    "median": (lambda m, a: a.median(), [S], True),
    "median_dim": (lambda m, a: a.median(1).values, [A], True),
    "median_dim_indices": (lambda m, a: a.median(0, keepdim=True).indices, [A], False),
    "median_nan": (lambda m, a: a.median(1).values, [NANS], False),
    "median_nan_indices": (lambda m, a: a.median(1).indices, [NANS], False),
    "median_nan_all": (lambda m, a: a.median(), [NANS], False),
    "nanmedian": (lambda m, a: a.nanmedian(1).values, [NANS], False),
    "nanmedian_all": (lambda m, a: a.nanmedian(), [NANS], False),
    "nanmedian_grad": (lambda m, a: a.nanmedian(0).values, [A], True),
    "kthvalue": (lambda m, a: a.kthvalue(2, 1).values, [A], True),
    "kthvalue_indices": (lambda m, a: a.kthvalue(3, 0, True).indices, [A], False),
    "cummax": (lambda m, a: a.cummax(1).values, [A], True),
    "cummax_indices": (lambda m, a: a.cummax(1).indices, [NANS], False),
    "cummin": (lambda m, a: a.cummin(0).values, [A], True),
    "cummin_indices": (lambda m, a: a.cummin(1).indices, [INTS], False),
    "cummax_ties": (lambda m, a: a.cummax(1).indices, [np.array([[1, 1, 0, 1]], np.float32)], False),
    "logcumsumexp": (lambda m, a: a.logcumsumexp(1), [A], True),
    "logcumsumexp_wide": (lambda m, a: (a * 60).logcumsumexp(0), [A], True),
    "logcumsumexp_inf": (lambda m, a: a.logcumsumexp(0), [SPECIAL[[0, 1, 4, 5]]], False),
    "sgn": (lambda m, a: a.sgn(), [SPECIAL], False),
    "positive": (lambda m, a: a.positive() * 2, [A], True),
    "signbit": (lambda m, a: a.signbit(), [SPECIAL], False),
    "signbit_int": (lambda m, a: a.signbit(), [INTS], False),
    "float_power": (lambda m, a: a.abs().float_power(1.5), [A], True),
    "float_power_tensor": (lambda m, a, b: a.abs().float_power(b), [A, A], True),
    "log2": (lambda m, a: a.abs().log2(), [A], True),
    "log10": (lambda m, a: a.abs().log10(), [A], True),
    "exp2": (lambda m, a: a.exp2(), [A], True),
    "log2_special": (lambda m, a: a.log2(), [SPECIAL], False),
    "deg2rad": (lambda m, a: a.deg2rad(), [A], True),
    "rad2deg": (lambda m, a: a.rad2deg(), [A], True),
    "deg2rad_int": (lambda m, a: a.deg2rad(), [INTS], False),
    "sum_to_size": (lambda m, a: a.sum_to_size(1, 4, 1), [X3], True),
    "sum_to_size_lead": (lambda m, a: a.sum_to_size((6,)), [X3], True),
    "mH": (lambda m, a: a.mH, [X3], True),
    "adjoint": (lambda m, a: a.adjoint(), [A], True),
    "H": (lambda m, a: a.H, [A], True),
    "diagonal": (lambda m, a: a.diagonal(1), [A], True),
    "trace": (lambda m, a: a.trace(), [A], True),
    "dot": (lambda m, v: v.dot(v * 2), [V], True),
    "inner": (lambda m, a: a.inner(a), [A], True),
    "addmm": (lambda m, s, a: s[:3, :3].addmm(a, a.t(), beta=2), [S, A], True),
    "baddbmm": (lambda m, x: x[:, :, :4].baddbmm(x, x.transpose(1, 2)), [X3], True),
    "broadcast_to": (lambda m, v: v.broadcast_to((2, 5)), [V], True),
    "swapaxes": (lambda m, x: x.swapaxes(0, 2), [X3], True),
    "swapdims": (lambda m, x: x.swapdims(1, 2), [X3], True),
    "movedim": (lambda m, x: x.movedim(2, 0), [X3], True),
    "moveaxis": (lambda m, x: x.moveaxis((0, 1), (2, 0)), [X3], True),
    "take_along_dim": (lambda m, a, i: a.take_along_dim(i.reshape(1, 3), 1), [A, IDX1], True),
    "tensor_split": (lambda m, a: a.tensor_split(2, 1)[0], [A], True),
    "isfinite": (lambda m, a: a.isfinite(), [SPECIAL], False),
    "nan_to_num": (lambda m, a: a.nan_to_num(posinf=9.0), [SPECIAL], False),
    "trunc": (lambda m, a: a.trunc(), [SPECIAL], False),
    "fix": (lambda m, a: (a * 3).fix(), [A], True),
    "frac": (lambda m, a: (a * 3).frac(), [A], True),
    "diag": (lambda m, v: v.diag(1), [V], True),
    "scatter_value": (lambda m, a, i: a.scatter(1, i.reshape(1, 3).expand(3, 3), 2.5), [A, IDX1], True),
    "scatter_smaller_src": (lambda m, a, i: a.scatter(1, i.reshape(1, 3), a * 2), [A, IDX1], False),
    "scatter_reduce_add": (lambda m, a, i: a.scatter(1, i.reshape(1, 3), 2.0, reduce="add"), [A, IDX1], False),
    "index_add": (lambda m, a, i: a.index_add(1, i, a[:, :3] * 1, alpha=2), [A, IDX1], True),
    "index_add_repeat": (lambda m, a: a.index_add(0, m.tensor([0, 0, 2]), a[:, :5] * 1), [A], True),
    "index_add_nan": (lambda m, a, s: a.index_add(1, m.tensor([4, 0, 4, 1]), s), [A[:, :5], NANS[:3]], False),
    "index_copy": (lambda m, a, i: a.index_copy(1, i, a[:, 1:4] * 3), [A, IDX1], True),
    "index_fill": (lambda m, a, i: a.index_fill(1, i, -1.0), [A, IDX1], True),
    "masked_scatter": (lambda m, a: a.masked_scatter(a > 0, a * 10), [A], True),
}


def _make(m, a, grad):
    if m is opsnn:
        return opsnn.tensor(a, requires_grad=grad and a.dtype.kind == "f")
    return torch.tensor(a, requires_grad=grad and a.dtype.kind == "f")


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_torch(name):
    fn, arrays, grad = CASES[name]
    xs = [_make(opsnn, a, grad) for a in arrays]
    ts = [_make(torch, a, grad) for a in arrays]
    got, want = fn(opsnn, *xs), fn(torch, *ts)
    w = want.detach().numpy()
    np.testing.assert_allclose(got.numpy(), w, rtol=2e-5, atol=1e-5, equal_nan=True)
    assert got.numpy().dtype == w.dtype and got.shape == tuple(want.shape)
    if grad:
        seed = RNG.standard_normal(tuple(want.shape)).astype(w.dtype)
        (got * opsnn.tensor(seed)).sum().backward()
        (want * torch.from_numpy(seed)).sum().backward()
        for x, t in zip(xs, ts):
            if t.grad is not None:
                np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_top_level_forms_share_the_method():
    a = opsnn.tensor(A)
    for name in ("diff", "ravel", "fliplr", "log2", "trace", "median", "trunc", "isfinite"):
        mine = getattr(opsnn, name)(a.abs())
        np.testing.assert_array_equal(mine.numpy(), getattr(a.abs(), name)().numpy())
    assert opsnn.mv(A, V).shape == (3,)  # arrays are taken as inputs there
    vals, idx = opsnn.kthvalue(opsnn.tensor(A), 1, 0)
    np.testing.assert_array_equal(vals.numpy(), A.min(0))
    np.testing.assert_array_equal(idx.numpy(), A.argmin(0))


# -- in place ----------------------------------------------------------------------------------------------------
POS = (np.abs(A) + 0.5).astype(np.float32)
IN_PLACE = {
    "abs_": (A, ()),
    "neg_": (A, ()),
    "exp_": (A, ()),
    "log_": (POS, ()),
    "log2_": (POS, ()),
    "sqrt_": (POS, ()),
    "rsqrt_": (POS, ()),
    "sigmoid_": (A, ()),
    "tanh_": (A, ()),
    "relu_": (A, ()),
    "sin_": (A, ()),
    "cos_": (A, ()),
    "floor_": (A * 3, ()),
    "ceil_": (A * 3, ()),
    "round_": (A * 3, ()),
    "trunc_": (A * 3, ()),
    "frac_": (A * 3, ()),
    "reciprocal_": (POS, ()),
    "sign_": (A, ()),
    "square_": (A, ()),
    "erf_": (A, ()),
    "pow_": (POS, (1.5,)),
    "remainder_": (A * 4, (1.5,)),
    "fmod_": (A * 4, (1.5,)),
    "clamp_min_": (A, (0.1,)),
    "clamp_max_": (A, (0.1,)),
    "nan_to_num_": (SPECIAL, ()),
    "deg2rad_": (A, ()),
    "eq_": (np.round(A), (0.0,)),
    "lt_": (A, (0.0,)),
    "ge_": (A, (0.5,)),
    "ne_": (np.round(A), (1.0,)),
    "logical_not_": (np.round(A), ()),
    "tril_": (A, (1,)),
    "cumsum_": (A, (1,)),
    "subtract_": (A, (1.0,)),
}


@pytest.mark.parametrize("name", sorted(IN_PLACE))
def test_in_place_forms_write_self_as_torch(name):
    a, args = IN_PLACE[name]
    t = opsnn.tensor(a)
    before = t.numpy()
    out = getattr(t, name)(*args)
    want = getattr(torch.tensor(a), name)(*args).numpy()
    assert out is t and t.numpy() is before  # the same object, its own memory written
    np.testing.assert_allclose(t.numpy(), want, rtol=1e-6, atol=1e-6, equal_nan=True)


def test_in_place_index_and_scatter_forms():
    for name, args in (
        ("masked_fill_", lambda m: (m.tensor(A) > 0, 2.0)),
        ("scatter_", lambda m: (1, m.tensor(IDX1).reshape(1, 3), m.tensor(A) * 2)),
        ("scatter_add_", lambda m: (1, m.tensor(IDX1).reshape(1, 3), m.tensor(A))),
        ("index_add_", lambda m: (1, m.tensor(IDX1), m.tensor(A[:, :3]))),
        ("index_copy_", lambda m: (1, m.tensor(IDX1), m.tensor(A[:, :3]))),
        ("index_fill_", lambda m: (0, m.tensor([1]), 7.0)),
        ("masked_scatter_", lambda m: (m.tensor(A) < 0, m.tensor(A) + 100)),
    ):
        t = opsnn.tensor(A)
        assert getattr(t, name)(*args(opsnn)) is t
        want = getattr(torch.tensor(A), name)(*args(torch)).numpy()
        np.testing.assert_allclose(t.numpy(), want, rtol=1e-6, err_msg=name)


def test_in_place_comparison_writes_self_dtype_and_refusals():
    t = opsnn.tensor(INTS)
    assert t.gt_(0) is t and t.dtype == np.int64 and t.numpy().tolist() == (INTS > 0).astype(np.int64).tolist()
    with pytest.raises(DTypeError, match=r"deg2rad_: the result is float32, which cannot be written into this int64"):
        opsnn.tensor(INTS).deg2rad_()
    with pytest.raises(ParamInvalidError, match=r"add_: the result has shape \(2, 3\), which does not fit .* \(3,\)"):
        opsnn.tensor(W).add_(opsnn.tensor(np.ones((2, 3), np.float32)))
    w = opsnn.tensor(A, requires_grad=True)
    for call in (lambda: w.exp_(), lambda: w.normal_(), lambda: w.unsqueeze_(0), lambda: w.index_fill_(0, [0], 1.0)):
        with pytest.raises(ParamInvalidError, match="in place with grad mode on"):
            call()
    with opsnn.no_grad():
        w.exp_()
    np.testing.assert_allclose(w.numpy(), np.exp(A), rtol=1e-6)


def test_in_place_write_into_a_saved_tensor_makes_backward_refuse():
    from opsnn.autograd import InplaceModifiedError

    w = opsnn.tensor(A, requires_grad=True)
    for write in (lambda c: c.sin_(), lambda c: c.uniform_(), lambda c: c.fill_diagonal_(0.0), lambda c: c.t_()):
        c = opsnn.tensor(A)
        loss = (w * c).sum()
        write(c)
        with pytest.raises(InplaceModifiedError, match="modified in place"):
            loss.backward()


# -- random fills -------------------------------------------------------------------------------------------------
def test_random_fills_are_seeded_in_range_and_typed():
    opsnn.manual_seed(3)
    a = opsnn.empty((400, 50)).normal_(1.0, 0.02).numpy().copy()
    opsnn.manual_seed(3)
    b = opsnn.empty((400, 50)).normal_(mean=1.0, std=0.02).numpy()
    np.testing.assert_array_equal(a, b)
    assert abs(a.mean() - 1.0) < 1e-3 and abs(a.std() - 0.02) < 1e-3
    u = opsnn.empty((20000,)).uniform_(-0.1, 0.1).numpy()
    assert u.min() >= -0.1 and u.max() < 0.1 and abs(u.mean()) < 5e-3
    u = opsnn.empty((100,)).uniform_(**{"from": 2, "to": 3}).numpy()
    assert u.min() >= 2 and u.max() < 3
    e = opsnn.empty((20000,), "float64").exponential_(4.0).numpy()
    assert e.dtype == np.float64 and e.min() >= 0 and abs(e.mean() - 0.25) < 0.02
    bern = opsnn.zeros((20000,), "int32").bernoulli_(0.3).numpy()
    assert bern.dtype == np.int32 and set(np.unique(bern)) <= {0, 1} and abs(bern.mean() - 0.3) < 0.02
    p = opsnn.tensor(np.array([0.0, 1.0], np.float32))
    assert opsnn.empty((3, 2)).bernoulli_(p).numpy().tolist() == [[0.0, 1.0]] * 3
    r = opsnn.empty((2000,), "int64").random_(3, 7).numpy()
    assert set(np.unique(r)) == {3, 4, 5, 6}
    r = opsnn.empty((2000,), "float32").random_(5).numpy()
    assert set(np.unique(r)) == {0, 1, 2, 3, 4}
    assert opsnn.empty((50,), "uint8").random_().numpy().max() <= 255
    assert set(np.unique(opsnn.empty((200,), "bool").random_().numpy())) == {False, True}
    w = opsnn.nn.Linear(4, 3)
    assert w.weight.data.normal_(0, 0.02) is not None and w.bias.data.zero_() is not None
    assert abs(float(w.weight.numpy().std())) < 0.1 and not w.bias.numpy().any()
    with pytest.raises(DTypeError, match="normal_: expects a floating tensor, got int64"):
        opsnn.zeros((2,), "int64").normal_()
    with pytest.raises(ParamInvalidError, match="uniform_: from must be <= to"):
        opsnn.empty((2,)).uniform_(1, 0)
    with pytest.raises(ParamInvalidError, match="bernoulli_: p must lie in"):
        opsnn.empty((2,)).bernoulli_(1.5)
    with pytest.raises(ParamInvalidError, match="exponential_: lambd must be > 0"):
        opsnn.empty((2,)).exponential_(0)
    with pytest.raises(ParamInvalidError, match="random_: from must be below to"):
        opsnn.empty((2,)).random_(3, 3)
    with pytest.raises(ParamInvalidError, match="normal_: std must be >= 0"):
        opsnn.empty((2,)).normal_(0, -1)
    with pytest.raises(ParamInvalidError, match="unexpected keyword 'sd'"):
        opsnn.empty((2,)).normal_(sd=1)


def test_random_fill_is_refused_while_tracing():
    from opsnn.graph.tracing import TraceError

    def f(x):
        return x * x.clone().normal_()

    with pytest.raises(TraceError, match="normal_: random values drawn while a function is traced"):
        opsnn.compile(f)(np.ones(3, np.float32))


def test_fill_diagonal_as_torch():
    for shape, wrap in (((3, 3), False), ((7, 3), True), ((7, 3), False), ((3, 5), False), ((3, 3, 3), False)):
        t = opsnn.zeros(shape)
        t.fill_diagonal_(2.0, wrap=wrap)
        want = torch.zeros(shape).fill_diagonal_(2.0, wrap=wrap).numpy()
        np.testing.assert_array_equal(t.numpy(), want, err_msg=str((shape, wrap)))
    with pytest.raises(ParamInvalidError, match="fill_diagonal_: expects a 2-D tensor"):
        opsnn.zeros((2, 3, 4)).fill_diagonal_(1.0)


# -- shape changes in place, metadata -----------------------------------------------------------------------------
def test_shape_changes_in_place():
    for name, args in (
        ("unsqueeze_", (1,)),
        ("squeeze_", ()),
        ("t_", ()),
        ("transpose_", (0, 1)),
        ("swapaxes_", (1, 0)),
        ("swapdims_", (0, 1)),
    ):
        a = A[:, None, :] if name == "squeeze_" else A
        t, tt = opsnn.tensor(a), torch.tensor(a)
        assert getattr(t, name)(*args) is t
        getattr(tt, name)(*args)
        assert t.shape == tuple(tt.shape) and t.stride() == tt.stride()
        np.testing.assert_array_equal(t.numpy(), tt.numpy())
    with pytest.raises(ParamInvalidError, match="t_: a tensor's shape changed in place is not recorded"):
        opsnn.compile(lambda x: x.t_())(np.ones((2, 3), np.float32))


def test_metadata_as_torch():
    for a in (A, INTS, np.zeros(3, np.uint8), np.zeros(2, np.bool_), np.zeros(2, np.float16)):
        t, tt = opsnn.tensor(a), torch.tensor(a)
        assert t.is_complex() == tt.is_complex() and t.is_signed() == tt.is_signed(), a.dtype
        assert t.itemsize == tt.itemsize and t.get_device() == tt.get_device() == -1
        assert t.is_cpu and not t.is_cuda and not t.is_inference()
    x, tx = opsnn.tensor(X3), torch.tensor(X3)
    for view in (lambda v: v, lambda v: v.transpose(0, 2), lambda v: v[:, 1:3, ::2], lambda v: v[:1].expand(3, 4, 6)):
        a, b = view(x), view(tx)
        assert a.stride() == b.stride() and a.stride(-1) == b.stride(-1)
        assert a.storage_offset() == b.storage_offset()
    assert x[1].data_ptr() == x.data_ptr() + x.stride(0) * 4
    with pytest.raises(ParamInvalidError, match="H: expects a 0-D or 2-D tensor"):
        _ = x.H


# -- bad arguments ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda a: a.unflatten(1, (2, 2)), ParamInvalidError, "unflatten: sizes"),
        (lambda a: a.diff(-1), ParamInvalidError, "diff: n must be an int >= 0"),
        (lambda a: a.rot90(1, (0, 0)), ParamInvalidError, "rot90: the two dims must differ"),
        (lambda a: a.hsplit(2), ParamInvalidError, "hsplit: 2 sections do not divide"),
        (lambda a: a[0].vsplit(1), ParamInvalidError, "vsplit: expects a tensor of >= 2 dims"),
        (lambda a: a.split_with_sizes([1, 1]), ParamInvalidError, r"split_with_sizes: sizes \[1, 1\] sum to 2"),
        (lambda a: a.mv(a), ParamInvalidError, "mv: expects 2-D and 1-D operands"),
        (lambda a: a.kthvalue(9, 1), ParamInvalidError, "kthvalue: k 9 is beyond"),
        (lambda a: a[:0].median(), ParamInvalidError, "median: a tensor of shape"),
        (lambda a: a.sum_to_size(2, 5), ParamInvalidError, "sum_to_size: size"),
        (lambda a: a.long().logcumsumexp(0), DTypeError, "logcumsumexp: expects a floating tensor"),
        (lambda a: a.index_add(1, opsnn.tensor([0]), a), ParamInvalidError, "index_add: expects a 1-D index"),
        (lambda a: a.index_fill(1, opsnn.tensor([0.5]), 1.0), DTypeError, "index_fill: index must be an integer"),
        (lambda a: a.scatter(1, opsnn.tensor(IDX1).reshape(1, 3)), ParamInvalidError, "scatter: give src"),
        (lambda a: a.scatter(1, opsnn.tensor(IDX1).reshape(1, 3), a, reduce="max"), ParamInvalidError, "reduce"),
        (lambda a: a.masked_scatter(a > 0, a[:1, :1]), ParamInvalidError, "masked_scatter: the mask selects"),
        (lambda a: a.cummax(3), ParamInvalidError, "cummax: dim 3 out of range"),
    ],
)
def test_bad_arguments_are_typed(call, error, match):
    with pytest.raises(error, match=match):
        call(opsnn.tensor(A))
