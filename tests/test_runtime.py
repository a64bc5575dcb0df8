"""Runtime: init/finalize, devices, streams (async, overlap, ordering, errors), events, pool."""

import gc
import os
import sys
import threading
import time

import numba as nb
import numpy as np
import pytest

import opsnn
from opsnn.errors import KernelError, NotInitializedError, OutOfMemoryError, ParamInvalidError
from opsnn.ops import Input, TensorMeta


@nb.njit(nogil=True, cache=True)
def _spin(x, out, iters):
    acc = 0.0
    for _ in range(iters):
        for i in range(x.size):
            acc = acc * 0.999999 + x[i]
    out[0] = acc


def _register_test_ops():
    if opsnn.ops.has_op("Spin", "test"):
        return
    spin = opsnn.register_op(
        "Spin",
        domain="test",
        inputs=[Input("X")],
        outputs=["Y"],
        attrs=[("iters", "int", 1)],
        infer=lambda ctx: [TensorMeta((1,), ctx.dtype(0))],
        reference=lambda ins, attrs: np.zeros(1, ins[0].dtype),
    )
    spin.kernel("spin_nogil", priority=1)(lambda ins, outs, attrs, plan, ws: _spin(ins[0], outs[0], attrs["iters"]))

    log = opsnn.register_op(
        "Log",
        domain="test",
        inputs=[Input("X")],
        outputs=["Y"],
        attrs=[("tag", "int", 0)],
        infer=lambda ctx: [TensorMeta(ctx.shape(0), ctx.dtype(0))],
        reference=lambda ins, attrs: ins[0],
    )

    def log_kernel(ins, outs, attrs, plan, ws):
        ORDER.append(attrs["tag"])
        outs[0][...] = ins[0]

    log.kernel("log", priority=1)(log_kernel)

    fail = opsnn.register_op(
        "Fail",
        domain="test",
        inputs=[Input("X")],
        outputs=["Y"],
        infer=lambda ctx: [TensorMeta(ctx.shape(0), ctx.dtype(0))],
        reference=lambda ins, attrs: ins[0],
    )

    def fail_kernel(ins, outs, attrs, plan, ws):
        raise ValueError("deliberate failure")

    fail.kernel("fail", priority=1)(fail_kernel)


ORDER: list = []
_register_test_ops()


def run(op, *inputs, stream=None, **attrs):
    return opsnn.ops.run_op(op, list(inputs), attrs, domain="test", stream=stream)[0]


def test_init_twice_is_harmless_and_finalize_blocks_ops():
    ctx = opsnn.init()
    assert opsnn.init() is ctx
    opsnn.finalize()
    with pytest.raises(NotInitializedError, match="init"):
        opsnn.tensor([1.0])
    opsnn.finalize()  # twice is harmless too
    with opsnn.init() as ctx2:
        assert opsnn.is_initialized() and ctx2 is not ctx
        t = opsnn.tensor(np.ones(3, np.float32))
        assert run("Log", t).numpy().sum() == 3
    assert not opsnn.is_initialized()
    opsnn.init()


def test_device():
    assert opsnn.Device("cpu") == opsnn.Device("cpu:0")
    assert opsnn.context().device.type == "cpu"
    with pytest.raises(ParamInvalidError, match="cuda"):
        opsnn.Device("cuda")
    with pytest.raises(ParamInvalidError):
        opsnn.Device("cpu:x")


def test_stream_runs_asynchronously_and_host_goes_on():
    s = opsnn.Stream()
    x = opsnn.tensor(np.ones(20_000, np.float64))
    run("Spin", x, iters=1)  # compile outside the measurement
    s.synchronize()
    y = run("Spin", x, stream=s, iters=2000)
    assert not s.query(), "launch should return before the kernel finishes"
    host_ran = sum(range(1000))  # the host keeps working meanwhile
    s.synchronize()
    assert s.query() and host_ran == 499500
    assert np.isfinite(y.numpy()[0])


