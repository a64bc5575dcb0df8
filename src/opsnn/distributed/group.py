"""The default process group: ``init_process_group`` / ``destroy_process_group``, rank and world size.

``init_process_group`` reads the world MPI started (``mpirun -np 2 python train.py``, or
``opsnn launch -n 2 train.py``), starts what runs the collectives, and installs an exception hook:
an exception no one catches on any rank prints its traceback and aborts every rank
(``MPI_Abort``), so the job ends with the failing rank named instead of the others waiting in a
collective for ever. A plain ``python train.py`` is a world of one.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys

from ..errors import DistributedError, ParamInvalidError
from .work import _seconds

#: seconds a collective may run before it fails with CollectiveTimeoutError (torch's default too)
DEFAULT_TIMEOUT_S = 300.0

#: backend name -> loader of its process-group class
BACKENDS = {"mpi": lambda: __import__("opsnn.distributed.mpi", fromlist=["ProcessGroupMPI"]).ProcessGroupMPI}

_group = None
_previous_excepthook = None
_hooked_group = None  # the group whose ranks an uncaught exception aborts


def is_available() -> bool:
    """True when a backend can start here (mpi4py imports)."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


def is_initialized() -> bool:
    return _group is not None


def init_process_group(
    backend: str | None = None, *, timeout=None, init_method=None, world_size: int = -1, rank: int = -1
) -> None:
    """Join the world of ranks MPI started: every rank calls it once, before any collective.

    ``backend``: ``"mpi"`` (the default; ``OPSNN_DDP_BACKEND`` picks it when not given);
    ``timeout``: seconds or a ``timedelta`` a collective may run before it raises
    :class:`~opsnn.errors.CollectiveTimeoutError` (default ``OPSNN_DDP_TIMEOUT``, else 300 s);
    ``world_size`` / ``rank``, when given, must agree with the world MPI started.
    ``init_method`` is accepted for torch's signature: MPI finds its peers itself.

        >>> import opsnn.distributed as dist
        >>> dist.init_process_group("mpi")          # doctest: +SKIP
        >>> dist.get_rank(), dist.get_world_size()  # doctest: +SKIP
        (0, 2)
    """
    global _group
    if _group is not None:
        raise DistributedError(
            "init_process_group: the default process group is already initialised (destroy_process_group() first)",
            op="init_process_group",
        )
    name = backend if backend is not None else os.environ.get("OPSNN_DDP_BACKEND", "") or "mpi"
    name = str(name).lower()
    if name not in BACKENDS:
        raise ParamInvalidError(
            f"init_process_group: unknown backend {name!r}; available: {', '.join(sorted(BACKENDS))}",
            op="init_process_group",
        )
    if timeout is None:
        env = os.environ.get("OPSNN_DDP_TIMEOUT", "")
        timeout_s = _seconds(env, "OPSNN_DDP_TIMEOUT") if env else DEFAULT_TIMEOUT_S
    else:
        timeout_s = _seconds(timeout, "init_process_group")
    group = BACKENDS[name]()(timeout_s)  # reads this rank's place in the world; no communication yet
    _install_excepthook(group)  # from here a failure on this rank must end every rank
    try:
        for what, given, actual in (("world_size", world_size, group.size), ("rank", rank, group.rank)):
            if given not in (-1, None) and given != actual:
                raise ParamInvalidError(
                    f"init_process_group: {what}={given} disagrees with the world MPI started ({what} {actual})",
                    op="init_process_group",
                )
        group.connect()
    except BaseException as exc:
        if group.size > 1:  # the other ranks wait for this one in init_process_group
            atexit.register(_abort, group, f"init_process_group failed: {type(exc).__name__}")
        else:
            _restore_excepthook()
        raise
    _group = group
    atexit.register(destroy_process_group)


def destroy_process_group(group=None) -> None:
    """Run the queued collectives, join the communication thread (if any) and forget the group (a later
    ``init_process_group`` starts a new one). Nothing happens when no group exists."""
    global _group
    _check_group(group, "destroy_process_group")
    g, _group = _group, None
    if g is None:
        return
    atexit.unregister(destroy_process_group)
    _restore_excepthook()
    g.close()
    if g.broken is not None and g.size > 1:
        # a collective that never finished is still posted, and the ranks disagree on which comes
        # next: ending normally would leave the others in it (or in MPI_Finalize) for ever
        _abort(g, f"destroying a process group broken by {type(g.broken).__name__}: {g.broken}")


def _abort(group, why: str) -> None:
    sys.stderr.write(f"opsnn.distributed: rank {group.rank} of {group.size}: {why}; aborting every rank (MPI_Abort)\n")
    sys.stderr.flush()
    group.abort(1)


def default_group():
    """The process group collectives run on; raises when ``init_process_group`` has not run."""
    if _group is None:
        raise DistributedError(
            "the default process group is not initialised: call opsnn.distributed.init_process_group() first",
            op="opsnn.distributed",
        )
    return _group


def _check_group(group, what: str) -> None:
    if group is not None and group is not _group:
        raise ParamInvalidError(f"{what}: only the default process group exists; pass group=None", op=what)


def get_backend(group=None) -> str:
    _check_group(group, "get_backend")
    return default_group().name


def get_rank(group=None) -> int:
    """This process's rank in ``[0, world size)``."""
    _check_group(group, "get_rank")
    return default_group().rank


def get_world_size(group=None) -> int:
    _check_group(group, "get_world_size")
    return default_group().size


def is_main_process() -> bool:
    """True on rank 0, and in a process without a process group (for progress bars, logs, checkpoints)."""
    return _group is None or _group.rank == 0


def rank_zero_only(fn):
    """Decorate ``fn`` so it runs on rank 0 only (returning None on the others):

    >>> @rank_zero_only
    ... def log(msg):
    ...     print(msg)
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs) if is_main_process() else None

    return wrapper


def _abort_hook(exc_type, exc, tb) -> None:
    """Print the traceback, then end every rank: the others would wait in their next collective."""
    (_previous_excepthook or sys.__excepthook__)(exc_type, exc, tb)
    g = _hooked_group
    if g is not None and g.size > 1:
        _abort(g, f"raised {exc_type.__name__}")


def _install_excepthook(group) -> None:
    global _previous_excepthook, _hooked_group
    _hooked_group = group
    if sys.excepthook is not _abort_hook:
        _previous_excepthook = sys.excepthook
        sys.excepthook = _abort_hook


def _restore_excepthook() -> None:
    global _previous_excepthook, _hooked_group
    if sys.excepthook is _abort_hook:
        sys.excepthook = _previous_excepthook or sys.__excepthook__
    _previous_excepthook = _hooked_group = None
