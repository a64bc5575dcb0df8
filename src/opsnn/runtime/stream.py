"""Streams (ordered asynchronous work queues) and events.

On the CPU a worker stream owns one thread that runs its kernels in order; kernels
release the GIL (numba ``nogil``, BLAS) so two streams really run at once. The
default stream of a context is *inline*: it runs kernels on the calling thread,
because a thread hop costs more than a small kernel (CUDA's legacy default stream
plays the same role)::

    >>> import opsnn
    >>> s = opsnn.Stream()
    >>> with s:                                   # ops issued here run on s's worker
    ...     y = opsnn.ops.relu(opsnn.tensor([-1.0, 2.0]))
    >>> s.synchronize()
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import weakref
from collections import deque

from ..errors import InferShapeError, KernelError, OpsnnRuntimeError, OutOfMemoryError, ParamInvalidError
from . import hooks
from . import threads as _threads
from .context import context as _get_context

_ids = itertools.count()
_tls = threading.local()


class Stream:
    """An ordered queue of work. ``Stream()`` starts a worker thread; ``inline=True`` runs
    work on the caller's thread (used for the default stream).

    ``num_threads`` bounds the threads each parallel kernel of a worker stream uses
    (default: half the cores), so several streams share the cores instead of
    oversubscribing them.

    Errors raised by a kernel are kept and raised (as :class:`KernelError` naming the op)
    by the next :meth:`synchronize`; the stream stays usable afterwards. The tensors the
    failed kernel wrote keep raising when read until they are written again.

    A worker stream nobody references any more (tensors it writes hold it until read) runs
    the work already queued, then its thread ends; :meth:`close` ends it now.
    """

    def __init__(self, device=None, *, inline: bool = False, name: str | None = None, num_threads: int | None = None):
        from .context import context

        ctx = context()
        self.device = ctx.device if device is None else device
        self.id = next(_ids)
        self.name = name or ("default" if inline else f"stream{self.id}")
        self.inline = inline
        self._cv = threading.Condition()
        self._queue: deque = deque()
        self._submitted = 0
        self._completed = 0
        self._errors: list[tuple[int, str, BaseException]] = []
        self._failed: dict[int, str] = {}
        self._closed_flag: list = []  # non-empty once closed; shared with the worker thread
        self._thread = None
        # Kernel threads per worker: streams already run side by side, so each worker's
        # parallel kernels use part of the cores (else N streams x all cores oversubscribe).
        self.num_threads = num_threads or max(1, (os.cpu_count() or 1) // 2)
        # kernel threads never exceed this; the thread policy (runtime.threads) may use fewer.
        # The inline default stream runs on the caller's thread with every core by default.
        self._limit = num_threads or (1 << 30 if inline else self.num_threads)
        if not inline:
            # the worker holds the stream weakly (a bound method would keep it alive forever): once
            # nobody references the stream, the callback closes it and the worker ends after its queue
            ref = weakref.ref(self, lambda _, cv=self._cv, closed=self._closed_flag: _stop(cv, closed))
            self._thread = threading.Thread(
                target=_work,
                args=(ref, self._cv, self._queue, self._closed_flag, self.num_threads),
                name=f"opsnn-{self.name}",
                daemon=True,
            )
            self._thread.start()
            _workers.add(self._thread)
        ctx._register_stream(self)

    @property
    def _closed(self) -> bool:
        return bool(self._closed_flag)

    # -- submission ----------------------------------------------------------
    def launch(
        self,
        fn,
        name: str = "task",
        info: dict | None = None,
        args: tuple = (),
        mark: list | None = None,
        deps: list | None = None,
    ) -> int:
        """Queue ``fn(*args)``; returns its sequence number (see :meth:`done`). If it fails, its name
        is appended to ``mark`` (the failure mark its output tensors keep, see ``Tensor.numpy``).
        ``deps``: the failure marks of its inputs; one set by the time it runs fails it too."""
        if self._closed:
            raise OpsnnRuntimeError(f"{name}: stream {self.name} was closed by opsnn.finalize()")
        if self.inline:
            # every thread issues here, each running its own work: the counters move under the lock,
            # and a kernel's error goes straight to the thread that ran it (not into the shared list)
            with self._cv:
                self._submitted += 1
                seq = self._submitted
            exc = self._run(seq, fn, name, info, time.perf_counter() if hooks.active else 0.0, args, mark, deps)
            if exc is not None:
                raise self._error(name, exc)
            return seq
        with self._cv:
            self._submitted += 1
            seq = self._submitted
            self._queue.append((seq, fn, name, info, time.perf_counter() if hooks.active else 0.0, args, mark, deps))
            self._cv.notify_all()
        return seq

    def _run(self, seq, fn, name, info, t_queue, args, mark=None, deps=None) -> BaseException | None:
        """Run one task; its exception is returned (a worker stream also keeps it for synchronize).
        The task counts as completed whatever raises, an observer included: no waiter hangs on it."""
        profiling = hooks.active and hooks.listening("kernel")
        t0 = time.perf_counter() if profiling else 0.0
        prev = failure = kernel_failed = None
        try:
            prev = _threads.enter(self._limit)
            if deps:
                _check_deps(name, deps)
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - kept and re-raised at synchronize
            failure = kernel_failed = exc
            if mark is not None:
                mark.append(name)
        finally:
            _threads.leave(prev)
        if profiling:
            t1 = time.perf_counter()
            try:
                hooks.emit(
                    "kernel",
                    {"op": name, "stream": self.name, "queued": t_queue, "start": t0, "end": t1, **(info or {})},
                )
            except BaseException as exc:  # noqa: BLE001 - a tool's bug: its outputs stay readable
                failure = failure or OpsnnRuntimeError(
                    f"{name}: an observer of kernel events raised {type(exc).__name__}: {exc}"
                )
        if failure is not None and not self.inline:
            self._errors.append((seq, name, failure))
            if kernel_failed is not None:
                self._failed[seq] = name
        if self.inline:
            with self._cv:  # threads finish in any order: the count never goes back
                self._completed = max(self._completed, seq)
                self._cv.notify_all()  # a thread's synchronize() may be waiting on another's kernel
        else:
            self._completed = seq
        return failure

    # -- waiting -------------------------------------------------------------
    def done(self, seq: int) -> bool:
        return self._completed >= seq

    def wait_seq(self, seq: int) -> None:
        """Block the host until work ``seq`` finished; raise if that work failed."""
        if self._completed < seq:
            with self._cv:
                while self._completed < seq:
                    self._cv.wait()
        if seq in self._failed:
            raise KernelError(
                f"{self._failed[seq]}: the kernel that produced this tensor failed on stream "
                f"{self.name}; call synchronize() for the error"
            )

    def query(self) -> bool:
        """True when all queued work has finished."""
        return self._completed >= self._submitted

    def synchronize(self) -> None:
        """Wait for all queued work; raise the first kernel error since the last synchronize."""
        self._wait_all()
        self._raise_errors()

    def _wait_all(self) -> None:
        with self._cv:
            while self._completed < self._submitted:
                self._cv.wait()

    def _raise_errors(self) -> None:
        if not self._errors:
            return
        errors, self._errors = self._errors, []
        self._failed.clear()
        seq, name, exc = errors[0]
        raise self._error(name, exc, len(errors) - 1)

    def _error(self, name: str, exc: BaseException, more: int = 0) -> BaseException:
        """The exception to raise for a kernel's failure (``more``: later failures not shown)."""
        if isinstance(exc, (ParamInvalidError, InferShapeError, OutOfMemoryError)):
            return exc  # a data check inside a kernel (index out of range...): keep its typed error
        if isinstance(exc, MemoryError):  # numpy's, for a temporary the kernel allocated itself
            err = OutOfMemoryError(
                f"{name}: kernel ran out of host memory on stream {self.name}: {exc}"
                + (f" (and {more} more errors)" if more else ""),
                op=name,
            )
            err.__cause__, err.__suppress_context__ = exc, True
            return err
        err = KernelError(
            f"{name}: kernel failed on stream {self.name}: {type(exc).__name__}: {exc}"
            + (f" (and {more} more errors)" if more else ""),
            op=name,
        )
        err.__cause__, err.__suppress_context__ = exc, True  # as `raise err from exc`
        return err

    def wait_event(self, event: Event) -> None:
        """Make later work on this stream wait until ``event`` completes."""
        if event._stream is None:
            return
        self.wait_stream_seq(event._stream, event._seq)

    def wait_stream_seq(self, other: Stream, seq: int, mark: list | None = None) -> None:
        # ``mark``: a tensor's failure mark (``Tensor._producer[2]``), accepted so producers unpack here
        if other is self or other.done(seq):
            return
        if self.inline:
            other._wait_quiet(seq)
        else:
            self.launch(lambda: other._wait_quiet(seq), name=f"wait:{other.name}")

    def _wait_quiet(self, seq: int) -> None:
        with self._cv:
            while self._completed < seq:
                self._cv.wait()

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def close(self) -> None:
        """Finish queued work and stop the worker thread (done by ``opsnn.finalize()``)."""
        self._wait_all()
        _stop(self._cv, self._closed_flag)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    # -- current-stream context --------------------------------------------------
    def __enter__(self) -> Stream:
        stack = getattr(_tls, "stack", None)
        if stack is None:
            stack = _tls.stack = []
        stack.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _tls.stack.pop()

    def __repr__(self) -> str:
        kind = "inline" if self.inline else "worker"
        return f"<Stream {self.name} ({kind}) pending={self._submitted - self._completed}>"


