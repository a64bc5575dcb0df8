"""Elementwise-chain fusion: maximal groups of same-shape elementwise ops (single consumers,
scalar constants allowed) become one ``opsnn::FusedElementwise`` node whose generated numba
kernel reads each input once and writes once (see kernels/cpu/codegen.py). A group holds at most
:data:`MAX_FUSED_OPS` ops: numba's compile time grows faster than the kernel's length, so a long
chain becomes several bounded kernels (a chain of one op type reuses one of them), and one graph
generates at most :data:`MAX_FUSED_KERNELS` distinct kernels (each costs a numba compile; past the
budget, groups that would need a new one stay unfused and run on the ops' own kernels)."""

from __future__ import annotations

import json

import numpy as np

from ..kernels.cpu.codegen import TEMPLATES, signature
from .ir import Graph, Node
from .shape_inference import infer_types

_FLOAT_KINDS = "f"
_BINARY = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"}
#: the most ops one generated kernel computes
MAX_FUSED_OPS = 32
#: the most distinct generated kernels (programs) one graph may need
MAX_FUSED_KERNELS = 32


def _scalar_const(graph: Graph, name: str):
    a = graph.initializers.get(name)
    if a is not None and a.size == 1 and a.dtype.kind in "fiu":
        return float(a.reshape(-1)[0])
    return None


def _zero_const(graph: Graph, name: str) -> bool:
    a = graph.initializers.get(name)
    return a is not None and a.size == 1 and a.dtype.kind == "f" and a.reshape(-1)[0] == 0 and not np.signbit(a).any()


def _finite_scalar_of(graph: Graph, name: str, dtype) -> float | None:
    """The value of a one-element float constant of ``dtype`` that is finite, else None."""
    a = graph.initializers.get(name)
    if a is None or a.size != 1 or a.dtype != np.dtype(dtype) or not np.isfinite(a).all():
        return None
    return float(a.reshape(-1)[0])


def _relu_grads(graph: Graph, metas: dict, consumers: dict, outputs: set, res) -> dict:
    """Replace each ReLU backward (the mask read by its Where alone, g and y of one float shape) by one
    step that the chains below can absorb: no boolean mask is written and read back. opsnn's
    ``Where(Greater(y, 0), g, 0)`` becomes ``ReluGrad(g, y)``, torch's threshold_backward
    ``Where(LessOrEqual(y, t), 0, g)`` becomes ``ThresholdGrad(g, y)`` with ``threshold`` t (they differ
    where y is NaN). Returns {id(step node): (compare, Where)} to restore a pair that ends up unfused."""
    producers = graph.producers()
    pairs: dict = {}
    keep = []
    for n in graph.nodes:
        keep.append(n)
        if n.op_type != "Where" or n.domain or len(n.inputs) != 3 or len(n.outputs) != 1:
            continue
        mask, on_true, on_false = n.inputs
        p = producers.get(mask)
        if p is None or p.op_type not in ("Greater", "LessOrEqual") or p.domain:
            continue
        if len(p.inputs) != 2 or len(p.outputs) != 1 or mask in outputs or len(consumers.get(mask, [])) != 1:
            continue
        y, threshold = p.inputs
        g, zero = (on_true, on_false) if p.op_type == "Greater" else (on_false, on_true)
        if not g or not y or not _zero_const(graph, zero):
            continue
        mo, mg, my = metas.get(n.outputs[0]), metas.get(g), metas.get(y)
        if mo is None or mg is None or my is None or np.dtype(mo.dtype).kind not in _FLOAT_KINDS:
            continue
        if not (tuple(mo.shape) == tuple(mg.shape) == tuple(my.shape) and mo.dtype == mg.dtype == my.dtype):
            continue
        if p.op_type == "Greater":
            if not _zero_const(graph, threshold):
                continue
            step = Node("ReluGrad", [g, y], list(n.outputs), name=n.name)
        else:
            t = _finite_scalar_of(graph, threshold, my.dtype)  # y <= t compared in y's dtype, as unfused
            if t is None:
                continue
            step = Node("ThresholdGrad", [g, y], list(n.outputs), {"threshold": t}, name=n.name)
        pairs[id(step)] = (p, n)
        keep[-1] = step
        res.note(f"{p.name} -> {n.name}: the ReLU backward as one step of a fused kernel")
    if pairs:
        dropped = {id(p) for p, _ in pairs.values()}
        graph.nodes = [n for n in keep if id(n) not in dropped]
    return pairs


