"""Reduction ops (ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare, Var,
ArgMax/ArgMin, CumSum): records, kernel registration and functional entry points.

ONNX (latest opset) semantics: ``axes`` is an optional int64 *input* read at prepare
time; no axes (or empty axes) reduces everything unless ``noop_with_empty_axes=1``, in
which case nothing is reduced and only the op's elementwise part runs (ReduceSumSquare
acts as Square). Empty reductions give the op's identity (sum 0, max -inf, ...).

>>> import opsnn, numpy as np
>>> x = opsnn.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
>>> opsnn.ops.sum(x, dim=1).numpy()
array([ 3., 12.], dtype=float32)

The entry points ``sum``, ``max`` and ``min`` shadow Python builtins in this module, so
its helpers use ``builtins.max``/``builtins.min``/``math.fsum`` explicitly.
"""

from __future__ import annotations

import builtins
import math

import numpy as np

from ... import dtypes as _dt
from ...errors import ParamInvalidError
from ...kernels.cpu import bf16_reduce as KB
from ...kernels.cpu import reduction as K
from ...tensor import as_tensor
from ..api import api
from ..registry import Attr, Input, TensorMeta, register_op

FLOAT = _dt.FLOATS
_F32_64 = (_dt.float32, _dt.float64)
AXES_DTYPES = (_dt.int64, _dt.int32)
#: integers the int64 numpy/numba kernels handle exactly (uint64 could wrap: reference only)
_INT_NATIVE = (_dt.int8, _dt.int16, _dt.int32, _dt.int64, _dt.uint8, _dt.uint16, _dt.uint32)
_NUMERIC = FLOAT + _dt.INTEGERS
_NUMERIC_BOOL = _NUMERIC + (_dt.bool_,)


# -- axes helpers (shared by infer, plan and reference) -----------------------------------------
def normalize_axes(op: str, rank: int, axes, noop: bool) -> tuple:
    """Sorted non-negative axes to reduce; ``()`` when nothing is reduced (noop)."""
    if axes is None or np.size(axes) == 0:
        return () if noop else tuple(range(rank))
    arr = np.asarray(axes)
    if arr.dtype.kind not in "iu":
        raise ParamInvalidError(f"{op}: 'axes' must be integers, got dtype {arr.dtype}", op=op)
    out = []
    for a in arr.reshape(-1).tolist():
        if not -rank <= a < rank:
            raise ParamInvalidError(
                f"{op}: axes value {a} is out of range for a rank-{rank} input; expected {-rank}..{rank - 1}", op=op
            )
        a = a + rank if a < 0 else a
        if a in out:
            raise ParamInvalidError(f"{op}: axis {a} appears more than once in axes {arr.tolist()}", op=op)
        out.append(a)
    return tuple(sorted(out))


def reduced_shape(shape: tuple, axes: tuple, keepdims: bool) -> tuple:
    if keepdims:
        return tuple(1 if d in axes else n for d, n in enumerate(shape))
    return tuple(n for d, n in enumerate(shape) if d not in axes)


def _ctx_axes(ctx) -> tuple:
    op = ctx.op.name
    value = None
    if ctx.has(1):
        value = ctx.value(1)
        if value is None:
            ctx.fail("input 'axes' must be known at prepare time (a constant or host tensor)")
        if np.ndim(value) > 1:
            raise ParamInvalidError(f"{op}: 'axes' must be a 1-D tensor, got shape {np.shape(value)}", op=op)
    return normalize_axes(op, len(ctx.shape(0)), value, bool(ctx.attrs["noop_with_empty_axes"]))


def _reduce_infer(ctx):
    axes = _ctx_axes(ctx)
    return [TensorMeta(reduced_shape(ctx.shape(0), axes, bool(ctx.attrs["keepdims"])), ctx.dtype(0))]


