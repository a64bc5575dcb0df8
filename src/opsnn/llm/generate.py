"""One-call generation: ``generate`` (KV cache, streaming) and ``generate_no_cache`` (the
slow oracle that re-runs the whole sequence through the model for every token).

    >>> import opsnn
    >>> lm = opsnn.models.llama(layers=2, hidden=64, heads=4, kv_heads=2, vocab=100)
    >>> out = generate(lm, [1, 2, 3], max_new_tokens=4)
    >>> out.tokens == generate_no_cache(lm, [1, 2, 3], max_new_tokens=4)
    True
"""

from __future__ import annotations

import numpy as np

from .scheduler import Request, Scheduler


def generate(
    model,
    prompt,
    max_new_tokens: int = 16,
    *,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop_tokens=(),
    on_token=None,
    max_seq: int | None = None,
    max_prefill_tokens: int | None = 512,
) -> Request:
    """Generate for one prompt with a cache sized to it (``max_seq`` default: prompt +
    max_new_tokens); tokens stream to ``on_token``. Returns the finished :class:`Request`
    (``.tokens``, ``.finish_reason``, ``.metrics``); raises ``GenerationError`` if it failed."""
    n = len(np.asarray(prompt).reshape(-1)) if not hasattr(prompt, "shape") else int(np.prod(prompt.shape))
    if max_seq is None:
        max_seq = max(1, min(n + max(int(max_new_tokens), 1) - 1, model.config.max_position_embeddings))
    sched = Scheduler(model, max_batch_slots=1, max_seq=max_seq, max_prefill_tokens=max_prefill_tokens)
    try:
        req = sched.submit(
            prompt,
            max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            stop_tokens=stop_tokens,
            on_token=on_token,
        )
        req.result()
        return req
    finally:
        sched.close()


def generate_no_cache(model, prompt, max_new_tokens: int = 16, stop_tokens=()) -> list[int]:
    """Greedy tokens computed without a cache: each step runs the model's own forward over the
    whole sequence so far and takes the argmax of the last position (stop tokens excluded)."""
    seq = [int(t) for t in np.asarray(prompt).reshape(-1)]
    stops = {int(t) for t in stop_tokens}
    out: list[int] = []
    for _ in range(int(max_new_tokens)):
        logits, _ = model(np.asarray([seq], np.int64))
        tok = int(np.argmax(logits.numpy()[0, -1]))
        if tok in stops:
            break
        out.append(tok)
        seq.append(tok)
    return out


__all__ = ["generate", "generate_no_cache"]