def test_two_streams_overlap():
    events = []
    unsubscribe = opsnn.hooks.subscribe("kernel", lambda ev: events.append(ev))
    try:
        x = opsnn.tensor(np.ones(20_000, np.float64))
        s1, s2 = opsnn.Stream(), opsnn.Stream()
        run("Spin", x, stream=s1, iters=3000)
        run("Spin", x, stream=s2, iters=3000)
        s1.synchronize()
        s2.synchronize()
    finally:
        unsubscribe()
    spins = [e for e in events if e["op"] == "Spin"]
    assert len(spins) == 2
    a, b = spins
    assert a["stream"] != b["stream"]
    # both kernels were running at the same time: their intervals intersect
    assert a["start"] < b["end"] and b["start"] < a["end"], "kernels on two streams did not overlap"


def test_stream_keeps_order():
    ORDER.clear()
    s = opsnn.Stream()
    x = opsnn.tensor(np.zeros(4, np.float32))
    for i in range(200):
        run("Log", x, stream=s, tag=i)
    s.synchronize()
    assert ORDER == list(range(200))


def test_sixteen_streams():
    streams = [opsnn.Stream() for _ in range(16)]
    outs = []
    for i, s in enumerate(streams):
        with s:
            outs.append(run("Log", opsnn.tensor(np.full(3, i, np.float32))))
    assert opsnn.current_stream() is opsnn.context().default_stream
    for s in streams:
        s.synchronize()
    assert [o.numpy()[0] for o in outs] == list(range(16))


def test_current_stream_context_manager():
    s = opsnn.Stream()
    with s:
        assert opsnn.current_stream() is s
        inner = opsnn.Stream()
        with inner:
            assert opsnn.current_stream() is inner
        assert opsnn.current_stream() is s
    assert opsnn.current_stream() is opsnn.context().default_stream


def test_cross_stream_dependency_is_respected():
    """A tensor produced on one stream and consumed on another waits for its producer."""
    s1, s2 = opsnn.Stream(), opsnn.Stream()
    ORDER.clear()
    x = opsnn.tensor(np.ones(10_000, np.float64))
    y = run("Spin", x, stream=s1, iters=500)  # slow producer
    z = run("Log", y, stream=s2, tag=7)  # consumer on another stream
    s2.synchronize()
    assert s1.query(), "consumer finished before its producer"
    np.testing.assert_array_equal(z.numpy(), y.numpy())


def test_kernel_error_surfaces_at_synchronize_and_stream_stays_usable(no_leak):
    s = opsnn.Stream()
    x = opsnn.tensor(np.ones(3, np.float32))
    y = run("Fail", x, stream=s)  # returns at once
    with pytest.raises(KernelError, match="Fail"):
        y.numpy()  # reading a tensor whose kernel failed never gives garbage
    with pytest.raises(KernelError, match="Fail.*deliberate failure"):
        s.synchronize()
    s.synchronize()  # the error was reported once
    z = run("Log", x, stream=s)
    s.synchronize()
    np.testing.assert_array_equal(z.numpy(), x.numpy())
    del x, y, z


def test_kernel_error_on_default_stream_raises_immediately():
    x = opsnn.tensor(np.ones(3, np.float32))
    with pytest.raises(KernelError, match="Fail"):
        run("Fail", x)
    assert run("Log", x).numpy().sum() == 3


