"""Operators: the registry of op records and the functional (eager) API.

>>> import opsnn, numpy as np
>>> y = opsnn.ops.relu(opsnn.tensor(np.array([-1.0, 2.0], np.float32)))
>>> y.numpy()
array([0., 2.], dtype=float32)
"""

from .api import FUNCTIONS, OpFunction, api, run_op
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
from . import defs
from .defs import *  # noqa: F403 - the functional entry points
from . import torch_names
from .torch_names import *  # noqa: F403 - torch's names composed of the functional ops (cat, stack, ...)
from . import gradients, tensor_methods

gradients.attach()  # each record's gradient rule from ops/gradients.py, once every record exists
tensor_methods.install()  # Tensor.sum(), t.softmax(dim), t + u, ... from the functional entry points

__all__ = [
    "FUNCTIONS",
    "OpFunction",
    "api",
    "run_op",
    "Executor",
    "cache_info",
    "clear_cache",
    "prepare",
    "REGISTRY",
    "Attr",
    "InferContext",
    "Input",
    "Kernel",
    "OpRecord",
    "Output",
    "TensorMeta",
    "all_ops",
    "get_op",
    "has_op",
    "kernel_selector",
    "register_kernel",
    "register_op",
    *defs.__all__,
    *torch_names.__all__,
]
