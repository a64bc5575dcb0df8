"""The static memory planner: invariant (no overlap among live buffers) and packing quality."""

from hypothesis import given, settings
from hypothesis import strategies as st

from opsnn.graph.memory_plan import Buffer, check_plan, plan_memory


def test_chain_reuses_memory():
    bufs = [Buffer(f"v{i}", 1000, i, i + 1) for i in range(10)]
    plan = plan_memory(bufs)
    check_plan(plan)
    assert plan.arena_bytes == 2 * 1024 and plan.naive_bytes == 10 * 1024
    assert plan.saving > 0.75


def test_all_live_at_once_needs_the_sum():
    bufs = [Buffer(f"v{i}", 100 * (i + 1), 0, 5) for i in range(4)]
    plan = plan_memory(bufs)
    check_plan(plan)
    assert plan.arena_bytes == plan.naive_bytes


def test_empty_and_zero_size():
    assert plan_memory([]).arena_bytes == 0
    plan = plan_memory([Buffer("z", 0, 0, 0)])
    assert plan.offsets["z"] == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 30), st.integers(0, 10)), min_size=1, max_size=40))
def test_random_lifetimes_never_overlap(specs):
    bufs = [Buffer(f"b{i}", size, start, start + length) for i, (size, start, length) in enumerate(specs)]
    plan = plan_memory(bufs)
    check_plan(plan)
    # never worse than the naive sum, never better than the peak of simultaneously live bytes
    peak = max(sum((b.size + 63) // 64 * 64 for b in bufs if b.start <= t <= b.end) for t in range(41))
    assert peak <= plan.arena_bytes <= plan.naive_bytes


def _plan_all_pairs(buffers):
    """The planner's greedy best fit, comparing each buffer with every placed one (the oracle)."""
    placed, offsets = [], {}
    for buf in sorted(buffers, key=lambda b: (-b.size, b.start, b.name)):
        size = (max(buf.size, 1) + 63) // 64 * 64
        busy = sorted((off, off + sz) for off, sz, o in placed if o.start <= buf.end and buf.start <= o.end)
        best, best_gap, cursor = None, None, 0
        for lo, hi in busy:
            if lo - cursor >= size and (best_gap is None or lo - cursor < best_gap):
                best, best_gap = cursor, lo - cursor
            cursor = max(cursor, hi)
        offsets[buf.name] = cursor if best is None else best
        placed.append((offsets[buf.name], size, buf))
    return offsets


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 400), st.integers(0, 300)), min_size=1, max_size=60))
def test_lifetimes_across_time_buckets_plan_as_all_pairs(specs):
    """Lifetimes spanning several of the planner's time buckets: the same offsets as comparing
    every pair of buffers."""
    bufs = [Buffer(f"b{i}", size, start, start + length) for i, (size, start, length) in enumerate(specs)]
    plan = plan_memory(bufs)
    check_plan(plan)
    assert plan.offsets == _plan_all_pairs(bufs)


def test_long_chain_compares_only_nearby_buffers():
    """A chain of n short-lived buffers (and one that lives throughout): each buffer is compared
    with the buffers live near it, not with every buffer placed before it (O(n), not O(n^2))."""
    reads = [0]

    class Counted(Buffer):
        def __getattribute__(self, name):
            if name == "start":
                reads[0] += 1
            return object.__getattribute__(self, name)

    n = 3000
    bufs = [Counted(f"v{i}", 256 + (i % 7) * 64, i, i + 1) for i in range(n)] + [Counted("long", 64, 0, n)]
    plan = plan_memory(bufs)
    assert reads[0] < 200 * n, reads[0]
    assert plan.arena_bytes <= 2 * (256 + 6 * 64) + 64 + 64 * 8