def _empty_value(kind: str, dtype: np.dtype):
    """ONNX's value of a reduction over no elements."""
    if kind in ("sum", "l1", "l2", "sumsquare"):
        return 0
    if kind == "prod":
        return 1
    if kind in ("logsum", "logsumexp"):
        return -np.inf
    if kind in ("mean", "var"):
        return np.nan
    big = dtype == _dt.bool_
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return info.min if kind == "max" else info.max
    if big:
        return kind == "min"
    return -np.inf if kind == "max" else np.inf


# -- references (numpy, float64 / int64 accumulation) -------------------------------------------
def _reduce_ref(kind: str):
    def reference(ins, attrs):
        x = ins[0]
        axes = normalize_axes(kind, x.ndim, ins[1] if len(ins) > 1 else None, bool(attrs["noop_with_empty_axes"]))
        keep = bool(attrs["keepdims"])
        if x.dtype == _dt.bool_ or (kind in ("max", "min") and x.dtype.kind in "iu"):
            w = x  # min/max are exact in the input's own dtype (uint64 above 2**63 does not fit int64)
        elif _dt.is_float(x.dtype) or kind in ("l2", "logsum", "logsumexp", "mean", "var"):  # bf16 too
            w = x.astype(np.float64)
        else:
            w = x.astype(np.int64)
        n = math.prod(x.shape[a] for a in axes)
        _check_empty_int(kind, x.dtype, n, math.prod(reduced_shape(x.shape, axes, keep)))
        with np.errstate(all="ignore"):
            if kind == "sum":
                r = np.sum(w, axis=axes, keepdims=keep)
            elif kind == "mean":
                r = (
                    np.sum(w, axis=axes, keepdims=keep) / n
                    if n
                    else np.full(reduced_shape(x.shape, axes, keep), np.nan)
                )
            elif kind == "max":
                r = np.max(w, axis=axes, keepdims=keep, initial=_empty_value("max", x.dtype))
            elif kind == "min":
                r = np.min(w, axis=axes, keepdims=keep, initial=_empty_value("min", x.dtype))
            elif kind == "prod":
                r = np.prod(w, axis=axes, keepdims=keep)
            elif kind == "l1":
                r = np.sum(np.abs(w), axis=axes, keepdims=keep)
            elif kind == "l2":
                r = np.sqrt(np.sum(w * w, axis=axes, keepdims=keep))
            elif kind == "sumsquare":
                r = np.sum(w * w, axis=axes, keepdims=keep)
            elif kind == "logsum":
                r = np.log(np.sum(w, axis=axes, keepdims=keep))
            elif kind == "logsumexp":
                m = np.max(w, axis=axes, keepdims=True, initial=-np.inf)
                finite = np.isfinite(m)
                s = np.sum(np.exp(w - np.where(finite, m, 0)), axis=axes, keepdims=True)
                r = np.where(finite, np.log(s) + np.where(finite, m, 0), m)
                if not keep:
                    r = r.reshape(reduced_shape(x.shape, axes, False))
            elif kind == "var":
                c = float(attrs["correction"])
                mean = np.sum(w, axis=axes, keepdims=True) / n if n else np.nan
                r = np.sum((w - mean) ** 2, axis=axes, keepdims=keep) / builtins.max(n - c, 0.0)
            else:  # pragma: no cover
                raise AssertionError(kind)
            return np.asarray(r).astype(x.dtype)

    return reference


# -- kernels -------------------------------------------------------------------------------------
def _float_plan(kind: str):
    def plan(ctx):
        axes = _ctx_axes(ctx)
        itemsize = 8 if ctx.dtype(0) == _dt.float64 else 4
        corr = float(ctx.attrs.get("correction", 0.0))
        return K.plan_reduce(tuple(ctx.shape(0)), axes, kind, itemsize, corr)

    return plan


#: the ops whose value over no elements is not finite (the integer kernels refuse it)
_OP_OF_KIND = {"mean": "ReduceMean", "var": "Var", "logsum": "ReduceLogSum", "logsumexp": "ReduceLogSumExp"}


