"""The ATen-to-opsnn table: one line per core ATen op, each with an argument adapter.

An adapter takes the FX node (its ``args`` are FX nodes or Python values, ``meta["val"]`` its
fake/real result) and a :class:`Emit` that names values and adds constants, and returns the
op-record nodes it lowered to. It raises :class:`Unsupported` with a reason whenever the
arguments ask for something the record does not compute exactly as ATen does: that node runs
in torch instead.
"""

from __future__ import annotations

import operator

import numpy as np

from ...graph.ir import Node


class Unsupported(Exception):
    """This ATen call has no exact opsnn lowering (the message says why)."""


F32, BOOL, I64 = "torch.float32", "torch.bool", "torch.int64"
F64, F16, I32, I16, I8 = "torch.float64", "torch.float16", "torch.int32", "torch.int16", "torch.int8"
_NP_DTYPES = {
    F32: np.float32,
    BOOL: np.bool_,
    I64: np.int64,
    F64: np.float64,
    F16: np.float16,
    I32: np.int32,
    I16: np.int16,
    I8: np.int8,
}


BF16 = "torch.bfloat16"

#: FX nodes whose bfloat16 values the lowering in progress reads as float32 (see :func:`lower`)
_AS_F32: set = set()


class _Float32View:
    """A bfloat16 fake tensor as a lowering computing it in float32 sees it: ``dtype`` float32."""

    def __init__(self, v, float32):
        self._v, self.dtype = v, float32

    def __getattr__(self, key):
        return getattr(self._v, key)


def _f32_view(v):
    if str(getattr(v, "dtype", "")) != BF16:
        return v
    import torch

    return _Float32View(v, torch.float32)


def _val(n):
    v = n.meta.get("val") if hasattr(n, "meta") else None
    if _AS_F32 and n in _AS_F32:
        return type(v)(_f32_view(x) for x in v) if isinstance(v, (tuple, list)) else _f32_view(v)
    return v


def np_dtype(n):
    """The numpy dtype of FX value ``n`` (one :func:`check_dtypes` admits, or bfloat16)."""
    dt = str(_val(n).dtype)
    if dt == BF16:
        from ...dtypes import bfloat16

        return bfloat16
    return _NP_DTYPES[dt]


def _bf16(v) -> bool:
    if isinstance(v, (tuple, list)):
        return any(_bf16(x) for x in v)
    return str(getattr(v, "dtype", "")) == BF16


def bf16_torch_only() -> list:
    """ATen ops whose bfloat16 CPU kernels round otherwise than float32 rounded once, beyond
    bfloat16's tolerance near cancellations (found by the OpInfo bfloat16 sweep; linspace steps in
    bfloat16): on bfloat16 tensors they are neither decomposed nor lowered, torch runs them."""
    import torch

    aten = torch.ops.aten
    spaced = [getattr(packet, o) for packet in (aten.linspace, aten.logspace) for o in packet.overloads()]
    return [aten.addr.default, aten.linalg_cross.default, *spaced]


def lower(adapter, n, e, *, check: bool = True) -> list:
    """``adapter``'s nodes for ``n`` (after :func:`check_dtypes` with ``check``). bfloat16 tensors are
    computed as torch's CPU kernels compute them: read as float32 (exact), the op in float32, each
    bfloat16 result rounded once (to nearest even) -- the adapter sees float32 throughout."""
    raw = n.meta.get("val")
    ins = [a for a in n.all_input_nodes if _bf16(a.meta.get("val"))]
    if not ins and not _bf16(raw):
        if check:
            check_dtypes(n)
        return adapter(n, e)
    bf16 = getattr(adapter, "bf16", True)
    if not (bf16(n) if callable(bf16) else bf16) or n.target in bf16_torch_only():
        raise Unsupported("bfloat16 (torch's kernel does not compute it in float32 rounded once)")
    nodes, saved = [], {}
    if not e.probe:
        for a in ins:
            if a not in e.names or isinstance(e.names[a], tuple):
                continue
            cast = e.f32.get(a)
            if cast is None:
                cast = e.f32[a] = e.graph.unique_name(f"{e.names[a]}_f32")
                nodes.append(Node("Cast", [e.names[a]], [cast], {"to": 1}))
            saved[a] = e.names[a]
            e.names[a] = cast
    _AS_F32.update([n, *ins])
    try:
        if check:
            check_dtypes(n)
        nodes += adapter(n, e)
    finally:
        _AS_F32.clear()
        e.names.update(saved)
    if e.probe or not _bf16(raw):
        return nodes
    got = e.names[n]
    members = raw if isinstance(raw, (tuple, list)) else [raw]
    names = list(got) if isinstance(got, tuple) else [got]
    for k, (v, name) in enumerate(zip(members, names)):
        if name and _bf16(v):
            rounded = e.graph.unique_name(f"{name}_bf16")
            nodes.append(Node("Cast", [name], [rounded], {"to": 16}))
            names[k] = rounded
    e.names[n] = tuple(names) if isinstance(got, tuple) else names[0]
    return nodes


def is_size(v) -> bool:
    """Whether ``v`` (an FX value) is a size, not a tensor: a SymInt (or SymFloat / SymBool) of a
    graph with symbolic shapes, or a plain number."""
    return v is not None and not hasattr(v, "dtype") and type(v).__name__ in ("SymInt", "SymFloat", "SymBool", "int")


def check_dtypes(node) -> None:
    """Every tensor this node reads is of a dtype its adapter's ``in_dtypes`` names, every tensor it
    writes of one its ``out_dtypes`` names (float32 alone unless the adapter says more). Symbolic
    sizes only where the adapter is marked ``symbolic`` (it never reads a symbolic dim's value)."""
    adapter = build_table().get(node.target)
    ins, outs = getattr(adapter, "in_dtypes", (F32,)), getattr(adapter, "out_dtypes", (F32,))
    symbolic_ok = getattr(adapter, "symbolic", False)
    vals = []
    for a in node.all_input_nodes:
        if is_size(_val(a)):  # a size argument (a view's SymInt): the adapter reads the result's shape
            if not symbolic_ok:
                raise Unsupported("a symbolic size argument")
            continue
        vals.append((_val(a), ins))
    out = _val(node)
    if isinstance(out, (tuple, list)):  # a first-only lowering computes output 0 alone (pool indices are int64)
        vals += [(o, outs) for o in ([out[0]] if getattr(adapter, "first_only", False) else list(out))]
    else:
        vals.append((out, outs))
    for v, allowed in vals:
        if v is None:
            continue
        if not hasattr(v, "dtype"):
            raise Unsupported(f"a non-tensor value {type(v).__name__}")
        if str(v.dtype) not in allowed:
            raise Unsupported(f"dtype {v.dtype} (mapped here: {', '.join(a[6:] for a in allowed)})")
        if not symbolic_ok and any(not isinstance(d, int) for d in shape_of(v)):
            raise Unsupported("a symbolic shape")


def shape_of(v) -> tuple:
    """The shape of FX value ``v``: ints, and SymInts where a dim is symbolic (a SymInt whose
    expression is a number is that int)."""
    return tuple(
        d if isinstance(d, int) else (d.node.maybe_as_int() if d.node.maybe_as_int() is not None else d)
        for d in v.shape
    )


def _shape(n) -> tuple:
    shape = shape_of(_val(n))
    if any(not isinstance(d, int) for d in shape):  # int() on a SymInt would specialize it
        raise Unsupported("a symbolic shape")
    return shape


def dim_spec(d):
    """An opsnn graph input's dim for torch dim ``d`` (of :func:`shape_of`): the int, or a symbolic dim's
    name (its expression, ``s0`` or ``2*s0``: one name per expression, one value wherever it occurs)."""
    return d if isinstance(d, int) else str(d.node.expr)


def _positive(d) -> bool:
    """Whether dim ``d`` is known to be at least 1 without reading a symbolic dim's value (Dynamo
    specializes sizes 0 and 1, so a backed symbolic size is at least 2)."""
    if isinstance(d, int):
        return d > 0
    try:
        return bool(d.node.shape_env.bound_sympy(d.node.expr).lower >= 1)
    except Exception:  # noqa: BLE001 - no range known: not provably positive
        return False


def _same_dim(a, b) -> bool:
    """Whether dims ``a`` and ``b`` are the same int or the same symbolic expression (no guard)."""
    if isinstance(a, int) or isinstance(b, int):
        return isinstance(a, int) and isinstance(b, int) and a == b
    return a.node.expr == b.node.expr


def _nonempty(shape) -> bool:
    """Whether every dim of ``shape`` is known to be at least 1 (a symbolic one: see :func:`_positive`)."""
    return all(_positive(d) for d in shape)


