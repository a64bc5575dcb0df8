"""Serial vs parallel variants of the pointwise and row kernel families, size by size: the
comparison behind ``PARALLEL_MIN`` in ``src/opsnn/kernels/cpu/{activation,elementwise,norm,
reduction,dropout}.py`` (docs/performance.md, "Parallel thresholds").

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/parallel_thresholds.py \\
        [--sizes 32K,256K,1M,4M] [--repeat 200] [--lead gemm] [--json PATH]

For each op and size, two executors are prepared: one with the family's threshold set past the
size (the serial variant) and one with it at 0 (the parallel variant, every thread); their
calls alternate, and each figure is the median in microseconds. Where serial is faster at a
size, the threshold belongs above it. ``--lead gemm`` runs a threaded 256^3 float32 product
(untimed) before every call, as a training step's products precede its elementwise and row passes:
the product leaves the OpenMP pool awake, where an isolated call finds it asleep.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import opsnn  # before numpy: OpenBLAS reads opsnn's thread timeout and ISA cap when numpy loads it

# isort: split
import numpy as np
from workloads import write_json

from opsnn.kernels.cpu import activation, dropout, elementwise, norm, reduction

ROW = 768  # row length for the row-wise ops (LayerNorm, softmax, sum over rows): BERT-base's hidden size

#: (name, module, threshold attribute, prepare(x) -> Executor)
CASES = [
    ("relu", activation, "PARALLEL_MIN", lambda x: opsnn.aclnn.relu.prepare(x)),
    ("sigmoid", activation, "PARALLEL_MIN_COSTLY", lambda x: opsnn.aclnn.sigmoid.prepare(x)),
    ("gelu", activation, "PARALLEL_MIN_COSTLY", lambda x: opsnn.aclnn.gelu.prepare(x)),
    ("softmax", activation, "PARALLEL_MIN_COSTLY", lambda x: opsnn.aclnn.softmax.prepare(x, dim=-1)),
    ("add", elementwise, "PARALLEL_MIN", lambda x: opsnn.aclnn.add.prepare(x, x)),
    ("layer_norm", norm, "PARALLEL_MIN", lambda x: opsnn.aclnn.layer_norm.prepare(x, (ROW,))),
    (
        "layer_norm backward",
        norm,
        "PARALLEL_MIN",
        lambda x: opsnn.aclnn.layer_norm_backward.prepare(x, x, (ROW,), opsnn.tensor(np.ones(ROW, np.float32))),
    ),
    ("sum over rows", reduction, "PARALLEL_MIN", lambda x: opsnn.aclnn.sum.prepare(x, dim=-1)),
    ("dropout", dropout, "FORWARD_PARALLEL_MIN", lambda x: opsnn.aclnn.native_dropout.prepare(x, 0.1, np.int64(7))),
    (
        "dropout backward",
        dropout,
        "PARALLEL_MIN",
        lambda x: opsnn.aclnn.native_dropout_backward.prepare(x, np.ones(x.shape, np.bool_), 0.1),
    ),
]


def _size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
    return int(float(text.rstrip("KM")) * scale)


def _variant(module, attr: str, value: int, prepare, x):
    old = getattr(module, attr)
    setattr(module, attr, value)
    try:
        return prepare(x)
    finally:
        setattr(module, attr, old)


def _lead_gemm():
    a = np.random.default_rng(1).standard_normal((256, 256)).astype(np.float32)
    x = opsnn.tensor(a)
    return lambda: opsnn.ops.matmul(x, x)


def compare(name: str, module, attr: str, prepare, n: int, repeat: int, lead=None) -> dict:
    x = opsnn.tensor(np.random.default_rng(0).standard_normal((max(n // ROW, 1), ROW)).astype(np.float32))
    variants = {
        "serial": _variant(module, attr, 1 << 62, prepare, x),
        "parallel": _variant(module, attr, 0, prepare, x),
    }
    ws = {k: opsnn.empty((ex.workspace_size,), "uint8") for k, ex in variants.items()}
    times: dict = {k: [] for k in variants}
    for _ in range(repeat):
        for k, ex in variants.items():
            if lead is not None:
                lead()
            t0 = time.perf_counter()
            ex.run(ws[k])
            opsnn.current_stream().synchronize()
            times[k].append(time.perf_counter() - t0)
    out = {k: statistics.median(v[1:] or v) * 1e6 for k, v in times.items()}
    return {
        "op": name,
        "threshold": f"{module.__name__.rsplit('.', 1)[-1]}.{attr}",
        "current": getattr(module, attr),
        "elements": int(x.shape[0] * x.shape[1]),
        "serial_us": round(out["serial"], 2),
        "parallel_us": round(out["parallel"], 2),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="32K,96K,256K,512K,1M,4M", help="elements per tensor (K = 1024, M = 1024^2)")
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--only", default="", help="comma-separated op names (default: all)")
    ap.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="threads per kernel, fixed (default: every core; 'auto' would go serial under load)",
    )
    ap.add_argument(
        "--lead", choices=("none", "gemm"), default="none", help="'gemm': a threaded product before every call"
    )
    ap.add_argument("--json", default="bench/results/parallel_thresholds.json")
    args = ap.parse_args(argv)
    opsnn.set_num_threads(args.threads)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    lead = _lead_gemm() if args.lead == "gemm" else None
    print(f"threads: {opsnn.get_num_threads()}; lead: {args.lead}; median us per call, serial vs parallel")
    rows = []
    for name, module, attr, prepare in CASES:
        if only and name not in only:
            continue
        for n in (_size(s) for s in args.sizes.split(",")):
            r = compare(name, module, attr, prepare, n, args.repeat, lead)
            rows.append(r)
            print(
                f"  {name:14s} {r['elements']:>9d}  serial {r['serial_us']:9.1f}  parallel {r['parallel_us']:9.1f}"
                f"   ({r['threshold']} = {r['current']})"
            )
    write_json({"rows": rows, "threads": opsnn.get_num_threads(), "lead": args.lead}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
