"""Train-mode dropout as a graph op (``opsnn::NativeDropout`` + ``NativeDropoutBackward``) and in
compiled training steps.

Oracles: the mask is a counter-based hash of (seed, element index); the numpy reference
(``kernels.cpu.dropout.keep_mask``, uint64 array arithmetic) must reproduce the numba kernels'
mask exactly, and values are checked against ``x * keep / (1 - p)`` in float64 (float32 outputs
within 1 ulp: rtol 1.2e-7; bfloat16 outputs within one bf16 rounding: rtol 2**-8). The backward op
is checked against the ONNX Dropout rule's composition (Cast, Mul, Mul) and against torch's
``native_dropout_backward`` where torch is importable. Compiled and eager steps draw their seeds
from one generator (``opsnn.manual_seed``), so their losses agree to the tolerances of
tests/test_compiled_training.py (rtol 1e-5).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import opsnn
from opsnn import nn, ops, optim
from opsnn.errors import OpsnnError
from opsnn.graph.tracing import TraceError
from opsnn.kernels.cpu import dropout as KD

RNG = np.random.default_rng(97)
BF16 = np.dtype(ml_dtypes.bfloat16)


def _oracle(x, seed, p):
    keep = KD.keep_mask(np.int64(seed), x.size, KD.threshold(p)).reshape(x.shape)
    return x.astype(np.float64) * np.where(keep, 1.0 / (1.0 - p), 0.0), keep


# shapes: odd, empty, past the forward's parallel threshold only, and past both (the parallel kernels)
@pytest.mark.parametrize("shape", [(7,), (3, 5, 11), (0, 4), (257, 1024), (1025, 1024)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, BF16], ids=["f32", "f64", "bf16"])
def test_native_dropout_matches_the_hash_oracle(shape, dtype):
    p, seed = 0.3, -1234567890123  # a negative seed wraps to its unsigned bits
    x = RNG.standard_normal(shape).astype(dtype)
    y, keep = ops.native_dropout(x, p, np.int64(seed))
    want, want_keep = _oracle(x, seed, p)
    assert y.dtype == dtype and keep.dtype == np.bool_ and y.shape == x.shape
    np.testing.assert_array_equal(keep.numpy(), want_keep)
    rtol = 2.0**-8 if dtype == BF16 else 1.2e-7 if dtype == np.float32 else 1e-15
    np.testing.assert_allclose(y.numpy().astype(np.float64), want, rtol=rtol, atol=0)
    if dtype == BF16:  # natively, no fp32 adapter: float32 scale, one round-to-nearest-even
        assert not opsnn.aclnn.native_dropout.prepare(x, p, np.int64(seed)).adapter
        with np.errstate(invalid="ignore"):
            exact = (x.astype(np.float32) * np.where(want_keep, np.float32(1 / (1 - p)), np.float32(0))).astype(BF16)
        np.testing.assert_array_equal(y.numpy().view(np.uint16), exact.view(np.uint16))
        g = ops.native_dropout_backward(x, keep, p).numpy()
        np.testing.assert_array_equal(g.view(np.uint16), exact.view(np.uint16))
    if x.size > 10_000:  # binomial(n, 0.7): 6 standard deviations
        assert x.size >= KD.FORWARD_PARALLEL_MIN
        sd = np.sqrt(0.21 / x.size)
        assert abs(keep.numpy().mean() - 0.7) < 6 * sd


def test_masks_depend_on_the_seed_and_nan_inf_follow_x_times_mask():
    x = np.ones((64, 64), np.float32)
    a = ops.native_dropout(x, 0.5, np.int64(1))[1].numpy()
    b = ops.native_dropout(x, 0.5, np.int64(2))[1].numpy()
    assert (a != b).mean() > 0.3  # independent masks differ in about half the elements
    np.testing.assert_array_equal(ops.native_dropout(x, 0.5, np.int64(1))[1].numpy(), a)
    x = np.array([np.nan, np.inf, -np.inf, 1.0] * 16, np.float32)
    y, keep = (t.numpy() for t in ops.native_dropout(x, 0.5, np.int64(3)))
    with np.errstate(invalid="ignore"):
        want = x * np.where(keep, np.float32(2), np.float32(0))  # dropped inf -> nan, as x * mask * scale
    np.testing.assert_array_equal(y, want)
    assert keep.any() and not keep.all()


def test_native_dropout_gradient_and_backward_op():
    x = opsnn.tensor(RNG.standard_normal((9, 13)).astype(np.float32)).requires_grad_()
    g = RNG.standard_normal((9, 13)).astype(np.float32)
    y, keep = ops.native_dropout(x, 0.25, np.int64(11))
    ops.sum(ops.mul(y, opsnn.tensor(g))).backward()
    want = g.astype(np.float64) * keep.numpy() / 0.75
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1.2e-7, atol=0)
    # the ONNX Dropout rule's composition on the same mask: cast, scale, multiply
    composed = ops.mul(opsnn.tensor(g), ops.mul(ops.cast(keep, np.float32), opsnn.tensor(np.float32(1 / 0.75))))
    np.testing.assert_allclose(x.grad.numpy(), composed.numpy(), rtol=1.2e-7, atol=0)
    gb = ops.native_dropout_backward(g.astype(BF16), keep, 0.25).numpy()
    np.testing.assert_allclose(
        gb.astype(np.float64), g.astype(BF16).astype(np.float64) * keep.numpy() / 0.75, rtol=2**-8
    )


def test_backward_matches_torch():
    torch = pytest.importorskip("torch")
    g = RNG.standard_normal((4, 33)).astype(np.float32)
    y, keep = ops.native_dropout(np.ones((4, 33), np.float32), 0.4, np.int64(5))
    want = torch.ops.aten.native_dropout_backward(torch.from_numpy(g), torch.from_numpy(keep.numpy()), 1 / 0.6)
    np.testing.assert_allclose(ops.native_dropout_backward(g, keep, 0.4).numpy(), want.numpy(), rtol=1.2e-7, atol=0)


def test_bad_input_is_a_typed_error():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(OpsnnError, match=r"NativeDropout: ratio must be in \[0, 1\), got 1.0"):
        ops.native_dropout(x, 1.0, np.int64(0))
    with pytest.raises(OpsnnError, match="NativeDropout: seed must be a scalar"):
        ops.native_dropout(x, 0.5, np.zeros(2, np.int64))
    with pytest.raises(OpsnnError, match="NativeDropout"):
        ops.native_dropout(x, 0.5, opsnn.tensor(np.float32(1)))  # a seed tensor must be int64
    with pytest.raises(OpsnnError, match=r"NativeDropoutBackward: mask shape \(3, 2\) differs"):
        ops.native_dropout_backward(x, np.ones((3, 2), bool), 0.5)
    with pytest.raises(OpsnnError, match="NativeDropoutBackward"):
        ops.native_dropout_backward(x, np.ones((2, 3), np.float32), 0.5)


def test_dropout_module_eval_and_p0_are_identity_and_a_plain_trace_is_refused():
    x = opsnn.tensor(RNG.standard_normal((4, 6)).astype(np.float32))
    assert nn.Dropout(0.5)(x) is x  # eval by default
    assert nn.Dropout(0.0).train()(x) is x
    drop = nn.Dropout(0.5).train()
    with pytest.raises(TraceError, match=r"Dropout\(p=0.5\): .*eval mode"):
        opsnn.compile(lambda x: drop(x), [x])


# -- compiled training ------------------------------------------------------------------------------
def _bert_step(p=0.1, lr=1e-3, eval_mode=False):
    """A BERT-tiny-like classifier (2 layers, hidden 128, hidden dropout ``p``) and its AdamW step."""
    with nn.init.seeded(0):
        model = opsnn.models.bert("tiny", vocab_size=50, max_position_embeddings=16, seed=0)
        head = nn.Linear(128, 3)
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = p
    model.train(not eval_mode)
    opt = optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=lr)

    def train_step(ids, y):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(head(model(ids)[1]), y)
        loss.backward()
        opt.step()
        return loss

    return model, train_step


IDS = RNG.integers(1, 50, (2, 12))
LABELS = RNG.integers(0, 3, 2)


def _losses(compiled, seed=5, steps=4, **kw):
    model, train_step = _bert_step(**kw)
    opsnn.manual_seed(seed)
    step = opsnn.compile(train_step) if compiled else train_step
    losses = [float(step(opsnn.tensor(IDS), opsnn.tensor(LABELS)).item()) for _ in range(steps)]
    return np.array(losses), step, model


def test_compiled_bert_step_with_dropout_draws_fresh_masks_like_eager():
    closs, step, cmodel = _losses(True)
    assert step.num_compiles == 1 and step.compiled_graph.mode == "compiled", step.compiled_graph.mode_reason
    kinds = [n.op_type for n in step.graph().nodes]
    assert kinds.count("NativeDropout") == 5 and kinds.count("NativeDropoutBackward") == 5
    assert sum(name.startswith("dropout_seed") for name in step._current().host_inputs) == 5
    assert np.isfinite(closs).all()
    eloss, _, emodel = _losses(False)
    np.testing.assert_allclose(closs, eloss, rtol=1e-5, atol=1e-7)  # the same masks, step by step
    for (name, a), b in zip(cmodel.named_parameters(), emodel.parameters()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    again, _, _ = _losses(True)
    np.testing.assert_array_equal(again, closs)  # the same seed, the same run
    other, _, _ = _losses(True, seed=6)
    assert not np.array_equal(other, closs)


def test_compiled_masks_differ_across_steps():
    """With lr 0 the parameters stay put, so only the masks change the loss from step to step."""
    closs, _, _ = _losses(True, lr=0.0, steps=4)
    assert len(set(closs.tolist())) == 4
    clean, _, _ = _losses(True, lr=0.0, steps=2, eval_mode=True)
    assert clean[0] == clean[1]


@pytest.mark.parametrize("variant", ["p0", "eval"])
def test_compiled_p0_and_eval_equal_no_dropout(variant):
    kw = {"p": 0.0} if variant == "p0" else {"eval_mode": True}
    got, step, _ = _losses(True, steps=3, **kw)
    assert "NativeDropout" not in [n.op_type for n in step.graph().nodes]
    assert not step._current().host_inputs.keys() & {"dropout_seed"}
    want, _, _ = _losses(False, steps=3, p=0.0, eval_mode=variant == "eval")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


# -- bfloat16 products on runtime operands (eager autocast, backward products) -----------------------------
def _bf16(shape):
    return RNG.standard_normal(shape).astype(BF16)


def _f64(a):
    return np.asarray(a).astype(np.float64)


def _close_bf16(y, ref):
    """bfloat16 outputs of float32-accumulated products: within one bf16 rounding (2**-8 relative) of the
    float64 product of the same bf16 operands, plus float32 accumulation error (atol 1e-4 at K <= 70)."""
    assert y.dtype == BF16
    np.testing.assert_allclose(_f64(y), ref, rtol=2.0**-8, atol=1e-4)


def _expect_runtime(kernel_name, expected):
    from opsnn.kernels.cpu import libraries as KL

    native = KL.runtime_bf16_product() is None
    assert (kernel_name == expected) == native, (kernel_name, KL.runtime_bf16_product())


@pytest.mark.parametrize(
    "sa, sb",
    [
        ((5, 7), (7, 3)),
        ((2, 3, 5, 7), (7, 4)),
        ((2, 3, 5, 7), (2, 3, 7, 4)),
        ((3, 1, 7), (3, 7, 33)),
        ((2, 5, 7), (1, 7, 4)),
    ],
)
def test_bf16_matmul_on_runtime_operands(sa, sb):
    a, b = _bf16(sa), _bf16(sb)
    ex = opsnn.aclnn.matmul.prepare(a, b)
    if len(sb) > 2 and sa[:-2] != sb[:-2]:  # broadcast batch dims: another kernel, the same result
        assert ex.kernel_name != "matmul_onednn_runtime"
    else:
        _expect_runtime(ex.kernel_name, "matmul_onednn_runtime")
    _close_bf16(ops.matmul(a, b).numpy(), np.matmul(_f64(a), _f64(b)))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(9, 70), (2, 3, 17)])
def test_bf16_linear_on_runtime_operands(shape, bias):
    x, w = _bf16(shape), _bf16((13, shape[-1]))
    b = _bf16((13,)) if bias else None
    _expect_runtime(opsnn.aclnn.linear.prepare(x, w, b).kernel_name, "linear_onednn_runtime")
    ref = _f64(x) @ _f64(w).T + (_f64(b) if bias else 0)
    _close_bf16(ops.linear(x, w, b).numpy(), ref)


@pytest.mark.parametrize("ta, tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_bf16_gemm_on_runtime_operands_reads_transposes_in_place(ta, tb):
    m, k, n = 6, 11, 5
    a = _bf16((k, m) if ta else (m, k))
    b = _bf16((n, k) if tb else (k, n))
    c = _bf16((n,))
    ex = opsnn.aclnn.gemm.prepare(a, b, c, trans_a=bool(ta), trans_b=bool(tb))
    _expect_runtime(ex.kernel_name, "gemm_onednn_runtime")
    ref = (_f64(a).T if ta else _f64(a)) @ (_f64(b).T if tb else _f64(b)) + _f64(c)
    _close_bf16(ops.gemm(a, b, c, trans_a=bool(ta), trans_b=bool(tb)).numpy(), ref)
    # alpha != 1 or a full C: not this kernel, still correct
    ex = opsnn.aclnn.gemm.prepare(a, b, c, alpha=0.5, trans_a=bool(ta), trans_b=bool(tb))
    assert ex.kernel_name != "gemm_onednn_runtime"
    _close_bf16(ops.gemm(a, b, c, alpha=0.5, trans_a=bool(ta), trans_b=bool(tb)).numpy(), ref - 0.5 * (ref - _f64(c)))


def test_bf16_runtime_products_propagate_nan_and_inf():
    a, b = _bf16((4, 6)), _bf16((6, 3))
    a[1, 2], a[2, 0] = np.nan, np.inf
    b[:, 2] = 0  # inf * 0 = nan in column 2 of row 2
    y = ops.matmul(a, b).numpy().astype(np.float64)
    assert np.isnan(y[1]).all() and np.isnan(y[2, 2])
    assert np.isinf(y[2, :2]).all() or np.isnan(y[2, :2]).all()
    assert np.isfinite(y[[0, 3]]).all()


def test_linear_gradient_reads_its_transpose_in_place():
    """The Linear rule's weight gradient is one Gemm with transA (no Transpose copy): float64 oracle."""
    x = opsnn.tensor(RNG.standard_normal((2, 5, 7))).requires_grad_()
    w = opsnn.tensor(RNG.standard_normal((3, 7))).requires_grad_()
    g = RNG.standard_normal((2, 5, 3))
    with opsnn.profiler.profile() as p:
        ops.sum(ops.mul(ops.linear(x, w), opsnn.tensor(g))).backward()
    assert "Transpose" not in {e.op for e in p.kernels}
    np.testing.assert_allclose(w.grad.numpy(), g.reshape(-1, 3).T @ x.numpy().reshape(-1, 7), rtol=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), g @ w.numpy(), rtol=1e-12)


