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
        assert f"[rank {rank}] PASS compiled buffer broadcast" in out, out[-4000:]
        assert f"[rank {rank}] PASS compiled unused parameters" in out, out[-4000:]


def test_grad_sink_places_a_leafs_only_gradient_of_a_pass():
    """The autograd hook DDP's buckets use: a leaf whose pass brings it one gradient gets the sink's
    tensor as .grad (here: written into a buffer, halved); two contributions, or a .grad already
    there, accumulate as usual. Oracle: the gradients in numpy (d sum(w * x) / dw = x)."""
    from opsnn.autograd.graph import get_meta

    x = np.arange(1.0, 5.0, dtype=np.float32)
    buf = np.zeros(4, np.float32)
    calls = []

    def sink(g):
        calls.append(1)
        np.divide(g.numpy(), 2, out=buf)
        return opsnn.Tensor(buf)

    w = opsnn.tensor(np.ones(4, np.float32)).requires_grad_()
    w.register_post_accumulate_grad_hook(lambda t: None)  # pending counts are kept for hooked leaves
    get_meta(w).grad_sink = sink
    opsnn.ops.sum(w * opsnn.tensor(x)).backward()
    assert len(calls) == 1 and np.shares_memory(w.grad.numpy(), buf)
    np.testing.assert_array_equal(buf, x / 2)
    opsnn.ops.sum(w * opsnn.tensor(x)).backward()  # .grad is there: added to, the sink not called
    assert len(calls) == 1
    np.testing.assert_array_equal(w.grad.numpy(), x / 2 + x)
    w.grad = None
    opsnn.ops.sum(w * opsnn.tensor(x) + w * opsnn.tensor(x)).backward()  # two contributions: no sink
    assert len(calls) == 1
    np.testing.assert_array_equal(w.grad.numpy(), 2 * x)


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


def _launch(args: list, timeout: float = 300, **extra_env) -> str:
    env = {**os.environ, **extra_env}
    src = str(Path(opsnn.__file__).resolve().parents[1])
    env["PYTHONPATH"] = src + os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else src
    env["OPSNN_DDP_TIMEOUT"] = "120"
    env.pop("OPSNN_LAUNCH_TAGS", None)
    cmd = [sys.executable, "-m", "opsnn.cli", "launch", "-n", "2", "--threads-per-rank", "1", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, start_new_session=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(args)} failed ({proc.returncode}):\n{out[-6000:]}"
    return out


@needs_mpi
def test_opsnn_train_under_mpirun_equals_one_process_on_the_global_batch(tmp_path):
    """`opsnn launch -n 2 -- opsnn train --ddp-backend mpi` (and as under a bare mpirun):
    each rank trains on its DistributedSampler shard (--batch 2 each), which is one process's
    --batch 4 on the same 8 samples; rank 0 alone shows progress and writes the curve and checkpoint;
    each rank's lines carry its rank."""
    from opsnn import trainer

    # SGD: AdamW's normalised steps would turn the gradients' summation-order rounding into lr-sized noise
    tiny = ["--model", "llama-tiny", "--seq-len", "8", "--vocab", "60", "--samples", "8", "--steps", "3"]
    tiny += ["--optimizer", "sgd"]
    out = _launch(["--", "opsnn", "train", "--ddp-backend", "mpi", "--batch", "2", "--out", str(tmp_path / "a"), *tiny])
    assert "[rank 0] steps 1..3: loss" in out and "x 2 ranks (DistributedDataParallel, mpi)" in out, out[-3000:]
    assert "[rank 1] steps 1..3 on 2 batches of this rank's shard" in out, out[-3000:]
    assert "[rank 1] step 3/3" not in out and "[rank 1] wrote" not in out, out[-3000:]
    assert (tmp_path / "a" / "loss_curve.png").is_file()
    # as under a bare mpirun: no launcher tags (the command prefixes its own lines), the backend from the env
    untagged = _launch(
        ["--no-tag", "-m", "opsnn.cli", "train", "--batch", "2", "--out", str(tmp_path / "b"), *tiny],
        OPSNN_DDP_BACKEND="mpi",
    )
    assert "[rank 1] steps 1..3 on 2 batches" in untagged and "[rank 0] wrote" in untagged, untagged[-3000:]

    alone = trainer.train(
        trainer.TrainConfig(model="llama-tiny", seq_len=8, vocab=60, samples=8, steps=3, batch=4, optimizer="sgd"),
        out=str(tmp_path / "one"),
    )
    for run in ("a", "b"):
        cfg, step = trainer.read_resume_config(tmp_path / run / "checkpoint.safetensors")
        assert step == 3 and cfg["batch"] == 2
        task = trainer.build_task(trainer.TrainConfig(**cfg))
        info = opsnn.load_checkpoint(tmp_path / run / "checkpoint.safetensors", task.model)
        np.testing.assert_allclose(info["extra"]["losses"], alone.losses, rtol=1e-5)
        want = dict(alone.task.model.named_parameters())
        for n, p in task.model.named_parameters():
            np.testing.assert_allclose(p.numpy(), want[n].numpy(), rtol=1e-5, atol=1e-6, err_msg=f"{run}: {n}")
