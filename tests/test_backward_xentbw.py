"""Backward kernels of the softmax family and embeddings: SoftmaxCrossEntropyLoss' numba forward and its
fused SoftmaxCrossEntropyLossGrad, SoftmaxGrad / LogSoftmaxGrad, Embedding / EmbeddingGrad.

Oracles: explicit float64 formulas written here (per position loops), the gradient rules' previous
compositions of registry ops, and torch.autograd where torch is importable. Tolerances: float32
kernels against float64 oracles to rtol 1e-5 / atol 1e-6 (row sums run in float64; the exps and
the written values are float32, a few ulps); float64 kernels to 1e-12.
"""

from __future__ import annotations

import numpy as np
import pytest

import opsnn
from opsnn import nn
from opsnn.errors import InferShapeError, OpsnnError, ParamInvalidError

RNG = np.random.default_rng(2031)


def _xent_oracle(x, t, w=None, reduction="mean", ignore=None):
    """(loss, dLoss/dx for dLoss = 1 or ones) in float64, one position at a time."""
    x = x.astype(np.float64)
    N, C = x.shape[:2]
    xs = x.reshape(N, C, -1)
    ts = t.reshape(N, -1)
    loss = np.zeros(ts.shape)
    grad = np.zeros(xs.shape)
    wt = np.zeros(ts.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        for n in range(N):
            for d in range(ts.shape[1]):
                c = int(ts[n, d])
                if ignore is not None and c == ignore:
                    continue
                col = xs[n, :, d]
                m = col.max()
                lse = m + np.log(np.exp(col - m).sum())
                wt[n, d] = 1.0 if w is None else float(w[c])
                loss[n, d] = -(col[c] - lse) * wt[n, d]
                p = np.exp(col - lse)
                p[c] -= 1.0
                grad[n, :, d] = p * wt[n, d]
        if reduction == "none":
            return loss.reshape(t.shape), grad.reshape(x.shape)
        if reduction == "sum":
            return loss.sum(), grad.reshape(x.shape)
        total = wt.sum()
        return loss.sum() / total, (grad / total if total else grad).reshape(x.shape)


def _composition(x, t, w, reduction, ignore, g):
    """The SoftmaxCrossEntropyLoss gradient rule before the fused op: softmax, one-hot and
    coefficients as separate registry ops."""
    from opsnn.ops.gradients import GradContext, _class_coefficients

    attrs = {"reduction": reduction} if ignore is None else {"reduction": reduction, "ignore_index": ignore}
    xt, tt = opsnn.tensor(x), opsnn.tensor(t)
    ins = [xt, tt] + ([opsnn.tensor(w)] if w is not None else [])
    onehot, coef = _class_coefficients(GradContext("SoftmaxCrossEntropyLoss", ins, [], attrs, []), opsnn.tensor(g))
    return opsnn.ops.mul(opsnn.ops.sub(opsnn.ops.softmax(xt, dim=1), onehot), coef).numpy()


SHAPES = [((7, 5), (7,)), ((3, 4, 6), (3, 6)), ((2, 3, 4, 5), (2, 4, 5)), ((5, 1100), (5,))]


@pytest.mark.parametrize("xs,ts", SHAPES)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted,ignore", [(False, None), (True, None), (False, 1), (True, -100)])
def test_cross_entropy_forward_and_fused_backward(xs, ts, reduction, weighted, ignore):
    x = (RNG.standard_normal(xs) * 3).astype(np.float32)
    t = RNG.integers(0, xs[1], ts).astype(np.int64)
    if ignore is not None:
        t.reshape(-1)[::3] = ignore
    w = RNG.random(xs[1]).astype(np.float32) if weighted else None
    want, _ = _xent_oracle(x, t, w, reduction, ignore)
    for n_out in (1, 2):  # with and without the log_prob output
        ex = opsnn.aclnn.softmax_cross_entropy_loss.prepare(
            x, t, w, reduction=reduction, ignore_index=ignore, return_log_prob=n_out == 2
        )
        assert ex.kernel_name == "softmax_xent_numba"
        res = ex.run()
        loss = (res[0] if n_out == 2 else res).numpy()
        np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)
        if n_out == 2:
            xf = x.astype(np.float64)
            m = xf.max(1, keepdims=True)
            logp = xf - m - np.log(np.exp(xf - m).sum(1, keepdims=True))
            np.testing.assert_allclose(res[1].numpy(), logp, rtol=1e-5, atol=1e-5)
    g = np.asarray(RNG.standard_normal(np.shape(want)) + 1.5, np.float32)
    _, dx_unit = _xent_oracle(x, t, w, reduction, ignore)
    gb = g.reshape(g.shape[:1] + (1,) + g.shape[1:]) if reduction == "none" else g
    ex = opsnn.aclnn.softmax_cross_entropy_loss_grad.prepare(g, x, t, w, reduction=reduction, ignore_index=ignore)
    assert ex.kernel_name == "softmax_xent_grad_numba"
    dx = ex.run().numpy()
    np.testing.assert_allclose(dx, dx_unit * gb, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx, _composition(x, t, w, reduction, ignore, g), rtol=1e-5, atol=1e-6)
    ref = opsnn.ops.softmax_cross_entropy_loss_grad(
        g, x, t, w, reduction=reduction, ignore_index=ignore, algo="reference"
    ).numpy()
    np.testing.assert_allclose(ref, dx_unit * gb, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("threads", [1, 2])
def test_cross_entropy_many_rows_float64_and_threads(threads):
    """Enough rows for the parallel launch (where more than one thread is allowed); float64 data."""
    import numba

    x = RNG.standard_normal((300, 1000))
    t = RNG.integers(0, 1000, 300)
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        opsnn.ops.clear_cache()
        loss = opsnn.ops.cross_entropy(x, t).numpy()
        dx = opsnn.ops.softmax_cross_entropy_loss_grad(np.float64(2.0), x, t).numpy()
    finally:
        numba.set_num_threads(before)
        opsnn.ops.clear_cache()
    want, dwant = _xent_oracle(x, t)
    np.testing.assert_allclose(loss, want, rtol=1e-12)
    np.testing.assert_allclose(dx, 2.0 * dwant, rtol=1e-12, atol=1e-15)


def test_cross_entropy_nan_inf_logits():
    """A NaN or +inf score, or a row of -inf scores, makes that row's loss and gradient NaN
    (as exp(x - max) / sum does); other rows stay exact; an ignored row's gradient is zero."""
    x = RNG.standard_normal((6, 700)).astype(np.float32)
    x[1, 3] = np.nan
    x[2, 650] = np.inf
    x[3, :] = -np.inf
    x[4, 10] = -np.inf  # one -inf score is fine
    x[5, 0] = np.nan  # ignored below
    t = np.array([0, 1, 2, 3, 10, -100])
    loss = opsnn.ops.cross_entropy(x, t, reduction="none").numpy()
    want, dwant = _xent_oracle(x, t, reduction="none", ignore=-100)
    assert np.isnan(loss[1:4]).all() and np.isfinite(loss[[0, 5]]).all()
    assert loss[4] == np.inf and want[4] == np.inf  # its label is the -inf score
    np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)
    dx = opsnn.ops.softmax_cross_entropy_loss_grad(
        np.ones(6, np.float32), x, t, reduction="none", ignore_index=-100
    ).numpy()
    assert np.isnan(dx[1:4]).all() and (dx[5] == 0).all() and np.isfinite(dx[[0, 4]]).all()
    np.testing.assert_allclose(dx[[0, 4]], dwant[[0, 4]], rtol=1e-5, atol=1e-6)


