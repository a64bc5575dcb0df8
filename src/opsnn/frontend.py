"""The front door: ``opsnn.compile`` turns a Graph, an ONNX model, an ``opsnn.nn`` module or a
function of tensors into a CompiledGraph, reusing an earlier process's work from the compile cache.

It sits above the graph layer: the graph compiler (:mod:`opsnn.graph.compiler`) takes graphs
and functions only, and this module brings the frontends (the ONNX importer, ``nn.Module``) to it.
"""

from __future__ import annotations

import hashlib
import logging
import os

import numpy as np

from .autograd.compiled import CompiledTrainStep
from .errors import OpsnnError, ParamInvalidError
from .graph import compiler as _compiler
from .graph.compiler import CompiledGraph
from .graph.ir import Graph
from .graph.tracing import trace
from .nn.module import Module
from .runtime.context import context

log = logging.getLogger("opsnn.graph.compile")


def compile(
    model,
    example_inputs=None,
    *,
    dynamic_dims=None,
    static_shapes=None,
    level: int = 3,
    disabled_passes=None,
    max_plans: int = 16,
    memory_optimization: bool | None = None,
    cache_dir: str | None = None,
    graph_hooks=(),
) -> CompiledGraph | CompiledTrainStep:
    """Compile a Graph, an ONNX model (path or ModelProto) or a Python function of tensors.

    A function given without ``example_inputs`` (a training step: forward, loss, ``backward``,
    ``optimizer.step``) returns a :class:`~opsnn.autograd.compiled.CompiledTrainStep`, traced on its
    first call per input shapes into one graph with the backward and the in-place update
    (``graph_hooks``: see there; docs/training.md, "Compiled training").

    ``example_inputs`` and ``dynamic_dims`` (``{arg: {dim: "name"}}``) are for functions and
    ``opsnn.nn`` modules, which are traced (a module as :meth:`Module.to_graph` does).
    ``static_shapes``: a list of ``{input: shape}`` to plan ahead of time.
    ``cache_dir`` (or ``$OPSNN_CACHE_DIR``): reuse a graph optimized and planned by an earlier
    process (keyed by the graph's hash); ``cg.persist()`` writes it.

    >>> import opsnn, numpy as np
    >>> cg = opsnn.compile(lambda x: opsnn.ops.relu(x), [np.ones((2, 3), np.float32)],
    ...                    dynamic_dims={"x": {0: "batch"}})
    >>> cg.run([np.full((5, 3), -1, np.float32)])[0].shape
    (5, 3)
    """
    context()
    if callable(model) and not isinstance(model, (Graph, Module)) and example_inputs is None:
        # a training step (or any function of tensors) traced on its first call per input shapes
        given = [
            k
            for k, v in (("dynamic_dims", dynamic_dims), ("static_shapes", static_shapes), ("cache_dir", cache_dir))
            if v
        ]
        if given:
            raise ParamInvalidError(
                f"compile: {given} apply to graphs and to functions given example_inputs; a training step "
                "(a function without example_inputs) is traced per input shapes on its calls"
            )
        names, modules = _module_names(model)
        return CompiledTrainStep(
            model,
            names=names,
            modules=modules,
            level=level,
            disabled_passes=disabled_passes,
            max_plans=max_plans,
            memory_optimization=memory_optimization,
            graph_hooks=graph_hooks,
        )
    if isinstance(model, Graph):
        graph = model
    elif callable(model):
        if example_inputs is None:
            raise ParamInvalidError("compile: a module needs example_inputs to be traced")
        # a Module traces as Module.to_graph does: inputs named after forward's arguments, weights
        # after their state_dict keys, nested outputs (a decoder's logits and cache) flattened
        graph = (
            model.to_graph(example_inputs, dynamic_dims)
            if isinstance(model, Module)
            else trace(model, example_inputs, dynamic_dims)
        )
    elif (
        isinstance(model, (str, bytes, bytearray, os.PathLike))
        or hasattr(model, "read")
        or hasattr(model, "SerializeToString")
    ):
        from . import onnx as _onnx

        graph = _onnx.load(model)
    else:
        raise ParamInvalidError(
            "compile: expected a Graph, an ONNX model (path, bytes, file or ModelProto), an opsnn.nn Module "
            f"or a function, got {type(model).__name__}"
        )
    cache_dir = cache_dir or os.environ.get("OPSNN_CACHE_DIR")
    entry = None
    if cache_dir:
        entry = _cache_entry(graph, cache_dir, level, disabled_passes)
        cached = _load_cached(entry, graph, max_plans, memory_optimization)
        if cached is not None:
            if static_shapes:
                cached.prepare_shapes(static_shapes)
            return cached
    cg = _compiler.compile(
        graph,
        level=level,
        disabled_passes=disabled_passes,
        max_plans=max_plans,
        memory_optimization=memory_optimization,
    )
    cg.cache_dir = entry
    if static_shapes:
        cg.prepare_shapes(static_shapes)
    return cg


