"""Compiled training: a whole training step (forward, loss, backward, optimizer update) traced into
one graph and run through the graph engine (passes, fusions, one memory plan), per input shape.

``opsnn.compile(train_step)`` returns a :class:`CompiledTrainStep`. Its first call with a new
signature of input shapes runs the step eagerly while tracing it (that call's results are the
eager ones); the op calls, the backward the tape runs (each gradient rule is registry ops) and the
optimizer's fused update (``ApplySGD`` / ``ApplyAdamW`` nodes) become one graph. Parameters,
optimizer state and running statistics are *state inputs*: fed by reference at every call and
updated in place (graph outputs bound onto their input's memory), never constants, so no pass
folds or pre-packs them. Hyper-parameters (learning rate, Adam's bias corrections) are runtime
inputs computed on the host before every call, so a learning-rate schedule keeps working.

>>> import opsnn, numpy as np
>>> lin = opsnn.nn.Linear(3, 1)
>>> opt = opsnn.optim.SGD(lin.parameters(), lr=0.1)
>>> def train_step(x, y):
...     opt.zero_grad()
...     loss = opsnn.nn.functional.mse_loss(lin(x), y)
...     loss.backward()
...     opt.step()
...     return loss
>>> step = opsnn.compile(train_step)
>>> x, y = np.ones((4, 3), np.float32), np.zeros((4, 1), np.float32)
>>> losses = [float(step(x, y).item()) for _ in range(3)]
>>> step.num_compiles, step.mode
(1, 'compiled')
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field

import numpy as np

from ..errors import ParamInvalidError
from ..graph import compiler as _compiler
from ..graph.ir import Graph, Node
from ..graph.tracing import StateTracer, TraceError, trace_stateful
from ..runtime import memory as _memory
from ..tensor import as_tensor
from .graph import get_meta

log = logging.getLogger("opsnn.autograd.compiled")

#: callables whose (hashable) results select the traced graph besides the input shapes: state that
#: changes what the step records (DistributedDataParallel.no_sync() leaves its allreduces out)
trace_key_hooks: list = []


@dataclass
class TracedStep:
    """One input-shape signature's traced graph and what feeds it."""

    graph: Graph  # as traced (before passes): gradients are named ``<param>.grad``
    compiled: object  # the CompiledGraph
    input_names: list
    outputs: list  # the step's own outputs (graph output names), in its return structure
    structure: object  # None (one tensor), a tuple/list length, or dict keys
    getters: dict  # state input -> callable giving the tensor to feed
    host_inputs: dict  # input -> callable giving its value
    updates: dict  # graph output -> state input it is written into
    gradients: dict = field(default_factory=dict)  # parameter state name -> gradient value name
    calls: int = 0


def _trimmed(names: list) -> list:
    names = list(names)
    while names and not names[-1]:
        names.pop()
    return names


def fuse_loss_heads(graph: Graph, dtype_of=None) -> int:
    """Replace each SoftmaxCrossEntropyLoss whose gradient the step takes (a
    SoftmaxCrossEntropyLossGrad of the same scores, labels, weights and attributes, its dLoss known
    where the loss is computed) by one SoftmaxCrossEntropyLossWithGrad at the loss's place: the scores
    (a language model's logits) are read once for both. Float32 / float64 scores, log_prob unused.
    ``dtype_of(value name)``: the dtype of a value (the traced tensors'; default: shape inference).
    Returns how many were fused."""
    losses = [n for n in graph.nodes if n.op_type == "SoftmaxCrossEntropyLoss" and not n.domain]
    grads = [n for n in graph.nodes if n.op_type == "SoftmaxCrossEntropyLossGrad" and n.domain == "opsnn"]
    if not losses or not grads:
        return 0
    if dtype_of is None:
        from ..graph.shape_inference import infer_types

        metas = infer_types(graph)
        dtype_of = lambda v: getattr(metas.get(v), "dtype", None)  # noqa: E731
    consumers = graph.consumers()
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    producers = graph.producers()
    outputs = set(graph.output_names)
    fused: dict = {}  # id(loss node) -> fused node
    dropped: set = set()
    for loss in losses:
        if len(loss.outputs) > 1 and any(loss.outputs[1:]):
            lp = loss.outputs[1]
            if lp in outputs or consumers.get(lp):
                continue  # log_prob is read: the fused op does not write it
        dt = dtype_of(loss.inputs[0])
        if dt is None or np.dtype(dt) not in (np.dtype(np.float32), np.dtype(np.float64)):
            continue
        for g in grads:
            if id(g) in dropped or _trimmed(g.inputs[1:]) != _trimmed(loss.inputs) or g.attrs != loss.attrs:
                continue
            p = producers.get(g.inputs[0])
            if p is not None and index[id(p)] > index[id(loss)]:
                continue  # dLoss is computed after the loss
            fused[id(loss)] = Node(
                "SoftmaxCrossEntropyLossWithGrad",
                list(g.inputs),
                [loss.outputs[0], g.outputs[0]],
                dict(loss.attrs),
                domain="opsnn",
                name=loss.name,
            )
            dropped.add(id(g))
            break
    if fused:
        graph.nodes = [fused.get(id(n), n) for n in graph.nodes if id(n) not in dropped]
    return len(fused)


