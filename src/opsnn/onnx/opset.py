"""Opset adapters: rewrite nodes written for an older ONNX opset into the latest form.

opsnn's op records follow the latest ONNX spec of each op (e.g. ``Squeeze`` takes
``axes`` as an input, ``Clip`` takes ``min``/``max`` as inputs). A model written for an
older opset is upgraded node by node: every adapter registered for ``(domain, op)`` with
``since`` greater than the model's opset runs in ascending ``since`` order, each turning
the form used before ``since`` into the form introduced at ``since``::

    @adapter("Squeeze", 13)            # before opset 13, axes was an attribute
    def _squeeze_axes(node, ctx):
        attr_to_input(node, ctx, "axes", 1, np.int64)

An adapter edits ``node`` in place and returns None, or returns the list of nodes that
replace it. ``ctx`` (:class:`AdapterContext`) adds constants and fresh value names and
tells what is known about a value's type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..graph.ir import Graph, Node, Value

#: the newest ai.onnx opset whose node forms the op records follow
MAX_OPSET = 28

#: newest supported version of other well-known domains
DOMAIN_MAX = {"": MAX_OPSET, "ai.onnx.ml": 5, "ai.onnx.preview.training": 1, "ai.onnx.preview": 1, "opsnn": 1}


@dataclass(frozen=True)
class Adapter:
    op: str
    since: int
    fn: Callable
    domain: str = ""
    doc: str = ""


#: ``(domain, op) -> adapters sorted by since``
ADAPTERS: dict[tuple[str, str], list[Adapter]] = {}


def adapter(op: str | tuple, since: int, domain: str = "") -> Callable:
    """Register ``fn(node, ctx)`` upgrading ``op`` nodes written before opset ``since``."""
    ops = (op,) if isinstance(op, str) else tuple(op)

    def deco(fn):
        for name in ops:
            lst = ADAPTERS.setdefault((domain, name), [])
            lst.append(Adapter(name, since, fn, domain, (fn.__doc__ or "").strip()))
            lst.sort(key=lambda a: a.since)
        return fn

    return deco


class AdapterContext:
    """What adapters may use: the graph being built (for constants) and known value types."""

    def __init__(self, graph: Graph, opset: int, lookup: Callable[[str], Value | None], names: set | None = None):
        self.graph = graph
        self.opset = opset
        self._lookup = lookup
        self._names = names  # every name in use (shared across a model's import), else scan the graph

    def fresh(self, hint: str) -> str:
        """A value/node name used nowhere else."""
        if self._names is None:
            return self.graph.unique_name(hint)
        return fresh_name(self._names, hint)

    def const(self, array, hint: str) -> str:
        """Add ``array`` as an initializer of the graph; returns its value name."""
        name = self.fresh(hint)
        self.graph.initializers[name] = np.asarray(array)
        return name

    def value(self, name: str) -> Value | None:
        """The declared type of ``name`` if the model states it (else None)."""
        return self._lookup(name) if name else None

    def rank(self, name: str) -> int | None:
        v = self.value(name)
        return None if v is None or v.shape is None or v.kind != "tensor" else len(v.shape)

    def dtype(self, name: str):
        v = self.value(name)
        return None if v is None else v.dtype

    def constant(self, name: str):
        """The initializer value of ``name`` when it is a constant of this graph, else None."""
        return self.graph.initializers.get(name)


class NameSet(set):
    """The names in use, remembering per hint the last suffix :func:`fresh_name` gave it, so that
    asking for the same hint n times costs O(n), not O(n^2)."""

    def __init__(self, names=()):
        super().__init__(names)
        self.last_suffix: dict[str, int] = {}


def fresh_name(taken: set, hint: str) -> str:
    """``hint`` (or ``hint_<k>``) not in ``taken``; adds it to ``taken``."""
    counters = getattr(taken, "last_suffix", None)
    k = counters.get(hint, 0) if counters is not None else 0
    name = hint if k == 0 else f"{hint}_{k}"
    while name in taken:
        k += 1
        name = f"{hint}_{k}"
    taken.add(name)
    if counters is not None:
        counters[hint] = k
    return name


def upgrade(node: Node, opset: int, ctx: AdapterContext) -> list[Node]:
    """Apply every adapter of ``node``'s op newer than ``opset``; returns the replacement nodes."""
    if node.domain == "" and opset < 7:
        node.attrs.pop("consumed_inputs", None)  # a pre-opset-6 memory hint, meaningless today
    nodes = [node]
    for ad in ADAPTERS.get((node.domain, node.op_type), ()):
        if opset >= ad.since:
            continue
        out: list[Node] = []
        for n in nodes:
            if n.op_type != ad.op or n.domain != ad.domain:
                out.append(n)
                continue
            res = ad.fn(n, ctx)
            out.extend([n] if res is None else res)
        nodes = out
    return nodes


