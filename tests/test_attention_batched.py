"""attention_train_batched / attention_grad_batched (kernels/cpu/attention_batched.py): attention's
training forward and backward as whole-matrix oneDNN batched products for short sequences, float32
and bfloat16 -- against the float64 oracle of tests/test_backward_attnbw.py and the op's reference,
causal and not, grouped heads, Sq != T, the 3-D layout, present K/V, NaN and Inf, and where the
kernels apply."""

import importlib

import ml_dtypes
import numpy as np
import pytest
from test_backward_attnbw import CASES as ATTNBW_CASES
from test_backward_attnbw import _backward as attnbw_backward
from test_backward_attnbw import _expected as attnbw_expected
from test_backward_attnbw import _make as attnbw_make
from test_backward_attnbw import allowed_pairs, oracle
from test_ops_attention import CASES as FWD_CASES
from test_ops_attention import build

import opsnn
from opsnn import ops
from opsnn.kernels.cpu import attention_batched as KAB
from opsnn.kernels.cpu import libraries as KL
from opsnn.ops import executor

A = importlib.import_module("opsnn.ops.defs.attention")
BF16 = np.dtype(ml_dtypes.bfloat16)
RNG = np.random.default_rng(7)
# the decisions themselves (the fixture below stands in for them)
GRAD_PRODUCTS, F32_PRODUCT = KL.attention_grad_products, KL.runtime_f32_product

# (id, B, Hq, Hkv, Sq, T, D, Dv, causal, rank): each float32 product >= RUNTIME_F32_MIN_MACS
CASES = [
    ("plain", 2, 4, 4, 64, 64, 32, 32, False, 4),
    ("causal_gqa", 1, 4, 2, 96, 96, 32, 16, True, 4),
    ("causal_sq_lt_t", 2, 2, 1, 64, 100, 32, 32, True, 4),
    ("causal_sq_gt_t", 2, 2, 2, 120, 50, 32, 32, True, 4),
    ("layout3d_causal_gqa", 2, 4, 2, 64, 64, 32, 32, True, 3),
    ("layout3d_heads_in_place", 2, 4, 4, 64, 48, 32, 16, False, 3),
]


@pytest.fixture(autouse=True)
def _f32_on_onednn(monkeypatch):
    """float32 products on oneDNN wherever its brgemm matmul exists: the strategy gives them to MKL
    where MKL is the GEMM library (as in a process that loaded numpy's MKL first), and the float32
    kernels are tested all the same."""
    if KL.platform().onednn_matmul is None:
        monkeypatch.setattr(KL, "runtime_f32_product", lambda *a, **k: None)
        monkeypatch.setattr(KL, "attention_grad_products", lambda *a, **k: None)


