"""``opsnn.nn.utils``: gradient clipping (torch's ``clip_grad_norm_`` / ``clip_grad_value_``),
``pad_sequence`` (also as ``nn.utils.rnn.pad_sequence``), ``parameters_to_vector`` /
``vector_to_parameters``."""

from types import SimpleNamespace

from .clip_grad import clip_grad_norm_, clip_grad_value_
from .convert import pad_sequence, parameters_to_vector, vector_to_parameters

#: torch.nn.utils.rnn's spelling of pad_sequence
rnn = SimpleNamespace(pad_sequence=pad_sequence)

__all__ = [
    "clip_grad_norm_",
    "clip_grad_value_",
    "pad_sequence",
    "parameters_to_vector",
    "rnn",
    "vector_to_parameters",
]
