"""Graph optimization passes: an explicit, ordered, named list; each can be disabled by name
(``opsnn.config.disable_passes(["cse"])``) and reports what it did.

>>> [p.name for p in PASSES][:3]
['variadic_to_binary', 'eliminate_noops', 'constant_folding']
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .. import dtypes as _dt
from ..errors import ParamInvalidError
from ..ops.registry import TensorMeta, get_op, has_op
from ..runtime import hooks
from .ir import Graph, Node

log = logging.getLogger("opsnn.graph.passes")

_NONDETERMINISTIC = {
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "Bernoulli",
    "Multinomial",
}
_FOLD_MAX_BYTES = 256 << 20


@dataclass
class PassResult:
    name: str
    changes: int = 0
    log: list = field(default_factory=list)  # what was done, one line each
    refused: list = field(default_factory=list)  # what was not done, and why
    ms: float = 0.0

    def note(self, msg: str) -> None:
        self.changes += 1
        self.log.append(msg)
        log.debug("%s: %s", self.name, msg)

    def refuse(self, msg: str) -> None:
        self.refused.append(msg)
        log.debug("%s refused: %s", self.name, msg)


@dataclass
class Pass:
    name: str
    fn: Callable[[Graph, PassResult], None]
    level: int = 1  # 1: basic (semantics-preserving cleanups), 2: fusions, 3: layout/precision
    doc: str = ""


@dataclass
class OptimizeReport:
    results: list = field(default_factory=list)
    nodes_before: int = 0
    nodes_after: int = 0

    def summary(self) -> str:
        lines = [f"nodes: {self.nodes_before} -> {self.nodes_after}"]
        for r in self.results:
            lines.append(f"  {r.name:34s} {r.changes:4d} changes  {len(r.refused):3d} refused  {r.ms:8.2f} ms")
        return "\n".join(lines)

    def by_name(self, name: str) -> PassResult:
        return next(r for r in self.results if r.name == name)


# -- helpers -------------------------------------------------------------------------------------
def replace_uses(graph: Graph, old: str, new: str) -> None:
    """Make every reader of value ``old`` read ``new`` instead (subgraphs included)."""
    for _, n in graph.walk():
        n.inputs = [new if i == old else i for i in n.inputs]


def apply_renames(graph: Graph, renamed: dict) -> None:
    """Make every reader (subgraphs included) of a key of ``renamed`` read its value instead, in one
    walk: a pass that bypasses K nodes renames once rather than walking the graph K times."""
    if renamed:
        for _, n in graph.walk():
            n.inputs = [renamed.get(i, i) for i in n.inputs]


def consumers(graph: Graph) -> dict:
    return graph.consumers()


def constants(graph: Graph) -> dict:
    return graph.initializers


def _removable_output(graph: Graph, name: str) -> bool:
    return name not in graph.output_names


def _freeze(v):
    if isinstance(v, np.ndarray):
        return ("nd", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, Graph):
        return ("graph", id(v))
    return v


# -- the passes ----------------------------------------------------------------------------------
def eliminate_noops(graph: Graph, res: PassResult) -> None:
    """Remove Identity, inference-mode Dropout, Cast to the same dtype and Reshape/Expand/
    Squeeze/Unsqueeze/Flatten whose output shape equals the input's."""
    from .shape_inference import infer_types

    metas = users = prods = None
    keep = []
    renamed: dict = {}
    shape_of = {
        n.outputs[0]: n.inputs[0]
        for n in graph.nodes  # Shape(c) outputs -> c
        if n.op_type == "Shape" and not n.domain and n.inputs and n.outputs and not n.attrs
    }
    for n in graph.nodes:
        n.inputs = [renamed.get(i, i) for i in n.inputs]
        src = n.inputs[0] if n.inputs else ""
        out = n.outputs[0] if n.outputs else ""
        drop = False
        if n.domain or not src or not out:
            pass
        elif n.op_type == "Identity":
            drop = True
        elif n.op_type == "Dropout":
            training = len(n.inputs) > 2 and n.inputs[2]
            mask_used = len(n.outputs) > 1 and n.outputs[1]
            drop = not training and not mask_used
        elif n.op_type in ("Cast", "Reshape", "Expand", "Squeeze", "Unsqueeze", "Flatten", "CastLike"):
            if metas is None:
                metas = infer_types(graph)
            a, b = metas.get(src), metas.get(out)
            if n.op_type == "Reshape" and len(n.inputs) > 1 and n.inputs[1] in shape_of:
                b = metas.get(shape_of[n.inputs[1]])  # Reshape(a, Shape(c)): a gets c's shape (opset < 13 Softmax)
            drop = (
                a is not None
                and b is not None
                and a.dtype == b.dtype
                and tuple(a.shape) == tuple(b.shape)
                and all(isinstance(d, (int, np.integer)) or d is not None for d in a.shape)
                and None not in a.shape
            )
        if drop and not _removable_output(graph, out):
            if users is None:
                users, prods = graph.consumers(), graph.producers()
            prod = prods.get(src)
            # src read through a pending rename has readers the consumer map does not count yet
            if (
                prod is not None
                and src not in renamed.values()
                and len(users.get(src, [])) == 1
                and _removable_output(graph, src)
            ):
                # a graph output: the producer of the input writes it instead (its one reader is this node)
                prod.outputs[prod.outputs.index(src)] = out
                res.note(f"removed {n.name} ({n.op_type}); {prod.name} writes the graph output {out!r}")
                continue
            res.refuse(f"{n.name} ({n.op_type}): its output {out!r} is a graph output")
            drop = False
        if drop:
            renamed[out] = src  # src is already resolved: the nodes are in topological order
            res.note(f"removed {n.name} ({n.op_type})")
        else:
            keep.append(n)
    graph.nodes = keep
    apply_renames(graph, renamed)


