"""``crl study negatives``: the grid of runs (grid, setup), the statistics of m* and its scaling
law (stats, refine, theory), the report (analysis, text, figures), the paper's reference figures
(paper), and the study class that ties them together (study: :class:`NegativesStudy`).
"""

from crl.experiments.negatives.study import NegativesStudy

__all__ = ["NegativesStudy"]
