"""Training checkpoints: model, optimizer, loss scaler, LR scheduler, step and RNG state in one
``.safetensors`` file (tensors by name, the rest as JSON metadata); a run resumed from one
continues bit-identically.

>>> import opsnn, numpy as np, tempfile, os
>>> lin = opsnn.nn.Linear(3, 2)
>>> opt = opsnn.optim.AdamW(lin.parameters())
>>> path = os.path.join(tempfile.mkdtemp(), "ckpt.safetensors")
>>> _ = opsnn.save_checkpoint(path, lin, opt, step=7)
>>> opsnn.load_checkpoint(path, opsnn.nn.Linear(3, 2), opsnn.optim.AdamW(opsnn.nn.Linear(3, 2).parameters()))["step"]
7
"""

from __future__ import annotations

import errno
import json
import os

import numpy as np

from .errors import ParamInvalidError
from .tensor import Tensor

_META_KEY = "opsnn.checkpoint"


class CheckpointError(ParamInvalidError):
    """A checkpoint file that is not one, or that does not fit the objects it is loaded into."""


def _np(v) -> np.ndarray:
    a = v.numpy() if isinstance(v, Tensor) else np.asarray(v)
    return a if a.flags.c_contiguous else a.copy()  # (np.ascontiguousarray would make 0-d arrays 1-d)


def _rng_state():
    from .nn import init

    return init.generator().bit_generator.state


def save_checkpoint(
    path, model, optimizer=None, *, step: int = 0, scaler=None, scheduler=None, extra: dict | None = None
) -> str:
    """Write ``model.state_dict()``, the optimizer's state, ``step``, the scaler's and scheduler's
    state, opsnn's init RNG state and ``extra`` (JSON-able) to ``path``; returns the path."""
    import safetensors.numpy as st

    tensors = {f"model/{k}": _np(v) for k, v in model.state_dict().items()}
    meta: dict = {"step": int(step), "rng": _rng_state(), "extra": extra or {}}
    if optimizer is not None:
        sd = optimizer.state_dict()
        scalars = {}
        for idx, entry in sd["state"].items():
            for name, v in entry.items():
                if isinstance(v, (Tensor, np.ndarray)):
                    tensors[f"optimizer/{idx}/{name}"] = _np(v)
                else:
                    scalars.setdefault(str(idx), {})[name] = v
        meta["optimizer"] = {"kind": type(optimizer).__name__, "param_groups": sd["param_groups"], "scalars": scalars}
    if scaler is not None:
        meta["scaler"] = scaler.state_dict()
    if scheduler is not None:
        meta["scheduler"] = scheduler.state_dict()
    meta["shapes"] = {k: list(v.shape) for k, v in tensors.items() if v.ndim == 0}  # the file stores 0-d as (1,)
    folder = os.path.dirname(os.path.abspath(str(path)))
    if not os.path.isdir(folder):
        raise FileNotFoundError(errno.ENOENT, f"save_checkpoint: no folder {folder!r} to write into", str(path))
    st.save_file(tensors, str(path), metadata={_META_KEY: json.dumps(meta)})
    return str(path)


def _open(path, who: str):
    """The safetensors handle of ``path``: FileNotFoundError where there is no file, CheckpointError where
    it is not a safetensors file."""
    from safetensors import safe_open

    if not os.path.isfile(str(path)):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
    try:
        return safe_open(str(path), framework="np")
    except Exception as e:  # safetensors' own error type: the file is not a safetensors file
        raise CheckpointError(f"{who}: {path} is not a safetensors checkpoint ({e})") from e


def checkpoint_info(path) -> dict:
    """``{"step": ..., "extra": ...}`` of a checkpoint file, without loading its tensors."""
    with _open(path, "checkpoint_info") as f:
        raw = (f.metadata() or {}).get(_META_KEY)
    if raw is None:
        raise CheckpointError(f"checkpoint_info: {path} has no {_META_KEY!r} metadata (not an opsnn checkpoint)")
    meta = json.loads(raw)
    return {"step": meta["step"], "extra": meta.get("extra", {})}


