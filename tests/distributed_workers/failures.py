"""A rank fails in one of four ways; the test checks the whole job ends with it named, in bounded time.

``raise``: rank 1 raises at step 3 of a loop with one all_reduce per step (rank 0 waits in step 3's).
``timeout``: rank 1 skips a collective and sleeps; rank 0's times out after 2 s, naming rank 1;
rank 0 catches it and destroys the group, which aborts the job (rank 1 would wait for ever).
``exit``: rank 1 leaves with os._exit(3) at step 3 (a crash: no exception hook runs).
``noinit``: rank 1 never calls init_process_group; rank 0's times out after 2 s.
"""

import os
import sys
import time

import numpy as np

import opsnn
import opsnn.distributed as dist
from opsnn.errors import CollectiveTimeoutError, DistributedError

mode = sys.argv[1]
if mode == "noinit":
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() == 1:
        time.sleep(60)  # never joins; ended by rank 0's abort
    print(f"init starts at {time.time()}", flush=True)
# noinit: the timeout comes from OPSNN_DDP_TIMEOUT=2, which the test sets
dist.init_process_group("mpi", timeout={"timeout": 2.0, "noinit": None}.get(mode, 60.0))
rank = dist.get_rank()
t = opsnn.tensor(np.ones(1000, np.float32))
if mode == "timeout":
    dist.all_reduce(t)  # both ranks: collective #1
    if rank == 1:
        time.sleep(60)  # never reaches #2; ended by rank 0's abort
    print(f"collective #2 starts at {time.time()}", flush=True)
    try:
        dist.all_reduce(t)
    except CollectiveTimeoutError as exc:
        assert "all_reduce #2" in str(exc) and "rank 1 never reached it" in str(exc), str(exc)
        try:
            dist.barrier()
        except DistributedError as later:
            assert "broken" in str(later), str(later)
        else:
            raise AssertionError("a collective after a timeout ran") from exc
        print("timeout raised as expected", flush=True)
        dist.destroy_process_group()  # caught, and the program ends normally: destroying a broken group aborts
        raise AssertionError("destroy_process_group returned on a broken group") from exc
for step in range(1, 6):
    if rank == 1 and step == 3:
        print(f"failing at {time.time()}", flush=True)
        if mode == "exit":
            os._exit(3)
        raise RuntimeError(f"failure injected at step {step}")
    dist.all_reduce(t)
    print(f"step {step} done", flush=True)
