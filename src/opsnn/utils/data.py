"""``DistributedSampler``: each rank's share of a dataset's indices, as torch.utils.data's.

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
import operator

import numpy as np

from ..errors import ParamInvalidError

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
