"""``OPSNN_DEBUG`` logging (tinygrad style): 1 prints each kernel choice at prepare time,
2 also prints one line per kernel run with its time, GFLOP/s and GB/s (to stderr)."""

from __future__ import annotations

import os
import sys

from ..runtime import hooks

_unsubs: list = []


def _on_prepare(ev: dict) -> None:
    print(f"[opsnn] prepare {ev['op']}: {ev['kernel']} ({ev['reason']})", file=sys.stderr)


def _on_kernel(ev: dict) -> None:
    dt = max(ev["end"] - ev["start"], 1e-9)
    gflops = ev.get("flops", 0) / dt / 1e9
    gbps = ev.get("bytes", 0) / dt / 1e9
    node = f" node {ev['node']}" if "node" in ev else ""
    print(
        f"[opsnn] {ev['op']:<18s} {ev.get('kernel', '?'):<24s} {dt * 1e3:9.3f} ms {gflops:8.2f} GFLOP/s "
        f"{gbps:7.2f} GB/s  stream {ev['stream']}{node}",
        file=sys.stderr,
    )


def set_level(level: int) -> None:
    """0 off, 1 kernel choices, 2 choices + per-kernel timings."""
    for u in _unsubs:
        u()
    _unsubs.clear()
    if level >= 1:
        _unsubs.append(hooks.subscribe("prepare", _on_prepare))
    if level >= 2:
        _unsubs.append(hooks.subscribe("kernel", _on_kernel))


def configure_from_env() -> None:
    try:
        level = int(os.environ.get("OPSNN_DEBUG", "0") or 0)
    except ValueError:
        print(f"[opsnn] ignoring OPSNN_DEBUG={os.environ['OPSNN_DEBUG']!r}: expected 0, 1 or 2", file=sys.stderr)
        return
    if level:
        set_level(level)
