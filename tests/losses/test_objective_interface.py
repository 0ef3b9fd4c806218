"""The training objective's one interface: the registry, the reducer, the logit scale's home."""

from __future__ import annotations

import math
import typing

import pytest
import torch

from crl.errors import CrlValueError
from crl.losses import OBJECTIVES, ClipLoss, LossConfig, build_objective, reduce_terms
from crl.losses.base import AnchorTerms, LogitScaleInit, PairBatch
from crl.models import ModelConfig
from crl.negatives import NegativesConfig
from crl.train.build import run_objective as build_run_objective
from crl.train.config import TrainConfig


def test_loss_names_are_the_registry() -> None:
    names = typing.get_args(LossConfig.model_fields["name"].annotation)
    assert names == tuple(OBJECTIVES)
    with pytest.raises(ValueError, match="'info_nce', 'clip', 'siglip'"):
        LossConfig(name="infonce")
    for name, cls in OBJECTIVES.items():
        objective = build_objective(LossConfig(name=name), NegativesConfig(), num_samples=20)
        assert type(objective.loss) is cls


def test_reducer_mean_count_and_share() -> None:
    first = torch.tensor([1.0, 2.0, 4.0, 8.0])
    second = torch.tensor([3.0, 5.0, 7.0, 100.0])
    counted = torch.tensor([True, True, True, False])
    # One process: the mean over counted anchors, averaged over the directions.
    assert float(reduce_terms(AnchorTerms((first, second), counted), world=1)) == pytest.approx(
        ((1 + 2 + 4) / 3 + (3 + 5 + 7) / 3) / 2)
    assert float(reduce_terms(AnchorTerms((first,)), world=1)) == pytest.approx(15 / 4)
    empty = first.clone().requires_grad_(True)
    value = reduce_terms(AnchorTerms((empty,), torch.zeros(4, dtype=torch.bool)), world=1)
    value.backward()  # no anchor counts: 0 with a working graph
    assert float(value.detach()) == 0.0 and empty.grad is not None and not bool(empty.grad.any())


def test_clip_logit_scale_lives_in_the_objective_from_the_model_section() -> None:
    cfg = TrainConfig.model_validate({"loss": {"name": "clip"},
                                      "model": {"init_logit_scale": 1.0,
                                                "max_logit_scale": 20.0}})
    objective = build_run_objective(cfg, num_samples=10, labels=None, epochs=1, num_classes=None)
    scale = objective.loss.logit_scale
    assert set(objective.state_dict()) == {"loss.logit_scale"}
    assert float(scale.detach()) == 1.0 and scale.requires_grad
    assert objective.temperature() == pytest.approx(math.exp(-1.0))
    with torch.no_grad():
        scale.fill_(10.0)
    objective.after_step()  # exp(logit_scale) <= model.max_logit_scale = 20
    assert float(scale.detach()) == pytest.approx(math.log(20.0))
    with torch.no_grad():
        scale.fill_(-3.0)  # the trainer's clamp has no lower bound (the model section's rule)
    objective.after_step()
    assert float(scale.detach()) == -3.0
    frozen = build_run_objective(TrainConfig.model_validate(
        {"loss": {"name": "clip"}, "model": {"learn_logit_scale": False}}),
        num_samples=10, labels=None, epochs=1, num_classes=None)
    assert not any(p.requires_grad for p in frozen.parameters())
    assert ModelConfig().init_logit_scale == LogitScaleInit().init
    with pytest.raises(CrlValueError, match="init_logit_scale"):
        ClipLoss(init_logit_scale=math.inf)


def test_every_loss_gives_terms_and_after_step_keeps_state() -> None:
    g = torch.Generator().manual_seed(0)
    za = torch.nn.functional.normalize(torch.randn(6, 4, generator=g), dim=1)
    zb = torch.nn.functional.normalize(torch.randn(6, 4, generator=g), dim=1)
    batch = PairBatch(za, zb, torch.arange(6), None, slice(2, 5))
    for name in OBJECTIVES:
        loss = build_objective(LossConfig(name=name), NegativesConfig(), num_samples=6).loss
        terms = loss.terms(batch)
        assert all(v.shape == terms.values[0].shape for v in terms.values), name
        assert terms.counted is None or terms.counted.shape == terms.values[0].shape, name
        assert math.isfinite(loss.risk_temperature()), name
        before = {k: v.clone() for k, v in loss.state_dict().items()}
        loss.after_step()
        for key, value in loss.state_dict().items():
            torch.testing.assert_close(value, before[key], equal_nan=True)


def test_objective_call_checks_shapes_and_hard_negatives_only_where_taken() -> None:
    objective = build_objective(LossConfig(name="siglip"), NegativesConfig(), num_samples=10)
    za = torch.randn(4, 3)
    with pytest.raises(CrlValueError, match="no hard negatives"):
        objective(za, za, torch.arange(4), hard=torch.randn(4, 2, 3))
    with pytest.raises(CrlValueError, match=r"\(B, D\)"):
        objective(za, za[:3], torch.arange(4))


_VALUE_CHECKS = ("check_tensor", "check_pair", "check_mask", "check_index", "check_positive",
                 "check_finite_scalar", "check_hard")


#: The losses with an exact tiled path (``loss.block_size``).
_TILED = [name for name, cls in OBJECTIVES.items()
          if "block_size" in cls.__init__.__code__.co_varnames]


@pytest.mark.parametrize(("name", "block_size"),
                         [(name, None) for name in OBJECTIVES] + [(name, 3) for name in _TILED])
@pytest.mark.parametrize("regime", ["in_batch", "independent"])
def test_the_trainer_call_runs_no_value_checks(name: str, block_size: int | None, regime: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks that read tensor values (and so synchronise with the device) run at the
    public boundary only: the trainer's call of the objective, plain or tiled (``block_size``,
    the kernel's unchecked entry), runs none."""
    import sys

    import crl._validation as validation
    import crl.losses

    if regime != "in_batch" and not OBJECTIVES[name].accepts_negative_sets:
        pytest.skip("the loss takes in-batch negatives only")
    negatives = {} if regime == "in_batch" else {"regime": regime, "m": 5, "seed": 0}
    objective = build_objective(LossConfig(name=name, block_size=block_size),
                                NegativesConfig(**negatives), num_samples=30,
                                labels=torch.arange(30) % 3)
    assert getattr(objective.loss, "block_size", None) == block_size
    g = torch.Generator().manual_seed(0)
    za, zb = torch.randn(8, 4, generator=g), torch.randn(8, 4, generator=g)
    hard = torch.randn(8, 2, 4, generator=g) if objective.loss.accepts_hard_negatives else None
    checks = {id(getattr(validation, c)) for c in _VALUE_CHECKS}

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("a value check ran in the trainer's call")

    for module in [m for key, m in sys.modules.items() if key.startswith("crl")]:
        for attr, value in list(vars(module).items()):
            if id(value) in checks:
                monkeypatch.setattr(module, attr, forbidden)
    with pytest.raises(AssertionError, match="value check"):  # the public function checks
        crl.losses.info_nce(za, zb, block_size=block_size)
    with pytest.raises(AssertionError, match="value check"):  # and the public kernel
        crl.losses.anchor_logsumexp(za, zb, 2.0, block_size=block_size)
    loss, _ = objective(za, zb, torch.randperm(30, generator=g)[:8], torch.arange(8) % 3,
                        hard=hard)
    assert torch.isfinite(loss)
