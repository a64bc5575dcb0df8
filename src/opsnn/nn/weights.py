"""Weight files: read a name -> array mapping from local ``.safetensors`` (the ``safetensors``
package's numpy API), ``.npz`` or ``.onnx`` (initializers) files, and write state dicts.

ONNX initializers named ``<param>.T`` hold a parameter transposed (a Linear weight stored for
``MatMul(x, W^T)``, as ``opsnn.models.export`` writes them); they are read back transposed.

>>> import opsnn, numpy as np, tempfile, os
>>> lin = opsnn.nn.Linear(3, 2)
>>> path = lin.save_weights(os.path.join(tempfile.mkdtemp(), "lin.npz"))
>>> sorted(opsnn.nn.read_weights(path))
['bias', 'weight']
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import ParamInvalidError
from ..tensor import Tensor

TRANSPOSED_SUFFIX = ".T"
FORMATS = (".safetensors", ".npz", ".onnx")


class WeightFileError(ParamInvalidError):
    """A weight file is missing, of an unknown format, or unreadable."""


def _safetensors():
    try:
        import safetensors.numpy as st
    except ImportError:  # pragma: no cover - a declared dependency
        raise WeightFileError(
            "reading .safetensors files needs the 'safetensors' package (pip install safetensors)"
        ) from None
    return st


def _format(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise WeightFileError(
            f"weights file {path!r}: unknown format {ext or '(no extension)'!r}; expected one of {FORMATS}"
        )
    return ext


def read_weights(path, names=None) -> dict:
    """``{name: numpy array}`` from a local weights file. ``names`` (optional, e.g. a module's
    state dict): for ``.onnx`` files keep only initializers that are among them (an ONNX
    model also holds constants that are not weights)."""
    path = os.fspath(path)
    ext = _format(path)
    if not os.path.isfile(path):
        raise WeightFileError(f"weights file {path!r} does not exist")
    try:
        if ext == ".safetensors":
            return dict(_safetensors().load_file(path))
        if ext == ".npz":
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        return _read_onnx(path, names)
    except WeightFileError:
        raise
    except Exception as exc:  # noqa: BLE001 - any parser failure is a bad file
        raise WeightFileError(
            f"weights file {path!r} could not be read as {ext}: {type(exc).__name__}: {exc}"
        ) from None


def _read_onnx(path: str, names) -> dict:
    import onnx

    model = onnx.load(path, load_external_data=True)
    return onnx_initializers(model, names)


def onnx_initializers(model, names=None) -> dict:
    """Weights from an ``onnx.ModelProto``'s initializers (``<param>.T`` read back transposed)."""
    from onnx import numpy_helper

    keep = None if names is None else set(names)
    out = {}
    for init in model.graph.initializer:
        name = init.name
        transposed = name.endswith(TRANSPOSED_SUFFIX) and (keep is None or name not in keep)
        if transposed:
            name = name[: -len(TRANSPOSED_SUFFIX)]
        if keep is not None and name not in keep:
            continue
        arr = numpy_helper.to_array(init)
        out[name] = np.require(arr.T, requirements="C") if transposed else arr
    return out


def write_weights(state_dict, path) -> str:
    """Write ``{name: Tensor | array}`` to ``.safetensors`` or ``.npz``; returns the path."""
    path = os.fspath(path)
    ext = _format(path)
    arrays = {
        k: np.require(v.numpy() if isinstance(v, Tensor) else np.asarray(v), requirements="C")
        for k, v in state_dict.items()
    }
    if ext == ".safetensors":
        _safetensors().save_file(arrays, path)
    elif ext == ".npz":
        np.savez(path, **arrays)
    else:
        raise WeightFileError(
            f"write_weights: cannot write {ext} files; use .safetensors or .npz "
            "(ONNX files come from opsnn.models.export)"
        )
    return path
