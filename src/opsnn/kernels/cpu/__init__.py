"""CPU kernels (numba + BLAS), one module per op family.

The libraries they call are set up for the process by :mod:`opsnn._blas_env` (OpenBLAS and
OpenMP threading) and :mod:`opsnn.runtime.cpu` (the instruction-set cap), both before numba or a
BLAS is loaded; which library runs which product is decided by :mod:`.libraries`.
"""