def test_fp32_adapter_rounds_bf16_outputs_to_nearest_even():
    """16-bit outputs of float32 kernels are narrowed by the numba bit conversion: bit-identical to
    ml_dtypes' round-to-nearest-even (ties, overflow to inf, NaN, subnormals)."""
    x = np.array([1.0, 3.0e38, -3.0e38, np.nan, np.inf, 1 + 2**-8, 1 + 3 * 2**-8, 1e-40, -0.0], np.float32)
    x = np.concatenate([x, RNG.standard_normal(70_000).astype(np.float32)])
    a = x.astype(BF16)
    two = np.array(2.0, BF16)
    with np.errstate(over="ignore"):
        want = (a.astype(np.float32) * np.float32(2)).astype(BF16)
        got = ops.mul(a, two).numpy()
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


# -- GeluBackward -----------------------------------------------------------------------------------------
def _gelu_grad_f64(g, x, approx):
    """d gelu / dx in float64 from the definitions (erf form via math.erf, tanh form via tanh)."""
    g, x = np.asarray(g, np.float64), np.asarray(x, np.float64)
    if approx == "tanh":
        k, c = np.sqrt(2 / np.pi), 0.044715
        t = np.tanh(k * (x + c * x**3))
        return g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * c * x * x))
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return g * (0.5 * (1 + erf(x / np.sqrt(2))) + x * np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi))


