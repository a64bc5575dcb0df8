"""DistributedDataParallel over MPI: ``opsnn launch -n 2`` runs tests/distributed_workers/ddp.py,
whose ranks check themselves against one process on the whole batch (see the worker's scenarios);
here, how the job ends and each rank's PASS lines. The bucket assignment is checked in-process."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import opsnn
from opsnn.nn.parallel import assign_buckets

WORKER = Path(__file__).resolve().parent / "distributed_workers" / "ddp.py"
needs_mpi = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None,
    reason="mpi4py is not installed (pip install 'opsnn[distributed]'; make test installs it)",
)


def run_ranks(*scenario: str, timeout: float = 300) -> str:
    env = dict(os.environ)
    src = str(Path(opsnn.__file__).resolve().parents[1])  # the ranks import the opsnn under test
    env["PYTHONPATH"] = src + os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else src
    env["OPSNN_DDP_TIMEOUT"] = "120"  # a collective a buggy reducer leaves unmatched ends the job
    cmd = [sys.executable, "-m", "opsnn.cli", "launch", "-n", "2", "--threads-per-rank", "1", str(WORKER), *scenario]
    # its own session: a hung job is killed with mpirun and the ranks
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{WORKER.name} {scenario[0]} hung for {timeout} s:\n{out[-6000:]}") from None
    assert proc.returncode == 0, f"{WORKER.name} {scenario[0]} on 2 ranks failed ({proc.returncode}):\n{out[-6000:]}"
    return out


def test_assign_buckets_reverse_order_per_dtype_with_a_small_first_bucket():
    f32 = [np.zeros(n, np.float32) for n in (10, 300, 50, 50, 400)]  # 40, 1200, 200, 200, 1600 bytes
    assert assign_buckets(f32, cap_bytes=1000, first_cap_bytes=300) == [[4], [3, 2, 1], [0]]
    assert assign_buckets(f32, cap_bytes=10**6) == [[4, 3, 2, 1, 0]]
    mixed = [np.zeros(100, np.float32), np.zeros(100, np.float16), np.zeros(100, np.float32)]
    assert assign_buckets(mixed, cap_bytes=10**6) == [[2, 0], [1]]  # one dtype per bucket


@needs_mpi
def test_two_ranks_train_like_one_process_on_the_whole_batch():
    out = run_ranks("train")
    for rank in range(2):
        for kind in ("cnn", "encoder"):
            for opt in ("sgd", "adamw"):
                assert f"[rank {rank}] PASS train {kind} {opt}" in out, out[-4000:]


@needs_mpi
def test_no_sync_buffers_mismatch_unused_parameters_and_resume(tmp_path):
    out = run_ranks("misc", str(tmp_path))
    for rank in range(2):
        for what in ("no_sync", "buffer broadcast", "mismatch", "unused parameters", "resume", "mixed dtypes", "misc"):
            assert f"[rank {rank}] PASS {what}" in out, out[-4000:]


@needs_mpi
def test_compiled_training_step_reduces_buckets_inside_the_graph():
    out = run_ranks("compiled")
    for rank in range(2):
        for kind in ("mlp", "cnn"):
            for opt in ("sgd", "adamw"):
                assert f"[rank {rank}] PASS compiled {kind} {opt}" in out, out[-4000:]
        assert f"[rank {rank}] PASS compiled no_sync" in out, out[-4000:]


def test_allreduce_graph_ops_in_a_world_of_one():
    """Without other ranks AllReduceStart only divides by the world size (1) and AllReduceWait copies;
    a graph traced for another world size refuses to run rather than average wrongly."""
    from opsnn.distributed import graph_ops

    x = np.random.default_rng(0).standard_normal(7).astype(np.float32)
    buf = graph_ops.all_reduce_start(opsnn.tensor(x), bucket=3)
    y = graph_ops.all_reduce_wait(buf, bucket=3)
    np.testing.assert_array_equal(y.numpy(), x / 1)
    with pytest.raises(opsnn.errors.OpsnnError, match="traced for a world of 2 rank"):
        graph_ops.all_reduce_start(opsnn.tensor(x), world_size=2).numpy()