def _static(shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def _dims_product(e, n, x, start: int, nodes: list, end=None) -> str:
    """An int64 scalar: the product of ``x``'s dims ``start:end``, from its Shape (folded when a plan
    is built: no symbolic dim's value is read while lowering)."""
    dims, prod = (e.graph.unique_name(f"{n.name}_{h}") for h in ("dims", "prod"))
    attrs = {"start": start} if end is None else {"start": start, "end": end}
    nodes += [
        Node("Shape", [e.name(x)], [dims], attrs),
        Node("ReduceProd", [dims], [prod], {"keepdims": 0}),
    ]
    return prod


def _target_shape(n, *, expand: bool) -> np.ndarray:
    """The shape constant of a Reshape (``expand``: an Expand) producing ``n``'s result from its first
    argument. Symbolic dims become what the op infers: ONNX Reshape's 0 (the input's dim at the same
    place, the same expression) and one -1 (the remaining elements), Expand's 1 (the input's dim,
    broadcast); anything else needs a dim's value: Unsupported."""
    out, src = shape_of(_val(n)), shape_of(_val(n.args[0]))
    if all(isinstance(d, int) for d in out + src):
        return np.array(out, np.int64)
    target, unknown = [], 0
    for i, d in enumerate(out):
        if isinstance(d, int):
            if d <= 0:
                raise Unsupported("an empty dim beside a symbolic one")
            target.append(d)
            continue
        k = i - (len(out) - len(src)) if expand else i
        if 0 <= k < len(src) and _same_dim(src[k], d):
            target.append(1 if expand else 0)
        elif not expand and not unknown:
            unknown = 1
            target.append(-1)
        else:
            raise Unsupported(f"symbolic dim {d} of the result is not one of the input's")
    if not expand and not all(_positive(d) for d in src):
        raise Unsupported("an input that may be empty")
    return np.array(target, np.int64)


def _rank(n) -> int:
    return len(_val(n).shape)


class Emit:
    """Names FX values in the opsnn graph and adds constants; what an adapter writes through."""

    def __init__(self, graph, probe: bool = False):
        self.graph = graph
        self.probe = probe  # a support check: any FX node stands for a tensor
        self.names: dict = {}  # fx node -> opsnn value name (or tuple of names for tuple results)
        self.f32: dict = {}  # fx node of a bfloat16 value -> its float32 copy

    def name(self, arg) -> str:
        if arg is None:
            return ""
        if self.probe and hasattr(arg, "op"):
            return "probe"
        if arg not in self.names:
            raise Unsupported(f"argument {arg!r} is not a tensor this graph has")
        return self.names[arg]

    def const(self, hint: str, array) -> str:
        name = self.graph.unique_name(hint)
        self.graph.initializers[name] = np.asarray(array)
        return name

    def scalar(self, hint: str, x, dtype: str = "torch.float32") -> str:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise Unsupported(f"a scalar of type {type(x).__name__}")
        if dtype == "torch.int64":
            if not isinstance(x, int):
                raise Unsupported("a float scalar with an int64 tensor (torch promotes to float)")
            return self.const(hint, np.array(x, np.int64))
        return self.const(hint, np.array(x, np.float32))

    def operand(self, arg, hint: str, dtype: str = "torch.float32") -> str:
        """A tensor argument's name, or a constant of ``dtype`` for a Python number."""
        return self.scalar(hint, arg, dtype) if isinstance(arg, (int, float)) else self.name(arg)

    def out(self, node) -> str:
        name = self.graph.unique_name(node.name)
        self.names[node] = name
        return name

    def outs(self, node, count: int) -> list:
        names = [self.graph.unique_name(f"{node.name}_{i}") for i in range(count)]
        self.names[node] = tuple(names)
        return names


def _kw(node, i: int, key: str, default):
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(key, default)


def _unary(op):
    def adapt(n, e):
        if len(n.args) != 1 or n.kwargs:
            raise Unsupported("extra arguments")
        return [Node(op, [e.name(n.args[0])], [e.out(n)])]

    adapt.symbolic = True
    return adapt


def _common_dtype(n, *args) -> str:
    """The one dtype of ``args``' tensors and of ``n``'s result (float32 or int64: no promotion)."""
    dtypes = {str(_val(a).dtype) for a in args if hasattr(a, "op")}
    if len(dtypes) > 1:
        raise Unsupported(f"operands of dtypes {sorted(dtypes)} (torch promotes them)")
    dt = dtypes.pop() if dtypes else F32
    if dt == I64 and str(_val(n).dtype) != I64:
        raise Unsupported("an int64 operation with a float result")
    return dt


def _size_node(x) -> bool:
    """Whether FX argument ``x`` is a node computing a size (a SymInt of a graph with symbolic shapes)."""
    return hasattr(x, "op") and type(_val(x)).__name__ == "SymInt"


def _size_scalar(e, n, x, nodes: list) -> str:
    """A float32 scalar holding size ``x``: the Shape of the input that carries it (folded when a plan
    is built), or the number where the size is one."""
    known = _val(x).node.maybe_as_int()
    if known is not None:
        return e.scalar("size", float(known))
    dims, f, out = (e.graph.unique_name(f"{n.name}_{h}") for h in ("dim", "dimf", "size"))
    nodes += [
        Node("Shape", [e.name(x)], [dims]),
        Node("Cast", [dims], [f], {"to": 1}),
        Node("Reshape", [f, e.const("scalar", np.zeros(0, np.int64))], [out]),
    ]
    return out


def _binary(op):
    def adapt(n, e):
        a, b = n.args[:2]
        if _size_node(a) or _size_node(b):  # a float tensor and a symbolic size (a mean's count)
            if str(_val(n).dtype) != F32 or _kw(n, 2, "alpha", 1) != 1:
                raise Unsupported("a symbolic size with a non-float32 result or an alpha")
            if not any(hasattr(x, "op") and not _size_node(x) and str(_val(x).dtype) == F32 for x in (a, b)):
                raise Unsupported("a symbolic size without a float32 tensor")
            nodes: list = []
            ins = [_size_scalar(e, n, x, nodes) if _size_node(x) else e.operand(x, "c") for x in (a, b)]
            return nodes + [Node(op, ins, [e.out(n)])]
        if op == "Mul" and str(_val(n).dtype) == BOOL:  # bool times bool: logical and
            if not all(hasattr(x, "op") and str(_val(x).dtype) == BOOL for x in (a, b)):
                raise Unsupported("a bool product with a scalar or a number tensor")
            return [Node("And", [e.name(a), e.name(b)], [e.out(n)])]
        tensors = {str(_val(x).dtype) for x in (a, b) if hasattr(x, "op")}
        if len(tensors) == 2 and F32 in tensors and str(_val(n).dtype) == F32 and _kw(n, 2, "alpha", 1) == 1:
            # float32 with an int64 or bool tensor: torch casts that one to float32 (round to nearest)
            nodes, ins = [], []
            for i, x in enumerate((a, b)):
                if str(_val(x).dtype) == F32:
                    ins.append(e.name(x))
                else:
                    ins.append(e.graph.unique_name(f"{n.name}_f32_{i}"))
                    nodes.append(Node("Cast", [e.name(x)], [ins[-1]], {"to": 1}))
            return nodes + [Node(op, ins, [e.out(n)])]
        dt = _common_dtype(n, a, b)
        if dt == I64 and op not in ("Add", "Sub", "Mul"):
            raise Unsupported(f"{op} on int64")
        alpha = _kw(n, 2, "alpha", 1)
        if alpha == 1:
            return [Node(op, [e.operand(a, "c", dt), e.operand(b, "c", dt)], [e.out(n)])]
        if op not in ("Add", "Sub") or isinstance(b, (int, float)) or dt != F32:
            raise Unsupported(f"alpha {alpha} on {op} with a scalar or int64")
        scaled = e.graph.unique_name(f"{n.name}_alpha")
        return [
            Node("Mul", [e.name(b), e.scalar("alpha", alpha)], [scaled]),
            Node(op, [e.operand(a, "c"), scaled], [e.out(n)]),
        ]

    adapt.in_dtypes = (F32, I64, BOOL)
    adapt.out_dtypes = (F32, I64, BOOL) if op == "Mul" else (F32, I64)
    adapt.symbolic = True
    return adapt


_sub = _binary("Sub")


def _addmm(n, e):
    beta, alpha = _kw(n, 3, "beta", 1), _kw(n, 4, "alpha", 1)
    bias, a, b = n.args[:3]
    mm = e.graph.unique_name(f"{n.name}_mm")
    nodes = [Node("MatMul", [e.name(a), e.name(b)], [mm])]
    if beta == 0:  # torch ignores the bias then, NaN and Inf included
        return nodes + [Node("Mul", [mm, e.scalar("alpha", alpha)], [e.out(n)])]
    if alpha != 1:
        scaled = e.graph.unique_name(f"{n.name}_alpha")
        nodes.append(Node("Mul", [mm, e.scalar("alpha", alpha)], [scaled]))
        mm = scaled
    bias_name = e.name(bias)
    if beta != 1:
        scaled = e.graph.unique_name(f"{n.name}_beta")
        nodes.append(Node("Mul", [bias_name, e.scalar("beta", beta)], [scaled]))
        bias_name = scaled
    return nodes + [Node("Add", [mm, bias_name], [e.out(n)])]


def _matmul(n, e):
    return [Node("MatMul", [e.name(n.args[0]), e.name(n.args[1])], [e.out(n)])]


_SIZED_VIEWS = ("aten.view.default", "aten.view_copy.default", "aten._unsafe_view.default", "aten.reshape.default")


def _reshape_to_sizes(n, e) -> list:
    """A view to sizes some of which are symbolic: the shape concatenated from the int sizes and the
    symbolic ones' values (each an input of that length: its Shape, folded when a plan is built)."""
    sizes = n.args[1] if len(n.args) > 1 else None
    if str(n.target) not in _SIZED_VIEWS or not isinstance(sizes, (list, tuple)):
        raise Unsupported("a symbolic result shape with no sizes to read")
    nodes, parts = [], []
    for k, size in enumerate(sizes):
        if isinstance(size, int):
            parts.append(e.const("dim", np.array([size], np.int64)))
        elif hasattr(size, "op") and type(_val(size)).__name__ == "SymInt":
            parts.append(e.graph.unique_name(f"{n.name}_size{k}"))
            nodes.append(Node("Shape", [e.name(size)], [parts[-1]]))
        else:
            raise Unsupported(f"size {size!r}")
    if sum(1 for size in sizes if isinstance(size, int) and size < 0) > 1:
        raise Unsupported("more than one -1 size")
    shape = e.graph.unique_name(f"{n.name}_shape")
    nodes.append(Node("Concat", parts, [shape], {"axis": 0}))
    return nodes + [Node("Reshape", [e.name(n.args[0]), shape], [e.out(n)], {"allowzero": 1})]


def _squeeze_or_unsqueeze(n, e) -> list:
    """unsqueeze / squeeze of a tensor with symbolic dims: ONNX's Unsqueeze / Squeeze at their axes (a
    symbolic dim is at least 2: never squeezed)."""
    name, x = n.target.__name__, n.args[0]
    src = shape_of(_val(x))
    if name.startswith("unsqueeze"):
        axis = int(n.args[1]) % (len(src) + 1)
        return [Node("Unsqueeze", [e.name(x), e.const("axes", np.array([axis], np.int64))], [e.out(n)])]
    dims = n.args[1] if len(n.args) > 1 else range(len(src))
    dims = [int(d) % max(len(src), 1) for d in (dims if isinstance(dims, (list, tuple, range)) else [dims])]
    axes = sorted({d for d in dims if isinstance(src[d], int) and src[d] == 1})
    if not axes:
        return [Node("Identity", [e.name(x)], [e.out(n)])]
    return [Node("Squeeze", [e.name(x), e.const("axes", np.array(axes, np.int64))], [e.out(n)])]


def _reshape(n, e):
    try:
        shape = _target_shape(n, expand=False)
    except Unsupported:
        if all(isinstance(d, int) for d in shape_of(_val(n))):
            raise
        if n.target.__name__.split(".")[0] in ("squeeze", "squeeze_copy", "unsqueeze", "unsqueeze_copy"):
            return _squeeze_or_unsqueeze(n, e)
        return _reshape_to_sizes(n, e)
    # allowzero: a 0 in torch's shape is an empty dim, never ONNX's "copy the input's dim"; with
    # symbolic dims a 0 is that copy (and no dim is empty: _target_shape refuses them)
    static = all(isinstance(d, int) for d in shape_of(_val(n)) + shape_of(_val(n.args[0])))
    allowzero = int(static)
    return [Node("Reshape", [e.name(n.args[0]), e.const("shape", shape)], [e.out(n)], {"allowzero": allowzero})]


def _expand(n, e):
    try:
        shape = _target_shape(n, expand=True)
    except Unsupported:
        if _static(shape_of(_val(n))):
            raise
        return _expand_to_sizes(n, e)
    return [Node("Expand", [e.name(n.args[0]), e.const("shape", shape)], [e.out(n)])]


def _expand_to_sizes(n, e) -> list:
    """An expand to sizes some of which are symbolic (a sum's gradient over a symbolic dim): the shape
    concatenated from the int sizes (-1, keep: Expand's 1) and the symbolic ones' values (each an
    input of that length: its Shape, folded when a plan is built)."""
    sizes = n.args[1] if len(n.args) > 1 else None
    if not isinstance(sizes, (list, tuple)) or len(n.args) > 2 or n.kwargs:
        raise Unsupported("an expand with no sizes to read")
    nodes: list = []
    shape = _sizes_tensor(e, n, sizes, nodes, keep=-1)
    return nodes + [Node("Expand", [e.name(n.args[0]), shape], [e.out(n)])]


def _sizes_tensor(e, n, sizes, nodes: list, keep=None) -> str:
    """An int64 shape tensor of ``sizes`` (ints, and symbolic sizes: the Shape of the input that
    carries each, folded when a plan is built); ``keep`` (expand's -1) becomes Expand's 1."""
    parts = []
    for k, size in enumerate(sizes):
        if isinstance(size, int):
            if size == 0 or (size < 0 and size != keep):
                raise Unsupported(f"size {size} beside a symbolic one")
            parts.append(e.const("dim", np.array([1 if size == keep else size], np.int64)))
        elif _size_node(size):
            parts.append(e.graph.unique_name(f"{n.name}_size{k}"))
            nodes.append(Node("Shape", [e.name(size)], [parts[-1]]))
        else:
            raise Unsupported(f"size {size!r}")
    shape = e.graph.unique_name(f"{n.name}_shape")
    nodes.append(Node("Concat", parts, [shape], {"axis": 0}))
    return shape


def _permute(n, e):
    rank = _rank(n.args[0])
    perm = [int(d) % rank for d in n.args[1]] if rank else []
    return [Node("Transpose", [e.name(n.args[0])], [e.out(n)], {"perm": perm})]


def _clone(n, e):
    import torch

    if n.kwargs.get("memory_format") not in (None, torch.contiguous_format, torch.preserve_format) or len(n.args) > 1:
        raise Unsupported(f"memory_format {n.kwargs.get('memory_format')}")
    return [Node("Identity", [e.name(n.args[0])], [e.out(n)])]


def _pairs(v, rank: int) -> list:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return [int(x) for x in (v * rank if len(v) == 1 else v)]


def _convolution(n, e):
    x, w, b, stride, padding, dilation, transposed, output_padding, groups = n.args[:9]
    k = _rank(w) - 2
    if k < 1 or not _nonempty(shape_of(_val(x))) or not _nonempty(shape_of(_val(n))):
        raise Unsupported("an unbatched or empty convolution")
    pads = _pairs(padding, k)
    attrs = {
        "strides": _pairs(stride, k),
        "pads": pads + pads,
        "dilations": _pairs(dilation, k),
        "group": int(groups),
        "kernel_shape": list(_shape(w)[2:]),
    }
    if transposed:  # torch's (C_in, C_out / groups, k...) weight is ConvTranspose's layout
        attrs["output_padding"] = _pairs(output_padding, k)
        return [Node("ConvTranspose", [e.name(x), e.name(w), e.name(b)], [e.out(n)], attrs)]
    return [Node("Conv", [e.name(x), e.name(w), e.name(b)], [e.out(n)], attrs)]


def _batch_norm_eval(n, e):
    x, weight, bias, mean, var, _momentum, eps = n.args[:7]
    if weight is None or bias is None:
        raise Unsupported("batch norm without affine weights")
    y, m, r = e.outs(n, 3)
    e.names[n] = (y, *_empty_statistics(n, e))
    return [
        Node(
            "BatchNormalization",
            [e.name(x), e.name(weight), e.name(bias), e.name(mean), e.name(var)],
            [y],
            {"epsilon": float(eps)},
        )
    ]


def _empty_statistics(n, e) -> list:
    """Eval-mode batch norm's outputs 1 and 2 (torch's are empty: a backward reads nothing there) as
    empty constants; a used one that has elements is Unsupported (not computed here)."""
    vals, used = _val(n), {u.args[1] for u in n.users if u.target is operator.getitem}
    out = []
    for i in (1, 2):
        if tuple(vals[i].shape) == (0,) and str(vals[i].dtype) == F32:
            out.append(e.const(f"{n.name}_empty", np.zeros(0, np.float32)))
        elif i in used:
            raise Unsupported(f"its saved statistic {i} (not computed in eval mode here)")
        else:
            out.append(None)
    return out


def _normalize(e, n, x: str, axes: list, eps, y: str) -> tuple:
    """Nodes for ``y = (x - mean) / sqrt(var + eps)`` over ``axes`` (biased variance, kept dims);
    returns ``(nodes, mean, rstd)``, the statistics with their kept dims."""
    t = {h: e.graph.unique_name(f"{n.name}_{h}") for h in ("mu", "d", "d2", "v", "ve", "sd", "r")}
    ax = e.const("axes", np.array(axes, np.int64))
    return (
        [
            Node("ReduceMean", [x, ax], [t["mu"]], {"keepdims": 1}),
            Node("Sub", [x, t["mu"]], [t["d"]]),
            Node("Mul", [t["d"], t["d"]], [t["d2"]]),
            Node("ReduceMean", [t["d2"], ax], [t["v"]], {"keepdims": 1}),
            Node("Add", [t["v"], e.scalar("eps", eps)], [t["ve"]]),
            Node("Sqrt", [t["ve"]], [t["sd"]]),
            Node("Reciprocal", [t["sd"]], [t["r"]]),
            Node("Mul", [t["d"], t["r"]], [y]),
        ],
        t["mu"],
        t["r"],
    )


def _affine(e, n, y: str, weight, bias, c: int, rank: int, out: str) -> list:
    """``out = y * weight + bias`` with per-channel (dim 1) weight and bias, either may be None."""
    bshape = e.const("bshape", np.array([1, c] + [1] * (rank - 2), np.int64))
    nodes, cur = [], y
    for op, p in (("Mul", weight), ("Add", bias)):
        if p is None:
            continue
        pb, nxt = e.graph.unique_name(f"{n.name}_{op.lower()}_p"), e.graph.unique_name(f"{n.name}_{op.lower()}")
        nodes += [Node("Reshape", [e.name(p), bshape], [pb]), Node(op, [cur, pb], [nxt])]
        cur = nxt
    return nodes + [Node("Identity", [cur], [out])]


def _group_norm(n, e):
    x, weight, bias, N, C, HxW, group, eps = n.args[:8]
    shape = _shape(x)
    if len(shape) < 2 or int(N) * int(C) * int(HxW) == 0 or int(C) % int(group):
        raise Unsupported("an empty input or channels not divisible by groups")
    g = int(group)
    y, mean, rstd = e.outs(n, 3)
    t = {h: e.graph.unique_name(f"{n.name}_{h}") for h in ("xg", "yg", "yn")}
    nodes = [Node("Reshape", [e.name(x), e.const("shape", np.array([int(N), g, -1], np.int64))], [t["xg"]])]
    norm, mu, r = _normalize(e, n, t["xg"], [2], eps, t["yg"])
    nodes += norm
    nodes.append(Node("Reshape", [t["yg"], e.const("shape", np.array(shape, np.int64))], [t["yn"]]))
    nodes += _affine(e, n, t["yn"], weight, bias, int(C), len(shape), y)
    stat = e.const("shape", np.array([int(N), g], np.int64))
    return nodes + [Node("Reshape", [mu, stat], [mean]), Node("Reshape", [r, stat], [rstd])]


def _batch_norm(n, e):
    x, weight, bias, mean, var, training, _momentum, eps = n.args[:8]
    if training:
        if mean is not None or var is not None:  # this overload updates them in place
            raise Unsupported("training-mode batch norm that updates running statistics")
        shape = _shape(x)
        if len(shape) < 2 or int(np.prod(shape)) == 0:
            raise Unsupported("an input of rank < 2 or an empty one")
        y, _, _ = e.outs(n, 3)
        e.names[n] = (y, None, None)
        yn = e.graph.unique_name(f"{n.name}_yn")
        norm, _mu, _r = _normalize(e, n, e.name(x), [0] + list(range(2, len(shape))), eps, yn)
        return norm + _affine(e, n, yn, weight, bias, shape[1], len(shape), y)
    if weight is None or bias is None or mean is None or var is None:
        raise Unsupported("batch norm without affine weights or running statistics")
    y, _, _ = e.outs(n, 3)
    e.names[n] = (y, None, None)
    return [
        Node(
            "BatchNormalization",
            [e.name(x), e.name(weight), e.name(bias), e.name(mean), e.name(var)],
            [y],
            {"epsilon": float(eps)},
        )
    ]


def _split(n, e):
    x, _sizes = n.args[:2]
    dim = int(_kw(n, 2, "dim", 0)) % _rank(x)
    sizes = [shape_of(v)[dim] for v in _val(n)]
    if not all(isinstance(d, int) for d in sizes):  # the other dims may be symbolic
        raise Unsupported("split into symbolic sizes")
    names = e.outs(n, len(sizes))
    return [Node("Split", [e.name(x), e.const("split", np.array(sizes, np.int64))], names, {"axis": dim})]


def _max_pool2d_with_indices(n, e):
    x, kernel = n.args[:2]
    stride = _kw(n, 2, "stride", [])
    padding = _kw(n, 3, "padding", 0)
    dilation = _kw(n, 4, "dilation", 1)
    ceil_mode = _kw(n, 5, "ceil_mode", False)
    if ceil_mode:  # ONNX's and torch's rules for a last window that starts in the padding differ
        raise Unsupported("ceil_mode=True")
    ks = _pairs(kernel, 2)
    pads = _pairs(padding, 2)
    y, idx = e.outs(n, 2)
    attrs = {
        "kernel_shape": ks,
        "strides": _pairs(stride, 2) if stride else ks,
        "pads": pads + pads,
        "dilations": _pairs(dilation, 2),
        "ceil_mode": int(bool(ceil_mode)),
    }
    if not any(u.target is operator.getitem and u.args[1] == 1 for u in n.users):
        e.names[n] = (y, None)
        return [Node("MaxPool", [e.name(x)], [y], attrs)]
    # the indices (a backward reads them): MaxPool's flat over the tensor, torch's flat per (n, c) plane;
    # both pick a window's first maximum (or first NaN)
    shape = shape_of(_val(x))
    if len(shape) != 4 or not _nonempty(shape):
        raise Unsupported("indices of an unbatched or empty input")
    flat = e.graph.unique_name(f"{n.name}_flat")
    nodes = [Node("MaxPool", [e.name(x)], [y, flat], attrs)]
    if _static(shape):
        return nodes + [Node("Sub", [flat, e.const("plane_start", _plane_starts(shape))], [idx])]
    # symbolic sizes: a flat index modulo the plane's size is its index in the plane
    plane = _dims_product(e, n, x, 2, nodes)
    return nodes + [Node("Mod", [flat, plane], [idx], {"fmod": 0})]


_max_pool2d_with_indices.out_dtypes = (F32, I64)


def _plane_starts(shape) -> np.ndarray:
    """The flat index of each (n, c) plane's first element, shaped (N, C, 1, 1)."""
    planes = int(np.prod(shape[:2]))
    return (np.arange(planes, dtype=np.int64) * int(np.prod(shape[2:]))).reshape(tuple(shape[:2]) + (1, 1))


def _max_pool2d_backward(n, e):
    """max_pool2d_with_indices_backward -> opsnn::MaxPoolGrad: the gradient goes where the indices say
    (the window arguments do not matter); torch's per-plane indices made flat over the tensor."""
    grad, x = n.args[:2]
    indices = n.args[7]
    shape = shape_of(_val(x))
    if len(shape) != 4 or not _nonempty(shape):
        raise Unsupported("an unbatched or empty input")
    flat = e.graph.unique_name(f"{n.name}_flat")
    nodes: list = []
    if _static(shape):
        starts = e.const("plane_start", _plane_starts(shape))
    else:  # symbolic sizes: _plane_starts from x's Shape (folded when a plan is built)
        t = {h: e.graph.unique_name(f"{n.name}_{h}") for h in ("total", "range", "lead", "bshape", "starts")}
        plane = _dims_product(e, n, x, 2, nodes)
        nodes += [
            Node("Size", [e.name(x)], [t["total"]]),
            Node("Range", [e.const("zero", np.array(0, np.int64)), t["total"], plane], [t["range"]]),
            Node("Shape", [e.name(x)], [t["lead"]], {"start": 0, "end": 2}),
            Node("Concat", [t["lead"], e.const("ones", np.ones(2, np.int64))], [t["bshape"]], {"axis": 0}),
            Node("Reshape", [t["range"], t["bshape"]], [t["starts"]]),
        ]
        starts = t["starts"]
    return nodes + [
        Node("Add", [e.name(indices), starts], [flat]),
        Node("MaxPoolGrad", [e.name(grad), flat, e.name(x)], [e.out(n)], {}, "opsnn"),
    ]


_max_pool2d_backward.in_dtypes = (F32, I64)


def _avg_pool2d_backward(n, e):
    """avg_pool2d_backward -> opsnn::AveragePoolGrad with the forward's window (as avg_pool2d maps)."""
    grad, x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override = n.args[:8]
    if ceil_mode:
        raise Unsupported("ceil_mode=True")
    if divisor_override is not None:
        raise Unsupported("divisor_override")
    if _rank(x) != 4:
        raise Unsupported("an unbatched input")
    ks, pads = _pairs(kernel, 2), _pairs(padding, 2)
    attrs = {
        "kernel_shape": ks,
        "strides": _pairs(stride, 2) if stride else ks,
        "pads": pads + pads,
        "count_include_pad": int(bool(count_include_pad)),
    }
    return [Node("AveragePoolGrad", [e.name(grad), e.name(x)], [e.out(n)], attrs, "opsnn")]


def _batch_norm_backward(n, e):
    """native_batch_norm_backward -> opsnn::BatchNormalizationGrad. In training the record recomputes
    the batch statistics from the input (float64) where torch reads the saved ones: autograd's formula
    passes the statistics its forward computed from this same input with this eps. In eval the running
    statistics are inputs as in torch."""
    grad, x, weight, running_mean, running_var, _save_mean, _save_invstd, train, eps, mask = n.args[:10]
    shape = shape_of(_val(x))
    if len(shape) < 2 or not _nonempty(shape) or not isinstance(shape[1], int):
        raise Unsupported("an input of rank < 2 or an empty one")
    if not train and (running_mean is None or running_var is None):
        raise Unsupported("eval mode without running statistics")
    return _bn_grad_node(n, e, grad, x, weight, running_mean, running_var, train, eps, mask)


def _bn_grad_node(n, e, grad, x, weight, running_mean, running_var, train, eps, mask, relu_out=None) -> list:
    c = shape_of(_val(x))[1]
    scale = e.const("ones", np.ones(c, np.float32)) if weight is None else e.name(weight)
    stats = ["", ""] if train else [e.name(running_mean), e.name(running_var)]
    names = list(e.outs(n, 3))
    attrs = {"epsilon": float(eps), "training_mode": int(bool(train))}
    inputs = [e.name(grad), e.name(x), scale, *stats]
    if relu_out is not None:  # dY counts where the ReLU's output is > 0, as threshold_backward(dY, y, 0)
        inputs, attrs["relu"] = inputs + [e.name(relu_out)], 1
    node = Node("BatchNormalizationGrad", inputs, list(names), attrs, "opsnn")
    e.names[n] = tuple(name if on else None for name, on in zip(names, mask))
    return [node]


def _batch_norm_backward_named(n, e):
    """opsnn::batch_norm_backward (training-mode native_batch_norm_backward without the saved statistics,
    a threshold_backward before it folded in; see :func:`batch_norm_backward_op`) ->
    opsnn::BatchNormalizationGrad (relu=1 with the ReLU's output)."""
    grad, x, weight, running_mean, running_var, train, eps, mask, relu_out = n.args[:9]
    shape = shape_of(_val(x))
    if len(shape) < 2 or not _nonempty(shape) or not isinstance(shape[1], int):
        raise Unsupported("an input of rank < 2 or an empty one")
    if not train:
        raise Unsupported("eval mode (the named op is the training one)")
    return _bn_grad_node(n, e, grad, x, weight, running_mean, running_var, train, eps, mask, relu_out)


_BN_BACKWARD_SCHEMA = (
    "(Tensor grad_out, Tensor input, Tensor? weight, Tensor? running_mean, Tensor? running_var, bool train, "
    "float eps, bool[3] output_mask, Tensor? relu_out) -> (Tensor, Tensor, Tensor)"
)


def _bn_backward_in_torch(grad, x, weight, running_mean, running_var, train, eps, mask, relu_out):
    """opsnn::batch_norm_backward as ATen computes it: the batch statistics the forward saved,
    recomputed from its input (biased variance, as the forward's)."""
    import torch

    aten = torch.ops.aten
    if relu_out is not None:
        grad = aten.threshold_backward.default(grad, relu_out, 0)
    var, mean = torch.var_mean(x, [0] + list(range(2, x.dim())), correction=0)
    outs = aten.native_batch_norm_backward.default(
        grad, x, weight, running_mean, running_var, mean, torch.rsqrt(var + eps), train, eps, mask
    )
    return tuple(x.new_empty(0) if o is None else o for o in outs)


def batch_norm_backward_op():
    """``torch.ops.opsnn.batch_norm_backward``: training-mode ``native_batch_norm_backward`` without the
    saved mean and 1/std (the record recomputes them from the input, so the forward need not save them),
    and ``relu_out``: the output of a ReLU on the forward's result whose ``threshold_backward`` made the
    gradient (None: none); torch runs it through ATen's ops."""
    import torch

    if not _BN_LIBRARY:
        lib = torch.library.Library("opsnn", "FRAGMENT")
        lib.define("batch_norm_backward" + _BN_BACKWARD_SCHEMA)
        lib.impl("batch_norm_backward", _bn_backward_in_torch, "CPU")
        torch.library.register_fake("opsnn::batch_norm_backward", _bn_backward_in_torch, lib=lib)
        _BN_LIBRARY.append(lib)
    return torch.ops.opsnn.batch_norm_backward.default


_BN_LIBRARY: list = []


def _softmax_backward(op):
    """_softmax_backward_data / _log_softmax_backward_data -> opsnn::SoftmaxGrad / LogSoftmaxGrad."""

    def adapt(n, e):
        grad, out, dim, input_dtype = n.args[:4]
        if str(input_dtype) != str(_val(out).dtype):
            raise Unsupported(f"input dtype {input_dtype} (the result is {_val(out).dtype})")
        if _rank(out) == 0:
            raise Unsupported("a 0-d input")
        return [Node(op, [e.name(grad), e.name(out)], [e.out(n)], {"axis": int(dim) % _rank(out)}, "opsnn")]

    adapt.bf16 = False  # torch's bfloat16 kernels round between their steps
    adapt.symbolic = True
    return adapt


def _embedding_backward(n, e):
    """embedding_dense_backward -> opsnn::EmbeddingGrad: rows summed at their ids; torch skips the ids
    equal to padding_idx (no id is negative: a negative padding_idx is none), whose row then stays 0."""
    grad, ids, num_weights, padding_idx, scale_grad_by_freq = n.args[:5]
    if scale_grad_by_freq:
        raise Unsupported("scale_grad_by_freq=True")
    attrs = {"num_rows": int(num_weights)}
    if int(padding_idx) >= 0:
        attrs["padding_idx"] = int(padding_idx)
    return [Node("EmbeddingGrad", [e.name(grad), e.name(ids)], [e.out(n)], attrs, "opsnn")]


_embedding_backward.in_dtypes = (F32, I64, I32)

_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _nll_total_weight(n, e, target, weight, ignore_index, total: str) -> list:
    """torch's total_weight: the summed weights (1 without weights) of the targets that are not
    ignore_index, selected by one Equal and a Where (their float row as the Where's output; an ignored
    target's weight is read at class 0, an index every class table has, and not selected)."""
    ign = e.graph.unique_name(f"{n.name}_ignored")
    zero = e.scalar("zero", 0.0)
    nodes = [Node("Equal", [e.name(target), e.const("ignore_index", np.array(int(ignore_index), np.int64))], [ign])]
    w = e.graph.unique_name(f"{n.name}_w")
    if weight is None:
        nodes.append(Node("Where", [ign, zero, e.scalar("one", 1.0)], [w]))
    else:
        safe, wt = e.graph.unique_name(f"{n.name}_safe"), e.graph.unique_name(f"{n.name}_wt")
        nodes += [
            Node("Where", [ign, e.const("zero", np.array(0, np.int64)), e.name(target)], [safe]),
            Node("Gather", [e.name(weight), safe], [wt], {"axis": 0}),
            Node("Where", [ign, zero, wt], [w]),
        ]
    return nodes + [Node("ReduceSum", [w], [total], {"keepdims": 0})]


def _nll_loss_forward(n, e):
    """nll_loss_forward (nll_loss2d_forward) -> NegativeLogLikelihoodLoss; torch's total_weight (the
    summed weights of the targets not ignored; 0 for reduction none) beside it."""
    x, target, weight, reduction, ignore_index = n.args[:5]
    if _rank(x) < 2 or not _nonempty(shape_of(_val(x))):
        raise Unsupported("an unbatched or empty input")
    red = _REDUCTIONS[int(reduction)]
    out, total = e.outs(n, 2)
    attrs = {"reduction": red, "ignore_index": int(ignore_index)}
    ins = [e.name(x), e.name(target)] + ([e.name(weight)] if weight is not None else [])
    nodes = [Node("NegativeLogLikelihoodLoss", ins, [out], attrs)]
    if red == "none":
        e.names[n] = (out, e.const("total_weight", np.array(0.0, np.float32)))
        return nodes
    return nodes + _nll_total_weight(n, e, target, weight, ignore_index, total)


def _nll_loss_backward(n, e):
    """nll_loss_backward (nll_loss2d_backward) -> opsnn::NLLLossGrad, which writes -dLoss * weight at each
    target that is not ignore_index and 0 elsewhere. For mean, dLoss is grad / total_weight (torch's
    -(grad / total_weight) * weight, to the bit) and the record sums (it would otherwise divide by the
    summed weights it finds itself, not by torch's total_weight)."""
    grad, x, target, weight, reduction, ignore_index, total_weight = n.args[:7]
    shape = shape_of(_val(x))
    if len(shape) < 2 or not _nonempty(shape) or not isinstance(shape[1], int):
        raise Unsupported("an unbatched or empty input, or a symbolic class count")
    red = _REDUCTIONS[int(reduction)]
    nodes: list = []
    dloss = e.name(grad)
    if red == "mean":
        dloss = e.graph.unique_name(f"{n.name}_dloss")
        nodes.append(Node("Div", [e.name(grad), e.name(total_weight)], [dloss]))
    attrs = {"reduction": "none" if red == "none" else "sum", "ignore_index": int(ignore_index)}
    ins = [dloss, e.name(x), e.name(target)] + ([e.name(weight)] if weight is not None else [])
    return nodes + [Node("NLLLossGrad", ins, [e.out(n)], attrs, "opsnn")]


_nll_loss_forward.in_dtypes = _nll_loss_backward.in_dtypes = (F32, I64)
_nll_loss_forward.bf16 = _nll_loss_backward.bf16 = False


def _layer_norm(n, e):
    x, shape, weight, bias, eps = n.args[:5]
    if any(not isinstance(d, int) for d in shape):
        raise Unsupported("a symbolic normalized shape")
    y, mean, rstd = e.outs(n, 3)
    # the statistics where a backward reads them: ONNX's Mean / InvStdDev have torch's kept-dims shape
    if not {u.args[1] for u in n.users if u.target is operator.getitem} & {1, 2}:
        mean = rstd = None
    e.names[n] = (y, mean, rstd)
    axis = _rank(x) - len(shape)
    return [
        Node(
            "LayerNormalization",
            [
                e.name(x),
                e.const("ones", np.ones(tuple(shape), np.float32)) if weight is None else e.name(weight),
                e.const("zeros", np.zeros(tuple(shape), np.float32)) if bias is None else e.name(bias),
            ],
            [y] if mean is None else [y, mean, rstd],
            {"axis": axis, "epsilon": float(eps)},
        )
    ]


def _layer_norm_backward(n, e):
    """opsnn::layer_norm_backward (native_layer_norm_backward with its forward's eps, see
    :func:`norm_backward_op`) -> opsnn::LayerNormalizationGrad, which recomputes the statistics
    torch saved from the same input and eps."""
    grad, x, shape, _mean, _rstd, weight, bias, mask, eps = n.args[:9]
    if not _nonempty(shape_of(_val(x))) or not _static(shape):
        raise Unsupported("an empty input or a symbolic normalized shape")
    names = list(e.outs(n, 3))
    scale = e.const("ones", np.ones(tuple(shape), np.float32)) if weight is None else e.name(weight)
    attrs = {"axis": _rank(x) - len(shape), "epsilon": float(eps)}
    node = Node("LayerNormalizationGrad", [e.name(grad), e.name(x), scale], list(names), attrs, "opsnn")
    e.names[n] = tuple(name if on else None for name, on in zip(names, mask))
    return [node]


_layer_norm_backward.bf16 = False


def _group_norm_backward(n, e):
    """opsnn::group_norm_backward (native_group_norm_backward with its forward's eps) ->
    opsnn::GroupNormalizationGrad, which recomputes the statistics torch saved."""
    grad, x, _mean, _rstd, weight, _n, c, _hw, group, mask, eps = n.args[:11]
    shape = _shape(x)
    if len(shape) < 2 or _numel(shape) == 0:
        raise Unsupported("an input of rank < 2 or an empty one")
    names = list(e.outs(n, 3))
    scale = e.const("ones", np.ones(int(c), np.float32)) if weight is None else e.name(weight)
    attrs = {"num_groups": int(group), "epsilon": float(eps)}
    node = Node("GroupNormalizationGrad", [e.name(grad), e.name(x), scale], list(names), attrs, "opsnn")
    e.names[n] = tuple(name if on else None for name, on in zip(names, mask))
    return [node]


_group_norm_backward.bf16 = False

_LIBRARY: list = []

#: ATen norm backward -> (opsnn op name, schema after the name: ATen's arguments and the forward's eps)
_NAMED_EPS = {
    "native_layer_norm_backward": (
        "layer_norm_backward",
        "(Tensor grad_out, Tensor input, SymInt[] normalized_shape, Tensor mean, Tensor rstd, Tensor? weight, "
        "Tensor? bias, bool[3] output_mask, float eps) -> (Tensor, Tensor, Tensor)",
    ),
    "native_group_norm_backward": (
        "group_norm_backward",
        "(Tensor grad_out, Tensor input, Tensor mean, Tensor rstd, Tensor? weight, SymInt N, SymInt C, "
        "SymInt HxW, int group, bool[3] output_mask, float eps) -> (Tensor, Tensor, Tensor)",
    ),
}


def _as_aten(op):
    def run(*args):  # the eps (last) is the record's alone
        outs = op(*args[:-1])
        return tuple(args[1].new_empty(0) if o is None else o for o in outs)

    return run


def norm_backward_op(aten_name: str):
    """``torch.ops.opsnn.layer_norm_backward`` / ``group_norm_backward``: ATen's ``aten_name`` with one more
    argument, the eps of the forward that saved ``mean`` and ``rstd`` (ATen's op has none, and the
    records recompute the statistics); torch runs it as ATen's op (masked-off outputs empty)."""
    import torch

    if not _LIBRARY:
        lib = torch.library.Library("opsnn", "FRAGMENT")
        for aten_op, (name, schema) in _NAMED_EPS.items():
            lib.define(name + schema)

            run = _as_aten(getattr(torch.ops.aten, aten_op).default)
            lib.impl(name, run, "CPU")
            torch.library.register_fake(f"opsnn::{name}", run, lib=lib)
        _LIBRARY.append(lib)
    return getattr(torch.ops.opsnn, _NAMED_EPS[aten_name][0]).default


def _softmax(op):
    def adapt(n, e):
        x, dim, half_to_float = n.args[:3]
        if half_to_float:
            raise Unsupported("half_to_float")
        if _rank(x) == 0:  # softmax of one value: through a 1-element vector
            flat, y = e.graph.unique_name(f"{n.name}_1"), e.graph.unique_name(f"{n.name}_y")
            return [
                Node("Reshape", [e.name(x), e.const("shape", np.array([1], np.int64))], [flat]),
                Node(op, [flat], [y], {"axis": 0}),
                Node("Reshape", [y, e.const("shape", np.zeros(0, np.int64))], [e.out(n)]),
            ]
        return [Node(op, [e.name(x)], [e.out(n)], {"axis": int(dim)})]

    adapt.symbolic = True
    # torch's bfloat16 log_softmax rounds between its steps (0.06 off float32 rounded once where
    # its results are near -4, beyond bfloat16's tolerance): torch keeps it
    adapt.bf16 = op != "LogSoftmax"
    return adapt


def _gelu(n, e):
    approximate = n.kwargs.get("approximate", n.args[1] if len(n.args) > 1 else "none")
    return [Node("Gelu", [e.name(n.args[0])], [e.out(n)], {"approximate": approximate})]


def _reduce(op):
    def adapt(n, e):
        x = n.args[0]
        dims = _kw(n, 1, "dim", None)
        keepdim = _kw(n, 2, "keepdim", False)
        _same_dtype_arg(n, "dtype", 3)
        if isinstance(dims, int):
            dims = [dims]
        if not dims:  # None or []: every dim, as torch reads it
            dims = list(range(_rank(x)))
        src, nodes = e.name(x), []
        in_dt, out_dt = str(_val(x).dtype), str(_val(n).dtype)
        if in_dt != out_dt:  # a sum of bools counts them in int64
            if (in_dt, out_dt, op) != (BOOL, I64, "ReduceSum"):
                raise Unsupported(f"a {in_dt} input with a {out_dt} result")
            src = e.graph.unique_name(f"{n.name}_i64")
            nodes.append(Node("Cast", [e.name(x)], [src], {"to": 7}))
        if _rank(x) == 0:  # a 0-d tensor reduces to itself
            return nodes + [Node("Identity", [src], [e.out(n)])]
        if not all(_positive(d) for d in shape_of(_val(x))):
            if _numel(_shape(x)) == 0 and op in ("ReduceSum", "ReduceProd"):  # the empty sum / product
                e.names[n] = e.const(n.name, np.full(_shape(n), 0 if op == "ReduceSum" else 1, _NP_DTYPES[out_dt]))
                return []
            if any(_shape(x)[int(d) % _rank(x)] == 0 for d in dims) and op != "ReduceSum":
                raise Unsupported("a reduction over an empty dim")
        axes = e.const("axes", np.array([int(d) for d in dims], np.int64))
        return nodes + [Node(op, [src, axes], [e.out(n)], {"keepdims": int(bool(keepdim))})]

    if op in ("ReduceSum", "ReduceMax", "ReduceMin"):  # exact on int64 too (a sum wraps as torch's)
        adapt.in_dtypes = (F32, I64, BOOL) if op == "ReduceSum" else (F32, I64)
        adapt.out_dtypes = (F32, I64)
    adapt.symbolic = True
    return adapt


def _cat(n, e):
    tensors = list(n.args[0])
    dim = _kw(n, 1, "dim", 0)
    rank = _rank(n)
    if rank != 1:  # torch skips legacy empty 1-D inputs (a KV cache's first torch.cat onto tensor([]))
        tensors = [t for t in tensors if tuple(shape_of(_val(t))) != (0,)] or tensors
    if any(_rank(t) != rank for t in tensors):
        raise Unsupported("inputs of different ranks")
    if len(tensors) == 1:
        return [Node("Identity", [e.name(tensors[0])], [e.out(n)])]
    return [Node("Concat", [e.name(t) for t in tensors], [e.out(n)], {"axis": int(dim) % rank})]


def _avg_pool2d(n, e):
    x, kernel = n.args[:2]
    stride = _kw(n, 2, "stride", [])
    padding = _kw(n, 3, "padding", 0)
    if _kw(n, 4, "ceil_mode", False):
        raise Unsupported("ceil_mode=True")
    if _kw(n, 6, "divisor_override", None) is not None:
        raise Unsupported("divisor_override")
    ks, pads = _pairs(kernel, 2), _pairs(padding, 2)
    attrs = {
        "kernel_shape": ks,
        "strides": _pairs(stride, 2) if stride else ks,
        "pads": pads + pads,
        "count_include_pad": int(bool(_kw(n, 5, "count_include_pad", True))),
    }
    return [Node("AveragePool", [e.name(x)], [e.out(n)], attrs)]


def _adaptive_avg_pool2d(n, e):
    x, size = n.args[:2]
    if _rank(x) != 4 or [int(d) for d in size] != [1, 1]:
        raise Unsupported(f"output size {list(size)} on a {_rank(x)}-D input (mapped: 1x1 on 4-D)")
    return [Node("GlobalAveragePool", [e.name(x)], [e.out(n)])]


def _clip(lo_key: str, hi_key: str, lo_default, hi_default):
    def adapt(n, e):
        lo, hi = _kw(n, 1, lo_key, lo_default), _kw(n, 2, hi_key, hi_default)
        if lo is not None and hi is not None and lo > hi:
            raise Unsupported("min > max")  # torch then gives max everywhere; Clip's rule may differ
        dt = str(_val(n.args[0]).dtype)
        if dt != str(_val(n).dtype):
            raise Unsupported("a float bound on an int64 tensor (torch promotes)")
        ins = [e.name(n.args[0])]
        ins += ["" if v is None else e.scalar(h, v, dt) for h, v in (("min", lo), ("max", hi))]
        return [Node("Clip", ins, [e.out(n)])]

    adapt.in_dtypes = adapt.out_dtypes = (F32, I64)
    adapt.symbolic = True
    return adapt


def _clamp_max(n, e):
    dt = str(_val(n.args[0]).dtype)
    if dt != str(_val(n).dtype):
        raise Unsupported("a float bound on an int64 tensor (torch promotes)")
    return [Node("Clip", [e.name(n.args[0]), "", e.scalar("max", n.args[1], dt)], [e.out(n)])]


_clamp_max.in_dtypes = _clamp_max.out_dtypes = (F32, I64)


def _leaky_relu(n, e):
    return [Node("LeakyRelu", [e.name(n.args[0])], [e.out(n)], {"alpha": float(_kw(n, 1, "negative_slope", 0.01))})]


def _getitem(n, e):  # a tuple member: the name its producer's lowering gave it
    src, i = n.args
    names = e.names.get(src)
    if not isinstance(names, tuple) or names[i] is None:
        raise Unsupported(f"output {i} of {src.target} is not computed by its opsnn lowering")
    e.names[n] = names[i]
    return []


def _compare(op, negate: bool = False):
    def adapt(n, e):
        a, b = n.args[:2]
        dtypes = {str(_val(x).dtype) for x in (a, b) if hasattr(x, "op")}
        if len(dtypes) != 1:
            raise Unsupported(f"operands of dtypes {sorted(dtypes)}")
        dt = dtypes.pop()
        nodes = []
        if dt == I64 and any(isinstance(x, float) for x in (a, b)):
            # an int64 tensor against a float scalar: torch compares in float32, the tensor cast to it
            cast = e.graph.unique_name(f"{n.name}_f32")
            nodes.append(Node("Cast", [e.name(a if hasattr(a, "op") else b)], [cast], {"to": 1}))
            ins = [cast, e.scalar("c", b)] if hasattr(a, "op") else [e.scalar("c", a), cast]
        else:
            ins = [e.operand(a, "c", dt), e.operand(b, "c", dt)]
        if not negate:
            return nodes + [Node(op, ins, [e.out(n)])]
        eq = e.graph.unique_name(f"{n.name}_eq")
        return nodes + [Node(op, ins, [eq]), Node("Not", [eq], [e.out(n)])]

    adapt.in_dtypes = (F32, I64)
    adapt.out_dtypes = (BOOL,)
    adapt.symbolic = True
    return adapt


def _logical(op):
    def adapt(n, e):
        return [Node(op, [e.name(a) for a in n.args], [e.out(n)])]

    adapt.in_dtypes = adapt.out_dtypes = (BOOL,)
    return adapt


def _where(n, e):
    cond, a, b = n.args[:3]
    if str(_val(cond).dtype) != BOOL:
        raise Unsupported("a condition that is not bool")
    dt = str(_val(n).dtype)
    if any(hasattr(x, "op") and str(_val(x).dtype) != dt for x in (a, b)):
        raise Unsupported("branches of another dtype than the result (torch promotes)")
    if dt == BOOL and not all(hasattr(x, "op") for x in (a, b)):
        raise Unsupported("a Python scalar branch of a bool result")
    return [Node("Where", [e.name(cond), e.operand(a, "c", dt), e.operand(b, "c", dt)], [e.out(n)])]


_where.in_dtypes = _where.out_dtypes = (F32, I64, BOOL)


def _constant(n, e):
    """A tensor made of its arguments alone (scalar_tensor, full): an initializer."""
    v = _val(n)
    value = n.args[0] if n.target.__name__.startswith("scalar_tensor") else n.args[1]
    dt = str(v.dtype)
    if not isinstance(value, (bool, int, float)):
        raise Unsupported(f"a fill value of type {type(value).__name__}")
    if dt in (I64, I32, I16, I8):
        info = np.iinfo(_NP_DTYPES[dt])
        if isinstance(value, bool) or value != int(value) or not info.min <= value <= info.max:
            raise Unsupported(f"fill value {value} for a {dt} tensor")
    if dt == F32 and isinstance(value, bool):
        value = float(value)
    if not _static(shape_of(v)):  # symbolic sizes: the value expanded to the shape, read when planned
        if not n.target.__name__.startswith("full_like"):
            raise Unsupported("a tensor of symbolic sizes made of its arguments alone")
        shape = e.graph.unique_name(f"{n.name}_shape")
        fill = e.const("fill", np.array(value, _NP_DTYPES[dt]))
        return [Node("Shape", [e.name(n.args[0])], [shape]), Node("Expand", [fill, shape], [e.out(n)])]
    name = e.const(n.name, np.full(tuple(int(d) for d in v.shape), value, _NP_DTYPES[dt]))
    e.names[n] = name
    return []


_constant.out_dtypes = (F32, I64, BOOL, F64, I32, I16, I8)  # not float16: torch may round twice


def _identity(n, e):
    return [Node("Identity", [e.name(n.args[0])], [e.out(n)])]


_identity.in_dtypes = _identity.out_dtypes = (F32, BOOL)


def _threshold_backward(n, e):
    grad, x, threshold = n.args[:3]
    mask = e.graph.unique_name(f"{n.name}_le")
    return [
        Node("LessOrEqual", [e.name(x), e.scalar("threshold", threshold)], [mask]),
        Node("Where", [mask, e.scalar("zero", 0.0), e.name(grad)], [e.out(n)]),
    ]


def _convolution_backward(n, e):
    """Gradients of a convolution: the input's and the weight's by the gradient records
    (opsnn::ConvBackwardData / ConvBackwardWeight: oneDNN's backward primitives or GEMM kernels),
    the bias's a sum."""
    grad, x, w, _bias_sizes, stride, padding, dilation, transposed, output_padding, groups, mask = n.args[:11]
    if transposed:
        raise Unsupported("the gradient of a transposed convolution")
    k = _rank(w) - 2
    stride, dilation, pads = _pairs(stride, k), _pairs(dilation, k), _pairs(padding, k)
    attrs = {"strides": stride, "pads": pads + pads, "dilations": dilation, "group": int(groups)}
    names = list(e.outs(n, 3))
    nodes = []
    if mask[0] and not _static(shape_of(_val(x))):  # dX's shape from X itself, not an attribute
        nodes.append(Node("ConvBackward", [e.name(grad), e.name(x), e.name(w)], [names[0]], attrs, "opsnn"))
    elif mask[0]:
        shape = {"input_shape": list(_shape(x))}
        nodes.append(Node("ConvBackwardData", [e.name(grad), e.name(w)], [names[0]], dict(attrs, **shape), "opsnn"))
    else:
        names[0] = None
    if mask[1]:
        shape = {"weight_shape": list(_shape(w))}
        nodes.append(Node("ConvBackwardWeight", [e.name(x), e.name(grad)], [names[1]], dict(attrs, **shape), "opsnn"))
    else:
        names[1] = None
    if mask[2]:
        axes = e.const("axes", np.array([0] + list(range(2, k + 2)), np.int64))
        nodes.append(Node("ReduceSum", [e.name(grad), axes], [names[2]], {"keepdims": 0}))
    else:
        names[2] = None
    e.names[n] = tuple(names)
    return nodes


def _batch_norm_training(n, e):
    """Training-mode batch norm: the output, the batch mean and 1/std it saves for the backward, the
    running statistics updated with ``momentum`` (the variance unbiased). One BatchNormalization record
    when nothing reads the saved statistics (opsnn::batch_norm_backward recomputes them), else from
    reductions."""
    x, weight, bias, mean, var, training, momentum, eps = n.args[:8]
    if not training:
        raise Unsupported("batch norm in eval mode through the functional training op")
    if weight is None or bias is None:
        raise Unsupported("batch norm without affine weights")
    shape = shape_of(_val(x))
    c, rank = shape[1], len(shape)
    if not isinstance(c, int) or not _nonempty(shape):
        raise Unsupported("a symbolic channel count or an empty input")
    m = float(momentum)
    if _static(shape) and int(np.prod(shape)) // c < 2:
        raise Unsupported("one value per channel (the unbiased variance divides by zero)")
    y, save_mean, save_rstd, new_mean, new_var = e.outs(n, 5)
    if not {u.args[1] for u in n.users if u.target is operator.getitem} & {1, 2}:
        # no saved statistics read (the backward recomputes them): one record, running statistics and all
        e.names[n] = (y, None, None, new_mean, new_var)
        attrs = {"epsilon": float(eps), "momentum": 1.0 - m, "training_mode": 1, "unbiased_running_var": 1}
        ins = [e.name(x), e.name(weight), e.name(bias), e.name(mean), e.name(var)]
        return [Node("BatchNormalization", ins, [y, new_mean, new_var], attrs)]
    pre: list = []
    if _static(shape):
        count = int(np.prod(shape)) // c
        unbias = e.scalar("momentum", m * count / (count - 1))
    else:  # symbolic sizes (each at least 2): the count from x's Shape, in float64 as above
        t = {h: e.graph.unique_name(f"{n.name}_{h}") for h in ("all", "cnt", "mc", "c1", "ub64", "ub")}
        total = _dims_product(e, n, x, 0, pre)
        pre += [
            Node("Cast", [total], [t["all"]], {"to": 11}),
            Node("Div", [t["all"], e.const("c", np.array(c, np.float64))], [t["cnt"]]),
            Node("Mul", [t["cnt"], e.const("momentum", np.array(m, np.float64))], [t["mc"]]),
            Node("Sub", [t["cnt"], e.const("one", np.array(1.0, np.float64))], [t["c1"]]),
            Node("Div", [t["mc"], t["c1"]], [t["ub64"]]),
            Node("Cast", [t["ub64"]], [t["ub"]], {"to": 1}),
        ]
        unbias = t["ub"]
    axes = e.const("axes", np.array([0] + list(range(2, rank)), np.int64))
    bshape = e.const("bshape", np.array([1, c] + [1] * (rank - 2), np.int64))
    flat = e.const("cshape", np.array([c], np.int64))
    t = {h: e.graph.unique_name(f"{n.name}_{h}") for h in "mu d d2 v ve sd r xn wb bb xw m1 m2 vu v1 v2".split()}
    return pre + [
        Node("ReduceMean", [e.name(x), axes], [t["mu"]], {"keepdims": 1}),
        Node("Sub", [e.name(x), t["mu"]], [t["d"]]),
        Node("Mul", [t["d"], t["d"]], [t["d2"]]),
        Node("ReduceMean", [t["d2"], axes], [t["v"]], {"keepdims": 1}),
        Node("Add", [t["v"], e.scalar("eps", eps)], [t["ve"]]),
        Node("Sqrt", [t["ve"]], [t["sd"]]),
        Node("Reciprocal", [t["sd"]], [t["r"]]),
        Node("Mul", [t["d"], t["r"]], [t["xn"]]),
        Node("Reshape", [e.name(weight), bshape], [t["wb"]]),
        Node("Reshape", [e.name(bias), bshape], [t["bb"]]),
        Node("Mul", [t["xn"], t["wb"]], [t["xw"]]),
        Node("Add", [t["xw"], t["bb"]], [y]),
        Node("Reshape", [t["mu"], flat], [save_mean]),
        Node("Reshape", [t["r"], flat], [save_rstd]),
        Node("Mul", [e.name(mean), e.scalar("keep", 1.0 - m)], [t["m1"]]),
        Node("Mul", [save_mean, e.scalar("momentum", m)], [t["m2"]]),
        Node("Add", [t["m1"], t["m2"]], [new_mean]),
        Node("Reshape", [t["v"], flat], [t["vu"]]),
        Node("Mul", [e.name(var), e.scalar("keep", 1.0 - m)], [t["v1"]]),
        Node("Mul", [t["vu"], unbias], [t["v2"]]),
        Node("Add", [t["v1"], t["v2"]], [new_var]),
    ]


def _batch_norm_no_stats(n, e):
    """Training-mode batch norm without running statistics (``track_running_stats=False``): the output
    and the batch mean and 1/std (biased variance) it saves for the backward."""
    x, weight, bias, training, _momentum, eps = n.args[:6]
    if not training:
        raise Unsupported("eval mode without running statistics")
    shape = _shape(x)
    if len(shape) < 2 or _numel(shape) == 0:
        raise Unsupported("an input of rank < 2 or an empty one")
    y, save_mean, save_rstd = e.outs(n, 3)
    yn = e.graph.unique_name(f"{n.name}_yn")
    norm, mu, r = _normalize(e, n, e.name(x), [0] + list(range(2, len(shape))), eps, yn)
    flat = e.const("cshape", np.array([shape[1]], np.int64))
    return (
        norm
        + _affine(e, n, yn, weight, bias, shape[1], len(shape), y)
        + [Node("Reshape", [mu, flat], [save_mean]), Node("Reshape", [r, flat], [save_rstd])]
    )


def _clamp_tensor(n, e):
    x, lo, hi = n.args[0], _kw(n, 1, "min", None), _kw(n, 2, "max", None)
    nodes, cur = [], e.name(x)
    for op, bound in (("Max", lo), ("Min", hi)):
        if bound is None:
            continue
        nxt = e.graph.unique_name(f"{n.name}_{op.lower()}")
        nodes.append(Node(op, [cur, e.operand(bound, "c")], [nxt]))
        cur = nxt
    nodes.append(Node("Identity", [cur], [e.out(n)]))
    return nodes


def _pow(n, e):
    a, b = n.args[:2]
    return [Node("Pow", [e.operand(a, "c"), e.operand(b, "c")], [e.out(n)])]


def _mod_operands(n, e) -> list:
    a, b = n.args[:2]
    dt = _common_dtype(n, a, b)
    if dt == I64 and (hasattr(b, "op") or b == 0):  # an int64 division by zero raises in torch
        raise Unsupported("an int64 divisor that is a tensor or zero")
    return [e.operand(a, "c", dt), e.operand(b, "c", dt)]


def _fmod(n, e):
    return [Node("Mod", _mod_operands(n, e), [e.out(n)], {"fmod": 1})]


_fmod.in_dtypes = _fmod.out_dtypes = (F32, I64)


def _log_base(base: float):
    def adapt(n, e):
        ln = e.graph.unique_name(f"{n.name}_ln")
        return [
            Node("Log", [e.name(n.args[0])], [ln]),
            Node("Div", [ln, e.scalar("ln_base", float(np.log(np.float64(base))))], [e.out(n)]),
        ]

    return adapt


def _rsqrt(n, e):
    root = e.graph.unique_name(f"{n.name}_sqrt")
    return [Node("Sqrt", [e.name(n.args[0])], [root]), Node("Reciprocal", [root], [e.out(n)])]


def _exp2(n, e):
    return [Node("Pow", [e.scalar("two", 2.0), e.name(n.args[0])], [e.out(n)])]


def _attr_unary(op, **attrs):
    def adapt(n, e):
        return [Node(op, [e.name(n.args[0])], [e.out(n)], dict(attrs))]

    adapt.symbolic = True
    return adapt


def _elu(n, e):
    alpha, scale, input_scale = _kw(n, 1, "alpha", 1.0), _kw(n, 2, "scale", 1.0), _kw(n, 3, "input_scale", 1.0)
    if scale != 1 or input_scale != 1:
        raise Unsupported("elu with scale or input_scale != 1")
    return [Node("Elu", [e.name(n.args[0])], [e.out(n)], {"alpha": float(alpha)})]


def _softplus(n, e):
    beta, threshold = _kw(n, 1, "beta", 1.0), _kw(n, 2, "threshold", 20.0)
    if beta != 1 or threshold != 20:  # torch returns x above threshold / beta; log1p(exp(x)) agrees at 20
        raise Unsupported(f"softplus beta {beta}, threshold {threshold} (mapped: 1, 20)")
    return [Node("Softplus", [e.name(n.args[0])], [e.out(n)])]


#: the ONNX dtype codes of the dtypes _to_copy casts to
_ONNX_TO = {F32: 1, BOOL: 9, I64: 7, F64: 11, F16: 10, I32: 6, I16: 5, I8: 3}


def _to_copy(n, e):
    import torch

    if set(n.kwargs) - {"dtype", "layout", "device", "memory_format", "non_blocking"}:
        raise Unsupported(f"arguments {sorted(n.kwargs)}")
    if n.kwargs.get("layout") not in (None, torch.strided) or str(n.kwargs.get("device", "cpu")) != "cpu":
        raise Unsupported("another layout or device")
    src, dst = str(_val(n.args[0]).dtype), str(_val(n).dtype)
    if src == dst:
        return [Node("Identity", [e.name(n.args[0])], [e.out(n)])]
    if src in (F32, F64, F16) and dst in (I8, I16):  # out of range differs by compiler; narrow ints refused
        raise Unsupported(f"a float to {dst} conversion")
    if (src, dst) == (F64, F16):  # torch may round through float32 first, numpy rounds once
        raise Unsupported("a float64 to float16 conversion")
    # floats round to nearest even, floats to ints truncate, bools are 0 / 1, numbers to bool are != 0: as torch
    return [Node("Cast", [e.name(n.args[0])], [e.out(n)], {"to": _ONNX_TO[dst]})]


_to_copy.in_dtypes = _to_copy.out_dtypes = tuple(_ONNX_TO)


def _constant_pad(n, e):
    x, pad = n.args[:2]
    value = _kw(n, 2, "value", 0.0)
    rank = _rank(x)
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):  # torch lists the last dim first
        begins[rank - 1 - i], ends[rank - 1 - i] = int(pad[2 * i]), int(pad[2 * i + 1])
    if any(d == 0 for d in _shape(x)) and _numel(_shape(n)):  # nothing but padding
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Unsupported(f"a pad value of type {type(value).__name__}")
        e.names[n] = e.const(n.name, np.full(_shape(n), value, np.float32))
        return []
    return [
        Node(
            "Pad",
            [e.name(x), e.const("pads", np.array(begins + ends, np.int64)), e.scalar("value", value)],
            [e.out(n)],
            {"mode": "constant"},
        )
    ]


