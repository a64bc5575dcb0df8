"""Devices: where tensors live and kernels run. Only ``cpu`` ships today.

A backend registers its device type here; op code never names a device, it asks the
registry for kernels of ``device.type``::

    >>> Device("cpu")
    Device('cpu')
"""

from __future__ import annotations

import os
import platform

from ..errors import ParamInvalidError

#: device type -> human description; a CUDA backend adds "cuda" when it is importable.
BACKENDS: dict[str, str] = {"cpu": "host CPU (numpy + numba + BLAS)"}


class Device:
    """A compute device, e.g. ``Device("cpu")`` or (once a backend exists) ``Device("cuda:0")``."""

    __slots__ = ("type", "index")

    def __init__(self, spec: str | Device = "cpu", index: int | None = None):
        if isinstance(spec, Device):
            spec, index = spec.type, spec.index
        if not isinstance(spec, str):
            raise ParamInvalidError(f"Device: expected a string such as 'cpu', got {spec!r}")
        kind, _, idx = spec.partition(":")
        if kind not in BACKENDS:
            raise ParamInvalidError(
                f"Device: unknown or unavailable device type {kind!r}; available: {sorted(BACKENDS)}"
            )
        if idx:
            if not idx.isdigit():
                raise ParamInvalidError(f"Device: bad index in {spec!r}; expected e.g. '{kind}:0'")
            index = int(idx)
        self.type = kind
        self.index = index or 0

    def __eq__(self, other) -> bool:
        return isinstance(other, Device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self) -> int:
        return hash((self.type, self.index))

    def __repr__(self) -> str:
        return f"Device('{self.type}')" if self.index == 0 else f"Device('{self.type}:{self.index}')"

    def describe(self) -> str:
        if self.type == "cpu":
            return f"cpu: {cpu_model()}, {os.cpu_count()} cores"
        return BACKENDS[self.type]


def _cpuinfo(field: str) -> str | None:
    """The first ``field`` line's value in /proc/cpuinfo (None where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    """The CPU's model name (used in descriptions and as part of autotune keys)."""
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def cpu_vendor() -> str:
    """The CPU vendor string ('GenuineIntel', 'AuthenticAMD', ...; '' where unknown)."""
    return _cpuinfo("vendor_id") or ""
