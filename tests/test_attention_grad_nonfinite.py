"""opsnn::AttentionGrad with NaN and Inf inputs: NaN where the float64 definition has NaN, +-Inf where it
has +-Inf, the finite rest within float32 tolerance, for both kernels (the numba loops and MKL).

The oracle is the definition read with whole-matrix float64 products, as torch's math SDPA computes
them: S = scale Q K^T (softcapped, mask added, masked pairs -inf), P = softmax(S) per row (exp(S - lse)
when the logsumexp is given; 0 on a row no key may attend), dS = P (dY V^T - rowsum(dY Y)) softcap'
on attended pairs and 0 on masked ones, dQ = scale dS K, dK = scale dS^T Q, dV = P^T dY. Its zeros
still meet every key and query in the products (0 x Inf = NaN), and a NaN softmax row is NaN on its
masked pairs too: the flash tiles skip key blocks and zero masked pairs, so these cases pin the exact
path the kernels take when an input is not finite (each pattern below failed before it)."""

import numpy as np
import pytest

from opsnn import ops
from opsnn.kernels.cpu import attention as KA
from opsnn.kernels.cpu import mkl_nb as MN

KERNELS = ["attention_grad_flash"] + (["attention_grad_flash_mkl"] if MN.addresses() is not None else [])

#: float32 against float64 on the finite entries: sums of at most a few hundred O(1) products
RTOL, ATOL = 2e-4, 2e-5


def oracle(dy, q, k, v, y, *, causal=False, softcap=0.0, scale=None, bias=None, lse=None):
    """dQ, dK, dV in float64 by whole-matrix products; 4-D (B, H, S, D) inputs, ``bias`` an additive
    (Sq, T) mask (-inf: masked), ``lse`` (B, Hq, Sq) or None."""
    dy, q, k, v, y = (a.astype(np.float64) for a in (dy, q, k, v, y))
    B, Hq, Sq, D = q.shape
    Hkv, T = k.shape[1], k.shape[2]
    sc = 1 / np.sqrt(D) if scale is None else scale
    allowed = np.ones((Sq, T), bool)
    if causal:
        allowed &= np.arange(T)[None, :] <= np.arange(Sq)[:, None]
    if bias is not None:
        allowed &= ~np.isneginf(bias)
    live = allowed.any(axis=1)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    with np.errstate(all="ignore"):
        for b in range(B):
            for h in range(Hq):
                hk = h // (Hq // Hkv)
                raw = sc * (q[b, h] @ k[b, hk].T)
                t = np.tanh(raw / softcap) if softcap else None
                s = softcap * t if softcap else raw
                s = np.where(allowed, s + (0 if bias is None else bias), -np.inf)
                if lse is None:
                    top = np.max(s, axis=1, keepdims=True)  # NaN where the row holds one
                    e = np.exp(s - top)
                    p = e / e.sum(axis=1, keepdims=True)
                else:
                    p = np.exp(s - lse[b, h].astype(np.float64)[:, None])
                p[~live] = 0.0
                dp = dy[b, h] @ v[b, hk].T
                ds = p * (dp - (dy[b, h] * y[b, h]).sum(axis=1, keepdims=True)) * ((1 - t * t) if softcap else 1.0)
                ds[~allowed] = 0.0
                dq[b, h] = sc * (ds @ k[b, hk])
                dk[b, hk] += sc * (ds.T @ q[b, h])
                dv[b, hk] += p.T @ dy[b, h]
    return dq, dk, dv


def forward(q, k, v, **kw):
    """Y of softmax attention (no softcap) in float64, as float32: what a training step hands the
    backward, near enough (the op is defined with the Y it is given)."""
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    D, T, Sq = q.shape[3], k.shape[2], q.shape[2]
    g = q.shape[1] // k.shape[1]
    s = (q64 / np.sqrt(D)) @ np.repeat(k64, g, axis=1).swapaxes(-1, -2)
    if kw.get("causal"):
        s = np.where(np.arange(T)[None, :] <= np.arange(Sq)[:, None], s, -np.inf)
    with np.errstate(all="ignore"):
        e = np.exp(s - s.max(-1, keepdims=True))
        return ((e / e.sum(-1, keepdims=True)) @ np.repeat(v64, g, axis=1)).astype(np.float32)


def assert_same(got, want, what):
    """NaN, +Inf and -Inf at the same positions; finite entries close."""
    got, want = np.asarray(got, np.float64), np.asarray(want)
    for name, fn in (("NaN", np.isnan), ("+Inf", np.isposinf), ("-Inf", np.isneginf)):
        diff = np.argwhere(fn(got) != fn(want))
        assert not diff.size, (
            f"{what}: {name} differs at {diff[:4].tolist()} ({int(fn(got).sum())} vs {int(fn(want).sum())})"
        )
    fin = np.isfinite(want)
    scale = max(1.0, float(np.abs(want[fin]).max(initial=0.0)))
    np.testing.assert_allclose(got[fin], want[fin], rtol=RTOL, atol=ATOL * scale, err_msg=what)