def _slice(n, e):
    x = n.args[0]
    dim, start, end, step = _kw(n, 1, "dim", 0), _kw(n, 2, "start", None), _kw(n, 3, "end", None), _kw(n, 4, "step", 1)
    size = _shape(x)[int(dim) % _rank(x)]
    start = 0 if start is None else int(start)
    end = size if end is None else int(end)
    start, end = (
        max(min(start + size if start < 0 else start, size), 0),
        max(min(end + size if end < 0 else end, size), 0),
    )
    if any(d == 0 for d in _shape(n)):
        raise Unsupported("an empty result")
    ins = [e.name(x)] + [e.const(h, np.array([v], np.int64)) for h, v in (("starts", start), ("ends", end))]
    ins += [
        e.const("axes", np.array([int(dim) % _rank(x)], np.int64)),
        e.const("steps", np.array([int(step)], np.int64)),
    ]
    return [Node("Slice", ins, [e.out(n)])]


def _select(n, e):
    x, dim, index = n.args[:3]
    rank = _rank(x)
    dim = int(dim) % rank
    if not _static(shape_of(_val(x))):  # symbolic dims: a Gather of one index drops the axis
        size = shape_of(_val(x))[dim]
        if not isinstance(size, int) and int(index) < 0:
            raise Unsupported("a negative index into a symbolic dim")
        index = int(index) % size if isinstance(size, int) else int(index)
        return [Node("Gather", [e.name(x), e.const("index", np.array(index, np.int64))], [e.out(n)], {"axis": dim})]
    index = int(index) % _shape(x)[dim]
    part = e.graph.unique_name(f"{n.name}_slice")
    ins = [e.name(x)] + [e.const(h, np.array([v], np.int64)) for h, v in (("starts", index), ("ends", index + 1))]
    ins.append(e.const("axes", np.array([dim], np.int64)))
    return [
        Node("Slice", ins, [part]),
        Node("Reshape", [part, e.const("shape", np.array(_shape(n), np.int64))], [e.out(n)], {"allowzero": 1}),
    ]


