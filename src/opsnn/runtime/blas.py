"""The BLAS library's thread pool: bounded while pipeline stages run side by side, and
following the thread policy of :mod:`opsnn.runtime.threads`.

When several stages each call GEMM at once, a BLAS pool sized for the whole machine makes
them fight over the cores (OpenBLAS' waiting threads spin): on 2 cores two concurrent
ResNet-18 streams ran slower together than one alone, and scaled 2x with one BLAS thread each.
OpenBLAS' thread count is process-wide (its "local" setter is global in pthreads builds), so
:func:`blas_threads` sets it for the duration of a pipelined run and restores it after.
Libraries without a known setter (MKL, Accelerate) are left alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading

_SETTERS = (
    "openblas_set_num_threads",
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads_64_",
    "openblas_set_num_threads64_",
)
_GETTERS = (
    "openblas_get_num_threads",
    "scipy_openblas_get_num_threads64_",
    "scipy_openblas_get_num_threads_64_",
    "openblas_get_num_threads64_",
)
_CORE_NAMES = (
    "openblas_get_corename",
    "scipy_openblas_get_corename64_",
    "scipy_openblas_get_corename_64_",
    "openblas_get_corename64_",
)
_lock = threading.Lock()
_depth = 0
_saved: int | None = None
_api: tuple | None = None


def _find():
    """(setter, getter, core name or None) of the OpenBLAS that numpy loaded, or None."""
    global _api
    if _api is not None:
        return _api or None
    import numpy  # noqa: F401 - make sure numpy's BLAS is loaded before looking for it

    paths = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split()[-1] if len(line.split()) >= 6 else ""
                if "openblas" in p.lower() and p not in paths:
                    paths.append(p)
    except OSError:
        pass
    for p in paths:
        try:
            lib = ctypes.CDLL(p)
        except OSError:
            continue
        setter = next((getattr(lib, n) for n in _SETTERS if hasattr(lib, n)), None)
        getter = next((getattr(lib, n) for n in _GETTERS if hasattr(lib, n)), None)
        if setter is not None and getter is not None:
            setter.argtypes, setter.restype = [ctypes.c_int], None
            getter.argtypes, getter.restype = [], ctypes.c_int
            core = next((getattr(lib, n) for n in _CORE_NAMES if hasattr(lib, n)), None)
            if core is not None:
                core.argtypes, core.restype = [], ctypes.c_char_p
            _api = (setter, getter, core)
            return _api
    _api = ()
    return None


def get_blas_threads() -> int | None:
    """OpenBLAS' current thread count (None when the BLAS is not OpenBLAS)."""
    api = _find()
    return api[1]() if api else None


def core_name() -> str | None:
    """The kernels numpy's OpenBLAS runs ('Haswell', 'Zen', 'SkylakeX' ...: its build's name for
    the CPU, or the ``OPENBLAS_CORETYPE`` the ISA cap set); None when the BLAS is not OpenBLAS
    or does not say."""
    api = _find()
    if not api or api[2] is None:
        return None
    name = api[2]()
    return name.decode(errors="replace").strip() or None if name else None


@contextlib.contextmanager
def blas_threads(n: int | None):
    """Within the block, BLAS calls use at most ``n`` threads (``None``: unchanged). Nested and
    concurrent uses share one setting: the first to enter sets it, the last to leave restores."""
    global _depth, _saved
    api = _find() if n is not None else None
    if not api:
        yield
        return
    with _lock:
        if _depth == 0:
            _saved = api[1]()
            api[0](max(1, int(n)))
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved is not None:
                api[0](_saved)


_policy_cap: int | None = None  # OpenBLAS's own thread count when first seen (its env setting)
_policy_last: int | None = None


def follow_policy(n: int) -> None:
    """Set OpenBLAS to ``n`` threads (at most its own start-up count, e.g. OPENBLAS_NUM_THREADS)
    for :mod:`opsnn.runtime.threads`; does nothing while a :func:`blas_threads` block holds it."""
    global _policy_cap, _policy_last
    if n == _policy_last or _depth:
        return
    api = _find()
    if not api:
        _policy_last = n
        return
    with _lock:
        if _depth:
            return
        if _policy_cap is None:
            _policy_cap = api[1]()
        api[0](max(1, min(n, _policy_cap)))
        _policy_last = n
