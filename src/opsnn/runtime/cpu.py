"""The CPU's instruction sets, detected once, and the cap on them (``OPSNN_CPU_ISA`` /
:func:`set_cpu_isa`) that every kernel choice reads.

Like ONNX Runtime's MLAS platform object, this module reads the CPU's features once (the flags
of ``/proc/cpuinfo``; LLVM's host features where there is no ``/proc``) and names the widest
level of :data:`LEVELS` the CPU has. A cap lowers that level for the whole process, so the AVX2
code paths can be run and tested on an AVX-512 machine:

- opsnn's own selectors ask :func:`at_least` (directly, or through oneDNN's answer, which the
  cap also bounds);
- oneDNN: ``ONEDNN_MAX_CPU_ISA``, MKL: ``MKL_ENABLE_INSTRUCTIONS`` (honoured on Intel CPUs
  only, by MKL's own rule), both set before opsnn loads the library;
- OpenBLAS: ``OPENBLAS_CORETYPE`` for a cap below AVX-512 (its AVX-512 levels differ only in
  kernels opsnn does not call), read when numpy loads it, so only where ``import opsnn`` comes
  before ``import numpy`` (:func:`opsnn.runtime.blas.core_name` says which kernels it runs);
- numba: ``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES`` (the host's features less those above the
  cap), set before numba creates its code generator. numba keys its on-disk cache by these, so a
  capped process compiles (and caches) its own copy of every kernel it runs.

A variable the user set before starting Python wins over the cap's value. The cap takes effect
at ``import opsnn`` (:func:`apply_environment`, called by :mod:`opsnn.runtime` before it imports
numba); :func:`set_cpu_isa` can change it later only while oneDNN and MKL are not loaded yet,
and never for numba, whose code generator is set up when opsnn is imported (see its docstring).
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import NamedTuple

from ..errors import OpsnnRuntimeError, ParamInvalidError

#: the levels, narrowest first; each includes the ones before it
LEVELS = ("sse41", "avx2", "avx512", "avx512_bf16", "amx")

#: /proc/cpuinfo flags each level needs on top of the previous one
_NEEDS = {
    "sse41": ("sse4_1",),
    "avx2": ("avx", "avx2", "fma"),
    "avx512": ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"),
    "avx512_bf16": ("avx512_bf16", "avx512_vnni"),
    "amx": ("amx_tile", "amx_bf16", "amx_int8"),
}
#: level -> oneDNN's ONEDNN_MAX_CPU_ISA value
ONEDNN_ISA = {
    "sse41": "SSE41",
    "avx2": "AVX2",
    "avx512": "AVX512_CORE",
    "avx512_bf16": "AVX512_CORE_BF16",
    "amx": "AVX512_CORE_AMX",
}
#: level -> MKL's MKL_ENABLE_INSTRUCTIONS value
MKL_ISA = {"sse41": "SSE4_2", "avx2": "AVX2", "avx512": "AVX512", "avx512_bf16": "AVX512_E3", "amx": "AVX512_E4"}
#: level -> torch's ATEN_CPU_CAPABILITY, for benchmarks that cap a torch peer alike (ATen splits no
#: AVX-512 levels: a cap at one of them leaves torch as it is)
ATEN_CAPABILITY = {"sse41": "default", "avx2": "avx2"}
#: level -> OpenBLAS' OPENBLAS_CORETYPE value (a cap to these levels only)
OPENBLAS_CORE = {"sse41": "Nehalem", "avx2": "Haswell"}
#: LLVM feature names (numba's target) -> the /proc/cpuinfo flag of the same extension
_LLVM_FLAGS = {
    "sse4.1": "sse4_1",
    "avx512bf16": "avx512_bf16",
    "avx512vnni": "avx512_vnni",
    "amx-tile": "amx_tile",
    "amx-bf16": "amx_bf16",
    "amx-int8": "amx_int8",
}


class IsaState(NamedTuple):
    """The level in force, the CPU's own, and why they differ (``source``: 'detected',
    'OPSNN_CPU_ISA' or 'set_cpu_isa')."""

    level: str | None
    detected: str | None
    source: str
    requested: str | None


_flags: frozenset | None = None
_state: IsaState | None = None
_numba_level: str | None = None  # the level numba's code generator was set up for
_numba_note = ""
_loaded: dict = {}  # library -> the level in force when opsnn loaded it


def flags() -> frozenset:
    """The CPU's feature flags as ``/proc/cpuinfo`` names them (read once)."""
    global _flags
    if _flags is None:
        found: set = set()
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("flags"):
                        found = set(line.split(":", 1)[1].split())
                        break
        except OSError:
            pass
        if not found:
            found = _llvm_flags()
        _flags = frozenset(found)
    return _flags


