"""Data-parallel training of a small CNN on a synthetic dataset, one process per rank.

Every rank builds the same model, wraps it in ``DistributedDataParallel`` (rank 0's weights are
broadcast, gradients averaged during backward), and trains on its own shard of each epoch
(``DistributedSampler``). Rank 0 alone prints progress and writes the checkpoint at the end of
each epoch; every rank can resume from it::

    $ opsnn launch -n 2 examples/train_ddp.py --ddp-backend mpi --epochs 2 --checkpoint ckpt.safetensors
    $ opsnn launch -n 2 examples/train_ddp.py --epochs 3 --checkpoint ckpt.safetensors --resume
    $ mpirun -np 2 python examples/train_ddp.py          # the same without the launcher
    $ python examples/train_ddp.py                       # one process: a world of one
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import opsnn
import opsnn.distributed as dist
from opsnn import nn, optim
from opsnn.utils.data import DistributedSampler


def build_model() -> nn.Module:
    with nn.init.seeded(0):
        return nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(32, 10),
        )


def synthetic_dataset(n: int, seed: int = 0):
    """Images whose class shifts the mean of one colour channel: learnable in a few epochs."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, size=n)
    x = rng.standard_normal((n, 3, 16, 16)).astype(np.float32)
    x[np.arange(n), y % 3] += (y[:, None, None] / 5.0).astype(np.float32)
    return x, y


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ddp-backend", default=os.environ.get("OPSNN_DDP_BACKEND", "mpi"))
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--checkpoint", help="written by rank 0 at the end of every epoch")
    ap.add_argument("--resume", action="store_true", help="continue from --checkpoint (on every rank)")
    args = ap.parse_args(argv)

    dist.init_process_group(args.ddp_backend)
    world = dist.get_world_size()
    model = build_model().train()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    first_epoch = 0
    if args.resume:
        # every rank reads the same file: model, optimizer state and step agree without a broadcast
        info = opsnn.load_checkpoint(args.checkpoint, model, opt)
        first_epoch = info["extra"]["epoch"] + 1
        if dist.is_main_process():
            print(f"resumed from {args.checkpoint} after epoch {first_epoch - 1} (step {info['step']})", flush=True)

    x, y = synthetic_dataset(args.samples)
    sampler = DistributedSampler(len(y), shuffle=True, seed=0, drop_last=True)
    steps_per_epoch = len(sampler) // args.batch_size
    step = first_epoch * steps_per_epoch
    for epoch in range(first_epoch, args.epochs):
        sampler.set_epoch(epoch)  # the same permutation on every rank, a new one each epoch
        idx = np.asarray(list(sampler))
        t0, total = time.perf_counter(), 0.0
        for b in range(steps_per_epoch):
            sel = idx[b * args.batch_size : (b + 1) * args.batch_size]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(ddp(opsnn.tensor(x[sel])), y[sel])
            loss.backward()  # gradients averaged over the ranks when this returns
            opt.step()
            step += 1
            total += float(loss.item())
        if dist.is_main_process():
            rate = world * steps_per_epoch * args.batch_size / (time.perf_counter() - t0)
            print(
                f"epoch {epoch}: rank 0 mean loss {total / max(steps_per_epoch, 1):.4f}, {rate:.0f} samples/s on {world} rank(s)",
                flush=True,
            )
        if args.checkpoint:
            # rank 0 writes (the plain model's keys: ddp.module); every rank returns once the file is complete
            dist.run_on_rank0(opsnn.save_checkpoint, args.checkpoint, model, opt, step=step, extra={"epoch": epoch})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
