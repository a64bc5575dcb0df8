"""Runtime event hooks: lower layers emit, upper layers and tools (profiler, memory checker) subscribe.

Emitting costs one truth test when nobody listens, so tools cost nothing when off::

    >>> from opsnn.runtime import hooks
    >>> unsubscribe = hooks.subscribe("kernel", lambda ev: print(ev["op"]))
    >>> unsubscribe()

``host`` events are host-side phases and user regions (a compile, a graph pass, an LLM
decode step): emit them with :func:`host_phase` or ``with hooks.region(name):``.
``finalize`` is emitted after ``opsnn.finalize()`` (the ops layer drops its executor cache
there). Neither turns on :data:`active`, which gates the per-kernel hot paths.

Tools also *provide* observers by name (``provide("profile", factory)``), so a lower layer that
must start one for its user (an ONNX Runtime-style session's ``enable_profiling``) asks
:func:`observer` instead of importing the tool.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

_lock = threading.Lock()
_subscribers: dict[str, tuple[Callable, ...]] = {}
#: True while any per-kernel or memory event has a subscriber: hot paths test this before building events.
active = False

EVENTS = ("kernel", "alloc", "free", "prepare", "fallback", "finalize", "host")
#: rare events, emitted whether or not anyone listens; their subscribers leave ``active`` alone
_QUIET = ("finalize", "host")


def _hot() -> bool:
    return any(e not in _QUIET for e in _subscribers)


def subscribe(event: str, fn: Callable[[dict], None]) -> Callable[[], None]:
    """Call ``fn(payload)`` on every ``event``; returns a function that unsubscribes."""
    global active
    if event not in EVENTS:
        raise ValueError(f"hooks.subscribe: unknown event {event!r}; expected one of {EVENTS}")
    with _lock:
        _subscribers[event] = _subscribers.get(event, ()) + (fn,)
        active = _hot()

    def unsubscribe() -> None:
        global active
        with _lock:
            fns = tuple(f for f in _subscribers.get(event, ()) if f is not fn)
            if fns:
                _subscribers[event] = fns
            else:
                _subscribers.pop(event, None)
            active = _hot()

    return unsubscribe


def emit(event: str, payload: dict) -> None:
    for fn in _subscribers.get(event, ()):
        fn(payload)


def listening(event: str) -> bool:
    return event in _subscribers


def host_phase(name: str, category: str, start: float, end: float, **args) -> None:
    """Emit a ``host`` event: a host-side phase (``category`` "compile", "pass", ...) that ran
    from ``start`` to ``end`` (``time.perf_counter()`` seconds), with ``args`` for the tools."""
    fns = _subscribers.get("host", ())
    if fns:
        ev = {
            "name": name,
            "category": category,
            "start": start,
            "end": end,
            "thread": threading.get_ident(),
            "args": args,
        }
        for fn in fns:
            fn(ev)


class region:
    """``with hooks.region("llm decode"):`` emits one ``host`` event (category "region") for the
    block; free when nobody listens for ``host`` events."""

    __slots__ = ("name", "category", "t0")

    def __init__(self, name: str, category: str = "region"):
        self.name = name
        self.category = category

    def __enter__(self) -> region:
        self.t0 = time.perf_counter() if "host" in _subscribers else None
        return self

    def __exit__(self, *exc) -> None:
        if self.t0 is not None:
            host_phase(self.name, self.category, self.t0, time.perf_counter())


_providers: dict[str, Callable] = {}


def provide(name: str, factory: Callable) -> None:
    """Register the factory of an observer tools offer under ``name`` (e.g. the profiler's ``profile``)."""
    _providers[name] = factory


def observer(name: str, *args, **kwargs):
    """A new observer from the factory a tool provided under ``name``."""
    factory = _providers.get(name)
    if factory is None:
        from ..errors import OpsnnRuntimeError

        raise OpsnnRuntimeError(
            f"hooks.observer: no tool provides {name!r} (import opsnn.tools); provided: {sorted(_providers)}"
        )
    return factory(*args, **kwargs)
