"""The kernel-library strategy: the one place that decides which library (OpenBLAS, MKL, oneDNN
or opsnn's own kernels) runs a product, from its shape, dtype, whether the weight is constant,
the CPU (vendor, instruction sets under the ``OPSNN_CPU_ISA`` cap) and the user's overrides
(``OPSNN_GEMM``, ``OPSNN_MKL``, ``OPSNN_ONEDNN``).

Like ONNX Runtime's MLAS platform object, the facts about this machine are gathered in one
:class:`Platform` (:func:`platform`: each library module says whether it can run, e.g.
:func:`opsnn.kernels.cpu.onednn.matmul_unavailable`); like TVM's x86 strategy, the choices are
rules in priority order over those facts (:func:`projection`, :func:`packed_panel_rejection`,
:func:`gemm_library` ...), each returning the library, the kernel and the reason. Callers read
these at prepare time; ``docs/kernel-libraries.md`` has the table for users and the measurements
behind the thresholds.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import numpy as np

from ... import dtypes as _dt
from ...runtime import cpu


class Platform(NamedTuple):
    """What this machine offers, each library's "why not" (None: usable)."""

    isa: str | None
    gemm_library: str  # 'mkl' or 'openblas': the threaded float32 GEMM library
    mkl: str | None  # MKL's packed SGEMM
    mkl_bf16: str | None  # MKL's cblas_gemm_bf16bf16f32
    onednn_matmul: str | None  # oneDNN's float32 matmul is its brgemm code
    onednn_bf16: str | None  # oneDNN's bf16 matmul is native (brgemm with AVX512-BF16)
    onednn: str | None = None  # oneDNN itself (its convolutions, and its batched matmul at any level)
    onednn_block: int | None = None  # the channel block of oneDNN's JIT code: 16 (AVX-512), 8 (AVX2)
    vendor: str | None = None  # the CPU's vendor string ("GenuineIntel", "AuthenticAMD")

    @classmethod
    def for_isa(cls, level: str, vendor: str, mkl: bool = True, onednn: bool = True) -> Platform:
        """The platform a ``level`` CPU of ``vendor`` with MKL / oneDNN installed presents (oneDNN's
        matmul has brgemm code from AVX-512 on, native bf16 from AVX512-BF16 on): what the
        decision tables are pinned against."""
        rank = cpu.LEVELS.index(level)
        no_dnn = None if onednn else "oneDNN is not installed"
        return cls(
            level,
            "mkl" if vendor == "GenuineIntel" and mkl else "openblas",
            None if mkl else "MKL is not installed",
            None if mkl else "MKL is not installed",
            no_dnn or (None if rank >= cpu.LEVELS.index("avx512") else "gemm:jit:f32 only"),
            no_dnn or (None if rank >= cpu.LEVELS.index("avx512_bf16") else "no AVX512-BF16"),
            no_dnn,
            None if no_dnn or rank < cpu.LEVELS.index("avx2") else 16 if rank >= cpu.LEVELS.index("avx512") else 8,
            vendor,
        )


_vendor: list = []


def _cpu_vendor() -> str:
    """The CPU's vendor string, read once (platform() is asked at every prepare)."""
    if not _vendor:
        from ...runtime.device import cpu_vendor

        _vendor.append(cpu_vendor())
    return _vendor[0]


def platform() -> Platform:
    """This machine's :class:`Platform` (each fact cached by its library module)."""
    from . import mkl, onednn

    return Platform(
        cpu.isa(),
        gemm_library(),
        mkl.unavailable(),
        mkl.bf16_unavailable(),
        onednn.product_unavailable(np.float32),
        onednn.product_unavailable(_dt.bfloat16),
        onednn.unavailable(),
        onednn.block(),
        _cpu_vendor(),
    )


class Choice(NamedTuple):
    """A decision: the library that runs the work, the kernel (as the profiler names it) and why."""

    library: str
    kernel: str
    reason: str


# -- the threaded float32 GEMM library --------------------------------------------------------------------
_library: str | None = None
_library_why = ""


def gemm_library() -> str:
    """'mkl' or 'openblas': the library that runs the multi-threaded float32 products of
    :func:`opsnn.kernels.cpu.mkl.matmul` and that the packed-weight kernels are preferred for
    (``OPSNN_GEMM=mkl`` or ``openblas`` chooses; single-threaded products inside opsnn's own parallel
    regions, :mod:`.mkl_nb`, stay on MKL either way). Default: MKL on Intel CPUs; OpenBLAS on
    others when numpy's BLAS is OpenBLAS and its workers sleep after a call (:mod:`opsnn._blas_env`):
    MKL's threaded SGEMM is the slower one on AMD."""
    global _library, _library_why
    if _library is None:
        from . import mkl

        want = os.environ.get("OPSNN_GEMM", "").strip().lower()
        if want not in ("", "mkl", "openblas"):
            from ...errors import ParamInvalidError

            raise ParamInvalidError(f"OPSNN_GEMM={want!r}: expected 'mkl' or 'openblas' (or unset: chosen by CPU)")
        if mkl.unavailable() is not None:
            _library, _library_why = "openblas", "MKL not available"
        elif want:
            _library, _library_why = want, "OPSNN_GEMM"
        else:
            from ...runtime.device import cpu_vendor

            vendor = cpu_vendor()
            _library = "mkl" if vendor == "GenuineIntel" or not openblas_gemv() else "openblas"
            _library_why = f"chosen for this CPU ({vendor or 'vendor unknown'})"
    return _library


def gemm_library_why() -> str:
    """Why :func:`gemm_library` chose as it did (for ``opsnn info``)."""
    gemm_library()
    return _library_why


_gemv_openblas: bool | None = None


def openblas_gemv() -> bool:
    """True when one-row / one-column float32 products go to numpy's OpenBLAS ``sgemv``: numpy
    uses OpenBLAS and its workers sleep right after a call (:mod:`opsnn._blas_env`'s timeout was
    in time). MKL's ``cblas_sgemv`` runs on one thread whatever its thread setting."""
    global _gemv_openblas
    if _gemv_openblas is None:
        from ... import _blas_env
        from ...runtime import blas

        _gemv_openblas = bool(_blas_env.effective) and blas.get_blas_threads() is not None
    return _gemv_openblas


def mkl_gemv_in_tasks(p: Platform | None = None) -> bool:
    """Whether one-row products inside opsnn's parallel tasks (:mod:`opsnn.llm.fused`) call MKL's
    single-threaded ``cblas_sgemv`` (where MKL is the GEMM library), else opsnn's ``gemm_rows``."""
    return (p.gemm_library if p is not None else gemm_library()) == "mkl"


# -- constant-weight products ---------------------------------------------------------------------------
#: where OpenBLAS is the faster library, an (m, k) @ (k, n) product with a packed right operand still
#: stays on MKL's packed panel below these sizes (OpenBLAS' AVX-512 kernels, SkylakeX)
PACKED_MAX_ROWS_ELSEWHERE = 64
PACKED_MAX_MACS_ELSEWHERE = 1 << 27
#: ... and below these where AVX2 is the level in force (OpenBLAS' Haswell kernels, faster than MKL's
#: packed panel from 32 rows whatever the size; MKL runs the same code capped or not on AMD)
PACKED_MAX_ROWS_AVX2 = 32
PACKED_MAX_MACS_AVX2 = 0