def test_threads_sharing_the_default_stream_neither_hang_nor_see_each_others_errors():
    """The default stream runs work on the calling thread, and every thread shares it. Its counters
    were updated without a lock: a thread finishing its (earlier) kernel after another's set the
    completed count backwards, and synchronize() then waited forever (two threads generating with
    one LLaMA model hung); a synchronize() waiting on the other thread's kernel must be woken when
    it ends. A kernel error belongs to the thread that ran it."""
    x = opsnn.tensor(np.arange(4096, dtype=np.float32) - 2048)
    ref = np.maximum(x.numpy(), 0)
    spin_x = opsnn.tensor(np.ones(20_000, np.float64))
    run("Spin", spin_x, iters=1)  # compiled before the threads start
    wrong, errors, finished = [0, 0], [0, 0], [False, False]

    def work(i):
        for k in range(400):
            if i == 1 and k % 50 == 0:
                try:
                    run("Fail", x)
                except KernelError:
                    errors[i] += 1
            if i == 1 and k % 4 == 0:
                run("Spin", spin_x, iters=300)  # a longer kernel (GIL released) the other thread's sync sees
            wrong[i] += not np.array_equal(opsnn.ops.relu(x).numpy(), ref)
            opsnn.current_stream().synchronize()
        finished[i] = True

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        sys.setswitchinterval(old)
    assert finished == [True, True], "a thread hung in synchronize()"
    assert wrong == [0, 0] and errors == [0, 8]
    opsnn.current_stream().synchronize()  # nothing left over for this thread either


def test_events_order_streams_and_time():
    s1, s2 = opsnn.Stream(), opsnn.Stream()
    x = opsnn.tensor(np.ones(10_000, np.float64))
    start = opsnn.Event().record(s1)
    run("Spin", x, stream=s1, iters=300)
    done = s1.record_event()
    assert isinstance(done, opsnn.Event)
    ORDER.clear()
    s2.wait_event(done)
    run("Log", x, stream=s2, tag=1)
    s2.synchronize()
    assert done.query()
    assert start.elapsed_ms(done) > 0
    done.synchronize()


def test_finalize_closes_streams_and_threads():
    opsnn.finalize()
    before = threading.active_count()
    opsnn.init()
    streams = [opsnn.Stream() for _ in range(4)]
    assert threading.active_count() == before + 4
    x = opsnn.tensor(np.ones(10, np.float64))
    for s in streams:
        run("Spin", x, stream=s, iters=10)
    opsnn.finalize()  # waits for queued work, joins the workers
    assert threading.active_count() == before
    with pytest.raises(NotInitializedError):
        run("Log", x)
    opsnn.init()


# -- memory pool ------------------------------------------------------------------------------
def test_pool_alignment_reuse_and_summary(no_leak):
    pool = opsnn.context().pool
    before = pool.summary()
    ts = [opsnn.empty((n,), "float32") for n in (1, 7, 1000, 12345)]
    for t in ts:
        assert t.numpy().ctypes.data % 64 == 0
    s = opsnn.memory.summary()
    assert s["current_bytes"] >= before["current_bytes"] + 4 * (1 + 7 + 1000 + 12345)
    assert s["peak_bytes"] >= s["current_bytes"]
    assert s["largest_blocks"][0]["bytes"] >= 12345 * 4
    del ts, t
    gc.collect()
    reuses = pool.summary()["reuses"]
    t = opsnn.empty((12345,), "float32")
    assert pool.summary()["reuses"] == reuses + 1, "a freed block of the same size class is reused"
    del t


@pytest.mark.parametrize("dtype", ["float32", "bool", "int8", "complex64", "float16", "bfloat16", "S3", "object"])
def test_pool_arrays_of_every_dtype_and_their_views_own_the_block(dtype, no_leak):
    # numeric arrays come straight from the block's array interface, other types (bfloat16,
    # byte strings) as a view of its bytes; object arrays never live in raw pool memory
    from opsnn.tensor import _alloc_array

    dt = np.dtype(opsnn.dtypes.get(dtype)) if dtype not in ("S3", "object", "complex64") else np.dtype(dtype)
    a = _alloc_array((3, 5), dt, "test")
    assert a.shape == (3, 5) and a.dtype == dt and a.flags.c_contiguous and a.flags.writeable
    if dt.hasobject:
        a[...] = "x"  # Python objects: a plain numpy array
        return
    assert a.ctypes.data % 64 == 0
    used = opsnn.memory.current_bytes()
    v = a[1:].T[::2]  # a view of a view
    del a
    gc.collect()
    assert opsnn.memory.current_bytes() == used, "block freed while a view of a view still uses it"
    del v
    gc.collect()
    assert opsnn.memory.current_bytes() < used


