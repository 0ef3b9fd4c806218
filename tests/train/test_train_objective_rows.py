"""``Objective(..., rows=...)``: ranks that score their own rows against all gathered columns.

Simulated in one process: with ``N`` ranks each calling the objective on its slice of the same
gathered batch, the mean of the ranks' values is the loss of the whole batch, its gradient (with
respect to the features, the loss's own parameters and CLIP's logit scale) is the whole batch's,
and GCL's state ends as after the whole batch. ``crl.distributed``'s world size and count
reduction are stood in for by the values a real process group would give."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from crl import distributed
from crl.errors import CrlValueError
from crl.losses import Objective, SigLipLoss, SupConLoss, build_objective
from crl.losses.base import LogitScaleInit
from crl.negatives import NegativesConfig
from crl.train.config import LossConfig

N_SAMPLES, BATCH, WORLD = 90, 12, 3


def _features(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    index = torch.randperm(N_SAMPLES, generator=g)[:BATCH]
    za = torch.nn.functional.normalize(torch.randn(BATCH, 6, generator=g, dtype=torch.float64),
                                       dim=1)
    zb = torch.nn.functional.normalize(za + torch.randn(BATCH, 6, generator=g,
                                                        dtype=torch.float64), dim=1)
    labels = torch.randint(0, 3, (BATCH,), generator=g)
    return za, zb, index, labels


def _objective(loss: dict[str, Any], negatives: dict[str, Any]) -> Objective:
    torch.manual_seed(0)
    labels = torch.randint(0, 3, (N_SAMPLES,), generator=torch.Generator().manual_seed(9))
    objective = build_objective(LossConfig(**loss), NegativesConfig(**negatives),
                                num_samples=N_SAMPLES, labels=labels, num_classes=3,
                                logit_scale=LogitScaleInit(init=1.5))
    return objective.double()


def _anchors_with_negatives(objective: Objective, index: torch.Tensor,
                            labels: torch.Tensor) -> int:
    """What the ranks' counts add up to: anchors of the whole batch with a negative (SigLIP:
    every anchor; SupCon: both views of every item, each with its other view as a positive)."""
    if isinstance(objective.loss, SigLipLoss):
        return BATCH
    if isinstance(objective.loss, SupConLoss):
        return 2 * BATCH
    mask = objective.negatives(index, labels, slice(0, BATCH))
    if mask is None:
        return BATCH
    assert isinstance(mask, torch.Tensor)
    return int((mask & ~torch.eye(BATCH, dtype=torch.bool)).any(dim=1).sum())


CASES: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"name": "info_nce", "temperature": 0.2}, {}),
    ({"name": "info_nce", "temperature": 0.2, "symmetric": False}, {}),
    ({"name": "info_nce", "temperature": 0.2}, {"regime": "independent", "m": 6, "seed": 1}),
    ({"name": "info_nce", "temperature": 0.2, "block_size": 5},
     {"regime": "shared", "m": 20, "seed": 2}),
    ({"name": "info_nce", "temperature": 0.2}, {"exclude_same_label": True}),
    ({"name": "clip"}, {}),
    ({"name": "clip", "block_size": 4}, {}),
    ({"name": "siglip"}, {}),
    ({"name": "siglip"}, {"regime": "independent", "m": 10, "seed": 3}),
    ({"name": "gcl", "temperature": 0.3}, {}),
    ({"name": "gcl", "temperature": 0.3, "block_size": 3},
     {"regime": "independent", "m": 5, "seed": 4}),
    ({"name": "gcl", "temperature": 0.3, "gcl": {"temperature_mode": "per_sample"}}, {}),
    ({"name": "gcl", "temperature": 0.3, "gcl": {"temperature_mode": "global_learnable"}},
     {"regime": "shared", "m": 30, "seed": 5}),
    ({"name": "oce", "temperature": 0.5, "oce": {"phi": "cvar", "alpha": 0.3}},
     {"regime": "independent", "m": 6, "seed": 6}),
    ({"name": "pairwise", "pairwise_loss": "squared_hinge"}, {}),
    ({"name": "supcon", "temperature": 0.3}, {}),
    ({"name": "info_nce", "temperature": 0.2, "kmeans_weight": 0.5, "kmeans_k": 2}, {}),
]


@pytest.mark.parametrize(("loss", "negatives"), CASES,
                         ids=[f"{c[0]['name']}-{i}" for i, c in enumerate(CASES)])
def test_ranks_rows_average_to_the_whole_batch(loss: dict[str, Any], negatives: dict[str, Any],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    whole, sliced = _objective(loss, negatives), _objective(loss, negatives)
    for step in range(2):  # the second step sees GCL's u from the first
        za, zb, index, labels = _features(step)
        count = _anchors_with_negatives(whole, index, labels)
        feats = [x.clone().requires_grad_(True) for x in (za, zb)]
        value, _ = whole(*feats, index, labels)
        params = [*whole.parameters()]
        want = torch.autograd.grad(value, [*feats, *params], allow_unused=True)

        monkeypatch.setattr(distributed, "world_size", lambda: WORLD)
        monkeypatch.setattr(distributed, "all_reduce_sum",
                            lambda x, count=count: torch.full_like(x, count))
        feats = [x.clone().requires_grad_(True) for x in (za, zb)]
        values = [sliced(*feats, index, labels, rows=distributed.own_rows(BATCH, r, WORLD))[0]
                  for r in range(WORLD)]
        monkeypatch.undo()
        mean = torch.stack(values).mean()
        params = [*sliced.parameters()]
        got = torch.autograd.grad(mean, [*feats, *params], allow_unused=True)
        torch.testing.assert_close(mean, value, rtol=1e-10, atol=1e-12)
        for g, w in zip(got, want, strict=True):
            if w is None:
                assert g is None or not bool(g.any())
            else:
                assert g is not None
                torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12)
    for key, buffer in whole.state_dict().items():
        torch.testing.assert_close(sliced.state_dict()[key], buffer, equal_nan=True,
                                   rtol=1e-12, atol=0.0)


def test_each_rank_updates_only_its_own_gcl_state() -> None:
    objective = _objective({"name": "gcl", "temperature": 0.3}, {})
    za, zb, index, labels = _features(0)
    objective(za, zb, index, labels, rows=slice(4, 8))
    seen = ~torch.isnan(objective.loss.log_u_a2b)
    assert seen.nonzero().flatten().tolist() == sorted(index[4:8].tolist())


@pytest.mark.parametrize("rows", [slice(3, 3), slice(0, 20), slice(None, 4), slice(0, 6, 2)])
def test_bad_rows_are_a_clear_error(rows: slice) -> None:
    objective = _objective({"name": "info_nce"}, {})
    za, zb, index, labels = _features(0)
    with pytest.raises(CrlValueError, match="rows"):
        objective(za, zb, index, labels, rows=rows)
