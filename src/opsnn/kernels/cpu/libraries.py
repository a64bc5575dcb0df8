"""Which kernel libraries run here: one line for ``opsnn info`` and ``opsnn bench``."""
from __future__ import annotations

from ...runtime import cpu


def summary() -> str:
    """One line naming the instruction-set level in force (and why), the threaded float32 GEMM
    library, MKL, oneDNN (its blocked layout and whether its matmul and bf16 kernels are used),
    so that figures from two machines can be told apart."""
    from . import mkl, onednn

    parts = [f"ISA {cpu.describe()}"]
    lib = mkl.gemm_library()
    parts.append(f"GEMM {'MKL' if lib == 'mkl' else 'OpenBLAS'}")
    why = mkl.unavailable()
    parts.append("MKL " + (mkl.threading_layer() if why is None else "off"))
    why = onednn.unavailable()
    if why is None:
        extra = [f"nChw{onednn.block()}c"]
        extra.append("matmul" if onednn.matmul_unavailable() is None else "no matmul")
        extra.append("bf16" if onednn.bf16_unavailable() is None else "no bf16")
        parts.append(f"oneDNN {onednn.version()} ({', '.join(extra)})")
    else:
        parts.append("oneDNN off")
    return "; ".join(parts)


__all__ = ["summary"]
