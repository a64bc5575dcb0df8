"""Tiered compilation: a cold plan runs a library kernel while its numba kernel compiles in the background.

A numba kernel compiles on first use (seconds each, see :mod:`opsnn.runtime.kernel_cache`). A kernel
record that names a ``cold_alternative`` (a library kernel of the same op with no compile cost and
the same semantics, NaN and Inf included: oneDNN's direct convolution for the blocked Winograd
one) is replaced by it in ``select_kernel`` until its machine code for that workload is in the
on-disk kernel cache; the workload is queued for a background process that plans and runs the
numba kernel once on random inputs of the same shapes, so numba compiles it into the same cache,
and then leaves a marker there. Later compiles and plans (in this process, once it reports back,
and in later processes) find the marker and pick the numba kernel.

The background process is one at a time, niced, fed workloads over a pipe; it ends when the
queue has been empty for a while, at this process's exit (``atexit`` terminates it) and when
this process dies (``PR_SET_PDEATHSIG`` on Linux). A workload it cannot compile is logged on the
``opsnn.tiering`` logger, never raised, and keeps the library kernel. One line on stderr says
when the first background compile starts. ``OPSNN_TIERED=0`` turns tiering off (the numba kernel
compiles in the foreground, as before); ``opsnn warmup`` runs that way and leaves the markers.

Kernels called directly rather than through ``select_kernel`` (the LLM decoder's fused step and
few-row products, rotary and SwiGLU over column views, the conv IEEE check's max |x|) use
:func:`cold_direct`: the caller passes the numba dispatcher and its arguments, gets back the
markers still missing (keyed by the kernel's source stamp and numba's argument types, so the
background process compiles exactly that specialization with ``Dispatcher.compile``) and runs its
numpy stand-in meanwhile; kernel modules reach it through ``runtime.kernel_cache.cold``.

Eager calls pick the numba kernel as soon as it is cached (their executor cache is keyed on
``registry.version()``, which a finished workload bumps); a compiled graph's plan that runs stand-ins
is built again on its first run after every one of its workloads finished (:func:`pending`), so a
long-running process does not keep the library kernels of its first minute.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import pickle
import queue
import subprocess
import sys
import threading

import numpy as np

from ..runtime import kernel_cache

log = logging.getLogger("opsnn.tiering")

#: inputs known at prepare time above this size are sent as (shape, dtype) and made up again as
#: random finite values in the background process (a weight's values do not change its machine code)
_SEND_BYTES = 1 << 20
#: seconds the background process waits for another workload before it exits
_LINGER_S = 5.0
_NICE = 10


def enabled() -> bool:
    """Whether tiered compilation is on (``OPSNN_TIERED``, default 1)."""
    return os.environ.get("OPSNN_TIERED", "1") != "0"


def _marker_dir() -> str:
    return os.path.join(kernel_cache.target_dir(), "tiered")


_stamps: dict = {}


def _stamp(kernel) -> str:
    s = _stamps.get(kernel.fn)
    if s is None:
        s = _stamps[kernel.fn] = kernel_cache.dependency_stamp(kernel.fn)
    return s


def _value_key(v):
    if v is None:
        return None
    a = np.asarray(v)
    if a.nbytes > _SEND_BYTES:
        return ("big", a.shape, a.dtype.str)
    return (a.shape, a.dtype.str, hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest())


def workload_key(rec, ctx, kernel) -> str | None:
    """The marker name of ``kernel`` on ``ctx``'s kind of workload, or None when its shapes are
    not all known: the op, the kernel's source stamp, each input's dtype and rank, the attributes
    and the host inputs' values. Not the sizes: numba specializes on types, so another size of a
    compiled workload is compiled too (a size-chosen variant that is not, such as a parallel form,
    compiles in the foreground as without tiering), and a model whose shapes change every call
    (a growing sequence) does not stay on the library kernel."""
    metas = []
    for m in ctx.inputs:
        if m is None:
            metas.append(None)
            continue
        if not all(isinstance(d, (int, np.integer)) for d in m.shape):
            return None
        metas.append((len(m.shape), np.dtype(m.dtype).str))
    try:
        attrs = repr(sorted((k, _freeze(v)) for k, v in ctx.attrs.items()))
    except TypeError:
        return None
    host = [_value_key(v) if i in rec.host_inputs else None for i, v in enumerate(ctx.values)]
    text = repr((rec.domain, rec.name, kernel.name, _stamp(kernel), metas, attrs, host, ctx.num_outputs))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _freeze(v):
    if isinstance(v, np.ndarray):
        return _value_key(v)
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if hasattr(v, "SerializeToString"):
        return (type(v).__name__, hashlib.sha256(v.SerializeToString()).hexdigest())
    return v


def _threads() -> int:
    from ..runtime import threads

    return threads.get_num_threads()


def is_cached(key: str) -> bool:
    """Whether a background (or warmup) run left ``key``'s marker in the kernel cache."""
    return os.path.exists(os.path.join(_marker_dir(), key))


