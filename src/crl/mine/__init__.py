"""Hard-negative mining with a model (``crl mine``; docs/data.md, "Mining hard negatives").

- :func:`mine_hard_negatives`: texts in, each row's negatives out, with the semantics of
  ``sentence_transformers.util.mine_hard_negatives`` (``sampling_strategy="top"``);
- :func:`select_negatives`: the same on embeddings;
- :func:`mine_file`: a user's table in, the same table with ``negative_1..H`` columns out;
- :func:`top_candidates`: the exact blockwise (or faiss) top-k search under them;
- the model: any :class:`~crl.eval.encoder.TextEncoder`, or what
  :func:`crl.eval.encoder.load_encoder` loads (``minilm``, a run directory, a model directory).
"""

from crl.eval.encoder import TextEncoder
from crl.mine.files import MineReport, mine_file
from crl.mine.mining import MinedNegatives, MiningOptions, mine_hard_negatives, select_negatives
from crl.mine.search import Candidates, faiss_available, top_candidates

__all__ = [
    "Candidates",
    "MineReport",
    "MinedNegatives",
    "MiningOptions",
    "TextEncoder",
    "faiss_available",
    "mine_file",
    "mine_hard_negatives",
    "select_negatives",
    "top_candidates",
]
