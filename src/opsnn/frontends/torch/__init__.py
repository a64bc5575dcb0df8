"""``torch.compile(model, backend="opsnn")``: PyTorch models run on opsnn's graph engine.

The backend receives Dynamo's FX graph and its example inputs, traces it to core ATen with
torch's decompositions (functionalized), splits it into the parts opsnn maps exactly (the
table in :mod:`.aten`) and the rest, and compiles each supported part with ``opsnn.compile``
(passes, memory plan, a plan per input shape). Every node left to torch is logged with its
reason (``logging`` INFO on ``opsnn.frontends.torch``; ``OPSNN_DEBUG=1`` prints them);
:func:`explain` reports the partitions, fallbacks and kernels. Inference keeps
``scaled_dot_product_attention`` (float32, static shapes) one node, lowered onto opsnn's Attention;
elsewhere torch's decomposition to matmuls and a safe softmax applies.

Memory: tensors cross by DLPack without copies both ways (:func:`to_numpy`, :func:`to_torch`;
strided views keep their strides, bfloat16 crosses as its bits). Parameters and buffers become
graph constants over the torch tensors' own memory; an in-place update of one moves its version
counter and the next call compiles again (a pass may have folded it into an array of its own).
An output is memory opsnn allocated for that call alone, outside the plan's arena, so it stays
valid after the next call.

Training: a graph compiled while autograd records (grad enabled and an input that requires
grad) goes through ``aot_autograd``; its forward and backward ATen graphs are each partitioned
and run like an inference graph (parameters are inputs there, never constants: the optimizer
steps them in place), and torch's autograd and optimizer see ordinary tensors. The backward ops
opsnn has records for (batch / layer / group norm, pooling, softmax, embedding, the NLL loss) stay
whole there instead of decomposing, and run on those records; layer and group norm's, which have
no eps in ATen, get their forward's from the joint graph. Batch norm trains as opsnn's own graphs do:
its backward recomputes the batch statistics, so the forward saves none and is one BatchNormalization
record, a ReLU after it fused in (relu=1), as is the ReLU's threshold_backward into the
BatchNormalizationGrad; a saved activation's ``alias`` reads as the activation itself (no copy).

Symbolic sizes (``dynamic=True``, or Dynamo's automatic dynamic shapes): the graph is traced once
on Dynamo's symbolic fake inputs (a training graph: aot_autograd's forward and backward, traced on
its symbolic fakes); a partition's inputs declare opsnn symbolic dims (named after
the SymInt's expression, ``s0``), and its one compiled graph builds a plan per concrete shape.
Size arithmetic stays in Python; a symbolic size a partition reads (a view's size) crosses as an
input of that length and no bytes, whose Shape the plan folds. A lowering that would need a
symbolic dim's value otherwise (a tensor made of sizes) leaves its node to torch, logged. A graph
that cannot be traced symbolically is compiled again for each concrete shape it meets.

bfloat16: an op on bfloat16 tensors is lowered as torch's CPU kernels compute it, in float32 (the
inputs read exactly) with each bfloat16 result rounded once; an op whose torch kernel rounds
between its steps (log_softmax) stays in torch.

torch is an optional dependency: nothing here imports it until the backend is used.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import sys
from dataclasses import dataclass, field

import numpy as np

from ...dtypes import bfloat16
from ...errors import KernelNotFoundError, OpsnnError

log = logging.getLogger("opsnn.frontends.torch")

__all__ = [
    "backend",
    "compile_graph",
    "explain",
    "to_graph",
    "TorchNotInstalledError",
    "UnsupportedExportError",
    "Report",
    "to_numpy",
    "to_torch",
]


class TorchNotInstalledError(OpsnnError, ImportError):
    """The torch frontend was asked for but PyTorch is not installed."""


class UnsupportedExportError(KernelNotFoundError):
    """:func:`to_graph` met an ATen op (or arguments) with no exact opsnn lowering."""


def _torch():
    try:
        import torch
    except ImportError:
        raise TorchNotInstalledError(
            "opsnn.frontends.torch: the 'opsnn' torch.compile backend needs PyTorch; "
            "install it with `pip install opsnn[torch]`"
        ) from None
    return torch


@dataclass
class Report:
    """What one backend call did: partitions run on opsnn, nodes left to torch and why, kernels."""

    partitions: list = field(default_factory=list)  # (name, [aten ops], CompiledGraph)
    fallbacks: list = field(default_factory=list)  # (node name, aten target, reason)
    whole_graph_reason: str = ""  # set when the whole graph runs in torch
    runs: dict = field(default_factory=dict)  # partition name -> calls that ran on opsnn

    def __str__(self) -> str:
        lines = []
        if self.whole_graph_reason:
            lines.append(f"whole graph runs in torch: {self.whole_graph_reason}")
        for name, ops, cg in self.partitions:
            lines.append(f"partition {name}: {len(ops)} ATen ops on opsnn")
            lines.append("  " + cg.explain().replace("\n", "\n  "))
        for node, target, reason in self.fallbacks:
            lines.append(f"fallback {node} ({target}): {reason}")
        return "\n".join(lines)


def to_numpy(t) -> np.ndarray:
    """A CPU torch tensor as a numpy array over the same memory (DLPack; its strides kept, no copy).
    bfloat16, which DLPack's numpy consumer cannot name, crosses as its 16-bit pattern."""
    torch = _torch()
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return np.from_dlpack(t.view(torch.int16)).view(bfloat16)
    return np.from_dlpack(t)


