"""The graph compiler: optimize once, plan per input-shape signature, replay in a flat loop.

``compile(graph)`` runs the named passes, then ``CompiledGraph.run(inputs)`` looks up (or
builds) the plan for the inputs' concrete shapes: every node's kernel is selected and
planned, intermediates get offsets in one arena (static memory plan), and executors are
bound to that memory. A run replays prepared kernel closures: no dispatch or shape
inference per node. Graphs with data-dependent shapes or control flow run through the
interpreter instead (``cg.mode`` says which, and why)::

    cg = opsnn.compile(graph)
    outputs = cg.run({"x": x})          # dict in, dict out
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from .. import dtypes as _dt
from ..errors import InnerError, KernelError, KernelNotFoundError, OpsnnError, ParamInvalidError
from ..kernels import bounds as _bounds
from ..ops import executor as _ex
from ..ops import registry as _registry
from ..ops import tiering as _tiering
from ..ops.registry import TensorMeta, get_op, has_op
from ..runtime import hooks
from ..runtime.context import context
from ..runtime.stream import current_stream
from ..tensor import Tensor, _alloc_array, as_tensor
from .ir import Graph, Node
from .memory_plan import Buffer, MemoryPlan, plan_memory

log = logging.getLogger("opsnn.graph.compile")

#: ops that never run at plan time even when their inputs are constant
NONDETERMINISTIC = {
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "Bernoulli",
    "Multinomial",
    "Dropout",
}
#: elementwise ops whose kernels may write their output over a dying input of the same size
_NOT_IN_PLACE = {"Softmax", "LogSoftmax", "Hardmax", "CumSum", "Cast", "CastLike"}
_FOLD_LIMIT = 1 << 24  # plan-time folding only for small values (shape arithmetic, not weights)


class NotPlannable(Exception):
    """The graph needs the interpreter (control flow, data-dependent shapes, unknown host values)."""


@dataclass
class Step:
    node: Node
    executor: object
    inputs: list  # value names ('' = absent)
    outputs: list
    workspace: object = None
    task: object = None  # prebuilt closure (None when it reads graph inputs or writes graph outputs)


@dataclass
class Plan:
    key: tuple
    steps: list
    memory: MemoryPlan
    arena: np.ndarray | None
    tensors: dict  # value name -> Tensor bound for the plan's lifetime
    output_metas: dict  # graph output name -> TensorMeta
    folded: dict  # values computed at plan time
    input_steps: dict = field(default_factory=dict)  # graph input -> steps reading it
    last_run: tuple | None = None  # (stream, seq) of the latest launch (the arena is busy until then)
    build_ms: float = 0.0
    # workload keys of the numba kernels its library stand-ins wait for (tiered compilation), and the
    # registry version when they were last looked at: the plan is built again once none is pending
    stand_ins: tuple = ()
    checked: int = -1
    # held from reading last_run to setting it: two threads launching the plan on their own streams
    # would otherwise both see the same earlier run, neither wait for the other, and share the arena
    # at once (a two-thread test got 18 of 6000 results wrong)
    launch_lock: threading.Lock = field(default_factory=threading.Lock)
    bound_cells: dict = field(default_factory=dict)  # kernels.bounds' cells of its values, by array


#: ops whose output is their first input's bytes under another shape (C order): planned as a
#: view of that input, with no step at all, when the input is not needed after them
_VIEW_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"}


def _is_view(node: Node) -> bool:
    return node.op_type in _VIEW_OPS and not node.domain


def _in_place_ok(rec, node: Node) -> bool:
    if _is_view(node):
        return len(node.outputs) == 1
    return (
        rec.category in ("elementwise", "activation")
        and node.op_type not in _NOT_IN_PLACE
        and len(node.outputs) == 1
        and not rec.dynamic_shape
    )


def _in_place_candidates(rec, node: Node, op) -> list:
    """(output, the inputs whose buffer it may take) for each output the step may write in place:
    an elementwise op's or view's single output, or the pairs its chosen kernel declares."""
    if _in_place_ok(rec, node):
        return [(node.outputs[0], node.inputs[:1] if _is_view(node) else node.inputs)]
    kernel = op.selection.kernel
    return [
        (node.outputs[o], [node.inputs[i]])
        for o, i in kernel.in_place
        if o < len(node.outputs) and i < len(node.inputs)
    ]


class CompiledGraph:
    """A graph prepared for repeated execution; see the module docstring."""

    def __init__(
        self,
        graph: Graph,
        *,
        original: Graph | None = None,
        pass_report=None,
        max_plans: int = 16,
        memory_optimization: bool = True,
    ):
        self.graph = graph
        self.original_node_count = len(original.nodes) if original is not None else len(graph.nodes)
        self.pass_report = pass_report
        self.max_plans = max_plans
        self.memory_optimization = memory_optimization
        self._plans: OrderedDict[tuple, Plan] = OrderedDict()
        self._lock = threading.Lock()
        self.plans_built = 0
        self.replans = 0  # plans built again because the numba kernels their stand-ins waited for got compiled
        self.mode = "compiled"
        self.mode_reason = ""
        # np.require keeps 0-d initializers 0-d (ascontiguousarray would make them shape (1,))
        self._weights = {k: Tensor(np.require(v, requirements="C")) for k, v in graph.initializers.items()}
        self._input_specs = {v.name: v for v in graph.inputs if v.name not in graph.initializers}
        other = [v for v in self._input_specs.values() if v.kind != "tensor"]
        if other:  # plans hold tensors: a sequence or an optional input runs on the interpreter
            self.mode = "interpreted"
            self.mode_reason = (
                f"input {other[0].name!r} is {'an' if other[0].kind == 'optional' else 'a'} {other[0].kind}"
            )
        self.kernel_choices: dict = {}  # node name -> kernel name (from a persisted cache)
        # graph output -> graph input whose memory it is written into (a training step's state updates)
        self.io_aliases: dict = {}
        self.cache_dir: str | None = None
        self.loaded_from_cache = False

    # -- public API ------------------------------------------------------------------------------
    @functools.cached_property
    def hash(self) -> str:
        """:func:`graph_hash` of the compiled graph (computed on first use: it reads every weight)."""
        return graph_hash(self.graph)

    @property
    def input_names(self) -> list[str]:
        return list(self._input_specs)

    @property
    def output_names(self) -> list[str]:
        return self.graph.output_names

    def run(self, inputs, stream=None):
        """Run on ``inputs`` (dict by name, or a list in input order); returns a dict when given a
        dict, else a list. Launches asynchronously on ``stream``; read results with ``.numpy()``."""
        t_run = time.perf_counter() if hooks.listening("host") else None  # a run boundary for the timeline
        as_dict = isinstance(inputs, dict)
        feeds = self._feeds(inputs)
        if self.mode == "interpreted":
            return self._run_interpreted(feeds, as_dict)
        key = tuple((name, t.shape, t.dtype.str) for name, t in feeds.items())
        with self._lock:  # another thread may be evicting this plan (an evicted plan still runs)
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
        if plan is not None and plan.stand_ins and plan.checked != _registry.version():
            plan = self._compiled_at_last(plan)
        if plan is None:
            try:
                plan = self._build_plan(key, feeds)
            except NotPlannable as exc:
                self.mode, self.mode_reason = "interpreted", str(exc)
                log.info("graph %s runs interpreted: %s", self.graph.name, exc)
                return self._run_interpreted(feeds, as_dict)
        outs = self._launch(plan, feeds, stream or current_stream())
        if t_run is not None:
            hooks.host_phase(f"run {self.graph.name}", "run", t_run, time.perf_counter())
        return outs if as_dict else [outs[n] for n in self.output_names]

    def explain(self, inputs=None) -> str:
        """Each node's kernel and why, for the latest plan (or the plan of ``inputs``)."""
        if inputs is not None:
            self.run(inputs)
        if self.mode == "interpreted":
            return f"graph {self.graph.name}: interpreted ({self.mode_reason})"
        plan = self.latest_plan
        if plan is None:
            return f"graph {self.graph.name}: no plan yet (run it once or pass inputs)"
        lines = [f"graph {self.graph.name}: {len(plan.steps)} kernels, {plan.memory.summary()}"]
        for st in plan.steps:
            ex = st.executor
            fused = getattr(st.node, "attrs_origin", None)
            inner = ex.plan.get("kernel") if isinstance(ex.plan, dict) else None
            inner = f" (inner kernel {inner.name})" if hasattr(inner, "fn") else ""
            lines.append(
                f"  {st.node.name} ({st.node.qualified_type}): {ex.kernel.name}{inner} — {ex.reason}"
                + (f" [fused from {', '.join(fused)}]" if fused else "")
                + (" [REFERENCE FALLBACK]" if ex.kernel.fallback else "")
            )
        return "\n".join(lines)

    def replica(self) -> CompiledGraph:
        """Another compiled graph over the same optimized graph and weight arrays (no passes run
        again), with plans and activation buffers of its own: for running the model on several
        threads at once (one replica per thread; a plan's buffers serve one run at a time)."""
        cg = CompiledGraph(
            self.graph,
            pass_report=self.pass_report,
            max_plans=self.max_plans,
            memory_optimization=self.memory_optimization,
        )
        cg.original_node_count = self.original_node_count
        cg.kernel_choices = dict(self.kernel_choices)
        cg._weights = self._weights
        cg.io_aliases = dict(self.io_aliases)
        if self.mode == "interpreted":
            cg.mode, cg.mode_reason = self.mode, self.mode_reason
        return cg

    def memory_report(self) -> dict:
        plan = self.latest_plan
        if plan is None:
            return {}
        return {
            "arena_bytes": plan.memory.arena_bytes,
            "naive_bytes": plan.memory.naive_bytes,
            "saving": plan.memory.saving,
            "in_place": len(plan.memory.aliases),
        }

    def prepare_shapes(self, shapes: list[dict]) -> None:
        """Static mode: build plans now for each declared ``{input: shape}`` (dtypes from the graph)."""
        for shape_map in shapes:
            feeds = {}
            for name, spec in self._input_specs.items():
                if name not in shape_map:
                    raise ParamInvalidError(f"prepare_shapes: no shape given for input {name!r}")
                feeds[name] = Tensor(np.zeros(shape_map[name], spec.dtype or np.float32))
            self.run(feeds)

    @property
    def num_plans(self) -> int:
        return len(self._plans)

    # -- inspection ----------------------------------------------------------------------------------
    @property
    def input_specs(self) -> dict:
        """``{input name: Value}`` of the graph's inputs (weights excluded), in input order."""
        return dict(self._input_specs)

    @property
    def plans(self) -> list:
        """The plans kept (one per input-shape signature), least recently used first."""
        with self._lock:
            return list(self._plans.values())

    @property
    def latest_plan(self) -> Plan | None:
        """The most recently used plan (None before the first compiled run)."""
        with self._lock:
            return next(reversed(self._plans.values())) if self._plans else None

    def drop_plans(self, shapes: dict) -> int:
        """Forget the plans whose inputs have the given ``{input name: shape}`` (any dtype), freeing
        their arenas; returns how many were dropped. A later run with those shapes plans again."""
        want = {name: tuple(shape) for name, shape in shapes.items()}
        with self._lock:
            keys = [
                key for key in self._plans if all(tuple(shape) == want[name] for name, shape, _ in key if name in want)
            ]
            for key in keys:
                del self._plans[key]
        return len(keys)

    def resident_bytes(self) -> dict:
        """Bytes of the arrays this graph's plans hold beyond its weights (pre-packed or transformed
        weights, by dtype); see :func:`resident_bytes`."""
        return resident_bytes(self.graph.initializers, self.plans)

    # -- persistence ----------------------------------------------------------------------------------
    def save(self, path: str) -> str:
        """Write the optimized graph as an ONNX model (fused ops in the ``opsnn`` domain)."""
        from .serialize import save

        return save(self.graph, path)

    def persist(self, directory: str | None = None) -> str:
        """Write the optimized graph and the planned shapes + kernel choices to ``directory``
        (default: the compile cache dir) so another process compiles it without passes or
        kernel selection."""
        import json
        import os

        directory = directory or self.cache_dir
        if directory is None:
            raise ParamInvalidError("persist: no directory given and the graph was compiled without cache_dir")
        os.makedirs(directory, exist_ok=True)
        self.save(os.path.join(directory, "graph.onnx"))
        shapes, kernels = [], {}
        for key, plan in self._plans.items():
            shapes.append({name: list(shape) for name, shape, _ in key})
            for st in plan.steps:
                kernels[st.node.name] = st.executor.tiered or st.executor.kernel.name
        tmp = os.path.join(directory, "plans.json.tmp")
        with open(tmp, "w") as f:
            json.dump(
                {
                    "format": 1,
                    "graph": self.graph.name,
                    "original_nodes": self.original_node_count,
                    "shapes": shapes,
                    "kernels": kernels,
                },
                f,
                indent=1,
            )
        os.replace(tmp, os.path.join(directory, "plans.json"))
        return directory

    # -- inputs ------------------------------------------------------------------------------------
    def _feeds(self, inputs) -> dict:
        names = self.input_names
        if isinstance(inputs, dict):
            unknown = set(inputs) - set(names)
            if unknown:
                raise ParamInvalidError(
                    f"graph {self.graph.name}: unknown input(s) {sorted(unknown)}; inputs are {names}"
                )
            missing = [n for n in names if n not in inputs and self._input_specs[n].kind != "optional"]
            if missing:
                raise ParamInvalidError(f"graph {self.graph.name}: missing input(s) {missing}")
            items = [(n, inputs.get(n)) for n in names]
        else:
            if isinstance(inputs, (str, bytes, np.ndarray, Tensor)) or not hasattr(inputs, "__iter__"):
                raise ParamInvalidError(
                    f"graph {self.graph.name}: inputs must be a dict {{name: array}} or a list in input order "
                    f"{names}, got {type(inputs).__name__}"
                )
            inputs = list(inputs)
            if len(inputs) != len(names):
                raise ParamInvalidError(
                    f"graph {self.graph.name}: expected {len(names)} inputs {names}, got {len(inputs)}"
                )
            items = list(zip(names, inputs))
        feeds = {}
        bound: dict = {}  # symbolic dim -> (value, input that fixed it): one value per symbol per run
        for name, x in items:
            spec = self._input_specs[name]
            if spec.kind != "tensor":  # a list (sequence) or None / a value (optional): the interpreter checks it
                from .interpreter import to_value

                feeds[name] = to_value(x)
                continue
            t = as_tensor(x)
            if spec.dtype is not None and t.dtype != spec.dtype:
                raise ParamInvalidError(
                    f"graph {self.graph.name}: input {name!r} has dtype {_dt.name(t.dtype)}, "
                    f"the graph declares {_dt.name(spec.dtype)}"
                )
            if spec.shape is not None:
                if len(spec.shape) != t.ndim:
                    raise ParamInvalidError(
                        f"graph {self.graph.name}: input {name!r} has shape {t.shape}, the "
                        f"graph declares rank {len(spec.shape)} {tuple(spec.shape)}"
                    )
                for d, (want, got) in enumerate(zip(spec.shape, t.shape)):
                    if isinstance(want, (int, np.integer)) and want >= 0 and want != got:
                        raise ParamInvalidError(
                            f"graph {self.graph.name}: input {name!r} has shape {t.shape}; "
                            f"dim {d} must be {want} (declared {tuple(spec.shape)})"
                        )
                    if isinstance(want, str) and want:
                        prev = bound.setdefault(want, (got, name))
                        if prev[0] != got:
                            raise ParamInvalidError(
                                f"graph {self.graph.name}: symbolic dim {want!r} is {prev[0]} in input {prev[1]!r} "
                                f"but {got} in input {name!r} (shape {t.shape})"
                            )
            feeds[name] = t
        return feeds

    # -- planning -------------------------------------------------------------------------------------
    def _build_plan(self, key: tuple, feeds: dict) -> Plan:
        t0 = time.perf_counter()
        g = self.graph
        metas: dict = {k: TensorMeta(w.shape, w.dtype) for k, w in self._weights.items()}
        metas.update({k: TensorMeta(t.shape, t.dtype) for k, t in feeds.items()})
        known: dict = {k: w.numpy() for k, w in self._weights.items()}
        folded: dict = {}
        planned = []  # (node, rec, OpPlan)
        device = context().device.type
        for node in g.nodes:
            if node.op_type == "Constant" and not node.domain:
                from .interpreter import BUILTINS  # the interpreter owns Constant's attribute forms

                val = BUILTINS[("", "Constant")](None, node, [], None)[0].numpy()
                if val.dtype == object:
                    raise NotPlannable(f"node {node.name}: string constants need the interpreter")
                known[node.outputs[0]] = folded[node.outputs[0]] = val
                metas[node.outputs[0]] = TensorMeta(val.shape, val.dtype)
                continue
            if any(True for _ in node.subgraphs()) or not has_op(node.op_type, node.domain):
                raise NotPlannable(f"node {node.name} ({node.qualified_type}) needs the interpreter")
            rec = get_op(node.op_type, node.domain)
            if rec.dynamic_shape:
                raise NotPlannable(f"node {node.name} ({node.op_type}) has a data-dependent output shape")
            in_metas = []
            for name in node.inputs:
                if not name:
                    in_metas.append(None)
                    continue
                if name not in metas:
                    raise NotPlannable(f"node {node.name} reads {name!r}, which has no type (sequence/optional?)")
                in_metas.append(metas[name])
            values = [known.get(n) if n else None for n in node.inputs]
            for i in rec.host_inputs:
                if i < len(node.inputs) and node.inputs[i] and values[i] is None:
                    raise NotPlannable(
                        f"node {node.name} ({node.op_type}) needs the value of {node.inputs[i]!r} "
                        "at plan time, and it is computed from data"
                    )
            # plan-time folding: shape arithmetic on known values (Shape of a typed value is known)
            if node.op_type in ("Shape", "Size") and not node.domain and in_metas[0] is not None:
                shp = np.array(in_metas[0].shape, np.int64)
                if node.op_type == "Size":
                    val = np.array(int(np.prod(shp)), np.int64)
                else:
                    start, end = node.attrs.get("start", 0), node.attrs.get("end", None)
                    val = shp[start:end]
                known[node.outputs[0]] = folded[node.outputs[0]] = val
                metas[node.outputs[0]] = TensorMeta(val.shape, val.dtype)
                continue
            if (
                all(v is not None for n, v in zip(node.inputs, values) if n)
                and node.op_type not in NONDETERMINISTIC
                and all(m is None or int(np.prod(m.shape)) <= _FOLD_LIMIT for m in in_metas)
                and any(n for n in node.inputs)
                and not all(n in self._weights for n in node.inputs if n)
            ):
                outs = _ex.call(
                    rec,
                    [None if n == "" else known[n] for n in node.inputs],
                    dict(node.attrs),
                    num_outputs=len(node.outputs),
                )
                outs = outs if isinstance(outs, tuple) else (outs,)
                for name, t in zip(node.outputs, outs):
                    if name:
                        known[name] = folded[name] = t.numpy()
                        metas[name] = TensorMeta(t.shape, t.dtype)
                continue
            try:
                algo = self.kernel_choices.get(node.name)
                if algo is not None and not any(k.name == algo and not k.cold_alternative for k in rec.kernels):
                    algo = None  # unknown, or a numba kernel that tiered compilation may stand in for while it compiles
                try:
                    op = _ex.plan_op(
                        rec, in_metas, values, dict(node.attrs), num_outputs=len(node.outputs), device=device, algo=algo
                    )
                except KernelNotFoundError:
                    if algo is None:
                        raise
                    op = _ex.plan_op(
                        rec, in_metas, values, dict(node.attrs), num_outputs=len(node.outputs), device=device
                    )
            except OpsnnError as exc:
                shapes = [None if m is None else tuple(m.shape) for m in in_metas]
                raise type(exc)(f"node {node.name} ({node.op_type}) with input shapes {shapes}: {exc}") from None
            for name, m in zip(node.outputs, op.ctx.outputs):
                if name:
                    metas[name] = m
            planned.append((node, rec, op))
        missing = [o for o in g.output_names if o not in metas]
        if missing:
            raise NotPlannable(f"outputs {missing} have no type at plan time")
        plan = self._bind(key, planned, metas, folded, feeds)
        plan.build_ms = (time.perf_counter() - t0) * 1e3
        with self._lock:
            self._plans[key] = plan
            self.plans_built += 1
            while len(self._plans) > self.max_plans:
                old_key, _ = self._plans.popitem(last=False)
                log.info("graph %s: evicted the plan for %s (LRU, max_plans=%d)", g.name, old_key, self.max_plans)
        return plan

    def _compiled_at_last(self, plan: Plan) -> Plan | None:
        """None (build the plan again) once every numba kernel ``plan``'s stand-ins wait for is
        compiled; looked at when the registry moved, which a finished background compile does."""
        plan.checked = _registry.version()
        plan.stand_ins = _tiering.pending(plan.stand_ins)
        if plan.stand_ins:
            return plan
        log.info("graph %s: the numba kernels its stand-ins waited for are compiled: planning again", self.graph.name)
        self.replans += 1
        return None

    def _bind(self, key, planned, metas, folded, feeds) -> Plan:
        g = self.graph
        graph_outputs = set(g.output_names)
        external = set(feeds) | set(self._weights) | set(folded)
        # lifetimes over the step order
        first, last = {}, {}
        for i, (node, _, _op) in enumerate(planned):
            for n in node.inputs:
                if n:
                    last[n] = i
            for n in node.outputs:
                if n:
                    first.setdefault(n, i)
                    last.setdefault(n, i)
        for out, src in self.io_aliases.items():
            # the step writing an input's memory must be its last reader: a later reader would see the new value
            w = first.get(out)
            if w is None or last.get(src, -1) > w:
                reader = (
                    next((nd.name for nd, _, _ in planned[w + 1 :] if src in nd.inputs), None)
                    if w is not None
                    else None
                )
                raise InnerError(
                    f"graph {g.name}: output {out!r} is written into input {src!r}"
                    + (
                        f" by step {w}, but node {reader} reads {src!r} after it"
                        if w is not None
                        else ", but no step writes it"
                    )
                )
        nbytes = {n: int(np.prod(m.shape)) * m.dtype.itemsize for n, m in metas.items()}
        aliases: dict = {}
        aliased: set = set()  # aliases' values, for an O(1) membership test
        root = {}
        if self.memory_optimization:
            for i, (node, rec, op) in enumerate(planned):
                for out, candidates in _in_place_candidates(rec, node, op):
                    if not out or out in graph_outputs:
                        continue
                    for n in candidates:
                        src = root.get(n, n)
                        if (
                            n
                            and n not in external
                            and n not in graph_outputs
                            and last.get(n) == i
                            and nbytes.get(n) == nbytes.get(out)
                            and metas[n].dtype == metas[out].dtype
                            and n not in aliased
                        ):
                            aliases[out] = src
                            aliased.add(src)
                            root[out] = src
                            last[src] = max(last[src], last.get(out, i))
                            break
        alias_end: dict = {}  # a buffer lives as long as anything aliasing it
        for alias, src in aliases.items():
            if alias in last:
                alias_end[src] = max(alias_end.get(src, -1), last[alias])
        buffers = []
        for n, start in first.items():
            if n in graph_outputs or n in external or n in aliases:
                continue
            buffers.append(Buffer(n, nbytes[n], start, max(last[n], alias_end.get(n, -1))))
        for i, (_node, _, op) in enumerate(planned):
            if op.workspace_size:
                buffers.append(Buffer(f"__ws{i}", op.workspace_size, i, i))
        # an output the model leaves out ("" among a node's outputs, e.g. LSTM's Y when only Y_h is
        # read) still gets bytes of its own for that step, so every kernel sees the outputs in place
        metas = dict(metas)
        omitted: dict = {}
        for i, (node, _, op) in enumerate(planned):
            for k, n in enumerate(node.outputs):
                if not n and k < len(op.ctx.outputs):
                    name = omitted[i, k] = f"__omitted{i}.{k}"
                    metas[name] = m = op.ctx.outputs[k]
                    buffers.append(Buffer(name, int(np.prod(m.shape)) * m.dtype.itemsize, i, i))
        if self.memory_optimization:
            mem = plan_memory(buffers)
        else:  # every buffer gets its own bytes
            mem = MemoryPlan(buffers=buffers)
            off = 0
            for b in buffers:
                mem.offsets[b.name] = off
                off += (max(b.size, 1) + 63) // 64 * 64
            mem.arena_bytes = mem.naive_bytes = off
        if self.memory_optimization:
            mem.naive_bytes = sum((max(b.size, 1) + 63) // 64 * 64 for b in buffers)
        mem.aliases = dict(aliases)
        arena = _alloc_array((mem.arena_bytes,), _dt.uint8, f"graph:{g.name}:arena") if mem.arena_bytes else None
        tensors: dict = dict(self._weights)
        for n, val in folded.items():
            tensors[n] = Tensor(np.require(val, requirements="C"))

        def view(name, meta):
            off = mem.offsets[name]
            size = int(np.prod(meta.shape)) * meta.dtype.itemsize
            return Tensor(arena[off : off + size].view(meta.dtype).reshape(meta.shape))

        for b in buffers:
            if not b.name.startswith("__ws"):
                tensors[b.name] = view(b.name, metas[b.name])
        for alias, src in aliases.items():
            tensors[alias] = Tensor(tensors[src]._array.view(metas[alias].dtype).reshape(metas[alias].shape))
        steps = []
        input_steps: dict = {}
        # a kernel bound here may hand a bound on max|y| to those reading y (kernels.bounds)
        with _bounds.binding() as bound_cells:
            for i, (node, rec, op) in enumerate(planned):
                if _is_view(node) and node.outputs[0] in aliases:
                    continue  # its output is already its input's bytes under the new shape: nothing to run
                ws = None
                if op.workspace_size:
                    off = mem.offsets[f"__ws{i}"]
                    ws = arena[off : off + op.workspace_size]
                # bound per run: steps that read inputs or write/read the outputs handed to the caller
                late = any(n in feeds or n in graph_outputs for n in node.inputs) or any(
                    n in graph_outputs for n in node.outputs
                )
                in_t = [tensors.get(n) if n else None for n in node.inputs]
                out_names = [omitted.get((i, k), n) for k, n in enumerate(node.outputs)]
                out_t = [tensors.get(n) for n in out_names if n]
                for t in out_t:  # a bound published for these bytes' array holds only until its next writer
                    _bounds.forget(t._array if t is not None else None)
                ex = _ex.Executor(
                    rec,
                    op.ctx,
                    op.selection,
                    op.plan,
                    op.workspace_size,
                    [t if t is not None else (feeds.get(n) if n else None) for t, n in zip(in_t, node.inputs)],
                    None,
                    None,
                )
                step = Step(node, ex, list(node.inputs), out_names, ws)
                if not late:
                    step.task = _named(
                        ex._task([t._array if t is not None else None for t in in_t], [t._array for t in out_t], ws),
                        node,
                    )
                else:  # bound per run: its outputs' cells made now, for the steps reading them
                    for t in out_t:
                        _bounds.publish(t._array if t is not None else None)
                for n in node.inputs:
                    if n in feeds:
                        input_steps.setdefault(n, []).append(step)
                steps.append(step)
        out_metas = {n: metas[n] for n in g.output_names}
        plan = Plan(key, steps, mem, arena, tensors, out_metas, folded, input_steps)
        plan.bound_cells = bound_cells
        plan.stand_ins = _tiering.pending({k for st in steps if (k := getattr(st.executor, "tiered_key", ""))})
        plan.checked = _registry.version()
        return plan

    # -- running --------------------------------------------------------------------------------------
    def _launch(self, plan: Plan, feeds: dict, stream) -> dict:
        outputs = {}
        for name, m in plan.output_metas.items():
            if name in self.io_aliases:
                outputs[name] = feeds[self.io_aliases[name]]  # written in place into the input's memory
            elif name in feeds:
                outputs[name] = feeds[name]
            elif name in plan.tensors and name not in plan.memory.offsets:
                outputs[name] = plan.tensors[name]  # folded or a weight
            else:
                outputs[name] = Tensor(_alloc_array(tuple(m.shape), m.dtype, f"graph:{self.graph.name}"))
        env = dict(plan.tensors)
        env.update(feeds)
        env.update(outputs)
        for name, t in feeds.items():
            p = t._producer
            if p is not None and len(p) > 2 and p[2]:  # written by a kernel that failed: not valid data
                raise KernelError(
                    f"graph {self.graph.name}: input {name!r} was produced by {p[2][0]}, whose "
                    "kernel failed; write it again before running the graph"
                )
            if p is not None and p[0] is not stream:
                stream.wait_stream_seq(*p)
        with plan.launch_lock:
            if plan.last_run is not None and plan.last_run[0] is not stream:
                stream.wait_stream_seq(*plan.last_run)  # the arena is still in use by a run on another stream
            tasks = []
            mark: list = []  # a failed run's outputs stay failed when read (see Tensor._wait)
            for st in plan.steps:
                task = st.task
                if task is None:
                    with _bounds.binding(plan.bound_cells, grow=False):
                        task = self._late_task(st, env)
                tasks.append((st, task))
            if hooks.active:  # one launch per kernel so tools see each one
                seq = 0
                for st, task in tasks:
                    info = dict(
                        st.executor._info,
                        node=st.node.name,
                        shapes=[None if not n else env[n].shape for n in st.inputs],
                    )
                    seq = stream.launch(task, st.node.op_type, info, mark=mark)
            else:

                def run_graph(tasks=tasks):
                    for _, task in tasks:
                        task()

                seq = stream.launch(run_graph, f"graph:{self.graph.name}", mark=mark)
            plan.last_run = (stream, seq)
        for t in outputs.values():
            if t._producer is None or t._producer[0] is stream:
                t._producer = (stream, seq, mark)
        return outputs

    @staticmethod
    def _late_task(st, env: dict):
        """The task of a step bound per run (it reads a feed or writes a graph output)."""
        ins = [env[n]._array if n else None for n in st.inputs]
        outs = [env[n]._array for n in st.outputs if n]
        st.executor._contig = [
            a is not None and not st.executor.kernel.strided and not a.flags.c_contiguous for a in ins
        ]
        return _named(st.executor._task(ins, outs, st.workspace), st.node)

    def _run_interpreted(self, feeds: dict, as_dict: bool):
        from .interpreter import run as interpret

        res = interpret(self.graph, feeds)
        outs = {
            n: (v if isinstance(v, Tensor) or v is None or isinstance(v, list) else Tensor(np.asarray(v)))
            for n, v in res.items()
        }
        for out, src in self.io_aliases.items():  # the interpreter computes new values: write them back
            outs[out] = feeds[src].copy_(outs[out])
        return outs if as_dict else [outs[n] for n in self.output_names]


def _named(task, node: Node):
    """Wrap a kernel closure so that an error names the graph node that raised it."""

    def run_node():
        try:
            task()
        except Exception as exc:
            raise KernelError(
                f"node {node.name} ({node.op_type}): {type(exc).__name__}: {exc}", op=node.op_type
            ) from exc

    return run_node


def resident_bytes(initializers: dict, plans) -> dict:
    """Bytes of arrays that ``plans``' kernels hold (pre-packed / transformed weights), by dtype:
    resident weight memory beyond the ``initializers``. Each buffer counts once (a plan may hold
    an aligned buffer and its view); views of the initializers do not count."""
    seen: set = set()
    owners = {id(_owner(a)) for a in initializers.values() if isinstance(a, np.ndarray)}
    out: dict = {}
    for plan in plans:
        for st in plan.steps:
            for a in _arrays(getattr(st.executor, "plan", None), seen):
                root = _owner(a)
                if id(root) in owners:
                    continue
                owners.add(id(root))
                out[str(root.dtype)] = out.get(str(root.dtype), 0) + int(root.nbytes)
    return out


def _arrays(obj, seen: set, depth: int = 0):
    """numpy arrays reachable from a kernel plan (dicts, sequences, objects; a few levels deep)."""
    if depth > 5 or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        yield obj
        return
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        items = list(obj)
    elif isinstance(getattr(obj, "__dict__", None), dict):  # (some wrappers' __dict__ is not a dict)
        items = list(obj.__dict__.values())
    elif hasattr(obj, "__slots__"):
        items = [getattr(obj, n, None) for n in obj.__slots__]
    else:
        return
    for v in items:
        yield from _arrays(v, seen, depth + 1)


def _owner(a: np.ndarray) -> np.ndarray:
    """The array that owns ``a``'s memory (``a`` itself unless it is a view)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def graph_hash(graph: Graph) -> str:
    """A stable hash of a graph's structure, attributes and weights (the plan-cache key)."""
    h = hashlib.sha256()
    for v in graph.inputs:
        h.update(f"in:{v.name}:{v.dtype}:{v.shape};".encode())
    for n in graph.nodes:
        h.update(f"{n.domain}:{n.op_type}:{n.inputs}:{n.outputs}:".encode())
        for k in sorted(n.attrs):
            v = n.attrs[k]
            h.update(k.encode())
            h.update(_array_digest(v) if isinstance(v, np.ndarray) else repr(v).encode())
    for k in sorted(graph.initializers):
        a = graph.initializers[k]
        h.update(f"init:{k}:{a.dtype}:{a.shape}".encode())
        h.update(_array_digest(a))
    h.update(repr(graph.output_names).encode())
    return h.hexdigest()[:16]


def _array_digest(a: np.ndarray) -> bytes:
    """sha256 of an array's values; object arrays (ONNX strings) by their elements, whose
    memory holds only pointers."""
    h = hashlib.sha256()
    if a.dtype.hasobject:
        for x in a.reshape(-1):
            b = x if isinstance(x, bytes) else repr(x).encode()
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
    else:
        h.update(np.ascontiguousarray(a).view(np.uint8).tobytes())
    return h.digest()


_memory_optimization = [True]


def enable_memory_optimization(enabled: bool = True) -> None:
    """Static memory planning for compiled graphs (on by default); ``opsnn.config`` exposes it."""
    _memory_optimization[0] = bool(enabled)


def memory_optimization_enabled() -> bool:
    return _memory_optimization[0]


def compile(
    model,
    example_inputs=None,
    *,
    dynamic_dims=None,
    static_shapes=None,
    level: int = 3,
    disabled_passes=None,
    max_plans: int = 16,
    memory_optimization: bool | None = None,
) -> CompiledGraph:
    """Compile a Graph or a Python function of tensors (traced on ``example_inputs``, with
    ``dynamic_dims`` = ``{arg: {dim: "name"}}``). ``static_shapes``: a list of ``{input: shape}``
    to plan ahead of time. :func:`opsnn.compile` (``opsnn.frontend``) is the front door that also
    takes ONNX models and ``opsnn.nn`` modules and keeps the compile cache.

    >>> import opsnn, numpy as np
    >>> from opsnn.graph.compiler import compile
    >>> cg = compile(lambda x: opsnn.ops.relu(x), [np.ones((2, 3), np.float32)],
    ...              dynamic_dims={"x": {0: "batch"}})
    >>> cg.run([np.full((5, 3), -1, np.float32)])[0].shape
    (5, 3)
    """
    import copy

    from .passes import optimize
    from .tracing import trace

    context()
    if isinstance(model, Graph):
        graph = model
    elif callable(model):
        if example_inputs is None:
            raise ParamInvalidError("compile: a function needs example_inputs to be traced")
        graph = trace(model, example_inputs, dynamic_dims)
    else:
        raise ParamInvalidError(
            f"compile: expected a Graph or a function of tensors, got {type(model).__name__} "
            f"(opsnn.compile also takes ONNX models and opsnn.nn modules)"
        )
    from .checks import check_nodes

    check_nodes(graph)  # before any pass: a mistake is reported against the user's node, not a fused op
    original = graph
    # nodes and subgraphs are copied (passes rewrite them); weight arrays are shared, never mutated
    work = copy.deepcopy(graph, {id(a): a for a in graph.initializers.values()})
    t0 = time.perf_counter()
    report = optimize(work, level=level, disabled=disabled_passes)
    hooks.host_phase(f"compile {graph.name}", "compile", t0, time.perf_counter())
    if memory_optimization is None:
        memory_optimization = memory_optimization_enabled()
    cg = CompiledGraph(
        work, original=original, pass_report=report, max_plans=max_plans, memory_optimization=memory_optimization
    )
    if static_shapes:
        cg.prepare_shapes(static_shapes)
    return cg