def _check_empty_int(kind: str, dtype, n: int, out_size: int) -> None:
    """An integer reduction over no elements whose ONNX value (NaN, -inf) no integer holds: refused."""
    e = _empty_value(kind, dtype)
    if n == 0 and out_size and dtype != _dt.bool_ and dtype.kind in "iu" and not np.isfinite(e):
        op = _OP_OF_KIND[kind]
        raise ParamInvalidError(f"{op}: a reduction over no elements is {e}, which {dtype} cannot hold", op=op)


def _int_plan(kind: str):
    def plan(ctx):
        p = K.plan_reduce(tuple(ctx.shape(0)), _ctx_axes(ctx), kind, ctx.dtype(0).itemsize)
        _check_empty_int(kind, ctx.dtype(0), p.R, 0 if p.empty_output else 1)
        return p, _empty_value(kind, ctx.dtype(0))

    return plan


def _run_float(ins, outs, attrs, plan, ws):
    K.reduce_float(ins[0], outs[0], plan, ws)


def _run_int(ins, outs, attrs, plan, ws):
    K.reduce_numpy(ins[0], outs[0], plan[0], plan[1])


def _register_reduce(name: str, kind: str, dtypes: tuple, doc: str, domain: str = "", extra_attrs=()):
    rec = register_op(
        name,
        category="reduction",
        domain=domain,
        inputs=[Input("data", dtypes), Input("axes", AXES_DTYPES, optional=True, host=True)],
        outputs=["reduced"],
        attrs=[Attr("keepdims", "int", 1), Attr("noop_with_empty_axes", "int", 0), *extra_attrs],
        infer=_reduce_infer,
        reference=_reduce_ref(kind),
        doc=doc,
    )
    rec.kernel(
        "reduce_numba",
        dtypes=_F32_64,
        priority=10,
        plan=_float_plan(kind),
        workspace=lambda ctx, plan: plan.workspace,
        doc="one pass over an (outer, R, inner) view; float64 accumulation",
    )(_run_float)
    ints = tuple(d for d in dtypes if d in _INT_NATIVE or d == _dt.bool_)
    if ints:
        rec.kernel(
            "reduce_numpy_int",
            dtypes=ints,
            priority=5,
            plan=_int_plan(kind),
            doc="numpy reductions over the planned view, int64 accumulation",
        )(_run_int)
    return rec


ReduceSum = _register_reduce("ReduceSum", "sum", _NUMERIC, "sum over axes")


def _bf16_sum_view(ctx):
    """The (A, outer, R, inner) view of a bfloat16 ReduceSum, summed over A and R, or why the native
    kernel does not take it: the reduced axes are one block (A = 1) or two around one kept block
    with nothing after them (a convolution bias gradient's N and H*W, inner = 1)."""
    if ctx.dtype(0) != _dt.bfloat16:
        return "bfloat16 input only"
    shape, axes = tuple(ctx.shape(0)), _ctx_axes(ctx)
    sizes, flags = K.coalesce(shape, axes)
    if flags == [True, False, True]:
        return sizes[0], sizes[1], sizes[2], 1
    p = K.plan_reduce(shape, axes, "sum", 2)
    if p.perm is not None:
        return "reduced axes in one block, or two around one kept block at the end, only"
    return 1, p.outer, p.R, p.inner


def _bf16_sum_applies(ctx):
    v = _bf16_sum_view(ctx)
    return v if isinstance(v, str) else True


def _bf16_sum_plan(ctx):
    A, outer, R, inner = _bf16_sum_view(ctx)
    return KB.plan(outer, R, inner, A=A)