@pytest.mark.parametrize("approx", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, BF16], ids=["f32", "f64", "bf16"])
@pytest.mark.parametrize("shape", [(3, 5, 7), (0, 3), (300_001,)])
def test_gelu_backward_matches_float64(approx, dtype, shape):
    x = (RNG.standard_normal(shape) * 3).astype(dtype)
    g = RNG.standard_normal(shape).astype(dtype)
    y = ops.gelu_backward(g, x, approximate=approx).numpy()
    assert y.dtype == dtype and y.shape == x.shape
    assert not opsnn.aclnn.gelu_backward.prepare(g, x, approximate=approx).adapter  # bf16 natively too
    want = _gelu_grad_f64(g, x, approx)
    # float32: the forward kernel's fphi/fexp (< 1e-7 relative) on a sum that cancels near x = -0.75;
    # bfloat16: one rounding of the float32 result
    tol = {np.float64: (1e-12, 1e-14), np.float32: (1e-5, 2e-6)}.get(dtype, (2.0**-8, 1e-5))
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=tol[0], atol=tol[1])


@pytest.mark.parametrize("approx", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, BF16], ids=["f32", "f64", "bf16"])
@pytest.mark.parametrize("n", [37, 300_001])
@pytest.mark.parametrize("over", ["grad", "x", "partial"])
def test_gelu_backward_kernel_written_over_an_input(approx, dtype, n, over):
    # a graph's memory plan hands the kernel dX in the memory of a dying grad or X
    from opsnn.kernels.cpu import activation_backward as KB

    x = (RNG.standard_normal(n + 1) * 3).astype(dtype)
    g = RNG.standard_normal(n + 1).astype(dtype)
    want = _gelu_grad_f64(g[:n], x[:n], approx)
    plan = KB.gelu_backward_plan(n, approx == "tanh")
    if over == "partial":  # out starts one element into g: read before written, or the result is wrong
        buf = np.concatenate([g[:n], g[:1]])
        gv, out = buf[:n], buf[1:]
        KB.gelu_backward(gv, x[:n].copy(), out, plan)
        got = out
    else:
        gv, xv = g[:n].copy(), x[:n].copy()
        out = gv if over == "grad" else xv
        KB.gelu_backward(gv, xv, out, plan)
        got = out
    tol = {np.float64: (1e-12, 1e-14), np.float32: (1e-5, 2e-6)}.get(dtype, (2.0**-8, 1e-5))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol[0], atol=tol[1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("n", [37, 300_001])
@pytest.mark.parametrize("over", ["A", "B", "partial"])
def test_swiglu_kernel_written_over_an_input(dtype, n, over):
    # a graph's memory plan hands SwiGLU its output in the memory of a dying gate or value
    from opsnn.kernels.cpu import activation as KA

    a = (RNG.standard_normal(n + 1) * 3).astype(dtype)
    b = RNG.standard_normal(n + 1).astype(dtype)
    a64, b64 = a[:n].astype(np.float64), b[:n].astype(np.float64)
    want = a64 / (1 + np.exp(-1.5 * a64)) * b64
    plan = (dtype(1.5), 0 if n < 1000 else KA.CHUNK_MIN)  # (alpha, elements per parallel task; 0 serial)
    if over == "partial":  # out starts one element into A: every input must be read before written
        buf = a.copy()
        av, out = buf[:n], buf[1:]
        KA.swiglu([av, b[:n].copy()], [out], {}, plan, None)
    else:
        av, bv = a[:n].copy(), b[:n].copy()
        out = av if over == "A" else bv
        KA.swiglu([av, bv], [out], {}, plan, None)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=rtol, atol=rtol * 1e-1)


