"""``DistributedDataParallel``: one model replica per rank, gradients averaged across ranks during
backward by bucketed non-blocking allreduces (PyTorch DDP's Reducer, over ``opsnn.distributed``).

At construction the ranks compare a fingerprint of the model (every parameter's and buffer's
name, shape, dtype and ``requires_grad``) and rank 0's parameters and buffers are broadcast to
all. Parameters that require grad are split into buckets in *reverse* registration order (the
order backward produces their gradients), one dtype per bucket, the first bucket small (1 MB) so
communication starts early and the others up to ``bucket_cap_mb``. During backward each
parameter's post-accumulate-grad hook marks it ready; when every parameter of a bucket is ready
its gradients are in one contiguous buffer, divided by the world size (a gradient that is its
parameter's only one in the pass is written there, scaled, as autograd accumulates it, so its
``.grad`` holds the scaled local gradient until backward ends; others are copied in), and an
allreduce is launched while backward goes on. Buckets are
launched in index order only, so every rank issues the same collectives in the same order. A
callback queued on the backward pass waits for all of them when backward ends, and each
parameter's ``.grad`` becomes its slice of the reduced buffer (the average over ranks), so the
optimizer that follows sees finished gradients. Inside ``opsnn.compile(train_step)`` the same
hooks emit graph ops while the step is traced (``AllReduceStart`` when a bucket is ready,
``AllReduceWait`` before the update, ``Broadcast`` of train-mode buffers; docs/distributed.md).

Run under ``mpirun -np 2`` (or ``opsnn launch -n 2``)::

    import opsnn, opsnn.distributed as dist
    dist.init_process_group(backend="mpi")
    ddp = opsnn.nn.parallel.DistributedDataParallel(model)
    opt = opsnn.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    loss = opsnn.nn.functional.cross_entropy(ddp(x_shard), y_shard)
    loss.backward()            # gradients averaged over the ranks when this returns
    opt.step()

``ddp.state_dict()`` keys carry the ``module.`` prefix (the wrapped model is the submodule
``module``), as in torch; save ``ddp.module.state_dict()`` to get the plain model's keys.
"""

from __future__ import annotations

import contextlib
import json
import time
import weakref

import numpy as np

from ... import dtypes as _dt
from ...autograd import is_grad_enabled, queue_callback
from ...autograd.compiled import trace_key_hooks
from ...autograd.graph import LEAF, get_meta
from ...distributed import graph_ops as _graph_ops
from ...distributed.group import default_group
from ...errors import OpsnnRuntimeError, ParamInvalidError
from ...graph.tracing import active_tracer
from ...runtime import hooks
from ...tensor import Tensor, empty, zeros
from ..module import Module

#: the first bucket's size cap: a small first allreduce starts while most of backward is still to run
FIRST_BUCKET_BYTES = 1 << 20
#: rank 0's parameters and buffers are broadcast in flat chunks of at most this size
BROADCAST_BUCKET_BYTES = 250 << 20


#: every live DDP; a compiled step keys its graphs by which of them skip gradient sync (no_sync())
_live: weakref.WeakSet = weakref.WeakSet()


def _unsynced_key():
    off = sorted(id(d) for d in _live if not d.require_backward_grad_sync)
    return tuple(off) if off else None


trace_key_hooks.append(_unsynced_key)


class ModelMismatchError(ParamInvalidError):
    """The ranks handed ``DistributedDataParallel`` different models (a parameter or buffer whose
    name, shape, dtype or ``requires_grad`` differs, or is missing on some rank). Every rank raises
    it, with the same message."""


class UnusedParameterError(OpsnnRuntimeError):
    """A backward pass ended while some parameters that require grad had received no gradient and
    ``find_unused_parameters`` was False: their buckets could never be reduced."""


class ReducerStateError(OpsnnRuntimeError):
    """DDP was driven out of order: a second backward pass after one forward (the gradients
    were already reduced), which would leave the ranks' gradients different."""


class _Bucket:
    __slots__ = ("dtype", "flat", "index", "launched", "nbytes", "numel", "params", "pending", "slots", "work")

    def __init__(self, index: int, dtype):
        self.index, self.dtype = index, dtype
        self.params: list[int] = []  # indices into DDP's parameter list
        self.slots: list[tuple[int, int, int]] = []  # (param index, offset, numel) in the flat buffer
        self.numel = self.nbytes = 0
        self.pending = 0
        self.flat = self.work = None
        self.launched = False

    def add(self, i: int, p: Tensor) -> None:
        self.params.append(i)
        self.slots.append((i, self.numel, p.numel))
        self.numel += p.numel
        self.nbytes += p.nbytes