def run(algo, dy, q, k, v, y, *, causal=False, softcap=0.0, scale=None, mask=None, lse=None):
    res = ops.attention_backward(dy, q, k, v, y, mask, lse, is_causal=causal, softcap=softcap, scale=scale, algo=algo)
    got = [r.numpy() for r in res]
    bias = None if mask is None else np.asarray(mask, np.float64)
    want = oracle(dy, q, k, v, y, causal=causal, softcap=softcap, scale=scale, bias=bias, lse=lse)
    for g, w, name in zip(got, want, ("dQ", "dK", "dV")):
        assert_same(g, w, f"{algo} {name}")
    return got, want


def inputs(seed, B=1, Hq=2, Hkv=1, Sq=70, T=70, D=4, Dv=3):
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((B, h, s, D)).astype(np.float32) for h, s in ((Hq, Sq), (Hkv, T)))
    v = rng.standard_normal((B, Hkv, T, Dv)).astype(np.float32)
    dy = rng.standard_normal((B, Hq, Sq, Dv)).astype(np.float32)
    return dy, q, k, v


@pytest.mark.parametrize("algo", KERNELS)
def test_inf_key_past_the_causal_frontier_under_softcap(algo):
    """Softcap 1: an infinite key's capped score is finite with derivative 0, and the keys past the
    causal frontier are masked for the first query block; the definition's dS K still has 0 x Inf = NaN
    in that feature of every row's dQ (the tiles skipped that key block)."""
    dy, q, k, v = inputs(1)
    k[0, 0, 66, 2] = np.inf
    y = forward(q, k, v, causal=True)
    (dq, _, _), (want, _, _) = run(algo, dy, q, k, v, y, causal=True, softcap=1.0)
    assert np.isnan(want[..., 2]).all() and np.isnan(dq[0, :, :64, 2]).all()


@pytest.mark.parametrize("algo", KERNELS)
def test_nan_query_row_is_nan_on_its_masked_pairs(algo):
    """Causal, a NaN in query row 3: that row's softmax is NaN on every pair, masked ones included, so
    every key's dV is NaN, and 0 x NaN puts NaN in that feature of every key's dK (keys 64-69 sit in a
    block query block 0 never visits)."""
    dy, q, k, v = inputs(2)
    q[0, 1, 3, 0] = np.nan
    y = forward(q, k, v, causal=True)
    (_, dk, dv), (_, want_k, want_v) = run(algo, dy, q, k, v, y, causal=True)
    assert np.isnan(want_v).all() and np.isnan(want_k[0, 0, :, 0]).all() and np.isfinite(want_k[0, 0, 4:, 1:]).all()
    assert np.isnan(dv[0, 0, 64:]).all()


@pytest.mark.parametrize("algo", KERNELS)
def test_inf_grad_output_meets_zero_probabilities(algo):
    """Causal, +Inf in dY at row 5: P^T dY multiplies the row's zero probabilities of keys 6-69 by it
    (NaN), the attended keys get Inf or NaN by the definition's own arithmetic."""
    dy, q, k, v = inputs(3)
    y = forward(q, k, v, causal=True)
    dy[0, 0, 5, 1] = np.inf
    (_, _, dv), (_, _, want) = run(algo, dy, q, k, v, y, causal=True)
    assert np.isnan(want[0, 0, 6:, 1]).all() and not np.isnan(want[0, 0, :, 0]).any()
    assert np.isnan(dv[0, 0, 64:, 1]).all()


@pytest.mark.parametrize("algo", KERNELS)
@pytest.mark.parametrize("poison", [np.nan, np.inf], ids=["nan", "posinf"])
def test_nan_or_inf_in_the_mask_makes_the_row_nan_everywhere(algo, poison):
    """An additive mask with NaN (or +Inf: the row's max is +Inf, exp(Inf - Inf)) at one attended pair
    of row 2, -inf (masked) at others: row 2's softmax is NaN on its masked pairs too, so every key's
    dV is NaN; a -inf alone (a masked pair) stays on the fast path and out of the products."""
    dy, q, k, v = inputs(4, Sq=6, T=9)
    rng = np.random.default_rng(5)
    mask = rng.standard_normal((6, 9)).astype(np.float32)
    mask[:, 7] = -np.inf
    mask[2, 4] = poison
    y = forward(q, k, v)
    (_, _, dv), (_, _, want) = run(algo, dy, q, k, v, y, mask=mask)
    assert np.isnan(want).all() and np.isnan(dv[0, 0, 7]).all()


@pytest.mark.parametrize("algo", KERNELS)
def test_softcap_derivative_below_float32_keeps_inf(algo):
    """A softcapped score of 12 (cap 1): tanh is 1 in float32, so its derivative 1 - t^2 would be 0 and
    meet the Inf from dY as NaN; in float64 it is 1.5e-10 and dS, dQ, dK are +Inf, as here."""
    q = np.full((1, 1, 1, 1), 4.0, np.float32)
    k = np.full((1, 1, 1, 1), 3.0, np.float32)
    v = np.ones((1, 1, 1, 1), np.float32)
    y = np.full((1, 1, 1, 1), -1.0, np.float32)  # the op is defined with the Y it is given
    dy = np.full((1, 1, 1, 1), np.inf, np.float32)
    got, want = run(algo, dy, q, k, v, y, softcap=1.0, scale=1.0)
    assert all(np.isposinf(w).all() for w in want) and all(np.isposinf(g).all() for g in got)


