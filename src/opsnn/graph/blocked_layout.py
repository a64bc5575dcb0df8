"""Layout pass ``blocked_layout``: chains of 2-D convolutions run on channel-blocked activations
(``nhwc`` on Intel AVX-512 CPUs, ``nChw16c`` on other AVX-512 CPUs and for bfloat16 chains,
``nChw8c`` with AVX2: :func:`opsnn.kernels.cpu.libraries.conv_chain_layout` decides, and the layout
is the ``block`` attribute of every op the pass writes, 0 for nhwc) with oneDNN's JIT convolutions
(:mod:`opsnn.kernels.cpu.onednn`).

Candidates: ``Conv`` / ``FusedConv`` nodes (float32, or bfloat16 where the mixed-precision
pass made the convolutions bf16; static 4-D shapes, group 1, a constant weight of the input's
dtype, output channels a multiple of the block (16 on nhwc), a convolution oneDNN has JIT code for) and
``MaxPool`` nodes fed by a candidate (2-D, no dilation, no Indices output; in a bf16 graph the
pool's Casts to float32 and back are dropped, see :func:`_through_casts`), and float32
``GlobalAveragePool`` nodes fed by a candidate. Candidates joined
by an edge (one's output is another's X or residual Z) form a chain; a chain with at least
``MIN_CONVS`` convolutions is rewritten:

* each conv becomes ``opsnn::BlockedConv`` writing a blocked output; each pool
  ``opsnn::BlockedMaxPool``; each global average pool ``opsnn::BlockedGlobalAveragePool``, which
  reads the blocked value and writes its plain (N, C, 1, 1) output under the original name (a
  classifier's head then needs no ``FromBlocked`` of the last feature map);
* an input that comes from outside the chain is blocked by one ``opsnn::ToBlocked`` (shared by
  all its readers), except a conv's X whose channel count is not a multiple of the block (16 on nhwc;
  a network's first conv on an RGB image): oneDNN reads that one plain (on nhwc reordered by the
  convolution into the layout its kernel chose);
* a chain value read outside the chain (or a graph output) gets one ``opsnn::FromBlocked``
  that writes the original value name, so the rest of the graph is unchanged.

Blocked values get new names (``<value>_nhwc``, ``<value>_nChw16c``, ``<value>_nChw8c``): tools that compare intermediate values by
name (precision compare, dumps) never see blocked data under a plain tensor's name.
A single conv between plain neighbours is left alone: its two reorders would cost more than the
faster convolution gains.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..kernels.cpu import libraries
from ..kernels.cpu.blocked import NHWC, layout_name
from .ir import Graph, Node, Value

MIN_CONVS = 2
#: the channel multiple of an nhwc chain's values (see _vector)
NHWC_VECTOR = 16
#: spatial size of the probe a convolution with symbolic spatial dims is asked about
PROBE_SIZE = 32


def machine_key() -> str:
    """What this pass's rewrite depends on besides the graph: the layout of its chains here
    (nhwc, nChw16c, nChw8c, or none) and whether bf16 chains go to oneDNN. Part of the persisted compile cache's
    key, so a graph blocked for one CPU (or oneDNN setting) is not reloaded on another."""
    from ..kernels.cpu import onednn

    c = libraries.conv_chain_layout()
    b = None if isinstance(c, str) else c.block
    return "plain" if b is None else f"{layout_name(b)}{'+bf16' if onednn.bf16_unavailable() is None else ''}"


def _blockable_dtype(dt) -> bool:
    return dt is not None and np.dtype(dt) in (np.float32, _dt.bfloat16)


def _static4(v: Value) -> bool:
    """4-D with a static channel count (batch and spatial dims may be symbolic: the primitives
    are built at prepare, for the shapes of that call)."""
    return v.shape is not None and len(v.shape) == 4 and isinstance(v.shape[1], (int, np.integer)) and v.shape[1] > 0


def _value(graph: Graph, name: str) -> Value:
    """The inferred type of ``name`` (a graph output's declaration may carry none)."""
    v = graph.value(name)
    return graph.value_info.get(name, v) if v.shape is None or v.dtype is None else v


def _conv_ok(graph: Graph, n: Node, block: int) -> str | None:
    from ..kernels.cpu.onednn import bf16_unavailable

    x, y = _value(graph, n.inputs[0]), _value(graph, n.outputs[0])
    if not _blockable_dtype(x.dtype) or not _static4(x) or not _static4(y):
        return "float32 or bfloat16 4-D input and output with a static channel count only"
    if np.dtype(x.dtype) == _dt.bfloat16 and bf16_unavailable() is not None:
        return f"bfloat16: {bf16_unavailable()}"
    if len(n.inputs) < 2 or n.inputs[1] not in graph.initializers:
        return "the weight is not a constant"
    w = graph.initializers[n.inputs[1]]
    if w.ndim != 4 or w.dtype != x.dtype:
        return f"2-D weight of the input's dtype ({np.dtype(x.dtype)}) only"
    if int(n.attrs.get("group", 1) or 1) != 1:
        return "group 1 only"
    auto = n.attrs.get("auto_pad") or "NOTSET"
    auto = auto.decode() if isinstance(auto, bytes) else auto
    pads = n.attrs.get("pads")  # a list, tuple or numpy array (builders pass each)
    padded = auto not in ("NOTSET", "VALID") or any(int(p) for p in (() if pads is None else pads))
    if padded and not np.isfinite(w).all():
        # oneDNN skips the taps that read padding; the definition multiplies its zeros (0 * Inf = NaN)
        return "an Inf or NaN in the constant weight of a padded convolution"
    if int(y.shape[1]) % _vector(block):
        return f"{y.shape[1]} output channels (not a multiple of {_vector(block)})"
    if len(n.inputs) > 2 and n.inputs[2] and _value(graph, n.inputs[2]).dtype not in (None, x.dtype):
        return "a bias of the input's dtype only"
    residual = len(n.inputs) > 3 and bool(n.inputs[3])
    if residual:
        z = _value(graph, n.inputs[3])
        if not _static4(z) or z.shape[1] != y.shape[1] or z.dtype not in (None, x.dtype):
            return "the residual's shape or dtype is not the output's"
    return _jit_rejection(n, x, w, residual, block)


def _vector(block: int) -> int:
    """The channel multiple a chain's values have: the block, 16 on nhwc (the same convolutions join a
    chain as on nChw16c; layers of a few channels stay with opsnn's kernels)."""
    return NHWC_VECTOR if block == NHWC else block


def _src_blocked(c: int, block: int) -> bool:
    """Whether a chain's conv reads X blocked: when C is a multiple of :func:`_vector`, else oneDNN reads
    the plain NCHW (e.g. an RGB image; on nhwc reordered into the layout its kernel chose, faster than an
    nhwc X with a few channels)."""
    return c % _vector(block) == 0


def _jit_rejection(n: Node, x: Value, w: np.ndarray, residual: bool, block: int) -> str | None:
    """Why oneDNN would run this convolution with its reference code, or None: asked for a probe
    shape (the graph's spatial dims when static, else PROBE_SIZE; the batch is 1)."""
    from ..errors import OpsnnError
    from ..kernels.cpu import fused as KF
    from ..kernels.cpu import onednn
    from ..ops.defs.conv import conv_geometry

    conv_attrs = {
        k: n.attrs[k]
        for k in ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
        if n.attrs.get(k) is not None
    }
    sp = [
        int(d) if isinstance(d, (int, np.integer)) else max(PROBE_SIZE, int(w.shape[2 + i]) * 4)
        for i, d in enumerate(x.shape[2:])
    ]
    xs = (1, int(x.shape[1]), *sp)
    act = n.attrs.get("activation") or ""
    act = act.decode() if isinstance(act, bytes) else act
    try:
        g = conv_geometry(n.op_type, xs, w.shape, conv_attrs)
        impl = onednn.conv_impl(
            xs,
            w.shape,
            (1, w.shape[0]) + tuple(g.out),
            g.s,
            (g.pb[0], g.pb[1], g.pe[0], g.pe[1]),
            g.d,
            block=block,
            src_blocked=_src_blocked(xs[1], block),
            has_bias=len(n.inputs) > 2 and bool(n.inputs[2]),
            residual=residual,
            act=KF.ACTIVATIONS.get(act, 0),
            dtype=w.dtype,
        )
    except (OpsnnError, onednn.OneDnnError) as e:
        return f"oneDNN cannot run it: {e}"
    if impl.startswith("ref"):
        return f"oneDNN has only its reference implementation ({impl}) for it"
    return None


def _through_casts(graph: Graph, n: Node, prod: dict, users: dict) -> tuple[str, str, tuple]:
    """A MaxPool's (input, output, casts it replaces): in a bfloat16 graph the mixed-precision
    pass runs MaxPool (no policy of its own) in float32 between ``Cast(bf16 -> f32)`` and
    ``Cast(f32 -> bf16)``. Rounding to bf16 is monotonic, so the max of the rounded values is the
    rounded max: the pool runs on the bf16 values themselves and the casts go (the first only
    when the pool is its sole reader)."""
    plain = (n.inputs[0], n.outputs[0], ())
    c1, outs = prod.get(n.inputs[0]), users.get(n.outputs[0], [])
    if (
        c1 is None
        or c1.op_type != "Cast"
        or c1.domain
        or len(outs) != 1
        or outs[0].op_type != "Cast"
        or outs[0].domain
        or n.outputs[0] in graph.output_names
    ):
        return plain
    c2 = outs[0]
    v, w = _value(graph, c1.inputs[0]), _value(graph, c2.outputs[0])
    if not (
        v.dtype is not None
        and np.dtype(v.dtype) == _dt.bfloat16
        and _value(graph, n.inputs[0]).dtype == np.float32
        and w.dtype is not None
        and np.dtype(w.dtype) == _dt.bfloat16
    ):
        return plain
    sole = [u.name for u in users.get(c1.outputs[0], [])] == [n.name] and c1.outputs[0] not in graph.output_names
    return c1.inputs[0], c2.outputs[0], ((c1.name,) if sole else ()) + (c2.name,)


def _pool_ok(graph: Graph, n: Node, block: int, x_name: str, y_name: str) -> str | None:
    x, y = _value(graph, x_name), _value(graph, y_name)
    if len([o for o in n.outputs if o]) != 1 or (len(n.outputs) > 1 and n.outputs[1]):
        return "the Indices output is used"
    if not _blockable_dtype(x.dtype) or not _static4(x) or not _static4(y) or int(x.shape[1]) % _vector(block):
        return f"float32 or bfloat16 4-D input with a multiple of {_vector(block)} channels only"
    if any(int(d) != 1 for d in (n.attrs.get("dilations") or [])) or int(n.attrs.get("storage_order", 0) or 0):
        return "dilated windows / storage_order"
    return None


def blocked_layout(graph: Graph, res) -> None:
    from ..kernels.cpu import onednn
    from .shape_inference import infer_types

    why = onednn.unavailable()
    if why is not None:
        res.refuse(f"oneDNN: {why}")
        return
    chosen_layout = libraries.conv_chain_layout()
    if isinstance(chosen_layout, str):
        res.refuse(f"oneDNN: {chosen_layout}")
        return
    block = chosen_layout.block
    infer_types(graph)
    if block == NHWC and any(
        n.op_type in ("Conv", "FusedConv") and _value(graph, n.inputs[0]).dtype == _dt.bfloat16 for n in graph.nodes
    ):
        block = onednn.block()  # bf16 chains keep oneDNN's nChw16c kernels, measured on AVX512-BF16 (nhwc was not)
        res.note(f"bfloat16 convolutions: chains on {layout_name(block)}")
    layout = layout_name(block)
    prod = graph.producers()
    users = graph.consumers()
    cand: dict[str, str] = {}  # node name -> "conv" | "pool"
    nodes = {n.name: n for n in graph.nodes}
    for n in graph.nodes:
        if (n.op_type == "Conv" and not n.domain) or (n.op_type == "FusedConv" and n.domain == "opsnn"):
            bad = _conv_ok(graph, n, block)
            if bad is None:
                cand[n.name] = "conv"
            else:
                res.refuse(f"{n.name}: {bad}")
    hop: dict[str, tuple] = {}  # pool name -> (input, output, casts it replaces)
    for n in graph.nodes:
        if n.op_type == "MaxPool" and not n.domain:
            x, y, casts = _through_casts(graph, n, prod, users)
            p = prod.get(x)
            bad = (
                _pool_ok(graph, n, block, x, y)
                if p is not None and p.name in cand
                else "not fed by a blocked convolution"
            )
            if bad is None:
                cand[n.name] = "pool"
                hop[n.name] = (x, y, casts)
                prod[y] = n  # the pool now produces the value its second Cast did
    for n in graph.nodes:
        if n.op_type == "GlobalAveragePool" and not n.domain:
            p, x = prod.get(n.inputs[0]), _value(graph, n.inputs[0])
            if (
                p is not None
                and p.name in cand
                and x.dtype is not None
                and np.dtype(x.dtype) == np.float32
                and _static4(x)
            ):
                cand[n.name] = "gap"
    # chains: union-find over candidate -> candidate edges through X (and a conv's residual Z)
    parent = {k: k for k in cand}

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    def chain_inputs(n: Node) -> list[str]:
        ins = [hop[n.name][0] if n.name in hop else n.inputs[0]]
        if cand[n.name] == "conv" and len(n.inputs) > 3 and n.inputs[3]:
            ins.append(n.inputs[3])
        return ins

    for name in cand:
        for v in chain_inputs(nodes[name]):
            p = prod.get(v)
            if p is not None and p.name in cand:
                parent[find(p.name)] = find(name)
    convs: dict[str, int] = {}
    for name, kind in cand.items():
        if kind == "conv":
            convs[find(name)] = convs.get(find(name), 0) + 1
    chosen = {name for name in cand if convs.get(find(name), 0) >= MIN_CONVS}
    if not chosen:
        return
    blocked: dict[str, str] = {}  # plain value name -> its blocked value's name
    to_blocked: dict[str, Node] = {}
    out_names = set(graph.output_names)
    new_nodes: list[Node] = []

    def blocked_input(v: str) -> str:
        if v in blocked:
            return blocked[v]
        if v not in to_blocked:
            b = graph.unique_name(f"{v}_{layout}")
            node = Node(
                "ToBlocked", [v], [b], {"block": block}, domain="opsnn", name=graph.unique_name(f"ToBlocked_{v}")
            )
            to_blocked[v] = node
            new_nodes.append(node)
            graph.value_info[b] = Value(b, _value(graph, v).dtype, _value(graph, v).shape)
        return to_blocked[v].outputs[0]

    dropped = {c for name in chosen if name in hop for c in hop[name][2]}
    for n in graph.nodes:
        if n.name in dropped:
            continue
        if n.name not in chosen:
            new_nodes.append(n)
            continue
        x, y = hop.get(n.name, (n.inputs[0], n.outputs[0]))[:2]
        if cand[n.name] == "gap":  # blocked in, plain (N, C, 1, 1) out: y keeps its name and readers
            new = Node(
                "BlockedGlobalAveragePool",
                [blocked_input(x)],
                [y],
                {"block": block},
                domain="opsnn",
                name=graph.unique_name(f"BlockedGlobalAveragePool_{n.name}"),
            )
            new.attrs_origin = [n.name]
            new_nodes.append(new)
            res.note(f"{n.name} -> BlockedGlobalAveragePool (reads the blocked {x}, no FromBlocked)")
            continue
        if cand[n.name] == "conv":
            src_blocked = x in blocked or _src_blocked(int(_value(graph, x).shape[1]), block)
            ins = [blocked_input(x) if src_blocked else x] + list(n.inputs[1:3])
            ins += [""] * (3 - len(ins))
            if len(n.inputs) > 3 and n.inputs[3]:
                ins.append(blocked_input(n.inputs[3]))
            attrs = dict(n.attrs)
            attrs.setdefault("activation", "")
            attrs["src_blocked"] = int(src_blocked)
            op = "BlockedConv"
        else:
            ins = [blocked_input(x)]
            attrs = {k: v for k, v in n.attrs.items() if k != "storage_order"}
            op = "BlockedMaxPool"
            if hop[n.name][2]:
                res.note(f"{n.name} runs on {np.dtype(_value(graph, y).dtype)} data (the Casts around it dropped)")
        attrs["block"] = block
        yb = graph.unique_name(f"{y}_{layout}")
        graph.value_info[yb] = Value(yb, _value(graph, y).dtype, _value(graph, y).shape)
        new = Node(op, ins, [yb], attrs, domain="opsnn", name=graph.unique_name(f"{op}_{n.name}"))
        new.attrs_origin = [n.name]
        new_nodes.append(new)
        blocked[y] = yb
        res.note(f"{n.name} -> {op}{'' if op != 'BlockedConv' or attrs['src_blocked'] else ' (plain NCHW input)'}")
        # chain members read it as X or Z only (weights are constants, a bias is 1-D): blocked
        if y in out_names or any(u.name not in chosen and u.name not in dropped for u in users.get(y, [])):
            new_nodes.append(
                Node(
                    "FromBlocked",
                    [yb],
                    [y],
                    {"block": block},
                    domain="opsnn",
                    name=graph.unique_name(f"FromBlocked_{y}"),
                )
            )
    graph.nodes = new_nodes
    graph.sort()