def assign_buckets(params: list, cap_bytes: int, first_cap_bytes: int = FIRST_BUCKET_BYTES) -> list[list[int]]:
    """Parameter indices per bucket: reverse order, one dtype per bucket, the first bucket of each
    dtype capped at ``min(first_cap_bytes, cap_bytes)`` and the rest at ``cap_bytes`` (a parameter
    larger than the cap gets a bucket of its own). Depends only on shapes and dtypes, so every
    rank holding the same model gets the same buckets.

    >>> import numpy as np
    >>> ps = [np.zeros(n, np.float32) for n in (100, 100, 300)]
    >>> assign_buckets(ps, cap_bytes=800, first_cap_bytes=400)
    [[2], [1, 0]]
    """
    open_: dict = {}  # dtype -> (indices, bytes, cap)
    done: list[list[int]] = []
    first_cap = min(first_cap_bytes, cap_bytes)
    for i in reversed(range(len(params))):
        p = params[i]
        dt = np.dtype(p.dtype)
        idx, size, cap = open_.get(dt, ([], 0, first_cap))
        idx.append(i)
        size += p.nbytes
        if size >= cap:
            done.append(idx)
            open_[dt] = ([], 0, cap_bytes)
        else:
            open_[dt] = (idx, size, cap)
    done.extend(idx for idx, _, _ in open_.values() if idx)
    # launch order: by the first (latest-registered) parameter each bucket holds
    return sorted(done, key=lambda b: -b[0])


def _fingerprint(module: Module) -> list:
    fp = [
        ["parameter", n, list(p.shape), _dt.name(p.dtype), bool(p.requires_grad)] for n, p in module.named_parameters()
    ]
    fp += [["buffer", n, list(b.shape), _dt.name(b.dtype), False] for n, b in module.named_buffers()]
    return fp


def _describe(entry) -> str:
    if entry is None:
        return "nothing"
    kind, _, shape, dtype, rg = entry
    return f"{tuple(shape)} {dtype}" + (f" requires_grad={rg}" if kind == "parameter" else "")


def _first_difference(prints: list) -> str | None:
    """A one-line account of the first parameter or buffer that differs between ranks, or None."""
    ref = prints[0]
    longest = max(len(p) for p in prints)
    for k in range(longest):
        entries = [p[k] if k < len(p) else None for p in prints]
        if all(e == entries[0] for e in entries):
            continue
        name_of = next(e for e in entries if e is not None)
        what = f"{name_of[0]} {name_of[1]!r} (position {k})"
        groups: dict = {}
        for r, e in enumerate(entries):
            groups.setdefault(_describe(e) if e is None or e[:2] == name_of[:2] else f"{e[0]} {e[1]!r}", []).append(r)
        parts = [f"{desc} on rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}" for desc, rs in groups.items()]
        return f"{what} is " + "; ".join(parts)
    if any(len(p) != len(ref) for p in prints):
        return "the ranks hold different numbers of parameters"
    return None


def _params_from_outputs(out, metas: dict) -> set:
    """Indices (values of ``metas``, keyed by autograd meta id) of the parameters ``out``'s graph reaches."""
    roots = []

    def collect(o):
        if isinstance(o, Tensor):
            m = get_meta(o)
            if m is not None and m.requires_grad:
                roots.append(m)
        elif isinstance(o, dict):
            for v in o.values():
                collect(v)
        elif isinstance(o, (tuple, list)):
            for v in o:
                collect(v)

    collect(out)
    found: set = set()
    stack, seen = [], set()
    for m in roots:
        if m.grad_fn is None:
            if id(m) in metas:
                found.add(metas[id(m)])
        elif id(m.grad_fn) not in seen:
            seen.add(id(m.grad_fn))
            stack.append(m.grad_fn)
    while stack:
        n = stack.pop()
        for e in n.edges:
            if e is None:
                continue
            if e[0] is LEAF:
                if id(e[1]) in metas:
                    found.add(metas[id(e[1])])
            elif id(e[0]) not in seen:
                seen.add(id(e[0]))
                stack.append(e[0])
    return found