def load_checkpoint(path, model, optimizer=None, *, scaler=None, scheduler=None, strict: bool = True) -> dict:
    """Restore what :func:`save_checkpoint` wrote into ``model`` (and the optimizer, scaler,
    scheduler given) and the init RNG; returns ``{"step": ..., "extra": ...}``. A file written for
    another model or optimizer raises (StateDictError / OptimizerStateError / CheckpointError)
    before anything is written."""
    from .nn import init

    with _open(path, "load_checkpoint") as f:
        raw = (f.metadata() or {}).get(_META_KEY)
        if raw is None:
            raise CheckpointError(f"load_checkpoint: {path} has no {_META_KEY!r} metadata (not an opsnn checkpoint)")
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - a safetensors handle, not a dict
    meta = json.loads(raw)
    for k, shape in meta.get("shapes", {}).items():
        tensors[k] = tensors[k].reshape(shape)
    model_sd = {k[len("model/") :]: v for k, v in tensors.items() if k.startswith("model/")}
    opt_sd = None
    if optimizer is not None:
        info = meta.get("optimizer")
        if info is None:
            raise CheckpointError(f"load_checkpoint: {path} holds no optimizer state")
        if info["kind"] != type(optimizer).__name__:
            raise CheckpointError(
                f"load_checkpoint: {path} holds {info['kind']} state, the optimizer is {type(optimizer).__name__}"
            )
        state: dict = {}
        for k, v in tensors.items():
            if k.startswith("optimizer/"):
                _, idx, name = k.split("/", 2)
                state.setdefault(int(idx), {})[name] = v
        for idx, entry in info["scalars"].items():
            state.setdefault(int(idx), {}).update(entry)
        groups = []
        for mine, theirs in zip(optimizer.param_groups, info["param_groups"]):
            groups.append(
                {
                    k: tuple(v) if isinstance(mine.get(k), tuple) and isinstance(v, list) else v
                    for k, v in theirs.items()
                }
            )
        groups += info["param_groups"][len(groups) :]
        opt_sd = {"state": state, "param_groups": groups}
    # validate everything before writing anything: the model load checks shapes itself and writes
    # only when it passes; load the optimizer into a dry copy first
    if optimizer is not None:
        import copy

        probe = copy.copy(optimizer)
        probe.param_groups = [dict(g) for g in optimizer.param_groups]
        probe.state = {}
        probe.load_state_dict(opt_sd)
    model.load_state_dict(model_sd, strict=strict)
    if optimizer is not None:
        optimizer.load_state_dict(opt_sd)
    if scaler is not None and "scaler" in meta:
        scaler.load_state_dict(meta["scaler"])
    if scheduler is not None and "scheduler" in meta:
        scheduler.load_state_dict(meta["scheduler"])
    init.generator().bit_generator.state = meta["rng"]
    return {"step": meta["step"], "extra": meta.get("extra", {})}


__all__ = ["CheckpointError", "checkpoint_info", "load_checkpoint", "save_checkpoint"]


_OBJECT_KEY = "opsnn.object"


def _encode(obj, tensors: dict, where: str):
    """``obj`` as JSON-able structure, its tensors and arrays moved into ``tensors`` by key."""
    if isinstance(obj, (Tensor, np.ndarray)):
        key = str(len(tensors))
        tensors[key] = _np(obj)
        return {"tensor": key, "shape": list(obj.shape)}  # the file stores 0-d as (1,)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return {"value": obj}
    if isinstance(obj, np.generic):
        return {"value": obj.item()}
    if isinstance(obj, dict):
        return {"dict": [[_encode(k, tensors, where), _encode(v, tensors, f"{where}[{k!r}]")] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        kind = "list" if isinstance(obj, list) else "tuple"
        return {kind: [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]}
    raise CheckpointError(
        f"save: cannot store a {type(obj).__name__} at {where}; opsnn.save stores tensors, arrays, numbers, "
        "strings, None and dicts, lists and tuples of them (a state_dict() is one)"
    )


def _decode(node, tensors: dict):
    if "tensor" in node:
        return Tensor(tensors[node["tensor"]].reshape(node["shape"]).copy())
    if "value" in node:
        return node["value"]
    if "dict" in node:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in node["dict"]}
    items = [_decode(v, tensors) for v in node.get("list", node.get("tuple", []))]
    return items if "list" in node else tuple(items)


def save(obj, f) -> None:
    """torch.save's role for what training code saves (a ``state_dict()``, an optimizer's, dicts of them with
    step counts): tensors, arrays, numbers, strings, None and dicts / lists / tuples of them, written to the
    path ``f`` as one safetensors file (no pickle: loading it runs no code). Anything else is a
    CheckpointError naming where it sits in ``obj``."""
    import safetensors.numpy as st

    tensors: dict = {}
    structure = _encode(obj, tensors, "the top")
    folder = os.path.dirname(os.path.abspath(str(f)))
    if not os.path.isdir(folder):
        raise FileNotFoundError(errno.ENOENT, f"save: no folder {folder!r} to write into", str(f))
    st.save_file(tensors, str(f), metadata={_OBJECT_KEY: json.dumps(structure)})


def load(f, map_location=None, *, weights_only: bool = True):
    """torch.load's role for a file :func:`save` wrote: the object back, tensors as :class:`opsnn.Tensor`
    (``weights_only`` True or False alike: the file holds no code). ``map_location`` may be None, 'cpu' or
    a CPU device (opsnn tensors live in host memory)."""
    if map_location is not None and map_location != "cpu" and getattr(map_location, "type", None) != "cpu":
        raise CheckpointError(f"load: map_location {map_location!r}: opsnn tensors live on the CPU ('cpu' or None)")
    if not isinstance(weights_only, bool):
        raise CheckpointError(f"load: weights_only must be True or False, got {weights_only!r}")
    with _open(f, "load") as h:
        raw = (h.metadata() or {}).get(_OBJECT_KEY)
        if raw is None:
            what = "a training checkpoint: use opsnn.load_checkpoint" if _META_KEY in (h.metadata() or {}) else ""
            raise CheckpointError(f"load: {f} was not written by opsnn.save{f' ({what})' if what else ''}")
        tensors = {k: h.get_tensor(k) for k in h.keys()}  # noqa: SIM118 - a safetensors handle, not a dict
    return _decode(json.loads(raw), tensors)
