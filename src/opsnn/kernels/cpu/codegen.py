"""Generated numba kernels for fused elementwise chains, one per chain signature.

A chain is a small program (steps over inputs, earlier results and literal constants).
Its constants and attributes (``alpha``) are arguments, not literals: chains that differ only
in them share one kernel (compiled code is never unloaded, so fewer kernels is fewer maps).
Its source is written once to a cache folder as a real module, so numba's ``cache=True``
keeps the machine code across processes; in-process, kernels are memoized by signature.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import string
import sys
import threading

import numpy as np

from ...runtime.memory import check_kernel_maps

#: op -> numba expression over operands a, b and attributes, in the chain's dtype: ``R`` is the output
#: dtype's scalar type, and every step's result is rounded to it (``t_k = R(...)``), so a step after
#: a transcendental one (Floor(Erf(x)), Max(Sigmoid(x), c)) sees what the unfused graph's tensor holds.
#: IEEE semantics as the unfused ops have them (the kernels' error_model="numpy": 1 / 0 is Inf; a NaN
#: operand of Max/Min/Relu stays NaN; np.floor of NaN / Inf stays a float). float32 math calls the
#: float32 libm (expf, erff, ...) as the unfused elementwise kernels do; Sigmoid, Tanh, Softplus,
#: Swish and Gelu use libm where their unfused kernels use vectorized approximations (< 1 ulp apart).
TEMPLATES = {
    "Relu": "R(0.0) if {a} < R(0.0) else {a}",
    "Neg": "-{a}",
    "Abs": "abs({a})",
    "Exp": "math.exp({a})",
    "Log": "math.log({a})",
    "Sqrt": "math.sqrt({a})",
    "Sigmoid": "R(1.0) / (R(1.0) + R(math.exp(-{a})))",
    "Tanh": "math.tanh({a})",
    "Erf": "math.erf({a})",
    "Reciprocal": "R(1.0) / {a}",
    "Floor": "np.floor({a})",
    "Ceil": "np.ceil({a})",
    "Round": "np.rint({a})",
    "Sin": "math.sin({a})",
    "Cos": "math.cos({a})",
    # log(1 + e^a) as max(a, 0) + log1p(e^-|a|): e^a overflows float32 from a = 89 (Softplus(100) is 100)
    "Softplus": "({a} if {a} > R(0.0) else R(0.0)) + R(math.log1p(math.exp(-abs({a}))))",
    "Swish": "{a} / (R(1.0) + R(math.exp(-R({alpha}) * {a})))",
    "LeakyRelu": "{a} * R({alpha}) if {a} < R(0.0) else {a}",
    "Gelu": "{a} * R(0.5 * math.erfc(-{a} * 0.7071067811865476))",
    "Add": "{a} + {b}",
    "Sub": "{a} - {b}",
    "Mul": "{a} * {b}",
    "Div": "{a} / {b}",
    "Pow": "{a} ** {b}",
    "Max": "{a} if ({a} > {b} or {a} != {a}) else {b}",
    "Min": "{a} if ({a} < {b} or {a} != {a}) else {b}",
}
ATTR_DEFAULTS = {"Swish": {"alpha": 1.0}, "LeakyRelu": {"alpha": 0.01}}

_lock = threading.Lock()
_kernels: dict = {}


def _template_params(op: str) -> list[str]:
    """The attribute names ``op``'s template reads (``alpha``), beside its operands a and b."""
    return sorted({f for _, f, _, _ in string.Formatter().parse(TEMPLATES[op]) if f and f not in ("a", "b")})


def canonical(program: list) -> tuple[list, list[float]]:
    """(``program`` with every literal constant and template attribute replaced by a numbered slot, the
    slots' values): chains equal but for their constants have one canonical form, so one kernel."""
    shape, consts = [], []
    for op, args, attrs in program:
        cargs = []
        for kind, val in args:
            if kind == "const":
                cargs.append(["const", len(consts)])
                consts.append(float(val))
            else:
                cargs.append([kind, val])
        params = dict(ATTR_DEFAULTS.get(op, {}), **(attrs or {}))
        slots = {}
        for name in _template_params(op):
            slots[name] = len(consts)
            consts.append(float(params[name]))
        shape.append([op, cargs, slots])
    return shape, consts


