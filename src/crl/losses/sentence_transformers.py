"""A sentence-transformers loss backed by crl: the exact (tiled) InfoNCE or GCL objective, with
hard-negative columns and ``m`` negatives per anchor, usable in ``SentenceTransformerTrainer``.

This module imports sentence-transformers; ``import crl.losses`` does not import it.

The dataset has the columns sentence-transformers' ``MultipleNegativesRankingLoss`` takes:
``(anchor, positive)`` pairs or ``(anchor, positive, negative_1, ..., negative_H)`` tuples. An
optional integer ``label`` column (which the trainer passes as ``labels``) gives each pair's
dataset index in ``[0, num_samples)``: GCL keeps one running estimate per index, and negative
sets of ``m`` per anchor are drawn per index (docs/negatives.md); plain in-batch InfoNCE needs
none.

Hard negatives (``hard_negatives``):

- ``"own"`` (crl's meaning, docs/theory.md §8): anchor ``i``'s hard-negative texts are extra
  candidates of anchor ``i`` only, counted in its ``m``; any loss, any negatives regime.
- ``"batch"`` (``MultipleNegativesRankingLoss``'s): every hard negative in the batch is a
  candidate of every anchor; InfoNCE with in-batch negatives only.

With ``similarity="cosine"`` and ``scale = 1 / temperature`` this is
``MultipleNegativesRankingLoss`` (``symmetric=False``; ``symmetric=True`` adds its
``doc_to_query`` direction, averaged ``per_direction``), computed by crl's exact kernels.

Example:
    >>> from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    >>> model = SentenceTransformer("path/to/model")  # doctest: +SKIP
    >>> loss = CrlContrastiveLoss(model, loss="info_nce", scale=20.0)  # doctest: +SKIP
    >>> SentenceTransformerTrainer(model=model, train_dataset=pairs, loss=loss).train()
    ... # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from sentence_transformers.base.losses.merged_forward import embed_columns
from torch import Tensor, nn

from crl._validation import check_choice, check_int_range, check_positive
from crl.errors import CrlValueError
from crl.losses import build_objective
from crl.losses.config import GclOptions, LossConfig
from crl.losses.tiled import BlockSize, anchor_logsumexp
from crl.negatives import NegativesConfig

Similarity = Literal["cosine", "dot"]
HardNegatives = Literal["own", "batch"]
_WHERE = "CrlContrastiveLoss"


class CrlContrastiveLoss(nn.Module):
    """crl's InfoNCE or GCL as a sentence-transformers loss (``loss(features, labels)``).

    Args:
        model: The ``SentenceTransformer`` being trained (its ``sentence_embedding`` output is
            scored).
        loss: ``"info_nce"`` (``MultipleNegativesRankingLoss``) or ``"gcl"`` (the global
            contrastive loss, one running estimate per pair and direction).
        scale: ``1 / temperature`` (``MultipleNegativesRankingLoss``'s ``scale``; 20 there).
        similarity: ``"cosine"`` (embeddings L2-normalised first) or ``"dot"``.
        symmetric: Also the ``positive -> anchor`` direction (the two averaged).
        hard_negatives: ``"own"`` or ``"batch"`` (see the module docstring).
        negatives: crl's negatives section (default every other pair of the batch; ``regime:
            independent`` / ``shared`` with ``m`` draws negative sets per dataset index).
        num_samples: Dataset size ``n``, required by GCL and by negative sets (the ``label``
            column then holds each pair's index in ``[0, n)``).
        gcl: GCL's options (gamma and its schedule, temperature mode).
        block_size: Tile side of the exact tiled kernels (None: tiles only for large batches;
            ``"plain"``: never).

    ``SentenceTransformerTrainer`` optimises the loss module's parameters with the model's, so
    GCL's learnable temperatures are trained; it never calls ``set_epoch``, so GCL's cosine
    gamma schedule stays at epoch 0 unless a callback calls ``loss.objective.set_epoch(epoch)``.

    Raises:
        CrlValueError: for a bad option, or GCL / negative sets without ``num_samples``.
    """

    def __init__(self, model: nn.Module, *, loss: Literal["info_nce", "gcl"] = "info_nce",
                 scale: float = 20.0, similarity: Similarity = "cosine", symmetric: bool = False,
                 hard_negatives: HardNegatives = "own", negatives: NegativesConfig | None = None,
                 num_samples: int | None = None, gcl: GclOptions | None = None,
                 block_size: BlockSize = None) -> None:
        super().__init__()
        check_choice(_WHERE, "loss", loss, ("info_nce", "gcl"))
        check_positive(_WHERE, "scale", scale, allow_tensor=False)
        self.similarity = check_choice(_WHERE, "similarity", similarity, ("cosine", "dot"))
        self.hard_negatives = check_choice(_WHERE, "hard_negatives", hard_negatives,
                                           ("own", "batch"))
        negatives = negatives or NegativesConfig()
        self.needs_index = loss == "gcl" or negatives.regime != "in_batch"
        if self.needs_index and num_samples is None:
            raise CrlValueError(
                f"{_WHERE}: loss={loss!r} with negatives regime {negatives.regime!r} needs "
                "`num_samples` (the dataset size; the `label` column holds each pair's index); "
                "got None")
        if hard_negatives == "batch" and (loss != "info_nce" or negatives.regime != "in_batch"):
            raise CrlValueError(
                f"{_WHERE}: hard_negatives='batch' (every hard negative is every anchor's "
                "candidate) works with loss='info_nce' and in-batch negatives; got "
                f"loss={loss!r}, regime={negatives.regime!r} (use hard_negatives='own')")
        self.num_samples = (1 if num_samples is None
                            else check_int_range(_WHERE, "num_samples", num_samples, 1, None))
        self.model = model
        self.scale = float(scale)
        self.symmetric = bool(symmetric)
        self.loss_cfg = LossConfig(name=loss, temperature=1.0 / self.scale, symmetric=symmetric,
                                   gcl=gcl or GclOptions(), block_size=block_size)
        self.negatives_cfg = negatives
        self.objective = build_objective(self.loss_cfg, negatives, num_samples=self.num_samples)

    def forward(self, sentence_features: Iterable[dict[str, Tensor]],
                labels: Tensor | None) -> Tensor:
        """The loss of a batch of columns (``anchor, positive, negative_1, ...``)."""
        return self.compute_loss_from_embeddings(embed_columns(self.model, sentence_features),
                                                 labels)

    def compute_loss_from_embeddings(self, embeddings: list[Tensor],
                                     labels: Tensor | None) -> Tensor:
        """The loss from the columns' embeddings ``[(B, D) anchor, (B, D) positive, (B, D)
        negative_1, ...]``; ``labels`` ``(B,)`` dataset indices or None."""
        if len(embeddings) < 2:
            raise CrlValueError(f"{_WHERE}: needs at least two columns (anchor, positive); got "
                                f"{len(embeddings)}")
        if self.similarity == "cosine":
            embeddings = [F.normalize(z, dim=-1) for z in embeddings]
        za, zb, *hard = embeddings  # (B, D) each
        if hard and self.hard_negatives == "batch":
            return self._batch_hard_info_nce(za, zb, torch.cat(hard))
        index = self._index(labels, za.shape[0], za.device)
        zh = torch.stack(hard, dim=1) if hard else None  # (B, H, D)
        # The trainer has no hook after optimizer.step(): clamp learnable scales before use.
        self.objective.after_step()
        result: tuple[Tensor, dict[str, float]] = self.objective(za, zb, index, None, hard=zh)
        return result[0]

    def _batch_hard_info_nce(self, za: Tensor, zb: Tensor, zh: Tensor) -> Tensor:
        """InfoNCE whose candidates are every positive and every hard negative ``zh (B·H, D)``
        of the batch, as ``MultipleNegativesRankingLoss`` scores them; over tiles when large."""
        candidates = torch.cat([zb, zh])  # (B + B·H, D); anchor i's positive is column i
        block = self.loss_cfg.block_size
        out = anchor_logsumexp(za, candidates, self.scale, block_size=block)
        value = (out.lse - out.positive).mean()
        if self.symmetric:  # positive -> anchor: the anchors are the candidates
            back = anchor_logsumexp(zb, za, self.scale, block_size=block)
            value = 0.5 * (value + (back.lse - back.positive).mean())
        return value

    def _index(self, labels: Tensor | None, batch: int, device: torch.device) -> Tensor:
        """The batch's dataset indices: the ``label`` column, or positions when none is needed."""
        if labels is None or labels.numel() == 0:
            if self.needs_index:
                raise CrlValueError(
                    f"{_WHERE}: loss={self.loss_cfg.name!r} with negatives regime "
                    f"{self.negatives_cfg.regime!r} needs each pair's dataset index: add an "
                    "integer `label` column, e.g. dataset.add_column('label', "
                    "list(range(len(dataset)))); got no labels")
            return torch.arange(batch, device=device)
        if labels.shape != (batch,) or labels.dtype.is_floating_point:
            raise CrlValueError(f"{_WHERE}: `labels` must be ({batch},) integer dataset indices; "
                                f"got shape {tuple(labels.shape)}, dtype {labels.dtype}")
        return labels.to(device=device, dtype=torch.int64)

    def get_config_dict(self) -> dict[str, Any]:
        """The options, for sentence-transformers' model card."""
        return {"loss": self.loss_cfg.name, "scale": self.scale, "similarity": self.similarity,
                "symmetric": self.symmetric, "hard_negatives": self.hard_negatives,
                "negatives": self.negatives_cfg.model_dump(), "num_samples": self.num_samples,
                "block_size": self.loss_cfg.block_size}

    @property
    def temperature(self) -> float:
        """``1 / scale``."""
        return 1.0 / self.scale


__all__ = ["CrlContrastiveLoss", "HardNegatives", "Similarity"]