def _llvm_flags() -> set:
    """The host's features as LLVM reports them, renamed to /proc/cpuinfo's names."""
    try:
        import llvmlite.binding as ll

        feats = ll.get_host_cpu_features()
    except Exception:  # noqa: BLE001 - no LLVM: no feature known
        return set()
    return {_LLVM_FLAGS.get(k, k) for k, on in feats.items() if on}


def detected() -> str | None:
    """The widest level the CPU has (None: not an x86 CPU with SSE4.1)."""
    have = flags()
    level = None
    for name in LEVELS:
        if not all(f in have for f in _NEEDS[name]):
            break
        level = name
    return level


def parse(value: str, where: str = "OPSNN_CPU_ISA") -> str:
    """``value`` as a level name (case and ``-`` / ``_`` forgiven), else a one-line error."""
    name = str(value).strip().lower().replace("-", "")
    name = {
        "avx512_core": "avx512",
        "avx512f": "avx512",
        "avx512bf16": "avx512_bf16",
        "sse4_1": "sse41",
        "sse4.1": "sse41",
    }.get(name, name)
    if name not in LEVELS:
        raise ParamInvalidError(f"{where}: expected one of {', '.join(LEVELS)}, got {value!r}")
    return name


def _capped(level: str | None, cap: str | None) -> str | None:
    if level is None or cap is None:
        return level
    return LEVELS[min(LEVELS.index(level), LEVELS.index(cap))]


def state() -> IsaState:
    """The level in force and why (the environment's cap is read on the first call)."""
    global _state
    if _state is None:
        det = detected()
        want = os.environ.get("OPSNN_CPU_ISA", "").strip()
        if want:
            cap = parse(want)
            _state = IsaState(_capped(det, cap), det, "OPSNN_CPU_ISA", cap)
        else:
            _state = IsaState(det, det, "detected", None)
    return _state


def aten_capability() -> str | None:
    """The ATEN_CPU_CAPABILITY that runs torch's own kernels at the capped level, or None (not capped,
    or capped at an AVX-512 level). opsnn does not set it: the benchmarks do, for their torch peer."""
    st = state()
    return ATEN_CAPABILITY.get(st.level) if st.level != st.detected else None


def isa() -> str | None:
    """The level in force: the CPU's, lowered by the cap."""
    return state().level


def at_least(level: str) -> bool:
    """True when the level in force includes ``level``."""
    cur = isa()
    return cur is not None and LEVELS.index(cur) >= LEVELS.index(parse(level, "at_least"))


def why() -> str:
    """Why :func:`isa` is what it is, one phrase."""
    st = state()
    if st.source == "detected":
        return "detected" if st.level is not None else "no x86 SSE4.1 / AVX feature found"
    how = f"OPSNN_CPU_ISA={st.requested}" if st.source == "OPSNN_CPU_ISA" else f"set_cpu_isa({st.requested!r})"
    if st.level == st.requested:
        return f"capped by {how}; the CPU has {st.detected}"
    return f"{how} asks for more than the CPU has: {st.detected}"


def describe() -> str:
    """One line: the level in force, why, and numba's target when it differs."""
    st = state()
    line = f"{st.level or 'no x86 SIMD level'} ({why()})"
    if _numba_level is not None and _numba_level != st.level:
        line += f"; numba's kernels target {_numba_level} ({_numba_note})"
    return line


def _numba_features(level: str) -> str:
    """The host's LLVM features with every extension above ``level`` turned off."""
    import llvmlite.binding as ll

    feats = ll.get_host_cpu_features()
    rank = LEVELS.index(level)

    def allowed(name: str) -> bool:
        if name.startswith(("amx", "avx10")):
            return rank >= LEVELS.index("amx")
        if name.startswith("avx512") or name == "evex512":
            if name == "avx512fp16":
                return rank >= LEVELS.index("amx")
            if name in ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "evex512"):
                return rank >= LEVELS.index("avx512")
            return rank >= LEVELS.index("avx512_bf16")
        if name.startswith("avxvnni") or name in ("avxifma", "avxneconvert"):
            return rank >= LEVELS.index("avx512_bf16")
        if name in ("avx", "avx2", "fma", "f16c", "fma4", "xop", "vaes", "vpclmulqdq"):
            return rank >= LEVELS.index("avx2")
        return True

    return ",".join(("+" if on and allowed(k) else "-") + k for k, on in sorted(feats.items()))


def _numba_codegen_started() -> bool:
    numba = sys.modules.get("numba")
    if numba is None:
        return False
    try:
        from numba.core.registry import cpu_target
    except ImportError:
        return True
    return "_toplevel_target_context" in vars(cpu_target)


def _numba_target(level: str | None) -> tuple[str | None, str | None]:
    """(NUMBA_CPU_NAME, NUMBA_CPU_FEATURES) for ``level``: (None, None) where numba's host default is it."""
    if level is None or level == detected():
        return None, None
    import llvmlite.binding as ll

    return ll.get_host_cpu_name(), _numba_features(level)


