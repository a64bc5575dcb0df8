"""Native bfloat16 kernels of recorded attention: AttentionTrain (attention_train_tiled_bf16) and
AttentionGrad (attention_grad_flash_bf16) read the bfloat16 tensors block by block instead of
running the float32 kernels through the fp32 adapter.

Each is compared with the float32 kernel run on the same bfloat16 values widened (the adapter's
result, what ran before) within one bfloat16 ulp, and with a float64 oracle (the ops' references on
the bfloat16 values: one bfloat16 rounding of the result, plus a stated tolerance for the float32
accumulation); causal, GQA, per-batch and per-head additive masks (one shorter than the keys),
softcap, the 3-D layout, query and key counts that are not multiples of the tiles, the
backward's split tasks, NaN/Inf inputs; a recorded bf16 attention's forward and backward run the
new kernels in a profile."""

import numba
import numpy as np
import pytest

import opsnn
from opsnn import dtypes as _dt
from opsnn import ops
from opsnn.kernels.cpu import mkl_nb as MN
from opsnn.ops import executor
from opsnn.ops.registry import get_op

BF16 = _dt.bfloat16
TRAIN = get_op("AttentionTrain", "opsnn")
GRAD = get_op("AttentionGrad", "opsnn")


def _f32_algos():
    """The float32 kernels the adapter ran, the same tile math: MKL products where loaded now (asked
    at run time, as the bf16 plans ask, not at collection)."""
    if MN.addresses() is not None:
        return "attention_train_gemm_tiled", "attention_grad_flash_mkl"
    return "attention_train_flash", "attention_grad_flash"


@pytest.fixture(autouse=True)
def _two_threads():
    """Two threads where the machine has them: the parallel plans and the backward's splits run."""
    before = opsnn.get_num_threads()
    opsnn.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    yield
    opsnn.set_num_threads(before)


def _ulp(v: np.ndarray) -> np.ndarray:
    """One bfloat16 ulp at each value (float64), for |v| >= the smallest normal."""
    a = np.maximum(np.abs(v.astype(np.float64)), 2.0**-126)
    return 2.0 ** (np.floor(np.log2(a)) - 7)


def _within_ulp(got, want):
    """bfloat16 ``got`` within one bfloat16 ulp of bfloat16 ``want`` plus 1e-6 of the largest value
    (float32 sums in another order: near zero a cancellation leaves fewer good bits than one ulp
    needs), NaN where it is NaN, Inf alike."""
    g, w = np.asarray(got).astype(np.float64), np.asarray(want).astype(np.float64)
    assert np.array_equal(np.isnan(g), np.isnan(w))
    fin = np.isfinite(w)
    assert np.array_equal(g[~fin & ~np.isnan(w)], w[~fin & ~np.isnan(w)])
    if fin.any():
        err, tol = np.abs(g[fin] - w[fin]), _ulp(w[fin]) + 1e-6 * np.abs(w[fin]).max()
        assert np.all(err <= tol), (err - tol).max()


def _case(rng, B, Hq, Hkv, Sq, T, D, mask_shape, rank=4):
    q = (rng.standard_normal((B, Hq, Sq, D)) * 1.5).astype(BF16)
    k = (rng.standard_normal((B, Hkv, T, D)) * 1.5).astype(BF16)
    v = rng.standard_normal((B, Hkv, T, D)).astype(BF16)
    mask = None
    if mask_shape is not None:
        mask = rng.standard_normal(mask_shape).astype(np.float32)
        mask[rng.random(mask_shape) < 0.2] = -np.inf
    attrs = {}
    if rank == 3:
        q, k, v = (x.transpose(0, 2, 1, 3).reshape(B, x.shape[2], -1).copy() for x in (q, k, v))
        attrs = {"q_num_heads": Hq, "kv_num_heads": Hkv}
    return [q, k, v, mask], attrs


CASES = {
    # B, Hq, Hkv, Sq, T, D, mask shape, rank, attrs
    "plain": (2, 2, 2, 9, 12, 8, None, 4, {}),
    "causal_gqa_serial": (1, 4, 2, 37, 37, 8, None, 4, {"is_causal": 1}),
    "gqa_head_mask": (2, 4, 2, 70, 67, 16, (1, 4, 70, 67), 4, {}),
    "short_batch_mask_causal": (2, 2, 1, 45, 45, 16, (2, 1, 45, 40), 4, {"is_causal": 1}),
    "softcap_scale": (2, 2, 2, 33, 70, 16, None, 4, {"softcap": 2.5, "scale": 0.3}),
    "layout3d_mask": (2, 2, 2, 20, 17, 8, (20, 17), 3, {}),
    "splits": (1, 2, 1, 130, 67, 16, (1, 1, 1, 67), 4, {"is_causal": 1}),
}


