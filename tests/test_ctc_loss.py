"""CTC loss (opsnn::CTCLoss / CTCLossGrad, F.ctc_loss, nn.CTCLoss) against torch's ctc_loss and against the
records' float64 numpy references: padded and concatenated targets, repeated labels, empty targets, a blank
other than 0, every reduction, unbatched input, infeasible alignments with and without zero_infinity, NaN;
gradients through log_softmax equal torch's, and w.r.t. log_probs equal central differences; a compiled
training step; typed errors."""

from __future__ import annotations

import numpy as np
import pytest

import opsnn
from opsnn.errors import InferShapeError, ParamInvalidError
from opsnn.nn import functional as F

torch = pytest.importorskip("torch")
TF = torch.nn.functional
RNG = np.random.default_rng(5)

T, N, C = 9, 4, 6
LOGITS = RNG.standard_normal((T, N, C))
PADDED = np.array([[1, 2, 2, 3], [4, 4, 0, 0], [5, 1, 5, 0], [0, 0, 0, 0]])
PAD_LENGTHS = np.array([4, 2, 3, 0])
INPUT_LENGTHS = np.array([9, 5, 7, 3])


def _torch(logits, targets, il, tl, **kw):
    x = torch.tensor(logits, requires_grad=True)
    loss = TF.ctc_loss(x.log_softmax(-1), torch.tensor(targets), torch.tensor(il), torch.tensor(tl), **kw)
    return x, loss


def _ours(logits, targets, il, tl, **kw):
    x = opsnn.tensor(logits, requires_grad=True)
    return x, F.ctc_loss(opsnn.ops.log_softmax(x, -1), targets, il, tl, **kw)


def _backward(loss, seed, lib):
    if loss.ndim == 0:
        loss.backward()
    elif lib is torch:
        (loss * torch.tensor(seed, dtype=loss.dtype)).sum().backward()
    else:
        (loss * opsnn.tensor(seed.astype(loss.dtype))).sum().backward()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("layout", ["padded", "concatenated"])
def test_matches_torch_values_and_logit_gradients(dtype, reduction, layout):
    logits = LOGITS.astype(dtype)
    targets = PADDED if layout == "padded" else np.concatenate([r[:n] for r, n in zip(PADDED, PAD_LENGTHS)])
    tx, want = _torch(logits, targets, INPUT_LENGTHS, PAD_LENGTHS, reduction=reduction)
    ox, got = _ours(logits, targets, INPUT_LENGTHS, PAD_LENGTHS, reduction=reduction)
    tol = 1e-10 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=tol, atol=tol)
    assert got.dtype == dtype
    seed = RNG.standard_normal(N)
    _backward(want, seed, torch)
    _backward(got, seed, opsnn)
    np.testing.assert_allclose(ox.grad.numpy(), tx.grad.numpy(), rtol=1e-4 if dtype == np.float32 else 1e-9, atol=tol)


def test_blank_last_unbatched_and_module():
    logits = LOGITS[:, 0]
    target = np.array([0, 1, 1, 3])
    for blank in (5, 2):
        tgt = target if blank == 5 else np.array([0, 1, 1, 3]) + (np.array([0, 1, 1, 3]) >= 2)
        tx, want = _torch(logits, tgt, 9, 4, blank=blank, reduction="none")
        ox, got = _ours(logits, tgt, 9, 4, blank=blank, reduction="none")
        assert got.shape == ()
        np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-10)
    module = opsnn.nn.CTCLoss(blank=0, reduction="sum")
    lp = opsnn.ops.log_softmax(opsnn.tensor(LOGITS), -1)
    want = TF.ctc_loss(
        torch.tensor(LOGITS).log_softmax(-1),
        torch.tensor(PADDED),
        torch.tensor(INPUT_LENGTHS),
        torch.tensor(PAD_LENGTHS),
        reduction="sum",
    )
    np.testing.assert_allclose(module(lp, PADDED, INPUT_LENGTHS, PAD_LENGTHS).numpy(), want.numpy(), rtol=1e-10)
    assert "reduction='sum'" in repr(module) or "reduction" in repr(module)


def test_log_prob_gradient_is_exact_and_torch_adds_exp_log_probs():
    lp = torch.tensor(LOGITS).log_softmax(-1).detach()
    ours = opsnn.tensor(lp.numpy(), requires_grad=True)
    loss = F.ctc_loss(ours, PADDED, INPUT_LENGTHS, PAD_LENGTHS, reduction="sum")
    loss.backward()
    g = ours.grad.numpy()
    eps, fd = 1e-6, np.zeros_like(g)
    base = lp.numpy()
    for t, n, c in [(0, 0, 1), (3, 0, 2), (8, 0, 0), (2, 1, 4), (4, 2, 5), (1, 3, 0), (6, 2, 3), (5, 1, 0)]:
        hi, lo = base.copy(), base.copy()
        hi[t, n, c] += eps
        lo[t, n, c] -= eps
        fd[t, n, c] = (
            F.ctc_loss(hi, PADDED, INPUT_LENGTHS, PAD_LENGTHS, reduction="sum").item()
            - F.ctc_loss(lo, PADDED, INPUT_LENGTHS, PAD_LENGTHS, reduction="sum").item()
        ) / (2 * eps)
        assert abs(fd[t, n, c] - g[t, n, c]) < 1e-6, (t, n, c)
    tlp = lp.clone().requires_grad_()
    TF.ctc_loss(
        tlp, torch.tensor(PADDED), torch.tensor(INPUT_LENGTHS), torch.tensor(PAD_LENGTHS), reduction="sum"
    ).backward()
    inside = (np.arange(T)[:, None] < INPUT_LENGTHS[None, :])[..., None]
    np.testing.assert_allclose(tlp.grad.numpy(), g + np.exp(base) * inside, rtol=1e-9, atol=1e-12)
    assert not g[~np.broadcast_to(inside, g.shape)].any()  # nothing past an input's length


