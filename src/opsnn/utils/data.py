"""torch.utils.data's loading classes: ``Dataset``, ``TensorDataset``, ``Subset``, ``random_split``,
the samplers (``SequentialSampler``, ``RandomSampler``, ``BatchSampler``, ``DistributedSampler``) and
``DataLoader`` with torch's default collation into opsnn tensors.

``DistributedSampler``: each rank's share of a dataset's indices, as torch.utils.data's.

Every rank draws the same permutation (seeded by ``seed + epoch``), pads it by wrapping around
to a multiple of the world size (or drops the tail with ``drop_last``), and keeps every
``num_replicas``-th index from its rank on, so the shards are disjoint and of one length. The
permutation is torch's own (``torch.randperm`` with a generator seeded ``seed + epoch``: a
Fisher-Yates shuffle driven by MT19937), so a job moved from torch sees its samples in the same
order::

    >>> from opsnn.utils.data import DistributedSampler
    >>> s = DistributedSampler(10, num_replicas=3, rank=1, shuffle=False)
    >>> list(s)
    [1, 4, 7, 0]
    >>> s.set_epoch(1)                      # reshuffles (when shuffle=True), identically on every rank
"""

from __future__ import annotations

import math
import numbers
import operator
import queue
import threading

import numpy as np

from ..errors import OpsnnRuntimeError, ParamInvalidError

#: below this many samples torch's randperm draws 32-bit numbers (its order is matched and tested
#: there); from it on, 64-bit numbers made of two 32-bit draws (not checked against torch)
_RANDPERM_32BIT_BELOW = (2**32 - 1) // 20


def torch_randperm(n: int, seed: int) -> list[int]:
    """``torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()``, without torch."""
    state = np.random.RandomState(seed & 0xFFFFFFFF).get_state()  # MT19937 seeded as torch seeds it
    bits = np.random.MT19937()
    bits.state = {"bit_generator": "MT19937", "state": {"key": state[1], "pos": state[2]}}
    perm = list(range(n))
    if n < 2:
        return perm
    if n < _RANDPERM_32BIT_BELOW:
        draws = bits.random_raw(n - 1).tolist()
    else:
        raw = bits.random_raw(2 * (n - 1)).astype(np.uint64)
        draws = ((raw[0::2] << np.uint64(32)) | raw[1::2]).tolist()
    for i, d in enumerate(draws):
        j = d % (n - i) + i
        perm[i], perm[j] = perm[j], perm[i]
    return perm


class DistributedSampler:
    """This rank's indices of a dataset (or of ``range(dataset)`` for an int) for one epoch.

    ``num_replicas`` / ``rank`` default to the process group's (``opsnn.distributed``);
    ``shuffle`` draws a new permutation per epoch (``set_epoch``) from ``seed``; without
    ``drop_last`` the indices wrap around so every rank gets ``ceil(len / num_replicas)``,
    with it the tail that does not split evenly is dropped."""

    def __init__(
        self,
        dataset,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ):
        if num_replicas is None or rank is None:
            from .. import distributed as dist

            num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
            rank = dist.get_rank() if rank is None else rank
        self.num_replicas = _int(num_replicas, "num_replicas")
        self.rank = _int(rank, "rank")
        if self.num_replicas < 1 or not 0 <= self.rank < self.num_replicas:
            raise ParamInvalidError(
                f"DistributedSampler: rank must be in [0, num_replicas) with num_replicas >= 1, "
                f"got rank {self.rank} of {self.num_replicas}",
                op="DistributedSampler",
            )
        self.dataset = dataset
        self.length = _int(dataset, "dataset") if isinstance(dataset, (int, np.integer)) else len(dataset)
        if self.length < 0:
            raise ParamInvalidError(f"DistributedSampler: a dataset length must be >= 0, got {self.length}")
        self.shuffle = bool(shuffle)
        self.seed = _int(seed, "seed")
        self.drop_last = bool(drop_last)
        self.epoch = 0
        if self.drop_last and self.length % self.num_replicas:
            self.num_samples = math.ceil((self.length - self.num_replicas) / self.num_replicas)
        else:
            self.num_samples = math.ceil(self.length / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s permutation from now on (call it with the same epoch on every rank)."""
        self.epoch = _int(epoch, "epoch")

    def indices(self) -> list[int]:
        """This rank's indices for the current epoch."""
        order = torch_randperm(self.length, self.seed + self.epoch) if self.shuffle else list(range(self.length))
        if self.drop_last:
            order = order[: self.total_size]
        elif self.total_size > len(order) and order:
            padding = self.total_size - len(order)
            order += (order * math.ceil(padding / len(order)))[:padding]
        return order[self.rank : self.total_size : self.num_replicas]

    def __iter__(self):
        return iter(self.indices())

    def __len__(self) -> int:
        return self.num_samples


def _int(value, what: str) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise ParamInvalidError(
            f"DistributedSampler: {what} must be an int, got {type(value).__name__}", op="DistributedSampler"
        ) from None


# -- datasets ---------------------------------------------------------------------------------------------------
class Dataset:
    """A map-style dataset: ``__getitem__(index)`` and ``__len__`` (subclass it as in torch)."""

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must define __len__")


class TensorDataset(Dataset):
    """Samples are the ``index``-th rows of tensors (or arrays) of one first dimension."""

    def __init__(self, *tensors):
        if not tensors:
            raise ParamInvalidError("TensorDataset: give at least one tensor")
        sizes = {len(t) for t in tensors}
        if len(sizes) != 1:
            raise ParamInvalidError(
                f"TensorDataset: the tensors must have one first dimension, got {[len(t) for t in tensors]}"
            )
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self) -> int:
        return len(self.tensors[0])


