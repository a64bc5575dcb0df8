"""Kernel autotuning: time an op's applicable kernels for one workload, once, keep the winner.

Kernel selection normally takes the highest-priority kernel whose predicate accepts the
shapes; predicates encode measurements made on one machine. With autotuning on, the
first prepare of a workload — (op, input shapes, dtypes, attributes, CPU model) — times
every kernel that can run it (a tqdm bar shows progress when several are timed and
stderr is a terminal), writes the winner to a JSON file, and every later prepare (in any
process) reads the winner from that file instead of timing again::

    >>> import opsnn
    >>> opsnn.ops.autotune.enable("/tmp/opsnn-autotune.json")   # or OPSNN_AUTOTUNE=1
    >>> # ... prepare / compile as usual; Conv, MatMul, ... pick measured winners
    >>> opsnn.ops.autotune.disable()

``OPSNN_AUTOTUNE=1`` turns it on for the process (``=use``: only use winners already in
the file, never time); ``OPSNN_AUTOTUNE_FILE`` names the file (default
``$OPSNN_CACHE_DIR/autotune.json`` or ``~/.cache/opsnn/autotune.json``).

Predicates may answer with :class:`NotPreferred` (a ``str``): the kernel is correct for the
shapes but the default heuristic expects it to be slower. Selection skips it like any
rejection; autotuning still times it.

The hook lives in :func:`opsnn.ops.registry.select_kernel`, before the priority loop, and
applies only when no kernel is forced (``algo=`` or ``opsnn.kernel_selector``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import sys
import threading
import time

import numpy as np

from .. import dtypes as _dt

ENV = "OPSNN_AUTOTUNE"
ENV_FILE = "OPSNN_AUTOTUNE_FILE"
FORMAT = 1

#: timing: candidates run round-robin, at least MIN_REPEATS rounds, more (up to MAX_REPEATS)
#: while the total stays under BUDGET_S per candidate
MIN_REPEATS = 5
MAX_REPEATS = 30
BUDGET_S = 0.25


class NotPreferred(str):
    """A predicate's answer meaning "correct here, but expected to be slower": selection
    skips the kernel (and shows this text as the reason), autotuning still times it."""


class _State:
    def __init__(self):
        self.mode: str | None = None  # None (off), "tune", "use"
        self.path: str | None = None
        self.db: dict | None = None  # key -> entry, loaded lazily
        self.env_read = False
        self.lock = threading.RLock()
        self.local = threading.local()  # keys being tuned on this thread (re-entrancy guard)
        self.progress = None  # None: a bar when stderr is a tty; True/False forces


_S = _State()


def _default_path() -> str:
    root = os.environ.get("OPSNN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "opsnn")
    return os.path.join(root, "autotune.json")


def _read_env() -> None:
    if _S.env_read:
        return
    _S.env_read = True
    v = os.environ.get(ENV, "").strip().lower()
    if v in ("1", "true", "yes", "on", "tune"):
        _S.mode = "tune"
    elif v == "use":
        _S.mode = "use"
    if _S.mode is not None:
        _S.path = os.environ.get(ENV_FILE) or _default_path()


def enable(path: str | None = None, *, tune: bool = True, progress: bool | None = None) -> str:
    """Turn autotuning on; returns the JSON file used. ``tune=False``: only use winners already
    in the file. ``progress``: force the tqdm bar on/off (default: on when stderr is a tty)."""
    from . import executor

    with _S.lock:
        _S.env_read = True
        _S.mode = "tune" if tune else "use"
        _S.path = os.path.abspath(path or os.environ.get(ENV_FILE) or _default_path())
        _S.db = None
        _S.progress = progress
    executor.clear_cache()  # eager executors prepared before keep their kernels otherwise
    return _S.path


def disable() -> None:
    """Turn autotuning off (the file is kept)."""
    from . import executor

    with _S.lock:
        _S.env_read = True
        _S.mode = None
        _S.db = None
    executor.clear_cache()


def active() -> bool:
    """Cheap check for the selection hook (false inside :func:`paused` on this thread)."""
    if not _S.env_read:
        _read_env()
    return _S.mode is not None and not getattr(_S.local, "paused", False)


@contextlib.contextmanager
def paused():
    """Kernel selection on this thread ignores autotuning inside the block (e.g. to plan a
    workload by the heuristic alone before timing it explicitly)."""
    prev = getattr(_S.local, "paused", False)
    _S.local.paused = True
    try:
        yield
    finally:
        _S.local.paused = prev


def settings() -> dict:
    active()
    return {"mode": _S.mode, "path": _S.path}


# -- workload keys ---------------------------------------------------------------------------------------
_cpu_cache: list = []


def cpu_model() -> str:
    """The CPU the timings belong to: model name and logical core count."""
    if not _cpu_cache:
        from ..runtime.device import cpu_model as name

        _cpu_cache.append(f"{name()} x{os.cpu_count() or 1}")
    return _cpu_cache[0]


def _jsonable(v):
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, np.ndarray):
        return v.tolist() if v.size <= 64 else f"array{v.shape}:{_dt.name(v.dtype)}"
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in sorted(v.items())}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)


def workload_key(rec, ctx) -> str:
    """``op|shapes|dtypes|attrs|host values|cpu`` as one JSON string (stable across processes)."""
    op = f"{rec.domain}::{rec.name}" if rec.domain else rec.name
    shapes = [None if m is None else [int(d) for d in m.shape] for m in ctx.inputs]
    dts = [None if m is None else _dt.name(m.dtype) for m in ctx.inputs]
    host = {str(i): _jsonable(ctx.value(i)) for i in rec.host_inputs if ctx.value(i) is not None}
    return json.dumps([op, shapes, dts, _jsonable(dict(ctx.attrs)), host, cpu_model()], separators=(",", ":"))


# -- the database ----------------------------------------------------------------------------------------
def _load() -> dict:
    if _S.db is None:
        _S.db = _read_file(_S.path)
    return _S.db


def _read_file(path: str | None) -> dict:
    if not path or not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return {}
    entries = data.get("entries", {})
    return entries if isinstance(entries, dict) else {}


def _save(key: str, entry: dict) -> None:
    """Merge one entry into the file (re-read first: other processes may have added theirs)."""
    path = _S.path
    if not path:
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    entries = _read_file(path)
    entries[key] = entry
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"format": FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    _S.db = entries


def entries() -> dict:
    """The winners known now (key -> entry with ``winner`` and ``times_ms``)."""
    with _S.lock:
        return dict(_load()) if active() else dict(_read_file(_S.path))


def lookup(rec, ctx) -> dict | None:
    """The stored entry for this workload, if any."""
    if not active():
        return None
    with _S.lock:
        return _load().get(workload_key(rec, ctx))


# -- candidates and timing ---------------------------------------------------------------------------------
def candidates(rec, ctx) -> list:
    """Kernels that can run ``ctx``: accepted by their predicate, or declined only as
    :class:`NotPreferred`. The reference fallback is never a candidate."""
    out = []
    for k in rec.kernels:
        if k.fallback:
            continue
        why = k.check(ctx)
        if why is None or isinstance(why, NotPreferred):
            out.append(k)
    return out


def _sample_inputs(ctx, adapter: bool) -> list:
    rng = np.random.default_rng(0)
    arrays = []
    for i, meta in enumerate(ctx.inputs):
        if meta is None:
            arrays.append(None)
            continue
        v = ctx.value(i)
        if v is not None:
            a = np.ascontiguousarray(v)
        else:
            shape = tuple(int(d) for d in meta.shape)
            dt = np.dtype(meta.dtype)
            if _dt.is_float(dt):
                a = rng.standard_normal(shape, dtype=np.float32).astype(dt)
            else:
                a = np.zeros(shape, dt)  # integer inputs are indices/lengths: 0 is always valid
        if adapter and _dt.is_low_precision(a.dtype):
            a = a.astype(np.float32)
        arrays.append(a)
    return arrays


def _runner(rec, ctx, kernel):
    """A no-argument callable running ``kernel`` once on random inputs of ``ctx``'s shapes
    (plan and workspace made here, outside the timed region)."""
    adapter = kernel.needs_adapter(ctx)
    plan = kernel.plan(ctx) if kernel.plan is not None else None
    ws_bytes = int(kernel.workspace(ctx, plan)) if kernel.workspace is not None else 0
    ws = np.empty(ws_bytes, np.uint8) if ws_bytes else None
    ins = _sample_inputs(ctx, False)
    outs = []
    for m in ctx.outputs or []:
        dt = np.float32 if adapter and _dt.is_low_precision(m.dtype) else m.dtype
        outs.append(np.empty(tuple(int(d) for d in m.shape), dt))
    attrs, fn = ctx.attrs, kernel.fn
    if adapter:  # the executor's adapter converts 16-bit inputs every call: time that too

        def once():
            fn(
                [a.astype(np.float32) if a is not None and _dt.is_low_precision(a.dtype) else a for a in ins],
                outs,
                attrs,
                plan,
                ws,
            )
    else:

        def once():
            fn(ins, outs, attrs, plan, ws)

    return once


def time_kernel(
    rec, ctx, kernel, *, min_repeats: int = MIN_REPEATS, max_repeats: int = MAX_REPEATS, budget_s: float = BUDGET_S
) -> float:
    """Median seconds of ``kernel`` on random inputs of ``ctx``'s shapes (plan time excluded;
    one untimed warm-up run absorbs numba compilation)."""
    return _time_runners({kernel.name: _runner(rec, ctx, kernel)}, min_repeats, max_repeats, budget_s)[kernel.name]


def _time_runners(runners: dict, min_repeats: int, max_repeats: int, budget_s: float) -> dict:
    # round-robin: a burst of load from other processes hits every candidate alike
    times: dict = {n: [] for n in runners}
    for f in runners.values():
        f()
    start = time.perf_counter()
    budget = budget_s * len(runners)
    rounds = 0
    while rounds < max_repeats and (rounds < min_repeats or time.perf_counter() - start < budget):
        for n, f in runners.items():
            t0 = time.perf_counter()
            f()
            times[n].append(time.perf_counter() - t0)
        rounds += 1
    return {n: statistics.median(t) for n, t in times.items()}


def _progress(items, desc: str):
    show = _S.progress if _S.progress is not None else sys.stderr.isatty()
    if not show or len(items) < 2:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, leave=False, file=sys.stderr)


def tune(rec, ctx, kernels) -> dict:
    """Time ``kernels`` for ``ctx`` (round-robin, medians); returns ``{name: ms}`` (inf for a
    kernel that failed, with ``"_errors"`` saying why)."""
    runners: dict = {}
    errors: dict = {}
    desc = f"autotune {rec.name} {[tuple(m.shape) if m is not None else None for m in ctx.inputs]}"
    for k in _progress(list(kernels), desc):  # plan + first run (numba compiles here)
        try:
            f = _runner(rec, ctx, k)
            f()
            runners[k.name] = f
        except Exception as exc:  # noqa: BLE001 - a failing candidate loses, tuning goes on
            errors[k.name] = f"{type(exc).__name__}: {exc}"
    times = (
        {n: t * 1e3 for n, t in _time_runners(runners, MIN_REPEATS, MAX_REPEATS, BUDGET_S).items()} if runners else {}
    )
    for n in errors:
        times[n] = math.inf
    if errors:
        times["_errors"] = errors
    return times


def choose(rec, ctx, candidates_: list | None = None):
    """The autotuned kernel for this workload, or None (autotuning off, fewer than two
    candidates, or ``use`` mode without a stored winner). Times and persists on a miss."""
    if not active() or ctx.outputs is None or rec.dynamic_shape:
        return None
    cands = [k for k in (candidates(rec, ctx) if candidates_ is None else candidates_) if not k.fallback]
    if len(cands) < 2:
        return None
    names = {k.name for k in cands}
    by_name = {k.name: k for k in cands}
    key = workload_key(rec, ctx)
    with _S.lock:
        entry = _load().get(key)
    if entry is not None and entry.get("winner") in by_name and names <= set(entry.get("times_ms", {})):
        return by_name[entry["winner"]]
    if _S.mode != "tune":
        return by_name.get(entry.get("winner")) if entry else None
    busy = getattr(_S.local, "keys", None)
    if busy is None:
        busy = _S.local.keys = set()
    if key in busy:  # a candidate's plan prepared this same workload again
        return None
    busy.add(key)
    try:
        times = tune(rec, ctx, cands)
    finally:
        busy.discard(key)
    finite = {n: t for n, t in times.items() if n != "_errors" and math.isfinite(t)}
    if not finite:
        return None
    winner = min(finite, key=finite.get)
    entry = {
        "op": rec.name,
        "winner": winner,
        "times_ms": {n: (round(t, 4) if math.isfinite(t) else None) for n, t in times.items() if n != "_errors"},
        "cpu": cpu_model(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    if "_errors" in times:
        entry["errors"] = times["_errors"]
    with _S.lock:
        _save(key, entry)
    return by_name[winner]


def describe(rec, ctx, kernel) -> str:
    """The selection reason for an autotuned choice: the timings behind it."""
    entry = lookup(rec, ctx) or {}
    times = entry.get("times_ms", {})
    parts = [
        f"{n} {t:.3g} ms" if t is not None else f"{n} failed"
        for n, t in sorted(times.items(), key=lambda kv: (kv[1] is None, kv[1] or 0))
    ]
    return f"autotuned ({_S.path}): " + (", ".join(parts) if parts else f"{kernel.name} stored as winner")


def select(rec, ctx):
    """For :func:`opsnn.ops.registry.select_kernel`: a ``Selection`` for the autotuned kernel,
    or None to fall through to priority order."""
    from .registry import Selection

    k = choose(rec, ctx)
    if k is None:
        return None
    rejected = [(c.name, "slower in autotuning") for c in candidates(rec, ctx) if c.name != k.name]
    return Selection(k, describe(rec, ctx, k), rejected, k.needs_adapter(ctx))