def elementwise_fusion(graph: Graph, res) -> None:
    metas = infer_types(graph)
    consumers = graph.consumers()
    outputs = set(graph.output_names)
    relu_grads = _relu_grads(graph, metas, consumers, outputs, res)
    producers = graph.producers()
    consumers = graph.consumers()
    index = {id(n): i for i, n in enumerate(graph.nodes)}

    def out_meta(n: Node):
        return metas.get(n.outputs[0]) if n.outputs else None

    def fusible(n: Node):
        if n.domain or n.op_type not in TEMPLATES or len(n.outputs) != 1 or any(True for _ in n.subgraphs()):
            return False
        if n.op_type == "Gelu" and (n.attrs.get("approximate", "none") not in ("none", b"none")):
            return False
        if n.op_type in _BINARY and len([i for i in n.inputs if i]) != 2:
            return False
        m = out_meta(n)
        if m is None or np.dtype(m.dtype).kind not in _FLOAT_KINDS or None in m.shape:
            return False
        for v in n.inputs:
            if not v:
                return False
            if _scalar_const(graph, v) is not None:
                continue
            vm = metas.get(v)
            if vm is None or tuple(vm.shape) != tuple(m.shape) or vm.dtype != m.dtype:
                return False
        return True

    assigned: set = set()
    groups = []
    for n in reversed(graph.nodes):
        if id(n) in assigned or not fusible(n):
            continue
        group, frontier = [n], [n]
        assigned.add(id(n))
        while frontier:
            m = frontier.pop()
            for v in m.inputs:
                p = producers.get(v)
                if p is None or id(p) in assigned or not fusible(p):
                    continue
                if v in outputs or len(consumers.get(v, [])) != 1:
                    res.refuse(f"{p.name} -> {m.name}: {v!r} has other consumers or is a graph output")
                    continue
                if len(group) >= MAX_FUSED_OPS:  # p starts a group of its own (it is met later in the sweep)
                    res.refuse(f"{p.name} -> {m.name}: the kernel of {n.name} already computes {MAX_FUSED_OPS} ops")
                    continue
                group.append(p)
                assigned.add(id(p))
                frontier.append(p)
        if len(group) >= 2 or id(n) in relu_grads:  # a lone ReLU backward step still saves the mask's pass
            groups.append(sorted(group, key=lambda x: index[id(x)]))
        else:
            assigned.discard(id(n))
    if not groups and not relu_grads:
        return
    replace = {}
    programs: set = set()
    for group in groups:
        root = group[-1]
        inputs: list[str] = []
        step_of = {}
        program = []
        for k, node in enumerate(group):
            args = []
            for v in node.inputs:
                if v in step_of:
                    args.append(["step", step_of[v]])
                elif _scalar_const(graph, v) is not None:
                    args.append(["const", _scalar_const(graph, v)])
                else:
                    if v not in inputs:
                        inputs.append(v)
                    args.append(["in", inputs.index(v)])
            attrs = (
                {"alpha": float(node.attrs["alpha"])}
                if node.op_type in ("Swish", "LeakyRelu") and "alpha" in node.attrs
                else {}
            )
            if node.op_type == "ThresholdGrad":
                attrs = {"threshold": float(node.attrs["threshold"])}
            program.append([node.op_type, args, attrs])
            step_of[node.outputs[0]] = k
        if not inputs:  # all-constant chains are constant folding's job
            continue
        sig = signature(program, len(inputs))
        if sig not in programs and len(programs) >= MAX_FUSED_KERNELS:
            res.refuse(
                f"{root.name}: the graph already needs {MAX_FUSED_KERNELS} distinct fused kernels; "
                f"{len(group)} ops left unfused"
            )
            continue
        programs.add(sig)
        fused = Node(
            "FusedElementwise",
            inputs,
            list(root.outputs),
            {"program": json.dumps(program)},
            domain="opsnn",
            name=graph.unique_name(f"FusedElementwise_{root.name}"),
        )
        fused.attrs_origin = [x.name for x in group]
        replace[id(root)] = fused
        for x in group[:-1]:
            replace[id(x)] = None
        res.note(f"fused {len(group)} ops ({' -> '.join(x.op_type for x in group)}) into {fused.name}")
    nodes = []
    for n in graph.nodes:
        r = replace.get(id(n), n)
        if r is None:
            continue
        if id(r) in relu_grads:  # left unfused (the kernel budget): the compare and Where it stood for
            nodes.extend(relu_grads[id(r)])
        else:
            nodes.append(r)
    graph.nodes = nodes
