"""Shape / index ops: records (ONNX schemas), their CPU kernels and functional entry points.

Every op here produces a new tensor (graph semantics); the zero-copy views live on
:class:`opsnn.Tensor` itself. Pure data movement (Reshape, Transpose, Concat, Split,
Slice, Expand, Tile, DepthToSpace, ...) is planned at prepare time as strided copies of
raw bits (see :mod:`opsnn.kernels.cpu.shape`), so one kernel serves every dtype::

    >>> import opsnn, numpy as np
    >>> x = opsnn.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    >>> opsnn.ops.transpose(x).shape
    (3, 2)
    >>> [t.shape for t in opsnn.ops.split(x, 2, dim=1)]
    [(2, 2), (2, 1)]
"""

from __future__ import annotations

import math

import numpy as np

from ... import dtypes as _dt
from ...errors import DTypeError, ParamInvalidError
from ...kernels.cpu import shape as K
from ...runtime.memory import check_request
from ...tensor import Tensor, as_tensor, checked_value, tracing_training_step
from ..api import api
from ..registry import Attr, Input, Output, TensorMeta, register_op
from .elementwise import onnx_dtype

INDEX = (_dt.int32, _dt.int64)
I64 = _dt.int64
_F32_64 = (_dt.float32, _dt.float64)


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def _str(v) -> str:
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)


def _ints(v) -> list:
    return [int(x) for x in np.asarray(v).reshape(-1)]


def _axis(op: str, axis, rank: int, name: str = "axis", extra: int = 0) -> int:
    """Normalise an axis into [0, rank + extra); ParamInvalidError when out of range."""
    n = rank + extra
    a = int(axis)
    if not -n <= a < n or n == 0:
        raise ParamInvalidError(
            f"{op}: {name} {a} is out of range for a {rank}-D input (expected [{-n}, {n - 1}])", op=op
        )
    return a % n


def _host(ctx, i: int, name: str):
    """The prepare-time value of host input ``i`` (None when the optional input is absent)."""
    if not ctx.has(i):
        return None
    v = ctx.value(i)
    if v is None:
        ctx.fail(f"input {name!r} must be known at prepare time (a host input or constant)")
    return np.asarray(v)


def _same(ctx):
    return [TensorMeta(tuple(ctx.shape(0)), ctx.dtype(0))]


def _pod(ctx):
    """Kernel predicate: the data can be moved as raw words."""
    dt = ctx.dtype(0)
    return True if K.bit_copyable(dt) else f"dtype {dt} is not bit-copyable (object/string/complex)"


def _flat_plan(ctx):
    n = math.prod(ctx.shape(0))
    return [K.plan_flat_copy(n, ctx.dtype(0).itemsize)]


def _copy_kernel(rec, name: str, planner, doc: str = ""):
    rec.kernel(name, priority=10, plan=planner, applies=_pod, doc=doc)(K.run_copies)


def _to_tensor(x, like=None):
    return x if isinstance(x, Tensor) else as_tensor(x, like=like)


def _index_tensor(v) -> Tensor:
    """Indices as a tensor without silently truncating floats (the record rejects them)."""
    if isinstance(v, Tensor):
        return v
    a = np.asarray(v)
    return Tensor(a.astype(np.int64) if a.size == 0 and a.dtype.kind == "f" else a)


def _i64(values) -> Tensor:
    return Tensor(np.asarray(values, dtype=np.int64).reshape(-1))


def _i64_or_tensor(values) -> Tensor:
    """``values`` as an int64 vector; a Tensor (e.g. from :func:`shape`) is passed on as it is, so
    a traced graph computes it (from the input's shape) instead of holding the example's value."""
    return values if isinstance(values, Tensor) else _i64(values)


# ---------------------------------------------------------------------------------------------
# Reshape
# ---------------------------------------------------------------------------------------------
def reshape_target(op: str, in_shape, target, allowzero: int) -> tuple:
    """ONNX Reshape's output shape (0 copies a dim unless allowzero, one -1 is inferred)."""
    target = _ints(target)
    out = []
    for i, s in enumerate(target):
        if s == 0 and not allowzero:
            if i >= len(in_shape):
                raise ParamInvalidError(
                    f"{op}: shape[{i}] = 0 copies input dim {i}, but the input has rank {len(in_shape)}", op=op
                )
            out.append(in_shape[i])
        else:
            out.append(s)
    if out.count(-1) > 1:
        raise ParamInvalidError(f"{op}: at most one dim may be -1, got shape {tuple(target)}", op=op)
    if any(s < -1 for s in out):
        raise ParamInvalidError(f"{op}: dims must be >= -1, got shape {tuple(target)}", op=op)
    numel = math.prod(in_shape)
    if -1 in out:
        if allowzero and 0 in target:
            raise ParamInvalidError(f"{op}: shape {tuple(target)} has both -1 and 0 with allowzero=1", op=op)
        known = math.prod(s for s in out if s != -1)
        if known == 0 or numel % known:
            raise ParamInvalidError(
                f"{op}: cannot infer the -1 in shape {tuple(target)}: the input {tuple(in_shape)} "
                f"has {numel} elements, not a multiple of {known}",
                op=op,
            )
        out = [numel // known if s == -1 else s for s in out]
    if math.prod(out) != numel:
        raise ParamInvalidError(
            f"{op}: target shape {tuple(out)} has {math.prod(out)} elements but the input "
            f"{tuple(in_shape)} has {numel}",
            op=op,
        )
    return tuple(out)


def _reshape_infer(ctx):
    tgt = _host(ctx, 1, "shape")
    return [TensorMeta(reshape_target("Reshape", ctx.shape(0), tgt, ctx.attrs["allowzero"]), ctx.dtype(0))]


Reshape = register_op(
    "Reshape",
    category="shape",
    inputs=[Input("data"), Input("shape", INDEX, host=True)],
    outputs=["reshaped"],
    attrs=[Attr("allowzero", "int", 0)],
    infer=_reshape_infer,
    reference=lambda ins, a: ins[0].reshape(reshape_target("Reshape", ins[0].shape, ins[1], a["allowzero"])).copy(),
    doc="Same data, new shape (0 copies a dim, -1 is inferred).",
)
_copy_kernel(Reshape, "reshape_copy", _flat_plan)


# ---------------------------------------------------------------------------------------------
# Transpose
# ---------------------------------------------------------------------------------------------
def _perm(op, perm, rank) -> tuple:
    if perm is None:
        return tuple(range(rank - 1, -1, -1))
    p = tuple(int(v) for v in perm)
    if sorted(p) != list(range(rank)):
        raise ParamInvalidError(f"{op}: perm {p} is not a permutation of 0..{rank - 1} for a {rank}-D input", op=op)
    return p


def _transpose_infer(ctx):
    s = ctx.shape(0)
    p = _perm("Transpose", ctx.attrs["perm"], len(s))
    return [TensorMeta(tuple(s[i] for i in p), ctx.dtype(0))]


Transpose = register_op(
    "Transpose",
    category="shape",
    inputs=[Input("data")],
    outputs=["transposed"],
    attrs=[Attr("perm", "ints", None)],
    infer=_transpose_infer,
    reference=lambda ins, a: np.transpose(ins[0], _perm("Transpose", a["perm"], ins[0].ndim)).copy(),
    doc="Permute the dims (default: reverse them).",
)
_copy_kernel(
    Transpose,
    "transpose_blocked",
    lambda ctx: [
        K.plan_permute(ctx.shape(0), _perm("Transpose", ctx.attrs["perm"], len(ctx.shape(0))), ctx.dtype(0).itemsize)
    ],
    doc="strided copy; cache-tiled when the unit-stride dim moves",
)


# ---------------------------------------------------------------------------------------------
# Concat
# ---------------------------------------------------------------------------------------------
def _concat_infer(ctx):
    metas = ctx.inputs
    if not metas:
        raise ParamInvalidError("Concat: needs at least one input", op="Concat")
    r = len(metas[0].shape)
    if r == 0:
        raise ParamInvalidError("Concat: inputs must have rank >= 1, got a 0-d tensor", op="Concat")
    ax = _axis("Concat", ctx.attrs["axis"], r)
    out = list(metas[0].shape)
    out[ax] = 0
    for i, m in enumerate(metas):
        if m.dtype != metas[0].dtype:
            raise DTypeError(
                f"Concat: input {i} has dtype {_dt.name(m.dtype)}, input 0 has {_dt.name(metas[0].dtype)}", op="Concat"
            )
        if len(m.shape) != r or any(m.shape[k] != metas[0].shape[k] for k in range(r) if k != ax):
            ctx.fail(
                f"input {i} has shape {tuple(m.shape)}, incompatible with input 0 {tuple(metas[0].shape)} "
                f"outside axis {ax}"
            )
        out[ax] += m.shape[ax]
    return [TensorMeta(tuple(out), metas[0].dtype)]


def _concat_plan(ctx):
    out = ctx.outputs[0].shape
    ax = _axis("Concat", ctx.attrs["axis"], len(out))
    ost = K.contiguous_strides(out)
    isz = ctx.dtype(0).itemsize
    plans, off = [], 0
    for i, m in enumerate(ctx.inputs):
        plans.append(K.plan_copy(m.shape, 0, K.contiguous_strides(m.shape), off * ost[ax], ost, isz, src=i))
        off += m.shape[ax]
    return [p for p in plans if p.mode != "none"]


Concat = register_op(
    "Concat",
    category="shape",
    inputs=[Input("inputs", variadic=True)],
    outputs=["concat_result"],
    attrs=[Attr("axis", "int")],
    infer=_concat_infer,
    reference=lambda ins, a: np.concatenate(ins, axis=a["axis"]),
    doc="Join tensors along an existing axis.",
)
_copy_kernel(Concat, "concat_copy", _concat_plan)


# ---------------------------------------------------------------------------------------------
# Split
# ---------------------------------------------------------------------------------------------
def split_sizes(op, dim: int, split, num_outputs, n_out: int) -> list:
    """Sizes of ONNX Split's outputs along the axis."""
    if split is not None and np.asarray(split).size:
        sizes = _ints(split)
        if len(sizes) != n_out:
            raise ParamInvalidError(
                f"{op}: input 'split' has {len(sizes)} sizes but {n_out} outputs were "
                f"requested (pass num_outputs={len(sizes)})",
                op=op,
            )
        if any(s < 0 for s in sizes) or sum(sizes) != dim:
            raise ParamInvalidError(f"{op}: split sizes {sizes} must be >= 0 and sum to the axis length {dim}", op=op)
        return sizes
    n = int(num_outputs) if num_outputs is not None else n_out
    if n < 1:
        raise ParamInvalidError(f"{op}: num_outputs must be >= 1, got {n}", op=op)
    if dim % n == 0:
        return [dim // n] * n
    chunk = dim // n + 1
    last = dim - chunk * (n - 1)
    if last < 0:
        raise ParamInvalidError(
            f"{op}: cannot split a dim of {dim} into {n} outputs of ceil({dim}/{n}) = {chunk}", op=op
        )
    return [chunk] * (n - 1) + [last]


def _split_layout(ctx_or_shape, attrs, split, n_out):
    shape = ctx_or_shape
    ax = _axis("Split", attrs["axis"], len(shape))
    return ax, split_sizes("Split", shape[ax], split, attrs.get("num_outputs"), n_out)


def _split_infer(ctx):
    s = ctx.shape(0)
    ax, sizes = _split_layout(s, ctx.attrs, _host(ctx, 1, "split"), ctx.num_outputs)
    return [TensorMeta(tuple(n if k == ax else d for k, d in enumerate(s)), ctx.dtype(0)) for n in sizes]


def _split_plan(ctx):
    s = ctx.shape(0)
    ax, sizes = _split_layout(s, ctx.attrs, _host(ctx, 1, "split"), ctx.num_outputs)
    cs = K.contiguous_strides(s)
    isz = ctx.dtype(0).itemsize
    plans, off = [], 0
    for j, n in enumerate(sizes):
        shape = tuple(n if k == ax else d for k, d in enumerate(s))
        plans.append(K.plan_copy(shape, off * cs[ax], cs, 0, K.contiguous_strides(shape), isz, dst=j))
        off += n
    return [p for p in plans if p.mode != "none"]


def _split_ref(ins, a):
    x = ins[0]
    n_out = a.get("num_outputs") or (len(_ints(ins[1])) if len(ins) > 1 and ins[1] is not None else 1)
    ax, sizes = _split_layout(x.shape, a, ins[1] if len(ins) > 1 else None, n_out)
    return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=ax))


