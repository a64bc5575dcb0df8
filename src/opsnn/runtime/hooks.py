"""Runtime event hooks: the runtime emits, tools (profiler, memory checker) subscribe.

Emitting costs one truth test when nobody listens, so tools cost nothing when off::

    >>> from opsnn.runtime import hooks
    >>> unsubscribe = hooks.subscribe("kernel", lambda ev: print(ev["op"]))
    >>> unsubscribe()
"""
from __future__ import annotations

import threading
from typing import Callable

_lock = threading.Lock()
_subscribers: dict[str, tuple[Callable, ...]] = {}
#: True while any subscriber exists: hot paths test this before building events.
active = False

EVENTS = ("kernel", "alloc", "free", "prepare", "fallback", "finalize")


def subscribe(event: str, fn: Callable[[dict], None]) -> Callable[[], None]:
    """Call ``fn(payload)`` on every ``event``; returns a function that unsubscribes."""
    global active
    if event not in EVENTS:
        raise ValueError(f"hooks.subscribe: unknown event {event!r}; expected one of {EVENTS}")
    with _lock:
        _subscribers[event] = _subscribers.get(event, ()) + (fn,)
        active = True

    def unsubscribe() -> None:
        global active
        with _lock:
            fns = tuple(f for f in _subscribers.get(event, ()) if f is not fn)
            if fns:
                _subscribers[event] = fns
            else:
                _subscribers.pop(event, None)
            active = bool(_subscribers)

    return unsubscribe


def emit(event: str, payload: dict) -> None:
    for fn in _subscribers.get(event, ()):
        fn(payload)


def listening(event: str) -> bool:
    return event in _subscribers
