"""The training objective against loop references written from the formulas."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from crl.losses import (
    Objective,
    build_objective,
    clip_loss,
    contrastive_risk,
    info_nce,
    relaxed_kmeans,
)
from crl.losses.base import LogitScaleInit
from crl.negatives import NegativesConfig, NegativeSets
from crl.train import LossConfig
from shared_tensors import make_pair


def _pair(seed: int, b: int = 8, d: int = 4) -> tuple[Tensor, Tensor]:
    return make_pair(b, d, seed=seed, normalize=True)


def _objective(negatives: NegativesConfig | None = None, n: int = 100,
               labels: Tensor | None = None, logit_scale: LogitScaleInit | None = None,
               **loss: object) -> Objective:
    return build_objective(LossConfig(**loss), negatives or NegativesConfig(), num_samples=n,
                           labels=labels, logit_scale=logit_scale)


def _ref_masked_info_nce(za: Tensor, zb: Tensor, mask: Tensor, tau: float,
                         symmetric: bool) -> float:
    """Loops: anchor i's candidates are its positive and the j with mask[i, j], j != i."""
    b = za.shape[0]
    directions = [(za, zb), (zb, za)] if symmetric else [(za, zb)]
    total = 0.0
    for q, c in directions:
        losses = []
        for i in range(b):
            negs = [j for j in range(b) if j != i and bool(mask[i, j])]
            if not negs:
                continue
            pos = float(q[i] @ c[i]) / tau
            denom = math.exp(pos) + sum(math.exp(float(q[i] @ c[j]) / tau) for j in negs)
            losses.append(-(pos - math.log(denom)))
        total += sum(losses) / len(losses)
    return total / len(directions)


def test_info_nce_in_batch_is_the_library_loss() -> None:
    za, zb = _pair(0)
    obj = _objective(temperature=0.3, symmetric=True)
    loss, _ = obj(za, zb, torch.arange(8), None)
    assert float(loss) == pytest.approx(
        float(info_nce(za, zb, temperature=0.3, symmetric=True)), rel=1e-12)


@pytest.mark.parametrize("regime", ["shared", "independent"])
def test_info_nce_with_negative_sets_drops_anchors_without_negatives(regime: str) -> None:
    za, zb = _pair(1, b=10)
    sets = NegativeSets(100, 6, regime=regime, seed=2)  # type: ignore[arg-type]
    if regime == "shared":
        # One member of the shared set S in the batch: it is the only anchor without a negative.
        inside = sets.members().tolist()
        index = torch.tensor([inside[0], *[j for j in range(100) if j not in inside][:9]])
    else:
        index = torch.tensor([3, 17, 25, 40, 41, 58, 66, 70, 88, 99])
    mask = sets.batch_mask(index)
    has = mask.any(dim=1)
    assert bool(has.any()) and not bool(has.all())
    cfg = NegativesConfig(regime=regime, m=6, seed=2)  # type: ignore[arg-type]
    loss, _ = _objective(cfg, temperature=0.5, symmetric=True)(za, zb, index, None)
    assert float(loss) == pytest.approx(_ref_masked_info_nce(za, zb, mask, 0.5, True), rel=1e-10)


def test_supcon_without_labels_is_nt_xent() -> None:
    za, zb = _pair(2, b=5)
    tau = 0.2
    loss, _ = _objective(name="supcon", temperature=tau)(za, zb, torch.arange(5), None)
    z = torch.cat([za, zb])  # SimCLR: the positive of view i is the other view of its image
    terms = []
    for i in range(10):
        j = (i + 5) % 10
        denom = sum(math.exp(float(z[i] @ z[k]) / tau) for k in range(10) if k != i)
        terms.append(-(float(z[i] @ z[j]) / tau - math.log(denom)))
    assert float(loss) == pytest.approx(sum(terms) / 10, rel=1e-10)
    labels = torch.tensor([0, 0, 1, 1, 1])
    # Built from labelled training data, the objective takes the batch's labels as positives.
    labelled, _ = _objective(name="supcon", temperature=tau, labels=labels.repeat(20))(
        za, zb, torch.arange(5), labels)
    groups = torch.cat([labels, labels])
    terms = []
    for i in range(10):
        denom = sum(math.exp(float(z[i] @ z[k]) / tau) for k in range(10) if k != i)
        pos = [p for p in range(10) if p != i and groups[p] == groups[i]]
        terms.append(sum(-(float(z[i] @ z[p]) / tau - math.log(denom)) for p in pos) / len(pos))
    assert float(labelled) == pytest.approx(sum(terms) / 10, rel=1e-10)
    assert float(labelled) != pytest.approx(float(loss))


