"""Typed errors of the ONNX frontend; each names the model part at fault and the fix."""

from __future__ import annotations

from ..errors import (
    KERNEL_NOT_FOUND,
    PARAM_INVALID,
    KernelNotFoundError,
    OpsnnError,
    OutOfMemoryError,
    ParamInvalidError,
)


class OnnxImportError(OpsnnError):
    """Base class: the model could not be imported."""

    code = PARAM_INVALID


class ModelFormatError(OnnxImportError, ParamInvalidError):
    """The bytes are not a well-formed ONNX model (malformed or truncated protobuf, tensor
    data that does not match its declared shape, missing opset imports...)."""


class UnsupportedOpError(OnnxImportError, KernelNotFoundError):
    """A node's op (or the opset form it is written in) has no opsnn implementation."""

    code = KERNEL_NOT_FOUND


class UnsupportedOpsetError(OnnxImportError, ParamInvalidError):
    """The model imports an opset newer than opsnn supports."""


class ExternalDataError(OnnxImportError, ParamInvalidError):
    """An initializer's external data file is missing, too short, or outside the model's folder."""


class ExpansionLimitError(OnnxImportError, ParamInvalidError):
    """Expanding the model's functions (local functions, ONNX function bodies) would create more
    nodes than the import's budget (``onnx.load(..., max_function_nodes=)``)."""


class TensorTooLargeError(OnnxImportError, OutOfMemoryError):
    """A tensor's declared size exceeds the memory pool's cap; refused before allocating."""

    code = OutOfMemoryError.code


__all__ = [
    "ExpansionLimitError",
    "ExternalDataError",
    "ModelFormatError",
    "OnnxImportError",
    "TensorTooLargeError",
    "UnsupportedOpError",
    "UnsupportedOpsetError",
]
