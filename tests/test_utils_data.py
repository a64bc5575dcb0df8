"""opsnn.utils.data.DistributedSampler against torch.utils.data.DistributedSampler (the oracle),
index for index, and the properties data-parallel training relies on."""

from __future__ import annotations

import itertools

import pytest

from opsnn.errors import DistributedError, ParamInvalidError
from opsnn.utils.data import DistributedSampler, torch_randperm

LENGTHS = [0, 1, 2, 7, 10, 11, 64, 101]
REPLICAS = [1, 2, 3, 4]


@pytest.mark.parametrize("shuffle,drop_last", list(itertools.product([True, False], repeat=2)))
def test_indices_match_torch(shuffle, drop_last):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DistributedSampler as TorchSampler

    for length, replicas, seed in itertools.product(LENGTHS, REPLICAS, [0, 42]):
        dataset = list(range(length))
        for rank in range(replicas):
            ours = DistributedSampler(dataset, replicas, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
            theirs = TorchSampler(dataset, replicas, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
            for epoch in (0, 1, 5):
                ours.set_epoch(epoch)
                theirs.set_epoch(epoch)
                case = (length, replicas, rank, seed, epoch)
                assert list(ours) == list(theirs), case
                assert len(ours) == len(theirs), case
    assert torch.__version__


def test_randperm_matches_torch_for_large_and_odd_seeds():
    torch = pytest.importorskip("torch")
    for n, seed in [(5000, 7), (3, 2**32 + 5), (100, -1), (1, 3), (0, 0)]:
        g = torch.Generator()
        g.manual_seed(seed)
        assert torch_randperm(n, seed) == torch.randperm(n, generator=g).tolist(), (n, seed)


@pytest.mark.parametrize("length,replicas", [(10, 3), (12, 4), (5, 8), (101, 2)])
def test_shards_are_disjoint_even_and_cover_the_dataset(length, replicas):
    for drop_last in (False, True):
        shards = [list(DistributedSampler(length, replicas, r, seed=3, drop_last=drop_last)) for r in range(replicas)]
        sizes = {len(s) for s in shards}
        assert len(sizes) == 1  # every rank runs the same number of steps
        flat = [i for s in shards for i in s]
        if drop_last:
            assert len(set(flat)) == len(flat) == (length // replicas) * replicas  # disjoint, the tail dropped
        else:
            assert set(flat) == set(range(length))  # every sample, the padding wraps around
            assert len(flat) - len(set(flat)) == (-length) % replicas
        assert all(0 <= i < length for i in flat)


def test_set_epoch_reshuffles_the_same_way_on_every_rank():
    a = [DistributedSampler(50, 2, r, seed=1) for r in range(2)]
    first = [list(s) for s in a]
    for s in a:
        s.set_epoch(1)
    second = [list(s) for s in a]
    assert first != second
    assert sorted(first[0] + first[1]) == sorted(second[0] + second[1]) == list(range(50))
    again = DistributedSampler(50, 2, 1, seed=1)
    again.set_epoch(1)
    assert list(again) == second[1]  # a fresh sampler on the same epoch draws the same order


def test_bad_arguments_are_typed():
    with pytest.raises(ParamInvalidError, match="rank must be in"):
        DistributedSampler(10, num_replicas=2, rank=2)
    with pytest.raises(ParamInvalidError, match="num_replicas must be an int"):
        DistributedSampler(10, num_replicas="2", rank=0)
    with pytest.raises(DistributedError, match="init_process_group"):
        DistributedSampler(10)  # the world's size and rank come from a process group, and there is none
