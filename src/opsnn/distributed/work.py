"""What runs a process group's collectives, and the ``Work`` handle.

Two engines, both issuing collectives to MPI in launch order (so every rank issues them in the
same order whatever thread launched them) and both returning at once so the caller goes on
(Python, backward's kernels) while they run:

- :class:`CommThread`: one thread owns the MPI calls and runs collectives one after another. It
  drives each non-blocking MPI call with ``Test`` and short sleeps rather than a blocking wait
  (a blocking MPI wait spins a core). For ranks whose kernels have several cores.
- :class:`InlineProgress`: no thread. Collectives run one after another too; the first starts in
  MPI on the thread that launches it, and they advance whenever this rank calls in:
  ``progress()`` (DistributedDataParallel calls it as each gradient becomes ready during
  backward), ``is_completed()``, ``wait()``. With one core per rank a second thread could only
  take that core, and the GIL, from the computation: the copies and reductions of an allreduce
  cost the core the same either way, and done between backward ops they cost no thread switches.

::

    >>> w = dist.all_reduce(t, async_op=True)   # doctest: +SKIP
    >>> ...                                     # compute while it runs
    >>> w.wait()                                # t now holds the sum over ranks
"""

from __future__ import annotations

import collections
import os
import threading
import time

from ..errors import CollectiveTimeoutError, DistributedError

#: polls of a request before the thread starts sleeping between polls (a small collective ends here)
SPIN_POLLS = 64
#: the longest sleep between two polls of a running collective, in seconds
MAX_POLL_SLEEP_S = 0.0005
#: seconds InlineProgress's wait() polls without sleeping (yielding the core between polls):
#: the waiting thread has nothing else to do, and a sleeping rank answers its peer late
INLINE_SPIN_S = 0.01


class Work:
    """A launched collective: ``wait()`` blocks until it is done (and raises what made it fail),
    ``is_completed()`` asks without blocking. The tensors it writes hold their result once
    ``wait()`` returns or ``is_completed()`` is True."""

    __slots__ = (
        "op",
        "seq",
        "describe",
        "_start",
        "_finish",
        "_done",
        "_error",
        "_staged",
        "_request",
        "_engine",
        "_deadline",
    )

    def __init__(self, op: str, describe: str, start, finish=None, staged: bool = False):
        self.op = op  # "all_reduce", "broadcast", ...
        self.seq = 0  # this rank's count of collectives launched on the group, set at launch
        self.describe = describe  # e.g. "SUM of float32[1024]"
        self._start = start  # () -> MPI request, run by the engine
        self._finish = finish  # () -> None: averages, copies a staged result back
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._staged = staged  # True when a contiguous temporary stands in for a tensor
        self._request = None
        self._engine = None  # the InlineProgress that advances it when waited on, else None
        self._deadline = 0.0

    def __repr__(self) -> str:
        state = "failed" if self._error else "completed" if self._done.is_set() else "pending"
        return f"Work({self.op} #{self.seq}: {self.describe}, {state})"

    def is_completed(self) -> bool:
        """True once the collective has finished (successfully or not); never blocks."""
        if not self._done.is_set() and self._engine is not None:
            self._engine.progress()
        return self._done.is_set()

    def is_success(self) -> bool:
        """True once the collective has finished without an error."""
        return self._done.is_set() and self._error is None

    def exception(self) -> BaseException | None:
        """The error that made the collective fail, or None."""
        return self._error

    def wait(self, timeout=None) -> bool:
        """Block until the collective is done; raise its error if it failed. ``timeout`` (seconds or
        a ``timedelta``) bounds this wait only: the collective itself is bounded by the process
        group's timeout."""
        seconds = _seconds(timeout, "Work.wait") if timeout is not None else None
        engine = self._engine
        finished = engine.wait(self, seconds) if engine is not None else self._done.wait(seconds)
        if not finished:
            raise CollectiveTimeoutError(
                f"{self.op} #{self.seq} ({self.describe}) was still running after wait(timeout={seconds:g} s)",
                op=f"Work.wait({self.op})",
            )
        if self._error is not None:
            raise self._error
        return True

    def result(self) -> None:
        self.wait()


def _seconds(timeout, what: str) -> float:
    """Seconds from a number or a ``datetime.timedelta``."""
    total = getattr(timeout, "total_seconds", None)
    value = total() if callable(total) else timeout
    try:
        value = float(value)
    except (TypeError, ValueError):
        value = float("nan")
    if not value > 0:
        from ..errors import ParamInvalidError

        raise ParamInvalidError(f"{what}: timeout must be a positive number of seconds or a timedelta, got {timeout!r}")
    return value


