"""Collectives on opsnn tensors, in place, torch.distributed's signatures.

Each function takes opsnn Tensors (numpy arrays too) and writes the result into them. A contiguous
tensor's own memory goes to MPI; a non-contiguous one goes through a contiguous temporary that is
copied back before the collective counts as done. ``async_op=True`` returns a
:class:`~opsnn.distributed.work.Work` at once (``wait()``, ``is_completed()``); otherwise the call
returns when the result is in place. Every rank must call the same collectives in the same order
with tensors of the same shape and dtype::

    >>> import opsnn, opsnn.distributed as dist
    >>> dist.init_process_group()                        # doctest: +SKIP
    >>> t = opsnn.tensor([1.0, 2.0]) * (dist.get_rank() + 1)
    >>> dist.all_reduce(t)                               # doctest: +SKIP
    >>> t.tolist()  # on 2 ranks                         # doctest: +SKIP
    [3.0, 6.0]
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..errors import DistributedError, ParamInvalidError
from ..tensor import Tensor
from . import graph_ops as _graph_ops
from .group import _check_group, default_group, is_initialized
from .reduce_op import ReduceOp
from .work import Work


def _ordered_group():
    """The default group, once the kernels a compiled step queued (its AllReduceStart nodes) have
    launched their collectives: a collective called from Python then comes after them on every rank."""
    g = default_group()
    _graph_ops.order_after_graph_collectives()
    return g


def _array(t, what: str, arg: str) -> np.ndarray:
    """The memory of a tensor or array, once the kernel that writes it has finished."""
    if isinstance(t, Tensor):
        t._wait()
        return t._array
    if isinstance(t, np.ndarray):
        return t
    raise ParamInvalidError(f"{what}: {arg} must be an opsnn Tensor or a numpy array, got {type(t).__name__}", op=what)


def _written(t) -> None:
    if isinstance(t, Tensor):
        t._producer = None  # the collective writes it whole: a failed kernel's mark no longer applies


def _writable(arr: np.ndarray, what: str, arg: str) -> None:
    if not arr.flags.writeable:
        raise ParamInvalidError(f"{what}: {arg} is read-only; a collective writes its result into it", op=what)


def _staged(arr: np.ndarray) -> tuple[np.ndarray, bool]:
    """``arr`` itself when MPI can use its memory, else a contiguous copy (and True)."""
    if arr.flags.c_contiguous:
        return arr, False
    return np.ascontiguousarray(arr), True


def _reduce_op(op, what: str) -> ReduceOp:
    if isinstance(op, ReduceOp):
        return op
    try:
        return ReduceOp[str(op).upper()] if isinstance(op, str) else ReduceOp(op)
    except (KeyError, ValueError):
        names = ", ".join(o.name for o in ReduceOp)
        raise ParamInvalidError(f"{what}: op must be a ReduceOp ({names}), got {op!r}", op=what) from None


def _finish(work: Work, async_op: bool):
    if async_op:
        return work
    work.wait()
    return None


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """Combine ``tensor`` over every rank with ``op`` (SUM, AVG, MAX, MIN, PRODUCT, BAND, BOR, BXOR),
    the result in ``tensor`` on every rank."""
    _check_group(group, "all_reduce")
    g = _ordered_group()
    op = _reduce_op(op, "all_reduce")
    arr = _array(tensor, "all_reduce", "tensor")
    _writable(arr, "all_reduce", "tensor")
    g.check_dtype(arr.dtype, "all_reduce")
    g.reduction(arr.dtype, op, "all_reduce")  # refuses an op the dtype lacks here, not on the thread
    buf, staged = _staged(arr)
    _written(tensor)
    work = g.all_reduce(buf, op, (lambda: np.copyto(arr, buf)) if staged else None, staged)
    return _finish(work, async_op)


def broadcast(tensor, src: int, group=None, async_op: bool = False):
    """Copy rank ``src``'s ``tensor`` into ``tensor`` on every other rank."""
    _check_group(group, "broadcast")
    g = _ordered_group()
    src = _root(src, g.size, "broadcast", "src")
    arr = _array(tensor, "broadcast", "tensor")
    g.check_dtype(arr.dtype, "broadcast")
    if g.rank != src:
        _writable(arr, "broadcast", "tensor")
    buf, staged = _staged(arr)
    _written(tensor)
    after = (lambda: np.copyto(arr, buf)) if staged and g.rank != src else None
    return _finish(g.broadcast(buf, src, after, staged), async_op)