class DistributedDataParallel(Module):
    """Wrap ``module`` for data-parallel training over the ranks of the default (or given)
    process group; call it as the module. See the module docstring for the protocol.

    Arguments, as torch's:

    - ``bucket_cap_mb``: the size cap of a gradient bucket in MiB (the first is at most 1 MiB).
    - ``broadcast_buffers``: broadcast rank 0's buffers (BatchNorm running statistics) at the
      start of every forward that will be followed by a synchronised backward.
    - ``find_unused_parameters``: find at forward time the parameters the output does not depend
      on and reduce them as if their gradient were zero (a parameter that got no gradient on any
      rank keeps ``.grad`` None); without it such a parameter makes backward raise
      :class:`UnusedParameterError`.
    - ``process_group``: the group to reduce over (default: the world).
    """

    def __init__(
        self,
        module: Module,
        bucket_cap_mb: float = 25,
        broadcast_buffers: bool = True,
        find_unused_parameters: bool = False,
        process_group=None,
    ):
        from ... import distributed as dist

        super().__init__()
        if not isinstance(module, Module):
            raise ParamInvalidError(
                f"DistributedDataParallel: module must be an opsnn.nn.Module, got {type(module).__name__}"
            )
        if not (isinstance(bucket_cap_mb, (int, float)) and bucket_cap_mb > 0):
            raise ParamInvalidError(f"DistributedDataParallel: bucket_cap_mb must be > 0, got {bucket_cap_mb!r}")
        self.module = module
        self._dist = dist
        self.process_group = process_group
        self.broadcast_buffers = bool(broadcast_buffers)
        self.find_unused_parameters = bool(find_unused_parameters)
        self.bucket_cap_mb = bucket_cap_mb
        self.world_size = dist.get_world_size(**self._group())
        self.rank = dist.get_rank(**self._group())
        self._progress = default_group().progress
        self.require_backward_grad_sync = True
        self._verify_same_model()
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        self._sync_module_states()
        cap = max(1, int(bucket_cap_mb * (1 << 20)))
        self._buckets = []
        self._bucket_of = [0] * len(self._params)
        for b, idx in enumerate(assign_buckets(self._params, cap)):
            bucket = _Bucket(b, self._params[idx[0]].dtype)
            for i in idx:
                bucket.add(i, self._params[i])
                self._bucket_of[i] = b
            self._buckets.append(bucket)
        self._metas = {id(get_meta(p)): i for i, p in enumerate(self._params)}
        self._slot_of = [(0, 0)] * len(self._params)  # (offset, numel) in its bucket's buffer
        for b in self._buckets:
            for i, off, n in b.slots:
                self._slot_of[i] = (off, n)
        self._sunk: list = [None] * len(self._params)  # the .grad a sink made this pass, per parameter
        self._state = "idle"  # idle -> armed (forward) -> reducing (first hook) -> reduced (end of backward)
        self._ready = [False] * len(self._params)
        self._next_bucket = 0
        self._events: list = []
        self.last_backward: dict = {}
        ref = weakref.ref(self)
        handles = [p.register_post_accumulate_grad_hook(_hook(ref, i)) for i, p in enumerate(self._params)]
        self._finalizer = weakref.finalize(self, _remove_all, handles)
        _live.add(self)

    # -- construction --------------------------------------------------------------------------------------
    def _group(self) -> dict:
        return {} if self.process_group is None else {"group": self.process_group}

    def _verify_same_model(self) -> None:
        """Compare the model's fingerprint across ranks; every rank raises the same error on a mismatch."""
        if self.world_size == 1:
            return
        blob = np.frombuffer(json.dumps(_fingerprint(self.module)).encode(), np.uint8)
        sizes = self._all_gather(np.array([blob.size], np.int64))
        width = int(sizes.max())
        padded = np.zeros(width, np.uint8)
        padded[: blob.size] = blob
        rows = self._all_gather(padded)
        prints = [json.loads(rows[r, : int(sizes[r, 0])].tobytes().decode()) for r in range(self.world_size)]
        diff = _first_difference(prints)
        if diff is not None:
            raise ModelMismatchError(
                f"DistributedDataParallel: the ranks hold different models: {diff} "
                "(every rank must build the same model before wrapping it)"
            )

    def _all_gather(self, arr: np.ndarray) -> np.ndarray:
        """(world_size, *arr.shape) array of every rank's ``arr``."""
        t = empty(arr.shape, arr.dtype)
        t.numpy()[...] = arr
        outs = [empty(arr.shape, arr.dtype) for _ in range(self.world_size)]
        self._dist.all_gather(outs, t, **self._group())
        return np.stack([o.numpy() for o in outs])

    def _sync_module_states(self) -> None:
        tensors = list(self.module.parameters()) + list(self.module.buffers())
        self._broadcast_coalesced(tensors)

    def _broadcast_coalesced(self, tensors: list) -> None:
        """Overwrite ``tensors`` in place with rank 0's values, in flat per-dtype chunks."""
        if self.world_size == 1:
            return
        by_dtype: dict = {}
        for t in tensors:
            if t.numel:
                by_dtype.setdefault(np.dtype(t.dtype), []).append(t)
        for dt, ts in by_dtype.items():
            chunk: list = []
            size = 0
            for t in ts + [None]:
                if t is not None and (not chunk or size + t.nbytes <= BROADCAST_BUCKET_BYTES):
                    chunk.append(t)
                    size += t.nbytes
                    continue
                self._broadcast_chunk(chunk, dt)
                chunk, size = ([t], t.nbytes) if t is not None else ([], 0)

    def _broadcast_chunk(self, chunk: list, dt) -> None:
        flat = empty((sum(t.numel for t in chunk),), dt)
        fa = flat.numpy()
        off = 0
        for t in chunk:
            fa[off : off + t.numel] = t.numpy().reshape(-1)
            off += t.numel
        self._dist.broadcast(flat, src=0, **self._group())
        if self.rank != 0:
            off = 0
            for t in chunk:
                t.numpy()[...] = fa[off : off + t.numel].reshape(t.shape)
                off += t.numel

    # -- forward ----------------------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        self._drain()
        sync = self.require_backward_grad_sync and is_grad_enabled()
        tracer = active_tracer()
        if sync and self.broadcast_buffers:
            buffers = list(self.module.buffers())
            if buffers and hasattr(tracer, "call_inplace") and self.module.training:
                self._broadcast_traced(tracer)
            elif buffers:
                self._broadcast_coalesced(buffers)
        out = self.module(*args, **kwargs)
        if sync:
            self._arm(out)
        else:
            self._sinks(False)
            self._state = "idle"
        return out

    def _broadcast_traced(self, tracer) -> None:
        """While tracing a training-mode forward: rank 0's buffers as in-place ``Broadcast`` nodes at
        the start of the graph (the buffers become state inputs), replayed before every forward."""
        from ...distributed.graph_ops import Broadcast

        for name, buf in self.module.named_buffers():
            if not buf.numel:
                continue
            tracer.call_inplace(
                Broadcast, [buf], {"src": 0, "world_size": self.world_size}, [buf], labels=[f"module.{name}"]
            )

    @contextlib.contextmanager
    def no_sync(self):
        """Forwards run inside skip the allreduce in their backward: gradients accumulate locally in
        ``.grad``; the first synchronised backward after it reduces the accumulated sums::

            for x in micro_batches[:-1]:
                with ddp.no_sync():
                    loss_fn(ddp(x)).backward()      # local accumulation, no communication
            loss_fn(ddp(micro_batches[-1])).backward()  # one allreduce per bucket, of the sums
            opt.step()
        """
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    # -- the reducer ----------------------------------------------------------------------------------------------
    def _arm(self, out) -> None:
        self._ready = [False] * len(self._params)
        for b in self._buckets:
            b.pending, b.flat, b.work, b.launched = len(b.params), None, None, False
        self._sinks(active_tracer() is None)  # a traced step flattens with graph ops instead
        self._next_bucket = 0
        self._events = []
        self._state = "armed"
        if self.find_unused_parameters:
            used = _params_from_outputs(out, self._metas)
            for i in range(len(self._params)):
                if i not in used:
                    self._mark_ready(i, "unused")

    def _on_grad_ready(self, i: int) -> None:
        if self._state == "idle":
            return  # no_sync, or a backward of something DDP's forward did not make
        if self._state == "reduced":
            raise ReducerStateError(
                f"DistributedDataParallel: a gradient for parameter {self._names[i]!r} arrived after this "
                "forward's gradients were already reduced (a second backward after one forward); run the "
                "forward again for each backward, or do the earlier backwards under no_sync()"
            )
        if self._state == "armed":
            self._state = "reducing"
            queue_callback(self._finish)
        if self._ready[i]:
            raise ReducerStateError(
                f"DistributedDataParallel: parameter {self._names[i]!r} was marked ready twice in one backward "
                "(with find_unused_parameters=True it was found unused at forward time but got a gradient)"
            )
        self._mark_ready(i, "grad")
        self._progress()  # buckets in flight advance between backward ops (inline progress)

    def _mark_ready(self, i: int, why: str) -> None:
        self._ready[i] = True
        self._events.append((why, self._names[i], time.perf_counter()))
        b = self._buckets[self._bucket_of[i]]
        b.pending -= 1
        if b.pending == 0 and self._state == "reducing":
            self._launch_ready()

    def _launch_ready(self) -> None:
        buckets = self._buckets
        while self._next_bucket < len(buckets) and buckets[self._next_bucket].pending == 0:
            self._launch(buckets[self._next_bucket])
            self._next_bucket += 1

    def _sinks(self, on: bool) -> None:
        """Allocate the buckets' buffers and let autograd write each parameter's only gradient of
        the pass into its slot (``on``), or stop it (``.grad`` a copy of the gradient again)."""
        ref = weakref.ref(self) if on else None
        for i, p in enumerate(self._params):
            get_meta(p).grad_sink = _sink(ref, i) if on else None
            self._sunk[i] = None
        if on:
            for b in self._buckets:
                b.flat = empty((b.numel,), b.dtype)

    def _sink(self, i: int, g: Tensor) -> Tensor:
        """Autograd's gradient ``g``, parameter ``i``'s only one this pass: into its bucket slot, scaled."""
        b = self._buckets[self._bucket_of[i]]
        off, n = self._slot_of[i]
        view = b.flat.numpy()[off : off + n].reshape(self._params[i].shape)
        np.divide(g.numpy(), self.world_size, out=view)
        self._sunk[i] = t = Tensor(view)
        return t

    def _launch(self, b: _Bucket) -> None:
        if active_tracer() is not None:
            return self._launch_traced(b)
        t0 = time.perf_counter()
        flat = b.flat if b.flat is not None else empty((b.numel,), b.dtype)
        fa = flat.numpy()
        for i, off, n in b.slots:
            g = self._params[i].grad
            if g is None:
                fa[off : off + n] = 0
            elif g is not self._sunk[i]:  # a sunk gradient is in its slot already, scaled
                np.divide(g.numpy().reshape(-1), self.world_size, out=fa[off : off + n])
        b.flat = flat
        b.work = self._dist.all_reduce(flat, op=self._dist.ReduceOp.SUM, async_op=True, **self._group())
        b.launched = True
        t1 = time.perf_counter()
        self._events.append(("launch", b.index, t1))
        # the profiler's timeline shows when each bucket left and how long backward waited at the end
        hooks.host_phase(f"DDP bucket {b.index} launch", "ddp", t0, t1, bytes=b.nbytes, params=len(b.params))

    def _launch_traced(self, b: _Bucket) -> None:
        """While opsnn.compile traces the step: the bucket as graph ops (flatten, ``AllReduceStart``
        after the previous bucket's start), run eagerly now and replayed by the compiled graph."""
        from ... import ops

        parts = []
        for i, _off, n in b.slots:
            g = self._params[i].grad
            parts.append(zeros((n,), b.dtype) if g is None else ops.reshape(g, [n]))
        flat = parts[0] if len(parts) == 1 else ops.concat(parts, 0)
        prev = self._buckets[b.index - 1].flat if b.index else None
        b.flat = _graph_ops.all_reduce_start(flat, prev, bucket=b.index, world_size=self.world_size)
        b.launched = True
        self._events.append(("launch", b.index, time.perf_counter()))

    def _finish_traced(self) -> None:
        """While tracing: ``AllReduceWait`` per bucket, in bucket order, then each parameter's
        ``.grad`` is its slice of the reduced bucket (the optimizer's update nodes read those)."""
        from ... import ops

        self._settle_unused(drain=False)
        used = None
        if self.find_unused_parameters:
            # which parameters the traced graph gives a gradient is fixed at tracing: agreed on now, once
            used = zeros((len(self._params),), "int32")
            used.numpy()[:] = [p.grad is not None for p in self._params]
            self._dist.all_reduce(used, op=self._dist.ReduceOp.SUM, **self._group())
            used = used.numpy()
        for b in self._buckets:
            y = _graph_ops.all_reduce_wait(b.flat, bucket=b.index, world_size=self.world_size)
            sizes = [n for _i, _off, n in b.slots]
            pieces = [y] if len(sizes) == 1 else ops.split(y, sizes, 0)
            for (i, _off, _n), piece in zip(b.slots, pieces):
                if used is not None and used[i] == 0:
                    continue  # no rank's graph has a gradient for it: .grad stays None, as in one process
                p = self._params[i]
                p.grad = ops.reshape(piece, list(p.shape))
            b.flat = b.work = None
        self._events.append(("end", None, time.perf_counter()))
        self.last_backward = {"events": self._events, "wait_s": 0.0, "buckets": len(self._buckets)}
        self._state = "reduced"

    def _settle_unused(self, drain: bool) -> None:
        """End of backward: parameters that got no gradient are an error without find_unused_parameters
        (``drain``: wait for the buckets already in flight first), else ready as unused; launch the rest."""
        missing = [i for i, r in enumerate(self._ready) if not r]
        if missing and not self.find_unused_parameters:
            if drain:
                self._drain()
            self._sinks(False)
            self._state = "idle"
            names = ", ".join(repr(self._names[i]) for i in missing[:10])
            more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
            raise UnusedParameterError(
                f"DistributedDataParallel: backward ended but {len(missing)} parameter(s) that require grad "
                f"received no gradient: {names}{more}. Their buckets cannot be reduced. If the forward does "
                "not use every parameter, wrap the model with find_unused_parameters=True (or freeze those "
                "parameters with requires_grad_(False)); make sure the loss depends on all outputs"
            )
        for i in missing:
            self._mark_ready(i, "unused")
        self._launch_ready()

    def _finish(self) -> None:
        """End of backward: launch what is left, wait for every bucket, hand out the averages."""
        if active_tracer() is not None:
            return self._finish_traced()
        self._settle_unused(drain=True)
        used = None
        if self.find_unused_parameters:
            used = zeros((len(self._params),), "int32")
            used.numpy()[:] = [p.grad is not None for p in self._params]
            used_work = self._dist.all_reduce(used, op=self._dist.ReduceOp.SUM, async_op=True, **self._group())
        t0 = time.perf_counter()
        for b in self._buckets:
            b.work.wait()
        if used is not None:
            used_work.wait()
            used = used.numpy()
        t1 = time.perf_counter()
        hooks.host_phase("DDP wait for buckets", "ddp", t0, t1, buckets=len(self._buckets))
        for b in self._buckets:
            fa = b.flat.numpy()
            for i, off, n in b.slots:
                if used is not None and used[i] == 0:
                    continue  # no rank has a gradient for it: leave .grad None, as one process would
                p = self._params[i]
                p.grad = Tensor(fa[off : off + n].reshape(p.shape))
            b.flat = b.work = None
        self._sinks(False)
        self._events.append(("end", None, t1))
        self.last_backward = {"events": self._events, "wait_s": t1 - t0, "buckets": len(self._buckets)}
        self._state = "reduced"

    def _drain(self) -> None:
        """Wait for allreduces a failed backward left in flight (so the next collectives line up)."""
        self._sinks(False)
        if self._state != "reducing":
            return
        for b in self._buckets:
            if b.work is not None:
                b.work.wait()
            b.flat = b.work = None
        self._state = "idle"

    # -- display -------------------------------------------------------------------------------------------
    @property
    def bucket_sizes(self) -> list[int]:
        """Bytes per gradient bucket, in launch order."""
        return [b.nbytes for b in self._buckets]

    @property
    def bucket_parameters(self) -> list[list[str]]:
        """Parameter names per gradient bucket, in launch order."""
        return [[self._names[i] for i in b.params] for b in self._buckets]

    def extra_repr(self) -> str:
        return (
            f"world_size={self.world_size}, buckets={len(self._buckets)}, bucket_cap_mb={self.bucket_cap_mb}, "
            f"find_unused_parameters={self.find_unused_parameters}"
        )


def _sink(ref, i: int):
    def sink(g):
        ddp = ref()
        return g.clone() if ddp is None else ddp._sink(i, g)

    return sink


def _hook(ref, i: int):
    def hook(_param) -> None:
        ddp = ref()
        if ddp is not None:
            ddp._on_grad_ready(i)

    return hook


def _remove_all(handles: list) -> None:
    for h in handles:
        h.remove()


__all__ = [
    "DistributedDataParallel",
    "ModelMismatchError",
    "ReducerStateError",
    "UnusedParameterError",
    "assign_buckets",
]
