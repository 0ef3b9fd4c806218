"""Test-suite setup: put ``tests/losses`` on ``sys.path`` so every test folder can import the
float64 loss references with ``from loss_reference import ...`` (test folders have no
``__init__.py``)."""

import sys
from pathlib import Path

_LOSS_REFERENCES = str(Path(__file__).resolve().parent / "losses")
if _LOSS_REFERENCES not in sys.path:
    sys.path.insert(0, _LOSS_REFERENCES)