def test_numpy_view_keeps_block_alive():
    t = opsnn.tensor(np.arange(1000, dtype=np.float32))
    view = t.numpy()
    used = opsnn.memory.current_bytes()
    del t
    gc.collect()
    assert opsnn.memory.current_bytes() == used, "block freed while a numpy view still uses it"
    u = opsnn.empty((1000,), "float32")
    u.numpy()[:] = -1
    assert view[5] == 5
    del view, u


def test_garbage_collection_inside_an_allocation_frees_later_not_deadlocks(monkeypatch):
    """A collection started by numpy inside the pool's critical section runs finalizers (a
    tensor's storage frees its block) on the same thread: their frees are queued and done when
    the section ends. The lock used to be taken twice there: a hang seen in the LLM bench."""
    from opsnn.runtime import memory

    pool = memory.MemoryPool()  # a private pool: a deadlock here cannot block other tests
    events = []

    class Holder:  # in a reference cycle: freed only by the cycle collector
        def __del__(self):
            pool.free(self.block)

    gc.collect()
    h = Holder()
    h.block, h.me = pool.allocate(12000, "cycle"), h
    held = pool.current_bytes
    del h
    real = memory.Block.__init__

    def collecting(self, *a, **k):
        gc.collect()  # what an allocation inside Block() may trigger
        real(self, *a, **k)

    monkeypatch.setattr(memory.Block, "__init__", collecting)
    monkeypatch.setattr(memory.hooks, "active", True)
    monkeypatch.setattr(memory.hooks, "emit", lambda kind, info: events.append((kind, info["bytes"])))
    done = []
    th = threading.Thread(target=lambda: done.append(pool.allocate(3 * 1024 * 1024 + 17, "big")), daemon=True)
    th.start()
    th.join(10)
    assert done, "allocate deadlocked on a finalizer's free"
    block = done[0]
    assert pool.current_bytes == block.size and held == memory.size_class(12000)
    assert sorted(events) == sorted([("alloc", block.size), ("free", held)])  # the queued free is reported
    assert not pool._deferred and not pool._busy
    pool.free(block)
    assert pool.current_bytes == 0


def test_thousands_of_frees_queued_by_a_collection_drain_without_recursion(monkeypatch):
    """A collection inside the pool's critical section can queue thousands of frees (a model's
    worth of tensors in reference cycles); they are carried out by one loop when the section
    ends, not by nested calls (the LLM bench once died of 'maximum recursion depth exceeded')."""
    from opsnn.runtime import memory

    pool = memory.MemoryPool()
    n = 3 * sys.getrecursionlimit()

    class Holder:
        def __del__(self):
            pool.free(self.block)

    gc.collect()
    for _ in range(n):
        h = Holder()
        h.block, h.me = pool.allocate(256, "cycle"), h
    del h
    real = memory.Block.__init__

    def collecting(self, *a, **k):
        gc.collect()
        real(self, *a, **k)

    monkeypatch.setattr(memory.Block, "__init__", collecting)
    block = pool.allocate(1 << 20, "big")  # a new size class: builds a Block, which collects
    assert not pool._deferred and pool.current_bytes == block.size
    pool.free(block)
    assert pool.current_bytes == 0 and pool.summary()["frees"] == n + 1


def test_empty_cache_and_cap():
    gc.collect()
    opsnn.memory.empty_cache()
    reserved = opsnn.memory.summary()["reserved_bytes"]
    t = opsnn.empty((1 << 20,), "uint8")
    del t
    gc.collect()
    assert opsnn.memory.summary()["reserved_bytes"] > reserved
    opsnn.memory.empty_cache()
    assert opsnn.memory.summary()["reserved_bytes"] == reserved
    opsnn.memory.set_cap(reserved + (1 << 20))
    try:
        with pytest.raises(OutOfMemoryError) as err:
            opsnn.empty((8 << 20,), "uint8")
        msg = str(err.value)
        assert "8388608 bytes" in msg and "cap" in msg and "in use" in msg
    finally:
        opsnn.memory.set_cap(None)
    with pytest.raises(ParamInvalidError):
        opsnn.memory.set_cap(-5)


