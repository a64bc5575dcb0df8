"""Typed exceptions carrying ops-nn status codes.

Every error names the op, the argument, what was expected and what was given, so a
user reads one line and knows the fix::

    >>> raise ParamInvalidError("Conv: attribute 'strides' must be positive, got (0, 1)")
"""

from __future__ import annotations

# ops-nn status codes (aclnnStatus values).
PARAM_NULLPTR = 161001
PARAM_INVALID = 161002
RUNTIME_ERROR = 361001
INNER = 561000
INFERSHAPE = 561001
TILING = 561002
KERNEL_NOT_FOUND = 561003


class OpsnnError(Exception):
    """Base class of every opsnn error; ``code`` is the ops-nn status code."""

    code = INNER

    def __init__(self, message: str, *, op: str | None = None):
        self.op = op
        super().__init__(f"{op}: {message}" if op and not message.startswith(op + ":") else message)

    def __str__(self) -> str:
        return f"[{self.code}] {super().__str__()}"


class ParamNullptrError(OpsnnError, ValueError):
    """A required input was None/missing."""

    code = PARAM_NULLPTR


class ParamInvalidError(OpsnnError, ValueError):
    """An argument has the wrong dtype, rank, shape or value."""

    code = PARAM_INVALID


class TensorIndexError(ParamInvalidError, IndexError):
    """An index outside a tensor's shape (also an IndexError, as Python's sequences raise)."""


class UnknownOptionError(ParamInvalidError, AttributeError):
    """An options object (SessionOptions, RunOptions) has no option of that name."""


class DTypeError(ParamInvalidError, TypeError):
    """An input's dtype is not one the op supports."""


class OpsnnRuntimeError(OpsnnError, RuntimeError):
    """The runtime is in the wrong state (e.g. used after ``finalize()``)."""

    code = RUNTIME_ERROR


class NotInitializedError(OpsnnRuntimeError):
    """An op ran while the runtime context was finalized."""


class KernelError(OpsnnRuntimeError):
    """A kernel raised while running on a stream; surfaces at the next synchronize."""


class OutOfMemoryError(OpsnnRuntimeError, MemoryError):
    """The memory pool's cap would be exceeded."""


class MemoryCorruptionError(OpsnnRuntimeError):
    """A kernel wrote outside its buffers (found by the pool's debug guard bytes)."""


class DistributedError(OpsnnRuntimeError):
    """A collective or the process group failed (another rank raised or died, MPI reported an error)."""


class CollectiveTimeoutError(DistributedError, TimeoutError):
    """A collective did not finish within the process group's timeout; names the op and the ranks."""


class InnerError(OpsnnError):
    """An internal invariant failed (a bug in opsnn)."""

    code = INNER


class InferShapeError(OpsnnError, ValueError):
    """Shape or dtype inference failed: the inputs' shapes are inconsistent."""

    code = INFERSHAPE


class TilingError(OpsnnError):
    """A kernel could not compute a plan/tiling for the given shapes."""

    code = TILING


class KernelNotFoundError(OpsnnError, LookupError):
    """No registered kernel (or op) applies to the request."""

    code = KERNEL_NOT_FOUND


#: what a function's argument parsing raises when handed a value of the wrong kind
ARGUMENT_ERRORS = (TypeError, ValueError, AttributeError, LookupError, ZeroDivisionError, OverflowError)


def _expected(default) -> str:
    """What an argument whose default is ``default`` takes, in words."""
    if isinstance(default, bool):
        return "a bool"
    if isinstance(default, int):
        return "an int"
    if isinstance(default, float):
        return "a number"
    if isinstance(default, str):
        return "a string"
    if isinstance(default, (tuple, list)):
        import reprlib

        return "a sequence like " + reprlib.repr(default)
    return "a valid value" if default is not None else "a valid value or None"


def real_number(where: str, name: str, value) -> float:
    """``value`` as a float, or a ParamInvalidError naming ``where`` and the argument ``name``: numbers
    (Python, numpy, one-element tensors) pass; strings, bools and None do not."""
    if value is None or isinstance(value, (str, bytes, bool)):
        raise ParamInvalidError(f"{where}: {name} must be a number, got {value!r}")
    try:
        return float(value)
    except ARGUMENT_ERRORS:
        raise ParamInvalidError(f"{where}: {name} must be a number, got {type(value).__name__}") from None


def bad_arguments_message(name: str, fn, args: tuple, kwargs: dict, exc: BaseException) -> str:
    """One line naming the argument ``fn(*args, **kwargs)`` could not read (``int('abc')``, an
    array where a flag goes, ``None`` for a tensor) after it raised ``exc``. The culprit is the
    argument whose default value, put in its place, lets ``fn`` through, so ``fn`` must be safe
    to call again (parse its arguments, build its result, nothing else)."""
    import inspect
    import reprlib

    sig = inspect.signature(fn)
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as e:  # a missing, extra or misspelled argument
        return f"{name}: {e}"
    given = dict(bound.arguments)
    for pname, value in given.items():
        p = sig.parameters[pname]
        if value is None and p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            return f"{name}: {pname} is required, got None"
    for pname, value in given.items():
        p = sig.parameters[pname]
        if p.default is p.empty or value is p.default:
            continue
        bound.arguments[pname] = p.default
        try:
            fn(*bound.args, **bound.kwargs)
        except Exception:  # noqa: BLE001 - not this argument (or not it alone)
            continue
        finally:
            bound.arguments[pname] = value
        want = _expected(p.default)
        if want in ("an int", "a number", "a bool") and _is_kind(value, want):  # the right kind, a bad value
            return f"{name}: {pname}={reprlib.repr(value)} is not valid ({exc})"
        return f"{name}: {pname} must be {want}, got {reprlib.repr(value)} ({exc})"
    for pname, value in given.items():  # a required one of the wrong kind for its annotation
        want = _annotated_kind(sig.parameters[pname].annotation)
        if want is not None and not _is_kind(value, want):
            return f"{name}: {pname} must be {want}, got {reprlib.repr(value)} ({exc})"
    for pname, value in given.items():  # ... or one the message quotes
        if isinstance(value, str) and repr(value) in str(exc):
            return f"{name}: {pname}={value!r} is not valid ({exc})"
    call = ", ".join(f"{k}={reprlib.repr(v)}" for k, v in given.items() if k != "self")
    return f"{name}({call}): {type(exc).__name__}: {exc}"


def _annotated_kind(annotation) -> str | None:
    """ "an int" / "a number" / "a bool" for a parameter annotated ``int`` / ``float`` / ``bool``."""
    ann = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return {"int": "an int", "float": "a number", "bool": "a bool"}.get(ann)


def _is_kind(value, kind: str) -> bool:
    import numbers

    if kind == "a bool":
        return isinstance(value, (bool, numbers.Integral))
    if isinstance(value, bool):
        return False
    return isinstance(value, numbers.Integral if kind == "an int" else numbers.Real)


__all__ = [n for n in list(globals()) if n.endswith("Error") or n.isupper()] + ["bad_arguments_message", "real_number"]
