"""ONNX frontend: import models as opsnn graphs, an onnxruntime-compatible
``InferenceSession`` (and ``ort_compat``, onnxruntime's API as a module), the standard
``onnx.backend`` interface, and the conformance harness over ONNX's own test cases.

>>> import opsnn.onnx                                           # doctest: +SKIP
>>> g = opsnn.onnx.load("model.onnx")                            # doctest: +SKIP
>>> rep = opsnn.onnx.backend.prepare(onnx.load("model.onnx"))    # doctest: +SKIP
>>> outputs = rep.run([x])                                       # doctest: +SKIP
"""

from . import backend, errors, opset, ort_compat
from .errors import (
    ExpansionLimitError,
    ExternalDataError,
    ModelFormatError,
    OnnxImportError,
    TensorTooLargeError,
    UnsupportedOpError,
    UnsupportedOpsetError,
)
from .importer import load, read_model
from .session import (
    GraphOptimizationLevel,
    InferenceSession,
    IOBinding,
    OrtValue,
    RunOptions,
    SessionOptions,
    get_available_providers,
)

__all__ = [
    "GraphOptimizationLevel",
    "InferenceSession",
    "IOBinding",
    "OrtValue",
    "RunOptions",
    "SessionOptions",
    "get_available_providers",
    "ort_compat",
    "ExpansionLimitError",
    "ExternalDataError",
    "ModelFormatError",
    "OnnxImportError",
    "TensorTooLargeError",
    "UnsupportedOpError",
    "UnsupportedOpsetError",
    "backend",
    "errors",
    "load",
    "opset",
    "read_model",
]
