"""Matryoshka embeddings (:mod:`crl.losses.matryoshka`): the weighted sum over prefixes of the
inner loss, against a loop from the formula (info_nce, clip, gcl; plain, tiled, hard
negatives), against sentence-transformers' own ``MatryoshkaLoss`` around
``MultipleNegativesRankingLoss``, its cached form and crl's ``CrlContrastiveLoss`` (loss and
parameter gradients through a tiny BERT), and the config's checks."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch import Tensor

from crl.errors import CrlValueError
from crl.losses import LossConfig, MatryoshkaObjective, build_objective
from crl.losses.config import MatryoshkaOptions
from crl.losses.matryoshka import truncate
from crl.negatives import NegativesConfig

DIMS, WEIGHTS = [8, 4, 2], [1.0, 0.5, 2.0]


def _objective(name: str = "info_nce", *, dims: list[int] = DIMS,
               weights: list[float] | None = WEIGHTS, normalized: bool = True,
               n: int = 32, **loss: object) -> MatryoshkaObjective:
    cfg = LossConfig(name=name, matryoshka=MatryoshkaOptions(dims=dims, weights=weights),
                     **loss)  # type: ignore[arg-type]
    objective = build_objective(cfg, NegativesConfig(), num_samples=n, normalized=normalized)
    assert isinstance(objective, MatryoshkaObjective)
    return objective.double()


def _embeddings(batch: int = 6, dim: int = 8, hard: int = 0, seed: int = 0) -> list[Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = [F.normalize(torch.randn(batch, dim, generator=g, dtype=torch.float64), dim=-1)
           for _ in range(2)]
    if hard:
        out.append(F.normalize(torch.randn(batch, hard, dim, generator=g, dtype=torch.float64),
                               dim=-1))
    return [z.requires_grad_(True) for z in out]


def _reference(name: str, zs: list[Tensor], dims: list[int], weights: list[float], *,
               normalized: bool = True, **loss: object) -> Tensor:
    """The formula: a fresh plain objective per prefix on the cut (renormalised) embeddings;
    the full dimension as given (normalising a unit vector again changes no value, and its
    Jacobian is the model's own normalisation's, tested through the model below)."""
    total = torch.zeros((), dtype=torch.float64)
    for dim, weight in zip(dims, weights, strict=True):
        plain = build_objective(LossConfig(name=name, **loss),  # type: ignore[arg-type]
                                NegativesConfig(), num_samples=32).double()
        cut = [z[..., :dim] for z in zs]
        if normalized and dim < zs[0].shape[-1]:
            cut = [F.normalize(z, dim=-1) for z in cut]
        hard = cut[2] if len(cut) > 2 else None
        value, _ = plain(cut[0], cut[1], torch.arange(zs[0].shape[0]), hard=hard)
        total = total + weight * value
    return total


def _value_and_grads(fn, zs: list[Tensor]) -> tuple[float, list[Tensor]]:  # type: ignore[no-untyped-def]
    fresh = [z.detach().clone().requires_grad_(True) for z in zs]
    value = fn(fresh)
    value.backward()
    return float(value.detach()), [z.grad for z in fresh]


@pytest.mark.parametrize(("name", "hard", "extra"), [
    ("info_nce", 0, {}), ("info_nce", 2, {"symmetric": False}), ("clip", 0, {}),
    ("gcl", 0, {}), ("info_nce", 0, {"block_size": 2}), ("clip", 2, {"block_size": 3}),
    ("dcl", 0, {}), ("siglip", 0, {}),
])
def test_matches_the_formula(name: str, hard: int, extra: dict) -> None:
    zs = _embeddings(hard=hard)
    index = torch.arange(6)

    def ours(z: list[Tensor]) -> Tensor:
        return _objective(name, **extra)(z[0], z[1], index, hard=z[2] if hard else None)[0]

    value, grads = _value_and_grads(ours, zs)
    expected, expected_grads = _value_and_grads(
        lambda z: _reference(name, z, DIMS, WEIGHTS, **extra), zs)
    assert value == pytest.approx(expected, rel=1e-12)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_unnormalised_model_cuts_without_normalising() -> None:
    zs = [z.detach() * 3.0 for z in _embeddings()]
    value = _objective("info_nce", normalized=False)(zs[0], zs[1], torch.arange(6))[0]
    expected = _reference("info_nce", zs, DIMS, WEIGHTS, normalized=False)
    assert float(value) == pytest.approx(float(expected), rel=1e-12)


def test_each_prefix_keeps_its_own_loss_state() -> None:
    """GCL's running estimates ``u`` are per prefix: the copy of the 2-dim prefix holds what a
    GCL on the 2-dim embeddings alone holds; CLIP has one logit scale per prefix."""
    za, zb = (z.detach() for z in _embeddings())
    index = torch.tensor([3, 7, 1, 0, 9, 4])
    objective = _objective("gcl")
    objective(za, zb, index)
    alone = build_objective(LossConfig(name="gcl"), NegativesConfig(), num_samples=32).double()
    alone(F.normalize(za[:, :2], dim=-1), F.normalize(zb[:, :2], dim=-1), index)
    smallest = objective.smaller[-1].loss
    torch.testing.assert_close(smallest.log_u_a2b, alone.loss.log_u_a2b, equal_nan=True)
    assert not torch.equal(objective.loss.log_u_a2b.nan_to_num(), smallest.log_u_a2b.nan_to_num())
    clip = _objective("clip")
    scales = [name for name, _ in clip.named_parameters()]
    assert scales == ["loss.logit_scale", "smaller.0.loss.logit_scale",
                      "smaller.1.loss.logit_scale"]


def test_dims_sorted_largest_first_with_their_weights() -> None:
    objective = _objective(dims=[2, 8, 4], weights=[2.0, 1.0, 0.5])
    assert objective.prefix_dims == (8, 4, 2) and objective.weights == (1.0, 0.5, 2.0)
    za, zb = (z.detach() for z in _embeddings())
    assert float(objective(za, zb, torch.arange(6))[0]) == pytest.approx(
        float(_reference("info_nce", [za, zb], DIMS, WEIGHTS)), rel=1e-12)
    assert _objective(weights=None).weights == (1.0, 1.0, 1.0)


def test_full_dimension_alone_is_the_plain_objective() -> None:
    za, zb = (z.detach() for z in _embeddings())
    plain = build_objective(LossConfig(), NegativesConfig(), num_samples=32).double()
    single = _objective(dims=[8], weights=None)
    assert torch.equal(single(za, zb, torch.arange(6))[0], plain(za, zb, torch.arange(6))[0])


def test_truncate() -> None:
    z = torch.tensor([[3.0, 4.0, 12.0]]) / 13
    assert torch.equal(truncate(z, 3, normalize=True), z)
    torch.testing.assert_close(truncate(z, 2, normalize=True), torch.tensor([[0.6, 0.8]]))
    torch.testing.assert_close(truncate(z, 2, normalize=False), z[:, :2])
    half = truncate(z.bfloat16(), 2, normalize=True)
    assert half.dtype == torch.bfloat16


def test_bad_options() -> None:
    with pytest.raises(ValidationError, match="distinct"):
        MatryoshkaOptions(dims=[4, 4])
    with pytest.raises(ValidationError, match="one weight per dimension"):
        MatryoshkaOptions(dims=[4, 2], weights=[1.0])
    with pytest.raises(ValidationError):
        MatryoshkaOptions(dims=[])
    with pytest.raises(ValidationError):
        MatryoshkaOptions(dims=[0])
    with pytest.raises(ValidationError):
        LossConfig.model_validate({"matryoshka": {"dims": [4], "weight": [1]}})
    za, zb = (z.detach() for z in _embeddings(dim=4))
    with pytest.raises(CrlValueError, match=r"at most the embedding dimension D = 4; got \[8"):
        _objective()(za, zb, torch.arange(6))


def test_logs_are_the_largest_prefix() -> None:
    objective = _objective("clip")
    with torch.no_grad():
        objective.loss.logit_scale.fill_(math.log(20.0))
    za, zb = (z.detach() for z in _embeddings())
    _, logs = objective(za, zb, torch.arange(6))
    assert logs["train/logit_scale"] == pytest.approx(20.0)