def _is_parameter(t) -> bool:
    m = get_meta(t)
    return m is not None and m.requires_grad and m.grad_fn is None


class CompiledTrainStep:
    """A training step compiled per input-shape signature; call it like the step.

    ``step(*inputs)`` returns what the step returns (tensors, a tuple or a dict). Inspection:
    ``memory_report()`` (planned arena against the naive sum of intermediates, state bytes),
    ``explain()``, ``resident_bytes()``, ``graph()`` (the traced graph), ``gradient_names()``,
    ``num_compiles``, ``mode``. A new signature of input shapes and dtypes, or a change of the
    train/eval mode of ``modules`` (opsnn.compile passes the modules the step reaches), traces
    again; other Python state the step reads (which parameters have gradients, options other than
    the optimizer's hyper-parameters) is fixed at tracing. ``graph_hooks``: callables ``hook(graph, gradients)`` run on each
    traced graph before compiling (``gradients``: parameter -> gradient value name), for passes
    such as inserting all-reduce nodes before the update.
    """

    def __init__(
        self,
        fn,
        *,
        names: dict | None = None,
        modules=(),
        level: int = 3,
        disabled_passes=None,
        max_plans: int = 16,
        memory_optimization: bool | None = None,
        graph_hooks=(),
    ):
        if not callable(fn):
            raise ParamInvalidError(f"compile: expected a training step function, got {type(fn).__name__}")
        self.fn = fn
        self.names = dict(names or {})
        self.modules = list(modules)  # their train/eval modes are part of the cache key
        self.level = level
        self.disabled_passes = disabled_passes
        self.max_plans = max_plans
        self.memory_optimization = memory_optimization
        self.graph_hooks = list(graph_hooks)
        self._steps: dict = {}
        self._latest: TracedStep | None = None
        self.num_compiles = 0
        self.mode = "not traced"

    # -- calling -------------------------------------------------------------------------------------
    def __call__(self, *inputs):
        tensors = [as_tensor(x) for x in inputs]
        key = tuple((tuple(t.shape), t.dtype.str) for t in tensors)
        if self.modules:  # a step traced in training mode is not the step in eval mode
            key += (tuple(m.training for mod in self.modules for _n, m in mod.named_modules()),)
        extra = tuple(h() for h in trace_key_hooks)
        if any(e is not None for e in extra):
            key += (("trace_key", extra),)
        st = self._steps.get(key)
        if st is None:
            tracer = StateTracer(state_of=_is_parameter, label_of=lambda t: self.names.get(id(t)))
            try:
                result = self._trace(key, tensors, tracer)
            except BaseException:
                _drop_grads(tracer)  # a failed trace's gradients would mislead the next trace
                raise
            # the blocks the trace's eager run left cached (freed with its locals) serve no compiled run
            _memory.empty_cache()
            return result
        self._latest = st
        feeds = dict(zip(st.input_names, tensors))
        for name, fn in st.host_inputs.items():  # hyper-parameters first: they may create state
            feeds[name] = as_tensor(np.asarray(fn()))
        for name, get in st.getters.items():
            feeds[name] = get()
        outs = st.compiled.run(feeds)  # plans again once the numba kernels its stand-ins wait for are compiled
        st.calls += 1
        return self._structure(st, [outs[n] for n in st.outputs])

    def _trace(self, key, tensors, tracer):
        name = getattr(self.fn, "__name__", "train_step")
        graph, updates, result = trace_stateful(self.fn, tensors, tracer, name=name)
        if "backward" not in tracer.events and "update" not in tracer.events:
            log.info("compiled step %s: traced no backward and no update (an inference function)", name)
        gradients = self._name_gradients(graph, tracer)
        for hook in self.graph_hooks:
            hook(graph, dict(gradients))
        work = copy.copy(graph)  # graph() stays the step as traced; the fusion replaces the node list only
        work.nodes = list(graph.nodes)
        fuse_loss_heads(work, lambda v: tracer.metas.get(v, (None,))[0])
        cg = _compiler.compile(
            work,
            level=self.level,
            disabled_passes=self.disabled_passes,
            max_plans=self.max_plans,
            memory_optimization=self.memory_optimization,
        )
        lost = [o for o in updates if o not in cg.graph.output_names]
        if lost:
            raise TraceError(f"compile: the passes dropped the state update output(s) {lost}")
        cg.io_aliases = dict(updates)
        outputs, structure = self._outputs(graph, updates, result)
        st = TracedStep(
            graph,
            cg,
            [v.name for v in graph.inputs[: len(tensors)]],
            outputs,
            structure,
            dict(tracer.getters),
            dict(tracer.host_inputs),
            dict(updates),
            gradients,
        )
        self._steps[key] = st
        self._latest = st
        self.num_compiles += 1
        self.mode = "compiled"
        _drop_grads(tracer)  # the step's gradients live inside the graph from now on
        log.info("compiled step %s for inputs %s: %d nodes", name, key, len(graph.nodes))
        return result

    @staticmethod
    def _outputs(graph: Graph, updates: dict, result):
        n_user = len(graph.outputs) - len(updates)
        names = [v.name for v in graph.outputs[:n_user]]
        if isinstance(result, dict):
            return names, list(result.keys())
        if isinstance(result, (tuple, list)):
            return names, type(result)
        return names, None

    @staticmethod
    def _structure(st: TracedStep, outs: list):
        if st.structure is None:
            return outs[0]
        if isinstance(st.structure, list):
            return dict(zip(st.structure, outs))
        return st.structure(outs)

    @staticmethod
    def _name_gradients(graph: Graph, tracer: StateTracer) -> dict:
        """Give each parameter's gradient the value name ``<param>.grad`` in the traced graph."""
        produced = {o for n in graph.nodes for o in n.outputs if o}
        outputs = set(graph.output_names)
        renames, gradients = {}, {}
        for sname, t in tracer.state.items():
            m = get_meta(t)
            g = None if m is None else m.grad
            if g is None or not tracer.is_traced(g):
                continue
            v = tracer.names.get(id(g))
            target = f"{sname}.grad"
            if v in produced and v not in outputs and v not in renames:
                renames[v] = target
            else:  # shared by two parameters, or not a node's output: an Identity names it
                graph.nodes.append(Node("Identity", [renames.get(v, v)], [target]))
            gradients[sname] = target
        if renames:
            for n in graph.nodes:
                n.inputs = [renames.get(i, i) for i in n.inputs]
                n.outputs = [renames.get(o, o) for o in n.outputs]
        return gradients

    # -- inspection -------------------------------------------------------------------------------------
    def _current(self) -> TracedStep:
        if self._latest is None:
            raise ParamInvalidError("compiled step: not traced yet (call it once)")
        return self._latest

    def graph(self) -> Graph:
        """The latest signature's traced graph (before passes): forward, backward and update nodes."""
        return self._current().graph

    @property
    def compiled_graph(self):
        """The latest signature's CompiledGraph (after passes)."""
        return self._current().compiled

    def gradient_names(self) -> dict:
        """``{parameter: gradient value name}`` in the traced graph."""
        return dict(self._current().gradients)

    def state_names(self) -> list:
        """The state inputs (parameters, optimizer state, running statistics), in input order."""
        return list(self._current().getters)

    def memory_report(self) -> dict:
        """The latest plan's memory: ``planned_peak_bytes`` (the arena all intermediates of forward,
        backward and update share; activations live until their last backward use) against
        ``naive_bytes`` (every intermediate its own buffer), plus the state updated in place and the
        outputs handed back per call."""
        st = self._current()
        plan = st.compiled.latest_plan
        if plan is None:
            return {"mode": st.compiled.mode, "reason": st.compiled.mode_reason}
        state = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in st.graph.inputs if v.name in st.getters)
        outs = sum(int(np.prod(m.shape)) * m.dtype.itemsize for n, m in plan.output_metas.items() if n in st.outputs)
        return {
            "planned_peak_bytes": plan.memory.arena_bytes,
            "naive_bytes": plan.memory.naive_bytes,
            "saving": plan.memory.saving,
            "in_place": len(plan.memory.aliases),
            "buffers": len(plan.memory.buffers),
            "state_bytes": state,
            "output_bytes": outs,
            "state_updates": len(st.updates),
            "kernels": len(plan.steps),
        }

    def resident_bytes(self) -> dict:
        """Bytes the plans hold beyond the graph's constants (pre-packed weights); parameters are
        state inputs, so none of them is pre-packed."""
        return self._current().compiled.resident_bytes()

    def explain(self) -> str:
        st = self._current()
        lines = [
            f"compiled training step {getattr(self.fn, '__name__', 'step')}: {len(st.graph.nodes)} traced nodes, "
            f"{len(st.getters)} state inputs updated in place: {len(st.updates)}, "
            f"runtime hyper-parameter inputs {sorted(st.host_inputs)}",
        ]
        rep = self.memory_report()
        if "planned_peak_bytes" in rep:
            lines.append(
                f"memory: planned peak {rep['planned_peak_bytes']} bytes against a naive sum of "
                f"{rep['naive_bytes']} bytes ({100 * rep['saving']:.1f}% saved); state {rep['state_bytes']} bytes"
            )
        lines.append(st.compiled.explain())
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"<CompiledTrainStep {getattr(self.fn, '__name__', 'step')}: {self.num_compiles} signatures, {self.mode}>"
        )


def _drop_grads(tracer) -> None:
    """Clear ``.grad`` of every state tensor the trace touched (it holds the tracing call's values)."""
    for t in tracer.state.values():
        m = get_meta(t)
        if m is not None and m.grad is not None:
            m.grad = None


__all__ = ["CompiledTrainStep", "TraceError"]
