"""Model builders with deterministic random init and real-weight loading from local files.

>>> import opsnn
>>> net = opsnn.models.resnet50()            # doctest: +SKIP
>>> proto = opsnn.models.to_onnx(net, ...)    # doctest: +SKIP
"""

from . import export, weights
from .bert import BERT_CONFIGS, BertConfig, BertModel, bert, bert_config
from .export import to_onnx
from .llama import LlamaConfig, LlamaForCausalLM, llama
from .resnet import ResNet, resnet18, resnet50
from .smallnet import SmallConvNet
from .superres import SuperResNet, superres
from .unet import UNetBlock, unet_block
from .weights import load_weights, save_weights

__all__ = [
    "BERT_CONFIGS",
    "BertConfig",
    "BertModel",
    "LlamaConfig",
    "LlamaForCausalLM",
    "ResNet",
    "SmallConvNet",
    "SuperResNet",
    "UNetBlock",
    "bert",
    "bert_config",
    "export",
    "llama",
    "load_weights",
    "resnet18",
    "resnet50",
    "save_weights",
    "superres",
    "to_onnx",
    "unet_block",
    "weights",
]
