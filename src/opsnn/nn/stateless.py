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
    (the stored parameters -> the function's keywords) where torch's module and function differ.
    ``training``: forward passes the module's mode as ``training=``; ``forward_args``: forward's own
    optional arguments after its ``inputs`` tensors (name -> default), passed by keyword."""

    fn: Callable
    params: dict
    call: dict | None = None
    fixed: dict = field(default_factory=dict)
    prepare: Callable | None = None
    doc: str = ""
    training: bool = False
    forward_args: dict = field(default_factory=dict)
    inputs: int = 1


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


def _unpool(fn) -> Row:
    params = {"kernel_size": REQUIRED, "stride": None, "padding": 0}
    return Row(fn, params, forward_args={"output_size": None}, inputs=2)


def _lp_pool(fn) -> Row:
    return Row(fn, {"norm_type": REQUIRED, "kernel_size": REQUIRED, "stride": None, "ceil_mode": False})


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
    "LogSigmoid": Row(F.logsigmoid, {}),
    "Softmin": Row(F.softmin, {"dim": None}),
    "Tanhshrink": Row(F.tanhshrink, {}),
    "Threshold": _activation(F.threshold, threshold=REQUIRED, value=REQUIRED),
    "GLU": Row(F.glu, {"dim": -1}),
    "Softmax2d": Row(F.softmax2d, {}),
    "RReLU": Row(F.rrelu, {"lower": 1.0 / 8, "upper": 1.0 / 3, "inplace": False}, training=True),
    "AlphaDropout": Row(F.alpha_dropout, {"p": 0.5, "inplace": False}, training=True),
    "FeatureAlphaDropout": Row(F.feature_alpha_dropout, {"p": 0.5, "inplace": False}, training=True),
    "AdaptiveMaxPool1d": Row(F.adaptive_max_pool1d, {"output_size": REQUIRED, "return_indices": False}),
    "AdaptiveMaxPool2d": Row(F.adaptive_max_pool2d, {"output_size": REQUIRED, "return_indices": False}),
    "AdaptiveMaxPool3d": Row(F.adaptive_max_pool3d, {"output_size": REQUIRED, "return_indices": False}),
    "AdaptiveAvgPool3d": Row(F.adaptive_avg_pool3d, {"output_size": REQUIRED}),
    "MaxUnpool1d": _unpool(F.max_unpool1d),
    "MaxUnpool2d": _unpool(F.max_unpool2d),
    "MaxUnpool3d": _unpool(F.max_unpool3d),
    "LPPool1d": _lp_pool(F.lp_pool1d),
    "LPPool2d": _lp_pool(F.lp_pool2d),
    "LPPool3d": _lp_pool(F.lp_pool3d),
    "LocalResponseNorm": Row(F.local_response_norm, {"size": REQUIRED, "alpha": 1e-4, "beta": 0.75, "k": 1.0}),
    "ChannelShuffle": Row(F.channel_shuffle, {"groups": REQUIRED}),
    "Unfold": Row(F.unfold, {"kernel_size": REQUIRED, "dilation": 1, "padding": 0, "stride": 1}),
    "Fold": Row(F.fold, {"output_size": REQUIRED, "kernel_size": REQUIRED, "dilation": 1, "padding": 0, "stride": 1}),
    "ZeroPad3d": Row(F.pad, {"padding": REQUIRED}, prepare=_pads(3)),
    "ReflectionPad3d": Row(F.pad, {"padding": REQUIRED}, fixed={"mode": "reflect"}, prepare=_pads(3)),
    "ReplicationPad3d": Row(F.pad, {"padding": REQUIRED}, fixed={"mode": "replicate"}, prepare=_pads(3)),
    "CircularPad1d": Row(F.pad, {"padding": REQUIRED}, fixed={"mode": "circular"}, prepare=_pads(1)),
    "CircularPad2d": Row(F.pad, {"padding": REQUIRED}, fixed={"mode": "circular"}, prepare=_pads(2)),
    "CircularPad3d": Row(F.pad, {"padding": REQUIRED}, fixed={"mode": "circular"}, prepare=_pads(3)),
    "UpsamplingNearest2d": Row(F.interpolate, {"size": None, "scale_factor": None}, fixed={"mode": "nearest"}),
    "UpsamplingBilinear2d": Row(
        F.interpolate, {"size": None, "scale_factor": None}, fixed={"mode": "bilinear", "align_corners": True}
    ),
    "PairwiseDistance": Row(F.pairwise_distance, {"p": 2.0, "eps": 1e-6, "keepdim": False}),
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

    def forward(self, *inputs, **kwargs):
        extra = {"training": self.training} if row.training else {}
        if row.forward_args:
            extra.update(_bind(f"{name}.forward", row.forward_args, inputs[row.inputs :], kwargs))
            inputs = inputs[: row.inputs]
        return row.fn(*inputs, **self._call, **extra)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={getattr(self, k)!r}" for k in row.params if getattr(self, k) != row.params[k])

    doc = row.doc or f"torch.nn.{name}: ``opsnn.nn.functional.{row.fn.__name__}`` with torch's constructor arguments."
    return type(name, (Module,), {"__init__": __init__, "forward": forward, "extra_repr": extra_repr, "__doc__": doc})


# one line per module, so tools (and readers) see each name
AdaptiveAvgPool1d = make_module("AdaptiveAvgPool1d", TABLE["AdaptiveAvgPool1d"])
AdaptiveAvgPool3d = make_module("AdaptiveAvgPool3d", TABLE["AdaptiveAvgPool3d"])
AdaptiveMaxPool1d = make_module("AdaptiveMaxPool1d", TABLE["AdaptiveMaxPool1d"])
AdaptiveMaxPool2d = make_module("AdaptiveMaxPool2d", TABLE["AdaptiveMaxPool2d"])
AdaptiveMaxPool3d = make_module("AdaptiveMaxPool3d", TABLE["AdaptiveMaxPool3d"])
AlphaDropout = make_module("AlphaDropout", TABLE["AlphaDropout"])
AvgPool1d = make_module("AvgPool1d", TABLE["AvgPool1d"])
AvgPool2d = make_module("AvgPool2d", TABLE["AvgPool2d"])
AvgPool3d = make_module("AvgPool3d", TABLE["AvgPool3d"])
CELU = make_module("CELU", TABLE["CELU"])
ChannelShuffle = make_module("ChannelShuffle", TABLE["ChannelShuffle"])
CircularPad1d = make_module("CircularPad1d", TABLE["CircularPad1d"])
CircularPad2d = make_module("CircularPad2d", TABLE["CircularPad2d"])
CircularPad3d = make_module("CircularPad3d", TABLE["CircularPad3d"])
ConstantPad1d = make_module("ConstantPad1d", TABLE["ConstantPad1d"])
ConstantPad2d = make_module("ConstantPad2d", TABLE["ConstantPad2d"])
ConstantPad3d = make_module("ConstantPad3d", TABLE["ConstantPad3d"])
CosineSimilarity = make_module("CosineSimilarity", TABLE["CosineSimilarity"])
ELU = make_module("ELU", TABLE["ELU"])
FeatureAlphaDropout = make_module("FeatureAlphaDropout", TABLE["FeatureAlphaDropout"])
Fold = make_module("Fold", TABLE["Fold"])
GLU = make_module("GLU", TABLE["GLU"])
Hardshrink = make_module("Hardshrink", TABLE["Hardshrink"])
Hardsigmoid = make_module("Hardsigmoid", TABLE["Hardsigmoid"])
Hardswish = make_module("Hardswish", TABLE["Hardswish"])
Hardtanh = make_module("Hardtanh", TABLE["Hardtanh"])
LPPool1d = make_module("LPPool1d", TABLE["LPPool1d"])
LPPool2d = make_module("LPPool2d", TABLE["LPPool2d"])
LPPool3d = make_module("LPPool3d", TABLE["LPPool3d"])
LeakyReLU = make_module("LeakyReLU", TABLE["LeakyReLU"])
LocalResponseNorm = make_module("LocalResponseNorm", TABLE["LocalResponseNorm"])
LogSigmoid = make_module("LogSigmoid", TABLE["LogSigmoid"])
LogSoftmax = make_module("LogSoftmax", TABLE["LogSoftmax"])
MaxPool1d = make_module("MaxPool1d", TABLE["MaxPool1d"])
MaxPool3d = make_module("MaxPool3d", TABLE["MaxPool3d"])
MaxUnpool1d = make_module("MaxUnpool1d", TABLE["MaxUnpool1d"])
MaxUnpool2d = make_module("MaxUnpool2d", TABLE["MaxUnpool2d"])
MaxUnpool3d = make_module("MaxUnpool3d", TABLE["MaxUnpool3d"])
Mish = make_module("Mish", TABLE["Mish"])
PairwiseDistance = make_module("PairwiseDistance", TABLE["PairwiseDistance"])
PixelShuffle = make_module("PixelShuffle", TABLE["PixelShuffle"])
PixelUnshuffle = make_module("PixelUnshuffle", TABLE["PixelUnshuffle"])
RReLU = make_module("RReLU", TABLE["RReLU"])
ReLU6 = make_module("ReLU6", TABLE["ReLU6"])
ReflectionPad1d = make_module("ReflectionPad1d", TABLE["ReflectionPad1d"])
ReflectionPad2d = make_module("ReflectionPad2d", TABLE["ReflectionPad2d"])
ReflectionPad3d = make_module("ReflectionPad3d", TABLE["ReflectionPad3d"])
ReplicationPad1d = make_module("ReplicationPad1d", TABLE["ReplicationPad1d"])
ReplicationPad2d = make_module("ReplicationPad2d", TABLE["ReplicationPad2d"])
ReplicationPad3d = make_module("ReplicationPad3d", TABLE["ReplicationPad3d"])
SELU = make_module("SELU", TABLE["SELU"])
Softmax2d = make_module("Softmax2d", TABLE["Softmax2d"])
Softmin = make_module("Softmin", TABLE["Softmin"])
Softplus = make_module("Softplus", TABLE["Softplus"])
Softshrink = make_module("Softshrink", TABLE["Softshrink"])
Softsign = make_module("Softsign", TABLE["Softsign"])
Tanhshrink = make_module("Tanhshrink", TABLE["Tanhshrink"])
Threshold = make_module("Threshold", TABLE["Threshold"])
Unflatten = make_module("Unflatten", TABLE["Unflatten"])
Unfold = make_module("Unfold", TABLE["Unfold"])
Upsample = make_module("Upsample", TABLE["Upsample"])
UpsamplingBilinear2d = make_module("UpsamplingBilinear2d", TABLE["UpsamplingBilinear2d"])
UpsamplingNearest2d = make_module("UpsamplingNearest2d", TABLE["UpsamplingNearest2d"])
ZeroPad1d = make_module("ZeroPad1d", TABLE["ZeroPad1d"])
ZeroPad2d = make_module("ZeroPad2d", TABLE["ZeroPad2d"])
ZeroPad3d = make_module("ZeroPad3d", TABLE["ZeroPad3d"])

__all__ = [
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool3d",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AdaptiveMaxPool3d",
    "AlphaDropout",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "CELU",
    "ChannelShuffle",
    "CircularPad1d",
    "CircularPad2d",
    "CircularPad3d",
    "ConstantPad1d",
    "ConstantPad2d",
    "ConstantPad3d",
    "CosineSimilarity",
    "ELU",
    "FeatureAlphaDropout",
    "Fold",
    "GLU",
    "Hardshrink",
    "Hardsigmoid",
    "Hardswish",
    "Hardtanh",
    "LPPool1d",
    "LPPool2d",
    "LPPool3d",
    "LeakyReLU",
    "LocalResponseNorm",
    "LogSigmoid",
    "LogSoftmax",
    "MaxPool1d",
    "MaxPool3d",
    "MaxUnpool1d",
    "MaxUnpool2d",
    "MaxUnpool3d",
    "Mish",
    "PairwiseDistance",
    "PixelShuffle",
    "PixelUnshuffle",
    "RReLU",
    "ReLU6",
    "ReflectionPad1d",
    "ReflectionPad2d",
    "ReflectionPad3d",
    "ReplicationPad1d",
    "ReplicationPad2d",
    "ReplicationPad3d",
    "SELU",
    "Softmax2d",
    "Softmin",
    "Softplus",
    "Softshrink",
    "Softsign",
    "Tanhshrink",
    "Threshold",
    "Unflatten",
    "Unfold",
    "Upsample",
    "UpsamplingBilinear2d",
    "UpsamplingNearest2d",
    "ZeroPad1d",
    "ZeroPad2d",
    "ZeroPad3d",
]
