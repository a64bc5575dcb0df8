"""Leak checker: blocks allocated inside a ``with`` block and still live on exit.

>>> import opsnn
>>> with opsnn.tools.memory_checker() as mc:
...     kept = opsnn.empty((1024,), "float32")
>>> mc.leaks[0].bytes >= 4096
True
"""

from __future__ import annotations

import gc
import traceback
from dataclasses import dataclass

from ..errors import OpsnnRuntimeError
from ..runtime import hooks


class MemoryLeakError(OpsnnRuntimeError):
    """Raised on exit of ``memory_checker(raise_on_leak=True)`` when blocks leaked."""


@dataclass
class Leak:
    bytes: int
    requested: int
    op: str
    stack: list  # formatted Python frames where the allocation happened

    def __str__(self) -> str:
        where = self.stack[-1].strip() if self.stack else "?"
        return f"{self.requested} bytes (block {self.bytes}) allocated by {self.op} at {where}"


class memory_checker:
    """Report pool blocks allocated inside the block and not freed on exit, each with the
    op that allocated it and the Python stack of the allocation."""

    def __init__(self, raise_on_leak: bool = False, stack_depth: int = 12):
        self.raise_on_leak = raise_on_leak
        self.stack_depth = stack_depth
        self.leaks: list[Leak] = []
        self._live: dict = {}

    def _on_alloc(self, ev: dict) -> None:
        stack = traceback.format_stack(limit=self.stack_depth)[:-3]  # drop the pool's own frames
        self._live[id(ev["block"])] = (ev["block"], stack)

    def _on_free(self, ev: dict) -> None:
        self._live.pop(id(ev["block"]), None)

    def __enter__(self) -> memory_checker:
        self._unsubs = [hooks.subscribe("alloc", self._on_alloc), hooks.subscribe("free", self._on_free)]
        return self

    def __exit__(self, exc_type, *exc) -> None:
        from ..runtime.context import context, is_initialized

        if is_initialized():
            for s in context().streams():
                s._wait_all()
        gc.collect()
        for u in self._unsubs:
            u()
        self.leaks = [Leak(b.size, b.requested, b.tag or "(user)", stack) for b, stack in self._live.values() if b.live]
        if self.leaks and self.raise_on_leak and exc_type is None:
            raise MemoryLeakError("memory_checker: " + self.report())

    def report(self) -> str:
        if not self.leaks:
            return "no leaks"
        lines = [f"{len(self.leaks)} block(s) leaked, {sum(l.requested for l in self.leaks)} bytes:"]
        for leak in sorted(self.leaks, key=lambda l: -l.bytes):
            lines.append(f"  - {leak}")
        return "\n".join(lines)