def test_cross_entropy_empty_and_all_ignored():
    x = np.zeros((0, 4), np.float32)
    t = np.zeros((0,), np.int64)
    assert opsnn.ops.cross_entropy(x, t, reduction="none").shape == (0,)
    assert float(opsnn.ops.cross_entropy(x, t, reduction="sum").numpy()) == 0.0
    assert np.isnan(opsnn.ops.cross_entropy(x, t).numpy())  # 0 / 0, as the reference
    assert opsnn.ops.softmax_cross_entropy_loss_grad(np.float32(1), x, t).shape == (0, 4)
    # every label ignored: mean is NaN (nothing to average), the gradient zero (torch's)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    t = np.full(3, -100)
    assert np.isnan(opsnn.ops.cross_entropy(x, t).numpy())
    dx = opsnn.ops.softmax_cross_entropy_loss_grad(np.float32(1), x, t, ignore_index=-100).numpy()
    assert (dx == 0).all()


def test_cross_entropy_bad_inputs_are_typed_errors():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    for bad in (np.array([0, 4, 1]), np.array([0, -1, 1])):
        with pytest.raises(ParamInvalidError, match=r"targets must lie in \[0, 4\).*at position \(1,\)"):
            opsnn.ops.cross_entropy(x, bad)
        with pytest.raises(ParamInvalidError, match="SoftmaxCrossEntropyLossGrad: targets must lie"):
            opsnn.ops.softmax_cross_entropy_loss_grad(np.float32(1), x, bad, ignore_index=-100)
    t = np.array([0, 1, 2])
    with pytest.raises(InferShapeError, match=r"dLoss must have the loss's shape \(3,\)"):
        opsnn.ops.softmax_cross_entropy_loss_grad(np.float32(1), x, t, reduction="none")
    with pytest.raises(InferShapeError, match="dLoss must have the scores' dtype float32"):
        opsnn.ops.softmax_cross_entropy_loss_grad(np.float64(1), x, t)
    with pytest.raises(InferShapeError, match="labels/target must have shape"):
        opsnn.ops.softmax_cross_entropy_loss_grad(np.float32(1), x, np.array([0, 1]))
    with pytest.raises(ParamInvalidError, match="reduction"):
        opsnn.ops.softmax_cross_entropy_loss_grad(np.float32(1), x, t, reduction="avg")