def all_gather(tensor_list: list, tensor, group=None, async_op: bool = False):
    """``tensor_list[r]`` receives rank ``r``'s ``tensor`` (a list of world-size tensors of its shape and dtype)."""
    _check_group(group, "all_gather")
    g = _ordered_group()
    arr = _array(tensor, "all_gather", "tensor")
    g.check_dtype(arr.dtype, "all_gather")
    outs = _tensor_list(tensor_list, g.size, arr, "all_gather", "tensor_list")
    inp, _ = _staged(arr)
    gathered = np.empty((g.size, *arr.shape), arr.dtype)

    def scatter_back():
        for out, part in zip(outs, gathered):
            np.copyto(out, part)

    for t in tensor_list:
        _written(t)
    return _finish(g.all_gather(gathered, inp, scatter_back, True), async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op: bool = False):
    """Every rank's ``input_tensor`` side by side in ``output_tensor``, rank 0 first: ``output_tensor``
    holds world-size times as many elements (its first dim stacked or concatenated)."""
    _check_group(group, "all_gather_into_tensor")
    g = _ordered_group()
    inp = _array(input_tensor, "all_gather_into_tensor", "input_tensor")
    out = _array(output_tensor, "all_gather_into_tensor", "output_tensor")
    _same_dtype(inp, out, "all_gather_into_tensor")
    g.check_dtype(inp.dtype, "all_gather_into_tensor")
    _writable(out, "all_gather_into_tensor", "output_tensor")
    if out.size != inp.size * g.size:
        raise ParamInvalidError(
            f"all_gather_into_tensor: output_tensor must hold world size ({g.size}) x {inp.size} elements, "
            f"got shape {out.shape}",
            op="all_gather_into_tensor",
        )
    send, staged_in = _staged(inp)
    recv, staged_out = _staged(out)
    _written(output_tensor)
    after = (lambda: np.copyto(out, recv)) if staged_out else None
    return _finish(g.all_gather(recv, send, after, staged_in or staged_out), async_op)


