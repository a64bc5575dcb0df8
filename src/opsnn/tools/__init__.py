"""Tools that observe the runtime through hooks: profiler, trace analyzer."""
from . import profiler

__all__ = ["profiler"]
