"""Typed errors of the autograd engine (each names the op, tensor or argument at fault)."""

from __future__ import annotations

from ..errors import KernelNotFoundError, OpsnnRuntimeError, ParamInvalidError


class NoGradientError(KernelNotFoundError):
    """A gradient was asked for through an op whose record has no gradient rule (or whose rule
    gives none for that input)."""


class GradientShapeError(ParamInvalidError):
    """A gradient handed to ``backward``/``grad`` (or made by a rule) has the wrong shape or dtype."""


class NonScalarBackwardError(ParamInvalidError):
    """``backward()`` of a tensor with more than one element, without ``gradient=``."""


class GraphFreedError(OpsnnRuntimeError):
    """A second backward through part of a graph whose saved tensors the first one freed."""


class NoGradFnError(ParamInvalidError):
    """``backward``/``grad`` of a tensor that does not require grad (or an input it does not depend on)."""


class InplaceModifiedError(OpsnnRuntimeError):
    """A tensor a gradient rule reads was written in place (copy_, fill_, ``t[...] = ``, add_ ...)
    after the op that saved it ran."""


__all__ = [
    "GradientShapeError",
    "GraphFreedError",
    "InplaceModifiedError",
    "NoGradFnError",
    "NoGradientError",
    "NonScalarBackwardError",
]
