"""``opsnn.llm``: LLM generation with a preallocated KV cache and dynamic batching.

>>> import opsnn.llm
>>> lm = opsnn.models.llama(layers=2, hidden=64, heads=4, kv_heads=2, vocab=100)
>>> streamed = []
>>> r = opsnn.llm.generate(lm, [1, 2, 3], max_new_tokens=4, on_token=streamed.append)
>>> r.tokens == streamed, len(streamed), r.finish_reason
(True, 4, 'length')
>>> with opsnn.llm.Scheduler(lm, max_batch_slots=8, max_seq=256) as s:
...     reqs = [s.submit(p, max_new_tokens=8) for p in ([1, 2], [3, 4, 5, 6], [7])]
...     s.run()
>>> [len(r.tokens) for r in reqs], s.cache.free_slots
([8, 8, 8], 8)

Modules: ``cache`` (KVCache), ``decoder`` (CachedDecoder), ``sampling``, ``scheduler``,
``generate``, ``workload`` (mixed workloads and replay), ``cli``.
"""

from .cache import KVCache
from .cli import cli_generate, cli_serve_bench
from .decoder import CachedDecoder
from .errors import CacheFullError, GenerationError, OutOfVocabularyError, PromptTooLongError, SchedulerClosedError
from .generate import generate, generate_no_cache
from .sampling import Sampler, SamplingParams
from .scheduler import Request, RequestMetrics, Scheduler
from .workload import ReplayReport, WorkItem, mixed_workload, replay

__all__ = [
    "CacheFullError",
    "CachedDecoder",
    "GenerationError",
    "KVCache",
    "OutOfVocabularyError",
    "PromptTooLongError",
    "ReplayReport",
    "Request",
    "RequestMetrics",
    "Sampler",
    "SamplingParams",
    "Scheduler",
    "SchedulerClosedError",
    "WorkItem",
    "cli_generate",
    "cli_serve_bench",
    "generate",
    "generate_no_cache",
    "mixed_workload",
    "replay",
]
