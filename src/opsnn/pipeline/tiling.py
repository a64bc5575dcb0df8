"""Tiled inference of a conv stack on a huge image: equal to the untiled result, in bounded memory.

:func:`receptive_field` walks a graph (a traced function, a Module, or a CompiledGraph) and
derives, from each conv / pool / upsample / pointwise op, the *halo*: how many input pixels
on each side one output pixel depends on, the net scale (output pixels per input pixel) and
the alignment that strided layers need. :class:`TiledExecutor` then cuts the image into
``tile x tile`` regions, runs each on a crop widened by the halo (clamped inside the image, so
every crop has one shape and one compiled plan) and keeps the crop's centre. Because crop
borders inside the image sit at least ``halo`` pixels away from every kept pixel, and crop
borders on the image border are the image border, each kept pixel sees exactly the inputs
(and zero padding) it sees in the whole-image run::

    >>> import opsnn, numpy as np
    >>> from opsnn.models.superres import superres
    >>> from opsnn.pipeline import tiled
    >>> net = superres(scale=2, channels=8)
    >>> img = np.random.default_rng(0).random((1, 1, 100, 90), dtype=np.float32)
    >>> out = tiled(net, img, tile=32)
    >>> out.shape
    (1, 1, 200, 180)
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from ..errors import OpsnnError, ParamInvalidError
from ..graph.ir import Graph

#: ops that act on each pixel independently (given per-channel or scalar constants)
_POINTWISE_CATEGORIES = ("elementwise", "activation")
_POINTWISE = {
    "BatchNormalization",
    "Cast",
    "CastLike",
    "Identity",
    "Dropout",
    "Clip",
    "Where",
    "Relu",
    "PRelu",
    "LeakyRelu",
    "Sigmoid",
    "Tanh",
    "FusedElementwise",
    "QuantizeLinear",
    "DequantizeLinear",
    "ToBlocked",  # the blocked layout's reorders keep each pixel's values (opsnn domain)
    "FromBlocked",
}
#: ops with a window; FusedConv and BlockedConv (``act(conv(x) + z)``) may add a per-pixel residual z
_WINDOWED = {
    "Conv",
    "FusedConv",
    "BlockedConv",
    "MaxPool",
    "BlockedMaxPool",
    "AveragePool",
    "LpPool",
    "ConvInteger",
    "QLinearConv",
}
_RESIDUAL = ("FusedConv", "BlockedConv")


@dataclass
class ReceptiveField:
    """What tiling needs to know about a graph: ``halo`` (input pixels each side of a tile,
    a multiple of ``align``), ``scale`` (output pixels per input pixel), ``align`` (tile
    origins must be multiples of it: the product of strides) and ``steps`` (each spatial
    node's contribution, for explanations)."""

    halo: int
    scale: Fraction
    align: int
    reach: Fraction = Fraction(0)
    steps: list = field(default_factory=list)

    def explain(self) -> str:
        lines = [
            f"halo {self.halo} input px (reach {float(self.reach):g}, aligned to {self.align}), scale x{self.scale}"
        ]
        lines += [f"  {s}" for s in self.steps]
        return "\n".join(lines)


class _Spatial:
    """Per value: ``f`` (value px per input px), ``reach`` (input px each side), ``align``."""

    __slots__ = ("f", "reach", "align")

    def __init__(self, f=Fraction(1), reach=Fraction(0), align=1):
        self.f, self.reach, self.align = f, reach, align


def _fail(node, why: str):
    raise ParamInvalidError(
        f"tiling: cannot derive the receptive field at node {node.name} ({node.op_type}): "
        f"{why}; pass halo= explicitly if you know it"
    )


def _pair(v, default, node, what):
    if v is None:
        return [default, default]
    v = [int(a) for a in (v if isinstance(v, (list, tuple, np.ndarray)) else [v])]
    if len(v) != 2:
        _fail(node, f"{what} {v} is not 2-D")
    return v


def receptive_field(model, example=None) -> ReceptiveField:
    """The :class:`ReceptiveField` of a Graph, CompiledGraph, or a callable traced on
    ``example`` (an NCHW array). The graph's first input is the image."""
    graph = _graph_of(model, example)
    return _analyze(graph)


def _graph_of(model, example) -> Graph:
    from ..graph.compiler import CompiledGraph
    from ..graph.tracing import trace

    if isinstance(model, CompiledGraph):
        return model.graph
    if isinstance(model, Graph):
        return model
    if callable(model):
        if example is None:
            raise ParamInvalidError("receptive_field: a callable needs an example input to be traced")
        return trace(model, [example])
    raise ParamInvalidError(f"tiling: model must be a CompiledGraph, Graph or callable, got {type(model).__name__}")


def _analyze(graph: Graph) -> ReceptiveField:
    from ..ops.registry import get_op, has_op

    inputs = [v.name for v in graph.inputs if v.name not in graph.initializers]
    if not inputs:
        raise ParamInvalidError(f"tiling: graph {graph.name} has no input")
    spatial: dict = {inputs[0]: _Spatial()}
    for _extra in inputs[1:]:
        raise ParamInvalidError(
            f"tiling: graph {graph.name} has more than one input ({inputs}); tiling feeds one image"
        )
    consts = dict(graph.initializers)
    steps = []
    for node in graph.nodes:
        ins = [spatial.get(n) for n in node.inputs]
        sp_ins = [s for s in ins if s is not None]
        if not sp_ins:  # computed from constants only (shape arithmetic, weights): not spatial
            _fold(node, consts)
            continue
        op = node.op_type
        rec = get_op(op, node.domain) if has_op(op, node.domain) else None
        first = ins[0]
        if op in _WINDOWED:
            residual = ins[3] if op in _RESIDUAL and len(ins) > 3 else None  # act(conv(x) + z): z is per pixel
            if (
                first is None
                or any(s is not None for s in ins[1:3])
                or any(s is not None for s in ins[3:])
                and op not in _RESIDUAL
            ):
                _fail(node, "only the data input may depend on the image (weights must be constants)")
            k = node.attrs.get("kernel_shape")
            if k is None:
                w = consts.get(node.inputs[1]) if len(node.inputs) > 1 else None
                if w is None:
                    _fail(node, "kernel size unknown (no kernel_shape and the weight is not a constant)")
                k = list(np.shape(w)[2:])
            k = _pair(k, 1, node, "kernel_shape")
            s = _pair(node.attrs.get("strides"), 1, node, "strides")
            d = _pair(node.attrs.get("dilations"), 1, node, "dilations")
            pads = node.attrs.get("pads") or [0, 0, 0, 0]
            auto = node.attrs.get("auto_pad") or "NOTSET"
            auto = auto.decode() if isinstance(auto, bytes) else auto
            if len(pads) != 4:
                _fail(node, f"pads {pads} are not 2-D")
            if auto not in ("NOTSET", "SAME_UPPER", "SAME_LOWER"):
                _fail(node, f"auto_pad {auto} (VALID) shrinks the image, so tiles would not line up")
            reach_v = 0
            for ax in range(2):
                e = (k[ax] - 1) * d[ax] + 1
                if auto != "NOTSET":
                    pb = pe = e - 1  # a bound: SAME pads split (about) e - 1 between the sides
                else:
                    pb, pe = int(pads[ax]), int(pads[ax + 2])
                    # out = floor((L + pb + pe - e) / s) + 1 equals L / s (L a multiple of s) iff this holds
                    if not e - s[ax] <= pb + pe <= e - 1:
                        _fail(
                            node,
                            f"pads {list(pads)} with kernel {k}, dilation {d} and stride {s} change the "
                            "output size beyond the stride (only 'same'-padded layers tile)",
                        )
                reach_v = max(reach_v, pb, pe, e - 1 - pb)
            if s[0] != s[1]:
                _fail(node, f"strides {s} differ per axis")
            stride = s[0]
            reach = first.reach + Fraction(reach_v) / first.f
            ratio = Fraction(stride) / first.f  # input px per step of this layer's output grid
            align = math.lcm(first.align, ratio.numerator)
            out = _Spatial(first.f / stride, reach, align)
            if residual is not None:
                out = _merge(node, [out, residual])
            steps.append(
                f"{node.name} ({op}): kernel {k}, stride {stride}, dilation {d} -> reach "
                f"+{float(Fraction(reach_v) / first.f):g}"
            )
        elif op in ("DepthToSpace", "SpaceToDepth"):
            b = int(node.attrs.get("blocksize", 1))
            if op == "DepthToSpace":
                out = _Spatial(first.f * b, first.reach, first.align)
            else:
                ratio = Fraction(b) / first.f
                out = _Spatial(first.f / b, first.reach, math.lcm(first.align, ratio.numerator))
            steps.append(f"{node.name} ({op}): blocksize {b}")
        elif op == "Resize":
            if any(s is not None for s in ins[1:]):
                _fail(node, "its scales/sizes depend on the image")
            scales = consts.get(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
            if scales is None or np.size(scales) == 0:
                _fail(node, "it resizes to fixed sizes (only integer scale factors tile)")
            scales = np.asarray(scales, np.float64).reshape(-1)
            sp = scales[-2:]
            if sp[0] != sp[1] or sp[0] < 1 or sp[0] != round(sp[0]) or np.any(scales[:-2] != 1):
                _fail(node, f"scales {scales.tolist()} (only equal integer upsampling of H and W tiles)")
            mode = node.attrs.get("mode", "nearest")
            mode = mode.decode() if isinstance(mode, bytes) else mode
            reach_v = 2 if mode == "cubic" else 1  # interpolation taps either side, in pre-resize pixels
            out = _Spatial(first.f * int(sp[0]), first.reach + Fraction(reach_v) / first.f, first.align)
            steps.append(f"{node.name} (Resize {mode} x{int(sp[0])}) -> reach +{float(Fraction(reach_v) / first.f):g}")
        elif op == "Concat":
            axis = int(node.attrs.get("axis", 0))
            if axis not in (1, -3):
                _fail(node, f"concat along axis {axis} (only channels, axis 1, tiles)")
            out = _merge(node, sp_ins)
        elif op in _POINTWISE or (rec is not None and rec.category in _POINTWISE_CATEGORIES):
            for name, s in zip(node.inputs, ins):
                if s is None and name:
                    c = consts.get(name)
                    if c is None:
                        _fail(node, f"input {name!r} is computed at run time but not from the image")
                    shp = np.shape(c)
                    if (
                        len(shp) >= 2
                        and tuple(shp[-2:]) != (1, 1)
                        or len(shp) < 2
                        and int(np.prod(shp)) > 1
                        and op not in ("BatchNormalization", "PRelu")
                    ):
                        _fail(node, f"constant {name!r} of shape {shp} varies over the image's H/W axes")
            out = _merge(node, sp_ins)
        else:
            _fail(node, "not a convolution, pooling window, pixel shuffle, integer resize or per-pixel op")
        for o in node.outputs:
            if o:
                spatial[o] = out
    outs = [spatial.get(o) for o in graph.output_names]
    if not outs or any(o is None for o in outs):
        raise ParamInvalidError(
            f"tiling: graph {graph.name}'s outputs {graph.output_names} must all depend on the image"
        )
    if len({o.f for o in outs}) != 1:
        raise ParamInvalidError(
            f"tiling: graph {graph.name}'s outputs have different scales {[str(o.f) for o in outs]}"
        )
    align = math.lcm(*[o.align for o in outs])
    reach = max(o.reach for o in outs)
    halo = math.ceil(reach)
    halo = -(-halo // align) * align
    return ReceptiveField(halo=halo, scale=outs[0].f, align=align, reach=reach, steps=steps)


def _fold(node, consts: dict) -> None:
    """Evaluate a node of constants (small ones) so later checks can see the value's shape."""
    from ..ops import run_op
    from ..ops.registry import has_op

    try:
        if node.op_type == "Constant" and not node.domain:
            from ..graph.interpreter import BUILTINS

            vals = [BUILTINS[("", "Constant")](None, node, [], None)[0].numpy()]
        else:
            args = [consts[n] if n else None for n in node.inputs]
            if not has_op(node.op_type, node.domain) or any(a is not None and np.size(a) > (1 << 20) for a in args):
                return
            vals = [
                t.numpy()
                for t in run_op(node.op_type, args, dict(node.attrs), domain=node.domain, num_outputs=len(node.outputs))
            ]
    except (KeyError, OpsnnError):
        return  # left unknown: a pointwise op reading it is then refused
    for o, v in zip(node.outputs, vals):
        if o:
            consts[o] = np.asarray(v)


def _merge(node, sp_ins) -> _Spatial:
    fs = {s.f for s in sp_ins}
    if len(fs) != 1:
        _fail(node, f"it combines values at different scales {[str(f) for f in fs]}")
    return _Spatial(sp_ins[0].f, max(s.reach for s in sp_ins), math.lcm(*[s.align for s in sp_ins]))


def _windows(size: int, tile: int, crop: int):
    """(start, end, crop_start) per tile along one axis; every crop is ``crop`` long and clamped
    inside the image so that all crops share one shape."""
    out = []
    for start in range(0, size, tile):
        end = min(start + tile, size)
        halo = (crop - tile) // 2
        c0 = min(max(start - halo, 0), size - crop)
        out.append((start, end, c0))
    return out


class TiledExecutor:
    """Run ``model`` (a CompiledGraph, Graph, Module or function of one NCHW tensor) on large
    images tile by tile; see the module docstring.

    ``halo=None`` derives it from the model's receptive field (a given halo smaller than that
    raises, since tiles would then differ from the whole-image result). ``max_working_bytes``
    bounds one tile's working set (its crop, the compiled plan's arena with the kernels'
    workspaces, its output): the tile is halved until a planned crop fits. ``stats`` after a
    run: tiles, tile and crop shape, halo, scale, bytes of input/output, the tile's working set,
    the pool's peak (reset at the start of the run, as ``opsnn.memory.summary()['peak_bytes']``)
    and wall time.
    """

    def __init__(self, model, tile: int = 512, halo: int | None = None, max_working_bytes: int | None = None):
        if not isinstance(tile, int) or isinstance(tile, bool) or tile < 1:
            raise ParamInvalidError(f"tiled: tile must be a positive int, got {tile!r}")
        if halo is not None and (not isinstance(halo, int) or isinstance(halo, bool) or halo < 0):
            raise ParamInvalidError(f"tiled: halo must be an int >= 0 or None, got {halo!r}")
        if max_working_bytes is not None and (not isinstance(max_working_bytes, int) or max_working_bytes < 1):
            raise ParamInvalidError(
                f"tiled: max_working_bytes must be a positive int or None, got {max_working_bytes!r}"
            )
        self.max_working_bytes = max_working_bytes
        from ..graph.compiler import CompiledGraph

        if not isinstance(model, (CompiledGraph, Graph)) and not callable(model):
            raise ParamInvalidError(
                f"tiled: model must be a CompiledGraph, Graph or callable, got {type(model).__name__}"
            )
        self.model = model
        self.tile = tile
        self.user_halo = halo
        self.field: ReceptiveField | None = None
        self.compiled = model if isinstance(model, CompiledGraph) else None
        self.stats: dict = {}

    # -- preparation --------------------------------------------------------------------------------
    def _prepare(self, example: np.ndarray) -> None:
        from ..frontend import compile

        if self.field is not None:
            return
        from ..graph.tracing import trace

        if isinstance(self.model, Graph):
            graph = self.model
        elif self.compiled is not None:
            graph = self.compiled.graph
        else:
            graph = trace(self.model, [example], dynamic_dims={0: {0: "batch", 2: "height", 3: "width"}})
        try:
            rf = _analyze(graph)
        except ParamInvalidError:
            if self.user_halo is None:
                raise
            rf = None
        if rf is not None and self.user_halo is not None:
            if self.user_halo < rf.halo:
                raise ParamInvalidError(
                    f"tiled: halo={self.user_halo} is smaller than the model's receptive field "
                    f"needs ({rf.halo} input px each side); tiles would differ from the "
                    "whole-image result"
                )
            rf = ReceptiveField(-(-self.user_halo // rf.align) * rf.align, rf.scale, rf.align, rf.reach, rf.steps)
        self.field = rf
        if self.compiled is None:
            self.compiled = compile(graph)

    def _probe(self, crop_shape: tuple, dtype) -> tuple[Fraction, int]:
        """Plan and run one zero crop: the scale it shows and the tile's working set in bytes."""
        crop = np.zeros(crop_shape, dtype)
        out = self.compiled.run([crop])[0]
        arena = self.compiled.memory_report().get("arena_bytes", 0)
        sh, sw = Fraction(out.shape[2], crop_shape[2]), Fraction(out.shape[3], crop_shape[3])
        if sh != sw:
            raise ParamInvalidError(f"tiled: the model scales H by {sh} but W by {sw}")
        return sh, crop.nbytes + arena + out.numpy().nbytes

    def _drop_plan(self, crop_shape: tuple) -> None:
        """Free the arena of a crop size that will not be used (its plan stays cached otherwise)."""
        cg = self.compiled
        cg.drop_plans({cg.input_names[0]: crop_shape})

    def _choose_tile(self, n, c, h, w, dtype, halo, align) -> tuple[int, Fraction | None, int | None]:
        """The tile size (halved until the working set fits ``max_working_bytes``), the probed
        scale and working set (None when nothing was probed)."""
        tile = self.tile
        scale = working = None
        if self.max_working_bytes is None and self.field is not None:
            return tile, None, None
        while True:
            shape = (n, c, min(h, tile + 2 * halo), min(w, tile + 2 * halo))
            scale, working = self._probe(shape, dtype)
            smaller = (tile // 2) // align * align
            if (
                self.max_working_bytes is None
                or working <= self.max_working_bytes
                or smaller < max(align, 1)
                or smaller == tile
            ):
                return tile, scale, working
            self._drop_plan(shape)
            tile = smaller

    # -- running ------------------------------------------------------------------------------------------
    def run(self, image, out=None):
        """Run on ``image`` ((N, C, H, W) numpy array or Tensor); returns an opsnn Tensor (or
        writes ``out``, a Tensor/array of the output's shape and dtype)."""
        from ..runtime import memory
        from ..tensor import Tensor, empty, from_numpy

        arr = image.numpy() if isinstance(image, Tensor) else image
        if not isinstance(arr, np.ndarray):
            raise ParamInvalidError(f"tiled: image must be a numpy array or opsnn Tensor, got {type(image).__name__}")
        if arr.ndim != 4:
            raise ParamInvalidError(f"tiled: image must be NCHW (4-D), got shape {arr.shape}")
        n, c, h, w = arr.shape
        if h == 0 or w == 0 or n == 0:
            raise ParamInvalidError(f"tiled: image is empty (shape {arr.shape})")
        t0 = time.perf_counter()
        self._prepare(np.zeros((n, c, min(h, self.tile), min(w, self.tile)), arr.dtype))
        rf = self.field
        halo = rf.halo if rf is not None else self.user_halo
        align = rf.align if rf is not None else 1
        if self.tile % align:
            raise ParamInvalidError(f"tiled: tile={self.tile} must be a multiple of {align} (the model's total stride)")
        if h % align or w % align:
            raise ParamInvalidError(
                f"tiled: image size {h}x{w} must be a multiple of {align} (the model's total stride) to tile exactly"
            )
        tile, probed_scale, working = self._choose_tile(n, c, h, w, arr.dtype, halo, align)
        gc.collect()
        memory.reset_peak()  # the plan for the chosen crop (if probed) is part of the baseline
        base = memory.current_bytes()
        crop_h, crop_w = min(h, tile + 2 * halo), min(w, tile + 2 * halo)
        scale = rf.scale if rf is not None else probed_scale
        oh, ow = h * scale, w * scale
        if oh.denominator != 1 or ow.denominator != 1:
            raise ParamInvalidError(f"tiled: image {h}x{w} times the model's scale {scale} is not whole")
        oh, ow = int(oh), int(ow)
        rows, cols = _windows(h, tile, crop_h), _windows(w, tile, crop_w)
        crop_buf = empty((n, c, crop_h, crop_w), arr.dtype)
        cb = crop_buf.numpy()
        result = None
        n_tiles = 0
        for y0, y1, cy in rows:
            for x0, x1, cx in cols:
                np.copyto(cb, arr[:, :, cy : cy + crop_h, cx : cx + crop_w])
                try:
                    y = self.compiled.run([crop_buf])[0]
                    ya = y.numpy()
                except OpsnnError as exc:
                    where = f"tiled: tile rows {y0}:{y1}, cols {x0}:{x1} (crop {crop_h}x{crop_w} at {cy},{cx})"
                    try:
                        err = type(exc)(f"{where}: {exc.args[0] if exc.args else exc}")
                    except TypeError:  # an error type with its own constructor: keep it as it is
                        raise exc from None
                    raise err from exc
                want = (crop_h * scale, crop_w * scale)
                if ya.ndim != 4 or ya.shape[0] != n or (ya.shape[2], ya.shape[3]) != want:
                    raise ParamInvalidError(
                        f"tiled: the model maps a {crop_h}x{crop_w} crop to {ya.shape}, expected "
                        f"(N, C', {want[0]}, {want[1]}) for scale {scale}: only size-preserving "
                        "('same'-padded) stacks tile"
                    )
                if result is None:
                    if out is None:
                        result = empty((n, ya.shape[1], oh, ow), ya.dtype)
                    else:
                        result = out if isinstance(out, Tensor) else from_numpy(out)
                        if result.shape != (n, ya.shape[1], oh, ow) or result.dtype != ya.dtype:
                            raise ParamInvalidError(
                                f"tiled: out has shape {result.shape} {result.dtype}, expected "
                                f"{(n, ya.shape[1], oh, ow)} {ya.dtype}"
                            )
                    ra = result.numpy()
                s = scale
                ra[:, :, int(y0 * s) : int(y1 * s), int(x0 * s) : int(x1 * s)] = ya[
                    :, :, int((y0 - cy) * s) : int((y1 - cy) * s), int((x0 - cx) * s) : int((x1 - cx) * s)
                ]
                tile_out_bytes = ya.nbytes
                y = ya = None
                n_tiles += 1
        cb_bytes = cb.nbytes
        del crop_buf, cb
        summary = memory.summary()
        in_bytes, out_bytes = arr.nbytes, result.nbytes
        if working is None:
            working = cb_bytes + self.compiled.memory_report().get("arena_bytes", 0) + tile_out_bytes
        self.stats = {
            "tiles": n_tiles,
            "tile": tile,
            "halo": halo,
            "crop": [crop_h, crop_w],
            "working_bytes": working,
            "scale": str(scale),
            "align": align,
            "input_shape": list(arr.shape),
            "output_shape": list(result.shape),
            "input_bytes": in_bytes,
            "output_bytes": out_bytes,
            "baseline_bytes": base,
            "peak_bytes": summary["peak_bytes"],
            "peak_over_baseline_bytes": summary["peak_bytes"] - base,
            "input_in_pool": _in_pool(arr),
            "wall_s": round(time.perf_counter() - t0, 4),
            "overlap_fraction": round((crop_h * crop_w * len(rows) * len(cols)) / (h * w) - 1, 4),
        }
        return result


def _in_pool(arr: np.ndarray) -> bool:
    from ..tensor import Storage

    base = arr
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return isinstance(base, Storage)


def tiled(model, image, tile: int = 512, halo: int | None = None, out=None, max_working_bytes: int | None = None):
    """Run ``model`` on ``image`` (NCHW) by ``tile x tile`` tiles with a ``halo`` derived from
    its receptive field; the result equals ``model(image)``. See :class:`TiledExecutor`
    (which also reports the run's memory use in ``.stats``)."""
    return TiledExecutor(model, tile=tile, halo=halo, max_working_bytes=max_working_bytes).run(image, out=out)
