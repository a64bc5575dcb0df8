"""Tiered compilation of the kernels called directly (``opsnn.ops.tiering.cold_direct``): the LLM
decoder's fused decode regions, its few-row products, the rotary and SwiGLU ops and the IEEE
check's max |x| run numpy stand-ins while their numba kernels compile in the background. The
stand-ins agree with the numba kernels and float64 oracles, NaN and Inf included; a cold prefill
and decode through the llm API give the warm run's tokens and logits and queue the compiles."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from opsnn.kernels.cpu import attention as KA
from opsnn.kernels.cpu import fused as KF
from opsnn.kernels.cpu.activation import swiglu, swiglu_numpy, swiglu_plan
from opsnn.kernels.cpu.gemm import gemm_rows_parallel
from opsnn.llm import decoder as D
from opsnn.llm import fused as F
from opsnn.ops import tiering
from opsnn.ops.registry import TensorMeta, get_op

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def _rms64(h, w, eps):
    h = h.astype(np.float64)
    return h / np.sqrt((h * h).mean(axis=1, keepdims=True) + eps) * w


def _rope64(x, c, s):  # x (R, heads, D), c/s (R, D/2): "rotate half"
    half = c.shape[1]
    x1, x2 = x[..., :half], x[..., half:]
    c, s = c[:, None].astype(np.float64), s[:, None].astype(np.float64)
    return np.concatenate([c * x1 - s * x2, s * x1 + c * x2], axis=-1)


def _decode_case(rng, R=2, Hq=4, Hkv=2, D=16, H=32, T=12):
    f = lambda *s: (rng.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    ang = rng.uniform(0, 3, (T, D // 2))
    return {
        "h": f(R, H),
        "ln": (1 + f(H)).astype(np.float32),
        "wq": f(Hq * D, H),
        "wk": f(Hkv * D, H),
        "wv": f(Hkv * D, H),
        "cos": np.cos(ang).astype(np.float32),
        "sin": np.sin(ang).astype(np.float32),
        "pos": np.array([5, 0, 3][:R], np.int64),
        "kt": f(3, Hkv, D, T),
        "vc": f(3, Hkv, T, D),
        "slots": np.array([2, 0, 1][:R], np.int64),
        "lengths": np.array([6, 0, 4][:R], np.int64),  # row 1: idle (length 0)
    }


def _attention_block(c, numpy: bool, R, Hq, D):
    kt, vc = c["kt"].copy(), c["vc"].copy()
    q, y = np.empty((R, Hq, 1, D), np.float32), np.full((R, Hq, 1, D), 7.0, np.float32)
    args = (c["h"], c["ln"], 1e-5, c["wq"], c["wk"], c["wv"], c["cos"], c["sin"], c["pos"], kt, vc)
    args += (c["slots"], c["lengths"], R, q, y, np.float32(D**-0.5))
    if numpy:
        F.attention_block_numpy(*args)
    else:
        F.attention_block(*args, F.addresses(), 2)
    return q, y, kt, vc


@pytest.mark.skipif(F.addresses() is None, reason="no MKL entry points: the decoder's fused step does not run")
def test_the_numpy_attention_block_equals_the_numba_one_and_the_oracle(rng):
    R, Hq, Hkv, D = 2, 4, 2, 16
    c = _decode_case(rng, R, Hq, Hkv, D)
    got = _attention_block(c, True, R, Hq, D)
    want = _attention_block(c, False, R, Hq, D)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    # float64 oracle: norm, projections, RoPE, the cache store, softmax attention over each row's length
    x = _rms64(c["h"], c["ln"], 1e-5)
    cs, sn = c["cos"][c["pos"]], c["sin"][c["pos"]]
    q = _rope64((x @ c["wq"].T.astype(np.float64)).reshape(R, Hq, D), cs, sn)
    k = _rope64((x @ c["wk"].T.astype(np.float64)).reshape(R, Hkv, D), cs, sn)
    v = (x @ c["wv"].T.astype(np.float64)).reshape(R, Hkv, D)
    kt, vc = c["kt"].astype(np.float64), c["vc"].astype(np.float64)
    for b in range(R):
        kt[c["slots"][b], :, :, c["pos"][b]], vc[c["slots"][b], :, c["pos"][b]] = k[b], v[b]
    y = np.zeros((R, Hq, 1, D))
    for b in range(R):
        L, sl = c["lengths"][b], c["slots"][b]
        for hq in range(Hq if L else 0):
            sc = q[b, hq] @ kt[sl, hq // (Hq // Hkv), :, :L] * D**-0.5
            p = np.exp(sc - sc.max())
            y[b, hq, 0] = p @ vc[sl, hq // (Hq // Hkv), :L] / p.sum()
    np.testing.assert_allclose(got[0][:, :, 0], q, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[1], y, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[2], kt, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[3], vc, rtol=1e-4, atol=1e-5)
    assert not got[1][1].any()  # the idle row: zeros

    # a NaN in a row's activations and an Inf in a cached key: the same rows NaN in both tiers
    c["h"][0, 3] = np.nan
    c["kt"][0, 1, 2, 1] = np.inf  # slot 0 is row 1's, idle: never read
    c["kt"][2, 0, 4, 2] = np.inf  # row 0's slot, KV head 0
    got = _attention_block(c, True, R, Hq, D)
    want = _attention_block(c, False, R, Hq, D)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert np.isnan(got[1][0]).all() and not np.isnan(got[1][1]).any()


@pytest.mark.skipif(F.addresses() is None, reason="no MKL entry points: the decoder's fused step does not run")
def test_the_numpy_mlp_residual_and_head_equal_the_numba_ones_and_the_oracle(rng):
    R, H, I, V = 2, 32, 48, 40
    h = (rng.standard_normal((R, H)) * 0.5).astype(np.float32)
    ln = (1 + rng.standard_normal(H) * 0.1).astype(np.float32)
    wg, wu = (rng.standard_normal((2, I, H)) * 0.3).astype(np.float32)
    wd, w = (
        (rng.standard_normal((H, I)) * 0.3).astype(np.float32),
        (rng.standard_normal((V, H)) * 0.3).astype(np.float32),
    )
    wg[5, :] = 200.0  # gate -> +-large: exp overflows to inf, SiLU gives x or -0
    wg[6, 0] = np.inf  # Inf gate: +-Inf or NaN (0 * Inf) as the numba kernel gives
    fns, a = F.addresses(), np.float32(1.0)
    gu_n, gu_b = np.empty((R, I), np.float32), np.empty((R, I), np.float32)
    F.mlp_block_numpy(h, ln, 1e-5, wg, wu, gu_n, a)
    F.mlp_block(h, ln, 1e-5, wg, wu, gu_b, a, fns, 2)
    np.testing.assert_array_equal(np.isnan(gu_n), np.isnan(gu_b))
    np.testing.assert_allclose(gu_n, gu_b, rtol=1e-5, atol=1e-5)
    x = _rms64(h, ln, 1e-5)
    with np.errstate(all="ignore"):
        g64, u64 = x @ wg.T.astype(np.float64), x @ wu.T.astype(np.float64)
        want = g64 / (1 + np.exp(-g64)) * u64
    fin = np.isfinite(want)
    np.testing.assert_allclose(gu_n[fin], want[fin], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(np.isposinf(gu_n), np.isposinf(want))

    gu_b[np.isnan(gu_b) | np.isinf(gu_b)] = 0.0
    hn, hb = h.copy(), h.copy()
    F.residual_gemm_numpy(wd, gu_b, hn)
    F.residual_gemm(wd, gu_b, hb, fns, 2)
    np.testing.assert_allclose(hn, hb, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(hn, h + gu_b.astype(np.float64) @ wd.T, rtol=1e-4, atol=1e-5)
    ln_, lb = np.empty((R, V), np.float32), np.empty((R, V), np.float32)
    F.head_block_numpy(hn, ln, 1e-5, w, ln_)
    F.head_block(hn, ln, 1e-5, w, lb, fns, 2)
    np.testing.assert_allclose(ln_, lb, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ln_, _rms64(hn, ln, 1e-5) @ w.T, rtol=1e-4, atol=1e-5)


def test_the_numpy_decode_attention_and_rope_store_equal_the_numba_ones(rng):
    from opsnn.llm import attention as LA

    R, Hq, Hkv, D, T = 3, 4, 2, 16, 12
    c = _decode_case(rng, 2, Hq, Hkv, D, T=T)
    q = (rng.standard_normal((R, Hq, D)) * 0.5).astype(np.float32)
    k = (rng.standard_normal((R, Hkv, D)) * 0.5).astype(np.float32)
    v = (rng.standard_normal((R, Hkv, D)) * 0.5).astype(np.float32)
    pos, slots, lengths = np.array([5, 0, 3]), np.array([2, 0, 1]), np.array([6, 0, 4])
    q[0, 1, 3] = np.nan  # row 0's query head 1: its output NaN, the other heads not
    c["kt"][1, 1, 2, 1] = np.inf  # slot 1 (row 2), KV head 1, a position it reads
    outs = []
    for numpy in (True, False):
        qq, kt, vc = q.copy(), c["kt"].copy(), c["vc"].copy()
        fn = LA.rope_store_numpy if numpy else LA.rope_store
        fn(qq, k, v, c["cos"], c["sin"], pos, kt, vc, slots, 2)  # rows 0, 1 store; row 2 does not
        y = np.full((R, Hq, 1, D), 7.0, np.float32)
        q4 = qq[:, :, None, :]
        if numpy:
            LA.decode_attention_numpy(q4, kt, vc, slots, lengths, y, D**-0.5)
        else:
            LA.decode_attention(q4, kt, vc, slots, lengths, y, D**-0.5)
        outs.append((qq, kt, vc, y))
    for g, w in zip(*outs):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    y = outs[0][3]
    assert np.isnan(y[0, 1]).all() and not np.isnan(y[0, [0, 2, 3]]).any()
    assert not y[1].any()  # idle row
    assert np.isfinite(y[2, :2]).all()  # the Inf key is KV head 1's: heads 0 and 1 do not see it
    # float64 oracle of the attention (rows 0 and 2, on the stored cache)
    kt, vc = outs[0][1].astype(np.float64), outs[0][2].astype(np.float64)
    for b in (0, 2):
        for hq in range(Hq):
            sc = outs[0][0][b, hq].astype(np.float64) @ kt[slots[b], hq // 2, :, : lengths[b]] * D**-0.5
            with np.errstate(invalid="ignore"):
                p = np.exp(sc - sc.max())
                want = p @ vc[slots[b], hq // 2, : lengths[b]] / p.sum()
            np.testing.assert_allclose(y[b, hq, 0], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("accumulate", [False, True])
def test_the_numpy_product_equals_gemm_rows(rng, accumulate):
    x = rng.standard_normal((3, 40)).astype(np.float32)
    w = rng.standard_normal((70, 40)).astype(np.float32)
    x[1, 4] = np.nan
    out0 = np.full((3, 70), np.nan if not accumulate else 0.5, np.float32)  # beta 0: out is not read
    got, want = out0.copy(), out0.copy()
    D._numpy_product(x, w, got, accumulate)
    gemm_rows_parallel(x, w, want, np.float32(1.0 if accumulate else 0.0))
    oracle = x.astype(np.float64) @ w.T + (out0 if accumulate else 0)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(oracle))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, oracle, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bnsd, interleaved, rot", [(False, False, 16), (True, True, 16), (False, True, 8)])
def test_the_numpy_rotary_equals_the_numba_one_and_the_oracle(rng, bnsd, interleaved, rot):
    B, S, N, Dh = 2, 5, 3, 16
    x = rng.standard_normal((B, N, S, Dh) if bnsd else (B, S, N, Dh)).astype(np.float32)
    x[0, 1, 2, 3] = np.nan
    x[1, 0, 1, 0] = np.inf
    ang = rng.uniform(0, 3, (B, S, Dh // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    got, want = np.empty_like(x), np.empty_like(x)
    KA.rotary_numpy(x, cos, sin, got, bnsd, interleaved, rot)
    KA.rotary_serial(x, cos, sin, want, bnsd, interleaved, rot)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    ins = [x if bnsd else x.reshape(B, S, N * Dh), cos, sin]  # the op's layouts: (B, N, S, D) or (B, S, N * D)
    attrs = {"interleaved": int(interleaved), "num_heads": N, "rotary_embedding_dim": rot}
    oracle = _ref("RotaryEmbedding", ins, attrs).reshape(got.shape)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(oracle))
    np.testing.assert_allclose(got, oracle, rtol=1e-5, atol=1e-6)


def test_the_numpy_swiglu_equals_the_numba_one_and_the_oracle(rng):
    g = rng.standard_normal((4, 64)).astype(np.float32) * 4
    g[0, :4] = [np.inf, -np.inf, np.nan, -200.0]
    v = rng.standard_normal((4, 64)).astype(np.float32)
    v[1, 2] = np.inf
    plan = swiglu_plan(_Ctx(g, {"alpha": 1.5}))
    got, want = np.empty_like(g), np.empty_like(g)
    swiglu_numpy([g, v], [got], {"alpha": 1.5}, plan, None)
    swiglu([g, v], [want], {"alpha": 1.5}, plan, None)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    oracle = _ref("SwiGLU", [g, v], {"alpha": 1.5})
    np.testing.assert_array_equal(np.isnan(got), np.isnan(oracle))
    np.testing.assert_allclose(got, oracle, rtol=1e-5, atol=1e-6)


def _ref(op, ins, attrs):
    r = get_op(op).reference(ins, attrs)
    return np.asarray(r[0] if isinstance(r, (tuple, list)) else r)


class _Ctx:
    def __init__(self, x, attrs):
        self.inputs, self.attrs = [TensorMeta(x.shape, x.dtype)], attrs

    def dtype(self, i):
        return self.inputs[i].dtype

    def shape(self, i):
        return self.inputs[i].shape


def test_max_abs_is_numpy_while_cold_and_equals_the_numba_one(rng, monkeypatch):
    x = rng.standard_normal(KF.MAX_ABS_CHUNK * 3 + 5).astype(np.float32)
    x[77] = -9.5
    warm = KF.max_abs(x)
    asked = []
    monkeypatch.setattr(KF.kernel_cache, "cold", lambda fn, args: asked.append(fn) or True)
    assert KF.max_abs(x) == warm == 9.5
    assert KF.max_abs(x[:100]) == np.abs(x[:100]).max() and KF.max_abs(x[:0]) == 0.0
    assert asked == [KF._max_abs_bits_parallel, KF._max_abs_bits_span, KF._max_abs_bits_span]
    for bad in (np.nan, np.inf, -np.inf):
        x[12345] = x[50] = bad
        assert KF.max_abs(x) == KF.max_abs(x[:100]) == np.inf


def test_a_cold_winograd_finiteness_check_is_numpy(rng, monkeypatch):
    from opsnn.kernels.cpu import winograd as KW

    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    monkeypatch.setattr(KW.kernel_cache, "cold", lambda fn, args: True)
    assert KW.all_finite(w)
    for bad in (np.nan, np.inf, -np.inf):
        w[2, 1, 0, 2] = bad
        assert not KW.all_finite(w)


def test_a_cold_prefill_and_decode_run_the_stand_ins_then_the_numba_kernels(tmp_path):
    """In a fresh process with no tiering markers (nothing compiled yet as far as tiering knows; the
    kernel cache itself is the suite's, so the background process loads rather than compiles): the
    same tokens and logits cold (stand-ins, compiles queued, markers left) as once it finished."""
    script = textwrap.dedent(
        """
        import json, os
        import numpy as np
        import opsnn
        from opsnn.llm import CachedDecoder, KVCache
        from opsnn.ops import tiering
        from opsnn.tools.profiler import profile

        tiering._marker_dir = lambda: os.environ["MARKERS"]
        lm = opsnn.models.llama(layers=2, hidden=64, heads=4, kv_heads=2, vocab=100)
        prompt = np.array([3, 17, 42, 5, 9, 11, 2, 60], np.int64)

        def run():
            cache = KVCache.for_model(lm, max_batch_slots=1, max_seq=16)
            dec = CachedDecoder(lm, cache)
            s = cache.allocate()
            with profile() as prof:
                logits = [dec.forward(prompt[None], [s], [0])[0]]
            rope = sorted({k.kernel for k in prof.kernels if k.op == "RotaryEmbedding"})
            for i in range(3):
                tok = int(np.argmax(logits[-1]))
                logits.append(dec.forward(np.array([[tok]]), [s], [len(prompt) + i])[0])
            # three rows a step: the op-by-op step (more than FUSED_MAX_ROWS rows)
            cache3 = KVCache.for_model(lm, max_batch_slots=3, max_seq=16)
            dec3 = CachedDecoder(lm, cache3)
            slots = [cache3.allocate() for _ in range(3)]
            first = [dec3.forward(prompt[None, : 4 + r], [sl], [0])[0] for r, sl in enumerate(slots)]
            toks = np.array([[int(np.argmax(f))] for f in first])
            logits += list(dec3.forward(toks, slots, [4, 5, 6]))
            return np.stack(logits), [list(st.cold) for st in dec._steps.values()], rope

        cold, cold_keys, cold_rope = run()
        queued = tiering.status()["pending"] + tiering.status()["done"]
        ok = tiering.wait(600)
        st = tiering.status()
        warm, warm_keys, warm_rope = run()
        markers = os.listdir(os.environ["MARKERS"])
        print(json.dumps({"cold": cold.tolist(), "warm": warm.tolist(), "cold_keys": cold_keys,
            "warm_keys": warm_keys, "rope": [cold_rope, warm_rope], "queued": queued, "ok": ok, "failed": st["failed"],
            "markers": markers, "fused": opsnn.llm.fused.addresses() is not None}))
        """
    )
    env = dict(os.environ, PYTHONPATH=SRC, OPSNN_TIERED="1", MARKERS=str(tmp_path / "tiered"))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    assert "compiling numba kernels in the background" in out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["ok"] and not r["failed"], r
    cold, warm = np.array(r["cold"]), np.array(r["warm"])
    np.testing.assert_array_equal(cold.argmax(axis=1), warm.argmax(axis=1))
    np.testing.assert_allclose(cold, warm, rtol=1e-4, atol=1e-5 * np.abs(warm).max())
    assert r["queued"] >= 1
    assert r["rope"] == [["llm_rope_store_numpy"], ["llm_rope_store"]], r  # the prefill's RoPE + K/V store
    if r["fused"]:  # the fused decode step ran its stand-ins cold, the numba regions once compiled
        assert r["cold_keys"] and r["cold_keys"][0], r
        assert set(r["cold_keys"][0]) <= set(r["markers"]), r
        assert r["warm_keys"] == [[]], r


def test_cold_direct_queues_once_and_nothing_when_off(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSNN_KERNEL_CACHE_DIR", str(tmp_path / "k"))
    monkeypatch.setenv("OPSNN_TIERED", "1")
    submitted = []
    monkeypatch.setattr(tiering._background, "submit", lambda key, job: submitted.append(key) or True)
    fn = F.attention_block_numpy  # any function: its marker is what counts here
    keys = tiering.cold_direct([(fn, None)])
    assert len(keys) == 1 and len(submitted) == 1 and not tiering.all_cached(keys)
    tiering.mark_cached(keys[0])
    assert tiering.all_cached(keys) and tiering.cold_direct([(fn, None)]) == ()
    # a failed background compile: the caller switches (the kernel compiles in the foreground)
    keys = tiering.cold_direct([(F.mlp_block_numpy, None)])
    assert len(keys) == 1 and not tiering.all_cached(keys)
    monkeypatch.setitem(tiering._background.failed, os.path.join(tiering._marker_dir(), keys[0]), "boom")
    assert tiering.all_cached(keys) and tiering.cold_direct([(F.mlp_block_numpy, None)]) == ()
    monkeypatch.setenv("OPSNN_TIERED", "0")
    assert tiering.cold_direct([(D._numpy_product, None)]) == ()
    assert len(submitted) == 2
    tiering._foreground.clear()


def test_a_cold_gather_is_np_take_with_the_same_index_check(rng, monkeypatch):
    from opsnn.errors import ParamInvalidError
    from opsnn.kernels.cpu import shape as KS

    data = rng.standard_normal((50, 8)).astype(np.float32)
    data[3, 2] = np.nan
    idx = np.array([[3, -1, 7], [49, 0, 3]], np.int64)
    idx.flags.writeable = False  # as the decoder's token buffer reaches it
    want = np.empty((2, 3, 8), np.float32)
    KS.gather(data, idx, want, 0, True)
    asked = []
    monkeypatch.setattr(KS.kernel_cache, "cold", lambda fn, args: asked.append(fn) or True)
    got = np.empty((2, 3, 8), np.float32)
    KS.gather(data, idx, got, 0, True)
    assert asked == [KS.first_bad_index, KS.gather_rows]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, data[idx])  # the oracle: numpy's fancy indexing
    with pytest.raises(ParamInvalidError, match=r"index 50 at position \(1, 1\)"):
        KS.gather(data, np.array([[0, 1], [2, 50]]), np.empty((2, 2, 8), np.float32), 0, True)


def test_a_cold_bn_fold_scale_gives_the_numba_kernels_bits(rng, monkeypatch):
    from opsnn.kernels.cpu import norm as KN

    w = rng.standard_normal((6, 3, 3, 3)).astype(np.float32)
    w[1, 0, 0, 0], w[2, 1, 1, 1] = np.nan, np.inf
    f = rng.uniform(0.1, 3, 6)
    f[4] = 0.0
    warm = KN.scale_rows(w, f)
    monkeypatch.setattr(KN.kernel_cache, "cold", lambda fn, args: True)
    cold = KN.scale_rows(w, f)
    oracle = (w.astype(np.float64) * f[:, None, None, None]).astype(np.float32)
    np.testing.assert_array_equal(cold, warm)
    np.testing.assert_array_equal(cold, oracle)


@pytest.mark.parametrize("big", [False, True])
def test_a_cold_row_or_tile_copy_is_numpys_copy_of_the_same_views(rng, monkeypatch, big):
    """A row or tile copy whose numba kernel is compiling in the background (the serial one, or
    the threaded one from THREADS_MIN_BYTES) is numpy's copy of the same views: the same bits."""
    from opsnn.kernels.cpu import shape as KS

    d0, d1, d2 = (96, 64, 160) if big else (3, 5, 40)
    x = rng.standard_normal((d0, d1, d2)).astype(np.float32)
    x[1, 2, 7], x[2, 4, 0] = np.nan, -np.inf
    cols = d2 - 32
    cases = [
        # a column slice of rows (what a Split of BERT's stacked Q|K|V product copies): mode "rows"
        (
            KS.plan_copy((d0, d1, cols), 8, (d1 * d2, d2, 1), 0, (d1 * cols, cols, 1), 4, parallel=True),
            x[:, :, 8 : 8 + cols],
        ),
        # a transpose: mode "tiles"
        (KS.plan_permute((d0, d1, d2), (0, 2, 1), 4, parallel=True), x.transpose(0, 2, 1)),
    ]
    kernels = {("rows", False): KS.copy_rows_serial, ("rows", True): KS.copy_rows}
    kernels.update({("tiles", False): KS.copy_tiles_serial, ("tiles", True): KS.copy_tiles})
    for p, oracle in cases:
        assert p.mode in ("rows", "tiles") and bool(p.threads) == big
        warm = np.empty(oracle.shape, np.float32)
        KS.run_copy(p, x, warm)
        asked = []
        with monkeypatch.context() as m:
            m.setattr(KS.kernel_cache, "cold", lambda fn, args: asked.append(fn) or True)
            cold = np.empty(oracle.shape, np.float32)
            KS.run_copy(p, x, cold)
        assert asked == [kernels[(p.mode, big)]]
        np.testing.assert_array_equal(cold, warm)
        np.testing.assert_array_equal(cold, oracle)