def test_cross_entropy_autograd_runs_the_fused_op():
    from opsnn.runtime import hooks

    x = opsnn.tensor(RNG.standard_normal((4, 9, 3)).astype(np.float32)).requires_grad_()
    t = RNG.integers(0, 9, (4, 3))
    w = RNG.random(9).astype(np.float32)
    loss = nn.functional.cross_entropy(x, t, w)
    seen = []
    unsubscribe = hooks.subscribe("kernel", lambda ev: seen.append(ev["op"]))
    try:
        loss.backward()
    finally:
        unsubscribe()
    # one launch (and the copy into the leaf's .grad): no softmax, one-hot or products
    assert [op for op in seen if op != "Copy"] == ["SoftmaxCrossEntropyLossGrad"], seen
    _, dwant = _xent_oracle(x.numpy(), t, w)
    np.testing.assert_allclose(x.grad.numpy(), dwant, rtol=1e-5, atol=1e-6)


# -- SoftmaxGrad / LogSoftmaxGrad ----------------------------------------------------------------------------
def _softmax_grad_oracle(dy, y, axis, log):
    dy, y = dy.astype(np.float64), y.astype(np.float64)
    with np.errstate(all="ignore"):
        if log:
            return dy - np.exp(y) * dy.sum(axis=axis, keepdims=True)
        return y * (dy - (dy * y).sum(axis=axis, keepdims=True))


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize(
    "shape,axis", [((7, 13), -1), ((3, 1100), 1), ((3, 5, 70), 1), ((4, 3), 0), ((2, 3, 130, 3), 2), ((0, 5), 1)]
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_and_log_softmax_grad(log, shape, axis, dtype):
    x = RNG.standard_normal(shape).astype(dtype)
    y = (opsnn.ops.log_softmax if log else opsnn.ops.softmax)(x, dim=axis).numpy()
    dy = RNG.standard_normal(shape).astype(dtype)
    name = "log_softmax_grad" if log else "softmax_grad"
    ex = getattr(opsnn.aclnn, name).prepare(dy, y, dim=axis)
    assert ex.kernel_name == name + "_numba"
    got = ex.run().numpy()
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got, _softmax_grad_oracle(dy, y, axis, log), **tol)
    # against the rule's previous composition of registry ops
    ops, yt, dyt = opsnn.ops, opsnn.tensor(y), opsnn.tensor(dy)
    if log:
        old = ops.sub(dyt, ops.mul(ops.exp(yt), ops.sum(dyt, dim=axis, keepdim=True)))
    else:
        old = ops.mul(yt, ops.sub(dyt, ops.sum(ops.mul(dyt, yt), dim=axis, keepdim=True)))
    np.testing.assert_allclose(got, old.numpy(), **tol)


