"""Test-suite setup: put ``tests/losses`` on ``sys.path`` so every test folder can import the
float64 loss references with ``from loss_reference import ...`` (test folders have no
``__init__.py``)."""

import os
import sys
from pathlib import Path

_LOSS_REFERENCES = str(Path(__file__).resolve().parent / "losses")
if _LOSS_REFERENCES not in sys.path:
    sys.path.insert(0, _LOSS_REFERENCES)

# The suite runs on two pytest-xdist workers on a 2-core machine: one torch thread each avoids
# oversubscription, which makes tiny tensor ops thousands of times slower. BLAS pools likewise.
if "PYTEST_XDIST_WORKER" in os.environ:
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    threadpool_limits(1)
