"""opsnn::AttentionTrain: a recorded float32 Attention call runs it, keeping each row's logsumexp
for AttentionGrad (no second pass over the keys in the backward). Y and the logsumexp of every
kernel against an explicit float64 softmax; gradients against the float64 composition, torch.autograd
and the backward that recomputes the logsumexp; a spy on the backward kernel shows it is given the
forward's logsumexp, eager and compiled."""

import numpy as np
import pytest

import opsnn
from opsnn import ops
from opsnn.kernels.cpu import attention as KA
from opsnn.kernels.cpu import mkl_nb as MN

RNG = np.random.default_rng(2031)

KERNELS = ["attention_train_gemm", "attention_train_flash", "attention_train_blas"] + (
    ["attention_train_gemm_tiled"] if MN.addresses() is not None else []
)

#: float32 results against float64: sums of tens of O(1) products
RTOL, ATOL = 2e-4, 2e-5


def oracle(q, k, v, allowed, bias, scale, softcap=0.0):
    """Y and the rows' logsumexp (-inf for a row no key may attend) in float64, 4-D inputs."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    B, Hq, Sq, D = q.shape
    Hkv, T = k.shape[1], k.shape[2]
    g = Hq // Hkv
    allowed = np.broadcast_to(allowed, (B, Hq, Sq, T))
    bias = np.broadcast_to(bias, (B, Hq, Sq, T))
    y = np.zeros((B, Hq, Sq, v.shape[3]))
    lse = np.full((B, Hq, Sq), -np.inf)
    for b in range(B):
        for h in range(Hq):
            raw = scale * q[b, h] @ k[b, h // g].T
            s = (softcap * np.tanh(raw / softcap) if softcap else raw) + bias[b, h]
            for i in range(Sq):
                al = allowed[b, h, i]
                if al.any():
                    row = s[i, al]
                    mx = row.max()
                    e = np.exp(row - mx)
                    lse[b, h, i] = mx + np.log(e.sum())
                    y[b, h, i] = (e / e.sum()) @ v[b, h // g][al]
    return y, lse


# (id, B, Hq, Hkv, Sq, T, D, causal, mask maker or None, left, right, softcap)
CASES = [
    ("plain", 2, 2, 2, 5, 7, 4, False, None, -1, -1, 0.0),
    ("causal_gqa", 1, 4, 2, 70, 70, 8, True, None, -1, -1, 0.0),
    ("bool_padding_dead_rows", 2, 2, 1, 9, 12, 5, False, "bool", -1, -1, 0.0),
    ("additive", 1, 2, 2, 10, 13, 6, False, "float", -1, -1, 0.0),
    ("window_softcap", 1, 3, 1, 20, 20, 6, False, None, 3, 2, 1.5),
]


def _case(case):
    _, B, Hq, Hkv, Sq, T, D, causal, mk, left, right, cap = case
    q = RNG.standard_normal((B, Hq, Sq, D)).astype(np.float32)
    k = RNG.standard_normal((B, Hkv, T, D)).astype(np.float32)
    v = RNG.standard_normal((B, Hkv, T, D)).astype(np.float32)
    i, j = np.arange(Sq)[:, None], np.arange(T)[None, :]
    allowed = np.ones((Sq, T), bool)
    if causal:
        allowed &= j <= i
    if left >= 0:
        allowed &= j >= i - left
    if right >= 0:
        allowed &= j <= i + right
    allowed, bias, mask = allowed[None, None], np.zeros((1, 1, 1, T)), None
    if mk == "bool":
        mask = RNG.random((B, 1, Sq, T)) > 0.4
        mask[0, 0, 2] = False  # a row with no key
        allowed = allowed & mask
    elif mk == "float":
        mask = RNG.standard_normal((Sq, T)).astype(np.float32)
        bias = mask.astype(np.float64)[None, None]
    attrs = dict(is_causal=int(causal), left_window_size=left, right_window_size=right, softcap=cap)
    return q, k, v, mask, attrs, oracle(q, k, v, allowed, bias, 1 / np.sqrt(D), cap)


@pytest.mark.parametrize("algo", KERNELS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_kernels_give_y_and_the_logsumexp(case, algo):
    q, k, v, mask, attrs, (y_want, lse_want) = _case(case)
    y, lse = ops.run_op("AttentionTrain", [q, k, v, mask], attrs, domain="opsnn", algo=algo)
    assert lse.shape == q.shape[:3] and lse.dtype == np.float32
    lse = lse.numpy()
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(lse_want))
    fin = np.isfinite(lse_want)
    np.testing.assert_allclose(lse[fin], lse_want[fin], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(y.numpy(), y_want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("algo", KERNELS)
@pytest.mark.parametrize("D", [0, 3], ids=["no_key_dims", "keys"])
def test_an_empty_value_dim_still_gives_the_rows_logsumexp(algo, D):
    """Found by `opsnn fuzz` (nan_inf seeds 1310674-76): with V's last dim 0, Y is empty and the kernels
    stopped before their softmax, leaving every row's logsumexp at -inf; the scores are still there
    (all 0 for zero-length keys: log(T)). A bool padding mask leaves one row no key (-inf)."""
    B, H, Sq, T = 2, 2, 5, 6
    q = RNG.standard_normal((B, H, Sq, D)).astype(np.float32)
    k = RNG.standard_normal((B, H, T, D)).astype(np.float32)
    v = np.zeros((B, H, T, 0), np.float32)
    mask = RNG.random((B, 1, Sq, T)) > 0.3
    mask[1, 0, 3] = False
    y, lse = ops.run_op("AttentionTrain", [q, k, v, mask], {"scale": 0.5}, domain="opsnn", algo=algo)
    assert y.shape == (B, H, Sq, 0)
    _, want = oracle(q, k, np.zeros((B, H, T, 1), np.float32), mask, np.zeros((1, 1, 1, T)), 0.5)
    lse = lse.numpy()
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(lse[fin], want[fin], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", [CASES[1], CASES[3]], ids=[CASES[1][0], CASES[3][0]])
def test_present_kv_outputs_keep_the_streaming_kernels(case):
    # a fourth output of AttentionTrain is present_value (LLaMA asks for it), not the score matrix
    # that only attention_blas materialises: the default choice stays a streaming kernel
    q, k, v, mask, attrs, (y_want, lse_want) = _case(case)
    with opsnn.profiler.profile() as p:
        y, lse, pk, pv = ops.run_op("AttentionTrain", [q, k, v, mask], attrs, domain="opsnn", num_outputs=4)
    assert [e.kernel for e in p.kernels if e.op == "AttentionTrain"] != ["attention_train_blas"]
    fin = np.isfinite(lse_want)
    np.testing.assert_allclose(lse.numpy()[fin], lse_want[fin], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(y.numpy(), y_want, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(pk.numpy(), k)
    np.testing.assert_array_equal(pv.numpy(), v)
    for algo in KERNELS:  # every kernel gives the present K/V too
        outs = ops.run_op("AttentionTrain", [q, k, v, mask], attrs, domain="opsnn", num_outputs=4, algo=algo)
        np.testing.assert_allclose(outs[0].numpy(), y_want, rtol=RTOL, atol=ATOL)
        np.testing.assert_array_equal(outs[3].numpy(), v)


class _Spy:
    """Records whether each call of the backward kernel was given a logsumexp (its 6th argument)."""

    def __init__(self, monkeypatch):
        self.given = []
        real = KA.attention_backward

        def spy(*args):
            self.given.append(args[5] is not None)
            return real(*args)

        monkeypatch.setattr(KA, "attention_backward", spy)


def _grads(arrays, dtype, mask, **kw):
    q, k, v = (opsnn.tensor(a.astype(dtype)).requires_grad_() for a in arrays[:3])
    y = ops.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
    ops.sum(ops.mul(y, opsnn.tensor(arrays[3].astype(dtype)))).backward()
    return y, [t.grad.numpy() for t in (q, k, v)]


def test_recorded_call_keeps_the_logsumexp_and_the_backward_reads_it(monkeypatch):
    B, Hq, Hkv, Sq, T, D = 2, 4, 2, 9, 12, 5
    arrays = [RNG.standard_normal(s) for s in [(B, Hq, Sq, D), (B, Hkv, T, D), (B, Hkv, T, D), (B, Hq, Sq, D)]]
    mask = RNG.random((B, 1, Sq, T)) > 0.3
    mask[1, 0, 4] = False
    spy = _Spy(monkeypatch)
    y, got = _grads(arrays, np.float32, mask, enable_gqa=True)
    assert y.grad_fn.name == "AttentionTrain"
    assert spy.given == [True]
    # the float64 rule is the registry-op composition (an independent path)
    _, want = _grads(arrays, np.float64, mask, enable_gqa=True)
    for a, w in zip(got, want):
        np.testing.assert_allclose(a, w, rtol=RTOL, atol=ATOL)
    # the same backward op recomputing the logsumexp gives the same gradients
    q, k, v, dy = (a.astype(np.float32) for a in arrays)
    again = ops.attention_backward(dy, q, k, v, y.detach(), mask, None)
    assert spy.given == [True, False]
    for a, w in zip(got, again):
        np.testing.assert_allclose(a, w.numpy(), rtol=1e-5, atol=1e-6)


def test_unrecorded_and_float64_calls_stay_attention():
    q = opsnn.tensor(RNG.standard_normal((1, 2, 4, 3)).astype(np.float32))
    assert ops.scaled_dot_product_attention(q, q, q).grad_fn is None  # nothing requires grad
    for dt in (np.float32, np.float64):
        t = opsnn.tensor(RNG.standard_normal((1, 2, 4, 3)).astype(dt)).requires_grad_()
        with opsnn.no_grad():
            assert ops.scaled_dot_product_attention(t, t, t).grad_fn is None
    t64 = opsnn.tensor(RNG.standard_normal((1, 2, 4, 3))).requires_grad_()
    assert ops.scaled_dot_product_attention(t64, t64, t64).grad_fn.name == "Attention"
    # the present key/value (a model that keeps a cache) come from AttentionTrain too; the
    # score matrix output only from Attention
    t = opsnn.tensor(RNG.standard_normal((1, 2, 4, 3)).astype(np.float32)).requires_grad_()
    u = opsnn.tensor(RNG.standard_normal((1, 2, 4, 3)).astype(np.float32)).requires_grad_()
    y, pk, pv = ops.attention(t, t, u, num_outputs=3)
    assert y.grad_fn.name == "AttentionTrain"
    np.testing.assert_array_equal(pk.numpy(), t.detach().numpy())
    np.testing.assert_array_equal(pv.numpy(), u.detach().numpy())
    assert ops.attention(t, t, t, num_outputs=4)[0].grad_fn.name == "Attention"


def test_matches_torch_autograd():
    torch = pytest.importorskip("torch")
    B, H, Sq, T, D = 2, 3, 10, 10, 8
    arrays = [RNG.standard_normal(s) for s in [(B, H, Sq, D), (B, H, T, D), (B, H, T, D), (B, H, Sq, D)]]
    _, got = _grads(arrays, np.float32, None, is_causal=True)
    tq, tk, tv = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays[:3])
    y = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    (y * torch.tensor(arrays[3])).sum().backward()
    for a, w in zip(got, (tq.grad, tk.grad, tv.grad)):
        np.testing.assert_allclose(a, w.numpy(), rtol=RTOL, atol=ATOL)


def test_compiled_step_wires_the_forward_logsumexp_into_the_backward(monkeypatch):
    from opsnn import nn, optim

    B, S, E, H = 2, 8, 12, 3
    batches = [RNG.standard_normal((B, S, E)).astype(np.float32) for _ in range(3)]

    def run(compiled):
        with nn.init.seeded(7):
            proj = nn.Linear(E, 3 * E)
        opt = optim.SGD(list(proj.parameters()), lr=0.05)

        def step(x):
            opt.zero_grad()
            q, k, v = ops.split(proj(x), [E, E, E], dim=2)
            y = ops.attention(q, k, v, is_causal=True, q_num_heads=H, kv_num_heads=H)
            loss = ops.sum(ops.mul(y, y))
            loss.backward()
            opt.step()
            return loss

        fn = opsnn.compile(step) if compiled else step
        losses = [float(fn(opsnn.tensor(x)).item()) for x in batches]
        return losses, proj.weight.numpy().copy(), (fn.graph() if compiled else None)

    spy = _Spy(monkeypatch)
    el, ew, _ = run(False)
    assert spy.given == [True] * len(batches)
    cl, cw, graph = run(True)
    fwd = [n for n in graph.nodes if n.op_type == "AttentionTrain"]
    bwd = [n for n in graph.nodes if n.op_type == "AttentionGrad"]
    assert len(fwd) == 1 and len(bwd) == 1 and "Attention" not in [n.op_type for n in graph.nodes]
    assert len(bwd[0].inputs) == 7 and bwd[0].inputs[6] == fwd[0].outputs[1]
    np.testing.assert_allclose(cl, el, rtol=1e-5)
    np.testing.assert_allclose(cw, ew, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("algo", KERNELS)
def test_non_finite_rows_give_a_nan_logsumexp(algo):
    """A row whose scores hold NaN or +inf (inf - inf in its softmax) has a NaN logsumexp, as the
    backward's own recomputation gives; the other rows keep theirs."""
    q, k = RNG.standard_normal((1, 1, 4, 3)).astype(np.float32), RNG.standard_normal((1, 1, 5, 3)).astype(np.float32)
    k[0, 0, :, 0] = np.abs(k[0, 0, :, 0]) + 0.1  # q's +inf meets positive keys only: +inf scores
    q[0, 0, 1, 0], q[0, 0, 2, 1] = np.inf, np.nan
    _, lse = ops.run_op("AttentionTrain", [q, k, k, None], {}, domain="opsnn", algo=algo)
    _, want = oracle(q[:, :, [0, 3]], k, k, np.ones((1, 1, 1, 5), bool), np.zeros((1, 1, 1, 5)), 1 / np.sqrt(3))
    got = lse.numpy()[0, 0]
    assert np.isnan(got[1]) and np.isnan(got[2])
    np.testing.assert_allclose(got[[0, 3]], want[0, 0], rtol=RTOL, atol=ATOL)