def test_live_bytes_return_to_baseline_after_failures(no_leak):
    x = opsnn.tensor(np.ones(100, np.float32))
    for _ in range(3):
        with pytest.raises(KernelError):
            run("Fail", x)
        with pytest.raises(ParamInvalidError):
            opsnn.ops.run_op("Log", [x], {"bogus": 1}, domain="test")
    del x


def test_pin_memory_flag():
    t = opsnn.empty((256,), "float32").pin_memory()
    assert isinstance(t.is_pinned, bool)
    assert t.pin_memory() is t


def test_timing_helper_is_monotonic():
    # Event.elapsed_ms between two events on the default (inline) stream
    a = opsnn.Event().record()
    time.sleep(0.01)
    b = opsnn.Event().record()
    assert a.elapsed_ms(b) >= 5


# -- threads per kernel (runtime.threads): every core when quiet, fewer when other processes hold cores ----------
def test_thread_policy_follows_other_runnable_tasks():
    from opsnn.runtime import threads as T

    load = [0]
    clock = [0.0]
    pol = T.ThreadPolicy("auto", sampler=lambda: load[0], clock=lambda: clock[0])
    cores = T.cores()
    assert pol.threads() == cores and pol.mode == "auto"
    load[0] = cores + 3  # a busy machine: at least one thread, once every sample in the window shows it
    for i in range(T.WINDOW):
        clock[0] += T.SAMPLE_S
        got = pol.threads()
        assert got == (1 if i == T.WINDOW - 1 else cores)
    load[0] = 0  # a blip of quiet is enough to go back up (min over the window)
    clock[0] += T.SAMPLE_S / 2
    assert pol.threads() == 1  # not sampled again before SAMPLE_S
    clock[0] += T.SAMPLE_S
    assert pol.threads() == cores
    # no /proc: every core
    assert T.ThreadPolicy("auto", sampler=lambda: None).threads() == cores


def test_thread_policy_fixed_and_bad_settings():
    from opsnn.runtime import threads as T

    pol = T.ThreadPolicy("3", sampler=lambda: 99)
    assert pol.threads() == 3 and pol.mode == 3  # a fixed count ignores the load
    pol.set("auto")
    assert pol.mode == "auto"
    for bad in (0, -1, "two", 1.5, True):
        with pytest.raises(ParamInvalidError, match="int >= 1 or 'auto'"):
            T.ThreadPolicy(bad)
    try:
        opsnn.set_num_threads(1)
        assert opsnn.get_num_threads() == 1
    finally:
        opsnn.set_num_threads("auto")


def test_kernels_under_load_use_fewer_threads_and_plans_are_not_affected(monkeypatch):
    from opsnn.runtime import threads as T
    from opsnn.runtime.blas import get_blas_threads

    s = opsnn.current_stream()
    # the quiet state first: under the real policy on a loaded machine, an earlier launch may
    # have left OpenBLAS at fewer threads than a quiet launch sets
    monkeypatch.setattr(T, "policy", T.ThreadPolicy("auto", sampler=lambda: 0))
    s.launch(lambda: None)
    before = nb.get_num_threads()
    blas_before = get_blas_threads()
    seen = []
    monkeypatch.setattr(T, "policy", T.ThreadPolicy("auto", sampler=lambda: 100))  # every core taken
    s.launch(lambda: seen.append((nb.get_num_threads(), get_blas_threads())))
    assert seen == [(1, None if blas_before is None else 1)]
    assert nb.get_num_threads() == before  # the caller's own count is back: later plans see every core
    monkeypatch.setattr(T, "policy", T.ThreadPolicy("auto", sampler=lambda: 0))
    s.launch(lambda: seen.append((nb.get_num_threads(), get_blas_threads())))
    assert seen[1] == (before, blas_before)  # quiet again: every core, OpenBLAS back to its own count
    w = opsnn.Stream(num_threads=1)  # a worker stream's own limit still holds
    w.launch(lambda: seen.append((nb.get_num_threads(), None)))
    w.synchronize()
    w.close()
    assert seen[2][0] == 1


