"""torch.nn.utils.skip_init: build a module whose parameters and buffers are left uninitialised.

>>> import opsnn
>>> lin = opsnn.nn.utils.skip_init(opsnn.nn.Linear, 4, 2)
>>> lin.weight.shape
(2, 4)
"""

from __future__ import annotations

import numpy as np

from ...errors import ParamInvalidError
from .. import init
from ..module import Module


def skip_init(module_cls, *args, **kwargs) -> Module:
    """``module_cls(*args, **kwargs)`` with uninitialised parameters and buffers (fill them yourself).
    opsnn has no meta device: the constructor runs on a throwaway generator, so opsnn's seeded generator
    is not advanced (as torch's is not), and ``to_empty`` then drops the values it drew. ``device`` may
    only be the CPU."""
    if not (isinstance(module_cls, type) and issubclass(module_cls, Module)):
        raise ParamInvalidError(f"skip_init: expected an opsnn.nn.Module class, got {module_cls!r}")
    device = kwargs.pop("device", None) or "cpu"
    with init.seeded(int(np.random.SeedSequence().generate_state(1)[0])):
        module = module_cls(*args, **kwargs)
    return module.to_empty(device=device)


__all__ = ["skip_init"]
