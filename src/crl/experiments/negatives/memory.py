"""What gradient caching needs for an in-batch batch of ``B`` pairs: a small memory model built
from two measurements (docs/negatives.md, "The answer as a config").

A gradient-cached step (``train.micro_batch_size: k``, docs/training.md) holds, above the model
and its optimiser state:

- the cached embeddings of both views and their gradients, ``2 x 2 x B x D`` float32 values
  (exact: ``16 B D`` bytes);
- the loss's score matrices: ``F_plain B²`` float32 values on the plain path (``B <= 2048``),
  ``F_tiled T²`` in tiles of side ``T`` above it (``benchmarks/loss_memory.py``: the peak
  resident growth of crl's CLIP loss, forward and backward, per square; the largest measured);
- one micro-batch of ``k`` pairs through the towers and the rest of the step (the optimiser's
  temporaries): measured for the bundled all-MiniLM-L6-v2 only (``benchmarks/gradcache.py``,
  the fp32 ``crl`` entry at B = 256, k = 32: its peak growth less its own cached embeddings and
  scores). It does not depend on ``B``; other towers are not measured, and their estimate says
  so instead of guessing.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from crl.losses.tiled import DEFAULT_BLOCK_SIZE, PLAIN_MAX_BATCH

GIB = 2**30
#: ``floats_per_square`` maxima of benchmarks/results/loss_memory.json (plain B <= 2048, tiled).
PLAIN_FLOATS_PER_B2 = 8.84
TILED_FLOATS_PER_T2 = 3.22


@dataclass(frozen=True)
class StepMeasurement:
    """One measured gradient-cached step (``benchmarks/results/gradcache.json``)."""

    model: str
    max_seq_length: int
    batch_size: int
    micro_batch_size: int
    dim: int
    peak_growth_gib: float
    source: str


#: The fp32 ``crl`` entry of benchmarks/results/gradcache.json (the row of this code, without a
#: ``crl_source``): MiniLM fine-tuned end to end on pycode pairs, B = 256, k = 32.
MINILM_STEP = StepMeasurement("all-MiniLM-L6-v2", 128, 256, 32, 384, 1.8176956176757812,
                              "benchmarks/results/gradcache.json's fp32 'crl' entry")


def cached_bytes(batch_size: int, dim: int) -> int:
    """Both views' ``(B, D)`` float32 embeddings and their gradients: ``16 B D`` bytes."""
    return 16 * batch_size * dim


def scores_bytes(batch_size: int) -> int:
    """The loss's score matrices at ``B``: plain up to ``PLAIN_MAX_BATCH``, tiles above.

    Example:
        >>> scores_bytes(100) == round(4 * PLAIN_FLOATS_PER_B2 * 100 ** 2)
        True
    """
    if batch_size <= PLAIN_MAX_BATCH:
        return round(4 * PLAIN_FLOATS_PER_B2 * batch_size ** 2)
    side = min(DEFAULT_BLOCK_SIZE, batch_size)
    return round(4 * TILED_FLOATS_PER_T2 * side ** 2)


def towers_bytes(step: StepMeasurement = MINILM_STEP) -> int:
    """One micro-batch through the towers and the rest of the step: the measured peak less the
    measured step's own cached embeddings and scores."""
    return round(step.peak_growth_gib * GIB) - cached_bytes(step.batch_size, step.dim) \
        - scores_bytes(step.batch_size)


