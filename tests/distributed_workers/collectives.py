"""Every collective on 2 ranks against a numpy oracle; each rank rebuilds every rank's inputs from seeds.

Run by tests/test_distributed.py through ``opsnn launch -n 2``; prints ``ALL OK rank R`` at the end
(an assertion that fails raises, and the exception hook aborts the job).
Tolerances: none. With 2 ranks each element of a reduction is one operation on two values, so the
result is the float64 result rounded once to the dtype (float16/bfloat16 are combined in float32,
which rounds that pair correctly), and AVG halves exactly.
"""

import os
import sys
import threading
import time
from datetime import timedelta

import ml_dtypes
import numpy as np

import opsnn
import opsnn.distributed as dist
from opsnn.distributed import ReduceOp
from opsnn.errors import CollectiveTimeoutError, DistributedError, DTypeError, ParamInvalidError

dist.init_process_group("mpi", timeout=120)
rank, size = dist.get_rank(), dist.get_world_size()
assert size == 2, size
print(f"OPSNN_NUM_THREADS={os.environ.get('OPSNN_NUM_THREADS')}")
# one kernel thread per rank: collectives progress inline unless OPSNN_DDP_PROGRESS asks for the thread
MODE = os.environ.get("OPSNN_DDP_PROGRESS") or "inline"
assert dist.group.default_group().progress_mode == MODE, (dist.group.default_group().progress_mode, MODE)
assert any(t.name.startswith("opsnn-comm") for t in threading.enumerate()) == (MODE == "thread")
print(f"progress {MODE}")

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(d) for d in ("float32", "float64", "float16", "int32", "int64", "bool")] + [BF16]
FLOAT_OPS = [ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PRODUCT]


def data(r: int, dtype: np.dtype, shape, case: int) -> np.ndarray:
    """Rank ``r``'s input for a case: small integers for int/bool dtypes, signed floats otherwise."""
    rng = np.random.default_rng([r, case])
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(-9, 10, shape).astype(dtype)
    return rng.uniform(-4, 4, shape).astype(dtype)


def oracle(op: ReduceOp, dtype: np.dtype, shape, case: int) -> np.ndarray:
    if dtype == np.bool_:
        parts = [data(r, dtype, shape, case) for r in range(size)]
        fn = {ReduceOp.SUM: np.logical_or, ReduceOp.MAX: np.logical_or}.get(op, np.logical_and)
        return fn.reduce(parts)
    parts = [data(r, dtype, shape, case).astype(np.float64 if dtype.kind != "i" else np.int64) for r in range(size)]
    fn = {
        ReduceOp.SUM: np.add,
        ReduceOp.AVG: np.add,
        ReduceOp.MAX: np.maximum,
        ReduceOp.MIN: np.minimum,
        ReduceOp.PRODUCT: np.multiply,
        ReduceOp.BAND: np.bitwise_and,
        ReduceOp.BOR: np.bitwise_or,
        ReduceOp.BXOR: np.bitwise_xor,
    }[op]
    out = fn.reduce(parts)
    if op is ReduceOp.AVG:
        out = out / size
    return out.astype(dtype)


def same(got, want, what: str) -> None:
    got = np.asarray(got)
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, got.shape, want.dtype, want.shape)
    assert np.array_equal(got.view(np.uint8) if got.dtype == np.bool_ else got, want), (what, got, want)


case = 0
# -- all_reduce: every dtype x op, contiguous (zero-copy) and non-contiguous (staged) ----------------
for dtype in DTYPES:
    ops = list(FLOAT_OPS)
    if dtype.kind in "ib":
        ops.remove(ReduceOp.AVG)
        ops += [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR] if dtype.kind == "i" else []
    for op in ops:
        case += 1
        t = opsnn.tensor(data(rank, dtype, (5, 7), case))
        w = dist.all_reduce(t, op=op, async_op=True)
        assert not w._staged, "a contiguous tensor went through a temporary"
        w.wait()
        same(t.numpy(), oracle(op, dtype, (5, 7), case), f"all_reduce {op} {dtype}")
        # a transposed view of the second half of a bigger tensor: staged, written back, the rest untouched
        case += 1
        base = data(rank, dtype, (6, 8), 10_000 + case)
        big = opsnn.tensor(base)
        view = big[:, 4:].transpose(0, 1)
        assert not view.is_contiguous()
        expect = oracle(op, dtype, (6, 8), 10_000 + case)[:, 4:].T
        w = dist.all_reduce(view, op=op, async_op=True)
        assert w._staged
        w.wait()
        same(view.numpy(), expect, f"all_reduce non-contiguous {op} {dtype}")
        same(big.numpy()[:, :4], base[:, :4], "all_reduce left the rest of the tensor alone")
    if dtype.kind in "ib":
        try:
            dist.all_reduce(opsnn.tensor(data(rank, dtype, (2,), 0)), op=ReduceOp.AVG)
        except DTypeError as exc:
            assert "AVG" in str(exc), str(exc)
        else:
            raise AssertionError(f"AVG of {dtype} was accepted")
