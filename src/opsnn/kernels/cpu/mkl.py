"""Intel MKL's packed SGEMM through ctypes: constant weights packed once at prepare, then each
call multiplies the activations by the packed panel.

Why: with few activation rows (BERT's 128 tokens, a decode batch) OpenBLAS spends a large part
of every call packing the weight matrix into its panel layout again — each weight element is
read for only M multiply-adds. onnxruntime's MLAS packs constant weights once at session
creation; MKL exposes the same through ``cblas_sgemm_pack`` / ``cblas_sgemm_compute`` (the
figures: docs/kernel-libraries.md).

MKL is an optional dependency (PyPI ``mkl``, x86-64): when it is not installed, or
``OPSNN_MKL=0``, :func:`unavailable` says why and the BLAS kernels through numpy run instead.
Which products run on it is decided by the kernel-library strategy
(:mod:`opsnn.kernels.cpu.libraries`); this module only runs them (:func:`matmul`,
:func:`try_gemm2d`, :func:`gemm`: packed or not).
MKL runs its GNU OpenMP threading layer, i.e. the same libgomp thread pool numba's ``omp``
layer uses (``OMP_WAIT_POLICY=PASSIVE`` applies to both, see :mod:`opsnn._blas_env`), so
the two never spin against each other; without libgomp it runs sequentially. The thread
count per call follows the one OpenBLAS is set to (opsnn's thread policy and pipelined
stages' BLAS limits, :mod:`opsnn.runtime.blas`).
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading
from typing import NamedTuple

import numba
import numpy as np

from ...runtime import cpu
from . import libraries

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_A_MATRIX, _B_MATRIX, _PACKED = 161, 162, 151
_LAYER_SEQUENTIAL, _LAYER_GNU = 1, 3

_lock = threading.Lock()
_lib = None  # the loaded functions (a namespace), once loaded
_why: str | None = None  # why MKL is not used, once looked for
_looked = False


class _Api(NamedTuple):
    pack_size: object
    pack: object
    compute: object
    set_threads_local: object
    batch: object
    gemv: object
    sgemm: object
    bf16: object  # cblas_gemm_bf16bf16f32 (bf16 A and B, fp32 C), or None
    threading: str


def prefix_libraries(pattern: str, newest_first: bool = True) -> list[str]:
    """Shared objects matching ``pattern`` in <prefix>/lib of this Python (where pip wheels such as
    ``mkl`` and ``onednn-cpu-gomp`` put them): the venv's prefix, the base prefix, the executable's."""
    found = []
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(sys.executable)))):
        found += sorted(glob.glob(os.path.join(prefix, "lib", pattern)), reverse=newest_first)
    return found


def _candidates() -> list[str]:
    """libmkl_rt shared objects (the pip package puts them in <prefix>/lib)."""
    return prefix_libraries("libmkl_rt.so*")


def _load() -> None:
    global _looked
    with _lock:
        if _looked:
            return
        try:
            _open()
        finally:
            _looked = True  # last: a thread that sees it reads the finished _lib / _why


def _open() -> None:
    global _lib, _why
    if os.environ.get("OPSNN_MKL", "1").strip().lower() in ("0", "false", "no", "off"):
        _why = "disabled by OPSNN_MKL=0"
        return
    paths = _candidates()
    if not paths:
        _why = "Intel MKL is not installed (pip install mkl, x86-64 only)"
        return
    cpu.library_loaded("MKL")  # MKL_ENABLE_INSTRUCTIONS follows the ISA cap
    try:
        lib = ctypes.CDLL(paths[0])
    except OSError as e:
        _why = f"Intel MKL could not be loaded from {paths[0]}: {e}"
        return
    # The GNU layer needs libgomp; MKL exits the process when it cannot load a layer, so
    # check first and fall back to sequential MKL without it.
    try:
        ctypes.CDLL("libgomp.so.1")
        layer, name = _LAYER_GNU, "gnu-openmp"
    except OSError:
        layer, name = _LAYER_SEQUENTIAL, "sequential"
    lib.MKL_Set_Threading_Layer.argtypes = [ctypes.c_int]
    lib.MKL_Set_Threading_Layer.restype = ctypes.c_int
    lib.MKL_Set_Threading_Layer(layer)
    lib.MKL_Set_Interface_Layer.argtypes = [ctypes.c_int]
    lib.MKL_Set_Interface_Layer(0)  # LP64: 32-bit integer arguments, whatever MKL_INTERFACE_LAYER says
    c = ctypes
    size = lib.cblas_sgemm_pack_get_size
    size.argtypes, size.restype = [c.c_int, c.c_int, c.c_int, c.c_int], c.c_size_t
    pack = lib.cblas_sgemm_pack
    pack.argtypes = [
        c.c_int,
        c.c_int,
        c.c_int,
        c.c_int,
        c.c_int,
        c.c_int,
        c.c_float,
        c.c_void_p,
        c.c_int,
        c.c_void_p,
    ]
    pack.restype = None
    compute = lib.cblas_sgemm_compute
    compute.argtypes = [
        c.c_int,
        c.c_int,
        c.c_int,
        c.c_int,
        c.c_int,
        c.c_int,
        c.c_void_p,
        c.c_int,
        c.c_void_p,
        c.c_int,
        c.c_float,
        c.c_void_p,
        c.c_int,
    ]
    compute.restype = None
    local = lib.MKL_Set_Num_Threads_Local
    local.argtypes, local.restype = [c.c_int], c.c_int
    batch = lib.cblas_sgemm_batch
    batch.argtypes = [c.c_int] + [c.c_void_p] * 13 + [c.c_int, c.c_void_p]
    batch.restype = None
    gemv = lib.cblas_sgemv
    gemv.argtypes = [
        c.c_int,
        c.c_int,
        c.c_int,
        c.c_int,
        c.c_float,
        c.c_void_p,
        c.c_int,
        c.c_void_p,
        c.c_int,
        c.c_float,
        c.c_void_p,
        c.c_int,
    ]
    gemv.restype = None
    sgemm = lib.cblas_sgemm
    sgemm.argtypes = [
        c.c_int,
        c.c_int,
        c.c_int,
        c.c_int,
        c.c_int,
        c.c_int,
        c.c_float,
        c.c_void_p,
        c.c_int,
        c.c_void_p,
        c.c_int,
        c.c_float,
        c.c_void_p,
        c.c_int,
    ]
    sgemm.restype = None
    bf16 = None
    if hasattr(lib, "cblas_gemm_bf16bf16f32"):
        bf16 = lib.cblas_gemm_bf16bf16f32  # same arguments as cblas_sgemm, bf16 A and B
        bf16.argtypes = sgemm.argtypes
        bf16.restype = None
    _lib = _Api(size, pack, compute, local, batch, gemv, sgemm, bf16, name)


def unavailable() -> str | None:
    """None when MKL's packed GEMM can be used, else the reason it cannot."""
    if not _looked:
        _load()
    return _why


