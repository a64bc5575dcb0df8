"""Tools that observe the runtime through hooks: profiler, trace analyzer, memory checker,
precision compare, graph plots."""

from . import profiler
from .memory_checker import Leak, MemoryLeakError, memory_checker
from .precision import PrecisionReport, precision_compare

__all__ = ["PrecisionReport", "precision_compare", "Leak", "MemoryLeakError", "memory_checker", "profiler"]
