"""``DualEncoder``: two towers (or one shared tower). The learnable logit scale of the CLIP loss
lives in the objective (:class:`crl.losses.ClipLoss`), not here."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch.nn.functional as F
from torch import Tensor, nn

from crl.data.base import PairDataset, TensorPairDataset
from crl.errors import CrlValueError
from crl.models.towers import Tower

#: Turns texts into the tensors a text tower takes (MiniLM features, or token ids).
TextFeaturizer = Callable[[Sequence[str]], Tensor]


class DualEncoder(nn.Module):
    """CLIP-style dual encoder: ``za = f(x)``, ``zb = g(y)``, scored by the objective.

    Pass the same module as both towers for SimCLR-style training with one shared tower (its
    parameters are then counted once by ``parameters()``).

    Args:
        tower_a: Encoder of view a, ``(B, ...) -> (B, D)``.
        tower_b: Encoder of view b, ``(B, ...) -> (B, D)`` (may be ``tower_a``).
        normalize: L2-normalise the outputs.
        text_featurizer: For text towers, maps texts to tensors in ``prepare``.

    Example:
        >>> import torch
        >>> model = DualEncoder(nn.Linear(3, 4), nn.Linear(5, 4))
        >>> za, zb = model(torch.randn(2, 3), torch.randn(2, 5))
        >>> za.shape, [round(float(v), 4) for v in zb.detach().norm(dim=1)]
        (torch.Size([2, 4]), [1.0, 1.0])
    """

    def __init__(self, tower_a: nn.Module, tower_b: nn.Module, *, normalize: bool = True,
                 text_featurizer: TextFeaturizer | None = None) -> None:
        super().__init__()
        self.tower_a = tower_a
        self.tower_b = tower_b
        self.normalize = normalize
        self.text_featurizer = text_featurizer

    @property
    def shared(self) -> bool:
        """True when both views go through the same tower."""
        return self.tower_a is self.tower_b

    def _finish(self, z: Tensor) -> Tensor:
        return F.normalize(z, dim=-1) if self.normalize else z

    def encode_a(self, x: Tensor) -> Tensor:
        """Embeddings of view-a inputs: ``(B, ...) -> (B, D)``."""
        return self._finish(self.tower_a(x))

    def encode_b(self, y: Tensor) -> Tensor:
        """Embeddings of view-b inputs: ``(B, ...) -> (B, D)``."""
        return self._finish(self.tower_b(y))

    def represent_a(self, x: Tensor) -> Tensor:
        """View-a features before the projection head (for probes): ``(B, ...) -> (B, R)``."""
        tower = self.tower_a
        out: Tensor = tower.represent(x) if isinstance(tower, Tower) else tower(x)
        return out

    def represent_b(self, y: Tensor) -> Tensor:
        """View-b features before the projection head: ``(B, ...) -> (B, R)``."""
        tower = self.tower_b
        out: Tensor = tower.represent(y) if isinstance(tower, Tower) else tower(y)
        return out

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """``(za, zb)``, each ``(B, D)``."""
        return self.encode_a(x), self.encode_b(y)

    def prepare(self, dataset: PairDataset) -> PairDataset:
        """Turn a text data set into a tensor data set, once, before training or evaluation.

        Text views go through ``text_featurizer`` (frozen MiniLM features, cached on disk, or
        padded token ids); labels are kept, and hard negatives become ``(N, H, ...)`` view-b
        inputs. Vector and image data sets are returned unchanged.

        Raises:
            CrlValueError: for text data and a model without a text featurizer.
        """
        if not dataset.is_text:
            return dataset
        if self.text_featurizer is None:
            raise CrlValueError(
                "DualEncoder.prepare: this model takes tensors, but the data set holds text; "
                "use model kind 'transformer', 'frozen_minilm' or 'embedding_bag'"
            )
        texts_a, texts_b = dataset.eval_views()
        hard = dataset.hard_negative_views()  # N lists of H view-b texts, or None
        flat = [text for row in hard for text in row] if hard else []
        feats = self.text_featurizer(list(texts_a) + list(texts_b) + flat)  # (2N + N H, ...)
        n = len(texts_a)
        feats_h = feats[2 * n:].reshape(n, -1, *feats.shape[1:]) if hard else None  # (N, H, ...)
        return TensorPairDataset(feats[:n], feats[n:2 * n], dataset.labels, feats_h)