def _flip(n, e):
    x, dims = n.args[:2]
    rank = _rank(x)
    if not dims or rank == 0:
        return [Node("Identity", [e.name(x)], [e.out(n)])]
    axes = [int(d) % rank for d in dims]
    if any(_shape(x)[a] == 0 for a in axes):
        raise Unsupported("an empty dim")
    k = len(axes)
    ins = [
        e.name(x),
        e.const("starts", np.full(k, -1, np.int64)),
        e.const("ends", np.full(k, np.iinfo(np.int64).min, np.int64)),
        e.const("axes", np.array(axes, np.int64)),
        e.const("steps", np.full(k, -1, np.int64)),
    ]
    return [Node("Slice", ins, [e.out(n)])]


def _repeat(n, e):
    x, repeats = n.args[:2]
    repeats = [int(r) for r in repeats]
    lead = len(repeats) - _rank(x)
    if any(d == 0 for d in _shape(n)):
        raise Unsupported("an empty result")
    src = e.name(x)
    nodes = []
    if lead:
        src = e.graph.unique_name(f"{n.name}_lead")
        shape = [1] * lead + list(_shape(x))
        nodes.append(Node("Reshape", [e.name(x), e.const("shape", np.array(shape, np.int64))], [src]))
    return nodes + [Node("Tile", [src, e.const("repeats", np.array(repeats, np.int64))], [e.out(n)])]