def test_kernels_match_the_float64_references():
    lp = torch.tensor(LOGITS).log_softmax(-1).numpy()
    for targets in (PADDED, np.concatenate([r[:n] for r, n in zip(PADDED, PAD_LENGTHS)])):
        for blank, zi in ((0, 0), (0, 1)):
            attrs = {"blank": blank, "zero_infinity": zi}
            il = np.array([9, 5, 2, 3])  # sample 2 cannot fit 3 labels with a repeat... in 2 frames
            got = opsnn.ops.ctc_nll(lp, targets, il, PAD_LENGTHS, zero_infinity=bool(zi)).numpy()
            ref = opsnn.ops.get_op("CTCLoss", "opsnn").reference([lp, targets, il, PAD_LENGTHS], attrs)[0]
            np.testing.assert_allclose(got, ref, rtol=1e-12)
            dl = RNG.standard_normal(N)
            g = opsnn.ops.ctc_nll_grad(lp, targets, il, PAD_LENGTHS, got, dl, zero_infinity=bool(zi)).numpy()
            gref = opsnn.ops.get_op("CTCLossGrad", "opsnn").reference([lp, targets, il, PAD_LENGTHS, got, dl], attrs)[0]
            np.testing.assert_allclose(g, gref, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("zero_infinity", [False, True])
def test_infeasible_alignments_and_nan_follow_torch(zero_infinity):
    il = np.array([9, 5, 2, 3])  # sample 2: labels 5 1 5 need 3 frames, it has 2
    tx, want = _torch(LOGITS, PADDED, il, PAD_LENGTHS, reduction="none", zero_infinity=zero_infinity)
    ox, got = _ours(LOGITS, PADDED, il, PAD_LENGTHS, reduction="none", zero_infinity=zero_infinity)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-10)
    assert got.numpy()[2] == (0.0 if zero_infinity else np.inf)
    if zero_infinity:
        want.sum().backward()
        got.sum().backward()
        np.testing.assert_allclose(ox.grad.numpy(), tx.grad.numpy(), rtol=1e-9, atol=1e-12)
        assert not ox.grad.numpy()[:, 2].any()
    bad = LOGITS.copy()
    bad[1, 0, 2] = np.nan
    _, got = _ours(bad, PADDED, il, PAD_LENGTHS, reduction="none", zero_infinity=zero_infinity)
    _, want = _torch(bad, PADDED, il, PAD_LENGTHS, reduction="none", zero_infinity=zero_infinity)
    assert np.isnan(got.numpy()[0]) and np.isnan(want.detach().numpy()[0])
    np.testing.assert_allclose(got.numpy()[1:], want.detach().numpy()[1:], rtol=1e-10)


def test_compiled_training_step_matches_eager():
    def build():
        with opsnn.nn.init.seeded(3):
            return opsnn.nn.Linear(5, C)

    feats = RNG.standard_normal((T, N, 5)).astype(np.float32)
    losses = {}
    for mode in ("eager", "compiled"):
        model = build()
        opt = opsnn.optim.SGD(model.parameters(), lr=0.05)

        def step(x):
            opt.zero_grad()
            loss = F.ctc_loss(opsnn.ops.log_softmax(model(x), -1), PADDED, INPUT_LENGTHS, PAD_LENGTHS)
            loss.backward()
            opt.step()
            return loss

        run = opsnn.compile(step) if mode == "compiled" else step
        losses[mode] = [float(run(opsnn.tensor(feats)).item()) for _ in range(4)]
    np.testing.assert_allclose(losses["compiled"], losses["eager"], rtol=1e-5)
    assert losses["eager"][-1] < losses["eager"][0]


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"targets": np.array([[1, 0, 2, 3]] * N)}, "sample 0 does not fit"),  # the blank as a label
        ({"targets": np.array([[1, 6, 2, 3]] * N)}, "labels in \\[0, 6\\)"),
        ({"input_lengths": np.array([10, 5, 7, 3])}, "sample 0 does not fit: input length 10 \\(of 9 frames\\)"),
        ({"target_lengths": np.array([5, 2, 3, 0])}, "target length 5"),
        ({"reduction": "avg"}, "reduction must be one of"),
        ({"blank": 6}, "blank 6 is not a class of the 6"),
        ({"targets": np.zeros((N, 4), np.float32)}, "targets must hold integer class labels"),
        ({"input_lengths": np.array([9, 5, 7])}, "input_lengths must have shape \\(N,\\) = \\(4,\\)"),
    ],
)
def test_bad_arguments_are_typed(kw, match):
    args = {"targets": PADDED, "input_lengths": INPUT_LENGTHS, "target_lengths": PAD_LENGTHS, **kw}
    lp = opsnn.ops.log_softmax(opsnn.tensor(LOGITS), -1)
    with pytest.raises((ParamInvalidError, InferShapeError), match=match):
        F.ctc_loss(lp, **args)
    with pytest.raises(ParamInvalidError, match="log_probs must be"):
        F.ctc_loss(opsnn.tensor(LOGITS[None]), PADDED, INPUT_LENGTHS, PAD_LENGTHS)