def test_gelu_rule_runs_one_backward_op_like_the_composition_and_torch():
    x = opsnn.tensor(RNG.standard_normal((6, 33)).astype(np.float32)).requires_grad_()
    g = RNG.standard_normal((6, 33)).astype(np.float32)
    for approx in ("none", "tanh"):
        x.grad = None
        with opsnn.profiler.profile() as p:
            ops.sum(ops.mul(ops.gelu(x, approximate=approx), opsnn.tensor(g))).backward()
        names = [e.op for e in p.kernels]
        assert "GeluBackward" in names and "Erf" not in names and "Tanh" not in names
        np.testing.assert_allclose(x.grad.numpy(), _gelu_grad_f64(g, x.numpy(), approx), rtol=1e-5, atol=2e-6)
    torch = pytest.importorskip("torch")
    for approx in ("none", "tanh"):
        want = torch.ops.aten.gelu_backward(torch.from_numpy(g), torch.from_numpy(x.numpy()), approximate=approx)
        got = ops.gelu_backward(g, x.numpy(), approximate=approx).numpy()
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=2e-6)


def test_gelu_backward_nonfinite_and_bad_input():
    x = np.array([np.nan, np.inf, -np.inf, -40.0, 40.0], np.float32)
    y = ops.gelu_backward(np.ones(5, np.float32), x).numpy()
    assert np.isnan(y[0]) and y[3] == 0 and y[4] == 1  # inf * exp(-inf) makes NaN at +-inf, as x * pdf does
    with pytest.raises(OpsnnError, match=r"GeluBackward: grad shape \(2,\) differs from X's \(5,\)"):
        ops.gelu_backward(np.ones(2, np.float32), x)
    with pytest.raises(OpsnnError, match="GeluBackward: grad and X must have the same dtype"):
        ops.gelu_backward(np.ones(5, np.float64), x)
    with pytest.raises(OpsnnError, match="approximate"):
        ops.gelu_backward(np.ones(5, np.float32), x, approximate="fast")