#: worker threads still running, dropped streams' included (``join_workers`` waits for them)
_workers: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


def join_workers() -> None:
    """Wait until every worker thread has ended; callers close the live streams first
    (``opsnn.finalize()``), dropped ones end by themselves once their queue is empty."""
    for t in list(_workers):
        if t is not threading.current_thread():
            t.join()


def _check_deps(name: str, deps: list) -> None:
    for d in deps:
        if d:
            raise KernelError(f"{name}: an input was produced by {d[0]}, whose kernel failed", op=name)


def _stop(cv: threading.Condition, closed: list) -> None:
    with cv:
        if not closed:
            closed.append(True)
        cv.notify_all()


def _work(ref, cv: threading.Condition, queue: deque, closed: list, num_threads: int) -> None:
    """A worker stream's thread: runs queued tasks in order until the stream is closed (or dropped)
    and its queue is empty. It holds the stream only while running a task."""
    import numba

    numba.set_num_threads(min(num_threads, numba.config.NUMBA_NUM_THREADS))  # thread-local setting
    while True:
        with cv:
            while not queue and not closed:
                cv.wait()
            if not queue:
                return
            seq, fn, name, info, t_queue, args, mark, deps = queue[0]
        stream = ref()
        if stream is not None:
            stream._run(seq, fn, name, info, t_queue, args, mark, deps)
        else:  # dropped with work queued: nobody can wait on it any more, but the work still runs
            try:
                if deps:
                    _check_deps(name, deps)
                fn(*args)
            except BaseException:  # noqa: BLE001 - no one is left to report it to
                if mark is not None:
                    mark.append(name)
        # drop the task's tensors (and the stream) now, not at the next task
        stream = fn = info = args = mark = deps = None
        with cv:
            queue.popleft()
            cv.notify_all()


