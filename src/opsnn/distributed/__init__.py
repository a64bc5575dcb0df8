"""Data-parallel training across processes on MPI: torch.distributed's process group and collectives.

Start the ranks with ``opsnn launch -n 2 train.py`` (or ``mpirun -np 2 python train.py``); each
rank then joins the world and combines tensors in place::

    import opsnn, opsnn.distributed as dist

    dist.init_process_group("mpi")             # or OPSNN_DDP_BACKEND=mpi; a plain `python` run is a world of 1
    t = opsnn.tensor([1.0, 2.0]) * (dist.get_rank() + 1)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)    # in place, on every rank
    work = dist.all_reduce(t, async_op=True)    # returns at once; MPI runs it ...
    ...                                         # ... while this thread computes
    work.wait()
    if dist.is_main_process():
        print(t.tolist())
    dist.destroy_process_group()

An exception no rank catches aborts every rank (the job ends naming it); a collective that runs
longer than the group's timeout raises :class:`~opsnn.errors.CollectiveTimeoutError` naming the
ranks it waited for. Needs the ``distributed`` extra (mpi4py and Open MPI).
"""

from ..errors import CollectiveTimeoutError, DistributedError
from .collectives import (
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    barrier,
    broadcast,
    reduce_scatter,
    reduce_scatter_tensor,
    run_on_rank0,
)
from .group import (
    DEFAULT_TIMEOUT_S,
    destroy_process_group,
    get_backend,
    get_rank,
    get_world_size,
    init_process_group,
    is_available,
    is_initialized,
    is_main_process,
    rank_zero_only,
)
from .reduce_op import ReduceOp
from .work import Work

__all__ = [
    "CollectiveTimeoutError",
    "DEFAULT_TIMEOUT_S",
    "DistributedError",
    "ReduceOp",
    "Work",
    "all_gather",
    "all_gather_into_tensor",
    "all_reduce",
    "barrier",
    "broadcast",
    "destroy_process_group",
    "get_backend",
    "get_rank",
    "get_world_size",
    "init_process_group",
    "is_available",
    "is_initialized",
    "is_main_process",
    "rank_zero_only",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "run_on_rank0",
]
