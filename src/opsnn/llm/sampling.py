"""Next-token sampling: greedy, temperature, top-k and top-p (nucleus), reproducible per seed.

Each request owns a :class:`Sampler` with its own ``numpy.random.Generator`` and draws one
uniform number per sampled token, so its tokens depend on its seed and its logits only —
not on which other requests share its batch::

    >>> import numpy as np
    >>> logits = np.array([0.0, 2.0, 1.0, -1.0], np.float32)
    >>> Sampler(SamplingParams()).sample(logits)                      # greedy
    1
    >>> a = Sampler(SamplingParams(temperature=0.8, top_k=3, seed=7))
    >>> b = Sampler(SamplingParams(temperature=0.8, top_k=3, seed=7))
    >>> [a.sample(logits) for _ in range(5)] == [b.sample(logits) for _ in range(5)]
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ParamInvalidError
from .errors import GenerationError


@dataclass(frozen=True)
class SamplingParams:
    """``temperature`` 0 means greedy (argmax); ``top_k`` 0 keeps every token; ``top_p`` 1.0
    keeps every token; ``seed`` seeds the request's generator (None: fresh entropy)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        t, k, p = self.temperature, self.top_k, self.top_p
        if not isinstance(t, (int, float, np.number)) or not math.isfinite(t) or t < 0:
            raise ParamInvalidError(f"SamplingParams: temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 0:
            raise ParamInvalidError(f"SamplingParams: top_k must be an int >= 0 (0 = off), got {k!r}")
        if not isinstance(p, (int, float, np.number)) or not 0 < p <= 1:
            raise ParamInvalidError(f"SamplingParams: top_p must be in (0, 1] (1 = off), got {p!r}")
        if self.seed is not None and (not isinstance(self.seed, (int, np.integer)) or self.seed < 0):
            raise ParamInvalidError(f"SamplingParams: seed must be a non-negative int or None, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


class Sampler:
    """Picks token ids from logit rows under one request's :class:`SamplingParams`."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def sample(self, logits: np.ndarray) -> int:
        row = np.asarray(logits).reshape(-1)
        p = self.params
        if p.greedy:
            tok = int(np.argmax(row))
            if np.isnan(row[tok]):  # argmax stops at the first NaN, so one check covers the row
                raise GenerationError("sampling: logits contain NaN")
            return tok
        x = row.astype(np.float64)
        if np.isnan(x).any():
            raise GenerationError("sampling: logits contain NaN")
        x = x / p.temperature
        V = x.shape[0]
        idx = None
        if 0 < p.top_k < V:
            idx = np.argpartition(-x, p.top_k - 1)[: p.top_k]
            idx.sort()  # candidates in id order: the draw below does not depend on argpartition's order
            x = x[idx]
        if p.top_p < 1.0:
            order = np.argsort(-x, kind="stable")
            x = x[order]
            idx = order if idx is None else idx[order]
        m = x.max()
        if m == -np.inf:
            raise GenerationError("sampling: every candidate logit is -inf")
        w = (x == m).astype(np.float64) if m == np.inf else np.exp(x - m)
        if p.top_p < 1.0:
            c = np.cumsum(w)
            keep = int(np.searchsorted(c, p.top_p * c[-1])) + 1  # smallest prefix holding top_p of the mass
            w = w[:keep]
        c = np.cumsum(w)
        j = min(int(np.searchsorted(c, self.rng.random() * c[-1], side="right")), len(w) - 1)
        return int(j if idx is None else idx[j])


__all__ = ["Sampler", "SamplingParams"]