def packed_limits(p: Platform | None = None) -> tuple[int, int]:
    """(rows, multiply-adds) below which a product keeps MKL's packed panel where OpenBLAS is the
    GEMM library, for the instruction-set level in force (OpenBLAS runs its kernels for that level)."""
    level = p.isa if p is not None else cpu.isa()
    if level == "avx2":
        return PACKED_MAX_ROWS_AVX2, PACKED_MAX_MACS_AVX2
    return PACKED_MAX_ROWS_ELSEWHERE, PACKED_MAX_MACS_ELSEWHERE


#: where MKL is not the GEMM library, products of up to this many rows run on opsnn's own few-row
#: kernels (``gemm_rows``, ``gemv_bf16``): the weight's bytes, not the arithmetic, set their time
SMALL_ROWS = 32
#: fewest rows of a float32 decoder projection that run on oneDNN's matmul; fewer stay on
#: ``gemm_rows``, which streams the weight as fast
ONEDNN_MIN_ROWS = 12


def packed_panel_rejection(m: int, k: int, n: int, p: Platform | None = None) -> str | None:
    """Why MKL's packed right operand should not be chosen for an (m, k) @ (k, n) product here
    (None: it should). The convolutions' left-packed weights stay on MKL either way."""
    lib = p.gemm_library if p is not None else gemm_library()
    rows, macs = packed_limits(p)
    if lib != "openblas" or m < rows or m * k * n < macs:
        return None
    return (
        f"MKL's SGEMM is slower than OpenBLAS on this CPU at {m} x {k} x {n} (see "
        "opsnn.kernels.cpu.libraries.gemm_library; OPSNN_GEMM=mkl overrides)"
    )


def own_rows_kernel(rows: int, p: Platform | None = None) -> bool:
    """True when a product of ``rows`` rows runs on opsnn's own few-row kernels (``gemm_rows``,
    ``gemv_bf16``) rather than MKL: at most ``SMALL_ROWS`` rows where MKL is not the GEMM library."""
    return rows <= SMALL_ROWS and (p.gemm_library if p is not None else gemm_library()) != "mkl"


def onednn_rows(rows: int, p: Platform | None = None) -> bool:
    """True when a float32 product of ``rows`` rows runs on oneDNN's matmul reading the weight in
    place: at least ``ONEDNN_MIN_ROWS`` rows, MKL not the GEMM library (on Intel CPUs its packed
    panels stay), and oneDNN's brgemm code available."""
    from . import onednn

    if p is None:
        return rows >= ONEDNN_MIN_ROWS and gemm_library() != "mkl" and onednn.matmul_unavailable() is None
    return rows >= ONEDNN_MIN_ROWS and p.gemm_library != "mkl" and p.onednn_matmul is None


def epilogue_product_rejection(dtype, p: Platform | None = None) -> str | None:
    """Why a product with a constant weight and an epilogue (FusedMatMul: bias, residual,
    activation) should not run on oneDNN's matmul with the epilogue as post-ops (None: it should).
    Where MKL is the GEMM library a float32 one stays on MKL's packed panel followed by one
    in-place epilogue pass, as the plain products do (docs/performance.md, Intel Ice Lake)."""
    lib = p.gemm_library if p is not None else gemm_library()
    if np.dtype(dtype) == _dt.float32 and lib == "mkl":
        return "MKL is the GEMM library: its packed panel, then one epilogue pass"
    return None


#: fewest rows for which a constant-weight float32 product packs its weight for opsnn's own AVX2 GEMM
PACKED_OWN_MIN_ROWS = 16


def own_packed_rejection(rows: int, dtype, p: Platform | None = None) -> str | None:
    """Why a float32 product of ``rows`` rows with a constant weight should not run on opsnn's packed
    GEMM (``gemm_packed``: the weight packed once at prepare), None where it should: on AVX2 CPUs whose
    GEMM library is OpenBLAS, which packs the weight on every call (oneDNN's matmul there is its
    ``gemm:jit``, which does too; AVX-512 CPUs have oneDNN's brgemm, MKL its packed panel)."""
    p = p if p is not None else platform()
    if np.dtype(dtype) != np.float32:
        return f"float32 only, not {_dt.name(dtype)}"
    if p.isa != "avx2":
        return f"an AVX2 kernel: the ISA in force is {p.isa} (oneDNN's brgemm matmul where AVX-512)"
    if p.gemm_library == "mkl":
        return "MKL is the GEMM library: its packed panel"
    if rows < PACKED_OWN_MIN_ROWS:
        return f"{rows} rows (< PACKED_OWN_MIN_ROWS = {PACKED_OWN_MIN_ROWS}): the row kernels"
    return None


def onednn_bf16_rows(rows: int, p: Platform | None = None) -> bool:
    """True when a bfloat16 product of ``rows`` rows runs on oneDNN's bf16 matmul (the weight read
    in place): two rows or more where MKL is not the GEMM library and oneDNN has native bf16
    brgemm code. One row stays on ``gemv_bf16``."""
    from . import onednn

    if p is None:
        return rows >= 2 and gemm_library() != "mkl" and onednn.product_unavailable(_dt.bfloat16) is None
    return rows >= 2 and p.gemm_library != "mkl" and p.onednn_bf16 is None


def runtime_bf16_product(p: Platform | None = None) -> str | None:
    """None when a bfloat16 product whose operands both arrive at run time (eager autocast
    products, the backward products of a bfloat16 forward) runs on oneDNN's native bf16 matmul
    reading them in place; else why not (they then run in float32 through the 16-bit adapter:
    without native bf16 dot products the widening is what a bf16 GEMM would do inside)."""
    p = p if p is not None else platform()
    return None if p.onednn_bf16 is None else f"oneDNN bf16: {p.onednn_bf16}"


#: fewest multiply-adds of a float32 product with both operands known at run time that runs on oneDNN's
#: matmul (:func:`runtime_f32_product`); below, a BLAS call's lower overhead wins (docs/kernel-libraries.md)
RUNTIME_F32_MIN_MACS = 1 << 19


def runtime_f32_product(
    rows: int, k: int, n: int, batch: int = 1, p: Platform | None = None, bias: bool = False
) -> str | None:
    """None when ``batch`` float32 (rows, k) @ (k, n) products whose operands both arrive at run time (the
    products of eager training and of a compiled training step's backward) runs on oneDNN's brgemm
    matmul reading them in place; else why not. Where OpenBLAS is the GEMM library and oneDNN's matmul
    is its brgemm code (AVX-512 on), it was 8-32% faster than OpenBLAS on every training product
    measured, and it runs on the OpenMP pool numba's kernels share; MKL, where it is the GEMM
    library, keeps the plain products (oneDNN took 0.97-1.11x MKL's time on them), but not those with a ``bias``
    vector (Linear's forward): oneDNN adds it in the product's epilogue, where MKL needs a second pass
    over the output (docs/kernel-libraries.md). One row stays a BLAS gemv."""
    p = p if p is not None else platform()
    if p.onednn_matmul is not None:
        return f"oneDNN's brgemm matmul is not used here ({p.onednn_matmul})"
    if p.gemm_library != "openblas" and not bias:
        return f"{p.gemm_library.upper()} is the GEMM library on this CPU"
    return _runtime_f32_size(rows, k, n, batch)


