"""Op records by family. Each module registers its records and kernels and lists its
functional entry points in ``__all__``."""

import importlib

FAMILIES = (
    "elementwise",
    "special",
    "activation",
    "reduction",
    "norm",
    "matmul",
    "conv",
    "pool",
    "quant",
    "shape",
    "sort",
    "resize",
    "rnn",
    "attention",
    "loss",
    "ctc",
    "random",
    "vision",
    "signal",
    "training",
    "text",
    "ml",
    "fused",
    "blocked",
)

__all__: list[str] = []
for _family in FAMILIES:
    _mod = importlib.import_module(f"{__name__}.{_family}")
    for _name in getattr(_mod, "__all__", ()):
        globals()[_name] = getattr(_mod, _name)
        __all__.append(_name)