ReduceSum.kernel(
    "reduce_sum_numba_bf16",
    dtypes=(_dt.bfloat16,),
    priority=11,  # before reduce_numba, which takes bfloat16 through the fp32 adapter
    applies=_bf16_sum_applies,
    plan=_bf16_sum_plan,
    doc="bfloat16 read in blocks, float64 accumulation, rounded once (no float32 copy of the input or permuted copy)",
)(lambda ins, outs, attrs, plan, ws: KB.sum_bf16(ins[0], outs[0], plan))
ReduceMean = _register_reduce("ReduceMean", "mean", _NUMERIC, "mean over axes (NaN when empty)")
ReduceMax = _register_reduce("ReduceMax", "max", _NUMERIC_BOOL, "max over axes (-inf / dtype min when empty)")
ReduceMin = _register_reduce("ReduceMin", "min", _NUMERIC_BOOL, "min over axes (+inf / dtype max when empty)")
ReduceProd = _register_reduce("ReduceProd", "prod", _NUMERIC, "product over axes")
ReduceL1 = _register_reduce("ReduceL1", "l1", _NUMERIC, "sum of |x| over axes")
ReduceL2 = _register_reduce("ReduceL2", "l2", _NUMERIC, "sqrt(sum(x^2)) over axes")
ReduceLogSum = _register_reduce("ReduceLogSum", "logsum", _NUMERIC, "log(sum(x)) over axes")
ReduceLogSumExp = _register_reduce(
    "ReduceLogSumExp", "logsumexp", _NUMERIC, "log(sum(exp(x))) over axes, computed as max + log(sum(exp(x - max)))"
)
ReduceSumSquare = _register_reduce("ReduceSumSquare", "sumsquare", _NUMERIC, "sum(x^2) over axes")
Var = _register_reduce(
    "Var",
    "var",
    FLOAT,
    "variance over axes: sum((x - mean)^2) / max(N - correction, 0)",
    domain="opsnn",
    extra_attrs=[Attr("correction", "float", 1.0)],
)


# -- ArgMax / ArgMin ------------------------------------------------------------------------------
def _arg_axis(ctx) -> int:
    shape = ctx.shape(0)
    r = len(shape)
    axis = int(ctx.attrs["axis"])
    if not -r <= axis < r:
        raise ParamInvalidError(
            f"{ctx.op.name}: attribute 'axis' is {axis}; expected {-r}..{r - 1} for a rank-{r} input", op=ctx.op.name
        )
    return axis + r if axis < 0 else axis


def _arg_infer(ctx):
    shape = tuple(ctx.shape(0))
    axis = _arg_axis(ctx)
    out = reduced_shape(shape, (axis,), bool(ctx.attrs["keepdims"]))
    if shape[axis] == 0 and math.prod(out) != 0:
        raise ParamInvalidError(
            f"{ctx.op.name}: cannot take the index of an extreme over axis {axis} of size 0 (input shape {shape})",
            op=ctx.op.name,
        )
    return [TensorMeta(out, _dt.int64)]


def _arg_ref(is_max: bool):
    def reference(ins, attrs):
        x = ins[0]
        axis = int(attrs["axis"]) % x.ndim
        fn = np.argmax if is_max else np.argmin
        if attrs["select_last_index"]:
            r = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis)
        else:
            r = fn(x, axis=axis)
        if attrs["keepdims"]:
            r = np.expand_dims(r, axis)
        return np.asarray(r, dtype=np.int64)

    return reference


def _arg_plan(ctx):
    return K.plan_arg(tuple(ctx.shape(0)), _arg_axis(ctx))


def _arg_kernel(is_max: bool, fn):
    def run(ins, outs, attrs, plan, ws):
        fn(ins[0], outs[0], plan, is_max, bool(attrs["select_last_index"]))

    return run