def _runtime_f32_size(rows: int, k: int, n: int, batch: int) -> str | None:
    """Why ``batch`` (rows, k) @ (k, n) float32 products are too small for oneDNN's matmul, or None."""
    if rows < 2 or n < 2:
        return "a matrix-vector product: BLAS gemv"
    macs = batch * rows * k * n
    if macs < RUNTIME_F32_MIN_MACS:
        return f"{macs} multiply-adds: under {RUNTIME_F32_MIN_MACS}, BLAS's smaller call overhead wins"
    return None


def attention_grad_products(rows: int, k: int, n: int, batch: int = 1, p: Platform | None = None) -> str | None:
    """None when attention's backward runs as whole-matrix batched products on oneDNN's brgemm matmul
    (``batch`` (batch, KV head) score matrices of ``rows`` x ``n``, the smallest product's depth ``k``;
    attention_grad_batched); else why not. Unlike :func:`runtime_f32_product` this holds where MKL is
    the GEMM library too: the alternative there is not MKL's threaded GEMM but the flash backward's
    tiles, five single-threaded MKL products each with the probabilities recomputed per tile, which
    the five batched products beat on every shape measured (docs/performance.md)."""
    p = p if p is not None else platform()
    if p.onednn_matmul is not None:
        return f"oneDNN's brgemm matmul is not used here ({p.onednn_matmul})"
    return _runtime_f32_size(rows, k, n, batch)


def projection(rows: int, k: int, n: int, dtype, p: Platform | None = None, contiguous: bool = True) -> Choice:
    """How the LLM decoder multiplies ``rows`` rows by a constant (n, k) weight in ``dtype``
    (``contiguous``: the activations and output are C-contiguous, as oneDNN's in-place matmul
    needs); the rules in priority order."""
    p = p if p is not None else platform()
    if np.dtype(dtype) == _dt.bfloat16:
        if p.mkl_bf16 is not None:
            return Choice("opsnn", "Linear", f"the Linear op, weights widened per call ({p.mkl_bf16})")
        if rows == 1 and own_rows_kernel(1, p):
            return Choice("opsnn", "llm_linear_bf16_gemv", "one row, MKL not the GEMM library: opsnn's bf16 gemv")
        if onednn_bf16_rows(rows, p) and contiguous:
            return Choice("onednn", "llm_linear_onednn_bf16", "oneDNN's native bf16 matmul")
        return Choice("mkl", "llm_linear_mkl_bf16", "MKL's bf16 GEMM")
    if p.mkl is not None:
        return Choice("opsnn", "Linear", f"the Linear op ({p.mkl})")
    if rows < 2 and not own_rows_kernel(rows, p):
        return Choice("mkl", "llm_linear_mkl_gemv", "one row: MKL's sgemv streams the weight once")
    if onednn_rows(rows, p) and contiguous:
        return Choice(
            "onednn",
            "llm_linear_onednn",
            f">= {ONEDNN_MIN_ROWS} rows, MKL not the GEMM library: oneDNN's brgemm matmul",
        )
    if own_rows_kernel(rows, p):
        return Choice("opsnn", "llm_linear_rows", f"<= {SMALL_ROWS} rows, MKL not the GEMM library: opsnn's gemm_rows")
    if contiguous and own_packed_rejection(rows, dtype, p) is None:
        return Choice(
            "opsnn", "llm_linear_packed", "AVX2, OpenBLAS the GEMM library: opsnn's GEMM on a panel packed once"
        )
    why = packed_panel_rejection(rows, k, n, p)
    if why is not None or onednn_rows(rows, p):
        return Choice("openblas", "llm_linear_openblas", why or "oneDNN needs contiguous operands")
    return Choice("mkl", "llm_linear_mkl_packed", "MKL's packed panel, packed once")


def weight_stays_unpacked(rows: int, k: int, n: int, p: Platform | None = None) -> bool:
    """True when the decoder does not pack a float32 weight for MKL (its products of ``rows`` rows
    run on oneDNN, opsnn's own kernels, one of which packs its own panel, or OpenBLAS)."""
    p = p if p is not None else platform()
    return own_rows_kernel(rows, p) or onednn_rows(rows, p) or packed_panel_rejection(rows, k, n, p) is not None


def conv_gemms(p: Platform | None = None) -> Choice:
    """Who runs the GEMMs of 1x1 and im2col convolutions with a constant float32 weight: MKL's
    left-packed weight wherever MKL is available (faster than OpenBLAS on those shapes even where
    OpenBLAS is the GEMM library), else numpy's OpenBLAS."""
    p = p if p is not None else platform()
    if p.mkl is None:
        return Choice("mkl", "packed_left", "MKL's weight packed once at prepare")
    return Choice("openblas", "numpy_matmul", p.mkl)


#: Winograd chunks of at most this many tiles run their point GEMMs on oneDNN's batched brgemm,
#: longer ones on MKL (a point per task)
WINOGRAD_ONEDNN_MAX_TILES = 128


def winograd_gemms(tiles: int = 1, p: Platform | None = None) -> Choice:
    """Who runs the point GEMMs of a float32 Winograd convolution whose chunks hold ``tiles``
    tiles: oneDNN's batched brgemm matmul (U reordered once) where it has that code and the
    chunks are short, else MKL a point per task (or numpy without MKL)."""
    p = p if p is not None else platform()
    if p.onednn_matmul is None and tiles <= WINOGRAD_ONEDNN_MAX_TILES:
        return Choice("onednn", "batch_matmul_onednn", "oneDNN's batched brgemm matmul")
    if p.onednn_matmul is None and p.mkl is None:
        return Choice(
            "mkl", "point_gemms", f"{tiles} tiles a chunk (> {WINOGRAD_ONEDNN_MAX_TILES}): MKL a point per task"
        )
    if p.mkl is None:
        return Choice("mkl", "point_gemms", f"MKL a point per task (oneDNN: {p.onednn_matmul})")
    return Choice("openblas", "point_gemms", f"numpy (no MKL: {p.mkl})")


def blocked_winograd_gemms(p: Platform | None = None) -> Choice | str:
    """Who runs the 36 point GEMMs of Winograd on blocked tensors (``conv_winograd_blocked``), or why
    nothing does (a str: the blocked chain's 3x3 convolutions then stay on oneDNN's direct kernels):
    oneDNN's batched matmul, its brgemm code from AVX-512 on and, under AVX2, its ``gemm:jit`` code,
    which there still beats oneDNN's direct ``jit:avx2`` convolution (ResNet-50 b1 capped: 10% less CPU
    time; docs/performance.md, "AVX2"), though as a product with a constant weight it trails OpenBLAS."""
    p = p if p is not None else platform()
    if p.onednn_matmul is None:
        return Choice("onednn", "conv_winograd_blocked", "its point GEMMs in one oneDNN batched brgemm matmul")
    if p.isa == "avx2" and p.onednn is None:
        return Choice(
            "onednn", "conv_winograd_blocked", "its point GEMMs in one oneDNN batched matmul (gemm:jit, AVX2)"
        )
    return p.onednn_matmul


