"""The dtypes opsnn stores, their names, and numpy/ml_dtypes equivalents.

>>> from opsnn import dtypes
>>> dtypes.get("bf16")
dtype(bfloat16)
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .errors import DTypeError

float32 = np.dtype(np.float32)
float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float64 = np.dtype(np.float64)
int8 = np.dtype(np.int8)
int16 = np.dtype(np.int16)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
uint8 = np.dtype(np.uint8)
uint16 = np.dtype(np.uint16)
uint32 = np.dtype(np.uint32)
uint64 = np.dtype(np.uint64)
bool_ = np.dtype(np.bool_)
float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)
float8_e5m2 = np.dtype(ml_dtypes.float8_e5m2)

_ALIASES = {
    "float32": float32,
    "fp32": float32,
    "float": float32,
    "f32": float32,
    "float16": float16,
    "fp16": float16,
    "half": float16,
    "f16": float16,
    "bfloat16": bfloat16,
    "bf16": bfloat16,
    "float64": float64,
    "fp64": float64,
    "double": float64,
    "f64": float64,
    "int8": int8,
    "int16": int16,
    "int32": int32,
    "int64": int64,
    "uint8": uint8,
    "uint16": uint16,
    "uint32": uint32,
    "uint64": uint64,
    "bool": bool_,
    "float8_e4m3fn": float8_e4m3fn,
    "float8_e5m2": float8_e5m2,
}
# narrow types ml_dtypes provides (quantization, ONNX conformance); present ones only
for _name in (
    "int4",
    "uint4",
    "int2",
    "uint2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e4m3b11fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn",
    "float6_e2m3fn",
    "float6_e3m2fn",
):
    if hasattr(ml_dtypes, _name):
        _ALIASES[_name] = np.dtype(getattr(ml_dtypes, _name))

#: dtypes with a first-class place in opsnn (tensors of other numpy dtypes are still
#: accepted by ops whose records allow them, e.g. strings for ONNX conformance).
STANDARD = (float32, float16, bfloat16, float64, int8, int16, int32, int64, uint8, bool_)
FLOATS = (float32, float16, bfloat16, float64)
LOW_PRECISION = (float16, bfloat16)
INTEGERS = (int8, int16, int32, int64, uint8, uint16, uint32, uint64)
NUMERIC = FLOATS + INTEGERS


def get(dtype) -> np.dtype:
    """Normalise a dtype given by name, numpy dtype or scalar type."""
    if isinstance(dtype, np.dtype):
        return dtype
    if isinstance(dtype, str):
        try:
            return _ALIASES[dtype.lower()]
        except KeyError:
            raise DTypeError(f"unknown dtype name {dtype!r}; expected one of {sorted(_ALIASES)}") from None
    try:
        return np.dtype(dtype)
    except TypeError:
        raise DTypeError(f"cannot interpret {dtype!r} as a dtype") from None


def name(dtype) -> str:
    """The canonical name of a dtype (``bfloat16`` rather than numpy's ``V2`` quirks)."""
    dt = get(dtype)
    return "bool" if dt == bool_ else str(dt)


def is_float(dtype) -> bool:
    dt = get(dtype)
    return dt.kind == "f" or dt == bfloat16 or dt.name.startswith(("float8", "float4", "float6"))


def is_low_precision(dtype) -> bool:
    return get(dtype) in LOW_PRECISION


def compute_dtype(dtype) -> np.dtype:
    """The dtype a kernel computes in: 16-bit and 8-bit floats compute in fp32."""
    dt = get(dtype)
    if dt in (float16, bfloat16, float8_e4m3fn, float8_e5m2):
        return float32
    return dt
