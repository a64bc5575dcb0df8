"""Serving workloads: a deterministic mixed workload and its replay through a
:class:`~opsnn.llm.scheduler.Scheduler` (dynamic batching, or one request at a time), with
throughput and latency percentiles.

    >>> import opsnn
    >>> lm = opsnn.models.llama(layers=2, hidden=64, heads=4, kv_heads=2, vocab=100)
    >>> items = mixed_workload(4, prompt_len=(4, 8), new_tokens=(2, 4), vocab=100, seed=0)
    >>> rep = replay(lm, items, max_batch_slots=4)
    >>> rep.requests, rep.generated_tokens == sum(i.max_new_tokens for i in items)
    (4, True)
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import ParamInvalidError
from .errors import GenerationError
from .scheduler import Scheduler


@dataclass(frozen=True)
class WorkItem:
    prompt: np.ndarray
    max_new_tokens: int


def mixed_workload(
    n: int = 32,
    prompt_len: tuple[int, int] = (16, 512),
    new_tokens: tuple[int, int] = (16, 128),
    vocab: int = 32000,
    seed: int = 0,
) -> list[WorkItem]:
    """``n`` requests with prompt lengths and output lengths drawn uniformly from the
    inclusive ranges, prompt tokens uniform over the vocabulary; same seed, same workload."""
    for name, (lo, hi) in (("prompt_len", prompt_len), ("new_tokens", new_tokens)):
        if not 1 <= lo <= hi:
            raise ParamInvalidError(f"mixed_workload: {name} must be (lo, hi) with 1 <= lo <= hi, got {(lo, hi)}")
    if n < 1:
        raise ParamInvalidError(f"mixed_workload: n must be >= 1, got {n}")
    rng = np.random.default_rng(seed)
    lens = rng.integers(prompt_len[0], prompt_len[1] + 1, n)
    outs = rng.integers(new_tokens[0], new_tokens[1] + 1, n)
    return [WorkItem(rng.integers(0, vocab, int(L)).astype(np.int64), int(o)) for L, o in zip(lens, outs)]


def percentiles(values, ps=(50, 90, 99)) -> dict:
    v = [x for x in values if x is not None]
    if not v:
        return {f"p{p}": None for p in ps} | {"mean": None}
    a = np.asarray(v, np.float64)
    return {f"p{p}": float(np.percentile(a, p)) for p in ps} | {"mean": float(a.mean())}


@dataclass
class ReplayReport:
    mode: str
    requests: int
    max_batch_slots: int
    wall_s: float
    prompt_tokens: int
    generated_tokens: int
    tokens_per_s: float
    latency_s: dict
    ttft_s: dict
    ms_per_token: dict
    mean_decode_batch: float
    decode_steps: int
    prefill_s: float = 0.0
    decode_s: float = 0.0
    per_request: list = field(default_factory=list, repr=False)
    outputs: list = field(default_factory=list, repr=False)

    def as_dict(self, with_requests: bool = False) -> dict:
        d = asdict(self)
        d.pop("outputs")
        if not with_requests:
            d.pop("per_request")
        return d

    def lines(self) -> list[str]:
        def f(d, scale=1.0, unit=""):
            return "  ".join(f"{k} {v * scale:.1f}{unit}" for k, v in d.items() if v is not None)

        return [
            f"{self.mode}: {self.requests} requests, {self.generated_tokens} tokens in {self.wall_s:.2f} s "
            f"-> {self.tokens_per_s:.1f} tokens/s (mean decode batch {self.mean_decode_batch:.1f}, "
            f"{self.decode_steps} decode steps; {self.prefill_s:.2f} s in prefill, {self.decode_s:.2f} s in decode)",
            f"  latency  {f(self.latency_s, 1e3, ' ms')}",
            f"  TTFT     {f(self.ttft_s, 1e3, ' ms')}",
            f"  ms/token {f(self.ms_per_token)}",
        ]


def replay(
    model,
    items: list[WorkItem],
    *,
    max_batch_slots: int = 16,
    sequential: bool = False,
    max_seq: int | None = None,
    max_prefill_tokens: int | None = 512,
    progress: bool | None = None,
    desc: str | None = None,
) -> ReplayReport:
    """Submit every item at t=0 and serve them with dynamic batching (``max_batch_slots``
    slots) or, with ``sequential=True``, one at a time (one slot: the same code path
    without batching). ``progress``: a tqdm bar on stderr (default: when it is a tty)."""
    slots = 1 if sequential else int(max_batch_slots)
    if max_seq is None:
        max_seq = max(len(it.prompt) + it.max_new_tokens - 1 for it in items)
    sched = Scheduler(model, max_batch_slots=slots, max_seq=max_seq, max_prefill_tokens=max_prefill_tokens)
    show = sys.stderr.isatty() if progress is None else bool(progress)
    mode = "one-at-a-time" if sequential else "dynamic batching"
    try:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(items), desc=desc or mode, disable=not show, file=sys.stderr, leave=False, unit="req")
        t0 = time.perf_counter()
        reqs = [sched.submit(it.prompt, it.max_new_tokens) for it in items]
        done = 0
        while sched.has_work():
            sched.step()
            n = sum(r.done() for r in reqs)
            if n != done:
                bar.update(n - done)
                done = n
        wall = time.perf_counter() - t0
        bar.close()
        stats = sched.stats()
    finally:
        sched.close()
    failed = [r for r in reqs if r.error is not None]
    if failed:
        raise GenerationError(f"replay: {len(failed)} request(s) failed; first: {failed[0].error}") from failed[0].error
    gen = sum(len(r.tokens) for r in reqs)
    ms = [r.metrics for r in reqs]
    return ReplayReport(
        mode=mode,
        requests=len(reqs),
        max_batch_slots=slots,
        wall_s=wall,
        prompt_tokens=sum(len(r.prompt) for r in reqs),
        generated_tokens=gen,
        tokens_per_s=gen / wall if wall > 0 else 0.0,
        latency_s=percentiles(m.latency_s for m in ms),
        ttft_s=percentiles(m.ttft_s for m in ms),
        ms_per_token=percentiles(m.ms_per_token for m in ms),
        mean_decode_batch=stats["mean_decode_batch"],
        decode_steps=stats["decode_steps"],
        prefill_s=stats["prefill_s"],
        decode_s=stats["decode_s"],
        per_request=[m.as_dict() for m in ms],
        outputs=[list(r.tokens) for r in reqs],
    )


__all__ = ["ReplayReport", "WorkItem", "mixed_workload", "percentiles", "replay"]