@dataclass(frozen=True)
class MemoryEstimate:
    """Memory above the model for a gradient-cached step at ``batch_size`` (bytes).

    Attributes:
        towers: None where the towers were not measured (``note`` says why).
        total: The sum, None without ``towers``.
        note: Where the towers' term comes from, or why it is missing.
    """

    batch_size: int
    micro_batch_size: int
    dim: int
    cached: int
    scores: int
    towers: int | None
    total: int | None
    note: str

    step: StepMeasurement = MINILM_STEP

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, each part also in GiB, MiB and KiB (the units its sentence prints)."""
        parts = {"cached": self.cached, "scores": self.scores, "towers": self.towers,
                 "total": self.total}
        return {**asdict(self),
                "gib": {k: None if v is None else v / GIB for k, v in parts.items()},
                "mib": {k: None if v is None else v / 2**20 for k, v in parts.items()},
                "kib": {k: None if v is None else v / 2**10 for k, v in parts.items()}}


def measured_towers(model: dict[str, Any]) -> bool:
    """Whether ``model`` (a run's ``model`` section) is the measured one: the bundled MiniLM
    fine-tuned as a transformer."""
    return model.get("kind") == "transformer" and model.get("pretrained") is None


def gradcache_memory(batch_size: int, dim: int, model: dict[str, Any],
                     step: StepMeasurement = MINILM_STEP) -> MemoryEstimate:
    """The memory model of the module docstring at ``batch_size`` pairs of ``dim``-d
    embeddings, micro-batches of ``step.micro_batch_size``.

    Example:
        >>> est = gradcache_memory(615, 384, {"kind": "transformer", "pretrained": None})
        >>> round(est.total / GIB, 2), est.cached == 16 * 615 * 384
        (1.83, True)
    """
    cached, scores = cached_bytes(batch_size, dim), scores_bytes(batch_size)
    if measured_towers(model):
        towers: int | None = towers_bytes(step)
        note = (f"the towers' term is {step.model}'s at max_seq_length {step.max_seq_length}, "
                f"fp32, B = {step.batch_size}, from {step.source}")
        length = model.get("max_seq_length")
        if length is not None and length > step.max_seq_length:
            note += f"; longer texts (max_seq_length {length}) need more"
        if int(model.get("freeze_layers") or 0) > 0:
            note += ("; with frozen layers it is an upper bound, since they keep no "
                     "activations for the backward pass")
    else:
        towers = None
        note = (f"not measured for this model, only for the bundled {step.model}: measure "
                "yours with benchmarks/gradcache.py")
    total = None if towers is None else cached + scores + towers
    return MemoryEstimate(batch_size, step.micro_batch_size, dim, cached, scores, towers, total,
                          note, step)


def embedding_dim(model: dict[str, Any], kind: str) -> int | None:
    """``D`` of a run's ``model`` section whose kind resolves to ``kind`` (``auto`` resolved
    on the data), as :func:`crl.models.build_model` sets it: ``embed_dim`` (default 128), or
    the backbone's width where the head keeps it; None where it is not known without building
    the towers (a custom factory, a model directory without ``hidden_size``).

    Example:
        >>> embedding_dim({"kind": "transformer"}, "transformer")  # the bundled MiniLM's width
        384
        >>> embedding_dim({"kind": "auto", "head": "none", "token_dim": 64}, "embedding_bag")
        64
    """
    from crl.models.config import DEFAULT_EMBED_DIM
    from crl.models.text import MINILM_DIM

    head = model.get("head") or ("none" if kind == "transformer" else "mlp")
    if kind == "transformer" and head in ("none", "residual"):
        pretrained = model.get("pretrained")
        if pretrained is None:
            return MINILM_DIM
        path = Path(pretrained) / "config.json"
        width = json.loads(path.read_text()).get("hidden_size") if path.is_file() else None
        return int(width) if isinstance(width, int) else None
    if head in ("none", "residual") and kind == "frozen_minilm":
        return MINILM_DIM
    if head in ("none", "residual") and kind == "embedding_bag":
        return int(model.get("token_dim") or 128)
    if kind == "custom":
        return model.get("embed_dim")
    return int(model.get("embed_dim") or DEFAULT_EMBED_DIM)


def gib_text(nbytes: float) -> str:
    """Bytes in GiB, MiB below 0.1 GiB, KiB below 0.1 MiB; 2 significant digits.

    Example:
        >>> gib_text(0.25 * GIB), gib_text(3 * 2**20), gib_text(8704)
        ('0.25 GiB', '3 MiB', '8.5 KiB')
    """
    if not math.isfinite(nbytes):
        return "—"
    for unit, size in (("GiB", GIB), ("MiB", 2**20)):
        if nbytes >= 0.1 * size:
            return f"{nbytes / size:.2g} {unit}"
    return f"{nbytes / 2**10:.2g} KiB"


def memory_text(est: MemoryEstimate) -> str:
    """The estimate in one sentence: the total (where known) and its parts."""
    parts = (f"{gib_text(est.cached)} for the cached ({est.batch_size:,}, {est.dim}) embeddings "
             f"of both views and their gradients and {gib_text(est.scores)} for the loss's "
             "scores")
    step = (f"Gradient caching at train.batch_size {est.batch_size:,}, train.micro_batch_size "
            f"{est.micro_batch_size}" if est.batch_size > est.micro_batch_size else
            f"One pass at train.batch_size {est.batch_size:,}, at most a micro-batch of "
            f"{est.micro_batch_size},")
    if est.total is None or est.towers is None:
        return f"{step} needs {parts}, plus one micro-batch through your towers, {est.note}."
    return (f"{step} needs about {gib_text(est.total)} above the model and its optimiser "
            f"state: {gib_text(est.towers)} for one micro-batch through the towers and the "
            f"rest of the step, {parts} ({est.note}).")
