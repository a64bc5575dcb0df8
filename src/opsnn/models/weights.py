"""Real weights for the model builders: read a local ``.safetensors`` / ``.npz`` / ``.onnx``
file (or take a mapping), adapt the checkpoint's names to the model's, and load strictly.

Adaptations, all by name: a ``module.`` prefix (DataParallel) and a model prefix
(``bert.`` of ``BertFor*`` checkpoints) are stripped when the model's own names lack them;
legacy ``LayerNorm.gamma``/``beta`` become ``weight``/``bias``; entries that are not weights
of the bare model are dropped (``embeddings.position_ids``, BERT's ``cls.*`` pre-training
heads, LLaMA's ``rotary_emb.inv_freq`` and a tied ``lm_head.weight``). Everything else
must match: :class:`opsnn.nn.StateDictError` lists missing, unexpected and mis-shaped
tensors by name.

>>> import opsnn, tempfile, os
>>> m = opsnn.models.bert("tiny", seed=1)
>>> path = save_weights(m, os.path.join(tempfile.mkdtemp(), "bert.safetensors"))
>>> m2 = opsnn.models.bert("tiny", seed=2, weights=path)     # same weights as m
"""

from __future__ import annotations

import re

from ..nn import Module, read_weights, write_weights
from ..nn.module import IncompatibleKeys

#: model class name -> (prefixes a checkpoint may carry, patterns of entries to drop)
_RULES = {
    "BertModel": (("bert.",), (r"^embeddings\.position_ids$", r"^cls\.")),
    "LlamaForCausalLM": ((), (r"\.rotary_emb\.inv_freq$",)),
    "ResNet": ((), ()),
    "UNetBlock": ((), ()),
}


def adapt_names(model: Module, state: dict) -> dict:
    """Rename and filter a checkpoint's entries for ``model`` (see the module doc)."""
    own = model.state_dict()
    prefixes, drops = _RULES.get(type(model).__name__, ((), ()))
    out = {}
    for k, v in state.items():
        if k.startswith("module.") and k not in own:
            k = k[len("module.") :]
        for p in prefixes:
            if k.startswith(p) and k not in own:
                k = k[len(p) :]
        if k not in own and k.endswith((".gamma", ".beta")):
            alt = k.rsplit(".", 1)[0] + (".weight" if k.endswith(".gamma") else ".bias")
            if alt in own:
                k = alt
        if any(re.search(d, k) for d in drops):
            continue
        out[k] = v
    if type(model).__name__ == "LlamaForCausalLM" and model.lm_head is None:
        out.pop("lm_head.weight", None)  # tied: the output projection is the embedding
    return out


def load_weights(model: Module, source, strict: bool = True) -> IncompatibleKeys:
    """Load ``source`` (a local weights file path or a name -> array mapping) into ``model``."""
    state = source if hasattr(source, "items") else read_weights(source, names=_names_with_prefixes(model))
    return model.load_state_dict(adapt_names(model, state), strict=strict)


def _names_with_prefixes(model: Module) -> set:
    """The names an ONNX file may use for ``model``'s weights (for filtering initializers)."""
    names = set(model.state_dict())
    prefixes, _ = _RULES.get(type(model).__name__, ((), ()))
    return names | {p + n for p in prefixes for n in names}


def save_weights(model: Module, path) -> str:
    """Write ``model.state_dict()`` to a ``.safetensors`` or ``.npz`` file."""
    return write_weights(model.state_dict(), path)


__all__ = ["adapt_names", "load_weights", "save_weights"]