class LayoutChoice(NamedTuple):
    """The activation layout of the graph engine's convolution chains and why: ``block`` 0 for nhwc,
    8 / 16 for nChw8c / nChw16c (the ``block`` attribute of the ops the ``blocked_layout`` pass writes)."""

    block: int
    reason: str


#: ``OPSNN_ONEDNN_LAYOUT`` values and their ``block``
CHAIN_LAYOUTS = {"nhwc": 0, "nchw16c": 16, "nchw8c": 8}


def conv_chain_layout(p: Platform | None = None) -> LayoutChoice | str:
    """The layout float32 convolution chains run in (bfloat16 chains keep nChw16c, see the pass), or
    why there are none (a str: oneDNN is unavailable). Intel from AVX-512 on: nhwc, oneDNN's brgemm
    convolutions (``brgconv``; ResNet-50 b1 ran 0.95x the time of nChw16c with its direct kernels and
    the blocked Winograd, docs/performance.md, "Convolution chains on nhwc"); other AVX-512 CPUs:
    nChw16c (measured on Zen 4, nhwc not); AVX2: nChw8c (``brgconv:avx2`` was the slower there).
    ``OPSNN_ONEDNN_LAYOUT`` (nhwc, nChw16c, nChw8c) overrides it where the ISA runs that layout."""
    p = p if p is not None else platform()
    if p.onednn is not None:
        return p.onednn
    if p.onednn_block is None:
        return f"oneDNN's blocked convolutions need AVX2 (ISA {p.isa})"
    wide = p.onednn_block == 16
    want = os.environ.get("OPSNN_ONEDNN_LAYOUT", "").strip()
    if want:
        block = CHAIN_LAYOUTS.get(want.lower())
        if block is None:
            from ...errors import ParamInvalidError

            raise ParamInvalidError(
                f"OPSNN_ONEDNN_LAYOUT={want!r}: expected nhwc, nChw16c or nChw8c (or unset: chosen by CPU)"
            )
        if block != 16 or wide:
            return LayoutChoice(block, f"OPSNN_ONEDNN_LAYOUT={want}")
    if wide and p.vendor == "GenuineIntel":
        return LayoutChoice(0, "nhwc: oneDNN's brgemm convolutions (Intel, AVX-512)")
    if wide:
        return LayoutChoice(16, "nChw16c: oneDNN's direct AVX-512 convolutions and opsnn's blocked Winograd")
    return LayoutChoice(8, "nChw8c: oneDNN's direct AVX2 convolutions and opsnn's blocked Winograd")


#: float32 convolutions on plain tensors where convolution chains run nhwc (oneDNN's brgemm
#: convolutions): 2-D, one group, a kernel wider than 1x1, stride 1, no dilation, onto output planes of
#: at least this many positions ask oneDNN for nhwc activations, per pass (docs/performance.md,
#: "Training convolutions"): strided, 1x1 and smaller planes ran slower there
PLAIN_NHWC_MIN_POSITIONS = {"forward": 16, "data": 64, "weights": 16}
#: under AVX2 the forward of planes of this many positions (strided too) asks for nhwc (``brgconv:avx2``):
#: faster on the small planes, slower on larger ones, where ``jit:avx2`` on nChw8c stays
PLAIN_NHWC_AVX2_FORWARD_POSITIONS = (16, 64)


def plain_conv_formats(pass_: str, x_shape, w_shape, y_shape, strides, dilations, group, dtype, p=None) -> str:
    """The layouts oneDNN is asked for in a convolution on plain tensors, ``pass_`` 'forward', 'data'
    or 'weights' (a gradient): 'nhwc' (activations nhwc, weights of its choosing) where
    :func:`conv_chain_layout` runs nhwc (Intel from AVX-512 on; ``OPSNN_ONEDNN_LAYOUT`` steers both)
    and :data:`PLAIN_NHWC_MIN_POSITIONS` takes the shape, or under AVX2 for the forward onto the planes
    of :data:`PLAIN_NHWC_AVX2_FORWARD_POSITIONS`; else 'any' (layouts of its choosing)."""
    if np.dtype(dtype) != np.float32 or len(x_shape) != 4 or int(group) != 1:
        return "any"
    if math.prod(int(v) for v in w_shape[2:]) <= 1 or any(int(v) != 1 for v in dilations):
        return "any"
    positions = math.prod(int(v) for v in y_shape[2:])
    p = p if p is not None else platform()
    c = conv_chain_layout(p)
    if isinstance(c, LayoutChoice) and c.block == 0:
        stride_1 = all(int(v) == 1 for v in strides)
        return "nhwc" if stride_1 and positions >= PLAIN_NHWC_MIN_POSITIONS[pass_] else "any"
    lo, hi = PLAIN_NHWC_AVX2_FORWARD_POSITIONS
    avx2 = p.isa == "avx2" and p.onednn is None
    return "nhwc" if avx2 and pass_ == "forward" and lo <= positions <= hi else "any"


class BackwardChoice(NamedTuple):
    """:func:`conv_backward`'s decision; ``formats``: the layouts oneDNN's primitive is asked for
    ('any': of its choosing, reorders at the edges; 'nhwc': nhwc activations, weights of its choosing;
    'plain': the user's NCHW / OIHW), None off oneDNN."""

    library: str
    kernel: str
    reason: str
    formats: str | None
    compute: str | None = None  # "float32": oneDNN's float32 primitive on widened bfloat16 tensors


#: bfloat16 weight gradients of kernels wider than 1x1 whose output planes have at most this many
#: positions, or strided ones over at least BF16_DW_FLOAT32_MIN_CHANNELS input channels, leave oneDNN's
#: bf16 backward-weights code (the slower one there): 2-D one-group ones run as one matmul over the
#: windows of all images (:func:`weight_gradient_by_rows`; float32 has its own planes), others oneDNN's
#: float32 primitive on widened copies (1x1 kernels and the few-channel stem stay native bf16; docs/performance.md)
BF16_DW_FLOAT32_POSITIONS = 4
BF16_DW_FLOAT32_MIN_CHANNELS = 16
#: ... as one matmul while the windows of all images (rows of C*kh*kw) take at most this many bytes, and
#: for at least this many output channels: the product's multiply-adds per window value, which must
#: outweigh the numba pass writing the windows (ResNet-18's 64 -> 128 stride-2 3x3 did not gain)
DW_ROWS_MAX_BYTES = 64 << 20
DW_ROWS_MIN_OUT_CHANNELS = 256


