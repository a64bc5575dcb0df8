"""Data-parallel training benchmark: opsnn's DistributedDataParallel on 2 ranks x 1 thread against
1 rank x 1 thread, and torch.nn.parallel.DistributedDataParallel (gloo) the same way, in one run.

Models (issue 31's training benchmark sizes, per rank): a ResNet-18 (``opsnn.models.resnet18``,
10 classes) on 64x64 images, batch 32; a BERT-small encoder (``opsnn.models.bert("mini")``: 4
layers, hidden 256, 4 heads, vocab 30522) on sequences of 128, batch 8, classifying the pooled
output. torch runs re-implementations of the same architectures (``TorchResNet18``,
``TorchBert``). Training step: zero_grad, forward, cross-entropy, backward, SGD-momentum step.
Weak scaling: every rank trains on its own batch of the size above, so 2 ranks process twice the
samples per step; the physical limit of the throughput ratio is 2x.

Each configuration is a separate job (1 rank: ``python bench/ddp.py --worker ...`` with one
thread; 2 ranks: ``opsnn launch -n 2 --threads-per-rank 1``); each job warms up, then alternates
blocks of timed synchronised steps and, on 2 ranks, steps under ``no_sync()`` (same work without
the gradient allreduce); figures are medians. Columns:

- ``step ms``: median synchronised training step; ``samples/s``: ranks x batch / step;
  ``scaling``: samples/s over the same runtime's 1-rank samples/s.
- ``allreduce ms``: the bucketed gradient allreduce alone (every bucket launched, then all
  waited for, no computation running), median.
- ``exposed ms``: step - no_sync step, the communication time the step did not hide;
  ``hidden``: 1 - exposed / allreduce, the fraction of allreduce time hidden behind backward.
- opsnn also reports the time its reducer waited for buckets at the end of backward (``wait ms``).

    $ python bench/ddp.py                                    # both models, both runtimes (minutes)
    $ python bench/ddp.py --small --steps 2 --warmup 1       # tiny sizes: a smoke test of the script
    $ env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/ddp.py --json bench/results/ddp.json

Needs the ``distributed`` extra (mpi4py, Open MPI); torch (the ``test`` extra) for its columns
(``--no-torch`` leaves them out). Targets (issue 32): 2-rank throughput >= 1.8x 1-rank; opsnn's DDP
step <= 1.0x torch DDP's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
MODELS = ("resnet18", "bert-small")
THREAD_VARIABLES = (
    "OPSNN_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMBA_NUM_THREADS",
)


# -- sizes ----------------------------------------------------------------------------------------------------
def sizes(model: str, small: bool) -> dict:
    if model == "resnet18":
        return {"batch": 2, "image": 16, "classes": 10} if small else {"batch": 32, "image": 64, "classes": 10}
    if small:
        return {"batch": 2, "seq": 16, "layers": 2, "hidden": 32, "heads": 2, "inter": 64, "vocab": 1000, "classes": 2}
    return {"batch": 8, "seq": 128, "layers": 4, "hidden": 256, "heads": 4, "inter": 1024, "vocab": 30522, "classes": 2}


def make_data(model: str, s: dict, rank: int):
    rng = np.random.default_rng(1000 + rank)
    y = rng.integers(0, s["classes"], size=s["batch"])
    if model == "resnet18":
        return rng.standard_normal((s["batch"], 3, s["image"], s["image"])).astype(np.float32), y
    return rng.integers(1, s["vocab"], size=(s["batch"], s["seq"])), y


# -- opsnn ----------------------------------------------------------------------------------------------------
def opsnn_model(model: str, s: dict):
    from opsnn import models, nn

    if model == "resnet18":
        return models.resnet18(num_classes=s["classes"])

    class BertClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = models.bert(
                "mini",
                num_hidden_layers=s["layers"],
                hidden_size=s["hidden"],
                num_attention_heads=s["heads"],
                intermediate_size=s["inter"],
                vocab_size=s["vocab"],
            )
            self.head = nn.Linear(s["hidden"], s["classes"])

        def forward(self, ids):
            return self.head(self.bert(ids)[1])

    return BertClassifier()


def run_opsnn(args) -> dict:
    import opsnn
    import opsnn.distributed as dist
    from opsnn import nn, optim

    dist.init_process_group("mpi")  # a plain python run is a world of 1
    rank, world = dist.get_rank(), dist.get_world_size()
    s = sizes(args.model, args.small)
    model = opsnn_model(args.model, s).train()
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x, y = make_data(args.model, s, rank)
    x = opsnn.tensor(x) if x.dtype == np.float32 else x

    def step(sync: bool) -> float:
        t0 = time.perf_counter()
        opt.zero_grad()
        with contextlib.nullcontext() if sync or world == 1 else net.no_sync():
            loss = nn.functional.cross_entropy(net(x), y)
            loss.backward()
        opt.step()
        float(loss.item())
        return time.perf_counter() - t0

    def allreduce_alone() -> float:
        bufs = [opsnn.empty((n // 4,), "float32") for n in net.bucket_sizes]  # float32 models
        for b in bufs:
            b.numpy().fill(1.0)
        dist.barrier()
        t0 = time.perf_counter()
        works = [dist.all_reduce(b, async_op=True) for b in bufs]
        for w in works:
            w.wait()
        return time.perf_counter() - t0

    waits: list = []

    def synced() -> float:
        t = step(True)
        if world > 1:
            waits.append(net.last_backward["wait_s"])
        return t

    res = timed(args, synced, lambda: step(False), allreduce_alone if world > 1 else None, world)
    if world > 1:
        res["wait_ms"] = 1e3 * statistics.median(waits[args.warmup :] or waits)
        res["buckets"] = len(net.bucket_sizes)
    res["params"] = int(sum(p.numel for p in model.parameters()))
    dist.destroy_process_group()
    return res | {"rank": rank}


# -- torch ----------------------------------------------------------------------------------------------------
def torch_model(model: str, s: dict):
    import torch
    from torch import nn

    if model == "resnet18":

        class Basic(nn.Module):
            def __init__(self, cin, cout, stride):
                super().__init__()
                self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
                self.bn1 = nn.BatchNorm2d(cout)
                self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
                self.bn2 = nn.BatchNorm2d(cout)
                self.downsample = None
                if stride != 1 or cin != cout:
                    self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

            def forward(self, x):
                idt = x if self.downsample is None else self.downsample(x)
                out = torch.relu(self.bn1(self.conv1(x)))
                return torch.relu(self.bn2(self.conv2(out)) + idt)

        class ResNet18(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
                self.bn1 = nn.BatchNorm2d(64)
                self.maxpool = nn.MaxPool2d(3, 2, 1)
                chans, cin, layers = (64, 128, 256, 512), 64, []
                for i, c in enumerate(chans):
                    layers.append(nn.Sequential(Basic(cin, c, 1 if i == 0 else 2), Basic(c, c, 1)))
                    cin = c
                self.layer1, self.layer2, self.layer3, self.layer4 = layers
                self.fc = nn.Linear(512, s["classes"])

            def forward(self, x):
                x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
                x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
                return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

        return ResNet18()

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            d = s["hidden"]
            self.word = nn.Embedding(s["vocab"], d, padding_idx=0)
            self.pos = nn.Embedding(512, d)
            self.token_type = nn.Embedding(2, d)
            self.norm = nn.LayerNorm(d, eps=1e-12)
            self.drop = nn.Dropout(0.1)
            layer = nn.TransformerEncoderLayer(
                d, s["heads"], s["inter"], dropout=0.1, activation="gelu", batch_first=True, layer_norm_eps=1e-12
            )
            self.encoder = nn.TransformerEncoder(layer, s["layers"], enable_nested_tensor=False)
            self.pooler = nn.Linear(d, d)
            self.head = nn.Linear(d, s["classes"])

        def forward(self, ids):
            pos = torch.arange(ids.shape[1])[None]
            h = self.drop(self.norm(self.word(ids) + self.pos(pos) + self.token_type.weight[0]))
            h = self.encoder(h)
            return self.head(torch.tanh(self.pooler(h[:, 0])))

    return Bert()


def run_torch(args) -> dict:
    import torch
    import torch.distributed as tdist

    torch.set_num_threads(1)
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", "1")))
    if world > 1:
        tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world)
    s = sizes(args.model, args.small)
    torch.manual_seed(0)
    model = torch_model(args.model, s).train()
    net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x, y = make_data(args.model, s, rank)
    x, y = torch.from_numpy(x), torch.from_numpy(y)

    def step(sync: bool) -> float:
        t0 = time.perf_counter()
        opt.zero_grad()
        with contextlib.nullcontext() if sync or world == 1 else net.no_sync():
            loss = torch.nn.functional.cross_entropy(net(x), y)
            loss.backward()
        opt.step()
        float(loss.item())
        return time.perf_counter() - t0

    def allreduce_alone() -> float:
        # DDP's default 25 MB buckets over the parameters in reverse order
        bufs, size = [[]], 0
        for p in reversed(list(model.parameters())):
            if size >= 25 << 20:
                bufs.append([])
                size = 0
            bufs[-1].append(p.numel())
            size += 4 * p.numel()
        flats = [torch.ones(sum(b)) for b in bufs if b]
        tdist.barrier()
        t0 = time.perf_counter()
        works = [tdist.all_reduce(f, async_op=True) for f in flats]
        for w in works:
            w.wait()
        return time.perf_counter() - t0

    res = timed(args, lambda: step(True), lambda: step(False), allreduce_alone if world > 1 else None, world)
    res["params"] = int(sum(p.numel() for p in model.parameters()))
    if world > 1:
        tdist.destroy_process_group()
    return res | {"rank": rank}


# -- timing ----------------------------------------------------------------------------------------------------
def timed(args, synced, unsynced, comm, world: int) -> dict:
    """Warm up, then ``args.blocks`` blocks of synchronised steps, no_sync steps and lone allreduces."""
    for _ in range(args.warmup):
        synced()
        if world > 1:
            unsynced()
    sync_t, nosync_t, comm_t = [], [], []
    for _ in range(args.blocks):
        sync_t += [synced() for _ in range(args.steps)]
        if world > 1:
            nosync_t += [unsynced() for _ in range(args.steps)]
            comm_t += [comm() for _ in range(args.steps)]
    res = {"world": world, "step_ms": 1e3 * statistics.median(sync_t)}
    if world > 1:
        res["nosync_ms"] = 1e3 * statistics.median(nosync_t)
        res["allreduce_ms"] = 1e3 * statistics.median(comm_t)
    return res


def worker(args) -> None:
    res = (run_opsnn if args.worker == "opsnn" else run_torch)(args)
    if res["rank"] == 0:
        print("RESULT " + json.dumps(res), flush=True)


# -- driver ----------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job(runtime: str, model: str, ranks: int, args) -> dict:
    own = [str(HERE), "--worker", runtime, "--model", model, "--steps", str(args.steps)]
    own += ["--warmup", str(args.warmup), "--blocks", str(args.blocks), "--port", str(free_port())]
    own += ["--small"] if args.small else []
    env = dict(os.environ)
    src = str(HERE.parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else src
    if ranks == 1:
        cmd = [sys.executable, *own]
        env.update({v: "1" for v in THREAD_VARIABLES})
    else:
        cmd = [sys.executable, "-m", "opsnn.cli", "launch", "-n", str(ranks), "--threads-per-rank", "1", *own]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    out = proc.stdout + proc.stderr
    line = next((ln for ln in out.splitlines() if "RESULT " in ln), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"{runtime} {model} on {ranks} rank(s) failed ({proc.returncode}):\n{out[-4000:]}")
    return json.loads(line.split("RESULT ", 1)[1])


def table(rows: list) -> str:
    from opsnn.tools.text import table as _table

    def f(v, fmt="{:.1f}"):
        return "-" if v is None else fmt.format(v)

    body = []
    for r in rows:
        body.append(
            [
                r["model"],
                r["runtime"],
                f"{r['world']} x 1",
                f(r["step_ms"]),
                f(r["samples_s"]),
                f(r.get("scaling"), "{:.2f}x"),
                f(r.get("allreduce_ms")),
                f(r.get("exposed_ms")),
                f(r.get("hidden"), "{:.0%}"),
                f(r.get("wait_ms")),
            ]
        )
    head = ["model", "runtime", "ranks x threads", "step ms", "samples/s", "scaling", "allreduce ms"]
    return _table(body, head + ["exposed ms", "hidden", "wait ms"], width=140)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {MODELS}")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per block")
    ap.add_argument("--blocks", type=int, default=3, help="blocks of timed steps (synchronised, no_sync, comm alone)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--small", action="store_true", help="tiny sizes: checks the script, times nothing useful")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per job")
    ap.add_argument("--worker", choices=("opsnn", "torch"), help=argparse.SUPPRESS)
    ap.add_argument("--model", choices=MODELS, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=29500, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    runtimes = ["opsnn"] + ([] if args.no_torch else ["torch"])
    rows = []
    for model in [m for m in args.models.split(",") if m]:
        if model not in MODELS:
            ap.error(f"unknown model {model!r}; choose from {MODELS}")
        for runtime in runtimes:
            one = job(runtime, model, 1, args)
            two = job(runtime, model, 2, args)
            batch = sizes(model, args.small)["batch"]
            for r in (one, two):
                r.update(model=model, runtime=runtime, batch_per_rank=batch)
                r["samples_s"] = r["world"] * batch / (r["step_ms"] / 1e3)
            two["scaling"] = two["samples_s"] / one["samples_s"]
            two["exposed_ms"] = max(0.0, two["step_ms"] - two["nosync_ms"])
            two["hidden"] = (
                min(1.0, max(0.0, 1 - two["exposed_ms"] / two["allreduce_ms"])) if two["allreduce_ms"] else None
            )
            rows += [one, two]
            print(f"{model} {runtime}: done", file=sys.stderr, flush=True)
    print(table(rows))
    by = {(r["model"], r["runtime"], r["world"]): r for r in rows}
    for model in {r["model"] for r in rows}:
        o, t = by.get((model, "opsnn", 2)), by.get((model, "torch", 2))
        if o and t:
            print(f"{model}: opsnn DDP step / torch DDP step = {o['step_ms'] / t['step_ms']:.2f}x")
    print("command: " + shlex.join([sys.executable, *sys.argv]))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"command": shlex.join(sys.argv), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
