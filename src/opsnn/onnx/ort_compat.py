"""onnxruntime's Python API on opsnn, as a module: ``from opsnn.onnx import ort_compat as ort``
and a script written for ``import onnxruntime as ort`` runs unchanged on opsnn's session.

>>> from opsnn.onnx import ort_compat as ort
>>> ort.get_available_providers()
['CPUExecutionProvider']
"""

from .session import (
    ExecutionMode,
    ExecutionOrder,
    GraphOptimizationLevel,
    InferenceSession,
    IOBinding,
    ModelMetadata,
    NodeArg,
    OrtValue,
    RunOptions,
    SessionOptions,
    get_all_providers,
    get_available_providers,
    get_device,
)

__version__ = "1.0.0+opsnn"

__all__ = [
    "ExecutionMode",
    "ExecutionOrder",
    "GraphOptimizationLevel",
    "IOBinding",
    "InferenceSession",
    "ModelMetadata",
    "NodeArg",
    "OrtValue",
    "RunOptions",
    "SessionOptions",
    "get_all_providers",
    "get_available_providers",
    "get_device",
]
