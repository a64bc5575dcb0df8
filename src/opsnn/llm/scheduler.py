"""Dynamic batching: a scheduler that admits requests between decode steps, decodes every
running request in one batched step, and retires finished or cancelled ones.

Batching choice: *per-request cache offsets*, not grouping by length. Every running request
keeps its own slot and length in the :class:`~opsnn.llm.cache.KVCache`; a decode step
runs one token of each through the model as a (B, 1) batch and the fused attention op gets
each row's filled length (``nonpad_kv_seqlen``), so requests of any lengths share a step
with no padding compute and no re-batching when one finishes. A step's prefill chunks (at
most ``max_prefill_tokens`` prompt tokens per step, so that a long prompt does not stall the
running requests for long) run as one forward: their tokens share every GEMM, each attends
over its own cache row (:meth:`~opsnn.llm.decoder.CachedDecoder.prefill`).

One step = reap cancellations -> admit waiting requests into free slots (FIFO) -> prefill
chunks (FIFO, token budget) -> one decode step over every request past its prefill ->
retire finished ones (their slots are free for the next step's admissions)::

    >>> import opsnn, numpy as np
    >>> lm = opsnn.models.llama(layers=2, hidden=64, heads=4, kv_heads=2, vocab=100)
    >>> sched = Scheduler(lm, max_batch_slots=4, max_seq=64)
    >>> a = sched.submit([1, 2, 3], max_new_tokens=5)
    >>> b = sched.submit([4, 5], max_new_tokens=3, temperature=0.7, seed=1)
    >>> sched.run()
    >>> len(a.result()), len(b.result()), a.finish_reason
    (5, 3, 'length')

``start()`` serves from a background thread instead (``submit`` and ``cancel`` are then
safe from any thread; ``close()`` stops it); ``Request.result()`` waits, or in the
synchronous mode drives the scheduler until the request is done.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..errors import DTypeError, ParamInvalidError
from ..nn.functional import check_token_ids
from ..runtime.hooks import region
from .cache import KVCache
from .decoder import CachedDecoder
from .errors import GenerationError, PromptTooLongError, SchedulerClosedError
from .sampling import Sampler, SamplingParams

WAITING, PREFILL, RUNNING, FINISHED = "waiting", "prefill", "running", "finished"


@dataclass
class RequestMetrics:
    """Times are ``time.perf_counter()`` seconds; derived figures are None until known."""

    submitted: float
    prompt_tokens: int
    admitted: float | None = None
    first_token: float | None = None
    finished: float | None = None
    generated_tokens: int = 0

    @property
    def ttft_s(self) -> float | None:
        """Time to first token: submission to the first sampled token (queueing + prefill)."""
        return None if self.first_token is None else self.first_token - self.submitted

    @property
    def latency_s(self) -> float | None:
        return None if self.finished is None else self.finished - self.submitted

    @property
    def ms_per_token(self) -> float | None:
        """Decode time per generated token after the first."""
        if self.finished is None or self.first_token is None or self.generated_tokens < 2:
            return None
        return (self.finished - self.first_token) / (self.generated_tokens - 1) * 1e3

    @property
    def tokens_per_s(self) -> float | None:
        lat = self.latency_s
        return None if not lat else self.generated_tokens / lat

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "ttft_s": self.ttft_s,
            "latency_s": self.latency_s,
            "ms_per_token": self.ms_per_token,
            "tokens_per_s": self.tokens_per_s,
        }


class Request:
    """A submitted generation request (returned by :meth:`Scheduler.submit`).

    ``tokens`` grows as tokens are generated (stop tokens are not included);
    ``status`` is waiting / prefill / running / finished; ``finish_reason`` is
    ``"length"``, ``"stop"``, ``"cancelled"`` or ``"error"`` (then ``error`` holds the
    exception)."""

    def __init__(
        self,
        scheduler: Scheduler,
        rid: int,
        prompt: np.ndarray,
        max_new_tokens: int,
        sampling: SamplingParams,
        stop_tokens: frozenset,
        on_token,
    ):
        self.id = rid
        self.prompt = prompt
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling
        self.stop_tokens = stop_tokens
        self.on_token = on_token
        self.tokens: list[int] = []
        self.status = WAITING
        self.finish_reason: str | None = None
        self.stop_token: int | None = None
        self.error: BaseException | None = None
        self.slot: int | None = None
        self.metrics = RequestMetrics(time.perf_counter(), len(prompt))
        self._sampler = Sampler(sampling)
        self._prefilled = 0
        self._cancel = False
        self._done = threading.Event()
        self._sched = scheduler

    def __repr__(self) -> str:
        return (
            f"<Request {self.id} {self.status} prompt={len(self.prompt)} generated={len(self.tokens)}"
            f"{'' if self.finish_reason is None else ' ' + self.finish_reason}>"
        )

    @property
    def position(self) -> int:
        """Cache position of the next token to feed (the last generated one)."""
        return len(self.prompt) + len(self.tokens) - 1

    def cancel(self) -> bool:
        """Ask to stop this request; its slot is freed at the next step boundary. Returns
        False if it had already finished."""
        if self._done.is_set():
            return False
        self._cancel = True
        self._sched._wake()
        return True

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def result(self, timeout: float | None = None) -> list[int]:
        """The generated tokens once finished. Without a serving thread this drives the
        scheduler on the calling thread until the request is done. Raises
        :class:`GenerationError` if the request failed and ``TimeoutError`` on timeout."""
        if not self.done() and not self._sched.serving:
            self._sched.run(until=self.done)
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} did not finish within {timeout} s (status {self.status})")
        if self.error is not None:
            raise GenerationError(f"request {self.id} failed: {self.error}") from self.error
        return list(self.tokens)


class Scheduler:
    """Serve generation requests for ``model`` (an ``opsnn.models.llama`` model) with a KV
    cache of ``max_batch_slots`` slots of ``max_seq`` positions (default: the model's
    ``max_position_embeddings``, at most 2048). ``max_prefill_tokens`` bounds the prompt
    tokens prefilled per step (None: whole prompts)."""

    def __init__(
        self, model, *, max_batch_slots: int = 8, max_seq: int | None = None, max_prefill_tokens: int | None = 512
    ):
        cfg = model.config
        if max_seq is None:
            max_seq = min(cfg.max_position_embeddings, 2048)
        if max_prefill_tokens is not None and (
            not isinstance(max_prefill_tokens, (int, np.integer)) or max_prefill_tokens < 1
        ):
            raise ParamInvalidError(
                f"Scheduler: max_prefill_tokens must be a positive int or None, got {max_prefill_tokens!r}"
            )
        self.model = model
        self.vocab_size = cfg.vocab_size
        self.max_prefill_tokens = max_prefill_tokens
        self.cache = KVCache.for_model(model, max_batch_slots, max_seq)
        self.decoder = CachedDecoder(model, self.cache)
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._cv = threading.Condition(threading.RLock())
        self._step_lock = threading.Lock()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._drain = True
        #: (step, event, request id, detail): "admit" (detail: slot) and "finish" (detail: reason)
        self.events: list[tuple] = []
        self.steps = 0
        self.decode_steps = 0
        self.decoded_rows = 0
        self.prefill_tokens = 0
        self.prefill_s = 0.0  # time in prefill forwards
        self.decode_s = 0.0  # time in decode forwards

    # -- submission ------------------------------------------------------------------------------------
    def submit(
        self,
        prompt,
        max_new_tokens: int = 16,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        sampling: SamplingParams | None = None,
        stop_tokens=(),
        on_token=None,
    ) -> Request:
        """Queue a request; validation errors (:class:`PromptTooLongError`,
        ``OutOfVocabularyError``, ``ParamInvalidError``) are raised here, before any work.
        ``on_token(token)`` is called (on the serving thread) for each generated token."""
        if sampling is None:
            sampling = SamplingParams(temperature, top_k, top_p, seed)
        elif not isinstance(sampling, SamplingParams):
            raise ParamInvalidError(f"submit: sampling must be a SamplingParams, got {type(sampling).__name__}")
        if not isinstance(max_new_tokens, (int, np.integer)) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
            raise ParamInvalidError(f"submit: max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        ids = self._check_prompt(prompt, int(max_new_tokens))
        try:
            stops = frozenset(int(t) for t in np.asarray(stop_tokens, np.int64).reshape(-1))
        except (TypeError, ValueError):
            raise ParamInvalidError(f"submit: stop_tokens must be token ids, got {stop_tokens!r}") from None
        if on_token is not None and not callable(on_token):
            raise ParamInvalidError(f"submit: on_token must be callable, got {type(on_token).__name__}")
        with self._cv:
            if self._closed:
                raise SchedulerClosedError("submit: the scheduler was closed")
            req = Request(self, next(self._ids), ids, int(max_new_tokens), sampling, stops, on_token)
            self._waiting.append(req)
            self._cv.notify_all()
        return req

    def _check_prompt(self, prompt, max_new_tokens: int) -> np.ndarray:
        arr = np.asarray(prompt.numpy() if hasattr(prompt, "numpy") else prompt)
        if arr.ndim != 1 or arr.size == 0:
            raise ParamInvalidError(
                f"submit: prompt must be a non-empty 1-D sequence of token ids, got shape {arr.shape}"
            )
        if arr.dtype.kind not in "iu":
            raise DTypeError(f"submit: prompt token ids must be integers, got {arr.dtype}")
        max_seq = self.cache.max_seq
        need = arr.size + max_new_tokens - 1  # the last sampled token is never written to the cache
        if need > max_seq:
            raise PromptTooLongError(
                f"submit: prompt of {arr.size} tokens + max_new_tokens={max_new_tokens} needs "
                f"{need} cache positions; the cache holds max_seq={max_seq} (prompt at most "
                f"{max(0, max_seq - max_new_tokens + 1)} tokens for this max_new_tokens)"
            )
        ids = check_token_ids(arr, self.vocab_size, "submit: prompt").numpy()
        ids = np.array(ids, np.int64)
        ids.flags.writeable = False
        return ids

    # -- state -------------------------------------------------------------------------------------------
    @property
    def serving(self) -> bool:
        """True while a background serving thread runs."""
        t = self._thread
        return t is not None and t.is_alive()

    @property
    def waiting(self) -> list[Request]:
        with self._cv:
            return list(self._waiting)

    @property
    def running(self) -> list[Request]:
        with self._cv:
            return list(self._running)

    def has_work(self) -> bool:
        with self._cv:
            return bool(self._waiting or self._running)

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def stats(self) -> dict:
        return {
            "steps": self.steps,
            "decode_steps": self.decode_steps,
            "prefill_tokens": self.prefill_tokens,
            "decoded_tokens": self.decoded_rows,
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "mean_decode_batch": self.decoded_rows / self.decode_steps if self.decode_steps else 0.0,
            "waiting": len(self._waiting),
            "running": len(self._running),
            "free_slots": self.cache.free_slots,
            "cache_bytes": self.cache.nbytes,
        }

    # -- the loop ------------------------------------------------------------------------------------------
    def step(self) -> bool:
        """Run one scheduling step; returns whether work remains. A failure that belongs to
        one request (its callback or sampling raised) or to one batch (the forward raised)
        finishes those requests with ``finish_reason="error"`` and frees their slots; the
        scheduler keeps serving the others."""
        with self._step_lock:
            try:
                self._reap()
                self._admit()
                self._prefill()
                self._decode()
            except BaseException as exc:  # a scheduler bug or an interrupt: never leave slots held
                self._fail_all(exc)
                raise
            finally:
                self.steps += 1
        return self.has_work()

    def run(self, until=None) -> None:
        """Serve on the calling thread until no work remains (or ``until()`` is true)."""
        if self.serving and threading.current_thread() is not self._thread:
            raise ParamInvalidError("Scheduler.run: a serving thread is running; wait on the requests instead")
        while self.has_work() and not (until is not None and until()):
            self.step()

    def _reap(self) -> None:
        with self._cv:
            for r in [r for r in self._waiting if r._cancel]:
                self._waiting.remove(r)
                self._finish(r, "cancelled")
            for r in [r for r in self._running if r._cancel]:
                self._finish(r, "cancelled")

    def _admit(self) -> None:
        with self._cv:
            while self._waiting and self.cache.free_slots:
                r = self._waiting.popleft()
                r.slot = self.cache.allocate()
                r.status = PREFILL
                r.metrics.admitted = time.perf_counter()
                self._running.append(r)
                self.events.append((self.steps, "admit", r.id, r.slot))

    def _prefill(self) -> None:
        """This step's prefill chunks (FIFO, within the token budget) in one forward."""
        budget = self.max_prefill_tokens or math.inf
        batch = []
        for r in list(self._running):
            if budget <= 0:
                break
            if r.status != PREFILL or r.done():
                continue
            n = int(min(len(r.prompt) - r._prefilled, budget))
            batch.append((r, r._prefilled, n))
            budget -= n
        if not batch:
            return
        t0 = time.perf_counter()
        try:
            with region(f"llm prefill ({len(batch)} requests, {sum(n for _, _, n in batch)} tokens)"):
                logits = self.decoder.prefill([(r.prompt[p0 : p0 + n], r.slot, p0) for r, p0, n in batch])
        except Exception as exc:  # noqa: BLE001 - becomes the error of every request of the batch
            for r, _, _ in batch:
                self._finish(r, "error", exc)
            return
        finally:
            self.prefill_s += time.perf_counter() - t0
        for (r, _, n), row in zip(batch, logits):
            r._prefilled += n
            self.prefill_tokens += n
            if r._prefilled == len(r.prompt):
                r.status = RUNNING
                self._emit(r, row)

    def _decode(self) -> None:
        rows = [r for r in self._running if r.status == RUNNING and not r.done()]
        if not rows:
            return
        tokens = np.array([[r.tokens[-1]] for r in rows], np.int64)
        slots = np.array([r.slot for r in rows], np.int64)
        starts = np.array([r.position for r in rows], np.int64)
        t0 = time.perf_counter()
        try:
            with region(f"llm decode (batch {len(rows)})"):
                logits = self.decoder.forward(tokens, slots, starts)
        except Exception as exc:  # noqa: BLE001 - every row of the failed batch gets the error
            for r in rows:
                self._finish(r, "error", exc)
            return
        finally:
            self.decode_s += time.perf_counter() - t0
        self.decode_steps += 1
        self.decoded_rows += len(rows)
        for r, row in zip(rows, logits):
            self._emit(r, row)

    def _emit(self, r: Request, logits: np.ndarray) -> None:
        try:
            tok = r._sampler.sample(logits)
        except Exception as exc:  # noqa: BLE001
            self._finish(r, "error", exc)
            return
        m = r.metrics
        if m.first_token is None:
            m.first_token = time.perf_counter()
        if r._cancel:
            self._finish(r, "cancelled")
            return
        if tok in r.stop_tokens:
            r.stop_token = tok
            self._finish(r, "stop")
            return
        r.tokens.append(tok)
        m.generated_tokens = len(r.tokens)
        if r.on_token is not None:
            try:
                r.on_token(tok)
            except Exception as exc:  # noqa: BLE001 - a failing consumer ends its own request only
                self._finish(r, "error", exc)
                return
        if r._cancel:  # the callback may cancel its own request
            self._finish(r, "cancelled")
        elif len(r.tokens) >= r.max_new_tokens:
            self._finish(r, "length")

    def _finish(self, r: Request, reason: str, error: BaseException | None = None) -> None:
        with self._cv:
            if r.done():
                return
            if r.slot is not None:
                self.cache.release(r.slot)
                r.slot = None
            if r in self._running:
                self._running.remove(r)
                if not self._running and not self._waiting:  # idle: the prepared decode steps give
                    self.decoder.release_steps()  # their buffers back
            r.status, r.finish_reason, r.error = FINISHED, reason, error
            r.metrics.finished = time.perf_counter()
            r.metrics.generated_tokens = len(r.tokens)
            self.events.append((self.steps, "finish", r.id, reason))
            r._done.set()
            self._cv.notify_all()

    def _fail_all(self, exc: BaseException, reason: str = "error") -> None:
        with self._cv:
            for r in list(self._running) + list(self._waiting):
                self._finish(r, reason, exc if reason == "error" else None)
            self._waiting.clear()

    # -- background serving ---------------------------------------------------------------------------------
    def start(self) -> Scheduler:
        """Serve from a background thread until :meth:`close`."""
        with self._cv:
            if self._closed:
                raise SchedulerClosedError("start: the scheduler was closed")
            if not self.serving:
                self._thread = threading.Thread(target=self._serve, name="opsnn-llm-scheduler", daemon=True)
                self._thread.start()
        return self

    def _serve(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._closed and not (self._waiting or self._running):
                        self._cv.wait()
                    if self._closed and not (self._drain and (self._waiting or self._running)):
                        break
                self.step()
        except BaseException:  # noqa: BLE001 - step() already failed every request with it
            pass
        finally:
            self._fail_all(None, "cancelled")
            if self._closed:
                self.cache.close()

    def close(self, drain: bool = False, timeout: float | None = None) -> None:
        """Stop serving. ``drain=True`` finishes the queued and running requests first;
        otherwise they are cancelled (slots freed). The KV cache buffers go back to the
        memory pool. Idempotent."""
        with self._cv:
            self._closed = True
            self._drain = bool(drain)
            self._cv.notify_all()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
            if t.is_alive():
                raise GenerationError(f"Scheduler.close: the serving thread did not stop within {timeout} s")
            self._thread = None
        elif t is None:
            if drain:
                self.run()
            self._fail_all(None, "cancelled")
        if not self.serving:
            self.cache.close()  # give the KV buffers back now, even while request handles live on

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(drain=exc_type is None)

    def __repr__(self) -> str:
        return (
            f"<Scheduler slots={self.cache.max_batch_slots} max_seq={self.cache.max_seq} "
            f"waiting={len(self._waiting)} running={len(self._running)}>"
        )


__all__ = ["Request", "RequestMetrics", "Scheduler"]
