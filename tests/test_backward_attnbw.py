"""opsnn::AttentionGrad (flash-style attention backward) and Attention's gradient rule: dQ, dK, dV
against an explicit float64 softmax-attention backward, the float64 registry-op composition and
torch.autograd -- causal/non-causal, GQA, masks, Sq != T, odd head dims, fully masked rows, NaN
inputs, 16-bit, split partials, typed errors.

Semantics under test (the oracle's): a masked (query, key) pair has probability and gradient
exactly 0, whatever V holds there; a row no key may attend has Y = 0, so its dQ is 0 and it gives
nothing to dK/dV; a NaN reaching a row's scores makes that row's probabilities NaN. (A NaN or Inf in
Q, K or dY also meets the masked pairs' zeros in the definition's products, 0 x NaN: pinned in
tests/test_attention_grad_nonfinite.py, see GRAD_NONFINITE.)"""

import ml_dtypes
import numpy as np
import pytest

import opsnn
from opsnn import ops
from opsnn.errors import DTypeError, InferShapeError, ParamInvalidError
from opsnn.kernels.cpu import attention as KA
from opsnn.kernels.cpu import mkl_nb as MN

RNG = np.random.default_rng(31)

KERNELS = ["attention_grad_flash"] + (["attention_grad_flash_mkl"] if MN.addresses() is not None else [])

#: float32 results against the float64 oracle: sums of a few hundred products of O(1) terms
RTOL, ATOL = 2e-4, 2e-5


# -- independent oracle ------------------------------------------------------------------------------
def allowed_pairs(Sq, T, causal=False, left=-1, right=-1):
    """(Sq, T) booleans: key j may be attended by query i (no KV cache: query i sits at key i)."""
    ok = np.ones((Sq, T), bool)
    for i in range(Sq):
        for j in range(T):
            if (causal and j > i) or (left >= 0 and j < i - left) or (right >= 0 and j > i + right):
                ok[i, j] = False
    return ok


def oracle(q, k, v, dy, allowed, bias=None, scale=None, softcap=0.0):
    """dQ, dK, dV of softmax attention in float64, one (batch, head) at a time, summing over the
    attended pairs only. q (B, Hq, Sq, D), k/v (B, Hkv, T, D|Dv), dy (B, Hq, Sq, Dv); allowed
    boolean and bias additive, both broadcastable to (B, Hq, Sq, T)."""
    q, k, v, dy = (a.astype(np.float64) for a in (q, k, v, dy))
    B, Hq, Sq, D = q.shape
    Hkv, T = k.shape[1], k.shape[2]
    sc = 1 / np.sqrt(D) if scale is None else scale
    allowed = np.broadcast_to(allowed, (B, Hq, Sq, T))
    bias = np.zeros((B, Hq, Sq, T)) if bias is None else np.broadcast_to(bias, (B, Hq, Sq, T))
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    g = Hq // Hkv
    with np.errstate(invalid="ignore", over="ignore"):
        for b in range(B):
            for h in range(Hq):
                hk, al = h // g, allowed[b, h]
                raw = sc * q[b, h] @ k[b, hk].T
                t = np.tanh(raw / softcap) if softcap else None
                s = (softcap * t if softcap else raw) + bias[b, h]
                p = np.zeros((Sq, T))
                for i in range(Sq):
                    if al[i].any():
                        row = s[i, al[i]]
                        e = np.exp(row - row.max())
                        p[i, al[i]] = e / e.sum()
                dp = dy[b, h] @ v[b, hk].T
                delta = np.where(al, p * dp, 0).sum(1, keepdims=True)
                ds = np.where(al, p * (dp - delta) * ((1 - t * t) if softcap else 1), 0)
                pairs = al[:, :, None]
                dq[b, h] = sc * np.where(pairs, ds[:, :, None] * k[b, hk][None], 0).sum(1)
                dk[b, hk] += sc * np.where(pairs, ds[:, :, None] * q[b, h][:, None], 0).sum(0)
                dv[b, hk] += np.where(pairs, p[:, :, None] * dy[b, h][:, None], 0).sum(0)
    return dq, dk, dv