def bf16_weight_gradient_in_float32(x_shape, w_shape, y_shape, strides) -> bool:
    """True when :func:`conv_backward` runs a bfloat16 weight gradient as float32 (see
    :data:`BF16_DW_FLOAT32_POSITIONS`)."""
    if math.prod(int(v) for v in w_shape[2:]) <= 1:
        return False
    positions = math.prod(int(v) for v in y_shape[2:])
    strided = any(int(s) > 1 for s in strides) and int(x_shape[1]) >= BF16_DW_FLOAT32_MIN_CHANNELS
    return positions <= BF16_DW_FLOAT32_POSITIONS or strided


#: float32 weight gradients onto output planes of at most this many positions an image run as one product
#: on every instruction-set level; larger strided planes only from AVX-512 on (under AVX2 the product and
#: oneDNN's backward-weights code measured even there, docs/performance.md)
DW_ROWS_F32_POSITIONS = 16


def _f32_rows_plane(x_shape, w_shape, y_shape, strides, p: Platform) -> bool:
    """The float32 half of :func:`weight_gradient_by_rows`' plane rule."""
    if math.prod(int(v) for v in w_shape[2:]) <= 1:
        return False
    if plain_conv_formats("weights", x_shape, w_shape, y_shape, strides, (1, 1), 1, np.float32, p) == "nhwc":
        return False
    if math.prod(int(v) for v in y_shape[2:]) <= DW_ROWS_F32_POSITIONS:
        return True
    wide = p.isa is not None and cpu.LEVELS.index(p.isa) >= cpu.LEVELS.index("avx512")
    return wide and any(int(s) > 1 for s in strides) and int(x_shape[1]) >= BF16_DW_FLOAT32_MIN_CHANNELS


def weight_gradient_by_rows(x_shape, w_shape, y_shape, strides, group, dtype, p: Platform | None = None) -> bool:
    """True when a convolution's weight gradient runs as one product, dW = dY^T @ the windows of all
    images as rows (``conv_backward_weight_matmul``, :func:`conv_rows_product` runs it): 2-D, one group,
    a kernel wider than 1x1, at least :data:`DW_ROWS_MIN_OUT_CHANNELS` output channels, rows within
    :data:`DW_ROWS_MAX_BYTES`, and a small or strided output plane: for bfloat16 the planes of
    :func:`bf16_weight_gradient_in_float32` with oneDNN's native bf16 matmul; for float32 planes of at
    most :data:`DW_ROWS_F32_POSITIONS` positions an image, or strided ones from AVX-512 on (where the
    backward-weights primitive is the slower one)."""
    d = np.dtype(dtype)
    if len(x_shape) != 4 or int(group) != 1 or d not in (np.dtype(np.float32), np.dtype(_dt.bfloat16)):
        return False
    if int(w_shape[0]) < DW_ROWS_MIN_OUT_CHANNELS or 0 in tuple(x_shape) + tuple(w_shape) + tuple(y_shape):
        return False
    p = p if p is not None else platform()
    if d == _dt.bfloat16:
        if not bf16_weight_gradient_in_float32(x_shape, w_shape, y_shape, strides):
            return False
    elif not _f32_rows_plane(x_shape, w_shape, y_shape, strides, p):
        return False
    positions = int(y_shape[0]) * math.prod(int(v) for v in y_shape[2:])
    row = int(x_shape[1]) * math.prod(int(v) for v in w_shape[2:])
    if positions * row * d.itemsize > DW_ROWS_MAX_BYTES:
        return False
    return d != _dt.bfloat16 or runtime_bf16_product(p) is None


#: float32 data gradients of kernels wider than 1x1 with at least DW_ROWS_MIN_OUT_CHANNELS output channels run
#: as one product onto output planes of at most this many positions an image (oneDNN's backward-data code
#: is the slower there); under AVX2 also onto planes of up to DX_ROWS_AVX2_POSITIONS from
#: DX_ROWS_AVX2_MIN_OUT_CHANNELS output channels (docs/performance.md)
DX_ROWS_POSITIONS = 4
DX_ROWS_AVX2_POSITIONS = 16
DX_ROWS_AVX2_MIN_OUT_CHANNELS = 512


def data_gradient_by_rows(x_shape, w_shape, y_shape, group, dtype, p: Platform | None = None) -> bool:
    """True when a float32 convolution's data gradient runs as one product, the windows' rows = dY as
    rows @ W, each row added back at its window (``conv_backward_data_matmul``, :func:`conv_rows_product`
    runs it): 2-D, one group, a kernel wider than 1x1, at least :data:`DW_ROWS_MIN_OUT_CHANNELS` output
    channels, rows within :data:`DW_ROWS_MAX_BYTES`, output planes of at most :data:`DX_ROWS_POSITIONS`
    positions (under AVX2 :data:`DX_ROWS_AVX2_POSITIONS` from :data:`DX_ROWS_AVX2_MIN_OUT_CHANNELS`)."""
    if len(x_shape) != 4 or int(group) != 1 or np.dtype(dtype) != np.float32:
        return False
    if int(w_shape[0]) < DW_ROWS_MIN_OUT_CHANNELS or 0 in tuple(x_shape) + tuple(w_shape) + tuple(y_shape):
        return False
    if math.prod(int(v) for v in w_shape[2:]) <= 1:
        return False
    p = p if p is not None else platform()
    plane = math.prod(int(v) for v in y_shape[2:])
    avx2 = p.isa == "avx2" and int(w_shape[0]) >= DX_ROWS_AVX2_MIN_OUT_CHANNELS
    if plane > (DX_ROWS_AVX2_POSITIONS if avx2 else DX_ROWS_POSITIONS):
        return False
    positions = int(y_shape[0]) * plane
    row = int(x_shape[1]) * math.prod(int(v) for v in w_shape[2:])
    return positions * (row + int(w_shape[0])) * 4 <= DW_ROWS_MAX_BYTES


def conv_forward_by_rows(x_shape, w_shape, y_shape, group, dtype, constant_weight: bool, p: Platform | None = None):
    """True when a float32 Conv on plain tensors runs as one product, Y's rows = the windows of all images
    @ W^T (``conv2d_rows``, :func:`conv_rows_product` runs it): AVX2 the level in force (from AVX-512 on
    oneDNN's forward was as fast, docs/performance.md), 2-D, one group, a kernel wider than 1x1, at least
    :data:`DW_ROWS_MIN_OUT_CHANNELS` output channels, a weight that is not constant (opsnn's packed kernels
    keep those), the planes and sizes of :func:`data_gradient_by_rows` under AVX2."""
    p = p if p is not None else platform()
    if p.isa != "avx2" or constant_weight:
        return False
    return data_gradient_by_rows(x_shape, w_shape, y_shape, group, dtype, p)


