"""``opsnn launch -n N train.py ...``: start N ranks through ``mpirun``, threads shared out, output tagged.

A thin wrapper: it finds ``mpirun`` (``OPSNN_MPIRUN``, else the one beside this Python, which
the ``distributed`` extra's Open MPI wheel installs, else ``PATH``), gives each rank
``cores // N`` threads (``OPSNN_NUM_THREADS``, OpenMP, MKL, OpenBLAS and numba), and prefixes each
line a rank prints with ``[rank R]``. The flags a local run needs (Open MPI refuses root without
``--allow-run-as-root``, and more ranks than cores without ``--oversubscribe``) are added here and
nowhere else::

    $ opsnn launch -n 2 train.py --epochs 3
    $ opsnn launch -n 2 --threads-per-rank 1 -m mypkg.train
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

from ..errors import DistributedError, ParamInvalidError

#: the variables that set a rank's thread count, each to ``threads_per_rank``
THREAD_VARIABLES = (
    "OPSNN_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMBA_NUM_THREADS",
)

#: Open MPI's output tag, ``[jobid,rank]<stdout>: ``
_TAG = re.compile(rb"^\[\d+,(\d+)\]<std(?:out|err)>: ?")


def find_mpirun() -> str:
    """The ``mpirun`` to start ranks with: ``OPSNN_MPIRUN``, the venv's, or the first on ``PATH``."""
    explicit = os.environ.get("OPSNN_MPIRUN", "")
    if explicit:
        path = shutil.which(explicit)
        if path is None:
            raise DistributedError(f"launch: OPSNN_MPIRUN={explicit!r} is not an executable", op="launch")
        return path
    beside = Path(sys.executable).parent / "mpirun"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    for name in ("mpirun", "mpiexec"):
        path = shutil.which(name)
        if path is not None:
            return path
    raise DistributedError(
        "launch: no mpirun found; pip install 'opsnn[distributed]' (Open MPI's wheel puts mpirun beside python), "
        "put a system MPI's mpirun on PATH, or set OPSNN_MPIRUN",
        op="launch",
    )


@functools.cache
def mpi_flavour(mpirun: str) -> tuple[str, int]:
    """``("openmpi", major version)``, ``("mpich", 0)`` or ``("unknown", 0)``, from ``mpirun --version``."""
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ("unknown", 0)
    m = re.search(r"\((?:Open MPI|OpenRTE)\)\s+(\d+)", out)
    if m:
        return ("openmpi", int(m.group(1)))
    if "HYDRA" in out or "MPICH" in out.upper():
        return ("mpich", 0)
    return ("unknown", 0)


def cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def launch_command(
    nprocs: int,
    program: list[str],
    *,
    threads_per_rank: int | None = None,
    mpirun: str | None = None,
    python: str | None = None,
    mpi_args: tuple = (),
    tag_output: bool = True,
) -> tuple[list[str], dict]:
    """``(argv, env)`` that start ``nprocs`` ranks of ``python program...`` (``program`` is a script
    and its arguments, or ``["-m", module, ...]``)."""
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ParamInvalidError(f"launch: -n must be a positive number of ranks, got {nprocs!r}", op="launch")
    if not program:
        raise ParamInvalidError("launch: no script to run (opsnn launch -n 2 train.py ...)", op="launch")
    env = dict(os.environ)
    if threads_per_rank is None:
        given = env.get("OPSNN_NUM_THREADS", "")
        threads_per_rank = int(given) if given.isdigit() and int(given) > 0 else max(1, cores() // nprocs)
    if isinstance(threads_per_rank, bool) or not isinstance(threads_per_rank, int) or threads_per_rank < 1:
        raise ParamInvalidError(
            f"launch: --threads-per-rank must be a positive integer, got {threads_per_rank!r}", op="launch"
        )
    for name in THREAD_VARIABLES:
        env[name] = str(threads_per_rank)
    env["PYTHONUNBUFFERED"] = "1"  # a rank's lines reach the terminal as it prints them, not at exit
    env.pop("OPSNN_LAUNCH_TAGS", None)
    if tag_output:
        env["OPSNN_LAUNCH_TAGS"] = "1"  # the ranks' own output needs no [rank R] prefix of its own
    if program[0] == "opsnn" and not os.path.exists(program[0]):  # opsnn launch -n 2 -- opsnn train ...
        program = ["-m", "opsnn.cli", *program[1:]]
    mpirun = mpirun or find_mpirun()
    flavour, major = mpi_flavour(mpirun)
    cmd = [mpirun, "-n", str(nprocs)]
    if flavour == "openmpi":
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        cmd.append("--oversubscribe")  # a local run may ask for more ranks than Open MPI counts cores
        if threads_per_rank > 1:
            cmd += ["--bind-to", "none"]  # Open MPI binds each rank to one core by default
        if tag_output:
            cmd += ["--output", "tag"] if major >= 5 else ["--tag-output"]
        for name in (*THREAD_VARIABLES, "PYTHONUNBUFFERED", *(["OPSNN_LAUNCH_TAGS"] if tag_output else [])):
            cmd += ["-x", name]  # forwarded to ranks on other hosts too
    cmd += list(mpi_args)
    cmd += [python or sys.executable, *program]
    return cmd, env


def _relay(src, dst) -> None:
    """Copy mpirun's output, Open MPI's ``[job,R]<stdout>:`` tag rewritten as ``[rank R] ``."""
    for line in iter(src.readline, b""):
        dst.write(_TAG.sub(rb"[rank \1] ", line))
        dst.flush()
    src.close()


def run(cmd: list[str], env: dict) -> int:
    """Run ``cmd`` with its output relayed (rank tags rewritten); mpirun's exit code."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if threading.current_thread() is threading.main_thread():  # a TERM for the launcher ends the ranks too
        signal.signal(signal.SIGTERM, lambda signum, frame: proc.send_signal(signal.SIGTERM))
    relays = [
        threading.Thread(target=_relay, args=(proc.stdout, sys.stdout.buffer), daemon=True),
        threading.Thread(target=_relay, args=(proc.stderr, sys.stderr.buffer), daemon=True),
    ]
    for t in relays:
        t.start()
    while True:
        try:
            rc = proc.wait()
            break
        except KeyboardInterrupt:  # the terminal's Ctrl-C reached mpirun too; wait for it to end the ranks
            continue
    for t in relays:
        t.join()
    return rc


#: launch's options that take a value (the program starts at the first word that is not an option)
_VALUED = {"-n", "--nprocs", "--threads-per-rank", "--mpi-arg"}


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(launch's options, the program and its arguments)``: the program is the first word that is
    not an option, or ``-m module``; everything after it is the program's."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return argv[:i], argv[i + 1 :]
        if word == "-m" or not word.startswith("-"):
            return argv[:i], argv[i:]
        i += 2 if word in _VALUED else 1
    return argv, []


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    options, program = _split(argv)
    parser = argparse.ArgumentParser(
        prog="opsnn launch",
        usage="opsnn launch [options] script.py [args ...]  |  opsnn launch [options] -m module [args ...]",
        description="Start N ranks of a Python script (or module) through mpirun: data-parallel training on MPI.",
    )
    parser.add_argument("-n", "--nprocs", type=int, default=2, help="number of ranks (default 2)")
    parser.add_argument(
        "--threads-per-rank",
        type=int,
        help="threads each rank's kernels use (default: OPSNN_NUM_THREADS if set, else cores // ranks)",
    )
    parser.add_argument(
        "--mpi-arg",
        action="append",
        default=[],
        help="an extra argument for mpirun, one per flag: --mpi-arg=--map-by --mpi-arg=slot",
    )
    parser.add_argument("--no-tag", action="store_true", help="leave each line without its [rank R] prefix")
    parser.add_argument("--dry-run", action="store_true", help="print the mpirun command instead of running it")
    args = parser.parse_args(options)
    if not program or program == ["-m"]:
        parser.error("no script to run (opsnn launch -n 2 train.py ...)")
    cmd, env = launch_command(
        args.nprocs,
        program,
        threads_per_rank=args.threads_per_rank,
        mpi_args=tuple(args.mpi_arg),
        tag_output=not args.no_tag,
    )
    if args.dry_run:
        print(" ".join(cmd))
        return 0
    if program[0] not in ("-m", "opsnn") and not os.path.isfile(program[0]):
        parser.error(f"no script {program[0]!r} (not a file)")  # before mpirun starts ranks that each say so
    return run(cmd, env)