def mark_cached(key: str) -> None:
    """Leaves ``key``'s marker: its numba kernel is in the kernel cache."""
    d = _marker_dir()
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, key), "w"):
        pass


#: workloads whose numba kernel was selected with tiering off (``mark_foreground`` records them)
_foreground: set[str] = set()


def mark_foreground() -> int:
    """Leaves the markers of the workloads whose numba kernels this process selected with tiering
    off (``opsnn warmup`` calls it after each model ran, so they compiled); returns how many."""
    keys = list(_foreground)
    _foreground.clear()
    for key in keys:
        mark_cached(key)
    return len(keys)


def _alternative(rec, ctx, names):
    """The first kernel of ``names`` (one name or a tuple, in order of preference) that can run
    ``ctx`` (one only expected to be slower counts), else None."""
    for name in (names,) if isinstance(names, str) else names:
        alt = next((k for k in rec.kernels if k.name == name), None)
        if alt is None:
            continue
        why = alt.check(ctx)
        if why is None or _is_not_preferred(why):
            return alt
    return None


def cold_kernel(rec, ctx, kernel):
    """``(library kernel, why, workload key)`` to run instead of ``kernel`` while its workload is not
    compiled (the workload then queued for the background process), else None."""
    if not enabled():
        key = workload_key(rec, ctx, kernel)
        if key is not None:
            _foreground.add(key)
        return None
    alt = _alternative(rec, ctx, kernel.cold_alternative)
    if alt is None:
        return None
    key = workload_key(rec, ctx, kernel)
    if key is None or is_cached(key):
        return None
    marker = os.path.join(_marker_dir(), key)
    if marker not in _background.failed:
        job = _job(rec, ctx, kernel, key)
        if job is None:
            return None
        if _background.submit(marker, job):
            log.info("tiering: %s kernel %s on %s queued for a background compile", rec.name, kernel.name, key)
    return alt, f"{kernel.name} (priority {kernel.priority}) not compiled yet, compiling in the background", key


# -- kernels called directly (not through select_kernel) ---------------------------------------------------
def direct_key(fn, sig=None) -> str:
    """The marker name of numba kernel ``fn`` (a dispatcher, or a plain function that compiles what
    it needs when called, such as a ``numba.cfunc``) on argument types ``sig``: its module and name,
    its source stamp and the types."""
    py = getattr(fn, "py_func", fn)
    s = _stamps.get(py)
    if s is None:
        s = _stamps[py] = kernel_cache.dependency_stamp(py)
    text = repr(("direct", py.__module__, py.__qualname__, s, None if sig is None else tuple(map(str, sig))))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cold_direct(calls) -> tuple[str, ...]:
    """Tiering for kernels a caller runs directly: ``calls`` are ``(numba dispatcher, arguments of a
    call)`` pairs, or ``(function, None)`` for a module-level function that compiles what it needs
    when called (C callbacks). Returns the marker keys of those whose machine code is neither in
    this process nor in the kernel cache, each queued for the background process: while it is not
    empty the caller runs its library stand-in (the same semantics, NaN and Inf included) and asks
    :func:`all_cached` later whether to switch. Empty when tiering is off (their keys are then
    recorded for :func:`mark_foreground`) and when everything is compiled; a call whose background
    compile failed is left to compile in the foreground."""
    cold = []
    for fn, args in calls:
        sig = None
        if args is not None:
            sig = tuple(fn.typeof_pyval(a) for a in args)
            if sig in fn.overloads:
                continue
        key = direct_key(fn, sig)
        if not enabled():
            _foreground.add(key)
            continue
        if is_cached(key):
            continue
        marker = os.path.join(_marker_dir(), key)
        if marker in _background.failed:
            continue
        py = getattr(fn, "py_func", fn)
        job = {"marker": marker, "direct": (py.__module__, py.__qualname__), "sig": sig}
        if _background.submit(marker, pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)):
            log.info("tiering: %s.%s%s queued for a background compile", py.__module__, py.__qualname__, sig or "")
        cold.append(key)
    return tuple(cold)


