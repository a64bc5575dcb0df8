"""CPU kernels (numba + BLAS), one module per op family.

Importing this package sets two process-wide threading defaults before numba starts its first
parallel region (a value the user set wins; the measurements: docs/kernel-libraries.md):

``OMP_WAIT_POLICY=PASSIVE``: numba's OpenMP workers sleep when a parallel loop ends instead of
spinning, so they do not take the cores OpenBLAS's threads need when our kernels alternate numba
regions with GEMMs. libgomp reads it once, when numba loads it; no effect if another library
(e.g. torch) loaded libgomp first.

``GOMP_SPINCOUNT=10000`` (only when the user set neither variable): a bounded spin before sleeping,
so a GEMM -> epilogue -> GEMM chain on the shared libgomp pool (MKL's GNU OpenMP layer) does not
pay a wake-up per region.
"""
import os

if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "10000"
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
