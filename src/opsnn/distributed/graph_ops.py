"""Collectives as graph ops: ``AllReduceStart`` / ``AllReduceWait`` (opsnn domain), the nodes a
compiled training step's backward holds for ``DistributedDataParallel``'s gradient buckets.

``AllReduceStart(x[, after]) -> buffer`` writes ``x / world_size`` into its output and launches a
non-blocking SUM allreduce of that output on the process group (its communication thread, or
inline progress: :mod:`opsnn.distributed.work`), then returns: the kernels after it (the rest of backward) run while the ranks communicate.
``AllReduceWait(buffer) -> y`` blocks until that allreduce is done and copies the result out.
The buffer is the start's output and the wait's input, so the memory planner keeps it alive (and
untouched by other values) from the start to the wait. ``after`` (optional) is the previous
bucket's buffer: a dependency only, never read, which keeps the starts in bucket order whatever a
pass does to the node order, so every rank issues the same collectives in the same order.

The two kernels find each other by the buffer's address and the node's ``bucket`` attribute. In
a world of one (or without a process group) the start only scales and the wait only copies::

    >>> import numpy as np, opsnn
    >>> from opsnn.distributed import graph_ops
    >>> x = opsnn.tensor(np.array([2.0, 4.0], np.float32))
    >>> y = graph_ops.all_reduce_wait(graph_ops.all_reduce_start(x))
    >>> y.tolist()
    [2.0, 4.0]
"""

from __future__ import annotations

import threading

import numpy as np

from .. import dtypes as _dt
from ..errors import InnerError
from ..ops import executor as _ex
from ..ops.registry import Attr, Input, Output, TensorMeta, get_op, has_op, register_op
from . import group as _group_mod
from .reduce_op import ReduceOp

DOMAIN = "opsnn"
_FLOATS = (_dt.float16, _dt.bfloat16, _dt.float32, _dt.float64)

#: (bucket, buffer address) -> the Work of a launched allreduce, until its wait
_pending: dict = {}
_lock = threading.Lock()
#: set once a collective op has run: Python-level collectives then wait for the current stream
#: first, so the graph's launches and the caller's keep one order on every rank
used = False


def _world(attrs, op: str) -> tuple:
    """(group or None, world size) at run time; refuses a graph traced for another world size."""
    want = int(attrs.get("world_size", 1))
    g = _group_mod._group
    size = 1 if g is None else g.size
    if size != want:
        raise InnerError(
            f"{op}: the graph was traced for a world of {want} rank(s), the process group has {size}; "
            "trace the step again in this world",
            op=op,
        )
    return g, size


def _start_infer(ctx):
    x = ctx.inputs[0]
    if len(tuple(x.shape)) != 1:
        ctx.fail(f"x must be a flat (1-D) bucket, got shape {tuple(x.shape)}")
    return [TensorMeta(tuple(x.shape), x.dtype)]


def _wait_infer(ctx):
    x = ctx.inputs[0]
    return [TensorMeta(tuple(x.shape), x.dtype)]


def _start_kernel(ins, outs, a, plan, ws):
    g, size = _world(a, "AllReduceStart")
    buf = outs[0]
    if size == 1:
        np.copyto(buf, ins[0])
        return
    np.copyto(buf, ins[0])
    g.divide_by_size(buf)  # before the sum, as the eager reducer does: the same bits on every path
    if buf.size == 0:
        return
    work = g.all_reduce(buf, ReduceOp.SUM)
    with _lock:
        _pending[int(a.get("bucket", 0)), buf.ctypes.data] = work


def _wait_kernel(ins, outs, a, plan, ws):
    _g, size = _world(a, "AllReduceWait")
    buf = ins[0]
    if size > 1 and buf.size:
        with _lock:
            work = _pending.pop((int(a.get("bucket", 0)), buf.ctypes.data), None)
        if work is None:
            raise InnerError(
                f"AllReduceWait: no allreduce of bucket {a.get('bucket', 0)} is in flight on this buffer "
                "(the wait must read the output of its AllReduceStart)",
                op="AllReduceWait",
            )
        work.wait()
    np.copyto(outs[0], buf)


