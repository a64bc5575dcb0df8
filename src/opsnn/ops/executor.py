"""Prepare/execute: ``prepare`` decides everything once, ``Executor.run`` only launches.

``prepare`` validates inputs and attributes, infers output shapes, selects the kernel,
computes its plan (tiling, packed weights) and workspace size, and binds output
tensors. Eager calls reuse executors through a signature-keyed cache.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from .. import dtypes as _dt
from ..errors import KernelError, OpsnnError, OutOfMemoryError, ParamInvalidError
from ..kernels.cpu.gemm import bf16_to_f32, f32_to_bf16
from ..runtime import hooks
from ..runtime.context import context
from ..runtime.memory import check_request
from ..runtime.stream import current_stream
from ..tensor import Tensor, _alloc_array, as_tensor
from .registry import InferContext, OpRecord, TensorMeta, select_kernel, selector_key, version

_MAX_CACHE = 4096
_tracer = None  # set by graph.tracing while a function is traced
_autograd = None  # set by opsnn.autograd: records eager calls whose inputs require grad
_autograd_will_record = None  # set by opsnn.autograd: whether an eager call of (rec, tensors) will be recorded
_autograd_grad_enabled = None  # set by opsnn.autograd: whether grad mode is on (its no_grad / enable_grad)
_autocast = None  # set by opsnn.amp while an autocast region is open: casts an eager call's inputs
_cache: OrderedDict[tuple, Executor] = OrderedDict()


def clear_cache() -> None:
    _cache.clear()


# a finalized runtime's executors hold its streams and pool blocks: drop them all
hooks.subscribe("finalize", lambda ev: clear_cache())


def cache_info() -> dict:
    return {"entries": len(_cache), "capacity": _MAX_CACHE}


def _freeze(v):
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, np.ndarray):
        return (v.shape, v.dtype.str, v.tobytes())
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, Tensor):
        return _freeze(v.numpy())
    if hasattr(v, "SerializeToString"):  # protobuf attribute values (e.g. an ONNX TensorProto)
        return (type(v).__name__, v.SerializeToString())
    return v


def _attrs_key(attrs: dict) -> tuple:
    if not attrs:
        return ()
    # lists of ints are the common unhashable attribute: turn them into tuples cheaply first
    key = tuple((k, tuple(v) if type(v) is list else v) for k, v in attrs.items())
    try:
        hash(key)
        return key
    except TypeError:
        return tuple((k, _freeze(v)) for k, v in attrs.items())


#: workspaces up to this many bytes are plain numpy scratch, not pool blocks (see Executor._workspace)
SMALL_WORKSPACE = 4096


def _default_num_outputs(rec: OpRecord) -> int:
    return max(1, sum(1 for o in rec.outputs if not o.optional and not o.variadic))


class Executor:
    """A prepared op: the chosen kernel, its plan and workspace size, bound tensors.

    ``run(workspace=None, stream=None)`` launches asynchronously on ``stream`` (default:
    the current stream) and returns the output tensor(s); call it again after writing
    new data into the input tensors, or pass ``inputs=[...]`` of the same signature.

    >>> import opsnn, numpy as np
    >>> x = opsnn.tensor(np.ones((2, 3), np.float32))
    >>> ex = opsnn.aclnn.relu.prepare(x)
    >>> ex.workspace_size, ex.kernel_name
    (0, 'relu_numba')
    >>> y = ex.run()
    """

    def __init__(
        self,
        rec: OpRecord,
        ctx: InferContext,
        selection,
        plan,
        workspace_size: int,
        inputs: list,
        outputs: list | None,
        signature: tuple,
    ):
        self.op = rec
        self.attrs = ctx.attrs
        self.input_metas = ctx.inputs
        self.output_metas = ctx.outputs
        self.num_outputs = ctx.num_outputs
        self.kernel = selection.kernel
        self.reason = selection.reason
        self.rejected = selection.rejected
        self.adapter = selection.adapter
        self.tiered = selection.tiered
        self.tiered_key = selection.tiered_key
        self.plan = plan
        self.workspace_size = int(workspace_size)
        self.inputs = inputs
        self.outputs = outputs
        self.signature = signature
        k = selection.kernel
        self._contig = [not k.strided and t is not None and not t._array.flags.c_contiguous for t in inputs]
        self._strided_out = outputs is not None and not all(o._array.flags.c_contiguous for o in outputs)
        self._info = {"kernel": k.name, "fallback": k.fallback, "flops": _flops(rec, ctx), "bytes": _bytes(ctx)}
        self.repeatable = not rec.dynamic_shape

    @property
    def kernel_name(self) -> str:
        return self.kernel.name

    def __repr__(self) -> str:
        return (
            f"<Executor {self.op.name} kernel={self.kernel.name} workspace={self.workspace_size}B "
            f"outputs={[m.shape for m in self.output_metas or []]}>"
        )

    def explain(self) -> str:
        lines = [f"{self.op.name}: kernel {self.kernel.name} — {self.reason}"]
        if self.adapter:
            lines.append("  16-bit inputs computed in float32 (adapter), stored back in 16-bit")
        if self.kernel.fallback:
            lines.append("  WARNING: running the numpy reference implementation (no fast kernel applies)")
        return "\n".join(lines)

    # -- running ---------------------------------------------------------------------------
    def run(self, workspace=None, stream=None, *, inputs=None):
        if inputs is not None:
            self.inputs = self._rebind(inputs)
        if self.op.dynamic_shape:
            self.outputs = self._run_dynamic(self.inputs, stream)
        else:
            self.launch(self.inputs, self.outputs, workspace, stream)
        return self.result(self.outputs)

    def bound_kernel(self):
        """The kernel call on this executor's bound inputs and outputs as a closure that runs
        where it is called: no stream, no observers, no dependency tracking, the workspace
        allocated once and held by the closure. For callers that replay a chain of executors on
        fixed buffers as one stream task (opsnn.llm's decode steps); ``run`` is the general path."""
        if self.op.dynamic_shape or self.outputs is None:
            raise ParamInvalidError(
                f"{self.op.name}: bound_kernel needs an executor with fixed outputs", op=self.op.name
            )
        return self._task(
            [None if t is None else t._array for t in self.inputs],
            [o._array for o in self.outputs],
            self._workspace(None),
        )

    def result(self, outs):
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _rebind(self, inputs) -> list:
        tensors = [None if x is None else as_tensor(x) for x in inputs]
        if len(tensors) != len(self.inputs):
            raise ParamInvalidError(
                f"{self.op.name}: executor prepared for {len(self.inputs)} inputs, run() got {len(tensors)}",
                op=self.op.name,
            )
        for i, (new, old) in enumerate(zip(tensors, self.inputs)):
            if (new is None) != (old is None) or (
                new is not None and (new.shape != old.shape or new.dtype != old.dtype)
            ):
                got = None if new is None else (new.shape, _dt.name(new.dtype))
                want = None if old is None else (old.shape, _dt.name(old.dtype))
                raise ParamInvalidError(
                    f"{self.op.name}: run(inputs=...) input {i} is {got}; this executor was "
                    f"prepared for {want} — prepare a new executor",
                    op=self.op.name,
                )
        for i in self.op.host_inputs:
            if (
                i < len(tensors)
                and tensors[i] is not None
                and not np.array_equal(tensors[i].numpy(), self.inputs[i].numpy())
            ):
                raise ParamInvalidError(
                    f"{self.op.name}: host input {self.op.inputs[i].name!r} changed value; prepare a new executor",
                    op=self.op.name,
                )
        self._contig = [not self.kernel.strided and t is not None and not t._array.flags.c_contiguous for t in tensors]
        return tensors

    def new_outputs(self) -> list:
        return [Tensor(_alloc_array(m.shape, m.dtype, self.op.name)) for m in self.output_metas]

    def _task(self, ins: list, outs: list, ws):
        if not all(o.flags.c_contiguous for o in outs):
            # kernels write contiguous outputs: a strided out= view gets a contiguous temporary,
            # copied into the view after the kernel (its overlap was refused at prepare)
            views = outs
            outs = [o if o.flags.c_contiguous else _alloc_array(o.shape, o.dtype, f"{self.op.name}:out") for o in views]
            inner = self._task(ins, outs, ws)

            def task():
                inner()
                for v, t in zip(views, outs):
                    if v is not t:
                        np.copyto(v, t)

            return task
        fn, attrs, plan = self.kernel.fn, self.attrs, self.plan
        if any(self._contig):
            ins = list(ins)
            contig = self._contig

            def prepare_inputs(ins=ins, tag=f"{self.op.name}:contiguous input"):
                return [_pool_copy(a, a.dtype, tag) if c else a for a, c in zip(ins, contig)]
        else:
            prepare_inputs = None
        if self.adapter:

            def task(tag=f"{self.op.name}:fp32 adapter"):
                xs = prepare_inputs() if prepare_inputs else ins
                xs = [_widen(a, tag) if a is not None and _dt.is_low_precision(a.dtype) else a for a in xs]
                tmp = [_alloc_array(o.shape, _dt.float32, tag) if _dt.is_low_precision(o.dtype) else o for o in outs]
                fn(xs, tmp, attrs, plan, ws)
                with np.errstate(over="ignore"):  # values beyond the 16-bit range become inf, as cast does
                    for o, t in zip(outs, tmp):
                        if t is not o:
                            _narrow(t, o)
        elif prepare_inputs is not None:

            def task():
                fn(prepare_inputs(), outs, attrs, plan, ws)
        elif self.kernel.bind is not None:
            task = self.kernel.bind(ins, outs, attrs, plan, ws)
        else:

            def task():
                fn(ins, outs, attrs, plan, ws)

        return task

    def _workspace(self, workspace):
        if self.workspace_size == 0:
            return None
        if workspace is None:
            size = self.workspace_size
            if size <= SMALL_WORKSPACE and not context().pool.guard_bytes:
                # scratch of a few KB (LayerNorm's statistics): plain numpy memory (16-byte aligned;
                # kernels that want more align their views, as workspace_view does), several us less
                # a call than a pool block (guard mode keeps the pool's, whose guards catch overruns)
                return np.empty(size, np.uint8)
            return _alloc_array((size,), _dt.uint8, f"{self.op.name}:workspace")
        arr = workspace._array if isinstance(workspace, Tensor) else workspace
        if arr.nbytes < self.workspace_size:
            raise ParamInvalidError(
                f"{self.op.name}: workspace has {arr.nbytes} bytes, the executor needs {self.workspace_size}",
                op=self.op.name,
            )
        return arr.reshape(-1).view(np.uint8)

    def launch(self, ins: list, outs: list, workspace=None, stream=None) -> None:
        """Queue the kernel on ``stream`` over the given tensors (signature already checked)."""
        stream = stream or current_stream()
        arrays = []
        deps = None  # failure marks of inputs still in flight: checked when the kernel runs
        for t in ins:
            if t is None:
                arrays.append(None)
                continue
            p = t._producer
            if p is not None:
                if len(p) > 2:
                    if p[2]:  # its producer is known to have failed: its data is not valid
                        raise KernelError(
                            f"{self.op.name}: input {len(arrays)} was produced by {p[2][0]}, whose "
                            "kernel failed; write it again before using it",
                            op=self.op.name,
                        )
                    deps = [p[2]] if deps is None else deps + [p[2]]
                if p[0] is not stream:
                    stream.wait_stream_seq(p[0], p[1])
            arrays.append(t._array)
        oarrays = [o._array for o in outs]
        ws = self._workspace(workspace)
        pool = context().pool
        mark: list = []  # the kernel's name once it failed: its outputs keep reporting it when read
        try:
            if hooks.active or self.adapter or True in self._contig or pool.guard_bytes or self._strided_out:
                seq = self._launch_observed(stream, pool, arrays, oarrays, ins, outs, ws, mark, deps)
            else:  # the common eager case: the kernel itself with its arguments, no closure around it
                seq = stream.launch(
                    self.kernel.fn, self.op.name, self._info, (arrays, oarrays, self.attrs, self.plan, ws), mark, deps
                )
        except BaseException:
            if mark:  # an inline stream raised at once: bound outputs (out=) must not read as valid
                for o in outs:
                    o._producer = (stream, 0, mark)
            raise
        producer = (stream, seq, mark)
        for o in outs:
            o._producer = producer

    def _launch_observed(self, stream, pool, arrays, oarrays, ins, outs, ws, mark=None, deps=None) -> int:
        """The launch with a closure around the kernel: strided inputs made contiguous, the 16-bit
        adapter, guard-byte checks, observers' shapes and dtypes."""
        task = self._task(arrays, oarrays, ws)
        if pool.guard_bytes:
            task = _guarded(task, pool, f"{self.op.name} (kernel {self.kernel.name})")
        info = self._info
        if hooks.active:
            info = dict(
                info,
                shapes=[None if t is None else t.shape for t in ins],
                dtypes=[None if t is None else _dt.name(t.dtype) for t in ins],
                out_shapes=[o.shape for o in outs],
                attrs=self.attrs,
            )
            if self.kernel.fallback:
                hooks.emit("fallback", {"op": self.op.name, "reason": self.reason})
        return stream.launch(task, self.op.name, info, mark=mark, deps=deps)

    def _run_dynamic(self, ins: list, stream=None) -> list:
        """Ops whose output shape depends on data run synchronously (after their inputs)."""
        stream = stream or current_stream()
        arrays = [None if t is None else t.numpy() for t in ins]
        results: list = []

        def task():
            results.extend(self.kernel.fn(arrays, None, self.attrs, self.plan, None))

        stream.launch(task, self.op.name, self._info)
        stream.synchronize()
        outs = []
        for r in results[: self.num_outputs]:
            t = Tensor(_alloc_array(r.shape, r.dtype, self.op.name))
            np.copyto(t._array, r)
            outs.append(t)
        return outs


def _narrow(src: np.ndarray, dst: np.ndarray) -> None:
    """The adapter's float32 result ``src`` rounded into the 16-bit output ``dst``: bfloat16 by the
    Cast kernel's numba bit conversion (round to nearest even, as ml_dtypes' astype rounds, faster)."""
    if dst.dtype == _dt.bfloat16 and dst.flags.c_contiguous and src.flags.c_contiguous:
        flat = src.reshape(-1)
        f32_to_bf16(flat, flat.view(np.uint32), dst.reshape(-1).view(np.uint16))
    else:
        np.copyto(dst, src, casting="unsafe")


def _widen(a: np.ndarray, tag: str) -> np.ndarray:
    """The adapter's float32 copy of a 16-bit input in pool memory: bfloat16 by the Cast kernel's
    parallel numba bit shift (exact, NaN payloads kept, as ml_dtypes' astype; faster)."""
    if a.dtype == _dt.bfloat16 and a.flags.c_contiguous:
        t = _alloc_array(a.shape, np.dtype(np.float32), tag)
        bf16_to_f32(a.reshape(-1).view(np.uint16), t.reshape(-1).view(np.uint32))
        return t
    return _pool_copy(a, _dt.float32, tag)


def _pool_copy(a: np.ndarray, dtype, tag: str) -> np.ndarray:
    """A contiguous copy of ``a`` (cast to ``dtype``) in pool memory: a kernel's temporary as large
    as a (possibly expanded, zero-stride) input is counted against the cap."""
    t = _alloc_array(a.shape, np.dtype(dtype), tag)
    np.copyto(t, a, casting="unsafe")
    return t


def _check_writable_out(op: str, i: int, a: np.ndarray) -> None:
    """Refuse an ``out=`` view the kernel cannot write: read-only memory, or one whose elements
    share memory (an expanded, zero-stride view), where the result would depend on write order."""
    if not a.flags.writeable:
        raise ParamInvalidError(
            f"{op}: out[{i}] is read-only (e.g. an expanded or broadcast view); pass a writable tensor", op=op
        )
    extent = a.itemsize
    for stride, n in sorted((abs(st), n) for st, n in zip(a.strides, a.shape) if n > 1):
        if stride < extent:
            raise ParamInvalidError(
                f"{op}: out[{i}] of shape {a.shape} and strides {tuple(st // a.itemsize for st in a.strides)} "
                f"has elements that share memory (an expanded or overlapping view); more than one element "
                f"of an output may not refer to a single memory location",
                op=op,
            )
        extent += stride * (n - 1)


def _guarded(task, pool, who: str):
    def guarded_task():
        task()
        pool.check_guards(who)

    return guarded_task


def _flops(rec: OpRecord, ctx: InferContext) -> int:
    if rec.flops is None:
        return 0
    try:
        return int(rec.flops(ctx))
    except Exception:  # noqa: BLE001 - a cost model must never break prepare
        return 0


def _bytes(ctx: InferContext) -> int:
    """Bytes a kernel reads and writes (inputs + outputs), for the profiler's GB/s."""
    total = 0
    for m in list(ctx.inputs) + list(ctx.outputs or []):
        if m is not None and all(isinstance(d, (int, np.integer)) for d in m.shape):
            total += int(np.prod(m.shape)) * m.dtype.itemsize
    return total


def _metas_and_values(rec: OpRecord, tensors: list) -> tuple[list, list]:
    metas, values = [], []
    for i, t in enumerate(tensors):
        if t is None:
            metas.append(None)
            values.append(None)
            continue
        metas.append(TensorMeta(t.shape, t.dtype))
        spec = rec.input_spec(i)
        values.append(t.numpy() if spec.host else None)
    return metas, values


def _signature(rec: OpRecord, tensors: list, attrs: dict, algo, num_outputs) -> tuple:
    sig = []
    for i, t in enumerate(tensors):
        if t is None:
            sig.append(None)
            continue
        a = t._array
        if i in rec.host_inputs:
            sig.append((a.shape, a.dtype, a.strides, t.numpy().tobytes()))
        else:
            sig.append((a.shape, a.dtype, a.strides))
    return (id(rec), _attrs_key(attrs), tuple(sig), algo, num_outputs, selector_key(), version())


@dataclass
class OpPlan:
    """Everything prepare decides before any tensor is bound: inferred outputs, the kernel
    selection, its plan and workspace size (the graph compiler binds these to arena memory)."""

    ctx: InferContext
    selection: object
    plan: object
    workspace_size: int


def _absent_optional_last(rec: OpRecord, items: list) -> bool:
    """Whether the last of ``items`` is an absent (None) optional input, to drop; an absent required or
    variadic one (``Max(x, None)``, a graph's ``Max(x, "")``) stays, for check_inputs to refuse."""
    n = len(items)
    if not n or items[-1] is not None or n <= sum(1 for s in rec.inputs if not s.optional):
        return False
    return (n > len(rec.inputs) and not rec.inputs[-1].variadic) or rec.input_spec(n - 1).optional


def plan_op(
    rec: OpRecord,
    metas: list,
    values: list,
    attrs: dict | None,
    *,
    algo: str | None = None,
    num_outputs: int | None = None,
    device: str = "cpu",
) -> OpPlan:
    """Validate inputs (metas and host values) and attributes, infer outputs, select and plan
    the kernel. No memory is touched."""
    while _absent_optional_last(rec, metas):
        metas, values = metas[:-1], values[:-1]
    rec.check_inputs(metas)
    bound = rec.bind_attrs(attrs or {})
    n_out = num_outputs or (rec.output_count(values, bound) if rec.output_count else None) or _default_num_outputs(rec)
    if rec.outputs and rec.outputs[-1].variadic and bound.get("num_outputs", 0) is None:
        bound["num_outputs"] = n_out
    ctx = InferContext(rec, list(metas), bound, list(values), n_out, device)
    try:
        rec.run_infer(ctx)
    except OpsnnError:
        raise
    except (ValueError, IndexError, TypeError, KeyError) as exc:
        raise ParamInvalidError(f"{rec.name}: invalid inputs or attributes: {exc}", op=rec.name) from exc
    _check_output_bytes(rec, ctx)
    selection = select_kernel(rec, ctx, algo)
    k = selection.kernel
    try:
        plan = k.plan(ctx) if k.plan is not None else None
        ws = k.workspace(ctx, plan) if k.workspace is not None else 0
    except MemoryError as exc:
        if isinstance(exc, OutOfMemoryError):
            raise
        raise OutOfMemoryError(
            f"{rec.name}: planning kernel {k.name} ran out of host memory: {exc}", op=rec.name
        ) from None
    if ws:
        check_request(int(ws), f"{rec.name}: workspace of kernel {k.name}")
    return OpPlan(ctx, selection, plan, int(ws))


def _check_output_bytes(rec: OpRecord, ctx: InferContext) -> None:
    """Refuse outputs that cannot be allocated before any plan (index maps, tables) is built for them."""
    total = 0
    for m in ctx.outputs or []:
        if m is None or not all(isinstance(d, (int, np.integer)) for d in m.shape):
            return  # symbolic: sized when the graph is planned for real shapes
        total += math.prod(int(d) for d in m.shape) * m.dtype.itemsize
    if total:
        check_request(total, f"{rec.name}: outputs of shapes {[tuple(m.shape) for m in ctx.outputs]}")


def prepare(
    rec: OpRecord,
    inputs: list,
    attrs: dict | None = None,
    *,
    out=None,
    algo: str | None = None,
    num_outputs: int | None = None,
    signature: tuple | None = None,
) -> Executor:
    """Validate, infer, select a kernel and plan it; returns an :class:`Executor`."""
    t0 = time.perf_counter()
    ctx_rt = context()
    tensors = [None if x is None else as_tensor(x) for x in inputs]
    while _absent_optional_last(rec, tensors):
        tensors.pop()
    metas, values = _metas_and_values(rec, tensors)
    op = plan_op(rec, metas, values, attrs, algo=algo, num_outputs=num_outputs, device=ctx_rt.device.type)
    out_metas = op.ctx.outputs
    outputs = None
    if rec.dynamic_shape and out is not None:
        raise ParamInvalidError(
            f"{rec.name}: out= is not supported: the output's shape depends on the input "
            "data (it is allocated when the op runs)",
            op=rec.name,
        )
    if not rec.dynamic_shape:
        if out is not None:
            outs = list(out) if isinstance(out, (list, tuple)) else [out]
            if len(outs) != len(out_metas):
                raise ParamInvalidError(
                    f"{rec.name}: out= needs {len(out_metas)} tensors, got {len(outs)}", op=rec.name
                )
            outputs = []
            for i, (o, m) in enumerate(zip(outs, out_metas)):
                o = as_tensor(o)
                if o.shape != tuple(m.shape) or o.dtype != m.dtype:
                    raise ParamInvalidError(
                        f"{rec.name}: out[{i}] is {o.shape} {_dt.name(o.dtype)}, expected "
                        f"{tuple(m.shape)} {_dt.name(m.dtype)}",
                        op=rec.name,
                    )
                _check_writable_out(rec.name, i, o._array)
                outputs.append(o)
        else:
            outputs = [Tensor(_alloc_array(tuple(m.shape), m.dtype, rec.name)) for m in out_metas]
    if signature is None:
        signature = _signature(rec, tensors, attrs or {}, algo, num_outputs)
    ex = Executor(rec, op.ctx, op.selection, op.plan, op.workspace_size, tensors, outputs, signature)
    if hooks.active:
        k = op.selection.kernel
        hooks.emit(
            "prepare",
            {
                "op": rec.name,
                "kernel": k.name,
                "reason": op.selection.reason,
                "start": t0,
                "end": time.perf_counter(),
                "thread": threading.get_ident(),
                "fallback": k.fallback,
                "rejected": op.selection.rejected,
            },
        )
    return ex


def call(
    rec: OpRecord,
    inputs: list,
    attrs: dict | None = None,
    *,
    algo: str | None = None,
    num_outputs: int | None = None,
    stream=None,
):
    """Eager execution through the signature-keyed executor cache; returns new tensors."""
    tensors = [None if x is None else as_tensor(x) for x in inputs]
    if _autocast is not None:
        tensors = _autocast(rec, tensors)
    attrs = attrs or {}
    asked = None  # the output count the caller asked for, where more are made for the gradient rule
    saved = getattr(rec.gradient, "saved_outputs", 0) if rec.gradient is not None else 0
    swap = getattr(rec.gradient, "training_forward", None) if rec.gradient is not None else None
    pick = None  # the caller's outputs among those of the op run in its place
    if swap is not None and algo is None and _autograd_will_record is not None:
        # a recorded call runs the op its gradient rule prefers (Attention: Y and the logsumexp)
        alt = (
            swap(tensors, attrs, num_outputs or _default_num_outputs(rec))
            if _autograd_will_record(rec, tensors)
            else None
        )
        if alt is not None:
            rec, tensors, attrs, pick = alt
            num_outputs, saved = max(max(pick) + 1, _default_num_outputs(rec)), 0
    if saved and _autograd_will_record is not None and (num_outputs or _default_num_outputs(rec)) < saved:
        # the gradient rule reads outputs the caller did not ask for (MaxPool's Indices): make them now
        if _autograd_will_record(rec, tensors):
            asked, num_outputs = num_outputs or _default_num_outputs(rec), saved
    key = _signature(rec, tensors, attrs, algo, num_outputs)
    ex = _cache.get(key)
    if ex is None:
        ex = prepare(rec, tensors, attrs, algo=algo, num_outputs=num_outputs, signature=key)
        if len(_cache) >= _MAX_CACHE:
            _cache.popitem(last=False)
        _cache[key] = ex
        outs = ex.outputs
        ex.inputs = ex.outputs = None  # the cached executor must not pin this call's tensors
    elif rec.dynamic_shape:
        outs = None
    else:
        outs = ex.new_outputs()
    if rec.dynamic_shape:
        res = ex.result(ex._run_dynamic(tensors, stream))
    else:
        ex.launch(tensors, outs, None, stream)
        res = ex.result(outs)
    if _tracer is not None:
        _tracer.record(rec, tensors, attrs, num_outputs, res)
    if _autograd is not None:
        _autograd(rec, tensors, attrs, res)
    if pick is not None:
        return res[pick[0]] if len(pick) == 1 else tuple(res[i] for i in pick)
    if asked is not None:
        return res[0] if asked == 1 else res[:asked]
    return res
