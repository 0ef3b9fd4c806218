"""Theory tests run many small tensor ops: one torch thread avoids spin-waiting on a shared
2-core machine (the suite-wide conftest does this only under pytest-xdist)."""

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