print("all_reduce ok")

# -- empty tensors through each collective ----------------------------------------------------------
for dtype in (np.dtype(np.float32), BF16, np.dtype(np.int64)):
    e = opsnn.empty((0, 3), dtype)
    dist.all_reduce(e)
    dist.broadcast(e, src=1)
    out = opsnn.empty((0, 3), dtype)
    dist.all_gather_into_tensor(out, e)
    dist.reduce_scatter_tensor(opsnn.empty((0, 3), dtype), opsnn.empty((0, 3), dtype))
    outs = [opsnn.empty((0, 3), dtype) for _ in range(size)]
    dist.all_gather(outs, e)
    assert all(o.shape == (0, 3) for o in outs)
print("empty ok")

# -- broadcast from each root, contiguous and not -----------------------------------------------------
for dtype in DTYPES:
    for src in range(size):
        case += 1
        t = opsnn.tensor(data(rank, dtype, (4, 6), case))
        dist.broadcast(t, src=src)
        same(t.numpy(), data(src, dtype, (4, 6), case), f"broadcast {dtype} from {src}")
        case += 1
        big = opsnn.tensor(data(rank, dtype, (4, 6), case))
        dist.broadcast(big[:, ::2], src=src)
        same(big.numpy()[:, ::2], data(src, dtype, (4, 6), case)[:, ::2], f"broadcast non-contiguous {dtype}")
        same(big.numpy()[:, 1::2], data(rank, dtype, (4, 6), case)[:, 1::2], "broadcast left the rest alone")
print("broadcast ok")

# -- all_gather / all_gather_into_tensor --------------------------------------------------------------
for dtype in DTYPES:
    case += 1
    parts = [data(r, dtype, (3, 4), case) for r in range(size)]
    mine = opsnn.tensor(parts[rank])
    outs = [opsnn.zeros((3, 4), dtype) for _ in range(size)]
    dist.all_gather(outs, mine.transpose(0, 1).transpose(0, 1))
    for r in range(size):
        same(outs[r].numpy(), parts[r], f"all_gather {dtype} part {r}")
    stacked = opsnn.zeros((size, 3, 4), dtype)
    dist.all_gather_into_tensor(stacked, mine)
    same(stacked.numpy(), np.stack(parts), f"all_gather_into_tensor stacked {dtype}")
    concat = opsnn.zeros((4, size * 3), dtype)  # written through a transposed (non-contiguous) view
    dist.all_gather_into_tensor(concat.transpose(0, 1), mine)
    same(concat.numpy().T, np.concatenate(parts), f"all_gather_into_tensor concatenated {dtype}")
print("all_gather ok")

# -- reduce_scatter / reduce_scatter_tensor -----------------------------------------------------------
for dtype in DTYPES:
    for op in (ReduceOp.SUM, ReduceOp.MAX) + ((ReduceOp.AVG,) if dtype.kind in "fV" or dtype == BF16 else ()):
        case += 1
        whole = oracle(op, dtype, (size * 2, 5), case)
        mine = data(rank, dtype, (size * 2, 5), case)
        out = opsnn.zeros((2, 5), dtype)
        dist.reduce_scatter(out, [opsnn.tensor(mine[2 * r : 2 * r + 2]) for r in range(size)], op=op)
        same(out.numpy(), whole[2 * rank : 2 * rank + 2], f"reduce_scatter {op} {dtype}")
        out2 = opsnn.zeros((5, 2), dtype)
        dist.reduce_scatter_tensor(out2.transpose(0, 1), opsnn.tensor(mine), op=op)
        same(out2.numpy().T, whole[2 * rank : 2 * rank + 2], f"reduce_scatter_tensor {op} {dtype}")
print("reduce_scatter ok")


# -- async: the collective progresses while this thread computes (on the communication thread, or inline
# each time is_completed() asks) ----------------------------------------------------------------------------
# rank 1 joins only once rank 0 says so through a file (not a collective: those queue behind this one)
def tell(name: str) -> None:
    open(os.path.join(sys.argv[1], name), "w").close()


def heard(name: str) -> None:
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(sys.argv[1], name)):
        assert time.monotonic() < deadline, f"rank 0 never wrote {name}"
        time.sleep(0.01)


def compute(a):
    return np.tanh(a @ a.T / 128)


n = 1 << 20
x = opsnn.tensor(np.full(n, rank + 1, np.float32))
a = np.random.default_rng(0).standard_normal((128, 128))
if rank == 1:
    heard("computed")
w = dist.all_reduce(x, async_op=True)
chunks = 0
if rank == 0:
    a = compute(a)
    assert not w.is_completed(), "the collective finished before its peer joined"  # in flight during compute
    tell("computed")
deadline = time.monotonic() + 120
while not w.is_completed():  # never wait(): the thread, or is_completed() itself, must finish it
    a = compute(a)
    chunks += 1
    assert time.monotonic() < deadline, "the collective made no progress without wait()"
w.wait()
assert np.all(x.numpy() == 3.0)
print(f"overlap ok ({chunks} more compute chunks while in flight)")

