"""Sorting ops: TopK — record, kernel and functional entry point.

The kernel is a stable argsort along the axis (:mod:`opsnn.kernels.cpu.shape`); the
reference ranks each row in Python, NaN above +inf as onnxruntime does::

    >>> import opsnn, numpy as np
    >>> x = opsnn.tensor(np.array([3.0, 1.0, 2.0], np.float32))
    >>> [t.numpy().tolist() for t in opsnn.ops.topk(x, 2)]
    [[3.0, 2.0], [0, 2]]
"""

from __future__ import annotations

import numpy as np

from ... import dtypes as _dt
from ...errors import ParamInvalidError
from ...kernels.cpu import shape as K
from ...tensor import Tensor
from ..api import api
from ..registry import Attr, Input, TensorMeta, register_op
from .shape import _axis, _host

I64 = _dt.int64


def _topk_k(ctx_value) -> int:
    k = np.asarray(ctx_value).reshape(-1)
    if k.size != 1:
        raise ParamInvalidError(f"TopK: K must hold one value, got {k.size}", op="TopK")
    return int(k[0])


def _topk_infer(ctx):
    s = ctx.shape(0)
    ax = _axis("TopK", ctx.attrs["axis"], len(s))
    k = _topk_k(_host(ctx, 1, "K"))
    if not 0 <= k <= s[ax]:
        raise ParamInvalidError(f"TopK: K = {k} must be in [0, {s[ax]}] (size of axis {ax})", op="TopK")
    out = tuple(k if i == ax else d for i, d in enumerate(s))
    return [TensorMeta(out, ctx.dtype(0)), TensorMeta(out, I64)]


def _topk_ref(ins, a):
    x = ins[0]
    k = _topk_k(ins[1])
    ax = a["axis"] % x.ndim
    xm = np.moveaxis(x, ax, -1)
    vals = np.empty(xm.shape[:-1] + (k,), x.dtype)
    idx = np.empty(xm.shape[:-1] + (k,), np.int64)
    sign = -1 if a["largest"] else 1
    for pos in np.ndindex(*xm.shape[:-1]):
        row = xm[pos]
        if row.dtype.kind in "iub":  # Python ints: exact, and -(-128) does not wrap
            keys = [(0, sign * int(v)) for v in row]
        else:  # NaN ranks above +inf, as in onnxruntime: first when largest, last when smallest
            keys = [(sign, 0.0) if np.isnan(v) else (-sign, sign * v) for v in row.astype(np.float64)]
        order = sorted(range(row.size), key=lambda i: (keys[i], i))
        idx[pos] = order[:k]
        vals[pos] = row[order[:k]]
    return np.moveaxis(vals, -1, ax), np.moveaxis(idx, -1, ax)


TopK = register_op(
    "TopK",
    category="sort",
    inputs=[Input("X", _dt.NUMERIC), Input("K", (_dt.int64,), host=True)],
    outputs=["Values", "Indices"],
    attrs=[Attr("axis", "int", -1), Attr("largest", "int", 1), Attr("sorted", "int", 1)],
    infer=_topk_infer,
    reference=_topk_ref,
    doc="The k largest (or smallest) values along axis and their indices; ties go to the lower index. NaN "
    "ranks above +inf, as in onnxruntime: first when largest, last when smallest.",
)


@TopK.kernel("topk_sort", priority=5, doc="stable argsort along the axis")
def _topk_kernel(ins, outs, attrs, plan, ws):
    K.topk(
        ins[0],
        outs[0].shape[attrs["axis"] % ins[0].ndim],
        attrs["axis"] % ins[0].ndim,
        attrs["largest"],
        outs[0],
        outs[1],
    )


@api("topk", "TopK")
def topk(x, k, dim=-1, largest=True, sorted=True):
    """torch.topk: (values, indices); ties go to the lower index."""
    return [x, Tensor(np.asarray([k], np.int64))], {
        "axis": int(dim),
        "largest": int(bool(largest)),
        "sorted": int(bool(sorted)),
    }


__all__ = ["topk"]
