"""The communication thread that runs every collective of a process group, and the ``Work`` handle.

One thread owns the process group's MPI calls and runs collectives one after another in launch
order, so every rank issues them to MPI in the same order whatever thread launched them, and the
caller goes on (Python, backward's kernels) while they run. It drives each non-blocking MPI call
with ``Test`` and short sleeps rather than a blocking wait: a blocking MPI wait spins a core,
which on a machine with one core per rank would take it from the computation the collective is
meant to overlap::

    >>> w = dist.all_reduce(t, async_op=True)   # doctest: +SKIP
    >>> ...                                     # compute while it runs
    >>> w.wait()                                # t now holds the sum over ranks
"""

from __future__ import annotations

import collections
import threading
import time

from ..errors import CollectiveTimeoutError, DistributedError

#: polls of a request before the thread starts sleeping between polls (a small collective ends here)
SPIN_POLLS = 64
#: the longest sleep between two polls of a running collective, in seconds
MAX_POLL_SLEEP_S = 0.0005


class Work:
    """A launched collective: ``wait()`` blocks until it is done (and raises what made it fail),
    ``is_completed()`` asks without blocking. The tensors it writes hold their result once
    ``wait()`` returns or ``is_completed()`` is True."""

    __slots__ = ("op", "seq", "describe", "_start", "_finish", "_done", "_error", "_staged", "_request")

    def __init__(self, op: str, describe: str, start, finish=None, staged: bool = False):
        self.op = op  # "all_reduce", "broadcast", ...
        self.seq = 0  # this rank's count of collectives launched on the group, set at launch
        self.describe = describe  # e.g. "SUM of float32[1024]"
        self._start = start  # () -> MPI request, run on the communication thread
        self._finish = finish  # () -> None: averages, copies a staged result back
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._staged = staged  # True when a contiguous temporary stands in for a tensor
        self._request = None

    def __repr__(self) -> str:
        state = "failed" if self._error else "completed" if self._done.is_set() else "pending"
        return f"Work({self.op} #{self.seq}: {self.describe}, {state})"

    def is_completed(self) -> bool:
        """True once the collective has finished (successfully or not); never blocks."""
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
        if not self._done.wait(seconds):
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