# -- Work.wait(timeout) bounds that wait only: the collective goes on and completes -----------------------
if rank == 1:
    heard("waited")
w = dist.all_reduce(x, async_op=True)
if rank == 0:
    try:
        w.wait(timeout=0.01)
    except CollectiveTimeoutError as exc:
        assert "all_reduce" in str(exc) and "wait(timeout=0.01 s)" in str(exc), str(exc)
    else:
        raise AssertionError("wait(timeout=0.01) returned before rank 1 joined")
    tell("waited")
w.wait(timeout=timedelta(seconds=60))
assert w.is_success() and np.all(x.numpy() == 6.0)
print("wait(timeout) ok")

# -- order: collectives complete in launch order, and a later sync call waits for the earlier ones ------
case += 1
start = data(rank, np.dtype(np.float64), (64,), case)
y = opsnn.tensor(start)
steps = [("all_reduce", ReduceOp.SUM), ("all_reduce", ReduceOp.MAX), ("broadcast", 1), ("all_reduce", ReduceOp.PRODUCT)]
steps = steps * 3
works = []
for kind, arg in steps:
    if kind == "all_reduce":
        works.append(dist.all_reduce(y, op=arg, async_op=True))
    else:
        works.append(dist.broadcast(y, src=arg, async_op=True))
while not works[-1].is_completed():
    # read the last first: a later one seen done means every earlier one, read after it, is done too
    states = [wk.is_completed() for wk in reversed(works)][::-1]
    assert states == sorted(states, reverse=True), f"completed out of launch order: {states}"
z = opsnn.tensor(np.ones(8, np.float32))
dist.all_reduce(z)  # sync: returns only after every collective launched before it
assert all(wk.is_completed() for wk in works) and np.all(z.numpy() == size)
assert [wk.seq for wk in works] == sorted(wk.seq for wk in works)
vals = [data(r, np.dtype(np.float64), (64,), case) for r in range(size)]  # every rank's y, step by step
for kind, arg in steps:
    if kind == "all_reduce":
        combined = {ReduceOp.SUM: np.add, ReduceOp.MAX: np.maximum, ReduceOp.PRODUCT: np.multiply}[arg].reduce(vals)
    else:
        combined = vals[arg]
    vals = [combined.copy() for _ in range(size)]
same(y.numpy(), vals[rank], "twelve async collectives in launch order")
print("order ok")

# -- argument errors are typed and name the op ---------------------------------------------------------
for call, kind in (
    (lambda: dist.broadcast(opsnn.zeros(3), src=2), ParamInvalidError),
    (lambda: dist.all_gather([opsnn.zeros(3)], opsnn.zeros(3)), ParamInvalidError),
    (lambda: dist.all_reduce(opsnn.zeros(3), op="mean"), ParamInvalidError),
    (lambda: dist.all_reduce(opsnn.zeros(3, "float8_e4m3fn")), DTypeError),
    (lambda: dist.all_reduce(opsnn.zeros(3, "bool"), op=ReduceOp.AVG), DTypeError),
):
    try:
        call()
    except kind as exc:
        assert any(name in str(exc) for name in ("broadcast", "all_gather", "all_reduce")), str(exc)
    else:
        raise AssertionError("accepted a bad argument")
print("errors ok")

# -- a checkpoint written by rank 0 alone, read by every rank once run_on_rank0 returns ---------------
ckpt = os.path.join(sys.argv[1], "ckpt.safetensors")
opsnn.manual_seed(100 + rank)  # the ranks' models differ until they resume from rank 0's file
model = opsnn.nn.Linear(3, 2)
assert dist.run_on_rank0(opsnn.save_checkpoint, ckpt, model, step=7) == (ckpt if rank == 0 else None)
resumed = opsnn.nn.Linear(3, 2)
assert opsnn.load_checkpoint(ckpt, resumed)["step"] == 7
opsnn.manual_seed(100)
rank0_model = opsnn.nn.Linear(3, 2)
for name, value in resumed.state_dict().items():
    same(value.numpy(), rank0_model.state_dict()[name].numpy(), f"resumed {name}")


def fails_on_rank0():
    raise OSError("disk full")


try:
    dist.run_on_rank0(fails_on_rank0)
except OSError as exc:
    assert rank == 0 and "disk full" in str(exc)
except DistributedError as exc:
    assert rank == 1 and "fails_on_rank0 failed on rank 0: OSError: disk full" in str(exc), str(exc)
else:
    raise AssertionError("run_on_rank0 hid rank 0's failure")
print("run_on_rank0 ok")


@dist.rank_zero_only
def announce():
    print("rank_zero_only ran here")
    return rank


assert announce() == (0 if rank == 0 else None) and dist.is_main_process() == (rank == 0)
dist.barrier()
dist.destroy_process_group()
assert not any(t.name.startswith("opsnn-comm") for t in threading.enumerate()), "the communication thread leaked"
assert not dist.is_initialized()
print(f"ALL OK rank {rank}")
