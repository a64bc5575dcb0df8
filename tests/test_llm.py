"""opsnn.llm: KV-cache generation, sampling, dynamic batching scheduler, cancellation, errors, CLI."""

import gc
import json
import threading

import numpy as np
import pytest

import opsnn
from opsnn.errors import DTypeError, ParamInvalidError
from opsnn.llm import (
    CachedDecoder,
    CacheFullError,
    GenerationError,
    KVCache,
    OutOfVocabularyError,
    PromptTooLongError,
    Sampler,
    SamplingParams,
    Scheduler,
    SchedulerClosedError,
    generate,
    generate_no_cache,
    mixed_workload,
    replay,
)
from opsnn.llm.decoder import PANEL_ROWS

VOCAB = 97


@pytest.fixture(scope="module")
def lm():
    return opsnn.models.llama(
        layers=2, hidden=64, heads=4, kv_heads=2, vocab=VOCAB, intermediate=96, seed=3, max_position=256
    )


def prompts(rng, lengths):
    return [rng.integers(0, VOCAB, n) for n in lengths]


# -- the cached forward --------------------------------------------------------------------------------------
def test_two_threads_generate_with_one_model_at_once(lm, rng):
    """Each thread's generate() (its own cache and scheduler, the model's weights shared) gives the
    tokens it gives alone and the no-cache oracle's. Both issue on the shared default stream: this
    hung in synchronize() before its counters were made thread-safe."""
    ps = prompts(rng, (5, 11))
    want = [generate_no_cache(lm, p, max_new_tokens=12) for p in ps]
    got, failures = [[], []], []

    def work(i):
        try:
            for _ in range(3):
                got[i].append(generate(lm, ps[i], max_new_tokens=12).tokens)
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a generate() call hung"
    assert not failures
    assert got == [[want[0]] * 3, [want[1]] * 3]