def test_softmax_grad_nan_and_errors():
    y = opsnn.ops.softmax(RNG.standard_normal((3, 6)).astype(np.float32)).numpy()
    dy = np.ones((3, 6), np.float32)
    dy[1, 2] = np.nan
    got = opsnn.ops.softmax_grad(dy, y).numpy()
    assert np.isnan(got[1]).all() and np.isfinite(got[[0, 2]]).all()
    with pytest.raises(InferShapeError, match="Y must have dY's shape"):
        opsnn.ops.softmax_grad(dy, y[:2])
    with pytest.raises(InferShapeError, match="Y must have dY's dtype float32"):
        opsnn.ops.log_softmax_grad(dy, y.astype(np.float64))
    with pytest.raises(ParamInvalidError, match="axis"):
        opsnn.ops.softmax_grad(dy, y, dim=2)


# -- Embedding / EmbeddingGrad -------------------------------------------------------------------------------
def _embedding_grad_oracle(g, ids, R, padding=None):
    out = np.zeros((R, g.shape[-1]))
    flat = ids.reshape(-1)
    np.add.at(out, np.where(flat < 0, flat + R, flat), g.reshape(flat.size, g.shape[-1]).astype(np.float64))
    if padding is not None:
        out[padding] = 0
    return out


@pytest.mark.parametrize(
    "R,D,ids_shape,padding",
    [(7, 3, (5,), None), (50, 4, (3, 9), 2), (50, 4, (3, 9), -1), (1200, 300, (4, 70), 0), (6, 2, (0,), None)],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_embedding_grad(R, D, ids_shape, padding, dtype):
    ids = RNG.integers(-R, R, ids_shape)
    ids.reshape(-1)[::4] = 1  # repeats accumulate
    g = RNG.standard_normal(ids_shape + (D,)).astype(dtype)
    ex = opsnn.aclnn.embedding_grad.prepare(g, ids, R, padding_idx=padding)
    assert ex.kernel_name == "embedding_grad_rows"
    got = ex.run().numpy()
    want = _embedding_grad_oracle(g, ids, R, None if padding is None else padding % R)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, want, **tol)
    # rows summed in the ids' order: bit-identical to a sequential scatter-add in the data's dtype
    seq = np.zeros((R, D), dtype)
    np.add.at(seq, np.where(ids.reshape(-1) < 0, ids.reshape(-1) + R, ids.reshape(-1)), g.reshape(ids.size, D))
    if padding is not None:
        seq[padding % R] = 0
    np.testing.assert_array_equal(got, seq)


def test_embedding_grad_errors():
    g = np.ones((3, 2), np.float32)
    with pytest.raises(ParamInvalidError, match=r"EmbeddingGrad: id 5 at position \(1,\) is out of range"):
        opsnn.ops.embedding_grad(g, np.array([0, 5, 1]), 5)
    with pytest.raises(ParamInvalidError, match="padding_idx"):
        opsnn.ops.embedding_grad(g, np.array([0, 1, 1]), 5, padding_idx=5)
    with pytest.raises(InferShapeError, match="dY must have shape ids.shape"):
        opsnn.ops.embedding_grad(g, np.array([0, 1]), 5)
    with pytest.raises(OpsnnError):
        opsnn.ops.embedding_grad(g, np.array([0.0, 1.0, 2.0]), 5)