Split = register_op(
    "Split",
    category="shape",
    inputs=[Input("input"), Input("split", INDEX, optional=True, host=True)],
    outputs=[Output("outputs", variadic=True)],
    attrs=[Attr("axis", "int", 0), Attr("num_outputs", "int", None)],
    infer=_split_infer,
    reference=_split_ref,
    doc="Split along an axis into given sizes or num_outputs equal chunks (the last may be smaller).",
)
Split.output_count = lambda values, attrs: (
    np.size(values[1]) if len(values) > 1 and values[1] is not None and np.size(values[1]) else attrs.get("num_outputs")
)  # size: a 0-d split is refused by infer; an empty one is absent, as split_sizes reads it
_copy_kernel(Split, "split_copy", _split_plan)


# ---------------------------------------------------------------------------------------------
# Slice
# ---------------------------------------------------------------------------------------------
def slice_params(op, shape, starts, ends, axes, steps) -> list:
    """Per-dim (start, step, count) of ONNX Slice after clamping."""
    r = len(shape)
    starts, ends = _ints(starts), _ints(ends)
    if len(starts) != len(ends):
        raise ParamInvalidError(f"{op}: starts has {len(starts)} entries, ends has {len(ends)}", op=op)
    axes = list(range(len(starts))) if axes is None else _ints(axes)
    steps = [1] * len(starts) if steps is None else _ints(steps)
    if len(axes) != len(starts) or len(steps) != len(starts):
        raise ParamInvalidError(
            f"{op}: starts/ends/axes/steps lengths differ: {len(starts)}, {len(ends)}, {len(axes)}, {len(steps)}", op=op
        )
    res = [(0, 1, d) for d in shape]
    seen = set()
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        a = _axis(op, ax, r, "axes entry")
        if a in seen:
            raise ParamInvalidError(f"{op}: axis {a} appears twice in axes {axes}", op=op)
        seen.add(a)
        if sp == 0:
            raise ParamInvalidError(f"{op}: steps must be non-zero (axis {a})", op=op)
        d = shape[a]
        st = st + d if st < 0 else st
        en = en + d if en < 0 else en
        if sp > 0:
            st = min(max(st, 0), d)
            en = min(max(en, 0), d)
            n = max(0, -(-(en - st) // sp))
        else:
            st = min(max(st, 0), d - 1)
            en = min(max(en, -1), d - 1)
            n = max(0, -(-(st - en) // -sp))
        res[a] = (st, sp, n)
    return res


def _slice_args(ctx):
    return (ctx.shape(0), _host(ctx, 1, "starts"), _host(ctx, 2, "ends"), _host(ctx, 3, "axes"), _host(ctx, 4, "steps"))


def _slice_infer(ctx):
    p = slice_params("Slice", *_slice_args(ctx))
    return [TensorMeta(tuple(n for _, _, n in p), ctx.dtype(0))]


def _slice_plan(ctx):
    s = ctx.shape(0)
    p = slice_params("Slice", *_slice_args(ctx))
    cs = K.contiguous_strides(s)
    shape = tuple(n for _, _, n in p)
    off = sum(st * c for (st, _, n), c in zip(p, cs)) if all(n for _, _, n in p) else 0
    return [
        K.plan_copy(
            shape,
            off,
            tuple(sp * c for (_, sp, _), c in zip(p, cs)),
            0,
            K.contiguous_strides(shape),
            ctx.dtype(0).itemsize,
        )
    ]


def _slice_ref(ins, a):
    x = ins[0]
    p = slice_params(
        "Slice", x.shape, ins[1], ins[2], ins[3] if len(ins) > 3 else None, ins[4] if len(ins) > 4 else None
    )
    idx = tuple(np.arange(st, st + n * sp, sp) if n else np.arange(0) for st, sp, n in p)
    return x[np.ix_(*idx)] if idx else x.copy()


Slice = register_op(
    "Slice",
    category="shape",
    inputs=[
        Input("data"),
        Input("starts", INDEX, host=True),
        Input("ends", INDEX, host=True),
        Input("axes", INDEX, optional=True, host=True),
        Input("steps", INDEX, optional=True, host=True),
    ],
    outputs=["output"],
    infer=_slice_infer,
    reference=_slice_ref,
    doc="numpy-style basic slicing with ONNX clamping; negative steps walk backwards.",
)
_copy_kernel(Slice, "slice_copy", _slice_plan)


# ---------------------------------------------------------------------------------------------
# Gather
# ---------------------------------------------------------------------------------------------
def _gather_infer(ctx):
    s = ctx.shape(0)
    if not s:
        ctx.fail("data must have rank >= 1, got a 0-d tensor")
    ax = _axis("Gather", ctx.attrs["axis"], len(s))
    return [TensorMeta(tuple(s[:ax]) + tuple(ctx.shape(1)) + tuple(s[ax + 1 :]), ctx.dtype(0))]


def _gather_ref(ins, a):
    x, idx = ins
    ax = a["axis"] % x.ndim
    n = x.shape[ax]
    bad = (idx < -n) | (idx >= n)
    if np.any(bad):
        raise ParamInvalidError(
            f"Gather: index {int(idx[bad].flat[0])} is out of range for axis {ax} of size {n}", op="Gather"
        )
    return np.take(x, np.where(idx < 0, idx + n, idx).astype(np.int64), axis=ax)


def _gather_plan(ctx):
    return (
        _axis("Gather", ctx.attrs["axis"], len(ctx.shape(0))),
        math.prod(ctx.outputs[0].shape) * ctx.dtype(0).itemsize >= K.PARALLEL_MIN_BYTES,
    )


Gather = register_op(
    "Gather",
    category="shape",
    inputs=[Input("data"), Input("indices", INDEX)],
    outputs=["output"],
    attrs=[Attr("axis", "int", 0)],
    infer=_gather_infer,
    reference=_gather_ref,
    doc="Take slices of data along axis at the given indices (negative indices count from the end).",
)


@Gather.kernel(
    "gather_rows",
    priority=10,
    plan=_gather_plan,
    applies=_pod,
    cold_alternative="gather_numpy",
    doc="row copies, parallel over (outer, index) pairs",
)
def _gather_kernel(ins, outs, attrs, plan, ws):
    K.gather(ins[0], ins[1], outs[0], plan[0], plan[1])


@Gather.kernel(
    "gather_numpy",
    priority=5,
    plan=_gather_plan,
    applies=_pod,
    doc="np.take with the index check in numpy: nothing to compile, the first run's kernel while "
    "gather_rows compiles in the background (ops/tiering.py)",
)
def _gather_numpy_kernel(ins, outs, attrs, plan, ws):
    K.gather_numpy(ins[0], ins[1], outs[0], plan[0])


# ---------------------------------------------------------------------------------------------
# Embedding (opsnn): an axis-0 Gather of table rows that knows its padding row (for the gradient)
# ---------------------------------------------------------------------------------------------
def _embedding_infer(ctx):
    w = tuple(ctx.shape(0))
    if len(w) != 2:
        ctx.fail(f"weight must be 2-D [num_rows, dim], got shape {w}")
    _padding_row(ctx, w[0])
    return [TensorMeta(tuple(ctx.shape(1)) + (w[1],), ctx.dtype(0))]


def _embedding_ref(ins, attrs):
    w, ids = ins
    n = w.shape[0]
    bad = (ids < -n) | (ids >= n)
    if np.any(bad):
        raise ParamInvalidError(f"Embedding: id {int(ids[bad].flat[0])} is out of range for {n} rows", op="Embedding")
    return np.take(w, np.where(ids < 0, ids + n, ids).astype(np.int64), axis=0)


Embedding = register_op(
    "Embedding",
    domain="opsnn",
    category="shape",
    inputs=[Input("weight"), Input("ids", INDEX)],
    outputs=["output"],
    attrs=[Attr("padding_idx", "int", None)],
    infer=_embedding_infer,
    reference=_embedding_ref,
    doc="rows of weight at ids (Gather along axis 0); the padding_idx row gets no gradient",
)


@Embedding.kernel(
    "embedding_rows",
    priority=10,
    plan=lambda ctx: math.prod(ctx.outputs[0].shape) * ctx.dtype(0).itemsize >= K.PARALLEL_MIN_BYTES,
    applies=_pod,
    doc="Gather's row copies, parallel over ids",
)
def _embedding_kernel(ins, outs, attrs, plan, ws):
    K.gather(ins[0], ins[1], outs[0], 0, plan, "Embedding")


# ---------------------------------------------------------------------------------------------
# EmbeddingGrad (opsnn): the table gradient of an axis-0 Gather
# ---------------------------------------------------------------------------------------------
def _padding_row(ctx, R: int) -> int:
    """``padding_idx`` normalised to [0, R), or -1 for none."""
    op, p = ctx.op.name, ctx.attrs["padding_idx"]
    if p is None:
        return -1
    if not -R <= p < R:
        raise ParamInvalidError(f"{op}: attribute 'padding_idx' must be in [{-R}, {R - 1}] or absent, got {p}", op=op)
    return int(p) % R


def _embedding_grad_infer(ctx):
    R = ctx.attrs["num_rows"]
    if isinstance(R, bool) or not isinstance(R, (int, np.integer)) or R < 0:
        ctx.fail(f"attribute 'num_rows' must be an int >= 0, got {R!r}")
    _padding_row(ctx, R)
    g, ids = tuple(ctx.shape(0)), tuple(ctx.shape(1))
    if len(g) != len(ids) + 1 or g[:-1] != ids:
        ctx.fail(f"dY must have shape ids.shape + (embedding_dim,) = {ids} + (D,), got {g}")
    return [TensorMeta((int(R), g[-1]), ctx.dtype(0))]


def _embedding_grad_ref(ins, attrs):
    dy, ids = ins[0], ins[1]
    R = attrs["num_rows"]
    flat = ids.reshape(-1).astype(np.int64)
    bad = (flat < -R) | (flat >= R)
    if bad.any():
        raise ParamInvalidError(
            f"EmbeddingGrad: id {int(flat[bad][0])} is out of range for {R} rows", op="EmbeddingGrad"
        )
    out = np.zeros((R, dy.shape[-1]), np.float64)
    np.add.at(out, np.where(flat < 0, flat + R, flat), dy.reshape(flat.size, dy.shape[-1]).astype(np.float64))
    if attrs["padding_idx"] is not None:
        out[attrs["padding_idx"] % R] = 0
    return out.astype(dy.dtype)


EmbeddingGrad = register_op(
    "EmbeddingGrad",
    domain="opsnn",
    category="shape",
    inputs=[Input("dY", _dt.FLOATS), Input("ids", INDEX)],
    outputs=["dTable"],
    attrs=[Attr("num_rows", "int"), Attr("padding_idx", "int", None)],
    infer=_embedding_grad_infer,
    reference=_embedding_grad_ref,
    doc="table gradient of an embedding lookup (axis-0 Gather): dY rows summed into their ids' rows; "
    "the padding_idx row stays zero",
)


@EmbeddingGrad.kernel(
    "embedding_grad_rows",
    dtypes=(_dt.float32, _dt.float64),
    priority=10,
    plan=lambda ctx: (
        _padding_row(ctx, ctx.attrs["num_rows"]),
        K.embedding_grad_parallel(ctx.attrs["num_rows"] * ctx.shape(0)[-1]),
    ),
    doc="counting sort of the ids by row, then parallel over table rows (each row summed by one "
    "thread, in the ids' order: race-free, deterministic); untouched rows zeroed in the same pass",
)
def _embedding_grad_kernel(ins, outs, attrs, plan, ws):
    K.embedding_grad_rows(ins[0], ins[1], outs[0], plan[0], plan[1], "EmbeddingGrad")


# ---------------------------------------------------------------------------------------------
# Pad
# ---------------------------------------------------------------------------------------------
PAD_MODES = ("constant", "reflect", "edge", "wrap")


def pad_widths(op, shape, pads, axes, mode) -> list:
    """Per-dim (before, after) from ONNX pads [x1_begin, x2_begin, ..., x1_end, x2_end, ...]."""
    r = len(shape)
    pads = _ints(pads)
    axes = list(range(r)) if axes is None else [_axis(op, a, r, "axes entry") for a in _ints(axes)]
    if len(set(axes)) != len(axes):
        raise ParamInvalidError(f"{op}: repeated axes {axes}", op=op)
    if len(pads) != 2 * len(axes):
        raise ParamInvalidError(f"{op}: pads has {len(pads)} entries; expected 2 x {len(axes)} axes", op=op)
    if mode not in PAD_MODES:
        raise ParamInvalidError(f"{op}: mode must be one of {PAD_MODES}, got {mode!r}", op=op)
    w = [(0, 0)] * r
    for i, a in enumerate(axes):
        b, e = pads[i], pads[len(axes) + i]
        if shape[a] + b + e < 0:
            raise ParamInvalidError(f"{op}: pads ({b}, {e}) on axis {a} of size {shape[a]} give a negative size", op=op)
        kept = shape[a] - max(0, -b) - max(0, -e)
        if mode != "constant" and (b > 0 or e > 0) and kept <= 0 and shape[a] + b + e > 0:
            raise ParamInvalidError(
                f"{op}: mode {mode!r} cannot pad axis {a}: no input elements left to copy from", op=op
            )
        w[a] = (b, e)
    return w


def pad_map(n: int, before: int, after: int, mode: str) -> np.ndarray:
    """Source index for each output position of one padded dim (-1 = constant).

    Constant mode maps output j to input j - before (a crop past the input's end on one side eats
    into the other side's padding); the other modes crop first, then pad what is left (onnxruntime)."""
    if mode == "constant":
        src = np.arange(n + before + after, dtype=np.int64) - before
        src[(src < 0) | (src >= n)] = -1
        return src
    if n + before + after == 0:
        return np.zeros(0, np.int64)
    src = np.arange(max(0, -before), n - max(0, -after), dtype=np.int64)
    return np.pad(
        src, (max(before, 0), max(after, 0)), mode={"edge": "edge", "reflect": "reflect", "wrap": "wrap"}[mode]
    )


def _pad_args(ctx):
    return _host(ctx, 1, "pads"), _host(ctx, 3, "axes"), _str(ctx.attrs["mode"])


def _pad_infer(ctx):
    pads, axes, mode = _pad_args(ctx)
    s = ctx.shape(0)
    w = pad_widths("Pad", s, pads, axes, mode)
    if ctx.has(2) and math.prod(ctx.shape(2)) != 1:
        ctx.fail(f"constant_value must hold one value, got shape {tuple(ctx.shape(2))}")
    return [TensorMeta(tuple(d + b + e for d, (b, e) in zip(s, w)), ctx.dtype(0))]


def _pad_ref(ins, a):
    x = ins[0]
    mode = _str(a["mode"])
    w = pad_widths("Pad", x.shape, ins[1], ins[3] if len(ins) > 3 else None, mode)
    pw = [(max(b, 0), max(e, 0)) for b, e in w]
    if mode == "constant":  # pad, then crop: a crop longer than the input eats into the far side's padding
        cv = ins[2].reshape(()) if len(ins) > 2 and ins[2] is not None else 0
        y = np.pad(x, pw, mode="constant", constant_values=cv).astype(x.dtype)
        return y[tuple(slice(max(0, -b), y.shape[k] - max(0, -e)) for k, (b, e) in enumerate(w))]
    out_shape = tuple(d + b + e for d, (b, e) in zip(x.shape, w))
    if 0 in out_shape:  # nothing to copy (numpy cannot edge-pad an emptied axis)
        return np.empty(out_shape, x.dtype)
    crop = tuple(slice(max(0, -b), x.shape[k] - max(0, -e)) for k, (b, e) in enumerate(w))
    return np.pad(x[crop], pw, mode=mode)


def _pad_plan(ctx):
    pads, axes, mode = _pad_args(ctx)
    s = ctx.shape(0)
    w = pad_widths("Pad", s, pads, axes, mode)
    check_request(16 * sum(d + b + e for d, (b, e) in zip(s, w)), "Pad: index maps")  # built outside the pool
    return K.plan_maps(s, [pad_map(d, b, e, mode) for d, (b, e) in zip(s, w)], ctx.dtype(0).itemsize)


Pad = register_op(
    "Pad",
    category="shape",
    inputs=[
        Input("data"),
        Input("pads", INDEX, host=True),
        Input("constant_value", optional=True),
        Input("axes", INDEX, optional=True, host=True),
    ],
    outputs=["output"],
    attrs=[Attr("mode", "string", "constant")],
    infer=_pad_infer,
    reference=_pad_ref,
    doc="Pad (or crop, with negative pads) in constant, reflect, edge or wrap mode.",
)


@Pad.kernel("pad_maps", priority=10, plan=_pad_plan, applies=_pod, doc="index-map gather, parallel over rows")
def _pad_kernel(ins, outs, attrs, plan, ws):
    cv = ins[2] if len(ins) > 2 and ins[2] is not None else None
    fill = np.asarray(0 if cv is None else cv.reshape(-1)[0]).astype(outs[0].dtype)
    K.run_maps(plan, ins[0], outs[0], fill)


# ---------------------------------------------------------------------------------------------
# Flatten / Squeeze / Unsqueeze / Identity
# ---------------------------------------------------------------------------------------------
def _flatten_axis(axis, rank) -> int:
    a = int(axis)
    if not -rank <= a <= rank:
        raise ParamInvalidError(
            f"Flatten: axis {a} is out of range for a {rank}-D input (expected [{-rank}, {rank}])", op="Flatten"
        )
    return a + rank if a < 0 else a


def _flatten_infer(ctx):
    s = ctx.shape(0)
    ax = _flatten_axis(ctx.attrs["axis"], len(s))
    return [TensorMeta((math.prod(s[:ax]), math.prod(s[ax:])), ctx.dtype(0))]


def _flatten_ref(ins, a):
    x = ins[0]
    ax = _flatten_axis(a["axis"], x.ndim)
    return x.reshape(int(np.prod(x.shape[:ax])), int(np.prod(x.shape[ax:]))).copy()


Flatten = register_op(
    "Flatten",
    category="shape",
    inputs=[Input("input")],
    outputs=["output"],
    attrs=[Attr("axis", "int", 1)],
    infer=_flatten_infer,
    reference=_flatten_ref,
    doc="Flatten into 2-D: dims before axis, dims from axis on.",
)
_copy_kernel(Flatten, "flatten_copy", _flat_plan)


def squeeze_shape(op, shape, axes) -> tuple:
    r = len(shape)
    if axes is None:
        return tuple(d for d in shape if d != 1)
    ax = sorted({_axis(op, a, r, "axes entry") for a in _ints(axes)})
    for a in ax:
        if shape[a] != 1:
            raise ParamInvalidError(f"{op}: cannot squeeze axis {a} of size {shape[a]} (shape {tuple(shape)})", op=op)
    return tuple(d for k, d in enumerate(shape) if k not in ax)


Squeeze = register_op(
    "Squeeze",
    category="shape",
    inputs=[Input("data"), Input("axes", INDEX, optional=True, host=True)],
    outputs=["squeezed"],
    infer=lambda ctx: [TensorMeta(squeeze_shape("Squeeze", ctx.shape(0), _host(ctx, 1, "axes")), ctx.dtype(0))],
    reference=lambda ins, a: (
        ins[0].reshape(squeeze_shape("Squeeze", ins[0].shape, ins[1] if len(ins) > 1 else None)).copy()
    ),
    doc="Remove size-1 dims (all of them, or the given axes).",
)
_copy_kernel(Squeeze, "squeeze_copy", _flat_plan)


def unsqueeze_shape(op, shape, axes) -> tuple:
    axes = _ints(axes)
    r = len(shape) + len(axes)
    ax = [_axis(op, a, r, "axes entry") for a in axes]
    if len(set(ax)) != len(ax):
        raise ParamInvalidError(f"{op}: repeated axes {axes}", op=op)
    it = iter(shape)
    return tuple(1 if k in ax else next(it) for k in range(r))


Unsqueeze = register_op(
    "Unsqueeze",
    category="shape",
    inputs=[Input("data"), Input("axes", INDEX, host=True)],
    outputs=["expanded"],
    infer=lambda ctx: [TensorMeta(unsqueeze_shape("Unsqueeze", ctx.shape(0), _host(ctx, 1, "axes")), ctx.dtype(0))],
    reference=lambda ins, a: np.expand_dims(
        ins[0], tuple(sorted(_axis("Unsqueeze", v, ins[0].ndim + ins[1].size) for v in _ints(ins[1])))
    ).copy(),
    doc="Insert size-1 dims at the given output axes.",
)
_copy_kernel(Unsqueeze, "unsqueeze_copy", _flat_plan)

Identity = register_op(
    "Identity",
    category="shape",
    inputs=[Input("input")],
    outputs=["output"],
    infer=_same,
    reference=lambda ins, a: ins[0].copy(),
    doc="A copy of the input.",
)
_copy_kernel(Identity, "identity_copy", _flat_plan)


# ---------------------------------------------------------------------------------------------
# Expand / Tile
# ---------------------------------------------------------------------------------------------
def expand_shape(op, shape, target) -> tuple:
    target = _ints(target)
    r = max(len(shape), len(target))
    a = (1,) * (r - len(shape)) + tuple(shape)
    b = (1,) * (r - len(target)) + tuple(target)
    out = []
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y and x != 1 and y != 1:
            raise ParamInvalidError(
                f"{op}: cannot broadcast input shape {tuple(shape)} with shape {tuple(target)} (dim {k}: {x} vs {y})",
                op=op,
            )
        out.append(y if x == 1 else x)
    return tuple(out)


def _expand_plan(ctx):
    s = ctx.shape(0)
    out = ctx.outputs[0].shape
    cs = K.contiguous_strides(s)
    lead = len(out) - len(s)
    sst = tuple(0 if k < lead or s[k - lead] == 1 else cs[k - lead] for k in range(len(out)))
    return [K.plan_copy(out, 0, sst, 0, K.contiguous_strides(out), ctx.dtype(0).itemsize)]


Expand = register_op(
    "Expand",
    category="shape",
    inputs=[Input("input"), Input("shape", INDEX, host=True)],
    outputs=["output"],
    infer=lambda ctx: [TensorMeta(expand_shape("Expand", ctx.shape(0), _host(ctx, 1, "shape")), ctx.dtype(0))],
    reference=lambda ins, a: np.broadcast_to(ins[0], np.broadcast_shapes(ins[0].shape, tuple(_ints(ins[1])))).copy(),
    doc="Broadcast to a shape (numpy bidirectional broadcasting).",
)
_copy_kernel(Expand, "expand_copy", _expand_plan)


def _tile_repeats(op, shape, repeats) -> list:
    reps = _ints(repeats)
    if len(reps) != len(shape):
        raise ParamInvalidError(f"{op}: repeats has {len(reps)} entries, the input has rank {len(shape)}", op=op)
    if any(v < 0 for v in reps):
        raise ParamInvalidError(f"{op}: repeats must be >= 0, got {reps}", op=op)
    return reps


def _tile_plan(ctx):
    s = ctx.shape(0)
    reps = _tile_repeats("Tile", s, _host(ctx, 1, "repeats"))
    cs = K.contiguous_strides(s)
    shape, sst = [], []
    for d, r_, c in zip(s, reps, cs):
        shape += [r_, d]
        sst += [0, c]
    return [K.plan_copy(shape, 0, sst, 0, K.contiguous_strides(shape), ctx.dtype(0).itemsize)]


Tile = register_op(
    "Tile",
    category="shape",
    inputs=[Input("input"), Input("repeats", INDEX, host=True)],
    outputs=["output"],
    infer=lambda ctx: [
        TensorMeta(
            tuple(d * r_ for d, r_ in zip(ctx.shape(0), _tile_repeats("Tile", ctx.shape(0), _host(ctx, 1, "repeats")))),
            ctx.dtype(0),
        )
    ],
    reference=lambda ins, a: np.tile(ins[0], _tile_repeats("Tile", ins[0].shape, ins[1])),
    doc="Repeat the input along each dim.",
)
_copy_kernel(Tile, "tile_copy", _tile_plan)


# ---------------------------------------------------------------------------------------------
# DepthToSpace / SpaceToDepth
# ---------------------------------------------------------------------------------------------
def _d2s_layout(op, shape, bs, mode):
    """(reshaped input, perm) such that transposing the reshaped input gives the output."""
    mode = _str(mode)
    if len(shape) != 4:
        raise ParamInvalidError(f"{op}: expects a 4-D NCHW input, got shape {tuple(shape)}", op=op)
    if bs < 1:
        raise ParamInvalidError(f"{op}: blocksize must be >= 1, got {bs}", op=op)
    if mode not in ("DCR", "CRD"):
        raise ParamInvalidError(f"{op}: mode must be 'DCR' or 'CRD', got {mode!r}", op=op)
    b, c, h, w = shape
    if op == "DepthToSpace":
        if c % (bs * bs):
            raise ParamInvalidError(f"{op}: channels {c} not divisible by blocksize^2 = {bs * bs}", op=op)
        c2 = c // (bs * bs)
        if mode == "DCR":
            return (b, bs, bs, c2, h, w), (0, 3, 4, 1, 5, 2), (b, c2, h * bs, w * bs)
        return (b, c2, bs, bs, h, w), (0, 1, 4, 2, 5, 3), (b, c2, h * bs, w * bs)
    if h % bs or w % bs:
        raise ParamInvalidError(f"{op}: spatial dims ({h}, {w}) not divisible by blocksize {bs}", op=op)
    tmp = (b, c, h // bs, bs, w // bs, bs)
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    return tmp, perm, (b, c * bs * bs, h // bs, w // bs)


def _d2s_record(name, doc):
    def infer(ctx):
        _, _, out = _d2s_layout(name, ctx.shape(0), ctx.attrs["blocksize"], ctx.attrs["mode"])
        return [TensorMeta(out, ctx.dtype(0))]

    def ref(ins, a):
        tmp, perm, out = _d2s_layout(name, ins[0].shape, a["blocksize"], a["mode"])
        return np.transpose(ins[0].reshape(tmp), perm).reshape(out)

    def plan(ctx):
        tmp, perm, _ = _d2s_layout(name, ctx.shape(0), ctx.attrs["blocksize"], ctx.attrs["mode"])
        return [K.plan_permute(tmp, perm, ctx.dtype(0).itemsize)]

    rec = register_op(
        name,
        category="shape",
        inputs=[Input("input")],
        outputs=["output"],
        attrs=[Attr("blocksize", "int"), Attr("mode", "string", "DCR")],
        infer=infer,
        reference=ref,
        doc=doc,
    )
    _copy_kernel(rec, name.lower() + "_copy", plan)
    return rec


DepthToSpace = _d2s_record("DepthToSpace", "Move channel blocks into spatial blocks (DCR or CRD order).")
SpaceToDepth = _d2s_record("SpaceToDepth", "Move spatial blocks into channels (DCR or CRD order).")


# ---------------------------------------------------------------------------------------------
# Shape / Size
# ---------------------------------------------------------------------------------------------
def _shape_range(shape, start, end):
    r = len(shape)
    start = 0 if start is None else int(start)
    end = r if end is None else int(end)
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    return [int(d) for d in shape[start:end]] if end > start else []


Shape = register_op(
    "Shape",
    category="shape",
    inputs=[Input("data")],
    outputs=["shape"],
    attrs=[Attr("start", "int", 0), Attr("end", "int", None)],
    infer=lambda ctx: [TensorMeta((len(_shape_range(ctx.shape(0), ctx.attrs["start"], ctx.attrs["end"])),), I64)],
    reference=lambda ins, a: np.array(_shape_range(ins[0].shape, a["start"], a["end"]), dtype=np.int64),
    doc="The input's shape (dims start..end) as an int64 vector.",
)


@Shape.kernel(
    "shape_host",
    priority=10,
    plan=lambda ctx: np.array(_shape_range(ctx.shape(0), ctx.attrs["start"], ctx.attrs["end"]), np.int64),
    doc="writes the prepared dims",
)
def _shape_kernel(ins, outs, attrs, plan, ws):
    outs[0][...] = plan


Size = register_op(
    "Size",
    category="shape",
    inputs=[Input("data")],
    outputs=["size"],
    infer=lambda ctx: [TensorMeta((), I64)],
    reference=lambda ins, a: np.array(ins[0].size, dtype=np.int64),
    doc="Number of elements (int64 scalar).",
)


@Size.kernel("size_host", priority=10, plan=lambda ctx: math.prod(ctx.shape(0)), doc="writes the prepared count")
def _size_kernel(ins, outs, attrs, plan, ws):
    outs[0][...] = plan


# ---------------------------------------------------------------------------------------------
# GatherElements / GatherND / ScatterElements / ScatterND / Scatter
# ---------------------------------------------------------------------------------------------
def _ge_infer(ctx):
    s, i = ctx.shape(0), ctx.shape(1)
    if len(s) != len(i) or not s:
        ctx.fail(f"data {tuple(s)} and indices {tuple(i)} must have the same rank >= 1")
    ax = _axis("GatherElements", ctx.attrs["axis"], len(s))
    over = [d for d in range(len(s)) if d != ax and i[d] > s[d]]
    if over:  # the other axes index data by position: they cannot be longer than data's
        ctx.fail(
            f"indices {tuple(i)} is longer than data {tuple(s)} on axis {over[0]} (axis={ax} is the "
            "gathered one; the others must be <= data's)"
        )
    return [TensorMeta(tuple(i), ctx.dtype(0))]


def _ge_ref(ins, a):
    x, idx = ins
    ax = a["axis"] % x.ndim
    out = np.empty(idx.shape, x.dtype)
    for pos in np.ndindex(*idx.shape):
        k = int(idx[pos])
        if not -x.shape[ax] <= k < x.shape[ax]:
            raise ParamInvalidError(f"GatherElements: index {k} at {pos} out of range", op="GatherElements")
        src = list(pos)
        src[ax] = k % x.shape[ax]
        out[pos] = x[tuple(src)]
    return out


GatherElements = register_op(
    "GatherElements",
    category="shape",
    inputs=[Input("data"), Input("indices", INDEX)],
    outputs=["output"],
    attrs=[Attr("axis", "int", 0)],
    infer=_ge_infer,
    reference=_ge_ref,
    doc="out[i][j][k] = data[index[i][j][k]][j][k] (for axis 0), like torch.gather.",
)
GatherElements.kernel("gather_elements_numba", priority=5, applies=_pod)(
    lambda ins, outs, attrs, plan, ws: K.gather_elements(ins[0], ins[1], outs[0], attrs["axis"] % ins[0].ndim)
)


def _gnd_infer(ctx):
    s, i = tuple(ctx.shape(0)), tuple(ctx.shape(1))
    b = int(ctx.attrs["batch_dims"])
    if not i:
        ctx.fail("indices must have rank >= 1")
    k = i[-1]
    if b < 0 or b >= min(len(s), len(i)) and b != 0:
        ctx.fail(f"batch_dims {b} must be < min(rank(data), rank(indices)) = {min(len(s), len(i))}")
    if s[:b] != i[:b]:
        ctx.fail(f"the first {b} (batch) dims of data {s} and indices {i} differ")
    if k > len(s) - b:
        ctx.fail(f"indices.shape[-1] = {k} exceeds rank(data) - batch_dims = {len(s) - b}")
    return [TensorMeta(i[:-1] + s[b + k :], ctx.dtype(0))]


def _gnd_ref(ins, a):
    x, idx = ins
    b = a["batch_dims"]
    out_shape = idx.shape[:-1] + x.shape[b + idx.shape[-1] :]
    out = np.empty(out_shape, x.dtype)
    for pos in np.ndindex(*idx.shape[:-1]):
        tgt = tuple(int(v) for v in idx[pos])
        lims = x.shape[b : b + len(tgt)]
        if any(not -n <= v < n for v, n in zip(tgt, lims)):
            raise ParamInvalidError(f"GatherND: index {tgt} at {pos} out of range for dims {lims}", op="GatherND")
        out[pos] = x[pos[:b] + tgt]
    return out


GatherND = register_op(
    "GatherND",
    category="shape",
    inputs=[Input("data"), Input("indices", (_dt.int64,))],
    outputs=["output"],
    attrs=[Attr("batch_dims", "int", 0)],
    infer=_gnd_infer,
    reference=_gnd_ref,
    doc="Gather slices of data addressed by the last dim of indices (after batch_dims batch dims).",
)
GatherND.kernel("gather_nd_numpy", priority=5, applies=_pod)(
    lambda ins, outs, attrs, plan, ws: K.gather_nd(ins[0], ins[1], outs[0], attrs["batch_dims"])
)

REDUCTIONS = ("none", "add", "mul", "max", "min")


def _scatter_infer(op):
    def infer(ctx):
        s, i, u = ctx.shape(0), ctx.shape(1), ctx.shape(2)
        if op != "ScatterND":
            if len(s) != len(i) or tuple(i) != tuple(u) or not s:
                ctx.fail(
                    f"data {tuple(s)}, indices {tuple(i)}, updates {tuple(u)}: indices and updates must have "
                    "the same shape and the rank of data"
                )
            ax = _axis(op, ctx.attrs["axis"], len(s))
            over = [d for d in range(len(s)) if d != ax and i[d] > s[d]]
            if over:  # the other axes index data by position: they cannot be longer than data's
                ctx.fail(
                    f"indices {tuple(i)} is longer than data {tuple(s)} on axis {over[0]} (axis={ax} is the "
                    "scattered one; the others must be <= data's)"
                )
        else:
            if not i:
                ctx.fail("indices must have rank >= 1")
            k = i[-1]
            if k > len(s):
                ctx.fail(f"indices.shape[-1] = {k} exceeds rank(data) = {len(s)}")
            want = tuple(i[:-1]) + tuple(s[k:])
            if tuple(u) != want:
                ctx.fail(f"updates has shape {tuple(u)}, expected {want}")
        if ctx.dtype(2) != ctx.dtype(0):
            raise DTypeError(
                f"{op}: updates dtype {_dt.name(ctx.dtype(2))} != data dtype {_dt.name(ctx.dtype(0))}", op=op
            )
        red = _str(ctx.attrs.get("reduction", "none"))
        if red not in REDUCTIONS:
            raise ParamInvalidError(f"{op}: reduction must be one of {REDUCTIONS}, got {red!r}", op=op)
        return [TensorMeta(tuple(s), ctx.dtype(0))]

    return infer


_PY_REDUCE = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b, "max": np.maximum, "min": np.minimum}


def _scatter_elements_ref(ins, a):
    x, idx, upd = ins
    ax = a.get("axis", 0) % x.ndim
    red = _str(a.get("reduction", "none"))
    out = x.copy()
    for pos in np.ndindex(*idx.shape):
        k = int(idx[pos])
        if not -x.shape[ax] <= k < x.shape[ax]:
            raise ParamInvalidError(f"ScatterElements: index {k} at {pos} out of range", op="ScatterElements")
        dst = list(pos)
        dst[ax] = k % x.shape[ax]
        dst = tuple(dst)
        out[dst] = upd[pos] if red == "none" else _PY_REDUCE[red](out[dst], upd[pos])
    return out


def _scatter_nd_ref(ins, a):
    x, idx, upd = ins
    red = _str(a["reduction"])
    out = x.copy()
    for pos in np.ndindex(*idx.shape[:-1]):
        tgt = tuple(int(v) for v in idx[pos])
        if any(not -n <= v < n for v, n in zip(tgt, x.shape)):
            raise ParamInvalidError(f"ScatterND: index {tgt} at {pos} out of range", op="ScatterND")
        out[tgt] = upd[pos] if red == "none" else _PY_REDUCE[red](out[tgt], upd[pos])
    return out


ScatterElements = register_op(
    "ScatterElements",
    category="shape",
    inputs=[Input("data"), Input("indices", INDEX), Input("updates")],
    outputs=["output"],
    attrs=[Attr("axis", "int", 0), Attr("reduction", "string", "none")],
    infer=_scatter_infer("ScatterElements"),
    reference=_scatter_elements_ref,
    doc="Copy of data with updates written (or reduced) at per-element indices along axis.",
)
ScatterElements.kernel("scatter_elements_numba", priority=5, applies=_pod)(
    lambda ins, outs, attrs, plan, ws: K.scatter_elements(
        ins[0], ins[1], ins[2], outs[0], attrs["axis"] % ins[0].ndim, _str(attrs["reduction"])
    )
)

Scatter = register_op(
    "Scatter",
    category="shape",
    inputs=[Input("data"), Input("indices", INDEX), Input("updates")],
    outputs=["output"],
    attrs=[Attr("axis", "int", 0)],
    infer=_scatter_infer("Scatter"),
    reference=_scatter_elements_ref,
    doc="Deprecated alias of ScatterElements without reduction.",
)
Scatter.kernel("scatter_numba", priority=5, applies=_pod)(
    lambda ins, outs, attrs, plan, ws: K.scatter_elements(
        ins[0], ins[1], ins[2], outs[0], attrs["axis"] % ins[0].ndim, "none", op="Scatter"
    )
)

ScatterND = register_op(
    "ScatterND",
    category="shape",
    inputs=[Input("data"), Input("indices", (_dt.int64,)), Input("updates")],
    outputs=["output"],
    attrs=[Attr("reduction", "string", "none")],
    infer=_scatter_infer("ScatterND"),
    reference=_scatter_nd_ref,
    doc="Copy of data with slices replaced (or reduced) at N-d indices.",
)
ScatterND.kernel("scatter_nd_numpy", priority=5, applies=_pod)(
    lambda ins, outs, attrs, plan, ws: K.scatter_nd(ins[0], ins[1], ins[2], outs[0], _str(attrs["reduction"]))
)


# ---------------------------------------------------------------------------------------------
# Range / ConstantOfShape / EyeLike / Trilu / OneHot
# ---------------------------------------------------------------------------------------------
_RANGE_DT = (_dt.float32, _dt.float64, _dt.float16, _dt.bfloat16, _dt.int16, _dt.int32, _dt.int64)


def range_count(start, limit, delta) -> int:
    if np.asarray(start).dtype.kind in "iu":
        s, l_, d = int(start), int(limit), int(delta)
        if d == 0:
            raise ParamInvalidError("Range: delta must be non-zero", op="Range")
        return max(0, -(-(l_ - s) // d))
    s, l_, d = float(start), float(limit), float(delta)
    if d == 0 or not math.isfinite(s) or not math.isfinite(l_) or not math.isfinite(d):
        raise ParamInvalidError(
            f"Range: start/limit/delta must be finite with delta != 0, got {s}, {l_}, {d}", op="Range"
        )
    return max(0, math.ceil((l_ - s) / d))


def _range_values(start, limit, delta, dtype, n):
    check_request(16 * n, f"Range: {n} values")  # an arange and its scaled copy, outside the pool
    if dtype.kind in "iu":
        return (int(start) + np.arange(n, dtype=np.int64) * int(delta)).astype(dtype)
    return (float(start) + np.arange(n, dtype=np.float64) * float(delta)).astype(dtype)


def _range_infer(ctx):
    vals = [_host(ctx, i, n) for i, n in enumerate(("start", "limit", "delta"))]
    for _i, (m, n) in enumerate(zip(ctx.inputs, ("start", "limit", "delta"))):
        if math.prod(m.shape) != 1:
            ctx.fail(f"{n} must be a scalar, got shape {tuple(m.shape)}")
        if m.dtype != ctx.dtype(0):
            raise DTypeError(
                f"Range: {n} has dtype {_dt.name(m.dtype)}, start has {_dt.name(ctx.dtype(0))}", op="Range"
            )
    return [TensorMeta((range_count(*[v.reshape(()) for v in vals]),), ctx.dtype(0))]


Range = register_op(
    "Range",
    category="shape",
    inputs=[
        Input("start", _RANGE_DT, host=True),
        Input("limit", _RANGE_DT, host=True),
        Input("delta", _RANGE_DT, host=True),
    ],
    outputs=["output"],
    attrs=[Attr("stash_type", "int", 1)],
    infer=_range_infer,
    reference=lambda ins, a: np.array(
        [
            ins[0].reshape(()).astype(np.float64 if ins[0].dtype.kind == "f" else np.int64)
            + i * ins[2].reshape(()).astype(np.float64 if ins[0].dtype.kind == "f" else np.int64)
            for i in range(range_count(ins[0].reshape(()), ins[1].reshape(()), ins[2].reshape(())))
        ],
        dtype=ins[0].dtype,
    ).reshape(-1),
    doc="start, start + delta, ... up to limit (exclusive); 16-bit floats computed in higher precision.",
)


@Range.kernel(
    "range_host",
    priority=10,
    doc="computed once at prepare time",
    plan=lambda ctx: _range_values(
        *[np.asarray(ctx.value(i)).reshape(()) for i in range(3)], ctx.dtype(0), ctx.outputs[0].shape[0]
    ),
)
def _range_kernel(ins, outs, attrs, plan, ws):
    outs[0][...] = plan


def constant_value(v) -> np.ndarray:
    """ConstantOfShape's ``value`` attribute as a 0-d array (TensorProto, array, Tensor or scalar)."""
    if v is None:
        return np.zeros((), np.float32)
    if type(v).__name__ == "TensorProto":
        from onnx import numpy_helper

        v = numpy_helper.to_array(v)
    if isinstance(v, Tensor):
        v = v.numpy()
    if isinstance(v, bool):
        a = np.asarray(v, np.bool_)
    elif isinstance(v, int):
        a = np.asarray(v, np.int64)
    elif isinstance(v, float):
        a = np.asarray(v, np.float32)
    else:
        a = np.asarray(v)
    if a.size != 1:
        raise ParamInvalidError(
            f"ConstantOfShape: value must hold exactly one element, got shape {a.shape}", op="ConstantOfShape"
        )
    return a.reshape(())


def _constant_of_shape_dims(ctx):
    s = _ints(_host(ctx, 0, "input"))
    if any(d < 0 for d in s):
        raise ParamInvalidError(f"ConstantOfShape: dims must be >= 0, got {s}", op="ConstantOfShape")
    return tuple(s)


ConstantOfShape = register_op(
    "ConstantOfShape",
    category="shape",
    inputs=[Input("input", (_dt.int64,), host=True)],
    outputs=["output"],
    attrs=[Attr("value", "tensor", None)],
    infer=lambda ctx: [TensorMeta(_constant_of_shape_dims(ctx), constant_value(ctx.attrs["value"]).dtype)],
    reference=lambda ins, a: np.full(_ints(ins[0]), constant_value(a["value"])),
    doc="A tensor of the given shape filled with one value (default float32 0).",
)


@ConstantOfShape.kernel("fill", priority=10, plan=lambda ctx: constant_value(ctx.attrs["value"]))
def _fill_kernel(ins, outs, attrs, plan, ws):
    outs[0][...] = plan


def _eye_infer(ctx):
    s = ctx.shape(0)
    if len(s) != 2:
        ctx.fail(f"input must be 2-D, got shape {tuple(s)}")
    dt = ctx.dtype(0) if ctx.attrs["dtype"] is None else onnx_dtype(ctx.attrs["dtype"])
    return [TensorMeta(tuple(s), dt)]


def _eye_ref(ins, a):
    dt = ins[0].dtype if a["dtype"] is None else onnx_dtype(a["dtype"])
    n, m = ins[0].shape
    return np.array([[1 if j - i == a["k"] else 0 for j in range(m)] for i in range(n)], dtype=dt).reshape(n, m)


EyeLike = register_op(
    "EyeLike",
    category="shape",
    inputs=[Input("input")],
    outputs=["output"],
    attrs=[Attr("dtype", "dtype", None), Attr("k", "int", 0)],
    infer=_eye_infer,
    reference=_eye_ref,
    doc="A 2-D tensor shaped like the input with ones on diagonal k.",
)


@EyeLike.kernel("eye_numpy", priority=5)
def _eye_kernel(ins, outs, attrs, plan, ws):
    outs[0][...] = np.eye(outs[0].shape[0], outs[0].shape[1], attrs["k"], dtype=outs[0].dtype)


def _trilu_infer(ctx):
    if len(ctx.shape(0)) < 2:
        ctx.fail(f"input must have rank >= 2, got shape {tuple(ctx.shape(0))}")
    if ctx.has(1) and math.prod(ctx.shape(1)) != 1:
        ctx.fail(f"k must be a scalar, got shape {tuple(ctx.shape(1))}")
    return _same(ctx)


def _trilu_k(ins):
    return int(ins[1].reshape(-1)[0]) if len(ins) > 1 and ins[1] is not None else 0


def _trilu_ref(ins, a):
    x = ins[0]
    k = _trilu_k(ins)
    n, m = x.shape[-2:]
    i = np.arange(n).reshape(n, 1)
    j = np.arange(m).reshape(1, m)
    keep = (j - i >= k) if a["upper"] else (j - i <= k)
    return np.where(keep, x, np.zeros((), x.dtype))


Trilu = register_op(
    "Trilu",
    category="shape",
    inputs=[Input("input"), Input("k", (_dt.int64,), optional=True)],
    outputs=["output"],
    attrs=[Attr("upper", "int", 1)],
    infer=_trilu_infer,
    reference=_trilu_ref,
    doc="Upper (triu) or lower (tril) triangle of the last two dims, from diagonal k.",
)


@Trilu.kernel("trilu_numpy", priority=5, applies=_pod)
def _trilu_kernel(ins, outs, attrs, plan, ws):
    x, k = ins[0], _trilu_k(ins)
    k = max(min(k, x.shape[-1] + 1), -x.shape[-2] - 1)  # numpy's tri helpers overflow on huge k
    mask = np.triu(np.ones(x.shape[-2:], bool), k) if attrs["upper"] else np.tril(np.ones(x.shape[-2:], bool), k)
    np.copyto(outs[0], x)
    outs[0][..., ~mask] = 0


def _onehot_depth(ctx_or_value) -> int:
    d = np.asarray(ctx_or_value).reshape(-1)
    if d.size != 1:
        raise ParamInvalidError(f"OneHot: depth must be a scalar, got {d.size} values", op="OneHot")
    if d.dtype.kind == "f" and not np.isfinite(d[0]):
        raise ParamInvalidError(f"OneHot: depth must be a finite number, got {d[0]}", op="OneHot")
    depth = int(d[0])
    if depth < 1:
        raise ParamInvalidError(f"OneHot: depth must be >= 1, got {depth}", op="OneHot")
    return depth


def _onehot_infer(ctx):
    depth = _onehot_depth(_host(ctx, 1, "depth"))
    s = tuple(ctx.shape(0))
    ax = _axis("OneHot", ctx.attrs["axis"], len(s), extra=1)
    if math.prod(ctx.shape(2)) != 2:
        ctx.fail(f"values must hold [off_value, on_value], got shape {tuple(ctx.shape(2))}")
    return [TensorMeta(s[:ax] + (depth,) + s[ax:], ctx.dtype(2))]


def _onehot_ref(ins, a):
    idx, depth, vals = ins
    depth = _onehot_depth(depth)
    ax = a["axis"] % (idx.ndim + 1)
    vals = vals.reshape(-1)
    k = idx.astype(np.int64)
    k = np.where(k < 0, k + depth, k)
    hot = np.arange(depth).reshape((1,) * idx.ndim + (depth,)) == k[..., None]
    return np.moveaxis(np.where(hot, vals[1], vals[0]), -1, ax)


OneHot = register_op(
    "OneHot",
    category="shape",
    inputs=[Input("indices", _dt.NUMERIC), Input("depth", _dt.NUMERIC, host=True), Input("values")],
    outputs=["output"],
    attrs=[Attr("axis", "int", -1)],
    infer=_onehot_infer,
    reference=_onehot_ref,
    doc="One-hot encode indices along a new axis (out-of-range indices give all off_value).",
)


@OneHot.kernel("one_hot_numpy", priority=5, applies=_pod)
def _onehot_kernel(ins, outs, attrs, plan, ws):
    idx, vals, out = ins[0], ins[2].reshape(-1), outs[0]
    depth = out.shape[attrs["axis"] % out.ndim]
    ax = attrs["axis"] % out.ndim
    k = idx.astype(np.int64)
    k = np.where(k < 0, k + depth, k)
    out[...] = vals[0]
    if k.ndim == 0:
        if 0 <= k < depth:
            out[int(k)] = vals[1]
        return
    ok = (k >= 0) & (k < depth)
    pos = list(np.nonzero(ok))
    pos.insert(ax, k[ok])
    out[tuple(pos)] = vals[1]


# ---------------------------------------------------------------------------------------------
# data-dependent shapes: NonZero / Unique / Compress
# ---------------------------------------------------------------------------------------------
NonZero = register_op(
    "NonZero",
    category="shape",
    inputs=[Input("X")],
    outputs=["Y"],
    dynamic_shape=True,
    infer=lambda ctx: [TensorMeta((max(len(ctx.shape(0)), 1), None), I64)],
    reference=lambda ins, a: np.array(np.nonzero(np.atleast_1d(ins[0])), dtype=np.int64),
    doc="Indices of the non-zero elements, shape (rank, count) (output shape depends on the data).",
)
NonZero.kernel("nonzero_numpy", priority=5)(
    lambda ins, outs, attrs, plan, ws: [
        np.stack(np.nonzero(np.atleast_1d(ins[0]))).astype(np.int64)
        if ins[0].size
        else np.zeros((max(ins[0].ndim, 1), 0), np.int64)
    ]
)


def _unique_infer(ctx):
    s = ctx.shape(0)
    ax = ctx.attrs["axis"]
    if ax is None:
        y = (None,)
    else:
        a = _axis("Unique", ax, len(s))
        y = tuple(None if k == a else d for k, d in enumerate(s))
    n_inv = math.prod(s) if ax is None else s[_axis("Unique", ax, len(s))]
    return [TensorMeta(y, ctx.dtype(0)), TensorMeta((None,), I64), TensorMeta((n_inv,), I64), TensorMeta((None,), I64)]


def _unique_ref(ins, a):
    x = ins[0]
    ax = a["axis"]
    if ax is not None:
        ax = _axis("Unique", ax, x.ndim)
        items = [np.take(x, i, axis=ax) for i in range(x.shape[ax])]
    else:
        items = list(x.reshape(-1))
    firsts, inv = [], []
    for i, it in enumerate(items):
        for j, f in enumerate(firsts):
            if np.array_equal(items[f], it):
                inv.append(j)
                break
        else:
            firsts.append(i)
            inv.append(len(firsts) - 1)
    counts = [inv.count(j) for j in range(len(firsts))]
    order = list(range(len(firsts)))
    if a["sorted"]:
        key = (
            (lambda j: tuple(np.asarray(items[firsts[j]]).reshape(-1).tolist()))
            if ax is not None
            else (lambda j: items[firsts[j]])
        )
        order = sorted(order, key=key)
    rank = {j: r for r, j in enumerate(order)}
    sel = [firsts[j] for j in order]
    y = (
        np.stack([items[i] for i in sel], axis=ax)
        if ax is not None and sel
        else (np.array([items[i] for i in sel], dtype=x.dtype) if ax is None else np.take(x, [], axis=ax))
    )
    i64 = np.int64
    return (y, np.array(sel, i64), np.array([rank[j] for j in inv], i64), np.array([counts[j] for j in order], i64))


Unique = register_op(
    "Unique",
    category="shape",
    inputs=[Input("X")],
    dynamic_shape=True,
    outputs=[
        "Y",
        Output("indices", optional=True),
        Output("inverse_indices", optional=True),
        Output("counts", optional=True),
    ],
    attrs=[Attr("axis", "int", None), Attr("sorted", "int", 1)],
    infer=_unique_infer,
    reference=_unique_ref,
    doc="Unique elements (or slices along axis), first indices, inverse indices and counts.",
)
Unique.kernel("unique_numpy", priority=5, applies=_pod)(
    lambda ins, outs, attrs, plan, ws: K.unique(
        ins[0], None if attrs["axis"] is None else attrs["axis"] % ins[0].ndim, attrs["sorted"]
    )
)


def _compress_infer(ctx):
    s = ctx.shape(0)
    if len(ctx.shape(1)) != 1:
        ctx.fail(f"condition must be 1-D, got shape {tuple(ctx.shape(1))}")
    ax = ctx.attrs["axis"]
    if ax is None:
        return [TensorMeta((None,), ctx.dtype(0))]
    a = _axis("Compress", ax, len(s))
    return [TensorMeta(tuple(None if k == a else d for k, d in enumerate(s)), ctx.dtype(0))]


def _compress(ins, attrs):
    x, c = ins
    ax = attrs["axis"]
    n = x.size if ax is None else x.shape[_axis("Compress", ax, x.ndim)]
    if c.size > n:
        if c[n:].any():
            raise ParamInvalidError(
                f"Compress: condition has {c.size} entries (some true beyond the {n} slices of the axis)", op="Compress"
            )
        c = c[:n]
    return np.compress(c.astype(bool), x, axis=None if ax is None else ax % x.ndim)


Compress = register_op(
    "Compress",
    category="shape",
    inputs=[Input("input"), Input("condition", (_dt.bool_,))],
    outputs=["output"],
    attrs=[Attr("axis", "int", None)],
    infer=_compress_infer,
    dynamic_shape=True,
    reference=_compress,
    doc="Keep the slices along axis (or elements of the flattened input) where condition is true.",
)
Compress.kernel("compress_numpy", priority=5)(lambda ins, outs, attrs, plan, ws: [_compress(ins, attrs)])


# ---------------------------------------------------------------------------------------------
# ReverseSequence / CenterCropPad
# ---------------------------------------------------------------------------------------------
def _revseq_axes(op, attrs, rank):
    b, t = int(attrs["batch_axis"]), int(attrs["time_axis"])
    if {b, t} != {0, 1}:
        raise ParamInvalidError(f"{op}: batch_axis/time_axis must be 0 and 1 (one each), got {b}, {t}", op=op)
    if rank < 2:
        raise ParamInvalidError(f"{op}: input must have rank >= 2, got {rank}", op=op)
    return b, t


def _revseq_infer(ctx):
    s = ctx.shape(0)
    b, _ = _revseq_axes("ReverseSequence", ctx.attrs, len(s))
    if tuple(ctx.shape(1)) != (s[b],):
        ctx.fail(f"sequence_lens must have shape ({s[b]},), got {tuple(ctx.shape(1))}")
    return _same(ctx)


def _revseq(ins, attrs, out=None):
    x, lens = ins
    b, t = _revseq_axes("ReverseSequence", attrs, x.ndim)
    out = x.copy() if out is None else out
    if out is not x:
        np.copyto(out, x)
    for i, n in enumerate(lens.reshape(-1)):
        n = int(n)
        if not 0 <= n <= x.shape[t]:
            raise ParamInvalidError(
                f"ReverseSequence: sequence_lens[{i}] = {n} is outside [0, {x.shape[t]}]", op="ReverseSequence"
            )
        src = [slice(None)] * x.ndim
        src[b] = i
        src[t] = slice(0, n)
        dst = list(src)
        src[t] = slice(n - 1, None, -1) if n else slice(0, 0)
        out[tuple(dst)] = x[tuple(src)]
    return out


def _revseq_ref(ins, a):
    x, lens = ins
    b, t = _revseq_axes("ReverseSequence", a, x.ndim)
    out = np.empty_like(x)
    for pos in np.ndindex(*x.shape):
        n = int(lens[pos[b]])
        src = list(pos)
        if pos[t] < n:
            src[t] = n - 1 - pos[t]
        out[pos] = x[tuple(src)]
    return out


ReverseSequence = register_op(
    "ReverseSequence",
    category="shape",
    inputs=[Input("input"), Input("sequence_lens", (_dt.int64,))],
    outputs=["Y"],
    attrs=[Attr("batch_axis", "int", 1), Attr("time_axis", "int", 0)],
    infer=_revseq_infer,
    reference=lambda ins, a: _revseq_ref(ins, a),
    doc="Reverse the first sequence_lens[b] steps of each batch entry along the time axis.",
)
ReverseSequence.kernel("reverse_sequence_numpy", priority=5, applies=_pod)(
    lambda ins, outs, attrs, plan, ws: _revseq(ins, attrs, outs[0])
)


def _ccp_layout(op, shape, target, axes):
    r = len(shape)
    tgt = _ints(target)
    axes = list(range(r)) if axes is None else [_axis(op, a, r, "axes entry") for a in axes]
    if len(tgt) != len(axes):
        raise ParamInvalidError(f"{op}: shape has {len(tgt)} entries for {len(axes)} axes", op=op)
    if any(v < 0 for v in tgt):
        raise ParamInvalidError(f"{op}: shape entries must be >= 0, got {tgt}", op=op)
    out = list(shape)
    maps = [np.arange(d, dtype=np.int64) for d in shape]
    for a, n in zip(axes, tgt):
        d = shape[a]
        out[a] = n
        if n <= d:
            st = (d - n) // 2
            maps[a] = np.arange(st, st + n, dtype=np.int64)
        else:
            m = np.full(n, -1, np.int64)
            st = (n - d) // 2
            m[st : st + d] = np.arange(d)
            maps[a] = m
    return tuple(out), maps


def _ccp_ref(ins, a):
    x, tgt = ins
    out_shape, maps = _ccp_layout("CenterCropPad", x.shape, tgt, a["axes"])
    res = np.zeros(out_shape, x.dtype)
    src = tuple(slice(int(m[m >= 0][0]), int(m[m >= 0][-1]) + 1) if (m >= 0).any() else slice(0, 0) for m in maps)
    dst = tuple(slice(int(np.argmax(m >= 0)), int(np.argmax(m >= 0)) + int((m >= 0).sum())) for m in maps)
    res[dst] = x[src]
    return res


CenterCropPad = register_op(
    "CenterCropPad",
    category="shape",
    inputs=[Input("input_data"), Input("shape", INDEX, host=True)],
    outputs=["output_data"],
    attrs=[Attr("axes", "ints", None)],
    infer=lambda ctx: [
        TensorMeta(
            _ccp_layout("CenterCropPad", ctx.shape(0), _host(ctx, 1, "shape"), ctx.attrs["axes"])[0], ctx.dtype(0)
        )
    ],
    reference=_ccp_ref,
    doc="Center-crop or zero-pad the given axes to a target shape.",
)


@CenterCropPad.kernel(
    "center_crop_pad_maps",
    priority=10,
    applies=_pod,
    plan=lambda ctx: K.plan_maps(
        ctx.shape(0),
        _ccp_layout("CenterCropPad", ctx.shape(0), _host(ctx, 1, "shape"), ctx.attrs["axes"])[1],
        ctx.dtype(0).itemsize,
    ),
)
def _ccp_kernel(ins, outs, attrs, plan, ws):
    K.run_maps(plan, ins[0], outs[0], np.zeros((), outs[0].dtype))


# ---------------------------------------------------------------------------------------------
# functional entry points
# ---------------------------------------------------------------------------------------------
def _shape_of(x):
    return tuple(x.shape)


@api("reshape", "Reshape")
def reshape(x, shape):
    """A reshaped copy like torch.reshape (one -1 is inferred, 0 is a zero-size dim).
    ``opsnn.ops.reshape(x, (2, -1))``; ``shape`` may be an int64 Tensor (e.g. built from
    :func:`shape` of another tensor, so a traced graph follows that tensor's sizes)."""
    return [x, _i64_or_tensor(shape)], {"allowzero": 1}


@api("transpose", "Transpose")
def transpose(x, perm=None, dim1=None):
    """Permute dims by ``perm`` (default: reversed); ``transpose(x, d0, d1)`` swaps two dims like torch."""
    if dim1 is not None:
        r = len(_shape_of(x))
        p = list(range(r))
        d0, d1 = _axis("transpose", perm, r, "dim0"), _axis("transpose", dim1, r, "dim1")
        p[d0], p[d1] = p[d1], p[d0]
        return [x], {"perm": p}
    return [x], {"perm": None if perm is None else [int(v) for v in perm]}


@api("permute", "Transpose")
def permute(x, *dims):
    """torch.permute: ``permute(x, 2, 0, 1)`` or ``permute(x, (2, 0, 1))`` (negative dims allowed)."""
    if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
        dims = tuple(dims[0])
    r = len(_shape_of(x))
    return [x], {"perm": [_axis("permute", d, r, "dim") for d in dims] if len(dims) == r else list(dims)}


@api("concat", "Concat")
def concat(tensors, dim=0):
    """Join tensors along ``dim``. ``opsnn.ops.concat([a, b], dim=1)``."""
    return list(tensors), {"axis": int(dim)}


@api("split", "Split", sequence=True)
def split(x, split_size_or_sections, dim=0):
    """torch.split: an int is a chunk size (the last chunk may be smaller), a list gives the sizes."""
    shape = _shape_of(x)
    d = shape[_axis("split", dim, len(shape), "dim")]
    if isinstance(split_size_or_sections, (int, np.integer)):
        size = int(split_size_or_sections)
        if size <= 0:
            raise ParamInvalidError(f"split: split_size must be > 0, got {size}", op="Split")
        sizes = [size] * (d // size) + ([d % size] if d % size else [])
        sizes = sizes or [0]
    else:
        sizes = [int(v) for v in split_size_or_sections]
    return [x, _i64(sizes)], {"axis": int(dim)}, len(sizes)


def slice_(x, starts, ends, axes=None, steps=None):
    """ONNX Slice: ``slice(x, [1], [-1], axes=[0], steps=[2])`` (clamped; negative steps allowed)."""
    return [
        x,
        _i64_or_tensor(starts),
        _i64_or_tensor(ends),
        None if axes is None else _i64(axes),
        None if steps is None else _i64_or_tensor(steps),
    ], {}


slice_ = api("slice", "Slice")(slice_)


@api("shape", "Shape")
def shape(x, start=0, end=None):
    """``x``'s shape (dims ``start`` to ``end``) as an int64 tensor, like ONNX Shape. Unlike
    ``x.shape`` it is recorded when tracing, so sizes computed from it (a Slice's ends, a Reshape's
    target) follow the input a compiled graph is run with::

        pos = ops.slice(position_ids, [0], ops.shape(ids, 1, 2), axes=[1])   # the first seq ids
    """
    attrs = {"start": int(start)}
    if end is not None:
        attrs["end"] = int(end)
    return [x], attrs


@api("gather", "Gather")
def gather(x, indices, axis=0):
    """ONNX Gather (numpy.take): slices of ``x`` along ``axis`` at ``indices`` (not torch.gather, which is
    :func:`gather_elements`)."""
    return [x, indices if isinstance(indices, Tensor) else _index_tensor(indices)], {"axis": int(axis)}


@api("index_select", "Gather")
def index_select(x, dim, index):
    """torch.index_select: rows of ``x`` along ``dim`` at the 1-D ``index``."""
    idx = _index_tensor(index)
    if idx.ndim != 1:
        raise ParamInvalidError(f"index_select: index must be 1-D, got shape {idx.shape}", op="Gather")
    return [x, idx], {"axis": int(dim)}


@api("embedding", "Embedding", domain="opsnn")
def embedding(ids, weight, padding_idx=None):
    """Rows of ``weight`` [vocab, dim] for integer ``ids`` (any shape). Ids are checked against the vocabulary
    at call (prepare) time; ``ParamInvalidError`` names the first bad id. ``padding_idx`` (torch's): that
    row's gradient stays zero."""
    ids_t = ids if isinstance(ids, Tensor) else Tensor(np.asarray(ids))
    w = weight if isinstance(weight, Tensor) else as_tensor(weight)
    if w.ndim != 2:
        raise ParamInvalidError(f"embedding: weight must be 2-D [vocab, dim], got shape {w.shape}", op="Embedding")
    if ids_t.dtype not in INDEX:
        raise DTypeError(f"embedding: ids must be int32 or int64, got {_dt.name(ids_t.dtype)}", op="Embedding")
    vocab = w.shape[0]
    v = checked_value(ids_t)  # while tracing: the trace call checks here, the graph at later calls
    bad = (v < 0) | (v >= vocab)
    if bad.any():
        pos = tuple(int(p) for p in np.argwhere(bad)[0])
        raise ParamInvalidError(
            f"embedding: id {int(v[pos])} at position {pos} is out of range for a vocabulary of "
            f"{vocab} rows (valid: [0, {vocab - 1}])",
            op="Embedding",
        )
    if tracing_training_step():  # later calls of a compiled step: a negative id becomes one the lookup refuses too
        from .elementwise import lt, where

        ids_t = where(lt(ids_t, Tensor(np.zeros((), ids_t.dtype))), Tensor(np.asarray(vocab, ids_t.dtype)), ids_t)
    return [w, ids_t], {} if padding_idx is None else {"padding_idx": int(padding_idx)}


@api("embedding_grad", "EmbeddingGrad", domain="opsnn")
def embedding_grad(grad_output, ids, num_rows, padding_idx=None):
    """Gradient of ``embedding(ids, weight)`` w.r.t. ``weight`` (``num_rows`` rows): each row of
    ``grad_output`` (``ids.shape + (dim,)``) added into its id's row; the ``padding_idx`` row stays
    zero (torch's ``embedding_dense_backward``).

    >>> import opsnn, numpy as np
    >>> g = opsnn.tensor(np.ones((3, 2), np.float32))
    >>> opsnn.ops.embedding_grad(g, np.array([2, 0, 2]), 4).numpy()
    array([[1., 1.],
           [0., 0.],
           [2., 2.],
           [0., 0.]], dtype=float32)
    """
    a = {"num_rows": int(num_rows)}
    if padding_idx is not None:
        a["padding_idx"] = int(padding_idx)
    return [grad_output, ids], a


_TORCH_PAD_MODES = {
    "constant": "constant",
    "reflect": "reflect",
    "replicate": "edge",
    "edge": "edge",
    "circular": "wrap",
    "wrap": "wrap",
}


@api("pad", "Pad")
def pad(x, pads, mode="constant", value=0):
    """torch.nn.functional.pad: ``pads`` = (last_begin, last_end, 2nd_last_begin, 2nd_last_end, ...); negative
    values crop. Modes: constant, reflect, replicate (= edge), circular (= wrap)."""
    pads = [int(v) for v in pads]
    if len(pads) % 2:
        raise ParamInvalidError(f"pad: pads must have an even length, got {len(pads)}", op="Pad")
    r = len(_shape_of(x))
    n = len(pads) // 2
    if n > r:
        raise ParamInvalidError(f"pad: {n} dims of padding for a {r}-D input", op="Pad")
    m = _TORCH_PAD_MODES.get(_str(mode))
    if m is None:
        raise ParamInvalidError(f"pad: mode must be one of {sorted(_TORCH_PAD_MODES)}, got {mode!r}", op="Pad")
    axes = [r - 1 - i for i in range(n)]
    begins = [pads[2 * i] for i in range(n)]
    ends = [pads[2 * i + 1] for i in range(n)]
    xt = _to_tensor(x)
    cv = Tensor(np.asarray(value).astype(xt.dtype).reshape(()))
    return [xt, _i64(begins + ends), cv, _i64(axes)], {"mode": m}


@api("flatten", "Reshape")
def flatten(x, start_dim=0, end_dim=-1):
    """torch.flatten: merge dims start_dim..end_dim into one."""
    s = _shape_of(x)
    r = len(s)
    if r == 0:
        return [x, _i64([1])], {}
    a, b = _axis("flatten", start_dim, r, "start_dim"), _axis("flatten", end_dim, r, "end_dim")
    if a > b:
        raise ParamInvalidError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}", op="Reshape")
    if 0 in s:  # a zero-size tensor: every dim spelled out (-1 cannot be inferred from 0 elements)
        return [x, _i64(list(s[:a]) + [math.prod(s[a : b + 1])] + list(s[b + 1 :]))], {"allowzero": 1}
    # the dims before start_dim copied (0) and the merged one inferred (-1): a traced graph then
    # flattens whatever batch size it is run with
    return [x, _i64([0] * a + [-1] + list(s[b + 1 :]))], {}


@api("squeeze", "Squeeze")
def squeeze(x, dim=None):
    """Remove size-1 dims (all, or ``dim``: an int or a tuple of ints)."""
    if dim is None:
        return [x], {}
    return [x, _i64([dim] if isinstance(dim, (int, np.integer)) else list(dim))], {}


@api("unsqueeze", "Unsqueeze")
def unsqueeze(x, dim):
    """Insert a size-1 dim at ``dim`` (an int, or a tuple of output positions)."""
    return [x, _i64([dim] if isinstance(dim, (int, np.integer)) else list(dim))], {}


@api("expand", "Expand")
def expand(x, *shape):
    """torch.expand: broadcast to ``shape`` (-1 keeps a dim). Returns a copy."""
    if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
        shape = tuple(shape[0])
    s = _shape_of(x)
    lead = len(shape) - len(s)
    tgt = [s[i - lead] if (v == -1 and i >= lead) else int(v) for i, v in enumerate(shape)]
    return [x, _i64(tgt)], {}


@api("tile", "Tile")
def tile(x, repeats):
    """torch.tile: repeat along each dim (fewer repeats than dims pad with 1s in front)."""
    reps = [int(v) for v in ([repeats] if isinstance(repeats, (int, np.integer)) else repeats)]
    xt = _to_tensor(x)
    if len(reps) < xt.ndim:
        reps = [1] * (xt.ndim - len(reps)) + reps
    elif len(reps) > xt.ndim:
        xt = xt.reshape((1,) * (len(reps) - xt.ndim) + xt.shape)
    return [xt, _i64(reps)], {}


@api("identity", "Identity")
def identity(x):
    """A copy of ``x``."""
    return [x], {}


@api("gather_elements", "GatherElements")
def gather_elements(x, indices, axis=0):
    """ONNX GatherElements (= torch.gather(x, axis, indices))."""
    return [x, indices if isinstance(indices, Tensor) else _index_tensor(indices)], {"axis": int(axis)}


@api("gather_nd", "GatherND")
def gather_nd(x, indices, batch_dims=0):
    """ONNX GatherND: slices addressed by the last dim of ``indices``."""
    return [x, indices if isinstance(indices, Tensor) else _index_tensor(indices)], {"batch_dims": int(batch_dims)}


@api("scatter_elements", "ScatterElements")
def scatter_elements(x, indices, updates, axis=0, reduction="none"):
    """ONNX ScatterElements (torch.scatter / scatter_reduce with reduction add, mul, max, min)."""
    return [x, indices if isinstance(indices, Tensor) else _index_tensor(indices), updates], {
        "axis": int(axis),
        "reduction": reduction,
    }


@api("scatter_nd", "ScatterND")
def scatter_nd(x, indices, updates, reduction="none"):
    """ONNX ScatterND."""
    return [x, indices if isinstance(indices, Tensor) else _index_tensor(indices), updates], {"reduction": reduction}


@api("depth_to_space", "DepthToSpace")
def depth_to_space(x, blocksize, mode="DCR"):
    """ONNX DepthToSpace on NCHW."""
    return [x], {"blocksize": int(blocksize), "mode": mode}


@api("pixel_shuffle", "DepthToSpace")
def pixel_shuffle(x, upscale_factor):
    """torch.nn.functional.pixel_shuffle (= DepthToSpace in CRD mode)."""
    return [x], {"blocksize": int(upscale_factor), "mode": "CRD"}


@api("space_to_depth", "SpaceToDepth")
def space_to_depth(x, blocksize, mode="DCR"):
    """ONNX SpaceToDepth on NCHW."""
    return [x], {"blocksize": int(blocksize), "mode": mode}


@api("pixel_unshuffle", "SpaceToDepth")
def pixel_unshuffle(x, downscale_factor):
    """torch.nn.functional.pixel_unshuffle (= SpaceToDepth in CRD mode)."""
    return [x], {"blocksize": int(downscale_factor), "mode": "CRD"}


@api("arange", "Range")
def arange(start, end=None, step=1, dtype=None):
    """torch.arange: ``arange(5)``, ``arange(1, 2.5, 0.5)``."""
    if end is None:
        start, end = 0, start
    if dtype is None:
        dtype = _dt.float32 if any(isinstance(v, float) for v in (start, end, step)) else _dt.int64
    dt = _dt.get(dtype)
    return [Tensor(np.asarray(v, dt)) for v in (start, end, step)], {}


@api("constant_of_shape", "ConstantOfShape")
def constant_of_shape(shape, value=0.0, dtype=None):
    """A tensor of ``shape`` filled with ``value`` (dtype: ``dtype`` or the value's)."""
    v = np.asarray(value, _dt.get(dtype)) if dtype is not None else constant_value(value)
    return [_i64(shape)], {"value": v.reshape(1)}


@api("eye_like", "EyeLike")
def eye_like(x, k=0, dtype=None):
    """Ones on diagonal ``k`` of a 2-D tensor shaped like ``x``."""
    return [x], {"k": int(k), "dtype": None if dtype is None else _dt.name(_dt.get(dtype))}


@api("triu", "Trilu")
def triu(x, diagonal=0):
    """Upper triangle of the last two dims (torch.triu)."""
    return [x, Tensor(np.asarray(diagonal, np.int64))], {"upper": 1}


@api("tril", "Trilu")
def tril(x, diagonal=0):
    """Lower triangle of the last two dims (torch.tril)."""
    return [x, Tensor(np.asarray(diagonal, np.int64))], {"upper": 0}


@api("one_hot", "OneHot")
def one_hot(indices, num_classes=-1):
    """torch.nn.functional.one_hot: int64 0/1 along a new last dim (num_classes=-1: max index + 1)."""
    idx = indices if isinstance(indices, Tensor) else _index_tensor(indices)
    if num_classes == -1:
        num_classes = int(idx.numpy().max()) + 1 if idx.numel else 0
    return [idx, Tensor(np.asarray(num_classes, np.int64)), Tensor(np.array([0, 1], np.int64))], {"axis": -1}


@api("nonzero", "NonZero")
def nonzero(x):
    """Indices of non-zero elements as a (rank, count) int64 tensor (ONNX/numpy layout, not torch's)."""
    return [x], {}


@api("unique", "Unique")
def unique(x, sorted=True, dim=None):
    """ONNX Unique: (values, first indices, inverse indices, counts)."""
    return [x], {"sorted": int(bool(sorted)), "axis": None if dim is None else int(dim)}, 4


@api("compress", "Compress")
def compress(x, condition, axis=None):
    """numpy.compress: keep slices along ``axis`` where ``condition`` is true."""
    c = condition if isinstance(condition, Tensor) else Tensor(np.asarray(condition, bool))
    return [x, c], {"axis": None if axis is None else int(axis)}


@api("reverse_sequence", "ReverseSequence")
def reverse_sequence(x, sequence_lens, batch_axis=1, time_axis=0):
    """ONNX ReverseSequence."""
    lens = sequence_lens if isinstance(sequence_lens, Tensor) else Tensor(np.asarray(sequence_lens, np.int64))
    return [x, lens], {"batch_axis": int(batch_axis), "time_axis": int(time_axis)}


@api("center_crop_pad", "CenterCropPad")
def center_crop_pad(x, shape, axes=None):
    """Center-crop or zero-pad ``axes`` (default all) to ``shape``."""
    return [x, _i64(shape)], {"axes": None if axes is None else [int(a) for a in axes]}


def __getattr__(name):
    # `slice` is exported without shadowing the builtin inside this module
    if name == "slice":
        return slice_
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "embedding_grad",
    "reshape",
    "transpose",
    "permute",
    "concat",
    "split",
    "slice",
    "shape",
    "gather",
    "index_select",
    "embedding",
    "pad",
    "flatten",
    "squeeze",
    "unsqueeze",
    "expand",
    "tile",
    "identity",
    "gather_elements",
    "gather_nd",
    "scatter_elements",
    "scatter_nd",
    "depth_to_space",
    "pixel_shuffle",
    "space_to_depth",
    "pixel_unshuffle",
    "arange",
    "constant_of_shape",
    "eye_like",
    "triu",
    "tril",
    "one_hot",
    "nonzero",
    "unique",
    "compress",
    "reverse_sequence",
    "center_crop_pad",
]
