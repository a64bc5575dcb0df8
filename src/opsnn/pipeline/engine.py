"""A streaming pipeline: stages on their own threads (and opsnn Streams), bounded queues, in order.

Each :class:`Stage` runs on one thread; a stage that runs opsnn ops also gets its own
:class:`opsnn.Stream`, so its kernels run on that stream's worker while other stages' kernels
run on theirs (kernels release the GIL, so stages overlap on several cores). Stages are joined
by bounded queues: a slow stage makes the ones before it wait (back-pressure) instead of
buffering the whole video. Frames leave in the order they entered::

    >>> import opsnn, numpy as np
    >>> from opsnn.pipeline import Pipeline, Stage
    >>> pipe = Pipeline([Stage("decode", lambda i: np.full((2, 2), i, np.float32), uses_ops=False),
    ...                  Stage("double", lambda a: opsnn.ops.mul(opsnn.tensor(a), 2.0).numpy().copy())])
    >>> [float(y[0, 0]) for y in pipe.run(range(3)).outputs]
    [0.0, 2.0, 4.0]

When a stage raises on frame ``i``, the frames before ``i`` finish, frame ``i`` is reported as
failed and every later frame as not processed; the queues drain, every thread and stream stops
and :meth:`Pipeline.run` raises :class:`StageError` (stage name, frame index, the partial
result in ``.result``).
"""

from __future__ import annotations

import os
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import InnerError, KernelError, OpsnnRuntimeError, ParamInvalidError
from ..runtime import blas as _blas

_END = object()  # end-of-stream marker passed down the queues


class StageError(OpsnnRuntimeError):
    """A pipeline stage raised. ``stage`` (name), ``frame`` (index), ``cause`` (the original
    exception), ``result`` (the :class:`PipelineResult` so far: completed outputs, the frames
    not processed, stage timings) and ``errors`` (every failure, earliest frame first)."""

    def __init__(self, stage: str, frame: int, cause: BaseException, result: PipelineResult | None = None):
        self.stage, self.frame, self.cause, self.result = stage, frame, cause, result
        self.errors: list = []
        super().__init__(f"pipeline stage {stage!r} failed on frame {frame}: {type(cause).__name__}: {cause}")


@dataclass
class Stage:
    """One pipeline step: ``fn(payload) -> payload`` for each frame, in frame order.

    ``uses_ops=True`` runs ``fn`` inside ``with stream:`` on a stream of its own and waits for
    that stream's kernels before handing the result on (so a kernel error is this stage's
    error, and the stage's busy time includes its kernels). ``num_threads`` bounds the threads
    each of its parallel kernels uses (default: the stream's default, half the cores).

    ``workers > 1`` runs that many copies of the stage side by side (each on its own thread and
    stream), for a stage whose frames are independent of each other (decoding image files,
    rendering frames) and slower than the rest: frames still leave the stage in order (a
    worker that finishes frame ``i + 1`` first waits for frame ``i``'s turn). ``fn`` must then
    be safe to call from several threads at once.

    ``max_batch=k`` (not for the first stage, which reads the source) makes ``fn`` take a list
    of payloads and return a list of as many outputs: each call gets the frame it waited for
    plus those already queued behind it, at most ``k`` in all (it never waits for a batch to
    fill, so a starved stage still runs frame by frame). For a stage whose cost per call falls
    with the batch (a model's weights read once for several frames). When a batch raises, its
    frames run again one per call, so the failure is the frame's that raises (as unbatched).
    Run sequentially, ``fn`` gets one-item lists.
    """

    name: str
    fn: Callable[[Any], Any]
    uses_ops: bool = True
    num_threads: int | None = None
    workers: int = 1
    max_batch: int | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ParamInvalidError(f"Stage: name must be a non-empty string, got {self.name!r}")
        if not callable(self.fn):
            raise ParamInvalidError(f"Stage {self.name!r}: fn must be callable, got {type(self.fn).__name__}")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ParamInvalidError(f"Stage {self.name!r}: workers must be an int >= 1, got {self.workers!r}")
        b = self.max_batch
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
            raise ParamInvalidError(f"Stage {self.name!r}: max_batch must be an int >= 1 or None, got {b!r}")


