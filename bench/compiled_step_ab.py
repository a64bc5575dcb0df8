"""Interleaved A/B of one training step in one process: opsnn eager, the compiled step as it was
(``--old-passes``: the compiled-step fusions listed there switched off while it compiles) and the
compiled step now, on bench/train.py's models, data and AdamW. Each round runs a block of steps of
every configuration in a rotating order; the table gives each one's median block mean and its ratio
to eager. Indicative only (one process, shared caches); bench/train.py is the benchmark.

    python bench/compiled_step_ab.py --models resnet,bert,llama --threads 2 --rounds 7 --block 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import opsnn  # before numpy: OpenBLAS reads opsnn's thread timeout and ISA cap when numpy loads it

# isort: split
import train as B  # bench/train.py: the models, data and loss

from opsnn.autograd import compiled as _compiled
from opsnn.graph import elementwise_fusion as _ew


@contextmanager
def _old_passes():
    """The compiled step before this branch: ReLU backward as Greater -> Where, the loss and its
    gradient as two kernels."""
    saved = _ew._relu_grads, _compiled.fuse_loss_heads
    _ew._relu_grads = lambda graph, metas, consumers, outputs, res: {}
    _compiled.fuse_loss_heads = lambda graph, dtype_of=None: 0
    try:
        yield
    finally:
        _ew._relu_grads, _compiled.fuse_loss_heads = saved


def _case(spec, compiled: bool, old: bool):
    model = B.build_opsnn(spec)
    opt = opsnn.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    model.train()
    x, y = B.make_batch(spec)

    def train_step(xb, yb):
        opt.zero_grad()
        loss = B.opsnn_loss(spec, model, xb, yb)
        loss.backward()
        opt.step()
        return loss

    if not compiled:
        return lambda: float(train_step(x, y).item())
    step = opsnn.compile(train_step)
    if old:
        with _old_passes():
            step(x, y)  # traces and compiles under the old passes
    return lambda: float(step(x, y).item())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet,bert,llama")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--block", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="bench/train.py's tiny shapes (a smoke run)")
    args = ap.parse_args(argv)
    opsnn.set_num_threads(args.threads)
    specs = B.specs(args.tiny)
    for name in args.models.split(","):
        spec = specs[name]
        cases = {
            "eager": _case(spec, False, False),
            "compiled_old": _case(spec, True, True),
            "compiled_new": _case(spec, True, False),
        }
        for fn in cases.values():
            for _ in range(args.warmup):
                fn()
        means = {k: [] for k in cases}
        order = list(cases)
        for r in range(args.rounds):
            for k in order[r % len(order) :] + order[: r % len(order)]:
                t0 = time.perf_counter()
                for _ in range(args.block):
                    cases[k]()
                means[k].append((time.perf_counter() - t0) / args.block)
        med = {k: statistics.median(v) * 1e3 for k, v in means.items()}
        print(f"{spec.describe()} ({args.threads} threads, {args.rounds} rounds x {args.block} steps)")
        for k, ms in med.items():
            print(f"  {k:<13} {ms:9.1f} ms  {ms / med['eager']:.3f}x eager")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
