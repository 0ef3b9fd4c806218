"""Evaluate a model on a split: encode the deterministic eval views in batches, then the metrics
of :mod:`crl.eval` (retrieval, geometry, held-out risk, probes); and re-evaluate a finished run
from its directory (:func:`evaluate_run`)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from crl.errors import CrlValueError
from crl.eval import (
    alignment,
    heldout_contrastive_risk,
    knn_probe,
    linear_probe,
    retrieval_metrics,
    uniformity,
)
from crl.eval.ir import Relevance, ir_metrics
from crl.eval.prefixes import prefix_retrieval_metrics
from crl.models import DualEncoder
from crl.models.encode import encode_hard_negatives
from crl.rundir import CHECKPOINT_FILE, EVAL_FILE, write_json
from crl.train.build import build_run
from crl.train.checkpoint import load_checkpoint
from crl.train.config import EvalConfig, config_hash
from crl.train.trained import read_run_config


def _batches(x: Any, batch_size: int) -> list[Any]:
    return [x[i:i + batch_size] for i in range(0, len(x), batch_size)]


@torch.no_grad()
def encode_split(model: DualEncoder, dataset: Any, *, batch_size: int,
                 device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """Embeddings ``(N, D)`` of both eval views of a (prepared) split, on the CPU.

    The model is put in eval mode for the pass and restored to its previous mode.
    """
    was_training = model.training
    model.eval()
    try:
        xa, xb = dataset.eval_views()
        za = torch.cat([model.encode_a(x.to(device)).cpu() for x in _batches(xa, batch_size)])
        zb = torch.cat([model.encode_b(y.to(device)).cpu() for y in _batches(xb, batch_size)])
    finally:
        model.train(was_training)
    return za, zb


@torch.no_grad()
def probe_features(model: DualEncoder, dataset: Any, *, batch_size: int,
                   device: torch.device | str = "cpu", representation: bool = True) -> Tensor:
    """Features of the view-a eval views for probes, on the CPU: the representation before the
    projection head (``model.represent_a``, as SimCLR probes) or the embedding."""
    was_training = model.training
    model.eval()
    encode = model.represent_a if representation else model.encode_a
    try:
        xa, _ = dataset.eval_views()
        return torch.cat([encode(x.to(device)).cpu() for x in _batches(xa, batch_size)])
    finally:
        model.train(was_training)


def evaluate(model: DualEncoder, split: Any, cfg: EvalConfig, *, temperature: float,
             train_split: Any | None = None, device: torch.device | str = "cpu",
             train_features: tuple[Tensor, Tensor] | None = None,
             prefix_dims: Sequence[int] = ()) -> dict[str, float]:
    """The metrics of the ``eval`` section on one split.

    Args:
        model: A ``DualEncoder``.
        split: The evaluated split (prepared: tensor views).
        cfg: The ``eval`` section.
        temperature: The loss temperature, for ``risk/contrastive``.
        train_split: The training split (prepared), for the probes; None: no probes.
        device: Where the model runs.
        train_features: Already computed ``(probe features, labels)`` of the training split.
        prefix_dims: Matryoshka prefix dimensions (the objective's ``prefix_dims``): retrieval
            metrics at each one too (:func:`~crl.eval.prefixes.prefix_retrieval_metrics`).

    Returns:
        ``retrieval/...`` (and ``retrieval_dim{d}/...`` for each prefix),
        ``geometry/alignment``, ``geometry/uniformity``, ``risk/contrastive``, ``ir/...`` with
        ``cfg.ir``, and for labelled data ``probe/linear_acc``, ``probe/linear_balanced_acc``,
        ``probe/knn_acc``,
        ``probe/knn_balanced_acc``.
    """
    za, zb = encode_split(model, split, batch_size=cfg.batch_size, device=device)
    out: dict[str, float] = {}
    if cfg.retrieval:
        zh = (encode_hard_negatives(model, split, batch_size=cfg.batch_size, device=device)
              if cfg.hard_negatives else None)  # (N, H, D) or None
        out.update(retrieval_metrics(za, zb, ks=cfg.ks, block_size=cfg.block_size, hard=zh))
        out.update(prefix_retrieval_metrics(za, zb, prefix_dims, normalize=model.normalize,
                                            ks=cfg.ks, block_size=cfg.block_size, hard=zh))
    if cfg.ir:
        out.update(ir_metrics(za, zb, Relevance.pairs(len(za)), ks=cfg.ks,
                              query_block=cfg.block_size))
    if cfg.geometry:
        out["geometry/alignment"] = alignment(za, zb)
        out["geometry/uniformity"] = 0.5 * (uniformity(za, block_size=cfg.block_size)
                                            + uniformity(zb, block_size=cfg.block_size))
    if cfg.risk:
        out["risk/contrastive"] = heldout_contrastive_risk(
            za, zb, temperature=temperature, block_size=cfg.block_size)
    labels = getattr(split, "labels", None)
    if cfg.probe and train_split is not None and labels is not None and bool((labels >= 0).all()):
        representation = cfg.probe_features == "representation"
        if train_features is None:
            train_features = (probe_features(model, train_split, batch_size=cfg.batch_size,
                                             device=device, representation=representation),
                              train_split.labels)
        features, train_labels = train_features
        if train_labels is not None and torch.unique(train_labels).numel() >= 2:
            # the embedding features of the split are za, already computed
            test_features = za if not representation else probe_features(
                model, split, batch_size=cfg.batch_size, device=device, representation=True)
            lin = linear_probe(features, train_labels, test_features, labels)
            knn = knn_probe(features, train_labels, test_features, labels, k=cfg.knn_k)
            out["probe/linear_acc"] = lin.accuracy
            out["probe/linear_balanced_acc"] = lin.balanced_accuracy
            out["probe/knn_acc"] = knn.accuracy
            out["probe/knn_balanced_acc"] = knn.balanced_accuracy
    return out


def evaluate_run(run_dir: str | Path, *, split: str = "test", device: str | None = None,
                 trusted_factories: Collection[str] = ()) -> dict[str, float]:
    """Re-evaluate a run from its ``config.json`` and ``checkpoint.pt``; write ``eval.json``.

    Args:
        run_dir: A run directory written by :func:`crl.train.fit`.
        split: ``"test"`` or ``"val"``.
        device: Where to run (None: the run's ``train.device``).
        trusted_factories: The ``model.kind: custom`` factories the caller names as safe to
            import (:func:`crl.train.trained.read_run_config`); a run that names another one
            is refused.

    Returns:
        The metrics (also written, with the step and split, to ``eval.json`` atomically).

    Raises:
        CrlError: if the directory has no config or checkpoint, they do not match, or the
            config names a factory that is not trusted.
    """
    run_dir = Path(run_dir)
    if split not in ("test", "val"):
        raise CrlValueError(f"evaluate_run: `split` must be 'test' or 'val'; got {split!r}")
    config = read_run_config(run_dir, trusted_factories=trusted_factories)
    state = load_checkpoint(run_dir / CHECKPOINT_FILE, config_hash=config_hash(config))
    target = torch.device(device or config.train.device)
    built = build_run(config, target)
    built.model.load_state_dict(state["model"])
    built.objective.load_state_dict(state["objective"])
    dataset = built.test_ds if split == "test" else built.val_ds
    if dataset is None:
        raise CrlValueError(f"evaluate_run: the {split} split has fewer than 2 items")
    metrics = evaluate(built.model, dataset, config.eval,
                       temperature=built.objective.temperature(),
                       train_split=built.train_ds, device=target,
                       prefix_dims=built.objective.prefix_dims)
    write_json(run_dir / EVAL_FILE, {"run_id": config_hash(config), "step": int(state["step"]),
                                     "split": split, "metrics": metrics})
    return metrics


__all__ = ["encode_split", "evaluate", "evaluate_run", "probe_features"]