def test_clip_owns_its_logit_scale() -> None:
    za, zb = _pair(3)
    obj = _objective(name="clip", logit_scale=LogitScaleInit(init=2.0)).double()
    loss, logs = obj(za, zb, torch.arange(8), None)
    assert float(loss.detach()) == pytest.approx(float(clip_loss(za, zb, math.exp(2.0))),
                                                 rel=1e-12)
    assert logs["train/logit_scale"] == pytest.approx(math.exp(2.0))
    loss.backward()
    scale = obj.loss.logit_scale
    assert isinstance(scale, nn.Parameter) and scale.grad is not None and float(scale.grad) != 0
    assert set(obj.state_dict()) == {"loss.logit_scale"}
    assert obj.temperature() == pytest.approx(math.exp(-2.0))
    with torch.no_grad():
        scale.fill_(10.0)  # exp(10) is far above the model section's max_logit_scale of 100
    obj.after_step()
    assert float(scale.detach()) == pytest.approx(math.log(100.0))


def test_siglip_owns_trainable_scale_and_bias() -> None:
    za, zb = _pair(4)
    obj = _objective(name="siglip")
    assert {"loss.logit_scale", "loss.logit_bias"} <= set(obj.state_dict())
    loss, logs = obj(za.float(), zb.float(), torch.arange(8), None)
    loss.backward()
    assert obj.loss.logit_scale.grad is not None
    assert logs["train/logit_bias"] == -10.0
    frozen = _objective(name="siglip", learnable_scale=False)
    assert all(not p.requires_grad for p in frozen.parameters())


def test_oce_kl_is_the_contrastive_risk() -> None:
    za, zb = _pair(5)
    loss, _ = _objective(name="oce", temperature=0.4, symmetric=False)(
        za, zb, torch.arange(8), None)
    assert float(loss) == pytest.approx(float(contrastive_risk(za, zb, temperature=0.4)),
                                        rel=1e-10)


def test_kmeans_regulariser_is_added() -> None:
    za, zb = _pair(6)
    plain, _ = _objective(temperature=0.3)(za, zb, torch.arange(8), None)
    reg, logs = _objective(temperature=0.3, kmeans_weight=0.5, kmeans_k=2)(
        za, zb, torch.arange(8), None)
    extra = 0.5 * (float(relaxed_kmeans(za, 2)) + float(relaxed_kmeans(zb, 2)))
    assert float(reg) == pytest.approx(float(plain) + 0.5 * extra, rel=1e-10)
    assert logs["train/relaxed_kmeans"] == pytest.approx(extra)


def test_exclude_same_label_in_batch() -> None:
    za, zb = _pair(7, b=6)
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    obj = _objective(NegativesConfig(exclude_same_label=True), labels=labels.repeat(20)[:100],
                     temperature=0.5, symmetric=False)
    loss, _ = obj(za, zb, torch.arange(6), labels)
    mask = labels.unsqueeze(0) != labels.unsqueeze(1)
    assert float(loss) == pytest.approx(_ref_masked_info_nce(za, zb, mask, 0.5, False), rel=1e-10)


def test_gcl_updates_its_state() -> None:
    za, zb = _pair(8)
    obj = _objective(NegativesConfig(regime="shared", m=50), name="gcl", temperature=0.5)
    index = torch.arange(10, 18)
    gcl = obj.loss
    assert bool(torch.isnan(gcl.log_u_a2b[index]).all())
    loss, logs = obj(za, zb, index, None)
    assert math.isfinite(float(loss)) and logs["train/gcl_gamma"] == 0.9
    has = NegativeSets(100, 50, regime="shared").batch_mask(index).any(dim=1)
    assert bool(torch.isfinite(gcl.log_u_a2b[index][has]).all())
    assert {"loss.log_u_a2b", "loss.log_u_b2a"} <= set(obj.state_dict())