def test_others_running_sees_a_busy_process():
    import subprocess
    import sys

    from opsnn.runtime import threads as T

    if T.others_running() is None:
        pytest.skip("no /proc on this system")
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        counts = []
        for _ in range(10):
            counts.append(T.others_running())
            time.sleep(0.01)
        assert max(counts) >= 1  # the busy loop is runnable at every instant
    finally:
        hog.kill()
        hog.wait()


_SPIN_PROBE = r"""
import os, sys, time
first = sys.argv[1]
if first == "numpy":
    import numpy
import opsnn
import numpy as np
from opsnn import _blas_env
a = np.ones((512, 512), np.float32)
for _ in range(3):
    a @ a
time.sleep(0.03)
me = os.getpid()
spinning = 0
for tid in os.listdir("/proc/self/task"):
    if int(tid) == me:
        continue
    st = open(f"/proc/self/task/{tid}/stat", "rb").read()
    spinning += st[st.rfind(b")") + 2:st.rfind(b")") + 3] == b"R"
print(_blas_env.effective, os.environ["OPENBLAS_THREAD_TIMEOUT"], spinning)
"""


@pytest.mark.skipif(
    not os.path.exists("/proc/self/task") or (os.cpu_count() or 1) < 2,
    reason="needs Linux /proc and 2+ cores (a multi-threaded OpenBLAS)",
)
def test_openblas_workers_sleep_right_after_a_gemm():
    import subprocess
    import sys

    def probe(first, **env):
        e = {
            k: v
            for k, v in os.environ.items()
            if k not in ("OPENBLAS_THREAD_TIMEOUT", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
        }
        e.update(env)
        out = subprocess.run(
            [sys.executable, "-c", _SPIN_PROBE, first], env=e, capture_output=True, text=True, timeout=120, check=True
        ).stdout.split()
        return out[0], out[1], int(out[2])

    # opsnn imported first: the timeout is in effect and no BLAS worker is still spinning 30 ms on
    assert probe("opsnn") == ("True", "4", 0)
    # numpy first: too late for OpenBLAS, and opsnn says so
    assert probe("numpy")[:2] == ("False", "4")
    # a value the user set wins; with a long timeout the workers do spin (what the setting prevents)
    eff, val, spinning = probe("opsnn", OPENBLAS_THREAD_TIMEOUT="30")
    assert (eff, val) == ("True", "30") and spinning >= 1


GC_RUNNER = """
import gc, json, sys
if sys.argv[1] == "off":
    gc.disable()
class Held:  # alive before the import: frozen with it
    pass
held = Held()
import opsnn
print(json.dumps({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count(),
                  "held_listed": any(o is held for o in gc.get_objects())}))
"""


@pytest.mark.parametrize(
    "freeze, before, enabled, frozen",
    [("1", "on", True, True), ("1", "off", False, True), ("0", "on", True, False), ("0", "off", False, False)],
)
def test_import_freezes_what_it_made_and_leaves_the_collector_as_it_found_it(freeze, before, enabled, frozen):
    """``import opsnn`` pauses the garbage collector and freezes the objects alive at its end
    (``OPSNN_GC_FREEZE=0``: neither); a collector the process had turned off stays off."""
    import json
    import subprocess

    env = dict(os.environ, OPSNN_GC_FREEZE=freeze)
    out = subprocess.run(
        [sys.executable, "-c", GC_RUNNER, before], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["enabled"] is enabled
    assert (got["frozen"] > 50_000) is frozen and (got["frozen"] == 0) is (not frozen)
    assert got["held_listed"] is (not frozen)
