"""quant ops (records, kernels registration, functional entry points)."""
__all__: list[str] = []