def _skip_unless_applies(dtype, case):
    _, B, Hq, Hkv, Sq, T, D, Dv, *_ = case
    why = (
        KL.runtime_bf16_product() if dtype == BF16 else KL.runtime_f32_product((Hq // Hkv) * Sq, min(D, Dv), T, B * Hkv)
    )
    if why is not None:
        pytest.skip(f"the batched kernels do not run here: {why}")


def _attrs(op, causal, rank, Hq, Hkv):
    a = {x.name: x.default for x in op.attrs}
    a["is_causal"] = int(causal)
    if rank == 3:
        a.update(q_num_heads=Hq, kv_num_heads=Hkv)
    return a


def to3(x):
    return x.transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[2], -1)


def to4(x, heads):
    return x.reshape(x.shape[0], x.shape[1], heads, -1).transpose(0, 2, 1, 3) if x.ndim == 3 else x


def _inputs(case, dtype):
    _, B, Hq, Hkv, Sq, T, D, Dv, causal, rank = case
    q = RNG.standard_normal((B, Hq, Sq, D)).astype(dtype)
    k = RNG.standard_normal((B, Hkv, T, D)).astype(dtype)
    v = RNG.standard_normal((B, Hkv, T, Dv)).astype(dtype)
    dy = RNG.standard_normal((B, Hq, Sq, Dv)).astype(dtype)
    return q, k, v, dy


def _train(q, k, v, attrs, algo, num_outputs=2):
    outs = executor.call(
        A.AttentionTrain, [opsnn.tensor(x) for x in (q, k, v)], attrs, algo=algo, num_outputs=num_outputs
    )
    return [o.numpy() for o in outs]


def _close(got, want, dtype, what):
    tol = 2e-2 if dtype == BF16 else 2e-4
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * scale, err_msg=what)


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_forward_matches_the_reference_with_present_kv(case, dtype):
    _skip_unless_applies(dtype, case)
    _, B, Hq, Hkv, Sq, T, D, Dv, causal, rank = case
    q, k, v, _ = _inputs(case, dtype)
    args = (q, k, v) if rank == 4 else tuple(to3(x) for x in (q, k, v))
    attrs = _attrs(A.AttentionTrain, causal, rank, Hq, Hkv)
    y, lse, pk, pv = _train(*args, attrs, "attention_train_batched", num_outputs=4)
    ry, rlse = A._reference_attention_train([*args, None], attrs)[:2]
    assert y.dtype == dtype and y.shape == args[0].shape[:-1] + (args[2].shape[-1] * (Hq // Hkv) if rank == 3 else Dv,)
    _close(y, ry.astype(np.float64), dtype, "Y")
    np.testing.assert_allclose(lse, rlse, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(pk, to4(args[1], Hkv))
    np.testing.assert_array_equal(pv, to4(args[2], Hkv))


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_backward_matches_the_float64_oracle(case, dtype):
    _skip_unless_applies(dtype, case)
    _, B, Hq, Hkv, Sq, T, D, Dv, causal, rank = case
    q, k, v, dy = _inputs(case, dtype)
    y, lse = A._reference_attention_train([q, k, v, None], _attrs(A.AttentionTrain, causal, 4, Hq, Hkv))[:2]
    args = (dy, q, k, v, y.astype(dtype))
    if rank == 3:
        args = tuple(to3(x) for x in args)
    kw = {"q_num_heads": Hq, "kv_num_heads": Hkv} if rank == 3 else {}
    got = ops.attention_backward(
        *args, None, lse.astype(np.float32), is_causal=causal, algo="attention_grad_batched", **kw
    )
    want = oracle(q, k, v, dy, allowed_pairs(Sq, T, causal)[None, None])
    for g, w, h, name in zip(got, want, (Hq, Hkv, Hkv), "QKV"):
        g = g.numpy()
        assert g.dtype == dtype
        _close(to4(g, h), w, dtype, f"d{name}")


MASKED = [c for c in ATTNBW_CASES if c[9] is not None and not ({"left", "right", "softcap"} & set(c[10]))]


@pytest.mark.parametrize("case", MASKED, ids=[c[0] for c in MASKED])
def test_masked_backward_matches_the_float64_oracle(case):
    """float32 masks of every kind test_backward_attnbw.py has (bool key padding, additive with -inf, a
    short 2-D mask, per-head additive, the 3-D layout): the mask added in the row pass, the oracle's
    answer."""
    if KL.platform().onednn_matmul is not None:
        pytest.skip(f"the batched kernels do not run here: {KL.platform().onednn_matmul}")
    q, k, v, dy, mask, attrs, rank = attnbw_make(case)
    got = attnbw_backward(q, k, v, dy, mask, attrs, rank, algo="attention_grad_batched", lse=_lse(q, k, v, mask, attrs))
    for g, w, name in zip(got, attnbw_expected(q, k, v, dy, mask, attrs), "QKV"):
        assert np.isfinite(g).all(), f"d{name} has non-finite values"
        _close(g, w, np.dtype(np.float32), f"d{name}")


def _lse(q, k, v, mask, attrs):
    """The forward's logsumexp (B, Hq, Sq) from the op's reference (4-D operands)."""
    a = {x.name: x.default for x in A.AttentionTrain.attrs}
    a.update({n: attrs[n] for n in ("is_causal", "scale", "softcap", "left_window_size", "right_window_size")})
    a["is_causal"] = int(a["is_causal"])
    return A._reference_attention_train([q, k, v, mask], a)[1].astype(np.float32)


def test_rows_a_mask_leaves_no_key_have_zero_gradients():
    """A query row whose mask allows no key (bool, and additive -inf) has P = 0: its dQ is 0 and it adds
    nothing to dK and dV, as the oracle's; every other row as the oracle's."""
    if KL.platform().onednn_matmul is not None:
        pytest.skip(f"the batched kernels do not run here: {KL.platform().onednn_matmul}")
    B, H, Sq, T, D = 1, 2, 6, 8, 4
    q, k, v, dy = (
        RNG.standard_normal(s).astype(np.float32) for s in [(B, H, Sq, D), (B, H, T, D), (B, H, T, D), (B, H, Sq, D)]
    )
    attrs = dict(is_causal=False, scale=None, softcap=0.0, left_window_size=-1, right_window_size=-1)
    boolean = RNG.random((B, H, Sq, T)) > 0.4
    boolean[0, 0, 2] = False
    boolean[0, 1, [0, 5]] = False
    additive = np.where(boolean, RNG.standard_normal((B, H, Sq, T)), -np.inf).astype(np.float32)
    for mask in (boolean, additive):
        lse = _lse(q, k, v, mask, attrs)
        dq, dk, dv = attnbw_backward(q, k, v, dy, mask, attrs, 4, algo="attention_grad_batched", lse=lse)
        assert np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()
        assert not dq[0, 0, 2].any() and not dq[0, 1, [0, 5]].any()
        for g, w in zip((dq, dk, dv), attnbw_expected(q, k, v, dy, mask, attrs)):
            _close(g, w, np.dtype(np.float32), "dead rows")


@pytest.mark.parametrize("where", ["q", "k", "mask_nan", "mask_posinf", "lse_nan"])
def test_masked_backward_on_nan_and_inf_is_the_definitions(where):
    """NaN / Inf under a mask (key padding plus an additive plane): the op's reference (the definition
    read literally, float64) gives the NaN pattern and the finite values."""
    if KL.platform().onednn_matmul is not None:
        pytest.skip(f"the batched kernels do not run here: {KL.platform().onednn_matmul}")
    B, Hq, Hkv, Sq, T, D = 2, 4, 2, 16, 16, 8
    q, k, v, dy = (
        RNG.standard_normal(s).astype(np.float32)
        for s in [(B, Hq, Sq, D), (B, Hkv, T, D), (B, Hkv, T, D), (B, Hq, Sq, D)]
    )
    mask = np.where(RNG.random((B, 1, Sq, T)) > 0.25, RNG.standard_normal((B, 1, Sq, T)), -np.inf).astype(np.float32)
    attrs = {a.name: a.default for a in A.AttentionGrad.attrs}
    attrs["is_causal"] = 1
    lse = _lse(q, k, v, mask, dict(attrs, scale=None))
    y = A._reference_attention_train(
        [q, k, v, mask], dict({a.name: a.default for a in A.AttentionTrain.attrs}, is_causal=1)
    )[0]
    y = y.astype(np.float32)
    if where == "q":
        q[1, 3, 5, 2] = np.nan
    elif where == "k":
        k[0, 1, 7, 0] = np.nan
    elif where == "mask_nan":
        mask[1, 0, 9, 3] = np.nan
    elif where == "mask_posinf":
        mask[0, 0, 4, 1] = np.inf
    else:
        lse[0, 2, 6] = np.nan
    got = [
        t.numpy() for t in ops.attention_backward(dy, q, k, v, y, mask, lse, is_causal=1, algo="attention_grad_batched")
    ]
    want = A._reference_attention_grad([dy, q, k, v, y, mask, lse], attrs)
    assert any(np.isnan(w).any() for w in want), "the case puts a NaN somewhere"
    for g, w, name in zip(got, want, "QKV"):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"d{name} NaN pattern")
        ok = np.isfinite(w)
        np.testing.assert_allclose(g[ok], w[ok], rtol=2e-4, atol=2e-4, err_msg=f"d{name}")


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("hkv", [4, 2], ids=["heads", "grouped"])
def test_views_of_any_strides_give_the_contiguous_answer(hkv, dtype):
    """The kernels read (B, H, S, D) views in place where oneDNN can (a unit stride along D or S: views
    of (B, H, D, S) arrays) and copy the others (every other element of a wider D; outputs without a
    unit stride along D through a buffer): the same values as on contiguous arrays."""
    case = ("views", 2, 4, hkv, 64, 64, 32, 32, hkv == 2, 4)
    _skip_unless_applies(dtype, case)
    q, k, v, dy = _inputs(case, dtype)

    def odd(x, i=0):  # the same values, D strided: stored (B, H, D, S), or every other of 2 D
        if i % 2:
            return np.ascontiguousarray(np.swapaxes(x, 2, 3)).swapaxes(2, 3)
        wide = np.zeros(x.shape[:3] + (2 * x.shape[3],), x.dtype)
        wide[..., ::2] = x
        return wide[..., ::2]

    def run(views):
        arrays = [odd(x, i) if views else x for i, x in enumerate((q, k, v, dy))]
        y = odd(np.zeros_like(q)) if views else np.zeros_like(q)
        lse = np.zeros(q.shape[:3], np.float32)
        ws = np.empty(KAB.workspace_bytes(2 * hkv, 4 // hkv * 64, 64, dtype == BF16), np.uint8)
        rules = (
            A._mask4(None),
            False,
            np.full(2, 64),
            np.zeros(2, np.int64),
            hkv == 2,
            -1,
            -1,
            np.float32(32**-0.5),
            np.float32(0),
        )
        KAB.forward(*arrays[:3], rules, y, lse, ws)
        grads = [odd(np.zeros_like(x), i) if views else np.zeros_like(x) for i, x in enumerate((q, k, v))]
        KAB.backward(*arrays[:3], y, arrays[3], lse, hkv == 2, 32**-0.5, *grads, ws)
        return [y, lse, *grads]

    for got, want, name in zip(run(True), run(False), ("Y", "lse", "dQ", "dK", "dV")):
        np.testing.assert_array_equal(np.ascontiguousarray(got), want, err_msg=name)


def test_views_oneDNN_refuses_run_on_copies(monkeypatch):
    """Where oneDNN refuses a strided layout (or would run its reference code), the products run on
    contiguous copies: the same values."""
    case = ("refused", 2, 4, 4, 64, 64, 32, 32, False, 3)
    _skip_unless_applies(np.dtype(np.float32), case)
    q, k, v, dy = _inputs(case, np.float32)
    args = tuple(to3(x) for x in (q, k, v))
    attrs = _attrs(A.AttentionTrain, False, 3, 4, 4)
    want = _train(*args, attrs, "attention_train_batched")
    real = KAB.KD.strided_matmul

    def contiguous_only(a, b, y):
        if not all(x.flags.c_contiguous for x in (a, b, y)):
            raise KAB.KD.OneDnnError("strided layout refused (test)")
        return real(a, b, y)

    monkeypatch.setattr(KAB.KD, "strided_matmul", contiguous_only)
    for got, w in zip(_train(*args, attrs, "attention_train_batched"), want):
        np.testing.assert_array_equal(got, w)


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=["float32", "bfloat16"])
def test_nan_and_inf_give_the_other_kernels_answers(dtype):
    """A NaN in a query row: that row's Y and logsumexp are NaN, and the gradients where the op's
    definition (whole-matrix products: a masked pair's 0 meets the NaN row, GRAD_NONFINITE) has NaN;
    an infinite key behind the causal mask: the same Y and logsumexp as the tiled training forward
    (which zeroes masked keys before the softmax)."""
    case = CASES[1]
    _skip_unless_applies(dtype, case)
    _, B, Hq, Hkv, Sq, T, D, Dv, causal, _ = case
    q, k, v, dy = _inputs(case, dtype)
    q[0, 3, 10, 5] = np.nan
    attrs = _attrs(A.AttentionTrain, causal, 4, Hq, Hkv)
    y, lse = _train(q, k, v, attrs, "attention_train_batched")
    assert np.isnan(lse[0, 3, 10]) and np.isnan(y[0, 3, 10].astype(np.float32)).all()
    assert np.isfinite(np.delete(lse, 10, axis=2)).all()
    ry, rlse = A._reference_attention_train([q, k, v, None], attrs)[:2]
    got = ops.attention_backward(
        dy, q, k, v, ry.astype(dtype), None, rlse.astype(np.float32), is_causal=causal, algo="attention_grad_batched"
    )
    gattrs = _attrs(A.AttentionGrad, causal, 4, Hq, Hkv)
    want = [
        w.astype(np.float64) for w in A._reference_attention_grad([dy, q, k, v, ry.astype(dtype), None, rlse], gattrs)
    ]
    assert np.isnan(want[1]).any() and np.isfinite(want[1]).any()
    for g, w in zip(got, want):
        g = g.numpy().astype(np.float64)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        _close(np.nan_to_num(g), np.nan_to_num(w), dtype, "finite part")
    q, k, v, _ = _inputs(case, dtype)
    k[0, 0, 50, 0] = np.inf
    other = "attention_train_tiled_bf16" if dtype == BF16 else "attention_train_flash"
    for a, b in zip(_train(q, k, v, attrs, "attention_train_batched"), _train(q, k, v, attrs, other)):
        a, b = a.astype(np.float32), b.astype(np.float32)
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
        tol = 1e-2 if dtype == BF16 else 1e-5  # bf16: each kernel rounds P once
        np.testing.assert_allclose(np.nan_to_num(a), np.nan_to_num(b), rtol=tol, atol=tol)


def test_where_the_kernels_apply(monkeypatch):
    case = CASES[0]
    _skip_unless_applies(np.dtype(np.float32), case)
    q, k, v, dy = _inputs(case, np.float32)
    y, lse = (
        t.numpy() for t in executor.call(A.AttentionTrain, [opsnn.tensor(x) for x in (q, k, v)], {}, num_outputs=2)
    )
    assert opsnn.aclnn.attention_backward.prepare(dy, q, k, v, y, None, lse).kernel_name == "attention_grad_batched"
    mask = np.zeros((64, 64), np.float32)
    assert opsnn.aclnn.attention_backward.prepare(dy, q, k, v, y, mask, lse).kernel_name == "attention_grad_batched"
    b16 = [x.astype(BF16) for x in (dy, q, k, v, y)]
    with pytest.raises(opsnn.errors.KernelNotFoundError, match="an attention mask with bfloat16 operands"):
        ops.attention_backward(*b16, mask.astype(BF16), lse, algo="attention_grad_batched")
    assert opsnn.aclnn.attention_backward.prepare(dy, q, k, v, y).kernel_name != "attention_grad_batched"  # no lse
    monkeypatch.setattr(KAB, "MAX_SCORES", 1000)
    q, k, v, dy, y = (np.concatenate([x, x[:1]]) for x in (q, k, v, dy, y))  # a new shape: planned again
    lse = np.concatenate([lse, lse[:1]])
    with pytest.raises(opsnn.errors.KernelNotFoundError, match="more than 1000 held at once"):
        ops.attention_backward(dy, q, k, v, y, None, lse, algo="attention_grad_batched")
    with pytest.raises(opsnn.errors.KernelNotFoundError, match="more than 1000 held at once"):
        _train(q, k, v, {}, "attention_train_batched")


def test_the_backward_runs_batched_wherever_onednn_has_brgemm_matmul_mkl_or_not():
    """attention's backward on oneDNN's batched products is not MKL's GEMM against oneDNN's: it replaces
    the flash tiles, so it holds where MKL is the GEMM library too; not at AVX2 (no brgemm matmul in
    oneDNN), not without oneDNN, not for products too small for it."""
    AMD, INTEL = "AuthenticAMD", "GenuineIntel"
    rows, k, n, batch = 512, 64, 256, 8  # LLaMA-tiny's: 2 query heads a KV head, 256 positions, 4 x 2 tasks
    for level in ("avx512", "avx512_bf16", "amx"):
        for vendor in (AMD, INTEL):
            p = KL.Platform.for_isa(level, vendor)
            assert GRAD_PRODUCTS(rows, k, n, batch, p=p) is None, (level, vendor)
            assert GRAD_PRODUCTS(4, 4, 4, 1, p=p) is not None  # tiny: the tiles
        assert "MKL" in F32_PRODUCT(rows, k, n, batch, p=KL.Platform.for_isa(level, INTEL))
        assert GRAD_PRODUCTS(rows, k, n, batch, p=KL.Platform.for_isa(level, INTEL, onednn=False))
    for vendor in (AMD, INTEL):
        assert "brgemm" in GRAD_PRODUCTS(rows, k, n, batch, p=KL.Platform.for_isa("avx2", vendor))


@pytest.mark.parametrize(
    "rank, Hkv, want_tiled",
    [(3, 2, True), (3, 4, False), (4, 2, False)],
    ids=["3d_grouped", "3d_one_kv_head_a_query_head", "4d_grouped"],
)
def test_a_grouped_3d_forward_runs_the_tiled_kernel(monkeypatch, rank, Hkv, want_tiled):
    """attention_gemm stacks a group's query heads by copying Q and cannot run its one-region path for
    grouped heads in the 3-D (B, S, H*D) layout (LLaMA-style training): the tiled kernel, which reads
    the head views in place, is chosen there; elsewhere attention_gemm stays first."""
    if A.MN.addresses() is None:
        pytest.skip("attention_gemm_tiled needs MKL called from numba")
    monkeypatch.setattr(KL, "runtime_f32_product", lambda *a, **k: "not here")  # no batched kernel first
    B, Hq, S, D = 2, 4, 64, 16
    shape = (lambda h: (B, S, h * D)) if rank == 3 else (lambda h: (B, h, S, D))
    q, k, v = (RNG.standard_normal(shape(h)).astype(np.float32) for h in (Hq, Hkv, Hkv))
    attrs = _attrs(A.AttentionTrain, True, rank, Hq, Hkv)
    for record in (A.AttentionTrain, A.Attention):
        at = {kk: vv for kk, vv in attrs.items() if kk in {x.name for x in record.attrs}}
        n = 2 if record is A.AttentionTrain else 1
        plan = executor.prepare(record, [opsnn.tensor(x) for x in (q, k, v)], at, num_outputs=n)
        assert plan.kernel_name.endswith("gemm_tiled") == want_tiled, (record.name, plan.kernel_name)
    got = _train(q, k, v, attrs, None)
    want = _train(q, k, v, attrs, "attention_train_gemm")  # still forced where not preferred
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    if KL.platform().onednn_matmul is None:  # the batched kernels' own choice is not touched by the rule
        monkeypatch.setattr(KL, "runtime_f32_product", lambda *a, **k: None)
        q2, k2, v2 = (np.concatenate([x, x[:1]]) for x in (q, k, v))  # a new shape: planned again
        plan = executor.prepare(A.AttentionTrain, [opsnn.tensor(x) for x in (q2, k2, v2)], attrs, num_outputs=2)
        assert plan.kernel_name == "attention_train_batched"


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", [n for n in FWD_CASES if "nonpad" not in n])
def test_inference_kernel_matches_the_reference_and_attention_gemm(name, dtype):
    """attention_batched (the Attention op) on test_ops_attention's cases: masks of every kind, GQA,
    a KV cache with its present outputs, softcap, windows, the 3-D layout."""
    why = KL.runtime_bf16_product() if dtype == BF16 else KL.runtime_f32_product(64, 64, 64)
    if why is not None:
        pytest.skip(f"the batched kernels do not run here: {why}")
    spec = FWD_CASES[name]
    ins, attrs = build(np.random.default_rng(3), spec)
    ins = [None if a is None else a.astype(dtype) if a.dtype == np.float32 else a for a in ins]
    nout = 3 if spec.get("past") else 1
    got = [t.numpy() for t in ops.run_op("Attention", ins, attrs, num_outputs=nout, algo="attention_batched")]
    ref = A._reference_attention_lse(ins, {**{a.name: a.default for a in A.Attention.attrs}, **attrs})[:nout]
    for g, r in zip(got, ref):
        assert g.dtype == dtype
        _close(g, r.astype(np.float64), dtype, name)
    if dtype == np.float32:
        want = ops.run_op("Attention", ins, attrs, num_outputs=nout, algo="attention_gemm")
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-5)
