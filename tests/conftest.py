"""Test-suite setup: put ``tests`` and ``tests/losses`` on ``sys.path`` so every test folder can
import the shared tensor builders (``from shared_tensors import make_pair, make_leaf``), the
tiny BERT (``from tiny_bert import write_tiny_bert``) and the float64 loss references
(``from loss_reference import ...``; test folders have no ``__init__.py``), and offer the
builders and a tiny BERT directory as fixtures."""

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

_HERE = Path(__file__).resolve().parent
for _folder in (str(_HERE), str(_HERE / "losses")):
    if _folder not in sys.path:
        sys.path.insert(0, _folder)

from shared_tensors import make_leaf as _make_leaf  # noqa: E402
from shared_tensors import make_pair as _make_pair  # noqa: E402
from tiny_bert import write_tiny_bert  # noqa: E402


@pytest.fixture(scope="session")
def make_pair() -> Callable[..., Any]:
    """:func:`shared_tensors.make_pair`: paired embeddings ``(a, b)`` of shape ``(B, D)``."""
    return _make_pair


@pytest.fixture(scope="session")
def make_leaf() -> Callable[..., Any]:
    """:func:`shared_tensors.make_leaf`: a float64 leaf for gradient checks."""
    return _make_leaf


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory of a tiny BERT model (:mod:`tiny_bert`; ``model.pretrained`` in tests)."""
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


# The suite runs on two pytest-xdist workers on a 2-core machine: one torch thread each avoids
# oversubscription, which makes tiny tensor ops thousands of times slower. BLAS pools likewise.
if "PYTEST_XDIST_WORKER" in os.environ:
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    threadpool_limits(1)