def _apply(stage: Stage, payloads: list) -> list:
    """``stage.fn`` over one call's payloads: the one payload, or (``max_batch``) the list."""
    if stage.max_batch is None:
        return [stage.fn(payloads[0])]
    ret = stage.fn(payloads)
    outs = list(ret) if isinstance(ret, (list, tuple)) else None
    if outs is None or len(outs) != len(payloads):
        got = f"{len(outs)}" if outs is not None else f"a {type(ret).__name__}"
        raise ParamInvalidError(
            f"Stage {stage.name!r} (max_batch={stage.max_batch}): fn must return a list of "
            f"one output per payload; it got {len(payloads)} and returned {got}"
        )
    return outs


def _call(stage: Stage, stream, payloads: list) -> list:
    """``stage.fn`` over the payloads of one call (one, or a batch), on ``stream`` when given
    (waiting for its kernels, so their errors are this call's)."""
    if stream is None:
        return _apply(stage, payloads)
    with stream:
        outs = _apply(stage, payloads)
    stream.synchronize()
    return outs


@dataclass
class StageStats:
    """Where one stage's time went: ``busy_s`` running ``fn`` (and its kernels), ``wait_in_s``
    waiting for the previous stage (starved), ``wait_out_s`` blocked on a full queue to the next
    stage (back-pressure) or, with several workers, waiting for an earlier frame's turn. With
    several ``workers`` the times are summed over them (worker-seconds)."""

    name: str
    frames: int = 0
    busy_s: float = 0.0
    wait_in_s: float = 0.0
    wait_out_s: float = 0.0
    workers: int = 1

    @property
    def busy_ms_per_frame(self) -> float:
        return self.busy_s / self.frames * 1e3 if self.frames else 0.0

    def as_dict(self) -> dict:
        return {
            "stage": self.name,
            "workers": self.workers,
            "frames": self.frames,
            "busy_s": round(self.busy_s, 6),
            "wait_in_s": round(self.wait_in_s, 6),
            "wait_out_s": round(self.wait_out_s, 6),
            "busy_ms_per_frame": round(self.busy_ms_per_frame, 3),
        }


