"""Retrieval metrics at each Matryoshka prefix dimension (docs/training.md, "Matryoshka
embeddings"): :func:`~crl.eval.retrieval_metrics` of the first ``d`` coordinates of the
embeddings, cut (and renormalised) exactly as the loss cut them in training."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from crl.eval.retrieval import DEFAULT_KS, retrieval_metrics
from crl.losses.matryoshka import truncate


def prefix_retrieval_metrics(a: Tensor, b: Tensor, dims: Sequence[int], *, normalize: bool,
                             ks: Sequence[int] = DEFAULT_KS, block_size: int = 1024,
                             hard: Tensor | None = None) -> dict[str, float]:
    """:func:`~crl.eval.retrieval_metrics` of each prefix shorter than the embedding.

    Args:
        a: ``(N, D)`` view-a embeddings.
        b: ``(N, D)`` view-b embeddings; ``b[i]`` is the positive of ``a[i]``.
        dims: The prefix dimensions; those ``>= D`` are the full embedding, whose metrics are
            ``retrieval/...`` already, and are skipped.
        normalize: Renormalise each prefix (the model L2-normalises its embeddings).
        ks: The cut-offs of ``recall@k``.
        block_size: Side of the tiles of scores.
        hard: ``(N, H, D)`` hard negatives of the ``x2y`` queries (cut the same way), or None.

    Returns:
        ``retrieval_dim{d}/<name>`` for each metric ``retrieval/<name>`` and each prefix ``d``.

    Example:
        >>> import torch
        >>> a = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.6, 0.8], [0.0, 0.8, -0.6]])
        >>> m = prefix_retrieval_metrics(a, a, [3, 1], normalize=True, ks=(1,))
        >>> sorted(m)[:2], m["retrieval_dim1/x2y_recall@1"]  # the last two tie on 1 coordinate
        (['retrieval_dim1/x2y_auc', 'retrieval_dim1/x2y_mean_rank'], 0.3333333333333333)
    """
    out: dict[str, float] = {}
    for dim in dims:
        if dim >= a.shape[-1]:
            continue
        cut_hard = None if hard is None else truncate(hard, dim, normalize=normalize)
        metrics = retrieval_metrics(truncate(a, dim, normalize=normalize),
                                    truncate(b, dim, normalize=normalize), ks=ks,
                                    block_size=block_size, hard=cut_hard)
        out.update({f"retrieval_dim{dim}/{key.split('/', 1)[1]}": value
                    for key, value in metrics.items()})
    return out


__all__ = ["prefix_retrieval_metrics"]
