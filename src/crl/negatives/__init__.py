"""Negatives as their own axis: shared (SSCRL) or independent (SCRL) negative sets of size m.

See docs/theory.md §9 and ``docs/negatives.md``.
"""

from crl.negatives.config import NegativesConfig, build_negative_sets
from crl.negatives.permutation import permute, permute_rows, round_keys
from crl.negatives.sets import (
    REGIMES,
    NegativeSets,
    Regime,
    SetFamily,
    rows_with_negatives,
    share_ranks,
)

__all__ = [
    "REGIMES",
    "NegativeSets",
    "NegativesConfig",
    "Regime",
    "SetFamily",
    "build_negative_sets",
    "permute",
    "permute_rows",
    "round_keys",
    "rows_with_negatives",
    "share_ranks",
]
