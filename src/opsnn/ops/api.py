"""Functional entry points: ``opsnn.ops.conv2d(...)`` (eager) and
``opsnn.aclnn.conv2d.prepare(...)`` (two-phase) from one definition.

An entry point translates user-friendly (torch-style) arguments into the record's
ONNX-style inputs and attributes; both modes then go through the same record::

    @api("leaky_relu", "LeakyRelu")
    def leaky_relu(x, negative_slope=0.01):
        return [x], {"alpha": float(negative_slope)}
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable

from ..errors import ARGUMENT_ERRORS, OpsnnError, ParamInvalidError, bad_arguments_message
from . import executor
from .registry import OpRecord, get_op

#: snake_case name -> OpFunction (``opsnn.aclnn`` reads this table)
FUNCTIONS: dict[str, OpFunction] = {}


class OpFunction:
    """Call for eager mode; ``.prepare(...)`` for an :class:`~opsnn.ops.executor.Executor`."""

    def __init__(self, name: str, op: str, translate: Callable, domain: str = "", sequence: bool = False):
        self.name = name
        self.op_name = op
        self.domain = domain
        self.translate = translate
        self.sequence = sequence  # results are always a tuple, even of one (torch.split's pieces)
        self._rec: OpRecord | None = None
        functools.update_wrapper(self, translate)

    @property
    def record(self) -> OpRecord:
        if self._rec is None:
            self._rec = get_op(self.op_name, self.domain)
        return self._rec

    @functools.cached_property
    def _keywords(self) -> frozenset | None:
        """The names ``translate`` takes by keyword (None when it takes any, ``**kw``)."""
        params = inspect.signature(self.translate).parameters.values()
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return None
        return frozenset(p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.POSITIONAL_ONLY))

    def _spelled(self, kwargs: dict) -> dict:
        """``kwargs`` with torch's second spellings (``axis`` for ``dim``, ``keepdims`` for ``keepdim``,
        and back) under the names ``translate`` takes; an unknown keyword names the nearest one."""
        names = self._keywords
        if names is None or names.issuperset(kwargs):
            return kwargs
        out = {}
        for k, v in kwargs.items():
            if k not in names:
                alias = next((a for a in KEYWORD_ALIASES.get(k, ()) if a in names), None)
                if alias is None:
                    raise unknown_keyword(
                        self.name, k, [n for n in inspect.signature(self.translate).parameters if n in names][1:]
                    )
                if alias in kwargs:
                    raise ParamInvalidError(f"{self.name}() got two values for {alias!r} / {k!r}", op=self.op_name)
                k = alias
            out[k] = v
        return out

    def _translate(self, args, kwargs):
        if kwargs:
            kwargs = self._spelled(kwargs)
        try:
            res = self.translate(*args, **kwargs)
        except OpsnnError:
            raise
        except ARGUMENT_ERRORS as exc:
            raise ParamInvalidError(
                bad_arguments_message(self.name, self.translate, args, kwargs, exc), op=self.op_name
            ) from None
        if len(res) == 2:
            return res[0], res[1], None
        return res

    def __call__(self, *args, algo: str | None = None, stream=None, **kwargs):
        inputs, attrs, n_out = self._translate(args, kwargs)
        res = executor.call(self.record, inputs, attrs, algo=algo, num_outputs=n_out, stream=stream)
        return (res,) if self.sequence and not isinstance(res, tuple) else res

    def prepare(self, *args, out=None, algo: str | None = None, **kwargs) -> executor.Executor:
        """Two-phase API: validate, infer, select and plan now; ``.run()`` later."""
        inputs, attrs, n_out = self._translate(args, kwargs)
        return executor.prepare(self.record, inputs, attrs, out=out, algo=algo, num_outputs=n_out)

    def __repr__(self) -> str:
        return f"<opsnn op function {self.name} -> {self.op_name}>"


#: keyword spellings torch accepts for one parameter (``x.sum(axis=1, keepdims=True)``)
KEYWORD_ALIASES = {"dim": ("axis",), "axis": ("dim",), "keepdim": ("keepdims",), "keepdims": ("keepdim",)}


def spellings(name: str) -> tuple:
    return (name,) + KEYWORD_ALIASES.get(name, ())


def unknown_keyword(fn_name: str, key: str, params: list) -> ParamInvalidError:
    """The error for ``fn_name(key=...)``: names the nearest of ``params`` with all its spellings."""
    spelled = {s: m for m in params for s in spellings(m)}
    close = difflib.get_close_matches(key, list(spelled), n=1, cutoff=0.5)
    if close:
        names = [close[0]] + [s for s in spellings(spelled[close[0]]) if s != close[0]]
        return ParamInvalidError(
            f"{fn_name}() got an unexpected keyword {key!r}; did you mean {' / '.join(repr(s) for s in names)}?"
        )
    listed = ", ".join(" / ".join(repr(s) for s in spellings(m)) for m in params) or "none"
    return ParamInvalidError(f"{fn_name}() got an unexpected keyword {key!r}; its parameters are {listed}")


def api(name: str, op: str, domain: str = "", *, sequence: bool = False) -> Callable[[Callable], OpFunction]:
    """Decorator: expose ``translate(*args, **kw) -> (inputs, attrs[, num_outputs])``
    as the functional entry point ``name`` of op record ``op`` (``sequence``: its results are a tuple
    however many there are)."""

    def deco(translate: Callable) -> OpFunction:
        if name in FUNCTIONS:
            raise ParamInvalidError(f"api: a functional entry point {name!r} already exists")
        fn = OpFunction(name, op, translate, domain, sequence)
        FUNCTIONS[name] = fn
        return fn

    return deco


def run_op(
    op: str,
    inputs: list,
    attrs: dict | None = None,
    *,
    num_outputs: int | None = None,
    domain: str = "",
    algo: str | None = None,
    stream=None,
):
    """Run any registered op by its graph op type, e.g. ``run_op("Conv", [x, w], {"strides": [2, 2]})``.
    Always returns a tuple of output tensors."""
    res = executor.call(get_op(op, domain), inputs, attrs, algo=algo, num_outputs=num_outputs, stream=stream)
    return res if isinstance(res, tuple) else (res,)