class Subset(Dataset):
    """The samples of ``dataset`` at ``indices``."""

    def __init__(self, dataset, indices):
        self.dataset, self.indices = dataset, [operator.index(i) for i in indices]

    def __getitem__(self, index):
        return self.dataset[self.indices[index]]

    def __len__(self) -> int:
        return len(self.indices)


def _rng(generator):
    """A numpy generator: ``generator`` itself, one seeded by an int, or a draw from opsnn's
    (``opsnn.manual_seed``) so one seed makes a run repeatable."""
    if isinstance(generator, np.random.Generator):
        return generator
    if generator is None:
        from ..nn import init

        return np.random.default_rng(int(init.generator().integers(2**62)))
    if isinstance(generator, numbers.Integral) and not isinstance(generator, bool):
        return np.random.default_rng(int(generator))
    raise ParamInvalidError(f"generator must be a numpy Generator, an int seed or None, got {type(generator).__name__}")


def random_split(dataset, lengths, generator=None) -> list:
    """``dataset`` split at random into Subsets of ``lengths`` (ints summing to its length, or fractions
    summing to 1, the remainder given out one by one from the first, as torch does)."""
    n = len(dataset)
    lengths = list(lengths)
    if lengths and all(isinstance(v, float) for v in lengths) and math.isclose(sum(lengths), 1.0):
        counts = [int(math.floor(n * f)) for f in lengths]
        for i in range(n - sum(counts)):
            counts[i % len(counts)] += 1
        lengths = counts
    if any(isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0 for v in lengths) or sum(lengths) != n:
        raise ParamInvalidError(
            f"random_split: lengths must be non-negative ints summing to the dataset's length {n} "
            f"(or fractions summing to 1), got {lengths}"
        )
    order = _rng(generator).permutation(n).tolist()
    out, start = [], 0
    for k in lengths:
        out.append(Subset(dataset, order[start : start + k]))
        start += k
    return out


