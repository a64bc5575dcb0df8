"""Large-image benchmark (issue: Models and workloads, item 5): a super-resolution conv stack on a
4096x4096 image, tiled with a halo vs the whole image in one run; the outputs are compared and
each run's peak memory-pool use (over what was live before it) is reported.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/superres_tiled.py [--size 4096]

Both runs pin ``conv2d_direct`` (the untiled run with im2col would need a workspace of
H*W*C*k*k floats, several GiB at this size) so the comparison is tiled vs untiled, same kernel.
The model is the light x2 stack of tests/test_tiling.py by default (``--channels``/``--layers``
change it). Results go to bench/results/superres_tiled.json.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import opsnn  # before numpy: OpenBLAS reads opsnn's thread timeout and ISA cap when numpy loads it

# isort: split
import numpy as np
from workloads import write_json

from opsnn.models.superres import superres
from opsnn.pipeline import TiledExecutor


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--tile", type=int, default=512)
    ap.add_argument("--channels", type=int, default=8)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--max-working-mib", type=int, default=64)
    ap.add_argument("--json", default="bench/results/superres_tiled.json")
    args = ap.parse_args(argv)
    MiB = 2**20
    print(f"opsnn {opsnn.__version__}, {os.cpu_count()} cores, load average {os.getloadavg()}")
    net = superres(scale=2, in_channels=1, channels=args.channels, num_layers=args.layers, first_kernel=3, seed=0)
    gc.collect()
    before_input = opsnn.memory.current_bytes()
    img = opsnn.tensor(np.random.default_rng(0).random((1, 1, args.size, args.size), dtype=np.float32))
    res = {"size": args.size, "tile": args.tile, "model": repr(net), "input_bytes": img.nbytes}
    with opsnn.kernel_selector(Conv="conv2d_direct"):
        ex = TiledExecutor(net, tile=args.tile, max_working_bytes=args.max_working_mib * MiB)
        tiled_out = ex.run(img)
        st = ex.stats
        tiled_peak = st["peak_bytes"] - before_input - img.nbytes  # over what was live besides the input
        print(
            f"tiled:   {st['tiles']} tiles, crop {st['crop']} (halo {st['halo']}), working set "
            f"{st['working_bytes'] / MiB:.1f} MiB, {st['wall_s']:.2f} s, pool peak over input "
            f"{tiled_peak / MiB:.1f} MiB (output {tiled_out.nbytes / MiB:.0f} MiB)"
        )
        y_tiled = tiled_out.numpy().copy()
        del tiled_out
        gc.collect()
        opsnn.memory.reset_peak()
        base = opsnn.memory.current_bytes()
        t0 = time.perf_counter()
        whole = net(img)
        wall = time.perf_counter() - t0
        whole_peak = opsnn.memory.summary()["peak_bytes"] - base
        print(f"untiled: {wall:.2f} s, pool peak over input {whole_peak / MiB:.1f} MiB")
    y = whole.numpy()
    diff = np.abs(y_tiled.astype(np.float64) - y)
    rel = float(diff.max() / max(np.abs(y).max(), 1e-30))
    identical = bool(np.array_equal(y_tiled, y))
    print(
        f"tiled vs untiled: max |diff| {diff.max():.3g}, relative {rel:.3g}, bit-identical {identical}; "
        f"peak memory tiled/untiled {tiled_peak / whole_peak:.3f}"
    )
    res.update(
        {
            "tiled": st,
            "tiled_peak_over_input_bytes": tiled_peak,
            "untiled_wall_s": wall,
            "untiled_peak_over_input_bytes": whole_peak,
            "max_abs_diff": float(diff.max()),
            "max_rel_diff": rel,
            "bit_identical": identical,
            "load_average_end": os.getloadavg(),
        }
    )
    write_json(res, args.json, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