def threading_layer() -> str | None:
    """'gnu-openmp' or 'sequential' once MKL is loaded; None without MKL."""
    return _lib.threading if unavailable() is None else None


class PackedWeight(NamedTuple):
    """A constant right operand W (K, N) packed by MKL for products with ``m``-row left operands.

    ``buf`` owns the packed panel (MKL's own layout, 64-byte aligned); ``w`` keeps the source
    weight alive for describe/explain; ``k``/``n`` the product's inner and output sizes."""

    buf: np.ndarray
    addr: int
    m: int
    k: int
    n: int

    def describe(self) -> str:
        return (
            f"weight ({self.k}x{self.n}) packed by MKL at prepare for {self.m}-row products ({self.buf.nbytes} bytes)"
        )


def _api() -> _Api:
    if unavailable() is not None:
        raise RuntimeError(f"MKL GEMM: {_why}")
    return _lib


def pack(w: np.ndarray, m: int, transpose: bool) -> PackedWeight:
    """Pack B = ``w`` (K, N), or ``w.T`` when ``transpose`` (``w`` is then (N, K), a Linear
    weight), for ``(m, K) @ B`` products. ``w`` is converted to contiguous float32 first."""
    _api()
    w = np.ascontiguousarray(w, dtype=np.float32)
    n, k = (w.shape[0], w.shape[1]) if transpose else (w.shape[1], w.shape[0])
    m = max(int(m), 1)
    nbytes = int(_lib.pack_size(_B_MATRIX, m, n, k))
    raw = np.empty(nbytes + 64, np.uint8)
    shift = (-raw.ctypes.data) % 64
    buf = raw[shift : shift + nbytes]
    _lib.pack(
        _ROW_MAJOR,
        _B_MATRIX,
        _TRANS if transpose else _NO_TRANS,
        m,
        n,
        k,
        1.0,
        w.ctypes.data,
        w.shape[1],
        buf.ctypes.data,
    )
    buf.setflags(write=False)
    return PackedWeight(buf, buf.ctypes.data, m, k, n)


