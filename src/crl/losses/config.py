"""The ``loss`` section of a run config: which registered loss, and its hyperparameters.

The valid ``loss.name`` values, :data:`LossName`, are the names of
:data:`crl.losses.registry.OBJECTIVES` (a test keeps the two equal). This module imports no loss:
a config is read and checked without loading one.

Example:
    >>> cfg = LossConfig(name="gcl", temperature=0.2)
    >>> cfg.gcl.gamma, cfg.symmetric
    (0.9, True)
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: ``loss.name``: the registered losses (:data:`crl.losses.registry.OBJECTIVES`), in its order.
LossName = Literal["info_nce", "clip", "siglip", "supcon", "gcl", "oce", "pairwise", "dcl"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class GclOptions(_Section):
    """Options of the global contrastive loss (GCL).

    Attributes:
        gamma: Moving-average weight of the new estimate of ``u`` (constant schedule).
        gamma_schedule: ``"constant"`` or ``"cosine"`` (1 down to ``gamma_min`` over
            ``decay_epochs``, default: the run's epochs).
        gamma_min: Final gamma of the cosine schedule.
        decay_epochs: Epochs of the cosine decay (None: the number of epochs of the run).
        temperature_mode: ``"fixed"``, ``"global_learnable"`` or ``"per_sample"``.
        rho: The KL-radius term of the learnable-temperature objective.
        include_positive: Count the positive among each anchor's candidates: GCL then
            optimises InfoNCE (with the batch's number of negatives) instead of the decoupled,
            positive-excluded loss (docs/theory.md §10).
    """

    gamma: float = Field(0.9, gt=0, le=1)
    gamma_schedule: Literal["constant", "cosine"] = "constant"
    gamma_min: float = Field(0.2, gt=0, le=1)
    decay_epochs: int | None = Field(None, ge=1)
    temperature_mode: Literal["fixed", "global_learnable", "per_sample"] = "fixed"
    rho: float = 6.5
    include_positive: bool = False


class OceOptions(_Section):
    """The OCE risk's ``phi`` (``"kl"`` uses ``loss.temperature``) and CVaR's ``alpha``."""

    phi: Literal["kl", "cvar", "softplus"] = "kl"
    alpha: float = Field(0.1, gt=0, le=1)


class MatryoshkaOptions(_Section):
    """Matryoshka embeddings (Kusupati et al. 2022; docs/training.md, "Matryoshka
    embeddings"): the loss is the weighted sum of the loss on the first ``d`` coordinates of
    each embedding, for each ``d`` of ``dims`` (renormalised when the model L2-normalises), as
    sentence-transformers' ``MatryoshkaLoss``.

    Attributes:
        dims: The prefix dimensions, distinct, each at most the embedding dimension (include
            it to train the full embedding too).
        weights: One weight per dimension, in the order of ``dims`` (None: 1 each).
    """

    dims: list[Annotated[int, Field(ge=1)]] = Field(min_length=1)
    weights: list[Annotated[float, Field(gt=0)]] | None = None

    @model_validator(mode="after")
    def _paired(self) -> MatryoshkaOptions:
        if len(set(self.dims)) != len(self.dims):
            raise ValueError(f"dims must be distinct; got {self.dims}")
        if self.weights is not None and len(self.weights) != len(self.dims):
            raise ValueError(f"weights must have one weight per dimension "
                             f"({len(self.dims)}); got {len(self.weights)}")
        return self

    def pairs(self) -> list[tuple[int, float]]:
        """``(dim, weight)`` pairs, largest dimension first (as ``MatryoshkaLoss`` sorts them).

        Example:
            >>> MatryoshkaOptions(dims=[8, 32], weights=[2.0, 1.0]).pairs()
            [(32, 1.0), (8, 2.0)]
        """
        weights = self.weights or [1.0] * len(self.dims)
        return sorted(zip(self.dims, weights, strict=True), key=lambda pair: -pair[0])


class GuideOptions(_Section):
    """A guide model against false negatives (GISTEmbed; docs/training.md, "False negatives:
    the guide").

    Attributes:
        model: ``minilm``, a run directory written by ``crl train``, or a sentence-transformers
            model directory: it scores the training pairs once, frozen.
        margin: In-batch and hard negatives that the guide scores above the positive's score
            minus this (``absolute``) or minus ``|score| * margin`` (``relative``) are masked.
        margin_strategy: ``absolute`` or ``relative``, as ``GISTEmbedLoss``.
        batch_size: Texts per forward pass of the guide.
    """

    model: str = Field(min_length=1)
    margin: float = 0.0
    margin_strategy: Literal["absolute", "relative"] = "absolute"
    batch_size: int = Field(64, ge=1)


class LossConfig(_Section):
    """The ``loss`` section: which contrastive loss, and its hyperparameters.

    Attributes:
        name: A name of :data:`crl.losses.registry.OBJECTIVES`: ``info_nce`` (NT-Xent /
            InfoNCE at a fixed temperature), ``clip`` (a learnable ``logit_scale``, set by the
            ``model`` section), ``siglip`` (its own learnable scale and bias), ``supcon``
            (labels, or the two views of an index, as positives), ``gcl``, ``oce``,
            ``pairwise``, ``dcl`` (decoupled contrastive loss), or any loss registered later.
        temperature: ``tau`` of info_nce, supcon, gcl, oce (``phi="kl"``) and of the held-out
            contrastive risk.
        symmetric: Average the ``a -> b`` and ``b -> a`` directions.
        learnable_scale: Train SigLIP's scale and bias (False: keep the initial values); CLIP's
            ``logit_scale`` follows ``model.learn_logit_scale``.
        gcl: GCL options.
        oce: OCE options.
        pairwise_loss: The surrogate of ``pairwise``.
        kmeans_weight: Weight of the relaxed k-means regulariser (0: off).
        kmeans_k: Its number of clusters (None: the data's number of classes, else 10).
        block_size: Compute ``info_nce``, ``clip``, ``gcl`` and ``dcl`` exactly over tiles of
            this side (memory ``O(B·D + T²)`` instead of ``B²``; the same values and gradients);
            ``gcl`` and ``dcl`` also ask negative sets tile by tile. None: the plain path, tiles
            only above B = 2048; ``"plain"``: the plain path at any batch size.
        matryoshka: Train prefixes of the embedding too (:class:`MatryoshkaOptions`); None: off.
        guide: A guide model whose false negatives are masked (info_nce, clip, gcl); None: none.
    """

    name: LossName = "info_nce"
    temperature: float = Field(0.1, gt=0)
    symmetric: bool = True
    learnable_scale: bool = True
    gcl: GclOptions = Field(default_factory=GclOptions)
    oce: OceOptions = Field(default_factory=OceOptions)
    pairwise_loss: Literal["logistic", "exponential", "squared_hinge", "hinge"] = "logistic"
    kmeans_weight: float = Field(0.0, ge=0)
    kmeans_k: int | None = Field(None, ge=1)
    block_size: Annotated[int, Field(ge=1)] | Literal["plain"] | None = None
    matryoshka: MatryoshkaOptions | None = None
    guide: GuideOptions | None = None


__all__ = ["GclOptions", "GuideOptions", "LossConfig", "LossName", "MatryoshkaOptions",
           "OceOptions"]
