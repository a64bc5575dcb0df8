"""Shared fixtures: a seeded RNG and a check that the pool's live bytes return to baseline."""

import gc
import os

import numpy as np
import pytest

import opsnn
from opsnn.runtime import threads as _threads

# Plans choose serial or parallel kernels by the thread count, which "auto" takes from the
# machine's load: the suite pins the policy's input (a quiet machine), so that no verdict depends
# on what else runs; subprocesses get the same count as a fixed setting. The policy's own tests
# build policies with their own samplers.
_threads.policy.sampler = lambda: 0
os.environ.setdefault("OPSNN_NUM_THREADS", str(_threads.cores()))
# Tiered compilation would pick a library kernel while a numba one compiles in a background
# process, so kernel choices would depend on the cache's state: off here, on in tests/test_tiering.py.
os.environ.setdefault("OPSNN_TIERED", "0")


def pytest_runtest_setup(item):
    # with OPSNN_COMPILE_LOG set, each compile row names the test that paid for it (subprocesses
    # the test starts inherit the name): `bench/suite_compiles.py` sums a cold suite's compiles
    if os.environ.get("OPSNN_COMPILE_LOG"):
        os.environ["OPSNN_COMPILE_CONTEXT"] = item.nodeid


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "isa_portable: a kernel-choice or model-level test that tests/test_cpu_isa.py also runs "
        "under OPSNN_CPU_ISA=avx2 (select them with -m isa_portable)",
    )


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def no_leak():
    """Assert that memory allocated from the pool inside the test is freed by its end."""
    opsnn.init()
    gc.collect()
    opsnn.current_stream().synchronize()
    base = opsnn.memory.current_bytes()
    yield
    for s in opsnn.context().streams():
        try:
            s.synchronize()
        except opsnn.errors.KernelError:
            pass
    gc.collect()
    assert opsnn.memory.current_bytes() == base, "pool live bytes did not return to baseline"


@pytest.fixture
def low_parallel_min(monkeypatch):
    """The parallel thresholds of the row/pointwise kernel families lowered to 32K elements,
    so tests reach the parallel (chunked, split) paths with small arrays; the defaults are
    tuned for speed (~1M elements on the dev VM, where waking a thread costs ~50 us)."""
    from opsnn.kernels.cpu import activation, elementwise, norm, reduction

    for mod in (activation, elementwise, norm, reduction):
        monkeypatch.setattr(mod, "PARALLEL_MIN", 1 << 15)
    monkeypatch.setattr(activation, "PARALLEL_MIN_COSTLY", 1 << 15)


@pytest.fixture
def onednn_off(monkeypatch):
    """oneDNN unavailable for the test (kernels and passes that use it step aside), to test the
    kernels they would otherwise displace."""
    from opsnn.kernels.cpu import onednn

    monkeypatch.setattr(onednn, "_looked", True)
    monkeypatch.setattr(onednn, "_why", "turned off for this test")
