"""LLM serving benchmark (issue: Models and workloads, item 3):

(a) dynamic batching vs one-at-a-time throughput on a deterministic mixed workload
    (32 requests, prompts 16-512 tokens, outputs 16-128, greedy)        target >= 3x
(b) decode step time at position 128 vs 1024 for the "12 layers, hidden 768, 12 heads,
    4 KV heads, vocab 32000" decoder (batch 1)                          target < 2x growth
(decode ms/token of that decoder against torch eager and onnxruntime, same weights:
``bench/models.py --models llama``, i.e. ``opsnn bench``)

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/llm.py [--parts a,b]

The machine has 2 cores and other jobs may run: every figure is a median over interleaved
rounds, and the spread (min-max over rounds) is printed next to it. Results go to
bench/results/llm.json.

Noise: decode GEMMs have few rows (1..32). OpenBLAS splits them over its 2 threads and
waits for both, so when other jobs hold the cores a GEMM can take many times its quiet time
(docs/performance.md, "Under load").
Running the same command with ``OPENBLAS_NUM_THREADS=1`` shows the figures without that
effect; the JSON records the environment and the load average at both ends.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import opsnn  # before numpy: OpenBLAS reads opsnn's thread timeout and ISA cap when numpy loads it

# isort: split
import numpy as np
from workloads import write_json

from opsnn.llm import CachedDecoder, KVCache, mixed_workload, replay

BIG = dict(layers=12, hidden=768, heads=12, kv_heads=4, vocab=32000)


def spread(xs) -> str:
    return f"median {statistics.median(xs):.2f} (min {min(xs):.2f}, max {max(xs):.2f}, n={len(xs)})"


# -- (a) ---------------------------------------------------------------------------------------------------
def part_a(args) -> dict:
    cfg = dict(
        layers=args.serve_layers,
        hidden=args.serve_hidden,
        heads=args.serve_heads,
        kv_heads=args.serve_kv_heads,
        vocab=32000,
    )
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
        print(
            f"  round {r}: batched {b.tokens_per_s:.1f} tok/s ({b.wall_s:.1f} s), one-at-a-time "
            f"{s.tokens_per_s:.1f} tok/s ({s.wall_s:.1f} s) -> {ratios[-1]:.2f}x",
            flush=True,
        )
    best = batched[int(np.argsort([x.tokens_per_s for x in batched])[len(batched) // 2])]
    print("\n".join(best.lines()))
    print("\n".join(single[int(np.argsort([x.tokens_per_s for x in single])[len(single) // 2])].lines()))
    print(f"(a) dynamic batching / one-at-a-time throughput: {spread(ratios)}x; outputs identical: {same}")
    return {
        "model": cfg,
        "requests": args.requests,
        "prompt_tokens": sum(len(i.prompt) for i in items),
        "generated_tokens": sum(i.max_new_tokens for i in items),
        "max_batch_slots": args.max_batch,
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "outputs_identical": same,
        "batched": [x.as_dict() for x in batched],
        "one_at_a_time": [x.as_dict() for x in single],
    }


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
        print(
            f"(b) batch {batch}: decode step at position 128: {spread(times[128])} ms; at 1024: "
            f"{spread(times[1024])} ms; growth {spread(g)}x"
        )
        res[f"batch{batch}"] = {
            "ms_at_128": times[128],
            "ms_at_1024": times[1024],
            "growth": statistics.median(g),
            "growth_per_round": g,
        }
        del dec, cache
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="a,b")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds for (b)")
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
    env = {
        k: os.environ.get(k)
        for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OMP_WAIT_POLICY")
    }
    print(f"opsnn {opsnn.__version__}, {os.cpu_count()} cores, load average {os.getloadavg()}, env {env}")
    results = {"env": env, "load_average_start": os.getloadavg(), "command": " ".join(sys.argv)}
    if "a" in parts:
        results["a_dynamic_batching"] = part_a(args)
    if "b" in parts:
        lm = opsnn.models.llama(**BIG, max_position=2048)
        print(f"decoder: {BIG}, intermediate {lm.config.intermediate_size}")
        results["b_decode_growth"] = part_b(args, lm)
    results["load_average_end"] = os.getloadavg()
    print(f"load average at the end {os.getloadavg()}")
    write_json(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
