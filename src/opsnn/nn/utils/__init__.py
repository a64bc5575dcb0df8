"""``opsnn.nn.utils``: gradient clipping (torch's ``clip_grad_norm_``, ``get_total_norm``,
``clip_grads_with_norm_``, ``clip_grad_value_``), BatchNorm folding (``fuse_conv_bn_eval``,
``fuse_linear_bn_eval``), weight reparametrizations (``weight_norm``, ``spectral_norm``), ``skip_init``,
``pad_sequence`` (also as ``nn.utils.rnn.pad_sequence``), ``parameters_to_vector`` /
``vector_to_parameters``."""

from types import SimpleNamespace

from .clip_grad import clip_grad_norm, clip_grad_norm_, clip_grad_value_, clip_grads_with_norm_, get_total_norm
from .convert import pad_sequence, parameters_to_vector, vector_to_parameters
from .fusion import fuse_conv_bn_eval, fuse_conv_bn_weights, fuse_linear_bn_eval, fuse_linear_bn_weights
from .skip_init import skip_init
from .spectral_norm import remove_spectral_norm, spectral_norm
from .weight_norm import remove_weight_norm, weight_norm

#: torch.nn.utils.rnn's spelling of pad_sequence
rnn = SimpleNamespace(pad_sequence=pad_sequence)

__all__ = [
    "clip_grad_norm",
    "clip_grad_norm_",
    "clip_grad_value_",
    "clip_grads_with_norm_",
    "fuse_conv_bn_eval",
    "fuse_conv_bn_weights",
    "fuse_linear_bn_eval",
    "fuse_linear_bn_weights",
    "get_total_norm",
    "pad_sequence",
    "parameters_to_vector",
    "remove_spectral_norm",
    "remove_weight_norm",
    "rnn",
    "skip_init",
    "spectral_norm",
    "vector_to_parameters",
    "weight_norm",
]
