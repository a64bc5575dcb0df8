"""ResNet-50 (batch 1, compiled) latency while other processes hold the cores.

Spawns ``--hogs`` busy-loop processes, then times the compiled model in a fresh process per
threading setting (numba and OpenBLAS read theirs at start-up), then once more with the hogs
stopped, and onnxruntime (when installed) on the same model both ways. Shows what
oversubscription costs each setting: fork-join parallel regions (numba's, OpenBLAS') wait for
a descheduled thread once per region.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/under_load.py [--hogs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

VARIANTS = {
    "default (threads auto)": {},
    "OPSNN_NUM_THREADS=2": {"OPSNN_NUM_THREADS": "2"},
    "NUMBA_NUM_THREADS=1": {"NUMBA_NUM_THREADS": "1"},
    "OPENBLAS_NUM_THREADS=1": {"OPENBLAS_NUM_THREADS": "1"},
    "both =1": {"NUMBA_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"},
}


def child(runs: int, peer: bool) -> None:
    import numpy as np

    import opsnn

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from workloads import build

    graph, feeds, data = build("resnet50", np.random.default_rng(0))
    if peer:
        import onnxruntime as ort

        sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        run = lambda: sess.run(None, feeds)  # noqa: E731
    else:
        cg = opsnn.compile(graph)
        run = lambda: cg.run(feeds)  # noqa: E731
    for _ in range(2):
        run()
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        run()
        ts.append((time.perf_counter() - t) * 1e3)
    print(json.dumps(ts))


def timed(variant_env: dict, runs: int, peer: bool = False) -> list:
    env = dict(os.environ, **variant_env)
    out = subprocess.run(
        [sys.executable, __file__, "--child", "--runs", str(runs)] + (["--peer"] if peer else []),
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def have_onnxruntime() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hogs", type=int, default=2, help="busy-loop processes to run alongside")
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.runs, args.peer)
        return 0
    peer = have_onnxruntime()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()}; ResNet-50 b1 compiled, median of {args.runs}")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    try:
        time.sleep(1)
        for name, env in VARIANTS.items():
            ts = timed(env, args.runs)
            print(f"  {args.hogs} hogs, {name:24s} {statistics.median(ts):8.1f} ms  (min {min(ts):.1f})")
        if peer:
            ts = timed({}, args.runs, peer=True)
            print(f"  {args.hogs} hogs, {'onnxruntime':24s} {statistics.median(ts):8.1f} ms  (min {min(ts):.1f})")
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    ts = timed({}, args.runs)
    print(f"  no hogs, {'default':24s} {statistics.median(ts):8.1f} ms  (min {min(ts):.1f})")
    if peer:
        ts = timed({}, args.runs, peer=True)
        print(f"  no hogs, {'onnxruntime':24s} {statistics.median(ts):8.1f} ms  (min {min(ts):.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