# -- SwiGLUBackward ---------------------------------------------------------------------------------------
def _swiglu_grads_f64(g, a, b, alpha):
    g, a, b = (np.asarray(v, np.float64) for v in (g, a, b))
    s = 1.0 / (1.0 + np.exp(-alpha * a))
    return g * b * (s + alpha * a * s * (1 - s)), g * a * s


@pytest.mark.parametrize("alpha", [1.0, 1.702])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, BF16], ids=["f32", "f64", "bf16"])
@pytest.mark.parametrize("shape", [(2, 7, 13), (0, 5), (300_001,)])
def test_swiglu_backward_matches_float64(alpha, dtype, shape):
    g, a, b = ((RNG.standard_normal(shape) * 3).astype(dtype) for _ in range(3))
    da, db = (t.numpy() for t in ops.swiglu_backward(g, a, b, alpha=alpha))
    assert not opsnn.aclnn.swiglu_backward.prepare(g, a, b, alpha=alpha).adapter
    want = _swiglu_grads_f64(g, a, b, alpha)
    tol = {np.float64: (1e-12, 1e-13), np.float32: (1e-5, 1e-5)}.get(dtype, (2.0**-8, 1e-5))
    for got, ref in zip((da, db), want):
        assert got.dtype == dtype and got.shape == tuple(shape)
        np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol[0], atol=tol[1])


