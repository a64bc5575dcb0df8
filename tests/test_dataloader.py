"""opsnn.utils.data's Dataset / TensorDataset / Subset / random_split, the samplers and DataLoader:
batches, collation and dtypes as torch's DataLoader gives them (compared with torch where importable),
shuffling repeatable from opsnn.manual_seed, the background loading thread (order, errors raised in the
caller, no thread left after a break), and typed errors for misuse."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import opsnn
from opsnn.errors import ParamInvalidError
from opsnn.utils.data import (
    BatchSampler,
    DataLoader,
    DataLoaderTimeoutError,
    Dataset,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    Subset,
    TensorDataset,
    default_collate,
    random_split,
)

X = np.arange(20, dtype=np.float32).reshape(10, 2)
Y = np.arange(10, dtype=np.int64)


def _loader_threads():
    return [t for t in threading.enumerate() if t.name == "opsnn-dataloader"]


def test_batches_of_a_tensor_dataset_in_order():
    ds = TensorDataset(opsnn.tensor(X), Y)
    assert len(ds) == 10 and ds[3][1] == 3
    batches = list(DataLoader(ds, batch_size=4))
    assert [len(b[0]) for b in batches] == [4, 4, 2]
    assert isinstance(batches[0][0], opsnn.Tensor) and batches[0][0].dtype == np.float32
    assert batches[0][1].dtype == np.int64
    np.testing.assert_array_equal(np.concatenate([b[0].numpy() for b in batches]), X)
    assert len(DataLoader(ds, batch_size=4)) == 3 and len(DataLoader(ds, batch_size=4, drop_last=True)) == 2
    assert [len(b[1]) for b in DataLoader(ds, batch_size=4, drop_last=True)] == [4, 4]


def test_default_collate_matches_torch():
    pytest.importorskip("torch")
    from torch.utils.data import default_collate as tcollate

    samples = [
        {"x": np.full(3, i, np.float32), "n": i, "f": i / 2, "ok": i % 2 == 0, "name": f"s{i}", "pair": (i, [i, i])}
        for i in range(4)
    ]
    got, want = default_collate(samples), tcollate(samples)
    for k in ("x", "n", "f", "ok"):
        assert got[k].dtype == np.dtype(str(want[k].dtype).replace("torch.", "")), k
        np.testing.assert_array_equal(got[k].numpy(), want[k].numpy())
    assert got["name"] == want["name"]
    np.testing.assert_array_equal(got["pair"][0].numpy(), want["pair"][0].numpy())
    np.testing.assert_array_equal(got["pair"][1][1].numpy(), want["pair"][1][1].numpy())
    with pytest.raises(ParamInvalidError, match="default_collate: cannot collate samples of type object"):
        default_collate([object(), object()])


def test_shuffle_is_a_new_permutation_per_epoch_and_repeatable_from_one_seed():
    ds = TensorDataset(Y)

    def epochs():
        dl = DataLoader(ds, batch_size=3, shuffle=True)
        return [np.concatenate([b[0].numpy() for b in dl]).tolist() for _ in range(2)]

    opsnn.manual_seed(5)
    a = epochs()
    opsnn.manual_seed(5)
    assert epochs() == a
    assert sorted(a[0]) == list(range(10)) and a[0] != a[1]
    g = [np.concatenate([b[0].numpy() for b in DataLoader(ds, batch_size=5, shuffle=True, generator=7)]).tolist()]
    assert g == [
        np.concatenate([b[0].numpy() for b in DataLoader(ds, batch_size=5, shuffle=True, generator=7)]).tolist()
    ]


def test_samplers_subsets_and_random_split():
    assert list(SequentialSampler(range(4))) == [0, 1, 2, 3]
    r = RandomSampler(range(6), replacement=True, num_samples=20, generator=3)
    draws = list(r)
    assert len(draws) == 20 == len(r) and set(draws) <= set(range(6))
    counts = np.bincount(list(RandomSampler(range(5), num_samples=7, generator=1)), minlength=5)
    assert counts.sum() == 7 and counts.min() == 1 and counts.max() == 2  # a whole permutation, then part of one
    assert list(BatchSampler(range(7), 3, drop_last=False)) == [[0, 1, 2], [3, 4, 5], [6]]
    parts = random_split(TensorDataset(Y), [0.7, 0.3], generator=0)
    assert [len(p) for p in parts] == [7, 3]
    assert sorted(int(p[i][0]) for p in parts for i in range(len(p))) == list(range(10))
    sub = Subset(TensorDataset(Y), [9, 2])
    assert [int(sub[i][0]) for i in range(2)] == [9, 2]
    dl = DataLoader(
        TensorDataset(Y), batch_size=2, sampler=DistributedSampler(10, num_replicas=2, rank=1, shuffle=False)
    )
    assert np.concatenate([b[0].numpy() for b in dl]).tolist() == [1, 3, 5, 7, 9]


def test_batch_size_none_yields_samples_and_batch_sampler_gives_batches():
    ds = TensorDataset(Y)
    assert [int(s[0]) for s in DataLoader(ds, batch_size=None)][:3] == [0, 1, 2]
    dl = DataLoader(ds, batch_sampler=[[0, 5], [9]])
    assert [b[0].numpy().tolist() for b in dl] == [[0, 5], [9]]


class _Slow(Dataset):
    def __init__(self, n, fail_at=None):
        self.n, self.fail_at, self.threads = n, fail_at, set()

    def __getitem__(self, i):
        self.threads.add(threading.current_thread().name)
        if i == self.fail_at:
            raise KeyError(f"sample {i} is missing")
        time.sleep(0.002)
        return np.float32(i)

    def __len__(self):
        return self.n


def test_workers_load_on_a_background_thread_in_order_and_stop_after_a_break():
    ds = _Slow(30)
    seen = []
    calls = []
    dl = DataLoader(ds, batch_size=4, num_workers=2, worker_init_fn=calls.append, pin_memory=True)
    for b in dl:
        seen.extend(b.numpy().tolist())
    assert seen == list(range(30)) and calls == [0] and ds.threads == {"opsnn-dataloader"}
    for i, _ in enumerate(DataLoader(_Slow(200), batch_size=2, num_workers=1)):
        if i == 3:
            break
    deadline = time.monotonic() + 5
    while _loader_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _loader_threads()


def test_a_loading_error_is_raised_in_the_caller():
    with pytest.raises(KeyError, match="sample 5 is missing"):
        for _ in DataLoader(_Slow(10, fail_at=5), batch_size=2, num_workers=1):
            pass
    with pytest.raises(KeyError, match="sample 5 is missing"):
        list(DataLoader(_Slow(10, fail_at=5), batch_size=2))


def test_timeout_bounds_the_wait_for_a_batch():
    class Stuck(Dataset):
        def __getitem__(self, i):
            time.sleep(1.0)
            return np.float32(i)

        def __len__(self):
            return 2

    with pytest.raises(DataLoaderTimeoutError, match=r"no batch within timeout=0.05 s"):
        list(DataLoader(Stuck(), batch_size=1, num_workers=1, timeout=0.05))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: DataLoader(TensorDataset(Y), batch_size=0), "batch_size must be a positive int, got 0"),
        (lambda: DataLoader(TensorDataset(Y), num_workers=-1), "num_workers must be an int >= 0"),
        (lambda: DataLoader(TensorDataset(Y), shuffle=True, sampler=[0, 1]), "sampler and shuffle=True are exclusive"),
        (lambda: DataLoader(TensorDataset(Y), batch_size=4, batch_sampler=[[0]]), "batch_sampler gives whole batches"),
        (lambda: DataLoader(TensorDataset(Y), prefetch_factor=4), "prefetch_factor applies with num_workers > 0"),
        (lambda: TensorDataset(X, Y[:3]), r"one first dimension, got \[10, 3\]"),
        (lambda: random_split(TensorDataset(Y), [3, 3]), "lengths must be non-negative ints summing to"),
        (lambda: RandomSampler(range(3), generator="x"), "generator must be a numpy Generator, an int seed or None"),
    ],
)
def test_misuse_is_a_typed_error(make, match):
    with pytest.raises(ParamInvalidError, match=match):
        make()


def test_a_training_loop_over_a_dataloader():
    with opsnn.nn.init.seeded(0):
        model = opsnn.nn.Linear(2, 1)
    opt = opsnn.optim.SGD(model.parameters(), lr=0.01)
    target = (X @ np.array([[0.5], [-0.25]], np.float32)).astype(np.float32)
    dl = DataLoader(TensorDataset(X / 20, target / 20), batch_size=5, shuffle=True, generator=0)
    losses = []
    for _ in range(30):
        for xb, yb in dl:
            opt.zero_grad()
            loss = opsnn.nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            opt.step()
        losses.append(float(loss.item()))
    assert losses[-1] < losses[0]