# -- helpers -----------------------------------------------------------------------------------------
def set_input(node: Node, index: int, name: str) -> None:
    while len(node.inputs) <= index:
        node.inputs.append("")
    node.inputs[index] = name


def attr_to_input(node: Node, ctx: AdapterContext, attr: str, index: int, dtype, default=None) -> None:
    """Move attribute ``attr`` to input ``index`` as a constant (``default`` when absent)."""
    val = node.attrs.pop(attr, default)
    if val is None:
        return
    set_input(node, index, ctx.const(np.asarray(val, dtype=dtype), f"{node.name}_{attr}"))


def like_input(node: Node, ctx: AdapterContext, value, ref: str, hint: str) -> tuple[str, list[Node]]:
    """A constant with the dtype of value ``ref``: direct when the dtype is known, else
    float32 followed by a CastLike node."""
    dt = ctx.dtype(ref)
    if dt is not None:
        return ctx.const(np.asarray(value, dtype=dt), hint), []
    raw = ctx.const(np.asarray(value, dtype=np.float32), hint + "_f32")
    out = ctx.fresh(hint)
    return out, [Node("CastLike", [raw, ref], [out], name=ctx.fresh(f"{node.name}_{hint}_castlike"))]


# -- element-wise legacy forms -------------------------------------------------------------------
_LEGACY_BCAST = ("Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Greater", "Less")


@adapter(_LEGACY_BCAST + ("Gemm",), 7)
def _legacy_broadcast(node, ctx):
    """Before opset 7 binary ops broadcast only with broadcast=1 (optionally aligned at
    ``axis``); numpy-style broadcasting subsumes it once B is padded with trailing 1-dims."""
    node.attrs.pop("broadcast", None)
    axis = node.attrs.pop("axis", None)
    if axis is None or node.op_type == "Gemm":
        return None
    ra, rb = ctx.rank(node.inputs[0]), ctx.rank(node.inputs[1])
    if ra is None or rb is None:
        from .errors import UnsupportedOpError

        raise UnsupportedOpError(
            f"{node.op_type} (node {node.name!r}): legacy broadcast with axis={axis} needs "
            "the ranks of both inputs, which the model does not declare",
            op=node.op_type,
        )
    extra = ra - (axis % ra) - rb
    if extra <= 0:
        return None
    axes = ctx.const(np.arange(rb, rb + extra, dtype=np.int64), f"{node.name}_bcast_axes")
    b = ctx.fresh(f"{node.inputs[1]}_aligned")
    pre = Node("Unsqueeze", [node.inputs[1], axes], [b], name=ctx.fresh(f"{node.name}_align"))
    node.inputs[1] = b
    return [pre, node]


@adapter("Cast", 6)
def _cast_to_string(node, ctx):
    """Cast-1 named the target type as a string ("FLOAT")."""
    to = node.attrs.get("to")
    if isinstance(to, (str, bytes)):
        from onnx import TensorProto

        name = to.decode() if isinstance(to, bytes) else to
        node.attrs["to"] = int(TensorProto.DataType.Value(name.upper()))


@adapter("Concat", 4)
def _concat_axis(node, ctx):
    """Concat-1 defaulted axis to 1."""
    node.attrs.setdefault("axis", 1)


@adapter("Reshape", 5)
def _reshape_shape(node, ctx):
    """Reshape-1 took the target shape as attribute ``shape``."""
    attr_to_input(node, ctx, "shape", 1, np.int64)


@adapter("Tile", 6)
def _tile_v1(node, ctx):
    """Tile-1 took (input, tiles, axis) scalars; Tile-6 takes a repeats vector."""
    from .errors import UnsupportedOpError

    raise UnsupportedOpError(
        f"Tile (node {node.name!r}): the opset-1 form (tiles, axis) is not supported; "
        "re-export the model with opset >= 6",
        op="Tile",
    )


# -- attributes that became inputs ----------------------------------------------------------------
@adapter("Split", 13)
def _split_attr(node, ctx):
    """Split-2..11 took ``split`` as an attribute."""
    attr_to_input(node, ctx, "split", 1, np.int64)


@adapter("Split", 18)
def _split_num_outputs(node, ctx):
    """Split-18 needs ``num_outputs`` when no ``split`` input is given (equal split)."""
    if (len(node.inputs) < 2 or not node.inputs[1]) and "num_outputs" not in node.attrs:
        node.attrs["num_outputs"] = len(node.outputs)


@adapter(("Squeeze", "Unsqueeze"), 13)
def _squeeze_axes(node, ctx):
    """(Un)Squeeze before 13 took ``axes`` as an attribute."""
    attr_to_input(node, ctx, "axes", 1, np.int64)