def variadic_to_binary(graph: Graph, res: PassResult) -> None:
    """``Sum`` / ``Mean`` (older exporters' residuals, e.g. ONNX's zoo ResNet-50 at opset 9) as the
    binary ops the fusions know: Sum(a, b, c) -> Add(Add(a, b), c), Mean(a, b) -> Mul(Add(a, b), 0.5)
    (x * 0.5 and x / 2 round alike: both are the exact half, rounded once; Div by n where 1/n is
    not exact), one input -> Identity."""
    from .shape_inference import infer_types

    metas = None
    out_nodes = []
    for n in graph.nodes:
        ins = [i for i in n.inputs if i]
        if n.domain or n.op_type not in ("Sum", "Mean") or not ins or len(n.outputs) != 1:
            out_nodes.append(n)
            continue
        out = n.outputs[0]
        if len(ins) == 1:
            out_nodes.append(Node("Identity", ins, [out], name=n.name))
            res.note(f"{n.name} ({n.op_type} of one input) -> Identity")
            continue
        scale = None
        if n.op_type == "Mean":
            if metas is None:
                metas = infer_types(graph)
            meta = metas.get(out)
            if meta is None or np.dtype(meta.dtype).kind != "f":
                res.refuse(f"{n.name} (Mean): the output dtype is not known to be a float")
                out_nodes.append(n)
                continue
            exact = len(ins) & (len(ins) - 1) == 0  # a power of two: 1/n is exact
            scale = graph.unique_name(f"{n.name}_scale")
            graph.initializers[scale] = np.array(1.0 / len(ins) if exact else len(ins), dtype=meta.dtype)
        acc = ins[0]
        for k, nxt in enumerate(ins[1:]):
            last = k == len(ins) - 2
            dst = out if last and scale is None else graph.unique_name(f"{out}_sum{k}")
            out_nodes.append(Node("Add", [acc, nxt], [dst], name=n.name if k == 0 else f"{n.name}_add{k}"))
            acc = dst
        if scale is not None:
            op = "Mul" if exact else "Div"
            out_nodes.append(Node(op, [acc, scale], [out], name=f"{n.name}_mean"))
        res.note(f"{n.name} ({n.op_type} of {len(ins)} inputs) -> {len(ins) - 1} Add" + (f" + {op}" if scale else ""))
    graph.nodes = out_nodes


def _const_ints(graph: Graph, name: str):
    v = graph.initializers.get(name) if name else None
    return None if v is None else [int(i) for i in np.asarray(v).reshape(-1)]


def head_forms(graph: Graph, res: PassResult) -> None:
    """Classifier heads as the builder writes them: ReduceMean over H and W of a 4-D tensor
    (torch.onnx, keepdims; the axes an attribute or a constant, folded by now where the dynamo
    exporter computes them) and an unpadded AveragePool whose kernel is the whole (static) image
    (the zoo's) -> GlobalAveragePool, which the blocked layout reads in place."""
    from .shape_inference import infer_types

    metas = None
    for i, n in enumerate(graph.nodes):
        if n.domain or n.op_type not in ("ReduceMean", "AveragePool") or not n.inputs or len(n.outputs) != 1:
            continue
        if metas is None:
            metas = infer_types(graph)
        meta = metas.get(n.inputs[0])
        shape = tuple(meta.shape) if meta is not None and meta.shape is not None else None
        if shape is None or np.dtype(meta.dtype).kind != "f":  # GlobalAveragePool: floats only
            continue
        if len(shape) != 4:
            continue
        if n.op_type == "ReduceMean":
            axes = n.attrs.get("axes")
            axes = list(axes) if axes is not None else _const_ints(graph, n.inputs[1] if len(n.inputs) > 1 else "")
            if axes is None or sorted(a % 4 for a in axes) != [2, 3] or not n.attrs.get("keepdims", 1):
                continue
        else:
            a = n.attrs
            auto = a.get("auto_pad", "NOTSET")
            auto = auto.decode() if isinstance(auto, bytes) else str(auto)
            if (
                list(a.get("kernel_shape") or []) != list(shape[2:])
                or any(a.get("pads") or [])
                or any(v != 1 for v in a.get("dilations") or [])
                or auto not in ("NOTSET", "VALID")
            ):
                continue
        graph.nodes[i] = Node("GlobalAveragePool", [n.inputs[0]], list(n.outputs), name=n.name)
        res.note(f"{n.name} ({n.op_type} over all of H, W) -> GlobalAveragePool")