def pack_left(w: np.ndarray, n: int) -> PackedWeight:
    """Pack A = ``w`` (M, K) for ``A @ (K, n)`` products (a 1x1 convolution's weight times an
    image's (C, H*W) pixels); ``w`` is converted to contiguous float32 first."""
    lib = _api()
    w = np.ascontiguousarray(w, dtype=np.float32)
    m, k = w.shape
    n = max(int(n), 1)
    nbytes = int(lib.pack_size(_A_MATRIX, m, n, k))
    raw = np.empty(nbytes + 64, np.uint8)
    shift = (-raw.ctypes.data) % 64
    buf = raw[shift : shift + nbytes]
    lib.pack(_ROW_MAJOR, _A_MATRIX, _NO_TRANS, m, n, k, 1.0, w.ctypes.data, k, buf.ctypes.data)
    buf.setflags(write=False)
    return PackedWeight(buf, buf.ctypes.data, m, k, n)


def gemm_left(p: PackedWeight, b: np.ndarray, out: np.ndarray) -> None:
    """``out = A @ b`` with A packed by :func:`pack_left`; ``b`` (K, N) and ``out`` (M, N) are
    float32 with unit column stride (a band of an image's columns: row stride >= N); N may
    differ from the packed ``n``."""
    n = b.shape[1]
    if n == 0 or p.m == 0:
        return
    ldb = b.strides[0] // 4 if p.k > 1 else n
    ldc = out.strides[0] // 4 if p.m > 1 else n
    _lib.set_threads_local(threads())
    _lib.compute(
        _ROW_MAJOR,
        _PACKED,
        _NO_TRANS,
        p.m,
        n,
        p.k,
        p.addr,
        p.k,
        b.ctypes.data,
        max(ldb, n),
        0.0,
        out.ctypes.data,
        max(ldc, n),
    )


def bf16_unavailable() -> str | None:
    """None when MKL's bfloat16 GEMM (``cblas_gemm_bf16bf16f32``: bf16 operands, fp32
    accumulation and result; AMX / AVX512-BF16 where the CPU has them) can be used."""
    why = unavailable()
    if why is not None:
        return why
    if _lib.bf16 is None:
        return "this MKL has no cblas_gemm_bf16bf16f32 (MKL >= 2021 needed)"
    return None


def gemm2d_bf16(a: np.ndarray, b: np.ndarray, out: np.ndarray, alpha: float = 1.0, beta: float = 0.0) -> None:
    """``out = alpha * a @ b + beta * out`` in float32 for bfloat16 operands (uint16 views of the bits, row-major
    or transposed views as they stand; ``out`` row-major float32) in one ``cblas_gemm_bf16bf16f32``
    call. The weights are read as they are, not packed: packing bought little on ResNet-50's
    shapes and MKL's bf16 panels would undo the halved weight memory (docs/kernel-libraries.md)."""
    why = bf16_unavailable()  # also loads MKL when nothing has yet
    if why is not None:
        raise RuntimeError(f"MKL bf16 GEMM: {why}")
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return
    if k == 0:  # as BLAS: with beta 0 ``out`` is not read (NaN there does not survive)
        if beta == 0:
            out[...] = 0
        else:
            out *= beta
        return
    la, lb = _operand(a, 2), _operand(b, 2)
    lc = _operand(out)
    if la is None or lb is None or lc is None or lc[0] != _NO_TRANS:
        raise ValueError("gemm2d_bf16: operands must be row-major or transposed views (unit stride along a side)")
    _lib.set_threads_local(threads())
    _lib.bf16(
        _ROW_MAJOR,
        la[0],
        lb[0],
        m,
        n,
        k,
        alpha,
        a.ctypes.data,
        la[1],
        b.ctypes.data,
        lb[1],
        beta,
        out.ctypes.data,
        lc[1],
    )


