"""The static memory planner: liveness over the execution order -> offsets in one arena.

Buffers whose lifetimes overlap never share bytes; the rest are packed greedily, largest
first, each into the smallest gap that fits (best fit), 64-byte aligned (cf. TFLite's
greedy-by-size planner and tinygrad's memory planner)::

    >>> plan = plan_memory([Buffer("a", 100, 0, 1), Buffer("b", 100, 1, 2), Buffer("c", 100, 2, 3)])
    >>> plan.offsets["a"] == plan.offsets["c"], plan.arena_bytes
    (True, 256)
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class Buffer:
    """A value to place: ``size`` bytes, live from step ``start`` to step ``end`` inclusive."""

    name: str
    size: int
    start: int
    end: int


@dataclass
class MemoryPlan:
    offsets: dict = field(default_factory=dict)
    arena_bytes: int = 0
    naive_bytes: int = 0
    buffers: list = field(default_factory=list)
    aliases: dict = field(default_factory=dict)  # value -> value whose bytes it reuses in place

    @property
    def saving(self) -> float:
        return 1.0 - self.arena_bytes / self.naive_bytes if self.naive_bytes else 0.0

    def summary(self) -> str:
        return (
            f"arena {self.arena_bytes} bytes for {len(self.buffers)} buffers "
            f"(naive sum {self.naive_bytes} bytes, {100 * self.saving:.1f}% saved, "
            f"{len(self.aliases)} in-place)"
        )


#: steps per time bucket: a buffer is compared only with buffers placed in the buckets its
#: lifetime spans, so a long chain of short-lived buffers plans in O(n), not O(n^2)
_BUCKET = 64


def plan_memory(buffers: list[Buffer]) -> MemoryPlan:
    """Assign arena offsets so that no two simultaneously live buffers overlap."""
    placed: list[tuple[int, int, Buffer]] = []  # (offset, aligned size, buffer)
    buckets: dict[int, list[int]] = {}  # time bucket -> indices into placed of buffers live in it
    offsets: dict = {}
    for buf in sorted(buffers, key=lambda b: (-b.size, b.start, b.name)):
        size = _align(max(buf.size, 1))
        span = range(buf.start // _BUCKET, max(buf.start, buf.end) // _BUCKET + 1)
        seen: set = set()
        busy = []
        for t in span:
            for j in buckets.get(t, ()):
                if j in seen:
                    continue
                seen.add(j)
                off, sz, other = placed[j]
                if other.start <= buf.end and buf.start <= other.end:
                    busy.append((off, off + sz))
        busy.sort()
        best, best_gap, cursor = None, None, 0
        for lo, hi in busy:
            gap = lo - cursor
            if gap >= size and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            cursor = max(cursor, hi)
        if best is None:
            best = cursor
        offsets[buf.name] = best
        for t in span:
            buckets.setdefault(t, []).append(len(placed))
        placed.append((best, size, buf))
    arena = max((off + sz for off, sz, _ in placed), default=0)
    return MemoryPlan(offsets, arena, sum(_align(max(b.size, 1)) for b in buffers), list(buffers))


def check_plan(plan: MemoryPlan) -> None:
    """Assert the plan's invariant (used by tests): overlapping lifetimes never share bytes."""
    bufs = plan.buffers
    for i, a in enumerate(bufs):
        for b in bufs[i + 1 :]:
            if a.start <= b.end and b.start <= a.end:
                oa, ob = plan.offsets[a.name], plan.offsets[b.name]
                assert oa + _align(max(a.size, 1)) <= ob or ob + _align(max(b.size, 1)) <= oa, (
                    f"{a.name} and {b.name} are live together but overlap in the arena"
                )
