"""The two-phase API, one entry per op: ``opsnn.aclnn.<op>.prepare(...)`` returns an
Executor; ``executor.run(workspace, stream)`` launches it (asynchronously, repeatably).

>>> import opsnn, numpy as np
>>> x = opsnn.tensor(np.ones((1, 3, 8, 8), np.float32))
>>> w = opsnn.tensor(np.ones((4, 3, 3, 3), np.float32))
>>> ex = opsnn.aclnn.conv2d.prepare(x, w, None, stride=1, padding=1)
>>> ws = opsnn.empty((ex.workspace_size,), "uint8")
>>> y = ex.run(ws)
"""

from ..ops.api import FUNCTIONS
from ..ops.executor import Executor
from ..ops.executor import prepare as _prepare
from ..ops.registry import get_op


def prepare(
    op: str, inputs: list, attrs: dict | None = None, *, out=None, algo=None, num_outputs=None, domain: str = ""
) -> Executor:
    """Prepare any op by its graph op type: ``aclnn.prepare("Conv", [x, w], {"pads": [1, 1, 1, 1]})``."""
    return _prepare(get_op(op, domain), inputs, attrs, out=out, algo=algo, num_outputs=num_outputs)


def __getattr__(name: str):
    try:
        return FUNCTIONS[name]
    except KeyError:
        import difflib

        near = difflib.get_close_matches(name, list(FUNCTIONS), n=3)
        raise AttributeError(f"opsnn.aclnn has no op {name!r}" + (f"; did you mean {near}?" if near else "")) from None


def __dir__():
    return sorted(list(FUNCTIONS) + ["prepare", "Executor"])


__all__ = ["Executor", "prepare"]