def _trilu(upper: int):
    def adapt(n, e):
        x = n.args[0]
        k = int(_kw(n, 1, "diagonal", 0))
        if _rank(x) < 2:
            raise Unsupported("a tensor of rank < 2")
        return [Node("Trilu", [e.name(x), e.const("k", np.array(k, np.int64))], [e.out(n)], {"upper": upper})]

    return adapt


def _cumsum(n, e):
    x, dim = n.args[:2]
    _same_dtype_arg(n, "dtype", 99)
    if _rank(x) == 0:
        return [Node("Identity", [e.name(x)], [e.out(n)])]
    return [Node("CumSum", [e.name(x), e.const("axis", np.array(int(dim) % _rank(x), np.int64))], [e.out(n)])]


def _index_select(n, e):
    x, dim, index = n.args[:3]
    if _rank(x) == 0:  # index is [0] or 0-d [0]: the value itself, in the index's shape
        return [
            Node("Reshape", [e.name(x), e.const("shape", np.array(_shape(n), np.int64))], [e.out(n)], {"allowzero": 1})
        ]
    return [Node("Gather", [e.name(x), e.name(index)], [e.out(n)], {"axis": int(dim) % _rank(x)})]


_index_select.in_dtypes = (F32, I64)


def _embedding(n, e):
    weight, ids = n.args[:2]
    return [Node("Gather", [e.name(weight), e.name(ids)], [e.out(n)], {"axis": 0})]


_embedding.in_dtypes = (F32, I64)


def _gather(n, e):
    x, dim, index = n.args[:3]
    if _kw(n, 3, "sparse_grad", False) or _rank(x) == 0 or _rank(x) != _rank(index):
        raise Unsupported("sparse_grad, a 0-d input or an index of another rank")
    return [Node("GatherElements", [e.name(x), e.name(index)], [e.out(n)], {"axis": int(dim) % _rank(x)})]


_gather.in_dtypes = _gather.out_dtypes = (F32, I64)