_blas_threads = None  # opsnn.runtime.blas.get_blas_threads, imported on the first call (runtime imports us)


def threads() -> int:
    """The thread count for a BLAS or oneDNN call: OpenBLAS' setting (which ``opsnn.set_num_threads``
    and ``blas_threads`` move), else numba's. Called before every such call: kept cheap."""
    global _blas_threads
    if _blas_threads is None:
        from ...runtime.blas import get_blas_threads as _blas_threads
    n = _blas_threads()
    if n is None:
        n = numba.get_numthreads()
    return max(1, n)


def gemm(a: np.ndarray, p: PackedWeight, out: np.ndarray, accumulate: bool = False) -> None:
    """``out = a @ W`` (``out += a @ W`` when ``accumulate``) for C-contiguous float32 ``a``
    (M, K) and ``out`` (M, N); M may differ from the packed ``m`` (the panel's layout does not
    depend on it; ``m`` only sized MKL's choice of blocking)."""
    m = a.shape[0]
    if m == 0:
        return
    _lib.set_threads_local(threads())
    _lib.compute(
        _ROW_MAJOR,
        _NO_TRANS,
        _PACKED,
        m,
        p.n,
        p.k,
        a.ctypes.data,
        p.k,
        p.addr,
        p.n,
        1.0 if accumulate else 0.0,
        out.ctypes.data,
        p.n,
    )


def gemv(w: np.ndarray, x: np.ndarray, out: np.ndarray, accumulate: bool = False) -> None:
    """``out = w @ x`` (``out += w @ x`` when ``accumulate``) for a C-contiguous float32 matrix
    ``w`` (N, K) and float32 vectors ``x`` (K elements) and ``out`` (N), each contiguous (a
    Linear layer's product for one row)."""
    n, k = w.shape
    if n == 0:
        return
    lib = _api()  # also loads MKL when nothing has yet
    lib.set_threads_local(threads())
    lib.gemv(
        _ROW_MAJOR,
        _NO_TRANS,
        n,
        k,
        1.0,
        w.ctypes.data,
        k,
        x.ctypes.data,
        1,
        1.0 if accumulate else 0.0,
        out.ctypes.data,
        1,
    )


def _matrices(x: np.ndarray) -> tuple[np.ndarray, int]:
    """Addresses of the matrices x[..., :, :] (row-major, unit column stride) and their
    leading dimension in elements."""
    lead = x.shape[:-2]
    addr = np.full(lead, x.ctypes.data, np.int64)
    for d, st in enumerate(x.strides[:-2]):
        shape = [1] * len(lead)
        shape[d] = lead[d]
        addr += np.arange(lead[d], dtype=np.int64).reshape(shape) * st
    rows, cols = x.shape[-2:]
    ld = x.strides[-2] // x.itemsize if rows > 1 else cols
    return addr.ravel(), max(ld, cols, 1)