_ATTRS = [
    Attr("bucket", "int", 0, "the gradient bucket's index (launch order)"),
    Attr("world_size", "int", 1, "the ranks the graph was traced for; the result is divided by it"),
]

if not has_op("AllReduceStart", DOMAIN):
    AllReduceStart = register_op(
        "AllReduceStart",
        domain=DOMAIN,
        category="collective",
        inputs=[Input("x", _FLOATS), Input("after", None, optional=True)],
        outputs=[Output("buffer")],
        attrs=_ATTRS,
        infer=_start_infer,
        reference=lambda ins, a: (ins[0] / int(a.get("world_size", 1))).astype(ins[0].dtype),
        doc="launch a non-blocking SUM allreduce of x / world_size (a flat gradient bucket) on the "
        "process group; the output is the buffer being reduced, read only by its AllReduceWait. "
        "'after' orders the starts (the previous bucket's buffer, not read). A world of one: x / 1",
    )
    AllReduceStart.kernel(
        "allreduce_start_mpi", priority=10, doc="copy, divide by the world size, MPI Iallreduce on the comm thread"
    )(_start_kernel)
    AllReduceWait = register_op(
        "AllReduceWait",
        domain=DOMAIN,
        category="collective",
        inputs=[Input("buffer", _FLOATS)],
        outputs=[Output("y")],
        attrs=_ATTRS,
        infer=_wait_infer,
        reference=lambda ins, a: np.array(ins[0]),
        doc="wait for the allreduce its AllReduceStart launched on this buffer, then copy the result out",
    )
    AllReduceWait.kernel("allreduce_wait_mpi", priority=10, doc="wait for the Work, copy the buffer")(_wait_kernel)


def _broadcast_kernel(ins, outs, a, plan, ws):
    g, size = _world(a, "Broadcast")
    np.copyto(outs[0], ins[0])
    if size > 1 and outs[0].size:
        g.broadcast(outs[0], int(a.get("src", 0))).wait()


def _broadcast_infer(ctx):
    x = ctx.inputs[0]
    return [TensorMeta(tuple(x.shape), x.dtype)]


if not has_op("Broadcast", DOMAIN):
    Broadcast = register_op(
        "Broadcast",
        domain=DOMAIN,
        category="collective",
        inputs=[Input("x")],
        outputs=[Output("y")],
        attrs=[
            Attr("src", "int", 0, "the rank whose x every rank receives"),
            Attr("world_size", "int", 1, "the ranks the graph was traced for"),
        ],
        infer=_broadcast_infer,
        reference=lambda ins, a: np.array(ins[0]),
        doc="rank src's x on every rank (blocking): DistributedDataParallel's per-step broadcast of "
        "buffers (BatchNorm's running statistics) in a compiled training step. A world of one: a copy",
    )
    Broadcast.kernel("broadcast_mpi", priority=10, doc="copy, then MPI broadcast on the comm thread and wait")(
        _broadcast_kernel
    )


def all_reduce_start(x, after=None, bucket: int = 0, world_size: int = 1):
    """Record/run one ``AllReduceStart`` (see the module docstring); returns the buffer tensor."""
    global used
    used = True
    return _ex.call(
        get_op("AllReduceStart", DOMAIN), [x, after], {"bucket": int(bucket), "world_size": int(world_size)}
    )


def all_reduce_wait(buffer, bucket: int = 0, world_size: int = 1):
    """Record/run one ``AllReduceWait``; returns the reduced (averaged) bucket."""
    return _ex.call(get_op("AllReduceWait", DOMAIN), [buffer], {"bucket": int(bucket), "world_size": int(world_size)})


def order_after_graph_collectives() -> None:
    """Before a collective launched from Python: let the current stream's queued kernels (a
    compiled step's AllReduceStart nodes) launch theirs first, the same order on every rank."""
    if not used:
        return
    from ..runtime import current_stream

    s = current_stream()
    if not s.inline and s._thread is not threading.current_thread():
        s.synchronize()


__all__ = ["all_reduce_start", "all_reduce_wait", "order_after_graph_collectives"]