# -- samplers ---------------------------------------------------------------------------------------------------
class SequentialSampler:
    def __init__(self, data_source):
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler:
    """A new random order of the indices at every iteration (with ``replacement``: ``num_samples``
    independent draws), from ``generator`` (a numpy Generator or an int seed) or opsnn's."""

    def __init__(self, data_source, replacement: bool = False, num_samples: int | None = None, generator=None):
        self.data_source, self.replacement = data_source, bool(replacement)
        self._num_samples = num_samples
        if num_samples is not None and (not isinstance(num_samples, numbers.Integral) or num_samples <= 0):
            raise ParamInvalidError(f"RandomSampler: num_samples must be a positive int, got {num_samples!r}")
        self.generator = generator if generator is None else _rng(generator)

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else int(self._num_samples)

    def __iter__(self):
        rng = _rng(self.generator)
        n = len(self.data_source)
        if self.replacement:
            return iter(rng.integers(0, n, self.num_samples).tolist())
        rounds = [rng.permutation(n) for _ in range(-(-self.num_samples // n) if n else 0)]
        return iter(np.concatenate(rounds)[: self.num_samples].tolist() if rounds else [])

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler:
    """Lists of ``batch_size`` indices from ``sampler`` (the last one shorter unless ``drop_last``)."""

    def __init__(self, sampler, batch_size: int, drop_last: bool):
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
            raise ParamInvalidError(f"BatchSampler: batch_size must be a positive int, got {batch_size!r}")
        self.sampler, self.batch_size, self.drop_last = sampler, int(batch_size), bool(drop_last)

    def __iter__(self):
        batch = []
        for i in self.sampler:
            batch.append(i)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


# -- loading ----------------------------------------------------------------------------------------------------
def default_collate(batch):
    """torch's default collation into opsnn tensors: tensors and arrays stacked along a new first dim,
    Python ints as int64, floats as float64, bools as bool; tuples, lists and dicts collated field by field;
    strings kept as a list."""
    from ..tensor import Tensor, tensor

    first = batch[0]
    if isinstance(first, Tensor):
        return tensor(np.stack([b.numpy() for b in batch]))
    if isinstance(first, (np.ndarray, np.generic)):
        return tensor(np.stack([np.asarray(b) for b in batch]))
    if isinstance(first, bool):
        return tensor(np.asarray(batch, np.bool_))
    if isinstance(first, numbers.Integral):
        return tensor(np.asarray(batch, np.int64))
    if isinstance(first, numbers.Real):
        return tensor(np.asarray(batch, np.float64))
    if isinstance(first, (str, bytes)):
        return list(batch)
    if isinstance(first, dict):
        return {k: default_collate([b[k] for b in batch]) for k in first}
    if isinstance(first, (tuple, list)):
        if any(len(b) != len(first) for b in batch):
            raise ParamInvalidError("default_collate: the samples of a batch have different numbers of fields")
        fields = [default_collate(list(f)) for f in zip(*batch)]
        return tuple(fields) if isinstance(first, tuple) else fields
    raise ParamInvalidError(f"default_collate: cannot collate samples of type {type(first).__name__}")


_DONE = object()


class DataLoaderTimeoutError(OpsnnRuntimeError, TimeoutError):
    """No batch arrived within the DataLoader's ``timeout``."""


class DataLoader:
    """Batches of ``dataset`` as torch's DataLoader gives them: ``batch_size`` samples from ``sampler``
    (sequential, or ``shuffle``: a new random order per epoch from ``generator`` or opsnn's generator)
    collated by ``collate_fn`` (default: :func:`default_collate` into opsnn tensors), or whole batches
    from ``batch_sampler``; ``batch_size=None`` yields single samples. ``num_workers > 0`` loads up to
    ``prefetch_factor * num_workers`` batches ahead on a background thread while the caller computes
    (one loading thread, which calls ``worker_init_fn(0)`` first: opsnn's kernels release the GIL, and
    no process is forked; ``timeout`` > 0 bounds the wait for a batch, ``persistent_workers`` has no
    effect since the thread lives for one pass); ``pin_memory`` page-locks each batch's tensors."""

    def __init__(
        self,
        dataset,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler=None,
        batch_sampler=None,
        num_workers: int = 0,
        collate_fn=None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn=None,
        generator=None,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
    ):
        if isinstance(num_workers, bool) or not isinstance(num_workers, numbers.Integral) or num_workers < 0:
            raise ParamInvalidError(f"DataLoader: num_workers must be an int >= 0, got {num_workers!r}")
        if sampler is not None and shuffle:
            raise ParamInvalidError(
                "DataLoader: sampler and shuffle=True are exclusive (the sampler orders the samples)"
            )
        if batch_sampler is not None and (batch_size != 1 or shuffle or sampler is not None or drop_last):
            raise ParamInvalidError(
                "DataLoader: batch_sampler gives whole batches: leave batch_size, shuffle, sampler and drop_last alone"
            )
        if prefetch_factor is not None and num_workers == 0:
            raise ParamInvalidError("DataLoader: prefetch_factor applies with num_workers > 0")
        self.dataset, self.num_workers = dataset, int(num_workers)
        self.timeout, self.worker_init_fn = float(timeout), worker_init_fn
        if self.timeout < 0:
            raise ParamInvalidError(f"DataLoader: timeout must be >= 0, got {timeout}")
        self.prefetch_factor = 2 if prefetch_factor is None else int(prefetch_factor)
        self.pin_memory, self.drop_last = bool(pin_memory), bool(drop_last)
        if sampler is None:
            sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        self.sampler = sampler
        self.batch_size = batch_size
        if batch_sampler is None and batch_size is not None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_sampler = batch_sampler
        self.collate_fn = collate_fn if collate_fn is not None else (default_collate if batch_sampler else None)

    def _batches(self):
        if self.batch_sampler is None:  # batch_size=None: samples one by one, as they are
            for i in self.sampler:
                yield self._pinned(self.dataset[i] if self.collate_fn is None else self.collate_fn(self.dataset[i]))
            return
        for indices in self.batch_sampler:
            yield self._pinned(self.collate_fn([self.dataset[i] for i in indices]))

    def _pinned(self, batch):
        if not self.pin_memory:
            return batch
        from ..tensor import Tensor

        if isinstance(batch, Tensor):
            return batch.pin_memory()
        if isinstance(batch, dict):
            return {k: self._pinned(v) for k, v in batch.items()}
        if isinstance(batch, (tuple, list)):
            return type(batch)(self._pinned(v) for v in batch)
        return batch

    def __iter__(self):
        if self.num_workers == 0:
            yield from self._batches()
            return
        q: queue.Queue = queue.Queue(maxsize=max(1, self.prefetch_factor * self.num_workers))
        stop = threading.Event()

        def load():
            try:
                if self.worker_init_fn is not None:
                    self.worker_init_fn(0)
                for batch in self._batches():
                    while not stop.is_set():
                        try:
                            q.put(batch, timeout=0.1)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
                q.put(_DONE)
            except BaseException as e:  # handed to the caller, raised there
                q.put(e)

        worker = threading.Thread(target=load, name="opsnn-dataloader", daemon=True)
        worker.start()
        try:
            while True:
                try:
                    item = q.get(timeout=self.timeout or None)
                except queue.Empty:
                    raise DataLoaderTimeoutError(f"DataLoader: no batch within timeout={self.timeout} s") from None
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:  # the loop ended, broke off or raised: the loading thread stops and is joined
            stop.set()
            while worker.is_alive():
                try:
                    q.get_nowait()
                except queue.Empty:
                    worker.join(0.05)

    def __len__(self) -> int:
        return len(self.batch_sampler) if self.batch_sampler is not None else len(self.sampler)
