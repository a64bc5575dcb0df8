"""The fuzz suite's worker process: one per session, restarted after a crash or a hang."""

import pytest

from opsnn.tools.fuzz import WorkerPool

#: seconds one case may run (kernels compile on first use in a worker: numba's cache may be cold)
CASE_TIMEOUT = 240


@pytest.fixture(scope="session")
def fuzz_pool():
    with WorkerPool(timeout=CASE_TIMEOUT) as pool:
        yield pool