def _module_names(fn) -> tuple[dict, list]:
    """``({id(tensor): name}, modules)`` for the parameters and buffers of the ``opsnn.nn`` modules a
    function reaches through its closure, globals or bound ``self`` (names for the traced graph's
    state; the modules' train/eval modes are part of the compiled step's cache key)."""
    found: dict = {}
    modules: list = []
    code = getattr(fn, "__code__", None)
    cands = []
    if getattr(fn, "__self__", None) is not None:
        cands.append(("self", fn.__self__))
    if code is not None:
        cells = getattr(fn, "__closure__", None) or ()
        cands += [(n, c.cell_contents) for n, c in zip(code.co_freevars, cells) if _cell_ok(c)]
        g = getattr(fn, "__globals__", {})
        cands += [(n, g[n]) for n in code.co_names if n in g]
    for var, obj in cands:
        if isinstance(obj, Module):
            modules.append(obj)
            for n, t in obj.state_dict().items():
                found.setdefault(id(t), f"{var}.{n}")
            for n, t in obj.named_parameters():
                found.setdefault(id(t), f"{var}.{n}")
    return found, modules


def _cell_ok(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _cache_entry(graph: Graph, cache_dir: str, level: int, disabled_passes) -> str:
    """The compile cache folder of ``graph`` compiled with these settings on this machine."""
    from .graph.blocked_layout import machine_key
    from .graph.mixed_precision import policy as _mp_policy
    from .graph.passes import disabled_passes as _off

    # the mixed-precision policy changes the compiled graph (casts, 16-bit weights): part of the key
    mp = ",".join(f"{op}:{np.dtype(dt).name}" for op, dt in sorted(_mp_policy().items()))
    # so does the CPU (and oneDNN setting): the blocked-layout pass rewrites for this one's block
    key = (
        f"{_compiler.graph_hash(graph)}-L{level}-{'-'.join(sorted(_off() | set(disabled_passes or ())))}"
        f"-MP{mp}-{machine_key()}"
    )
    return os.path.join(cache_dir, hashlib.sha256(key.encode()).hexdigest()[:20])


def _load_cached(entry: str, original: Graph, max_plans: int, memory_optimization) -> CompiledGraph | None:
    import json

    from . import onnx as _onnx

    gpath, ppath = os.path.join(entry, "graph.onnx"), os.path.join(entry, "plans.json")
    if not (os.path.exists(gpath) and os.path.exists(ppath)):
        return None
    try:
        with open(ppath) as f:
            meta = json.load(f)
        graph = _onnx.load(gpath)
    except (OSError, ValueError, OpsnnError) as exc:
        log.warning("compile cache %s unreadable (%s); compiling afresh", entry, exc)
        return None
    if meta.get("format") != 1:
        return None
    if memory_optimization is None:
        memory_optimization = _compiler.memory_optimization_enabled()
    cg = CompiledGraph(graph, original=original, max_plans=max_plans, memory_optimization=memory_optimization)
    cg.cache_dir = entry
    cg.loaded_from_cache = True
    cg.kernel_choices = dict(meta.get("kernels", {}))
    for shapes in meta.get("shapes", []):
        try:
            cg.prepare_shapes([{k: tuple(v) for k, v in shapes.items()}])
        except OpsnnError as exc:
            log.warning("compile cache %s: could not re-plan %s (%s)", entry, shapes, exc)
    return cg


__all__ = ["compile"]
