"""The decoupled contrastive loss, registered as ``loss.name: dcl``: against a float64 loop from
the formula (plain and tiled, negative sets, hard negatives, a rank's rows), gradcheck, and a
short training run through the config."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from loss_reference import ref_logsumexp
from torch import Tensor

from crl.losses import LossConfig, build_objective
from crl.losses.base import PairBatch
from crl.losses.dcl import DecoupledContrastiveLoss
from crl.negatives import NegativesConfig, NegativeSets

N, B, H, D = 30, 6, 2, 3


def _data(seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    za = torch.randn(B, D, generator=g, dtype=torch.float64)
    zb = za + torch.randn(B, D, generator=g, dtype=torch.float64)
    return za, zb, torch.randn(B, H, D, generator=g, dtype=torch.float64), \
        torch.randperm(N, generator=g)[:B]


def ref_dcl_terms(za: Tensor, zb: Tensor, hard: Tensor | None, tau: float,
                  mask: Tensor | None) -> list[list[Tensor | None]]:
    """Per direction and anchor: ``log sum_{j in neg(i)} exp(s_ij / tau) - s_ii / tau``
    (None: no negative); hard negatives in ``a -> b`` only."""
    out = []
    for direction, (x, y) in enumerate([(za, zb), (zb, za)]):
        terms: list[Tensor | None] = []
        for i in range(B):
            logits = [x[i] @ y[j] / tau for j in range(B)
                      if j != i and (mask is None or bool(mask[i, j]))]
            if direction == 0 and hard is not None:
                logits += [x[i] @ hard[i, k] / tau for k in range(H)]
            terms.append(ref_logsumexp(logits) - x[i] @ y[i] / tau if logits else None)
        out.append(terms)
    return out


@pytest.mark.parametrize("block_size", [None, 2], ids=["plain", "tiled"])
@pytest.mark.parametrize("with_hard", [False, True], ids=["no-hard", "hard"])
def test_dcl_matches_the_loop(block_size: int | None, with_hard: bool) -> None:
    za, zb, hard, index = _data(0)
    tau, m = 0.7, 3
    objective = build_objective(
        LossConfig(name="dcl", temperature=tau, block_size=block_size),
        NegativesConfig(regime="independent", m=m, seed=1), num_samples=N).double()
    assert isinstance(objective.loss, DecoupledContrastiveLoss)
    mask = NegativeSets(N, m, regime="independent", seed=1).batch_mask(index)
    given = hard if with_hard else None
    ref = ref_dcl_terms(za, zb, given, tau, mask)
    counted = [i for i in range(B) if ref[0][i] is not None]
    assert with_hard or len(counted) < B  # some anchors have no negative in this batch
    # Anchors count by the a -> b direction; one without a negative in b -> a adds 0 there.
    want = sum(sum(0.0 if ref[d][i] is None else ref[d][i] for i in counted) / len(counted)
               for d in range(2)) / 2
    value, _ = objective(za, zb, index, None, hard=given)
    torch.testing.assert_close(value, want, rtol=1e-12, atol=1e-12)
    rows = slice(1, 4)
    terms = objective.loss.terms(PairBatch(za, zb, index, None, rows,
                                           objective.negatives(index, None, rows), given))
    assert terms.counted is not None
    for i in range(1, 4):
        assert bool(terms.counted[i - 1]) == (ref[0][i] is not None)
        if ref[0][i] is not None:
            torch.testing.assert_close(terms.values[0][i - 1], ref[0][i])


def test_dcl_gradcheck_and_module_call() -> None:
    za, zb, hard, index = _data(1)
    objective = build_objective(LossConfig(name="dcl", temperature=0.5), NegativesConfig(),
                                num_samples=N).double()
    leaves = tuple(x.clone().requires_grad_(True) for x in (za, zb, hard))
    assert torch.autograd.gradcheck(
        lambda a, b, h: objective(a, b, index, None, hard=h)[0], leaves)
    plain = DecoupledContrastiveLoss(temperature=1.0, symmetric=False)
    eye = torch.eye(3)
    assert float(plain(eye, eye)) == pytest.approx(math.log(2.0) - 1.0)


def test_dcl_trains_from_a_config(tmp_path: Path) -> None:
    from crl.train import fit, load_config

    config = load_config("synthetic-gaussian", ["loss.name=dcl", "train.steps=6",
                                                "train.eval_every=6", "train.log_every=3"])
    result = fit(config, tmp_path / "run", progress=False)
    assert math.isfinite(float(result.summary["train/loss"]))
