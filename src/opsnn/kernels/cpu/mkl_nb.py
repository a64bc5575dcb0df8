"""MKL's SGEMM called from inside numba kernels, one GEMM per task of a parallel loop.

Why: a kernel whose tasks are small products with work between them (attention: scores, a
softmax, probabilities @ V per head; a convolution: im2col then a GEMM per band) otherwise
runs as a chain of parallel regions — MKL's batch or banded calls, each splitting a small
product over the threads, with numba's passes in between. Here every task runs its whole
chain on one thread, its data in that core's cache, MKL single-threaded inside it
(``MKL_Set_Num_Threads_Local(1)`` for the task, restored after), the tasks spread over
numba's threads: one parallel region.

The functions are called through their addresses, passed to the kernel as arguments
(:func:`addresses`), so that kernels stay cacheable (``cache=True``: a ctypes function
object would bake a process-specific address into the cached code).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from . import libraries
from . import mkl as _mkl

#: CBLAS constants (row-major; no transpose / transpose; an operand packed by cblas_sgemm_pack)
ROW_MAJOR, NO_TRANS, TRANS, PACKED = 101, 111, 112, 151


def _as_i32(builder, val, ty):
    if isinstance(ty, types.Integer):
        return (
            builder.trunc(val, ir.IntType(32))
            if ty.bitwidth > 32
            else (builder.sext(val, ir.IntType(32)) if ty.bitwidth < 32 else val)
        )
    if isinstance(ty, types.Boolean):
        return builder.zext(val, ir.IntType(32))
    raise TypeError(f"an int argument, got {ty}")


def _as_f32(builder, val, ty):
    if ty == types.float32:
        return val
    if ty == types.float64:
        return builder.fptrunc(val, ir.FloatType())
    raise TypeError(f"a float argument, got {ty}")


def _as_ptr(builder, val, ty):
    if not isinstance(ty, types.Integer):
        raise TypeError(f"an address (integer) argument, got {ty}")
    return builder.inttoptr(val, ir.IntType(8).as_pointer())


_I32, _F32 = ir.IntType(32), ir.FloatType()
_CONVERT = {"i": _as_i32, "p": _as_ptr, "f": _as_f32}


def _call_c(builder, args, tys, spec) -> None:
    """Call the void C function at address ``args[0]``: ``spec`` lists its arguments, each a
    letter taking the intrinsic's next argument (``i`` int32, ``p`` pointer, ``f`` float32) or
    an ``ir.Constant``."""
    vals, j = [], 1
    for item in spec:
        if isinstance(item, str):
            vals.append(_CONVERT[item](builder, args[j], tys[j]))
            j += 1
        else:
            vals.append(item)
    fnty = ir.FunctionType(ir.VoidType(), [v.type for v in vals])
    builder.call(builder.inttoptr(args[0], fnty.as_pointer()), vals)


def _constant(kind, value):
    return ir.Constant(_I32 if kind == "i" else _F32, value)


@intrinsic
def sgemm(typingctx, fn, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc):
    """``C = op(A) @ op(B) + beta * C`` (row-major, float32; ``a``, ``b``, ``c`` addresses, e.g.
    ``arr.ctypes.data``) through ``cblas_sgemm`` at address ``fn``."""
    spec = [_constant("i", ROW_MAJOR), *"iiiii", _constant("f", 1.0), *"pipifpi"]

    def codegen(context, builder, signature, args):
        _call_c(builder, args, signature.args, spec)
        return context.get_dummy_value()

    return types.void(fn, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc), codegen


@intrinsic
def sgemm_packed(typingctx, fn, m, n, k, a, lda, b, ldb, beta, c, ldc):
    """``C = A @ B + beta * C`` (row-major float32 ``A`` (m, k); ``b`` the address of B (k, n)
    packed by ``cblas_sgemm_pack``, :func:`opsnn.kernels.cpu.mkl.pack`) through
    ``cblas_sgemm_compute`` at address ``fn`` (``addresses()[3]``), on the calling thread's
    MKL thread count."""
    spec = [*(_constant("i", v) for v in (ROW_MAJOR, NO_TRANS, PACKED)), *"iiipipifpi"]

    def codegen(context, builder, signature, args):
        _call_c(builder, args, signature.args, spec)
        return context.get_dummy_value()

    return types.void(fn, m, n, k, a, lda, b, ldb, beta, c, ldc), codegen


@intrinsic
def sgemv(typingctx, fn, m, n, a, lda, x, beta, y):
    """``y = A @ x + beta * y`` for a row-major float32 ``A`` (m, n) with leading dimension
    ``lda`` and unit-stride vectors (addresses as in :func:`sgemm`) through ``cblas_sgemv`` at
    address ``fn``."""
    one = _constant("i", 1)
    spec = [_constant("i", ROW_MAJOR), _constant("i", NO_TRANS), *"ii", _constant("f", 1.0), *"pip", one, "f", "p", one]

    def codegen(context, builder, signature, args):
        _call_c(builder, args, signature.args, spec)
        return context.get_dummy_value()

    return types.void(fn, m, n, a, lda, x, beta, y), codegen


@intrinsic
def set_threads_local(typingctx, fn, nthreads):
    """``MKL_Set_Num_Threads_Local(nthreads)`` at address ``fn``: the calling thread's MKL
    thread count (0: back to the global setting); returns the previous one."""
    sig = types.int32(fn, nthreads)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(i32, [i32])
        return builder.call(
            builder.inttoptr(args[0], fnty.as_pointer()), [_as_i32(builder, args[1], signature.args[1])]
        )

    return sig, codegen


_ADDRESSES: list = []


def addresses() -> np.ndarray | None:
    """int64 ``[cblas_sgemm, MKL_Set_Num_Threads_Local, cblas_sgemv, cblas_sgemm_compute]`` for the kernels, or None
    without MKL. The ``cblas_sgemv`` entry is 0 where the strategy keeps one-row products off MKL
    (:func:`opsnn.kernels.cpu.libraries.mkl_gemv_in_tasks`: non-Intel CPUs), and callers use opsnn's own
    kernel for products of a few rows (:func:`opsnn.kernels.cpu.gemm.gemm_rows`) instead, faster
    there than MKL's single-threaded gemv (docs/kernel-libraries.md)."""
    if _ADDRESSES:
        return _ADDRESSES[0]
    if _mkl.unavailable() is not None:
        return None
    import ctypes

    lib = _mkl._lib
    _ADDRESSES.append(
        np.array(
            [
                ctypes.cast(lib.sgemm, ctypes.c_void_p).value,
                ctypes.cast(lib.set_threads_local, ctypes.c_void_p).value,
                ctypes.cast(lib.gemv, ctypes.c_void_p).value if libraries.mkl_gemv_in_tasks() else 0,
                ctypes.cast(lib.compute, ctypes.c_void_p).value,
            ],
            np.int64,
        )
    )
    return _ADDRESSES[0]


__all__ = ["NO_TRANS", "PACKED", "TRANS", "addresses", "set_threads_local", "sgemm", "sgemm_packed", "sgemv"]
