"""crl: contrastive representation learning with negatives as a first-class axis.

The library is importable without the CLI, the trainer or matplotlib::

    >>> import torch
    >>> from crl.losses import info_nce
    >>> a = torch.eye(4)
    >>> round(float(info_nce(a, a, temperature=1.0)), 4)
    0.7437
"""

from crl.errors import CrlError, CrlTypeError, CrlValueError

__version__ = "0.1.0"

__all__ = ["CrlError", "CrlTypeError", "CrlValueError", "__version__"]