def to_torch(a: np.ndarray):
    """A numpy array as a torch tensor over the same memory (DLPack, no copy); the tensor keeps the
    array (and the opsnn memory block under it) alive."""
    torch = _torch()
    if a.dtype == bfloat16:  # ml_dtypes' bfloat16: its bits, viewed back
        return torch.from_dlpack(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_dlpack(a)


def _fallback(report: Report, node: str, target, reason: str) -> None:
    report.fallbacks.append((node, str(target), reason))
    log.info("torch fallback: %s (%s): %s", node, target, reason)
    if os.environ.get("OPSNN_DEBUG") == "1":
        print(f"opsnn torch fallback: {node} ({target}): {reason}", file=sys.stderr)


def backend(gm, example_inputs):
    """The ``torch.compile`` backend: ``(GraphModule, example_inputs) -> callable``."""
    return compile_graph(gm, example_inputs)[0]


def compile_graph(gm, example_inputs) -> tuple:
    """What :func:`backend` does, returning ``(callable, Report)``; the report fills in as the
    callable meets new shapes or parameters."""
    report = Report()
    return _backend(_torch(), gm, example_inputs, report), report


def _backend(torch, gm, example_inputs, report: Report):
    whole = _whole_graph_reason(torch, gm, example_inputs)
    if whole:
        report.whole_graph_reason = whole
        _fallback(report, "<graph>", "", whole)
        return gm.forward
    if _recording_autograd(torch, example_inputs):
        return _training(torch, gm, example_inputs, report)
    if any(_symbolic(torch, x) for x in example_inputs):
        try:  # one trace with symbolic sizes: one opsnn graph per partition, a plan per concrete shape
            return _guarded(torch, gm, example_inputs, report, symbolic=True)
        except Exception as exc:  # noqa: BLE001 - Dynamo's fake inputs untraceable here: a trace per shape
            log.info(
                "symbolic graph: no symbolic trace (%s: %s); compiling per concrete shape", type(exc).__name__, exc
            )
            del report.partitions[:], report.fallbacks[:]
            report.whole_graph_reason = ""
            return _per_shape(torch, gm, report)
    return _guarded(torch, gm, example_inputs, report)


def _recording_autograd(torch, example_inputs) -> bool:
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)


def _training(torch, gm, example_inputs, report: Report):
    """A graph autograd records: ``aot_autograd`` splits it into forward and backward ATen graphs
    (core ATen decompositions), each compiled as its own set of partitions; every input is a runtime
    input (parameters change at each optimizer step)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    def compiler(kind):
        def compile_one(g, inputs):
            _drop_aliases(torch, g)
            try:
                fn = _compile(
                    torch, g, inputs, report, constants=False, label=kind, decompositions=_training_decompositions()
                )
            except Exception as exc:  # tracing or partitioning failed: this graph runs in torch
                _fallback(report, f"<{kind} graph>", "", f"opsnn could not take it ({type(exc).__name__}: {exc})")
                fn = g.forward
            return make_boxed_func(fn)

        return compile_one

    return aot_autograd(
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        decompositions=_training_decompositions(),
        partition_fn=_partition_joint,
    )(gm, example_inputs)


def _drop_aliases(torch, g) -> None:
    """aot_autograd's graphs are functional: an ``alias`` (a saved tensor's detach) reads as its input.
    Left in, functionalization would make it a copy (``alias_copy``: a clone of each saved activation)."""
    for node in list(g.graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten.alias.default and not node.kwargs:
            node.replace_all_uses_with(node.args[0])
            g.graph.erase_node(node)
    g.recompile()


def _partition_joint(joint, joint_inputs, **kwargs):
    """torch's default forward/backward split, after :func:`_name_norm_eps`."""
    from torch._functorch.partitioners import default_partition

    _name_norm_eps(_torch(), joint)
    _batch_norm_backward_unsaved(_torch(), joint)
    return default_partition(joint, joint_inputs, **kwargs)