@pytest.mark.parametrize("algo", KERNELS)
def test_given_logsumexp_defines_the_probabilities(algo):
    """P = exp(S - lse) with the logsumexp given: a drawn (not the forward's) one on finite inputs gives
    the definition's values; a NaN one makes its row NaN on every pair (masked ones: exp(-inf - NaN)),
    a -inf one on a row that attends keys makes its probabilities +Inf, and on a row no key may
    attend leaves them 0."""
    dy, q, k, v = inputs(6, Sq=5, T=7, Hq=2, Hkv=2)
    y = forward(q, k, v)
    rng = np.random.default_rng(7)
    lse = rng.standard_normal((1, 2, 5)).astype(np.float32)
    run(algo, dy, q, k, v, y, lse=lse)
    lse[0, 0, 1], lse[0, 1, 3] = np.nan, -np.inf
    mask = np.zeros((5, 7), np.float32)
    mask[4] = -np.inf  # row 4: no key
    lse[0, 0, 4] = -np.inf
    (_, _, dv), (_, _, want) = run(algo, dy, q, k, v, y, lse=lse, mask=mask)
    assert np.isnan(want[0, 0]).all() and np.isinf(want[0, 1]).all()


def finite_tasks(q, k, v, y, dy, lse, mask, softcap=0.0):
    """(B, Hkv) booleans: which (batch, KV head) tasks keep the fast tiles."""
    B, Hq, Sq, D = q.shape
    Hkv, T, Dv = k.shape[1], k.shape[2], v.shape[3]
    has_lse, has_mask = lse is not None, mask is not None
    lse = lse if has_lse else np.zeros((1, 1, 1), np.float32)
    mask = mask if has_mask else np.zeros((1, 1, 1, 1), np.float32)
    bits = KA.scan_bits(q, k, v, y, dy, lse, mask)
    return np.array(
        [
            [
                KA._task_finite(bits, b, hk, Hq, Hkv, Sq, T, D, Dv, has_lse, mask.shape, has_mask, softcap)
                for hk in range(Hkv)
            ]
            for b in range(B)
        ]
    )


def test_only_tasks_with_non_finite_inputs_take_the_exact_path():
    """The scan, per (batch, KV head) task: finite inputs and -inf in the mask keep the fast tiles; a
    NaN or an Inf in its heads' Q, dY or logsumexp rows, its K, NaN / +Inf in its mask planes, or (with
    a softcap) its V or Y does not, and only that task leaves them."""
    rng = np.random.default_rng(8)
    B, Hq, Hkv, S, D = 2, 4, 2, 5, 3
    q, y, dy = (rng.standard_normal((B, Hq, S, D)).astype(np.float32) for _ in range(3))
    k, v = (rng.standard_normal((B, Hkv, S, D)).astype(np.float32) for _ in range(2))
    lse = rng.standard_normal((B, Hq, S)).astype(np.float32)
    mask = rng.standard_normal((B, Hq, S, S)).astype(np.float32)
    mask[..., 3] = -np.inf
    base = dict(q=q, k=k, v=v, y=y, dy=dy, lse=lse, mask=mask)
    assert finite_tasks(**base).all() and finite_tasks(**dict(base, lse=None, mask=None)).all()
    # (input, index of the poisoned element's (batch, head), the task it belongs to)
    spots = [("q", (1, 3), (1, 1)), ("dy", (0, 1), (0, 0)), ("k", (0, 1), (0, 1)), ("lse", (1, 0), (1, 0))]
    spots += [("mask", (1, 2), (1, 1))]
    for name, (b, h), task in spots:
        for bad in (np.nan, np.inf, -np.inf):
            if name == "mask" and bad == -np.inf:
                continue
            arrs = dict(base)
            arrs[name] = arrs[name].copy()
            arrs[name][b, h].reshape(-1)[2] = bad
            want = np.ones((B, Hkv), bool)
            want[task] = False
            assert (finite_tasks(**arrs) == want).all(), (name, bad)
    for name in ("v", "y"):
        arrs = dict(base, **{name: base[name].copy()})
        arrs[name][1, 1, 0, 0] = np.inf
        assert finite_tasks(**arrs).all()  # no softcap: V and Y meet no masked pair's zero
        want = np.ones((B, Hkv), bool)
        want[1, 1 if name == "v" else 0] = False
        assert (finite_tasks(**arrs, softcap=1.0) == want).all(), name
    shared = np.zeros((1, 1, S, S), np.float32)
    shared[0, 0, 1, 1] = np.nan  # a mask plane every task reads
    assert not finite_tasks(**dict(base, mask=shared)).any()
