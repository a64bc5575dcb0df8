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