def test_embedding_autograd_padding_row_and_gather_cases():
    """nn.Embedding's padding row gets no gradient; an axis-0 Gather of a 2-D table goes through
    EmbeddingGrad too (no padding); other Gathers keep the scatter rule."""
    with nn.init.seeded(0):
        emb = nn.Embedding(11, 5, padding_idx=3)
    ids = np.array([[3, 1, 3, 10], [0, 1, 2, 3]])
    out = emb(ids)
    g = RNG.standard_normal(out.shape).astype(np.float32)
    opsnn.ops.sum(opsnn.ops.mul(out, opsnn.tensor(g))).backward()
    np.testing.assert_allclose(emb.weight.grad.numpy(), _embedding_grad_oracle(g, ids, 11, 3), rtol=1e-6, atol=1e-6)
    assert (emb.weight.grad.numpy()[3] == 0).all()
    w = opsnn.tensor(RNG.standard_normal((6, 4)).astype(np.float32)).requires_grad_()
    opsnn.ops.sum(opsnn.ops.gather(w, np.array([[5, 0], [5, -1]]), axis=0)).backward()
    np.testing.assert_allclose(
        w.grad.numpy(), _embedding_grad_oracle(np.ones((2, 2, 4)), np.array([[5, 0], [5, -1]]), 6), rtol=1e-6
    )
    x3 = opsnn.tensor(RNG.standard_normal((4, 2, 3)).astype(np.float32)).requires_grad_()
    opsnn.ops.sum(opsnn.ops.gather(x3, np.array([1, 1, 3]), axis=0)).backward()
    want = np.zeros((4, 2, 3))
    want[1], want[3] = 2, 1
    np.testing.assert_allclose(x3.grad.numpy(), want)


def test_embedding_record_errors():
    w = np.zeros((4, 3), np.float32)
    with pytest.raises(ParamInvalidError, match="padding_idx"):
        opsnn.ops.embedding(np.array([0]), w, padding_idx=4)
    with pytest.raises(ParamInvalidError, match="id 4 at position"):
        opsnn.ops.embedding(np.array([0, 4]), w)


