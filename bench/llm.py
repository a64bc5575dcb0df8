"""LLM serving benchmark (issue: Models and workloads, item 3):

(a) dynamic batching vs one-at-a-time throughput on a deterministic mixed workload
    (32 requests, prompts 16-512 tokens, outputs 16-128, greedy)        target >= 3x
(b) decode step time at position 128 vs 1024 for the "12 layers, hidden 768, 12 heads,
    4 KV heads, vocab 32000" decoder (batch 1)                          target < 2x growth
(c) decode ms/token of that decoder (prefill 128, then 64 decode steps) vs torch eager
    with the same weights and a preallocated cache (if torch is importable)

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/llm.py [--parts a,b,c]

The machine has 2 cores and other jobs may run: every figure is a median over interleaved
rounds, and the spread (min-max over rounds) is printed next to it. Results go to
bench/results/llm.json. torch is optional (``pip install --target DIR torch`` and
``PYTHONPATH=DIR``); it is never a dependency of opsnn.

Noise: decode GEMMs have few rows (1..32). OpenBLAS splits them over its 2 threads and
waits for both, so when other jobs hold the cores a GEMM can take 10-30x its quiet time
(measured here: a 12-layer batch-8 decode step 56 ms quiet, 1.6 s with two busy jobs).
Running the same command with ``OPENBLAS_NUM_THREADS=1`` shows the figures without that
effect; the JSON records the environment and the load average at both ends.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

import opsnn
from opsnn.llm import CachedDecoder, KVCache, generate, mixed_workload, replay

BIG = dict(layers=12, hidden=768, heads=12, kv_heads=4, vocab=32000)


def spread(xs) -> str:
    return f"median {statistics.median(xs):.2f} (min {min(xs):.2f}, max {max(xs):.2f}, n={len(xs)})"


# -- (a) ---------------------------------------------------------------------------------------------------
def part_a(args) -> dict:
    cfg = dict(layers=args.serve_layers, hidden=args.serve_hidden, heads=args.serve_heads,
               kv_heads=args.serve_kv_heads, vocab=32000)
    lm = opsnn.models.llama(**cfg, max_position=1024)
    items = mixed_workload(args.requests, (16, 512), (16, 128), 32000, seed=0)
    replay(lm, mixed_workload(2, (4, 8), (2, 3), 32000, 1), max_batch_slots=2, progress=False)  # compile
    ratios, batched, single, same = [], [], [], True
    for r in range(args.rounds_a):
        b = replay(lm, items, max_batch_slots=args.max_batch, progress=args.progress)
        s = replay(lm, items, sequential=True, progress=args.progress)
        same = same and b.outputs == s.outputs
        batched.append(b)
        single.append(s)
        ratios.append(b.tokens_per_s / s.tokens_per_s)
        print(f"  round {r}: batched {b.tokens_per_s:.1f} tok/s ({b.wall_s:.1f} s), one-at-a-time "
              f"{s.tokens_per_s:.1f} tok/s ({s.wall_s:.1f} s) -> {ratios[-1]:.2f}x", flush=True)
    best = batched[int(np.argsort([x.tokens_per_s for x in batched])[len(batched) // 2])]
    print("\n".join(best.lines()))
    print("\n".join(single[int(np.argsort([x.tokens_per_s for x in single])[len(single) // 2])].lines()))
    print(f"(a) dynamic batching / one-at-a-time throughput: {spread(ratios)}x; outputs identical: {same}")
    return {"model": cfg, "requests": args.requests, "prompt_tokens": sum(len(i.prompt) for i in items),
            "generated_tokens": sum(i.max_new_tokens for i in items), "max_batch_slots": args.max_batch,
            "ratio": statistics.median(ratios), "ratios": ratios, "outputs_identical": same,
            "batched": [x.as_dict() for x in batched], "one_at_a_time": [x.as_dict() for x in single]}


# -- (b) ---------------------------------------------------------------------------------------------------
def part_b(args, lm) -> dict:
    """Decode step time when the request sits at position P (the cache rows before P are
    read by attention; their contents do not change the time, so no prefill is needed)."""
    res = {}
    for batch in (1, 8):
        cache = KVCache.for_model(lm, batch, 1024 + args.steps_b + 1)
        dec = CachedDecoder(lm, cache)
        slots = [cache.allocate() for _ in range(batch)]
        tok = np.full((batch, 1), 7, np.int64)
        times = {128: [], 1024: []}
        for P in (128, 1024):  # warm-up: executors for both shapes
            dec.forward(tok, slots, [P] * batch)
        for _ in range(args.rounds):
            for P in (128, 1024):
                ts = []
                for i in range(args.steps_b):
                    t0 = time.perf_counter()
                    dec.forward(tok, slots, [P + i] * batch)
                    ts.append(time.perf_counter() - t0)
                times[P].append(statistics.median(ts) * 1e3)
        g = [b / a for a, b in zip(times[128], times[1024])]
        print(f"(b) batch {batch}: decode step at position 128: {spread(times[128])} ms; at 1024: "
              f"{spread(times[1024])} ms; growth {spread(g)}x")
        res[f"batch{batch}"] = {"ms_at_128": times[128], "ms_at_1024": times[1024], "growth": statistics.median(g),
                                "growth_per_round": g}
        del dec, cache
    return res


# -- (c) ---------------------------------------------------------------------------------------------------
class TorchLlama:
    """The same decoder in torch eager (HF LLaMA math), with a preallocated KV cache written
    in place (index_copy_) and F.scaled_dot_product_attention over the filled prefix."""

    def __init__(self, lm, max_seq: int):
        import torch

        self.torch = torch
        cfg = lm.config
        self.cfg = cfg
        t = lambda p: torch.from_numpy(np.array(p.numpy(), copy=True))  # noqa: E731
        m = lm.model
        self.embed, self.norm, self.out = t(m.embed_tokens.weight), t(m.norm.weight), t(lm.output_weight)
        cos, sin = m.rope_cos.numpy(), m.rope_sin.numpy()
        self.cos = torch.from_numpy(np.concatenate([cos, cos], -1))
        self.sin = torch.from_numpy(np.concatenate([sin, sin], -1))
        self.layers = []
        for layer in m.layers:
            a, f = layer.self_attn, layer.mlp
            self.layers.append([t(x) for x in (layer.input_layernorm.weight, a.q_proj.weight, a.k_proj.weight,
                                               a.v_proj.weight, a.o_proj.weight, layer.post_attention_layernorm.weight,
                                               f.gate_proj.weight, f.up_proj.weight, f.down_proj.weight)])
        shape = (1, cfg.num_key_value_heads, max_seq, cfg.head_dim)
        self.k = [torch.zeros(shape) for _ in m.layers]
        self.v = [torch.zeros(shape) for _ in m.layers]

    def _rms(self, x, w):
        return self.torch.nn.functional.rms_norm(x, (x.shape[-1],), w, self.cfg.rms_norm_eps)

    def _rope(self, x, cos, sin):
        h = x.shape[-1] // 2
        rot = self.torch.cat([-x[..., h:], x[..., :h]], -1)
        return x * cos + rot * sin

    def forward(self, ids: np.ndarray, start: int) -> np.ndarray:
        torch = self.torch
        F = torch.nn.functional
        cfg = self.cfg
        Hq, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        with torch.inference_mode():
            x = torch.from_numpy(ids)
            B, S = x.shape
            h = F.embedding(x, self.embed)
            pos = torch.arange(start, start + S)
            cos, sin = self.cos[pos][None, None], self.sin[pos][None, None]
            for i, (ln1, wq, wk, wv, wo, ln2, wg, wu, wd) in enumerate(self.layers):
                y = self._rms(h, ln1)
                q = F.linear(y, wq).view(B, S, Hq, D).transpose(1, 2)
                k = F.linear(y, wk).view(B, S, Hkv, D).transpose(1, 2)
                v = F.linear(y, wv).view(B, S, Hkv, D).transpose(1, 2)
                q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
                self.k[i].index_copy_(2, pos, k)
                self.v[i].index_copy_(2, pos, v)
                L = start + S
                o = F.scaled_dot_product_attention(q, self.k[i][:, :, :L], self.v[i][:, :, :L], is_causal=S > 1,
                                                   enable_gqa=True)
                h = h + F.linear(o.transpose(1, 2).reshape(B, S, Hq * D), wo)
                y = self._rms(h, ln2)
                h = h + F.linear(F.silu(F.linear(y, wg)) * F.linear(y, wu), wd)
            logits = F.linear(self._rms(h[:, -1:], self.norm), self.out)
        return logits.numpy().reshape(B, -1)

    def generate(self, prompt: np.ndarray, new: int) -> tuple[list[int], float, float]:
        """Greedy; returns (tokens, prefill ms, decode ms/token)."""
        t0 = time.perf_counter()
        tok = int(np.argmax(self.forward(prompt[None], 0)[0]))
        t1 = time.perf_counter()
        out = [tok]
        for i in range(new - 1):
            tok = int(np.argmax(self.forward(np.array([[tok]]), len(prompt) + i)[0]))
            out.append(tok)
        t2 = time.perf_counter()
        return out, (t1 - t0) * 1e3, (t2 - t1) / (new - 1) * 1e3


def part_c(args, lm) -> dict:
    prompt = np.random.default_rng(0).integers(0, 32000, 128)
    new = 65  # the first token comes from the prefill, then 64 decode steps
    try:
        import torch

        torch.set_num_threads(2)
        tl = TorchLlama(lm, 128 + new)
        tl.generate(prompt[:8], 3)  # warm-up
        tver = torch.__version__
    except ImportError:
        tl, tver = None, None
        print("(c) torch not installed: opsnn figures only")
    generate(lm, prompt[:8], 3)  # warm-up (kernels compiled, executors for decode cached)
    ours, theirs, pre_o, pre_t = [], [], [], []
    same = None
    for _ in range(args.rounds):
        r = generate(lm, prompt, new)
        ours.append(r.metrics.ms_per_token)
        pre_o.append((r.metrics.first_token - r.metrics.admitted) * 1e3)
        if tl is not None:
            toks, pre, mpt = tl.generate(prompt, new)
            theirs.append(mpt)
            pre_t.append(pre)
            same = (same is None or same) and toks == r.tokens
    print(f"(c) opsnn decode: {spread(ours)} ms/token; prefill 128: {spread(pre_o)} ms")
    res = {"opsnn_ms_per_token": ours, "opsnn_prefill_ms": pre_o, "torch": tver}
    if tl is not None:
        ratio = [t / o for o, t in zip(ours, theirs)]
        print(f"(c) torch {tver} eager decode: {spread(theirs)} ms/token; prefill 128: {spread(pre_t)} ms; "
              f"torch/opsnn time ratio {spread(ratio)} (>1: opsnn faster); greedy tokens identical: {same}")
        res.update({"torch_ms_per_token": theirs, "torch_prefill_ms": pre_t, "torch_over_opsnn": ratio,
                    "tokens_identical": same})
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="a,b,c")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds for (b) and (c)")
    ap.add_argument("--rounds-a", type=int, default=2, help="rounds of the (a) replay pair")
    ap.add_argument("--steps-b", type=int, default=10, help="decode steps timed per round in (b)")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--serve-layers", type=int, default=4)
    ap.add_argument("--serve-hidden", type=int, default=256)
    ap.add_argument("--serve-heads", type=int, default=8)
    ap.add_argument("--serve-kv-heads", type=int, default=4)
    ap.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--json", default="bench/results/llm.json")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    env = {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS",
                                          "OMP_WAIT_POLICY")}
    print(f"opsnn {opsnn.__version__}, {os.cpu_count()} cores, load average {os.getloadavg()}, env {env}")
    results = {"env": env, "load_average_start": os.getloadavg(), "command": " ".join(sys.argv)}
    if "a" in parts:
        results["a_dynamic_batching"] = part_a(args)
    if parts & {"b", "c"}:
        lm = opsnn.models.llama(**BIG, max_position=2048)
        print(f"decoder: {BIG}, intermediate {lm.config.intermediate_size}")
        if "b" in parts:
            results["b_decode_growth"] = part_b(args, lm)
        if "c" in parts:
            results["c_decode_vs_torch"] = part_c(args, lm)
    results["load_average_end"] = os.getloadavg()
    print(f"load average at the end {os.getloadavg()}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
