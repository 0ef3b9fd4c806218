"""The guide (:mod:`crl.losses.guide`) on every path it serves: plain and tiled give the same
values and gradients (InfoNCE, CLIP, GCL, in-batch and hard negatives, with negative sets);
GCL with the guide equals GCL given the guide's mask; gradient caching equals one pass; and a
guide for a loss that takes none is refused."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from crl.errors import CrlValueError
from crl.losses import FalseNegativeGuide, GlobalContrastiveLoss, GuideEmbeddings
from crl.models import DualEncoder
from crl.train.build import run_objective
from crl.train.config import TrainConfig
from crl.train.steps import loss_and_gradients

N, B, D, DG, H = 40, 12, 6, 5, 3


def guide(seed: int = 0, hard: bool = True, margin: float = 0.0,
          strategy: str = "absolute") -> FalseNegativeGuide:
    """Guide embeddings where a third of the pairs lie near another pair (false negatives)."""
    g = torch.Generator().manual_seed(seed)
    a = F.normalize(torch.randn(N, DG, generator=g), dim=1)
    a[1::3] = F.normalize(a[0::3][: len(a[1::3])] + 0.2 * a[1::3], dim=1)
    b = F.normalize(a + 0.5 * torch.randn(N, DG, generator=g), dim=1)
    h = F.normalize(a.unsqueeze(1) + torch.randn(N, H, DG, generator=g), dim=2) if hard else None
    return FalseNegativeGuide(GuideEmbeddings(a, b, h), margin=margin,
                              strategy=strategy)  # type: ignore[arg-type]


def embeddings(seed: int = 1, hard: bool = True) -> list[Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = [F.normalize(torch.randn(B, D, generator=g, dtype=torch.float64), dim=1)
           for _ in range(2)]
    if hard:
        out.append(F.normalize(torch.randn(B, H, D, generator=g, dtype=torch.float64), dim=2))
    return [t.requires_grad_(True) for t in out]


def objective(loss: dict, **sections: dict) -> nn.Module:
    cfg = TrainConfig.model_validate({"loss": loss, **sections})
    return run_objective(cfg, num_samples=N, labels=None, epochs=2, num_classes=None,
                         guide=guide(margin=0.02)).double()


def value_and_grads(obj: nn.Module, z: list[Tensor], index: Tensor) -> tuple[Tensor, ...]:
    obj = copy.deepcopy(obj)
    loss, _ = obj(z[0], z[1], index, hard=z[2] if len(z) == 3 else None)
    return (loss.detach(), *torch.autograd.grad(loss, z))


LOSSES = {
    "info_nce": {"name": "info_nce", "temperature": 0.1},
    "info_nce_symmetric_sets": {"name": "info_nce", "temperature": 0.1, "symmetric": True},
    "clip": {"name": "clip"},
    "gcl": {"name": "gcl", "temperature": 0.2, "gcl": {"gamma": 0.7}},
    "gcl_include_positive": {"name": "gcl", "temperature": 0.2,
                             "gcl": {"gamma": 0.7, "include_positive": True}},
}


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("hard", [False, True])
def test_tiled_equals_plain(name: str, hard: bool) -> None:
    sections = ({"negatives": {"regime": "independent", "m": 20, "seed": 3}}
                if name.endswith("sets") else {})
    index = torch.randperm(N, generator=torch.Generator().manual_seed(4))[:B]
    z = embeddings(hard=hard)
    plain = value_and_grads(objective({**LOSSES[name], "block_size": "plain"}, **sections),
                            z, index)
    tiled = value_and_grads(objective({**LOSSES[name], "block_size": 5}, **sections), z, index)
    for x, y in zip(plain, tiled, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)
    unguided = run_objective(TrainConfig.model_validate({"loss": LOSSES[name], **sections}),
                             num_samples=N, labels=None, epochs=2, num_classes=None).double()
    # the guide changed the gradient (GCL's first-visit value is tau whatever the mask)
    assert not torch.allclose(value_and_grads(unguided, z, index)[1], plain[1])


def test_gcl_with_the_guide_equals_gcl_given_its_mask() -> None:
    index = torch.randperm(N, generator=torch.Generator().manual_seed(5))[:B]
    z = embeddings(hard=False)
    guided = value_and_grads(objective(LOSSES["gcl"]), z, index)
    loss = GlobalContrastiveLoss(N, temperature=0.2, gamma=0.7).double()
    mask = guide(margin=0.02).mask(index, index)
    assert (~mask).sum() > B  # some false negatives off the diagonal
    value = loss(z[0], z[1], index, negatives_mask=mask)
    reference = (value.detach(), *torch.autograd.grad(value, z[:2]))
    for x, y in zip(guided, reference, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)


def test_hard_negatives_the_guide_masks_drop_out() -> None:
    """A guide that masks every hard negative gives the loss without hard negatives."""
    index = torch.arange(B)
    z = embeddings(hard=True)
    g = guide(hard=True, margin=0.02)
    table, _ = g.table(torch.device("cpu"))
    everything = FalseNegativeGuide(GuideEmbeddings(table.a, table.b, table.a.unsqueeze(1)
                                                    .expand(N, H, DG).clone()), margin=0.0)
    cfg = TrainConfig.model_validate({"loss": LOSSES["info_nce"]})
    with_hard = run_objective(cfg, num_samples=N, labels=None, epochs=2, num_classes=None,
                              guide=everything).double()
    loss, _ = with_hard(z[0], z[1], index, hard=z[2])
    plain, _ = with_hard(z[0], z[1], index)
    torch.testing.assert_close(loss, plain, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["info_nce", "gcl"])
def test_gradient_caching_equals_one_pass(name: str) -> None:
    torch.manual_seed(0)
    tower = nn.Sequential(nn.Linear(D, 16), nn.Tanh(), nn.Linear(16, 8))
    model = DualEncoder(tower, copy.deepcopy(tower))
    g = torch.Generator().manual_seed(1)
    index = torch.randperm(N, generator=g)[:B]
    xa = torch.randn(B, D, generator=g)
    batch = (xa, xa + 0.3 * torch.randn(B, D, generator=g), index, torch.full((B,), -1),
             torch.randn(B, H, D, generator=g))
    cfg = TrainConfig.model_validate({"loss": LOSSES[name]})
    made = run_objective(cfg, num_samples=N, labels=None, epochs=2, num_classes=None,
                         guide=guide())
    outs = []
    for micro in (None, 5):
        m, o = copy.deepcopy(model), copy.deepcopy(made)
        value, _ = loss_and_gradients(m, o, batch, device=torch.device("cpu"),  # type: ignore[arg-type]
                                      micro_batch_size=micro, precision="fp32")
        outs.append((value, [p.grad for p in m.parameters()]))
    assert outs[0][0] == pytest.approx(outs[1][0], rel=1e-5)
    for x, y in zip(outs[0][1], outs[1][1], strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6)


def test_a_loss_without_a_guide_is_refused() -> None:
    cfg = TrainConfig.model_validate({"loss": {"name": "siglip"}})
    with pytest.raises(CrlValueError, match=r"loss.guide: loss .siglip. takes no guide"):
        run_objective(cfg, num_samples=N, labels=None, epochs=2, num_classes=None,
                      guide=guide())