def _sdpa_flash(n, e):
    """``_scaled_dot_product_flash_attention_for_cpu`` (what ``scaled_dot_product_attention`` is on a CPU
    float32 tensor) -> Attention, output 0 alone (the logsumexp is for the backward, which inference
    has not). Both mask a row no key may attend to zeros; torch's causal mask is top-left aligned,
    ONNX's bottom-right: equal only when queries and keys are as many."""
    q, k, v = n.args[:3]
    dropout, causal = _kw(n, 3, "dropout_p", 0.0), _kw(n, 4, "is_causal", False)
    mask, scale = n.kwargs.get("attn_mask"), n.kwargs.get("scale")
    qs, ks, vs = (shape_of(_val(t)) for t in (q, k, v))
    if dropout:
        raise Unsupported(f"dropout_p={dropout}")
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4 or not _static(qs + ks + vs):
        raise Unsupported("inputs that are not 4-D (B, H, S, D) of static shapes")
    if ks[1] != vs[1] or qs[1] % ks[1] or ks[2] != vs[2] or qs[3] != ks[3]:
        raise Unsupported(f"Q, K, V of shapes {qs}, {ks}, {vs}")
    if causal and qs[2] != ks[2]:
        raise Unsupported("is_causal with queries and keys of different lengths")
    if mask is not None and (
        not 1 <= _rank(mask) <= 4
        or str(_val(mask).dtype) not in (F32, BOOL)
        or shape_of(_val(mask))[-1] != ks[2]  # ONNX pads a shorter key dim with -inf, torch broadcasts a 1
    ):
        raise Unsupported("a mask of rank 0 or over 4, not float32 / bool, or not one value per key")
    if min(qs + ks + vs) == 0:
        raise Unsupported("an empty input")
    y, _lse = e.outs(n, 2)
    e.names[n] = (y, None)
    inputs = [e.name(q), e.name(k), e.name(v)] + ([e.name(mask)] if mask is not None else [])
    attrs = {"is_causal": int(bool(causal)), "scale": float(1.0 / np.sqrt(qs[3]) if scale is None else scale)}
    return [Node("Attention", inputs, [y], attrs)]


_sdpa_flash.in_dtypes = (F32, BOOL)
_sdpa_flash.first_only = True


def _arange(n, e):
    v = _val(n)
    start, end, step = n.args[0], n.args[1], _kw(n, 2, "step", 1)
    if any(isinstance(a, bool) or not isinstance(a, (int, float)) for a in (start, end, step)):
        raise Unsupported("non-number bounds")
    if str(v.dtype) == I64:
        if not all(isinstance(a, int) for a in (start, end, step)):
            raise Unsupported("int64 arange with float bounds")
        values = np.arange(start, end, step, dtype=np.int64)
    else:
        values = np.arange(start, end, step, dtype=np.float64).astype(np.float32)
    if values.shape != tuple(v.shape):
        raise Unsupported(f"{values.shape[0]} values where torch makes {tuple(v.shape)}")
    e.names[n] = e.const(n.name, values)
    return []


def _is(op):
    def adapt(n, e):
        return [Node(op, [e.name(n.args[0])], [e.out(n)])]

    adapt.out_dtypes = (BOOL,)
    return adapt


_arange.out_dtypes = (F32, I64)
for _f in (_reshape, _expand, _permute, _clone, _identity, _cat, _slice, _select, _split):
    _f.in_dtypes = _f.out_dtypes = (F32, BOOL, I64)


def _var_mean(n, e):
    """var_mean.correction / var.correction: the variance with ``correction`` (and the mean) over
    ``dim``; no degrees of freedom left divides by zero, inf or nan as torch gives."""
    x = n.args[0]
    dims = _kw(n, 1, "dim", None)
    correction = n.kwargs.get("correction", 1)
    keepdim = n.kwargs.get("keepdim", False)
    rank = _rank(x)
    if rank == 0:
        raise Unsupported("a 0-d input")
    dims = list(range(rank)) if not dims else [int(d) % rank for d in dims]
    count = int(np.prod([_shape(x)[d] for d in dims]))
    correction = 1 if correction is None else correction
    with_mean = isinstance(_val(n), (tuple, list))
    var, mean = e.outs(n, 2) if with_mean else (e.out(n), None)
    t = {h: e.graph.unique_name(f"{n.name}_{h}") for h in ("m", "d", "d2", "s")}
    axes = e.const("axes", np.array(dims, np.int64))
    return [
        Node("ReduceMean", [e.name(x), axes], [t["m"]], {"keepdims": 1}),
        Node("Sub", [e.name(x), t["m"]], [t["d"]]),
        Node("Mul", [t["d"], t["d"]], [t["d2"]]),
        Node("ReduceSum", [t["d2"], axes], [t["s"]], {"keepdims": int(bool(keepdim))}),
        Node("Div", [t["s"], e.scalar("dof", float(max(0, count - correction)))], [var]),
    ] + ([Node("ReduceMean", [e.name(x), axes], [mean], {"keepdims": int(bool(keepdim))})] if with_mean else [])


def _remainder(n, e):
    return [Node("Mod", _mod_operands(n, e), [e.out(n)], {"fmod": 0})]


_remainder.in_dtypes = _remainder.out_dtypes = (F32, I64)


def _trunc(n, e):
    t = {h: e.graph.unique_name(f"{n.name}_{h}") for h in ("sign", "abs", "floor")}
    x = e.name(n.args[0])
    return [
        Node("Sign", [x], [t["sign"]]),
        Node("Abs", [x], [t["abs"]]),
        Node("Floor", [t["abs"]], [t["floor"]]),
        Node("Mul", [t["sign"], t["floor"]], [e.out(n)]),
    ]


def _cumprod(n, e):
    x, dim = n.args[:2]
    _same_dtype_arg(n, "dtype", 99)
    if _rank(x) == 0:
        return [Node("Identity", [e.name(x)], [e.out(n)])]
    return [Node("CumProd", [e.name(x), e.const("axis", np.array(int(dim) % _rank(x), np.int64))], [e.out(n)])]


def _vector_norm(n, e):
    x = n.args[0]
    order, dims, keepdim = _kw(n, 1, "ord", 2), _kw(n, 2, "dim", None), _kw(n, 3, "keepdim", False)
    _same_dtype_arg(n, "dtype", 4)
    rank = _rank(x)
    if isinstance(order, bool) or not isinstance(order, (int, float)):
        raise Unsupported(f"ord of type {type(order).__name__}")
    if rank == 0:  # one value: |x| for any ord but 0, (x != 0) for 0
        if order == 0:
            more, truth = _truthy(e, n, x, "nz")
            return more + [Node("Cast", [truth], [e.out(n)], {"to": 1})]
        return [Node("Abs", [e.name(x)], [e.out(n)])]
    dims = list(range(rank)) if not dims else [int(d) % rank for d in ([dims] if isinstance(dims, int) else dims)]
    if any(_shape(x)[d] == 0 for d in dims):
        if order < 0 or order == float("inf"):
            raise Unsupported(f"ord {order} over an empty dim")
        e.names[n] = e.const(n.name, np.zeros(_shape(n), np.float32))
        return []
    axes = e.const("axes", np.array(dims, np.int64))
    attrs = {"keepdims": int(bool(keepdim))}
    if order == 0:  # the count of nonzero values
        more, truth = _truthy(e, n, x, "nz")
        cast = e.graph.unique_name(f"{n.name}_cast")
        return more + [Node("Cast", [truth], [cast], {"to": 1}), Node("ReduceSum", [cast, axes], [e.out(n)], attrs)]
    if order in (1, 2):
        return [Node("ReduceL1" if order == 1 else "ReduceL2", [e.name(x), axes], [e.out(n)], attrs)]
    if order in (float("inf"), float("-inf")):
        a = e.graph.unique_name(f"{n.name}_abs")
        op = "ReduceMax" if order > 0 else "ReduceMin"
        return [Node("Abs", [e.name(x)], [a]), Node(op, [a, axes], [e.out(n)], attrs)]
    # any other p: (sum |x|^p)^(1/p), as torch computes it
    t = {h: e.graph.unique_name(f"{n.name}_{h}") for h in ("abs", "pow", "sum")}
    return [
        Node("Abs", [e.name(x)], [t["abs"]]),
        Node("Pow", [t["abs"], e.scalar("p", float(order))], [t["pow"]]),
        Node("ReduceSum", [t["pow"], axes], [t["sum"]], attrs),
        Node("Pow", [t["sum"], e.scalar("inv_p", 1.0 / float(order))], [e.out(n)]),
    ]


def _copy(n, e):
    dst, src = n.args[:2]
    if str(_val(dst).dtype) != str(_val(src).dtype) or _kw(n, 2, "non_blocking", False):
        raise Unsupported("a copy between dtypes")
    return [Node("Expand", [e.name(src), e.const("shape", np.array(_shape(n), np.int64))], [e.out(n)])]


_copy.in_dtypes = _copy.out_dtypes = (F32, BOOL, I64)


def _index(n, e):
    """``x[..., idx]`` with one int64 index tensor and the dims before it whole: Gather on that dim;
    ``x[i0, i1, ...]`` with int64 index tensors on the leading dims (broadcast together, the result's
    leading dims): GatherND on their stack (a mask's ``padding_mask[batch_idx, kv_idx]``)."""
    x, indices = n.args[:2]
    used = [i for i, t in enumerate(indices) if t is not None]
    if not used or any(str(_val(indices[i]).dtype) != I64 for i in used) or _rank(x) == 0:
        raise Unsupported("indexing by a bool mask")
    if any(d == 0 for d in _shape(x)) or any(d == 0 for d in _shape(n)):
        raise Unsupported("an empty dim")
    if len(used) == 1:
        axis = used[0]
        return [Node("Gather", [e.name(x), e.name(indices[axis])], [e.out(n)], {"axis": axis})]
    if used != list(range(len(used))):
        raise Unsupported("index tensors on dims that are not the leading ones")
    shapes = [_shape(indices[i]) for i in used]
    rank = max(len(sh) for sh in shapes)
    bcast = tuple(
        max([sh[k - rank + len(sh)] for sh in shapes if k - rank + len(sh) >= 0], default=1) for k in range(rank)
    )
    nodes, parts = [], []
    for i in used:
        full = e.graph.unique_name(f"{n.name}_i{i}")
        nodes.append(Node("Expand", [e.name(indices[i]), e.const("shape", np.array(bcast, np.int64))], [full]))
        part = e.graph.unique_name(f"{n.name}_i{i}_1")
        nodes.append(Node("Reshape", [full, e.const("shape", np.array(bcast + (1,), np.int64))], [part]))
        parts.append(part)
    stacked = e.graph.unique_name(f"{n.name}_nd")
    nodes.append(Node("Concat", parts, [stacked], {"axis": rank}))
    return nodes + [Node("GatherND", [e.name(x), stacked], [e.out(n)], {"batch_dims": 0})]


_index.in_dtypes = _index.out_dtypes = (F32, I64, BOOL)


def _numel(shape) -> int:
    return int(np.prod(shape)) if len(shape) else 1


def _log1p(n, e):
    """Goldberg's log1p: ``x * log(u) / (u - 1)`` with ``u = 1 + x`` is accurate to a few ulps where
    ``log(1 + x)`` loses every digit of a small x; ``u - 1 == 0`` gives x itself, ``u == inf`` inf."""
    x = e.name(n.args[0])
    t = {h: e.graph.unique_name(f"{n.name}_{h}") for h in "u d z inf ln q r s".split()}
    return [
        Node("Add", [x, e.scalar("one", 1.0)], [t["u"]]),
        Node("Sub", [t["u"], e.scalar("one", 1.0)], [t["d"]]),
        Node("Equal", [t["d"], e.scalar("zero", 0.0)], [t["z"]]),
        Node("Equal", [t["u"], e.scalar("inf", float("inf"))], [t["inf"]]),
        Node("Log", [t["u"]], [t["ln"]]),
        Node("Div", [x, t["d"]], [t["q"]]),
        Node("Mul", [t["ln"], t["q"]], [t["r"]]),
        Node("Where", [t["inf"], t["u"], t["r"]], [t["s"]]),
        Node("Where", [t["z"], x, t["s"]], [e.out(n)]),
    ]


def _expm1(n, e):
    """Kahan's expm1: ``(u - 1) * (x / log(u))`` with ``u = exp(x)``; ``u == 1`` gives x, ``u - 1 == -1``
    gives -1, ``u == inf`` inf."""
    x = e.name(n.args[0])
    t = {h: e.graph.unique_name(f"{n.name}_{h}") for h in "u d one m1 inf ln p r s w".split()}
    return [
        Node("Exp", [x], [t["u"]]),
        Node("Sub", [t["u"], e.scalar("one", 1.0)], [t["d"]]),
        Node("Equal", [t["u"], e.scalar("one", 1.0)], [t["one"]]),
        Node("Equal", [t["d"], e.scalar("minus_one", -1.0)], [t["m1"]]),
        Node("Equal", [t["u"], e.scalar("inf", float("inf"))], [t["inf"]]),
        Node("Log", [t["u"]], [t["ln"]]),
        Node("Div", [x, t["ln"]], [t["p"]]),  # near 1: (u - 1) * x would overflow where u is near max
        Node("Mul", [t["d"], t["p"]], [t["r"]]),
        Node("Where", [t["inf"], t["u"], t["r"]], [t["s"]]),
        Node("Where", [t["m1"], t["d"], t["s"]], [t["w"]]),
        Node("Where", [t["one"], x, t["w"]], [e.out(n)]),
    ]


def _truthy(e, n, arg, hint: str) -> tuple:
    """``arg != 0`` as bool (NaN is true, as torch reads it): ``(nodes, name)``."""
    if str(_val(arg).dtype) == BOOL:
        return [], e.name(arg)
    eq, ne = e.graph.unique_name(f"{n.name}_{hint}_eq"), e.graph.unique_name(f"{n.name}_{hint}")
    zero = e.scalar("zero", 0, str(_val(arg).dtype))
    return [Node("Equal", [e.name(arg), zero], [eq]), Node("Not", [eq], [ne])], ne


def _logical_any(op):
    """logical_and / or / xor / not on bool, float32 or int64 tensors (each read as ``!= 0``)."""

    def adapt(n, e):
        nodes, names = [], []
        for i, a in enumerate(n.args):
            if not hasattr(a, "op"):
                raise Unsupported("a Python operand")
            more, name = _truthy(e, n, a, f"t{i}")
            nodes += more
            names.append(name)
        return nodes + [Node(op, names, [e.out(n)])]

    adapt.in_dtypes = (F32, I64, BOOL)
    adapt.out_dtypes = (BOOL,)
    return adapt


def _arg_reduce(op):
    """argmax / argmin: the first extreme's index (NaN counts as the extreme, as torch's); no dim
    reads the flattened input."""

    def adapt(n, e):
        x = n.args[0]
        dim, keepdim = _kw(n, 1, "dim", None), _kw(n, 2, "keepdim", False)
        if _numel(_shape(x)) == 0:
            raise Unsupported("an empty input")
        if dim is None or _rank(x) == 0:
            flat, idx = e.graph.unique_name(f"{n.name}_flat"), e.graph.unique_name(f"{n.name}_idx")
            return [
                Node("Reshape", [e.name(x), e.const("shape", np.array([-1], np.int64))], [flat]),
                Node(op, [flat], [idx], {"axis": 0, "keepdims": 0, "select_last_index": 0}),
                Node("Reshape", [idx, e.const("shape", np.array(_shape(n), np.int64))], [e.out(n)], {"allowzero": 1}),
            ]
        attrs = {"axis": int(dim) % _rank(x), "keepdims": int(bool(keepdim)), "select_last_index": 0}
        return [Node(op, [e.name(x)], [e.out(n)], attrs)]

    adapt.in_dtypes = (F32, I64)
    adapt.out_dtypes = (I64,)
    return adapt