def all_cached(keys) -> bool:
    """Whether the background process (or a warmup) compiled every one of ``keys``
    (:func:`cold_direct`'s answer) into the kernel cache; a key whose background compile failed
    counts too (the caller switches and the kernel compiles in the foreground, as without tiering)."""
    return not pending(keys)


def pending(keys) -> tuple[str, ...]:
    """Those of the workload ``keys`` still to be compiled: neither cached nor failed in the background
    (a failed one keeps its library kernel for good)."""
    return tuple(k for k in keys if not is_cached(k) and os.path.join(_marker_dir(), k) not in _background.failed)


def _is_not_preferred(why) -> bool:
    from .autotune import NotPreferred

    return isinstance(why, NotPreferred)


def _job(rec, ctx, kernel, key) -> bytes | None:
    values = []
    for v in ctx.values:
        if v is not None and np.asarray(v).nbytes > _SEND_BYTES:
            a = np.asarray(v)
            v = ("random", a.shape, a.dtype.str)
        values.append(v)
    job = {
        "marker": os.path.join(_marker_dir(), key),
        "op": rec.name,
        "domain": rec.domain,
        "kernel": kernel.name,
        "metas": [None if m is None else (tuple(int(d) for d in m.shape), np.dtype(m.dtype).str) for m in ctx.inputs],
        "values": values,
        "attrs": dict(ctx.attrs),
        "num_outputs": ctx.num_outputs,
    }
    try:
        return pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # an attribute that does not pickle (a subgraph): compile in the foreground
        return None