def current_stream() -> Stream:
    """The stream ops are issued on: the innermost ``with stream:`` or the default stream."""
    stack = getattr(_tls, "stack", None)
    if stack:
        return stack[-1]
    return _get_context().default_stream


class Event:
    """A marker in a stream: ``record`` it, ``wait`` on it from another stream or the host,
    and time the work between two events with ``elapsed_ms``."""

    def __init__(self):
        self._stream: Stream | None = None
        self._seq = 0
        self._flag = threading.Event()
        self.time: float | None = None

    def record(self, stream: Stream | None = None) -> Event:
        stream = stream or current_stream()
        self._flag.clear()
        self.time = None

        def mark():
            self.time = time.perf_counter()
            self._flag.set()

        self._seq = stream.launch(mark, name="event")
        self._stream = stream
        return self

    def query(self) -> bool:
        return self._stream is None or self._flag.is_set()

    def synchronize(self) -> None:
        if self._stream is not None:
            self._flag.wait()

    def wait(self, stream: Stream | None = None) -> None:
        """Make ``stream`` (default: the current one) wait for this event."""
        (stream or current_stream()).wait_event(self)

    def elapsed_ms(self, end: Event) -> float:
        """Milliseconds between this event and ``end`` (both must have completed)."""
        self.synchronize()
        end.synchronize()
        if self.time is None or end.time is None:
            raise OpsnnRuntimeError("Event.elapsed_ms: both events must be recorded first")
        return (end.time - self.time) * 1e3