def _cast_like_target(n: Node, graph: Graph, metas) -> np.ndarray | None:
    """For ``CastLike(constant, x)`` whose ``x`` has a known dtype: a scalar of that dtype, the
    only thing the op reads from ``x`` (torch's dynamo exporter casts every scalar this way)."""
    if metas is None or n.op_type != "CastLike" or n.domain or len(n.inputs) != 2:
        return None
    if n.inputs[0] not in graph.initializers or n.inputs[1] in graph.initializers:
        return None
    meta = metas.get(n.inputs[1])
    return None if meta is None else np.zeros((), meta.dtype)


def constant_folding(graph: Graph, res: PassResult) -> None:
    """Evaluate nodes whose inputs are all constants (``CastLike``: whose first input is, and the
    second's dtype known); their outputs become initializers."""
    from ..ops import executor as _ex
    from .interpreter import BUILTINS
    from .shape_inference import infer_node_types, known_types

    # types kept current through the sweep only for CastLike: a fold there can make the next
    # node's dtype known (the dynamo exporter's Conv biases: CastLike(0, the conv's input))
    metas = values = None
    if any(n.op_type == "CastLike" and not n.domain for n in graph.nodes):
        metas, values = known_types(graph)
    keep = []
    for n in graph.nodes:
        if n.op_type == "Constant" and not n.domain:
            val = BUILTINS[("", "Constant")](None, n, [], None)[0].numpy()
            if val.dtype != object and _removable_output(graph, n.outputs[0]):
                graph.initializers[n.outputs[0]] = val
                if metas is not None:
                    values[n.outputs[0]], metas[n.outputs[0]] = val, TensorMeta(val.shape, val.dtype)
                res.note(f"{n.name}: Constant -> initializer {n.outputs[0]!r}")
                continue
            keep.append(n)
            continue
        ins = [i for i in n.inputs if i]
        target = _cast_like_target(n, graph, metas)
        if target is not None:
            ins = ins[:1]
        foldable = (
            ins
            and all(i in graph.initializers for i in ins)
            and has_op(n.op_type, n.domain)
            and n.op_type not in _NONDETERMINISTIC
            and not any(True for _ in n.subgraphs())
            and all(_removable_output(graph, o) for o in n.outputs if o)
        )
        if not foldable:
            keep.append(n)
            if metas is not None:
                infer_node_types(n, metas, values)
            continue
        args = [graph.initializers[i] if i else None for i in n.inputs[: len(n.inputs) if target is None else 1]]
        if target is not None:
            args.append(target)
        try:
            outs = _ex.call(get_op(n.op_type, n.domain), args, dict(n.attrs), num_outputs=len(n.outputs))
        except Exception as exc:  # noqa: BLE001 - a node that cannot fold stays in the graph
            res.refuse(f"{n.name} ({n.op_type}): evaluation failed: {exc}")
            keep.append(n)
            continue
        outs = outs if isinstance(outs, tuple) else (outs,)
        if sum(t.nbytes for t in outs) > _FOLD_MAX_BYTES:
            res.refuse(f"{n.name} ({n.op_type}): result larger than {_FOLD_MAX_BYTES} bytes")
            keep.append(n)
            continue
        for name, t in zip(n.outputs, outs):
            if name:
                graph.initializers[name] = np.array(t.numpy())
                if metas is not None:
                    values[name] = graph.initializers[name]
                    metas[name] = TensorMeta(graph.initializers[name].shape, graph.initializers[name].dtype)
        res.note(f"folded {n.name} ({n.op_type})")
    graph.nodes = keep


def dead_code_elimination(graph: Graph, res: PassResult) -> None:
    """Remove nodes whose outputs nobody reads, and initializers nobody uses."""
    from .ir import free_names

    # one sweep from the outputs back: the nodes are in topological order, so a node's readers are
    # all decided before it is (a dead chain goes in one sweep, not one sweep per link)
    used = set(graph.output_names)
    live = []
    for n in reversed(graph.nodes):
        if any(o and o in used for o in n.outputs):
            live.append(n)
            used.update(i for i in n.inputs if i)
            used |= free_names(n)
    live_ids = set(map(id, live))
    for n in graph.nodes:
        if id(n) not in live_ids:
            res.note(f"removed {n.name} ({n.op_type}): outputs unused")
    graph.nodes = live[::-1]
    used = set(graph.output_names)
    for _, n in graph.walk():
        used.update(i for i in n.inputs if i)
    for k in list(graph.initializers):
        if k not in used and k not in graph.input_names:
            del graph.initializers[k]
            res.note(f"dropped unused initializer {k!r}")


def common_subexpression_elimination(graph: Graph, res: PassResult) -> None:
    """Merge nodes with the same op, inputs and attributes (deterministic ops only)."""
    seen: dict = {}
    keep = []
    renamed: dict = {}
    for n in graph.nodes:
        n.inputs = [renamed.get(i, i) for i in n.inputs]  # merged values, so duplicates of duplicates merge too
        if n.op_type in _NONDETERMINISTIC or any(True for _ in n.subgraphs()):
            keep.append(n)
            continue
        key = (
            n.domain,
            n.op_type,
            tuple(n.inputs),
            len(n.outputs),
            tuple(sorted((k, _freeze(v)) for k, v in n.attrs.items())),
        )
        first = seen.get(key)
        if first is None:
            seen[key] = n
            keep.append(n)
            continue
        if not all(_removable_output(graph, o) for o in n.outputs if o):
            res.refuse(f"{n.name}: duplicate of {first.name} but writes a graph output")
            keep.append(n)
            continue
        for o, f in zip(n.outputs, first.outputs):
            if o:
                renamed[o] = f
        res.note(f"merged {n.name} into {first.name} ({n.op_type})")
    graph.nodes = keep
    apply_renames(graph, renamed)