def matmul_batched(a: np.ndarray, b: np.ndarray, c: np.ndarray, trans_b: bool = False, trans_a: bool = False) -> None:
    """``c[i] = a[i] @ b[i]`` (``b[i].T`` when ``trans_b``, ``a[i].T`` when ``trans_a``) over equal
    leading dims in one ``cblas_sgemm_batch`` call: MKL spreads the small products over its threads
    (numpy's matmul issues one BLAS call per matrix, each waking the BLAS pool). Every operand is a
    float32 view whose matrices, as stored, have unit column stride (head-strided views qualify)."""
    m, k = a.shape[-2:][::-1] if trans_a else a.shape[-2:]
    n = b.shape[-2] if trans_b else b.shape[-1]
    count = int(np.prod(a.shape[:-2]))
    if count == 0 or m == 0 or n == 0:
        return
    if k == 0:
        c[...] = 0
        return
    pa, lda = _matrices(a)
    pb, ldb = _matrices(b)
    pc, ldc = _matrices(c)
    i32 = np.int32
    args = [
        np.array([_TRANS if trans_a else _NO_TRANS], i32),
        np.array([_TRANS if trans_b else _NO_TRANS], i32),
        np.array([m], i32),
        np.array([n], i32),
        np.array([k], i32),
        np.array([1.0], np.float32),
        pa,
        np.array([lda], i32),
        pb,
        np.array([ldb], i32),
        np.array([0.0], np.float32),
        pc,
        np.array([ldc], i32),
    ]
    size = np.array([count], i32)
    lib = _api()
    lib.set_threads_local(threads())
    lib.batch(_ROW_MAJOR, *[x.ctypes.data for x in args], 1, size.ctypes.data)


def try_batched(a: np.ndarray, b: np.ndarray, c: np.ndarray, trans_a: bool, trans_b: bool) -> bool:
    """``c[i] = op(a[i]) @ op(b[i])`` (``op`` transposes where ``trans_a`` / ``trans_b``: the operand
    is stored (K, M) / (N, K) and read so, no copy) in one ``cblas_sgemm_batch`` call, batch dims of
    ``a`` and ``b`` broadcast to ``c``'s; True when done. False (nothing done) when MKL is not
    available or a view is not a row-major BLAS operand as stored."""
    if (_lib is None and unavailable() is not None) or _why is not None or c.ndim < 3 or 0 in c.strides[:-2]:
        return False
    lead = c.shape[:-2]
    a = np.broadcast_to(a, lead + a.shape[-2:])
    b = np.broadcast_to(b, lead + b.shape[-2:])
    if not (_blas_view(a) and _blas_view(b) and _blas_view(c)):
        return False
    matmul_batched(a, b, c, trans_b=trans_b, trans_a=trans_a)
    return True


def _blas_view(x: np.ndarray) -> bool:
    """True when every x[..., :, :] is a row-major BLAS operand as it stands: float32, unit column
    stride, a row stride of at least a row (or a single row), non-negative batch strides."""
    if x.dtype != np.float32 or x.ndim < 2:
        return False
    isz = x.itemsize
    rows, cols = x.shape[-2:]
    rs, cs = x.strides[-2:]
    return (
        (cols <= 1 or cs == isz)
        and (rows <= 1 or (rs % isz == 0 and rs >= cols * isz))
        and all(st >= 0 and st % isz == 0 for st in x.strides[:-2])
    )


