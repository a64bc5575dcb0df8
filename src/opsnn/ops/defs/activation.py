"""Activation ops: records, their CPU kernels and functional entry points."""
from __future__ import annotations

import numpy as np

from ... import dtypes as _dt
from ...kernels.cpu import activation as K
from ..api import api
from ..registry import Input, TensorMeta, register_op

FLOAT = _dt.FLOATS
_F32_64 = (_dt.float32, _dt.float64)


def same_as_input(ctx):
    return [TensorMeta(ctx.shape(0), ctx.dtype(0))]


Relu = register_op(
    "Relu", category="activation", inputs=[Input("X", _dt.FLOATS + (_dt.int8, _dt.int16, _dt.int32, _dt.int64))],
    outputs=["Y"], infer=same_as_input,
    reference=lambda ins, attrs: np.maximum(ins[0], 0).astype(ins[0].dtype),
    doc="max(x, 0)")
Relu.kernel("relu_numba", dtypes=_F32_64 + (_dt.int32, _dt.int64), priority=10, plan=K.parallel_plan)(K.relu)


@api("relu", "Relu")
def relu(x):
    """``max(x, 0)`` elementwise."""
    return [x], {}


__all__ = ["relu"]