@adapter("ReduceSum", 13)
@adapter(
    (
        "ReduceMax",
        "ReduceMin",
        "ReduceMean",
        "ReduceProd",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceSumSquare",
    ),
    18,
)
def _reduce_axes(node, ctx):
    """Reductions took ``axes`` as an attribute (ReduceSum before 13, the others before 18)."""
    attr_to_input(node, ctx, "axes", 1, np.int64)


@adapter("Clip", 11)
def _clip_attrs(node, ctx):
    """Clip before 11 took ``min``/``max`` as float attributes."""
    pre: list[Node] = []
    for idx, key in ((1, "min"), (2, "max")):
        if key in node.attrs:
            name, nodes = like_input(node, ctx, node.attrs.pop(key), node.inputs[0], f"{node.name}_{key}")
            set_input(node, idx, name)
            pre += nodes
    return pre + [node] if pre else None


@adapter("Pad", 2)
def _pad_paddings(node, ctx):
    """Pad-1 called ``pads`` ``paddings``."""
    if "paddings" in node.attrs:
        node.attrs["pads"] = node.attrs.pop("paddings")


@adapter("Pad", 11)
def _pad_attrs(node, ctx):
    """Pad before 11 took ``pads`` and ``value`` as attributes."""
    attr_to_input(node, ctx, "pads", 1, np.int64)
    value = node.attrs.pop("value", None)
    if value is not None and float(value) != 0.0:
        name, pre = like_input(node, ctx, value, node.inputs[0], f"{node.name}_value")
        set_input(node, 2, name)
        return pre + [node]
    return None


@adapter("Slice", 10)
def _slice_attrs(node, ctx):
    """Slice-1 took ``starts``/``ends``/``axes`` as attributes."""
    attr_to_input(node, ctx, "starts", 1, np.int64)
    attr_to_input(node, ctx, "ends", 2, np.int64)
    attr_to_input(node, ctx, "axes", 3, np.int64)


@adapter("TopK", 10)
def _topk_k(node, ctx):
    """TopK-1 took ``k`` as an attribute."""
    attr_to_input(node, ctx, "k", 1, np.int64)
    if len(node.inputs) > 1 and node.inputs[1]:
        arr = ctx.graph.initializers[node.inputs[1]]
        ctx.graph.initializers[node.inputs[1]] = arr.reshape(1)


@adapter("Dropout", 7)
def _dropout_is_test(node, ctx):
    """Dropout-6 had ``is_test``; inference behaviour is the default since 7."""
    node.attrs.pop("is_test", None)


@adapter("Dropout", 12)
def _dropout_ratio(node, ctx):
    """Dropout before 12 took ``ratio`` as an attribute."""
    attr_to_input(node, ctx, "ratio", 1, np.float32)


@adapter("BatchNormalization", 9)
def _bn_legacy(node, ctx):
    """BatchNormalization before 9 had ``spatial`` / ``is_test`` (inference mode is the default)."""
    for key in ("spatial", "is_test"):
        node.attrs.pop(key, None)


@adapter(("RNN", "GRU", "LSTM"), 7)
def _rnn_output_sequence(node, ctx):
    """RNNs before 7 had ``output_sequence`` (Y is simply optional now)."""
    node.attrs.pop("output_sequence", None)


@adapter("DFT", 20)
def _dft_axis(node, ctx):
    """DFT-17 took ``axis`` (default 1) as an attribute; DFT-20 takes it as an input."""
    axis = node.attrs.pop("axis", 1)
    set_input(node, 2, ctx.const(np.array(axis, np.int64), f"{node.name}_axis"))


# -- semantic changes -------------------------------------------------------------------------------
@adapter(("Softmax", "LogSoftmax", "Hardmax"), 13)
def _softmax_2d(node, ctx):
    """Before 13 these flattened the input to 2-D at ``axis`` (default 1) and normalised each
    row; since 13 they normalise along ``axis`` alone. Same thing when ``axis`` is the last dim;
    otherwise Flatten -> op(axis=-1) -> Reshape back."""
    axis = int(node.attrs.pop("axis", 1))
    x, y = node.inputs[0], node.outputs[0]
    rank = ctx.rank(x)
    if rank is not None and (axis % max(rank, 1)) == rank - 1:
        node.attrs["axis"] = -1
        return None
    shape, flat, res = ctx.fresh(f"{x}_shape"), ctx.fresh(f"{x}_2d"), ctx.fresh(f"{y}_2d")
    node.inputs[0], node.outputs[0] = flat, res
    node.attrs["axis"] = -1
    return [
        Node("Shape", [x], [shape], name=ctx.fresh(f"{node.name}_shape")),
        Node("Flatten", [x], [flat], {"axis": axis}, name=ctx.fresh(f"{node.name}_flatten")),
        node,
        Node("Reshape", [res, shape], [y], name=ctx.fresh(f"{node.name}_reshape")),
    ]


