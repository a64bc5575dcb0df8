"""ONNX frontend: import models as opsnn graphs, the standard ``onnx.backend`` interface,
and the conformance harness over ONNX's own test cases.

>>> import opsnn.onnx                                           # doctest: +SKIP
>>> g = opsnn.onnx.load("model.onnx")                            # doctest: +SKIP
>>> rep = opsnn.onnx.backend.prepare(onnx.load("model.onnx"))    # doctest: +SKIP
>>> outputs = rep.run([x])                                       # doctest: +SKIP
"""
from . import errors, opset
from .errors import (ExpansionLimitError, ExternalDataError, ModelFormatError, OnnxImportError, TensorTooLargeError, UnsupportedOpError,
                     UnsupportedOpsetError)
from .importer import load, read_model
from . import backend

__all__ = ["ExpansionLimitError", "ExternalDataError", "ModelFormatError", "OnnxImportError", "TensorTooLargeError", "UnsupportedOpError",
           "UnsupportedOpsetError", "backend", "errors", "load", "opset", "read_model"]