@dataclass
class PipelineResult:
    """What a run produced: ``outputs`` (in frame order, when collected), ``completed`` (frame
    indices emitted), ``failed`` ({frame: stage}), ``not_processed`` (frames that entered but
    were discarded after a failure, plus frames never read when the source has a length),
    ``stages`` (:class:`StageStats`), ``wall_s`` and ``latency_s`` (per emitted frame)."""

    outputs: list = field(default_factory=list)
    completed: list = field(default_factory=list)
    failed: dict = field(default_factory=dict)
    not_processed: list = field(default_factory=list)
    stages: list = field(default_factory=list)
    wall_s: float = 0.0
    latency_s: list = field(default_factory=list)
    frames_in: int = 0
    mode: str = "pipelined"

    @property
    def fps(self) -> float:
        return len(self.completed) / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict:
        lat = sorted(self.latency_s)
        return {
            "mode": self.mode,
            "frames": len(self.completed),
            "wall_s": round(self.wall_s, 6),
            "fps": round(self.fps, 3),
            "failed": {int(k): v for k, v in self.failed.items()},
            "not_processed": len(self.not_processed),
            "latency_ms": {"p50": round(lat[len(lat) // 2] * 1e3, 3), "max": round(lat[-1] * 1e3, 3)} if lat else {},
            "stages": [s.as_dict() for s in self.stages],
        }


class Pipeline:
    """Stages connected by bounded queues of ``queue_size`` frames; see the module docstring.

    ``run(source)`` feeds the items of ``source`` (any iterable: the first stage's ``fn``
    receives each item) and blocks until the last frame left; ``iter(source)`` yields
    ``(index, output)`` pairs as they leave, in order.

    ``blas_threads``: the BLAS thread pool size while a pipelined run is in progress (default
    ``"auto"``: half the cores, as each stage stream's kernels; ``None`` leaves it alone). BLAS
    pools are process-wide and spin, so stages calling GEMM at once on a pool sized for all
    cores slow each other down (see :mod:`opsnn.runtime.blas`).
    """

    def __init__(self, stages: list, queue_size: int = 2, blas_threads: int | str | None = "auto"):
        stages = list(stages)
        if not stages:
            raise ParamInvalidError("Pipeline: needs at least one Stage")
        for s in stages:
            if not isinstance(s, Stage):
                raise ParamInvalidError(f"Pipeline: stages must be Stage objects, got {type(s).__name__}")
        names = [s.name for s in stages]
        if stages[0].max_batch is not None:
            raise ParamInvalidError(
                f"Pipeline: the first stage ({stages[0].name!r}) reads the source one item at "
                f"a time; max_batch applies to the stages after it"
            )
        if len(set(names)) != len(names):
            raise ParamInvalidError(f"Pipeline: stage names must be unique, got {names}")
        if not isinstance(queue_size, int) or queue_size < 1:
            raise ParamInvalidError(f"Pipeline: queue_size must be an int >= 1, got {queue_size!r}")
        if blas_threads == "auto":
            blas_threads = max(1, (os.cpu_count() or 1) // 2)
        if blas_threads is not None and (not isinstance(blas_threads, int) or blas_threads < 1):
            raise ParamInvalidError(f"Pipeline: blas_threads must be an int >= 1, 'auto' or None, got {blas_threads!r}")
        self.stages = stages
        self.queue_size = queue_size
        self.blas_threads = blas_threads

    # -- running ------------------------------------------------------------------------------------
    def run(self, source: Iterable, *, collect: bool = True, on_output: Callable | None = None) -> PipelineResult:
        """Run every item of ``source`` through the stages; returns the :class:`PipelineResult`
        (``outputs`` only when ``collect``). ``on_output(index, output)`` sees each output as it
        leaves. Raises :class:`StageError` if a stage failed."""
        run = _Run(self, source)
        try:
            for idx, out in run.outputs():
                if collect:
                    run.result.outputs.append(out)
                if on_output is not None:
                    on_output(idx, out)
                out = None
        finally:
            run.finish()
        run.raise_failure()
        return run.result

    def iter(self, source: Iterable):
        """Yield ``(index, output)`` in frame order; closing the generator early stops the
        stages (the rest are reported as not processed). Raises :class:`StageError` after the
        last completed frame if a stage failed."""
        run = _Run(self, source)
        try:
            yield from run.outputs()
        finally:
            run.finish()
        run.raise_failure()

    def run_sequential(
        self,
        source: Iterable,
        *,
        collect: bool = True,
        on_output: Callable | None = None,
        stream=None,
        blas_threads: int | None = None,
    ) -> PipelineResult:
        """The same stages one after another on the calling thread, frame by frame, on
        ``stream`` (default: the current stream, which runs kernels inline with every core):
        the baseline the pipelined run is compared with. ``blas_threads``: the BLAS pool size
        during the run (``None``: unchanged). Same result and error contract as :meth:`run`."""
        with _blas.blas_threads(blas_threads):
            return self._run_sequential(source, collect, on_output, stream)

    def _run_sequential(self, source, collect, on_output, stream) -> PipelineResult:
        from ..runtime.stream import current_stream

        stream = stream or current_stream()
        result = PipelineResult(stages=[StageStats(s.name) for s in self.stages], mode="sequential")
        try:
            it = iter(source)
        except TypeError:
            raise ParamInvalidError(
                f"Pipeline.run_sequential: source must be iterable, got {type(source).__name__}"
            ) from None
        total = _length(source)
        t_start = time.perf_counter()
        failure = None
        idx = 0
        while failure is None:
            t0 = time.perf_counter()
            try:
                payload = next(it)
            except StopIteration:
                break
            except Exception as exc:  # noqa: BLE001 - reading the source is the first stage's work
                failure = (0, idx, exc)
                break
            result.frames_in = idx + 1
            t_read = time.perf_counter() - t0  # reading counts as the first stage's work, as when pipelined
            for pos, stage in enumerate(self.stages):
                t1 = time.perf_counter()
                try:
                    payload = _call(stage, stream if stage.uses_ops else None, [payload])[0]
                except Exception as exc:  # noqa: BLE001 - reported as StageError
                    failure = (pos, idx, _settle(stream if stage.uses_ops else None, exc))
                    payload = None
                    break
                st = result.stages[pos]
                st.busy_s += time.perf_counter() - t1 + (t_read if pos == 0 else 0.0)
                st.frames += 1
            if failure is not None:
                break
            if collect:
                result.outputs.append(payload)
            if on_output is not None:
                on_output(idx, payload)
            payload = None
            result.completed.append(idx)
            result.latency_s.append(time.perf_counter() - t0)
            idx += 1
        result.wall_s = time.perf_counter() - t_start
        if failure is not None:
            pos, fidx, exc = failure
            result.failed[fidx] = self.stages[pos].name
            if total is not None:
                result.not_processed = list(range(fidx + 1, total))
            _clear_frames(exc)
            raise StageError(self.stages[pos].name, fidx, exc, result) from exc
        return result


def _length(source) -> int | None:
    try:
        return len(source)
    except TypeError:
        return None


def _settle(stream, exc: BaseException) -> BaseException:
    """After a stage failed: wait for its stream and take the stream's pending kernel errors (so
    none is left to surprise a later synchronize). A kernel's own error replaces the generic
    "the kernel that produced this tensor failed" raised when reading its output."""
    if stream is None:
        return exc
    try:
        stream.synchronize()
    except Exception as real:  # noqa: BLE001 - the kernel's error, kept as the cause
        if isinstance(exc, KernelError) and real is not exc:
            return real
    return exc


def _clear_frames(exc: BaseException) -> None:
    """Drop the locals of the failed frames (they may pin large tensors) once the error is kept."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if exc.__traceback__ is not None:
            traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__


class _Turn:
    """Hands a stage's frames on in order when several workers run it. Each frame gets a ticket
    as it is taken from the queue (tickets count arrivals, so frames dropped upstream leave no
    gap); a worker holding ticket ``t`` waits until ticket ``t - 1`` was handed on or dropped."""

    def __init__(self):
        self.next = 0
        self.issued = 0
        self.take = threading.Lock()  # taking an item and its ticket is one step
        self.cond = threading.Condition()

    def wait(self, idx: int) -> None:
        with self.cond:
            while self.next != idx:
                self.cond.wait()

    def advance(self) -> None:
        with self.cond:
            self.next += 1
            self.cond.notify_all()


class _Run:
    """One pipelined run: the threads, queues and streams, and their teardown."""

    def __init__(self, pipe: Pipeline, source: Iterable):
        from ..runtime.stream import Stream

        self.pipe = pipe
        try:
            self.source = iter(source)  # here, so a non-iterable fails in the caller's thread
        except TypeError:
            raise ParamInvalidError(f"Pipeline.run: source must be iterable, got {type(source).__name__}") from None
        self.total = _length(source)
        n = len(pipe.stages)
        self.queues = [queue.Queue(pipe.queue_size) for _ in range(n)]  # queues[i]: out of stage i
        self.result = PipelineResult(stages=[StageStats(s.name, workers=s.workers) for s in pipe.stages])
        self.failures: list = []  # (frame, stage position, exception)
        self.stop_at = -1  # the furthest failed stage: it and every stage before it discard
        self.fail_min = None  # the earliest failed frame: later frames are discarded there
        self.cancelled = False
        self.lock = threading.Lock()
        self.source_lock = threading.Lock()
        self.source_done = False
        self.discarded: list = []
        self.started: dict = {}  # frame -> time it entered the first stage
        self.frames_in = 0
        self.done = False
        self.turns = [_Turn() if s.workers > 1 else None for s in pipe.stages]
        self.alive = [s.workers for s in pipe.stages]  # workers still running, per stage
        self.streams = [
            [
                Stream(name=f"pipeline:{s.name}" + (f"#{w}" if s.workers > 1 else ""), num_threads=s.num_threads)
                if s.uses_ops
                else None
                for w in range(s.workers)
            ]
            for s in pipe.stages
        ]
        self.blas = _blas.blas_threads(pipe.blas_threads)
        self.blas.__enter__()  # left in finish(), which run() and iter() always reach
        self.threads = [
            threading.Thread(
                target=self._stage_loop,
                args=(i, w),
                daemon=True,
                name=f"opsnn-pipeline-{s.name}" + (f"-{w}" if s.workers > 1 else ""),
            )
            for i, s in enumerate(pipe.stages)
            for w in range(s.workers)
        ]
        self.t_start = time.perf_counter()
        for t in self.threads:
            t.start()

    # -- failure bookkeeping ----------------------------------------------------------------------------
    def _fail(self, pos: int, frame: int, exc: BaseException) -> None:
        _clear_frames(exc)
        with self.lock:
            self.failures.append((frame, pos, exc))
            # stages at or before a failed one stop; stages after it finish the earlier frames
            self.stop_at = max(self.stop_at, pos)
            self.fail_min = frame if self.fail_min is None else min(self.fail_min, frame)

    def _discarding(self, pos: int, idx: int) -> bool:
        """Whether stage ``pos`` drops frame ``idx``: after a cancel, or when a stage at or after
        it failed on an earlier frame (frames before a failure still finish)."""
        return self.cancelled or (pos <= self.stop_at and idx > self.fail_min)

    def _read(self):
        """The next (index, payload) of the source, or None when it is exhausted, failed or the
        run stops. Reading is serialized: the first stage's workers share one source."""
        with self.source_lock:
            if self.source_done or self.cancelled or self.stop_at >= 0:
                return None
            idx = self.frames_in
            t0 = time.perf_counter()
            try:
                payload = next(self.source)
            except StopIteration:
                self.source_done = True
                return None
            except Exception as exc:  # noqa: BLE001 - reading the source is the first stage's work
                self.source_done = True
                self._fail(0, idx, exc)
                return None
            self.started[idx] = t0
            self.frames_in = idx + 1
            return idx, payload, t0

    # -- the stage thread ------------------------------------------------------------------------------------
    def _take(self, in_q, limit: int):
        """Wait for the next item of ``in_q``, then take those already queued behind it, up to
        ``limit`` in all (never waiting for more). Returns ``(items, ended)``."""
        item = in_q.get()
        if item is _END:
            return [], True
        items = [item]
        while len(items) < limit:
            try:
                item = in_q.get_nowait()
            except queue.Empty:
                break
            if item is _END:
                return items, True
            items.append(item)
        return items, False

    def _process(self, pos: int, stage: Stage, stream, live: list) -> list:
        """The outputs of one call over ``live`` ((frame, payload) pairs), in order. When a
        batch fails, its frames run again one per call, so the error names the frame that
        raised it: the frames before it keep their outputs, those after it go unprocessed (a
        batch that fails while each of its frames passes alone gives those outputs)."""
        try:
            return _call(stage, stream, [p for _, p in live])
        except BaseException as exc:  # noqa: BLE001 - surfaces as StageError in the caller
            exc = _settle(stream, exc)
            if len(live) == 1:
                self._fail(pos, live[0][0], exc)
                return []
        outs = []
        for idx, payload in live:
            try:
                outs += _call(stage, stream, [payload])
            except BaseException as exc:  # noqa: BLE001 - as above
                self._fail(pos, idx, _settle(stream, exc))
                break
        return outs

    def _stage_loop(self, pos: int, wid: int) -> None:
        stage = self.pipe.stages[pos]
        stats = self.result.stages[pos]
        stream = self.streams[pos][wid]
        out_q = self.queues[pos]
        in_q = self.queues[pos - 1] if pos else None
        turn = self.turns[pos]
        limit = stage.max_batch or 1
        busy = wait_in = wait_out = 0.0
        frames = 0
        try:
            ended = False
            while not ended:
                t0 = time.perf_counter()
                if pos == 0:
                    got = self._read()
                    if got is None:
                        break
                    idx, payload, t1 = got
                    items = [(idx, payload)]
                    ticket = idx  # the source's frames are numbered as read, under its lock
                    got = payload = None
                else:
                    if turn is None:
                        items, ended = self._take(in_q, limit)
                        ticket = None
                    else:
                        with turn.take:
                            items, ended = self._take(in_q, limit)
                            ticket = turn.issued
                            if items:
                                turn.issued += 1
                        if ended:
                            in_q.put(_END)  # for this stage's other workers (the queue just had room)
                    t1 = time.perf_counter()
                    wait_in += t1 - t0
                    if not items:
                        break
                live = []  # the items of this call not discarded
                for idx, payload in items:
                    if self._discarding(pos, idx):
                        with self.lock:
                            self.discarded.append(idx)
                    else:
                        live.append((idx, payload))
                items = payload = None
                outs = self._process(pos, stage, stream, live) if live else []
                busy += time.perf_counter() - t1
                frames += len(outs)
                t2 = time.perf_counter()
                if turn is not None:
                    turn.wait(ticket)
                try:
                    for (idx, _), out in zip(live, outs):
                        if self._discarding(pos, idx):  # a worker failed on an earlier frame meanwhile
                            with self.lock:
                                self.discarded.append(idx)
                        else:
                            out_q.put((idx, out))
                finally:
                    if turn is not None:
                        turn.advance()
                wait_out += time.perf_counter() - t2
                live = outs = out = None
        finally:
            with self.lock:
                stats.busy_s += busy
                stats.wait_in_s += wait_in
                stats.wait_out_s += wait_out
                stats.frames += frames
                self.alive[pos] -= 1
                last = self.alive[pos] == 0
            if last:
                out_q.put(_END)

    # -- the caller's side ------------------------------------------------------------------------------------
    def outputs(self):
        last = self.queues[-1]
        expect = 0
        while True:
            item = last.get()
            if item is _END:
                self.done = True
                return
            idx, out = item
            item = None
            if idx < expect:
                raise InnerError(f"pipeline: frame {idx} left after frame {expect - 1} (out of order)")
            expect = idx + 1
            self.result.completed.append(idx)
            self.result.latency_s.append(time.perf_counter() - self.started.pop(idx, self.t_start))
            yield idx, out
            out = None

    def finish(self) -> None:
        """Stop (if the caller left early), drain the queues, join threads, close streams."""
        if not self.done:
            self.cancelled = True
            last = self.queues[-1]
            while True:  # upstream stages discard quickly once cancelled; each ends with _END
                item = last.get()
                if item is _END:
                    break
                self.discarded.append(item[0])
                item = None
        for t in self.threads:
            t.join()
        for per_stage in self.streams:
            for s in per_stage:
                if s is not None:
                    s.close()
        self.streams = []
        if self.blas is not None:
            self.blas.__exit__(None, None, None)
            self.blas = None
        self.result.wall_s = time.perf_counter() - self.t_start
        self.result.frames_in = self.frames_in
        self.started.clear()
        res = self.result
        failed_frames = {f for f, _, _ in self.failures}
        for f, pos, _ in sorted(self.failures, key=lambda r: (r[0], r[1])):
            res.failed.setdefault(f, self.pipe.stages[pos].name)
        done = set(res.completed)
        np_ = set(self.discarded) - done - failed_frames
        if self.failures or self.cancelled:
            # frames the first stage never read: still reported, never silently lost
            end = self.total if self.total is not None else self.frames_in
            np_.update(range(self.frames_in, end))
            np_.update(i for i in range(self.frames_in) if i not in done and i not in failed_frames)
        res.not_processed = sorted(np_)

    def raise_failure(self) -> None:
        if not self.failures:
            return
        ordered = sorted(self.failures, key=lambda r: (r[0], r[1]))
        frame, pos, exc = ordered[0]
        err = StageError(self.pipe.stages[pos].name, frame, exc, self.result)
        err.errors = [(self.pipe.stages[p].name, f, e) for f, p, e in ordered]
        raise err from exc