@adapter("Upsample", 10)
def _upsample(node, ctx):
    """Upsample (deprecated at 10) is Resize with asymmetric coordinates and floor rounding."""
    scales = node.attrs.pop("scales", None)
    scales_name = (
        ctx.const(np.asarray(scales, np.float32), f"{node.name}_scales") if scales is not None else node.inputs[1]
    )
    mode = node.attrs.pop("mode", "nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    mode = "linear" if mode in ("linear", "bilinear") else mode
    return [
        Node(
            "Resize",
            [node.inputs[0], "", scales_name],
            node.outputs,
            {"mode": mode, "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
            name=node.name,
        )
    ]


@adapter("Upsample", 29)
def _upsample_any(node, ctx):
    """Opset >= 10 models may still carry Upsample-9 nodes; same translation."""
    return _upsample(node, ctx) if node.op_type == "Upsample" else None


@adapter("Resize", 11)
def _resize_v10(node, ctx):
    """Resize-10 took (X, scales) with Upsample semantics (asymmetric, floor)."""
    node.inputs = [node.inputs[0], "", node.inputs[1]]
    node.attrs.setdefault("coordinate_transformation_mode", "asymmetric")
    node.attrs.setdefault("nearest_mode", "floor")


@adapter("Resize", 13)
def _resize_empty_inputs(node, ctx):
    """Resize-11 required roi/scales even when unused (passed as empty tensors); since 13
    they are optional, so constant empty ones become absent."""
    for i in (1, 2):
        if i < len(node.inputs) and node.inputs[i]:
            arr = ctx.constant(node.inputs[i])
            if arr is not None and arr.size == 0:
                node.inputs[i] = ""


@adapter("Scatter", 29)
def _scatter(node, ctx):
    """Scatter (deprecated at 11) is ScatterElements without reduction."""
    node.op_type = "ScatterElements"


@adapter("Scan", 9)
def _scan_v8(node, ctx):
    """Scan-8 carried a batch dim on every input plus ``sequence_lens``; the interpreter runs
    it as ``opsnn::BatchScan``."""
    node.op_type, node.domain = "BatchScan", "opsnn"


@adapter("GroupNormalization", 21)
def _group_norm_v18(node, ctx):
    """GroupNormalization-18 took scale/bias per group; 21 takes them per channel (each
    group's value repeated C/G times)."""
    g = int(node.attrs["num_groups"])
    x = node.inputs[0]
    shape, c = ctx.fresh(f"{x}_shape"), ctx.fresh(f"{x}_channels")
    idx = ctx.const(np.array([1], np.int64), f"{node.name}_c_index")
    grp = ctx.const(np.array([g], np.int64), f"{node.name}_groups")
    per, tgt = ctx.fresh(f"{node.name}_per_group"), ctx.fresh(f"{node.name}_target")
    col = ctx.const(np.array([g, 1], np.int64), f"{node.name}_col")
    flat = ctx.const(np.array([-1], np.int64), f"{node.name}_flat")
    pre = [
        Node("Shape", [x], [shape], name=ctx.fresh(f"{node.name}_shape")),
        Node("Gather", [shape, idx], [c], name=ctx.fresh(f"{node.name}_c")),
        Node("Div", [c, grp], [per], name=ctx.fresh(f"{node.name}_div")),
        Node("Concat", [grp, per], [tgt], {"axis": 0}, name=ctx.fresh(f"{node.name}_tgt")),
    ]
    for i in (1, 2):
        src = node.inputs[i]
        col_v, wide, out = ctx.fresh(f"{src}_col"), ctx.fresh(f"{src}_wide"), ctx.fresh(f"{src}_per_channel")
        pre += [
            Node("Reshape", [src, col], [col_v], name=ctx.fresh(f"{node.name}_r{i}")),
            Node("Expand", [col_v, tgt], [wide], name=ctx.fresh(f"{node.name}_e{i}")),
            Node("Reshape", [wide, flat], [out], name=ctx.fresh(f"{node.name}_f{i}")),
        ]
        node.inputs[i] = out
    return pre + [node]


def describe() -> list[dict]:
    """The adapter table as data: op, domain, since, what it does."""
    return [{"op": a.op, "domain": a.domain, "since": a.since, "doc": a.doc} for lst in ADAPTERS.values() for a in lst]


__all__ = [
    "ADAPTERS",
    "Adapter",
    "AdapterContext",
    "DOMAIN_MAX",
    "MAX_OPSET",
    "adapter",
    "attr_to_input",
    "describe",
    "set_input",
    "upgrade",
]