def _set_numba(level: str | None) -> None:
    """Point numba's target at ``level`` when its code generator is not set up yet."""
    global _numba_level, _numba_note
    if "NUMBA_CPU_NAME" in os.environ or "NUMBA_CPU_FEATURES" in os.environ:
        if _numba_level is None:
            # a process started by an opsnn process under the same cap (pytest-xdist's workers, a
            # multiprocessing child) inherits the variables the cap set there: they are the cap's, not the user's
            env = (os.environ.get("NUMBA_CPU_NAME"), os.environ.get("NUMBA_CPU_FEATURES"))
            if level is not None and level != detected() and env == _numba_target(level):
                _numba_level, _numba_note = level, "capped with the rest"
                _numba_owned.update(("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES"))
            else:
                _numba_level, _numba_note = "as NUMBA_CPU_NAME / NUMBA_CPU_FEATURES say", "set by the user"
        return
    if _numba_codegen_started():
        if _numba_level is None:
            _numba_level, _numba_note = detected(), "numba's code generator was set up before opsnn"
        return
    name, feats = _numba_target(level)
    if "numba" in sys.modules:  # imported, code generator not created yet: its config is read then
        from numba.core import config

        config.CPU_NAME, config.CPU_FEATURES = name, feats
    elif name is not None:
        os.environ["NUMBA_CPU_NAME"], os.environ["NUMBA_CPU_FEATURES"] = name, feats
        _numba_owned.update(("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES"))
    _numba_level, _numba_note = level, "capped with the rest"


_numba_owned: set = set()  # environment variables this module set (and may change again)
_env_owned: set = set()


def _set_env(var: str, value: str | None) -> None:
    """Set (None: remove) a library's variable unless the user had set it."""
    if var in os.environ and var not in _env_owned:
        return
    if value is None:
        os.environ.pop(var, None)
        _env_owned.discard(var)
    else:
        os.environ[var] = value
        _env_owned.add(var)


def apply_environment() -> None:
    """Tell oneDNN, MKL and numba the level in force (before they load; idempotent)."""
    st = state()
    capped = st.level if st.level != st.detected else None
    _set_env("ONEDNN_MAX_CPU_ISA", ONEDNN_ISA[capped] if capped else None)
    _set_env("MKL_ENABLE_INSTRUCTIONS", MKL_ISA[capped] if capped else None)
    _set_env("OPENBLAS_CORETYPE", OPENBLAS_CORE.get(capped) if capped else None)
    _set_numba(st.level)


def library_loaded(name: str) -> None:
    """Called by a kernel module right before it loads ``name`` (oneDNN, MKL): from then on the
    level that library runs with is fixed."""
    apply_environment()
    _loaded.setdefault(name, isa())


def loaded_libraries() -> dict:
    """{library: the level in force when opsnn loaded it}."""
    return dict(_loaded)


def set_cpu_isa(level: str | None) -> str | None:
    """Cap the instruction sets every kernel choice may use at ``level`` (one of :data:`LEVELS`;
    None: back to the CPU's own, or ``OPSNN_CPU_ISA``'s); returns the level in force.

    oneDNN and MKL read their caps once, when opsnn loads them (the first kernel that uses them,
    or ``opsnn info``): a call that would change the level after that raises
    :class:`~opsnn.errors.OpsnnRuntimeError`. numba's code generator is set up when opsnn is
    imported, so numba's own kernels keep the instruction sets of the level in force then (a
    ``RuntimeWarning`` says so when the new level is lower); set ``OPSNN_CPU_ISA`` before starting
    Python to cap those too."""
    global _state
    det = detected()
    if level is None:
        _state = None
        new = state()
    else:
        cap = parse(level, "set_cpu_isa")
        new = IsaState(_capped(det, cap), det, "set_cpu_isa", cap)
    fixed = {lib: lv for lib, lv in _loaded.items() if lv != new.level}
    if fixed:
        lib, lv = next(iter(fixed.items()))
        raise OpsnnRuntimeError(
            f"set_cpu_isa: {lib} is already loaded with {lv} and cannot change to {new.level}; set "
            f"OPSNN_CPU_ISA={new.requested or new.level} before starting Python, or call set_cpu_isa before the "
            "first kernel runs"
        )
    _state = new
    apply_environment()
    if (
        _numba_level is not None
        and new.level is not None
        and _numba_level in LEVELS
        and LEVELS.index(new.level) < LEVELS.index(_numba_level)
    ):
        warnings.warn(
            f"set_cpu_isa({level!r}): numba's kernels keep {_numba_level} ({_numba_note}); set "
            f"OPSNN_CPU_ISA={new.level} before starting Python to cap them too",
            RuntimeWarning,
            stacklevel=2,
        )
    return new.level


__all__ = [
    "LEVELS",
    "IsaState",
    "apply_environment",
    "at_least",
    "describe",
    "detected",
    "flags",
    "isa",
    "library_loaded",
    "loaded_libraries",
    "parse",
    "set_cpu_isa",
    "state",
    "why",
]