def conv_rows_product(kind: str, rows: int, k: int, n: int, dtype, p: Platform | None = None) -> Choice:
    """Who runs the one product of a convolution gradient computed over the windows of all images,
    (rows, k) @ (k, n): ``kind`` 'weights' (:func:`weight_gradient_by_rows`: dY^T by the windows), 'data'
    (:func:`data_gradient_by_rows`: dY as rows by W) or 'forward' (:func:`conv_forward_by_rows`: the windows
    by W^T). oneDNN's brgemm matmul for bfloat16 and where
    :func:`runtime_f32_product` takes float32, else the GEMM library."""
    p = p if p is not None else platform()
    kernel = {"forward": "conv2d_rows", "data": "conv_backward_data_matmul"}.get(kind, "conv_backward_weight_matmul")
    if np.dtype(dtype) == _dt.bfloat16:
        return Choice("onednn", kernel, "oneDNN's bf16 matmul over the windows of all images")
    why = runtime_f32_product(rows, k, n, p=p)
    if why is None:
        return Choice("onednn", kernel, "oneDNN's brgemm matmul over the windows of all images")
    return Choice(p.gemm_library, kernel, f"the GEMM library over the windows of all images ({why})")


def conv_backward(kind: str, x_shape, w_shape, y_shape, strides, pads, dilations, group, dtype) -> BackwardChoice:
    """Who computes a convolution's data (``kind`` 'data') or weight ('weights') gradient: the weight
    gradients of :func:`weight_gradient_by_rows` and the data gradients of :func:`data_gradient_by_rows` as
    one product (float32 with or without oneDNN); oneDNN's
    backward primitive where oneDNN runs the dtype natively (float32, float16 through the float32
    adapter, bfloat16 with AVX512-BF16), asked for the layouts of its choosing (its blocked JIT
    kernels; the plain tensors are reordered at the edges) unless that would be its reference code,
    then for the plain layouts; else opsnn's GEMM kernels (col2im / im2col + BLAS): float64, empty
    tensors, oneDNN missing (``OPSNN_ONEDNN=0``) or only its reference code for this shape. Asks
    oneDNN for descriptors only (no JIT code)."""
    from . import onednn

    name = "conv_backward_data" if kind == "data" else "conv_backward_weight"
    gemm = f"{name}_col2im" if kind == "data" else f"{name}_im2col"
    d = np.dtype(dtype)
    positions = int(y_shape[0]) * math.prod(int(v) for v in y_shape[2:])
    row = int(x_shape[1]) * math.prod(int(v) for v in w_shape[2:])
    if kind == "weights" and d == np.float32 and weight_gradient_by_rows(x_shape, w_shape, y_shape, strides, group, d):
        c = conv_rows_product("weights", int(w_shape[0]), positions, row, d)
        return BackwardChoice(
            c.library,
            c.kernel,
            f"{c.reason}: oneDNN's backward-weights code is slower on small or strided planes",
            None,
        )
    if kind == "data" and data_gradient_by_rows(x_shape, w_shape, y_shape, group, d):
        c = conv_rows_product("data", positions, int(w_shape[0]), row, d)
        return BackwardChoice(
            c.library, c.kernel, f"{c.reason}: oneDNN's backward-data code is slower on small planes", None
        )
    why = onednn.unavailable()
    if why is None and d == _dt.bfloat16:
        why = onednn.bf16_unavailable()
        why = None if why is None else f"bfloat16: {why}"
    elif why is None and d not in (np.dtype(np.float32), np.dtype(np.float16)):
        why = f"oneDNN runs float32 and bfloat16, not {_dt.name(d)}"
    if why is None and 0 in tuple(x_shape) + tuple(w_shape) + tuple(y_shape):
        why = "an empty tensor"
    if why is not None:
        return BackwardChoice("opsnn", gemm, why, None)
    prim_dtype = _dt.bfloat16 if d == _dt.bfloat16 else np.float32
    impls = {}
    nhwc = plain_conv_formats(kind, x_shape, w_shape, y_shape, strides, dilations, group, d) == "nhwc"
    for formats in (("nhwc",) if nhwc else ()) + ("any", "plain"):
        try:
            impls[formats] = impl = onednn.conv_backward_impl(
                kind, x_shape, w_shape, y_shape, strides, pads, dilations, group, prim_dtype, formats
            )
        except onednn.OneDnnError as e:
            impls[formats] = f"none ({e})"
            continue
        if not impl.startswith("ref"):
            where = {
                "nhwc": "nhwc activations (plain_conv_formats)",
                "any": "the layouts it chose",
                "plain": "the plain layouts (its own choice is ref code)",
            }[formats]
            if (
                kind == "weights"
                and d == _dt.bfloat16
                and weight_gradient_by_rows(x_shape, w_shape, y_shape, strides, group, d)
            ):
                return BackwardChoice(
                    "onednn",
                    "conv_backward_weight_matmul",
                    "oneDNN's bfloat16 matmul of dY^T by the windows of all images at once: its "
                    "backward-weights code is slower on small or strided output planes",
                    None,
                )
            if (
                kind == "weights"
                and d == _dt.bfloat16
                and bf16_weight_gradient_in_float32(x_shape, w_shape, y_shape, strides)
            ):
                return BackwardChoice(
                    "onednn",
                    f"{name}_onednn",
                    f"oneDNN's float32 backward primitive on widened copies, {where}: its bfloat16 "
                    "weight-gradient code is slower on small or strided output planes",
                    formats,
                    "float32",
                )
            return BackwardChoice("onednn", f"{name}_onednn", f"oneDNN's {impl} backward primitive on {where}", formats)
    return BackwardChoice("opsnn", gemm, f"oneDNN has only {impls['plain']} for this shape", None)


#: ``OPSNN_CONV_ONEDNN``: ``1`` makes float32 convolutions on plain tensors prefer oneDNN's forward
#: primitive wherever it has JIT code for them, ``0`` never (autotuning may still time it); unset:
#: :func:`conv_forward_plain`'s rule
CONV_ONEDNN_ENV = "OPSNN_CONV_ONEDNN"


class PlainConvChoice(NamedTuple):
    """:func:`conv_forward_plain`'s decision: whether oneDNN can run the convolution on its JIT code,
    whether that is preferred to opsnn's kernels, and why."""

    runnable: bool
    preferred: bool
    reason: str
    formats: str = "any"  # the layouts the primitive is asked for (plain_conv_formats)


#: the most the plain-layout forward primitive's reorder buffers (X and Y in oneDNN's layouts) may
#: take: past it opsnn's banded kernels, whose workspace does not grow with the image, run the conv
PLAIN_REORDER_MAX_BYTES = 64 << 20