def mask_parts(mask, T):
    """A forward attn_mask as (allowed, additive bias), both rank 4; a short mask masks the rest."""
    m4 = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    inside = np.zeros(m4.shape[:3] + (T,), bool)
    inside[..., : m4.shape[3]] = True
    if m4.dtype == np.bool_:
        full = np.zeros(m4.shape[:3] + (T,), bool)
        full[..., : m4.shape[3]] = m4
        return full, None
    bias = np.full(m4.shape[:3] + (T,), -np.inf)
    bias[..., : m4.shape[3]] = m4
    return inside & ~np.isneginf(bias), np.where(inside, bias, 0)


def to4(x, heads):
    return x.reshape(x.shape[0], x.shape[1], heads, -1).transpose(0, 2, 1, 3) if x.ndim == 3 else x


def to3(x):
    return x.transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[2], -1)


# (id, B, Hq, Hkv, Sq, T, D, Dv, causal, mask maker (rng, B, Hq, Sq, T) or None, extra attributes)
CASES = [
    ("plain", 2, 2, 2, 5, 7, 3, 4, False, None, {}),
    ("causal_gqa_tiles", 1, 4, 2, 70, 70, 16, 8, True, None, {}),
    ("causal_sq_lt_t", 2, 2, 1, 9, 130, 5, 6, True, None, {}),
    ("causal_sq_gt_t", 1, 2, 2, 67, 20, 5, 3, True, None, {}),
    ("bool_key_padding", 2, 4, 2, 33, 40, 7, 7, False, lambda r, B, H, S, T: r.random((B, 1, 1, T)) > 0.3, {}),
    ("additive_full", 1, 2, 1, 20, 67, 9, 5, False, lambda r, B, H, S, T: r.standard_normal((B, H, S, T)), {}),
    ("short_bool_2d", 1, 2, 2, 6, 10, 4, 4, False, lambda r, B, H, S, T: r.random((S, 7)) > 0.4, {}),
    ("additive_neginf", 2, 1, 1, 8, 9, 3, 3, True, lambda r, B, H, S, T: np.where(r.random(T) > 0.3, 0.5, -np.inf), {}),
    ("window_softcap_scale", 1, 3, 1, 40, 40, 6, 6, False, None, dict(left=5, right=2, softcap=1.5, scale=0.3)),
    ("one_key", 2, 2, 1, 3, 1, 4, 2, False, None, {}),
    ("long_parallel_splits", 1, 4, 1, 130, 150, 16, 8, True, lambda r, B, H, S, T: r.standard_normal(T), {}),
    ("3d_gqa_causal", 2, 4, 2, 11, 11, 6, 3, True, None, dict(rank=3)),
    ("3d_mask", 2, 2, 1, 7, 9, 5, 5, False, lambda r, B, H, S, T: r.random((B, 1, S, T)) > 0.2, dict(rank=3)),
    ("plain_ragged_tiles_3d", 1, 2, 1, 70, 130, 8, 5, False, None, dict(rank=3)),
]


def _make(case, dtype=np.float32):
    _, B, Hq, Hkv, Sq, T, D, Dv, causal, mk, extra = case
    q = RNG.standard_normal((B, Hq, Sq, D))
    k = RNG.standard_normal((B, Hkv, T, D))
    v = RNG.standard_normal((B, Hkv, T, Dv))
    dy = RNG.standard_normal((B, Hq, Sq, Dv))
    mask = None if mk is None else mk(RNG, B, Hq, Sq, T)
    if mask is not None and mask.dtype != np.bool_:
        mask = mask.astype(dtype)
    q, k, v, dy = (a.astype(dtype) for a in (q, k, v, dy))
    attrs = dict(
        is_causal=causal,
        scale=extra.get("scale"),
        softcap=extra.get("softcap", 0.0),
        left_window_size=extra.get("left", -1),
        right_window_size=extra.get("right", -1),
    )
    if extra.get("rank") == 3:
        attrs.update(q_num_heads=Hq, kv_num_heads=Hkv)
    return q, k, v, dy, mask, attrs, extra.get("rank", 4)


def _expected(q, k, v, dy, mask, attrs):
    T = k.shape[2]
    ok = allowed_pairs(q.shape[2], T, attrs["is_causal"], attrs["left_window_size"], attrs["right_window_size"])
    allowed, bias = ok[None, None], None
    if mask is not None:
        m_ok, bias = mask_parts(mask, T)
        allowed = allowed & m_ok
    return oracle(q, k, v, dy, allowed, bias, attrs["scale"], attrs["softcap"])