def _register_arg(name: str, is_max: bool):
    rec = register_op(
        name,
        category="reduction",
        inputs=[Input("data", _NUMERIC)],
        outputs=["reduced"],
        attrs=[Attr("axis", "int", 0), Attr("keepdims", "int", 1), Attr("select_last_index", "int", 0)],
        infer=_arg_infer,
        reference=_arg_ref(is_max),
        doc=f"index of the {'max' if is_max else 'min'} along axis (NaN counts as the extreme; int64)",
    )
    rec.kernel(
        "argreduce_numba",
        dtypes=_F32_64,
        priority=10,
        plan=_arg_plan,
        doc="vectorised extreme + blocked search (rows); running best per column (inner)",
    )(_arg_kernel(is_max, K.argreduce))
    rec.kernel(
        "argreduce_numpy_int",
        dtypes=_INT_NATIVE + (_dt.uint64,),
        priority=5,
        plan=_arg_plan,
        doc="numpy argmax/argmin over the planned view (integers)",
    )(_arg_kernel(is_max, K.argreduce_numpy))
    return rec


ArgMax = _register_arg("ArgMax", True)
ArgMin = _register_arg("ArgMin", False)


# -- CumSum ---------------------------------------------------------------------------------------
def _cumsum_axis(ctx) -> int:
    op = ctx.op.name
    value = ctx.value(1)
    if value is None:
        ctx.fail("input 'axis' must be known at prepare time (a constant or host tensor)")
    if np.size(value) != 1 or np.ndim(value) > 1:
        raise ParamInvalidError(
            f"{op}: 'axis' must be a scalar or a 1-element 1-D tensor, got shape {np.shape(value)}", op=op
        )
    r = len(ctx.shape(0))
    a = int(np.asarray(value).reshape(-1)[0])
    if not -r <= a < r:
        raise ParamInvalidError(f"{op}: axis {a} is out of range for a rank-{r} input; expected {-r}..{r - 1}", op=op)
    return a + r if a < 0 else a


def _cumsum_ref(ins, attrs):
    x = ins[0]
    axis = int(np.asarray(ins[1]).reshape(-1)[0]) % x.ndim
    acc = np.float64 if _dt.is_float(x.dtype) else np.int64  # bfloat16's numpy kind is "V", not "f"
    n = x.shape[axis]
    out = np.zeros(x.shape, acc)
    idx = [slice(None)] * x.ndim
    order = range(n - 1, -1, -1) if attrs["reverse"] else range(n)
    run = np.zeros(x.shape[:axis] + x.shape[axis + 1 :], acc)
    for i in order:
        idx[axis] = i
        if attrs["exclusive"]:
            out[tuple(idx)] = run
            run = run + x[tuple(idx)]
        else:
            run = run + x[tuple(idx)]
            out[tuple(idx)] = run
    return out.astype(x.dtype)


CumSum = register_op(
    "CumSum",
    category="reduction",
    inputs=[Input("x", _NUMERIC), Input("axis", AXES_DTYPES, host=True)],
    outputs=["y"],
    attrs=[Attr("exclusive", "int", 0), Attr("reverse", "int", 0)],
    infer=lambda ctx: (_cumsum_axis(ctx), [TensorMeta(tuple(ctx.shape(0)), ctx.dtype(0))])[1],
    reference=_cumsum_ref,
    doc="cumulative sum along axis (exclusive / reverse variants)",
)
CumSum.kernel(
    "cumsum_numpy",
    dtypes=_F32_64 + _INT_NATIVE,
    priority=5,
    plan=_cumsum_axis,
    doc="numpy cumsum with float64/int64 accumulation",
)(lambda ins, outs, attrs, plan, ws: K.cumsum(ins[0], outs[0], plan, bool(attrs["exclusive"]), bool(attrs["reverse"])))


# -- functional entry points (torch-style names and arguments) -------------------------------------
def _dims(dim):
    """torch ``dim`` (None, int or sequence) -> the ONNX ``axes`` host input (None: all)."""
    if dim is None:
        return None
    dims = [dim] if isinstance(dim, (int, np.integer)) else list(dim)
    if not dims:
        return None
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in dims):
        raise ParamInvalidError(f"dim must be an int or a sequence of ints, got {dim!r}")
    return np.asarray(dims, dtype=np.int64)