# -- torch --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_against_torch_cross_entropy(reduction, smoothing):
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal((5, 7, 3)).astype(np.float32)
    t = RNG.integers(0, 7, (5, 3))
    t[0, 1] = t[3, 2] = -100
    w = RNG.random(7).astype(np.float32)
    xo = opsnn.tensor(x).requires_grad_()
    lo = nn.functional.cross_entropy(xo, t, w, reduction=reduction, label_smoothing=smoothing)
    xt = torch.tensor(x, requires_grad=True)
    lt = torch.nn.functional.cross_entropy(
        xt, torch.tensor(t), torch.tensor(w), reduction=reduction, label_smoothing=smoothing
    )
    np.testing.assert_allclose(lo.numpy(), lt.detach().numpy(), rtol=1e-5, atol=1e-6)
    g = RNG.standard_normal(lt.shape).astype(np.float32)
    lo.backward(opsnn.tensor(g))
    lt.backward(torch.tensor(g))
    np.testing.assert_allclose(xo.grad.numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("log", [False, True])
def test_against_torch_softmax_grads(log):
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal((3, 40, 5)).astype(np.float32)
    g = RNG.standard_normal(x.shape).astype(np.float32)
    xo = opsnn.tensor(x).requires_grad_()
    (opsnn.ops.log_softmax if log else opsnn.ops.softmax)(xo, dim=1).backward(opsnn.tensor(g))
    xt = torch.tensor(x, requires_grad=True)
    (torch.log_softmax if log else torch.softmax)(xt, 1).backward(torch.tensor(g))
    np.testing.assert_allclose(xo.grad.numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_against_torch_embedding():
    torch = pytest.importorskip("torch")
    with nn.init.seeded(1):
        emb = nn.Embedding(30, 6, padding_idx=0)
    temb = torch.nn.Embedding(30, 6, padding_idx=0)
    with torch.no_grad():
        temb.weight.copy_(torch.tensor(emb.weight.numpy()))
    ids = RNG.integers(0, 30, (4, 9))
    ids[:, -2:] = 0
    g = RNG.standard_normal((4, 9, 6)).astype(np.float32)
    emb(ids).backward(opsnn.tensor(g))
    temb(torch.tensor(ids)).backward(torch.tensor(g))
    np.testing.assert_allclose(emb.weight.grad.numpy(), temb.weight.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_compiled_step_traces_the_backward_ops():
    """A compiled training step (embedding with a padding row, log-softmax, cross-entropy) traces
    EmbeddingGrad, LogSoftmaxGrad and SoftmaxCrossEntropyLossGrad, their shapes inferred in the
    graph, and agrees with the eager step (tolerances of tests/test_compiled_training.py)."""
    from opsnn import optim

    batches = [(RNG.integers(0, 12, (3, 4)), RNG.integers(0, 5, 3)) for _ in range(3)]

    def run(compiled):
        with nn.init.seeded(5):
            emb, head = nn.Embedding(12, 6, padding_idx=0), nn.Linear(6, 5)
        opt = optim.SGD(list(emb.parameters()) + list(head.parameters()), lr=0.1)

        def train_step(ids, y):
            opt.zero_grad()
            h = opsnn.ops.log_softmax(emb(ids), dim=-1)
            loss = nn.functional.cross_entropy(head(opsnn.ops.mean(h, dim=1)), y)
            loss.backward()
            opt.step()
            return loss

        step = opsnn.compile(train_step) if compiled else train_step
        losses = [float(step(opsnn.tensor(i), opsnn.tensor(y)).item()) for i, y in batches]
        return losses, emb.weight.numpy().copy(), step

    el, ew, _ = run(False)
    cl, cw, step = run(True)
    ops = {n.op_type for n in step.graph().nodes}
    assert {"EmbeddingGrad", "LogSoftmaxGrad", "SoftmaxCrossEntropyLossGrad"} <= ops, sorted(ops)
    np.testing.assert_allclose(cl, el, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(cw, ew, rtol=1e-5, atol=1e-6)
    with nn.init.seeded(5):
        w0 = nn.Embedding(12, 6, padding_idx=0).weight.numpy()
    np.testing.assert_array_equal(cw[0], w0[0])  # the padding row is never updated


def test_bfloat16_runs_the_float32_kernels():
    """16-bit data goes through the float32 kernels (compute float32, store bfloat16): within
    bfloat16 rounding (8 bits of mantissa: 2**-8 relative) of the float64 oracles."""
    import ml_dtypes

    bf = ml_dtypes.bfloat16
    x = RNG.standard_normal((6, 9)).astype(bf)
    t = RNG.integers(0, 9, 6)
    dx = opsnn.ops.softmax_cross_entropy_loss_grad(np.asarray(1, bf), x, t)
    assert dx.dtype == bf
    np.testing.assert_allclose(dx.numpy().astype(np.float64), _xent_oracle(x, t)[1], rtol=2e-2, atol=2e-3)
    y = opsnn.ops.softmax(x).numpy()
    got = opsnn.ops.softmax_grad(x, y).numpy().astype(np.float64)
    np.testing.assert_allclose(got, _softmax_grad_oracle(x, y, -1, False), rtol=2e-2, atol=2e-2)
    g = RNG.standard_normal((4, 3)).astype(bf)
    ids = np.array([0, 2, 2, 1])
    e = opsnn.ops.embedding_grad(g, ids, 3).numpy().astype(np.float64)
    np.testing.assert_allclose(e, _embedding_grad_oracle(g, ids, 3), rtol=2e-2, atol=2e-2)


def test_cross_entropy_grad_nonfinite_dloss_and_zero_weights():
    """An infinite dLoss gives (p - onehot) * inf (the label's entry -inf, not inf - inf); a mean over
    valid positions whose weights are all 0 is 0 / 0 (NaN, as torch's), unlike an all-ignored one."""
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    t = np.array([0, 2, 1])
    dx = opsnn.ops.softmax_cross_entropy_loss_grad(np.float32(np.inf), x, t, reduction="sum").numpy()
    onehot = np.eye(4, dtype=bool)[t]
    assert (dx[onehot] == -np.inf).all() and (dx[~onehot] == np.inf).all()
    w = np.zeros(4, np.float32)
    assert np.isnan(opsnn.ops.softmax_cross_entropy_loss_grad(np.float32(1), x, t, w).numpy()).all()
    assert np.isnan(opsnn.ops.softmax_cross_entropy_loss_grad(np.float32(1), x, t, w, algo="reference").numpy()).all()