class _Background:
    """The queue of workloads and the one process that compiles them (see the module docstring)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.queue: queue.Queue = queue.Queue()
        self.pending: set[str] = set()  # marker paths
        self.done = 0
        self.failed: dict[str, str] = {}
        self.proc: subprocess.Popen | None = None
        self.thread: threading.Thread | None = None
        self.idle = threading.Condition(self.lock)
        self.announced = False
        atexit.register(self.stop)

    def submit(self, key: str, job: bytes) -> bool:
        """Queues ``job`` under ``key`` (its marker path) unless it is queued already; True when queued."""
        with self.lock:
            if key in self.pending:
                return False
            self.pending.add(key)
            self.queue.put((key, job))
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._serve, name="opsnn-tiering", daemon=True)
                self.thread.start()
            return True

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until every queued workload is compiled or failed; False on timeout."""
        with self.idle:
            return self.idle.wait_for(lambda: not self.pending, timeout)

    def _spawn(self) -> subprocess.Popen:
        env = dict(os.environ, OPSNN_TIERED="0", OPSNN_COMPILE_PROGRESS="0", OPSNN_NUM_THREADS=str(_threads()))
        proc = subprocess.Popen(
            [sys.executable, "-m", "opsnn.ops.tiering", str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        if not self.announced:
            self.announced = True
            print(
                f"opsnn: compiling numba kernels in the background (process {proc.pid}, niced); library kernels "
                f"run until they are cached in {kernel_cache.cache_root()} (OPSNN_TIERED=0 compiles them now)",
                file=sys.stderr,
                flush=True,
            )
        return proc

    def _serve(self) -> None:
        while True:
            try:
                key, job = self.queue.get(timeout=_LINGER_S)
            except queue.Empty:
                with self.lock:
                    if self.queue.empty():
                        self._close()
                        self.thread = None
                        return
                continue
            ok, message = self._compile(job)
            with self.lock:
                if key not in self.pending:  # dropped by stop(): its process was terminated on purpose
                    continue
                if ok:
                    self.done += 1
                    from . import registry

                    registry._bump_version()  # eager executors re-select: the numba kernel is cached now
                else:
                    self.failed[key] = message
                    log.warning("opsnn tiering: background compile failed, the library kernel stays: %s", message)
                self.pending.discard(key)
                self.idle.notify_all()

    def _compile(self, job: bytes) -> tuple[bool, str]:
        try:
            if self.proc is None or self.proc.poll() is not None:
                self.proc = self._spawn()
            pickle.dump(job, self.proc.stdin)
            self.proc.stdin.flush()
            return pickle.load(self.proc.stdout)
        except (OSError, EOFError, pickle.UnpicklingError) as exc:
            code = self.proc.poll() if self.proc is not None else None
            self._close()
            return False, f"the background process ended ({type(exc).__name__}, exit status {code})"

    def _close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()  # the worker's read ends: it exits between workloads
        except OSError:
            pass
        try:
            proc.wait(timeout=_LINGER_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop(self) -> None:
        """Drops the queued workloads and terminates the background process (at exit: it never
        outlives this one)."""
        with self.lock:
            while not self.queue.empty():
                self.queue.get_nowait()
            self.pending.clear()
            self.idle.notify_all()
            proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    @property
    def pid(self) -> int | None:
        proc = self.proc
        return proc.pid if proc is not None and proc.poll() is None else None


_background = _Background()
kernel_cache.cold_direct = cold_direct  # the kernels' way to it (they do not import ops)


def wait(timeout: float | None = None) -> bool:
    """Blocks until the queued background compiles are done (True) or ``timeout`` passes (False)."""
    return _background.wait(timeout)


def status() -> dict:
    """What the background compiler has done in this process: pending, done and failed workloads
    (failures with their message) and the worker's pid while it runs."""
    b = _background
    with b.lock:
        return {"pending": len(b.pending), "done": b.done, "failed": dict(b.failed), "pid": b.pid}


# -- the background process --------------------------------------------------------------------------------
def _die_with_parent(parent: int) -> None:
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the closed pipe and the parent's atexit end it
        pass
    if os.getppid() != parent:
        sys.exit(0)


def _input(meta, value, rng):
    """An input of the workload in the background process: its value when sent, else made up."""
    if isinstance(value, tuple) and len(value) == 3 and value[0] == "random":
        _, shape, dt = value
        return (rng.standard_normal(shape) * 0.1).astype(dt)
    if value is not None:
        return np.asarray(value)
    shape, dt = meta
    dt = np.dtype(dt)
    if dt.kind == "f" or dt.name == "bfloat16":
        return rng.standard_normal(shape).astype(dt)
    return np.zeros(shape, dt)  # integers and booleans: zeros are valid indices and masks


def run_direct(job: dict) -> None:
    """Compiles ``job["direct"]`` (a numba dispatcher: for the argument types ``job["sig"]``; a
    plain function: by calling it) into the kernel cache, then leaves the marker."""
    import importlib

    module, qualname = job["direct"]
    fn = importlib.import_module(module)
    for part in qualname.split("."):
        fn = getattr(fn, part)
    if job["sig"] is None:
        fn()
    else:
        fn.compile(job["sig"])
    os.makedirs(os.path.dirname(job["marker"]), exist_ok=True)
    with open(job["marker"], "w"):
        pass


def run_job(job: dict) -> None:
    """Plans and runs ``job["kernel"]`` once on random inputs of the workload's shapes (numba
    compiles what it touches into the kernel cache), then leaves the workload's marker."""
    from ..runtime.stream import current_stream
    from ..tensor import as_tensor
    from .executor import Executor, plan_op
    from .registry import TensorMeta, get_op

    rec = get_op(job["op"], job["domain"])
    rng = np.random.default_rng(0)
    arrays = [None if m is None else _input(m, v, rng) for m, v in zip(job["metas"], job["values"])]
    metas = [None if a is None else TensorMeta(a.shape, a.dtype) for a in arrays]
    values = [None if v is None else a for v, a in zip(job["values"], arrays)]
    op = plan_op(rec, metas, values, job["attrs"], algo=job["kernel"], num_outputs=job["num_outputs"])
    tensors = [None if a is None else as_tensor(a) for a in arrays]
    outs = None
    if not rec.dynamic_shape:
        outs = [as_tensor(np.empty(tuple(m.shape), m.dtype)) for m in op.ctx.outputs]
    ex = Executor(rec, op.ctx, op.selection, op.plan, op.workspace_size, tensors, outs, ())
    ex.run()
    current_stream().synchronize()
    os.makedirs(os.path.dirname(job["marker"]), exist_ok=True)
    with open(job["marker"], "w"):
        pass


def main(argv: list[str]) -> int:
    parent = int(argv[0])
    _die_with_parent(parent)
    try:
        os.nice(_NICE)
    except OSError:
        pass
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # the pipe carries results only
    while True:
        try:
            job = pickle.loads(pickle.load(stdin))
        except EOFError:
            return 0
        try:
            if "direct" in job:
                run_direct(job)
            else:
                run_job(job)
            result = (True, "")
        except Exception as exc:  # reported to the parent, which logs it
            what = ".".join(job["direct"]) if "direct" in job else f"{job['op']} kernel {job['kernel']}"
            result = (False, f"{what}: {type(exc).__name__}: {exc}")
        pickle.dump(result, stdout)
        stdout.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