def _operand(x: np.ndarray, isz: int = 4):
    """``(trans, ld)`` for a 2-D view (``isz``-byte elements) BLAS reads as it stands — row-major
    (unit column stride) or a transposed row-major matrix (unit row stride, e.g. ``w.T``) — else
    None."""
    r, c = x.shape
    rs, cs = x.strides
    if (c <= 1 or cs == isz) and (r <= 1 or (rs % isz == 0 and rs >= c * isz)):
        return _NO_TRANS, max(rs // isz if r > 1 else c, c, 1)
    if (r <= 1 or rs == isz) and (c <= 1 or (cs % isz == 0 and cs >= r * isz)):
        return _TRANS, max(cs // isz if c > 1 else r, r, 1)
    return None


def _step(x: np.ndarray) -> int:
    """The element stride of a 1-D float32 view (0 when BLAS cannot take it: negative, zero or
    not a whole number of elements)."""
    st = x.strides[0] if x.shape[0] > 1 else 4
    return st // 4 if st > 0 and st % 4 == 0 else 0


def try_gemm2d(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
    """``out = a @ b`` for 2-D float32 views in one MKL call (``cblas_sgemv`` when a side is a
    single row or column, else ``cblas_sgemm``), transposed views read in place; True when done.
    False (nothing done: the caller runs the product itself) when MKL is not available or a view
    is not a BLAS operand as it stands."""
    if (
        (_lib is None and unavailable() is not None)
        or _why is not None
        or a.dtype != np.float32
        or b.dtype != np.float32
        or out.dtype != np.float32
    ):
        return False
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return True
    if k == 0:
        out[...] = 0
        return True
    if m == 1 or n == 1:
        # one row: out = b^T a[0]; one column: out = a b[:, 0]
        mat, vec, res, t_row = (b, a[0], out[0], _TRANS) if m == 1 else (a, b[:, 0], out[:, 0], _NO_TRANS)
        lay = _operand(mat)
        inc_x, inc_y = _step(vec), _step(res)
        if lay is None or not inc_x or not inc_y:
            return False
        trans, ld = lay
        if trans == _TRANS:  # stored as mat.T row-major: the product transposes the other way
            t_row = _NO_TRANS if t_row == _TRANS else _TRANS
        rows, cols = mat.shape if trans == _NO_TRANS else mat.shape[::-1]  # as stored
        _lib.set_threads_local(threads())
        _lib.gemv(
            _ROW_MAJOR, t_row, rows, cols, 1.0, mat.ctypes.data, ld, vec.ctypes.data, inc_x, 0.0, res.ctypes.data, inc_y
        )
        return True
    la, lb, lc = _operand(a), _operand(b), _operand(out)
    if la is None or lb is None or lc is None or lc[0] != _NO_TRANS:
        return False
    _lib.set_threads_local(threads())
    _lib.sgemm(
        _ROW_MAJOR, la[0], lb[0], m, n, k, 1.0, a.ctypes.data, la[1], b.ctypes.data, lb[1], 0.0, out.ctypes.data, lc[1]
    )
    return True


def _batch_of_small(a: np.ndarray, b: np.ndarray) -> bool:
    """A batch of mid-sized products, which MKL's ``cblas_sgemm_batch`` spreads over its threads
    faster than numpy's per-matrix OpenBLAS calls even where MKL's single large products are
    slower; tiny and large ones go to numpy (docs/kernel-libraries.md)."""
    if a.ndim < 3 and b.ndim < 3:
        return False
    m, k = a.shape[-2:]
    n = b.shape[-1]
    return libraries.mkl_batch(m, k, n) and _blas_view(a) and _blas_view(b)


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``np.matmul(a, b, out=out)`` for operands of rank >= 2 with broadcast leading dims, on MKL
    when it is available and the operands are float32 BLAS views: 2-D products in one
    :func:`try_gemm2d` call (transposed views too), batches in one ``cblas_sgemm_batch`` call
    (row-major matrices, ``out`` without broadcast dims); else numpy's matmul (OpenBLAS). 2-D
    products with one row or one column go to OpenBLAS' gemv where
    :func:`opsnn.kernels.cpu.libraries.openblas_gemv` says (the strategy decides the library).

    Keeping every float32 product on MKL keeps OpenBLAS' worker threads asleep: after a GEMM
    they spin for ~0.1 s unless ``OPENBLAS_THREAD_TIMEOUT`` was set before numpy loaded
    (:mod:`opsnn._blas_env`), taking a core from the next layers' kernels."""
    if libraries.gemm_library() == "openblas" and a.ndim >= 2 and b.ndim >= 2 and not _batch_of_small(a, b):
        np.matmul(a, b, out=out)
        return
    if a.ndim == 2 and b.ndim == 2 and out.ndim == 2:
        if (a.shape[0] == 1 or b.shape[1] == 1) and libraries.openblas_gemv():
            np.matmul(a, b, out=out)
            return
        if try_gemm2d(a, b, out):
            return
    if (
        (_lib is None and unavailable() is not None)
        or _why is not None
        or a.ndim < 2
        or b.ndim < 2
        or not (_blas_view(a) and _blas_view(b) and _blas_view(out))
        or 0 in out.strides[:-2]
    ):
        np.matmul(a, b, out=out)
        return
    lead = out.shape[:-2]
    if a.ndim == 2 and b.ndim == 2:
        a, b, out = a[None], b[None], out[None]
    else:
        a = np.broadcast_to(a, lead + a.shape[-2:])
        b = np.broadcast_to(b, lead + b.shape[-2:])
    matmul_batched(a, b, out)