def conv_forward_plain(
    x_shape,
    w_shape,
    y_shape,
    strides,
    pads,
    dilations,
    group,
    dtype,
    constant_weight: bool = False,
) -> PlainConvChoice:
    """Whether a float32 or bfloat16 Conv on plain NCHW tensors (an eager call, a training step, a
    graph node outside the blocked layout's chains, an autocast convolution) runs on oneDNN's forward
    primitive with reorders at the edges (``conv_onednn_plain``): runnable where oneDNN has JIT code
    for it (not ``ref``, not its own ``gemm`` im2col, which opsnn's kernels match), for bfloat16 with
    native bf16 instructions (:func:`onednn.bf16_unavailable`), and while X and Y reordered take at
    most :data:`PLAIN_REORDER_MAX_BYTES`. Preferred for bfloat16 (opsnn's other kernels widen it to
    float32 through the adapter); for float32 preferred to opsnn's Winograd, im2col, 1x1-GEMM and
    direct kernels (1.3-10x faster on ResNet-18's training convolutions, docs/performance.md), but
    not for a ``constant_weight`` (opsnn's kernels pack it once; the primitive would reorder it every
    call). ``OPSNN_CONV_ONEDNN=1|0`` overrides the float32 rule. Descriptor only."""
    from . import onednn

    d = np.dtype(dtype)
    why = onednn.unavailable()
    if why is None and d == _dt.bfloat16:
        why = onednn.bf16_unavailable()
        why = None if why is None else f"bfloat16: {why}"
    elif why is None and d != np.dtype(np.float32):
        why = f"float32 or bfloat16 only, got {_dt.name(d)}"
    if why is None and 0 in tuple(x_shape) + tuple(w_shape) + tuple(y_shape):
        why = "an empty tensor"
    if why is None:
        reorder = (int(np.prod(x_shape)) + int(np.prod(y_shape))) * d.itemsize
        if reorder > PLAIN_REORDER_MAX_BYTES:
            why = (
                f"X and Y reordered would take {reorder >> 20} MiB (> PLAIN_REORDER_MAX_BYTES = "
                f"{PLAIN_REORDER_MAX_BYTES >> 20} MiB): opsnn's banded kernels keep the workspace bounded"
            )
    if why is None:
        try:
            impl = onednn.plain_conv_impl(x_shape, w_shape, y_shape, strides, pads, dilations, group, d)
        except onednn.OneDnnError as e:
            why = str(e)
        else:
            if impl.startswith("ref") or "gemm" in impl:
                why = f"oneDNN would run its {impl} code here"
    if why is not None:
        return PlainConvChoice(False, False, why)
    formats = plain_conv_formats("forward", x_shape, w_shape, y_shape, strides, dilations, group, d)
    if formats == "nhwc":
        nhwc = onednn.plain_conv_impl(x_shape, w_shape, y_shape, strides, pads, dilations, group, d, formats)
        if nhwc.startswith("ref") or "gemm" in nhwc:
            formats = "any"
        else:
            impl = f"{nhwc} on nhwc"
    if d == _dt.bfloat16:
        return PlainConvChoice(
            True, True, f"oneDNN's native bfloat16 {impl} (float32 accumulation), reorders at the edges", formats
        )
    want = os.environ.get(CONV_ONEDNN_ENV, "").strip().lower()
    if want in ("1", "true", "yes", "on"):
        return PlainConvChoice(True, True, f"oneDNN's {impl}, reorders at the edges ({CONV_ONEDNN_ENV}=1)", formats)
    if want in ("0", "false", "no", "off"):
        return PlainConvChoice(True, False, f"oneDNN's {impl} is not preferred ({CONV_ONEDNN_ENV}=0)", formats)
    if constant_weight:
        return PlainConvChoice(
            True,
            False,
            f"a constant weight: opsnn's kernels pack it once, oneDNN's {impl} would reorder it every call",
            formats,
        )
    return PlainConvChoice(True, True, f"oneDNN's {impl}, reorders at the edges", formats)


#: where AVX2 is the level in force, an epilogue pass without a costly activation (bias, residual,
#: Relu, Clip) of up to this many elements runs on the calling thread after a product on OpenBLAS:
#: OpenBLAS works on its own threads, so numba's OpenMP workers are asleep when the pass starts
#: (after MKL or oneDNN, which share numba's pool, they are still awake: fused.PARALLEL_MIN holds)
SERIAL_EPILOGUE_AFTER_OPENBLAS = 1 << 19


def serial_epilogue(library: str, elements: int, costly: bool, p: Platform | None = None) -> bool:
    """True when the epilogue pass (``y = act(y + bias + Z)``) that follows a product run by
    ``library`` runs on the calling thread whatever :data:`opsnn.kernels.cpu.fused.PARALLEL_MIN`
    says: OpenBLAS ran the product, AVX2 is the level in force, the activation is not ``costly``
    (an exp or erf per element) and the pass has at most :data:`SERIAL_EPILOGUE_AFTER_OPENBLAS`
    elements. BERT-base's bias + residual passes (128 x 768) under the AVX2 cap, say."""
    level = p.isa if p is not None else cpu.isa()
    return library == "openblas" and level == "avx2" and not costly and elements <= SERIAL_EPILOGUE_AFTER_OPENBLAS


def attention_gemms(p: Platform | None = None) -> Choice:
    """Who runs the products of the GEMM attention kernel: MKL (one ``cblas_sgemm_batch`` over the
    heads, or MKL inside a task per (batch, KV head)) where it is available, else numpy's matmul
    (a BLAS call per head)."""
    p = p if p is not None else platform()
    if p.mkl is None:
        return Choice("mkl", "sgemm_batch", "MKL's batched GEMM over the heads")
    return Choice("openblas", "numpy_matmul", f"numpy's matmul, a call per head (no MKL: {p.mkl})")


def sibling_products(p: Platform | None = None) -> str | None:
    """None when float32 products that read the same activations with constant weights (BERT's Q, K
    and V projections) run as one product on their weights side by side, its output split after:
    where oneDNN's brgemm matmul runs them (AVX-512 on), one (128, 768) @ (768, 2304) product beats
    three of 768 columns; else why not (other levels keep their products as they are). Where MKL
    is the GEMM library the products run on its packed panels (:func:`epilogue_product_rejection`),
    which gain nothing from the merge: the split after it is a copy saved."""
    p = p if p is not None else platform()
    if p.onednn_matmul is not None:
        return f"oneDNN's brgemm matmul is not used here ({p.onednn_matmul})"
    mkl = epilogue_product_rejection(_dt.float32, p)
    if mkl is not None:
        return f"oneDNN's brgemm matmul does not run them: {mkl}"
    return None


#: a batch of float32 products each of this many multiply-adds (inclusive) runs on MKL's
#: ``cblas_sgemm_batch`` even where OpenBLAS is the GEMM library: it spreads them over its threads
MKL_BATCH_MACS = (1 << 19, 1 << 24)


def mkl_batch(m: int, k: int, n: int) -> bool:
    """True when a batch of (m, k) @ (k, n) float32 products goes to MKL's batched GEMM whatever
    the GEMM library (:func:`opsnn.kernels.cpu.mkl.matmul` asks this)."""
    return MKL_BATCH_MACS[0] <= m * k * n <= MKL_BATCH_MACS[1]


