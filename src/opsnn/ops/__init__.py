"""Operators: the registry of op records and the functional (eager) API.

>>> import opsnn, numpy as np
>>> y = opsnn.ops.relu(opsnn.tensor(np.array([-1.0, 2.0], np.float32)))
>>> y.numpy()
array([0., 2.], dtype=float32)
"""
from . import defs, tensor_methods
from .api import FUNCTIONS, OpFunction, api, run_op
from .defs import *  # noqa: F401,F403 - the functional entry points
from .executor import Executor, cache_info, clear_cache, prepare
from .registry import (
                       REGISTRY,
                       Attr,
                       InferContext,
                       Input,
                       Kernel,
                       OpRecord,
                       Output,
                       TensorMeta,
                       all_ops,
                       get_op,
                       has_op,
                       kernel_selector,
                       register_kernel,
                       register_op,
)

tensor_methods.install()  # Tensor.sum(), t.softmax(dim), t + u, ... from the functional entry points

__all__ = ["FUNCTIONS",  # noqa: PLE0604 - ruff cannot see that defs.__all__ holds strings "OpFunction", "api", "run_op", "Executor", "cache_info", "clear_cache", "prepare",
           "REGISTRY", "Attr", "InferContext", "Input", "Kernel", "OpRecord", "Output", "TensorMeta", "all_ops",
           "get_op", "has_op", "kernel_selector", "register_kernel", "register_op", *defs.__all__]