def transpose_cancellation(graph: Graph, res: PassResult) -> None:
    """Transpose(Transpose(x, p), q) -> Transpose(x, p∘q), or x when the composition is the identity."""
    # one sweep in topological order: a Transpose's input is final when it is reached, so a chain of
    # K Transposes folds in one pass (not one pass per fold)
    prod = graph.producers()
    users = {k: len(v) for k, v in graph.consumers().items()}
    renamed: dict = {}
    dropped: set = set()
    for n in graph.nodes:
        n.inputs = [renamed.get(i, i) for i in n.inputs]
        if n.op_type != "Transpose" or n.domain:
            continue
        inner = prod.get(n.inputs[0])
        if inner is None or inner.op_type != "Transpose" or inner.domain:
            continue
        p, q = inner.attrs.get("perm"), n.attrs.get("perm")
        if p is None or q is None:
            res.refuse(f"{n.name}: a Transpose without perm (rank unknown)")
            continue
        if sorted(p) != list(range(len(p))) or sorted(q) != sorted(p):  # the node's own check names it later
            res.refuse(f"{n.name}: perms {list(p)} and {list(q)} are not permutations of one rank")
            continue
        composed = [list(p)[i] for i in q]
        src = inner.inputs[0]
        if composed == list(range(len(composed))) and _removable_output(graph, n.outputs[0]):
            renamed[n.outputs[0]] = src
            dropped.add(id(n))
            users[src] = users.get(src, 0) + users.get(n.outputs[0], 0)  # n's readers now read src
            res.note(f"{inner.name} + {n.name}: cancelled")
        else:
            n.inputs[0] = src
            n.attrs["perm"] = composed
            users[src] = users.get(src, 0) + 1
            res.note(f"{inner.name} + {n.name}: merged into one Transpose {composed}")
        users[inner.outputs[0]] -= 1
        if users[inner.outputs[0]] <= 0 and _removable_output(graph, inner.outputs[0]) and id(inner) not in dropped:
            dropped.add(id(inner))
            users[src] = users.get(src, 0) - 1
    graph.nodes = [n for n in graph.nodes if id(n) not in dropped]
    apply_renames(graph, renamed)


def _static_shape(metas: dict, name: str):
    m = metas.get(name)
    if m is None or any(not isinstance(d, (int, np.integer)) for d in m.shape):
        return None
    return tuple(int(d) for d in m.shape)


def matmul_unflatten(graph: Graph, res: PassResult) -> None:
    """``Reshape(MatMul(Reshape(x, (M, K)), W) [+ b], x.shape[:-1] + (N,))`` -> ``MatMul(x, W) [+ b]``
    for a 2-D W and a bias of N values: a linear layer on a (B, S, K) tensor as torch's ATen writes
    it (addmm on the flattened rows), which the N-D MatMul computes alike; without the Reshapes between
    them the epilogue fusion reaches the activation or residual add that follows."""
    from .shape_inference import infer_types

    metas = None
    users = graph.consumers()
    prod = graph.producers()
    dropped: set = set()
    for r2 in graph.nodes:
        if r2.op_type != "Reshape" or r2.domain or id(r2) in dropped:
            continue
        last = prod.get(r2.inputs[0])
        add = last if last is not None and last.op_type == "Add" and not last.domain else None
        mm = prod.get(add.inputs[0]) if add is not None else last
        if mm is None or mm.op_type != "MatMul" or mm.domain or len(mm.inputs) != 2:
            continue
        r1 = prod.get(mm.inputs[0])
        if r1 is None or r1.op_type != "Reshape" or r1.domain:
            continue
        chain = [mm] + ([add] if add is not None else [])
        if any(len(users.get(n.outputs[0], [])) != 1 or not _removable_output(graph, n.outputs[0]) for n in chain):
            continue
        if metas is None:
            metas = infer_types(graph)
        x, w = r1.inputs[0], mm.inputs[1]
        xs, ws, flat, out = (_static_shape(metas, v) for v in (x, w, mm.inputs[0], r2.outputs[0]))
        if None in (xs, ws, flat, out) or len(xs) < 3 or len(ws) != 2 or 0 in xs:
            continue
        if flat != (int(np.prod(xs[:-1])), xs[-1]) or out != xs[:-1] + (ws[1],):
            continue
        if add is not None:
            b = add.inputs[1]
            bs = _static_shape(metas, b)
            if bs is None or len(bs) > 2 or bs[-1:] != (ws[1],) or any(d != 1 for d in bs[:-1]):
                continue
            if metas[b].dtype != metas[mm.outputs[0]].dtype:
                continue
        mm.inputs[0] = x
        chain[-1].outputs[0] = r2.outputs[0]
        if add is not None:
            mm.outputs[0] = graph.unique_name(f"{mm.outputs[0]}_nd")
            add.inputs[0] = mm.outputs[0]
        dropped.add(id(r2))
        res.note(f"{mm.name}: MatMul on {xs} directly (its Reshapes {r1.name}, {r2.name} dropped)")
    graph.nodes = [n for n in graph.nodes if id(n) not in dropped]