def blas_product(rows: int, k: int, n: int, dtype, batch: int = 1, p: Platform | None = None) -> Choice:
    """Which library runs a (rows, k) @ (k, n) product (``batch`` of them) handed to
    :func:`opsnn.kernels.cpu.mkl.matmul`: the BLAS kernels of MatMul, Gemm and Linear and the
    unpacked convolution GEMMs (for operands BLAS can read in place)."""
    p = p if p is not None else platform()
    if np.dtype(dtype) != _dt.float32:
        return Choice("openblas", "numpy_matmul", f"{_dt.name(np.dtype(dtype))}: numpy's BLAS (MKL runs float32)")
    if p.mkl is not None:
        return Choice("openblas", "numpy_matmul", f"numpy's BLAS (no MKL: {p.mkl})")
    if batch > 1 and mkl_batch(rows, k, n):
        return Choice("mkl", "sgemm_batch", "a batch of mid-sized products: MKL's batched GEMM spreads them")
    if p.gemm_library == "openblas":
        return Choice("openblas", "sgemm", "OpenBLAS is the GEMM library on this CPU (MKL's SGEMM is slower)")
    if batch == 1 and (rows == 1 or n == 1) and openblas_gemv():
        return Choice("openblas", "sgemv", "one row: OpenBLAS' sgemv (its workers sleep after a call)")
    return Choice("mkl", "sgemm_batch" if batch > 1 else "sgemm", "MKL is the GEMM library on this CPU")


def kernel_choice(
    kernel: str, rows: int, k: int, n: int, dtype, batch: int = 1, tiles: int | None = None, p: Platform | None = None
) -> Choice | None:
    """The library that the registered product kernel ``kernel`` (of MatMul, Gemm, Linear,
    FusedMatMul, BatchGemm, Conv, FusedConv, BlockedConv, ConvTranspose) runs its (rows, k) @ (k, n) GEMMs on
    here, and why (``tiles``: a Winograd chunk's tile count); None for a kernel that is not one of
    those. What ``opsnn explain`` prints per product shape."""
    p = p if p is not None else platform()
    if kernel == "conv_onednn":
        return Choice(
            "onednn", kernel, "the blocked layout's convolution: oneDNN's primitive, weight reordered at prepare"
        )
    if kernel == "conv_onednn_plain":
        return Choice("onednn", kernel, "oneDNN's convolution on plain tensors, reorders at the edges")
    if kernel.startswith("conv_backward_") and kernel.endswith("_onednn"):
        return Choice("onednn", kernel, "oneDNN's convolution backward primitive (conv_backward)")
    if kernel in ("conv_backward_weight_matmul", "conv_backward_data_matmul", "conv2d_rows"):
        kind = {"conv2d_rows": "forward", "conv_backward_data_matmul": "data"}.get(kernel, "weights")
        return conv_rows_product(kind, rows, k, n, dtype, p)
    if kernel == "conv_winograd_blocked":
        c = blocked_winograd_gemms(p)
        why = c.reason if isinstance(c, Choice) else "its point GEMMs in one oneDNN batched matmul"
        return Choice("onednn", kernel, f"blocked-layout Winograd: {why}")
    if kernel.endswith("onednn_runtime"):
        if np.dtype(dtype) == np.float32:
            return Choice("onednn", kernel, "float32 operands known at run time: oneDNN's brgemm matmul reads them")
        return Choice("onednn", kernel, "bfloat16 operands known at run time: oneDNN's native bf16 matmul reads them")
    if "onednn" in kernel:
        return Choice("onednn", kernel, "oneDNN's brgemm matmul, the weight reordered once at prepare")
    if kernel == "matmul_packed":
        return Choice("opsnn", kernel, "AVX2 without MKL: opsnn's packed GEMM, the weight packed once at prepare")
    if kernel.endswith("mkl_bf16"):
        return Choice("mkl", kernel, "bfloat16 with a constant weight: MKL's bf16 GEMM on the weight as stored")
    if kernel.endswith("mkl_packed"):
        if kernel.startswith("conv"):
            return Choice("mkl", kernel, conv_gemms(p).reason)
        if p.gemm_library == "mkl":
            why = "MKL is the GEMM library on this CPU"
        else:
            rows, macs = packed_limits(p)
            why = f"fewer than {rows} rows" + (f" or {macs} multiply-adds" if macs else "")
        return Choice("mkl", kernel, f"constant weight packed once at prepare: {why}")
    if kernel.startswith("conv2d_winograd"):
        c = winograd_gemms(tiles if tiles is not None else 1, p)
        return Choice(c.library, kernel, c.reason)
    if kernel == "conv2d_im2col_tasks":
        return Choice("mkl", kernel, "single-threaded MKL inside a task per band of output rows")
    if kernel == "gemm_vector":
        return Choice("opsnn", kernel, "one row: opsnn's gemm_rows streams the weight once")
    if kernel in ("conv2d_depthwise", "conv2d_direct", "matmul_tiled_lowp"):
        return Choice("opsnn", kernel, "opsnn's own numba kernel, no GEMM")
    if kernel.startswith(("matmul_numpy_int", "matmul_integer", "qlinear", "conv_integer")):
        return Choice("numpy", kernel, "integer products: numpy (no BLAS for integers)")
    if kernel.startswith(
        (
            "matmul_",
            "gemm_",
            "batch_gemm_",
            "linear_",
            "conv_1x1",
            "conv2d_im2col",
            "conv_nd_im2col",
            "conv_transpose",
            "conv_backward_",
        )
    ):
        c = blas_product(rows, k, n, dtype, batch, p)
        return Choice(c.library, kernel, c.reason)
    return None


def summary() -> str:
    """One line naming the instruction-set level in force (and why), the threaded float32 GEMM
    library, the kernels numpy's OpenBLAS runs, MKL, oneDNN (its blocked layout and whether its
    matmul and bf16 kernels are used), so that figures from two machines can be told apart."""
    from ...runtime import blas
    from . import mkl, onednn
    from .blocked import layout_name

    parts = [f"ISA {cpu.describe()}", f"GEMM {'MKL' if gemm_library() == 'mkl' else 'OpenBLAS'}"]
    core = blas.core_name()
    if core is not None:
        parts.append(f"OpenBLAS {core}")
    parts.append("MKL " + (mkl.threading_layer() if mkl.unavailable() is None else "off"))
    if onednn.unavailable() is None:
        extra = [
            layout_name(lay.block) if not isinstance(lay := conv_chain_layout(), str) else "no chains",
            "matmul" if onednn.matmul_unavailable() is None else "no matmul",
            "bf16" if onednn.bf16_unavailable() is None else "no bf16",
        ]
        parts.append(f"oneDNN {onednn.version()} ({', '.join(extra)})")
    else:
        parts.append("oneDNN off")
    return "; ".join(parts)


__all__ = [
    "BackwardChoice",
    "Choice",
    "LayoutChoice",
    "PlainConvChoice",
    "Platform",
    "attention_gemms",
    "blas_product",
    "blocked_winograd_gemms",
    "conv_chain_layout",
    "conv_backward",
    "conv_forward_plain",
    "conv_gemms",
    "epilogue_product_rejection",
    "gemm_library",
    "gemm_library_why",
    "kernel_choice",
    "mkl_batch",
    "mkl_gemv_in_tasks",
    "onednn_bf16_rows",
    "onednn_rows",
    "openblas_gemv",
    "own_rows_kernel",
    "packed_limits",
    "packed_panel_rejection",
    "platform",
    "projection",
    "runtime_f32_product",
    "serial_epilogue",
    "sibling_products",
    "summary",
    "weight_stays_unpacked",
    "winograd_gemms",
]
