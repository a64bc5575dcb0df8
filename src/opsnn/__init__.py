"""opsnn: a neural-network operator library and graph engine for the CPU (modelled on CANN ops-nn).

Ops run eagerly or in two phases; whole ONNX models compile to a planned, fused graph:

>>> import numpy as np, opsnn
>>> x = opsnn.tensor(np.random.rand(1, 3, 16, 16).astype(np.float32))
>>> w = opsnn.tensor(np.random.rand(8, 3, 3, 3).astype(np.float32))
>>> opsnn.ops.conv2d(x, w, None, stride=2, padding=1).shape         # eager
(1, 8, 8, 8)
>>> ex = opsnn.aclnn.conv2d.prepare(x, w, None, stride=2, padding=1) # prepare once, ex.run() many times
>>> cg = opsnn.compile(lambda t: opsnn.ops.relu(t), [np.ones((1, 3), np.float32)])
>>> cg.run([np.array([[-1, 2, -3]], np.float32)])[0].numpy().tolist() # or opsnn.compile("model.onnx")
[[0.0, 2.0, 0.0]]

Where to look: ``opsnn.ops`` (every operator; ``opsnn info --ops``), ``opsnn.aclnn`` (two-phase
API), ``opsnn.onnx`` (load ONNX files), ``opsnn.compile`` / ``CompiledGraph`` (the graph engine),
``opsnn.nn`` and ``opsnn.models`` (modules, ResNet / BERT / LLaMA builders), ``opsnn.llm``
(generation), ``opsnn.pipeline`` (video, tiling), ``opsnn.profiler`` and ``opsnn.tools``
(profiler, memory checker, precision compare), ``opsnn.config`` (settings). The README and
docs/ (one page per task, docs/ops.md for the operators) have more; ``opsnn --help`` lists the
command-line tools.
"""

import builtins as _builtins
import gc as _gc
import os as _os

# The import makes ~100K objects (with numba's) that live as long as the process: collecting while they pile
# up, and in every later full pass, is wasted work, so the collector is off meanwhile and they are frozen.
_gc_enabled = _gc.isenabled()
_gc_freeze = _os.environ.get("OPSNN_GC_FREEZE", "1") != "0"
if _gc_freeze:
    _gc.disable()
try:
    from ._blas_env import configure as _configure_blas

    _configure_blas()  # before anything imports numpy (which loads OpenBLAS); see _blas_env
    from . import runtime  # noqa: E402, F401 - its ISA cap, too, must be in the environment before numpy loads OpenBLAS
    from . import dtypes, errors  # noqa: E402
    from .runtime import Device, Event, Stream, context, current_stream, finalize, hooks, init, is_initialized
    from .runtime import memory
    from .runtime.threads import get_num_threads, set_num_threads
    from .tensor import Tensor, empty, from_dlpack, from_numpy, full, is_tensor, ones, tensor, zeros
    from . import ops
    from .ops import kernel_selector, register_kernel, register_op
    from .ops import arange, cat, eye, linspace, stack, where  # torch's names
    from .ops import empty_like, full_like, ones_like, zeros_like
    from .dtypes import bfloat16, bool_, float16, float32, float64, int8, int16, int32, int64, uint8
    from . import autograd  # noqa: E402 - before nn: Parameters require grad
    from .autograd import enable_grad, inference_mode, no_grad, set_grad_enabled
    from . import torch_api
    from .torch_api import *  # noqa: F403 - torch's top-level functions (exp, sum, gather, trace ...)
    from .dtypes import float16 as half, float32 as float, float64 as double  # noqa: A001, F401 - torch's dtype names
    from .dtypes import bool_ as bool, int16 as short, int32 as int, int64 as long  # noqa: A001, F401
    from . import aclnn, config, nn, models, tools
    from . import amp, optim  # noqa: E402
    from .amp import autocast  # noqa: E402
    from .checkpoint import load, load_checkpoint, save, save_checkpoint  # noqa: E402
    from .nn.init import manual_seed, rand, randint, randn, randperm  # noqa: E402
    from .tools import profiler
    from .tools.plot import plot_graph
    from . import debug, graph, optimize, llm, pipeline
    from . import onnx
    from .onnx.session import GraphOptimizationLevel, InferenceSession, RunOptions, SessionOptions
    from .graph.compiler import CompiledGraph
    from .frontend import compile
    from .graph.pattern import GraphPattern, GraphTemplate

    from .version import __version__  # noqa: F401 - opsnn.__version__

    if _gc_freeze:
        _gc.freeze()
finally:
    if _gc_enabled:
        _gc.enable()

from .tools import debug_log as _debug_log

_debug_log.configure_from_env()

__all__ = [
    "manual_seed",
    "load_checkpoint",
    "save_checkpoint",
    "amp",
    "autocast",
    "optim",
    "autograd",
    "enable_grad",
    "no_grad",
    "set_grad_enabled",
    "GraphOptimizationLevel",
    "InferenceSession",
    "RunOptions",
    "SessionOptions",
    "llm",
    "models",
    "nn",
    "onnx",
    "pipeline",
    "plot_graph",
    "CompiledGraph",
    "GraphPattern",
    "GraphTemplate",
    "compile",
    "debug",
    "graph",
    "optimize",
    "Device",
    "Event",
    "Stream",
    "Tensor",
    "aclnn",
    "config",
    "context",
    "current_stream",
    "dtypes",
    "empty",
    "errors",
    "finalize",
    "from_dlpack",
    "from_numpy",
    "full",
    "get_num_threads",
    "hooks",
    "init",
    "is_initialized",
    "kernel_selector",
    "memory",
    "ones",
    "ops",
    "profiler",
    "tools",
    "register_kernel",
    "register_op",
    "set_num_threads",
    "tensor",
    "zeros",
    "arange",
    "cat",
    "eye",
    "linspace",
    "rand",
    "randint",
    "randn",
    "randperm",
    "stack",
    "where",
    "empty_like",
    "full_like",
    "ones_like",
    "zeros_like",
    "is_tensor",
    "inference_mode",
    "bfloat16",
    "bool_",
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
]
# torch's names that are Python builtins (sum, max, int ...) stay out of ``from opsnn import *``
__all__ += ["half", "double", "short", "long", "load", "save"]
__all__ += [n for n in torch_api.__all__ if not hasattr(_builtins, n) and n not in __all__]
