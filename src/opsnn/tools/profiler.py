"""The profiler: records kernel launches and host phases through runtime hooks.

Zero cost when off (the runtime tests one flag); exports Chrome trace JSON (Perfetto,
chrome://tracing), a flame graph SVG and a self-contained timeline HTML::

    import opsnn
    with opsnn.profiler.profile() as p:
        with opsnn.profiler.record("step"):
            y = opsnn.ops.relu(x)
    print(p.table())
    p.export_chrome_trace("perf.json"); p.export_timeline("timeline.html")
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

from ..ops import registry
from ..runtime import hooks

TRACE_FORMAT_VERSION = 1
_active: list[Profile] = []
_lock = threading.Lock()


@dataclass
class KernelEvent:
    op: str
    kernel: str
    stream: str
    queued: float
    start: float
    end: float
    flops: int = 0
    bytes: int = 0
    fallback: bool = False
    shapes: list = field(default_factory=list)
    dtypes: list = field(default_factory=list)

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class HostEvent:
    name: str
    category: str  # "region" | "prepare" | phase names such as "compile", "pass"
    start: float
    end: float
    thread: int
    args: dict = field(default_factory=dict)


class Profile:
    """What one ``profile()`` block recorded; see the module docstring."""

    def __init__(self):
        self.kernels: list[KernelEvent] = []
        self.host: list[HostEvent] = []
        self.t0 = time.perf_counter()
        self.t1: float | None = None
        self._unsubs: list = []

    # -- recording ------------------------------------------------------------------------
    def _on_kernel(self, ev: dict) -> None:
        self.kernels.append(
            KernelEvent(
                ev["op"],
                ev.get("kernel", "?"),
                ev["stream"],
                ev["queued"] or ev["start"],
                ev["start"],
                ev["end"],
                ev.get("flops", 0),
                ev.get("bytes", 0),
                ev.get("fallback", False),
                ev.get("shapes", []),
                ev.get("dtypes", []),
            )
        )

    def _on_prepare(self, ev: dict) -> None:
        self.host.append(
            HostEvent(
                f"prepare {ev['op']}",
                "prepare",
                ev["start"],
                ev["end"],
                ev["thread"],
                {"kernel": ev["kernel"], "reason": ev["reason"]},
            )
        )

    def _on_host(self, ev: dict) -> None:
        self.host.append(HostEvent(ev["name"], ev["category"], ev["start"], ev["end"], ev["thread"], ev["args"]))

    def _on_finalize(self, ev: dict) -> None:
        self._stop()

    def _start(self) -> None:
        self._unsubs = [
            hooks.subscribe("kernel", self._on_kernel),
            hooks.subscribe("prepare", self._on_prepare),
            hooks.subscribe("host", self._on_host),
            hooks.subscribe("finalize", self._on_finalize),
        ]
        with _lock:
            _active.append(self)

    def _stop(self) -> None:
        if self.t1 is not None:
            return
        for u in self._unsubs:
            u()
        self._unsubs = []
        with _lock:
            if self in _active:
                _active.remove(self)
        self.t1 = time.perf_counter()

    def __enter__(self) -> Profile:
        self._start()
        return self

    def __exit__(self, *exc) -> None:
        from ..runtime.context import context, is_initialized

        if is_initialized():  # let queued kernels land in this profile
            for s in context().streams():
                try:
                    s._wait_all()
                except Exception:  # noqa: BLE001
                    pass
        self._stop()

    # -- summaries ------------------------------------------------------------------------------
    def op_stats(self) -> list[dict]:
        agg: dict = defaultdict(
            lambda: {"calls": 0, "time": 0.0, "flops": 0, "bytes": 0, "kernels": set(), "fallback": 0}
        )
        for k in self.kernels:
            a = agg[k.op]
            a["calls"] += 1
            a["time"] += k.duration
            a["flops"] += k.flops
            a["bytes"] += k.bytes
            a["kernels"].add(k.kernel)
            a["fallback"] += k.fallback
        total = sum(a["time"] for a in agg.values()) or 1e-12
        rows = []
        for op, a in agg.items():
            t = a["time"] or 1e-12
            rows.append(
                {
                    "op": op,
                    "calls": a["calls"],
                    "time_ms": a["time"] * 1e3,
                    "pct": 100 * a["time"] / total,
                    "gflops": a["flops"] / t / 1e9,
                    "gbps": a["bytes"] / t / 1e9,
                    "kernels": sorted(a["kernels"]),
                    "fallback_calls": a["fallback"],
                }
            )
        return sorted(rows, key=lambda r: -r["time_ms"])

    def table(self, top: int = 20) -> str:
        """Top-N ops: % of kernel time, calls, total ms, GFLOP/s, GB/s, kernels."""
        rows = self.op_stats()[:top]
        lines = [f"{'op':24s} {'%':>6s} {'calls':>6s} {'total ms':>10s} {'GFLOP/s':>9s} {'GB/s':>7s}  kernels"]
        for r in rows:
            flag = " (reference fallback)" if r["fallback_calls"] else ""
            lines.append(
                f"{r['op'][:24]:24s} {r['pct']:6.1f} {r['calls']:6d} {r['time_ms']:10.3f} "
                f"{r['gflops']:9.2f} {r['gbps']:7.2f}  {', '.join(r['kernels'])}{flag}"
            )
        return "\n".join(lines)

    # -- exports ----------------------------------------------------------------------------------
    def chrome_trace(self) -> dict:
        """The Chrome trace-event JSON object (streams as threads of the 'device' process)."""
        base = self.t0
        events: list[dict] = [
            {"ph": "M", "pid": 0, "name": "process_name", "args": {"name": "opsnn device"}},
            {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "host"}},
        ]
        streams = sorted({k.stream for k in self.kernels}, key=lambda s: (s != "default", s))
        tid = {s: i for i, s in enumerate(streams)}
        for s, i in tid.items():
            events.append({"ph": "M", "pid": 0, "tid": i, "name": "thread_name", "args": {"name": f"stream {s}"}})
        for k in self.kernels:
            events.append(
                {
                    "ph": "X",
                    "pid": 0,
                    "tid": tid[k.stream],
                    "name": k.op,
                    "cat": "kernel",
                    "ts": (k.start - base) * 1e6,
                    "dur": max(k.duration, 0) * 1e6,
                    "args": {
                        "kernel": k.kernel,
                        "stream": k.stream,
                        "flops": k.flops,
                        "bytes": k.bytes,
                        "queued_us": (k.queued - base) * 1e6,
                        "shapes": [list(s) if s else s for s in k.shapes],
                        "dtypes": k.dtypes,
                        "fallback": k.fallback,
                        "family": op_family(k.op),
                    },
                }
            )
        threads = sorted({h.thread for h in self.host})
        htid = {t: i for i, t in enumerate(threads)}
        for h in self.host:
            events.append(
                {
                    "ph": "X",
                    "pid": 1,
                    "tid": htid[h.thread],
                    "name": h.name,
                    "cat": h.category,
                    "ts": (h.start - base) * 1e6,
                    "dur": max(h.end - h.start, 0) * 1e6,
                    "args": h.args,
                }
            )
        return {
            "traceEvents": events,
            "displayTimeUnit": "ms",
            "otherData": {"tool": "opsnn", "format_version": TRACE_FORMAT_VERSION},
        }

    def export_chrome_trace(self, path: str) -> str:
        with open(path, "w") as f:
            json.dump(self.chrome_trace(), f)
        return path

    def export_flamegraph(self, path: str) -> str:
        """An SVG flame graph: user regions > ops > kernels, widths by kernel time."""
        from .trace import flamegraph_svg, load_trace_events

        with open(path, "w") as f:
            f.write(flamegraph_svg(load_trace_events(self.chrome_trace())))
        return path

    def export_timeline(self, path: str) -> str:
        """A self-contained HTML timeline (one lane per stream, zoom/pan, hover, top-ops table)."""
        from .trace import load_trace_events, timeline_html

        with open(path, "w") as f:
            f.write(timeline_html(load_trace_events(self.chrome_trace())))
        return path


def op_family(op: str) -> str:
    """The op record's category ("conv", "matmul", ...) for a kernel event's op name; "other" if unknown."""
    domain, _, name = op.rpartition("::")
    if registry.has_op(name, domain):
        return registry.get_op(name, domain).category
    return "other"


def profile() -> Profile:
    """Start recording; use as ``with opsnn.profiler.profile() as p: ...``."""
    return Profile()


hooks.provide("profile", profile)


class record(hooks.region):
    """Mark a user region (``with opsnn.profiler.record("decode step"): ...``); free when no
    profiler is active."""

    __slots__ = ()


def host_phase(name: str, category: str, start: float, end: float, **args) -> None:
    """Record a host phase (compile, a graph pass...) into active profiles."""
    hooks.host_phase(name, category, start, end, **args)