def reduce_scatter(output, input_list: list, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """``output`` on rank ``r`` receives ``input_list[r]`` combined over every rank with ``op``."""
    _check_group(group, "reduce_scatter")
    g = _ordered_group()
    op = _reduce_op(op, "reduce_scatter")
    out = _array(output, "reduce_scatter", "output")
    _writable(out, "reduce_scatter", "output")
    g.check_dtype(out.dtype, "reduce_scatter")
    g.reduction(out.dtype, op, "reduce_scatter")
    parts = _tensor_list(input_list, g.size, out, "reduce_scatter", "input_list", read_only=True)
    send = np.stack(parts) if parts else np.empty((0, *out.shape), out.dtype)
    recv, staged = _staged(out)
    _written(output)
    after = (lambda: np.copyto(out, recv)) if staged else None
    return _finish(g.reduce_scatter(recv, send, op, after, True), async_op)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """``input`` (world-size times ``output``'s elements) combined over every rank with ``op``; rank
    ``r`` keeps block ``r`` of the result in ``output``."""
    _check_group(group, "reduce_scatter_tensor")
    g = _ordered_group()
    op = _reduce_op(op, "reduce_scatter_tensor")
    inp = _array(input, "reduce_scatter_tensor", "input")
    out = _array(output, "reduce_scatter_tensor", "output")
    _same_dtype(inp, out, "reduce_scatter_tensor")
    g.check_dtype(out.dtype, "reduce_scatter_tensor")
    g.reduction(out.dtype, op, "reduce_scatter_tensor")
    _writable(out, "reduce_scatter_tensor", "output")
    if inp.size != out.size * g.size:
        raise ParamInvalidError(
            f"reduce_scatter_tensor: input must hold world size ({g.size}) x {out.size} elements, got shape {inp.shape}",
            op="reduce_scatter_tensor",
        )
    send, staged_in = _staged(inp)
    recv, staged_out = _staged(out)
    _written(output)
    after = (lambda: np.copyto(out, recv)) if staged_out else None
    return _finish(g.reduce_scatter(recv, send, op, after, staged_in or staged_out), async_op)


def barrier(group=None, async_op: bool = False):
    """Return once every rank has called ``barrier`` (after every collective launched before it)."""
    _check_group(group, "barrier")
    return _finish(_ordered_group().barrier(), async_op)


def run_on_rank0(fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` on rank 0 only, and return on every rank once it has finished:
    its result on rank 0, None on the others. If it raises on rank 0, rank 0 re-raises it and every
    other rank raises :class:`~opsnn.errors.DistributedError` with its message, so no rank goes on
    (or waits) as if it had worked. For checkpoints, which rank 0 alone writes and every rank may
    read once this returns::

        dist.run_on_rank0(opsnn.save_checkpoint, "ckpt.safetensors", model, optimizer, step=step)
        opsnn.load_checkpoint("ckpt.safetensors", model, optimizer)   # on every rank, to resume

    Without a process group (or in a world of one) it just calls ``fn``."""
    if not is_initialized() or default_group().size == 1:
        return fn(*args, **kwargs)
    g = _ordered_group()
    result = error = None
    if g.rank == 0:
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:  # every rank learns of it below
            error = exc
    message = f"{type(error).__name__}: {error}".encode() if error is not None else b""
    header = np.array([error is not None, len(message)], np.int64)
    broadcast(header, src=0)  # also keeps the other ranks here until rank 0 is done
    if header[0]:
        text = np.frombuffer(message, np.uint8).copy() if g.rank == 0 else np.empty(int(header[1]), np.uint8)
        broadcast(text, src=0)
        if error is not None:
            raise error
        name = getattr(fn, "__qualname__", repr(fn))
        raise DistributedError(f"{name} failed on rank 0: {text.tobytes().decode(errors='replace')}", op="run_on_rank0")
    return result


def _root(src, size: int, what: str, arg: str) -> int:
    if isinstance(src, bool) or not isinstance(src, (int, np.integer)) or not 0 <= src < size:
        raise ParamInvalidError(f"{what}: {arg} must be a rank in [0, {size}), got {src!r}", op=what)
    return int(src)


def _same_dtype(a: np.ndarray, b: np.ndarray, what: str) -> None:
    if a.dtype != b.dtype:
        raise ParamInvalidError(
            f"{what}: input and output dtypes differ ({_dt.name(a.dtype)} vs {_dt.name(b.dtype)})", op=what
        )


def _tensor_list(tensors, size: int, like: np.ndarray, what: str, arg: str, read_only: bool = False) -> list:
    if not isinstance(tensors, (list, tuple)) or len(tensors) != size:
        got = f"{len(tensors)} items" if isinstance(tensors, (list, tuple)) else type(tensors).__name__
        raise ParamInvalidError(f"{what}: {arg} must be a list of world size ({size}) tensors, got {got}", op=what)
    arrays = [_array(t, what, f"{arg}[{i}]") for i, t in enumerate(tensors)]
    for i, a in enumerate(arrays):
        if a.shape != like.shape or a.dtype != like.dtype:
            raise ParamInvalidError(
                f"{what}: {arg}[{i}] must be {_dt.name(like.dtype)}{list(like.shape)}, got {_dt.name(a.dtype)}{list(a.shape)}",
                op=what,
            )
        if not read_only:
            _writable(a, what, f"{arg}[{i}]")
    return arrays