def _close(got, want, rtol=RTOL, atol=ATOL, what=""):
    scale = max(1.0, float(np.nanmax(np.abs(want)))) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * scale, err_msg=what)


def _backward(q, k, v, dy, mask, attrs, rank, algo=None, lse=None, forward=None):
    """Forward Y (the Attention op, kernel ``forward``), then AttentionGrad; returns 4-D dQ, dK, dV."""
    Hq, Hkv = q.shape[1], k.shape[1]
    args = (q, k, v, dy) if rank == 4 else tuple(to3(a) for a in (q, k, v, dy))
    fwd = {n: attrs[n] for n in attrs}
    y = ops.attention(*args[:3], mask, algo=forward, **fwd).numpy()
    res = ops.attention_backward(args[3], *args[:3], y, mask, lse, algo=algo, **fwd)
    return [r.numpy() if rank == 4 else to4(r.numpy(), h) for r, h in zip(res, (Hq, Hkv, Hkv))]


@pytest.mark.parametrize("algo", KERNELS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gradients_match_the_float64_oracle(case, algo):
    q, k, v, dy, mask, attrs, rank = _make(case)
    got = _backward(q, k, v, dy, mask, attrs, rank, algo=algo)
    for g, w, name in zip(got, _expected(q, k, v, dy, mask, attrs), "QKV"):
        assert np.isfinite(g).all(), f"d{name} has non-finite values"
        _close(g, w, what=f"d{name}")


def test_fully_masked_rows_give_zero_and_no_nan():
    """Rows whose mask allows no key (and a row cut off by a short mask) have Y = 0: dQ 0 there."""
    B, H, Sq, T, D = 1, 2, 6, 8, 4
    q, k, v, dy = (
        RNG.standard_normal(s).astype(np.float32) for s in [(B, H, Sq, D), (B, H, T, D), (B, H, T, D), (B, H, Sq, D)]
    )
    mask = RNG.random((B, H, Sq, T)) > 0.4
    mask[0, 0, 2] = False
    mask[0, 1, [0, 5]] = False
    attrs = dict(is_causal=False, scale=None, softcap=0.0, left_window_size=-1, right_window_size=-1)
    for algo in KERNELS:
        dq, dk, dv = _backward(q, k, v, dy, mask, attrs, 4, algo=algo)
        assert np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()
        assert not dq[0, 0, 2].any() and not dq[0, 1, [0, 5]].any()
        for g, w in zip((dq, dk, dv), _expected(q, k, v, dy, mask, attrs)):
            _close(g, w)
    # an additive mask of -inf everywhere: every row dead, every gradient 0
    dead = np.full((Sq, T), -np.inf, np.float32)
    dq, dk, dv = _backward(q, k, v, dy, dead, attrs, 4)
    assert not dq.any() and not dk.any() and not dv.any()


@pytest.mark.parametrize("algo", KERNELS)
def test_nan_in_q_spreads_like_the_oracle(algo):
    """No mask: a NaN in one query row makes that row's dQ and every dK, dV of its KV head NaN;
    the other rows' dQ stay finite and right."""
    B, Hq, Hkv, Sq, T, D = 1, 2, 1, 5, 6, 3
    q, k, v, dy = (
        RNG.standard_normal(s).astype(np.float32)
        for s in [(B, Hq, Sq, D), (B, Hkv, T, D), (B, Hkv, T, D), (B, Hq, Sq, D)]
    )
    q[0, 1, 3, 2] = np.nan
    attrs = dict(is_causal=False, scale=None, softcap=0.0, left_window_size=-1, right_window_size=-1)
    got = _backward(q, k, v, dy, None, attrs, 4, algo=algo)
    want = _expected(q, k, v, dy, None, attrs)
    assert np.isnan(want[0][0, 1, 3]).all() and np.isfinite(want[0][0, 0]).all()
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        _close(np.nan_to_num(g), np.nan_to_num(w))


@pytest.mark.parametrize("algo", KERNELS)
def test_nan_in_v_does_not_cross_a_masked_pair(algo):
    """Causal: a NaN in V at key j reaches the rows i >= j that attend it, never the rows before
    (given a Y that keeps the same rule: the flash forward's; the BLAS forwards multiply the
    probabilities' zeros by the NaN inside a causal block)."""
    B, H, S, D, j = 1, 2, 70, 4, 40
    q, k, v, dy = (RNG.standard_normal((B, H, S, D)).astype(np.float32) for _ in range(4))
    v[0, 1, j, 0] = np.nan
    attrs = dict(is_causal=True, scale=None, softcap=0.0, left_window_size=-1, right_window_size=-1)
    got = _backward(q, k, v, dy, None, attrs, 4, algo=algo, forward="attention_flash")
    want = _expected(q, k, v, dy, None, attrs)
    assert np.isfinite(want[0][0, 1, :j]).all() and np.isnan(want[0][0, 1, j:]).all()
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        _close(np.nan_to_num(g), np.nan_to_num(w))


@pytest.mark.parametrize("Sq, T", [(0, 5), (4, 0)])
def test_empty_queries_or_keys_give_zero_gradients(Sq, T):
    q, k, v = np.ones((1, 2, Sq, 3), np.float32), np.ones((1, 1, T, 3), np.float32), np.ones((1, 1, T, 2), np.float32)
    y = ops.attention(q, k, v).numpy()
    got = ops.attention_backward(np.ones_like(y), q, k, v, y)
    for g, like in zip(got, (q, k, v)):
        assert g.shape == like.shape and not g.numpy().any()


@pytest.mark.parametrize("algo", KERNELS)
def test_unmasked_fast_path_keeps_the_general_paths_non_finite_rules(algo):
    """Without masks or softcap the kernel takes a loop with no per-pair cases; a zero additive mask
    forces the general one. Both agree, NaN for NaN, where K holds an inf (scores of +-inf, rows whose
    logsumexp is inf or NaN) and over ragged tiles."""
    B, H, Sq, T, D = 1, 2, 67, 70, 4
    q, k, v, dy = (
        RNG.standard_normal(s).astype(np.float32) for s in [(B, H, Sq, D), (B, H, T, D), (B, H, T, D), (B, H, Sq, D)]
    )
    k[0, 0, 5, 1] = np.inf  # head 0: scores of +inf and -inf (by q's sign), NaN rows; head 1 finite
    attrs = dict(is_causal=False, scale=None, softcap=0.0, left_window_size=-1, right_window_size=-1)
    y = ops.attention(q, k, v).numpy()
    fast = ops.attention_backward(dy, q, k, v, y, None, algo=algo, **attrs)
    general = ops.attention_backward(dy, q, k, v, y, np.zeros((Sq, T), np.float32), algo=algo, **attrs)
    for f, g in zip(fast, general):
        f, g = f.numpy(), g.numpy()
        assert np.isnan(f[0, 0]).any() and np.isfinite(f[0, 1]).all()
        np.testing.assert_array_equal(np.isnan(f), np.isnan(g))
        np.testing.assert_allclose(np.nan_to_num(f), np.nan_to_num(g), rtol=1e-5, atol=1e-5)


def test_given_logsumexp_gives_the_same_gradients():
    q, k, v, dy, mask, attrs, rank = _make(CASES[4])
    T = k.shape[2]
    ok, _ = mask_parts(mask, T)
    s = (q.astype(np.float64) / np.sqrt(q.shape[3])) @ np.repeat(k, 2, axis=1).astype(np.float64).swapaxes(-1, -2)
    s = np.where(ok, s, -np.inf)
    mx = s.max(-1, keepdims=True)
    lse = (mx + np.log(np.exp(s - mx).sum(-1, keepdims=True)))[..., 0].astype(np.float32)
    for algo in KERNELS:
        got = _backward(q, k, v, dy, mask, attrs, rank, algo=algo, lse=lse)
        for g, w in zip(got, _expected(q, k, v, dy, mask, attrs)):
            _close(g, w)


@pytest.mark.parametrize("parallel", [False, True])
def test_split_partials_sum_to_the_whole(parallel):
    """K.attention_backward with a (batch, KV head)'s query blocks split three ways (partials summed
    in a second pass) equals the unsplit run."""
    B, Hq, Hkv, S, D = 1, 2, 1, 150, 8
    q, dy, y = (RNG.standard_normal((B, Hq, S, D)).astype(np.float32) for _ in range(3))
    k, v = (RNG.standard_normal((B, Hkv, S, D)).astype(np.float32) for _ in range(2))
    fns = MN.addresses() if MN.addresses() is not None else np.zeros(3, np.int64)
    mask = np.zeros((1, 1, 1, 1), np.float32)
    outs = []
    for nsplit in (1, 3):
        dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
        part_k, part_v = np.zeros((nsplit, B, Hkv, S, D), np.float32), np.zeros((nsplit, B, Hkv, S, D), np.float32)
        KA.attention_backward(
            q,
            k,
            v,
            y,
            dy,
            None,
            mask,
            False,
            True,
            -1,
            -1,
            0.35,
            0.0,
            64,
            64,
            nsplit,
            dq,
            dk,
            dv,
            part_k,
            part_v,
            fns,
            parallel,
        )
        outs.append((dq, dk, dv))
    for a, b in zip(*outs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_backward_splits_only_when_tasks_are_few():
    assert KA.backward_splits(B=8, Hkv=4, units=4, threads=8) == 1  # 32 tasks for 8 threads
    assert KA.backward_splits(B=1, Hkv=2, units=12, threads=8) == 8  # about two tasks a thread
    assert KA.backward_splits(B=1, Hkv=1, units=3, threads=16) == 3  # no more splits than blocks
    assert KA.backward_splits(B=1, Hkv=1, units=12, threads=1) == 1


def test_memory_is_o_n_d_not_the_score_matrix():
    """Causal GQA backward at 1024 and 2048 tokens: workspace only for the split partials (O(N d) per
    split, the splits set by the thread count), so doubling N at most doubles it; never (Sq, T)."""
    B, Hq, Hkv, D = 1, 4, 1, 32
    sizes = []
    for S in (1024, 2048):
        shapes = [(B, Hq, S, D), (B, Hq, S, D), (B, Hkv, S, D), (B, Hkv, S, D), (B, Hq, S, D)]
        ex = opsnn.aclnn.attention_backward.prepare(
            *(opsnn.tensor(np.zeros(s, np.float32)) for s in shapes), is_causal=True
        )
        nsplit = ex.plan["nsplit"]
        assert ex.workspace_size == (4 * nsplit * B * Hkv * S * 2 * D if nsplit > 1 else 0)
        sizes.append(ex.workspace_size)
    assert sizes[1] <= 2 * sizes[0]


def test_rule_matches_the_float64_composition():
    """The float32 rule (AttentionGrad) against the float64 rule (the registry-op composition)."""
    B, Hq, Hkv, Sq, T, D = 2, 4, 2, 9, 12, 5
    arrays = [RNG.standard_normal(s) for s in [(B, Hq, Sq, D), (B, Hkv, T, D), (B, Hkv, T, D), (B, Hq, Sq, D)]]
    mask = RNG.random((B, 1, Sq, T)) > 0.3
    grads = {}
    for dt in (np.float64, np.float32):
        q, k, v = (opsnn.tensor(a.astype(dt)).requires_grad_() for a in arrays[:3])
        y = ops.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        ops.sum(ops.mul(y, opsnn.tensor(arrays[3].astype(dt)))).backward()
        grads[dt] = [t.grad.numpy() for t in (q, k, v)]
    for a, b in zip(grads[np.float32], grads[np.float64]):
        _close(a, b)


def test_rule_with_3d_heads_softcap_and_window_matches_the_oracle():
    """Through autograd: 3-D (B, S, H*D) GQA inputs, softcap, a sliding window, causal (the float64
    composition has no softcap rule; the float32 rule runs the backward op)."""
    B, Hq, Hkv, S, D = 2, 4, 2, 12, 6
    q, k, v, dy = (
        RNG.standard_normal(s).astype(np.float32)
        for s in [(B, Hq, S, D), (B, Hkv, S, D), (B, Hkv, S, D), (B, Hq, S, D)]
    )
    t = [opsnn.tensor(to3(a)).requires_grad_() for a in (q, k, v)]
    kw = dict(is_causal=True, q_num_heads=Hq, kv_num_heads=Hkv, softcap=2.0, left_window_size=4)
    y = ops.attention(*t, **kw)
    ops.sum(ops.mul(y, opsnn.tensor(to3(dy)))).backward()
    want = oracle(q, k, v, dy, allowed_pairs(S, S, True, 4)[None, None], softcap=2.0)
    for a, w, h in zip(t, want, (Hq, Hkv, Hkv)):
        _close(to4(a.grad.numpy(), h), w)


def test_rule_runs_the_backward_op_for_float32():
    """float32 attention gradients come from one AttentionGrad kernel, not the composition's Softmax."""
    from opsnn.runtime import hooks

    q = opsnn.tensor(RNG.standard_normal((1, 2, 4, 3)).astype(np.float32)).requires_grad_()
    y = ops.scaled_dot_product_attention(q, q, q, is_causal=True)
    seen = []
    unsubscribe = hooks.subscribe("kernel", lambda ev: seen.append((ev["op"], ev.get("kernel"))))
    try:
        ops.sum(y).backward()
    finally:
        unsubscribe()
    ops_seen = [op for op, _ in seen]
    assert ops_seen.count("AttentionGrad") == 1 and "Softmax" not in ops_seen
    assert dict(seen)["AttentionGrad"] in KERNELS
    assert np.isfinite(q.grad.numpy()).all()


def test_compiled_training_step_holds_the_backward_op_and_matches_eager():
    """A traced step (GQA causal attention and a key-padding mask that changes per call, SGD) puts
    AttentionGrad nodes in the graph, and its updates equal the eager steps'."""
    from opsnn import nn, optim

    B, S, E, Hq, Hkv = 2, 10, 12, 4, 2
    batches = []
    for n in range(3):
        keep = np.ones((B, 1, 1, S), bool)
        keep[n % B, 0, 0, 6 + n :] = False
        batches.append((RNG.standard_normal((B, S, E)).astype(np.float32), keep))

    def run(compiled):
        with nn.init.seeded(5):
            proj = nn.Linear(E, E + 2 * (E // Hq) * Hkv)
        opt = optim.SGD(list(proj.parameters()), lr=0.1)

        def step(x, keep):
            opt.zero_grad()
            qkv = proj(x)
            q, k, v = ops.split(qkv, [E, E // 2, E // 2], dim=2)
            y1 = ops.attention(q, k, v, is_causal=True, q_num_heads=Hq, kv_num_heads=Hkv)
            y2 = ops.attention(q, k, v, keep, q_num_heads=Hq, kv_num_heads=Hkv)
            loss = ops.sum(ops.mul(ops.add(y1, y2), ops.add(y1, y2)))
            loss.backward()
            opt.step()
            return loss

        fn = opsnn.compile(step) if compiled else step
        losses = [float(fn(opsnn.tensor(x), opsnn.tensor(m)).item()) for x, m in batches]
        kinds = [n.op_type for n in fn.graph().nodes] if compiled else []
        return losses, proj.weight.numpy().copy(), kinds

    el, ew, _ = run(False)
    cl, cw, kinds = run(True)
    assert kinds.count("AttentionGrad") == 2 and "Softmax" not in kinds
    np.testing.assert_allclose(cl, el, rtol=1e-5)
    np.testing.assert_allclose(cw, ew, rtol=1e-5, atol=1e-6)


def test_bfloat16_runs_through_the_fp32_kernel():
    case = CASES[1]
    q, k, v, dy, mask, attrs, rank = _make(case)
    qb, kb, vb, dyb = (a.astype(ml_dtypes.bfloat16) for a in (q, k, v, dy))
    got = _backward(qb, kb, vb, dyb, mask, attrs, rank)
    want = _expected(*(a.astype(np.float32) for a in (qb, kb, vb, dyb)), mask, attrs)
    for g, w in zip(got, want):
        assert g.dtype == ml_dtypes.bfloat16
        _close(g.astype(np.float32), w, rtol=3e-2, atol=3e-2)


# -- torch.autograd ------------------------------------------------------------------------------------
TORCH_CASES = [
    ("causal_gqa", (2, 4, 70, 8), (2, 2, 70, 8), (2, 2, 70, 6), dict(is_causal=True, enable_gqa=True)),
    ("bool_mask", (2, 2, 9, 5), (2, 2, 13, 5), (2, 2, 13, 5), dict(mask=(2, 1, 9, 13))),
    ("additive_scale", (1, 3, 10, 7), (1, 3, 10, 7), (1, 3, 10, 4), dict(additive=(10, 10), scale=0.2)),
    ("unbatched_heads_3d", (3, 11, 6), (3, 5, 6), (3, 5, 2), {}),
]


@pytest.mark.parametrize("case", TORCH_CASES, ids=[c[0] for c in TORCH_CASES])
def test_rule_matches_torch_autograd(case):
    torch = pytest.importorskip("torch")
    _, qs, ks, vs, kw = case
    q, k, v = (RNG.standard_normal(s).astype(np.float32) for s in (qs, ks, vs))
    dy = RNG.standard_normal(qs[:-1] + vs[-1:]).astype(np.float32)
    mask = None
    if "mask" in kw:
        mask = RNG.random(kw["mask"]) > 0.3
        mask[..., 0] = True  # torch gives NaN for a fully masked row, opsnn 0
    elif "additive" in kw:
        mask = RNG.standard_normal(kw["additive"]).astype(np.float32)
    opts = {n: kw[n] for n in ("is_causal", "enable_gqa", "scale") if n in kw}
    tq, tk, tv = (opsnn.tensor(a).requires_grad_() for a in (q, k, v))
    y = ops.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask, **opts)
    ops.sum(ops.mul(y, opsnn.tensor(dy))).backward()
    Q, K, V = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    Y = torch.nn.functional.scaled_dot_product_attention(
        Q, K, V, attn_mask=None if mask is None else torch.tensor(mask), **opts
    )
    (Y * torch.tensor(dy)).sum().backward()
    for a, b, name in ((tq, Q, "Q"), (tk, K, "K"), (tv, V, "V")):
        _close(a.grad.numpy(), b.grad.numpy(), rtol=1e-4, atol=1e-5, what=f"d{name}")


# -- typed errors ----------------------------------------------------------------------------------------
def _args(**over):
    B, H, S, D = 1, 2, 4, 3
    a = dict(
        grad_y=np.zeros((B, H, S, D), np.float32),
        q=np.zeros((B, H, S, D), np.float32),
        k=np.zeros((B, H, S, D), np.float32),
        v=np.zeros((B, H, S, D), np.float32),
        y=np.zeros((B, H, S, D), np.float32),
    )
    a.update(over)
    return a


def test_bad_inputs_are_typed_errors():
    bwd = ops.attention_backward
    with pytest.raises(InferShapeError, match=r"AttentionGrad: input 'dY' must have the forward output's shape"):
        bwd(**_args(grad_y=np.zeros((1, 2, 4, 5), np.float32)))
    with pytest.raises(DTypeError, match="AttentionGrad: input 'Y' must have Q's dtype float32, got float64"):
        bwd(**_args(y=np.zeros((1, 2, 4, 3))))
    with pytest.raises(InferShapeError, match="logsumexp"):
        bwd(**_args(), logsumexp=np.zeros((1, 2, 5), np.float32))
    with pytest.raises(InferShapeError, match="multiple of kv heads"):
        bwd(**_args(k=np.zeros((1, 3, 4, 3), np.float32), v=np.zeros((1, 3, 4, 3), np.float32)))
    with pytest.raises(InferShapeError, match="attn_mask"):
        bwd(**_args(), attn_mask=np.zeros((3, 4), bool))
    with pytest.raises(ParamInvalidError, match="q_num_heads"):
        bwd(*(np.zeros((1, 4, 6), np.float32) for _ in range(5)))
    with pytest.raises(ParamInvalidError, match="softcap"):
        bwd(**_args(), softcap=-1.0)


def test_gradient_through_a_kv_cache_is_a_typed_error():
    from opsnn.autograd import NoGradientError

    q = opsnn.tensor(RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)).requires_grad_()
    past = opsnn.tensor(np.zeros((1, 2, 2, 4), np.float32))
    y = ops.attention(q, q, q, None, past, past, is_causal=True)
    with pytest.raises(NoGradientError, match="Attention"):
        ops.sum(y).backward()