def test_decoder_logits_match_model_forward(lm, rng):
    """Prefill (whole and chunked) and batched decode over non-adjacent slots give the model's own logits."""
    cache = KVCache.for_model(lm, max_batch_slots=4, max_seq=32)
    dec = CachedDecoder(lm, cache)
    a, b = rng.integers(0, VOCAB, 7), rng.integers(0, VOCAB, 4)
    s0, s1, s2 = cache.allocate(), cache.allocate(), cache.allocate()
    ref_a = lm(a[None])[0].numpy()[0]
    got = dec.forward(a[None], [s0], [0], all_positions=True)[0]
    np.testing.assert_allclose(got, ref_a, rtol=1e-5, atol=1e-5)
    dec.forward(b[None, :3], [s2], [0])  # chunked prefill: 3 then 1
    last_b = dec.forward(b[None, 3:], [s2], [3])
    np.testing.assert_allclose(last_b[0], lm(b[None])[0].numpy()[0, -1], rtol=1e-5, atol=1e-5)
    cache.release(s1)  # slots 0 and 2 in use: attention runs over rows 0..2 with row 1 empty
    nxt = dec.forward(np.array([[5], [11]]), [s2, s0], [4, 7])
    ref_b = lm(np.append(b, 5)[None])[0].numpy()[0, -1]
    ref_a2 = lm(np.append(a, 11)[None])[0].numpy()[0, -1]
    np.testing.assert_allclose(nxt[0], ref_b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(nxt[1], ref_a2, rtol=1e-5, atol=1e-5)
    assert cache.lengths[s0] == 8 and cache.lengths[s2] == 5


def test_attention_reads_cache_views_with_the_fused_kernel(lm):
    cache = KVCache.for_model(lm, max_batch_slots=3, max_seq=16)
    k, v = cache.view(0, 0, 2)
    assert k.shape == (2, 2, 16, 16) and k.numpy().base is not None  # a view, not a copy
    assert np.shares_memory(k.numpy(), cache.keys[0].numpy())
    from opsnn.kernels.cpu import mkl

    rng = np.random.default_rng(3)
    for t in (cache.keys[0], cache.values[0]):
        t.numpy()[...] = rng.standard_normal(t.shape).astype(np.float32)
    q = opsnn.tensor(rng.standard_normal((2, 4, 3, 16)).astype(np.float32))
    kvlen = np.array([9, 0], np.int64)  # request 1: nothing cached yet (zeros out)
    ex = opsnn.aclnn.attention.prepare(q, k, v, None, None, None, kvlen, is_causal=True)
    # the tiled GEMM kernel reads the transposed keys in place; the flash kernel gives the same
    assert ex.kernel_name == ("attention_flash" if mkl.unavailable() else "attention_gemm_tiled")
    got = ex.run().numpy()
    flash = (
        opsnn.aclnn.attention.prepare(q, k, v, None, None, None, kvlen, is_causal=True, algo="attention_flash")
        .run()
        .numpy()
    )
    np.testing.assert_allclose(got, flash, rtol=1e-5, atol=1e-6)
    qn, kn, vn = q.numpy()[0].astype(np.float64), k.numpy()[0, :, :9].astype(np.float64), v.numpy()[0, :, :9]
    for h in range(4):  # request 0 by hand: queries at positions 6, 7, 8 over its 9 keys, causal
        sc = qn[h] @ kn[h // 2].T / 4.0
        sc[np.arange(9)[None, :] > np.arange(6, 9)[:, None]] = -np.inf
        pr = np.exp(sc - sc.max(-1, keepdims=True))
        np.testing.assert_allclose(got[0, h], (pr / pr.sum(-1, keepdims=True)) @ vn[h // 2], rtol=1e-5, atol=1e-5)
    assert not got[1].any()


@pytest.mark.parametrize("lengths,new", [((1,), 12), ((5,), 20), ((23,), 9)])
def test_cached_generation_equals_full_reforward(lm, rng, lengths, new):
    p = prompts(rng, lengths)[0]
    ref = generate_no_cache(lm, p, new)
    assert generate(lm, p, new).tokens == ref
    assert generate(lm, p, new, max_prefill_tokens=4).tokens == ref  # chunked prefill


def test_stop_tokens_end_generation(lm, rng):
    p = prompts(rng, [6])[0]
    ref = generate_no_cache(lm, p, 15)
    stop = ref[4]
    first = ref.index(stop)
    r = generate(lm, p, 15, stop_tokens=[stop])
    assert r.finish_reason == "stop" and r.stop_token == stop and r.tokens == ref[:first]
    assert r.tokens == generate_no_cache(lm, p, 15, stop_tokens=[stop])


def test_streaming_callback_gets_every_token_in_order(lm, rng):
    seen = []
    r = generate(lm, prompts(rng, [4])[0], 10, on_token=seen.append)
    assert seen == r.tokens and len(seen) == 10 and r.finish_reason == "length"
    m = r.metrics
    assert m.generated_tokens == 10 and m.ttft_s > 0 and m.latency_s >= m.ttft_s and m.ms_per_token > 0


# -- batching ---------------------------------------------------------------------------------------------------
def test_batched_equals_one_at_a_time_greedy(lm, rng):
    lengths, news = [3, 17, 1, 9, 30, 5, 12], [8, 3, 12, 6, 4, 10, 1]
    ps = prompts(rng, lengths)
    singles = [generate(lm, p, n).tokens for p, n in zip(ps, news)]
    with Scheduler(lm, max_batch_slots=3, max_seq=48, max_prefill_tokens=16) as s:
        reqs = [s.submit(p, n) for p, n in zip(ps, news)]
        s.run()
        assert s.stats()["mean_decode_batch"] > 1.5  # requests really shared decode steps
    assert [r.result() for r in reqs] == singles
    assert all(r.finish_reason == "length" for r in reqs)


def test_sampled_batched_equals_sampled_single_per_seed(lm, rng):
    ps = prompts(rng, [4, 11, 2])
    kw = dict(temperature=0.9, top_k=20, top_p=0.95)
    singles = [generate(lm, p, 12, seed=i, **kw).tokens for i, p in enumerate(ps)]
    with Scheduler(lm, max_batch_slots=4, max_seq=32) as s:
        reqs = [s.submit(p, 12, seed=i, **kw) for i, p in enumerate(ps)]
        s.run()
    assert [r.tokens for r in reqs] == singles


def test_scheduler_admission_and_retirement_order(lm, rng):
    """Two slots, FIFO admission between steps, a finished request's slot goes to the next in line."""
    s = Scheduler(lm, max_batch_slots=2, max_seq=32)
    news = [4, 1, 2, 3]
    reqs = [s.submit(p, n) for p, n in zip(prompts(rng, [3, 5, 2, 4]), news)]
    assert [r.status for r in reqs] == ["waiting"] * 4
    s.step()  # admit 0 and 1; prefill both (1 finishes at its first token); decode 0
    assert reqs[1].done() and reqs[1].finish_reason == "length" and len(reqs[1].tokens) == 1
    assert reqs[0].status == "running" and len(reqs[0].tokens) == 2
    assert reqs[2].status == "waiting" and reqs[3].status == "waiting"
    s.run()
    admits = [(e[2], e[3]) for e in s.events if e[1] == "admit"]
    assert [a[0] for a in admits] == [0, 1, 2, 3]  # FIFO admission
    assert admits[0][1] == 0 and admits[1][1] == 1  # lowest free slot first
    assert admits[2][1] == 1  # request 2 reuses request 1's slot
    # step 0: 1 finishes at its first token; step 1: 2 admitted, prefilled, decoded once -> done;
    # step 2: 3 admitted, 0 gets its 4th token; step 3: 3 gets its 3rd
    assert [(e[0], e[2]) for e in s.events if e[1] == "finish"] == [(0, 1), (1, 2), (2, 0), (3, 3)]
    assert [(e[0], e[2]) for e in s.events if e[1] == "admit"] == [(0, 0), (0, 1), (1, 2), (2, 3)]
    for r, n in zip(reqs, news):
        assert len(r.tokens) == n and r.slot is None
    assert s.cache.free_slots == 2 and not s.has_work()


def test_running_batch_never_exceeds_slots(lm, rng):
    s = Scheduler(lm, max_batch_slots=3, max_seq=40)
    for p in prompts(rng, [2, 8, 4, 6, 3, 9, 1]):
        s.submit(p, 5)
    peak = 0
    while s.step():
        peak = max(peak, len(s.running))
    assert peak == 3 and s.cache.free_slots == 3


# -- preallocated cache: no growth per decode step ---------------------------------------------------------------
def test_decode_steps_do_not_grow_pool_memory(lm, rng):
    s = Scheduler(lm, max_batch_slots=4, max_seq=64)
    ptrs = [t.numpy().ctypes.data for t in s.cache.keys + s.cache.values]
    for p in prompts(rng, [5, 9, 3]):
        s.submit(p, 40)
    for _ in range(4):  # admission, prefill, warm-up decode steps
        s.step()
    assert len(s.running) == 3 and all(r.status == "running" for r in s.running)
    gc.collect()

    def snap():
        m = opsnn.memory.summary()
        return m["reserved_bytes"], m["allocations"] - m["reuses"], m["live_blocks"], m["current_bytes"]

    before = snap()
    for _ in range(12):
        s.step()
        assert snap() == before  # no new block, no growth of live blocks or bytes
    assert [t.numpy().ctypes.data for t in s.cache.keys + s.cache.values] == ptrs
    assert all(len(r.tokens) == 17 for r in s.running)
    s.close()


# -- cancellation -----------------------------------------------------------------------------------------------
def test_cancel_waiting_and_running_frees_slots(lm, rng, no_leak):
    gc.collect()
    before = opsnn.memory.current_bytes()
    s = Scheduler(lm, max_batch_slots=2, max_seq=64)
    gc.collect()
    base = opsnn.memory.current_bytes()
    assert base - before >= s.cache.nbytes
    ps = prompts(rng, [4, 6, 3, 5])
    holder = {}

    def cancel_after_three(tok):
        if len(holder["a"].tokens) == 3:
            holder["a"].cancel()

    a = holder["a"] = s.submit(ps[0], 30, on_token=cancel_after_three)
    b = s.submit(ps[1], 30)
    c = s.submit(ps[2], 30)
    d = s.submit(ps[3], 6)
    assert c.cancel()  # still waiting: never admitted
    s.step()
    assert a.status == "running" and b.status == "running" and c.done()
    for _ in range(3):
        s.step()
    assert a.finish_reason == "cancelled" and len(a.tokens) == 3 and a.slot is None
    b.cancel()  # cancelled from outside, mid-generation
    s.step()
    assert b.finish_reason == "cancelled" and c.finish_reason == "cancelled" and c.tokens == []
    assert not c.cancel() and not a.cancel()  # already finished
    s.run()
    assert d.finish_reason == "length" and d.tokens == generate(lm, ps[3], 6).tokens
    admits = {e[2]: e[3] for e in s.events if e[1] == "admit"}
    assert 2 not in admits and admits[3] == 0  # d got the slot the cancelled request freed
    assert s.cache.free_slots == 2 and s.cache.used_slots == []
    gc.collect()
    assert opsnn.memory.current_bytes() == base  # only the preallocated cache remains
    s.close()
    gc.collect()
    assert opsnn.memory.current_bytes() == before  # close() returned the cache, handles still held
    assert a.tokens and d.done()


# -- errors -------------------------------------------------------------------------------------------------------
def test_bad_requests_raise_typed_errors_before_any_work(lm):
    s = Scheduler(lm, max_batch_slots=2, max_seq=16)
    with pytest.raises(PromptTooLongError, match="max_seq=16"):
        s.submit(np.zeros(17, np.int64), 1)
    with pytest.raises(PromptTooLongError):
        s.submit(np.zeros(10, np.int64), 8)  # 10 + 8 - 1 > 16
    s.submit(np.zeros(10, np.int64), 7).cancel()  # exactly fits
    with pytest.raises(OutOfVocabularyError, match=f"id {VOCAB} at position \\(2,\\)"):
        s.submit([1, 2, VOCAB], 4)
    with pytest.raises(OutOfVocabularyError):
        s.submit([-1, 2], 4)
    assert issubclass(OutOfVocabularyError, ParamInvalidError) and issubclass(PromptTooLongError, ParamInvalidError)
    with pytest.raises(ParamInvalidError, match="non-empty"):
        s.submit([], 4)
    with pytest.raises(ParamInvalidError, match="1-D"):
        s.submit([[1, 2]], 4)
    with pytest.raises(DTypeError):
        s.submit([1.0, 2.0], 4)
    with pytest.raises(ParamInvalidError, match="max_new_tokens"):
        s.submit([1, 2], 0)
    for bad in (dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-2), dict(seed=-1)):
        with pytest.raises(ParamInvalidError):
            s.submit([1, 2], 4, **bad)
    with pytest.raises(ParamInvalidError, match="stop_tokens"):
        s.submit([1, 2], 4, stop_tokens=["eos"])
    with pytest.raises(ParamInvalidError, match="on_token"):
        s.submit([1, 2], 4, on_token=5)
    assert s.steps == 0 and s.prefill_tokens == 0 and len(s.waiting) == 1
    s.close()
    assert s.waiting == [] and s.cache.free_slots == 2
    with pytest.raises(SchedulerClosedError):
        s.submit([1, 2], 4)
    with pytest.raises(ParamInvalidError, match="max_position_embeddings"):
        Scheduler(lm, max_seq=257)
    with pytest.raises(ParamInvalidError, match="max_prefill_tokens"):
        Scheduler(lm, max_seq=16, max_prefill_tokens=0)


def test_cache_slot_errors():
    c = KVCache(layers=1, kv_heads=1, head_dim=4, max_batch_slots=2, max_seq=4)
    a, _ = c.allocate(), c.allocate()
    with pytest.raises(CacheFullError):
        c.allocate()
    c.release(a)
    with pytest.raises(ParamInvalidError, match="not in use"):
        c.release(a)
    assert c.allocate() == a
    gc.collect()
    held = opsnn.memory.current_bytes()
    c.close()
    gc.collect()
    assert c.closed and held - opsnn.memory.current_bytes() >= c.nbytes
    with pytest.raises(CacheFullError, match="closed"):
        c.allocate()
    with pytest.raises(ParamInvalidError):
        KVCache(layers=0, kv_heads=1, head_dim=4, max_batch_slots=2, max_seq=4)
    with pytest.raises(ParamInvalidError, match="float32"):
        KVCache(layers=1, kv_heads=1, head_dim=4, max_batch_slots=2, max_seq=4, dtype="float16")


def test_failing_callback_and_nan_logits_fail_only_their_request(lm, rng, monkeypatch):
    ps = prompts(rng, [3, 4])

    def boom(tok):
        raise RuntimeError("consumer went away")

    with Scheduler(lm, max_batch_slots=2, max_seq=32) as s:
        bad, good = s.submit(ps[0], 5, on_token=boom), s.submit(ps[1], 5)
        s.run()
    assert bad.finish_reason == "error" and isinstance(bad.error, RuntimeError)
    with pytest.raises(GenerationError, match="consumer went away"):
        bad.result()
    assert good.result() == generate(lm, ps[1], 5).tokens
    with pytest.raises(GenerationError, match="NaN"):
        Sampler(SamplingParams()).sample(np.array([0.0, np.nan], np.float32))
    with pytest.raises(GenerationError, match="NaN"):
        Sampler(SamplingParams(temperature=1.0, seed=0)).sample(np.array([0.0, np.nan], np.float32))


def test_exception_in_serving_thread_leaks_no_thread_or_slot(lm, rng, no_leak, monkeypatch):
    threads_before = set(threading.enumerate())
    s = Scheduler(lm, max_batch_slots=3, max_seq=32)
    calls = {"n": 0}
    real = s.decoder.forward

    def flaky(tokens, slots, starts, **kw):
        calls["n"] += 1
        if np.asarray(tokens).shape[1] == 1 and len(slots) > 1:  # the first batched decode step fails
            calls["failed"] = True
            raise RuntimeError("kernel exploded")
        return real(tokens, slots, starts, **kw)  # noqa: F821 - deleted only after the scheduler stopped

    monkeypatch.setattr(s.decoder, "forward", flaky)
    # queued before the serving thread starts, so all three share the first decode step (submitted
    # after, a loaded machine could let the first request finish alone before the others arrive)
    reqs = [s.submit(p, 6) for p in prompts(rng, [3, 5, 2])]
    s.start()
    assert s.serving
    for r in reqs:
        assert r.wait(30)
    assert calls.get("failed")
    assert all(r.finish_reason == "error" for r in reqs)
    with pytest.raises(GenerationError, match="kernel exploded"):
        reqs[0].result(5)
    assert s.cache.free_slots == 3
    monkeypatch.setattr(s.decoder, "forward", real)
    later = s.submit(prompts(rng, [4])[0], 4)  # the scheduler keeps serving after the failure
    assert later.result(30) == generate(lm, later.prompt, 4).tokens
    s.close()
    assert not s.serving
    assert set(threading.enumerate()) == threads_before
    assert s.cache.free_slots == 3
    del s, reqs, later, real
    monkeypatch.undo()
    gc.collect()


def test_background_serving_matches_sync_and_close_cancels(lm, rng):
    ps = prompts(rng, [3, 8, 5, 2])
    sync = [generate(lm, p, 7).tokens for p in ps]
    s = Scheduler(lm, max_batch_slots=2, max_seq=32).start()
    out = [None] * len(ps)

    def client(i):
        out[i] = s.submit(ps[i], 7).result(60)

    ts = [threading.Thread(target=client, args=(i,)) for i in range(len(ps))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert out == sync
    long = s.submit(ps[0], 25)
    s.close()  # without drain: the pending request is cancelled, its slot freed
    assert long.done() and long.finish_reason == "cancelled" and s.cache.free_slots == 2


# -- sampling -----------------------------------------------------------------------------------------------------
def test_sampling_is_deterministic_per_seed(lm, rng):
    p = prompts(rng, [5])[0]
    kw = dict(temperature=1.0, top_k=0, top_p=1.0)
    a = generate(lm, p, 15, seed=123, **kw).tokens
    assert generate(lm, p, 15, seed=123, **kw).tokens == a
    assert generate(lm, p, 15, seed=124, **kw).tokens != a
    assert generate(lm, p, 15, top_k=1, temperature=2.0, seed=5).tokens == generate(lm, p, 15).tokens


def test_sampler_filters(rng):
    logits = np.log(np.array([0.05, 0.5, 0.02, 0.3, 0.13], np.float32))
    s = Sampler(SamplingParams(temperature=1.0, top_k=2, seed=0))
    assert {s.sample(logits) for _ in range(200)} == {1, 3}
    s = Sampler(SamplingParams(temperature=1.0, top_p=0.75, seed=0))  # 0.5 + 0.3 reaches 0.75
    assert {s.sample(logits) for _ in range(200)} == {1, 3}
    s = Sampler(SamplingParams(temperature=1.0, top_p=0.4, seed=0))
    assert {s.sample(logits) for _ in range(50)} == {1}
    s = Sampler(SamplingParams(temperature=1.0, seed=1))  # plain sampling follows softmax(logits)
    counts = np.bincount([s.sample(logits) for _ in range(4000)], minlength=5) / 4000
    np.testing.assert_allclose(counts, [0.05, 0.5, 0.02, 0.3, 0.13], atol=0.03)
    cold = Sampler(SamplingParams(temperature=0.05, seed=2))  # low temperature -> nearly greedy
    assert {cold.sample(logits) for _ in range(50)} == {1}
    assert Sampler(SamplingParams()).sample(logits) == 1
    with pytest.raises(GenerationError, match="-inf"):
        Sampler(SamplingParams(temperature=1.0, seed=0)).sample(np.full(3, -np.inf, np.float32))


# -- workload, replay, CLI ------------------------------------------------------------------------------------------
def test_mixed_workload_and_replay(lm):
    items = mixed_workload(6, prompt_len=(2, 20), new_tokens=(1, 8), vocab=VOCAB, seed=4)
    again = mixed_workload(6, prompt_len=(2, 20), new_tokens=(1, 8), vocab=VOCAB, seed=4)
    assert all((a.prompt == b.prompt).all() and a.max_new_tokens == b.max_new_tokens for a, b in zip(items, again))
    assert all(2 <= len(i.prompt) <= 20 and 1 <= i.max_new_tokens <= 8 for i in items)
    batched = replay(lm, items, max_batch_slots=4, progress=False)
    seq = replay(lm, items, sequential=True, progress=False)
    assert batched.outputs == seq.outputs
    assert batched.generated_tokens == seq.generated_tokens == sum(i.max_new_tokens for i in items)
    assert batched.decode_steps < seq.decode_steps and seq.mean_decode_batch == 1.0
    d = batched.as_dict()
    assert set(d["latency_s"]) == {"p50", "p90", "p99", "mean"} and d["tokens_per_s"] > 0
    with pytest.raises(ParamInvalidError):
        mixed_workload(3, prompt_len=(5, 2))


TINY = ["--layers", "1", "--hidden", "32", "--heads", "2", "--kv-heads", "1", "--vocab", "50", "--intermediate", "48"]


def test_cli_generate_streams_and_checks(capsys, tmp_path):
    from opsnn.llm import cli_generate

    out = tmp_path / "g.json"
    assert (
        cli_generate(["--prompt-tokens", "1,2,3", "--max-new-tokens", "6", "--check", "--json", str(out)] + TINY) == 0
    )
    text = capsys.readouterr().out
    toks = json.loads(out.read_text())["tokens"]
    assert f"tokens: {' '.join(map(str, toks))}" in text and "match" in text and "ms/token" in text
    assert cli_generate(["--prompt-tokens", "1,2,60", "--max-new-tokens", "4"] + TINY) == 2
    err = capsys.readouterr()
    assert "outside the vocabulary" in err.err and "tokens:" not in err.out
    assert cli_generate(["--prompt-tokens", "1,2", "--max-new-tokens", "4", "--max-seq", "3"] + TINY) == 2
    assert "cache" in capsys.readouterr().err


def test_cli_serve_bench(capsys, tmp_path):
    from opsnn.llm import cli_serve_bench

    out = tmp_path / "s.json"
    assert (
        cli_serve_bench(
            [
                "--requests",
                "5",
                "--prompt-len",
                "3,12",
                "--new-tokens",
                "2,6",
                "--max-batch",
                "4",
                "--no-progress",
                "--json",
                str(out),
            ]
            + TINY
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "dynamic batching" in text and "one-at-a-time" in text and "throughput" in text
    assert "warm-up (compiles kernels, not timed)" in text and "target" not in text
    res = json.loads(out.read_text())
    assert res["outputs_identical"] and res["throughput_ratio"] > 0 and len(res["reports"]) == 2


def test_profiler_shows_prefill_and_decode_regions(lm, rng):
    with opsnn.profiler.profile() as p:
        generate(lm, prompts(rng, [6])[0], 3)
    names = [e.name for e in p.host]
    assert any(n.startswith("llm prefill") for n in names)
    assert sum(n == "llm decode (batch 1)" for n in names) == 2


def test_generate_rejects_prompt_beyond_model_positions(lm):
    with pytest.raises(PromptTooLongError):
        generate(lm, np.zeros(250, np.int64), 10)  # 259 positions > max_position_embeddings=256


@pytest.mark.parametrize("fused,gemv", [(True, "mkl"), (True, "numba"), (False, "mkl")])
def test_prepared_decode_steps_match_the_eager_path(lm, rng, no_leak, monkeypatch, fused, gemv):
    """Decode steps replayed from prepared executors (``fused``: each layer as opsnn.llm.fused's
    regions, with MKL; ``gemv`` "numba": their products on opsnn's gemm_rows, as on non-Intel
    CPUs) give the eager path's logits, row for row, across steps (inputs rewritten each time),
    batch compositions (pad rows in a bucket) and cache slot ranges."""
    from opsnn.kernels.cpu import mkl, mkl_nb

    if gemv == "numba" and mkl.unavailable() is None:
        fns = mkl_nb.addresses().copy()
        fns[2] = 0
        monkeypatch.setattr(mkl_nb, "_ADDRESSES", [fns])

    cache = KVCache.for_model(lm, max_batch_slots=3, max_seq=64)
    fast, eager = CachedDecoder(lm, cache), CachedDecoder(lm, cache)
    fast.fused_steps = fused
    eager._decode_step = lambda *a: None  # the reference: never replays
    slots = [cache.allocate() for _ in range(3)]
    prompts = [rng.integers(0, VOCAB, n) for n in (5, 9, 3)]
    for s, p in zip(slots, prompts):
        fast.forward(p[None], [s], [0])
    pos = np.array([len(p) for p in prompts])
    for step in range(9):
        # compositions: all three rows, the same out of slot order, slots 0 and 2 (slot 1 idle: a hole in
        # the range), then slots 1..2
        rows = [0, 1, 2] if step < 3 else [2, 0, 1] if step < 4 else [0, 2] if step < 6 else [1, 2]
        sl, st = np.array([slots[r] for r in rows]), pos[rows]
        tok = rng.integers(0, VOCAB, (len(rows), 1))
        want = eager.forward(tok, sl, st)
        # the eager call wrote this step's K/V already: rewriting the same values is harmless
        got = fast.forward(tok, sl, st)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        pos[rows] += 1
    assert sorted(fast._steps) == [2, 3]  # one step per row-count bucket (3 rows; 2 rows), any slots
    # under the profiler the step launches each kernel on its own (observers see them), else as one task;
    # both run the same kernels on the same buffers
    rows, tok = [0, 1], rng.integers(0, VOCAB, (2, 1))
    sl, st = np.array([slots[r] for r in rows]), pos[rows]
    want = eager.forward(tok, sl, st)
    with opsnn.profiler.profile() as prof:
        got = fast.forward(tok, sl, st)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    names = [k.kernel for k in prof.kernels]
    attention = "llm_decode_attention_block" if fused and mkl.unavailable() is None else "llm_decode_rope_attention"
    assert attention in names and "llm_decode_step" not in names
    step, calls = fast._steps[2], []
    run_kernels = step._run_kernels
    step._run_kernels = lambda *a: (calls.append(1), run_kernels(*a))
    got2 = fast.forward(tok, sl, st)  # no observer: one task
    assert calls == [1]
    np.testing.assert_array_equal(got2, got)
    # a full step (2 rows in the 2-row bucket) replays the final norm and vocabulary projection too;
    # its logits are the caller's own array, not the buffer the next step overwrites
    assert not np.shares_memory(got2, step.logits.numpy())
    fast.release_steps()
    assert not fast._steps
    del fast, eager
    cache.close()


@pytest.mark.parametrize("D", [16, 12, 5])  # key dims: eight a pass, then the rest one by one
def test_decode_attention_kernel_matches_the_attention_op(rng, D):
    """The decoder's one-token attention (any slots, per-row lengths incl. 0 and the full capacity,
    GQA) against the fused Attention op's reference over the same cache rows."""
    from opsnn.llm.attention import decode_attention

    slots_total, Hq, Hkv, T = 6, 8, 2, 40
    K = rng.standard_normal((slots_total, Hkv, T, D)).astype(np.float32)
    V = rng.standard_normal((slots_total, Hkv, T, D)).astype(np.float32)
    slots = np.array([4, 0, 5, 2], np.int64)
    lengths = np.array([1, 17, 0, T], np.int64)
    q = rng.standard_normal((len(slots), Hq, 1, D)).astype(np.float32)
    want = (
        opsnn.aclnn.prepare(
            "Attention", [q, K[slots], V[slots], None, None, None, lengths], {"is_causal": True}, algo="attention_flash"
        )
        .run()
        .numpy()
    )
    kt = np.ascontiguousarray(K.transpose(0, 1, 3, 2))
    y = np.full_like(q, np.nan)
    decode_attention(q, kt, V, slots, lengths, y, D**-0.5)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    assert not y[2].any()  # length 0: zeros
    yp = np.full_like(q, np.nan)  # the tasks spread over threads: the same per-task arithmetic
    decode_attention(q, kt, V, slots, lengths, yp, D**-0.5, parallel=True)
    np.testing.assert_array_equal(yp, y)


@pytest.mark.parametrize("gemv", ["mkl", "numba"])
def test_one_row_decode_step_runs_four_regions_a_layer(lm, rng, no_leak, monkeypatch, gemv):
    """A lone request's decode step (the 1-row bucket) runs each layer as the fused regions of
    opsnn.llm.fused (with MKL): logits equal the eager path's step after step, with and without
    observers, and the cache holds the same keys and values. ``gemv``: the regions' matrix-vector
    products on MKL's sgemv or on opsnn's own kernel (the choice on non-Intel CPUs)."""
    from opsnn.kernels.cpu import mkl, mkl_nb

    if gemv == "numba" and mkl.unavailable() is None:
        fns = mkl_nb.addresses().copy()
        fns[2] = 0
        monkeypatch.setattr(mkl_nb, "_ADDRESSES", [fns])

    cache_a, cache_b = KVCache.for_model(lm, 2, 48), KVCache.for_model(lm, 2, 48)
    fast, eager = CachedDecoder(lm, cache_a), CachedDecoder(lm, cache_b)
    eager._decode_step = lambda *a: None
    sa, sb = cache_a.allocate(), cache_b.allocate()
    prompt = rng.integers(0, VOCAB, 11)
    np.testing.assert_allclose(
        fast.forward(prompt[None], [sa], [0]), eager.forward(prompt[None], [sb], [0]), rtol=1e-5, atol=1e-6
    )
    for t in range(6):
        tok = rng.integers(0, VOCAB, (1, 1))
        if t == 3:
            with opsnn.profiler.profile() as prof:
                got = fast.forward(tok, [sa], [11 + t])
            names = {k.kernel for k in prof.kernels}
        else:
            got = fast.forward(tok, [sa], [11 + t])
        np.testing.assert_allclose(got, eager.forward(tok, [sb], [11 + t]), rtol=1e-5, atol=1e-6)
    fused = mkl.unavailable() is None
    assert ("llm_decode_attention_block" in names and "llm_decode_mlp_block" in names) == fused
    for layer in range(lm.config.num_hidden_layers):
        np.testing.assert_allclose(
            cache_a._k[layer][sa, :, :, :17], cache_b._k[layer][sb, :, :, :17], rtol=1e-5, atol=1e-6
        )
        np.testing.assert_allclose(cache_a._v[layer][sa, :, :17], cache_b._v[layer][sb, :, :17], rtol=1e-5, atol=1e-6)
    del fast, eager
    cache_a.close()
    cache_b.close()


def _rope_tables(Hq: int, Hkv: int, D: int, T: int) -> tuple:
    """The (T, D/2) cos/sin tables of a LLaMA model with these heads."""
    from opsnn.models.llama import LlamaConfig, rope_cache

    cfg = LlamaConfig(
        vocab_size=8,
        hidden_size=Hq * D,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=Hq,
        num_key_value_heads=Hkv,
        max_position_embeddings=T,
    )
    return rope_cache(cfg)


def test_rope_store_matches_the_rotary_op_and_the_cache_write(rng):
    """The decode step's RoPE + K/V store against the RotaryEmbedding op and KVCache.write: q
    rotated in place (pad rows too), keys rotated into the transposed cache, values copied, rows
    past ``rows`` (a step's pad rows) leave the cache untouched."""
    from opsnn.llm.attention import rope_store

    Hq, Hkv, D, T, n_slots = 4, 2, 16, 24, 5
    cos, sin = _rope_tables(Hq, Hkv, D, T)
    R, rows = 4, 3
    q = rng.standard_normal((R, Hq, D)).astype(np.float32)
    k = rng.standard_normal((R, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((R, Hkv, D)).astype(np.float32)
    pos = np.array([0, 7, T - 1, 3], np.int64)
    slots = np.array([3, 0, 4, 1], np.int64)
    rot = lambda x, n: (
        opsnn.ops.rotary_embedding(
            x.reshape(R, 1, n * D),
            cos,
            sin,
            pos[:, None],  # noqa: E731
            num_heads=n,
        )
        .numpy()
        .reshape(R, n, D)
    )
    want_q, want_k = rot(q, Hq), rot(k, Hkv)
    cache = KVCache(layers=1, max_batch_slots=n_slots, max_seq=T, kv_heads=Hkv, head_dim=D)
    cache.write(0, slots[:rows], pos[:rows], want_k[:rows, None], v[:rows, None])
    kt = np.full((n_slots, Hkv, D, T), np.nan, np.float32)
    vc = np.full((n_slots, Hkv, T, D), np.nan, np.float32)
    kt_want, vc_want = kt.copy(), vc.copy()
    for b in range(rows):
        kt_want[slots[b], :, :, pos[b]] = cache._k[0][slots[b], :, :, pos[b]]
        vc_want[slots[b], :, pos[b]] = cache._v[0][slots[b], :, pos[b]]
    rope_store(q, k, v, cos, sin, pos, kt, vc, slots, rows)
    np.testing.assert_allclose(q, want_q, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(kt, kt_want, rtol=1e-6, atol=1e-6)  # NaN where nothing was written
    np.testing.assert_array_equal(vc, vc_want)
    assert np.isnan(kt[slots[3]]).all() and np.isnan(vc[slots[3]]).all()  # the pad row stored nothing
    cache.close()


def test_rope_store_rows_matches_the_rotary_op_and_the_cache_write(rng):
    """A forward's RoPE + K/V store (one parallel pass over its rows) against the RotaryEmbedding op
    and KVCache.write: q and k rotated in place (column views of one projection output, as the
    decoder hands them), keys transposed into the cache, values copied, NaN/Inf carried through
    where they are (a NaN of q stays in its head), other positions untouched; the numpy stand-in
    agrees with the numba kernel."""
    from opsnn.llm.attention import rope_store_rows, rope_store_rows_numpy

    Hq, Hkv, D, T, n_slots = 4, 2, 16, 40, 3
    cos, sin = _rope_tables(Hq, Hkv, D, T)
    # two requests: 7 tokens of slot 2 from position 0, 5 of slot 0 continuing at position 30
    pos = np.concatenate([np.arange(7), 30 + np.arange(5)]).astype(np.int64)
    slots = np.array([2] * 7 + [0] * 5, np.int64)
    R = len(pos)
    qkv = rng.standard_normal((R, (Hq + 2 * Hkv) * D)).astype(np.float32)
    qkv[1, 3] = np.nan  # q head 0 of row 1
    qkv[9, Hq * D + D + 2] = np.inf  # k head 1 of row 9
    qkv[4, (Hq + Hkv) * D + 5] = -np.inf  # v head 0 of row 4

    def rot(x, n):
        return opsnn.ops.rotary_embedding(x[None], cos, sin, pos[None], num_heads=n).numpy().reshape(R, n, D)

    q0, k0, v0 = qkv[:, : Hq * D], qkv[:, Hq * D : (Hq + Hkv) * D], qkv[:, (Hq + Hkv) * D :]
    want_q, want_k = rot(np.ascontiguousarray(q0), Hq), rot(np.ascontiguousarray(k0), Hkv)
    ref = KVCache(layers=1, max_batch_slots=n_slots, max_seq=T, kv_heads=Hkv, head_dim=D)
    ref._k[0][...], ref._v[0][...] = np.float32(7), np.float32(7)
    ref.write(0, np.array([2]), np.array([0]), want_k[None, :7], v0[None, :7].reshape(1, 7, Hkv, D))
    ref.write(0, np.array([0]), np.array([30]), want_k[None, 7:], v0[None, 7:].reshape(1, 5, Hkv, D))
    outs = []
    for fn in (rope_store_rows, rope_store_rows_numpy):
        buf = qkv.copy()
        views = [buf[:, a:b].reshape(R, n, D) for a, b, n in ((0, Hq * D, Hq), (Hq * D, (Hq + Hkv) * D, Hkv))]
        views.append(buf[:, (Hq + Hkv) * D :].reshape(R, Hkv, D))
        assert all(np.shares_memory(v, buf) for v in views)
        kt, vc = np.full_like(ref._k[0], 7), np.full_like(ref._v[0], 7)
        fn(*views, cos, sin, pos, kt, vc, slots)
        np.testing.assert_allclose(views[0], want_q, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(views[1], want_k, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(views[2], v0.reshape(R, Hkv, D))
        np.testing.assert_allclose(kt, ref._k[0], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(vc, ref._v[0])
        outs.append((buf, kt, vc))
    assert np.isnan(outs[0][0][1, :D]).any() and not np.isnan(outs[0][0][1, D:]).any()
    for g, w in zip(*outs):
        np.testing.assert_array_equal(g, w)
    ref.close()


def test_prefill_on_a_worker_stream_matches_the_default_stream(lm, rng, monkeypatch):
    """The forward's own launches (the MKL products, the residual GEMMs adding into h, RoPE + K/V
    store) run on the current stream and the Tensors they write carry them as producers: issued on
    a worker stream, with every product slowed down so that a host read that did not wait would
    see its buffer unwritten, the logits forward and prefill return (read before any synchronize)
    and the cache equal the default stream's."""
    import time

    from opsnn.llm import decoder as D

    p, a, b = rng.integers(0, VOCAB, 11), rng.integers(0, VOCAB, 5), rng.integers(0, VOCAB, 7)
    caches = [KVCache.for_model(lm, 3, 32) for _ in range(2)]
    dec = CachedDecoder(lm, caches[0])
    want = dec.forward(p[None], [1], [0]), dec.prefill([(a, 0, 0), (b, 2, 0)])
    orig = D._mkl_product

    def slow(*args, **kw):
        fn, name, info = orig(*args, **kw)

        def late():
            time.sleep(0.01)
            fn()

        return late, name, info

    monkeypatch.setattr(D, "_mkl_product", slow)
    s = opsnn.Stream()
    with s:
        dec = CachedDecoder(lm, caches[1])
        got = dec.forward(p[None], [1], [0]).copy(), dec.prefill([(a, 0, 0), (b, 2, 0)]).copy()
    s.synchronize()
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    for layer in range(lm.config.num_hidden_layers):  # the positions written (keys stored transposed)
        for slot, n in ((0, 5), (1, 11), (2, 7)):
            np.testing.assert_array_equal(caches[1]._k[layer][slot, :, :, :n], caches[0]._k[layer][slot, :, :, :n])
            np.testing.assert_array_equal(caches[1]._v[layer][slot, :, :n], caches[0]._v[layer][slot, :, :n])
    s.close()
    for c in caches:
        c.close()


def _skip_without_panels(*rows: int) -> None:
    """The fused layers read MKL's packed panels: skip where there is no MKL, or where the library
    rules keep the decoder's weights unpacked for products of these row counts (another GEMM library)."""
    from opsnn.kernels.cpu import libraries as KL
    from opsnn.kernels.cpu import mkl_nb

    if mkl_nb.addresses() is None:
        pytest.skip("the fused layers run on MKL")
    unpacked = [r for r in rows if KL.weight_stays_unpacked(r, 64, 192)]
    if unpacked:
        pytest.skip(
            f"the fused layers read MKL's packed panels; with {KL.gemm_library()} the GEMM library here the "
            f"decoder keeps its weights unpacked for {unpacked}-row products"
        )


def _same_where_finite(got, want, atol, exact_nan):
    """``got`` equals ``want`` (rtol 1e-5) wherever ``want`` is finite and is NaN only where ``want``
    is; with ``exact_nan`` NaN exactly where ``want`` is."""
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=atol)
    assert not (np.isnan(got) & ~np.isnan(want)).any()
    if exact_nan:
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))


@pytest.mark.parametrize(
    "kv_heads,slots,balanced", [(2, [0], True), (4, [0], True), (2, [2, 0], True), (2, [2, 0], False)]
)
def test_fused_prefill_matches_op_by_op(kv_heads, slots, balanced, rng, monkeypatch):
    """Fresh prompts' layers as one kernel call (opsnn.llm.layers, on MKL's panels) give the
    op-by-op forward's logits at every position and its K/V, GQA and not, one prompt or two in
    slots out of order; a NaN and an Inf in the embedding table reach the same positions (the
    whole prompt: causal attention's zero weights still multiply the NaN values). The
    fused call replaces every layer's ops: the RMSNorm op then runs only for the final norm. Not
    ``balanced``: the KV heads alone would leave threads idle, so attention also splits each
    prompt's query rows into blocks (on 2 threads 37 rows are 3 blocks of 13: two pad rows); a
    block's rows multiply no key past the block, so rows before the NaN's block stay finite
    where the one-block op path's carry it: equal wherever the op path is finite, NaN only
    where it is NaN, and NaN from the NaN's position on."""
    from opsnn.llm import decoder as D

    _skip_without_panels(37 * len(slots))
    monkeypatch.setattr(D, "attention_tasks_balance", lambda tasks: balanced)
    lm = opsnn.models.llama(
        layers=2, hidden=64, heads=4, kv_heads=kv_heads, vocab=VOCAB, intermediate=96, seed=5, max_position=64
    )
    emb = lm.model.embed_tokens.weight.numpy()
    emb[VOCAB - 1, 3], emb[VOCAB - 2, 7] = np.nan, np.inf
    S = 37
    tok = rng.integers(0, VOCAB - 2, (len(slots), S))
    if len(slots) > 1:  # the last prompt reads a NaN and an Inf row; the first stays finite
        tok[-1, 20], tok[-1, S - 1] = VOCAB - 1, VOCAB - 2
    norms, rms_norm = [], D.ops.rms_norm

    def counted(*args, **kw):
        norms.append(args[0].shape)
        return rms_norm(*args, **kw)

    monkeypatch.setattr(D.ops, "rms_norm", counted)
    out, caches = [], []
    for fused in (False, True):
        cache = KVCache.for_model(lm, 3, 48)
        dec = CachedDecoder(lm, cache)
        dec.fused_prefill = fused
        norms.clear()
        out.append(dec.forward(tok, slots, [0] * len(slots), all_positions=True))
        caches.append(cache)
        assert len(norms) == (1 if fused else 2 * 2 + 1)
    _same_where_finite(out[1], out[0], 1e-5, exact_nan=balanced)
    assert np.isfinite(out[0][0]).all() and (len(slots) == 1 or np.isnan(out[0][-1]).all())
    assert len(slots) == 1 or np.isnan(out[1][-1, 20:]).all()
    for layer in range(2):
        for slot in slots:
            for a, b in (
                (caches[1]._k[layer][slot, :, :, :S], caches[0]._k[layer][slot, :, :, :S]),
                (caches[1]._v[layer][slot, :, :S], caches[0]._v[layer][slot, :, :S]),
            ):
                _same_where_finite(a, b, 1e-6, exact_nan=balanced)
    for c in caches:
        c.close()


@pytest.mark.parametrize("balanced", [True, False])
def test_fused_prefill_of_several_prompts_matches_op_by_op(balanced, rng, monkeypatch):
    """The scheduler's several prompt chunks of different lengths in one prefill() run as one
    call too, whole prompts attending over their own rows and continued chunks over their slot's
    cache; a forward of rows continuing at different positions as well. Logits and K/V equal
    the op-by-op path's, with one RMSNorm op (the final norm) in the fused runs; with query
    blocks too (not ``balanced``)."""
    from opsnn.llm import decoder as D

    _skip_without_panels(54, 19, 6)  # the rows of the three calls below
    monkeypatch.setattr(D, "attention_tasks_balance", lambda tasks: balanced)
    lm = opsnn.models.llama(layers=2, hidden=64, heads=4, kv_heads=2, vocab=VOCAB, intermediate=96, seed=7)
    calls = [
        [(rng.integers(0, VOCAB, n), slot, 0) for n, slot in ((5, 2), (37, 0), (12, 3))],
        [(rng.integers(0, VOCAB, n), slot, st) for n, slot, st in ((6, 2, 5), (4, 0, 37), (9, 1, 0))],
    ]
    rows = rng.integers(0, VOCAB, (2, 3))  # then slots 3 and 2 continue at 12 and 11 in one forward
    norms, rms_norm = [], D.ops.rms_norm
    monkeypatch.setattr(D.ops, "rms_norm", lambda *a, **k: norms.append(1) or rms_norm(*a, **k))
    out, caches = [], []
    for fused in (False, True):
        cache = KVCache.for_model(lm, 4, 48)
        dec = CachedDecoder(lm, cache)
        dec.fused_prefill = fused
        got = []
        for chunks in calls:
            norms.clear()
            got.append(dec.prefill(chunks))
            assert len(norms) == (1 if fused else 2 * 2 + 1)
        got.append(dec.forward(rows, [3, 2], [12, 11], all_positions=True))
        out.append(got)
        caches.append(cache)
    for g, w in zip(out[1], out[0]):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    for layer in range(2):
        for slot, n in ((0, 41), (1, 9), (2, 14), (3, 15)):
            np.testing.assert_allclose(
                caches[1]._k[layer][slot, :, :, :n], caches[0]._k[layer][slot, :, :, :n], atol=1e-6
            )
            np.testing.assert_allclose(caches[1]._v[layer][slot, :, :n], caches[0]._v[layer][slot, :, :n], atol=1e-6)


def test_batched_decode_step_layers_as_one_call_match_op_by_op(rng):
    """A decode step of three or more rows runs its layers as one call (opsnn.llm.layers
    decode_layers, one kernel in the profiler) and gives the op-by-op step's logits and K/V:
    buckets 4 (one pad row) and 8, rows at different positions, slots out of order."""
    from opsnn.tools.profiler import profile

    _skip_without_panels(4, 8)
    lm = opsnn.models.llama(layers=2, hidden=64, heads=4, kv_heads=2, vocab=VOCAB, intermediate=96, seed=9)
    ps = [rng.integers(0, VOCAB, n) for n in (6, 3, 9, 1, 4, 7)]
    decs, caches = [], []
    for fused in (False, True):
        cache = KVCache.for_model(lm, 8, 40)
        dec = CachedDecoder(lm, cache)
        dec.fused_steps = fused
        for i, p in enumerate(ps):
            cache.allocate()
            dec.forward(p[None], [i], [0])
        decs.append(dec)
        caches.append(cache)
    starts = np.array([len(p) for p in ps])
    for rows in ([4, 0, 2], [5, 1, 3, 0, 2, 4], [2, 5, 0]):
        tok = rng.integers(0, VOCAB, (len(rows), 1))
        want = decs[0].forward(tok, rows, starts[rows])
        with profile() as prof:
            got = decs[1].forward(tok, rows, starts[rows])
        assert [k.kernel for k in prof.kernels].count("llm_decode_layers") == 1
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        starts[rows] += 1
    for layer in range(2):
        for slot, n in enumerate(starts):
            np.testing.assert_allclose(
                caches[1]._k[layer][slot, :, :, :n], caches[0]._k[layer][slot, :, :, :n], atol=1e-6
            )
            np.testing.assert_allclose(caches[1]._v[layer][slot, :, :n], caches[0]._v[layer][slot, :, :n], atol=1e-6)


def test_decoder_packed_projections_match_the_linear_op(lm, rng, monkeypatch):
    """Where MKL is the GEMM library the decoder packs its float32 projection weights once (q/k/v
    and gate/up stacked into one panel each) and every product of two or more rows (prefill,
    batched decode steps of any bucket) reads the panels; one-row products run as MKL's sgemv on
    the weight itself. Logits agree with a decoder that runs every projection on the Linear op.
    (The library is pinned: the other case has its own test below.)"""
    from opsnn.kernels.cpu import libraries as KL
    from opsnn.kernels.cpu import mkl

    if not mkl.unavailable():
        monkeypatch.setattr(KL, "_library", "mkl")

    cache_a, cache_b = KVCache.for_model(lm, 8, 32), KVCache.for_model(lm, 8, 32)
    packed, plain = CachedDecoder(lm, cache_a), CachedDecoder(lm, cache_b)
    plain._packs = None  # as without MKL
    if mkl.unavailable():
        assert packed._packs is None
    else:
        w = lm.output_weight
        assert packed._packed(w, 1).shape == w.shape and packed._packed(w, 3) is packed._packed(w, 8)
    for c in (cache_a, cache_b):
        for _ in range(5):
            c.allocate()
    ps = [rng.integers(0, VOCAB, n) for n in (6, 3, 9, 1, 4)]
    for i, p in enumerate(ps):
        np.testing.assert_allclose(
            packed.forward(p[None], [i], [0]), plain.forward(p[None], [i], [0]), rtol=1e-5, atol=1e-5
        )
    starts = np.array([len(p) for p in ps])
    for rows in ([0], [3, 1], [4, 0, 2], [0, 1, 2, 3, 4]):  # buckets 1, 2 and 4, 8 (pad rows)
        tok = rng.integers(0, VOCAB, (len(rows), 1))
        got = packed.forward(tok, rows, starts[rows])
        want = plain.forward(tok, rows, starts[rows])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        starts[rows] += 1
    if not mkl.unavailable():
        # each weight packed once: o and down on their own, q/k/v and gate/up stacked, the head
        # (the model's packs also keep earlier tests' unpacked entries, keyed plain=True)
        assert sum(not key[-1] for key in packed._packs) == 4 * lm.config.num_hidden_layers + 1
        p0 = packed.layers[0]
        qkv = packed._packed_cat((p0.wq, p0.wk, p0.wv), 4)
        assert qkv is packed._packed_cat((p0.wq, p0.wk, p0.wv), 16) and qkv.n == sum(
            w.shape[0] for w in (p0.wq, p0.wk, p0.wv)
        )
        assert qkv.m == PANEL_ROWS  # packed for prefill-sized products, whatever the cache's slots
        assert packed._packed_cat((p0.wg, p0.wu), 1) is None  # one row: matrix-vector products
        assert CachedDecoder(lm, cache_a)._packed(lm.output_weight, 4) is packed._packed(lm.output_weight, 4)
    packed.release_steps()
    plain.release_steps()
    cache_a.close()
    cache_b.close()


def test_decode_steps_pad_to_row_buckets(lm, rng, no_leak):
    """5 requests in slots out of order run a prepared step of 8 rows (3 pad rows): logits equal the
    eager path's, the pad rows store nothing, and sizes 5..8 share that one step."""
    from opsnn.llm.decoder import decode_bucket

    assert [decode_bucket(b, 32) for b in (1, 2, 3, 4, 5, 8, 9, 31, 32)] == [1, 2, 4, 4, 8, 8, 12, 32, 32]
    assert decode_bucket(5, 6) == 6
    cache = KVCache.for_model(lm, max_batch_slots=10, max_seq=32)
    fast, eager = CachedDecoder(lm, cache), CachedDecoder(lm, cache)
    eager._decode_step = lambda *a: None
    slots = np.array([cache.allocate() for _ in range(7)])[[6, 1, 3, 0, 4, 5, 2]]
    lens = rng.integers(2, 9, len(slots))  # (a 1-token prompt would be a decode step)
    for s, n in zip(slots, lens):
        fast.forward(rng.integers(0, VOCAB, n)[None], [s], [0])
    before_k = [t.numpy().copy() for t in cache.keys + cache.values]
    for n in (5, 7, 6, 8 - 1):
        sl, st = slots[:n], lens[:n]
        tok = rng.integers(0, VOCAB, (n, 1))
        want = eager.forward(tok, sl, st)
        got = fast.forward(tok, sl, st)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert list(fast._steps) == [8]
    # only the decoding rows' positions were written: the other slots' rows are untouched
    for i, (k0, k) in enumerate(zip(before_k, cache.keys + cache.values)):
        if i < len(cache.keys):  # keys are stored (slot, head, dim, position)
            k0, k = k0.swapaxes(2, 3), k.numpy().swapaxes(2, 3)
        else:
            k = k.numpy()
        untouched = np.ones(k0.shape, bool)
        untouched[slots[:7], :, lens[:7]] = False
        assert np.array_equal(k0.view(np.uint32)[untouched], k.view(np.uint32)[untouched])  # bits: the
        # unwritten cache memory may hold NaN patterns
    fast.release_steps()
    del fast, eager
    cache.close()


@pytest.mark.skipif(__import__("opsnn.kernels.cpu.mkl", fromlist=["x"]).unavailable() is not None, reason="needs MKL")
def test_decoder_products_by_row_count_where_openblas_is_the_gemm_library(lm, rng, monkeypatch):
    """Where OpenBLAS is the faster library (AMD CPUs): products of a few rows (decode steps) run
    on opsnn's gemm_rows over the (stacked) weights, mid-sized ones keep MKL's packed panels,
    many rows (long prompts) multiply the weights on numpy's BLAS. Logits agree with the
    all-Linear-op decoder in every regime."""
    from opsnn.kernels.cpu import libraries as KL
    from opsnn.llm import decoder as D
    from opsnn.tools.profiler import profile

    monkeypatch.setattr(KL, "_library", "openblas")
    monkeypatch.setattr(KL, "ONEDNN_MIN_ROWS", 1 << 30)  # oneDNN's matmul: the next test
    monkeypatch.setattr(KL, "SMALL_ROWS", 2)
    for level in ("ELSEWHERE", "AVX2"):
        monkeypatch.setattr(KL, f"PACKED_MAX_ROWS_{level}", 6)
        monkeypatch.setattr(KL, f"PACKED_MAX_MACS_{level}", 0)
    cache_a, cache_b = KVCache.for_model(lm, 4, 32), KVCache.for_model(lm, 4, 32)
    mixed, plain = CachedDecoder(lm, cache_a), CachedDecoder(lm, cache_b)
    mixed.fused_steps = False  # op by op: every product goes through the row-count choice
    plain._packs = None
    p0 = mixed.layers[0]
    qkv = mixed._packed_cat((p0.wq, p0.wk, p0.wv), 9)
    assert isinstance(qkv, D._PlainWeight) and qkv.n == sum(w.shape[0] for w in (p0.wq, p0.wk, p0.wv))
    np.testing.assert_array_equal(qkv.w, np.concatenate([w.numpy() for w in (p0.wq, p0.wk, p0.wv)]))
    assert not isinstance(mixed._packed_cat((p0.wq, p0.wk, p0.wv), 4), D._PlainWeight)
    assert isinstance(mixed._packed(p0.wo, 1), D._PlainWeight)
    assert mixed._packed(p0.wo, 9) is mixed._packed(p0.wo, 12)
    for c in (cache_a, cache_b):
        for _ in range(3):
            c.allocate()
    ps = [rng.integers(0, VOCAB, n) for n in (9, 4, 2)]
    want = {"llm_linear_openblas", "llm_linear_mkl_packed", "llm_linear_rows"}
    seen = set()
    for i, p in enumerate(ps):
        with profile() as prof:
            got = mixed.forward(p[None], [i], [0])
        seen |= {k.kernel for k in prof.kernels if k.op == "Linear"}
        np.testing.assert_allclose(got, plain.forward(p[None], [i], [0]), rtol=1e-5, atol=1e-5)
    starts = np.array([len(p) for p in ps])
    for rows in ([0, 1, 2], [1]):
        tok = rng.integers(0, VOCAB, (len(rows), 1))
        with profile() as prof:
            got = mixed.forward(tok, rows, starts[rows])
        seen |= {k.kernel for k in prof.kernels if k.op == "Linear"}
        np.testing.assert_allclose(got, plain.forward(tok, rows, starts[rows]), rtol=1e-5, atol=1e-5)
        starts[rows] += 1
    assert want <= seen, seen
    mixed.release_steps()
    plain.release_steps()
    cache_a.close()
    cache_b.close()


@pytest.mark.skipif(
    __import__("opsnn.kernels.cpu.onednn", fromlist=["x"]).matmul_unavailable() is not None
    or __import__("opsnn.kernels.cpu.mkl", fromlist=["x"]).unavailable() is not None,
    reason="needs oneDNN's brgemm matmul and MKL",
)
def test_decoder_products_on_onednn_where_openblas_is_the_gemm_library(lm, rng, monkeypatch):
    """With oneDNN's matmul (AVX-512): products of ONEDNN_MIN_ROWS rows or more (prompts, batched
    decode steps, their residual adds as the matmul's sum post-op) run on it, reading the
    (stacked) weights in place; fewer rows stay on gemm_rows. Logits agree with the
    all-Linear-op decoder, op by op and in the bound decode steps."""
    from opsnn.kernels.cpu import libraries as KL
    from opsnn.llm import decoder as D
    from opsnn.tools.profiler import profile

    monkeypatch.setattr(KL, "_library", "openblas")
    monkeypatch.setattr(KL, "ONEDNN_MIN_ROWS", 3)
    for fused in (False, True):
        cache_a, cache_b = KVCache.for_model(lm, 4, 32), KVCache.for_model(lm, 4, 32)
        dec, plain = CachedDecoder(lm, cache_a), CachedDecoder(lm, cache_b)
        dec.fused_steps = fused
        plain._packs = None
        p0 = dec.layers[0]
        assert isinstance(dec._packed_cat((p0.wq, p0.wk, p0.wv), 3), D._PlainWeight)
        for c in (cache_a, cache_b):
            for _ in range(4):
                c.allocate()
        ps = [rng.integers(0, VOCAB, n) for n in (9, 3, 2, 5)]
        seen = []
        for i, p in enumerate(ps):
            with profile() as prof:
                got = dec.forward(p[None], [i], [0])
            seen.append({k.kernel for k in prof.kernels if k.op == "Linear"})
            np.testing.assert_allclose(got, plain.forward(p[None], [i], [0]), rtol=1e-5, atol=1e-5)
        assert "llm_linear_onednn" in seen[0] and "llm_linear_onednn" in seen[1]
        assert "llm_linear_onednn" not in seen[2]
        starts = np.array([len(p) for p in ps])
        for step in range(3):  # 4-row decode steps (bound and replayed when fused), then 2 rows
            rows = [0, 1, 2, 3] if step < 2 else [1, 2]
            tok = rng.integers(0, VOCAB, (len(rows), 1))
            with profile() as prof:
                got = dec.forward(tok, rows, starts[rows])
            kernels = {k.kernel for k in prof.kernels if k.op == "Linear"}
            assert ("llm_linear_onednn" in kernels) == (len(rows) >= 3), kernels
            np.testing.assert_allclose(got, plain.forward(tok, rows, starts[rows]), rtol=1e-5, atol=1e-5)
            starts[rows] += 1
        dec.release_steps()
        plain.release_steps()
        cache_a.close()
        cache_b.close()


def test_packed_projections_follow_load_state_dict(rng, monkeypatch):
    """The model keeps the packed panels for its next decoders; new weights loaded by
    load_state_dict are packed again (the logits follow the new weights). MKL pinned as the GEMM
    library where it exists, as in the test above."""
    from opsnn.kernels.cpu import libraries as KL
    from opsnn.kernels.cpu import mkl
    from opsnn.llm.decoder import PACKS

    if not mkl.unavailable():
        monkeypatch.setattr(KL, "_library", "mkl")

    m = opsnn.models.llama(
        layers=1, hidden=32, heads=2, kv_heads=1, vocab=VOCAB, intermediate=48, seed=5, max_position=64
    )
    other = opsnn.models.llama(
        layers=1, hidden=32, heads=2, kv_heads=1, vocab=VOCAB, intermediate=48, seed=6, max_position=64
    )
    p = rng.integers(0, VOCAB, (1, 6))
    cache = KVCache.for_model(m, 1, 16)
    s = cache.allocate()
    CachedDecoder(m, cache).forward(p, [s], [0])
    if not mkl.unavailable():
        # q/k/v and gate/up stacked, o and down; the last position's vocab product: sgemv
        assert len(m.derived_cache(PACKS)) == 4
    m.load_state_dict(other.state_dict())
    got = CachedDecoder(m, cache).forward(p, [s], [0])
    np.testing.assert_allclose(got[0], other(p)[0].numpy()[0, -1], rtol=1e-5, atol=1e-5)
    cache.close()


def test_batched_prefill_equals_per_request_prefill(lm, rng):
    """Several prompt chunks in one forward (whole prompts and a continued chunk, slots out of
    order) give each chunk's own last-position logits and cache rows, as prefilling them one
    by one does; a bad chunk raises before any work."""
    c1, c2 = KVCache.for_model(lm, 4, 64), KVCache.for_model(lm, 4, 64)
    d1, d2 = CachedDecoder(lm, c1), CachedDecoder(lm, c2)
    for c in (c1, c2):
        for _ in range(4):
            c.allocate()
    head = rng.integers(0, VOCAB, 5)
    for d in (d1, d2):
        d.forward(head[None], [2], [0])
    chunks = [(rng.integers(0, VOCAB, 7), 3, 0), (rng.integers(0, VOCAB, 12), 2, 5), (rng.integers(0, VOCAB, 3), 0, 0)]
    got = d1.prefill(chunks)
    want = np.stack([d2.forward(t[None], [s], [st])[0] for t, s, st in chunks])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert c1.lengths.tolist() == c2.lengths.tolist() == [3, 0, 17, 7]
    for layer in range(lm.config.num_hidden_layers):
        for s, n in ((3, 7), (2, 17), (0, 3)):
            k1, v1 = (t[s : s + 1, :, :n] for t in c1.view(layer, 0, 4))
            k2, v2 = (t[s : s + 1, :, :n] for t in c2.view(layer, 0, 4))
            np.testing.assert_allclose(k1.numpy(), k2.numpy(), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(v1.numpy(), v2.numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ParamInvalidError):
        d1.prefill([(chunks[0][0], 1, 0), (chunks[2][0], 1, 0)])  # the same slot twice
    with pytest.raises(ParamInvalidError):
        d1.prefill([(chunks[0][0], 1, 60), (chunks[2][0], 0, 0)])  # past the cache
    c1.close()
    c2.close()


def test_scheduler_prefills_a_step_s_chunks_in_one_forward(lm, rng, monkeypatch):
    calls = []
    orig = CachedDecoder.prefill
    monkeypatch.setattr(CachedDecoder, "prefill", lambda self, ch: calls.append(len(ch)) or orig(self, ch))
    ps = prompts(rng, [5, 9, 4])
    with Scheduler(lm, max_batch_slots=3, max_seq=32, max_prefill_tokens=16) as s:
        reqs = [s.submit(p, 4) for p in ps]
        s.step()
    assert calls[0] == 3  # 5 + 9 + 2 of the 4 (budget 16), one forward
    assert [r.tokens for r in reqs] == [generate(lm, p, 4).tokens for p in ps]


@pytest.mark.parametrize(
    "n,k,lo,hi", [(11, 37, 0, 11), (11, 37, 3, 10), (8, 1, 0, 8), (5, 64, 2, 2), (300, 256, 1, 299)]
)
def test_gemm_rows_matches_a_float64_oracle(rng, n, k, lo, hi):
    """opsnn.kernels.cpu.gemm.gemm_rows for 1 and 3 rows of x (a weight row at a time) and 5 (four
    weight rows a pass, a remainder loop), and its parallel form: out = x @ w[lo:hi].T (beta 0: NaN
    in out is not read) and out = x @ w[lo:hi].T + 0.5 * out."""
    from opsnn.kernels.cpu.gemm import ROW_AT_A_TIME_MAX, gemm_rows, gemm_rows_parallel

    assert 3 <= ROW_AT_A_TIME_MAX < 5

    w = rng.standard_normal((n, k)).astype(np.float32)
    for R in (1, 3, 5):
        x = rng.standard_normal((R, k)).astype(np.float32)
        want = x.astype(np.float64) @ w[lo:hi].T
        tol = 1e-6 * np.sqrt(k) * max(np.abs(want).max(initial=0.0), 1.0)
        out = np.full((R, hi - lo + 2), np.nan, np.float32)
        gemm_rows(x, w, lo, hi, np.float32(0), out[:, : hi - lo])
        np.testing.assert_allclose(out[:, : hi - lo], want, rtol=0, atol=tol)
        assert np.isnan(out[:, hi - lo :]).all()  # nothing written past the rows
        prev = rng.standard_normal((R, hi - lo)).astype(np.float32)
        out = prev.copy()
        gemm_rows(x, w, lo, hi, np.float32(0.5), out)
        np.testing.assert_allclose(out, want + 0.5 * prev, rtol=0, atol=tol)
        full = np.full((R, n), np.nan, np.float32)
        gemm_rows_parallel(x, w, full, np.float32(0))
        np.testing.assert_allclose(
            full,
            x.astype(np.float64) @ w.T,
            rtol=0,
            atol=1e-6 * np.sqrt(k) * max(np.abs(x.astype(np.float64) @ w.T).max(initial=0), 1),
        )


@pytest.mark.skipif(__import__("opsnn.kernels.cpu.mkl", fromlist=["x"]).unavailable() is not None, reason="needs MKL")
def test_decoder_projections_on_opsnn_packed_panels(lm, rng, monkeypatch):
    """On an AVX2 CPU whose GEMM library is OpenBLAS (that platform forced here), a prompt's products past
    gemm_rows' rows run on opsnn's packed GEMM over panels packed once (q|k|v and gate|up stacked, o and
    down adding into the residual); the logits agree with the all-Linear-op decoder's."""
    from opsnn.kernels.cpu import gemm_packed as G
    from opsnn.kernels.cpu import libraries as KL
    from opsnn.llm import decoder as D
    from opsnn.tools.profiler import profile

    avx2 = KL.Platform.for_isa("avx2", "AuthenticAMD")
    monkeypatch.setattr(KL, "platform", lambda: avx2)
    cache_a, cache_b = KVCache.for_model(lm, 1, 64), KVCache.for_model(lm, 1, 64)
    packed, plain = CachedDecoder(lm, cache_a), CachedDecoder(lm, cache_b)
    packed.fused_steps = False
    plain._packs = None
    p0 = packed.layers[0]
    qkv = packed._packed_cat((p0.wq, p0.wk, p0.wv), 40)
    assert isinstance(qkv, D._OwnPanels) and qkv.n == sum(w.shape[0] for w in (p0.wq, p0.wk, p0.wv))
    np.testing.assert_array_equal(
        G.unpacked(qkv.panels, qkv.n).T, np.concatenate([w.numpy() for w in (p0.wq, p0.wk, p0.wv)])
    )
    assert packed._packed_cat((p0.wq, p0.wk, p0.wv), 48) is qkv  # packed once
    assert not isinstance(packed._packed(p0.wo, 8), D._OwnPanels)  # a few rows: gemm_rows on the weight
    prompt = rng.integers(0, VOCAB, 40)
    with profile() as prof:
        got = packed.forward(prompt[None], [cache_a.allocate()], [0])
    assert "llm_linear_packed" in {k.kernel for k in prof.kernels if k.op == "Linear"}
    want = plain.forward(prompt[None], [cache_b.allocate()], [0])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    cache_a.close()
    cache_b.close()
