"""Profiler overhead on ResNet-50 (batch 1, 224x224): median latency with the profiler off vs on.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/profiler_overhead.py

Target (issue: Tools): zero when off, < 5% when on.
"""

from __future__ import annotations

import statistics
import sys
import time

import opsnn  # before numpy: OpenBLAS reads opsnn's thread timeout and ISA cap when numpy loads it

# isort: split
import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from workloads import build  # noqa: E402


def main(repeat: int = 15) -> int:
    g, feeds, _ = build("resnet50", np.random.default_rng(0))
    cg = opsnn.compile(g)

    def run():
        [v.numpy() for v in cg.run(feeds).values()]

    for _ in range(3):
        run()
    off, on = [], []
    for _ in range(repeat):  # interleave so machine noise hits both alike
        t0 = time.perf_counter()
        run()
        off.append(time.perf_counter() - t0)
        with opsnn.profiler.profile() as p:
            t0 = time.perf_counter()
            run()
            on.append(time.perf_counter() - t0)
    m_off, m_on = statistics.median(off) * 1e3, statistics.median(on) * 1e3
    print(
        f"ResNet-50: profiler off {m_off:.2f} ms, on {m_on:.2f} ms -> overhead {100 * (m_on / m_off - 1):+.1f}% "
        f"(target < 5%); {len(p.kernels)} kernel events per run"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
