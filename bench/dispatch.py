"""Host overhead of dispatch for small ops: one-shot prepare+run, a reused executor, the
eager cached path, each against the bare kernel call (median of repeated samples).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/dispatch.py [--json out.json]

Targets (issue: Foundation): a reused executor cuts host overhead per small op by >= 40%
against one-shot prepare+run; the eager cached path adds < 20 µs over the bare kernel.
"""

from __future__ import annotations

import argparse
import statistics
import time

import opsnn  # before numpy: OpenBLAS reads opsnn's thread timeout and ISA cap when numpy loads it

# isort: split
import numpy as np
from workloads import write_json


def _cases(rng):
    f32 = lambda *s: opsnn.tensor(rng.standard_normal(s).astype(np.float32))  # noqa: E731
    return [
        ("relu", lambda: ((f32(1024),), {})),
        ("add", lambda: ((f32(1024), f32(1024)), {})),
        ("mul", lambda: ((f32(32, 32), f32(32)), {})),
        ("softmax", lambda: ((f32(16, 64),), {"dim": -1})),
        ("layer_norm", lambda: ((f32(16, 64), (64,), f32(64), f32(64)), {})),
        ("matmul", lambda: ((f32(32, 32), f32(32, 32)), {})),
        ("conv2d", lambda: ((f32(1, 8, 8, 8), f32(8, 8, 3, 3)), {"padding": 1})),
        ("max_pool2d", lambda: ((f32(1, 8, 16, 16), 2), {})),
        ("reshape", lambda: ((f32(8, 128), (16, 64)), {})),
    ]


def _per_call_us(fn, inner: int, samples: int) -> float:
    for _ in range(max(inner // 4, 3)):
        fn()
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inner", type=int, default=200, help="calls per sample")
    ap.add_argument("--samples", type=int, default=15)
    ap.add_argument("--json", default="bench/results/dispatch.json")
    args = ap.parse_args()
    opsnn.init()
    rng = np.random.default_rng(0)
    rows = []
    for name, build in _cases(rng):
        if name not in opsnn.ops.FUNCTIONS:
            print(f"{name:12s} (not registered, skipped)")
            continue
        fn = opsnn.ops.FUNCTIONS[name]
        fargs, fkw = build()
        ex = fn.prepare(*fargs, **fkw)
        k = ex.kernel
        ins = [None if t is None else t.numpy() for t in ex.inputs]
        outs = [o.numpy() for o in ex.outputs]
        ws = None if ex.workspace_size == 0 else np.empty(ex.workspace_size, np.uint8)
        attrs, plan = ex.attrs, ex.plan
        bare = _per_call_us(lambda: k.fn(ins, outs, attrs, plan, ws), args.inner, args.samples)
        reused = _per_call_us(lambda: ex.run(), args.inner, args.samples)
        oneshot = _per_call_us(lambda: fn.prepare(*fargs, **fkw).run(), max(args.inner // 4, 10), args.samples)
        eager = _per_call_us(lambda: fn(*fargs, **fkw), args.inner, args.samples)
        row = {
            "op": name,
            "kernel": k.name,
            "bare_us": bare,
            "reused_executor_us": reused,
            "oneshot_prepare_run_us": oneshot,
            "eager_us": eager,
            "reused_overhead_us": reused - bare,
            "oneshot_overhead_us": oneshot - bare,
            "eager_overhead_us": eager - bare,
        }
        row["overhead_cut_pct"] = 100.0 * (1 - row["reused_overhead_us"] / row["oneshot_overhead_us"])
        rows.append(row)
    hdr = (
        f"{'op':12s} {'kernel':22s} {'bare':>8s} {'reused':>8s} {'oneshot':>8s} {'eager':>8s} "
        f"{'eager+':>8s} {'cut':>6s}"
    )
    print(hdr + "   (µs per call, medians)")
    for r in rows:
        print(
            f"{r['op']:12s} {r['kernel']:22s} {r['bare_us']:8.2f} {r['reused_executor_us']:8.2f} "
            f"{r['oneshot_prepare_run_us']:8.2f} {r['eager_us']:8.2f} {r['eager_overhead_us']:8.2f} "
            f"{r['overhead_cut_pct']:5.1f}%"
        )
    if rows:
        cut = statistics.median(r["overhead_cut_pct"] for r in rows)
        eager_add = statistics.median(r["eager_overhead_us"] for r in rows)
        print(f"\nmedian overhead cut by reusing an executor vs one-shot prepare+run: {cut:.1f}% (target >= 40%)")
        print(f"median eager overhead over the bare kernel: {eager_add:.2f} µs (target < 20 µs)")
    write_json({"benchmark": "dispatch", "rows": rows}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