def _batch_norm_backward_unsaved(torch, joint) -> None:
    """Each training-mode ``native_batch_norm_backward`` of the joint graph whose mean and 1/std are the
    statistics a batch norm of the same input and eps saved becomes ``opsnn::batch_norm_backward``, which
    does not read them (the record recomputes them from the input): the forward then neither computes
    nor saves them. A ``threshold_backward(g, y, 0)`` whose only reader is that backward folds into it
    (``relu_out=y``)."""
    import operator

    from . import aten as _aten

    aten, graph = torch.ops.aten, joint.graph
    named_op = _aten.batch_norm_backward_op()
    # training forwards -> (argument count, where the eps is)
    forwards = {
        aten._native_batch_norm_legit_functional.default: (8, 7),
        aten._native_batch_norm_legit.default: (8, 7),
        aten._native_batch_norm_legit.no_stats: (6, 5),
        aten.native_batch_norm.default: (8, 7),
    }

    def unalias(a):
        while getattr(a, "target", None) is aten.alias.default:
            a = a.args[0]
        return a

    def saved_by_forward(mean, invstd, x, eps) -> bool:
        saved = [a.args if getattr(a, "target", None) is operator.getitem else (None, None) for a in (mean, invstd)]
        fwd = saved[0][0]
        kind = forwards.get(getattr(fwd, "target", None))
        return (
            kind is not None
            and fwd is saved[1][0]
            and (saved[0][1], saved[1][1]) == (1, 2)
            and len(fwd.args) == kind[0]
            and unalias(fwd.args[0]) is unalias(x)
            and float(fwd.args[kind[1]]) == float(eps)
        )

    for node in list(graph.nodes):
        if node.target is not aten.native_batch_norm_backward.default or len(node.args) != 10 or node.kwargs:
            continue
        grad, x, weight, rm, rv, mean, invstd, train, eps, mask = node.args
        if not train or not saved_by_forward(unalias(mean), unalias(invstd), x, eps):
            continue
        relu_out = None
        if (
            getattr(grad, "target", None) is aten.threshold_backward.default
            and len(grad.users) == 1
            and len(grad.args) == 3
            and not grad.kwargs
            and grad.args[2] == 0
            and str(grad.args[1].meta["val"].shape) == str(x.meta["val"].shape)
            and grad.args[1].meta["val"].dtype == x.meta["val"].dtype
        ):
            grad, relu_out = grad.args[0], grad.args[1]
        with graph.inserting_before(node):
            named = graph.call_function(named_op, (grad, x, weight, rm, rv, True, float(eps), list(mask), relu_out))
        named.meta = dict(node.meta)
        empty = x.meta["val"].new_empty(0)
        named.meta["val"] = tuple(empty if v is None else v for v in node.meta["val"])
        old_grad = node.args[0]
        node.replace_all_uses_with(named)
        graph.erase_node(node)
        if relu_out is not None:
            graph.erase_node(old_grad)
    joint.recompile()


def _name_norm_eps(torch, joint) -> None:
    """Each ``native_layer_norm_backward`` (``native_group_norm_backward``) of the joint graph whose mean
    and rstd are the statistics a ``native_layer_norm`` of the same input and shape (a
    ``native_group_norm`` of the same input and groups) saved becomes ``opsnn::layer_norm_backward``
    (``group_norm_backward``) with that forward's eps, which the backward records need (they recompute
    the statistics)."""
    import operator

    from . import aten as _aten

    aten, graph = torch.ops.aten, joint.graph
    # backward -> (its forward, argument count, where mean and rstd are, the forward's eps, same shape)
    kinds = {
        aten.native_layer_norm_backward.default: (
            aten.native_layer_norm.default,
            8,
            (3, 4),
            lambda fwd: fwd.args[4],
            lambda fwd, bw: list(fwd.args[1]) == list(bw.args[2]),
        ),
        aten.native_group_norm_backward.default: (
            aten.native_group_norm.default,
            10,
            (2, 3),
            lambda fwd: fwd.args[7],
            lambda fwd, bw: fwd.args[6] == bw.args[8],
        ),
    }

    def unalias(a):  # the saved statistics may reach the backward through aliases
        while getattr(a, "target", None) is aten.alias.default:
            a = a.args[0]
        return a

    for node in list(graph.nodes):
        kind = kinds.get(node.target)
        if kind is None or len(node.args) != kind[1] or node.kwargs:
            continue
        forward, _, (mi, ri), eps, same = kind
        x, mean, rstd = node.args[1], unalias(node.args[mi]), unalias(node.args[ri])
        saved = [a.args if getattr(a, "target", None) is operator.getitem else (None, None) for a in (mean, rstd)]
        fwd = saved[0][0]
        if not (
            fwd is not None
            and fwd is saved[1][0]
            and (saved[0][1], saved[1][1]) == (1, 2)
            and fwd.target is forward
            and fwd.args[0] is x
            and same(fwd, node)
        ):
            continue
        with graph.inserting_before(node):
            named = graph.call_function(
                _aten.norm_backward_op(node.target.__name__.split(".")[0]), (*node.args, float(eps(fwd)))
            )
        named.meta = dict(node.meta)
        empty = x.meta["val"].new_empty(0)
        named.meta["val"] = tuple(empty if v is None else v for v in node.meta["val"])
        node.replace_all_uses_with(named)
        graph.erase_node(node)
    joint.recompile()