def test_swiglu_rule_is_one_op_and_matches_torch():
    a = opsnn.tensor(RNG.standard_normal((4, 9)).astype(np.float32)).requires_grad_()
    b = opsnn.tensor(RNG.standard_normal((4, 9)).astype(np.float32)).requires_grad_()
    g = RNG.standard_normal((4, 9)).astype(np.float32)
    with opsnn.profiler.profile() as p:
        ops.sum(ops.mul(ops.swiglu(a, b), opsnn.tensor(g))).backward()
    assert "SwiGLUBackward" in [e.op for e in p.kernels] and "Sigmoid" not in [e.op for e in p.kernels]
    wa, wb = _swiglu_grads_f64(g, a.numpy(), b.numpy(), 1.0)
    np.testing.assert_allclose(a.grad.numpy(), wa, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.grad.numpy(), wb, rtol=1e-5, atol=1e-6)
    torch = pytest.importorskip("torch")
    ta, tb = (torch.from_numpy(t.numpy()).requires_grad_() for t in (a, b))
    (torch.nn.functional.silu(ta) * tb * torch.from_numpy(g)).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.grad.numpy(), tb.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_swiglu_backward_nonfinite_and_bad_input():
    a = np.array([np.nan, 50.0, -50.0, 0.0], np.float32)
    da, db = (t.numpy() for t in ops.swiglu_backward(np.ones(4, np.float32), a, np.ones(4, np.float32)))
    assert np.isnan(da[0]) and np.isnan(db[0])
    np.testing.assert_allclose(da[1:], [1.0, 0.0, 0.5], atol=1e-6)
    np.testing.assert_allclose(db[1:], [50.0, 0.0, 0.0], atol=1e-5)
    with pytest.raises(OpsnnError, match="SwiGLUBackward: grad, A and B must have one shape"):
        ops.swiglu_backward(np.ones(3, np.float32), a, a)
    with pytest.raises(OpsnnError, match="SwiGLUBackward: grad, A and B must share one dtype"):
        ops.swiglu_backward(np.ones(4, np.float64), a, a)