def _run_train(ins, attrs, algo="attention_train_tiled_bf16"):  # the tiled kernels, not the batched ones
    ex = executor.prepare(TRAIN, ins, attrs, num_outputs=2, algo=algo)
    y, lse = ex.run()
    return ex, y.numpy(), lse.numpy()


def _run_grad(ins, attrs, algo="attention_grad_flash_bf16"):
    ex = executor.prepare(GRAD, ins, attrs, algo=algo)
    return ex, [t.numpy() for t in ex.run()]


@pytest.mark.parametrize("name", list(CASES))
def test_bf16_attention_against_float32_kernels_and_float64(name):
    B, Hq, Hkv, Sq, T, D, mshape, rank, extra = CASES[name]
    rng = np.random.default_rng(len(name) * 7 + Sq)
    ins, attrs = _case(rng, B, Hq, Hkv, Sq, T, D, mshape, rank)
    attrs.update(extra)
    ex, y, lse = _run_train(ins, attrs, algo="attention_train_tiled_bf16")  # not the batched one, where it applies
    assert ex.kernel_name == "attention_train_tiled_bf16" and not ex.adapter
    assert y.dtype == BF16 and lse.dtype == np.float32
    f32, y32, lse32 = _run_train(ins, attrs, algo=_f32_algos()[0])
    assert f32.adapter
    _within_ulp(y, y32)
    np.testing.assert_allclose(lse, lse32, rtol=1e-5, atol=1e-5)
    # float64 oracle on the bfloat16 values: one rounding of Y, float32 sums of up to T terms
    ins64 = [None if x is None else x.astype(np.float64) for x in ins]
    y64, lse64 = TRAIN.reference(ins64, {**TRAIN_DEFAULTS, **attrs})[:2]
    err = np.abs(y.astype(np.float64) - y64)
    assert np.all(err <= _ulp(y64) + 1e-5 * np.abs(y64).max()), err.max()
    np.testing.assert_allclose(lse, lse64, rtol=2e-6, atol=2e-5)

    dy = rng.standard_normal(y.shape).astype(BF16)
    gins = [dy, *ins[:3], y, ins[3], lse]
    gx, got = _run_grad(gins, attrs, algo="attention_grad_flash_bf16")
    assert gx.kernel_name == "attention_grad_flash_bf16" and not gx.adapter
    g32, want = _run_grad(gins, attrs, algo=_f32_algos()[1])
    assert g32.adapter
    for a, w in zip(got, want):
        assert a.dtype == BF16
        _within_ulp(a, w)
    # float64: the same definition read literally; float32 tiles cancel in dP - rowsum(dY Y)
    g64 = GRAD.reference([None if x is None else x.astype(np.float64) for x in gins], {**GRAD_DEFAULTS, **attrs})
    for a, w in zip(got, g64):
        err = np.abs(a.astype(np.float64) - w)
        assert np.all(err <= _ulp(w) + 2e-4 * np.abs(w).max()), err.max()


TRAIN_DEFAULTS = {a.name: a.default for a in TRAIN.attrs}
GRAD_DEFAULTS = {a.name: a.default for a in GRAD.attrs}


def test_bf16_attention_nonfinite_as_the_float32_kernels():
    rng = np.random.default_rng(77)
    ins, attrs = _case(rng, 2, 4, 2, 21, 19, 8, (2, 1, 21, 19))
    q, k, v, mask = ins
    q[0, 1, 3, 2] = np.nan  # one NaN row (batch 0, head 1)
    k[1, 0, 5, 0] = np.inf  # an Inf key: NaN/Inf scores in batch 1's heads 0, 1
    v[1, 1, 7, 3] = -np.inf
    mask[0, 0, 4, :] = -np.inf  # a row no key may attend: zeros
    attrs["is_causal"] = 1
    ex, y, lse = _run_train(ins, attrs)
    assert ex.kernel_name == "attention_train_tiled_bf16"
    _, y32, lse32 = _run_train(ins, attrs, algo=_f32_algos()[0])
    _within_ulp(y, y32)
    assert np.isnan(y).any() and np.array_equal(np.isnan(lse), np.isnan(lse32))
    assert np.array_equal(y[0, :, 4].astype(np.float32), np.zeros_like(y32[0, :, 4], np.float32))
    dy = rng.standard_normal(y.shape).astype(BF16)
    dy[1, 3, 2, 1] = np.inf
    for lse_in in (lse, None):
        gins = [dy, q, k, v, y, mask, lse_in]
        gx, got = _run_grad(gins, attrs)
        assert gx.kernel_name == "attention_grad_flash_bf16"
        _, want = _run_grad(gins, attrs, algo=_f32_algos()[1])
        for a, w in zip(got, want):
            _within_ulp(a, w)
        assert any(np.isnan(a.astype(np.float32)).any() for a in got)