class CommThread:
    """Runs works one at a time, in the order they were submitted, each within ``timeout_s``.

    ``poll(request)`` answers whether a request finished (MPI's ``Test``); ``on_timeout(work)``
    builds the error for a collective that ran out of time (it names the ranks it waited for).
    After a timeout or an MPI error the group is broken: MPI cannot cancel a collective, so every
    later work fails at once with an error that names the first failure."""

    def __init__(self, name: str, timeout_s: float, poll, on_timeout, on_start=None):
        self.timeout_s = timeout_s
        self._poll = poll
        self._on_timeout = on_timeout
        self._on_start = on_start
        self._queue: collections.deque[Work] = collections.deque()
        self._cv = threading.Condition()
        self._closing = False
        self._seq = 0
        self.broken: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def progress(self) -> None:
        """Nothing to do: the thread advances the collectives."""

    def submit(self, work: Work) -> Work:
        with self._cv:
            if self._closing:
                raise DistributedError(
                    f"{work.op}: the process group was destroyed; call init_process_group() again", op=work.op
                )
            self._seq += 1
            work.seq = self._seq
            self._queue.append(work)
            self._cv.notify()
        return work

    def close(self) -> None:
        """Run what is queued, then end the thread and join it."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait()
                if not self._queue:
                    return
                work = self._queue.popleft()
            try:
                if self.broken is not None:
                    raise DistributedError(
                        f"{work.op} #{work.seq} was not run: the process group is broken since: {self.broken}",
                        op=work.op,
                    )
                self._execute(work)
            except BaseException as exc:  # delivered to whoever waits on the work
                work._error = exc
                if self.broken is None:  # the ranks no longer agree on which collective comes next
                    self.broken = exc
            finally:
                work._done.set()

    def _execute(self, work: Work) -> None:
        if self._on_start is not None:
            self._on_start(work)
        work._request = request = work._start()
        if request is not None:
            deadline = time.monotonic() + self.timeout_s
            polls = 0
            sleep = 2e-5
            while not self._poll(request):
                polls += 1
                if polls <= SPIN_POLLS:
                    continue
                if time.monotonic() > deadline:
                    self.broken = err = self._on_timeout(work)
                    raise err
                time.sleep(sleep)
                sleep = min(sleep * 2, MAX_POLL_SLEEP_S)
        work._request = None
        if work._finish is not None:
            work._finish()


class InlineProgress:
    """Runs works one at a time in submission order, like :class:`CommThread`, without a thread:
    the first work starts in MPI as it is submitted, and each call to :meth:`progress` (or a wait,
    or ``is_completed()``) tests the one running and starts the next once it is done. The same
    contract: each collective within ``timeout_s`` of its start, and after a timeout or an MPI
    error the group is broken and every later collective fails at once."""

    def __init__(self, name: str, timeout_s: float, poll, on_timeout, on_start=None):
        self.name = name
        self.timeout_s = timeout_s
        self._poll = poll
        self._on_timeout = on_timeout
        self._on_start = on_start
        self._lock = threading.RLock()  # one thread at a time in MPI and in the queue
        self._queue: collections.deque[Work] = collections.deque()  # not done; the first is running
        self._closing = False
        self._seq = 0
        self.broken: BaseException | None = None

    @property
    def alive(self) -> bool:
        return not self._closing

    def submit(self, work: Work) -> Work:
        with self._lock:
            if self._closing:
                raise DistributedError(
                    f"{work.op}: the process group was destroyed; call init_process_group() again", op=work.op
                )
            self._seq += 1
            work.seq = self._seq
            work._engine = self
            self._queue.append(work)
            self._advance()  # starts it if it is first; a small collective whose peers are there may end now
        return work

    def progress(self) -> None:
        """Test the running collective once, starting the next ones as each finishes."""
        if self._queue:
            with self._lock:
                self._advance()

    def wait(self, work: Work, seconds: float | None) -> bool:
        """Advance the collectives until ``work`` is done (True) or ``seconds`` have passed (False)."""
        start = time.monotonic()
        sleep = 2e-5
        while not work._done.is_set():
            with self._lock:
                self._advance()
                self._expire()
            if work._done.is_set():
                break
            waited = time.monotonic() - start
            if seconds is not None and waited > seconds:
                return False
            if waited < INLINE_SPIN_S:
                os.sched_yield()  # a peer rank sharing this core runs now, not at our next time slice
                continue
            time.sleep(sleep)
            sleep = min(sleep * 2, MAX_POLL_SLEEP_S)
        return True

    def close(self) -> None:
        """Run what is queued, then refuse new works."""
        with self._lock:
            last = self._queue[-1] if self._queue else None
        if last is not None:
            self.wait(last, None)
        self._closing = True

    # -- under the lock -----------------------------------------------------------------------------
    def _advance(self) -> None:
        queue = self._queue
        while queue:
            work = queue[0]
            try:
                if work._request is None:
                    if self.broken is not None:
                        raise self._not_run(work)
                    if self._on_start is not None:
                        self._on_start(work)
                    work._request = self._request_of(work)
                    if work._request is None:  # nothing to wait for
                        queue.popleft()
                        self._end(work, None)
                        continue
                if not self._poll(work._request):
                    return
            except BaseException as exc:  # delivered to whoever waits on the work
                queue.popleft()
                self._break(exc)
                self._end(work, exc)
                continue
            queue.popleft()
            self._end(work, None)

    def _request_of(self, work: Work):
        request = work._start()
        work._deadline = time.monotonic() + self.timeout_s
        return request

    def _expire(self) -> None:
        queue = self._queue
        if not queue or queue[0]._request is None or time.monotonic() <= queue[0]._deadline:
            return
        late = queue.popleft()
        err = self._on_timeout(late)
        self._break(err)
        self._end(late, err)
        while queue:  # MPI cannot cancel the late one: nothing after it can run
            work = queue.popleft()
            self._end(work, self._not_run(work))

    def _end(self, work: Work, error: BaseException | None) -> None:
        work._request = None
        if error is None and work._finish is not None:
            try:
                work._finish()
            except BaseException as exc:
                error = exc
                self._break(exc)
        work._error = error
        work._done.set()

    def _break(self, exc: BaseException) -> None:
        if self.broken is None:  # the ranks no longer agree on which collective comes next
            self.broken = exc

    def _not_run(self, work: Work) -> DistributedError:
        return DistributedError(
            f"{work.op} #{work.seq} was not run: the process group is broken since: {self.broken}", op=work.op
        )