def reshape_chains(graph: Graph, res: PassResult) -> None:
    """``Reshape(Reshape(x, s1), s2)`` with a static result and the inner Reshape's only reader: one
    Reshape of x to that shape, or x itself when the shapes agree (attention_head_layout's head merge
    to (B, S, H, D) that torch's ``reshape(B, S, H*D)`` undoes at once)."""
    from .shape_inference import infer_types

    metas = None
    users = graph.consumers()
    prod = graph.producers()
    renamed: dict = {}
    dropped: set = set()
    for r2 in graph.nodes:
        r2.inputs = [renamed.get(i, i) for i in r2.inputs]
        if r2.op_type != "Reshape" or r2.domain or len(r2.inputs) != 2:
            continue
        r1 = prod.get(r2.inputs[0])
        if r1 is None or r1.op_type != "Reshape" or r1.domain or id(r1) in dropped:
            continue
        if len(users.get(r1.outputs[0], [])) != 1 or not _removable_output(graph, r1.outputs[0]):
            continue
        if metas is None:
            metas = infer_types(graph)
        x = r1.inputs[0]
        xs, out = _static_shape(metas, x), _static_shape(metas, r2.outputs[0])
        if out is None or metas.get(x) is None:
            continue
        dropped.add(id(r1))
        if xs == out and _removable_output(graph, r2.outputs[0]):
            dropped.add(id(r2))
            renamed[r2.outputs[0]] = x
            res.note(f"{r1.name} + {r2.name}: cancelled")
        else:
            shape = graph.unique_name(f"{r2.name}_shape")
            graph.initializers[shape] = np.array(out, np.int64)
            r2.inputs = [x, shape]
            r2.attrs = {"allowzero": 1} if 0 in out else {}  # an empty dim is 0, not "copy the input's"
            res.note(f"{r1.name} + {r2.name}: one Reshape to {out}")
    graph.nodes = [n for n in graph.nodes if id(n) not in dropped]
    apply_renames(graph, renamed)


def conv_bn_folding(graph: Graph, res: PassResult) -> None:
    """Conv -> BatchNormalization (inference, constant parameters) into one Conv with new weights."""
    from ..kernels.cpu.norm import scale_rows

    prod = graph.producers()
    users = graph.consumers()
    inits = graph.initializers
    remove = set()
    for bn in graph.nodes:
        if bn.op_type != "BatchNormalization" or bn.domain or len([o for o in bn.outputs if o]) != 1:
            continue
        conv = prod.get(bn.inputs[0])
        if conv is None or conv.op_type != "Conv" or conv.domain:
            continue
        if len(users.get(conv.outputs[0], [])) != 1 or not _removable_output(graph, conv.outputs[0]):
            res.refuse(f"{conv.name} -> {bn.name}: the conv output has other users")
            continue
        params = bn.inputs[1:5]
        if (
            not all(p in inits for p in params)
            or conv.inputs[1] not in inits
            or (len(conv.inputs) > 2 and conv.inputs[2] and conv.inputs[2] not in inits)
        ):
            res.refuse(f"{conv.name} -> {bn.name}: weights or BN parameters are not constant")
            continue
        if bn.attrs.get("training_mode", 0):
            res.refuse(f"{bn.name}: training mode")
            continue
        scale, bias, mean, var = (inits[p].astype(np.float64) for p in params)
        w = inits[conv.inputs[1]]
        eps = float(bn.attrs.get("epsilon", 1e-5))
        factor = scale / np.sqrt(var + eps)
        b = inits[conv.inputs[2]].astype(np.float64) if len(conv.inputs) > 2 and conv.inputs[2] else 0.0
        new_w = scale_rows(w, factor)
        new_b = ((b - mean) * factor + bias).astype(w.dtype)
        wname, bname = graph.unique_name(conv.inputs[1] + "_bnfold"), graph.unique_name(conv.name + "_bias_bnfold")
        inits[wname], inits[bname] = new_w, new_b
        conv.inputs = [conv.inputs[0], wname, bname]
        conv.outputs = [bn.outputs[0]]
        remove.add(id(bn))
        res.note(f"folded {bn.name} into {conv.name}")
    graph.nodes = [n for n in graph.nodes if id(n) not in remove]


_WIDE_FLOATS = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(_dt.bfloat16))
#: ops that commute with a positive scalar factor on their first input: op(s * x) = s * op(x)
_SCALE_COMMUTES = {"Relu", "MaxPool", "GlobalAveragePool", "AveragePool", "Flatten", "Reshape", "Identity"}


def _power_of_two_scalar(graph: Graph, name: str):
    """The value of a positive, power-of-two scalar constant ``name`` of a float type with float32's
    exponent range or more (a factor compounds over residual blocks: float16 would overflow)."""
    v = graph.initializers.get(name)
    if v is None or v.size != 1 or np.dtype(v.dtype) not in _WIDE_FLOATS:
        return None
    c = float(v.reshape(-1)[0])
    return c if np.isfinite(c) and c > 0 and np.frexp(c)[0] == 0.5 else None


