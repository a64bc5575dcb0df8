"""opsnn.distributed on 2 ranks: each test starts a worker script through ``opsnn launch -n 2`` (mpirun).

The workers (tests/distributed_workers/) check their results against numpy oracles themselves;
these tests check how the jobs end. A failure's bound is measured from the moment the failing
rank says it fails (its own clock line) to the end of the job (the four failure jobs run at once), so a slow start (importing opsnn
in three processes) does not count against it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

import opsnn
import opsnn.distributed as dist
from opsnn.distributed.launch import THREAD_VARIABLES, cores, launch_command
from opsnn.distributed.launch import main as launch_main
from opsnn.distributed.work import _seconds
from opsnn.errors import DistributedError, ParamInvalidError

WORKERS = Path(__file__).resolve().parent / "distributed_workers"
HAS_MPI = importlib.util.find_spec("mpi4py") is not None
needs_mpi = pytest.mark.skipif(
    not HAS_MPI, reason="mpi4py is not installed (pip install 'opsnn[distributed]'; make test installs it)"
)
#: the most seconds from a rank's failure to the end of the whole job
FAILURE_BOUND_S = 30


def _env() -> dict:
    env = dict(os.environ)
    src = str(Path(opsnn.__file__).resolve().parents[1])  # the ranks import the opsnn under test
    env["PYTHONPATH"] = src + os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else src
    env.pop("OPSNN_DDP_TIMEOUT", None)
    return env


def _command(*program: str) -> list[str]:
    """``opsnn launch -n 2 --threads-per-rank 1 program...``"""
    return [sys.executable, "-m", "opsnn.cli", "launch", "-n", "2", "--threads-per-rank", "1", *program]


class Job:
    """A launched job, its output collected by a thread that notes the wall time it ended."""

    def __init__(self, *program: str, env: dict | None = None):
        self.proc = subprocess.Popen(
            _command(*program),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**_env(), **(env or {})},
            start_new_session=True,  # its own process group: a hung job is killed with its ranks
        )
        self.stdout = self.stderr = ""
        self.ended = 0.0
        self._reader = threading.Thread(target=self._collect, daemon=True)
        self._reader.start()

    def _collect(self) -> None:
        self.stdout, self.stderr = self.proc.communicate()
        self.ended = time.time()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the launcher, mpirun and the ranks it started

    def result(self, timeout: float = 300) -> tuple[int, str]:
        self._reader.join(timeout)
        if self._reader.is_alive():
            self.kill()
            self._reader.join()
            raise AssertionError(f"the job hung for {timeout} s:\n{self.stdout}{self.stderr}")
        return self.proc.returncode, self.stdout + self.stderr


@pytest.fixture(scope="module")
def failure_jobs():
    """The failure scenarios, started together (each job mostly waits: its cost is starting up)."""
    jobs = {mode: Job(str(WORKERS / "failures.py"), mode) for mode in ("raise", "exit", "timeout")}
    jobs["noinit"] = Job(str(WORKERS / "failures.py"), "noinit", env={"OPSNN_DDP_TIMEOUT": "2"})
    yield jobs
    for job in jobs.values():
        job.kill()


def _clock(output: str, label: str) -> float:
    m = re.search(rf"{label} (\d+\.\d+)", output)
    assert m, f"no '{label}' line in:\n{output}"
    return float(m.group(1))


@needs_mpi
@pytest.mark.parametrize("progress", ["inline", "thread"])
def test_collectives_on_two_ranks_through_the_launcher(tmp_path, progress):
    """Both engines (one thread per rank picks inline progress; OPSNN_DDP_PROGRESS=thread the thread)."""
    job = Job(str(WORKERS / "collectives.py"), str(tmp_path), env={"OPSNN_DDP_PROGRESS": progress})
    rc, out = job.result()
    assert rc == 0, out
    for r in range(2):
        assert f"[rank {r}] ALL OK rank {r}" in job.stdout, out
        assert f"[rank {r}] progress {progress}" in job.stdout, out
        assert f"[rank {r}] OPSNN_NUM_THREADS=1" in job.stdout, out  # --threads-per-rank reached the ranks
    assert "[rank 0] rank_zero_only ran here" in job.stdout and "[rank 1] rank_zero_only" not in job.stdout


@needs_mpi
@pytest.mark.parametrize("mode", ["raise", "exit"])
def test_a_failing_rank_ends_the_job_naming_it(failure_jobs, mode):
    job = failure_jobs[mode]
    rc, out = job.result()
    assert rc != 0, out
    assert job.ended - _clock(out, "failing at") < FAILURE_BOUND_S, out
    assert "[rank 0] step 3 done" not in out, out  # rank 0 never got past the step rank 1 failed in
    if mode == "raise":
        assert "[rank 1] RuntimeError: failure injected at step 3" in out, out
        assert "rank 1 of 2: raised RuntimeError; aborting every rank" in out, out
    else:
        assert re.search(r"Process name: \[\S+,1\]\s+Exit code:\s+3", out), out  # mpirun names rank 1


@needs_mpi
def test_a_collective_that_never_completes_times_out_naming_the_missing_rank(failure_jobs):
    job = failure_jobs["timeout"]
    rc, out = job.result()
    assert rc != 0, out
    assert "[rank 0] timeout raised as expected" in out, out
    assert re.search(r"CollectiveTimeoutError: .*all_reduce #2 .* within 2 s on rank 0 of 2: rank 1 never reached", out)
    assert "rank 0 of 2: destroying a process group broken by CollectiveTimeoutError" in out, out
    assert job.ended - _clock(out, "collective #2 starts at") < FAILURE_BOUND_S, out


@needs_mpi
def test_a_rank_that_never_joins_times_out_init(failure_jobs):
    job = failure_jobs["noinit"]
    rc, out = job.result()
    assert rc != 0, out
    assert re.search(r"CollectiveTimeoutError: .*init_process_group did not complete within 2 s on rank 0 of 2", out)
    assert "rank 0 of 2: raised CollectiveTimeoutError; aborting every rank" in out, out
    assert job.ended - _clock(out, "\\[rank 0\\] init starts at") < FAILURE_BOUND_S, out


@needs_mpi
def test_a_plain_python_run_is_a_world_of_one():
    code = (
        "import numpy as np, opsnn, opsnn.distributed as dist\n"
        "dist.init_process_group()\n"
        "assert (dist.get_rank(), dist.get_world_size(), dist.get_backend()) == (0, 1, 'mpi')\n"
        "t = opsnn.tensor(np.arange(6, dtype=np.float32))\n"
        "dist.all_reduce(t, op=dist.ReduceOp.AVG); dist.broadcast(t, 0)\n"
        "out = [opsnn.zeros(6)]; dist.all_gather(out, t)\n"
        "assert t.tolist() == out[0].tolist() == list(range(6))\n"
        "dist.destroy_process_group()\n"
        "dist.init_process_group(timeout=5); dist.barrier(); dist.destroy_process_group()  # again, fresh\n"
        "print('world of one ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 0 and "world of one ok" in proc.stdout, proc.stdout + proc.stderr


def test_an_unknown_backend_is_a_typed_error_listing_the_available(monkeypatch):
    with pytest.raises(ParamInvalidError, match=r"unknown backend 'nccl'; available: mpi"):
        dist.init_process_group("nccl")
    monkeypatch.setenv("OPSNN_DDP_BACKEND", "gloo")
    with pytest.raises(ParamInvalidError, match=r"unknown backend 'gloo'; available: mpi"):
        dist.init_process_group()
    monkeypatch.setenv("OPSNN_DDP_BACKEND", "mpi")
    with pytest.raises(ParamInvalidError, match=r"timeout must be a positive number"):
        dist.init_process_group(timeout=-1)
    monkeypatch.setenv("OPSNN_DDP_TIMEOUT", "soon")
    with pytest.raises(ParamInvalidError, match=r"OPSNN_DDP_TIMEOUT: timeout must be a positive number"):
        dist.init_process_group()
    assert _seconds(timedelta(minutes=1, seconds=30), "x") == 90.0 and _seconds("2.5", "x") == 2.5
    assert not dist.is_initialized()
    with pytest.raises(DistributedError, match="init_process_group"):
        dist.get_rank()
    assert dist.is_main_process()  # no group: this process is the main one (logs, progress bars)


@needs_mpi
def test_launch_options_end_where_the_program_starts(capsys):
    assert launch_main(["-n", "3", "--mpi-arg=--map-by", "--mpi-arg=slot", "--dry-run", "-m", "pkg.x", "-n", "1"]) == 0
    cmd = capsys.readouterr().out.split()
    assert cmd[1:3] == ["-n", "3"] and cmd[-4:] == ["-m", "pkg.x", "-n", "1"] and "slot" in cmd
    assert launch_main(["--dry-run", "train.py", "--dry-run"]) == 0
    assert capsys.readouterr().out.split()[-2:] == ["train.py", "--dry-run"]
    with pytest.raises(SystemExit):  # a missing script: one line before mpirun starts ranks that each say so
        launch_main(["-n", "2", "no_such_script.py"])
    assert "no script 'no_such_script.py' (not a file)" in capsys.readouterr().err


@needs_mpi
def test_launch_command_adds_the_local_flags_and_shares_the_cores():
    cmd, env = launch_command(2, ["train.py", "--epochs", "3"])
    assert cmd[1:3] == ["-n", "2"] and cmd[-3:] == ["train.py", "--epochs", "3"] and cmd[-4] == sys.executable
    if "--output" in cmd or "--tag-output" in cmd:  # Open MPI: the flags a local run needs, in one place
        assert "--oversubscribe" in cmd
        assert ("--allow-run-as-root" in cmd) == (os.geteuid() == 0)
    want = str(max(1, cores() // 2)) if not os.environ.get("OPSNN_NUM_THREADS", "").isdigit() else None
    for name in THREAD_VARIABLES:
        assert env[name] == (want or os.environ["OPSNN_NUM_THREADS"])
    cmd, env = launch_command(3, ["-m", "pkg.train"], threads_per_rank=2, mpi_args=("--map-by", "slot"))
    assert cmd[-3:] == [sys.executable, "-m", "pkg.train"] and "--map-by" in cmd
    assert all(env[name] == "2" for name in THREAD_VARIABLES)
    # the opsnn command itself (opsnn launch -n 2 -- opsnn train ...); tagged ranks know their lines are tagged
    cmd, env = launch_command(2, ["opsnn", "train", "--steps", "3"])
    assert cmd[-6:] == [sys.executable, "-m", "opsnn.cli", "train", "--steps", "3"]
    assert env["OPSNN_LAUNCH_TAGS"] == "1"
    _, env = launch_command(2, ["train.py"], tag_output=False)
    assert "OPSNN_LAUNCH_TAGS" not in env
    with pytest.raises(ParamInvalidError, match="-n must be a positive number of ranks, got 0"):
        launch_command(0, ["train.py"])
    with pytest.raises(ParamInvalidError, match="threads-per-rank"):
        launch_command(2, ["train.py"], threads_per_rank=0)
