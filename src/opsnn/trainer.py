"""``opsnn train``: train a built-in model on synthetic data the job makes itself.

``resnet18`` and ``bert-tiny`` learn to classify (images drawn around one template per class;
token sequences whose label is one of their tokens), ``llama-tiny`` learns next-token
prediction on arithmetic token sequences. The data set is a fixed set of ``samples`` examples
cut into batches in step order, so a run is deterministic and a resumed one continues
bit-identically. ``--dtype bfloat16`` runs the forward and loss under ``opsnn.autocast``
(float32 master weights).

>>> from opsnn import trainer
>>> cfg = trainer.TrainConfig(model="llama-tiny", steps=2, batch=2, seq_len=8, vocab=50)
>>> result = trainer.train(cfg)
>>> len(result.losses), result.step
(2, 2)
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from . import amp, models, nn, ops, optim
from .checkpoint import checkpoint_info, load_checkpoint, save_checkpoint
from .errors import ParamInvalidError

MODELS = ("resnet18", "bert-tiny", "llama-tiny")
DTYPES = ("float32", "bfloat16")
OPTIMIZERS = ("sgd", "adamw")
DEFAULT_LR = {"sgd": 0.05, "adamw": 1e-3}
#: what a resumed run must share with the checkpoint it continues (the model, its data, the optimizer)
_SAME_ON_RESUME = ("model", "optimizer", "batch", "seed", "image_size", "seq_len", "vocab", "num_classes", "samples")


@dataclass
class TrainConfig:
    """One training job. ``steps`` is the step count to reach (a resumed run continues up to it);
    ``lr`` None takes ``DEFAULT_LR[optimizer]``; ``samples`` None: four batches."""

    model: str = "resnet18"
    steps: int = 100
    batch: int = 8
    dtype: str = "float32"
    optimizer: str = "adamw"
    lr: float | None = None
    seed: int = 0
    image_size: int = 32
    seq_len: int = 32
    vocab: int = 1000
    num_classes: int = 10
    samples: int | None = None

    def check(self) -> TrainConfig:
        """Raise a ParamInvalidError naming the flag and what it accepts; returns self."""
        for name, allowed in (("model", MODELS), ("dtype", DTYPES), ("optimizer", OPTIMIZERS)):
            if getattr(self, name) not in allowed:
                raise ParamInvalidError(f"--{name} {getattr(self, name)!r}: expected one of {', '.join(allowed)}")
        minimum = {"steps": 1, "batch": 1, "image_size": 8, "seq_len": 2, "vocab": 4, "num_classes": 2}
        for name, low in minimum.items():
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ParamInvalidError(f"{_flag(name)} {v!r}: expected an integer >= {low}")
        if self.samples is not None and (not isinstance(self.samples, int) or self.samples < self.batch):
            raise ParamInvalidError(f"--samples {self.samples!r}: expected an integer >= --batch ({self.batch})")
        if self.lr is not None and not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ParamInvalidError(f"--lr {self.lr!r}: expected a positive finite number")
        return self

    @property
    def learning_rate(self) -> float:
        return DEFAULT_LR[self.optimizer] if self.lr is None else float(self.lr)

    @property
    def num_samples(self) -> int:
        return 4 * self.batch if self.samples is None else int(self.samples)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


class BertClassifier(nn.Module):
    """BERT with a linear classifier on the pooled output (Hugging Face's names: ``bert.``, ``classifier``)."""

    def __init__(self, bert, num_classes: int):
        super().__init__()
        self.bert = bert
        self.classifier = nn.Linear(bert.config.hidden_size, num_classes)

    def forward(self, input_ids):
        return self.classifier(self.bert(input_ids)[1])


@dataclass
class Task:
    """A model, its data set as a list of (inputs, targets) batches, and its loss."""

    model: nn.Module
    batches: list
    loss: object  # (model, inputs, targets) -> scalar Tensor
    unit: str = "samples"


def _classify(model, x, y):
    return nn.functional.cross_entropy(model(x), y)


def _next_token(model, ids, _):
    logits = model(ids[:, :-1])[0]
    v = logits.shape[-1]
    return nn.functional.cross_entropy(ops.reshape(logits, (-1, v)), ids[:, 1:].reshape(-1))


def build_task(cfg: TrainConfig, rank: int = 0, world_size: int = 1) -> Task:
    """The model (weights from ``cfg.seed``) and its synthetic data set; with ``world_size`` > 1,
    this rank's shard of the samples (``DistributedSampler``, in order), cut into ``cfg.batch``-sized
    batches: each rank trains on its own share of a global batch of ``batch * world_size``."""
    from .utils.data import DistributedSampler

    cfg.check()
    rng = np.random.default_rng(cfg.seed)
    n, b = cfg.num_samples, cfg.batch
    idx = np.asarray(list(DistributedSampler(n, num_replicas=world_size, rank=rank, shuffle=False)), np.int64)
    if len(idx) < b:
        raise ParamInvalidError(
            f"--samples {n}: {world_size} rank(s) of --batch {b} need at least {b * world_size} samples"
        )

    def cut(*arrays):
        local = [None if a is None else a[idx] for a in arrays]
        return [tuple(None if a is None else a[i : i + b] for a in local) for i in range(0, len(idx) - b + 1, b)]

    if cfg.model == "resnet18":
        model = models.resnet18(num_classes=cfg.num_classes, seed=cfg.seed)
        s = cfg.image_size
        templates = rng.standard_normal((cfg.num_classes, 3, s, s)).astype(np.float32)
        y = rng.integers(0, cfg.num_classes, n)
        x = (templates[y] + 0.5 * rng.standard_normal((n, 3, s, s))).astype(np.float32)
        data, loss = cut(x, y), _classify
    elif cfg.model == "bert-tiny":
        bert = models.bert("tiny", seed=cfg.seed, vocab_size=cfg.vocab, max_position_embeddings=cfg.seq_len)
        with nn.init.seeded(cfg.seed + 1):
            model = BertClassifier(bert, cfg.num_classes)
        ids = rng.integers(0, cfg.vocab, (n, cfg.seq_len))
        y = ids[:, 1] % cfg.num_classes  # the label is written in the sequence: attention must find it
        data, loss = cut(ids, y), _classify
    else:
        model = models.llama(
            layers=2, hidden=128, heads=4, kv_heads=2, vocab=cfg.vocab, max_position=cfg.seq_len, seed=cfg.seed
        )
        start = rng.integers(0, cfg.vocab, (n, 1))
        stride = rng.integers(1, 8, (n, 1))
        ids = (start + stride * np.arange(cfg.seq_len + 1)) % cfg.vocab  # predictable from two tokens on
        data, loss = cut(ids, None), _next_token
    return Task(model.train(), data, loss)


def make_optimizer(cfg: TrainConfig, params):
    if cfg.optimizer == "sgd":
        return optim.SGD(params, lr=cfg.learning_rate, momentum=0.9)
    return optim.AdamW(params, lr=cfg.learning_rate, weight_decay=0.01)


@dataclass
class TrainResult:
    config: TrainConfig
    losses: list = field(default_factory=list)  # one per step, from step 1 (resumed runs included)
    step: int = 0
    start_step: int = 0  # where this run began (0, or the checkpoint's step)
    seconds: float = 0.0  # this run's training time
    checkpoint: str | None = None
    task: Task | None = None
    world_size: int = 1  # ranks that trained together, each on --batch samples per step

    @property
    def samples_per_s(self) -> float:
        """Samples per second over every rank."""
        done = (self.step - self.start_step) * self.config.batch * self.world_size
        return done / self.seconds if self.seconds > 0 else 0.0


def read_resume_config(path) -> tuple[dict, int]:
    """The config a checkpoint written by :func:`train` was made with, and its step."""
    info = checkpoint_info(path)
    cfg = info["extra"].get("train_config")
    if not isinstance(cfg, dict):
        raise ParamInvalidError(f"--resume {path}: not a checkpoint written by opsnn train (no train_config in it)")
    return cfg, info["step"]


def train(cfg: TrainConfig, *, resume=None, out=None, on_step=None, ddp: bool = False) -> TrainResult:
    """Train up to step ``cfg.steps`` (from a checkpoint's step with ``resume``); ``out``: a folder
    to write ``checkpoint.safetensors`` into at the end; ``on_step(step, loss, samples_per_s)``
    after each step. Reseeds ``opsnn.manual_seed(cfg.seed)`` first (dropout masks).

    ``ddp=True`` (after ``opsnn.distributed.init_process_group``): the model trains wrapped in
    ``DistributedDataParallel`` on this rank's shard of the data; the reported loss is the mean
    over the ranks, and rank 0 alone writes the checkpoint, which every rank can resume from."""
    cfg.check()
    nn.init.manual_seed(cfg.seed)  # dropout masks (BERT's) come from this generator; a checkpoint restores it
    rank, world = 0, 1
    if ddp:
        from . import distributed as dist

        rank, world = dist.get_rank(), dist.get_world_size()
    task = build_task(cfg, rank, world)
    model = task.model
    net = nn.parallel.DistributedDataParallel(model) if ddp else model
    opt = make_optimizer(cfg, net.parameters())
    result = TrainResult(cfg, task=task, world_size=world)
    if resume is not None:
        saved, step = read_resume_config(resume)
        diff = [k for k in _SAME_ON_RESUME if k in saved and saved[k] != getattr(cfg, k)]
        if diff:
            k = diff[0]
            raise ParamInvalidError(
                f"{_flag(k)} {getattr(cfg, k)!r}: the checkpoint {resume} was trained with {saved[k]!r}"
            )
        if step >= cfg.steps:
            raise ParamInvalidError(
                f"--steps {cfg.steps}: the checkpoint {resume} is at step {step} already; ask for more steps"
            )
        info = load_checkpoint(resume, model, opt)
        result.losses = list(info["extra"].get("losses", []))
        result.step = result.start_step = info["step"]
    cast = (lambda: amp.autocast(cfg.dtype)) if cfg.dtype != "float32" else contextlib.nullcontext
    t_run = time.perf_counter()
    for step in range(result.step, cfg.steps):
        t0 = time.perf_counter()
        x, y = task.batches[step % len(task.batches)]
        opt.zero_grad()
        with cast():
            loss = task.loss(net, x, y)
        loss.backward()
        opt.step()
        value = float(loss.item())
        if world > 1:  # the global batch's loss: the mean of the ranks' shard means
            mean = np.array([value], np.float64)
            dist.all_reduce(mean, op=dist.ReduceOp.AVG)
            value = float(mean[0])
        dt = time.perf_counter() - t0
        result.losses.append(value)
        result.step = step + 1
        if on_step is not None:
            on_step(step + 1, value, cfg.batch * world / dt if dt > 0 else 0.0)
    result.seconds = time.perf_counter() - t_run
    if out is not None:
        import os

        path = os.path.join(out, "checkpoint.safetensors")
        write = dict(step=result.step, extra={"train_config": dataclasses.asdict(cfg), "losses": result.losses})
        if world > 1:  # rank 0 writes; every rank returns once the file is complete
            dist.run_on_rank0(lambda: (os.makedirs(out, exist_ok=True), save_checkpoint(path, model, opt, **write)))
        else:
            os.makedirs(out, exist_ok=True)
            save_checkpoint(path, model, opt, **write)
        result.checkpoint = path
    return result


class Progress:
    """A tqdm bar with loss and samples/s on a terminal; otherwise one line every ``every`` steps."""

    def __init__(self, total: int, start: int, every: int, stream=None, bar: bool | None = None):
        self.stream = sys.stderr if stream is None else stream
        self.every, self.total = max(1, int(every)), total
        self._bar = None
        self._rate = None
        if self.stream.isatty() if bar is None else bar:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=start, desc="train", unit="step", file=self.stream)

    def __call__(self, step: int, loss: float, samples_per_s: float) -> None:
        # a smoothed rate: single steps jitter (kernel compiles, the allocator's first touches)
        self._rate = samples_per_s if self._rate is None else 0.8 * self._rate + 0.2 * samples_per_s
        if self._bar is not None:
            self._bar.set_postfix_str(f"loss {loss:.4f}, {self._rate:.1f} samples/s", refresh=False)
            self._bar.update(1)
        elif step % self.every == 0 or step == self.total:
            print(
                f"step {step}/{self.total}  loss {loss:.4f}  {self._rate:.1f} samples/s", file=self.stream, flush=True
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


__all__ = [
    "DEFAULT_LR",
    "DTYPES",
    "MODELS",
    "OPTIMIZERS",
    "BertClassifier",
    "Progress",
    "Task",
    "TrainConfig",
    "TrainResult",
    "build_task",
    "make_optimizer",
    "read_resume_config",
    "train",
]
