"""Typed errors of LLM serving (``opsnn.llm``): all carry ops-nn status codes.

>>> from opsnn.llm.errors import PromptTooLongError
>>> issubclass(PromptTooLongError, ValueError)
True
"""

from __future__ import annotations

from ..errors import OpsnnRuntimeError, ParamInvalidError
from ..nn.layers import OutOfVocabularyError


class PromptTooLongError(ParamInvalidError):
    """A prompt (plus the tokens it asks for) does not fit in the KV cache."""


class CacheFullError(OpsnnRuntimeError):
    """Every cache slot is taken (the scheduler never raises it: it queues instead)."""


class SchedulerClosedError(OpsnnRuntimeError):
    """A request was submitted to, or waited on, a scheduler that was closed."""


class GenerationError(OpsnnRuntimeError):
    """A request failed inside the scheduler; ``__cause__`` is the original exception."""


__all__ = ["CacheFullError", "GenerationError", "OutOfVocabularyError", "PromptTooLongError", "SchedulerClosedError"]