def _reduce_entry(x, dim, keepdim):
    return [x, _dims(dim)], {"keepdims": int(bool(keepdim))}


def _flat_for_arg(x, dim, keepdim):
    """torch argmax/argmin: ``dim=None`` means over the flattened tensor."""
    if dim is not None:
        if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
            raise ParamInvalidError(f"dim must be an int or None, got {dim!r}")
        return [x], {"axis": int(dim), "keepdims": int(bool(keepdim))}
    t = as_tensor(x)
    shape = (1,) * (t.ndim - 1) + (t.numel,) if keepdim and t.ndim else (t.numel,)
    return [t.reshape(shape)], {"axis": -1, "keepdims": int(bool(keepdim))}


@api("sum", "ReduceSum")
def sum(x, dim=None, keepdim=False):  # noqa: A001 - torch's name
    """Sum over ``dim`` (all dims when None). ``opsnn.ops.sum(x, dim=(0, 2), keepdim=True)``"""
    return _reduce_entry(x, dim, keepdim)


@api("mean", "ReduceMean")
def mean(x, dim=None, keepdim=False):
    """Mean over ``dim`` (all dims when None); float math for floats, truncated for ints."""
    return _reduce_entry(x, dim, keepdim)


@api("max", "ReduceMax")
def max(x, dim=None, keepdim=False):  # noqa: A001
    """Max *values* over ``dim`` (NaN propagates); use :func:`argmax` for indices."""
    return _reduce_entry(x, dim, keepdim)


@api("min", "ReduceMin")
def min(x, dim=None, keepdim=False):  # noqa: A001
    """Min *values* over ``dim`` (NaN propagates); use :func:`argmin` for indices."""
    return _reduce_entry(x, dim, keepdim)


@api("prod", "ReduceProd")
def prod(x, dim=None, keepdim=False):
    """Product over ``dim`` (all dims when None)."""
    return _reduce_entry(x, dim, keepdim)


@api("logsumexp", "ReduceLogSumExp")
def logsumexp(x, dim=None, keepdim=False):
    """``log(sum(exp(x)))`` over ``dim``, overflow-safe."""
    return _reduce_entry(x, dim, keepdim)


@api("var", "Var", domain="opsnn")
def var(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """Variance over ``dim`` like ``torch.var``: divides by ``N - correction`` (default 1;
    ``unbiased=False`` means 0). ``opsnn.ops.var(x, dim=1, correction=0)``"""
    if correction is not None and unbiased is not None:
        raise ParamInvalidError("var: give either unbiased or correction, not both")
    c = correction if correction is not None else (0 if unbiased is False else 1)
    return [x, _dims(dim)], {"keepdims": int(bool(keepdim)), "correction": float(c)}


@api("argmax", "ArgMax")
def argmax(x, dim=None, keepdim=False):
    """Index (int64) of the first max along ``dim``; over the flattened tensor when None."""
    return _flat_for_arg(x, dim, keepdim)


@api("argmin", "ArgMin")
def argmin(x, dim=None, keepdim=False):
    """Index (int64) of the first min along ``dim``; over the flattened tensor when None."""
    return _flat_for_arg(x, dim, keepdim)


@api("cumsum", "CumSum")
def cumsum(x, dim, exclusive=False, reverse=False):
    """Cumulative sum along ``dim``; ``exclusive`` starts from 0, ``reverse`` runs backwards."""
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
        raise ParamInvalidError(f"cumsum: dim must be an int, got {dim!r}")
    return [x, np.asarray(dim, dtype=np.int64)], {"exclusive": int(bool(exclusive)), "reverse": int(bool(reverse))}


__all__ = ["sum", "mean", "max", "min", "prod", "logsumexp", "var", "argmax", "argmin", "cumsum"]
