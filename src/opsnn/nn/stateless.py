"""torch.nn's modules that hold only hyper-parameters (activations, pooling, padding, upsampling,
similarity), one table row each over the functional API: the row gives torch's constructor
parameters in torch's order with their defaults, and how forward calls the function. Arguments
are checked when the module is built (an unknown keyword names the nearest parameter), and each
module is checked against torch's in tests/test_nn_torch_modules.py.

>>> import opsnn, numpy as np
>>> opsnn.nn.LeakyReLU(0.1)(opsnn.tensor(np.array([-1.0, 2.0], np.float32))).numpy().tolist()
[-0.10000000149011612, 2.0]
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import ParamInvalidError
from . import functional as F
from .module import Module

#: a parameter's default in a row when torch's module requires it
REQUIRED = object()


@dataclass(frozen=True)
class Row:
    """One module: ``fn`` (the functional it calls), torch's constructor parameters ``params`` (name ->
    default, :data:`REQUIRED` where torch's module requires it, in torch's order), those forward passes to
    ``fn`` by keyword (``call``: module parameter -> function keyword; default all but ``inplace``), fixed
    keywords, and ``prepare``
    (the stored parameters -> the function's keywords) where torch's module and function differ."""

    fn: Callable
    params: dict
    call: dict | None = None
    fixed: dict = field(default_factory=dict)
    prepare: Callable | None = None
    doc: str = ""


def _same_stride(kw: dict) -> dict:
    return {**kw, "stride": kw["kernel_size"] if kw["stride"] is None else kw["stride"]}


def _pads(dims: int):
    def prepare(kw: dict) -> dict:
        p = kw.pop("padding")
        pads = (int(p),) * (2 * dims) if isinstance(p, int) else tuple(int(v) for v in p)
        if len(pads) != 2 * dims:
            raise ParamInvalidError(f"padding: expected an int or {2 * dims} ints, got {p!r}")
        return {**kw, "pad": pads}

    return prepare


def _pool(fn, average: bool = False) -> Row:
    params = {"kernel_size": REQUIRED, "stride": None, "padding": 0}
    if average:
        params.update(ceil_mode=False, count_include_pad=True)
    else:
        params.update(dilation=1, return_indices=False, ceil_mode=False)
    return Row(fn, params, prepare=_same_stride)


def _activation(fn, doc="", **params) -> Row:
    return Row(fn, {**params, "inplace": False}, doc=doc)


TABLE: dict[str, Row] = {
    "LeakyReLU": _activation(F.leaky_relu, negative_slope=0.01),
    "ELU": _activation(F.elu, alpha=1.0),
    "CELU": _activation(F.celu, alpha=1.0),
    "Mish": _activation(F.mish),
    "Softsign": Row(F.softsign, {}),
    "Hardshrink": Row(F.hardshrink, {"lambd": 0.5}),
    "Softshrink": Row(F.softshrink, {"lambd": 0.5}),
    "LogSoftmax": Row(F.log_softmax, {"dim": None}),
    "ReLU6": _activation(F.relu6),
    "Hardtanh": _activation(F.hardtanh, min_val=-1.0, max_val=1.0),
    "Hardsigmoid": _activation(F.hardsigmoid),
    "Hardswish": _activation(F.hardswish),
    "SELU": _activation(F.selu),
    "Softplus": Row(F.softplus, {"beta": 1.0, "threshold": 20.0}),
    "Unflatten": Row(F.unflatten, {"dim": REQUIRED, "unflattened_size": REQUIRED}, call={"unflattened_size": "sizes"}),
    "MaxPool1d": _pool(F.max_pool1d),
    "MaxPool3d": _pool(F.max_pool3d),
    "AvgPool1d": _pool(F.avg_pool1d, average=True),
    "AvgPool2d": _pool(F.avg_pool2d, average=True),
    "AvgPool3d": _pool(F.avg_pool3d, average=True),
    "PixelShuffle": Row(F.pixel_shuffle, {"upscale_factor": REQUIRED}),
    "PixelUnshuffle": Row(F.pixel_unshuffle, {"downscale_factor": REQUIRED}),
    "Upsample": Row(F.interpolate, {"size": None, "scale_factor": None, "mode": "nearest", "align_corners": None}),
    "ZeroPad1d": Row(F.pad, {"padding": REQUIRED}, prepare=_pads(1)),
    "ZeroPad2d": Row(F.pad, {"padding": REQUIRED}, prepare=_pads(2)),
    "ConstantPad1d": Row(F.pad, {"padding": REQUIRED, "value": REQUIRED}, prepare=_pads(1)),
    "ConstantPad2d": Row(F.pad, {"padding": REQUIRED, "value": REQUIRED}, prepare=_pads(2)),
    "ConstantPad3d": Row(F.pad, {"padding": REQUIRED, "value": REQUIRED}, prepare=_pads(3)),
    "ReflectionPad1d": Row(F.pad, {"padding": REQUIRED}, fixed={"mode": "reflect"}, prepare=_pads(1)),
    "ReflectionPad2d": Row(F.pad, {"padding": REQUIRED}, fixed={"mode": "reflect"}, prepare=_pads(2)),
    "ReplicationPad1d": Row(F.pad, {"padding": REQUIRED}, fixed={"mode": "replicate"}, prepare=_pads(1)),
    "ReplicationPad2d": Row(F.pad, {"padding": REQUIRED}, fixed={"mode": "replicate"}, prepare=_pads(2)),
    "CosineSimilarity": Row(F.cosine_similarity, {"dim": 1, "eps": 1e-8}),
    "AdaptiveAvgPool1d": Row(F.adaptive_avg_pool1d, {"output_size": REQUIRED}),
}

#: the parameters a module keeps for torch's sake but does not pass (opsnn computes out of place)
_KEPT = ("inplace",)


def _bind(name: str, params: dict, args: tuple, kwargs: dict) -> dict:
    if len(args) > len(params):
        raise ParamInvalidError(
            f"{name}: takes at most {len(params)} argument(s) ({', '.join(params)}), got {len(args)}"
        )
    bound = dict(zip(params, args))
    for k, v in kwargs.items():
        if k not in params:
            near = difflib.get_close_matches(k, list(params), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f"; parameters: {list(params)}"
            raise ParamInvalidError(f"{name}: unexpected keyword {k!r}{hint}")
        if k in bound:
            raise ParamInvalidError(f"{name}: got two values for {k!r}")
        bound[k] = v
    missing = [k for k, d in params.items() if d is REQUIRED and k not in bound]
    if missing:
        raise ParamInvalidError(f"{name}: missing required argument(s) {missing}")
    return {k: bound.get(k, d) for k, d in params.items()}


def make_module(name: str, row: Row) -> type:
    """The module class ``name`` built from its table row."""

    def __init__(self, *args, **kwargs):
        Module.__init__(self)
        bound = _bind(name, row.params, args, kwargs)
        for k, v in bound.items():
            setattr(self, k, v)
        call = {(row.call or {}).get(k, k): v for k, v in bound.items() if k not in _KEPT}
        call = row.prepare(dict(call)) if row.prepare else call
        self._call = {**call, **row.fixed}
        if name == "LogSoftmax" and self._call["dim"] is None:
            raise ParamInvalidError("LogSoftmax: pass dim (torch's implicit dim is deprecated)")

    def forward(self, *inputs):
        return row.fn(*inputs, **self._call)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={getattr(self, k)!r}" for k in row.params if getattr(self, k) != row.params[k])

    doc = row.doc or f"torch.nn.{name}: ``opsnn.nn.functional.{row.fn.__name__}`` with torch's constructor arguments."
    return type(name, (Module,), {"__init__": __init__, "forward": forward, "extra_repr": extra_repr, "__doc__": doc})


# one line per module, so tools (and readers) see each name
AdaptiveAvgPool1d = make_module("AdaptiveAvgPool1d", TABLE["AdaptiveAvgPool1d"])
AvgPool1d = make_module("AvgPool1d", TABLE["AvgPool1d"])
AvgPool2d = make_module("AvgPool2d", TABLE["AvgPool2d"])
AvgPool3d = make_module("AvgPool3d", TABLE["AvgPool3d"])
CELU = make_module("CELU", TABLE["CELU"])
ConstantPad1d = make_module("ConstantPad1d", TABLE["ConstantPad1d"])
ConstantPad2d = make_module("ConstantPad2d", TABLE["ConstantPad2d"])
ConstantPad3d = make_module("ConstantPad3d", TABLE["ConstantPad3d"])
CosineSimilarity = make_module("CosineSimilarity", TABLE["CosineSimilarity"])
ELU = make_module("ELU", TABLE["ELU"])
Hardshrink = make_module("Hardshrink", TABLE["Hardshrink"])
Hardsigmoid = make_module("Hardsigmoid", TABLE["Hardsigmoid"])
Hardswish = make_module("Hardswish", TABLE["Hardswish"])
Hardtanh = make_module("Hardtanh", TABLE["Hardtanh"])
LeakyReLU = make_module("LeakyReLU", TABLE["LeakyReLU"])
LogSoftmax = make_module("LogSoftmax", TABLE["LogSoftmax"])
MaxPool1d = make_module("MaxPool1d", TABLE["MaxPool1d"])
MaxPool3d = make_module("MaxPool3d", TABLE["MaxPool3d"])
Mish = make_module("Mish", TABLE["Mish"])
PixelShuffle = make_module("PixelShuffle", TABLE["PixelShuffle"])
PixelUnshuffle = make_module("PixelUnshuffle", TABLE["PixelUnshuffle"])
ReLU6 = make_module("ReLU6", TABLE["ReLU6"])
ReflectionPad1d = make_module("ReflectionPad1d", TABLE["ReflectionPad1d"])
ReflectionPad2d = make_module("ReflectionPad2d", TABLE["ReflectionPad2d"])
ReplicationPad1d = make_module("ReplicationPad1d", TABLE["ReplicationPad1d"])
ReplicationPad2d = make_module("ReplicationPad2d", TABLE["ReplicationPad2d"])
SELU = make_module("SELU", TABLE["SELU"])
Softplus = make_module("Softplus", TABLE["Softplus"])
Softshrink = make_module("Softshrink", TABLE["Softshrink"])
Softsign = make_module("Softsign", TABLE["Softsign"])
Unflatten = make_module("Unflatten", TABLE["Unflatten"])
Upsample = make_module("Upsample", TABLE["Upsample"])
ZeroPad1d = make_module("ZeroPad1d", TABLE["ZeroPad1d"])
ZeroPad2d = make_module("ZeroPad2d", TABLE["ZeroPad2d"])

__all__ = [
    "AdaptiveAvgPool1d",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "CELU",
    "ConstantPad1d",
    "ConstantPad2d",
    "ConstantPad3d",
    "CosineSimilarity",
    "ELU",
    "Hardshrink",
    "Hardsigmoid",
    "Hardswish",
    "Hardtanh",
    "LeakyReLU",
    "LogSoftmax",
    "MaxPool1d",
    "MaxPool3d",
    "Mish",
    "PixelShuffle",
    "PixelUnshuffle",
    "ReLU6",
    "ReflectionPad1d",
    "ReflectionPad2d",
    "ReplicationPad1d",
    "ReplicationPad2d",
    "SELU",
    "Softplus",
    "Softshrink",
    "Softsign",
    "Unflatten",
    "Upsample",
    "ZeroPad1d",
    "ZeroPad2d",
]
