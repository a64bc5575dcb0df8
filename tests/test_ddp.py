"""DistributedDataParallel over MPI: ``mpirun -np 2`` runs tests/_ddp_worker.py, whose ranks check
themselves against one process on the whole batch (see the worker's scenarios); here, the job's
exit status and each rank's PASS lines. The bucket assignment is checked in-process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from opsnn.nn.parallel import assign_buckets

pytest.importorskip("mpi4py")
WORKER = Path(__file__).with_name("_ddp_worker.py")
SRC = Path(__file__).resolve().parents[1] / "src"


def _mpirun() -> str:
    here = Path(sys.executable).with_name("mpirun")
    found = str(here) if here.exists() else shutil.which("mpirun")
    if found is None:
        pytest.skip("no mpirun (install the [distributed] extra: pip install 'opsnn[distributed]')")
    return found


def run_ranks(scenario: str, n: int = 2, timeout: float = 240) -> str:
    cmd = [_mpirun(), "-np", str(n), "--oversubscribe"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    env = dict(os.environ, OPSNN_NUM_THREADS="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [*cmd, sys.executable, str(WORKER), scenario], capture_output=True, text=True, env=env, timeout=timeout
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mpirun -np {n} {WORKER.name} {scenario} failed ({proc.returncode}):\n{out[-6000:]}"
    return out


def test_assign_buckets_reverse_order_per_dtype_with_a_small_first_bucket():
    f32 = [np.zeros(n, np.float32) for n in (10, 300, 50, 50, 400)]  # 40, 1200, 200, 200, 1600 bytes
    assert assign_buckets(f32, cap_bytes=1000, first_cap_bytes=300) == [[4], [3, 2, 1], [0]]
    assert assign_buckets(f32, cap_bytes=10**6) == [[4, 3, 2, 1, 0]]
    mixed = [np.zeros(100, np.float32), np.zeros(100, np.float16), np.zeros(100, np.float32)]
    assert assign_buckets(mixed, cap_bytes=10**6) == [[2, 0], [1]]  # one dtype per bucket


def test_two_ranks_train_like_one_process_on_the_whole_batch():
    out = run_ranks("train")
    for rank in range(2):
        for kind in ("cnn", "encoder"):
            for opt in ("sgd", "adamw"):
                assert f"rank {rank}: PASS train {kind} {opt}" in out, out[-4000:]


def test_no_sync_buffers_mismatch_and_unused_parameters():
    out = run_ranks("misc")
    for rank in range(2):
        for what in ("no_sync", "buffer broadcast", "mismatch", "unused parameters", "misc"):
            assert f"rank {rank}: PASS {what}" in out, out[-4000:]
