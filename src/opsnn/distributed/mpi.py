"""The MPI backend: a process group over ``MPI_COMM_WORLD`` through mpi4py's buffer (upper-case) API.

Collectives take contiguous numpy arrays and hand their memory to MPI as it is (no copies; the
tensor-level functions in :mod:`.collectives` stage non-contiguous tensors). MPI has no float16
or bfloat16 type: those travel as 16-bit words, and reductions over them use MPI operations of our
own that combine each pair of values in float32 and round once to the 16-bit type, which is the
correctly rounded result of that pair (float32 holds more than twice their significand bits): a
2-rank SUM, MAX, MIN or PRODUCT equals the exact result rounded once, as native 16-bit arithmetic
gives, and larger worlds round once per combining step of MPI's reduction tree.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from .. import dtypes as _dt
from ..errors import CollectiveTimeoutError, DistributedError, DTypeError
from .reduce_op import ReduceOp
from .work import CommThread, InlineProgress, Work

#: worlds up to this size tell each other which collective they reached (one small message to each
#: peer per collective), so a timeout names the ranks that never arrived; larger worlds skip it
TRACK_RANKS_UP_TO = 64
_ARRIVAL_TAG = 7

#: Open MPI settings opsnn starts MPI with unless the job set them (``mpirun --mca NAME VALUE``, or
#: ``OMPI_MCA_NAME`` in the environment): libnbc's non-blocking allreduce picks its binomial tree
#: for an in-place call or fewer than 4 ranks, where one rank receives and reduces the whole buffer
#: and sends it back; Rabenseifner's reduce-scatter + allgather (3) has every rank reduce 1/p of it
OPEN_MPI_DEFAULTS = {"coll_libnbc_iallreduce_algorithm": "3"}


def load_mpi():
    """mpi4py's ``MPI`` module, initialising MPI with ``MPI_THREAD_MULTIPLE`` when it is not yet."""
    try:
        import mpi4py
    except ImportError as exc:
        raise DistributedError(
            "init_process_group: backend 'mpi' needs mpi4py and an MPI library, which are not installed "
            "(pip install 'opsnn[distributed]', or mpi4py built against your system's MPI)",
            op="init_process_group",
        ) from exc
    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.thread_level = "multiple"  # the communication thread calls MPI beside the main thread
        for name, value in OPEN_MPI_DEFAULTS.items():
            os.environ.setdefault(f"OMPI_MCA_{name}", value)  # read by MPI_Init; other MPIs ignore it
    from mpi4py import MPI

    return MPI


def _mpi_types(MPI) -> dict:
    """numpy dtype -> the predefined MPI datatype with the same bytes (reductions need predefined types)."""
    table = {
        np.dtype(np.float32): MPI.FLOAT,
        np.dtype(np.float64): MPI.DOUBLE,
        np.dtype(np.int8): MPI.INT8_T,
        np.dtype(np.int16): MPI.INT16_T,
        np.dtype(np.int32): MPI.INT32_T,
        np.dtype(np.int64): MPI.INT64_T,
        np.dtype(np.uint8): MPI.UINT8_T,
        np.dtype(np.uint16): MPI.UINT16_T,
        np.dtype(np.uint32): MPI.UINT32_T,
        np.dtype(np.uint64): MPI.UINT64_T,
        np.dtype(np.bool_): MPI.C_BOOL,
        np.dtype(np.complex64): MPI.C_FLOAT_COMPLEX,
        np.dtype(np.complex128): MPI.C_DOUBLE_COMPLEX,
    }
    return table


#: the 16-bit float types MPI cannot name: moved as 16-bit words, reduced by our own operations
HALF_TYPES = (np.dtype(np.float16), np.dtype(_dt.bfloat16))

_HALF_COMBINE = {
    ReduceOp.SUM: np.add,
    ReduceOp.MAX: np.maximum,
    ReduceOp.MIN: np.minimum,
    ReduceOp.PRODUCT: np.multiply,
}


#: the dtypes collectives take, by name
SUPPORTED_DTYPES = (
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
)