def _operand(ref) -> str:
    kind, val = ref
    if kind == "in":
        return f"x{val}[i]"
    if kind == "step":
        return f"t{val}"
    return f"k{val}"  # a constant tensor of the chain's dtype, as the unfused op reads it (rounded once: R(c[j]))


def expression_lines(program: list) -> list[str]:
    """``t0 = R(...)`` lines of the kernel's loop body, one per step of a :func:`canonical` program, each
    rounded to the dtype; constants and attributes are the locals ``k0, k1, ...``."""
    lines = []
    for k, (op, args, slots) in enumerate(program):
        ops = [_operand(a) for a in args]
        params = {name: f"k{j}" for name, j in slots.items()}
        lines.append(f"t{k} = R(" + TEMPLATES[op].format(a=ops[0], b=ops[1] if len(ops) > 1 else "", **params) + ")")
    return lines


def signature(program: list, n_inputs: int) -> str:
    return hashlib.sha256(json.dumps([n_inputs, program], sort_keys=True).encode()).hexdigest()[:24]


def cache_dir() -> str:
    root = (
        os.environ.get("OPSNN_KERNEL_CACHE_DIR")
        or os.environ.get("OPSNN_CACHE_DIR")
        or os.path.join(os.path.expanduser("~"), ".cache", "opsnn")
    )
    path = os.path.join(root, "fused_kernels")
    os.makedirs(path, exist_ok=True)
    return path


def _source(program: list, n_inputs: int, n_consts: int) -> str:
    """The module of a :func:`canonical` program: ``kernel_*(c, out, x0, ...)``, ``c`` its constants (float64)."""
    args = ", ".join(f"x{j}" for j in range(n_inputs))
    body = "\n".join(f"        {line}" for line in expression_lines(program))
    # constants read into locals before the loop: scalars in registers, no load the loop's stores might alias
    consts = "".join(f"    k{j} = R(c[{j}])\n" for j in range(n_consts))
    return f'''"""Generated by opsnn: a fused elementwise chain ({len(program)} ops). Do not edit."""
import math

import numba as nb
import numpy as np


@nb.njit(parallel=True, nogil=True, cache=True, fastmath=False, error_model="numpy")
def kernel_parallel(c, out, {args}):
    R = out.dtype.type
{consts}    for i in nb.prange(out.size):
{body}
        out[i] = t{len(program) - 1}


@nb.njit(nogil=True, cache=True, fastmath=False, error_model="numpy")
def kernel_serial(c, out, {args}):
    R = out.dtype.type
{consts}    for i in range(out.size):
{body}
        out[i] = t{len(program) - 1}
'''


def get_kernel(program: list, n_inputs: int):
    """The (parallel, serial) kernels for ``program``, each called as ``kernel(out, x0, ...)`` (its constants
    bound); the compiled code is shared by every chain of the same :func:`canonical` form."""
    shape, consts = canonical(program)
    c = np.array(consts, np.float64)
    par, ser = _compiled(shape, n_inputs, len(consts))
    return functools.partial(par, c), functools.partial(ser, c)


def _compiled(program: list, n_inputs: int, n_consts: int):
    """The (parallel, serial) numba dispatchers of a canonical program (generated on first use)."""
    sig = signature(program, n_inputs)
    with _lock:
        hit = _kernels.get(sig)
        if hit is not None:
            return hit
        # each chain's machine code stays mapped for the process's life: a typed error, not LLVM's abort
        check_kernel_maps(f"FusedElementwise: a {len(program)}-step chain")
        path = os.path.join(cache_dir(), f"ew_{sig}.py")
        src = _source(program, n_inputs, n_consts)
        if not os.path.exists(path) or open(path).read() != src:
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                f.write(src)
            os.replace(tmp, path)
        spec = importlib.util.spec_from_file_location(f"opsnn_fused_ew_{sig}", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # numba's on-disk cache re-imports the module by name
        spec.loader.exec_module(mod)
        _kernels[sig] = (mod.kernel_parallel, mod.kernel_serial)
        return _kernels[sig]
