"""opsnn: a neural-network operator library and graph engine (modelled on CANN ops-nn).

>>> import opsnn, numpy as np
>>> x = opsnn.tensor(np.random.rand(1, 3, 16, 16).astype(np.float32))
>>> w = opsnn.tensor(np.random.rand(8, 3, 3, 3).astype(np.float32))
>>> y = opsnn.ops.conv2d(x, w, None, stride=2, padding=1)
>>> y.shape
(1, 8, 8, 8)
"""
from ._blas_env import configure as _configure_blas

_configure_blas()  # before anything imports numpy (which loads OpenBLAS); see _blas_env
from . import dtypes, errors  # noqa: E402
from .runtime import Device, Event, Stream, context, current_stream, finalize, hooks, init, is_initialized
from .runtime import memory
from .runtime.threads import get_num_threads, set_num_threads
from .tensor import Tensor, empty, from_dlpack, from_numpy, full, ones, tensor, zeros
from . import ops
from .ops import kernel_selector, register_kernel, register_op
from . import aclnn, config, nn, models, tools
from .tools import profiler
from .tools.plot import plot_graph
from . import debug, graph, optimize, llm, pipeline
from . import onnx
from .graph.compiler import CompiledGraph
from .frontend import compile
from .graph.pattern import GraphPattern, GraphTemplate

from .version import __version__  # noqa: F401 - opsnn.__version__

from .tools import debug_log as _debug_log

_debug_log.configure_from_env()

__all__ = ["nn", "onnx", "plot_graph", "CompiledGraph", "GraphPattern", "GraphTemplate", "compile", "debug", "graph", "optimize", "Device", "Event", "Stream", "Tensor", "aclnn", "config", "context", "current_stream", "dtypes",
           "empty", "errors", "finalize", "from_dlpack", "from_numpy", "full", "get_num_threads", "hooks", "init",
           "is_initialized", "kernel_selector", "memory", "ones", "ops", "profiler", "tools", "register_kernel", "register_op",
           "set_num_threads", "tensor", "zeros"]
