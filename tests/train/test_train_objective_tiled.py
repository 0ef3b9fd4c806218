"""``loss.block_size``: the trainer's objective over tiles equals the plain one (values, gradients
and GCL state), including GCL asking negative sets tile by tile."""

from __future__ import annotations

import pytest
import torch

from crl.losses import GlobalContrastiveLoss, build_objective
from crl.losses.base import LogitScaleInit
from crl.negatives import NegativesConfig
from crl.train.config import LossConfig


def _run(loss: dict[str, object], negatives: NegativesConfig, block_size: int | None
         ) -> tuple[torch.Tensor, ...]:
    n, batch = 120, 33
    objective = build_objective(LossConfig(**loss, block_size=block_size),  # type: ignore[arg-type]
                                negatives, num_samples=n,
                                logit_scale=LogitScaleInit(init=2.0)).double()
    g = torch.Generator().manual_seed(0)
    outs: list[torch.Tensor] = []
    for _ in range(2):
        index = torch.randperm(n, generator=g)[:batch]
        za = torch.nn.functional.normalize(torch.randn(batch, 8, generator=g,
                                                       dtype=torch.float64), dim=1)
        zb = torch.nn.functional.normalize(za + torch.randn(batch, 8, generator=g,
                                                            dtype=torch.float64), dim=1)
        za.requires_grad_(True)
        zb.requires_grad_(True)
        value, _ = objective(za, zb, index, None)
        outs += [value.detach(), *torch.autograd.grad(value, [za, zb])]
    if isinstance(objective.loss, GlobalContrastiveLoss):
        outs += [objective.loss.log_u_a2b.clone(), objective.loss.log_u_b2a.clone()]
    return tuple(outs)


# info_nce / clip tile with in-batch negatives (with negative sets they take the masked path).
CASES = [({"name": "info_nce", "temperature": 0.1}, "in_batch"), ({"name": "clip"}, "in_batch"),
         *[({"name": "gcl", "temperature": 0.1}, r) for r in ("in_batch", "shared",
                                                              "independent")]]


@pytest.mark.parametrize(("loss", "regime"), CASES)
def test_tiled_objective_equals_plain(loss: dict[str, object], regime: str) -> None:
    negatives = (NegativesConfig() if regime == "in_batch"
                 else NegativesConfig(regime=regime, m=40, seed=1))  # type: ignore[arg-type]
    plain = _run(loss, negatives, None)
    tiled = _run(loss, negatives, 8)
    for x, y in zip(plain, tiled, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-12, equal_nan=True)
