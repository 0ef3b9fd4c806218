"""Fixtures of the training tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from crl.train import stop as stop_module


@pytest.fixture
def fresh_stop_flag(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The test gets its own (unset) stop-request flag (crl.train.stop) and one torch thread."""
    monkeypatch.setattr(stop_module, "_REQUESTED", threading.Event())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
