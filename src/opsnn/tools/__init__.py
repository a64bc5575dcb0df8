"""Tools that observe the runtime through hooks: profiler, trace analyzer, memory checker."""
from . import profiler
from .memory_checker import Leak, MemoryLeakError, memory_checker

__all__ = ["Leak", "MemoryLeakError", "memory_checker", "profiler"]
