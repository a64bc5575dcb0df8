"""Functional entry points: ``opsnn.ops.conv2d(...)`` (eager) and
``opsnn.aclnn.conv2d.prepare(...)`` (two-phase) from one definition.

An entry point translates user-friendly (torch-style) arguments into the record's
ONNX-style inputs and attributes; both modes then go through the same record::

    @api("leaky_relu", "LeakyRelu")
    def leaky_relu(x, negative_slope=0.01):
        return [x], {"alpha": float(negative_slope)}
"""
from __future__ import annotations

import functools
from typing import Callable

from ..errors import ARGUMENT_ERRORS, OpsnnError, ParamInvalidError, bad_arguments_message
from . import executor
from .registry import OpRecord, get_op

#: snake_case name -> OpFunction (``opsnn.aclnn`` reads this table)
FUNCTIONS: dict[str, "OpFunction"] = {}


class OpFunction:
    """Call for eager mode; ``.prepare(...)`` for an :class:`~opsnn.ops.executor.Executor`."""

    def __init__(self, name: str, op: str, translate: Callable, domain: str = ""):
        self.name = name
        self.op_name = op
        self.domain = domain
        self.translate = translate
        self._rec: OpRecord | None = None
        functools.update_wrapper(self, translate)

    @property
    def record(self) -> OpRecord:
        if self._rec is None:
            self._rec = get_op(self.op_name, self.domain)
        return self._rec

    def _translate(self, args, kwargs):
        try:
            res = self.translate(*args, **kwargs)
        except OpsnnError:
            raise
        except ARGUMENT_ERRORS as exc:
            raise ParamInvalidError(bad_arguments_message(self.name, self.translate, args, kwargs, exc),
                                    op=self.op_name) from None
        if len(res) == 2:
            return res[0], res[1], None
        return res

    def __call__(self, *args, algo: str | None = None, stream=None, **kwargs):
        inputs, attrs, n_out = self._translate(args, kwargs)
        return executor.call(self.record, inputs, attrs, algo=algo, num_outputs=n_out, stream=stream)

    def prepare(self, *args, out=None, algo: str | None = None, **kwargs) -> executor.Executor:
        """Two-phase API: validate, infer, select and plan now; ``.run()`` later."""
        inputs, attrs, n_out = self._translate(args, kwargs)
        return executor.prepare(self.record, inputs, attrs, out=out, algo=algo, num_outputs=n_out)

    def __repr__(self) -> str:
        return f"<opsnn op function {self.name} -> {self.op_name}>"


def api(name: str, op: str, domain: str = "") -> Callable[[Callable], OpFunction]:
    """Decorator: expose ``translate(*args, **kw) -> (inputs, attrs[, num_outputs])``
    as the functional entry point ``name`` of op record ``op``."""

    def deco(translate: Callable) -> OpFunction:
        if name in FUNCTIONS:
            raise ParamInvalidError(f"api: a functional entry point {name!r} already exists")
        fn = OpFunction(name, op, translate, domain)
        FUNCTIONS[name] = fn
        return fn

    return deco


def run_op(op: str, inputs: list, attrs: dict | None = None, *, num_outputs: int | None = None,
           domain: str = "", algo: str | None = None, stream=None):
    """Run any registered op by its graph op type, e.g. ``run_op("Conv", [x, w], {"strides": [2, 2]})``.
    Always returns a tuple of output tensors."""
    res = executor.call(get_op(op, domain), inputs, attrs, algo=algo, num_outputs=num_outputs, stream=stream)
    return res if isinstance(res, tuple) else (res,)
