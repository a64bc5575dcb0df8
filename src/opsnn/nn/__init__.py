"""``opsnn.nn``: torch-style modules over opsnn ops (inference and training: losses, train/eval,
zero_grad, gradient clipping in ``nn.utils``), deterministic seeded init,
weight files (safetensors / npz / ONNX initializers) and tracing to graphs.

>>> import opsnn, numpy as np
>>> with opsnn.nn.init.seeded(0):
...     net = opsnn.nn.Sequential(opsnn.nn.Linear(4, 8), opsnn.nn.GELU(), opsnn.nn.Linear(8, 2))
>>> net(opsnn.tensor(np.ones((3, 4), np.float32))).shape
(3, 2)
>>> g = net.to_graph([np.ones((3, 4), np.float32)])
>>> [n.op_type for n in g.nodes]
['Linear', 'Gelu', 'Linear']
"""

from . import functional, init, parallel, utils
from .attention import MultiheadAttention
from .layers import (
    GELU,
    AdaptiveAvgPool2d,
    BatchNorm1d,
    BatchNorm2d,
    BatchNorm3d,
    Conv2d,
    Dropout,
    Embedding,
    Flatten,
    GroupNorm,
    Identity,
    LayerNorm,
    Linear,
    MaxPool2d,
    OutOfVocabularyError,
    ReLU,
    RMSNorm,
    Sigmoid,
    SiLU,
    Softmax,
    Tanh,
    conv_kernels,
)
from .loss import BCEWithLogitsLoss, CrossEntropyLoss, MSELoss, NLLLoss
from .module import (
    IncompatibleKeys,
    Module,
    ModuleDict,
    ModuleList,
    Parameter,
    Sequential,
    StateDictError,
    new_parameter,
)
from .rnn import GRU, LSTM
from .weights import WeightFileError, onnx_initializers, read_weights, write_weights

__all__ = [
    "AdaptiveAvgPool2d",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "Conv2d",
    "BCEWithLogitsLoss",
    "CrossEntropyLoss",
    "MSELoss",
    "NLLLoss",
    "utils",
    "Dropout",
    "Embedding",
    "Flatten",
    "GELU",
    "GRU",
    "GroupNorm",
    "Identity",
    "IncompatibleKeys",
    "LSTM",
    "LayerNorm",
    "Linear",
    "MaxPool2d",
    "Module",
    "ModuleDict",
    "ModuleList",
    "MultiheadAttention",
    "OutOfVocabularyError",
    "Parameter",
    "RMSNorm",
    "ReLU",
    "SiLU",
    "Sequential",
    "Sigmoid",
    "Softmax",
    "StateDictError",
    "Tanh",
    "WeightFileError",
    "conv_kernels",
    "functional",
    "init",
    "new_parameter",
    "onnx_initializers",
    "parallel",
    "read_weights",
    "write_weights",
]