def _diagonal(n, e):
    """diagonal(x, offset, dim1, dim2): the two dims moved last and flattened, then Gather of the
    diagonal's flat positions (pure data movement)."""
    x = n.args[0]
    offset, d1, d2 = int(_kw(n, 1, "offset", 0)), _kw(n, 2, "dim1", 0), _kw(n, 3, "dim2", 1)
    rank = _rank(x)
    if rank < 2 or any(d == 0 for d in _shape(n)):
        raise Unsupported("an input of rank < 2 or an empty diagonal")
    d1, d2 = int(d1) % rank, int(d2) % rank
    shape = _shape(x)
    rest = [d for d in range(rank) if d not in (d1, d2)]
    rows, cols = shape[d1], shape[d2]
    count = _shape(n)[-1]
    i = np.arange(count, dtype=np.int64)
    flat_idx = (i - min(offset, 0)) * cols + (i + max(offset, 0))
    t = {h: e.graph.unique_name(f"{n.name}_{h}") for h in ("t", "f")}
    lead = [shape[d] for d in rest]
    return [
        Node("Transpose", [e.name(x)], [t["t"]], {"perm": rest + [d1, d2]}),
        Node("Reshape", [t["t"], e.const("shape", np.array(lead + [rows * cols], np.int64))], [t["f"]]),
        Node("Gather", [t["f"], e.const("diag", flat_idx)], [e.out(n)], {"axis": len(lead)}),
    ]


_diagonal.in_dtypes = _diagonal.out_dtypes = (F32, I64, BOOL)


def _empty(n, e):
    """empty / empty_like / new_empty: torch leaves the values unset, zeros are one such tensor."""
    v = _val(n)
    e.names[n] = e.const(n.name, np.zeros(tuple(int(d) for d in v.shape), _NP_DTYPES[str(v.dtype)]))
    return []


_empty.in_dtypes = _empty.out_dtypes = (F32, I64, BOOL)


def _same_dtype_arg(n, key: str, pos: int) -> None:
    """A ``dtype=`` argument equal to the result's dtype changes nothing; any other is refused."""
    dt = n.kwargs.get(key, n.args[pos] if len(n.args) > pos else None)
    if dt is not None and str(dt) != str(_val(n).dtype):
        raise Unsupported(f"a dtype argument {dt}")


def _any(n, e):
    """any (.default / .dim / .dims): Cast(x != 0) reduced by ReduceMax, read back as bool; over an
    empty dim, false."""
    x = n.args[0]
    dims = _kw(n, 1, "dim", None)
    keepdim = _kw(n, 2, "keepdim", False)
    rank = _rank(x)
    if isinstance(dims, int):
        dims = [dims]
    dims = list(range(rank)) if dims is None else [int(d) % rank for d in dims] if rank else []
    if _numel(_shape(x)) == 0:
        e.names[n] = e.const(n.name, np.zeros(_shape(n), np.bool_))
        return []
    more, truth = _truthy(e, n, x, "nz")
    if not dims:  # nothing reduced (a 0-d input, or dim=[] on .dims, as torch reads it): x != 0 itself
        return more + [Node("Identity", [truth], [e.out(n)])]
    t = {h: e.graph.unique_name(f"{n.name}_{h}") for h in ("f", "m")}
    axes = e.const("axes", np.array(dims, np.int64))
    return more + [
        Node("Cast", [truth], [t["f"]], {"to": 1}),
        Node("ReduceMax", [t["f"], axes], [t["m"]], {"keepdims": int(bool(keepdim))}),
        Node("Cast", [t["m"]], [e.out(n)], {"to": 9}),
    ]


_any.in_dtypes = (F32, I64, BOOL)
_any.out_dtypes = (BOOL,)


def _clamp_max_tensor(n, e):
    return [Node("Min", [e.name(n.args[0]), e.operand(n.args[1], "c")], [e.out(n)])]


def _reduce_with_index(op, arg_op):
    """max.dim / min.dim: the values by ReduceMax / ReduceMin, the indices by ArgMax / ArgMin (the
    first extreme, NaN counting as one: torch documents the first)."""

    def adapt(n, e):
        x, dim = n.args[:2]
        keepdim = int(bool(_kw(n, 2, "keepdim", False)))
        if _numel(_shape(x)) == 0:
            raise Unsupported("an empty input")
        if _rank(x) == 0:  # one value: itself, at index 0
            y, i = e.outs(n, 2)
            e.names[n] = (y, e.const("index", np.zeros((), np.int64)))
            return [Node("Identity", [e.name(x)], [y])]
        axis = int(dim) % _rank(x)
        y, i = e.outs(n, 2)
        axes = e.const("axes", np.array([axis], np.int64))
        return [
            Node(op, [e.name(x), axes], [y], {"keepdims": keepdim}),
            Node(arg_op, [e.name(x)], [i], {"axis": axis, "keepdims": keepdim, "select_last_index": 0}),
        ]

    adapt.out_dtypes = (F32, I64)
    return adapt


def _sort(stable_overload: bool):
    """sort / sort.stable by TopK over the whole dim (NaN last ascending, first descending, as torch);
    TopK keeps equal values in index order, which is torch's stable order: the indices are mapped
    only when the call asks for a stable sort."""

    def adapt(n, e):
        x = n.args[0]
        if stable_overload:
            stable, dim, descending = n.kwargs.get("stable"), n.kwargs.get("dim", -1), n.kwargs.get("descending", False)
            if not stable:
                raise Unsupported("an unstable sort (its indices for equal values are unspecified)")
        else:
            dim, descending = _kw(n, 1, "dim", -1), _kw(n, 2, "descending", False)
        if _rank(x) == 0 or _numel(_shape(x)) == 0:
            raise Unsupported("a 0-d or empty input")
        axis = int(dim) % _rank(x)
        y, i = e.outs(n, 2)
        k = e.const("k", np.array([_shape(x)[axis]], np.int64))
        attrs = {"axis": axis, "largest": int(bool(descending)), "sorted": 1}
        if not stable_overload:
            e.names[n] = (y, None)
            i = e.graph.unique_name(f"{n.name}_unused")
        return [Node("TopK", [e.name(x), k], [y, i], attrs)]

    adapt.out_dtypes = (F32, I64)
    adapt.first_only = not stable_overload
    return adapt


def _div_mode(n, e):
    """div with rounding_mode: 'trunc' is trunc(a / b); 'floor' follows torch's div_floor step by
    step (fmod, the sign fix, floor, the round-up above .5, a signed zero, b == 0 as a / b)."""
    a, b = n.args[:2]
    mode = n.kwargs.get("rounding_mode")
    if not (hasattr(a, "op") and hasattr(b, "op")):
        raise Unsupported("a Python operand")
    t = {
        h: e.graph.unique_name(f"{n.name}_{h}")
        for h in "q s ab fl mod am div mz bn mn sx nz adj dm1 div2 fl2 f diff up fl1 fl3 qn qp z0 z dz res bz".split()
    }
    q = t["q"]
    nodes = [Node("Div", [e.name(a), e.name(b)], [q])]
    if mode is None:
        return [Node("Div", [e.name(a), e.name(b)], [e.out(n)])]
    if mode == "trunc":
        return nodes + [
            Node("Sign", [q], [t["s"]]),
            Node("Abs", [q], [t["ab"]]),
            Node("Floor", [t["ab"]], [t["fl"]]),
            Node("Mul", [t["s"], t["fl"]], [e.out(n)]),
        ]
    if mode != "floor":
        raise Unsupported(f"rounding_mode {mode!r}")
    zero, one, half = e.scalar("zero", 0.0), e.scalar("one", 1.0), e.scalar("half", 0.5)
    return nodes + [
        Node("Mod", [e.name(a), e.name(b)], [t["mod"]], {"fmod": 1}),
        Node("Sub", [e.name(a), t["mod"]], [t["am"]]),
        Node("Div", [t["am"], e.name(b)], [t["div"]]),
        Node("Equal", [t["mod"], zero], [t["mz"]]),
        Node("Not", [t["mz"]], [t["nz"]]),
        Node("Less", [e.name(b), zero], [t["bn"]]),
        Node("Less", [t["mod"], zero], [t["mn"]]),
        Node("Xor", [t["bn"], t["mn"]], [t["sx"]]),
        Node("And", [t["nz"], t["sx"]], [t["adj"]]),
        Node("Sub", [t["div"], one], [t["dm1"]]),
        Node("Where", [t["adj"], t["dm1"], t["div"]], [t["div2"]]),
        Node("Floor", [t["div2"]], [t["fl1"]]),
        Node("Sub", [t["div2"], t["fl1"]], [t["diff"]]),
        Node("Greater", [t["diff"], half], [t["up"]]),
        Node("Add", [t["fl1"], one], [t["fl2"]]),
        Node("Where", [t["up"], t["fl2"], t["fl1"]], [t["fl3"]]),
        Node("Less", [q, zero], [t["qn"]]),
        Node("Greater", [q, zero], [t["qp"]]),
        Node("Where", [t["qp"], zero, q], [t["z0"]]),
        Node("Where", [t["qn"], e.scalar("minus_zero", -0.0), t["z0"]], [t["z"]]),
        Node("Equal", [t["div2"], zero], [t["dz"]]),
        Node("Where", [t["dz"], t["z"], t["fl3"]], [t["res"]]),
        Node("Equal", [e.name(b), zero], [t["bz"]]),
        Node("Where", [t["bz"], q, t["res"]], [e.out(n)]),
    ]


# bfloat16 trunc division rounds the quotient to bfloat16 before truncating (2.999 / 1 gives 3)
_div_mode.bf16 = lambda n: n.kwargs.get("rounding_mode") != "trunc"


def _round_decimals(n, e):
    """round(x, decimals): nearbyint(x * 10^d) / 10^d, or nearbyint(x / 10^-d) * 10^-d for d < 0, with
    the power rounded to float32 first, as torch computes it."""
    d = int(n.kwargs.get("decimals", 0))
    x = e.name(n.args[0])
    if d == 0:
        return [Node("Round", [x], [e.out(n)])]
    p = e.scalar("pow10", float(np.float32(10.0 ** abs(d))))
    if not np.isfinite(np.float32(10.0 ** abs(d))):
        raise Unsupported(f"decimals {d} (10^{abs(d)} overflows float32)")
    s, r = e.graph.unique_name(f"{n.name}_s"), e.graph.unique_name(f"{n.name}_r")
    first, last = ("Mul", "Div") if d > 0 else ("Div", "Mul")
    return [Node(first, [x, p], [s]), Node("Round", [s], [r]), Node(last, [r, p], [e.out(n)])]


def _narrow(n, e):
    x, dim, start, length = n.args[:4]
    rank = _rank(x)
    dim = int(dim) % rank
    start = int(start) + (_shape(x)[dim] if int(start) < 0 else 0)
    ins = [e.name(x)] + [
        e.const(h, np.array([v], np.int64)) for h, v in (("starts", start), ("ends", start + int(length)))
    ]
    ins.append(e.const("axes", np.array([dim], np.int64)))
    return [Node("Slice", ins, [e.out(n)])]


def _unbind(n, e):
    x = n.args[0]
    rank = _rank(x)
    dim = int(_kw(n, 1, "dim", 0)) % rank if rank else 0
    count = _shape(x)[dim] if rank else 0
    if count == 0 or _numel(_shape(x)) == 0:
        raise Unsupported("a 0-d or empty input")
    parts = [e.graph.unique_name(f"{n.name}_part{i}") for i in range(count)]
    names = e.outs(n, count)
    shape = e.const("shape", np.array([d for i, d in enumerate(_shape(x)) if i != dim], np.int64))
    nodes = [Node("Split", [e.name(x), e.const("split", np.ones(count, np.int64))], parts, {"axis": dim})]
    return nodes + [Node("Reshape", [p, shape], [o], {"allowzero": 1}) for p, o in zip(parts, names)]


_unbind.in_dtypes = _unbind.out_dtypes = _narrow.in_dtypes = _narrow.out_dtypes = (F32, I64, BOOL)


def _transpose(n, e):
    x, d0, d1 = n.args[:3]
    rank = _rank(x)
    perm = list(range(rank))
    if rank:
        d0, d1 = int(d0) % rank, int(d1) % rank
        perm[d0], perm[d1] = perm[d1], perm[d0]
    return [Node("Transpose", [e.name(x)], [e.out(n)], {"perm": perm})]


_transpose.in_dtypes = _transpose.out_dtypes = (F32, I64, BOOL)


def _fmax(op):
    """fmax / fmin: the other operand where one is NaN, Max / Min elsewhere."""

    def adapt(n, e):
        a, b = n.args[:2]
        t = {h: e.graph.unique_name(f"{n.name}_{h}") for h in ("na", "nb", "m", "r")}
        return [
            Node("IsNaN", [e.name(a)], [t["na"]]),
            Node("IsNaN", [e.name(b)], [t["nb"]]),
            Node(op, [e.name(a), e.name(b)], [t["m"]]),
            Node("Where", [t["nb"], e.name(a), t["m"]], [t["r"]]),
            Node("Where", [t["na"], e.name(b), t["r"]], [e.out(n)]),
        ]

    return adapt


#: lowerings that never read a symbolic dim's value (they may lower graphs of symbolic shapes)
for _f in (
    _addmm,
    _matmul,
    _reshape,
    _expand,
    _permute,
    _clone,
    _gelu,
    _cat,
    _clamp_max,
    _leaky_relu,
    _getitem,
    _where,
    _identity,
    _layer_norm,
    _split,
    _convolution,
    _convolution_backward,
    _max_pool2d_with_indices,
    _max_pool2d_backward,
    _batch_norm_backward,
    _batch_norm_backward_named,
    _batch_norm_training,
    _threshold_backward,
    _nll_loss_forward,
    _nll_loss_backward,
    _layer_norm_backward,
    _select,
    _constant,
):
    _f.symbolic = True


def _empty_output(adapter):
    """An adapter that lowers a node with an empty (zero-element) tensor result to an empty constant
    (it has no values to get wrong), and any other node through ``adapter``."""

    def adapt(n, e):
        v = _val(n)
        if str(getattr(v, "layout", "")) == "torch.strided" and str(v.dtype) in _NP_DTYPES:
            shape = tuple(v.shape)
            if all(isinstance(d, int) for d in shape) and 0 in shape:
                e.names[n] = e.const(n.name, np.zeros(shape, _NP_DTYPES[str(v.dtype)]))
                return []
        return adapter(n, e)

    for attr in ("in_dtypes", "out_dtypes", "first_only", "symbolic", "bf16"):
        if hasattr(adapter, attr):
            setattr(adapt, attr, getattr(adapter, attr))
    return adapt


#: lowerings that compute a tuple's output 0 alone (the others: saved statistics, int64 indices)
for _f in (_batch_norm,):
    _f.first_only = True


def _plain(*tensors) -> bool:
    """Whether every tensor is float32 or int64 (what the backward lowerings map), with elements."""
    ts = [t for t in tensors if t is not None]
    return all(str(t.dtype) in (F32, I64) and t.numel() > 0 for t in ts)


