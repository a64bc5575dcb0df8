"""Memory summary per op, the leak checker, and guard bytes catching out-of-bounds writes."""

import gc

import numba as nb
import numpy as np
import pytest

import opsnn
from opsnn.errors import KernelError, MemoryCorruptionError
from opsnn.ops import Input, TensorMeta
from opsnn.tools import MemoryLeakError, memory_checker


@nb.njit(nogil=True, cache=True, boundscheck=False)
def _overrun(x, out, extra):
    n = out.size
    for i in range(n + extra):  # deliberately writes `extra` elements past the end
        out[i] = x[i % x.size]


if not opsnn.ops.has_op("Overrun", "test"):
    _rec = opsnn.register_op(
        "Overrun",
        domain="test",
        inputs=[Input("X")],
        outputs=["Y"],
        attrs=[("extra", "int", 0)],
        infer=lambda ctx: [TensorMeta(ctx.shape(0), ctx.dtype(0))],
        reference=lambda ins, attrs: ins[0].copy(),
    )
    _rec.kernel("overrun", priority=1)(
        lambda ins, outs, a, plan, ws: _overrun(ins[0].reshape(-1), outs[0].reshape(-1), a["extra"])
    )


def test_summary_reports_per_op_peaks_and_largest_tensors():
    opsnn.memory.reset_peak()
    x = opsnn.tensor(np.ones((256, 256), np.float32))
    y = opsnn.ops.relu(x)
    s = opsnn.memory.summary()
    relu = next(r for r in s["per_op"] if r["op"] == "Relu")
    assert relu["peak_bytes"] >= 256 * 256 * 4 and relu["allocations"] >= 1
    assert any(b["tag"] == "Relu" and b["requested"] == 256 * 256 * 4 for b in s["largest_blocks"])
    del x, y


def test_memory_checker_finds_leaks_with_op_and_stack():
    keep = []
    with memory_checker() as mc:
        x = opsnn.tensor(np.ones(1000, np.float32))
        keep.append(opsnn.ops.relu(x))
        tmp = opsnn.ops.relu(x)
        del tmp, x
    assert len(mc.leaks) == 1
    leak = mc.leaks[0]
    assert leak.op == "Relu" and leak.requested == 4000
    assert any("test_memory_checker_finds_leaks" in frame for frame in leak.stack)
    assert "Relu" in mc.report()
    with memory_checker() as clean:
        z = opsnn.ops.relu(opsnn.tensor(np.ones(10, np.float32)))
        del z
    assert clean.leaks == [] and clean.report() == "no leaks"
    with pytest.raises(MemoryLeakError, match="leaked"):
        with memory_checker(raise_on_leak=True):
            keep.append(opsnn.empty((64,), "float32"))


def test_guard_bytes_name_the_kernel_that_wrote_out_of_bounds():
    pool = opsnn.context().pool
    pool.set_debug_guards(64)
    try:
        x = opsnn.tensor(np.arange(128, dtype=np.float32))
        ok = opsnn.ops.run_op("Overrun", [x], {"extra": 0}, domain="test")[0]  # in bounds: fine
        np.testing.assert_array_equal(ok.numpy(), x.numpy())
        with pytest.raises(KernelError, match=r"Overrun \(kernel overrun\).*out of bounds.*512-byte") as err:
            opsnn.ops.run_op("Overrun", [x], {"extra": 3}, domain="test")
        assert isinstance(err.value.__cause__, MemoryCorruptionError)
        s = opsnn.Stream()  # on a worker stream the error surfaces at synchronize
        opsnn.ops.run_op("Overrun", [x], {"extra": 2}, domain="test", stream=s)
        with pytest.raises(KernelError, match="out of bounds"):
            s.synchronize()
    finally:
        pool.set_debug_guards(0)
        gc.collect()
