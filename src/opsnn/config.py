"""Library-wide settings and capability queries.

>>> import opsnn
>>> caps = opsnn.config.get_backend_capability()
>>> caps["cpu"]["Relu"]["kernels"][0]["name"]  # doctest: +SKIP
'relu_numba'
"""

from __future__ import annotations

from . import dtypes as _dt
from .ops.registry import all_ops, kernel_selector  # noqa: F401 - re-exported


def get_backend_capability() -> dict:
    """``{backend: {op: {"category", "dtypes", "kernels": [{name, priority, dtypes}]}}}``."""
    caps: dict = {}
    for rec in all_ops():
        for k in rec.kernels:
            entry = caps.setdefault(k.backend, {}).setdefault(
                rec.name if not rec.domain else f"{rec.domain}::{rec.name}",
                {
                    "category": rec.category,
                    "dtypes": sorted({_dt.name(d) for d in (rec.inputs[0].dtypes or ())}) if rec.inputs else [],
                    "kernels": [],
                },
            )
            entry["kernels"].append(
                {
                    "name": k.name,
                    "priority": k.priority,
                    "fallback": k.fallback,
                    "dtypes": None if k.dtypes is None else [_dt.name(d) for d in k.dtypes],
                }
            )
    return caps


def enable_memory_optimization(enabled: bool = True) -> None:
    """Static memory planning for compiled graphs (on by default)."""
    from .graph.compiler import enable_memory_optimization as _enable

    _enable(enabled)


def memory_optimization_enabled() -> bool:
    from .graph.compiler import memory_optimization_enabled as _enabled

    return _enabled()


def disable_passes(names) -> None:
    """Disable graph passes by name (``[]`` re-enables all); see ``opsnn.optimize.pass_names()``."""
    from .graph.passes import disable_passes as _disable

    _disable(names)


def allow_mix_precision(policy: dict | None) -> None:
    """Per-op-type compute dtypes for compiled graphs, e.g.
    ``{"MatMul": "float16", "LayerNorm": "float32", "Softmax": "bfloat16"}`` (None clears)."""
    from .graph.mixed_precision import set_policy

    set_policy(policy)


def set_cpu_isa(level: str | None) -> str | None:
    """Cap the instruction sets kernels may use (``"sse41"``, ``"avx2"``, ``"avx512"``,
    ``"avx512_bf16"``, ``"amx"``; None: the CPU's own), as ``OPSNN_CPU_ISA`` does at start-up;
    returns the level in force. Only before oneDNN and MKL are loaded, and not for numba's own
    kernels: see :func:`opsnn.runtime.cpu.set_cpu_isa`."""
    from .runtime import cpu

    return cpu.set_cpu_isa(level)


def get_cpu_isa() -> str | None:
    """The instruction-set level in force (see :func:`set_cpu_isa`)."""
    from .runtime import cpu

    return cpu.isa()