def residual_scale_folding(graph: Graph, res: PassResult) -> None:
    """A power-of-two scale of a residual sum (``Mean(a, b)`` = ``Mul(Add(a, b), 0.5)``, from
    variadic_to_binary, or ``(a + b) / 2``) moves into convolution weights, so the conv epilogue takes the residual
    ``Add`` and ``Relu`` as it does a plain ``Add``. Each value carries a factor (stored = true /
    factor): the scale ``Mul`` is dropped and its factor passes through ops that commute with it
    (Relu, pools, Flatten, Reshape); a Conv reading a scaled X takes the factor into a copy of its
    weight, as does a Gemm / MatMul by a constant; an ``Add`` of unequal factors rescales the side
    a Conv writes for it alone (weight and bias); any other reader, and a graph output, gets the
    true value back from one ``Mul``. Scaling by powers of two is exact: the same results barring
    under- and overflow. Only a Mul of an Add that a Conv feeds starts this (a CNN's residual)."""
    if any(True for _, n in graph.walk() for _ in n.subgraphs()):
        return
    prods, users = graph.producers(), graph.consumers()
    inits, outputs = graph.initializers, set(graph.output_names)

    def conv_with_constants(n):
        return (
            n is not None
            and n.op_type == "Conv"
            and not n.domain
            and len(n.inputs) > 1
            and n.inputs[1] in inits
            and (len(n.inputs) < 3 or not n.inputs[2] or n.inputs[2] in inits)
        )

    def starts(n):
        """``(the Add's output, factor)`` when ``n`` is a Mul (Div) by a power-of-two scalar of a
        residual sum read only by it, which a Conv of the scalar's dtype feeds."""
        if n.op_type not in ("Mul", "Div") or n.domain or len(n.inputs) != 2 or n.outputs[0] in outputs:
            return None
        for data, const in (n.inputs, n.inputs[::-1]) if n.op_type == "Mul" else (n.inputs,):
            c = _power_of_two_scalar(graph, const)
            c = 1.0 / c if c is not None and n.op_type == "Div" else c
            add = prods.get(data)
            if c is None or add is None or add.op_type != "Add" or add.domain or data in outputs:
                continue
            convs = [prods.get(i) for i in add.inputs if conv_with_constants(prods.get(i))]
            if len(users.get(data, [])) == 1 and any(inits[cv.inputs[1]].dtype == inits[const].dtype for cv in convs):
                return data, c
        return None

    if not any(starts(n) for n in graph.nodes):
        return

    def scaled_copy(name, factor):
        w = inits[name]
        new = graph.unique_name(name + "_scaled")
        inits[new] = (w * np.asarray(factor, w.dtype)).astype(w.dtype)
        return new

    def sweep(apply: bool) -> tuple[int, int]:
        """One pass in order; ``apply`` False: nothing changes, only ``(Muls dropped, Muls
        made)`` are counted (the rewrite is kept only where it drops more than it makes)."""
        scale: dict = {}  # value -> factor (absent: 1)
        dtype_of: dict = {}  # a scaled value -> its dtype (the scale constant's)
        renamed: dict = {}
        true_of: dict = {}  # scaled value -> the name of its true value, made once
        out_nodes: list = []
        dropped = 0

        def true_value(name):
            if name not in true_of:
                true_of[name] = name
                if apply:
                    c = graph.unique_name(f"{name}_factor")
                    inits[c] = np.array(scale[name], dtype_of[name])
                    true_of[name] = graph.unique_name(f"{name}_true")
                    out_nodes.append(Node("Mul", [name, c], [true_of[name]], name=f"{name}_unscale"))
                    res.note(f"{name}: scaled by {scale[name]}; one Mul makes its true value for a reader")
            return true_of[name]

        for n in graph.nodes:
            ins = [renamed.get(i, i) for i in n.inputs]
            if apply:
                n.inputs = ins
            st = starts(n)
            if st is not None:
                data, c = st
                renamed[n.outputs[0]] = data
                scale[data] = scale.get(data, 1.0) * c
                dtype_of[data] = inits[ins[1] if ins[0] == data else ins[0]].dtype
                dropped += 1
                if apply:
                    res.note(f"{n.name}: {n.op_type} scaling a residual sum by {c} folded into the convolutions")
                continue
            scaled = [i for i in ins if i and scale.get(i, 1.0) != 1.0]
            x = ins[0] if ins else ""
            if not scaled:
                pass
            elif n.op_type in _SCALE_COMMUTES and not n.domain and scaled == [x]:
                scale[n.outputs[0]], dtype_of[n.outputs[0]] = scale[x], dtype_of[x]
            elif scaled == [x] and (
                conv_with_constants(n) or (n.op_type in ("Gemm", "MatMul") and not n.domain and ins[1] in inits)
            ):
                if apply:
                    n.inputs[1] = scaled_copy(ins[1], scale[x])
                    res.note(f"{n.name} ({n.op_type}): reads its input scaled by {scale[x]}; its weight takes it")
            elif n.op_type == "Add" and not n.domain and len(ins) == 2:
                a, b = ins
                fa, fb = scale.get(a, 1.0), scale.get(b, 1.0)
                done = fa == fb
                for side, f_side, f_other in ((a, fa, fb), (b, fb, fa)):
                    conv = prods.get(side)
                    if done or not conv_with_constants(conv) or len(users.get(side, [])) != 1 or side in outputs:
                        continue
                    if apply:  # the conv writes side / f_other: weight and bias times f_side / f_other
                        conv.inputs[1] = scaled_copy(conv.inputs[1], f_side / f_other)
                        if len(conv.inputs) > 2 and conv.inputs[2]:
                            conv.inputs[2] = scaled_copy(conv.inputs[2], f_side / f_other)
                        res.note(f"{conv.name}: output rescaled by {f_side / f_other} to the residual's factor")
                    scale[side] = f_other
                    done = True
                if done:
                    scale[n.outputs[0]] = scale.get(a, 1.0)
                    dtype_of[n.outputs[0]] = dtype_of[a] if a in dtype_of else dtype_of[b]
                else:
                    ins = [true_value(i) if i in scaled else i for i in ins]
            else:
                ins = [true_value(i) if i in scaled else i for i in ins]
            if apply:
                n.inputs = ins
                out_nodes.append(n)
        made = len(true_of) + sum(1 for o in outputs if scale.get(o, 1.0) != 1.0)
        if not apply:
            return dropped, made
        graph.nodes = out_nodes
        for o in graph.output_names:
            if scale.get(o, 1.0) != 1.0:  # a graph output keeps its name and true value
                prod = graph.producers()[o]
                inner = graph.unique_name(f"{o}_scaled")
                prod.outputs[prod.outputs.index(o)] = inner
                for m in graph.nodes:
                    m.inputs = [inner if i == o else i for i in m.inputs]
                c = graph.unique_name(f"{o}_factor")
                inits[c] = np.array(scale[o], dtype_of[o])
                graph.nodes.append(Node("Mul", [inner, c], [o], name=f"{o}_unscale"))
                res.note(f"graph output {o}: one Mul makes its true value")
        apply_renames(graph, renamed)
        return dropped, made

    dropped, made = sweep(apply=False)
    if made >= dropped:
        res.refuse(f"{dropped} residual scale(s) would need {made} Mul(s) to restore true values elsewhere")
        return
    sweep(apply=True)


