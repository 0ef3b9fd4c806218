"""The paper the negatives study tests, and its reference figures, in one table.

Every number the reports compare with comes from here (docs/theory.md §5 and §7 state the
theory; docs/negatives.md describes the study). The figures are the paper's CLIP experiment as
the project's source summary states it; they are claims about the paper's runs, quoted, not
reproduced.

Example:
    >>> PAPER.gain_10_to_40_points
    (7.6, 20.0)
    >>> PAPER.citation.startswith("Yuanfan Li, Xiyuan Wei, Tianbao Yang, Yiming Ying")
    True
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PaperReference:
    """The reference figures of the paper's negatives experiment.

    Attributes:
        citation: Authors, title and year.
        short: How the reports name it in running text.
        setting: The experiment the figures come from, in words.
        ns: The numbers of anchors n of that experiment.
        fractions: Its m/n values.
        gain_10_to_40_points: Range of the gain of the metric from m = 10% to 40% of n, in
            points (1 point = 0.01 of a fraction).
        gain_beyond_40_points: The largest gain past m = 40% of n, in points.
        saturation_fraction: Where the gains stop, as m*/n.
        alpha_range: The range of alpha in m* ~ n^alpha that the bounds allow (m* between
            sqrt(n), the balance of the independent regime, and n, that of the shared one).
        source: Where in the source material each figure is stated.
    """

    citation: str
    short: str
    setting: str
    ns: tuple[float, ...]
    fractions: tuple[float, ...]
    gain_10_to_40_points: tuple[float, float]
    gain_beyond_40_points: float
    saturation_fraction: float
    alpha_range: tuple[float, float]
    source: str


PAPER = PaperReference(
    citation=("Yuanfan Li, Xiyuan Wei, Tianbao Yang, Yiming Ying, \"Statistical Consistency "
              "and Generalization of Contrastive Representation Learning\", 2026"),
    short="Li, Wei, Yang and Ying (2026)",
    setting=("CLIP trained with FastCLIP on n of 6M, 10M and 14M image-text pairs, m/n of 1, 10, "
             "40, 70 and 100%, shared negatives, at a fixed budget of processed samples"),
    ns=(6e6, 10e6, 14e6),
    fractions=(0.01, 0.1, 0.4, 0.7, 1.0),
    gain_10_to_40_points=(7.6, 20.0),
    gain_beyond_40_points=1.4,
    saturation_fraction=0.4,
    alpha_range=(0.5, 1.0),
    source=("the paper's experimental section as summarised in the project's source notes: "
            "gains of 7.6 to 20 points from 10% to 40% of n and at most 1.4 points beyond, so "
            "m* ~ 0.4 n; the generalization bounds O(1/m + 1/sqrt(n)) (independent) and "
            "O(1/sqrt(m) + 1/sqrt(n)) (shared) put m* between sqrt(n) and n"),
)