def _symbolic(torch, x) -> bool:
    if isinstance(x, torch.Tensor):
        return any(not isinstance(d, int) for d in x.shape)
    return isinstance(x, torch.SymInt)


#: concrete shapes kept per graph Dynamo compiled with symbolic sizes
MAX_SHAPES = 16


def _per_shape(torch, gm, report: Report):
    """A graph with symbolic sizes that could not be traced symbolically: compiled again for each
    concrete signature it meets (its sizes are baked into that trace)."""
    cache: dict = {}

    def run(*args):
        key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
        fn = cache.get(key)
        if fn is None:
            if len(cache) >= MAX_SHAPES:
                cache.pop(next(iter(cache)))
            log.info("symbolic graph: compiling for %s", key)
            fn = cache[key] = _guarded(torch, gm, args, report)
        return fn(*args)

    return run


def _guarded(torch, gm, example_inputs, report: Report, symbolic: bool = False):
    """Compile, and compile again when a parameter or buffer changed since: another tensor in its
    place, or an in-place update (load_state_dict) that a repacked copy (a folded batch norm, a
    transposed weight) would not see. Dynamo does not guard these inputs; their version counters do.
    ``symbolic``: traced once on Dynamo's symbolic fake inputs (a first failure raises)."""
    static_idx = [i for i, x in enumerate(example_inputs) if getattr(x, "_dynamo_static_input_type", None)]
    state: dict = {}

    def build(args, first=False):
        state["key"] = [(args[i].data_ptr(), args[i]._version) for i in static_idx]
        try:
            state["fn"] = _compile(torch, gm, args, report, symbolic=symbolic)
        except Exception as exc:  # tracing or partitioning failed: the graph runs in torch as Dynamo gave it
            if symbolic and first:
                raise
            report.whole_graph_reason = f"opsnn could not take the graph ({type(exc).__name__}: {exc})"
            _fallback(report, "<graph>", "", report.whole_graph_reason)
            state["fn"] = gm.forward

    build(example_inputs, first=True)

    def run(*args):
        if any(args[i].data_ptr() != p or args[i]._version != v for i, (p, v) in zip(static_idx, state["key"])):
            log.info("graph parameters changed since they were compiled: compiling again")
            del report.partitions[:], report.fallbacks[:]
            build(args)
        return state["fn"](*args)

    return run


def _whole_graph_reason(torch, gm, example_inputs) -> str:
    for x in example_inputs:
        if isinstance(x, (int, torch.SymInt)) and not isinstance(x, bool):
            continue  # a size: the graph is compiled per concrete value
        if not isinstance(x, torch.Tensor):
            return f"an input of type {type(x).__name__}"
        if x.device.type != "cpu":
            return f"an input on {x.device} (opsnn runs on the CPU)"
        if x.layout != torch.strided or x.is_quantized:
            return "a sparse or quantized input"
    return ""


_DECOMPOSITIONS: dict = {}


def _writes_in_place(torch, node) -> bool:
    target = getattr(node, "target", None)
    return node.op == "call_function" and isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable


def _decompositions() -> dict:
    """torch's core ATen decompositions, materialized once (building the table costs ~0.2 s a call)."""
    if not _DECOMPOSITIONS:
        from torch._decomp import core_aten_decompositions

        from . import aten as _aten

        table = core_aten_decompositions()
        for op in _aten.bf16_torch_only():
            if op in table:
                table[op] = _whole_in_bfloat16(table[op])
        for op, takes in _aten.kept_whole_in_inference().items():
            if op in table:
                table[op] = _unless(takes, table[op])
        _DECOMPOSITIONS.update(table)
    return _DECOMPOSITIONS


_TRAINING_DECOMPOSITIONS: dict = {}


def _training_decompositions() -> dict:
    """:func:`_decompositions`, except that the backward ops (and the loss) that opsnn lowers onto its
    backward records stay whole wherever that lowering takes their arguments."""
    if not _TRAINING_DECOMPOSITIONS:
        from . import aten as _aten

        table = dict(_decompositions())
        # its second output is the attention matrix where the op's is the logsumexp that the flash
        # backward (autograd's formula, traced whole) reads: torch runs the pair as it is
        table.pop(_torch().ops.aten._scaled_dot_product_flash_attention_for_cpu.default, None)
        for op, takes in _aten.kept_whole_in_training().items():
            if op in table:
                table[op] = _unless(takes, table[op])
        _TRAINING_DECOMPOSITIONS.update(table)
    return _TRAINING_DECOMPOSITIONS


def _unless(takes, decomposition):
    def decompose(*args, **kwargs):
        try:
            keep = takes(*args, **kwargs)
        except TypeError:  # arguments by keyword: decomposed, as before
            keep = False
        return NotImplemented if keep else decomposition(*args, **kwargs)

    return decompose