def user_rewrites(graph: Graph, res: PassResult) -> None:
    """Rules registered with ``opsnn.optimize.register_rewrite_rule`` (fixed point, loop guard)."""
    from . import rules as _rules
    from .pattern import rewrite

    if not _rules.USER_RULES:
        return
    report = rewrite(graph, list(_rules.USER_RULES))
    for rule, nodes in report.applied:
        res.note(f"rule {rule}: replaced {', '.join(nodes)}")
    for rule, root, why in report.refused:
        res.refuse(f"rule {rule} at {root}: {why}")


def _rule_pass(group: str):
    def run_rules(graph: Graph, res: PassResult) -> None:
        from . import fusion  # noqa: F401 - registers the library's rule groups
        from . import rules as _rules
        from .pattern import OpPattern, rewrite
        from .shape_inference import infer_types, probe_types

        rules = _rules.BUILTIN_GROUPS[group]
        present = {n.op_type for n in graph.nodes}
        if all(isinstance(r.pattern, OpPattern) and not r.pattern.op_types & present for r in rules):
            return  # no node can root a match: skip the type inference and the probe run
        infer_types(graph)
        fusion.PROBE_SHAPES[graph] = probe_types(graph)  # rule checks read concrete probe shapes
        try:
            report = rewrite(graph, rules)
        finally:
            fusion.PROBE_SHAPES.pop(graph, None)
        for rule, nodes in report.applied:
            res.note(f"{rule}: {', '.join(nodes)}")
        for rule, root, why in report.refused:
            res.refuse(f"{rule} at {root}: {why}")

    run_rules.__doc__ = f"The library's {group.replace('_', ' ')} rules (see graph.fusion)."
    return run_rules


def _attention_head_layout(graph: Graph, res: PassResult) -> None:
    from .fusion import attention_head_layout

    attention_head_layout(graph, res)


def _elementwise_fusion(graph: Graph, res: PassResult) -> None:
    from .elementwise_fusion import elementwise_fusion

    elementwise_fusion(graph, res)


def _sibling_product_fusion(graph: Graph, res: PassResult) -> None:
    from .fusion import sibling_product_fusion

    sibling_product_fusion(graph, res)


def _resize_prologue_fusion(graph: Graph, res: PassResult) -> None:
    from .fusion import resize_prologue_fusion

    resize_prologue_fusion(graph, res)


def _blocked_layout(graph: Graph, res: PassResult) -> None:
    from .blocked_layout import blocked_layout

    blocked_layout(graph, res)


def _mixed_precision(graph: Graph, res: PassResult) -> None:
    from .mixed_precision import apply_mixed_precision

    apply_mixed_precision(graph, res)


