"""The process set-up of the BLAS and OpenMP libraries: settings that only take effect before
the library is loaded (numpy loads OpenBLAS on import; numba and MKL load libgomp on first use).
The instruction-set cap for oneDNN, MKL and numba is set up next, by :mod:`opsnn.runtime.cpu`.

``OPENBLAS_THREAD_TIMEOUT=4``: OpenBLAS' worker threads stay awake spinning for 2^28 cycles
(~0.1 s) after each GEMM by default. Every opsnn kernel that follows a GEMM within that time
(the fused epilogue's activation, a Winograd output transform, the next layer's im2col) runs
its parallel region with one thread sharing a core with a spinning BLAS worker, so the region
takes about twice as long. With the timeout at its minimum (2^4 cycles) the workers go to sleep
at once; waking them costs a few tens of microseconds per GEMM, against GEMMs of 0.1-10 ms
(measured: docs/kernel-libraries.md).

``os.environ.setdefault``: a value the user set wins. OpenBLAS reads the variable once, when
it is loaded, so this works only when opsnn is imported before numpy (``opsnn`` command-line
tools, ``import opsnn`` first); :data:`effective` says whether it was in time.

``OMP_WAIT_POLICY=PASSIVE``: numba's OpenMP workers sleep when a parallel loop ends instead of
spinning, so they do not take the cores OpenBLAS's threads need when kernels alternate numba
regions with GEMMs (no effect if another library, e.g. torch, loaded libgomp first).
``GOMP_SPINCOUNT=10000`` (only when the user set neither variable): a bounded spin before
sleeping, so a GEMM -> epilogue -> GEMM chain on the libgomp pool MKL shares does not pay a
wake-up per region.
"""

from __future__ import annotations

import os
import sys

THREAD_TIMEOUT = "4"

#: None until :func:`configure` ran; then True when OpenBLAS will see the timeout (numpy was
#: not loaded yet, or the user had set the variable before starting Python)
effective: bool | None = None


def configure() -> None:
    global effective
    if effective is not None:
        return
    user_set = "OPENBLAS_THREAD_TIMEOUT" in os.environ
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", THREAD_TIMEOUT)
    effective = user_set or "numpy" not in sys.modules
    if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = "10000"
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
