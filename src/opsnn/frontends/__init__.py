"""Frontends for other frameworks' models: :mod:`opsnn.frontends.torch` (``torch.compile(model, backend="opsnn")``).

Nothing here is imported by ``import opsnn``: each frontend imports its framework lazily, when asked.
"""