def _whole_in_bfloat16(decomposition):
    """``decomposition``, except on bfloat16 tensors (or making one): the op then stays one node
    (torch runs it)."""

    def decompose(*args, **kwargs):
        from torch.utils import _pytree as pytree

        torch = _torch()
        leaves = pytree.tree_leaves((args, kwargs))
        if any(x is torch.bfloat16 or (isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16) for x in leaves):
            return NotImplemented
        return decomposition(*args, **kwargs)

    return decompose


def _compile(
    torch,
    gm,
    example_inputs,
    report: Report,
    constants: bool = True,
    label: str = "",
    symbolic: bool = False,
    decompositions: dict | None = None,
):
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupportBase

    from . import aten as _aten

    static = [constants and getattr(x, "_dynamo_static_input_type", None) is not None for x in example_inputs]
    user_idx = [i for i, s in enumerate(static) if not s]
    # traced on fake tensors of fixed shapes (a real trace would run the graph, mutating inputs and
    # buffers once more), functionalized, decomposed to core ATen
    fake_mode = next((x.fake_mode for x in example_inputs if isinstance(x, FakeTensor)), None)
    if symbolic:  # Dynamo's own fake inputs, their sizes symbols of its shape environment
        fakes = [n.meta["example_value"] for n in gm.graph.nodes if n.op == "placeholder"]
        fake_mode = next(x.fake_mode for x in fakes if isinstance(x, FakeTensor))
    elif fake_mode is None:  # aot_autograd hands fake tensors already; Dynamo's backend gets real ones
        fake_mode = FakeTensorMode()
        fakes = [
            fake_mode.from_tensor(x, static_shapes=True) if isinstance(x, torch.Tensor) else x for x in example_inputs
        ]
    else:
        fakes = list(example_inputs)
    # symbolic: composite ops decomposed in Python (the C++ ones read sizes as numbers: guards that
    # would specialize the graph to the first shape), sizes traced as SymInts of Dynamo's shapes
    import contextlib

    from torch._dispatch.python import enable_python_dispatcher

    with fake_mode, enable_python_dispatcher() if symbolic else contextlib.nullcontext():
        if symbolic:  # to ATen first (C++ functionalization would decompose composite ops in C++)
            gm = make_fx(gm, decomposition_table=decompositions or _decompositions())(*fakes)
        traced = make_fx(
            torch.func.functionalize(gm, remove="mutations_and_views"),
            decomposition_table=decompositions or _decompositions(),
        )(*fakes)
        if any(_writes_in_place(torch, n) for n in traced.graph.nodes):
            # a decomposition wrote into a view (circular pad: empty, slices, copy_): functionalized again,
            # for opsnn's view ops are copies that such writes would miss
            traced = make_fx(torch.func.functionalize(traced, remove="mutations_and_views"))(*fakes)
    for n in traced.graph.nodes:
        if _writes_in_place(torch, n) and getattr(n.args[0], "op", None) != "placeholder":
            raise RuntimeError(f"{n.target} writes in place into an intermediate tensor")
    # parameters and buffers become constants: get_attr nodes over the real tensors
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    for k, (node, is_static) in enumerate(zip(placeholders, static)):
        if is_static:
            attr = f"_opsnn_const_{k}"
            t = example_inputs[k]
            if isinstance(t, torch.nn.Parameter):
                traced.register_parameter(attr, t)
            else:
                traced.register_buffer(attr, t, persistent=False)
            with traced.graph.inserting_before(node):
                const = traced.graph.get_attr(attr)
            const.meta = dict(node.meta)
            node.replace_all_uses_with(const)
            traced.graph.erase_node(node)
    traced.graph.eliminate_dead_code()  # unused tuple members (a norm's saved statistics) go
    traced.recompile()
    table = _aten.build_table()
    verdicts: dict = {}

    def verdict(node) -> str:
        """'' when opsnn lowers ``node`` exactly, else the reason it stays in torch."""
        if node in verdicts:
            return verdicts[node]
        if node.op != "call_function":
            return "not a call"
        adapter = table.get(node.target)
        if adapter is None:
            why = "no mapping for this ATen op"
        else:
            try:
                if node.target is _getitem_op():
                    src, i = node.args
                    first_only = getattr(table.get(src.target), "first_only", False)
                    why = verdict(src) or (
                        "" if i == 0 or not first_only else f"output {i} of {src.target} is not computed on opsnn"
                    )
                else:
                    _aten.lower(adapter, node, _aten.Emit(_ProbeGraph(), probe=True))
                    used = sorted({u.args[1] for u in node.users if u.target is _getitem_op()} - {0})
                    if not getattr(adapter, "first_only", False):
                        used = []
                    why = f"its output {used[0]} is used and not computed on opsnn" if used else ""
            except _aten.Unsupported as exc:
                why = str(exc)
            except Exception as exc:  # arguments the adapter did not foresee: torch runs the node
                why = f"the adapter rejected its arguments ({type(exc).__name__}: {exc})"
        verdicts[node] = why
        return why

    class Support(OperatorSupportBase):
        def is_node_supported(self, submodules, node) -> bool:
            return node.op == "call_function" and not verdict(node)

    for node in traced.graph.nodes:
        if (
            node.op == "call_function"
            and verdict(node)
            and not (node.target is _getitem_op() and verdict(node.args[0]))
            and not _size_arithmetic(torch, node)
        ):
            _fallback(report, f"{label}.{node.name}" if label else node.name, node.target, verdict(node))
    partitioned = CapabilityBasedPartitioner(traced, Support(), allows_single_node_partition=True).partition_and_fuse()
    for node in list(partitioned.graph.nodes):
        if node.op != "call_module" or not node.target.startswith("fused_"):
            continue
        sub = getattr(partitioned, node.target)
        name = f"{label}.{node.target}" if label else node.target
        runner = _partition(torch, name, sub, node.args, partitioned, report)
        setattr(partitioned, node.target, runner)
    partitioned.recompile()
    return lambda *args: partitioned(*[args[i] for i in user_idx])


