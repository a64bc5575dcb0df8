"""Where a model's time goes, op by op, in opsnn and in onnxruntime (same ONNX file, same input).

    .venv/bin/python bench/op_profile.py --model resnet50|bert [--runs 5] [--by-shape]

Per op type: calls per run, total ms per run, for opsnn (its profiler over the compiled graph)
and for onnxruntime (its own profiler, node kernel times; onnxruntime fuses differently, so
compare totals and the large rows). ``--by-shape``: opsnn vs onnxruntime per conv layer shape
(input, weight), largest difference first (onnxruntime's profile leaves out MatMul weights, so
only convs pair up). Both profilers add overhead (ORT's more);
use bench/models.py for latency figures.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import defaultdict

import opsnn  # noqa: F401 - before numpy: OpenBLAS reads opsnn's thread timeout and ISA cap when numpy loads it

# isort: split
import numpy as np
from workloads import build


def opsnn_profile(graph, feeds, runs: int):
    from opsnn.tools.profiler import profile

    cg = opsnn.compile(graph)
    for _ in range(3):
        cg.run(feeds)
    time.sleep(0.3)
    with profile() as p:
        for _ in range(runs):
            cg.run(feeds)
    by_op, by_shape = defaultdict(lambda: [0, 0.0]), defaultdict(float)
    for k in p.kernels:
        by_op[k.op][0] += 1
        by_op[k.op][1] += k.duration * 1e3
        if _kind(k.op) == "Conv" and len(k.shapes) > 1 and k.shapes[1] is not None:
            by_shape[(_kind(k.op), tuple(k.shapes[0][1:]), tuple(k.shapes[1]))] += k.duration * 1e3
    return by_op, by_shape


def ort_profile(data: bytes, feeds, runs: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = os.cpu_count() or 1
    so.enable_profiling = True
    with tempfile.TemporaryDirectory(prefix="opsnn-ortprof-") as tmp:  # ORT's trace files go here, then away
        so.profile_file_prefix = os.path.join(tmp, "ort")
        sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        for _ in range(3):
            sess.run(None, feeds)
        sess.end_profiling()  # drop the warm-up runs: start a fresh profile
        sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        for _ in range(runs + 1):
            sess.run(None, feeds)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    by_op, by_shape = defaultdict(lambda: [0, 0.0]), defaultdict(float)
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        op = e["args"]["op_name"]
        by_op[op][0] += 1
        by_op[op][1] += e["dur"] / 1e3
        shapes = [next(iter(s.values())) for s in e["args"].get("input_type_shape", [])]
        if _kind(op) == "Conv" and len(shapes) > 1:
            by_shape[(_kind(op), tuple(shapes[0][1:]), tuple(shapes[1]))] += e["dur"] / 1e3
    return by_op, by_shape, runs + 1


def _kind(op: str) -> str:
    return {"FusedConv": "Conv", "BlockedConv": "Conv", "FusedMatMul": "MatMul", "FusedGemm": "Gemm"}.get(op, op)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50", choices=["resnet50", "bert", "bert-tiny"])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--by-shape", action="store_true")
    args = ap.parse_args()
    graph, feeds, data = build(args.model, np.random.default_rng(0))
    ours, ours_shape = opsnn_profile(graph, feeds, args.runs)
    try:
        theirs, theirs_shape, ort_runs = ort_profile(data, feeds, args.runs)
    except ImportError as e:
        print(f"onnxruntime not importable ({e}): opsnn only")
        theirs, theirs_shape, ort_runs = {}, {}, 1
    n = args.runs
    print(
        f"{args.model}: per run, opsnn {sum(v[1] for v in ours.values()) / n:.2f} ms of kernels, onnxruntime "
        f"{sum(v[1] for v in theirs.values()) / ort_runs:.2f} ms of node kernels"
    )
    print(f"{'opsnn op':24s} {'calls':>6s} {'ms':>9s}    {'onnxruntime op':24s} {'calls':>6s} {'ms':>9s}")
    a = sorted(ours.items(), key=lambda kv: -kv[1][1])
    b = sorted(theirs.items(), key=lambda kv: -kv[1][1])
    for i in range(max(len(a), len(b))):
        left = f"{a[i][0][:24]:24s} {a[i][1][0] // n:6d} {a[i][1][1] / n:9.2f}" if i < len(a) else " " * 41
        right = f"{b[i][0][:24]:24s} {b[i][1][0] // ort_runs:6d} {b[i][1][1] / ort_runs:9.2f}" if i < len(b) else ""
        print(f"{left}    {right}")
    if args.by_shape:
        print(f"\n{'op, input shape, weight shape':60s} {'opsnn ms':>9s} {'ORT ms':>9s} {'diff':>7s}")
        rows = []
        for key, t in ours_shape.items():
            o = theirs_shape.get(key)
            rows.append(
                (
                    t / n - (o / ort_runs if o is not None else 0.0),
                    key,
                    t / n,
                    o / ort_runs if o is not None else float("nan"),
                )
            )
        for d, key, t, o in sorted(rows, key=lambda r: -r[0]):
            print(f"{str(key)[:60]:60s} {t:9.2f} {o:9.2f} {d:+7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