def test_recorded_bf16_attention_runs_the_native_kernels():
    from opsnn.runtime import hooks

    rng = np.random.default_rng(3)
    B, H, S, D = 2, 2, 24, 16
    x = [rng.standard_normal((B, H, S, D)).astype(np.float32) for _ in range(3)]
    q, k, v = (opsnn.tensor(a).requires_grad_() for a in x)
    adapted = []
    unsubscribe = hooks.subscribe(
        "alloc", lambda ev: adapted.append(ev["tag"]) if "adapter" in (ev["tag"] or "") else None
    )
    try:
        with opsnn.profiler.profile() as prof:
            with opsnn.autocast("bfloat16"):
                y = ops.scaled_dot_product_attention(q, k, v, is_causal=True)
            assert y.dtype == BF16 and y.grad_fn.name == "AttentionTrain"
            ops.sum(ops.mul(y, y)).backward()
    finally:
        unsubscribe()
    kernels = {(e.op, e.kernel) for e in prof.kernels if e.op.startswith("Attention")}
    assert {op for op, _ in kernels} == {"AttentionTrain", "AttentionGrad"}
    assert kernels <= {
        ("AttentionTrain", "attention_train_tiled_bf16"),
        ("AttentionTrain", "attention_train_batched"),  # short sequences, where oneDNN has native bf16
        ("AttentionGrad", "attention_grad_flash_bf16"),
        ("AttentionGrad", "attention_grad_batched"),
    }, kernels
    assert not [t for t in adapted if t.startswith("Attention")], adapted
    for t in (q, k, v):
        assert t.grad is not None and t.grad.dtype == np.float32 and np.isfinite(t.grad.numpy()).all()


def test_bf16_attention_without_mkl_runs_the_product_loops(monkeypatch):
    monkeypatch.setattr(MN, "addresses", lambda: None)  # the plans' choice: vectorized loops, no MKL
    rng = np.random.default_rng(19)
    ins, attrs = _case(rng, 2, 4, 2, 23, 29, 8, (1, 4, 23, 29))
    attrs["is_causal"] = 1
    ex, y, lse = _run_train(ins, attrs)
    assert ex.kernel_name == "attention_train_tiled_bf16" and not ex.plan["fns"].any()
    _, y32, lse32 = _run_train(ins, attrs, algo="attention_train_flash")  # another summation order
    _within_ulp(y, y32)
    np.testing.assert_allclose(lse, lse32, rtol=1e-5, atol=1e-5)
    dy = rng.standard_normal(y.shape).astype(BF16)
    gins = [dy, *ins[:3], y, ins[3], lse]
    gx, got = _run_grad(gins, attrs)
    assert gx.kernel_name == "attention_grad_flash_bf16" and not gx.plan["fns"].any()
    _, want = _run_grad(gins, attrs, algo="attention_grad_flash")
    for a, w in zip(got, want):
        _within_ulp(a, w)


def test_bf16_attention_reads_strided_views_as_they_are():
    rng = np.random.default_rng(23)
    ins, attrs = _case(rng, 2, 4, 2, 19, 21, 8, (2, 1, 19, 21))
    # (B, S, H, D) storage seen as (B, H, S, D): the heads of a projection, not copied by the executor
    views = [np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3) for x in ins[:3]]
    assert not any(x.flags.c_contiguous for x in views)
    ex, y, lse = _run_train(views + [ins[3]], attrs)
    assert ex.kernel_name == "attention_train_tiled_bf16"
    _, y_c, lse_c = _run_train(ins, attrs)
    assert np.array_equal(y.view(np.uint16), y_c.view(np.uint16)) and np.array_equal(lse, lse_c)
    dy = rng.standard_normal(y.shape).astype(BF16)
    dyv = np.ascontiguousarray(dy.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    _, got = _run_grad([dyv, *views, y, ins[3], lse], attrs)
    _, want = _run_grad([dy, *ins[:3], y, ins[3], lse], attrs)
    for a, w in zip(got, want):
        assert np.array_equal(a.view(np.uint16), w.view(np.uint16))