def _size_arithmetic(torch, node) -> bool:
    """A node computing a size of a graph with symbolic shapes (``sym_size``, ``s0 * 2``): torch
    computes it in Python, and opsnn lowerings read the sizes from the shapes they produce."""
    from . import aten as _aten

    if not _aten.is_size(node.meta.get("val")):
        return False
    return not isinstance(node.target, torch._ops.OpOverload) or node.target in (
        torch.ops.aten.sym_size.int,
        torch.ops.aten.sym_numel.default,
        torch.ops.aten.sym_stride.int,
    )


def _getitem_op():
    import operator

    return operator.getitem


class _ProbeGraph:
    """A stand-in graph for support checks: names are free, constants go nowhere."""

    def __init__(self):
        self.initializers: dict = {}
        self._n = 0

    def unique_name(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"


def _get_attr(gm, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _partition(torch, name: str, sub, outer_args, outer_gm, report: Report):
    """An ``nn.Module`` that runs the fused FX submodule ``sub`` as one compiled opsnn graph (or
    ``sub`` itself, in torch, when opsnn cannot compile it)."""
    try:
        return _lowered(torch, name, sub, outer_args, outer_gm, report)
    except Exception as exc:  # the submodule is plain FX: torch runs it as it is
        _fallback(report, name, "partition", f"opsnn could not compile it ({type(exc).__name__}: {exc})")
        return sub


def _lowered(torch, name: str, sub, outer_args, outer_gm, report: Report):
    from ...frontend import compile as _opsnn_compile
    from ...graph.ir import Graph, Node, Value
    from . import aten as _aten

    table = _aten.build_table()
    g = Graph(f"torch_{name}")
    emit = _aten.Emit(g)
    runtime_idx = []
    keep = []  # the torch tensors whose memory the constants share
    ops = []
    symbols: list = []  # (runtime input, dim, sympy symbol) binding each symbol a graph input carries
    carriers = set()  # runtime inputs that are symbolic sizes
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    for node in sub.graph.nodes:
        if node.op == "placeholder":
            i = placeholders.index(node)
            outer = outer_args[i]
            val = node.meta.get("val")
            if _aten.is_size(val):
                if type(val).__name__ != "SymInt" or val.node.maybe_as_int() is not None:
                    continue  # a number: the lowerings read it as one
                # a symbolic size crosses as an input of that length and no bytes (zero strides): the
                # lowerings that need its value read its Shape, known when a plan is built
                if getattr(val.node.expr, "is_Symbol", False):
                    symbols.append((len(runtime_idx), 0, val.node.expr))
                carriers.add(len(runtime_idx))
                runtime_idx.append(i)
                g.inputs.append(Value(emit.out(node), np.dtype(np.uint8), (_aten.dim_spec(val),)))
                continue
            if getattr(outer, "op", None) == "get_attr":
                t = _get_attr(outer_gm, outer.target).detach()
                keep.append(t)
                emit.names[node] = emit.const(node.name, to_numpy(t))  # the parameter's own memory
            else:
                for d, size in enumerate(_aten.shape_of(_aten._val(node))):
                    if not isinstance(size, int) and getattr(size.node.expr, "is_Symbol", False):
                        symbols.append((len(runtime_idx), d, size.node.expr))
                runtime_idx.append(i)
                shape = tuple(_aten.dim_spec(d) for d in _aten.shape_of(_aten._val(node)))
                g.inputs.append(Value(emit.out(node), _aten.np_dtype(node), shape))
        elif node.op == "call_function":
            adapter = table[node.target]
            if node.target is _getitem_op():  # a tuple member: named (and rounded) by its producer
                g.nodes.extend(adapter(node, emit))
            else:
                g.nodes.extend(_aten.lower(adapter, node, emit, check=False))
            ops.append(str(node.target))
        elif node.op == "output":
            result = node.args[0]
            as_tuple = isinstance(result, (tuple, list))
            expected = [_aten.shape_of(_aten._val(r)) for r in (result if as_tuple else [result])]
            seen = set(g.initializers) | set(g.input_names)
            for r in result if as_tuple else [result]:
                out = emit.name(r)
                if out in seen:  # a graph output that is an input, a constant or an earlier output: a copy of it
                    copy = g.unique_name(f"{out}_out")
                    g.nodes.append(Node("Identity", [out], [copy]))
                    out = copy
                seen.add(out)
                g.outputs.append(Value(out))
    _fuse_batch_norm_relu(g)
    g.validate()
    cg = _opsnn_compile(g)
    report.partitions.append((name, ops, cg))
    log.info("partition %s: %d ATen ops on opsnn", name, len(ops))

    class OpsnnPartition(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cg, self._keep, self._as_tuple = cg, keep, as_tuple
            self.torch_reason = ""  # set when opsnn's result disagrees with torch's shapes: torch runs it

        def forward(self, *args):
            if self.torch_reason:
                return sub(*args)
            # the tensors' memory, strides and all; a size as an input of that length and no bytes
            feeds = [
                np.broadcast_to(_NO_BYTES, (int(args[i]),)) if k in carriers else to_numpy(args[i])
                for k, i in enumerate(runtime_idx)
            ]
            outs = []
            threads = torch.get_num_threads()
            try:
                results = self.cg.run(feeds)
                arrays = [t.numpy() for t in results]  # a kernel's failure surfaces here, on waiting
            except OpsnnError as exc:
                self.torch_reason = f"opsnn failed to run it ({type(exc).__name__}: {exc})"
                _fallback(report, name, "partition", self.torch_reason)
                return sub(*args)
            finally:
                # opsnn's oneDNN kernels set OpenMP's thread count, which torch shares: Dynamo guards
                # torch's as global state, and a changed one recompiles every graph
                if torch.get_num_threads() != threads:
                    torch.set_num_threads(threads)
            report.runs[name] = report.runs.get(name, 0) + 1
            plan = self.cg.latest_plan
            in_feeds = _FeedMemory(feeds)
            for out_name, arr in zip(self.cg.output_names, arrays):
                # a constant output (a weight, or folded at plan time) is the same array every call, and
                # an output may be an input's memory: torch gets copies of those, fresh arrays as they are
                if (
                    out_name in self.cg.graph.initializers
                    or (plan is not None and out_name in plan.folded)
                    or in_feeds.overlaps(arr)
                ):
                    arr = arr.copy()
                outs.append(to_torch(arr))
            got = [tuple(o.shape) for o in outs]
            if got != _concrete(expected, {sym: feeds[k].shape[d] for k, d, sym in symbols}, got):
                self.torch_reason = f"opsnn's output shapes {got} differ from torch's {expected}"
                _fallback(report, name, "partition", self.torch_reason)
                return sub(*args)
            return tuple(outs) if self._as_tuple else outs[0]

    return OpsnnPartition()


_NO_BYTES = np.zeros(1, np.uint8)


def _byte_range(a: np.ndarray) -> tuple:
    """``[lo, hi)``: the bytes ``a`` spans (``np.may_share_memory``'s bounds); an empty one spans none."""
    if a.size == 0:
        return (0, 0)
    lo = hi = a.__array_interface__["data"][0]
    for n, st in zip(a.shape, a.strides):
        if st < 0:
            lo += st * (n - 1)
        else:
            hi += st * (n - 1)
    return (lo, hi + a.itemsize)


class _FeedMemory:
    """The byte ranges of a call's inputs, to ask of each output whether it may share their memory
    (what ``np.may_share_memory`` answers) in one search, not one call per input."""

    def __init__(self, feeds: list):
        ranges = sorted(r for r in map(_byte_range, feeds) if r[1] > r[0])
        self.starts = [lo for lo, _ in ranges]
        self.reach = list(itertools.accumulate((hi for _, hi in ranges), max))  # furthest end so far

    def overlaps(self, a: np.ndarray) -> bool:
        lo, hi = _byte_range(a)
        k = bisect.bisect_left(self.starts, hi)  # the inputs starting before a ends
        return hi > lo and k > 0 and self.reach[k - 1] > lo


def _fuse_batch_norm_relu(g) -> None:
    """A training-mode BatchNormalization whose output only a Relu reads takes the ReLU in its own pass
    (``relu=1``), as opsnn's own training graphs have it."""
    readers: dict = {}
    for node in g.nodes:
        for name in node.inputs:
            readers.setdefault(name, []).append(node)
    outputs = {v.name for v in g.outputs}
    fused = set()
    for node in g.nodes:
        if node.op_type != "BatchNormalization" or node.domain or not int(node.attrs.get("training_mode", 0)):
            continue
        y = node.outputs[0]
        users = readers.get(y, [])
        if y in outputs or len(users) != 1 or users[0].op_type != "Relu" or int(node.attrs.get("relu", 0)):
            continue
        node.outputs[0] = users[0].outputs[0]
        node.attrs["relu"] = 1
        fused.add(id(users[0]))
    g.nodes[:] = [n for n in g.nodes if id(n) not in fused]


def _concrete(shapes: list, values: dict, got: list) -> list:
    """``shapes`` (torch sizes, ints or SymInts) with the symbols' concrete ``values``; a dim whose
    expression keeps an unbound symbol is taken as ``got`` has it (nothing to check it against)."""
    out = []
    for shape, have in zip(shapes, got):
        dims = []
        for k, d in enumerate(shape):
            if not isinstance(d, int):
                expr = d.node.expr.xreplace(values)
                known = isinstance(expr, int) or expr.is_Integer
                d = int(expr) if known else (have[k] if k < len(have) else -1)
            dims.append(d)
        out.append(tuple(dims))
    return out


def explain(model, *inputs) -> list:
    """Compile ``model`` with the opsnn backend, run it once on ``inputs`` (under ``torch.no_grad``)
    and print the partitions, the fallbacks with their reasons and each partition's kernels;
    returns the :class:`Report` of every graph Dynamo handed over."""
    torch = _torch()
    reports: list = []

    def recording(gm, example_inputs):
        fn, report = compile_graph(gm, example_inputs)
        reports.append(report)
        return fn

    compiled = torch.compile(model, backend=recording, dynamic=False)
    with torch.no_grad():
        compiled(*inputs)
    print("\n".join(f"graph {i}:\n{r}" for i, r in enumerate(reports)))
    return reports


def to_graph(model, example_inputs, name: str = "torch_export"):
    """``model`` (a ``torch.nn.Module``) as an opsnn :class:`~opsnn.graph.ir.Graph`, through
    ``torch.export`` and core ATen: inputs ``input_0``... (the tensors of ``example_inputs``, their
    shapes fixed), parameters and buffers as initializers (copies), outputs ``output_0``... Save it
    with :func:`opsnn.graph.serialize.save` and run it later without torch. Every ATen op must have
    an exact lowering (:class:`UnsupportedExportError` names the first that does not): put the model
    in eval mode first when it has batch norm or dropout."""
    torch = _torch()
    from torch._decomp import core_aten_decompositions

    from ...graph.ir import Graph, Node, Value
    from . import aten as _aten

    ep = torch.export.export(model, tuple(example_inputs)).run_decompositions(core_aten_decompositions())
    sig = ep.graph_signature
    state = {**dict(ep.named_parameters()), **dict(ep.named_buffers()), **dict(ep.constants)}
    lifted = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    user_outputs = set(sig.user_outputs)
    table = _aten.build_table()
    g = Graph(name)
    emit = _aten.Emit(g)
    n_in = 0
    for node in ep.graph_module.graph.nodes:
        if node.op == "placeholder":
            if node.name in lifted:
                if not node.users:  # a buffer the graph never reads (num_batches_tracked)
                    continue
                t = state[lifted[node.name]].detach()
                if t.dtype != torch.float32:
                    raise UnsupportedExportError(
                        f"to_graph: {lifted[node.name]} is {t.dtype}; float32 parameters and buffers are mapped"
                    )
                emit.names[node] = emit.const(lifted[node.name].replace(".", "_"), t.numpy().copy())
                continue
            if str(_aten._val(node).dtype) not in ("torch.float32", "torch.bool"):
                raise UnsupportedExportError(
                    f"to_graph: input {node.name} is {_aten._val(node).dtype} (mapped: float32)"
                )
            emit.names[node] = f"input_{n_in}"
            g.inputs.append(Value(f"input_{n_in}", _aten.np_dtype(node), _aten._shape(node)))
            n_in += 1
        elif node.op == "call_function":
            adapter = table.get(node.target)
            try:
                if adapter is None:
                    raise _aten.Unsupported("no mapping for this ATen op")
                if node.target is not _getitem_op():
                    _aten.check_dtypes(node)
                g.nodes.extend(adapter(node, emit))
            except _aten.Unsupported as exc:
                raise UnsupportedExportError(f"to_graph: {node.name} ({node.target}): {exc}") from None
        elif node.op == "output":
            outs = [a for a in node.args[0] if getattr(a, "name", None) in user_outputs]
            for i, r in enumerate(outs):
                src = emit.name(r)
                g.nodes.append(Node("Identity", [src], [f"output_{i}"]))
                g.outputs.append(Value(f"output_{i}", _aten.np_dtype(r), _aten._shape(r)))
    g.validate()
    return g