#: how collectives progress: "inline" (on the threads that launch and wait for them) or "thread"
#: (a communication thread); OPSNN_DDP_PROGRESS chooses, else "inline" when kernels use one thread
PROGRESS_MODES = ("inline", "thread")


def progress_mode() -> str:
    """``OPSNN_DDP_PROGRESS`` if set, else "inline" for a rank whose kernels run on one thread (the
    launcher's ``--threads-per-rank 1``, or a single core), "thread" otherwise."""
    mode = os.environ.get("OPSNN_DDP_PROGRESS", "").strip().lower()
    if mode:
        if mode not in PROGRESS_MODES:
            from ..errors import ParamInvalidError

            raise ParamInvalidError(
                f"init_process_group: OPSNN_DDP_PROGRESS must be one of {', '.join(PROGRESS_MODES)}, got {mode!r}",
                op="init_process_group",
            )
        return mode
    from ..runtime import threads

    return "inline" if threads.policy.fixed == 1 or threads.cores() == 1 else "thread"


class ProcessGroupMPI:
    """Every rank of ``MPI_COMM_WORLD``; collectives run on a communicator of its own (a duplicate of
    the world's, so a program's own MPI calls never mix with ours), started and advanced by the
    engine :func:`progress_mode` picks (:mod:`.work`)."""

    name = "mpi"

    def __init__(self, timeout_s: float):
        MPI = self.MPI = load_mpi()
        level = MPI.Query_thread()
        if level < MPI.THREAD_SERIALIZED:
            raise DistributedError(
                f"init_process_group: MPI was initialised with thread level {level}; opsnn's communication thread "
                f"needs MPI_THREAD_SERIALIZED ({MPI.THREAD_SERIALIZED}) or MPI_THREAD_MULTIPLE "
                f"({MPI.THREAD_MULTIPLE}) (set mpi4py.rc.thread_level = 'multiple' before importing mpi4py.MPI)",
                op="init_process_group",
            )
        self.thread_level = level
        world = MPI.COMM_WORLD
        self.rank = world.Get_rank()
        self.size = world.Get_size()
        self.timeout_s = timeout_s
        self._types = _mpi_types(MPI)
        self._half_ops: dict = {}
        self._track = 1 < self.size <= TRACK_RANKS_UP_TO
        self._peer_seq = [0] * self.size
        self._arrival_sends: list = []
        self._arrivals = self.comm = self.thread = None
        self.progress_mode = progress_mode()

    def connect(self) -> None:
        """Meet every other rank (within the timeout) and start the engine that runs the collectives."""
        MPI = self.MPI
        world = MPI.COMM_WORLD
        self.comm = self._duplicate(world)
        if self._track:
            self._arrivals = self._duplicate(world)
        # made here, on the thread that initialised MPI: under MPI_THREAD_SERIALIZED only the
        # communication thread may call MPI once it runs
        self._half_ops = {
            (dtype, op): MPI.Op.Create(_half_combine(dtype, fn), commute=True)
            for dtype in HALF_TYPES
            for op, fn in _HALF_COMBINE.items()
        }
        engine = InlineProgress if self.progress_mode == "inline" else CommThread
        self.thread = engine(
            f"opsnn-comm-rank{self.rank}",
            self.timeout_s,
            poll=lambda request: request.Test(),
            on_timeout=self._timeout_error,
            on_start=self._announce if self._track else None,
        )

    def _duplicate(self, world):
        """A duplicate of ``world``: every rank takes part, so a rank that never comes times it out."""
        comm, request = world.Idup()
        deadline = time.monotonic() + self.timeout_s
        while not request.Test():
            if time.monotonic() > deadline:
                raise CollectiveTimeoutError(
                    f"init_process_group did not complete within {self.timeout_s:g} s on rank {self.rank} of "
                    f"{self.size}: some rank never called it (it raised, hung, or runs other code first)",
                    op="init_process_group",
                )
            time.sleep(0.001)
        return comm

    # -- buffers and reductions --------------------------------------------------------------
    def check_dtype(self, dtype: np.dtype, op: str) -> None:
        if dtype not in self._types and dtype not in HALF_TYPES:
            raise DTypeError(
                f"{op}: dtype {_dt.name(dtype)} cannot travel through MPI; expected one of {', '.join(SUPPORTED_DTYPES)}",
                op=op,
            )

    def _spec(self, buf: np.ndarray) -> list:
        flat = buf.reshape(-1)
        if buf.dtype in HALF_TYPES:
            return [flat.view(np.uint16), self.MPI.UINT16_T]
        return [flat, self._types[buf.dtype]]

    def reduction(self, dtype: np.dtype, op: ReduceOp, what: str):
        """The MPI operation for ``op`` over ``dtype`` (AVG reduces with SUM; the caller divides)."""
        MPI = self.MPI
        kind = dtype.kind
        base = ReduceOp.SUM if op is ReduceOp.AVG else op
        if op is ReduceOp.AVG and kind not in "fc" and dtype not in HALF_TYPES:
            raise DTypeError(
                f"{what}: ReduceOp.AVG needs a floating-point tensor, got {_dt.name(dtype)} (use SUM and divide)",
                op=what,
            )
        if dtype in HALF_TYPES:
            if base not in _HALF_COMBINE:
                raise DTypeError(f"{what}: {base!r} is not defined for {_dt.name(dtype)}", op=what)
            return self._half_ops[(dtype, base)]
        if kind == "b":
            table = {
                ReduceOp.SUM: MPI.LOR,
                ReduceOp.MAX: MPI.LOR,
                ReduceOp.BOR: MPI.LOR,
                ReduceOp.MIN: MPI.LAND,
                ReduceOp.PRODUCT: MPI.LAND,
                ReduceOp.BAND: MPI.LAND,
                ReduceOp.BXOR: MPI.LXOR,
            }
        else:
            table = {ReduceOp.SUM: MPI.SUM, ReduceOp.PRODUCT: MPI.PROD}
            if kind != "c":
                table.update({ReduceOp.MAX: MPI.MAX, ReduceOp.MIN: MPI.MIN})
            if kind in "iu":
                table.update({ReduceOp.BAND: MPI.BAND, ReduceOp.BOR: MPI.BOR, ReduceOp.BXOR: MPI.BXOR})
        if base not in table:
            raise DTypeError(f"{what}: {op!r} is not defined for {_dt.name(dtype)} tensors", op=what)
        return table[base]

    def divide_by_size(self, buf: np.ndarray) -> None:
        if buf.dtype in HALF_TYPES:
            buf[...] = (buf.astype(np.float32) / np.float32(self.size)).astype(buf.dtype)
        else:
            np.divide(buf, self.size, out=buf)

    # -- collectives: contiguous arrays, launched in order on the engine -----------------------
    def all_reduce(self, buf: np.ndarray, op: ReduceOp, after=None, staged: bool = False) -> Work:
        mpi_op = self.reduction(buf.dtype, op, "all_reduce")
        spec = self._spec(buf)
        IN_PLACE = self.MPI.IN_PLACE

        def finish():
            if op is ReduceOp.AVG:
                self.divide_by_size(buf)
            if after is not None:
                after()

        start = lambda: self.comm.Iallreduce(IN_PLACE, spec, mpi_op)
        return self.thread.submit(Work("all_reduce", f"{op.name} of {_describe(buf)}", start, finish, staged))

    def broadcast(self, buf: np.ndarray, src: int, after=None, staged: bool = False) -> Work:
        spec = self._spec(buf)
        start = lambda: self.comm.Ibcast(spec, root=src)
        return self.thread.submit(Work("broadcast", f"{_describe(buf)} from rank {src}", start, after, staged))

    def all_gather(self, out: np.ndarray, inp: np.ndarray, after=None, staged: bool = False) -> Work:
        send, recv = self._spec(inp), self._spec(out)
        start = lambda: self.comm.Iallgather(send, recv)
        return self.thread.submit(Work("all_gather", f"{_describe(inp)} per rank", start, after, staged))

    def reduce_scatter(self, out: np.ndarray, inp: np.ndarray, op: ReduceOp, after=None, staged: bool = False) -> Work:
        mpi_op = self.reduction(inp.dtype, op, "reduce_scatter")
        send, recv = self._spec(inp), self._spec(out)

        def finish():
            if op is ReduceOp.AVG:
                self.divide_by_size(out)
            if after is not None:
                after()

        start = lambda: self.comm.Ireduce_scatter_block(send, recv, mpi_op)
        return self.thread.submit(
            Work("reduce_scatter", f"{op.name} of {_describe(inp)} into {_describe(out)}", start, finish, staged)
        )

    def barrier(self) -> Work:
        return self.thread.submit(Work("barrier", f"{self.size} ranks", self.comm.Ibarrier))

    def progress(self) -> None:
        """Advance the collectives in flight (inline progress; a no-op with a communication thread)."""
        self.thread.progress()

    # -- which ranks reached which collective -----------------------------------------------------
    def _announce(self, work: Work) -> None:
        """Tell every peer this rank reached collective ``work.seq`` (runs where the collective starts)."""
        MPI = self.MPI
        self._arrival_sends = [(r, b) for r, b in self._arrival_sends if not r.Test()]
        note = np.array([work.seq], np.int64)
        for peer in range(self.size):
            if peer != self.rank:
                request = self._arrivals.Isend([note, MPI.INT64_T], dest=peer, tag=_ARRIVAL_TAG)
                self._arrival_sends.append((request, note))
        self._read_arrivals()

    def _read_arrivals(self) -> None:
        MPI = self.MPI
        status = MPI.Status()
        note = np.empty(1, np.int64)
        while self._arrivals.Iprobe(MPI.ANY_SOURCE, _ARRIVAL_TAG, status):
            src = status.Get_source()
            self._arrivals.Recv([note, MPI.INT64_T], source=src, tag=_ARRIVAL_TAG)
            self._peer_seq[src] = max(self._peer_seq[src], int(note[0]))

    def _timeout_error(self, work: Work) -> CollectiveTimeoutError:
        if self._track:
            self._read_arrivals()
            missing = [r for r in range(self.size) if r != self.rank and self._peer_seq[r] < work.seq]
            if missing:
                where = ", ".join(f"rank {r} at #{self._peer_seq[r]}" for r in missing)
                who = f"{_ranks(missing)} never reached it ({where}: raised, hung, or skipped this collective)"
            else:
                who = (
                    "every rank reached it, so the ranks disagree on what it is (another op, count or dtype "
                    "on some rank)"
                )
        else:
            who = f"which ranks were missing is not tracked in a world of {self.size} ranks"
        return CollectiveTimeoutError(
            f"{work.op} #{work.seq} ({work.describe}) did not finish within {self.timeout_s:g} s on rank "
            f"{self.rank} of {self.size}: {who}; the process group is unusable from here "
            f"(the limit: init_process_group(timeout=...) or OPSNN_DDP_TIMEOUT)",
            op=work.op,
        )

    @property
    def broken(self) -> BaseException | None:
        """The failure (a timeout, an MPI error) after which this group runs no more collectives."""
        return self.thread.broken if self.thread is not None else None

    # -- teardown --------------------------------------------------------------------------------
    def close(self) -> None:
        """Finish the queued collectives, end the engine (join its thread), free the communicators."""
        if self.thread is None:
            return  # never connected
        self.thread.close()
        if self.thread.broken is not None:
            return  # a collective may still hold the communicators: leave them to MPI_Finalize / Abort
        if self._track:
            self._read_arrivals()
            for request, _ in self._arrival_sends:
                request.Wait()
            self._arrivals.Free()
        for mpi_op in self._half_ops.values():
            mpi_op.Free()
        self._half_ops.clear()
        self.comm.Free()

    def abort(self, code: int = 1) -> None:
        self.MPI.COMM_WORLD.Abort(code)


def _half_combine(dtype: np.dtype, fn):
    def combine(inbuf, inoutbuf, datatype):
        a = np.frombuffer(inbuf, dtype)
        b = np.frombuffer(inoutbuf, dtype)
        b[...] = fn(a.astype(np.float32), b.astype(np.float32)).astype(dtype)

    return combine


def _describe(buf: np.ndarray) -> str:
    return f"{_dt.name(buf.dtype)}[{', '.join(map(str, buf.shape))}]"


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