def kept_whole_in_inference() -> dict:
    """``{ATen overload: predicate(*args, **kwargs)}``: ops core ATen would decompose that stay whole
    where the predicate holds, for one opsnn op computes them (attention: no score matrix, no
    safe-softmax guard of five passes over it)."""
    import torch

    def sdpa(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
        tensors = (q, k, v) if attn_mask is None else (q, k, v, attn_mask)
        if not all(isinstance(d, int) for t in tensors for d in t.shape):
            return False  # symbolic sizes: the decomposition keeps them symbolic, the Attention lowering not
        dims = all(t.dim() == 4 and t.numel() > 0 for t in (q, k, v))
        return (
            dims
            and all(t.dtype == torch.float32 for t in (q, k, v))
            and not dropout_p
            and not (is_causal and q.shape[2] != k.shape[2])
            and (
                attn_mask is None
                or (
                    1 <= attn_mask.dim() <= 4
                    and attn_mask.dtype in (torch.float32, torch.bool)
                    and attn_mask.shape[-1] == k.shape[2]
                )
            )
        )

    return {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default: sdpa}


def kept_whole_in_training() -> dict:
    """``{ATen overload: predicate(*args, **kwargs)}``: ops core ATen would decompose that the training
    graphs keep whole where the predicate holds, for a lowering above maps them onto a backward record
    (elsewhere torch's decomposition applies, as in inference)."""
    import torch

    aten = torch.ops.aten

    def softmax_bw(grad, out, dim, input_dtype):
        return _plain(grad, out) and out.dim() > 0 and input_dtype == out.dtype

    def nll(x, target, *rest):
        return _plain(x, target) and x.dim() >= 2

    return {
        aten.native_layer_norm_backward.default: lambda grad, x, *rest: _plain(grad, x),
        aten.native_group_norm_backward.default: lambda grad, x, *rest: _plain(grad, x) and x.dim() >= 2,
        aten.threshold_backward.default: lambda grad, x, threshold: _plain(grad, x),
        aten.native_batch_norm_backward.default: lambda grad, x, w, rm, rv, sm, si, train, eps, mask: (
            _plain(grad, x) and x.dim() >= 2 and (train or (rm is not None and rv is not None))
        ),
        aten._softmax_backward_data.default: softmax_bw,
        aten._log_softmax_backward_data.default: softmax_bw,
        aten.embedding_dense_backward.default: lambda grad, ids, num, pad, by_freq: _plain(grad) and not by_freq,
        aten.nll_loss_forward.default: nll,
        aten.nll_loss2d_forward.default: nll,
        aten.nll_loss_backward.default: lambda grad, x, target, *rest: nll(x, target),
        aten.nll_loss2d_backward.default: lambda grad, x, target, *rest: nll(x, target),
    }


_TABLE: dict = {}


def build_table():
    """``{ATen overload: adapter}``; built on first use (it needs torch)."""
    if not _TABLE:
        _TABLE.update({k: v if k is operator.getitem else _empty_output(v) for k, v in _table().items()})
    return _TABLE


def _table():
    import torch

    aten = torch.ops.aten
    return {
        aten.convolution.default: _convolution,  # -> Conv
        aten._native_batch_norm_legit_no_training.default: _batch_norm_eval,  # -> BatchNormalization
        aten.native_batch_norm.default: _batch_norm,  # -> BatchNormalization (eval)
        aten.max_pool2d_with_indices.default: _max_pool2d_with_indices,  # -> MaxPool (values only)
        aten.native_layer_norm.default: _layer_norm,  # -> LayerNormalization
        aten.addmm.default: _addmm,  # -> MatMul + Add
        aten.mm.default: _matmul,  # -> MatMul
        aten.bmm.default: _matmul,  # -> MatMul
        aten.avg_pool2d.default: _avg_pool2d,  # -> AveragePool
        aten._adaptive_avg_pool2d.default: _adaptive_avg_pool2d,  # -> GlobalAveragePool (1x1)
        aten.cat.default: _cat,  # -> Concat
        aten.relu.default: _unary("Relu"),
        aten.add.Scalar: _binary("Add"),
        aten.sub.Scalar: _binary("Sub"),
        aten.mul.Scalar: _binary("Mul"),
        aten.div.Scalar: _binary("Div"),
        aten.var_mean.correction: _var_mean,  # -> reductions
        aten.var.correction: _var_mean,  # -> reductions
        aten.index.Tensor: _index,  # -> Gather (one int64 index tensor)
        aten.native_group_norm.default: _group_norm,  # -> reductions, Mul, Add
        aten.linalg_vector_norm.default: _vector_norm,  # -> ReduceL1 / ReduceL2 / Reduce{Max,Min}(Abs)
        aten.copy.default: _copy,  # -> Expand (src to dst's shape)
        aten.remainder.Tensor: _remainder,  # -> Mod(fmod=0)
        aten.remainder.Scalar: _remainder,  # -> Mod(fmod=0)
        aten.trunc.default: _trunc,  # -> Sign * Floor(Abs)
        aten.cumprod.default: _cumprod,  # -> CumProd
        aten.acos.default: _unary("Acos"),
        aten.asin.default: _unary("Asin"),
        aten.atan.default: _unary("Atan"),
        aten.acosh.default: _unary("Acosh"),
        aten.asinh.default: _unary("Asinh"),
        aten.atanh.default: _unary("Atanh"),
        aten.cos.default: _unary("Cos"),
        aten.sin.default: _unary("Sin"),
        aten.tan.default: _unary("Tan"),
        aten.cosh.default: _unary("Cosh"),
        aten.sinh.default: _unary("Sinh"),
        aten.floor.default: _unary("Floor"),
        aten.ceil.default: _unary("Ceil"),
        aten.round.default: _unary("Round"),  # both round half to even
        aten.sign.default: _unary("Sign"),
        aten.sgn.default: _unary("Sign"),
        aten.rsqrt.default: _rsqrt,  # -> Reciprocal(Sqrt)
        aten.prod.default: _reduce("ReduceProd"),
        aten.log2.default: _log_base(2.0),  # -> Log / ln 2
        aten.log10.default: _log_base(10.0),  # -> Log / ln 10
        aten.exp2.default: _exp2,  # -> Pow(2, x)
        aten.silu.default: _attr_unary("Swish", alpha=1.0),
        aten.mish.default: _unary("Mish"),
        aten.hardswish.default: _unary("HardSwish"),
        aten.hardsigmoid.default: _attr_unary("HardSigmoid", alpha=1.0 / 6.0, beta=0.5),
        aten.elu.default: _elu,  # -> Elu
        aten.softplus.default: _softplus,  # -> Softplus
        aten.maximum.default: _binary("Max"),
        aten.minimum.default: _binary("Min"),
        aten.clamp.Tensor: _clamp_tensor,  # -> Max, Min
        aten.pow.Tensor_Tensor: _pow,  # -> Pow
        aten.pow.Tensor_Scalar: _pow,  # -> Pow
        aten.pow.Scalar: _pow,  # -> Pow
        aten.fmod.Tensor: _fmod,  # -> Mod(fmod=1)
        aten.fmod.Scalar: _fmod,  # -> Mod(fmod=1)
        aten.isnan.default: _is("IsNaN"),
        aten.isinf.default: _is("IsInf"),
        aten.bitwise_not.default: _logical("Not"),
        aten.bitwise_and.Tensor: _logical("And"),  # bool alone
        aten.bitwise_or.Tensor: _logical("Or"),  # bool alone
        aten.bitwise_xor.Tensor: _logical("Xor"),  # bool alone
        aten._to_copy.default: _to_copy,  # -> Identity (float32 to float32)
        aten.detach.default: _identity,  # -> Identity
        aten.detach_copy.default: _identity,  # -> Identity
        aten.alias_copy.default: _identity,  # -> Identity
        aten.full_like.default: _constant,  # -> an initializer
        aten.arange.start_step: _arange,  # -> an initializer
        aten.constant_pad_nd.default: _constant_pad,  # -> Pad
        aten.slice.Tensor: _slice,  # -> Slice
        aten.slice_copy.Tensor: _slice,  # -> Slice
        aten.select.int: _select,  # -> Slice + Reshape
        aten.select_copy.int: _select,  # -> Slice + Reshape
        aten.flip.default: _flip,  # -> Slice (step -1)
        aten.repeat.default: _repeat,  # -> Tile
        aten.tril.default: _trilu(0),  # -> Trilu
        aten.triu.default: _trilu(1),  # -> Trilu
        aten.cumsum.default: _cumsum,  # -> CumSum
        aten.index_select.default: _index_select,  # -> Gather
        aten.embedding.default: _embedding,  # -> Gather
        aten.gather.default: _gather,  # -> GatherElements
        aten._scaled_dot_product_flash_attention_for_cpu.default: _sdpa_flash,  # -> Attention
        aten.max.dim: _reduce_with_index("ReduceMax", "ArgMax"),
        aten.min.dim: _reduce_with_index("ReduceMin", "ArgMin"),
        aten.max.default: _reduce("ReduceMax"),
        aten.min.default: _reduce("ReduceMin"),
        aten.sort.default: _sort(False),  # -> TopK (values only)
        aten.sort.stable: _sort(True),  # -> TopK (values and indices when stable=True)
        aten.div.Tensor_mode: _div_mode,  # -> Div, and trunc or torch's floor steps
        aten.round.decimals: _round_decimals,  # -> Mul / Round / Div by a float32 power of 10
        aten.narrow_copy.default: _narrow,  # -> Slice
        aten.transpose.int: _transpose,  # -> Transpose
        aten.transpose_copy.int: _transpose,  # -> Transpose
        aten.unbind_copy.int: _unbind,  # -> Split + Reshape
        aten.unbind.int: _unbind,  # -> Split + Reshape
        aten.addmv.default: _addmm,  # -> MatMul + Add
        aten.fmax.default: _fmax("Max"),  # -> Where(IsNaN) around Max
        aten.fmin.default: _fmax("Min"),  # -> Where(IsNaN) around Min
        aten.amin.default: _reduce("ReduceMin"),
        aten.mean.default: _reduce("ReduceMean"),
        aten.prod.dim_int: _reduce("ReduceProd"),
        aten.squeeze.dim: _reshape,  # -> Reshape
        aten.squeeze.default: _reshape,  # -> Reshape
        aten.squeeze_copy.dim: _reshape,  # -> Reshape
        aten.squeeze_copy.default: _reshape,  # -> Reshape
        aten.alias.default: _identity,  # -> Identity
        aten.lift_fresh_copy.default: _identity,  # -> Identity
        aten.le.Scalar: _compare("LessOrEqual"),
        aten.le.Tensor: _compare("LessOrEqual"),
        aten.lt.Scalar: _compare("Less"),
        aten.lt.Tensor: _compare("Less"),
        aten.ge.Scalar: _compare("GreaterOrEqual"),
        aten.ge.Tensor: _compare("GreaterOrEqual"),
        aten.gt.Scalar: _compare("Greater"),
        aten.gt.Tensor: _compare("Greater"),
        aten.eq.Scalar: _compare("Equal"),
        aten.eq.Tensor: _compare("Equal"),
        aten.ne.Scalar: _compare("Equal", negate=True),  # -> Not(Equal)
        aten.ne.Tensor: _compare("Equal", negate=True),  # -> Not(Equal)
        aten.logical_not.default: _logical_any("Not"),  # -> Not (Not(Equal 0) on numbers)
        aten.logical_and.default: _logical_any("And"),
        aten.logical_or.default: _logical_any("Or"),
        aten.logical_xor.default: _logical_any("Xor"),
        aten.log1p.default: _log1p,  # -> Goldberg's log(1+x) * x / ((1+x) - 1)
        aten.expm1.default: _expm1,  # -> Kahan's (e^x - 1) * x / log(e^x)
        aten.argmax.default: _arg_reduce("ArgMax"),
        aten.argmin.default: _arg_reduce("ArgMin"),
        aten.diagonal.default: _diagonal,  # -> Transpose, Reshape, Gather
        aten.diagonal_copy.default: _diagonal,  # -> Transpose, Reshape, Gather
        aten.empty.memory_format: _empty,  # -> zeros (values unset in torch)
        aten.empty_permuted.default: _empty,  # -> zeros (values unset in torch)
        aten.clamp_min.default: _clip("min", "max", None, None),  # -> Clip (min only)
        aten.clamp_max.default: _clamp_max,  # -> Clip (max only)
        aten.clamp_min.Tensor: _clamp_tensor,  # -> Max
        aten.clamp_max.Tensor: _clamp_max_tensor,  # -> Min
        aten.any.default: _any,  # -> ReduceMax of Cast(x != 0)
        aten.any.dim: _any,  # -> ReduceMax of Cast(x != 0)
        aten.any.dims: _any,  # -> ReduceMax of Cast(x != 0)
        aten.where.self: _where,  # -> Where
        aten.scalar_tensor.default: _constant,  # -> an initializer
        aten.full.default: _constant,  # -> an initializer
        aten.threshold_backward.default: _threshold_backward,  # -> LessOrEqual + Where
        aten.native_batch_norm_backward.default: _batch_norm_backward,  # -> opsnn::BatchNormalizationGrad
        norm_backward_op("native_layer_norm_backward"): _layer_norm_backward,  # -> opsnn::LayerNormalizationGrad
        norm_backward_op("native_group_norm_backward"): _group_norm_backward,  # -> opsnn::GroupNormalizationGrad
        batch_norm_backward_op(): _batch_norm_backward_named,  # -> opsnn::BatchNormalizationGrad
        aten.max_pool2d_with_indices_backward.default: _max_pool2d_backward,  # -> opsnn::MaxPoolGrad
        aten.avg_pool2d_backward.default: _avg_pool2d_backward,  # -> opsnn::AveragePoolGrad
        aten._softmax_backward_data.default: _softmax_backward("SoftmaxGrad"),  # -> opsnn::SoftmaxGrad
        aten._log_softmax_backward_data.default: _softmax_backward("LogSoftmaxGrad"),  # -> opsnn::LogSoftmaxGrad
        aten.embedding_dense_backward.default: _embedding_backward,  # -> opsnn::EmbeddingGrad
        aten.nll_loss_forward.default: _nll_loss_forward,  # -> NegativeLogLikelihoodLoss, ReduceSum
        aten.nll_loss2d_forward.default: _nll_loss_forward,  # -> NegativeLogLikelihoodLoss, ReduceSum
        aten.nll_loss_backward.default: _nll_loss_backward,  # -> Equal, Where (scatter at the target)
        aten.nll_loss2d_backward.default: _nll_loss_backward,  # -> Equal, Where (scatter at the target)
        aten.convolution_backward.default: _convolution_backward,  # -> ConvBackwardData/Weight, ReduceSum
        aten._native_batch_norm_legit_functional.default: _batch_norm_training,  # -> reductions, Mul, Add
        aten._native_batch_norm_legit.no_stats: _batch_norm_no_stats,  # -> reductions, Mul, Add
        aten.hardtanh.default: _clip("min_val", "max_val", -1.0, 1.0),  # -> Clip
        aten.clamp.default: _clip("min", "max", None, None),  # -> Clip
        aten.leaky_relu.default: _leaky_relu,  # -> LeakyRelu
        aten.sigmoid.default: _unary("Sigmoid"),
        aten.tanh.default: _unary("Tanh"),
        aten.exp.default: _unary("Exp"),
        aten.neg.default: _unary("Neg"),
        aten.abs.default: _unary("Abs"),
        aten.log.default: _unary("Log"),
        aten.erf.default: _unary("Erf"),
        aten.reciprocal.default: _unary("Reciprocal"),
        aten.sqrt.default: _unary("Sqrt"),
        aten.gelu.default: _gelu,  # -> Gelu
        aten._softmax.default: _softmax("Softmax"),
        aten._log_softmax.default: _softmax("LogSoftmax"),
        aten.add.Tensor: _binary("Add"),
        aten.mul.Tensor: _binary("Mul"),
        aten.div.Tensor: _binary("Div"),
        aten.sub.Tensor: _sub,
        aten.view.default: _reshape,  # -> Reshape
        aten._unsafe_view.default: _reshape,  # -> Reshape
        aten.reshape.default: _reshape,  # -> Reshape
        aten.view_copy.default: _reshape,  # -> Reshape
        aten.unsqueeze.default: _reshape,  # -> Reshape
        aten.unsqueeze_copy.default: _reshape,  # -> Reshape
        aten.squeeze.dims: _reshape,  # -> Reshape
        aten.squeeze_copy.dims: _reshape,  # -> Reshape
        aten.expand.default: _expand,  # -> Expand
        aten.expand_copy.default: _expand,  # -> Expand
        aten.permute_copy.default: _permute,  # -> Transpose
        aten.split.Tensor: _split,  # -> Split
        aten.split_copy.Tensor: _split,  # -> Split
        aten.split_with_sizes.default: _split,  # -> Split
        aten.split_with_sizes_copy.default: _split,  # -> Split
        aten.permute.default: _permute,  # -> Transpose
        aten.clone.default: _clone,  # -> Identity
        aten.sum.dim_IntList: _reduce("ReduceSum"),
        aten.sum.default: _reduce("ReduceSum"),
        aten.mean.dim: _reduce("ReduceMean"),
        aten.amax.default: _reduce("ReduceMax"),
        operator.getitem: _getitem,
    }
