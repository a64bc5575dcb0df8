"""How many threads kernels use: every core on a quiet machine, fewer when other processes hold them.

Our parallel kernels are fork-join: a numba parallel region or an OpenBLAS GEMM splits its
work into one share per thread and waits for the last share. When another process holds a
core, the share on that core waits for the scheduler (milliseconds per region, dozens of
regions per model), and idle pool threads spinning for work take more of the cores (with two
busy processes beside it ResNet-50 ran ~20x slower on every core than on one: see
docs/kernel-libraries.md). So the policy is:

- ``OPSNN_NUM_THREADS=n`` or ``opsnn.set_num_threads(n)``: kernels use ``n`` threads.
- ``"auto"`` (the default): before a kernel launch, at most every ``SAMPLE_S``, count the
  runnable tasks on the machine that are not this process's (``/proc/loadavg``'s running
  count minus our threads in state R); kernels use ``cores - others`` threads (at least 1),
  where ``others`` is the smallest count of the last ``WINDOW`` samples, so a task that is
  runnable for a moment changes nothing while a process that keeps a core busy does. Without
  ``/proc`` (not Linux) "auto" uses every core.

The count applies to numba's parallel kernels (a per-thread setting, made on the thread that
runs the kernels: the caller for the default stream, the worker for other streams, never more
than the stream's own ``num_threads``) and to OpenBLAS (process-wide; left alone while a
pipeline holds it at its own setting, see :mod:`opsnn.runtime.blas`).

    >>> import opsnn
    >>> opsnn.set_num_threads(1)        # fixed: one thread per kernel
    >>> opsnn.get_num_threads()
    1
    >>> opsnn.set_num_threads("auto")   # back to the default
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque

import numba

from ..errors import ParamInvalidError
from . import blas

#: seconds between two samples of the machine's load
SAMPLE_S = 0.02
#: samples whose minimum is used (a busy process shows in all of them, a blip in one)
WINDOW = 3


def cores() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def others_running() -> int | None:
    """Runnable tasks on the machine right now that are not threads of this process, or None
    when the system does not say (no ``/proc``)."""
    try:
        with open("/proc/loadavg", "rb") as f:
            running = int(f.read().split()[3].split(b"/")[0])
        ours = 0
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                    st = f.read()
            except OSError:  # the thread ended meanwhile
                continue
            end = st.rfind(b")")  # the name may hold spaces and parentheses; the state follows it
            if st[end + 2 : end + 3] == b"R":
                ours += 1
        return max(0, running - ours)
    except (OSError, ValueError, IndexError):
        return None


class ThreadPolicy:
    """The process-wide policy (see the module docstring); ``sampler`` counts the other
    runnable tasks (tests inject one)."""

    def __init__(self, setting=None, sampler=others_running, clock=time.monotonic):
        self.sampler = sampler
        self.clock = clock
        self.lock = threading.Lock()
        self.samples: deque = deque(maxlen=WINDOW)
        self.next_sample = 0.0
        self.cores = cores()
        self.current = self.cores
        self.fixed: int | None = None
        self.set(os.environ.get("OPSNN_NUM_THREADS", "auto") if setting is None else setting)

    def set(self, n) -> None:
        if n == "auto" or n is None:
            self.fixed = None
            self.samples.clear()
            self.next_sample = 0.0
            self.current = self.cores
            return
        if isinstance(n, str) and n.strip().isdigit():
            n = int(n)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ParamInvalidError(
                f"number of threads must be an int >= 1 or 'auto', got {n!r} "
                "(OPSNN_NUM_THREADS / opsnn.set_num_threads)"
            )
        self.fixed = n
        self.current = n

    @property
    def mode(self):
        return "auto" if self.fixed is None else self.fixed

    def threads(self) -> int:
        """Threads a kernel launched now should use."""
        if self.fixed is not None:
            return self.fixed
        now = self.clock()
        if now < self.next_sample:
            return self.current
        with self.lock:
            if now >= self.next_sample:
                self.next_sample = now + SAMPLE_S
                others = self.sampler()
                if others is None:
                    self.current = self.cores
                else:
                    self.samples.append(others)
                    self.current = max(1, self.cores - min(self.samples))
        return self.current


policy = ThreadPolicy()


def enter(limit: int):
    """Called on the thread about to run a kernel: sets OpenBLAS to the policy's count and,
    when that is below every core, numba's count for this thread to it (at most ``limit``).
    Returns what :func:`leave` needs to put numba's count back after the kernel (plans made
    later on this thread size their parallel work by it and must not inherit a count chosen
    under load). With every core available it leaves numba's count as the thread has it."""
    n = policy.threads()
    blas.follow_policy(n)
    if n >= policy.cores:
        return None
    k = max(1, min(n, limit, numba.config.NUMBA_NUM_THREADS))
    cur = numba.get_num_threads()
    if cur <= k:
        return None
    numba.set_num_threads(k)
    return cur


def leave(prev) -> None:
    if prev is not None:
        numba.set_num_threads(prev)


def set_num_threads(n) -> None:
    """Threads per kernel: an int >= 1, or ``"auto"`` (see :mod:`opsnn.runtime.threads`)."""
    policy.set(n)


def get_num_threads() -> int:
    """The threads a kernel launched now would use (``"auto"`` samples the machine's load)."""
    return policy.threads()