PASSES: list[Pass] = [
    Pass("variadic_to_binary", variadic_to_binary, 1, "Sum/Mean of inputs -> Add (+ Mul by 1/n)"),
    Pass("eliminate_noops", eliminate_noops, 1, "Identity/Dropout/no-op Cast/Reshape elimination"),
    Pass("constant_folding", constant_folding, 1, "evaluate constant subgraphs at compile time"),
    Pass(
        "head_forms",
        head_forms,
        1,
        "torch's ReduceMean(H, W) and the zoo's whole-image AveragePool heads -> GlobalAveragePool",
    ),
    Pass("dead_code_elimination", dead_code_elimination, 1, "drop unused nodes and initializers"),
    Pass("common_subexpression_elimination", common_subexpression_elimination, 1, "merge identical nodes"),
    Pass("transpose_cancellation", transpose_cancellation, 1, "cancel/merge consecutive Transposes"),
    Pass("conv_bn_folding", conv_bn_folding, 2, "fold inference BatchNorm into the preceding Conv"),
    Pass(
        "matmul_unflatten",
        matmul_unflatten,
        2,
        "Reshape(MatMul(Reshape(x), W) + b) of a flattened (B, S, K) x -> an N-D MatMul on x",
    ),
    Pass(
        "pattern_recognition",
        _rule_pass("pattern_recognition"),
        2,
        "Gelu/LayerNorm/RMSNorm/SiLU from their decomposed ONNX forms",
    ),
    Pass("attention_fusion", _rule_pass("attention_fusion"), 2, "MatMul-Scale-Mask-Softmax-MatMul -> Attention"),
    Pass(
        "attention_head_layout",
        lambda g, r: _attention_head_layout(g, r),
        2,
        "Attention reads/writes (B, S, H*D) directly instead of head split/merge Transposes",
    ),
    Pass("reshape_chains", reshape_chains, 2, "Reshape(Reshape(x)) -> one Reshape of x, or x"),
    Pass("user_rewrites", user_rewrites, 2, "user-registered rewrite rules"),
    Pass(
        "residual_scale_folding",
        residual_scale_folding,
        2,
        "a power-of-two scale of a residual sum (Mean of two) into the convolutions' weights",
    ),
    Pass(
        "epilogue_fusion",
        _rule_pass("epilogue_fusion"),
        2,
        "bias, activation and residual add into Conv/MatMul epilogues",
    ),
    Pass(
        "sibling_product_fusion",
        lambda g, r: _sibling_product_fusion(g, r),
        2,
        "FusedMatMuls of one input and constant weights (Q, K, V) -> one wider product and a Split",
    ),
    Pass(
        "resize_prologue_fusion",
        lambda g, r: _resize_prologue_fusion(g, r),
        2,
        "Transpose/Unsqueeze -> Cast -> Resize (an image's uint8 HWC -> float NCHW) as one FusedResize",
    ),
    Pass(
        "elementwise_fusion",
        lambda g, r: _elementwise_fusion(g, r),
        2,
        "same-shape elementwise chains -> one generated numba kernel",
    ),
    Pass(
        "mixed_precision",
        lambda g, r: _mixed_precision(g, r),
        3,
        "per-op-type compute dtypes from opsnn.config.allow_mix_precision",
    ),
    Pass(
        "blocked_layout",
        lambda g, r: _blocked_layout(g, r),
        3,
        "conv chains on channel-blocked (nhwc / nChw16c / nChw8c) activations with oneDNN's convolutions",
    ),
    Pass("final_dead_code_elimination", dead_code_elimination, 1, "clean up after fusions"),
]

_disabled: set[str] = set()


def pass_names() -> list[str]:
    return [p.name for p in PASSES]


def disable_passes(names) -> None:
    """Disable passes by name (replaces the previous set; ``[]`` re-enables all)."""
    names = [names] if isinstance(names, str) else list(names)
    unknown = [n for n in names if n not in pass_names()]
    if unknown:
        raise ParamInvalidError(f"disable_passes: unknown pass(es) {unknown}; passes are {pass_names()}")
    _disabled.clear()
    _disabled.update(names)


def disabled_passes() -> set[str]:
    return set(_disabled)


def optimize(graph: Graph, level: int = 3, disabled=None) -> OptimizeReport:
    """Run the enabled passes up to ``level`` in order, in place; returns what each did."""
    off = _disabled | set(disabled or ())
    report = OptimizeReport(nodes_before=len(graph.nodes))
    import sys

    from tqdm import tqdm

    # a progress bar for big graphs on a terminal only
    bar = tqdm(
        PASSES,
        desc=f"compile {graph.name}",
        unit="pass",
        leave=False,
        disable=len(graph.nodes) < 300 or not sys.stderr.isatty(),
    )
    for p in bar:
        if p.level > level or p.name in off:
            continue
        res = PassResult(p.name)
        t0 = time.perf_counter()
        with graph.reserving_names():  # unique_name from one set per pass, not a graph scan per call
            p.fn(graph, res)
        t1 = time.perf_counter()
        res.ms = (t1 - t0) * 1e3
        hooks.host_phase(f"pass {p.name}", "pass", t0, t1, changes=res.changes)
        graph.validate()
        report.results.append(res)
        if res.changes:
            log.info("pass %s: %d changes", p.name, res.changes)
    report.nodes_after = len(graph.nodes)
    return report