@pytest.mark.parametrize("level", ["avx2", "avx512", "avx512_bf16", "amx"])
@pytest.mark.parametrize("vendor", ["GenuineIntel", "AuthenticAMD"])
def test_runtime_bf16_products_need_native_onednn_bf16(level, vendor):
    from opsnn.kernels.cpu import libraries as KL

    native = level in ("avx512_bf16", "amx")
    assert (KL.runtime_bf16_product(KL.Platform.for_isa(level, vendor)) is None) == native
    assert KL.runtime_bf16_product(KL.Platform.for_isa(level, vendor, onednn=False)) is not None
    c = KL.kernel_choice("linear_onednn_runtime", 64, 256, 256, BF16)
    assert c.library == "onednn" and "run time" in c.reason


def test_rotary_under_autocast_follows_its_data_dtype():
    """HF's LLaMA casts cos/sin to the activations' dtype: bf16 q stays bf16 (only the small tables are
    cast), and its gradient flows back in bf16. Oracle: the op's reference on bf16-rounded tables, in float64."""
    b, h, s, d = 2, 3, 5, 8
    q = opsnn.tensor(RNG.standard_normal((b, h, s, d)).astype(np.float32)).requires_grad_()
    cos, sin = (RNG.standard_normal((s, d // 2)).astype(np.float32) for _ in range(2))
    pos = np.tile(np.arange(s), (b, 1))
    w = opsnn.tensor(RNG.standard_normal((d, d)).astype(np.float32)).requires_grad_()
    with opsnn.profiler.profile() as p, opsnn.autocast("bfloat16"):
        x = ops.matmul(q, w)  # bf16 activations
        y = ops.rotary_embedding(x, cos, sin, pos)
    assert y.dtype == BF16
    casts = sorted(tuple(e.shapes[0]) for e in p.kernels if e.op == "Cast")
    assert casts == sorted([(b, h, s, d), (d, d), (s, d // 2), (s, d // 2)])  # q, w, cos, sin: no (b, h, s, d) back
    rec = ops.get_op("RotaryEmbedding")
    attrs = {"interleaved": 0, "rotary_embedding_dim": 0, "num_heads": 0}
    tables = [c.astype(BF16).astype(np.float64) for c in (cos, sin)]
    want = rec.reference([x.numpy().astype(np.float64), *tables, pos], attrs)
    np.testing.assert_allclose(y.numpy().astype(np.float64), want, rtol=2.0**-8, atol=1e-6)
    ops.sum(y).backward()
    assert q.grad.dtype == np.float32 and w.grad.dtype == np.float32


def test_bf16_to_f32_widening_is_exact_over_ragged_blocks():
    """The flat bfloat16 -> float32 conversion (Cast, the bf16 products' operands) against
    ml_dtypes' widening, bit for bit: every bf16 pattern, over several parallel blocks and a tail."""
    from opsnn.kernels.cpu import gemm as KG

    bits = np.arange(1 << 16, dtype=np.uint16)  # every pattern: +-0, subnormals, Inf, NaNs
    whole = np.concatenate([bits, bits[::-1], bits[:12345]])  # 143417 elements: 4 blocks and a ragged tail
    for src in (whole, whole[65000:65300]):  # the parallel kernel, and one block on the calling thread
        dst = np.empty(src.shape, np.uint32)
        KG.bf16_to_f32(src, dst)
        np.testing.assert_array_equal(dst, src.view(BF16).astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("approx", ["none", "tanh"])
@pytest.mark.parametrize("shape", [(3, 5, 7), (0, 3), (300_001,)])
def test_bf16_gelu_runs_natively_and_rounds_the_float32_kernel_once(approx, shape):
    """bfloat16 Gelu has its own kernel (no Cast pair around the float32 one): the float32 kernel's
    result on the widened input, rounded to nearest even, bit for bit (NaN, +-Inf and -0 included),
    and within one bf16 rounding of the float64 definition where the input is finite."""
    x = (RNG.standard_normal(shape) * 3).astype(BF16)
    if x.size:
        x.reshape(-1)[:4] = np.array([np.nan, np.inf, -np.inf, -0.0]).astype(BF16)
    assert not opsnn.aclnn.gelu.prepare(x, approximate=approx).adapter
    y = ops.gelu(x, approximate=approx).numpy()
    assert y.dtype == BF16 and y.shape == x.shape
    f32 = ops.gelu(x.astype(np.float32), approximate=approx).numpy()
    np.testing.assert_array_equal(y.view(np.uint16), f32.astype(BF16).view(np.uint16))
    v = x.astype(np.float64)
    fin = np.isfinite(v)
    if approx == "tanh":
        want = 0.5 * v[fin] * (1 + np.tanh(np.sqrt(2 / np.pi) * (v[fin] + 0.044715 * v[fin] ** 3)))
    else:
        want = 0.5 * v[fin] * (1 + np.vectorize(math.erf, otypes=[np.float64])(v[fin] / np.sqrt(2)))
    np.testing.assert_allclose(y.astype(np.float64)[fin], want, rtol=2.0**-8, atol=1e-6)
